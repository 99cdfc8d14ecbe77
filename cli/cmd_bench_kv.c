/* cmd_bench_kv.c - agentkv bench kv: what each KV format costs and keeps.
 *   1. bytes per token and agents that fit in a RAM budget, for this model's
 *      cache spec and for two reference shapes (Gemma-3-12B, Llama-3.1-8B),
 *      and for the shapes with sliding-window layers the per-layer-group
 *      layout (kvcache.h LAYER GROUPS) against the naive one at 8K;
 *   2. attention time per decode step (all layers and KV heads, one thread)
 *      at growing context, on random K/V stored in each format;
 *   3. round-trip error on real K/V captured from the model on a text. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/blockpool.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv bench kv -m MODEL [--budget 10.2G] [--contexts 1024,2048,4096,8192,16384]\n"
    "                        [-f TEXT] [--json]\n"
    "  bytes per token, agents that fit in the budget, decode attention time per step and\n"
    "  round-trip error on real K/V (captured from MODEL on TEXT; default: a built-in text)\n";

typedef struct { ak_kv_format k, v; } fmt_pair;

static const fmt_pair pairs[] = {
    {.k = AK_KV_F32, .v = AK_KV_F32}, {.k = AK_KV_F16, .v = AK_KV_F16}, {.k = AK_KV_BF16, .v = AK_KV_BF16},
    {.k = AK_KV_Q8, .v = AK_KV_Q8},   {.k = AK_KV_Q4, .v = AK_KV_Q4},   {.k = AK_KV_Q2, .v = AK_KV_Q2},
    {.k = AK_KV_TQ4, .v = AK_KV_TQ4}, {.k = AK_KV_TQ3, .v = AK_KV_TQ3}, {.k = AK_KV_TQ2, .v = AK_KV_TQ2},
    {.k = AK_KV_Q8, .v = AK_KV_TQ3},  {.k = AK_KV_Q8, .v = AK_KV_Q4},   {.k = AK_KV_Q8, .v = AK_KV_TCQ3},
};
#define N_PAIRS ((int)(sizeof pairs / sizeof pairs[0]))

static const char *default_text =
    "The kernel keeps a list of every process that is waiting for the lock. When the owner releases it, "
    "the first waiter is woken and the list is updated. In the beginning God created the heaven and the "
    "earth. And the earth was without form, and void; and darkness was upon the face of the deep. To "
    "install the package, run the configure script, then make and make install. The PostgreSQL server "
    "reads its configuration from postgresql.conf at startup; changes to most settings need a reload. "
    "Perl's regular expressions are a language of their own: a pattern is compiled once and matched many "
    "times. Git stores snapshots, not differences: each commit points to a tree that names every file.";

static size_t bytes_per_token(const ak_cache_spec *s, fmt_pair p) {
    return (size_t)s->n_layer * s->n_head_kv *
           (ak_kv_format_get(p.k)->vec_bytes(s->head_dim_k) + ak_kv_format_get(p.v)->vec_bytes(s->head_dim_v));
}

/* agents of ctx tokens that fit in budget, counting whole 32-token blocks */
static long agents_fit(const ak_cache_spec *s, fmt_pair p, size_t budget, int ctx) {
    size_t blocks = (size_t)(ctx + AK_DEFAULT_BLOCK_TOKENS - 1) / AK_DEFAULT_BLOCK_TOKENS;
    size_t per_agent = blocks * AK_DEFAULT_BLOCK_TOKENS * bytes_per_token(s, p);
    return (long)(budget / per_agent);
}

static void pair_name(fmt_pair p, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", ak_kv_format_get(p.k)->name, ak_kv_format_get(p.v)->name);
}

/* Local-group blocks a sequence of len positions keeps (blocks of T, window
 * W): those not wholly before len - W (kvcache.h: ak_kv_release_window). */
static long local_blocks_kept(int len, int T, int W) {
    long first = len > W ? (len - W) / T : 0;   /* blocks [0, first) end at or before len - W */
    return (len + T - 1) / T - first;
}

