/* store_load.c - the load path (store.h: ak_store_load_linked,
 * ak_store_verify, ak_store_inspect; pools and memories through
 * ak_store_load_kind): an image opened through the backend
 * (store_backend.h), its header parsed and checked by the codec
 * (store_codec.h), then only the blocks past what the prelink callback
 * supplied read and verified.
 *
 * What it promises: nothing reaches the caller's sequence before every
 * check has passed (structure, metadata, model, geometry, formats, token
 * ids, every block checksum, for sealed images every tag): the blocks are
 * read into a fresh sequence that is swapped in only then. Plain images of
 * the pool's block size are read straight into the blocks (the backend's
 * readv: preadv on a file), by the caller and one helper thread whose
 * lifetime is the restore's (created and joined here); sealed images,
 * another block size or a KV budget that holds the old cache go through an
 * image in memory. A CORRUPT image is moved to quarantine (by a load, not by
 * verify or inspect); a hit marks the image used (its LRU time).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
/* see store_codec.c: XXH3 with our target flags */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kv/blockpool.h"
#include "store/store_codec.h"

static double ms_since(double t0) { return (ak_now() - t0) * 1e3; }

/* ---------------------------------------------------------------- reading */

/* An open image (the safetensors bytes: the stored value itself, or what
 * its seal holds), filled on demand in order. */
typedef struct {
    const ak_store *s;
    const ak_backend_ops *ops;
    ak_blob_get *g;
    ak_blob_info info;      /* the stored value's size and time */
    int sealed;
    uint8_t *img;
    uint64_t img_size;
    uint64_t cap;           /* bytes img has room for (plain images grow it on demand) */
    uint64_t have;          /* img[0, have) is filled */
    uint64_t file_pos;      /* next ciphertext byte (sealed) */
    ak_seal z;
    uint8_t *cbuf;          /* ciphertext staging (sealed) */
    size_t cbuf_cap;
    uint64_t bytes_read;
    double read_ms;
} reader;

static void reader_close(reader *r) {
    if (r->g) r->ops->get_close(r->g);
    if (r->sealed) {
        sodium_memzero(&r->z, sizeof r->z);
        if (r->img) sodium_memzero(r->img, (size_t)r->have);   /* plaintext of a sealed file */
    }
    free(r->img);
    free(r->cbuf);
    memset(r, 0, sizeof *r);
}

static ak_store_status pread_all(reader *r, uint8_t *dst, size_t n, uint64_t off, verdict *v) {
    if (n == 0) return AK_STORE_HIT;
    int rc = r->ops->get_read(r->g, dst, n, off);
    if (rc == -1 && errno == EBADMSG) /* the backend's own check of what it stored (a Redis chunk's sum) */
        return aks_judge(v, AK_STORE_CORRUPT, "checksum", "stored bytes near offset %llu fail the backend's checksum",
                         (unsigned long long)off);
    if (rc == -1) return aks_judge(v, AK_STORE_ERROR, NULL, "read at offset %llu: %s", (unsigned long long)off, strerror(errno));
    if (rc == -2) /* the file shrank under us: not its fault, not ours to aks_judge */
        return aks_judge(v, AK_STORE_ERROR, NULL, "file shrank while being read");
    r->bytes_read += n;
    return AK_STORE_HIT;
}

/* Opens the image of (kind, id) (a sealed one must be bound to binding) and
 * decides plain or sealed; on HIT img[0, 8) is available. */
