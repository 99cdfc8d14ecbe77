/* kernels_x86.c - the AVX-512 and AVX2 back ends (see kernels_backend.h).
 *
 * Quantized weights x 8-bit activations. The instructions at hand multiply
 * unsigned by signed bytes (vpdpbusd with AVX512-VNNI, vpmaddubsw otherwise),
 * so weights are fed as unsigned bytes u = q + o and the offset is removed
 * with the activation block's sum, known when activations are quantized:
 *     sum_i q_i x_i = sum_i u_i x_i - o * sum_i x_i
 * Q4_0 nibbles are already q + 8 (o = 8). Q8_0 uses u = q ^ 0x80 = q + 128
 * with vpdpbusd (no saturation); with vpmaddubsw, whose 16-bit pair sums would
 * saturate on 255 * 127, it uses the |q| x sign(x, q) trick instead (o = 0).
 * Each block's integer sums (one per 32-bit lane) are turned to float and
 * scaled per lane: acc += (isum * dx + cx) * dw, with cx = -o * sum(x) * dx
 * spread over the block's lanes, so correction and scales cost two FMAs.
 *
 * Tiles. A tile is R rows x T tokens of accumulators (at most 4 x 4): each
 * weight block, once unpacked, is used for T tokens and each activation block
 * for R rows. Tile functions are instantiated for every (R, T) so remainders
 * run the same code with smaller tiles. Weight rows stream from memory once
 * per call in decode, so the next tile's bytes are prefetched.
 *
 * AVX-512 has two layouts for quantized products: with VBMI+VNNI (Ice Lake,
 * Zen 4 and later) blocks are handled four at a time ("quads"), otherwise in
 * pairs. Float weights with many tokens use packed panels (see below).
 * AK_NO_QUADS forces the pair code, to test it on a VBMI machine.
 */
#include "kernels/kernels_impl.h"

#if defined(AK_SIMD_AVX512) || defined(AK_SIMD_AVX2)
#include <immintrin.h>

#include "base/util.h"

/* Weight rows are prefetched this many rows ahead (the next tile). */
#define PF_ROWS 4

#if defined(AK_SIMD_AVX512)
/* ======================================================================== */
/* AVX-512                                                                  */
/* ======================================================================== */

#define SIMD_NAME "avx512"
#if defined(__AVX512VNNI__)
#define Q8_OFFSET 128
#else
#define Q8_OFFSET 0
#endif
#define Q4_OFFSET 8

#if defined(__AVX512VBMI__) && defined(__AVX512VNNI__) && !defined(AK_NO_QUADS)
/* XQ layout with VBMI: blocks go in fours, one 256-byte record per quad:
 * elements 0..15 of the four blocks (16 bytes each), then elements 16..31,
 * then dx and cx per 32-bit lane (lanes 4j..4j+3 belong to block j). Weight
 * quads are rearranged to match with one vpermt2b, so two vpdpbusd cover
 * 128 elements and their sums need one conversion: the per-block overhead
 * (unpacking, scales, float conversion) is spread over four blocks. Missing
 * blocks of a last partial quad are all zero. */
typedef struct {
    int8_t lo[64];
    int8_t hi[64];
    float d[16];
    float c[16];
} xq_quad;

static size_t xq_row_bytes(uint32_t wtype, int64_t cols) {
    (void)wtype;
    return (size_t)((cols / AK_QK + 3) / 4) * sizeof(xq_quad);
}

static void quantize_x(uint32_t wtype, const float *x, void *dst, int64_t cols) {
    const float o = wtype == GGML_TYPE_Q8_0 ? Q8_OFFSET : Q4_OFFSET;
    const int64_t nb = cols / AK_QK;
    xq_quad *out = dst;
    for (int64_t b = 0; b < nb; b++) {
        xq_quad *qd = &out[b >> 2];
        const int j = (int)(b & 3);
        __m128i q0, q1;
        int sum;
        float d = ak_quantize_block_avx512(x + b * AK_QK, &q0, &q1, &sum);
        _mm_storeu_si128((__m128i *)(qd->lo + 16 * j), q0);
        _mm_storeu_si128((__m128i *)(qd->hi + 16 * j), q1);
        _mm_storeu_ps(qd->d + 4 * j, _mm_set1_ps(d));
        _mm_storeu_ps(qd->c + 4 * j, _mm_set1_ps((-o * (float)sum) * d * 0.25f));
    }
    for (int64_t b = nb; b & 3; b++) {   /* zero the rest of a partial quad */
        xq_quad *qd = &out[b >> 2];
        const int j = (int)(b & 3);
        memset(qd->lo + 16 * j, 0, 16);
        memset(qd->hi + 16 * j, 0, 16);
        memset(qd->d + 4 * j, 0, 16);
        memset(qd->c + 4 * j, 0, 16);
    }
}

