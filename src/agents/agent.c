/* agent.c - see agent.h
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
 * engine thread applies to its agents (drain_results).
 */
#include "agents/agent.h"
#include "engine/reuse.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SAVE_ATTEMPTS 6
#define SAVE_BACKOFF_S 0.25
#define SAVE_BACKOFF_MAX_S 30.0

#include "agents/agent_impl.h"
#include "agents/memories.h"
#include "engine/attnstats.h"
#include "agents/bitalloc.h"
#include "store/cards.h"
#include "kv/prefix.h"

const char *ak_match_name(ak_match m) {
    static const char *names[] = {"new", "exact", "extend", "diverge"};
    return (unsigned)m < 4 ? names[m] : "?";
}

const char *ak_tier_name(ak_tier t) {
    static const char *names[] = {"hot", "warm", "cold"};
    return (unsigned)t < 3 ? names[t] : "?";
}

int ak_save_policy_parse(const char *s, ak_save_policy *out) {
    if (!strcmp(s, "turn")) *out = AK_SAVE_EVERY_TURN;
    else if (!strcmp(s, "evict")) *out = AK_SAVE_ON_EVICT;
    else if (!strcmp(s, "shutdown")) *out = AK_SAVE_ON_SHUTDOWN;
    else return -1;
    return 0;
}


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
static void enqueue_save(ak_agents *a, pending *p) {
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

#define find agents_find

/* Waits until no save of `id` (NULL: of any agent) is queued, being
 * written or waiting for a retry, so that a restore reads the newest file;
 * retries meanwhile skip their backoff (they stay bounded in number). */
static void wait_saved(ak_agents *a, const char *id) {
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
static void drain_results(ak_agents *a) {
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
        agent *g = r->card ? NULL : find(a, r->id);   /* NULL: removed since, or a card's write */
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

ak_agents *ak_agents_new(const ak_agents_config *cfg, ak_error *err) {
    if (!cfg->model || !cfg->pool || cfg->n_ctx <= 0) {
        ak_failc(err, AK_ERR_INVALID, "agents: model, pool and a positive context are required");
        return NULL;
    }
    ak_agents *a = ak_calloc(1, sizeof *a, err);
    if (!a) return NULL;
    a->cfg = *cfg;
    ak_block_pool_set_model(cfg->pool, cfg->model->fingerprint);   /* salts the content index's hashes */
    /* an agent's sliding-window layers keep only the blocks their window
     * still sees (kvcache.h LAYER GROUPS): a long agent costs a window of
     * positions on those layers */
    ak_block_pool_set_window_release(cfg->pool, 1);
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
            free(a);
            return NULL;
        }
        a->writer_running = 1;
    }
    return a;
}

static void free_agent(agent *g) {
    if (!g) return;
    ak_kv_free(g->kv);
    free(g->tokens);
    free(g);
}

static int is_dirty(const agent *g) { return g->saved != g->version; }

/* Brings g's base bookkeeping in line with its sequence (when hot): its
 * segment descriptors are the first ak_kv_segments of them, with kvcache's
 * lengths (a truncation shortens or drops segments); pool / card name the
 * first segment when it is a pool's or a card's; impure when a card or
 * positions frozen under one are held (agent.h). */
static void segs_sync(agent *g) {
    if (!g->kv) return;
    int lens[AK_KV_MAX_SEGMENTS], ns = ak_kv_segments(g->kv, lens);
    if (ns > g->n_segs) ns = g->n_segs;   /* never: every segment is recorded where it is made */
    g->n_segs = ns;
    g->impure = 0;
    for (int k = 0; k < ns; k++) {
        g->segs[k].len = lens[k];
        if (g->segs[k].kind != AK_SEG_POOL) g->impure = 1;
    }
    g->pool[0] = g->pool_hash[0] = g->card[0] = g->card_hash[0] = 0;
    if (ns && g->segs[0].kind == AK_SEG_POOL) {
        snprintf(g->pool, sizeof g->pool, "%s", g->segs[0].id);
        snprintf(g->pool_hash, sizeof g->pool_hash, "%s", g->segs[0].hash);
    } else if (ns && g->segs[0].kind == AK_SEG_CARD) {
        snprintf(g->card, sizeof g->card, "%s", g->segs[0].id);
        snprintf(g->card_hash, sizeof g->card_hash, "%s", g->segs[0].hash);
    }
}

/* Sets g's segment k to a pool's or a card's (id, hash; its length is the
 * sequence's). */
static void seg_named(agent *g, int k, int kind, const char *id, const char *hash) {
    memset(&g->segs[k], 0, sizeof g->segs[k]);
    g->segs[k].kind = kind;
    snprintf(g->segs[k].id, sizeof g->segs[k].id, "%s", id);
    snprintf(g->segs[k].hash, sizeof g->segs[k].hash, "%s", hash);
}

/* Saves g if its file is not current and no save of its current history is
 * already on its way: copies its cache into a snapshot (the only part done
 * on this thread) and queues the write. sync = 1 writes it here and reports
 * its error. g stays dirty until the write is confirmed. Returns 0, or -1
 * with err set. */
static int save_agent(ak_agents *a, agent *g, int sync, ak_error *err) {
    if (!a->cfg.store || !is_dirty(g) || !g->kv || g->ephemeral) return 0;
    if (!sync && g->queued == g->version) return 0;
    /* a pooled agent's file records the pool, not its blocks; a card's
     * likewise; positions frozen under an appended card are stored in it
     * (store.h: SEGMENTS) */
    ak_store_base base;
    memset(&base, 0, sizeof base);
    segs_sync(g);
    base.n_seg = g->n_segs;
    memcpy(base.seg, g->segs, sizeof base.seg);
    ak_snapshot *snap = ak_store_snapshot_base(g->id, g->kv, g->tokens, g->n, base.n_seg > 0 ? &base : NULL,
                                               a->cfg.model->fingerprint, a->cfg.model->cfg.name, err);
    if (!snap) return -1;
    if (sync || !a->writer_running) {
        wait_saved(a, g->id); /* an older queued save must not land after this one */
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
    enqueue_save(a, p);
    g->queued = g->version;
    return 0;
}

static void stop_writer(ak_agents *a) {
    if (!a->writer_running) return;
    pthread_mutex_lock(&a->mu);
    a->stop = 1;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->writer, NULL);
    drain_results(a);   /* frees the list */
    a->writer_running = 0;
}

void ak_agents_free(ak_agents *a) {
    if (!a) return;
    drain_results(a);
    for (int i = 0; i < a->n; i++) {
        ak_error err = {{0}};
        if (save_agent(a, a->v[i], 0, &err) < 0) logf_(a, "agent %s: save at shutdown failed: %s", a->v[i]->id, err.msg);
    }
    stop_writer(a); /* writes everything queued (retries included, without backoff), then ends */
    for (int i = 0; i < a->n; i++) {
        agent *g = a->v[i];
        if (is_dirty(g) && !g->ephemeral && a->cfg.store)
            logf_(a, "agent %s: NOT saved (%d tokens lost): %s", g->id, g->n,
                  g->save_error[0] ? g->save_error : "no save succeeded");
        free_agent(g);
    }
    pools_free_all(a);
    mems_free_all(a);
    for (int i = 0; i < a->n_cards; i++) ak_card_free(a->cards[i]);
    free(a->cards);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a->v);
    free(a);
}

int ak_agents_flush(ak_agents *a, ak_error *err) {
    if (!a->cfg.store) return 0;
    drain_results(a);
    for (int i = 0; i < a->n; i++) {
        ak_error e = {{0}};
        agent *g = a->v[i];
        if (save_agent(a, g, 0, &e) < 0) {   /* no snapshot (out of memory): it stays dirty, named below */
            g->save_failed = 1;
            snprintf(g->save_error, sizeof g->save_error, "%s", e.msg);
            g->save_code = e.code;
        }
    }
    wait_saved(a, NULL);
    drain_results(a);
    int bad = 0, code = AK_ERR_IO;
    char names[300] = "";
    size_t nl = 0;
    const char *last = "";
    for (int i = 0; i < a->n; i++) {
        agent *g = a->v[i];
        if (g->ephemeral || !is_dirty(g)) continue;
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
    drain_results(a);
    int n = 0;
    for (int i = 0; i < a->n; i++) n += a->cfg.store && !a->v[i]->ephemeral && is_dirty(a->v[i]);
    return n;
}

void ak_agents_save_stats(ak_agents *a, ak_save_stats *st) {
    memset(st, 0, sizeof *st);
    st->unsaved = ak_agents_unsaved(a);
    pthread_mutex_lock(&a->mu);
    st->saves = a->saves_done;
    st->failures = a->saves_failed;
    st->abandoned = a->saves_abandoned;
    for (const pending *p = a->retry; p; p = p->next) st->retrying++;
    pthread_mutex_unlock(&a->mu);
}

static void touch(ak_agents *a, agent *g) {
    g->last_use = ++a->clock;
    g->last_unix = (int64_t)time(NULL);
}

agent *agents_find(const ak_agents *a, const char *id) {
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->v[i]->id, id)) return a->v[i];
    return NULL;
}

static agent *create(ak_agents *a, const char *id, ak_error *err) {
    if (a->n == a->cap) {
        int nc = a->cap ? a->cap * 2 : 8;
        agent **nv = realloc(a->v, sizeof(agent *) * nc);
        if (!nv) { ak_failc(err, AK_ERR_NOMEM, "out of memory"); return NULL; }
        a->v = nv;
        a->cap = nc;
    }
    agent *g = ak_calloc(1, sizeof *g, err);
    if (!g) return NULL;
    snprintf(g->id, sizeof g->id, "%s", id);
    a->v[a->n++] = g;
    return g;
}

static int set_history(agent *g, const int32_t *tokens, int n, ak_error *err) {
    if (n > g->cap) {
        int nc = n < 64 ? 64 : n;
        int32_t *nt = realloc(g->tokens, sizeof(int32_t) * nc);
        if (!nt) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
        g->tokens = nt;
        g->cap = nc;
    }
    if (n > 0 && tokens != g->tokens) memmove(g->tokens, tokens, sizeof(int32_t) * n);
    g->n = n;
    return 0;
}

/* Bytes free in the pool's budget, less what restores in flight were
 * promised (SIZE_MAX when there is no budget). */
static size_t pool_free(ak_agents *a) {
    ak_block_pool_stats st;
    ak_block_pool_get_stats(a->cfg.pool, &st);
    if (!st.budget) return SIZE_MAX;
    size_t taken = st.used + a->reserved;
    return taken >= st.budget ? 0 : st.budget - taken;
}

/* Moves one agent out of RAM: writes it if its file is not current, frees
 * its blocks. Without a store its memory is simply dropped (cold next time). */
