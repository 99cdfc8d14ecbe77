/* test_kquant.c - Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K weights: the byte layout
 * (random blocks decoded by a reference written here from the format
 * description, element by element), quantizer error bounds, dot products and
 * matmul (SIMD and scalar) against double-precision references, and loading
 * K-quant GGUF files from ../shared/models if there are any. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "test.h"
#include "base/gguf.h"
#include "kernels/kernels.h"
#include "engine/model.h"
#include "base/threadpool.h"
#include "base/util.h"

static const struct { uint32_t type; const char *name; int qk; int bytes; } kq_types[] = {
    {GGML_TYPE_Q4_1, "Q4_1", 32, 20},   {GGML_TYPE_Q5_0, "Q5_0", 32, 22},   {GGML_TYPE_Q5_1, "Q5_1", 32, 24},
    {GGML_TYPE_Q4_K, "Q4_K", 256, 144}, {GGML_TYPE_Q5_K, "Q5_K", 256, 176}, {GGML_TYPE_Q6_K, "Q6_K", 256, 210},
};
#define N_KQ (sizeof kq_types / sizeof kq_types[0])

/* IEEE half -> double from the definition. */
static double ref_half(const uint8_t *p) {
    unsigned h = p[0] | p[1] << 8;
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return sign ? -v : v;
}

/* Reference decoder, one block, straight from the format description. */
static void ref_decode(uint32_t type, const uint8_t *b, double *y) {
    switch (type) {
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: {
        double d = ref_half(b), m = 0, off = 0;
        const uint8_t *qh = NULL, *qs;
        if (type == GGML_TYPE_Q4_1) { m = ref_half(b + 2); qs = b + 4; }
        else if (type == GGML_TYPE_Q5_0) { qh = b + 2; qs = b + 6; off = 16; }
        else { m = ref_half(b + 2); qh = b + 4; qs = b + 8; }
        for (int e = 0; e < 32; e++) {
            int q = e < 16 ? qs[e] % 16 : qs[e - 16] / 16;
            if (qh && (qh[e / 8] >> (e % 8)) & 1) q += 16;
            y[e] = d * (q - off) + m;
        }
        break;
    }
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: {
        double d = ref_half(b), dmin = ref_half(b + 2);
        const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (type == GGML_TYPE_Q5_K ? 48 : 16);
        for (int e = 0; e < 256; e++) {
            int j = e / 32, sc, mn;
            if (j < 4) { sc = s[j] % 64; mn = s[j + 4] % 64; }
            else { sc = s[j + 4] % 16 + (s[j - 4] / 64) * 16; mn = s[j + 4] / 16 + (s[j] / 64) * 16; }
            int c = e / 64, hi = (e % 64) >= 32, l = e % 32;
            int q = hi ? qs[32 * c + l] / 16 : qs[32 * c + l] % 16;
            if (type == GGML_TYPE_Q5_K && (qh[l] >> (2 * c + hi)) & 1) q += 16;
            y[e] = d * sc * q - dmin * mn;
        }
        break;
    }
    case GGML_TYPE_Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        double d = ref_half(b + 208);
        for (int n = 0; n < 2; n++)
            for (int l = 0; l < 32; l++) {
                int h = qh[32 * n + l];
                int q1 = (ql[64 * n + l] & 15) | (h & 3) << 4;
                int q2 = (ql[64 * n + 32 + l] & 15) | ((h >> 2) & 3) << 4;
                int q3 = (ql[64 * n + l] >> 4) | ((h >> 4) & 3) << 4;
                int q4 = (ql[64 * n + 32 + l] >> 4) | ((h >> 6) & 3) << 4;
                int is = 8 * n + l / 16;
                y[128 * n + l] = d * sc[is] * (q1 - 32);
                y[128 * n + 32 + l] = d * sc[is + 2] * (q2 - 32);
                y[128 * n + 64 + l] = d * sc[is + 4] * (q3 - 32);
                y[128 * n + 96 + l] = d * sc[is + 6] * (q4 - 32);
            }
        break;
    }
    default: break;
    }
}

