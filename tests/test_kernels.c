/* test_kernels.c - threadpool and kernels: conversions, quantizers, dot
 * products and matmul, each checked against an independent reference written
 * here (double precision, from first principles), not against itself. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"
#include "base/gguf.h"
#include "kernels/kernels.h"
#include "base/vmath.h"
#include "base/threadpool.h"
#include "base/util.h"

/* ------------------------------------------------------------------------ */
/* Independent references                                                   */
/* ------------------------------------------------------------------------ */

/* IEEE half -> double from the definition. */
static double ref_half(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp(m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp(1024 + m, e - 25);
    return sign ? -v : v;
}

/* Nearest half to f by binary search over the (monotonic) positive
 * encodings, ties to the even encoding; overflow past 65520 gives inf. */
static uint16_t ref_to_half(float f) {
    double a = fabs((double)f);
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (a >= 65520.0) return sign | 0x7c00;
    unsigned lo = 0, hi = 0x7bff;   /* largest encoding with value <= a */
    while (lo < hi) {
        unsigned mid = (lo + hi + 1) / 2;
        if (ref_half((uint16_t)mid) <= a) lo = mid; else hi = mid - 1;
    }
    double below = ref_half((uint16_t)lo);
    if (below == a || lo == 0x7bff) return sign | (uint16_t)lo;
    double above = ref_half((uint16_t)(lo + 1));
    unsigned pick = (a - below < above - a) ? lo : (a - below > above - a) ? lo + 1 : (lo & 1 ? lo + 1 : lo);
    return sign | (uint16_t)pick;
}

static float f_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Reference 8-bit activation quantizer (the contract of kernels.h/.c):
 * d = amax/127, q = round-half-even(x * (1/d)). */
static void ref_quant_x(const float *x, int64_t n, float *xq_deq) {
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) if (fabsf(x[b * 32 + i]) > amax) amax = fabsf(x[b * 32 + i]);
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        for (int i = 0; i < 32; i++) xq_deq[b * 32 + i] = d * (float)rint(x[b * 32 + i] * id);
    }
}

static double ref_dot(const float *w, const float *x, int64_t n, double *abs_sum) {
    double s = 0, a = 0;
    for (int64_t i = 0; i < n; i++) { s += (double)w[i] * x[i]; a += fabs((double)w[i] * x[i]); }
    if (abs_sum) *abs_sum = a;
    return s;
}

static int is_quant(uint32_t t) { return t == GGML_TYPE_Q8_0 || t == GGML_TYPE_Q4_0; }

static const uint32_t all_types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0 };
static const char *tname(uint32_t t) {
    switch (t) {
    case GGML_TYPE_F32: return "F32";
    case GGML_TYPE_F16: return "F16";
    case GGML_TYPE_BF16: return "BF16";
    case GGML_TYPE_Q8_0: return "Q8_0";
    case GGML_TYPE_Q4_0: return "Q4_0";
    default: return "?";
    }
}

static void fill_normal(ak_rng *r, float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * ak_rng_normal(r);
}

/* ------------------------------------------------------------------------ */
/* Conversions                                                              */
/* ------------------------------------------------------------------------ */

TEST(kernel_f16_known_values) {
    struct { float f; uint16_t h; } cases[] = {
        { 1.0f, 0x3c00 }, { -2.0f, 0xc000 }, { 0.0f, 0x0000 }, { -0.0f, 0x8000 },
        { 65504.0f, 0x7bff }, { 65519.99f, 0x7bff }, { 65520.0f, 0x7c00 },  /* tie -> inf */
        { 1e9f, 0x7c00 }, { -INFINITY, 0xfc00 }, { 0.5f, 0x3800 },
        { 0x1p-14f, 0x0400 },                  /* smallest normal */
        { 0x1p-24f, 0x0001 },                  /* smallest subnormal */
        { 1023 * 0x1p-24f, 0x03ff },           /* largest subnormal */
        { 0x1p-25f, 0x0000 },                  /* tie between 0 and 1 unit: even = 0 */
        { 3 * 0x1p-25f, 0x0002 },              /* tie between 1 and 2 units: even = 2 */
        { 0x1.8p-25f, 0x0001 },                /* 0.75 units rounds up */
        { 1.0f + 0x1p-11f, 0x3c00 },           /* tie: 0x3c00 is even */
        { 1.0f + 3 * 0x1p-11f, 0x3c02 },       /* tie: 0x3c02 is even */
        { 1.0f + 0x1p-11f + 0x1p-20f, 0x3c01 },/* just above the tie */
        { 0.1f, 0x2e66 }, { 3.14159265f, 0x4248 },
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    /* Row conversion of 32 values covers both the vector body and the tail. */
    float row[48];
    uint16_t hrow[48];
    for (int i = 0; i < n; i++) {
        uint16_t h = ak_f32_to_f16(cases[i].f);
        CHECK(h == cases[i].h, "ak_f32_to_f16(%a) = 0x%04x, want 0x%04x", cases[i].f, h, cases[i].h);
        row[i] = cases[i].f;
        row[i + n] = cases[i].f;
    }
    ak_quantize_row(GGML_TYPE_F16, row, hrow, 2 * n);
    for (int i = 0; i < 2 * n; i++)
        CHECK(hrow[i] == cases[i % n].h, "row F16 [%d] of %a = 0x%04x, want 0x%04x", i,
              row[i], hrow[i], cases[i % n].h);
    CHECK(ak_f16_to_f32(0x0001) == 0x1p-24f, "0x0001 -> %a", ak_f16_to_f32(0x0001));
    CHECK(ak_f16_to_f32(0x7bff) == 65504.0f, "0x7bff -> %g", ak_f16_to_f32(0x7bff));
    CHECK(isinf(ak_f16_to_f32(0xfc00)) && ak_f16_to_f32(0xfc00) < 0, "0xfc00 not -inf");
    CHECK(isnan(ak_f16_to_f32(0x7e00)), "0x7e00 not NaN");
    uint16_t hn = ak_f32_to_f16(NAN);
    CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff), "NaN -> 0x%04x is not a NaN", hn);
    /* bf16: truncation of the f32 bits with round-half-even */
    CHECK(ak_f32_to_bf16(1.0f) == 0x3f80, "bf16(1)");
    CHECK(ak_f32_to_bf16(f_from_bits(0x3f808000)) == 0x3f80, "bf16 tie to even (down)");
    CHECK(ak_f32_to_bf16(f_from_bits(0x3f818000)) == 0x3f82, "bf16 tie to even (up)");
    CHECK(ak_f32_to_bf16(f_from_bits(0x3f808001)) == 0x3f81, "bf16 above tie");
    CHECK(ak_bf16_to_f32(0xc040) == -3.0f, "bf16 0xc040 -> %g", ak_bf16_to_f32(0xc040));
}

