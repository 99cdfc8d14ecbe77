/* kernels_packed_k.c - Q4_K, Q5_K and Q6_K weight matrices regrouped for VNNI.
 *
 * The idea is kernels_packed.c's: rows are taken 16 at a time, and one
 * 64-byte vector holds 4 consecutive elements of 16 rows, so that one
 * vpdpbusd (u8 weights x s8 activations, four products per 32-bit lane)
 * against 4 activation bytes broadcast to every lane advances 16 rows at
 * once, with no horizontal sums. What K super-blocks add is a scale per
 * sub-block and row: a sub-block's integer sums (one int32 lane per row) are
 * converted once and multiplied by the 16 rows' d * sc (exact in f32: an
 * IEEE half times a 6- or 8-bit integer) in one FMA per 16 rows and token.
 * Done in integers (vpmulld, then one conversion per super-block) it
 * measured no faster, and the FMA has the shorter latency.
 *
 * Packed layout ("K16"). Groups of 16 rows; the last group is padded with
 * zero rows. Group g of a matrix with nsb = cols / 256 super-blocks per row
 * starts at g * nsb * RB and holds nsb records of RB bytes (a multiple of
 * 64), one per super-block, each the 16 rows' bytes of that super-block:
 *   Q4_K (RB 2368):
 *     0     codes: 4 chunks c of 64 elements x 8 vectors p of 64 bytes; in
 *           vector (c, p), bytes 4r..4r+3 are row r's qs[32c + 4p .. +3]:
 *           low nibbles elements 64c + 4p .. +3 (sub-block 2c), high
 *           nibbles 64c + 32 + 4p .. +3 (sub-block 2c + 1)
 *     2048  sc[8][16]: sub-block j's scale of row r at 16j + r (u8, < 64)
 *     2176  mn[4][16][2]: the mins of sub-blocks 2k and 2k + 1 of row r at
 *           32k + 2r and 32k + 2r + 1 (u8, < 64)
 *     2304  d[16], then 2336 dmin[16] (IEEE halves)
 *   Q5_K (RB 2880): Q4_K's codes; 2048: the fifth bits, 8 vectors p of 64
 *     bytes, bytes 4r..4r+3 of vector p being row r's qh[4p .. +3] (bit 2c
 *     the fifth bit of element 64c + 4p + i, bit 2c + 1 that of
 *     64c + 32 + 4p + i); then sc, mn, d, dmin as Q4_K from 2560.
 *   Q6_K (RB 3392):
 *     0     codes: for n < 2 and p < 8, at 192 (8n + p): two vectors of
 *           low bits, bytes 4r..4r+3 of vector kk being row r's
 *           ql[64n + 32kk + 4p .. +3], and one of high bits, row r's
 *           qh[32n + 4p .. +3]. Element 128n + 32k + 4p + i has its low 4
 *           bits in nibble k >> 1 of vector k & 1, its high 2 at bits 2k.
 *     3072  sc[16][16]: scale i of row r at 16i + r (s8)
 *     3328  d[16] (IEEE halves), then zero to 3392
 * Same bytes as the row-major blocks but for the scales (stored unpacked, a
 * little more): the packed copy replaces them.
 *
 * Activations ("XK"), per token and super-block, 384 bytes: 256 int8 quants
 * (d = amax / 127 over the super-block, round half to even: the row-major K
 * kernels' arithmetic, kquant.c), then at 256 the 8 int16 sums of each 32
 * (for the mins), at 272 the 16 int32 values -32 * (sum of each 16) (Q6_K's
 * offset of 32, with which a sub-block's integer sum starts), at 336 the
 * float d.
 *
 * Arithmetic per row and super-block, the same whatever the number of
 * tokens or groups in the pass (decode, batched decode and prefill agree to
 * the last bit):
 *     s_j  = sum_i u_i x_i [Q6_K: - 32 sum_i x_i]     exact int32 per sub-block j
 *     f    = fma(float(s_j), d * sc_j, f), j = 0, 1, ... in order, from f = 0
 *     corr = sum_j mn_j * (sum_i x_i)                   exact int32 (Q4_K, Q5_K)
 *     acc  = fma(f, dx, acc), then acc = fma(-float(corr), dmin * dx, acc)
 * The integer sums are exact whatever order the instructions take (|s_j| <
 * 2^17), so chains may be split as latency asks.
 *
 * The threaded driver is kernels_packed.c's (ak_matmul_packed); this file
 * gives it the layout, the XK quantizer and the tiles of a work item. Built
 * where AVX512-VNNI is available and, on 32-byte vectors, with AVX2 or
 * AVX-512 without VNNI (see its section); elsewhere ak_packed_k_bytes says
 * 0 and the row-major kernels take these types.
 */

#include "kernels/kernels_impl.h"
#include "kernels/kquant.h"
#include "base/util.h"

#if defined(AK_SIMD_AVX512) && defined(__AVX512VNNI__) && !defined(AK_NO_PACKED)
#define AK_PACKED_K 1
#define AK_PACKED_K512 1
#include <immintrin.h>
#elif (defined(AK_SIMD_AVX2) || defined(AK_SIMD_AVX512)) && !defined(AK_NO_PACKED)
#define AK_PACKED_K 1
#define AK_PACKED_K256 1   /* vpmaddubsw (also AVX-512 without VNNI), or AVX-VNNI's vpdpbusd */
#include <immintrin.h>
#elif defined(AK_SIMD_NEON) && !defined(AK_NO_PACKED)
#define AK_PACKED_K 1      /* the quantizer and tiles: kernels_packed_k_arm.c */
#endif

#define GROUP 16            /* rows per group */
#define TILE_T 8            /* tokens per tile */
#define PF_L1 1024          /* prefetch distances in a group's stream, into L1 */
#define PF_L2 4096          /* and into L2 */
#define XK_BYTES 384        /* one super-block of one token's activations */
#define XK_S32 256
#define XK_C16 272
#define XK_D 336

enum { KP_Q4K, KP_Q5K, KP_Q6K };

