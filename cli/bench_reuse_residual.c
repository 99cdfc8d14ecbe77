/* bench_reuse_residual.c - see bench_reuse_residual.h */
#include "bench_reuse_residual.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_reuse_metrics.h"
#include "engine/reuse.h"

static const float probe_ratio[2] = {0.10f, 0.30f};

/* The chunk's residuals: rk[(l * n + j) * kd + c] (and rv) = full - none
 * at position at + j, layer l; kv_energy of full into acc. Returns 0, or -1
 * with err set. */
static int read_residual(const brr_input *in, int at, int n, float *rk, float *rv, brr_acc *acc, ak_error *err) {
    const ak_model *m = ak_ctx_model(in->ctx);
    const int L = m->cfg.n_layer;
    const size_t kd = (size_t)m->spec.n_head_kv * m->spec.head_dim_k, vd = (size_t)m->spec.n_head_kv * m->spec.head_dim_v;
    float *buf = ak_malloc(sizeof(float) * 2 * (kd + vd), err);
    if (!buf) return -1;
    float *kf = buf, *vf = kf + kd, *kn = vf + vd, *vn = kn + kd;
    for (int l = 0; l < L; l++)
        for (int j = 0; j < n; j++) {
            if (ak_kv_read(in->full, l, at + j, kf, vf, err) < 0 || ak_kv_read(in->none, l, at + j, kn, vn, err) < 0) {
                free(buf);
                return -1;
            }
            float *ok = rk + ((size_t)l * n + j) * kd, *ov = rv + ((size_t)l * n + j) * vd;
            for (size_t c = 0; c < kd; c++) {
                ok[c] = kf[c] - kn[c];
                acc[2 * l].kv_energy += (double)kf[c] * kf[c];
            }
            for (size_t c = 0; c < vd; c++) {
                ov[c] = vf[c] - vn[c];
                acc[2 * l + 1].kv_energy += (double)vf[c] * vf[c];
            }
        }
    free(buf);
    return 0;
}

/* Keys rk (n_layer x n rows, layer-major) rotated by sign * (at + j + the
 * context's offset) for row j into rp (same layout): sign -1 takes keys of
 * positions at.. back to RoPE position 0, +1 the other way. Each row is
 * written as a key into an f32 scratch sequence of in->pool and moved with
 * ak_model_shift_keys (RoPE is linear: a residual rotates as the keys do).
 * Returns 0, or -1 with err set. */
static int rotate(const brr_input *in, int at, int n, const float *rk, float *rp, int sign, ak_error *err) {
    const ak_model *m = ak_ctx_model(in->ctx);
    const int L = m->cfg.n_layer;
    const size_t kd = (size_t)m->spec.n_head_kv * m->spec.head_dim_k;
    ak_kv *s = ak_kv_new(in->pool, AK_KV_F32, AK_KV_F32, n, err);
    if (!s) return -1;
    const size_t vd = (size_t)m->spec.n_head_kv * m->spec.head_dim_v;
    float *v = ak_calloc(vd, sizeof(float), err);   /* the values: zeros, unused */
    int rc = v ? ak_kv_prepare(s, 0, n, err) : -1;
    for (int l = 0; rc == 0 && l < L; l++)
        for (int j = 0; rc == 0 && j < n; j++) rc = ak_kv_write(s, l, j, rk + ((size_t)l * n + j) * kd, v, err);
    if (rc == 0) rc = ak_kv_set_length(s, n, err);
    for (int j = 0; rc == 0 && j < n; j++)
        rc = ak_model_shift_keys(m, s, j, j + 1, sign * (at + j + ak_ctx_pos_offset(in->ctx)), err);
    for (int l = 0; rc == 0 && l < L; l++)
        for (int j = 0; rc == 0 && j < n; j++) rc = ak_kv_read(s, l, j, rp + ((size_t)l * n + j) * kd, v, err);
    free(v);
    ak_kv_free(s);
    return rc;
}

/* Weights of reuse.h from deviations d (n): d_j / mean over the probes,
 * all 1 when that mean is 0, probes 0. */
static void weights(const double *d, int n, const int *probe, int m, const unsigned char *is_probe, float *w) {
    double dm = 0;
    for (int i = 0; i < m; i++) dm += d[probe[i]];
    dm /= m;
    for (int j = 0; j < n; j++) w[j] = is_probe[j] ? 0.0f : dm > 0 ? (float)(d[j] / dm) : 1.0f;
}

