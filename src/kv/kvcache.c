/* kvcache.c - see kvcache.h */
#include "kv/kvcache.h"
#include "base/vmath.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv/blockpool.h"

struct ak_kv {
    ak_block_pool *pool;
    ak_cache_spec spec;
    ak_kv_format fk, fv;
    int T;              /* tokens per block */
    int capacity;
    int length;         /* never below base_len */
    int base_len;       /* positions of the segments (kvcache.h): seg_start[n_seg] */
    int n_seg;          /* segments of the base, 0..AK_KV_MAX_SEGMENTS */
    /* segment k holds positions [seg_start[k], seg_start[k + 1]) in table
     * entries [seg_blk0[k], seg_blk0[k + 1]), standard-mapped from its
     * start; entry n_seg of each is the end of the base (where the own
     * positions and blocks start) */
    int seg_start[AK_KV_MAX_SEGMENTS + 1];
    int seg_blk0[AK_KV_MAX_SEGMENTS + 1];
    int n_table;        /* entries of table: ceil(capacity / T) + AK_KV_MAX_SEGMENTS (a partial block per segment) */
    ak_block **table;   /* (n_table) NULL where not allocated; layer group 0 (cachespec.h) */
    /* LAYER GROUPS. With sliding-window layers (ng = 2) ltable holds the
     * local group's blocks, entry for entry with table (the same spans:
     * segments map both alike). Its entries below span lfirst_span were
     * released (ak_kv_release_window): positions before lfirst (that
     * span's start) are held by the global layers only. */
    int ng;
    ak_block **ltable;  /* (n_table) or NULL with one group */
    int lfirst;         /* first position the local layers may still hold */
    int release;        /* release the local group's blocks that slide out (ak_kv_release_window) */
    int n_corr;         /* corrections (kvcache.h: CORRECTIONS), in corr[0..n_corr) */
    struct kv_corr *corr[AK_KV_MAX_CORRECTIONS];
};

/* One corrected range (kvcache.h: CORRECTIONS): positions [start, start +
 * n), weight w[j] for position start + j; for each layer >= layer0 whose
 * set[] flag is on, mu holds the KV heads' mean key residuals (H x dk) then
 * value residuals (H x dv), and mu_rot the same vectors in the rotated
 * formats' basis (ak_kv_rotate), which is where a rotated block's keys and
 * values are decoded to. */
struct kv_corr {
    int start, n, layer0;
    float *w;
    unsigned char *set;   /* (n_layer) */
    float *mu, *mu_rot;   /* (n_layer x H x (dk + dv)) */
};

/* The block table of layer l's group. */
static inline ak_block **tab_of(const ak_kv *kv, int layer) {
    return kv->ng > 1 && ak_spec_group(&kv->spec, layer) ? kv->ltable : kv->table;
}

/* Blocks of the base: every segment's, each segment's last maybe partial. */
static inline int n_base_blocks(const ak_kv *kv) { return kv->seg_blk0[kv->n_seg]; }

/* The segment holding base position pos < base_len (a few segments at
 * most: a linear scan). */
static inline int seg_of_pos(const ak_kv *kv, int pos) {
    int k = 0;
    while (k + 1 < kv->n_seg && kv->seg_start[k + 1] <= pos) k++;
    return k;
}

/* The segment holding base block i < n_base_blocks. */
static inline int seg_of_block(const ak_kv *kv, int i) {
    int k = 0;
    while (k + 1 < kv->n_seg && kv->seg_blk0[k + 1] <= i) k++;
    return k;
}

/* Sets the segments to lens[0..n) (the table is not touched): the one
 * place their starts and first blocks are derived. */
static void seg_set(ak_kv *kv, const int *lens, int n) {
    kv->n_seg = n;
    kv->seg_start[0] = kv->seg_blk0[0] = 0;
    for (int k = 0; k < n; k++) {
        kv->seg_start[k + 1] = kv->seg_start[k] + lens[k];
        kv->seg_blk0[k + 1] = kv->seg_blk0[k] + (lens[k] + kv->T - 1) / kv->T;
    }
    kv->base_len = kv->seg_start[n];
}

/* The segments' lengths into lens (AK_KV_MAX_SEGMENTS entries); returns
 * their number. */
static int seg_lens(const ak_kv *kv, int *lens) {
    for (int k = 0; k < kv->n_seg; k++) lens[k] = kv->seg_start[k + 1] - kv->seg_start[k];
    return kv->n_seg;
}

/* The block holding position pos, and its slot there (kvcache.h). */
static inline int block_of(const ak_kv *kv, int pos, int *slot) {
    if (pos < kv->base_len) {
        int k = seg_of_pos(kv, pos), r = pos - kv->seg_start[k];
        *slot = r % kv->T;
        return kv->seg_blk0[k] + r / kv->T;
    }
    int r = pos - kv->base_len;
    *slot = r % kv->T;
    return n_base_blocks(kv) + r / kv->T;
}

/* First position of block i, and how many positions it can hold. */
static inline int span_start(const ak_kv *kv, int i) {
    int nb = n_base_blocks(kv);
    if (i >= nb) return kv->base_len + (i - nb) * kv->T;
    int k = seg_of_block(kv, i);
    return kv->seg_start[k] + (i - kv->seg_blk0[k]) * kv->T;
}
static inline int span_cap(const ak_kv *kv, int i) {
    if (i >= n_base_blocks(kv)) return kv->T;
    int k = seg_of_block(kv, i), left = kv->seg_start[k + 1] - span_start(kv, i);
    return left < kv->T ? left : kv->T;
}

/* Blocks covering positions [0, n). */
static inline int spans_for(const ak_kv *kv, int n) {
    if (n <= 0) return 0;
    if (n > kv->base_len) return n_base_blocks(kv) + (n - kv->base_len + kv->T - 1) / kv->T;
    int k = seg_of_pos(kv, n - 1);
    return kv->seg_blk0[k] + (n - kv->seg_start[k] + kv->T - 1) / kv->T;
}

static void corr_free(struct kv_corr *c) {
    if (!c) return;
    free(c->w); free(c->set); free(c->mu); free(c->mu_rot);
    free(c);
}

/* A correction of n positions with zero residuals and no layer set (w
 * copied when not NULL), or NULL (out of memory). */
static struct kv_corr *corr_new(const ak_kv *kv, int start, int n, int layer0, const float *w) {
    const ak_cache_spec *s = &kv->spec;
    size_t per = (size_t)s->n_layer * s->n_head_kv * (s->head_dim_k + s->head_dim_v);
    struct kv_corr *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->start = start; c->n = n; c->layer0 = layer0;
    c->w = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    c->set = calloc((size_t)s->n_layer, 1);
    c->mu = calloc(per, sizeof(float));
    c->mu_rot = calloc(per, sizeof(float));
    if (!c->w || !c->set || !c->mu || !c->mu_rot) { corr_free(c); return NULL; }
    if (w) memcpy(c->w, w, sizeof(float) * (size_t)n);
    return c;
}

/* Copies src's corrections to dst (which has none), each cut to positions
 * below upto. Returns 0, or -1 (out of memory: dst then has none). */
static int corr_copy(ak_kv *dst, const ak_kv *src, int upto) {
    const ak_cache_spec *s = &src->spec;
    size_t per = (size_t)s->n_layer * s->n_head_kv * (s->head_dim_k + s->head_dim_v);
    for (int i = 0; i < src->n_corr; i++) {
        const struct kv_corr *c = src->corr[i];
        if (c->start >= upto) continue;
        int n = c->start + c->n > upto ? upto - c->start : c->n;
        struct kv_corr *d = corr_new(dst, c->start, n, c->layer0, c->w);
        if (!d) {
            for (int j = 0; j < dst->n_corr; j++) corr_free(dst->corr[j]);
            dst->n_corr = 0;
            return -1;
        }
        memcpy(d->set, c->set, (size_t)s->n_layer);
        memcpy(d->mu, c->mu, per * sizeof(float));
        memcpy(d->mu_rot, c->mu_rot, per * sizeof(float));
        dst->corr[dst->n_corr++] = d;
    }
    return 0;
}

ak_kv *ak_kv_new(ak_block_pool *pool, ak_kv_format fk, ak_kv_format fv, int n_ctx, ak_error *err) {
    const ak_cache_spec *s = ak_block_pool_spec(pool);
    if (n_ctx <= 0) { ak_fail(err, "context size %d must be positive", n_ctx); return NULL; }
    if (s->n_ctx > 0 && n_ctx > s->n_ctx) {
        ak_fail(err, "context size %d is longer than the model's %d", n_ctx, s->n_ctx);
        return NULL;
    }
    const ak_kv_format_info *ik = ak_kv_format_get(fk), *iv = ak_kv_format_get(fv);
    if (!ik || !iv) { ak_fail(err, "invalid KV cache format"); return NULL; }
    if (!ak_kv_format_supports(fk, s->head_dim_k)) {
        ak_fail(err, "KV format %s cannot store keys of head dim %d", ik->name, s->head_dim_k);
        return NULL;
    }
    if (!ak_kv_format_supports(fv, s->head_dim_v)) {
        ak_fail(err, "KV format %s cannot store values of head dim %d", iv->name, s->head_dim_v);
        return NULL;
    }
    ak_kv *kv = ak_calloc(1, sizeof *kv, err);
    if (!kv) return NULL;
    kv->pool = pool;
    kv->spec = *s;
    kv->fk = fk;
    kv->fv = fv;
    kv->T = ak_block_pool_block_tokens(pool);
    kv->capacity = n_ctx;
    kv->n_table = (n_ctx + kv->T - 1) / kv->T + AK_KV_MAX_SEGMENTS;
    kv->table = ak_calloc(kv->n_table, sizeof(ak_block *), err);
    if (!kv->table) { free(kv); return NULL; }
    kv->ng = ak_block_pool_groups(pool);
    kv->release = kv->ng > 1 && ak_block_pool_window_release(pool);
    if (kv->ng > 1 && !(kv->ltable = ak_calloc(kv->n_table, sizeof(ak_block *), err))) {
        free(kv->table);
        free(kv);
        return NULL;
    }
    return kv;
}

