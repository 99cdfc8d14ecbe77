/* cmd_bench_ttft.c - agentkv bench ttft: time to first token of an agent
 * whose prompt extends its cached context by one token, served cold (full
 * re-prefill), warm (restored from its file, after dropping the file from the
 * page cache, and again from the page cache), with --store warm from Redis
 * (the same image, restored with no local copy), and hot (blocks in RAM);
 * and the restore throughput next to a plain sequential read of the file. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agents/agent.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv bench ttft -m MODEL [--contexts 1024,4096,16384] [-ctk F -ctv F] [-t T]\n"
    "                          [--memory-dir DIR] [--store redis://host:port[/db]\n"
    "                          [--store-password-file F]] [--restore-only] [--reps N] [--json]\n"
    "  TTFT of a turn that extends an agent's context by one token: cold (full prefill),\n"
    "  warm (restore from disk; page cache dropped first, then again from the page cache),\n"
    "  hot (in RAM); restore GB/s next to a plain read of the same file.\n"
    "  --store: the cold turn's cache is also put in this Redis and a fresh process-like\n"
    "  state restores it from there (no local copy): warm TTFT and restore GB/s from Redis\n"
    "  (the password: the first line of F, mode 600).\n"
    "  --restore-only: no prefill; a cache of each context filled with random vectors is\n"
    "  saved, then restored (verified) with the page cache dropped (median of --reps, default 5,\n"
    "  each next to a plain read of the same file) and from the page cache (best of --reps)\n";

/* Fraction of the file's pages in the page cache (-1 if unknown). */
static double resident(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    struct stat st;
    double r = -1;
    if (fstat(fd, &st) == 0 && st.st_size > 0) {
        void *m = mmap(NULL, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED) {
            size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = (st.st_size + pg - 1) / pg, in = 0;
            unsigned char *vec = malloc(n);
            if (vec && mincore(m, st.st_size, vec) == 0) {
                for (size_t i = 0; i < n; i++) in += vec[i] & 1;
                r = (double)in / n;
            }
            free(vec);
            munmap(m, st.st_size);
        }
    }
    close(fd);
    return r;
}

static int drop_cache(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    fdatasync(fd);
    int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return rc;
}

/* Fills positions [0, n) of kv with random keys and values (Gaussian, a few
 * large channels, like real keys). Returns 0, or -1 with err set. */
static int fill_random(ak_kv *kv, int n, ak_error *err) {
    const ak_cache_spec *s = ak_block_pool_spec(ak_kv_pool(kv));
    size_t nk = (size_t)s->n_head_kv * s->head_dim_k, nv = (size_t)s->n_head_kv * s->head_dim_v;
    float *k = malloc(sizeof(float) * nk), *v = malloc(sizeof(float) * nv);
    ak_rng r;
    ak_rng_seed(&r, 11);
    int rc = k && v ? ak_kv_prepare(kv, 0, n, err) : ak_fail(err, "out of memory");
    for (int p = 0; rc == 0 && p < n; p++)
        for (int l = 0; l < s->n_layer && rc == 0; l++) {
            for (size_t i = 0; i < nk; i++) k[i] = ak_rng_normal(&r) * (i % 16 == 3 ? 8.0f : 1.0f);
            for (size_t i = 0; i < nv; i++) v[i] = ak_rng_normal(&r);
            rc = ak_kv_write(kv, l, p, k, v, err);
        }
    free(k);
    free(v);
    return rc;
}

static size_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (size_t)st.st_size : 0;
}

/* Seconds to read the whole file sequentially with read(2). */
static double plain_read(const char *path, size_t *bytes) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    size_t cap = 8 << 20, n = 0;
    char *buf = malloc(cap);
    double t0 = ak_now();
    ssize_t r;
    while (buf && (r = read(fd, buf, cap)) > 0) n += (size_t)r;
    double dt = ak_now() - t0;
    free(buf);
    close(fd);
    *bytes = n;
    return dt;
}

/* Seconds to read the whole file with read(2) into `dst` (room for it, its
 * pages already touched): what a restore must at least do, one copy from
 * the page cache into memory of the cache's size. */
static double read_into(const char *path, uint8_t *dst, size_t cap) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    size_t n = 0;
    double t0 = ak_now();
    ssize_t r;
    while (n < cap && (r = read(fd, dst + n, cap - n)) > 0) n += (size_t)r;
    double dt = ak_now() - t0;
    close(fd);
    return dt;
}

