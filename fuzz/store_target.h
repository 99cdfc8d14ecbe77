/* store_target.h - the body shared by the agent-file fuzz targets
 * (fuzz_store.c: plain files; fuzz_sealed.c: files sealed under a key).
 *
 * Each input is written as <tmp>/a.safetensors in a store, then read the
 * three ways the system reads such files: ak_store_inspect (header and
 * metadata only), ak_store_verify (everything, checksums and tags included),
 * and ak_store_load into a sequence whose pool has the cache spec and formats
 * the file claims (when they are sane), with the file's own fingerprint, so
 * that inputs close to a valid file reach the checksum and restore code.
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

#include "../src/blockpool.h"
#include "../src/kvcache.h"
#include "../src/store.h"

static ak_store *store;
static char dir[] = "/tmp/agentkv-fuzz-store-XXXXXX";
static char path[512];

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
    empty_quarantine();
    snprintf(p, sizeof p, "%s/quarantine", dir);
    rmdir(p);
    rmdir(dir);
}

/* Opens the store of the run in a fresh temporary directory, sealed under
 * key when it is not NULL. Aborts on failure (nothing can be fuzzed). */
static void store_target_init(const uint8_t *key) {
    if (!mkdtemp(dir)) abort();
    ak_error err = {{0}};
    store = ak_store_open(dir, key, &err);
    if (!store) abort();
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    atexit(store_target_cleanup);
}

/* One input: the file of agent "a", read every way (see the top). */
static int store_target_run(const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    ak_error err = {{0}};
    ak_store_entry e;
    int rc = ak_store_inspect(store, "a", &e, NULL, &err);
    ak_store_verify(store, "a", NULL, 512, &err);
    if (rc == 0 && e.readable) {
        ak_cache_spec sp = e.spec;
        int sane = sp.n_layer >= 1 && sp.n_layer <= 8 && sp.n_head_kv >= 1 && sp.n_head_kv <= 8 &&
                   sp.head_dim_k >= 2 && sp.head_dim_k <= 128 && sp.head_dim_v >= 2 && sp.head_dim_v <= 128 &&
                   sp.n_ctx >= 1 && sp.n_ctx <= 4096 && e.n_tokens <= sp.n_ctx;
        if (sane) {
            ak_block_pool *pool = ak_block_pool_new(&sp, 0, 0, &err);
            ak_kv *kv = pool ? ak_kv_new(pool, e.fk, e.fv, sp.n_ctx, &err) : NULL;
            if (kv) {
                ak_store_load_info info;
                ak_store_status st = ak_store_load(store, "a", e.fingerprint, 0, kv, &info, &err);
                if (st == AK_STORE_HIT) {
                    if (ak_kv_length(kv) != info.n_tokens) __builtin_trap();
                    free(info.tokens);
                }
            }
            ak_kv_free(kv);
            ak_block_pool_free(pool);
        }
    }
    /* a corrupt file is quarantined by load: keep the directory small */
    unlink(path);
    empty_quarantine();
    return 0;
}

#endif
