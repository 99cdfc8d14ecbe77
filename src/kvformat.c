/* kvformat.c - KV-cache vector formats: storage layouts, quantizers, the
 * scalar reference products, the rotation of the tq formats and their
 * Lloyd-Max codebooks. The SIMD products are in kvformat_x86.c and
 * kvformat_arm.c (see kvformat_impl.h); ak_kv_format_get hands those out,
 * ak_kv_format_get_scalar the reference ones below.
 *
 * STORAGE LAYOUT
 * One stored vector is one token's key or value for one KV head of one layer:
 * d values, d even, 2 <= d <= 1024. No header: the block holding vectors
 * records their format and d. Multi-byte fields are little-endian (the code
 * assumes a little-endian host: x86-64, AArch64); "f16" is IEEE binary16.
 * Sizes are exact (no padding); vectors sit at any byte offset. Quantizers
 * are scalar C on every build, so the bytes stored for an input do not
 * depend on the machine. Inputs must be finite.
 *
 *   f32   d x f32                                                  4d bytes
 *   f16   d x f16 (round to nearest even)                          2d bytes
 *   bf16  d x bf16 (the top half of the f32, nearest even)         2d bytes
 *
 * Grouped formats cut the vector into ng = ceil(d/G) groups of G consecutive
 * values; the last group is shorter when G does not divide d (so d < G is a
 * single group of d). A vector is its code stream, then per-group metadata:
 *
 *   q8  G=32  d x int8 q, then ng x f16 s.               d + 2*ng bytes
 *             x = s*q;  s = amax/127 (rounded to f16), q = round(x/s),
 *             |q| <= 127.
 *   q4  G=32  4-bit code stream, then ng x (f16 s, f16 m). d/2 + 4*ng bytes
 *             x = m + s*q, q in 0..15; m = the group min rounded down to
 *             f16, s = (max - m)/15 rounded up to f16, q = round((x-m)/s),
 *             so [min, max] is always covered and no code clips.
 *   q2  G=16  2-bit code stream, then ng x (f16 s, f16 m). ceil(d/4) + 4*ng
 *             bytes; as q4 with q in 0..3, s = (max - m)/3.
 *
 *   tqB (B = 4, 3, 2)  B-bit code stream of d codebook indices, then f16 N.
 *             ceil(B*d/8) + 2 bytes (tq3, d=64: 24 + 2). The vector is stored
 *             in the rotated basis R (below):
 *                 (R x)[i] ~= N/sqrt(d) * c[idx_i]
 *             where c is the B-bit Lloyd-Max codebook of N(0,1) (ascending,
 *             idx 0 = most negative) and N a per-vector scale (see "norm").
 *
 * A b-bit code stream holds code i in bits [b*i, b*i + b) of the stream read
 * as one little-endian integer (bit k is bit k%8 of byte k/8); it takes
 * ceil(b*d/8) bytes. 8 codes take exactly b bytes and 16 codes 2b bytes:
 * the SIMD loops step by those.
 *
 * SPLIT STORAGE. quantize writes, and dequantize reads, a whole vector:
 * its code stream, then its metadata. Blocks keep the two apart (the code
 * streams of a head's vectors in one run, their metadata in another:
 * blockpool.h), so the products (dot, axpy) take a code pointer and a
 * metadata pointer with a stride each; a whole vector is the case
 * (p, stride, p + code bytes, stride). The products read nothing outside
 * those bytes: a SIMD load that would run past a code stream is moved back
 * to end at the stream's end and shifted.
 *
 * ROTATION (tq formats). R = H*S. S is diagonal, S[i][i] = -1 when bit 63
 * of splitmix64 output number i+1 (i = 0, 1, ...) from the seed
 * 0x6167656e746b76 ("agentkv") is set, else +1; the table `signs` below holds
 * those bits for i < 1024 (a test regenerates it). H is the normalized
 * Walsh-Hadamard transform; for d not a power of two, H is block diagonal:
 * d's binary decomposition, largest block first (96 = 64 + 32, 80 = 64 + 16,
 * 112 = 64 + 32 + 16), each block its own WHT scaled by 1/sqrt(block). Each
 * block is orthonormal, so H and R are; H = H^T = H^-1, R^-1 = R^T = S*H.
 * The rotation spreads every vector's energy over all coordinates of a block
 * so that sqrt(d) * (R x/|x|)[i] is close to N(0,1) whatever the input
 * (outlier channels included), which is what the Lloyd-Max codebook assumes.
 *
 * NORM. The per-vector scale N is not |x| but the least-squares scale of the
 * chosen codes: with y = sqrt(d) * R x / |x| and c_i = c[idx_i],
 *     N = |x| * <y, c> / <c, c>
 * i.e. N/sqrt(d) * c is the orthogonal projection of R x on the code vector.
 * Measured on 20000 Gaussian vectors (mean of |x - x^|^2 / |x|^2, which is
 * the per-coordinate MSE of the unit vector scaled to unit variance):
 *                     d=64: tq4    tq3    tq2     d=128: tq4    tq3    tq2
 *   N = |x|               .00918 .03346 .11447         .00932 .03398 .11608
 *   N = |x| sqrt(d)/|c|   .00889 .03284 .11642         .00918 .03382 .11890
 *   (reconstruction keeps the norm |x|)
 *   projection            .00886 .03256 .11291         .00915 .03352 .11530
 * Keeping the norm helps at 4 and 3 bits but hurts at 2, where |c| is
 * furthest from sqrt(d); the projection beats both at every width. It is
 * also exact for vectors whose rotated coordinates all have one magnitude (a
 * spike), and it makes quantize(dequantize(v)) == v: re-quantizing a
 * reconstruction gives back the same codes and the same N (storing |x|
 * would shrink N by |c|/sqrt(d) on every round). A zero vector stores N = 0
 * and codes 0.
 *
 * GROUPS PER TOKEN (q2). KIVI quantizes keys per channel across tokens and
 * values per token. Here every format, for keys and values alike, quantizes
 * groups along the head dimension of one token: each stored vector is then
 * self-contained, so a block is written once and never re-quantized when
 * later tokens arrive, can be shared by reference between sequences, and
 * persisted or handed off as is. Per-token groups of 16 pay 2 bits/value of
 * metadata (4 bits/value in all) to keep the outlier channels of keys from
 * spreading their range over many values.
 *
 * LLOYD-MAX. The codebooks are the fixed points of Lloyd's algorithm on the
 * N(0,1) density (ak_lloyd_max_derive); the float constants below are its
 * output, rounded (a test compares them). Expected squared error per
 * coordinate: 2 bits .1175, 3 bits .03455, 4 bits .009501.
 */
