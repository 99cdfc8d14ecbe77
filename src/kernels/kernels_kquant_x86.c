/* kernels_kquant_x86.c - AVX2 (and AVX-512 builds, which include it) back end
 * for kquant.h's types; the contract is kernels_backend.h's, the reference is
 * kquant.c's scalar back end.
 *
 * K super-blocks. A row's super-block is unpacked into eight 32-byte vectors
 * of unsigned quants u (Q4_K/Q5_K: q; Q6_K: q + 32), eight vectors of 16-bit
 * scales (one per 16 elements: of vpmaddubsw's 16 pair sums of a group of 32,
 * lanes 0-7 belong to elements 0-15 and lanes 8-15 to 16-31), and
 * one vector of 16-bit "min" weights per 16 elements (Q4_K/Q5_K: mn[j/2];
 * Q6_K: 32 * sc, the offset). Then for a token's activation record
 *     isum = sum_g madd16(maddubs(u_g, x_g), sc_g)      (exact int32)
 *     corr = madd16(mn, bsums)
 *     acc += d * dx * isum - dmin * dx * corr           (Q6_K: dmin = d)
 * No overflow: maddubs pair sums are at most 2 * 63 * 127, and |sc| <= 128.
 * Decode (few tokens) unpacks each super-block in registers for one token;
 * prefill unpacks 4 rows' super-blocks once into a small buffer and runs
 * every token of a chunk over them, so unpacking is amortized.
 *
 * 32-blocks (Q4_1, Q5_0, Q5_1): quants unpacked to 32 unsigned bytes
 * (the fifth bit spread from the u32 by a byte shuffle and a bit test), one
 * maddubs + madd, and the min / offset term from the activation sums.
 */
#include "kernels/kquant.h"

#if defined(AK_SIMD_AVX512) || defined(AK_SIMD_AVX2)

/* The VNNI panel path (AVX-512) replaces these helpers; clang warns about
 * unused static inline functions where gcc does not. */
#define AK_UNUSED_ON_VNNI __attribute__((unused))
#include <immintrin.h>

#include "base/util.h"

enum { KT_Q4K, KT_Q5K, KT_Q6K };

typedef struct {
    __m256i u[8];
    __m256i sc[8];
    __m256i mn;
    float d, dmin;
} ksb;

/* Sum of the 8 lanes. */
AK_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 bytes from p, unaligned. */
AK_INLINE __m256i load256(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Unpacks one super-block of type kt at b. */
AK_INLINE AK_UNUSED_ON_VNNI void unpack_k(const int kt, const uint8_t *b, ksb *o) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    if (kt == KT_Q6K) {
        const __m256i m30 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++) {
            __m256i l0 = load256(b + 64 * n), l1 = load256(b + 64 * n + 32), h = load256(b + 128 + 32 * n);
            o->u[4 * n + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
            o->u[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
            o->u[4 * n + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30));
            o->u[4 * n + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                              _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
        }
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
        /* sc_g: lanes 0-7 sc[2g], lanes 8-15 sc[2g+1]; the pair is dword g */
        const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                              2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++)
            o->sc[g] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(g)), pick);
        o->mn = _mm256_slli_epi16(sc16, 5);
        o->d = o->dmin = _cvtsh_ss(ak_load_u16(b + 208));
        return;
    }
    uint8_t sc[8], mn[8];
    ak_kq_scales_k4(b + 4, sc, mn);
    const uint8_t *qs = b + (kt == KT_Q5K ? 48 : 16);
    __m256i qh = kt == KT_Q5K ? load256(b + 16) : _mm256_setzero_si256();
    const __m256i one = _mm256_set1_epi8(1);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m256i q = load256(qs + 32 * c);
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (kt == KT_Q5K) {
            /* bit 2c (2c + 1) of each qh byte, moved to bit 4 */
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
        }
        o->u[2 * c] = lo;
        o->u[2 * c + 1] = hi;
    }
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) o->sc[g] = _mm256_set1_epi16(sc[g]);
    __m128i m8 = _mm_loadl_epi64((const __m128i *)mn);
    o->mn = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));   /* mn[j/2] per 16 */
    o->d = _cvtsh_ss(ak_load_u16(b));
    o->dmin = _cvtsh_ss(ak_load_u16(b + 2));
}

