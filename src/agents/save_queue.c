/* save_queue.c - the save queue (agent_impl.h): snapshots written by a
 * writer thread, retries, flush.
 *
 * Saving. An agent's history has a version (from one counter for all agents,
 * so a version never repeats, not even for a removed and re-created id); the
 * agent is dirty while the version confirmed on disk is not its current one.
 * A save copies the cache into a snapshot (engine thread) and queues it for
 * the writer thread; the agent stays dirty until the writer reports that the
 * file is in place. A failed write is retried by the writer with the same
 * snapshot (so it survives the agent's eviction) after a backoff that
 * doubles from SAVE_BACKOFF_S up to SAVE_BACKOFF_MAX_S, at most SAVE_ATTEMPTS
 * times in all; a newer snapshot of the same agent supersedes it. Waiting
 * for saves (flush, a restore of the same agent, shutdown) skips the
 * backoff. The writer reports every outcome in a results list that the
 * engine thread applies to its agents (saves_drain).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agents/agent_impl.h"
#include "store/cards.h"

#define SAVE_ATTEMPTS 6
#define SAVE_BACKOFF_S 0.25
#define SAVE_BACKOFF_MAX_S 30.0

/* 1 if a newer snapshot of p's agent is queued or waiting for a retry (p
 * need not be written). Call with a->mu held. */
static int superseded(const ak_agents *a, const pending *p) {
    const pending *lists[2] = {a->head, a->retry};
    for (int k = 0; k < 2; k++)
        for (const pending *q = lists[k]; q; q = q->next)
            if (q != p && !p->card && !q->card && q->version > p->version && !strcmp(q->id, p->id)) return 1;
    return 0;
}