static int kp_kind(uint32_t wtype) {
    return wtype == GGML_TYPE_Q4_K ? KP_Q4K : wtype == GGML_TYPE_Q5_K ? KP_Q5K : wtype == GGML_TYPE_Q6_K ? KP_Q6K : -1;
}

/* Record bytes and the offsets inside a record, per kind. */
static inline size_t rec_bytes(int kt) { return kt == KP_Q4K ? 2368 : kt == KP_Q5K ? 2880 : 3392; }
static inline size_t off_sc(int kt) { return kt == KP_Q4K ? 2048 : kt == KP_Q5K ? 2560 : 3072; }
static inline size_t off_mn(int kt) { return off_sc(kt) + 128; }
static inline size_t off_d(int kt) { return kt == KP_Q6K ? 3328 : off_sc(kt) + 256; }
static inline size_t off_dmin(int kt) { return off_d(kt) + 32; }

/* Bytes of one group of 16 rows, and of one token's XK row. */
size_t ak_packed_k_group_bytes(uint32_t wtype, int64_t cols) {
    return (size_t)(cols / AK_QKK) * rec_bytes(kp_kind(wtype));
}
size_t ak_packed_k_xk_bytes(int64_t cols) { return (size_t)(cols / AK_QKK) * XK_BYTES; }

/* Bytes of the packed copy of a rows x cols matrix of wtype, or 0 when this
 * build has no packed kernels for it. Rows so long that one token's
 * activations would not fit the out-of-memory path's stack buffer (over
 * 43520 columns) are left to the row-major kernels, so that a packed product
 * can always be computed. */
size_t ak_packed_k_bytes(uint32_t wtype, int64_t rows, int64_t cols) {
#if defined(AK_PACKED_K)
    int kt = kp_kind(wtype);
    if (kt < 0 || rows <= 0 || cols <= 0 || cols % AK_QKK) return 0;
    if (ak_packed_k_xk_bytes(cols) > AK_PACKED_STACK) return 0;
    return (size_t)((rows + GROUP - 1) / GROUP) * ak_packed_k_group_bytes(wtype, cols);
#else
    (void)wtype; (void)rows; (void)cols;
    return 0;
#endif
}

static inline void put4(uint8_t *dst, const uint8_t *src) { memcpy(dst, src, 4); }

/* One row's super-block (row-major bytes at blk) into record rec as row r. */
static void pack_superblock(int kt, const uint8_t *blk, uint8_t *rec, int r) {
    if (kt == KP_Q6K) {
        const uint8_t *ql = blk, *qh = blk + 128;
        const int8_t *sc = (const int8_t *)(blk + 192);
        for (int n = 0; n < 2; n++)
            for (int p = 0; p < 8; p++) {
                uint8_t *v = rec + 192 * (8 * n + p);
                put4(v + 4 * r, ql + 64 * n + 4 * p);
                put4(v + 64 + 4 * r, ql + 64 * n + 32 + 4 * p);
                put4(v + 128 + 4 * r, qh + 32 * n + 4 * p);
            }
        for (int i = 0; i < 16; i++) rec[off_sc(kt) + 16 * i + r] = (uint8_t)sc[i];
        memcpy(rec + off_d(kt) + 2 * r, blk + 208, 2);
        return;
    }
    const uint8_t *qs = blk + (kt == KP_Q5K ? 48 : 16);
    for (int c = 0; c < 4; c++)
        for (int p = 0; p < 8; p++) put4(rec + 512 * c + 64 * p + 4 * r, qs + 32 * c + 4 * p);
    if (kt == KP_Q5K)
        for (int p = 0; p < 8; p++) put4(rec + 2048 + 64 * p + 4 * r, blk + 16 + 4 * p);
    uint8_t sc[8], mn[8];
    ak_kq_scales_k4(blk + 4, sc, mn);
    for (int j = 0; j < 8; j++) {
        rec[off_sc(kt) + 16 * j + r] = sc[j];
        rec[off_mn(kt) + 32 * (j / 2) + 2 * r + (j & 1)] = mn[j];
    }
    memcpy(rec + off_d(kt) + 2 * r, blk, 2);
    memcpy(rec + off_dmin(kt) + 2 * r, blk + 2, 2);
}

/* Writes the packed copy of W (rows x cols of wtype, row-major) to P, which
 * has ak_packed_k_bytes(...) bytes. Plain C: this runs once per model load. */
void ak_pack_weights_k(uint32_t wtype, const void *W, int64_t rows, int64_t cols, void *P) {
    const int kt = kp_kind(wtype);
    const int64_t nsb = cols / AK_QKK, ng = (rows + GROUP - 1) / GROUP;
    const size_t wrb = ak_row_bytes(wtype, cols), rb = rec_bytes(kt);
    const size_t bb = wrb / (size_t)nsb;   /* bytes of one row-major super-block */
    for (int64_t g = 0; g < ng; g++) {
        uint8_t *grp = (uint8_t *)P + (size_t)g * (size_t)nsb * rb;
        memset(grp, 0, (size_t)nsb * rb);   /* padding rows and bytes: scale 0, codes 0 */
        int nrow = (int)(rows - g * GROUP < GROUP ? rows - g * GROUP : GROUP);
        for (int r = 0; r < nrow; r++) {
            const uint8_t *src = (const uint8_t *)W + (size_t)(g * GROUP + r) * wrb;
            for (int64_t b = 0; b < nsb; b++) pack_superblock(kt, src + (size_t)b * bb, grp + (size_t)b * rb, r);
        }
    }
}

#if defined(AK_PACKED_K512)

#define AK_INLINE_K static inline __attribute__((always_inline))

/* One token's activations into the XK layout (see the top). */
void ak_packed_k_quantize(const float *x, uint8_t *dst, int64_t cols) {
    for (int64_t b = 0; b < cols / AK_QKK; b++, x += AK_QKK, dst += XK_BYTES) {
        __m512 amax = _mm512_setzero_ps();
        for (int i = 0; i < AK_QKK; i += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
        float d = _mm512_reduce_max_ps(amax) / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        int16_t *s32 = (int16_t *)(dst + XK_S32);
        int32_t *c16 = (int32_t *)(dst + XK_C16);
        int sum16[16];
        for (int i = 0; i < 16; i++) {
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * i), _mm512_set1_ps(id)));   /* half-even */
            _mm_storeu_si128((__m128i *)(dst + 16 * i), _mm512_cvtepi32_epi8(q));
            sum16[i] = _mm512_reduce_add_epi32(q);
            c16[i] = -32 * sum16[i];
        }
        for (int j = 0; j < 8; j++) s32[j] = (int16_t)(sum16[2 * j] + sum16[2 * j + 1]);   /* |.| <= 32 * 127 */
        memcpy(dst + XK_D, &d, 4);
    }
}

