/* attnstats.c - attention statistics (definitions in attnstats.h). */
#include "engine/attnstats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/vmath.h"

struct ak_attn_stats {
    const ak_model *m;
    const ak_kv *seq;       /* tracked sequence, or NULL: every token */
    int nl;                 /* chosen layers */
    int layers[AK_ATTN_STATS_MAX_LAYERS];
    int H;                  /* query heads */
    int len;                /* 1 + highest slot seen */
    int cap;                /* slots allocated in the arrays below */
    double *mass;           /* (nl, H, cap) M[l,h](t) */
    double *ent;            /* (nl, H, cap) sum of the entropies of query slot q's passes */
    int64_t *nq;            /* (cap) passes in which slot q was a query */
    int64_t *seen;          /* (nl, cap) queries of layer l whose visible range held slot t */
    /* scratch, grown on demand */
    float *K;               /* keys of the slots one sequence's tokens see, transposed: (n_head_kv,
                             * head_dim_k, padded slots), so 16 slots' products are one vector */
    size_t K_n;
    float *krow;            /* one slot's keys as read */
    float *vtmp;            /* one slot's values, read along and dropped */
    double *sc;             /* (sc_th, sc_n) scores, a row per thread */
    size_t sc_n;
    int sc_th;
    int *tok;               /* batch indices of the tokens of one sequence */
    int tok_n;
};

ak_attn_stats *ak_attn_stats_new(const ak_model *m, const int *layers, int n, ak_error *err) {
    int L = m->cfg.n_layer;
    int def[3] = {0, L / 2, L - 1};
    if (!layers || n <= 0) { layers = def; n = 3; }
    if (n > AK_ATTN_STATS_MAX_LAYERS) {
        ak_failc(err, AK_ERR_INVALID, "attention statistics: %d layers chosen (%d at most)", n, AK_ATTN_STATS_MAX_LAYERS);
        return NULL;
    }
    ak_attn_stats *st = ak_calloc(1, sizeof *st, err);
    if (!st) return NULL;
    st->m = m;
    st->H = m->cfg.n_head;
    /* increasing and distinct: an insertion that skips duplicates */
    for (int i = 0; i < n; i++) {
        int l = layers[i];
        if (l < 0 || l >= L) {
            ak_failc(err, AK_ERR_INVALID, "attention statistics: layer %d is not in [0, %d)", l, L);
            free(st);
            return NULL;
        }
        int j = 0;
        while (j < st->nl && st->layers[j] < l) j++;
        if (j < st->nl && st->layers[j] == l) continue;
        memmove(st->layers + j + 1, st->layers + j, (size_t)(st->nl - j) * sizeof(int));
        st->layers[j] = l;
        st->nl++;
    }
    st->vtmp = ak_malloc((size_t)m->spec.n_head_kv * m->spec.head_dim_v * sizeof(float), err);
    st->krow = ak_malloc((size_t)m->spec.n_head_kv * m->spec.head_dim_k * sizeof(float), err);
    if (!st->vtmp || !st->krow) { free(st->vtmp); free(st->krow); free(st); return NULL; }
    return st;
}

void ak_attn_stats_free(ak_attn_stats *st) {
    if (!st) return;
    free(st->mass); free(st->ent); free(st->nq); free(st->seen);
    free(st->K); free(st->krow); free(st->vtmp); free(st->sc); free(st->tok);
    free(st);
}

void ak_attn_stats_reset(ak_attn_stats *st) {
    size_t rows = (size_t)st->nl * st->H;
    if (st->cap) {
        memset(st->mass, 0, rows * st->cap * sizeof(double));
        memset(st->ent, 0, rows * st->cap * sizeof(double));
        memset(st->nq, 0, (size_t)st->cap * sizeof(int64_t));
        memset(st->seen, 0, (size_t)st->nl * st->cap * sizeof(int64_t));
    }
    st->len = 0;
}

void ak_attn_stats_set_seq(ak_attn_stats *st, const ak_kv *kv) { st->seq = kv; }
int ak_attn_stats_n_layers(const ak_attn_stats *st) { return st->nl; }
int ak_attn_stats_layer(const ak_attn_stats *st, int i) { return st->layers[i]; }
int ak_attn_stats_n_heads(const ak_attn_stats *st) { return st->H; }
int ak_attn_stats_length(const ak_attn_stats *st) { return st->len; }

