/* kernels_backend.h - the internal interface of the kernels: what the back
 * ends provide and what the dispatchers call. Not part of the public API.
 *
 * The dispatchers are kernels.c (kernels.h's row-major entry points, its
 * threaded driver and the scalar back end of F32/F16/BF16/Q8_0/Q4_0) and
 * kernels_packed.c (the packed layout's entry points and driver). They
 * reach every type through this header only:
 *   - row back ends (ak_kernel_backend): the scalar references and the SIMD
 *     code of this build's target (kernels_x86.c, kernels_arm.c), and the
 *     same pair for Q4_1, Q5_0, Q5_1 and the K-quants (kquant.c,
 *     kernels_kquant_x86.c, kernels_kquant_arm.c), with those types' row
 *     sizes, quantizers and dequantizers;
 *   - the K-quant half of the packed layout (kernels_packed_k.c) and the
 *     NEON tiles of the packed layout (kernels_packed_arm.c).
 * The back ends include this header (kquant.h, which the K-quant back ends
 * share, builds on it) and never the dispatchers' code: calls run from the
 * dispatchers down to the back ends only. kernels_impl.h adds the code the
 * SIMD back ends and the drivers share.
 *
 * A row back end provides, for one set of target macros:
 *   - its layout of "XQ", one token's activations quantized to 8-bit blocks
 *     of 32 (d = amax/127, q = round-half-even(x/d), |q| <= 127), used with
 *     Q8_0 and Q4_0 weights (its own per-256 or per-32 records for the
 *     kquant.h types). The layout may depend on the weight type.
 *   - tile loops computing a rectangle of Y from W and XQ (quantized) or X.
 * The scalar back ends are the reference for all of them.
 *
 * Which target a file is compiled for decides what it holds, so a file that
 * includes this header is compiled once per SIMD level in a dispatched build
 * (the Makefile's DSP_SRC).
 */
#ifndef AK_KERNELS_BACKEND_H
#define AK_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/gguf.h"
#include "kernels/kernels.h"

/* Which SIMD back end this build uses: decided here only. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#define AK_SIMD_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define AK_SIMD_AVX2 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define AK_SIMD_NEON 1

#endif

#define AK_QK 32            /* elements per quantized block */
#define AK_Q8_0_BYTES 34    /* f16 d + 32 x int8 */
#define AK_Q4_0_BYTES 18    /* f16 d + 16 bytes of nibbles */

/* The operands of one rectangle of a row-major product, what a back end's
 * mm_q and mm_f compute: Y[t * ldy + r] = dot(row r of W, token t) for r in
 * [r0, r1), t in [t0, t1). W points at row 0 of wtype; rows are wrb bytes
 * apart. For mm_q, xq points at token 0's XQ row and rows are xqs bytes
 * apart (X unused); for mm_f, X is ntok x cols f32 (xq unused). */
typedef struct {
    uint32_t wtype;
    const uint8_t *W;
    size_t wrb;
    int64_t r0, r1, cols;
    const uint8_t *xq;
    size_t xqs;
    const float *X;
    int64_t t0, t1;
    float *Y;
    int64_t ldy;
} ak_mm_args;
typedef void (*ak_mm_q_fn)(const ak_mm_args *a);
typedef void (*ak_mm_f_fn)(const ak_mm_args *a);

typedef struct {
    const char *name;
    /* Bytes of one token's XQ row for weights of wtype; a multiple of 64. */
    size_t (*xq_row_bytes)(uint32_t wtype, int64_t cols);
    /* Quantizes cols activations (a multiple of 32) into one XQ row. */
    void (*quantize_x)(uint32_t wtype, const float *x, void *dst, int64_t cols);
    ak_mm_q_fn mm_q;        /* Q8_0, Q4_0 weights */
    ak_mm_f_fn mm_f;        /* F32, F16, BF16 weights */
    /* Row conversions between f32 and IEEE half (round to nearest even). */
    void (*f32_to_f16)(const float *x, uint16_t *y, int64_t n);
    void (*f16_to_f32)(const uint16_t *x, float *y, int64_t n);
} ak_kernel_backend;

/* ---- Row back ends ---- */
extern const ak_kernel_backend ak_backend_scalar;   /* kernels.c */
#if defined(AK_SIMD_AVX512) || defined(AK_SIMD_AVX2) || defined(AK_SIMD_NEON)
extern const ak_kernel_backend ak_backend_simd;     /* kernels_x86.c / kernels_arm.c */