/* The Gemma-3-12B cache: 48 layers x 8 KV heads x 256, window 1024 on
 * every layer but each 6th (5 local : 1 global; llama.cpp's gemma3
 * sliding_window_pattern 6), trained context 131072. */
static ak_cache_spec gemma3_12b_spec(void) {
    ak_cache_spec s = {.n_layer = 48, .n_head_kv = 8, .head_dim_k = 256, .head_dim_v = 256, .n_ctx = 131072};
    s.window = 1024;
    for (int l = 0; l < s.n_layer; l++) s.local[l] = l % 6 != 5;
    return s;
}

/* One row per format pair of the windowed layout of spec s (two layer
 * groups) at ctx tokens in blocks of 32: each group's bytes per token, the
 * bytes of an agent (global: every block; local: at most the blocks a
 * window spans plus the one being filled, ceil(W / T) + 1; at exactly ctx
 * after a forward pass: local_blocks_kept) and the agents that fit in
 * budget, beside the naive layout's (every layer, every position). The
 * block sizes are the block pool's own (ak_block_pool_group_bytes). */
static void print_windowed(const char *shape, const ak_cache_spec *s, size_t budget, int ctx, int json, int *first) {
    ak_error err = {{0}};
    const int T = AK_DEFAULT_BLOCK_TOKENS;
    ak_block_pool *p = ak_block_pool_new(s, T, 0, &err);
    if (!p || ak_block_pool_groups(p) != 2) {
        ak_block_pool_free(p);
        return;
    }
    int nl = ak_spec_group_layers(s, 1), ng = s->n_layer - nl;
    long gblocks = (ctx + T - 1) / T, lrest = local_blocks_kept(ctx, T, s->window);
    long lmax = (s->window + T - 1) / T + 1;
    if (lmax > gblocks) lmax = gblocks;
    if (!json)
        printf("\n-- %s, windowed: %d global + %d local layers (window %d), %d tokens, blocks of %d: global %ld "
               "blocks, local %ld after a pass (at most %ld)\n%-9s %10s %10s %10s %10s %10s %10s %9s %9s %7s\n",
               shape, ng, nl, s->window, ctx, T, gblocks, lrest, lmax, "K/V", "naiveB/tok", "globB/tok", "locB/tok",
               "windB/tok", "naiveMiB", "windMiB", "naive#", "wind#", "ratio");
    char name[32];
    for (int i = 0; i < N_PAIRS; i++) {
        if (!ak_kv_format_supports(pairs[i].k, s->head_dim_k) || !ak_kv_format_supports(pairs[i].v, s->head_dim_v))
            continue;
        pair_name(pairs[i], name, sizeof name);
        size_t gb = ak_block_pool_group_bytes(p, 0, pairs[i].k, pairs[i].v);
        size_t lb = ak_block_pool_group_bytes(p, 1, pairs[i].k, pairs[i].v);
        size_t naive = (size_t)gblocks * T * bytes_per_token(s, pairs[i]);
        size_t wind = (size_t)gblocks * gb + (size_t)lmax * lb;   /* the most an agent holds near ctx */
        size_t wrest = (size_t)gblocks * gb + (size_t)lrest * lb;
        if (json)
            printf("%s{\"shape\": \"%s\", \"formats\": \"%s\", \"context\": %d, \"naive_bytes_per_token\": %zu, "
                   "\"global_bytes_per_token\": %zu, \"local_bytes_per_token\": %zu, \"naive_bytes\": %zu, "
                   "\"windowed_bytes\": %zu, \"windowed_bytes_after_pass\": %zu, \"naive_agents\": %zu, "
                   "\"windowed_agents\": %zu}",
                   *first ? "" : ", ", shape, name, ctx, bytes_per_token(s, pairs[i]), gb / T, lb / T, naive, wind,
                   wrest, budget / naive, budget / wind);
        else
            printf("%-9s %10zu %10zu %10zu %10zu %10.0f %10.0f %9zu %9zu %6.2fx\n", name, bytes_per_token(s, pairs[i]),
                   gb / T, lb / T, wind / (size_t)ctx, naive / 1048576.0, wind / 1048576.0, budget / naive,
                   budget / wind, (double)naive / wind);
        *first = 0;
    }
    ak_block_pool_free(p);
}