/* acc += this super-block's contribution for one token. */
AK_INLINE AK_UNUSED_ON_VNNI void dot_k(const ksb *w, const ak_xq_k *x, __m256 *acc) {
    __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        __m256i p = _mm256_maddubs_epi16(w->u[g], _mm256_load_si256((const __m256i *)(x->q + 32 * g)));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, w->sc[g]));
    }
    __m256i corr = _mm256_madd_epi16(w->mn, _mm256_load_si256((const __m256i *)x->bsums));
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(w->d * x->d), *acc);
    *acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(corr), _mm256_set1_ps(w->dmin * x->d), *acc);
}

#if defined(AK_SIMD_AVX512) && defined(__AVX512VNNI__)
/* AVX-512 VNNI: a super-block is unpacked into four 64-byte vectors of
 * unsigned quants in element order and four vectors of 16-bit scales, one
 * per pair of elements (the lanes of vpmaddubsw's pair sums), so that
 *     isum += vpdpwssd(vpmaddubsw(u, x), sc)
 * accumulates the whole super-block exactly in int32 (pair sums <= 16002,
 * times |sc| <= 128, four terms per lane: < 2^26): two instructions per 64
 * elements, and the float work (convert, scale by d * dx, the min term) once
 * per super-block. Q4_K/Q5_K nibbles come from one 32-byte broadcast per 64
 * elements, shifted by 0 (low half) or 4 (high half) per 256-bit lane. */
typedef struct {
    __m512i u[4];
    __m512i sc[4];    /* int16 scale of each 16-bit lane's sub-block */
    __m256i mn;       /* int16 per 16 elements: mins, or Q6_K's 32 * sc */
    float d, dmin;
} kpan;
typedef kpan kblk;        /* the unpacked form the generic loops use */
typedef __m512 kacc;

AK_INLINE void unpack_kb(const int kt, const uint8_t *b, kpan *o) {
    const __m512i lane = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                          15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    if (kt == KT_Q6K) {
        const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++) {
            __m256i l0 = load256(b + 64 * n), l1 = load256(b + 64 * n + 32), h = load256(b + 128 + 32 * n);
            __m256i u0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
            __m256i u1 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
            __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30));
            __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
            o->u[2 * n] = _mm512_inserti64x4(_mm512_castsi256_si512(u0), u1, 1);
            o->u[2 * n + 1] = _mm512_inserti64x4(_mm512_castsi256_si512(u2), u3, 1);
        }
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
        o->d = o->dmin = _cvtsh_ss(ak_load_u16(b + 208));
        o->mn = _mm256_slli_epi16(sc16, 5);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)   /* lane k of vector c: elements 64c + 2k, +1: sub-block 4c + k/8 */
            o->sc[c] = _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_set1_epi16((short)(4 * c)),
                                                                 _mm512_srli_epi16(lane, 3)),
                                                _mm512_zextsi256_si512(sc16));
        return;
    }
    uint8_t sc[8], mn[8];
    ak_kq_scales_k4(b + 4, sc, mn);
    __m512i sc16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
    const uint8_t *qs = b + (kt == KT_Q5K ? 48 : 16);
    const __m512i m4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1);
    const __m512i sh4 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    __m512i qh = kt == KT_Q5K ? _mm512_broadcast_i64x4(load256(b + 16)) : _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        /* low nibbles (elements 64c..+31) in the low half, high in the high */
        __m512i q = _mm512_broadcast_i64x4(load256(qs + 32 * c));
        __m512i u = _mm512_and_si512(_mm512_srlv_epi16(q, sh4), m4);
        if (kt == KT_Q5K) {   /* bit 2c (low half) or 2c + 1 (high half) of qh, to bit 4 */
            __m512i s = _mm512_add_epi16(_mm512_set1_epi16((short)(2 * c)), _mm512_srli_epi16(sh4, 2));
            u = _mm512_or_si512(u, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, s), one), 4));
        }
        o->u[c] = u;
        o->sc[c] = _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_set1_epi16((short)(2 * c)),
                                                             _mm512_srli_epi16(lane, 4)), sc16);
    }
    __m128i m8 = _mm_loadl_epi64((const __m128i *)mn);
    o->mn = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
    o->d = _cvtsh_ss(ak_load_u16(b));
    o->dmin = _cvtsh_ss(ak_load_u16(b + 2));
}

