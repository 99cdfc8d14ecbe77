/* LAYER agents/ (src/agents/): agents (registry, tiers, turns, save
 * queue, restore); pools, memories, CacheCard bit allocation.
 * Promises: a named agent's cache is its durable memory: a turn reuses
 * what the agent's history shares with its prompt (hot, warm from the
 * store, or cold), idle agents are evicted under the KV budget and saved
 * per the save policy. Speaks no HTTP: the serve layer and the CLI drive it.
 * May use: base, text, kv, engine, store. Used by: serve. The table:
 * scripts/check-layers.sh.
 *
 * agent.h - agents: named, persistent KV memories on top of the block pool
 * and the store.
 *
 * An agent has an id, the token history its cache holds, and (while hot) a
 * sequence in the block pool. A turn starts with the agent's whole prompt;
 * it is matched against the history at token level:
 *   EXACT    the prompt is the history: nothing to prefill (the last token is
 *            recomputed for its logits, so 1 token is prefilled);
 *   EXTEND   the prompt extends the history: only the new tokens are
 *            prefilled (the paper's cross-phase context injection);
 *   DIVERGE  they share a prefix: the cache keeps the longest common prefix,
 *            drops the rest, and prefills from there;
 *   NEW      nothing cached: everything is prefilled.
 * and says which tier served it: HOT (blocks in RAM), WARM (restored from the
 * memory directory without re-prefill), COLD (no usable cache: recompute).
 *
 * When the pool's budget would be exceeded, least-recently-used idle agents
 * are written out (if their file is not already current) and their blocks
 * freed. Saves happen per the save policy; a disk budget evicts the least
 * recently used files.
 *
 * A turn is either one call (ak_agent_begin: match, restore, prefill) or,
 * for a scheduler that batches many agents into one forward pass, three
 * steps: ak_agent_open (match, restore, make room; no compute), the caller's
 * own ak_forward over the returned sequence, ak_agent_commit/_append (the
 * history now says what the cache holds).
 *
 * An ak_agents is used by one thread at a time (the server's engine thread),
 * except ak_restore_job_run, which runs a restore prepared by
 * ak_agent_prefetch on any thread (the server's I/O thread).
 */
#ifndef AK_AGENT_H
#define AK_AGENT_H

#include <stdint.h>

#include "kv/blockpool.h"
#include "engine/model.h"
#include "engine/reuse.h"
#include "store/store.h"
#include "agents/tier.h"

typedef enum { AK_SAVE_EVERY_TURN, AK_SAVE_ON_EVICT, AK_SAVE_ON_SHUTDOWN } ak_save_policy;
typedef enum { AK_MATCH_NEW, AK_MATCH_EXACT, AK_MATCH_EXTEND, AK_MATCH_DIVERGE } ak_match;

const char *ak_match_name(ak_match m);   /* "new", "exact", "extend", "diverge" */
const char *ak_tier_name(ak_tier t);     /* "hot", "warm", "cold" */
/* Parses "turn", "evict", "shutdown"; 0 or -1. */
int ak_save_policy_parse(const char *s, ak_save_policy *out);


typedef struct {
    const ak_model *model;
    ak_block_pool *pool;      /* its budget is the hot tier's size */
    ak_store *store;          /* NULL: memory only (evicted agents go cold) */
    ak_kv_format fk, fv;
    int n_ctx;                /* positions per agent */
    ak_save_policy save;
    uint64_t disk_budget;     /* 0: none */
    ak_log_fn log;            /* one line per notable event (may be NULL) */
    void *log_ud;
    int no_prefix_sharing;    /* 1: agents never link each other's blocks (prefix.h); pools
                                 still share. Sharing reveals, by timing, that some agent
                                 computed the same prefix before: deployments whose agents
                                 must not learn even that turn it off */
} ak_agents_config;

typedef struct {
    ak_match match;
    ak_tier tier;
    int reused;               /* tokens whose KV came from the cache */
    int prefilled;            /* tokens computed this turn before decoding */
    double restore_ms;        /* warm: loading the file into blocks */
    double prefill_ms;
    uint64_t restore_bytes;
    int evicted;              /* agents moved out of RAM to make room */
    int restored_ahead;       /* warm: restored by a prefetch before the turn */
    int shared;               /* of reused: positions in blocks that others hold too, linked
                                 this turn (a pool's base, the content index) instead of
                                 computed or read */
} ak_turn;

/* Flags of ak_turn_opts. EPHEMERAL: an internal agent (id starting with '.',
 * which no client can name) that is never saved and is simply dropped when
 * evicted: requests without an agent id reuse cached prefixes through these. */
#define AK_AGENT_EPHEMERAL 1
/* Flag of ak_turn_opts with memories: nothing from the first memory on is
 * reused, whatever the history holds (reuse "full": the reference). */
