/* kernels_packed.c - Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (and float) weight matrices regrouped for VNNI.
 *
 * Why. A row-major Q4_0 matrix makes every dot product end in a horizontal
 * sum, and every 32-element block pay its own scale conversion and float
 * multiply per row and token. Regrouping rows by 16 turns the product around:
 * one 64-byte vector holds 4 consecutive elements of 16 rows, so one VNNI
 * instruction (u8 x s8, four products summed per 32-bit lane) against four
 * activation bytes broadcast to every lane advances 16 rows at once. A block
 * of 32 columns is then 8 such instructions per token, one conversion and one
 * FMA for 16 rows, and no horizontal sums at all; each unpacked weight vector
 * is reused for up to 8 tokens (prefill, batched decode).
 *
 * Packed layout ("R16"). Rows are taken 16 at a time; the last group is
 * padded with zero rows. Group g of a matrix with nb = cols / 32 blocks per row
 * starts at g * group_bytes (a multiple of 64) and holds
 *     codes:  nb records, one per block of 32 columns, then
 *     scales: nb records of 16 f16 scales d (row r of the group at index r),
 *             for Q4_1 / Q5_1 followed by the 16 f16 minimums m.
 * Code records:
 *     Q4_0, Q4_1: 4 vectors of 64 bytes (256 bytes). In vector p (0..3),
 *           bytes 4r..4r+3 hold row r's elements 4p..4p+3 in their low
 *           nibbles and elements 16+4p..16+4p+3 in their high nibbles, as
 *           stored (Q4_0: q + 8).
 *     Q5_0, Q5_1: Q4_0's 4 vectors, then one of fifth bits (320 bytes):
 *           its byte 4r + i holds, at bit p, the fifth bit of row r's
 *           element 4p + i and at bit 4 + p that of element 16 + 4p + i
 *           (Q5_0: q + 16).
 *     Q8_0: 8 vectors of 64 bytes (512 bytes). In vector j (0..7), bytes
 *           4r..4r+3 hold row r's elements 4j..4j+3 as q + 128 (unsigned).
 * Same bytes as the row-major blocks: the packed copy replaces them.
 *
 * Activations ("XP"), per token: cols int8 quants (d = amax/127, round half
 * to even, as the other back ends), nb float scales d, nb int32 offsets
 * c = -o * sum(q) with o the weight's offset (8 for Q4_0, 16 for Q5_0, 128
 * for Q8_0, 0 for Q4_1 / Q5_1), nb floats s = d * sum(q) (for the minimums
 * m: a block adds m * s). The integer sum of a block starts at c, so the
 * offset costs nothing.
 *
 * Tiles: with AVX512-VNNI, all of them on 64-byte vectors; with AVX2
 * (x86-64-v3) or AVX-512 without VNNI, all of them on 32-byte vectors that
 * each take half of a 64-byte one (rows 0..7, then 8..15: the layout is the
 * same), vpmaddubsw for the integer products (AVX-VNNI's vpdpbusd where the
 * build has it). Elsewhere ak_packed_bytes says 0 and the engine uses the
 * row-major kernels.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels/kernels_impl.h"
#include "kernels/kernels_packed_layout.h"
#include "base/util.h"

#if defined(AK_SIMD_AVX512) && defined(__AVX512VNNI__) && !defined(AK_NO_PACKED)
#define AK_PACKED 1         /* every type: AVX-512 and VNNI */
#define AK_PACKED_512 1
#include <immintrin.h>
#define AK_PACKED_Q 1
#define TILE_T 8            /* tokens per tile */
#define Q8_OFFSET 128       /* Q8_0 codes are q + 128, unsigned for vpdpbusd */
#elif (defined(AK_SIMD_AVX2) || defined(AK_SIMD_AVX512)) && !defined(AK_NO_PACKED)
/* AVX-512 without VNNI (Skylake-SP) runs the AVX2 tiles: vpmaddubsw */
#define AK_PACKED 1         /* every type: vpmaddubsw, or AVX-VNNI's vpdpbusd */
#define AK_PACKED_256 1
#define AK_PACKED_Q 1
#include <immintrin.h>
#define TILE_T 4            /* tokens per tile: 16 ymm registers */
#if defined(__AVXVNNI__)
#define Q8_OFFSET 128
#else
#define Q8_OFFSET 0         /* |q| x sign(x, q): q + 128 would saturate vpmaddubsw */
#endif
#elif defined(AK_SIMD_NEON) && !defined(AK_NO_PACKED)
#define AK_PACKED 1         /* every 32-block and float type: kernels_packed_arm.c's tiles */
#define AK_PACKED_NEON 1
#define AK_PACKED_Q 1
#define Q8_OFFSET 0         /* the NEON tiles turn the stored q + 128 back into q */
#endif

#define GROUP AK_PACKED_GROUP   /* rows per group */
#define TOKEN_CHUNK 64      /* tokens per work item in prefill */
#define PF_BYTES 4096      /* prefetch distance in the codes stream, into L1 */
#define PF_FAR 65536       /* and further ahead into L2 (see tile) */

static int is_float(uint32_t wtype) {
    return wtype == GGML_TYPE_F32 || wtype == GGML_TYPE_F16 || wtype == GGML_TYPE_BF16;
}
static int is_k(uint32_t wtype) {   /* kernels_packed_k.c's */
    return wtype == GGML_TYPE_Q4_K || wtype == GGML_TYPE_Q5_K || wtype == GGML_TYPE_Q6_K;
}
static size_t float_bytes(uint32_t wtype) { return wtype == GGML_TYPE_F32 ? 4 : 2; }

static inline int packable(uint32_t wtype) {
#if defined(AK_PACKED_Q)
    if (wtype == GGML_TYPE_Q4_0 || wtype == GGML_TYPE_Q8_0 || wtype == GGML_TYPE_Q4_1 ||
        wtype == GGML_TYPE_Q5_0 || wtype == GGML_TYPE_Q5_1)
        return 1;
#endif
    return is_float(wtype);
}

#if defined(AK_PACKED_Q)
static inline int pq_offset(int kind) { return kind == PQ_Q40 ? 8 : kind == PQ_Q50 ? 16 : kind == PQ_Q80 ? Q8_OFFSET : 0; }
#endif
static size_t code_record_bytes(uint32_t wtype) { return pq_code_record_bytes(pq_kind(wtype)); }

/* Bytes of one group of 16 rows, rounded up to 64: codes then scales, or for
 * float weights one 16-row column after the other. */
static size_t group_bytes(uint32_t wtype, int64_t cols) {
    if (is_float(wtype)) return ak_round64((size_t)cols * GROUP * float_bytes(wtype));
    size_t nb = (size_t)(cols / AK_QK);
    return ak_round64(nb * (code_record_bytes(wtype) + pq_scale_record_bytes(pq_kind(wtype))));
}

/* Bytes of one token's activations in the XP layout (see the top). */
static inline size_t xp_row_bytes(int64_t cols) {
    size_t nb = (size_t)(cols / AK_QK);
    return ak_round64((size_t)cols + nb * 12);
}

/* Bytes of the packed copy of a rows x cols matrix of wtype, or 0 when this
 * build has no packed kernels for it (then ak_matmul is the way). Quantized
 * rows so long that one token's activations would not fit the stack buffer
 * of the out-of-memory path (over ~47K columns) are not packed either: that
 * way a packed product can always be computed. */
size_t ak_packed_bytes(uint32_t wtype, int64_t rows, int64_t cols) {
    if (is_k(wtype)) return ak_packed_k_bytes(wtype, rows, cols);
#if defined(AK_PACKED)
    if (!packable(wtype) || rows <= 0 || cols <= 0 || (!is_float(wtype) && cols % AK_QK)) return 0;
    if (!is_float(wtype) && xp_row_bytes(cols) > AK_PACKED_STACK) return 0;
    return (size_t)((rows + GROUP - 1) / GROUP) * group_bytes(wtype, cols);
#else
    (void)wtype; (void)rows; (void)cols;
    return 0;
#endif
}

/* Writes the packed copy of W (rows x cols, row-major blocks of wtype) to P,
 * which has ak_packed_bytes(...) bytes (64-byte aligned for speed). Plain C:
 * this runs once per model load. */
