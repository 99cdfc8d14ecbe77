/* api.h - OpenAI request bodies (/v1/chat/completions, /v1/completions)
 * parsed and validated into what the scheduler needs, without any HTTP
 * connection: the server calls it with the body bytes and the X-Agent-Id
 * header's value, and so can a fuzzer.
 *
 * First every string of the body, values and object keys at any depth,
 * must be valid UTF-8 (else 400 invalid_encoding, param the string's path,
 * e.g. "messages[1].content"); then every field OpenAI defines for the
 * endpoint is checked against api_fields.h's table (type: 400
 * invalid_type; range: 400 invalid_value; a capability the server lacks,
 * e.g. audio: 400 unsupported_parameter). Fields not in
 * the table are ignored, as OpenAI's clients send many. The pool, memory,
 * card and import bodies below get the same UTF-8 check.
 *
 * Fields read:
 *   model (string, required, must equal the served model id)
 *   messages (chat, required): 1..AK_API_MAX_MESSAGES objects {role, content};
 *     role system|developer|user|assistant; content a string, null, or an
 *     array of at most AK_API_MAX_PARTS parts {"type":"text","text":...}
 *   prompt (completions, required): a string or an array of one string
 *   n (1..AK_MAX_CHOICES: CHOICES below), max_tokens / max_completion_tokens (1..2^24),
 *   temperature [0, 2], top_p (0, 1], seed (|seed| <= 2^62),
 *   stream, stream_options.include_usage (booleans),
 *   stop (a string or an array of at most 4 non-empty strings),
 *   sampler fields (sampler.h): top_k (>= 0), min_p [0, 1],
 *     repetition_penalty (0, 100], frequency_penalty and presence_penalty
 *     [-2, 2], logit_bias {token id: [-100, 100]} (ids of this vocabulary),
 *   pool (string: the pool the prompt starts with; see POOLS below),
 *   memories, reuse, recompute_ratio (MEMORIES below),
 *   agent_id, prompt_cache_key (AGENTS below),
 *   response_format (chat; STRUCTURED OUTPUT below).
 * Numbers are range-checked as doubles before any conversion, so 1e300 is a
 * 400 like any other out-of-range value.
 *
 * AGENTS. The X-Agent-Id header names the agent. Without it, agent_id or
 * prompt_cache_key (OpenAI's field, which SDKs and frameworks can set
 * where they cannot set a header) names it; both given must be equal (else
 * 400 invalid_value naming prompt_cache_key). With the header, agent_id
 * must equal it (else 400 invalid_value) and prompt_cache_key is not used
 * (only its type is checked). The name must be an agent id (1-128 of
 * [A-Za-z0-9_.-], not starting with '.'; else 400 invalid_agent_id naming
 * the field it came from). None of them: an anonymous request (an
 * in-memory prefix cache, nothing saved).
 */
#ifndef AK_API_H
#define AK_API_H

#include <stddef.h>
#include <stdint.h>

#include "agents/agent.h"
#include "text/chat.h"
#include "text/chat_resend.h"
#include "engine/reuse.h"
#include "text/sampler.h"
#include "serve/sched.h"
#include "text/tokenizer.h"

#define AK_API_MAX_MESSAGES 4096   /* messages in one chat request */
#define AK_API_MAX_PARTS    256    /* content parts in one message */

/* Looks pool id up for a request that names one: its tokens and source
 * (both malloc'd; *source may be NULL). Returns 0, or -1 with err set
 * (err->code AK_ERR_NOT_FOUND, AK_ERR_STALE, AK_ERR_CORRUPT, ...). */
typedef int (*ak_api_pool_fn)(void *ud, const char *id, int32_t **tokens, int *n, char **source, ak_error *err);
/* Looks memory id up: its tokens (malloc'd). Returns 0, or -1 with err set
 * (AK_ERR_NOT_FOUND, AK_ERR_STALE, AK_ERR_CORRUPT, AK_ERR_KV_BUDGET, ...). */
