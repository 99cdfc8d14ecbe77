/* store_memory.c - memory files of a store (store.h, "MEMORIES").
 *
 * FILE FORMAT. A memory is <dir>/memories/<id>.safetensors, written and read
 * by the store's code for pools (store_codec.c, store_save.c, store_load.c) (one block codec for agents, pools and
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
 * The index of memory files (s->mems) is an ak_entry_index like the pools': built at
 * ak_store_open (store.c lists memories through the backend), kept current by saves, loads,
 * removals and quarantine moves.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv/blockpool.h"
#include "store/store.h"
#include "store/store_impl.h"

int ak_store_save_memory(ak_store *s, const ak_store_save_args *a, ak_error *err) {
    const char *id = a->id ? a->id : "?";
    if (a->n_tokens < 1 || a->n_tokens > ak_kv_length(a->kv) || !a->tokens)
        return ak_failc(err, AK_ERR_INVALID, "store: memory %s: %d tokens to save but the cache holds %d", id,
                        a->n_tokens, ak_kv_length(a->kv));
    if (ak_kv_base_len(a->kv) != 0)   /* a memory is computed alone: it never shares a base */
        return ak_failc(err, AK_ERR_INVALID, "store: memory %s: the sequence has a base", id);
    return ak_store_save_pooled(s, AK_FILE_MEMORY, a, err);
}

ak_store_status ak_store_load_memory(ak_store *s, const ak_store_load_args *a, int32_t **tokens, int *n_tokens,
                                     char hash[17], ak_error *err) {
    return ak_store_load_pooled(s, AK_FILE_MEMORY, a, tokens, n_tokens, hash, err);
}

int ak_store_lookup_memory(ak_store *s, const char *id, ak_store_pool_entry *out) {
    return ak_entry_index_lookup(s, &s->mems, id, out);
}

int ak_store_list_memories(ak_store *s, ak_store_pool_entry **out, int *n, ak_error *err) {
    return ak_entry_index_list(s, &s->mems, out, n, err);
}

int ak_store_remove_memory(ak_store *s, const char *id, ak_error *err) {
    if (!ak_agent_id_valid(id)) return ak_failc(err, AK_ERR_INVALID, "store: invalid memory id");
    ak_error e = {{0}};
    int rc = s->be->ops->remove(s->be, AK_FILE_MEMORY, id, &e);
    if (rc < 0) return ak_failc(err, e.code, "store: %s", e.msg);
    ak_entry_index_del(s, &s->mems, id);
    return rc;
}
