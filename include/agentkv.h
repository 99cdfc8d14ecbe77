/* agentkv.h - the public C API of agentkv: an LLM inference engine whose
 * agents keep their KV cache as a durable memory.
 *
 * Build against the installed library with
 *     cc app.c $(pkg-config --cflags --libs agentkv)
 * (docs/library.md: the whole guide; examples/embed.c: a complete program).
 *
 * THE OBJECTS. Every handle is opaque; only the plain structs below cross
 * the boundary.
 *   agentkv_model   a GGUF model with its tokenizer and chat template,
 *                   loaded once, read-only: any number of stores and
 *                   threads may share it.
 *   agentkv_store   the agents of one model and where their memories live:
 *                   a directory, a Redis server, or nowhere (memory only).
 *                   It holds the KV block pool (under an optional RAM
 *                   budget), the forward pass's scratch and the writer
 *                   thread that saves agents behind.
 *   agentkv_agent   a named agent of a store: an id and the cache it holds.
 *                   A turn gives it its whole prompt; what its cache shares
 *                   with that prompt (in RAM: hot, restored from the store:
 *                   warm) is reused, only the rest is computed.
 *
 * CONVENTIONS.
 *   - Functions that can fail return an agentkv_status: AGENTKV_OK (0) or
 *     an error code, and fill the caller's agentkv_error (which may be
 *     NULL) with the code and a one-line message. Branch on the code,
 *     never on the message.
 *   - Options structs are read during the call only; a zeroed struct (or a
 *     NULL pointer) asks for every default. Strings are UTF-8 and
 *     NUL-terminated unless a length is given.
 *   - Memory the library allocates for the caller (tokens, text, lists) is
 *     freed with agentkv_free.
 *   - A store, its agents and their turns are used by one thread at a
 *     time (the caller's lock if several share it); a model by any number.
 *     Callbacks run on the calling thread, inside the call.
 *   - Ids of agents, pools, cards and memories: 1 to AGENTKV_ID_MAX of
 *     [A-Za-z0-9_.-], not starting with '.'.
 *   - Token ids are the model's (int32_t); a prompt is the agent's whole
 *     context, not a delta.
 *   - Nothing but the agentkv_ functions of this header is exported by the
 *     shared library.
 */
#ifndef AGENTKV_H
#define AGENTKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && __GNUC__ >= 4
#define AGENTKV_API __attribute__((visibility("default")))
#else
#define AGENTKV_API
#endif

/* The version this header describes (semantic versioning: the shared
 * library's soname carries the major). */
#define AGENTKV_VERSION_MAJOR 0
#define AGENTKV_VERSION_MINOR 1
#define AGENTKV_VERSION_PATCH 0
#define AGENTKV_VERSION "0.1.0"

/* The longest id of an agent, pool, card or memory, in bytes. */
#define AGENTKV_ID_MAX 128

/* ---- versions, errors, memory ------------------------------------------ */

/* The library's version, "MAJOR.MINOR.PATCH" (static; may differ from the
 * AGENTKV_VERSION a program was compiled with). Never fails. */
AGENTKV_API const char *agentkv_version(void);

/* What went wrong. Values are stable across versions of one major. */
typedef enum {
    AGENTKV_OK = 0,
    AGENTKV_ERR_GENERIC = 1,     /* unclassified */
    AGENTKV_ERR_INVALID = 2,     /* an argument or request that can never work */
    AGENTKV_ERR_NOMEM = 3,       /* out of memory */
    AGENTKV_ERR_IO = 4,          /* a read or write failed */
    AGENTKV_ERR_NOSPACE = 5,     /* the disk or quota is full */
    AGENTKV_ERR_KV_BUDGET = 6,   /* the store's KV RAM budget cannot fit it now */
    AGENTKV_ERR_CORRUPT = 7,     /* data failed a check (checksum, authentication, format) */
    AGENTKV_ERR_NOT_FOUND = 8,   /* no such file, agent, pool, card or memory */
    AGENTKV_ERR_STALE = 9,       /* sound data this model cannot use (another model, key) */
    AGENTKV_ERR_BUSY = 10,       /* in use (a turn, a restore, agents holding it) */
    AGENTKV_ERR_PERMISSION = 11, /* refused for its permissions (a key file others can read) */
    AGENTKV_ERR_SHUTDOWN = 12,   /* the component is stopping */
    AGENTKV_ERR_EXISTS = 13      /* write-once and already there (pools, cards, memories) */
} agentkv_status;