static int evict(ak_agents *a, agent *g, ak_error *err) {
    if (a->cfg.store && is_dirty(g) && save_agent(a, g, 0, err) < 0) return -1;
    if (!a->cfg.store || g->ephemeral) {
        g->n = 0;
        g->pool[0] = 0;
        g->card[0] = 0;
        g->impure = 0;
        g->n_segs = 0;
    }
    ak_kv_free(g->kv);
    g->kv = NULL;
    g->ahead = 0;
    logf_(a, "agent %s: evicted to %s (%d tokens)", g->id, a->cfg.store ? "disk" : "nothing", g->n);
    return 0;
}

/* Makes room for `need` more bytes by evicting least-recently-used agents
 * other than `keep` that are not in a turn. Returns the number evicted, or -1
 * with err set when even evicting every idle agent cannot make room. */
int agents_ensure_room(ak_agents *a, size_t need, const agent *keep, ak_error *err) {
    int evicted = 0;
    if (need == 0) return 0;
    while (pool_free(a) < need) {
        agent *lru = NULL;
        for (int i = 0; i < a->n; i++) {
            agent *g = a->v[i];
            if (g == keep || !g->kv || g->in_turn) continue;
            if (!lru || g->last_use < lru->last_use) lru = g;
        }
        if (!lru && (pools_evict_one(a) || mems_evict_one(a))) continue;
        if (!lru) {
            ak_block_pool_stats st;
            ak_block_pool_get_stats(a->cfg.pool, &st);
            return ak_failc(err, AK_ERR_KV_BUDGET, "KV budget exhausted: %zu more bytes needed, %zu of %zu in use (%zu promised to "
                           "restores) and no idle agent to evict", need, st.used, st.budget, a->reserved);
        }
        if (evict(a, lru, err) < 0) return -1;
        evicted++;
    }
    return evicted;
}

/* Bytes of an agent's nb spans in formats fk/fv once its window moved on:
 * every span's block of the global group (of the only one with one
 * group); of the local group (kvcache.h LAYER GROUPS) those a window of W
 * positions can touch, ceil(W / T) + 1 at most, for it releases the rest
 * after each pass. */
static size_t spans_bytes(const ak_agents *a, int nb, ak_kv_format fk, ak_kv_format fv) {
    ak_block_pool *p = a->cfg.pool;
    if (ak_block_pool_groups(p) < 2) return (size_t)nb * ak_block_pool_block_bytes(p, fk, fv);
    int T = ak_block_pool_block_tokens(p), cap = (ak_block_pool_spec(p)->window + T - 1) / T + 1;
    return (size_t)nb * ak_block_pool_group_bytes(p, 0, fk, fv) +
           (size_t)(nb < cap ? nb : cap) * ak_block_pool_group_bytes(p, 1, fk, fv);
}

/* Bytes of the blocks kv lacks to hold n_pos positions. */
static size_t kv_grow_bytes(const ak_agents *a, const ak_kv *kv, int n_pos) {
    /* per layer group (kvcache.h LAYER GROUPS): the global group (every
     * layer with one group) holds a block per span; the local group none
     * of the spans it released, and may hold every other one until the
     * pass that writes them ends (an upper bound: a prefill's pass releases
     * only after it) */
    ak_kv_format fk = ak_kv_format_k(kv), fv = ak_kv_format_v(kv);
    int want = ak_kv_blocks_for(kv, n_pos);
    size_t bytes = 0;
    for (int grp = 0; grp < ak_kv_groups(kv); grp++) {
        int w = grp ? want - ak_kv_blocks_for(kv, ak_kv_window_first(kv)) : want;
        int have = ak_kv_group_blocks(kv, grp);
        if (w > have) bytes += (size_t)(w - have) * ak_block_pool_group_bytes(a->cfg.pool, grp, fk, fv);
    }
    return bytes;
}

static size_t bytes_for(const ak_agents *a, const agent *g, int n_pos) {
    return g->kv ? kv_grow_bytes(a, g->kv, n_pos) : ak_agents_bytes_for(a, n_pos);
}

/* What a restore links instead of reading (store.h: prelink): for each
 * segment of the file's base, the pool or card it names, held by a
 * sequence (a fork of the pool's, the card's blocks with its keys at the
 * segment's position) with its tokens, so that a restore on another thread
 * needs nothing else of the agents. */
typedef struct {
    int kind, start;                     /* ak_seg_kind; the segment's first position */
    char id[AK_AGENT_ID_MAX + 1];
    char hash[17];
    ak_kv *kv;                           /* NULL: own positions, or not available */
    int32_t *tokens;
    int n;
} prelink_seg;

typedef struct prelink_ctx {
    int n_seg;
    prelink_seg seg[AK_KV_MAX_SEGMENTS];
    int no_index;                        /* link nothing from the content index */
    int impure;                          /* the base holds a card (or positions frozen under one):
                                            nothing is linked or published */
} prelink_ctx;

static void prelink_clear(prelink_ctx *pc) {
    for (int k = 0; k < pc->n_seg; k++) {
        ak_kv_free(pc->seg[k].kv);
        free(pc->seg[k].tokens);
    }
    memset(pc, 0, sizeof *pc);
}

static const ak_card *cards_resolve(ak_agents *a, const char *id, ak_error *err);
static const ak_card *cards_find(const ak_agents *a, const char *id);

/* Makes the empty kv hold card c's blocks at positions [0, n_tokens) with
 * its keys as they are when they start at position `at`: the card's own
 * when at is its offset, else those of the card moved there (cards.h:
 * ak_card_shift; deterministic, so a restore rebuilds the same bits).
 * Copied on threads (NULL: here). Returns 0, or -1 with err set. */
static int card_at(const ak_agents *a, const ak_card *c, int at, ak_kv *kv, ak_pool *threads, ak_error *err) {
    if (c->pos_offset == at) return ak_card_attach_on(c, kv, threads, err);
    ak_card *s = ak_card_shift(c, a->cfg.model, at, err);
    if (!s) return -1;
    int rc = ak_card_attach_on(s, kv, threads, err);
    ak_card_free(s);
    return rc;
}

/* Readies pc for a file whose index entry is e: resolves the pool and the
 * cards of its base (loading them if need be; a card's blocks moved to
 * where its segment starts). One that cannot be had leaves its segment
 * without a sequence: the load is then a miss that says why. */
static void prelink_setup(ak_agents *a, const ak_store_entry *e, prelink_ctx *pc) {
    memset(pc, 0, sizeof *pc);
    pc->no_index = a->cfg.no_prefix_sharing;
    pc->n_seg = e->base.n_seg;
    for (int k = 0, at = 0; k < pc->n_seg; at += e->base.seg[k].len, k++) {
        const ak_store_seg *g = &e->base.seg[k];
        prelink_seg *r = &pc->seg[k];
        ak_error pe = {{0}};
        r->kind = g->kind;
        r->start = at;
        if (g->kind != AK_SEG_POOL) pc->impure = 1;   /* whatever happens next: nothing is linked */
        if (g->kind == AK_SEG_OWN) continue;
        if (g->kind == AK_SEG_CARD) {
            const ak_card *c = cards_resolve(a, g->id, &pe);
            ak_kv *kv = c ? ak_kv_new(a->cfg.pool, a->cfg.fk, a->cfg.fv, a->cfg.n_ctx, &pe) : NULL;
            if (!kv || card_at(a, c, at, kv, NULL, &pe) < 0 || !(r->tokens = malloc(sizeof(int32_t) * (size_t)c->n_tokens))) {
                logf_(a, "agent %s: its card %s: %s", e->id, g->id, pe.msg[0] ? pe.msg : "out of memory");
                ak_kv_free(kv);
                continue;   /* a miss: the prelink finds no card */
            }
            r->kv = kv;
            memcpy(r->tokens, c->tokens, sizeof(int32_t) * (size_t)c->n_tokens);
            r->n = c->n_tokens;
            snprintf(r->id, sizeof r->id, "%s", c->id);
            snprintf(r->hash, sizeof r->hash, "%s", c->hash);
            continue;
        }
        pool_rec *p = pools_resolve(a, g->id, &pe);
        if (!p) { logf_(a, "agent %s: its pool: %s", e->id, pe.msg); continue; }
        if (!(r->kv = ak_kv_fork(p->kv, &pe)) || !(r->tokens = malloc(sizeof(int32_t) * (size_t)p->n))) {
            ak_kv_free(r->kv);
            r->kv = NULL;
            continue;
        }
        memcpy(r->tokens, p->tokens, sizeof(int32_t) * (size_t)p->n);
        r->n = p->n;
        snprintf(r->id, sizeof r->id, "%s", p->id);
        snprintf(r->hash, sizeof r->hash, "%s", p->hash);
    }
}

/* store.h's prelink: the file's base segment by segment (the same pool or
 * card, unchanged, at the same position, the file's tokens there equal to
 * its tokens; own positions as fresh blocks the load fills), then the
 * content index when the base holds no card. */
static int prelink(void *ud, const ak_store_base *base, const int32_t *tokens, int n, ak_kv *kv, ak_error *err) {
    prelink_ctx *pc = ud;
    int T = ak_block_pool_block_tokens(ak_kv_pool(kv));
    for (int k = 0, at = 0; k < base->n_seg; at += base->seg[k].len, k++) {
        const ak_store_seg *g = &base->seg[k];
        const prelink_seg *r = k < pc->n_seg ? &pc->seg[k] : NULL;
        const char *what = g->kind == AK_SEG_POOL ? "pool" : "card";
        if (g->kind == AK_SEG_OWN) {
            if (ak_kv_append_empty(kv, g->len, err) < 0) return -1;
            continue;
        }
        if (!r || !r->kv || r->kind != g->kind || r->start != at || strcmp(g->id, r->id))
            return ak_failc(err, AK_ERR_NOT_FOUND, "the agent's cache holds %s %s at position %d, which is not available",
                            what, g->id, at);
        if (strcmp(g->hash, r->hash) || g->len > r->n || at + g->len > n ||
            memcmp(tokens + at, r->tokens, sizeof(int32_t) * (size_t)g->len))
            return ak_failc(err, AK_ERR_STALE, "%s %s changed since the agent's cache was saved", what, g->id);
        if (g->kind == AK_SEG_POOL) {
            if (ak_kv_attach_base(kv, r->kv, g->len, err) < 0) return -1;
            continue;
        }
        int nb = (g->len + T - 1) / T;
        ak_block **v = ak_calloc((size_t)nb, sizeof *v, err);
        if (!v) return -1;
        for (int i = 0; i < nb; i++) v[i] = ak_kv_span(r->kv, i, NULL, NULL);
        int rc = ak_kv_append_blocks(kv, v, nb, g->len, err);
        free(v);
        if (rc < 0) return -1;
    }
    /* with sliding-window layers the file may be version 7, read whole: nothing linked into it */
    if (!pc->no_index && !pc->impure && ak_kv_groups(kv) == 1) ak_prefix_link(kv, tokens, n);
    return 0;
}