/* Fills kv with len positions of N(0,1)-ish K/V (keys with a few larger
 * channels, as real keys have). Returns 0 or -1. */
static int fill_random(ak_kv *kv, const ak_cache_spec *s, int len, ak_rng *rng, ak_error *err) {
    int nk = s->n_head_kv * s->head_dim_k, nv = s->n_head_kv * s->head_dim_v;
    float *k = malloc(sizeof(float) * nk), *v = malloc(sizeof(float) * nv);
    int rc = (k && v) ? ak_kv_prepare(kv, 0, len, err) : ak_fail(err, "out of memory");
    for (int p = 0; rc == 0 && p < len; p++)
        for (int l = 0; l < s->n_layer && rc == 0; l++) {
            for (int i = 0; i < nk; i++) k[i] = ak_rng_normal(rng) * (i % 16 == 3 ? 4.0f : 1.0f);
            for (int i = 0; i < nv; i++) v[i] = ak_rng_normal(rng);
            rc = ak_kv_write(kv, l, p, k, v, err);
        }
    free(k);
    free(v);
    return rc;
}

/* ms per decode step: attention of one query token over len positions, every
 * layer and KV head (the query heads of a group together), one thread */
static double time_attention(const ak_kv *kv, const ak_cache_spec *s, int group, int len) {
    int dk = s->head_dim_k, dv = s->head_dim_v;
    float *q = malloc(sizeof(float) * group * dk), *out = malloc(sizeof(float) * group * dv);
    float *scratch = malloc(sizeof(float) * ak_kv_attend_scratch(kv, group));
    if (!q || !out || !scratch) { free(q); free(out); free(scratch); return -1; }
    for (int i = 0; i < group * dk; i++) q[i] = (float)sin(i * 0.37);
    float scale = 1.0f / sqrtf((float)dk);
    int steps = 0;
    double t0 = ak_now(), t;
    do {
        for (int l = 0; l < s->n_layer; l++)
            for (int h = 0; h < s->n_head_kv; h++)
                ak_kv_attend(kv, &(ak_kv_query){.layer = l, .kv_head = h, .q = q, .n_q = group, .scale = scale,
                             .out = out, .scratch = scratch}, len);
        steps++;
        t = ak_now() - t0;
    } while (t < 0.25 && steps < 10000);
    free(q); free(out); free(scratch);
    return t / steps * 1e3;
}

/* Section 1 of the report: bytes per token and agents that fit in budget
 * for this model's cache spec and two reference shapes, then the windowed
 * layout of those with sliding-window layers. JSON: the "memory" and
 * "windowed" arrays (the latter left open for the next section). */
