/* test_kvformat.c - KV vector formats: names, sizes, codebooks, rotation,
 * bit layout, round-trip error against each format's theoretical bound, and
 * dot/axpy (SIMD and scalar) against double-precision references built here
 * from first principles (the spec at the top of kvformat.c). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "kv/kvformat.h"
#include "kv/kvformat_impl.h"   /* tcq3's table, for the exhaustive-search test */
#include "base/util.h"

#define NF AK_KV_NFORMATS
#define MAXD 1024

/* The rotated formats: tq and tcq3 (same rotation, norm and code stream). */
static int is_tq(ak_kv_format f) { return f == AK_KV_TQ4 || f == AK_KV_TQ3 || f == AK_KV_TQ2 || f == AK_KV_TCQ3; }
static int tq_bits(ak_kv_format f) { return f == AK_KV_TQ4 ? 4 : f == AK_KV_TQ3 || f == AK_KV_TCQ3 ? 3 : 2; }

/* ------------------------------------------------------------------------ */
/* Data                                                                     */
/* ------------------------------------------------------------------------ */

static void gen_gauss(ak_rng *r, float *x, int d) {
    for (int i = 0; i < d; i++) x[i] = ak_rng_normal(r);
}

/* Student-t with 3 degrees of freedom (variance 3), plus outlier channels
 * the way real keys have them: a few fixed channels, large and one-signed. */
static void gen_heavy(ak_rng *r, float *x, int d) {
    for (int i = 0; i < d; i++) {
        float z = ak_rng_normal(r), a = ak_rng_normal(r), b = ak_rng_normal(r), c = ak_rng_normal(r);
        x[i] = z / sqrtf((a * a + b * b + c * c) / 3.0f + 1e-12f);
    }
    int ch[3] = { 1, d / 2 + 1, d - 3 };
    for (int k = 0; k < 3; k++)
        if (ch[k] >= 0 && ch[k] < d) x[ch[k]] = 12.0f + 3.0f * ak_rng_normal(r);
}

/* ------------------------------------------------------------------------ */
/* Names, sizes                                                             */
/* ------------------------------------------------------------------------ */

TEST(kvformat_parse_names) {
    static const char *names[NF] = { "f32", "f16", "bf16", "q8", "q4", "q2", "tq4", "tq3", "tq2", "tcq3" };
    const char *all = ak_kv_format_names();
    for (int f = 0; f < NF; f++) {
        ak_kv_format out = (ak_kv_format)-1;
        CHECK(ak_kv_format_parse(names[f], &out) == 0 && out == (ak_kv_format)f, "%s did not parse to %d", names[f], f);
        const ak_kv_format_info *in = ak_kv_format_get((ak_kv_format)f);
        REQUIRE(in && ak_kv_format_get_scalar((ak_kv_format)f), "no table entry for %d", f);
        CHECK(strcmp(in->name, names[f]) == 0, "entry %d is named %s", f, in->name);
        CHECK(strcmp(ak_kv_format_get_scalar((ak_kv_format)f)->name, names[f]) == 0, "scalar entry %d", f);
        CHECK(in->rotated == is_tq((ak_kv_format)f), "%s rotated flag %d", names[f], in->rotated);
        CHECK(in->desc && *in->desc, "%s has no description", names[f]);
        CHECK(strstr(all, names[f]) != NULL, "%s missing from the name list '%s'", names[f], all);
    }
    ak_kv_format out = AK_KV_F16;
    CHECK(ak_kv_format_parse("q3", &out) == -1 && out == AK_KV_F16, "q3 parsed");
    CHECK(ak_kv_format_parse("", &out) == -1, "empty name parsed");
    CHECK(ak_kv_format_parse("F16", &out) == -1, "names are case-sensitive");
    CHECK(ak_kv_format_parse("tq3 ", &out) == -1, "trailing space parsed");
    CHECK(ak_kv_format_parse(NULL, &out) == -1, "NULL parsed");
    CHECK(ak_kv_format_get(AK_KV_NFORMATS) == NULL && ak_kv_format_get((ak_kv_format)-1) == NULL, "bad get");
    CHECK(ak_kv_format_get_scalar(AK_KV_NFORMATS) == NULL, "bad get_scalar");
    const char *be = ak_kv_format_backend();
    CHECK(be && (!strcmp(be, "avx512") || !strcmp(be, "avx2") || !strcmp(be, "neon") || !strcmp(be, "scalar")),
          "backend %s", be ? be : "(null)");
    /* a SIMD build hands out its own products, a scalar one the reference */
    for (int f = 0; f < NF; f++) {
        const ak_kv_format_info *a = ak_kv_format_get((ak_kv_format)f), *b = ak_kv_format_get_scalar((ak_kv_format)f);
        int same = a->dot == b->dot || a->axpy == b->axpy;
        CHECK(same == !strcmp(be, "scalar"), "%s: backend %s, SIMD products %s", a->name, be, same ? "missing" : "present");
        CHECK(a->quantize == b->quantize && a->dequantize == b->dequantize && a->vec_bytes == b->vec_bytes,
              "%s: the scalar entry stores differently", a->name);
    }
}

TEST(kvformat_supports) {
    for (int f = 0; f < NF; f++) {
        CHECK(ak_kv_format_supports((ak_kv_format)f, 2), "%d: d=2", f);
        CHECK(ak_kv_format_supports((ak_kv_format)f, 64), "%d: d=64", f);
        CHECK(ak_kv_format_supports((ak_kv_format)f, 80), "%d: d=80", f);
        CHECK(ak_kv_format_supports((ak_kv_format)f, 1024), "%d: d=1024", f);
        CHECK(!ak_kv_format_supports((ak_kv_format)f, 63), "%d: odd d", f);
        CHECK(!ak_kv_format_supports((ak_kv_format)f, 1), "%d: d=1", f);
        CHECK(!ak_kv_format_supports((ak_kv_format)f, 0), "%d: d=0", f);
        CHECK(!ak_kv_format_supports((ak_kv_format)f, -64), "%d: d<0", f);
        CHECK(!ak_kv_format_supports((ak_kv_format)f, 1026), "%d: d>1024", f);
        CHECK(!ak_kv_format_supports((ak_kv_format)f, 2048), "%d: d=2048", f);
    }
    CHECK(!ak_kv_format_supports(AK_KV_NFORMATS, 64), "invalid format supported");
    CHECK(ak_kv_format_bits(AK_KV_NFORMATS, 64) == 0 && ak_kv_format_bits(AK_KV_Q8, 63) == 0, "bits of invalid");
}

