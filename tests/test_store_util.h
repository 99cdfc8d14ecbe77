/* test_store_util.h - helpers shared by the store tests (test_store*.c):
 * synthetic caches, byte-exact comparison of sequences, the test's store
 * directories and files. */
#ifndef AK_TEST_STORE_UTIL_H
#define AK_TEST_STORE_UTIL_H

#include <dirent.h>
#include <string.h>
#include <unistd.h>

#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "store/store.h"
#include "test.h"

#define FP "0123456789abcdef"
#define VOCAB 1000

/* A pool + sequence of spec s filled with n random positions (seed). */
typedef struct {
    ak_block_pool *pool;
    ak_kv *kv;
    int32_t *tokens;
    int n;
} cache;

static inline ak_cache_spec small_spec(void) {
    return (ak_cache_spec){.n_layer = 3, .n_head_kv = 2, .head_dim_k = 64, .head_dim_v = 32, .n_ctx = 512};
}

static inline int cache_make(cache *c, const ak_cache_spec *s, int block_tokens, ak_kv_format fk, ak_kv_format fv, int cap,
                      int n, uint64_t seed) {
    ak_error err = {{0}};
    memset(c, 0, sizeof *c);
    c->pool = ak_block_pool_new(s, block_tokens, 0, &err);
    c->kv = c->pool ? ak_kv_new(c->pool, fk, fv, cap, &err) : NULL;
    if (!c->kv) { fprintf(stderr, "cache_make: %s\n", err.msg); return -1; }
    c->n = n;
    c->tokens = malloc(sizeof(int32_t) * (n + 1));
    ak_rng rng;
    ak_rng_seed(&rng, seed);
    for (int i = 0; i < n; i++) c->tokens[i] = (int32_t)(ak_rng_u32(&rng) % VOCAB);
    if (n == 0) return 0;
    int nk = s->n_head_kv * s->head_dim_k, nv = s->n_head_kv * s->head_dim_v, rc;
    float *k = malloc(sizeof(float) * nk), *v = malloc(sizeof(float) * nv);
    rc = ak_kv_prepare(c->kv, 0, n, &err);
    for (int p = 0; rc == 0 && p < n; p++)
        for (int l = 0; l < s->n_layer && rc == 0; l++) {
            for (int i = 0; i < nk; i++) k[i] = ak_rng_normal(&rng) * (i % 8 == 1 ? 3.0f : 1.0f);
            for (int i = 0; i < nv; i++) v[i] = ak_rng_normal(&rng);
            rc = ak_kv_write(c->kv, l, p, k, v, &err);
        }
    free(k);
    free(v);
    if (rc) fprintf(stderr, "cache_make: %s\n", err.msg);
    return rc;
}

static inline void cache_free(cache *c) {
    ak_kv_free(c->kv);
    ak_block_pool_free(c->pool);
    free(c->tokens);
    memset(c, 0, sizeof *c);
}

/* A fresh empty sequence shaped like c (other block size allowed). */
static inline int cache_empty_like(cache *d, const cache *c, int block_tokens) {
    return cache_make(d, ak_block_pool_spec(c->pool), block_tokens, ak_kv_format_k(c->kv), ak_kv_format_v(c->kv),
                      ak_kv_capacity(c->kv), 0, 1);
}

/* 1 if a and b hold the same n positions with byte-equal vectors. */
static inline int kv_equal(const ak_kv *a, const ak_kv *b) {
    if (ak_kv_length(a) != ak_kv_length(b) || ak_kv_format_k(a) != ak_kv_format_k(b) ||
        ak_kv_format_v(a) != ak_kv_format_v(b))
        return 0;
    const ak_cache_spec *s = ak_block_pool_spec(ak_kv_pool(a));
    for (int l = 0; l < s->n_layer; l++)
        for (int v = 0; v < 2; v++) {
            ak_kv_format f = v ? ak_kv_format_v(a) : ak_kv_format_k(a);
            int d = v ? s->head_dim_v : s->head_dim_k;
            size_t bytes[2] = {ak_kv_format_code_bytes(f, d), ak_kv_format_meta_bytes(f, d)};
            for (int c = 0; c < 2; c++)
                for (int h = 0; bytes[c] && h < s->n_head_kv; h++)
                    for (int p = 0; p < ak_kv_length(a); p++) {
                        const uint8_t *x = ak_kv_stored(a, l, v, c, h, p), *y = ak_kv_stored(b, l, v, c, h, p);
                        if (!x || !y || memcmp(x, y, bytes[c])) return 0;
                    }
        }
    return 1;
}

static inline const char *dir_for(const char *name) {
    static char buf[4][512];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, 512, "%s/store-%s", test_tmp_dir(), name);
    return b;
}

static inline const char *file_of(const char *dir, const char *id) {
    static char buf[4][600];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, 600, "%s/%s.safetensors", dir, id);
    return b;
}

static inline int exists(const char *path) { return access(path, F_OK) == 0; }

static inline int write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int rc = fwrite(p, 1, n, f) == n ? 0 : -1;
    return fclose(f) == 0 ? rc : -1;
}

/* Counts (and deletes, to keep the directory small) the files in
 * dir/quarantine named "<id>.safetensors.*". */
static inline int quarantined(const char *dir, const char *id) {
    char qd[700], path[1400];
    snprintf(qd, sizeof qd, "%s/quarantine", dir);
    DIR *d = opendir(qd);
    if (!d) return 0;
    struct dirent *e;
    int n = 0;
    size_t il = strlen(id);
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, id, il) && !strncmp(e->d_name + il, ".safetensors.", 13)) {
            snprintf(path, sizeof path, "%s/%s", qd, e->d_name);
            unlink(path);
            n++;
        }
    closedir(d);
    return n;
}

#endif