static void report_memory(const ak_model *m, size_t budget, int json) {
    char name[32];
    /* 1. memory */
    const struct { const char *name; ak_cache_spec spec; } shapes[] = {
        {.name = "this model", .spec = m->spec},
        {.name = "gemma3-12b", .spec = gemma3_12b_spec()},
        {.name = "llama3.1-8b",
         .spec = {.n_layer = 32, .n_head_kv = 8, .head_dim_k = 128, .head_dim_v = 128, .n_ctx = 131072}},
    };
    if (json) printf("{\"model\": \"%s\", \"budget\": %zu, \"memory\": [", m->gguf.path, budget);
    else printf("== memory: bytes per token and agents that fit in %.2f GB (32-token blocks)\n", budget / 1e9);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const ak_cache_spec *s = &shapes[si].spec;
        if (!json)
            printf("-- %s: %d layers x %d KV heads, head dim %d\n%-9s %8s %8s %12s %9s %9s %9s\n", shapes[si].name,
                   s->n_layer, s->n_head_kv, s->head_dim_k, "K/V", "bits K", "bits V", "bytes/tok", "agents@4K",
                   "agents@8K", "agents@16K");
        for (int i = 0; i < N_PAIRS; i++) {
            if (!ak_kv_format_supports(pairs[i].k, s->head_dim_k) || !ak_kv_format_supports(pairs[i].v, s->head_dim_v))
                continue;
            pair_name(pairs[i], name, sizeof name);
            double bk = ak_kv_format_bits(pairs[i].k, s->head_dim_k), bv = ak_kv_format_bits(pairs[i].v, s->head_dim_v);
            size_t bpt = bytes_per_token(s, pairs[i]);
            long a4 = agents_fit(s, pairs[i], budget, 4096), a8 = agents_fit(s, pairs[i], budget, 8192),
                 a16 = agents_fit(s, pairs[i], budget, 16384);
            if (json)
                printf("%s{\"shape\": \"%s\", \"formats\": \"%s\", \"bits_k\": %.4f, \"bits_v\": %.4f, "
                       "\"bytes_per_token\": %zu, \"agents_4k\": %ld, \"agents_8k\": %ld, \"agents_16k\": %ld}",
                       si || i ? ", " : "", shapes[si].name, name, bk, bv, bpt, a4, a8, a16);
            else
                printf("%-9s %8.3f %8.3f %12zu %9ld %9ld %9ld\n", name, bk, bv, bpt, a4, a8, a16);
        }
    }

    /* 1b. the windowed layout of the shapes with sliding-window layers */
    if (json) printf("], \"windowed\": [");
    else printf("\n== windowed layout (per layer group) at 8192 tokens against the naive one, agents in %.2f GB\n",
                budget / 1e9);
    int first_w = 1;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        print_windowed(shapes[si].name, &shapes[si].spec, budget, 8192, json, &first_w);
}

/* 2. attention time per decode step: this model's cache shape, and one
 * layer of the Llama-3.1-8B shape (8 KV heads x 128, 4 query heads each),
 * where the cache is far larger than the CPU caches; at each context of
 * ctxs[0..n_ctxs), for every format pair. Prints its section (text, or the
 * JSON object's "attention_ms" array). Returns 0, or -1 with err set. */
static int report_attention(const ak_model *m, const int *ctxs, int n_ctxs, int json, ak_error *err) {
    char name[32];
    if (json) printf("], \"attention_ms\": [");
    int first_json = 1;
    for (int shape_i = 0; shape_i < 2; shape_i++) {
        ak_cache_spec s = shape_i == 0 ? m->spec : (ak_cache_spec){.n_layer = 1, .n_head_kv = 8, .head_dim_k = 128,
                                                                   .head_dim_v = 128, .n_ctx = 0};
        int group = shape_i == 0 ? m->cfg.n_head / m->cfg.n_head_kv : 4;
        const char *shape_name = shape_i == 0 ? "this model" : "llama3.1-8b, 1 layer";
        int max_ctx = 0;
        for (int i = 0; i < n_ctxs; i++)
            if (ctxs[i] > max_ctx) max_ctx = ctxs[i];
        s.n_ctx = max_ctx;
        if (!json) {
            printf("\n== decode attention per step, ms (%s: %d layers x %d KV heads x %d queries, head dim %d, 1 thread)\n%-9s",
                   shape_name, s.n_layer, s.n_head_kv, group, s.head_dim_k, "K/V");
            for (int i = 0; i < n_ctxs; i++) printf(" %9d", ctxs[i]);
            printf("   f16/this at %d\n", max_ctx);
        }
        double f16_ms = 0;
        for (int i = 0; i < N_PAIRS; i++) {
            if (!ak_kv_format_supports(pairs[i].k, s.head_dim_k) || !ak_kv_format_supports(pairs[i].v, s.head_dim_v))
                continue;
            pair_name(pairs[i], name, sizeof name);
            ak_block_pool *pool = ak_block_pool_new(&s, 0, 0, err);
            ak_kv *kv = pool ? ak_kv_new(pool, pairs[i].k, pairs[i].v, max_ctx, err) : NULL;
            ak_rng rng;
            ak_rng_seed(&rng, 7);
            if (!kv || fill_random(kv, &s, max_ctx, &rng, err) < 0) {
                ak_kv_free(kv);
                ak_block_pool_free(pool);
                return -1;
            }
            if (!json) printf("%-9s", name);
            double last = 0;
            for (int c = 0; c < n_ctxs; c++) {
                last = time_attention(kv, &s, group, ctxs[c]);
                if (json)
                    printf("%s{\"shape\": \"%s\", \"formats\": \"%s\", \"context\": %d, \"ms\": %.4f}",
                           first_json ? "" : ", ", shape_name, name, ctxs[c], last);
                else printf(" %9.3f", last);
                first_json = 0;
                fflush(stdout);
            }
            if (pairs[i].k == AK_KV_F16 && pairs[i].v == AK_KV_F16) f16_ms = last;
            if (!json) {
                if (f16_ms > 0) printf("   %.2fx\n", f16_ms / last);
                else printf("\n");
            }
            ak_kv_free(kv);
            ak_block_pool_free(pool);
        }
    }
    return 0;
}

