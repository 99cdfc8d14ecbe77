/* test_store_pool.c - pool files (store.h, "POOLS"): save, load, lookup,
 * list and remove through the index; a large source kept byte for byte;
 * another model is STALE; a flipped byte, a truncated file and a recorded
 * content hash that is not the contents' (with a valid metadata checksum,
 * recomputed here) are CORRUPT and quarantined under a name no agent's can
 * take; sealed pools, bound to pools/<id>; gc and the agent listing leave
 * pools alone; stale temp files in pools/ are removed at open; a failed
 * save keeps the previous pool file. */
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include "store/store.h"
#include "test.h"
#include "test_store_util.h"

static const char *pool_file(const char *dir, const char *id) {
    static char buf[2][700];
    static int k;
    char *b = buf[k++ & 1];
    snprintf(b, 700, "%s/pools/%s.safetensors", dir, id);
    return b;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Sets metadata key to value in the file at path and writes a metadata
 * checksum that matches (the format's rule: XXH3-64 of every other entry
 * sorted by key, each as key 0x00 value 0x00), so that only what the value
 * means can make the file unusable. Returns 0, or -1. */
static int rewrite_meta(const char *path, const char *key, const char *value) {
    ak_error err = {{0}};
    size_t len;
    uint8_t *img = (uint8_t *)ak_read_file(path, &len, &err);
    if (!img || len < 8) return -1;
    uint64_t N = 0;
    for (int i = 7; i >= 0; i--) N = N << 8 | img[i];
    cJSON *root = cJSON_ParseWithLength((const char *)img + 8, (size_t)N);
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    if (!meta) return -1;
    cJSON_ReplaceItemInObjectCaseSensitive(meta, key, cJSON_CreateString(value));
    int n = cJSON_GetArraySize(meta), k = 0;
    const char **keys = malloc(sizeof *keys * (size_t)n);
    for (cJSON *it = meta->child; it; it = it->next)
        if (strcmp(it->string, "metadata_checksum")) keys[k++] = it->string;
    qsort(keys, (size_t)k, sizeof *keys, cmp_str);
    size_t cap = 0, used = 0;
    for (int i = 0; i < k; i++) cap += strlen(keys[i]) + strlen(cJSON_GetObjectItemCaseSensitive(meta, keys[i])->valuestring) + 2;
    char *buf = malloc(cap + 1);
    for (int i = 0; i < k; i++) {
        const char *v = cJSON_GetObjectItemCaseSensitive(meta, keys[i])->valuestring;
        memcpy(buf + used, keys[i], strlen(keys[i]) + 1);
        used += strlen(keys[i]) + 1;
        memcpy(buf + used, v, strlen(v) + 1);
        used += strlen(v) + 1;
    }
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(buf, used));
    free(buf);
    cJSON_ReplaceItemInObjectCaseSensitive(meta, "metadata_checksum", cJSON_CreateString(hex));
    char *json = cJSON_PrintUnformatted(root);
    size_t jl = strlen(json), N2 = (jl + 7) / 8 * 8, out_len = 8 + N2 + (len - 8 - N);
    uint8_t *out = malloc(out_len);
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)N2 >> (8 * i));
    memcpy(out + 8, json, jl);
    memset(out + 8 + jl, ' ', N2 - jl);
    memcpy(out + 8 + N2, img + 8 + N, len - 8 - N);
    int rc = write_bytes(path, out, out_len);
    free(out);
    free(json);
    free(keys);
    cJSON_Delete(root);
    free(img);
    return rc;
}

/* Counts (and deletes) quarantined pool files of id: quarantine/pool+<id>.safetensors.* */
static int pool_quarantined(const char *dir, const char *id) {
    char q[200];
    snprintf(q, sizeof q, "pool+%s", id);
    return quarantined(dir, q);
}