ak_kv *ak_kv_fork(const ak_kv *src, ak_error *err) {
    ak_kv *kv = ak_kv_new(src->pool, src->fk, src->fv, src->capacity, err);
    if (!kv) return NULL;
    for (int i = 0; i < src->n_table; i++) {
        if (src->table[i]) {
            ak_block_ref(src->pool, src->table[i]);
            kv->table[i] = src->table[i];
        }
        if (src->ltable && src->ltable[i]) {
            ak_block_ref(src->pool, src->ltable[i]);
            kv->ltable[i] = src->ltable[i];
        }
    }
    kv->lfirst = src->lfirst;
    kv->release = src->release;
    kv->length = src->length;
    int lens[AK_KV_MAX_SEGMENTS];
    seg_set(kv, lens, seg_lens(src, lens));
    if (corr_copy(kv, src, src->capacity) < 0) {
        ak_kv_free(kv);
        ak_failc(err, AK_ERR_NOMEM, "out of memory for a fork's corrections");
        return NULL;
    }
    return kv;
}

void ak_kv_free(ak_kv *kv) {
    if (!kv) return;
    for (int i = 0; i < kv->n_table; i++) {
        ak_block_unref(kv->pool, kv->table[i]);
        if (kv->ltable) ak_block_unref(kv->pool, kv->ltable[i]);
    }
    for (int i = 0; i < kv->n_corr; i++) corr_free(kv->corr[i]);
    free(kv->table);
    free(kv->ltable);
    free(kv);
}

int ak_kv_capacity(const ak_kv *kv) { return kv->capacity; }
int ak_kv_length(const ak_kv *kv) { return kv->length; }
ak_kv_format ak_kv_format_k(const ak_kv *kv) { return kv->fk; }
ak_kv_format ak_kv_format_v(const ak_kv *kv) { return kv->fv; }
ak_block_pool *ak_kv_pool(const ak_kv *kv) { return kv->pool; }

void ak_kv_truncate(ak_kv *kv, int n) {
    if (n < 0) n = 0;
    if (n >= kv->length) return;
    int keep = spans_for(kv, n);
    /* below the base's end the base shortens: the segment holding n - 1
     * ends there, those after it go; their blocks stay shared and the
     * positions from n on start a fresh block (never a copy) */
    if (n < kv->base_len) {
        int lens[AK_KV_MAX_SEGMENTS], ns = n > 0 ? seg_of_pos(kv, n - 1) + 1 : 0;
        seg_lens(kv, lens);
        if (ns) lens[ns - 1] = n - kv->seg_start[ns - 1];
        seg_set(kv, lens, ns);
    }
    kv->length = n;
    for (int i = keep; i < kv->n_table; i++) {
        ak_block_unref(kv->pool, kv->table[i]);
        kv->table[i] = NULL;
        if (kv->ltable) {
            ak_block_unref(kv->pool, kv->ltable[i]);
            kv->ltable[i] = NULL;
        }
    }
    if (kv->lfirst > n) kv->lfirst = n;   /* an emptied sequence holds every layer again */
    /* corrections end with the positions they correct */
    int kept = 0;
    for (int i = 0; i < kv->n_corr; i++) {
        struct kv_corr *c = kv->corr[i];
        if (c->start >= n) { corr_free(c); continue; }
        if (c->start + c->n > n) c->n = n - c->start;
        kv->corr[kept++] = c;
    }
    kv->n_corr = kept;
}

int ak_kv_n_blocks(const ak_kv *kv) {
    int n = 0;
    for (int i = 0; i < kv->n_table; i++) n += (kv->table[i] != NULL) + (kv->ltable && kv->ltable[i] != NULL);
    return n;
}

int ak_kv_groups(const ak_kv *kv) { return kv->ng; }

int ak_kv_group_blocks(const ak_kv *kv, int group) {
    ak_block *const *t = group == 0 ? kv->table : group == 1 ? kv->ltable : NULL;
    int n = 0;
    for (int i = 0; t && i < kv->n_table; i++) n += t[i] != NULL;
    return n;
}

int ak_kv_window_first(const ak_kv *kv) { return kv->ng > 1 ? kv->lfirst : 0; }

void ak_kv_set_window_release(ak_kv *kv, int on) { kv->release = kv->ng > 1 && on; }

int ak_kv_release_window_below(ak_kv *kv, int pos) {
    if (kv->ng < 2 || pos <= kv->lfirst) return 0;
    int released = 0;
    for (int i = 0; i < kv->n_table; i++) {
        int s0 = span_start(kv, i), end = s0 + span_cap(kv, i);
        if (end > pos) break;
        if (kv->ltable[i]) {
            ak_block_unref(kv->pool, kv->ltable[i]);
            kv->ltable[i] = NULL;
            released++;
        }
        if (end > kv->lfirst) kv->lfirst = end;
    }
    return released;
}

int ak_kv_release_window(ak_kv *kv) {
    if (kv->ng < 2 || !kv->release) return 0;
    return ak_kv_release_window_below(kv, kv->length - kv->spec.window);
}

int ak_kv_window_check(const ak_kv *kv, int pos, ak_error *err) {
    if (kv->ng < 2) return 0;
    int lo = pos - kv->spec.window + 1;
    if (lo < 0) lo = 0;
    if (lo < kv->lfirst)
        return ak_failc(err, AK_ERR_INVALID,
                        "position %d sees positions from %d on through its window, but the local layers released "
                        "those before %d",
                        pos, lo, kv->lfirst);
    return 0;
}

size_t ak_kv_bytes(const ak_kv *kv) {
    size_t n = 0;
    for (int i = 0; i < kv->n_table; i++) {
        if (kv->table[i]) n += kv->table[i]->bytes;
        if (kv->ltable && kv->ltable[i]) n += kv->ltable[i]->bytes;
    }
    return n;
}

int ak_kv_prepare(ak_kv *kv, int from, int to, ak_error *err) {
    if (from < 0 || to > kv->capacity || from > to)
        return ak_fail(err, "KV cache full: positions [%d, %d) do not fit the context size %d", from, to,
                       kv->capacity);
    if (from == to) return 0;
    int slot, b0 = block_of(kv, from, &slot), b1 = block_of(kv, to - 1, &slot), n = b1 - b0 + 1;
    /* first make every new block (of each group), then commit, so a failure
     * changes nothing */
    ak_block *fresh[128];
    ak_block **nb = 2 * n <= 128 ? fresh : ak_calloc(2 * (size_t)n, sizeof(ak_block *), err);
    if (!nb) return -1;
    int rc = 0;
    for (int i = 0; i < 2 * n; i++) nb[i] = NULL;   /* the unwinding below reads every entry */
    for (int g = 0; g < kv->ng && rc == 0; g++) {
        ak_block **t = g ? kv->ltable : kv->table;
        for (int i = b0; i <= b1; i++) {
            ak_block *b = t[i], **o = &nb[g * n + i - b0];
            /* the local group's released spans stay released */
            if (g && span_start(kv, i) + span_cap(kv, i) <= kv->lfirst) continue;
            if (!b) *o = ak_block_alloc_group(kv->pool, g, kv->fk, kv->fv, err);
            /* shared, or indexed (its bits are named by its hash: never changed in place) */
            else if (ak_block_refcount(kv->pool, b) > 1 || b->hash) *o = ak_block_clone(kv->pool, b, err);
            else continue;
            if (!*o) { rc = -1; break; }
        }
    }
    for (int g = 0; g < kv->ng; g++) {
        ak_block **t = g ? kv->ltable : kv->table;
        for (int i = b0; i <= b1; i++) {
            ak_block *o = nb[g * n + i - b0];
            if (!o) continue;
            if (rc == 0) {
                ak_block_unref(kv->pool, t[i]);
                t[i] = o;
            } else {
                ak_block_unref(kv->pool, o);
            }
        }
    }
    if (nb != fresh) free(nb);
    return rc;
}

/* Where component comp (0 codes, 1 metadata) of the vector of KV head h at
 * slot `slot` sits within a K or V region of a block: the region is
 * [metadata: H x T x mb][codes: H x T x cb], head-major inside each
 * (blockpool.h). */
static size_t comp_offset(const ak_kv *kv, ak_kv_format f, int d, int comp, int h, int slot) {
    size_t cb = ak_kv_format_code_bytes(f, d), mb = ak_kv_format_meta_bytes(f, d), T = (size_t)kv->T;
    return comp == 0 ? (size_t)kv->spec.n_head_kv * T * mb + ((size_t)h * T + (size_t)slot) * cb
                     : ((size_t)h * T + (size_t)slot) * mb;
}