/* CPU seconds this process has used, all threads: on a machine shared
 * with other work, wall time measures the neighbours as much as the code. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* --restore-only: for each context, a random cache saved to DIR and restored
 * (ak_store_load: every check and checksum) into a sequence whose pool was
 * prefaulted, with the file dropped from the page cache and from the page
 * cache (best of reps), next to plain read(2)s of the same file under the
 * same conditions; plus the first restore into a fresh pool (first touch of
 * its memory included). Returns 0, or 1 with a message printed. */
static int restore_only(const ak_model *m, const cache_opts *co, ak_store *store, const int *ctxs, int n_ctxs, int reps,
                        int json) {
    ak_error err = {{0}};
    if (json) printf("{\"model\": \"%s\", \"cache_type_k\": \"%s\", \"cache_type_v\": \"%s\", \"restore\": [", m->gguf.path,
                     ak_kv_format_get(co->fk)->name, ak_kv_format_get(co->fv)->name);
    else {
        printf("restore only: K %s / V %s; restore = ak_store_load with every checksum (XXH3), into a prefaulted pool;\n"
               "read = read(2) of the same file into an 8 MB buffer. dropped = file evicted from the page cache first\n"
               "(median of --reps; %% = median of adjacent restore/read pairs' speed ratios).\n",
               ak_kv_format_get(co->fk)->name, ak_kv_format_get(co->fv)->name);
        printf("%8s %9s | %10s %9s %9s %5s | %10s %9s %9s %5s | %11s %s\n", "tokens", "file_MB", "drop_ms", "rest_GB/s",
               "read_GB/s", "%", "cached_ms", "rest_GB/s", "read_GB/s", "%", "fresh_ms", "dropped?");
    }
    for (int ci = 0; ci < n_ctxs; ci++) {
        int L = ctxs[ci];
        char id[32], path[1024];
        snprintf(id, sizeof id, "restore-%d", L);
        snprintf(path, sizeof path, "%s/%s.safetensors", ak_store_dir(store), id);
        ak_block_pool *pool = ak_block_pool_new(&m->spec, co->block_tokens, 0, &err);
        ak_kv *src = pool ? ak_kv_new(pool, co->fk, co->fv, L, &err) : NULL;
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)L);
        if (!src || !toks || fill_random(src, L, &err) != 0) goto fail;
        for (int i = 0; i < L; i++) toks[i] = i % m->cfg.vocab;
        if (ak_store_save(store, id, src, toks, L, m->fingerprint, NULL, &err) != 0) goto fail;
        size_t cache_bytes = ak_kv_bytes(src);
        ak_kv_free(src);
        src = NULL;
        ak_block_pool_free(pool);
        /* the first restore into a fresh pool: its memory is touched for the first time */
        pool = ak_block_pool_new(&m->spec, co->block_tokens, 0, &err);
        ak_kv *kv = pool ? ak_kv_new(pool, co->fk, co->fv, L, &err) : NULL;
        if (!kv) goto fail;
        ak_store_load_info info;
        double t0 = ak_now();
        if (ak_store_load(store, id, m->fingerprint, m->cfg.vocab, kv, &info, &err) != AK_STORE_HIT) goto fail_kv;
        double fresh_ms = (ak_now() - t0) * 1e3;
        free(info.tokens);
        ak_kv_truncate(kv, 0);
        ak_block_pool_prefault(pool, co->fk, co->fv, 2 * cache_bytes);   /* restore allocates before it frees */
        double rest_drop = 0, rd_drop = 0, resid = -1;
        uint64_t bytes = 0;
        size_t fb = 0;
        double *rw = malloc(sizeof(double) * 3 * (size_t)reps);
        size_t fsz = file_size(path);
        uint8_t *whole = malloc(fsz + 1);
        if (!rw || !whole) { free(rw); free(whole); goto fail_kv; }
        memset(whole, 0, fsz + 1);   /* touched, like the prefaulted pool */
        /* dropped: reps pairs of (restore, plain read), each after dropping
         * the file; a virtual disk's speed swings by 2x from one second to
         * the next, so the pair's ratio is what is compared (the median of
         * them), beside each side's median time */
        double *dr = malloc(sizeof(double) * 3 * (size_t)reps);
        if (!dr) { free(rw); free(whole); goto fail_kv; }
        for (int k = 0; k < reps; k++) {
            drop_cache(path);
            if (k == 0) resid = resident(path);
            t0 = ak_now();
            if (ak_store_load(store, id, m->fingerprint, m->cfg.vocab, kv, &info, &err) != AK_STORE_HIT) { free(dr); free(rw); free(whole); goto fail_kv; }
            dr[k] = ak_now() - t0;
            bytes = info.bytes_read;
            free(info.tokens);
            ak_kv_truncate(kv, 0);
            drop_cache(path);
            dr[reps + k] = plain_read(path, &fb);
            dr[2 * reps + k] = (double)bytes / dr[k] / ((double)fb / dr[reps + k]);   /* restore / read speed */
        }
        for (int z = 0; z < 3; z++) qsort(dr + z * reps, (size_t)reps, sizeof *dr, bench_cmp_double);
        rest_drop = dr[reps / 2];
        rd_drop = dr[reps + reps / 2];
        double drop_ratio = dr[2 * reps + reps / 2];
        free(dr);
        ak_store_load_info best = {0};
        double cpu_rest = 1e30, cpu_read = 1e30;   /* least CPU time of each */
        for (int k = 0; k < reps; k++) {   /* from the page cache */
            double c0 = cpu_now();
            t0 = ak_now();
            if (ak_store_load(store, id, m->fingerprint, m->cfg.vocab, kv, &info, &err) != AK_STORE_HIT) { free(rw); free(whole); goto fail_kv; }
            rw[k] = ak_now() - t0;
            double c1 = cpu_now();
            if (c1 - c0 < cpu_rest) cpu_rest = c1 - c0;
            if (k == 0 || info.total_ms < best.total_ms) best = info;
            free(info.tokens);
            ak_kv_truncate(kv, 0);
            rw[reps + k] = plain_read(path, &fb);
            c0 = cpu_now();
            rw[2 * reps + k] = read_into(path, whole, fsz);
            c1 = cpu_now();
            if (c1 - c0 < cpu_read) cpu_read = c1 - c0;
        }
        for (int z = 0; z < 3; z++) qsort(rw + z * reps, (size_t)reps, sizeof *rw, bench_cmp_double);
        double rest_pc = rw[0], rd_pc = rw[reps], rd_whole = rw[2 * reps];
        free(rw);
        free(whole);
        double g[4] = {bytes / (rest_drop * 1e9), fb / (rd_drop * 1e9), bytes / (rest_pc * 1e9), fb / (rd_pc * 1e9)};
        if (json)
            printf("%s{\"tokens\": %d, \"file_bytes\": %zu, \"restore_dropped_ms\": %.3f, \"restore_dropped_gb_s\": %.3f, "
                   "\"read_dropped_gb_s\": %.3f, \"restore_page_cache_ms\": %.3f, \"restore_page_cache_gb_s\": %.3f, "
                   "\"read_page_cache_gb_s\": %.3f, \"restore_fresh_pool_ms\": %.3f, \"resident_after_drop\": %.3f, "
                   "\"restore_vs_read_dropped\": %.3f}",
                   ci ? ", " : "", L, fb, rest_drop * 1e3, g[0], g[1], rest_pc * 1e3, g[2], g[3], fresh_ms, resid,
                   drop_ratio);
        else
            printf("%8d %9.2f | %10.2f %9.2f %9.2f %4.0f%% | %10.3f %9.2f %9.2f %4.0f%% | %11.2f %s\n", L, fb / 1e6,
                   rest_drop * 1e3, g[0], g[1], 100 * drop_ratio, rest_pc * 1e3, g[2], g[3], 100 * g[2] / g[3], fresh_ms,
                   resid < 0 ? "unknown" : resid < 0.05 ? "yes" : "no (still cached)");
        if (!json) {
            printf("%8s best cached restore: %.3f ms = header and checks %.3f + read and hash %.3f + blocks %.3f\n", "",
                   best.total_ms, best.verify_ms, best.read_ms, best.restore_ms);
            printf("%8s cached read(2) of the whole file into one touched buffer of its size: %.3f ms, %.2f GB/s "
                   "(restore at %.0f%% of it)\n", "", rd_whole * 1e3, fsz / (rd_whole * 1e9), 100 * rd_whole / rest_pc);
            printf("%8s CPU time (all threads, least of %d): cached restore %.3f ms, read(2) of the whole file "
                   "%.3f ms (%.2fx)\n", "", reps, cpu_rest * 1e3, cpu_read * 1e3, cpu_rest / cpu_read);
            /* llama.cpp's manual slot restore, from the page cache, without
             * verification, 2000 tokens of this shape (issue 4): 1.5 ms for
             * its 18.4 MB q4_0 cache, 10.5 ms for 65.6 MB f16. Scaled to
             * this file's bytes at that rate (q4 stores 20 bytes per 32
             * values where q4_0 stores 18). */
            double peer_mb = 0, peer_ms = 0;
            if (co->fk == AK_KV_Q4 && co->fv == AK_KV_Q4) peer_mb = 18.4, peer_ms = 1.5;
            if (co->fk == AK_KV_F16 && co->fv == AK_KV_F16) peer_mb = 65.6, peer_ms = 10.5;
            if (peer_mb > 0) {
                double same = fsz / 1e6 / peer_mb * peer_ms;
                printf("%8s llama.cpp slot restore at its %s rate (%.1f MB in %.1f ms, unverified): %.3f ms for these "
                       "%.2f MB; cached restore here %.3f ms (%.0f%% of its time)\n", "",
                       co->fk == AK_KV_Q4 ? "q4_0" : "f16", peer_mb, peer_ms, same, fsz / 1e6, rest_pc * 1e3,
                       100 * rest_pc * 1e3 / same);
            }
        }
        fflush(stdout);
        ak_kv_free(kv);
        ak_block_pool_free(pool);
        free(toks);
        ak_store_remove(store, id, NULL);
        continue;
    fail_kv:
        ak_kv_free(kv);
    fail:
        ak_kv_free(src);
        ak_block_pool_free(pool);
        free(toks);
        fprintf(stderr, "agentkv bench ttft: %s\n", err.msg);
        return 1;
    }
    if (json) printf("]}\n");
    return 0;
}

