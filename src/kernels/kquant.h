/* kquant.h - ggml's "K-quant" and legacy 32-block weight types beyond Q8_0 and
 * Q4_0: formats, quantizers, dequantizers and the kernel back ends that
 * multiply them with 8-bit activations. Internal to the kernels: the public
 * entry points stay those of kernels.h (ak_quantize_row, ak_matmul, ...),
 * which dispatch here for these types through kernels_backend.h (where the
 * row sizes, row quantizers and back ends of these types are declared);
 * this header holds what the K-quant back ends share beyond that.
 *
 * Formats (byte-exact with GGUF files written by llama.cpp; d, dmin, m are
 * IEEE halves, little-endian):
 *   Q4_1 (32, 20 B):  d, m, 16 B nibbles (byte j: element j low, j+16 high);
 *                     x = d * q + m
 *   Q5_0 (32, 22 B):  d, u32 qh (bit j: 5th bit of element j), 16 B nibbles;
 *                     x = d * (q - 16)
 *   Q5_1 (32, 24 B):  d, m, u32 qh, 16 B nibbles; x = d * q + m
 *   Q4_K (256, 144 B): d, dmin, 12 B of 6-bit scales sc[8] and mins mn[8]
 *                     (one pair per sub-block of 32), 128 B of nibbles:
 *                     byte 32c + l holds element 64c + l (low nibble) and
 *                     64c + 32 + l (high); x = d * sc[j] * q - dmin * mn[j]
 *   Q5_K (256, 176 B): d, dmin, 12 B scales, 32 B qh (bit 2c of qh[l] is the
 *                     5th bit of element 64c + l, bit 2c + 1 that of
 *                     64c + 32 + l), 128 B nibbles as Q4_K
 *   Q6_K (256, 210 B): 128 B ql (low 4 bits), 64 B qh (high 2 bits), 16 int8
 *                     scales (one per 16 elements), d; x = d * sc[j] * (q - 32).
 *                     Element 128n + 32k + l (k < 4, l < 32) has its low
 *                     bits in ql[64n + 32(k & 1) + l] (nibble k >> 1) and its
 *                     high bits at bit 2k of qh[32n + l].
 * The 12 scale bytes of Q4_K/Q5_K: for j < 4, bytes j and j + 4 hold sc[j]
 * and mn[j] in their low 6 bits; sc[j+4] and mn[j+4] have their low 4 bits
 * in the low and high nibble of byte j + 8 and their top 2 bits in the top
 * bits of bytes j and j + 4.
 *
 * Activations. K-quant rows are multiplied with activations quantized per
 * 256 (one record per super-block: 256 int8, the 16 sums of each 16, one
 * float scale; d = amax/127, q = round-half-even(x/d)); the weight side's
 * sub-block scales are integers, so a super-block costs one float
 * multiply-add per row and token, and mins / offsets come from the sums. The
 * 32-block types use per-32 activations (int8, d, and s = d * sum(q)).
 */
#ifndef AK_KQUANT_H
#define AK_KQUANT_H

#include "kernels/kernels_backend.h"

#define AK_QKK 256            /* elements per K super-block */

/* One super-block of K activations. */
typedef struct {
    int8_t q[AK_QKK];
    int16_t bsums[16];        /* sum of q[16i .. 16i + 15] */
    float d;
    float pad_[7];            /* keeps records 64-byte multiples */
} ak_xq_k;

/* 1 for the K super-block types. */
int ak_kq_is_k(uint32_t type);

/* Shared with the SIMD back ends: the activation quantizer (both back ends
 * use this exact arithmetic, so they differ only in float summation order),
 * XQ row size, and the 6-bit scale unpacking of Q4_K/Q5_K. */
size_t ak_kq_xq_row_bytes(uint32_t wtype, int64_t cols);
void ak_kq_quantize_x(uint32_t wtype, const float *x, void *dst, int64_t cols);
static inline void ak_kq_scales_k4(const uint8_t *s12, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t a, b, c;
    memcpy(&a, s12, 4); memcpy(&b, s12 + 4, 4); memcpy(&c, s12 + 8, 4);
    uint32_t s0 = a & 0x3f3f3f3fu, m0 = b & 0x3f3f3f3fu;
    uint32_t s1 = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);
    uint32_t m1 = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
    /* every operation above is bytewise, so this works in any byte order */
    memcpy(sc, &s0, 4); memcpy(sc + 4, &s1, 4);
    memcpy(mn, &m0, 4); memcpy(mn + 4, &m1, 4);
}

#endif
