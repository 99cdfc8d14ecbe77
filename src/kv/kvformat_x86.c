/* kvformat_x86.c - AVX-512 and AVX2 dot/axpy for the KV formats (see
 * kvformat_impl.h; the layouts are specified at the top of kvformat.c).
 *
 * Shape of every product. Vectors go four at a time ("rows"): each chunk of
 * the query (dot) or of the accumulator (axpy) is loaded once per four
 * vectors, and four dot products reduce together; the n % 4 left over go one
 * at a time. Within a vector, chunks of W = 16 (AVX-512) or 8 (AVX2) values.
 *
 * Decoding W b-bit codes (2b or b bytes): load them as one integer, put each
 * code at the bottom of its own 32-bit lane, then one permute (vpermps)
 * indexed by the low 4 (AVX2: 3) bits of each lane turns codes into floats:
 * the table is the codebook for tq formats, and for q4/q2 the group's levels
 * m + s*{0..15} (one FMA per group). Bits of the next code sit above a 2- or
 * 3-bit code, so tables of fewer entries are repeated to fill the permute.
 *
 * Putting codes in lanes. AVX2: broadcast, then a variable shift. AVX-512
 * (on Zen 5 the permutes and FMAs share two pipes, shifts have their own, so
 * spreading codes with shifts rather than shuffles is what pays):
 *   4 and 2 bits: lane 2m takes the 32 bits at the chunk's start, lane 2m+1
 *     the 32 bits holding code 8 on, both shift right by b*m: lane 2m holds
 *     code m, lane 2m+1 code m+8 ("lane order P"). The query or accumulator
 *     is put in order P once per call (d/16 permutes) instead of permuting
 *     codes once per chunk of every vector.
 *   3 bits: code 8 starts at byte 3, which one qword broadcast cannot hand to
 *     the odd lanes without a blend; one vpmultishiftqb (VBMI) does it
 *     faster, in natural order. Without VBMI: a byte shuffle and a shift.
 *
 * Per-vector factors stay out of the inner loop: tq's N/sqrt(d) multiplies
 * the finished dot product (axpy: the weight). Group scales and mins are
 * converted from f16 once per vector, for a block of 16 vectors at a time,
 * into a small float array from which the loop broadcasts with plain loads;
 * q8's scale applies once per group, to the group's partial sum.
 */
#include "kv/kvformat_impl.h"

#if defined(AK_KVF_AVX512) || defined(AK_KVF_AVX2)
#include <immintrin.h>

#define AK_INLINE static inline __attribute__((always_inline))
#define MAXMETA (2 * AK_KVF_MAX_D / AK_KVF_Q2_G)   /* f16 metadata values in one vector, at most */
#define BLOCK 16                                   /* vectors whose metadata is converted together */

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

/* Keeps a value in a register: stops the compiler from folding its load
 * into each of the four rows' instructions (four loads instead of one). */
#define PIN(x) __asm__("" : "+v"(x))

/* Per-format constants; f is a compile-time constant wherever these run. */
AK_INLINE int f_bits(int f) {
    return f == AK_KV_Q8 ? 8 : (f == AK_KV_Q4 || f == AK_KV_TQ4) ? 4 : f == AK_KV_TQ3 ? 3 : 2;
}
AK_INLINE int f_group(int f) { return f == AK_KV_Q8 || f == AK_KV_Q4 ? 32 : f == AK_KV_Q2 ? 16 : 0; }
AK_INLINE int f_tq(int f) { return f == AK_KV_TQ4 || f == AK_KV_TQ3 || f == AK_KV_TQ2; }
AK_INLINE int f_affine(int f) { return f == AK_KV_Q4 || f == AK_KV_Q2; }
AK_INLINE int f_packed(int f) { return f_affine(f) || f_tq(f); }   /* b-bit code streams */
AK_INLINE const float *f_cb(int f) { return f == AK_KV_TQ4 ? ak_kvf_lm4 : f == AK_KV_TQ3 ? ak_kvf_lm3 : ak_kvf_lm2; }
AK_INLINE size_t f_code_bytes(int f, int d) { return ak_kvf_code_bytes(d, f_bits(f)); }
AK_INLINE int meta_count(int f, int d) {
    int G = f_group(f);
    return G ? ak_kvf_ngroups(d, G) * (f == AK_KV_Q8 ? 1 : 2) : 0;
}
static int valid_d(int d) { return d >= 2 && d <= AK_KVF_MAX_D && d % 2 == 0; }

/* ak_kvf_tq_factor with F16C, for one vector and for four (m: where each
 * vector's N is). */
AK_INLINE float tq_factor(const uint8_t *m, float sqrt_d) { return _cvtsh_ss(ak_kvf_rd16(m)) / sqrt_d; }
AK_INLINE __m128 tq_factor4(const uint8_t *const *m, float sqrt_d) {
    uint64_t h = (uint64_t)ak_kvf_rd16(m[0]) | (uint64_t)ak_kvf_rd16(m[1]) << 16 | (uint64_t)ak_kvf_rd16(m[2]) << 32 |
                 (uint64_t)ak_kvf_rd16(m[3]) << 48;
    return _mm_div_ps(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)h)), _mm_set1_ps(sqrt_d));
}

/* The 16 floats a format's permutes look codes up in: the codebook
 * (repeated) for tq, the codes 0..2^b-1 (repeated) for q4/q2, from which a
 * group's levels are one FMA away. */
AK_INLINE void base_table(int f, float *t) {
    int m = (1 << f_bits(f)) - 1;
    for (int i = 0; i < 16; i++) t[i] = f_tq(f) ? f_cb(f)[i & m] : (float)(i & m);
}

