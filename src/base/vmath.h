/* vmath.h - a little vector math on GCC/Clang vector extensions, which the
 * compiler turns into the target's SIMD (AVX-512, AVX2, NEON) or plain code,
 * so one source serves every back end: the exponential, SwiGLU's gate, and
 * the inner loops of attention over a block decoded to f32 (kvcache.c):
 * scores, online softmax, weighted values.
 *
 * ak_exp_v16 / ak_exp_vf: e^x per lane, relative error below 3e-7 for x in
 * [-87, 88] (inputs outside are clamped there: e^-87 ~ 1.6e-38 stands in for
 * 0, so no denormals; e^88 ~ 1.7e38 for overflow; NaN gives e^-87). The
 * formula is per lane, so a lane's result does not depend on the width. */
#ifndef AK_VMATH_H
#define AK_VMATH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Vectors are passed by pointer only: by value, GCC notes on targets
 * without AVX-512 that the calling convention of 64-byte vectors changed. */
typedef float ak_v16f __attribute__((vector_size(64), aligned(4)));
typedef int32_t ak_v16i __attribute__((vector_size(64)));

/* 16 floats from or to memory (any alignment), as one vector access. Not
 * memcpy: with the tuning -march=native picks on Intel server cores
 * (prefer 256-bit vectors) GCC copies 64 bytes as two 32-byte halves
 * through the stack, and the 64-byte load that follows two 32-byte stores
 * cannot be forwarded: a stall per vector (docs/speed.md). */
typedef float ak_v16f_mem __attribute__((vector_size(64), aligned(4), may_alias));
#define AK_V16F_LD(p) (*(const ak_v16f_mem *)(const void *)(p))
#define AK_V16F_ST(p, v) (*(ak_v16f_mem *)(void *)(p) = (v))
/* Per lane, a where the mask m (a vector comparison's result: -1 or 0) is
 * set, else b. */
#define AK_V16F_SELECT(m, a, b) ((ak_v16f)(((ak_v16i)(a) & (m)) | ((ak_v16i)(b) & ~(m))))

/* The target's own vector width (AK_VF_N floats: 64 bytes with AVX-512, 32
 * with AVX, else 16). Why not 64 bytes everywhere: GCC 12 keeps a 64-byte
 * vector on an AVX2 target in memory, not in two ymm registers, and builds
 * each broadcast through the stack (attention's score loop at x86-64-v3 ran
 * at about a fifth of the speed of the same loop on 32-byte vectors). Loops
 * that keep vectors in registers across iterations use this type. */
#if defined(__AVX512F__)
#define AK_VF_N 16
#elif defined(__AVX__)
#define AK_VF_N 8
#else
#define AK_VF_N 4
#endif
typedef float ak_vf __attribute__((vector_size(4 * AK_VF_N), aligned(4)));
typedef int32_t ak_vi __attribute__((vector_size(4 * AK_VF_N)));
typedef float ak_vf_mem __attribute__((vector_size(4 * AK_VF_N), aligned(4), may_alias));
#define AK_VF_LD(p) (*(const ak_vf_mem *)(const void *)(p))
#define AK_VF_ST(p, v) (*(ak_vf_mem *)(void *)(p) = (v))
#define AK_VF_SELECT(m, a, b) ((ak_vf)(((ak_vi)(a) & (m)) | ((ak_vi)(b) & ~(m))))

/* *v = e^(*v) per lane. x = n ln2 + r, |r| <= ln2/2 (n rounded with the
 * 1.5 * 2^23 trick), e^r by its degree-6 Taylor polynomial, 2^n through the
 * exponent bits. One body for both widths (VT, VI: float and int vector
 * types, SEL their select). */