static void fill_normal(ak_rng *r, float *x, int64_t n, float sigma) {
    for (int64_t i = 0; i < n; i++) {
        double u1 = (ak_rng_u32(r) + 1.0) / 4294967297.0, u2 = ak_rng_u32(r) / 4294967296.0;
        x[i] = (float)(sigma * sqrt(-2 * log(u1)) * cos(2 * M_PI * u2));
    }
}

/* A random finite half in [2^-10, 2^-4): scales of realistic size. */
static void rand_half(ak_rng *r, uint8_t *p) {
    unsigned h = (unsigned)((5 + ak_rng_u32(r) % 6) << 10 | (ak_rng_u32(r) & 1023));
    p[0] = (uint8_t)h; p[1] = (uint8_t)(h >> 8);
}

TEST(kquant_layout_matches_reference_decoder) {
    ak_rng r;
    ak_rng_seed(&r, 5);
    for (size_t ti = 0; ti < N_KQ; ti++) {
        uint32_t type = kq_types[ti].type;
        int qk = kq_types[ti].qk, bb = kq_types[ti].bytes;
        enum { NB = 8 };
        uint8_t blk[NB * 210];
        double want[256];
        float got[NB * 256];
        for (int i = 0; i < NB * bb; i++) blk[i] = (uint8_t)ak_rng_u32(&r);
        for (int b = 0; b < NB; b++) {   /* finite scales */
            uint8_t *p = blk + b * bb;
            if (type == GGML_TYPE_Q6_K) rand_half(&r, p + 208);
            else {
                rand_half(&r, p);
                if (type != GGML_TYPE_Q5_0) rand_half(&r, p + 2);
            }
        }
        REQUIRE(ak_wtype_supported(type), "%s unsupported", kq_types[ti].name);
        CHECK(ak_row_bytes(type, (int64_t)NB * qk) == (size_t)(NB * bb), "%s row bytes %zu", kq_types[ti].name,
              ak_row_bytes(type, (int64_t)NB * qk));
        CHECK(gguf_type_block_bytes(type) == (uint32_t)bb && gguf_type_block_elems(type) == (uint32_t)qk,
              "%s: GGUF block table disagrees", kq_types[ti].name);
        ak_dequantize_row(type, blk, got, (int64_t)NB * qk);
        int bad = 0;
        for (int b = 0; b < NB && bad < 3; b++) {
            ref_decode(type, blk + b * bb, want);
            for (int e = 0; e < qk && bad < 3; e++) {
                double w = want[e], g = got[b * qk + e];
                if (fabs(w - g) > 1e-6 * fabs(w) + 1e-9) {
                    bad++;
                    CHECK(0, "%s block %d elem %d: %.9g, reference %.9g", kq_types[ti].name, b, e, g, w);
                }
            }
        }
    }
}

/* Quantize -> dequantize of Gaussian rows, relative RMS error against the
 * input. Bounds from the bits: uniform rounding over a block's range R with
 * 2^b - 1 steps has RMS error R / (2^b - 1) / sqrt(12); 32 Gaussian values
 * span about 4.1 sigma, 16 about 3.5 sigma. So about 0.079 (4 bits),
 * 0.038 (5 bits), 0.016 (Q6_K); the bounds allow ~20-35% for the 6-bit
 * quantization of sub-block scales and mins (Q6_K: 8-bit scales, but its
 * range is asymmetric, -32..31) and Q5_0's fixed zero point. A transposed nibble or wrong
 * scale gives errors of order 1. The fits must also beat plain min/max
 * rounding (which the fitted K quantizers start from) or match it. */