static ak_store_status reader_open(reader *r, const ak_store *s, int kind, const char *id, const char *binding,
                                   verdict *v) {
    memset(r, 0, sizeof *r);
    r->s = s;
    r->ops = s->be->ops;
    char why[160];
    ak_error e = {{0}};
    int rc = r->ops->get_open(s->be, kind, id, &r->g, &r->info, why, sizeof why, &e);
    if (rc == 1) return aks_judge(v, AK_STORE_ABSENT, NULL, "no such file");
    if (rc < 0) return aks_judge_error(v, e.code == AK_ERR_NOMEM ? AK_ERR_NOMEM : AK_ERR_IO, "%s", e.msg);
    if (rc == 2) return aks_judge(v, AK_STORE_CORRUPT, "notfile", "%s", why);
    uint64_t size = r->info.bytes;
    if (size < 8) return aks_judge(v, AK_STORE_CORRUPT, "truncated", "truncated: %llu bytes", (unsigned long long)size);
    uint8_t head[AK_SEAL_HEADER_BYTES];
    size_t hn = size < sizeof head ? (size_t)size : sizeof head;
    if (pread_all(r, head, hn, 0, v) != AK_STORE_HIT) return v->st;
    r->sealed = memcmp(head, AK_SEAL_MAGIC, 8) == 0;
    if (!r->sealed) {
        if (s->has_key)
            return aks_judge(v, AK_STORE_STALE, NULL, "a plain file, but this store keeps its files sealed (encrypted)");
        r->img_size = size;
    } else {
        if (!s->has_key) return aks_judge(v, AK_STORE_STALE, NULL, "a sealed (encrypted) file, but the store has no key");
        if (size < AK_SEAL_HEADER_BYTES)
            return aks_judge(v, AK_STORE_CORRUPT, "truncated", "truncated sealed file: %llu bytes", (unsigned long long)size);
        ak_seal_info si;
        ak_seal_parse(head, &si);
        if (si.version > AK_SEAL_VERSION)
            return aks_judge(v, AK_STORE_STALE, NULL, "sealed with format version %u, newer than this build's %u", si.version,
                         AK_SEAL_VERSION);
        if (si.version == 1)   /* not bound to its agent id: recomputed and re-saved as version 2 */
            return aks_judge(v, AK_STORE_STALE, NULL, "sealed with format version 1 (not bound to its agent id), older "
                         "than this build's %u", AK_SEAL_VERSION);
        if (si.version != AK_SEAL_VERSION) return aks_judge(v, AK_STORE_CORRUPT, "seal", "bad seal version %u", si.version);
        if (memcmp(si.key_id, s->key_id, 8) != 0)
            return aks_judge(v, AK_STORE_STALE, NULL, "sealed under another key (wrong key)");
        if (si.chunk < AK_SEAL_MIN_CHUNK || si.chunk > AK_SEAL_MAX_CHUNK || si.plain_bytes < 8)
            return aks_judge(v, AK_STORE_CORRUPT, "seal", "bad seal header (chunk %u, image %llu bytes)", si.chunk,
                         (unsigned long long)si.plain_bytes);
        uint64_t want = ak_seal_file_bytes(si.plain_bytes, si.chunk);
        if (want != size)
            return aks_judge(v, AK_STORE_CORRUPT, "truncated", "sealed file is %llu bytes, its header says %llu (%s)",
                         (unsigned long long)size, (unsigned long long)want, size < want ? "truncated" : "trailing bytes");
        if (ak_unseal_begin(&r->z, s->key, head, binding) != 0)
            return aks_judge(v, AK_STORE_CORRUPT, "seal", "secretstream header rejected");
        r->img_size = si.plain_bytes;
        r->file_pos = AK_SEAL_HEADER_BYTES;
        r->cbuf_cap = ((1u << 20) / si.chunk + 1) * (si.chunk + AK_SEAL_ABYTES);
        if (!(r->cbuf = malloc(r->cbuf_cap))) return aks_judge_error(v, AK_ERR_NOMEM, "out of memory");
    }
    /* a plain file's image is read on demand (its header, then either the
     * whole image or, restoring, straight into blocks: see load_direct) */
    r->cap = r->sealed ? r->img_size : hn;
    if (!(r->img = aks_big_alloc((size_t)r->cap)))
        return aks_judge_error(v, AK_ERR_NOMEM, "out of memory for %llu bytes", (unsigned long long)r->cap);
    if (!r->sealed) {
        memcpy(r->img, head, hn);
        r->have = hn;
    }
    return AK_STORE_HIT;
}

/* Makes img[0, upto) available (upto <= img_size): reads it, or reads and
 * opens the sealed chunks that hold it, authenticating each. */
static ak_store_status reader_need(reader *r, uint64_t upto, verdict *v) {
    double t0 = ak_now();
    ak_store_status st = AK_STORE_HIT;
    if (!r->sealed) {
        if (upto > r->cap) {
            uint8_t *n = aks_big_alloc((size_t)upto);
            if (!n) return aks_judge_error(v, AK_ERR_NOMEM, "out of memory for %llu bytes", (unsigned long long)upto);
            memcpy(n, r->img, (size_t)r->have);
            free(r->img);
            r->img = n;
            r->cap = upto;
        }
        if (upto > r->have) st = pread_all(r, r->img + r->have, (size_t)(upto - r->have), r->have, v);
        if (st == AK_STORE_HIT && upto > r->have) r->have = upto;
    } else {
        while (r->have < upto && st == AK_STORE_HIT) {
            /* a batch of whole chunks, about 1 MiB of ciphertext */
            size_t cb = 0, k = 0;
            uint64_t left = r->img_size - r->have;
            while (left > 0 && cb + r->z.chunk + AK_SEAL_ABYTES <= r->cbuf_cap) {
                uint64_t n = left < r->z.chunk ? left : r->z.chunk;
                cb += (size_t)n + AK_SEAL_ABYTES;
                left -= n;
                k++;
            }
            if ((st = pread_all(r, r->cbuf, cb, r->file_pos, v)) != AK_STORE_HIT) break;
            r->file_pos += cb;
            const uint8_t *c = r->cbuf;
            for (size_t i = 0; i < k; i++) {
                size_t n = ak_seal_next_bytes(&r->z);
                uint64_t idx = r->have / r->z.chunk;
                int rc = ak_unseal_pull(&r->z, c, r->img + r->have);
                if (rc == -1) {
                    st = aks_judge(v, AK_STORE_CORRUPT, "seal",
                               "authentication failed in sealed chunk %llu (tampered or torn)", (unsigned long long)idx);
                    break;
                }
                if (rc == -2) {
                    st = aks_judge(v, AK_STORE_CORRUPT, "seal", "sealed chunk %llu has the wrong tag (chunks dropped or "
                               "reordered)", (unsigned long long)idx);
                    break;
                }
                c += n + AK_SEAL_ABYTES;
                r->have += n;
            }
        }
    }
    r->read_ms += ms_since(t0);
    return st;
}

/* Reads the header of r's image into m. */
static ak_store_status parse_header(reader *r, int kind, const char *id, agent_meta *m, verdict *v) {
    memset(m, 0, sizeof *m);
    uint64_t N = 0;
    if (aks_header_length(r->img, r->img_size, &N, v) != AK_STORE_HIT || reader_need(r, 8 + N, v) != AK_STORE_HIT)
        return v->st;
    return aks_parse_header(r->img, N, kind, id, m, v);
}