/* acc + the s16 x s16 products of w with an int16 pair at p broadcast to
 * every lane (vpdpwssd), written out as ak_dpbusd_bcast is. */
AK_INLINE_K __m512i dpwssd_b(__m512i acc, __m512i w, const void *p) {
#if defined(__GNUC__)
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const ak_four_bytes *)p));
    return acc;
#else
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_dpwssd_epi32(acc, w, _mm512_set1_epi32(v));
#endif
}

/* Weights stream from memory once per decode step: each line is asked for
 * twice, PF_L2 ahead into L2 and PF_L1 ahead into L1 (past the group's end
 * too: the next group follows), in eight parts, one per step of a record's
 * loop. Asked for all at once, a record's lines waited on L1's fill buffers
 * and stalled the core; these two distances together beat any one alone
 * (docs/speed.md). */
AK_INLINE_K void prefetch_part(const int kt, const uint8_t *rec, int step) {
    const int lines = (int)(rec_bytes(kt) / 64), a = step * lines / 8, b = (step + 1) * lines / 8;
#pragma GCC unroll 8
    for (int l = a; l < b; l++) {
        _mm_prefetch((const char *)(rec + PF_L1 + 64 * l), _MM_HINT_T0);
        _mm_prefetch((const char *)(rec + PF_L2 + 64 * l), _MM_HINT_T1);
    }
}

/* Every 16-bit lane shifted left by n, or right by -n. */
AK_INLINE_K __m512i shift16(__m512i v, int n) {
    return n >= 0 ? _mm512_sll_epi16(v, _mm_cvtsi32_si128(n)) : _mm512_srl_epi16(v, _mm_cvtsi32_si128(-n));
}

/* Q4_K / Q5_K, step j of a record: sub-block j = 2c + h (low nibbles of
 * chunk c for h = 0, high for h = 1) for T tokens, into fsum. */
AK_INLINE_K void k4_step(const int kt, const int T, const uint8_t *rec, int j, const uint8_t *x0, size_t xks,
                         __m512 d, __m512 *fsum) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), b4 = _mm512_set1_epi8(0x10);
    const int c = j >> 1, h = j & 1;
    prefetch_part(kt, rec, j);
    __m512i w[8];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) {
        __m512i v = shift16(_mm512_load_si512((const void *)(rec + 512 * c + 64 * p)), -4 * h);
        if (kt == KP_Q5K) {   /* bit j of the qh bytes, to bit 4 */
            __m512i q = shift16(_mm512_load_si512((const void *)(rec + 2048 + 64 * p)), 4 - j);
            w[p] = _mm512_ternarylogic_epi32(v, _mm512_and_si512(q, b4), m4, 0xec);   /* (v & m4) | q */
        } else {
            w[p] = _mm512_and_si512(v, m4);
        }
    }
    const __m512 sc = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
        _mm_load_si128((const __m128i *)(rec + off_sc(kt) + 16 * j)))));   /* d * sc: exact */
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const uint8_t *q = x0 + (size_t)t * xks + 64 * c + 32 * h;
        /* two chains, so latency does not bind */
        __m512i s = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int p = 0; p < 8; p += 2) {
            s = ak_dpbusd_bcast(s, w[p], q + 4 * p);
            s1 = ak_dpbusd_bcast(s1, w[p + 1], q + 4 * p + 4);
        }
        s = _mm512_add_epi32(s, s1);
        fsum[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, fsum[t]);
    }
}

/* Q6_K, step j = 4n + k of a record: elements 128n + 32k .. +31 (sub-blocks
 * 8n + 2k and 8n + 2k + 1) for T tokens, into fsum. */
AK_INLINE_K void k6_step(const int T, const uint8_t *rec, int j, const uint8_t *x0, size_t xks, __m512 d, __m512 *fsum) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const int n = j >> 2, k = j & 3;
    prefetch_part(KP_Q6K, rec, j);
    __m512i w[8];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) {
        const uint8_t *v3 = rec + 192 * (8 * n + p);
        __m512i lo = shift16(_mm512_load_si512((const void *)(v3 + 64 * (k & 1))), -4 * (k >> 1));
        __m512i hi = shift16(_mm512_load_si512((const void *)(v3 + 128)), 4 - 2 * k);   /* bits 2k, 2k + 1 to 4, 5 */
        w[p] = _mm512_ternarylogic_epi32(lo, _mm512_and_si512(hi, m30), m4, 0xec);   /* (lo & m4) | hi */
    }
#pragma GCC unroll 2
    for (int hh = 0; hh < 2; hh++) {
        const int i = 8 * n + 2 * k + hh;
        const __m512 sc = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_load_si128((const __m128i *)(rec + off_sc(KP_Q6K) + 16 * i)))));
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const uint8_t *xt = x0 + (size_t)t * xks;
            const uint8_t *q = xt + 128 * n + 32 * k + 16 * hh;
            int32_t c16;
            memcpy(&c16, xt + XK_C16 + 4 * i, 4);
            __m512i s = _mm512_set1_epi32(c16);
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) s = ak_dpbusd_bcast(s, w[4 * hh + p], q + 4 * p);
            fsum[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, fsum[t]);
        }
    }
}

/* G groups of 16 rows (records at grp, grp + gb, ...) times T tokens (XK
 * rows xk + t * xks): Y[t * ldy + g * 16 + r] for g * 16 + r < nvalid. The
 * groups of a super-block are taken one after the other, so a group's
 * arithmetic does not depend on G or T; several groups are several streams
 * of weights in flight (decode takes four). */