/* The sequence a restore of the file e fills: the agents' formats, or the
 * file's for a file with a base (a pool's formats, or those the agent had
 * when it appended a card). */
static ak_kv *restore_target(ak_agents *a, const ak_store_entry *e, ak_error *err) {
    int based = e->readable && e->base.n_seg > 0;
    return ak_kv_new(a->cfg.pool, based ? e->fk : a->cfg.fk, based ? e->fv : a->cfg.fv, a->cfg.n_ctx, err);
}

/* Bytes a restore of e adds: its own blocks, those of its own segments
 * included (its pool's are shared; its cards' are made by the prelink's
 * setup), and one to grow into; with sliding-window layers the local
 * group's only as spans_bytes counts them (a version 7 file holds no
 * more). */
static size_t restore_bytes(const ak_agents *a, const ak_store_entry *e) {
    int n = e->readable ? e->n_tokens : 0;
    if (n > a->cfg.n_ctx) n = a->cfg.n_ctx;
    int T = ak_block_pool_block_tokens(a->cfg.pool), own = n - e->base.base_len, blocks = 0;
    for (int k = 0; e->readable && k < e->base.n_seg; k++)
        if (e->base.seg[k].kind == AK_SEG_OWN) blocks += (e->base.seg[k].len + T - 1) / T;
    if (own > 0) blocks += (own + T - 1) / T + 1;
    if (!blocks) return 0;
    ak_kv_format fk = e->base.n_seg ? e->fk : a->cfg.fk, fv = e->base.n_seg ? e->fv : a->cfg.fv;
    return spans_bytes(a, blocks, fk, fv);
}

/* After a hit: g's history is the file's, its base the file's segments
 * (the prelink checked each pool's and card's hash). */
static void restored(ak_agents *a, agent *g, const ak_store_load_info *info) {
    g->n_segs = info->base.n_seg;
    memcpy(g->segs, info->base.seg, sizeof g->segs);
    segs_sync(g);
    g->pub_spans = ak_kv_span_count(g->kv);   /* published by the restore */
    g->version = g->saved = ++a->next_version;
    g->save_failed = 0;
    int nb = ak_kv_blocks_for(g->kv, info->linked);
    a->linked_blocks += (uint64_t)nb;
    a->linked_bytes += (uint64_t)nb * ak_block_pool_block_bytes(a->cfg.pool, ak_kv_format_k(g->kv), ak_kv_format_v(g->kv));
}

/* Brings g's cache into RAM from the store if there is a usable file. */
static void restore(ak_agents *a, agent *g, ak_turn *t, ak_error *err) {
    ak_store_entry e;
    ak_error ie = {{0}};
    wait_saved(a, g->id); /* its last save may still be on its way to disk */
    /* the index knows the files (no I/O); an id it lacks may have a file
     * another process wrote since the store was opened: look once */
    if (ak_store_lookup(a->cfg.store, g->id, &e) != 0) {
        int rc = ak_store_inspect(a->cfg.store, g->id, &e, NULL, &ie);
        /* a store that cannot be asked (Redis away) is said, not taken for "no file" */
        if (rc < 0) logf_(a, "agent %s: cache unreadable, recomputing: %s", g->id, ie.msg);
        if (rc != 0) return;
    }
    ak_kv *kv = restore_target(a, &e, &ie);
    if (!kv) { logf_(a, "agent %s: cannot restore: %s", g->id, ie.msg); return; }
    prelink_ctx pc;
    prelink_setup(a, &e, &pc);
    int ev = agents_ensure_room(a, restore_bytes(a, &e), g, &ie);
    if (ev < 0) {
        logf_(a, "agent %s: cannot restore: %s", g->id, ie.msg);
        prelink_clear(&pc);
        ak_kv_free(kv);
        return;
    }
    t->evicted += ev;
    ak_store_load_info info;
    ak_store_status st = ak_store_load_linked(a->cfg.store, g->id, a->cfg.model->fingerprint,
                                              a->cfg.model->cfg.vocab, kv, prelink, &pc, &info, &ie);
    int impure = pc.impure;
    prelink_clear(&pc);
    if (st == AK_STORE_HIT && set_history(g, info.tokens, info.n_tokens, err) == 0) {
        int next = 0;
        if (!a->cfg.no_prefix_sharing && !impure)   /* the next restore of this prefix links it */
            ak_prefix_publish(kv, info.tokens, info.n_tokens, &next);
        ak_kv_free(g->kv);
        g->kv = kv;
        kv = NULL;
        t->tier = AK_TIER_WARM;
        t->restore_ms = info.total_ms;
        t->restore_bytes = info.bytes_read;
        t->shared = info.linked;
        restored(a, g, &info);
    } else if (st == AK_STORE_HIT) {
        g->n = 0;
    } else if (st != AK_STORE_ABSENT) {
        logf_(a, "agent %s: cache %s, recomputing: %s", g->id, ak_store_status_name(st), ie.msg);
    }
    free(info.tokens);
    ak_kv_free(kv);
}

static int id_ok(const char *id, int flags) {
    if (flags & AK_AGENT_EPHEMERAL) return id[0] == '.' && id[1] && ak_agent_id_valid(id + 1);
    return ak_agent_id_valid(id);
}

/* Makes g's cache start with pool p's blocks, unless it already does:
 * whatever it held is dropped (its formats become the pool's). Returns 0,
 * or -1 with err set (g is then emptied). */
static int attach_pool(ak_agents *a, agent *g, pool_rec *p, ak_error *err) {
    int lens[AK_KV_MAX_SEGMENTS];   /* its first segment is the pool's whole (cards may follow) */
    segs_sync(g);
    if (!strcmp(g->pool, p->id) && !strcmp(g->pool_hash, p->hash) && ak_kv_segments(g->kv, lens) > 0 &&
        lens[0] == p->n && ak_kv_format_k(g->kv) == p->fk && ak_kv_format_v(g->kv) == p->fv)
        return 0;
    ak_kv *kv = ak_kv_new(a->cfg.pool, p->fk, p->fv, a->cfg.n_ctx, err);
    if (!kv || ak_kv_attach_base(kv, p->kv, p->n, err) < 0 || set_history(g, p->tokens, p->n, err) < 0) {
        ak_kv_free(kv);
        ak_kv_truncate(g->kv, 0);
        g->n = 0;
        segs_sync(g);
        return -1;
    }
    ak_kv_free(g->kv);
    g->kv = kv;
    seg_named(g, 0, AK_SEG_POOL, p->id, p->hash);
    g->n_segs = 1;
    segs_sync(g);
    g->pub_spans = 0;
    g->version = ++a->next_version;
    a->linked_blocks += (uint64_t)ak_kv_n_blocks(kv);
    a->linked_bytes += ak_kv_bytes(kv);
    return 0;
}

int ak_agent_open(ak_agents *a, const char *id, int flags, const int32_t *tokens, int n, int n_reserve,
                  size_t extra, ak_kv **kv, ak_turn *t, ak_error *err) {
    return ak_agent_open_pool(a, id, flags, NULL, tokens, n, n_reserve, extra, kv, t, err);
}

/* ak_agent_open_pool, ak_agent_open_memories: memories (k of them, at
 * positions at[], len[] tokens each; k = 0: none) cap what is reused. */
static int open_turn(ak_agents *a, const char *id, int flags, const char *pool_id, const int32_t *tokens, int n,
                     int n_reserve, size_t extra, const int *at, const int *len, int k, ak_kv **kv, ak_turn *t,
                     ak_error *err);

int ak_agent_open_pool(ak_agents *a, const char *id, int flags, const char *pool_id, const int32_t *tokens, int n,
                       int n_reserve, size_t extra, ak_kv **kv, ak_turn *t, ak_error *err) {
    return open_turn(a, id, flags, pool_id, tokens, n, n_reserve, extra, NULL, NULL, 0, kv, t, err);
}

int ak_agent_open_memories(ak_agents *a, const char *id, int flags, const char *pool_id, const int32_t *tokens, int n,
                           int n_reserve, size_t extra, const int *at, const int *len, int k, ak_kv **kv, ak_turn *t,
                           ak_error *err) {
    for (int i = 0; i < k; i++)
        if (at[i] < (i ? at[i - 1] + len[i - 1] : 0) || len[i] < 1 || at[i] + len[i] > n)
            return ak_failc(err, AK_ERR_INVALID, "agent %s: memory %d at %d (%d tokens) is not inside the prompt after "
                            "the one before it", id, i, at[i], len[i]);
    return open_turn(a, id, flags, pool_id, tokens, n, n_reserve, extra, at, len, k, kv, t, err);
}