/* acc += this super-block's contribution for one token. */
AK_INLINE void dot_kb(const kpan *w, const ak_xq_k *x, kacc *acc) {
    __m512i ia = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
        ia = _mm512_dpwssd_epi32(ia, _mm512_maddubs_epi16(w->u[c], _mm512_load_si512(x->q + 64 * c)), w->sc[c]);
    __m256i corr = _mm256_madd_epi16(w->mn, _mm256_load_si256((const __m256i *)x->bsums));
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_set1_ps(w->d * x->d), *acc);
    *acc = _mm512_fnmadd_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(corr)), _mm512_set1_ps(w->dmin * x->d), *acc);
}
/* Float accumulators of one output: zero, horizontal sum. */
AK_INLINE kacc kacc_zero(void) { return _mm512_setzero_ps(); }
AK_INLINE float kacc_sum(kacc a) { return _mm512_reduce_add_ps(a); }
#else
typedef ksb kblk;
typedef __m256 kacc;
/* Without VNNI the generic loops use the AVX2 unpacked form. */
AK_INLINE void unpack_kb(const int kt, const uint8_t *b, kblk *o) { unpack_k(kt, b, o); }
AK_INLINE void dot_kb(const kblk *w, const ak_xq_k *x, kacc *acc) { dot_k(w, x, acc); }
AK_INLINE kacc kacc_zero(void) { return _mm256_setzero_ps(); }
AK_INLINE float kacc_sum(kacc a) { return hsum8(a); }
#endif

/* Every path below sums a row's super-blocks in one order, whatever the
 * number of tokens: one chain of float accumulations over each chunk of
 * PAN_SB super-blocks (horizontal sum at its end), the chunks' sums added in
 * order. A token's result then does not depend on how many tokens share the
 * pass (decode, batched decode, prefill agree to the last bit). */
#define PAN_SB 16   /* super-blocks per chunk: 2 rows x 16 x 576 B of unpacked tiles stay in L1 */

/* One row times one token, unpacking in registers (decode). */
AK_INLINE float row_dot_k(const int kt, const uint8_t *w, size_t bb, const ak_xq_k *x, int64_t nsb) {
    float sum = 0;
    for (int64_t b0 = 0; b0 < nsb; b0 += PAN_SB) {
        kacc acc = kacc_zero();
        for (int64_t b = b0; b < nsb && b < b0 + PAN_SB; b++) {
            kblk k;
            unpack_kb(kt, w + (size_t)b * bb, &k);
            dot_kb(&k, x + b, &acc);
        }
        sum = b0 ? sum + kacc_sum(acc) : kacc_sum(acc);
    }
    return sum;
}

#define PANEL_ROWS 4
#define PANEL_TOKS 16

/* The rectangle a (rows [r0, r1) x tokens [t0, t1)) of K type kt, bb bytes
 * per super-block: unpack PANEL_ROWS rows' super-block once, use it for up
 * to PANEL_TOKS tokens (prefill). */
