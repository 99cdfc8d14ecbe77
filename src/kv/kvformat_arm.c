/* kvformat_arm.c - NEON (AArch64) dot/axpy for the KV formats (see
 * kvformat_impl.h; the layouts are specified at the top of kvformat.c).
 *
 * The shape follows kvformat_x86.c: vectors four at a time ("rows"), each
 * query/accumulator chunk loaded once per four vectors; chunks of 8 values,
 * two float32x4 registers. 8 b-bit codes are exactly b bytes: one 32-bit
 * load, duplicated, shifted per lane (vshlq by negative counts) and masked.
 * Codes become floats through a byte table lookup (tbl) on the codebook for
 * tq formats, by conversion and one FMA (s*code + m) for q4/q2. A short last
 * chunk (d not a multiple of 8) is copied into a zeroed buffer and decoded
 * as a whole one.
 */
#include "kv/kvformat_impl.h"

#if defined(AK_KVF_NEON)
#include <arm_neon.h>

#define AK_INLINE static inline __attribute__((always_inline))
#define MAXMETA (2 * AK_KVF_MAX_D / AK_KVF_Q2_G)

const char ak_kvf_simd_name[] = "neon";

static inline uint32_t ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

AK_INLINE int f_bits(int f) {
    return f == AK_KV_Q8 ? 8 : (f == AK_KV_Q4 || f == AK_KV_TQ4) ? 4 : f == AK_KV_TQ3 ? 3 : 2;
}
AK_INLINE int f_group(int f) { return f == AK_KV_Q8 || f == AK_KV_Q4 ? 32 : f == AK_KV_Q2 ? 16 : 0; }
AK_INLINE int f_tq(int f) { return f == AK_KV_TQ4 || f == AK_KV_TQ3 || f == AK_KV_TQ2; }
AK_INLINE int f_affine(int f) { return f == AK_KV_Q4 || f == AK_KV_Q2; }
AK_INLINE const float *f_cb(int f) { return f == AK_KV_TQ4 ? ak_kvf_lm4 : f == AK_KV_TQ3 ? ak_kvf_lm3 : ak_kvf_lm2; }
AK_INLINE size_t f_code_bytes(int f, int d) { return ak_kvf_code_bytes(d, f_bits(f)); }
/* Bytes holding the 8 values of one chunk. */
AK_INLINE int f_chunk_bytes(int f) {
    return f == AK_KV_F32 ? 32 : (f == AK_KV_F16 || f == AK_KV_BF16) ? 16 : f_bits(f);
}
AK_INLINE int meta_count(int f, int d) {
    int G = f_group(f);
    return G ? ak_kvf_ngroups(d, G) * (f == AK_KV_Q8 ? 1 : 2) : 0;
}
static int valid_d(int d) { return d >= 2 && d <= AK_KVF_MAX_D && d % 2 == 0; }

typedef struct {
    float32x4_t a, b;   /* values 0-3, 4-7 */
} v8;

AK_INLINE v8 v8_zero(void) { return (v8){ vdupq_n_f32(0), vdupq_n_f32(0) }; }
AK_INLINE v8 v8_load(const float *p) { return (v8){ vld1q_f32(p), vld1q_f32(p + 4) }; }
AK_INLINE void v8_store(float *p, v8 x) {
    vst1q_f32(p, x.a);
    vst1q_f32(p + 4, x.b);
}
AK_INLINE v8 v8_fma(v8 acc, v8 x, v8 y) { return (v8){ vfmaq_f32(acc.a, x.a, y.a), vfmaq_f32(acc.b, x.b, y.b) }; }
AK_INLINE v8 v8_fma_n(v8 acc, v8 x, float32x4_t s) { return (v8){ vfmaq_f32(acc.a, x.a, s), vfmaq_f32(acc.b, x.b, s) }; }

