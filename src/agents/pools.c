/* pools.c - pools: named, write-once shared prefixes (agent.h).
 *
 * A pool is known to this process by a record (pool_rec, pools_impl.h):
 * created here (ak_pool_begin .. ak_pool_commit), or found in the store the
 * first time something names it. Its blocks are resident while kv is set;
 * an idle pool may be dropped from RAM to make room (its file brings it
 * back), but only when the store has it and no agent shares its blocks
 * (dropping it then would free nothing). Pool blocks go into the content
 * index too (prefix.h): an agent that prefills the same document privately
 * in the same formats links them.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agents/pools_impl.h"
#include "kv/prefix.h"

int ak_pool_id_valid(const char *id) { return ak_agent_id_valid(id); }

pool_rec *pools_find(const ak_agents *a, const char *id) {
    for (int i = 0; i < a->n_pools; i++)
        if (!strcmp(a->pools[i]->id, id)) return a->pools[i];
    return NULL;
}

static void rec_free(pool_rec *p) {
    if (!p) return;
    ak_kv_free(p->kv);
    free(p->tokens);
    free(p->source);
    free(p);
}

/* Frees every pool record (the registry's resident set hook). */
static void pools_free_all(ak_agents *a) {
    for (int i = 0; i < a->n_pools; i++) rec_free(a->pools[i]);
    free(a->pools);
    a->pools = NULL;
    a->n_pools = a->cap_pools = 0;
}

/* Drops one idle resident pool that the store can give back and whose
 * blocks no agent shares; returns 1, or 0 if there is none (the
 * registry's resident set hook). */
static int pools_evict_one(ak_agents *a) {
    if (!a->cfg.store) return 0;
    for (int i = 0; i < a->n_pools; i++) {
        pool_rec *p = a->pools[i];
        if (!p->kv || p->building || ak_kv_private_bytes(p->kv) == 0) continue;
        ak_kv_free(p->kv);
        p->kv = NULL;
        logf_(a, "pool %s: dropped from RAM (its file stays)", p->id);
        return 1;
    }
    return 0;
}

static const ak_resident_ops pool_set = {.evict_one = pools_evict_one, .free_all = pools_free_all};

/* Takes p into the list. Returns 0, or -1 with err set. */
static int rec_add(ak_agents *a, pool_rec *p, ak_error *err) {
    agents_resident_register(a, AK_RESIDENT_POOLS, &pool_set);
    if (a->n_pools == a->cap_pools) {
        int nc = a->cap_pools ? 2 * a->cap_pools : 4;
        pool_rec **nv = realloc(a->pools, sizeof *nv * (size_t)nc);
        if (!nv) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
        a->pools = nv;
        a->cap_pools = nc;
    }
    a->pools[a->n_pools++] = p;
    return 0;
}

static void rec_del(ak_agents *a, pool_rec *p) {
    for (int i = 0; i < a->n_pools; i++)
        if (a->pools[i] == p) {
            a->pools[i] = a->pools[--a->n_pools];
            break;
        }
    rec_free(p);
}

static ak_err_code status_code(ak_store_status st) {
    switch (st) {
    case AK_STORE_ABSENT: return AK_ERR_NOT_FOUND;
    case AK_STORE_STALE: return AK_ERR_STALE;
    case AK_STORE_CORRUPT: return AK_ERR_CORRUPT;
    default: return AK_ERR_IO;
    }
}

/* Loads p's blocks from the store into RAM (p not resident). Returns 0, or
 * -1 with err set. */