/* One row's quad of weight blocks, as unsigned bytes in XQ order. */
typedef struct {
    __m512i lo, hi;
    __m512 d;       /* dw per 32-bit lane */
} wquad;

static inline __mmask64 byte_mask(int64_t n) {
    return n >= 64 ? ~(__mmask64)0 : n <= 0 ? 0 : ((__mmask64)1 << n) - 1;
}

/* Loads 64 bytes at b + off, or (tail) only those below `valid`. */
AK_INLINE __m512i load64(const uint8_t *b, int off, const int tail, int64_t valid) {
    return tail ? _mm512_maskz_loadu_epi8(byte_mask(valid - off), b + off)
                : _mm512_loadu_si512((const void *)(b + off));
}

/* nblk: 4, or 1..3 for the last quad (tail), whose bytes past the row's
 * end are never read. */
AK_INLINE wquad load_q8_quad(const uint8_t *b, const int tail, int nblk) {
    /* Block j's quants are bytes 34j+2..34j+33. Elements 0..15 of all four
     * come from bytes [0,128), elements 16..31 from [8,136): two permutes
     * of two 64-byte loads each. Scales are the words at 34j. */
    const __m512i idx_lo = _mm512_set_epi8(
        119, 118, 117, 116, 115, 114, 113, 112, 111, 110, 109, 108, 107, 106, 105, 104,
        85, 84, 83, 82, 81, 80, 79, 78, 77, 76, 75, 74, 73, 72, 71, 70,
        51, 50, 49, 48, 47, 46, 45, 44, 43, 42, 41, 40, 39, 38, 37, 36,
        17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2);
    const __m512i idx_hi = _mm512_set_epi8(   /* from bytes [8,72) and [72,136) */
        127, 126, 125, 124, 123, 122, 121, 120, 119, 118, 117, 116, 115, 114, 113, 112,
        93, 92, 91, 90, 89, 88, 87, 86, 85, 84, 83, 82, 81, 80, 79, 78,
        59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44,
        25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10);
    const __m512i idx_d = _mm512_set_epi16(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        51, 51, 51, 51, 34, 34, 34, 34, 17, 17, 17, 17, 0, 0, 0, 0);
    const int64_t valid = (int64_t)nblk * AK_Q8_0_BYTES;
    __m512i a0 = load64(b, 0, tail, valid), a1 = load64(b, 64, tail, valid);
    __m512i b0 = load64(b, 8, tail, valid), b1 = load64(b, 72, tail, valid);
    const __m512i sign = _mm512_set1_epi8((char)0x80);   /* q + 128 as unsigned */
    wquad w;
    w.lo = _mm512_xor_si512(_mm512_permutex2var_epi8(a0, idx_lo, a1), sign);
    w.hi = _mm512_xor_si512(_mm512_permutex2var_epi8(b0, idx_hi, b1), sign);
    w.d = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(a0, idx_d, a1)));
    return w;
}

AK_INLINE wquad load_q4_quad(const uint8_t *b, const int tail, int nblk) {
    /* Block j's nibbles are bytes 18j+2..18j+17, all within [0,72): one
     * permute of the loads at 0 and 8 gathers them; low nibbles are
     * elements 0..15, high nibbles 16..31. */
    const __m512i idx = _mm512_set_epi8(
        127, 126, 125, 124, 123, 122, 121, 120, 119, 118, 117, 116, 115, 114, 113, 112,
        53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43, 42, 41, 40, 39, 38,
        35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20,
        17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2);
    const __m512i idx_d = _mm512_set_epi16(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        27, 27, 27, 27, 18, 18, 18, 18, 9, 9, 9, 9, 0, 0, 0, 0);
    const int64_t valid = (int64_t)nblk * AK_Q4_0_BYTES;
    __m512i a0 = load64(b, 0, tail, valid), a1 = load64(b, 8, tail, valid);
    __m512i z = _mm512_permutex2var_epi8(a0, idx, a1);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    wquad w;
    w.lo = _mm512_and_si512(z, m4);
    w.hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
    w.d = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(idx_d, a0)));
    return w;
}

