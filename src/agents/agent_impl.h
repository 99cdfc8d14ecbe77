/* agent_impl.h - the core of the agents module: the agent records and
 * their registry (registry.c: find, create, LRU eviction, the KV budget,
 * saving an agent and flushing through the save queue). Not a public
 * header.
 *
 * THE DIRECTION. The module's files depend on each other one way, lowest
 * first (no file calls one above it):
 *   1. the save queue, save_queue.c (save_queue.h): the writer thread,
 *      retries, the disk budget; it knows the store, not the agents;
 *   2. the registry, registry.c (this header), on the save queue: it owns
 *      the queue, snapshots agents into it, and gives it at creation the
 *      hook (save_queue_config.applied) through which a write's outcome
 *      reaches the agent;
 *   3. the resident sets, each on the two below: pools.c (pools_impl.h),
 *      memories.c (memories_impl.h), card_set.c (card_set.h);
 *   4. restore.c (restore.h): restores and prefetches, on the registry,
 *      the save queue, pools and cards;
 *   5. turn.c (turns, placing memories, admission) and agent_cards.c
 *      (making and importing cards), on everything below.
 * bitalloc.c (bitalloc.h) is apart: pure, on nothing of the module; cards
 * use it. The registry reaches no module above it either: a resident set
 * registers an ak_resident_ops with the registry
 * (agents_resident_register), which asks it to drop something when idle
 * agents cannot make room and frees it with the agents. A lower file never
 * includes a higher one's header. */
#ifndef AK_AGENT_IMPL_H
#define AK_AGENT_IMPL_H

#include "agents/agent.h"
#include "agents/save_queue.h"

typedef struct {
    char id[AK_AGENT_ID_MAX + 1];
    char pool[AK_AGENT_ID_MAX + 1];   /* the pool its cache's base came from ("" if none) */
    char pool_hash[17];     /* that pool's content hash */
    int pub_spans;          /* blocks before this one were entered in the content index */
    char card[AK_AGENT_ID_MAX + 1];   /* the card its cache's base came from ("" if none) */
    char card_hash[17];     /* that card's content hash */
    int impure;             /* its cache holds an imported card (or positions frozen under an
                               appended one): never published to nor linked from the content
                               index (prefix.h) */
    ak_store_seg segs[AK_KV_MAX_SEGMENTS];   /* what each segment of its cache's base is (store.h:
                                                SEGMENTS; lengths as kv's, kept by agent_segs_sync) */
    int n_segs;             /* of them, those its cache (or, evicted, its file) holds */
    int32_t *tokens;        /* (cap) the history whose KV the cache holds */
    int n, cap;
    ak_kv *kv;              /* NULL unless hot */
    uint64_t last_use;
    int64_t last_unix;      /* wall-clock seconds of last_use */
    uint64_t version;       /* of the history (0: never changed) */
    uint64_t saved;         /* version known to be on disk (== version: clean) */
    uint64_t queued;        /* version of the snapshot queued or being retried (0: none) */
    int save_failed;        /* the last save of this agent failed for good */
    char save_error[512];   /* its error */
    int save_code;          /* and its code */
    int in_turn;            /* begin() called and end() not yet */
    uint32_t domain;        /* the trust domain of its last turn's request (ak_turn_opts.domain) */
    int ephemeral;          /* never saved; dropped when evicted */
    int restoring;          /* a prefetch job is loading it */
    int ahead;              /* restored by a prefetch, not yet reported */
    double ahead_ms;
    uint64_t ahead_bytes;
} agent;

/* The slots of the resident sets (see ak_resident_ops below), in the order
 * the registry asks them to drop something and frees them. */
typedef enum { AK_RESIDENT_POOLS, AK_RESIDENT_MEMORIES, AK_RESIDENT_CARDS, AK_RESIDENT_SLOTS } ak_resident_slot;

