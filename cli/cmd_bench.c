/* cmd_bench.c - agentkv bench engine: prefill and decode speed, as
 * llama-bench's pp/tg: pp = a batch of P tokens from an empty cache, tg = N
 * tokens generated one at a time from an empty cache. Median of repeats.
 *
 * With --batch B it also measures batched decode: B sequences, each with its
 * own cache after a short prompt, advanced together by one ak_forward of B
 * tokens (one per sequence) per step, beside one sequence decoded the same
 * way in the same run; aggregate tokens/s and the ratio.
 *
 * Bandwidth: decode reads every weight once per step plus each sequence's
 * KV cache; bytes read per step / step time is compared with a STREAM-style
 * copy (memcpy of 512 MiB slices on the same threads, counting bytes read
 * plus bytes written, as STREAM does) measured in the same run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/kernels.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv bench engine -m MODEL [-p 512] [-n 128] [-t THREADS] [-r REPEATS] [--batch B] [--json]\n"
    "  prefill (pp) and decode (tg) tokens/s, median of REPEATS runs (default 3),\n"
    "  decode memory bandwidth (weights + KV read per token / time) beside a\n"
    "  measured copy bandwidth (STREAM-style: bytes read + written; a read-only\n"
    "  pass is shown beside it)\n"
    "  --batch B            also decode B sequences together (one forward pass of B\n"
    "                       tokens per step, each sequence after a short prompt):\n"
    "                       aggregate tokens/s vs one sequence decoded the same way\n"
    "                       (ratio: median over repeats of adjacent runs' ratios)\n"
    "  --batch-prompt N     prompt tokens per sequence before batched decode (default 32)\n"
    "  --no-copy-bench      skip the copy-bandwidth measurement\n"
    "  --tg-after-prompt    decode the N tokens after the P-token prompt (a chat turn at\n"
    "                       context P) instead of from an empty cache\n" CACHE_OPTS_HELP;

/* ---- STREAM-style copy bandwidth ---------------------------------------- */

typedef struct {
    uint8_t *src, *dst;
    size_t n;
} copy_job;

static void copy_task(void *arg, int ith, int nth) {
    copy_job *j = arg;
    size_t per = (j->n / (size_t)nth + 4095) & ~(size_t)4095;
    size_t a = per * (size_t)ith, b = a + per > j->n ? j->n : a + per;
    if (a < b) memcpy(j->dst + a, j->src + a, b - a);
}

/* Read-only pass: sums the slice as vectors (GNU C vector extension, so the
 * loop is loads and adds on any target; the sum is kept so it stays). */
typedef uint64_t u64x8 __attribute__((vector_size(64)));
static void read_task(void *arg, int ith, int nth) {
    copy_job *j = arg;
    size_t per = (j->n / (size_t)nth + 4095) & ~(size_t)4095;
    size_t a = per * (size_t)ith, b = a + per > j->n ? j->n : a + per;
    u64x8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (size_t i = a; i + 256 <= b; i += 256) {
        u64x8 v0, v1, v2, v3;
        memcpy(&v0, j->src + i, 64); memcpy(&v1, j->src + i + 64, 64);
        memcpy(&v2, j->src + i + 128, 64); memcpy(&v3, j->src + i + 192, 64);
        s0 += v0; s1 += v1; s2 += v2; s3 += v3;
    }
    s0 += s1 + s2 + s3;
    memcpy(j->dst + (size_t)ith * 64, &s0, 64);
}

/* A buffer for the bandwidth passes, in 2 MB pages where the kernel allows,
 * as the packed weights are (model_load.c): in 4 KB pages this machine's copy
 * measured 41 GB/s against 49, and reads 27 against 33, so the limit decode
 * is compared with would be understated. NULL if none can be had. */
static uint8_t *bw_alloc(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}
static void bw_free(uint8_t *p, size_t bytes) {
    if (p) munmap(p, bytes);
}

/* Best of 5 copies of `bytes` on the pool's threads, in GB/s of bytes read
 * plus written (*read_gbs: best of 5 read-only passes, GB/s); 0 if the
 * buffers cannot be had. */
