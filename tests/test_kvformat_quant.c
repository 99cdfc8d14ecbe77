/* Tests of kvformat_quant.c: each SIMD loop against the plain C form its
 * header states, element by element and bit for bit, over random vectors
 * with the values that break careless vector code mixed in (NaN, +-inf,
 * +-0, values on a rounding tie, out of range), at every length up to 70
 * (every tail), with denormals flushed and not. */
#include <math.h>
#include <string.h>

#include "kv/kvformat_quant.h"
#include "base/util.h"
#include "test.h"

static float special(ak_rng *r, float scale) {
    switch (ak_rng_u32(r) % 12) {
    case 0: return NAN;
    case 1: return INFINITY;
    case 2: return -INFINITY;
    case 3: return 0.0f;
    case 4: return -0.0f;
    case 5: return scale * (float)((int)(ak_rng_u32(r) % 21) - 10) * 0.5f;   /* ties of x / scale */
    case 6: return 1e30f;
    case 7: return 1e-40f;   /* a denormal */
    default: return (ak_rng_uniform(r) * 2 - 1) * scale * 200;
    }
}

static void fill(ak_rng *r, float *x, int n, float scale, int specials) {
    for (int i = 0; i < n; i++)
        x[i] = specials && ak_rng_u32(r) % 5 == 0 ? special(r, scale) : (ak_rng_uniform(r) * 2 - 1) * scale * 130;
}

static int same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0; }

static void check_all(ak_test_ctx *t, ak_rng *r) {
    float x[80];
    int8_t q[80];
    uint8_t c[80];
    for (int rep = 0; rep < 300; rep++)
        for (int n = 1; n <= 70; n++) {
            float scale = rep % 3 == 0 ? 1.0f : rep % 3 == 1 ? 0.37f : 3e-3f;
            fill(r, x, n, scale, rep % 2);
            /* absmax: fmaxf skips NaN */
            float ref = 0;
            for (int i = 0; i < n; i++) ref = fmaxf(ref, fabsf(x[i]));
            float got = ak_kvq_absmax(x, n);
            REQUIRE(same_bits(got, ref), "absmax n=%d rep=%d: %g, C form %g", n, rep, got, ref);
            /* min/max: the fminf/fmaxf chain, a zero made +0 */
            float mn = x[0], mx = x[0];
            for (int i = 1; i < n; i++) {
                mn = fminf(mn, x[i]);
                mx = fmaxf(mx, x[i]);
            }
            if (mn == 0) mn = 0.0f;
            if (mx == 0) mx = 0.0f;
            float gmn, gmx;
            ak_kvq_minmax(x, n, &gmn, &gmx);
            REQUIRE((isnan(mn) && isnan(gmn)) || same_bits(gmn, mn), "min n=%d rep=%d: %g, C form %g", n, rep, gmn, mn);
            REQUIRE((isnan(mx) && isnan(gmx)) || same_bits(gmx, mx), "max n=%d rep=%d: %g, C form %g", n, rep, gmx, mx);
            /* codes */
            float s = rep % 7 == 0 ? 0.0f : scale * (0.5f + ak_rng_uniform(r));
            ak_kvq_q8_codes(x, n, s, q);
            for (int i = 0; i < n; i++) {
                float v = s > 0 ? nearbyintf(x[i] / s) : 0.0f;
                int8_t e = isnan(v) ? 0 : (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
                REQUIRE(q[i] == e, "q8 n=%d i=%d x=%g s=%g: %d, C form %d", n, i, x[i], s, q[i], e);
            }
            float m = -scale * 100, top = rep % 2 ? 15.0f : 3.0f;
            ak_kvq_affine_codes(x, n, m, s, top, c);
            for (int i = 0; i < n; i++) {
                float v = s > 0 ? nearbyintf((x[i] - m) / s) : 0.0f;
                uint8_t e = isnan(v) ? 0 : (uint8_t)(v < 0 ? 0 : v > top ? top : v);
                REQUIRE(c[i] == e, "affine n=%d i=%d x=%g: %d, C form %d", n, i, x[i], c[i], e);
            }
            const float bound[15] = {-2.1f, -1.6f, -1.2f, -0.9f, -0.6f, -0.4f, -0.2f, 0.0f,
                                     0.2f,  0.4f,  0.6f,  0.9f,  1.2f,  1.6f,  2.1f};
            int nb = rep % 3 == 0 ? 15 : rep % 3 == 1 ? 7 : 3;
            for (int i = 0; i < n; i++) x[i] /= scale * 60;
            if (rep % 4 == 0) x[n / 2] = bound[nb / 2];   /* exactly on a bound: not above it */
            ak_kvq_bucket_codes(x, n, bound, nb, c);
            for (int i = 0; i < n; i++) {
                int e = 0;
                for (int k = 0; k < nb; k++) e += x[i] > bound[k];
                REQUIRE(c[i] == e, "bucket n=%d i=%d y=%g: %d, C form %d", n, i, x[i], c[i], e);
            }
        }
}

/* The transform's C form, stage by stage. */
static void wht_c(float *x, int m) {
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

TEST(kvformat_quant_wht_equals_its_c_form) {
    ak_rng r;
    ak_rng_seed(&r, 11);
    float x[1024], y[1024];
    for (int m = 2; m <= 1024; m *= 2)
        for (int rep = 0; rep < 20; rep++) {
            fill(&r, x, m, rep % 2 ? 1.0f : 1e-3f, rep % 3 == 0);
            memcpy(y, x, sizeof(float) * (size_t)m);
            ak_kvq_wht(x, m);
            wht_c(y, m);
            for (int i = 0; i < m; i++)
                REQUIRE(same_bits(x[i], y[i]) || (isnan(x[i]) && isnan(y[i])), "m=%d i=%d: %g, C form %g", m, i, x[i],
                        y[i]);
        }
}

TEST(kvformat_quant_loops_equal_their_c_forms) {
    ak_rng r;
    ak_rng_seed(&r, 7);
    check_all(t, &r);
    if (t->failures) return;
    unsigned mode = ak_flush_denormals();   /* as on the thread pool's workers */
    check_all(t, &r);
    ak_restore_denormals(mode);
}