/* The probe columns of bench_reuse_residual.h for one chunk (residuals rk,
 * rv, rp; deviations ranked at the check layer) into acc. Returns 0, or -1
 * with err set. */
static int add_probes(const brr_input *in, int n, const float *rk, const float *rv, const float *rp, brr_acc *acc,
                      ak_error *err) {
    const ak_model *m = ak_ctx_model(in->ctx);
    const int L = m->cfg.n_layer, H = m->spec.n_head_kv, dk = m->spec.head_dim_k, dv = m->spec.head_dim_v;
    const size_t kd = (size_t)H * dk, vd = (size_t)H * dv;
    const int check = in->check_layer;
    int *order = ak_malloc(sizeof(int) * (size_t)n, err);
    double *d = ak_malloc(sizeof(double) * (size_t)n * (H + 1), err);
    float *w = ak_malloc(sizeof(float) * (size_t)n * (H + 2), err);
    int *probe = ak_malloc(sizeof(int) * (size_t)n, err);
    unsigned char *is_probe = ak_malloc((size_t)n, err);
    int rc = -1;
    if (!order || !d || !w || !probe || !is_probe) goto out;
    double *dh = d + n;   /* dh[h * n + j] */
    for (int j = 0; j < n; j++) {
        const float *v = rv + ((size_t)check * n + j) * vd;
        d[j] = 0;
        for (int h = 0; h < H; h++) {
            double s = 0;
            for (int c = 0; c < dv; c++) s += (double)v[h * dv + c] * v[h * dv + c];
            dh[(size_t)h * n + j] = s;
            d[j] += s;
        }
    }
    if (ak_reuse_rank(d, n, order, err) < 0) goto out;
    for (int ri = 0; ri < 2; ri++) {
        int mm = ak_reuse_n_selected(probe_ratio[ri], n);
        if (mm < 1 || mm >= n) continue;   /* no probe, or no token left to correct */
        memset(is_probe, 0, (size_t)n);
        for (int i = 0; i < mm; i++) {
            probe[i] = order[i];
            is_probe[probe[i]] = 1;
        }
        float *wj = w, *w1 = w + n, *wh = w + 2 * (size_t)n;
        weights(d, n, probe, mm, is_probe, wj);
        for (int j = 0; j < n; j++) w1[j] = is_probe[j] ? 0.0f : 1.0f;
        const brm_probes pj = {.probe = probe, .m = mm, .is_probe = is_probe, .w = wj};
        const brm_probes pu = {.probe = probe, .m = mm, .is_probe = is_probe, .w = w1};
        const brm_probes ph = {.probe = probe, .m = mm, .is_probe = is_probe, .w = wh};
        for (int l = check; l < L; l++)
            for (int side = 0; side < 2; side++) {
                brr_acc *a = &acc[2 * l + side];
                const size_t st = side ? vd : kd;
                const float *r = (side ? rv : rk) + (size_t)l * n * st;
                brm_probe_correction(r, n, (int)st, st, &pj, &a->before[ri], &a->after[ri]);
                if (ri) continue;
                brm_probe_correction(r, n, (int)st, st, &pu, &a->before_w1, &a->after_w1);
                const int hd = side ? dv : dk;
                for (int h = 0; h < H; h++) {   /* weights from head h's own V residual */
                    weights(dh + (size_t)h * n, n, probe, mm, is_probe, wh);
                    brm_probe_correction(r + (size_t)h * hd, n, hd, st, &ph, &a->before_head, &a->after_head);
                }
                if (!side)
                    brm_probe_correction(rp + (size_t)l * n * kd, n, (int)kd, kd, &pj, &a->before_pre,
                                         &a->after_pre);
            }
    }
    rc = 0;
out:
    free(order); free(d); free(w); free(probe); free(is_probe);
    return rc;
}

