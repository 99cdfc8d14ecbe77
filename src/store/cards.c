/* cards.c - see cards.h. The card object: made from a range of a sequence
 * at per-token widths, hashed, and built into mixed blocks for an import. */
#include "store/cards.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <time.h>

static const int widths[AK_CARD_N_WIDTHS] = {2, 4, 8, 16};

int ak_card_width_class(int w) {
    for (int c = 0; c < AK_CARD_N_WIDTHS; c++)
        if (widths[c] == w) return c;
    return -1;
}

int ak_card_width_valid(int w) { return ak_card_width_class(w) >= 0; }

int ak_card_class_width(int c) { return c >= 0 && c < AK_CARD_N_WIDTHS ? widths[c] : 0; }

ak_kv_format ak_card_key_format(int w) {
    switch (w) {
    case 2: return AK_KV_Q2;
    case 4: return AK_KV_Q4;
    case 8: return AK_KV_Q8;
    default: return AK_KV_F16;
    }
}

ak_kv_format ak_card_value_format(int w) {
    switch (w) {
    case 2: return AK_KV_TQ2;
    case 4: return AK_KV_TQ4;
    case 8: return AK_KV_Q8;
    default: return AK_KV_F16;
    }
}

int ak_card_width_of_format(ak_kv_format f) {
    switch (f) {
    case AK_KV_F32:
    case AK_KV_F16:
    case AK_KV_BF16: return 16;
    case AK_KV_Q8: return 8;
    case AK_KV_Q4:
    case AK_KV_TQ4: return 4;
    default: return 2;   /* tq3, tcq3 (3 bits: the next width down), q2, tq2 */
    }
}

/* The format of side s at width w. */
static ak_kv_format side_format(int side, int w) { return side ? ak_card_value_format(w) : ak_card_key_format(w); }

/* Head dim of side s. */
static int side_dim(const ak_cache_spec *s, int side) { return side ? s->head_dim_v : s->head_dim_k; }

size_t ak_card_component_bytes(const ak_card *c, int side, int cls, int comp) {
    ak_kv_component cp[2];
    int nc = ak_kv_format_components(side_format(side, widths[cls]), side_dim(&c->spec, side), cp);
    if (comp >= nc) return 0;
    return (size_t)c->count[side][cls] * (size_t)c->spec.n_head_kv * cp[comp].bytes;
}

size_t ak_card_vector_bytes(const ak_card *c) {
    size_t t = 0;
    for (int side = 0; side < 2; side++)
        for (int cls = 0; cls < AK_CARD_N_WIDTHS; cls++)
            for (int comp = 0; comp < 2; comp++) t += ak_card_component_bytes(c, side, cls, comp);
    return t * (size_t)c->spec.n_layer;
}

size_t ak_card_f16_bytes(const ak_card *c) {
    return (size_t)c->n_tokens * (size_t)c->spec.n_layer * (size_t)c->spec.n_head_kv *
           (size_t)(c->spec.head_dim_k + c->spec.head_dim_v) * 2;
}

void ak_card_free(ak_card *c) {
    if (!c) return;
    if (c->data)
        for (int i = 0; i < c->spec.n_layer * 2 * AK_CARD_N_WIDTHS * 2; i++) free(c->data[i]);
    free(c->data);
    free(c->tokens);
    free(c->widths_k);
    free(c->widths_v);
    free(c);
}

/* 1 if s is 1..31 characters of [a-z0-9_-]. */
static int policy_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n >= AK_CARD_POLICY_MAX) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '-')) return 0;
    return 1;
}

/* 1 if fp is 1..64 printable ASCII characters (as the store requires). */
static int fingerprint_ok(const char *fp) {
    if (!fp || !*fp || strlen(fp) > 64) return 0;
    for (; *fp; fp++)
        if (*fp < 33 || *fp > 126) return 0;
    return 1;
}

