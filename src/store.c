/* store.c - see store.h. The agent file format (version 5), also in
 * docs/agent-file-format.md:
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
 *     format_version      "5" (4 and 5 are read, 4 being 5 without
 *                         "segments"; 1 to 3 and newer are a miss: STALE)
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
 *     checksum_algorithm  "xxh3-64" (XXH3_64bits, seed 0)
 *     block_checksums     one per block b = 0..n_blocks-1, 16 lowercase hex
 *                         digits each, separated by commas ("" if none):
 *                         XXH3_64bits of the n_tensors 8-byte little-endian
 *                         values XXH3_64bits(piece of tensor i of block b),
 *                         i in header order. A load that skips blocks (their
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
 * Saving: .<id>.safetensors.tmp.<pid>.<tid> in the same directory (the
 * store's for agents, pools/ for pools; the leading '.' keeps internal
 * names apart from ids, which cannot start with one), fallocate, write,
 * fsync, close, rename over <id>.safetensors, fsync the directory. A crash
 * at any point leaves the old file or the new one, never a mix; leftover
 * temp files are removed when a store is next opened.
 *
 * Loading: the header and metadata (and, for a sequence with a base, the
 * prelink callback) first; then only the blocks past what the callback
 * supplied, each verified against its block checksum, read straight into
 * the blocks of a fresh sequence (plain files of the pool's block size) or
 * through an image in memory (sealed files, another block size, a full KV
 * budget); the fresh sequence is swapped in once everything has passed.
 * Pool files (store_pool.c) are read and written by the same code.
 *
 * Fault injection (read by ak_store_open, kept in the store, for crash
 * tests), compiled only with AK_FAULT_INJECTION defined: the Makefile builds
 * a second object of this file for the test binary; the library and the
 * shipped agentkv ignore these variables:
 *   AK_FAULT_KILL_AT=N       the save path raises SIGKILL on itself at its
 *                            Nth step (counted per save from 1: fallocate,
 *                            each write() call, fsync, rename, directory
 *                            fsync); a write step first writes half its bytes
 *   AK_FAULT_FAIL_AT=N[:ERR] the Nth step fails with ENOSPC (or EIO, EDQUOT)
 *                            instead of running
 *   AK_FAULT_WRITE_CHUNK=B   bytes per write() (default 1 MiB), so that tiny
 *                            caches take many steps
 */
#include "store.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
/* xxhash compiled into this file with our target flags, so XXH3 uses the
 * widest vector unit (AVX-512 / AVX2 / NEON) instead of the shared library's
 * SSE2 build: checksums are a third of a restore's time. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "blockpool.h"
#include "store_impl.h"

#define FORMAT_NAME "agentkv.agent"
#define POOL_FORMAT_NAME "agentkv.pool"
#define MEMORY_FORMAT_NAME "agentkv.memory"   /* store_memory.c: a pool file under memories/ */
/* 4: per-block checksums, bases (3: per-tensor checksums; 2: tensors
 * [H][n_tokens]). Only this version is read: an older file is a miss
 * (STALE), re-saved at the agent's next save. */
#define FORMAT_VERSION 5
#define FORMAT_VERSION_STR "5"
#define FORMAT_VERSION_OLDEST 4   /* still read: a version 4 file is a version 5 file without "segments" */
#define SUFFIX ".safetensors"
#define TMP_MARK ".safetensors.tmp."
#define POOL_QPREFIX "pool+"   /* quarantined pools: '+' is in no agent id */
#define MEMORY_QPREFIX "memory+"
#define DEFAULT_WRITE_CHUNK (1u << 20)
#define STALE_TMP_SECONDS 3600
#define MAX_DIM 65536

typedef ak_qfile qfile;

/* At most this many files stay in quarantine/ (the oldest go first): a
 * directory of corrupt files must not grow without bound. */
#define QUARANTINE_MAX_FILES AK_STORE_QUARANTINE_MAX

static void index_put(ak_store *s, const ak_store_entry *e);
static void index_del(ak_store *s, const char *id);
static void index_quarantined(ak_store *s, const char *path);
static int index_build(ak_store *s, ak_error *err);

/* ---------------------------------------------------------------- helpers */

int ak_agent_id_valid(const char *id) {
    if (!id || !id[0] || id[0] == '.') return 0;
    size_t n = 0;
    for (const char *p = id; *p; p++, n++) {
        char c = *p;   /* explicit ranges: no locale can widen the set */
        if (n >= AK_AGENT_ID_MAX) return 0;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == '-'))
            return 0;
    }
    return 1;
}

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

static void hex64(uint64_t h, char out[17]) { snprintf(out, 17, "%016llx", (unsigned long long)h); }

static double ms_since(double t0) { return (ak_now() - t0) * 1e3; }

static int path_of(const ak_store *s, const char *id, const char *suffix, char *out, size_t n) {
    int w = snprintf(out, n, "%s/%s%s", s->dir, id, suffix);
    return w < 0 || (size_t)w >= n ? -1 : 0;
}

/* The directory of files of kind. */
static const char *kind_dir(const ak_store *s, int kind) {
    return kind == AK_FILE_POOL ? s->pool_dir : kind == AK_FILE_MEMORY ? s->mem_dir : s->dir;
}

/* 1 for the kinds laid out as pools (a content hash and a source, no base):
 * pools and memories. */
static int kind_pooled(int kind) { return kind == AK_FILE_POOL || kind == AK_FILE_MEMORY; }

/* The "format" metadata value of kind. */
static const char *kind_format(int kind) {
    return kind == AK_FILE_POOL ? POOL_FORMAT_NAME : kind == AK_FILE_MEMORY ? MEMORY_FORMAT_NAME : FORMAT_NAME;
}

/* The index of a pooled kind (pool or memory files). */
static ak_entry_index *pooled_index(ak_store *s, int kind) { return kind == AK_FILE_MEMORY ? &s->mems : &s->pools; }

/* Puts a pooled kind's entry into its index (taking e->source). */
static void pooled_index_put(ak_store *s, int kind, ak_store_pool_entry *e) {
    ak_entry_index_put(s, pooled_index(s, kind), e);
}

/* <kind's dir>/<id><suffix> into out. Returns 0, or -1 if too long. */
static int kpath_of(const ak_store *s, int kind, const char *id, const char *suffix, char *out, size_t n) {
    int w = snprintf(out, n, "%s/%s%s", kind_dir(s, kind), id, suffix);
    return w < 0 || (size_t)w >= n ? -1 : 0;
}

/* What a sealed file of kind is bound to (the seal's additional data):
 * an agent's id, or "pools/<id>", so that neither can pass for the other. */
static void seal_binding(int kind, const char *id, char out[AK_SEAL_ID_MAX + 1]) {
    snprintf(out, AK_SEAL_ID_MAX + 1, "%s%s", kind == AK_FILE_POOL ? "pools/" : kind == AK_FILE_MEMORY ? "memories/" : "", id);
}

/* "agent" or "pool", for messages. */
static const char *kind_word(int kind) { return kind == AK_FILE_POOL ? "pool" : kind == AK_FILE_MEMORY ? "memory" : "agent"; }