static double copy_bandwidth(ak_threads *pool, size_t bytes, double *read_gbs) {
    copy_job j = {.src = bw_alloc(bytes), .dst = bw_alloc(bytes), .n = bytes};
    double best = 0;
    *read_gbs = 0;
    if (j.src && j.dst) {
        memset(j.src, 1, bytes);   /* first touch outside the timing */
        memset(j.dst, 2, bytes);
        for (int r = 0; r < 5; r++) {
            double t0 = ak_now();
            ak_threads_run(pool, copy_task, &j);
            double gbs = 2.0 * (double)bytes / (ak_now() - t0) / 1e9;
            if (gbs > best) best = gbs;
            t0 = ak_now();
            ak_threads_run(pool, read_task, &j);
            gbs = (double)bytes / (ak_now() - t0) / 1e9;
            if (gbs > *read_gbs) *read_gbs = gbs;
        }
    }
    bw_free(j.src, bytes); bw_free(j.dst, bytes);
    return best;
}

/* ---- batched decode ------------------------------------------------------ */

/* Sequences decoded together: kvs[s] (each already holding `start`
 * positions) fed tokens from toks[0..n), its logits into logits[s]. */
typedef struct {
    ak_kv **kvs;
    float **logits;
    const int32_t *toks;
    int start, n;
} batch_run;

/* The first B sequences of br advanced n steps by one forward pass of B
 * tokens per step. Returns aggregate tokens/s, or -1 with err set;
 * *kv_bytes gets the mean bytes of the caches (all B) over the run (first
 * and last step). */
static double decode_batched(ak_ctx *ctx, const batch_run *br, int B, double *kv_bytes, ak_error *err) {
    ak_kv **kvs = br->kvs;
    const int32_t *toks = br->toks;
    int start = br->start, n = br->n;
    int32_t tok[256], pos[256];
    if (B > 256) { ak_fail(err, "batch too large"); return -1; }
    double kv0 = 0, kv1 = 0;
    for (int s = 0; s < B; s++) kv0 += (double)ak_kv_bytes(kvs[s]);
    ak_batch b = {.n = B, .token = tok, .pos = pos, .seq = kvs, .logits_out = br->logits};
    double t0 = ak_now();
    for (int i = 0; i < n; i++) {
        for (int s = 0; s < B; s++) {
            tok[s] = toks[(i + 7 * s) % n];
            pos[s] = start + i;
        }
        if (ak_forward(ctx, &b, err) < 0) return -1;
    }
    double dt = ak_now() - t0;
    for (int s = 0; s < B; s++) kv1 += (double)ak_kv_bytes(kvs[s]);
    *kv_bytes = 0.5 * (kv0 + kv1);
    return (double)B * n / dt;
}

/* What bench engine was asked: its flags. */
typedef struct {
    const char *model_path;
    int n_pp, n_tg, n_threads, reps, json, batch, batch_prompt, copy_bench;
    int tg_after;   /* decode after the prompt instead of from an empty cache */
    cache_opts co;
} engine_opts;

/* Parses argv into o. Returns -1 when the bench should run, else its exit
 * code: 0 after --help, AK_EXIT_USAGE after a usage error (printed). */
static int engine_parse(int argc, char **argv, engine_opts *o) {
    ak_args a;
    args_init(&a, "bench engine", argc, argv);
    *o = (engine_opts){.n_pp = 512, .n_tg = 128, .reps = 3, .batch_prompt = 32, .copy_bench = 1};
    cache_opts_init(&o->co);
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) o->model_path = args_value(&a, f);
        else if (!strcmp(f, "-p")) o->n_pp = (int)args_int(&a, f, 0, 1 << 16);
        else if (!strcmp(f, "-n")) o->n_tg = (int)args_int(&a, f, 0, 1 << 16);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) o->n_threads = (int)args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "-r") || !strcmp(f, "--repeats")) o->reps = (int)args_int(&a, f, 1, 100);
        else if (!strcmp(f, "--json")) o->json = 1;
        else if (!strcmp(f, "--batch")) o->batch = (int)args_int(&a, f, 1, 256);
        else if (!strcmp(f, "--batch-prompt")) o->batch_prompt = (int)args_int(&a, f, 1, 1 << 16);
        else if (!strcmp(f, "--no-copy-bench")) o->copy_bench = 0;
        else if (!strcmp(f, "--tg-after-prompt")) o->tg_after = 1;
        else if (!cache_opts_parse(&o->co, &a, f)) args_unknown(&a, f);
    }
    if (!a.failed && !o->model_path) args_error(&a, "-m MODEL is required");
    return a.failed ? AK_EXIT_USAGE : -1;
}

/* What bench engine measured: medians over the repeats, and the copy
 * bandwidth (0: not measured). */
typedef struct {
    double pp_med, tg_med;
    double tg_runs;          /* pool runs per decoded token, last repeat */
    double tg_kv;            /* KV bytes read per tg step, on average */
    int B;                   /* sequences decoded together (0: none) */
    double b1_med, bn_med, b_ratio, bn_kv;
    double copy_gbs, read_gbs;
    int nt;                  /* threads */
} engine_figures;

