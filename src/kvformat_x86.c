/* kvformat_x86.c - AVX-512 and AVX2 dot/axpy for the KV formats (see
 * kvformat_impl.h; the layouts are specified at the top of kvformat.c).
 *
 * Shape of every product. Vectors go four at a time ("rows"), so each chunk
 * of the query (dot) or of the accumulator (axpy) is loaded once per four
 * vectors and the four dot products reduce together; the n % 4 left over go
 * one at a time. Within a vector, chunks of W = 16 (AVX-512) or 8 (AVX2)
 * values; the last chunk of a d that W does not divide is masked.
 *
 * Decoding a chunk of b-bit codes: W codes are 2b (AVX-512) or b (AVX2)
 * bytes, loaded as one integer and broadcast; each 32-bit lane then shifts
 * its code to the bottom (one vpmultishiftqb with VBMI, else a byte shuffle
 * and a variable shift; vpsrlvd on AVX2). A permute (vpermps) indexed by the
 * low 4 (AVX2: 3) bits of each lane turns codes into floats in one
 * instruction: the table is the codebook for tq formats, and for q4/q2 the
 * group's levels m + s*{0..15} built with one FMA per group. Bits of the next
 * code above a 2- or 3-bit code land in the index too, so tables of fewer
 * than 16 (8) entries are repeated to fill the permute.
 *
 * Per-vector factors stay out of the inner loop: tq's N/sqrt(d) multiplies
 * the finished dot product (axpy: the weight); group scales and mins are
 * converted from f16 once per vector into a small float array, from which
 * the loop broadcasts with plain loads.
 */
#include "kvformat_impl.h"

#if defined(AK_KVF_AVX512) || defined(AK_KVF_AVX2)
#include <immintrin.h>

#define AK_INLINE static inline __attribute__((always_inline))
#define MAXMETA (2 * AK_KVF_MAX_D / AK_KVF_Q2_G)   /* f16 metadata values in one vector, at most */

static inline uint64_t ld64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline uint32_t ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Per-format constants; f is a compile-time constant wherever these run. */
AK_INLINE int f_bits(int f) {
    return f == AK_KV_Q8 ? 8 : (f == AK_KV_Q4 || f == AK_KV_TQ4) ? 4 : f == AK_KV_TQ3 ? 3 : 2;
}
AK_INLINE int f_group(int f) { return f == AK_KV_Q8 || f == AK_KV_Q4 ? 32 : f == AK_KV_Q2 ? 16 : 0; }
AK_INLINE int f_tq(int f) { return f == AK_KV_TQ4 || f == AK_KV_TQ3 || f == AK_KV_TQ2; }
AK_INLINE int f_affine(int f) { return f == AK_KV_Q4 || f == AK_KV_Q2; }
AK_INLINE const float *f_cb(int f) { return f == AK_KV_TQ4 ? ak_kvf_lm4 : f == AK_KV_TQ3 ? ak_kvf_lm3 : ak_kvf_lm2; }
/* Where the code stream ends (the metadata starts). */
AK_INLINE size_t f_code_bytes(int f, int d) { return ak_kvf_code_bytes(d, f_bits(f)); }
AK_INLINE float tq_factor(int f, const uint8_t *v, int d) {
    return ak_kvf_tq_factor(ak_kvf_rd16(v + f_code_bytes(f, d)), d);
}
static int valid_d(int d) { return d >= 2 && d <= AK_KVF_MAX_D && d % 2 == 0; }

#if defined(AK_KVF_AVX512)
/* ======================================================================== */
/* AVX-512                                                                  */
/* ======================================================================== */

const char ak_kvf_simd_name[] = "avx512";

AK_INLINE __mmask16 lanes(int n) { return (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1); }