/* The mixed block of kv holding pos and pos's slot in it, or NULL. */
static const ak_block *mixed_block_at(const ak_kv *kv, int pos, int *slot) {
    const ak_block *b = ak_kv_block_at(kv, pos, slot);
    return b && b->mix && *slot < b->mix->count ? b : NULL;
}

int ak_card_slot_widths(const ak_kv *kv, int pos, int *wk, int *wv) {
    int slot;
    if (pos < 0 || pos >= ak_kv_length(kv)) return 0;
    const ak_block *b = mixed_block_at(kv, pos, &slot);
    if (!b) return 0;
    const ak_block_mix *m = b->mix;
    *wk = ak_card_width_of_format(m->fmt[0][m->cls[0][slot]]);
    *wv = ak_card_width_of_format(m->fmt[1][m->cls[1][slot]]);
    return 1;
}

/* An empty card of n tokens for spec with its arrays allocated (data slots
 * NULL). NULL with err set when out of memory. */
static ak_card *card_alloc(const ak_cache_spec *spec, int n, ak_error *err) {
    ak_card *c = ak_calloc(1, sizeof *c, err);
    if (!c) return NULL;
    c->spec = *spec;
    c->n_tokens = n;
    size_t nn = n > 0 ? (size_t)n : 1;
    c->tokens = malloc(sizeof(int32_t) * nn);
    c->widths_k = malloc(nn);
    c->widths_v = malloc(nn);
    c->data = calloc((size_t)spec->n_layer * 2 * AK_CARD_N_WIDTHS * 2, sizeof *c->data);
    if (!c->tokens || !c->widths_k || !c->widths_v || !c->data) {
        ak_card_free(c);
        ak_failc(err, AK_ERR_NOMEM, "card: out of memory");
        return NULL;
    }
    return c;
}

/* malloc for a card's vector array (free() releases it). Arrays of
 * megabytes are written once end to end right after: on 2 MB pages, where
 * the kernel has them, that is 512 times fewer page faults. */
static void *big_alloc(size_t n) {
    const size_t huge = (size_t)2 << 20;
    if (n < huge) return malloc(n);
    void *p = NULL;
    if (posix_memalign(&p, huge, (n + huge - 1) / huge * huge)) return NULL;
#if defined(MADV_HUGEPAGE)
    madvise(p, (n + huge - 1) / huge * huge, MADV_HUGEPAGE);   /* advice: failure changes nothing */
#endif
    return p;
}

/* Allocates c's vector arrays from its counts (set beforehand). Returns 0,
 * or -1 with err set. */
static int card_alloc_vectors(ak_card *c, ak_error *err) {
    for (int l = 0; l < c->spec.n_layer; l++)
        for (int side = 0; side < 2; side++)
            for (int cls = 0; cls < AK_CARD_N_WIDTHS; cls++)
                for (int comp = 0; comp < 2; comp++) {
                    size_t n = ak_card_component_bytes(c, side, cls, comp);
                    if (!n) continue;
                    if (!(c->data[ak_card_slot(l, side, cls, comp)] = big_alloc(n)))
                        return ak_failc(err, AK_ERR_NOMEM, "card %s: out of memory for %zu bytes", c->id, n);
                }
    return 0;
}

/* ak_card_alloc_for_load (store_card.c): an empty card with counts from its
 * widths and vector arrays allocated. Not in cards.h: the store's. */
ak_card *ak_card_alloc_for_load(const ak_cache_spec *spec, int n, const uint8_t *wk, const uint8_t *wv, ak_error *err);
ak_card *ak_card_alloc_for_load(const ak_cache_spec *spec, int n, const uint8_t *wk, const uint8_t *wv, ak_error *err) {
    ak_card *c = card_alloc(spec, n, err);
    if (!c) return NULL;
    memcpy(c->widths_k, wk, (size_t)n);
    memcpy(c->widths_v, wv, (size_t)n);
    for (int i = 0; i < n; i++) {
        c->count[0][ak_card_width_class(wk[i])]++;
        c->count[1][ak_card_width_class(wv[i])]++;
    }
    if (card_alloc_vectors(c, err) < 0) {
        ak_card_free(c);
        return NULL;
    }
    return c;
}

