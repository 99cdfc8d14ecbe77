/* attnstats_cost.c - what the attention-statistics hook (src/engine/attnstats.h)
 * costs: a prefill of P tokens into an empty f32 cache, timed with the hook
 * detached and attached (default layers: first, middle, last, or -l
 * L1,L2,...), alternating, R repetitions each; prints the median wall and
 * CPU times (all threads; steadier on a shared machine) and their ratios.
 * Built by `make bench-tools` (as BUILD/bench/attnstats_cost):
 *
 *   build/bench/attnstats_cost MODEL.gguf [-p 256] [-r 3] [-t THREADS] [-b BATCH] [-l 0,8,15]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/attnstats.h"
#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "engine/model.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* CPU time of the process (all threads), seconds: steadier than wall time
 * on a machine that other jobs share. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One prefill of tok[0..n) into a fresh sequence; its wall time in seconds
 * (its CPU time in *cpu), or a negative number on failure (message printed). */
static double one_prefill(ak_ctx *c, ak_block_pool *pool, const int32_t *tok, int n, double *cpu) {
    ak_error err = {{0}};
    ak_kv *kv = ak_kv_new(pool, AK_KV_F32, AK_KV_F32, n, &err);
    if (!kv) { fprintf(stderr, "kv: %s\n", err.msg); return -1; }
    double t0 = ak_now(), c0 = cpu_now();
    int rc = ak_eval(c, kv, &(ak_eval_args){.tokens = tok, .n = n}, &err);
    double dt = ak_now() - t0;
    *cpu = cpu_now() - c0;
    ak_kv_free(kv);
    if (rc < 0) { fprintf(stderr, "prefill: %s\n", err.msg); return -1; }
    return dt;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [-p TOKENS] [-r REPS] [-t THREADS] [-b BATCH] [-l L1,L2,...]\n", argv[0]);
        return 2;
    }
    int P = 256, R = 3, threads = 0, batch = 512, layers[AK_ATTN_STATS_MAX_LAYERS], nl = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-p")) P = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r")) R = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-t")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-b")) batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-l")) {
            for (char *s = argv[i + 1]; *s && nl < AK_ATTN_STATS_MAX_LAYERS; s += *s == ',') layers[nl++] = (int)strtol(s, &s, 10);
        } else { fprintf(stderr, "unknown flag %s\n", argv[i]); return 2; }
    }
    if (P < 1 || R < 1) return 2;
    ak_error err = {{0}};
    ak_model *m = ak_model_load(argv[1], NULL, NULL, &err);
    if (!m) { fprintf(stderr, "%s\n", err.msg); return 1; }
    ak_block_pool *pool = ak_block_pool_new(&m->spec, 0, 0, &err);
    ak_ctx *c = pool ? ak_ctx_new(m, batch < P ? batch : P, threads, &err) : NULL;
    ak_attn_stats *st = c ? ak_attn_stats_new(m, nl ? layers : NULL, nl, &err) : NULL;
    if (!st) { fprintf(stderr, "%s\n", err.msg); return 1; }
    int32_t *tok = malloc(sizeof(int32_t) * P);
    ak_rng r;
    ak_rng_seed(&r, 1);
    for (int i = 0; i < P; i++) tok[i] = 3 + (int32_t)(ak_rng_u32(&r) % (uint32_t)(m->cfg.vocab - 3));
    double *off = malloc(sizeof(double) * R), *on = malloc(sizeof(double) * R), warm;
    double *coff = malloc(sizeof(double) * R), *con = malloc(sizeof(double) * R);
    if (one_prefill(c, pool, tok, P < 32 ? P : 32, &warm) < 0) return 1;   /* warm-up: pages, scratch */
    for (int i = 0; i < R; i++) {
        ak_ctx_set_attn_stats(c, NULL);
        if ((off[i] = one_prefill(c, pool, tok, P, &coff[i])) < 0) return 1;
        ak_attn_stats_reset(st);
        ak_ctx_set_attn_stats(c, st);
        if ((on[i] = one_prefill(c, pool, tok, P, &con[i])) < 0) return 1;
        ak_ctx_set_attn_stats(c, NULL);
    }
    qsort(off, R, sizeof(double), cmp_double);
    qsort(on, R, sizeof(double), cmp_double);
    qsort(coff, R, sizeof(double), cmp_double);
    qsort(con, R, sizeof(double), cmp_double);
    printf("%s: prefill %d tokens, %d threads, stats at %d of %d layers (", m->gguf.path, P, ak_threads_size(ak_ctx_pool(c)),
           ak_attn_stats_n_layers(st), m->cfg.n_layer);
    for (int i = 0; i < ak_attn_stats_n_layers(st); i++) printf("%s%d", i ? "," : "", ak_attn_stats_layer(st, i));
    printf("), median of %d: wall off %.3f s (%.1f tok/s), on %.3f s (%.1f tok/s), on/off %.3f; CPU off %.3f s, "
           "on %.3f s, on/off %.3f\n", R, off[R / 2], P / off[R / 2], on[R / 2], P / on[R / 2], on[R / 2] / off[R / 2],
           coff[R / 2], con[R / 2], con[R / 2] / coff[R / 2]);
    free(off); free(on); free(coff); free(con); free(tok);
    ak_attn_stats_free(st);
    ak_ctx_free(c);
    ak_block_pool_free(pool);
    ak_model_free(m);
    return 0;
}