/* Lane i of the result holds code i of w in its low b bits (junk above). */
#define QW(b, m) (((long long)((b) * (2 * (m) + 1)) << 32) | (long long)((b) * 2 * (m)))
AK_INLINE __m512i spread(__m512i w, int b) {
#if defined(__AVX512VBMI__)
    /* byte 0 of lane i = the 8 bits of its qword starting at bit b*i */
    const __m512i ctl = _mm512_set_epi64(QW(b, 7), QW(b, 6), QW(b, 5), QW(b, 4), QW(b, 3), QW(b, 2), QW(b, 1),
                                         QW(b, 0));
    return _mm512_multishift_epi64_epi8(ctl, w);
#else
    /* bytes (b*i)/8 and the next to the bottom of lane i, then shift */
#define SB(b, i) ((int)(0x80800000u | ((((b) * (i)) / 8 + 1) << 8) | (((b) * (i)) / 8)))
#define SH(b, i) (((b) * (i)) % 8)
    const __m512i shuf = _mm512_set_epi32(SB(b, 15), SB(b, 14), SB(b, 13), SB(b, 12), SB(b, 11), SB(b, 10),
                                          SB(b, 9), SB(b, 8), SB(b, 7), SB(b, 6), SB(b, 5), SB(b, 4), SB(b, 3),
                                          SB(b, 2), SB(b, 1), SB(b, 0));
    const __m512i sh = _mm512_set_epi32(SH(b, 15), SH(b, 14), SH(b, 13), SH(b, 12), SH(b, 11), SH(b, 10), SH(b, 9),
                                        SH(b, 8), SH(b, 7), SH(b, 6), SH(b, 5), SH(b, 4), SH(b, 3), SH(b, 2),
                                        SH(b, 1), SH(b, 0));
    return _mm512_srlv_epi32(_mm512_shuffle_epi8(w, shuf), sh);
#undef SB
#undef SH
#endif
}
#undef QW

/* The 16 codes of the chunk at p broadcast to every qword; n < 16 codes are
 * loaded masked (a short last chunk may end the vector). A whole 3-bit chunk
 * is 6 bytes read as 8: the code stream is followed by N, so the 2 extra
 * bytes are still the vector's. */
AK_INLINE __m512i load_codes(const uint8_t *p, int b, int n) {
    if (n == 16) return b == 2 ? _mm512_set1_epi32((int)ld32(p)) : _mm512_set1_epi64((long long)ld64(p));
    int nb = (b * n + 7) / 8;
    return _mm512_broadcastq_epi64(_mm_maskz_loadu_epi8((__mmask16)((1u << nb) - 1), p));
}

/* The 16-entry permute table of a format: the codebook (repeated) for tq,
 * the codes 0..2^b-1 (repeated) for q4/q2, from which each group's levels
 * are one FMA away. */
AK_INLINE __m512 base_table(int f) {
    if (f_tq(f)) {
        const float *c = f_cb(f);
        int m = (1 << f_bits(f)) - 1;
        return _mm512_setr_ps(c[0 & m], c[1 & m], c[2 & m], c[3 & m], c[4 & m], c[5 & m], c[6 & m], c[7 & m],
                              c[8 & m], c[9 & m], c[10 & m], c[11 & m], c[12 & m], c[13 & m], c[14 & m], c[15 & m]);
    }
    if (f == AK_KV_Q4) return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
}

/* Values k .. k+n-1 (n <= 16, k a multiple of 16) of vector v as floats,
 * before group scales (q8) and per-vector factors (tq); q4/q2 get their
 * levels from tab. Lanes past n are finite (zero bytes decoded). */
AK_INLINE __m512 decode(int f, const uint8_t *v, int k, int n, __m512 tab) {
    __mmask16 m = lanes(n);
    switch (f) {
    case AK_KV_F32: return n == 16 ? _mm512_loadu_ps(v + 4 * k) : _mm512_maskz_loadu_ps(m, v + 4 * k);
    case AK_KV_F16:
    case AK_KV_BF16: {
        __m256i h = n == 16 ? _mm256_loadu_si256((const __m256i *)(v + 2 * k)) : _mm256_maskz_loadu_epi16(m, v + 2 * k);
        if (f == AK_KV_F16) return _mm512_cvtph_ps(h);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case AK_KV_Q8: {
        __m128i c = n == 16 ? _mm_loadu_si128((const __m128i *)(v + k)) : _mm_maskz_loadu_epi8(m, v + k);
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c));
    }
    default: {
        int b = f_bits(f);
        return _mm512_permutexvar_ps(spread(load_codes(v + (size_t)k * b / 8, b, n), b), tab);
    }
    }
}

