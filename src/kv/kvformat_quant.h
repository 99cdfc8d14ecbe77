/* kvformat_quant.h - the element-wise loops of kvformat.c's quantizers, on
 * SIMD where the build has it (AVX-512, AVX2) and plain C elsewhere.
 *
 * Each function computes, bit for bit, what the plain C loop beside its
 * declaration computes, for every input including NaN and infinities: a
 * quantizer's bytes never depend on the build (stored blocks, cards and
 * their content hashes are compared across machines). Only element-wise
 * operations and max/min reductions (exact in any order) are vectorized;
 * sums stay with their callers, in their order. Internal to kvformat.c.
 */
#ifndef AK_KVFORMAT_QUANT_H
#define AK_KVFORMAT_QUANT_H

#include <stdint.h>

/* max(0, max_i |x[i]|), NaNs skipped (as fmaxf does). */
float ak_kvq_absmax(const float *x, int n);

/* *mn = the least of x[0..n), *mx = the greatest, NaNs skipped (NaN only
 * when every x is NaN), as the chain fminf(fminf(x[0], x[1]), ...) gives,
 * except that a zero result is +0 (which zero that chain returns depends
 * on the order of +0 and -0 in x; the stored bits must not). n >= 1. */
void ak_kvq_minmax(const float *x, int n, float *mn, float *mx);

/* q[i] = (int8_t)clamp(nearbyintf(x[i] / s), -127, 127) for s > 0 (a NaN
 * quotient gives 0), all 0 when s <= 0. */
void ak_kvq_q8_codes(const float *x, int n, float s, int8_t *q);

/* code[i] = (uint8_t)clamp(nearbyintf((x[i] - m) / s), 0, top) for s > 0
 * (a NaN quotient gives 0), all 0 when s <= 0. top <= 255. */
void ak_kvq_affine_codes(const float *x, int n, float m, float s, float top, uint8_t *code);

/* code[i] = the number of t < nb with y[i] > bound[t] (bound ascending,
 * nb <= 15): the nearest centroid of a sorted codebook. */
void ak_kvq_bucket_codes(const float *y, int n, const float *bound, int nb, uint8_t *code);

/* The in-place Walsh-Hadamard transform of m = 2^k values, normalized:
 * stage h = 1, 2, 4, ... < m: for each pair (j, j + h) of a 2h-run,
 * x[j] = a + b and x[j + h] = a - b (a, b the stage's inputs); then every
 * value times 1 / sqrtf(m). */
void ak_kvq_wht(float *x, int m);

#endif
