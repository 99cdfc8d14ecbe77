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

typedef float ak_v16f __attribute__((vector_size(64), aligned(4)));
typedef int32_t ak_v16i __attribute__((vector_size(64)));

static inline ak_v16f ak_v16f_load(const float *p) {
    ak_v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void ak_v16f_store(float *p, ak_v16f v) { memcpy(p, &v, sizeof v); }

/* x = n ln2 + r with |r| <= ln2/2 (n rounded with the 1.5 * 2^23 trick),
 * e^r by its degree-6 Taylor polynomial, 2^n through the exponent bits. */
static inline ak_v16f ak_exp_v16(ak_v16f x) {
    const ak_v16f zero = {0};
    ak_v16f t;
    /* clamp; -inf and NaN (unused lanes past a row's end) go to -87, so
     * the conversion to int below is always in range */
    for (int i = 0; i < 16; i++) t[i] = !(x[i] >= -87.0f) ? -87.0f : x[i] > 88.0f ? 88.0f : x[i];
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
    return p * scale;
}

/* g[i] = silu(g[i]) * u[i] = g / (1 + e^-g) * u, i < n (SwiGLU's gate). */
static inline void ak_silu_mul(float *g, const float *u, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        ak_v16f x = ak_v16f_load(g + i);
        ak_v16f_store(g + i, x / (1.0f + ak_exp_v16(-x)) * ak_v16f_load(u + i));
    }
    for (; i < n; i++) {
        ak_v16f x = {0};
        x[0] = -g[i];
        g[i] = g[i] / (1.0f + ak_exp_v16(x)[0]) * u[i];
    }
}

#endif
