/* cmd_perplexity.c - agentkv perplexity (llama.cpp's method, see
 * src/perplexity.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/perplexity.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv perplexity -m MODEL -f FILE [-c CTX] [-t THREADS] [--chunks N] [--json]\n"
    "  perplexity of FILE by llama.cpp's method; prints PPL = X\n"
    "  -c, --ctx-size N   chunk size (default 512)\n"
    "  --chunks N         score at most N chunks\n"
    "  --json             print a JSON object instead\n";

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
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) model_path = args_value(&a, f);
        else if (!strcmp(f, "-f") || !strcmp(f, "--file")) file = args_value(&a, f);
        else if (!strcmp(f, "-c") || !strcmp(f, "--ctx-size")) n_ctx = (int)args_int(&a, f, 4, 1 << 20);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) n_threads = (int)args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--chunks")) max_chunks = (int)args_int(&a, f, 1, 1 << 24);
        else if (!strcmp(f, "--json")) json = 1;
        else args_unknown(&a, f);
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
    ak_ctx *ctx = NULL;
    ak_ppl_result r;
    double t0 = ak_now();
    if (ak_tokenize(lm.tok, text, len, add_bos ? AK_TOK_ADD_SPECIAL : 0, &ids, &n_ids, &err) < 0) goto out;
    if (!(kv = ak_kv_new(&lm.model->spec, n_ctx, &err))) goto out;
    if (!(ctx = ak_ctx_new(lm.model, n_ctx < 512 ? n_ctx : 512, n_threads, &err))) goto out;
    if (ak_perplexity(ctx, kv, ids, n_ids, n_ctx, add_bos ? ak_tokenizer_bos(lm.tok) : -1, max_chunks,
                      json ? NULL : on_chunk, NULL, &r, &err) < 0)
        goto out;
    double secs = ak_now() - t0;
    if (json)
        printf("{\"ppl\": %.6f, \"ppl_stderr\": %.6f, \"chunks\": %d, \"n_ctx\": %d, \"tokens_scored\": %ld, "
               "\"seconds\": %.3f}\n", r.ppl, r.ppl_stderr, r.chunks, n_ctx, r.scored, secs);
    else
        printf("PPL = %.4f +/- %.4f (%d chunks of %d, %ld tokens scored, %.1f s)\n", r.ppl, r.ppl_stderr, r.chunks,
               n_ctx, r.scored, secs);
    rc = 0;
out:
    if (rc) fprintf(stderr, "agentkv perplexity: %s\n", err.msg);
    free(text); free(ids);
    ak_ctx_free(ctx);
    ak_kv_free(kv);
    unload_model(&lm);
    return rc;
}
