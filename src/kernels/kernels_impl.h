/* kernels_impl.h - code shared by the SIMD back ends and the threaded
 * drivers of the kernels, on top of their interface (kernels_backend.h):
 * the SIMD activation quantizers every x86 layout starts from, the work
 * items of a threaded product (kernels.c, kernels_packed.c) and the tile
 * instantiation macros of the row-major SIMD back ends. Not part of the
 * public API.
 */
#ifndef AK_KERNELS_IMPL_H
#define AK_KERNELS_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include <string.h>

#include "base/gguf.h"
#include "kernels/kernels.h"
#include "kernels/kernels_backend.h"

#if defined(AK_SIMD_AVX512)
#include <immintrin.h>

/* One block of 32 activations to 8 bits, the XQ contract (d = amax / 127,
 * q = round-half-even(x / d)): quants of elements 0..15 in *lo and 16..31
 * in *hi, their sum in *sum; returns d. Every AVX-512 layout starts here. */
static inline float ak_quantize_block_avx512(const float *x, __m128i *lo, __m128i *hi, int *sum) {
    __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));   /* half-even */
    __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
    *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    *lo = _mm512_cvtepi32_epi8(q0);
    *hi = _mm512_cvtepi32_epi8(q1);
    return d;
}
#endif

#if defined(AK_SIMD_AVX2) || defined(AK_SIMD_AVX512)
#include <immintrin.h>

/* AVX2's twin of ak_quantize_block_avx512, the same contract and bits
 * (d = amax / 127, q = round-half-even(x / d)): the 32 quants in order in
 * *q, their sum in *sum; returns d. The 32-byte packed layouts start here
 * (AVX2, and AVX-512 without VNNI). */
static inline float ak_quantize_block_avx2(const float *x, __m256i *q, int *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], a = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        a = _mm256_max_ps(a, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    float d = _mm_cvtss_f32(m) / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    __m256i qi[4];
    for (int i = 0; i < 4; i++) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));   /* half-even */
    __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    *sum = _mm_cvtsi128_si32(s);
    /* packs work within 128-bit lanes; the permute restores the order */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    *q = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    return d;
}
#endif

#if defined(AK_SIMD_AVX512) && defined(__AVX512VNNI__)
/* acc + the u8 x s8 products of w with 4 activation bytes at p broadcast to
 * every lane (vpdpbusd). GCC does not fold the broadcast into the
 * instruction (it emits a separate vpbroadcastd, doubling the instructions
 * of the packed kernels' inner loops), so it is written out where the
 * compiler takes GNU assembly. */
typedef struct { int8_t b[4]; } ak_four_bytes;
static inline __attribute__((always_inline)) __m512i ak_dpbusd_bcast(__m512i acc, __m512i w, const void *p) {
#if defined(__GNUC__)
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const ak_four_bytes *)p));
    return acc;
#else
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(v));
#endif
}
#endif

/* ---- Work items of a threaded product, shared by the drivers ----
 * A product is cut into (token chunk x unit chunk) items that threads claim
 * atomically. Units are rows (kernels.c) or 16-row groups (kernels_packed.c).
 * With several token chunks (prefill) every thread claims from one counter,
 * token chunk outermost, so that the threads share one chunk of activations
 * that stays in cache while weights stream past. With one (decode, batched
 * decode) the items are split into one contiguous range per thread: each
 * thread then reads one long stretch of the weights, which the prefetchers
 * (hardware, and the kernels' own far ahead) can follow, where items dealt
 * out in turn cut every thread's stream into pieces a prefetch distance
 * long. A thread that finishes its range takes what is left of the others'
 * (the machine is shared; a thread may be descheduled). */
#define AK_MM_RANGES 16
typedef struct {
    int64_t units, ntok;
    int64_t uchunk, tchunk, nuc, ntc;
    int nranges;                          /* 1, or one per thread (at most AK_MM_RANGES) */
    int64_t end[AK_MM_RANGES];            /* range r: items [end[r - 1], end[r]) */
    atomic_llong next[AK_MM_RANGES];      /* next item of range r */
} ak_mm_items;