TEST(store_pool_save_load_list_remove) {
    const char *dir = dir_for("pools");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache p, b;
    REQUIRE(cache_make(&p, &s, 32, AK_KV_Q4, AK_KV_TQ3, 256, 70, 31) == 0, "fill");
    /* a large source: a document's messages, ~200 KB with quotes and newlines */
    size_t slen = 200000;
    char *source = malloc(slen + 1);
    static const char pat[] = "[{\"role\":\"system\",\"content\":\"x\\n\u00e9\"}]\n";
    for (size_t i = 0; i < slen; i++) source[i] = pat[i % (sizeof pat - 1)];
    source[slen] = 0;
    REQUIRE(ak_store_save_pool(st, &(ak_store_save_args){.id = "doc", .kv = p.kv, .tokens = p.tokens, .n_tokens = p.n,
                               .source = source, .fingerprint = FP, .model_name = "m"}, &err) == 0,
            "save: %s", err.msg);
    REQUIRE(ak_store_save_pool(st, &(ak_store_save_args){.id = "aaa", .kv = p.kv, .tokens = p.tokens, .n_tokens = 10,
                               .source = "", .fingerprint = FP, .model_name = "m"}, &err) == 0, "save: %s", err.msg);
    char hash[17], hash10[17];
    ak_pool_content_hash(FP, &s, AK_KV_Q4, AK_KV_TQ3, p.tokens, p.n, hash);
    ak_pool_content_hash(FP, &s, AK_KV_Q4, AK_KV_TQ3, p.tokens, 10, hash10);
    CHECK(strcmp(hash, hash10) != 0, "the hash ignores the tokens");
    struct stat sb;
    CHECK(stat(pool_file(dir, "doc"), &sb) == 0 && !exists(file_of(dir, "doc")), "not in pools/");
    char pd[600];
    snprintf(pd, sizeof pd, "%s/pools", dir);
    CHECK(stat(pd, &sb) == 0 && (sb.st_mode & 0777) == 0700, "pools/ mode %o", (unsigned)(sb.st_mode & 0777));
    char files[800];
    snprintf(files, sizeof files, "timeout -k 5 120 python3 tests/check_safetensors.py '%s' > /dev/null 2>&1",
             pool_file(dir, "doc"));
    CHECK(system(files) == 0, "check_safetensors.py rejects a pool file");
    REQUIRE(stat(pool_file(dir, "doc"), &sb) == 0, "stat");
    for (int round = 0; round < 2; round++) {   /* from the saves, then from the files (reopened) */
        ak_store_pool_entry e;
        CHECK(ak_store_lookup_pool(st, "doc", &e) == 0 && e.e.n_tokens == 70 && !strcmp(e.pool_hash, hash) &&
                  e.source && !strcmp(e.source, source) && e.e.fk == AK_KV_Q4 && e.e.fv == AK_KV_TQ3 &&
                  e.e.bytes == (uint64_t)sb.st_size && !strcmp(e.e.fingerprint, FP),
              "round %d: lookup", round);
        free(e.source);
        CHECK(ak_store_lookup_pool(st, "nope", &e) == 1, "lookup of no pool");
        ak_store_pool_entry *v;
        int n;
        REQUIRE(ak_store_list_pools(st, &v, &n, &err) == 0, "list: %s", err.msg);
        CHECK(n == 2 && !strcmp(v[0].e.id, "aaa") && !strcmp(v[1].e.id, "doc") && !strcmp(v[0].pool_hash, hash10) &&
                  v[0].source && !v[0].source[0],
              "round %d: %d pools listed", round, n);
        ak_store_pool_entries_free(v, n);
        ak_store_entry *es;
        REQUIRE(ak_store_list(st, &es, &n, &err) == 0, "list: %s", err.msg);
        CHECK(n == 0, "round %d: ak_store_list lists %d files (pools are not agents)", round, n);
        free(es);
        REQUIRE(stat(pool_file(dir, "doc"), &sb) == 0, "stat");
        ak_store_close(st);
        st = ak_store_open(dir, NULL, &err);
        REQUIRE(st, "reopen: %s", err.msg);
    }
    REQUIRE(cache_empty_like(&b, &p, 32) == 0, "empty");
    int32_t *tokens = NULL;
    int n = -1;
    char got[17] = "";
    ak_store_status r = ak_store_load_pool(st, &(ak_store_load_args){.id = "doc", .fingerprint = FP, .vocab = VOCAB,
                                           .kv = b.kv}, &tokens, &n, got, &err);
    CHECK(r == AK_STORE_HIT && kv_equal(p.kv, b.kv) && n == 70 && tokens && !memcmp(tokens, p.tokens, 70 * 4) &&
              !strcmp(got, hash),
          "load: %s %s", ak_store_status_name(r), err.msg);
    free(tokens);
    cache_free(&b);
    /* an agent of the same id is another file */
    CHECK(ak_store_load(st, "doc", FP, VOCAB, p.kv, NULL, &err) == AK_STORE_ABSENT, "a pool loaded as an agent");
    CHECK(ak_store_remove_pool(st, "doc", &err) == 0 && !exists(pool_file(dir, "doc")), "remove: %s", err.msg);
    ak_store_pool_entry e;
    CHECK(ak_store_lookup_pool(st, "doc", &e) == 1 && ak_store_remove_pool(st, "doc", &err) == 1, "removed twice");
    CHECK(ak_store_remove_pool(st, "../x", &err) < 0 && err.code == AK_ERR_INVALID, "hostile id");
    CHECK(ak_store_save_pool(st, &(ak_store_save_args){.id = ".x", .kv = p.kv, .tokens = p.tokens, .n_tokens = p.n,
                             .source = "", .fingerprint = FP}, &err) < 0 && err.code == AK_ERR_INVALID,
          "hostile id saved");
    free(source);
    cache_free(&p);
    ak_store_close(st);
}