AK_INLINE AK_UNUSED_ON_VNNI void mm_k_panel(const int kt, size_t bb, const ak_mm_args *a) {
    const uint8_t *W = a->W, *xq = a->xq;
    const size_t wrb = a->wrb, xqs = a->xqs;
    const int64_t r0 = a->r0, r1 = a->r1, t0 = a->t0, t1 = a->t1, ldy = a->ldy, nsb = a->cols / AK_QKK;
    float *Y = a->Y;
    for (int64_t r = r0; r < r1; r += PANEL_ROWS) {
        const int R = (int)ak_min64(PANEL_ROWS, r1 - r);
        for (int64_t tc = t0; tc < t1; tc += PANEL_TOKS) {
            const int T = (int)ak_min64(PANEL_TOKS, t1 - tc);
            kacc acc[PANEL_TOKS][PANEL_ROWS];
            for (int64_t b0 = 0; b0 < nsb; b0 += PAN_SB) {
            for (int t = 0; t < T; t++)
                for (int i = 0; i < PANEL_ROWS; i++) acc[t][i] = kacc_zero();
            for (int64_t b = b0; b < nsb && b < b0 + PAN_SB; b++) {
                kblk ub[PANEL_ROWS];
                for (int i = 0; i < R; i++) unpack_kb(kt, W + (size_t)(r + i) * wrb + (size_t)b * bb, &ub[i]);
                for (int t = 0; t < T; t++) {
                    const ak_xq_k *x = (const ak_xq_k *)(xq + (size_t)(tc + t) * xqs) + b;
                    if (R == PANEL_ROWS) {
#pragma GCC unroll 4
                        for (int i = 0; i < PANEL_ROWS; i++) dot_kb(&ub[i], x, &acc[t][i]);
                    } else {
                        for (int i = 0; i < R; i++) dot_kb(&ub[i], x, &acc[t][i]);
                    }
                }
            }
            for (int t = 0; t < T; t++)
                for (int i = 0; i < R; i++) {
                    float v = kacc_sum(acc[t][i]);
                    Y[(tc + t) * ldy + r + i] = b0 ? Y[(tc + t) * ldy + r + i] + v : v;
                }
            }
        }
    }
}


#if defined(AK_SIMD_AVX512) && defined(__AVX512VNNI__)
/* Prefill / batched decode: pairs of rows are unpacked once per call (a
 * chunk of super-blocks at a time) and every token of the range runs over
 * them in tiles of 2 rows x 4 tokens, with 8 integer and 8 float
 * accumulators in registers. */
AK_INLINE void unpack_pan(const int kt, const uint8_t *b, kpan *o) { unpack_kb(kt, b, o); }


/* The operands of a panel tile: R rows' nsb unpacked super-blocks at P
 * (row r's at P + r * nsb), the tokens' XQ rows at xq (xqs bytes apart),
 * outputs Y[t * ldy + r]; add = 1 accumulates into Y. */
typedef struct {
    const kpan *P;
    int64_t nsb;
    const uint8_t *xq;
    size_t xqs;
    float *Y;
    int64_t ldy;
    int add;
} pan_args;

/* Y[t][r] (+)= rows P[r * nsb ..] x tokens for an R x T tile over nsb
 * super-blocks. */
AK_INLINE void pan_tile(const int R, const int T, const pan_args *a) {
    const kpan *P = a->P;
    const int64_t nsb = a->nsb, ldy = a->ldy;
    const uint8_t *xq = a->xq;
    const size_t xqs = a->xqs;
    float *Y = a->Y;
    const int add = a->add;
    __m512 acc[2][4];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const ak_xq_k *x[4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) x[t] = (const ak_xq_k *)(xq + (size_t)t * xqs) + b;
        __m512i ia[2][4];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) ia[r][t] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m512i xv[4];
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) xv[t] = _mm512_load_si512(x[t]->q + 64 * c);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                const kpan *p = P + r * nsb + b;
                __m512i u = _mm512_load_si512(&p->u[c]), sc = _mm512_load_si512(&p->sc[c]);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) ia[r][t] = _mm512_dpwssd_epi32(ia[r][t], _mm512_maddubs_epi16(u, xv[t]), sc);
            }
        }
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            const kpan *p = P + r * nsb + b;
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                /* as dot_kb, Q6_K included (dmin = d): the same rounding */
                __m256i corr = _mm256_madd_epi16(p->mn, _mm256_load_si256((const __m256i *)x[t]->bsums));
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[r][t]), _mm512_set1_ps(p->d * x[t]->d), acc[r][t]);
                acc[r][t] = _mm512_fnmadd_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(corr)),
                                             _mm512_set1_ps(p->dmin * x[t]->d), acc[r][t]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float v = _mm512_reduce_add_ps(acc[r][t]);
            Y[t * ldy + r] = add ? Y[t * ldy + r] + v : v;
        }
}