#include "kvformat.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kvformat_impl.h"
#include "util.h"

/* ------------------------------------------------------------------------ */
/* Constant tables                                                          */
/* ------------------------------------------------------------------------ */

const float ak_kvf_lm2[4] = { -1.510417609f, -0.452780035f, 0.452780035f, 1.510417609f };
const float ak_kvf_lm3[8] = { -2.151945705f, -1.343909279f, -0.756005282f, -0.245094179f,
                              0.245094179f,  0.756005282f,  1.343909279f,  2.151945705f };
const float ak_kvf_lm4[16] = { -2.732589573f, -2.069017229f, -1.618046389f, -1.256231200f,
                               -0.942340459f, -0.656759120f, -0.388048301f, -0.128395030f,
                               0.128395030f,  0.388048301f,  0.656759120f,  0.942340459f,
                               1.256231200f,  1.618046389f,  2.069017229f,  2.732589573f };

/* Bit i%64 of signs[i/64] set: S[i][i] = -1 (see ROTATION above). */
static const uint64_t signs[AK_KVF_MAX_D / 64] = {
    0x1f7886af841af02aULL, 0x9be5bc192d8fc008ULL, 0x3395c57db907c1e8ULL, 0x0c440697766d7e53ULL,
    0xebbee4e6e81ebec0ULL, 0xa5cd2ad8a60a6796ULL, 0x73d79dce38147261ULL, 0x37da94088f216eefULL,
    0xe44232f64a7b0c20ULL, 0xaba867299c7f807eULL, 0x1ddf6598f2a2bf59ULL, 0xd7158529e14f0805ULL,
    0x2245c52009b565b9ULL, 0x8d261d3d7655f8c8ULL, 0x779430791217b4feULL, 0x00944110d4aee048ULL,
};

