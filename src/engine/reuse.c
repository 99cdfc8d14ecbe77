/* reuse.c - see reuse.h */
#include "engine/reuse.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kvformat.h"

static const char *const method_names[] = {"none", "cacheblend", "agentkvshift", "full"};

const char *ak_reuse_method_name(ak_reuse_method m) {
    return (unsigned)m < sizeof method_names / sizeof method_names[0] ? method_names[m] : "?";
}

int ak_reuse_method_parse(const char *s, ak_reuse_method *m) {
    for (int i = 0; s && i < (int)(sizeof method_names / sizeof method_names[0]); i++)
        if (!strcmp(s, method_names[i])) {
            *m = (ak_reuse_method)i;
            return 0;
        }
    return -1;
}

int ak_reuse_spec_parse(const char *s, int *on, ak_reuse_params *p, ak_error *err) {
    if (!s) return ak_failc(err, AK_ERR_INVALID, "no reuse setting");
    if (!strcmp(s, "none")) {
        *on = 0;
        return 0;
    }
    const char *colon = strchr(s, ':');
    char name[16];
    size_t len = colon ? (size_t)(colon - s) : strlen(s);
    if (len >= sizeof name) len = sizeof name - 1;
    memcpy(name, s, len);
    name[len] = 0;
    ak_reuse_method m;
    if (ak_reuse_method_parse(name, &m) < 0 || (m != AK_REUSE_CACHEBLEND && m != AK_REUSE_AGENTKVSHIFT))
        return ak_failc(err, AK_ERR_INVALID, "'%.64s' is not none, cacheblend:R or agentkvshift:R", s);
    char *end = NULL;
    double r = colon ? strtod(colon + 1, &end) : NAN;
    if (!colon || end == colon + 1 || *end || !(r >= 0.0 && r <= 1.0))
        return ak_failc(err, AK_ERR_INVALID, "'%.64s': the recompute ratio R must be a number in [0, 1]", s);
    *on = 1;
    *p = (ak_reuse_params){.method = m, .ratio = (float)r, .check_layer = -1};
    return 0;
}

void ak_reuse_spec_format(int on, const ak_reuse_params *p, char *buf, size_t cap) {
    if (!on) snprintf(buf, cap, "none");
    else snprintf(buf, cap, "%s:%g", ak_reuse_method_name(p->method), (double)p->ratio);
}

/* Copies positions [src_at, src_at + n) of chunk into kv's positions
 * [at, at + n) (kv holds exactly [0, at)): the stored bytes when the
 * formats match (one pool: the same centering means), else each vector
 * dequantized and written again in kv's formats; then the keys are rotated
 * by at - src_at plus the context's position offset (the chunk's keys sit
 * at RoPE positions [src_at, src_at + n)). Returns 0, or -1 with err set. */
static int place_chunk(ak_ctx *c, ak_kv *kv, const ak_kv *chunk, int src_at, int at, int n, ak_error *err) {
    const ak_cache_spec *sp = &ak_ctx_model(c)->spec;
    if (ak_kv_prepare(kv, at, at + n, err) < 0) return -1;
    ak_kv_format fk = ak_kv_format_k(kv), fv = ak_kv_format_v(kv);
    if (ak_kv_format_k(chunk) == fk && ak_kv_format_v(chunk) == fv) {
        for (int side = 0; side < 2; side++) {
            ak_kv_format f = side ? fv : fk;
            int d = side ? sp->head_dim_v : sp->head_dim_k;
            size_t bytes[2] = {ak_kv_format_code_bytes(f, d), ak_kv_format_meta_bytes(f, d)};
            for (int l = 0; l < sp->n_layer; l++)
                for (int comp = 0; comp < 2; comp++) {
                    if (!bytes[comp]) continue;
                    for (int h = 0; h < sp->n_head_kv; h++)
                        for (int j = 0; j < n; j++) {
                            const uint8_t *src = ak_kv_stored(chunk, l, side, comp, h, src_at + j);
                            uint8_t *dst = ak_kv_stored_mut(kv, l, side, comp, h, at + j);
                            if (!src || !dst)
                                return ak_failc(err, AK_ERR_INVALID, "chunk position %d cannot be copied", src_at + j);
                            memcpy(dst, src, bytes[comp]);
                        }
                }
        }
    } else {
        size_t kd = (size_t)sp->n_head_kv * sp->head_dim_k, vd = (size_t)sp->n_head_kv * sp->head_dim_v;
        float *k = ak_malloc((kd + vd) * sizeof(float), err);
        if (!k) return -1;
        int rc = 0;
        for (int l = 0; rc == 0 && l < sp->n_layer; l++)
            for (int j = 0; rc == 0 && j < n; j++)
                if (ak_kv_read(chunk, l, src_at + j, k, k + kd, err) < 0 || ak_kv_write(kv, l, at + j, k, k + kd, err) < 0)
                    rc = -1;
        free(k);
        if (rc < 0) return -1;
    }
    if (ak_kv_set_length(kv, at + n, err) < 0) return -1;
    int delta = at - src_at + ak_ctx_pos_offset(c);
    return delta ? ak_model_shift_keys(ak_ctx_model(c), kv, at, at + n, delta, err) : 0;
}