TEST(kquant_roundtrip_error_bounds) {
    static const double bound[N_KQ] = {0.095, 0.05, 0.046, 0.095, 0.046, 0.022};
    ak_rng r;
    ak_rng_seed(&r, 11);
    enum { N = 256 * 64 };
    static float x[N], y[N];
    static uint8_t q[N];
    fill_normal(&r, x, N, 1.0f);
    for (int b = 0; b < N / 256; b++) {   /* different magnitudes per super-block */
        float s = b % 5 == 0 ? 1e-3f : b % 5 == 1 ? 30.0f : 1.0f;
        for (int i = 0; i < 256; i++) x[b * 256 + i] *= s;
    }
    for (size_t ti = 0; ti < N_KQ; ti++) {
        uint32_t type = kq_types[ti].type;
        ak_quantize_row(type, x, q, N);
        ak_dequantize_row(type, q, y, N);
        /* relative RMS per super-block (scales differ), then the mean */
        double worst = 0, mean = 0;
        for (int b = 0; b < N / 256; b++) {
            double se = 0, sx = 0;
            for (int i = 0; i < 256; i++) {
                double e = (double)x[b * 256 + i] - y[b * 256 + i];
                se += e * e; sx += (double)x[b * 256 + i] * x[b * 256 + i];
            }
            double rel = sqrt(se / sx);
            worst = fmax(worst, rel);
            mean += rel / (N / 256);
        }
        printf("    %s: relative RMS error mean %.4f, worst super-block %.4f (bound %.3f)\n", kq_types[ti].name,
               mean, worst, bound[ti]);
        CHECK(mean <= bound[ti], "%s: mean relative RMS error %.4f > %.3f", kq_types[ti].name, mean, bound[ti]);
        CHECK(worst <= 1.5 * bound[ti], "%s: worst relative RMS error %.4f", kq_types[ti].name, worst);
        CHECK(mean >= bound[ti] / 4, "%s: suspiciously small error %.4f", kq_types[ti].name, mean);
    }
    /* all-zero and constant rows survive exactly */
    static float z[512], zz[512];
    for (size_t ti = 0; ti < N_KQ; ti++) {
        for (int c = 0; c < 2; c++) {
            for (int i = 0; i < 512; i++) z[i] = c ? -0.25f : 0.0f;
            ak_quantize_row(kq_types[ti].type, z, q, 512);
            ak_dequantize_row(kq_types[ti].type, q, zz, 512);
            double e = 0;
            for (int i = 0; i < 512; i++) e = fmax(e, fabs(z[i] - zz[i]));
            CHECK(e <= 1e-3, "%s constant %g: max error %g", kq_types[ti].name, z[0], e);
        }
    }
}

/* Activations as the kernels quantize them: per block of qk (256 for K
 * types, else 32), d = amax/127, q = round-half-even(x / d). */
