/* store_codec.c - see store_codec.h. THE place the image format is
 * specified (version 5, 6 and 7; also in docs/agent-file-format.md). An image is
 * what a backend stores under an agent's, a pool's or a memory's id (a
 * file in the directory backend, a value in Redis):
 *
 *
 * A plain agent file <dir>/<agent_id>.safetensors is a safetensors file:
 *     u64 LE  N                header length, a multiple of 8
 *     N bytes JSON             one object, padded with spaces to N bytes
 *     data                     the tensors' bytes, back to back, in the
 *                              order of the header, no gaps
 * The JSON object holds "__metadata__" (first) and one entry per tensor:
 *     "layers.<l>.<k|v>.<component>": {"dtype": D, "shape": S,
 *                                     "data_offsets": [begin, end]}
 * for l = 0..n_layer-1, K before V, the components of the format in the
 * order ak_kv_format_components gives (values | q, scale | codes, scale_min |
 * codes, norm), with D the component's dtype and
 *     S = [n_blocks, n_head_kv, block_tokens] + the component's own shape
 * where n_blocks = ceil((n_tokens - base_len) / block_tokens) (e.g. q4 at
 * head dim 128, blocks of 32: codes U8 [B, H, 32, 64], scale_min F16 [B, H,
 * 32, 4, 2]). The tensors hold the file's own positions [base_len, n_tokens)
 * (base_len = 0 without a base): tensor bytes are the vectors' stored bytes
 * (kvformat.c), block-major then head-major: block b, head h, slot s
 * (position base_len + b * block_tokens + s) at ((b * n_head_kv + h) *
 * block_tokens + s) * component_bytes. Slots past n_tokens in the last block
 * are zero bytes. Little-endian. This is the in-memory layout of a block's
 * component (blockpool.h), so a restore into a pool of the same block size
 * reads one contiguous piece per (tensor, block): a tensor's "piece" of
 * block b.
 *
 * __metadata__ maps strings to strings:
 *     format              "agentkv.agent" ("agentkv.pool" for a pool file,
 *                         "agentkv.memory" for a memory: store_memory.c)
 *     format_version      "5", or "6" for an agent file with "corrections",
 *                         or "7" for an agent file with "window_first"
 *                         (corrections optional) (4 to 7 are read, 4
 *                         being 5 without "segments"; 1 to 3 and newer
 *                         are a miss: STALE)
 *     agent_id            the id (equal to the file name's; a pool's id
 *                         for a pool file)
 *     model_fingerprint   ak_model.fingerprint (hex)
 *     model_name          informational
 *     n_layer n_head_kv head_dim_k head_dim_v n_ctx     the cache spec
 *     kv_format_k kv_format_v                          "q4", "tq3", ...
 *     block_tokens        block size of the pool it was saved from, 1..4096
 *                         (the tensors' third dimension; a restore into a
 *                         pool of another block size copies through memory)
 *     n_tokens            positions of the sequence (base included)
 *     tokens              their token ids, decimal, comma-separated ("" if none)
 *     created             unix seconds of the snapshot
 *     key_center          the calibration id of the means subtracted from
 *     value_center        keys / values before quantizing (blockpool.h,
 *                         calib.h), or "none"; a restore needs the same on
 *                         its pool (else STALE)
 *     pool_id             agents with a base only: the pool whose first
 *     pool_hash           base_len positions the sequence starts with (its
 *     base_len            id, its content hash ak_pool_content_hash, 1 ..
 *     base_kind           n_tokens) and what it is: "pool" (pools/) or
 *                         "card" (cards/: a CacheCard's blocks, the card's
 *                         content hash); absent (or "", "", "0", absent)
 *                         without a base; base_kind absent: "pool".
 *                         Pool files have no base; their "pool_hash" is
 *                         their own content hash, and "source" an opaque
 *                         string (what the pool was made from)
 *     segments            version 5 agent files whose base is not a single
 *                         pool or card (store.h: SEGMENTS; import
 *                         "append"): "kind:len[:id:hash]" records,
 *                         comma-separated, kind own (positions stored in
 *                         this file), pool (first only) or card; their
 *                         lengths sum to "base_len" (then present, with no
 *                         pool_id, pool_hash, base_kind); at most
 *                         AK_KV_MAX_SEGMENTS. The file's positions are then
 *                         runs, each own segment then [base_len, n_tokens),
 *                         each starting a fresh block (file_runs below):
 *                         n_blocks is the sum of their ceil(len / T)
 *     corrections         version 6 agent files only: the sequence's
 *                         AgentKVShift corrections (kvcache.h CORRECTIONS,
 *                         reuse.h), ranges separated by ';', each
 *                         "start:n:layer0:W:S:M" with start, n, layer0
 *                         decimal (start + n <= n_tokens, layer0 <
 *                         n_layer), W the n weights, S one '0'/'1' per
 *                         layer (its offsets set), M for every layer then
 *                         KV head the key offset (head_dim_k floats), then
 *                         for every KV head the value offset (head_dim_v),
 *                         floats as the 8 lowercase hex digits of their
 *                         IEEE-754 bits (exact: a restored agent attends
 *                         as the one saved); unset layers' offsets zero
 *     window_first        version 7 agent files only: the sequence's
 *     window              sliding-window layers (kvcache.h LAYER GROUPS)
 *     local_layers        released their blocks that end at or before
 *                         position window_first (decimal in [1,
 *                         n_tokens]; without a base a multiple of
 *                         block_tokens; with one, the end of a span of
 *                         the sequence, which its segments may put
 *                         anywhere); local_layers is one '0'/'1' per
 *                         layer ('1': local, at least one), window their
 *                         window (decimal >= 1). Each local layer's
 *                         tensors then hold only the file blocks from B0
 *                         on, B0 being the number of file blocks (file
 *                         order: the runs below, each block ending at
 *                         its run's start + (j + 1) * block_tokens or at
 *                         the run's end) that end at or before
 *                         window_first (window_first / block_tokens
 *                         without a base): shape [n_blocks - B0, ...],
 *                         file block b (>= B0) at piece b - B0; the
 *                         global layers' tensors hold all n_blocks. A
 *                         base's blocks (a pool's) are not in the file:
 *                         a restore attaches them whole and drops the
 *                         local ones that end at or before window_first,
 *                         as the agent saved had. A restore needs a cache
 *                         of the same local layers and window (else
 *                         STALE) and never holds the local layers' blocks
 *                         that end at or before window_first
 *     checksum_algorithm  "xxh3-64" (XXH3_64bits, seed 0)
 *     block_checksums     one per block b = 0..n_blocks-1, 16 lowercase hex
 *                         digits each, separated by commas ("" if none):
 *                         XXH3_64bits of the n_tensors 8-byte little-endian
 *                         values XXH3_64bits(piece of tensor i of block b),
 *                         i in header order (version 7: only the tensors
 *                         that hold block b). A load that skips blocks (their
 *                         positions supplied from RAM) still verifies every
 *                         block it reads; the header stays small (17 bytes
 *                         a block: 8.7 KB for 16K tokens in blocks of 32)
 *     metadata_checksum   16 hex digits: XXH3_64bits over every other
 *                         metadata entry sorted by key (bytewise), each as
 *                         key, 0x00, value, 0x00. Covers the token ids,
 *                         which no tensor checksum does.
 * Integers are canonical decimal (no sign, no leading zero). Readers
 * ignore metadata keys they do not know (the checksum covers them).
 *
 * A sealed file wraps this whole image (store_impl.h has the layout):
 * magic "AKVSEAL1", version, chunk size, image size, key id, then the image
 * through crypto_secretstream_xchacha20poly1305 in 64 KiB chunks, the last
 * tagged FINAL.
 *
 * How images are made, where they go and how they are read:
 * store_snapshot.c (a sequence's snapshot and its header, by this
 * format), store_save.c (temp + atomic replace through a backend:
 * store_backend.h), store_load.c (header first, then only the blocks
 * needed, each verified before the sequence is swapped in).
 */