#define AK_AGENT_RECOMPUTE_MEMORIES 2

/* A turn to open (ak_agent_open): whose, with which prompt, the room to
 * make; and, if any, the pool the prompt starts with and the memories it
 * holds. */
typedef struct {
    const char *id;           /* the agent (created if unknown) */
    int flags;                /* AK_AGENT_EPHEMERAL, AK_AGENT_RECOMPUTE_MEMORIES */
    const int32_t *tokens;    /* the whole prompt, tokens[0..n) */
    int n;
    int n_reserve;            /* positions to make room for (raised to n, cut to the context) */
    size_t extra;             /* bytes kept free beyond them for other running turns */
    const char *pool_id;      /* the pool the prompt starts with (POOLS below); NULL or "": none */
    const int *at, *len;      /* k memories (memories.h), the i-th at tokens[at[i], at[i] + len[i]) */
    int k;                    /* 0: none */
    uint32_t domain;          /* the trust domain of the request (HANDOFF SPANS below; 0 when the
                                 server has one): the agent is tagged with it */
} ak_turn_opts;

typedef struct ak_agents ak_agents;

ak_agents *ak_agents_new(const ak_agents_config *cfg, ak_error *err);
/* Saves dirty agents when there is a store (whatever the policy: nothing
 * committed is lost at a clean shutdown; failed saves are retried without
 * backoff, and agents still unsaved are logged by name), then frees
 * everything. */
void ak_agents_free(ak_agents *a);

/* Starts a turn of agent id (created if unknown) with its whole prompt
 * tokens[0..n): afterwards the agent's cache holds exactly those tokens and
 * logits (vocab floats) are the next-token logits. Returns 0 and fills t, or
 * -1 with err set (invalid id, prompt longer than n_ctx, the budget cannot
 * fit this agent even alone, ...); the agent is then left as it was or
 * emptied, never inconsistent. */
int ak_agent_begin(ak_agents *a, ak_ctx *c, const char *id, const int32_t *tokens, int n, float *logits,
                   ak_turn *t, ak_error *err);
/* Opens a turn without computing: finds or creates agent o->id, restores
 * it if it is not hot, matches o->tokens[0..n) against its history,
 * truncates its cache to the reused prefix (never the whole prompt: the
 * last token is always recomputed for its logits) and makes room for
 * o->n_reserve >= n positions while keeping o->extra more bytes free for
 * other running turns (evicting idle LRU agents). On success *kv holds
 * positions [0, t->reused); the caller computes tokens [t->reused, n) into
 * it and then calls ak_agent_commit. t->prefilled is n - t->reused,
 * t->prefill_ms is 0.
 *
 * With o->pool_id (POOLS below) the prompt starts with that pool's tokens:
 * the agent then holds the pool's blocks as its base (attached now if it
 * was not) and only its own tokens privately.
 *
 * With o->k memories (in order, not overlapping) the agent's own history
 * is matched as usual (its cache holds those tokens however they were
 * computed), but a match ending inside a memory is cut back to where the
 * memory starts (it is placed whole again), and blocks are linked from the
 * content index only before the first memory; with flag
 * AK_AGENT_RECOMPUTE_MEMORIES nothing from the first memory on is reused
 * (the caller computes the whole rest). Otherwise the caller then
 * prefills up to each memory not reused, places it (ak_agent_place_memory)
 * and prefills the rest.
 *
 * Returns 0, or -1 with err set (invalid id, prompt too long, a restore in
 * flight, a turn already open, no room; for the pool AK_ERR_NOT_FOUND /
 * AK_ERR_STALE / AK_ERR_CORRUPT, AK_ERR_INVALID when the prompt does not
 * start with its tokens; AK_ERR_INVALID for memories that are not in order
 * inside the prompt); the agent is then as it was or emptied, never
 * inconsistent. */
int ak_agent_open(ak_agents *a, const ak_turn_opts *o, ak_kv **kv, ak_turn *t, ak_error *err);
/* Records that the agent's cache now holds exactly tokens[0..n) (the caller
 * wrote positions up to n). Returns 0, or -1 with err set (out of memory: the
 * agent is then emptied). */
int ak_agent_commit(ak_agents *a, const char *id, const int32_t *tokens, int n, ak_error *err);
/* Records one more token the caller wrote at position = history length.
 * Returns 0, or -1 with err set. */
int ak_agent_append(ak_agents *a, const char *id, int32_t token, ak_error *err);
/* Makes room for the agent's cache to reach n_pos positions (keeping `extra`
 * bytes free). Returns 0, or -1 with err set. */
int ak_agent_reserve(ak_agents *a, const char *id, int n_pos, size_t extra, ak_error *err);
/* A failed forward: drops whatever the cache holds past the history and
 * ends the turn without saving. */