/* ak_card_make's fill of the vectors, shared out over threads by blocks of
 * the source. Every (layer, side, head) run of a block is read where it
 * lies; a vector whose stored format is the token's card format and which
 * is not centered is copied as it is (its bits are what a re-quantization
 * of its reconstruction would try to reproduce, without the rounding);
 * any other is reconstructed (centering undone) and quantized into its
 * width's format. Threads write disjoint entries. */
typedef struct {
    const ak_kv *kv;
    ak_card *c;
    int from;
    const int32_t *rank[2];   /* (n) token i's entry in its class, per side */
    int failed;               /* a thread found no memory */
} make_job;

/* Puts the stored vector vec (format f, as quantize writes it) at entry e
 * of (layer, side, class cls). */
static void card_put(ak_card *c, int l, int side, int cls, size_t e, const uint8_t *vec, ak_kv_format f, int d) {
    ak_kv_component cp[2];
    int ncomp = ak_kv_format_components(f, d, cp);
    for (int comp = 0; comp < ncomp; comp++)
        memcpy(c->data[ak_card_slot(l, side, cls, comp)] + e * cp[comp].bytes, vec + cp[comp].offset, cp[comp].bytes);
}

/* Positions [p0, p1) of one uniform block b of the source, one layer. */
static void make_uniform_run(const make_job *j, const ak_block *b, int l, int p0, int p1, uint8_t *tmp, float *x) {
    ak_card *c = j->c;
    const ak_cache_spec *s = &c->spec;
    int H = s->n_head_kv;
    const ak_block_pool *pool = ak_kv_pool(j->kv);
    for (int side = 0; side < 2; side++) {
        int d = side_dim(s, side);
        ak_kv_format fb = side ? b->fv : b->fk;
        const ak_kv_format_info *ib = ak_kv_format_get(fb);
        size_t cb = ak_kv_format_code_bytes(fb, d), mb = ak_kv_format_meta_bytes(fb, d);
        const uint8_t *w = side ? c->widths_v : c->widths_k;
        for (int h = 0; h < H; h++) {
            const float *mu = ak_block_pool_center(pool, side, fb, l, h);
            /* a run's components of consecutive positions are back to back (kvcache.h) */
            const uint8_t *codes = ak_kv_stored(j->kv, l, side, 0, h, p0);
            const uint8_t *meta = mb ? ak_kv_stored(j->kv, l, side, 1, h, p0) : NULL;
            for (int p = p0; p < p1; p++) {
                int i = p - j->from, cls = ak_card_width_class(w[i]);
                ak_kv_format f = side_format(side, w[i]);
                size_t e = (size_t)j->rank[side][i] * H + h;   /* token-major, then head */
                memcpy(tmp, codes + (size_t)(p - p0) * cb, cb);
                if (mb) memcpy(tmp + cb, meta + (size_t)(p - p0) * mb, mb);
                if (f != fb || mu) {
                    ib->dequantize(tmp, d, x);
                    if (mu)
                        for (int t = 0; t < d; t++) x[t] += mu[t];
                    ak_kv_format_get(f)->quantize(x, d, tmp);
                }
                card_put(c, l, side, cls, e, tmp, f, d);
            }
        }
    }
}

/* Positions [p0, p1) of a mixed block (the source imported a card), one
 * layer: read back as floats and quantized (a width never rises, so the
 * rare equal-format vector is re-quantized from its own reconstruction). */