#define AK_EXP_BODY(VT, VI, SEL)                                                  \
    const VT zero = {0}, lo = zero - 87.0f, hi = zero + 88.0f;                    \
    /* clamp, as whole-vector selects; -inf and NaN (unused lanes past a      \
     * row's end) go to -87, so the conversion to int below is always in      \
     * range */                                                               \
    VT t = SEL(*v >= lo, *v, lo);                                             \
    t = SEL(t > hi, hi, t);                                                   \
    VT nf = (t * 1.44269504f + 12582912.0f) - 12582912.0f;                    \
    VI n = __builtin_convertvector(nf, VI);                                   \
    VT r = t - nf * 0.693145752f - nf * 1.42860677e-6f;                       \
    VT p = zero + 1.0f / 720;                                                 \
    p = p * r + 1.0f / 120;                                                   \
    p = p * r + 1.0f / 24;                                                    \
    p = p * r + 1.0f / 6;                                                     \
    p = p * r + 0.5f;                                                         \
    p = p * r + 1.0f;                                                         \
    p = p * r + 1.0f;                                                         \
    VI e = (n + 127) << 23;                                                   \
    VT scale;                                                                 \
    memcpy(&scale, &e, sizeof scale);                                         \
    *v = p * scale

/* *v = e^(*v), 16 lanes (callers that work in sixteens; on targets
 * narrower than 64 bytes prefer ak_exp_vf in loops). */
static inline void ak_exp_v16(ak_v16f *v) { AK_EXP_BODY(ak_v16f, ak_v16i, AK_V16F_SELECT); }
/* *v = e^(*v), the target's width. */
static inline void ak_exp_vf(ak_vf *v) { AK_EXP_BODY(ak_vf, ak_vi, AK_VF_SELECT); }

/* g[i] = silu(g[i]) * u[i] = g / (1 + e^-g) * u, i < n (SwiGLU's gate). */
static inline void ak_silu_mul(float *g, const float *u, size_t n) {
    size_t i = 0;
    for (; i + AK_VF_N <= n; i += AK_VF_N) {
        ak_vf x = AK_VF_LD(g + i), uu = AK_VF_LD(u + i), e;
        e = -x;
        ak_exp_vf(&e);
        x = x / (1.0f + e) * uu;
        AK_VF_ST(g + i, x);
    }
    for (; i < n; i++) {
        ak_vf e = {0};
        e[0] = -g[i];
        ak_exp_vf(&e);
        g[i] = g[i] / (1.0f + e[0]) * u[i];
    }
}

/* ---- attention over a block decoded to f32 (kvcache.c) --------------------
 * Each function's arithmetic for one row (query) depends only on that row's
 * data, never on which rows are computed beside it: batch invariance. The
 * order of the sums is fixed per target width (AK_VF_N), so two builds for
 * the same level give the same bits. */

/* Lane numbers 0..AK_VF_N-1, and the horizontal maximum and sum as trees
 * (lane i with lane i ^ s for s = N/2 .. 1, whole-vector shuffles: log2 N
 * dependent steps, not N). */
#if defined(__clang__)
#define AK_VF_SHUF(v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#else
#define AK_VF_SHUF(v, ...) __builtin_shuffle(v, (ak_vi){__VA_ARGS__})
#endif
#if AK_VF_N == 16
#define AK_VF_IOTA {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
#define AK_VF_FOLD(v, OP)                                                              \
    do {                                                                               \
        OP(v, AK_VF_SHUF(v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));    \
        OP(v, AK_VF_SHUF(v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));    \
        OP(v, AK_VF_SHUF(v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));    \
        OP(v, AK_VF_SHUF(v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));    \
    } while (0)
#elif AK_VF_N == 8
#define AK_VF_IOTA {0, 1, 2, 3, 4, 5, 6, 7}
#define AK_VF_FOLD(v, OP)                                \
    do {                                                 \
        OP(v, AK_VF_SHUF(v, 4, 5, 6, 7, 0, 1, 2, 3));    \
        OP(v, AK_VF_SHUF(v, 2, 3, 0, 1, 6, 7, 4, 5));    \
        OP(v, AK_VF_SHUF(v, 1, 0, 3, 2, 5, 4, 7, 6));    \
    } while (0)
#else
#define AK_VF_IOTA {0, 1, 2, 3}
#define AK_VF_FOLD(v, OP)                    \
    do {                                     \
        OP(v, AK_VF_SHUF(v, 2, 3, 0, 1));    \
        OP(v, AK_VF_SHUF(v, 1, 0, 3, 2));    \
    } while (0)