void ak_agent_abort(ak_agents *a, const char *id);
/* MEMORIES (memories.h). Where a memory goes in an agent's open turn
 * (ak_agent_place_memory, ak_agent_reuse_memory). */
typedef struct {
    const char *id;           /* the agent */
    const char *mem_id;       /* the memory */
    const int32_t *tokens;    /* the prompt: tokens[at, at + n) must be the memory's n tokens */
    int at;                   /* where it goes: the agent's cache holds exactly [0, at) of tokens */
} ak_place_opts;

/* Places memory o->mem_id in agent o->id's open turn at position at =
 * o->at: the agent's cache must hold exactly positions [0, at) of tokens =
 * o->tokens (the prompt, computed by the caller: ak_agent_open's reuse
 * plus what it prefilled) and tokens[at, at + n) must be the memory's n
 * tokens.
 * The cache becomes [0, at) frozen as a segment, then the memory's blocks
 * with their keys at [at, at + n) (shared, read-only: memories.h; a memory
 * in other formats than the agent's sequence is converted into the
 * sequence's, once per position: one file holds one format), and the
 * history tokens[0, at + n); positions after them are the agent's own. *kv
 * gets the agent's sequence (a new one: the caller's old pointer is freed).
 * The agent is then impure (never in the content index) and its file
 * stores the chunk's positions as its own. Returns 0, or -1 with err set
 * (AK_ERR_INVALID: no turn open, the cache not at `at`, other tokens, past
 * the context, more than AK_KV_MAX_SEGMENTS segments; the memory's errors:
 * AK_ERR_NOT_FOUND, AK_ERR_STALE, AK_ERR_CORRUPT, AK_ERR_KV_BUDGET); the
 * cache then still holds [0, at). */
int ak_agent_place_memory(ak_agents *a, const ak_place_opts *o, ak_kv **kv, ak_error *err);
/* ak_agent_place_memory by a reuse method (reuse.h: none, cacheblend,
 * agentkvshift, full): the memory's KV (computed alone at 0) is copied into
 * the agent's own positions [at, at + n) and placed by p->method with c
 * (ak_reuse_place), then [0, at + n) is frozen as one more own segment
 * (the agent is impure, as with place_memory; an agentkvshift correction
 * stays attached to those positions: kvcache.h CORRECTIONS). st (may be
 * NULL) gets the counts. Errors as ak_agent_place_memory, and
 * ak_reuse_place's; the cache then still holds [0, at). */
int ak_agent_reuse_memory(ak_agents *a, ak_ctx *c, const ak_place_opts *o, const ak_reuse_params *p, ak_kv **kv,
                          ak_reuse_stats *st, ak_error *err);

/* HANDOFF SPANS. An agent that takes over a conversation (a handoff) gets
 * the same history after a head of its own: the history's KV is in the
 * agent that computed it, at another position. ak_agents_find_span finds
 * the longest run of a prompt that another hot agent's history holds
 * (kv/spanfind.h: at any offset on either side), and ak_agent_reuse_span
 * places it in the asking agent's open turn by a reuse method
 * (reuse.h), as a memory is placed: the source's stored K/V copied, the
 * keys moved to the new position, the method's tokens recomputed.
 *
 * Trust: a span crosses agents only inside one trust domain (the request's
 * ak_turn_opts.domain: an agent carries the domain of its last turn). The
 * span's values were computed after the source's head, which the asking
 * agent's prompt does not hold: they carry that head's influence, which
 * the reuse method corrects only in part. */
typedef struct {
    const char *id;           /* the agent asking (never its own source) */
    uint32_t domain;          /* its request's trust domain: only agents of the same one are searched */
    const int32_t *tokens;    /* the prompt (kept while the call runs) */
    int from, upto;           /* the span lies within tokens[from, upto) */
    int min_len;              /* >= 1 */
} ak_span_query;

typedef struct {
    char src[AK_AGENT_ID_MAX + 1];   /* the agent that holds it */
    int at, src_at, len;             /* tokens[at, at + len) is src's history [src_at, src_at + len);
                                        len 0: none found */
} ak_span_found;

/* Searches the hot agents of q->domain other than q->id (those not in a
 * turn nor being restored, whose cache holds its stored K/V as computed:
 * no correction, no mixed card blocks) for the longest span of at least
 * q->min_len tokens of q->tokens[from, upto). Returns 1 with *out set, 0
 * when there is none (out->len 0; always on a model with sliding-window
 * layers, whose sequences release early positions, or with latent
 * attention, which the reuse methods do not cover), -1 with err set
 * (AK_ERR_INVALID: bad range; AK_ERR_NOMEM). Nothing changes. */
int ak_agents_find_span(const ak_agents *a, const ak_span_query *q, ak_span_found *out, ak_error *err);

