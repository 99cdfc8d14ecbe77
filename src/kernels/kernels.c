/* kernels.c - see kernels.h. This file holds the public entry points, the
 * scalar reference code (the "scalar back end") and the threaded driver of
 * ak_matmul. The SIMD loops live in kernels_x86.c and kernels_arm.c behind
 * the small interface of kernels_backend.h.
 *
 * Quantized products. Q8_0 and Q4_0 weights are multiplied with activations
 * that are themselves quantized to 8-bit blocks of 32 (per block scale
 * dx = amax/127, q = round-half-even(x/dx)), once per call. A block then
 * contributes dw * dx * sum(qw * qx) with an exact integer inner sum, which
 * is what makes the SIMD code fast (int8 dot product instructions). Every back
 * end quantizes activations with the same arithmetic, so the scalar and SIMD
 * results differ only in the order of float additions.
 *
 * Q4_1, Q5_0, Q5_1 and the K-quants (Q4_K, Q5_K, Q6_K) live in kquant.c and
 * kernels_kquant_*.c, with their own activation layouts; backend_for() hands
 * them their back end (declared in kernels_backend.h), and the driver below
 * is shared.
 */
#include "kernels/kernels_backend.h"
#include "kernels/kernels_impl.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "base/util.h"

/* ------------------------------------------------------------------------ */
/* Formats                                                                  */
/* ------------------------------------------------------------------------ */

/* 1 for the weight types this file computes with. */
int ak_wtype_supported(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16:
    case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0:
        return 1;
    default:
        return ak_kq_type(type);   /* Q4_1, Q5_0, Q5_1, K-quants: kquant.c */
    }
}

/* Bytes of a row of n elements; 0 for an unsupported type. */
size_t ak_row_bytes(uint32_t type, int64_t n) {
    switch (type) {
    case GGML_TYPE_F32: return (size_t)n * 4;
    case GGML_TYPE_F16: case GGML_TYPE_BF16: return (size_t)n * 2;
    case GGML_TYPE_Q8_0: return (size_t)(n / AK_QK) * AK_Q8_0_BYTES;
    case GGML_TYPE_Q4_0: return (size_t)(n / AK_QK) * AK_Q4_0_BYTES;
    default: return ak_kq_row_bytes(type, n);
    }
}

static int is_quantized(uint32_t type) {
    return type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0 || ak_kq_type(type);
}

/* The back end ak_matmul and ak_vec_dot use. */
static const ak_kernel_backend *simd_backend(void) {
#if defined(AK_SIMD_AVX512) || defined(AK_SIMD_AVX2) || defined(AK_SIMD_NEON)
    return &ak_backend_simd;
#else
    return &ak_backend_scalar;
#endif
}

/* "avx512", "avx2", "neon" or "scalar". */
const char *ak_simd_name(void) { return simd_backend()->name; }

/* ------------------------------------------------------------------------ */
/* Weight quantizers (llama.cpp's reference arithmetic)                     */
/* ------------------------------------------------------------------------ */

/* Q8_0: d = amax / 127, q = roundf(x / d) (ties away from zero, like the
 * reference), so |q| <= 127. */