/* Sizes from the layout spec, computed independently. */
static size_t spec_bytes(ak_kv_format f, int d) {
    size_t g32 = (size_t)(d + 31) / 32, g16 = (size_t)(d + 15) / 16;
    switch (f) {
    case AK_KV_F32: return 4 * (size_t)d;
    case AK_KV_F16: case AK_KV_BF16: return 2 * (size_t)d;
    case AK_KV_Q8: return (size_t)d + 2 * g32;
    case AK_KV_Q4: return (size_t)d / 2 + 4 * g32;
    case AK_KV_Q2: return ((size_t)d + 3) / 4 + 4 * g16;
    default: return ((size_t)d * tq_bits(f) + 7) / 8 + 2;
    }
}

TEST(kvformat_bits_and_sizes) {
    struct { ak_kv_format f; int d; double bits; } want[] = {
        { .f = AK_KV_F32, .d = 64, .bits = 32 },    { .f = AK_KV_F16, .d = 128, .bits = 16 },
        { .f = AK_KV_BF16, .d = 80, .bits = 16 },  { .f = AK_KV_Q8, .d = 64, .bits = 8.5 },
        { .f = AK_KV_Q8, .d = 128, .bits = 8.5 },   { .f = AK_KV_Q8, .d = 80, .bits = 8.6 },
        { .f = AK_KV_Q8, .d = 16, .bits = 9.0 },   { .f = AK_KV_Q4, .d = 64, .bits = 5.0 },
        { .f = AK_KV_Q4, .d = 128, .bits = 5.0 },   { .f = AK_KV_Q4, .d = 8, .bits = 8.0 },
        { .f = AK_KV_Q2, .d = 64, .bits = 4.0 },   { .f = AK_KV_Q2, .d = 8, .bits = 6.0 },
        { .f = AK_KV_TQ3, .d = 64, .bits = 3.25 },  { .f = AK_KV_TQ3, .d = 128, .bits = 3.125 },
        { .f = AK_KV_TQ4, .d = 64, .bits = 4.25 }, { .f = AK_KV_TQ2, .d = 64, .bits = 2.25 },
        { .f = AK_KV_TQ3, .d = 8, .bits = 5.0 },    { .f = AK_KV_TQ3, .d = 96, .bits = 3.0 + 16.0 / 96 },
        { .f = AK_KV_TCQ3, .d = 64, .bits = 3.25 },
        { .f = AK_KV_TCQ3, .d = 128, .bits = 3.125 },
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        double b = ak_kv_format_bits(want[i].f, want[i].d);
        CHECK(fabs(b - want[i].bits) < 1e-12, "%s d=%d: %.4f bits, want %.4f", ak_kv_format_get(want[i].f)->name,
              want[i].d, b, want[i].bits);
    }
    CHECK(ak_kv_format_get(AK_KV_TQ3)->vec_bytes(64) == 26, "tq3 d=64 is 24 + 2 bytes");
    for (int f = 0; f < NF; f++)
        for (int d = 2; d <= MAXD; d += 2) {
            size_t vb = ak_kv_format_get((ak_kv_format)f)->vec_bytes(d);
            if (vb != spec_bytes((ak_kv_format)f, d)) {
                CHECK(0, "%s d=%d: %zu bytes, spec %zu", ak_kv_format_get((ak_kv_format)f)->name, d, vb,
                      spec_bytes((ak_kv_format)f, d));
                break;
            }
            CHECK(fabs(ak_kv_format_bits((ak_kv_format)f, d) - 8.0 * vb / d) < 1e-12, "bits vs bytes");
        }
}

/* ------------------------------------------------------------------------ */
/* Lloyd-Max                                                                */
/* ------------------------------------------------------------------------ */

TEST(kvformat_lloyd_max) {
    static const double published3[8] = { -2.152, -1.344, -0.756, -0.245, 0.245, 0.756, 1.344, 2.152 };
    static const double expect_mse[5] = { 0, 0, 0.1175, 0.0345, 0.0095 };
    double c[256], mse;
    for (int bits = 2; bits <= 4; bits++) {
        REQUIRE(ak_lloyd_max_derive(bits, c, &mse) == 0, "derive %d failed", bits);
        const float *tab = ak_lloyd_max_centroids(bits);
        REQUIRE(tab, "no table for %d bits", bits);
        for (int k = 0; k < (1 << bits); k++) {
            CHECK(fabs(tab[k] - c[k]) < 1e-5, "%d bits, centroid %d: table %.7f derived %.7f", bits, k, tab[k], c[k]);
            CHECK(fabs(c[k] + c[(1 << bits) - 1 - k]) < 1e-9, "%d bits: not symmetric at %d", bits, k);
            if (k) CHECK(c[k] > c[k - 1], "%d bits: not ascending at %d", bits, k);
        }
        CHECK(fabs(mse / expect_mse[bits] - 1) < 0.02, "%d bits: mse %.6f, expected %.4f", bits, mse, expect_mse[bits]);
        if (bits == 3)
            for (int k = 0; k < 8; k++)
                CHECK(fabs(c[k] - published3[k]) < 5e-4, "3-bit centroid %d = %.5f, published %.3f", k, c[k],
                      published3[k]);
    }
    /* 1 bit has a closed form: +-sqrt(2/pi), mse 1 - 2/pi */
    REQUIRE(ak_lloyd_max_derive(1, c, &mse) == 0, "derive 1 failed");
    CHECK(fabs(c[1] - sqrt(2 / M_PI)) < 1e-9 && fabs(c[0] + sqrt(2 / M_PI)) < 1e-9, "1 bit: %.10f", c[1]);
    CHECK(fabs(mse - (1 - 2 / M_PI)) < 1e-9, "1 bit mse %.10f", mse);
    /* more bits, less error, by roughly 6 dB a bit */
    double prev = mse;
    for (int bits = 2; bits <= 5; bits++) {
        REQUIRE(ak_lloyd_max_derive(bits, c, &mse) == 0, "derive %d", bits);
        CHECK(mse < prev / 2.5 && mse > prev / 5, "%d bits mse %.6f after %.6f", bits, mse, prev);
        prev = mse;
    }
    CHECK(ak_lloyd_max_derive(0, c, &mse) == -1 && ak_lloyd_max_derive(9, c, &mse) == -1, "bits out of range");
    CHECK(ak_lloyd_max_centroids(1) == NULL && ak_lloyd_max_centroids(5) == NULL, "tables for 1 or 5 bits");
}

/* ------------------------------------------------------------------------ */
/* Rotation                                                                 */
/* ------------------------------------------------------------------------ */