/* The tensor table, every block's checksum over the image, the token ids.
 * img must be complete. */
static ak_store_status check_body(reader *r, const agent_meta *m, int vocab, verdict *v) {
    aks_table tb;
    if (aks_check_table(r->img_size, m, &tb, v) != AK_STORE_HIT) return v->st;
    ak_store_status st = aks_check_blocks(m, r->img + m->hdr_end, &tb, 0, v);
    if (st == AK_STORE_HIT) st = aks_check_tokens(m, vocab, v);
    aks_table_free(&tb);
    return st;
}

/* Opens and checks the image of (kind, a->id) completely against a's
 * fingerprint, vocabulary and a->kv (NULL: no sequence to fit); r, m
 * filled on HIT (the caller closes and frees both in any case). Returns
 * the verdict's status; *verify_ms gets the time spent checking. */
static ak_store_status check_file(const ak_store *s, int kind, const ak_store_load_args *a, reader *r, agent_meta *m,
                                  verdict *v, double *verify_ms) {
    memset(m, 0, sizeof *m);
    char binding[AK_SEAL_ID_MAX + 1];
    ak_seal_binding(kind, a->id, binding);
    if (reader_open(r, s, kind, a->id, binding, v) != AK_STORE_HIT) return v->st;
    double t0 = ak_now(), rd0 = r->read_ms;
    if (reader_need(r, 8, v) != AK_STORE_HIT || parse_header(r, kind, a->id, m, v) != AK_STORE_HIT ||
        aks_check_expect(m, a->fingerprint, a->kv, v) != AK_STORE_HIT)
        goto out;
    /* the body is read only once the header says the file is usable */
    if (reader_need(r, r->img_size, v) != AK_STORE_HIT) goto out;
    check_body(r, m, a->vocab, v);
out:
    *verify_ms = ms_since(t0) - (r->read_ms - rd0);
    return v->st;
}

/* ---------------------------------------------- restoring straight into blocks */

/* A plain file's tensors are read with preadv straight into the blocks of
 * a fresh sequence whose block size is the file's: block b's piece of a
 * tensor (its [n_head_kv][T] components) is one run in the file and one in
 * the block (blockpool.h), and a tensor's pieces, block by block, tile its
 * bytes in file order. Blocks the prelink callback supplied (the first j0)
 * are not read: each tensor is read from its piece j0 on. Each batch of
 * pieces (up to IOV_BATCH of them, about BATCH_BYTES) is hashed right after
 * it is read, while it is still in cache, one XXH3 per piece; the pieces'
 * hashes make the blocks' checksums at the end (a few bytes a block). Two
 * threads (the caller and one worker) claim tensors one at a time from a
 * shared counter, so reading and hashing overlap, and a thread the
 * scheduler leaves waiting (a busy machine) delays the restore by at most
 * the tensor it holds: the caller takes the rest, waits only for tensors
 * claimed and then for the worker to return (its lifetime is the
 * restore's: created and joined here). Nothing is visible to the caller's
 * sequence until every checksum has passed: the fresh sequence is swapped
 * in only then, and freed otherwise. (Measured in a stand-alone model of
 * this loop, 16K tokens q4, one thread, CPU time: 1.4x a read(2) of the
 * whole file, of which the pieces 0.15x and hashing 0.25x; reading into a
 * 256 KiB buffer, hashing it there and copying it to the blocks was slower,
 * 1.5x.) */
#define IOV_BATCH 1024
#define BATCH_BYTES ((size_t)256 << 10)
#define TWO_THREADS_BYTES ((uint64_t)4 << 20)   /* below this, one thread */

typedef struct dl_shared dl_shared;

/* One thread's results. */
typedef struct {
    dl_shared *sh;
    uint64_t bytes;
    int err;                 /* errno of a failed read; -1: the file shrank */
    uint64_t err_off;
} dl_job;

struct dl_shared {
    /* set before the threads start, read-only after (hash: each thread
     * writes the rows of the tensors it claimed) */
    const ak_backend_ops *ops;
    ak_blob_get *g;          /* the image (get_readv may run on both threads) */
    const tensor_desc *t;
    int nt;                  /* tensors */
    uint8_t *const *blk;     /* data of block j0 + k */
    const size_t *toff;      /* offset of tensor i's piece within a block */
    int64_t j0, nr;          /* the first block read, blocks read */
    uint64_t data_off;       /* file offset of the data section */
    uint64_t *hash;          /* hash[i * nr + k]: tensor i's piece of block j0 + k */
    /* atomics */
    int next;                /* the next tensor to claim */
    int done;                /* tensors claimed and finished (or skipped) */
    int stop;                /* a read failed: skip the rest */
    dl_job job[2];           /* [0] the worker, [1] the caller */
};

/* Reads the cnt pieces of iov (their bytes back to back in the file from
 * off) into place; iov is consumed. Returns 0, or -1 with j->err set. */
static int read_pieces(dl_job *j, struct iovec *iov, int cnt, uint64_t off) {
    while (cnt > 0) {
        ssize_t k = j->sh->ops->get_readv(j->sh->g, iov, cnt, off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            j->err = k < 0 ? errno : -1;
            j->err_off = off;
            return -1;
        }
        j->bytes += (uint64_t)k;
        off += (uint64_t)k;
        while (cnt > 0 && (size_t)k >= iov->iov_len) {   /* a short read: skip what came in */
            k -= (ssize_t)iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + k;
            iov->iov_len -= (size_t)k;
        }
    }
    return 0;
}