/* Canonical decimal: digits only, no leading zero (but "0"), within [lo, hi]. */
static int parse_dec(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s || (s[0] == '0' && s[1])) return -1;
    int64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        if (v > (INT64_MAX - (*p - '0')) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    if (v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int ak_store_read_key(const char *path, uint8_t key[AK_STORE_KEY_BYTES], ak_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ak_failc(err, ak_err_code_of_errno(errno), "key file %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return ak_failc(err, ak_err_code_of_errno(e), "key file %s: %s", path, strerror(e));
    }
    /* as ssh does with private keys: the mode bits decide (not access(),
     * which root would pass), so a key others may read is never used */
    if (sb.st_mode & (S_IRWXG | S_IRWXO)) {
        close(fd);
        return ak_failc(err, AK_ERR_PERMISSION, "key file %s: mode %04o lets group or others access it; it must be "
                        "private to its owner (chmod 600 %s)", path, (unsigned)(sb.st_mode & 07777), path);
    }
    uint8_t buf[AK_STORE_KEY_BYTES + 1];
    size_t n = 0;
    for (;;) {   /* read up to 33 bytes to tell "exactly 32" from "longer" */
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            sodium_memzero(buf, sizeof buf);
            return ak_failc(err, ak_err_code_of_errno(e), "key file %s: %s", path, strerror(e));
        }
        if (r == 0 || (n += (size_t)r) == sizeof buf) break;
    }
    close(fd);
    if (n != AK_STORE_KEY_BYTES) {
        sodium_memzero(buf, sizeof buf);
        return ak_failc(err, AK_ERR_INVALID, "key file %s: must hold exactly %d raw bytes, it has %s%zu", path, AK_STORE_KEY_BYTES,
                       n > AK_STORE_KEY_BYTES ? "more than " : "", n > AK_STORE_KEY_BYTES ? (size_t)AK_STORE_KEY_BYTES : n);
    }
    memcpy(key, buf, AK_STORE_KEY_BYTES);
    sodium_memzero(buf, sizeof buf);
    return 0;
}

/* A buffer for a whole cache (snapshot data, file images; free() it).
 * Plain 4 KiB pages: transparent huge pages (MADV_HUGEPAGE) made the first
 * touch cheaper in a fresh process, but with the kernel's usual
 * defrag=madvise a fault in such a region compacts memory when no free 2 MiB
 * page is at hand, and once the page cache had churned that stalled the
 * engine thread: saving a 16K-token q4 agent (168 MB) took 300-400 ms
 * against 65-75 ms with 4 KiB pages, a 1K-token one 20-24 ms against 4.6
 * (measured on a Xeon VM, kernel 6.18). */
static void *big_alloc(size_t n) { return malloc(n ? n : 1); }

/* ------------------------------------------------------------ the layout */

/* One tensor of an agent file. */
typedef struct {
    char name[48];
    int layer, is_v;
    int ci;                   /* component index (0 codes, 1 metadata) */
    ak_kv_component comp;
    int ndim;
    int64_t shape[5];         /* [blocks, heads, T] + the component's own (up to 2) */
    uint64_t offset, bytes;   /* within the data section */
    uint64_t piece;           /* bytes of one block: [n_head_kv][T] components */
} tensor_desc;

/* The tensors of a cache of spec s in formats fk/fv holding nb blocks of T
 * positions (file_runs: the file's runs of positions, each starting a
 * block), in file order, into a malloc'd array (*out, count returned)
 * and the data section's size. Returns -1 (why set) if a format cannot store
 * the head dim or the sizes overflow. Both the writer and the reader use
 * this: the reader requires the file's table to be exactly this one. */
static int layout_tensors(const ak_cache_spec *s, ak_kv_format fk, ak_kv_format fv, int64_t nb, int T,
                          tensor_desc **out, uint64_t *data_bytes, char *why, size_t whyn) {
    ak_kv_component ck[2], cv[2];
    int nck = ak_kv_format_components(fk, s->head_dim_k, ck);
    int ncv = ak_kv_format_components(fv, s->head_dim_v, cv);
    if (!nck || !ncv) {
        snprintf(why, whyn, "formats %s/%s cannot store head dims %d/%d", ak_kv_format_get(fk)->name,
                 ak_kv_format_get(fv)->name, s->head_dim_k, s->head_dim_v);
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
                d->shape[0] = nb;
                d->shape[1] = s->n_head_kv;
                d->shape[2] = T;
                for (int k = 0; k < d->comp.ndim; k++) d->shape[3 + k] = d->comp.shape[k];
                uint64_t b;
                if (__builtin_mul_overflow((uint64_t)nb * (uint64_t)T, (uint64_t)s->n_head_kv, &b) ||
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

/* The runs of positions a file holds, in file order: each own segment of
 * its base, then its own positions [base_len, n_tokens) (the last run, maybe
 * empty). Run r holds [start[r], start[r] + len[r]) in file blocks
 * [blk0[r], blk0[r + 1]) of T positions, standard-mapped from its start. */
typedef struct {
    int n;
    int start[AK_KV_MAX_SEGMENTS + 1], len[AK_KV_MAX_SEGMENTS + 1];
    int64_t blk0[AK_KV_MAX_SEGMENTS + 2];
} file_runs;

static void runs_of(const ak_store_base *b, int n_tokens, int T, file_runs *r) {
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
static int64_t block_pos(const file_runs *r, int64_t b, int T) {
    int k = run_of_block(r, b);
    return r->start[k] + (b - r->blk0[k]) * T;
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
static int transfer(ak_kv *kv, int to_kv, uint8_t *data, const tensor_desc *t, int nt, const file_runs *ru, int skip,
                    int Tf) {
    const ak_cache_spec *s = ak_block_pool_spec(ak_kv_pool(kv));
    int H = s->n_head_kv;
    for (int i = 0; i < nt; i++) {
        size_t cb = t[i].comp.bytes;
        uint8_t *td = data + t[i].offset;
        for (int k = 0; k < ru->n; k++) {
            int s0 = ru->start[k], n = s0 + ru->len[k];
            for (int h = 0; h < H; h++)
                for (int p = s0 + (k == ru->n - 1 ? skip : 0); p < n;) {
                    int q = p - s0, r = Tf - q % Tf, rp = kv_run(kv, p);
                    if (rp < r) r = rp;
                    if (n - p < r) r = n - p;
                    uint8_t *a = to_kv ? ak_kv_stored_mut(kv, t[i].layer, t[i].is_v, t[i].ci, h, p)
                                       : (uint8_t *)ak_kv_stored(kv, t[i].layer, t[i].is_v, t[i].ci, h, p);
                    if (!a) return -1;
                    uint8_t *tp = td + (((size_t)(ru->blk0[k] + q / Tf) * H + (size_t)h) * Tf + (size_t)(q % Tf)) * cb;
                    if (to_kv) memcpy(a, tp, (size_t)r * cb);
                    else memcpy(tp, a, (size_t)r * cb);
                    p += r;
                }
            int own = ru->len[k];
            if (!to_kv && own % Tf)   /* the run's last block's unused slots: zeros, so the file is a function of the cache */
                for (int h = 0; h < H; h++)
                    memset(td + (((size_t)(ru->blk0[k] + own / Tf) * H + (size_t)h) * Tf + (size_t)(own % Tf)) * cb,
                           0, (size_t)(Tf - own % Tf) * cb);
        }
    }
    return 0;
}

/* XXH3_64bits of the 8-byte little-endian values h[0..nt) (a block's
 * checksum from its pieces' hashes); scratch holds nt * 8 bytes. */
static uint64_t combine_hashes(const uint64_t *h, int nt, uint8_t *scratch) {
    for (int i = 0; i < nt; i++)
        for (int k = 0; k < 8; k++) scratch[(size_t)i * 8 + (size_t)k] = (uint8_t)(h[i] >> (8 * k));
    return XXH3_64bits(scratch, (size_t)nt * 8);
}

/* The checksum of file block b of the data section data (tensors t). hs
 * holds nt hashes, scratch nt * 8 bytes. */
static uint64_t block_checksum(const uint8_t *data, const tensor_desc *t, int nt, int64_t b, uint64_t *hs,
                               uint8_t *scratch) {
    for (int i = 0; i < nt; i++)
        hs[i] = XXH3_64bits(data + t[i].offset + (uint64_t)b * t[i].piece, (size_t)t[i].piece);
    return combine_hashes(hs, nt, scratch);
}

/* ------------------------------------------------------------- open/close */

static int mkdir_p(const char *dir, ak_error *err) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0700) != 0 && errno != EEXIST) return ak_failc(err, ak_err_code_of_errno(errno), "store: mkdir %s: %s", buf, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0) return ak_failc(err, ak_err_code_of_errno(errno), "store: %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return ak_failc(err, AK_ERR_INVALID, "store: %s is not a directory", dir);
    return 0;
}

/* Parses a temp file name ".<id>.safetensors.tmp.<pid>.<tid>" (or the
 * "<id>.safetensors.tmp.<pid>.<tid>" of older builds); returns the pid, 0 if
 * the rest is malformed, -1 if name is not a temp file of ours at all. An
 * agent file (ending in .safetensors) is never a temp file: an id may
 * contain ".safetensors.tmp.", but no id starts with '.', and an older
 * build's temp name ends in its thread id. */
static long temp_pid(const char *name) {
    size_t len = strlen(name), sl = strlen(SUFFIX);
    if (len >= sl && !strcmp(name + len - sl, SUFFIX)) return -1;
    const char *m = NULL;   /* the last mark: an id before it may hold one too */
    for (const char *q = strstr(name, TMP_MARK); q; q = strstr(q + 1, TMP_MARK)) m = q;
    if (!m || m == name || (name[0] == '.' && m == name + 1)) return -1;
    const char *p = m + strlen(TMP_MARK);
    char *end;
    errno = 0;
    long pid = strtol(p, &end, 10);
    if (errno || end == p || *end != '.' || pid <= 0) return 0;
    return pid;
}

/* Removes temp files left by saves that died: those whose process is gone,
 * malformed ones, and any older than an hour (a save never takes that long;
 * this also covers pids reused since, or pids of another PID namespace). A
 * temp file of a live process is a save in flight: it stays. */
static void remove_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    time_t now = time(NULL);
    while ((e = readdir(d))) {
        long pid = temp_pid(e->d_name);
        if (pid < 0) continue;
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        int stale = pid == 0 || now - st.st_mtime > STALE_TMP_SECONDS;
        if (!stale && pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH) stale = 1;
        if (stale) unlink(path);
    }
    closedir(d);
}

#ifndef AK_FAULT_INJECTION
/* A release build: the fault variables are not read. */
static int parse_fault_env(ak_store *s, ak_error *err) {
    (void)s;
    (void)err;
    return 0;
}
#else
/* Reads AK_FAULT_KILL_AT, AK_FAULT_FAIL_AT and AK_FAULT_WRITE_CHUNK into s.
 * Returns 0, or -1 with err set on a malformed value. */
static int parse_fault_env(ak_store *s, ak_error *err) {
    const char *v;
    int64_t x;
    if ((v = getenv("AK_FAULT_KILL_AT")) && *v) {
        if (parse_dec(v, 1, INT32_MAX, &x)) return ak_fail(err, "AK_FAULT_KILL_AT=%s: expected a step number >= 1", v);
        s->kill_at = (long)x;
    }
    if ((v = getenv("AK_FAULT_FAIL_AT")) && *v) {
        char num[32];
        const char *colon = strchr(v, ':');
        size_t k = colon ? (size_t)(colon - v) : strlen(v);
        if (k >= sizeof num) return ak_fail(err, "AK_FAULT_FAIL_AT=%s: bad step number", v);
        memcpy(num, v, k);
        num[k] = 0;
        if (parse_dec(num, 1, INT32_MAX, &x)) return ak_fail(err, "AK_FAULT_FAIL_AT=%s: bad step number", v);
        s->fail_at = (long)x;
        s->fail_errno = ENOSPC;
        if (colon) {
            if (!strcmp(colon + 1, "ENOSPC")) s->fail_errno = ENOSPC;
            else if (!strcmp(colon + 1, "EIO")) s->fail_errno = EIO;
            else if (!strcmp(colon + 1, "EDQUOT")) s->fail_errno = EDQUOT;
            else return ak_fail(err, "AK_FAULT_FAIL_AT=%s: error must be ENOSPC, EIO or EDQUOT", v);
        }
    }
    if ((v = getenv("AK_FAULT_WRITE_CHUNK")) && *v) {
        if (parse_dec(v, 1, 1 << 30, &x)) return ak_fail(err, "AK_FAULT_WRITE_CHUNK=%s: expected bytes >= 1", v);
        s->write_chunk = (size_t)x;
    }
    return 0;
}
#endif

ak_store *ak_store_open(const char *dir, const uint8_t *key, ak_error *err) {
    if (!dir || !*dir) { ak_failc(err, AK_ERR_INVALID, "store: empty directory name"); return NULL; }
    /* room for "/<128-char id>.safetensors.tmp.<pid>.<tid>" after the dir */
    if (strlen(dir) > PATH_MAX - 256) { ak_failc(err, AK_ERR_INVALID, "store: directory name too long"); return NULL; }
    if (ak_seal_init() != 0) { ak_fail(err, "store: libsodium failed to initialize"); return NULL; }
    ak_store *s = ak_calloc(1, sizeof *s, err);
    if (!s) return NULL;
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    size_t n = strlen(s->dir);
    while (n > 1 && s->dir[n - 1] == '/') s->dir[--n] = 0;
    snprintf(s->pool_dir, sizeof s->pool_dir, "%s/pools", s->dir);
    snprintf(s->mem_dir, sizeof s->mem_dir, "%s/memories", s->dir);
    s->write_chunk = DEFAULT_WRITE_CHUNK;
    if (parse_fault_env(s, err) != 0 || mkdir_p(s->dir, err) != 0) { free(s); return NULL; }
    if (key) {
        s->has_key = 1;
        memcpy(s->key, key, AK_STORE_KEY_BYTES);
        ak_seal_key_id(s->key, s->key_id);
    }
    remove_stale_temps(s->dir);
    remove_stale_temps(s->pool_dir);
    remove_stale_temps(s->mem_dir);
    pthread_mutex_init(&s->mu, NULL);
    if (index_build(s, err) != 0) {
        ak_store_close(s);
        return NULL;
    }
    return s;
}

void ak_store_close(ak_store *s) {
    if (!s) return;
    free(s->idx);
    free(s->q);
    ak_entry_index_free(&s->pools);
    ak_entry_index_free(&s->mems);
    ak_store_card_index_free(s);
    pthread_mutex_destroy(&s->mu);
    sodium_memzero(s->key, sizeof s->key);
    free(s);
}

const char *ak_store_dir(const ak_store *s) { return s->dir; }
int ak_store_sealed(const ak_store *s) { return s->has_key; }

/* ---------------------------------------------------------------- snapshot */

struct ak_snapshot {
    int kind;               /* AK_FILE_AGENT or AK_FILE_POOL */
    char id[AK_AGENT_ID_MAX + 1];
    char fingerprint[65];
    char model_name[128];
    ak_cache_spec spec;
    ak_kv_format fk, fv;
    int block_tokens;
    int n_tokens;
    int64_t created;
    char center[2][33];     /* key_center, value_center: a calibration id or "none" */
    ak_store_base base;     /* agents: the base (pool_id "" if none) */
    char pool_hash[17];     /* pools: their content hash */
    char *source;           /* pools: malloc'd, or NULL */
    int32_t *tokens;
    tensor_desc *t;
    int nt;
    uint8_t *data;
    uint64_t data_bytes;
};

static int fingerprint_ok(const char *fp) {
    size_t n = fp ? strlen(fp) : 0;
    if (n < 1 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (fp[i] <= ' ' || fp[i] > '~') return 0;   /* printable ASCII, no space */
    return 1;
}

/* 1 if h is 16 lowercase hex digits. */
static int hash_ok(const char *h) {
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
static int base_normalize(ak_store_base *b, int n_tokens, char *why, size_t whyn) {
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
            (named && (!ak_agent_id_valid(g->id) || !hash_ok(g->hash))) || (!named && (g->id[0] || g->hash[0]))) {
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

/* 1 when base b (canonical) is one pool or card segment: the single base
 * of a version 4 file. */
static int base_single(const ak_store_base *b) { return b->n_seg == 1 && b->seg[0].kind != AK_SEG_OWN; }

ak_snapshot *ak_store_snapshot_kind(int kind, const char *agent_id, const ak_kv *kv, const int32_t *tokens,
                                    int n_tokens, const ak_store_base *base, const char *pool_hash,
                                    const char *source, const char *fingerprint, const char *model_name,
                                    ak_error *err) {
    const char *what = kind_word(kind);
    if (!ak_agent_id_valid(agent_id)) { ak_failc(err, AK_ERR_INVALID, "store: invalid %s id", what); return NULL; }
    if (!fingerprint_ok(fingerprint)) {
        ak_failc(err, AK_ERR_INVALID, "store: %s %s: model fingerprint must be 1..64 printable characters", what, agent_id);
        return NULL;
    }
    if (n_tokens < 0 || n_tokens > ak_kv_length(kv) || (n_tokens > 0 && !tokens)) {
        ak_failc(err, AK_ERR_INVALID, "store: %s %s: %d tokens to save but the cache holds %d", what, agent_id, n_tokens,
                 ak_kv_length(kv));
        return NULL;
    }
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 0) { ak_failc(err, AK_ERR_INVALID, "store: %s %s: negative token id at %d", what, agent_id, i); return NULL; }
    /* the file's base: what the sequence shares (a base of 0 positions is none) */
    ak_store_base b;
    memset(&b, 0, sizeof b);
    if (kind == AK_FILE_AGENT && base && (base->n_seg > 0 || (base->pool_id[0] && base->base_len > 0))) b = *base;
    char why0[160];
    if (base_normalize(&b, n_tokens, why0, sizeof why0) < 0) {
        ak_failc(err, AK_ERR_INVALID, "store: agent %s: bad base: %s", agent_id, why0);
        return NULL;
    }
    int kb = ak_kv_base_len(kv);
    if (kind == AK_FILE_AGENT && b.base_len != kb) {
        ak_failc(err, AK_ERR_INVALID, "store: agent %s: the sequence's shared base holds %d positions, the file's "
                 "base says %d", agent_id, kb, b.base_len);
        return NULL;
    }
    /* the file's runs mirror the sequence's segments: their lengths must agree */
    int kl[AK_KV_MAX_SEGMENTS], kns = ak_kv_segments(kv, kl), same = kind != AK_FILE_AGENT || kns == b.n_seg;
    for (int k = 0; same && k < kns; k++) same = kl[k] == b.seg[k].len;
    if (!same) {
        ak_failc(err, AK_ERR_INVALID, "store: agent %s: the sequence's %d segments are not the base's %d", agent_id, kns,
                 b.n_seg);
        return NULL;
    }
    if (kind_pooled(kind) && !hash_ok(pool_hash)) {
        ak_failc(err, AK_ERR_INVALID, "store: %s %s: bad content hash", what, agent_id);
        return NULL;
    }
    ak_snapshot *sn = ak_calloc(1, sizeof *sn, err);
    if (!sn) return NULL;
    sn->kind = kind;
    sn->base = b;
    if (kind_pooled(kind)) {
        snprintf(sn->pool_hash, sizeof sn->pool_hash, "%s", pool_hash);
        if (!(sn->source = strdup(source ? source : ""))) {
            ak_failc(err, AK_ERR_NOMEM, "store: pool %s: out of memory", agent_id);
            free(sn);
            return NULL;
        }
    }
    snprintf(sn->id, sizeof sn->id, "%s", agent_id);
    snprintf(sn->fingerprint, sizeof sn->fingerprint, "%s", fingerprint);
    snprintf(sn->model_name, sizeof sn->model_name, "%s", model_name ? model_name : "");
    for (char *p = sn->model_name; *p; p++)   /* keep the metadata one clean line */
        if ((unsigned char)*p < 32 || *p == 127) *p = '?';
    sn->spec = *ak_block_pool_spec(ak_kv_pool(kv));
    sn->fk = ak_kv_format_k(kv);
    sn->fv = ak_kv_format_v(kv);
    sn->block_tokens = ak_block_pool_block_tokens(ak_kv_pool(kv));
    sn->n_tokens = n_tokens;
    sn->created = (int64_t)time(NULL);
    for (int v = 0; v < 2; v++) {
        const char *c = ak_block_pool_center_id(ak_kv_pool(kv), v, v ? sn->fv : sn->fk);
        snprintf(sn->center[v], sizeof sn->center[v], "%s", c ? c : "none");
    }
    char why[128];
    file_runs ru;
    runs_of(&b, n_tokens, sn->block_tokens, &ru);
    sn->nt = layout_tensors(&sn->spec, sn->fk, sn->fv, ru.blk0[ru.n], sn->block_tokens, &sn->t, &sn->data_bytes, why,
                            sizeof why);
    if (sn->nt < 0) {
        ak_failc(err, AK_ERR_INVALID, "store: %s %s: %s", what, agent_id, why);
        ak_snapshot_free(sn);
        return NULL;
    }
    sn->tokens = ak_malloc(sizeof(int32_t) * (size_t)n_tokens, err);
    sn->data = sn->tokens ? big_alloc(sn->data_bytes) : NULL;
    if (!sn->data) {
        if (sn->tokens) ak_failc(err, AK_ERR_NOMEM, "store: %s %s: out of memory for a %llu-byte snapshot", what, agent_id,
                                (unsigned long long)sn->data_bytes);
        ak_snapshot_free(sn);
        return NULL;
    }
    if (n_tokens) memcpy(sn->tokens, tokens, sizeof(int32_t) * (size_t)n_tokens);
    if (transfer((ak_kv *)kv, 0, sn->data, sn->t, sn->nt, &ru, 0, sn->block_tokens) != 0) {
        ak_fail(err, "store: %s %s: a cached vector below position %d is not readable", what, agent_id, n_tokens);
        ak_snapshot_free(sn);
        return NULL;
    }
    return sn;
}

ak_snapshot *ak_store_snapshot(const char *agent_id, const ak_kv *kv, const int32_t *tokens, int n_tokens,
                               const char *fingerprint, const char *model_name, ak_error *err) {
    return ak_store_snapshot_kind(AK_FILE_AGENT, agent_id, kv, tokens, n_tokens, NULL, NULL, NULL, fingerprint,
                                  model_name, err);
}

ak_snapshot *ak_store_snapshot_base(const char *agent_id, const ak_kv *kv, const int32_t *tokens, int n_tokens,
                                    const ak_store_base *base, const char *fingerprint, const char *model_name,
                                    ak_error *err) {
    return ak_store_snapshot_kind(AK_FILE_AGENT, agent_id, kv, tokens, n_tokens, base, NULL, NULL, fingerprint,
                                  model_name, err);
}

size_t ak_snapshot_bytes(const ak_snapshot *sn) {
    size_t nb = sn->nt ? (size_t)sn->t[0].shape[0] : 0;
    return (size_t)sn->data_bytes + (size_t)sn->n_tokens * 8 + nb * 17 + (sn->source ? strlen(sn->source) : 0) + 4096;
}

void ak_snapshot_free(ak_snapshot *sn) {
    if (!sn) return;
    /* a snapshot is the plaintext of what a sealed store encrypts: wiped
     * before the memory goes back to the allocator */
    if (sn->tokens) sodium_memzero(sn->tokens, sizeof(int32_t) * (size_t)sn->n_tokens);
    if (sn->data) sodium_memzero(sn->data, (size_t)sn->data_bytes);
    if (sn->source) sodium_memzero(sn->source, strlen(sn->source));
    free(sn->source);
    free(sn->tokens);
    free(sn->t);
    free(sn->data);
    sodium_memzero(sn, sizeof *sn);
    free(sn);
}

/* ---------------------------------------------------- the metadata header */

typedef struct {
    const char *key;
    const char *val;
} kv_pair;

static int cmp_pair(const void *a, const void *b) { return strcmp(((const kv_pair *)a)->key, ((const kv_pair *)b)->key); }

/* metadata_checksum over pairs (sorted in place), skipping the entry
 * "metadata_checksum" itself. Returns -1 on a duplicate key or no memory. */
static int metadata_hash(kv_pair *p, int n, char out[17]) {
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
    hex64(XXH3_64bits(buf, (size_t)(w - buf)), out);
    free(buf);
    return 0;
}

/* Wipes the "tokens" and "source" metadata strings of a parsed or built
 * header (token ids, a pool's text: plaintext of a sealed file) before the
 * tree is freed. */
static void wipe_tokens(cJSON *root) {
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    static const char *keys[] = {"tokens", "source"};   /* a pool's source is its text */
    for (int i = 0; i < 2; i++) {
        cJSON *tk = cJSON_GetObjectItemCaseSensitive(meta, keys[i]);
        if (cJSON_IsString(tk) && tk->valuestring) sodium_memzero(tk->valuestring, strlen(tk->valuestring));
    }
}

/* The "block_checksums" string of sn (malloc'd), or NULL out of memory.
 * The pieces are hashed tensor by tensor (in file order: the data is read
 * once, front to back), then combined block by block. */
static char *block_sums_string(const ak_snapshot *sn) {
    int64_t nb = sn->nt ? sn->t[0].shape[0] : 0;
    int nt = sn->nt ? sn->nt : 1;
    char *out = malloc((size_t)nb * 17 + 1);
    uint64_t *hs = malloc(sizeof *hs * (size_t)nt * (size_t)(nb ? nb : 1));
    uint8_t *scratch = malloc((size_t)nt * 8);
    if (!out || !hs || !scratch) {
        free(out);
        out = NULL;
    } else {
        for (int i = 0; i < sn->nt; i++)
            for (int64_t b = 0; b < nb; b++)
                hs[(size_t)b * (size_t)nt + (size_t)i] =
                    XXH3_64bits(sn->data + sn->t[i].offset + (uint64_t)b * sn->t[i].piece, (size_t)sn->t[i].piece);
        out[0] = 0;
        for (int64_t b = 0; b < nb; b++) {
            if (b) out[b * 17 - 1] = ',';
            hex64(combine_hashes(hs + (size_t)b * (size_t)nt, sn->nt, scratch), out + b * 17);
        }
    }
    free(hs);
    free(scratch);
    return out;
}

/* Builds the safetensors header of sn (u64 length + padded JSON) into a
 * malloc'd buffer of *len bytes; hashes every block on the way. */
static uint8_t *build_header(const ak_snapshot *sn, size_t *len, ak_error *err) {
    enum { NP = 32 };
    char num[12][24], meta_hex[17];
    char *tokens = NULL, *sums = NULL, *json = NULL;
    uint8_t *out = NULL;
    cJSON *root = NULL;
    if (!(sums = block_sums_string(sn))) goto oom;
    /* ",-2147483648" is 12 bytes: 12 a token and the NUL */
    size_t tcap = (size_t)sn->n_tokens * 12 + 1, tl = 0;
    if (!(tokens = malloc(tcap))) goto oom;
    tokens[0] = 0;
    for (int i = 0; i < sn->n_tokens; i++) {
        int w = snprintf(tokens + tl, tcap - tl, i ? ",%d" : "%d", sn->tokens[i]);
        if (w < 0 || (size_t)w >= tcap - tl) goto oom;
        tl += (size_t)w;
    }

    const ak_cache_spec *s = &sn->spec;
    int64_t ints[] = {s->n_layer, s->n_head_kv, s->head_dim_k, s->head_dim_v, s->n_ctx, sn->block_tokens,
                      sn->n_tokens, sn->created, sn->base.base_len};
    for (int i = 0; i < 9; i++) snprintf(num[i], sizeof num[i], "%lld", (long long)ints[i]);
    kv_pair p[NP] = {
        {"format", kind_format(sn->kind)}, {"format_version", FORMAT_VERSION_STR},
        {"agent_id", sn->id}, {"model_fingerprint", sn->fingerprint}, {"model_name", sn->model_name},
        {"n_layer", num[0]}, {"n_head_kv", num[1]}, {"head_dim_k", num[2]}, {"head_dim_v", num[3]},
        {"n_ctx", num[4]}, {"kv_format_k", ak_kv_format_get(sn->fk)->name},
        {"kv_format_v", ak_kv_format_get(sn->fv)->name}, {"block_tokens", num[5]}, {"n_tokens", num[6]},
        {"tokens", tokens}, {"created", num[7]}, {"checksum_algorithm", "xxh3-64"}, {"block_checksums", sums},
        {"key_center", sn->center[0]}, {"value_center", sn->center[1]},
    };
    int np = 20;
    char segs[AK_KV_MAX_SEGMENTS * (AK_AGENT_ID_MAX + 48)];
    if (base_single(&sn->base)) {   /* a sequence without a base records none */
        p[np++] = (kv_pair){"pool_id", sn->base.pool_id};
        p[np++] = (kv_pair){"pool_hash", sn->base.pool_hash};
        p[np++] = (kv_pair){"base_len", num[8]};
        p[np++] = (kv_pair){"base_kind", sn->base.card ? "card" : "pool"};
    } else if (sn->base.n_seg > 0) {   /* segments (store.h): "kind:len[:id:hash]", comma-separated */
        size_t sl = 0;
        for (int k = 0; k < sn->base.n_seg; k++) {
            const ak_store_seg *g = &sn->base.seg[k];
            static const char *kinds[] = {"own", "pool", "card"};
            int w = g->kind == AK_SEG_OWN ? snprintf(segs + sl, sizeof segs - sl, "%s%s:%d", k ? "," : "", kinds[0], g->len)
                                          : snprintf(segs + sl, sizeof segs - sl, "%s%s:%d:%s:%s", k ? "," : "",
                                                     kinds[g->kind], g->len, g->id, g->hash);
            if (w < 0 || (size_t)w >= sizeof segs - sl) goto oom;
            sl += (size_t)w;
        }
        p[np++] = (kv_pair){"segments", segs};
        p[np++] = (kv_pair){"base_len", num[8]};
    }
    if (kind_pooled(sn->kind)) {
        p[np++] = (kv_pair){"pool_hash", sn->pool_hash};
        p[np++] = (kv_pair){"source", sn->source ? sn->source : ""};
    }
    kv_pair sorted[NP];
    memcpy(sorted, p, sizeof(kv_pair) * np);
    if (metadata_hash(sorted, np, meta_hex) != 0) goto oom;
    p[np++] = (kv_pair){"metadata_checksum", meta_hex};

    cJSON *meta;
    if (!(root = cJSON_CreateObject()) || !(meta = cJSON_AddObjectToObject(root, "__metadata__"))) goto oom;
    for (int i = 0; i < np; i++)
        if (!cJSON_AddStringToObject(meta, p[i].key, p[i].val)) goto oom;
    for (int i = 0; i < sn->nt; i++) {
        const tensor_desc *t = &sn->t[i];
        cJSON *o = cJSON_AddObjectToObject(root, t->name), *sh, *of;
        if (!o || !cJSON_AddStringToObject(o, "dtype", t->comp.dtype) || !(sh = cJSON_AddArrayToObject(o, "shape")))
            goto oom;
        for (int k = 0; k < t->ndim; k++)
            if (!cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[k]))) goto oom;
        if (!(of = cJSON_AddArrayToObject(o, "data_offsets")) ||
            !cJSON_AddItemToArray(of, cJSON_CreateNumber((double)t->offset)) ||
            !cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(t->offset + t->bytes))))
            goto oom;
    }
    if (!(json = cJSON_PrintUnformatted(root))) goto oom;
    size_t jl = strlen(json), N = (jl + 7) / 8 * 8;
    if (!(out = malloc(8 + N))) goto oom;
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)N >> (8 * i));
    memcpy(out + 8, json, jl);
    memset(out + 8 + jl, ' ', N - jl);
    *len = 8 + N;
    goto done;
