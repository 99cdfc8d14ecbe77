/* kernels_packed_arm_tiles.h - the NEON tiles of the R16 packed layout, one
 * copy per instruction level. Included only by kernels_packed_arm.c, once
 * per level, inside that level's `#pragma GCC target` region (the intrinsics
 * of the dot-product and int8 matrix-multiply extensions can only be
 * inlined into code compiled for them); it expects
 *   NL       the level: 0 plain NEON, 1 + sdot (dotprod), 2 + smmla (i8mm)
 *   NL_SFX   the suffix of this copy's function names
 * and kernels_packed_arm.c's helpers (kind_*, plain_dot, load_col16, store4, store16).
 * The float tiles, which have no integer products, exist in copy 0 only.
 *
 * Every tile computes, for each row r and token t, the same integer block
 * sums (exact, whatever the instructions) and the same float operations in
 * the same order: acc = fma(acc, float(isum), dw * dx), then for Q4_1 / Q5_1
 * acc = fma(acc, mw, sx), block after block. So a token's result is the
 * same bits at every level and in every tile size (batch invariance).
 */

#define NL_CAT2(a, b) a##b
#define NL_CAT(a, b) NL_CAT2(a, b)
#define NL_FN(name) NL_CAT(name, NL_SFX)

/* acc + per lane i: the 4 bytes of lane i of w times the 4 bytes of lane
 * LANE of x (summed). LANE must be a literal. */
#if NL == 0
#define DOTL(acc, w, x, LANE) plain_dot(acc, w, vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(x), LANE)))
#else
#define DOTL(acc, w, x, LANE) vdotq_laneq_s32(acc, w, x, LANE)
#endif

/* The 8 code vectors of quarter h (rows 4h..4h+3) of block record rec as
 * signed bytes: w[p] holds elements 4p..4p+3 of each row (lane = row),
 * w[4 + p] elements 16 + 4p..16 + 4p + 3; w[p] pairs with lane p of the
 * token's first 16 quants, w[4 + p] with lane p of the next 16. */
AK_INLINE void NL_FN(unpack)(const int kind, const uint8_t *rec, int h, int8x16_t w[8]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0f), b4 = vdupq_n_u8(0x10);
    if (kind == PQ_Q80) {
        const uint8x16_t flip = vdupq_n_u8(0x80);   /* stored q + 128: back to q */
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++) w[p] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(rec + 64 * p + 16 * h), flip));
        return;
    }
    uint8x16_t z[4];
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) z[p] = vld1q_u8(rec + 64 * p + 16 * h);
    uint8x16_t lo[4], hi[4];
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        lo[p] = vandq_u8(z[p], m4);
        hi[p] = vshrq_n_u8(z[p], 4);
    }
    if (pq_has_hbits(kind)) {
        /* byte 4r + i of the fifth-bit vector: bit p is element 4p + i's,
         * bit 4 + p element 16 + 4p + i's; each moved to bit 4 */
        const uint8x16_t hb = vld1q_u8(rec + 256 + 16 * h);
        lo[0] = vorrq_u8(lo[0], vandq_u8(vshlq_n_u8(hb, 4), b4));
        lo[1] = vorrq_u8(lo[1], vandq_u8(vshlq_n_u8(hb, 3), b4));
        lo[2] = vorrq_u8(lo[2], vandq_u8(vshlq_n_u8(hb, 2), b4));
        lo[3] = vorrq_u8(lo[3], vandq_u8(vshlq_n_u8(hb, 1), b4));
        hi[0] = vorrq_u8(hi[0], vandq_u8(hb, b4));
        hi[1] = vorrq_u8(hi[1], vandq_u8(vshrq_n_u8(hb, 1), b4));
        hi[2] = vorrq_u8(hi[2], vandq_u8(vshrq_n_u8(hb, 2), b4));
        hi[3] = vorrq_u8(hi[3], vandq_u8(vshrq_n_u8(hb, 3), b4));
    }
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        w[p] = vreinterpretq_s8_u8(lo[p]);
        w[4 + p] = vreinterpretq_s8_u8(hi[p]);
    }
}

/* The exact integer sums of one block for rows 4h..4h+3 and one token whose
 * 32 quants are at q, starting from the token's offset c. Two chains (the
 * first 16 quants and the last), added at the end: exact either way. */
AK_INLINE int32x4_t NL_FN(block_sum)(const int8x16_t w[8], const int8_t *q, int32_t c) {
    /* the pointer made opaque: GCC would otherwise load (and broadcast)
     * every token's quants once for the four quarters and keep them,
     * spilling accumulators; reloads from L1 cost less */
    __asm__("" : "+r"(q));
    const int8x16_t x0 = vld1q_s8(q), x1 = vld1q_s8(q + 16);
    int32x4_t s0 = vdupq_n_s32(c), s1 = vdupq_n_s32(0);
    s0 = DOTL(s0, w[0], x0, 0);
    s1 = DOTL(s1, w[4], x1, 0);
    s0 = DOTL(s0, w[1], x0, 1);
    s1 = DOTL(s1, w[5], x1, 1);
    s0 = DOTL(s0, w[2], x0, 2);
    s1 = DOTL(s1, w[6], x1, 2);
    s0 = DOTL(s0, w[3], x0, 3);
    s1 = DOTL(s1, w[7], x1, 3);
    return vaddq_s32(s0, s1);
}