#endif

/* ---- Q4_1, Q5_0, Q5_1 and the K-quants (kquant.c; formats in kquant.h) ---- */
/* 1 for the types this module handles (Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K). */
int ak_kq_type(uint32_t type);
/* Bytes of a row of n elements of a kq type. */
size_t ak_kq_row_bytes(uint32_t type, int64_t n);
/* Quantize / dequantize rows of n elements (a multiple of the block size). */
void ak_kq_quantize_row(uint32_t type, const float *x, void *dst, int64_t n);
void ak_kq_dequantize_row(uint32_t type, const void *src, float *y, int64_t n);
/* Back ends for these types (same interface as the Q8_0/Q4_0 ones; mm_f is
 * unused). The scalar one is the reference; the SIMD one is
 * kernels_kquant_x86.c's or kernels_kquant_arm.c's. */
extern const ak_kernel_backend ak_kq_backend_scalar;
#if defined(AK_SIMD_AVX512) || defined(AK_SIMD_AVX2) || defined(AK_SIMD_NEON)
#define AK_KQ_SIMD 1
extern const ak_kernel_backend ak_kq_backend_simd;
#endif

/* The K-quant half of kernels.h's packed layout (kernels_packed_k.c): Q4_K,
 * Q5_K and Q6_K. kernels_packed.c's entry points and its threaded driver
 * hand those types here for what differs: the layout, the activations
 * ("XK", ak_packed_k_xk_bytes per token) and the tiles of one work item. */
#define AK_PACKED_STACK 65536   /* one token's activations when the heap is exhausted */
size_t ak_packed_k_bytes(uint32_t wtype, int64_t rows, int64_t cols);
void ak_pack_weights_k(uint32_t wtype, const void *W, int64_t rows, int64_t cols, void *P);
size_t ak_packed_k_group_bytes(uint32_t wtype, int64_t cols);
size_t ak_packed_k_xk_bytes(int64_t cols);
void ak_packed_k_quantize(const float *x, uint8_t *dst, int64_t cols);
/* One work item of a packed product, as kernels_packed.c's driver hands it
 * to the tiles of a layout: Y rows [16 g0, 16 g1) x tokens [t0, t1) of a
 * rows x cols matrix, from its groups at P (gb bytes each); Y is ntok x
 * rows. Quantized weights read the tokens' activation rows (XP, XK: token
 * 0's at xq, xqs bytes apart; X unused), float weights X (ntok x cols f32;
 * xq unused). */
typedef struct {
    const uint8_t *P;
    size_t gb;
    int64_t rows, cols;
    int64_t g0, g1, t0, t1;
    const uint8_t *xq;
    size_t xqs;
    const float *X;
    float *Y;
} ak_pk_item;
/* The work item it of a K type (xq: the tokens' XK rows). */
void ak_packed_k_item(uint32_t wtype, const ak_pk_item *it);

/* ---- NEON tiles of kernels_packed.c's R16 layout (kernels_packed_arm.c) ----
 * Levels: 0 plain NEON, 1 + dotprod (sdot), 2 + i8mm (smmla); every level
 * gives the same bits. ak_neon_level: this CPU's (getauxval), capped by the
 * environment variable AGENTKV_NEON (plain, dotprod, i8mm). quantize: one
 * token's XP row for wtype. The items: the work item it (ak_pk_item) of a
 * 32-block type (xq: the tokens' XP rows) or of a float type (ft:
 * ak_ftype_index), as kernels_packed.c's q_item / f_item. */
#if defined(AK_SIMD_NEON)
int ak_neon_level(void);
void ak_packed_neon_quantize(uint32_t wtype, const float *x, uint8_t *dst, int64_t cols);
void ak_packed_neon_q_item(int level, uint32_t wtype, const ak_pk_item *it);
void ak_packed_neon_f_item(int ft, const ak_pk_item *it);
#endif

/* Little helpers shared by the back ends. */
#define AK_INLINE static inline __attribute__((always_inline))
static inline uint16_t ak_load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);   /* blocks are only 2-byte aligned at best */
    return v;
}
static inline int64_t ak_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline size_t ak_round64(size_t n) { return (n + 63) & ~(size_t)63; }

#endif
