/* registry.c - the agent registry (agent_impl.h): the agents known this
 * run, find and create, the LRU clock, eviction under the KV budget and the
 * byte accounting of admission; saving agents through the save queue
 * (save_queue.h) and flushing it; the listing and the agent.h queries.
 *
 * Making room evicts idle agents least recently used first; when none is
 * left the resident sets (pools, memories) registered with the registry
 * are asked, in slot order, to drop something. The registry knows nothing
 * else of them.
 *
 * Saving. An agent's history has a version (from one counter for all agents,
 * so a version never repeats, not even for a removed and re-created id); the
 * agent is dirty while the version confirmed on disk is not its current one.
 * A save copies the cache into a snapshot (engine thread) and queues it for
 * the save queue's writer; the agent stays dirty until the queue reports
 * that the file is in place (save_applied, the queue's hook). Waiting for
 * saves (flush, a restore of the same agent, shutdown) skips the retries'
 * backoff.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agents/agent_impl.h"

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

/* The save queue's hook (save_queue_config.applied): applies the outcome r
 * of a write to its agent (nothing for a card's, or for an agent removed
 * since). */
static void save_applied(void *owner, const save_result *r) {
    agent *g = r->card ? NULL : agents_find(owner, r->id);
    if (!g) return;
    if (r->ok) {
        if (r->version > g->saved) g->saved = r->version;
        if (g->saved >= g->version) g->save_failed = 0;
    } else if (r->version >= g->saved) {
        g->save_failed = g->saved != g->version;
        snprintf(g->save_error, sizeof g->save_error, "%s", r->error);
        g->save_code = r->code;
    }
    if (g->queued == r->version) g->queued = 0;   /* a later save may snapshot again */
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
    save_queue_config sq = {.store = cfg->store, .disk_budget = cfg->disk_budget, .log = cfg->log,
                            .log_ud = cfg->log_ud, .applied = save_applied, .owner = a};
    if (!(a->saves = saves_new(&sq, err))) {
        free(a);
        return NULL;
    }
    return a;
}

/* Frees g (its sequence and history); NULL is a no-op. */
static void free_agent(agent *g) {
    if (!g) return;
    ak_kv_free(g->kv);
    free(g->tokens);
    free(g);
}

/* Brings g's base bookkeeping in line with its sequence (when hot): its
 * segment descriptors are the first ak_kv_segments of them, with kvcache's
 * lengths (a truncation shortens or drops segments); pool / card name the
 * first segment when it is a pool's or a card's; impure when a card or
 * positions frozen under one are held (agent.h). */
void agent_segs_sync(agent *g) {
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
void agent_seg_named(agent *g, int k, int kind, const char *id, const char *hash) {
    memset(&g->segs[k], 0, sizeof g->segs[k]);
    g->segs[k].kind = kind;
    snprintf(g->segs[k].id, sizeof g->segs[k].id, "%s", id);
    snprintf(g->segs[k].hash, sizeof g->segs[k].hash, "%s", hash);
}

/* agent_impl.h */
void agent_set_base(agent *g, ak_kv *kv, int kind, const char *id, const char *hash) {
    ak_kv_free(g->kv);
    g->kv = kv;
    agent_seg_named(g, 0, kind, id, hash);
    g->n_segs = 1;
    agent_segs_sync(g);
}

void ak_agents_free(ak_agents *a) {
    if (!a) return;
    saves_drain(a->saves);
    for (int i = 0; i < a->n; i++) {
        ak_error err = {{0}};
        if (agent_save(a, a->v[i], 0, &err) < 0) logf_(a, "agent %s: save at shutdown failed: %s", a->v[i]->id, err.msg);
    }
    saves_free(a->saves); /* writes everything queued (retries included, without backoff), then ends */
    a->saves = NULL;
    for (int i = 0; i < a->n; i++) {
        agent *g = a->v[i];
        if (agent_is_dirty(g) && !g->ephemeral && a->cfg.store)
            logf_(a, "agent %s: NOT saved (%d tokens lost): %s", g->id, g->n,
                  g->save_error[0] ? g->save_error : "no save succeeded");
        free_agent(g);
    }
    for (int s = 0; s < AK_RESIDENT_SLOTS; s++)
        if (a->resident[s]) a->resident[s]->free_all(a);
    free(a->v);
    free(a);
}

void agent_touch(ak_agents *a, agent *g) {
    g->last_use = ++a->clock;
    g->last_unix = (int64_t)time(NULL);
}

agent *agents_find(const ak_agents *a, const char *id) {
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->v[i]->id, id)) return a->v[i];
    return NULL;
}