/* Keeps hot agent id out of LRU eviction while a turn that may place a
 * span of it is admitted (the room its own prompt needs would otherwise
 * evict the least recently used agents first: in a handoff, the one it
 * takes over from). delta +1 pins, -1 unpins (the count never goes below
 * 0). Returns 0, or -1 when id is not hot (nothing changes). */
int ak_agent_pin(ak_agents *a, const char *id, int delta);

/* Where a found span goes in an agent's open turn. */
typedef struct {
    const char *id;           /* the agent in its turn */
    const int32_t *tokens;    /* the prompt; its cache holds exactly tokens[0, at) */
    int at;                   /* where the span goes */
    const char *src;          /* the agent that holds it (ak_span_found.src) */
    int src_at, n;            /* at src's history [src_at, src_at + n) == tokens[at, at + n) */
} ak_span_place;

/* Places span o in agent o->id's open turn by p's method (reuse.h; NONE:
 * keys moved only), as ak_agent_reuse_memory places a memory: the cache
 * becomes [0, at + n) frozen as one more own segment (the agent is impure
 * then), the history tokens[0, at + n). The source is checked again first:
 * still hot, idle, of the asking agent's domain, its history still holding
 * those tokens there. st (may be NULL) gets the counts. Returns 0, or -1
 * with err set and the cache still holding [0, at): AK_ERR_NOT_FOUND when
 * the source no longer holds the span (evicted, changed, busy, another
 * domain; the caller computes the tokens instead), AK_ERR_INVALID (no turn,
 * the cache not at `at`, past the context, too many segments) and
 * ak_reuse_place's errors. */
int ak_agent_reuse_span(ak_agents *a, ak_ctx *c, const ak_span_place *o, const ak_reuse_params *p, ak_kv **kv,
                        ak_reuse_stats *st, ak_error *err);

/* Bytes of blocks the agent still needs to grow to n_pos positions (0 if it
 * has them); for a scheduler's admission control. */
size_t ak_agent_bytes_needed(const ak_agents *a, const char *id, int n_pos);
/* Bytes of blocks an agent of n_pos positions holds in the agents'
 * formats. With sliding-window layers (kvcache.h LAYER GROUPS) the local
 * layers count only the blocks their window can touch once it has moved
 * on (ceil(window / T) + 1, fewer for a short agent); the global layers
 * every one. */
size_t ak_agents_bytes_for(const ak_agents *a, int n_pos);

/* Restores that run off the engine thread (the paper's interleaving: an I/O
 * thread loads the next agents while the engine decodes others). */
typedef struct ak_restore_job ak_restore_job;
/* If agent id is not hot, not in a turn, not being restored and has a file:
 * reserves room for it (evicting idle LRU agents, keeping `extra` free),
 * marks it restoring and returns 1 with the job in *job. Returns 0 when there
 * is nothing to restore, -1 with err set when there is no room now. */
int ak_agent_prefetch(ak_agents *a, const char *id, size_t extra, ak_restore_job **job, ak_error *err);
/* Runs the restore: file I/O and every check. Any thread; touches nothing of
 * the ak_agents but the store and the pool (both thread-safe). */
void ak_restore_job_run(ak_restore_job *j);
/* Engine thread: installs the result (a miss leaves the agent cold, logged)
 * and frees the job. The agent's next turn reports tier warm with
 * restored_ahead = 1. */
void ak_agent_prefetch_done(ak_agents *a, ak_restore_job *j);
/* 1 if agent id's cache is in RAM. */
int ak_agent_hot(const ak_agents *a, const char *id);
/* Tokens of tokens[0..n) that agent id's cache in RAM holds from position
 * 0 (its history's common prefix with them); 0 when it is not hot. */
int ak_agent_prefix_held(const ak_agents *a, const char *id, const int32_t *tokens, int n);
/* 1 when agent id's turn enters its blocks in the content index as it
 * commits (prefix.h: prefix sharing on, the agent hot and pure), so that
 * turns opened after that link them; else 0. */
int ak_agent_publishes(const ak_agents *a, const char *id);
/* 1 while a prefetch of id is in flight. */
int ak_agent_restoring(const ak_agents *a, const char *id);

/* Appends a generated token to the agent's cache and computes the logits
 * after it. Returns 0, or -1 with err set (context full, budget). */
int ak_agent_step(ak_agents *a, ak_ctx *c, const char *id, int32_t token, float *logits, ak_error *err);
/* Ends the turn: saves per the policy (queues the write: see below),
 * applies the disk budget. Returns 0, or -1 with err set if no snapshot
 * could be taken (the agent stays dirty and hot). */
int ak_agent_end(ak_agents *a, const char *id, ak_error *err);
/* Forgets the agent: its blocks and its file. Returns 0, 1 if unknown. */
int ak_agent_remove(ak_agents *a, const char *id, ak_error *err);
/* Writes agent id's cache to the store now, if its file is not current,
 * and waits for the write. Returns 0 (also for an agent unknown here, one
 * whose file is current, an ephemeral one, or without a store), or -1
 * with err set: AK_ERR_BUSY (in a turn or a restore), the write's error
 * (the agent stays dirty). */