const float *ak_lloyd_max_centroids(int bits) {
    return bits == 2 ? ak_kvf_lm2 : bits == 3 ? ak_kvf_lm3 : bits == 4 ? ak_kvf_lm4 : NULL;
}

static int valid_d(int d) { return d >= 2 && d <= AK_KVF_MAX_D && d % 2 == 0; }

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static void wr16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* IEEE half to float, inline (ak_f16_to_f32 is the same function out of
 * line; the reference products call this once per value). The exponent and
 * mantissa shifted into place read as a float 2^-112 times the value,
 * subnormals included; inf and NaN are set apart. */
static inline float h2f(uint16_t h) {
    uint32_t em = h & 0x7fffu, bits = em << 13;
    float f;
    memcpy(&f, &bits, 4);
    f *= 0x1p112f;
    memcpy(&bits, &f, 4);
    if (em >= 0x7c00u) bits = 0x7f800000u | (em & 0x3ffu) << 13;
    bits |= (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &bits, 4);
    return f;
}

/* The next f16 below / above h (h finite). */
static uint16_t f16_down(uint16_t h) { return h == 0 ? 0x8001 : (h & 0x8000) ? h + 1 : h - 1; }
static uint16_t f16_up(uint16_t h) { return h == 0x8000 ? 0x0001 : (h & 0x8000) ? h - 1 : h + 1; }
/* The largest f16 <= x and the smallest f16 >= x, for |x| <= 65504. */
static uint16_t f16_floor(float x) {
    uint16_t h = ak_f32_to_f16(x);
    return ak_f16_to_f32(h) > x ? f16_down(h) : h;
}
static uint16_t f16_ceil(float x) {
    uint16_t h = ak_f32_to_f16(x);
    return ak_f16_to_f32(h) < x ? f16_up(h) : h;
}
static float clamp_f16_range(float x) { return x > 65504.0f ? 65504.0f : x < -65504.0f ? -65504.0f : x; }

/* Writes n codes of b bits (each < 2^b) as a code stream (see the layout). */
static void pack_codes(const uint8_t *code, int n, int b, uint8_t *dst) {
    memset(dst, 0, ak_kvf_code_bytes(n, b));
    for (int i = 0; i < n; i++) {
        int bit = i * b;
        unsigned v = (unsigned)code[i] << (bit & 7);
        dst[bit >> 3] |= (uint8_t)v;
        if ((bit & 7) + b > 8) dst[(bit >> 3) + 1] |= (uint8_t)(v >> 8);
    }
}

/* Reads n codes of b bits (b <= 8) from a code stream: whole runs of 8 codes
 * (b bytes) as one integer, then the tail code by code. */
static void unpack_codes(const uint8_t *src, int n, int b, uint8_t *code) {
    unsigned mask = (1u << b) - 1;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint8_t *p = src + (size_t)(i / 8) * b;
        uint64_t w = 0;
        for (int k = 0; k < b; k++) w |= (uint64_t)p[k] << (8 * k);
        for (int k = 0; k < 8; k++) code[i + k] = (uint8_t)((w >> (b * k)) & mask);
    }
    for (; i < n; i++) {
        int bit = i * b;
        unsigned v = src[bit >> 3];
        if ((bit & 7) + b > 8) v |= (unsigned)src[(bit >> 3) + 1] << 8;
        code[i] = (uint8_t)((v >> (bit & 7)) & mask);
    }
}

/* ------------------------------------------------------------------------ */
/* Rotation                                                                 */
/* ------------------------------------------------------------------------ */