TEST(store_pool_damage_is_caught) {
    const char *dir = dir_for("pooldmg");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache p, b;
    REQUIRE(cache_make(&p, &s, 32, AK_KV_Q8, AK_KV_Q8, 256, 90, 32) == 0, "fill");
    REQUIRE(cache_empty_like(&b, &p, 32) == 0, "empty");
    REQUIRE(ak_store_save_pool(st, &(ak_store_save_args){.id = "doc", .kv = p.kv, .tokens = p.tokens, .n_tokens = p.n,
                               .source = "src", .fingerprint = FP, .model_name = "m"}, &err) == 0, "save: %s", err.msg);
    size_t len;
    uint8_t *img = (uint8_t *)ak_read_file(pool_file(dir, "doc"), &len, &err);
    REQUIRE(img, "read");
    /* another model: a miss, kept */
    err.code = 0;
    ak_store_status r = ak_store_load_pool(st, &(ak_store_load_args){.id = "doc", .fingerprint = "another-model",
                                           .vocab = VOCAB, .kv = b.kv}, NULL, NULL, NULL, &err);
    CHECK(r == AK_STORE_STALE && err.code == AK_ERR_STALE && exists(pool_file(dir, "doc")) && ak_kv_length(b.kv) == 0,
          "other model: %s %s", ak_store_status_name(r), err.msg);
    /* a flipped byte in the data: corrupt, quarantined as pool+doc */
    img[len - 100] ^= 4;
    REQUIRE(write_bytes(pool_file(dir, "doc"), img, len) == 0, "write");
    img[len - 100] ^= 4;
    r = ak_store_load_pool(st, &(ak_store_load_args){.id = "doc", .fingerprint = FP, .vocab = VOCAB, .kv = b.kv}, NULL,
                           NULL, NULL, &err);
    CHECK(r == AK_STORE_CORRUPT && strstr(err.msg, "checksum mismatch") && !exists(pool_file(dir, "doc")) &&
              pool_quarantined(dir, "doc") == 1 && quarantined(dir, "doc") == 0 && ak_kv_length(b.kv) == 0,
          "flipped byte: %s %s", ak_store_status_name(r), err.msg);
    printf("  e.g. %s\n", err.msg);
    ak_store_pool_entry e;
    CHECK(ak_store_lookup_pool(st, "doc", &e) == 1, "a quarantined pool is still indexed");
    /* truncated */
    REQUIRE(write_bytes(pool_file(dir, "doc"), img, len - 1) == 0, "write");
    r = ak_store_load_pool(st, &(ak_store_load_args){.id = "doc", .fingerprint = FP, .vocab = VOCAB, .kv = b.kv}, NULL,
                           NULL, NULL, &err);
    CHECK(r == AK_STORE_CORRUPT && strstr(err.msg, "truncated") && pool_quarantined(dir, "doc") == 1,
          "truncated: %s %s", ak_store_status_name(r), err.msg);
    /* a recorded hash that is not the contents': with the metadata checksum
     * made to match, the file is whole but lies about what it holds */
    REQUIRE(write_bytes(pool_file(dir, "doc"), img, len) == 0, "write");
    char hash[17];
    ak_pool_content_hash(FP, &s, AK_KV_Q8, AK_KV_Q8, p.tokens, p.n, hash);
    REQUIRE(rewrite_meta(pool_file(dir, "doc"), "pool_hash", hash) == 0, "rewrite");   /* the control: same hash */
    r = ak_store_load_pool(st, &(ak_store_load_args){.id = "doc", .fingerprint = FP, .vocab = VOCAB, .kv = b.kv}, NULL,
                           NULL, NULL, &err);
    CHECK(r == AK_STORE_HIT && kv_equal(p.kv, b.kv), "rewritten with the same hash: %s %s", ak_store_status_name(r),
          err.msg);
    REQUIRE(rewrite_meta(pool_file(dir, "doc"), "pool_hash", "0123456789abcdef") == 0, "rewrite");
    cache c;
    REQUIRE(cache_empty_like(&c, &p, 32) == 0, "empty");
    r = ak_store_load_pool(st, &(ak_store_load_args){.id = "doc", .fingerprint = FP, .vocab = VOCAB, .kv = c.kv}, NULL,
                           NULL, NULL, &err);
    CHECK(r == AK_STORE_CORRUPT && strstr(err.msg, "pool_hash") && pool_quarantined(dir, "doc") == 1 &&
              ak_kv_length(c.kv) == 0,
          "wrong pool_hash: %s %s", ak_store_status_name(r), err.msg);
    /* the same file as an agent's is not an agent file */
    REQUIRE(write_bytes(file_of(dir, "doc"), img, len) == 0, "write");
    r = ak_store_load(st, "doc", FP, VOCAB, c.kv, NULL, &err);
    CHECK(r == AK_STORE_CORRUPT && strstr(err.msg, "format"), "a pool file as an agent's: %s %s",
          ak_store_status_name(r), err.msg);
    quarantined(dir, "doc");
    free(img);
    cache_free(&c);
    cache_free(&b);
    cache_free(&p);
    ak_store_close(st);
}

