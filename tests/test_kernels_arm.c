/* test_kernels_arm.c - the NEON packed kernels' levels (kernels_packed_arm.c,
 * kernels_packed_k_arm.c): plain NEON, dotprod (sdot) and i8mm (smmla) must
 * give the same bits, a token's bits must not depend on the tokens it is
 * multiplied with, and the results must match the scalar reference. Run on
 * AArch64 builds (make test-arm runs them under qemu-aarch64 with -cpu max,
 * where all three levels exist, and -cpu cortex-a53, plain NEON only);
 * skipped elsewhere. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "base/cpu.h"
#include "kernels/kernels.h"
#include "kernels/kernels_backend.h"
#include "base/threadpool.h"
#include "base/util.h"

#if defined(AK_SIMD_NEON)
static const char *const level_names[3] = { "plain", "dotprod", "i8mm" };
#endif

/* For every packed weight type: the product at each NEON level this CPU has
 * (forced through AGENTKV_NEON) equals the plain level's to the bit; each
 * token's row equals the same token computed alone (the tiles take 4 tokens,
 * 7 tokens make tiles of 4 and 3, alone is 1: all three sizes, and at the
 * i8mm level the pairs and the odd token); every value is within 1e-5 of
 * sum |w x| of the scalar reference (a wrong nibble, scale or lane is off by
 * orders more). 40 rows: two full groups of 16 and a padded one. */
TEST(kernel_neon_levels_agree_bitwise) {
#if !defined(AK_SIMD_NEON)
    ak_test_skip(t, "not an AArch64 NEON build");
#else
    static const uint32_t types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,
                                      GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                                      GGML_TYPE_Q6_K };
    enum { ROWS = 40, COLS = 512, NTOK = 7 };
    const int top = ak_neon_level();
    const char *saved = getenv("AGENTKV_NEON");
    char *saved_copy = saved ? strdup(saved) : NULL;
    float *w = malloc(sizeof(float) * ROWS * COLS), *x = malloc(sizeof(float) * NTOK * COLS);
    float *ref = malloc(sizeof(float) * NTOK * ROWS), *y0 = malloc(sizeof(float) * NTOK * ROWS);
    float *y = malloc(sizeof(float) * NTOK * ROWS), *one = malloc(sizeof(float) * ROWS);
    uint8_t *wq = malloc(ak_row_bytes(GGML_TYPE_F32, COLS) * ROWS);
    REQUIRE(w && x && ref && y0 && y && one && wq, "out of memory");
    ak_rng r;
    ak_rng_seed(&r, 19);
    for (int i = 0; i < ROWS * COLS; i++) w[i] = ak_rng_normal(&r);
    for (int i = 0; i < NTOK * COLS; i++) x[i] = ak_rng_normal(&r);
    printf("    this CPU: %s\n", level_names[top]);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t type = types[ti];
        const size_t rb = ak_row_bytes(type, COLS), pb = ak_packed_bytes(type, ROWS, COLS);
        CHECK(pb > 0, "type %u: no packed kernels on NEON", type);
        if (!pb) continue;
        for (int i = 0; i < ROWS; i++) ak_quantize_row(type, w + (size_t)i * COLS, wq + (size_t)i * rb, COLS);
        void *P = aligned_alloc(64, (pb + 63) & ~(size_t)63);
        REQUIRE(P, "out of memory");
        ak_pack_weights(type, wq, ROWS, COLS, P);
        ak_matmul_scalar(type, wq, ROWS, COLS, x, NTOK, ref);
        double worst = 0;
        for (int lv = 0; lv <= top; lv++) {
            setenv("AGENTKV_NEON", level_names[lv], 1);
            ak_error err = {{0}};
            float *dst = lv == 0 ? y0 : y;
            ak_matmul_args a = { .wtype = type, .W = P, .rows = ROWS, .cols = COLS, .X = x, .ntok = NTOK, .Y = dst };
            CHECK(ak_matmul_packed(NULL, &a, &err) == 0, "%s", err.msg);
            if (lv > 0)
                CHECK(!memcmp(y, y0, sizeof(float) * NTOK * ROWS), "type %u: level %s differs from plain", type,
                      level_names[lv]);
            for (int tk = 0; tk < NTOK; tk++) {
                a.X = x + (size_t)tk * COLS; a.ntok = 1; a.Y = one;
                CHECK(ak_matmul_packed(NULL, &a, &err) == 0, "%s", err.msg);
                CHECK(!memcmp(one, dst + (size_t)tk * ROWS, sizeof(float) * ROWS),
                      "type %u level %s: token %d alone differs from it in a batch of %d", type, level_names[lv], tk,
                      NTOK);
                for (int i = 0; i < ROWS; i++) {
                    double s = 0;   /* sum |w x| of the dequantized row: the scale of the error */
                    float deq[COLS];
                    ak_dequantize_row(type, wq + (size_t)i * rb, deq, COLS);
                    for (int k = 0; k < COLS; k++) s += fabs((double)deq[k] * x[(size_t)tk * COLS + k]);
                    double e = fabs((double)dst[(size_t)tk * ROWS + i] - ref[(size_t)tk * ROWS + i]) / (s > 0 ? s : 1);
                    if (e > worst) worst = e;
                }
            }
        }
        printf("    %-5s levels plain..%s agree; max |Y - scalar| / sum|w x| = %.2e\n", gguf_tensor_type_name(type),
               level_names[top], worst);
        CHECK(worst < 1e-5, "type %u: error %.2e against the scalar reference", type, worst);
        free(P);
    }
    if (saved_copy) setenv("AGENTKV_NEON", saved_copy, 1);
    else unsetenv("AGENTKV_NEON");
    free(saved_copy);
    free(w); free(x); free(ref); free(y0); free(y); free(one); free(wq);
