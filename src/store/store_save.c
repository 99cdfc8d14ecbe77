/* store_save.c - the save path (store.h: ak_store_write_snapshot): a
 * snapshot's image (store_snapshot.c builds the header; the data section is
 * the snapshot's), sealed when the store has a key (store_seal.c), streamed
 * into one backend put (store_backend.h), and the index updated once the
 * put is committed.
 *
 * What it promises: a save that fails before its commit leaves the previous
 * image intact and says so ("the previous file, if any, is intact"); one
 * whose commit succeeded but whose durability step failed says the new
 * image is in place; the plaintext (header with the token ids, sealing
 * buffers) is wiped before its memory is freed.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_codec.h"

/* The size of the staging buffer a sealed image is pushed through: whole
 * seal chunks are sealed into it and it is handed to the backend when full. */
#define SEAL_STAGE_BYTES ((size_t)1 << 20)

/* Writes the image (hdr then data) sealed: chunks of it are pushed through
 * the secretstream into a staging buffer that goes to the backend whenever
 * it is full. */
static int put_sealed(ak_store *s, ak_blob_put *p, const char *binding, const uint8_t *hdr, size_t hl,
                      const uint8_t *data, uint64_t dl, ak_error *err) {
    const ak_backend_ops *ops = s->be->ops;
    ak_seal z;
    uint8_t sh[AK_SEAL_HEADER_BYTES];
    uint64_t total = hl + dl;
    ak_seal_begin(&z, s->key, total, AK_SEAL_CHUNK, binding, sh);
    size_t cap = SEAL_STAGE_BYTES;
    uint8_t *out = malloc(cap + AK_SEAL_HEADER_BYTES), *in = malloc(AK_SEAL_CHUNK);
    int rc = -1;
    if (!out || !in) {
        ak_failc(err, AK_ERR_NOMEM, "out of memory");
        goto done;
    }
    memcpy(out, sh, AK_SEAL_HEADER_BYTES);
    size_t used = AK_SEAL_HEADER_BYTES;
    for (uint64_t pos = 0; pos < total;) {
        size_t n = ak_seal_next_bytes(&z);
        const uint8_t *src;
        if (pos + n <= hl) src = hdr + pos;
        else if (pos >= hl) src = data + (pos - hl);
        else { /* the chunk straddles header and data */
            memcpy(in, hdr + pos, hl - pos);
            memcpy(in + (hl - pos), data, n - (hl - pos));
            src = in;
        }
        if (used + n + AK_SEAL_ABYTES > cap) {
            if (ops->put_write(p, out, used, err) != 0) goto done;
            used = 0;
        }
        used += ak_seal_push(&z, src, out + used);
        pos += n;
    }
    if (used && ops->put_write(p, out, used, err) != 0) goto done;
    rc = 0;
done:
    sodium_memzero(&z, sizeof z);
    if (in) sodium_memzero(in, AK_SEAL_CHUNK);
    free(in);
    free(out);
    return rc;
}

int ak_store_write_snapshot(ak_store *s, const ak_snapshot *sn, ak_error *err) {
    const ak_backend_ops *ops = s->be->ops;
    const char *what_kind = ak_kind_word(sn->kind);
    char binding[AK_SEAL_ID_MAX + 1];
    ak_seal_binding(sn->kind, sn->id, binding);
    size_t hl = 0;
    uint8_t *hdr = aks_build_header(sn, &hl, err);
    if (!hdr) return -1;
    uint64_t total = s->has_key ? ak_seal_file_bytes(hl + sn->data_bytes, AK_SEAL_CHUNK) : hl + sn->data_bytes;
    ak_error e = {{0}};
    ak_blob_info bi = {0};
    int rc = -1;
    /* one node writes an agent: its lease first (always held in a directory) */
    if (sn->kind == AK_FILE_AGENT && ak_backend_lease_hold(s->be, sn->id, &e) != 0) {
        sodium_memzero(hdr, hl);
        free(hdr);
        return ak_failc(err, e.code ? e.code : AK_ERR_IO, "store: saving agent %s: %s (the previous file, if any, is "
                        "intact)", sn->id, e.msg);
    }
    ak_blob_put *p = ops->put_begin(s->be, sn->kind, sn->id, total, &e);
    if (p && !s->has_key && ops->put_head) ops->put_head(p, hl);   /* listing reads only the header: kept at hand */
    if (p) {
        if (s->has_key ? put_sealed(s, p, binding, hdr, hl, sn->data, sn->data_bytes, &e) != 0
                       : ops->put_write(p, hdr, hl, &e) != 0 || ops->put_write(p, sn->data, sn->data_bytes, &e) != 0)
            ops->put_abort(p);
        else rc = ops->put_commit(p, &bi, &e);
    }
    sodium_memzero(hdr, hl);   /* holds the token ids */
    free(hdr);
    if (rc < 0)
        return ak_failc(err, e.code ? e.code : AK_ERR_IO, "store: saving %s %s: %s (the previous file, if any, is intact)",
                        what_kind, sn->id, e.msg);
    ak_store_entry ie;
    memset(&ie, 0, sizeof ie);
    snprintf(ie.id, sizeof ie.id, "%s", sn->id);
    ie.bytes = bi.bytes;
    ie.mtime = bi.mtime;
    ie.mtime_ns = bi.mtime_ns;
    ie.sealed = s->has_key;
    ie.readable = 1;
    ie.n_tokens = sn->n_tokens;
    ie.fk = sn->fk;
    ie.fv = sn->fv;
    ie.spec = sn->spec;
    ie.block_tokens = sn->block_tokens;
    ie.created = sn->created;
    snprintf(ie.fingerprint, sizeof ie.fingerprint, "%s", sn->fingerprint);
    snprintf(ie.model_name, sizeof ie.model_name, "%s", sn->model_name);
    ie.base = sn->base;
    if (ak_kind_pooled(sn->kind)) {
        ak_store_pool_entry pe;
        memset(&pe, 0, sizeof pe);
        pe.e = ie;
        snprintf(pe.pool_hash, sizeof pe.pool_hash, "%s", sn->pool_hash);
        pe.source = strdup(sn->source ? sn->source : "");   /* NULL out of memory: listed without it */
        ak_store_index_put(s, sn->kind, NULL, &pe);
    } else {
        ak_store_index_put(s, AK_FILE_AGENT, &ie, NULL);
    }
    if (rc > 0)
        return ak_failc(err, e.code ? e.code : AK_ERR_IO, "store: saving %s %s: %s (the new file is in place but may "
                        "not survive a crash)", what_kind, sn->id, e.msg);
    return 0;
}

int ak_store_save(ak_store *s, const char *agent_id, const ak_kv *kv, const int32_t *tokens, int n_tokens,
                  const char *fingerprint, const char *model_name, ak_error *err) {
    ak_snapshot *sn = ak_store_snapshot(agent_id, kv, tokens, n_tokens, fingerprint, model_name, err);
    if (!sn) return -1;
    int rc = ak_store_write_snapshot(s, sn, err);
    ak_snapshot_free(sn);
    return rc;
}
