/* kvformat_quant.c - see kvformat_quant.h. Each SIMD loop ends in the plain
 * C loop for its tail, which is also the whole function where the build has
 * no SIMD. Why each vector form equals the C form:
 * - vmaxps/vminps(a, b) return b when either is NaN, so with the running
 *   value as b a NaN element is skipped, as fmaxf/fminf skip it;
 * - round-to-nearest-even (the MXCSR default nearbyintf also uses) gives
 *   the same integral float; clamping with the quotient as the second
 *   operand keeps a NaN a NaN, and converting a NaN gives 0x80000000, whose
 *   low byte (what the C cast to 8 bits keeps on x86-64) is 0;
 * - a comparison is exact; x / s is one correctly rounded division.
 */
#include "kv/kvformat_quant.h"

#include <math.h>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define KVQ_W 16
typedef __m512 vf;
#define vf_load _mm512_loadu_ps
#define vf_set1 _mm512_set1_ps
#define vf_max _mm512_max_ps
#define vf_min _mm512_min_ps
#define vf_div _mm512_div_ps
#define vf_sub _mm512_sub_ps
#define vf_abs(x) _mm512_abs_ps(x)
#define vf_round(x) _mm512_roundscale_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
static inline float vf_hmax(vf v) { return _mm512_reduce_max_ps(v); }
static inline float vf_hmin(vf v) { return _mm512_reduce_min_ps(v); }
/* the low bytes of the rounded integers of v */
static inline void vf_store_bytes(vf v, void *dst) {
    _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
}
#elif defined(__AVX2__)
#include <immintrin.h>
#define KVQ_W 8
typedef __m256 vf;
#define vf_load _mm256_loadu_ps
#define vf_set1 _mm256_set1_ps
#define vf_max _mm256_max_ps
#define vf_min _mm256_min_ps
#define vf_div _mm256_div_ps
#define vf_sub _mm256_sub_ps
#define vf_abs(x) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), (x))
#define vf_round(x) _mm256_round_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
static inline float vf_hmax(vf v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}
static inline float vf_hmin(vf v) {
    __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_min_ps(m, _mm_movehl_ps(m, m));
    m = _mm_min_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}
static inline void vf_store_bytes(vf v, void *dst) {
    /* low byte of each 32-bit integer: gather bytes 0, 4, 8, 12 of each lane */
    __m256i i = _mm256_cvtps_epi32(v);
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i b = _mm256_shuffle_epi8(i, pick);
    uint32_t lo = (uint32_t)_mm256_extract_epi32(b, 0), hi = (uint32_t)_mm256_extract_epi32(b, 4);
    uint8_t *d = dst;
    for (int k = 0; k < 4; k++) {
        d[k] = (uint8_t)(lo >> (8 * k));
        d[4 + k] = (uint8_t)(hi >> (8 * k));
    }
}
#endif

/* The C forms, for tails and builds without SIMD. A NaN cast to an integer
 * is undefined in C: they give 0, which is what x86-64's conversion leaves
 * in the low byte. */