#if defined(AK_KVF_AVX512)
/* ======================================================================== */
/* AVX-512                                                                  */
/* ======================================================================== */

const char ak_kvf_simd_name[] = "avx512";

typedef __m512 vf;
#define W 16

AK_INLINE __mmask16 lanes(int n) { return (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1); }

/* Formats whose query/accumulator go in lane order P (see the top). */
AK_INLINE int f_porder(int f) { return f_packed(f) && f_bits(f) != 3; }
#define P_IDX _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15)
#define P_INV _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15)

/* Codes of a whole chunk (the 2b bytes at its start in the low bits of
 * bits; a 3-bit chunk's 6 bytes read as 8, from `back` (0 or 2) bytes
 * before it) into lanes (order P for 4 and 2 bits). */
AK_INLINE __m512i codes_whole(uint64_t bits, int b, const int back) {
    if (b == 4) {
        const __m512i sh = _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28);
        return _mm512_srlv_epi32(_mm512_set1_epi64((long long)bits), sh);
    }
    if (b == 2) {   /* 16 codes in 32 bits: odd lanes shift 16 further */
        const __m512i sh = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
        return _mm512_srlv_epi32(_mm512_set1_epi32((int)(uint32_t)bits), sh);
    }
    __m512i w = _mm512_set1_epi64((long long)bits);
#if defined(__AVX512VBMI__)
    /* byte 0 of lane i = the 8 bits of its qword from bit 3i */
    const __m512i ctl = _mm512_set_epi64(45LL << 32 | 42, 39LL << 32 | 36, 33LL << 32 | 30, 27LL << 32 | 24,
                                         21LL << 32 | 18, 15LL << 32 | 12, 9LL << 32 | 6, 3LL << 32 | 0);
    /* loaded from 2 bytes early: 16 bits further (offsets past 63 wrap
     * within the qword; only a lane's low 3 bits are used) */
    return _mm512_multishift_epi64_epi8(back ? _mm512_add_epi64(ctl, _mm512_set1_epi64(16LL << 32 | 16)) : ctl, w);
#else
    /* bytes 3i/8 and 3i/8 + 1 to the bottom of lane i, shift by 3i % 8 */
    const __m512i shuf = _mm512_setr_epi32(
        (int)0x80800100, (int)0x80800100, (int)0x80800100, (int)0x80800201, (int)0x80800201, (int)0x80800201,
        (int)0x80800302, (int)0x80800302, (int)0x80800403, (int)0x80800403, (int)0x80800403, (int)0x80800504,
        (int)0x80800504, (int)0x80800504, (int)0x80800605, (int)0x80800605);
    /* loaded from 2 bytes early: bytes 2 further (index 8, the next copy of
     * the qword, lands above the 3 bits that are used) */
    const __m512i shuf2 = _mm512_add_epi32(shuf, _mm512_set1_epi32(0x0202));
    const __m512i sh = _mm512_setr_epi32(0, 3, 6, 1, 4, 7, 2, 5, 0, 3, 6, 1, 4, 7, 2, 5);
    return _mm512_srlv_epi32(_mm512_shuffle_epi8(w, back ? shuf2 : shuf), sh);
#endif
}

/* The same for a short last chunk of n codes: its bytes are loaded masked
 * (the vector may end there) and laid out as a whole chunk. */
AK_INLINE __m512i codes_short(const uint8_t *c, int b, int n) {
    uint8_t t[16] = { 0 };
    _mm_storeu_si128((__m128i *)t, _mm_maskz_loadu_epi8((__mmask16)((1u << ((b * n + 7) / 8)) - 1), c));
    return codes_whole(ld64(t), b, 0);
}

/* Values k .. k+n-1 (n <= 16, k a multiple of 16) of vector v (its code
 * stream, cb bytes) as floats, before q8's group scales and tq's factors;
 * packed formats look codes up in tab. Lanes past n are finite (zero bytes
 * decoded). */
AK_INLINE vf decode(int f, const uint8_t *v, size_t cb, int k, int n, vf tab, vf hi) {
    __mmask16 m = lanes(n);
    (void)hi;
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
        size_t o = (size_t)k * b / 8;
        if (n < 16) return _mm512_permutexvar_ps(codes_short(v + o, b, n), tab);
        if (b != 3) return _mm512_permutexvar_ps(codes_whole(b == 4 ? ld64(v + o) : ld32(v + o), b, 0), tab);
        /* 6 bytes read as 8 inside the code stream (streams sit next to
         * each other, blockpool.h): from 2 bytes early but for the first
         * chunk, which a stream of 8 bytes or more follows */
        if (o >= 2) return _mm512_permutexvar_ps(codes_whole(ld64(v + o - 2), 3, 2), tab);
        if (cb >= 8) return _mm512_permutexvar_ps(codes_whole(ld64(v + o), 3, 0), tab);
        uint8_t t[8] = { 0 };
        memcpy(t, v + o, 6);
        return _mm512_permutexvar_ps(codes_whole(ld64(t), 3, 0), tab);
    }
    }
}

/* The query or accumulator as the products read it: in lane order P where
 * the format wants it, zero-padded to whole chunks (no masks then). */
AK_INLINE const float *to_order(int f, const float *x, int d, float *buf) {
    if (!f_porder(f)) return x;
    for (int k = 0; k < d; k += 16)
        _mm512_store_ps(buf + k, _mm512_permutexvar_ps(P_IDX, _mm512_maskz_loadu_ps(lanes(d - k), x + k)));
    return buf;
}
AK_INLINE void from_order(int f, const float *buf, int d, float *x) {
    if (!f_porder(f)) return;
    for (int k = 0; k < d; k += 16)
        _mm512_mask_storeu_ps(x + k, lanes(d - k), _mm512_permutexvar_ps(P_INV, _mm512_load_ps(buf + k)));
}