typedef int (*ak_api_memory_fn)(void *ud, const char *id, int32_t **tokens, int *n, ak_error *err);

/* What the parser needs to know about the server. */
typedef struct {
    const ak_tokenizer *tok;
    const char *model_id;      /* the name requests must give in "model" */
    ak_chat_family family;
    const char *template_text; /* may be NULL */
    int n_ctx;
    ak_api_pool_fn pool_lookup;   /* NULL: a request naming a pool is refused (400) */
    void *pool_ud;
    ak_api_memory_fn memory_lookup;   /* NULL: a request naming memories is refused (400) */
    void *memory_ud;
    ak_grammars *grammars;    /* compiled response formats (grammars.h); NULL: json_object and
                                 json_schema refused (400 unsupported_parameter) */
} ak_api_config;

/* tool_choice (TOOLS below). */
typedef enum {
    AK_TOOL_CHOICE_AUTO = 0,  /* the model may call (default with tools) */
    AK_TOOL_CHOICE_NONE,      /* no calls: every reply is text */
    AK_TOOL_CHOICE_REQUIRED,  /* it must call one of the tools */
    AK_TOOL_CHOICE_NAMED      /* it must call tools.tools[named] */
} ak_tool_choice;

/* A chat request's tools and thinking (TOOLS below), owned by the request. */
typedef struct {
    ak_chat_tool *tools;      /* n_tools of them (their strings in blob) */
    int n_tools;
    ak_tool_choice choice;
    int named;                /* AK_TOOL_CHOICE_NAMED: the tool's index */
    int parallel;             /* parallel_tool_calls (default 1) */
    ak_chat_think think;      /* reasoning_effort "none", chat_template_kwargs.enable_thinking */
    int in_reasoning;         /* the prompt leaves the model inside its reasoning (ak_chat_reasoning_open) */
    char *blob;
} ak_api_tools;

/* How a request's memories are used (MEMORIES below): reuse.h's methods. */
#define AK_API_RECOMPUTE_RATIO 0.1   /* recompute_ratio when not given */

/* A completion request, validated. */
typedef struct {
    int chat;
    char agent_id[AK_AGENT_ID_MAX + 1];   /* "" when anonymous */
    char pool[AK_AGENT_ID_MAX + 1];       /* "" when none; else tokens start with the pool's */
    int n_pool_tokens;        /* the pool's tokens at the start of tokens */
    int32_t *tokens;
    size_t n_tokens;
    int n;                    /* choices, 1..AK_MAX_CHOICES (CHOICES below) */
    int max_tokens;           /* >= 1 after a successful parse (clamped to the context) */
    ak_sampler_params sp;
    int seed_given;           /* 0: sp.seed is the caller's default_seed */
    char *stop[AK_MAX_STOP];
    int n_stop;
    int stream, include_usage;
    /* memories (MEMORIES below): memory mem_id[i]'s tokens are tokens[mem_at[i], +mem_len[i]) */
    int n_mem;
    char mem_id[AK_MAX_MEMORIES][AK_AGENT_ID_MAX + 1];
    int mem_at[AK_MAX_MEMORIES], mem_len[AK_MAX_MEMORIES];
    int n_mem_tokens;         /* their tokens in all */
    ak_reuse_method reuse;
    double recompute_ratio;   /* as given, AK_API_RECOMPUTE_RATIO if absent; cacheblend and agentkvshift use it */
    int handoff_given;        /* "handoff_reuse" was sent (HANDOFF REUSE below); else the server's setting */
    int handoff;              /* it asks for a span to be placed */
    ak_reuse_params handoff_reuse;
    ak_logit_bias *logit_bias;   /* sp.logit_bias's entries (owned), NULL when none */
    ak_chat_resend *resend;   /* a chat without memories that holds a reply: its messages, for
                                 the prompt's rebuild over the agent's history (chat_resend.h;
                                 sched.h: ak_reprompt); NULL otherwise */
    ak_api_tools tools;       /* chat: tools, tool_choice, thinking (TOOLS below) */
    ak_grammar_ref *grammar;  /* response_format's or the tools' grammar (a reference, owned), NULL: free text */
    const char *grammar_after;   /* NULL, or the text it is held from (static: "</think>", a call's opener) */
    int grammar_required;     /* with grammar_after: it must begin (response formats, required calls) */
    int grammar_free_after;   /* free text again after a whole match (tool_choice auto: after a call) */
    int logprobs;             /* log-probabilities asked (LOGPROBS below) */
    int top_logprobs;         /* alternatives per token: chat's top_logprobs, completions' logprobs */
} ak_api_request;