void ak_pack_weights(uint32_t wtype, const void *W, int64_t rows, int64_t cols, void *P) {
    if (is_k(wtype)) {
        ak_pack_weights_k(wtype, W, rows, cols, P);
        return;
    }
    const int64_t nb = cols / AK_QK, ng = (rows + GROUP - 1) / GROUP;
    const size_t wrb = ak_row_bytes(wtype, cols), gb = group_bytes(wtype, cols), crb = code_record_bytes(wtype);
    if (is_float(wtype)) {
        const size_t es = float_bytes(wtype);
        for (int64_t g = 0; g < ng; g++) {
            uint8_t *grp = (uint8_t *)P + (size_t)g * gb;
            memset(grp, 0, gb);
            for (int r = 0; r < GROUP && g * GROUP + r < rows; r++) {
                const uint8_t *src = (const uint8_t *)W + (size_t)(g * GROUP + r) * wrb;
                if (es == 2)   /* constant sizes: moves, not memcpy calls */
                    for (int64_t k = 0; k < cols; k++) memcpy(grp + ((size_t)k * GROUP + r) * 2, src + k * 2, 2);
                else
                    for (int64_t k = 0; k < cols; k++) memcpy(grp + ((size_t)k * GROUP + r) * 4, src + k * 4, 4);
            }
        }
        return;
    }
    const int kind = pq_kind(wtype);
    const size_t srb = pq_scale_record_bytes(kind), bb = wrb / (size_t)nb;   /* bytes of a row-major block */
    const size_t used = (size_t)nb * (crb + srb);
    /* where a row-major block keeps its nibbles and its fifth bits */
    const size_t qs_at = kind == PQ_Q40 ? 2 : kind == PQ_Q41 ? 4 : kind == PQ_Q50 ? 6 : 8;
    const size_t qh_at = kind == PQ_Q50 ? 2 : 4;
    for (int64_t g = 0; g < ng; g++) {
        uint8_t *grp = (uint8_t *)P + (size_t)g * gb;
        int nrow = (int)(rows - g * GROUP < GROUP ? rows - g * GROUP : GROUP);
        if (nrow < GROUP) memset(grp, 0, gb);   /* padding rows: scale 0, codes 0 */
        else memset(grp + used, 0, gb - used);
        uint8_t *codes = grp, *scales = grp + (size_t)nb * crb;
        const uint8_t *src = (const uint8_t *)W + (size_t)g * GROUP * wrb;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *rec = codes + (size_t)b * crb, *sc = scales + (size_t)b * srb;
            for (int r = 0; r < nrow; r++) {
                const uint8_t *blk = src + (size_t)r * wrb + (size_t)b * bb;
                memcpy(sc + 2 * r, blk, 2);
                if (pq_has_min(kind)) memcpy(sc + 2 * GROUP + 2 * r, blk + 2, 2);
                if (kind == PQ_Q80) {
                    for (int p = 0; p < 8; p++) {
                        uint32_t v;
                        memcpy(&v, blk + 2 + 4 * p, 4);
                        v ^= 0x80808080u;
                        memcpy(rec + 64 * p + 4 * r, &v, 4);
                    }
                    continue;
                }
                /* the nibbles' byte j holds element j (low) and j + 16
                 * (high): the pairing vector p wants, so they move as they are */
                for (int p = 0; p < 4; p++) memcpy(rec + 64 * p + 4 * r, blk + qs_at + 4 * p, 4);
                if (pq_has_hbits(kind)) {
                    uint32_t qh = (uint32_t)blk[qh_at] | (uint32_t)blk[qh_at + 1] << 8 | (uint32_t)blk[qh_at + 2] << 16 |
                         (uint32_t)blk[qh_at + 3] << 24;   /* little-endian in the file */
                    for (int i = 0; i < 4; i++) {
                        unsigned v = 0;
                        for (int p = 0; p < 4; p++)
                            v |= ((qh >> (4 * p + i)) & 1u) << p | ((qh >> (16 + 4 * p + i)) & 1u) << (4 + p);
                        rec[256 + 4 * r + i] = (uint8_t)v;
                    }
                }
            }
        }
    }
}

#if defined(AK_PACKED)

#define AK_INLINE_P static inline __attribute__((always_inline))

static inline int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#if defined(AK_PACKED_512)
/* ======================================================================== */
/* AVX-512                                                                  */
/* ======================================================================== */

#if defined(AK_PACKED_Q)

/* One token's activations into the XP layout (see the top). */
static void quantize_xp(int offset, const float *x, uint8_t *dst, int64_t cols) {
    const int64_t nb = cols / AK_QK;
    int8_t *q = (int8_t *)dst;
    float *ds = (float *)(dst + cols), *ss = (float *)(dst + cols + 8 * nb);
    int32_t *cs = (int32_t *)(dst + cols + 4 * nb);
    for (int64_t b = 0; b < nb; b++) {
        __m128i q0, q1;
        int sum;
        float d = ak_quantize_block_avx512(x + b * AK_QK, &q0, &q1, &sum);
        _mm_storeu_si128((__m128i *)(q + b * AK_QK), q0);
        _mm_storeu_si128((__m128i *)(q + b * AK_QK + 16), q1);
        ds[b] = d;
        /* in unsigned arithmetic: activations holding NaN or Inf (a model's
         * broken weights) quantize to garbage sums whose product would
         * overflow; wrapping keeps it garbage, not undefined */
        cs[b] = (int32_t)(0u - (uint32_t)offset * (uint32_t)sum);
        ss[b] = d * (float)sum;   /* as kquant.c's activations: the same s */
    }
}

/* G groups of 16 rows (at grp, grp + gb, ...) times T tokens: Y[t * ldy +
 * g * 16 + r] for g * 16 + r < nvalid. xp token t's XP row is at xp + t *
 * xps. With one or two tokens the eight products of a block run as two
 * chains, so decode is not bound by the instruction's latency. The drivers
 * take groups four at a time for one token and two at a time otherwise:
 * more weight streams per thread keep more lines in flight (two groups
 * beat one, and four beat two for one token, even where some accumulators
 * spill: docs/speed.md has the figures). A group's
 * arithmetic is the same whatever G and T are. */