#include "store/store_codec.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sodium.h>
/* xxhash compiled into this file with our target flags, so XXH3 uses the
 * widest vector unit (AVX-512 / AVX2 / NEON) instead of the shared library's
 * SSE2 build: checksums are a third of a restore's time. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kv/blockpool.h"
#include "store/cards.h"

#define FORMAT_NAME "agentkv.agent"
#define POOL_FORMAT_NAME "agentkv.pool"
#define MEMORY_FORMAT_NAME "agentkv.memory"   /* store_memory.c: a pool file under memories/ */
#define MAX_DIM 65536

/* ---------------------------------------------------------------- helpers */

const char *ak_store_status_name(ak_store_status st) {
    switch (st) {
    case AK_STORE_HIT: return "hit";
    case AK_STORE_ABSENT: return "absent";
    case AK_STORE_STALE: return "stale";
    case AK_STORE_CORRUPT: return "corrupt";
    case AK_STORE_ERROR: return "error";
    }
    return "?";
}

void aks_hex64(uint64_t h, char out[17]) { snprintf(out, 17, "%016llx", (unsigned long long)h); }

/* The "format" metadata value of kind. */
const char *aks_kind_format(int kind) {
    return kind == AK_FILE_POOL ? POOL_FORMAT_NAME : kind == AK_FILE_MEMORY ? MEMORY_FORMAT_NAME : FORMAT_NAME;
}

/* ------------------------------------------------------------ the layout */

/* The tensors of the layout ly (a cache of spec s in formats fk/fv
 * holding nb blocks of T positions; file_runs: the file's runs of
 * positions, each starting a block), in file order, into a malloc'd array
 * (*out, count returned) and the data section's size. Returns -1 (why set)
 * if a format cannot store the head dim or the sizes overflow. Both the
 * writer and the reader use this: the reader requires the file's table to
 * be exactly this one. */
int aks_layout_tensors(const aks_layout *ly, tensor_desc **out, uint64_t *data_bytes, char *why, size_t whyn) {
    const ak_cache_spec *s = ly->spec;
    ak_kv_format fk = ly->fk, fv = ly->fv;
    int64_t nb = ly->nb, lb0 = ly->lb0;
    int T = ly->T;
    ak_kv_component ck[2], cv[2];
    int nck = ak_kv_format_components(fk, s->head_dim_k, ck);
    int ncv = ak_kv_format_components(fv, s->head_dim_v, cv);
    if (!nck || !ncv) {
        snprintf(why, whyn, "formats %s/%s cannot store head dims %d/%d", ak_kv_format_get(fk)->name,
                 ak_kv_format_get(fv)->name, s->head_dim_k, s->head_dim_v);
        return -1;
    }
    if (lb0 < 0 || lb0 > nb) {
        snprintf(why, whyn, "local layers from block %lld of %lld", (long long)lb0, (long long)nb);
        return -1;
    }
    if (T < 1 || T > AK_KV_MAX_BLOCK_TOKENS || nb < 0) {
        snprintf(why, whyn, "block size %d outside [1, %d]", T, AK_KV_MAX_BLOCK_TOKENS);
        return -1;
    }
    int count = s->n_layer * (nck + ncv);
    tensor_desc *t = calloc((size_t)count, sizeof *t);
    if (!t) { snprintf(why, whyn, "out of memory"); return -1; }
    uint64_t off = 0;
    int i = 0;
    for (int l = 0; l < s->n_layer; l++)
        for (int v = 0; v < 2; v++)
            for (int c = 0; c < (v ? ncv : nck); c++, i++) {
                tensor_desc *d = &t[i];
                d->layer = l;
                d->is_v = v;
                d->comp = v ? cv[c] : ck[c];
                d->ci = c;
                snprintf(d->name, sizeof d->name, "layers.%d.%c.%s", l, v ? 'v' : 'k', d->comp.name);
                d->ndim = 3 + d->comp.ndim;
                d->b0 = ak_spec_group(s, l) ? lb0 : 0;
                d->shape[0] = nb - d->b0;
                d->shape[1] = s->n_head_kv;
                d->shape[2] = T;
                for (int k = 0; k < d->comp.ndim; k++) d->shape[3 + k] = d->comp.shape[k];
                uint64_t b;
                if (__builtin_mul_overflow((uint64_t)d->shape[0] * (uint64_t)T, (uint64_t)s->n_head_kv, &b) ||
                    __builtin_mul_overflow(b, (uint64_t)d->comp.bytes, &b) || __builtin_add_overflow(off, b, &off)) {
                    free(t);
                    snprintf(why, whyn, "tensor sizes overflow");
                    return -1;
                }
                d->offset = off - b;
                d->bytes = b;
                d->piece = (uint64_t)s->n_head_kv * (uint64_t)T * d->comp.bytes;
            }
    *out = t;
    *data_bytes = off;
    return count;
}

/* The segments of a base (store.h: SEGMENTS) into out: those listed, or
 * the single base as one segment (none without a base). Returns their
 * number. */
static int base_segs(const ak_store_base *b, ak_store_seg *out) {
    if (b->n_seg > 0) {
        memcpy(out, b->seg, sizeof *out * (size_t)b->n_seg);
        return b->n_seg;
    }
    if (!b->pool_id[0] || b->base_len <= 0) return 0;
    memset(out, 0, sizeof *out);
    out->kind = b->card ? AK_SEG_CARD : AK_SEG_POOL;
    out->len = b->base_len;
    snprintf(out->id, sizeof out->id, "%s", b->pool_id);
    snprintf(out->hash, sizeof out->hash, "%s", b->pool_hash);
    return 1;
}

void aks_runs_of(const ak_store_base *b, int n_tokens, int T, file_runs *r) {
    ak_store_seg sg[AK_KV_MAX_SEGMENTS];
    int ns = base_segs(b, sg), at = 0;
    r->n = 0;
    r->blk0[0] = 0;
    for (int k = 0; k <= ns; k++) {
        int len = k < ns ? sg[k].len : n_tokens - at;
        if (k == ns || sg[k].kind == AK_SEG_OWN) {
            r->start[r->n] = at;
            r->len[r->n] = len > 0 ? len : 0;
            r->blk0[r->n + 1] = r->blk0[r->n] + (r->len[r->n] + T - 1) / T;
            r->n++;
        }
        if (k < ns) at += len;
    }
}

/* The run holding file block b (< the runs' blocks). */
static int run_of_block(const file_runs *r, int64_t b) {
    int k = 0;
    while (k + 1 < r->n && r->blk0[k + 1] <= b) k++;
    return k;
}

/* The first position of file block b. */
int64_t aks_block_pos(const file_runs *r, int64_t b, int T) {
    int k = run_of_block(r, b);
    return r->start[k] + (b - r->blk0[k]) * T;
}

int64_t aks_local_b0(const file_runs *r, int wf, int T) {
    int64_t n = 0;
    for (int k = 0; k < r->n; k++)
        for (int q = 0; q < r->len[k]; q += T) {
            int end = r->start[k] + (q + T < r->len[k] ? q + T : r->len[k]);
            if (end > wf) return n;
            n++;
        }
    return n;
}

/* Positions from p to the end of the block of kv that holds p (kvcache.h
 * keeps the mapping: segments, then own blocks). */
static int kv_run(const ak_kv *kv, int p) { return ak_kv_block_end(kv, p) - p; }

/* Copies the positions of the runs (the last run's from its start + skip)
 * of every vector between a sequence and tensor bytes laid out by t (nt
 * tensors, file blocks of Tf positions as the runs say). to_kv = 1: into kv
 * (positions prepared and exclusively owned), 0: out of it, and then each
 * run's last file block's slots past its end are zeroed. A piece of
 * positions that stays within one file block and one block of kv is
 * contiguous on both sides (blockpool.h): one memcpy per (tensor, head,
 * piece); with equal block sizes a piece is a whole block. Returns 0, or
 * -1 if a vector is not available. */