/* Queues p (an agent's snapshot or a card) for the writer, last. */
void saves_enqueue(ak_agents *a, pending *p) {
    pthread_mutex_lock(&a->mu);
    if (a->tail) a->tail->next = p;
    else a->head = p;
    a->tail = p;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* Records the outcome of a save for the engine thread. Call with a->mu
 * held. Out of memory: the outcome is lost and the agent stays as it was
 * (dirty with a save queued) until it is saved again. */
static void post_result(ak_agents *a, const pending *p, int ok, const ak_error *error) {
    save_result *r = calloc(1, sizeof *r);
    if (!r) return;
    snprintf(r->id, sizeof r->id, "%s", p->id);
    r->version = p->version;
    r->ok = ok;
    r->card = p->card != NULL;
    snprintf(r->error, sizeof r->error, "%s", error ? error->msg : "");
    r->code = error ? error->code : AK_ERR_NONE;
    r->next = a->results;
    a->results = r;
}

/* The next save to write: the oldest queued one, else the retry that is due
 * first once it is due (at once when someone waits or at stop). Waits on the
 * condition until one is there; NULL when stopping with nothing left. Call
 * with a->mu held. */
static pending *next_save(ak_agents *a) {
    for (;;) {
        if (a->head) {
            pending *p = a->head;
            a->head = p->next;
            if (!a->head) a->tail = NULL;
            return p;
        }
        if (a->retry) {
            pending **best = &a->retry;
            for (pending **pp = &a->retry; *pp; pp = &(*pp)->next)
                if ((*pp)->due < (*best)->due) best = pp;
            double now = ak_now();
            if (a->stop || a->hurry > 0 || (*best)->due <= now) {
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
            pthread_cond_timedwait(&a->cv, &a->mu, &ts);
            continue;
        }
        if (a->stop) return NULL;
        pthread_cond_wait(&a->cv, &a->mu);
    }
}

/* Deletes least recently used files beyond the disk budget (writer
 * thread: file I/O stays off the engine's thread). */
static void apply_disk_budget(ak_agents *a) {
    ak_error ge = {{0}};
    if (ak_store_gc(a->cfg.store, a->cfg.disk_budget, NULL, &ge) < 0) logf_(a, "disk budget: %s", ge.msg);
}

/* The writer thread: writes the saves next_save hands it, one at a time
 * without the lock, keeps a failed one for a retry after a backoff (or
 * gives it up), and posts each outcome; ends when stopping with nothing
 * left. */
static void *writer_main(void *arg) {
    ak_agents *a = arg;
    pthread_mutex_lock(&a->mu);
    pending *p;
    while ((p = next_save(a))) {
        if (superseded(a, p)) {   /* a newer snapshot will be written: this one must not land after it */
            ak_snapshot_free(p->snap);
            free(p);
            pthread_cond_broadcast(&a->cv);
            continue;
        }
        a->writing = 1;
        snprintf(a->writing_id, sizeof a->writing_id, "%s", p->id);
        pthread_mutex_unlock(&a->mu);
        ak_error err = {{0}};
        int rc = p->card ? ak_store_save_card(a->cfg.store, p->card, &err)
                         : ak_store_write_snapshot(a->cfg.store, p->snap, &err);
        p->attempts++;
        pthread_mutex_lock(&a->mu);
        a->writing = 0;
        int keep = 0;
        if (rc == 0) {
            a->saves_done++;
            post_result(a, p, 1, NULL);
            if (a->cfg.disk_budget) {   /* only a save grows the directory; gc reads the store's index */
                pthread_mutex_unlock(&a->mu);
                apply_disk_budget(a);
                pthread_mutex_lock(&a->mu);
            }
        } else {
            a->saves_failed++;
            keep = p->attempts < SAVE_ATTEMPTS && !superseded(a, p);
            if (keep) {
                double backoff = SAVE_BACKOFF_S;
                for (int i = 1; i < p->attempts && backoff < SAVE_BACKOFF_MAX_S; i++) backoff *= 2;
                if (backoff > SAVE_BACKOFF_MAX_S) backoff = SAVE_BACKOFF_MAX_S;
                p->due = ak_now() + backoff;
                p->next = a->retry;
                a->retry = p;
            } else {
                a->saves_abandoned++;
                post_result(a, p, 0, &err);
            }
        }
        pthread_cond_broadcast(&a->cv);
        /* only this thread takes saves off the lists, so p is still valid
         * below even when kept; the log line is written without the lock */
        pthread_mutex_unlock(&a->mu);
        if (rc < 0)
            logf_(a, "%s %s: save failed (attempt %d of %d; the previous file is kept; %s): %s", p->card ? "card" : "agent",
                  p->id, p->attempts, SAVE_ATTEMPTS, keep ? "will retry" : p->card ? "the card stays in RAM only" :
                  "the agent stays unsaved", err.msg);
        if (!keep) {
            ak_snapshot_free(p->snap);
            free(p);
        }
        pthread_mutex_lock(&a->mu);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* agent_impl.h */
int saves_start(ak_agents *a, ak_error *err) {
    const ak_agents_config *cfg = &a->cfg;
    pthread_mutex_init(&a->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);   /* retry deadlines are ak_now() times */
    pthread_cond_init(&a->cv, &ca);
    pthread_condattr_destroy(&ca);
    /* The budget holds from the start, not only after the first save: a node
     * that only loads would otherwise keep an over-budget directory (and, in
     * front of Redis, grow its read-through copies: gc sets their room). */
    if (cfg->store && cfg->disk_budget) apply_disk_budget(a);
    if (cfg->store) {
        if (pthread_create(&a->writer, NULL, writer_main, a) != 0) {
            ak_fail(err, "agents: cannot start the writer thread");
            pthread_mutex_destroy(&a->mu);
            pthread_cond_destroy(&a->cv);
            return -1;
        }
        a->writer_running = 1;
    }
    return 0;
}

/* Waits until no save of `id` (NULL: of any agent) is queued, being
 * written or waiting for a retry, so that a restore reads the newest file;
 * retries meanwhile skip their backoff (they stay bounded in number). */
void saves_wait(ak_agents *a, const char *id) {
    if (!a->writer_running) return;
    pthread_mutex_lock(&a->mu);
    a->hurry++;
    pthread_cond_broadcast(&a->cv);
    for (;;) {
        int busy = a->writing && (!id || !strcmp(a->writing_id, id));
        const pending *lists[2] = {a->head, a->retry};
        for (int k = 0; k < 2; k++)
            for (const pending *p = lists[k]; p && !busy; p = p->next) busy = !id || !strcmp(p->id, id);
        if (!busy) break;
        pthread_cond_wait(&a->cv, &a->mu);
    }
    a->hurry--;
    pthread_mutex_unlock(&a->mu);
}

/* Applies the writer's reported outcomes to the agents (engine thread). */
void saves_drain(ak_agents *a) {
    if (!a->writer_running) return;
    pthread_mutex_lock(&a->mu);
    save_result *r = a->results;
    a->results = NULL;
    pthread_mutex_unlock(&a->mu);
    /* the list is newest first: apply oldest first */
    save_result *rev = NULL;
    while (r) {
        save_result *nx = r->next;
        r->next = rev;
        rev = r;
        r = nx;
    }
    for (r = rev; r;) {
        agent *g = r->card ? NULL : agents_find(a, r->id);   /* NULL: removed since, or a card's write */
        if (g && r->ok) {
            if (r->version > g->saved) g->saved = r->version;
            if (g->saved >= g->version) g->save_failed = 0;
        } else if (g && r->version >= g->saved) {
            g->save_failed = g->saved != g->version;
            snprintf(g->save_error, sizeof g->save_error, "%s", r->error);
            g->save_code = r->code;
        }
        if (g && g->queued == r->version) g->queued = 0;   /* a later save may snapshot again */
        save_result *nx = r->next;
        free(r);
        r = nx;
    }
}

/* Saves g if its file is not current and no save of its current history is
 * already on its way: copies its cache into a snapshot (the only part done
 * on this thread) and queues the write. sync = 1 writes it here and reports
 * its error. g stays dirty until the write is confirmed. Returns 0, or -1
 * with err set. */
int agent_save(ak_agents *a, agent *g, int sync, ak_error *err) {
    if (!a->cfg.store || !agent_is_dirty(g) || !g->kv || g->ephemeral) return 0;
    if (!sync && g->queued == g->version) return 0;
    /* a pooled agent's file records the pool, not its blocks; a card's
     * likewise; positions frozen under an appended card are stored in it
     * (store.h: SEGMENTS) */
    ak_store_base base;
    memset(&base, 0, sizeof base);
    agent_segs_sync(g);
    base.n_seg = g->n_segs;
    memcpy(base.seg, g->segs, sizeof base.seg);
    ak_snapshot *snap = ak_store_snapshot_base(g->id, g->kv, g->tokens, g->n, base.n_seg > 0 ? &base : NULL,
                                               a->cfg.model->fingerprint, a->cfg.model->cfg.name, err);
    if (!snap) return -1;
    if (sync || !a->writer_running) {
        saves_wait(a, g->id); /* an older queued save must not land after this one */
        int rc = ak_store_write_snapshot(a->cfg.store, snap, err);
        ak_snapshot_free(snap);
        pthread_mutex_lock(&a->mu);
        if (rc < 0) a->saves_failed++;
        else a->saves_done++;
        pthread_mutex_unlock(&a->mu);
        if (rc < 0) {
            g->save_failed = 1;
            snprintf(g->save_error, sizeof g->save_error, "%s", err ? err->msg : "");
            g->save_code = err ? err->code : AK_ERR_IO;
            return -1;
        }
        g->saved = g->version;
        g->save_failed = 0;
        if (a->cfg.disk_budget) apply_disk_budget(a);
        return 0;
    }
    pending *p = calloc(1, sizeof *p);
    if (!p) {
        ak_snapshot_free(snap);
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    p->snap = snap;
    p->version = g->version;
    snprintf(p->id, sizeof p->id, "%s", g->id);
    saves_enqueue(a, p);
    g->queued = g->version;
    return 0;
}

void saves_stop(ak_agents *a) {
    if (!a->writer_running) return;
    pthread_mutex_lock(&a->mu);
    a->stop = 1;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->writer, NULL);
    saves_drain(a);   /* frees the list */
    a->writer_running = 0;
}

int ak_agents_flush(ak_agents *a, ak_error *err) {
    if (!a->cfg.store) return 0;
    saves_drain(a);
    for (int i = 0; i < a->n; i++) {
        ak_error e = {{0}};
        agent *g = a->v[i];
        if (agent_save(a, g, 0, &e) < 0) {   /* no snapshot (out of memory): it stays dirty, named below */
            g->save_failed = 1;
            snprintf(g->save_error, sizeof g->save_error, "%s", e.msg);
            g->save_code = e.code;
        }
    }
    saves_wait(a, NULL);
    saves_drain(a);
    int bad = 0, code = AK_ERR_IO;
    char names[300] = "";
    size_t nl = 0;
    const char *last = "";
    for (int i = 0; i < a->n; i++) {
        agent *g = a->v[i];
        if (g->ephemeral || !agent_is_dirty(g)) continue;
        if (bad++ < 8 && nl < sizeof names) {
            int w = snprintf(names + nl, sizeof names - nl, "%s%s", nl ? ", " : "", g->id);
            if (w > 0) nl += (size_t)w;
        }
        if (g->save_error[0]) {
            last = g->save_error;
            code = g->save_code ? g->save_code : AK_ERR_IO;
        }
    }
    if (!bad) return 0;
    return ak_failc(err, code, "%d agent%s could not be saved: %s%s (last error: %s)", bad, bad > 1 ? "s" : "",
                    names, bad > 8 ? ", ..." : "", last[0] ? last : "unknown");
}

int ak_agents_unsaved(ak_agents *a) {
    saves_drain(a);
    int n = 0;
    for (int i = 0; i < a->n; i++) n += a->cfg.store && !a->v[i]->ephemeral && agent_is_dirty(a->v[i]);
    return n;
}

void ak_agents_save_stats(ak_agents *a, ak_save_stats *st) {
    memset(st, 0, sizeof *st);
    st->unsaved = ak_agents_unsaved(a);
    st->disk_budget = a->cfg.disk_budget;
    pthread_mutex_lock(&a->mu);
    st->saves = a->saves_done;
    st->failures = a->saves_failed;
    st->abandoned = a->saves_abandoned;
    for (const pending *p = a->retry; p; p = p->next) st->retrying++;
    pthread_mutex_unlock(&a->mu);
}