TEST(kernel_f16_all_halves) {
    static uint16_t h[65536], back[65536];
    static float f[65536];
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    ak_dequantize_row(GGML_TYPE_F16, h, f, 65536);   /* vector path */
    ak_quantize_row(GGML_TYPE_F16, f, back, 65536);
    int bad = 0;
    for (int i = 0; i < 65536 && bad < 10; i++) {
        double want = ref_half((uint16_t)i);
        float s = ak_f16_to_f32((uint16_t)i);
        if (isnan(want)) {
            if (!isnan(f[i]) || !isnan(s)) { bad++; CHECK(0, "0x%04x should decode to NaN", i); }
            continue;
        }
        if ((double)f[i] != want || (double)s != want) {
            bad++;
            CHECK(0, "0x%04x -> row %a scalar %a, want %a", i, f[i], s, want);
        }
        if (back[i] != i || ak_f32_to_f16(s) != i) {
            bad++;
            CHECK(0, "round trip 0x%04x -> row 0x%04x scalar 0x%04x", i, back[i], ak_f32_to_f16(s));
        }
    }
    /* Random floats over the whole half range (and below it) against the
     * binary-search reference; halfway points are included on purpose. */
    ak_rng r;
    ak_rng_seed(&r, 7);
    enum { N = 20000 };
    static float xs[N];
    static uint16_t hs[N];
    for (int i = 0; i < N; i++) {
        float v;
        if (i % 3 == 0) {   /* exact midpoint between two adjacent halves */
            uint16_t a = (uint16_t)(ak_rng_u32(&r) % 0x7bff);
            v = (float)((ref_half(a) + ref_half((uint16_t)(a + 1))) / 2);
        } else {
            v = ldexpf(ak_rng_uniform(&r) + 0.5f, (int)(ak_rng_u32(&r) % 45) - 28);
        }
        xs[i] = (ak_rng_u32(&r) & 1) ? -v : v;
    }
    ak_quantize_row(GGML_TYPE_F16, xs, hs, N);
    bad = 0;
    for (int i = 0; i < N && bad < 10; i++) {
        uint16_t want = ref_to_half(xs[i]);
        if (hs[i] != want || ak_f32_to_f16(xs[i]) != want) {
            bad++;
            CHECK(0, "%a -> row 0x%04x scalar 0x%04x, want 0x%04x", xs[i], hs[i], ak_f32_to_f16(xs[i]), want);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Quantizers                                                               */
/* ------------------------------------------------------------------------ */

TEST(kernel_q8_0_known_block) {
    /* amax = 127 makes d = 1 exactly (f16 0x3c00), so q = roundf(x):
     * ties go away from zero as in the reference quantizer. */
    float x[32] = { -127, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f, 100.4f, 100.6f, -0.49f, 0.49f, 3, -3, 126.5f, -126.5f };
    int8_t want[32] = { -127, -2, -1, 1, 2, 3, 100, 101, 0, 0, 3, -3, 127, -127 };
    for (int i = 14; i < 32; i++) { x[i] = (float)(i - 20); want[i] = (int8_t)(i - 20); }
    uint8_t blk[34];
    REQUIRE(ak_row_bytes(GGML_TYPE_Q8_0, 32) == 34, "Q8_0 row bytes %zu", ak_row_bytes(GGML_TYPE_Q8_0, 32));
    ak_quantize_row(GGML_TYPE_Q8_0, x, blk, 32);
    CHECK(blk[0] == 0x00 && blk[1] == 0x3c, "d bytes %02x %02x, want 00 3c", blk[0], blk[1]);
    for (int i = 0; i < 32; i++)
        CHECK((int8_t)blk[2 + i] == want[i], "q[%d] = %d, want %d", i, (int8_t)blk[2 + i], want[i]);
    float y[32];
    ak_dequantize_row(GGML_TYPE_Q8_0, blk, y, 32);
    for (int i = 0; i < 32; i++) CHECK(y[i] == want[i], "deq[%d] = %g", i, y[i]);
    /* An all-zero block: d = 0, all q = 0. */
    float z[32] = {0};
    ak_quantize_row(GGML_TYPE_Q8_0, z, blk, 32);
    for (int i = 0; i < 34; i++) CHECK(blk[i] == 0, "zero block byte %d = %d", i, blk[i]);
}

TEST(kernel_q4_0_known_block) {
    /* Largest magnitude is -8 (sign kept), so d = -8 / -8 = 1 and
     * q = min(15, (int)(x + 8.5)). */
    float x[32] = { -8, 7, 7.4f, -0.5f, 0.49f, 0.5f, -7.6f, 3, 1.5f, -1.5f };
    int want[32] = { 0, 15, 15, 8, 8, 9, 0, 11, 10, 7 };
    for (int i = 10; i < 32; i++) { x[i] = (float)((i % 15) - 7); want[i] = (i % 15) + 1; }
    uint8_t blk[18];
    REQUIRE(ak_row_bytes(GGML_TYPE_Q4_0, 64) == 36, "Q4_0 row bytes");
    ak_quantize_row(GGML_TYPE_Q4_0, x, blk, 32);
    CHECK(blk[0] == 0x00 && blk[1] == 0x3c, "d bytes %02x %02x, want 00 3c", blk[0], blk[1]);
    for (int j = 0; j < 16; j++) {
        int lo = blk[2 + j] & 15, hi = blk[2 + j] >> 4;
        CHECK(lo == want[j], "element %d nibble %d, want %d", j, lo, want[j]);
        CHECK(hi == want[j + 16], "element %d nibble %d, want %d", j + 16, hi, want[j + 16]);
    }
    float y[32];
    ak_dequantize_row(GGML_TYPE_Q4_0, blk, y, 32);
    for (int i = 0; i < 32; i++) CHECK(y[i] == (float)(want[i] - 8), "deq[%d] = %g", i, y[i]);
    /* Positive extreme: d = 8 / -8 = -1 (0xbc00); +8 -> q 0, and -8 clips
     * to q 15, i.e. -7: the reference's known asymmetry. */
    float x2[32] = { 8, -8, 1 };
    ak_quantize_row(GGML_TYPE_Q4_0, x2, blk, 32);
    CHECK(blk[0] == 0x00 && blk[1] == 0xbc, "d bytes %02x %02x, want 00 bc", blk[0], blk[1]);
    CHECK((blk[2] & 15) == 0 && (blk[3] & 15) == 15 && (blk[4] & 15) == 7 && (blk[5] & 15) == 8,
          "nibbles %d %d %d %d", blk[2] & 15, blk[3] & 15, blk[4] & 15, blk[5] & 15);
    ak_dequantize_row(GGML_TYPE_Q4_0, blk, y, 32);
    CHECK(y[0] == 8 && y[1] == -7 && y[2] == 1 && y[3] == 0, "deq %g %g %g %g", y[0], y[1], y[2], y[3]);
}

TEST(kernel_quant_roundtrip_bounds) {
    ak_rng r;
    ak_rng_seed(&r, 42);
    enum { N = 32 * 512 };
    static float x[N], y[N];
    static uint8_t q[N * 2];
    fill_normal(&r, x, N, 1.0f);
    for (int b = 0; b < N / 32; b++) {   /* vary block scales, some zero blocks */
        float s = b % 7 == 0 ? 1e-3f : b % 7 == 1 ? 300.0f : b % 7 == 2 ? 0.0f : 1.0f;
        for (int i = 0; i < 32; i++) x[b * 32 + i] *= s;
    }
    double worst8 = 0, worst4 = 0;
    ak_quantize_row(GGML_TYPE_Q8_0, x, q, N);
    ak_dequantize_row(GGML_TYPE_Q8_0, q, y, N);
    for (int b = 0; b < N / 32; b++) {
        double amax = 0;
        for (int i = 0; i < 32; i++) if (fabs(x[b * 32 + i]) > amax) amax = fabs(x[b * 32 + i]);
        double d = amax / 127, dh = ref_half((uint16_t)(q[b * 34] | q[b * 34 + 1] << 8));
        /* f16 rounding: half an ulp, absolute 2^-25 in the subnormal range */
        CHECK(fabs(dh - d) <= fmax(d * 0x1p-11, 0x1p-25), "block %d: stored d %g vs %g", b, dh, d);
        /* rounding error d/2 plus |q| <= 127 times the f16 error of d */
        double bound = d / 2 + 127 * fabs(dh - d) + 1e-6 * d;
        for (int i = 0; i < 32; i++) {
            double e = fabs(x[b * 32 + i] - y[b * 32 + i]);
            if (d > 0 && e / d > worst8) worst8 = e / d;
            CHECK(e <= bound, "Q8_0 block %d elem %d: |%g - %g| > %g", b, i, x[b * 32 + i], y[b * 32 + i], bound);
        }
    }
    ak_quantize_row(GGML_TYPE_Q4_0, x, q, N);
    ak_dequantize_row(GGML_TYPE_Q4_0, q, y, N);
    for (int b = 0; b < N / 32; b++) {
        double max = 0;
        for (int i = 0; i < 32; i++) if (fabs(x[b * 32 + i]) > fabs(max)) max = x[b * 32 + i];
        double d = max / -8, dh = ref_half((uint16_t)(q[b * 18] | q[b * 18 + 1] << 8));
        for (int i = 0; i < 32; i++) {
            double v = x[b * 32 + i];
            /* values beyond 7.5 steps on the far side clip to q = 15 */
            int clipped = d != 0 && v / d + 8.5 >= 16;
            double bound = (clipped ? fabs(d) : fabs(d) / 2) + 8 * fabs(dh - d) + 1e-6 * fabs(d);
            double e = fabs(v - y[b * 32 + i]);
            if (d != 0 && !clipped && e / fabs(d) > worst4) worst4 = e / fabs(d);
            CHECK(e <= bound, "Q4_0 block %d elem %d: |%g - %g| > %g", b, i, v, y[b * 32 + i], bound);
        }
    }
    printf("    max error / d: Q8_0 %.4f, Q4_0 %.4f (bound 0.5 + f16 rounding of d)\n", worst8, worst4);
    CHECK(worst8 > 0.45 && worst4 > 0.45, "suspiciously small errors: %g %g", worst8, worst4);
}

/* ------------------------------------------------------------------------ */
/* Dot products                                                             */
/* ------------------------------------------------------------------------ */

TEST(kernel_vec_dot_vs_reference) {
    ak_rng r;
    ak_rng_seed(&r, 1234);
    const int64_t qlens[] = { 32, 64, 96, 160, 1024, 2080, 4096 };
    const int64_t flens[] = { 1, 7, 16, 17, 33, 100, 1000, 4096 + 5 };
    enum { MAXN = 4096 + 64 };
    static float w[MAXN], x[MAXN], wd[MAXN], xd[MAXN];
    static uint8_t row[MAXN * 4];
    printf("    SIMD path: %s\n", ak_simd_name());
    for (size_t ti = 0; ti < sizeof all_types / sizeof all_types[0]; ti++) {
        uint32_t type = all_types[ti];
        int quant = is_quant(type);
        const int64_t *lens = quant ? qlens : flens;
        size_t nlens = quant ? sizeof qlens / sizeof qlens[0] : sizeof flens / sizeof flens[0];
        double worst_simd = 0, worst_scalar = 0;
        for (size_t li = 0; li < nlens; li++) {
            int64_t n = lens[li];
            fill_normal(&r, w, n, 0.5f);
            fill_normal(&r, x, n, 2.0f);
            if (n > 64) for (int i = 0; i < 32; i++) x[i] *= 50;   /* an outlier block */
            ak_quantize_row(type, w, row, n);
            ak_dequantize_row(type, row, wd, n);
            double abs_sum, exact = ref_dot(wd, x, n, &abs_sum);
            /* The product the kernels promise: for quantized weights, x is
             * first quantized to 8 bits, so compare with that exactly and with
             * the unquantized x within the bound the 8-bit rounding implies. */
            double want = exact, qbound = 0;
            if (quant) {
                ref_quant_x(x, n, xd);
                want = ref_dot(wd, xd, n, &abs_sum);
                for (int64_t b = 0; b < n / 32; b++) {
                    double amax = 0, wsum = 0;
                    for (int i = 0; i < 32; i++) {
                        amax = fmax(amax, fabs(x[b * 32 + i]));
                        wsum += fabs(wd[b * 32 + i]);
                    }
                    qbound += amax / 127 / 2 * wsum * 1.0001;
                }
            }
            double tol = 1e-5 * abs_sum + 1e-6;
            float got = ak_vec_dot(type, row, x, n), gots = ak_vec_dot_scalar(type, row, x, n);
            worst_simd = fmax(worst_simd, fabs(got - want) / abs_sum);
            worst_scalar = fmax(worst_scalar, fabs(gots - want) / abs_sum);
            CHECK(fabs(got - want) <= tol, "%s n=%lld: ak_vec_dot %.9g, want %.9g (tol %.3g)",
                  tname(type), (long long)n, got, want, tol);
            CHECK(fabs(gots - want) <= tol, "%s n=%lld: ak_vec_dot_scalar %.9g, want %.9g (tol %.3g)",
                  tname(type), (long long)n, gots, want, tol);
            if (quant)
                CHECK(fabs(got - exact) <= qbound + tol, "%s n=%lld: %.9g vs unquantized x %.9g (bound %.3g)",
                      tname(type), (long long)n, got, exact, qbound + tol);
        }
        printf("    %-4s max |dot - ref| / sum|w x|: simd %.2e, scalar %.2e\n", tname(type), worst_simd, worst_scalar);
    }
}

/* ------------------------------------------------------------------------ */
/* Matrix multiplication                                                    */
/* ------------------------------------------------------------------------ */

static int check_matmul_shape(ak_test_ctx *t, ak_threads *pool, uint32_t type, int64_t rows,
                              int64_t cols, int64_t ntok, ak_rng *r, double *worst) {
    size_t rb = ak_row_bytes(type, cols);
    float *w = malloc(sizeof(float) * rows * cols), *wd = malloc(sizeof(float) * rows * cols);
    float *x = malloc(sizeof(float) * ntok * cols), *xd = malloc(sizeof(float) * ntok * cols);
    float *y1 = malloc(sizeof(float) * ntok * rows), *y2 = malloc(sizeof(float) * ntok * rows);
    float *y3 = malloc(sizeof(float) * ntok * rows);
    float *y4 = malloc(sizeof(float) * ntok * rows), *y5 = malloc(sizeof(float) * ntok * rows);
    float *y6 = malloc(sizeof(float) * ntok * rows);
    uint8_t *W = malloc(rb * rows);
    /* the packed layout (kernels.h), where this build has one for the type */
    size_t pb = ak_packed_bytes(type, rows, cols);
    void *P = pb ? aligned_alloc(64, (pb + 63) & ~(size_t)63) : NULL;
    int ok = w && wd && x && xd && y1 && y2 && y3 && y4 && y5 && y6 && W && (!pb || P);
    CHECK(ok, "out of memory");
    int failures = 0;
    if (ok) {
        fill_normal(r, w, rows * cols, 0.3f);
        fill_normal(r, x, ntok * cols, 1.0f);
        for (int64_t i = 0; i < rows; i++) {
            ak_quantize_row(type, w + i * cols, W + i * rb, cols);
            ak_dequantize_row(type, W + i * rb, wd + i * cols, cols);
        }
        if (is_quant(type)) for (int64_t k = 0; k < ntok; k++) ref_quant_x(x + k * cols, cols, xd + k * cols);
        else memcpy(xd, x, sizeof(float) * ntok * cols);
        /* NaN sentinels catch outputs nobody wrote */
        for (int64_t i = 0; i < ntok * rows; i++) y1[i] = y2[i] = y3[i] = y4[i] = y5[i] = y6[i] = NAN;
        ak_matmul(pool, type, W, rows, cols, x, ntok, y1);
        ak_matmul(NULL, type, W, rows, cols, x, ntok, y2);
        ak_matmul_scalar(type, W, rows, cols, x, ntok, y3);
        if (pb) {
            ak_pack_weights(type, W, rows, cols, P);
            /* all tokens at once on the pool and on one thread, and one
             * token per call (decode): the same bits every way */
            ak_error err = {{0}};
            ak_matmul_args a = { .wtype = type, .W = P, .rows = rows, .cols = cols, .X = x, .ntok = ntok, .Y = y4 };
            int rc = ak_matmul_packed(pool, &a, &err);
            CHECK(rc == 0, "%s packed: %s", tname(type), err.msg);
            a.Y = y5;
            rc = ak_matmul_packed(NULL, &a, &err);
            CHECK(rc == 0, "%s packed: %s", tname(type), err.msg);
            for (int64_t k = 0; k < ntok; k++) {
                a.X = x + k * cols; a.ntok = 1; a.Y = y6 + k * rows;
                ak_matmul_packed(pool, &a, NULL);
            }
        }
        for (int64_t k = 0; k < ntok && failures < 5; k++) {
            for (int64_t i = 0; i < rows && failures < 5; i++) {
                double abs_sum, want = ref_dot(wd + i * cols, xd + k * cols, cols, &abs_sum);
                double tol = 1e-5 * abs_sum + 1e-6;
                float a = y1[k * rows + i], b = y2[k * rows + i], c = y3[k * rows + i];
                *worst = fmax(*worst, fabs(a - want) / abs_sum);
                if (pb) {
                    float p1 = y4[k * rows + i], p2 = y5[k * rows + i], p3 = y6[k * rows + i];
                    *worst = fmax(*worst, fabs(p1 - want) / abs_sum);
                    if (!(fabs(p1 - want) <= tol) || memcmp(&p1, &p2, 4) != 0 || memcmp(&p1, &p3, 4) != 0) {
                        failures++;
                        CHECK(0, "%s packed %lldx%lld ntok=%lld Y[%lld][%lld]: pool %.9g, single %.9g, "
                              "one token per call %.9g, want %.9g", tname(type), (long long)rows, (long long)cols,
                              (long long)ntok, (long long)k, (long long)i, p1, p2, p3, want);
                    }
                }
                if (!(fabs(a - want) <= tol && fabs(b - want) <= tol && fabs(c - want) <= tol)) {
                    failures++;
                    CHECK(0, "%s %lldx%lld ntok=%lld Y[%lld][%lld]: pool %.9g, single %.9g, scalar %.9g, want %.9g",
                          tname(type), (long long)rows, (long long)cols, (long long)ntok, (long long)k,
                          (long long)i, a, b, c, want);
                }
                /* Same code on one thread or many: bit-identical. */
                if (memcmp(&a, &b, 4) != 0) {
                    failures++;
                    CHECK(0, "%s Y[%lld][%lld]: pool %.9g != single thread %.9g", tname(type),
                          (long long)k, (long long)i, a, b);
                }
            }
        }
    }
    free(w); free(wd); free(x); free(xd); free(y1); free(y2); free(y3); free(y4); free(y5); free(y6); free(W); free(P);
    return failures;
}

TEST(kernel_matmul_vs_reference) {
    ak_error err = {{0}};
    ak_threads *pool = ak_threads_new(2, &err);
    REQUIRE(pool, "ak_threads_new: %s", err.msg);
    ak_rng r;
    ak_rng_seed(&r, 99);
    const int64_t rows_list[] = { 1, 5, 67, 130 };
    const int64_t ntok_list[] = { 1, 3, 17, 70 };
    const int64_t qcols[] = { 32, 96, 320 };
    const int64_t fcols[] = { 3, 37, 320 };
    for (size_t ti = 0; ti < sizeof all_types / sizeof all_types[0]; ti++) {
        uint32_t type = all_types[ti];
        const int64_t *cols_list = is_quant(type) ? qcols : fcols;
        double worst = 0;
        for (int ri = 0; ri < 4; ri++)
            for (int ci = 0; ci < 3; ci++)
                for (int ki = 0; ki < 4; ki++)
                    check_matmul_shape(t, pool, type, rows_list[ri], cols_list[ci], ntok_list[ki], &r, &worst);
        /* one larger, prefill-like shape */
        check_matmul_shape(t, pool, type, 260, 2048, 130, &r, &worst);
        printf("    %-4s max |Y - ref| / sum|w x| = %.2e%s\n", tname(type), worst,
               ak_packed_bytes(type, 16, 32) ? " (row-major and packed kernels)" : "");
    }
    ak_threads_free(pool);
}

/* The packed kernels' out-of-memory path holds one token's activations on
 * the stack (64 KiB); rows too long for it must be left to the row-major
 * kernels instead of packed (they once produced zeros there). */
TEST(kernel_packed_declines_rows_too_long_for_its_fallback) {
    const uint32_t q[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1 };
    for (int i = 0; i < 5; i++) {
        if (!ak_packed_bytes(q[i], 16, 32)) continue;   /* no packed kernels in this build */
        CHECK(ak_packed_bytes(q[i], 16, 32768) > 0, "type %u: 32768 columns should be packed", q[i]);
        CHECK(ak_packed_bytes(q[i], 16, 65536) == 0, "type %u: 65536 columns packed, past the fallback's buffer",
              q[i]);
    }
}

/* Where the build has SIMD kernels, every weight type has packed ones, so
 * the comparisons above and in test_kquant.c run them: AVX2 (with or
 * without AVX-VNNI), AVX-512 (with VNNI on 64-byte vectors, without it
 * AVX2's tiles) and NEON pack every type. A build that silently fell back
 * to the row-major kernels would pass those comparisons without testing
 * the packed code; this fails instead. */
TEST(kernel_packed_paths_built_for_every_type) {
    const uint32_t fl[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16 };
    const uint32_t q[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
                           GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K };
    const char *simd = ak_simd_name();
    int want_f = !strcmp(simd, "avx2") || !strcmp(simd, "avx512") || !strcmp(simd, "neon");
    int want_q = want_f;
    for (int i = 0; i < 3; i++)
        CHECK((ak_packed_bytes(fl[i], 16, 256) > 0) == want_f, "%s: packed %zu bytes on %s", tname(fl[i]),
              ak_packed_bytes(fl[i], 16, 256), simd);
    for (int i = 0; i < 8; i++)
        CHECK((ak_packed_bytes(q[i], 16, 256) > 0) == want_q, "type %u: packed %zu bytes on %s", q[i],
              ak_packed_bytes(q[i], 16, 256), simd);
    printf("    %s: packed float %s, packed quantized %s\n", simd, want_f ? "yes" : "no", want_q ? "yes" : "no");
}

/* The packed product when its scratch cannot be had (the pool's scratch
 * made to fail, as out of memory): it computes one token at a time on the
 * stack and gives the same bits as with scratch, never zeros. A product the
 * build has no packed kernels for is an error (AK_ERR_INVALID) that leaves
 * Y untouched, where it once wrote zeros. */
TEST(kernel_packed_scratch_failure) {
    ak_error err = {{0}};
    ak_threads *pool = ak_threads_new(2, &err);
    REQUIRE(pool, "ak_threads_new: %s", err.msg);
    ak_rng r;
    ak_rng_seed(&r, 41);
    const uint32_t types[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_Q5_1, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K,
                               GGML_TYPE_F16 };
    enum { ROWS = 40, COLS = 512, NTOK = 5 };
    static float w[ROWS * COLS], x[NTOK * COLS], y1[NTOK * ROWS], y2[NTOK * ROWS];
    static uint8_t W[ROWS * COLS * 4];
    int ran = 0;
    for (int ti = 0; ti < 6; ti++) {
        uint32_t type = types[ti];
        size_t pb = ak_packed_bytes(type, ROWS, COLS), rb = ak_row_bytes(type, COLS);
        if (!pb) continue;   /* checked by kernel_packed_paths_built_for_every_type */
        void *P = aligned_alloc(64, (pb + 63) & ~(size_t)63);
        REQUIRE(P, "out of memory");
        fill_normal(&r, w, ROWS * COLS, 0.3f);
        fill_normal(&r, x, NTOK * COLS, 1.0f);
        for (int i = 0; i < ROWS; i++) ak_quantize_row(type, w + i * COLS, W + i * rb, COLS);
        ak_pack_weights(type, W, ROWS, COLS, P);
        for (int i = 0; i < NTOK * ROWS; i++) y1[i] = y2[i] = NAN;
        ak_threads_limit_scratch(pool, SIZE_MAX);
        ak_matmul_args a = { .wtype = type, .W = P, .rows = ROWS, .cols = COLS, .X = x, .ntok = NTOK, .Y = y1 };
        CHECK(ak_matmul_packed(pool, &a, &err) == 0, "%u: %s", type, err.msg);
        ak_threads_limit_scratch(pool, 0);
        CHECK(ak_threads_scratch(pool, 64) == NULL, "the limit should make the scratch fail");
        a.Y = y2;
        CHECK(ak_matmul_packed(pool, &a, &err) == 0, "%u: %s", type, err.msg);
        int same = memcmp(y1, y2, sizeof y1) == 0, nonzero = 0;
        for (int i = 0; i < NTOK * ROWS; i++) nonzero += y2[i] != 0 && !isnan(y2[i]);
        CHECK(same && nonzero == NTOK * ROWS, "type %u without scratch: %s, %d of %d outputs nonzero", type,
              same ? "same bits" : "different bits", nonzero, NTOK * ROWS);
        ak_threads_limit_scratch(pool, SIZE_MAX);
        free(P);
        ran++;
    }
    /* not packable here: Q4_K rows of 300 columns (not whole super-blocks) */
    for (int i = 0; i < NTOK * ROWS; i++) y1[i] = NAN;
    err.code = AK_ERR_NONE;
    CHECK(ak_matmul_packed(pool, &(ak_matmul_args){ .wtype = GGML_TYPE_Q4_K, .W = W, .rows = ROWS, .cols = 300, .X = x,
                                                    .ntok = NTOK, .Y = y1 }, &err) == -1,
          "unpackable shape accepted");
    CHECK(err.code == AK_ERR_INVALID, "error code %d, want AK_ERR_INVALID", err.code);
    int touched = 0;
    for (int i = 0; i < NTOK * ROWS; i++) touched += !isnan(y1[i]);
    CHECK(touched == 0, "%d outputs written by a refused product", touched);
    printf("    %d types computed without scratch\n", ran);
    ak_threads_free(pool);
}

/* Rows that end exactly where an inaccessible page begins: a kernel that
 * reads past the end of a row (tails of 1..3 blocks, odd float lengths)
 * crashes here instead of silently reading a neighbour's bytes. */
TEST(kernel_no_overread_past_row_end) {
    long page = sysconf(_SC_PAGESIZE);
    uint8_t *map = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(map != MAP_FAILED, "mmap");
    REQUIRE(mprotect(map + page, (size_t)page, PROT_NONE) == 0, "mprotect");
    ak_rng r;
    ak_rng_seed(&r, 5);
    float w[160], x[4 * 160], y[4], wd[160];
    const int64_t lens[] = { 32, 64, 96, 160, 1, 5, 17, 31 };
    for (size_t ti = 0; ti < sizeof all_types / sizeof all_types[0]; ti++) {
        uint32_t type = all_types[ti];
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int64_t n = lens[li];
            if (is_quant(type) && n % 32) continue;
            size_t rb = ak_row_bytes(type, n);
            uint8_t *row = map + page - rb;
            fill_normal(&r, w, n, 1.0f);
            fill_normal(&r, x, 4 * n, 1.0f);
            ak_quantize_row(type, w, row, n);
            ak_dequantize_row(type, row, wd, n);
            float d = ak_vec_dot(type, row, x, n);
            ak_matmul(NULL, type, row, 1, n, x, 4, y);   /* one row, four tokens */
            double abs_sum, want = ref_dot(wd, x, n, &abs_sum);
            double tol = is_quant(type) ? 0.02 * abs_sum + 1e-6 : 1e-5 * abs_sum + 1e-6;
            CHECK(fabs(d - want) <= tol && fabs(y[0] - want) <= tol, "%s n=%lld: %g %g want %g",
                  tname(type), (long long)n, d, y[0], want);
        }
    }
    munmap(map, 2 * (size_t)page);
}

/* ------------------------------------------------------------------------ */
/* Thread pool                                                              */
/* ------------------------------------------------------------------------ */

typedef struct {
    int nth, nth_seen_bad;
    atomic_int seen[8];
    atomic_llong sum;
    const int *data;
    int n;
} pool_ctx;

static void pool_task(void *arg, int ith, int nth) {
    pool_ctx *c = arg;
    if (ith < 0 || ith >= 8 || nth != c->nth) { c->nth_seen_bad = 1; return; }
    atomic_fetch_add(&c->seen[ith], 1);
    long long s = 0;
    for (int i = ith; i < c->n; i += nth) s += c->data[i];
    atomic_fetch_add(&c->sum, s);
}

static void run_pool_rounds(ak_test_ctx *t, ak_threads *pool, int nth, int rounds, int sleep_every) {
    static int data[1000];
    long long want = 0;
    for (int i = 0; i < 1000; i++) { data[i] = i * 7 - 300; want += data[i]; }
    for (int k = 0; k < rounds; k++) {
        pool_ctx c = { .nth = nth, .data = data, .n = 1000 };
        for (int i = 0; i < 8; i++) atomic_init(&c.seen[i], 0);
        atomic_init(&c.sum, 0);
        ak_threads_run(pool, pool_task, &c);
        int bad = c.nth_seen_bad;
        for (int i = 0; i < 8; i++) bad |= atomic_load(&c.seen[i]) != (i < nth);
        if (bad || atomic_load(&c.sum) != want) {
            CHECK(0, "nth=%d round %d: seen %d %d %d %d, sum %lld want %lld", nth, k,
                  atomic_load(&c.seen[0]), atomic_load(&c.seen[1]), atomic_load(&c.seen[2]),
                  atomic_load(&c.seen[3]), (long long)atomic_load(&c.sum), want);
            return;
        }
        if (sleep_every && k % sleep_every == 0) {   /* let workers fall asleep */
            struct timespec ts = { 0, 2000000 };
            nanosleep(&ts, NULL);
        }
    }
}

/* Several packed products of the same activations in one parallel region
 * (ak_matmul_packed_n: a layer's Q, K, V): each output the same bits as the
 * matrix's own ak_matmul_packed, with work items that span two matrices
 * (row counts not multiples of the items' groups), decode and batches; n
 * out of range is AK_ERR_INVALID with nothing written. */
TEST(kernel_packed_n_matches_one_by_one) {
    ak_error err = {{0}};
    ak_threads *pool = ak_threads_new(2, &err);
    REQUIRE(pool, "ak_threads_new: %s", err.msg);
    ak_rng r;
    ak_rng_seed(&r, 5);
    const uint32_t types[] = { GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q5_1, GGML_TYPE_Q4_K };
    const int64_t rows[3] = { 40, 17, 130 }, cols = 256, ntoks[] = { 1, 3, 9 };
    int tested = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t type = types[ti];
        if (!ak_packed_bytes(type, 16, cols)) continue;   /* none in this build */
        size_t rb = ak_row_bytes(type, cols);
        void *P[3] = {0};
        float *w = malloc(sizeof(float) * cols), *x = malloc(sizeof(float) * 9 * cols);
        float *y1[3], *y2[3];
        REQUIRE(w && x, "out of memory");
        fill_normal(&r, x, 9 * cols, 1.0f);
        for (int m = 0; m < 3; m++) {
            uint8_t *W = malloc(rb * rows[m]);
            P[m] = aligned_alloc(64, (ak_packed_bytes(type, rows[m], cols) + 63) & ~(size_t)63);
            y1[m] = malloc(sizeof(float) * 9 * rows[m]);
            y2[m] = malloc(sizeof(float) * 9 * rows[m]);
            REQUIRE(W && P[m] && y1[m] && y2[m], "out of memory");
            for (int64_t i = 0; i < rows[m]; i++) {
                fill_normal(&r, w, cols, 0.3f);
                ak_quantize_row(type, w, W + i * rb, cols);
            }
            ak_pack_weights(type, W, rows[m], cols, P[m]);
            free(W);
        }
        for (size_t ki = 0; ki < 3; ki++) {
            const int64_t nt = ntoks[ki];
            ak_matmul_args a[3];
            for (int m = 0; m < 3; m++) {
                for (int64_t i = 0; i < nt * rows[m]; i++) y1[m][i] = y2[m][i] = NAN;
                a[m] = (ak_matmul_args){ .wtype = type, .W = P[m], .rows = rows[m], .cols = cols, .X = x, .ntok = nt,
                                         .Y = y1[m] };
                CHECK(ak_matmul_packed(pool, &a[m], &err) == 0, "%s", err.msg);
                a[m].Y = y2[m];
            }
            CHECK(ak_matmul_packed_n(pool, 3, a, &err) == 0, "%s", err.msg);
            for (int m = 0; m < 3; m++)
                CHECK(!memcmp(y1[m], y2[m], sizeof(float) * nt * rows[m]), "%s ntok %lld: matrix %d differs",
                      tname(type), (long long)nt, m);
            tested++;
        }
        ak_matmul_args a5[5];
        for (int m = 0; m < 5; m++)
            a5[m] = (ak_matmul_args){ .wtype = type, .W = P[m % 3], .rows = rows[m % 3], .cols = cols, .X = x,
                                      .ntok = 1, .Y = y2[m % 3] };
        err.code = AK_ERR_NONE;
        CHECK(ak_matmul_packed_n(pool, 5, a5, &err) == -1 && err.code == AK_ERR_INVALID,
              "5 matrices accepted (code %d)", err.code);
        err.code = AK_ERR_NONE;
        CHECK(ak_matmul_packed_n(pool, 0, a5, &err) == -1 && err.code == AK_ERR_INVALID,
              "0 matrices accepted (code %d)", err.code);
        /* products that do not share their activations, or their width */
        for (int m = 0; m < 3; m++) for (int64_t i = 0; i < rows[m]; i++) y2[m][i] = NAN;
        a5[1].X = x + cols;
        err.code = AK_ERR_NONE;
        CHECK(ak_matmul_packed_n(pool, 3, a5, &err) == -1 && err.code == AK_ERR_INVALID,
              "products of different activations accepted (code %d)", err.code);
        a5[1].X = x;
        a5[2].cols = cols / 2;
        err.code = AK_ERR_NONE;
        CHECK(ak_matmul_packed_n(pool, 3, a5, &err) == -1 && err.code == AK_ERR_INVALID,
              "products of different widths accepted (code %d)", err.code);
        int written = 0;
        for (int m = 0; m < 3; m++) for (int64_t i = 0; i < rows[m]; i++) written += !isnan(y2[m][i]);
        CHECK(written == 0, "a refused product wrote %d outputs", written);
        for (int m = 0; m < 3; m++) { free(P[m]); free(y1[m]); free(y2[m]); }
        free(w); free(x);
    }
    ak_threads_free(pool);
    if (!tested) SKIP("no packed kernels in this build (%s)", ak_simd_name());
}

TEST(kernel_threadpool) {
    ak_error err = {{0}};
    run_pool_rounds(t, NULL, 1, 3, 0);
    for (int nth = 1; nth <= 4; nth *= 2) {
        ak_threads *pool = ak_threads_new(nth, &err);
        REQUIRE(pool, "ak_threads_new(%d): %s", nth, err.msg);
        CHECK(ak_threads_size(pool) == nth, "size %d want %d", ak_threads_size(pool), nth);
        CHECK(ak_threads_runs(pool) == 0, "a new pool has run %llu times", (unsigned long long)ak_threads_runs(pool));
        run_pool_rounds(t, pool, nth, 5000, 0);    /* spinning hand-offs (qemu runs this test too) */
        run_pool_rounds(t, pool, nth, 40, 1);      /* condvar hand-offs */
        /* every run counted once, whatever the hand-off */
        CHECK(ak_threads_runs(pool) == 5040, "nth=%d: %llu runs counted, want 5040", nth,
              (unsigned long long)ak_threads_runs(pool));
        /* scratch: aligned, grows, reused */
        uint8_t *s1 = ak_threads_scratch(pool, 100);
        CHECK(s1 && ((uintptr_t)s1 & 63) == 0, "scratch %p not 64-byte aligned", (void *)s1);
        if (s1) memset(s1, 1, 100);
        CHECK(ak_threads_scratch(pool, 50) == s1, "smaller request should reuse the buffer");
        uint8_t *s2 = ak_threads_scratch(pool, 1 << 20);
        CHECK(s2 && ((uintptr_t)s2 & 63) == 0, "grown scratch not aligned");
        if (s2) memset(s2, 2, 1 << 20);
        ak_threads_free(pool);
    }
    CHECK(ak_threads_scratch(NULL, 10) == NULL, "scratch of NULL pool");
    CHECK(ak_threads_runs(NULL) == 0, "runs of NULL pool");
    ak_threads *pool = ak_threads_new(0, &err);
    CHECK(pool && ak_threads_size(pool) == ak_num_cpus(), "n_threads 0 means all cores");
    ak_threads_free(pool);
}

static void count_task(void *ctx, int ith, int nth) {
    (void)ith; (void)nth;
    atomic_fetch_add((atomic_int *)ctx, 1);
}

/* The sleep and wake-up hand-offs, every run: with the spin set to 0 each
 * run's caller and workers block on the condition variables, so a wake-up
 * lost in the announce-then-check handshakes leaves them all asleep. The
 * rounds run in a child process, so that a hang is reported (with the run
 * it stopped at) instead of holding the suite. The child runs for about
 * 1.5 s: long enough to catch, most times, the wake-up that qemu-aarch64 7.2
 * lost when the caller's announcement was a plain seq_cst store (see
 * ak_threads_run; the rates are in docs/speed.md). */
TEST(kernel_threadpool_blocking_handoffs_lose_no_wakeup) {
    _Atomic long *done = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(done != MAP_FAILED, "mmap");
    atomic_init(done, 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        ak_error err = {{0}};
        double t0 = ak_now();
        for (int nth = 2; nth <= 3; nth++) {
            ak_threads *pool = ak_threads_new(nth, &err);
            if (!pool) _exit(3);
            ak_threads_set_spin(pool, 0);
            /* about a second each, but at least 600 runs (a loaded machine
             * gives few per second); 25 s at most, inside the parent's wait */
            double t_end = ak_now() + 1.1;
            for (long k = 0; k < 4000000 && ak_now() - t0 < 25 && (ak_now() < t_end || k < 600); k++) {
                atomic_int ran;   /* each thread once per run */
                atomic_init(&ran, 0);
                ak_threads_run(pool, count_task, &ran);
                if (atomic_load(&ran) != nth) _exit(4);
                atomic_fetch_add_explicit(done, 1, memory_order_relaxed);
            }
            ak_threads_free(pool);
        }
        _exit(0);
    }
    int status = 0, ended = 0;
    for (int i = 0; i < 600 && !ended; i++) {   /* 60 s: qemu's slowest */
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) ended = 1;
        else { struct timespec ts = { 0, 100000000 }; nanosleep(&ts, NULL); }
    }
    if (!ended) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    long runs = atomic_load(done);
    CHECK(ended, "the pool hung after %ld runs: a lost wake-up", runs);
    CHECK(!ended || (WIFEXITED(status) && WEXITSTATUS(status) == 0), "child ended with status %d after %ld runs",
          status, runs);
    CHECK(runs >= 1000, "only %ld runs", runs);
    printf("  %ld blocking runs\n", runs);
    munmap((void *)done, 4096);
}