/* S from its definition: splitmix64 output i+1 from seed "agentkv". */
static int spec_sign(int i) {
    uint64_t z = 0x6167656e746b76ULL + (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (z >> 63) ? -1 : 1;
}

/* R x in double: H block diagonal over d's binary decomposition (largest
 * first), H[i][j] = (-1)^popcount(i & j) / sqrt(m) within a block. */
static void spec_rotate(const float *x, int d, double *y) {
    double sx[MAXD];
    for (int i = 0; i < d; i++) sx[i] = spec_sign(i) * (double)x[i];
    int off = 0;
    for (int m = 1024; m >= 2; m >>= 1) {
        if (!(d & m)) continue;
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int j = 0; j < m; j++) s += (__builtin_popcount(i & j) & 1 ? -1 : 1) * sx[off + j];
            y[off + i] = s / sqrt(m);
        }
        off += m;
    }
}

TEST(kvformat_rotation) {
    ak_rng r;
    ak_rng_seed(&r, 7);
    int ds[] = { 2, 6, 8, 64, 80, 96, 112, 128, 256, 1022, 1024 };
    for (size_t k = 0; k < sizeof ds / sizeof ds[0]; k++) {
        int d = ds[k];
        float x[MAXD], y[MAXD];
        double want[MAXD], nx = 0, err = 0, back = 0;
        gen_heavy(&r, x, d);
        memcpy(y, x, sizeof(float) * d);
        ak_kv_rotate(y, d);
        spec_rotate(x, d, want);
        for (int i = 0; i < d; i++) {
            nx += (double)x[i] * x[i];
            err = fmax(err, fabs(y[i] - want[i]));
        }
        nx = sqrt(nx);
        CHECK(err < 1e-5 * nx, "d=%d: rotate differs from the spec by %g (|x| %g)", d, err, nx);
        ak_kv_unrotate(y, d);
        for (int i = 0; i < d; i++) back = fmax(back, fabs(y[i] - x[i]));
        CHECK(back < 2e-6 * nx, "d=%d: unrotate(rotate(x)) off by %g", d, back);
        /* and the other way round */
        memcpy(y, x, sizeof(float) * d);
        ak_kv_unrotate(y, d);
        ak_kv_rotate(y, d);
        back = 0;
        for (int i = 0; i < d; i++) back = fmax(back, fabs(y[i] - x[i]));
        CHECK(back < 2e-6 * nx, "d=%d: rotate(unrotate(x)) off by %g", d, back);
    }
    /* the rotation spreads a spike over its block: a 1 in channel 70 of 96
     * lands in the 32-block, every coordinate +-1/sqrt(32) */
    float e[96] = { 0 };
    e[70] = 1;
    ak_kv_rotate(e, 96);
    for (int i = 0; i < 96; i++) {
        double want = i < 64 ? 0 : 1 / sqrt(32);
        CHECK(fabs(fabs(e[i]) - want) < 1e-6, "spike: coordinate %d = %g", i, e[i]);
    }
}

/* ------------------------------------------------------------------------ */
/* Layout                                                                   */
/* ------------------------------------------------------------------------ */

static int bytes_equal(const uint8_t *a, const uint8_t *b, size_t n) { return memcmp(a, b, n) == 0; }

TEST(kvformat_layout_by_hand) {
    uint8_t buf[64];
    /* tq3, d=8: build x whose rotated direction is the code vector
     * c = lm3[5, 2, 6, 1, 5, 2, 4, 3], so those are the codes; |c|^2 = 6.02
     * keeps sqrt(8) c/|c| inside each centroid's cell. Codes at bits 3i:
     * 5 | 2<<3 | 6<<6 | 1<<9 | 5<<12 | 2<<15 | 4<<18 | 3<<21 = 0x715395.
     * N = |x| <y,c>/|c|^2 = sqrt(8) = 2.8284 -> f16 0x41a8 (2.828125). */
    const float *c3 = ak_lloyd_max_centroids(3);
    static const int idx[8] = { 5, 2, 6, 1, 5, 2, 4, 3 };
    float x[8];
    for (int i = 0; i < 8; i++) x[i] = c3[idx[i]];
    ak_kv_unrotate(x, 8);
    static const uint8_t tq3[5] = { 0x95, 0x53, 0x71, 0xa8, 0x41 };
    REQUIRE(ak_kv_format_get(AK_KV_TQ3)->vec_bytes(8) == 5, "tq3 d=8 size");
    ak_kv_format_get(AK_KV_TQ3)->quantize(x, 8, buf);
    CHECK(bytes_equal(buf, tq3, 5), "tq3 bytes %02x %02x %02x %02x %02x", buf[0], buf[1], buf[2], buf[3], buf[4]);

    /* q2, d=4 (one group of 4): 0 1 2 3 -> min 0, scale 1, codes 0 1 2 3 at
     * bits 2i = 0xe4; then f16 scale 1.0 (0x3c00), f16 min 0. */
    static const float x2[4] = { 0, 1, 2, 3 };
    static const uint8_t q2[5] = { 0xe4, 0x00, 0x3c, 0x00, 0x00 };
    ak_kv_format_get(AK_KV_Q2)->quantize(x2, 4, buf);
    CHECK(bytes_equal(buf, q2, 5), "q2 bytes %02x %02x %02x %02x %02x", buf[0], buf[1], buf[2], buf[3], buf[4]);

    /* q4, d=4: -1 4 9 14 -> min -1 (0xbc00), scale 1, codes 0 5 10 15: low
     * nibble first = 0x50 0xfa. */
    static const float x4[4] = { -1, 4, 9, 14 };
    static const uint8_t q4[6] = { 0x50, 0xfa, 0x00, 0x3c, 0x00, 0xbc };
    ak_kv_format_get(AK_KV_Q4)->quantize(x4, 4, buf);
    CHECK(bytes_equal(buf, q4, 6), "q4 bytes %02x %02x %02x %02x %02x %02x", buf[0], buf[1], buf[2], buf[3], buf[4],
          buf[5]);

    /* q8, d=2: 127 -63.5 -> scale 1, q = 127 and -64 (ties to even). */
    static const float x8[2] = { 127, -63.5f };
    static const uint8_t q8[4] = { 0x7f, 0xc0, 0x00, 0x3c };
    ak_kv_format_get(AK_KV_Q8)->quantize(x8, 2, buf);
    CHECK(bytes_equal(buf, q8, 4), "q8 bytes %02x %02x %02x %02x", buf[0], buf[1], buf[2], buf[3]);

    /* f16 / bf16 of 1.5 and -2: 0x3e00 0xc000 / 0x3fc0 0xc000 */
    static const float xf[2] = { 1.5f, -2 };
    static const uint8_t f16[4] = { 0x00, 0x3e, 0x00, 0xc0 }, bf16[4] = { 0xc0, 0x3f, 0x00, 0xc0 };
    ak_kv_format_get(AK_KV_F16)->quantize(xf, 2, buf);
    CHECK(bytes_equal(buf, f16, 4), "f16 bytes");
    ak_kv_format_get(AK_KV_BF16)->quantize(xf, 2, buf);
    CHECK(bytes_equal(buf, bf16, 4), "bf16 bytes");
}