static int open_turn(ak_agents *a, const char *id, int flags, const char *pool_id, const int32_t *tokens, int n,
                     int n_reserve, size_t extra, const int *at, const int *len, int k, ak_kv **kv, ak_turn *t,
                     ak_error *err) {
    memset(t, 0, sizeof *t);
    *kv = NULL;
    drain_results(a);
    if (!id_ok(id, flags))
        return ak_failc(err, AK_ERR_INVALID, "invalid agent id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    if (n < 1) return ak_failc(err, AK_ERR_INVALID, "agent %s: empty prompt", id);
    if (n > a->cfg.n_ctx) return ak_failc(err, AK_ERR_INVALID, "agent %s: prompt of %d tokens exceeds the context of %d", id, n, a->cfg.n_ctx);
    if (n_reserve < n) n_reserve = n;
    if (n_reserve > a->cfg.n_ctx) n_reserve = a->cfg.n_ctx;
    agent *g = find(a, id);
    if (g && g->restoring) return ak_failc(err, AK_ERR_BUSY, "agent %s: a restore is in flight", id);
    if (g && g->in_turn) return ak_failc(err, AK_ERR_BUSY, "agent %s: a turn is already in progress", id);
    pool_rec *p = NULL;
    if (pool_id && pool_id[0]) {
        if (!ak_pool_id_valid(pool_id)) return ak_failc(err, AK_ERR_INVALID, "invalid pool id");
        if (!(p = pools_resolve(a, pool_id, err))) return -1;
        if (n < p->n || memcmp(tokens, p->tokens, sizeof(int32_t) * (size_t)p->n))
            return ak_failc(err, AK_ERR_INVALID, "agent %s: the prompt does not start with pool %s's %d tokens", id,
                            pool_id, p->n);
    }
    if (!g && !(g = create(a, id, err))) return -1;
    g->ephemeral = (flags & AK_AGENT_EPHEMERAL) != 0;
    touch(a, g);
    t->tier = AK_TIER_HOT;
    if (g->ahead) {   /* cleared only when the open succeeds: a retry reports it too */
        t->tier = AK_TIER_WARM;
        t->restore_ms = g->ahead_ms;
        t->restore_bytes = g->ahead_bytes;
        t->restored_ahead = 1;
    }
    int fresh = !g->kv;   /* a failed open must leave it cold, not hot and empty */
    if (fresh) {
        t->tier = AK_TIER_COLD;
        g->n = 0;
        g->kv = ak_kv_new(a->cfg.pool, a->cfg.fk, a->cfg.fv, a->cfg.n_ctx, err);
        if (!g->kv) return -1;
        if (a->cfg.store && !g->ephemeral) restore(a, g, t, err);
    }
    if (p) {
        uint64_t v0 = g->version;
        if (attach_pool(a, g, p, err) < 0) {
            if (fresh) { ak_kv_free(g->kv); g->kv = NULL; }
            return -1;
        }
        if (g->version != v0) {   /* newly attached: the pool's tokens are reused, not computed */
            t->shared = p->n;
            if (t->tier == AK_TIER_HOT) t->tier = AK_TIER_COLD;
        }
    }
    /* token-level match against what the cache holds */
    int common = 0;
    while (common < g->n && common < n && g->tokens[common] == tokens[common]) common++;
    if (g->n == 0) t->match = AK_MATCH_NEW;
    else if (common == g->n && common == n) t->match = AK_MATCH_EXACT;
    else if (common == g->n) t->match = AK_MATCH_EXTEND;
    else t->match = AK_MATCH_DIVERGE;
    if (t->match == AK_MATCH_NEW) t->tier = AK_TIER_COLD;
    /* the last prompt token is always computed: its logits start the turn */
    int keep = common < n ? common : n - 1;
    /* a memory is placed whole or not at all: a match ending inside one
     * stops where it starts (the history up to there is kept) */
    for (int i = 0; i < k; i++)
        if (keep > at[i] && keep < at[i] + len[i]) keep = at[i];
    if (k > 0 && (flags & AK_AGENT_RECOMPUTE_MEMORIES) && keep > at[0]) keep = at[0];
    /* a prompt that diverges before what the sliding-window layers still
     * hold (kvcache.h LAYER GROUPS: they released the blocks its next
     * token would see) is computed from the start, or from the end of its
     * pool, attached again whole (the agent dropped its references to the
     * pool's local blocks, the pool keeps them) */
    if (keep > 0 && ak_kv_window_check(g->kv, keep, NULL) < 0) {
        keep = 0;
        if (p && n > p->n) {
            ak_kv_truncate(g->kv, 0);
            g->n = 0;
            segs_sync(g);
            if (attach_pool(a, g, p, err) < 0) {
                if (fresh) { ak_kv_free(g->kv); g->kv = NULL; }
                return -1;
            }
            keep = p->n;
            t->shared = p->n;
        }
    }
    ak_kv_truncate(g->kv, keep);
    if (keep < g->n) g->n = keep;
    segs_sync(g);   /* truncated into (or out of) its pool or cards */
    int nsp = ak_kv_span_count(g->kv);
    if (g->pub_spans > nsp) g->pub_spans = nsp;
    /* whole blocks of the prompt that someone computed already: linked */
    int blocks0 = ak_kv_n_blocks(g->kv);
    /* blocks linked from the content index stop before the first memory:
     * what follows it is the placed chunk's, not a prefill's */
    int link_to = k > 0 && at[0] < n - 1 ? at[0] : n - 1;
    int linked = a->cfg.no_prefix_sharing || g->impure ? 0 : ak_prefix_link(g->kv, tokens, link_to);
    if (linked > 0) {
        if (set_history(g, tokens, keep + linked, err) < 0) {
            ak_kv_truncate(g->kv, keep);
            return -1;
        }
        int nb = ak_kv_n_blocks(g->kv) - blocks0;
        a->linked_blocks += (uint64_t)nb;
        a->linked_bytes += (uint64_t)nb * ak_block_pool_block_bytes(a->cfg.pool, ak_kv_format_k(g->kv), ak_kv_format_v(g->kv));
        g->version = ++a->next_version;
        keep += linked;
        t->shared += linked;
    }
    int ev = agents_ensure_room(a, bytes_for(a, g, n_reserve) + extra, g, err);
    if (ev < 0) {
        if (fresh) {
            /* its file (if any) is still there: the next open restores it */
            ak_kv_free(g->kv);
            g->kv = NULL;
            g->n = 0;
            g->pool[0] = 0;
            g->n_segs = 0;
        }
        return -1;
    }
    t->evicted += ev;
    g->in_turn = 1;
    g->ahead = 0;
    t->reused = keep;
    t->prefilled = n - keep;
    *kv = g->kv;
    return 0;
}

/* Enters the blocks g completed since the last call in the content index
 * (every agent's cache is computed by forward passes of its own tokens
 * today, so every one may publish: prefix.h). */
static void publish(const ak_agents *a, agent *g) {
    if (!a->cfg.no_prefix_sharing && !g->impure) ak_prefix_publish(g->kv, g->tokens, g->n, &g->pub_spans);
}

int ak_agent_commit(ak_agents *a, const char *id, const int32_t *tokens, int n, ak_error *err) {
    agent *g = find(a, id);
    if (!g || !g->kv || !g->in_turn) return ak_failc(err, AK_ERR_INVALID, "agent %s: no turn in progress", id);
    int changed = n != g->n;
    if (set_history(g, tokens, n, err) < 0) {
        ak_kv_truncate(g->kv, 0);
        g->n = 0;
        g->in_turn = 0;
        return -1;
    }
    if (changed) g->version = ++a->next_version;
    publish(a, g);
    touch(a, g);
    return 0;
}

int ak_agent_append(ak_agents *a, const char *id, int32_t token, ak_error *err) {
    agent *g = find(a, id);
    if (!g || !g->kv || !g->in_turn) return ak_failc(err, AK_ERR_INVALID, "agent %s: no turn in progress", id);
    if (g->n + 1 > g->cap) {
        int nc = g->cap * 2 + 1;
        int32_t *nt = realloc(g->tokens, sizeof(int32_t) * nc);
        if (!nt) { ak_kv_truncate(g->kv, g->n); return ak_failc(err, AK_ERR_NOMEM, "out of memory"); }
        g->tokens = nt;
        g->cap = nc;
    }
    g->tokens[g->n++] = token;
    g->version = ++a->next_version;
    if ((g->n - ak_kv_base_len(g->kv)) % ak_block_pool_block_tokens(a->cfg.pool) == 0) publish(a, g);   /* a block filled */
    touch(a, g);
    return 0;
}

int ak_agent_reserve(ak_agents *a, const char *id, int n_pos, size_t extra, ak_error *err) {
    agent *g = find(a, id);
    if (!g || !g->kv) return ak_failc(err, AK_ERR_NOT_FOUND, "agent %s: not in memory", id);
    if (n_pos > a->cfg.n_ctx) return ak_failc(err, AK_ERR_INVALID, "agent %s: context of %d tokens is full", id, a->cfg.n_ctx);
    size_t need = bytes_for(a, g, n_pos);
    return agents_ensure_room(a, need ? need + extra : 0, g, err) < 0 ? -1 : 0;
}

void ak_agent_abort(ak_agents *a, const char *id) {
    agent *g = find(a, id);
    if (!g) return;
    if (g->kv) ak_kv_truncate(g->kv, g->n);
    g->in_turn = 0;
}

int ak_agent_place_memory(ak_agents *a, const char *id, const char *mem_id, const int32_t *tokens, int at, ak_kv **kv,
                          ak_error *err) {
    agent *g = find(a, id);
    if (!g || !g->kv || !g->in_turn) return ak_failc(err, AK_ERR_INVALID, "agent %s: no turn in progress", id);
    if (at < 0 || ak_kv_length(g->kv) != at)
        return ak_failc(err, AK_ERR_INVALID, "agent %s: a memory placed at %d, but the cache holds %d positions", id, at,
                        ak_kv_length(g->kv));
    const int32_t *mt;
    const char *hash;
    int n;
    const ak_kv *src = mems_blocks_at(a, mem_id, at, ak_kv_format_k(g->kv), ak_kv_format_v(g->kv), &mt, &n, &hash, err);
    if (!src) return -1;
    if (at + n >= a->cfg.n_ctx)
        return ak_failc(err, AK_ERR_INVALID, "agent %s: memory %s's %d tokens at %d do not fit the context of %d", id,
                        mem_id, n, at, a->cfg.n_ctx);
    if (memcmp(tokens + at, mt, sizeof(int32_t) * (size_t)n))
        return ak_failc(err, AK_ERR_INVALID, "agent %s: the prompt does not hold memory %s's tokens at %d", id, mem_id, at);
    /* the history so far is what the cache holds: the prompt's first `at` tokens */
    if (set_history(g, tokens, at, err) < 0) return -1;
    segs_sync(g);
    ak_kv *nk = ak_kv_new(a->cfg.pool, ak_kv_format_k(g->kv), ak_kv_format_v(g->kv), a->cfg.n_ctx, err);
    if (!nk) return -1;
    int lens[AK_KV_MAX_SEGMENTS], rc = at > 0 ? ak_kv_attach_base(nk, g->kv, at, err) : 0;
    int ns = ak_kv_segments(nk, lens);
    if (rc == 0 && ns >= AK_KV_MAX_SEGMENTS)
        rc = ak_failc(err, AK_ERR_INVALID, "agent %s: its context is %d segments already: at most %d (each memory is "
                      "one, the positions before it another)", id, ns, AK_KV_MAX_SEGMENTS);
    int T = ak_block_pool_block_tokens(a->cfg.pool), nb = (n + T - 1) / T;
    /* both layer groups' blocks (kvcache.h LAYER GROUPS: the memory keeps
     * its local ones; the agent drops its references as its window moves) */
    ak_block **bl = rc == 0 ? ak_calloc(2 * (size_t)nb, sizeof *bl, err) : NULL;
    if (rc == 0 && !bl) rc = -1;
    for (int i = 0; rc == 0 && i < nb; i++) {
        int s0, cnt;
        if (!(bl[i] = ak_kv_span(src, i, &s0, &cnt))) rc = ak_failc(err, AK_ERR_INVALID, "memory %s: block %d missing", mem_id, i);
        bl[nb + i] = ak_kv_local_span(src, i);
    }
    if (rc == 0) rc = ak_kv_append_groups(nk, bl, bl + nb, nb, n, err);   /* references taken: shared, read-only */
    free(bl);
    if (rc == 0) rc = set_history(g, tokens, at + n, err);
    if (rc < 0) {
        ak_kv_free(nk);
        return -1;
    }
    /* descriptors: the positions before it frozen (if any), then the chunk,
     * both stored in the agent's file as its own (restored without the memory) */
    int k = g->n_segs;
    if (ns > k) g->segs[k++] = (ak_store_seg){AK_SEG_OWN, 0, "", ""};
    g->segs[k++] = (ak_store_seg){AK_SEG_OWN, 0, "", ""};
    g->n_segs = k;
    ak_kv_free(g->kv);
    g->kv = nk;
    segs_sync(g);   /* impure: shifted keys are not what a prefill computes, never in the content index */
    g->pub_spans = ak_kv_span_count(nk);
    g->version = ++a->next_version;
    *kv = nk;
    logf_(a, "agent %s: memory %s (%d tokens, content %s) placed at %d", id, mem_id, n, hash, at);
    return 0;
}

int ak_agent_reuse_memory(ak_agents *a, ak_ctx *c, const char *id, const char *mem_id, const int32_t *tokens, int at,
                          const ak_reuse_params *p, ak_kv **kv, ak_reuse_stats *st, ak_error *err) {
    agent *g = find(a, id);
    if (!g || !g->kv || !g->in_turn) return ak_failc(err, AK_ERR_INVALID, "agent %s: no turn in progress", id);
    if (at < 0 || ak_kv_length(g->kv) != at)
        return ak_failc(err, AK_ERR_INVALID, "agent %s: a memory placed at %d, but the cache holds %d positions", id, at,
                        ak_kv_length(g->kv));
    ak_memory_info mi;
    if (ak_memory_get(a, mem_id, &mi, NULL, err) < 0) return -1;
    const ak_kv *src = ak_memory_kv(a, mem_id, err);   /* loaded (verified) if not resident */
    if (!src) return -1;
    int n = mi.n_tokens;
    int32_t *mt = NULL;
    if (at + n >= a->cfg.n_ctx)
        return ak_failc(err, AK_ERR_INVALID, "agent %s: memory %s's %d tokens at %d do not fit the context of %d", id,
                        mem_id, n, at, a->cfg.n_ctx);
    if (ak_memory_tokens(a, mem_id, &mt, &n, err) < 0) return -1;
    int same = memcmp(tokens + at, mt, sizeof(int32_t) * (size_t)n) == 0;
    free(mt);
    if (!same)
        return ak_failc(err, AK_ERR_INVALID, "agent %s: the prompt does not hold memory %s's tokens at %d", id, mem_id, at);
    int lens[AK_KV_MAX_SEGMENTS], ns = ak_kv_segments(g->kv, lens);
    if (ns + 1 > AK_KV_MAX_SEGMENTS)
        return ak_failc(err, AK_ERR_INVALID, "agent %s: its context is %d segments already: at most %d (each memory "
                        "ends one)", id, ns, AK_KV_MAX_SEGMENTS);
    if (set_history(g, tokens, at, err) < 0) return -1;
    segs_sync(g);
    ak_reuse_part part = {tokens + at, n, src};
    if (ak_reuse_place(c, g->kv, &part, p, st, err) < 0) return -1;   /* g->kv back at [0, at) */
    /* [0, at + n) frozen as one more own segment: the agent is impure (its
     * chunk positions are not what a prefill computes: never in the content
     * index, restored as its own), and the correction, if any, goes with
     * the base (kvcache.h) */
    ak_kv *nk = ak_kv_new(a->cfg.pool, ak_kv_format_k(g->kv), ak_kv_format_v(g->kv), a->cfg.n_ctx, err);
    int rc = nk ? ak_kv_attach_base(nk, g->kv, at + n, err) : -1;
    if (rc == 0) rc = set_history(g, tokens, at + n, err);
    if (rc < 0) {
        ak_kv_free(nk);
        ak_kv_truncate(g->kv, at);
        return -1;
    }
    int k = g->n_segs;
    if (ak_kv_segments(nk, lens) > k) g->segs[k++] = (ak_store_seg){AK_SEG_OWN, 0, "", ""};
    g->n_segs = k;
    ak_kv_free(g->kv);
    g->kv = nk;
    segs_sync(g);
    g->pub_spans = ak_kv_span_count(nk);
    g->version = ++a->next_version;
    *kv = nk;
    logf_(a, "agent %s: memory %s (%d tokens, content %s) placed at %d by %s (ratio %.3f, %d recomputed)", id, mem_id,
          n, mi.hash, at, ak_reuse_method_name(p->method), (double)p->ratio, st ? st->n_recomputed : -1);
    return 0;
}

size_t ak_agent_bytes_needed(const ak_agents *a, const char *id, int n_pos) {
    const agent *g = find(a, id);
    if (!g) return ak_agents_bytes_for(a, n_pos);
    return bytes_for(a, g, n_pos);
}

size_t ak_agents_bytes_for(const ak_agents *a, int n_pos) {
    int T = ak_block_pool_block_tokens(a->cfg.pool);
    return spans_bytes(a, (n_pos + T - 1) / T, a->cfg.fk, a->cfg.fv);
}

int ak_agent_begin(ak_agents *a, ak_ctx *c, const char *id, const int32_t *tokens, int n, float *logits,
                   ak_turn *t, ak_error *err) {
    ak_kv *kv;
    if (ak_agent_open(a, id, 0, tokens, n, n, 0, &kv, t, err) < 0) return -1;
    double t0 = ak_now();
    if (ak_eval(c, kv, tokens + t->reused, t->prefilled, t->reused, logits, NULL, NULL, NULL, err) < 0) {
        ak_agent_abort(a, id); /* whatever was written past the history is not trusted */
        return -1;
    }
    t->prefill_ms = (ak_now() - t0) * 1e3;
    return ak_agent_commit(a, id, tokens, n, err);
}

int ak_agent_step(ak_agents *a, ak_ctx *c, const char *id, int32_t token, float *logits, ak_error *err) {
    agent *g = find(a, id);
    if (!g || !g->kv || !g->in_turn) return ak_failc(err, AK_ERR_INVALID, "agent %s: no turn in progress", id);
    if (ak_agent_reserve(a, id, g->n + 1, 0, err) < 0) return -1;
    if (ak_eval(c, g->kv, &token, 1, g->n, logits, NULL, NULL, NULL, err) < 0) {
        ak_kv_truncate(g->kv, g->n);
        return -1;
    }
    return ak_agent_append(a, id, token, err);
}

int ak_agent_end(ak_agents *a, const char *id, ak_error *err) {
    drain_results(a);
    agent *g = find(a, id);
    if (!g) return ak_failc(err, AK_ERR_NOT_FOUND, "agent %s: unknown", id);
    g->in_turn = 0;
    if (a->cfg.save == AK_SAVE_EVERY_TURN && save_agent(a, g, 0, err) < 0) return -1;
    return 0;
}

int ak_agent_remove(ak_agents *a, const char *id, ak_error *err) {
    int found = 0;
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->v[i]->id, id)) {
            if (a->v[i]->in_turn || a->v[i]->restoring)
                return ak_failc(err, AK_ERR_BUSY, "agent %s is busy (a turn or a restore is in progress)", id);
            free_agent(a->v[i]);
            a->v[i] = a->v[--a->n];
            found = 1;
            break;
        }
    if (a->cfg.store && ak_agent_id_valid(id)) {
        wait_saved(a, id);
        int r = ak_store_remove(a->cfg.store, id, err);
        if (r < 0) return -1;
        if (r == 0) found = 1;
    }
    return found ? 0 : 1;
}