/* Prints what bench engine measured on m: a JSON object (o->json) or two
 * lines. */
static void engine_report(const engine_opts *o, const ak_model *m, const engine_figures *g) {
    int n_pp = o->n_pp, n_tg = o->n_tg, tg_after = o->tg_after, B = g->B, batch_prompt = o->batch_prompt, nt = g->nt;
    double pp_med = g->pp_med, tg_med = g->tg_med, b1_med = g->b1_med, bn_med = g->bn_med, b_ratio = g->b_ratio;
    double tg_kv = g->tg_kv, bn_kv = g->bn_kv, copy_gbs = g->copy_gbs, read_gbs = g->read_gbs, tg_runs = g->tg_runs;
    const double wb = (double)m->weight_bytes;
    double gbs = tg_med * wb / 1e9;                        /* weights only, as before */
    double tg_bw = tg_med * (wb + tg_kv) / 1e9;            /* weights + KV */
    double bn_bw = B ? bn_med / B * (wb + bn_kv) / 1e9 : 0; /* steps/s x bytes per step */
    double pct = copy_gbs > 0 ? 100 * tg_bw / copy_gbs : 0, bn_pct = copy_gbs > 0 ? 100 * bn_bw / copy_gbs : 0;
    const char *tn = gguf_tensor_type_name(m->layers[0].wq.type);
    if (o->json) {
        /* without the copy measurement (--no-copy-bench) its fields are null */
        char cp[32] = "null", rd[32] = "null", pc[32] = "null", bpc[32] = "null";
        if (copy_gbs > 0) {
            snprintf(cp, sizeof cp, "%.2f", copy_gbs);
            snprintf(rd, sizeof rd, "%.2f", read_gbs);
            snprintf(pc, sizeof pc, "%.1f", pct);
            snprintf(bpc, sizeof bpc, "%.1f", bn_pct);
        }
        printf("{\"model\": \"%s\", \"weight_type\": \"%s\", \"threads\": %d, \"n_pp\": %d, \"n_tg\": %d, "
               "\"pp_tok_s\": %.3f, \"tg_tok_s\": %.3f, \"weight_bytes\": %zu, \"tg_weight_gb_s\": %.2f, "
               "\"tg_kv_bytes\": %.0f, \"tg_gb_s\": %.2f, \"copy_gb_s\": %s, \"read_gb_s\": %s, \"tg_bw_pct\": %s, "
               "\"tg_after_prompt\": %s, \"tg_pool_syncs_per_token\": %.2f",
               m->gguf.path, tn, nt, n_pp, n_tg, pp_med, tg_med, m->weight_bytes, gbs, tg_kv, tg_bw, cp, rd, pc,
               tg_after ? "true" : "false", tg_runs);
        if (B)
            printf(", \"batch\": %d, \"batch_prompt\": %d, \"batch1_tok_s\": %.3f, \"batch_tok_s\": %.3f, "
                   "\"batch_ratio\": %.3f, \"batch_kv_bytes\": %.0f, \"batch_gb_s\": %.2f, \"batch_bw_pct\": %s",
                   B, batch_prompt, b1_med, bn_med, b_ratio, bn_kv, bn_bw, bpc);
        printf("}\n");
    } else {
        printf("pp%d %.2f tok/s | tg%d%s %.2f tok/s (%.1f GB/s of weights + KV", n_pp, pp_med, n_tg,
               tg_after ? " after the prompt" : "", tg_med, tg_bw);
        if (copy_gbs > 0)
            printf(", %.0f%% of copy bandwidth %.1f GB/s; read-only %.1f GB/s", pct, copy_gbs, read_gbs);
        printf(") | %s, %d threads\n", tn, nt);
        if (B) {
            printf("batch %d after %d-token prompts: %.2f tok/s aggregate vs %.2f tok/s for 1 sequence = %.2fx "
                   "(%.1f GB/s of weights + KV",
                   B, batch_prompt, bn_med, b1_med, b_ratio, bn_bw);
            if (copy_gbs > 0) printf(", %.0f%% of copy", bn_pct);
            printf(")\n");
        }
    }
}

/* agentkv bench engine: parses the flags, measures prefill, decode and
 * batched decode, reports. Returns the exit code. */