/* One group of 16 rows times T (1..4) tokens: Y[t * ldy + r] for r <
 * nvalid. The group's record b is unpacked one quarter (4 rows) at a time
 * and each unpacked vector serves every token of the tile: 16 accumulators
 * for 4 tokens, 8 weight vectors and the activations fit the 32 registers.
 * At level 2, tokens go in pairs through smmla (2 rows x 8 elements times
 * 2 tokens x 8 elements per instruction); a lone token takes sdot. */
AK_INLINE void NL_FN(qtile)(const int kind, const int T, const ak_pk_tile *a) {
    const uint8_t *grp = a->grp, *xp = a->xq;
    const size_t xps = a->xqs;
    const int64_t nb = a->nb, cols = a->cols, ldy = a->ldy;
    float *Y = a->Y;
    const int nvalid = (int)a->nvalid;
    const size_t crb = pq_code_record_bytes(kind), srb = pq_scale_record_bytes(kind);
    const uint8_t *scales = grp + (size_t)nb * crb;
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
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *rec = grp + (size_t)b * crb, *sc = scales + (size_t)b * srb;
        /* the weights stream from memory once per product: ahead of use */
#pragma GCC unroll 8
        for (size_t off = 0; off < crb; off += 64)
            if (h0 == 0) __builtin_prefetch(rec + PF_BYTES + off);
        float dx[4], sx[4];
        int32_t cx[4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const uint8_t *xt = xp + (size_t)t * xps;
            memcpy(&dx[t], xt + cols + 4 * b, 4);
            memcpy(&cx[t], xt + cols + 4 * nb + 4 * b, 4);
            memcpy(&sx[t], xt + cols + 8 * nb + 4 * b, 4);
        }
#pragma GCC unroll 4
        for (int hh = 0; hh < QP; hh++) {
            const int h = h0 + hh;
            int8x16_t w[8];
            NL_FN(unpack)(kind, rec, h, w);
            const float32x4_t dw = vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(sc + 8 * h)));
            const float32x4_t mw = pq_has_min(kind) ? vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(sc + 2 * GROUP + 8 * h)))
                                                  : vdupq_n_f32(0);
            int32x4_t isum[4];
#if NL == 2
            /* rows (0,1) and (2,3) of the quarter, 8 elements each, per
             * chunk of 8 elements c: w[2c] holds elements 8c..8c+3 (c < 2;
             * 16 + ... for c >= 2, the same pairing) */
            int8x16_t a01[4], a23[4];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const int p = c < 2 ? 2 * c : 4 + 2 * (c - 2);
                a01[c] = vreinterpretq_s8_s32(vzip1q_s32(vreinterpretq_s32_s8(w[p]), vreinterpretq_s32_s8(w[p + 1])));
                a23[c] = vreinterpretq_s8_s32(vzip2q_s32(vreinterpretq_s32_s8(w[p]), vreinterpretq_s32_s8(w[p + 1])));
            }
#pragma GCC unroll 2
            for (int t = 0; t + 1 < T; t += 2) {
                const int8_t *q0 = (const int8_t *)(xp + (size_t)t * xps) + b * AK_QK;
                const int8_t *q1 = (const int8_t *)(xp + (size_t)(t + 1) * xps) + b * AK_QK;
                __asm__("" : "+r"(q0), "+r"(q1));   /* as in block_sum */
                const int32x2_t c2 = vset_lane_s32(cx[t + 1], vdup_n_s32(cx[t]), 1);
                int32x4_t s01 = vcombine_s32(c2, c2), s23 = s01;   /* [r0 t, r0 t+1, r1 t, r1 t+1] */
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    const int8x16_t xb = vcombine_s8(vld1_s8(q0 + 8 * c), vld1_s8(q1 + 8 * c));
                    s01 = vmmlaq_s32(s01, a01[c], xb);
                    s23 = vmmlaq_s32(s23, a23[c], xb);
                }
                isum[t] = vuzp1q_s32(s01, s23);
                isum[t + 1] = vuzp2q_s32(s01, s23);
            }
            if (T & 1)
                isum[T - 1] = NL_FN(block_sum)(w, (const int8_t *)(xp + (size_t)(T - 1) * xps) + b * AK_QK, cx[T - 1]);