/* The vector exp and SwiGLU gate (vmath.h) against libm in double: relative
 * error under 1e-6 across the range attention and the FFN feed them,
 * including the clamped ends, -inf (softmax of masked scores) and 0. */
/* e[0..16) = exp(e[0..16)) through ak_exp_v16. */
static void exp_in_place(float *e) {
    ak_v16f v = AK_V16F_LD(e);
    ak_exp_v16(&v);
    AK_V16F_ST(e, v);
}

TEST(vmath_exp_and_silu_vs_libm) {
    double worst_exp = 0, worst_silu = 0;
    float g[4096], u[4096], y[4096];
    ak_rng r;
    ak_rng_seed(&r, 7);
    for (int i = 0; i < 4096; i++) {
        g[i] = i < 4000 ? -87.0f + 175.0f * (float)i / 4000 : ak_rng_normal(&r) * 8;
        u[i] = ak_rng_normal(&r);
    }
    for (int i = 0; i + 16 <= 4096; i += 16) {
        float e[16];
        AK_V16F_ST(e, AK_V16F_LD(g + i));
        exp_in_place(e);
        for (int k = 0; k < 16; k++) {
            double want = exp((double)g[i + k]);
            worst_exp = fmax(worst_exp, fabs(e[k] - want) / want);
        }
    }
    CHECK(worst_exp < 1e-6, "exp: relative error %.3e", worst_exp);
    float special[16] = {-INFINITY, -1000.0f, 1000.0f, 0.0f}, e[16];
    memcpy(e, special, sizeof e);
    exp_in_place(e);
    CHECK(e[0] >= 0 && e[0] < 1e-37f && e[1] < 1e-37f && e[2] > 1e38f && e[3] == 1.0f,
          "exp(-inf) %g, exp(-1000) %g, exp(1000) %g, exp(0) %g", e[0], e[1], e[2], e[3]);
    memcpy(y, g, sizeof g);
    ak_silu_mul(y, u, 4093);   /* a tail that is not a multiple of 16 */
    for (int i = 0; i < 4093; i++) {
        double want = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        worst_silu = fmax(worst_silu, fabs(y[i] - want) / fmax(fabs(want), 1e-30));
        if (worst_silu > 1e-5) break;
    }
    CHECK(worst_silu < 1e-5, "silu: relative error %.3e", worst_silu);
    CHECK(y[4093] == g[4093], "silu wrote past n");
    printf("    exp max relative error %.2e, silu*u %.2e\n", worst_exp, worst_silu);
}