/* Stores a whole vector (codes then metadata, as quantize writes it) into a
 * region at head h, slot `slot`, and reads one back. */
static void put_vec(const ak_kv *kv, uint8_t *region, ak_kv_format f, int d, int h, int slot, const uint8_t *vec) {
    size_t cb = ak_kv_format_code_bytes(f, d), mb = ak_kv_format_meta_bytes(f, d);
    memcpy(region + comp_offset(kv, f, d, 0, h, slot), vec, cb);
    if (mb) memcpy(region + comp_offset(kv, f, d, 1, h, slot), vec + cb, mb);
}
static void get_vec(const ak_kv *kv, const uint8_t *region, ak_kv_format f, int d, int h, int slot, uint8_t *vec) {
    size_t cb = ak_kv_format_code_bytes(f, d), mb = ak_kv_format_meta_bytes(f, d);
    memcpy(vec, region + comp_offset(kv, f, d, 0, h, slot), cb);
    if (mb) memcpy(vec + cb, region + comp_offset(kv, f, d, 1, h, slot), mb);
}

/* x minus the mean mu (if any) into buf; returns what to quantize. */
static const float *center(const float *x, int d, const float *mu, float *buf) {
    if (!mu) return x;
    for (int i = 0; i < d; i++) buf[i] = x[i] - mu[i];
    return buf;
}

/* The inverse of center, in place. */
static void uncenter(float *x, int d, const float *mu) {
    if (mu)
        for (int i = 0; i < d; i++) x[i] += mu[i];
}

/* Where one head's vectors lie in a block: the run of their metadata and
 * the run of their codes. */
typedef struct {
    const uint8_t *meta, *codes;
} vec_runs;

/* Where class c of side `side` of mixed block b keeps head `head`'s
 * metadata and codes (cb and mb bytes a vector) at layer `layer`
 * (blockpool.h: MIXED BLOCKS). */
static vec_runs mixed_runs(const ak_kv *kv, const ak_block *b, int layer, int side, int c, int head, size_t cb,
                           size_t mb) {
    const ak_block_mix *m = b->mix;
    size_t nc = (size_t)m->n[side][c], H = (size_t)kv->spec.n_head_kv;
    const uint8_t *region = b->data + (size_t)layer * (m->region[0] + m->region[1]) + (side ? m->region[0] : 0) +
                            m->off[side][c];
    return (vec_runs){.meta = region + (size_t)head * nc * mb, .codes = region + H * nc * mb + (size_t)head * nc * cb};
}

/* Slot `slot`'s vector of one side and head in mixed block b: its format,
 * metadata and codes. */
static ak_kv_format mixed_vec(const ak_kv *kv, const ak_block *b, int layer, int side, int head, int slot,
                              uint8_t **meta, uint8_t **codes) {
    const ak_block_mix *m = b->mix;
    int c = m->cls[side][slot], d = side ? kv->spec.head_dim_v : kv->spec.head_dim_k;
    ak_kv_format f = m->fmt[side][c];
    size_t cb = ak_kv_format_code_bytes(f, d), mb = ak_kv_format_meta_bytes(f, d);
    vec_runs run = mixed_runs(kv, b, layer, side, c, head, cb, mb);
    *meta = (uint8_t *)run.meta + (size_t)m->rank[side][slot] * mb;
    *codes = (uint8_t *)run.codes + (size_t)m->rank[side][slot] * cb;
    return f;
}

/* ak_kv_write / ak_kv_read of one position held by a mixed block (never
 * centered: blockpool.h). */
static void mixed_put(const ak_kv *kv, ak_block *b, int layer, int slot, const float *k, const float *v) {
    uint8_t tmp[4 * 1024 + 64], *meta, *codes;
    for (int side = 0; side < 2; side++) {
        const float *x = side ? v : k;
        int d = side ? kv->spec.head_dim_v : kv->spec.head_dim_k;
        if (!x) continue;
        for (int h = 0; h < kv->spec.n_head_kv; h++) {
            ak_kv_format f = mixed_vec(kv, b, layer, side, h, slot, &meta, &codes);
            size_t cb = ak_kv_format_code_bytes(f, d), mb = ak_kv_format_meta_bytes(f, d);
            ak_kv_format_get(f)->quantize(x + (size_t)h * d, d, tmp);
            memcpy(codes, tmp, cb);
            if (mb) memcpy(meta, tmp + cb, mb);
        }
    }
}
static void mixed_get(const ak_kv *kv, const ak_block *b, int layer, int slot, float *k, float *v) {
    uint8_t tmp[4 * 1024 + 64], *meta, *codes;
    for (int side = 0; side < 2; side++) {
        float *x = side ? v : k;
        int d = side ? kv->spec.head_dim_v : kv->spec.head_dim_k;
        for (int h = 0; h < kv->spec.n_head_kv; h++) {
            ak_kv_format f = mixed_vec(kv, b, layer, side, h, slot, &meta, &codes);
            size_t cb = ak_kv_format_code_bytes(f, d), mb = ak_kv_format_meta_bytes(f, d);
            memcpy(tmp, codes, cb);
            if (mb) memcpy(tmp + cb, meta, mb);
            ak_kv_format_get(f)->dequantize(tmp, d, x + (size_t)h * d);
        }
    }
}

int ak_kv_write(ak_kv *kv, int layer, int pos, const float *k, const float *v, ak_error *err) {
    if (pos < 0 || pos >= kv->capacity || layer < 0 || layer >= kv->spec.n_layer)
        return ak_fail(err, "KV write at layer %d position %d is out of range", layer, pos);
    int slot;
    ak_block *b = tab_of(kv, layer)[block_of(kv, pos, &slot)];
    if (!b || b->refcount != 1 || b->hash) return ak_fail(err, "KV write at position %d: block not prepared", pos);
    if ((!k || !v) && pos >= kv->length)
        return ak_fail(err, "KV write of one side at position %d: the other side was never written", pos);
    if (b->mix) {
        if (slot >= b->mix->count) return ak_fail(err, "KV write at position %d: past its mixed block's slots", pos);
        mixed_put(kv, b, layer, slot, k, v);
        if (pos + 1 > kv->length) kv->length = pos + 1;
        return 0;
    }
    int dk = kv->spec.head_dim_k, dv = kv->spec.head_dim_v;
    /* the block's formats, which need not be the sequence's (see sink) */
    const ak_kv_format_info *ik = ak_kv_format_get(b->fk), *iv = ak_kv_format_get(b->fv);
    uint8_t *kb = b->data + ak_block_k_offset(kv->pool, b->fk, b->fv, layer);
    uint8_t *vb = b->data + ak_block_v_offset(kv->pool, b->fk, b->fv, layer);
    uint8_t tmp[4 * 1024 + 64];   /* one vector (f32 at d = 1024 at most) */
    float xc[1024];
    for (int h = 0; h < kv->spec.n_head_kv; h++) {
        /* centered where the pool says so (blockpool.h) */
        if (k) {
            ik->quantize(center(k + (size_t)h * dk, dk, ak_block_pool_center(kv->pool, 0, b->fk, layer, h), xc), dk, tmp);
            put_vec(kv, kb, b->fk, dk, h, slot, tmp);
        }
        if (v) {
            iv->quantize(center(v + (size_t)h * dv, dv, ak_block_pool_center(kv->pool, 1, b->fv, layer, h), xc), dv, tmp);
            put_vec(kv, vb, b->fv, dv, h, slot, tmp);
        }
    }
    if (pos + 1 > kv->length) kv->length = pos + 1;
    return 0;
}

int ak_kv_read(const ak_kv *kv, int layer, int pos, float *k, float *v, ak_error *err) {
    if (pos < 0 || pos >= kv->length || layer < 0 || layer >= kv->spec.n_layer)
        return ak_fail(err, "KV read at layer %d position %d is out of range (length %d)", layer, pos, kv->length);
    int slot;
    const ak_block *b = tab_of(kv, layer)[block_of(kv, pos, &slot)];
    if (!b)   /* a local layer's position that slid out of its window */
        return ak_failc(err, AK_ERR_INVALID, "KV read at layer %d position %d: released (the local layers hold from %d)",
                        layer, pos, kv->lfirst);
    if (b->mix) {
        mixed_get(kv, b, layer, slot, k, v);
        return 0;
    }
    int dk = kv->spec.head_dim_k, dv = kv->spec.head_dim_v;
    const ak_kv_format_info *ik = ak_kv_format_get(b->fk), *iv = ak_kv_format_get(b->fv);
    const uint8_t *kb = b->data + ak_block_k_offset(kv->pool, b->fk, b->fv, layer);
    const uint8_t *vb = b->data + ak_block_v_offset(kv->pool, b->fk, b->fv, layer);
    uint8_t tmp[4 * 1024 + 64];
    for (int h = 0; h < kv->spec.n_head_kv; h++) {
        get_vec(kv, kb, b->fk, dk, h, slot, tmp);
        ik->dequantize(tmp, dk, k + (size_t)h * dk);
        uncenter(k + (size_t)h * dk, dk, ak_block_pool_center(kv->pool, 0, b->fk, layer, h));
        get_vec(kv, vb, b->fv, dv, h, slot, tmp);
        iv->dequantize(tmp, dv, v + (size_t)h * dv);
        uncenter(v + (size_t)h * dv, dv, ak_block_pool_center(kv->pool, 1, b->fv, layer, h));
    }
    return 0;
}