/* A failure's code and message, filled by the call that failed. */
typedef struct {
    agentkv_status code;   /* AGENTKV_OK when nothing failed */
    char message[512];     /* one line without a newline; "" when nothing failed */
} agentkv_error;

/* A short lower-case name of a status ("ok", "invalid", "not-found",
 * "kv-budget", ...; "unknown" for other values). Static. */
AGENTKV_API const char *agentkv_status_name(agentkv_status s);
/* The message of err: its own line, or, when it has none, its code's name;
 * "" for NULL. Valid while err is. */
AGENTKV_API const char *agentkv_error_message(const agentkv_error *err);
/* Frees memory this library returned (tokens, text, lists); NULL is fine. */
AGENTKV_API void agentkv_free(void *p);

/* Called with the fraction done (0 to 1) while a long operation runs. */
typedef void (*agentkv_progress_fn)(void *ud, double fraction);
/* Called with one line about a notable event (saves, evictions, restores). */
typedef void (*agentkv_log_fn)(void *ud, const char *line);

/* ---- models ------------------------------------------------------------ */

typedef struct agentkv_model agentkv_model;

typedef struct {
    agentkv_progress_fn progress;   /* while the weights are paged in; NULL: none */
    void *progress_ud;
    const char *chat_template;      /* a template family by name ("chatml", "llama3", "qwen3",
                                       ...: agentkv_chat_options) instead of the one detected
                                       from the model's metadata; NULL: detected */
} agentkv_model_options;

/* Loads a GGUF model: validates its architecture, hyperparameters, every
 * tensor and its tokenizer, maps the weights and pages them in. On success
 * *out holds it (free with agentkv_model_free). Errors: AGENTKV_ERR_NOT_FOUND
 * or AGENTKV_ERR_IO (the file), AGENTKV_ERR_INVALID (a file that is not a
 * model agentkv runs; the message names the file and the problem),
 * AGENTKV_ERR_NOMEM. */
AGENTKV_API agentkv_status agentkv_model_load(const char *path, const agentkv_model_options *o, agentkv_model **out,
                                              agentkv_error *err);
/* Frees a model; every store opened on it must be closed first. NULL is fine. */
AGENTKV_API void agentkv_model_free(agentkv_model *m);

/* What a model is. Strings are owned by the model. */
typedef struct {
    const char *arch;          /* "llama", "qwen2", "qwen3", "gemma3", "deepseek2" */
    const char *name;          /* general.name, or "" */
    const char *fingerprint;   /* 16 hex digits identifying weights and tokenizer */
    const char *chat_template; /* the template family in use ("plain" when the model has none) */
    int n_layer, dim, n_head, n_head_kv, head_dim;
    int vocab;                 /* token ids are 0 .. vocab - 1 */
    int n_ctx_train;           /* the longest context it was trained for */
    int32_t bos, eos;          /* its BOS and EOS ids, -1 when it has none */
    uint64_t weight_bytes;
} agentkv_model_info;

/* Fills *out. Returns AGENTKV_OK, or AGENTKV_ERR_INVALID for NULL arguments. */
AGENTKV_API agentkv_status agentkv_model_get_info(const agentkv_model *m, agentkv_model_info *out);

/* ---- tokenizer --------------------------------------------------------- */

/* Flags of agentkv_tokenize. */
#define AGENTKV_TOKENIZE_ADD_SPECIAL 1    /* add BOS (and EOS) where the vocabulary asks for them */
#define AGENTKV_TOKENIZE_PARSE_SPECIAL 2  /* text of control tokens ("<|im_start|>") becomes them;
                                             without it such text stays text */