/* What the command was asked. */
typedef struct {
    const char *model_path, *dir, *store_url, *password_file;
    int n_threads, json, restore_only, reps;
    cache_opts co;
    int ctxs[16], n_ctxs, max_ctx;
} ttft_opts;

/* What the measurements run on: the model, the directory store, the Redis
 * store (--store; NULL without), one context for every turn, the prompt. */
typedef struct {
    loaded_model lm;
    ak_store *store, *redis;
    ak_ctx *ctx;
    int32_t *toks;          /* max_ctx + 1 random token ids */
    float *logits;
    char tmpl[32];          /* the temporary directory when no --memory-dir was given */
    int own_dir;            /* 1: dir is that temporary directory (its files removed at the end) */
} ttft_env;

/* One context's figures. */
typedef struct {
    int L;
    double ms[4];               /* TTFT: cold, warm (page cache dropped), warm (page cache), hot */
    double rest_ms[3];          /* restore time of the warm turns [1], [2] */
    uint64_t rest_bytes[3];
    double resident_after_drop, save_engine_ms, save_total_ms;
    double rd_drop_s, rd_pc_s;  /* plain reads of the file: dropped, from the page cache */
    size_t rd_bytes;
    int redis;                  /* 1: the Redis warm turn was measured */
    double redis_ms, redis_rest_ms;
    uint64_t redis_bytes;
    int redis_tokens;           /* positions the Redis restore supplied */
} ttft_row;