AK_INLINE_K void ktile(const int kt, const int G, const int T, const ak_pk_tile *a) {
    const uint8_t *grp = a->grp, *xk = a->xq;
    const size_t gb = a->gb, xks = a->xqs;
    const int64_t nsb = a->nb, ldy = a->ldy;
    float *Y = a->Y;
    const int nvalid = (int)a->nvalid;
    const size_t rb = rec_bytes(kt);
    __m512 acc[4][TILE_T];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[g][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *x0 = xk + (size_t)b * XK_BYTES;
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            const uint8_t *rec = grp + g * gb + (size_t)b * rb;
            __m512 fsum[TILE_T];
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) fsum[t] = _mm512_setzero_ps();
            const __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(rec + off_d(kt))));
            if (kt != KP_Q6K) {
                if (T <= 2) {
#pragma GCC unroll 8
                    for (int j = 0; j < 8; j++) k4_step(kt, T, rec, j, x0, xks, d, fsum);
                } else {   /* unrolled, the unpacked weights of all steps spill */
#pragma GCC unroll 1
                    for (int j = 0; j < 8; j++) k4_step(kt, T, rec, j, x0, xks, d, fsum);
                }
                __m512i mn[4];
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++)
                    mn[k] = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)(rec + off_mn(kt) + 32 * k)));
                const __m512 dm = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(rec + off_dmin(kt))));
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const uint8_t *xt = x0 + (size_t)t * xks;
                    __m512i corr = _mm512_setzero_si512();
#pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) corr = dpwssd_b(corr, mn[k], xt + XK_S32 + 4 * k);
                    float dx;
                    memcpy(&dx, xt + XK_D, 4);
                    const __m512 vdx = _mm512_set1_ps(dx);
                    acc[g][t] = _mm512_fmadd_ps(fsum[t], vdx, acc[g][t]);
                    acc[g][t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(corr), _mm512_mul_ps(dm, vdx), acc[g][t]);
                }
            } else {
                if (T <= 2) {
#pragma GCC unroll 8
                    for (int j = 0; j < 8; j++) k6_step(T, rec, j, x0, xks, d, fsum);
                } else {
#pragma GCC unroll 1
                    for (int j = 0; j < 8; j++) k6_step(T, rec, j, x0, xks, d, fsum);
                }
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    float dx;
                    memcpy(&dx, x0 + (size_t)t * xks + XK_D, 4);
                    acc[g][t] = _mm512_fmadd_ps(fsum[t], _mm512_set1_ps(dx), acc[g][t]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) {
        int nv = nvalid - g * GROUP;
        if (nv <= 0) break;
        const __mmask16 m = nv >= GROUP ? (__mmask16)0xffff : (__mmask16)((1u << nv) - 1);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(Y + (size_t)t * ldy + g * GROUP, m, acc[g][t]);
    }
}

#define KTILE_FN(K, G, T) static void ktile_##K##_##G##_##T(const ak_pk_tile *a) { ktile(K, G, T, a); }
/* Per kind: one group with 1..8 tokens, two groups with 1..4, four with one. */
#define KTILE_KIND(K) KTILE_FN(K, 1, 1) KTILE_FN(K, 1, 2) KTILE_FN(K, 1, 3) KTILE_FN(K, 1, 4) KTILE_FN(K, 1, 5) \
    KTILE_FN(K, 1, 6) KTILE_FN(K, 1, 7) KTILE_FN(K, 1, 8) KTILE_FN(K, 2, 1) KTILE_FN(K, 2, 2) KTILE_FN(K, 2, 3)  \
    KTILE_FN(K, 2, 4) KTILE_FN(K, 4, 1)
#define KTILE_ROWS(K)                                                                                         \
    { { ktile_##K##_1_1, ktile_##K##_1_2, ktile_##K##_1_3, ktile_##K##_1_4, ktile_##K##_1_5, ktile_##K##_1_6, \
        ktile_##K##_1_7, ktile_##K##_1_8 },                                                                   \
      { ktile_##K##_2_1, ktile_##K##_2_2, ktile_##K##_2_3, ktile_##K##_2_4, NULL, NULL, NULL, NULL },         \
      { ktile_##K##_4_1, NULL, NULL, NULL, NULL, NULL, NULL, NULL } }
KTILE_KIND(0) KTILE_KIND(1) KTILE_KIND(2)
static const ak_pk_tile_fn ktiles[3][3][TILE_T] = { KTILE_ROWS(0), KTILE_ROWS(1), KTILE_ROWS(2) };   /* [kind][G 1, 2, 4][T - 1] */

/* The work item it (kernels_backend.h's contract for one work item of
 * kernels_packed.c's driver; xq: the tokens' XK rows). */
void ak_packed_k_item(uint32_t wtype, const ak_pk_item *it) {
    const uint8_t *P = it->P, *xk = it->xq;
    const size_t gb = it->gb, xks = it->xqs;
    const int64_t rows = it->rows, g1 = it->g1, t1 = it->t1;
    float *Y = it->Y;
    const int kt = kp_kind(wtype);
    const int64_t nsb = it->cols / AK_QKK;
    for (int64_t t = it->t0; t < t1; t += TILE_T) {
        const int T = (int)ak_min64(TILE_T, t1 - t);
        for (int64_t g = it->g0, G; g < g1; g += G) {
            /* four streams for one token, two for up to four tokens */
            G = T == 1 && g1 - g >= 4 ? 4 : T <= 4 && g1 - g >= 2 ? 2 : 1;
            const int nvalid = (int)ak_min64(G * GROUP, rows - g * GROUP);
            ktiles[kt][G == 4 ? 2 : G - 1][T - 1](&(ak_pk_tile){ .grp = P + (size_t)g * gb, .gb = gb, .nb = nsb,
                                                                 .xq = xk + (size_t)t * xks, .xqs = xks,
                                                                 .Y = Y + t * rows + g * GROUP, .ldy = rows,
                                                                 .nvalid = nvalid });
        }
    }
}

#elif defined(AK_PACKED_K256)
/* ======================================================================== */
/* AVX2 (x86-64-v3; AVX-VNNI where the build has it)                       */
/* ======================================================================== */
/* The AVX-512 arithmetic per row on 32-byte vectors: a 64-byte vector of a
 * record is two halves (rows 0..7 of the group in its first 32 bytes, rows
 * 8..15 in its second). Without VNNI a sub-block's u8 x s8 products go
 * through vpmaddubsw; its 16-bit pair sums are added as 16-bit lanes only
 * while no sum can pass 32767, then widened by vpmaddwd against ones: all
 * 8 vectors of a Q4_K sub-block (16 pairs <= 16 * 2 * 15 * 128 = 30720),
 * 4 of Q5_K (codes < 32), 2 of Q6_K (codes < 64). The sums are exact, so
 * the rest is the AVX-512 formula and a row's bits do not depend on the
 * tile. Weights are unpacked one vector at a time and used for every token
 * of the tile: the live registers are a sum per token and that vector. */

#define AK_INLINE_K static inline __attribute__((always_inline))
#define KT_T 4              /* tokens per tile: 16 ymm registers */
#if defined(__AVXVNNI__)
#define AK_VNNI256 1
#endif

static inline int32_t ld32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline int hsum_i32x8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* One token's activations into the XK layout (see the top): the AVX-512
 * twin's bytes. */
void ak_packed_k_quantize(const float *x, uint8_t *dst, int64_t cols) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < cols / AK_QKK; b++, x += AK_QKK, dst += XK_BYTES) {
        __m256 amax = _mm256_setzero_ps();
        for (int i = 0; i < AK_QKK; i += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        float d = _mm_cvtss_f32(m) / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        int16_t *s32 = (int16_t *)(dst + XK_S32);
        int32_t *c16 = (int32_t *)(dst + XK_C16);
        int sum16[16];
        for (int i = 0; i < 8; i++) {   /* 32 elements at a time */
            __m256i qi[4];
            for (int k = 0; k < 4; k++)
                qi[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * i + 8 * k), _mm256_set1_ps(id)));
            sum16[2 * i] = hsum_i32x8(_mm256_add_epi32(qi[0], qi[1]));
            sum16[2 * i + 1] = hsum_i32x8(_mm256_add_epi32(qi[2], qi[3]));
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(dst + 32 * i), p);
        }
        for (int i = 0; i < 16; i++) c16[i] = -32 * sum16[i];
        for (int j = 0; j < 8; j++) s32[j] = (int16_t)(sum16[2 * j] + sum16[2 * j + 1]);   /* |.| <= 32 * 127 */
        memcpy(dst + XK_D, &d, 4);
    }
}

