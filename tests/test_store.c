/* test_store.c - the persistent agent store: byte-exact round trips in every
 * format pair and across block sizes, the independent safetensors checker,
 * detection of every kind of damage (truncation, bit flips in each region,
 * tampered or foreign seals) before anything reaches a sequence, quarantine
 * versus stale, hostile ids, stale temp files, LRU gc, and crash safety:
 * children killed at every step of a save, and saves failing with ENOSPC. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "store/store.h"
#include "test.h"
#include "test_store_util.h"

static int count_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

/* Runs tests/check_safetensors.py on the files (a space-separated list of
 * quoted paths); its exit status. Python starts slowly here, so the tests
 * batch their files into one run. */
static int run_checker(const char *files) {
    if (system("command -v python3 > /dev/null 2>&1") != 0) {
        /* a build dependency (scripts/deps.sh): absent is a failure, not a pass */
        fprintf(stderr, "  python3 absent: the safetensors checker cannot run\n");
        return 127;
    }
    size_t n = strlen(files) + 100;
    char *cmd = malloc(n);
    snprintf(cmd, n, "timeout -k 5 120 python3 tests/check_safetensors.py %s > /dev/null 2>&1", files);
    int rc = system(cmd);
    free(cmd);
    return rc;
}

static void add_file(char *list, size_t n, const char *path) {
    size_t l = strlen(list);
    snprintf(list + l, n - l, " '%s'", path);
}

/* ------------------------------------------------------------ round trips */

TEST(store_roundtrip_every_format_pair) {
    const ak_kv_format pairs[][2] = {{AK_KV_F16, AK_KV_F16}, {AK_KV_Q8, AK_KV_TQ3}, {AK_KV_Q4, AK_KV_Q4},
                                     {AK_KV_TQ2, AK_KV_TQ2}, {AK_KV_F32, AK_KV_F32}, {AK_KV_BF16, AK_KV_Q2},
                                     {AK_KV_TQ4, AK_KV_Q8}};
    const char *dir = dir_for("roundtrip");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    char files[8192] = "";
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        cache a, b;
        char id[32];
        snprintf(id, sizeof id, "agent-%s_%s", ak_kv_format_get(pairs[i][0])->name, ak_kv_format_get(pairs[i][1])->name);
        REQUIRE(cache_make(&a, &s, 32, pairs[i][0], pairs[i][1], 300, 77, 100 + i) == 0, "fill");
        int rc = ak_store_save(st, id, a.kv, a.tokens, a.n, FP, "synthetic", &err);
        CHECK(rc == 0, "%s: save: %s", id, err.msg);
        add_file(files, sizeof files, file_of(dir, id));
        const int block_sizes[] = {32, 16, 48, 1};
        for (int k = 0; k < 4; k++) {
            REQUIRE(cache_empty_like(&b, &a, block_sizes[k]) == 0, "empty");
            ak_store_load_info info;
            ak_store_status r = ak_store_load(st, id, FP, VOCAB, b.kv, &info, &err);
            CHECK(r == AK_STORE_HIT, "%s block %d: %s: %s", id, block_sizes[k], ak_store_status_name(r), err.msg);
            CHECK(kv_equal(a.kv, b.kv), "%s block %d: restored vectors differ", id, block_sizes[k]);
            CHECK(info.n_tokens == a.n && info.tokens && !memcmp(info.tokens, a.tokens, sizeof(int32_t) * a.n),
                  "%s: tokens differ", id);
            CHECK(info.bytes_read > 0 && info.total_ms >= 0, "%s: no timing", id);
            free(info.tokens);
            cache_free(&b);
        }
        /* a sequence with content is replaced, not appended to */
        REQUIRE(cache_make(&b, &s, 32, pairs[i][0], pairs[i][1], 300, 120, 999) == 0, "fill");
        CHECK(ak_store_load(st, id, FP, VOCAB, b.kv, NULL, &err) == AK_STORE_HIT && kv_equal(a.kv, b.kv),
              "%s: restore over a filled sequence differs", id);
        cache_free(&b);
        cache_free(&a);
    }
    CHECK(run_checker(files) == 0, "check_safetensors.py rejects one of%s", files);
    /* and the checker can fail: a file cut short */
    size_t len;
    char *img = ak_read_file(file_of(dir, "agent-f16_f16"), &len, &err), cut[600];
    snprintf(cut, sizeof cut, "%s/cut.bin", dir);
    REQUIRE(img && write_bytes(cut, img, len - 1) == 0, "write");
    snprintf(files, sizeof files, "'%s'", cut);
    CHECK(run_checker(files) != 0, "check_safetensors.py accepts a truncated file");
    free(img);
    ak_store_close(st);
}

/* The file's tensor bytes against the documented layout: the vector of
 * layer l, K/V, head h at position p = b * T + s is component c of what the
 * format's quantizer makes of the input, at ((b * H + h) * T + s) * bytes
 * in tensor layers.<l>.<k|v>.<component>, shaped [n_blocks, H, T, ...];
 * slots past n_tokens are zero. Blocks of 16, 37 positions: a partial last
 * block. */
TEST(store_tensor_bytes_follow_the_documented_layout) {
    const char *dir = dir_for("layout");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    enum { L = 2, H = 3, DK = 16, DV = 8, T = 16, N = 37, NB = 3 };
    ak_cache_spec s = {.n_layer = L, .n_head_kv = H, .head_dim_k = DK, .head_dim_v = DV, .n_ctx = 128};
    const ak_kv_format fmt[2] = {AK_KV_Q4, AK_KV_TQ3};
    ak_block_pool *pool = ak_block_pool_new(&s, T, 0, &err);
    ak_kv *kv = pool ? ak_kv_new(pool, fmt[0], fmt[1], 128, &err) : NULL;
    REQUIRE(kv && ak_kv_prepare(kv, 0, N, &err) == 0, "%s", err.msg);
    static float x[N][L][2][H * DK];
    int32_t tokens[N];
    ak_rng rng;
    ak_rng_seed(&rng, 77);
    for (int p = 0; p < N; p++) {
        tokens[p] = p;
        for (int l = 0; l < L; l++) {
            for (int v = 0; v < 2; v++)
                for (int i = 0; i < H * (v ? DV : DK); i++) x[p][l][v][i] = ak_rng_normal(&rng);
            REQUIRE(ak_kv_write(kv, l, p, x[p][l][0], x[p][l][1], &err) == 0, "%s", err.msg);
        }
    }
    REQUIRE(ak_store_save(st, "lay", kv, tokens, N, FP, NULL, &err) == 0, "save: %s", err.msg);
    size_t len;
    uint8_t *img = (uint8_t *)ak_read_file(file_of(dir, "lay"), &len, &err);
    REQUIRE(img && len > 8, "read: %s", err.msg);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | img[i];
    REQUIRE(8 + hl <= len, "header length");
    cJSON *root = cJSON_ParseWithLength((const char *)img + 8, (size_t)hl);
    REQUIRE(root, "header JSON");
    int bad = 0, checked = 0;
    for (int l = 0; l < L; l++)
        for (int v = 0; v < 2; v++) {
            int d = v ? DV : DK;
            ak_kv_component comp[2];
            int nc = ak_kv_format_components(fmt[v], d, comp);
            for (int c = 0; c < nc; c++) {
                char name[64];
                snprintf(name, sizeof name, "layers.%d.%c.%s", l, v ? 'v' : 'k', comp[c].name);
                const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, name);
                const cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "shape");
                const cJSON *of = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
                REQUIRE(o && cJSON_GetArraySize(sh) >= 3 && cJSON_GetArraySize(of) == 2, "tensor %s", name);
                CHECK(cJSON_GetArrayItem(sh, 0)->valueint == NB && cJSON_GetArrayItem(sh, 1)->valueint == H &&
                          cJSON_GetArrayItem(sh, 2)->valueint == T,
                      "%s: shape does not start with [%d, %d, %d]", name, NB, H, T);
                size_t off = 8 + (size_t)hl + (size_t)cJSON_GetArrayItem(of, 0)->valuedouble;
                size_t end = 8 + (size_t)hl + (size_t)cJSON_GetArrayItem(of, 1)->valuedouble;
                CHECK(end - off == (size_t)NB * H * T * comp[c].bytes && end <= len, "%s: %zu bytes", name, end - off);
                if (end - off != (size_t)NB * H * T * comp[c].bytes || end > len) continue;
                for (int b = 0; b < NB; b++)
                    for (int h = 0; h < H; h++)
                        for (int sl = 0; sl < T; sl++) {
                            int p = b * T + sl;
                            uint8_t want[64] = {0};
                            if (p < N) ak_kv_format_get(fmt[v])->quantize(x[p][l][v] + (size_t)h * d, d, want);
                            const uint8_t *got = img + off + (((size_t)b * H + h) * T + sl) * comp[c].bytes;
                            bad += memcmp(got, want + (p < N ? comp[c].offset : 0), comp[c].bytes) != 0;
                            checked++;
                        }
            }
        }
    CHECK(checked == L * (2 + 2) * NB * H * T && bad == 0, "%d of %d vectors' components misplaced", bad, checked);
    cJSON_Delete(root);
    free(img);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    ak_store_close(st);
}

TEST(store_roundtrip_edges) {
    const char *dir = dir_for("edges");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = {.n_layer = 1, .n_head_kv = 1, .head_dim_k = 8, .head_dim_v = 8, .n_ctx = 64};
    const int lens[] = {0, 1, 32, 33, 64};
    char files[4096] = "";
    for (int i = 0; i < 5; i++) {
        cache a, b;
        char id[16];
        snprintf(id, sizeof id, "edge%d", i);
        REQUIRE(cache_make(&a, &s, 32, AK_KV_Q4, AK_KV_TQ3, 64, lens[i], 7 + i) == 0, "fill");
        CHECK(ak_store_save(st, id, a.kv, a.tokens, a.n, FP, NULL, &err) == 0, "save %d: %s", lens[i], err.msg);
        add_file(files, sizeof files, file_of(dir, id));
        REQUIRE(cache_empty_like(&b, &a, 8) == 0, "empty");
        ak_store_load_info info;
        ak_store_status r = ak_store_load(st, id, FP, VOCAB, b.kv, &info, &err);
        CHECK(r == AK_STORE_HIT && kv_equal(a.kv, b.kv) && info.n_tokens == lens[i], "%d tokens: %s", lens[i], err.msg);
        free(info.tokens);
        cache_free(&b);
        /* saving fewer tokens than the cache holds stores just those */
        if (lens[i] > 1) {
            CHECK(ak_store_save(st, "prefix", a.kv, a.tokens, lens[i] - 1, FP, NULL, &err) == 0, "%s", err.msg);
            REQUIRE(cache_empty_like(&b, &a, 32) == 0, "empty");
            CHECK(ak_store_load(st, "prefix", FP, VOCAB, b.kv, &info, &err) == AK_STORE_HIT &&
                      ak_kv_length(b.kv) == lens[i] - 1,
                  "prefix: %s", err.msg);
            ak_kv_truncate(a.kv, lens[i] - 1);
            CHECK(kv_equal(a.kv, b.kv), "prefix differs");
            free(info.tokens);
            cache_free(&b);
        }
        CHECK(ak_store_save(st, "toolong", a.kv, a.tokens, ak_kv_length(a.kv) + 1, FP, NULL, &err) != 0,
              "saved more tokens than the cache holds");
        cache_free(&a);
    }
    CHECK(run_checker(files) == 0, "check_safetensors.py rejects one of%s", files);
    ak_store_close(st);
}