int aks_transfer(ak_kv *kv, int to_kv, uint8_t *data, const tensor_desc *t, int nt, const file_runs *ru, int skip,
                    int Tf) {
    const ak_cache_spec *s = ak_block_pool_spec(ak_kv_pool(kv));
    int H = s->n_head_kv;
    for (int i = 0; i < nt; i++) {
        size_t cb = t[i].comp.bytes;
        uint8_t *td = data + t[i].offset;
        /* a version 7 file's local layers start at file block b0: run k
         * holds file blocks from blk0[k], the first of them at its start */
        int64_t tb0 = t[i].b0;
        for (int k = 0; k < ru->n; k++) {
            int s0 = ru->start[k], n = s0 + ru->len[k], p0 = s0 + (k == ru->n - 1 ? skip : 0);
            if (tb0 >= ru->blk0[k + 1]) continue;
            if (tb0 > ru->blk0[k] && p0 < s0 + (tb0 - ru->blk0[k]) * Tf) p0 = (int)(s0 + (tb0 - ru->blk0[k]) * Tf);
            for (int h = 0; h < H; h++)
                for (int p = p0; p < n;) {
                    int q = p - s0, r = Tf - q % Tf, rp = kv_run(kv, p);
                    if (rp < r) r = rp;
                    if (n - p < r) r = n - p;
                    uint8_t *a = to_kv ? ak_kv_stored_mut(kv, t[i].layer, t[i].is_v, t[i].ci, h, p)
                                       : (uint8_t *)ak_kv_stored(kv, t[i].layer, t[i].is_v, t[i].ci, h, p);
                    if (!a) return -1;
                    uint8_t *tp = td + (((size_t)(ru->blk0[k] + q / Tf - tb0) * H + (size_t)h) * Tf + (size_t)(q % Tf)) * cb;
                    if (to_kv) memcpy(a, tp, (size_t)r * cb);
                    else memcpy(tp, a, (size_t)r * cb);
                    p += r;
                }
            int own = ru->len[k];
            if (!to_kv && own % Tf)   /* the run's last block's unused slots: zeros, so the file is a function of the cache */
                for (int h = 0; h < H; h++)
                    memset(td + (((size_t)(ru->blk0[k] + own / Tf - tb0) * H + (size_t)h) * Tf + (size_t)(own % Tf)) * cb,
                           0, (size_t)(Tf - own % Tf) * cb);
        }
    }
    return 0;
}

/* XXH3_64bits of the 8-byte little-endian values h[0..nt) (a block's
 * checksum from its pieces' hashes); scratch holds nt * 8 bytes. */
uint64_t aks_combine_hashes(const uint64_t *h, int nt, uint8_t *scratch) {
    for (int i = 0; i < nt; i++)
        for (int k = 0; k < 8; k++) scratch[(size_t)i * 8 + (size_t)k] = (uint8_t)(h[i] >> (8 * k));
    return XXH3_64bits(scratch, (size_t)nt * 8);
}

/* The checksum of file block b of the data section data (tensors t). hs
 * holds nt hashes, scratch nt * 8 bytes. */
static uint64_t block_checksum(const uint8_t *data, const tensor_desc *t, int nt, int64_t b, uint64_t *hs,
                               uint8_t *scratch) {
    int n = 0;
    for (int i = 0; i < nt; i++)   /* the tensors that hold block b (a version 7 file's local ones from b0) */
        if (b >= t[i].b0) hs[n++] = XXH3_64bits(data + t[i].offset + (uint64_t)(b - t[i].b0) * t[i].piece, (size_t)t[i].piece);
    return aks_combine_hashes(hs, n, scratch);
}

/* File blocks of a table t (nt tensors): tensor 0's b0 plus its blocks. */
int64_t aks_table_blocks(const tensor_desc *t, int nt) { return nt ? t[0].b0 + t[0].shape[0] : 0; }

/* ------------------------------------------------ names, the canonical base */

int aks_fingerprint_ok(const char *fp) {
    size_t n = fp ? strlen(fp) : 0;
    if (n < 1 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (fp[i] <= ' ' || fp[i] > '~') return 0;   /* printable ASCII, no space */
    return 1;
}

/* 1 if h is 16 lowercase hex digits. */
int aks_hash_ok(const char *h) {
    if (!h || strlen(h) != 16) return 0;
    for (int i = 0; i < 16; i++)
        if (!((h[i] >= '0' && h[i] <= '9') || (h[i] >= 'a' && h[i] <= 'f'))) return 0;
    return 1;
}

/* Puts base b in its canonical form (store.h: SEGMENTS): its segments
 * listed (the single base as one), the single-base fields naming the first
 * segment when it is a pool's or a card's, base_len their total. Returns 0,
 * or -1 (why set) when the segments are not sound: more than
 * AK_KV_MAX_SEGMENTS, an empty one, a pool past the first, a pool or card
 * without a valid id and hash, an own segment with either, longer in all
 * than n_tokens. */
int aks_base_normalize(ak_store_base *b, int n_tokens, char *why, size_t whyn) {
    ak_store_seg sg[AK_KV_MAX_SEGMENTS];
    if (b->n_seg < 0 || b->n_seg > AK_KV_MAX_SEGMENTS) {
        snprintf(why, whyn, "%d segments (at most %d)", b->n_seg, AK_KV_MAX_SEGMENTS);
        return -1;
    }
    int ns = base_segs(b, sg);
    int64_t total = 0;
    for (int k = 0; k < ns; k++) {
        const ak_store_seg *g = &sg[k];
        int named = g->kind == AK_SEG_POOL || g->kind == AK_SEG_CARD;
        if (g->len < 1 || (!named && g->kind != AK_SEG_OWN) || (g->kind == AK_SEG_POOL && k > 0) ||
            (named && (!ak_agent_id_valid(g->id) || !aks_hash_ok(g->hash))) || (!named && (g->id[0] || g->hash[0]))) {
            snprintf(why, whyn, "segment %d (kind %d, %d positions, \"%.40s\", \"%.16s\") is not sound", k, g->kind,
                     g->len, g->id, g->hash);
            return -1;
        }
        total += g->len;
    }
    if (total > n_tokens) {
        snprintf(why, whyn, "segments of %lld positions in all, of %d tokens", (long long)total, n_tokens);
        return -1;
    }
    memset(b, 0, sizeof *b);
    b->n_seg = ns;
    memcpy(b->seg, sg, sizeof *sg * (size_t)ns);
    b->base_len = (int)total;
    if (ns && sg[0].kind != AK_SEG_OWN) {
        snprintf(b->pool_id, sizeof b->pool_id, "%s", sg[0].id);
        snprintf(b->pool_hash, sizeof b->pool_hash, "%s", sg[0].hash);
        b->card = sg[0].kind == AK_SEG_CARD;
    }
    return 0;
}

/* -------------------------------------------- corrections (their reader) */

/* Reads a decimal int in [0, hi] up to the next ':' at *p (advanced past
 * it). Returns 0, or -1. */
static int corr_int(const char **p, int hi, int *out) {
    int64_t x = 0;
    const char *q = *p;
    if (*q < '0' || *q > '9') return -1;
    while (*q >= '0' && *q <= '9')
        if ((x = x * 10 + (*q++ - '0')) > hi) return -1;
    if (*q != ':') return -1;
    *out = (int)x;
    *p = q + 1;
    return 0;
}

/* n floats of 8 lowercase hex digits each at *p (advanced). Returns 0, or -1. */
static int corr_floats(const char **p, float *out, size_t n) {
    const char *q = *p;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = 0;
        for (int k = 0; k < 8; k++) {
            char c = *q++;
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (d < 0) return -1;
            u = u << 4 | (uint32_t)d;
        }
        memcpy(&out[i], &u, 4);
    }
    *p = q;
    return 0;
}