/* The codebook as 64 bytes for tbl (16 floats; shorter codebooks repeat). */
AK_INLINE uint8x16x4_t cb_table(int f) {
    float t[16];
    int m = (1 << f_bits(f)) - 1;
    for (int i = 0; i < 16; i++) t[i] = f_tq(f) ? f_cb(f)[i & m] : 0.0f;
    uint8x16x4_t r;
    for (int i = 0; i < 4; i++) r.val[i] = vreinterpretq_u8_f32(vld1q_f32(t + 4 * i));
    return r;
}

/* Codebook entries for four codes (< 2^b): byte j of lane i is byte j of
 * entry idx_i, i.e. table byte 4*idx_i + j. */
AK_INLINE float32x4_t lookup(uint32x4_t idx, const uint8x16x4_t *t, int b) {
    uint8x16_t bi = vreinterpretq_u8_u32(vmlaq_n_u32(vdupq_n_u32(0x03020100u), idx, 0x04040404u));
    if (b == 2) return vreinterpretq_f32_u8(vqtbl1q_u8(t->val[0], bi));
    if (b == 3) return vreinterpretq_f32_u8(vqtbl2q_u8((uint8x16x2_t){ { t->val[0], t->val[1] } }, bi));
    return vreinterpretq_f32_u8(vqtbl4q_u8(*t, bi));
}

/* The 8 values of the chunk whose bytes start at c, before q8's group
 * scale and tq's factor; q4/q2 apply their group's scale s and min m. A
 * whole 3-bit chunk is 3 bytes, read as 4 inside its code stream (vectors'
 * streams sit next to each other, blockpool.h): from the byte before it
 * (back = 1: it is not the stream's first chunk), or from its start when a
 * fourth byte follows (back = 0), else byte by byte (back = -1). */
AK_INLINE v8 decode(int f, const uint8_t *c, int back, float32x4_t s, float32x4_t m, const uint8x16x4_t *t) {
    switch (f) {
    case AK_KV_F32: return v8_load((const float *)(const void *)c);
    case AK_KV_F16:
        return (v8){ vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)c))),
                     vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)c + 4))) };
    case AK_KV_BF16:
        return (v8){ vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)(const void *)c), 16)),
                     vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)(const void *)c + 4), 16)) };
    case AK_KV_Q8: {
        int16x8_t h = vmovl_s8(vld1_s8((const int8_t *)c));
        return (v8){ vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(h))) };
    }
    default: {
        const int b = f_bits(f);
        uint32_t w = b == 2 ? (uint32_t)c[0] | (uint32_t)c[1] << 8
                     : b == 4 ? ld32(c)
                     : back >= 0 ? ld32(c - back) >> (8 * back)
                                 : (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16;
        const int32_t sh[8] = { 0, -b, -2 * b, -3 * b, -4 * b, -5 * b, -6 * b, -7 * b };
        uint32x4_t wv = vdupq_n_u32(w), mask = vdupq_n_u32((1u << b) - 1);
        uint32x4_t lo = vandq_u32(vshlq_u32(wv, vld1q_s32(sh)), mask);
        uint32x4_t hi = vandq_u32(vshlq_u32(wv, vld1q_s32(sh + 4)), mask);
        if (f_tq(f)) return (v8){ lookup(lo, t, b), lookup(hi, t, b) };
        return (v8){ vfmaq_f32(m, vcvtq_f32_u32(lo), s), vfmaq_f32(m, vcvtq_f32_u32(hi), s) };
    }
    }
}

/* decode's `back` for whole 3-bit chunk k of a stream of cb bytes. */
AK_INLINE int chunk_back(int k, int cb) { return k > 0 ? 1 : cb >= 4 ? 0 : -1; }

/* Where chunk k (a multiple of 8) of vector v starts. */
AK_INLINE const uint8_t *chunk_at(int f, const uint8_t *v, int k) {
    return v + (size_t)k * (size_t)f_chunk_bytes(f) / 8;
}