/* Attention's inner loops (vmath.h, at this build's vector width AK_VF_N)
 * against double references: scores of 1-4 queries over transposed keys
 * (Tp 16, 48 and 80: whole tiles and the tail of one vector), the softmax
 * steps with a window (lo > 0) and a short row (c not a multiple of the
 * width), weighted values for dv = 64 (whole passes), 72 (a single vector
 * after them) and 70 (scalar tail). A query's scores must also be the same
 * bits whichever queries share the call (batch invariance). */
TEST(vmath_attention_loops_vs_double) {
    enum { DK = 24, TPMAX = 80, DVMAX = 72 };
    ak_rng r;
    ak_rng_seed(&r, 19);
    static float kt[DK * TPMAX], q[4][DK], s[4 * TPMAX], s1[TPMAX], v[TPMAX * DVMAX], acc[DVMAX], p[TPMAX];
    for (int i = 0; i < DK * TPMAX; i++) kt[i] = ak_rng_normal(&r);
    for (int i = 0; i < 4; i++)
        for (int d = 0; d < DK; d++) q[i][d] = ak_rng_normal(&r);
    const float *qs[4] = {q[0], q[1], q[2], q[3]};
    double worst = 0;
    int bits_differ = 0;
    for (int Tp = 16; Tp <= TPMAX; Tp += 32)
        for (int nr = 1; nr <= 4; nr++) {
            memset(s, 0, sizeof s);
            ak_attn_scores(qs, nr, kt, DK, Tp, s);
            for (int i = 0; i < nr; i++)
                for (int j = 0; j < Tp; j++) {
                    double want = 0, mag = 0;
                    for (int d = 0; d < DK; d++) {
                        want += (double)q[i][d] * kt[d * Tp + j];
                        mag += fabs((double)q[i][d] * kt[d * Tp + j]);
                    }
                    worst = fmax(worst, fabs(s[i * Tp + j] - want) / mag);
                }
            /* the last query alone: the same bits as within the group */
            const float *one[1] = {q[nr - 1]};
            ak_attn_scores(one, 1, kt, DK, Tp, s1);
            bits_differ += memcmp(s1, s + (size_t)(nr - 1) * Tp, sizeof(float) * (size_t)Tp) != 0;
        }
    CHECK(worst < 1e-6, "scores: error %.3e of the sum of |products|", worst);
    CHECK(bits_differ == 0, "%d score rows changed with the queries beside them", bits_differ);

    /* softmax: window [lo, c) of a row of Tp = 48 */
    const int lo = 5, c = 37;
    float sc[48];
    for (int j = 0; j < 48; j++) sc[j] = ak_rng_normal(&r) * 4;
    float raw[48];
    memcpy(raw, sc, sizeof raw);
    const float add = 0.25f, scale = 0.7f;
    float m = ak_softmax_scale_max(sc, lo, c, add, scale);
    double wm = -INFINITY;
    for (int j = lo; j < c; j++) wm = fmax(wm, ((double)raw[j] + add) * scale);
    CHECK(fabs(m - wm) <= 1e-6 * fabs(wm), "softmax max %g, want %g", m, wm);
    for (int j = 0; j < c; j++)
        if (j < lo) CHECK(isinf(sc[j]) && sc[j] < 0, "score %d outside the window is %g, not -inf", j, sc[j]);
    float sum = ak_softmax_exp_sum(sc, lo, c, m);
    double wsum = 0, werr = 0;
    for (int j = lo; j < c; j++) {
        double want = exp(((double)raw[j] + add) * scale - m);
        wsum += want;
        werr = fmax(werr, fabs(sc[j] - want) / want);
    }
    int zeros_ok = 1;
    for (int j = 0; j < lo; j++) zeros_ok &= sc[j] == 0.0f;
    for (int j = c; j < (c + AK_VF_N - 1) / AK_VF_N * AK_VF_N; j++) zeros_ok &= sc[j] == 0.0f;
    CHECK(werr < 1e-5, "softmax weights: relative error %.3e", werr);
    CHECK(fabs(sum - wsum) < 1e-5 * wsum, "softmax sum %g, want %g", sum, wsum);
    CHECK(zeros_ok, "weights outside [lo, c) are not zero");

    /* weighted values */
    for (int j = 0; j < TPMAX; j++) p[j] = ak_rng_uniform(&r);
    for (int i = 0; i < TPMAX * DVMAX; i++) v[i] = ak_rng_normal(&r);
    const int dvs[3] = {64, 72, 70};
    double vworst = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int n = 1; n <= 33; n += 16) {
            int dv = dvs[ti];
            float init[DVMAX];
            for (int d = 0; d < DVMAX; d++) init[d] = ak_rng_normal(&r);
            memcpy(acc, init, sizeof acc);
            float guard = acc[DVMAX - 1];
            ak_attn_values(p, n, v, dv, acc);
            for (int d = 0; d < dv; d++) {
                double want = init[d], mag = fabs(init[d]);
                for (int j = 0; j < n; j++) {
                    want += (double)p[j] * v[j * dv + d];
                    mag += fabs((double)p[j] * v[j * dv + d]);
                }
                vworst = fmax(vworst, fabs(acc[d] - want) / mag);
            }
            if (dv < DVMAX) CHECK(acc[DVMAX - 1] == guard, "values wrote past dv %d", dv);
        }
    CHECK(vworst < 1e-6, "values: error %.3e of the sum of |terms|", vworst);

    /* ak_exp_vf, lane by lane the same as ak_exp_v16 */
    float e16[16], ef[16];
    for (int i = 0; i < 16; i++) e16[i] = ef[i] = ak_rng_normal(&r) * 20;
    exp_in_place(e16);
    for (int i = 0; i < 16; i += AK_VF_N) {
        ak_vf x = AK_VF_LD(ef + i);
        ak_exp_vf(&x);
        AK_VF_ST(ef + i, x);
    }
    CHECK(memcmp(e16, ef, sizeof ef) == 0, "ak_exp_vf differs from ak_exp_v16");
    printf("    width %d: scores %.2e, values %.2e, softmax weights %.2e\n", AK_VF_N, worst, vworst, werr);
}