/* Parses argv into o. Returns -1 when the command should run, else its exit
 * code: 0 after --help, AK_EXIT_USAGE after a usage error (printed). */
static int ttft_parse(int argc, char **argv, ttft_opts *o) {
    ak_args a;
    args_init(&a, "bench ttft", argc, argv);
    const char *contexts = "1024,4096,16384";
    memset(o, 0, sizeof *o);
    o->reps = 5;
    cache_opts_init(&o->co);
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); fputs(CACHE_OPTS_HELP, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) o->model_path = args_value(&a, f);
        else if (!strcmp(f, "--contexts")) contexts = args_value(&a, f);
        else if (!strcmp(f, "--memory-dir")) o->dir = args_value(&a, f);
        else if (!strcmp(f, "--store")) {
            o->store_url = args_value(&a, f);
            /* the same check as serve's --store; the rest of the URL is the store's to judge */
            if (o->store_url && strncmp(o->store_url, "redis://", 8))
                args_error(&a, "--store: '%s' is not redis://host:port[/db]", o->store_url);
        } else if (!strcmp(f, "--store-password-file")) o->password_file = args_value(&a, f);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) o->n_threads = (int)args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--json")) o->json = 1;
        else if (!strcmp(f, "--restore-only")) o->restore_only = 1;
        else if (!strcmp(f, "--reps")) o->reps = (int)args_int(&a, f, 1, 1000);
        else if (!cache_opts_parse(&o->co, &a, f)) args_unknown(&a, f);
    }
    if (!a.failed && !o->model_path) args_error(&a, "-m MODEL is required");
    if (!a.failed && o->password_file && !o->store_url) args_error(&a, "--store-password-file needs --store");
    if (!a.failed && o->store_url && o->restore_only)
        args_error(&a, "--store does not go with --restore-only (bench/store_restore.c times restores from Redis)");
    o->n_ctxs = args_int_list(&a, "--contexts", contexts, 2, 1 << 20, o->ctxs, 16);
    if (a.failed) return AK_EXIT_USAGE;
    for (int i = 0; i < o->n_ctxs; i++) o->max_ctx = o->ctxs[i] > o->max_ctx ? o->ctxs[i] : o->max_ctx;
    return -1;
}