const double *ak_attn_stats_head_mass(const ak_attn_stats *st, int i, int h) {
    return st->mass + ((size_t)i * st->H + h) * st->cap;
}

void ak_attn_stats_mass(const ak_attn_stats *st, double *out) {
    for (int t = 0; t < st->len; t++) out[t] = 0;
    for (size_t r = 0; r < (size_t)st->nl * st->H; r++)
        for (int t = 0; t < st->len; t++) out[t] += st->mass[r * st->cap + t];
}

void ak_attn_stats_mass_var(const ak_attn_stats *st, double *out) {
    for (int t = 0; t < st->len; t++) {
        double acc = 0;
        for (int i = 0; i < st->nl; i++) {
            const double *row = st->mass + (size_t)i * st->H * st->cap + t;
            double mean = 0, var = 0;
            for (int h = 0; h < st->H; h++) mean += row[(size_t)h * st->cap];
            mean /= st->H;
            for (int h = 0; h < st->H; h++) {
                double d = row[(size_t)h * st->cap] - mean;
                var += d * d;
            }
            acc += var / st->H;
        }
        out[t] = acc / st->nl;
    }
}

void ak_attn_stats_entropy(const ak_attn_stats *st, double *out) {
    for (int t = 0; t < st->len; t++) {
        double acc = 0;
        for (size_t r = 0; r < (size_t)st->nl * st->H; r++) acc += st->ent[r * st->cap + t];
        out[t] = st->nq[t] ? acc / ((double)st->nq[t] * st->nl * st->H) : 0;
    }
}

void ak_attn_stats_query_count(const ak_attn_stats *st, int64_t *out) {
    memcpy(out, st->nq, (size_t)st->len * sizeof(int64_t));
}

void ak_attn_stats_exposure(const ak_attn_stats *st, double *out) {
    for (int t = 0; t < st->len; t++) {
        int64_t sum = 0;
        for (int i = 0; i < st->nl; i++) sum += st->seen[(size_t)i * st->cap + t];
        out[t] = (double)sum / st->nl;
    }
}

/* Makes room for slots [0, n): the per-(layer, head) rows are re-laid out
 * at the new capacity, new slots zero. */
static int grow(ak_attn_stats *st, int n, ak_error *err) {
    if (n > st->len) st->len = n;
    if (n <= st->cap) return 0;
    int cap = st->cap ? st->cap : 64;
    while (cap < n) cap *= 2;
    size_t rows = (size_t)st->nl * st->H;
    double *mass = ak_calloc(rows * cap, sizeof(double), err);
    double *ent = ak_calloc(rows * cap, sizeof(double), err);
    int64_t *nq = ak_calloc(cap, sizeof(int64_t), err);
    int64_t *seen = ak_calloc((size_t)st->nl * cap, sizeof(int64_t), err);
    if (!mass || !ent || !nq || !seen) { free(mass); free(ent); free(nq); free(seen); return -1; }
    for (size_t r = 0; r < rows && st->cap; r++) {
        memcpy(mass + r * cap, st->mass + r * st->cap, st->cap * sizeof(double));
        memcpy(ent + r * cap, st->ent + r * st->cap, st->cap * sizeof(double));
    }
    for (int i = 0; i < st->nl && st->cap; i++)
        memcpy(seen + (size_t)i * cap, st->seen + (size_t)i * st->cap, st->cap * sizeof(int64_t));
    if (st->cap) memcpy(nq, st->nq, st->cap * sizeof(int64_t));
    free(st->mass); free(st->ent); free(st->nq); free(st->seen);
    st->mass = mass; st->ent = ent; st->nq = nq; st->seen = seen;
    st->cap = cap;
    return 0;
}

typedef double v8d __attribute__((vector_size(64)));
typedef float v8f_mem __attribute__((vector_size(32), aligned(4), may_alias));
#define LD8(p) __builtin_convertvector(*(const v8f_mem *)(const void *)(p), v8d)

/* Scores of 16 consecutive slots for NH query heads of one KV head, in
 * double: out[h][off + j] = scale * q[h] . k(t0 + j), kt being the KV head's
 * transposed keys (dk rows of sp slots). One lane per slot, so no
 * horizontal sums (each lane adds its products in dimension order), and
 * each key row loaded once for the NH heads. NH (1, 2 or 4) is a constant
 * at each call, so the 2 * NH sums stay in registers. */