static uint8_t *component_at(const ak_kv *kv, int layer, int is_v, int comp, int head, int pos) {
    if (pos < 0 || pos >= kv->capacity || layer < 0 || layer >= kv->spec.n_layer || head < 0 ||
        head >= kv->spec.n_head_kv || comp < 0 || comp > 1)
        return NULL;
    int slot;
    ak_block *b = tab_of(kv, layer)[block_of(kv, pos, &slot)];
    if (!b || b->mix) return NULL;   /* mixed blocks persist as cards, not as agent files */
    int d = is_v ? kv->spec.head_dim_v : kv->spec.head_dim_k;
    ak_kv_format f = is_v ? b->fv : b->fk;
    if (comp == 1 && !ak_kv_format_meta_bytes(f, d)) return NULL;
    size_t off = is_v ? ak_block_v_offset(kv->pool, b->fk, b->fv, layer) : ak_block_k_offset(kv->pool, b->fk, b->fv, layer);
    return b->data + off + comp_offset(kv, f, d, comp, head, slot);
}

const uint8_t *ak_kv_stored(const ak_kv *kv, int layer, int is_v, int comp, int head, int pos) {
    return pos < kv->length ? component_at(kv, layer, is_v, comp, head, pos) : NULL;
}

uint8_t *ak_kv_stored_mut(ak_kv *kv, int layer, int is_v, int comp, int head, int pos) {
    if (pos < 0 || pos >= kv->capacity || layer < 0 || layer >= kv->spec.n_layer) return NULL;
    int slot;
    ak_block *b = tab_of(kv, layer)[block_of(kv, pos, &slot)];
    if (!b || b->refcount != 1 || b->hash) return NULL;
    return component_at(kv, layer, is_v, comp, head, pos);
}

int ak_kv_swap(ak_kv *a, ak_kv *b) {
    if (a->pool != b->pool || a->fk != b->fk || a->fv != b->fv || a->capacity != b->capacity) return -1;
    ak_block **t = a->table, **lt = a->ltable;
    int n = a->length, lf = a->lfirst, la[AK_KV_MAX_SEGMENTS], lb[AK_KV_MAX_SEGMENTS];
    int na = seg_lens(a, la), nb = seg_lens(b, lb);
    a->ltable = b->ltable;
    a->lfirst = b->lfirst;
    b->ltable = lt;
    b->lfirst = lf;
    a->table = b->table;
    a->length = b->length;
    seg_set(a, lb, nb);
    b->table = t;
    b->length = n;
    seg_set(b, la, na);
    struct kv_corr *tc[AK_KV_MAX_CORRECTIONS];
    int tn = a->n_corr;
    memcpy(tc, a->corr, sizeof tc);
    memcpy(a->corr, b->corr, sizeof tc);
    a->n_corr = b->n_corr;
    memcpy(b->corr, tc, sizeof tc);
    b->n_corr = tn;
    return 0;
}

int ak_kv_set_length(ak_kv *kv, int n, ak_error *err) {
    if (n < 0 || n > kv->capacity) return ak_fail(err, "length %d outside the capacity %d", n, kv->capacity);
    if (n < kv->base_len) return ak_fail(err, "length %d inside the shared base of %d positions", n, kv->base_len);
    for (int i = 0; i < spans_for(kv, n); i++)
        if (!kv->table[i] || (kv->ltable && !kv->ltable[i] && span_start(kv, i) + span_cap(kv, i) > kv->lfirst))
            return ak_fail(err, "positions of block %d were never prepared", i);
    kv->length = n;
    return 0;
}


/* Where one head's T vectors are inside a block's K or V region (component-
 * major, blockpool.h): all heads' metadata, then all heads' codes. */
static inline void head_runs(const ak_kv *kv, const uint8_t *region, int head, size_t cb, size_t mb,
                             const uint8_t **meta, const uint8_t **codes) {
    size_t H = (size_t)kv->spec.n_head_kv, T = (size_t)kv->T;
    *meta = region + (size_t)head * T * mb;
    *codes = region + H * T * mb + (size_t)head * T * cb;
}

/* ---- what both attention paths share ------------------------------------
 * Query rows: row r is query head r % n_q of token r / n_q, at
 * q + (r / n_q) * qstride + (r % n_q) * dk; its output likewise in out. Each
 * row carries an online softmax over the blocks: running maximum m, sum l,
 * the part lc of l that went to centered values, q . mu for centered keys,
 * and for rotated formats the query in the rotated basis and a value
 * accumulator in that basis (un-rotated once at the end). */
typedef struct {
    const float *q, *vmu, *qmu_of;   /* vmu: mean of centered values; qmu_of: the key mean qmu is for */
    float *out;
    size_t qstride, ostride;
    int n_q, R, dk, dv, have_qrot, have_vrot;
    int layer, head, pos0, window;   /* the run's (ak_kv_attend_run_window) */
    float scale;
    float *m, *l, *lc, *qmu, *q_rot, *acc_rot;
} attn_rows;

/* Attention's f32 scratch for the block at hand: its keys transposed (dk
 * rows of Tp), its values (Tp rows of dv), four rows' scores (4 x Tp). */
typedef struct {
    float *kt, *vf, *sc4;
    int Tp;
} block_buf;

/* One head of one block as attention reads it: the formats' products, the
 * runs of codes and metadata with their strides, the centering means. */
typedef struct {
    ak_kv_format fk, fv;   /* the pair the sizes are for (AK_KV_NFORMATS: none yet) */
    const ak_kv_format_info *ik, *iv;
    size_t kcb, kmb, vcb, vmb, koff, voff;
    const uint8_t *km, *kc, *vm, *vc;
    const float *mu, *mv;
} head_view;

static const float *row_q(const attn_rows *a, int r) {
    return a->q + (size_t)(r / a->n_q) * a->qstride + (size_t)(r % a->n_q) * a->dk;
}
static float *row_out(const attn_rows *a, int r) {
    return a->out + (size_t)(r / a->n_q) * a->ostride + (size_t)(r % a->n_q) * a->dv;
}

/* Sets the rows of qr's queries for nt tokens from position pos0 up (window
 * as ak_kv_attend_run_window's), carves their state from qr's scratch
 * (R * (4 + dk + dv) floats) and zeroes the outputs. Returns the scratch
 * past what it took. */
static float *rows_init(attn_rows *a, const ak_kv *kv, const ak_kv_query *qr, int nt, int pos0, int window) {
    memset(a, 0, sizeof *a);
    a->q = qr->q; a->qstride = qr->qstride; a->out = qr->out; a->ostride = qr->ostride; a->n_q = qr->n_q;
    a->R = qr->n_q * nt;
    a->dk = kv->spec.head_dim_k; a->dv = kv->spec.head_dim_v;
    a->layer = qr->layer; a->head = qr->kv_head; a->pos0 = pos0; a->window = window; a->scale = qr->scale;
    a->m = qr->scratch; a->l = a->m + a->R; a->lc = a->l + a->R; a->qmu = a->lc + a->R; a->q_rot = a->qmu + a->R;
    a->acc_rot = a->q_rot + (size_t)a->R * a->dk;
    for (int r = 0; r < a->R; r++) {
        a->m[r] = -INFINITY; a->l[r] = 0; a->lc[r] = 0;
        memset(row_out(a, r), 0, sizeof(float) * a->dv);
    }
    return a->acc_rot + (size_t)a->R * a->dv;
}

/* Points h at head `head` of block b (sizes recomputed only when the
 * block's format pair changes) and readies the rows for it: rotated queries,
 * q . mu for centered keys, the rotated value accumulators. */
static void block_enter(attn_rows *a, head_view *h, const ak_kv *kv, const ak_block *b, int layer, int head) {
    if (b->fk != h->fk || b->fv != h->fv) {
        h->fk = b->fk;
        h->fv = b->fv;
        h->ik = ak_kv_format_get(h->fk);
        h->iv = ak_kv_format_get(h->fv);
        h->kcb = ak_kv_format_code_bytes(h->fk, a->dk);
        h->kmb = ak_kv_format_meta_bytes(h->fk, a->dk);
        h->vcb = ak_kv_format_code_bytes(h->fv, a->dv);
        h->vmb = ak_kv_format_meta_bytes(h->fv, a->dv);
        h->koff = ak_block_k_offset(kv->pool, h->fk, h->fv, layer);
        h->voff = ak_block_v_offset(kv->pool, h->fk, h->fv, layer);
    }
    /* codes and metadata of this head's T vectors: two runs (blockpool.h) */
    head_runs(kv, b->data + h->koff, head, h->kcb, h->kmb, &h->km, &h->kc);
    head_runs(kv, b->data + h->voff, head, h->vcb, h->vmb, &h->vm, &h->vc);
    /* centering of this block's keys and values (blockpool.h) */
    h->mu = ak_block_pool_center(kv->pool, 0, b->fk, layer, head);
    h->mv = ak_block_pool_center(kv->pool, 1, b->fv, layer, head);
    if (h->mv) a->vmu = h->mv;   /* one mean per (pool, layer, head) */
    if (h->ik->rotated && !a->have_qrot) { /* rotate the queries once, not every key */
        for (int r = 0; r < a->R; r++) {
            memcpy(a->q_rot + (size_t)r * a->dk, row_q(a, r), sizeof(float) * a->dk);
            ak_kv_rotate(a->q_rot + (size_t)r * a->dk, a->dk);
        }
        a->have_qrot = 1;
    }
    if (h->mu && h->mu != a->qmu_of) { /* centered keys: their scores get q . mu back */
        for (int r = 0; r < a->R; r++) {
            const float *qi = row_q(a, r);
            float s = 0;
            for (int d = 0; d < a->dk; d++) s += qi[d] * h->mu[d];
            a->qmu[r] = s;
        }
        a->qmu_of = h->mu;
    }
    if (h->iv->rotated && !a->have_vrot) {
        memset(a->acc_rot, 0, sizeof(float) * a->R * a->dv);
        a->have_vrot = 1;
    }
}