/* Reads tensor i's pieces of the blocks from j0 on and hashes each.
 * Returns 0, or -1 with the failed read recorded in j. */
static int dl_tensor(dl_job *j, int i) {
    const dl_shared *sh = j->sh;
    const tensor_desc *t = &sh->t[i];
    struct iovec iov[IOV_BATCH], piece[IOV_BATCH];
    uint64_t off = sh->data_off + t->offset + (uint64_t)sh->j0 * t->piece;
    uint64_t *hash = sh->hash + (size_t)i * (size_t)sh->nr;
    int cnt = 0;
    size_t batch = 0;
    for (int64_t k = 0; k < sh->nr; k++) {
        piece[cnt].iov_base = sh->blk[k] + sh->toff[i];
        piece[cnt].iov_len = (size_t)t->piece;
        batch += piece[cnt++].iov_len;
        if (cnt == IOV_BATCH || batch >= BATCH_BYTES || k == sh->nr - 1) {
            memcpy(iov, piece, sizeof(struct iovec) * (size_t)cnt);
            if (read_pieces(j, iov, cnt, off) != 0) return -1;
            for (int c = 0; c < cnt; c++) hash[k - cnt + 1 + c] = XXH3_64bits(piece[c].iov_base, piece[c].iov_len);
            off += batch;
            cnt = 0;
            batch = 0;
        }
    }
    return 0;
}

/* Claims and restores tensors until none is left; after a failure (any
 * thread's) claims the rest without reading them. */
static void dl_work(dl_job *j) {
    dl_shared *sh = j->sh;
    for (;;) {
        int i = __atomic_fetch_add(&sh->next, 1, __ATOMIC_RELAXED);
        if (i >= sh->nt) break;
        if (!__atomic_load_n(&sh->stop, __ATOMIC_RELAXED) && dl_tensor(j, i) != 0)
            __atomic_store_n(&sh->stop, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&sh->done, 1, __ATOMIC_RELEASE);   /* publishes j's results so far */
    }
}

/* The restore's helper thread ("ak-restore"): claims tensors beside the
 * caller; joined by read_direct. */
static void *dl_thread(void *arg) {
    pthread_setname_np(pthread_self(), "ak-restore");
    dl_work(arg);
    return NULL;
}

/* Reads file blocks [j0, tb->nb) of a plain file straight into the
 * prepared positions of tmp (block size the file's; where each block's
 * positions are: file_runs) and checks each block's checksum against the
 * table's. HIT, or the verdict. */
static ak_store_status read_direct(reader *r, const agent_meta *m, const aks_table *tb, int64_t j0, ak_kv *tmp,
                                   verdict *v) {
    const tensor_desc *t = tb->t;
    int nt = tb->nt;
    int64_t nb = tb->nb, nr = nb - j0;
    if (nr <= 0) return AK_STORE_HIT;
    int T = m->block_tokens;
    file_runs ru;
    aks_runs_of(&m->base, m->n_tokens, T, &ru);
    uint8_t **blk = malloc(sizeof *blk * (size_t)nr);
    size_t *toff = malloc(sizeof *toff * (size_t)(nt ? nt : 1));
    uint64_t *hash = malloc(sizeof *hash * (size_t)nr * (size_t)(nt ? nt : 1));
    uint64_t *hs = malloc(sizeof *hs * (size_t)(nt ? nt : 1));
    uint8_t *scratch = malloc((size_t)(nt ? nt : 1) * 8);
    dl_shared *sh = calloc(1, sizeof *sh);
    ak_store_status st = AK_STORE_HIT;
    if (!blk || !toff || !hash || !hs || !scratch || !sh) {
        free(sh);
        st = aks_judge_error(v, AK_ERR_NOMEM, "out of memory");
        goto out;
    }
    /* block b's data starts with layer 0's K metadata of head 0, or its
     * codes for a format without metadata (blockpool.h) */
    int kc0 = ak_kv_format_meta_bytes(m->fk, m->spec.head_dim_k) ? 1 : 0;
    for (int64_t k = 0; k < nr; k++)
        if (!(blk[k] = ak_kv_stored_mut(tmp, 0, 0, kc0, 0, (int)aks_block_pos(&ru, j0 + k, T)))) {
            free(sh);
            st = aks_judge(v, AK_STORE_ERROR, NULL, "the sequence refused the restored blocks");
            goto out;
        }
    for (int i = 0; i < nt; i++)
        toff[i] = (size_t)(ak_kv_stored_mut(tmp, t[i].layer, t[i].is_v, t[i].ci, 0, (int)aks_block_pos(&ru, j0, T)) - blk[0]);
    uint64_t data_bytes = nt ? t[nt - 1].offset + t[nt - 1].bytes : 0;
    /* ask for the blocks to be read ahead (the parts read only, when blocks
     * are skipped), unless the backend has them at hand already */
    if (data_bytes && r->ops->get_prefetch) {
        uint64_t *po = malloc(sizeof *po * 2 * (size_t)(nt ? nt : 1));
        if (po && j0 == 0) {
            po[0] = m->hdr_end;
            po[1] = 0;
            r->ops->get_prefetch(r->g, m->hdr_end + data_bytes - 1, po, po + 1, 1);
        } else if (po) {
            for (int i = 0; i < nt; i++) {
                po[i] = m->hdr_end + t[i].offset + (uint64_t)j0 * t[i].piece;
                po[nt + i] = (uint64_t)nr * t[i].piece;
            }
            r->ops->get_prefetch(r->g, m->hdr_end + data_bytes - 1, po, po + nt, nt);
        }
        free(po);
    }
    *sh = (dl_shared){.ops = r->ops, .g = r->g, .t = t, .nt = nt, .blk = blk, .toff = toff, .j0 = j0, .nr = nr,
                      .data_off = m->hdr_end, .hash = hash};
    for (int k = 0; k < 2; k++) sh->job[k] = (dl_job){.sh = sh};
    pthread_t th;
    int worker = 0;
    if ((uint64_t)nr * (data_bytes / (uint64_t)nb) >= TWO_THREADS_BYTES)
        worker = pthread_create(&th, NULL, dl_thread, &sh->job[0]) == 0;   /* none: the caller does it all */
    dl_work(&sh->job[1]);
    if (worker) pthread_join(th, NULL);
    dl_job res[2] = {sh->job[0], sh->job[1]};   /* complete: every tensor is done */
    free(sh);
    for (int k = 0; k < 2; k++) r->bytes_read += res[k].bytes;
    for (int k = 0; k < 2; k++)
        if (res[k].err) {
            if (res[k].err < 0) st = aks_judge(v, AK_STORE_ERROR, NULL, "file shrank while being read");
            else if (res[k].err == EBADMSG)
                st = aks_judge(v, AK_STORE_CORRUPT, "checksum", "stored bytes near offset %llu fail the backend's "
                               "checksum", (unsigned long long)res[k].err_off);
            else st = aks_judge(v, AK_STORE_ERROR, NULL, "read at offset %llu: %s", (unsigned long long)res[k].err_off,
                            strerror(res[k].err));
            goto out;
        }
    for (int64_t k = 0; k < nr && st == AK_STORE_HIT; k++) {
        for (int i = 0; i < nt; i++) hs[i] = hash[(size_t)i * (size_t)nr + (size_t)k];
        st = aks_check_block(m, j0 + k, tb->sums[j0 + k], aks_combine_hashes(hs, nt, scratch), v);
    }
out:
    free(blk);
    free(toff);
    free(hash);
    free(hs);
    free(scratch);
    return st;
}

