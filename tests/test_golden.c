/* test_golden.c - the engine against llama.cpp's reference outputs in
 * ../shared/golden: greedy continuations must match exactly, perplexities
 * within 0.2%. */
#include <cjson/cJSON.h>
#include <string.h>

#include "../src/blockpool.h"
#include "../src/model.h"
#include "../src/perplexity.h"
#include "../src/sampler.h"
#include "../src/tokenizer.h"
#include "test.h"

typedef struct {
    ak_model *m;
    ak_tokenizer *tk;
} tmodel;

static int open_model(ak_test_ctx *t, tmodel *tm, const char *rel) {
    char path[512];
    ak_error err = {{0}};
    tm->m = ak_model_load(test_path(path, sizeof path, rel), NULL, NULL, &err);
    if (!tm->m) { ak_test_fail(t, __FILE__, __LINE__, "load %s: %s", rel, err.msg); return -1; }
    tm->tk = ak_tokenizer_load(&tm->m->gguf, &err);
    if (!tm->tk) {
        ak_test_fail(t, __FILE__, __LINE__, "tokenizer %s: %s", rel, err.msg);
        ak_model_free(tm->m);
        return -1;
    }
    return 0;
}

static void close_model(tmodel *tm) {
    ak_tokenizer_free(tm->tk);
    ak_model_free(tm->m);
}

/* Greedy continuation of prompt: exactly n tokens (no stop at EOS), decoded. */
static char *greedy(ak_test_ctx *t, tmodel *tm, const char *prompt, int n, int n_threads, ak_kv_format fmt) {
    ak_error err = {{0}};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (ak_tokenize(tm->tk, prompt, strlen(prompt), AK_TOK_ADD_SPECIAL, &ids, &n_ids, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "tokenize: %s", err.msg);
        return NULL;
    }
    int V = tm->m->cfg.vocab;
    ak_block_pool *pool = ak_block_pool_new(&tm->m->spec, 0, 0, &err);
    ak_kv *kv = pool ? ak_kv_new(pool, fmt, fmt, (int)n_ids + n + 1, &err) : NULL;
    ak_ctx *c = ak_ctx_new(tm->m, 64, n_threads, &err);
    float *logits = malloc(sizeof(float) * V);
    size_t cap = ak_detok_bound(tm->tk) * ((size_t)n + 1) + 1;
    char *out = calloc(1, cap);
    size_t len = 0;
    ak_detok dt;
    ak_detok_init(&dt);
    if (!kv || !c || !logits || !out) { ak_test_fail(t, __FILE__, __LINE__, "setup: %s", err.msg); goto fail; }
    if (ak_eval(c, kv, ids, (int)n_ids, 0, logits, NULL, NULL, NULL, &err) < 0) goto fail_err;
    for (int i = 0; i < n; i++) {
        int32_t tok = ak_argmax(logits, V);
        size_t np = 0;
        if (ak_detok_push(&dt, tm->tk, tok, out + len, cap - len, &np) < 0) {
            ak_test_fail(t, __FILE__, __LINE__, "cannot decode token %d", tok);
            goto fail;
        }
        len += np;
        if (i + 1 < n && ak_eval(c, kv, &tok, 1, (int)n_ids + i, logits, NULL, NULL, NULL, &err) < 0) goto fail_err;
    }
    len += ak_detok_flush(&dt, out + len, cap - len);
    out[len] = 0;
    free(ids); free(logits);
    ak_ctx_free(c);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    return out;
fail_err:
    ak_test_fail(t, __FILE__, __LINE__, "eval: %s", err.msg);
fail:
    free(ids); free(logits); free(out);
    ak_ctx_free(c);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    return NULL;
}

/* Runs every line of golden/<dir>/greedy.jsonl through the model. */
static void check_greedy(ak_test_ctx *t, const char *model_rel, const char *golden_rel, int n_threads,
                         ak_kv_format fmt) {
    tmodel tm;
    if (open_model(t, &tm, model_rel) < 0) return;
    char path[512];
    ak_error err = {{0}};
    char *text = ak_read_file(test_path(path, sizeof path, golden_rel), NULL, &err);
    if (!text) { ak_test_fail(t, __FILE__, __LINE__, "%s", err.msg); close_model(&tm); return; }
    int cases = 0, ok = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        cJSON *p = cJSON_GetObjectItem(j, "prompt"), *np = cJSON_GetObjectItem(j, "n_predict"),
              *cont = cJSON_GetObjectItem(j, "continuation");
        if (!cJSON_IsString(p) || !cJSON_IsNumber(np) || !cJSON_IsString(cont)) {
            ak_test_fail(t, __FILE__, __LINE__, "bad golden line: %s", line);
            cJSON_Delete(j);
            continue;
        }
        cases++;
        char *got = greedy(t, &tm, p->valuestring, np->valueint, n_threads, fmt);
        if (got && !strcmp(got, cont->valuestring)) ok++;
        else if (got)
            ak_test_fail(t, __FILE__, __LINE__, "%s: prompt \"%s\"\n    expected \"%s\"\n    got      \"%s\"", model_rel,
                         p->valuestring, cont->valuestring, got);
        free(got);
        cJSON_Delete(j);
    }
    CHECK(cases > 0, "no cases in %s", golden_rel);
    printf("    %s (%s cache): %d/%d greedy continuations match\n", model_rel, ak_kv_format_get(fmt)->name, ok, cases);
    free(text);
    close_model(&tm);
}

