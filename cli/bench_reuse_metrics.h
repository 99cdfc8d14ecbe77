/* bench_reuse_metrics.h - the quality arithmetic of `agentkv bench reuse`
 * (cli/cmd_bench_reuse.c): KL divergence of next-token distributions,
 * perplexity, argmax agreement, accumulated over scored positions; and of
 * `--residual` (cli/bench_reuse_residual.c): the share of a reuse
 * residual's energy its per-chunk mean explains, and what a probe-mean
 * correction removes of it (the section at the end).
 *
 * Header-only (static inline) so the tests check these exact functions
 * against hand-computed values (tests/test_bench_reuse.c) without linking
 * the command-line objects.
 *
 * Definitions (natural logarithms, nats):
 *   p = softmax(reference logits), q = softmax(method logits) at a position;
 *   KL(p || q) = sum_v p_v (log p_v - log q_v), the information lost when
 *   the method's distribution stands in for the reference's;
 *   NLL of the next token t under q: -log q_t; PPL = exp(mean NLL);
 *   dPPL = PPL(method) - PPL(reference); relative: dPPL / PPL(reference);
 *   agree: share of positions where argmax p == argmax q (lowest id on ties,
 *   as ak_argmax).
 */
#ifndef AK_BENCH_REUSE_METRICS_H
#define AK_BENCH_REUSE_METRICS_H

#include <math.h>

/* log-softmax of logits[0..n) into out[0..n), in double (max subtracted
 * first so large logits do not overflow exp). n >= 1. */
static inline void brm_log_softmax(const float *logits, int n, double *out) {
    double mx = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)logits[i] - mx);
    double lz = mx + log(s);
    for (int i = 0; i < n; i++) out[i] = (double)logits[i] - lz;
}

/* KL(p || q) from log-probabilities lp, lq (n entries each). Tiny negative
 * results of two equal distributions (rounding) are returned as 0. */
static inline double brm_kl(const double *lp, const double *lq, int n) {
    double kl = 0;
    for (int i = 0; i < n; i++) kl += exp(lp[i]) * (lp[i] - lq[i]);
    return kl < 0 ? 0 : kl;
}

/* Index of the largest of x[0..n) (the lowest index on ties). */
static inline int brm_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Sums over the scored positions of one (method, ratio, cache type). */
typedef struct {
    double kl;        /* sum of KL(reference || method) */
    double kl_max;
    long n_kl;        /* positions compared */
    long agree;       /* of which argmax equal */
    double nll, nll_ref; /* sums of the next token's NLL under method and reference */
    long n_nll;       /* positions with a next token */
} brm_acc;

/* Adds one position: ref and got are the reference's and the method's
 * logits (vocab entries); next is the token that follows (its NLL is
 * counted), or < 0 when the position has none. lp, lq: scratch of vocab
 * doubles each. */
static inline void brm_acc_add(brm_acc *a, const float *ref, const float *got, int vocab, int next, double *lp,
                               double *lq) {
    brm_log_softmax(ref, vocab, lp);
    brm_log_softmax(got, vocab, lq);
    double kl = brm_kl(lp, lq, vocab);
    a->kl += kl;
    if (kl > a->kl_max) a->kl_max = kl;
    a->n_kl++;
    if (brm_argmax(ref, vocab) == brm_argmax(got, vocab)) a->agree++;
    if (next >= 0 && next < vocab) {
        a->nll -= lq[next];
        a->nll_ref -= lp[next];
        a->n_nll++;
    }
}

/* Adds b's sums into a. */
static inline void brm_acc_merge(brm_acc *a, const brm_acc *b) {
    a->kl += b->kl;
    if (b->kl_max > a->kl_max) a->kl_max = b->kl_max;
    a->n_kl += b->n_kl;
    a->agree += b->agree;
    a->nll += b->nll;
    a->nll_ref += b->nll_ref;
    a->n_nll += b->n_nll;
}

/* The figures of a: mean KL, agreement share, PPL of method and reference
 * (pooled NLL over every scored position), dPPL and its relative value.
 * With nothing accumulated every figure is 0 (ppl 1). */
typedef struct {
    double kl, kl_max, agree, ppl, ppl_ref, dppl, dppl_rel;
} brm_result;

static inline brm_result brm_finish(const brm_acc *a) {
    brm_result r;
    r.kl = a->n_kl ? a->kl / (double)a->n_kl : 0;
    r.kl_max = a->kl_max;
    r.agree = a->n_kl ? (double)a->agree / (double)a->n_kl : 0;
    r.ppl = a->n_nll ? exp(a->nll / (double)a->n_nll) : 1;
    r.ppl_ref = a->n_nll ? exp(a->nll_ref / (double)a->n_nll) : 1;
    r.dppl = r.ppl - r.ppl_ref;
    r.dppl_rel = r.ppl_ref > 0 ? r.dppl / r.ppl_ref : 0;
    return r;
}

/* ---- the reuse residual (`bench reuse --residual`) ----------------------------
 *
 * A chunk's residual r (n tokens x d channels, row j at r + j * stride) is
 * its K or V computed in context minus the same computed alone (keys
 * shifted). Its energy is sum_j |r_j|^2. The per-chunk offset is the mean
 * over the chunk's tokens, per channel: mu_c = (1/n) sum_j r_jc; the energy
 * it explains is the energy removed by subtracting it from every token,
 * sum_j |r_j|^2 - sum_j |r_j - mu|^2 = n |mu|^2 (least squares: no other
 * constant removes more). share = explained / energy: 1 when the residual
 * is the same vector at every token, 0 when its mean is zero. Summed over
 * chunks (and heads, layers) before dividing, so a share is energy-weighted.
 */

/* Adds r's energy to *energy and the part its per-channel mean explains to
 * *explained (doubles throughout). n >= 1, d >= 1. */
static inline void brm_offset_energy(const float *r, int n, int d, size_t stride, double *explained, double *energy) {
    double e = 0, x = 0;
    for (int c = 0; c < d; c++) {
        double s = 0;
        for (int j = 0; j < n; j++) {
            double v = r[(size_t)j * stride + c];
            s += v;
            e += v * v;
        }
        x += s * s / n;   /* n mu_c^2 */
    }
    *energy += e;
    *explained += x;
}

/* A chunk's probes and weights for brm_probe_correction. */
typedef struct {
    const int *probe;               /* the m probe rows */
    int m;                          /* >= 1 */
    const unsigned char *is_probe;  /* n flags, 1 for a probe */
    const float *w;                 /* n weights (the probes' unused) */
} brm_probes;

/* AgentKVShift's correction of r in closed form: mu = the mean of r over
 * the probe rows (per channel), and every other row j is corrected to
 * r_j - w[j] mu (probes are recomputed: no residual left). Adds the
 * non-probe rows' energy before the correction to *before and after it to
 * *after (1 - after / before: the share removed; negative when the
 * correction adds error). */
static inline void brm_probe_correction(const float *r, int n, int d, size_t stride, const brm_probes *p,
                                        double *before, double *after) {
    for (int c = 0; c < d; c++) {
        double mu = 0;
        for (int i = 0; i < p->m; i++) mu += r[(size_t)p->probe[i] * stride + c];
        mu /= p->m;
        for (int j = 0; j < n; j++) {
            if (p->is_probe[j]) continue;
            double v = r[(size_t)j * stride + c], u = v - p->w[j] * mu;
            *before += v * v;
            *after += u * u;
        }
    }
}

#endif
