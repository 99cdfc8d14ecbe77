/* agent_impl.h - what agent.c and pools.c share inside the agents module:
 * the structures and the few helpers both need. Not a public header. */
#ifndef AK_AGENT_IMPL_H
#define AK_AGENT_IMPL_H

#include <pthread.h>

#include "agents/agent.h"

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
                                                SEGMENTS; lengths as kv's, kept by segs_sync) */
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
    int ephemeral;          /* never saved; dropped when evicted */
    int restoring;          /* a prefetch job is loading it */
    int ahead;              /* restored by a prefetch, not yet reported */
    double ahead_ms;
    uint64_t ahead_bytes;
} agent;

struct ak_restore_job {
    char id[AK_AGENT_ID_MAX + 1];
    ak_store *store;
    const char *fingerprint;
    int vocab;
    ak_kv *kv;
    size_t reserved;
    ak_store_status status;
    ak_store_load_info info;
    ak_error err;
    struct prelink_ctx *prelink;   /* what the restore links instead of reading (agent.c) */
};

/* A save waiting for the writer thread: the agent's cache was copied into
 * the snapshot, so the agent may be evicted or decode on meanwhile. */
typedef struct pending {
    struct pending *next;
    char id[AK_AGENT_ID_MAX + 1];
    ak_snapshot *snap;          /* an agent's save; NULL for a card's */
    const struct ak_card *card; /* a card to write (made this run, freed only after its write) */
    uint64_t version;
    int attempts;               /* writes tried so far */
    double due;                 /* a retry: not before this time (ak_now) */
} pending;

/* The outcome of a save, from the writer to the engine thread. */
typedef struct save_result {
    struct save_result *next;
    char id[AK_AGENT_ID_MAX + 1];
    uint64_t version;
    int ok;
    int card;                   /* the outcome of a card's write, not an agent's */
    char error[512];
    int code;                   /* the error's ak_err_code */
} save_result;

struct ak_agents {
    ak_agents_config cfg;
    ak_pool *threads;           /* ak_agents_set_threads: imports fill card blocks on them */
    agent **v;
    int n, cap;
    uint64_t clock;
    uint64_t next_version;
    /* background writer: file I/O off the engine's thread */
    pthread_t writer;
    int writer_running;
    pthread_mutex_t mu;         /* guards the fields below */
    pthread_cond_t cv;          /* on CLOCK_MONOTONIC (retry deadlines) */
    pending *head, *tail;       /* queued saves, oldest first */
    pending *retry;             /* failed saves waiting for their next attempt */
    save_result *results;       /* outcomes not yet applied to the agents */
    int writing;                /* a save is being written (not in a list) */
    char writing_id[AK_AGENT_ID_MAX + 1];
    int hurry;                  /* > 0: someone waits for saves: retry without backoff */
    int stop;
    uint64_t saves_done, saves_failed, saves_abandoned;
    size_t reserved;            /* bytes promised to restores in flight */
    /* pools (pools.c): those known this run, resident or not */
    struct pool_rec **pools;
    int n_pools, cap_pools;
    /* cards (agent.c): made or loaded this run, immutable */
    struct ak_card **cards;
    int n_cards, cap_cards;
    /* memories (memories.c): those known this run */
    struct mem_rec **mems;
    int n_mems, cap_mems;
    uint64_t linked_blocks;     /* blocks linked (pool bases and the content index) instead of computed or read */
    uint64_t linked_bytes;
};

/* A pool as this process knows it (pools.c). */
typedef struct pool_rec {
    char id[AK_AGENT_ID_MAX + 1];
    char hash[17];              /* content hash ("" while building) */
    int32_t *tokens;            /* (n) */
    int n;
    ak_kv_format fk, fv;
    ak_kv *kv;                  /* NULL unless resident */
    char *source;               /* what it was made from (JSON), or NULL */
    int64_t created;
    uint64_t file_bytes;
    int building;               /* ak_pool_begin called, not yet committed */
} pool_rec;

#define logf_(a, ...) ak_logf((a)->cfg.log, (a)->cfg.log_ud, __VA_ARGS__)

/* agent.c */
agent *agents_find(const ak_agents *a, const char *id);
/* Evicts idle LRU agents (then idle resident pools) until `need` bytes are
 * free; returns the number evicted, or -1 with err set. */
int agents_ensure_room(ak_agents *a, size_t need, const agent *keep, ak_error *err);

/* pools.c */
pool_rec *pools_find(const ak_agents *a, const char *id);
/* The pool, resident (loaded from the store if need be), or NULL with err
 * set (AK_ERR_NOT_FOUND, AK_ERR_STALE, AK_ERR_CORRUPT, ...). */
pool_rec *pools_resolve(ak_agents *a, const char *id, ak_error *err);
/* Drops one idle resident pool that the store can give back and whose
 * blocks no agent shares; returns 1, or 0 if there is none. */
int pools_evict_one(ak_agents *a);
void pools_free_all(ak_agents *a);

/* memories.c */
/* Memory id's blocks with their keys at positions [at, at + n), in formats
 * fk/fv (the memory's: its own vectors; others: converted, each vector
 * dequantized and quantized again): a sequence whose positions [0, n) hold
 * them, owned by the memory and shared by every placement at `at` in those
 * formats; its tokens and content hash. NULL with err set (memories.h:
 * ak_memory_kv's errors). */
const ak_kv *mems_blocks_at(ak_agents *a, const char *id, int at, ak_kv_format fk, ak_kv_format fv,
                            const int32_t **tokens, int *n, const char **hash, ak_error *err);
void mems_free_all(ak_agents *a);
/* Drops from RAM one shifted copy whose blocks no agent holds, else one
 * idle memory the store can give back (its file reloads it on use);
 * returns 1, or 0 if there is none. */
int mems_evict_one(ak_agents *a);


#endif
