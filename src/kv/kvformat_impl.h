/* kvformat_impl.h - internal interface between kvformat.c (layouts,
 * quantizers, scalar reference products, rotation, codebooks) and the SIMD
 * products in kvformat_x86.c / kvformat_arm.c. Not part of the public API.
 *
 * A SIMD back end provides dot and axpy for every format, with the contracts
 * of ak_kv_format_info in kvformat.h, on the storage layout specified at the
 * top of kvformat.c. Quantizers are scalar only (one per written token, so
 * not a hot loop), which also keeps stored bytes identical on every machine.
 */
#ifndef AK_KVFORMAT_IMPL_H
#define AK_KVFORMAT_IMPL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kv/kvformat.h"
#include "base/util.h"

/* Which SIMD back end this build uses: decided here only (the same rule as
 * kernels_backend.h, under names of this module's own). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#define AK_KVF_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define AK_KVF_AVX2 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define AK_KVF_NEON 1
#endif
#if defined(AK_KVF_AVX512) || defined(AK_KVF_AVX2) || defined(AK_KVF_NEON)
#define AK_KVF_SIMD 1
#endif

#define AK_KVF_MAX_D 1024
#define AK_KVF_Q8_G 32      /* values per group */
#define AK_KVF_Q4_G 32
#define AK_KVF_Q2_G 16

/* Bytes of a stream of n codes of b bits. */
static inline size_t ak_kvf_code_bytes(int n, int b) { return ((size_t)n * (size_t)b + 7) / 8; }
static inline int ak_kvf_ngroups(int d, int g) { return (d + g - 1) / g; }
static inline uint16_t ak_kvf_rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);   /* vectors sit at any byte offset */
    return v;
}
/* The factor of a tq vector: x_rot[i] = factor * centroid[idx_i]. Scalar and
 * SIMD code both compute it this way so they agree to the last bit. */
static inline float ak_kvf_tq_factor(uint16_t n16, int d) { return ak_f16_to_f32(n16) / sqrtf((float)d); }

/* n stored vectors as the products read them (kvformat.h's dot): vector
 * j's code stream at codes + j * cstride, its metadata at meta + j *
 * mstride. The back ends' inner functions take this in place of the five
 * values the table's entry points receive. */
typedef struct {
    const void *codes;
    size_t cstride;
    const void *meta;
    size_t mstride;
    int n;
} ak_kvf_vecs;

/* The codebooks (kvformat.c), ascending. */
extern const float ak_kvf_lm2[4], ak_kvf_lm3[8], ak_kvf_lm4[16];
/* tcq3's table of 512 values, indexed by a window of three codes. */
extern const float ak_kvf_tcq3_table[512];

#ifdef AK_KVF_SIMD
/* The SIMD back end's name ("avx512", "avx2", "neon"). */
extern const char ak_kvf_simd_name[];
#define AK_KVF_DECLARE(F)                                                                              \
    void ak_kvf_simd_dot_##F(const void *codes, size_t cstride, const void *meta, size_t mstride, int n,          \
                             const float *q, int d, float *out);                                                  \
    void ak_kvf_simd_axpy_##F(const void *codes, size_t cstride, const void *meta, size_t mstride, int n,         \
                              const float *w, int d, float *acc);
AK_KVF_DECLARE(f32)
AK_KVF_DECLARE(f16)
AK_KVF_DECLARE(bf16)
AK_KVF_DECLARE(q8)
AK_KVF_DECLARE(q4)
AK_KVF_DECLARE(q2)
AK_KVF_DECLARE(tq4)
AK_KVF_DECLARE(tq3)
AK_KVF_DECLARE(tq2)
AK_KVF_DECLARE(tcq3)
#undef AK_KVF_DECLARE
#if defined(AK_KVF_AVX512) || defined(AK_KVF_AVX2)
/* dequant and dequant_t (kvformat.h) of the x86 back ends, for every
 * format but tcq3 (whose gathers, not its layout, bound it). */
#define AK_KVF_SIMD_DEQUANT 1
#define AK_KVF_DECLARE_DQ(F)                                                                                 \
    void ak_kvf_simd_dequant_##F(const void *codes, size_t cstride, const void *meta, size_t mstride, int n,    \
                                 int d, float *out, size_t ostride);                                            \
    void ak_kvf_simd_dequant_t_##F(const void *codes, size_t cstride, const void *meta, size_t mstride, int n,  \
                                   int d, float *out, size_t ostride);
AK_KVF_DECLARE_DQ(f32)
AK_KVF_DECLARE_DQ(f16)
AK_KVF_DECLARE_DQ(bf16)
AK_KVF_DECLARE_DQ(q8)
AK_KVF_DECLARE_DQ(q4)
AK_KVF_DECLARE_DQ(q2)
AK_KVF_DECLARE_DQ(tq4)
AK_KVF_DECLARE_DQ(tq3)
AK_KVF_DECLARE_DQ(tq2)
#undef AK_KVF_DECLARE_DQ
#endif
/* tcq3's products in plain C (kvformat.c), for back ends without a gather. */
void ak_kvf_tcq3_dot_c(const void *codes, size_t cstride, const void *meta, size_t mstride, int n, const float *q, int d,
                       float *out);
void ak_kvf_tcq3_axpy_c(const void *codes, size_t cstride, const void *meta, size_t mstride, int n, const float *w,
                        int d, float *acc);
#endif

#endif
