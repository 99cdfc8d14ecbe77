/* kernels_packed_arm.c - NEON (AArch64) tiles for the R16 packed layout of
 * kernels_packed.c: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and F32, F16, BF16 weights.
 *
 * The layout is kernels_packed.c's (its top comment), unchanged: one 64-byte
 * vector holds 4 consecutive elements of 16 rows, which is 4 NEON vectors
 * of 4 rows each ("quarters"). With the dot-product extension one sdot by
 * lane (vdotq_laneq_s32) multiplies a quarter's 4 rows x 4 elements by 4
 * activation bytes taken from one lane of the token's quants - AVX-512
 * VNNI's broadcast product, on 4 rows - so a block of 32 columns is 8 sdot
 * per quarter and token, no horizontal sums. With the int8 matrix-multiply
 * extension, tokens go in pairs through smmla: the quarter's vectors zipped
 * to 2 rows x 8 elements, the two tokens' quants to 2 x 8, one instruction
 * for 2 rows x 2 tokens x 8 products (half the instructions of sdot).
 * Plain NEON (no dotprod) multiplies into 16 bits (vmull_s8, at most
 * 2 x 128 x 127 per pair: no overflow) and adds pairs into 32 bits
 * (vpaddq_s16 + vpadalq_s16). Codes are signed bytes for every path: Q4 /
 * Q5 codes (0..31) as they are stored, with the offset (8 or 16) in the
 * activations' per-block term c = -o * sum(q); Q8_0's q + 128 turned back
 * into q (one eor per 16 bytes), offset 0.
 *
 * The level is chosen per product at run time from getauxval (HWCAP_ASIMDDP,
 * HWCAP2_I8MM), capped by the environment variable AGENTKV_NEON (plain,
 * dotprod, i8mm; one that names more than the CPU has is ignored). The
 * three copies of the tiles are kernels_packed_arm_tiles.h compiled under
 * each level's target pragma; every one gives the same bits (integer sums
 * are exact; the float steps are the same), so the level never changes a
 * result, and neither does the number of tokens in a tile.
 *
 * Float weights: column k of a group (16 values, 4 vectors; F16 through
 * vcvt, which is baseline AArch64; BF16 by a 16-bit shift) meets each
 * token's x[k] by lane (fmla by element); 4 tokens x 4 quarters = 16
 * accumulators.
 */
#include "kernels/kernels_impl.h"
#include "kernels/kernels_packed_layout.h"

#if defined(AK_SIMD_NEON)
#include <arm_neon.h>
#include <string.h>

#include "base/cpu.h"
#include "base/util.h"

#define GROUP AK_PACKED_GROUP   /* rows per group (kernels_packed_layout.h) */
#define PF_BYTES 2048       /* prefetch distance in a group's codes */
#define TILE_T 4            /* tokens per tile: 16 float accumulators */

/* ---- The level ---- */

/* cpu.h's ak_cpu_neon_level: read on every call, nothing kept. */
int ak_neon_level(void) { return ak_cpu_neon_level(); }

/* ---- Helpers the tiles share (baseline NEON) ---- */

/* acc + per lane i: the 4 products of w's lane-i bytes with xb's (summed):
 * sdot's result without the extension. 16-bit products, pairs summed in
 * 16 bits (|sum| <= 2 * 128 * 127), then pairs widened into acc. */
static inline __attribute__((always_inline)) int32x4_t plain_dot(int32x4_t acc, int8x16_t w, int8x16_t xb) {
    int16x8_t m0 = vmull_s8(vget_low_s8(w), vget_low_s8(xb));
    int16x8_t m1 = vmull_high_s8(w, xb);
    return vpadalq_s16(acc, vpaddq_s16(m0, m1));
}