/* The snapshot owns its data: writing the sequence afterwards (or freeing
 * it) does not change what the file gets; the write runs on another thread. */
typedef struct {
    ak_store *st;
    ak_snapshot *sn;
    int rc;
    ak_error err;
} write_job;

static void *write_thread(void *p) {
    write_job *j = p;
    j->rc = ak_store_write_snapshot(j->st, j->sn, &j->err);
    return NULL;
}

TEST(store_snapshot_is_independent_of_the_sequence) {
    const char *dir = dir_for("snapshot");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache a, copy, b;
    REQUIRE(cache_make(&a, &s, 32, AK_KV_Q8, AK_KV_Q4, 100, 50, 5) == 0, "fill");
    REQUIRE(cache_make(&copy, &s, 32, AK_KV_Q8, AK_KV_Q4, 100, 50, 5) == 0, "fill");
    ak_snapshot *sn = ak_store_snapshot("snap", a.kv, a.tokens, a.n, FP, "m", &err);
    REQUIRE(sn, "snapshot: %s", err.msg);
    CHECK(ak_snapshot_bytes(sn) > 0, "no size");
    cache_free(&a);   /* the live sequence goes away (or is overwritten) */
    write_job j = {.st = st, .sn = sn, .rc = -1};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, write_thread, &j) == 0, "thread");
    pthread_join(th, NULL);
    CHECK(j.rc == 0, "write: %s", j.err.msg);
    ak_snapshot_free(sn);
    REQUIRE(cache_empty_like(&b, &copy, 32) == 0, "empty");
    CHECK(ak_store_load(st, "snap", FP, VOCAB, b.kv, NULL, &err) == AK_STORE_HIT && kv_equal(copy.kv, b.kv),
          "snapshot content differs: %s", err.msg);
    cache_free(&b);
    cache_free(&copy);
    ak_store_close(st);
}

/* ---------------------------------------------------------------- damage */

/* Saves a small agent `id` in dir and returns the file's bytes. */
static uint8_t *saved_image(ak_store *st, const char *dir, const char *id, cache *a, size_t *len) {
    ak_error err = {{0}};
    if (ak_store_save(st, id, a->kv, a->tokens, a->n, FP, "m", &err) != 0) {
        fprintf(stderr, "save: %s\n", err.msg);
        return NULL;
    }
    return (uint8_t *)ak_read_file(file_of(dir, id), len, &err);
}

/* Writes img as id's file and loads it into a sequence holding other content:
 * returns the status; the sequence must come back untouched on a miss. */
static ak_store_status load_damaged(ak_test_ctx *t, ak_store *st, const char *dir, const char *id, const uint8_t *img,
                                    size_t n, const cache *victim, ak_error *err) {
    if (write_bytes(file_of(dir, id), img, n) != 0) { CHECK(0, "cannot write %s", id); return AK_STORE_ERROR; }
    cache before;
    if (cache_make(&before, ak_block_pool_spec(victim->pool), 32, ak_kv_format_k(victim->kv), ak_kv_format_v(victim->kv),
                   ak_kv_capacity(victim->kv), 20, 4242) != 0)
        return AK_STORE_ERROR;
    cache into;
    cache_make(&into, ak_block_pool_spec(victim->pool), 32, ak_kv_format_k(victim->kv), ak_kv_format_v(victim->kv),
               ak_kv_capacity(victim->kv), 20, 4242);
    ak_store_status r = ak_store_load(st, id, FP, VOCAB, into.kv, NULL, err);
    if (r != AK_STORE_HIT) CHECK(kv_equal(before.kv, into.kv), "%s: a miss changed the sequence", id);
    cache_free(&before);
    cache_free(&into);
    return r;
}

TEST(store_truncated_files_are_quarantined) {
    const char *dir = dir_for("truncated");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache a;
    REQUIRE(cache_make(&a, &s, 32, AK_KV_Q4, AK_KV_Q8, 100, 40, 11) == 0, "fill");
    size_t len;
    uint8_t *img = saved_image(st, dir, "orig", &a, &len);
    REQUIRE(img, "no image");
    uint64_t N = 0;
    memcpy(&N, img, 8);
    size_t cuts[] = {0, 1, 7, 8, 9, 8 + N / 2, 8 + N - 1, 8 + N, 8 + N + 1, 8 + N + 100, len / 2, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        ak_store_status r = load_damaged(t, st, dir, "orig", img, cuts[i], &a, &err);
        CHECK(r == AK_STORE_CORRUPT, "cut at %zu of %zu: %s (%s)", cuts[i], len, ak_store_status_name(r), err.msg);
        CHECK(strstr(err.msg, file_of(dir, "orig")) && strstr(err.msg, "quarantine"), "message: %s", err.msg);
        CHECK(!exists(file_of(dir, "orig")) && quarantined(dir, "orig") == 1, "cut at %zu not quarantined", cuts[i]);
        if (cuts[i] > 8 + N) CHECK(strstr(err.msg, "truncated"), "cut at %zu: %s", cuts[i], err.msg);
    }
    /* trailing garbage is damage too */
    uint8_t *longer = calloc(len + 3, 1);
    memcpy(longer, img, len);
    CHECK(load_damaged(t, st, dir, "orig", longer, len + 3, &a, &err) == AK_STORE_CORRUPT && strstr(err.msg, "trailing"),
          "trailing bytes: %s", err.msg);
    printf("  e.g. %s\n", err.msg);
    /* the intact image still loads (the damage checks are not just failing) */
    CHECK(load_damaged(t, st, dir, "orig", img, len, &a, &err) == AK_STORE_HIT, "intact: %s", err.msg);
    free(longer);
    free(img);
    cache_free(&a);
    ak_store_close(st);
}

TEST(store_bit_flips_in_every_region_are_detected) {
    const char *dir = dir_for("flips");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = {.n_layer = 2, .n_head_kv = 2, .head_dim_k = 32, .head_dim_v = 32, .n_ctx = 256};
    cache a;
    REQUIRE(cache_make(&a, &s, 32, AK_KV_Q4, AK_KV_TQ3, 64, 20, 12) == 0, "fill");
    size_t len;
    uint8_t *img = saved_image(st, dir, "orig", &a, &len);
    REQUIRE(img, "no image");
    uint64_t N = 0;
    memcpy(&N, img, 8);
    const char *vkey = strstr((const char *)img + 8, "\"format_version\":\"5\"");
    REQUIRE(vkey, "no format_version in the header");
    size_t vpos = (size_t)(vkey - (const char *)img) + strlen("\"format_version\":\"");
    /* positions: every bit of the length, one bit of every header byte, and
     * the first, middle and last byte of every tensor */
    size_t *pos = malloc(sizeof(size_t) * (len + 64));
    int *bit = malloc(sizeof(int) * (len + 64)), np = 0;
    for (int b = 0; b < 64; b++) { pos[np] = (size_t)b / 8; bit[np++] = b % 8; }
    for (size_t i = 8; i < 8 + N; i++) { pos[np] = i; bit[np++] = (int)(i % 8); }
    size_t ntensor = 0;
    for (const char *p = (const char *)img + 8; (p = strstr(p, "\"data_offsets\":[")) && p < (const char *)img + 8 + N;) {
        unsigned long long b, e;
        p += strlen("\"data_offsets\":[");
        if (sscanf(p, "%llu,%llu", &b, &e) != 2 || e <= b) continue;
        size_t at[3] = {b, (b + e) / 2, e - 1};
        for (int k = 0; k < 3; k++) { pos[np] = 8 + N + at[k]; bit[np++] = k * 3; }
        ntensor++;
    }
    CHECK(ntensor == 2 * 2 * 2, "found %zu tensors", ntensor);
    int stale = 0, corrupt = 0;
    uint8_t *bad = malloc(len);
    for (int i = 0; i < np; i++) {
        memcpy(bad, img, len);
        bad[pos[i]] ^= (uint8_t)(1u << bit[i]);
        const char *id = "orig";
        ak_store_status r = load_damaged(t, st, dir, id, bad, len, &a, &err);
        /* a flipped version digit may read as another version: a miss, kept */
        int version_byte = pos[i] == vpos;
        CHECK(r == AK_STORE_CORRUPT || (version_byte && r == AK_STORE_STALE),
              "flip of bit %d at byte %zu (of %zu, header %llu): %s %s", bit[i], pos[i], len, (unsigned long long)N,
              ak_store_status_name(r), err.msg);
        if (r == AK_STORE_CORRUPT)
            CHECK(!exists(file_of(dir, id)) && quarantined(dir, id) == 1, "flip at %zu not quarantined", pos[i]);
        if (pos[i] >= 8 + N) CHECK(strstr(err.msg, "checksum mismatch in block "), "tensor flip: %s", err.msg);
        if (i == np - 1) printf("  e.g. %s\n", err.msg);
        stale += r == AK_STORE_STALE;
        corrupt += r == AK_STORE_CORRUPT;
        unlink(file_of(dir, id));
    }
    CHECK(corrupt + stale == np && corrupt >= np - 1, "%d corrupt, %d stale of %d flips", corrupt, stale, np);
    CHECK(load_damaged(t, st, dir, "orig", img, len, &a, &err) == AK_STORE_HIT, "intact: %s", err.msg);
    free(bad);
    free(pos);
    free(bit);
    free(img);
    cache_free(&a);
    ak_store_close(st);
}