static void ref_quant_x(const float *x, int64_t n, int qk, float *xd) {
    for (int64_t b = 0; b < n / qk; b++) {
        float amax = 0;
        for (int i = 0; i < qk; i++) amax = fmaxf(amax, fabsf(x[b * qk + i]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        for (int i = 0; i < qk; i++) xd[b * qk + i] = d * (float)rint(x[b * qk + i] * id);
    }
}

static double ref_dot(const float *w, const float *x, int64_t n, double *abs_sum) {
    double s = 0, a = 0;
    for (int64_t i = 0; i < n; i++) { s += (double)w[i] * x[i]; a += fabs((double)w[i] * x[i]); }
    *abs_sum = a;
    return s;
}

TEST(kquant_vec_dot_vs_reference) {
    ak_rng r;
    ak_rng_seed(&r, 77);
    enum { MAXN = 4096 + 512 };
    static float w[MAXN], x[MAXN], wd[MAXN], xd[MAXN];
    static uint8_t row[MAXN];
    const int64_t lens[] = {256, 512, 1280, 2048, 4096 + 256};
    printf("    SIMD path: %s\n", ak_simd_name());
    for (size_t ti = 0; ti < N_KQ; ti++) {
        uint32_t type = kq_types[ti].type;
        double worst_simd = 0, worst_scalar = 0, worst_vs_scalar = 0;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int64_t n = lens[li];
            fill_normal(&r, w, n, 0.5f);
            fill_normal(&r, x, n, 2.0f);
            for (int i = 0; i < 40; i++) x[i] *= 30;   /* an outlier block */
            ak_quantize_row(type, w, row, n);
            ak_dequantize_row(type, row, wd, n);
            ref_quant_x(x, n, kq_types[ti].qk, xd);
            double abs_sum, want = ref_dot(wd, xd, n, &abs_sum);
            double tol = 1e-5 * abs_sum + 1e-6;
            float got = ak_vec_dot(type, row, x, n), gots = ak_vec_dot_scalar(type, row, x, n);
            worst_simd = fmax(worst_simd, fabs(got - want) / abs_sum);
            worst_scalar = fmax(worst_scalar, fabs(gots - want) / abs_sum);
            worst_vs_scalar = fmax(worst_vs_scalar, fabs(got - gots) / abs_sum);
            CHECK(fabs(got - want) <= tol, "%s n=%lld: ak_vec_dot %.9g, want %.9g", kq_types[ti].name,
                  (long long)n, got, want);
            CHECK(fabs(gots - want) <= tol, "%s n=%lld: ak_vec_dot_scalar %.9g, want %.9g", kq_types[ti].name,
                  (long long)n, gots, want);
        }
        printf("    %s max |dot - ref| / sum|w x|: simd %.2e, scalar %.2e, simd vs scalar %.2e\n",
               kq_types[ti].name, worst_simd, worst_scalar, worst_vs_scalar);
    }
}

TEST(kquant_matmul_vs_reference) {
    ak_error err = {{0}};
    ak_threads *pool = ak_threads_new(2, &err);
    REQUIRE(pool, "ak_threads_new: %s", err.msg);
    ak_rng r;
    ak_rng_seed(&r, 3);
    const int64_t shapes[][3] = {   /* rows, cols, tokens: decode, remainders, panels */
        {1, 256, 1}, {7, 512, 1}, {67, 256, 2}, {130, 768, 3}, {5, 256, 4}, {66, 512, 17}, {130, 1024, 70},
        {9, 4608, 6},   /* more super-blocks than one unpacked chunk (16) */
        {100, 512, 1}, {83, 256, 8}, {50, 768, 13},   /* packed: 4 groups, 8-token tiles, remainders */
    };
    for (size_t ti = 0; ti < N_KQ; ti++) {
        uint32_t type = kq_types[ti].type;
        double worst = 0, worst_packed = 0;
        int failures = 0, packed = 0;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0] && failures < 5; si++) {
            int64_t rows = shapes[si][0], cols = shapes[si][1], ntok = shapes[si][2];
            size_t rb = ak_row_bytes(type, cols);
            float *wd = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * ntok * cols);
            float *xd = malloc(sizeof(float) * ntok * cols), *w = malloc(sizeof(float) * cols);
            float *y1 = malloc(sizeof(float) * ntok * rows), *y2 = malloc(sizeof(float) * ntok * rows);
            float *y3 = malloc(sizeof(float) * ntok * rows), *y4 = malloc(sizeof(float) * ntok * rows);
            float *y5 = malloc(sizeof(float) * ntok * rows);
            uint8_t *W = malloc(rb * rows);
            /* the packed layout, where this build has one for the type */
            size_t pb = ak_packed_bytes(type, rows, cols);
            void *P = pb ? aligned_alloc(64, (pb + 63) & ~(size_t)63) : NULL;
            REQUIRE(wd && x && xd && w && y1 && y2 && y3 && y4 && y5 && W && (!pb || P), "out of memory");
            for (int64_t i = 0; i < rows; i++) {
                fill_normal(&r, w, cols, 0.3f);
                ak_quantize_row(type, w, W + i * rb, cols);
                ak_dequantize_row(type, W + i * rb, wd + i * cols, cols);
            }
            fill_normal(&r, x, ntok * cols, 1.0f);
            for (int64_t k = 0; k < ntok; k++) ref_quant_x(x + k * cols, cols, kq_types[ti].qk, xd + k * cols);
            for (int64_t i = 0; i < ntok * rows; i++) y1[i] = y2[i] = y3[i] = y4[i] = y5[i] = NAN;
            ak_matmul(pool, type, W, rows, cols, x, ntok, y1);
            ak_matmul_scalar(type, W, rows, cols, x, ntok, y2);
            if (pb) {
                /* all tokens at once on the pool, on one thread, and one
                 * token per call (decode): the same bits every way */
                ak_pack_weights(type, W, rows, cols, P);
                ak_matmul_args a = { .wtype = type, .W = P, .rows = rows, .cols = cols, .X = x, .ntok = ntok, .Y = y3 };
                ak_matmul_packed(pool, &a, NULL);
                a.Y = y4;
                ak_matmul_packed(NULL, &a, NULL);
                for (int64_t k = 0; k < ntok; k++) {
                    a.X = x + k * cols; a.ntok = 1; a.Y = y5 + k * rows;
                    ak_matmul_packed(pool, &a, NULL);
                }
                packed = 1;
            }
            for (int64_t k = 0; k < ntok && failures < 5; k++)
                for (int64_t i = 0; i < rows && failures < 5; i++) {
                    double abs_sum, want = ref_dot(wd + i * cols, xd + k * cols, cols, &abs_sum);
                    double tol = 1e-5 * abs_sum + 1e-6;
                    float a = y1[k * rows + i], b = y2[k * rows + i];
                    worst = fmax(worst, fabs(a - want) / abs_sum);
                    if (!(fabs(a - want) <= tol && fabs(b - want) <= tol)) {
                        failures++;
                        CHECK(0, "%s %lldx%lld ntok=%lld Y[%lld][%lld]: simd %.9g, scalar %.9g, want %.9g",
                              kq_types[ti].name, (long long)rows, (long long)cols, (long long)ntok, (long long)k,
                              (long long)i, a, b, want);
                    }
                    if (pb) {
                        float p1 = y3[k * rows + i], p2 = y4[k * rows + i], p3 = y5[k * rows + i];
                        worst_packed = fmax(worst_packed, fabs(p1 - want) / abs_sum);
                        if (!(fabs(p1 - want) <= tol) || memcmp(&p1, &p2, 4) || memcmp(&p1, &p3, 4)) {
                            failures++;
                            CHECK(0, "%s packed %lldx%lld ntok=%lld Y[%lld][%lld]: pool %.9g, single thread %.9g, "
                                  "one token per call %.9g, want %.9g", kq_types[ti].name, (long long)rows,
                                  (long long)cols, (long long)ntok, (long long)k, (long long)i, p1, p2, p3, want);
                        }
                    }
                }
            free(wd); free(x); free(xd); free(w); free(y1); free(y2); free(y3); free(y4); free(y5); free(W); free(P);
        }
        if (packed) printf("    %s max |Y - ref| / sum|w x| = %.2e, packed kernels %.2e\n", kq_types[ti].name, worst, worst_packed);
        else printf("    %s max |Y - ref| / sum|w x| = %.2e\n", kq_types[ti].name, worst);
    }
    ak_threads_free(pool);
}

/* The packed K kernels' out-of-memory path holds one token's activations on
 * the stack: rows longer than it holds must be left to the row-major
 * kernels, so that a packed product can always be computed. */
TEST(kquant_packed_declines_rows_too_long_for_its_fallback) {
    const uint32_t k[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    int built = 0;
    for (int i = 0; i < 3; i++) {
        if (!ak_packed_bytes(k[i], 16, 256)) continue;   /* no packed kernels in this build */
        built++;
        CHECK(ak_packed_bytes(k[i], 16, 43520) > 0, "type %u: 43520 columns should be packed", k[i]);
        CHECK(ak_packed_bytes(k[i], 16, 43520 + 256) == 0, "type %u: 43776 columns packed, past the fallback", k[i]);
        CHECK(ak_packed_bytes(k[i], 16, 300) == 0, "type %u: 300 columns are not whole super-blocks", k[i]);
        CHECK(ak_packed_bytes(k[i], 17, 512) == 2 * ak_packed_bytes(k[i], 16, 512),
              "type %u: 17 rows should take two groups of 16", k[i]);
    }
    printf("    %s\n", built ? "packed K kernels in this build" : "no packed K kernels in this build (row-major only)");
}