/* Column of 16 weights at p (ft: 0 f32, 1 f16, 2 bf16) as 4 vectors. */
static inline __attribute__((always_inline)) void load_col16(const int ft, const uint8_t *p, float32x4_t w[4]) {
    if (ft == 0) {
        for (int h = 0; h < 4; h++) w[h] = vld1q_f32((const float *)(const void *)p + 4 * h);
        return;
    }
    uint16x8_t a = vld1q_u16((const uint16_t *)(const void *)p), b = vld1q_u16((const uint16_t *)(const void *)p + 8);
    if (ft == 1) {
        w[0] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(a)));
        w[1] = vcvt_high_f32_f16(vreinterpretq_f16_u16(a));
        w[2] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(b)));
        w[3] = vcvt_high_f32_f16(vreinterpretq_f16_u16(b));
    } else {   /* bf16: the top half of an f32 */
        w[0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(a), 16));
        w[1] = vreinterpretq_f32_u32(vshll_high_n_u16(a, 16));
        w[2] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(b), 16));
        w[3] = vreinterpretq_f32_u32(vshll_high_n_u16(b, 16));
    }
}

/* Y[0 .. n) from the 4 quarter vectors (n < 16: the group's padding rows
 * are not stored). */
static inline __attribute__((always_inline)) void store16(float *Y, float32x4_t a, float32x4_t b, float32x4_t c,
                                                          float32x4_t d, int n) {
    if (n >= 16) {
        vst1q_f32(Y, a);
        vst1q_f32(Y + 4, b);
        vst1q_f32(Y + 8, c);
        vst1q_f32(Y + 12, d);
        return;
    }
    float tmp[16];
    vst1q_f32(tmp, a);
    vst1q_f32(tmp + 4, b);
    vst1q_f32(tmp + 8, c);
    vst1q_f32(tmp + 12, d);
    memcpy(Y, tmp, sizeof(float) * (size_t)(n > 0 ? n : 0));
}

/* Y[0 .. n) (at most 4) from v: the rows of one quarter, short where the
 * group's padding rows begin. */
static inline __attribute__((always_inline)) void store4(float *Y, float32x4_t v, int n) {
    if (n >= 4) {
        vst1q_f32(Y, v);
        return;
    }
    float tmp[4];
    vst1q_f32(tmp, v);
    memcpy(Y, tmp, sizeof(float) * (size_t)(n > 0 ? n : 0));
}

#define AK_INLINE_NEON static inline __attribute__((always_inline))
#undef AK_INLINE
#define AK_INLINE AK_INLINE_NEON

/* The three copies of the tiles. */
#define NL 0
#define NL_SFX _plain
#include "kernels/kernels_packed_arm_tiles.h"
#undef NL
#undef NL_SFX

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#define NL 1
#define NL_SFX _dot
#include "kernels/kernels_packed_arm_tiles.h"
#undef NL
#undef NL_SFX
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod+i8mm")
#define NL 2
#define NL_SFX _i8mm
#include "kernels/kernels_packed_arm_tiles.h"
#undef NL
#undef NL_SFX
#pragma GCC pop_options

static const ak_pk_tile_fn (*const qtiles_at[3])[4] = { qtiles_plain, qtiles_dot, qtiles_i8mm };

/* ---- Entry points (kernels_backend.h) ---- */

/* One token's activations into kernels_packed.c's XP layout: cols int8
 * quants (the XQ contract: d = amax / 127, q = round-half-even(x / d)), nb
 * floats d, nb int32 c = -offset * sum(q), nb floats s = d * sum(q). The
 * offset of wtype's codes on NEON: 8 (Q4_0), 16 (Q5_0), else 0 (Q8_0's codes
 * are turned back into q). */