/* Enough items per thread to balance (8), each unit chunk a multiple of
 * `round` units; tchunk tokens per item when there is more than one token
 * (decode: the single token is one chunk). */
static inline void ak_mm_items_init(ak_mm_items *w, int64_t units, int64_t ntok, int64_t tchunk, int nth,
                                    int64_t round) {
    w->units = units;
    w->ntok = ntok;
    w->tchunk = ntok > 1 ? (tchunk < ntok ? tchunk : ntok) : 1;
    w->ntc = (ntok + w->tchunk - 1) / w->tchunk;
    int64_t want = nth > 1 ? (int64_t)nth * 8 / w->ntc : 1;   /* unit chunks per token chunk */
    if (want < 1) want = 1;
    w->uchunk = (units + want - 1) / want;
    w->uchunk = (w->uchunk + round - 1) / round * round;
    w->nuc = (units + w->uchunk - 1) / w->uchunk;
    int64_t items = w->nuc * w->ntc;
    w->nranges = w->ntc == 1 && nth > 1 ? (nth < AK_MM_RANGES ? nth : AK_MM_RANGES) : 1;
    if (w->nranges > items) w->nranges = (int)items > 0 ? (int)items : 1;
    for (int r = 0; r < w->nranges; r++) {
        atomic_init(&w->next[r], r * items / w->nranges);
        w->end[r] = (r + 1) * items / w->nranges;
    }
}

/* Claims the next item for thread ith: units [u0, u1) of tokens [t0, t1),
 * from the thread's own range first. Returns 0 when none is left. Safe from
 * any number of threads. */
static inline int ak_mm_items_next(ak_mm_items *w, int ith, int64_t *u0, int64_t *u1, int64_t *t0, int64_t *t1) {
    int64_t i = -1;
    for (int k = 0; k < w->nranges && i < 0; k++) {
        int r = (ith + k) % w->nranges;
        if (atomic_load_explicit(&w->next[r], memory_order_relaxed) >= w->end[r]) continue;
        int64_t c = atomic_fetch_add_explicit(&w->next[r], 1, memory_order_relaxed);
        if (c < w->end[r]) i = c;
    }
    if (i < 0) return 0;
    int64_t tc = i / w->nuc, uc = i % w->nuc;
    *u0 = uc * w->uchunk;
    *u1 = *u0 + w->uchunk < w->units ? *u0 + w->uchunk : w->units;
    *t0 = tc * w->tchunk;
    *t1 = *t0 + w->tchunk < w->ntok ? *t0 + w->tchunk : w->ntok;
    return 1;
}

/* ---- Tile instantiation, shared by the SIMD back ends ----
 * A back end writes its tile loops once as always-inline functions taking the
 * tile size (R rows x T tokens, at most MAXR x MAXT) as constants; these
 * macros stamp out one function per (type selector, R, T) and a table, so
 * remainders run the same code with a smaller tile. */
#define MAXR 4
#define MAXT 4

/* The operands of one R x T tile of a row-major product: the R rows at W
 * (wrb bytes apart); for a quantized tile the T tokens' XQ rows at xq (xqs
 * bytes apart) of nb blocks, for a float one their f32 rows at X (ldx
 * floats apart) of cols columns; outputs Y[t * ldy + r]. */
typedef struct {
    const uint8_t *W;
    size_t wrb;
    const uint8_t *xq;
    size_t xqs;
    int64_t nb;
    const float *X;
    int64_t ldx, cols;
    float *Y;
    int64_t ldy;
} ak_mm_tile;
typedef void (*ak_mm_tile_fn)(const ak_mm_tile *a);

/* INST_R instantiates NAME##_Q_R_T(a) = BODY(Q, R, T, a) for one Q (a type
 * selector) and R and T in 1..4; ROW_R(NAME, Q) is the initializer of their
 * table [R - 1][T - 1]. */