/* Frees what setup made (a partly set up env too). */
static void ttft_teardown(ttft_env *e) {
    free(e->toks);
    free(e->logits);
    ak_ctx_free(e->ctx);
    ak_store_close(e->store);
    ak_store_close(e->redis);
    if (e->own_dir) rmdir(e->tmpl);   /* empty unless a run failed midway: then kept for a look */
    unload_model(&e->lm);
}

/* Opens the Redis store (first: an unreachable one fails before the model
 * loads), loads the model, opens the directory store (o->dir, or a fresh
 * temporary directory) and makes the context and the prompt. Returns 0, or
 * -1 with the reason printed (everything made freed by ttft_teardown). */
static int ttft_setup(ttft_opts *o, ttft_env *e) {
    ak_error err = {{0}};
    memset(e, 0, sizeof *e);
    if (o->store_url) {
        /* no local directory: every restore reads Redis (no read-through copy) */
        ak_store_where w = {.url = o->store_url, .password_file = o->password_file};
        if (!(e->redis = ak_store_open_at(&w, NULL, &err))) goto fail;
    }
    if (load_model(&e->lm, "bench ttft", o->model_path) < 0) return -1;
    const ak_model *m = e->lm.model;
    if (o->max_ctx + 1 > m->spec.n_ctx) {
        ak_failc(&err, AK_ERR_INVALID, "context %d exceeds the model's %d (synth a model with --ctx)", o->max_ctx + 1,
                 m->spec.n_ctx);
        goto fail;
    }
    if (!o->dir) {
        snprintf(e->tmpl, sizeof e->tmpl, "/tmp/agentkv-ttft-XXXXXX");
        if (!(o->dir = mkdtemp(e->tmpl))) { perror("agentkv bench ttft: mkdtemp"); return -1; }
        e->own_dir = 1;
    }
    if (!(e->store = ak_store_open(o->dir, NULL, &err))) goto fail;
    if (o->restore_only) return 0;
    if (!(e->ctx = ak_ctx_new(m, 512, o->n_threads, &err))) goto fail;
    e->toks = malloc(sizeof(int32_t) * (size_t)(o->max_ctx + 1));
    e->logits = malloc(sizeof(float) * (size_t)m->cfg.vocab);
    if (!e->toks || !e->logits) { ak_failc(&err, AK_ERR_NOMEM, "out of memory"); goto fail; }
    ak_rng rng;
    ak_rng_seed(&rng, 3);
    for (int i = 0; i <= o->max_ctx; i++) e->toks[i] = (int32_t)(ak_rng_u32(&rng) % m->cfg.vocab);
    return 0;
fail:
    fprintf(stderr, "agentkv bench ttft: %s\n", err.msg);
    return -1;
}

/* Frees *ag and *pool and makes fresh ones on store, as a process that just
 * started has them: prefault > 0 readies that many bytes of the pool's
 * memory (a server does at startup) so a restore does not pay the first
 * touch of its pages. Returns 0, or -1 with err set (*ag NULL). */
static int fresh_agents(const ttft_opts *o, const ttft_env *e, ak_store *store, size_t prefault, ak_block_pool **pool,
                        ak_agents **ag, ak_error *err) {
    ak_agents_free(*ag);
    ak_block_pool_free(*pool);
    *ag = NULL;
    const ak_model *m = e->lm.model;
    if (!(*pool = ak_block_pool_new(&m->spec, o->co.block_tokens, o->co.budget, err))) return -1;
    if (prefault) ak_block_pool_prefault(*pool, o->co.fk, o->co.fv, prefault);
    ak_agents_config ac = {.model = m, .pool = *pool, .store = store, .fk = o->co.fk, .fv = o->co.fv,
                           .n_ctx = o->max_ctx + 1, .save = AK_SAVE_EVERY_TURN};
    return (*ag = ak_agents_new(&ac, err)) ? 0 : -1;
}