AK_INLINE_P void tile(const int kind, const int G, const int T, const ak_pk_tile *a) {
    const uint8_t *grp = a->grp, *xp = a->xq;
    const size_t gb = a->gb, xps = a->xqs;
    const int64_t nb = a->nb, cols = a->cols, ldy = a->ldy;
    float *Y = a->Y;
    const int nvalid = (int)a->nvalid;
    const int q8 = kind == PQ_Q80;
    const size_t crb = pq_code_record_bytes(kind), srb = pq_scale_record_bytes(kind);
    const __m512i m4 = _mm512_set1_epi8(0x0f), b4 = _mm512_set1_epi8(0x10);
    __m512 acc[4][TILE_T];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[g][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i w[4][8];
        __m512 dw[4], mw[4];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            const uint8_t *rec = grp + g * gb + (size_t)b * crb, *scales = grp + g * gb + (size_t)nb * crb;
            /* Weights stream from memory once per decode step; with few
             * tokens the work per record is too short for out-of-order
             * execution to reach the next loads, so they are fetched
             * PF_BYTES ahead (past the group's end too: the next group
             * follows). With several tokens the loop is as long in compute
             * as in memory, and the L1 prefetches alone (bounded by L1's
             * fill buffers) let the two take turns: a second stream of
             * prefetches far ahead into L2 keeps memory busy while the core
             * computes (with two groups the distance doubles, as each
             * stream moves at half the pace; docs/speed.md). */
#pragma GCC unroll 8
            for (size_t off = 0; off < crb; off += 64)
                _mm_prefetch((const char *)(rec + PF_BYTES + off), _MM_HINT_T0);
            if (T > 1)
#pragma GCC unroll 8
                for (size_t off = 0; off < crb; off += 64)
                    _mm_prefetch((const char *)(rec + PF_FAR + off), _MM_HINT_T1);
            _mm_prefetch((const char *)(scales + (size_t)b * srb + PF_BYTES / 8 * (srb / 32)), _MM_HINT_T0);
            if (q8) {
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) w[g][j] = _mm512_load_si512((const void *)(rec + 64 * j));
            } else {
                const __m512i hb = pq_has_hbits(kind) ? _mm512_load_si512((const void *)(rec + 256))
                                                      : _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++) {
                    __m512i z = _mm512_load_si512((const void *)(rec + 64 * p));
                    if (pq_has_hbits(kind)) {   /* bits p and 4 + p of hb, to bit 4 */
                        __m512i l = _mm512_and_si512(_mm512_slli_epi16(hb, 4 - p), b4);
                        __m512i h = _mm512_and_si512(p ? _mm512_srli_epi16(hb, p) : hb, b4);
                        w[g][p] = _mm512_ternarylogic_epi32(z, l, m4, 0xec);   /* (z & m4) | l */
                        w[g][p + 4] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(z, 4), h, m4, 0xec);
                    } else {
                        w[g][p] = _mm512_and_si512(z, m4);
                        w[g][p + 4] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
                    }
                }
            }
            dw[g] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scales + (size_t)b * srb)));
            mw[g] = pq_has_min(kind)
                        ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scales + (size_t)b * srb + 2 * GROUP)))
                        : _mm512_setzero_ps();
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const uint8_t *xt = xp + (size_t)t * xps;
            const int8_t *q = (const int8_t *)xt + b * AK_QK;
            float dx, sx;
            memcpy(&dx, xt + cols + 4 * b, 4);
            memcpy(&sx, xt + cols + 8 * (cols / AK_QK) + 4 * b, 4);
            const int32_t c = load_i32(xt + cols + 4 * (cols / AK_QK) + 4 * b);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                __m512i s0 = _mm512_set1_epi32(c);
                if (T <= 2) {
                    __m512i s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
                    for (int j = 0; j < 8; j += 2) {
                        s0 = ak_dpbusd_bcast(s0, w[g][j], q + 4 * j);
                        s1 = ak_dpbusd_bcast(s1, w[g][j + 1], q + 4 * j + 4);
                    }
                    s0 = _mm512_add_epi32(s0, s1);
                } else {
#pragma GCC unroll 8
                    for (int j = 0; j < 8; j++) s0 = ak_dpbusd_bcast(s0, w[g][j], q + 4 * j);
                }
                acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(dw[g], _mm512_set1_ps(dx)), acc[g][t]);
                if (pq_has_min(kind)) acc[g][t] = _mm512_fmadd_ps(mw[g], _mm512_set1_ps(sx), acc[g][t]);
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

#define TILE_FN(Q, G, T) static void tile_##Q##_##G##_##T(const ak_pk_tile *a) { tile(Q, G, T, a); }
#define TILE_FNS(Q, G) TILE_FN(Q, G, 1) TILE_FN(Q, G, 2) TILE_FN(Q, G, 3) TILE_FN(Q, G, 4) TILE_FN(Q, G, 5) \
    TILE_FN(Q, G, 6) TILE_FN(Q, G, 7) TILE_FN(Q, G, 8)
#define TILE_ROW(Q, G) { tile_##Q##_##G##_1, tile_##Q##_##G##_2, tile_##Q##_##G##_3, tile_##Q##_##G##_4, \
                         tile_##Q##_##G##_5, tile_##Q##_##G##_6, tile_##Q##_##G##_7, tile_##Q##_##G##_8 }
/* kinds: 0 Q4_0, 1 Q8_0, 2 Q4_1, 3 Q5_0, 4 Q5_1 (PQ_*) */
#define TILE_KIND(Q) TILE_FNS(Q, 1) TILE_FNS(Q, 2) TILE_FN(Q, 4, 1)
TILE_KIND(0) TILE_KIND(1) TILE_KIND(2) TILE_KIND(3) TILE_KIND(4)
static const ak_pk_tile_fn tiles[PQ_KINDS][2][TILE_T] = {   /* [kind][groups - 1][tokens - 1] */
    { TILE_ROW(0, 1), TILE_ROW(0, 2) }, { TILE_ROW(1, 1), TILE_ROW(1, 2) }, { TILE_ROW(2, 1), TILE_ROW(2, 2) },
    { TILE_ROW(3, 1), TILE_ROW(3, 2) }, { TILE_ROW(4, 1), TILE_ROW(4, 2) },
};
static const ak_pk_tile_fn tiles_quad[PQ_KINDS] = {   /* [kind]: four groups, one token */
    tile_0_4_1, tile_1_4_1, tile_2_4_1, tile_3_4_1, tile_4_4_1,
};

#endif /* AK_PACKED_Q */

/* ---- float weights ----
 * G groups of 16 rows times T tokens; each weight vector (one column of 16
 * rows, converted to f32) is used by T FMAs against the tokens' values
 * broadcast from memory. Every output is one chain of FMAs over the columns
 * in order, whatever G and T are: a token's result does not depend on how
 * many tokens share the pass (decode, batched decode and prefill agree to
 * the last bit). With one token that leaves two chains of FMAs in flight,
 * which still outrun what memory delivers (a 16-row column of f16 weights
 * per FMA); more groups, as more streams, measured slower (docs/speed.md). */
#define GMAX 2

AK_INLINE_P __m512 load_col(const int ft, const uint8_t *p) {
    if (ft == 0) return _mm512_load_ps((const float *)p);
    __m256i h = _mm256_load_si256((const __m256i *)p);
    if (ft == 1) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));   /* bf16: the top half */
}

/* Groups at grp, grp + gb, ...; nrows (a's nvalid): rows of the matrix
 * from the first group's first row on (the last group may be partly
 * padding). */
AK_INLINE_P void ftile(const int ft, const int G, const int T, const ak_pk_tile *a) {
    const uint8_t *grp = a->grp;
    const size_t gb = a->gb;
    const int64_t cols = a->cols, ldx = a->ldx, ldy = a->ldy, nrows = a->nvalid;
    const float *X = a->X;
    float *Y = a->Y;
    const size_t cb = (size_t)GROUP * (ft == 0 ? 4 : 2);   /* bytes per column */
    __m512 acc[GMAX][TILE_T];
#pragma GCC unroll 8
    for (int g = 0; g < G; g++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[g][t] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 4 <= cols; k += 4) {
#pragma GCC unroll 8
        for (int g = 0; g < G; g++)
#pragma GCC unroll 4
            for (size_t off = 0; off < 4 * cb; off += 64)
                _mm_prefetch((const char *)(grp + g * gb + (size_t)k * cb + PF_BYTES + off), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m512 w[GMAX];
#pragma GCC unroll 8
            for (int g = 0; g < G; g++) w[g] = load_col(ft, grp + g * gb + (size_t)(k + c) * cb);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m512 x = _mm512_set1_ps(X[t * ldx + k + c]);
#pragma GCC unroll 8
                for (int g = 0; g < G; g++) acc[g][t] = _mm512_fmadd_ps(w[g], x, acc[g][t]);
            }
        }
    }
    for (; k < cols; k++) {
        __m512 w[GMAX];
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) w[g] = load_col(ft, grp + g * gb + (size_t)k * cb);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m512 x = _mm512_set1_ps(X[t * ldx + k]);
#pragma GCC unroll 8
            for (int g = 0; g < G; g++) acc[g][t] = _mm512_fmadd_ps(w[g], x, acc[g][t]);
        }
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; g++) {
        int64_t nv = nrows - (int64_t)g * GROUP;
        const __mmask16 m = nv >= GROUP ? (__mmask16)0xffff : (__mmask16)((1u << nv) - 1);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(Y + (size_t)t * ldy + g * GROUP, m, acc[g][t]);
    }
}

#define FTILE_FN(F, G, T) static void ftile_##F##_##G##_##T(const ak_pk_tile *a) { ftile(F, G, T, a); }
#define FTILE_FNS(F, G) FTILE_FN(F, G, 1) FTILE_FN(F, G, 2) FTILE_FN(F, G, 3) FTILE_FN(F, G, 4)               \
    FTILE_FN(F, G, 5) FTILE_FN(F, G, 6) FTILE_FN(F, G, 7) FTILE_FN(F, G, 8)
