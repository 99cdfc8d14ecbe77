/* store_target.h - the body shared by the agent-file fuzz targets
 * (fuzz_store.c: plain files; fuzz_sealed.c: files sealed under a key).
 *
 * Each input is written as <tmp>/a.safetensors in a store, then read the
 * three ways the system reads such files: ak_store_inspect (header and
 * metadata only), ak_store_verify (everything, checksums and tags included),
 * and ak_store_load_linked into a sequence whose pool has the cache spec and
 * formats the file claims (when they are sane), with the file's own
 * fingerprint, so that inputs close to a valid file reach the checksum and
 * restore code; its prelink callback supplies the file's base (and half of
 * its whole own blocks, rounded up) from a zero-filled sequence, so that loads skip
 * blocks. Then the same bytes are a pool file, <tmp>/pools/a.safetensors,
 * indexed by reopening the store and loaded with ak_store_load_pool.
 * Any answer is fine; a crash, a sanitizer report, or a HIT whose sequence
 * does not hold the claimed token count is a bug.
 */
#ifndef AK_FUZZ_STORE_TARGET_H
#define AK_FUZZ_STORE_TARGET_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dirent.h>
#include <sys/stat.h>

#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "store/store.h"

static ak_store *store;
static const uint8_t *store_key;
static char dir[] = "/tmp/agentkv-fuzz-store-XXXXXX";
static char path[512], pool_path[600];

/* Removes the quarantined files of the store (in quarantine/). */
static void empty_quarantine(void) {
    char qdir[600];
    snprintf(qdir, sizeof qdir, "%s/quarantine", dir);
    DIR *d = opendir(qdir);
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char q[1200];
        snprintf(q, sizeof q, "%s/%s", qdir, de->d_name);
        unlink(q);
    }
    if (d) closedir(d);
}

/* At exit: the temporary store goes (what it may hold is listed here). */
static void store_target_cleanup(void) {
    char p[600];
    unlink(path);
    unlink(pool_path);
    empty_quarantine();
    snprintf(p, sizeof p, "%s/quarantine", dir);
    rmdir(p);
    snprintf(p, sizeof p, "%s/pools", dir);
    rmdir(p);
    rmdir(dir);
}

/* Opens the store of the run in a fresh temporary directory, sealed under
 * key when it is not NULL (kept: the store is reopened). Aborts on failure
 * (nothing can be fuzzed). */
static void store_target_init(const uint8_t *key) {
    if (!mkdtemp(dir)) abort();
    ak_error err = {{0}};
    store_key = key;
    store = ak_store_open(dir, key, &err);
    if (!store) abort();
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    snprintf(pool_path, sizeof pool_path, "%s/pools/a.safetensors", dir);
    char p[600];
    snprintf(p, sizeof p, "%s/pools", dir);
    mkdir(p, 0700);
    atexit(store_target_cleanup);
}

/* 1 if a cache of this spec and length is small enough to build per input. */
static int spec_sane(const ak_cache_spec *sp, int n_tokens) {
    return sp->n_layer >= 1 && sp->n_layer <= 8 && sp->n_head_kv >= 1 && sp->n_head_kv <= 8 && sp->head_dim_k >= 2 &&
           sp->head_dim_k <= 128 && sp->head_dim_v >= 2 && sp->head_dim_v <= 128 && sp->n_ctx >= 1 &&
           sp->n_ctx <= 4096 && n_tokens <= sp->n_ctx;
}

/* The prelink callback: attaches the file's base, then links half of the
 * own whole blocks (rounded up), from src (a zero-filled sequence of the
 * same pool). A base of segments (store.h: SEGMENTS) is built segment by
 * segment: a pool's from src's first positions, a card's as src's first
 * blocks, own positions as fresh blocks the load fills; nothing linked. */