/* tcq3's error bound per coordinate (measured .0207-.0211 on Gaussian
 * vectors of d = 64..256, +10%); 3-bit Lloyd-Max is .0345. */
#define TCQ3_MSE 0.0235

/* quantize -> dequantize -> quantize is the identity on the bytes (not for
 * tcq3: a Viterbi path rescaled to unit variance need not be its own best
 * path; kvformat.c, TRELLIS). */
TEST(kvformat_requantize_identical) {
    ak_rng r;
    ak_rng_seed(&r, 11);
    int ds[] = { 2, 8, 40, 64, 80, 96, 128, 256 };
    for (int f = 0; f < NF; f++) {
        if (f == AK_KV_TCQ3) continue;
        const ak_kv_format_info *in = ak_kv_format_get((ak_kv_format)f);
        int bad = 0;
        for (size_t k = 0; k < sizeof ds / sizeof ds[0] && !bad; k++)
            for (int v = 0; v < 200 && !bad; v++) {
                int d = ds[k];
                float x[MAXD], y[MAXD];
                uint8_t a[4 * MAXD], b[4 * MAXD];
                if (v & 1) gen_heavy(&r, x, d); else gen_gauss(&r, x, d);
                size_t nb = in->vec_bytes(d);
                in->quantize(x, d, a);
                in->dequantize(a, d, y);
                in->quantize(y, d, b);
                if (!bytes_equal(a, b, nb)) {
                    size_t i = 0;
                    while (a[i] == b[i]) i++;
                    CHECK(0, "%s d=%d vector %d: byte %zu of %zu differs (%02x, %02x)", in->name, d, v, i, nb, a[i],
                          b[i]);
                    bad = 1;
                }
            }
    }
    /* zero and constant vectors */
    for (int f = 0; f < NF; f++) {
        const ak_kv_format_info *in = ak_kv_format_get((ak_kv_format)f);
        float z[64] = { 0 }, y[64], k7[64];
        uint8_t a[256];
        for (int i = 0; i < 64; i++) k7[i] = 7;
        in->quantize(z, 64, a);
        in->dequantize(a, 64, y);
        for (int i = 0; i < 64; i++) CHECK(y[i] == 0, "%s: zero vector gives %g at %d", in->name, y[i], i);
        in->quantize(k7, 64, a);
        in->dequantize(a, 64, y);
        if (is_tq((ak_kv_format)f)) {
            /* rotated, a constant is as good as any vector: within twice the
             * codebook's distortion */
            static const double D[5] = { 0, 0, 0.1175, 0.0345, 0.0095 };
            double e = 0;
            for (int i = 0; i < 64; i++) e += (y[i] - 7.0) * (y[i] - 7.0) / (49.0 * 64);
            double lim = 2 * (f == AK_KV_TCQ3 ? TCQ3_MSE : D[tq_bits((ak_kv_format)f)]);
            CHECK(e <= lim, "%s: constant 7 has relative mse %g", in->name, e);
        } else
            for (int i = 0; i < 64; i++) CHECK(fabs(y[i] - 7) <= 7 * 1e-3, "%s: constant 7 gives %g at %d", in->name, y[i], i);
    }
}

/* ------------------------------------------------------------------------ */
/* Round-trip error                                                         */
/* ------------------------------------------------------------------------ */

/* The uniform-quantizer error of a grouped format for x: sum over groups of
 * n_g * step_g^2 / 12, step from the group's actual values. */
static double uniform_bound(ak_kv_format f, const float *x, int d) {
    int G = f == AK_KV_Q2 ? 16 : 32;
    double sum = 0;
    for (int g0 = 0; g0 < d; g0 += G) {
        int g1 = g0 + G < d ? g0 + G : d;
        double mn = x[g0], mx = x[g0], amax = 0;
        for (int i = g0; i < g1; i++) {
            mn = fmin(mn, x[i]);
            mx = fmax(mx, x[i]);
            amax = fmax(amax, fabs(x[i]));
        }
        double step = f == AK_KV_Q8 ? amax / 127 : (mx - mn) / (f == AK_KV_Q4 ? 15 : 3);
        sum += (g1 - g0) * step * step / 12;
    }
    return sum;
}

/* Mean round-trip error of format f over nv vectors of dimension d. For
 * grouped formats: sum |x - x^|^2 over the uniform bound's sum (ratio <= 1
 * means within it); for tq: mean |x - x^|^2 / |x|^2 (per-coordinate MSE of
 * the unit vector, scaled to unit variance); for plain formats: the largest
 * relative error of one value. */
static double roundtrip(ak_kv_format f, int d, int heavy, int nv, uint64_t seed) {
    ak_rng r;
    ak_rng_seed(&r, seed);
    const ak_kv_format_info *in = ak_kv_format_get(f);
    double err = 0, ref = 0, worst = 0;
    for (int v = 0; v < nv; v++) {
        float x[MAXD], y[MAXD];
        uint8_t buf[4 * MAXD];
        if (heavy) gen_heavy(&r, x, d); else gen_gauss(&r, x, d);
        in->quantize(x, d, buf);
        in->dequantize(buf, d, y);
        double e = 0, n2 = 0;
        for (int i = 0; i < d; i++) {
            e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
            n2 += (double)x[i] * x[i];
            worst = fmax(worst, fabs(x[i] - y[i]) / fabs(x[i]));
        }
        if (is_tq(f)) err += e / n2;
        else {
            err += e;
            ref += uniform_bound(f, x, d);
        }
    }
    if (f == AK_KV_F32 || f == AK_KV_F16 || f == AK_KV_BF16) return worst;
    return is_tq(f) ? err / nv : err / ref;
}

TEST(kvformat_roundtrip_plain) {
    for (int heavy = 0; heavy < 2; heavy++) {
        CHECK(roundtrip(AK_KV_F32, 96, heavy, 50, 1) == 0, "f32 is not exact");
        double e16 = roundtrip(AK_KV_F16, 96, heavy, 50, 2), eb16 = roundtrip(AK_KV_BF16, 96, heavy, 50, 3);
        CHECK(e16 <= ldexp(1, -11) && e16 > 0, "f16 relative error %g", e16);
        CHECK(eb16 <= ldexp(1, -8) && eb16 > ldexp(1, -11), "bf16 relative error %g", eb16);
    }
}