/* One quad of blocks (index p) for the R x T tile a. */
AK_INLINE void q_step(const int q8, const int R, const int T, const int tail, int nblk,
                      __m512 acc[MAXR][MAXT], const ak_mm_tile *a, int64_t p) {
    const uint8_t *W = a->W, *xq = a->xq;
    const size_t wrb = a->wrb, xqs = a->xqs;
    const size_t quad_bytes = q8 ? 4 * AK_Q8_0_BYTES : 4 * AK_Q4_0_BYTES;
    wquad w[MAXR];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const uint8_t *b = W + (size_t)r * wrb + (size_t)p * quad_bytes;
        /* weights stream from memory once: fetch the next tile's ahead */
        for (size_t off = 0; off < quad_bytes + 63; off += 64)
            _mm_prefetch((const char *)(b + PF_ROWS * wrb + off), _MM_HINT_T0);
        w[r] = q8 ? load_q8_quad(b, tail, nblk) : load_q4_quad(b, tail, nblk);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const xq_quad *x = (const xq_quad *)(xq + (size_t)t * xqs) + p;
        __m512i xlo = _mm512_load_si512(x->lo), xhi = _mm512_load_si512(x->hi);
        __m512 dx = _mm512_load_ps(x->d), cx = _mm512_load_ps(x->c);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512i i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[r].lo, xlo);
            i = _mm512_dpbusd_epi32(i, w[r].hi, xhi);
            __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), dx, cx);
            acc[r][t] = _mm512_fmadd_ps(f, w[r].d, acc[r][t]);
        }
    }
}

/* Y[t * ldy + r] of the R x T tile a: its nb blocks, a quad at a time. */
AK_INLINE void q_tile(const int q8, const int R, const int T, const ak_mm_tile *a) {
    const int64_t nb = a->nb, ldy = a->ldy;
    float *Y = a->Y;
    __m512 acc[MAXR][MAXT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    const int64_t nq = nb / 4;
    for (int64_t p = 0; p < nq; p++) q_step(q8, R, T, 0, 4, acc, a, p);
    if (nb & 3) q_step(q8, R, T, 1, (int)(nb & 3), acc, a, nq);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) Y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

#else /* pairs of blocks, without VBMI */

/* XQ layout: blocks go in pairs, one 192-byte record per pair: the 64 quants,
 * then dx and cx pre-expanded to one float per 32-bit lane (block 0 in lanes
 * 0-7, block 1 in lanes 8-15), ready to be loaded as vectors. An odd last
 * block gets a pair whose second half is all zero. */
typedef struct {
    int8_t q[64];
    float d[16];
    float c[16];
} xq_pair;

static size_t xq_row_bytes(uint32_t wtype, int64_t cols) {
    (void)wtype;
    return (size_t)((cols / AK_QK + 1) / 2) * sizeof(xq_pair);
}

static void quantize_x(uint32_t wtype, const float *x, void *dst, int64_t cols) {
    const float o = wtype == GGML_TYPE_Q8_0 ? Q8_OFFSET : Q4_OFFSET;
    const int64_t nb = cols / AK_QK;
    xq_pair *out = dst;
    for (int64_t b = 0; b < nb; b++) {
        xq_pair *pr = &out[b >> 1];
        const int h = (int)(b & 1);
        __m128i q0, q1;
        int sum;
        float d = ak_quantize_block_avx512(x + b * AK_QK, &q0, &q1, &sum);
        _mm_storeu_si128((__m128i *)(pr->q + 32 * h), q0);
        _mm_storeu_si128((__m128i *)(pr->q + 32 * h + 16), q1);
        _mm256_storeu_ps(pr->d + 8 * h, _mm256_set1_ps(d));
        _mm256_storeu_ps(pr->c + 8 * h, _mm256_set1_ps((-o * (float)sum) * d * 0.125f));
    }
    if (nb & 1) {
        xq_pair *pr = &out[nb >> 1];
        memset(pr->q + 32, 0, 32);
        memset(pr->d + 8, 0, 32);
        memset(pr->c + 8, 0, 32);
    }
}

/* One row's pair of weight blocks, unpacked. */
typedef struct {
    __m512i u;      /* unsigned bytes, in element order, block 0 then block 1 */
    __m512 d;       /* dw per 32-bit lane */
#if !defined(__AVX512VNNI__)
    __mmask64 neg;  /* Q8_0 without VNNI: bytes where q < 0 */
#endif
} wpair;

/* [d0 x 8, d1 x 8] from two halves packed in one u32. */
AK_INLINE __m512 pair_scales(uint32_t h01) {
    __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)h01));
    const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f));
}