static int fuzz_prelink(void *ud, const ak_store_base *base, const int32_t *tokens, int n, ak_kv *kv, ak_error *err) {
    const ak_kv *src = ud;
    (void)tokens;
    int T = ak_block_pool_block_tokens(ak_kv_pool(kv)), bl = base->base_len;
    if (bl > ak_kv_length(src)) return ak_failc(err, AK_ERR_NOT_FOUND, "no pool of %d positions", bl);
    if (base->n_seg > 1 || (base->n_seg == 1 && base->seg[0].kind == AK_SEG_OWN)) {
        for (int k = 0; k < base->n_seg; k++) {
            int len = base->seg[k].len, nb = (len + T - 1) / T, rc;
            if (base->seg[k].kind == AK_SEG_OWN) rc = ak_kv_append_empty(kv, len, err);
            else if (base->seg[k].kind == AK_SEG_POOL) rc = ak_kv_attach_base(kv, src, len, err);
            else {
                ak_block *b[64];
                if (nb > 64) return ak_failc(err, AK_ERR_NOT_FOUND, "no card of %d positions", len);
                for (int i = 0; i < nb; i++) b[i] = ak_kv_span(src, i, NULL, NULL);
                rc = ak_kv_append_blocks(kv, b, nb, len, err);
            }
            if (rc != 0) return -1;
        }
        return 0;
    }
    if (bl > 0 && ak_kv_attach_base(kv, src, bl, err) != 0) return -1;
    int links = n > bl ? ((n - bl) / T + 1) / 2 : 0;
    for (int j = 0; j < links && (j + 1) * T <= ak_kv_length(src); j++)
        if (ak_kv_link(kv, ak_kv_span(src, j, NULL, NULL), err) != 0) return -1;
    return 0;
}

/* A sequence of pool holding n zero vectors (fewer if the budget or a
 * format refuses), or NULL. */
static ak_kv *zero_seq(ak_block_pool *pool, ak_kv_format fk, ak_kv_format fv, int cap, int n) {
    ak_error err = {{0}};
    const ak_cache_spec *sp = ak_block_pool_spec(pool);
    ak_kv *kv = ak_kv_new(pool, fk, fv, cap, &err);
    if (!kv || n <= 0 || ak_kv_prepare(kv, 0, n, &err) != 0) return kv;
    float *k = calloc((size_t)sp->n_head_kv * (size_t)sp->head_dim_k, sizeof(float));
    float *v = calloc((size_t)sp->n_head_kv * (size_t)sp->head_dim_v, sizeof(float));
    for (int p = 0; k && v && p < n; p++)
        for (int l = 0; l < sp->n_layer; l++) ak_kv_write(kv, l, p, k, v, &err);
    free(k);
    free(v);
    return kv;
}

/* The input as agent "a": inspect, verify, load with the prelink. */
static void run_agent(void) {
    ak_error err = {{0}};
    ak_store_entry e;
    int rc = ak_store_inspect(store, "a", &e, NULL, &err);
    ak_store_verify(store, "a", NULL, 512, &err);
    if (rc != 0 || !e.readable || !spec_sane(&e.spec, e.n_tokens)) return;
    ak_block_pool *pool = ak_block_pool_new(&e.spec, 0, 0, &err);
    ak_kv *kv = pool ? ak_kv_new(pool, e.fk, e.fv, e.spec.n_ctx, &err) : NULL;
    /* what fuzz_prelink takes from src: the base, and half of the own whole blocks (rounded up) */
    int T = pool ? ak_block_pool_block_tokens(pool) : 1, bl = e.base.base_len;
    int links = e.n_tokens > bl ? ((e.n_tokens - bl) / T + 1) / 2 : 0, need = links * T > bl ? links * T : bl;
    ak_kv *src = kv && need <= 1024 ? zero_seq(pool, e.fk, e.fv, e.spec.n_ctx, need) : NULL;
    if (kv) {
        ak_store_load_info info;
        ak_store_status st = ak_store_load_linked(store, &(ak_store_load_args){.id = "a", .fingerprint = e.fingerprint,
                                                  .kv = kv, .prelink = src ? fuzz_prelink : NULL, .ud = src}, &info,
                                                  &err);
        if (st == AK_STORE_HIT) {
            if (ak_kv_length(kv) != info.n_tokens || info.linked > info.n_tokens) __builtin_trap();
            free(info.tokens);
        }
    }
    ak_kv_free(src);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
}