/* A cache large enough (about 7 MB) that a restore reads and hashes with two
 * threads, each half of the tensors: exact round trip; a flipped byte in the
 * first tensor (the worker's half) and in the last (the caller's) are each
 * caught and named; and a restore into a sequence whose pool has no room for
 * a second copy of the cache still hits (verifying a whole image first). */
TEST(store_large_restore_threads_and_tight_budget) {
    const char *dir = dir_for("large");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = {.n_layer = 4, .n_head_kv = 4, .head_dim_k = 128, .head_dim_v = 128, .n_ctx = 4096};
    cache a;
    REQUIRE(cache_make(&a, &s, 32, AK_KV_Q8, AK_KV_Q4, 2048, 2000, 21) == 0, "fill");
    size_t len;
    uint8_t *img = saved_image(st, dir, "big", &a, &len);
    REQUIRE(img && len > ((size_t)5 << 20), "image of %zu bytes", len);
    cache b;
    REQUIRE(cache_empty_like(&b, &a, 32) == 0, "empty");
    ak_store_load_info info;
    CHECK(ak_store_load(st, "big", FP, VOCAB, b.kv, &info, &err) == AK_STORE_HIT, "load: %s", err.msg);
    CHECK(kv_equal(a.kv, b.kv) && info.n_tokens == 2000 && info.bytes_read == len, "restore differs (%llu of %zu bytes read)",
          (unsigned long long)info.bytes_read, len);
    free(info.tokens);
    cache_free(&b);
    uint64_t N = 0;
    memcpy(&N, img, 8);
    /* block 0 of the first tensor, block 62 (positions 1984..1999) of the last */
    struct { size_t at; const char *name; } flips[] = {{8 + N + 100, "block 0 (positions 0..31;"},
                                                       {len - 3, "block 62 (positions 1984..1999;"}};
    uint8_t *bad = malloc(len);
    for (int i = 0; i < 2; i++) {
        memcpy(bad, img, len);
        bad[flips[i].at] ^= 0x10;
        CHECK(load_damaged(t, st, dir, "big", bad, len, &a, &err) == AK_STORE_CORRUPT && strstr(err.msg, flips[i].name),
              "flip in %s: %s", flips[i].name, err.msg);
        CHECK(quarantined(dir, "big") == 1, "not quarantined");
    }
    /* a budget of the cache plus one block: the sequence's old block leaves
     * no room for a second copy */
    REQUIRE(write_bytes(file_of(dir, "big"), img, len) == 0, "rewrite");
    ak_block_pool *pool = ak_block_pool_new(&s, 32, ak_kv_bytes(a.kv) + ak_block_pool_block_bytes(a.pool, AK_KV_Q8, AK_KV_Q4), &err);
    ak_kv *c = pool ? ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 2048, &err) : NULL;
    REQUIRE(c, "%s", err.msg);
    float k[4 * 128] = {0}, v[4 * 128] = {0};
    REQUIRE(ak_kv_prepare(c, 0, 1, &err) == 0 && ak_kv_write(c, 0, 0, k, v, &err) == 0, "%s", err.msg);
    CHECK(ak_store_load(st, "big", FP, VOCAB, c, NULL, &err) == AK_STORE_HIT, "tight budget: %s", err.msg);
    CHECK(kv_equal(a.kv, c), "tight-budget restore differs");
    /* no room at all: an error, and the (empty) sequence is left as it was */
    ak_block_pool_set_budget(pool, ak_kv_bytes(c));
    ak_kv *e = ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 2048, &err);
    CHECK(ak_store_load(st, "big", FP, VOCAB, e, NULL, &err) == AK_STORE_ERROR && strstr(err.msg, "budget"),
          "no room: %s", err.msg);
    CHECK(ak_kv_length(e) == 0 && ak_kv_n_blocks(e) == 0, "a failed restore left blocks");
    CHECK(exists(file_of(dir, "big")), "a budget miss moved the file");
    ak_kv_free(e);
    ak_kv_free(c);
    ak_block_pool_free(pool);
    free(bad);
    free(img);
    cache_free(&a);
    ak_store_close(st);
}

/* Centered caches (blockpool.h): the file records the centering; a restore
 * into a pool with the same means is exact, into one with other means or
 * none a miss (STALE, kept), never silently mixed. */
TEST(store_centering_is_recorded_and_checked) {
    const char *dir = dir_for("center");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    size_t nk = (size_t)s.n_layer * s.n_head_kv * s.head_dim_k, nv = (size_t)s.n_layer * s.n_head_kv * s.head_dim_v;
    float *mk = malloc(sizeof(float) * nk), *mv = malloc(sizeof(float) * nv);
    ak_rng r;
    ak_rng_seed(&r, 5);
    for (size_t i = 0; i < nk; i++) mk[i] = ak_rng_normal(&r);
    for (size_t i = 0; i < nv; i++) mv[i] = ak_rng_normal(&r);
    /* three pools: the means under id t1, other means under t2, none */
    ak_block_pool *pools[3];
    const char *ids[3] = {"t1", "t2", NULL};
    for (int i = 0; i < 3; i++) {
        pools[i] = ak_block_pool_new(&s, 32, 0, &err);
        REQUIRE(pools[i], "%s", err.msg);
        if (ids[i]) {
            if (i == 1) mk[0] += 1;
            REQUIRE(ak_block_pool_set_centers(pools[i], mk, mv, ids[i], 0, 0, &err) == 0, "%s", err.msg);
        }
    }
    cache a;
    REQUIRE(cache_make(&a, &s, 32, AK_KV_TQ4, AK_KV_Q4, 128, 70, 9) == 0, "fill");
    /* a's vectors, written again into a centered sequence */
    ak_kv *src = ak_kv_new(pools[0], AK_KV_TQ4, AK_KV_Q4, 128, &err);
    REQUIRE(src && ak_kv_prepare(src, 0, 70, &err) == 0, "%s", err.msg);
    float k[2 * 64], v[2 * 32];
    for (int p = 0; p < 70; p++)
        for (int l = 0; l < s.n_layer; l++) {
            REQUIRE(ak_kv_read(a.kv, l, p, k, v, &err) == 0 && ak_kv_write(src, l, p, k, v, &err) == 0, "%s", err.msg);
        }
    REQUIRE(ak_store_save(st, "c", src, a.tokens, 70, FP, "m", &err) == 0, "save: %s", err.msg);
    size_t len;
    char *img = ak_read_file(file_of(dir, "c"), &len, &err);
    REQUIRE(img && len > 8, "read");
    CHECK(strstr(img + 8, "\"key_center\":\"t1\"") && strstr(img + 8, "\"value_center\":\"t1\""),
          "centering not recorded");
    free(img);
    for (int i = 0; i < 3; i++) {
        ak_kv *dst = ak_kv_new(pools[i], AK_KV_TQ4, AK_KV_Q4, 128, &err);
        ak_store_status rs = ak_store_load(st, "c", FP, VOCAB, dst, NULL, &err);
        if (i == 0) CHECK(rs == AK_STORE_HIT && kv_equal(src, dst), "same means: %s %s", ak_store_status_name(rs), err.msg);
        else
            CHECK(rs == AK_STORE_STALE && strstr(err.msg, "keys centered with t1") && ak_kv_length(dst) == 0 &&
                      exists(file_of(dir, "c")),
                  "pool %d: %s %s", i, ak_store_status_name(rs), err.msg);
        ak_kv_free(dst);
    }
    /* an f16/q8 cache is not centered: "none" recorded, any pool takes it */
    ak_kv *plain = ak_kv_new(pools[0], AK_KV_F16, AK_KV_Q8, 128, &err);
    REQUIRE(plain && ak_kv_prepare(plain, 0, 3, &err) == 0, "%s", err.msg);
    for (int p = 0; p < 3; p++)
        for (int l = 0; l < s.n_layer; l++) REQUIRE(ak_kv_write(plain, l, p, k, v, &err) == 0, "%s", err.msg);
    REQUIRE(ak_store_save(st, "p", plain, a.tokens, 3, FP, "m", &err) == 0, "save: %s", err.msg);
    ak_kv *dst = ak_kv_new(pools[2], AK_KV_F16, AK_KV_Q8, 128, &err);
    CHECK(ak_store_load(st, "p", FP, VOCAB, dst, NULL, &err) == AK_STORE_HIT && kv_equal(plain, dst), "plain: %s", err.msg);
    char files[1400] = "";
    add_file(files, sizeof files, file_of(dir, "c"));
    add_file(files, sizeof files, file_of(dir, "p"));
    CHECK(run_checker(files) == 0, "the independent checker rejected a centered file");
    ak_kv_free(dst);
    ak_kv_free(plain);
    ak_kv_free(src);
    cache_free(&a);
    for (int i = 0; i < 3; i++) ak_block_pool_free(pools[i]);
    free(mk);
    free(mv);
    ak_store_close(st);
}

/* Replaces the first occurrence of `from` by `to` (same length) in img. */
static int patch(uint8_t *img, size_t len, const char *from, const char *to) {
    size_t fl = strlen(from);
    for (size_t i = 0; i + fl <= len; i++)
        if (!memcmp(img + i, from, fl)) { memcpy(img + i, to, fl); return 0; }
    return -1;
}