static int bench_engine(int argc, char **argv) {
    engine_opts o;
    int prc = engine_parse(argc, argv, &o);
    if (prc >= 0) return prc;
    const char *model_path = o.model_path;
    int n_pp = o.n_pp, n_tg = o.n_tg, n_threads = o.n_threads, reps = o.reps, json = o.json, batch = o.batch;
    int batch_prompt = o.batch_prompt, tg_after = o.tg_after, copy_bench = o.copy_bench;
    cache_opts co = o.co;
    loaded_model lm;
    if (load_model(&lm, "bench", model_path) < 0) return 1;
    const ak_model *m = lm.model;
    ak_error err = {{0}};
    if (n_pp == 0) tg_after = o.tg_after = 0;   /* the report says what ran */
    int rc = 1, ctx_len = (tg_after ? n_pp + n_tg : n_pp > n_tg ? n_pp : n_tg) + 1;
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
    int max_batch = n_pp > batch ? n_pp : batch;
    ak_ctx *ctx = ak_ctx_new(m, max_batch > 0 ? max_batch : 1, n_threads, &err);
    /* batched decode: B caches from the same pool, B logits rows */
    int B = n_tg > 0 ? batch : 0;
    ak_kv **bkv = B ? calloc(B, sizeof *bkv) : NULL;
    float **blog = B ? calloc(B, sizeof *blog) : NULL;
    float *blogbuf = B ? malloc(sizeof(float) * m->cfg.vocab * B) : NULL;
    int32_t *btoks = B ? malloc(sizeof(int32_t) * (batch_prompt + n_tg)) : NULL;
    int32_t *bprompt = B ? malloc(sizeof(int32_t) * batch_prompt) : NULL;
    double *bt1 = calloc(reps, sizeof(double)), *btn = calloc(reps, sizeof(double));
    double *brat = calloc(reps, sizeof(double));
    if (!toks || !logits || !pp || !tg || !ctx || !bt1 || !btn || !brat || (B && (!bkv || !blog || !blogbuf || !btoks || !bprompt))) {
        if (!err.msg[0]) ak_fail(&err, "out of memory");
        goto fail;
    }
    ak_rng rng;
    ak_rng_seed(&rng, 42);
    for (int i = 0; i < ctx_len; i++) toks[i] = (int32_t)(ak_rng_u32(&rng) % m->cfg.vocab);
    /* one warm-up decode so first-touch costs don't land in the first repeat */
    if (ak_eval(ctx, kv, &(ak_eval_args){.tokens = toks, .n = 1, .logits = logits}, &err) < 0) goto fail;
    int nt = ak_threads_size(ak_ctx_pool(ctx));
    double tg_runs = 0;   /* pool runs per decoded token, last repeat */
    if (!json) fprintf(stderr, "bench engine: %s, %s weights, %d threads, %s kernels\n", m->gguf.path,
                       gguf_tensor_type_name(m->layers[0].wq.type), nt, ak_simd_name());
    for (int r = 0; r < reps; r++) {
        if (n_pp > 0) {
            ak_kv_truncate(kv, 0);
            double t0 = ak_now();
            if (ak_eval(ctx, kv, &(ak_eval_args){.tokens = toks, .n = n_pp, .logits = logits}, &err) < 0) goto fail;
            pp[r] = n_pp / (ak_now() - t0);
        }
        if (n_tg > 0) {
            int at = tg_after ? n_pp : 0;   /* positions before the first generated token */
            ak_kv_truncate(kv, at);
            uint64_t runs0 = ak_threads_runs(ak_ctx_pool(ctx));
            double t0 = ak_now();
            for (int i = 0; i < n_tg; i++)
                if (ak_eval(ctx, kv, &(ak_eval_args){.tokens = toks + at + i, .n = 1, .pos0 = at + i, .logits = logits},
                            &err) < 0) goto fail;
            tg[r] = n_tg / (ak_now() - t0);
            /* the thread pool's parallel regions (synchronizations) per decoded token */
            tg_runs = (double)(ak_threads_runs(ak_ctx_pool(ctx)) - runs0) / n_tg;
        }
        if (!json) fprintf(stderr, "  repeat %d/%d: pp%d %.2f tok/s, tg%d %.2f tok/s (%.1f pool syncs/token)\n", r + 1,
                           reps, n_pp, pp[r], n_tg, tg[r], tg_runs);
    }
    /* KV read per tg step: the cache grows from 0 to n_tg positions, so on
     * average half of what it holds at the end */
    double tg_kv = n_tg <= 0 ? 0 : tg_after ? (double)ak_kv_bytes(kv) * (n_pp + 0.5 * n_tg) / (n_pp + n_tg)
                                         : 0.5 * (double)ak_kv_bytes(kv);

    double b1_kv = 0, bn_kv = 0;
    if (B) {
        for (int i = 0; i < batch_prompt + n_tg; i++) btoks[i] = (int32_t)(ak_rng_u32(&rng) % m->cfg.vocab);
        for (int s = 0; s < B; s++) {
            blog[s] = blogbuf + (size_t)s * m->cfg.vocab;
            bkv[s] = ak_kv_new(pool, co.fk, co.fv, batch_prompt + n_tg + 1, &err);
            if (!bkv[s]) goto fail;
            /* a different prompt per sequence: rotate the token list */
            for (int i = 0; i < batch_prompt; i++) bprompt[i] = btoks[(i + 5 * s) % (batch_prompt + n_tg)];
            if (ak_eval(ctx, bkv[s], &(ak_eval_args){.tokens = bprompt, .n = batch_prompt}, &err) < 0) goto fail;
        }
        for (int r = 0; r < reps; r++) {
            for (int s = 0; s < B; s++) ak_kv_truncate(bkv[s], batch_prompt);
            const batch_run br = {.kvs = bkv, .logits = blog, .toks = btoks, .start = batch_prompt, .n = n_tg};
            bt1[r] = decode_batched(ctx, &br, 1, &b1_kv, &err);
            if (bt1[r] < 0) goto fail;
            ak_kv_truncate(bkv[0], batch_prompt);
            btn[r] = decode_batched(ctx, &br, B, &bn_kv, &err);
            if (btn[r] < 0) goto fail;
            brat[r] = btn[r] / bt1[r];   /* adjacent runs: the ratio is less noisy than the medians' */
            if (!json) fprintf(stderr, "  repeat %d/%d: batch 1 %.2f tok/s, batch %d %.2f tok/s (aggregate)\n", r + 1,
                               reps, bt1[r], B, btn[r]);
        }
    }
    double read_gbs = 0;
    double copy_gbs = copy_bench ? copy_bandwidth(ak_ctx_pool(ctx), (size_t)512 << 20, &read_gbs) : 0;

    engine_figures g = {.pp_med = bench_median(pp, reps), .tg_med = bench_median(tg, reps), .tg_runs = tg_runs,
                        .tg_kv = tg_kv, .B = B, .bn_kv = bn_kv, .copy_gbs = copy_gbs, .read_gbs = read_gbs, .nt = nt};
    if (B) {
        g.b1_med = bench_median(bt1, reps);
        g.bn_med = bench_median(btn, reps);
        g.b_ratio = bench_median(brat, reps);
    }
    engine_report(&o, m, &g);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "agentkv bench engine: %s\n", err.msg);
