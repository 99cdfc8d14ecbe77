/* cmd_perplexity.c - agentkv perplexity (llama.cpp's method, see
 * src/engine/perplexity.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/calib.h"
#include "engine/perplexity.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv perplexity -m MODEL -f FILE [-c CTX] [-t THREADS] [--chunks N] [--json]\n"
    "  perplexity of FILE by llama.cpp's method; prints PPL = X\n"
    "  -c, --ctx-size N   chunk size (default 512)\n"
    "  --chunks N         score at most N chunks\n"
    "  --json             print a JSON object instead\n"
    "  --kl-base FILE     save the next-token distributions (top 32 + rest) as a baseline\n"
    "  --kl FILE          compare against a saved baseline: mean KL, delta PPL, argmax agreement\n"
    CACHE_OPTS_HELP;

static void on_chunk(void *ud, int chunk, int n_chunks, double ppl) {
    (void)ud;
    fprintf(stderr, "[%d]%.4f%s", chunk, ppl, chunk == n_chunks ? "\n" : ",");
    fflush(stderr);
}

int cmd_perplexity(int argc, char **argv) {
    ak_args a;
    args_init(&a, "perplexity", argc, argv);
    const char *model_path = NULL, *file = NULL;
    int n_ctx = 512, n_threads = 0, json = 0, max_chunks = 0;
    const char *kl_out = NULL, *kl_in = NULL;
    cache_opts co;
    cache_opts_init(&co);
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) model_path = args_value(&a, f);
        else if (!strcmp(f, "-f") || !strcmp(f, "--file")) file = args_value(&a, f);
        else if (!strcmp(f, "-c") || !strcmp(f, "--ctx-size")) n_ctx = (int)args_int(&a, f, 4, 1 << 20);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) n_threads = (int)args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--chunks")) max_chunks = (int)args_int(&a, f, 1, 1 << 24);
        else if (!strcmp(f, "--json")) json = 1;
        else if (!strcmp(f, "--kl-base")) kl_out = args_value(&a, f);
        else if (!strcmp(f, "--kl")) kl_in = args_value(&a, f);
        else if (!cache_opts_parse(&co, &a, f)) args_unknown(&a, f);
    }
    if (!a.failed && !model_path) args_error(&a, "-m MODEL is required");
    if (!a.failed && !file) args_error(&a, "-f FILE is required");
    if (a.failed) return AK_EXIT_USAGE;

    size_t len;
    char *text = read_prompt_file("perplexity", file, &len);
    if (!text) return 1;
    loaded_model lm;
    if (load_model(&lm, "perplexity", model_path) < 0) { free(text); return 1; }
    int add_bos = ak_tokenizer_add_bos(lm.tok);
    ak_error err = {{0}};
    int rc = 1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    ak_kv *kv = NULL;
    ak_block_pool *pool = NULL;
    ak_ctx *ctx = NULL;
    ak_ppl_result r;
    double t0 = ak_now();
    if (ak_tokenize(lm.tok, text, len, add_bos ? AK_TOK_ADD_SPECIAL : 0, &ids, &n_ids, &err) < 0) goto out;
    if (cache_open(&co, lm.model, n_ctx, "perplexity", &pool, &kv) < 0) { err.msg[0] = 0; goto out; }
    if (!(ctx = ak_ctx_new(lm.model, n_ctx < 512 ? n_ctx : 512, n_threads, &err))) goto out;
    if (co.center && ak_calib_install(ctx, lm.tok, pool, co.fk, co.fv, co.center, &err) < 0) goto out;
    const char *center = ak_block_pool_center_id(pool, 0, co.fk), *vcenter = ak_block_pool_center_id(pool, 1, co.fv);
    ak_ppl_opts po = {.max_chunks = max_chunks, .bos = add_bos ? ak_tokenizer_bos(lm.tok) : -1, .kl_base_out = kl_out,
                      .kl_base_in = kl_in, .cb = json ? NULL : on_chunk};
    if (ak_perplexity(ctx, kv, ids, n_ids, n_ctx, &po, &r, &err) < 0) goto out;
    double secs = ak_now() - t0;
    const char *ck = ak_kv_format_get(co.fk)->name, *cv = ak_kv_format_get(co.fv)->name;
    if (json) {
        printf("{\"ppl\": %.6f, \"ppl_stderr\": %.6f, \"chunks\": %d, \"n_ctx\": %d, \"tokens_scored\": %ld, "
               "\"cache_type_k\": \"%s\", \"cache_type_v\": \"%s\", \"bits_k\": %.4f, \"bits_v\": %.4f, "
               "\"key_center\": \"%s\", \"value_center\": \"%s\", \"seconds\": %.3f",
               r.ppl, r.ppl_stderr, r.chunks, n_ctx, r.scored, ck, cv,
               ak_kv_format_bits(co.fk, lm.model->spec.head_dim_k), ak_kv_format_bits(co.fv, lm.model->spec.head_dim_v),
               center ? center : "none", vcenter ? vcenter : "none", secs);
        if (r.have_kl)
            printf(", \"base_ppl\": %.6f, \"delta_ppl_pct\": %.6f, \"kl_mean\": %.8f, \"kl_max\": %.6f, "
                   "\"top1_agree\": %.6f", r.base_ppl, r.delta_ppl_pct, r.kl_mean, r.kl_max, r.top1_agree);
        printf("}\n");
    } else {
        printf("PPL = %.4f +/- %.4f (%d chunks of %d, %ld tokens scored, cache K %s%s / V %s%s, %.1f s)\n", r.ppl,
               r.ppl_stderr, r.chunks, n_ctx, r.scored, ck, center ? " centered" : "", cv, vcenter ? " centered" : "",
               secs);
        if (r.have_kl)
            printf("vs baseline: PPL %.4f, delta PPL %+.4f%%, mean KL %.6f (max %.4f), argmax agrees %.2f%%\n",
                   r.base_ppl, r.delta_ppl_pct, r.kl_mean, r.kl_max, r.top1_agree * 100);
        if (kl_out) printf("baseline saved to %s (top %d + rest per position)\n", kl_out, AK_KL_DEFAULT_TOP_K);
    }
    rc = 0;
out:
    if (rc && err.msg[0]) fprintf(stderr, "agentkv perplexity: %s\n", err.msg);
    free(text); free(ids);
    ak_ctx_free(ctx);
    cache_close(pool, kv);
    unload_model(&lm);
    return rc;
}