oom:
    ak_failc(err, AK_ERR_NOMEM, "store: %s %s: out of memory building the file header", kind_word(sn->kind), sn->id);
done:
    wipe_tokens(root);   /* the token ids are plaintext of a sealed file */
    cJSON_Delete(root);
    free(sums);
    if (json) sodium_memzero(json, strlen(json));
    free(json);
    if (tokens) sodium_memzero(tokens, strlen(tokens));
    free(tokens);
    return out;
}

/* ------------------------------------------------------------- saving */

typedef struct {
    const ak_store *s;
    const char *tmp;
    const char *id;     /* what a sealed file is bound to (seal_binding) */
    int step;
} save_ctx;

enum { STEP_RUN, STEP_KILL, STEP_FAIL };

/* Counts one step of the save path and says whether fault injection wants
 * it to die or fail. */
static int step(save_ctx *c) {
    c->step++;
#ifdef AK_FAULT_INJECTION
    if (c->s->kill_at == c->step) return STEP_KILL;
    if (c->s->fail_at == c->step) return STEP_FAIL;
#endif
    return STEP_RUN;
}

/* errno of an injected failure. */
static int fault_errno(const save_ctx *c) {
#ifdef AK_FAULT_INJECTION
    return c->s->fail_errno;
#else
    (void)c;
    return EIO;
#endif
}

/* write()s all n bytes in calls of at most write_chunk bytes, each a step.
 * Returns 0, or -1 with errno set. */
static int write_all(save_ctx *c, int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        size_t k = n < c->s->write_chunk ? n : c->s->write_chunk;
        int f = step(c);
        if (f == STEP_KILL) {
            if (write(fd, p, k / 2) < 0) { /* dying anyway */ }
            raise(SIGKILL);
        }
        if (f == STEP_FAIL) { errno = fault_errno(c); return -1; }
        ssize_t w = write(fd, p, k);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        if (w == 0) { errno = EIO; return -1; }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Called before each non-write step: dies there if fault injection says
 * so; returns -1 with errno set if the step is to fail instead of running,
 * else 0. */
static int inject(save_ctx *c) {
    int f = step(c);
    if (f == STEP_KILL) raise(SIGKILL);
    if (f == STEP_FAIL) { errno = fault_errno(c); return -1; }
    return 0;
}

/* Writes the image (hdr then data) sealed: chunks of it are pushed through
 * the secretstream into an output buffer that is written out whenever it
 * holds write_chunk bytes. */
static int write_sealed(save_ctx *c, int fd, const uint8_t *hdr, size_t hl, const uint8_t *data, uint64_t dl,
                        const char **what) {
    const ak_store *s = c->s;
    ak_seal z;
    uint8_t sh[AK_SEAL_HEADER_BYTES];
    uint64_t total = hl + dl;
    ak_seal_begin(&z, s->key, total, AK_SEAL_CHUNK, c->id, sh);
    size_t cap = s->write_chunk > AK_SEAL_CHUNK + AK_SEAL_ABYTES ? s->write_chunk : AK_SEAL_CHUNK + AK_SEAL_ABYTES;
    uint8_t *out = malloc(cap + AK_SEAL_HEADER_BYTES), *in = malloc(AK_SEAL_CHUNK);
    int rc = -1;
    *what = "out of memory";
    if (!out || !in) { errno = ENOMEM; goto done; }
    *what = "write";
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
            if (write_all(c, fd, out, used) != 0) goto done;
            used = 0;
        }
        used += ak_seal_push(&z, src, out + used);
        pos += n;
    }
    if (used && write_all(c, fd, out, used) != 0) goto done;
    rc = 0;
done:
    sodium_memzero(&z, sizeof z);
    if (in) sodium_memzero(in, AK_SEAL_CHUNK);
    free(in);
    free(out);
    return rc;
}

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