/* Tokenizes text[0..len) by the model's own rules into *tokens (freed with
 * agentkv_free) and *n. Returns AGENTKV_OK, or AGENTKV_ERR_INVALID (invalid
 * UTF-8 the vocabulary cannot spell, bad flags), AGENTKV_ERR_NOMEM. */
AGENTKV_API agentkv_status agentkv_tokenize(const agentkv_model *m, const char *text, size_t len, int flags,
                                            int32_t **tokens, size_t *n, agentkv_error *err);
/* The text of tokens[0..n) as the model writes it, into *text (NUL-terminated,
 * freed with agentkv_free) and *len (may be NULL). Returns AGENTKV_OK, or
 * AGENTKV_ERR_INVALID (an id outside the vocabulary), AGENTKV_ERR_NOMEM. */
AGENTKV_API agentkv_status agentkv_detokenize(const agentkv_model *m, const int32_t *tokens, size_t n, char **text,
                                              size_t *len, agentkv_error *err);
/* 1 if token ends a generation (EOS, end of turn), else 0. */
AGENTKV_API int agentkv_token_is_eog(const agentkv_model *m, int32_t token);

/* ---- chat templates ---------------------------------------------------- */

/* A tool call an assistant message made (OpenAI's tool_calls[i]). */
typedef struct {
    const char *id;         /* NULL: "" */
    const char *name;
    const char *arguments;  /* JSON text of an object; NULL: "{}" */
} agentkv_tool_call;

/* One message of a conversation. */
typedef struct {
    const char *role;        /* "system", "user", "assistant" or "tool" */
    const char *content;     /* NULL only for an assistant message with calls */
    const char *reasoning;   /* assistant: its reasoning, or NULL */
    const agentkv_tool_call *calls;   /* assistant: n_calls calls, or NULL */
    int n_calls;
    const char *tool_call_id;         /* tool: the call this answers */
} agentkv_message;

/* A function the model may call. */
typedef struct {
    const char *name;
    const char *description;   /* NULL: none */
    const char *parameters;    /* its arguments' JSON Schema as JSON text; NULL: none */
} agentkv_tool;

/* Thinking, for the templates that switch it (qwen3, deepseek3). */
typedef enum { AGENTKV_THINK_DEFAULT = 0, AGENTKV_THINK_ON = 1, AGENTKV_THINK_OFF = 2 } agentkv_think;

typedef struct {
    int add_generation_prompt;   /* 1: end with the opening of the assistant's turn (a turn
                                    with messages always does) */
    const agentkv_tool *tools;   /* n_tools tools rendered into the prompt; NULL: none */
    int n_tools;
    agentkv_think think;
} agentkv_chat_options;

/* Renders messages[0..n) with the model's chat template (docs/tools.md and
 * src/text/chat.h say per family what is written) into *text (freed with
 * agentkv_free), without BOS. Returns AGENTKV_OK, or AGENTKV_ERR_INVALID (no
 * messages, an unknown role, a NULL content without calls, a system message
 * a family cannot place), AGENTKV_ERR_NOMEM. */
AGENTKV_API agentkv_status agentkv_chat_render(const agentkv_model *m, const agentkv_message *messages, int n,
                                               const agentkv_chat_options *o, char **text, agentkv_error *err);
/* The same conversation as tokens (BOS as the vocabulary asks): only the
 * template's own markup becomes control tokens, message content stays text
 * (a user's "<|im_start|>" is not a control token). *tokens freed with
 * agentkv_free. Errors as agentkv_chat_render. */
AGENTKV_API agentkv_status agentkv_chat_tokenize(const agentkv_model *m, const agentkv_message *messages, int n,
                                                 const agentkv_chat_options *o, int32_t **tokens, size_t *n_tokens,
                                                 agentkv_error *err);

/* ---- KV formats -------------------------------------------------------- */

/* The KV cache formats by name: "f32", "f16", "bf16", "q8", "q4", "q2",
 * "tq4", "tq3", "tq2", "tcq3" (docs/kv-formats.md). agentkv_kv_format_name
 * gives the i-th (0 <= i < agentkv_kv_format_count()), NULL past them. */