/* out[0..cnt) = mul * the cnt f16 values at p. */
AK_INLINE void load_meta(const uint8_t *p, int cnt, float *out, float mul) {
    __m512 s = _mm512_set1_ps(mul);
    for (int i = 0; i < cnt; i += 16) {
        __m256i h = _mm256_maskz_loadu_epi16(lanes(cnt - i), p + 2 * i);
        _mm512_store_ps(out + i, _mm512_mul_ps(_mm512_cvtph_ps(h), s));
    }
}

AK_INLINE int meta_count(int f, int d) {
    int G = f_group(f);
    return G ? ak_kvf_ngroups(d, G) * (f == AK_KV_Q8 ? 1 : 2) : 0;
}

/* Sums of four vectors' lanes: {sum a, sum b, sum c, sum d}. */
AK_INLINE __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xee));
    __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4e));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0xb1));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s));
}

/* out[r] = <q, vector r> for R (1 or 4) vectors at v, stride apart. */
AK_INLINE void dot_rows(const int f, const int R, const uint8_t *v0, size_t stride, const float *q, int d, float *out) {
    const int G = f_group(f), step = G ? G : 16;
    const uint8_t *v[4];
    float meta[4][MAXMETA] __attribute__((aligned(64)));
    __m512 acc[4], tab = f_tq(f) || f_affine(f) ? base_table(f) : _mm512_setzero_ps();
    for (int r = 0; r < R; r++) {
        v[r] = v0 + (size_t)r * stride;
        acc[r] = _mm512_setzero_ps();
        if (G) load_meta(v[r] + f_code_bytes(f, d), meta_count(f, d), meta[r], 1.0f);
    }
    for (int k0 = 0, g = 0; k0 < d; k0 += step, g++) {
        __m512 gt[4];   /* per group: the q4/q2 levels, or the q8 scale */
        for (int r = 0; r < R; r++) {
            if (f_affine(f))
                gt[r] = _mm512_fmadd_ps(tab, _mm512_set1_ps(meta[r][2 * g]), _mm512_set1_ps(meta[r][2 * g + 1]));
            else if (f == AK_KV_Q8)
                gt[r] = _mm512_set1_ps(meta[r][g]);
        }
        for (int k = k0; k < k0 + step && k < d; k += 16) {
            int n = d - k < 16 ? d - k : 16;
            __m512 qk = n == 16 ? _mm512_loadu_ps(q + k) : _mm512_maskz_loadu_ps(lanes(n), q + k);
            for (int r = 0; r < R; r++) {
                __m512 x = decode(f, v[r], k, n, f_affine(f) ? gt[r] : tab);
                if (f == AK_KV_Q8) x = _mm512_mul_ps(x, gt[r]);
                acc[r] = _mm512_fmadd_ps(x, qk, acc[r]);
            }
        }
    }
    if (R == 4) {
        __m128 s = reduce4(acc[0], acc[1], acc[2], acc[3]);
        if (f_tq(f))
            s = _mm_mul_ps(s, _mm_setr_ps(tq_factor(f, v[0], d), tq_factor(f, v[1], d), tq_factor(f, v[2], d),
                                          tq_factor(f, v[3], d)));
        _mm_storeu_ps(out, s);
    } else
        for (int r = 0; r < R; r++) {
            float s = _mm512_reduce_add_ps(acc[r]);
            out[r] = f_tq(f) ? s * tq_factor(f, v[r], d) : s;
        }
}