/* cnt f16 values at m as floats into out (room for cnt rounded up to 16):
 * whole 16-value loads, one masked load for the rest. Blocks keep the
 * metadata of consecutive vectors back to back, so the products convert a
 * run of vectors' metadata with one call (a masked load of 16-bit lanes
 * costs about as much as the rest of a q4 dot product on Zen 5: one per run,
 * not one per vector). */
AK_INLINE void load_f16(const uint8_t *m, int cnt, float *out) {
    int i = 0;
    for (; i + 16 <= cnt; i += 16)
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(m + 2 * i))));
    if (i < cnt) _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes(cnt - i), m + 2 * i)));
}

/* Sums of four vectors' lanes: {sum a, sum b, sum c, sum d}. */
AK_INLINE __m128 reduce4(vf a, vf b, vf c, vf d) {
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xee));
    __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4e));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0xb1));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s));
}
AK_INLINE float reduce1(vf a) { return _mm512_reduce_add_ps(a); }

#define VZERO() _mm512_setzero_ps()
#define VSET1(x) _mm512_set1_ps(x)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VLOADTAB(t) _mm512_loadu_ps(t)
/* q/acc chunk k with n valid values: whole (padded) in order P */
#define VLOAD_X(f, x, k, n) \
    (f_porder(f) ? _mm512_load_ps((x) + (k)) : (n) == W ? _mm512_loadu_ps((x) + (k)) : _mm512_maskz_loadu_ps(lanes(n), (x) + (k)))
#define VSTORE_X(f, x, k, n, a)                                                 \
    do {                                                                        \
        if (f_porder(f)) _mm512_store_ps((x) + (k), a);                         \
        else if ((n) == W) _mm512_storeu_ps((x) + (k), a);                      \
        else _mm512_mask_storeu_ps((x) + (k), lanes(n), a);                     \
    } while (0)

#else
/* ======================================================================== */
/* AVX2                                                                     */
/* ======================================================================== */

const char ak_kvf_simd_name[] = "avx2";

typedef __m256 vf;
#define W 8

AK_INLINE __m256i lanes(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The first nbytes of a short last chunk, copied out so that no load
 * passes the vector's end. */
AK_INLINE __m128i load_short(const uint8_t *p, int nbytes) {
    uint8_t t[16] = { 0 };
    memcpy(t, p, (size_t)nbytes);
    return _mm_loadu_si128((const __m128i *)t);
}

/* Lane i holds code i of the 8 codes from byte o of the code stream v (cb
 * bytes) in its low b bits (junk above). Whole 3- and 2-bit chunks (3 and 2
 * bytes) are read as 4 inside the stream (streams sit next to each other,
 * blockpool.h): from 4 - b bytes early (the shifts grow to match) but for
 * the first chunk, which a stream of 4 bytes or more follows. */
AK_INLINE __m256i load_codes(const uint8_t *v, size_t o, size_t cb, int b, int n) {
    __m256i sh = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b);
    uint32_t w;
    if (n < 8) w = (uint32_t)_mm_cvtsi128_si32(load_short(v + o, (b * n + 7) / 8));
    else if (b == 4) w = ld32(v + o);
    else if (o >= (size_t)(4 - b)) {
        w = ld32(v + o - (4 - b));
        sh = _mm256_add_epi32(sh, _mm256_set1_epi32(8 * (4 - b)));
    } else if (cb >= 4) w = ld32(v + o);
    else {
        w = 0;
        memcpy(&w, v + o, (size_t)b);
    }
    return _mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh);
}

/* Values k .. k+n-1 (n <= 8, k a multiple of 8) of vector v (its code
 * stream, cb bytes) as floats, before q8's group scales and tq's factors.
 * tab: the first 8 table entries (for tq4 the second 8 are read from the
 * codebook); for q2 the group's levels; for q4 a vector of the group's
 * scale, with its min in hi. */
AK_INLINE vf decode(int f, const uint8_t *v, size_t cb, int k, int n, vf tab, vf hi) {
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
    case AK_KV_Q4: {   /* 16 levels: convert rather than look up */
        __m256i c = _mm256_and_si256(load_codes(v, (size_t)k / 2, cb, 4, n), _mm256_set1_epi32(15));
        return _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), tab, hi);
    }
    case AK_KV_TQ4: {   /* 16 entries: two permutes, code bit 3 picks */
        __m256i c = load_codes(v, (size_t)k / 2, cb, 4, n);
        __m256 a = _mm256_permutevar8x32_ps(tab, c), b = _mm256_permutevar8x32_ps(_mm256_loadu_ps(ak_kvf_lm4 + 8), c);
        return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(c, 28)));
    }
    default: {
        int b = f_bits(f);
        return _mm256_permutevar8x32_ps(tab, load_codes(v, (size_t)k * b / 8, cb, b, n));
    }
    }
}

/* Query and accumulator are read in their own order here. */
AK_INLINE const float *to_order(int f, const float *x, int d, float *buf) { return x; }
AK_INLINE void from_order(int f, const float *buf, int d, float *x) {}

/* cnt f16 values at m as floats into out. */
AK_INLINE void load_f16(const uint8_t *m, int cnt, float *out) {
    int i = 0;
    for (; i + 8 <= cnt; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + 2 * i))));
    for (; i < cnt; i++) out[i] = _cvtsh_ss(ak_kvf_rd16(m + 2 * i));
}

AK_INLINE __m128 reduce4(vf a, vf b, vf c, vf d) {
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}
AK_INLINE float reduce1(vf a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(_mm_hadd_ps(s, s));
}