TEST(store_stale_files_miss_without_quarantine) {
    const char *dir = dir_for("stale");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache a, b;
    REQUIRE(cache_make(&a, &s, 32, AK_KV_Q4, AK_KV_Q4, 100, 30, 13) == 0, "fill");
    REQUIRE(ak_store_save(st, "a", a.kv, a.tokens, a.n, FP, "m", &err) == 0, "save: %s", err.msg);

    /* another model */
    REQUIRE(cache_empty_like(&b, &a, 32) == 0, "empty");
    ak_store_status r = ak_store_load(st, "a", "feedfacefeedface", VOCAB, b.kv, NULL, &err);
    CHECK(r == AK_STORE_STALE && strstr(err.msg, "a.safetensors"), "other fingerprint: %s: %s", ak_store_status_name(r), err.msg);
    printf("  e.g. %s\n", err.msg);
    CHECK(exists(file_of(dir, "a")) && quarantined(dir, "a") == 0, "a stale file was moved");
    CHECK(ak_kv_length(b.kv) == 0, "a stale load wrote the sequence");
    cache_free(&b);
    /* other formats */
    REQUIRE(cache_make(&b, &s, 32, AK_KV_Q8, AK_KV_Q4, 100, 0, 1) == 0, "empty");
    CHECK(ak_store_load(st, "a", FP, VOCAB, b.kv, NULL, &err) == AK_STORE_STALE, "other formats: %s", err.msg);
    cache_free(&b);
    /* other spec */
    ak_cache_spec s2 = s;
    s2.n_layer = 4;
    REQUIRE(cache_make(&b, &s2, 32, AK_KV_Q4, AK_KV_Q4, 100, 0, 1) == 0, "empty");
    CHECK(ak_store_load(st, "a", FP, VOCAB, b.kv, NULL, &err) == AK_STORE_STALE, "other spec: %s", err.msg);
    cache_free(&b);
    /* too long for the sequence */
    REQUIRE(cache_make(&b, &s, 32, AK_KV_Q4, AK_KV_Q4, 29, 0, 1) == 0, "empty");
    CHECK(ak_store_load(st, "a", FP, VOCAB, b.kv, NULL, &err) == AK_STORE_STALE, "capacity: %s", err.msg);
    cache_free(&b);
    CHECK(exists(file_of(dir, "a")) && quarantined(dir, "a") == 0, "a stale file was moved");
    /* and the file is still good */
    REQUIRE(cache_empty_like(&b, &a, 32) == 0, "empty");
    CHECK(ak_store_load(st, "a", FP, VOCAB, b.kv, NULL, &err) == AK_STORE_HIT && kv_equal(a.kv, b.kv), "%s", err.msg);
    cache_free(&b);

    /* a newer format version, and an older one (version 3 had a checksum
     * per tensor, no bases; version 4, without segments, is still read): a
     * miss, kept */
    size_t len;
    uint8_t *img = (uint8_t *)ak_read_file(file_of(dir, "a"), &len, &err);
    const char *vers[2][3] = {{"\"format_version\":\"8\"", "v8", "newer"}, {"\"format_version\":\"3\"", "v3", "older"}};
    for (int k = 0; k < 2; k++) {
        REQUIRE(img && patch(img, len, "\"format_version\":\"5\"", vers[k][0]) == 0, "patch");
        REQUIRE(write_bytes(file_of(dir, vers[k][1]), img, len) == 0, "write");
        REQUIRE(cache_empty_like(&b, &a, 32) == 0, "empty");
        r = ak_store_load(st, vers[k][1], FP, VOCAB, b.kv, NULL, &err);
        CHECK(r == AK_STORE_STALE && strstr(err.msg, vers[k][2]), "%s: %s: %s", vers[k][1], ak_store_status_name(r),
              err.msg);
        CHECK(exists(file_of(dir, vers[k][1])) && ak_kv_length(b.kv) == 0, "%s moved or loaded", vers[k][1]);
        cache_free(&b);
        REQUIRE(patch(img, len, vers[k][0], "\"format_version\":\"5\"") == 0, "patch");
    }
    /* a file under another agent's name is not that agent's memory */
    REQUIRE(write_bytes(file_of(dir, "b"), img, len) == 0, "write");
    REQUIRE(cache_empty_like(&b, &a, 32) == 0, "empty");
    CHECK(ak_store_load(st, "b", FP, VOCAB, b.kv, NULL, &err) == AK_STORE_CORRUPT && strstr(err.msg, "agent_id"),
          "renamed file: %s", err.msg);
    /* token ids outside the vocabulary */
    CHECK(ak_store_load(st, "a", FP, 5, b.kv, NULL, &err) == AK_STORE_CORRUPT && strstr(err.msg, "vocabulary"),
          "vocab: %s", err.msg);
    CHECK(ak_store_load(st, "nobody", FP, VOCAB, b.kv, NULL, &err) == AK_STORE_ABSENT, "absent: %s", err.msg);
    cache_free(&b);
    free(img);
    cache_free(&a);
    ak_store_close(st);
}

/* ------------------------------------------------------------- encryption */

static void key_of(uint8_t key[32], int seed) {
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(seed * 31 + i * 7);
}

TEST(store_sealed_files) {
    const char *dir = dir_for("sealed");
    ak_error err = {{0}};
    uint8_t k1[32], k2[32];
    key_of(k1, 1);
    key_of(k2, 2);
    ak_store *st = ak_store_open(dir, k1, &err), *other = ak_store_open(dir, k2, &err);
    ak_store *plain = ak_store_open(dir, NULL, &err);
    REQUIRE(st && other && plain, "open: %s", err.msg);
    CHECK(ak_store_sealed(st) && !ak_store_sealed(plain), "sealed flag");
    ak_cache_spec s = small_spec();
    cache a, b;
    /* > 64 KiB so that the seal has several chunks */
    REQUIRE(cache_make(&a, &s, 32, AK_KV_F16, AK_KV_Q8, 300, 250, 21) == 0, "fill");
    REQUIRE(ak_store_save(st, "sec", a.kv, a.tokens, a.n, FP, "secret-model", &err) == 0, "save: %s", err.msg);
    size_t len;
    uint8_t *img = (uint8_t *)ak_read_file(file_of(dir, "sec"), &len, &err);
    REQUIRE(img && len > 3 * 65536, "sealed file of %zu bytes", img ? len : 0);
    CHECK(!memcmp(img, "AKVSEAL1", 8), "no magic");
    char tok[64];
    snprintf(tok, sizeof tok, "%d,%d,%d", a.tokens[0], a.tokens[1], a.tokens[2]);
    CHECK(!memmem(img, len, "agentkv.agent", 13) && !memmem(img, len, tok, strlen(tok)) &&
              !memmem(img, len, "secret-model", 12),
          "metadata visible in the sealed file");

    REQUIRE(cache_empty_like(&b, &a, 16) == 0, "empty");
    ak_store_load_info info;
    ak_store_status r = ak_store_load(st, "sec", FP, VOCAB, b.kv, &info, &err);
    CHECK(r == AK_STORE_HIT && kv_equal(a.kv, b.kv) && info.n_tokens == a.n, "sealed round trip: %s", err.msg);
    free(info.tokens);
    CHECK(ak_store_verify(st, "sec", FP, VOCAB, &err) == AK_STORE_HIT, "verify: %s", err.msg);
    cache_free(&b);

    /* wrong key, no key: a miss, the file kept */
    REQUIRE(cache_empty_like(&b, &a, 32) == 0, "empty");
    r = ak_store_load(other, "sec", FP, VOCAB, b.kv, NULL, &err);
    CHECK(r == AK_STORE_STALE && strstr(err.msg, "wrong key"), "wrong key: %s: %s", ak_store_status_name(r), err.msg);
    printf("  e.g. %s\n", err.msg);
    r = ak_store_load(plain, "sec", FP, VOCAB, b.kv, NULL, &err);
    CHECK(r == AK_STORE_STALE && strstr(err.msg, "no key"), "no key: %s", err.msg);
    CHECK(exists(file_of(dir, "sec")) && ak_kv_length(b.kv) == 0, "moved or loaded");
    /* a plain file in a sealed store */
    REQUIRE(ak_store_save(plain, "pl", a.kv, a.tokens, a.n, FP, NULL, &err) == 0, "%s", err.msg);
    r = ak_store_load(st, "pl", FP, VOCAB, b.kv, NULL, &err);
    CHECK(r == AK_STORE_STALE && strstr(err.msg, "plain"), "plain with key: %s", err.msg);
    CHECK(exists(file_of(dir, "pl")) && ak_kv_length(b.kv) == 0, "moved or loaded");

    /* list: what a sealed file shows with and without the key */
    ak_store_entry *es;
    int n;
    REQUIRE(ak_store_list(st, &es, &n, &err) == 0, "list: %s", err.msg);
    int seen = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(es[i].id, "sec")) {
            seen = 1;
            CHECK(es[i].sealed && es[i].readable && es[i].n_tokens == a.n && !strcmp(es[i].fingerprint, FP),
                  "sealed entry with the key");
        }
    CHECK(seen, "sec not listed");
    free(es);
    REQUIRE(ak_store_list(other, &es, &n, &err) == 0, "list: %s", err.msg);
    for (int i = 0; i < n; i++)
        if (!strcmp(es[i].id, "sec")) CHECK(es[i].sealed && !es[i].readable && es[i].n_tokens == 0, "entry without key");
    free(es);

    /* tampering: each field of the plain header, the first, a middle and the
     * last chunk, the final tag, truncation inside and at chunk boundaries */
    size_t spots[] = {8, 12, 16, 24, 32, 40, 56, 60, 70000, len / 2, len - 17, len - 1};
    for (size_t i = 0; i < sizeof spots / sizeof *spots; i++) {
        uint8_t *bad = malloc(len);
        memcpy(bad, img, len);
        bad[spots[i]] ^= 0x10;
        const char *id = "sec";
        r = load_damaged(t, st, dir, id, bad, len, &a, &err);
        if (spots[i] >= 24 && spots[i] < 32) {   /* the key id: reads as another key */
            CHECK(r == AK_STORE_STALE, "key id tamper: %s", err.msg);
        } else if (spots[i] < 12) {              /* the version: reads as a newer one */
            CHECK(r == AK_STORE_STALE && strstr(err.msg, "newer"), "version tamper: %s", err.msg);
        } else {
            CHECK(r == AK_STORE_CORRUPT && quarantined(dir, id) == 1, "tamper at %zu: %s: %s", spots[i],
                  ak_store_status_name(r), err.msg);
        }
        free(bad);
    }
    size_t chunk = 65536 + 17;
    size_t cuts[] = {len - 1, len - chunk, 56 + chunk, 56, 40, 8};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        const char *id = "sec";
        r = load_damaged(t, st, dir, id, img, cuts[i], &a, &err);
        CHECK(r == AK_STORE_CORRUPT && quarantined(dir, id) == 1, "sealed cut at %zu: %s", cuts[i], err.msg);
    }
    /* dropping the last chunk and fixing the header's size still fails: the
     * header is authenticated, and the new last chunk lacks the final tag */
    {
        uint8_t *bad = malloc(len);
        memcpy(bad, img, len);
        uint64_t plain_bytes;
        memcpy(&plain_bytes, bad + 16, 8);
        size_t last = (size_t)(plain_bytes % 65536 ? plain_bytes % 65536 : 65536);
        plain_bytes -= last;
        memcpy(bad + 16, &plain_bytes, 8);
        r = load_damaged(t, st, dir, "sec", bad, len - last - 17, &a, &err);
        CHECK(r == AK_STORE_CORRUPT, "dropped final chunk: %s", err.msg);
        free(bad);
    }
    /* swapping two chunks */
    {
        uint8_t *bad = malloc(len);
        memcpy(bad, img, len);
        memcpy(bad + 56, img + 56 + chunk, chunk);
        memcpy(bad + 56 + chunk, img + 56, chunk);
        r = load_damaged(t, st, dir, "sec", bad, len, &a, &err);
        CHECK(r == AK_STORE_CORRUPT, "swapped chunks: %s", err.msg);
        free(bad);
    }
    CHECK(load_damaged(t, st, dir, "sec", img, len, &a, &err) == AK_STORE_HIT, "intact sealed file: %s", err.msg);
    cache_free(&b);
    free(img);
    cache_free(&a);
    ak_store_close(st);
    ak_store_close(other);
    ak_store_close(plain);
}