/* Zeroes the local layers' positions [ak_kv_window_first(kv), wf) of a
 * restore of a version 7 file into blocks of another size: the file does
 * not hold them, no later token sees them (they lie before the window),
 * but the block that holds wf from an earlier position is allocated, and
 * its earlier slots must not be left uninitialized (a later save writes
 * them). */
static void zero_local(ak_kv *kv, int wf) {
    const ak_cache_spec *s = ak_block_pool_spec(ak_kv_pool(kv));
    ak_kv_format f[2] = {ak_kv_format_k(kv), ak_kv_format_v(kv)};
    for (int l = 0; l < s->n_layer; l++) {
        if (!ak_spec_group(s, l)) continue;
        for (int side = 0; side < 2; side++) {
            int d = side ? s->head_dim_v : s->head_dim_k;
            size_t bytes[2] = {ak_kv_format_code_bytes(f[side], d), ak_kv_format_meta_bytes(f[side], d)};
            for (int c = 0; c < 2; c++)
                for (int h = 0; bytes[c] && h < s->n_head_kv; h++)
                    for (int p = ak_kv_window_first(kv); p < wf; p++) {
                        uint8_t *x = ak_kv_stored_mut(kv, l, side, c, h, p);
                        if (x) memset(x, 0, bytes[c]);
                    }
        }
    }
}

/* Reads what a plain file holds of blocks [j0, tb->nb) into the image at
 * its place (the whole image when j0 = 0); the rest of the image stays
 * unread. */
static ak_store_status read_tails(reader *r, const agent_meta *m, const aks_table *tb, int64_t j0, verdict *v) {
    const tensor_desc *t = tb->t;
    if (j0 == 0) return reader_need(r, r->img_size, v);
    double t0 = ak_now();
    if (r->img_size > r->cap) {
        uint8_t *n = aks_big_alloc((size_t)r->img_size);
        if (!n) return aks_judge_error(v, AK_ERR_NOMEM, "out of memory for %llu bytes", (unsigned long long)r->img_size);
        memcpy(n, r->img, (size_t)r->have);
        free(r->img);
        r->img = n;
        r->cap = r->img_size;
    }
    ak_store_status st = AK_STORE_HIT;
    for (int i = 0; i < tb->nt && st == AK_STORE_HIT; i++) {
        uint64_t off = m->hdr_end + t[i].offset + (uint64_t)j0 * t[i].piece, len = t[i].bytes - (uint64_t)j0 * t[i].piece;
        if (len) st = pread_all(r, r->img + off, (size_t)len, off, v);
    }
    r->read_ms += ms_since(t0);
    return st;
}

/* Loads the file of (kind, a->id) into a->kv (see ak_store_load_linked):
 * checks the header, metadata, expectations and token ids; calls a->prelink (if any)
 * on a fresh sequence, which then holds positions [0, L); reads and checks
 * only the file blocks holding positions >= L: straight into the fresh
 * sequence's blocks (a plain file of the pool's block size, with room in
 * the budget), else through an image verified in memory (sealed files, whose
 * seal is read whole; another block size; no room for a second copy while
 * kv holds its old one: kv is emptied only after the checks). Only when
 * everything passed is the fresh sequence swapped into kv. r and m are
 * filled (the caller closes and frees both in any case). Returns the
 * verdict's status; info gets the base, L and the times. */