TEST(kvformat_roundtrip_grouped) {
    /* Gaussian: errors spread uniformly over each step: within 10% of
     * step^2/12 (and not suspiciously far below it). */
    ak_kv_format fs[3] = { AK_KV_Q8, AK_KV_Q4, AK_KV_Q2 };
    int ds[] = { 64, 128, 96, 80, 8 };
    for (int k = 0; k < 3; k++)
        for (size_t j = 0; j < sizeof ds / sizeof ds[0]; j++) {
            double ratio = roundtrip(fs[k], ds[j], 0, 2000, 100 + j);
            CHECK(ratio <= 1.1 && ratio > 0.6, "%s d=%d Gaussian: error / uniform bound = %.3f",
                  ak_kv_format_get(fs[k])->name, ds[j], ratio);
        }
    /* Heavy tails and outlier channels: q8 and q4 have enough levels for
     * errors to stay uniform. q2's 4 levels in a group stretched by an
     * outlier leave the other values in one or two cells, away from uniform
     * (measured 0.99-1.03 of the bound; the hard limit, step/2 per value, is
     * 3x the bound): allow 1.25 there. */
    for (int k = 0; k < 3; k++)
        for (size_t j = 0; j < 4; j++) {
            double ratio = roundtrip(fs[k], ds[j], 1, 2000, 200 + j), lim = fs[k] == AK_KV_Q2 ? 1.25 : 1.1;
            CHECK(ratio <= lim, "%s d=%d heavy-tailed: error / uniform bound = %.3f", ak_kv_format_get(fs[k])->name,
                  ds[j], ratio);
        }
}

/* Every value of a grouped format is within half its group's stored step
 * of the input, also far from zero (a group's min rounded to f16 must not
 * land above the values it covers) and for tiny or constant groups. */
TEST(kvformat_roundtrip_max_error) {
    ak_rng r;
    ak_rng_seed(&r, 55);
    ak_kv_format fs[3] = { AK_KV_Q8, AK_KV_Q4, AK_KV_Q2 };
    static const float offsets[4] = { 0, 1000.3f, -517.77f, 3e-3f };
    static const float scales[4] = { 1, 1, 0.01f, 1e-4f };
    for (int k = 0; k < 3; k++) {
        const ak_kv_format_info *in = ak_kv_format_get(fs[k]);
        int G = fs[k] == AK_KV_Q2 ? 16 : 32, bits = fs[k] == AK_KV_Q8 ? 8 : fs[k] == AK_KV_Q4 ? 4 : 2, bad = 0;
        for (int o = 0; o < 4 && !bad; o++)
            for (int v = 0; v < 300 && !bad; v++) {
                int d = v % 3 == 0 ? 80 : 64;
                float x[MAXD], y[MAXD];
                uint8_t buf[4 * MAXD];
                for (int i = 0; i < d; i++) x[i] = offsets[o] + scales[o] * ak_rng_normal(&r);
                if (v % 7 == 0)
                    for (int i = 0; i < 16; i++) x[i] = x[0];   /* a constant group */
                in->quantize(x, d, buf);
                in->dequantize(buf, d, y);
                size_t cb = (size_t)d * bits / 8;
                for (int i = 0; i < d && !bad; i++) {
                    int g = i / G;
                    double s = bits == 8 ? ak_f16_to_f32((uint16_t)(buf[cb + 2 * g] | buf[cb + 2 * g + 1] << 8))
                                         : ak_f16_to_f32((uint16_t)(buf[cb + 4 * g] | buf[cb + 4 * g + 1] << 8));
                    /* half a step, plus float rounding of m + s*q */
                    double lim = s / 2 * (1 + 1e-6) + 1e-6 * fabs(x[i]);
                    if (!(fabs((double)y[i] - x[i]) <= lim)) {
                        CHECK(0, "%s d=%d offset %g: value %d = %.7g comes back %.7g (step %g)", in->name, d,
                              offsets[o], i, x[i], y[i], s);
                        bad = 1;
                    }
                }
            }
    }
}

TEST(kvformat_roundtrip_tq) {
    /* Lloyd-Max distortion of N(0,1) per coordinate, +10% */
    static const double D[5] = { 0, 0, 0.1175, 0.0345, 0.0095 };
    ak_kv_format fs[3] = { AK_KV_TQ4, AK_KV_TQ3, AK_KV_TQ2 };
    int ds[] = { 128, 64, 96, 80, 112, 256 };
    for (int k = 0; k < 3; k++) {
        int b = tq_bits(fs[k]);
        for (size_t j = 0; j < sizeof ds / sizeof ds[0]; j++) {
            double g = roundtrip(fs[k], ds[j], 0, 2000, 300 + j), h = roundtrip(fs[k], ds[j], 1, 2000, 400 + j);
            CHECK(g <= D[b] * 1.1 && g > D[b] * 0.8, "tq%d d=%d Gaussian: mse %.5f, bound %.4f", b, ds[j], g, D[b] * 1.1);
            CHECK(h <= D[b] * 1.1, "tq%d d=%d heavy-tailed: mse %.5f, bound %.4f", b, ds[j], h, D[b] * 1.1);
        }
    }
}

/* tcq3 beats 3-bit Lloyd-Max (tq3) by a third at the same bits, and cannot
 * beat the rate-distortion bound of N(0,1) at 3 bits, 2^-6 = .0156 (a
 * result below it would mean the error is mismeasured). */
TEST(kvformat_roundtrip_tcq3) {
    int ds[] = { 64, 128, 96, 80, 256 };
    for (size_t j = 0; j < sizeof ds / sizeof ds[0]; j++) {
        double g = roundtrip(AK_KV_TCQ3, ds[j], 0, 1000, 300 + j), h = roundtrip(AK_KV_TCQ3, ds[j], 1, 1000, 400 + j);
        double tq = roundtrip(AK_KV_TQ3, ds[j], 0, 1000, 300 + j);
        CHECK(g <= TCQ3_MSE && g > 0.015625, "tcq3 d=%d Gaussian: mse %.5f, bound %.4f", ds[j], g, TCQ3_MSE);
        CHECK(h <= TCQ3_MSE, "tcq3 d=%d heavy-tailed: mse %.5f, bound %.4f", ds[j], h, TCQ3_MSE);
        CHECK(g < 0.75 * tq, "tcq3 d=%d: mse %.5f, tq3 on the same vectors %.5f", ds[j], g, tq);
    }
}