#define FTILE_ROW(F, G) { ftile_##F##_##G##_1, ftile_##F##_##G##_2, ftile_##F##_##G##_3, ftile_##F##_##G##_4, \
                          ftile_##F##_##G##_5, ftile_##F##_##G##_6, ftile_##F##_##G##_7, ftile_##F##_##G##_8 }
FTILE_FNS(0, 1) FTILE_FNS(0, 2) FTILE_FNS(1, 1) FTILE_FNS(1, 2) FTILE_FNS(2, 1) FTILE_FNS(2, 2)
static const ak_pk_tile_fn ftiles[3][GMAX][TILE_T] = {
    { FTILE_ROW(0, 1), FTILE_ROW(0, 2) },
    { FTILE_ROW(1, 1), FTILE_ROW(1, 2) },
    { FTILE_ROW(2, 1), FTILE_ROW(2, 2) },
};

#if defined(AK_PACKED_Q)
/* The work item it (kernels_backend.h) of a 32-block kind: Y rows
 * [16 g0, 16 g1) x tokens [t0, t1) from the groups at P and the tokens' XP
 * rows at xq. */
static void q_item(int kind, const ak_pk_item *it) {
    const uint8_t *P = it->P, *xp = it->xq;
    const size_t gb = it->gb, xps = it->xqs;
    const int64_t rows = it->rows, cols = it->cols, g1 = it->g1, t0 = it->t0, t1 = it->t1;
    float *Y = it->Y;
    const int64_t nb = cols / AK_QK;
    for (int64_t g = it->g0, G; g < g1; g += G) {
        G = t1 - t0 == 1 && g1 - g >= 4 ? 4 : (int)ak_min64(2, g1 - g);   /* one token: four streams */
        int nvalid = (int)ak_min64(G * GROUP, rows - g * GROUP);
        for (int64_t t = t0; t < t1; t += TILE_T) {
            int T = (int)ak_min64(TILE_T, t1 - t);
            const ak_pk_tile_fn fn = G == 4 ? tiles_quad[kind] : tiles[kind][G - 1][T - 1];
            fn(&(ak_pk_tile){ .grp = P + (size_t)g * gb, .gb = gb, .nb = nb, .cols = cols, .xq = xp + (size_t)t * xps,
                              .xqs = xps, .Y = Y + t * rows + g * GROUP, .ldy = rows, .nvalid = nvalid });
        }
    }
}
#endif

/* The same for float weights (ft: ak_ftype_index) from the activations X
 * (ntok x cols). */
static void f_item(int ft, const ak_pk_item *it) {
    const uint8_t *P = it->P;
    const size_t gb = it->gb;
    const int64_t rows = it->rows, cols = it->cols, g1 = it->g1, t1 = it->t1;
    const float *X = it->X;
    float *Y = it->Y;
    for (int64_t t = it->t0; t < t1; t += TILE_T) {
        int T = (int)ak_min64(TILE_T, t1 - t);
        for (int64_t g = it->g0, G; g < g1; g += G) {
            G = (int)ak_min64(GMAX, g1 - g);
            ftiles[ft][G - 1][T - 1](&(ak_pk_tile){ .grp = P + (size_t)g * gb, .gb = gb, .cols = cols,
                                                    .X = X + t * cols, .ldx = cols, .Y = Y + t * rows + g * GROUP,
                                                    .ldy = rows, .nvalid = rows - g * GROUP });
        }
    }
}

#elif defined(AK_PACKED_256)
/* ======================================================================== */
/* AVX2 (x86-64-v3: AVX2, FMA, F16C; AVX-VNNI where the build has it)      */
/* ======================================================================== */
/* The same layout and arithmetic per row as the AVX-512 tiles, on 32-byte
 * vectors: a 64-byte vector of a record is two halves, rows 0..7 of the
 * group in its first 32 bytes and rows 8..15 in its second, each unpacked
 * once and used for every token of the tile. Without VNNI the u8 x s8
 * products go through vpmaddubsw, whose 16-bit pair sums saturate: they are
 * added as 16-bit lanes only while no sum can pass 32767 (Q4 codes < 16:
 * the 16 pairs of a block, <= 16 * 2 * 15 * 128 = 30720; Q5 codes < 32: 8
 * pairs), then widened by vpmaddwd against ones. Q8_0 takes |q| x sign(x,
 * q) (its codes are stored as q + 128, which vpmaddubsw would saturate on),
 * with an offset of 0. Every integer sum is exact, so a row's result is the
 * same bits whatever the tile, as on AVX-512. */

#if defined(__AVXVNNI__)
#define AK_VNNI256 1
#endif

/* The int32 lanes of acc plus u8 x s8 products of w with 4 activation bytes
 * at p broadcast (AVX-VNNI builds only). */
#if defined(AK_VNNI256)
AK_INLINE_P __m256i dpbusd_b(__m256i acc, __m256i w, const void *p) {
    return _mm256_dpbusd_avx_epi32(acc, w, _mm256_set1_epi32(load_i32(p)));
}
#endif

/* Pins v to a register at this point. GCC reassociates a chain of integer
 * adds into a tree over all of a block's products, computing them all first:
 * with 16 registers most spill (a T = 4 tile stored and reloaded 20 vectors
 * per block). Pinned, each token's sum is one chain, updated in place. */
#define KEEP(v) __asm__("" : "+x"(v))

#if !defined(AK_VNNI256)
/* 16-bit pair sums of the u8 w times the 4 s8 activation bytes at p
 * broadcast (builds without VNNI only). */
AK_INLINE_P __m256i maddubs_b(__m256i w, const void *p) {
    return _mm256_maddubs_epi16(w, _mm256_set1_epi32(load_i32(p)));
}
#endif

/* One token's activations into the XP layout (see the top). */
static void quantize_xp(int offset, const float *x, uint8_t *dst, int64_t cols) {
    const int64_t nb = cols / AK_QK;
    int8_t *q = (int8_t *)dst;
    float *ds = (float *)(dst + cols), *ss = (float *)(dst + cols + 8 * nb);
    int32_t *cs = (int32_t *)(dst + cols + 4 * nb);
    for (int64_t b = 0; b < nb; b++) {
        __m256i qv;
        int sum;
        float d = ak_quantize_block_avx2(x + b * AK_QK, &qv, &sum);
        _mm256_storeu_si256((__m256i *)(q + b * AK_QK), qv);
        ds[b] = d;
        cs[b] = (int32_t)(0u - (uint32_t)offset * (uint32_t)sum);   /* wrapping: see the AVX-512 twin */
        ss[b] = d * (float)sum;
    }
}

/* Stores the 8 lanes of v at y, or its first nv (0 < nv < 8). */
AK_INLINE_P void store8(float *y, __m256 v, int nv) {
    if (nv >= 8) {
        _mm256_storeu_ps(y, v);
        return;
    }
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(nv), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(y, m, v);
}

/* G groups of 16 rows (at grp, grp + gb, ...) times T tokens, the H halves
 * from h0 on of each group (H = 2: all 16 rows; H = 1: rows 8 h0 ..
 * 8 h0 + 7): Y[t * ldy + 16 g + 8 h + r] for 16 g + 8 h + r < nvalid. xp
 * token t's XP row is at xp + t * xps. A half's block sum is computed for
 * the T tokens while its weights sit in registers, then scaled into the
 * accumulators, so the live registers are T sums and the unpacked vector
 * (the accumulators of other halves are touched once per block). */