/* Prefetches of a record's lines, in eight parts (the AVX-512 twin's). */
AK_INLINE_K void prefetch_part(const int kt, const uint8_t *rec, int step) {
    const int lines = (int)(rec_bytes(kt) / 64), a = step * lines / 8, b = (step + 1) * lines / 8;
#pragma GCC unroll 8
    for (int l = a; l < b; l++) {
        _mm_prefetch((const char *)(rec + PF_L1 + 64 * l), _MM_HINT_T0);
        _mm_prefetch((const char *)(rec + PF_L2 + 64 * l), _MM_HINT_T1);
    }
}

/* Every 16-bit lane shifted left by n, or right by -n. */
AK_INLINE_K __m256i shift16(__m256i v, int n) {
    return n >= 0 ? _mm256_sll_epi16(v, _mm_cvtsi32_si128(n)) : _mm256_srl_epi16(v, _mm_cvtsi32_si128(-n));
}

/* sum plus the u8 x s8 products of w and x, pinned to a register (see
 * kernels_packed.c's KEEP): 32-bit lanes with VNNI; without it 16-bit pair
 * sums, which the caller widens within their bound (a sub-block's 16 pairs). */
AK_INLINE_K __m256i acc_u8s8(__m256i sum, __m256i w, __m256i x) {
#if defined(AK_VNNI256)
    sum = _mm256_dpbusd_avx_epi32(sum, w, x);
#else
    sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(w, x));
#endif
    __asm__("" : "+x"(sum));
    return sum;
}

/* s[t] + the u8 x s8 products of w with the 4 bytes at q[t] + off, for T
 * tokens: into the 16-bit sums s16 without VNNI, into s with it. */
AK_INLINE_K void dot_step(const int T, __m256i w, const uint8_t *const *q, int off, __m256i *s, __m256i *s16) {
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const __m256i x = _mm256_set1_epi32(ld32(q[t] + off));
#if defined(AK_VNNI256)
        s[t] = acc_u8s8(s[t], w, x);
#else
        s16[t] = acc_u8s8(s16[t], w, x);   /* one chain per token */
#endif
    }
}

/* Without VNNI: s[t] += the 16-bit sums widened; s16 back to zero. */
AK_INLINE_K void widen(const int T, __m256i *s, __m256i *s16) {
#if !defined(AK_VNNI256)
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(s16[t], _mm256_set1_epi16(1)));
        s16[t] = _mm256_setzero_si256();
    }
#else
    (void)T; (void)s; (void)s16;
#endif
}

/* Where a step reads: half h of a group's record rec (one super-block),
 * and the tokens' XK blocks of that super-block (token 0's at x0, xks bytes
 * apart). */
typedef struct {
    const uint8_t *rec, *x0;
    size_t xks;
    int h;
} kstep_src;

/* Q4_K / Q5_K, step j of a record (sub-block j = 2c + hs) for half h of the
 * group and T tokens (at src), into fsum. */