/* The input as pool "a": indexed by reopening the store, then loaded. */
static void run_pool(void) {
    ak_error err = {{0}};
    ak_store_close(store);
    if (!(store = ak_store_open(dir, store_key, &err))) abort();
    ak_store_pool_entry pe;
    if (ak_store_lookup_pool(store, "a", &pe) != 0) return;
    if (pe.e.readable && spec_sane(&pe.e.spec, pe.e.n_tokens)) {
        ak_block_pool *pool = ak_block_pool_new(&pe.e.spec, 0, 0, &err);
        ak_kv *kv = pool ? ak_kv_new(pool, pe.e.fk, pe.e.fv, pe.e.spec.n_ctx, &err) : NULL;
        int32_t *tokens = NULL;
        int n = -1;
        char hash[17];
        if (kv && ak_store_load_pool(store, &(ak_store_load_args){.id = "a", .fingerprint = pe.e.fingerprint, .kv = kv},
                                     &tokens, &n, hash, &err) == AK_STORE_HIT) {
            if (ak_kv_length(kv) != n || strcmp(hash, pe.pool_hash)) __builtin_trap();
            free(tokens);
        }
        ak_kv_free(kv);
        ak_block_pool_free(pool);
    }
    free(pe.source);
}

/* Copies file src to out_dir/name. Returns 0, or -1. */
static int copy_out(const char *src, const char *out_dir, const char *name) {
    ak_error err = {{0}};
    size_t n;
    char *b = ak_read_file(src, &n, &err);
    char dst[1200];
    snprintf(dst, sizeof dst, "%s/%s", out_dir, name);
    FILE *f = b ? fopen(dst, "wb") : NULL;
    int rc = f && fwrite(b, 1, n, f) == n ? 0 : -1;
    if (f && fclose(f) != 0) rc = -1;
    free(b);
    return rc;
}

/* Seed mode (fuzz/mkseeds.py; the environment variable
 * AK_FUZZ_STORE_SEEDS=DIR): writes small synthetic files of agent "a", in
 * this target's store (sealed or not), to DIR: "synth-base" (an agent whose
 * sequence starts with 40 positions of a pool, 100 tokens, blocks of 32,
 * q8/q4), "synth-pool" (that pool as pool "a", tq3/f16 source text),
 * "synth-plain" (f16/tq2, 45 tokens) and "synth-segments" (format 5: 30
 * positions of its own, a card of 20 after them, 40 more of its own, q8/q4);
 * returns 0, or -1. */