TEST(store_pool_sealed_round_trip) {
    const char *dir = dir_for("poolseal");
    ak_error err = {{0}};
    uint8_t key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(7 * i + 3);
    ak_store *st = ak_store_open(dir, key, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache p, b;
    REQUIRE(cache_make(&p, &s, 32, AK_KV_F16, AK_KV_Q8, 256, 120, 33) == 0, "fill");
    REQUIRE(ak_store_save_pool(st, &(ak_store_save_args){.id = "doc", .kv = p.kv, .tokens = p.tokens, .n_tokens = p.n,
                               .source = "secret text", .fingerprint = FP, .model_name = "m"}, &err) == 0, "save: %s",
            err.msg);
    size_t len;
    uint8_t *img = (uint8_t *)ak_read_file(pool_file(dir, "doc"), &len, &err);
    REQUIRE(img && len > 64, "read");
    CHECK(!memcmp(img, "AKVSEAL1", 8) && !memmem(img, len, "secret text", 11) && !memmem(img, len, "agentkv.pool", 12),
          "pool file not sealed");
    REQUIRE(cache_empty_like(&b, &p, 16) == 0, "empty");
    CHECK(ak_store_load_pool(st, &(ak_store_load_args){.id = "doc", .fingerprint = FP, .vocab = VOCAB, .kv = b.kv},
                             NULL, NULL, NULL, &err) == AK_STORE_HIT && kv_equal(p.kv, b.kv),
          "sealed pool: %s", err.msg);
    ak_store_close(st);
    st = ak_store_open(dir, key, &err);   /* the index reads sealed pools with the key */
    REQUIRE(st, "reopen: %s", err.msg);
    ak_store_pool_entry e;
    CHECK(ak_store_lookup_pool(st, "doc", &e) == 0 && e.e.sealed && e.e.readable && e.source &&
              !strcmp(e.source, "secret text"),
          "sealed pool entry");
    free(e.source);
    /* bound to pools/doc: the agent doc's sealed file is not the pool */
    REQUIRE(ak_store_save(st, "doc", p.kv, p.tokens, p.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    size_t alen;
    uint8_t *agent = (uint8_t *)ak_read_file(file_of(dir, "doc"), &alen, &err);
    REQUIRE(agent && write_bytes(pool_file(dir, "doc"), agent, alen) == 0, "write");
    ak_store_status r = ak_store_load_pool(st, &(ak_store_load_args){.id = "doc", .fingerprint = FP, .vocab = VOCAB,
                                           .kv = b.kv}, NULL, NULL, NULL, &err);
    CHECK(r == AK_STORE_CORRUPT && strstr(err.msg, "authentication failed") && pool_quarantined(dir, "doc") == 1,
          "an agent's sealed file as a pool: %s %s", ak_store_status_name(r), err.msg);
    free(agent);
    free(img);
    cache_free(&b);
    cache_free(&p);
    ak_store_close(st);
}

/* Pools are explicit: gc neither counts nor deletes them (a budget of 0
 * deletes every agent file and no pool); temp files in pools/ of dead
 * saves are removed at open. */
TEST(store_gc_leaves_pools_alone) {
    const char *dir = dir_for("poolgc");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = {.n_layer = 2, .n_head_kv = 1, .head_dim_k = 16, .head_dim_v = 16, .n_ctx = 64};
    cache a;
    REQUIRE(cache_make(&a, &s, 32, AK_KV_F16, AK_KV_F16, 64, 30, 3) == 0, "fill");
    REQUIRE(ak_store_save(st, "a1", a.kv, a.tokens, a.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    REQUIRE(ak_store_save(st, "a2", a.kv, a.tokens, a.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    REQUIRE(ak_store_save_pool(st, &(ak_store_save_args){.id = "doc", .kv = a.kv, .tokens = a.tokens, .n_tokens = a.n,
                               .source = "", .fingerprint = FP}, &err) == 0, "save: %s", err.msg);
    struct stat sb;
    REQUIRE(stat(file_of(dir, "a1"), &sb) == 0, "stat");
    uint64_t left = 1;
    int removed = ak_store_gc(st, (uint64_t)sb.st_size, &left, &err);
    CHECK(removed == 1 && left == (uint64_t)sb.st_size && exists(pool_file(dir, "doc")),
          "gc to one file: removed %d, left %llu (pools counted?)", removed, (unsigned long long)left);
    removed = ak_store_gc(st, 0, &left, &err);
    CHECK(removed == 1 && left == 0 && exists(pool_file(dir, "doc")), "gc to 0 removed %d, the pool is %s", removed,
          exists(pool_file(dir, "doc")) ? "there" : "gone");
    ak_store_close(st);
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char tmp[800];
    snprintf(tmp, sizeof tmp, "%s/pools/.doc.safetensors.tmp.%d.1", dir, (int)dead);
    REQUIRE(write_bytes(tmp, "x", 1) == 0, "write");
    st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "reopen: %s", err.msg);
    CHECK(!exists(tmp) && exists(pool_file(dir, "doc")), "a dead save's temp file in pools/ was kept");
    cache_free(&a);
    ak_store_close(st);
}

/* A pool save that fails at any step (injected ENOSPC) keeps the previous
 * pool file whole, or (the last step, the directory fsync) the new one. */
TEST(store_pool_failed_writes_keep_the_old_file) {
    const char *dir = dir_for("poolfail");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = {.n_layer = 2, .n_head_kv = 2, .head_dim_k = 32, .head_dim_v = 32, .n_ctx = 128};
    cache old, nw, b;
    REQUIRE(cache_make(&old, &s, 32, AK_KV_Q8, AK_KV_Q8, 128, 30, 1) == 0, "fill");
    REQUIRE(cache_make(&nw, &s, 32, AK_KV_Q8, AK_KV_Q8, 128, 60, 2) == 0, "fill");
    int steps = 0;
    for (int n = 1; n < 100; n++) {
        REQUIRE(ak_store_save_pool(st, &(ak_store_save_args){.id = "doc", .kv = old.kv, .tokens = old.tokens,
                                   .n_tokens = old.n, .source = "old", .fingerprint = FP}, &err) == 0, "%s", err.msg);
        char spec[32];
        snprintf(spec, sizeof spec, "%d:ENOSPC", n);
        setenv("AK_FAULT_FAIL_AT", spec, 1);
        setenv("AK_FAULT_WRITE_CHUNK", "4096", 1);
        ak_store *f = ak_store_open(dir, NULL, &err);
        unsetenv("AK_FAULT_FAIL_AT");
        unsetenv("AK_FAULT_WRITE_CHUNK");
        REQUIRE(f, "open: %s", err.msg);
        int rc = ak_store_save_pool(f, &(ak_store_save_args){.id = "doc", .kv = nw.kv, .tokens = nw.tokens,
                                    .n_tokens = nw.n, .source = "new", .fingerprint = FP}, &err);
        int newer = rc == 0 || strstr(err.msg, "fsync of directory") != NULL;
        ak_store_close(f);
        ak_store *g = ak_store_open(dir, NULL, &err);
        REQUIRE(g, "open: %s", err.msg);
        REQUIRE(cache_empty_like(&b, &old, 32) == 0, "empty");
        int nt = 0;
        ak_store_status r = ak_store_load_pool(g, &(ak_store_load_args){.id = "doc", .fingerprint = FP, .vocab = VOCAB,
                                               .kv = b.kv}, NULL, &nt, NULL, &err);
        CHECK(r == AK_STORE_HIT && kv_equal(newer ? nw.kv : old.kv, b.kv) && nt == (newer ? 60 : 30),
              "step %d (save rc %d): %s %s", n, rc, ak_store_status_name(r), err.msg);
        cache_free(&b);
        ak_store_close(g);
        if (rc == 0) {
            steps = n - 1;
            break;
        }
    }
    CHECK(steps > 5, "only %d steps", steps);
    cache_free(&old);
    cache_free(&nw);
    ak_store_close(st);
}
