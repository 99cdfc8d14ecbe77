/* kernels_kquant_arm.c - NEON back end (AArch64) for kquant.h's types; the
 * contract is kernels_backend.h's, the reference kquant.c's scalar back end.
 *
 * Quants are unpacked to bytes 0..63 (Q6_K: q + 32), which are valid signed
 * bytes, so the signed x signed products of SDOT (vdotq_s32) apply directly;
 * without the dot-product extension, vmull_s8/vmlal_s8 pairs (at most
 * 2 * 63 * 127, no 16-bit overflow) and a pairwise widening add. Each
 * sub-block's four lane sums are scaled by its integer scale with one
 * multiply-accumulate (vmlaq_n_s32) into an exact int32 accumulator; the
 * float work (d * dx, the min / offset term from the activation sums) is
 * once per super-block. One row and token at a time: on the machines this
 * targets decode is bandwidth-bound; prefill tiles are left for later.
 *
 * SDOT or its plain form is chosen per product at run time (ak_neon_level),
 * not by the build's target: the row dots are kernels_kquant_arm_rows.h
 * compiled once for baseline armv8-a and once under the dot-product target
 * pragma; both give the same bits.
 */
#include "kernels/kquant.h"

#if defined(AK_SIMD_NEON)
#include <arm_neon.h>

#include "base/util.h"

/* The same bytes, as signed (values here are 0..63). */
AK_INLINE int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

/* Bits 0..15 of h as bytes 0x10 (set) or 0 (clear). */
AK_INLINE uint8x16_t bits16_to_0x10(uint32_t h) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t v = vcombine_u8(vdup_n_u8((uint8_t)(h & 0xff)), vdup_n_u8((uint8_t)((h >> 8) & 0xff)));
    return vandq_u8(vtstq_u8(v, vld1q_u8(bit)), vdupq_n_u8(0x10));
}

/* The two copies of the row dots: *_plain and *_dot. */
#define NL 0
#define NL_SFX _plain
#include "kernels/kernels_kquant_arm_rows.h"
#undef NL
#undef NL_SFX

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#define NL 1
#define NL_SFX _dot
#include "kernels/kernels_kquant_arm_rows.h"
#undef NL
#undef NL_SFX
#pragma GCC pop_options

/* kernels_backend.h's mm_q contract, one row and token at a time. */
static void mm_q(const ak_mm_args *a) {
    const uint32_t wtype = a->wtype;
    const int64_t cols = a->cols, ldy = a->ldy;
    float *Y = a->Y;
    const int dot = ak_neon_level() >= 1;
    for (int64_t t = a->t0; t < a->t1; t++) {
        const uint8_t *x = a->xq + (size_t)t * a->xqs;
        for (int64_t r = a->r0; r < a->r1; r++) {
            const uint8_t *w = a->W + (size_t)r * a->wrb;
            if (ak_kq_is_k(wtype)) {
                const ak_xq_k *xk = (const ak_xq_k *)x;
                const int64_t nsb = cols / AK_QKK;
                Y[t * ldy + r] = dot ? row_dot_k_dot(wtype, w, xk, nsb) : row_dot_k_plain(wtype, w, xk, nsb);
            } else {
                const int64_t nb = cols / AK_QK;
                const float *ds = (const float *)(x + cols);
                const int8_t *q = (const int8_t *)x;
                Y[t * ldy + r] = dot ? row_dot_32_dot(wtype, w, q, ds, ds + nb, nb)
                                     : row_dot_32_plain(wtype, w, q, ds, ds + nb, nb);
            }
        }
    }
}

const ak_kernel_backend ak_kq_backend_simd = {
    .name = "neon", .xq_row_bytes = ak_kq_xq_row_bytes, .quantize_x = ak_kq_quantize_x, .mm_q = mm_q,
};

#else
typedef int ak_kernels_kquant_arm_unused;   /* ISO C wants a non-empty file */
#endif