/* b points at the first block; two = 0 loads only that block (odd tail). */
AK_INLINE wpair load_q8_pair(const uint8_t *b, const int two) {
    wpair w;
    __m256i q0 = _mm256_loadu_si256((const __m256i *)(b + 2));
    __m512i q = two ? _mm512_inserti64x4(_mm512_castsi256_si512(q0),
                                         _mm256_loadu_si256((const __m256i *)(b + 36)), 1)
                    : _mm512_zextsi256_si512(q0);
    w.d = pair_scales(ak_load_u16(b) | (two ? (uint32_t)ak_load_u16(b + 34) << 16 : 0));
#if defined(__AVX512VNNI__)
    w.u = _mm512_xor_si512(q, _mm512_set1_epi8((char)0x80));
#else
    w.u = _mm512_abs_epi8(q);
    w.neg = _mm512_movepi8_mask(q);
#endif
    return w;
}

AK_INLINE wpair load_q4_pair(const uint8_t *b, const int two) {
    wpair w;
    __m128i q0 = _mm_loadu_si128((const __m128i *)(b + 2));
    __m256i q = two ? _mm256_inserti128_si256(_mm256_castsi128_si256(q0),
                                              _mm_loadu_si128((const __m128i *)(b + 20)), 1)
                    : _mm256_zextsi128_si256(q0);
    /* 128-bit lanes [blk0, blk0, blk1, blk1]; shifting the second copy of
     * each right by 4 turns it into the high nibbles = elements 16..31. */
    __m512i z = _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0),
                                         _mm512_castsi256_si512(q));
    const int64_t s4 = 0x0004000400040004LL;
    z = _mm512_srlv_epi16(z, _mm512_set_epi64(s4, s4, 0, 0, s4, s4, 0, 0));
    w.u = _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
    w.d = pair_scales(ak_load_u16(b) | (two ? (uint32_t)ak_load_u16(b + 18) << 16 : 0));
#if !defined(__AVX512VNNI__)
    w.neg = 0;
#endif
    return w;
}

/* Per 32-bit lane: sum of 4 products u * x. */
AK_INLINE __m512i dot_u8s8(const int q8, const wpair *w, __m512i x) {
#if defined(__AVX512VNNI__)
    (void)q8;
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), w->u, x);
#else
    if (q8) x = _mm512_mask_sub_epi8(x, w->neg, _mm512_setzero_si512(), x);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(w->u, x), _mm512_set1_epi16(1));
#endif
}

/* One pair of blocks (pair index p) for the R x T tile a. */
AK_INLINE void q_step(const int q8, const int R, const int T, const int two, __m512 acc[MAXR][MAXT],
                      const ak_mm_tile *a, int64_t p) {
    const uint8_t *W = a->W, *xq = a->xq;
    const size_t wrb = a->wrb, xqs = a->xqs;
    const size_t pair_bytes = q8 ? 2 * AK_Q8_0_BYTES : 2 * AK_Q4_0_BYTES;
    wpair w[MAXR];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const uint8_t *b = W + (size_t)r * wrb + (size_t)p * pair_bytes;
        _mm_prefetch((const char *)(b + PF_ROWS * wrb), _MM_HINT_T0);
        w[r] = q8 ? load_q8_pair(b, two) : load_q4_pair(b, two);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const xq_pair *x = (const xq_pair *)(xq + (size_t)t * xqs) + p;
        __m512i xv = _mm512_load_si512(x->q);
        __m512 dx = _mm512_load_ps(x->d), cx = _mm512_load_ps(x->c);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_u8s8(q8, &w[r], xv)), dx, cx);
            acc[r][t] = _mm512_fmadd_ps(f, w[r].d, acc[r][t]);
        }
    }
}

