/* sched.h - the engine loop: continuous batching of many agents' turns.
 *
 * One engine thread owns the model context and the agents. Each step it
 *   1. admits queued requests in arrival order (requests of one agent are
 *      serialized: a later one waits for the earlier one to finish) while
 *      the bytes their prompt plus max_tokens will add fit in the KV budget
 *      next to what the running requests may still add (a pool's blocks and
 *      blocks linked from the content index are shared, not counted again:
 *      ak_agent_bytes_to_add; idle agents are evicted LRU to disk to make
 *      room; what does not fit waits). A pool's creation is queued and
 *      admitted the same way, its blocks reserved up front;
 *   2. runs ONE forward pass holding one decode token of every decoding
 *      request (the weights are read once for the whole batch) plus a bounded
 *      chunk of prompt (or pool) tokens (chunked prefill: a 16K prompt cannot stall the
 *      others for more than a step; while others decode, the chunk is sized
 *      from the measured prefill speed so that a step takes about step_ms);
 *   3. samples, detokenizes, enforces stop strings and hands the text to the
 *      request's reader.
 * A request of several choices (n) is one prefill and then one decode
 * sequence per choice, each a fork of the prompt's cache (kvcache.h:
 * shared blocks, copied on write), every one of them in the step's batch;
 * its reservation counts each further choice's own blocks.
 * An I/O thread restores warm agents named by queued requests while the
 * engine decodes others, so their caches are in RAM when their turn comes.
 *
 * Requests are submitted and read from any thread (the HTTP handlers).
 */
#ifndef AK_SCHED_H
#define AK_SCHED_H

#include <stdint.h>

#include "agents/agent.h"
#include "agents/memories.h"
#include "serve/grammars.h"
#include "serve/metrics.h"
#include "engine/model.h"
#include "text/logprobs.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

#define AK_MAX_STOP 5   /* OpenAI allows 4 from the client; one more for the chat family's end of turn */
#define AK_MAX_MEMORIES 6   /* memories placed in one request: each is a segment of the agent's
                               sequence, and so is the prefix before them (AK_KV_MAX_SEGMENTS) */
#define AK_MAX_CHOICES 8    /* choices of one request (OpenAI's n): sequences decoded side by side */

typedef struct {
    const ak_model *model;
    const ak_tokenizer *tok;
    ak_agents *agents;        /* used only by the engine thread while it runs */
    ak_block_pool *pool;      /* the agents' pool (for gauges) */
    ak_store *store;          /* the agents' store or NULL (for gauges) */
    int n_threads;
    int n_ctx;
    int step_tokens;          /* tokens per forward step, decode + prefill (default 256) */
    int max_active;           /* requests running at once (default 16) */
    ak_metrics *metrics;      /* may be NULL */
    ak_log_fn log;            /* may be NULL */
    void *log_ud;
    int no_prefetch;          /* 1: warm agents are restored only when admitted (benchmarks) */
    int step_ms;              /* while agents decode, prefill chunks are sized so that a step
                                 takes about this long (default 200; 0 = always step_tokens) */
} ak_sched_config;

/* A prompt rebuilt over the agent's history right before it is matched
 * (chat_resend.h: a resent conversation whose replies the history's own
 * tokens stand for). fn returns 1 with a malloc'd prompt in *ids (*n_ids
 * tokens), 0 to keep the prompt as submitted, -1 on failure (the prompt as
 * submitted is used; logged). free releases ud. */
typedef struct {
    int (*fn)(void *ud, const int32_t *hist, int n_hist, int32_t **ids, int *n_ids, ak_error *err);
    void *ud;
    void (*free)(void *ud);
} ak_reprompt;