/* The same for a short last chunk of n values: its bytes copied out into a
 * zeroed buffer, so no load passes the vector's end. */
AK_INLINE v8 decode_short(int f, const uint8_t *v, int k, int n, float32x4_t s, float32x4_t m,
                          const uint8x16x4_t *t) {
    uint8_t buf[32] = { 0 };
    int nb = f == AK_KV_F32 ? 4 * n : (f == AK_KV_F16 || f == AK_KV_BF16) ? 2 * n : (f_bits(f) * n + 7) / 8;
    memcpy(buf, chunk_at(f, v, k), (size_t)nb);
    return decode(f, buf, 0, s, m, t);
}

/* The cnt f16 metadata values at p as floats times mul, into out. */
AK_INLINE void load_meta(const uint8_t *p, int cnt, float *out, float mul) {
    int i = 0;
    for (; i + 4 <= cnt; i += 4) {
        uint16_t h[4];
        memcpy(h, p + 2 * i, 8);
        vst1q_f32(out + i, vmulq_n_f32(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h))), mul));
    }
    for (; i < cnt; i++) out[i] = ak_f16_to_f32(ak_kvf_rd16(p + 2 * i)) * mul;
}

/* N/sqrt(d) of a tq vector whose N is at m. */
AK_INLINE float tq_factor(const uint8_t *m, float sqrt_d) {
    __fp16 h;
    uint16_t u = ak_kvf_rd16(m);
    memcpy(&h, &u, 2);
    return (float)h / sqrt_d;
}

/* Scale and min of group g (q8: scale only), as vectors. */
AK_INLINE void group_param(int f, const float *meta, int g, float32x4_t *s, float32x4_t *m) {
    if (f == AK_KV_Q8) *s = vdupq_n_f32(meta[g]);
    if (f_affine(f)) {
        *s = vdupq_n_f32(meta[2 * g]);
        *m = vdupq_n_f32(meta[2 * g + 1]);
    }
}

/* What the rows of one product share: the vectors' code and raw metadata
 * strides (bytes), their converted metadata's (fstride floats), the
 * dimension, tq's sqrt(d), the format's table. */
typedef struct {
    size_t cstride, mstride;
    int fstride, d;
    float sqrt_d;
    const uint8x16x4_t *t;
} rows_arg;

/* out[r] = <q, vector r> for R (1 or 4) vectors whose code streams are at
 * v0, ra->cstride apart, and raw metadata at m0, ra->mstride apart (tq's N);
 * meta0 their converted group metadata, ra->fstride floats apart. */
AK_INLINE void dot_rows(const int f, const int R, const rows_arg *ra, const uint8_t *v0, const uint8_t *m0,
                        const float *meta0, const float *q, float *out) {
    const int d = ra->d;
    const uint8x16x4_t *t = ra->t;
    const int G = f_group(f), step = G ? G : 8;
    const int cb = (int)f_code_bytes(f, d);
    const uint8_t *v[4];
    v8 acc[4];
    float32x4_t s[4], m[4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++) {
        v[r] = v0 + (size_t)r * ra->cstride;
        acc[r] = v8_zero();
        s[r] = m[r] = vdupq_n_f32(0);
    }
    for (int k0 = 0, g = 0; k0 < d; k0 += step, g++) {
        v8 sum[4];   /* q8: the group's sum, scaled at its end */
        _Pragma("GCC unroll 4")
        for (int r = 0; r < R; r++) {
            if (G) group_param(f, meta0 + r * ra->fstride, g, &s[r], &m[r]);
            sum[r] = v8_zero();
        }
        for (int k = k0; k < k0 + step && k < d; k += 8) {
            v8 *dst = f == AK_KV_Q8 ? sum : acc;
            if (d - k >= 8) {
                v8 qk = v8_load(q + k);
                _Pragma("GCC unroll 4")
                for (int r = 0; r < R; r++)
                    dst[r] = v8_fma(dst[r], decode(f, chunk_at(f, v[r], k), chunk_back(k, cb), s[r], m[r], t), qk);
            } else {
                float qb[8] = { 0 };
                memcpy(qb, q + k, sizeof(float) * (size_t)(d - k));
                v8 qk = v8_load(qb);
                _Pragma("GCC unroll 4")
                for (int r = 0; r < R; r++) dst[r] = v8_fma(dst[r], decode_short(f, v[r], k, d - k, s[r], m[r], t), qk);
            }
        }
        if (f == AK_KV_Q8)
            _Pragma("GCC unroll 4")
            for (int r = 0; r < R; r++) acc[r] = v8_fma_n(acc[r], sum[r], s[r]);
    }
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++) {
        float x = vaddvq_f32(vaddq_f32(acc[r].a, acc[r].b));
        out[r] = f_tq(f) ? x * tq_factor(m0 + (size_t)r * ra->mstride, ra->sqrt_d) : x;
    }
}