AGENTKV_API int agentkv_kv_format_count(void);
AGENTKV_API const char *agentkv_kv_format_name(int i);
/* The bits one value of a head of head_dim values takes in format name,
 * scales included, into *bits. Returns AGENTKV_OK, or AGENTKV_ERR_INVALID
 * (an unknown name, or a head_dim the format cannot store). */
AGENTKV_API agentkv_status agentkv_kv_format_bits(const char *name, int head_dim, double *bits);

/* ---- stores ------------------------------------------------------------ */

typedef struct agentkv_store agentkv_store;

/* When an agent's cache is written to the store. */
typedef enum {
    AGENTKV_SAVE_EVERY_TURN = 0,   /* after every turn (behind, by the writer thread) */
    AGENTKV_SAVE_ON_EVICT = 1,     /* when it leaves RAM */
    AGENTKV_SAVE_ON_SHUTDOWN = 2   /* at agentkv_store_close; every policy saves there too */
} agentkv_save_policy;

typedef struct {
    const char *dir;            /* the memory directory (created, mode 0700, if missing); with url:
                                   the local directory for cards and a read-through cache.
                                   NULL and url NULL: memory only, nothing persists */
    const char *url;            /* "redis://host:port[/db]": agents, pools and memories in Redis,
                                   shared by every process using it (docs/store.md); NULL: dir */
    const char *password_file;  /* Redis's password: the first line of a file of mode 600 */
    int lease_ms;               /* Redis: an agent's lease (0: 10000) */
    const char *key_file;       /* seal every file with this 32-byte key (XChaCha20-Poly1305); NULL: plain */
    const char *cache_type_k;   /* the agents' KV formats by name; NULL: "f16" */
    const char *cache_type_v;
    uint64_t kv_budget;         /* RAM bytes of KV blocks; idle agents are evicted (saved) to stay
                                   under it; 0: no budget */
    int block_tokens;           /* positions per KV block (0: 32) */
    int n_ctx;                  /* positions an agent may hold (0: the model's, at most 4096) */
    agentkv_save_policy save;
    uint64_t disk_budget;       /* keep the store's agent files under this many bytes, least
                                   recently used first (0: none) */
    int no_prefix_sharing;      /* 1: agents never link blocks another agent computed for the same
                                   prefix (sharing reveals, by timing, that it was seen before) */
    const char *center;         /* store 4/3/2-bit keys and/or values minus the model's mean:
                                   "k" (NULL: the default), "v", "kv" or "none"; formats that
                                   gain nothing are never centered */
    int n_threads;              /* threads of the forward pass (0: every core) */
    int max_batch;              /* tokens per forward pass of a prefill (0: 256) */
    agentkv_log_fn log;         /* NULL: silent */
    void *log_ud;
} agentkv_store_options;

/* Opens the agents of model m where o says (the model must outlive the
 * store). With a directory or Redis, agents saved there by earlier runs
 * come back warm on their next turn. Centering a 4/3/2-bit format first
 * runs a short calibration of the model (logged). On success *out holds it.
 * Errors: AGENTKV_ERR_INVALID (an unknown format or center, n_ctx past the
 * model's, a format that cannot store the model's heads), the store's
 * (AGENTKV_ERR_IO, AGENTKV_ERR_PERMISSION for a key file others can read,
 * an unreachable Redis), AGENTKV_ERR_NOMEM. */
AGENTKV_API agentkv_status agentkv_store_open(const agentkv_model *m, const agentkv_store_options *o,
                                              agentkv_store **out, agentkv_error *err);
/* Writes every agent whose cache is not yet saved and waits for every
 * queued write. Returns AGENTKV_OK, or the last write's error (the message
 * names the agents not saved); they stay unsaved. A memory-only store
 * returns AGENTKV_OK. */
AGENTKV_API agentkv_status agentkv_store_flush(agentkv_store *s, agentkv_error *err);
/* Saves as agentkv_store_flush does, then frees the store. Its agent
 * handles are not usable after (agentkv_agent_release still frees them,
 * before or after). Returns what the flush returned; the store is freed
 * either way. NULL is fine. */
AGENTKV_API agentkv_status agentkv_store_close(agentkv_store *s, agentkv_error *err);