#endif
}

/* The row-major kernels (kernels_arm.c, kernels_kquant_arm.c: the products
 * of matrices that are not packed) at each NEON level this CPU has, forced
 * through AGENTKV_NEON: every level equals the plain one to the bit, and
 * every value is within 1e-5 of sum |w x| of the scalar reference. 9 rows
 * and 3 tokens leave a partial tile of each (the tiles are 4 x 2). */
TEST(kernel_neon_rowmajor_levels_agree_bitwise) {
#if !defined(AK_SIMD_NEON)
    ak_test_skip(t, "not an AArch64 NEON build");
#else
    static const uint32_t types[] = { GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
                                      GGML_TYPE_Q5_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K };
    enum { ROWS = 9, COLS = 512, NTOK = 3 };
    const int top = ak_neon_level();
    const char *saved = getenv("AGENTKV_NEON");
    char *saved_copy = saved ? strdup(saved) : NULL;
    float *w = malloc(sizeof(float) * ROWS * COLS), *x = malloc(sizeof(float) * NTOK * COLS);
    float *ref = malloc(sizeof(float) * NTOK * ROWS), *y0 = malloc(sizeof(float) * NTOK * ROWS);
    float *y = malloc(sizeof(float) * NTOK * ROWS), *deq = malloc(sizeof(float) * COLS);
    uint8_t *wq = malloc(ak_row_bytes(GGML_TYPE_F32, COLS) * ROWS);
    REQUIRE(w && x && ref && y0 && y && deq && wq, "out of memory");
    ak_rng r;
    ak_rng_seed(&r, 23);
    for (int i = 0; i < ROWS * COLS; i++) w[i] = ak_rng_normal(&r);
    for (int i = 0; i < NTOK * COLS; i++) x[i] = ak_rng_normal(&r);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t type = types[ti];
        const size_t rb = ak_row_bytes(type, COLS);
        for (int i = 0; i < ROWS; i++) ak_quantize_row(type, w + (size_t)i * COLS, wq + (size_t)i * rb, COLS);
        ak_matmul_scalar(type, wq, ROWS, COLS, x, NTOK, ref);
        double worst = 0;
        for (int lv = 0; lv <= top && lv <= 1; lv++) {   /* the row-major kernels have no i8mm form */
            setenv("AGENTKV_NEON", level_names[lv], 1);
            float *dst = lv == 0 ? y0 : y;
            ak_matmul(NULL, type, wq, ROWS, COLS, x, NTOK, dst);
            if (lv > 0)
                CHECK(!memcmp(y, y0, sizeof(float) * NTOK * ROWS), "type %u: level %s differs from plain", type,
                      level_names[lv]);
            for (int i = 0; i < ROWS; i++) {
                ak_dequantize_row(type, wq + (size_t)i * rb, deq, COLS);
                for (int tk = 0; tk < NTOK; tk++) {
                    double s = 0;   /* sum |w x| of the dequantized row: the scale of the error */
                    for (int k = 0; k < COLS; k++) s += fabs((double)deq[k] * x[(size_t)tk * COLS + k]);
                    double e = fabs((double)dst[(size_t)tk * ROWS + i] - ref[(size_t)tk * ROWS + i]) / (s > 0 ? s : 1);
                    if (e > worst) worst = e;
                }
            }
        }
        printf("    %-5s row-major levels plain..%s agree; max |Y - scalar| / sum|w x| = %.2e\n",
               gguf_tensor_type_name(type), level_names[top > 1 ? 1 : top], worst);
        CHECK(worst < 1e-5, "type %u: error %.2e against the scalar reference", type, worst);
    }
    if (saved_copy) setenv("AGENTKV_NEON", saved_copy, 1);
    else unsetenv("AGENTKV_NEON");
    free(saved_copy);
    free(w); free(x); free(ref); free(y0); free(y); free(deq); free(wq);