#define INST_T(NAME, BODY, Q, R)                                                           \
    INST_ONE(NAME, BODY, Q, R, 1) INST_ONE(NAME, BODY, Q, R, 2)                            \
    INST_ONE(NAME, BODY, Q, R, 3) INST_ONE(NAME, BODY, Q, R, 4)
#define INST_R(NAME, BODY, Q)                                                              \
    INST_T(NAME, BODY, Q, 1) INST_T(NAME, BODY, Q, 2)                                      \
    INST_T(NAME, BODY, Q, 3) INST_T(NAME, BODY, Q, 4)
#define ROW_T(NAME, Q, R) { NAME##_##Q##_##R##_1, NAME##_##Q##_##R##_2, NAME##_##Q##_##R##_3, NAME##_##Q##_##R##_4 }
#define ROW_R(NAME, Q) { ROW_T(NAME, Q, 1), ROW_T(NAME, Q, 2), ROW_T(NAME, Q, 3), ROW_T(NAME, Q, 4) }

#define INST_ONE(NAME, BODY, Q, R, T)                                                      \
    static void NAME##_##Q##_##R##_##T(const ak_mm_tile *a) { BODY(Q, R, T, a); }

/* The rectangle a (a back end's mm_q or mm_f) in tiles of at most tr rows x
 * tt tokens (tr <= MAXR, tt <= MAXT), tile (R, T) run by tiles[R - 1][T - 1]:
 * quantized tiles (q) read the tokens' XQ rows, float ones their f32 rows. */
static inline void ak_mm_tiles(const ak_mm_args *a, const ak_mm_tile_fn tiles[MAXR][MAXT], int tr, int tt, int q) {
    for (int64_t r = a->r0; r < a->r1; r += tr) {
        const int R = (int)ak_min64(tr, a->r1 - r);
        for (int64_t t = a->t0; t < a->t1; t += tt) {
            const int T = (int)ak_min64(tt, a->t1 - t);
            ak_mm_tile m = { .W = a->W + (size_t)r * a->wrb, .wrb = a->wrb, .Y = a->Y + t * a->ldy + r, .ldy = a->ldy };
            if (q) {
                m.xq = a->xq + (size_t)t * a->xqs;
                m.xqs = a->xqs;
                m.nb = a->cols / AK_QK;
            } else {
                m.X = a->X + t * a->cols;
                m.ldx = m.cols = a->cols;
            }
            tiles[R - 1][T - 1](&m);
        }
    }
}

/* ---- Packed tiles, shared by the packed layouts' back ends ----
 * The operands of one tile of a packed product (kernels_packed.c's R16
 * layout, kernels_packed_k.c's K16; x86 and NEON): groups of 16 rows from
 * grp, gb bytes apart, of nb records each (blocks of 32 columns, or K
 * super-blocks) and cols columns, times the tile's tokens. Quantized
 * weights read the tokens' activation rows (token 0's at xq, xqs bytes
 * apart), float weights their f32 rows (X, ldx floats apart). Outputs
 * Y[t * ldy + 16 g + r] for the rows 16 g + r < nvalid: the rest are a last
 * group's padding, never stored. */
typedef struct {
    const uint8_t *grp;
    size_t gb;
    int64_t nb, cols;
    const uint8_t *xq;
    size_t xqs;
    const float *X;
    int64_t ldx;
    float *Y;
    int64_t ldy, nvalid;
    int half;       /* the AVX2 R16 tiles of half a group: which half (rows 8 half .. 8 half + 7) */
    int prefetch;   /* the tiles that ask: whether to prefetch (the first pass over a group) */
} ak_pk_tile;
typedef void (*ak_pk_tile_fn)(const ak_pk_tile *a);

/* Float weight selector used by the f tiles: 0 = F32, 1 = F16, 2 = BF16. */
static inline int ak_ftype_index(uint32_t wtype) {
    return wtype == GGML_TYPE_F16 ? 1 : wtype == GGML_TYPE_BF16 ? 2 : 0;
}

#endif