static int store_target_write_seeds(const char *out_dir) {
    ak_error err = {{0}};
    ak_cache_spec sp = {2, 2, 32, 16, 128};
    ak_block_pool *pool = ak_block_pool_new(&sp, 32, 0, &err);
    if (!pool) return -1;
    int32_t tokens[100];
    for (int i = 0; i < 100; i++) tokens[i] = (i * 37 + 5) % 300;
    float k[2 * 32], v[2 * 16];
    const ak_kv_format fmts[3][2] = {{AK_KV_Q8, AK_KV_Q4}, {AK_KV_TQ3, AK_KV_F16}, {AK_KV_F16, AK_KV_TQ2}};
    ak_kv *kv[3] = {NULL, NULL, NULL};
    int rc = 0;
    for (int f = 0; f < 3 && rc == 0; f++) {
        kv[f] = ak_kv_new(pool, fmts[f][0], fmts[f][1], 128, &err);
        rc = kv[f] && ak_kv_prepare(kv[f], 0, 100, &err) == 0 ? 0 : -1;
        for (int p = 0; rc == 0 && p < 100; p++)
            for (int l = 0; rc == 0 && l < 2; l++) {
                for (int i = 0; i < 64; i++) k[i] = (float)((p * 31 + l * 7 + i * 13) % 29) / 7.0f - 2.0f;
                for (int i = 0; i < 32; i++) v[i] = (float)((p * 17 + l * 5 + i * 11) % 23) / 6.0f - 2.0f;
                rc = ak_kv_write(kv[f], l, p, k, v, &err);
            }
    }
    /* the agent: the pool's first 40 positions, then its own */
    ak_kv *based = rc == 0 ? ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 128, &err) : NULL;
    if (!based || ak_kv_attach_base(based, kv[0], 40, &err) != 0 || ak_kv_prepare(based, 40, 100, &err) != 0) rc = -1;
    for (int p = 40; rc == 0 && p < 100; p++)
        for (int l = 0; rc == 0 && l < 2; l++)
            if (ak_kv_read(kv[0], l, p, k, v, &err) != 0 || ak_kv_write(based, l, p, k, v, &err) != 0) rc = -1;
    ak_store_base base = {"doc", "", 40};
    ak_pool_content_hash("fuzzmodel", &sp, AK_KV_Q8, AK_KV_Q4, tokens, 40, base.pool_hash);
    ak_snapshot *sn = rc == 0 ? ak_store_snapshot_base("a", based, tokens, 100, &base, "fuzzmodel", "m", &err) : NULL;
    if (!sn || ak_store_write_snapshot(store, sn, &err) != 0 || copy_out(path, out_dir, "synth-base") != 0) rc = -1;
    ak_snapshot_free(sn);
    if (rc == 0 && (ak_store_save_pool(store, &(ak_store_save_args){.id = "a", .kv = kv[1], .tokens = tokens,
                                       .n_tokens = 70, .source = "[{\"role\":\"system\",\"content\":\"x\"}]",
                                       .fingerprint = "fuzzmodel", .model_name = "m"}, &err) != 0 ||
                    copy_out(pool_path, out_dir, "synth-pool") != 0))
        rc = -1;
    if (rc == 0 && (ak_store_save(store, "a", kv[2], tokens, 45, "fuzzmodel", "m", &err) != 0 ||
                    copy_out(path, out_dir, "synth-plain") != 0))
        rc = -1;
    /* segments: own 30, a card's 20 (kv[0]'s first block standing in), own 40 */
    ak_kv *seg = rc == 0 ? ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 128, &err) : NULL;
    ak_block *cb = kv[0] ? ak_kv_span(kv[0], 0, NULL, NULL) : NULL;
    if (!seg || ak_kv_attach_base(seg, kv[0], 30, &err) != 0 || ak_kv_append_blocks(seg, &cb, 1, 20, &err) != 0 ||
        ak_kv_prepare(seg, 50, 90, &err) != 0)
        rc = -1;
    for (int p = 50; rc == 0 && p < 90; p++)
        for (int l = 0; rc == 0 && l < 2; l++)
            if (ak_kv_read(kv[0], l, p, k, v, &err) != 0 || ak_kv_write(seg, l, p, k, v, &err) != 0) rc = -1;
    ak_store_base sb;
    memset(&sb, 0, sizeof sb);
    sb.n_seg = 2;
    sb.seg[0] = (ak_store_seg){AK_SEG_OWN, 30, "", ""};
    sb.seg[1] = (ak_store_seg){AK_SEG_CARD, 20, "c1", "0123456789abcdef"};
    sn = rc == 0 ? ak_store_snapshot_base("a", seg, tokens, 90, &sb, "fuzzmodel", "m", &err) : NULL;
    if (rc == 0 && (!sn || ak_store_write_snapshot(store, sn, &err) != 0 || copy_out(path, out_dir, "synth-segments") != 0))
        rc = -1;
    ak_snapshot_free(sn);
    ak_kv_free(seg);
    if (rc) fprintf(stderr, "store_target_write_seeds: %s\n", err.msg);
    unlink(path);
    unlink(pool_path);
    ak_kv_free(based);
    for (int f = 0; f < 3; f++) ak_kv_free(kv[f]);
    ak_block_pool_free(pool);
    return rc;
}

/* Writes the input to p; aborts on failure. */
static void put_file(const char *p, const uint8_t *data, size_t size) {
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
}

/* One input: the file of agent "a", then of pool "a" (see the top). */
static int store_target_run(const uint8_t *data, size_t size) {
    put_file(path, data, size);
    run_agent();
    unlink(path);   /* a corrupt file is quarantined by load: keep the directory small */
    put_file(pool_path, data, size);
    run_pool();
    unlink(pool_path);
    empty_quarantine();
    return 0;
}

#endif