/* acc += sum_r w[r] * vector r, for R (1 or 4) vectors at v, stride apart. */
AK_INLINE void axpy_rows(const int f, const int R, const uint8_t *v0, size_t stride, const float *w, int d,
                         float *acc) {
    const int G = f_group(f), step = G ? G : 16;
    const uint8_t *v[4];
    float meta[4][MAXMETA] __attribute__((aligned(64)));
    __m512 wr[4], tab = f_tq(f) || f_affine(f) ? base_table(f) : _mm512_setzero_ps();
    for (int r = 0; r < R; r++) {
        v[r] = v0 + (size_t)r * stride;
        /* weights fold into the scales, mins or tq factor */
        if (G) load_meta(v[r] + f_code_bytes(f, d), meta_count(f, d), meta[r], w[r]);
        wr[r] = _mm512_set1_ps(f_tq(f) ? w[r] * tq_factor(f, v[r], d) : w[r]);
    }
    for (int k0 = 0, g = 0; k0 < d; k0 += step, g++) {
        __m512 gt[4];
        for (int r = 0; r < R; r++) {
            if (f_affine(f))
                gt[r] = _mm512_fmadd_ps(tab, _mm512_set1_ps(meta[r][2 * g]), _mm512_set1_ps(meta[r][2 * g + 1]));
            else if (f == AK_KV_Q8)
                gt[r] = _mm512_set1_ps(meta[r][g]);
        }
        for (int k = k0; k < k0 + step && k < d; k += 16) {
            int n = d - k < 16 ? d - k : 16;
            __m512 a = n == 16 ? _mm512_loadu_ps(acc + k) : _mm512_maskz_loadu_ps(lanes(n), acc + k);
            for (int r = 0; r < R; r++) {
                __m512 x = decode(f, v[r], k, n, f_affine(f) ? gt[r] : tab);
                if (f_affine(f)) a = _mm512_add_ps(a, x);
                else a = _mm512_fmadd_ps(x, f == AK_KV_Q8 ? gt[r] : wr[r], a);
            }
            if (n == 16) _mm512_storeu_ps(acc + k, a);
            else _mm512_mask_storeu_ps(acc + k, lanes(n), a);
        }
    }
}

#else
/* ======================================================================== */
/* AVX2                                                                     */
/* ======================================================================== */

const char ak_kvf_simd_name[] = "avx2";

AK_INLINE __m256i lanes(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The first n (< 8) values of a short last chunk, copied out so that no
 * load passes the vector's end. */
AK_INLINE __m128i load_short(const uint8_t *p, int nbytes) {
    uint8_t t[16] = { 0 };
    memcpy(t, p, (size_t)nbytes);
    return _mm_loadu_si128((const __m128i *)t);
}

/* Lane i holds code i of the 8 codes at p in its low b bits (junk above).
 * A whole 3-bit chunk is 3 bytes read as 4: N follows the code stream. */
AK_INLINE __m256i load_codes(const uint8_t *p, int b, int n) {
    uint32_t w;
    if (n == 8) w = b == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : ld32(p);
    else w = (uint32_t)_mm_cvtsi128_si32(load_short(p, (b * n + 7) / 8));
    __m256i sh = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b);
    return _mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh);
}

/* Tables of a format for 8-entry permutes: tq4 needs two (codes 0-7, 8-15). */
AK_INLINE __m256 table_lo(int f) {
    if (f_tq(f)) {
        const float *c = f_cb(f);
        int m = (1 << f_bits(f)) - 1;
        return _mm256_setr_ps(c[0 & m], c[1 & m], c[2 & m], c[3 & m], c[4 & m], c[5 & m], c[6 & m], c[7 & m]);
    }
    return _mm256_setr_ps(0, 1, 2, 3, 0, 1, 2, 3);   /* q2 codes */
}
AK_INLINE __m256 table_hi(int f) { return f == AK_KV_TQ4 ? _mm256_loadu_ps(ak_kvf_lm4 + 8) : _mm256_setzero_ps(); }

/* Values k .. k+n-1 (n <= 8, k a multiple of 8) as floats, before q8 scales
 * and tq factors; q2 takes its levels from lo, q4 its scale and min from
 * (lo, hi) broadcasts. */