ak_store_status aks_apply_corrections(const agent_meta *m, ak_kv *kv, verdict *v) {
    if (!m->corrections) return AK_STORE_HIT;
    const ak_cache_spec *sp = &m->spec;
    size_t kd = (size_t)sp->n_head_kv * sp->head_dim_k, vd = (size_t)sp->n_head_kv * sp->head_dim_v;
    const char *p = m->corrections;
    float *w = NULL, *mu = malloc(sizeof(float) * (kd + vd));
    ak_error e = {{0}};
    ak_store_status st = AK_STORE_HIT;
    if (!mu) return aks_judge_error(v, AK_ERR_NOMEM, "out of memory");
    while (st == AK_STORE_HIT && *p) {
        int s0, n, l0, idx;
        if (corr_int(&p, m->n_tokens, &s0) || corr_int(&p, m->n_tokens, &n) || corr_int(&p, sp->n_layer - 1, &l0) ||
            n < 1 || s0 + n > m->n_tokens || !(w = realloc(w, sizeof(float) * (size_t)n)) || corr_floats(&p, w, (size_t)n) ||
            *p++ != ':') {
            st = aks_judge(v, AK_STORE_CORRUPT, "corrections", "a malformed correction record");
            break;
        }
        const char *set = p;
        p += sp->n_layer;
        for (int l = 0; l < sp->n_layer; l++)
            if (!set[l] || (set[l] != '0' && set[l] != '1')) { st = AK_STORE_CORRUPT; break; }
        if (st != AK_STORE_HIT || *p++ != ':' || (idx = ak_kv_correction_add(kv, s0, n, l0, w, &e)) < 0) {
            st = aks_judge(v, AK_STORE_CORRUPT, "corrections", "a malformed correction record%s%s", e.msg[0] ? ": " : "",
                           e.msg);
            break;
        }
        for (int l = 0; l < sp->n_layer && st == AK_STORE_HIT; l++) {
            if (corr_floats(&p, mu, kd + vd)) st = aks_judge(v, AK_STORE_CORRUPT, "corrections", "short correction offsets");
            else if (set[l] == '1' && ak_kv_correction_set(kv, idx, l, mu, mu + kd, &e) < 0)
                st = aks_judge(v, AK_STORE_CORRUPT, "corrections", "a correction refused: %s", e.msg);
        }
        if (st == AK_STORE_HIT && *p && *p++ != ';') st = aks_judge(v, AK_STORE_CORRUPT, "corrections", "correction records not separated by ';'");
    }
    free(w);
    free(mu);
    if (st != AK_STORE_HIT) ak_kv_correction_clear(kv);
    return st;
}

/* -------------------------------------------------- the metadata checksum */

static int cmp_pair(const void *a, const void *b) { return strcmp(((const aks_pair *)a)->key, ((const aks_pair *)b)->key); }

/* metadata_checksum over pairs (sorted in place), skipping the entry
 * "metadata_checksum" itself. Returns -1 on a duplicate key or no memory. */
int aks_metadata_hash(aks_pair *p, int n, char out[17]) {
    qsort(p, (size_t)n, sizeof *p, cmp_pair);
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        if (i && !strcmp(p[i].key, p[i - 1].key)) return -1;
        len += strlen(p[i].key) + strlen(p[i].val) + 2;
    }
    char *buf = malloc(len + 1), *w = buf;
    if (!buf) return -1;
    for (int i = 0; i < n; i++) {
        if (!strcmp(p[i].key, "metadata_checksum")) continue;
        size_t a = strlen(p[i].key) + 1, b = strlen(p[i].val) + 1;
        memcpy(w, p[i].key, a);
        memcpy(w + a, p[i].val, b);
        w += a + b;
    }
    aks_hex64(XXH3_64bits(buf, (size_t)(w - buf)), out);
    free(buf);
    return 0;
}

/* Wipes the "tokens" and "source" metadata strings of a parsed or built
 * header (token ids, a pool's text: plaintext of a sealed file) before the
 * tree is freed. */
void aks_wipe_tokens(cJSON *root) {
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    static const char *keys[] = {"tokens", "source"};   /* a pool's source is its text */
    for (int i = 0; i < 2; i++) {
        cJSON *tk = cJSON_GetObjectItemCaseSensitive(meta, keys[i]);
        if (cJSON_IsString(tk) && tk->valuestring) sodium_memzero(tk->valuestring, strlen(tk->valuestring));
    }
}


/* ---------------------------------------------------------------- verdicts */

/* The error code of a status (ERROR: an I/O error unless said otherwise). */
static int status_code(ak_store_status st) {
    switch (st) {
    case AK_STORE_HIT: return AK_ERR_NONE;
    case AK_STORE_ABSENT: return AK_ERR_NOT_FOUND;
    case AK_STORE_STALE: return AK_ERR_STALE;
    case AK_STORE_CORRUPT: return AK_ERR_CORRUPT;
    case AK_STORE_ERROR: return AK_ERR_IO;
    }
    return AK_ERR_GENERIC;
}

/* Records a verdict (status, quarantine slug, error code, message) and
 * returns its status. */
__attribute__((format(printf, 5, 0))) static ak_store_status vjudge(verdict *v, ak_store_status st, const char *slug,
                                                                   int code, const char *fmt, va_list ap) {
    vsnprintf(v->msg, sizeof v->msg, fmt, ap);
    v->st = st;
    v->slug = slug;
    v->code = code;
    return st;
}

__attribute__((format(printf, 4, 5))) ak_store_status
aks_judge(verdict *v, ak_store_status st, const char *slug, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vjudge(v, st, slug, status_code(st), fmt, ap);
    va_end(ap);
    return st;
}

/* aks_judge(v, AK_STORE_ERROR, ...) with an error code other than IO (out of
 * memory, KV budget). */
__attribute__((format(printf, 3, 4))) ak_store_status aks_judge_error(verdict *v, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vjudge(v, AK_STORE_ERROR, NULL, code, fmt, ap);
    va_end(ap);
    return AK_STORE_ERROR;
}

/* ------------------------------------------------------- parsing, checks */

void aks_meta_free(agent_meta *m) {
    if (m->tokens) sodium_memzero(m->tokens, sizeof(int32_t) * (size_t)m->n_tokens);
    free(m->tokens);
    aks_wipe_tokens(m->root);
    cJSON_Delete(m->root);
    memset(m, 0, sizeof *m);
}