/* Y[t * ldy + r] of the R x T tile a: its nb blocks, a pair at a time. */
AK_INLINE void q_tile(const int q8, const int R, const int T, const ak_mm_tile *a) {
    const int64_t nb = a->nb, ldy = a->ldy;
    float *Y = a->Y;
    __m512 acc[MAXR][MAXT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    const int64_t np = nb / 2;
    for (int64_t p = 0; p < np; p++) q_step(q8, R, T, 1, acc, a, p);
    if (nb & 1) q_step(q8, R, T, 0, acc, a, np);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) Y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

#endif /* VBMI */

/* Float weights: 16 elements of a row as f32; `m` masks a partial tail. */
AK_INLINE __m512 load_w16(const int ft, const uint8_t *row, int64_t k, const int tail, __mmask16 m) {
    if (ft == 0) {
        const float *p = (const float *)(row + 4 * k);
        return tail ? _mm512_maskz_loadu_ps(m, p) : _mm512_loadu_ps(p);
    }
    const uint8_t *p = row + 2 * k;
    __m256i h = tail ? _mm256_maskz_loadu_epi16(m, p) : _mm256_loadu_si256((const __m256i *)p);
    if (ft == 1) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));   /* bf16 */
}

/* Columns k..k+15 (m: those that exist) of the R x T float tile a. */
AK_INLINE void f_step(const int ft, const int R, const int T, const int tail, __m512 acc[MAXR][MAXT],
                      const ak_mm_tile *a, int64_t k, __mmask16 m) {
    const uint8_t *W = a->W;
    const size_t wrb = a->wrb;
    const float *X = a->X;
    const int64_t ldx = a->ldx;
    __m512 w[MAXR];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        _mm_prefetch((const char *)(W + (size_t)(r + PF_ROWS) * wrb + (ft ? 2 : 4) * k), _MM_HINT_T0);
        w[r] = load_w16(ft, W + (size_t)r * wrb, k, tail, m);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const float *x = X + t * ldx + k;
        __m512 xv = tail ? _mm512_maskz_loadu_ps(m, x) : _mm512_loadu_ps(x);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(w[r], xv, acc[r][t]);
    }
}

/* Y[t * ldy + r] of the R x T float tile a, 16 columns at a time. */
AK_INLINE void f_tile(const int ft, const int R, const int T, const ak_mm_tile *a) {
    const int64_t cols = a->cols, ldy = a->ldy;
    float *Y = a->Y;
    __m512 acc[MAXR][MAXT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= cols; k += 16) f_step(ft, R, T, 0, acc, a, k, 0xffff);
    if (k < cols) f_step(ft, R, T, 1, acc, a, k, (__mmask16)((1u << (cols - k)) - 1));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) Y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

static void f32_to_f16_row(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) y[i] = ak_f32_to_f16(x[i]);
}

static void f16_to_f32_row(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
    for (; i < n; i++) y[i] = ak_f16_to_f32(x[i]);
}

/* ---- Float weights, many tokens: packed panels and outer products ----
 * The dot-product tiles above end every output with a horizontal sum and
 * read both operands from L2 once rows get long. For prefill, weights are
 * instead packed, PANEL_R rows x KC columns at a time, into a k-major f32
 * panel on the stack (conversion from F16/BF16 done once here), and a
 * micro-kernel accumulates PANEL_R outputs for NT tokens as outer products:
 * acc[t] += panel[k] * broadcast(x[t][k]). No horizontal sums, the panel
 * stays in cache for all token tiles, and outputs are stored as vectors. */
#define PANEL_V 3                   /* vectors of 16 rows in a panel */
#define PANEL_R (16 * PANEL_V)
#define KC 256                      /* columns per panel: 48 KB of f32 */
#define NT_MAX 8                    /* tokens per micro-kernel: 24 accumulators */
#define PACKED_MIN_TOKENS 16        /* below this, packing does not pay */

/* 16 x 16 transpose: r[i] holds row i; afterwards r[j] holds column j. */
AK_INLINE void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    /* u[4g + m], m = 0..3: per 128-bit lane j, column 4j + m of rows 4g..4g+3 */
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        __m512 a = t[4 * g], b = t[4 * g + 1], c = t[4 * g + 2], d = t[4 * g + 3];
        u[4 * g + 0] = _mm512_shuffle_ps(a, c, 0x44);
        u[4 * g + 1] = _mm512_shuffle_ps(a, c, 0xee);
        u[4 * g + 2] = _mm512_shuffle_ps(b, d, 0x44);
        u[4 * g + 3] = _mm512_shuffle_ps(b, d, 0xee);
    }
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) {
        __m512 a = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x88);
        __m512 b = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xdd);
        __m512 c = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x88);
        __m512 d = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xdd);
        r[m] = _mm512_shuffle_f32x4(a, c, 0x88);
        r[8 + m] = _mm512_shuffle_f32x4(a, c, 0xdd);
        r[4 + m] = _mm512_shuffle_f32x4(b, d, 0x88);
        r[12 + m] = _mm512_shuffle_f32x4(b, d, 0xdd);
    }
}

