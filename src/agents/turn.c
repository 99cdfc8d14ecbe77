/* turn.c - turns (agent.h): open (token-level matching against the
 * agent's history, a pool attached, the content index linked, the agent
 * restored if cold), commit, append, step, end, abort; memories and
 * handoff spans placed in a turn; the bytes a request adds (admission).
 */
#include <stdlib.h>
#include <string.h>

#include "agents/agent_impl.h"
#include "agents/memories.h"
#include "agents/memories_impl.h"
#include "agents/pools_impl.h"
#include "agents/restore.h"
#include "engine/reuse.h"
#include "kv/prefix.h"
#include "kv/spanfind.h"

/* 1 if id is a valid agent id for flags (an ephemeral one is "." and a
 * valid id). */
static int id_ok(const char *id, int flags) {
    if (flags & AK_AGENT_EPHEMERAL) return id[0] == '.' && id[1] && ak_agent_id_valid(id + 1);
    return ak_agent_id_valid(id);
}

/* Makes g's cache start with pool p's blocks, unless it already does:
 * whatever it held is dropped (its formats become the pool's). Returns 0,
 * or -1 with err set (g is then emptied). */
static int attach_pool(ak_agents *a, agent *g, pool_rec *p, ak_error *err) {
    int lens[AK_KV_MAX_SEGMENTS];   /* its first segment is the pool's whole (cards may follow) */
    agent_segs_sync(g);
    if (!strcmp(g->pool, p->id) && !strcmp(g->pool_hash, p->hash) && ak_kv_segments(g->kv, lens) > 0 &&
        lens[0] == p->n && ak_kv_format_k(g->kv) == p->fk && ak_kv_format_v(g->kv) == p->fv)
        return 0;
    ak_kv *kv = ak_kv_new(a->cfg.pool, p->fk, p->fv, a->cfg.n_ctx, err);
    if (!kv || ak_kv_attach_base(kv, p->kv, p->n, err) < 0 || agent_set_history(g, p->tokens, p->n, err) < 0) {
        ak_kv_free(kv);
        ak_kv_truncate(g->kv, 0);
        g->n = 0;
        agent_segs_sync(g);
        return -1;
    }
    agent_set_base(g, kv, AK_SEG_POOL, p->id, p->hash);
    g->pub_spans = 0;
    g->version = ++a->next_version;
    a->linked_blocks += (uint64_t)ak_kv_n_blocks(kv);
    a->linked_bytes += ak_kv_bytes(kv);
    return 0;
}

