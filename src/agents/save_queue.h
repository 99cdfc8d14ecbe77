/* save_queue.h - the save queue (save_queue.c): agents' snapshots and
 * cards written behind by a writer thread, retries, the disk budget.
 * Not a public header.
 *
 * The lowest part of the agents' module: it knows the store, not the
 * agents. Its owner (the registry, agent_impl.h) gives it at creation the
 * hook that applies the outcome of a write to the owner's records, and
 * calls saves_drain on its own thread to have the outcomes applied.
 *
 * Saving. A save is an agent's snapshot (its cache copied, so the agent may
 * be evicted or decode on meanwhile) or a card, with the version of the
 * agent's history it holds. A failed write is retried by the writer with
 * the same snapshot after a backoff that doubles up to a bound, a bounded
 * number of times; a newer snapshot of the same agent supersedes it.
 * Waiting for saves (saves_wait) skips the backoff. Every outcome is
 * reported back (saves_drain).
 */
#ifndef AK_AGENTS_SAVE_QUEUE_H
#define AK_AGENTS_SAVE_QUEUE_H

#include <stdint.h>

#include "agents/agent.h"
#include "store/store.h"

/* A save waiting for the writer thread. */
typedef struct pending {
    struct pending *next;
    char id[AK_AGENT_ID_MAX + 1];
    ak_snapshot *snap;          /* an agent's save; NULL for a card's */
    const struct ak_card *card; /* a card to write (made this run, freed only after its write) */
    uint64_t version;
    int attempts;               /* writes tried so far */
    double due;                 /* a retry: not before this time (ak_now) */
} pending;

/* The outcome of a save, from the writer to the owner's thread. */
typedef struct save_result {
    struct save_result *next;
    char id[AK_AGENT_ID_MAX + 1];
    uint64_t version;
    int ok;
    int card;                   /* the outcome of a card's write, not an agent's */
    char error[512];
    int code;                   /* the error's ak_err_code */
} save_result;

/* What the queue is given by its owner. */
typedef struct {
    ak_store *store;            /* NULL: no writer thread (nothing is written behind) */
    uint64_t disk_budget;       /* bytes the store's files are kept under (ak_store_gc); 0: none */
    ak_log_fn log;              /* failed writes and the disk budget's errors (may be NULL) */
    void *log_ud;
    /* Applies the outcome r of a write to the owner's records (called by
     * saves_drain on the owner's thread, oldest outcome first; r is freed
     * after). */
    void (*applied)(void *owner, const save_result *r);
    void *owner;
} save_queue_config;

typedef struct save_queue save_queue;

/* A queue for cfg: applies the disk budget and starts the writer thread
 * when there is a store. Returns it, or NULL with err set (AK_ERR_NOMEM, or
 * the thread could not start). */
save_queue *saves_new(const save_queue_config *cfg, ak_error *err);
/* Stops the writer once everything queued is written (retries without
 * backoff), applies the outcomes and frees q. NULL: no-op. */
void saves_free(save_queue *q);
/* 1 if a writer thread writes the queued saves (there is a store). */
int saves_running(const save_queue *q);
/* Queues p (an agent's snapshot or a card, taken over) for the writer, last. */
void saves_enqueue(save_queue *q, pending *p);
/* Waits until no save of id (NULL: of any) is queued, being written or
 * waiting for a retry; retries meanwhile skip their backoff. */
void saves_wait(save_queue *q, const char *id);
/* Applies the writer's reported outcomes through the owner's hook (the
 * owner's thread). */
void saves_drain(save_queue *q);
/* Writes snap (agent id's, taken over) here, after any save of id still on
 * its way (which must not land after it); counts it and applies the disk
 * budget after a write. Returns 0, or -1 with err set (the store's error). */
int saves_write_now(save_queue *q, const char *id, ak_snapshot *snap, ak_error *err);
/* The writer's counters into st: saves, failures, abandoned, retrying
 * (the rest of st untouched). */
void saves_counts(save_queue *q, ak_save_stats *st);

#endif
