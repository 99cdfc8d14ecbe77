/* kernels_arm.c - the NEON back end (AArch64; see kernels_backend.h).
 *
 * Quantized weights x 8-bit activations: NEON multiplies signed by signed
 * bytes, so Q4_0 nibbles are simply re-centred (q - 8) and no offset
 * correction is needed. With the dot-product extension (SDOT) a block is two
 * vdotq_s32; without it, vmull_s8/vmlal_s8 pairs into 16 bits (at most
 * 2 * 128 * 127, no overflow) and pairwise widening adds into the same
 * lanes as SDOT's. Each block's four lane sums become float and are scaled
 * by dw * dx.
 *
 * Which of the two runs is chosen per product at run time (ak_neon_level:
 * getauxval, capped by AGENTKV_NEON), not by the build's target: the
 * quantized tiles are kernels_arm_tiles.h compiled once for baseline
 * armv8-a and once under the dot-product target pragma, and both give the
 * same bits. So an armv8-a build uses SDOT where the CPU has it, and never
 * executes it where the CPU lacks it. There is no i8mm (smmla) form: smmla
 * gives a block's whole sum for 2 rows x 2 tokens, where these tiles keep
 * four lane sums per row and token until the end; the same bits would cost
 * the other levels a horizontal sum per block. The engine packs every type,
 * and the packed tiles (kernels_packed_arm.c) have the smmla form.
 *
 * Tiles are R rows x T tokens of accumulators, as in the x86 back end.
 */
#include "kernels/kernels_impl.h"

#if defined(AK_SIMD_NEON)
#include <arm_neon.h>

#include "base/util.h"

#define SIMD_NAME "neon"   /* with or without SDOT (ak_neon_level) */

#define TILE_R 4
#define TILE_T 2    /* 4 x 2 accumulators + 8 weight vectors: fits 32 registers */
#define TILE_TF 4   /* float tiles: 16 accumulators + 4 weights + x */

/* XQ layout: cols int8 quants, then one float scale per block. */
static size_t xq_row_bytes(uint32_t wtype, int64_t cols) {
    (void)wtype;
    return ak_round64((size_t)cols + (size_t)(cols / AK_QK) * sizeof(float));
}

static void quantize_x(uint32_t wtype, const float *x, void *dst, int64_t cols) {
    (void)wtype;
    const int64_t nb = cols / AK_QK;
    int8_t *q = dst;
    float *ds = (float *)(q + cols);
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * AK_QK;
        float32x4_t v[8], a = vdupq_n_f32(0);
        for (int i = 0; i < 8; i++) {
            v[i] = vld1q_f32(xb + 4 * i);
            a = vmaxq_f32(a, vabsq_f32(v[i]));
        }
        float amax = vmaxvq_f32(a);
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        ds[b] = d;
        for (int i = 0; i < 8; i += 2) {
            /* vcvtnq: round to nearest, ties to even */
            int32x4_t q0 = vcvtnq_s32_f32(vmulq_n_f32(v[i], id));
            int32x4_t q1 = vcvtnq_s32_f32(vmulq_n_f32(v[i + 1], id));
            int16x8_t h = vcombine_s16(vqmovn_s32(q0), vqmovn_s32(q1));
            vst1_s8(q + b * AK_QK + 4 * i, vqmovn_s16(h));
        }
    }
}

AK_INLINE float f16_scalar(uint16_t h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

typedef struct {
    int8x16_t lo, hi;   /* elements 0..15 and 16..31, signed */
    float d;
} wblk;

AK_INLINE wblk load_q8(const uint8_t *b) {
    wblk w;
    w.lo = vld1q_s8((const int8_t *)(b + 2));
    w.hi = vld1q_s8((const int8_t *)(b + 18));
    w.d = f16_scalar(ak_load_u16(b));
    return w;
}

AK_INLINE wblk load_q4(const uint8_t *b) {
    wblk w;
    uint8x16_t q = vld1q_u8(b + 2);
    const int8x16_t eight = vdupq_n_s8(8);
    w.lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f))), eight);
    w.hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight);
    w.d = f16_scalar(ak_load_u16(b));
    return w;
}

