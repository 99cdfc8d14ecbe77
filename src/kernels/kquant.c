/* kquant.c - see kquant.h. Formats, quantizers (our own fits), dequantizers
 * and the scalar reference back end for Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K.
 *
 * Quantizers. All fit from f32 rows, round to nearest, and store halves
 * rounded to nearest even.
 *   Q4_1/Q5_1: min and max of the block: m = min, d = (max - min) / nmax.
 *   Q5_0: as Q4_0, the element of largest magnitude (sign kept) maps to -16.
 *   Q4_K/Q5_K: per sub-block of 32, x ~ s * q - m with q in [0, nmax] and
 *     s, m >= 0, fitted by alternating rounding and a least-squares solve of
 *     (s, m) for the current q (a few rounds from the min/max start; the
 *     best squared error wins). The super-block then stores d = max(s)/63 and
 *     dmin = max(m)/63 as halves, 6-bit sc = round(s/d), mn = round(m/dmin),
 *     and q is re-rounded against the stored (quantized) scale and min.
 *   Q6_K: per sub-block of 16, a signed scale s with q in [-32, 31]: start
 *     from the largest-magnitude element mapping to -32, then alternate
 *     rounding and the least-squares s = sum(x q) / sum(q q); d = max|s|/127
 *     as a half, int8 sc = round(s/d), q re-rounded against d * sc.
 */
#include "kernels/kquant.h"

#include <math.h>
#include <stdlib.h>

#include "base/util.h"

#define Q4_1_BYTES 20
#define Q5_0_BYTES 22
#define Q5_1_BYTES 24
#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q6_K_BYTES 210

/* 1 for the types of this module. */
int ak_kq_type(uint32_t t) {
    switch (t) {
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
        return 1;
    default:
        return 0;
    }
}

/* 1 for the 256-element super-block types. */
int ak_kq_is_k(uint32_t t) {
    return t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K || t == GGML_TYPE_Q6_K;
}

/* Bytes of one block of t; 0 for types outside this module. */
static size_t block_bytes(uint32_t t) {
    switch (t) {
    case GGML_TYPE_Q4_1: return Q4_1_BYTES;
    case GGML_TYPE_Q5_0: return Q5_0_BYTES;
    case GGML_TYPE_Q5_1: return Q5_1_BYTES;
    case GGML_TYPE_Q4_K: return Q4_K_BYTES;
    case GGML_TYPE_Q5_K: return Q5_K_BYTES;
    case GGML_TYPE_Q6_K: return Q6_K_BYTES;
    default: return 0;
    }
}

/* Bytes of a row of n elements; 0 for other types. */
size_t ak_kq_row_bytes(uint32_t t, int64_t n) {
    int64_t be = ak_kq_is_k(t) ? AK_QKK : AK_QK;
    return (size_t)(n / be) * block_bytes(t);
}

/* Stores v as a little-endian IEEE half (round to nearest even) / reads one. */
static void put_half(uint8_t *p, float v) {
    uint16_t h = ak_f32_to_f16(v);
    memcpy(p, &h, 2);
}
static float get_half(const uint8_t *p) { return ak_f16_to_f32(ak_load_u16(p)); }

/* v clamped to [lo, hi]. */
static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ------------------------------------------------------------------------ */
/* 32-element blocks                                                        */
/* ------------------------------------------------------------------------ */

/* Q4_1 (nmax 15) and Q5_1 (nmax 31): x = d q + m, m = block min. */
static void quantize_block_min(const float *x, int nmax, uint8_t *dst, uint8_t q[32]) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < AK_QK; i++) { lo = fminf(lo, x[i]); hi = fmaxf(hi, x[i]); }
    float d = (hi - lo) / (float)nmax;
    put_half(dst, d);
    put_half(dst + 2, lo);
    /* round against the stored values, so the error is that of the format */
    float dh = get_half(dst), mh = get_half(dst + 2), id = dh != 0 ? 1.0f / dh : 0.0f;
    for (int i = 0; i < AK_QK; i++) q[i] = (uint8_t)clampi((int)lroundf((x[i] - mh) * id), 0, nmax);
}