static inline __attribute__((always_inline)) void scores16(int NH, const float *const *q, const float *kt, size_t sp,
                                                           int dk, int t0, double scale, double *const *out,
                                                           size_t off) {
    v8d acc[4][2] = {{{0}}};
    for (int e = 0; e < dk; e++) {
        const float *row = kt + (size_t)e * sp + t0;
        v8d k0 = LD8(row), k1 = LD8(row + 8);
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) {
            double qe = q[h][e];
            acc[h][0] += qe * k0;
            acc[h][1] += qe * k1;
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) {
        acc[h][0] *= scale;
        acc[h][1] *= scale;
        memcpy(out[h] + off, &acc[h][0], sizeof acc[h][0]);
        memcpy(out[h] + off + 8, &acc[h][1], sizeof acc[h][1]);
    }
}

/* The first slot a token at slot p sees on a layer with this window. */
static int first_seen(int p, int window) { return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0; }

typedef struct {
    ak_attn_stats *st;
    const ak_batch *b;
    int li;                 /* chosen layer index */
    int window;
    float scale;
    const float *q;
    size_t qstride;
    int klo;                /* first slot in st->K */
    size_t sp;              /* slots per row of st->K (a multiple of 16) */
    int nt;                 /* tokens in st->tok */
} observe_task;

/* Thread ith takes KV heads ith, ith + nth, ... with their query heads:
 * each key row is loaded once for the group, and each query head's rows of
 * mass and entropy are written by one thread only. */
static void observe_worker(void *ud, int ith, int nth) {
    observe_task *o = ud;
    ak_attn_stats *st = o->st;
    const ak_model *m = st->m;
    int dk = m->spec.head_dim_k, Hkv = m->spec.n_head_kv, group = st->H / Hkv;
    double *sc = st->sc + st->sc_n * ith;   /* (group, sp): each head's scores */
    for (int g = ith; g < Hkv; g += nth) {
        const float *kt = st->K + (size_t)g * dk * o->sp;
        for (int j = 0; j < o->nt; j++) {
            int i = st->tok[j], p = o->b->pos[i], lo = first_seen(p, o->window);
            /* whole 16-slot groups from the one holding lo; head hh's slot lo
             * lands at sc[hh * sp + a - a0] */
            int a = lo - o->klo, a0 = a & ~15, b = p - o->klo;
            for (int h0 = 0; h0 < group;) {
                int nh = group - h0 >= 4 ? 4 : group - h0 >= 2 ? 2 : 1;
                const float *qs[4];
                double *outs[4];
                for (int k = 0; k < nh; k++) {
                    qs[k] = o->q + (size_t)i * o->qstride + (size_t)(g * group + h0 + k) * dk;
                    outs[k] = sc + (size_t)(h0 + k) * o->sp;
                }
                for (int t0 = a0; t0 <= b; t0 += 16) {
                    if (nh == 4) scores16(4, qs, kt, o->sp, dk, t0, o->scale, outs, (size_t)(t0 - a0));
                    else if (nh == 2) scores16(2, qs, kt, o->sp, dk, t0, o->scale, outs, (size_t)(t0 - a0));
                    else scores16(1, qs, kt, o->sp, dk, t0, o->scale, outs, (size_t)(t0 - a0));
                }
                h0 += nh;
            }
            for (int hh = 0; hh < group; hh++) {
                int h = g * group + hh;
                double *mass = st->mass + ((size_t)o->li * st->H + h) * st->cap;
                double *ent = st->ent + ((size_t)o->li * st->H + h) * st->cap;
                double *s = sc + (size_t)hh * o->sp + (a - a0), mx = -INFINITY;
                for (int t = 0; t <= p - lo; t++)
                    if (s[t] > mx) mx = s[t];
                /* e^(s - mx) 16 at a time in float (relative error < 3e-7,
                 * vmath.h; a libm exp per score would cost more than the
                 * products), weights and sums in double */
                int n = p - lo + 1;
                double z = 0, ws = 0;
                for (int t0 = 0; t0 < n; t0 += 16) {
                    ak_v16f x;
                    for (int k = 0; k < 16; k++) x[k] = t0 + k < n ? (float)(s[t0 + k] - mx) : -INFINITY;
                    ak_exp_v16(&x);
                    for (int k = 0; k < 16 && t0 + k < n; k++) {
                        ws += x[k] * (s[t0 + k] - mx);
                        s[t0 + k] = x[k];
                        z += x[k];
                    }
                }
                /* -sum p ln p with p = w / z and ln w = s - mx: ln z - sum w (s - mx) / z */
                ent[p] += log(z) - ws / z;
                double iz = 1 / z;
                for (int t = lo; t <= p; t++) mass[t] += s[t - lo] * iz;
            }
        }
    }
}