int ak_agents_count(const ak_agents *a) { return a->n; }

void ak_agents_get(const ak_agents *a, int i, ak_agent_info *out) {
    const agent *g = a->v[i];
    out->id = g->id;
    out->n_tokens = g->n;
    out->tier = g->kv ? AK_TIER_HOT : AK_TIER_WARM;
    out->bytes = g->kv ? ak_kv_bytes(g->kv) : 0;
    out->private_bytes = g->kv ? ak_kv_private_bytes(g->kv) : 0;
    snprintf(out->pool, sizeof out->pool, "%s", g->pool);
    snprintf(out->card, sizeof out->card, "%s", g->card);
    out->impure = g->impure;
    out->last_use = g->last_use;
    out->last_unix = g->last_unix;
    out->dirty = is_dirty(g) && !g->ephemeral;
    out->save_failed = g->save_failed;
    out->save_error = g->save_error;
    out->ephemeral = g->ephemeral;
    out->in_turn = g->in_turn;
}

int ak_agents_find(const ak_agents *a, const char *id) {
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->v[i]->id, id)) return i;
    return -1;
}

static int cmp_entry(const void *x, const void *y) {
    return strcmp(((const ak_agent_entry *)x)->id, ((const ak_agent_entry *)y)->id);
}

int ak_agents_listing(const ak_agents *a, const ak_store_entry *files, int n_files,
                      int (*busy)(void *ud, const char *id), void *ud, ak_agent_entry **out, int *n,
                      ak_agents_census *census, ak_error *err) {
    int n_ag = ak_agents_count(a), m = 0;
    ak_agent_entry *v = calloc((size_t)(n_ag + n_files) + 1, sizeof *v);
    if (!v) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    int hot = 0;
    for (int i = 0; i < n_ag; i++) {
        ak_agent_info in;
        ak_agents_get(a, i, &in);
        if (in.ephemeral) continue;
        if (in.tier != AK_TIER_HOT && in.n_tokens == 0) continue;
        ak_agent_entry *x = &v[m++];
        snprintf(x->id, sizeof x->id, "%s", in.id);
        x->n_tokens = in.n_tokens;
        x->tier = in.tier;
        x->bytes = in.bytes;
        x->private_bytes = in.private_bytes;
        snprintf(x->pool, sizeof x->pool, "%s", in.pool);
        snprintf(x->card, sizeof x->card, "%s", in.card);
        x->last_use = in.last_unix;
        x->busy = busy && busy(ud, in.id);
        hot += in.tier == AK_TIER_HOT;
    }
    int n_known = m;
    uint64_t warm_bytes = 0;
    for (int i = 0; i < n_files; i++) {
        warm_bytes += files[i].bytes;
        int j = 0;
        while (j < n_known && strcmp(v[j].id, files[i].id)) j++;
        if (j < n_known) {
            /* an agent known here keeps its own token count: its file may
             * still hold an older turn while the new save is queued */
            if (v[j].tier != AK_TIER_HOT) v[j].bytes = v[j].private_bytes = files[i].bytes;
            continue;
        }
        ak_agent_entry *x = &v[m++];
        snprintf(x->id, sizeof x->id, "%s", files[i].id);
        x->n_tokens = files[i].n_tokens;
        x->tier = AK_TIER_WARM;
        x->bytes = x->private_bytes = files[i].bytes;   /* a file holds only the agent's own positions */
        /* a file's base is a pool's or a card's (store.h: base.card) */
        snprintf(files[i].base.card ? x->card : x->pool, sizeof x->pool, "%s", files[i].base.pool_id);
        x->last_use = files[i].mtime;
        x->busy = busy && busy(ud, files[i].id);
    }
    if (census) {
        census->hot = hot;
        census->warm = m - hot;
        census->warm_bytes = warm_bytes;
    }
    if (!out) {
        free(v);
        return 0;
    }
    qsort(v, (size_t)m, sizeof *v, cmp_entry);
    *out = v;
    *n = m;
    return 0;
}

