/* restore.c - restores (restore.h): an agent's file brought back into RAM
 * on the engine's thread at a turn's open, or prepared there, run on an I/O
 * thread and finished on the engine's (prefetch, ak_restore_job). A file's
 * base names pools and cards: a restore links their blocks instead of
 * reading them (the prelink), and its own blocks go into the content index.
 */
#include <stdlib.h>
#include <string.h>

#include "agents/agent_impl.h"
#include "agents/card_set.h"
#include "agents/pools_impl.h"
#include "agents/restore.h"
#include "kv/prefix.h"
#include "store/cards.h"

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
    struct prelink_ctx *prelink;   /* what the restore links instead of reading */
};

/* Frees what pc holds and empties it. */
static void prelink_clear(prelink_ctx *pc) {
    for (int k = 0; k < pc->n_seg; k++) {
        ak_kv_free(pc->seg[k].kv);
        free(pc->seg[k].tokens);
    }
    memset(pc, 0, sizeof *pc);
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
            if (!kv || cards_attach_at(a, c, at, kv, NULL, &pe) < 0 || !(r->tokens = malloc(sizeof(int32_t) * (size_t)c->n_tokens))) {
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
 * group's only as agents_spans_bytes counts them (a version 7 file holds no
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
    return agents_spans_bytes(a, blocks, fk, fv);
}

/* After a hit: g's history is the file's, its base the file's segments
 * (the prelink checked each pool's and card's hash). */
static void restored(ak_agents *a, agent *g, const ak_store_load_info *info) {
    g->n_segs = info->base.n_seg;
    memcpy(g->segs, info->base.seg, sizeof g->segs);
    agent_segs_sync(g);
    g->pub_spans = ak_kv_span_count(g->kv);   /* published by the restore */
    g->version = g->saved = ++a->next_version;
    g->save_failed = 0;
    int nb = ak_kv_blocks_for(g->kv, info->linked);
    a->linked_blocks += (uint64_t)nb;
    a->linked_bytes += (uint64_t)nb * ak_block_pool_block_bytes(a->cfg.pool, ak_kv_format_k(g->kv), ak_kv_format_v(g->kv));
}

/* Brings g's cache into RAM from the store if there is a usable file. */
void agent_restore(ak_agents *a, agent *g, ak_turn *t, ak_error *err) {
    ak_store_entry e;
    ak_error ie = {{0}};
    saves_wait(a->saves, g->id); /* its last save may still be on its way to disk */
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
    const ak_store_load_args la = {.id = g->id, .fingerprint = a->cfg.model->fingerprint,
                                   .vocab = a->cfg.model->cfg.vocab, .kv = kv, .prelink = prelink, .ud = &pc};
    ak_store_status st = ak_store_load_linked(a->cfg.store, &la, &info, &ie);
    int impure = pc.impure;
    prelink_clear(&pc);
    if (st == AK_STORE_HIT && agent_set_history(g, info.tokens, info.n_tokens, err) == 0) {
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

int ak_agent_prefetch(ak_agents *a, const char *id, size_t extra, ak_restore_job **job, ak_error *err) {
    *job = NULL;
    if (!a->cfg.store || !ak_agent_id_valid(id)) return 0;
    agent *g = agents_find(a, id);
    if (g && (g->kv || g->in_turn || g->restoring)) return 0;
    saves_wait(a->saves, id);
    ak_store_entry e;
    ak_error ie = {{0}};
    if ((ak_store_lookup(a->cfg.store, id, &e) != 0 && ak_store_inspect(a->cfg.store, id, &e, NULL, &ie) != 0) ||
        !e.readable)
        return 0;
    size_t need = restore_bytes(a, &e);
    if (!g && !(g = agents_create(a, id, err))) return -1;
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
    const ak_store_load_args la = {.id = j->id, .fingerprint = j->fingerprint, .vocab = j->vocab, .kv = j->kv,
                                   .prelink = prelink, .ud = j->prelink};
    j->status = ak_store_load_linked(j->store, &la, &j->info, &j->err);
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
    agent *g = agents_find(a, j->id);
    if (g) g->restoring = 0;
    if (j->status == AK_STORE_HIT && g && !g->kv && agent_set_history(g, j->info.tokens, j->info.n_tokens, &j->err) == 0) {
        g->kv = j->kv;
        j->kv = NULL;
        restored(a, g, &j->info);
        g->ahead = 1;
        g->ahead_ms = j->info.total_ms;
        g->ahead_bytes = j->info.bytes_read;
        agent_touch(a, g);
    } else if (j->status != AK_STORE_HIT && j->status != AK_STORE_ABSENT) {
        logf_(a, "agent %s: cache %s, recomputing: %s", j->id, ak_store_status_name(j->status), j->err.msg);
    }
    prelink_clear(j->prelink);
    free(j->prelink);
    ak_kv_free(j->kv);
    free(j->info.tokens);
    free(j);
}

/* Brings agent g's cache into RAM (restoring it) if it is not. */
void agent_make_hot(ak_agents *a, agent *g, ak_error *err) {
    if (g->kv) return;
    g->n = 0;
    if (!(g->kv = ak_kv_new(a->cfg.pool, a->cfg.fk, a->cfg.fv, a->cfg.n_ctx, err))) return;
    ak_turn t;
    memset(&t, 0, sizeof t);
    if (a->cfg.store && !g->ephemeral) agent_restore(a, g, &t, err);
    agent_segs_sync(g);   /* a miss leaves it empty */
}