/* ---- agents ------------------------------------------------------------ */

typedef struct agentkv_agent agentkv_agent;

/* Where an agent's cache was, or is. */
typedef enum {
    AGENTKV_TIER_HOT = 0,    /* in RAM */
    AGENTKV_TIER_WARM = 1,   /* in the store, restored without recomputing */
    AGENTKV_TIER_COLD = 2    /* nowhere usable: computed from the tokens */
} agentkv_tier;

/* A handle of agent id of store s, made if unknown: nothing is computed
 * or written before its first turn. Free it with agentkv_agent_release
 * (its cache stays in the store). Returns AGENTKV_OK, or AGENTKV_ERR_INVALID
 * (an invalid id), AGENTKV_ERR_NOMEM. */
AGENTKV_API agentkv_status agentkv_agent_get(agentkv_store *s, const char *id, agentkv_agent **out,
                                             agentkv_error *err);
/* Frees the handle (not the agent). NULL is fine. */
AGENTKV_API void agentkv_agent_release(agentkv_agent *a);

typedef struct {
    char id[AGENTKV_ID_MAX + 1];
    int n_tokens;               /* the tokens its cache holds */
    agentkv_tier tier;          /* hot (RAM) or warm (only in the store); cold: holds nothing */
    uint64_t bytes;             /* RAM bytes of its blocks when hot (shared ones included), its
                                   file's bytes when warm */
    int unsaved;                /* its cache is not yet confirmed written */
    char pool[AGENTKV_ID_MAX + 1];   /* the pool its cache starts with, "" if none */
    char card[AGENTKV_ID_MAX + 1];   /* the card its cache starts with, "" if none */
} agentkv_agent_info;

/* Fills *out about the agent (loading nothing). Returns AGENTKV_OK (also for
 * an agent that holds nothing: tier cold, 0 tokens), or the store's error. */
AGENTKV_API agentkv_status agentkv_agent_get_info(agentkv_agent *a, agentkv_agent_info *out, agentkv_error *err);
/* The tokens the agent's cache holds (its history), restoring it from the
 * store if it is not in RAM, into *tokens (freed with agentkv_free; NULL
 * when it holds nothing) and *n. Returns AGENTKV_OK, or the restore's
 * error (AGENTKV_ERR_KV_BUDGET, ...). */
AGENTKV_API agentkv_status agentkv_agent_tokens(agentkv_agent *a, int32_t **tokens, size_t *n, agentkv_error *err);
/* Writes the agent's cache to the store now and waits for it. Returns
 * AGENTKV_OK (also when it was saved already or the store is memory only),
 * or the write's error (AGENTKV_ERR_NOSPACE, AGENTKV_ERR_IO, ...). */
AGENTKV_API agentkv_status agentkv_agent_save(agentkv_agent *a, agentkv_error *err);
/* Moves the agent out of RAM (saved first if it is not: its next turn is
 * warm; in a memory-only store it is forgotten, cold). Returns AGENTKV_OK
 * (also when it was not in RAM), or the save's error (it stays in RAM). */
AGENTKV_API agentkv_status agentkv_agent_evict(agentkv_agent *a, agentkv_error *err);
/* Forgets the agent: its blocks and its file (the handle stays usable: a
 * next turn starts cold). Returns AGENTKV_OK, AGENTKV_ERR_NOT_FOUND when it
 * was nowhere, or the store's error. */
AGENTKV_API agentkv_status agentkv_agent_delete(agentkv_agent *a, agentkv_error *err);

/* Every agent of the store (in RAM, or only in the store), sorted by id,
 * into *out (freed with agentkv_free) and *n. Returns AGENTKV_OK, or the
 * store's error. */
AGENTKV_API agentkv_status agentkv_store_list_agents(agentkv_store *s, agentkv_agent_info **out, int *n,
                                                     agentkv_error *err);

/* ---- turns ------------------------------------------------------------- */

/* Called once per generated token with the text it made visible (piece,
 * len; len may be 0 while text that could start a stop string is held
 * back, or an incomplete UTF-8 character), and at the end, with token -1,
 * for text still held back then. Return 0 to go on, anything else to
 * cancel: the turn ends there, its result says AGENTKV_FINISH_CANCELLED,
 * and the agent keeps what was computed so far. */
