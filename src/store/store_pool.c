/* store_pool.c - pool files of a store (store.h, "POOLS"): named shared
 * prefixes in <dir>/pools/<id>.safetensors, the agent file format with
 * "format": "agentkv.pool", "pool_hash" and "source" (store_codec.c
 * specifies them, store_save.c writes and store_load.c reads and verifies
 * them; docs/agent-file-format.md), and the store's index of
 * them. Pools are explicit: ak_store_gc neither counts nor deletes them,
 * ak_store_list does not list them.
 *
 * The content hash of a pool (ak_pool_content_hash) is specified and
 * computed beside the format, in store_codec.c.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv/blockpool.h"
#include "store/store.h"
#include "store/store_impl.h"

int ak_store_save_pooled(ak_store *s, int kind, const ak_store_save_args *a, ak_error *err) {
    char hash[17];
    const ak_kv *kv = a->kv;
    ak_pool_content_hash(a->fingerprint, ak_block_pool_spec(ak_kv_pool(kv)), ak_kv_format_k(kv), ak_kv_format_v(kv),
                         a->tokens, a->n_tokens, hash);
    ak_snapshot *sn = ak_store_snapshot_kind(kind, a, NULL, hash, err);
    if (!sn) return -1;
    int rc = ak_store_write_snapshot(s, sn, err);
    ak_snapshot_free(sn);
    return rc;
}

int ak_store_save_pool(ak_store *s, const ak_store_save_args *a, ak_error *err) {
    if (a->n_tokens < 0 || a->n_tokens > ak_kv_length(a->kv) || (a->n_tokens > 0 && !a->tokens))
        return ak_failc(err, AK_ERR_INVALID, "store: pool %s: %d tokens to save but the cache holds %d",
                        a->id ? a->id : "?", a->n_tokens, ak_kv_length(a->kv));
    return ak_store_save_pooled(s, AK_FILE_POOL, a, err);
}

ak_store_status ak_store_load_pooled(ak_store *s, int kind, const ak_store_load_args *a, int32_t **tokens,
                                     int *n_tokens, char hash[17], ak_error *err) {
    ak_store_load_info info;
    char h[17] = "";
    /* a pooled file has no base: nothing to link */
    const ak_store_load_args b = {.id = a->id, .fingerprint = a->fingerprint, .vocab = a->vocab, .kv = a->kv};
    ak_store_status st = ak_store_load_kind(s, kind, &b, &info, h, err);
    if (st != AK_STORE_HIT) return st;
    if (tokens) *tokens = info.tokens;
    else free(info.tokens);
    if (n_tokens) *n_tokens = info.n_tokens;
    if (hash) memcpy(hash, h, 17);
    return st;
}

ak_store_status ak_store_load_pool(ak_store *s, const ak_store_load_args *a, int32_t **tokens, int *n_tokens,
                                   char pool_hash[17], ak_error *err) {
    return ak_store_load_pooled(s, AK_FILE_POOL, a, tokens, n_tokens, pool_hash, err);
}

/* The slot of id in ix: its index when found (*found = 1), else where it
 * would go. Call with s->mu held. */
static int index_slot(const ak_entry_index *ix, const char *id, int *found) {
    int lo = 0, hi = ix->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (strcmp(ix->v[mid].e.id, id) < 0) lo = mid + 1;
        else hi = mid;
    }
    *found = lo < ix->n && !strcmp(ix->v[lo].e.id, id);
    return lo;
}

void ak_entry_index_put(ak_store *s, ak_entry_index *ix, ak_store_pool_entry *e) {
    pthread_mutex_lock(&s->mu);
    int found, k = index_slot(ix, e->e.id, &found);
    if (found) {
        free(ix->v[k].source);
        ix->v[k] = *e;
    } else {
        if (ix->n == ix->cap) {
            int nc = ix->cap ? ix->cap * 2 : 8;
            ak_store_pool_entry *ni = realloc(ix->v, sizeof *ni * (size_t)nc);
            if (!ni) {   /* out of memory: the file is not listed until the next open */
                pthread_mutex_unlock(&s->mu);
                free(e->source);
                e->source = NULL;
                return;
            }
            ix->v = ni;
            ix->cap = nc;
        }
        memmove(ix->v + k + 1, ix->v + k, sizeof *ix->v * (size_t)(ix->n - k));
        ix->v[k] = *e;
        ix->n++;
    }
    e->source = NULL;   /* the index owns it now */
    pthread_mutex_unlock(&s->mu);
}

void ak_entry_index_del(ak_store *s, ak_entry_index *ix, const char *id) {
    pthread_mutex_lock(&s->mu);
    int found, k = index_slot(ix, id, &found);
    if (found) {
        free(ix->v[k].source);
        memmove(ix->v + k, ix->v + k + 1, sizeof *ix->v * (size_t)(ix->n - k - 1));
        ix->n--;
    }
    pthread_mutex_unlock(&s->mu);
}

void ak_entry_index_free(ak_entry_index *ix) {
    for (int i = 0; i < ix->n; i++) free(ix->v[i].source);
    free(ix->v);
    memset(ix, 0, sizeof *ix);
}

/* A copy of e into out with its own copy of the source (NULL if e has none
 * or out of memory). */
static void entry_copy(ak_store_pool_entry *out, const ak_store_pool_entry *e) {
    *out = *e;
    out->source = e->source ? strdup(e->source) : NULL;
}

int ak_entry_index_lookup(ak_store *s, ak_entry_index *ix, const char *id, ak_store_pool_entry *out) {
    pthread_mutex_lock(&s->mu);
    int found, k = index_slot(ix, id ? id : "", &found);
    if (found) entry_copy(out, &ix->v[k]);
    pthread_mutex_unlock(&s->mu);
    return found ? 0 : 1;
}

int ak_entry_index_list(ak_store *s, ak_entry_index *ix, ak_store_pool_entry **out, int *n, ak_error *err) {
    pthread_mutex_lock(&s->mu);
    int k = ix->n;
    ak_store_pool_entry *v = calloc((size_t)(k ? k : 1), sizeof *v);
    for (int i = 0; v && i < k; i++) entry_copy(&v[i], &ix->v[i]);
    pthread_mutex_unlock(&s->mu);
    if (!v) return ak_failc(err, AK_ERR_NOMEM, "store: out of memory");
    *out = v;
    *n = k;
    return 0;
}

int ak_store_lookup_pool(ak_store *s, const char *pool_id, ak_store_pool_entry *out) {
    return ak_entry_index_lookup(s, &s->pools, pool_id, out);
}

int ak_store_list_pools(ak_store *s, ak_store_pool_entry **out, int *n, ak_error *err) {
    return ak_entry_index_list(s, &s->pools, out, n, err);
}

void ak_store_pool_entries_free(ak_store_pool_entry *v, int n) {
    for (int i = 0; v && i < n; i++) free(v[i].source);
    free(v);
}

int ak_store_remove_pool(ak_store *s, const char *pool_id, ak_error *err) {
    if (!ak_agent_id_valid(pool_id)) return ak_failc(err, AK_ERR_INVALID, "store: invalid pool id");
    ak_error e = {{0}};
    int rc = s->be->ops->remove(s->be, AK_FILE_POOL, pool_id, &e);
    if (rc < 0) return ak_failc(err, e.code, "store: %s", e.msg);
    ak_entry_index_del(s, &s->pools, pool_id);
    return rc;
}