/* 32 values 0..15 (low 4 bits used) into 16 bytes: j low, j + 16 high. */
static void pack_nibbles(const uint8_t q[32], uint8_t *qs) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 15) | ((q[j + 16] & 15) << 4));
}

/* Bit 4 of each of 32 values into a little-endian u32 (bit j: value j). */
static void pack_qh32(const uint8_t q[32], uint8_t *qh) {
    uint32_t h = 0;
    for (int j = 0; j < 32; j++) h |= (uint32_t)((q[j] >> 4) & 1) << j;
    for (int i = 0; i < 4; i++) qh[i] = (uint8_t)(h >> (8 * i));   /* little-endian */
}

/* The little-endian u32 at p. */
static uint32_t get_qh32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Rows of n floats (n a multiple of 32) as Q4_1 / Q5_1 blocks. */
static void quantize_q4_1(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / AK_QK; b++, x += AK_QK, dst += Q4_1_BYTES) {
        uint8_t q[32];
        quantize_block_min(x, 15, dst, q);
        pack_nibbles(q, dst + 4);
    }
}

static void quantize_q5_1(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / AK_QK; b++, x += AK_QK, dst += Q5_1_BYTES) {
        uint8_t q[32];
        quantize_block_min(x, 31, dst, q);
        pack_qh32(q, dst + 4);
        pack_nibbles(q, dst + 8);
    }
}

/* Q5_0: the largest-magnitude element (sign kept) maps to q - 16 = -16. */
static void quantize_q5_0(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / AK_QK; b++, x += AK_QK, dst += Q5_0_BYTES) {
        float amax = 0, max = 0;
        for (int i = 0; i < AK_QK; i++)
            if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
        put_half(dst, max / -16.0f);
        float dh = get_half(dst), id = dh != 0 ? 1.0f / dh : 0.0f;
        uint8_t q[32];
        for (int i = 0; i < AK_QK; i++) q[i] = (uint8_t)clampi((int)lroundf(x[i] * id) + 16, 0, 31);
        pack_qh32(q, dst + 2);
        pack_nibbles(q, dst + 6);
    }
}

/* ------------------------------------------------------------------------ */
/* K super-blocks                                                           */
/* ------------------------------------------------------------------------ */

/* Fits x[0..n) ~ s * q - m, q in [0, nmax], s >= 0, m >= 0 (see top). */
static void fit_scale_min(const float *x, int n, int nmax, float *s_out, float *m_out) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) { lo = fminf(lo, x[i]); hi = fmaxf(hi, x[i]); }
    if (lo > 0) lo = 0;   /* the format's offset -m can only lower values */
    if (hi <= lo) { *s_out = 0; *m_out = -lo; return; }
    float s = (hi - lo) / (float)nmax, m = -lo;
    float best_s = s, best_m = m, best_err = INFINITY;
    for (int it = 0; it < 6; it++) {
        double sq = 0, sqq = 0, sx = 0, sqx = 0, err = 0;
        float is = 1.0f / s;
        int q[32];
        for (int i = 0; i < n; i++) {
            q[i] = clampi((int)lroundf((x[i] + m) * is), 0, nmax);
            double e = (double)s * q[i] - m - x[i];
            err += e * e;
            sq += q[i]; sqq += (double)q[i] * q[i]; sx += x[i]; sqx += (double)q[i] * x[i];
        }
        if (err < best_err) { best_err = (float)err; best_s = s; best_m = m; }
        /* least squares for (a, b) in x = a q + b given q; b = -m <= 0 */
        double det = n * sqq - sq * sq;
        if (det <= 0) break;
        double a = (n * sqx - sq * sx) / det, bb = (sqq * sx - sq * sqx) / det;
        if (bb > 0) { bb = 0; a = sqq > 0 ? sqx / sqq : 0; }
        if (!(a > 0)) break;
        s = (float)a; m = (float)-bb;
    }
    *s_out = best_s; *m_out = best_m;
}