#endif
#define AK_VF_MAX_INTO(a, b)                     \
    do {                                         \
        ak_vf b_ = (b);                          \
        (a) = AK_VF_SELECT(b_ > (a), b_, (a));   \
    } while (0)
#define AK_VF_ADD_INTO(a, b) ((a) += (b))
static inline float ak_vf_hmax(ak_vf v) {
    AK_VF_FOLD(v, AK_VF_MAX_INTO);
    return v[0];
}
static inline float ak_vf_hsum(ak_vf v) {
    AK_VF_FOLD(v, AK_VF_ADD_INTO);
    return v[0];
}

/* x[0..n) *= f, a vector at a time (a row about to be read as vectors:
 * scalar stores just before would make those loads wait, as they cannot be
 * forwarded from several narrower stores). */
static inline void ak_scale_row(float *x, int n, float f) {
    int d = 0;
    for (; d + AK_VF_N <= n; d += AK_VF_N) AK_VF_ST(x + d, AK_VF_LD(x + d) * f);
    for (; d < n; d++) x[d] *= f;
}

/* Online softmax, step 1: sc[j] = (sc[j] + add) * scale for lo <= j < c,
 * -inf for the other j < c rounded up to AK_VF_N (sc must have room);
 * returns the maximum (-inf if lo >= c). */
static inline float ak_softmax_scale_max(float *sc, int lo, int c, float add, float scale) {
    const ak_vi lane = AK_VF_IOTA;
    const ak_vf ninf = (ak_vf){0} - __builtin_inff();
    ak_vf mx = ninf;
    for (int j0 = 0; j0 < c; j0 += AK_VF_N) {
        ak_vf v = (AK_VF_LD(sc + j0) + add) * scale;
        v = AK_VF_SELECT((lane < c - j0) & (lane >= lo - j0), v, ninf);
        AK_VF_ST(sc + j0, v);
        AK_VF_MAX_INTO(mx, v);
    }
    return ak_vf_hmax(mx);
}

/* Step 2: sc[j] = e^(sc[j] - m) for lo <= j < c, 0 for the other j < c
 * rounded up to AK_VF_N; returns their sum. */
static inline float ak_softmax_exp_sum(float *sc, int lo, int c, float m) {
    const ak_vi lane = AK_VF_IOTA;
    ak_vf sum = {0};
    for (int j0 = 0; j0 < c; j0 += AK_VF_N) {
        ak_vf v = AK_VF_LD(sc + j0) - m;
        ak_exp_vf(&v);   /* masked keys: e^-inf, clamped to e^-87; zeroed next */
        v = AK_VF_SELECT((lane < c - j0) & (lane >= lo - j0), v, (ak_vf){0});
        AK_VF_ST(sc + j0, v);
        sum += v;
    }
    return ak_vf_hsum(sum);
}

/* Key vectors per tile of the score loop: 4 queries x AK_ATT_KV vectors of
 * accumulators stay in registers with the keys and a broadcast beside them
 * (AVX-512: 8 of 32 registers, 32 keys; AVX2: 8 of 16, 16 keys; 16-byte
 * vectors: 16 keys). */
#if AK_VF_N >= 8
#define AK_ATT_KV 2
#else
#define AK_ATT_KV 4
#endif

/* Scores of NR (1..4) queries against keys kt (dk x Tp, transposed, Tp a
 * multiple of 16): s[i * Tp + j] = q_i . k_j for j < Tp. NR is a constant
 * where this is inlined, so the accumulators stay in registers: NR x
 * AK_ATT_KV independent chains of vector FMAs (when the file is compiled
 * with contraction; kvcache.c is). */
