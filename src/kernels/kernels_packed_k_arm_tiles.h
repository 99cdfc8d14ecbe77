/* kernels_packed_k_arm_tiles.h - the NEON tiles of the K16 packed layout
 * (Q4_K, Q5_K, Q6_K), one copy per instruction level. Included only by
 * kernels_packed_k_arm.c, once per level inside its target pragma, with
 *   NL       0 plain NEON, 1 + sdot (dotprod)
 *   NL_SFX   the suffix of this copy's names
 * and that file's helpers (K offsets, plain_dot4, load_u32, store4k).
 *
 * Per row and super-block the arithmetic is kernels_packed_k.c's, in its
 * order: s_j exact int32 per sub-block; f = fma(float(s_j), d * sc_j, f)
 * for j ascending from f = 0; corr = sum_j mn_j * (sum of x over j), exact;
 * acc = fma(f, dx, acc), then acc = fma(-float(corr), dmin * dx, acc). The
 * same at every level and tile size: a token's bits never depend on them.
 */

#define NL_CAT2(a, b) a##b
#define NL_CAT(a, b) NL_CAT2(a, b)
#define NL_FN(name) NL_CAT(name, NL_SFX)

#if NL == 0
#define DOTL(acc, w, x, LANE) plain_dot4(acc, w, vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(x), LANE)))
#else
#define DOTL(acc, w, x, LANE) vdotq_laneq_s32(acc, w, x, LANE)
#endif

/* c + the exact products of 4 rows' 16 elements: w[p] (p < 4) holds
 * elements 4p..4p+3 of each row, q the token's 16 quants. */
AK_INLINE int32x4_t NL_FN(sum16)(const int8x16_t w[4], const int8_t *q, int32_t c) {
    __asm__("" : "+r"(q));   /* no hoisting of every token's quants out of the quarters (spills) */
    const int8x16_t x = vld1q_s8(q);
    int32x4_t s0 = vdupq_n_s32(c), s1 = vdupq_n_s32(0);
    s0 = DOTL(s0, w[0], x, 0);
    s1 = DOTL(s1, w[1], x, 1);
    s0 = DOTL(s0, w[2], x, 2);
    s1 = DOTL(s1, w[3], x, 3);
    return vaddq_s32(s0, s1);
}

/* One group of 16 rows times T (1..4) tokens of kind kt: Y[t * ldy + r]
 * for r < nvalid. Each super-block's record is taken one quarter (4 rows)
 * at a time; a sub-block's unpacked vectors serve every token. */
AK_INLINE void NL_FN(ktile)(const int kt, const int T, const ak_pk_tile *a) {
    const uint8_t *grp = a->grp, *xk = a->xq;
    const size_t xks = a->xqs;
    const int64_t nsb = a->nb, ldy = a->ldy;
    float *Y = a->Y;
    const int nvalid = (int)a->nvalid;
    const size_t rb = k_rec_bytes(kt);
    const uint8x16_t m4 = vdupq_n_u8(0x0f), b4 = vdupq_n_u8(0x10), b45 = vdupq_n_u8(0x30);
    /* quarters per pass: all four for one token; one for more tokens, in
     * four passes over the group (its lines come from cache after the
     * first), so that a pass's live registers are T accumulators, 8
     * weight vectors and the activations: GCC interleaves unrolled
     * quarters and spilled half of a 4-token tile otherwise */
    const int QP = T == 1 ? 4 : 1;
#pragma GCC unroll 1
    for (int h0 = 0; h0 < 4; h0 += QP) {
    float32x4_t acc[4][4];
#pragma GCC unroll 4
    for (int hh = 0; hh < QP; hh++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[hh][t] = vdupq_n_f32(0);
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *rec = grp + (size_t)sb * rb;
        if (h0 == 0)
            for (size_t off = 0; off < rb; off += 64) __builtin_prefetch(rec + K_PF_BYTES + off);
        const uint8_t *xs[4];
        float dx[4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            xs[t] = xk + (size_t)t * xks + (size_t)sb * K_XK_BYTES;
            memcpy(&dx[t], xs[t] + K_XK_D, 4);
        }
        for (int hh = 0; hh < QP; hh++) {
            const int h = h0 + hh;
            const float32x4_t d4 = vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(rec + k_off_d(kt) + 8 * h)));
            float32x4_t f[4];
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) f[t] = vdupq_n_f32(0);
            if (kt == KP_Q6K) {
                for (int n = 0; n < 2; n++)
                    for (int k = 0; k < 4; k++) {
                        /* element 128n + 32k + 4p + i: low 4 bits in nibble
                         * k >> 1 of low vector k & 1, high 2 at bits 2k */
                        const int8x16_t hs = vdupq_n_s8((int8_t)(4 - 2 * k));
                        int8x16_t w[8];
#pragma GCC unroll 8
                        for (int p = 0; p < 8; p++) {
                            const uint8_t *v = rec + 192 * (8 * n + p) + 16 * h;
                            uint8x16_t lowv = vld1q_u8(v + 64 * (k & 1)), qh = vld1q_u8(v + 128);
                            uint8x16_t nib = (k >> 1) ? vshrq_n_u8(lowv, 4) : vandq_u8(lowv, m4);
                            w[p] = vreinterpretq_s8_u8(vorrq_u8(nib, vandq_u8(vshlq_u8(qh, hs), b45)));
                        }
                        const int j0 = 8 * n + 2 * k;   /* sub-blocks j0 (p < 4) and j0 + 1 */
                        float32x4_t dsc[2];
#pragma GCC unroll 2
                        for (int e = 0; e < 2; e++) {
                            int8x8_t s8 = vreinterpret_s8_u32(vdup_n_u32(load_u32(rec + K_Q6_SC + 16 * (j0 + e) + 4 * h)));
                            dsc[e] = vmulq_f32(d4, vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(s8)))));
                        }