static void quantize_row_q8_0(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / AK_QK; b++, x += AK_QK, dst += AK_Q8_0_BYTES) {
        float amax = 0;
        for (int i = 0; i < AK_QK; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t dh = ak_f32_to_f16(d);
        memcpy(dst, &dh, 2);
        for (int i = 0; i < AK_QK; i++) dst[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
    }
}

/* Q4_0: the element of largest magnitude, sign kept, maps to -8:
 * d = max / -8, q = min(15, trunc(x / d + 8.5)), i.e. round to nearest. */
static void quantize_row_q4_0(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / AK_QK; b++, x += AK_QK, dst += AK_Q4_0_BYTES) {
        float amax = 0, max = 0;
        for (int i = 0; i < AK_QK; i++) {
            if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
        }
        float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t dh = ak_f32_to_f16(d);
        memcpy(dst, &dh, 2);
        for (int j = 0; j < AK_QK / 2; j++) {
            int lo = (int)(x[j] * id + 8.5f), hi = (int)(x[j + 16] * id + 8.5f);
            if (lo > 15) lo = 15;
            if (hi > 15) hi = 15;
            dst[2 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

/* Converts n floats to `type` rows (n a multiple of 32 for Q8_0/Q4_0).
 * Unsupported types write nothing. */
void ak_quantize_row(uint32_t type, const float *x, void *dst, int64_t n) {
    uint8_t *d = dst;
    switch (type) {
    case GGML_TYPE_F32: memcpy(dst, x, (size_t)n * 4); break;
    case GGML_TYPE_F16: simd_backend()->f32_to_f16(x, (uint16_t *)dst, n); break;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = ak_f32_to_bf16(x[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        break;
    case GGML_TYPE_Q8_0: quantize_row_q8_0(x, d, n); break;
    case GGML_TYPE_Q4_0: quantize_row_q4_0(x, d, n); break;
    default: ak_kq_quantize_row(type, x, dst, n); break;
    }
}

/* Converts a row of `type` back to n floats. Unsupported types write nothing. */
void ak_dequantize_row(uint32_t type, const void *src, float *y, int64_t n) {
    const uint8_t *s = src;
    switch (type) {
    case GGML_TYPE_F32: memcpy(y, src, (size_t)n * 4); break;
    case GGML_TYPE_F16: simd_backend()->f16_to_f32((const uint16_t *)src, y, n); break;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) y[i] = ak_bf16_to_f32(ak_load_u16(s + 2 * i));
        break;
    case GGML_TYPE_Q8_0:
        for (int64_t b = 0; b < n / AK_QK; b++, s += AK_Q8_0_BYTES, y += AK_QK) {
            float d = ak_f16_to_f32(ak_load_u16(s));
            for (int i = 0; i < AK_QK; i++) y[i] = d * (float)(int8_t)s[2 + i];
        }
        break;
    case GGML_TYPE_Q4_0:
        for (int64_t b = 0; b < n / AK_QK; b++, s += AK_Q4_0_BYTES, y += AK_QK) {
            float d = ak_f16_to_f32(ak_load_u16(s));
            for (int j = 0; j < AK_QK / 2; j++) {
                y[j] = d * (float)((s[2 + j] & 15) - 8);
                y[j + 16] = d * (float)((s[2 + j] >> 4) - 8);
            }
        }
        break;
    default: ak_kq_dequantize_row(type, src, y, n); break;
    }
}

/* ------------------------------------------------------------------------ */
/* Scalar back end                                                          */
/* ------------------------------------------------------------------------ */

/* XQ row (scalar layout): cols int8 quants, then one float scale per block. */
static size_t scalar_xq_row_bytes(uint32_t wtype, int64_t cols) {
    (void)wtype;
    return ak_round64((size_t)cols + (size_t)(cols / AK_QK) * sizeof(float));
}

static void scalar_quantize_x(uint32_t wtype, const float *x, void *dst, int64_t cols) {
    (void)wtype;
    int8_t *q = dst;
    float *ds = (float *)((uint8_t *)dst + cols);
    for (int64_t b = 0; b < cols / AK_QK; b++) {
        const float *xb = x + b * AK_QK;
        float amax = 0;
        for (int i = 0; i < AK_QK; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        ds[b] = d;
        /* nearbyintf: round half to even, as the SIMD conversions do */
        for (int i = 0; i < AK_QK; i++) q[b * AK_QK + i] = (int8_t)nearbyintf(xb[i] * id);
    }
}

static float scalar_dot_q(uint32_t wtype, const uint8_t *w, const int8_t *xq, const float *xd,
                          int64_t nb) {
    float sum = 0;
    for (int64_t b = 0; b < nb; b++, xq += AK_QK) {
        int isum = 0;
        if (wtype == GGML_TYPE_Q8_0) {
            const uint8_t *blk = w + b * AK_Q8_0_BYTES;
            /* Read the quants through an int8_t pointer: GCC 12 vectorizes
             * `(int8_t)u8 * s8` sums into vpdpbusd (unsigned x signed) and
             * gets the sign wrong. */
            const int8_t *qw = (const int8_t *)(blk + 2);
            for (int i = 0; i < AK_QK; i++) isum += qw[i] * xq[i];
            sum += ak_f16_to_f32(ak_load_u16(blk)) * xd[b] * (float)isum;
        } else {
            const uint8_t *blk = w + b * AK_Q4_0_BYTES;
            for (int j = 0; j < AK_QK / 2; j++)
                isum += ((blk[2 + j] & 15) - 8) * xq[j] + ((blk[2 + j] >> 4) - 8) * xq[j + 16];
            sum += ak_f16_to_f32(ak_load_u16(blk)) * xd[b] * (float)isum;
        }
    }
    return sum;
}

/* kernels_backend.h's mm_q contract, one row and token at a time. */
static void scalar_mm_q(const ak_mm_args *a) {
    const int64_t cols = a->cols;
    for (int64_t t = a->t0; t < a->t1; t++) {
        const int8_t *q = (const int8_t *)(a->xq + (size_t)t * a->xqs);
        const float *d = (const float *)(a->xq + (size_t)t * a->xqs + cols);
        for (int64_t r = a->r0; r < a->r1; r++)
            a->Y[t * a->ldy + r] = scalar_dot_q(a->wtype, a->W + (size_t)r * a->wrb, q, d, cols / AK_QK);
    }
}

static float scalar_dot_f(uint32_t wtype, const uint8_t *w, const float *x, int64_t n) {
    float sum = 0;
    switch (wtype) {
    case GGML_TYPE_F32: {
        for (int64_t i = 0; i < n; i++) {
            float v;
            memcpy(&v, w + 4 * i, 4);
            sum += v * x[i];
        }
        break;
    }
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) sum += ak_f16_to_f32(ak_load_u16(w + 2 * i)) * x[i];
        break;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) sum += ak_bf16_to_f32(ak_load_u16(w + 2 * i)) * x[i];
        break;
    default: break;
    }
    return sum;
}

/* kernels_backend.h's mm_f contract, one row and token at a time. */
static void scalar_mm_f(const ak_mm_args *a) {
    for (int64_t t = a->t0; t < a->t1; t++)
        for (int64_t r = a->r0; r < a->r1; r++)
            a->Y[t * a->ldy + r] = scalar_dot_f(a->wtype, a->W + (size_t)r * a->wrb, a->X + t * a->cols, a->cols);
}

static void scalar_f32_to_f16(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = ak_f32_to_f16(x[i]);
}

static void scalar_f16_to_f32(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = ak_f16_to_f32(x[i]);
}

const ak_kernel_backend ak_backend_scalar = {
    .name = "scalar", .xq_row_bytes = scalar_xq_row_bytes, .quantize_x = scalar_quantize_x,
    .mm_q = scalar_mm_q, .mm_f = scalar_mm_f, .f32_to_f16 = scalar_f32_to_f16, .f16_to_f32 = scalar_f16_to_f32,
};

/* ------------------------------------------------------------------------ */
/* Dot products                                                             */
/* ------------------------------------------------------------------------ */

/* Quantized rows are dotted in chunks so that x's XQ fits on the stack. The
 * chunk is an even number of blocks (back ends may pair blocks). */
#define DOT_CHUNK 1024

/* The back end for weights of `type`: kquant.c's types have their own (with
 * their own activation layout), scalar or SIMD as `be` is. */
static const ak_kernel_backend *backend_for(const ak_kernel_backend *be, uint32_t type) {
    if (!ak_kq_type(type)) return be;
#if defined(AK_KQ_SIMD)
    if (be != &ak_backend_scalar && be != &ak_kq_backend_scalar) return &ak_kq_backend_simd;
#endif
    return &ak_kq_backend_scalar;
}

static float vec_dot_with(const ak_kernel_backend *be, uint32_t type, const void *row,
                          const float *x, int64_t n) {
    const uint8_t *w = row;
    be = backend_for(be, type);
    float y = 0;
    if (!ak_wtype_supported(type)) return 0;
    if (!is_quantized(type)) {
        be->mm_f(&(ak_mm_args){ .wtype = type, .W = w, .r1 = 1, .cols = n, .X = x, .t1 = 1, .Y = &y, .ldy = 1 });
        return y;
    }
    /* Big enough for any back end's layout of DOT_CHUNK columns (4 B/col);
     * declared as floats because the layouts store floats in it (a char
     * array accessed as float would break C's aliasing rules). */
    _Alignas(64) float xq_buf[DOT_CHUNK];
    uint8_t *xq = (uint8_t *)xq_buf;
    float sum = 0;
    for (int64_t c = 0; c < n; c += DOT_CHUNK) {
        int64_t m = ak_min64(DOT_CHUNK, n - c);
        be->quantize_x(type, x + c, xq, m);
        be->mm_q(&(ak_mm_args){ .wtype = type, .W = w + ak_row_bytes(type, c), .r1 = 1, .cols = m, .xq = xq, .t1 = 1,
                                .Y = &y, .ldy = 1 });
        sum += y;
    }
    return sum;
}

/* dot(row, x) over n elements. For Q8_0/Q4_0 rows x is first quantized to
 * 8-bit blocks, exactly as ak_matmul does, so the two agree. */
float ak_vec_dot(uint32_t type, const void *row, const float *x, int64_t n) {
    return vec_dot_with(simd_backend(), type, row, x, n);
}

/* ak_vec_dot computed by the scalar back end. */
float ak_vec_dot_scalar(uint32_t type, const void *row, const float *x, int64_t n) {
    return vec_dot_with(&ak_backend_scalar, type, row, x, n);
}

/* ------------------------------------------------------------------------ */
/* Matrix multiplication: the threaded driver                               */
/* ------------------------------------------------------------------------ */

/* Tokens per work item in prefill (see ak_mm_items in kernels_impl.h). */
#define MM_TOKEN_CHUNK 64

typedef struct {
    const ak_kernel_backend *be;
    uint32_t wtype;
    const uint8_t *W;
    size_t wrb;
    int64_t rows, cols;
    const float *X;
    int64_t ntok;
    float *Y;
    uint8_t *xq;          /* quantized activations, ntok rows of xqs bytes */
    size_t xqs;
    ak_mm_items items;    /* rows x token chunks */
} mm_job;

static void mm_quantize_task(void *arg, int ith, int nth) {
    mm_job *j = arg;
    int64_t per = (j->ntok + nth - 1) / nth;
    int64_t t0 = ith * per, t1 = ak_min64(j->ntok, t0 + per);
    for (int64_t t = t0; t < t1; t++)
        j->be->quantize_x(j->wtype, j->X + t * j->cols, j->xq + (size_t)t * j->xqs, j->cols);
}

static void mm_task(void *arg, int ith, int nth) {
    (void)nth;
    mm_job *j = arg;
    int64_t r0, r1, t0, t1;
    while (ak_mm_items_next(&j->items, ith, &r0, &r1, &t0, &t1)) {
        const ak_mm_args a = { .wtype = j->wtype, .W = j->W, .wrb = j->wrb, .r0 = r0, .r1 = r1, .cols = j->cols,
                               .xq = j->xq, .xqs = j->xqs, .X = j->X, .t0 = t0, .t1 = t1, .Y = j->Y, .ldy = j->rows };
        if (j->xq) j->be->mm_q(&a);
        else j->be->mm_f(&a);
    }
}

/* The product a with the back end be (ak_matmul's contract), on the pool's
 * threads (the calling thread without one). */
static void matmul_with(const ak_kernel_backend *be, ak_threads *pool, const ak_matmul_args *a) {
    const uint32_t wtype = a->wtype;
    const void *W = a->W;
    const int64_t rows = a->rows, cols = a->cols, ntok = a->ntok;
    const float *X = a->X;
    float *Y = a->Y;
    if (rows <= 0 || ntok <= 0) return;
    if (!ak_wtype_supported(wtype)) { memset(Y, 0, (size_t)(rows * ntok) * sizeof *Y); return; }
    be = backend_for(be, wtype);
    int nth = ak_threads_size(pool);
    mm_job j = {0};
    j.be = be; j.wtype = wtype; j.W = W; j.wrb = ak_row_bytes(wtype, cols);
    j.rows = rows; j.cols = cols; j.X = X; j.ntok = ntok; j.Y = Y;

    uint8_t *owned = NULL;
    if (is_quantized(wtype)) {
        j.xqs = be->xq_row_bytes(wtype, cols);
        size_t need = j.xqs * (size_t)ntok;
        j.xq = pool ? ak_threads_scratch(pool, need) : NULL;
        if (!j.xq) j.xq = owned = aligned_alloc(64, need);
        if (!j.xq) {
            /* Out of memory: fall back to dot products that use the stack. */
            for (int64_t t = 0; t < ntok; t++)
                for (int64_t r = 0; r < rows; r++)
                    Y[t * rows + r] = vec_dot_with(be, wtype, (const uint8_t *)W + (size_t)r * j.wrb,
                                                   X + t * cols, cols);
            return;
        }
        if (ntok >= 2 * nth) ak_threads_run(pool, mm_quantize_task, &j);
        else mm_quantize_task(&j, 0, 1);
    }

    /* row chunks of 16 rows or more, so tile loops rarely see remainders */
    ak_mm_items_init(&j.items, rows, ntok, MM_TOKEN_CHUNK, nth, 16);
    ak_threads_run(pool, mm_task, &j);
    free(owned);
}

/* Y (ntok x rows) = X (ntok x cols) W^T on the pool's threads with the SIMD
 * back end. Uses ak_threads_scratch for the quantized activations, so callers
 * must not hold a pool scratch pointer across this call. */
void ak_matmul(ak_threads *pool, uint32_t wtype, const void *W, int64_t rows, int64_t cols,
               const float *X, int64_t ntok, float *Y) {
    matmul_with(simd_backend(), pool,
                &(ak_matmul_args){ .wtype = wtype, .W = W, .rows = rows, .cols = cols, .X = X, .ntok = ntok, .Y = Y });
}

/* The same product with the scalar back end on the calling thread. */
void ak_matmul_scalar(uint32_t wtype, const void *W, int64_t rows, int64_t cols,
                      const float *X, int64_t ntok, float *Y) {
    matmul_with(&ak_backend_scalar, NULL,
                &(ak_matmul_args){ .wtype = wtype, .W = W, .rows = rows, .cols = cols, .X = X, .ntok = ntok, .Y = Y });
}