AK_INLINE_K void k4_step(const int kt, const int T, const kstep_src *src, int j, __m256 d, __m256 *fsum) {
    const uint8_t *rec = src->rec, *x0 = src->x0;
    const size_t xks = src->xks;
    const int h = src->h;
    const __m256i m4 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10);
    const int c = j >> 1, hs = j & 1;
    const uint8_t *q[KT_T];
    __m256i s[KT_T], s16[KT_T];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        q[t] = x0 + (size_t)t * xks + 64 * c + 32 * hs;
        s[t] = s16[t] = _mm256_setzero_si256();
    }
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) {
        __m256i v = shift16(_mm256_load_si256((const __m256i *)(rec + 512 * c + 64 * p + 32 * h)), -4 * hs);
        v = _mm256_and_si256(v, m4);
        if (kt == KP_Q5K) {   /* bit j of the qh bytes, to bit 4 */
            __m256i qh = shift16(_mm256_load_si256((const __m256i *)(rec + 2048 + 64 * p + 32 * h)), 4 - j);
            v = _mm256_or_si256(v, _mm256_and_si256(qh, b4));
        }
        dot_step(T, v, q, 4 * p, s, s16);
        if (p == 7 || (kt == KP_Q5K && p == 3)) widen(T, s, s16);
    }
    const __m256 sc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
        _mm_loadl_epi64((const __m128i *)(rec + off_sc(kt) + 16 * j + 8 * h)))));   /* d * sc: exact */
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) fsum[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), sc, fsum[t]);
}

/* Q6_K, step j = 4n + k of a record (sub-blocks 8n + 2k, 8n + 2k + 1) for
 * half h of the group and T tokens (at src), into fsum. */
AK_INLINE_K void k6_step(const int T, const kstep_src *src, int j, __m256 d, __m256 *fsum) {
    const uint8_t *rec = src->rec, *x0 = src->x0;
    const size_t xks = src->xks;
    const int h = src->h;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const int n = j >> 2, k = j & 3;
#pragma GCC unroll 2
    for (int hh = 0; hh < 2; hh++) {
        const int i = 8 * n + 2 * k + hh;
        const uint8_t *q[KT_T];
        __m256i s[KT_T], s16[KT_T];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const uint8_t *xt = x0 + (size_t)t * xks;
            q[t] = xt + 128 * n + 32 * k + 16 * hh;
            s[t] = _mm256_set1_epi32(ld32(xt + XK_C16 + 4 * i));   /* the offset of 32 */
            s16[t] = _mm256_setzero_si256();
        }
#pragma GCC unroll 4
        for (int p = 4 * hh; p < 4 * hh + 4; p++) {
            const uint8_t *v3 = rec + 192 * (8 * n + p);
            __m256i lo = shift16(_mm256_load_si256((const __m256i *)(v3 + 64 * (k & 1) + 32 * h)), -4 * (k >> 1));
            __m256i hi = shift16(_mm256_load_si256((const __m256i *)(v3 + 128 + 32 * h)), 4 - 2 * k);
            __m256i w = _mm256_or_si256(_mm256_and_si256(lo, m4), _mm256_and_si256(hi, m30));
            dot_step(T, w, q, 4 * (p - 4 * hh), s, s16);
            if (p & 1) widen(T, s, s16);
        }
        const __m256 sc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
            _mm_loadl_epi64((const __m128i *)(rec + off_sc(KP_Q6K) + 16 * i + 8 * h)))));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) fsum[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), sc, fsum[t]);
    }
}

/* Stores the 8 lanes of v at y, or its first nv (0 < nv < 8). */
AK_INLINE_K void store8(float *y, __m256 v, int nv) {
    if (nv >= 8) {
        _mm256_storeu_ps(y, v);
        return;
    }
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(nv), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(y, m, v);
}

/* Half h's 8 mins of a Q4_K / Q5_K record widened to 16 bits (mn[k]:
 * 32-blocks 2k, 2k + 1), and its dmin. */
AK_INLINE_K void load_mins(int kt, const uint8_t *rec, int h, __m256i mn[4], __m256 *dm) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        mn[k] = _mm256_cvtepu8_epi16(_mm_load_si128((const __m128i *)(rec + off_mn(kt) + 32 * k + 16 * h)));
    *dm = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(rec + off_dmin(kt) + 16 * h)));
}

/* acc + dx * fsum - dmin * dx * (mins . the 32-block sums): a half's
 * super-block closed for the token whose XK block is at xt (its d, its
 * 32-blocks' integer sums), in the one order every tile uses. */
AK_INLINE_K __m256 close_with_mins(__m256 acc, __m256 fsum, const __m256i mn[4], __m256 dm, const uint8_t *xt) {
    __m256i corr = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        corr = _mm256_add_epi32(corr, _mm256_madd_epi16(mn[k], _mm256_set1_epi32(ld32(xt + XK_S32 + 4 * k))));
    float dx;
    memcpy(&dx, xt + XK_D, 4);
    const __m256 vdx = _mm256_set1_ps(dx);
    acc = _mm256_fmadd_ps(fsum, vdx, acc);
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(corr), _mm256_mul_ps(dm, vdx), acc);
}

/* G groups of 16 rows (records at grp, grp + gb, ...), both halves of each,
 * times T tokens (XK rows xk + t * xks): Y[t * ldy + g * 16 + r] for
 * g * 16 + r < nvalid. A half's arithmetic does not depend on G or T. */
AK_INLINE_K void ktile(const int kt, const int G, const int T, const ak_pk_tile *a) {
    const uint8_t *grp = a->grp, *xk = a->xq;
    const size_t gb = a->gb, xks = a->xqs;
    const int64_t nsb = a->nb, ldy = a->ldy;
    float *Y = a->Y;
    const int nvalid = (int)a->nvalid;
    const size_t rb = rec_bytes(kt);
    __m256 acc[4][2][KT_T];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[g][0][t] = acc[g][1][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *x0 = xk + (size_t)b * XK_BYTES;
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            const uint8_t *rec = grp + g * gb + (size_t)b * rb;
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256 fsum[KT_T];
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) fsum[t] = _mm256_setzero_ps();
                const __m256 d = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(rec + off_d(kt) + 16 * h)));
                const kstep_src src = { .rec = rec, .x0 = x0, .xks = xks, .h = h };
