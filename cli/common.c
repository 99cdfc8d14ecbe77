/* common.c - see common.h */
#include "common.h"

#include "engine/calib.h"
#include "lib/lib.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <unistd.h>

void progress_init(progress *p, const char *label) {
    p->label = label;
    p->enabled = isatty(2);
    p->last_pct = -1;
    p->t0 = ak_now();
}

void progress_update(void *ud, double frac) {
    progress *p = ud;
    if (!p || !p->enabled) return;
    int pct = (int)(frac * 100);
    if (pct == p->last_pct) return;
    /* don't flash a bar for things that finish at once */
    if (ak_now() - p->t0 < 0.3 && pct < 100) return;
    p->last_pct = pct;
    int w = 30, fill = (int)(frac * w);
    char bar[64];
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[w] = 0;
    fprintf(stderr, "\r%s [%s] %3d%%", p->label, bar, pct);
    fflush(stderr);
}

void progress_done(progress *p) {
    if (p->enabled && p->last_pct >= 0) fprintf(stderr, "\r\033[K");
    p->last_pct = -1;
}

int load_model(loaded_model *lm, const char *cmd, const char *path) {
    memset(lm, 0, sizeof *lm);
    agentkv_error err = {0};
    progress pg;
    progress_init(&pg, "loading model");
    double t0 = ak_now();
    agentkv_status st =
        agentkv_model_load(path, &(agentkv_model_options){.progress = progress_update, .progress_ud = &pg}, &lm->handle, &err);
    progress_done(&pg);
    if (st != AGENTKV_OK) {
        fprintf(stderr, "agentkv %s: %s\n", cmd, agentkv_error_message(&err));
        return -1;
    }
    lm->model = ak_lib_model(lm->handle);
    lm->tok = ak_lib_tokenizer(lm->handle);
    lm->load_s = ak_now() - t0;
    return 0;
}

void unload_model(loaded_model *lm) {
    agentkv_model_free(lm->handle);
    lm->handle = NULL;
    lm->tok = NULL;
    lm->model = NULL;
}

char *read_prompt_file(const char *cmd, const char *path, size_t *len) {
    ak_error err = {{0}};
    char *s = ak_read_file(path, len, &err);
    if (!s) fprintf(stderr, "agentkv %s: %s\n", cmd, err.msg);
    return s;
}

void cache_opts_init(cache_opts *o) {
    o->fk = AK_KV_F16;
    o->fv = AK_KV_F16;
    o->budget = 0;
    o->block_tokens = 0;
    o->center = AK_CENTER_K;
}

int cache_opts_parse(cache_opts *o, ak_args *a, const char *flag) {
    int is_k = !strcmp(flag, "-ctk") || !strcmp(flag, "--cache-type-k");
    int is_v = !strcmp(flag, "-ctv") || !strcmp(flag, "--cache-type-v");
    if (is_k || is_v) {
        const char *v = args_value(a, flag);
        if (!v) return 1;
        if (ak_kv_format_parse(v, is_k ? &o->fk : &o->fv) < 0)
            args_error(a, "%s: unknown cache format '%s' (one of %s)", flag, v, ak_kv_format_names());
        return 1;
    }
    if (!strcmp(flag, "--kv-budget")) {
        const char *v = args_value(a, flag);
        if (v && (ak_parse_bytes(v, &o->budget) < 0 || o->budget == 0))
            args_error(a, "--kv-budget: '%s' is not a positive byte size (e.g. 512M, 10.2G)", v);
        return 1;
    }
    if (!strcmp(flag, "--no-center")) {
        o->center = 0;
        return 1;
    }
    if (!strcmp(flag, "--center")) {
        const char *w = args_value(a, flag);
        if (w && !strcmp(w, "k")) o->center = AK_CENTER_K;
        else if (w && !strcmp(w, "v")) o->center = AK_CENTER_V;
        else if (w && !strcmp(w, "kv")) o->center = AK_CENTER_K | AK_CENTER_V;
        else if (w && !strcmp(w, "none")) o->center = 0;
        else if (w) args_error(a, "--center: '%s' is not k, v, kv or none", w);
        return 1;
    }
    if (!strcmp(flag, "--kv-block")) {
        o->block_tokens = (int)args_int(a, flag, 1, AK_KV_MAX_BLOCK_TOKENS);
        return 1;
    }
    return 0;
}