static int load_blocks(ak_agents *a, pool_rec *p, const ak_store_pool_entry *e, ak_error *err) {
    ak_error le = {{0}};
    size_t need = (size_t)ak_block_pool_block_bytes(a->cfg.pool, e->e.fk, e->e.fv) *
                  (size_t)((e->e.n_tokens + ak_block_pool_block_tokens(a->cfg.pool) - 1) /
                           ak_block_pool_block_tokens(a->cfg.pool));
    if (agents_ensure_room(a, need, NULL, err) < 0) return -1;
    ak_kv *kv = ak_kv_new(a->cfg.pool, e->e.fk, e->e.fv, a->cfg.n_ctx, err);
    if (!kv) return -1;
    ak_kv_set_window_release(kv, 0);   /* shared: every block of both layer groups stays (see ak_pool_begin) */
    int32_t *tok = NULL;
    int n = 0;
    char hash[17] = "";
    const ak_store_load_args la = {.id = p->id, .fingerprint = a->cfg.model->fingerprint,
                                   .vocab = a->cfg.model->cfg.vocab, .kv = kv};
    ak_store_status st = ak_store_load_pool(a->cfg.store, &la, &tok, &n, hash, &le);
    if (st != AK_STORE_HIT) {
        ak_kv_free(kv);
        int code = st == AK_STORE_ERROR && le.code ? le.code : (int)status_code(st);
        if (st == AK_STORE_ABSENT) return ak_failc(err, code, "pool %s does not exist", p->id);
        if (st == AK_STORE_STALE) return ak_failc(err, code, "pool %s cannot be used: %s", p->id, le.msg);
        return ak_failc(err, code, "pool %s: %s", p->id, le.msg);
    }
    free(p->tokens);
    p->tokens = tok;
    p->n = n;
    p->fk = e->e.fk;
    p->fv = e->e.fv;
    snprintf(p->hash, sizeof p->hash, "%s", hash);
    p->kv = kv;
    int next = 0;
    ak_prefix_publish(kv, tok, n, &next);
    logf_(a, "pool %s: loaded (%d tokens, %s/%s)", p->id, n, ak_kv_format_get(p->fk)->name, ak_kv_format_get(p->fv)->name);
    return 0;
}

