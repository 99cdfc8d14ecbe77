/* kernels_arm_tiles.h - the row-major Q8_0 / Q4_0 tiles of kernels_arm.c,
 * one copy per NEON level. Included only by kernels_arm.c, once per level,
 * inside that level's `#pragma GCC target` region (vdotq_s32 can only be
 * inlined into code compiled for the dot-product extension); it expects
 *   NL       the level: 0 plain NEON, 1 + sdot (dotprod)
 *   NL_SFX   the suffix of this copy's function names
 * and kernels_arm.c's wblk, load_q8, load_q4. It defines the table
 * q_tiles<NL_SFX>[q8][R - 1][T - 1].
 *
 * Both copies compute the same per-lane integer sums of each block (exact:
 * sdot's lanes of 4 products, or the same products in the same lanes from
 * 16-bit multiplies), then the same float steps in the same order, so they
 * give the same bits.
 */

#define NL_CAT2(a, b) a##b
#define NL_CAT(a, b) NL_CAT2(a, b)
#define NL_FN(name) NL_CAT(name, NL_SFX)
#define NL_ROW_R(NAME, Q) ROW_R(NAME, Q)   /* expands NAME before ROW_R pastes it */

/* Lane i: the sum of the products of bytes 4i..4i+3 of w's low half with
 * x0's and of its high half with x1's (sdot's lanes, at every level). */
AK_INLINE int32x4_t NL_FN(dot_s8)(const wblk *w, int8x16_t x0, int8x16_t x1) {
#if NL >= 1
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w->lo, x0), w->hi, x1);
#else
    /* sdot's lanes: 16-bit products of element j of both halves (at most
     * 2 * 128 * 127: no overflow), pairs (2k, 2k+1) widened, then adjacent
     * 32-bit pairs added: lane i holds elements 4i..4i+3 exactly as sdot's
     * (another grouping would give other per-lane sums and other bits
     * after the per-lane float conversion) */
    int16x8_t a = vmull_s8(vget_low_s8(w->lo), vget_low_s8(x0));
    a = vmlal_s8(a, vget_low_s8(w->hi), vget_low_s8(x1));
    int16x8_t b = vmull_high_s8(w->lo, x0);
    b = vmlal_high_s8(b, w->hi, x1);
    return vpaddq_s32(vpaddlq_s16(a), vpaddlq_s16(b));
#endif
}

/* Y[t * ldy + r] for the R x T tile a: the rows at W (wrb bytes apart) and
 * the T tokens' XQ rows at xq (xqs bytes apart), nb blocks. */
AK_INLINE void NL_FN(q_tile)(const int q8, const int R, const int T, const ak_mm_tile *a) {
    const uint8_t *W = a->W, *xq = a->xq;
    const size_t wrb = a->wrb, xqs = a->xqs;
    const int64_t nb = a->nb, ldy = a->ldy;
    float *Y = a->Y;
    const size_t blk_bytes = q8 ? AK_Q8_0_BYTES : AK_Q4_0_BYTES;
    const int64_t cols = nb * AK_QK;
    float32x4_t acc[MAXR][MAXT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = vdupq_n_f32(0);
    for (int64_t b = 0; b < nb; b++) {
        wblk w[MAXR];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *p = W + (size_t)r * wrb + (size_t)b * blk_bytes;
            __builtin_prefetch(p + 4 * wrb);
            w[r] = q8 ? load_q8(p) : load_q4(p);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const int8_t *x = (const int8_t *)(xq + (size_t)t * xqs);
            const float dx = ((const float *)(x + cols))[b];
            int8x16_t x0 = vld1q_s8(x + b * AK_QK), x1 = vld1q_s8(x + b * AK_QK + 16);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][t] = vfmaq_n_f32(acc[r][t], vcvtq_f32_s32(NL_FN(dot_s8)(&w[r], x0, x1)), w[r].d * dx);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) Y[t * ldy + r] = vaddvq_f32(acc[r][t]);
}

INST_R(NL_FN(qt), NL_FN(q_tile), 0)
INST_R(NL_FN(qt), NL_FN(q_tile), 1)
static const ak_mm_tile_fn NL_FN(q_tiles)[2][4][4] = { NL_ROW_R(NL_FN(qt), 0), NL_ROW_R(NL_FN(qt), 1) };

#undef NL_ROW_R
#undef NL_FN
#undef NL_CAT
#undef NL_CAT2