/* Checks the arguments against kv and the model (reuse.h's AK_ERR_INVALID
 * list). Returns the check layer to use (-1 for NONE and FULL), or -2
 * with err set. */
static int check_args(ak_ctx *c, const ak_kv *kv, const ak_reuse_part *parts, int n_parts, const ak_reuse_params *p,
                      const float *logits, ak_error *err) {
    const ak_model *m = ak_ctx_model(c);
    if (ak_kv_length(kv) != 0 || ak_kv_base_len(kv) != 0) {
        ak_failc(err, AK_ERR_INVALID, "the sequence must be empty");
        return -2;
    }
    if (!p || (unsigned)p->method > AK_REUSE_FULL) {
        ak_failc(err, AK_ERR_INVALID, "unknown reuse method");
        return -2;
    }
    if (!(p->ratio >= 0.0f && p->ratio <= 1.0f)) {   /* NaN fails too */
        ak_failc(err, AK_ERR_INVALID, "recompute ratio %g is outside [0, 1]", (double)p->ratio);
        return -2;
    }
    if (!parts || n_parts < 1) {
        ak_failc(err, AK_ERR_INVALID, "no parts to prefill");
        return -2;
    }
    int blend = p->method == AK_REUSE_CACHEBLEND || p->method == AK_REUSE_AGENTKVSHIFT;
    int check = -1;
    if (blend) {
        if (m->cfg.kv_lora) {
            ak_failc(err, AK_ERR_INVALID, "%s is not available for multi-head latent attention (%s)",
                     ak_reuse_method_name(p->method), m->cfg.arch_name);
            return -2;
        }
        check = p->check_layer >= 0 ? p->check_layer : (m->cfg.n_layer > 1 ? 1 : 0);
        if (check >= m->cfg.n_layer) {
            ak_failc(err, AK_ERR_INVALID, "check layer %d: the model has %d layers", check, m->cfg.n_layer);
            return -2;
        }
    }
    long total = 0;
    for (int i = 0; i < n_parts; i++) {
        const ak_reuse_part *pt = &parts[i];
        if (pt->n < 1 || !pt->tokens) {
            ak_failc(err, AK_ERR_INVALID, "part %d has no tokens", i);
            return -2;
        }
        if (pt->chunk) {
            if (pt->src_at != 0) {
                ak_failc(err, AK_ERR_INVALID, "chunk of part %d: a source position is for ak_reuse_place", i);
                return -2;
            }
            if (ak_kv_length(pt->chunk) < pt->n) {
                ak_failc(err, AK_ERR_INVALID, "chunk of part %d holds %d positions, fewer than its %d tokens", i,
                         ak_kv_length(pt->chunk), pt->n);
                return -2;
            }
            if (ak_kv_pool(pt->chunk) != ak_kv_pool(kv)) {
                ak_failc(err, AK_ERR_INVALID, "chunk of part %d is of another block pool", i);
                return -2;
            }
            if (i == n_parts - 1 && logits && p->method != AK_REUSE_FULL) {
                ak_failc(err, AK_ERR_INVALID, "logits need the last part to be computed fresh");
                return -2;
            }
        }
        total += pt->n;
    }
    if (total > ak_kv_capacity(kv)) {
        ak_failc(err, AK_ERR_INVALID, "%ld tokens do not fit the sequence's %d positions", total,
                 ak_kv_capacity(kv));
        return -2;
    }
    return check;
}

/* Ranking order of chunk tokens: larger deviation first, then lower
 * position (ties resolved the same on every machine). */
typedef struct {
    double d;
    int j;
} ranked;

static int by_deviation(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->d != y->d) return x->d > y->d ? -1 : 1;
    return (x->j > y->j) - (x->j < y->j);
}

