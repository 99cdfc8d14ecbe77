/* fuzz_model.c - libFuzzer target for model loading (src/engine/model_load.c): the
 * architecture, hyperparameter, tensor shape and type checks on hostile GGUF
 * files.
 *
 * Each input is written to a temporary file and loaded with ak_model_load
 * (which maps it, so the input must be a file). A model that loads has
 * passed every check, so it must also run: a context is made and two
 * tokens (the first and the last id of the vocabulary) are evaluated in a
 * small f16 cache (any logits will do: the point is that nothing is read or
 * written out of bounds). Loading packs
 * weights for the kernels too, so shapes that the checks let through reach
 * the packing code. A crash, a sanitizer report, or a model whose config
 * disagrees with its own tensors is a bug.
 * Run with `make fuzz FUZZ_TARGETS=model`.
 *
 * Seeds (fuzz/corpus/model/) are tiny synthetic models written by
 * `agentkv synth` (fuzz/mkseeds.py): llama and qwen2, tied and untied, in
 * F32, F16, BF16, Q8_0, Q4_0 and Q5_1, 17 to 60 KiB each.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "engine/model.h"

static char path[512];

/* The temporary file is removed when the run ends. */
static void cleanup(void) { unlink(path); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(path, sizeof path, "/tmp/agentkv-fuzz-model-%d.gguf", (int)getpid());
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    if (fclose(f)) abort();
    ak_error err = {{0}};
    ak_model *m = ak_model_load(path, NULL, NULL, &err);
    /* the mapping outlives the name: nothing is left behind when libFuzzer
     * ends the run without calling the atexit handlers */
    unlink(path);
    if (!m) return 0;
    const ak_config *c = &m->cfg;
    if (c->dim < 1 || c->n_layer < 1 || c->n_head < 1 || c->n_head_kv < 1 || c->vocab < 1 || c->head_dim < 1 ||
        c->n_head % c->n_head_kv || c->rope_dim > c->head_dim)
        __builtin_trap();   /* the checks let an impossible config through */
    if (m->tok_embd.rows != c->vocab || m->tok_embd.cols != c->dim) __builtin_trap();
    /* a small forward pass: big hyperparameters that the tensors do not
     * back have been refused above, so this stays cheap */
    ak_ctx *ctx = ak_ctx_new(m, 2, 1, &err);
    ak_block_pool *pool = ctx ? ak_block_pool_new(&m->spec, 0, 0, &err) : NULL;
    ak_kv *kv = pool ? ak_kv_new(pool, AK_KV_F16, AK_KV_F16, 8, &err) : NULL;
    float *logits = kv ? malloc(sizeof(float) * (size_t)c->vocab) : NULL;
    if (logits) {
        int32_t toks[2] = {0, c->vocab - 1};
        if (ak_eval(ctx, kv, &(ak_eval_args){.tokens = toks, .n = 2, .logits = logits}, &err) == 0) {
            volatile float sink = 0;
            for (int i = 0; i < c->vocab; i++) sink += logits[i];
            (void)sink;
        }
    }
    free(logits);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    ak_ctx_free(ctx);
    ak_model_free(m);
    return 0;
}
