/* kernels_kquant_arm_rows.h - the row dots of kernels_kquant_arm.c, one
 * copy per NEON level. Included only by kernels_kquant_arm.c, once per
 * level, inside that level's `#pragma GCC target` region (vdotq_s32 can
 * only be inlined into code compiled for the dot-product extension); it
 * expects
 *   NL       the level: 0 plain NEON, 1 + sdot (dotprod)
 *   NL_SFX   the suffix of this copy's function names
 * and kernels_kquant_arm.c's helpers (s8, bits16_to_0x10). It defines
 * row_dot_k<NL_SFX> and row_dot_32<NL_SFX> (and the K types' own row dots).
 *
 * Both copies compute the same exact integer sums per sub-block (every
 * product and partial sum fits its lanes) and the same float steps in the
 * same order, so they give the same bits.
 */

#define NL_CAT2(a, b) a##b
#define NL_CAT(a, b) NL_CAT2(a, b)
#define NL_FN(name) NL_CAT(name, NL_SFX)
#define DOT16 NL_FN(dot16)

/* acc + sums of 4 products per lane of 16 bytes a and b. */
AK_INLINE int32x4_t NL_FN(dot16)(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if NL >= 1
    return vdotq_s32(acc, a, b);
#else
    int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    p = vmlal_s8(p, vget_high_s8(a), vget_high_s8(b));
    return vpadalq_s16(acc, p);
#endif
}

/* dot of one row of Q6_K with one token's XQ records (nsb of them). Each
 * K type's row dot is a function of its own, out of line (one call per row
 * and token): its loops are its own, which scripts/neon-counts.sh reads in
 * the disassembly. */
static __attribute__((noinline)) float NL_FN(row_dot_q6k)(const uint8_t *w, const ak_xq_k *x, int64_t nsb) {
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(0x03);
    float sum = 0;
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
                    acc = vmlaq_n_s32(acc, DOT16(vdupq_n_s32(0), s8(u[k]), vld1q_s8(x->q + e)), sc[e / 16]);
                }
            }
        }
        int corr = 0;
        for (int j = 0; j < 16; j++) corr += 32 * sc[j] * x->bsums[j];
        sum += x->d * ak_f16_to_f32(ak_load_u16(w + 208)) * (float)(vaddvq_s32(acc) - corr);
    }
    return sum;
}

/* The same for Q4_K (q5 = 0) and Q5_K (q5 = 1, a constant). */
AK_INLINE float NL_FN(row_dot_k45)(const int q5, const uint8_t *w, const ak_xq_k *x, int64_t nsb) {
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    float sum = 0;
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
                acc = vmlaq_n_s32(acc, DOT16(vdupq_n_s32(0), s8(lo), vld1q_s8(x->q + 64 * c + 16 * h)), sc[2 * c]);
                acc = vmlaq_n_s32(acc, DOT16(vdupq_n_s32(0), s8(hi), vld1q_s8(x->q + 64 * c + 32 + 16 * h)),
                                  sc[2 * c + 1]);
            }
        int msum = 0;
        for (int j = 0; j < 8; j++) msum += mn[j] * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
        float d = ak_f16_to_f32(ak_load_u16(w)), dmin = ak_f16_to_f32(ak_load_u16(w + 2));
        sum += x->d * (d * (float)vaddvq_s32(acc) - dmin * (float)msum);
    }
    return sum;
}

/* Q4_K's and Q5_K's row dots, out of line as Q6_K's. */
static __attribute__((noinline)) float NL_FN(row_dot_q4k)(const uint8_t *w, const ak_xq_k *x, int64_t nsb) {
    return NL_FN(row_dot_k45)(0, w, x, nsb);
}
static __attribute__((noinline)) float NL_FN(row_dot_q5k)(const uint8_t *w, const ak_xq_k *x, int64_t nsb) {
    return NL_FN(row_dot_k45)(1, w, x, nsb);
}

/* dot of one row of a K type (wtype) with one token's XQ records. */
static float NL_FN(row_dot_k)(uint32_t wtype, const uint8_t *w, const ak_xq_k *x, int64_t nsb) {
    return wtype == GGML_TYPE_Q6_K   ? NL_FN(row_dot_q6k)(w, x, nsb)
           : wtype == GGML_TYPE_Q5_K ? NL_FN(row_dot_q5k)(w, x, nsb)
                                     : NL_FN(row_dot_q4k)(w, x, nsb);
}

/* dot of one row of a 32-block type with one token's XQ (q, d, s). */
static float NL_FN(row_dot_32)(uint32_t wtype, const uint8_t *w, const int8_t *q, const float *ds, const float *ss,
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
        int32_t isum = vaddvq_s32(DOT16(DOT16(vdupq_n_s32(0), s8(lo), vld1q_s8(q)), s8(hi), vld1q_s8(q + 16)));
        float d = ak_f16_to_f32(ak_load_u16(w));
        float extra = wtype == GGML_TYPE_Q5_0 ? -16.0f * d : ak_f16_to_f32(ak_load_u16(w + 2));
        sum += d * ds[b] * (float)isum + extra * ss[b];
    }
    return sum;
}

#undef DOT16
#undef NL_FN
#undef NL_CAT
#undef NL_CAT2