/* In-place normalized Walsh-Hadamard transform of m = 2^k values. */
static void wht(float *x, int m) {
    for (int h = 1; h < m; h <<= 1)
        for (int i = 0; i < m; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float s = 1.0f / sqrtf((float)m);
    for (int i = 0; i < m; i++) x[i] *= s;
}

/* H: one WHT per block of d's binary decomposition, largest first. */
static void wht_blocks(float *x, int d) {
    int off = 0;
    for (int m = AK_KVF_MAX_D; m >= 2; m >>= 1)
        if (d & m) {
            wht(x + off, m);
            off += m;
        }
}

static void apply_signs(float *x, int d) {
    for (int i = 0; i < d; i++)
        if ((signs[i >> 6] >> (i & 63)) & 1) x[i] = -x[i];
}

void ak_kv_rotate(float *x, int d) {
    if (!valid_d(d)) return;
    apply_signs(x, d);
    wht_blocks(x, d);
}

void ak_kv_unrotate(float *x, int d) {
    if (!valid_d(d)) return;
    wht_blocks(x, d);
    apply_signs(x, d);
}

/* ------------------------------------------------------------------------ */
/* Formats: sizes                                                           */
/* ------------------------------------------------------------------------ */

/* Per-format constants: code bits, group size (0: none), metadata bytes per
 * group (or per vector for tq), codebook. */
typedef struct {
    int bits, group, meta;
    const float *cb;
} fmt_shape;

static fmt_shape shape(ak_kv_format f) {
    switch (f) {
    case AK_KV_F32: return (fmt_shape){ 32, 0, 0, NULL };
    case AK_KV_F16:
    case AK_KV_BF16: return (fmt_shape){ 16, 0, 0, NULL };
    case AK_KV_Q8: return (fmt_shape){ 8, AK_KVF_Q8_G, 2, NULL };
    case AK_KV_Q4: return (fmt_shape){ 4, AK_KVF_Q4_G, 4, NULL };
    case AK_KV_Q2: return (fmt_shape){ 2, AK_KVF_Q2_G, 4, NULL };
    case AK_KV_TQ4: return (fmt_shape){ 4, 0, 2, ak_kvf_lm4 };
    case AK_KV_TQ3: return (fmt_shape){ 3, 0, 2, ak_kvf_lm3 };
    case AK_KV_TQ2: return (fmt_shape){ 2, 0, 2, ak_kvf_lm2 };
    default: return (fmt_shape){ 0, 0, 0, NULL };
    }
}

static size_t vec_bytes(ak_kv_format f, int d) {
    fmt_shape s = shape(f);
    size_t meta = s.group ? (size_t)ak_kvf_ngroups(d, s.group) * s.meta : (size_t)s.meta;
    return ak_kvf_code_bytes(d, s.bits) + meta;
}

/* ------------------------------------------------------------------------ */
/* Quantizers                                                               */
/* ------------------------------------------------------------------------ */

static void quant_q8(const float *x, int d, uint8_t *dst) {
    int8_t *q = (int8_t *)dst;
    uint8_t *meta = dst + d;
    for (int g0 = 0, g = 0; g0 < d; g0 += AK_KVF_Q8_G, g++) {
        int g1 = g0 + AK_KVF_Q8_G < d ? g0 + AK_KVF_Q8_G : d;
        float amax = 0;
        for (int i = g0; i < g1; i++) amax = fmaxf(amax, fabsf(x[i]));
        /* quantize against the stored (f16) scale, which reconstruction uses */
        uint16_t sh = ak_f32_to_f16(fminf(amax / 127.0f, 65504.0f));
        float s = ak_f16_to_f32(sh);
        for (int i = g0; i < g1; i++) {
            float v = s > 0 ? nearbyintf(x[i] / s) : 0.0f;
            q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
        wr16(meta + 2 * g, sh);
    }
}

/* q4 and q2: affine b-bit codes in groups of G. */
static void quant_affine(const float *x, int d, int b, int G, uint8_t *dst) {
    uint8_t code[AK_KVF_MAX_D];
    uint8_t *meta = dst + ak_kvf_code_bytes(d, b);
    float top = (float)((1 << b) - 1);
    for (int g0 = 0, g = 0; g0 < d; g0 += G, g++) {
        int g1 = g0 + G < d ? g0 + G : d;
        float mn = x[g0], mx = x[g0];
        for (int i = g0; i < g1; i++) {
            mn = fminf(mn, x[i]);
            mx = fmaxf(mx, x[i]);
        }
        uint16_t mh = f16_floor(clamp_f16_range(mn));
        float m = ak_f16_to_f32(mh);
        float s0 = (clamp_f16_range(mx) - m) / top;
        uint16_t sh = s0 > 0 ? f16_ceil(fminf(s0, 65504.0f)) : 0;
        float s = ak_f16_to_f32(sh);
        for (int i = g0; i < g1; i++) {
            float v = s > 0 ? nearbyintf((x[i] - m) / s) : 0.0f;
            code[i] = (uint8_t)(v < 0 ? 0 : v > top ? top : v);
        }
        wr16(meta + 4 * g, sh);
        wr16(meta + 4 * g + 2, mh);
    }
    pack_codes(code, d, b, dst);
}

static void quant_tq(const float *x, int d, int b, const float *cb, uint8_t *dst) {
    int K = 1 << b;
    float y[AK_KVF_MAX_D], bound[15];
    uint8_t code[AK_KVF_MAX_D];
    for (int k = 0; k + 1 < K; k++) bound[k] = 0.5f * (cb[k] + cb[k + 1]);
    double n2 = 0;
    for (int i = 0; i < d; i++) n2 += (double)x[i] * x[i];
    double n = sqrt(n2);
    uint16_t nh = 0;
    memset(code, 0, sizeof code);
    if (n > 0 && isfinite(n)) {
        memcpy(y, x, (size_t)d * sizeof(float));
        ak_kv_rotate(y, d);
        float sc = (float)(sqrt((double)d) / n);
        for (int i = 0; i < d; i++) y[i] *= sc;
        double yc = 0, cc = 0;
        for (int i = 0; i < d; i++) {
            float v = y[i];
            int k = 0;
            for (int t = 0; t + 1 < K; t++) k += v > bound[t];   /* nearest centroid */
            code[i] = (uint8_t)k;
            yc += (double)v * cb[k];
            cc += (double)cb[k] * cb[k];
        }
        nh = ak_f32_to_f16((float)fmin(n * yc / cc, 65504.0));   /* the projection (NORM above) */
    }
    uint8_t *p = dst;
    pack_codes(code, d, b, p);
    wr16(p + ak_kvf_code_bytes(d, b), nh);
}

/* Out-of-contract d (odd, < 2, > 1024) writes nothing, here and below. */
static void quantize(ak_kv_format f, const float *x, int d, void *dst) {
    uint8_t *p = dst;
    if (!valid_d(d)) return;
    switch (f) {
    case AK_KV_F32: memcpy(p, x, (size_t)d * sizeof(float)); break;
    case AK_KV_F16:
        for (int i = 0; i < d; i++) wr16(p + 2 * i, ak_f32_to_f16(x[i]));
        break;
    case AK_KV_BF16:
        for (int i = 0; i < d; i++) wr16(p + 2 * i, ak_f32_to_bf16(x[i]));
        break;
    case AK_KV_Q8: quant_q8(x, d, p); break;
    case AK_KV_Q4: quant_affine(x, d, 4, AK_KVF_Q4_G, p); break;
    case AK_KV_Q2: quant_affine(x, d, 2, AK_KVF_Q2_G, p); break;
    case AK_KV_TQ4: quant_tq(x, d, 4, ak_kvf_lm4, p); break;
    case AK_KV_TQ3: quant_tq(x, d, 3, ak_kvf_lm3, p); break;
    case AK_KV_TQ2: quant_tq(x, d, 2, ak_kvf_lm2, p); break;
    default: break;
    }
}

/* ------------------------------------------------------------------------ */
/* Decoding (stored basis) and the scalar reference products                */
/* ------------------------------------------------------------------------ */

/* y = the stored vector in its stored basis (rotated for tq formats), from
 * its code stream p and its metadata meta. */
static void decode(ak_kv_format f, const uint8_t *p, const uint8_t *meta, int d, float *y) {
    fmt_shape s = shape(f);
    uint8_t code[AK_KVF_MAX_D];
    switch (f) {
    case AK_KV_F32: memcpy(y, p, (size_t)d * sizeof(float)); break;
    case AK_KV_F16:
        for (int i = 0; i < d; i++) y[i] = h2f(ak_kvf_rd16(p + 2 * i));
        break;
    case AK_KV_BF16:
        for (int i = 0; i < d; i++) y[i] = ak_bf16_to_f32(ak_kvf_rd16(p + 2 * i));
        break;
    case AK_KV_Q8:
        for (int g0 = 0; g0 < d; g0 += s.group) {
            float sc = h2f(ak_kvf_rd16(meta + 2 * (g0 / s.group)));
            for (int i = g0; i < g0 + s.group && i < d; i++) y[i] = sc * (float)(int8_t)p[i];
        }
        break;
    case AK_KV_Q4:
    case AK_KV_Q2:
        unpack_codes(p, d, s.bits, code);
        for (int g0 = 0; g0 < d; g0 += s.group) {
            const uint8_t *gm = meta + 4 * (g0 / s.group);
            float sc = h2f(ak_kvf_rd16(gm)), mn = h2f(ak_kvf_rd16(gm + 2));
            for (int i = g0; i < g0 + s.group && i < d; i++) y[i] = mn + sc * (float)code[i];
        }
        break;
    case AK_KV_TQ4:
    case AK_KV_TQ3:
    case AK_KV_TQ2: {
        float fac = ak_kvf_tq_factor(ak_kvf_rd16(meta), d);
        unpack_codes(p, d, s.bits, code);
        for (int i = 0; i < d; i++) y[i] = fac * s.cb[code[i]];
        break;
    }
    default: memset(y, 0, (size_t)d * sizeof(float)); break;
    }
}

static void dequantize(ak_kv_format f, const void *src, int d, float *y) {
    if (!valid_d(d)) return;
    decode(f, src, (const uint8_t *)src + ak_kvf_code_bytes(d, shape(f).bits), d, y);
    if (shape(f).cb) ak_kv_unrotate(y, d);
}

static void dot_scalar(ak_kv_format f, const void *codes, size_t cstride, const void *meta, size_t mstride, int n,
                       const float *q, int d, float *out) {
    float y[AK_KVF_MAX_D];
    if (!valid_d(d)) return;
    for (int j = 0; j < n; j++) {
        decode(f, (const uint8_t *)codes + (size_t)j * cstride, meta ? (const uint8_t *)meta + (size_t)j * mstride : NULL,
               d, y);
        float s[8] = { 0 };   /* 8 chains, not one: no wait on each add (and SIMD-able) */
        int i = 0;
        for (; i + 8 <= d; i += 8)
            for (int k = 0; k < 8; k++) s[k] += q[i + k] * y[i + k];
        for (; i < d; i++) s[0] += q[i] * y[i];
        out[j] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
}

static void axpy_scalar(ak_kv_format f, const void *codes, size_t cstride, const void *meta, size_t mstride, int n,
                        const float *w, int d, float *acc) {
    float y[AK_KVF_MAX_D];
    if (!valid_d(d)) return;
    for (int j = 0; j < n; j++) {
        decode(f, (const uint8_t *)codes + (size_t)j * cstride, meta ? (const uint8_t *)meta + (size_t)j * mstride : NULL,
               d, y);
        float wj = w[j];   /* hoisted: w may alias acc as far as the compiler knows */
        for (int i = 0; i < d; i++) acc[i] += wj * y[i];
    }
}

/* The table's per-format entry points. */
#define ENTRY_POINTS(F, ID)                                                                                   \
    static size_t vec_bytes_##F(int d) { return vec_bytes(ID, d); }                                           \
    static void quantize_##F(const float *x, int d, void *dst) { quantize(ID, x, d, dst); }                   \
    static void dequantize_##F(const void *src, int d, float *y) { dequantize(ID, src, d, y); }               \
    static void dot_##F(const void *c, size_t cs, const void *m, size_t ms, int n, const float *q, int d,     \
                        float *out) {                                                                         \
        dot_scalar(ID, c, cs, m, ms, n, q, d, out);                                                           \
    }                                                                                                         \
    static void axpy_##F(const void *c, size_t cs, const void *m, size_t ms, int n, const float *w, int d,    \
                         float *acc) {                                                                        \
        axpy_scalar(ID, c, cs, m, ms, n, w, d, acc);                                                          \
    }
ENTRY_POINTS(f32, AK_KV_F32)
ENTRY_POINTS(f16, AK_KV_F16)
ENTRY_POINTS(bf16, AK_KV_BF16)
ENTRY_POINTS(q8, AK_KV_Q8)
ENTRY_POINTS(q4, AK_KV_Q4)
ENTRY_POINTS(q2, AK_KV_Q2)
ENTRY_POINTS(tq4, AK_KV_TQ4)
ENTRY_POINTS(tq3, AK_KV_TQ3)
ENTRY_POINTS(tq2, AK_KV_TQ2)
#undef ENTRY_POINTS

#define DESC_F32 "f32, 32 bits"
#define DESC_F16 "IEEE half, 16 bits"
#define DESC_BF16 "bfloat16, 16 bits"
#define DESC_Q8 "int8 symmetric, groups of 32, f16 scale: 8.5 bits"
#define DESC_Q4 "4-bit affine, groups of 32, f16 scale and min: 5 bits"
#define DESC_Q2 "2-bit affine, groups of 16, f16 scale and min: 4 bits"
#define DESC_TQ4 "Hadamard-rotated 4-bit Lloyd-Max codes, f16 norm: 4 + 16/d bits"
#define DESC_TQ3 "Hadamard-rotated 3-bit Lloyd-Max codes, f16 norm: 3 + 16/d bits"
#define DESC_TQ2 "Hadamard-rotated 2-bit Lloyd-Max codes, f16 norm: 2 + 16/d bits"

#define ROW(F, DESC, ROT, DOT, AXPY) { #F, DESC, ROT, vec_bytes_##F, quantize_##F, dequantize_##F, DOT, AXPY }
#define SCALAR_ROW(F, DESC, ROT) ROW(F, DESC, ROT, dot_##F, axpy_##F)

static const ak_kv_format_info scalar_table[AK_KV_NFORMATS] = {
    SCALAR_ROW(f32, DESC_F32, 0), SCALAR_ROW(f16, DESC_F16, 0), SCALAR_ROW(bf16, DESC_BF16, 0),
    SCALAR_ROW(q8, DESC_Q8, 0),   SCALAR_ROW(q4, DESC_Q4, 0),   SCALAR_ROW(q2, DESC_Q2, 0),
    SCALAR_ROW(tq4, DESC_TQ4, 1), SCALAR_ROW(tq3, DESC_TQ3, 1), SCALAR_ROW(tq2, DESC_TQ2, 1),
};

#ifdef AK_KVF_SIMD
#define SIMD_ROW(F, DESC, ROT) ROW(F, DESC, ROT, ak_kvf_simd_dot_##F, ak_kvf_simd_axpy_##F)
static const ak_kv_format_info simd_table[AK_KV_NFORMATS] = {
    SIMD_ROW(f32, DESC_F32, 0), SIMD_ROW(f16, DESC_F16, 0), SIMD_ROW(bf16, DESC_BF16, 0),
    SIMD_ROW(q8, DESC_Q8, 0),   SIMD_ROW(q4, DESC_Q4, 0),   SIMD_ROW(q2, DESC_Q2, 0),
    SIMD_ROW(tq4, DESC_TQ4, 1), SIMD_ROW(tq3, DESC_TQ3, 1), SIMD_ROW(tq2, DESC_TQ2, 1),
};
#else
#define simd_table scalar_table
#endif

/* ------------------------------------------------------------------------ */
/* Public API                                                               */
/* ------------------------------------------------------------------------ */

const ak_kv_format_info *ak_kv_format_get(ak_kv_format f) {
    return (unsigned)f < AK_KV_NFORMATS ? &simd_table[f] : NULL;
}

const ak_kv_format_info *ak_kv_format_get_scalar(ak_kv_format f) {
    return (unsigned)f < AK_KV_NFORMATS ? &scalar_table[f] : NULL;
}

const char *ak_kv_format_backend(void) {
#ifdef AK_KVF_SIMD
    return ak_kvf_simd_name;
#else
    return "scalar";
#endif
}

int ak_kv_format_parse(const char *name, ak_kv_format *out) {
    if (!name) return -1;
    for (int f = 0; f < AK_KV_NFORMATS; f++)
        if (strcmp(name, scalar_table[f].name) == 0) {
            if (out) *out = (ak_kv_format)f;
            return 0;
        }
    return -1;
}

const char *ak_kv_format_names(void) { return "f32, f16, bf16, q8, q4, q2, tq4, tq3, tq2"; }

int ak_kv_format_supports(ak_kv_format f, int d) { return (unsigned)f < AK_KV_NFORMATS && valid_d(d); }

int ak_kv_format_centers(ak_kv_format f) {
    return f == AK_KV_Q4 || f == AK_KV_Q2 || f == AK_KV_TQ4 || f == AK_KV_TQ3 || f == AK_KV_TQ2;
}

double ak_kv_format_bits(ak_kv_format f, int d) {
    if (!ak_kv_format_supports(f, d)) return 0;
    return 8.0 * (double)vec_bytes(f, d) / d;
}

/* ------------------------------------------------------------------------ */
/* Lloyd-Max derivation                                                     */
/* ------------------------------------------------------------------------ */

static double npdf(double x) { return isinf(x) ? 0 : exp(-0.5 * x * x) / sqrt(2 * M_PI); }
static double x_npdf(double x) { return isinf(x) ? 0 : x * npdf(x); }

/* P(a < X < b) for X ~ N(0,1), from whichever tail keeps its precision. */
static double nprob(double a, double b) {
    const double r = M_SQRT1_2;
    if (a >= 0) return 0.5 * (erfc(a * r) - erfc(b * r));
    if (b <= 0) return 0.5 * (erfc(-b * r) - erfc(-a * r));
    return 1 - 0.5 * erfc(-a * r) - 0.5 * erfc(b * r);
}

/* The p-quantile of N(0,1), by bisection (used once, for a starting point). */
static double nquantile(double p) {
    double lo = -40, hi = 40;
    for (int i = 0; i < 200; i++) {
        double mid = 0.5 * (lo + hi);
        if (nprob(-INFINITY, mid) < p) lo = mid; else hi = mid;
    }
    return 0.5 * (lo + hi);
}

int ak_lloyd_max_derive(int bits, double *centroids, double *mse) {
    if (bits < 1 || bits > 8) return -1;
    int K = 1 << bits;
    double *c = centroids, t[257];
    /* Start at the optimal high-resolution density (quantiles of N(0,3)):
     * Lloyd's iteration converges linearly, and slowly for many levels. */
    for (int k = 0; k < K; k++) c[k] = sqrt(3.0) * nquantile((k + 0.5) / K);
    t[0] = -INFINITY;
    t[K] = INFINITY;
    for (int it = 0; it < 1000000; it++) {
        for (int k = 1; k < K; k++) t[k] = 0.5 * (c[k - 1] + c[k]);   /* nearest-centroid cells */
        double moved = 0;
        for (int k = 0; k < K; k++) {   /* each centroid to its cell's conditional mean */
            double nc = (npdf(t[k]) - npdf(t[k + 1])) / nprob(t[k], t[k + 1]);
            moved = fmax(moved, fabs(nc - c[k]));
            c[k] = nc;
        }
        if (moved < 1e-10) break;
    }
    for (int k = 1; k < K; k++) t[k] = 0.5 * (c[k - 1] + c[k]);
    /* E[(X - c)^2] over each cell, from int x^2 phi = P + a phi(a) - b phi(b)
     * and int x phi = phi(a) - phi(b). */
    double e = 0;
    for (int k = 0; k < K; k++) {
        double p = nprob(t[k], t[k + 1]);
        double m1 = npdf(t[k]) - npdf(t[k + 1]);
        double m2 = p + x_npdf(t[k]) - x_npdf(t[k + 1]);
        e += m2 - 2 * c[k] * m1 + c[k] * c[k] * p;
    }
    if (mse) *mse = e;
    return 0;
}