/* A turn to time: agent id with the first n prompt tokens, which must be
 * served from tier want (what names the turn in the error otherwise). */
typedef struct {
    const char *id;
    int n;
    ak_tier want;
    const char *what;
} ttft_turn;

/* Begins turn q on ag; its TTFT (the begin: restore or prefill, and the
 * logits) into *ms. The turn is left open. Returns 0, or -1 with err set. */
static int timed_turn(ttft_env *e, ak_agents *ag, const ttft_turn *q, ak_turn *t, double *ms, ak_error *err) {
    const char *id = q->id;
    int n = q->n;
    ak_tier want = q->want;
    progress pg;
    progress_init(&pg, want == AK_TIER_COLD ? "cold prefill" : "restore");
    double t0 = ak_now();
    int rc = ak_agent_begin(ag, e->ctx, id, e->toks, n, e->logits, t, err);
    *ms = (ak_now() - t0) * 1e3;
    progress_done(&pg);
    if (rc < 0) return -1;
    if (t->tier != want)
        return ak_fail(err, "context %d, %s: expected tier %s, got %s", n, q->what, ak_tier_name(want),
                       ak_tier_name(t->tier));
    return 0;
}

/* Copies agent id (L positions) from the directory store into Redis: read
 * with every check into a scratch sequence and saved there. Not timed: it
 * stands for the save the cold turn would have made to Redis. Returns 0,
 * or -1 with err set. */
static int copy_to_redis(const ttft_opts *o, ttft_env *e, const char *id, int L, ak_error *err) {
    const ak_model *m = e->lm.model;
    ak_block_pool *pool = ak_block_pool_new(&m->spec, o->co.block_tokens, 0, err);
    ak_kv *kv = pool ? ak_kv_new(pool, o->co.fk, o->co.fv, L, err) : NULL;
    ak_store_load_info info = {0};
    int rc = -1;
    if (kv && ak_store_load(e->store, id, m->fingerprint, m->cfg.vocab, kv, &info, err) == AK_STORE_HIT)
        rc = ak_store_save(e->redis, id, kv, info.tokens, info.n_tokens, m->fingerprint, m->cfg.name, err);
    free(info.tokens);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    return rc;
}

/* The warm turn from Redis: fresh agents on the Redis store restore agent
 * id's L positions (every chunk from Redis, no local copy) and prefill one
 * more token. Fills r's Redis figures. Returns 0, or -1 with err set. */
static int redis_turn(const ttft_opts *o, ttft_env *e, const char *id, int L, size_t image_bytes, ttft_row *r,
                      ak_error *err) {
    ak_block_pool *pool = NULL;
    ak_agents *ag = NULL;
    ak_turn t;
    int rc = fresh_agents(o, e, e->redis, 2 * image_bytes, &pool, &ag, err);
    const ttft_turn q = {.id = id, .n = L + 1, .want = AK_TIER_WARM, .what = "warm from Redis"};
    if (rc == 0) rc = timed_turn(e, ag, &q, &t, &r->redis_ms, err);
    if (rc == 0) {
        r->redis = 1;
        r->redis_rest_ms = t.restore_ms;
        r->redis_bytes = t.restore_bytes;
        r->redis_tokens = t.reused;
        rc = ak_agent_end(ag, id, err);
    }
    if (rc == 0) rc = ak_agents_flush(ag, err);   /* the save back lands before the next timing */
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    return rc;
}

/* The directory's turns of one context after the cold one: a fresh process
 * restores the file (phase 1: dropped from the page cache first; phase 2:
 * from the page cache) and prefills one more token; phase 3 (hot): the agent
 * of phase 2 takes another turn in RAM. Every turn saves, so each warm turn
 * restores the previous turn's file. Returns 0, or -1 with err set. */
static int dir_warm_turns(const ttft_opts *o, ttft_env *e, const char *id, const char *path, ttft_row *r,
                          ak_error *err) {
    static const ak_tier want[4] = {AK_TIER_COLD, AK_TIER_WARM, AK_TIER_WARM, AK_TIER_HOT};
    static const char *what[4] = {"cold", "warm (page cache dropped)", "warm (page cache)", "hot"};
    ak_block_pool *pool = NULL;
    ak_agents *ag = NULL;
    int rc = 0;
    for (int phase = 1; phase < 4 && rc == 0; phase++) {
        if (phase < 3 && (rc = fresh_agents(o, e, e->store, 2 * file_size(path), &pool, &ag, err)) < 0) break;
        if (phase == 1) {
            drop_cache(path);
            r->resident_after_drop = resident(path);
        }
        ak_turn t;
        const ttft_turn q = {.id = id, .n = r->L + 1, .want = want[phase], .what = what[phase]};
        rc = timed_turn(e, ag, &q, &t, &r->ms[phase], err);
        if (rc == 0 && phase < 3) { r->rest_ms[phase] = t.restore_ms; r->rest_bytes[phase] = t.restore_bytes; }
        if (rc == 0) rc = ak_agent_end(ag, id, err);
    }
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    return rc;
}