typedef struct {
    const char *agent_id;     /* NULL or "": anonymous (prefix reuse, nothing persisted) */
    const char *pool;         /* NULL or "": none; else the pool the prompt starts with (copied):
                                 the agent attaches to it (ak_turn_opts.pool_id) */
    const int32_t *prompt;    /* copied; starts with the pool's tokens when pool is set */
    int n_prompt;
    int max_tokens;           /* >= 1 */
    ak_sampler_params sp;
    const char *stop[AK_MAX_STOP];   /* copied; enforced on the text, not returned */
    int n_stop;
    int stop_at_eog;          /* stop at end-of-generation tokens (always 1 for chat) */
    /* memories placed with reuse "none" (memories.h): memory mem_id[i]'s tokens are
       prompt[mem_at[i], mem_at[i] + mem_len[i]), in order, before the prompt's last token;
       the engine prefills up to each, places its blocks (ak_agent_place_memory) and
       prefills the rest. n_mem 0: none (reuse "full" sends the tokens as a plain prompt) */
    int n_mem;
    const char *mem_id[AK_MAX_MEMORIES];   /* copied */
    int mem_at[AK_MAX_MEMORIES], mem_len[AK_MAX_MEMORIES];
    int mem_full;             /* reuse "full": the memories' tokens are computed like the rest, and
                                 nothing from the first one on is reused from the agent's history */
    ak_reuse_method mem_method; /* NONE (placed as above) or CACHEBLEND / AGENTKVSHIFT: each memory
                                 is placed by ak_agent_reuse_memory (reuse.h) at mem_ratio when the
                                 prefill reaches it, in one go on the engine thread (FULL: mem_full) */
    float mem_ratio;
    /* the prompt rebuilt over its agent's history at admission (an anonymous request's: the
       ephemeral agent it is served by; fn NULL: none; not with
       memories; with a pool it must keep the pool's tokens first). On success the scheduler
       owns ud (and frees it); on failure the caller keeps it. A rebuilt prompt not shorter
       than the context is not used */
    ak_reprompt reprompt;
    /* structured output (generate.h: CONSTRAINED DECODING): NULL, or the grammar the text is held
       to, the scheduler taking its own reference; grammar_after NULL: held from the first token,
       else lazy: held from right after that text (copied; required: forced at the budget) */
    ak_grammar_ref *grammar;
    const char *grammar_after;
    int grammar_required;       /* lazy: it must begin (no end before; forced at the budget) */
    int grammar_free_after;     /* free text again after a whole match (generate.h: free_after) */
    /* log-probabilities (logprobs.h): 1 records one ak_req_logprob per kept token, with the
       top_logprobs (0..AK_TOP_LOGPROBS_MAX) most likely tokens of its step */
    int logprobs;
    int top_logprobs;
    /* choices (OpenAI's n; 0 is 1, at most AK_MAX_CHOICES): the prompt is prefilled once, then
       each choice decodes on a sequence of its own that links the prompt's blocks (ak_kv_fork:
       copied only where written), all of them in the engine's batch. Choice i samples with
       seed sp.seed + i, its own generator (and constraint matcher); the agent keeps choice 0's
       continuation */
    int n_choices;
    /* handoff reuse (agent.h: HANDOFF SPANS): with handoff 1, at admission the longest run of
       at least AK_HANDOFF_MIN_SPAN prompt tokens past what the agent's own cache gives (and
       before the last token) that another hot agent of trust domain `domain` holds is found,
       and placed by handoff_reuse's method when the prefill reaches it; a source gone by then
       (evicted, changed) leaves those tokens to the prefill. Not with memories */
    int handoff;
    ak_reuse_params handoff_reuse;
    uint32_t domain;          /* the request's trust domain (the agent is tagged with it) */
} ak_req_params;

/* The shortest span handoff reuse places: below it, the copy and the
 * correction cost about what computing the tokens does. */
#define AK_HANDOFF_MIN_SPAN 64

typedef enum {
    AK_FINISH_NONE = 0,       /* still running */
    AK_FINISH_STOP,           /* end of generation or a stop string */
    AK_FINISH_LENGTH,         /* max_tokens, the context, or cut at shutdown */
    AK_FINISH_ERROR           /* see code and error */
} ak_finish;