static void make_read_run(const make_job *j, int l, int p0, int p1, uint8_t *tmp, float *k) {
    ak_card *c = j->c;
    const ak_cache_spec *s = &c->spec;
    int H = s->n_head_kv;
    float *v = k + (size_t)H * s->head_dim_k;
    for (int p = p0; p < p1; p++) {
        int i = p - j->from;
        if (ak_kv_read(j->kv, l, p, k, v, NULL) < 0) continue;   /* p < length: cannot fail */
        for (int side = 0; side < 2; side++) {
            int wd = side ? c->widths_v[i] : c->widths_k[i], cls = ak_card_width_class(wd), d = side_dim(s, side);
            ak_kv_format f = side_format(side, wd);
            for (int h = 0; h < H; h++) {
                ak_kv_format_get(f)->quantize((side ? v : k) + (size_t)h * d, d, tmp);
                card_put(c, l, side, cls, (size_t)j->rank[side][i] * H + h, tmp, f, d);
            }
        }
    }
}

static void make_task(void *arg, int ith, int nth) {
    make_job *j = arg;
    /* pool workers flush denormals (util.h); the caller's thread may not:
     * every thread quantizes in the same mode, so the bits do not depend on
     * which thread made a vector */
    unsigned fp_mode = ak_flush_denormals();
    const ak_cache_spec *s = &j->c->spec;
    int dmax = s->head_dim_k > s->head_dim_v ? s->head_dim_k : s->head_dim_v;
    float *x = malloc(sizeof(float) * (size_t)s->n_head_kv * (size_t)(s->head_dim_k + s->head_dim_v));
    uint8_t *tmp = malloc(4 * (size_t)dmax + 64);   /* one vector in any format */
    if (!x || !tmp) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        free(x);
        free(tmp);
        ak_restore_denormals(fp_mode);
        return;
    }
    int from = j->from, to = from + j->c->n_tokens, ns = ak_kv_span_count(j->kv), k = 0;
    for (int i = 0; i < ns; i++) {
        int start, count;
        ak_block *b = ak_kv_span(j->kv, i, &start, &count);
        int p0 = start > from ? start : from, p1 = start + count < to ? start + count : to;
        if (!b || p0 >= p1) continue;
        if (k++ % nth != ith) continue;   /* blocks dealt round robin */
        for (int l = 0; l < s->n_layer; l++) {
            if (b->mix) make_read_run(j, l, p0, p1, tmp, x);
            else make_uniform_run(j, b, l, p0, p1, tmp, x);
        }
    }
    free(x);
    free(tmp);
    ak_restore_denormals(fp_mode);
}

