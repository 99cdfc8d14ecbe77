/* store_restore.c - warm restore of one agent from the local directory and
 * from Redis (bench/store.sh starts the server): a sequence of the
 * Llama-3.2-1B cache shape (16 layers x 8 KV heads, head dim 64; K/V
 * formats as given, default f16) filled with random vectors at each
 * context, saved to both stores, then restored (every check the load makes:
 * checksums, and for Redis each chunk's sum) into a fresh sequence, --reps
 * times each: median milliseconds and GB/s of the image.
 *
 *   store_restore REDIS_URL DIR [contexts, default 4096,16384] [reps, default 5] [fk fv]
 * prints one line per (context, backend). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "store/store.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Fills n positions of kv with random vectors (the values do not matter to
 * the store; their bytes do). */
static int fill(ak_kv *kv, const ak_cache_spec *s, int n, ak_error *err) {
    ak_rng rng;
    ak_rng_seed(&rng, 1);
    int nk = s->n_head_kv * s->head_dim_k, nv = s->n_head_kv * s->head_dim_v;
    float *k = malloc(sizeof(float) * (size_t)nk), *v = malloc(sizeof(float) * (size_t)nv);
    int rc = k && v ? ak_kv_prepare(kv, 0, n, err) : -1;
    for (int i = 0; i < nk && k; i++) k[i] = ak_rng_normal(&rng);
    for (int i = 0; i < nv && v; i++) v[i] = ak_rng_normal(&rng);
    for (int p = 0; rc == 0 && p < n; p++)
        for (int l = 0; l < s->n_layer && rc == 0; l++) {
            k[p % nk] += 0.5f;   /* every position differs a little */
            rc = ak_kv_write(kv, l, p, k, v, err);
        }
    free(k);
    free(v);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: store_restore REDIS_URL DIR [contexts] [reps] [fk fv]\n");
        return 2;
    }
    const char *url = argv[1], *dir = argv[2], *ctxs = argc > 3 ? argv[3] : "4096,16384";
    int reps = argc > 4 ? atoi(argv[4]) : 5;
    ak_kv_format fk = AK_KV_F16, fv = AK_KV_F16;
    if (argc > 6 && (ak_kv_format_parse(argv[5], &fk) || ak_kv_format_parse(argv[6], &fv))) {
        fprintf(stderr, "store_restore: unknown KV format\n");
        return 2;
    }
    if (reps < 1 || reps > 100) reps = 5;
    ak_error err = {{0}};
    ak_store_where wr = {.url = url};
    ak_store *st[2] = {ak_store_open(dir, NULL, &err), NULL};
    if (st[0]) st[1] = ak_store_open_at(&wr, NULL, &err);
    if (!st[0] || !st[1]) {
        fprintf(stderr, "store_restore: %s\n", err.msg);
        return 1;
    }
    const char *names[2] = {"directory", "redis"};
    printf("context backend   image_MB  save_ms  restore_ms(median of %d)  GB/s\n", reps);
    char list[256];
    snprintf(list, sizeof list, "%s", ctxs);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int n = atoi(tok);
        ak_cache_spec s = {.n_layer = 16, .n_head_kv = 8, .head_dim_k = 64, .head_dim_v = 64, .n_ctx = n + 64};
        ak_block_pool *pool = ak_block_pool_new(&s, 32, 0, &err);
        ak_kv *kv = pool ? ak_kv_new(pool, fk, fv, n, &err) : NULL;
        int32_t *tokens = malloc(sizeof(int32_t) * (size_t)n);
        if (!kv || !tokens || fill(kv, &s, n, &err) != 0) {
            fprintf(stderr, "store_restore: %s\n", err.msg);
            return 1;
        }
        for (int i = 0; i < n; i++) tokens[i] = (i * 7919) % 32000;
        for (int b = 0; b < 2; b++) {
            double t0 = ak_now();
            if (ak_store_save(st[b], "bench", kv, tokens, n, "bench-llama-1b", NULL, &err) != 0) {
                fprintf(stderr, "store_restore: save: %s\n", err.msg);
                return 1;
            }
            double save_ms = (ak_now() - t0) * 1e3;
            ak_store_entry e;
            ak_store_lookup(st[b], "bench", &e);
            double ms[100];
            for (int r = 0; r < reps; r++) {
                ak_kv *dst = ak_kv_new(pool, fk, fv, n, &err);
                ak_store_load_info info;
                double t1 = ak_now();
                ak_store_status ls = ak_store_load(st[b], "bench", "bench-llama-1b", 0, dst, &info, &err);
                ms[r] = (ak_now() - t1) * 1e3;
                if (ls != AK_STORE_HIT || info.n_tokens != n) {
                    fprintf(stderr, "store_restore: load: %s: %s\n", ak_store_status_name(ls), err.msg);
                    return 1;
                }
                free(info.tokens);
                ak_kv_free(dst);
            }
            qsort(ms, (size_t)reps, sizeof *ms, cmp_d);
            double med = ms[reps / 2];
            printf("%7d %-9s %8.1f %8.1f %10.1f %25.2f\n", n, names[b], e.bytes / 1e6, save_ms, med,
                   e.bytes / 1e6 / med);
            fflush(stdout);
            ak_store_remove(st[b], "bench", &err);
        }
        ak_kv_free(kv);
        ak_block_pool_free(pool);
        free(tokens);
    }
    ak_store_close(st[0]);
    ak_store_close(st[1]);
    return 0;
}
