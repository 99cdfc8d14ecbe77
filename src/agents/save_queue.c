/* save_queue.c - the save queue (save_queue.h): saves written by a writer
 * thread, retries, the disk budget. Knows the store, not the agents.
 *
 * A failed write is retried by the writer with the same snapshot (so it
 * survives the agent's eviction) after a backoff that doubles from
 * SAVE_BACKOFF_S up to SAVE_BACKOFF_MAX_S, at most SAVE_ATTEMPTS times in
 * all; a newer snapshot of the same agent supersedes it. The writer reports
 * every outcome in a results list that the owner's thread applies through
 * the owner's hook (saves_drain).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agents/save_queue.h"
#include "store/cards.h"

#define SAVE_ATTEMPTS 6
#define SAVE_BACKOFF_S 0.25
#define SAVE_BACKOFF_MAX_S 30.0

struct save_queue {
    save_queue_config cfg;
    pthread_t writer;
    int writer_running;
    pthread_mutex_t mu;         /* guards the fields below */
    pthread_cond_t cv;          /* on CLOCK_MONOTONIC (retry deadlines) */
    pending *head, *tail;       /* queued saves, oldest first */
    pending *retry;             /* failed saves waiting for their next attempt */
    save_result *results;       /* outcomes not yet applied by the owner */
    int writing;                /* a save is being written (not in a list) */
    char writing_id[AK_AGENT_ID_MAX + 1];
    int hurry;                  /* > 0: someone waits for saves: retry without backoff */
    int stop;
    uint64_t saves_done, saves_failed, saves_abandoned;
};

#define qlogf(q, ...) ak_logf((q)->cfg.log, (q)->cfg.log_ud, __VA_ARGS__)

/* 1 if a newer snapshot of p's agent is queued or waiting for a retry (p
 * need not be written). Call with q->mu held. */
static int superseded(const save_queue *q, const pending *p) {
    const pending *lists[2] = {q->head, q->retry};
    for (int k = 0; k < 2; k++)
        for (const pending *o = lists[k]; o; o = o->next)
            if (o != p && !p->card && !o->card && o->version > p->version && !strcmp(o->id, p->id)) return 1;
    return 0;
}

/* Queues p (an agent's snapshot or a card) for the writer, last. */
void saves_enqueue(save_queue *q, pending *p) {
    pthread_mutex_lock(&q->mu);
    if (q->tail) q->tail->next = p;
    else q->head = p;
    q->tail = p;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* Records the outcome of a save for the owner's thread. Call with q->mu
 * held. Out of memory: the outcome is lost and the owner's record stays as
 * it was (an agent dirty with a save queued) until it is saved again. */
static void post_result(save_queue *q, const pending *p, int ok, const ak_error *error) {
    save_result *r = calloc(1, sizeof *r);
    if (!r) return;
    snprintf(r->id, sizeof r->id, "%s", p->id);
    r->version = p->version;
    r->ok = ok;
    r->card = p->card != NULL;
    snprintf(r->error, sizeof r->error, "%s", error ? error->msg : "");
    r->code = error ? error->code : AK_ERR_NONE;
    r->next = q->results;
    q->results = r;
}

/* The next save to write: the oldest queued one, else the retry that is due
 * first once it is due (at once when someone waits or at stop). Waits on the
 * condition until one is there; NULL when stopping with nothing left. Call
 * with q->mu held. */
static pending *next_save(save_queue *q) {
    for (;;) {
        if (q->head) {
            pending *p = q->head;
            q->head = p->next;
            if (!q->head) q->tail = NULL;
            return p;
        }
        if (q->retry) {
            pending **best = &q->retry;
            for (pending **pp = &q->retry; *pp; pp = &(*pp)->next)
                if ((*pp)->due < (*best)->due) best = pp;
            double now = ak_now();
            if (q->stop || q->hurry > 0 || (*best)->due <= now) {
                pending *p = *best;
                *best = p->next;
                return p;
            }
            double due = (*best)->due;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            double wait = due - now;
            ts.tv_sec += (time_t)wait;
            ts.tv_nsec += (long)((wait - (double)(time_t)wait) * 1e9);
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&q->cv, &q->mu, &ts);
            continue;
        }
        if (q->stop) return NULL;
        pthread_cond_wait(&q->cv, &q->mu);
    }
}

/* Deletes least recently used files beyond the disk budget (writer
 * thread: file I/O stays off the engine's thread). */
static void apply_disk_budget(save_queue *q) {
    ak_error ge = {{0}};
    if (ak_store_gc(q->cfg.store, q->cfg.disk_budget, NULL, &ge) < 0) qlogf(q, "disk budget: %s", ge.msg);
}

/* The writer thread: writes the saves next_save hands it, one at a time
 * without the lock, keeps a failed one for a retry after a backoff (or
 * gives it up), and posts each outcome; ends when stopping with nothing
 * left. */