TEST(golden_greedy_stories260K) {
    check_greedy(t, "models/stories260K.gguf", "golden/stories260K/greedy.jsonl", 2, AK_KV_F16);
}
TEST(golden_greedy_tiny_llama_f32) {
    check_greedy(t, "models/tiny-llama-h64-gqa-f32.gguf", "golden/tiny-llama-h64/greedy.jsonl", 2, AK_KV_F16);
}
TEST(golden_greedy_tiny_llama_f16) {
    check_greedy(t, "models/tiny-llama-h64-gqa-f16.gguf", "golden/tiny-llama-h64/greedy.jsonl", 2, AK_KV_F16);
}
TEST(golden_greedy_qwen2_tiny) {
    check_greedy(t, "models/qwen2-tiny.gguf", "golden/qwen2-tiny/greedy.jsonl", 2, AK_KV_F16);
}
TEST(golden_greedy_f32_cache) {
    check_greedy(t, "models/stories260K.gguf", "golden/stories260K/greedy.jsonl", 2, AK_KV_F32);
    check_greedy(t, "models/tiny-llama-h64-gqa-f32.gguf", "golden/tiny-llama-h64/greedy.jsonl", 2, AK_KV_F32);
    check_greedy(t, "models/qwen2-tiny.gguf", "golden/qwen2-tiny/greedy.jsonl", 2, AK_KV_F32);
}
TEST(golden_greedy_single_thread) {
    check_greedy(t, "models/stories260K.gguf", "golden/stories260K/greedy.jsonl", 1, AK_KV_F16);
}

static void check_ppl(ak_test_ctx *t, const char *model_rel, const char *text_rel, int n_ctx, double expect) {
    tmodel tm;
    if (open_model(t, &tm, model_rel) < 0) return;
    char path[512];
    ak_error err = {{0}};
    size_t len;
    char *text = ak_read_file(test_path(path, sizeof path, text_rel), &len, &err);
    int32_t *ids = NULL;
    size_t n = 0;
    int add_bos = ak_tokenizer_add_bos(tm.tk);
    ak_block_pool *pool = ak_block_pool_new(&tm.m->spec, 0, 0, &err);
    ak_kv *kv = pool ? ak_kv_new(pool, AK_KV_F16, AK_KV_F16, n_ctx, &err) : NULL;
    ak_ctx *c = ak_ctx_new(tm.m, 512, 2, &err);
    ak_ppl_result r;
    if (!text || !kv || !c) { ak_test_fail(t, __FILE__, __LINE__, "setup: %s", err.msg); goto out; }
    if (ak_tokenize(tm.tk, text, len, add_bos ? AK_TOK_ADD_SPECIAL : 0, &ids, &n, &err) < 0 ||
        ak_perplexity(c, kv, ids, n, n_ctx, &(ak_ppl_opts){.bos = add_bos ? ak_tokenizer_bos(tm.tk) : -1}, &r, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "%s", err.msg);
        goto out;
    }
    double rel = fabs(r.ppl - expect) / expect;
    printf("    %s -c %d: PPL %.4f, reference %.4f, rel diff %.4f%% (%d chunks)\n", model_rel, n_ctx, r.ppl, expect,
           rel * 100, r.chunks);
    CHECK(rel <= 0.002, "PPL %.4f differs from the reference %.4f by %.3f%%", r.ppl, expect, rel * 100);
out:
    free(text); free(ids);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    ak_ctx_free(c);
    close_model(&tm);
}

TEST(golden_ppl_stories260K_c128) {
    check_ppl(t, "models/stories260K.gguf", "golden/stories260K/story.txt", 128, 4.0278);
}
TEST(golden_ppl_tiny_llama_c512) {
    check_ppl(t, "models/tiny-llama-h64-gqa-f32.gguf", "golden/tiny-llama-h64/val.txt", 512, 29.6096);
}
TEST(golden_ppl_tiny_llama_c1024) {
    check_ppl(t, "models/tiny-llama-h64-gqa-f32.gguf", "golden/tiny-llama-h64/val.txt", 1024, 30.1064);
}
TEST(golden_ppl_qwen2_tiny_c128) {
    check_ppl(t, "models/qwen2-tiny.gguf", "golden/stories260K/story.txt", 128, 80772.566);
}