/* P[k * PANEL_R + i] = W[i][kc + k] as f32 for i < mr (0 beyond), k < kn. */
static void pack_panel(int ft, const uint8_t *W, size_t wrb, int mr, int64_t kc, int64_t kn, float *P) {
    const int es = ft ? 2 : 4;
    for (int i0 = 0; i0 < PANEL_R; i0 += 16) {
        for (int64_t k = 0; k < kn; k += 16) {
            int n = (int)ak_min64(16, kn - k);
            __mmask16 m = (__mmask16)((1u << n) - 1);
            __m512 r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                r[i] = i0 + i < mr ? load_w16(ft, W + (size_t)(i0 + i) * wrb + es * kc, k, 1, m)
                                   : _mm512_setzero_ps();
            transpose16(r);
            for (int j = 0; j < n; j++) _mm512_store_ps(P + (k + j) * PANEL_R + i0, r[j]);
        }
    }
}

/* The operands of a micro-kernel: the panel P of kn columns, the tokens'
 * rows at X (ldx floats apart), outputs Y[t * ldy + i]; m[v] masks the rows
 * of vector v that exist; accumulate: add to Y rather than store. */
typedef struct {
    const float *P;
    int64_t kn;
    const float *X;
    int64_t ldx;
    float *Y;
    int64_t ldy;
    const __mmask16 *m;
    int accumulate;
} micro_args;

/* Y[t][0..mr) (+)= sum over k < kn of P[k][.] * X[t][k], for NT tokens. */
AK_INLINE void f_micro(const int NT, const micro_args *a) {
    const float *P = a->P, *X = a->X;
    const int64_t kn = a->kn, ldx = a->ldx, ldy = a->ldy;
    float *Y = a->Y;
    const __mmask16 *m = a->m;
    const int accumulate = a->accumulate;
    __m512 acc[NT_MAX][PANEL_V];
#pragma GCC unroll 16
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int v = 0; v < PANEL_V; v++) acc[t][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kn; k++) {
        __m512 w[PANEL_V];
#pragma GCC unroll 4
        for (int v = 0; v < PANEL_V; v++) w[v] = _mm512_load_ps(P + k * PANEL_R + 16 * v);
#pragma GCC unroll 16
        for (int t = 0; t < NT; t++) {
            __m512 xb = _mm512_set1_ps(X[t * ldx + k]);
#pragma GCC unroll 4
            for (int v = 0; v < PANEL_V; v++) acc[t][v] = _mm512_fmadd_ps(w[v], xb, acc[t][v]);
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < NT; t++) {
        float *y = Y + t * ldy;
#pragma GCC unroll 4
        for (int v = 0; v < PANEL_V; v++) {
            if (accumulate) acc[t][v] = _mm512_add_ps(acc[t][v], _mm512_maskz_loadu_ps(m[v], y + 16 * v));
            _mm512_mask_storeu_ps(y + 16 * v, m[v], acc[t][v]);
        }
    }
}

typedef void (*f_micro_fn)(const micro_args *a);
#define MICRO(NT)                                                                          \
    static void f_micro_##NT(const micro_args *a) { f_micro(NT, a); }
MICRO(1) MICRO(2) MICRO(3) MICRO(4) MICRO(5) MICRO(6) MICRO(7) MICRO(8)
static const f_micro_fn f_micros[NT_MAX] = {
    f_micro_1, f_micro_2, f_micro_3, f_micro_4, f_micro_5, f_micro_6, f_micro_7, f_micro_8,
};

/* mm_f's contract for the rectangle a (ft: ak_ftype_index) through packed
 * panels. Loop order: column block outermost so that the tokens' X block
 * stays in L2 while every row panel of the rectangle passes over it. */