int ak_agent_match_len(const ak_agents *a, const char *id, const int32_t *tokens, int n) {
    const agent *g = find(a, id);
    if (!g || !g->kv) return 0;
    int common = 0;
    while (common < g->n && common < n && g->tokens[common] == tokens[common]) common++;
    return common;
}

const int32_t *ak_agent_history(const ak_agents *a, const char *id, int *n) {
    const agent *g = find(a, id);
    *n = g && g->kv ? g->n : 0;
    return *n ? g->tokens : NULL;
}

int ak_agent_hot(const ak_agents *a, const char *id) {
    const agent *g = find(a, id);
    return g && g->kv;
}

int ak_agent_restoring(const ak_agents *a, const char *id) {
    const agent *g = find(a, id);
    return g && g->restoring;
}

int ak_agent_prefetch(ak_agents *a, const char *id, size_t extra, ak_restore_job **job, ak_error *err) {
    *job = NULL;
    if (!a->cfg.store || !ak_agent_id_valid(id)) return 0;
    agent *g = find(a, id);
    if (g && (g->kv || g->in_turn || g->restoring)) return 0;
    wait_saved(a, id);
    ak_store_entry e;
    ak_error ie = {{0}};
    if ((ak_store_lookup(a->cfg.store, id, &e) != 0 && ak_store_inspect(a->cfg.store, id, &e, NULL, &ie) != 0) ||
        !e.readable)
        return 0;
    size_t need = restore_bytes(a, &e);
    if (!g && !(g = create(a, id, err))) return -1;
    if (agents_ensure_room(a, need + extra, g, err) < 0) return -1;
    ak_restore_job *j = ak_calloc(1, sizeof *j, err);
    if (!j) return -1;
    if (!(j->kv = restore_target(a, &e, err))) {
        free(j);
        return -1;
    }
    prelink_ctx *pc = ak_calloc(1, sizeof *pc, err);
    if (!pc) {
        ak_kv_free(j->kv);
        free(j);
        return -1;
    }
    prelink_setup(a, &e, pc);
    j->prelink = pc;
    snprintf(j->id, sizeof j->id, "%s", id);
    j->store = a->cfg.store;
    j->fingerprint = a->cfg.model->fingerprint;
    j->vocab = a->cfg.model->cfg.vocab;
    j->reserved = need;
    j->status = AK_STORE_ABSENT; /* until it runs */
    a->reserved += need;
    g->restoring = 1;
    *job = j;
    return 1;
}

void ak_restore_job_run(ak_restore_job *j) {
    j->status = ak_store_load_linked(j->store, j->id, j->fingerprint, j->vocab, j->kv, prelink, j->prelink, &j->info,
                                     &j->err);
    if (j->status == AK_STORE_HIT && !j->prelink->no_index && !j->prelink->impure) {   /* at once: the next restore of this prefix links it */
        int next = 0;
        ak_prefix_publish(j->kv, j->info.tokens, j->info.n_tokens, &next);
    }
    int no_index = j->prelink->no_index;
    prelink_clear(j->prelink);   /* the pool's blocks are the sequence's now */
    j->prelink->no_index = no_index;
}

void ak_agent_prefetch_done(ak_agents *a, ak_restore_job *j) {
    a->reserved -= j->reserved;
    agent *g = find(a, j->id);
    if (g) g->restoring = 0;
    if (j->status == AK_STORE_HIT && g && !g->kv && set_history(g, j->info.tokens, j->info.n_tokens, &j->err) == 0) {
        g->kv = j->kv;
        j->kv = NULL;
        restored(a, g, &j->info);
        g->ahead = 1;
        g->ahead_ms = j->info.total_ms;
        g->ahead_bytes = j->info.bytes_read;
        touch(a, g);
    } else if (j->status != AK_STORE_HIT && j->status != AK_STORE_ABSENT) {
        logf_(a, "agent %s: cache %s, recomputing: %s", j->id, ak_store_status_name(j->status), j->err.msg);
    }
    prelink_clear(j->prelink);
    free(j->prelink);
    ak_kv_free(j->kv);
    free(j->info.tokens);
    free(j);
}

size_t ak_agent_bytes_to_add(const ak_agents *ca, const char *id, const char *pool_id, const int32_t *tokens, int n,
                             int n_pos) {
    ak_agents *a = (ak_agents *)ca;   /* a scratch sequence takes references for a moment; nothing else changes */
    const agent *g = find(a, id);
    if (n_pos > a->cfg.n_ctx) n_pos = a->cfg.n_ctx;
    if (n > n_pos) n = n_pos;
    /* a turn in progress holds its prompt already: it adds what it grows
     * into (the scheduler asks this of every running request each step,
     * so no scratch sequence here) */
    if (g && g->kv && g->in_turn) return bytes_for(a, g, n_pos);
    pool_rec *p = pool_id && pool_id[0] ? pools_find(a, pool_id) : NULL;
    ak_error e = {{0}};
    ak_kv *kv = NULL;
    if (p && !p->kv) {   /* the pool is loaded first (every block of it: pools.c): its blocks count once */
        int T = ak_block_pool_block_tokens(a->cfg.pool);
        return (size_t)((p->n + T - 1) / T) * ak_block_pool_block_bytes(a->cfg.pool, p->fk, p->fv) +
               ak_agents_bytes_for(a, n_pos - p->n + T);
    }
    if (p && p->kv && (!g || !g->kv || strcmp(g->pool, p->id))) {
        if (!(kv = ak_kv_new(a->cfg.pool, p->fk, p->fv, a->cfg.n_ctx, &e)) || ak_kv_attach_base(kv, p->kv, p->n, &e) < 0) {
            ak_kv_free(kv);
            return ak_agents_bytes_for(a, n_pos);
        }
    } else if (g && g->kv) {
        int common = 0;
        while (common < g->n && common < n && g->tokens[common] == tokens[common]) common++;
        if (!(kv = ak_kv_fork(g->kv, &e))) return bytes_for(a, g, n_pos);
        ak_kv_truncate(kv, common < n ? common : n - 1);
    } else {
        if (!(kv = ak_kv_new(a->cfg.pool, a->cfg.fk, a->cfg.fv, a->cfg.n_ctx, &e))) return ak_agents_bytes_for(a, n_pos);
    }
    if (n > 0 && ak_kv_length(kv) < n - 1 && !a->cfg.no_prefix_sharing && !(g && g->kv && g->impure && ak_kv_base_len(kv) > 0))
        ak_prefix_link(kv, tokens, n - 1);
    size_t bytes = kv_grow_bytes(a, kv, n_pos);
    ak_kv_free(kv);
    return bytes;
}

void ak_agents_share_stats(ak_agents *a, ak_share_stats *st) {
    memset(st, 0, sizeof *st);
    ak_block_pool_stats ps;
    ak_block_pool_get_stats(a->cfg.pool, &ps);
    st->shared_bytes = ps.shared;
    st->logical_bytes = ps.logical;
    st->used_bytes = ps.used;
    st->linked_blocks = a->linked_blocks;
    st->linked_bytes = a->linked_bytes;
    for (int i = 0; i < a->n_pools; i++) {
        if (a->pools[i]->building) continue;
        st->pools++;
        st->pools_resident += a->pools[i]->kv != NULL;
    }
}

/* ---- cards (agent.h: CARDS) ---------------------------------------------- */

/* The card of id known this run, or NULL. */
static const ak_card *cards_find(const ak_agents *a, const char *id) {
    for (int i = 0; i < a->n_cards; i++)
        if (!strcmp(a->cards[i]->id, id)) return a->cards[i];
    return NULL;
}

/* Records c (taken over) as known this run. Returns 0, or -1 with err set
 * (c freed). */
static int cards_add(ak_agents *a, ak_card *c, ak_error *err) {
    if (a->n_cards == a->cap_cards) {
        int nc = a->cap_cards ? a->cap_cards * 2 : 8;
        ak_card **v = realloc(a->cards, sizeof *v * (size_t)nc);
        if (!v) {
            ak_card_free(c);
            return ak_failc(err, AK_ERR_NOMEM, "out of memory");
        }
        a->cards = v;
        a->cap_cards = nc;
    }
    a->cards[a->n_cards++] = c;
    return 0;
}

/* The card id, from RAM or loaded (verified completely) from the store,
 * or NULL with err set: AK_ERR_NOT_FOUND, AK_ERR_STALE, AK_ERR_CORRUPT
 * (quarantined), ... */
static const ak_card *cards_resolve(ak_agents *a, const char *id, ak_error *err) {
    if (!id || !ak_agent_id_valid(id)) {
        ak_failc(err, AK_ERR_INVALID, "invalid card id");
        return NULL;
    }
    const ak_card *c = cards_find(a, id);
    if (c) return c;
    if (!a->cfg.store) {
        ak_failc(err, AK_ERR_NOT_FOUND, "no card %s", id);
        return NULL;
    }
    ak_card *lc = NULL;
    ak_store_status st = ak_store_load_card(a->cfg.store, id, a->cfg.model->fingerprint, &a->cfg.model->spec,
                                            a->cfg.model->cfg.vocab, &lc, err);
    if (st != AK_STORE_HIT) return NULL;   /* err says why, with its code */
    if (cards_add(a, lc, err) < 0) return NULL;
    return lc;
}

const ak_card *ak_card_get(ak_agents *a, const char *card_id, ak_error *err) { return cards_resolve(a, card_id, err); }

void ak_card_wait_saved(ak_agents *a, const char *card_id) { wait_saved(a, card_id); }

void ak_agents_set_threads(ak_agents *a, ak_pool *threads) { a->threads = threads; }

/* 1 if a card of id exists (in RAM or the store's index). */
static int card_exists(ak_agents *a, const char *id) {
    ak_store_card_entry e;
    return cards_find(a, id) || (a->cfg.store && ak_store_lookup_card(a->cfg.store, id, &e) == 0);
}

/* Brings agent g's cache into RAM (restoring it) if it is not. */
static void make_hot(ak_agents *a, agent *g, ak_error *err) {
    if (g->kv) return;
    g->n = 0;
    if (!(g->kv = ak_kv_new(a->cfg.pool, a->cfg.fk, a->cfg.fv, a->cfg.n_ctx, err))) return;
    ak_turn t;
    memset(&t, 0, sizeof t);
    if (a->cfg.store && !g->ephemeral) restore(a, g, &t, err);
    segs_sync(g);   /* a miss leaves it empty */
}

/* Per-token statistics of a card's range, for bitalloc.h: 4 arrays of n
 * doubles in one block (mass, variance, entropy, exposure). */