typedef void (*pan_tile_fn)(const pan_args *a);
#define PT(R, T) static void pt_##R##_##T(const pan_args *a) { pan_tile(R, T, a); }
PT(1, 1) PT(1, 2) PT(1, 3) PT(1, 4) PT(2, 1) PT(2, 2) PT(2, 3) PT(2, 4)
static const pan_tile_fn pan_tiles[2][4] = {
    {pt_1_1, pt_1_2, pt_1_3, pt_1_4}, {pt_2_1, pt_2_2, pt_2_3, pt_2_4},
};


/* The rectangle a (rows [r0, r1) x tokens [t0, t1)) of K type kt, bb bytes
 * per super-block: pairs of rows unpacked a chunk of super-blocks at a
 * time, then every token of the range runs over them. */
AK_INLINE void mm_k_tiles(const int kt, size_t bb, const ak_mm_args *a) {
    const uint8_t *W = a->W, *xq = a->xq;
    const size_t wrb = a->wrb, xqs = a->xqs;
    const int64_t r0 = a->r0, r1 = a->r1, t0 = a->t0, t1 = a->t1, ldy = a->ldy, nsb = a->cols / AK_QKK;
    float *Y = a->Y;
    kpan P[2 * PAN_SB];
    for (int64_t r = r0; r < r1; r += 2) {
        const int R = (int)ak_min64(2, r1 - r);
        for (int64_t b0 = 0; b0 < nsb; b0 += PAN_SB) {
            const int64_t nb = ak_min64(PAN_SB, nsb - b0);
            for (int i = 0; i < R; i++)
                for (int64_t b = 0; b < nb; b++) {
                    const uint8_t *blk = W + (size_t)(r + i) * wrb + (size_t)(b0 + b) * bb;
                    /* the next pair's bytes: weights stream from memory, and
                     * two interleaved rows defeat the hardware prefetcher */
                    if (r + 2 + i < r1)
                        for (size_t off = 0; off < bb + 63; off += 64)
                            _mm_prefetch((const char *)(blk + 2 * wrb + off), _MM_HINT_T0);
                    unpack_pan(kt, blk, &P[i * nb + b]);
                }
            for (int64_t t = t0; t < t1; t += 4) {
                const int T = (int)ak_min64(4, t1 - t);
                pan_tiles[R - 1][T - 1](&(pan_args){ .P = P, .nsb = nb,
                                                     .xq = xq + (size_t)t * xqs + (size_t)b0 * sizeof(ak_xq_k),
                                                     .xqs = xqs, .Y = Y + t * ldy + r, .ldy = ldy, .add = b0 > 0 });
            }
        }
    }
}
#endif

#if defined(AK_SIMD_AVX512) && defined(__AVX512VNNI__)
#define MM_K_MANY(KT, BB) mm_k_tiles(KT, BB, a)
#define MM_K_MIN_TOKENS 2
#else
#define MM_K_MANY(KT, BB) mm_k_panel(KT, BB, a)
#define MM_K_MIN_TOKENS 4
#endif

/* mm_q for one K type: register-unpacked rows per token for decode, the
 * tile or panel loops when enough tokens share the unpacking. */
#define MM_K(NAME, KT, BB)                                                                          \
    static void NAME(const ak_mm_args *a) {                                                         \
        const int64_t nsb = a->cols / AK_QKK;                                                       \
        if (a->t1 - a->t0 >= MM_K_MIN_TOKENS) {                                                     \
            MM_K_MANY(KT, BB);                                                                      \
            return;                                                                                 \
        }                                                                                           \
        for (int64_t t = a->t0; t < a->t1; t++)                                                     \
            for (int64_t r = a->r0; r < a->r1; r++)                                                 \
                a->Y[t * a->ldy + r] = row_dot_k(KT, a->W + (size_t)r * a->wrb,                     \
                                                 BB, (const ak_xq_k *)(a->xq + (size_t)t * a->xqs), nsb); \
    }