AK_INLINE __m256 decode(int f, const uint8_t *v, int k, int n, __m256 lo, __m256 hi) {
    switch (f) {
    case AK_KV_F32:
        return n == 8 ? _mm256_loadu_ps((const float *)(v + 4 * k)) : _mm256_maskload_ps((const float *)(v + 4 * k), lanes(n));
    case AK_KV_F16:
    case AK_KV_BF16: {
        __m128i h = n == 8 ? _mm_loadu_si128((const __m128i *)(v + 2 * k)) : load_short(v + 2 * k, 2 * n);
        if (f == AK_KV_F16) return _mm256_cvtph_ps(h);
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case AK_KV_Q8: {
        __m128i c = n == 8 ? _mm_loadl_epi64((const __m128i *)(v + k)) : load_short(v + k, n);
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c));
    }
    case AK_KV_Q4: {
        __m256i c = _mm256_and_si256(load_codes(v + (size_t)k / 2, 4, n), _mm256_set1_epi32(15));
        return _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), lo, hi);
    }
    case AK_KV_TQ4: {
        __m256i c = load_codes(v + (size_t)k / 2, 4, n);
        __m256 a = _mm256_permutevar8x32_ps(lo, c), b = _mm256_permutevar8x32_ps(hi, c);
        return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(c, 28)));   /* code bit 3 */
    }
    default: {
        int b = f_bits(f);
        return _mm256_permutevar8x32_ps(lo, load_codes(v + (size_t)k * b / 8, b, n));
    }
    }
}

AK_INLINE void load_meta(const uint8_t *p, int cnt, float *out, float mul) {
    int i = 0;
    for (; i + 8 <= cnt; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i))),
                                                _mm256_set1_ps(mul)));
    for (; i < cnt; i++) out[i] = _cvtsh_ss(ak_kvf_rd16(p + 2 * i)) * mul;
}

AK_INLINE int meta_count(int f, int d) {
    int G = f_group(f);
    return G ? ak_kvf_ngroups(d, G) * (f == AK_KV_Q8 ? 1 : 2) : 0;
}

AK_INLINE __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}
AK_INLINE float reduce1(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(_mm_hadd_ps(s, s));
}

/* Per-group decode parameters (lo, hi) of vector r at group g. */
AK_INLINE void group_params(int f, const float *meta, int g, __m256 *lo, __m256 *hi) {
    if (f == AK_KV_Q2) *lo = _mm256_fmadd_ps(table_lo(f), _mm256_set1_ps(meta[2 * g]), _mm256_set1_ps(meta[2 * g + 1]));
    if (f == AK_KV_Q4) {
        *lo = _mm256_set1_ps(meta[2 * g]);
        *hi = _mm256_set1_ps(meta[2 * g + 1]);
    }
    if (f == AK_KV_Q8) *lo = _mm256_set1_ps(meta[g]);
}

AK_INLINE void dot_rows(const int f, const int R, const uint8_t *v0, size_t stride, const float *q, int d, float *out) {
    const int G = f_group(f), step = G ? G : 8;
    const uint8_t *v[4];
    float meta[4][MAXMETA];
    __m256 acc[4], lo[4], hi[4];
    for (int r = 0; r < R; r++) {
        v[r] = v0 + (size_t)r * stride;
        acc[r] = _mm256_setzero_ps();
        lo[r] = table_lo(f);
        hi[r] = table_hi(f);
        if (G) load_meta(v[r] + f_code_bytes(f, d), meta_count(f, d), meta[r], 1.0f);
    }
    for (int k0 = 0, g = 0; k0 < d; k0 += step, g++) {
        if (G)
            for (int r = 0; r < R; r++) group_params(f, meta[r], g, &lo[r], &hi[r]);
        for (int k = k0; k < k0 + step && k < d; k += 8) {
            int n = d - k < 8 ? d - k : 8;
            __m256 qk = n == 8 ? _mm256_loadu_ps(q + k) : _mm256_maskload_ps(q + k, lanes(n));
            for (int r = 0; r < R; r++) {
                __m256 x = decode(f, v[r], k, n, lo[r], hi[r]);
                if (f == AK_KV_Q8) x = _mm256_mul_ps(x, lo[r]);
                acc[r] = _mm256_fmadd_ps(x, qk, acc[r]);
            }
        }
    }
    if (R == 4) {
        __m128 s = reduce4(acc[0], acc[1], acc[2], acc[3]);
        if (f_tq(f))
            s = _mm_mul_ps(s, _mm_setr_ps(tq_factor(f, v[0], d), tq_factor(f, v[1], d), tq_factor(f, v[2], d),
                                          tq_factor(f, v[3], d)));
        _mm_storeu_ps(out, s);
    } else
        for (int r = 0; r < R; r++) {
            float s = reduce1(acc[r]);
            out[r] = f_tq(f) ? s * tq_factor(f, v[r], d) : s;
        }
}