int ak_agent_save(ak_agents *a, const char *id, ak_error *err);
/* Moves agent id out of RAM: saved first when its file is not current
 * (without a store, or ephemeral, it is forgotten: its next turn is cold),
 * then its blocks freed. Returns 0 (also when it was not in RAM or is
 * unknown), or -1 with err set: AK_ERR_BUSY (in a turn or a restore), the
 * save's error (it then stays in RAM). */
int ak_agent_evict(ak_agents *a, const char *id, ak_error *err);

/* Saves are written by a writer thread. An agent stays dirty until its file
 * is confirmed written; a failed write is retried with the same snapshot
 * (even after the agent was evicted) after a doubling backoff, a bounded
 * number of times; an agent whose last save failed for good stays dirty
 * (and is saved again at its next save point while its cache is in RAM). */

/* Writes every dirty agent to the store and waits for every queued save
 * (retries skip their backoff). Returns 0 when every agent is saved, or -1
 * with err naming the agents that are not (up to 8, then "...") and the last
 * error, its code that error's (AK_ERR_NOSPACE, AK_ERR_IO, ...). Those
 * agents are also those with ak_agent_info.dirty set. */
int ak_agents_flush(ak_agents *a, ak_error *err);
/* Agents (not ephemeral) whose current history is not confirmed on disk. */
int ak_agents_unsaved(ak_agents *a);

typedef struct {
    uint64_t saves;           /* files written */
    uint64_t failures;        /* failed write attempts (each retry counts) */
    uint64_t abandoned;       /* saves given up after their last attempt */
    int retrying;             /* failed saves waiting for their next attempt */
    int unsaved;              /* ak_agents_unsaved */
    uint64_t disk_budget;     /* the budget the writer keeps the store's agent files under (0: none) */
} ak_save_stats;
/* Counters of the writer, for /metrics (engine thread). */
void ak_agents_save_stats(ak_agents *a, ak_save_stats *st);

typedef struct {
    const char *id;
    int n_tokens;
    ak_tier tier;             /* HOT if in RAM, WARM if only on disk */
    size_t bytes;             /* RAM bytes of the blocks it reads when hot (shared ones included) */
    size_t private_bytes;     /* of them, bytes held by it alone */
    char pool[AK_AGENT_ID_MAX + 1];   /* the pool its history starts with ("" if none) */
    char card[AK_AGENT_ID_MAX + 1];   /* the card its history starts with ("" if none) */
    int impure;               /* its cache holds an imported card (never in the content index) */
    uint64_t last_use;        /* turn counter */
    int64_t last_unix;        /* wall-clock seconds of the last use */
    int dirty;                /* its history is not confirmed on disk (never for ephemeral agents) */
    int save_failed;          /* its last save failed for good */
    const char *save_error;   /* that save's error ("" if none) */
    int ephemeral;
    int in_turn;
} ak_agent_info;

/* Length of the common prefix of tokens[0..n) and the history of agent id
 * as its cache holds it now (0 if unknown or not in RAM). */
int ak_agent_match_len(const ak_agents *a, const char *id, const int32_t *tokens, int n);

/* The history of agent id as its cache holds it now: *n tokens at the
 * returned pointer (valid until the next call that changes the agent).
 * NULL with *n = 0 when the agent is unknown or not in RAM. */
const int32_t *ak_agent_history(const ak_agents *a, const char *id, int *n);

/* Index of agent id for ak_agents_get, or -1 if unknown. */
int ak_agents_find(const ak_agents *a, const char *id);

/* Number of agents known in memory (hot, or evicted this run). */
int ak_agents_count(const ak_agents *a);
/* Info of the i-th agent (0 <= i < count); pointers valid until the next call
 * that changes the set. */
void ak_agents_get(const ak_agents *a, int i, ak_agent_info *out);

/* One agent of a listing (ak_agents_listing): in RAM, or only in the store. */
typedef struct {
    char id[AK_AGENT_ID_MAX + 1];
    int n_tokens;
    ak_tier tier;             /* hot (RAM) or warm (store only) */
    uint64_t bytes;           /* RAM bytes it reads when hot (a pool's shared blocks
                                 included), file bytes when warm */
    uint64_t private_bytes;   /* of them, bytes held by it alone when hot; file bytes when warm */
    char pool[AK_AGENT_ID_MAX + 1];   /* the pool its history starts with ("" if none) */
    char card[AK_AGENT_ID_MAX + 1];   /* the card its history starts with ("" if none) */
    int64_t last_use;         /* unix seconds */
    int busy;                 /* the caller's busy(ud, id) said so (a request running or queued) */
} ak_agent_entry;