int ak_store_write_snapshot(ak_store *s, const ak_snapshot *sn, ak_error *err) {
    char path[PATH_MAX], tmp[PATH_MAX], binding[AK_SEAL_ID_MAX + 1];
    const char *dir = kind_dir(s, sn->kind), *what_kind = kind_word(sn->kind);
    int w = snprintf(tmp, sizeof tmp, "%s/.%s%s%ld.%ld", dir, sn->id, TMP_MARK, (long)getpid(),
                     (long)syscall(SYS_gettid));
    if (kpath_of(s, sn->kind, sn->id, SUFFIX, path, sizeof path) || w < 0 || (size_t)w >= sizeof tmp)
        return ak_failc(err, AK_ERR_INVALID, "store: path too long for %s %s", what_kind, sn->id);
    if (kind_pooled(sn->kind) && mkdir(dir, 0700) != 0 && errno != EEXIST)
        return ak_failc(err, ak_err_code_of_errno(errno), "store: saving %s %s: mkdir %s: %s", what_kind, sn->id, dir,
                        strerror(errno));
    seal_binding(sn->kind, sn->id, binding);
    size_t hl = 0;
    uint8_t *hdr = build_header(sn, &hl, err);
    if (!hdr) return -1;
    uint64_t total = s->has_key ? ak_seal_file_bytes(hl + sn->data_bytes, AK_SEAL_CHUNK) : hl + sn->data_bytes;

    save_ctx c = {s, tmp, binding, 0};
    const char *what = "open";
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) { /* left by a dead thread of a reused pid */
        unlink(tmp);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    }
    if (fd < 0) goto fail;
    /* reserve the blocks first: a full disk fails here, before any write */
    what = "fallocate";
    if (inject(&c) != 0) goto fail;
    if (fallocate(fd, 0, 0, (off_t)total) != 0 && errno != EOPNOTSUPP && errno != ENOSYS && errno != EINVAL)
        goto fail;
    what = "write";
    if (s->has_key) {
        if (write_sealed(&c, fd, hdr, hl, sn->data, sn->data_bytes, &what) != 0) goto fail;
    } else if (write_all(&c, fd, hdr, hl) != 0 || write_all(&c, fd, sn->data, sn->data_bytes) != 0) {
        goto fail;
    }
    what = "fsync";
    if (inject(&c) || fsync(fd) != 0) goto fail;
    struct stat fst;
    if (fstat(fd, &fst) != 0) memset(&fst, 0, sizeof fst);
    what = "close";
    int rc = close(fd);
    fd = -1;
    if (rc != 0) goto fail;
    what = "rename";
    if (inject(&c) || rename(tmp, path) != 0) goto fail;
    sodium_memzero(hdr, hl);   /* holds the token ids */
    free(hdr);
    ak_store_pool_entry pe;
    memset(&pe, 0, sizeof pe);
    ak_store_entry ie;
    memset(&ie, 0, sizeof ie);
    snprintf(ie.id, sizeof ie.id, "%s", sn->id);
    ie.bytes = (uint64_t)fst.st_size;
    ie.mtime = (int64_t)fst.st_mtim.tv_sec;
    ie.mtime_ns = (int64_t)fst.st_mtim.tv_nsec;
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
    if (kind_pooled(sn->kind)) {
        pe.e = ie;
        snprintf(pe.pool_hash, sizeof pe.pool_hash, "%s", sn->pool_hash);
        pe.source = strdup(sn->source ? sn->source : "");   /* NULL out of memory: listed without it */
        pooled_index_put(s, sn->kind, &pe);
    } else {
        index_put(s, &ie);
    }
    /* The new file is in place; without this fsync the rename itself might
     * not survive a power loss. */
    if (inject(&c) || fsync_dir(dir) != 0)
        return ak_failc(err, ak_err_code_of_errno(errno), "store: saving %s %s: fsync of directory %s: %s (the new "
                        "file is in place but may not survive a crash)", what_kind, sn->id, dir, strerror(errno));
    return 0;
fail:;
    int e = errno;
    if (fd >= 0) close(fd);
    unlink(tmp);
    sodium_memzero(hdr, hl);
    free(hdr);
    return ak_failc(err, ak_err_code_of_errno(e), "store: saving %s %s: %s %s: %s (the previous file, if any, is intact)",
                    what_kind, sn->id, what, !strcmp(what, "rename") ? path : tmp, strerror(e));
}

int ak_store_save(ak_store *s, const char *agent_id, const ak_kv *kv, const int32_t *tokens, int n_tokens,
                  const char *fingerprint, const char *model_name, ak_error *err) {
    ak_snapshot *sn = ak_store_snapshot(agent_id, kv, tokens, n_tokens, fingerprint, model_name, err);
    if (!sn) return -1;
    int rc = ak_store_write_snapshot(s, sn, err);
    ak_snapshot_free(sn);
    return rc;
}

/* ------------------------------------------------------------- reading */

/* The outcome of a check: a status, a short reason word for the quarantine
 * file name, and a message. */
typedef struct {
    ak_store_status st;
    const char *slug;
    char msg[400];
    int code;           /* the ak_err_code the caller's ak_error gets */
} verdict;

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

__attribute__((format(printf, 4, 5))) static ak_store_status
judge(verdict *v, ak_store_status st, const char *slug, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vjudge(v, st, slug, status_code(st), fmt, ap);
    va_end(ap);
    return st;
}

/* judge(v, AK_STORE_ERROR, ...) with an error code other than IO (out of
 * memory, KV budget). */
__attribute__((format(printf, 3, 4))) static ak_store_status judge_error(verdict *v, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vjudge(v, AK_STORE_ERROR, NULL, code, fmt, ap);
    va_end(ap);
    return AK_STORE_ERROR;
}

/* An open agent file and its image (the safetensors bytes: the file itself,
 * or what its seal holds), filled on demand in order. */
typedef struct {
    const ak_store *s;
    int fd;
    struct stat st;
    int sealed;
    uint8_t *img;
    uint64_t img_size;
    uint64_t cap;           /* bytes img has room for (plain files grow it on demand) */
    uint64_t have;          /* img[0, have) is filled */
    uint64_t file_pos;      /* next ciphertext byte (sealed) */
    ak_seal z;
    uint8_t *cbuf;          /* ciphertext staging (sealed) */
    size_t cbuf_cap;
    uint64_t bytes_read;
    double read_ms;
} reader;

static void reader_close(reader *r) {
    if (r->fd >= 0) close(r->fd);
    if (r->sealed) {
        sodium_memzero(&r->z, sizeof r->z);
        if (r->img) sodium_memzero(r->img, (size_t)r->have);   /* plaintext of a sealed file */
    }
    free(r->img);
    free(r->cbuf);
    memset(r, 0, sizeof *r);
    r->fd = -1;
}