/* 3. round-trip error on real K/V: the text (text_file, or a default
 * one) prefilled in f32, every vector quantized and dequantized in every
 * format. Prints its section (text, or the JSON object's "roundtrip" array
 * and its end). Returns 0; 1 when the text could not be read (said on
 * stderr); or -1 with err set. */
static int report_roundtrip(const loaded_model *lm, const char *text_file, int json, ak_error *err) {
    const ak_model *m = lm->model;
    ak_cache_spec s = m->spec;
    size_t len = 0;
    char *text = text_file ? read_prompt_file("bench kv", text_file, &len) : NULL;
    if (text_file && !text) return 1;
    const char *src = text ? text : default_text;
    if (!text) len = strlen(default_text);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (ak_tokenize(lm->tok, src, len, AK_TOK_ADD_SPECIAL, &ids, &n_ids, err) < 0) { free(text); return -1; }
    free(text);
    int n = (int)n_ids < m->spec.n_ctx ? (int)n_ids : m->spec.n_ctx;
    if (n > 1024) n = 1024;
    ak_block_pool *pool = ak_block_pool_new(&m->spec, 0, 0, err);
    ak_kv *kv = pool ? ak_kv_new(pool, AK_KV_F32, AK_KV_F32, n, err) : NULL;
    ak_ctx *ctx = kv ? ak_ctx_new(m, 256, 0, err) : NULL;
    int nk = s.n_head_kv * s.head_dim_k, nv = s.n_head_kv * s.head_dim_v;
    float *k = malloc(sizeof(float) * nk), *v = malloc(sizeof(float) * nv);
    float *tmp = malloc(sizeof(float) * (s.head_dim_k > s.head_dim_v ? s.head_dim_k : s.head_dim_v));
    uint8_t *qb = malloc(8 * (size_t)(s.head_dim_k > s.head_dim_v ? s.head_dim_k : s.head_dim_v) + 64);
    int ok = ctx && k && v && tmp && qb && ak_eval(ctx, kv, &(ak_eval_args){.tokens = ids, .n = n}, err) == 0;
    if (ok) {
        if (json) printf("], \"roundtrip\": [");
        else printf("\n== round-trip error on real K/V (%d tokens x %d layers x %d heads): relative MSE, cosine\n"
                    "%-6s %12s %10s %12s %10s\n", n, s.n_layer, s.n_head_kv, "format", "K rel MSE", "K cos",
                    "V rel MSE", "V cos");
        for (int fi = 0; fi < AK_KV_NFORMATS; fi++) {
            const ak_kv_format_info *info = ak_kv_format_get((ak_kv_format)fi);
            if (!ak_kv_format_supports((ak_kv_format)fi, s.head_dim_k)) continue;
            double err_k = 0, nrm_k = 0, err_v = 0, nrm_v = 0, cos_k = 0, cos_v = 0;
            long cnt = 0;
            for (int l = 0; l < s.n_layer; l++)
                for (int p = 0; p < n; p++) {
                    ak_kv_read(kv, l, p, k, v, NULL);
                    for (int h = 0; h < s.n_head_kv; h++) {
                        for (int which = 0; which < 2; which++) {
                            int d = which ? s.head_dim_v : s.head_dim_k;
                            const float *x = (which ? v : k) + (size_t)h * d;
                            info->quantize(x, d, qb);
                            info->dequantize(qb, d, tmp);
                            double e = 0, nx = 0, dot = 0, ny = 0;
                            for (int j = 0; j < d; j++) {
                                e += (x[j] - tmp[j]) * (double)(x[j] - tmp[j]);
                                nx += (double)x[j] * x[j];
                                ny += (double)tmp[j] * tmp[j];
                                dot += (double)x[j] * tmp[j];
                            }
                            double cs = nx > 0 && ny > 0 ? dot / sqrt(nx * ny) : 1;
                            if (which) { err_v += e; nrm_v += nx; cos_v += cs; }
                            else { err_k += e; nrm_k += nx; cos_k += cs; cnt++; }
                        }
                    }
                }
            if (json)
                printf("%s{\"format\": \"%s\", \"k_rel_mse\": %.3e, \"k_cos\": %.6f, \"v_rel_mse\": %.3e, "
                       "\"v_cos\": %.6f}", fi ? ", " : "", info->name, err_k / nrm_k, cos_k / cnt, err_v / nrm_v,
                       cos_v / cnt);
            else
                printf("%-6s %12.3e %10.6f %12.3e %10.6f\n", info->name, err_k / nrm_k, cos_k / cnt,
                       err_v / nrm_v, cos_v / cnt);
        }
        if (json) printf("]}\n");
    }
    free(ids); free(k); free(v); free(tmp); free(qb);
    ak_ctx_free(ctx);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    return ok ? 0 : -1;
}