/* What a listing counted. */
typedef struct {
    int hot, warm;            /* entries in RAM / in the store only (or evicted) */
    uint64_t warm_bytes;      /* bytes of all the store's files given */
} ak_agents_census;

/* What a listing looks at besides the agents known here (ak_agents_listing). */
typedef struct {
    const ak_store_entry *files;              /* the store's index, listed by the caller */
    int n_files;
    int (*busy)(void *ud, const char *id);    /* fills each entry's busy flag; NULL: never busy */
    void *ud;
} ak_listing_opts;

/* Every agent worth listing: those known here (not ephemeral; in RAM, or
 * with a history), then those of o->files[0..n_files) not known here. A
 * known agent keeps its own token count, as its file may still hold an
 * older turn while a newer save is queued; when it is not in RAM its bytes
 * are its file's. With out non-NULL, *out gets the entries sorted by id
 * (malloc'd, the caller frees) and *n their number; with out NULL only
 * census is filled (may be NULL too). Returns 0, or -1 with err set
 * (AK_ERR_NOMEM). */
int ak_agents_listing(const ak_agents *a, const ak_listing_opts *o, ak_agent_entry **out, int *n,
                      ak_agents_census *census, ak_error *err);

/* POOLS. A pool is a named, write-once prefix (a document, a system
 * prompt) prefilled once, in its own K/V formats (default q8 keys, tq3
 * values), persisted in the store (store.h: pools/), and shared by every
 * agent that attaches to it: the agent's cache starts with the pool's
 * blocks as its base (kvcache.h), its own tokens in private blocks after
 * them, in the pool's formats. Nothing of the pool is copied per agent,
 * not even its partly filled last block. An agent's file records the pool's
 * id and content hash, not its blocks: a pool that changed or vanished
 * makes the agent's file a miss (recomputed), never garbage. */
typedef struct {
    char id[AK_AGENT_ID_MAX + 1];
    int n_tokens;
    ak_kv_format fk, fv;
    char hash[17];            /* content hash (store.h: ak_pool_content_hash) */
    int resident;             /* its blocks are in RAM */
    size_t bytes;             /* RAM bytes of its blocks when resident */
    uint64_t file_bytes;      /* 0 without a store */
    int readers;              /* agents whose history starts with it (in RAM or on disk) */
    int64_t created;          /* unix seconds */
} ak_pool_info;

/* 1 if id can name a pool (as agent ids). */
int ak_pool_id_valid(const char *id);
/* A pool to make (ak_pool_create, ak_pool_begin). */
typedef struct {
    const char *id;
    const int32_t *tokens;    /* its tokens[0..n) */
    int n;
    ak_kv_format fk, fv;      /* its K/V formats */
    const char *source;       /* kept with it (e.g. {"messages": [...]} as JSON); may be NULL */
} ak_pool_request;

/* Creates pool rq->id from its tokens (a plain prefill with c) in its
 * formats and writes it to the store (if any) with its source. progress
 * (may be NULL) is called during the prefill with the fraction done (ud
 * passed on). Returns 0, or -1 with err set: AK_ERR_INVALID (bad id, empty,
 * not shorter than n_ctx, format cannot store the head dims), AK_ERR_EXISTS
 * (pools are write-once: remove it first), AK_ERR_KV_BUDGET, a store error
 * (the pool is then not created). */
int ak_pool_create(ak_agents *a, ak_ctx *c, const ak_pool_request *rq, ak_progress_fn progress, void *ud,
                   ak_error *err);
/* The same in steps, for a scheduler that prefills in chunks: begin returns
 * in *kv the empty sequence to compute rq's tokens[0..n) into (errors as
 * ak_pool_create's, but for the prefill's and the store's); commit persists
 * and publishes it; abort forgets it. */
int ak_pool_begin(ak_agents *a, const ak_pool_request *rq, ak_kv **kv, ak_error *err);
int ak_pool_commit(ak_agents *a, const char *id, ak_error *err);
void ak_pool_abort(ak_agents *a, const char *id);
/* Info about pool id (loading nothing). Returns 0, or -1 with err set
 * (AK_ERR_NOT_FOUND). */
int ak_pool_get(ak_agents *a, const char *id, ak_pool_info *out, ak_error *err);
/* The pool's token ids (*tokens malloc'd) and source (*source malloc'd, or
 * NULL), loading it from the store if needed. Returns 0, or -1 with err set:
 * AK_ERR_NOT_FOUND, AK_ERR_STALE (made with another model), AK_ERR_CORRUPT
 * (quarantined), AK_ERR_KV_BUDGET ... */
int ak_pool_tokens(ak_agents *a, const char *id, int32_t **tokens, int *n, char **source, ak_error *err);
/* Every pool (in RAM or in the store), sorted by id, into *out (malloc'd).
 * Returns 0, or -1 with err set. */