typedef int (*agentkv_token_fn)(void *ud, int32_t token, const char *piece, size_t len);

/* A memory placed in a prompt: its tokens are the prompt's [at, at + its
 * length) (agentkv_memory_compose builds such prompts). */
typedef struct {
    const char *id;
    int at;
} agentkv_memory_ref;

/* Why a turn's generation ended. */
typedef enum {
    AGENTKV_FINISH_STOP = 0,       /* an end-of-generation token or a stop string */
    AGENTKV_FINISH_LENGTH = 1,     /* max_tokens, or the context is full */
    AGENTKV_FINISH_CANCELLED = 2   /* on_token asked to stop */
} agentkv_finish;

typedef struct {
    /* The prompt: exactly one of messages and tokens. */
    const agentkv_message *messages;   /* a chat, rendered by the model's template with the generation
                                          prompt; replies the agent wrote earlier stand for their own
                                          tokens, so its cache is reused past them */
    int n_messages;
    const agentkv_chat_options *chat;  /* with messages: tools and thinking (NULL: none, default) */
    const int32_t *tokens;             /* or the whole prompt as tokens */
    size_t n_tokens;
    const char *pool_id;               /* with tokens: they start with this pool's tokens, whose
                                          blocks the agent shares (agentkv_pool_tokens) */
    const agentkv_memory_ref *memories;   /* with tokens: memories placed at their positions, in
                                             order, none reaching the prompt's end */
    int n_memories;
    const char *memory_reuse;          /* how they are placed: "none" (NULL: as stored, keys moved),
                                          "cacheblend", "agentkvshift", or "full" (recomputed) */
    /* Generation. */
    int max_tokens;                    /* tokens to generate at most; 0: none (the prompt is only
                                          taken into the cache) */
    float temperature;                 /* 0: greedy (the default) */
    int top_k;                         /* 0: off */
    float top_p;                       /* 0 or 1: off */
    float min_p;                       /* 0: off */
    float repeat_penalty;              /* 0 or 1: off */
    int repeat_last_n;                 /* tokens the penalty looks back over (0: 64, < 0: none) */
    float frequency_penalty, presence_penalty;   /* OpenAI's; 0: off */
    uint64_t seed;                     /* the same seed, prompt and model: the same tokens */
    const char *const *stop;           /* n_stop strings that end the text (not included); at most 16,
                                          15 with messages */
    int n_stop;
    int ignore_eos;                    /* 1: end-of-generation tokens do not end it */
    agentkv_token_fn on_token;         /* NULL: nothing streamed */
    void *ud;
    agentkv_progress_fn progress;      /* told the fraction of the prefill done; NULL: none */
    void *progress_ud;
} agentkv_turn_options;

typedef struct {
    agentkv_tier tier;         /* where the agent's cache came from */
    const char *match;         /* how the prompt met its history: "new", "exact", "extend", "diverge" */
    int prompt_tokens;
    int reused;                /* prompt tokens whose KV came from the cache (or a pool, a memory) */
    int prefilled;             /* prompt tokens computed this turn */
    int generated;             /* tokens generated (and now in the agent's cache) */
    agentkv_finish finish;
    double restore_ms;         /* warm: reading the store */
    double prompt_ms;          /* from the start to the logits of the prompt's end (restore and
                                  prefill included) */
    double decode_ms;
    char *text;                /* the generated text, cut at a stop string (freed with agentkv_free) */
    size_t text_len;
} agentkv_turn_result;