static void mm_f_packed(int ft, const ak_mm_args *a) {
    const uint8_t *W = a->W;
    const size_t wrb = a->wrb;
    const int64_t r0 = a->r0, r1 = a->r1, cols = a->cols, t0 = a->t0, t1 = a->t1, ldy = a->ldy;
    const float *X = a->X;
    float *Y = a->Y;
    _Alignas(64) float P[KC * PANEL_R];
    for (int64_t kc = 0; kc < cols; kc += KC) {
        int64_t kn = ak_min64(KC, cols - kc);
        for (int64_t r = r0; r < r1; r += PANEL_R) {
            int mr = (int)ak_min64(PANEL_R, r1 - r);
            __mmask16 m[PANEL_V];
            for (int v = 0; v < PANEL_V; v++) {
                int left = mr - 16 * v;
                m[v] = (__mmask16)(left >= 16 ? 0xffff : left > 0 ? (1u << left) - 1 : 0);
            }
            pack_panel(ft, W + (size_t)r * wrb, wrb, mr, kc, kn, P);
            for (int64_t t = t0; t < t1; t += NT_MAX) {
                int nt = (int)ak_min64(NT_MAX, t1 - t);
                f_micros[nt - 1](&(micro_args){ .P = P, .kn = kn, .X = X + t * cols + kc, .ldx = cols,
                                                .Y = Y + t * ldy + r, .ldy = ldy, .m = m, .accumulate = kc > 0 });
            }
        }
    }
}

#define TILE_R 4
#define TILE_T 4

#else /* AK_SIMD_AVX2 */
/* ======================================================================== */
/* AVX2 + FMA + F16C                                                        */
/* ======================================================================== */

#define SIMD_NAME "avx2"
#define Q8_OFFSET 0   /* |q| x sign(x, q) with vpmaddubsw */
#define Q4_OFFSET 8

/* XQ layout: nb blocks of 32 quants, then nb scales dx, then nb cx. */
static size_t xq_row_bytes(uint32_t wtype, int64_t cols) {
    (void)wtype;
    return ak_round64((size_t)cols + (size_t)(cols / AK_QK) * 8);
}

AK_INLINE float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

AK_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AK_INLINE int hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static void quantize_x(uint32_t wtype, const float *x, void *dst, int64_t cols) {
    const float o = wtype == GGML_TYPE_Q8_0 ? Q8_OFFSET : Q4_OFFSET;
    const int64_t nb = cols / AK_QK;
    int8_t *q = dst;
    float *ds = (float *)(q + cols), *cs = ds + nb;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < nb; b++) {
        __m256 v[4], a = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + b * AK_QK + 8 * i);
            a = _mm256_max_ps(a, _mm256_andnot_ps(sign, v[i]));
        }
        float amax = hmax8(a);
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        __m256i qi[4];
        for (int i = 0; i < 4; i++) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
        int sum = hsum8i(_mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3])));
        /* packs work within 128-bit lanes; the final permute restores order */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + b * AK_QK), p);
        ds[b] = d;
        cs[b] = (-o * (float)sum) * d * 0.125f;
    }
}

typedef struct {
    __m256i u;      /* unsigned bytes: |q| for Q8_0, nibbles for Q4_0 */
    __m256i s;      /* Q8_0: q itself, whose signs go onto x */
    __m256 d;
} wblk;

AK_INLINE wblk load_q8(const uint8_t *b) {
    wblk w;
    w.s = _mm256_loadu_si256((const __m256i *)(b + 2));
    w.u = _mm256_abs_epi8(w.s);
    w.d = _mm256_set1_ps(_cvtsh_ss(ak_load_u16(b)));
    return w;
}

AK_INLINE wblk load_q4(const uint8_t *b) {
    wblk w;
    __m128i q = _mm_loadu_si128((const __m128i *)(b + 2));
    w.u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
    w.s = w.u;
    w.d = _mm256_set1_ps(_cvtsh_ss(ak_load_u16(b)));
    return w;
}

AK_INLINE __m256i dot_u8s8(const int q8, const wblk *w, __m256i x) {
    if (q8) x = _mm256_sign_epi8(x, w->s);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w->u, x), _mm256_set1_epi16(1));
}

/* Y[t * ldy + r] of the R x T tile a, a block at a time. */
AK_INLINE void q_tile(const int q8, const int R, const int T, const ak_mm_tile *a) {
    const uint8_t *W = a->W, *xq = a->xq;
    const size_t wrb = a->wrb, xqs = a->xqs;
    const int64_t nb = a->nb, ldy = a->ldy;
    float *Y = a->Y;
    const size_t blk_bytes = q8 ? AK_Q8_0_BYTES : AK_Q4_0_BYTES;
    const int64_t cols = nb * AK_QK;
    __m256 acc[MAXR][MAXT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        wblk w[MAXR];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *p = W + (size_t)r * wrb + (size_t)b * blk_bytes;
            _mm_prefetch((const char *)(p + PF_ROWS * wrb), _MM_HINT_T0);
            w[r] = q8 ? load_q8(p) : load_q4(p);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const int8_t *x = (const int8_t *)(xq + (size_t)t * xqs);
            const float *ds = (const float *)(x + cols);
            __m256i xv = _mm256_loadu_si256((const __m256i *)(x + b * AK_QK));
            __m256 dx = _mm256_broadcast_ss(ds + b), cx = _mm256_broadcast_ss(ds + nb + b);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256 f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(q8, &w[r], xv)), dx, cx);
                acc[r][t] = _mm256_fmadd_ps(f, w[r].d, acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) Y[t * ldy + r] = hsum8(acc[r][t]);
}

