/* store_memory.c - memory files of a store (store.h, "MEMORIES").
 *
 * FILE FORMAT. A memory is <dir>/memories/<id>.safetensors, written and read
 * by store.c's code for pools (one block codec for agents, pools and
 * memories), so it is the agent file format of docs/agent-file-format.md
 * (version 5: per-block XXH3-64 checksums in "block_checksums", a metadata
 * checksum, sealed like any file when the store has a key) with:
 *     "format"       "agentkv.memory" (a pool or agent file is not a memory)
 *     "agent_id"     the memory's id
 *     "tokens"       the chunk's token ids, tokenized alone (memories.h: no
 *                    BOS, no EOS, special-token text not parsed)
 *     "pool_hash"    the content hash: ak_pool_content_hash(model
 *                    fingerprint, cache spec, kv_format_k, kv_format_v,
 *                    tokens), recomputed from the file and compared at every
 *                    load (a mismatch is CORRUPT)
 *     "source"       the chunk's text, as given
 *     no base        (no "pool_id", "segments": a memory is positions
 *                    [0, n_tokens) computed alone at position 0)
 * and the tensors of an agent file of n_tokens positions in kv_format_k /
 * kv_format_v. Checks at load: every check of an agent file (structure,
 * fingerprint: another model is STALE; cache spec, formats, token ids below
 * the vocabulary, every checksum; torn or tampered: CORRUPT, moved to
 * quarantine/memory+<id>.safetensors.<reason>.<time>).
 *
 * The index of memory files (s->midx) mirrors the pool index: built at
 * ak_store_open (store.c scans memories/), kept current by saves, loads,
 * removals and quarantine moves.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blockpool.h"
#include "store.h"
#include "store_impl.h"

int ak_store_save_memory(ak_store *s, const char *id, const ak_kv *kv, const int32_t *tokens, int n_tokens,
                         const char *text, const char *fingerprint, const char *model_name, ak_error *err) {
    char hash[17];
    if (n_tokens < 1 || n_tokens > ak_kv_length(kv) || !tokens)
        return ak_failc(err, AK_ERR_INVALID, "store: memory %s: %d tokens to save but the cache holds %d",
                        id ? id : "?", n_tokens, ak_kv_length(kv));
    if (ak_kv_base_len(kv) != 0)   /* a memory is computed alone: it never shares a base */
        return ak_failc(err, AK_ERR_INVALID, "store: memory %s: the sequence has a base", id ? id : "?");
    ak_pool_content_hash(fingerprint, ak_block_pool_spec(ak_kv_pool(kv)), ak_kv_format_k(kv), ak_kv_format_v(kv),
                         tokens, n_tokens, hash);
    ak_snapshot *sn = ak_store_snapshot_kind(AK_FILE_MEMORY, id, kv, tokens, n_tokens, NULL, hash, text ? text : "",
                                             fingerprint, model_name, err);
    if (!sn) return -1;
    int rc = ak_store_write_snapshot(s, sn, err);
    ak_snapshot_free(sn);
    return rc;
}

ak_store_status ak_store_load_memory(ak_store *s, const char *id, const char *fingerprint, int vocab, ak_kv *kv,
                                     int32_t **tokens, int *n_tokens, char hash[17], ak_error *err) {
    ak_store_load_info info;
    char h[17] = "";
    ak_store_status st = ak_store_load_kind(s, AK_FILE_MEMORY, id, fingerprint, vocab, kv, NULL, NULL, &info, h, err);
    if (st != AK_STORE_HIT) return st;
    if (tokens) *tokens = info.tokens;
    else free(info.tokens);
    if (n_tokens) *n_tokens = info.n_tokens;
    if (hash) memcpy(hash, h, 17);
    return st;
}

/* The slot of id in the sorted memory index: its index when found
 * (*found = 1), else where it would go. Call with s->mu held. */