#define VZERO() _mm256_setzero_ps()
#define VSET1(x) _mm256_set1_ps(x)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VLOADTAB(t) _mm256_loadu_ps(t)
#define VLOAD_X(f, x, k, n) ((n) == W ? _mm256_loadu_ps((x) + (k)) : _mm256_maskload_ps((x) + (k), lanes(n)))
#define VSTORE_X(f, x, k, n, a)                                                 \
    do {                                                                        \
        if ((n) == W) _mm256_storeu_ps((x) + (k), a);                           \
        else _mm256_maskstore_ps((x) + (k), lanes(n), a);                       \
    } while (0)
#endif

/* ======================================================================== */
/* The products (both back ends)                                            */
/* ======================================================================== */

/* The decode parameters of group g of a vector whose converted metadata is
 * meta, times the weight w (axpy; 1 for dot, an exact no-op): for q4/q2
 * with AVX-512 and q2 with AVX2 the group's levels (table times scale plus
 * min); for q4 with AVX2 the scale (min in *hi); for q8 the scale. */
AK_INLINE vf group_param(int f, const float *meta, int g, float w, vf tab, vf *hi) {
    if (f == AK_KV_Q8) return VSET1(meta[g] * w);
#if defined(AK_KVF_AVX2)
    if (f == AK_KV_Q4) {
        *hi = VSET1(meta[2 * g + 1] * w);
        return VSET1(meta[2 * g] * w);
    }
#endif
    return VFMA(tab, VSET1(meta[2 * g] * w), VSET1(meta[2 * g + 1] * w));
}

/* The R vectors a chunk is decoded from: their code streams (cb bytes
 * each), the format's table, and the current group's decode parameters
 * (group_param's, per vector: gp, hi). */
typedef struct {
    const uint8_t *const *v;
    size_t cb;
    vf tab;
    const vf *gp, *hi;
} chunk_src;

/* sum[r] += chunk k (n values) of vector r times the query's. */
AK_INLINE void dot_chunk(const int f, const int R, const chunk_src *s, int k, const int n, const float *q, vf *sum) {
    vf qk = VLOAD_X(f, q, k, n);
    PIN(qk);
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++)
        sum[r] = VFMA(decode(f, s->v[r], s->cb, k, n, f == AK_KV_Q8 ? s->tab : s->gp[r], s->hi[r]), qk, sum[r]);
}

/* acc chunk k (n values) += the weighted chunk k of every vector r (wr:
 * the weights, broadcast). */
AK_INLINE void axpy_chunk(const int f, const int R, const chunk_src *s, int k, const int n, float *acc, const vf *wr) {
    vf a = VLOAD_X(f, acc, k, n);
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++) {
        vf x = decode(f, s->v[r], s->cb, k, n, f == AK_KV_Q8 ? s->tab : s->gp[r], s->hi[r]);
        if (f_affine(f)) a = VADD(a, x);   /* levels carry the weight */
        else a = VFMA(x, f == AK_KV_Q8 ? s->gp[r] : wr[r], a);
    }
    VSTORE_X(f, acc, k, n, a);
}

/* What the rows of one product share: the vectors' code and raw metadata
 * strides (bytes), their converted metadata's (fstride floats), the
 * dimension, tq's sqrt(d), the format's table. */
typedef struct {
    size_t cstride, mstride;
    int fstride, d;
    float sqrt_d;
    vf tab;
} rows_arg;

/* out[r] = <q, vector r> for R (1 or 4) vectors whose code streams are at
 * c0, ra->cstride apart, and raw metadata at m0, ra->mstride apart (tq's N);
 * meta0 their converted group metadata, ra->fstride floats apart. */
AK_INLINE void dot_rows(const int f, const int R, const rows_arg *ra, const uint8_t *c0, const uint8_t *m0,
                        const float *meta0, const float *q, float *out) {
    const int d = ra->d;
    const vf tab = ra->tab;
    const int G = f_group(f), step = G ? G : W;
    const size_t cb = f_code_bytes(f, d);
    const uint8_t *v[4], *mr[4];
    const float *meta[4];
    vf acc[4], gp[4], hi[4];
    const chunk_src src = {.v = v, .cb = cb, .tab = tab, .gp = gp, .hi = hi};
    __m128 fac4 = _mm_setzero_ps();
    float fac[4] = {0, 0, 0, 0};
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++) {
        v[r] = c0 + (size_t)r * ra->cstride;
        mr[r] = m0 ? m0 + (size_t)r * ra->mstride : NULL;
        meta[r] = meta0 + r * ra->fstride;
        acc[r] = VZERO();
        gp[r] = tab;
        hi[r] = VZERO();
    }
    /* tq's factors now, so that their pointers are not live in the loop */
    if (f_tq(f) && R == 4) fac4 = tq_factor4(mr, ra->sqrt_d);
    else if (f_tq(f))
        _Pragma("GCC unroll 4")
        for (int r = 0; r < R; r++) fac[r] = tq_factor(mr[r], ra->sqrt_d);
    for (int k0 = 0, g = 0; k0 < d; k0 += step, g++) {
        vf t[4];   /* q8: the group's sum, scaled once at its end */
        _Pragma("GCC unroll 4")
        for (int r = 0; r < R; r++) {
            if (G) gp[r] = group_param(f, meta[r], g, 1.0f, tab, &hi[r]);
            t[r] = VZERO();
        }
        for (int k = k0; k < k0 + step && k < d; k += W) {
            /* whole chunks apart from the short last one, so that they
             * compile without masks */
            if (d - k >= W) dot_chunk(f, R, &src, k, W, q, f == AK_KV_Q8 ? t : acc);
            else dot_chunk(f, R, &src, k, d - k, q, f == AK_KV_Q8 ? t : acc);
        }
        if (f == AK_KV_Q8)
            _Pragma("GCC unroll 4")
            for (int r = 0; r < R; r++) acc[r] = VFMA(t[r], gp[r], acc[r]);
    }
    if (R == 4) {
        __m128 s = reduce4(acc[0], acc[1], acc[2], acc[3]);
        if (f_tq(f)) s = _mm_mul_ps(s, fac4);
        _mm_storeu_ps(out, s);
    } else
        _Pragma("GCC unroll 4")
        for (int r = 0; r < R; r++) {
            float s = reduce1(acc[r]);
            out[r] = f_tq(f) ? s * fac[r] : s;
        }
}