AK_INLINE __m256 load_w8(const int ft, const uint8_t *row, int64_t k) {
    if (ft == 0) return _mm256_loadu_ps((const float *)(row + 4 * k));
    __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * k));
    if (ft == 1) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AK_INLINE float load_w1(const int ft, const uint8_t *row, int64_t k) {
    if (ft == 0) { float v; memcpy(&v, row + 4 * k, 4); return v; }
    uint16_t h = ak_load_u16(row + 2 * k);
    return ft == 1 ? _cvtsh_ss(h) : ak_bf16_to_f32(h);
}

/* Y[t * ldy + r] of the R x T float tile a, 8 columns at a time. */
AK_INLINE void f_tile(const int ft, const int R, const int T, const ak_mm_tile *a) {
    const uint8_t *W = a->W;
    const size_t wrb = a->wrb;
    const float *X = a->X;
    const int64_t ldx = a->ldx, cols = a->cols, ldy = a->ldy;
    float *Y = a->Y;
    __m256 acc[MAXR][MAXT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= cols; k += 8) {
        __m256 w[MAXR];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            _mm_prefetch((const char *)(W + (size_t)(r + PF_ROWS) * wrb + (ft ? 2 : 4) * k), _MM_HINT_T0);
            w[r] = load_w8(ft, W + (size_t)r * wrb, k);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256 xv = _mm256_loadu_ps(X + t * ldx + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(w[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float s = hsum8(acc[r][t]);
            for (int64_t i = k; i < cols; i++) s += load_w1(ft, W + (size_t)r * wrb, i) * X[t * ldx + i];
            Y[t * ldy + r] = s;
        }
}

static void f32_to_f16_row(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) y[i] = ak_f32_to_f16(x[i]);
}

static void f16_to_f32_row(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = ak_f16_to_f32(x[i]);
}

#define TILE_R 4
#define TILE_T 2

#endif /* AVX2 */

/* ======================================================================== */
/* Shared: tile instantiation and the rectangle loops                       */
/* ======================================================================== */

INST_R(qt, q_tile, 0)
INST_R(qt, q_tile, 1)
static const ak_mm_tile_fn q_tiles[2][4][4] = { ROW_R(qt, 0), ROW_R(qt, 1) };

INST_R(ft, f_tile, 0)
INST_R(ft, f_tile, 1)
INST_R(ft, f_tile, 2)
static const ak_mm_tile_fn f_tiles[3][4][4] = { ROW_R(ft, 0), ROW_R(ft, 1), ROW_R(ft, 2) };

/* kernels_backend.h's mm_q contract: Q8_0 and Q4_0 weights, in tiles. */
static void mm_q(const ak_mm_args *a) {
    ak_mm_tiles(a, q_tiles[a->wtype == GGML_TYPE_Q8_0], TILE_R, TILE_T, 1);
}

/* kernels_backend.h's mm_f contract: F32, F16 and BF16 weights, in tiles
 * (with AVX-512 and many tokens, packed panels). */
static void mm_f(const ak_mm_args *a) {
    const int ft = ak_ftype_index(a->wtype);
#if defined(AK_SIMD_AVX512)
    if (a->t1 - a->t0 >= PACKED_MIN_TOKENS) {
        mm_f_packed(ft, a);
        return;
    }
#endif
    ak_mm_tiles(a, f_tiles[ft], TILE_R, TILE_T, 0);
}

const ak_kernel_backend ak_backend_simd = {
    .name = SIMD_NAME, .xq_row_bytes = xq_row_bytes, .quantize_x = quantize_x, .mm_q = mm_q, .mm_f = mm_f,
    .f32_to_f16 = f32_to_f16_row, .f16_to_f32 = f16_to_f32_row,
};

#else
typedef int ak_kernels_x86_unused;   /* ISO C wants a non-empty file */
#endif