AK_INLINE_P void tile(const int kind, const int G, const int H, const int T, const ak_pk_tile *a) {
    const uint8_t *grp = a->grp, *xp = a->xq;
    const size_t gb = a->gb, xps = a->xqs;
    const int64_t nb = a->nb, cols = a->cols, ldy = a->ldy;
    float *Y = a->Y;
    const int h0 = a->half, nvalid = (int)a->nvalid;
    const size_t crb = pq_code_record_bytes(kind), srb = pq_scale_record_bytes(kind);
    const __m256i m4 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10);
    __m256 acc[4][2][TILE_T];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 2
        for (int hh = 0; hh < H; hh++)
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) acc[g][hh][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            const uint8_t *rec = grp + g * gb + (size_t)b * crb;
            const uint8_t *sc = grp + g * gb + (size_t)nb * crb + (size_t)b * srb;
            /* as the AVX-512 tile: L1 prefetches PF_BYTES ahead, and with
             * several tokens a second stream far ahead into L2 */
#pragma GCC unroll 8
            for (size_t off = 0; off < crb; off += 64)
                _mm_prefetch((const char *)(rec + PF_BYTES + off), _MM_HINT_T0);
            if (T > 1)
#pragma GCC unroll 8
                for (size_t off = 0; off < crb; off += 64)
                    _mm_prefetch((const char *)(rec + PF_FAR + off), _MM_HINT_T1);
            _mm_prefetch((const char *)(sc + PF_BYTES / 8 * (srb / 32)), _MM_HINT_T0);
#pragma GCC unroll 2
            for (int hh = 0; hh < H; hh++) {
                const int h = h0 + hh;
                __m256i s[TILE_T];
#pragma GCC unroll 4
                for (int t = 0; t < T; t++)
                    s[t] = _mm256_set1_epi32(load_i32(xp + (size_t)t * xps + cols + 4 * (cols / AK_QK) + 4 * b));
                if (kind == PQ_Q80) {
#pragma GCC unroll 8
                    for (int j = 0; j < 8; j++) {
                        const __m256i z = _mm256_load_si256((const __m256i *)(rec + 64 * j + 32 * h));
#if defined(AK_VNNI256)
#pragma GCC unroll 4
                        for (int t = 0; t < T; t++) s[t] = dpbusd_b(s[t], z, xp + (size_t)t * xps + b * AK_QK + 4 * j);
#else
                        const __m256i ws = _mm256_xor_si256(z, _mm256_set1_epi8((char)0x80)), wa = _mm256_abs_epi8(ws);
#pragma GCC unroll 4
                        for (int t = 0; t < T; t++) {
                            __m256i x = _mm256_set1_epi32(load_i32(xp + (size_t)t * xps + b * AK_QK + 4 * j));
                            __m256i p = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(x, ws));
                            s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
                            KEEP(s[t]);
                        }
#endif
                    }
                } else {
                    const __m256i hb = pq_has_hbits(kind) ? _mm256_load_si256((const __m256i *)(rec + 256 + 32 * h))
                                                          : _mm256_setzero_si256();
                    __m256i s16[TILE_T];
#pragma GCC unroll 4
                    for (int t = 0; t < T; t++) s16[t] = _mm256_setzero_si256();
                    (void)s16;   /* unused with VNNI */
#pragma GCC unroll 4
                    for (int p = 0; p < 4; p++) {
                        const __m256i z = _mm256_load_si256((const __m256i *)(rec + 64 * p + 32 * h));
                        __m256i lo = _mm256_and_si256(z, m4), hi = _mm256_and_si256(_mm256_srli_epi16(z, 4), m4);
                        if (pq_has_hbits(kind)) {   /* bits p and 4 + p of hb, to bit 4 */
                            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_sll_epi16(hb, _mm_cvtsi32_si128(4 - p)), b4));
                            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(p)), b4));
                        }
#pragma GCC unroll 4
                        for (int t = 0; t < T; t++) {
                            const uint8_t *q = xp + (size_t)t * xps + b * AK_QK;
#if defined(AK_VNNI256)
                            s[t] = dpbusd_b(s[t], lo, q + 4 * p);
                            s[t] = dpbusd_b(s[t], hi, q + 16 + 4 * p);
#else
                            s16[t] = _mm256_add_epi16(s16[t], maddubs_b(lo, q + 4 * p));
                            KEEP(s16[t]);
                            s16[t] = _mm256_add_epi16(s16[t], maddubs_b(hi, q + 16 + 4 * p));
                            KEEP(s16[t]);
#endif
                        }
#if !defined(AK_VNNI256)
                        if (p == 3 || (pq_has_hbits(kind) && p == 1)) {   /* widen before a 16-bit sum could overflow */
#pragma GCC unroll 4
                            for (int t = 0; t < T; t++) {
                                s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(s16[t], _mm256_set1_epi16(1)));
                                s16[t] = _mm256_setzero_si256();
                            }
                        }
#endif
                    }
                }
                const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + 16 * h)));
                const __m256 mw = pq_has_min(kind) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + 2 * GROUP + 16 * h)))
                                                   : _mm256_setzero_ps();
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const uint8_t *xt = xp + (size_t)t * xps;
                    float dx, sx;
                    memcpy(&dx, xt + cols + 4 * b, 4);
                    memcpy(&sx, xt + cols + 8 * (cols / AK_QK) + 4 * b, 4);
                    acc[g][hh][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_mul_ps(dw, _mm256_set1_ps(dx)),
                                                    acc[g][hh][t]);
                    if (pq_has_min(kind)) acc[g][hh][t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sx), acc[g][hh][t]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 2
        for (int hh = 0; hh < H; hh++) {
            const int base = g * GROUP + 8 * (h0 + hh), nv = nvalid - base;
            if (nv <= 0) continue;
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) store8(Y + (size_t)t * ldy + base, acc[g][hh][t], nv);
        }
}

/* One group of 16 rows (both halves) times T tokens for the kinds without
 * fifth bits (Q4_0, Q4_1, Q8_0): Y[t * ldy + r] for r < nvalid. Each
 * activation broadcast serves both halves, where tile's half-by-half passes
 * load it twice; the integer sums of the 2 T half-rows live in registers
 * through a block (2 T + the 4 unpacked vectors + a broadcast fit 16 ymm),
 * so the float accumulators are kept in an L1 buffer, loaded and stored
 * once per block. A row's arithmetic is tile's: the same integer sum, the
 * same FMAs from 0 in block order, so the same bits. pf: whether to issue
 * the prefetches (the first pass over a group; a later one finds it in L1). */
AK_INLINE_P void tile_both(const int kind, const int T, const ak_pk_tile *a) {
    const uint8_t *grp = a->grp, *xp = a->xq;
    const size_t xps = a->xqs;
    const int64_t nb = a->nb, cols = a->cols, ldy = a->ldy;
    float *Y = a->Y;
    const int nvalid = (int)a->nvalid, pf = a->prefetch;
    const size_t crb = pq_code_record_bytes(kind), srb = pq_scale_record_bytes(kind);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    _Alignas(32) float acc[TILE_T][2][8];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        _mm256_store_ps(acc[t][0], _mm256_setzero_ps());
        _mm256_store_ps(acc[t][1], _mm256_setzero_ps());
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *rec = grp + (size_t)b * crb;
        const uint8_t *sc = grp + (size_t)nb * crb + (size_t)b * srb;
        if (pf) {   /* as tile: into L1 near, into L2 far ahead */
#pragma GCC unroll 8
            for (size_t off = 0; off < crb; off += 64) _mm_prefetch((const char *)(rec + PF_BYTES + off), _MM_HINT_T0);
#pragma GCC unroll 8
            for (size_t off = 0; off < crb; off += 64) _mm_prefetch((const char *)(rec + PF_FAR + off), _MM_HINT_T1);
            _mm_prefetch((const char *)(sc + PF_BYTES / 8 * (srb / 32)), _MM_HINT_T0);
        }
        __m256i s[TILE_T][2];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) s[t][0] = s[t][1] = _mm256_setzero_si256();
        if (kind == PQ_Q80) {
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const __m256i z0 = _mm256_load_si256((const __m256i *)(rec + 64 * j));
                const __m256i z1 = _mm256_load_si256((const __m256i *)(rec + 64 * j + 32));
#if defined(AK_VNNI256)
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const __m256i x = _mm256_set1_epi32(load_i32(xp + (size_t)t * xps + b * AK_QK + 4 * j));
                    s[t][0] = _mm256_dpbusd_avx_epi32(s[t][0], z0, x);
                    KEEP(s[t][0]);
                    s[t][1] = _mm256_dpbusd_avx_epi32(s[t][1], z1, x);
                    KEEP(s[t][1]);
                }