/* One context: the cold turn (a full prefill of L tokens, saved to the
 * directory; its save timed), with --store the same image put in Redis and
 * restored from there, then the directory's warm and hot turns, and plain
 * reads of the file. One cold prefill serves every warm row. Returns 0, or
 * -1 with err set. */
static int ttft_context(const ttft_opts *o, ttft_env *e, int L, ttft_row *r, ak_error *err) {
    char id[32], path[1024];
    snprintf(id, sizeof id, "bench-%d", L);
    snprintf(path, sizeof path, "%s/%s.safetensors", o->dir, id);
    memset(r, 0, sizeof *r);
    r->L = L;
    r->resident_after_drop = -1;
    ak_store_remove(e->store, id, NULL);
    if (e->redis) ak_store_remove(e->redis, id, NULL);
    ak_block_pool *pool = NULL;
    ak_agents *ag = NULL;
    ak_turn t;
    int rc = fresh_agents(o, e, e->store, 0, &pool, &ag, err);
    const ttft_turn q = {.id = id, .n = L, .want = AK_TIER_COLD, .what = "cold"};
    if (rc == 0) rc = timed_turn(e, ag, &q, &t, &r->ms[0], err);
    double te = ak_now();
    if (rc == 0) rc = ak_agent_end(ag, id, err);
    /* what a save costs the engine thread (the copy) vs the whole write,
     * which the background writer does meanwhile */
    r->save_engine_ms = (ak_now() - te) * 1e3;
    if (rc == 0) rc = ak_agents_flush(ag, err);
    r->save_total_ms = (ak_now() - te) * 1e3;
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    if (rc == 0 && e->redis) rc = copy_to_redis(o, e, id, L, err);
    if (rc == 0 && e->redis) rc = redis_turn(o, e, id, L, file_size(path), r, err);
    if (rc == 0) rc = dir_warm_turns(o, e, id, path, r, err);
    if (rc < 0) return -1;
    size_t b2 = 0;
    drop_cache(path);
    r->rd_drop_s = plain_read(path, &r->rd_bytes);
    r->rd_pc_s = plain_read(path, &b2);
    if (e->redis) ak_store_remove(e->redis, id, NULL);   /* Redis keeps it in RAM */
    if (e->own_dir) ak_store_remove(e->store, id, NULL);
    return 0;
}

/* The report's opening: the JSON object's start or the text table's header. */
static void ttft_report_head(const ttft_opts *o, const ttft_env *e) {
    const ak_model *m = e->lm.model;
    const char *k = ak_kv_format_get(o->co.fk)->name, *v = ak_kv_format_get(o->co.fv)->name;
    if (o->json) {
        printf("{\"model\": \"%s\", \"cache_type_k\": \"%s\", \"cache_type_v\": \"%s\", \"results\": [", m->gguf.path,
               k, v);
        return;
    }
    fprintf(stderr, "bench ttft: %s, K %s / V %s, memory dir %s%s%s\n", m->gguf.path, k, v, o->dir,
            o->store_url ? ", Redis " : "", o->store_url ? o->store_url : "");
    printf("%8s %10s %10s %10s %10s %9s %10s %9s %9s %s\n", "context", "cold_ms", "warm_ms", "warm_pc_ms", "hot_ms",
           "cold/warm", "file_MB", "rest_GB/s", "read_GB/s", "page cache dropped");
}

static double gb_s(uint64_t bytes, double ms) { return ms > 0 ? bytes / (ms * 1e6) : 0; }