/* Runs one turn of agent a: its cache is matched against the prompt (the
 * agent restored from the store first if it is not in RAM), the rest of
 * the prompt computed, then up to max_tokens tokens generated, streamed
 * through on_token, and fed back into the cache. Afterwards the agent
 * holds the prompt and the generated tokens (an end-of-generation token is
 * not kept), and is saved per the store's policy. res (may be NULL) gets
 * the counts and the text. Returns AGENTKV_OK (also when cancelled), or:
 * AGENTKV_ERR_INVALID (no prompt or both kinds, an empty one, one not
 * shorter than the context, an unknown memory_reuse, memories out of
 * order or not matching their tokens, tokens not starting with the pool's),
 * AGENTKV_ERR_NOT_FOUND / AGENTKV_ERR_STALE / AGENTKV_ERR_CORRUPT (the pool or
 * a memory), AGENTKV_ERR_KV_BUDGET (the agent cannot fit even alone),
 * AGENTKV_ERR_BUSY (a Redis lease held by another process), a save's error;
 * the agent then holds what it held or less, never something inconsistent. */
AGENTKV_API agentkv_status agentkv_agent_turn(agentkv_agent *a, const agentkv_turn_options *o,
                                              agentkv_turn_result *res, agentkv_error *err);

/* ---- pools: a prefix computed once and shared ------------------------- */

typedef struct {
    const char *id;
    const int32_t *tokens;      /* the prefix (a document, a system prompt), BOS included */
    size_t n_tokens;
    const char *cache_type_k;   /* its formats; NULL: "q8" */
    const char *cache_type_v;   /* NULL: "tq3" */
    const char *source;         /* kept with it (e.g. the text it came from); NULL: none */
} agentkv_pool_options;

/* Computes pool o->id from its tokens and writes it to the store: agents
 * whose prompts start with those tokens then share its blocks (one copy in
 * RAM however many attach). Pools are write-once. Returns AGENTKV_OK, or
 * AGENTKV_ERR_INVALID (a bad id or format, empty, not shorter than the
 * context), AGENTKV_ERR_EXISTS, AGENTKV_ERR_KV_BUDGET, the store's error. */
AGENTKV_API agentkv_status agentkv_pool_create(agentkv_store *s, const agentkv_pool_options *o, agentkv_error *err);
/* The pool's tokens into *tokens (freed with agentkv_free) and *n, loading
 * it from the store if need be. Returns AGENTKV_OK, or AGENTKV_ERR_NOT_FOUND,
 * AGENTKV_ERR_STALE (another model's), AGENTKV_ERR_CORRUPT, AGENTKV_ERR_KV_BUDGET. */
AGENTKV_API agentkv_status agentkv_pool_tokens(agentkv_store *s, const char *id, int32_t **tokens, size_t *n,
                                               agentkv_error *err);
/* Attaches agent a to the pool: its cache becomes the pool's blocks (what
 * it held is dropped), its next turn's prompt starts with the pool's
 * tokens. The same as a turn of the pool's tokens with pool_id and nothing
 * generated. Errors as agentkv_pool_tokens and agentkv_agent_turn. */
AGENTKV_API agentkv_status agentkv_pool_attach(agentkv_agent *a, const char *pool_id, agentkv_error *err);
/* Deletes the pool (its blocks and file). Returns AGENTKV_OK,
 * AGENTKV_ERR_NOT_FOUND, AGENTKV_ERR_BUSY while agents hold it. */
AGENTKV_API agentkv_status agentkv_pool_delete(agentkv_store *s, const char *id, agentkv_error *err);

/* ---- cards: a range of one agent's cache handed to others -------------- */

typedef struct {
    const char *card_id;   /* NULL: "<agent>-<n>", the first n free */
    int from, to;          /* the range of the agent's tokens; to <= 0: its end */
    double bits_k;         /* average bits per key value, 2 to 16 (0: 16, every token whole) */
    double bits_v;         /* likewise for values (0: bits_k) */
    const char *policy;    /* which tokens keep more bits under the budget: "uniform" (NULL),
                              "importance" or "topology" (scored from attention: one more
                              prefill of the range) */
} agentkv_card_options;

/* Makes a card of agent a's cache (restored if need be) and records it in
 * the store; its id goes to card_id (AGENTKV_ID_MAX + 1 bytes). Returns
 * AGENTKV_OK, or AGENTKV_ERR_NOT_FOUND (the agent holds nothing),
 * AGENTKV_ERR_INVALID (a range outside its tokens, bad bits or policy),
 * AGENTKV_ERR_EXISTS, AGENTKV_ERR_BUSY, AGENTKV_ERR_KV_BUDGET, the store's. */