static void *writer_main(void *arg) {
    save_queue *q = arg;
    pthread_mutex_lock(&q->mu);
    pending *p;
    while ((p = next_save(q))) {
        if (superseded(q, p)) {   /* a newer snapshot will be written: this one must not land after it */
            ak_snapshot_free(p->snap);
            free(p);
            pthread_cond_broadcast(&q->cv);
            continue;
        }
        q->writing = 1;
        snprintf(q->writing_id, sizeof q->writing_id, "%s", p->id);
        pthread_mutex_unlock(&q->mu);
        ak_error err = {{0}};
        int rc = p->card ? ak_store_save_card(q->cfg.store, p->card, &err)
                         : ak_store_write_snapshot(q->cfg.store, p->snap, &err);
        p->attempts++;
        pthread_mutex_lock(&q->mu);
        q->writing = 0;
        int keep = 0;
        if (rc == 0) {
            q->saves_done++;
            post_result(q, p, 1, NULL);
            if (q->cfg.disk_budget) {   /* only a save grows the directory; gc reads the store's index */
                pthread_mutex_unlock(&q->mu);
                apply_disk_budget(q);
                pthread_mutex_lock(&q->mu);
            }
        } else {
            q->saves_failed++;
            keep = p->attempts < SAVE_ATTEMPTS && !superseded(q, p);
            if (keep) {
                double backoff = SAVE_BACKOFF_S;
                for (int i = 1; i < p->attempts && backoff < SAVE_BACKOFF_MAX_S; i++) backoff *= 2;
                if (backoff > SAVE_BACKOFF_MAX_S) backoff = SAVE_BACKOFF_MAX_S;
                p->due = ak_now() + backoff;
                p->next = q->retry;
                q->retry = p;
            } else {
                q->saves_abandoned++;
                post_result(q, p, 0, &err);
            }
        }
        pthread_cond_broadcast(&q->cv);
        /* only this thread takes saves off the lists, so p is still valid
         * below even when kept; the log line is written without the lock */
        pthread_mutex_unlock(&q->mu);
        if (rc < 0)
            qlogf(q, "%s %s: save failed (attempt %d of %d; the previous file is kept; %s): %s", p->card ? "card" : "agent",
                  p->id, p->attempts, SAVE_ATTEMPTS, keep ? "will retry" : p->card ? "the card stays in RAM only" :
                  "the agent stays unsaved", err.msg);
        if (!keep) {
            ak_snapshot_free(p->snap);
            free(p);
        }
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

save_queue *saves_new(const save_queue_config *cfg, ak_error *err) {
    save_queue *q = ak_calloc(1, sizeof *q, err);
    if (!q) return NULL;
    q->cfg = *cfg;
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);   /* retry deadlines are ak_now() times */
    pthread_cond_init(&q->cv, &ca);
    pthread_condattr_destroy(&ca);
    /* The budget holds from the start, not only after the first save: a node
     * that only loads would otherwise keep an over-budget directory (and, in
     * front of Redis, grow its read-through copies: gc sets their room). */
    if (cfg->store && cfg->disk_budget) apply_disk_budget(q);
    if (cfg->store) {
        if (pthread_create(&q->writer, NULL, writer_main, q) != 0) {
            ak_fail(err, "agents: cannot start the writer thread");
            pthread_mutex_destroy(&q->mu);
            pthread_cond_destroy(&q->cv);
            free(q);
            return NULL;
        }
        q->writer_running = 1;
    }
    return q;
}

int saves_running(const save_queue *q) { return q->writer_running; }

/* Waits until no save of `id` (NULL: of any) is queued, being written or
 * waiting for a retry, so that a restore reads the newest file; retries
 * meanwhile skip their backoff (they stay bounded in number). */
void saves_wait(save_queue *q, const char *id) {
    if (!q->writer_running) return;
    pthread_mutex_lock(&q->mu);
    q->hurry++;
    pthread_cond_broadcast(&q->cv);
    for (;;) {
        int busy = q->writing && (!id || !strcmp(q->writing_id, id));
        const pending *lists[2] = {q->head, q->retry};
        for (int k = 0; k < 2; k++)
            for (const pending *p = lists[k]; p && !busy; p = p->next) busy = !id || !strcmp(p->id, id);
        if (!busy) break;
        pthread_cond_wait(&q->cv, &q->mu);
    }
    q->hurry--;
    pthread_mutex_unlock(&q->mu);
}

/* Hands the writer's reported outcomes to the owner's hook, oldest first. */
void saves_drain(save_queue *q) {
    if (!q->writer_running) return;
    pthread_mutex_lock(&q->mu);
    save_result *r = q->results;
    q->results = NULL;
    pthread_mutex_unlock(&q->mu);
    /* the list is newest first: apply oldest first */
    save_result *rev = NULL;
    while (r) {
        save_result *nx = r->next;
        r->next = rev;
        rev = r;
        r = nx;
    }
    for (r = rev; r;) {
        q->cfg.applied(q->cfg.owner, r);
        save_result *nx = r->next;
        free(r);
        r = nx;
    }
}

int saves_write_now(save_queue *q, const char *id, ak_snapshot *snap, ak_error *err) {
    saves_wait(q, id); /* an older queued save must not land after this one */
    int rc = ak_store_write_snapshot(q->cfg.store, snap, err);
    ak_snapshot_free(snap);
    pthread_mutex_lock(&q->mu);
    if (rc < 0) q->saves_failed++;
    else q->saves_done++;
    pthread_mutex_unlock(&q->mu);
    if (rc == 0 && q->cfg.disk_budget) apply_disk_budget(q);
    return rc;
}

void saves_free(save_queue *q) {
    if (!q) return;
    if (q->writer_running) {
        pthread_mutex_lock(&q->mu);
        q->stop = 1;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->writer, NULL);
        saves_drain(q);   /* frees the list */
        q->writer_running = 0;
    }
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
}

void saves_counts(save_queue *q, ak_save_stats *st) {
    pthread_mutex_lock(&q->mu);
    st->saves = q->saves_done;
    st->failures = q->saves_failed;
    st->abandoned = q->saves_abandoned;
    st->retrying = 0;
    for (const pending *p = q->retry; p; p = p->next) st->retrying++;
    pthread_mutex_unlock(&q->mu);
}