/* The bytes of head `head` of a block to come (keys and values, codes and
 * metadata), asked into L2 a few lines at a time while the current block is
 * computed. Why: in decode the weights streamed through since the last step
 * have pushed a long context's cache out to memory, and its blocks are not
 * adjacent, so the hardware prefetchers cannot guess them. Why in steps:
 * every prefetch takes a fill buffer until its line arrives, and a block's
 * 60-70 lines asked at once stalled the core on the 16 or so buffers there
 * are (docs/speed.md). The sizes are the current
 * block's (h): a block of another format pair is merely prefetched wrong. */
typedef struct {
    const uint8_t *p[4];
    size_t n[4];
    int run;        /* run being prefetched (4: done) */
    size_t at;      /* next byte of it */
} kv_prefetch;

static void prefetch_start(kv_prefetch *pf, const ak_kv *kv, const head_view *h, const ak_block *b, int head) {
    size_t T = (size_t)kv->T;
    head_runs(kv, b->data + h->koff, head, h->kcb, h->kmb, &pf->p[0], &pf->p[1]);
    head_runs(kv, b->data + h->voff, head, h->vcb, h->vmb, &pf->p[2], &pf->p[3]);
    pf->n[0] = T * h->kmb; pf->n[1] = T * h->kcb; pf->n[2] = T * h->vmb; pf->n[3] = T * h->vcb;
    pf->run = 0;
    pf->at = 0;
}

/* Asks for up to `lines` more cache lines (all that are left if lines < 0). */
static void prefetch_step(kv_prefetch *pf, int lines) {
    while (pf->run < 4 && lines != 0) {
        if (pf->at >= pf->n[pf->run]) { pf->run++; pf->at = 0; continue; }
        __builtin_prefetch(pf->p[pf->run] + pf->at, 0, 2);
        pf->at += 64;
        lines--;
    }
}

/* The query of row r in the basis of the block's keys. */
static const float *row_query(const attn_rows *a, const head_view *h, int r) {
    return h->ik->rotated ? a->q_rot + (size_t)r * a->dk : row_q(a, r);
}

/* Row r's online-softmax step over the raw scores sc[lo..c) of one block
 * (0 <= lo < c; keys before lo are outside the row's sliding window):
 * rescales what the row accumulated if the maximum grew, turns sc into
 * weights (zero from c up to c rounded to 16; sc must have room) and adds
 * them to the sums. Returns where the block's weighted values go: the
 * row's output, or its rotated accumulator. A vector of scores at a time
 * (vmath.h, the target's width): the maximum and the sum are vectors until
 * the end (a scalar chain of dependent max or add per key costs more than
 * the rest of the step). */
static float *row_softmax(attn_rows *a, const head_view *h, int r, float *sc, int lo, int c, float scale) {
    const float add = h->mu ? a->qmu[r] : 0.0f;
    /* keys before lo (out of the window) or past c: -inf */
    float bm = ak_softmax_scale_max(sc, lo, c, add, scale);
    float *acc = row_out(a, r), *accr = a->acc_rot + (size_t)r * a->dv;
    if (bm > a->m[r]) { /* rescale what was accumulated under the old maximum */
        float f = expf(a->m[r] - bm);
        a->l[r] *= f;
        a->lc[r] *= f;
        ak_scale_row(acc, a->dv, f);
        if (a->have_vrot) ak_scale_row(accr, a->dv, f);
        a->m[r] = bm;
    }
    float ls = ak_softmax_exp_sum(sc, lo, c, a->m[r]);
    a->l[r] += ls;
    if (h->mv) a->lc[r] += ls;   /* weight that went to centered values */
    return h->iv->rotated ? accr : acc;
}

/* Every row's output: rotated part back, value means back, divided by the sum. */
static void rows_finish(attn_rows *a) {
    for (int r = 0; r < a->R; r++) {
        float *acc = row_out(a, r), inv = a->l[r] > 0 ? 1.0f / a->l[r] : 0;
        if (a->have_vrot) {
            float *accr = a->acc_rot + (size_t)r * a->dv;
            ak_kv_unrotate(accr, a->dv);
            for (int d = 0; d < a->dv; d++) acc[d] += accr[d];
        }
        if (a->vmu)   /* centered values get their mean back, times their weight */
            for (int d = 0; d < a->dv; d++) acc[d] += a->lc[r] * a->vmu[d];
        for (int d = 0; d < a->dv; d++) acc[d] *= inv;
    }
}

/* ---- attention -----------------------------------------------------------
 * Decode and prefill are one computation: the rows (query heads of a KV
 * head, times the tokens of a run) read each block of that head decoded
 * once into f32 scratch (keys transposed by the format's dequant_t, so the
 * scores of a query against 16 keys are one vector FMA per dimension with
 * no horizontal sums; values as rows), then every row that can see the
 * block takes its scores, its online-softmax update and its weighted values
 * from there. A row's arithmetic depends only on its own query and on the
 * keys it sees, not on which other rows share the pass, so a token's
 * attention is the same to the last bit whether it was decoded alone,
 * batched, or prefilled inside a run: a cache restored from disk and one
 * rebuilt by re-prefilling hold the same bits (a test relies on it). */

#define PF_AHEAD 2    /* blocks ahead that attention prefetches */
#define PF_LINES 12   /* lines it asks for at each step */
#define PF_CHUNK 16   /* keys or value dims per inner vector loop */

size_t ak_kv_attend_run_scratch(const ak_kv *kv, int n_rows) {
    size_t dk = (size_t)kv->spec.head_dim_k, dv = (size_t)kv->spec.head_dim_v;
    size_t Tp = ((size_t)kv->T + PF_CHUNK - 1) / PF_CHUNK * PF_CHUNK;
    /* m, l, lc, qmu per row; rotated queries; rotated accumulators; keys
     * (dk x Tp), values (Tp x dv), four rows' scores (4 x Tp); for mixed
     * blocks one class decoded (max(dk, dv) x Tp) and rotated values (Tp x dv) */
    return (size_t)n_rows * (4 + dk + dv) + dk * Tp + Tp * dv + 4 * Tp + (dk > dv ? dk : dv) * Tp + Tp * dv;
}

size_t ak_kv_attend_scratch(const ak_kv *kv, int n_q) { return ak_kv_attend_run_scratch(kv, n_q); }

void ak_kv_attend(const ak_kv *kv, const ak_kv_query *qr, int n) {
    if (n <= 0) {   /* nothing to see: zeros, as the softmax over no keys leaves them */
        memset(qr->out, 0, sizeof(float) * (size_t)qr->n_q * (size_t)kv->spec.head_dim_v);
        return;
    }
    ak_kv_query one = *qr;   /* one token: its strides are never used */
    one.qstride = one.ostride = 0;
    ak_kv_attend_run(kv, &one, 1, n - 1);
}

/* The rows that see a block whose keys (bb->kt, transposed, stored basis)
 * and values (vf rows, or NULL when none is in the plain basis; vfr: rows
 * of values in the rotated basis, or NULL) are decoded: their scores four
 * rows at a time (into bb->sc4), online softmax, weighted values. The
 * block holds positions [s0, s0 + cnt). */
static void rows_over_block(attn_rows *a, const head_view *h, const block_buf *bb, const float *vf, const float *vfr,
                            int s0, int cnt, kv_prefetch *pf) {
    const int n_q = a->n_q, dk = a->dk, dv = a->dv, pos0 = a->pos0, window = a->window, Tp = bb->Tp;
    const float scale = a->scale, *kt = bb->kt;
    float *sc4 = bb->sc4;
    int r_first = (s0 - pos0) * n_q;   /* row of the first token that sees position s0 */
    if (r_first < 0) r_first = 0;
    for (int r0 = r_first; r0 < a->R; r0 += 4) {
        int nr = a->R - r0 < 4 ? a->R - r0 : 4;
        const float *qs[4];
        for (int i = 0; i < nr; i++) qs[i] = row_query(a, h, r0 + i);
        ak_attn_scores(qs, nr, kt, dk, Tp, sc4);
        for (int i = 0; i < nr; i++) {
            prefetch_step(pf, PF_LINES);
            int r = r0 + i, c = pos0 + r / n_q + 1 - s0;   /* keys of this block row r sees */
            if (c <= 0) continue;
            if (c > cnt) c = cnt;
            /* and the first of them its window still holds */
            int lo = window > 0 ? pos0 + r / n_q - window + 1 - s0 : 0;
            if (lo >= c) continue;
            if (lo < 0) lo = 0;
            float *sc = sc4 + (size_t)i * Tp;
            float *acc = row_softmax(a, h, r, sc, lo, c, scale);
            /* values from lo on only: those before it may be anything
             * (a zero weight times NaN is NaN) */
            if (vf) ak_attn_values(sc + lo, c - lo, vf + (size_t)lo * dv, dv, acc);
            if (vfr) ak_attn_values(sc + lo, c - lo, vfr + (size_t)lo * dv, dv, a->acc_rot + (size_t)r * dv);
        }
    }
}