static const char *meta_str(const cJSON *meta, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(meta, key);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

/* The base of a version 5 agent file given as "segments" (sg; store.h:
 * SEGMENTS): records "kind:len" (own) or "kind:len:id:hash" (pool, card),
 * comma-separated, their lengths summing to "base_len"; no "pool_id",
 * "pool_hash" or "base_kind" beside them. Into m->base, canonical. */
static ak_store_status parse_segments(const cJSON *meta, const char *sg, agent_meta *m, verdict *v) {
    const char *bl = meta_str(meta, "base_len");
    int64_t x = 0;
    if (m->version < 5) return aks_judge(v, AK_STORE_CORRUPT, "metadata", "segments in a version %d file", m->version);
    if (meta_str(meta, "pool_id") || meta_str(meta, "pool_hash") || meta_str(meta, "base_kind"))
        return aks_judge(v, AK_STORE_CORRUPT, "metadata", "segments beside a single base");
    if (!bl || ak_parse_dec(bl, 1, m->n_tokens, &x))
        return aks_judge(v, AK_STORE_CORRUPT, "metadata", "segments with base_len \"%.20s\" (of %d tokens)", bl ? bl : "",
                     m->n_tokens);
    ak_store_base *b = &m->base;
    memset(b, 0, sizeof *b);
    for (const char *p = sg;;) {
        if (b->n_seg == AK_KV_MAX_SEGMENTS)
            return aks_judge(v, AK_STORE_CORRUPT, "metadata", "more than %d segments", AK_KV_MAX_SEGMENTS);
        /* the record's fields, ':'-separated, up to ',' or the end */
        const char *end = strchr(p, ','), *f[5];
        if (!end) end = p + strlen(p);
        int nf = 0;
        f[nf++] = p;
        for (const char *q = p; q < end && nf < 5; q++)
            if (*q == ':') f[nf++] = q + 1;
        char fld[4][AK_AGENT_ID_MAX + 2];
        int ok = nf == 2 || nf == 4;
        for (int i = 0; ok && i < nf; i++) {
            size_t len = (size_t)((i + 1 < nf ? f[i + 1] - 1 : end) - f[i]);
            ok = len < sizeof fld[i];
            if (ok) {
                memcpy(fld[i], f[i], len);
                fld[i][len] = 0;
            }
        }
        ak_store_seg *g = &b->seg[b->n_seg];
        int64_t len = 0;
        if (ok) {
            g->kind = !strcmp(fld[0], "own") ? AK_SEG_OWN : !strcmp(fld[0], "pool") ? AK_SEG_POOL
                                                         : !strcmp(fld[0], "card") ? AK_SEG_CARD : -1;
            ok = g->kind >= 0 && (nf == 2) == (g->kind == AK_SEG_OWN) && !ak_parse_dec(fld[1], 1, m->n_tokens, &len);
        }
        if (ok && nf == 4) {
            ok = strlen(fld[2]) <= AK_AGENT_ID_MAX && strlen(fld[3]) < sizeof g->hash;
            if (ok) {
                memcpy(g->id, fld[2], strlen(fld[2]) + 1);    /* lengths checked above */
                memcpy(g->hash, fld[3], strlen(fld[3]) + 1);
            }
        }
        if (!ok)
            return aks_judge(v, AK_STORE_CORRUPT, "metadata", "segment %d \"%.60s\" is not kind:len[:id:hash]", b->n_seg, p);
        g->len = (int)len;
        b->n_seg++;
        if (!*end) break;
        p = end + 1;
    }
    char why[160];
    if (aks_base_normalize(b, m->n_tokens, why, sizeof why) < 0)
        return aks_judge(v, AK_STORE_CORRUPT, "metadata", "bad segments: %s", why);
    if (b->base_len != x)
        return aks_judge(v, AK_STORE_CORRUPT, "metadata", "segments of %d positions, base_len %lld", b->base_len, (long long)x);
    return AK_STORE_HIT;
}

/* The base of an agent file ("pool_id", "pool_hash", "base_len": all
 * absent or "" / "" / "0" without one), or a pool file's "pool_hash" and
 * "source" (and no base), into m, after the rest of the metadata. For a
 * pool, the hash must be the one recomputed from what the file says it
 * holds: a pool is named by its contents. */
static ak_store_status parse_base(const cJSON *meta, agent_meta *m, verdict *v) {
    const char *pid = meta_str(meta, "pool_id"), *ph = meta_str(meta, "pool_hash"), *bl = meta_str(meta, "base_len");
    int64_t x = 0;
    int none = (!pid || !*pid) && (!bl || !strcmp(bl, "0"));
    if (ak_kind_pooled(m->kind)) {
        if (!none) return aks_judge(v, AK_STORE_CORRUPT, "metadata", "a pool file with a base");
        if (!aks_hash_ok(ph)) return aks_judge(v, AK_STORE_CORRUPT, "metadata", "metadata pool_hash missing or not 16 hex digits");
        if (!(m->source = meta_str(meta, "source"))) return aks_judge(v, AK_STORE_CORRUPT, "metadata", "metadata key source missing");
        char want[17];
        ak_pool_content_hash(m->fingerprint, &m->spec, m->fk, m->fv, m->tokens, m->n_tokens, want);
        if (strcmp(ph, want))
            return aks_judge(v, AK_STORE_CORRUPT, "poolhash", "pool_hash %s is not the hash of the pool's contents (%s)", ph,
                         want);
        snprintf(m->pool_hash, sizeof m->pool_hash, "%s", ph);
        return AK_STORE_HIT;
    }
    const char *sg = meta_str(meta, "segments");
    if (sg) return parse_segments(meta, sg, m, v);
    if (none) {
        if (ph && *ph) return aks_judge(v, AK_STORE_CORRUPT, "metadata", "pool_hash without a base");
        return AK_STORE_HIT;
    }
    if (!pid || !ak_agent_id_valid(pid) || !aks_hash_ok(ph) || !bl || ak_parse_dec(bl, 1, m->n_tokens, &x))
        return aks_judge(v, AK_STORE_CORRUPT, "metadata", "bad base: pool_id \"%.40s\", pool_hash \"%.20s\", base_len \"%.20s\" "
                     "(of %d tokens)", pid ? pid : "", ph ? ph : "", bl ? bl : "", m->n_tokens);
    const char *kind = meta_str(meta, "base_kind");
    if (kind && strcmp(kind, "pool") && strcmp(kind, "card"))
        return aks_judge(v, AK_STORE_CORRUPT, "metadata", "base_kind \"%.20s\" is neither pool nor card", kind);
    snprintf(m->base.pool_id, sizeof m->base.pool_id, "%s", pid);
    snprintf(m->base.pool_hash, sizeof m->base.pool_hash, "%s", ph);
    m->base.base_len = (int)x;
    m->base.card = kind && !strcmp(kind, "card");
    char why[160];
    if (aks_base_normalize(&m->base, m->n_tokens, why, sizeof why) < 0)
        return aks_judge(v, AK_STORE_CORRUPT, "metadata", "bad base: %s", why);
    return AK_STORE_HIT;
}


ak_store_status aks_header_length(const uint8_t *img8, uint64_t img_size, uint64_t *n, verdict *v) {
    uint64_t N = 0;
    for (int i = 7; i >= 0; i--) N = N << 8 | img8[i];
    if (N > img_size - 8)
        return aks_judge(v, AK_STORE_CORRUPT, "truncated", "header length %llu runs past the end of the %llu-byte image",
                     (unsigned long long)N, (unsigned long long)img_size);
    if (N < 2) return aks_judge(v, AK_STORE_CORRUPT, "header", "header length %llu is too small", (unsigned long long)N);
    *n = N;
    return AK_STORE_HIT;
}

ak_store_status aks_parse_header(const uint8_t *img, uint64_t N, int kind, const char *id, agent_meta *m,
                                 verdict *v) {
    memset(m, 0, sizeof *m);
    m->hdr_end = 8 + N;
    const char *json = (const char *)img + 8, *end = NULL;
    if (json[0] != '{') return aks_judge(v, AK_STORE_CORRUPT, "json", "header is not a JSON object");
    m->root = cJSON_ParseWithLengthOpts(json, (size_t)N, &end, 0);
    if (!m->root || !cJSON_IsObject(m->root))
        return aks_judge(v, AK_STORE_CORRUPT, "json", "header is not valid JSON (near byte %lld)",
                     end ? (long long)(end - json) + 8 : -1LL);
    for (const char *p = end; p < json + N; p++)
        if (*p != ' ') return aks_judge(v, AK_STORE_CORRUPT, "json", "header padding has a non-space byte at %lld",
                                    (long long)(p - json) + 8);

    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(m->root, "__metadata__");
    if (!cJSON_IsObject(meta)) return aks_judge(v, AK_STORE_CORRUPT, "metadata", "no __metadata__ object");
    int np = cJSON_GetArraySize(meta);
    aks_pair *pairs = calloc((size_t)np + 1, sizeof *pairs);
    if (!pairs) return aks_judge_error(v, AK_ERR_NOMEM, "out of memory");
    int i = 0;
    for (const cJSON *it = meta->child; it; it = it->next, i++) {
        if (!cJSON_IsString(it) || !it->string) {
            free(pairs);
            return aks_judge(v, AK_STORE_CORRUPT, "metadata", "metadata value %s is not a string", it->string ? it->string : "?");
        }
        pairs[i] = (aks_pair){.key = it->string, .val = it->valuestring};
    }
    const char *fmt = meta_str(meta, "format"), *ver = meta_str(meta, "format_version");
    int64_t x;
    m->kind = kind;
    if (!fmt || strcmp(fmt, aks_kind_format(kind))) {
        free(pairs);
        return aks_judge(v, AK_STORE_CORRUPT, "metadata", "not an agentkv %s file (format \"%.40s\")", ak_kind_word(kind),
                     fmt ? fmt : "");
    }
    if (!ver || ak_parse_dec(ver, 1, INT32_MAX, &x)) {
        free(pairs);
        return aks_judge(v, AK_STORE_CORRUPT, "metadata", "bad format_version \"%.20s\"", ver ? ver : "");
    }
    if (x < AK_FORMAT_VERSION_OLDEST || x > AK_FORMAT_VERSION_WINDOW) {
        free(pairs);
        return aks_judge(v, AK_STORE_STALE, NULL, "format version %lld is %s than this build's %d..%d", (long long)x,
                     x > AK_FORMAT_VERSION_WINDOW ? "newer" : "older", AK_FORMAT_VERSION_OLDEST, AK_FORMAT_VERSION_WINDOW);
    }
    m->version = (int)x;
    /* corrections come with version 6 and only then (a 5 never has them) */
    m->corrections = meta_str(meta, "corrections");
    if ((m->corrections && x < AK_FORMAT_VERSION_CORR) || (!m->corrections && x == AK_FORMAT_VERSION_CORR) ||
        (m->corrections && kind != AK_FILE_AGENT)) {
        free(pairs);
        return aks_judge(v, AK_STORE_CORRUPT, "metadata", "corrections %s in a version %lld %s file",
                         m->corrections ? "present" : "missing", (long long)x, ak_kind_word(kind));
    }
    char want[17];
    const char *got = meta_str(meta, "metadata_checksum");
    int dup = aks_metadata_hash(pairs, np, want);
    free(pairs);
    if (dup) return aks_judge(v, AK_STORE_CORRUPT, "metadata", "duplicate metadata key");
    if (!got || strcmp(got, want))
        return aks_judge(v, AK_STORE_CORRUPT, "metadata", "metadata checksum mismatch (%.16s, computed %s)", got ? got : "none",
                     want);

    static const char *required[] = {"agent_id", "model_fingerprint", "model_name", "n_layer", "n_head_kv",
                                     "head_dim_k", "head_dim_v", "n_ctx", "kv_format_k", "kv_format_v",
                                     "block_tokens", "n_tokens", "tokens", "created", "checksum_algorithm",
                                     "block_checksums"};
    for (size_t k = 0; k < sizeof required / sizeof *required; k++)
        if (!meta_str(meta, required[k])) return aks_judge(v, AK_STORE_CORRUPT, "metadata", "metadata key %s missing", required[k]);
    const char *aid = meta_str(meta, "agent_id"), *fp = meta_str(meta, "model_fingerprint");
    const char *name = meta_str(meta, "model_name");
    if (strcmp(aid, id))
        return aks_judge(v, AK_STORE_CORRUPT, "id", "agent_id \"%.40s\" does not match the file name", aid);
    if (!aks_fingerprint_ok(fp) || strlen(name) >= sizeof m->model_name)
        return aks_judge(v, AK_STORE_CORRUPT, "metadata", "bad model_fingerprint or model_name");
    if (strcmp(meta_str(meta, "checksum_algorithm"), "xxh3-64"))
        return aks_judge(v, AK_STORE_CORRUPT, "metadata", "unknown checksum_algorithm");
    static const char *ckeys[2] = {"key_center", "value_center"};
    for (int k = 0; k < 2; k++) {
        const char *c = meta_str(meta, ckeys[k]);
        size_t cl = c ? strlen(c) : 0;
        int ok = cl >= 1 && cl <= 32;
        for (size_t i = 0; ok && i < cl; i++)
            ok = (c[i] >= '0' && c[i] <= '9') || (c[i] >= 'a' && c[i] <= 'z') || c[i] == '.' || c[i] == '-';
        if (!ok) return aks_judge(v, AK_STORE_CORRUPT, "metadata", "metadata %s missing or not an id", ckeys[k]);
        snprintf(m->center[k], sizeof m->center[k], "%s", c);
    }
    snprintf(m->agent_id, sizeof m->agent_id, "%s", aid);
    snprintf(m->fingerprint, sizeof m->fingerprint, "%s", fp);
    snprintf(m->model_name, sizeof m->model_name, "%s", name);
    struct { const char *key; int64_t lo, hi; int64_t val; } ints[] = {
        {.key = "n_layer", .lo = 1, .hi = MAX_DIM},
        {.key = "n_head_kv", .lo = 1, .hi = MAX_DIM},
        {.key = "head_dim_k", .lo = 1, .hi = 1024},
        {.key = "head_dim_v", .lo = 1, .hi = 1024},
        {.key = "n_ctx", .lo = 0, .hi = INT32_MAX},
        {.key = "block_tokens", .lo = 1, .hi = AK_KV_MAX_BLOCK_TOKENS},
        {.key = "n_tokens", .lo = 0, .hi = INT32_MAX},
        {.key = "created", .lo = 0, .hi = INT64_MAX},
    };
    for (size_t k = 0; k < sizeof ints / sizeof *ints; k++)
        if (ak_parse_dec(meta_str(meta, ints[k].key), ints[k].lo, ints[k].hi, &ints[k].val))
            return aks_judge(v, AK_STORE_CORRUPT, "metadata", "metadata %s \"%.20s\" is not an integer in [%lld, %lld]",
                         ints[k].key, meta_str(meta, ints[k].key), (long long)ints[k].lo, (long long)ints[k].hi);
    m->spec = (ak_cache_spec){.n_layer = (int)ints[0].val, .n_head_kv = (int)ints[1].val, .head_dim_k = (int)ints[2].val,
                              .head_dim_v = (int)ints[3].val, .n_ctx = (int)ints[4].val};
    m->block_tokens = (int)ints[5].val;
    m->n_tokens = (int)ints[6].val;
    m->created = ints[7].val;
    if (m->version == AK_FORMAT_VERSION_WINDOW) {
        /* the local layers (one '0'/'1' a layer), their window, and the
         * first position they hold: a block boundary inside n_tokens of an
         * agent file without a base (checked with the base below) */
        const char *loc = meta_str(meta, "local_layers");
        int64_t wf, w;
        if (kind != AK_FILE_AGENT || !loc || strlen(loc) != (size_t)m->spec.n_layer || m->spec.n_layer > AK_KV_MAX_LAYERS ||
            ak_parse_dec(meta_str(meta, "window_first"), 1, m->n_tokens, &wf) ||
            ak_parse_dec(meta_str(meta, "window"), 1, INT32_MAX, &w))
            return aks_judge(v, AK_STORE_CORRUPT, "metadata", "version 7 window metadata missing or not sound");
        for (int l = 0; l < m->spec.n_layer; l++) {
            if (loc[l] != '0' && loc[l] != '1')
                return aks_judge(v, AK_STORE_CORRUPT, "metadata", "local_layers is not a '0'/'1' string");
            m->spec.local[l] = loc[l] == '1';
        }
        m->spec.window = (int)w;
        if (ak_spec_groups(&m->spec) < 2)
            return aks_judge(v, AK_STORE_CORRUPT, "metadata", "version 7 file without a local layer");
        m->window_first = (int)wf;
    }
    /* a format this build does not know was written by a newer one */
    if (ak_kv_format_parse(meta_str(meta, "kv_format_k"), &m->fk) || ak_kv_format_parse(meta_str(meta, "kv_format_v"), &m->fv))
        return aks_judge(v, AK_STORE_STALE, NULL, "unknown KV format %.10s/%.10s", meta_str(meta, "kv_format_k"),
                     meta_str(meta, "kv_format_v"));

    /* every id takes a digit and a comma: bounds n_tokens before allocating */
    const char *p = meta_str(meta, "tokens");
    if ((uint64_t)m->n_tokens > (strlen(p) + 1) / 2)
        return aks_judge(v, AK_STORE_CORRUPT, "tokens", "token list too short for %d ids", m->n_tokens);
    if (!(m->tokens = malloc(sizeof(int32_t) * ((size_t)m->n_tokens + 1)))) return aks_judge_error(v, AK_ERR_NOMEM, "out of memory");
    int nt = 0, ok = 1;
    while (*p && ok) {
        /* canonical decimal ids in [0, 2^31), separated by single commas */
        if (nt >= m->n_tokens || *p < '0' || *p > '9' || (*p == '0' && p[1] >= '0' && p[1] <= '9')) { ok = 0; break; }
        int64_t t = 0;
        while (ok && *p >= '0' && *p <= '9')
            if ((t = t * 10 + (*p++ - '0')) > INT32_MAX) ok = 0;
        if (!ok) break;
        m->tokens[nt++] = (int32_t)t;
        if (*p == ',' && p[1]) p++;
        else if (*p) ok = 0;
    }
    if (!ok || nt != m->n_tokens)
        return aks_judge(v, AK_STORE_CORRUPT, "tokens", "token list does not hold %d canonical ids", m->n_tokens);
    ak_store_status bst = parse_base(meta, m, v);
    /* without a base window_first is a block boundary (with one, a span's
     * end of the sequence, which segments make any position) */
    if (bst == AK_STORE_HIT && m->window_first && m->base.base_len == 0 && m->window_first % m->block_tokens)
        return aks_judge(v, AK_STORE_CORRUPT, "metadata", "window_first %d is not a block boundary", m->window_first);
    return bst;
}

/* Parses "block_checksums" (nb entries) into out. Returns 0, or -1 if it
 * is not exactly nb comma-separated 16-hex-digit values. */
static int parse_block_sums(const char *str, int64_t nb, uint64_t *out) {
    if (!str || strlen(str) != (size_t)(nb ? nb * 17 - 1 : 0)) return -1;
    for (int64_t b = 0; b < nb; b++) {
        const char *p = str + b * 17;
        uint64_t x = 0;
        for (int k = 0; k < 16; k++) {
            char c = p[k];
            if (c >= '0' && c <= '9') x = x << 4 | (uint64_t)(c - '0');
            else if (c >= 'a' && c <= 'f') x = x << 4 | (uint64_t)(c - 'a' + 10);
            else return -1;
        }
        if (b < nb - 1 && p[16] != ',') return -1;
        out[b] = x;
    }
    return 0;
}

void aks_table_free(aks_table *tb) {
    free(tb->t);
    free(tb->sums);
    memset(tb, 0, sizeof *tb);
}

/* The tensor table of the header against the layout the metadata implies
 * (the own positions [base_len, n_tokens)) and the image size: on HIT *tb
 * gets the tensors and each block's checksum as the file states it, both
 * malloc'd (aks_table_free); else *tb is zeroed. Needs the header only. */
ak_store_status aks_check_table(uint64_t img_size, const agent_meta *m, aks_table *tb, verdict *v) {
    memset(tb, 0, sizeof *tb);
    char why[128];
    tensor_desc *t = NULL;
    uint64_t *sums = NULL;
    uint64_t data_bytes = 0;
    ak_kv_component c2[2];
    /* the count first: a hostile n_layer must not size an allocation */
    int64_t count = (int64_t)m->spec.n_layer * (ak_kv_format_components(m->fk, m->spec.head_dim_k, c2) +
                                                 ak_kv_format_components(m->fv, m->spec.head_dim_v, c2));
    if (cJSON_GetArraySize(m->root) - 1 != count)
        return aks_judge(v, AK_STORE_CORRUPT, "tensors", "header has %d tensors, expected %lld", cJSON_GetArraySize(m->root) - 1,
                     (long long)count);
    file_runs ru;
    aks_runs_of(&m->base, m->n_tokens, m->block_tokens, &ru);
    const aks_layout ly = {.spec = &m->spec, .fk = m->fk, .fv = m->fv, .nb = ru.blk0[ru.n], .T = m->block_tokens,
                           .lb0 = aks_local_b0(&ru, m->window_first, m->block_tokens)};
    int nt = aks_layout_tensors(&ly, &t, &data_bytes, why, sizeof why);
    if (nt < 0) return aks_judge(v, AK_STORE_CORRUPT, "metadata", "%s", why);
    int64_t nb = aks_table_blocks(t, nt);
    ak_store_status st = AK_STORE_HIT;
    uint64_t have = img_size - m->hdr_end;
    if (have != data_bytes) {
        st = aks_judge(v, AK_STORE_CORRUPT, "truncated", "data section is %llu bytes, the tensors need %llu (%s)",
                   (unsigned long long)have, (unsigned long long)data_bytes, have < data_bytes ? "truncated" : "trailing bytes");
        goto done;
    }
    /* nb is bounded by the image size now (every block holds bytes) */
    if (!(sums = malloc(sizeof *sums * (size_t)(nb ? nb : 1)))) {
        st = aks_judge_error(v, AK_ERR_NOMEM, "out of memory");
        goto done;
    }
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(m->root, "__metadata__");
    if (parse_block_sums(meta_str(meta, "block_checksums"), nb, sums) != 0) {
        st = aks_judge(v, AK_STORE_CORRUPT, "metadata", "block_checksums is not %lld comma-separated 16-hex-digit values",
                   (long long)nb);
        goto done;
    }
    for (int i = 0; i < nt; i++) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(m->root, t[i].name);
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "shape");
        const cJSON *of = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
        int ok = cJSON_IsObject(o) && cJSON_GetArraySize(o) == 3 && cJSON_IsString(dt) &&
                 !strcmp(dt->valuestring, t[i].comp.dtype) && cJSON_IsArray(sh) && cJSON_GetArraySize(sh) == t[i].ndim &&
                 cJSON_IsArray(of) && cJSON_GetArraySize(of) == 2;
        for (int k = 0; ok && k < t[i].ndim; k++) {
            const cJSON *e = cJSON_GetArrayItem(sh, k);
            ok = cJSON_IsNumber(e) && e->valuedouble == (double)t[i].shape[k];
        }
        if (ok) {
            const cJSON *b = cJSON_GetArrayItem(of, 0), *e = cJSON_GetArrayItem(of, 1);
            ok = cJSON_IsNumber(b) && cJSON_IsNumber(e) && b->valuedouble == (double)t[i].offset &&
                 e->valuedouble == (double)(t[i].offset + t[i].bytes);
        }
        if (!ok) {
            st = aks_judge(v, AK_STORE_CORRUPT, "tensors", "tensor %s: missing, or dtype, shape or offsets differ from the "
                       "layout of %s/%s", t[i].name, ak_kv_format_get(m->fk)->name, ak_kv_format_get(m->fv)->name);
            goto done;
        }
    }