int ak_pools_list(ak_agents *a, ak_pool_info **out, int *n, ak_error *err);
/* Deletes pool id (its blocks and its file). Refused with AK_ERR_BUSY while
 * agents are attached: err then names them (up to 8). Returns 0, 1 if
 * unknown, -1 with err set. */
int ak_pool_remove(ak_agents *a, const char *id, ak_error *err);

/* A turn of an agent whose prompt starts with a pool's tokens:
 * ak_agent_open with ak_turn_opts.pool_id. */

/* Bytes of blocks a turn of agent id with prompt tokens[0..n) (starting
 * with pool pool_id's tokens, or pool_id NULL) will add to the pool to
 * reach n_pos positions: what it holds already, the pool's blocks (when the
 * pool is resident) and full blocks of the prompt found in the content
 * index are not counted. For a scheduler's admission control. */
size_t ak_agent_bytes_to_add(const ak_agents *a, const char *id, const char *pool_id, const int32_t *tokens, int n,
                             int n_pos);

typedef struct {
    size_t shared_bytes;      /* KV bytes held by more than one holder */
    size_t logical_bytes;     /* bytes as the agents and pools see them */
    size_t used_bytes;        /* bytes really held */
    uint64_t linked_blocks;   /* blocks linked instead of computed or read */
    uint64_t linked_bytes;
    int pools, pools_resident;
} ak_share_stats;
void ak_agents_share_stats(ak_agents *a, ak_share_stats *st);

/* CARDS (cards.h). A card is a range of an agent's cache at a bit width per
 * token, handed to other agents. Cards are write-once and named like agents;
 * with a store they are files in it (store.h: CARDS), else they live in RAM
 * for the run. */
typedef struct {
    const char *card_id;         /* NULL or "": generated, "<agent>-<n>" (the first n free) */
    int from, to;                /* the range of the agent's history; to <= 0: its end */
    const uint8_t *widths_k;     /* (to - from) widths of 2, 4, 8, 16; NULL: all 16 */
    const uint8_t *widths_v;     /* likewise for values */
    const char *policy;          /* with widths: recorded (cards.h; NULL: "given"); without
                                    widths and with a budget: bitalloc.h's policy ("uniform",
                                    "importance", "topology"; NULL: uniform) */
    double budget_k, budget_v;   /* without widths: > 0 has bitalloc.h choose the widths under
                                    these average bits (each in [2, 16], else AK_ERR_INVALID;
                                    budget_v <= 0: budget_k); with widths: recorded (<= 0: the
                                    mean widths) */
    ak_ctx *ctx;                 /* importance / topology with a budget: the context the
                                    statistics pass runs on (below); NULL: scored from the
                                    token ids only (inverse frequency). Unused otherwise */
} ak_card_request;

/* THE STATISTICS PASS. A card asked with a budget and policy importance or
 * topology, and a context rq->ctx, is scored from attention (bitalloc.h's
 * I(t)): the range's tokens are prefilled once more, at their own positions
 * (the context's position offset set to `from` for the pass, then put back)
 * but without the tokens before the range, into a scratch sequence of the
 * agents' K/V formats with an ak_attn_stats (attnstats.h, the default
 * layers) attached to rq->ctx; the mass, its variance across heads, the
 * entropy and the exposure of each slot, and the token ids, go to
 * bitalloc.h. The scratch is freed before returning (room for it is made
 * like a turn's: idle agents evicted; AK_ERR_KV_BUDGET when none can be).
 * Cost: one prefill of the range plus the statistics' own scoring
 * (docs/attention-stats.md); uniform never runs it. Segments: every token
 * "other" (an agent keeps token ids, not the chat roles that produced
 * them). Overlap (topology): 1 for a position the agent holds from an
 * imported card (it was handed off once before), else 0; a card does not
 * record its own lineage, so longer chains count 1. */

/* Makes a card of agent agent_id's cache (restored from the store if it is
 * not in RAM), records it and puts its id in card_id_out; with a store, its
 * file is written behind by the writer thread (queued like an agent's save:
 * ak_agents_flush and ak_card_wait_saved wait for it; a crash before it lands
 * loses the card, and an agent file that records it then misses), or
 * here when the agents have no writer. Widths: rq's, or bitalloc.h's under rq's budgets
 * (scored from attention when rq->ctx is given: THE STATISTICS PASS above;
 * c must then be free for this thread's use, its attention statistics hook
 * is restored to none). Tokens the agent holds from an imported card keep or
 * lower their widths (cards.h). Returns 0, or -1 with err set:
 * AK_ERR_NOT_FOUND (no such agent, or it holds nothing), AK_ERR_BUSY (in a
 * turn or a restore), AK_ERR_INVALID (bad id, range outside the history,
 * bad widths, budget or policy), AK_ERR_EXISTS (a card of that id
 * exists: cards are write-once), AK_ERR_KV_BUDGET (no room for the
 * statistics pass), a forward-pass or store error (nothing recorded then). */