void ak_packed_neon_quantize(uint32_t wtype, const float *x, uint8_t *dst, int64_t cols) {
    const int kind = pq_kind(wtype);
    const uint32_t offset = kind == PQ_Q40 ? 8 : kind == PQ_Q50 ? 16 : 0;
    const int64_t nb = cols / AK_QK;
    int8_t *q = (int8_t *)dst;
    uint8_t *ds = dst + cols, *cs = dst + cols + 4 * nb, *ss = dst + cols + 8 * nb;
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * AK_QK;
        float32x4_t v[8], a = vdupq_n_f32(0);
        for (int i = 0; i < 8; i++) {
            v[i] = vld1q_f32(xb + 4 * i);
            a = vmaxq_f32(a, vabsq_f32(v[i]));
        }
        float d = vmaxvq_f32(a) / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        int32x4_t s = vdupq_n_s32(0);
        for (int i = 0; i < 8; i += 2) {
            int32x4_t q0 = vcvtnq_s32_f32(vmulq_n_f32(v[i], id));   /* ties to even */
            int32x4_t q1 = vcvtnq_s32_f32(vmulq_n_f32(v[i + 1], id));
            s = vaddq_s32(s, vaddq_s32(q0, q1));
            vst1_s8(q + b * AK_QK + 4 * i, vqmovn_s16(vcombine_s16(vqmovn_s32(q0), vqmovn_s32(q1))));
        }
        int sum = vaddvq_s32(s);
        /* unsigned: activations holding NaN or Inf give garbage sums whose
         * product must wrap, not overflow */
        int32_t c = (int32_t)(0u - offset * (uint32_t)sum);
        float sd = d * (float)sum;
        memcpy(ds + 4 * b, &d, 4);
        memcpy(cs + 4 * b, &c, 4);
        memcpy(ss + 4 * b, &sd, 4);
    }
}

/* The work item it of a 32-block type: Y rows [16 g0, 16 g1) x tokens
 * [t0, t1) from the groups at P and the tokens' XP rows at xq; Y is ntok x
 * rows. level: ak_neon_level()'s. */
void ak_packed_neon_q_item(int level, uint32_t wtype, const ak_pk_item *it) {
    const uint8_t *P = it->P, *xp = it->xq;
    const size_t gb = it->gb, xps = it->xqs;
    const int64_t rows = it->rows, cols = it->cols, g1 = it->g1, t0 = it->t0, t1 = it->t1;
    float *Y = it->Y;
    const int kind = pq_kind(wtype);
    const ak_pk_tile_fn *tiles = qtiles_at[level < 0 ? 0 : level > 2 ? 2 : level][kind];
    const int64_t nb = cols / AK_QK;
    for (int64_t g = it->g0; g < g1; g++) {
        const int nvalid = (int)ak_min64(GROUP, rows - g * GROUP);
        for (int64_t t = t0; t < t1; t += TILE_T) {
            const int T = (int)ak_min64(TILE_T, t1 - t);
            tiles[T - 1](&(ak_pk_tile){ .grp = P + (size_t)g * gb, .nb = nb, .cols = cols, .xq = xp + (size_t)t * xps,
                                        .xqs = xps, .Y = Y + t * rows + g * GROUP, .ldy = rows, .nvalid = nvalid });
        }
    }
}

/* The same for float weights (ft: ak_ftype_index) from X (ntok x cols);
 * the float tiles are the same at every level. */
void ak_packed_neon_f_item(int ft, const ak_pk_item *it) {
    const uint8_t *P = it->P;
    const size_t gb = it->gb;
    const int64_t rows = it->rows, cols = it->cols, g1 = it->g1, t1 = it->t1;
    const float *X = it->X;
    float *Y = it->Y;
    const ak_pk_tile_fn *tiles = ftiles_plain[ft];
    for (int64_t t = it->t0; t < t1; t += TILE_T) {
        const int T = (int)ak_min64(TILE_T, t1 - t);
        for (int64_t g = it->g0; g < g1; g++)
            tiles[T - 1](&(ak_pk_tile){ .grp = P + (size_t)g * gb, .cols = cols, .X = X + t * cols, .ldx = cols,
                                        .Y = Y + t * rows + g * GROUP, .ldy = rows,
                                        .nvalid = ak_min64(GROUP, rows - g * GROUP) });
    }
}

#else
typedef int ak_kernels_packed_arm_unused;   /* ISO C wants a non-empty file */
#endif