static inline int8_t q8_code(float x, float s) {
    float v = nearbyintf(x / s);
    if (v != v) return 0;
    return (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
}
static inline uint8_t affine_code(float x, float m, float s, float top) {
    float v = nearbyintf((x - m) / s);
    if (v != v) return 0;
    return (uint8_t)(v < 0 ? 0 : v > top ? top : v);
}

float ak_kvq_absmax(const float *x, int n) {
    int i = 0;
    float amax = 0;
#ifdef KVQ_W
    if (n >= KVQ_W) {
        vf acc = vf_set1(0.0f);
        for (; i + KVQ_W <= n; i += KVQ_W) acc = vf_max(vf_abs(vf_load(x + i)), acc);
        amax = vf_hmax(acc);
    }
#endif
    for (; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    return amax;
}

void ak_kvq_minmax(const float *x, int n, float *mn_out, float *mx_out) {
    int i = 0;
    float mn = INFINITY, mx = -INFINITY;
    int any = 0;   /* a non-NaN seen */
#ifdef KVQ_W
    if (n >= KVQ_W) {
        vf lo = vf_set1(INFINITY), hi = vf_set1(-INFINITY);
        for (; i + KVQ_W <= n; i += KVQ_W) {
            vf v = vf_load(x + i);
            lo = vf_min(v, lo);
            hi = vf_max(v, hi);
        }
        mn = vf_hmin(lo);
        mx = vf_hmax(hi);
        any = mn <= mx;   /* false only when every element so far was NaN */
    }
#endif
    for (; i < n; i++)
        if (x[i] == x[i]) {
            mn = fminf(mn, x[i]);
            mx = fmaxf(mx, x[i]);
            any = 1;
        }
    *mn_out = !any ? NAN : mn == 0 ? 0.0f : mn;
    *mx_out = !any ? NAN : mx == 0 ? 0.0f : mx;
}

void ak_kvq_q8_codes(const float *x, int n, float s, int8_t *q) {
    int i = 0;
    if (!(s > 0)) {
        for (; i < n; i++) q[i] = 0;
        return;
    }
#ifdef KVQ_W
    vf vs = vf_set1(s), hi = vf_set1(127.0f), lo = vf_set1(-127.0f);
    for (; i + KVQ_W <= n; i += KVQ_W)
        vf_store_bytes(vf_max(lo, vf_min(hi, vf_round(vf_div(vf_load(x + i), vs)))), q + i);
#endif
    for (; i < n; i++) q[i] = q8_code(x[i], s);
}

void ak_kvq_affine_codes(const float *x, int n, float m, float s, float top, uint8_t *code) {
    int i = 0;
    if (!(s > 0)) {
        for (; i < n; i++) code[i] = 0;
        return;
    }
#ifdef KVQ_W
    vf vs = vf_set1(s), vm = vf_set1(m), hi = vf_set1(top), lo = vf_set1(0.0f);
    for (; i + KVQ_W <= n; i += KVQ_W)
        vf_store_bytes(vf_min(hi, vf_max(lo, vf_round(vf_div(vf_sub(vf_load(x + i), vm), vs)))), code + i);
#endif
    for (; i < n; i++) code[i] = affine_code(x[i], m, s, top);
}

void ak_kvq_bucket_codes(const float *y, int n, const float *bound, int nb, uint8_t *code) {
    int i = 0;
#if defined(KVQ_W) && KVQ_W == 16
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(y + i);
        __m512i k = _mm512_setzero_si512();
        for (int t = 0; t < nb; t++) {
            __mmask16 gt = _mm512_cmp_ps_mask(v, _mm512_set1_ps(bound[t]), _CMP_GT_OQ);
            k = _mm512_mask_add_epi32(k, gt, k, _mm512_set1_epi32(1));
        }
        _mm_storeu_si128((__m128i *)(code + i), _mm512_cvtepi32_epi8(k));
    }
#elif defined(KVQ_W)
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(y + i);
        __m256i k = _mm256_setzero_si256();
        for (int t = 0; t < nb; t++)   /* a true comparison is all ones: -1 */
            k = _mm256_sub_epi32(k, _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_set1_ps(bound[t]), _CMP_GT_OQ)));
        uint32_t w[8];
        _mm256_storeu_si256((__m256i *)w, k);
        for (int j = 0; j < 8; j++) code[i + j] = (uint8_t)w[j];
    }
#endif
    for (; i < n; i++) {
        int k = 0;
        for (int t = 0; t < nb; t++) k += y[i] > bound[t];
        code[i] = (uint8_t)k;
    }
}

/* A stage within one vector pairs lane l with lane l ^ h: the lower lane
 * of a pair gets self + partner (a + b), the upper partner - self (a - b). */
void ak_kvq_wht(float *x, int m) {
    int h = 1;
#if defined(KVQ_W) && KVQ_W == 16
    if (m >= 16) {
        for (; h < 16; h <<= 1) {
            __m512i idx = _mm512_xor_si512(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(h));
            __mmask16 upper = 0;
            for (int l = 0; l < 16; l++)
                if (l & h) upper |= (__mmask16)(1u << l);
            for (int i = 0; i < m; i += 16) {
                __m512 v = _mm512_loadu_ps(x + i), p = _mm512_permutexvar_ps(idx, v);
                _mm512_storeu_ps(x + i, _mm512_mask_blend_ps(upper, _mm512_add_ps(v, p), _mm512_sub_ps(p, v)));
            }
        }
        for (; h < m; h <<= 1)
            for (int i = 0; i < m; i += 2 * h)
                for (int j = i; j < i + h; j += 16) {
                    __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + h);
                    _mm512_storeu_ps(x + j, _mm512_add_ps(a, b));
                    _mm512_storeu_ps(x + j + h, _mm512_sub_ps(a, b));
                }
    }
#elif defined(KVQ_W)
    if (m >= 8) {
        for (; h < 8; h <<= 1) {
            __m256i idx = _mm256_xor_si256(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(h));
            int upper = 0;
            for (int l = 0; l < 8; l++)
                if (l & h) upper |= 1 << l;
            __m256 um = _mm256_castsi256_ps(_mm256_setr_epi32(upper & 1 ? -1 : 0, upper & 2 ? -1 : 0, upper & 4 ? -1 : 0,
                                                               upper & 8 ? -1 : 0, upper & 16 ? -1 : 0, upper & 32 ? -1 : 0,
                                                               upper & 64 ? -1 : 0, upper & 128 ? -1 : 0));
            for (int i = 0; i < m; i += 8) {
                __m256 v = _mm256_loadu_ps(x + i), p = _mm256_permutevar8x32_ps(v, idx);
                _mm256_storeu_ps(x + i, _mm256_blendv_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), um));
            }
        }
        for (; h < m; h <<= 1)
            for (int i = 0; i < m; i += 2 * h)
                for (int j = i; j < i + h; j += 8) {
                    __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
                    _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
                    _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
                }
    }
#endif
    for (; h < m; h <<= 1)
        for (int i = 0; i < m; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float s = 1.0f / sqrtf((float)m);
    for (int i = 0; i < m; i++) x[i] *= s;
}