/* Q4_K (nmax 15, qh NULL) and Q5_K (nmax 31): scales, mins and q of one
 * super-block. dst points at the block; qs at its nibbles. */
static void quantize_k45_block(const float *x, int nmax, uint8_t *dst, uint8_t *qh, uint8_t *qs) {
    float s[8], m[8], smax = 0, mmax = 0;
    for (int j = 0; j < 8; j++) {
        fit_scale_min(x + 32 * j, 32, nmax, &s[j], &m[j]);
        smax = fmaxf(smax, s[j]); mmax = fmaxf(mmax, m[j]);
    }
    put_half(dst, smax / 63.0f);
    put_half(dst + 2, mmax / 63.0f);
    float d = get_half(dst), dmin = get_half(dst + 2);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(d > 0 ? clampi((int)lroundf(s[j] / d), 0, 63) : 0);
        mn[j] = (uint8_t)(dmin > 0 ? clampi((int)lroundf(m[j] / dmin), 0, 63) : 0);
    }
    uint8_t *s12 = dst + 4;
    for (int j = 0; j < 4; j++) {
        s12[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s12[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        s12[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
    uint8_t q[AK_QKK];
    for (int j = 0; j < 8; j++) {
        float ds = d * sc[j], dm = dmin * mn[j], ids = ds > 0 ? 1.0f / ds : 0.0f;
        for (int i = 0; i < 32; i++)
            q[32 * j + i] = (uint8_t)clampi((int)lroundf((x[32 * j + i] + dm) * ids), 0, nmax);
    }
    if (qh) memset(qh, 0, 32);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            uint8_t a = q[64 * c + l], b = q[64 * c + 32 + l];
            qs[32 * c + l] = (uint8_t)((a & 15) | ((b & 15) << 4));
            if (qh) qh[l] |= (uint8_t)(((a >> 4) & 1) << (2 * c) | ((b >> 4) & 1) << (2 * c + 1));
        }
}

/* Rows of n floats (n a multiple of 256) as Q4_K / Q5_K super-blocks. */
static void quantize_q4_k(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / AK_QKK; b++, x += AK_QKK, dst += Q4_K_BYTES)
        quantize_k45_block(x, 15, dst, NULL, dst + 16);
}

static void quantize_q5_k(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / AK_QKK; b++, x += AK_QKK, dst += Q5_K_BYTES)
        quantize_k45_block(x, 31, dst, dst + 16, dst + 48);
}