ak_card *ak_card_make(const ak_kv *kv, const int32_t *tokens, const ak_card_params *p, ak_error *err) {
    if (!kv || !p || (!tokens && ak_kv_length(kv) > 0)) {
        ak_failc(err, AK_ERR_INVALID, "card: a sequence, its tokens and parameters are required");
        return NULL;
    }
    if (!p->id || !ak_agent_id_valid(p->id)) {
        ak_failc(err, AK_ERR_INVALID, "card: invalid id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
        return NULL;
    }
    if (!fingerprint_ok(p->fingerprint)) {
        ak_failc(err, AK_ERR_INVALID, "card %s: model fingerprint must be 1..64 printable characters", p->id);
        return NULL;
    }
    int len = ak_kv_length(kv);
    if (p->from < 0 || p->to <= p->from || p->to > len) {
        ak_failc(err, AK_ERR_INVALID, "card %s: range [%d, %d) is not a non-empty part of the context's %d positions",
                 p->id, p->from, p->to, len);
        return NULL;
    }
    const char *policy = p->policy ? p->policy : "given";
    if (!policy_ok(policy)) {
        ak_failc(err, AK_ERR_INVALID, "card %s: policy name must be 1..31 of [a-z0-9_-]", p->id);
        return NULL;
    }
    const ak_cache_spec *spec = ak_block_pool_spec(ak_kv_pool(kv));
    int n = p->to - p->from;
    for (int i = 0; i < n; i++)
        if ((p->widths_k && !ak_card_width_valid(p->widths_k[i])) || (p->widths_v && !ak_card_width_valid(p->widths_v[i]))) {
            ak_failc(err, AK_ERR_INVALID, "card %s: token %d: widths must be 2, 4, 8 or 16 (got %d / %d)", p->id, i,
                     p->widths_k ? p->widths_k[i] : 16, p->widths_v ? p->widths_v[i] : 16);
            return NULL;
        }
    for (int side = 0; side < 2; side++)
        for (int cls = 0; cls < AK_CARD_N_WIDTHS; cls++)
            if (!ak_kv_format_supports(side_format(side, widths[cls]), side_dim(spec, side))) {
                ak_failc(err, AK_ERR_INVALID, "card %s: format %s cannot store head dim %d",
                         p->id, ak_kv_format_get(side_format(side, widths[cls]))->name, side_dim(spec, side));
                return NULL;
            }
    ak_card *c = card_alloc(spec, n, err);
    if (!c) return NULL;
    snprintf(c->id, sizeof c->id, "%s", p->id);
    snprintf(c->source_agent, sizeof c->source_agent, "%s", p->source_agent ? p->source_agent : "");
    snprintf(c->fingerprint, sizeof c->fingerprint, "%s", p->fingerprint);
    snprintf(c->model_name, sizeof c->model_name, "%s", p->model_name ? p->model_name : "");
    for (char *q = c->model_name; *q; q++)   /* one clean metadata line */
        if ((unsigned char)*q < 32 || *q == 127) *q = '?';
    snprintf(c->policy, sizeof c->policy, "%s", policy);
    c->pos_offset = p->from;
    c->created = (int64_t)time(NULL);
    memcpy(c->tokens, tokens + p->from, sizeof(int32_t) * (size_t)n);
    long sum[2] = {0, 0};
    for (int i = 0; i < n; i++) {
        int wk = p->widths_k ? p->widths_k[i] : 16, wv = p->widths_v ? p->widths_v[i] : 16, ck, cv;
        /* a token imported from a card keeps or lowers its width */
        if (ak_card_slot_widths(kv, p->from + i, &ck, &cv)) {
            if (wk > ck) wk = ck;
            if (wv > cv) wv = cv;
        }
        c->widths_k[i] = (uint8_t)wk;
        c->widths_v[i] = (uint8_t)wv;
        c->count[0][ak_card_width_class(wk)]++;
        c->count[1][ak_card_width_class(wv)]++;
        sum[0] += wk;
        sum[1] += wv;
    }
    c->budget_k = p->budget_k > 0 ? p->budget_k : (double)sum[0] / n;
    c->budget_v = p->budget_v > 0 ? p->budget_v : (double)sum[1] / n;
    if (card_alloc_vectors(c, err) < 0) {
        ak_card_free(c);
        return NULL;
    }
    int32_t *rank = malloc(sizeof(int32_t) * 2 * (size_t)n);
    if (!rank) {
        ak_card_free(c);
        ak_failc(err, AK_ERR_NOMEM, "card %s: out of memory", p->id);
        return NULL;
    }
    int at[2][AK_CARD_N_WIDTHS] = {{0}};
    for (int i = 0; i < n; i++) {   /* token-major within each class */
        rank[i] = at[0][ak_card_width_class(c->widths_k[i])]++;
        rank[n + i] = at[1][ak_card_width_class(c->widths_v[i])]++;
    }
    make_job job = {.kv = kv, .c = c, .from = p->from, .rank = {rank, rank + n}};
    ak_threads_run(p->threads, make_task, &job);
    free(rank);
    if (job.failed) {
        ak_card_free(c);
        ak_failc(err, AK_ERR_NOMEM, "card %s: out of memory", p->id);
        return NULL;
    }
    ak_card_content_hash(c, c->hash);
    return c;
}

/* ak_card_to_blocks' fill of allocated mixed blocks, shared out over
 * threads by blocks: each slot's stored bytes copied where the mixed layout
 * keeps them (blockpool.h: MIXED BLOCKS): per layer a K then a V region,
 * per class [H][n_c] metadata then [H][n_c] codes, slot at its rank. */
typedef struct {
    const ak_card *c;
    ak_block **bl;
    int nb, T;
    const int *rank;   /* (2n) token t's entry in its card class: keys, values */
} fill_job;

static void fill_block(const fill_job *j, int b) {
    const ak_card *c = j->c;
    int H = c->spec.n_head_kv, t0 = b * j->T, count = c->n_tokens - t0 < j->T ? c->n_tokens - t0 : j->T;
    const ak_block_mix *m = j->bl[b]->mix;
    for (int l = 0; l < c->spec.n_layer; l++)
        for (int side = 0; side < 2; side++) {
            int d = side_dim(&c->spec, side);
            const uint8_t *wv = side ? c->widths_v : c->widths_k;
            for (int k = 0; k < count; k++) {
                int t = t0 + k, ccls = ak_card_width_class(wv[t]), mc = m->cls[side][k];
                ak_kv_format f = m->fmt[side][mc];
                size_t cb = ak_kv_format_code_bytes(f, d), mb = ak_kv_format_meta_bytes(f, d);
                size_t nc = (size_t)m->n[side][mc];
                uint8_t *region = j->bl[b]->data + (size_t)l * (m->region[0] + m->region[1]) +
                                  (side ? m->region[0] : 0) + m->off[side][mc];
                const uint8_t *src_c = c->data[ak_card_slot(l, side, ccls, 0)];
                const uint8_t *src_m = mb ? c->data[ak_card_slot(l, side, ccls, 1)] : NULL;
                size_t e0 = (size_t)j->rank[2 * t + side] * H;   /* the card's entries: token-major, then head */
                uint8_t *meta = region + (size_t)m->rank[side][k] * mb;
                uint8_t *codes = region + (size_t)H * nc * mb + (size_t)m->rank[side][k] * cb;
                for (int h = 0; h < H; h++) {   /* the block's: head-major, then slot */
                    memcpy(codes + (size_t)h * nc * cb, src_c + (e0 + h) * cb, cb);
                    if (mb) memcpy(meta + (size_t)h * nc * mb, src_m + (e0 + h) * mb, mb);
                }
            }
        }
}

static void fill_task(void *arg, int ith, int nth) {
    const fill_job *j = arg;
    for (int b = ith; b < j->nb; b += nth) fill_block(j, b);
}

int ak_card_to_blocks(const ak_card *c, ak_block_pool *pool, ak_threads *threads, ak_block ***blocks_out, int *nb_out,
                      ak_error *err) {
    const ak_cache_spec *ps = ak_block_pool_spec(pool);
    if (ps->n_layer != c->spec.n_layer || ps->n_head_kv != c->spec.n_head_kv || ps->head_dim_k != c->spec.head_dim_k ||
        ps->head_dim_v != c->spec.head_dim_v)
        return ak_failc(err, AK_ERR_INVALID, "card %s: its cache spec is not the pool's", c->id);
    int T = ak_block_pool_block_tokens(pool), n = c->n_tokens;
    int nb = (n + T - 1) / T;
    ak_block **bl = calloc((size_t)(nb ? nb : 1), sizeof *bl);
    int *rank = malloc(sizeof(int) * 2 * (size_t)(n ? n : 1));
    ak_kv_format *fk = malloc(sizeof(ak_kv_format) * 2 * (size_t)T), *fv = fk ? fk + T : NULL;
    if (!bl || !rank || !fk) {
        free(bl);
        free(rank);
        free(fk);
        return ak_failc(err, AK_ERR_NOMEM, "card %s: out of memory", c->id);
    }
    int cnt[2][AK_CARD_N_WIDTHS] = {{0}};
    for (int t = 0; t < n; t++) {
        rank[2 * t] = cnt[0][ak_card_width_class(c->widths_k[t])]++;
        rank[2 * t + 1] = cnt[1][ak_card_width_class(c->widths_v[t])]++;
    }
    for (int b = 0; b < nb; b++) {   /* the pool's allocator is not shared out: blocks first, then the copies */
        int t0 = b * T, count = n - t0 < T ? n - t0 : T;
        for (int k = 0; k < count; k++) {
            fk[k] = ak_card_key_format(c->widths_k[t0 + k]);
            fv[k] = ak_card_value_format(c->widths_v[t0 + k]);
        }
        if (!(bl[b] = ak_block_alloc_mixed_unfilled(pool, fk, fv, count, err))) {   /* fill_block writes it all */
            for (int i = 0; i < b; i++) ak_block_unref(pool, bl[i]);
            free(bl);
            free(rank);
            free(fk);
            return -1;
        }
    }
    fill_job job = {.c = c, .bl = bl, .nb = nb, .T = T, .rank = rank};
    ak_threads_run(threads, fill_task, &job);
    free(rank);
    free(fk);
    *blocks_out = bl;
    *nb_out = nb;
    return 0;
}

int ak_card_attach(const ak_card *c, ak_kv *kv, ak_error *err) { return ak_card_attach_on(c, kv, NULL, err); }

int ak_card_attach_on(const ak_card *c, ak_kv *kv, ak_threads *threads, ak_error *err) {
    if (ak_kv_length(kv) != 0) return ak_failc(err, AK_ERR_INVALID, "card %s: the sequence is not empty", c->id);
    if (c->n_tokens > ak_kv_capacity(kv))
        return ak_failc(err, AK_ERR_INVALID, "card %s: %d tokens exceed the sequence's capacity of %d", c->id,
                        c->n_tokens, ak_kv_capacity(kv));
    ak_block **bl;
    int nb;
    ak_block_pool *pool = ak_kv_pool(kv);
    if (ak_card_to_blocks(c, pool, threads, &bl, &nb, err) < 0) return -1;
    int rc = ak_kv_attach_blocks(kv, bl, nb, c->n_tokens, err);
    for (int i = 0; i < nb; i++) ak_block_unref(pool, bl[i]);   /* kv holds them now (or nothing does) */
    free(bl);
    return rc;
}

/* Vector of token entry `e` (its index among its class's tokens), head h,
 * of (layer, side, cls) of card c, dequantized into out. */
static void card_get_vec(const ak_card *c, int l, int side, int cls, int e, int h, uint8_t *tmp, float *out) {
    int d = side_dim(&c->spec, side);
    ak_kv_format f = side_format(side, widths[cls]);
    ak_kv_component cp[2];
    int nc = ak_kv_format_components(f, d, cp);
    size_t ent = (size_t)e * c->spec.n_head_kv + h;
    for (int q = 0; q < nc; q++)
        memcpy(tmp + cp[q].offset, c->data[ak_card_slot(l, side, cls, q)] + ent * cp[q].bytes, cp[q].bytes);
    ak_kv_format_get(f)->dequantize(tmp, d, out);
}

ak_card *ak_card_shift(const ak_card *c, const ak_model *m, int offset, ak_error *err) {
    const ak_cache_spec *ms = &m->spec;
    if (ms->n_layer != c->spec.n_layer || ms->n_head_kv != c->spec.n_head_kv || ms->head_dim_k != c->spec.head_dim_k ||
        ms->head_dim_v != c->spec.head_dim_v) {
        ak_failc(err, AK_ERR_INVALID, "card %s: not this model's cache spec", c->id);
        return NULL;
    }
    int n = c->n_tokens, H = c->spec.n_head_kv, dk = c->spec.head_dim_k, dv = c->spec.head_dim_v;
    ak_card *d = ak_card_alloc_for_load(&c->spec, n, c->widths_k, c->widths_v, err);
    if (!d) return NULL;
    snprintf(d->id, sizeof d->id, "%s", c->id);
    snprintf(d->source_agent, sizeof d->source_agent, "%s", c->source_agent);
    snprintf(d->fingerprint, sizeof d->fingerprint, "%s", c->fingerprint);
    snprintf(d->model_name, sizeof d->model_name, "%s", c->model_name);
    snprintf(d->policy, sizeof d->policy, "%s", c->policy);
    d->budget_k = c->budget_k;
    d->budget_v = c->budget_v;
    d->created = c->created;
    d->pos_offset = offset;
    memcpy(d->tokens, c->tokens, sizeof(int32_t) * (size_t)n);
    for (int l = 0; l < c->spec.n_layer; l++)
        for (int side = 0; side < 2; side++)
            for (int cls = 0; cls < AK_CARD_N_WIDTHS; cls++)
                for (int comp = 0; comp < 2; comp++) {
                    size_t nb = ak_card_component_bytes(c, side, cls, comp);
                    if (nb) memcpy(d->data[ak_card_slot(l, side, cls, comp)], c->data[ak_card_slot(l, side, cls, comp)], nb);
                }
    int delta = offset - c->pos_offset;
    if (delta == 0) {
        ak_card_content_hash(d, d->hash);
        return d;
    }
    /* the keys through a private f32 sequence: written, rotated, read back */
    ak_block_pool *pool = ak_block_pool_new(&c->spec, 0, 0, err);
    ak_kv *kv = pool ? ak_kv_new(pool, AK_KV_F32, AK_KV_F32, n, err) : NULL;
    float *k = malloc(sizeof(float) * (size_t)H * (size_t)(dk + dv)), *v = k ? k + (size_t)H * dk : NULL;
    uint8_t *tmp = malloc(4 * (size_t)(dk > dv ? dk : dv) + 64);
    int *rank = malloc(sizeof(int) * 2 * (size_t)n);
    int rc = kv && k && tmp && rank ? ak_kv_prepare(kv, 0, n, err) : -1;
    if (rc == 0) {
        int cnt[2][AK_CARD_N_WIDTHS] = {{0}};
        for (int t = 0; t < n; t++) {
            rank[2 * t] = cnt[0][ak_card_width_class(c->widths_k[t])]++;
            rank[2 * t + 1] = cnt[1][ak_card_width_class(c->widths_v[t])]++;
        }
        for (int l = 0; rc == 0 && l < c->spec.n_layer; l++)
            for (int t = 0; rc == 0 && t < n; t++) {
                for (int h = 0; h < H; h++) {
                    card_get_vec(c, l, 0, ak_card_width_class(c->widths_k[t]), rank[2 * t], h, tmp, k + (size_t)h * dk);
                    card_get_vec(c, l, 1, ak_card_width_class(c->widths_v[t]), rank[2 * t + 1], h, tmp, v + (size_t)h * dv);
                }
                rc = ak_kv_write(kv, l, t, k, v, err);
            }
    }
    if (rc == 0) rc = ak_model_shift_keys(m, kv, 0, n, delta, err);
    for (int l = 0; rc == 0 && l < c->spec.n_layer; l++)
        for (int t = 0; rc == 0 && t < n; t++) {
            rc = ak_kv_read(kv, l, t, k, v, err);
            int w = c->widths_k[t], cls = ak_card_width_class(w);
            ak_kv_format f = ak_card_key_format(w);
            ak_kv_component cp[2];
            int nc = ak_kv_format_components(f, dk, cp);
            for (int h = 0; rc == 0 && h < H; h++) {
                ak_kv_format_get(f)->quantize(k + (size_t)h * dk, dk, tmp);
                size_t ent = (size_t)rank[2 * t] * H + h;
                for (int q = 0; q < nc; q++)
                    memcpy(d->data[ak_card_slot(l, 0, cls, q)] + ent * cp[q].bytes, tmp + cp[q].offset, cp[q].bytes);
            }
        }
    if (rc != 0 && !(kv && k && tmp && rank) && err && err->code == AK_ERR_NONE)
        ak_failc(err, AK_ERR_NOMEM, "card %s: out of memory", c->id);
    free(rank);
    free(tmp);
    free(k);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    if (rc != 0) {
        ak_card_free(d);
        return NULL;
    }
    ak_card_content_hash(d, d->hash);
    return d;
}