/* acc += sum_r w[r] * vector r, for R (1 or 4) vectors as in dot_rows;
 * meta0 their converted group metadata (the weights are applied to each
 * group's scale and min, two scalar products per group). */
AK_INLINE void axpy_rows(const int f, const int R, const rows_arg *ra, const uint8_t *c0, const uint8_t *m0,
                         const float *meta0, const float *w, float *acc) {
    const int d = ra->d;
    const vf tab = ra->tab;
    const int G = f_group(f), step = G ? G : W;
    const size_t cb = f_code_bytes(f, d);
    const uint8_t *v[4], *mr[4];
    const float *meta[4];
    vf wr[4], gp[4], hi[4];
    const chunk_src src = {.v = v, .cb = cb, .tab = tab, .gp = gp, .hi = hi};
    float wf[4];   /* the weights, times tq's factors */
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++) {
        v[r] = c0 + (size_t)r * ra->cstride;
        mr[r] = m0 ? m0 + (size_t)r * ra->mstride : NULL;
        meta[r] = meta0 + r * ra->fstride;
        gp[r] = tab;
        hi[r] = VZERO();
    }
    if (f_tq(f) && R == 4) _mm_storeu_ps(wf, _mm_mul_ps(_mm_loadu_ps(w), tq_factor4(mr, ra->sqrt_d)));
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++) {
        if (!(f_tq(f) && R == 4)) wf[r] = f_tq(f) ? w[r] * tq_factor(mr[r], ra->sqrt_d) : w[r];
        wr[r] = VSET1(wf[r]);
    }
    for (int k0 = 0, g = 0; k0 < d; k0 += step, g++) {
        if (G)
            _Pragma("GCC unroll 4")
            for (int r = 0; r < R; r++) gp[r] = group_param(f, meta[r], g, w[r], tab, &hi[r]);
        for (int k = k0; k < k0 + step && k < d; k += W) {
            if (d - k >= W) axpy_chunk(f, R, &src, k, W, acc, wr);
            else axpy_chunk(f, R, &src, k, d - k, acc, wr);
        }
    }
}

/* The group metadata of vectors j0..j1 as floats into meta, cnt per vector
 * (fstride floats apart: cnt, or cnt rounded up to 16 when each vector's is
 * converted apart). Returns fstride. */
AK_INLINE int convert_meta(const int f, const uint8_t *m0, size_t mstride, int j0, int j1, int d, float *meta) {
    const int cnt = meta_count(f, d);
    int fs = cnt;
    if (mstride == 2 * (size_t)cnt) load_f16(m0 + (size_t)j0 * mstride, cnt * (j1 - j0), meta);   /* one run */
    else {
        fs = (cnt + 15) & ~15;
        for (int i = j0; i < j1; i++) load_f16(m0 + (size_t)i * mstride, cnt, meta + (i - j0) * fs);
    }
    return fs;
}

/* Vectors go in blocks of BLOCK whose metadata is converted first: faster
 * than converting four vectors' at a time (docs/speed.md). */
AK_INLINE void dot_impl(const int f, const ak_kvf_vecs vs, const float *q, int d, float *out) {
    const void *codes = vs.codes, *mp = vs.meta;
    const size_t cstride = vs.cstride, mstride = vs.mstride;
    const int n = vs.n;
    if (!valid_d(d)) return;
    const uint8_t *p = codes, *m = f_packed(f) || f == AK_KV_Q8 ? mp : NULL;
    float meta[f_group(f) ? BLOCK * MAXMETA + 16 : 1] __attribute__((aligned(64)));
    float qbuf[AK_KVF_MAX_D] __attribute__((aligned(64))), t[16];
    float sqrt_d = sqrtf((float)d);
    int fs = 0;
    base_table(f, t);
    vf tab = VLOADTAB(t);
    q = to_order(f, q, d, qbuf);
    for (int j0 = 0; j0 < n; j0 += BLOCK) {
        int j1 = j0 + BLOCK < n ? j0 + BLOCK : n, j = j0;
        if (f_group(f)) fs = convert_meta(f, m, mstride, j0, j1, d, meta);
        const rows_arg ra = {
            .cstride = cstride, .mstride = mstride, .fstride = fs, .d = d, .sqrt_d = sqrt_d, .tab = tab};
        for (; j + 4 <= j1; j += 4)
            dot_rows(f, 4, &ra, p + (size_t)j * cstride, m ? m + (size_t)j * mstride : NULL, meta + (j - j0) * fs,
                     q, out + j);
        for (; j < j1; j++)
            dot_rows(f, 1, &ra, p + (size_t)j * cstride, m ? m + (size_t)j * mstride : NULL, meta + (j - j0) * fs,
                     q, out + j);
    }
}