TEST(store_key_file_must_be_32_bytes) {
    const char *dir = dir_for("keys");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_store_close(st);
    char path[600];
    uint8_t buf[40] = {1, 2, 3}, key[32];
    const size_t sizes[] = {0, 31, 32, 33, 40};
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/key%d", dir, i);
        REQUIRE(write_bytes(path, buf, sizes[i]) == 0 && chmod(path, 0600) == 0, "write");
        int rc = ak_store_read_key(path, key, &err);
        CHECK((rc == 0) == (sizes[i] == 32), "key of %zu bytes: rc %d %s", sizes[i], rc, err.msg);
        if (rc) CHECK(strstr(err.msg, path) && strstr(err.msg, "32"), "message: %s", err.msg);
    }
    snprintf(path, sizeof path, "%s/nokey", dir);
    CHECK(ak_store_read_key(path, key, &err) < 0 && strstr(err.msg, "No such file"), "missing key file: %s", err.msg);
}

/* ------------------------------------------------- ids, temps, gc, listing */

TEST(store_hostile_agent_ids_are_rejected) {
    char longid[200], maxid[200];
    memset(longid, 'a', 129);
    longid[129] = 0;
    memcpy(maxid, longid, 128);
    maxid[128] = 0;
    const char *bad[] = {"../x", ".hidden", "a/b", "", "a\n", "a\\n", "..", ".", "a b", "x\\y", "ä", "a:b", "/etc/passwd", longid};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECK(!ak_agent_id_valid(bad[i]), "accepted \"%s\"", bad[i]);
    CHECK(!ak_agent_id_valid(NULL), "accepted NULL");
    const char *good[] = {"a", "planner", "agent-1.v2_x", "A.b-C_0", "a..b", maxid};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) CHECK(ak_agent_id_valid(good[i]), "rejected \"%s\"", good[i]);

    const char *dir = dir_for("ids");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = {.n_layer = 1, .n_head_kv = 1, .head_dim_k = 8, .head_dim_v = 8, .n_ctx = 64};
    cache a;
    REQUIRE(cache_make(&a, &s, 32, AK_KV_F16, AK_KV_F16, 64, 3, 1) == 0, "fill");
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(ak_store_save(st, bad[i], a.kv, a.tokens, a.n, FP, NULL, &err) < 0, "saved \"%s\"", bad[i]);
        CHECK(ak_store_load(st, bad[i], FP, VOCAB, a.kv, NULL, &err) == AK_STORE_ERROR, "loaded \"%s\"", bad[i]);
        CHECK(ak_store_remove(st, bad[i], &err) < 0 && ak_store_quarantine(st, bad[i], "x", &err) < 0, "removed");
    }
    CHECK(ak_kv_length(a.kv) == 3, "a rejected load touched the sequence");
    cache_free(&a);
    ak_store_close(st);
}

TEST(store_open_removes_stale_temp_files) {
    const char *dir = dir_for("temps");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_store_close(st);
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char p_dead[700], p_live[700], p_bad[700], p_old[700];
    snprintf(p_dead, sizeof p_dead, "%s/a.safetensors.tmp.%d.%d", dir, (int)dead, (int)dead);
    snprintf(p_live, sizeof p_live, "%s/b.safetensors.tmp.%d.1", dir, (int)getpid());
    snprintf(p_bad, sizeof p_bad, "%s/c.safetensors.tmp.junk", dir);
    snprintf(p_old, sizeof p_old, "%s/d.safetensors.tmp.%d.1", dir, (int)getppid());
    const char *all[] = {p_dead, p_live, p_bad, p_old};
    for (int i = 0; i < 4; i++) REQUIRE(write_bytes(all[i], "x", 1) == 0, "write %s", all[i]);
    struct timespec old[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
    REQUIRE(utimensat(AT_FDCWD, p_old, old, 0) == 0, "utimensat");
    st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    CHECK(!exists(p_dead), "temp of a dead process kept");
    CHECK(!exists(p_bad), "malformed temp kept");
    CHECK(!exists(p_old), "two-hour-old temp kept");
    CHECK(exists(p_live), "temp of a live process (a save in flight) removed");
    unlink(p_live);
    ak_store_close(st);
}

TEST(store_gc_removes_least_recently_used_first) {
    const char *dir = dir_for("gc");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = {.n_layer = 2, .n_head_kv = 1, .head_dim_k = 16, .head_dim_v = 16, .n_ctx = 64};
    cache a, b;
    REQUIRE(cache_make(&a, &s, 32, AK_KV_F16, AK_KV_F16, 64, 30, 3) == 0, "fill");
    const char *ids[] = {"g0", "g1", "g2", "g3"};
    uint64_t size = 0;
    for (int i = 0; i < 4; i++) {
        REQUIRE(ak_store_save(st, ids[i], a.kv, a.tokens, a.n, FP, NULL, &err) == 0, "save: %s", err.msg);
        struct stat sb;
        stat(file_of(dir, ids[i]), &sb);
        size = (uint64_t)sb.st_size;
        /* g0 oldest ... g3 newest, then g0 is loaded: most recent */
        struct timespec ts[2] = {{1000000 + i * 1000, 0}, {1000000 + i * 1000, 0}};
        REQUIRE(utimensat(AT_FDCWD, file_of(dir, ids[i]), ts, 0) == 0, "utimensat");
    }
    ak_store_close(st);   /* the index takes the mtimes set behind its back at the next open */
    st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "reopen: %s", err.msg);
    REQUIRE(cache_empty_like(&b, &a, 32) == 0, "empty");
    CHECK(ak_store_load(st, "g0", FP, VOCAB, b.kv, NULL, &err) == AK_STORE_HIT, "load: %s", err.msg);
    cache_free(&b);
    uint64_t left = 0;
    int removed = ak_store_gc(st, 4 * size, &left, &err);
    CHECK(removed == 0 && left == 4 * size, "gc within budget removed %d", removed);
    removed = ak_store_gc(st, 2 * size + size / 2, &left, &err);
    CHECK(removed == 2 && left == 2 * size, "gc removed %d, left %llu: %s", removed, (unsigned long long)left, err.msg);
    CHECK(!exists(file_of(dir, "g1")) && !exists(file_of(dir, "g2")), "the oldest were not removed first");
    CHECK(exists(file_of(dir, "g0")) && exists(file_of(dir, "g3")), "recently used files removed");
    removed = ak_store_gc(st, 0, &left, &err);
    CHECK(removed == 2 && left == 0, "gc to zero removed %d", removed);
    cache_free(&a);
    ak_store_close(st);
}

TEST(store_list_inspect_verify_remove) {
    const char *dir = dir_for("list");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache a;
    REQUIRE(cache_make(&a, &s, 16, AK_KV_Q4, AK_KV_TQ3, 100, 25, 8) == 0, "fill");
    REQUIRE(ak_store_save(st, "zed", a.kv, a.tokens, a.n, FP, "tiny \"model\"", &err) == 0, "%s", err.msg);
    REQUIRE(ak_store_save(st, "alpha", a.kv, a.tokens, 10, FP, "tiny", &err) == 0, "%s", err.msg);
    REQUIRE(write_bytes(file_of(dir, "junk"), "not a safetensors file", 22) == 0, "write");
    REQUIRE(write_bytes(file_of(dir, ".hidden"), "x", 1) == 0, "write");
    ak_store_close(st);   /* files written behind the store's back are indexed at the next open */
    st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "reopen: %s", err.msg);
    ak_store_entry *es;
    int n;
    REQUIRE(ak_store_list(st, &es, &n, &err) == 0, "list: %s", err.msg);
    CHECK(n == 3 && !strcmp(es[0].id, "alpha") && !strcmp(es[1].id, "junk") && !strcmp(es[2].id, "zed"),
          "list has %d entries", n);
    if (n == 3) {
        CHECK(es[0].readable && es[0].n_tokens == 10 && es[2].n_tokens == 25 && !es[1].readable, "entries");
        CHECK(es[2].fk == AK_KV_Q4 && es[2].fv == AK_KV_TQ3 && es[2].spec.n_layer == 3 && es[2].block_tokens == 16 &&
                  !strcmp(es[2].fingerprint, FP) && !strcmp(es[2].model_name, "tiny \"model\"") && es[2].bytes > 0 &&
                  es[2].mtime > 0 && es[2].created > 0 && !es[2].sealed,
              "entry fields");
    }
    free(es);
    ak_store_entry e;
    char *meta = NULL;
    CHECK(ak_store_inspect(st, "zed", &e, &meta, &err) == 0 && meta && strstr(meta, "\"tokens\"") &&
              strstr(meta, "\"block_checksums\""),
          "inspect: %s", err.msg);
    free(meta);
    CHECK(ak_store_inspect(st, "nobody", &e, NULL, &err) == 1, "inspect of a missing file");
    CHECK(ak_store_inspect(st, "junk", &e, NULL, &err) < 0 && strstr(err.msg, "junk.safetensors"), "inspect junk: %s",
          err.msg);

    CHECK(ak_store_verify(st, "zed", NULL, 0, &err) == AK_STORE_HIT, "verify: %s", err.msg);
    CHECK(ak_store_verify(st, "zed", FP, VOCAB, &err) == AK_STORE_HIT, "verify: %s", err.msg);
    CHECK(ak_store_verify(st, "zed", "0000", 0, &err) == AK_STORE_STALE, "verify other model: %s", err.msg);
    CHECK(ak_store_verify(st, "junk", NULL, 0, &err) == AK_STORE_CORRUPT, "verify junk: %s", err.msg);
    CHECK(exists(file_of(dir, "junk")), "verify moved a file");
    CHECK(ak_store_quarantine(st, "junk", "manual", &err) == 0 && !exists(file_of(dir, "junk")) &&
              quarantined(dir, "junk") == 1,
          "quarantine: %s", err.msg);
    CHECK(ak_store_quarantine(st, "junk", "Bad/Reason", &err) < 0, "bad reason accepted");
    CHECK(ak_store_remove(st, "zed", &err) == 0 && !exists(file_of(dir, "zed")), "remove: %s", err.msg);
    CHECK(ak_store_remove(st, "zed", &err) == 1, "remove of a missing file");
    unlink(file_of(dir, ".hidden"));
    cache_free(&a);
    ak_store_close(st);
}