static inline __attribute__((always_inline)) void ak_attn_scores_n(const int NR, const float *const *q, const float *kt,
                                                                   int dk, int Tp, float *s) {
    int j0 = 0;
    for (; j0 + AK_ATT_KV * AK_VF_N <= Tp; j0 += AK_ATT_KV * AK_VF_N) {
        ak_vf a[4][AK_ATT_KV];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < NR; i++)
            _Pragma("GCC unroll 4")
            for (int u = 0; u < AK_ATT_KV; u++) a[i][u] = (ak_vf){0};
        for (int d = 0; d < dk; d++) {
            ak_vf k[AK_ATT_KV];
            _Pragma("GCC unroll 4")
            for (int u = 0; u < AK_ATT_KV; u++) k[u] = AK_VF_LD(kt + (size_t)d * Tp + j0 + u * AK_VF_N);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < NR; i++)
                _Pragma("GCC unroll 4")
                for (int u = 0; u < AK_ATT_KV; u++) a[i][u] += q[i][d] * k[u];
        }
        _Pragma("GCC unroll 4")
        for (int i = 0; i < NR; i++)
            _Pragma("GCC unroll 4")
            for (int u = 0; u < AK_ATT_KV; u++) AK_VF_ST(s + (size_t)i * Tp + j0 + u * AK_VF_N, a[i][u]);
    }
    for (; j0 < Tp; j0 += AK_VF_N) {   /* vectors of keys left, one at a time */
        ak_vf a[4];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < NR; i++) a[i] = (ak_vf){0};
        for (int d = 0; d < dk; d++) {
            ak_vf k = AK_VF_LD(kt + (size_t)d * Tp + j0);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < NR; i++) a[i] += q[i][d] * k;
        }
        _Pragma("GCC unroll 4")
        for (int i = 0; i < NR; i++) AK_VF_ST(s + (size_t)i * Tp + j0, a[i]);
    }
}
static inline void ak_attn_scores(const float *const *q, int nr, const float *kt, int dk, int Tp, float *s) {
    switch (nr) {
    case 1: ak_attn_scores_n(1, q, kt, dk, Tp, s); break;
    case 2: ak_attn_scores_n(2, q, kt, dk, Tp, s); break;
    case 3: ak_attn_scores_n(3, q, kt, dk, Tp, s); break;
    default: ak_attn_scores_n(4, q, kt, dk, Tp, s); break;
    }
}

/* acc[d0 .. d0 + NC * AK_VF_N) += sum_{j < c} p[j] * v_j for values v
 * (rows dv floats apart): keys two at a time, so that 2 NC chains of FMAs
 * are in flight (one chain per vector would wait on the FMA's latency). */
static inline __attribute__((always_inline)) void ak_attn_values_n(const int NC, const float *p, int c, const float *v,
                                                                   int dv, int d0, float *acc) {
    ak_vf a[4], b[4];
    _Pragma("GCC unroll 4")
    for (int k = 0; k < NC; k++) {
        a[k] = AK_VF_LD(acc + d0 + k * AK_VF_N);
        b[k] = (ak_vf){0};
    }
    int j = 0;
    for (; j + 2 <= c; j += 2) {
        const float *x = v + (size_t)j * dv + d0, *y = x + dv;
        _Pragma("GCC unroll 4")
        for (int k = 0; k < NC; k++) {
            a[k] += p[j] * AK_VF_LD(x + k * AK_VF_N);
            b[k] += p[j + 1] * AK_VF_LD(y + k * AK_VF_N);
        }
    }
    if (j < c)
        _Pragma("GCC unroll 4")
        for (int k = 0; k < NC; k++) a[k] += p[j] * AK_VF_LD(v + (size_t)j * dv + d0 + k * AK_VF_N);
    _Pragma("GCC unroll 4")
    for (int k = 0; k < NC; k++) AK_VF_ST(acc + d0 + k * AK_VF_N, a[k] + b[k]);
}
/* acc[0..dv) += sum_{j < c} p[j] * v_j (values as rows, dv floats apart). */
static inline void ak_attn_values(const float *p, int c, const float *v, int dv, float *acc) {
    int d0 = 0;
    for (; d0 + 4 * AK_VF_N <= dv; d0 += 4 * AK_VF_N) ak_attn_values_n(4, p, c, v, dv, d0, acc);
    for (; d0 + AK_VF_N <= dv; d0 += AK_VF_N) ak_attn_values_n(1, p, c, v, dv, d0, acc);
    for (; d0 < dv; d0++)
        for (int j = 0; j < c; j++) acc[d0] += p[j] * v[(size_t)j * dv + d0];
}

#endif