done:
    if (st != AK_STORE_HIT) {
        free(t);
        free(sums);
        return st;
    }
    *tb = (aks_table){.t = t, .nt = nt, .sums = sums, .nb = nb};
    return st;
}

/* CORRUPT unless got is the checksum the file states for its block b (the
 * file's runs of positions: file_runs). */
ak_store_status aks_check_block(const agent_meta *m, int64_t b, uint64_t want, uint64_t got, verdict *v) {
    if (want == got) return AK_STORE_HIT;
    char w[17], g[17];
    aks_hex64(want, w);
    aks_hex64(got, g);
    file_runs ru;
    aks_runs_of(&m->base, m->n_tokens, m->block_tokens, &ru);
    int k = run_of_block(&ru, b);
    int64_t p0 = aks_block_pos(&ru, b, m->block_tokens), p1 = p0 + m->block_tokens;
    if (p1 > ru.start[k] + ru.len[k]) p1 = ru.start[k] + ru.len[k];
    return aks_judge(v, AK_STORE_CORRUPT, "checksum", "checksum mismatch in block %lld (positions %lld..%lld; file says %s, "
                 "data hashes to %s)", (long long)b, (long long)p0, (long long)p1 - 1, w, g);
}

/* The token ids against vocab (> 0). */
ak_store_status aks_check_tokens(const agent_meta *m, int vocab, verdict *v) {
    for (int i = 0; vocab > 0 && i < m->n_tokens; i++)
        if (m->tokens[i] >= vocab)
            return aks_judge(v, AK_STORE_CORRUPT, "tokens", "token id %d at position %d is outside the vocabulary of %d",
                         m->tokens[i], i, vocab);
    return AK_STORE_HIT;
}