/* ------------------------------------------------------------ crash tests */

/* In a child: opens dir with the fault variables set and saves c as id. */
static void child_save(const char *dir, const uint8_t *key, const char *var, int n, const cache *c, const char *id) {
    char buf[32];
    snprintf(buf, sizeof buf, "%d", n);
    setenv(var, buf, 1);
    setenv("AK_FAULT_WRITE_CHUNK", "2048", 1);
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, key, &err);
    if (!st) _exit(3);
    int rc = ak_store_save(st, id, c->kv, c->tokens, c->n, FP, NULL, &err);
    _exit(rc == 0 ? 0 : 2);
}

/* After a save of `nw` over `old` died or failed: the file must be one of
 * them, whole, and restore byte-equal. Returns 0 old, 1 new, -1 neither. */
static int which_version(ak_test_ctx *t, const char *dir, const uint8_t *key, const char *id, const cache *old,
                         const cache *nw) {
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, key, &err);   /* removes the dead child's temp */
    if (!st) { CHECK(0, "open: %s", err.msg); return -1; }
    cache b;
    cache_empty_like(&b, old, 32);
    ak_store_load_info info;
    ak_store_status r = ak_store_load(st, id, FP, VOCAB, b.kv, &info, &err);
    int v = -1;
    if (r != AK_STORE_HIT) CHECK(0, "after a crash: %s: %s", ak_store_status_name(r), err.msg);
    else if (info.n_tokens == old->n && !memcmp(info.tokens, old->tokens, 4 * old->n) && kv_equal(old->kv, b.kv)) v = 0;
    else if (info.n_tokens == nw->n && !memcmp(info.tokens, nw->tokens, 4 * nw->n) && kv_equal(nw->kv, b.kv)) v = 1;
    else CHECK(0, "after a crash the file is neither version");
    CHECK(ak_store_verify(st, id, FP, VOCAB, &err) == AK_STORE_HIT, "verify after crash: %s", err.msg);
    CHECK(count_temps(dir) == 0, "temp files left after reopening");
    free(info.tokens);
    cache_free(&b);
    ak_store_close(st);
    return v;
}

static void crash_trials(ak_test_ctx *t, const char *name, const uint8_t *key, int *trials) {
    const char *dir = dir_for(name);
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, key, &err);
    if (!st) { CHECK(0, "open: %s", err.msg); return; }
    ak_cache_spec s = {.n_layer = 2, .n_head_kv = 2, .head_dim_k = 32, .head_dim_v = 32, .n_ctx = 128};
    cache old, nw;
    if (cache_make(&old, &s, 32, AK_KV_Q4, AK_KV_F16, 128, 40, 1) || cache_make(&nw, &s, 32, AK_KV_Q4, AK_KV_F16, 128, 70, 2)) {
        CHECK(0, "fill");
        return;
    }
    /* every step in order until the save outlives the kill (that gives the
     * step count), then random steps */
    int steps = -1, sweep[256];
    ak_rng rng;
    ak_rng_seed(&rng, 77);
    for (int i = 1; i < 250 && (steps < 0 || i <= steps + 1 + 60); i++) {
        if (ak_store_save(st, "crash", old.kv, old.tokens, old.n, FP, NULL, &err) != 0) { CHECK(0, "%s", err.msg); break; }
        int n = steps < 0 ? i : 1 + (int)(ak_rng_u32(&rng) % (uint32_t)(steps + 1));
        pid_t pid = fork();
        if (pid == 0) child_save(dir, key, "AK_FAULT_KILL_AT", n, &nw, "crash");
        int ws = 0;
        waitpid(pid, &ws, 0);
        if (!(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL)) {
            CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child at step %d: status %d", n, ws);
            if (steps < 0) steps = n - 1;
        }
        int v = which_version(t, dir, key, "crash", &old, &nw);
        if (steps < 0 || n > steps) sweep[n] = v;
        else CHECK(v == (n >= steps), "killed at step %d of %d: got version %d", n, steps, v);
        ++*trials;
    }
    /* the rename is the second-to-last step: dying at or before it keeps the
     * old file, dying at the directory fsync after it keeps the new one */
    for (int n = 1; n <= steps + 1 && n < 256; n++)
        CHECK(sweep[n] == (n >= steps), "killed at step %d of %d: got version %d", n, steps, sweep[n]);
    CHECK(steps > 8, "save took only %d steps", steps);
    cache_free(&old);
    cache_free(&nw);
    ak_store_close(st);
}

TEST(store_crash_at_every_step_leaves_old_or_new) {
    int trials = 0;
    uint8_t key[32];
    key_of(key, 9);
    crash_trials(t, "crash-plain", NULL, &trials);
    crash_trials(t, "crash-sealed", key, &trials);
    CHECK(trials >= 100, "only %d trials", trials);
    printf("  %d crash trials\n", trials);
}

TEST(store_failed_writes_keep_the_old_file) {
    const char *dir = dir_for("enospc");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = {.n_layer = 2, .n_head_kv = 2, .head_dim_k = 32, .head_dim_v = 32, .n_ctx = 128};
    cache old, nw;
    REQUIRE(cache_make(&old, &s, 32, AK_KV_Q8, AK_KV_Q8, 128, 30, 1) == 0, "fill");
    REQUIRE(cache_make(&nw, &s, 32, AK_KV_Q8, AK_KV_Q8, 128, 60, 2) == 0, "fill");
    const char *errs[] = {"ENOSPC", "EIO"};
    int steps_seen = 0;
    for (int e = 0; e < 2; e++)
        for (int n = 1; n < 100; n++) {
            REQUIRE(ak_store_save(st, "full", old.kv, old.tokens, old.n, FP, NULL, &err) == 0, "%s", err.msg);
            char spec[32];
            snprintf(spec, sizeof spec, "%d:%s", n, errs[e]);
            setenv("AK_FAULT_FAIL_AT", spec, 1);
            setenv("AK_FAULT_WRITE_CHUNK", "4096", 1);
            ak_store *f = ak_store_open(dir, NULL, &err);
            unsetenv("AK_FAULT_FAIL_AT");
            unsetenv("AK_FAULT_WRITE_CHUNK");
            REQUIRE(f, "open: %s", err.msg);
            int rc = ak_store_save(f, "full", nw.kv, nw.tokens, nw.n, FP, NULL, &err);
            ak_store_close(f);
            int v = which_version(t, dir, NULL, "full", &old, &nw);
            if (rc == 0) { /* n is past the last step */
                CHECK(v == 1, "save succeeded but the file is old");
                steps_seen = n - 1;
                break;
            }
            const char *msg = e ? "Input/output error" : "No space left on device";
            CHECK(strstr(err.msg, msg) && strstr(err.msg, "full"), "step %d: message: %s", n, err.msg);
            if (n == 2 && e == 0) printf("  e.g. %s\n", err.msg);
            /* the directory fsync (last step) fails after the rename */
            if (strstr(err.msg, "fsync of directory")) CHECK(v == 1, "step %d: new file expected", n);
            else CHECK(v == 0 && strstr(err.msg, "intact"), "step %d: old file expected (got %d): %s", n, v, err.msg);
        }
    CHECK(steps_seen > 5, "only %d steps", steps_seen);
    setenv("AK_FAULT_FAIL_AT", "x", 1);
    CHECK(ak_store_open(dir, NULL, &err) == NULL && strstr(err.msg, "AK_FAULT_FAIL_AT"), "bad fault spec accepted");
    unsetenv("AK_FAULT_FAIL_AT");
    cache_free(&old);
    cache_free(&nw);
    ak_store_close(st);
}

/* A real full disk: a 256 KiB tmpfs mounted in a private mount namespace of
 * a child (root only; skipped with a note elsewhere). */
TEST(store_real_enospc_on_small_tmpfs) {
    const char *dir = dir_for("tmpfs");
    mkdir(dir, 0700);
    int pfd[2];
    REQUIRE(pipe(pfd) == 0, "pipe");
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        char msg[600] = "skip";
        if (geteuid() != 0 || unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
            mount("tmpfs", dir, "tmpfs", 0, "size=256k") != 0) {
            if (write(pfd[1], msg, strlen(msg))) {}
            _exit(0);
        }
        ak_error err = {{0}};
        ak_cache_spec s = {.n_layer = 2, .n_head_kv = 2, .head_dim_k = 64, .head_dim_v = 64, .n_ctx = 1024};
        cache old, big, b;
        ak_store *st = ak_store_open(dir, NULL, &err);
        int ok = st && cache_make(&old, &s, 32, AK_KV_Q4, AK_KV_Q4, 1024, 100, 1) == 0 &&
                 cache_make(&big, &s, 32, AK_KV_F32, AK_KV_F32, 1024, 300, 2) == 0;   /* ~600 KB */
        ok = ok && ak_store_save(st, "disk", old.kv, old.tokens, old.n, FP, NULL, &err) == 0;
        int rc = ok ? ak_store_save(st, "disk", big.kv, big.tokens, big.n, FP, NULL, &err) : 0;
        snprintf(msg, sizeof msg, "%s", err.msg);
        ok = ok && rc < 0 && strstr(err.msg, "No space left on device") && count_temps(dir) == 0;
        ok = ok && cache_empty_like(&b, &old, 32) == 0 && ak_store_load(st, "disk", FP, VOCAB, b.kv, NULL, &err) == AK_STORE_HIT &&
             kv_equal(old.kv, b.kv);
        if (write(pfd[1], msg, strlen(msg))) {}
        _exit(ok ? 0 : 1);
    }
    close(pfd[1]);
    char msg[600] = {0};
    ssize_t k = read(pfd[0], msg, sizeof msg - 1);
    close(pfd[0]);
    int ws = 0;
    waitpid(pid, &ws, 0);
    if (k > 0 && !strcmp(msg, "skip"))
        SKIP("cannot mount a tmpfs here (needs root and mount namespaces); ENOSPC covered by fault injection");
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "real ENOSPC: old file not intact or unclear error: %s", msg);
    printf("  e.g. %s\n", msg);
}