/* acc += sum_r w[r] * vector r, for R (1 or 4) vectors as in dot_rows;
 * meta0 their group metadata converted and multiplied by w[r]. */
AK_INLINE void axpy_rows(const int f, const int R, const rows_arg *ra, const uint8_t *v0, const uint8_t *m0,
                         const float *meta0, const float *w, float *acc) {
    const int d = ra->d;
    const uint8x16x4_t *t = ra->t;
    const int G = f_group(f), step = G ? G : 8;
    const int cb = (int)f_code_bytes(f, d);
    const uint8_t *v[4];
    float32x4_t s[4], m[4], wr[4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++) {
        v[r] = v0 + (size_t)r * ra->cstride;
        s[r] = m[r] = vdupq_n_f32(0);
        wr[r] = vdupq_n_f32(f_tq(f) ? w[r] * tq_factor(m0 + (size_t)r * ra->mstride, ra->sqrt_d) : w[r]);
    }
    for (int k0 = 0, g = 0; k0 < d; k0 += step, g++) {
        if (G)   /* metadata carries the weights */
            _Pragma("GCC unroll 4")
            for (int r = 0; r < R; r++) group_param(f, meta0 + r * ra->fstride, g, &s[r], &m[r]);
        for (int k = k0; k < k0 + step && k < d; k += 8) {
            int n = d - k < 8 ? d - k : 8;
            float ab[8] = { 0 };
            if (n < 8) memcpy(ab, acc + k, sizeof(float) * (size_t)n);
            v8 a = v8_load(n == 8 ? acc + k : ab);
            _Pragma("GCC unroll 4")
            for (int r = 0; r < R; r++) {
                v8 x = n == 8 ? decode(f, chunk_at(f, v[r], k), chunk_back(k, cb), s[r], m[r], t)
                              : decode_short(f, v[r], k, n, s[r], m[r], t);
                if (f_affine(f)) a = (v8){ vaddq_f32(a.a, x.a), vaddq_f32(a.b, x.b) };
                else a = v8_fma_n(a, x, f == AK_KV_Q8 ? s[r] : wr[r]);
            }
            if (n == 8) v8_store(acc + k, a);
            else {
                v8_store(ab, a);
                memcpy(acc + k, ab, sizeof(float) * (size_t)n);
            }
        }
    }
}

#define BLOCK 16   /* vectors whose metadata is converted together */