/* Signed scale for 16 values with q in [-32, 31] (see top). */
static float fit_scale_6(const float *x) {
    float amax = 0, max = 0;
    for (int i = 0; i < 16; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
    if (amax == 0) return 0;
    float s = max / -32.0f, best = s, best_err = INFINITY;
    for (int it = 0; it < 4; it++) {
        double sxq = 0, sqq = 0, err = 0;
        for (int i = 0; i < 16; i++) {
            int q = clampi((int)lroundf(x[i] / s), -32, 31);
            double e = (double)s * q - x[i];
            err += e * e; sxq += (double)x[i] * q; sqq += (double)q * q;
        }
        if (err < best_err) { best_err = (float)err; best = s; }
        if (sqq <= 0 || sxq == 0) break;
        s = (float)(sxq / sqq);
    }
    return best;
}

/* Rows of n floats (n a multiple of 256) as Q6_K super-blocks (see top). */
static void quantize_q6_k(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / AK_QKK; b++, x += AK_QKK, dst += Q6_K_BYTES) {
        float s[16], smax = 0;
        for (int j = 0; j < 16; j++) { s[j] = fit_scale_6(x + 16 * j); smax = fmaxf(smax, fabsf(s[j])); }
        put_half(dst + 208, smax / 127.0f);
        float d = get_half(dst + 208);
        int8_t *sc = (int8_t *)(dst + 192);
        uint8_t u[AK_QKK];
        for (int j = 0; j < 16; j++) {
            sc[j] = (int8_t)(d > 0 ? clampi((int)lroundf(s[j] / d), -127, 127) : 0);
            float ds = d * sc[j], ids = ds != 0 ? 1.0f / ds : 0.0f;
            for (int i = 0; i < 16; i++)
                u[16 * j + i] = (uint8_t)(clampi((int)lroundf(x[16 * j + i] * ids), -32, 31) + 32);
        }
        uint8_t *ql = dst, *qh = dst + 128;
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *v = u + 128 * h + l;
                ql[64 * h + l] = (uint8_t)((v[0] & 15) | ((v[64] & 15) << 4));
                ql[64 * h + 32 + l] = (uint8_t)((v[32] & 15) | ((v[96] & 15) << 4));
                qh[32 * h + l] = (uint8_t)((v[0] >> 4) | ((v[32] >> 4) << 2) | ((v[64] >> 4) << 4) | ((v[96] >> 4) << 6));
            }
    }
}

/* Writes n floats as `type` (n a multiple of its block). */
void ak_kq_quantize_row(uint32_t type, const float *x, void *dst, int64_t n) {
    uint8_t *d = dst;
    switch (type) {
    case GGML_TYPE_Q4_1: quantize_q4_1(x, d, n); break;
    case GGML_TYPE_Q5_0: quantize_q5_0(x, d, n); break;
    case GGML_TYPE_Q5_1: quantize_q5_1(x, d, n); break;
    case GGML_TYPE_Q4_K: quantize_q4_k(x, d, n); break;
    case GGML_TYPE_Q5_K: quantize_q5_k(x, d, n); break;
    case GGML_TYPE_Q6_K: quantize_q6_k(x, d, n); break;
    default: break;
    }
}

/* ------------------------------------------------------------------------ */
/* Dequantizers: the formats' definitions                                   */
/* ------------------------------------------------------------------------ */