typedef struct {
    ak_finish finish;
    int code;                 /* for AK_FINISH_ERROR, its ak_err_code: AK_ERR_NOT_FOUND for a pool
                                 or memory that vanished, AK_ERR_KV_BUDGET for no KV room (before
                                 admitted: the request can never fit, even alone),
                                 AK_ERR_SHUTDOWN when stopping, AK_ERR_GENERIC for a failure of
                                 the engine (a forward pass, a token that cannot be decoded) */
    char error[512];
    ak_turn turn;             /* valid once started */
    int admitted;             /* its KV was reserved and its prefill began */
    int started;              /* admitted and its prefill done */
    int prompt_tokens, completion_tokens;
    double queue_ms;          /* submit to admission: waiting for a batch slot, KV room, or a
                                 restore on the I/O thread (a restore done at admission is not
                                 queueing: it counts in ttft_ms - queue_ms) */
    double ttft_ms;           /* submit to first token */
    double decode_ms;         /* first token to finish */
    int mem_recomputed;       /* memory tokens recomputed by cacheblend / agentkvshift (all of them
                                 for full: counted in turn.prefilled instead, this stays 0) */
    double mem_ms;            /* time placing memories by those methods (in ttft_ms) */
    int handoff_reused;       /* prompt tokens placed from another agent's KV (in turn.reused) */
    int handoff_recomputed;   /* of them, recomputed by the method */
    double handoff_ms;        /* time placing them (in ttft_ms) */
    char handoff_from[AK_AGENT_ID_MAX + 1];   /* the agent they came from ("" if none) */
    int handoff_shift;        /* their position here minus their position there (the key shift) */
    /* choices (ak_req_params.n_choices): finish is the request's (choice 0's once every
       choice ended; ERROR for the whole request), completion_tokens their sum */
    int n_choices;
    ak_finish choice_finish[AK_MAX_CHOICES];   /* each choice's; NONE while it runs */
    int choice_tokens[AK_MAX_CHOICES];         /* tokens each choice kept */
    uint64_t version;         /* grows with every change a reader may wait for: a choice's text,
                                 a choice's end, the request's end (ak_request_wait_news) */
} ak_req_result;

typedef struct ak_sched ak_sched;
typedef struct ak_request ak_request;

/* The model's log-probabilities at one kept token (logprobs.h: the
 * log-softmax of the raw logits, before biases, penalties, temperature and
 * any constraint). */
typedef struct {
    int32_t id;               /* the token kept */
    float logprob;
    size_t offset;            /* where its text starts in the request's text (bytes) */
    int n_top;
    ak_token_lp top[AK_TOP_LOGPROBS_MAX];   /* the n_top most likely, most likely first */
} ak_req_logprob;

/* Starts the engine and I/O threads. Returns NULL with err set on failure. */
ak_sched *ak_sched_start(const ak_sched_config *cfg, ak_error *err);
/* Stops accepting, fails queued requests (AK_ERR_SHUTDOWN), cuts running ones
 * (finish LENGTH, their text so far kept), joins the threads. Afterwards
 * every request is finished and the agents are the caller's again (flush
 * them); handles stay valid until released. NULL is fine. */
void ak_sched_shutdown(ak_sched *s);
/* Frees the scheduler (shutting it down first if needed). Every request
 * handle must have been released. NULL is fine. */
void ak_sched_free(ak_sched *s);

/* Queues a request. Returns a handle the caller must release, or NULL with
 * err set: AK_ERR_INVALID for a request that can never run (empty prompt,
 * prompt not shorter than the context, invalid agent id, bad sampling
 * parameters, n_choices outside 0..AK_MAX_CHOICES), AK_ERR_KV_BUDGET when
 * prompt + max_tokens (and each further choice's max_tokens) is larger than
 * the whole KV budget (it can never run either), AK_ERR_SHUTDOWN when stopping,
 * AK_ERR_NOMEM (or AK_ERR_GENERIC) otherwise. */
ak_request *ak_sched_submit(ak_sched *s, const ak_req_params *p, ak_error *err);
/* Waits until the request's (first choice's) text has more than `have`
 * bytes or the request is finished, or timeout_ms passes (< 0: no limit).
 * Returns 1 if finished, else 0. */
int ak_request_wait(ak_request *r, size_t have, int timeout_ms);
/* Waits until the request's version (ak_req_result.version) differs from
 * seen or the request is finished, or timeout_ms passes (< 0: no limit):
 * a reader of several choices waits for whichever moves. Returns 1 if
 * finished, else 0. */
int ak_request_wait_news(ak_request *r, uint64_t seen, int timeout_ms);
/* Copies the first choice's text[from, len) into a malloc'd buffer (*chunk,
 * NUL-terminated; may be NULL when there is nothing new) and the result so
 * far into *res (may be NULL). Returns the new length. */
size_t ak_request_read(ak_request *r, size_t from, char **chunk, size_t *n, ak_req_result *res);
/* ak_request_read of choice `choice` (0 <= choice < n_choices): its text
 * from `from` on; once res->choice_finish[choice] is set, its text is
 * whole. */
