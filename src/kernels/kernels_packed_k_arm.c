/* kernels_packed_k_arm.c - NEON (AArch64) tiles and activation quantizer for
 * the K16 packed layout of kernels_packed_k.c (Q4_K, Q5_K, Q6_K), which
 * specifies the layout, the XK activations and the arithmetic per row.
 *
 * As in kernels_packed_arm.c, a 64-byte vector of the layout is 4 NEON
 * vectors of 4 rows ("quarters"), and one sdot by lane (dotprod) or its
 * plain-NEON form (vmull_s8, pair sums in 16 bits, widened into 32: codes
 * are < 64, so |pair| <= 2 * 63 * 127) multiplies a quarter's 4 rows x 4
 * elements by 4 activation bytes. Codes are unpacked to 0..63 (Q6_K's
 * offset of 32 comes with the activations' per-sub-block term). Sub-block
 * scales become floats once per quarter and sub-block (d * sc, exact), the
 * mins' correction is an exact int32 (vmlal_s16 on the unpacked u8 mins).
 * The level (plain or dotprod; i8mm adds nothing here) is
 * ak_neon_level()'s; both give the same bits.
 *
 * kernels_packed.c's driver calls ak_packed_k_quantize and ak_packed_k_item
 * (kernels_backend.h) where kernels_packed_k.c reports a packed size, which it
 * does on AArch64 builds for these tiles.
 */
#include "kernels/kernels_impl.h"

#if defined(AK_SIMD_NEON) && !defined(AK_NO_PACKED)
#include <arm_neon.h>
#include <string.h>

#include "kernels/kquant.h"
#include "base/util.h"

#define GROUP 16            /* rows per group */
#define K_TILE_T 4          /* tokens per tile */
#define K_PF_BYTES 2048     /* prefetch distance in a group's records */
#define K_XK_BYTES 384      /* kernels_packed_k.c's XK: one super-block of one token */
#define K_XK_S32 256        /*   8 int16 sums of each 32 quants */
#define K_XK_C16 272        /*   16 int32 -32 * (sum of each 16) */
#define K_XK_D 336          /*   float d */
#define K_Q6_SC 3072        /* Q6_K record: s8 scales [16][16] */

enum { KP_Q4K, KP_Q5K, KP_Q6K };
static int k_kind(uint32_t wtype) {
    return wtype == GGML_TYPE_Q4_K ? KP_Q4K : wtype == GGML_TYPE_Q5_K ? KP_Q5K : KP_Q6K;
}
/* kernels_packed_k.c's record bytes and offsets (its top comment). */
static inline size_t k_rec_bytes(int kt) { return kt == KP_Q4K ? 2368 : kt == KP_Q5K ? 2880 : 3392; }
static inline size_t k_off_sc(int kt) { return kt == KP_Q4K ? 2048 : kt == KP_Q5K ? 2560 : 3072; }
static inline size_t k_off_d(int kt) { return kt == KP_Q6K ? 3328 : k_off_sc(kt) + 256; }

static inline uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* sdot's result without the extension (kernels_packed_arm.c's plain_dot). */
static inline __attribute__((always_inline)) int32x4_t plain_dot4(int32x4_t acc, int8x16_t w, int8x16_t xb) {
    int16x8_t m0 = vmull_s8(vget_low_s8(w), vget_low_s8(xb));
    int16x8_t m1 = vmull_high_s8(w, xb);
    return vpadalq_s16(acc, vpaddq_s16(m0, m1));
}

/* Y[0 .. n) (at most 4) from v: one quarter's rows, short where the
 * group's padding rows begin. */
static inline __attribute__((always_inline)) void store4k(float *Y, float32x4_t v, int n) {
    if (n >= 4) {
        vst1q_f32(Y, v);
        return;
    }
    float tmp[4];
    vst1q_f32(tmp, v);
    memcpy(Y, tmp, sizeof(float) * (size_t)(n > 0 ? n : 0));
}

#undef AK_INLINE
#define AK_INLINE static inline __attribute__((always_inline))

#define NL 0
#define NL_SFX _plain
#include "kernels/kernels_packed_k_arm_tiles.h"
#undef NL
#undef NL_SFX

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#define NL 1
#define NL_SFX _dot
#include "kernels/kernels_packed_k_arm_tiles.h"
#undef NL
#undef NL_SFX
#pragma GCC pop_options

/* One token's activations into the XK layout (kernels_packed_k.c): per
 * super-block 256 quants (d = amax / 127, round half to even), the 8 int16
 * sums of each 32, the 16 int32 -32 * (sum of each 16), the float d. */
void ak_packed_k_quantize(const float *x, uint8_t *dst, int64_t cols) {
    for (int64_t b = 0; b < cols / AK_QKK; b++, x += AK_QKK, dst += K_XK_BYTES) {
        float32x4_t a = vdupq_n_f32(0);
        for (int i = 0; i < AK_QKK; i += 4) a = vmaxq_f32(a, vabsq_f32(vld1q_f32(x + i)));
        float d = vmaxvq_f32(a) / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        int sum16[16];
        for (int i = 0; i < 16; i++) {
            int32x4_t q[4];
            for (int k = 0; k < 4; k++) q[k] = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 16 * i + 4 * k), id));
            sum16[i] = vaddvq_s32(vaddq_s32(vaddq_s32(q[0], q[1]), vaddq_s32(q[2], q[3])));
            int16x8_t h0 = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
            int16x8_t h1 = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
            vst1q_s8((int8_t *)dst + 16 * i, vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1)));
        }
        for (int i = 0; i < 16; i++) {
            int32_t c = -32 * sum16[i];
            memcpy(dst + K_XK_C16 + 4 * i, &c, 4);
        }
        for (int j = 0; j < 8; j++) {
            int16_t s = (int16_t)(sum16[2 * j] + sum16[2 * j + 1]);   /* |.| <= 32 * 127 */
            memcpy(dst + K_XK_S32 + 2 * j, &s, 2);
        }
        memcpy(dst + K_XK_D, &d, 4);
    }
}

/* The work item it: Y rows [16 g0, 16 g1) x tokens [t0, t1) from the
 * groups at P and the tokens' XK rows at xq; Y is ntok x rows
 * (kernels_backend.h's contract). */
void ak_packed_k_item(uint32_t wtype, const ak_pk_item *it) {
    const uint8_t *P = it->P, *xk = it->xq;
    const size_t gb = it->gb, xks = it->xqs;
    const int64_t rows = it->rows, g1 = it->g1, t0 = it->t0, t1 = it->t1;
    float *Y = it->Y;
    const int kt = k_kind(wtype);
    const ak_pk_tile_fn *tiles = ak_neon_level() >= 1 ? ktiles_dot[kt] : ktiles_plain[kt];
    const int64_t nsb = it->cols / AK_QKK;
    for (int64_t g = it->g0; g < g1; g++) {
        const int nvalid = (int)ak_min64(GROUP, rows - g * GROUP);
        for (int64_t t = t0; t < t1; t += K_TILE_T) {
            const int T = (int)ak_min64(K_TILE_T, t1 - t);
            tiles[T - 1](&(ak_pk_tile){ .grp = P + (size_t)g * gb, .nb = nsb, .xq = xk + (size_t)t * xks, .xqs = xks,
                                        .Y = Y + t * rows + g * GROUP, .ldy = rows, .nvalid = nvalid });
        }
    }
}

#else
typedef int ak_kernels_packed_k_arm_unused;   /* ISO C wants a non-empty file */
#endif
