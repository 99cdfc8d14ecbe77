/* vmath.h - a little vector math on GCC/Clang vector extensions, which the
 * compiler turns into the target's SIMD (AVX-512, AVX2, NEON) or plain code,
 * so one source serves every back end.
 *
 * ak_exp_v16: e^x per lane, relative error below 3e-7 for x in [-87, 88]
 * (inputs outside are clamped there: e^-87 ~ 1.6e-38 stands in for 0, so no
 * denormals; e^88 ~ 1.7e38 for overflow; NaN gives e^-87). */
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
 * cannot be forwarded: a stall of ~20 cycles per vector (measured: prefill
 * attention 3x slower on a Xeon than on Zen 5). */
typedef float ak_v16f_mem __attribute__((vector_size(64), aligned(4), may_alias));
#define AK_V16F_LD(p) (*(const ak_v16f_mem *)(const void *)(p))
#define AK_V16F_ST(p, v) (*(ak_v16f_mem *)(void *)(p) = (v))
/* Per lane, a where the mask m (a vector comparison's result: -1 or 0) is
 * set, else b. */
#define AK_V16F_SELECT(m, a, b) ((ak_v16f)(((ak_v16i)(a) & (m)) | ((ak_v16i)(b) & ~(m))))

/* *v = e^(*v) per lane. x = n ln2 + r, |r| <= ln2/2 (n rounded with the
 * 1.5 * 2^23 trick), e^r by its degree-6 Taylor polynomial, 2^n through the
 * exponent bits. */
static inline void ak_exp_v16(ak_v16f *v) {
    const ak_v16f zero = {0}, lo = zero - 87.0f, hi = zero + 88.0f;
    /* clamp, as whole-vector selects; -inf and NaN (unused lanes past a
     * row's end) go to -87, so the conversion to int below is always in
     * range */
    ak_v16f t = AK_V16F_SELECT(*v >= lo, *v, lo);
    t = AK_V16F_SELECT(t > hi, hi, t);
    ak_v16f nf = (t * 1.44269504f + 12582912.0f) - 12582912.0f;
    ak_v16i n = __builtin_convertvector(nf, ak_v16i);
    ak_v16f r = t - nf * 0.693145752f - nf * 1.42860677e-6f;
    ak_v16f p = zero + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    ak_v16i e = (n + 127) << 23;
    ak_v16f scale;
    memcpy(&scale, &e, sizeof scale);
    *v = p * scale;
}

/* g[i] = silu(g[i]) * u[i] = g / (1 + e^-g) * u, i < n (SwiGLU's gate). */
static inline void ak_silu_mul(float *g, const float *u, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        ak_v16f x = AK_V16F_LD(g + i), uu = AK_V16F_LD(u + i), e;
        e = -x;
        ak_exp_v16(&e);
        x = x / (1.0f + e) * uu;
        AK_V16F_ST(g + i, x);
    }
    for (; i < n; i++) {
        ak_v16f e = {0};
        e[0] = -g[i];
        ak_exp_v16(&e);
        g[i] = g[i] / (1.0f + e[0]) * u[i];
    }
}

#endif
