/* LAYER kernels/ (src/kernels/): weight formats and their SIMD matrix
 * products, K-quants, the run-time choice of SIMD level.
 * Promises: every product has a scalar twin with the same contract, and
 * sums in an order that does not depend on the batch, so a row's result is
 * the same bits alone or batched; weights are read, never written, after
 * load. Knows no model, cache or file beyond the tensors it is handed.
 * May use: base. Used by: engine (and the CLI's benchmarks). The table:
 * scripts/check-layers.sh.
 *
 * kernels.h - weight formats and the products the forward pass is made of.
 *
 * Weight types are ggml's (see gguf.h): F32, F16, BF16, Q8_0, Q4_0, and (see
 * kquant.h for their layouts) Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K.
 *   Q8_0: blocks of 32: f16 scale d, 32 x int8 q;           x = d * q
 *   Q4_0: blocks of 32: f16 scale d, 16 bytes; byte j holds element j in its
 *         low nibble and element j+16 in its high nibble;    x = d * (q - 8)
 * K types (256-element super-blocks) multiply with activations quantized per
 * 256, the others per 32.
 * A "row" is one output neuron's weights (ne[0] elements of a GGUF tensor).
 *
 * Every SIMD path (AVX-512, AVX2, NEON, chosen at build time by the compiler's
 * target macros; in a dispatched x86-64 build each level's copy of this code
 * is compiled with that level's target and one is picked at start, cpu.h)
 * has a scalar twin with the same contract; the *_scalar entry points always
 * use it, so tests can compare the two on any machine.
 */
#ifndef AK_KERNELS_H
#define AK_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "base/threadpool.h"

/* 1 if the engine can compute with weights of this ggml type. */
int ak_wtype_supported(uint32_t type);
/* Bytes of one row of n elements (n must be a multiple of the block size). */
size_t ak_row_bytes(uint32_t type, int64_t n);
/* Name of the SIMD path running: "avx512", "avx2", "neon" or "scalar" (the
 * avx2vnni level runs the "avx2" code built with AVX-VNNI; cpu.h). */
const char *ak_simd_name(void);

/* Float rows <-> a weight type (n a multiple of the block size). Quantizers
 * round to nearest; Q8_0/Q4_0 use the reference implementation's arithmetic,
 * the others our own fits (kquant.c). */
void ak_quantize_row(uint32_t type, const float *x, void *dst, int64_t n);
void ak_dequantize_row(uint32_t type, const void *src, float *y, int64_t n);

/* dot(row of type `type`, x) with x in f32. */
float ak_vec_dot(uint32_t type, const void *row, const float *x, int64_t n);
float ak_vec_dot_scalar(uint32_t type, const void *row, const float *x, int64_t n);

/* The operands of one product Y = X W^T: W, rows x cols of wtype (row-major
 * rows for ak_matmul, the packed copy for ak_matmul_packed), X (ntok x cols,
 * f32) and Y (ntok x rows, f32, row-major). */
typedef struct {
    uint32_t wtype;
    const void *W;
    int64_t rows, cols;
    const float *X;
    int64_t ntok;
    float *Y;
} ak_matmul_args;

/* Y (ntok x rows, row-major) = X (ntok x cols, f32) times W^T, W (rows x cols)
 * stored as rows of `wtype`. Split across the pool's threads; for ntok > 1
 * each weight block is reused across tokens (prefill). For quantized weights
 * the activations are quantized to 8-bit blocks once per call and integer dot
 * products are used. Scratch memory is owned by the pool's kernel context and
 * grown on demand (no allocation per call in steady state). */
void ak_matmul(ak_threads *pool, uint32_t wtype, const void *W, int64_t rows, int64_t cols,
               const float *X, int64_t ntok, float *Y);
/* Same contract, scalar code, single thread: the reference the tests use. */
void ak_matmul_scalar(uint32_t wtype, const void *W, int64_t rows, int64_t cols,
                      const float *X, int64_t ntok, float *Y);


/* Packed weights. Where the back end has kernels for a regrouped layout
 * (kernels_packed.c: F32/F16/BF16 with AVX-512; Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0 and, in kernels_packed_k.c, Q4_K, Q5_K, Q6_K with AVX512-VNNI; all
 * of them with AVX2), a
 * matrix can be copied once into it and multiplied from there, faster than
 * from the row-major blocks. ak_packed_bytes gives the copy's size, or 0 when there is no packed
 * kernel for this type in this build (then use ak_matmul). */
size_t ak_packed_bytes(uint32_t wtype, int64_t rows, int64_t cols);
/* Writes the packed copy of W into P (ak_packed_bytes bytes, 64-byte aligned). */
void ak_pack_weights(uint32_t wtype, const void *W, int64_t rows, int64_t cols, void *P);
/* ak_matmul's contract for the product a, its W the packed copy. Returns
 * 0, or -1 with err set (AK_ERR_INVALID, Y untouched) where ak_packed_bytes
 * is 0 for (wtype, rows, cols). Out of memory for its scratch it computes
 * one token at a time on the stack: the same bits, not an error. */
int ak_matmul_packed(ak_threads *pool, const ak_matmul_args *a, ak_error *err);
/* Several packed products of the same activations in one parallel region:
 * a[m] for m < n (n at most AK_MATMUL_PACKED_MAX), matrices of one type and
 * width that multiply the same X for the same tokens (Q, K and V of a
 * layer; its gate and up): wtype, cols, X and ntok the same in every a[m].
 * X is quantized once. Each a[m].Y is the same bits as ak_matmul_packed of
 * that product alone. Returns 0, or -1 with err set (AK_ERR_INVALID,
 * nothing written) where n is out of range, the products differ in wtype,
 * cols, X or ntok, or ak_packed_bytes is 0 for one of the matrices. */
#define AK_MATMUL_PACKED_MAX 4
int ak_matmul_packed_n(ak_threads *pool, int n, const ak_matmul_args *a, ak_error *err);

#endif
