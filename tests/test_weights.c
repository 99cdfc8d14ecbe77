/* test_weights.c - every weight type computes what the F32 model computes,
 * within the precision the type implies: synthetic models with the same seed
 * (hence the same underlying F32 weights) in F32, F16, BF16, Q8_0, Q4_0 and
 * the K-quant / legacy types Q6_K, Q5_K, Q4_K, Q5_1, Q5_0, Q4_1,
 * for llama and qwen2, tied and untied. */
#include <string.h>

#include "kv/blockpool.h"
#include "engine/model.h"
#include "engine/synth.h"
#include "test.h"

#define N_TOK 24

/* Logits of N_TOK tokens (fixed ids) run through the model at path. */
static float *run_logits(ak_test_ctx *t, const char *path, int *vocab) {
    ak_error err = {{0}};
    ak_model *m = ak_model_load(path, NULL, NULL, &err);
    if (!m) { ak_test_fail(t, __FILE__, __LINE__, "%s", err.msg); return NULL; }
    int V = m->cfg.vocab;
    ak_block_pool *pool = ak_block_pool_new(&m->spec, 0, 0, &err);
    ak_kv *kv = pool ? ak_kv_new(pool, AK_KV_F32, AK_KV_F32, 64, &err) : NULL;
    ak_ctx *c = kv ? ak_ctx_new(m, 8, 2, &err) : NULL;
    float *all = malloc(sizeof(float) * V * N_TOK);
    int32_t toks[N_TOK];
    for (int i = 0; i < N_TOK; i++) toks[i] = (i * 37 + 5) % V;
    /* prefill in batches of 8 and then decode, so both paths are covered */
    if (!c || !all || ak_eval(c, kv, &(ak_eval_args){.tokens = toks, .n = N_TOK - 4, .all_logits = all},
                              &err) < 0) goto fail;
    for (int i = N_TOK - 4; i < N_TOK; i++)
        if (ak_eval(c, kv, &(ak_eval_args){.tokens = toks + i, .n = 1, .pos0 = i, .logits = all + (size_t)i * V},
                    &err) < 0) goto fail;
    *vocab = V;
    ak_ctx_free(c); ak_kv_free(kv); ak_block_pool_free(pool); ak_model_free(m);
    return all;
fail:
    ak_test_fail(t, __FILE__, __LINE__, "%s: %s", path, err.msg);
    free(all);
    ak_ctx_free(c); ak_kv_free(kv); ak_block_pool_free(pool); ak_model_free(m);
    return NULL;
}

static void compare_types(ak_test_ctx *t, const char *arch, int tied) {
    static const struct { uint32_t type; const char *name; double tol; double agree; } types[] = {
        /* tolerance: max |logit - f32 logit| relative to the largest |f32 logit|;
         * a 10-bit mantissa (F16) keeps ~1e-3 through a few layers, 7 bits
         * (BF16) ~1e-2, 8-bit blocks (weights and activations) ~3e-2, 4-bit blocks
         * ~2e-1 */
        {GGML_TYPE_F32, "F32", 0, 1.0},
        {GGML_TYPE_F16, "F16", 5e-3, 0.95},
        {GGML_TYPE_BF16, "BF16", 3e-2, 0.9},
        {GGML_TYPE_Q8_0, "Q8_0", 3e-2, 0.9},
        {GGML_TYPE_Q4_0, "Q4_0", 3e-1, 0.6},
        /* K-quants and the other 32-blocks: weight error (relative RMS, see
         * test_kquant) 0.018 (Q6_K), ~0.04 (5-bit), ~0.075 (4-bit) against
         * Q8_0's ~0.005 and Q4_0's ~0.1; activations are 8-bit per 256 for K
         * types. Tolerances scale with that. */
        {GGML_TYPE_Q6_K, "Q6_K", 6e-2, 0.85},
        {GGML_TYPE_Q5_K, "Q5_K", 1.2e-1, 0.75},
        {GGML_TYPE_Q4_K, "Q4_K", 2.5e-1, 0.6},
        {GGML_TYPE_Q5_1, "Q5_1", 1.2e-1, 0.75},
        {GGML_TYPE_Q5_0, "Q5_0", 1.2e-1, 0.75},
        {GGML_TYPE_Q4_1, "Q4_1", 2.5e-1, 0.6},
    };
    float *ref = NULL;
    int V = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/w-%s-%d-%s.gguf", test_tmp_dir(), arch, tied, types[i].name);
        ak_synth_opts o;
        ak_synth_defaults(&o);
        o.path = path; o.arch = arch; o.dim = 256; o.n_layers = 2; o.n_heads = 4; o.n_kv_heads = 2;
        o.ffn = 512; o.vocab = 600; o.ctx = 256; o.tied = tied; o.wtype = types[i].type; o.seed = 77;
        o.n_threads = 2;
        ak_error err = {{0}};
        REQUIRE(ak_synth_write(&o, &err) == 0, "synth %s: %s", types[i].name, err.msg);
        int v = 0;
        float *lg = run_logits(t, path, &v);
        remove(path);
        if (!lg) { free(ref); return; }
        if (!ref) { ref = lg; V = v; continue; }
        double ref_max = 0, diff = 0;
        int agree = 0;
        for (int tok = 0; tok < N_TOK; tok++) {
            const float *a = ref + (size_t)tok * V, *b = lg + (size_t)tok * V;
            int ia = 0, ib = 0;
            for (int j = 0; j < V; j++) {
                if (fabsf(a[j]) > ref_max) ref_max = fabsf(a[j]);
                if (fabsf(a[j] - b[j]) > diff) diff = fabsf(a[j] - b[j]);
                if (a[j] > a[ia]) ia = j;
                if (b[j] > b[ib]) ib = j;
            }
            agree += ia == ib;
        }
        double rel = diff / ref_max;
        printf("    %s %s: max |logit diff| %.4g (%.2e of max |logit| %.3g), argmax agrees %d/%d\n", arch,
               types[i].name, diff, rel, ref_max, agree, N_TOK);
        CHECK(rel <= types[i].tol, "%s %s: relative logit error %.3e > %.1e", arch, types[i].name, rel, types[i].tol);
        CHECK(agree >= types[i].agree * N_TOK, "%s %s: argmax agrees on %d of %d tokens", arch, types[i].name, agree,
              N_TOK);
        free(lg);
    }
    free(ref);
}

TEST(weights_types_match_f32_llama_untied) { compare_types(t, "llama", 0); }
TEST(weights_types_match_f32_qwen2_tied) { compare_types(t, "qwen2", 1); }