#else
                const __m256i ws0 = _mm256_xor_si256(z0, _mm256_set1_epi8((char)0x80)), wa0 = _mm256_abs_epi8(ws0);
                const __m256i ws1 = _mm256_xor_si256(z1, _mm256_set1_epi8((char)0x80)), wa1 = _mm256_abs_epi8(ws1);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const __m256i x = _mm256_set1_epi32(load_i32(xp + (size_t)t * xps + b * AK_QK + 4 * j));
                    __m256i p0 = _mm256_maddubs_epi16(wa0, _mm256_sign_epi8(x, ws0));
                    s[t][0] = _mm256_add_epi32(s[t][0], _mm256_madd_epi16(p0, _mm256_set1_epi16(1)));
                    KEEP(s[t][0]);
                    __m256i p1 = _mm256_maddubs_epi16(wa1, _mm256_sign_epi8(x, ws1));
                    s[t][1] = _mm256_add_epi32(s[t][1], _mm256_madd_epi16(p1, _mm256_set1_epi16(1)));
                    KEEP(s[t][1]);
                }
#endif
            }
        } else {
            /* Q4_0 / Q4_1: without VNNI, s holds 16-bit pair sums until the
             * block's end (at most 30720: see the section's top) */
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) {
                const __m256i z0 = _mm256_load_si256((const __m256i *)(rec + 64 * p));
                const __m256i z1 = _mm256_load_si256((const __m256i *)(rec + 64 * p + 32));
                const __m256i lo0 = _mm256_and_si256(z0, m4), hi0 = _mm256_and_si256(_mm256_srli_epi16(z0, 4), m4);
                const __m256i lo1 = _mm256_and_si256(z1, m4), hi1 = _mm256_and_si256(_mm256_srli_epi16(z1, 4), m4);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const uint8_t *q = xp + (size_t)t * xps + b * AK_QK;
                    const __m256i xl = _mm256_set1_epi32(load_i32(q + 4 * p));
                    const __m256i xh = _mm256_set1_epi32(load_i32(q + 16 + 4 * p));
#if defined(AK_VNNI256)
                    s[t][0] = _mm256_dpbusd_avx_epi32(s[t][0], lo0, xl);
                    KEEP(s[t][0]);
                    s[t][1] = _mm256_dpbusd_avx_epi32(s[t][1], lo1, xl);
                    KEEP(s[t][1]);
                    s[t][0] = _mm256_dpbusd_avx_epi32(s[t][0], hi0, xh);
                    KEEP(s[t][0]);
                    s[t][1] = _mm256_dpbusd_avx_epi32(s[t][1], hi1, xh);
                    KEEP(s[t][1]);
#else
                    s[t][0] = _mm256_add_epi16(s[t][0], _mm256_maddubs_epi16(lo0, xl));
                    KEEP(s[t][0]);
                    s[t][1] = _mm256_add_epi16(s[t][1], _mm256_maddubs_epi16(lo1, xl));
                    KEEP(s[t][1]);
                    s[t][0] = _mm256_add_epi16(s[t][0], _mm256_maddubs_epi16(hi0, xh));
                    KEEP(s[t][0]);
                    s[t][1] = _mm256_add_epi16(s[t][1], _mm256_maddubs_epi16(hi1, xh));
                    KEEP(s[t][1]);
#endif
                }
            }
#if !defined(AK_VNNI256)
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                s[t][0] = _mm256_madd_epi16(s[t][0], _mm256_set1_epi16(1));
                s[t][1] = _mm256_madd_epi16(s[t][1], _mm256_set1_epi16(1));
            }
#endif
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + 16 * h)));
            const __m256 mw = pq_has_min(kind) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + 2 * GROUP + 16 * h)))
                                               : _mm256_setzero_ps();
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const uint8_t *xt = xp + (size_t)t * xps;
                float dx, sx;
                memcpy(&dx, xt + cols + 4 * b, 4);
                memcpy(&sx, xt + cols + 8 * (cols / AK_QK) + 4 * b, 4);
                /* the offset c first, as tile's sums start from it (integer: any order) */
                const __m256i si = _mm256_add_epi32(_mm256_set1_epi32(load_i32(xt + cols + 4 * (cols / AK_QK) + 4 * b)),
                                                    s[t][h]);
                __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_mul_ps(dw, _mm256_set1_ps(dx)),
                                           _mm256_load_ps(acc[t][h]));
                if (pq_has_min(kind)) a = _mm256_fmadd_ps(mw, _mm256_set1_ps(sx), a);
                _mm256_store_ps(acc[t][h], a);
            }
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

#define TILE_BOTH_FN(Q, T) static void tile_both_##Q##_##T(const ak_pk_tile *a) { tile_both(Q, T, a); }
TILE_BOTH_FN(PQ_Q40, 3) TILE_BOTH_FN(PQ_Q40, 4) TILE_BOTH_FN(PQ_Q80, 3) TILE_BOTH_FN(PQ_Q80, 4)
TILE_BOTH_FN(PQ_Q41, 3) TILE_BOTH_FN(PQ_Q41, 4)
/* [kind][T - 3]; NULL: the kind goes half by half (Q5's fifth bits and
 * 16-bit sums widened twice a block would not fit the registers) */
static const ak_pk_tile_fn tiles_both[PQ_KINDS][2] = {
    [PQ_Q40] = { tile_both_PQ_Q40_3, tile_both_PQ_Q40_4 },
    [PQ_Q80] = { tile_both_PQ_Q80_3, tile_both_PQ_Q80_4 },
    [PQ_Q41] = { tile_both_PQ_Q41_3, tile_both_PQ_Q41_4 },
};

#define TILE_FN(Q, G, H, T) static void tile_##Q##_##G##_##H##_##T(const ak_pk_tile *a) { tile(Q, G, H, T, a); }
/* Per kind: four groups for one token (four streams of weights, as the
 * AVX-512 decode), two for two tokens, one group's two halves for three
 * or four, one half for four (its registers: the sums of four tokens). */
#define TILE_KIND(Q) TILE_FN(Q, 4, 2, 1) TILE_FN(Q, 2, 2, 1) TILE_FN(Q, 1, 2, 1) TILE_FN(Q, 2, 2, 2) \
    TILE_FN(Q, 1, 2, 2) TILE_FN(Q, 1, 2, 3) TILE_FN(Q, 1, 2, 4) TILE_FN(Q, 1, 1, 4)
TILE_KIND(0) TILE_KIND(1) TILE_KIND(2) TILE_KIND(3) TILE_KIND(4)
#define TILE_ROW(Q) { tile_##Q##_4_2_1, tile_##Q##_2_2_1, tile_##Q##_1_2_1, tile_##Q##_2_2_2, tile_##Q##_1_2_2, \
                      tile_##Q##_1_2_3, tile_##Q##_1_2_4, tile_##Q##_1_1_4 }
enum { TS_G4T1, TS_G2T1, TS_G1T1, TS_G2T2, TS_G1T2, TS_G1T3, TS_G1T4, TS_HALF_T4, TS_N };
static const ak_pk_tile_fn tiles[PQ_KINDS][TS_N] = { TILE_ROW(0), TILE_ROW(1), TILE_ROW(2), TILE_ROW(3), TILE_ROW(4) };

/* The work item it of a 32-block kind (the AVX-512 q_item's contract). */
static void q_item(int kind, const ak_pk_item *it) {
    const uint8_t *P = it->P, *xp = it->xq;
    const size_t gb = it->gb, xps = it->xqs;
    const int64_t rows = it->rows, cols = it->cols, g1 = it->g1, t0 = it->t0, t1 = it->t1;
    float *Y = it->Y;
    const int64_t nb = cols / AK_QK;
    for (int64_t g = it->g0, G; g < g1; g += G) {
        const int64_t nt = t1 - t0;
        G = nt == 1 ? ak_min64(4, g1 - g) : nt == 2 ? ak_min64(2, g1 - g) : 1;
        if (G == 3) G = 2;
        const int nvalid = (int)ak_min64(G * GROUP, rows - g * GROUP);
        const uint8_t *grp = P + (size_t)g * gb;
        for (int64_t t = t0; t < t1; t += TILE_T) {
            const int T = (int)ak_min64(TILE_T, t1 - t);
            ak_pk_tile a = { .grp = grp, .gb = gb, .nb = nb, .cols = cols, .xq = xp + (size_t)t * xps, .xqs = xps,
                             .Y = Y + t * rows + g * GROUP, .ldy = rows, .nvalid = nvalid, .prefetch = t == t0 };
            if (T >= 3 && tiles_both[kind][T - 3]) {   /* the chunks after the first find the group in L1 */
                tiles_both[kind][T - 3](&a);
                continue;
            }
            if (T == 4) {   /* half by half: the group's lines come from cache the second time */
                tiles[kind][TS_HALF_T4](&a);
                a.half = 1;
                tiles[kind][TS_HALF_T4](&a);
                continue;
            }
            const int ts = T == 1 ? (G == 4 ? TS_G4T1 : G == 2 ? TS_G2T1 : TS_G1T1)
                         : T == 2 ? (G == 2 ? TS_G2T2 : TS_G1T2) : TS_G1T3;
            tiles[kind][ts](&a);
        }
    }
}