int brr_add_chunk(const brr_input *in, int at, int n, brr_acc *acc, float *mean, ak_error *err) {
    const ak_model *m = ak_ctx_model(in->ctx);
    const int L = m->cfg.n_layer;
    const size_t kd = (size_t)m->spec.n_head_kv * m->spec.head_dim_k, vd = (size_t)m->spec.n_head_kv * m->spec.head_dim_v;
    if (n < 1 || in->check_layer < 0 || in->check_layer >= L)
        return ak_failc(err, AK_ERR_INVALID, "residual: a chunk of %d tokens, check layer %d", n, in->check_layer);
    float *rk = ak_malloc(sizeof(float) * (size_t)L * n * (2 * kd + vd), err);
    if (!rk) return -1;
    float *rp = rk + (size_t)L * n * kd, *rv = rp + (size_t)L * n * kd;
    int rc = read_residual(in, at, n, rk, rv, acc, err);
    if (rc == 0) rc = rotate(in, at, n, rk, rp, -1, err);
    for (int l = 0; rc == 0 && l < L; l++)
        for (int side = 0; side < 2; side++) {
            brr_acc *a = &acc[2 * l + side];
            const size_t st = side ? vd : kd;
            const float *r = (side ? rv : rk) + (size_t)l * n * st;
            brm_offset_energy(r, n, (int)st, st, &a->explained, &a->energy);
            if (n > 1) brm_offset_energy(r + st, n - 1, (int)st, st, &a->explained_nf, &a->energy_nf);
            if (!side) {
                double e_pre = 0;
                brm_offset_energy(rp + (size_t)l * n * kd, n, (int)kd, kd, &a->explained_pre, &e_pre);
            }
            a->tokens += n;
        }
    if (rc == 0) rc = add_probes(in, n, rk, rv, rp, acc, err);
    for (int l = 0; rc == 0 && mean && l < L; l++) {
        float *mk = mean + (size_t)l * (2 * kd + vd), *mv = mk + kd, *mp = mv + vd;
        for (size_t c = 0; c < kd; c++) {
            double s = 0, sp = 0;
            for (int j = 0; j < n; j++) {
                s += rk[((size_t)l * n + j) * kd + c];
                sp += rp[((size_t)l * n + j) * kd + c];
            }
            mk[c] = (float)(s / n);
            mp[c] = (float)(sp / n);
        }
        for (size_t c = 0; c < vd; c++) {
            double s = 0;
            for (int j = 0; j < n; j++) s += rv[((size_t)l * n + j) * vd + c];
            mv[c] = (float)(s / n);
        }
    }
    free(rk);
    return rc;
}

/* ---- the oracle ---------------------------------------------------------------- */

int brr_apply_oracle(const brr_input *in, ak_kv *kv, int at, int n, const float *mean, brr_oracle mode,
                     ak_error *err) {
    const int pre = mode == BRR_ORACLE_PRE_ROPE;
    const ak_model *m = ak_ctx_model(in->ctx);
    const int L = m->cfg.n_layer;
    const size_t kd = (size_t)m->spec.n_head_kv * m->spec.head_dim_k, vd = (size_t)m->spec.n_head_kv * m->spec.head_dim_v;
    const size_t width = 2 * kd + vd;
    float *w = ak_malloc(sizeof(float) * (size_t)n, err);
    float *zero = ak_calloc(kd > vd ? kd : vd, sizeof(float), err);
    float *rows = pre ? ak_malloc(sizeof(float) * 2 * (size_t)L * n * kd, err) : NULL;
    float *buf = pre ? ak_malloc(sizeof(float) * (kd + vd), err) : NULL;
    int rc = -1;
    if (!w || !zero || (pre && (!rows || !buf))) goto out;
    for (int j = 0; j < n; j++) w[j] = 1.0f;
    /* the offsets of V and of K after RoPE as a correction of weight 1 */
    int idx = ak_kv_correction_add(kv, at, n, 0, w, err);
    if (idx < 0) goto out;
    for (int l = 0; l < L; l++) {
        const float *mk = mean + (size_t)l * width;
        const float *ok = pre || mode == BRR_ORACLE_V ? zero : mk, *ov = mode == BRR_ORACLE_K ? zero : mk + kd;
        if (ak_kv_correction_set(kv, idx, l, ok, ov, err) < 0) goto out;
    }
    if (pre) {   /* the keys: the pre-RoPE mean rotated to each token's position, written into the cache */
        float *rot = rows + (size_t)L * n * kd;
        for (int l = 0; l < L; l++)
            for (int j = 0; j < n; j++)
                memcpy(rows + ((size_t)l * n + j) * kd, mean + (size_t)l * width + kd + vd, sizeof(float) * kd);
        if (rotate(in, at, n, rows, rot, 1, err) < 0 || ak_kv_prepare(kv, at, at + n, err) < 0) goto out;
        for (int l = 0; l < L; l++)
            for (int j = 0; j < n; j++) {
                if (ak_kv_read(kv, l, at + j, buf, buf + kd, err) < 0) goto out;
                const float *r = rot + ((size_t)l * n + j) * kd;
                for (size_t c = 0; c < kd; c++) buf[c] += r[c];
                if (ak_kv_write(kv, l, at + j, buf, NULL, err) < 0) goto out;
            }
    }
    rc = 0;
out:
    free(w); free(zero); free(rows); free(buf);
    return rc;
}