int ak_attn_stats_observe(ak_attn_stats *st, ak_threads *pool, const ak_batch *b, int layer, const float *q,
                          size_t qstride, ak_error *err) {
    int li = -1;
    for (int i = 0; i < st->nl; i++)
        if (st->layers[i] == layer) li = i;
    if (li < 0) return 0;
    const ak_model *m = st->m;
    int window = m->layers[layer].window, nth = pool ? ak_threads_size(pool) : 1;
    size_t kstride = (size_t)m->spec.n_head_kv * m->spec.head_dim_k;
    if (b->n > st->tok_n) {
        int *tok = realloc(st->tok, (size_t)b->n * sizeof(int));
        if (!tok) return ak_failc(err, AK_ERR_NOMEM, "out of memory for attention statistics");
        st->tok = tok;
        st->tok_n = b->n;
    }
    /* one sequence at a time: its keys are read back once for all its tokens */
    for (int i0 = 0; i0 < b->n; i0++) {
        const ak_kv *seq = b->seq[i0];
        if (st->seq && seq != st->seq) continue;
        int first = 1;
        for (int j = 0; j < i0 && first; j++) first = b->seq[j] != seq;
        if (!first) continue;
        int nt = 0, lo = b->pos[i0], hi = b->pos[i0];
        for (int i = i0; i < b->n; i++) {
            if (b->seq[i] != seq) continue;
            st->tok[nt++] = i;
            int l = first_seen(b->pos[i], window);
            if (l < lo) lo = l;
            if (b->pos[i] > hi) hi = b->pos[i];
        }
        if (grow(st, hi + 1, err) < 0) return -1;
        /* slots rounded up to 16, zeros past the last: scores16 reads whole groups */
        size_t slots = (size_t)(hi - lo + 1), sp = (slots + 15) & ~(size_t)15;
        if (sp * kstride > st->K_n) {
            float *K = realloc(st->K, sp * kstride * sizeof(float));
            if (!K) return ak_failc(err, AK_ERR_NOMEM, "out of memory for attention statistics");
            st->K = K;
            st->K_n = sp * kstride;
        }
        slots = sp;
        size_t need = slots * (size_t)(st->H / m->spec.n_head_kv);   /* a row per head of a group */
        if (need > st->sc_n || nth > st->sc_th) {
            size_t n = need > st->sc_n ? need : st->sc_n;
            double *sc = realloc(st->sc, n * (size_t)nth * sizeof(double));
            if (!sc) return ak_failc(err, AK_ERR_NOMEM, "out of memory for attention statistics");
            st->sc = sc;
            st->sc_n = n;
            st->sc_th = nth;
        }
        for (int t = lo; t <= hi; t++) {
            if (ak_kv_read(seq, layer, t, st->krow, st->vtmp, err) < 0) return -1;
            for (size_t e = 0; e < kstride; e++) st->K[e * sp + (t - lo)] = st->krow[e];
        }
        for (size_t e = 0; e < kstride; e++)
            for (size_t t = (size_t)(hi - lo + 1); t < sp; t++) st->K[e * sp + t] = 0;
        observe_task o = {.st = st, .b = b, .li = li, .window = window, .scale = m->cfg.attn_scale, .q = q,
                           .qstride = qstride, .klo = lo, .sp = sp, .nt = nt};
        ak_threads_run(pool, observe_worker, &o);
        /* a pass counts its queries once, at the first chosen layer; the
         * slots each query could see, at every chosen layer (windows) */
        int64_t *seen = st->seen + (size_t)li * st->cap;
        for (int j = 0; j < nt; j++) {
            int p = b->pos[st->tok[j]];
            if (li == 0) st->nq[p]++;
            for (int t = first_seen(p, window); t <= p; t++) seen[t]++;
        }
    }
    return 0;
}