/* Attention over a mixed block: each class of keys decoded into its slots'
 * columns of kt, each class of values into its slots' rows of vf (rotated
 * formats into rows of a second buffer, whose weighted sum goes to the
 * rotated accumulator and is un-rotated once at the end), then the rows as
 * for any block. Mixed blocks are never centered and their keys never
 * rotated (blockpool.h), so the plain queries score every class. */
/* The class of side `side` of mixed block m that holds every slot, or -1
 * (several classes): a card of one width per side, decoded in place. */
static int only_class(const ak_block_mix *m, int side) {
    int only = -1;
    for (int c = 0; c < m->ncls[side]; c++) {
        if (!m->n[side][c]) continue;
        if (only >= 0) return -1;
        only = c;
    }
    return only >= 0 && m->n[side][only] == m->count ? only : -1;
}

static void attend_mixed(attn_rows *a, const ak_kv *kv, const ak_block *b, const block_buf *bb, int s0, int cnt) {
    const ak_block_mix *m = b->mix;
    const int dk = a->dk, dv = a->dv, layer = a->layer, Tp = bb->Tp;
    float *kt = bb->kt, *vf = bb->vf, *sc4 = bb->sc4;
    float *tmp = sc4 + 4 * (size_t)Tp, *vfr = tmp + (size_t)(dk > dv ? dk : dv) * Tp;
    int only[2] = {only_class(m, 0), only_class(m, 1)};
    /* slots [0, cnt) each get their key from exactly one class; the
     * columns past cnt are scored but never read: zeroed, not left stale */
    for (int d = 0; d < dk; d++)
        if (only[0] < 0) memset(kt + (size_t)d * Tp, 0, sizeof(float) * (size_t)Tp);
        else if (cnt < Tp) memset(kt + (size_t)d * Tp + cnt, 0, sizeof(float) * (size_t)(Tp - cnt));
    if (only[1] < 0) memset(vf, 0, sizeof(float) * (size_t)cnt * dv);
    int rotated = 0;
    for (int side = 0; side < 2; side++)
        for (int c = 0; c < m->ncls[side]; c++) {
            int n = m->n[side][c], d = side ? dv : dk;
            if (!n) continue;
            const ak_kv_format_info *fi = ak_kv_format_get(m->fmt[side][c]);
            size_t cb = ak_kv_format_code_bytes(m->fmt[side][c], d), mb = ak_kv_format_meta_bytes(m->fmt[side][c], d);
            vec_runs run = mixed_runs(kv, b, layer, side, c, a->head, cb, mb);
            const uint8_t *meta = run.meta, *codes = run.codes;
            const uint16_t *slots = m->slots[side][c];
            if (side == 0) {   /* transposed, then each column to its slot */
                if (only[0] >= 0) {   /* the slots in order: straight into place */
                    fi->dequant_t(codes, cb, meta, mb, cnt, d, kt, (size_t)Tp);
                    continue;
                }
                fi->dequant_t(codes, cb, meta, mb, n, d, tmp, (size_t)Tp);
                for (int j = 0; j < n; j++)
                    if (slots[j] < cnt)
                        for (int i = 0; i < d; i++) kt[(size_t)i * Tp + slots[j]] = tmp[(size_t)i * Tp + j];
                continue;
            }
            if (fi->rotated && !rotated) {
                rotated = 1;
                if (only[1] < 0) memset(vfr, 0, sizeof(float) * (size_t)cnt * dv);
                if (!a->have_vrot) {
                    memset(a->acc_rot, 0, sizeof(float) * (size_t)a->R * dv);
                    a->have_vrot = 1;
                }
            }
            float *dst = fi->rotated ? vfr : vf;
            if (only[1] >= 0) {
                fi->dequant(codes, cb, meta, mb, cnt, d, dst, (size_t)dv);
                continue;
            }
            fi->dequant(codes, cb, meta, mb, n, d, tmp, (size_t)dv);
            for (int j = 0; j < n; j++)
                if (slots[j] < cnt) memcpy(dst + (size_t)slots[j] * dv, tmp + (size_t)j * dv, sizeof(float) * (size_t)dv);
        }
    /* as a block of a plain, uncentered format for the rows; a card whose
     * values are all rotated has no plain part */
    head_view hv = { .fk = AK_KV_F32, .fv = AK_KV_F32 };
    hv.ik = hv.iv = ak_kv_format_get(AK_KV_F32);
    kv_prefetch none = { .run = 4 };
    rows_over_block(a, &hv, bb, only[1] >= 0 && rotated ? NULL : vf, rotated ? vfr : NULL, s0, cnt, &none);
}

/* CORRECTIONS at attention time: a block's decoded keys (bb->kt,
 * transposed, Tp columns) and values (bb->vf rows) of the positions [s0,
 * s0 + cnt) it holds get w_j * mu_K and w_j * mu_V added for every
 * corrected position j at the rows' layer and head, in the basis the block
 * decodes to. The scores become q . k_j + w_j (q . mu_K) and the output
 * gains (sum_j p_j w_j) mu_V: the correction of kvcache.h, with no per-row
 * state (a block may hold the end of one range and the start of the next),
 * and the stored blocks untouched. */
static void correct_block(const ak_kv *kv, const head_view *h, const attn_rows *a, const block_buf *bb, int s0,
                          int cnt) {
    const int dk = kv->spec.head_dim_k, dv = kv->spec.head_dim_v, H = kv->spec.n_head_kv;
    const int layer = a->layer, head = a->head, Tp = bb->Tp;
    float *kt = bb->kt, *vf = bb->vf;
    for (int i = 0; i < kv->n_corr; i++) {
        const struct kv_corr *c = kv->corr[i];
        if (layer < c->layer0 || !c->set[layer]) continue;
        int lo = c->start > s0 ? c->start : s0, hi = c->start + c->n < s0 + cnt ? c->start + c->n : s0 + cnt;
        if (lo >= hi) continue;
        size_t base = (size_t)layer * H * (dk + dv);
        const float *mk = (h->ik->rotated ? c->mu_rot : c->mu) + base + (size_t)head * dk;
        const float *mv = (h->iv->rotated ? c->mu_rot : c->mu) + base + (size_t)H * dk + (size_t)head * dv;
        for (int p = lo; p < hi; p++) {
            float w = c->w[p - c->start];
            if (w == 0.0f) continue;
            int j = p - s0;
            for (int d = 0; d < dk; d++) kt[(size_t)d * Tp + j] += w * mk[d];
            float *vr = vf + (size_t)j * dv;
            for (int d = 0; d < dv; d++) vr[d] += w * mv[d];
        }
    }
}

void ak_kv_attend_run(const ak_kv *kv, const ak_kv_query *qr, int nt, int pos0) {
    ak_kv_attend_run_window(kv, qr, nt, pos0, 0);
}

void ak_kv_attend_run_window(const ak_kv *kv, const ak_kv_query *qr, int nt, int pos0, int window) {
    const int dk = kv->spec.head_dim_k, dv = kv->spec.head_dim_v, T = kv->T, layer = qr->layer, kv_head = qr->kv_head;
    const int Tp = (T + PF_CHUNK - 1) / PF_CHUNK * PF_CHUNK;
    attn_rows a;
    float *kt = rows_init(&a, kv, qr, nt, pos0, window);
    float *vf = kt + (size_t)dk * Tp, *sc4 = vf + (size_t)Tp * dv;   /* past sc4: attend_mixed's */
    const block_buf bb = {.kt = kt, .vf = vf, .sc4 = sc4, .Tp = Tp};
    head_view h = { .fk = AK_KV_NFORMATS, .fv = AK_KV_NFORMATS };
    const int n_end = pos0 + nt;   /* positions the last token sees */
    /* the first position the first token sees: blocks before it are not read */
    const int lo0 = window > 0 && pos0 - window + 1 > 0 ? pos0 - window + 1 : 0;
    int slot0;
    ak_block *const *tb = tab_of(kv, layer);   /* the layer's group's blocks */
    for (int bi = block_of(kv, lo0, &slot0), s0; bi < kv->n_table && (s0 = span_start(kv, bi)) < n_end; bi++) {
        /* block bi holds positions [s0, s0 + its capacity) (a segment's partial block fewer than T) */
        const ak_block *b = tb[bi];
        if (!b) continue;   /* released: only before the window (the forward pass checks, ak_kv_window_check) */
        int cap = span_cap(kv, bi), cnt = n_end - s0 < cap ? n_end - s0 : cap;
        if (b->mix) {   /* per-slot formats: class by class */
            attend_mixed(&a, kv, b, &bb, s0, cnt);
            h.fk = h.fv = AK_KV_NFORMATS;   /* the next uniform block sets its sizes again */
            continue;
        }
        block_enter(&a, &h, kv, b, layer, kv_head);
        kv_prefetch pf = { .run = 4 };
        if (bi + PF_AHEAD < kv->n_table && span_start(kv, bi + PF_AHEAD) < n_end && tb[bi + PF_AHEAD] &&
            !tb[bi + PF_AHEAD]->mix)
            prefetch_start(&pf, kv, &h, tb[bi + PF_AHEAD], kv_head);
        /* the block's keys (transposed) and values in f32, stored basis;
         * keys past cnt are zeros (their scores are never used, but they
         * must be finite) */
        if (cnt < Tp)
            for (int d = 0; d < dk; d++) memset(kt + (size_t)d * Tp + cnt, 0, sizeof(float) * (size_t)(Tp - cnt));
        prefetch_step(&pf, PF_LINES);
        h.ik->dequant_t(h.kc, h.kcb, h.km, h.kmb, cnt, dk, kt, (size_t)Tp);
        prefetch_step(&pf, PF_LINES);
        h.iv->dequant(h.vc, h.vcb, h.vm, h.vmb, cnt, dv, vf, (size_t)dv);
        if (kv->n_corr) correct_block(kv, &h, &a, &bb, s0, cnt);
        rows_over_block(&a, &h, &bb, vf, NULL, s0, cnt, &pf);
        prefetch_step(&pf, -1);
    }
    rows_finish(&a);
}