#endif
}

/* AGENTKV_NEON lowers the NEON level and never raises it: plain is 0,
 * dotprod and i8mm are at most what the CPU has, a name that is none is
 * ignored; the CPU's own level agrees with the features reported (cpu.h). */
TEST(kernel_neon_level_capped_by_agentkv_neon) {
#if !defined(__aarch64__)
    CHECK(ak_cpu_neon_level() == -1, "no NEON level off AArch64: %d", ak_cpu_neon_level());
    ak_test_skip(t, "not an AArch64 build");
#else
    const char *saved = getenv("AGENTKV_NEON");
    char *saved_copy = saved ? strdup(saved) : NULL;
    unsetenv("AGENTKV_NEON");
    const int hw = ak_cpu_neon_level();
    char f[256];
    ak_cpu_features(f, sizeof f);
    printf("    this CPU: %s (features '%s')\n", ak_cpu_neon_level_name(hw), f);
    CHECK(hw >= 0 && hw <= 2, "level %d", hw);
    CHECK(!!strstr(f, "dotprod") == (hw >= 1) && !!strstr(f, "i8mm") == (hw >= 2), "features '%s', level %d", f, hw);
    static const char *const names[3] = { "plain", "dotprod", "i8mm" };
    for (int lv = 0; lv < 3; lv++) {
        CHECK(!strcmp(ak_cpu_neon_level_name(lv), names[lv]), "name of %d", lv);
        setenv("AGENTKV_NEON", names[lv], 1);
        CHECK(ak_cpu_neon_level() == (lv < hw ? lv : hw), "AGENTKV_NEON=%s: level %d, CPU %d", names[lv],
              ak_cpu_neon_level(), hw);
        CHECK(ak_neon_level() == ak_cpu_neon_level(), "the kernels' level is cpu.h's");
    }
    setenv("AGENTKV_NEON", "sve2", 1);
    CHECK(ak_cpu_neon_level() == hw, "an unknown name is ignored");
    CHECK(!strcmp(ak_cpu_neon_level_name(3), "?") && !strcmp(ak_cpu_neon_level_name(-1), "?"), "out of range");
    if (saved_copy) setenv("AGENTKV_NEON", saved_copy, 1);
    else unsetenv("AGENTKV_NEON");
    free(saved_copy);
#endif
}