/* The checksums of file blocks [j0, tb->nb) of an image whose data
 * section is data (in memory). */
ak_store_status aks_check_blocks(const agent_meta *m, const uint8_t *data, const aks_table *tb, int64_t j0,
                                 verdict *v) {
    int nt = tb->nt;
    uint64_t *hs = malloc(sizeof *hs * (size_t)(nt ? nt : 1));
    uint8_t *scratch = malloc((size_t)(nt ? nt : 1) * 8);
    ak_store_status st = AK_STORE_HIT;
    if (!hs || !scratch) st = aks_judge_error(v, AK_ERR_NOMEM, "out of memory");
    for (int64_t b = j0; b < tb->nb && st == AK_STORE_HIT; b++)
        st = aks_check_block(m, b, tb->sums[b], block_checksum(data, tb->t, nt, b, hs, scratch), v);
    free(hs);
    free(scratch);
    return st;
}


/* STALE unless the file is for this model, spec and formats and fits. */
ak_store_status aks_check_expect(const agent_meta *m, const char *fingerprint, const ak_kv *kv, verdict *v) {
    if (fingerprint && strcmp(m->fingerprint, fingerprint))
        return aks_judge(v, AK_STORE_STALE, NULL, "saved for model %s, not %s", m->fingerprint, fingerprint);
    if (!kv) return AK_STORE_HIT;
    const ak_cache_spec *s = ak_block_pool_spec(ak_kv_pool(kv)), *f = &m->spec;
    if (s->n_layer != f->n_layer || s->n_head_kv != f->n_head_kv || s->head_dim_k != f->head_dim_k ||
        s->head_dim_v != f->head_dim_v || s->n_ctx != f->n_ctx)
        return aks_judge(v, AK_STORE_STALE, NULL,
                     "cache spec %d layers x %d KV heads x %d/%d dims, n_ctx %d; expected %d x %d x %d/%d, n_ctx %d",
                     f->n_layer, f->n_head_kv, f->head_dim_k, f->head_dim_v, f->n_ctx, s->n_layer, s->n_head_kv,
                     s->head_dim_k, s->head_dim_v, s->n_ctx);
    if (m->fk != ak_kv_format_k(kv) || m->fv != ak_kv_format_v(kv))
        return aks_judge(v, AK_STORE_STALE, NULL, "KV formats %s/%s, expected %s/%s", ak_kv_format_get(m->fk)->name,
                     ak_kv_format_get(m->fv)->name, ak_kv_format_get(ak_kv_format_k(kv))->name,
                     ak_kv_format_get(ak_kv_format_v(kv))->name);
    for (int k = 0; k < 2; k++) {   /* all vectors of a sequence share one centering (blockpool.h) */
        const char *c = ak_block_pool_center_id(ak_kv_pool(kv), k, k ? m->fv : m->fk);
        if (strcmp(m->center[k], c ? c : "none"))
            return aks_judge(v, AK_STORE_STALE, NULL, "%s centered with %s, this cache uses %s", k ? "values" : "keys",
                         m->center[k], c ? c : "none");
    }
    if (m->n_tokens > ak_kv_capacity(kv))
        return aks_judge(v, AK_STORE_STALE, NULL, "%d tokens do not fit the sequence's capacity %d", m->n_tokens,
                     ak_kv_capacity(kv));
    if (m->window_first) {   /* version 7: the same local layers and window as this cache's */
        int same = ak_spec_groups(s) > 1 && s->window == f->window;
        for (int l = 0; same && l < s->n_layer; l++) same = ak_spec_group(s, l) == ak_spec_group(f, l);
        if (!same)
            return aks_judge(v, AK_STORE_STALE, NULL, "the file's sliding-window layers (window %d) are not this cache's",
                             f->window);
    }
    return AK_STORE_HIT;
}