/* agentkv bench kv: parses the flags and prints the memory, attention and
 * round-trip sections. Returns the exit code. */
int cmd_bench_kv(int argc, char **argv) {
    ak_args a;
    args_init(&a, "bench kv", argc, argv);
    const char *model_path = NULL, *text_file = NULL, *contexts = "1024,2048,4096,8192,16384";
    size_t budget = (size_t)10.2e9;
    int json = 0;
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) model_path = args_value(&a, f);
        else if (!strcmp(f, "-f") || !strcmp(f, "--file")) text_file = args_value(&a, f);
        else if (!strcmp(f, "--contexts")) contexts = args_value(&a, f);
        else if (!strcmp(f, "--budget")) {
            const char *v = args_value(&a, f);
            if (v && (ak_parse_bytes(v, &budget) < 0 || !budget)) args_error(&a, "--budget: bad size '%s'", v);
        } else if (!strcmp(f, "--json")) json = 1;
        else args_unknown(&a, f);
    }
    if (!a.failed && !model_path) args_error(&a, "-m MODEL is required");
    int ctxs[16];
    int n_ctxs = args_int_list(&a, "--contexts", contexts, 1, 1 << 20, ctxs, 16);
    if (a.failed) return AK_EXIT_USAGE;
    loaded_model lm;
    if (load_model(&lm, "bench kv", model_path) < 0) return 1;
    const ak_model *m = lm.model;
    ak_error err = {{0}};
    int rc = 1;

    report_memory(m, budget, json);

    if (report_attention(m, ctxs, n_ctxs, json, &err) < 0) goto fail;
    int rrc = report_roundtrip(&lm, text_file, json, &err);
    if (rrc > 0) goto fail_quiet;
    if (rrc < 0) goto fail;
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "agentkv bench kv: %s\n", err.msg);
fail_quiet:
done:
    unload_model(&lm);
    return rc;
}