/* ---- shared bases and linked blocks (kvcache.h) ------------------------- */

int ak_kv_attach_base(ak_kv *kv, const ak_kv *src, int base_len, ak_error *err) {
    if (kv->pool != src->pool) return ak_failc(err, AK_ERR_INVALID, "a base must come from the same block pool");
    if (kv->length || ak_kv_n_blocks(kv)) return ak_failc(err, AK_ERR_INVALID, "a base can only start an empty sequence");
    if (base_len < 0 || base_len > src->length)
        return ak_failc(err, AK_ERR_INVALID, "base of %d positions: the source holds %d", base_len, src->length);
    if (base_len > kv->capacity)
        return ak_failc(err, AK_ERR_INVALID, "base of %d positions is longer than the context %d", base_len, kv->capacity);
    /* src's segments up to base_len, and its own positions below base_len
     * as one more (they are standard-mapped from src's base_len too): the
     * table's first entries are then src's, entry for entry */
    int lens[AK_KV_MAX_SEGMENTS + 1], ns = base_len > 0 ? 1 : 0;
    if (base_len > 0 && base_len <= src->base_len) {
        ns = seg_of_pos(src, base_len - 1) + 1;
        seg_lens(src, lens);
        lens[ns - 1] = base_len - src->seg_start[ns - 1];
    } else if (base_len > 0) {
        ns = seg_lens(src, lens) + 1;
        lens[ns - 1] = base_len - src->base_len;
    }
    if (ns > AK_KV_MAX_SEGMENTS)
        return ak_failc(err, AK_ERR_INVALID, "a base of %d segments: at most %d", ns, AK_KV_MAX_SEGMENTS);
    /* the base's corrected positions stay corrected */
    if (kv->n_corr == 0 && corr_copy(kv, src, base_len) < 0)
        return ak_failc(err, AK_ERR_NOMEM, "out of memory for a base's corrections");
    int nb = spans_for(src, base_len);
    for (int i = 0; i < nb; i++) {
        ak_block_ref(kv->pool, src->table[i]);
        kv->table[i] = src->table[i];
        if (kv->ltable && src->ltable[i]) {   /* NULL where src released it: kv holds no more than src */
            ak_block_ref(kv->pool, src->ltable[i]);
            kv->ltable[i] = src->ltable[i];
        }
    }
    kv->lfirst = src->lfirst < base_len ? src->lfirst : base_len;
    seg_set(kv, lens, ns);
    kv->length = base_len;
    return 0;
}

int ak_kv_base_len(const ak_kv *kv) { return kv->base_len; }

int ak_kv_segments(const ak_kv *kv, int *lens) { return seg_lens(kv, lens); }

static int append_groups(ak_kv *kv, ak_block *const *blocks, ak_block *const *lblocks, int nb, int n, ak_error *err);

int ak_kv_append_blocks(ak_kv *kv, ak_block *const *blocks, int nb, int n, ak_error *err) {
    return append_groups(kv, blocks, NULL, nb, n, err);
}

int ak_kv_append_groups(ak_kv *kv, ak_block *const *blocks, ak_block *const *lblocks, int nb, int n, ak_error *err) {
    return append_groups(kv, blocks, kv->ng > 1 ? lblocks : NULL, nb, n, err);
}

/* ak_kv_append_blocks with the local group's blocks lblocks (NULL: the
 * sequence has one group; required with two). */
static int append_groups(ak_kv *kv, ak_block *const *blocks, ak_block *const *lblocks, int nb, int n, ak_error *err) {
    if (kv->ng > 1 && !lblocks)
        return ak_failc(err, AK_ERR_INVALID,
                        "a segment of shared blocks (a pool's, a card's, a memory's) cannot join a cache with "
                        "sliding-window layers");
    if (kv->length != kv->base_len)
        return ak_failc(err, AK_ERR_INVALID, "blocks can only follow the segments: the sequence holds %d own positions",
                        kv->length - kv->base_len);
    if (kv->n_seg >= AK_KV_MAX_SEGMENTS)
        return ak_failc(err, AK_ERR_INVALID, "a sequence holds at most %d segments", AK_KV_MAX_SEGMENTS);
    if (n < 1 || n > kv->capacity - kv->base_len || nb != (n + kv->T - 1) / kv->T)
        return ak_failc(err, AK_ERR_INVALID, "%d blocks cannot hold %d positions after %d in a context of %d", nb, n,
                        kv->base_len, kv->capacity);
    for (int i = 0; i < nb; i++) {
        int want = i < nb - 1 ? kv->T : n - i * kv->T;
        /* a segment's local blocks are read by whatever comes after it
         * within the window: a released one cannot be shared */
        if (lblocks && !lblocks[i])
            return ak_failc(err, AK_ERR_INVALID, "block %d of the shared segment has no local-layer block (released)", i);
        if (lblocks && (blocks[i]->group != 0 || lblocks[i]->group != 1))
            return ak_failc(err, AK_ERR_INVALID, "block %d of the shared segment: blocks of the wrong layer groups", i);
        if (blocks[i]->mix && blocks[i]->mix->count < want)
            return ak_failc(err, AK_ERR_INVALID, "block %d holds %d positions, %d needed", i, blocks[i]->mix->count, want);
    }
    int b0 = n_base_blocks(kv);
    for (int i = b0; i < kv->n_table; i++) {   /* blocks prepared past the length hold nothing */
        ak_block_unref(kv->pool, kv->table[i]);
        kv->table[i] = NULL;
        if (kv->ltable) {
            ak_block_unref(kv->pool, kv->ltable[i]);
            kv->ltable[i] = NULL;
        }
    }
    for (int i = 0; i < nb; i++) {
        ak_block_ref(kv->pool, blocks[i]);
        kv->table[b0 + i] = blocks[i];
        if (kv->ltable) {
            ak_block_ref(kv->pool, lblocks[i]);
            kv->ltable[b0 + i] = lblocks[i];
        }
    }
    int lens[AK_KV_MAX_SEGMENTS], ns = seg_lens(kv, lens);
    lens[ns++] = n;
    seg_set(kv, lens, ns);
    kv->length = kv->base_len;
    return 0;
}

int ak_kv_append_empty(ak_kv *kv, int n, ak_error *err) {
    if (n < 1 || n > kv->capacity - kv->base_len)
        return ak_failc(err, AK_ERR_INVALID, "a segment of %d positions after %d in a context of %d", n, kv->base_len,
                        kv->capacity);
    int nb = (n + kv->T - 1) / kv->T, rc = 0;
    ak_block **bl = ak_calloc((size_t)nb * kv->ng, sizeof *bl, err);
    if (!bl) return -1;
    for (int i = 0; i < nb * kv->ng && rc == 0; i++)
        if (!(bl[i] = ak_block_alloc_group(kv->pool, i / nb, kv->fk, kv->fv, err))) rc = -1;
    if (rc == 0) rc = append_groups(kv, bl, kv->ng > 1 ? bl + nb : NULL, nb, n, err);
    for (int i = 0; i < nb * kv->ng; i++) ak_block_unref(kv->pool, bl[i]);   /* kv holds them now (or nothing does) */
    free(bl);
    return rc;
}

int ak_kv_attach_blocks(ak_kv *kv, ak_block *const *blocks, int nb, int n, ak_error *err) {
    if (kv->length || ak_kv_n_blocks(kv)) return ak_failc(err, AK_ERR_INVALID, "blocks can only start an empty sequence");
    return ak_kv_append_blocks(kv, blocks, nb, n, err);
}

int ak_kv_block_end(const ak_kv *kv, int pos) {
    if (pos < 0 || pos >= kv->capacity) return -1;
    int slot, i = block_of(kv, pos, &slot);
    return span_start(kv, i) + span_cap(kv, i);
}