done:
    for (int s = 0; s < B && bkv; s++) ak_kv_free(bkv[s]);
    free(bkv); free(blog); free(blogbuf); free(btoks); free(bprompt); free(bt1); free(btn); free(brat);
    free(toks); free(logits); free(pp); free(tg);
    ak_ctx_free(ctx);
    cache_close(pool, kv);
    unload_model(&lm);
    return rc;
}

/* agentkv bench cards (cmd_bench_cards.c) */
int cmd_bench_cards(int argc, char **argv);

int cmd_bench(int argc, char **argv) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        fputs("usage: agentkv bench engine|kv|ttft|serve|pools|cards|reuse|grammar [flags]   (agentkv bench NAME --help)\n",
              argc < 1 ? stderr : stdout);
        return argc < 1 ? AK_EXIT_USAGE : 0;
    }
    if (!strcmp(argv[0], "engine")) return bench_engine(argc - 1, argv + 1);
    if (!strcmp(argv[0], "kv")) return cmd_bench_kv(argc - 1, argv + 1);
    if (!strcmp(argv[0], "ttft")) return cmd_bench_ttft(argc - 1, argv + 1);
    if (!strcmp(argv[0], "serve")) return cmd_bench_serve(argc - 1, argv + 1);
    if (!strcmp(argv[0], "pools")) return cmd_bench_pools(argc - 1, argv + 1);
    if (!strcmp(argv[0], "cards")) return cmd_bench_cards(argc - 1, argv + 1);
    if (!strcmp(argv[0], "reuse")) return cmd_bench_reuse(argc - 1, argv + 1);
    if (!strcmp(argv[0], "grammar")) return cmd_bench_grammar(argc - 1, argv + 1);
    fprintf(stderr, "agentkv bench: unknown benchmark '%s' (engine, kv, ttft, serve, pools, cards, reuse, grammar)\n", argv[0]);
    return AK_EXIT_USAGE;
}