/* ------------------------------------------------------------ error codes */

/* Each kind of failure carries its code (callers branch on it, never on the
 * message): invalid ids, a full disk, an I/O error, absent, stale and
 * corrupt files, and plain ak_fail. */
TEST(store_errors_carry_codes) {
    ak_error err = {{0}};
    CHECK(err.code == AK_ERR_NONE, "a zeroed error has code %d", err.code);
    ak_fail(&err, "x");
    CHECK(err.code == AK_ERR_GENERIC, "ak_fail: code %d", err.code);
    ak_failc(&err, AK_ERR_BUSY, "y %d", 1);
    CHECK(err.code == AK_ERR_BUSY && !strcmp(err.msg, "y 1"), "ak_failc: code %d msg %s", err.code, err.msg);
    CHECK(!strcmp(ak_err_code_name(AK_ERR_KV_BUDGET), "kv-budget") && !strcmp(ak_err_code_name(-1), "?"), "names");

    const char *dir = dir_for("codes");
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = {.n_layer = 2, .n_head_kv = 1, .head_dim_k = 16, .head_dim_v = 16, .n_ctx = 64};
    cache a, b;
    REQUIRE(cache_make(&a, &s, 32, AK_KV_F16, AK_KV_F16, 64, 20, 3) == 0, "fill");
    REQUIRE(cache_empty_like(&b, &a, 32) == 0, "empty");
    err.code = 0;
    CHECK(ak_store_save(st, "../x", a.kv, a.tokens, a.n, FP, NULL, &err) < 0 && err.code == AK_ERR_INVALID,
          "invalid id: code %d", err.code);
    CHECK(ak_store_load(st, "nobody", FP, VOCAB, b.kv, NULL, &err) == AK_STORE_ABSENT && err.code == AK_ERR_NOT_FOUND,
          "absent: code %d", err.code);
    REQUIRE(ak_store_save(st, "c", a.kv, a.tokens, a.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    CHECK(ak_store_load(st, "c", "another-model", VOCAB, b.kv, NULL, &err) == AK_STORE_STALE && err.code == AK_ERR_STALE,
          "stale: code %d", err.code);
    const char *errs[] = {"ENOSPC", "EDQUOT", "EIO"};
    const int codes[] = {AK_ERR_NOSPACE, AK_ERR_NOSPACE, AK_ERR_IO};
    for (int i = 0; i < 3; i++) {
        char spec[32];
        snprintf(spec, sizeof spec, "2:%s", errs[i]);
        setenv("AK_FAULT_FAIL_AT", spec, 1);
        ak_store *f = ak_store_open(dir, NULL, &err);
        unsetenv("AK_FAULT_FAIL_AT");
        REQUIRE(f, "open: %s", err.msg);
        err.code = 0;
        CHECK(ak_store_save(f, "c", a.kv, a.tokens, a.n, FP, NULL, &err) < 0 && err.code == codes[i],
              "%s: code %d (%s)", errs[i], err.code, err.msg);
        ak_store_close(f);
    }
    REQUIRE(write_bytes(file_of(dir, "c"), "garbage, not a safetensors file", 31) == 0, "write");
    CHECK(ak_store_load(st, "c", FP, VOCAB, b.kv, NULL, &err) == AK_STORE_CORRUPT && err.code == AK_ERR_CORRUPT,
          "corrupt: code %d", err.code);
    quarantined(dir, "c");
    cache_free(&a);
    cache_free(&b);
    ak_store_close(st);
}

/* An agent id may contain ".safetensors.tmp.": its file must not be taken
 * for a stale temp file (and deleted) when the store is next opened, with a
 * dead pid in the name or an old mtime. Temp files of saves in flight are
 * named so that no id can produce them. */
TEST(store_temp_names_cannot_collide_with_ids) {
    const char *dir = dir_for("tmpids");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char id_dead[64], id_old[64];
    snprintf(id_dead, sizeof id_dead, "x.safetensors.tmp.%d.2", (int)dead);
    snprintf(id_old, sizeof id_old, "y.safetensors.tmp.%d.1", (int)getpid());
    ak_cache_spec s = {.n_layer = 2, .n_head_kv = 1, .head_dim_k = 16, .head_dim_v = 16, .n_ctx = 64};
    cache a, b;
    REQUIRE(cache_make(&a, &s, 32, AK_KV_F16, AK_KV_F16, 64, 20, 3) == 0, "fill");
    REQUIRE(ak_agent_id_valid(id_dead) && ak_agent_id_valid(id_old), "ids rejected");
    REQUIRE(ak_store_save(st, id_dead, a.kv, a.tokens, a.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    REQUIRE(ak_store_save(st, id_old, a.kv, a.tokens, a.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    struct timespec old[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
    REQUIRE(utimensat(AT_FDCWD, file_of(dir, id_old), old, 0) == 0, "utimensat");
    char tmp_dead[700];   /* a temp file of today's naming, left by a dead save */
    snprintf(tmp_dead, sizeof tmp_dead, "%s/.%s.safetensors.tmp.%d.3", dir, id_dead, (int)dead);
    REQUIRE(write_bytes(tmp_dead, "x", 1) == 0, "write");
    ak_store_close(st);
    st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "reopen: %s", err.msg);
    CHECK(!exists(tmp_dead), "a stale temp file was kept");
    CHECK(exists(file_of(dir, id_dead)), "the file of agent %s was removed as a stale temp", id_dead);
    CHECK(exists(file_of(dir, id_old)), "the file of agent %s was removed as a stale temp", id_old);
    REQUIRE(cache_empty_like(&b, &a, 32) == 0, "empty");
    CHECK(ak_store_load(st, id_dead, FP, VOCAB, b.kv, NULL, &err) == AK_STORE_HIT && kv_equal(a.kv, b.kv),
          "load %s: %s", id_dead, err.msg);
    CHECK(ak_store_load(st, id_old, FP, VOCAB, b.kv, NULL, &err) == AK_STORE_HIT && kv_equal(a.kv, b.kv),
          "load %s: %s", id_old, err.msg);
    ak_store_entry *es;
    int n;
    REQUIRE(ak_store_list(st, &es, &n, &err) == 0, "list: %s", err.msg);
    CHECK(n == 2, "list has %d entries, expected the 2 agents", n);
    free(es);
    cache_free(&a);
    cache_free(&b);
    ak_store_close(st);
}

/* Fault injection is compiled into the test binary only: the shipped
 * binary (AK_BIN) saves an agent normally with AK_FAULT_FAIL_AT set (in
 * the test build the first step of every save would fail) and does not
 * even parse the variable. */
TEST(store_release_binary_ignores_fault_injection) {
    const char *bin = getenv("AK_BIN");
    if (!bin || !*bin) bin = "build/agentkv";
    char dir[512], model[512], cmd[2048];
    snprintf(dir, sizeof dir, "%s/release-faults", test_tmp_dir());
    test_path(model, sizeof model, "models/stories260K.gguf");
    const char *specs[] = {"1", "1:EIO", "not-a-number"};
    for (int i = 0; i < 3; i++) {
        char id[16];
        snprintf(id, sizeof id, "rel%d", i);
        snprintf(cmd, sizeof cmd,
                 "AK_FAULT_FAIL_AT='%s' AK_FAULT_KILL_AT=1 timeout 60 %s run -m %s --agent %s --memory-dir %s -p 'Once upon' "
                 "-n 2 --temp 0 > /dev/null 2>&1 < /dev/null",
                 specs[i], bin, model, id, dir);
        int st = system(cmd);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "AK_FAULT_FAIL_AT=%s: agentkv run exited with status %d", specs[i],
              st);
        CHECK(exists(file_of(dir, id)), "AK_FAULT_FAIL_AT=%s: the agent file was not saved", specs[i]);
    }
}

/* ------------------------------------------------------------------ keys */

/* A key file that group or others may read or write is refused (as ssh
 * refuses such private keys), naming its mode; the mode bits decide, so
 * root (who passes any access check) is refused too. */
TEST(store_key_file_must_be_private) {
    const char *dir = dir_for("keymode");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_store_close(st);
    char path[600];
    snprintf(path, sizeof path, "%s/key", dir);
    uint8_t buf[32] = {7}, key[32];
    REQUIRE(write_bytes(path, buf, 32) == 0, "write");
    const mode_t bad[] = {0644, 0640, 0604, 0620, 0602, 0660, 0666, 0610};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        REQUIRE(chmod(path, bad[i]) == 0, "chmod");
        err.code = 0;
        int rc = ak_store_read_key(path, key, &err);
        char mode[8];
        snprintf(mode, sizeof mode, "%04o", (unsigned)bad[i]);
        CHECK(rc < 0 && err.code == AK_ERR_PERMISSION && strstr(err.msg, mode) && strstr(err.msg, path),
              "mode %s accepted or unclear (code %d): %s", mode, err.code, err.msg);
    }
    const mode_t good[] = {0600, 0400};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        REQUIRE(chmod(path, good[i]) == 0, "chmod");
        CHECK(ak_store_read_key(path, key, &err) == 0 && key[0] == 7, "mode %04o refused: %s", (unsigned)good[i],
              err.msg);
    }
}

/* A sealed file is bound to its agent id (in the authenticated data): the
 * file of one agent copied to another's name fails authentication (CORRUPT,
 * quarantined as "seal") before anything is decrypted for the reader; a
 * version 1 sealed file (not bound) is STALE and left in place. */
TEST(store_sealed_file_is_bound_to_its_agent_id) {
    const char *dir = dir_for("sealbind");
    ak_error err = {{0}};
    uint8_t k1[32];
    key_of(k1, 5);
    ak_store *st = ak_store_open(dir, k1, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache a, b;
    REQUIRE(cache_make(&a, &s, 32, AK_KV_Q8, AK_KV_Q8, 100, 40, 9) == 0, "fill");
    REQUIRE(cache_empty_like(&b, &a, 32) == 0, "empty");
    REQUIRE(ak_store_save(st, "alice", a.kv, a.tokens, a.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    size_t len;
    uint8_t *img = (uint8_t *)ak_read_file(file_of(dir, "alice"), &len, &err);
    REQUIRE(img, "read: %s", err.msg);
    uint32_t version = (uint32_t)img[8] | (uint32_t)img[9] << 8 | (uint32_t)img[10] << 16 | (uint32_t)img[11] << 24;
    CHECK(version == 2, "sealed format version %u, expected 2", version);
    REQUIRE(write_bytes(file_of(dir, "bob"), img, len) == 0, "write");
    ak_store_status r = ak_store_load(st, "bob", FP, VOCAB, b.kv, NULL, &err);
    CHECK(r == AK_STORE_CORRUPT && err.code == AK_ERR_CORRUPT && strstr(err.msg, "authentication failed"),
          "alice's file as bob's: %s: %s", ak_store_status_name(r), err.msg);
    CHECK(ak_kv_length(b.kv) == 0, "a renamed file reached the sequence");
    char qd[700], q[1400];
    snprintf(qd, sizeof qd, "%s/quarantine", dir);
    int seal_reason = 0;
    DIR *d = opendir(qd);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strncmp(e->d_name, "bob.safetensors.seal.", 21)) seal_reason = 1;
        snprintf(q, sizeof q, "%s/%s", qd, e->d_name);
        if (e->d_name[0] != '.') unlink(q);
    }
    if (d) closedir(d);
    CHECK(seal_reason, "the renamed file was not quarantined for a failed seal");
    CHECK(ak_store_load(st, "alice", FP, VOCAB, b.kv, NULL, &err) == AK_STORE_HIT && kv_equal(a.kv, b.kv),
          "alice's own file: %s", err.msg);
    /* version 1 (the id not authenticated): a miss, left in place */
    img[8] = 1;
    REQUIRE(write_bytes(file_of(dir, "carol"), img, len) == 0, "write");
    r = ak_store_load(st, "carol", FP, VOCAB, b.kv, NULL, &err);
    CHECK(r == AK_STORE_STALE && strstr(err.msg, "version 1") && exists(file_of(dir, "carol")),
          "version 1 sealed file: %s: %s", ak_store_status_name(r), err.msg);
    free(img);
    cache_free(&a);
    cache_free(&b);
    ak_store_close(st);
}

/* ----------------------------------------------------------------- index */

/* Lists come from the index, not the files: a file changed behind the
 * store's back (its header now garbage) is not re-read by ak_store_list or
 * ak_store_lookup, while the store's own saves and removals show at once;
 * a reopened store sees the change. */
TEST(store_list_reads_no_file) {
    const char *dir = dir_for("index");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = {.n_layer = 2, .n_head_kv = 1, .head_dim_k = 16, .head_dim_v = 16, .n_ctx = 64};
    cache a;
    REQUIRE(cache_make(&a, &s, 32, AK_KV_F16, AK_KV_F16, 64, 20, 3) == 0, "fill");
    REQUIRE(ak_store_save(st, "a", a.kv, a.tokens, 20, FP, "m", &err) == 0, "save: %s", err.msg);
    REQUIRE(ak_store_save(st, "b", a.kv, a.tokens, 7, FP, "m", &err) == 0, "save: %s", err.msg);
    REQUIRE(write_bytes(file_of(dir, "a"), "garbage behind the store's back", 31) == 0, "write");
    ak_store_entry *es;
    int n;
    REQUIRE(ak_store_list(st, &es, &n, &err) == 0, "list: %s", err.msg);
    CHECK(n == 2 && es[0].readable && es[0].n_tokens == 20 && es[1].n_tokens == 7 && es[0].bytes > 31,
          "list re-read a file: %d entries, a: readable %d, %d tokens, %llu bytes", n, n ? es[0].readable : -1,
          n ? es[0].n_tokens : -1, n ? (unsigned long long)es[0].bytes : 0ULL);
    free(es);
    ak_store_entry e;
    CHECK(ak_store_lookup(st, "a", &e) == 0 && e.n_tokens == 20 && !strcmp(e.model_name, "m"), "lookup");
    CHECK(ak_store_lookup(st, "zz", &e) == 1, "lookup of an unknown id");
    CHECK(ak_store_remove(st, "b", &err) == 0 && ak_store_lookup(st, "b", &e) == 1, "removed file still indexed");
    ak_store_close(st);
    st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "reopen: %s", err.msg);
    REQUIRE(ak_store_list(st, &es, &n, &err) == 0, "list: %s", err.msg);
    CHECK(n == 1 && !es[0].readable && es[0].bytes == 31, "after reopening: %d entries", n);
    free(es);
    cache_free(&a);
    ak_store_close(st);
}

/* Counts the files in dir/quarantine. */
static int count_quarantine(const char *dir) {
    char qd[700];
    snprintf(qd, sizeof qd, "%s/quarantine", dir);
    DIR *d = opendir(qd);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* The disk budget counts quarantined files, and gc deletes them (oldest
 * first) before any agent's file; quarantine/ itself keeps at most
 * AK_STORE_QUARANTINE_MAX files, the newest. */
TEST(store_gc_counts_quarantine_and_quarantine_is_bounded) {
    const char *dir = dir_for("gcq");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = {.n_layer = 2, .n_head_kv = 1, .head_dim_k = 16, .head_dim_v = 16, .n_ctx = 64};
    cache a, b;
    REQUIRE(cache_make(&a, &s, 32, AK_KV_F16, AK_KV_F16, 64, 30, 3) == 0, "fill");
    REQUIRE(cache_empty_like(&b, &a, 32) == 0, "empty");
    uint64_t size = 0;
    for (int i = 0; i < 3; i++) {
        char id[16];
        snprintf(id, sizeof id, "k%d", i);
        REQUIRE(ak_store_save(st, id, a.kv, a.tokens, a.n, FP, NULL, &err) == 0, "save: %s", err.msg);
        struct stat sb;
        stat(file_of(dir, id), &sb);
        size = (uint64_t)sb.st_size;
    }
    /* two corrupt files of the agent's size, quarantined by loads */
    uint8_t *junk = calloc(1, (size_t)size);
    for (int i = 0; i < 2; i++) {
        char id[16];
        snprintf(id, sizeof id, "bad%d", i);
        REQUIRE(write_bytes(file_of(dir, id), junk, (size_t)size) == 0, "write");
        CHECK(ak_store_load(st, id, FP, VOCAB, b.kv, NULL, &err) == AK_STORE_CORRUPT, "junk loaded: %s", err.msg);
    }
    REQUIRE(count_quarantine(dir) == 2, "%d files in quarantine", count_quarantine(dir));
    uint64_t left = 0;
    int removed = ak_store_gc(st, 4 * size, &left, &err);
    CHECK(removed == 1 && left == 4 * size && count_quarantine(dir) == 1, "gc to 4 files: removed %d, left %llu, "
          "%d quarantined", removed, (unsigned long long)left, count_quarantine(dir));
    for (int i = 0; i < 3; i++) {
        char id[16];
        snprintf(id, sizeof id, "k%d", i);
        CHECK(exists(file_of(dir, id)), "agent file %s deleted while quarantined files were left", id);
    }
    removed = ak_store_gc(st, 3 * size, &left, &err);
    CHECK(removed == 1 && left == 3 * size && count_quarantine(dir) == 0, "gc to 3 files: removed %d", removed);
    /* the bound: more corrupt files than it allows, one at a time */
    int extra = AK_STORE_QUARANTINE_MAX + 5;
    for (int i = 0; i < extra; i++) {
        char id[16];
        snprintf(id, sizeof id, "q%03d", i);
        REQUIRE(write_bytes(file_of(dir, id), "junk", 4) == 0, "write");
        CHECK(ak_store_quarantine(st, id, "test", &err) == 0, "quarantine: %s", err.msg);
    }
    CHECK(count_quarantine(dir) == AK_STORE_QUARANTINE_MAX, "%d files in quarantine, bound %d",
          count_quarantine(dir), AK_STORE_QUARANTINE_MAX);
    /* the oldest went first: q000..q004 are gone, the newest is there */
    CHECK(quarantined(dir, "q000") == 0 && quarantined(dir, "q004") == 0 && quarantined(dir, "q005") == 1,
          "not the oldest quarantined files were deleted");
    free(junk);
    cache_free(&a);
    cache_free(&b);
    ak_store_close(st);
}

/* A snapshot is plaintext of what a sealed store encrypts: freeing it wipes
 * its buffers. Seen through the allocator: a block of the data's size
 * allocated right after the free is (with glibc's per-size caches) the
 * same memory, and must not hold the cache's values any more. A sanitizer's
 * allocator hands out other memory, where the check could not fail: skipped
 * there. */
#if defined(__SANITIZE_ADDRESS__)
#define AK_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AK_TEST_ASAN 1
#endif
#endif
TEST(store_snapshot_free_wipes_plaintext) {
#ifdef AK_TEST_ASAN
    SKIP("the sanitizer's allocator does not hand freed memory back at once");
#endif
    ak_cache_spec s = {.n_layer = 1, .n_head_kv = 1, .head_dim_k = 16, .head_dim_v = 16, .n_ctx = 64};
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&s, 32, 0, &err);
    ak_kv *kv = pool ? ak_kv_new(pool, AK_KV_F32, AK_KV_F32, 64, &err) : NULL;
    REQUIRE(kv, "%s", err.msg);
    const float mark = 1234.5f;
    float k[16], v[16];
    for (int i = 0; i < 16; i++) k[i] = v[i] = mark;
    int32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    REQUIRE(ak_kv_prepare(kv, 0, 8, &err) == 0, "%s", err.msg);
    for (int p = 0; p < 8; p++) REQUIRE(ak_kv_write(kv, 0, p, k, v, &err) == 0, "%s", err.msg);
    int found = 0, tried = 0;
    for (int round = 0; round < 4; round++) {
        ak_snapshot *sn = ak_store_snapshot("w", kv, tokens, 8, FP, NULL, &err);
        REQUIRE(sn, "%s", err.msg);
        size_t data = ak_snapshot_bytes(sn) - 8 * 8 - 4096;
        ak_snapshot_free(sn);
        uint8_t *p = malloc(data);
        REQUIRE(p, "malloc");
        tried++;
        for (size_t i = 16; i + 4 <= data; i += 4) found += !memcmp(p + i, &mark, 4);
        free(p);
    }
    CHECK(found == 0, "%d cached values still in freed snapshot memory (%d rounds)", found, tried);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
}