AK_INLINE void axpy_rows(const int f, const int R, const uint8_t *v0, size_t stride, const float *w, int d,
                         float *acc) {
    const int G = f_group(f), step = G ? G : 8;
    const uint8_t *v[4];
    float meta[4][MAXMETA];
    __m256 wr[4], lo[4], hi[4];
    for (int r = 0; r < R; r++) {
        v[r] = v0 + (size_t)r * stride;
        lo[r] = table_lo(f);
        hi[r] = table_hi(f);
        if (G) load_meta(v[r] + f_code_bytes(f, d), meta_count(f, d), meta[r], w[r]);
        wr[r] = _mm256_set1_ps(f_tq(f) ? w[r] * tq_factor(f, v[r], d) : w[r]);
    }
    for (int k0 = 0, g = 0; k0 < d; k0 += step, g++) {
        if (G)
            for (int r = 0; r < R; r++) group_params(f, meta[r], g, &lo[r], &hi[r]);
        for (int k = k0; k < k0 + step && k < d; k += 8) {
            int n = d - k < 8 ? d - k : 8;
            __m256 a = n == 8 ? _mm256_loadu_ps(acc + k) : _mm256_maskload_ps(acc + k, lanes(n));
            for (int r = 0; r < R; r++) {
                __m256 x = decode(f, v[r], k, n, lo[r], hi[r]);
                if (f_affine(f)) a = _mm256_add_ps(a, x);
                else a = _mm256_fmadd_ps(x, f == AK_KV_Q8 ? lo[r] : wr[r], a);
            }
            if (n == 8) _mm256_storeu_ps(acc + k, a);
            else _mm256_maskstore_ps(acc + k, lanes(n), a);
        }
    }
}
#endif

/* ======================================================================== */
/* Entry points (both back ends)                                            */
/* ======================================================================== */

AK_INLINE void dot_impl(const int f, const void *src, size_t stride, int n, const float *q, int d, float *out) {
    if (!valid_d(d)) return;
    const uint8_t *p = src;
    int j = 0;
    for (; j + 4 <= n; j += 4) dot_rows(f, 4, p + (size_t)j * stride, stride, q, d, out + j);
    for (; j < n; j++) dot_rows(f, 1, p + (size_t)j * stride, stride, q, d, out + j);
}

AK_INLINE void axpy_impl(const int f, const void *src, size_t stride, int n, const float *w, int d, float *acc) {
    if (!valid_d(d)) return;
    const uint8_t *p = src;
    int j = 0;
    for (; j + 4 <= n; j += 4) axpy_rows(f, 4, p + (size_t)j * stride, stride, w + j, d, acc);
    for (; j < n; j++) axpy_rows(f, 1, p + (size_t)j * stride, stride, w + j, d, acc);
}

#define ENTRY(F, ID)                                                                                    \
    void ak_kvf_simd_dot_##F(const void *src, size_t stride, int n, const float *q, int d, float *out) { \
        dot_impl(ID, src, stride, n, q, d, out);                                                        \
    }                                                                                                   \
    void ak_kvf_simd_axpy_##F(const void *src, size_t stride, int n, const float *w, int d, float *acc) { \
        axpy_impl(ID, src, stride, n, w, d, acc);                                                       \
    }
ENTRY(f32, AK_KV_F32)
ENTRY(f16, AK_KV_F16)
ENTRY(bf16, AK_KV_BF16)
ENTRY(q8, AK_KV_Q8)
ENTRY(q4, AK_KV_Q4)
ENTRY(q2, AK_KV_Q2)
ENTRY(tq4, AK_KV_TQ4)
ENTRY(tq3, AK_KV_TQ3)
ENTRY(tq2, AK_KV_TQ2)
#undef ENTRY

#endif