AK_INLINE float32x4_t load_w4(const int ft, const uint8_t *row, int64_t k) {
    if (ft == 0) return vld1q_f32((const float *)(row + 4 * k));
    uint16x4_t h = vld1_u16((const uint16_t *)(row + 2 * k));
    if (ft == 1) return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));   /* bf16 */
}

AK_INLINE float load_w1(const int ft, const uint8_t *row, int64_t k) {
    if (ft == 0) { float v; memcpy(&v, row + 4 * k, 4); return v; }
    uint16_t h = ak_load_u16(row + 2 * k);
    return ft == 1 ? f16_scalar(h) : ak_bf16_to_f32(h);
}

/* Y[t * ldy + r] of the R x T float tile a, 4 columns at a time. */
AK_INLINE void f_tile(const int ft, const int R, const int T, const ak_mm_tile *a) {
    const uint8_t *W = a->W;
    const size_t wrb = a->wrb;
    const float *X = a->X;
    const int64_t ldx = a->ldx, cols = a->cols, ldy = a->ldy;
    float *Y = a->Y;
    float32x4_t acc[MAXR][MAXT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = vdupq_n_f32(0);
    int64_t k = 0;
    for (; k + 4 <= cols; k += 4) {
        float32x4_t w[MAXR];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) w[r] = load_w4(ft, W + (size_t)r * wrb, k);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float32x4_t xv = vld1q_f32(X + t * ldx + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][t] = vfmaq_f32(acc[r][t], w[r], xv);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float s = vaddvq_f32(acc[r][t]);
            for (int64_t i = k; i < cols; i++) s += load_w1(ft, W + (size_t)r * wrb, i) * X[t * ldx + i];
            Y[t * ldy + r] = s;
        }
}

static void f32_to_f16_row(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)   /* FPCR's default mode: round to nearest even */
        vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = ak_f32_to_f16(x[i]);
}

static void f16_to_f32_row(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x + i))));
    for (; i < n; i++) y[i] = ak_f16_to_f32(x[i]);
}

/* The two copies of the quantized tiles: q_tiles_plain, q_tiles_dot. */
#define NL 0
#define NL_SFX _plain
#include "kernels/kernels_arm_tiles.h"
#undef NL
#undef NL_SFX

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#define NL 1
#define NL_SFX _dot
#include "kernels/kernels_arm_tiles.h"
#undef NL
#undef NL_SFX
#pragma GCC pop_options

INST_R(ft, f_tile, 0)
INST_R(ft, f_tile, 1)
INST_R(ft, f_tile, 2)
static const ak_mm_tile_fn f_tiles[3][4][4] = { ROW_R(ft, 0), ROW_R(ft, 1), ROW_R(ft, 2) };

/* kernels_backend.h's mm_q contract: Q8_0 and Q4_0 weights, in tiles of
 * this CPU's level. */
static void mm_q(const ak_mm_args *a) {
    const ak_mm_tile_fn (*q_tiles)[4][4] = ak_neon_level() >= 1 ? q_tiles_dot : q_tiles_plain;
    ak_mm_tiles(a, q_tiles[a->wtype == GGML_TYPE_Q8_0], TILE_R, TILE_T, 1);
}

/* kernels_backend.h's mm_f contract: F32, F16 and BF16 weights, in tiles. */
static void mm_f(const ak_mm_args *a) {
    ak_mm_tiles(a, f_tiles[ak_ftype_index(a->wtype)], TILE_R, TILE_TF, 0);
}

const ak_kernel_backend ak_backend_simd = {
    .name = SIMD_NAME, .xq_row_bytes = xq_row_bytes, .quantize_x = quantize_x, .mm_q = mm_q, .mm_f = mm_f,
    .f32_to_f16 = f32_to_f16_row, .f16_to_f32 = f16_to_f32_row,
};

#else
typedef int ak_kernels_arm_unused;   /* ISO C wants a non-empty file */
#endif