static ak_store_status pread_all(reader *r, uint8_t *dst, size_t n, uint64_t off, verdict *v) {
    while (n > 0) {
        ssize_t k = pread(r->fd, dst, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return judge(v, AK_STORE_ERROR, NULL, "read at offset %llu: %s", (unsigned long long)off, strerror(errno));
        if (k == 0) /* the file shrank under us: not its fault, not ours to judge */
            return judge(v, AK_STORE_ERROR, NULL, "file shrank while being read");
        dst += k;
        n -= (size_t)k;
        off += (uint64_t)k;
        r->bytes_read += (uint64_t)k;
    }
    return AK_STORE_HIT;
}

/* Opens path (the file of agent id: a sealed file must be bound to it) and
 * decides plain or sealed; on HIT img[0, 8) is available. */
static ak_store_status reader_open(reader *r, const ak_store *s, const char *path, const char *id, verdict *v) {
    memset(r, 0, sizeof *r);
    r->s = s;
    r->fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (r->fd < 0) {
        if (errno == ENOENT) return judge(v, AK_STORE_ABSENT, NULL, "no such file");
        return judge(v, AK_STORE_ERROR, NULL, "open: %s", strerror(errno));
    }
    if (fstat(r->fd, &r->st) != 0) return judge(v, AK_STORE_ERROR, NULL, "fstat: %s", strerror(errno));
    if (!S_ISREG(r->st.st_mode)) return judge(v, AK_STORE_CORRUPT, "notfile", "not a regular file");
    uint64_t size = (uint64_t)r->st.st_size;
    posix_fadvise(r->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    posix_fadvise(r->fd, 0, 0, POSIX_FADV_WILLNEED);
    if (size < 8) return judge(v, AK_STORE_CORRUPT, "truncated", "truncated: %llu bytes", (unsigned long long)size);
    uint8_t head[AK_SEAL_HEADER_BYTES];
    size_t hn = size < sizeof head ? (size_t)size : sizeof head;
    if (pread_all(r, head, hn, 0, v) != AK_STORE_HIT) return v->st;
    r->sealed = memcmp(head, AK_SEAL_MAGIC, 8) == 0;
    if (!r->sealed) {
        if (s->has_key)
            return judge(v, AK_STORE_STALE, NULL, "a plain file, but this store keeps its files sealed (encrypted)");
        r->img_size = size;
    } else {
        if (!s->has_key) return judge(v, AK_STORE_STALE, NULL, "a sealed (encrypted) file, but the store has no key");
        if (size < AK_SEAL_HEADER_BYTES)
            return judge(v, AK_STORE_CORRUPT, "truncated", "truncated sealed file: %llu bytes", (unsigned long long)size);
        ak_seal_info si;
        ak_seal_parse(head, &si);
        if (si.version > AK_SEAL_VERSION)
            return judge(v, AK_STORE_STALE, NULL, "sealed with format version %u, newer than this build's %u", si.version,
                         AK_SEAL_VERSION);
        if (si.version == 1)   /* not bound to its agent id: recomputed and re-saved as version 2 */
            return judge(v, AK_STORE_STALE, NULL, "sealed with format version 1 (not bound to its agent id), older "
                         "than this build's %u", AK_SEAL_VERSION);
        if (si.version != AK_SEAL_VERSION) return judge(v, AK_STORE_CORRUPT, "seal", "bad seal version %u", si.version);
        if (memcmp(si.key_id, s->key_id, 8) != 0)
            return judge(v, AK_STORE_STALE, NULL, "sealed under another key (wrong key)");
        if (si.chunk < AK_SEAL_MIN_CHUNK || si.chunk > AK_SEAL_MAX_CHUNK || si.plain_bytes < 8)
            return judge(v, AK_STORE_CORRUPT, "seal", "bad seal header (chunk %u, image %llu bytes)", si.chunk,
                         (unsigned long long)si.plain_bytes);
        uint64_t want = ak_seal_file_bytes(si.plain_bytes, si.chunk);
        if (want != size)
            return judge(v, AK_STORE_CORRUPT, "truncated", "sealed file is %llu bytes, its header says %llu (%s)",
                         (unsigned long long)size, (unsigned long long)want, size < want ? "truncated" : "trailing bytes");
        if (ak_unseal_begin(&r->z, s->key, head, id) != 0)
            return judge(v, AK_STORE_CORRUPT, "seal", "secretstream header rejected");
        r->img_size = si.plain_bytes;
        r->file_pos = AK_SEAL_HEADER_BYTES;
        r->cbuf_cap = ((1u << 20) / si.chunk + 1) * (si.chunk + AK_SEAL_ABYTES);
        if (!(r->cbuf = malloc(r->cbuf_cap))) return judge_error(v, AK_ERR_NOMEM, "out of memory");
    }
    /* a plain file's image is read on demand (its header, then either the
     * whole image or, restoring, straight into blocks: see load_direct) */
    r->cap = r->sealed ? r->img_size : hn;
    if (!(r->img = big_alloc((size_t)r->cap)))
        return judge_error(v, AK_ERR_NOMEM, "out of memory for %llu bytes", (unsigned long long)r->cap);
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
            uint8_t *n = big_alloc((size_t)upto);
            if (!n) return judge_error(v, AK_ERR_NOMEM, "out of memory for %llu bytes", (unsigned long long)upto);
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
                    st = judge(v, AK_STORE_CORRUPT, "seal",
                               "authentication failed in sealed chunk %llu (tampered or torn)", (unsigned long long)idx);
                    break;
                }
                if (rc == -2) {
                    st = judge(v, AK_STORE_CORRUPT, "seal", "sealed chunk %llu has the wrong tag (chunks dropped or "
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

/* What the metadata says (after parse_header). */
typedef struct {
    char agent_id[AK_AGENT_ID_MAX + 1];
    char fingerprint[65];
    char model_name[128];
    ak_cache_spec spec;
    ak_kv_format fk, fv;
    int block_tokens;
    int n_tokens;
    int64_t created;
    char center[2][33];     /* key_center, value_center */
    int kind;               /* AK_FILE_AGENT or AK_FILE_POOL (its "format") */
    int version;            /* its format_version */
    ak_store_base base;     /* agents: the base (canonical: base_normalize; pool_id "" and no segment if none) */
    char pool_hash[17];     /* pools: their content hash */
    const char *source;     /* pools: the "source" string (inside root) */
    int32_t *tokens;        /* malloc'd */
    uint64_t hdr_end;       /* 8 + N: where the data section begins */
    cJSON *root;            /* the parsed header */
} agent_meta;

static void meta_free(agent_meta *m) {
    if (m->tokens) sodium_memzero(m->tokens, sizeof(int32_t) * (size_t)m->n_tokens);
    free(m->tokens);
    wipe_tokens(m->root);
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
    if (m->version < 5) return judge(v, AK_STORE_CORRUPT, "metadata", "segments in a version %d file", m->version);
    if (meta_str(meta, "pool_id") || meta_str(meta, "pool_hash") || meta_str(meta, "base_kind"))
        return judge(v, AK_STORE_CORRUPT, "metadata", "segments beside a single base");
    if (!bl || parse_dec(bl, 1, m->n_tokens, &x))
        return judge(v, AK_STORE_CORRUPT, "metadata", "segments with base_len \"%.20s\" (of %d tokens)", bl ? bl : "",
                     m->n_tokens);
    ak_store_base *b = &m->base;
    memset(b, 0, sizeof *b);
    for (const char *p = sg;;) {
        if (b->n_seg == AK_KV_MAX_SEGMENTS)
            return judge(v, AK_STORE_CORRUPT, "metadata", "more than %d segments", AK_KV_MAX_SEGMENTS);
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
            ok = g->kind >= 0 && (nf == 2) == (g->kind == AK_SEG_OWN) && !parse_dec(fld[1], 1, m->n_tokens, &len);
        }
        if (ok && nf == 4) {
            ok = strlen(fld[2]) <= AK_AGENT_ID_MAX && strlen(fld[3]) < sizeof g->hash;
            if (ok) {
                snprintf(g->id, sizeof g->id, "%s", fld[2]);
                snprintf(g->hash, sizeof g->hash, "%s", fld[3]);
            }
        }
        if (!ok)
            return judge(v, AK_STORE_CORRUPT, "metadata", "segment %d \"%.60s\" is not kind:len[:id:hash]", b->n_seg, p);
        g->len = (int)len;
        b->n_seg++;
        if (!*end) break;
        p = end + 1;
    }
    char why[160];
    if (base_normalize(b, m->n_tokens, why, sizeof why) < 0)
        return judge(v, AK_STORE_CORRUPT, "metadata", "bad segments: %s", why);
    if (b->base_len != x)
        return judge(v, AK_STORE_CORRUPT, "metadata", "segments of %d positions, base_len %lld", b->base_len, (long long)x);
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
    if (kind_pooled(m->kind)) {
        if (!none) return judge(v, AK_STORE_CORRUPT, "metadata", "a pool file with a base");
        if (!hash_ok(ph)) return judge(v, AK_STORE_CORRUPT, "metadata", "metadata pool_hash missing or not 16 hex digits");
        if (!(m->source = meta_str(meta, "source"))) return judge(v, AK_STORE_CORRUPT, "metadata", "metadata key source missing");
        char want[17];
        ak_pool_content_hash(m->fingerprint, &m->spec, m->fk, m->fv, m->tokens, m->n_tokens, want);
        if (strcmp(ph, want))
            return judge(v, AK_STORE_CORRUPT, "poolhash", "pool_hash %s is not the hash of the pool's contents (%s)", ph,
                         want);
        snprintf(m->pool_hash, sizeof m->pool_hash, "%s", ph);
        return AK_STORE_HIT;
    }
    const char *sg = meta_str(meta, "segments");
    if (sg) return parse_segments(meta, sg, m, v);
    if (none) {
        if (ph && *ph) return judge(v, AK_STORE_CORRUPT, "metadata", "pool_hash without a base");
        return AK_STORE_HIT;
    }
    if (!pid || !ak_agent_id_valid(pid) || !hash_ok(ph) || !bl || parse_dec(bl, 1, m->n_tokens, &x))
        return judge(v, AK_STORE_CORRUPT, "metadata", "bad base: pool_id \"%.40s\", pool_hash \"%.20s\", base_len \"%.20s\" "
                     "(of %d tokens)", pid ? pid : "", ph ? ph : "", bl ? bl : "", m->n_tokens);
    const char *kind = meta_str(meta, "base_kind");
    if (kind && strcmp(kind, "pool") && strcmp(kind, "card"))
        return judge(v, AK_STORE_CORRUPT, "metadata", "base_kind \"%.20s\" is neither pool nor card", kind);
    snprintf(m->base.pool_id, sizeof m->base.pool_id, "%s", pid);
    snprintf(m->base.pool_hash, sizeof m->base.pool_hash, "%s", ph);
    m->base.base_len = (int)x;
    m->base.card = kind && !strcmp(kind, "card");
    char why[160];
    if (base_normalize(&m->base, m->n_tokens, why, sizeof why) < 0)
        return judge(v, AK_STORE_CORRUPT, "metadata", "bad base: %s", why);
    return AK_STORE_HIT;
}

/* Reads and checks the header of r's image, a file of kind: length, JSON,
 * padding, the metadata (the format of kind, every required key, canonical
 * integers, known version, matching metadata checksum, agent id equal to
 * `id`, a sound base or none; for pools a content hash equal to the one
 * recomputed from the metadata and token ids), and parses the token ids.
 * CORRUPT for anything malformed; STALE for another format version or an
 * unknown KV format. Does not look at the tensor table. */
static ak_store_status parse_header(reader *r, int kind, const char *id, agent_meta *m, verdict *v) {
    memset(m, 0, sizeof *m);
    uint64_t N = 0;
    for (int i = 7; i >= 0; i--) N = N << 8 | r->img[i];
    if (N > r->img_size - 8)
        return judge(v, AK_STORE_CORRUPT, "truncated", "header length %llu runs past the end of the %llu-byte image",
                     (unsigned long long)N, (unsigned long long)r->img_size);
    if (N < 2) return judge(v, AK_STORE_CORRUPT, "header", "header length %llu is too small", (unsigned long long)N);
    if (reader_need(r, 8 + N, v) != AK_STORE_HIT) return v->st;
    m->hdr_end = 8 + N;
    const char *json = (const char *)r->img + 8, *end = NULL;
    if (json[0] != '{') return judge(v, AK_STORE_CORRUPT, "json", "header is not a JSON object");
    m->root = cJSON_ParseWithLengthOpts(json, (size_t)N, &end, 0);
    if (!m->root || !cJSON_IsObject(m->root))
        return judge(v, AK_STORE_CORRUPT, "json", "header is not valid JSON (near byte %lld)",
                     end ? (long long)(end - json) + 8 : -1LL);
    for (const char *p = end; p < json + N; p++)
        if (*p != ' ') return judge(v, AK_STORE_CORRUPT, "json", "header padding has a non-space byte at %lld",
                                    (long long)(p - json) + 8);

    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(m->root, "__metadata__");
    if (!cJSON_IsObject(meta)) return judge(v, AK_STORE_CORRUPT, "metadata", "no __metadata__ object");
    int np = cJSON_GetArraySize(meta);
    kv_pair *pairs = calloc((size_t)np + 1, sizeof *pairs);
    if (!pairs) return judge_error(v, AK_ERR_NOMEM, "out of memory");
    int i = 0;
    for (const cJSON *it = meta->child; it; it = it->next, i++) {
        if (!cJSON_IsString(it) || !it->string) {
            free(pairs);
            return judge(v, AK_STORE_CORRUPT, "metadata", "metadata value %s is not a string", it->string ? it->string : "?");
        }
        pairs[i] = (kv_pair){it->string, it->valuestring};
    }
    const char *fmt = meta_str(meta, "format"), *ver = meta_str(meta, "format_version");
    int64_t x;
    m->kind = kind;
    if (!fmt || strcmp(fmt, kind_format(kind))) {
        free(pairs);
        return judge(v, AK_STORE_CORRUPT, "metadata", "not an agentkv %s file (format \"%.40s\")", kind_word(kind),
                     fmt ? fmt : "");
    }
    if (!ver || parse_dec(ver, 1, INT32_MAX, &x)) {
        free(pairs);
        return judge(v, AK_STORE_CORRUPT, "metadata", "bad format_version \"%.20s\"", ver ? ver : "");
    }
    if (x < FORMAT_VERSION_OLDEST || x > FORMAT_VERSION) {
        free(pairs);
        return judge(v, AK_STORE_STALE, NULL, "format version %lld is %s than this build's %d..%d", (long long)x,
                     x > FORMAT_VERSION ? "newer" : "older", FORMAT_VERSION_OLDEST, FORMAT_VERSION);
    }
    m->version = (int)x;
    char want[17];
    const char *got = meta_str(meta, "metadata_checksum");
    int dup = metadata_hash(pairs, np, want);
    free(pairs);
    if (dup) return judge(v, AK_STORE_CORRUPT, "metadata", "duplicate metadata key");
    if (!got || strcmp(got, want))
        return judge(v, AK_STORE_CORRUPT, "metadata", "metadata checksum mismatch (%.16s, computed %s)", got ? got : "none",
                     want);

    static const char *required[] = {"agent_id", "model_fingerprint", "model_name", "n_layer", "n_head_kv",
                                     "head_dim_k", "head_dim_v", "n_ctx", "kv_format_k", "kv_format_v",
                                     "block_tokens", "n_tokens", "tokens", "created", "checksum_algorithm",
                                     "block_checksums"};
    for (size_t k = 0; k < sizeof required / sizeof *required; k++)
        if (!meta_str(meta, required[k])) return judge(v, AK_STORE_CORRUPT, "metadata", "metadata key %s missing", required[k]);
    const char *aid = meta_str(meta, "agent_id"), *fp = meta_str(meta, "model_fingerprint");
    const char *name = meta_str(meta, "model_name");
    if (strcmp(aid, id))
        return judge(v, AK_STORE_CORRUPT, "id", "agent_id \"%.40s\" does not match the file name", aid);
    if (!fingerprint_ok(fp) || strlen(name) >= sizeof m->model_name)
        return judge(v, AK_STORE_CORRUPT, "metadata", "bad model_fingerprint or model_name");
    if (strcmp(meta_str(meta, "checksum_algorithm"), "xxh3-64"))
        return judge(v, AK_STORE_CORRUPT, "metadata", "unknown checksum_algorithm");
    static const char *ckeys[2] = {"key_center", "value_center"};
    for (int k = 0; k < 2; k++) {
        const char *c = meta_str(meta, ckeys[k]);
        size_t cl = c ? strlen(c) : 0;
        int ok = cl >= 1 && cl <= 32;
        for (size_t i = 0; ok && i < cl; i++)
            ok = (c[i] >= '0' && c[i] <= '9') || (c[i] >= 'a' && c[i] <= 'z') || c[i] == '.' || c[i] == '-';
        if (!ok) return judge(v, AK_STORE_CORRUPT, "metadata", "metadata %s missing or not an id", ckeys[k]);
        snprintf(m->center[k], sizeof m->center[k], "%s", c);
    }
    snprintf(m->agent_id, sizeof m->agent_id, "%s", aid);
    snprintf(m->fingerprint, sizeof m->fingerprint, "%s", fp);
    snprintf(m->model_name, sizeof m->model_name, "%s", name);
    struct { const char *key; int64_t lo, hi; int64_t val; } ints[] = {
        {"n_layer", 1, MAX_DIM, 0}, {"n_head_kv", 1, MAX_DIM, 0}, {"head_dim_k", 1, 1024, 0},
        {"head_dim_v", 1, 1024, 0}, {"n_ctx", 0, INT32_MAX, 0}, {"block_tokens", 1, AK_KV_MAX_BLOCK_TOKENS, 0},
        {"n_tokens", 0, INT32_MAX, 0}, {"created", 0, INT64_MAX, 0},
    };
    for (size_t k = 0; k < sizeof ints / sizeof *ints; k++)
        if (parse_dec(meta_str(meta, ints[k].key), ints[k].lo, ints[k].hi, &ints[k].val))
            return judge(v, AK_STORE_CORRUPT, "metadata", "metadata %s \"%.20s\" is not an integer in [%lld, %lld]",
                         ints[k].key, meta_str(meta, ints[k].key), (long long)ints[k].lo, (long long)ints[k].hi);
    m->spec = (ak_cache_spec){(int)ints[0].val, (int)ints[1].val, (int)ints[2].val, (int)ints[3].val, (int)ints[4].val};
    m->block_tokens = (int)ints[5].val;
    m->n_tokens = (int)ints[6].val;
    m->created = ints[7].val;
    /* a format this build does not know was written by a newer one */
    if (ak_kv_format_parse(meta_str(meta, "kv_format_k"), &m->fk) || ak_kv_format_parse(meta_str(meta, "kv_format_v"), &m->fv))
        return judge(v, AK_STORE_STALE, NULL, "unknown KV format %.10s/%.10s", meta_str(meta, "kv_format_k"),
                     meta_str(meta, "kv_format_v"));

    /* every id takes a digit and a comma: bounds n_tokens before allocating */
    const char *p = meta_str(meta, "tokens");
    if ((uint64_t)m->n_tokens > (strlen(p) + 1) / 2)
        return judge(v, AK_STORE_CORRUPT, "tokens", "token list too short for %d ids", m->n_tokens);
    if (!(m->tokens = malloc(sizeof(int32_t) * ((size_t)m->n_tokens + 1)))) return judge_error(v, AK_ERR_NOMEM, "out of memory");
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
        return judge(v, AK_STORE_CORRUPT, "tokens", "token list does not hold %d canonical ids", m->n_tokens);
    return parse_base(meta, m, v);
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

/* The tensor table of the header against the layout the metadata implies
 * (the own positions [base_len, n_tokens)) and the image size: on HIT *tout
 * gets the tensors (nt returned in *ntout) and *sout each block's checksum
 * as the file states it (*nbout blocks), both malloc'd (the caller frees).
 * Needs the header only. */
static ak_store_status check_table(reader *r, const agent_meta *m, tensor_desc **tout, int *ntout, uint64_t **sout,
                                   int64_t *nbout, verdict *v) {
    char why[128];
    tensor_desc *t = NULL;
    uint64_t *sums = NULL;
    uint64_t data_bytes = 0;
    ak_kv_component c2[2];
    /* the count first: a hostile n_layer must not size an allocation */
    int64_t count = (int64_t)m->spec.n_layer * (ak_kv_format_components(m->fk, m->spec.head_dim_k, c2) +
                                                 ak_kv_format_components(m->fv, m->spec.head_dim_v, c2));
    if (cJSON_GetArraySize(m->root) - 1 != count)
        return judge(v, AK_STORE_CORRUPT, "tensors", "header has %d tensors, expected %lld", cJSON_GetArraySize(m->root) - 1,
                     (long long)count);
    file_runs ru;
    runs_of(&m->base, m->n_tokens, m->block_tokens, &ru);
    int nt = layout_tensors(&m->spec, m->fk, m->fv, ru.blk0[ru.n], m->block_tokens, &t, &data_bytes, why, sizeof why);
    if (nt < 0) return judge(v, AK_STORE_CORRUPT, "metadata", "%s", why);
    int64_t nb = nt ? t[0].shape[0] : 0;
    ak_store_status st = AK_STORE_HIT;
    uint64_t have = r->img_size - m->hdr_end;
    if (have != data_bytes) {
        st = judge(v, AK_STORE_CORRUPT, "truncated", "data section is %llu bytes, the tensors need %llu (%s)",
                   (unsigned long long)have, (unsigned long long)data_bytes, have < data_bytes ? "truncated" : "trailing bytes");
        goto done;
    }
    /* nb is bounded by the image size now (every block holds bytes) */
    if (!(sums = malloc(sizeof *sums * (size_t)(nb ? nb : 1)))) {
        st = judge_error(v, AK_ERR_NOMEM, "out of memory");
        goto done;
    }
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(m->root, "__metadata__");
    if (parse_block_sums(meta_str(meta, "block_checksums"), nb, sums) != 0) {
        st = judge(v, AK_STORE_CORRUPT, "metadata", "block_checksums is not %lld comma-separated 16-hex-digit values",
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
            st = judge(v, AK_STORE_CORRUPT, "tensors", "tensor %s: missing, or dtype, shape or offsets differ from the "
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
    *tout = t;
    *ntout = nt;
    *sout = sums;
    *nbout = nb;
    return st;
}

/* CORRUPT unless got is the checksum the file states for its block b (the
 * file's runs of positions: file_runs). */
static ak_store_status check_block(const agent_meta *m, int64_t b, uint64_t want, uint64_t got, verdict *v) {
    if (want == got) return AK_STORE_HIT;
    char w[17], g[17];
    hex64(want, w);
    hex64(got, g);
    file_runs ru;
    runs_of(&m->base, m->n_tokens, m->block_tokens, &ru);
    int k = run_of_block(&ru, b);
    int64_t p0 = block_pos(&ru, b, m->block_tokens), p1 = p0 + m->block_tokens;
    if (p1 > ru.start[k] + ru.len[k]) p1 = ru.start[k] + ru.len[k];
    return judge(v, AK_STORE_CORRUPT, "checksum", "checksum mismatch in block %lld (positions %lld..%lld; file says %s, "
                 "data hashes to %s)", (long long)b, (long long)p0, (long long)p1 - 1, w, g);
}

/* The token ids against vocab (> 0). */
static ak_store_status check_tokens(const agent_meta *m, int vocab, verdict *v) {
    for (int i = 0; vocab > 0 && i < m->n_tokens; i++)
        if (m->tokens[i] >= vocab)
            return judge(v, AK_STORE_CORRUPT, "tokens", "token id %d at position %d is outside the vocabulary of %d",
                         m->tokens[i], i, vocab);
    return AK_STORE_HIT;
}

/* The checksums of blocks [j0, nb) of an image whose data section is data
 * (in memory). */
static ak_store_status check_blocks(const agent_meta *m, const uint8_t *data, const tensor_desc *t, int nt,
                                    const uint64_t *sums, int64_t j0, int64_t nb, verdict *v) {
    uint64_t *hs = malloc(sizeof *hs * (size_t)(nt ? nt : 1));
    uint8_t *scratch = malloc((size_t)(nt ? nt : 1) * 8);
    ak_store_status st = AK_STORE_HIT;
    if (!hs || !scratch) st = judge_error(v, AK_ERR_NOMEM, "out of memory");
    for (int64_t b = j0; b < nb && st == AK_STORE_HIT; b++)
        st = check_block(m, b, sums[b], block_checksum(data, t, nt, b, hs, scratch), v);
    free(hs);
    free(scratch);
    return st;
}

/* The tensor table, every block's checksum over the image, the token ids.
 * img must be complete. */
static ak_store_status check_body(reader *r, const agent_meta *m, int vocab, verdict *v) {
    tensor_desc *t = NULL;
    uint64_t *sums = NULL;
    int nt = 0;
    int64_t nb = 0;
    if (check_table(r, m, &t, &nt, &sums, &nb, v) != AK_STORE_HIT) return v->st;
    ak_store_status st = check_blocks(m, r->img + m->hdr_end, t, nt, sums, 0, nb, v);
    if (st == AK_STORE_HIT) st = check_tokens(m, vocab, v);
    free(t);
    free(sums);
    return st;
}

/* STALE unless the file is for this model, spec and formats and fits. */
static ak_store_status check_expect(const agent_meta *m, const char *fingerprint, const ak_kv *kv, verdict *v) {
    if (fingerprint && strcmp(m->fingerprint, fingerprint))
        return judge(v, AK_STORE_STALE, NULL, "saved for model %s, not %s", m->fingerprint, fingerprint);
    if (!kv) return AK_STORE_HIT;
    const ak_cache_spec *s = ak_block_pool_spec(ak_kv_pool(kv)), *f = &m->spec;
    if (s->n_layer != f->n_layer || s->n_head_kv != f->n_head_kv || s->head_dim_k != f->head_dim_k ||
        s->head_dim_v != f->head_dim_v || s->n_ctx != f->n_ctx)
        return judge(v, AK_STORE_STALE, NULL,
                     "cache spec %d layers x %d KV heads x %d/%d dims, n_ctx %d; expected %d x %d x %d/%d, n_ctx %d",
                     f->n_layer, f->n_head_kv, f->head_dim_k, f->head_dim_v, f->n_ctx, s->n_layer, s->n_head_kv,
                     s->head_dim_k, s->head_dim_v, s->n_ctx);
    if (m->fk != ak_kv_format_k(kv) || m->fv != ak_kv_format_v(kv))
        return judge(v, AK_STORE_STALE, NULL, "KV formats %s/%s, expected %s/%s", ak_kv_format_get(m->fk)->name,
                     ak_kv_format_get(m->fv)->name, ak_kv_format_get(ak_kv_format_k(kv))->name,
                     ak_kv_format_get(ak_kv_format_v(kv))->name);
    for (int k = 0; k < 2; k++) {   /* all vectors of a sequence share one centering (blockpool.h) */
        const char *c = ak_block_pool_center_id(ak_kv_pool(kv), k, k ? m->fv : m->fk);
        if (strcmp(m->center[k], c ? c : "none"))
            return judge(v, AK_STORE_STALE, NULL, "%s centered with %s, this cache uses %s", k ? "values" : "keys",
                         m->center[k], c ? c : "none");
    }
    if (m->n_tokens > ak_kv_capacity(kv))
        return judge(v, AK_STORE_STALE, NULL, "%d tokens do not fit the sequence's capacity %d", m->n_tokens,
                     ak_kv_capacity(kv));
    return AK_STORE_HIT;
}

/* Opens and checks the file of id completely (r, m filled on HIT; the
 * caller closes and frees both in any case). */
static ak_store_status check_file(const ak_store *s, int kind, const char *path, const char *id,
                                  const char *fingerprint, int vocab, const ak_kv *kv, reader *r, agent_meta *m,
                                  verdict *v, double *verify_ms) {
    memset(m, 0, sizeof *m);
    char binding[AK_SEAL_ID_MAX + 1];
    seal_binding(kind, id, binding);
    if (reader_open(r, s, path, binding, v) != AK_STORE_HIT) return v->st;
    double t0 = ak_now(), rd0 = r->read_ms;
    if (reader_need(r, 8, v) != AK_STORE_HIT || parse_header(r, kind, id, m, v) != AK_STORE_HIT ||
        check_expect(m, fingerprint, kv, v) != AK_STORE_HIT)
        goto out;
    /* the body is read only once the header says the file is usable */
    if (reader_need(r, r->img_size, v) != AK_STORE_HIT) goto out;
    check_body(r, m, vocab, v);
out:
    *verify_ms = ms_since(t0) - (r->read_ms - rd0);
    return v->st;
}

/* Moves the file of kind at path (if it still is the inode fd refers to,
 * when fd >= 0) into quarantine/ (pools as "pool+<id>...": no agent id
 * holds a '+') and updates the index (which may delete the oldest
 * quarantined files). Returns 0, or -1 with why set. */
static int quarantine_path(ak_store *s, int kind, const char *id, const char *path, int fd, const char *reason,
                           char *dst, size_t dn, char *why, size_t whyn) {
    char qdir[PATH_MAX];
    if (snprintf(qdir, sizeof qdir, "%s/quarantine", s->dir) >= (int)sizeof qdir) {
        snprintf(why, whyn, "path too long");
        return -1;
    }
    if (mkdir(qdir, 0700) != 0 && errno != EEXIST) {
        snprintf(why, whyn, "mkdir %s: %s", qdir, strerror(errno));
        return -1;
    }
    struct stat a, b;
    if (fd >= 0 && fstat(fd, &a) == 0 && (stat(path, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev)) {
        /* replaced by a new save while we read it: the new file is not ours to move */
        snprintf(why, whyn, "the file was replaced meanwhile; the new one was left in place");
        return -1;
    }
    long now = (long)time(NULL);
    const char *pre = kind == AK_FILE_POOL ? POOL_QPREFIX : kind == AK_FILE_MEMORY ? MEMORY_QPREFIX : "";
    for (int k = 0; k < 1000; k++) {
        int w = k ? snprintf(dst, dn, "%s/%s%s%s.%s.%ld.%d", qdir, pre, id, SUFFIX, reason, now, k)
                  : snprintf(dst, dn, "%s/%s%s%s.%s.%ld", qdir, pre, id, SUFFIX, reason, now);
        if (w < 0 || (size_t)w >= dn) break;
        if (access(dst, F_OK) == 0) continue;
        if (rename(path, dst) == 0) {
            if (kind == AK_FILE_POOL || kind == AK_FILE_MEMORY) ak_entry_index_del(s, pooled_index(s, kind), id);
            else index_del(s, id);
            index_quarantined(s, dst);
            return 0;
        }
        snprintf(why, whyn, "rename to %s: %s", dst, strerror(errno));
        return -1;
    }
    snprintf(why, whyn, "no free quarantine name");
    return -1;
}

static int reason_ok(const char *r) {
    if (!r || !*r || strlen(r) > 32) return 0;
    for (; *r; r++)
        if (!((*r >= 'a' && *r <= 'z') || (*r >= '0' && *r <= '9') || *r == '-')) return 0;
    return 1;
}

int ak_store_quarantine(ak_store *s, const char *id, const char *reason, ak_error *err) {
    char path[PATH_MAX], dst[PATH_MAX], why[PATH_MAX + 64];
    if (!ak_agent_id_valid(id)) return ak_failc(err, AK_ERR_INVALID, "store: invalid agent id");
    if (!reason_ok(reason)) return ak_failc(err, AK_ERR_INVALID, "store: quarantine reason must be a short [a-z0-9-] word");
    if (path_of(s, id, SUFFIX, path, sizeof path)) return ak_failc(err, AK_ERR_INVALID, "store: path too long");
    if (access(path, F_OK) != 0) return errno == ENOENT ? 1 : ak_failc(err, ak_err_code_of_errno(errno), "store: %s: %s", path, strerror(errno));
    if (quarantine_path(s, AK_FILE_AGENT, id, path, -1, reason, dst, sizeof dst, why, sizeof why) != 0)
        return ak_failc(err, AK_ERR_IO, "store: %s: quarantine: %s", path, why);
    return 0;
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
 * claimed, never for the worker to exit (the worker is detached; the last
 * of the two frees the shared state). Nothing is visible to the caller's
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
    int fd;
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
    int refs;                /* threads holding this; the last frees it */
    dl_job job[2];           /* [0] the worker, [1] the caller */
};

/* Reads the cnt pieces of iov (their bytes back to back in the file from
 * off) into place; iov is consumed. Returns 0, or -1 with j->err set. */
static int read_pieces(dl_job *j, struct iovec *iov, int cnt, uint64_t off) {
    while (cnt > 0) {
        ssize_t k = preadv(j->sh->fd, iov, cnt, (off_t)off);
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

static void dl_release(dl_shared *sh) {
    if (__atomic_sub_fetch(&sh->refs, 1, __ATOMIC_ACQ_REL) == 0) free(sh);
}

static void *dl_thread(void *arg) {
    dl_job *j = arg;
    dl_shared *sh = j->sh;
    dl_work(j);
    dl_release(sh);   /* touches nothing of the caller's after its last claim */
    return NULL;
}

/* Reads file blocks [j0, nb) of a plain file straight into the prepared
 * positions of tmp (block size the file's; where each block's positions
 * are: file_runs) and checks each block's checksum against sums. HIT, or
 * the verdict. */
static ak_store_status read_direct(reader *r, const agent_meta *m, const tensor_desc *t, int nt,
                                   const uint64_t *sums, int64_t j0, int64_t nb, ak_kv *tmp, verdict *v) {
    int64_t nr = nb - j0;
    if (nr <= 0) return AK_STORE_HIT;
    int T = m->block_tokens;
    file_runs ru;
    runs_of(&m->base, m->n_tokens, T, &ru);
    uint8_t **blk = malloc(sizeof *blk * (size_t)nr);
    size_t *toff = malloc(sizeof *toff * (size_t)(nt ? nt : 1));
    uint64_t *hash = malloc(sizeof *hash * (size_t)nr * (size_t)(nt ? nt : 1));
    uint64_t *hs = malloc(sizeof *hs * (size_t)(nt ? nt : 1));
    uint8_t *scratch = malloc((size_t)(nt ? nt : 1) * 8);
    dl_shared *sh = calloc(1, sizeof *sh);
    ak_store_status st = AK_STORE_HIT;
    if (!blk || !toff || !hash || !hs || !scratch || !sh) {
        free(sh);
        st = judge_error(v, AK_ERR_NOMEM, "out of memory");
        goto out;
    }
    /* block b's data starts with layer 0's K metadata of head 0, or its
     * codes for a format without metadata (blockpool.h) */
    int kc0 = ak_kv_format_meta_bytes(m->fk, m->spec.head_dim_k) ? 1 : 0;
    for (int64_t k = 0; k < nr; k++)
        if (!(blk[k] = ak_kv_stored_mut(tmp, 0, 0, kc0, 0, (int)block_pos(&ru, j0 + k, T)))) {
            free(sh);
            st = judge(v, AK_STORE_ERROR, NULL, "the sequence refused the restored blocks");
            goto out;
        }
    for (int i = 0; i < nt; i++)
        toff[i] = (size_t)(ak_kv_stored_mut(tmp, t[i].layer, t[i].is_v, t[i].ci, 0, (int)block_pos(&ru, j0, T)) - blk[0]);
    uint64_t data_bytes = nt ? t[nt - 1].offset + t[nt - 1].bytes : 0;
    /* WILLNEED has the kernel read the data ahead, but walking the page
     * cache for it costs about 5% of a cached 2000-token restore: ask only
     * when the data's last byte is not cached (the file is read and written
     * in order, so its last page is the last to leave the cache); for the
     * parts read only, when blocks are skipped */
    uint8_t probe;
    struct iovec pv = {&probe, 1};
    if (data_bytes && preadv2(r->fd, &pv, 1, (off_t)(m->hdr_end + data_bytes - 1), RWF_NOWAIT) != 1) {
        if (j0 == 0) posix_fadvise(r->fd, (off_t)m->hdr_end, 0, POSIX_FADV_WILLNEED);
        else
            for (int i = 0; i < nt; i++)
                posix_fadvise(r->fd, (off_t)(m->hdr_end + t[i].offset + (uint64_t)j0 * t[i].piece),
                              (off_t)((uint64_t)nr * t[i].piece), POSIX_FADV_WILLNEED);
    }
    *sh = (dl_shared){r->fd, t, nt, blk, toff, j0, nr, m->hdr_end, hash, 0, 0, 0, 1, {{0}}};
    for (int k = 0; k < 2; k++) sh->job[k] = (dl_job){sh, 0, 0, 0};
    if ((uint64_t)nr * (data_bytes / (uint64_t)nb) >= TWO_THREADS_BYTES) {
        pthread_attr_t at;
        pthread_t th;
        sh->refs = 2;
        if (pthread_attr_init(&at) != 0) sh->refs = 1;
        else {
            if (pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED) != 0 ||
                pthread_create(&th, &at, dl_thread, &sh->job[0]) != 0)
                sh->refs = 1;   /* no worker: the caller does it all */
            pthread_attr_destroy(&at);
        }
    }
    dl_work(&sh->job[1]);
    while (__atomic_load_n(&sh->done, __ATOMIC_ACQUIRE) < nt) sched_yield();   /* the worker's last tensor */
    dl_job res[2] = {sh->job[0], sh->job[1]};   /* complete: every claimed tensor is done */
    dl_release(sh);
    for (int k = 0; k < 2; k++) r->bytes_read += res[k].bytes;
    for (int k = 0; k < 2; k++)
        if (res[k].err) {
            if (res[k].err < 0) st = judge(v, AK_STORE_ERROR, NULL, "file shrank while being read");
            else st = judge(v, AK_STORE_ERROR, NULL, "read at offset %llu: %s", (unsigned long long)res[k].err_off,
                            strerror(res[k].err));
            goto out;
        }
    for (int64_t k = 0; k < nr && st == AK_STORE_HIT; k++) {
        for (int i = 0; i < nt; i++) hs[i] = hash[(size_t)i * (size_t)nr + (size_t)k];
        st = check_block(m, j0 + k, sums[j0 + k], combine_hashes(hs, nt, scratch), v);
    }
out:
    free(blk);
    free(toff);
    free(hash);
    free(hs);
    free(scratch);
    return st;
}

/* Reads what a plain file holds of blocks [j0, nb) into the image at its
 * place (the whole image when j0 = 0); the rest of the image stays unread. */
static ak_store_status read_tails(reader *r, const agent_meta *m, const tensor_desc *t, int nt, int64_t j0,
                                  verdict *v) {
    if (j0 == 0) return reader_need(r, r->img_size, v);
    double t0 = ak_now();
    if (r->img_size > r->cap) {
        uint8_t *n = big_alloc((size_t)r->img_size);
        if (!n) return judge_error(v, AK_ERR_NOMEM, "out of memory for %llu bytes", (unsigned long long)r->img_size);
        memcpy(n, r->img, (size_t)r->have);
        free(r->img);
        r->img = n;
        r->cap = r->img_size;
    }
    ak_store_status st = AK_STORE_HIT;
    for (int i = 0; i < nt && st == AK_STORE_HIT; i++) {
        uint64_t off = m->hdr_end + t[i].offset + (uint64_t)j0 * t[i].piece, len = t[i].bytes - (uint64_t)j0 * t[i].piece;
        if (len) st = pread_all(r, r->img + off, (size_t)len, off, v);
    }
    r->read_ms += ms_since(t0);
    return st;
}

/* Loads the file of kind at path into kv (see ak_store_load_linked): checks
 * the header, metadata, expectations and token ids; calls prelink (if any)
 * on a fresh sequence, which then holds positions [0, L); reads and checks
 * only the file blocks holding positions >= L: straight into the fresh
 * sequence's blocks (a plain file of the pool's block size, with room in
 * the budget), else through an image verified in memory (sealed files, whose
 * seal is read whole; another block size; no room for a second copy while
 * kv holds its old one: kv is emptied only after the checks). Only when
 * everything passed is the fresh sequence swapped into kv. r and m are
 * filled (the caller closes and frees both in any case). */
static ak_store_status load_file(ak_store *s, int kind, const char *path, const char *id, const char *fingerprint,
                                 int vocab, ak_kv *kv, ak_store_prelink_fn prelink, void *ud, reader *r,
                                 agent_meta *m, verdict *v, ak_store_load_info *info) {
    memset(m, 0, sizeof *m);
    char binding[AK_SEAL_ID_MAX + 1];
    seal_binding(kind, id, binding);
    if (reader_open(r, s, path, binding, v) != AK_STORE_HIT) return v->st;
    double t0 = ak_now(), rd0 = r->read_ms, t1 = 0, ck0 = 0;
    int timed = 0;
    tensor_desc *t = NULL;
    uint64_t *sums = NULL;
    int nt = 0;
    int64_t nb = 0;
    ak_kv *tmp = NULL;
    ak_error e2 = {{0}};
    if (reader_need(r, 8, v) != AK_STORE_HIT || parse_header(r, kind, id, m, v) != AK_STORE_HIT ||
        check_expect(m, fingerprint, kv, v) != AK_STORE_HIT ||
        check_table(r, m, &t, &nt, &sums, &nb, v) != AK_STORE_HIT || check_tokens(m, vocab, v) != AK_STORE_HIT)
        goto out;
    info->base = m->base;
    int n = m->n_tokens, base = m->base.base_len, Tf = m->block_tokens;
    file_runs ru;
    runs_of(&m->base, n, Tf, &ru);
    int own_segs = ru.n > 1;   /* the file holds positions inside its base: read whole */
    ak_block_pool *pool = ak_kv_pool(kv);
    int T = ak_block_pool_block_tokens(pool);
    if (base > 0 && !prelink) {
        if (m->base.pool_id[0])
            judge(v, AK_STORE_STALE, NULL, "agent file starts with pool %s (%d positions): no pool supplied",
                  m->base.pool_id, base);
        else judge(v, AK_STORE_STALE, NULL, "agent file starts with %d segments (%d positions): no prelink supplied",
                   m->base.n_seg, base);
        goto out;
    }
    if (!(tmp = ak_kv_new(pool, m->fk, m->fv, ak_kv_capacity(kv), &e2))) {
        judge_error(v, e2.code, "%s", e2.msg);
        goto out;
    }
    int L = 0;
    if (prelink) {
        ak_error pe = {{0}};
        if (prelink(ud, &m->base, m->tokens, n, tmp, &pe) != 0) {
            /* the pool vanished or changed: the file cannot be used now */
            if (pe.code == AK_ERR_STALE || pe.code == AK_ERR_NOT_FOUND)
                judge(v, AK_STORE_STALE, NULL, "%s", pe.msg[0] ? pe.msg : "the base could not be supplied");
            else judge_error(v, pe.code ? pe.code : AK_ERR_GENERIC, "%s", pe.msg[0] ? pe.msg : "prelink failed");
            goto out;
        }
        L = ak_kv_length(tmp);
        int kl[AK_KV_MAX_SEGMENTS], kns = ak_kv_segments(tmp, kl), same = kns == m->base.n_seg;
        for (int k = 0; same && k < kns; k++) same = kl[k] == m->base.seg[k].len;
        if (L > n || L < base || ak_kv_base_len(tmp) != base || (L < n && (L - base) % T) || !same ||
            (own_segs && L != base)) {
            judge_error(v, AK_ERR_INVALID, "the prelink callback left %d positions and a base of %d in %d segments: "
                        "expected the file's %d segments, a base of %d and a block boundary (blocks of %d) up to %d%s",
                        L, ak_kv_base_len(tmp), kns, m->base.n_seg, base, T, n,
                        own_segs ? ", nothing past the base" : "");
            goto out;
        }
    }
    info->linked = L;
    for (int k = 0; own_segs && k < ru.n - 1; k++) info->linked -= ru.len[k];   /* read, not linked */
    int64_t j0 = own_segs ? 0 : L >= n ? nb : (L - base) / Tf;
    info->verify_ms = ms_since(t0) - (r->read_ms - rd0);
    timed = 1;
    t1 = ak_now();
    int direct = !r->sealed && Tf == T;
    if (direct && ak_kv_prepare(tmp, L, n, &e2) != 0) {
        if (ak_kv_n_blocks(kv) == 0) {
            judge_error(v, e2.code, "%s", e2.msg);
            goto out;
        }
        direct = 0;   /* the old cache holds the budget: verify first, then swap */
    }
    double fused = 0, tr0 = t1;
    if (direct) {
        double f0 = ak_now();
        if (read_direct(r, m, t, nt, sums, j0, nb, tmp, v) != AK_STORE_HIT) goto out;
        fused = ms_since(f0);
        r->read_ms += fused;   /* reading and hashing, fused */
    } else {
        if (r->sealed ? reader_need(r, r->img_size, v) != AK_STORE_HIT : read_tails(r, m, t, nt, j0, v) != AK_STORE_HIT)
            goto out;
        ck0 = ak_now();
        if (check_blocks(m, r->img + m->hdr_end, t, nt, sums, j0, nb, v) != AK_STORE_HIT) goto out;
        info->verify_ms += ms_since(ck0);
        tr0 = ak_now();
        /* verified: kv is emptied (its blocks are the budget the restore
         * needs) and the fresh sequence filled */
        ak_kv_truncate(kv, 0);
        if (ak_kv_prepare(tmp, L, n, &e2) != 0) {
            judge_error(v, e2.code, "%s", e2.msg);
            goto out;
        }
        if (transfer(tmp, 1, r->img + m->hdr_end, t, nt, &ru, L - base, Tf) != 0) {
            judge(v, AK_STORE_ERROR, NULL, "the sequence refused a restored vector");
            goto out;
        }
    }
    /* verified: only now does anything reach the caller's sequence */
    if (ak_kv_set_length(tmp, n, &e2) != 0 || ak_kv_swap(kv, tmp) != 0) {
        judge(v, AK_STORE_ERROR, NULL, "the sequence refused the restored blocks");
        goto out;
    }
    info->restore_ms = ms_since(tr0) - fused;
out:
    if (!timed) info->verify_ms = ms_since(t0) - (r->read_ms - rd0);
    ak_kv_free(tmp);   /* kv's old blocks after a swap, else the unverified copy */
    free(t);
    free(sums);
    return v->st;
}

static void entry_from_meta(ak_store_entry *e, const agent_meta *m);

/* After a hit: the index entry of id says what the file holds, its size,
 * and that it was just used (its mtime, set by the caller, is now). */
static void index_loaded(ak_store *s, const char *id, const reader *r, const agent_meta *m) {
    ak_store_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.id, sizeof e.id, "%s", id);
    entry_from_meta(&e, m);
    e.bytes = (uint64_t)r->st.st_size;
    e.sealed = r->sealed;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    e.mtime = (int64_t)now.tv_sec;
    e.mtime_ns = (int64_t)now.tv_nsec;
    if (kind_pooled(m->kind)) {
        ak_store_pool_entry pe;
        memset(&pe, 0, sizeof pe);
        pe.e = e;
        snprintf(pe.pool_hash, sizeof pe.pool_hash, "%s", m->pool_hash);
        pe.source = strdup(m->source ? m->source : "");
        pooled_index_put(s, m->kind, &pe);
    } else {
        index_put(s, &e);
    }
}

ak_store_status ak_store_load_kind(ak_store *s, int kind, const char *id, const char *fingerprint, int vocab,
                                   ak_kv *kv, ak_store_prelink_fn prelink, void *ud, ak_store_load_info *info,
                                   char *pool_hash, ak_error *err) {
    ak_store_load_info dummy;
    if (!info) info = &dummy;
    memset(info, 0, sizeof *info);
    if (!ak_agent_id_valid(id)) {
        ak_failc(err, AK_ERR_INVALID, "store: invalid %s id", kind_word(kind));
        return AK_STORE_ERROR;
    }
    char path[PATH_MAX];
    if (kpath_of(s, kind, id, SUFFIX, path, sizeof path)) { ak_failc(err, AK_ERR_INVALID, "store: path too long"); return AK_STORE_ERROR; }
    double t0 = ak_now();
    reader r;
    agent_meta m;
    verdict v = {AK_STORE_HIT, NULL, "", 0};
    ak_store_status st = load_file(s, kind, path, id, fingerprint, vocab, kv, prelink, ud, &r, &m, &v, info);
    info->bytes_read = r.bytes_read;
    info->read_ms = r.read_ms;
    if (st == AK_STORE_HIT) {
        futimens(r.fd, NULL);   /* recently used, for ak_store_gc; best effort */
        index_loaded(s, id, &r, &m);
        info->n_tokens = m.n_tokens;
        if (pool_hash) snprintf(pool_hash, 17, "%s", m.pool_hash);
        if (info != &dummy) { /* handed to the caller; else freed below */
            info->tokens = m.tokens;
            m.tokens = NULL;
        }
    } else if (st == AK_STORE_CORRUPT) {
        char dst[PATH_MAX], why[PATH_MAX + 64];
        if (quarantine_path(s, kind, id, path, r.fd, v.slug ? v.slug : "corrupt", dst, sizeof dst, why, sizeof why) == 0) {
            info->quarantined = 1;
            ak_failc(err, AK_ERR_CORRUPT, "store: %s: corrupt: %s; moved to %s", path, v.msg, dst);
        } else {
            ak_failc(err, AK_ERR_CORRUPT, "store: %s: corrupt: %s; not moved: %s", path, v.msg, why);
        }
    } else {
        ak_failc(err, v.code, "store: %s: %s: %s", path, ak_store_status_name(st), v.msg);
    }
    reader_close(&r);
    meta_free(&m);
    info->total_ms = ms_since(t0);
    return st;
}

ak_store_status ak_store_load_linked(ak_store *s, const char *id, const char *fingerprint, int vocab, ak_kv *kv,
                                     ak_store_prelink_fn prelink, void *ud, ak_store_load_info *info,
                                     ak_error *err) {
    return ak_store_load_kind(s, AK_FILE_AGENT, id, fingerprint, vocab, kv, prelink, ud, info, NULL, err);
}

ak_store_status ak_store_load(ak_store *s, const char *id, const char *fingerprint, int vocab, ak_kv *kv,
                              ak_store_load_info *info, ak_error *err) {
    return ak_store_load_kind(s, AK_FILE_AGENT, id, fingerprint, vocab, kv, NULL, NULL, info, NULL, err);
}

ak_store_status ak_store_verify(ak_store *s, const char *id, const char *fingerprint, int vocab, ak_error *err) {
    if (!ak_agent_id_valid(id)) { ak_failc(err, AK_ERR_INVALID, "store: invalid agent id"); return AK_STORE_ERROR; }
    char path[PATH_MAX];
    if (path_of(s, id, SUFFIX, path, sizeof path)) { ak_failc(err, AK_ERR_INVALID, "store: path too long"); return AK_STORE_ERROR; }
    reader r;
    agent_meta m;
    verdict v = {AK_STORE_HIT, NULL, "", 0};
    double ms;
    ak_store_status st = check_file(s, AK_FILE_AGENT, path, id, fingerprint, vocab, NULL, &r, &m, &v, &ms);
    if (st != AK_STORE_HIT) ak_failc(err, v.code, "store: %s: %s: %s", path, ak_store_status_name(st), v.msg);
    reader_close(&r);
    meta_free(&m);
    return st;
}

/* ------------------------------------------------ listing, gc, removal */

static void entry_from_meta(ak_store_entry *e, const agent_meta *m) {
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

/* Fills e from the file of kind and id: size and mtime always (returns 1
 * if absent), the metadata when the header is readable and sound; for a
 * pool pe (if not NULL) gets e, the content hash and a copy of the source. */
static int read_entry(const ak_store *s, int kind, const char *id, ak_store_entry *e, ak_store_pool_entry *pe,
                      char **metadata_json, verdict *v) {
    char path[PATH_MAX], binding[AK_SEAL_ID_MAX + 1];
    memset(e, 0, sizeof *e);
    if (pe) memset(pe, 0, sizeof *pe);
    snprintf(e->id, sizeof e->id, "%s", id);
    if (kpath_of(s, kind, id, SUFFIX, path, sizeof path)) { judge_error(v, AK_ERR_INVALID, "path too long"); return -1; }
    seal_binding(kind, id, binding);
    reader r;
    agent_meta m;
    memset(&m, 0, sizeof m);
    ak_store_status st = reader_open(&r, s, path, binding, v);
    if (st == AK_STORE_ABSENT) { reader_close(&r); return 1; }
    if (r.fd >= 0) {
        e->bytes = (uint64_t)r.st.st_size;
        e->mtime = (int64_t)r.st.st_mtim.tv_sec;
        e->mtime_ns = (int64_t)r.st.st_mtim.tv_nsec;
        e->sealed = r.sealed;   /* known even when the seal cannot be opened */
    }
    int rc = -1;
    if (st == AK_STORE_HIT && reader_need(&r, 8, v) == AK_STORE_HIT && parse_header(&r, kind, id, &m, v) == AK_STORE_HIT) {
        entry_from_meta(e, &m);
        rc = 0;
        if (pe) {
            snprintf(pe->pool_hash, sizeof pe->pool_hash, "%s", m.pool_hash);
            pe->source = strdup(m.source ? m.source : "");
        }
        if (metadata_json) {
            *metadata_json = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(m.root, "__metadata__"));
            if (!*metadata_json) rc = -1, judge_error(v, AK_ERR_NOMEM, "out of memory");
        }
    }
    meta_free(&m);
    reader_close(&r);
    if (pe) pe->e = *e;
    return rc;
}

/* Names of the agent files in the directory (malloc'd array of malloc'd
 * ids), with size and mtime when stat_them. */
static int scan_ids(const ak_store *s, int kind, ak_store_entry **out, int *n, ak_error *err) {
    DIR *d = opendir(kind_dir(s, kind));
    if (!d && kind_pooled(kind) && errno == ENOENT) {   /* no pool (memory) saved yet */
        *out = NULL;
        *n = 0;
        return 0;
    }
    if (!d) return ak_failc(err, ak_err_code_of_errno(errno), "store: opendir %s: %s", kind_dir(s, kind), strerror(errno));
    int cap = 16, cnt = 0;
    ak_store_entry *es = malloc(sizeof *es * (size_t)cap);
    if (!es) { closedir(d); return ak_failc(err, AK_ERR_NOMEM, "store: out of memory"); }
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name), sl = strlen(SUFFIX);
        if (len <= sl || strcmp(de->d_name + len - sl, SUFFIX) || len - sl > AK_AGENT_ID_MAX) continue;
        char id[AK_AGENT_ID_MAX + 1];
        memcpy(id, de->d_name, len - sl);
        id[len - sl] = 0;
        if (!ak_agent_id_valid(id)) continue;
        char path[PATH_MAX];
        struct stat st;
        if (kpath_of(s, kind, id, SUFFIX, path, sizeof path) || lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (cnt == cap) {
            ak_store_entry *ne = realloc(es, sizeof *es * (size_t)(cap *= 2));
            if (!ne) { free(es); closedir(d); return ak_failc(err, AK_ERR_NOMEM, "store: out of memory"); }
            es = ne;
        }
        ak_store_entry *e = &es[cnt++];
        memset(e, 0, sizeof *e);
        snprintf(e->id, sizeof e->id, "%s", id);
        e->bytes = (uint64_t)st.st_size;
        e->mtime = (int64_t)st.st_mtim.tv_sec;
        e->mtime_ns = (int64_t)st.st_mtim.tv_nsec;
    }
    closedir(d);
    *out = es;
    *n = cnt;
    return 0;
}

static int cmp_entry_id(const void *a, const void *b) {
    return strcmp(((const ak_store_entry *)a)->id, ((const ak_store_entry *)b)->id);
}

static int cmp_entry_age(const void *a, const void *b) {
    const ak_store_entry *x = a, *y = b;
    if (x->mtime != y->mtime) return x->mtime < y->mtime ? -1 : 1;
    if (x->mtime_ns != y->mtime_ns) return x->mtime_ns < y->mtime_ns ? -1 : 1;
    return strcmp(x->id, y->id);
}

int ak_store_list(ak_store *s, ak_store_entry **out, int *n, ak_error *err) {
    pthread_mutex_lock(&s->mu);
    ak_store_entry *es = malloc(sizeof *es * (size_t)(s->n_idx ? s->n_idx : 1));
    if (es && s->n_idx) memcpy(es, s->idx, sizeof *es * (size_t)s->n_idx);
    int k = s->n_idx;
    pthread_mutex_unlock(&s->mu);
    if (!es) return ak_failc(err, AK_ERR_NOMEM, "store: out of memory");
    *out = es;
    *n = k;
    return 0;
}

int ak_store_lookup(ak_store *s, const char *id, ak_store_entry *out) {
    int rc = 1;
    pthread_mutex_lock(&s->mu);
    for (int lo = 0, hi = s->n_idx - 1; lo <= hi;) {
        int mid = (lo + hi) / 2, c = strcmp(s->idx[mid].id, id);
        if (!c) {
            *out = s->idx[mid];
            rc = 0;
            break;
        }
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int ak_store_inspect(ak_store *s, const char *id, ak_store_entry *out, char **metadata_json, ak_error *err) {
    if (metadata_json) *metadata_json = NULL;
    if (!ak_agent_id_valid(id)) return ak_failc(err, AK_ERR_INVALID, "store: invalid agent id");
    verdict v = {AK_STORE_HIT, NULL, "", 0};
    int rc = read_entry(s, AK_FILE_AGENT, id, out, NULL, metadata_json, &v);
    if (rc < 0) ak_failc(err, v.code, "store: %s/%s%s: %s: %s", s->dir, id, SUFFIX, ak_store_status_name(v.st), v.msg);
    /* what was just read is the newest word on this file */
    if (rc == 1) index_del(s, id);
    else if (rc == 0 || out->bytes) index_put(s, out);
    return rc;
}

int ak_store_remove(ak_store *s, const char *id, ak_error *err) {
    char path[PATH_MAX];
    if (!ak_agent_id_valid(id)) return ak_failc(err, AK_ERR_INVALID, "store: invalid agent id");
    if (path_of(s, id, SUFFIX, path, sizeof path)) return ak_failc(err, AK_ERR_INVALID, "store: path too long");
    if (unlink(path) != 0) {
        if (errno == ENOENT) {
            index_del(s, id);
            return 1;
        }
        return ak_failc(err, ak_err_code_of_errno(errno), "store: unlink %s: %s", path, strerror(errno));
    }
    index_del(s, id);
    return 0;
}

/* Deletes the oldest quarantined file. Call with s->mu held. */
static void drop_oldest_quarantined(ak_store *s) {
    char path[PATH_MAX + NAME_MAX + 16];
    snprintf(path, sizeof path, "%s/quarantine/%s", s->dir, s->q[0].name);
    unlink(path);   /* gone already is as good */
    memmove(s->q, s->q + 1, sizeof *s->q * (size_t)(s->nq - 1));
    s->nq--;
}

int ak_store_gc(ak_store *s, uint64_t budget, uint64_t *bytes_after, ak_error *err) {
    int removed = 0;
    pthread_mutex_lock(&s->mu);
    uint64_t total = 0;
    for (int i = 0; i < s->n_idx; i++) total += s->idx[i].bytes;
    for (int i = 0; i < s->nq; i++) total += s->q[i].bytes;
    /* corrupt files first (the oldest first): they serve no agent */
    while (total > budget && s->nq > 0) {
        total -= s->q[0].bytes;
        drop_oldest_quarantined(s);
        removed++;
    }
    ak_store_entry *es = NULL;
    int cnt = s->n_idx;
    if (total > budget) {
        es = malloc(sizeof *es * (size_t)(cnt ? cnt : 1));
        if (!es) {
            pthread_mutex_unlock(&s->mu);
            return ak_failc(err, AK_ERR_NOMEM, "store: gc: out of memory");
        }
        memcpy(es, s->idx, sizeof *es * (size_t)cnt);
        qsort(es, (size_t)cnt, sizeof *es, cmp_entry_age);
    }
    int rc = 0;
    for (int i = 0; es && i < cnt && total > budget; i++) {
        char path[PATH_MAX];
        if (path_of(s, es[i].id, SUFFIX, path, sizeof path)) continue;
        if (unlink(path) != 0 && errno != ENOENT) {
            int e = errno;
            rc = ak_failc(err, ak_err_code_of_errno(e), "store: gc: unlink %s: %s", path, strerror(e));
            break;
        }
        /* index_del takes the lock: remove the entry here */
        for (int j = 0; j < s->n_idx; j++)
            if (!strcmp(s->idx[j].id, es[i].id)) {
                memmove(s->idx + j, s->idx + j + 1, sizeof *s->idx * (size_t)(s->n_idx - j - 1));
                s->n_idx--;
                break;
            }
        total -= es[i].bytes;
        removed++;
    }
    pthread_mutex_unlock(&s->mu);
    free(es);
    if (rc < 0) return -1;
    if (bytes_after) *bytes_after = total;
    return removed;
}

/* ---------------------------------------------------------------- index */

/* Inserts e (or replaces the entry of its id), keeping the order by id. */
static void index_put(ak_store *s, const ak_store_entry *e) {
    pthread_mutex_lock(&s->mu);
    int lo = 0, hi = s->n_idx;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (strcmp(s->idx[mid].id, e->id) < 0) lo = mid + 1;
        else hi = mid;
    }
    if (lo < s->n_idx && !strcmp(s->idx[lo].id, e->id)) {
        s->idx[lo] = *e;
    } else {
        if (s->n_idx == s->cap_idx) {
            int nc = s->cap_idx ? s->cap_idx * 2 : 16;
            ak_store_entry *ni = realloc(s->idx, sizeof *ni * (size_t)nc);
            if (!ni) {   /* out of memory: the file is simply not listed until the next open */
                pthread_mutex_unlock(&s->mu);
                return;
            }
            s->idx = ni;
            s->cap_idx = nc;
        }
        memmove(s->idx + lo + 1, s->idx + lo, sizeof *s->idx * (size_t)(s->n_idx - lo));
        s->idx[lo] = *e;
        s->n_idx++;
    }
    pthread_mutex_unlock(&s->mu);
}

static void index_del(ak_store *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    for (int j = 0; j < s->n_idx; j++)
        if (!strcmp(s->idx[j].id, id)) {
            memmove(s->idx + j, s->idx + j + 1, sizeof *s->idx * (size_t)(s->n_idx - j - 1));
            s->n_idx--;
            break;
        }
    pthread_mutex_unlock(&s->mu);
}

/* Appends a file to the quarantine list (the newest) and deletes the oldest
 * beyond QUARANTINE_MAX_FILES. Call with s->mu held. */
static void quarantine_add(ak_store *s, const char *name, uint64_t bytes) {
    for (int i = 0; i < s->nq; i++)   /* a name used again: its old file is gone (deleted behind our back) */
        if (!strcmp(s->q[i].name, name)) {
            memmove(s->q + i, s->q + i + 1, sizeof *s->q * (size_t)(s->nq - i - 1));
            s->nq--;
            break;
        }
    if (s->nq == s->cap_q) {
        int nc = s->cap_q ? s->cap_q * 2 : 8;
        qfile *nq = realloc(s->q, sizeof *nq * (size_t)nc);
        if (!nq) return;   /* not counted until the next open */
        s->q = nq;
        s->cap_q = nc;
    }
    snprintf(s->q[s->nq].name, sizeof s->q[s->nq].name, "%s", name);
    s->q[s->nq].bytes = bytes;
    s->nq++;
    while (s->nq > QUARANTINE_MAX_FILES) drop_oldest_quarantined(s);
}

/* A file just moved to path (in quarantine/). */
static void index_quarantined(ak_store *s, const char *path) {
    struct stat st;
    const char *name = strrchr(path, '/');
    if (!name || lstat(path, &st) != 0) return;
    pthread_mutex_lock(&s->mu);
    quarantine_add(s, name + 1, (uint64_t)st.st_size);
    pthread_mutex_unlock(&s->mu);
}

typedef struct {
    char name[NAME_MAX + 1];
    uint64_t bytes;
    int64_t t, tn;
} qscan;

static int cmp_qscan(const void *a, const void *b) {
    const qscan *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    if (x->tn != y->tn) return x->tn < y->tn ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Builds the index at open: every agent file's header (as ak_store_list
 * used to read on each call) and the quarantined files, oldest first (by
 * the time they were moved there: a rename sets the change time). Returns
 * 0, or -1 with err set. */
static int index_build(ak_store *s, ak_error *err) {
    ak_store_entry *es = NULL;
    int cnt = 0;
    if (scan_ids(s, AK_FILE_AGENT, &es, &cnt, err) != 0) return -1;
    int k = 0;
    for (int i = 0; i < cnt; i++) {
        verdict v = {AK_STORE_HIT, NULL, "", 0};
        char id[AK_AGENT_ID_MAX + 1];
        snprintf(id, sizeof id, "%s", es[i].id);
        if (read_entry(s, AK_FILE_AGENT, id, &es[k], NULL, NULL, &v) != 1) k++;   /* 1: removed since the scan */
    }
    qsort(es, (size_t)k, sizeof *es, cmp_entry_id);
    s->idx = es;
    s->n_idx = k;
    s->cap_idx = cnt;
    /* the pools, likewise (their index sorts itself) */
    if (scan_ids(s, AK_FILE_POOL, &es, &cnt, err) != 0) return -1;
    for (int i = 0; i < cnt; i++) {
        verdict v = {AK_STORE_HIT, NULL, "", 0};
        ak_store_entry e;
        ak_store_pool_entry pe;
        if (read_entry(s, AK_FILE_POOL, es[i].id, &e, &pe, NULL, &v) != 1) pooled_index_put(s, AK_FILE_POOL, &pe);
    }
    free(es);
    /* and the memories (store_memory.c) */
    if (scan_ids(s, AK_FILE_MEMORY, &es, &cnt, err) != 0) return -1;
    for (int i = 0; i < cnt; i++) {
        verdict v = {AK_STORE_HIT, NULL, "", 0};
        ak_store_entry e;
        ak_store_pool_entry pe;
        if (read_entry(s, AK_FILE_MEMORY, es[i].id, &e, &pe, NULL, &v) != 1) pooled_index_put(s, AK_FILE_MEMORY, &pe);
    }
    free(es);
    char qdir[PATH_MAX + 16];
    snprintf(qdir, sizeof qdir, "%s/quarantine", s->dir);
    DIR *d = opendir(qdir);
    if (!d) return 0;   /* none yet */
    qscan *qs = NULL;
    int nqs = 0, capqs = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[PATH_MAX + NAME_MAX + 32];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", qdir, de->d_name);
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (nqs == capqs) {
            int nc = capqs ? capqs * 2 : 16;
            qscan *n2 = realloc(qs, sizeof *n2 * (size_t)nc);
            if (!n2) break;
            qs = n2;
            capqs = nc;
        }
        snprintf(qs[nqs].name, sizeof qs[nqs].name, "%s", de->d_name);
        qs[nqs].bytes = (uint64_t)st.st_size;
        qs[nqs].t = (int64_t)st.st_ctim.tv_sec;
        qs[nqs].tn = (int64_t)st.st_ctim.tv_nsec;
        nqs++;
    }
    closedir(d);
    if (nqs) qsort(qs, (size_t)nqs, sizeof *qs, cmp_qscan);
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < nqs; i++) quarantine_add(s, qs[i].name, qs[i].bytes);   /* also applies the bound */
    pthread_mutex_unlock(&s->mu);
    free(qs);
    return 0;
}
