/* arm_insns.c - the product whose instructions scripts/arm-insns.sh counts
 * under qemu-aarch64: ROWS x COLS weights of TYPE (quantized from a fixed
 * random matrix), NTOK tokens, the product computed REPS times on one thread
 * (packed where the build packs TYPE, else row-major). Counting the same run
 * at two REPS and two COLS isolates the instructions per extra column block
 * of the product's loops (setup and per-call work cancel).
 *   arm_insns TYPE ROWS COLS NTOK REPS      TYPE: f32 f16 bf16 q8_0 q4_0 q4_1
 *                                           q5_0 q5_1 q4_k q5_k q6_k
 * Prints "packed" or "row-major" and a checksum of Y (so the work is used). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/base/gguf.h"
#include "../src/kernels/kernels.h"
#include "../src/base/util.h"

static const struct { const char *name; uint32_t type; } types[] = {
    {.name = "f32", .type = GGML_TYPE_F32}, {.name = "f16", .type = GGML_TYPE_F16},
    {.name = "bf16", .type = GGML_TYPE_BF16}, {.name = "q8_0", .type = GGML_TYPE_Q8_0},
    {.name = "q4_0", .type = GGML_TYPE_Q4_0}, {.name = "q4_1", .type = GGML_TYPE_Q4_1},
    {.name = "q5_0", .type = GGML_TYPE_Q5_0}, {.name = "q5_1", .type = GGML_TYPE_Q5_1},
    {.name = "q4_k", .type = GGML_TYPE_Q4_K}, {.name = "q5_k", .type = GGML_TYPE_Q5_K},
    {.name = "q6_k", .type = GGML_TYPE_Q6_K},
};

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s TYPE ROWS COLS NTOK REPS\n", argv[0]);
        return 2;
    }
    uint32_t type = UINT32_MAX;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(argv[1], types[i].name)) type = types[i].type;
    const int64_t rows = atoll(argv[2]), cols = atoll(argv[3]), ntok = atoll(argv[4]);
    const int reps = atoi(argv[5]);
    if (type == UINT32_MAX || rows <= 0 || cols <= 0 || ntok <= 0 || reps < 0) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    size_t rb = ak_row_bytes(type, cols);
    float *w = malloc(sizeof(float) * (size_t)cols), *x = malloc(sizeof(float) * (size_t)(cols * ntok));
    float *y = malloc(sizeof(float) * (size_t)(rows * ntok));
    uint8_t *W = malloc(rb * (size_t)rows);
    if (!w || !x || !y || !W) return 1;
    ak_rng r;
    ak_rng_seed(&r, 5);
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t k = 0; k < cols; k++) w[k] = ak_rng_normal(&r);
        ak_quantize_row(type, w, W + (size_t)i * rb, cols);
    }
    for (int64_t i = 0; i < cols * ntok; i++) x[i] = ak_rng_normal(&r);
    size_t pb = ak_packed_bytes(type, rows, cols);
    void *P = pb ? aligned_alloc(64, (pb + 63) & ~(size_t)63) : NULL;
    if (pb && !P) return 1;
    if (P) ak_pack_weights(type, W, rows, cols, P);
    double sum = 0;
    for (int k = 0; k < reps; k++) {
        if (P) {
            ak_error err = {{0}};
            if (ak_matmul_packed(NULL, &(ak_matmul_args){ .wtype = type, .W = P, .rows = rows, .cols = cols, .X = x,
                                                          .ntok = ntok, .Y = y }, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
        } else {
            ak_matmul(NULL, type, W, rows, cols, x, ntok, y);
        }
        sum += y[0];
    }
    printf("%s %.6g\n", P ? "packed" : "row-major", sum);
    free(P); free(w); free(x); free(y); free(W);
    return 0;
}
