/* kernels_kquant_arm.c - NEON back end (AArch64) for kquant.h's types; the
 * contract is kernels_impl.h's, the reference kquant.c's scalar back end.
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
 */
#include "kquant.h"

#if defined(AK_SIMD_NEON)
#include <arm_neon.h>

#include "util.h"

/* acc + sums of 4 products per lane of 16 bytes a and b. */
AK_INLINE int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    p = vmlal_s8(p, vget_high_s8(a), vget_high_s8(b));
    return vpadalq_s16(acc, p);
#endif
}

/* The same bytes, as signed (values here are 0..63). */
AK_INLINE int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

/* Bits 0..15 of h as bytes 0x10 (set) or 0 (clear). */
AK_INLINE uint8x16_t bits16_to_0x10(uint32_t h) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t v = vcombine_u8(vdup_n_u8((uint8_t)(h & 0xff)), vdup_n_u8((uint8_t)((h >> 8) & 0xff)));
    return vandq_u8(vtstq_u8(v, vld1q_u8(bit)), vdupq_n_u8(0x10));
}

/* dot of one row of a K type with one token's XQ records (nsb of them). */
static float row_dot_k(uint32_t wtype, const uint8_t *w, const ak_xq_k *x, int64_t nsb) {
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(0x03);
    float sum = 0;
    if (wtype == GGML_TYPE_Q6_K) {
        for (int64_t b = 0; b < nsb; b++, w += 210, x++) {
            const int8_t *sc = (const int8_t *)(w + 192);
            int32x4_t acc = vdupq_n_s32(0);
            for (int n = 0; n < 2; n++) {
                const uint8_t *ql = w + 64 * n, *qh = w + 128 + 32 * n;
                for (int h = 0; h < 2; h++) {   /* elements l = 16h .. 16h + 15 of each group */
                    uint8x16_t l0 = vld1q_u8(ql + 16 * h), l1 = vld1q_u8(ql + 32 + 16 * h);
                    uint8x16_t hb = vld1q_u8(qh + 16 * h);
                    uint8x16_t u[4];
                    u[0] = vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8(vandq_u8(hb, m3), 4));
                    u[1] = vorrq_u8(vandq_u8(l1, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), m3), 4));
                    u[2] = vorrq_u8(vshrq_n_u8(l0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), m3), 4));
                    u[3] = vorrq_u8(vshrq_n_u8(l1, 4), vshlq_n_u8(vshrq_n_u8(hb, 6), 4));
                    for (int k = 0; k < 4; k++) {   /* group 4n + k, sub-block 2(4n + k) + h */
                        int e = 128 * n + 32 * k + 16 * h;
                        acc = vmlaq_n_s32(acc, dot16(vdupq_n_s32(0), s8(u[k]), vld1q_s8(x->q + e)), sc[e / 16]);
                    }
                }
            }
            int corr = 0;
            for (int j = 0; j < 16; j++) corr += 32 * sc[j] * x->bsums[j];
            sum += x->d * ak_f16_to_f32(ak_load_u16(w + 208)) * (float)(vaddvq_s32(acc) - corr);
        }
        return sum;
    }
    const int q5 = wtype == GGML_TYPE_Q5_K;
    const size_t bb = q5 ? 176 : 144;
    for (int64_t b = 0; b < nsb; b++, w += bb, x++) {
        uint8_t sc[8], mn[8];
        ak_kq_scales_k4(w + 4, sc, mn);
        const uint8_t *qs = w + (q5 ? 48 : 16), *qh = w + 16;
        int32x4_t acc = vdupq_n_s32(0);
        for (int c = 0; c < 4; c++)
            for (int h = 0; h < 2; h++) {   /* bytes 16h .. 16h + 15 of the chunk */
                uint8x16_t q = vld1q_u8(qs + 32 * c + 16 * h);
                uint8x16_t lo = vandq_u8(q, m4), hi = vshrq_n_u8(q, 4);
                if (q5) {
                    uint8x16_t hb = vld1q_u8(qh + 16 * h);
                    uint8x16_t bl = vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)-(2 * c))), vdupq_n_u8(1));
                    uint8x16_t bh = vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)-(2 * c + 1))), vdupq_n_u8(1));
                    lo = vorrq_u8(lo, vshlq_n_u8(bl, 4));
                    hi = vorrq_u8(hi, vshlq_n_u8(bh, 4));
                }
                acc = vmlaq_n_s32(acc, dot16(vdupq_n_s32(0), s8(lo), vld1q_s8(x->q + 64 * c + 16 * h)), sc[2 * c]);
                acc = vmlaq_n_s32(acc, dot16(vdupq_n_s32(0), s8(hi), vld1q_s8(x->q + 64 * c + 32 + 16 * h)),
                                  sc[2 * c + 1]);
            }
        int msum = 0;
        for (int j = 0; j < 8; j++) msum += mn[j] * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
        float d = ak_f16_to_f32(ak_load_u16(w)), dmin = ak_f16_to_f32(ak_load_u16(w + 2));
        sum += x->d * (d * (float)vaddvq_s32(acc) - dmin * (float)msum);
    }
    return sum;
}