typedef struct {
    double *buf;
    const double *mass, *var, *entropy, *exposure;
} range_stats;

/* Runs the statistics pass (agent.h: THE STATISTICS PASS) over g's tokens
 * [from, to) on context c into *rs (rs->buf malloc'd). Leaves c's position
 * offset and statistics hook as they were (none). Returns 0, or -1 with err
 * set (AK_ERR_KV_BUDGET, AK_ERR_NOMEM, a forward-pass error). */
static int stats_pass(ak_agents *a, agent *g, ak_ctx *c, int from, int to, range_stats *rs, ak_error *err) {
    int n = to - from;
    memset(rs, 0, sizeof *rs);
    /* room for the scratch as for a turn of n tokens, g kept in RAM (every
     * block: a pass holds its local ones until it ends) */
    int T = ak_block_pool_block_tokens(a->cfg.pool);
    if (agents_ensure_room(a, (size_t)((n + T - 1) / T) * ak_block_pool_block_bytes(a->cfg.pool, a->cfg.fk, a->cfg.fv), g,
                           err) < 0)
        return -1;
    ak_attn_stats *st = ak_attn_stats_new(a->cfg.model, NULL, 0, err);
    ak_kv *kv = st ? ak_kv_new(a->cfg.pool, a->cfg.fk, a->cfg.fv, n, err) : NULL;
    double *buf = kv ? malloc(sizeof(double) * 4 * (size_t)n) : NULL;
    int rc = -1;
    if (kv && !buf) ak_failc(err, AK_ERR_NOMEM, "out of memory");
    if (buf) {
        int off0 = ak_ctx_pos_offset(c);
        ak_attn_stats_set_seq(st, kv);
        ak_ctx_set_attn_stats(c, st);
        ak_ctx_set_pos_offset(c, off0 + from);   /* the tokens' own RoPE positions */
        rc = ak_eval(c, kv, g->tokens + from, n, 0, NULL, NULL, NULL, NULL, err);
        ak_ctx_set_pos_offset(c, off0);
        ak_ctx_set_attn_stats(c, NULL);
        if (rc == 0 && ak_attn_stats_length(st) != n)   /* one slot per token, or the hook is broken */
            rc = ak_failc(err, AK_ERR_GENERIC, "attention statistics: %d slots for %d tokens", ak_attn_stats_length(st), n);
    }
    if (rc == 0) {
        ak_attn_stats_mass(st, buf);
        ak_attn_stats_mass_var(st, buf + n);
        ak_attn_stats_entropy(st, buf + 2 * (size_t)n);
        ak_attn_stats_exposure(st, buf + 3 * (size_t)n);
        rs->buf = buf;
        rs->mass = buf;
        rs->var = buf + n;
        rs->entropy = buf + 2 * (size_t)n;
        rs->exposure = buf + 3 * (size_t)n;
    } else {
        free(buf);
    }
    ak_kv_free(kv);
    ak_attn_stats_free(st);
    return rc;
}

/* Widths for g's tokens [from, to) chosen by bitalloc.h under rq's budgets
 * and policy (NULL: uniform), each capped at the width the token already
 * has in a mixed block: a malloc'd array of the key widths followed by the
 * value widths, or NULL with err set (AK_ERR_INVALID for a budget outside
 * [2, 16] or an unknown policy; the statistics pass's errors). *policy gets
 * the policy's name. importance and topology are scored from attention when
 * rq->ctx is given (stats_pass), else from the token ids alone. */
static uint8_t *allocate_widths(ak_agents *a, agent *g, int from, int to, const ak_card_request *rq,
                                const char **policy, ak_error *err) {
    int n = to - from;
    ak_bitalloc_params bp;
    ak_bitalloc_params_init(&bp);
    if (ak_bitalloc_policy_parse(rq->policy ? rq->policy : "uniform", &bp.policy, err) < 0) return NULL;
    *policy = ak_bitalloc_policy_name(bp.policy);
    /* the options the 5-hop chain found best (docs/cards-bench.md, Quality;
     * bitalloc.h's defaults lose to uniform there), with modeled errors:
     * measuring every vector at every width costs seconds at 8K tokens */
    if (bp.policy != AK_BITALLOC_UNIFORM) ak_bitalloc_params_measured(&bp);
    bp.budget_k = rq->budget_k;
    bp.budget_v = rq->budget_v > 0 ? rq->budget_v : 0;
    /* refuse a bad budget before any pass is paid for */
    if (!(bp.budget_k >= 2 && bp.budget_k <= 16) || (bp.budget_v != 0 && !(bp.budget_v >= 2 && bp.budget_v <= 16))) {
        ak_failc(err, AK_ERR_INVALID, "budget %g/%g bits is outside [2, 16]", rq->budget_k, rq->budget_v);
        return NULL;
    }
    uint8_t *w = malloc((size_t)n * 4);
    int32_t *overlap = malloc(sizeof(int32_t) * (size_t)n);
    if (!w || !overlap) {
        free(w);
        free(overlap);
        ak_failc(err, AK_ERR_NOMEM, "out of memory");
        return NULL;
    }
    uint8_t *cap_k = w + 2 * (size_t)n, *cap_v = cap_k + n;
    for (int i = 0; i < n; i++) {
        int ck = 16, cv = 16;
        /* a token held in a mixed block came from a card: handed off once before */
        overlap[i] = ak_card_slot_widths(g->kv, from + i, &ck, &cv);
        cap_k[i] = (uint8_t)ck;
        cap_v[i] = (uint8_t)cv;
    }
    range_stats rs;
    memset(&rs, 0, sizeof rs);
    if (bp.policy != AK_BITALLOC_UNIFORM && rq->ctx && stats_pass(a, g, rq->ctx, from, to, &rs, err) < 0) {
        free(w);
        free(overlap);
        return NULL;
    }
    ak_bitalloc_input in;
    memset(&in, 0, sizeof in);
    in.n = n;
    in.mass = rs.mass;
    in.variance = rs.var;
    in.entropy = rs.entropy;
    in.exposure = rs.exposure;
    in.tokens = g->tokens + from;
    in.overlap = overlap;
    in.cap_k = cap_k;
    in.cap_v = cap_v;
    int rc = ak_bitalloc_run(&in, &bp, w, w + n, NULL, err);
    free(rs.buf);
    free(overlap);
    if (rc < 0) {
        free(w);
        return NULL;
    }
    return w;
}