static int mem_slot(const ak_store *s, const char *id, int *found) {
    int lo = 0, hi = s->n_midx;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (strcmp(s->midx[mid].e.id, id) < 0) lo = mid + 1;
        else hi = mid;
    }
    *found = lo < s->n_midx && !strcmp(s->midx[lo].e.id, id);
    return lo;
}

void ak_store_memory_index_put(ak_store *s, ak_store_pool_entry *e) {
    pthread_mutex_lock(&s->mu);
    int found, k = mem_slot(s, e->e.id, &found);
    if (found) {
        free(s->midx[k].source);
        s->midx[k] = *e;
    } else {
        if (s->n_midx == s->cap_midx) {
            int nc = s->cap_midx ? s->cap_midx * 2 : 8;
            ak_store_pool_entry *ni = realloc(s->midx, sizeof *ni * (size_t)nc);
            if (!ni) {   /* out of memory: listed again at the next open */
                pthread_mutex_unlock(&s->mu);
                free(e->source);
                e->source = NULL;
                return;
            }
            s->midx = ni;
            s->cap_midx = nc;
        }
        memmove(s->midx + k + 1, s->midx + k, sizeof *s->midx * (size_t)(s->n_midx - k));
        s->midx[k] = *e;
        s->n_midx++;
    }
    e->source = NULL;   /* the index owns it now */
    pthread_mutex_unlock(&s->mu);
}

void ak_store_memory_index_del(ak_store *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    int found, k = mem_slot(s, id, &found);
    if (found) {
        free(s->midx[k].source);
        memmove(s->midx + k, s->midx + k + 1, sizeof *s->midx * (size_t)(s->n_midx - k - 1));
        s->n_midx--;
    }
    pthread_mutex_unlock(&s->mu);
}

void ak_store_memory_index_free(ak_store *s) {
    for (int i = 0; i < s->n_midx; i++) free(s->midx[i].source);
    free(s->midx);
    s->midx = NULL;
    s->n_midx = s->cap_midx = 0;
}

/* e into out with its own copy of the text (NULL if none or out of memory). */
static void entry_copy(ak_store_pool_entry *out, const ak_store_pool_entry *e) {
    *out = *e;
    out->source = e->source ? strdup(e->source) : NULL;
}

int ak_store_lookup_memory(ak_store *s, const char *id, ak_store_pool_entry *out) {
    pthread_mutex_lock(&s->mu);
    int found, k = mem_slot(s, id ? id : "", &found);
    if (found) entry_copy(out, &s->midx[k]);
    pthread_mutex_unlock(&s->mu);
    return found ? 0 : 1;
}

int ak_store_list_memories(ak_store *s, ak_store_pool_entry **out, int *n, ak_error *err) {
    pthread_mutex_lock(&s->mu);
    int k = s->n_midx;
    ak_store_pool_entry *v = calloc((size_t)(k ? k : 1), sizeof *v);
    for (int i = 0; v && i < k; i++) entry_copy(&v[i], &s->midx[i]);
    pthread_mutex_unlock(&s->mu);
    if (!v) return ak_failc(err, AK_ERR_NOMEM, "store: out of memory");
    *out = v;
    *n = k;
    return 0;
}

int ak_store_remove_memory(ak_store *s, const char *id, ak_error *err) {
    if (!ak_agent_id_valid(id)) return ak_failc(err, AK_ERR_INVALID, "store: invalid memory id");
    char path[PATH_MAX];
    int w = snprintf(path, sizeof path, "%s/%s.safetensors", s->mem_dir, id);
    if (w < 0 || (size_t)w >= sizeof path) return ak_failc(err, AK_ERR_INVALID, "store: path too long");
    int rc = 0;
    if (unlink(path) != 0) {
        if (errno != ENOENT)
            return ak_failc(err, ak_err_code_of_errno(errno), "store: unlink %s: %s", path, strerror(errno));
        rc = 1;
    }
    ak_store_memory_index_del(s, id);
    return rc;
}