#pragma GCC unroll 4
                        for (int t = 0; t < T; t++) {
                            const int8_t *q = (const int8_t *)xs[t] + 128 * n + 32 * k;
                            int32_t c0, c1;
                            memcpy(&c0, xs[t] + K_XK_C16 + 4 * j0, 4);
                            memcpy(&c1, xs[t] + K_XK_C16 + 4 * (j0 + 1), 4);
                            f[t] = vfmaq_f32(f[t], vcvtq_f32_s32(NL_FN(sum16)(w, q, c0)), dsc[0]);
                            f[t] = vfmaq_f32(f[t], vcvtq_f32_s32(NL_FN(sum16)(w + 4, q + 16, c1)), dsc[1]);
                        }
                    }
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) acc[hh][t] = vfmaq_n_f32(acc[hh][t], f[t], dx[t]);
                continue;
            }
            const size_t osc = k_off_sc(kt);
            for (int c = 0; c < 4; c++) {
                uint8x16_t raw[8], hb[8];
#pragma GCC unroll 8
                for (int p = 0; p < 8; p++) {
                    raw[p] = vld1q_u8(rec + 512 * c + 64 * p + 16 * h);
                    if (kt == KP_Q5K) hb[p] = vld1q_u8(rec + 2048 + 64 * p + 16 * h);
                }
#pragma GCC unroll 2
                for (int e = 0; e < 2; e++) {   /* sub-block 2c + e: low nibbles, then high */
                    const int j = 2 * c + e;
                    int8x16_t w[8];
                    /* Q5_K: bit j of qh is the fifth bit, moved to bit 4 */
                    const int8x16_t hs = vdupq_n_s8((int8_t)(4 - j));
#pragma GCC unroll 8
                    for (int p = 0; p < 8; p++) {
                        uint8x16_t u = e ? vshrq_n_u8(raw[p], 4) : vandq_u8(raw[p], m4);
                        if (kt == KP_Q5K) u = vorrq_u8(u, vandq_u8(vshlq_u8(hb[p], hs), b4));
                        w[p] = vreinterpretq_s8_u8(u);
                    }
                    uint8x8_t s8 = vreinterpret_u8_u32(vdup_n_u32(load_u32(rec + osc + 16 * j + 4 * h)));
                    const float32x4_t dsc = vmulq_f32(d4, vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(s8)))));
#pragma GCC unroll 4
                    for (int t = 0; t < T; t++) {
                        const int8_t *q = (const int8_t *)xs[t] + 64 * c + 32 * e;
                        int32x4_t s = vaddq_s32(NL_FN(sum16)(w, q, 0), NL_FN(sum16)(w + 4, q + 16, 0));
                        f[t] = vfmaq_f32(f[t], vcvtq_f32_s32(s), dsc);
                    }
                }
            }
            /* the mins: rows' mn of sub-blocks 2k, 2k + 1 times the token's
             * sums of those sub-blocks, in pairs, then the pairs added */
            const float32x4_t dmin4 = vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(rec + k_off_d(kt) + 32 + 8 * h)));
            int16x8_t mn[4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) mn[k] = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(rec + osc + 128 + 32 * k + 8 * h)));
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                int32x4_t c01 = vdupq_n_s32(0), c23 = vdupq_n_s32(0);
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    const int16x4_t bs = vreinterpret_s16_u32(vdup_n_u32(load_u32(xs[t] + K_XK_S32 + 4 * k)));
                    c01 = vmlal_s16(c01, vget_low_s16(mn[k]), bs);
                    c23 = vmlal_s16(c23, vget_high_s16(mn[k]), bs);
                }
                const int32x4_t corr = vpaddq_s32(c01, c23);
                acc[hh][t] = vfmaq_n_f32(acc[hh][t], f[t], dx[t]);
                acc[hh][t] = vfmaq_f32(acc[hh][t], vnegq_f32(vcvtq_f32_s32(corr)), vmulq_n_f32(dmin4, dx[t]));
            }
        }
    }
#pragma GCC unroll 4
    for (int hh = 0; hh < QP; hh++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) store4k(Y + (size_t)t * ldy + 4 * (h0 + hh), acc[hh][t], nvalid - 4 * (h0 + hh));
    }
}

#define NL_KT(K, T) static void NL_CAT(NL_FN(kt_##K##_), T)(const ak_pk_tile *a) { NL_FN(ktile)(K, T, a); }
#define NL_KK(K) NL_KT(K, 1) NL_KT(K, 2) NL_KT(K, 3) NL_KT(K, 4)
NL_KK(0) NL_KK(1) NL_KK(2)
#define NL_KROW(K) { NL_CAT(NL_FN(kt_##K##_), 1), NL_CAT(NL_FN(kt_##K##_), 2), NL_CAT(NL_FN(kt_##K##_), 3), \
                     NL_CAT(NL_FN(kt_##K##_), 4) }
static const ak_pk_tile_fn NL_FN(ktiles)[3][4] = { NL_KROW(0), NL_KROW(1), NL_KROW(2) };

#undef NL_KT
#undef NL_KK
#undef NL_KROW
#undef DOTL
#undef NL_FN
#undef NL_CAT
#undef NL_CAT2