#pragma GCC unroll 1
                for (int j = 0; j < 8; j++) {
                    if (h == 0) prefetch_part(kt, rec, j);
                    if (kt == KP_Q6K) k6_step(T, &src, j, d, fsum);
                    else k4_step(kt, T, &src, j, d, fsum);
                }
                if (kt != KP_Q6K) {
                    __m256i mn[4];
                    __m256 dm;
                    load_mins(kt, rec, h, mn, &dm);
#pragma GCC unroll 4
                    for (int t = 0; t < T; t++)
                        acc[g][h][t] = close_with_mins(acc[g][h][t], fsum[t], mn, dm, x0 + (size_t)t * xks);
                } else {
#pragma GCC unroll 4
                    for (int t = 0; t < T; t++) {
                        float dx;
                        memcpy(&dx, x0 + (size_t)t * xks + XK_D, 4);
                        acc[g][h][t] = _mm256_fmadd_ps(fsum[t], _mm256_set1_ps(dx), acc[g][h][t]);
                    }
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const int base = g * GROUP + 8 * h, nv = nvalid - base;
            if (nv <= 0) continue;
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) store8(Y + (size_t)t * ldy + base, acc[g][h][t], nv);
        }
}

/* Q4_K: one group of 16 rows, both halves, times T tokens (3 or 4):
 * Y[t * ldy + r] for r < nvalid. Each activation broadcast serves both
 * halves, where ktile's half-by-half steps load it twice; the 2 T sums of
 * a sub-block live in registers (with the two unpacked vectors, a
 * broadcast and the mask: 12 of the 16 ymm), so fsum and the accumulators
 * are kept in an L1 buffer, loaded and stored once per sub-block and
 * super-block. A row's arithmetic is ktile's, in its order: the same bits.
 * pf: whether to prefetch (the first pass over a group). */
AK_INLINE_K void ktile_both_q4k(const int T, const ak_pk_tile *a) {
    const uint8_t *grp = a->grp, *xk = a->xq;
    const size_t xks = a->xqs;
    const int64_t nsb = a->nb, ldy = a->ldy;
    float *Y = a->Y;
    const int nvalid = (int)a->nvalid, pf = a->prefetch;
    const int kt = KP_Q4K;
    const size_t rb = rec_bytes(kt);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    _Alignas(32) float acc[KT_T][2][8], fsum[KT_T][2][8];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        _mm256_store_ps(acc[t][0], _mm256_setzero_ps());
        _mm256_store_ps(acc[t][1], _mm256_setzero_ps());
    }
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *x0 = xk + (size_t)b * XK_BYTES;
        const uint8_t *rec = grp + (size_t)b * rb;
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            _mm256_store_ps(fsum[t][0], _mm256_setzero_ps());
            _mm256_store_ps(fsum[t][1], _mm256_setzero_ps());
        }
#pragma GCC unroll 1
        for (int j = 0; j < 8; j++) {
            if (pf) prefetch_part(kt, rec, j);
            const int c = j >> 1, hs = j & 1;
            __m256i s[KT_T][2];
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) s[t][0] = s[t][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int p = 0; p < 8; p++) {
                const uint8_t *v = rec + 512 * c + 64 * p;
                const __m256i v0 = _mm256_and_si256(shift16(_mm256_load_si256((const __m256i *)v), -4 * hs), m4);
                const __m256i v1 = _mm256_and_si256(shift16(_mm256_load_si256((const __m256i *)(v + 32)), -4 * hs), m4);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const __m256i x = _mm256_set1_epi32(ld32(x0 + (size_t)t * xks + 64 * c + 32 * hs + 4 * p));
                    s[t][0] = acc_u8s8(s[t][0], v0, x);
                    s[t][1] = acc_u8s8(s[t][1], v1, x);
                }
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256 d = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(rec + off_d(kt) + 16 * h)));
                const __m256 sc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                    _mm_loadl_epi64((const __m128i *)(rec + off_sc(kt) + 16 * j + 8 * h)))));   /* d * sc: exact */
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
#if defined(AK_VNNI256)
                    const __m256i si = s[t][h];
#else
                    const __m256i si = _mm256_madd_epi16(s[t][h], _mm256_set1_epi16(1));
#endif
                    _mm256_store_ps(fsum[t][h], _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), sc, _mm256_load_ps(fsum[t][h])));
                }
            }
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i mn[4];
            __m256 dm;
            load_mins(kt, rec, h, mn, &dm);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                _mm256_store_ps(acc[t][h], close_with_mins(_mm256_load_ps(acc[t][h]), _mm256_load_ps(fsum[t][h]), mn,
                                                           dm, x0 + (size_t)t * xks));
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const int nv = nvalid - 8 * h;
        if (nv <= 0) continue;
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) store8(Y + (size_t)t * ldy + 8 * h, _mm256_load_ps(acc[t][h]), nv);
    }
}
static void ktile_both_q4k_3(const ak_pk_tile *a) { ktile_both_q4k(3, a); }
static void ktile_both_q4k_4(const ak_pk_tile *a) { ktile_both_q4k(4, a); }

/* Q4_K, G groups of 16 rows (records at grp, grp + gb, ...) times one
 * token: Y[g * 16 + r] for g * 16 + r < nvalid. Each 32-byte code vector
 * is loaded once for both of its sub-blocks (low nibbles 2c, high 2c + 1)
 * and each activation broadcast serves both halves of the group, where
 * ktile's steps load the vector once per sub-block and the broadcast once
 * per half. A row's arithmetic is ktile's, in its order (sub-block sums
 * exact, then fsum's FMAs j = 0..7 per half): the same bits. */