static ak_store_status load_file(ak_store *s, int kind, const ak_store_load_args *a, reader *r, agent_meta *m,
                                 verdict *v, ak_store_load_info *info) {
    const char *id = a->id;
    ak_kv *kv = a->kv;
    ak_store_prelink_fn prelink = a->prelink;
    memset(m, 0, sizeof *m);
    char binding[AK_SEAL_ID_MAX + 1];
    ak_seal_binding(kind, id, binding);
    if (reader_open(r, s, kind, id, binding, v) != AK_STORE_HIT) return v->st;
    double t0 = ak_now(), rd0 = r->read_ms, t1 = 0, ck0 = 0;
    int timed = 0;
    aks_table tb = {0};
    ak_kv *tmp = NULL;
    ak_error e2 = {{0}};
    if (reader_need(r, 8, v) != AK_STORE_HIT || parse_header(r, kind, id, m, v) != AK_STORE_HIT ||
        aks_check_expect(m, a->fingerprint, kv, v) != AK_STORE_HIT ||
        aks_check_table(r->img_size, m, &tb, v) != AK_STORE_HIT || aks_check_tokens(m, a->vocab, v) != AK_STORE_HIT)
        goto out;
    info->base = m->base;
    int n = m->n_tokens, base = m->base.base_len, Tf = m->block_tokens;
    file_runs ru;
    aks_runs_of(&m->base, n, Tf, &ru);
    int own_segs = ru.n > 1;   /* the file holds positions inside its base: read whole */
    ak_block_pool *pool = ak_kv_pool(kv);
    int T = ak_block_pool_block_tokens(pool);
    if (base > 0 && !prelink) {
        if (m->base.pool_id[0])
            aks_judge(v, AK_STORE_STALE, NULL, "agent file starts with pool %s (%d positions): no pool supplied",
                  m->base.pool_id, base);
        else aks_judge(v, AK_STORE_STALE, NULL, "agent file starts with %d segments (%d positions): no prelink supplied",
                   m->base.n_seg, base);
        goto out;
    }
    if (!(tmp = ak_kv_new(pool, m->fk, m->fv, ak_kv_capacity(kv), &e2))) {
        aks_judge_error(v, e2.code, "%s", e2.msg);
        goto out;
    }
    /* a version 7 file holds the local layers from window_first on: the
     * fresh sequence never allocates them before (kvcache.h LAYER GROUPS) */
    if (m->window_first) ak_kv_release_window_below(tmp, m->window_first);
    int L = 0;
    if (prelink) {
        ak_error pe = {{0}};
        if (prelink(a->ud, &m->base, m->tokens, n, tmp, &pe) != 0) {
            /* the pool vanished or changed: the file cannot be used now */
            if (pe.code == AK_ERR_STALE || pe.code == AK_ERR_NOT_FOUND)
                aks_judge(v, AK_STORE_STALE, NULL, "%s", pe.msg[0] ? pe.msg : "the base could not be supplied");
            else aks_judge_error(v, pe.code ? pe.code : AK_ERR_GENERIC, "%s", pe.msg[0] ? pe.msg : "prelink failed");
            goto out;
        }
        /* a base's local blocks that end at or before window_first are
         * dropped (the prelink attached its pool's whole, and made its
         * own segments' blocks): the sequence holds what the file holds,
         * as the one saved did */
        if (m->window_first) ak_kv_release_window_below(tmp, m->window_first);
        L = ak_kv_length(tmp);
        int kl[AK_KV_MAX_SEGMENTS], kns = ak_kv_segments(tmp, kl), same = kns == m->base.n_seg;
        for (int k = 0; same && k < kns; k++) same = kl[k] == m->base.seg[k].len;
        if (L > n || L < base || ak_kv_base_len(tmp) != base || (L < n && (L - base) % T) || !same ||
            (own_segs && L != base)) {
            aks_judge_error(v, AK_ERR_INVALID, "the prelink callback left %d positions and a base of %d in %d segments: "
                        "expected the file's %d segments, a base of %d and a block boundary (blocks of %d) up to %d%s",
                        L, ak_kv_base_len(tmp), kns, m->base.n_seg, base, T, n,
                        own_segs ? ", nothing past the base" : "");
            goto out;
        }
    }
    info->linked = L;
    for (int k = 0; own_segs && k < ru.n - 1; k++) info->linked -= ru.len[k];   /* read, not linked */
    int64_t j0 = own_segs ? 0 : L >= n ? tb.nb : (L - base) / Tf;
    if (m->window_first && j0 > 0) {   /* version 7 files are read whole (a prelink links nothing into them) */
        aks_judge_error(v, AK_ERR_INVALID, "a windowed agent file cannot skip %lld blocks", (long long)j0);
        goto out;
    }
    info->verify_ms = ms_since(t0) - (r->read_ms - rd0);
    timed = 1;
    t1 = ak_now();
    /* straight into blocks only with one layer group: read_direct places
     * every tensor by its offset from the block's start */
    int direct = !r->sealed && Tf == T && ak_kv_groups(tmp) == 1;
    if (direct && ak_kv_prepare(tmp, L, n, &e2) != 0) {
        if (ak_kv_n_blocks(kv) == 0) {
            aks_judge_error(v, e2.code, "%s", e2.msg);
            goto out;
        }
        direct = 0;   /* the old cache holds the budget: verify first, then swap */
    }
    double fused = 0, tr0 = t1;
    if (direct) {
        double f0 = ak_now();
        if (read_direct(r, m, &tb, j0, tmp, v) != AK_STORE_HIT) goto out;
        fused = ms_since(f0);
        r->read_ms += fused;   /* reading and hashing, fused */
    } else {
        if (r->sealed ? reader_need(r, r->img_size, v) != AK_STORE_HIT : read_tails(r, m, &tb, j0, v) != AK_STORE_HIT)
            goto out;
        ck0 = ak_now();
        if (aks_check_blocks(m, r->img + m->hdr_end, &tb, j0, v) != AK_STORE_HIT) goto out;
        info->verify_ms += ms_since(ck0);
        tr0 = ak_now();
        /* verified: kv is emptied (its blocks are the budget the restore
         * needs) and the fresh sequence filled */
        ak_kv_truncate(kv, 0);
        if (ak_kv_prepare(tmp, L, n, &e2) != 0) {
            aks_judge_error(v, e2.code, "%s", e2.msg);
            goto out;
        }
        if (m->window_first) zero_local(tmp, m->window_first);
        if (aks_transfer(tmp, 1, r->img + m->hdr_end, tb.t, tb.nt, &ru, L - base, Tf) != 0) {
            aks_judge(v, AK_STORE_ERROR, NULL, "the sequence refused a restored vector");
            goto out;
        }
    }
    /* verified: only now does anything reach the caller's sequence */
    if (ak_kv_set_length(tmp, n, &e2) != 0) {
        aks_judge(v, AK_STORE_ERROR, NULL, "the sequence refused the restored blocks");
        goto out;
    }
    /* a version 6 file's AgentKVShift corrections (store_codec.c) go with its positions */
    if (aks_apply_corrections(m, tmp, v) != AK_STORE_HIT) goto out;
    if (ak_kv_swap(kv, tmp) != 0) {
        aks_judge(v, AK_STORE_ERROR, NULL, "the sequence refused the restored blocks");
        goto out;
    }
    info->restore_ms = ms_since(tr0) - fused;
out:
    if (!timed) info->verify_ms = ms_since(t0) - (r->read_ms - rd0);
    ak_kv_free(tmp);   /* kv's old blocks after a swap, else the unverified copy */
    aks_table_free(&tb);
    return v->st;
}