/* agent.h. Memories (o->k of them; 0: none) cap what is reused. */
int ak_agent_open(ak_agents *a, const ak_turn_opts *o, ak_kv **kv, ak_turn *t, ak_error *err) {
    const char *id = o->id, *pool_id = o->pool_id;
    const int32_t *tokens = o->tokens;
    const int *at = o->at, *len = o->len;
    int flags = o->flags, n = o->n, n_reserve = o->n_reserve, k = o->k;
    for (int i = 0; i < k; i++)
        if (at[i] < (i ? at[i - 1] + len[i - 1] : 0) || len[i] < 1 || at[i] + len[i] > n)
            return ak_failc(err, AK_ERR_INVALID, "agent %s: memory %d at %d (%d tokens) is not inside the prompt after "
                            "the one before it", id, i, at[i], len[i]);
    memset(t, 0, sizeof *t);
    *kv = NULL;
    saves_drain(a->saves);
    if (!id_ok(id, flags))
        return ak_failc(err, AK_ERR_INVALID, "invalid agent id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    if (n < 1) return ak_failc(err, AK_ERR_INVALID, "agent %s: empty prompt", id);
    if (n > a->cfg.n_ctx) return ak_failc(err, AK_ERR_INVALID, "agent %s: prompt of %d tokens exceeds the context of %d", id, n, a->cfg.n_ctx);
    if (n_reserve < n) n_reserve = n;
    if (n_reserve > a->cfg.n_ctx) n_reserve = a->cfg.n_ctx;
    agent *g = agents_find(a, id);
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
    if (!g && !(g = agents_create(a, id, err))) return -1;
    g->ephemeral = (flags & AK_AGENT_EPHEMERAL) != 0;
    g->domain = o->domain;
    agent_touch(a, g);
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
        if (a->cfg.store && !g->ephemeral) agent_restore(a, g, t, err);
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
            agent_segs_sync(g);
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
    agent_segs_sync(g);   /* truncated into (or out of) its pool or cards */
    int nsp = ak_kv_span_count(g->kv);
    if (g->pub_spans > nsp) g->pub_spans = nsp;
    /* whole blocks of the prompt that someone computed already: linked */
    int blocks0 = ak_kv_n_blocks(g->kv);
    /* blocks linked from the content index stop before the first memory:
     * what follows it is the placed chunk's, not a prefill's */
    int link_to = k > 0 && at[0] < n - 1 ? at[0] : n - 1;
    int linked = a->cfg.no_prefix_sharing || g->impure ? 0 : ak_prefix_link(g->kv, tokens, link_to);
    if (linked > 0) {
        if (agent_set_history(g, tokens, keep + linked, err) < 0) {
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
    int ev = agents_ensure_room(a, agent_bytes_for(a, g, n_reserve) + o->extra, g, err);
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
    agent *g = agents_find(a, id);
    if (!g || !g->kv || !g->in_turn) return ak_failc(err, AK_ERR_INVALID, "agent %s: no turn in progress", id);
    int changed = n != g->n;
    if (agent_set_history(g, tokens, n, err) < 0) {
        ak_kv_truncate(g->kv, 0);
        g->n = 0;
        g->in_turn = 0;
        return -1;
    }
    if (changed) g->version = ++a->next_version;
    publish(a, g);
    agent_touch(a, g);
    return 0;
}

int ak_agent_append(ak_agents *a, const char *id, int32_t token, ak_error *err) {
    agent *g = agents_find(a, id);
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
    agent_touch(a, g);
    return 0;
}

int ak_agent_reserve(ak_agents *a, const char *id, int n_pos, size_t extra, ak_error *err) {
    agent *g = agents_find(a, id);
    if (!g || !g->kv) return ak_failc(err, AK_ERR_NOT_FOUND, "agent %s: not in memory", id);
    if (n_pos > a->cfg.n_ctx) return ak_failc(err, AK_ERR_INVALID, "agent %s: context of %d tokens is full", id, a->cfg.n_ctx);
    size_t need = agent_bytes_for(a, g, n_pos);
    return agents_ensure_room(a, need ? need + extra : 0, g, err) < 0 ? -1 : 0;
}

void ak_agent_abort(ak_agents *a, const char *id) {
    agent *g = agents_find(a, id);
    if (!g) return;
    if (g->kv) ak_kv_truncate(g->kv, g->n);
    g->in_turn = 0;
}

int ak_agent_place_memory(ak_agents *a, const ak_place_opts *o, ak_kv **kv, ak_error *err) {
    const char *id = o->id, *mem_id = o->mem_id;
    const int32_t *tokens = o->tokens;
    int at = o->at;
    agent *g = agents_find(a, id);
    if (!g || !g->kv || !g->in_turn) return ak_failc(err, AK_ERR_INVALID, "agent %s: no turn in progress", id);
    if (at < 0 || ak_kv_length(g->kv) != at)
        return ak_failc(err, AK_ERR_INVALID, "agent %s: a memory placed at %d, but the cache holds %d positions", id, at,
                        ak_kv_length(g->kv));
    mem_content mc;
    const ak_kv *src = mems_blocks_at(a, mem_id, at, ak_kv_format_k(g->kv), ak_kv_format_v(g->kv), &mc, err);
    if (!src) return -1;
    const int32_t *mt = mc.tokens;
    const char *hash = mc.hash;
    int n = mc.n;
    if (at + n >= a->cfg.n_ctx)
        return ak_failc(err, AK_ERR_INVALID, "agent %s: memory %s's %d tokens at %d do not fit the context of %d", id,
                        mem_id, n, at, a->cfg.n_ctx);
    if (memcmp(tokens + at, mt, sizeof(int32_t) * (size_t)n))
        return ak_failc(err, AK_ERR_INVALID, "agent %s: the prompt does not hold memory %s's tokens at %d", id, mem_id, at);
    /* the history so far is what the cache holds: the prompt's first `at` tokens */
    if (agent_set_history(g, tokens, at, err) < 0) return -1;
    agent_segs_sync(g);
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
    if (rc == 0) rc = agent_set_history(g, tokens, at + n, err);
    if (rc < 0) {
        ak_kv_free(nk);
        return -1;
    }
    /* descriptors: the positions before it frozen (if any), then the chunk,
     * both stored in the agent's file as its own (restored without the memory) */
    int k = g->n_segs;
    if (ns > k) g->segs[k++] = (ak_store_seg){.kind = AK_SEG_OWN, .len = 0, .id = "", .hash = ""};
    g->segs[k++] = (ak_store_seg){.kind = AK_SEG_OWN, .len = 0, .id = "", .hash = ""};
    g->n_segs = k;
    ak_kv_free(g->kv);
    g->kv = nk;
    agent_segs_sync(g);   /* impure: shifted keys are not what a prefill computes, never in the content index */
    g->pub_spans = ak_kv_span_count(nk);
    g->version = ++a->next_version;
    *kv = nk;
    logf_(a, "agent %s: memory %s (%d tokens, content %s) placed at %d", id, mem_id, n, hash, at);
    return 0;
}

/* Places part (part->tokens = tokens + at, at = what g's cache holds) in
 * agent g's open turn by p's method (ak_reuse_place), then freezes [0, at
 * + n) as one more own segment. Returns 0 (g->kv is then a new sequence),
 * or -1 with err set and g's cache holding [0, at). */
static int place_part(ak_agents *a, ak_ctx *c, agent *g, const int32_t *tokens, const ak_reuse_part *part,
                      const ak_reuse_params *p, ak_reuse_stats *st, ak_error *err) {
    int at = ak_kv_length(g->kv), n = part->n;
    int lens[AK_KV_MAX_SEGMENTS], ns = ak_kv_segments(g->kv, lens);
    if (ns + 1 > AK_KV_MAX_SEGMENTS)
        return ak_failc(err, AK_ERR_INVALID, "agent %s: its context is %d segments already: at most %d (each placed "
                        "memory or span ends one)", g->id, ns, AK_KV_MAX_SEGMENTS);
    if (agent_set_history(g, tokens, at, err) < 0) return -1;
    agent_segs_sync(g);
    if (ak_reuse_place(c, g->kv, part, p, st, err) < 0) return -1;   /* g->kv back at [0, at) */
    /* [0, at + n) frozen as one more own segment: the agent is impure (its
     * placed positions are not what a prefill computes: never in the content
     * index, restored as its own), and the correction, if any, goes with
     * the base (kvcache.h) */
    ak_kv *nk = ak_kv_new(a->cfg.pool, ak_kv_format_k(g->kv), ak_kv_format_v(g->kv), a->cfg.n_ctx, err);
    int rc = nk ? ak_kv_attach_base(nk, g->kv, at + n, err) : -1;
    if (rc == 0) rc = agent_set_history(g, tokens, at + n, err);
    if (rc < 0) {
        ak_kv_free(nk);
        ak_kv_truncate(g->kv, at);
        return -1;
    }
    int k = g->n_segs;
    if (ak_kv_segments(nk, lens) > k) g->segs[k++] = (ak_store_seg){.kind = AK_SEG_OWN, .len = 0, .id = "", .hash = ""};
    g->n_segs = k;
    ak_kv_free(g->kv);
    g->kv = nk;
    agent_segs_sync(g);
    g->pub_spans = ak_kv_span_count(nk);
    g->version = ++a->next_version;
    return 0;
}

int ak_agent_reuse_memory(ak_agents *a, ak_ctx *c, const ak_place_opts *o, const ak_reuse_params *p, ak_kv **kv,
                          ak_reuse_stats *st, ak_error *err) {
    const char *id = o->id, *mem_id = o->mem_id;
    const int32_t *tokens = o->tokens;
    int at = o->at;
    agent *g = agents_find(a, id);
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
    ak_reuse_part part = {.tokens = tokens + at, .n = n, .chunk = src};
    if (place_part(a, c, g, tokens, &part, p, st, err) < 0) return -1;
    *kv = g->kv;
    logf_(a, "agent %s: memory %s (%d tokens, content %s) placed at %d by %s (ratio %.3f, %d recomputed)", id, mem_id,
          n, mi.hash, at, ak_reuse_method_name(p->method), (double)p->ratio, st ? st->n_recomputed : -1);
    return 0;
}

/* 1 when g may lend a span to a turn of domain d asked by agent `asker`:
 * hot, idle, of that domain, its cache's stored K/V what its forward pass
 * computed (no correction range, no mixed card block). */
static int span_source_ok(const agent *g, const char *asker, uint32_t d) {
    return g->kv && !g->in_turn && !g->restoring && g->domain == d && strcmp(g->id, asker) &&
           ak_kv_corrections(g->kv) == 0 && !ak_kv_has_mixed(g->kv);
}

/* Positions of g's history its cache holds. */
static int span_source_len(const agent *g) {
    int len = ak_kv_length(g->kv);
    return g->n < len ? g->n : len;
}

int ak_agents_find_span(const ak_agents *a, const ak_span_query *q, ak_span_found *out, ak_error *err) {
    memset(out, 0, sizeof *out);
    ak_span_finder *f = ak_span_finder_new(q->tokens, q->from, q->upto, q->min_len, err);
    if (!f) return -1;
    ak_span best = {.len = 0};
    for (int i = 0; i < a->n; i++) {
        const agent *g = a->v[i];
        if (span_source_ok(g, q->id, q->domain)) ak_span_scan(f, g->tokens, span_source_len(g), i, &best);
    }
    ak_span_finder_free(f);
    if (!best.len) return 0;
    snprintf(out->src, sizeof out->src, "%s", a->v[best.source]->id);
    out->at = best.at;
    out->src_at = best.src_at;
    out->len = best.len;
    return 1;
}

int ak_agent_reuse_span(ak_agents *a, ak_ctx *c, const ak_span_place *o, const ak_reuse_params *p, ak_kv **kv,
                        ak_reuse_stats *st, ak_error *err) {
    agent *g = agents_find(a, o->id);
    if (!g || !g->kv || !g->in_turn) return ak_failc(err, AK_ERR_INVALID, "agent %s: no turn in progress", o->id);
    int at = o->at, n = o->n;
    if (at < 0 || ak_kv_length(g->kv) != at)
        return ak_failc(err, AK_ERR_INVALID, "agent %s: a span placed at %d, but the cache holds %d positions", o->id,
                        at, ak_kv_length(g->kv));
    if (n < 1 || at + n >= a->cfg.n_ctx)
        return ak_failc(err, AK_ERR_INVALID, "agent %s: a span of %d tokens at %d does not fit the context of %d",
                        o->id, n, at, a->cfg.n_ctx);
    const agent *s = o->src ? agents_find(a, o->src) : NULL;
    if (!s || !span_source_ok(s, o->id, g->domain) || o->src_at < 0 || o->src_at + n > span_source_len(s) ||
        memcmp(s->tokens + o->src_at, o->tokens + at, sizeof(int32_t) * (size_t)n))
        return ak_failc(err, AK_ERR_NOT_FOUND, "agent %s: agent %s no longer holds the span's %d tokens", o->id,
                        o->src ? o->src : "(none)", n);
    ak_reuse_part part = {.tokens = o->tokens + at, .n = n, .chunk = s->kv, .src_at = o->src_at};
    if (place_part(a, c, g, o->tokens, &part, p, st, err) < 0) return -1;
    *kv = g->kv;
    logf_(a, "agent %s: %d tokens of agent %s (at %d there) placed at %d by %s (ratio %.3f, %d recomputed)", o->id, n,
          s->id, o->src_at, at, ak_reuse_method_name(p->method), (double)p->ratio, st ? st->n_recomputed : -1);
    return 0;
}

int ak_agent_begin(ak_agents *a, ak_ctx *c, const char *id, const int32_t *tokens, int n, float *logits,
                   ak_turn *t, ak_error *err) {
    ak_kv *kv;
    if (ak_agent_open(a, &(ak_turn_opts){.id = id, .tokens = tokens, .n = n, .n_reserve = n}, &kv, t, err) < 0)
        return -1;
    double t0 = ak_now();
    if (ak_eval(c, kv, &(ak_eval_args){.tokens = tokens + t->reused, .n = t->prefilled, .pos0 = t->reused,
                .logits = logits}, err) < 0) {
        ak_agent_abort(a, id); /* whatever was written past the history is not trusted */
        return -1;
    }
    t->prefill_ms = (ak_now() - t0) * 1e3;
    return ak_agent_commit(a, id, tokens, n, err);
}

int ak_agent_step(ak_agents *a, ak_ctx *c, const char *id, int32_t token, float *logits, ak_error *err) {
    agent *g = agents_find(a, id);
    if (!g || !g->kv || !g->in_turn) return ak_failc(err, AK_ERR_INVALID, "agent %s: no turn in progress", id);
    if (ak_agent_reserve(a, id, g->n + 1, 0, err) < 0) return -1;
    if (ak_eval(c, g->kv, &(ak_eval_args){.tokens = &token, .n = 1, .pos0 = g->n, .logits = logits}, err) < 0) {
        ak_kv_truncate(g->kv, g->n);
        return -1;
    }
    return ak_agent_append(a, id, token, err);
}

int ak_agent_end(ak_agents *a, const char *id, ak_error *err) {
    saves_drain(a->saves);
    agent *g = agents_find(a, id);
    if (!g) return ak_failc(err, AK_ERR_NOT_FOUND, "agent %s: unknown", id);
    g->in_turn = 0;
    if (a->cfg.save == AK_SAVE_EVERY_TURN && agent_save(a, g, 0, err) < 0) return -1;
    return 0;
}

size_t ak_agent_bytes_to_add(const ak_agents *ca, const char *id, const char *pool_id, const int32_t *tokens, int n,
                             int n_pos) {
    ak_agents *a = (ak_agents *)ca;   /* a scratch sequence takes references for a moment; nothing else changes */
    const agent *g = agents_find(a, id);
    if (n_pos > a->cfg.n_ctx) n_pos = a->cfg.n_ctx;
    if (n > n_pos) n = n_pos;
    /* a turn in progress holds its prompt already: it adds what it grows
     * into (the scheduler asks this of every running request each step,
     * so no scratch sequence here) */
    if (g && g->kv && g->in_turn) return agent_bytes_for(a, g, n_pos);
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
        if (!(kv = ak_kv_fork(g->kv, &e))) return agent_bytes_for(a, g, n_pos);
        ak_kv_truncate(kv, common < n ? common : n - 1);
    } else {
        if (!(kv = ak_kv_new(a->cfg.pool, a->cfg.fk, a->cfg.fv, a->cfg.n_ctx, &e))) return ak_agents_bytes_for(a, n_pos);
    }
    if (n > 0 && ak_kv_length(kv) < n - 1 && !a->cfg.no_prefix_sharing && !(g && g->kv && g->impure && ak_kv_base_len(kv) > 0))
        ak_prefix_link(kv, tokens, n - 1);
    size_t bytes = agents_kv_grow_bytes(a, kv, n_pos);
    ak_kv_free(kv);
    return bytes;
}