size_t ak_request_read_choice(ak_request *r, int choice, size_t from, char **chunk, size_t *n, ak_req_result *res);
/* The log-probabilities of a request (its first choice) that asked for them, from entry
 * `from` on (entries are in token order): those whose text starts before
 * byte `upto` of the text. With upto a length ak_request_read returned,
 * they all exist already; with (size_t)-1 once the request is finished,
 * the rest (a token whose text starts at or past a stop string's cut has
 * none). Copies them into a malloc'd *out (NULL when none) and returns
 * their number (0 also when out of memory: the caller retries). */
int ak_request_logprobs(ak_request *r, int from, size_t upto, ak_req_logprob **out);
/* ak_request_logprobs of choice `choice` (offsets in that choice's text). */
int ak_request_logprobs_choice(ak_request *r, int choice, int from, size_t upto, ak_req_logprob **out);
/* The client went away: the engine ends the request at its next step. */
void ak_request_cancel(ak_request *r);
void ak_request_release(ak_request *r);

/* An operation run on the engine thread between two steps (ak_sched_post):
 * ctx is the poster's, agents the scheduler's, engine its model context (free
 * between steps: an operation may run a prefill on it). Returns what the
 * poster gets back; a negative value with err set is a failure. */
typedef int (*ak_sched_fn)(void *ctx, ak_agents *agents, ak_ctx *engine, ak_error *err);

/* Runs fn(ctx, agents, engine context, err) on the engine thread between two
 * steps and waits until it ran (operations posted in one round run before
 * the next step). Returns fn's value (err copied out when it is negative),
 * or -1 with err set (AK_ERR_SHUTDOWN) when the scheduler is stopping: fn
 * is then not run. err may be NULL. */
int ak_sched_post(ak_sched *s, ak_sched_fn fn, void *ctx, ak_error *err);

/* One agent as the engine sees it, for GET /v1/agents (agent.h; busy: a
 * request of it is running or queued). */
typedef ak_agent_entry ak_sched_agent;

/* Every agent (in RAM or with a file), sorted by id: *out malloc'd. Runs on
 * the engine thread between steps. Returns 0, or -1 with err set. */
int ak_sched_list_agents(ak_sched *s, ak_sched_agent **out, int *n, ak_error *err);
/* Forgets an agent (memory and file). Returns 0, 1 if unknown, 2 if busy
 * (a request of it is running or queued), -1 with err set. */
int ak_sched_remove_agent(ak_sched *s, const char *id, ak_error *err);
/* Gauges for /metrics (engine thread, between steps). */
void ak_sched_gauges(ak_sched *s, ak_metrics_gauges *g);

/* POOLS (agent.h), run on the engine thread; every call blocks until done. */

/* A pool to create: id from tokens[0..n) in formats fk/fv, source kept
 * beside it (may be NULL). */
typedef struct {
    const char *id;
    const int32_t *tokens;
    int n;
    ak_kv_format fk, fv;
    const char *source;
} ak_sched_pool_params;

/* Creates pool p->id. The prefill goes through the engine's batched
 * forward pass in chunks, like a request's prompt, so agents decoding
 * meanwhile keep getting tokens; it waits for KV room while requests run.
 * Returns 0 and fills *info, or -1 with err set: AK_ERR_INVALID (invalid
 * id, empty, not shorter than the context, a format that cannot store the
 * model's heads), AK_ERR_EXISTS (the pool exists), AK_ERR_KV_BUDGET (no KV
 * room even with nothing else running), AK_ERR_SHUTDOWN, or a store or
 * memory failure's code. */
int ak_sched_pool_create(ak_sched *s, const ak_sched_pool_params *p, ak_pool_info *info, ak_error *err);
/* Info about pool id. Returns 0, or -1 with err set (AK_ERR_NOT_FOUND). */
int ak_sched_pool_get(ak_sched *s, const char *id, ak_pool_info *info, ak_error *err);
/* Every pool, sorted by id (*out malloc'd). Returns 0, or -1 with err set. */
int ak_sched_pools_list(ak_sched *s, ak_pool_info **out, int *n, ak_error *err);
/* The pool's tokens and source (both malloc'd; *source may be NULL), for
 * building a prompt that starts with them. Returns 0, or -1 with err set:
 * AK_ERR_NOT_FOUND, AK_ERR_STALE (another model's), AK_ERR_CORRUPT
 * (quarantined), AK_ERR_KV_BUDGET, ... */
int ak_sched_pool_tokens(ak_sched *s, const char *id, int32_t **tokens, int *n, char **source, ak_error *err);
/* Deletes pool id. Returns 0, 1 if unknown, -1 with err set: AK_ERR_BUSY
 * while agents are attached (err names them) or while it is being created. */