int ak_agent_make_card(ak_agents *a, const char *agent_id, const ak_card_request *rq,
                       char card_id_out[AK_AGENT_ID_MAX + 1], ak_error *err) {
    drain_results(a);
    if (!agent_id || !ak_agent_id_valid(agent_id)) return ak_failc(err, AK_ERR_INVALID, "invalid agent id");
    ak_card_request none;
    memset(&none, 0, sizeof none);
    if (!rq) rq = &none;
    char id[AK_AGENT_ID_MAX + 1];
    if (rq->card_id && rq->card_id[0]) {
        if (!ak_agent_id_valid(rq->card_id)) return ak_failc(err, AK_ERR_INVALID, "invalid card id");
        if (card_exists(a, rq->card_id)) return ak_failc(err, AK_ERR_EXISTS, "card %s exists (cards are write-once)", rq->card_id);
        snprintf(id, sizeof id, "%s", rq->card_id);
    } else {   /* "<agent>-<n>", the agent's part shortened to fit */
        int k = 1;
        for (;; k++) {
            char num[16];
            int nl = snprintf(num, sizeof num, "-%d", k);
            snprintf(id, sizeof id, "%.*s%s", AK_AGENT_ID_MAX - nl, agent_id, num);
            if (!card_exists(a, id)) break;
        }
    }
    agent *g = find(a, agent_id);
    ak_store_entry se;
    if (!g && a->cfg.store && ak_store_lookup(a->cfg.store, agent_id, &se) == 0 && !(g = create(a, agent_id, err)))
        return -1;
    if (!g) return ak_failc(err, AK_ERR_NOT_FOUND, "no agent %s", agent_id);
    if (g->in_turn || g->restoring)
        return ak_failc(err, AK_ERR_BUSY, "agent %s is busy (a turn or a restore is in progress)", agent_id);
    make_hot(a, g, err);
    if (!g->kv) return -1;
    if (g->n == 0) return ak_failc(err, AK_ERR_NOT_FOUND, "agent %s holds nothing to make a card of", agent_id);
    int to = rq->to > 0 ? rq->to : g->n;
    if (rq->from < 0 || to > g->n || rq->from >= to)
        return ak_failc(err, AK_ERR_INVALID, "agent %s: range [%d, %d) is outside its %d tokens", agent_id, rq->from, to,
                        g->n);
    touch(a, g);
    ak_card_params p = {id, agent_id, a->cfg.model->fingerprint, a->cfg.model->cfg.name, rq->from, to,
                        rq->widths_k, rq->widths_v, rq->policy, rq->budget_k, rq->budget_v, NULL};
    /* the engine's threads are free between steps (rq->ctx is the engine's context) */
    if (rq->ctx) p.threads = ak_ctx_pool(rq->ctx);
    uint8_t *wb = NULL;
    if (!rq->widths_k && !rq->widths_v && rq->budget_k > 0 &&
        !(wb = allocate_widths(a, g, rq->from, to, rq, &p.policy, err)))
        return -1;
    if (wb) {
        p.widths_k = wb;
        p.widths_v = wb + (to - rq->from);
    }
    ak_card *c = ak_card_make(g->kv, g->tokens, &p, err);
    free(wb);
    if (!c) return -1;
    /* the file is written behind, by the writer (its fsync alone can take
     * longer than the whole handoff); without a writer, here */
    if (a->cfg.store && !a->writer_running && ak_store_save_card(a->cfg.store, c, err) < 0) {
        ak_card_free(c);
        return -1;
    }
    pending *pw = NULL;
    if (a->writer_running && !(pw = calloc(1, sizeof *pw))) {
        ak_card_free(c);
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    if (cards_add(a, c, err) < 0) {
        free(pw);
        return -1;
    }
    if (pw) {
        snprintf(pw->id, sizeof pw->id, "%s", c->id);
        pw->card = c;
        enqueue_save(a, pw);
    }
    if (card_id_out) snprintf(card_id_out, AK_AGENT_ID_MAX + 1, "%s", id);
    logf_(a, "card %s: made from agent %s [%d, %d), %zu bytes (f16: %zu)", id, agent_id, rq->from, to,
          ak_card_vector_bytes(c), ak_card_f16_bytes(c));
    return 0;
}

/* The card c's blocks with its keys starting at position `at`, in kv's
 * pool: *blocks (malloc'd) holds *nb blocks, each with a reference for the
 * caller (cards.h: ak_card_to_blocks). Returns 0, or -1 with err set. */
static int card_blocks_at(const ak_agents *a, const ak_card *c, int at, ak_block ***blocks, int *nb, ak_error *err) {
    if (c->pos_offset == at) return ak_card_to_blocks(c, a->cfg.pool, a->threads, blocks, nb, err);
    ak_card *s = ak_card_shift(c, a->cfg.model, at, err);
    if (!s) return -1;
    int rc = ak_card_to_blocks(s, a->cfg.pool, a->threads, blocks, nb, err);
    ak_card_free(s);
    return rc;
}

/* Import "append" of card c into g, which holds p > 0 tokens in RAM: a new
 * sequence of g's formats whose base is g's positions [0, p) (its segments,
 * its own positions as one more: shared, not copied) followed by c's blocks
 * with their keys at [p, p + n), g's history followed by c's tokens.
 * Returns 0, or -1 with err set and g as it was. */
static int import_append(ak_agents *a, agent *g, const ak_card *c, ak_error *err) {
    int p = g->n;
    segs_sync(g);
    ak_kv *kv = ak_kv_new(a->cfg.pool, ak_kv_format_k(g->kv), ak_kv_format_v(g->kv), a->cfg.n_ctx, err);
    if (!kv) return -1;
    ak_block **bl = NULL;
    int nb = 0, lens[AK_KV_MAX_SEGMENTS], rc = ak_kv_attach_base(kv, g->kv, p, err);
    int ns = ak_kv_segments(kv, lens);
    if (rc == 0 && ns >= AK_KV_MAX_SEGMENTS)   /* checked before the card is shifted and cut */
        rc = ak_failc(err, AK_ERR_INVALID, "agent %s: its context is %d segments already: at most %d (a card "
                      "appended is one, the positions before it another)", g->id, ns, AK_KV_MAX_SEGMENTS);
    if (rc == 0) rc = card_blocks_at(a, c, p, &bl, &nb, err);
    if (rc == 0) rc = ak_kv_append_blocks(kv, bl, nb, c->n_tokens, err);
    for (int i = 0; i < nb; i++) ak_block_unref(a->cfg.pool, bl[i]);   /* kv holds them now (or nothing does) */
    free(bl);
    if (rc < 0) {
        ak_kv_free(kv);
        return -1;
    }
    /* the history: g's tokens, then the card's (built apart: set_history may move g's) */
    int32_t *h = malloc(sizeof(int32_t) * (size_t)(p + c->n_tokens));
    if (h) {
        memcpy(h, g->tokens, sizeof(int32_t) * (size_t)p);
        memcpy(h + p, c->tokens, sizeof(int32_t) * (size_t)c->n_tokens);
    }
    if (!h || set_history(g, h, p + c->n_tokens, err) < 0) {   /* set_history fails having changed nothing */
        if (!h) ak_failc(err, AK_ERR_NOMEM, "out of memory");
        free(h);
        ak_kv_free(kv);
        return -1;
    }
    free(h);
    /* the descriptors: g's segments, its own positions frozen (if any), the card */
    int k = g->n_segs;
    if (ns > k) g->segs[k++] = (ak_store_seg){AK_SEG_OWN, 0, "", ""};   /* attach_base made them one */
    seg_named(g, k++, AK_SEG_CARD, c->id, c->hash);
    g->n_segs = k;
    ak_kv_free(g->kv);
    g->kv = kv;
    segs_sync(g);
    return 0;
}

int ak_agent_import_card(ak_agents *a, const char *id, const char *card_id, ak_error *err) {
    return ak_agent_import_card_mode(a, id, card_id, AK_IMPORT_REPLACE, err);
}

int ak_agent_import_card_mode(ak_agents *a, const char *id, const char *card_id, ak_import_mode mode, ak_error *err) {
    drain_results(a);
    if (!id || !ak_agent_id_valid(id))
        return ak_failc(err, AK_ERR_INVALID, "invalid agent id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    if (mode != AK_IMPORT_REPLACE && mode != AK_IMPORT_APPEND)
        return ak_failc(err, AK_ERR_INVALID, "unknown import mode %d", (int)mode);
    agent *g = find(a, id);
    if (g && (g->in_turn || g->restoring))
        return ak_failc(err, AK_ERR_BUSY, "agent %s is busy (a turn or a restore is in progress)", id);
    const ak_card *c = cards_resolve(a, card_id, err);
    if (!c) return -1;
    if (strcmp(c->fingerprint, a->cfg.model->fingerprint))
        return ak_failc(err, AK_ERR_STALE, "card %s was made with another model", card_id);
    if (c->n_tokens >= a->cfg.n_ctx)
        return ak_failc(err, AK_ERR_INVALID, "card %s: %d tokens do not fit the context of %d", card_id, c->n_tokens,
                        a->cfg.n_ctx);
    ak_store_entry se;
    if (!g && mode == AK_IMPORT_APPEND && a->cfg.store && ak_store_lookup(a->cfg.store, id, &se) == 0 &&
        !(g = create(a, id, err)))   /* an agent known only by its file: appended to after a restore */
        return -1;
    if (!g && !(g = create(a, id, err))) return -1;
    int append = 0;
    if (mode == AK_IMPORT_APPEND) {
        make_hot(a, g, err);   /* what the card goes after: restored if need be */
        if (!g->kv) return -1;
        append = g->n > 0;     /* after nothing, append is replace */
        if (append && g->n + c->n_tokens >= a->cfg.n_ctx)
            return ak_failc(err, AK_ERR_INVALID, "agent %s: its %d tokens and card %s's %d do not fit the context of %d",
                            id, g->n, card_id, c->n_tokens, a->cfg.n_ctx);
    }
    /* room for the card's blocks (replace: what the agent holds now is dropped after) */
    if (agents_ensure_room(a, ak_card_vector_bytes(c), g, err) < 0) return -1;
    int p = g->n;
    if (append) {
        if (import_append(a, g, c, err) < 0) return -1;
    } else {
        ak_kv *kv = ak_kv_new(a->cfg.pool, a->cfg.fk, a->cfg.fv, a->cfg.n_ctx, err);
        if (!kv) return -1;
        if (card_at(a, c, 0, kv, a->threads, err) < 0 || set_history(g, c->tokens, c->n_tokens, err) < 0) {
            ak_kv_free(kv);
            return -1;
        }
        ak_kv_free(g->kv);
        g->kv = kv;
        seg_named(g, 0, AK_SEG_CARD, c->id, c->hash);
        g->n_segs = 1;
        segs_sync(g);
    }
    g->pub_spans = ak_kv_span_count(g->kv);
    g->version = ++a->next_version;
    g->ahead = 0;
    touch(a, g);
    if (append) logf_(a, "agent %s: appended card %s (%d tokens after its %d)", id, c->id, c->n_tokens, p);
    else logf_(a, "agent %s: imported card %s (%d tokens)", id, c->id, c->n_tokens);
    return 0;
}

static int cmp_card_entry(const void *x, const void *y) {
    return strcmp(((const ak_store_card_entry *)x)->id, ((const ak_store_card_entry *)y)->id);
}

int ak_cards_list(ak_agents *a, ak_store_card_entry **out, int *n, ak_error *err) {
    ak_store_card_entry *v = NULL;
    int k = 0;
    if (a->cfg.store && ak_store_list_cards(a->cfg.store, &v, &k, err) < 0) return -1;
    ak_store_card_entry *w = realloc(v, sizeof *w * (size_t)(k + a->n_cards + 1));
    if (!w) {
        free(v);
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    v = w;
    int k0 = k;
    for (int i = 0; i < a->n_cards; i++) {
        const ak_card *c = a->cards[i];
        int have = 0;
        for (int j = 0; j < k0 && !have; j++) have = !strcmp(v[j].id, c->id);
        if (have) continue;
        ak_store_card_entry_of(c, &v[k++]);
    }
    qsort(v, (size_t)k, sizeof *v, cmp_card_entry);
    *out = v;
    *n = k;
    return 0;
}

/* 1 if one of g's segments is card card_id. */
static int holds_card(const agent *g, const char *card_id) {
    for (int k = 0; k < g->n_segs; k++)
        if (g->segs[k].kind == AK_SEG_CARD && !strcmp(g->segs[k].id, card_id)) return 1;
    return 0;
}

int ak_card_remove(ak_agents *a, const char *card_id, ak_error *err) {
    if (!card_id || !ak_agent_id_valid(card_id)) return ak_failc(err, AK_ERR_INVALID, "invalid card id");
    drain_results(a);
    /* its holders: agents in RAM, then agent files that record it */
    char names[8 * (AK_AGENT_ID_MAX + 2) + 8] = "";
    int held = 0;
    for (int i = 0; i < a->n; i++)
        if (holds_card(a->v[i], card_id) && (a->v[i]->kv || a->v[i]->n)) {
            if (held++ < 8) snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", held > 1 ? ", " : "", a->v[i]->id);
        }
    const ak_card *c = cards_find(a, card_id);
    ak_store_card_entry ce;
    const char *hash = c ? c->hash : NULL;
    if (!hash && a->cfg.store && ak_store_lookup_card(a->cfg.store, card_id, &ce) == 0) hash = ce.hash;
    if (a->cfg.store && hash) {
        ak_store_entry *es = NULL;
        int ne = 0;
        if (ak_store_list(a->cfg.store, &es, &ne, err) < 0) return -1;
        for (int i = 0; i < ne; i++) {
            int uses = 0;
            for (int k = 0; k < es[i].base.n_seg; k++)
                uses |= es[i].base.seg[k].kind == AK_SEG_CARD && !strcmp(es[i].base.seg[k].id, card_id) &&
                        !strcmp(es[i].base.seg[k].hash, hash);
            if (!uses) continue;
            agent *g = find(a, es[i].id);
            if (g && (g->kv || g->n) && !holds_card(g, card_id)) continue;   /* its file is older than what it holds */
            if (g && holds_card(g, card_id)) continue;   /* counted above */
            if (held++ < 8) snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", held > 1 ? ", " : "", es[i].id);
        }
        free(es);
    }
    if (held)
        return ak_failc(err, AK_ERR_BUSY, "card %s is held by %d agent%s: %s%s", card_id, held, held > 1 ? "s" : "", names,
                        held > 8 ? ", ..." : "");
    wait_saved(a, card_id);   /* its write, if queued, holds the card; and its file is then there to remove */
    int found = 0;
    for (int i = 0; i < a->n_cards; i++)
        if (!strcmp(a->cards[i]->id, card_id)) {
            ak_card_free(a->cards[i]);
            a->cards[i] = a->cards[--a->n_cards];
            found = 1;
            break;
        }
    if (a->cfg.store) {
        int r = ak_store_remove_card(a->cfg.store, card_id, err);
        if (r < 0) return -1;
        if (r == 0) found = 1;
    }
    return found ? 0 : 1;
}