AK_INLINE void axpy_impl(const int f, const ak_kvf_vecs vs, const float *w, int d, float *acc) {
    const void *codes = vs.codes, *mp = vs.meta;
    const size_t cstride = vs.cstride, mstride = vs.mstride;
    const int n = vs.n;
    if (!valid_d(d)) return;
    const uint8_t *p = codes, *m = f_packed(f) || f == AK_KV_Q8 ? mp : NULL;
    float meta[f_group(f) ? BLOCK * MAXMETA + 16 : 1] __attribute__((aligned(64)));
    float abuf[AK_KVF_MAX_D] __attribute__((aligned(64))), t[16];
    float sqrt_d = sqrtf((float)d);
    int fs = 0;
    base_table(f, t);
    vf tab = VLOADTAB(t);
    float *a = (float *)to_order(f, acc, d, abuf);
    for (int j0 = 0; j0 < n; j0 += BLOCK) {
        int j1 = j0 + BLOCK < n ? j0 + BLOCK : n, j = j0;
        if (f_group(f)) fs = convert_meta(f, m, mstride, j0, j1, d, meta);
        const rows_arg ra = {
            .cstride = cstride, .mstride = mstride, .fstride = fs, .d = d, .sqrt_d = sqrt_d, .tab = tab};
        for (; j + 4 <= j1; j += 4)
            axpy_rows(f, 4, &ra, p + (size_t)j * cstride, m ? m + (size_t)j * mstride : NULL, meta + (j - j0) * fs,
                      w + j, a);
        for (; j < j1; j++)
            axpy_rows(f, 1, &ra, p + (size_t)j * cstride, m ? m + (size_t)j * mstride : NULL, meta + (j - j0) * fs,
                      w + j, a);
    }
    from_order(f, abuf, d, acc);
}

/* ---- whole vectors to f32 (attention's blocks) ----------------------------
 * dequant: vector j to out + j * ostride; dequant_t: value i of vector j to
 * out[i * ostride + j] (keys transposed, so that attention's scores are
 * vector FMAs over keys). Values in the stored basis: decode, then q8's
 * scale or tq's factor (q4/q2's levels include theirs). The transposed form
 * takes W vectors at a time, decodes one chunk of each into a register and
 * transposes the W x W tile in registers; in lane order P (see the top) the
 * transpose's row i is dimension perm(i), so no permute is spent on it. */

/* W x W transpose of r (row j, lane i) into r (row i, lane j). The first
 * two steps work within 128-bit lanes and are the same at both widths:
 * afterwards u[i + e] holds rows i..i+3 of element 4L + e of each 128-bit
 * lane L; the last step moves 128-bit lanes, which only AVX-512 has four of. */
