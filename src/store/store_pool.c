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

int ak_store_save_pool(ak_store *s, const char *pool_id, const ak_kv *kv, const int32_t *tokens, int n_tokens,
                       const char *source, const char *fingerprint, const char *model_name, ak_error *err) {
    char hash[17];
    if (n_tokens < 0 || n_tokens > ak_kv_length(kv) || (n_tokens > 0 && !tokens))
        return ak_failc(err, AK_ERR_INVALID, "store: pool %s: %d tokens to save but the cache holds %d",
                        pool_id ? pool_id : "?", n_tokens, ak_kv_length(kv));
    ak_pool_content_hash(fingerprint, ak_block_pool_spec(ak_kv_pool(kv)), ak_kv_format_k(kv), ak_kv_format_v(kv),
                         tokens, n_tokens, hash);
    ak_snapshot *sn = ak_store_snapshot_kind(AK_FILE_POOL, pool_id, kv, tokens, n_tokens, NULL, hash, source,
                                             fingerprint, model_name, err);
    if (!sn) return -1;
    int rc = ak_store_write_snapshot(s, sn, err);
    ak_snapshot_free(sn);
    return rc;
}

ak_store_status ak_store_load_pool(ak_store *s, const char *pool_id, const char *fingerprint, int vocab, ak_kv *kv,
                                   int32_t **tokens, int *n_tokens, char pool_hash[17], ak_error *err) {
    ak_store_load_info info;
    char hash[17] = "";
    ak_store_status st = ak_store_load_kind(s, AK_FILE_POOL, pool_id, fingerprint, vocab, kv, NULL, NULL, &info,
                                            hash, err);
    if (st != AK_STORE_HIT) return st;
    if (tokens) *tokens = info.tokens;
    else free(info.tokens);
    if (n_tokens) *n_tokens = info.n_tokens;
    if (pool_hash) memcpy(pool_hash, hash, 17);
    return st;
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