/* ---- float weights ----
 * G groups of 16 rows times T tokens; a column of 16 rows is two vectors
 * of 8 (f32: two loads; f16: F16C conversions; bf16: shifted), each used
 * by T FMAs against the tokens' values broadcast. Every output is one chain
 * of FMAs over the columns in order, whatever G and T are (batch
 * invariance, as on AVX-512). Up to 6 tokens: 12 accumulators, the two
 * weight vectors and a broadcast fill the 16 registers. */
#define FT_T 6
#define GMAX 2

AK_INLINE_P __m256 load_col8(const int ft, const uint8_t *p) {
    if (ft == 0) return _mm256_load_ps((const float *)p);
    __m128i h = _mm_load_si128((const __m128i *)p);
    if (ft == 1) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));   /* bf16: the top half */
}

/* The float tile a (nvalid: rows of the matrix from its first group's
 * first row on): G groups times T tokens. */
AK_INLINE_P void ftile(const int ft, const int G, const int T, const ak_pk_tile *a) {
    const uint8_t *grp = a->grp;
    const size_t gb = a->gb;
    const int64_t cols = a->cols, ldx = a->ldx, ldy = a->ldy, nrows = a->nvalid;
    const float *X = a->X;
    float *Y = a->Y;
    const size_t cb = (size_t)GROUP * (ft == 0 ? 4 : 2);   /* bytes per column */
    __m256 acc[GMAX][2][FT_T];
#pragma GCC unroll 2
    for (int g = 0; g < G; g++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) acc[g][0][t] = acc[g][1][t] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 4 <= cols; k += 4) {
#pragma GCC unroll 2
        for (int g = 0; g < G; g++)
#pragma GCC unroll 4
            for (size_t off = 0; off < 4 * cb; off += 64)
                _mm_prefetch((const char *)(grp + g * gb + (size_t)k * cb + PF_BYTES + off), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256 w[GMAX][2];
#pragma GCC unroll 2
            for (int g = 0; g < G; g++) {
                w[g][0] = load_col8(ft, grp + g * gb + (size_t)(k + c) * cb);
                w[g][1] = load_col8(ft, grp + g * gb + (size_t)(k + c) * cb + cb / 2);
            }
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) {
                __m256 x = _mm256_broadcast_ss(X + t * ldx + k + c);
#pragma GCC unroll 2
                for (int g = 0; g < G; g++) {
                    acc[g][0][t] = _mm256_fmadd_ps(w[g][0], x, acc[g][0][t]);
                    acc[g][1][t] = _mm256_fmadd_ps(w[g][1], x, acc[g][1][t]);
                }
            }
        }
    }
    for (; k < cols; k++) {
        __m256 w[GMAX][2];
#pragma GCC unroll 2
        for (int g = 0; g < G; g++) {
            w[g][0] = load_col8(ft, grp + g * gb + (size_t)k * cb);
            w[g][1] = load_col8(ft, grp + g * gb + (size_t)k * cb + cb / 2);
        }
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m256 x = _mm256_broadcast_ss(X + t * ldx + k);
#pragma GCC unroll 2
            for (int g = 0; g < G; g++) {
                acc[g][0][t] = _mm256_fmadd_ps(w[g][0], x, acc[g][0][t]);
                acc[g][1][t] = _mm256_fmadd_ps(w[g][1], x, acc[g][1][t]);
            }
        }
    }
#pragma GCC unroll 2
    for (int g = 0; g < G; g++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const int64_t nv = nrows - (int64_t)g * GROUP - 8 * h;
            if (nv <= 0) continue;
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) store8(Y + (size_t)t * ldy + g * GROUP + 8 * h, acc[g][h][t], (int)ak_min64(nv, 8));
        }
}

#define FTILE_FN(F, G, T) static void ftile_##F##_##G##_##T(const ak_pk_tile *a) { ftile(F, G, T, a); }
/* per type: one group with 1..6 tokens, two groups (two streams) with 1 or 2 */
#define FTILE_TYPE(F) FTILE_FN(F, 1, 1) FTILE_FN(F, 1, 2) FTILE_FN(F, 1, 3) FTILE_FN(F, 1, 4) FTILE_FN(F, 1, 5) \
    FTILE_FN(F, 1, 6) FTILE_FN(F, 2, 1) FTILE_FN(F, 2, 2)
FTILE_TYPE(0) FTILE_TYPE(1) FTILE_TYPE(2)
#define FTILE_ROWS(F) { { ftile_##F##_1_1, ftile_##F##_1_2, ftile_##F##_1_3, ftile_##F##_1_4, ftile_##F##_1_5, \
                          ftile_##F##_1_6 }, { ftile_##F##_2_1, ftile_##F##_2_2, NULL, NULL, NULL, NULL } }
static const ak_pk_tile_fn ftiles[3][GMAX][FT_T] = { FTILE_ROWS(0), FTILE_ROWS(1), FTILE_ROWS(2) };

/* The AVX-512 f_item's contract. */
static void f_item(int ft, const ak_pk_item *it) {
    const uint8_t *P = it->P;
    const size_t gb = it->gb;
    const int64_t rows = it->rows, cols = it->cols, g0 = it->g0, g1 = it->g1, t0 = it->t0, t1 = it->t1;
    const float *X = it->X;
    float *Y = it->Y;
    if (t1 - t0 > FT_T) {
        /* more tokens than a tile: group by group, so that the group's
         * columns come from L1 for the tiles after the first (token chunk
         * by chunk over the whole item would stream them from L2 again),
         * in tiles of nearly equal size (8 tokens: 4 + 4, not 6 + 2, whose
         * second tile loads and converts a weight vector per 2 FMAs) */
        const int64_t n = t1 - t0, k = (n + FT_T - 1) / FT_T;
        for (int64_t g = g0; g < g1; g++)
            for (int64_t i = 0; i < k; i++) {
                const int64_t t = t0 + n * i / k;
                const int T = (int)(t0 + n * (i + 1) / k - t);
                ftiles[ft][0][T - 1](&(ak_pk_tile){ .grp = P + (size_t)g * gb, .gb = gb, .cols = cols,
                                                    .X = X + t * cols, .ldx = cols, .Y = Y + t * rows + g * GROUP,
                                                    .ldy = rows, .nvalid = rows - g * GROUP });
            }
        return;
    }
    for (int64_t t = t0; t < t1; t += FT_T) {
        const int T = (int)ak_min64(FT_T, t1 - t);
        for (int64_t g = g0, G; g < g1; g += G) {
            G = T <= 2 ? (int)ak_min64(GMAX, g1 - g) : 1;
            ftiles[ft][G - 1][T - 1](&(ak_pk_tile){ .grp = P + (size_t)g * gb, .gb = gb, .cols = cols,
                                                    .X = X + t * cols, .ldx = cols, .Y = Y + t * rows + g * GROUP,
                                                    .ldy = rows, .nvalid = rows - g * GROUP });
        }
    }
}
#elif defined(AK_PACKED_NEON)
/* AArch64: the tiles are kernels_packed_arm.c's (sdot / smmla / plain NEON,
 * chosen per product at run time); the same contracts as above. */