#if defined(AK_KVF_AVX512)
#define V_UNPACKLO _mm512_unpacklo_ps
#define V_UNPACKHI _mm512_unpackhi_ps
#define V_SHUFFLE _mm512_shuffle_ps
#else
#define V_UNPACKLO _mm256_unpacklo_ps
#define V_UNPACKHI _mm256_unpackhi_ps
#define V_SHUFFLE _mm256_shuffle_ps
#endif
AK_INLINE void transpose_in_lanes(const vf *r, vf *u) {
    vf t[W];
    _Pragma("GCC unroll 16")
    for (int i = 0; i < W; i += 2) {
        t[i] = V_UNPACKLO(r[i], r[i + 1]);
        t[i + 1] = V_UNPACKHI(r[i], r[i + 1]);
    }
    _Pragma("GCC unroll 16")
    for (int i = 0; i < W; i += 4) {
        u[i] = V_SHUFFLE(t[i], t[i + 2], 0x44);
        u[i + 1] = V_SHUFFLE(t[i], t[i + 2], 0xee);
        u[i + 2] = V_SHUFFLE(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = V_SHUFFLE(t[i + 1], t[i + 3], 0xee);
    }
}
#if defined(AK_KVF_AVX512)
AK_INLINE void transpose_tile(vf *r) {
    vf u[16];
    transpose_in_lanes(r, u);
    _Pragma("GCC unroll 16")
    for (int e = 0; e < 4; e++) {
        vf a = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x88), b = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xdd);
        vf c = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x88), d = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xdd);
        r[e] = _mm512_shuffle_f32x4(a, c, 0x88);        /* lane 0 */
        r[8 + e] = _mm512_shuffle_f32x4(a, c, 0xdd);    /* lane 2 */
        r[4 + e] = _mm512_shuffle_f32x4(b, d, 0x88);    /* lane 1 */
        r[12 + e] = _mm512_shuffle_f32x4(b, d, 0xdd);   /* lane 3 */
    }
}
/* Dimension (within the chunk) that lane i holds in the format's order. */
AK_INLINE int lane_dim(int f, int i) { return f_porder(f) ? (i & 1 ? 8 + i / 2 : i / 2) : i; }
AK_INLINE vf natural(int f, vf x) { return f_porder(f) ? _mm512_permutexvar_ps(P_INV, x) : x; }
#define VSTORE_N(p, n, a) ((n) == W ? _mm512_storeu_ps(p, a) : _mm512_mask_storeu_ps(p, lanes(n), a))
#else
AK_INLINE void transpose_tile(vf *r) {
    vf u[8];
    transpose_in_lanes(r, u);
    _Pragma("GCC unroll 16")
    for (int e = 0; e < 4; e++) {
        r[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
        r[4 + e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
    }
}
AK_INLINE int lane_dim(int f, int i) { return i; }
AK_INLINE vf natural(int f, vf x) { return x; }
#define VSTORE_N(p, n, a) ((n) == W ? _mm256_storeu_ps(p, a) : _mm256_maskstore_ps(p, lanes(n), a))
#endif

/* Chunk k (n values) of vector v (cb code bytes) in f32: gp, hi its
 * group's parameters (group_param with weight 1; for formats without
 * groups the table, which q8's decode does not read either), fac tq's
 * factor. */
AK_INLINE vf dq_chunk(const int f, const uint8_t *v, size_t cb, int k, int n, vf gp, vf hi, float fac) {
    vf x = decode(f, v, cb, k, n, gp, hi);
    if (f == AK_KV_Q8) x = VMUL(x, gp);
    if (f_tq(f)) x = VMUL(x, VSET1(fac));
    return x;
}

AK_INLINE void dequant_impl(const int f, const ak_kvf_vecs vs, int d, float *out, size_t ostride) {
    const void *codes = vs.codes, *mp = vs.meta;
    const size_t cstride = vs.cstride, mstride = vs.mstride;
    const int n = vs.n;
    if (!valid_d(d)) return;
    const uint8_t *p = codes, *m = f_packed(f) || f == AK_KV_Q8 ? mp : NULL;
    const int G = f_group(f), step = G ? G : W;
    const size_t cb = f_code_bytes(f, d);
    float meta[f_group(f) ? BLOCK * MAXMETA + 16 : 1] __attribute__((aligned(64))), t[16];
    float sqrt_d = sqrtf((float)d);
    int fs = 0;
    base_table(f, t);
    vf tab = VLOADTAB(t);
    for (int j0 = 0; j0 < n; j0 += BLOCK) {
        int j1 = j0 + BLOCK < n ? j0 + BLOCK : n;
        if (G) fs = convert_meta(f, m, mstride, j0, j1, d, meta);
        for (int j = j0; j < j1; j++) {
            const uint8_t *v = p + (size_t)j * cstride;
            float fac = f_tq(f) ? tq_factor(m + (size_t)j * mstride, sqrt_d) : 1.0f, *o = out + (size_t)j * ostride;
            vf gp = tab, hi = VZERO();
            /* unrolled: with d a constant (the entry points pass 64 and 128
             * as such) the loops over groups and chunks disappear */
            _Pragma("GCC unroll 8")
            for (int k0 = 0, g = 0; k0 < d; k0 += step, g++) {
                if (G) gp = group_param(f, meta + (j - j0) * fs, g, 1.0f, tab, &hi);
                const int kend = k0 + step < d ? k0 + step : d;
                _Pragma("GCC unroll 8")
                for (int k = k0; k < kend; k += W) {
                    if (d - k >= W) VSTORE_N(o + k, W, natural(f, dq_chunk(f, v, cb, k, W, gp, hi, fac)));
                    else VSTORE_N(o + k, d - k, natural(f, dq_chunk(f, v, cb, k, d - k, gp, hi, fac)));
                }
            }
        }
    }
}

AK_INLINE void dequant_t_impl(const int f, const ak_kvf_vecs vs, int d, float *out, size_t ostride) {
    const void *codes = vs.codes, *mp = vs.meta;
    const size_t cstride = vs.cstride, mstride = vs.mstride;
    const int n = vs.n;
    if (!valid_d(d)) return;
    const uint8_t *p = codes, *m = f_packed(f) || f == AK_KV_Q8 ? mp : NULL;
    const int G = f_group(f);
    const size_t cb = f_code_bytes(f, d);
    float meta[f_group(f) ? W * MAXMETA + 16 : 1] __attribute__((aligned(64))), t[16];
    float sqrt_d = sqrtf((float)d), fac[W];
    int fs = 0;
    base_table(f, t);
    vf tab = VLOADTAB(t);
    for (int j0 = 0; j0 < n; j0 += W) {
        const int nv = n - j0 < W ? n - j0 : W;   /* vectors of this tile; the rest of it is zeros */
        if (G) fs = convert_meta(f, m, mstride, j0, j0 + nv, d, meta);
        for (int j = 0; j < nv; j++) fac[j] = f_tq(f) ? tq_factor(m + (size_t)(j0 + j) * mstride, sqrt_d) : 1.0f;
        _Pragma("GCC unroll 8")
        for (int k = 0; k < d; k += W) {
            const int nk = d - k < W ? d - k : W, g = G ? k / G : 0;
            vf x[W];
            _Pragma("GCC unroll 16")
            for (int j = 0; j < W; j++) {
                if (j >= nv) { x[j] = VZERO(); continue; }
                vf gp = tab, hi = VZERO();
                if (G) gp = group_param(f, meta + j * fs, g, 1.0f, tab, &hi);
                const uint8_t *v = p + (size_t)(j0 + j) * cstride;
                x[j] = nk == W ? dq_chunk(f, v, cb, k, W, gp, hi, fac[j]) : dq_chunk(f, v, cb, k, nk, gp, hi, fac[j]);
            }
            transpose_tile(x);
            _Pragma("GCC unroll 16")
            for (int i = 0; i < W; i++) {
                int dim = lane_dim(f, i);
                if (dim < nk) VSTORE_N(out + (size_t)(k + dim) * ostride + j0, nv, x[i]);
            }
        }
    }
}

/* Each entry builds its vectors' description once: one copy, not one per
 * call below, keeps the inlined code what it was with separate values. */
#define ENTRY(F, ID)                                                                                          \
    void ak_kvf_simd_dot_##F(const void *c, size_t cs, const void *m, size_t ms, int n, const float *q, int d, \
                             float *out) {                                                                    \
        const ak_kvf_vecs vs = {.codes = c, .cstride = cs, .meta = m, .mstride = ms, .n = n};                \
        dot_impl(ID, vs, q, d, out);                                                                          \
    }                                                                                                         \
    void ak_kvf_simd_axpy_##F(const void *c, size_t cs, const void *m, size_t ms, int n, const float *w, int d, \
                              float *acc) {                                                                   \
        const ak_kvf_vecs vs = {.codes = c, .cstride = cs, .meta = m, .mstride = ms, .n = n};                \
        axpy_impl(ID, vs, w, d, acc);                                                                         \
    }                                                                                                         \
    void ak_kvf_simd_dequant_##F(const void *c, size_t cs, const void *m, size_t ms, int n, int d, float *out, \
                                 size_t os) {                                                                \
        const ak_kvf_vecs vs = {.codes = c, .cstride = cs, .meta = m, .mstride = ms, .n = n};                \
        if (d == 64) dequant_impl(ID, vs, 64, out, os);                                                       \
        else if (d == 128) dequant_impl(ID, vs, 128, out, os);                                                \
        else dequant_impl(ID, vs, d, out, os);                                                                \
    }                                                                                                         \
    void ak_kvf_simd_dequant_t_##F(const void *c, size_t cs, const void *m, size_t ms, int n, int d,         \
                                   float *out, size_t os) {                                                   \
        const ak_kvf_vecs vs = {.codes = c, .cstride = cs, .meta = m, .mstride = ms, .n = n};                \
        if (d == 64) dequant_t_impl(ID, vs, 64, out, os);                                                     \
        else if (d == 128) dequant_t_impl(ID, vs, 128, out, os);                                              \
        else dequant_t_impl(ID, vs, d, out, os);                                                              \
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

/* tcq3 (layout: kvformat.c): value i is T[w_i], w_i the 9 bits [3i-6, 3i+3)
 * of the code stream (zeros before it). Eight values at a time, on AVX2 and
 * AVX-512 builds alike (the gather, not the width, is the limit): the 32
 * bits from the byte before the chunk's 3 bytes (for the first chunk, those
 * 3 bytes moved up by 8: zeros before the stream) are broadcast, lane k
 * shifted right by 3k + 2 and masked to 9 bits, and one gather reads the
 * table. Nothing outside a vector's code bytes is read. The d % 8 values
 * left go one by one. */
AK_INLINE __m256i tcq3_windows(const uint8_t *c, int i) {
    uint32_t v = i ? ld32(c + 3 * i / 8 - 1) : (uint32_t)c[0] << 8 | (uint32_t)c[1] << 16 | (uint32_t)c[2] << 24;
    __m256i x = _mm256_srlv_epi32(_mm256_set1_epi32((int)v), _mm256_setr_epi32(2, 5, 8, 11, 14, 17, 20, 23));
    return _mm256_and_si256(x, _mm256_set1_epi32(511));
}

/* Code j of a 3-bit stream (0 for j < 0), reading only its own bytes. */
static inline unsigned tcq3_code(const uint8_t *c, int j) {
    if (j < 0) return 0;
    int bit = 3 * j;
    unsigned v = c[bit >> 3];
    if ((bit & 7) + 3 > 8) v |= (unsigned)c[(bit >> 3) + 1] << 8;
    return (v >> (bit & 7)) & 7;
}

static inline float tcq3_tail_value(const uint8_t *c, int i) {
    return ak_kvf_tcq3_table[tcq3_code(c, i) << 6 | tcq3_code(c, i - 1) << 3 | tcq3_code(c, i - 2)];
}

void ak_kvf_simd_dot_tcq3(const void *codes, size_t cstride, const void *meta, size_t mstride, int n, const float *q,
                          int d, float *out) {
    if (!valid_d(d)) return;
    float sqrt_d = sqrtf((float)d);
    int d8 = d & ~7;
    for (int j = 0; j < n; j++) {
        const uint8_t *c = (const uint8_t *)codes + (size_t)j * cstride;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int i = 0;
        for (; i + 16 <= d8; i += 16) {
            a0 = _mm256_fmadd_ps(_mm256_i32gather_ps(ak_kvf_tcq3_table, tcq3_windows(c, i), 4), _mm256_loadu_ps(q + i), a0);
            a1 = _mm256_fmadd_ps(_mm256_i32gather_ps(ak_kvf_tcq3_table, tcq3_windows(c, i + 8), 4),
                                 _mm256_loadu_ps(q + i + 8), a1);
        }
        if (i < d8) a0 = _mm256_fmadd_ps(_mm256_i32gather_ps(ak_kvf_tcq3_table, tcq3_windows(c, i), 4), _mm256_loadu_ps(q + i), a0);
        __m256 a = _mm256_add_ps(a0, a1);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        float s = _mm_cvtss_f32(h);
        for (i = d8; i < d; i++) s += q[i] * tcq3_tail_value(c, i);
        out[j] = s * tq_factor((const uint8_t *)meta + (size_t)j * mstride, sqrt_d);
    }
}

void ak_kvf_simd_axpy_tcq3(const void *codes, size_t cstride, const void *meta, size_t mstride, int n, const float *w,
                           int d, float *acc) {
    if (!valid_d(d)) return;
    float sqrt_d = sqrtf((float)d);
    int d8 = d & ~7;
    for (int j = 0; j < n; j++) {
        const uint8_t *c = (const uint8_t *)codes + (size_t)j * cstride;
        float wf = w[j] * tq_factor((const uint8_t *)meta + (size_t)j * mstride, sqrt_d);
        __m256 vw = _mm256_set1_ps(wf);
        for (int i = 0; i < d8; i += 8) {
            __m256 v = _mm256_i32gather_ps(ak_kvf_tcq3_table, tcq3_windows(c, i), 4);
            _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vw, v, _mm256_loadu_ps(acc + i)));
        }
        for (int i = d8; i < d; i++) acc[i] += wf * tcq3_tail_value(c, i);
    }
}

#endif