int ak_reuse_rank(const double *d, int n, int *order, ak_error *err) {
    ranked *rk = ak_malloc(sizeof(ranked) * (size_t)(n > 0 ? n : 1), err);
    if (!rk) return -1;
    for (int j = 0; j < n; j++) {
        rk[j].d = d[j];
        rk[j].j = j;
    }
    qsort(rk, (size_t)n, sizeof *rk, by_deviation);
    for (int i = 0; i < n; i++) order[i] = rk[i].j;
    free(rk);
    return 0;
}

static int by_index(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int ak_reuse_n_selected(float r, int n) {
    int m = (int)ceil((double)r * n - 1e-6);
    return m < 0 ? 0 : m > n ? n : m;
}

/* m tokens of one sequence at positions pos with their residual stream x
 * (m x dim), and a batch's seq (max_batch entries, each that sequence). */
typedef struct {
    const int32_t *tok, *pos;
    int m;
    float *x;
    ak_kv **seq;
} token_run;

/* Runs r's tokens of kv through layers [l0, l1), max_batch tokens at a
 * time (in position order: each batch's tokens see the earlier batches'
 * writes at every layer). Returns 0, or -1 with err set. */
static int run_layers(ak_ctx *c, ak_kv *kv, const token_run *r, int l0, int l1, ak_error *err) {
    const int32_t *tok = r->tok, *pos = r->pos;
    const int m = r->m;
    float *x = r->x;
    ak_kv **seq = r->seq;
    int B = ak_ctx_max_batch(c), dim = ak_ctx_model(c)->cfg.dim;
    for (int i = 0; i < B; i++) seq[i] = kv;
    for (int i0 = 0; i0 < m; i0 += B) {
        int cnt = m - i0 < B ? m - i0 : B;
        ak_batch b = {.n = cnt, .token = tok + i0, .pos = pos + i0, .seq = seq, .logits_out = NULL};
        if (ak_forward_layers(c, &b, x + (size_t)i0 * dim, l0, l1, err) < 0) return -1;
    }
    return 0;
}

/* ak_layer_kv of layer l for r's tokens (r->seq already filled), max_batch
 * at a time: their keys into k, values into v. Returns 0, or -1 with err
 * set. */
static int layer_kv(ak_ctx *c, const token_run *r, int l, float *k, float *v, ak_error *err) {
    const int32_t *tok = r->tok, *pos = r->pos;
    const int m = r->m;
    const float *x = r->x;
    ak_kv **seq = r->seq;
    const ak_model *md = ak_ctx_model(c);
    int B = ak_ctx_max_batch(c), dim = md->cfg.dim;
    size_t kd = (size_t)md->spec.n_head_kv * md->spec.head_dim_k, vd = (size_t)md->spec.n_head_kv * md->spec.head_dim_v;
    for (int i0 = 0; i0 < m; i0 += B) {
        int cnt = m - i0 < B ? m - i0 : B;
        ak_batch b = {.n = cnt, .token = tok + i0, .pos = pos + i0, .seq = seq, .logits_out = NULL};
        if (ak_layer_kv(c, &b, x + (size_t)i0 * dim, l, k + i0 * kd, v + i0 * vd, err) < 0) return -1;
    }
    return 0;
}

/* CACHEBLEND / AGENTKVSHIFT of one chunk part already placed at [at, at +
 * n) of kv (reuse.h). Counts the selected tokens into *recomputed. Returns
 * 0, or -1 with err set. */
static int blend_chunk(ak_ctx *c, ak_kv *kv, const ak_reuse_part *pt, int at, int check, const ak_reuse_params *p,
                       int *recomputed, ak_error *err) {
    const ak_model *md = ak_ctx_model(c);
    const int n = pt->n, dim = md->cfg.dim, L = md->cfg.n_layer, H = md->spec.n_head_kv;
    const int dk = md->spec.head_dim_k, dv = md->spec.head_dim_v;
    const size_t kd = (size_t)H * dk, vd = (size_t)H * dv;
    const int m = ak_reuse_n_selected(p->ratio, n);
    int rc = -1;
    int32_t *pos = ak_malloc(sizeof(int32_t) * (size_t)n * 3, err);
    float *x = ak_malloc(sizeof(float) * (size_t)n * dim, err), *xs = ak_malloc(sizeof(float) * (size_t)n * dim, err);
    float *kf = ak_malloc(sizeof(float) * (size_t)n * kd, err), *vf = ak_malloc(sizeof(float) * (size_t)n * vd, err);
    float *kr = ak_malloc(sizeof(float) * (kd + vd), err), *w = ak_malloc(sizeof(float) * (size_t)n, err);
    float *mu = ak_malloc(sizeof(float) * (kd + vd), err);
    double *dev = ak_malloc(sizeof(double) * (size_t)n, err);
    int *order = ak_malloc(sizeof(int) * (size_t)n, err);
    ak_kv **seq = ak_malloc(sizeof(ak_kv *) * (size_t)ak_ctx_max_batch(c), err);
    if (!pos || !x || !xs || !kf || !vf || !kr || !w || !mu || !dev || !order || !seq) goto out;
    int32_t *sel = pos + n, *stok = pos + 2 * n, *spos;
    for (int j = 0; j < n; j++) pos[j] = at + j;
    for (int i = 0; i < ak_ctx_max_batch(c); i++) seq[i] = kv;
    /* every chunk token through [0, check) over the real context (its K/V
     * at those layers written fresh), then its fresh K/V at the check layer */
    if (ak_model_embed(c, pt->tokens, n, x, err) < 0) goto out;
    const token_run all = {.tok = pt->tokens, .pos = pos, .m = n, .x = x, .seq = seq};
    if (check > 0 && run_layers(c, kv, &all, 0, check, err) < 0) goto out;
    if (layer_kv(c, &all, check, kf, vf, err) < 0) goto out;
    for (int j = 0; j < n; j++) {   /* squared L2 deviation of fresh from reused V, all heads */
        if (ak_kv_read(kv, check, at + j, kr, kr + kd, err) < 0) goto out;
        double d = 0;
        for (size_t i = 0; i < vd; i++) {
            double e = (double)vf[(size_t)j * vd + i] - kr[kd + i];
            d += e * e;
        }
        dev[j] = d;
    }
    if (ak_reuse_rank(dev, n, order, err) < 0) goto out;
    for (int i = 0; i < m; i++) sel[i] = order[i];
    qsort(sel, (size_t)m, sizeof *sel, by_index);   /* recomputed in position order */
    *recomputed += m;
    if (m == 0) { rc = 0; goto out; }
    spos = sel;   /* positions of the selected, in place of their indices */
    const token_run picked = {.tok = stok, .pos = spos, .m = m, .x = xs, .seq = seq};
    for (int i = 0; i < m; i++) {
        int j = sel[i];
        stok[i] = pt->tokens[j];
        memcpy(xs + (size_t)i * dim, x + (size_t)j * dim, sizeof(float) * dim);
        memcpy(kf + (size_t)i * kd, kf + (size_t)j * kd, sizeof(float) * kd);   /* i <= j: in order, in place */
        memcpy(vf + (size_t)i * vd, vf + (size_t)j * vd, sizeof(float) * vd);
    }
    if (p->method == AK_REUSE_CACHEBLEND || m == n) {   /* no token left to correct */
        for (int i = 0; i < m; i++) spos[i] = at + sel[i];
        rc = run_layers(c, kv, &picked, check, L, err);
        goto out;
    }
    /* AGENTKVSHIFT: weights from the initial deviation (reuse.h) */
    double dm = 0;
    for (int i = 0; i < m; i++) dm += dev[order[i]];
    dm /= m;
    for (int j = 0; j < n; j++) w[j] = 1.0f;
    if (!p->unit_weights && dm > 0)
        for (int i = m; i < n; i++) w[order[i]] = (float)(dev[order[i]] / dm);
    for (int i = 0; i < m; i++) w[sel[i]] = 0.0f;   /* probes hold fresh K/V */
    for (int i = 0; i < m; i++) spos[i] = at + sel[i];
    int idx = ak_kv_correction_add(kv, at, n, check, w, err);
    if (idx < 0) goto out;
    for (int l = check; l < L; l++) {
        /* the probes' fresh K/V at layer l (at the check layer: computed
         * above) against what the cache holds there before they are written */
        if (l > check && layer_kv(c, &picked, l, kf, vf, err) < 0) goto out;
        memset(mu, 0, sizeof(float) * (kd + vd));
        for (int i = 0; i < m; i++) {
            if (ak_kv_read(kv, l, spos[i], kr, kr + kd, err) < 0) goto out;
            for (size_t e = 0; e < kd; e++) mu[e] += kf[(size_t)i * kd + e] - kr[e];
            for (size_t e = 0; e < vd; e++) mu[kd + e] += vf[(size_t)i * vd + e] - kr[kd + e];
        }
        for (size_t e = 0; e < kd + vd; e++) mu[e] /= (float)m;
        if (ak_kv_correction_set(kv, idx, l, mu, mu + kd, err) < 0) goto out;
        if (run_layers(c, kv, &picked, l, l + 1, err) < 0) goto out;
    }
    rc = 0;
out:
    free(pos); free(x); free(xs); free(kf); free(vf); free(kr); free(w); free(mu); free(dev); free(order); free(seq);
    return rc;
}

int ak_reuse_place(ak_ctx *c, ak_kv *kv, const ak_reuse_part *part, const ak_reuse_params *p, ak_reuse_stats *st,
                   ak_error *err) {
    double t0 = ak_now();
    int at = ak_kv_length(kv);
    if (!part || !part->chunk) return ak_failc(err, AK_ERR_INVALID, "no chunk to place");
    if (!p || (unsigned)p->method > AK_REUSE_FULL) return ak_failc(err, AK_ERR_INVALID, "unknown reuse method");
    if (!(p->ratio >= 0.0f && p->ratio <= 1.0f))
        return ak_failc(err, AK_ERR_INVALID, "recompute ratio %g is outside [0, 1]", (double)p->ratio);
    if (part->n < 1 || !part->tokens || part->src_at < 0 || ak_kv_length(part->chunk) - part->n < part->src_at ||
        ak_kv_pool(part->chunk) != ak_kv_pool(kv))
        return ak_failc(err, AK_ERR_INVALID, "the chunk does not hold its %d tokens at %d in this block pool", part->n,
                        part->src_at);
    if (at + part->n > ak_kv_capacity(kv))
        return ak_failc(err, AK_ERR_INVALID, "%d + %d tokens do not fit the sequence's %d positions", at, part->n,
                        ak_kv_capacity(kv));
    int blend = p->method == AK_REUSE_CACHEBLEND || p->method == AK_REUSE_AGENTKVSHIFT, check = -1;
    const ak_model *m = ak_ctx_model(c);
    if (blend) {
        if (m->cfg.kv_lora)
            return ak_failc(err, AK_ERR_INVALID, "%s is not available for multi-head latent attention (%s)",
                            ak_reuse_method_name(p->method), m->cfg.arch_name);
        check = p->check_layer >= 0 ? p->check_layer : (m->cfg.n_layer > 1 ? 1 : 0);
        if (check >= m->cfg.n_layer)
            return ak_failc(err, AK_ERR_INVALID, "check layer %d: the model has %d layers", check, m->cfg.n_layer);
    }
    ak_reuse_stats s = {0};
    s.check_layer = check;
    s.n_tokens = s.n_chunk_tokens = part->n;
    int rc;
    if (p->method == AK_REUSE_FULL) {
        rc = ak_eval(c, kv, &(ak_eval_args){.tokens = part->tokens, .n = part->n, .pos0 = at}, err);
        s.n_recomputed = part->n;
    } else {
        rc = place_chunk(c, kv, part->chunk, part->src_at, at, part->n, err);
        if (rc == 0 && blend) rc = blend_chunk(c, kv, part, at, check, p, &s.n_recomputed, err);
    }
    if (rc < 0) {   /* back to [0, at), without a correction this call added */
        ak_kv_truncate(kv, at);
        return -1;
    }
    s.ms = (ak_now() - t0) * 1e3;
    if (st) *st = s;
    return 0;
}

int ak_reuse_prefill(ak_ctx *c, ak_kv *kv, const ak_reuse_part *parts, int n_parts, const ak_reuse_params *p,
                     float *logits, ak_reuse_stats *st, ak_error *err) {
    double t0 = ak_now();
    int check = check_args(c, kv, parts, n_parts, p, logits, err);
    if (check < -1) return -1;
    int blend = p->method == AK_REUSE_CACHEBLEND || p->method == AK_REUSE_AGENTKVSHIFT;
    ak_reuse_stats s = {0};
    s.check_layer = check;
    int at = 0, rc = 0;
    for (int i = 0; rc == 0 && i < n_parts; i++) {
        const ak_reuse_part *pt = &parts[i];
        float *lg = i == n_parts - 1 ? logits : NULL;
        if (pt->chunk) s.n_chunk_tokens += pt->n;
        if (!pt->chunk || p->method == AK_REUSE_FULL) {
            rc = ak_eval(c, kv, &(ak_eval_args){.tokens = pt->tokens, .n = pt->n, .pos0 = at, .logits = lg}, err);
            if (pt->chunk) s.n_recomputed += pt->n;
        } else {
            rc = place_chunk(c, kv, pt->chunk, 0, at, pt->n, err);
            if (rc == 0 && blend) rc = blend_chunk(c, kv, pt, at, check, p, &s.n_recomputed, err);
        }
        at += pt->n;
    }
    if (rc < 0) {
        ak_kv_truncate(kv, 0);
        ak_kv_correction_clear(kv);
        return -1;
    }
    s.n_tokens = at;
    s.ms = (ak_now() - t0) * 1e3;
    if (st) *st = s;
    return 0;
}