int ak_kv_has_mixed(const ak_kv *kv) {
    for (int i = 0; i < kv->n_table; i++)
        if (kv->table[i] && kv->table[i]->mix) return 1;
    return 0;
}



int ak_kv_span_count(const ak_kv *kv) { return spans_for(kv, kv->length); }

int ak_kv_blocks_for(const ak_kv *kv, int n) { return spans_for(kv, n); }

ak_block *ak_kv_block_at(const ak_kv *kv, int pos, int *slot) {
    int sl;
    if (pos < 0 || pos >= kv->length) return NULL;
    int i = block_of(kv, pos, &sl);
    if (i >= kv->n_table) return NULL;
    if (slot) *slot = sl;
    return kv->table[i];
}

ak_block *ak_kv_local_span(const ak_kv *kv, int i) {
    return kv->ng > 1 && i >= 0 && i < kv->n_table ? kv->ltable[i] : NULL;
}

ak_block *ak_kv_span(const ak_kv *kv, int i, int *start, int *count) {
    if (i < 0 || i >= kv->n_table) return NULL;
    if (start) *start = span_start(kv, i);
    if (count) *count = span_cap(kv, i);
    return kv->table[i];
}

int ak_kv_link_point(const ak_kv *kv) {
    return (kv->length - kv->base_len) % kv->T == 0 ? kv->length : -1;
}

int ak_kv_link(ak_kv *kv, ak_block *b, ak_error *err) {
    if (kv->ng > 1)   /* an indexed block holds one group's layers: the other's would be missing */
        return ak_failc(err, AK_ERR_INVALID, "linked (prefix-shared) blocks are not supported with sliding-window layers");
    if (ak_kv_link_point(kv) < 0)
        return ak_failc(err, AK_ERR_INVALID, "cannot link a block at position %d: not a block boundary", kv->length);
    if (kv->length + kv->T > kv->capacity)
        return ak_failc(err, AK_ERR_INVALID, "KV cache full: a linked block past the context size %d", kv->capacity);
    if (b->fk != kv->fk || b->fv != kv->fv) return ak_failc(err, AK_ERR_INVALID, "a linked block of other KV formats");
    int i = spans_for(kv, kv->length);
    ak_block_ref(kv->pool, b);
    ak_block_unref(kv->pool, kv->table[i]);   /* a block prepared there earlier */
    kv->table[i] = b;
    kv->length += kv->T;
    return 0;
}

int ak_kv_link_groups(ak_kv *kv, ak_block *b, ak_block *lb, ak_error *err) {
    if (kv->ng < 2) return ak_kv_link(kv, b, err);
    if (ak_kv_link_point(kv) < 0)
        return ak_failc(err, AK_ERR_INVALID, "cannot link a block at position %d: not a block boundary", kv->length);
    if (kv->length + kv->T > kv->capacity)
        return ak_failc(err, AK_ERR_INVALID, "KV cache full: a linked block past the context size %d", kv->capacity);
    if (b->mix || b->group != 0 || b->fk != kv->fk || b->fv != kv->fv ||
        (lb && (lb->mix || lb->group != 1 || lb->fk != kv->fk || lb->fv != kv->fv)))
        return ak_failc(err, AK_ERR_INVALID, "a linked block of another layer group or other KV formats");
    /* without its local block the span counts as released: only while
     * every earlier one is (the released spans are a prefix, kvcache.h) */
    if (!lb && (!kv->release || kv->lfirst != kv->length))
        return ak_failc(err, AK_ERR_INVALID, "a linked span without its local-layer block at %d, but the local layers "
                        "hold positions from %d", kv->length, kv->lfirst);
    int i = spans_for(kv, kv->length);
    ak_block_ref(kv->pool, b);
    ak_block_unref(kv->pool, kv->table[i]);   /* blocks prepared there earlier */
    kv->table[i] = b;
    if (lb) ak_block_ref(kv->pool, lb);
    ak_block_unref(kv->pool, kv->ltable[i]);
    kv->ltable[i] = lb;
    kv->length += kv->T;
    if (!lb) kv->lfirst = kv->length;
    return 0;
}

int ak_kv_replace_span(ak_kv *kv, int i, ak_block *b) {
    if (kv->ng > 1 || i < 0 || i >= spans_for(kv, kv->length) || !kv->table[i] || kv->table[i] == b) return -1;
    ak_block *o = kv->table[i];
    if (ak_block_refcount(kv->pool, o) != 1 || o->mix || b->mix || o->fk != b->fk || o->fv != b->fv) return -1;
    ak_block_ref(kv->pool, b);
    kv->table[i] = b;
    ak_block_unref(kv->pool, o);
    return 0;
}

size_t ak_kv_private_bytes(const ak_kv *kv) {
    size_t n = 0;
    for (int i = 0; i < kv->n_table; i++) {
        if (kv->table[i] && ak_block_refcount(kv->pool, kv->table[i]) == 1) n += kv->table[i]->bytes;
        if (kv->ltable && kv->ltable[i] && ak_block_refcount(kv->pool, kv->ltable[i]) == 1) n += kv->ltable[i]->bytes;
    }
    return n;
}

/* ---- corrections (kvcache.h) -------------------------------------------- */

int ak_kv_correction_add(ak_kv *kv, int start, int n, int layer0, const float *w, ak_error *err) {
    if (kv->n_corr >= AK_KV_MAX_CORRECTIONS)
        return ak_failc(err, AK_ERR_INVALID, "at most %d corrected ranges per sequence", AK_KV_MAX_CORRECTIONS);
    if (start < 0 || n < 1 || start + n > kv->length || layer0 < 0 || layer0 >= kv->spec.n_layer || !w)
        return ak_failc(err, AK_ERR_INVALID, "correction of positions [%d, %d) from layer %d: outside the %d held",
                        start, start + n, layer0, kv->length);
    for (int i = 0; i < kv->n_corr; i++) {
        const struct kv_corr *c = kv->corr[i];
        if (start < c->start + c->n && c->start < start + n)
            return ak_failc(err, AK_ERR_INVALID, "corrected ranges [%d, %d) and [%d, %d) overlap", start, start + n,
                            c->start, c->start + c->n);
    }
    struct kv_corr *c = corr_new(kv, start, n, layer0, w);
    if (!c) return ak_failc(err, AK_ERR_NOMEM, "out of memory for a correction");
    kv->corr[kv->n_corr] = c;
    return kv->n_corr++;
}

int ak_kv_correction_set(ak_kv *kv, int idx, int layer, const float *mu_k, const float *mu_v, ak_error *err) {
    if (idx < 0 || idx >= kv->n_corr)
        return ak_failc(err, AK_ERR_INVALID, "no correction %d (%d held)", idx, kv->n_corr);
    struct kv_corr *c = kv->corr[idx];
    if (layer < c->layer0 || layer >= kv->spec.n_layer)
        return ak_failc(err, AK_ERR_INVALID, "layer %d is not corrected (from %d of %d)", layer, c->layer0,
                        kv->spec.n_layer);
    const int dk = kv->spec.head_dim_k, dv = kv->spec.head_dim_v, H = kv->spec.n_head_kv;
    size_t base = (size_t)layer * H * (dk + dv);
    memcpy(c->mu + base, mu_k, sizeof(float) * (size_t)H * dk);
    memcpy(c->mu + base + (size_t)H * dk, mu_v, sizeof(float) * (size_t)H * dv);
    memcpy(c->mu_rot + base, c->mu + base, sizeof(float) * (size_t)H * (dk + dv));
    /* the rotated basis exists for the dims the rotated formats store */
    for (int h = 0; h < H; h++) {
        if (ak_kv_format_supports(AK_KV_TQ4, dk)) ak_kv_rotate(c->mu_rot + base + (size_t)h * dk, dk);
        if (ak_kv_format_supports(AK_KV_TQ4, dv)) ak_kv_rotate(c->mu_rot + base + (size_t)H * dk + (size_t)h * dv, dv);
    }
    c->set[layer] = 1;
    return 0;
}

int ak_kv_corrections(const ak_kv *kv) { return kv->n_corr; }

int ak_kv_correction_get(const ak_kv *kv, int idx, int *start, int *n, int *layer0, const float **w) {
    if (idx < 0 || idx >= kv->n_corr) return -1;
    const struct kv_corr *c = kv->corr[idx];
    if (start) *start = c->start;
    if (n) *n = c->n;
    if (layer0) *layer0 = c->layer0;
    if (w) *w = c->w;
    return 0;
}

const float *ak_kv_correction_mu(const ak_kv *kv, int idx, int layer, int is_v) {
    if (idx < 0 || idx >= kv->n_corr || layer < 0 || layer >= kv->spec.n_layer) return NULL;
    const struct kv_corr *c = kv->corr[idx];
    if (!c->set[layer]) return NULL;
    size_t base = (size_t)layer * kv->spec.n_head_kv * (kv->spec.head_dim_k + kv->spec.head_dim_v);
    return c->mu + base + (is_v ? (size_t)kv->spec.n_head_kv * kv->spec.head_dim_k : 0);
}

void ak_kv_correction_clear(ak_kv *kv) {
    for (int i = 0; i < kv->n_corr; i++) corr_free(kv->corr[i]);
    kv->n_corr = 0;
}