MM_K(mm_q4k, KT_Q4K, 144)
MM_K(mm_q5k, KT_Q5K, 176)
MM_K(mm_q6k, KT_Q6K, 210)

/* ---- 32-blocks ---------------------------------------------------------- */

enum { KT_Q41, KT_Q50, KT_Q51 };

/* The 32 fifth bits of a u32 (little-endian bytes at p) as 0x10 bytes. */
AK_INLINE __m256i bits_to_0x10(const uint8_t *p) {
    uint32_t h;
    memcpy(&h, p, 4);
    const __m256i idx = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), idx);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* dot of one row of a 32-block type (kt) with one token's XQ (q, d, s). */
AK_INLINE float row_dot_32(const int kt, const uint8_t *w, const int8_t *q, const float *ds, const float *ss,
                           int64_t nb) {
    const size_t bb = kt == KT_Q41 ? 20 : kt == KT_Q50 ? 22 : 24;
    const int qs_off = kt == KT_Q41 ? 4 : kt == KT_Q50 ? 6 : 8;
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    float extra = 0;
    for (int64_t b = 0; b < nb; b++, w += bb) {
        __m128i v = _mm_loadu_si128((const __m128i *)(w + qs_off));
        __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), m4);
        if (kt != KT_Q41) u = _mm256_or_si256(u, bits_to_0x10(w + (kt == KT_Q50 ? 2 : 4)));
        __m256i x = _mm256_loadu_si256((const __m256i *)(q + 32 * b));
        __m256i i = _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), ones);
        float d = _cvtsh_ss(ak_load_u16(w));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(d * ds[b]), acc);
        extra += (kt == KT_Q50 ? -16.0f * d : _cvtsh_ss(ak_load_u16(w + 2))) * ss[b];
    }
    return hsum8(acc) + extra;
}

/* mm_q for one 32-block type: rows x tokens of row_dot_32. */
#define MM_32(NAME, KT)                                                                             \
    static void NAME(const ak_mm_args *a) {                                                         \
        const int64_t cols = a->cols, nb = cols / AK_QK;                                            \
        for (int64_t t = a->t0; t < a->t1; t++) {                                                   \
            const int8_t *q = (const int8_t *)(a->xq + (size_t)t * a->xqs);                         \
            const float *ds = (const float *)(q + cols);                                            \
            for (int64_t r = a->r0; r < a->r1; r++)                                                 \
                a->Y[t * a->ldy + r] = row_dot_32(KT, a->W + (size_t)r * a->wrb, q, ds, ds + nb, nb); \
        }                                                                                           \
    }
MM_32(mm_q41, KT_Q41)
MM_32(mm_q50, KT_Q50)
MM_32(mm_q51, KT_Q51)

/* kernels_backend.h's mm_q contract for every type of kquant.h. */
static void mm_q(const ak_mm_args *a) {
    switch (a->wtype) {
    case GGML_TYPE_Q4_K: mm_q4k(a); break;
    case GGML_TYPE_Q5_K: mm_q5k(a); break;
    case GGML_TYPE_Q6_K: mm_q6k(a); break;
    case GGML_TYPE_Q4_1: mm_q41(a); break;
    case GGML_TYPE_Q5_0: mm_q50(a); break;
    case GGML_TYPE_Q5_1: mm_q51(a); break;
    default: break;
    }
}

const ak_kernel_backend ak_kq_backend_simd = {
#if defined(AK_SIMD_AVX512) && defined(__AVX512VNNI__)
    .name = "avx512vnni",
#else
    .name = "avx2",
#endif
    .xq_row_bytes = ak_kq_xq_row_bytes, .quantize_x = ak_kq_quantize_x, .mm_q = mm_q,
};

#else
typedef int ak_kernels_kquant_x86_unused;   /* ISO C wants a non-empty file */
#endif