/* After a hit: the index entry of id says what the file holds, its size,
 * and that it was just used (its mtime, set by the caller, is now). */
static void index_loaded(ak_store *s, const char *id, const reader *r, const agent_meta *m) {
    ak_store_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.id, sizeof e.id, "%s", id);
    aks_entry_from_meta(&e, m);
    e.bytes = r->info.bytes;
    e.sealed = r->sealed;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    e.mtime = (int64_t)now.tv_sec;
    e.mtime_ns = (int64_t)now.tv_nsec;
    if (ak_kind_pooled(m->kind)) {
        ak_store_pool_entry pe;
        memset(&pe, 0, sizeof pe);
        pe.e = e;
        snprintf(pe.pool_hash, sizeof pe.pool_hash, "%s", m->pool_hash);
        pe.source = strdup(m->source ? m->source : "");
        ak_store_index_put(s, m->kind, NULL, &pe);
    } else {
        ak_store_index_put(s, AK_FILE_AGENT, &e, NULL);
    }
}

ak_store_status ak_store_load_kind(ak_store *s, int kind, const ak_store_load_args *a, ak_store_load_info *info,
                                   char *pool_hash, ak_error *err) {
    const char *id = a->id;
    ak_store_load_info dummy;
    if (!info) info = &dummy;
    memset(info, 0, sizeof *info);
    if (!ak_agent_id_valid(id)) {
        ak_failc(err, AK_ERR_INVALID, "store: invalid %s id", ak_kind_word(kind));
        return AK_STORE_ERROR;
    }
    char path[PATH_MAX];
    if (s->be->ops->where(s->be, kind, id, path, sizeof path)) { ak_failc(err, AK_ERR_INVALID, "store: path too long"); return AK_STORE_ERROR; }
    double t0 = ak_now();
    reader r;
    agent_meta m;
    verdict v = {.st = AK_STORE_HIT};
    ak_store_status st = load_file(s, kind, a, &r, &m, &v, info);
    info->bytes_read = r.bytes_read;
    info->read_ms = r.read_ms;
    if (st == AK_STORE_HIT) {
        r.ops->get_touch(r.g);   /* recently used, for ak_store_gc; best effort */
        if (kind == AK_FILE_AGENT) { /* this node serves the agent now: its lease, if free (best effort) */
            ak_error le = {{0}};
            ak_backend_lease_hold(s->be, id, &le);
        }
        index_loaded(s, id, &r, &m);
        info->n_tokens = m.n_tokens;
        if (pool_hash) snprintf(pool_hash, 17, "%s", m.pool_hash);
        if (info != &dummy) { /* handed to the caller; else freed below */
            info->tokens = m.tokens;
            m.tokens = NULL;
        }
    } else if (st == AK_STORE_CORRUPT) {
        char dst[PATH_MAX], why[PATH_MAX + 64];
        ak_quarantine_args qa = {.kind = kind, .id = id, .g = r.g, .reason = v.slug ? v.slug : "corrupt",
                                 .where = dst, .wn = sizeof dst, .why = why, .whyn = sizeof why};
        if (ak_store_quarantine_kind(s, &qa) == 0) {
            info->quarantined = 1;
            ak_failc(err, AK_ERR_CORRUPT, "store: %s: corrupt: %s; moved to %s", path, v.msg, dst);
        } else {
            ak_failc(err, AK_ERR_CORRUPT, "store: %s: corrupt: %s; not moved: %s", path, v.msg, why);
        }
    } else {
        ak_failc(err, v.code, "store: %s: %s: %s", path, ak_store_status_name(st), v.msg);
    }
    reader_close(&r);
    aks_meta_free(&m);
    info->total_ms = ms_since(t0);
    return st;
}

