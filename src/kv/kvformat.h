/* kvformat.h - how one K or V vector (one token, one KV head, one layer) is
 * stored, and the arithmetic attention does on the stored form.
 *
 * A format is an entry in a small table (ak_kv_format_info): its storage size
 * for a head dimension d, a quantizer, a dequantizer, and the two products
 * attention needs, so attention never expands a cache into full precision:
 *
 *   dot:   s[j] = <q, x_j>            for n stored vectors x_j   (keys)
 *   axpy:  acc += sum_j w[j] * x_j    for n stored vectors x_j   (values)
 *
 * Rotated formats (tq4, tq3, tq2) store a vector in a rotated basis
 * R = H * S (H the normalized Walsh-Hadamard transform, S a fixed diagonal of
 * random signs), so attention rotates the query once (ak_kv_rotate) before
 * `dot`, and un-rotates the value accumulator once (ak_kv_unrotate) after the
 * `axpy`s; R is orthogonal, so <Rq, Rk> = <q, k>.
 *
 * Formats and their bits per value for head dim d (scales included):
 *   f32   32                     reference
 *   f16   16
 *   bf16  16
 *   q8    8 + 16/32 = 8.5        symmetric int8, groups of 32 along d, f16 scale
 *   q4    4 + 32/32 = 5.0        affine 4-bit, groups of 32 (d if d < 32), f16 scale + min
 *   q2    2 + 32/g               affine 2-bit (KIVI-style), groups of g = 16, f16 scale + min
 *   tq4   4 + 16/d               TurboQuant: f16 norm, rotated unit vector scaled to unit
 *   tq3   3 + 16/d                 variance, each coordinate snapped to the nearest
 *   tq2   2 + 16/d                 Lloyd-Max centroid of N(0,1); indices bit-packed
 *   tcq3  3 + 16/d               tq3's rotation and norm, but the 3-bit codes are a path
 *                                  through a trellis (each value is read from a table by
 *                                  its own and the two previous codes), chosen by Viterbi
 * (the exact figure per d comes from ak_kv_format_bits; the byte layout of
 * every format, which is what blocks persist, is specified at the top of
 * kvformat.c.)
 *
 * Everything here is a pure function of its arguments (constant tables
 * only): safe from any thread. Vectors need no alignment.
 */
#ifndef AK_KVFORMAT_H
#define AK_KVFORMAT_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    AK_KV_F32, AK_KV_F16, AK_KV_BF16, AK_KV_Q8, AK_KV_Q4, AK_KV_Q2, AK_KV_TQ4, AK_KV_TQ3, AK_KV_TQ2, AK_KV_TCQ3,
    AK_KV_NFORMATS
} ak_kv_format;

typedef struct {
    const char *name;           /* "q8", as on the command line */
    const char *desc;           /* one line: what the bits are */
    int rotated;                /* stored in the basis R (see above) */
    /* Bytes of one stored vector of d values (d even, 2..1024). */
    size_t (*vec_bytes)(int d);
    /* Stores x (d floats, original basis) into dst (vec_bytes(d) bytes).
     * Rotated formats rotate internally. */
    void (*quantize)(const float *x, int d, void *dst);
    /* Reconstructs the vector in the original basis. */
    void (*dequantize)(const void *src, int d, float *y);
    /* out[j] = <q, x_j> for n stored vectors x_j (j < n) whose code streams
     * (component 0, see ak_kv_format_components) are at codes + j*cstride
     * and whose metadata (component 1: scales, norm; ignored by f32, f16 and
     * bf16, which may pass NULL) at meta + j*mstride. A vector stored whole
     * (quantize's output) at p + j*stride is (p, stride, p + code bytes,
     * stride); a block keeps the two apart (blockpool.h). Nothing is read
     * outside those bytes. q is in the stored basis (rotated by the caller
     * for rotated formats). */
    void (*dot)(const void *codes, size_t cstride, const void *meta, size_t mstride, int n, const float *q, int d,
                float *out);
    /* acc[0..d) += sum_j w[j] * x_j, in the stored basis (vectors as for
     * dot). */
    void (*axpy)(const void *codes, size_t cstride, const void *meta, size_t mstride, int n, const float *w, int d,
                 float *acc);
    /* The n stored vectors (as for dot) in f32, in the stored basis:
     * vector j to out + j * ostride (dequant), or value i of vector j to
     * out[i * ostride + j] (dequant_t: transposed). Attention decodes a
     * block's keys and values once with these for every query that reads
     * them. The SIMD versions and the scalar ones may differ in the last
     * bit; each is a pure function of the stored bytes. */
    void (*dequant)(const void *codes, size_t cstride, const void *meta, size_t mstride, int n, int d, float *out,
                    size_t ostride);
    void (*dequant_t)(const void *codes, size_t cstride, const void *meta, size_t mstride, int n, int d, float *out,
                      size_t ostride);
} ak_kv_format_info;