/* Reads a row of `type` back as n floats. */
void ak_kq_dequantize_row(uint32_t type, const void *src, float *y, int64_t n) {
    const uint8_t *s = src;
    switch (type) {
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: {
        const size_t bb = block_bytes(type);
        for (int64_t b = 0; b < n / AK_QK; b++, s += bb, y += AK_QK) {
            float d = get_half(s), m = 0, off = 0;
            const uint8_t *qs;
            uint32_t qh = 0;
            if (type == GGML_TYPE_Q4_1) { m = get_half(s + 2); qs = s + 4; }
            else if (type == GGML_TYPE_Q5_1) { m = get_half(s + 2); qh = get_qh32(s + 4); qs = s + 8; }
            else { qh = get_qh32(s + 2); qs = s + 6; off = 16; }
            for (int j = 0; j < 16; j++) {
                int lo = (qs[j] & 15) | (int)((qh >> j) & 1) << 4;
                int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
                y[j] = d * ((float)lo - off) + m;
                y[j + 16] = d * ((float)hi - off) + m;
            }
        }
        break;
    }
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: {
        const int q5 = type == GGML_TYPE_Q5_K;
        const size_t bb = block_bytes(type);
        for (int64_t b = 0; b < n / AK_QKK; b++, s += bb, y += AK_QKK) {
            float d = get_half(s), dmin = get_half(s + 2);
            uint8_t sc[8], mn[8];
            ak_kq_scales_k4(s + 4, sc, mn);
            const uint8_t *qh = s + 16, *qs = s + (q5 ? 48 : 16);
            for (int c = 0; c < 4; c++)
                for (int l = 0; l < 32; l++) {
                    int a = qs[32 * c + l] & 15, hb = qs[32 * c + l] >> 4;
                    if (q5) { a |= ((qh[l] >> (2 * c)) & 1) << 4; hb |= ((qh[l] >> (2 * c + 1)) & 1) << 4; }
                    y[64 * c + l] = d * sc[2 * c] * (float)a - dmin * mn[2 * c];
                    y[64 * c + 32 + l] = d * sc[2 * c + 1] * (float)hb - dmin * mn[2 * c + 1];
                }
        }
        break;
    }
    case GGML_TYPE_Q6_K:
        for (int64_t b = 0; b < n / AK_QKK; b++, s += Q6_K_BYTES, y += AK_QKK) {
            float d = get_half(s + 208);
            const int8_t *sc = (const int8_t *)(s + 192);
            for (int e = 0; e < AK_QKK; e++) {
                int h = e / 128, k = (e % 128) / 32, l = e % 32;
                int lo = (s[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15;
                int hi = (s[128 + 32 * h + l] >> (2 * k)) & 3;
                y[e] = d * sc[e / 16] * (float)((lo | hi << 4) - 32);
            }
        }
        break;
    default: break;
    }
}

/* ------------------------------------------------------------------------ */
/* Activations                                                              */
/* ------------------------------------------------------------------------ */

/* XQ row bytes: K types, one ak_xq_k per super-block; 32-block types, cols
 * int8, then per block d, then per block s = d * sum(q). */
size_t ak_kq_xq_row_bytes(uint32_t wtype, int64_t cols) {
    if (ak_kq_is_k(wtype)) return (size_t)(cols / AK_QKK) * sizeof(ak_xq_k);
    return ak_round64((size_t)cols + (size_t)(cols / AK_QK) * 8);
}

/* d = amax/127 over n values, q = round-half-even(x * (1/d)); returns d and
 * writes q. */
static float quant8(const float *x, int n, int8_t *q) {
    float amax = 0;
    for (int i = 0; i < n; i++) {   /* not fmaxf: GCC calls libm for it */
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    for (int i = 0; i < n; i++) q[i] = (int8_t)nearbyintf(x[i] * id);
    return d;
}

/* Quantizes one token's activations for weights of wtype. */
void ak_kq_quantize_x(uint32_t wtype, const float *x, void *dst, int64_t cols) {
    if (ak_kq_is_k(wtype)) {
        ak_xq_k *r = dst;
        for (int64_t b = 0; b < cols / AK_QKK; b++, x += AK_QKK, r++) {
            r->d = quant8(x, AK_QKK, r->q);
            for (int i = 0; i < 16; i++) {
                int s = 0;
                for (int k = 0; k < 16; k++) s += r->q[16 * i + k];
                r->bsums[i] = (int16_t)s;
            }
            memset(r->pad_, 0, sizeof r->pad_);
        }
        return;
    }
    const int64_t nb = cols / AK_QK;
    int8_t *q = dst;
    float *ds = (float *)(q + cols), *ss = ds + nb;
    for (int64_t b = 0; b < nb; b++) {
        ds[b] = quant8(x + b * AK_QK, AK_QK, q + b * AK_QK);
        int s = 0;
        for (int i = 0; i < AK_QK; i++) s += q[b * AK_QK + i];
        ss[b] = ds[b] * (float)s;
    }
}

/* ------------------------------------------------------------------------ */
/* Scalar back end                                                          */
/* ------------------------------------------------------------------------ */

/* dot of one row of a 32-block type with its XQ (q, d, s arrays). */
static float dot32(uint32_t t, const uint8_t *w, const int8_t *q, const float *ds, const float *ss, int64_t nb) {
    const size_t bb = block_bytes(t);
    float sum = 0;
    for (int64_t b = 0; b < nb; b++, w += bb, q += AK_QK) {
        float d = get_half(w), m = 0;
        const uint8_t *qs;
        uint32_t qh = 0;
        if (t == GGML_TYPE_Q4_1) { m = get_half(w + 2); qs = w + 4; }
        else if (t == GGML_TYPE_Q5_1) { m = get_half(w + 2); qh = get_qh32(w + 4); qs = w + 8; }
        else { qh = get_qh32(w + 2); qs = w + 6; }
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 15) | (int)((qh >> j) & 1) << 4;
            int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            isum += lo * q[j] + hi * q[j + 16];
        }
        /* unsigned q; Q5_0's offset 16 comes off with the activation sum */
        sum += d * ds[b] * (float)isum + (t == GGML_TYPE_Q5_0 ? -16.0f * d : m) * ss[b];
    }
    return sum;
}

/* dot of one row of a K type with its XQ records. */
static float dotk(uint32_t t, const uint8_t *w, const ak_xq_k *x, int64_t nsb) {
    const size_t bb = block_bytes(t);
    float sum = 0;
    for (int64_t b = 0; b < nsb; b++, w += bb, x++) {
        int isum = 0, msum = 0;
        float d, dmin;
        if (t == GGML_TYPE_Q6_K) {
            const int8_t *sc = (const int8_t *)(w + 192);
            d = dmin = get_half(w + 208);
            for (int e = 0; e < AK_QKK; e++) {
                int h = e / 128, k = (e % 128) / 32, l = e % 32;
                int lo = (w[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15;
                int hi = (w[128 + 32 * h + l] >> (2 * k)) & 3;
                isum += sc[e / 16] * (lo | hi << 4) * x->q[e];
            }
            for (int j = 0; j < 16; j++) msum += 32 * sc[j] * x->bsums[j];
        } else {
            const int q5 = t == GGML_TYPE_Q5_K;
            uint8_t sc[8], mn[8];
            d = get_half(w); dmin = get_half(w + 2);
            ak_kq_scales_k4(w + 4, sc, mn);
            const uint8_t *qh = w + 16, *qs = w + (q5 ? 48 : 16);
            for (int c = 0; c < 4; c++) {
                int ia = 0, ib = 0;
                for (int l = 0; l < 32; l++) {
                    int a = qs[32 * c + l] & 15, hb = qs[32 * c + l] >> 4;
                    if (q5) { a |= ((qh[l] >> (2 * c)) & 1) << 4; hb |= ((qh[l] >> (2 * c + 1)) & 1) << 4; }
                    ia += a * x->q[64 * c + l];
                    ib += hb * x->q[64 * c + 32 + l];
                }
                isum += sc[2 * c] * ia + sc[2 * c + 1] * ib;
            }
            for (int j = 0; j < 8; j++) msum += mn[j] * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
        }
        sum += x->d * (d * (float)isum - dmin * (float)msum);
    }
    return sum;
}

/* kernels_backend.h's mm_q contract, one row and token at a time. */
static void scalar_mm_q(const ak_mm_args *a) {
    const uint32_t wtype = a->wtype;
    const int64_t cols = a->cols;
    for (int64_t t = a->t0; t < a->t1; t++) {
        const uint8_t *x = a->xq + (size_t)t * a->xqs;
        for (int64_t r = a->r0; r < a->r1; r++) {
            const uint8_t *w = a->W + (size_t)r * a->wrb;
            if (ak_kq_is_k(wtype)) {
                a->Y[t * a->ldy + r] = dotk(wtype, w, (const ak_xq_k *)x, cols / AK_QKK);
            } else {
                const int64_t nb = cols / AK_QK;
                const float *ds = (const float *)(x + cols);
                a->Y[t * a->ldy + r] = dot32(wtype, w, (const int8_t *)x, ds, ds + nb, nb);
            }
        }
    }
}

const ak_kernel_backend ak_kq_backend_scalar = {
    .name = "scalar", .xq_row_bytes = ak_kq_xq_row_bytes, .quantize_x = ak_kq_quantize_x, .mm_q = scalar_mm_q,
};