AK_INLINE void dot_impl(const int f, const ak_kvf_vecs vs, const float *q, int d, float *out) {
    if (!valid_d(d)) return;
    const size_t stride = vs.cstride, mst = vs.mstride;
    const int n = vs.n;
    const uint8_t *p = vs.codes, *mb = vs.meta;
    const int ms = meta_count(f, d);
    float meta[f_group(f) ? BLOCK * MAXMETA : 1];
    float sqrt_d = sqrtf((float)d);
    uint8x16x4_t t = cb_table(f);
    const rows_arg ra = {.cstride = stride, .mstride = mst, .fstride = ms, .d = d, .sqrt_d = sqrt_d, .t = &t};
    for (int j0 = 0; j0 < n; j0 += BLOCK) {
        int j1 = j0 + BLOCK < n ? j0 + BLOCK : n, j = j0;
        if (f_group(f))
            for (int i = j0; i < j1; i++) load_meta(mb + (size_t)i * mst, ms, meta + (i - j0) * ms, 1.0f);
        for (; j + 4 <= j1; j += 4)
            dot_rows(f, 4, &ra, p + (size_t)j * stride, mb ? mb + (size_t)j * mst : NULL, meta + (j - j0) * ms, q,
                     out + j);
        for (; j < j1; j++)
            dot_rows(f, 1, &ra, p + (size_t)j * stride, mb ? mb + (size_t)j * mst : NULL, meta + (j - j0) * ms, q,
                     out + j);
    }
}

AK_INLINE void axpy_impl(const int f, const ak_kvf_vecs vs, const float *w, int d, float *acc) {
    if (!valid_d(d)) return;
    const size_t stride = vs.cstride, mst = vs.mstride;
    const int n = vs.n;
    const uint8_t *p = vs.codes, *mb = vs.meta;
    const int ms = meta_count(f, d);
    float meta[f_group(f) ? BLOCK * MAXMETA : 1];
    float sqrt_d = sqrtf((float)d);
    uint8x16x4_t t = cb_table(f);
    const rows_arg ra = {.cstride = stride, .mstride = mst, .fstride = ms, .d = d, .sqrt_d = sqrt_d, .t = &t};
    for (int j0 = 0; j0 < n; j0 += BLOCK) {
        int j1 = j0 + BLOCK < n ? j0 + BLOCK : n, j = j0;
        if (f_group(f))
            for (int i = j0; i < j1; i++) load_meta(mb + (size_t)i * mst, ms, meta + (i - j0) * ms, w[i]);
        for (; j + 4 <= j1; j += 4)
            axpy_rows(f, 4, &ra, p + (size_t)j * stride, mb ? mb + (size_t)j * mst : NULL, meta + (j - j0) * ms, w + j,
                      acc);
        for (; j < j1; j++)
            axpy_rows(f, 1, &ra, p + (size_t)j * stride, mb ? mb + (size_t)j * mst : NULL, meta + (j - j0) * ms, w + j,
                      acc);
    }
}

#define ENTRY(F, ID)                                                                                          \
    void ak_kvf_simd_dot_##F(const void *c, size_t cs, const void *m, size_t ms, int n, const float *q, int d, \
                             float *out) {                                                                    \
        dot_impl(ID, (ak_kvf_vecs){.codes = c, .cstride = cs, .meta = m, .mstride = ms, .n = n}, q, d, out);  \
    }                                                                                                         \
    void ak_kvf_simd_axpy_##F(const void *c, size_t cs, const void *m, size_t ms, int n, const float *w, int d, \
                              float *acc) {                                                                   \
        axpy_impl(ID, (ak_kvf_vecs){.codes = c, .cstride = cs, .meta = m, .mstride = ms, .n = n}, w, d, acc); \
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

/* tcq3: NEON has no gather for its 512-entry table; the plain C products
 * (kvformat.c), which the compiler vectorizes around the look-ups. */
void ak_kvf_simd_dot_tcq3(const void *c, size_t cs, const void *m, size_t ms, int n, const float *q, int d, float *out) {
    ak_kvf_tcq3_dot_c(c, cs, m, ms, n, q, d, out);
}
void ak_kvf_simd_axpy_tcq3(const void *c, size_t cs, const void *m, size_t ms, int n, const float *w, int d,
                           float *acc) {
    ak_kvf_tcq3_axpy_c(c, cs, m, ms, n, w, d, acc);
}

#endif
