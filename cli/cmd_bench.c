/* cmd_bench.c - agentkv bench engine: prefill and decode speed, as
 * llama-bench's pp/tg: pp = a batch of P tokens from an empty cache, tg = N
 * tokens generated one at a time from an empty cache. Median of repeats. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/kernels.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv bench engine -m MODEL [-p 512] [-n 128] [-t THREADS] [-r REPEATS] [--json]\n"
    "  prefill (pp) and decode (tg) tokens/s, median of REPEATS runs (default 3)\n" CACHE_OPTS_HELP;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int bench_engine(int argc, char **argv) {
    ak_args a;
    args_init(&a, "bench engine", argc, argv);
    const char *model_path = NULL;
    int n_pp = 512, n_tg = 128, n_threads = 0, reps = 3, json = 0;
    cache_opts co;
    cache_opts_init(&co);
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) model_path = args_value(&a, f);
        else if (!strcmp(f, "-p")) n_pp = (int)args_int(&a, f, 0, 1 << 16);
        else if (!strcmp(f, "-n")) n_tg = (int)args_int(&a, f, 0, 1 << 16);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) n_threads = (int)args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "-r") || !strcmp(f, "--repeats")) reps = (int)args_int(&a, f, 1, 100);
        else if (!strcmp(f, "--json")) json = 1;
        else if (!cache_opts_parse(&co, &a, f)) args_unknown(&a, f);
    }
    if (!a.failed && !model_path) args_error(&a, "-m MODEL is required");
    if (a.failed) return AK_EXIT_USAGE;
    loaded_model lm;
    if (load_model(&lm, "bench", model_path) < 0) return 1;
    const ak_model *m = lm.model;
    ak_error err = {{0}};
    int rc = 1, ctx_len = (n_pp > n_tg ? n_pp : n_tg) + 1;
    int32_t *toks = malloc(sizeof(int32_t) * (ctx_len + 1));
    float *logits = malloc(sizeof(float) * m->cfg.vocab);
    double *pp = calloc(reps, sizeof(double)), *tg = calloc(reps, sizeof(double));
    ak_block_pool *pool = NULL;
    ak_kv *kv = NULL;
    if (cache_open(&co, m, ctx_len, "bench engine", &pool, &kv) < 0) {
        free(toks); free(logits); free(pp); free(tg);
        unload_model(&lm);
        return 1;
    }
    ak_ctx *ctx = ak_ctx_new(m, n_pp > 0 ? n_pp : 1, n_threads, &err);
    if (!toks || !logits || !pp || !tg || !ctx) {
        if (!err.msg[0]) ak_fail(&err, "out of memory");
        goto fail;
    }
    ak_rng rng;
    ak_rng_seed(&rng, 42);
    for (int i = 0; i < ctx_len; i++) toks[i] = (int32_t)(ak_rng_u32(&rng) % m->cfg.vocab);
    /* one warm-up decode so first-touch costs don't land in the first repeat */
    if (ak_eval(ctx, kv, toks, 1, 0, logits, NULL, NULL, NULL, &err) < 0) goto fail;
    int nt = ak_pool_size(ak_ctx_pool(ctx));
    if (!json) fprintf(stderr, "bench engine: %s, %s weights, %d threads, %s kernels\n", m->gguf.path,
                       gguf_tensor_type_name(m->layers[0].wq.type), nt, ak_simd_name());
    for (int r = 0; r < reps; r++) {
        if (n_pp > 0) {
            ak_kv_truncate(kv, 0);
            double t0 = ak_now();
            if (ak_eval(ctx, kv, toks, n_pp, 0, logits, NULL, NULL, NULL, &err) < 0) goto fail;
            pp[r] = n_pp / (ak_now() - t0);
        }
        if (n_tg > 0) {
            ak_kv_truncate(kv, 0);
            double t0 = ak_now();
            for (int i = 0; i < n_tg; i++)
                if (ak_eval(ctx, kv, toks + i, 1, i, logits, NULL, NULL, NULL, &err) < 0) goto fail;
            tg[r] = n_tg / (ak_now() - t0);
        }
        if (!json) fprintf(stderr, "  repeat %d/%d: pp%d %.2f tok/s, tg%d %.2f tok/s\n", r + 1, reps, n_pp, pp[r],
                           n_tg, tg[r]);
    }
    double pp_med = median(pp, reps), tg_med = median(tg, reps);
    double gbs = tg_med * m->weight_bytes / 1e9;
    if (json)
        printf("{\"model\": \"%s\", \"weight_type\": \"%s\", \"threads\": %d, \"n_pp\": %d, \"n_tg\": %d, "
               "\"pp_tok_s\": %.3f, \"tg_tok_s\": %.3f, \"weight_bytes\": %zu, \"tg_weight_gb_s\": %.2f}\n",
               m->gguf.path, gguf_tensor_type_name(m->layers[0].wq.type), nt, n_pp, n_tg, pp_med, tg_med,
               m->weight_bytes, gbs);
    else
        printf("pp%d %.2f tok/s | tg%d %.2f tok/s (%.1f GB/s of weights) | %s, %d threads\n", n_pp, pp_med, n_tg,
               tg_med, gbs, gguf_tensor_type_name(m->layers[0].wq.type), nt);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "agentkv bench engine: %s\n", err.msg);
done:
    free(toks); free(logits); free(pp); free(tg);
    ak_ctx_free(ctx);
    cache_close(pool, kv);
    unload_model(&lm);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        fputs("usage: agentkv bench engine|kv|ttft [flags]   (agentkv bench NAME --help)\n",
              argc < 1 ? stderr : stdout);
        return argc < 1 ? AK_EXIT_USAGE : 0;
    }
    if (!strcmp(argv[0], "engine")) return bench_engine(argc - 1, argv + 1);
    if (!strcmp(argv[0], "kv")) return cmd_bench_kv(argc - 1, argv + 1);
    if (!strcmp(argv[0], "ttft")) return cmd_bench_ttft(argc - 1, argv + 1);
    fprintf(stderr, "agentkv bench: unknown benchmark '%s' (engine, kv, ttft)\n", argv[0]);
    return AK_EXIT_USAGE;
}