/* tcq3's codes are the best path: for d = 4 (8^4 code sequences) the
 * stored codes, read back by the layout spec, reach the least squared error
 * over all sequences, found by exhaustive search; and dequantize is the
 * spec's reconstruction R^T (N/sqrt(d) T[w_i]). */
TEST(kvformat_tcq3_exhaustive) {
    ak_rng r;
    ak_rng_seed(&r, 91);
    const ak_kv_format_info *in = ak_kv_format_get(AK_KV_TCQ3);
    const int d = 4;
    int bad = 0;
    for (int v = 0; v < 200 && !bad; v++) {
        float x[4], y[4], back[4], want[4];
        uint8_t buf[8];
        if (v & 1) gen_heavy(&r, x, d); else gen_gauss(&r, x, d);
        REQUIRE(in->vec_bytes(d) == 4, "tcq3 d=4 is 2 + 2 bytes");
        in->quantize(x, d, buf);
        /* the target: sqrt(d) R x / |x| */
        double n = 0;
        for (int i = 0; i < d; i++) n += (double)x[i] * x[i];
        n = sqrt(n);
        memcpy(y, x, sizeof y);
        ak_kv_rotate(y, d);
        for (int i = 0; i < d; i++) y[i] = (float)(y[i] * 2.0 / n);
        double best = INFINITY;
        for (int p = 0; p < 4096; p++) {
            double e = 0;
            for (int i = 0, w = 0; i < d; i++) {
                w = w >> 3 | (p >> (3 * i) & 7) << 6;   /* c_i*64 + c_{i-1}*8 + c_{i-2} */
                e += ((double)y[i] - ak_kvf_tcq3_table[w]) * ((double)y[i] - ak_kvf_tcq3_table[w]);
            }
            best = fmin(best, e);
        }
        unsigned bits = buf[0] | (unsigned)buf[1] << 8;   /* code i at bits 3i */
        double got = 0, yc = 0, cc = 0;
        float tv[4];
        for (int i = 0, w = 0; i < d; i++) {
            w = w >> 3 | (bits >> (3 * i) & 7) << 6;
            tv[i] = ak_kvf_tcq3_table[w];
            got += ((double)y[i] - tv[i]) * ((double)y[i] - tv[i]);
            yc += (double)y[i] * tv[i];
            cc += (double)tv[i] * tv[i];
        }
        if (!(got <= best * (1 + 1e-5) + 1e-9)) {
            CHECK(0, "vector %d: stored path error %.9g, best %.9g", v, got, best);
            bad = 1;
        }
        CHECK((bits >> 12) == 0, "vector %d: bits past the codes set", v);
        /* reconstruction: N = |x| <y,t>/<t,t> in f16, x^ = R^T (N/2 t) */
        float N = ak_f16_to_f32(ak_f32_to_f16((float)(n * yc / cc)));
        CHECK(ak_f16_to_f32((uint16_t)(buf[2] | buf[3] << 8)) == N, "vector %d: norm", v);
        for (int i = 0; i < d; i++) want[i] = N / 2.0f * tv[i];
        ak_kv_unrotate(want, d);
        in->dequantize(buf, d, back);
        for (int i = 0; i < d; i++)
            CHECK(fabs(back[i] - want[i]) <= 1e-6 * (fabs(N) + 1), "vector %d value %d: %g, spec %g", v, i, back[i], want[i]);
    }
}

/* ------------------------------------------------------------------------ */
/* dot and axpy                                                             */
/* ------------------------------------------------------------------------ */

static double norm2(const double *x, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) s += x[i] * x[i];
    return sqrt(s);
}

/* Checks in->dot and in->axpy on n vectors at stride against double sums
 * over the dequantized vectors (original basis; the query is rotated and
 * the accumulator un-rotated for rotated formats). Errors are relative to
 * |q| |x_j| (dot) and sum_j |w_j| |x_j| (axpy). Returns the worst. */