/* dot of one row of a 32-block type with one token's XQ (q, d, s). */
static float row_dot_32(uint32_t wtype, const uint8_t *w, const int8_t *q, const float *ds, const float *ss,
                        int64_t nb) {
    const size_t bb = wtype == GGML_TYPE_Q4_1 ? 20 : wtype == GGML_TYPE_Q5_0 ? 22 : 24;
    const int qs_off = wtype == GGML_TYPE_Q4_1 ? 4 : wtype == GGML_TYPE_Q5_0 ? 6 : 8;
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    float sum = 0;
    for (int64_t b = 0; b < nb; b++, w += bb, q += 32) {
        uint8x16_t v = vld1q_u8(w + qs_off);
        uint8x16_t lo = vandq_u8(v, m4), hi = vshrq_n_u8(v, 4);
        if (wtype != GGML_TYPE_Q4_1) {
            const uint8_t *p = w + (wtype == GGML_TYPE_Q5_0 ? 2 : 4);
            uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            lo = vorrq_u8(lo, bits16_to_0x10(h));
            hi = vorrq_u8(hi, bits16_to_0x10(h >> 16));
        }
        int32_t isum = vaddvq_s32(dot16(dot16(vdupq_n_s32(0), s8(lo), vld1q_s8(q)), s8(hi), vld1q_s8(q + 16)));
        float d = ak_f16_to_f32(ak_load_u16(w));
        float extra = wtype == GGML_TYPE_Q5_0 ? -16.0f * d : ak_f16_to_f32(ak_load_u16(w + 2));
        sum += d * ds[b] * (float)isum + extra * ss[b];
    }
    return sum;
}

/* kernels_impl.h's mm_q contract, one row and token at a time. */
static void mm_q(uint32_t wtype, const uint8_t *W, size_t wrb, int64_t r0, int64_t r1, int64_t cols,
                 const uint8_t *xq, size_t xqs, int64_t t0, int64_t t1, float *Y, int64_t ldy) {
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *x = xq + (size_t)t * xqs;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *w = W + (size_t)r * wrb;
            if (ak_kq_is_k(wtype)) {
                Y[t * ldy + r] = row_dot_k(wtype, w, (const ak_xq_k *)x, cols / AK_QKK);
            } else {
                const int64_t nb = cols / AK_QK;
                const float *ds = (const float *)(x + cols);
                Y[t * ldy + r] = row_dot_32(wtype, w, (const int8_t *)x, ds, ds + nb, nb);
            }
        }
    }
}

const ak_kernel_backend ak_kq_backend_simd = {
    "neon", ak_kq_xq_row_bytes, ak_kq_quantize_x, mm_q, NULL, NULL, NULL,
};

#else
typedef int ak_kernels_kquant_arm_unused;   /* ISO C wants a non-empty file */
#endif