pool_rec *pools_resolve(ak_agents *a, const char *id, ak_error *err) {
    if (!ak_pool_id_valid(id)) {
        ak_failc(err, AK_ERR_INVALID, "invalid pool id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
        return NULL;
    }
    pool_rec *p = pools_find(a, id);
    if (p && p->building) {
        ak_failc(err, AK_ERR_BUSY, "pool %s is being created", id);
        return NULL;
    }
    if (p && p->kv) return p;
    ak_store_pool_entry e;
    if (!a->cfg.store || ak_store_lookup_pool(a->cfg.store, id, &e) != 0) {
        ak_failc(err, AK_ERR_NOT_FOUND, "pool %s does not exist", id);
        return NULL;
    }
    int fresh = !p;
    if (fresh) {
        if (!(p = ak_calloc(1, sizeof *p, err))) {
            free(e.source);
            return NULL;
        }
        snprintf(p->id, sizeof p->id, "%s", id);
        p->created = e.e.created;
        p->source = e.source;
        e.source = NULL;
    }
    free(e.source);
    p->file_bytes = e.e.bytes;
    if (load_blocks(a, p, &e, err) < 0 || (fresh && rec_add(a, p, err) < 0)) {
        if (fresh) rec_free(p);
        return NULL;
    }
    return p;
}

/* ---- creating --------------------------------------------------------- */

int ak_pool_begin(ak_agents *a, const ak_pool_request *rq, ak_kv **kv, ak_error *err) {
    const char *id = rq->id, *source = rq->source;
    const int32_t *tokens = rq->tokens;
    int n = rq->n;
    ak_kv_format fk = rq->fk, fv = rq->fv;
    *kv = NULL;
    if (!ak_pool_id_valid(id))
        return ak_failc(err, AK_ERR_INVALID, "invalid pool id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    if (n < 1) return ak_failc(err, AK_ERR_INVALID, "pool %s: no tokens", id);
    if (n >= a->cfg.n_ctx)
        return ak_failc(err, AK_ERR_INVALID, "pool %s: %d tokens do not fit the context of %d (agents need room for their own)",
                        id, n, a->cfg.n_ctx);
    ak_store_pool_entry e;
    if (pools_find(a, id) || (a->cfg.store && ak_store_lookup_pool(a->cfg.store, id, &e) == 0)) {
        if (!pools_find(a, id)) free(e.source);
        return ak_failc(err, AK_ERR_EXISTS, "pool %s exists (pools are write-once: delete it first)", id);
    }
    pool_rec *p = ak_calloc(1, sizeof *p, err);
    if (!p) return -1;
    snprintf(p->id, sizeof p->id, "%s", id);
    p->fk = fk;
    p->fv = fv;
    p->n = n;
    p->building = 1;
    if (!(p->tokens = malloc(sizeof(int32_t) * (size_t)n)) || (source && !(p->source = strdup(source)))) {
        rec_free(p);
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    memcpy(p->tokens, tokens, sizeof(int32_t) * (size_t)n);
    if (!(p->kv = ak_kv_new(a->cfg.pool, fk, fv, a->cfg.n_ctx, err))) {
        rec_free(p);
        return -1;
    }
    /* a pool's sliding-window layers keep every block (kvcache.h LAYER
     * GROUPS): its file holds every position, and an agent that starts
     * from a shorter base of it, or a restore, may need any of them; each
     * agent releases its own references as its window moves on */
    ak_kv_set_window_release(p->kv, 0);
    if (agents_ensure_room(a, (size_t)ak_kv_blocks_for(p->kv, n) * ak_block_pool_block_bytes(a->cfg.pool, fk, fv), NULL,
                           err) < 0 ||
        rec_add(a, p, err) < 0) {
        rec_free(p);
        return -1;
    }
    *kv = p->kv;
    return 0;
}

int ak_pool_commit(ak_agents *a, const char *id, ak_error *err) {
    pool_rec *p = pools_find(a, id);
    if (!p || !p->building) return ak_failc(err, AK_ERR_INVALID, "pool %s: not being created", id);
    if (ak_kv_length(p->kv) != p->n)
        return ak_failc(err, AK_ERR_INVALID, "pool %s: %d of %d positions computed", id, ak_kv_length(p->kv), p->n);
    ak_pool_content_hash(a->cfg.model->fingerprint, &a->cfg.model->spec, p->fk, p->fv, p->tokens, p->n, p->hash);
    if (a->cfg.store) {
        if (ak_store_save_pool(a->cfg.store, &(ak_store_save_args){.id = id, .kv = p->kv, .tokens = p->tokens,
                               .n_tokens = p->n, .source = p->source, .fingerprint = a->cfg.model->fingerprint,
                               .model_name = a->cfg.model->cfg.name}, err) < 0)
            return -1;
        ak_store_pool_entry e;
        if (ak_store_lookup_pool(a->cfg.store, id, &e) == 0) {
            p->file_bytes = e.e.bytes;
            free(e.source);
        }
    }
    p->created = (int64_t)time(NULL);
    p->building = 0;
    int next = 0;
    ak_prefix_publish(p->kv, p->tokens, p->n, &next);
    logf_(a, "pool %s: created (%d tokens, %s/%s)", id, p->n, ak_kv_format_get(p->fk)->name,
          ak_kv_format_get(p->fv)->name);
    return 0;
}

void ak_pool_abort(ak_agents *a, const char *id) {
    pool_rec *p = pools_find(a, id);
    if (p && p->building) rec_del(a, p);
}

int ak_pool_create(ak_agents *a, ak_ctx *c, const ak_pool_request *rq, ak_progress_fn progress, void *ud,
                   ak_error *err) {
    const char *id = rq->id;
    const int32_t *tokens = rq->tokens;
    int n = rq->n;
    ak_kv *kv;
    if (ak_pool_begin(a, rq, &kv, err) < 0) return -1;
    if (ak_eval(c, kv, &(ak_eval_args){.tokens = tokens, .n = n, .progress = progress, .ud = ud}, err) < 0 ||
        ak_pool_commit(a, id, err) < 0) {
        ak_pool_abort(a, id);
        return -1;
    }
    return 0;
}

/* ---- looking at them ---------------------------------------------------- */

/* Agents whose cache starts with pool id, in RAM or only in the store, as
 * "a, b, c" (up to 8 named) into names; returns how many. */
static int readers(ak_agents *a, const char *id, char *names, size_t cap) {
    int n = 0;
    size_t len = 0;
    if (names && cap) names[0] = 0;
#define NAME(x)                                                                                   \
    do {                                                                                          \
        if (names && n < 8 && len < cap) {                                                        \
            int w_ = snprintf(names + len, cap - len, "%s%s", len ? ", " : "", (x));              \
            if (w_ > 0) len += (size_t)w_;                                                        \
        }                                                                                         \
        n++;                                                                                      \
    } while (0)
    for (int i = 0; i < a->n; i++)
        if (!a->v[i]->ephemeral && !strcmp(a->v[i]->pool, id)) NAME(a->v[i]->id);
    ak_store_entry *v = NULL;
    int nv = 0;
    ak_error e = {{0}};
    if (a->cfg.store && ak_store_list(a->cfg.store, &v, &nv, &e) == 0) {
        for (int i = 0; i < nv; i++) {
            if (strcmp(v[i].base.pool_id, id)) continue;
            const agent *g = agents_find(a, v[i].id);
            if (g && !g->ephemeral && !strcmp(g->pool, id)) continue;   /* counted above */
            NAME(v[i].id);
        }
        free(v);
    }
#undef NAME
    if (names && n > 8 && len + 5 < cap) snprintf(names + len, cap - len, ", ...");
    return n;
}

static void info_of(ak_agents *a, const pool_rec *p, ak_pool_info *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->id, sizeof out->id, "%s", p->id);
    out->n_tokens = p->n;
    out->fk = p->fk;
    out->fv = p->fv;
    snprintf(out->hash, sizeof out->hash, "%s", p->hash);
    out->resident = p->kv != NULL;
    out->bytes = p->kv ? ak_kv_bytes(p->kv) : 0;
    out->file_bytes = p->file_bytes;
    out->readers = readers(a, p->id, NULL, 0);
    out->created = p->created;
}

static void info_of_entry(ak_agents *a, const ak_store_pool_entry *e, ak_pool_info *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->id, sizeof out->id, "%s", e->e.id);
    out->n_tokens = e->e.n_tokens;
    out->fk = e->e.fk;
    out->fv = e->e.fv;
    snprintf(out->hash, sizeof out->hash, "%s", e->pool_hash);
    out->file_bytes = e->e.bytes;
    out->readers = readers(a, e->e.id, NULL, 0);
    out->created = e->e.created;
}

int ak_pool_get(ak_agents *a, const char *id, ak_pool_info *out, ak_error *err) {
    if (!ak_pool_id_valid(id)) return ak_failc(err, AK_ERR_INVALID, "invalid pool id");
    pool_rec *p = pools_find(a, id);
    if (p && !p->building) {
        info_of(a, p, out);
        return 0;
    }
    ak_store_pool_entry e;
    if (!p && a->cfg.store && ak_store_lookup_pool(a->cfg.store, id, &e) == 0) {
        info_of_entry(a, &e, out);
        free(e.source);
        return 0;
    }
    return ak_failc(err, AK_ERR_NOT_FOUND, "pool %s does not exist", id);
}

int ak_pool_tokens(ak_agents *a, const char *id, int32_t **tokens, int *n, char **source, ak_error *err) {
    *tokens = NULL;
    *n = 0;
    if (source) *source = NULL;
    pool_rec *p = pools_resolve(a, id, err);
    if (!p) return -1;
    if (!(*tokens = malloc(sizeof(int32_t) * (size_t)p->n)) || (source && p->source && !(*source = strdup(p->source)))) {
        free(*tokens);
        *tokens = NULL;
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    memcpy(*tokens, p->tokens, sizeof(int32_t) * (size_t)p->n);
    *n = p->n;
    return 0;
}

static int cmp_info(const void *x, const void *y) {
    return strcmp(((const ak_pool_info *)x)->id, ((const ak_pool_info *)y)->id);
}

int ak_pools_list(ak_agents *a, ak_pool_info **out, int *n, ak_error *err) {
    *out = NULL;
    *n = 0;
    ak_store_pool_entry *v = NULL;
    int nv = 0;
    if (a->cfg.store && ak_store_list_pools(a->cfg.store, &v, &nv, err) < 0) return -1;
    ak_pool_info *r = malloc(sizeof *r * (size_t)(a->n_pools + nv + 1));
    if (!r) {
        ak_store_pool_entries_free(v, nv);
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    int k = 0;
    for (int i = 0; i < a->n_pools; i++)
        if (!a->pools[i]->building) info_of(a, a->pools[i], &r[k++]);
    for (int i = 0; i < nv; i++)
        if (!pools_find(a, v[i].e.id)) info_of_entry(a, &v[i], &r[k++]);
    ak_store_pool_entries_free(v, nv);
    qsort(r, (size_t)k, sizeof *r, cmp_info);
    *out = r;
    *n = k;
    return 0;
}

int ak_pool_remove(ak_agents *a, const char *id, ak_error *err) {
    if (!ak_pool_id_valid(id)) return ak_failc(err, AK_ERR_INVALID, "invalid pool id");
    pool_rec *p = pools_find(a, id);
    if (p && p->building) return ak_failc(err, AK_ERR_BUSY, "pool %s is being created", id);
    char names[400];
    int nr = readers(a, id, names, sizeof names);
    if (nr > 0)
        return ak_failc(err, AK_ERR_BUSY, "pool %s is in use by %d agent%s: %s (delete them first)", id, nr,
                        nr > 1 ? "s" : "", names);
    int found = 0;
    if (p) {
        rec_del(a, p);
        found = 1;
    }
    if (a->cfg.store) {
        int r = ak_store_remove_pool(a->cfg.store, id, err);
        if (r < 0) return -1;
        if (r == 0) found = 1;
    }
    return found ? 0 : 1;
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