/* ---- the table ---------------------------------------------------------------- */

/* a / b, or NaN when b is 0 (nothing to divide). */
static double ratio_or_nan(double a, double b) { return b > 0 ? a / b : NAN; }

/* 1 - after / before, or NaN when nothing was corrected. */
static double removed(double before, double after) { return before > 0 ? 1 - after / before : NAN; }

/* The figures of one row, in print order (NaN: not applicable). */
static void row_figures(const brr_acc *a, int side, int corrected, double f[10]) {
    f[0] = ratio_or_nan(a->energy, a->kv_energy);
    f[1] = ratio_or_nan(a->explained, a->energy);
    f[2] = ratio_or_nan(a->explained_nf, a->energy_nf);
    f[3] = side ? NAN : ratio_or_nan(a->explained_pre, a->energy);
    f[4] = corrected ? removed(a->before[0], a->after[0]) : NAN;
    f[5] = corrected ? removed(a->before_w1, a->after_w1) : NAN;
    f[6] = corrected ? removed(a->before_head, a->after_head) : NAN;
    f[7] = corrected && !side ? removed(a->before_pre, a->after_pre) : NAN;
    f[8] = corrected ? removed(a->before[1], a->after[1]) : NAN;
    f[9] = (double)a->tokens;
}

/* One table cell: "-" for NaN, else a percentage (pct) or a number. */
static void print_num(double x, int pct) {
    if (isnan(x)) printf(" %9s", "-");
    else if (pct) printf(" %8.1f%%", 100 * x);
    else printf(" %9.2e", x);
}

void brr_print(const brr_acc *acc, int n_layer, int check_layer, const char *ct, int json, int *first) {
    static const char *const keys[9] = {"rel_energy", "offset_share", "offset_share_no_first", "offset_share_pre_rope",
                                        "probe10", "probe10_unit", "probe10_head", "probe10_pre_rope", "probe30"};
    if (json) {
        for (int l = 0; l < n_layer; l++)
            for (int side = 0; side < 2; side++) {
                double f[10];
                row_figures(&acc[2 * l + side], side, l >= check_layer, f);
                printf("%s\n  {\"cache_type\": \"%s\", \"layer\": %d, \"side\": \"%s\", \"tokens\": %.0f", *first ? "" : ",",
                       ct, l, side ? "V" : "K", f[9]);
                for (int i = 0; i < 9; i++)
                    if (isnan(f[i])) printf(", \"%s\": null", keys[i]);
                    else printf(", \"%s\": %.6g", keys[i], f[i]);
                printf("}");
                *first = 0;
            }
        return;
    }
    printf("%-5s %-5s %-4s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "cache", "layer", "side", "rel", "offset",
           "off_no1st", "off_pre", "probe10", "p10_w1", "p10_head", "p10_pre", "probe30");
    for (int row = 0; row <= n_layer; row++)
        for (int side = 0; side < 2; side++) {
            brr_acc s;
            char lname[16];
            if (row < n_layer) {
                s = acc[2 * row + side];
                snprintf(lname, sizeof lname, "%d", row);
            } else {   /* every layer from the check layer on, summed */
                memset(&s, 0, sizeof s);
                for (int l = check_layer; l < n_layer; l++) {
                    const brr_acc *a = &acc[2 * l + side];
                    s.energy += a->energy; s.explained += a->explained; s.energy_nf += a->energy_nf;
                    s.explained_nf += a->explained_nf; s.explained_pre += a->explained_pre; s.kv_energy += a->kv_energy;
                    for (int i = 0; i < 2; i++) { s.before[i] += a->before[i]; s.after[i] += a->after[i]; }
                    s.before_w1 += a->before_w1; s.after_w1 += a->after_w1; s.before_head += a->before_head;
                    s.after_head += a->after_head; s.before_pre += a->before_pre; s.after_pre += a->after_pre;
                    s.tokens = a->tokens;
                }
                snprintf(lname, sizeof lname, "%d+", check_layer);
            }
            double f[10];
            row_figures(&s, side, row >= check_layer, f);
            printf("%-5s %-5s %-4s", ct, lname, side ? "V" : "K");
            print_num(f[0], 0);
            for (int i = 1; i < 9; i++) print_num(f[i], 1);
            printf("\n");
        }
}