ak_store_status ak_store_load_linked(ak_store *s, const ak_store_load_args *a, ak_store_load_info *info,
                                     ak_error *err) {
    return ak_store_load_kind(s, AK_FILE_AGENT, a, info, NULL, err);
}

ak_store_status ak_store_load(ak_store *s, const char *id, const char *fingerprint, int vocab, ak_kv *kv,
                              ak_store_load_info *info, ak_error *err) {
    const ak_store_load_args a = {.id = id, .fingerprint = fingerprint, .vocab = vocab, .kv = kv};
    return ak_store_load_kind(s, AK_FILE_AGENT, &a, info, NULL, err);
}

ak_store_status ak_store_verify(ak_store *s, const char *id, const char *fingerprint, int vocab, ak_error *err) {
    if (!ak_agent_id_valid(id)) { ak_failc(err, AK_ERR_INVALID, "store: invalid agent id"); return AK_STORE_ERROR; }
    char path[PATH_MAX];
    if (s->be->ops->where(s->be, AK_FILE_AGENT, id, path, sizeof path)) { ak_failc(err, AK_ERR_INVALID, "store: path too long"); return AK_STORE_ERROR; }
    reader r;
    agent_meta m;
    verdict v = {.st = AK_STORE_HIT};
    double ms;
    const ak_store_load_args a = {.id = id, .fingerprint = fingerprint, .vocab = vocab};
    ak_store_status st = check_file(s, AK_FILE_AGENT, &a, &r, &m, &v, &ms);
    if (st != AK_STORE_HIT) ak_failc(err, v.code, "store: %s: %s: %s", path, ak_store_status_name(st), v.msg);
    reader_close(&r);
    aks_meta_free(&m);
    return st;
}

/* ------------------------------------------------------- inspecting */

/* Fills e from the image of kind and id: size and time always (returns 1
 * if absent), the metadata when the header is readable and sound; for a
 * pool pe (if not NULL) gets e, the content hash and a copy of the source. */
int aks_read_entry(const ak_store *s, int kind, const char *id, ak_store_entry *e, ak_store_pool_entry *pe,
                   char **metadata_json, verdict *v) {
    char binding[AK_SEAL_ID_MAX + 1];
    memset(e, 0, sizeof *e);
    if (pe) memset(pe, 0, sizeof *pe);
    snprintf(e->id, sizeof e->id, "%s", id);
    ak_seal_binding(kind, id, binding);
    reader r;
    agent_meta m;
    memset(&m, 0, sizeof m);
    ak_store_status st = reader_open(&r, s, kind, id, binding, v);
    if (st == AK_STORE_ABSENT) { reader_close(&r); return 1; }
    if (r.g) {
        e->bytes = r.info.bytes;
        e->mtime = r.info.mtime;
        e->mtime_ns = r.info.mtime_ns;
        e->sealed = r.sealed;   /* known even when the seal cannot be opened */
    }
    int rc = -1;
    if (st == AK_STORE_HIT && reader_need(&r, 8, v) == AK_STORE_HIT && parse_header(&r, kind, id, &m, v) == AK_STORE_HIT) {
        aks_entry_from_meta(e, &m);
        rc = 0;
        if (pe) {
            snprintf(pe->pool_hash, sizeof pe->pool_hash, "%s", m.pool_hash);
            pe->source = strdup(m.source ? m.source : "");
        }
        if (metadata_json) {
            *metadata_json = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(m.root, "__metadata__"));
            if (!*metadata_json) rc = -1, aks_judge_error(v, AK_ERR_NOMEM, "out of memory");
        }
    }
    aks_meta_free(&m);
    reader_close(&r);
    if (pe) pe->e = *e;
    return rc;
}

int ak_store_inspect(ak_store *s, const char *id, ak_store_entry *out, char **metadata_json, ak_error *err) {
    if (metadata_json) *metadata_json = NULL;
    if (!ak_agent_id_valid(id)) return ak_failc(err, AK_ERR_INVALID, "store: invalid agent id");
    verdict v = {.st = AK_STORE_HIT};
    int rc = aks_read_entry(s, AK_FILE_AGENT, id, out, NULL, metadata_json, &v);
    if (rc < 0) {
        char where[PATH_MAX];
        if (s->be->ops->where(s->be, AK_FILE_AGENT, id, where, sizeof where)) snprintf(where, sizeof where, "%s", id);
        ak_failc(err, v.code, "store: %s: %s: %s", where, ak_store_status_name(v.st), v.msg);
    }
    /* what was just read is the newest word on this file */
    if (rc == 1) ak_store_index_del(s, AK_FILE_AGENT, id);
    else if (rc == 0 || out->bytes) ak_store_index_put(s, AK_FILE_AGENT, out, NULL);
    return rc;
}