void store_opts_init(store_opts *o) {
    o->dir = "./agentkv-memory";
    o->key_file = NULL;
    o->store_url = NULL;
    o->store_password_file = NULL;
    o->store_lease_ms = 0;
    o->dir_given = 0;
    o->disk_budget = 0;
    o->save = AK_SAVE_EVERY_TURN;
}

int store_opts_parse(store_opts *o, ak_args *a, const char *flag) {
    if (!strcmp(flag, "--memory-dir")) {
        const char *v = args_value(a, flag);
        if (v) o->dir = v;
        o->dir_given = 1;
    } else if (!strcmp(flag, "--store")) {
        const char *v = args_value(a, flag);
        if (v && strncmp(v, "redis://", 8)) args_error(a, "--store: '%s' is not redis://host:port[/db]", v);
        o->store_url = v;
    } else if (!strcmp(flag, "--store-password-file")) {
        o->store_password_file = args_value(a, flag);
    } else if (!strcmp(flag, "--store-lease-ms")) {
        o->store_lease_ms = (int)args_int(a, flag, 100, 3600000);
    } else if (!strcmp(flag, "--memory-key-file")) {
        o->key_file = args_value(a, flag);
    } else if (!strcmp(flag, "--save-policy")) {
        const char *v = args_value(a, flag);
        if (v && ak_save_policy_parse(v, &o->save) < 0)
            args_error(a, "--save-policy: '%s' is not turn, evict or shutdown", v);
    } else if (!strcmp(flag, "--no-prefix-sharing")) {
        o->no_prefix_sharing = 1;
    } else if (!strcmp(flag, "--disk-budget")) {
        const char *v = args_value(a, flag);
        if (v && (ak_parse_bytes(v, &o->disk_budget) < 0 || !o->disk_budget))
            args_error(a, "--disk-budget: '%s' is not a positive byte size", v);
    } else {
        return 0;
    }
    return 1;
}

ak_store *store_opts_open(const store_opts *o, ak_error *err) {
    uint8_t key[AK_STORE_KEY_BYTES];
    if (o->key_file && ak_store_read_key(o->key_file, key, err) < 0) return NULL;
    ak_store_where w = {.url = o->store_url ? o->store_url : o->dir, .password_file = o->store_password_file,
                        .local_dir = o->dir_given ? o->dir : NULL, .lease_ms = o->store_lease_ms};
    ak_store *s = ak_store_open_at(&w, o->key_file ? key : NULL, err);
    sodium_memzero(key, sizeof key);
    return s;
}

int cache_center(const cache_opts *o, ak_ctx *ctx, const ak_tokenizer *tk, ak_block_pool *pool, const char *cmd) {
    int k = (o->center & AK_CENTER_K) && ak_kv_format_centers(o->fk);
    int v = (o->center & AK_CENTER_V) && ak_kv_format_centers(o->fv);
    if (!k && !v) return 0;
    fprintf(stderr, "agentkv %s: calibrating the model's %s means for centering (--no-center skips)...\n", cmd,
            k && v ? "key and value" : k ? "key" : "value");
    ak_error err = {{0}};
    double t0 = ak_now();
    if (ak_calib_install(ctx, tk, pool, o->fk, o->fv, o->center, &err) < 0) {
        fprintf(stderr, "agentkv %s: %s\n", cmd, err.msg);
        return -1;
    }
    fprintf(stderr, "agentkv %s: centering %s (%.1f s)\n", cmd, ak_block_pool_center_id(pool, k ? 0 : 1, k ? o->fk : o->fv),
            ak_now() - t0);
    return 0;
}

int cache_open(const cache_opts *o, const ak_model *m, int n_ctx, const char *cmd, ak_block_pool **pool, ak_kv **kv) {
    ak_error err = {{0}};
    *kv = NULL;
    *pool = ak_block_pool_new(&m->spec, o->block_tokens, o->budget, &err);
    if (*pool) *kv = ak_kv_new(*pool, o->fk, o->fv, n_ctx, &err);
    if (!*kv) {
        fprintf(stderr, "agentkv %s: %s\n", cmd, err.msg);
        ak_block_pool_free(*pool);
        *pool = NULL;
        return -1;
    }
    return 0;
}

void cache_close(ak_block_pool *pool, ak_kv *kv) {
    ak_kv_free(kv);
    ak_block_pool_free(pool);
}

int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double bench_cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