/* One context's row: a JSON object (first: no comma before it) or text lines. */
static void ttft_report_row(const ttft_opts *o, const ttft_row *r, int first) {
    double rest_drop = gb_s(r->rest_bytes[1], r->rest_ms[1]), rest_pc = gb_s(r->rest_bytes[2], r->rest_ms[2]);
    double rd_drop = gb_s(r->rd_bytes, r->rd_drop_s * 1e3), rd_pc = gb_s(r->rd_bytes, r->rd_pc_s * 1e3);
    double redis_gbs = gb_s(r->redis_bytes, r->redis_rest_ms);
    if (o->json) {
        printf("%s{\"context\": %d, \"cold_ms\": %.2f, \"warm_ms\": %.2f, \"warm_page_cache_ms\": %.2f, "
               "\"hot_ms\": %.2f, \"cold_over_warm\": %.1f, \"file_bytes\": %zu, \"restore_bytes\": %llu, "
               "\"restore_ms\": %.2f, "
               "\"restore_page_cache_ms\": %.2f, \"restore_gb_s\": %.3f, \"restore_page_cache_gb_s\": %.3f, "
               "\"read_gb_s\": %.3f, \"read_page_cache_gb_s\": %.3f, \"resident_after_drop\": %.3f, "
               "\"save_engine_ms\": %.2f, \"save_total_ms\": %.2f",
               first ? "" : ", ", r->L, r->ms[0], r->ms[1], r->ms[2], r->ms[3], r->ms[0] / r->ms[1], r->rd_bytes,
               (unsigned long long)r->rest_bytes[1], r->rest_ms[1], r->rest_ms[2], rest_drop, rest_pc, rd_drop, rd_pc, r->resident_after_drop,
               r->save_engine_ms, r->save_total_ms);
        if (r->redis)
            printf(", \"redis\": {\"tokens\": %d, \"warm_ms\": %.2f, \"restore_ms\": %.2f, \"restore_bytes\": %llu, "
                   "\"restore_gb_s\": %.3f, \"cold_over_warm\": %.1f}",
                   r->redis_tokens, r->redis_ms, r->redis_rest_ms, (unsigned long long)r->redis_bytes, redis_gbs,
                   r->ms[0] / r->redis_ms);
        printf("}");
    } else {
        printf("%8d %10.1f %10.2f %10.2f %10.2f %8.0fx %10.1f %9.2f %9.2f %s\n", r->L, r->ms[0], r->ms[1], r->ms[2],
               r->ms[3], r->ms[0] / r->ms[1], r->rd_bytes / 1e6, rest_drop, rd_drop,
               r->resident_after_drop < 0 ? "unknown" : r->resident_after_drop < 0.05 ? "yes" : "no (still cached)");
        if (r->redis)
            printf("%8s Redis (no local copy): warm %.2f ms (cold/warm %.1fx), restore %.2f ms of %.1f MB, "
                   "%.2f GB/s, %d tokens\n", "", r->redis_ms, r->ms[0] / r->redis_ms, r->redis_rest_ms,
                   r->redis_bytes / 1e6, redis_gbs, r->redis_tokens);
        printf("%8s page cache: restore %.2f GB/s vs plain read %.2f GB/s (%.0f%%); dropped: restore %.2f vs "
               "read %.2f GB/s (%.0f%%)\n", "", rest_pc, rd_pc, rd_pc > 0 ? 100 * rest_pc / rd_pc : 0, rest_drop,
               rd_drop, rd_drop > 0 ? 100 * rest_drop / rd_drop : 0);
        printf("%8s save: %.2f ms on the engine thread (copying the cache), %.2f ms until the file was "
               "durable (background writer)\n", "", r->save_engine_ms, r->save_total_ms);
    }
    fflush(stdout);
}

int cmd_bench_ttft(int argc, char **argv) {
    ttft_opts o;
    int rc = ttft_parse(argc, argv, &o);
    if (rc >= 0) return rc;
    ttft_env e;
    if (ttft_setup(&o, &e) < 0) { ttft_teardown(&e); return 1; }
    if (o.restore_only) {
        rc = restore_only(e.lm.model, &o.co, e.store, o.ctxs, o.n_ctxs, o.reps, o.json);
        ttft_teardown(&e);
        return rc;
    }
    ttft_report_head(&o, &e);
    ak_error err = {{0}};
    rc = 0;
    for (int ci = 0; ci < o.n_ctxs && rc == 0; ci++) {
        ttft_row r;
        if (ttft_context(&o, &e, o.ctxs[ci], &r, &err) < 0) {
            fprintf(stderr, "agentkv bench ttft: %s\n", err.msg);
            rc = 1;
        } else {
            ttft_report_row(&o, &r, ci == 0);
        }
    }
    if (rc == 0 && o.json) printf("]}\n");
    ttft_teardown(&e);
    return rc;
}