int ak_agent_make_card(ak_agents *a, const char *agent_id, const ak_card_request *rq,
                       char card_id_out[AK_AGENT_ID_MAX + 1], ak_error *err);

/* Import "replace": agent id's whole context becomes card card_id (the
 * agent is created if unknown; what it held is dropped). Its cache is the
 * card's mixed blocks, read in place (nothing is prefilled: a turn whose
 * prompt extends the card's tokens reuses all of them), its history the
 * card's tokens, and it is marked impure: never published to the content
 * index nor linked from it. Its file then records the card (id and content
 * hash, as a pool base) and holds only its own positions; a restore
 * re-imports the card, and a card that vanished or changed makes the file
 * a miss (recomputed). A card cut from the middle of a context (position
 * offset > 0) has its keys rotated to start at position 0 first
 * (cards.h: ak_card_shift, one more quantization of each key; the restore
 * rebuilds the same bits). Returns 0, or -1 with err set: AK_ERR_BUSY (a turn or a
 * restore in flight), AK_ERR_NOT_FOUND (no such card), AK_ERR_STALE (made
 * with another model), AK_ERR_CORRUPT (quarantined), AK_ERR_INVALID (bad
 * ids, longer than the context), AK_ERR_KV_BUDGET; the agent is then as it
 * was. */
int ak_agent_import_card(ak_agents *a, const char *id, const char *card_id, ak_error *err);

/* Import "append": the card goes AFTER what agent id holds (restored first
 * if it is not in RAM). With p tokens held, the agent's cache becomes its
 * positions [0, p) (shared, not copied: kvcache.h, its own positions frozen
 * as a segment) followed by the card's mixed blocks at [p, p + n), their
 * keys rotated to start at p (cards.h: ak_card_shift); its history its p
 * tokens followed by the card's n. Nothing is prefilled.
 *
 * AN APPROXIMATION: the card's vectors were computed by another agent that
 * never saw the receiver's p tokens (its keys and values attend to its own
 * context only); moving its keys to p makes the positions right, not the
 * contents. The result equals what a cache holds whose positions [0, p)
 * were computed alone and whose [p, p + n) were computed alone from
 * position 0 and key-shifted by p, not a prefill of both texts (the
 * memory-chunk work corrects this). Imported blocks are private to the
 * agent, which stays impure (as for replace). The agent's file records its
 * segments (store.h: SEGMENTS): its pool or card base if any, its own
 * positions before the card (stored in the file), the card (id, content
 * hash; rebuilt at the same position by a restore); a card that vanished
 * or changed makes the file a miss. A context holds at most
 * AK_KV_MAX_SEGMENTS segments (the positions before a card are one, the
 * card another): appending past that is AK_ERR_INVALID. An agent holding
 * nothing (unknown, or empty) gets the card as with replace. Errors as
 * ak_agent_import_card, and AK_ERR_INVALID when the agent's tokens and the
 * card's do not fit the context together; the agent is then as it was. */
typedef enum { AK_IMPORT_REPLACE, AK_IMPORT_APPEND } ak_import_mode;
int ak_agent_import_card_mode(ak_agents *a, const char *id, const char *card_id, ak_import_mode mode,
                              ak_error *err);

/* The card card_id (loaded from the store if need be; owned by a, valid
 * until it is removed or a is freed), or NULL with err set (codes as
 * ak_agent_import_card). */
const struct ak_card *ak_card_get(ak_agents *a, const char *card_id, ak_error *err);

/* Waits until card card_id's file is written, if its write is queued or
 * in progress (ak_agent_make_card writes behind); returns at once
 * otherwise. Any thread. Whether the write succeeded, the store says (a
 * failed one is logged and retried like an agent's save). */
void ak_card_wait_saved(ak_agents *a, const char *card_id);

/* The threads an import (replace or append) fills a card's blocks on: the
 * engine's, whose imports run between its steps (NULL, the default: the
 * caller's thread). Restores never use them (they may run beside a step). */
void ak_agents_set_threads(ak_agents *a, ak_threads *threads);
/* Every card (in RAM or in the store), sorted by id, into *out (malloc'd;
 * store.h's entry; bytes is the file size, 0 for cards only in RAM).
 * Returns 0, or -1 with err set. */
int ak_cards_list(ak_agents *a, ak_store_card_entry **out, int *n, ak_error *err);
/* Deletes card card_id (from RAM and the store). Refused with AK_ERR_BUSY
 * while agents hold it (in RAM or in their files): err then names them (up
 * to 8). Returns 0, 1 if unknown, -1 with err set. */
int ak_card_remove(ak_agents *a, const char *card_id, ak_error *err);

#endif