struct ak_agents {
    ak_agents_config cfg;
    ak_threads *threads;           /* ak_agents_set_threads: imports fill card blocks on them */
    const struct ak_resident_ops *resident[AK_RESIDENT_SLOTS];   /* the sets registered, by slot */
    agent **v;
    int n, cap;
    uint64_t clock;
    uint64_t next_version;
    save_queue *saves;          /* file I/O off the engine's thread (save_queue.h) */
    size_t reserved;            /* bytes promised to restores in flight */
    /* the resident sets' own records, each touched only by its module (the
     * registry reaches them through resident[]) */
    /* pools (pools.c): those known this run, resident or not */
    struct pool_rec **pools;
    int n_pools, cap_pools;
    /* cards (card_set.c): made or loaded this run, immutable */
    struct ak_card **cards;
    int n_cards, cap_cards;
    /* memories (memories.c): those known this run */
    struct mem_rec **mems;
    int n_mems, cap_mems;
    uint64_t linked_blocks;     /* blocks linked (pool bases and the content index) instead of computed or read */
    uint64_t linked_bytes;
};

#define logf_(a, ...) ak_logf((a)->cfg.log, (a)->cfg.log_ud, __VA_ARGS__)

/* 1 if g's file is not current (its history changed since the version
 * known to be on disk). */
static inline int agent_is_dirty(const agent *g) { return g->saved != g->version; }

/* ---- resident sets (registered with the registry) ------------------------ */

/* What holds blocks (or other memory) of the agents' pool outside any
 * agent, as the registry sees it. */
typedef struct ak_resident_ops {
    /* Drops one idle thing the set can bring back (or whose blocks no agent
     * holds); returns 1, or 0 if there is none. NULL: the set never drops. */
    int (*evict_one)(ak_agents *a);
    /* Frees everything of the set (at ak_agents_free, after the agents). */
    void (*free_all)(ak_agents *a);
} ak_resident_ops;

/* Registers ops (static, outliving a) in slot; a set registers before it
 * first keeps something. Registering again is harmless. */
void agents_resident_register(ak_agents *a, ak_resident_slot slot, const ak_resident_ops *ops);

/* ---- the registry (registry.c) ------------------------------------------- */

/* The agent id known this run (hot or not), or NULL. */
agent *agents_find(const ak_agents *a, const char *id);
/* A new, cold, empty agent id, taken into the registry; NULL with err set
 * (AK_ERR_NOMEM). */
agent *agents_create(ak_agents *a, const char *id, ak_error *err);
/* Marks g used now (the LRU clock and the wall clock). */
void agent_touch(ak_agents *a, agent *g);
/* Sets g's history to tokens[0, n) (tokens may be g's own). Returns 0, or
 * -1 with err set (AK_ERR_NOMEM) and g unchanged. */
int agent_set_history(agent *g, const int32_t *tokens, int n, ak_error *err);
/* Brings g's segment descriptors, pool, card and impure in line with its
 * sequence (when hot). */
void agent_segs_sync(agent *g);
/* Sets g's segment k to a pool's or a card's (id, hash). */
void agent_seg_named(agent *g, int k, int kind, const char *id, const char *hash);
/* Replaces g's sequence with kv (taken over), whose one segment is a
 * pool's or a card's (kind, id, hash), and syncs g's base bookkeeping. */
void agent_set_base(agent *g, ak_kv *kv, int kind, const char *id, const char *hash);
/* Evicts idle LRU agents other than keep (then asks the resident sets)
 * until `need` bytes are free; returns the number of agents evicted, or -1
 * with err set (AK_ERR_KV_BUDGET when nothing more can go). */
int agents_ensure_room(ak_agents *a, size_t need, const agent *keep, ak_error *err);
/* Bytes of nb spans in formats fk/fv once an agent's window moved on. */
size_t agents_spans_bytes(const ak_agents *a, int nb, ak_kv_format fk, ak_kv_format fv);
/* Bytes of the blocks kv lacks to hold n_pos positions. */
size_t agents_kv_grow_bytes(const ak_agents *a, const ak_kv *kv, int n_pos);
/* Bytes g (hot or not) adds to hold n_pos positions. */
size_t agent_bytes_for(const ak_agents *a, const agent *g, int n_pos);

/* Saves g if its file is not current and no save of its current history is
 * on its way: snapshots it and queues the write on a->saves (sync = 1, or
 * no writer: writes it here). Returns 0, or -1 with err set. */
int agent_save(ak_agents *a, agent *g, int sync, ak_error *err);

#endif