int ak_sched_pool_remove(ak_sched *s, const char *id, ak_error *err);

/* MEMORIES (memories.h), run on the engine thread between steps; every
 * call blocks until done. Errors carry memories.h's codes.
 *
 * Adds memory id from text (tokenized by ak_memory_tokenize) in formats
 * fk/fv: computed with the engine's context in one prefill between two
 * steps (a chunk is shorter than the context), or shared when the same
 * content is known (*computed 0). Fills *info. */
int ak_sched_memory_add(ak_sched *s, const char *id, const char *text, ak_kv_format fk, ak_kv_format fv,
                        ak_memory_info *info, int *computed, ak_error *err);
/* Info about memory id and its text (*text malloc'd; text may be NULL). */
int ak_sched_memory_get(ak_sched *s, const char *id, ak_memory_info *info, char **text, ak_error *err);
/* Every memory, sorted by id (*out malloc'd). */
int ak_sched_memories_list(ak_sched *s, ak_memory_info **out, int *n, ak_error *err);
/* The memory's tokens (*tokens malloc'd), loading it if need be:
 * AK_ERR_NOT_FOUND, AK_ERR_STALE (another model), AK_ERR_CORRUPT, ... */
int ak_sched_memory_tokens(ak_sched *s, const char *id, int32_t **tokens, int *n, ak_error *err);
/* Deletes memory id. Returns 0, 1 if unknown, -1 with err set. */
int ak_sched_memory_remove(ak_sched *s, const char *id, ak_error *err);

/* CARDS (agent.h: CARDS), run on the engine thread between steps; every
 * call blocks until done. Errors carry agent.h's codes. */
typedef struct {
    ak_store_card_entry e;    /* the card as the store indexes it (bytes: its file's size,
                                 0 for a card only in RAM) */
    int saved;                /* its file is written (a card just made is written behind:
                                 agent.h, ak_agent_make_card; a GET waits for it) */
    int count_k[4], count_v[4];   /* tokens at widths 2, 4, 8, 16 (keys, values); all 0 in
                                     a list, which reads no card */
} ak_sched_card;

/* Makes a card of agent agent_id (ak_agent_make_card with the engine's
 * context for the statistics pass of importance and topology: one prefill
 * of the range, in one op, so other agents wait one pass for their next
 * step). Refused with AK_ERR_BUSY while a request of the agent runs or is
 * queued. Returns 0 and fills *out, or -1 with err set. */
int ak_sched_card_make(ak_sched *s, const char *agent_id, const ak_card_request *rq, ak_sched_card *out,
                       ak_error *err);
/* Import of card card_id into agent id in mode `mode`
 * (ak_agent_import_card_mode: replace, append); *n_tokens gets the agent's
 * new context length. AK_ERR_BUSY while a request of the agent runs or is
 * queued. Returns 0, or -1 with err set. */
int ak_sched_card_import(ak_sched *s, const char *id, const char *card_id, ak_import_mode mode, int *n_tokens,
                         ak_error *err);
/* Card card_id (loaded and verified if need be). Returns 0, or -1 with err
 * set (AK_ERR_NOT_FOUND, AK_ERR_STALE, AK_ERR_CORRUPT: quarantined, ...). */
int ak_sched_card_get(ak_sched *s, const char *card_id, ak_sched_card *out, ak_error *err);
/* Every card, sorted by id (*out malloc'd). Returns 0, or -1 with err set. */
int ak_sched_cards_list(ak_sched *s, ak_store_card_entry **out, int *n, ak_error *err);
/* Deletes card card_id. Returns 0, 1 if unknown, -1 with err set
 * (AK_ERR_BUSY while agents hold it: err names them). */
int ak_sched_card_remove(ak_sched *s, const char *card_id, ak_error *err);
/* The bytes of card card_id's file (*bytes malloc'd, *len), read on the
 * calling thread (the store is thread-safe, a card file is replaced only
 * atomically). Call after ak_sched_card_get succeeded, so that the file was
 * verified. Returns 0, or -1 with err set: AK_ERR_NOT_FOUND (no store: the
 * card lives in RAM only, or it was removed since), AK_ERR_IO. */
int ak_sched_card_file(ak_sched *s, const char *card_id, char **bytes, size_t *len, ak_error *err);

#endif