AK_INLINE_K void ktile1_q4k(const int G, const ak_pk_tile *a) {
    const uint8_t *grp = a->grp, *xk = a->xq;
    const size_t gb = a->gb;
    const int64_t nsb = a->nb;
    float *Y = a->Y;
    const int nvalid = (int)a->nvalid;
    const int kt = KP_Q4K;
    const size_t rb = rec_bytes(kt);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) acc[g][0] = acc[g][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *x0 = xk + (size_t)b * XK_BYTES;
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            const uint8_t *rec = grp + g * gb + (size_t)b * rb;
            __m256 fsum[2] = { _mm256_setzero_ps(), _mm256_setzero_ps() };
#pragma GCC unroll 1
            for (int c = 0; c < 4; c++) {
                prefetch_part(kt, rec, 2 * c);
                prefetch_part(kt, rec, 2 * c + 1);
                __m256i s[2][2];   /* [half][nibble]: sub-block 2c + nibble */
                s[0][0] = s[0][1] = s[1][0] = s[1][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int p = 0; p < 8; p++) {
                    const uint8_t *v = rec + 512 * c + 64 * p;
                    const __m256i xl = _mm256_set1_epi32(ld32(x0 + 64 * c + 4 * p));
                    const __m256i xh = _mm256_set1_epi32(ld32(x0 + 64 * c + 32 + 4 * p));
#pragma GCC unroll 2
                    for (int h = 0; h < 2; h++) {
                        const __m256i w = _mm256_load_si256((const __m256i *)(v + 32 * h));
                        const __m256i wl = _mm256_and_si256(w, m4);
                        const __m256i wh = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
                        s[h][0] = acc_u8s8(s[h][0], wl, xl);
                        s[h][1] = acc_u8s8(s[h][1], wh, xh);
                    }
                }
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const __m256 d = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(rec + off_d(kt) + 16 * h)));
#pragma GCC unroll 2
                    for (int hs = 0; hs < 2; hs++) {   /* sub-blocks 2c, 2c + 1: ktile's order */
                        const __m256 sc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                            (const __m128i *)(rec + off_sc(kt) + 16 * (2 * c + hs) + 8 * h)))));   /* d * sc: exact */
#if defined(AK_VNNI256)
                        const __m256i si = s[h][hs];
#else
                        const __m256i si = _mm256_madd_epi16(s[h][hs], _mm256_set1_epi16(1));
#endif
                        fsum[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), sc, fsum[h]);
                    }
                }
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i mn[4];
                __m256 dm;
                load_mins(kt, rec, h, mn, &dm);
                acc[g][h] = close_with_mins(acc[g][h], fsum[h], mn, dm, x0);
            }
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const int base = g * GROUP + 8 * h, nv = nvalid - base;
            if (nv > 0) store8(Y + base, acc[g][h], nv);
        }
}
#define KTILE_FN(K, G, T) static void ktile_##K##_##G##_##T(const ak_pk_tile *a) { ktile(K, G, T, a); }
/* Q4_K's one-token entries: ktile1_q4k (one token: no row strides). */
#define KTILE1_FN(G) static void ktile_0_##G##_1(const ak_pk_tile *a) { ktile1_q4k(G, a); }
/* Per kind: one group with 1..4 tokens, two groups with 1 or 2, four with one. */
#define KTILE_MULTI(K) KTILE_FN(K, 1, 2) KTILE_FN(K, 1, 3) KTILE_FN(K, 1, 4) KTILE_FN(K, 2, 2)
#define KTILE_KIND(K) KTILE_MULTI(K) KTILE_FN(K, 1, 1) KTILE_FN(K, 2, 1) KTILE_FN(K, 4, 1)
#define KTILE_ROWS(K)                                                                                         \
    { { ktile_##K##_1_1, ktile_##K##_1_2, ktile_##K##_1_3, ktile_##K##_1_4 },                                 \
      { ktile_##K##_2_1, ktile_##K##_2_2, NULL, NULL },                                                       \
      { ktile_##K##_4_1, NULL, NULL, NULL } }
KTILE_MULTI(0) KTILE1_FN(1) KTILE1_FN(2) KTILE1_FN(4) KTILE_KIND(1) KTILE_KIND(2)
static const ak_pk_tile_fn ktiles[3][3][KT_T] = { KTILE_ROWS(0), KTILE_ROWS(1), KTILE_ROWS(2) };   /* [kind][G 1, 2, 4][T - 1] */

/* The work item it (kernels_backend.h's contract for one work item of
 * kernels_packed.c's driver; xq: the tokens' XK rows). */
void ak_packed_k_item(uint32_t wtype, const ak_pk_item *it) {
    const uint8_t *P = it->P, *xk = it->xq;
    const size_t gb = it->gb, xks = it->xqs;
    const int64_t rows = it->rows, g0 = it->g0, g1 = it->g1, t0 = it->t0, t1 = it->t1;
    float *Y = it->Y;
    const int kt = kp_kind(wtype);
    const int64_t nsb = it->cols / AK_QKK;
    if (t1 - t0 > KT_T) {
        /* more tokens than a tile: group by group, so that the group's
         * records come from L1 for the tiles after the first (token chunk
         * by chunk over the whole item would stream them from L2 again) */
        for (int64_t g = g0; g < g1; g++)
            for (int64_t t = t0; t < t1; t += KT_T) {
                const int T = (int)ak_min64(KT_T, t1 - t);
                const ak_pk_tile a = { .grp = P + (size_t)g * gb, .gb = gb, .nb = nsb, .xq = xk + (size_t)t * xks,
                                       .xqs = xks, .Y = Y + t * rows + g * GROUP, .ldy = rows,
                                       .nvalid = ak_min64(GROUP, rows - g * GROUP), .prefetch = t == t0 };
                if (kt == KP_Q4K && T >= 3) {   /* the chunks after the first find the group in L1 */
                    (T == 4 ? ktile_both_q4k_4 : ktile_both_q4k_3)(&a);
                    continue;
                }
                ktiles[kt][0][T - 1](&a);
            }
        return;
    }
    for (int64_t t = t0; t < t1; t += KT_T) {
        const int T = (int)ak_min64(KT_T, t1 - t);
        for (int64_t g = g0, G; g < g1; g += G) {
            /* four streams for one token, two for two tokens */
            G = T == 1 && g1 - g >= 4 ? 4 : T <= 2 && g1 - g >= 2 ? 2 : 1;
            const ak_pk_tile a = { .grp = P + (size_t)g * gb, .gb = gb, .nb = nsb, .xq = xk + (size_t)t * xks,
                                   .xqs = xks, .Y = Y + t * rows + g * GROUP, .ldy = rows,
                                   .nvalid = ak_min64(G * GROUP, rows - g * GROUP), .prefetch = 1 };
            if (kt == KP_Q4K && T >= 3) {
                (T == 4 ? ktile_both_q4k_4 : ktile_both_q4k_3)(&a);
                continue;
            }
            ktiles[kt][G == 4 ? 2 : G - 1][T - 1](&a);
        }
    }
}

#endif /* AK_PACKED_K512, AK_PACKED_K256 */