#else
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                isum[t] = NL_FN(block_sum)(w, (const int8_t *)(xp + (size_t)t * xps) + b * AK_QK, cx[t]);
#endif
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                acc[hh][t] = vfmaq_f32(acc[hh][t], vcvtq_f32_s32(isum[t]), vmulq_n_f32(dw, dx[t]));
                if (pq_has_min(kind)) acc[hh][t] = vfmaq_n_f32(acc[hh][t], mw, sx[t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int hh = 0; hh < QP; hh++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) store4(Y + (size_t)t * ldy + 4 * (h0 + hh), acc[hh][t], nvalid - 4 * (h0 + hh));
    }
}

#if NL == 0   /* float tiles: no integer products, one copy serves every level */
/* Float weights: one group of 16 rows times T (1..4) tokens. Column k of
 * the group is 16 values (4 vectors of 4 rows); each meets the T tokens'
 * x[k] by lane from a 4-value load. Every output is one chain of FMAs over
 * the columns in order, whatever T is. */
AK_INLINE void NL_FN(ftile)(const int ft, const int T, const ak_pk_tile *a) {
    const uint8_t *grp = a->grp;
    const int64_t cols = a->cols, ldx = a->ldx, ldy = a->ldy;
    const float *X = a->X;
    float *Y = a->Y;
    const int nvalid = (int)a->nvalid;
    const size_t es = ft == 0 ? 4 : 2, colb = es * GROUP;
    float32x4_t acc[4][4];
#pragma GCC unroll 4
    for (int h = 0; h < 4; h++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[h][t] = vdupq_n_f32(0);
    int64_t k = 0;
#define NL_FCOL(J)                                                                                  \
    do {                                                                                            \
        float32x4_t w[4];                                                                           \
        load_col16(ft, grp + (size_t)(k + J) * colb, w);                                            \
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)                                         \
            _Pragma("GCC unroll 4") for (int h = 0; h < 4; h++)                                     \
                acc[h][t] = vfmaq_laneq_f32(acc[h][t], w[h], xv[t], J);                             \
    } while (0)
    for (; k + 4 <= cols; k += 4) {
        __builtin_prefetch(grp + (size_t)k * colb + PF_BYTES);
        float32x4_t xv[4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) xv[t] = vld1q_f32(X + t * ldx + k);
        NL_FCOL(0);
        NL_FCOL(1);
        NL_FCOL(2);
        NL_FCOL(3);
    }
#undef NL_FCOL
    for (; k < cols; k++) {
        float32x4_t w[4];
        load_col16(ft, grp + (size_t)k * colb, w);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
#pragma GCC unroll 4
            for (int h = 0; h < 4; h++) acc[h][t] = vfmaq_n_f32(acc[h][t], w[h], X[t * ldx + k]);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) store16(Y + (size_t)t * ldy, acc[0][t], acc[1][t], acc[2][t], acc[3][t], nvalid);
}

#endif

/* One function per (kind or float type, T): the tables the items use. */
#define NL_QT(K, T) static void NL_CAT(NL_FN(qt_##K##_), T)(const ak_pk_tile *a) { NL_FN(qtile)(K, T, a); }
#define NL_QK(K) NL_QT(K, 1) NL_QT(K, 2) NL_QT(K, 3) NL_QT(K, 4)
NL_QK(0) NL_QK(1) NL_QK(2) NL_QK(3) NL_QK(4)
#define NL_QROW(K) { NL_CAT(NL_FN(qt_##K##_), 1), NL_CAT(NL_FN(qt_##K##_), 2), NL_CAT(NL_FN(qt_##K##_), 3), \
                     NL_CAT(NL_FN(qt_##K##_), 4) }
static const ak_pk_tile_fn NL_FN(qtiles)[PQ_KINDS][4] = { NL_QROW(0), NL_QROW(1), NL_QROW(2), NL_QROW(3), NL_QROW(4) };

#if NL == 0
#define NL_FT(F, T) static void NL_CAT(NL_FN(ft_##F##_), T)(const ak_pk_tile *a) { NL_FN(ftile)(F, T, a); }
#define NL_FF(F) NL_FT(F, 1) NL_FT(F, 2) NL_FT(F, 3) NL_FT(F, 4)
NL_FF(0) NL_FF(1) NL_FF(2)
#define NL_FROW(F) { NL_CAT(NL_FN(ft_##F##_), 1), NL_CAT(NL_FN(ft_##F##_), 2), NL_CAT(NL_FN(ft_##F##_), 3), \
                     NL_CAT(NL_FN(ft_##F##_), 4) }
static const ak_pk_tile_fn NL_FN(ftiles)[3][4] = { NL_FROW(0), NL_FROW(1), NL_FROW(2) };
#endif

#undef NL_QT
#undef NL_QK
#undef NL_QROW
#undef NL_FT
#undef NL_FF
#undef NL_FROW
#undef DOTL
#undef NL_FN
#undef NL_CAT
#undef NL_CAT2