/* Why a body was refused: the HTTP status and OpenAI's error fields. */
typedef struct {
    int status;               /* 400, 404 (unknown model or pool), 409 (a pool of another
                                 model), 500 (out of memory, a corrupt pool), 503 */
    const char *param, *code; /* static strings, param_buf, or NULL */
    char msg[600];
    char param_buf[160];      /* a param built for this error (a path such as "messages[1].content") */
} ak_api_error;

/* Fills b (status, param, code, the formatted message; a param string is
 * copied into b->param_buf, so it may be the caller's stack); always
 * returns -1. */
int ak_api_fail(ak_api_error *b, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Parses body[0..len) (need not be NUL-terminated) for the chat (chat = 1)
 * or completions endpoint. agent_header is the X-Agent-Id header's value or
 * NULL; default_seed is used when the body gives no seed. On success returns
 * 0 and fills *out (free it with ak_api_request_free). On failure returns -1
 * with *e set; *out then holds nothing to free (ak_api_request_free is still
 * safe to call). */
int ak_api_parse(const ak_api_config *cfg, const char *body, size_t len, int chat, const char *agent_header,
                 uint64_t default_seed, ak_api_request *out, ak_api_error *e);

/* Frees what ak_api_parse allocated; the struct is zeroed. NULL is fine. */
void ak_api_request_free(ak_api_request *r);

/* The scheduler's prompt rebuild for r (sched.h: ak_reprompt; fn NULL when
 * r has none), its ud r->resend. Once ak_sched_submit took it, set
 * r->resend to NULL: the scheduler frees it. */
ak_reprompt ak_api_reprompt(const ak_api_request *r);

/* POOLS. A request with "pool": ID gets a prompt that starts with the
 * pool's tokens (the lookup's), by the pool's source:
 *   {"messages": [...]}  chat: the pool's messages followed by the
 *       request's, rendered together with the generation prompt; the result
 *       must start with the pool's tokens (the pool was rendered alone,
 *       without the generation prompt), else 400 pool_template_mismatch:
 *       the chat template renders the pool's messages differently when
 *       other messages follow (e.g. mistral puts the system message in front
 *       of the last user message, llama2 inside the first user turn);
 *   {"text": "..."} (or no source)  chat: the pool's tokens, then the
 *       rendered conversation's (its leading BOS dropped when the pool
 *       already starts with one);
 *   completions, any source: the pool's tokens, then the prompt's (BOS
 *       dropped the same way).
 * Errors: invalid id 400 invalid_pool_id, unknown 404 pool_not_found,
 * another model's 409 pool_stale, corrupt (quarantined) 500 pool_corrupt,
 * pool + request not shorter than the context 400
 * context_length_exceeded. */

/* MEMORIES. A chat request with "memories": [ID, ...] (1..AK_MAX_MEMORIES
 * memory ids, memories.h) gets the memories' tokens placed after the system
 * message: the conversation is rendered as usual (generation prompt
 * included) and split where the first message, when it is a system
 * message, ends: that message rendered alone (no generation prompt) must be
 * a token prefix of the whole rendering (else 400
 * memory_template_mismatch); without a system message the split is after
 * the BOS the rendering starts with (if any), else at 0. The chunks' tokens
 * go there in the order given (a memory named twice goes twice), then the
 * rest of the rendering. "reuse": "none" (default: the chunks' blocks are
 * placed, keys shifted, not computed: sched.h), "full" (the same prompt
 * computed as a plain one, nothing from the first memory on reused: the
 * reference), "cacheblend" or "agentkvshift" (each chunk placed by that
 * method with "recompute_ratio" r, default 0.1: reuse.h, sched.h);
 * anything else 400 invalid_value, a non-string 400 invalid_type.
 * "recompute_ratio" must be a number (else 400 invalid_type) in [0, 1]
 * (else 400 invalid_value), unused by none and full. Errors: a completion
 * or a pool with memories 400 invalid_value, an invalid id 400
 * invalid_memory_id, unknown 404 memory_not_found, another model's 409
 * memory_stale, corrupt (quarantined) 500 memory_corrupt, no KV room 503,
 * the prompt with the memories not shorter than the context 400
 * context_length_exceeded (naming the memories' tokens). */

/* HANDOFF REUSE. "handoff_reuse": "none", "cacheblend:R" or
 * "agentkvshift:R" (R the recompute ratio in [0, 1]; reuse.h) sets for
 * this request what serve --handoff-reuse sets for all: with a method, the
 * longest run of at least AK_HANDOFF_MIN_SPAN prompt tokens past what the
 * agent's own cache gives that another hot agent of the same trust domain
 * holds is placed from that agent's KV (agent.h: HANDOFF SPANS; sched.h);
 * "none" opts out. Anything else: 400 invalid_value (a non-string 400
 * invalid_type), param handoff_reuse. Not with memories (400
 * invalid_value). */

/* STRUCTURED OUTPUT. A chat request's "response_format":
 *   {"type": "text"} (or absent): free text;
 *   {"type": "json_object"}: the reply is a JSON object;
 *   {"type": "json_schema", "json_schema": {"name", "schema", "strict"?,
 *   "description"?}}: the reply is a JSON text the schema accepts
 *   (jsonschema.h: supported keywords; "strict" is read but the reply is
 *   held to the schema either way; no "schema": any JSON value).
 * The grammar comes from the server's cache (grammars.h: compiled once per
 * schema text). Errors (400; param "response_format" and below):
 * json_schema not an object, name missing or not a string (OpenAI requires
 * it), schema not an object or boolean, strict not a boolean
 * (missing_required_parameter, invalid_type); a keyword that changes
 * validity and is not supported (code unsupported_schema_keyword, param
 * "response_format.json_schema.schema", the message naming the keyword and
 * its path in the schema); any other schema fault (invalid_schema: not
 * valid, a $ref that does not resolve, no instance possible, too large); a
 * max_tokens (or the room left in the context) below the fewest tokens of
 * any valid reply (max_tokens, invalid_value, both numbers said). For a
 * family that writes its reasoning first (qwen3 unless thinking is off,
 * and a prompt that leaves the model inside its reasoning: deepseek3 with
 * thinking on) the grammar holds from after "</think>" (grammar_after),
 * the reasoning free before it, and the fewest tokens count "</think>"'s. */

/* CHOICES. "n" (1..AK_MAX_CHOICES, else 400 invalid_value naming n and
 * the limit) asks for that many replies to the one prompt: prefilled once,
 * decoded side by side (sched.h: n_choices), choice i sampled with seed
 * seed + i (so a request with seed + i and n = 1 gives choice i's reply).
 * usage counts the prompt once and the tokens of every choice; the agent
 * keeps choice 0's reply. Both endpoints. */

/* LOGPROBS. Chat: "logprobs": true asks for the log-probability of each
 * generated token, "top_logprobs" (0..20, only with logprobs true, else
 * 400 invalid_value) for that many most likely tokens at each. Completions:
 * "logprobs": k (0..5) asks for both, k alternatives (OpenAI's legacy
 * field). The values are the model's distribution before the sampler and
 * any constraint (logprobs.h). */

/* A POST /v1/memories body {"id", "text", "cache_type_k"?, "cache_type_v"?},
 * validated: id as agents' (400 invalid_memory_id), text a non-empty string
 * of at most AK_MEMORY_MAX_TEXT bytes (400 missing_required_parameter,
 * invalid_type, invalid_value), formats by name (400 invalid_value; absent:
 * (ak_kv_format)-1, the agents' formats). Tokenizing is the engine's
 * (memories.h: ak_memory_tokenize). */
typedef struct {
    char id[AK_AGENT_ID_MAX + 1];
    char *text;               /* malloc'd */
    ak_kv_format fk, fv;
} ak_api_memory_request;
/* Parses body[0..len) into *out (free with ak_api_memory_request_free).
 * Returns 0, or -1 with *e set. */
int ak_api_parse_memory(const char *body, size_t len, ak_api_memory_request *out, ak_api_error *e);
void ak_api_memory_request_free(ak_api_memory_request *r);

/* A POST /v1/pools body, validated. */
typedef struct {
    char id[AK_AGENT_ID_MAX + 1];
    int32_t *tokens;          /* the pool's prefix: messages rendered without the generation
                                 prompt, or the text tokenized with the model's BOS */
    size_t n_tokens;
    ak_kv_format fk, fv;      /* cache_type_k / cache_type_v, default q8 / tq3 */
    char *source;             /* {"messages": [...]} or {"text": "..."} as JSON (malloc'd) */
} ak_api_pool_request;

/* Parses a POST /v1/pools body {"id", "messages" | "text", "cache_type_k",
 * "cache_type_v"}: exactly one of messages (as for chat) and text; the
 * format names as ak_kv_format_parse reads them. Refuses (400) an invalid
 * id, an empty prefix, one not shorter than the context (both numbers
 * said), an unknown format. Returns 0 and fills *out (free it with
 * ak_api_pool_request_free), or -1 with *e set. */
int ak_api_parse_pool(const ak_api_config *cfg, const char *body, size_t len, ak_api_pool_request *out,
                      ak_api_error *e);
void ak_api_pool_request_free(ak_api_pool_request *r);

/* CARDS. A POST /v1/agents/{id}/cards body, validated. */
typedef struct {
    char id[AK_AGENT_ID_MAX + 1];   /* the card's id; "" to have one generated */
    int from, to;                   /* "range": [from, to); absent: 0, 0 (the whole history) */
    double bits_k, bits_v;          /* average bits per token, each in [2, 16] */
    char policy[32];                /* "uniform" (default), "importance" or "topology" */
} ak_api_card_request;

/* Parses {"id"?, "range"?: [from, to], "bits": B | "bits_k": K, "bits_v":
 * V, "policy"?}: bits, or bits_k (bits_v defaulting to it), required; a
 * bits_v alone or bits with bits_k/bits_v refused. Refusals (400, code):
 * invalid_json, invalid_card_id, invalid_range (not two integers with 0
 * <= from < to), invalid_bits (missing, not a number, outside [2, 16]),
 * unknown_policy. Whether the range lies within the agent's context is the
 * engine's to say. Returns 0, or -1 with *e set. */
int ak_api_parse_card(const char *body, size_t len, ak_api_card_request *out, ak_api_error *e);

/* Parses a POST /v1/agents/{id}/import body {"card": ID, "mode"?:
 * "replace" | "append"} into card_id and *mode (absent or null: replace;
 * agent.h: ak_agent_import_card_mode). Refusals (400, code): invalid_json,
 * invalid_card_id (missing or not an id), unsupported_mode (another mode;
 * the message names both). Returns 0, or -1 with *e set. */
int ak_api_parse_import(const char *body, size_t len, char card_id[AK_AGENT_ID_MAX + 1], ak_import_mode *mode,
                        ak_api_error *e);

#endif