AGENTKV_API agentkv_status agentkv_card_make(agentkv_agent *a, const agentkv_card_options *o,
                                             char card_id[AGENTKV_ID_MAX + 1], agentkv_error *err);
/* Imports card card_id into agent a without computing anything: append 0
 * replaces what it holds with the card; append 1 puts the card after its
 * tokens (keys moved to their new positions: an approximation, the card
 * never saw those tokens; docs/cards.md). Its next turn's prompt extends
 * its tokens (agentkv_agent_tokens). Returns AGENTKV_OK, or
 * AGENTKV_ERR_NOT_FOUND, AGENTKV_ERR_STALE, AGENTKV_ERR_CORRUPT,
 * AGENTKV_ERR_INVALID (longer than the context), AGENTKV_ERR_BUSY,
 * AGENTKV_ERR_KV_BUDGET. */
AGENTKV_API agentkv_status agentkv_card_import(agentkv_agent *a, const char *card_id, int append, agentkv_error *err);
/* Deletes the card. Returns AGENTKV_OK, AGENTKV_ERR_NOT_FOUND,
 * AGENTKV_ERR_BUSY while agents hold it. */
AGENTKV_API agentkv_status agentkv_card_delete(agentkv_store *s, const char *card_id, agentkv_error *err);

/* ---- memories: a text's KV computed once, placed into many prompts ---- */

typedef struct {
    const char *id;
    const char *text;           /* tokenized alone: no BOS, control-token text stays text */
    const char *cache_type_k;   /* its formats; NULL: the store's */
    const char *cache_type_v;
} agentkv_memory_options;

/* Computes memory o->id: the KV of its text alone, at positions from 0,
 * written to the store. The same text in the same formats is computed once
 * (*computed, may be NULL, says 0 when its blocks were shared). Returns
 * AGENTKV_OK, or AGENTKV_ERR_INVALID (bad id, empty text, not shorter than
 * the context), AGENTKV_ERR_EXISTS (the id holds another text),
 * AGENTKV_ERR_KV_BUDGET, the store's error. */
AGENTKV_API agentkv_status agentkv_memory_add(agentkv_store *s, const agentkv_memory_options *o, int *computed,
                                              agentkv_error *err);
/* Deletes the memory (agents that placed it keep their copies). Returns
 * AGENTKV_OK or AGENTKV_ERR_NOT_FOUND. */
AGENTKV_API agentkv_status agentkv_memory_delete(agentkv_store *s, const char *id, agentkv_error *err);

/* One part of a composed prompt: tokens, or a memory. */
typedef struct {
    const int32_t *tokens;   /* n_tokens literal tokens, or */
    size_t n_tokens;
    const char *memory_id;   /* a memory, placed from its cache (tokens then unused) */
} agentkv_part;

/* A composed prompt: the fields of agentkv_turn_options it fills. */
typedef struct {
    int32_t *tokens;
    size_t n_tokens;
    agentkv_memory_ref *memories;
    int n_memories;
} agentkv_prompt;

/* Concatenates parts[0..n) into out: literal tokens as they are, each
 * memory as its tokens with a reference at their position. Pass
 * out->tokens, n_tokens, memories and n_memories to agentkv_agent_turn, and
 * free it with agentkv_prompt_free. Returns AGENTKV_OK, or
 * AGENTKV_ERR_NOT_FOUND / AGENTKV_ERR_STALE / AGENTKV_ERR_CORRUPT (a memory),
 * AGENTKV_ERR_INVALID (a part with neither or both), AGENTKV_ERR_NOMEM. A
 * prompt holds at most 6 memories (7 segments with what precedes them). */
AGENTKV_API agentkv_status agentkv_memory_compose(agentkv_store *s, const agentkv_part *parts, int n,
                                                  agentkv_prompt *out, agentkv_error *err);
/* Frees what a composed prompt holds and zeroes it; NULL is fine. */
AGENTKV_API void agentkv_prompt_free(agentkv_prompt *p);

#ifdef __cplusplus
}
#endif

#endif