/* The table entry of f, or NULL when f is not a valid format. Its dot and
 * axpy are this build's SIMD versions where there are any. */
const ak_kv_format_info *ak_kv_format_get(ak_kv_format f);
/* The same entry with the portable scalar dot and axpy (the reference the
 * SIMD versions are tested against); quantize/dequantize are the same. */
const ak_kv_format_info *ak_kv_format_get_scalar(ak_kv_format f);
/* Which products ak_kv_format_get hands out: "avx512", "avx2", "neon" or
 * "scalar". */
const char *ak_kv_format_backend(void);
/* Parses a name ("f16", "q4", "tq3", ...); returns 0, or -1 if unknown. */
int ak_kv_format_parse(const char *name, ak_kv_format *out);
/* Comma-separated list of every format name, for help and error messages. */
const char *ak_kv_format_names(void);
/* 1 if vectors stored in f gain from centering (blockpool.h: a per-layer,
 * per-head mean subtracted before quantizing): the 4-, 3- and 2-bit formats,
 * whose error grows with the range or norm the quantizer must cover. 0 for
 * f32, f16, bf16 and q8, which are near-exact anyway (so their loads skip
 * the calibration). */
int ak_kv_format_centers(ak_kv_format f);
/* Bits per stored value for head dimension d, scales and norms included. */
double ak_kv_format_bits(ak_kv_format f, int d);
/* 1 if the format can store vectors of dimension d. */
int ak_kv_format_supports(ak_kv_format f, int d);

/* One component of a stored vector (codes, scales, norm...), for writing a
 * cache as separate tensors with honest dtypes (the store) and reading it
 * back. A vector's components are contiguous and in order: component i
 * occupies bytes [offset, offset + bytes) of the vector's vec_bytes(d). */
typedef struct {
    const char *name;     /* "values", "q", "codes", "scale", "scale_min", "norm" */
    const char *dtype;    /* safetensors dtype: "F32", "F16", "BF16", "I8", "U8" */
    size_t offset;
    size_t bytes;
    int ndim;             /* 0..2: extra dimensions per vector */
    int64_t shape[2];     /* e.g. {ngroups, 2} for (scale, min) pairs */
} ak_kv_component;

/* Fills out[0..n) with the components of format f at head dim d and returns
 * n (1 or 2), or 0 if f cannot store d. */
int ak_kv_format_components(ak_kv_format f, int d, ak_kv_component out[2]);
/* Bytes of a stored vector's code stream (component 0) and of its metadata
 * (component 1; 0 for f32, f16, bf16) at head dim d; 0 if f cannot store d.
 * code_bytes + meta_bytes == vec_bytes. */
size_t ak_kv_format_code_bytes(ak_kv_format f, int d);
size_t ak_kv_format_meta_bytes(ak_kv_format f, int d);

/* x <- R x and x <- R^T x for the rotated formats' basis (d floats). */
void ak_kv_rotate(float *x, int d);
void ak_kv_unrotate(float *x, int d);

/* The Lloyd-Max centroids of N(0,1) the tq formats use, for 2, 3 and 4 bits
 * (ascending, 2^bits values; constants in the table, NULL for other bits). */
const float *ak_lloyd_max_centroids(int bits);
/* Derives them: Lloyd's algorithm on the N(0,1) density (exact integrals
 * via erf), iterated to convergence. Writes 2^bits centroids and the expected
 * squared error per coordinate; returns 0, or -1 for bits outside 1..8. The
 * tests check the table against this. */
int ak_lloyd_max_derive(int bits, double *centroids, double *mse);

#endif