void aks_entry_from_meta(ak_store_entry *e, const agent_meta *m) {
    e->readable = 1;
    e->n_tokens = m->n_tokens;
    e->fk = m->fk;
    e->fv = m->fv;
    e->spec = m->spec;
    e->block_tokens = m->block_tokens;
    e->created = m->created;
    snprintf(e->fingerprint, sizeof e->fingerprint, "%s", m->fingerprint);
    snprintf(e->model_name, sizeof e->model_name, "%s", m->model_name);
    e->base = m->base;
}

/* --------------------------------------------------------- content hashes
 *
 * The names of contents (not of files): an agent file records the content
 * hash of the pool or card its base came from ("pool_hash", or each named
 * record of "segments"), a pool or memory file its own ("pool_hash"), a
 * card file its own ("card_hash"), so that a pool, memory or card re-made under the same id
 * with other contents is told apart. Both are XXH3_64bits, seed 0, written
 * as 16 lowercase hex digits.
 *
 * A pool's or memory's (ak_pool_content_hash, store.h) is of
 *     "agentkv pool v1" 0x00
 *     fingerprint 0x00  kv_format_k name 0x00  kv_format_v name 0x00
 *     n_layer n_head_kv head_dim_k head_dim_v n_ctx n_tokens   u32 LE each
 *     the token ids                                            i32 LE each
 * so two pools of the same model, formats and tokens have the same hash
 * whatever their ids.
 *
 * A card's (ak_card_content_hash, cards.h) is of
 *     "agentkv card v1" 0x00
 *     fingerprint 0x00
 *     n_layer n_head_kv head_dim_k head_dim_v n_ctx n_tokens pos_offset
 *                                                              u32 LE each
 *     the token ids                                            i32 LE each
 *     widths_k, widths_v                                       n_tokens bytes each
 *     the vector tensors' bytes in file order (store_card.c): layer, side,
 *     width class, component; empty ones skipped
 */

/* Appends v as 4 little-endian bytes to the hash state. */
static void hash_u32(XXH3_state_t *h, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    XXH3_64bits_update(h, b, 4);
}

/* Appends the string s and its terminating NUL. */
static void hash_str(XXH3_state_t *h, const char *s) { XXH3_64bits_update(h, s, strlen(s) + 1); }

void ak_pool_content_hash(const char *fingerprint, const ak_cache_spec *spec, ak_kv_format fk, ak_kv_format fv,
                          const int32_t *tokens, int n_tokens, char out[17]) {
    XXH3_state_t h;
    XXH3_64bits_reset(&h);
    hash_str(&h, "agentkv pool v1");
    hash_str(&h, fingerprint ? fingerprint : "");
    hash_str(&h, ak_kv_format_get(fk)->name);
    hash_str(&h, ak_kv_format_get(fv)->name);
    const int dims[6] = {spec->n_layer, spec->n_head_kv, spec->head_dim_k, spec->head_dim_v, spec->n_ctx, n_tokens};
    for (int i = 0; i < 6; i++) hash_u32(&h, (uint32_t)dims[i]);
    for (int i = 0; i < n_tokens; i++) hash_u32(&h, (uint32_t)tokens[i]);
    snprintf(out, 17, "%016llx", (unsigned long long)XXH3_64bits_digest(&h));
}


void ak_card_content_hash(const ak_card *c, char out[17]) {
    XXH3_state_t h;
    XXH3_64bits_reset(&h);
    XXH3_64bits_update(&h, "agentkv card v1", 16);   /* with its NUL */
    XXH3_64bits_update(&h, c->fingerprint, strlen(c->fingerprint) + 1);
    const int dims[7] = {c->spec.n_layer, c->spec.n_head_kv, c->spec.head_dim_k, c->spec.head_dim_v, c->spec.n_ctx,
                         c->n_tokens, c->pos_offset};
    for (int i = 0; i < 7; i++) hash_u32(&h, (uint32_t)dims[i]);
    for (int i = 0; i < c->n_tokens; i++) hash_u32(&h, (uint32_t)c->tokens[i]);
    XXH3_64bits_update(&h, c->widths_k, (size_t)c->n_tokens);
    XXH3_64bits_update(&h, c->widths_v, (size_t)c->n_tokens);
    /* the vector tensors in file order: layer, side, class, component */
    for (int l = 0; l < c->spec.n_layer; l++)
        for (int side = 0; side < 2; side++)
            for (int cls = 0; cls < AK_CARD_N_WIDTHS; cls++)
                for (int comp = 0; comp < 2; comp++) {
                    size_t n = ak_card_component_bytes(c, side, cls, comp);
                    if (n) XXH3_64bits_update(&h, c->data[ak_card_slot(l, side, cls, comp)], n);
                }
    snprintf(out, 17, "%016llx", (unsigned long long)XXH3_64bits_digest(&h));
}