agent *agents_create(ak_agents *a, const char *id, ak_error *err) {
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

int agent_set_history(agent *g, const int32_t *tokens, int n, ak_error *err) {
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

/* Saves g if its file is not current and no save of its current history is
 * already on its way: copies its cache into a snapshot (the only part done
 * on this thread) and queues the write. sync = 1 (or no writer) writes it
 * here and reports its error. g stays dirty until the write is confirmed.
 * Returns 0, or -1 with err set. */
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
    if (sync || !saves_running(a->saves)) {
        if (saves_write_now(a->saves, g->id, snap, err) < 0) {
            g->save_failed = 1;
            snprintf(g->save_error, sizeof g->save_error, "%s", err ? err->msg : "");
            g->save_code = err ? err->code : AK_ERR_IO;
            return -1;
        }
        g->saved = g->version;
        g->save_failed = 0;
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
    saves_enqueue(a->saves, p);
    g->queued = g->version;
    return 0;
}

int ak_agents_flush(ak_agents *a, ak_error *err) {
    if (!a->cfg.store) return 0;
    saves_drain(a->saves);
    for (int i = 0; i < a->n; i++) {
        ak_error e = {{0}};
        agent *g = a->v[i];
        if (agent_save(a, g, 0, &e) < 0) {   /* no snapshot (out of memory): it stays dirty, named below */
            g->save_failed = 1;
            snprintf(g->save_error, sizeof g->save_error, "%s", e.msg);
            g->save_code = e.code;
        }
    }
    saves_wait(a->saves, NULL);
    saves_drain(a->saves);
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
    saves_drain(a->saves);
    int n = 0;
    for (int i = 0; i < a->n; i++) n += a->cfg.store && !a->v[i]->ephemeral && agent_is_dirty(a->v[i]);
    return n;
}

void ak_agents_save_stats(ak_agents *a, ak_save_stats *st) {
    memset(st, 0, sizeof *st);
    st->unsaved = ak_agents_unsaved(a);
    st->disk_budget = a->cfg.disk_budget;
    saves_counts(a->saves, st);
}

/* Moves one agent out of RAM: writes it if its file is not current, frees
 * its blocks. Without a store its memory is simply dropped (cold next time). */
static int evict(ak_agents *a, agent *g, ak_error *err) {
    if (a->cfg.store && agent_is_dirty(g) && agent_save(a, g, 0, err) < 0) return -1;
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

/* agent_impl.h */
void agents_resident_register(ak_agents *a, ak_resident_slot slot, const ak_resident_ops *ops) { a->resident[slot] = ops; }

/* Asks the resident sets, in slot order, to drop one thing; returns 1 once
 * one did, or 0 if none could. */
static int resident_evict_one(ak_agents *a) {
    for (int s = 0; s < AK_RESIDENT_SLOTS; s++)
        if (a->resident[s] && a->resident[s]->evict_one && a->resident[s]->evict_one(a)) return 1;
    return 0;
}

/* Makes room for `need` more bytes by evicting least-recently-used agents
 * other than `keep` that are not in a turn nor pinned. Returns the number evicted, or -1
 * with err set when even evicting every idle agent cannot make room. */
int agents_ensure_room(ak_agents *a, size_t need, const agent *keep, ak_error *err) {
    int evicted = 0;
    if (need == 0) return 0;
    while (pool_free(a) < need) {
        agent *lru = NULL;
        for (int i = 0; i < a->n; i++) {
            agent *g = a->v[i];
            if (g == keep || !g->kv || g->in_turn || g->pins) continue;
            if (!lru || g->last_use < lru->last_use) lru = g;
        }
        if (!lru && resident_evict_one(a)) continue;
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
size_t agents_spans_bytes(const ak_agents *a, int nb, ak_kv_format fk, ak_kv_format fv) {
    ak_block_pool *p = a->cfg.pool;
    if (ak_block_pool_groups(p) < 2) return (size_t)nb * ak_block_pool_block_bytes(p, fk, fv);
    int T = ak_block_pool_block_tokens(p), cap = (ak_block_pool_spec(p)->window + T - 1) / T + 1;
    return (size_t)nb * ak_block_pool_group_bytes(p, 0, fk, fv) +
           (size_t)(nb < cap ? nb : cap) * ak_block_pool_group_bytes(p, 1, fk, fv);
}

/* Bytes of the blocks kv lacks to hold n_pos positions. */
size_t agents_kv_grow_bytes(const ak_agents *a, const ak_kv *kv, int n_pos) {
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

size_t agent_bytes_for(const ak_agents *a, const agent *g, int n_pos) {
    return g->kv ? agents_kv_grow_bytes(a, g->kv, n_pos) : ak_agents_bytes_for(a, n_pos);
}

size_t ak_agent_bytes_needed(const ak_agents *a, const char *id, int n_pos) {
    const agent *g = agents_find(a, id);
    if (!g) return ak_agents_bytes_for(a, n_pos);
    return agent_bytes_for(a, g, n_pos);
}

size_t ak_agents_bytes_for(const ak_agents *a, int n_pos) {
    int T = ak_block_pool_block_tokens(a->cfg.pool);
    return agents_spans_bytes(a, (n_pos + T - 1) / T, a->cfg.fk, a->cfg.fv);
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
        saves_wait(a->saves, id);
        int r = ak_store_remove(a->cfg.store, id, err);
        if (r < 0) return -1;
        if (r == 0) found = 1;
    }
    return found ? 0 : 1;
}

int ak_agent_save(ak_agents *a, const char *id, ak_error *err) {
    saves_drain(a->saves);
    agent *g = agents_find(a, id);
    if (!g || !a->cfg.store || g->ephemeral) return 0;
    if (g->in_turn || g->restoring)
        return ak_failc(err, AK_ERR_BUSY, "agent %s is busy (a turn or a restore is in progress)", id);
    if (g->kv) return agent_save(a, g, 1, err);
    saves_wait(a->saves, id);   /* evicted: its snapshot is queued or being retried */
    saves_drain(a->saves);
    if (agent_is_dirty(g))
        return ak_failc(err, g->save_code ? g->save_code : AK_ERR_IO, "agent %s could not be saved: %s", id,
                        g->save_error[0] ? g->save_error : "unknown error");
    return 0;
}

int ak_agent_evict(ak_agents *a, const char *id, ak_error *err) {
    saves_drain(a->saves);
    agent *g = agents_find(a, id);
    if (!g || !g->kv) return 0;
    if (g->in_turn || g->restoring)
        return ak_failc(err, AK_ERR_BUSY, "agent %s is busy (a turn or a restore is in progress)", id);
    return evict(a, g, err);
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
    out->dirty = agent_is_dirty(g) && !g->ephemeral;
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

int ak_agents_listing(const ak_agents *a, const ak_listing_opts *o, ak_agent_entry **out, int *n,
                      ak_agents_census *census, ak_error *err) {
    const ak_store_entry *files = o->files;
    int n_files = o->n_files;
    int (*busy)(void *ud, const char *id) = o->busy;
    void *ud = o->ud;
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
    const agent *g = agents_find(a, id);
    if (!g || !g->kv) return 0;
    int common = 0;
    while (common < g->n && common < n && g->tokens[common] == tokens[common]) common++;
    return common;
}

const int32_t *ak_agent_history(const ak_agents *a, const char *id, int *n) {
    const agent *g = agents_find(a, id);
    *n = g && g->kv ? g->n : 0;
    return *n ? g->tokens : NULL;
}

int ak_agent_hot(const ak_agents *a, const char *id) {
    const agent *g = agents_find(a, id);
    return g && g->kv;
}

int ak_agent_prefix_held(const ak_agents *a, const char *id, const int32_t *tokens, int n) {
    const agent *g = agents_find(a, id);
    if (!g || !g->kv) return 0;
    int lim = ak_kv_length(g->kv) < g->n ? ak_kv_length(g->kv) : g->n, c = 0;
    if (lim > n) lim = n;
    while (c < lim && g->tokens[c] == tokens[c]) c++;
    return c;
}

int ak_agent_publishes(const ak_agents *a, const char *id) {
    const agent *g = agents_find(a, id);
    return !a->cfg.no_prefix_sharing && g && g->kv && !g->impure;
}

int ak_agent_restoring(const ak_agents *a, const char *id) {
    const agent *g = agents_find(a, id);
    return g && g->restoring;
}

void ak_agents_set_threads(ak_agents *a, ak_threads *threads) { a->threads = threads; }