static void quantize_xp(int offset, const float *x, uint8_t *dst, int64_t cols) {
    /* the offset is implied by the type; kernels_packed_arm.c knows it */
    ak_packed_neon_quantize(offset == 8 ? GGML_TYPE_Q4_0 : offset == 16 ? GGML_TYPE_Q5_0 : GGML_TYPE_Q8_0, x, dst,
                            cols);
}
static void q_item(int kind, const ak_pk_item *it) {
    static const uint32_t type_of[PQ_KINDS] = { GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
                                                GGML_TYPE_Q5_1 };
    ak_packed_neon_q_item(ak_neon_level(), type_of[kind], it);
}
static void f_item(int ft, const ak_pk_item *it) { ak_packed_neon_f_item(ft, it); }
#endif /* AK_PACKED_512, AK_PACKED_256, AK_PACKED_NEON */

typedef struct {
    uint32_t wtype;
    int nm;                          /* matrices sharing X: 1..AK_MATMUL_PACKED_MAX */
    const uint8_t *P[AK_MATMUL_PACKED_MAX];
    int64_t rows[AK_MATMUL_PACKED_MAX];
    float *Y[AK_MATMUL_PACKED_MAX];
    int64_t gend[AK_MATMUL_PACKED_MAX];   /* matrix m's groups are [gend[m-1], gend[m]) of all */
    int64_t cols, ntok;
    const float *X;
    uint8_t *xp;
    size_t xps, gb;
    int64_t ng;             /* groups of 16 rows, all matrices' */
    ak_mm_items items;      /* groups x token chunks */
} pk_job;

#if defined(AK_PACKED_Q)
static void pk_quantize_task(void *arg, int ith, int nth) {
    pk_job *j = arg;
    int64_t per = (j->ntok + nth - 1) / nth;
    int64_t t0 = ith * per, t1 = ak_min64(j->ntok, t0 + per);
    int offset = pq_offset(pq_kind(j->wtype));
    for (int64_t t = t0; t < t1; t++) {
        const float *x = j->X + t * j->cols;
        uint8_t *dst = j->xp + (size_t)t * j->xps;
        if (is_k(j->wtype)) ak_packed_k_quantize(x, dst, j->cols);
        else quantize_xp(offset, x, dst, j->cols);
    }
}
#endif

static void pk_task(void *arg, int ith, int nth) {
    (void)nth;
    pk_job *j = arg;
    int64_t g0, g1, t0, t1;
    while (ak_mm_items_next(&j->items, ith, &g0, &g1, &t0, &t1)) {
        /* an item may span the end of one matrix and the start of the next */
        for (int m = 0; m < j->nm; m++) {
            const int64_t base = m ? j->gend[m - 1] : 0;
            const int64_t a = (g0 > base ? g0 : base) - base, b = ak_min64(g1, j->gend[m]) - base;
            if (a >= b) continue;
            const ak_pk_item it = { .P = j->P[m], .gb = j->gb, .rows = j->rows[m], .cols = j->cols, .g0 = a, .g1 = b,
                                    .t0 = t0, .t1 = t1, .xq = j->xp, .xqs = j->xps, .X = j->X, .Y = j->Y[m] };
            if (is_float(j->wtype)) {
                f_item(ak_ftype_index(j->wtype), &it);
                continue;
            }
#if defined(AK_PACKED_Q)
            if (is_k(j->wtype)) ak_packed_k_item(j->wtype, &it);
            else q_item(pq_kind(j->wtype), &it);
#endif
        }
    }
}

#endif /* AK_PACKED */

/* Y (ntok x rows) = X (ntok x cols) times W^T for the product a, with W
 * given as its packed copy (ak_pack_weights). Same contract and same
 * activation rounding as ak_matmul. Returns 0; or -1 with err set
 * (AK_ERR_INVALID, Y untouched) when ak_packed_bytes(wtype, rows, cols) is
 * 0: this build has no packed kernels for it (such a call once wrote zeros
 * to Y). Scratch for the quantized activations comes from the pool (the
 * heap without one); when that cannot be had, the product is computed one
 * token at a time with the activations on the stack, which ak_packed_bytes
 * sized for: the result is the same bits, never zeros. */
int ak_matmul_packed(ak_threads *pool, const ak_matmul_args *a, ak_error *err) {
    return ak_matmul_packed_n(pool, 1, a, err);
}

/* The n products a[m] of one type and width that share X (kernels.h):
 * ak_matmul_packed's contract for each, in one parallel region, with X
 * quantized once. Each a[m].Y is the same bits as ak_matmul_packed of that
 * product alone (a row's arithmetic does not depend on the work item it
 * falls in). Returns 0, or -1 with err set (AK_ERR_INVALID, nothing
 * written) for n out of range, products that differ in wtype, cols, X or
 * ntok, or a matrix without packed kernels. */
int ak_matmul_packed_n(ak_threads *pool, int n, const ak_matmul_args *a, ak_error *err) {
    if (n < 1 || n > AK_MATMUL_PACKED_MAX)
        return ak_failc(err, AK_ERR_INVALID, "%d matrices in one packed product (1..%d)", n, AK_MATMUL_PACKED_MAX);
    const uint32_t wtype = a[0].wtype;
    const int64_t cols = a[0].cols, ntok = a[0].ntok;
    const float *X = a[0].X;
    for (int m = 1; m < n; m++)
        if (a[m].wtype != wtype || a[m].cols != cols || a[m].X != X || a[m].ntok != ntok)
            return ak_failc(err, AK_ERR_INVALID, "packed product %d differs from the first in its type, width or "
                            "activations", m);
    if (ntok <= 0) return 0;
    for (int m = 0; m < n; m++)
        if (a[m].rows > 0 && !ak_packed_bytes(wtype, a[m].rows, cols))
            return ak_failc(err, AK_ERR_INVALID, "no packed kernels for %s weights of %lld x %lld in this build (%s)",
                            gguf_tensor_type_name(wtype), (long long)a[m].rows, (long long)cols, ak_simd_name());
#if defined(AK_PACKED)
    int nth = ak_threads_size(pool);
    pk_job j = {0};
    j.wtype = wtype; j.cols = cols; j.ntok = ntok; j.X = X;
    j.gb = is_k(wtype) ? ak_packed_k_group_bytes(wtype, cols) : group_bytes(wtype, cols);
    for (int m = 0; m < n; m++) {
        if (a[m].rows <= 0) continue;   /* nothing to compute, as ak_matmul_packed */
        j.P[j.nm] = a[m].W; j.rows[j.nm] = a[m].rows; j.Y[j.nm] = a[m].Y;
        j.ng += (a[m].rows + GROUP - 1) / GROUP;
        j.gend[j.nm++] = j.ng;
    }
    if (!j.nm) return 0;
    /* groups per item: even, as float tiles take them in pairs; K tiles four */
    const int64_t round = is_k(wtype) ? 4 : 2;
    ak_mm_items_init(&j.items, j.ng, ntok, TOKEN_CHUNK, nth, round);
    if (is_float(wtype)) {
        ak_threads_run(pool, pk_task, &j);
        return 0;
    }
#if defined(AK_PACKED_Q)
    j.xps = is_k(wtype) ? ak_packed_k_xk_bytes(cols) : xp_row_bytes(cols);
    size_t need = j.xps * (size_t)ntok;
    uint8_t *owned = NULL;
    /* the pool's scratch is heap memory: where it fails a malloc would too */
    if (pool) j.xp = ak_threads_scratch(pool, need);
    else j.xp = owned = aligned_alloc(64, need);
    if (!j.xp) {
        /* Out of memory: one token at a time through the stack (it holds
         * one token of any matrix ak_packed_bytes agreed to pack). */
        _Alignas(64) uint8_t one[AK_PACKED_STACK];
        for (int64_t t = 0; t < ntok; t++) {
            pk_job k = j;
            k.X = X + t * cols; k.ntok = 1; k.xp = one;
            for (int m = 0; m < k.nm; m++) k.Y[m] = j.Y[m] + t * j.rows[m];
            ak_mm_items_init(&k.items, k.ng, 1, 1, 1, round);
            pk_quantize_task(&k, 0, 1);
            pk_task(&k, 0, 1);
        }
        return 0;
    }
    if (ntok >= 2 * nth) ak_threads_run(pool, pk_quantize_task, &j);
    else pk_quantize_task(&j, 0, 1);
    ak_threads_run(pool, pk_task, &j);
    free(owned);
#endif
#else
    (void)pool;
#endif
    return 0;
}