static double check_products(const ak_kv_format_info *in, ak_kv_format f, int d, int n, ak_rng *r) {
    size_t vb = in->vec_bytes(d), stride = vb + 13;   /* odd: vectors land unaligned */
    uint8_t *buf = malloc(stride * n + 64);
    float *deq = malloc(sizeof(float) * d * n), *out = malloc(sizeof(float) * n);
    float q[MAXD], qr[MAXD], w[64], acc[MAXD];
    double worst = 0;
    memset(buf, 0xa5, stride * n + 64);
    for (int j = 0; j < n; j++) {
        float x[MAXD];
        if (j % 3 == 2) gen_heavy(r, x, d); else gen_gauss(r, x, d);
        in->quantize(x, d, buf + 1 + j * stride);
        in->dequantize(buf + 1 + j * stride, d, deq + (size_t)j * d);
        w[j] = ak_rng_uniform(r) * (j % 4 == 3 ? -1 : 1);
    }
    gen_gauss(r, q, d);
    memcpy(qr, q, sizeof q);
    if (in->rotated) ak_kv_rotate(qr, d);
    for (int j = 0; j < n; j++) out[j] = NAN;
    size_t cb = ak_kv_format_code_bytes(f, d);   /* vectors whole: metadata right after the codes */
    in->dot(buf + 1, stride, buf + 1 + cb, stride, n, qr, d, out);
    double nq = 0;
    for (int i = 0; i < d; i++) nq += (double)q[i] * q[i];
    nq = sqrt(nq);
    for (int j = 0; j < n; j++) {
        double ref = 0, nx = 0;
        for (int i = 0; i < d; i++) {
            ref += (double)q[i] * deq[(size_t)j * d + i];
            nx += (double)deq[(size_t)j * d + i] * deq[(size_t)j * d + i];
        }
        double e = fabs(out[j] - ref) / (nq * sqrt(nx) + 1e-30);
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    /* axpy onto a non-zero accumulator */
    double ref[MAXD], a0[MAXD], scale = 0;
    gen_gauss(r, acc, d);
    for (int i = 0; i < d; i++) a0[i] = ref[i] = acc[i];
    if (in->rotated) ak_kv_rotate(acc, d);
    in->axpy(buf + 1, stride, buf + 1 + cb, stride, n, w, d, acc);
    if (in->rotated) ak_kv_unrotate(acc, d);
    for (int j = 0; j < n; j++) {
        double nx = 0;
        for (int i = 0; i < d; i++) {
            ref[i] += (double)w[j] * deq[(size_t)j * d + i];
            nx += (double)deq[(size_t)j * d + i] * deq[(size_t)j * d + i];
        }
        scale += fabs(w[j]) * sqrt(nx);
    }
    scale += norm2(a0, d);
    double diff[MAXD];
    for (int i = 0; i < d; i++) diff[i] = acc[i] - ref[i];
    double e = norm2(diff, d) / scale;
    if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    /* nothing outside the vectors was touched */
    for (size_t i = 0; i < stride * n + 64; i++) {
        int inside = i >= 1 && i < 1 + stride * n && (i - 1) % stride < vb;
        if (!inside && buf[i] != 0xa5) { worst = INFINITY; break; }
    }
    free(buf);
    free(deq);
    free(out);
    return worst;
}

TEST(kvformat_products_vs_double) {
    ak_rng r;
    ak_rng_seed(&r, 21);
    int ds[] = { 8, 64, 128, 96, 80, 2, 6, 40, 1024 }, ns[] = { 1, 7, 64 };
    for (int simd = 0; simd < 2; simd++)
        for (int f = 0; f < NF; f++) {
            const ak_kv_format_info *in =
                simd ? ak_kv_format_get((ak_kv_format)f) : ak_kv_format_get_scalar((ak_kv_format)f);
            for (size_t a = 0; a < sizeof ds / sizeof ds[0]; a++)
                for (size_t b = 0; b < 3; b++) {
                    double e = check_products(in, (ak_kv_format)f, ds[a], ns[b], &r);
                    CHECK(e <= 1e-5, "%s %s d=%d n=%d: relative error %g", simd ? ak_kv_format_backend() : "scalar",
                          in->name, ds[a], ns[b], e);
                }
        }
}

/* The SIMD dot/axpy agree with the scalar reference for every d the formats
 * take (tails of every length) and for n around the SIMD unrolling. */
TEST(kvformat_simd_vs_scalar) {
    ak_rng r;
    ak_rng_seed(&r, 33);
    enum { N = 9 };
    for (int f = 0; f < NF; f++) {
        const ak_kv_format_info *vs = ak_kv_format_get((ak_kv_format)f), *sc = ak_kv_format_get_scalar((ak_kv_format)f);
        int bad = 0;
        for (int d = 2; d <= 272 && !bad; d += 2) {
            size_t vb = vs->vec_bytes(d), stride = vb + 3;
            size_t cb = ak_kv_format_code_bytes((ak_kv_format)f, d), mb = ak_kv_format_meta_bytes((ak_kv_format)f, d);
            uint8_t *buf = malloc(stride * N), *cbuf = malloc(cb * N), *mbuf = malloc(mb * N + 1);
            float q[MAXD], w[N], o1[N], o2[N], a1[MAXD], a2[MAXD], x[MAXD];
            double nx[N], nq = 0;
            for (int j = 0; j < N; j++) {
                if (j & 1) gen_heavy(&r, x, d); else gen_gauss(&r, x, d);
                vs->quantize(x, d, buf + j * stride);
                memcpy(cbuf + j * cb, buf + j * stride, cb);   /* the same vectors, as a block keeps them */
                memcpy(mbuf + j * mb, buf + j * stride + cb, mb);
                float y[MAXD];
                vs->dequantize(buf + j * stride, d, y);
                nx[j] = 0;
                for (int i = 0; i < d; i++) nx[j] += (double)y[i] * y[i];
                nx[j] = sqrt(nx[j]);
                w[j] = ak_rng_normal(&r);
            }
            gen_gauss(&r, q, d);
            for (int i = 0; i < d; i++) nq += (double)q[i] * q[i];
            nq = sqrt(nq);
            for (int n = 1; n <= N && !bad; n++) {
                /* SIMD on split runs against scalar on whole vectors */
                vs->dot(cbuf, cb, mbuf, mb, n, q, d, o1);
                sc->dot(buf, stride, buf + cb, stride, n, q, d, o2);
                for (int j = 0; j < n; j++)
                    if (!(fabs(o1[j] - o2[j]) <= 2e-6 * nq * nx[j])) {
                        CHECK(0, "%s d=%d n=%d dot %d: simd %.9g scalar %.9g", vs->name, d, n, j, o1[j], o2[j]);
                        bad = 1;
                    }
                double s = 0, diff = 0;
                for (int i = 0; i < d; i++) a1[i] = a2[i] = 0.5f;
                vs->axpy(cbuf, cb, mbuf, mb, n, w, d, a1);
                sc->axpy(buf, stride, buf + cb, stride, n, w, d, a2);
                for (int j = 0; j < n; j++) s += fabs(w[j]) * nx[j];
                for (int i = 0; i < d; i++) diff = fmax(diff, fabs(a1[i] - a2[i]));
                if (!(diff <= 2e-6 * (s + 1))) {
                    CHECK(0, "%s d=%d n=%d axpy differs by %g (scale %g)", vs->name, d, n, diff, s);
                    bad = 1;
                }
            }
            free(buf);
            free(cbuf);
            free(mbuf);
        }
    }
}

/* Vectors packed back to back (stride == vec_bytes) in a buffer of exactly
 * their size: under AddressSanitizer (make asan) any read before the first
 * vector or past the last one fails here; otherwise checks the products on
 * every d. */
TEST(kvformat_products_tight_buffers) {
    ak_rng r;
    ak_rng_seed(&r, 77);
    for (int f = 0; f < NF; f++) {
        const ak_kv_format_info *vs = ak_kv_format_get((ak_kv_format)f), *sc = ak_kv_format_get_scalar((ak_kv_format)f);
        int bad = 0;
        for (int d = 2; d <= MAXD && !bad; d += d < 160 ? 2 : 62) {
            size_t vb = vs->vec_bytes(d);
            size_t cb = ak_kv_format_code_bytes((ak_kv_format)f, d), mb = ak_kv_format_meta_bytes((ak_kv_format)f, d);
            for (int n = 1; n <= 5 && !bad; n += 4) {
                /* whole vectors, and the same split into a code run and a
                 * metadata run of exactly their sizes (as in a block) */
                uint8_t *buf = malloc(vb * n), *cbuf = malloc(cb * n), *mbuf = mb ? malloc(mb * n) : NULL;
                float x[MAXD], q[MAXD], w[5], o1[5], o2[5], a1[MAXD], a2[MAXD];
                for (int j = 0; j < n; j++) {
                    gen_gauss(&r, x, d);
                    vs->quantize(x, d, buf + j * vb);
                    memcpy(cbuf + j * cb, buf + j * vb, cb);
                    if (mb) memcpy(mbuf + j * mb, buf + j * vb + cb, mb);
                    w[j] = ak_rng_normal(&r);
                }
                gen_gauss(&r, q, d);
                for (int i = 0; i < d; i++) a1[i] = a2[i] = 0;
                vs->dot(cbuf, cb, mbuf, mb, n, q, d, o1);
                sc->dot(buf, vb, buf + cb, vb, n, q, d, o2);
                vs->axpy(cbuf, cb, mbuf, mb, n, w, d, a1);
                sc->axpy(buf, vb, buf + cb, vb, n, w, d, a2);
                {   /* and the SIMD products on whole vectors too */
                    float o3[5], a3[MAXD];
                    for (int i = 0; i < d; i++) a3[i] = 0;
                    vs->dot(buf, vb, buf + cb, vb, n, q, d, o3);
                    vs->axpy(buf, vb, buf + cb, vb, n, w, d, a3);
                    for (int j = 0; j < n; j++) CHECK(o3[j] == o1[j], "%s d=%d: whole vs split dot differ", vs->name, d);
                    for (int i = 0; i < d; i++) CHECK(a3[i] == a1[i], "%s d=%d: whole vs split axpy differ", vs->name, d);
                }
                double s = 0, e = 0;
                for (int j = 0; j < n; j++) {
                    s += fabs(o2[j]);
                    e = fmax(e, fabs(o1[j] - o2[j]));
                }
                for (int i = 0; i < d; i++) {
                    s += fabs(a2[i]);
                    e = fmax(e, fabs(a1[i] - a2[i]));
                }
                if (!(e <= 1e-4 * (s + 1))) {
                    CHECK(0, "%s d=%d n=%d: SIMD and scalar differ by %g", vs->name, d, n, e);
                    bad = 1;
                }
                free(buf);
                free(cbuf);
                free(mbuf);
            }
        }
    }
}

/* dequant and dequant_t (a block's vectors in f32 for attention, as rows
 * and transposed) against the scalar reference's, for every format, on code
 * and metadata runs of exactly their size (ASan catches a read past them),
 * vector counts around the SIMD tile (8 or 16) and the metadata block,
 * every kind of short last chunk, and output strides wider than the data:
 * what lies between the written values must stay untouched. */
TEST(kvformat_dequant_vs_scalar) {
    ak_rng r;
    ak_rng_seed(&r, 91);
    static const int ds[] = { 2, 6, 14, 16, 30, 32, 64, 66, 96, 128, 130, 272 };
    static const int ns[] = { 1, 3, 4, 5, 8, 9, 15, 16, 17, 32, 33 };
    enum { NMAX = 33, OS = 37 /* transposed stride, > NMAX */, RS = 280 /* row stride, > max d */ };
    const float fill = -12345.0f;
    float *t1 = malloc(sizeof(float) * 272 * OS), *t2 = malloc(sizeof(float) * 272 * OS);
    float *r1 = malloc(sizeof(float) * NMAX * RS), *r2 = malloc(sizeof(float) * NMAX * RS), x[MAXD];
    for (int f = 0; f < NF; f++) {
        const ak_kv_format_info *vs = ak_kv_format_get((ak_kv_format)f), *sc = ak_kv_format_get_scalar((ak_kv_format)f);
        int bad = 0;
        for (size_t di = 0; di < sizeof ds / sizeof *ds && !bad; di++) {
            int d = ds[di];
            size_t cb = ak_kv_format_code_bytes((ak_kv_format)f, d), mb = ak_kv_format_meta_bytes((ak_kv_format)f, d);
            size_t vb = vs->vec_bytes(d);
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns && !bad; ni++) {
                int n = ns[ni];
                uint8_t *buf = malloc(vb * n), *cbuf = malloc(cb * n), *mbuf = mb ? malloc(mb * n) : NULL;
                double nx[NMAX];
                for (int j = 0; j < n; j++) {
                    if (j & 1) gen_heavy(&r, x, d); else gen_gauss(&r, x, d);
                    vs->quantize(x, d, buf + j * vb);
                    memcpy(cbuf + j * cb, buf + j * vb, cb);
                    if (mb) memcpy(mbuf + j * mb, buf + j * vb + cb, mb);
                    float y[MAXD];
                    vs->dequantize(buf + j * vb, d, y);
                    nx[j] = 0;
                    for (int i = 0; i < d; i++) nx[j] = fmax(nx[j], fabs(y[i]));
                }
                for (int i = 0; i < 272 * OS; i++) t1[i] = t2[i] = fill;
                for (int i = 0; i < NMAX * RS; i++) r1[i] = r2[i] = fill;
                vs->dequant_t(cbuf, cb, mbuf, mb, n, d, t1, OS);
                sc->dequant_t(buf, vb, buf + cb, vb, n, d, t2, OS);
                vs->dequant(cbuf, cb, mbuf, mb, n, d, r1, RS);
                sc->dequant(buf, vb, buf + cb, vb, n, d, r2, RS);
                for (int i = 0; i < d && !bad; i++)
                    for (int j = 0; j < OS && !bad; j++) {
                        float a = t1[i * OS + j], b = t2[i * OS + j];
                        if (j >= n ? a != fill || b != fill : !(fabs(a - b) <= 1e-6 * (nx[j] + 1e-30))) {
                            CHECK(0, "%s d=%d n=%d dequant_t value %d of vector %d: %.9g, scalar %.9g", vs->name, d, n,
                                  i, j, a, b);
                            bad = 1;
                        }
                        /* the transposed and the row forms hold the same values */
                        if (j < n && t1[i * OS + j] != r1[j * RS + i]) {
                            CHECK(0, "%s d=%d n=%d: dequant and dequant_t differ at %d,%d", vs->name, d, n, j, i);
                            bad = 1;
                        }
                    }
                for (int i = d; i < 272 && !bad; i++)
                    if (t1[i * OS] != fill) {
                        CHECK(0, "%s d=%d n=%d: dequant_t wrote row %d", vs->name, d, n, i);
                        bad = 1;
                    }
                for (int j = 0; j < NMAX && !bad; j++)
                    for (int i = 0; i < RS && !bad; i++) {
                        float a = r1[j * RS + i], b = r2[j * RS + i];
                        if (j >= n || i >= d ? a != fill || b != fill : !(fabs(a - b) <= 1e-6 * (nx[j] + 1e-30))) {
                            CHECK(0, "%s d=%d n=%d dequant vector %d value %d: %.9g, scalar %.9g", vs->name, d, n, j, i,
                                  a, b);
                            bad = 1;
                        }
                    }
                free(buf);
                free(cbuf);
                free(mbuf);
            }
        }
    }
    free(t1); free(t2); free(r1); free(r2);
}
