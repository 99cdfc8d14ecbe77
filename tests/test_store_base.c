/* test_store_base.c - agent file format 4: per-block checksums (recomputed
 * here from the file's tensors, independently of the store), loads that
 * skip the blocks a prelink callback supplied from RAM (a corrupt block is
 * caught when read and not read when supplied; bytes_read counts only what
 * was read) on the direct, the other-block-size and the sealed paths, and
 * files whose sequence starts with a pool's shared base: only the own
 * blocks in the file, a restore equal at every position, a base without a
 * prelink or a failing prelink is a miss (STALE), the index carries the
 * base. */
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include "store/store.h"
#include "test.h"
#include "test_store_util.h"

/* A file's bytes, header length and parsed header (free both). */
typedef struct {
    uint8_t *img;
    size_t len;
    uint64_t N;
    cJSON *root;
} file_image;

static int image_read(const char *path, file_image *f) {
    ak_error err = {{0}};
    memset(f, 0, sizeof *f);
    f->img = (uint8_t *)ak_read_file(path, &f->len, &err);
    if (!f->img || f->len < 8) return -1;
    for (int i = 7; i >= 0; i--) f->N = f->N << 8 | f->img[i];
    if (8 + f->N > f->len) return -1;
    f->root = cJSON_ParseWithLength((const char *)f->img + 8, (size_t)f->N);
    return f->root ? 0 : -1;
}

static void image_free(file_image *f) {
    cJSON_Delete(f->root);
    free(f->img);
    memset(f, 0, sizeof *f);
}

static const char *meta_of(const file_image *f, const char *key) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(f->root, "__metadata__");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The i-th tensor of the header (in file order): its data offsets and
 * leading dimension. Returns 0, or -1 if there is none. */
static int tensor_at(const file_image *f, int i, uint64_t *b, uint64_t *e, int *nb) {
    int k = 0;
    for (const cJSON *t = f->root->child; t; t = t->next) {
        if (!strcmp(t->string, "__metadata__")) continue;
        if (k++ != i) continue;
        const cJSON *of = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
        *b = (uint64_t)cJSON_GetArrayItem(of, 0)->valuedouble;
        *e = (uint64_t)cJSON_GetArrayItem(of, 1)->valuedouble;
        *nb = cJSON_GetArrayItem(sh, 0)->valueint;
        return 0;
    }
    return -1;
}

/* The block checksums the format defines, computed from the file's bytes:
 * block b's is XXH3-64 of the 8-byte little-endian XXH3-64 of each tensor's
 * b-th piece (1/nb of its bytes), tensors in header order; as the metadata
 * string ("h,h,..."). */
static char *expected_block_sums(const file_image *f) {
    int nt = 0, nb = 0;
    uint64_t b, e;
    while (tensor_at(f, nt, &b, &e, &nb) == 0) nt++;
    char *out = calloc((size_t)nb * 17 + 1, 1);
    uint8_t *buf = malloc((size_t)nt * 8 + 1);
    for (int blk = 0; blk < nb; blk++) {
        for (int i = 0; i < nt; i++) {
            int n2;
            tensor_at(f, i, &b, &e, &n2);
            uint64_t piece = (e - b) / (uint64_t)n2;
            uint64_t h = XXH3_64bits(f->img + 8 + f->N + b + (uint64_t)blk * piece, (size_t)piece);
            for (int k = 0; k < 8; k++) buf[i * 8 + k] = (uint8_t)(h >> (8 * k));
        }
        snprintf(out + strlen(out), 18, "%s%016llx", blk ? "," : "", (unsigned long long)XXH3_64bits(buf, (size_t)nt * 8));
    }
    free(buf);
    return out;
}

/* A prelink callback for the tests: attaches the file's base from base_src
 * (when the file has one), then links link_blocks own blocks of link_src
 * (spans after its base), or fails with fail_code. */
typedef struct {
    const ak_kv *base_src;
    const ak_kv *link_src;
    int link_blocks;
    int fail_code;
    int wrong_base;          /* attach this many positions instead (a faulty callback) */
    int calls;
    ak_store_base seen;
    int n_seen;
} prelink_ctx;

static int test_prelink(void *ud, const ak_store_base *base, const int32_t *tokens, int n, ak_kv *kv, ak_error *err) {
    prelink_ctx *c = ud;
    c->calls++;
    c->seen = *base;
    c->n_seen = n;
    (void)tokens;
    if (c->fail_code) return ak_failc(err, c->fail_code, "pool %s is gone", base->pool_id);
    int bl = c->wrong_base ? c->wrong_base : base->base_len;
    if (bl > 0 && ak_kv_attach_base(kv, c->base_src, bl, err) != 0) return -1;
    if (!c->link_src) return 0;
    int T = ak_block_pool_block_tokens(ak_kv_pool(c->link_src)), kb = ak_kv_base_len(c->link_src);
    for (int j = 0; j < c->link_blocks; j++) {
        int start, count;
        ak_block *b = ak_kv_span(c->link_src, (kb + T - 1) / T + j, &start, &count);
        if (!b || start != ak_kv_length(kv)) return ak_failc(err, AK_ERR_INVALID, "no own block %d to link", j);
        if (ak_kv_link(kv, b, err) != 0) return -1;
    }
    return 0;
}

/* Flips one byte in the middle of block blk of tensor ti of the file. */
static int flip_block(const char *path, int ti, int blk) {
    file_image f;
    if (image_read(path, &f) != 0) return -1;
    uint64_t b, e;
    int nb;
    int rc = tensor_at(&f, ti, &b, &e, &nb);
    if (rc == 0) {
        uint64_t piece = (e - b) / (uint64_t)nb;
        f.img[8 + f.N + b + (uint64_t)blk * piece + piece / 2] ^= 0x21;
        rc = write_bytes(path, f.img, f.len);
    }
    image_free(&f);
    return rc;
}

/* Version 4 files carry one checksum per block, equal to the definition
 * recomputed here; round trips are exact; zero tokens give "". */
TEST(store_v4_block_checksums_match_the_definition) {
    const char *dir = dir_for("v4sums");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    const int lens[] = {200, 32, 1, 0};
    for (int k = 0; k < 4; k++) {
        cache a, b;
        REQUIRE(cache_make(&a, &s, 32, AK_KV_Q8, AK_KV_TQ3, 256, lens[k], 40 + k) == 0, "fill");
        REQUIRE(ak_store_save(st, "v4", a.kv, a.tokens, a.n, FP, "m", &err) == 0, "save: %s", err.msg);
        file_image f;
        REQUIRE(image_read(file_of(dir, "v4"), &f) == 0, "read");
        const char *ver = meta_of(&f, "format_version"), *sums = meta_of(&f, "block_checksums");
        char *want = expected_block_sums(&f);
        int nb = (lens[k] + 31) / 32;
        CHECK(ver && !strcmp(ver, "5"), "format_version %s", ver ? ver : "none");
        CHECK(sums && !strcmp(sums, want) && strlen(sums) == (size_t)(nb ? nb * 17 - 1 : 0),
              "%d tokens: block_checksums \"%.60s\", recomputed \"%.60s\"", lens[k], sums ? sums : "none", want);
        CHECK(!meta_of(&f, "checksums") && !meta_of(&f, "base_len") && !meta_of(&f, "pool_id"),
              "version 3 checksums or a base in a plain file");
        free(want);
        image_free(&f);
        REQUIRE(cache_empty_like(&b, &a, 32) == 0, "empty");
        ak_store_load_info info;
        CHECK(ak_store_load(st, "v4", FP, VOCAB, b.kv, &info, &err) == AK_STORE_HIT && kv_equal(a.kv, b.kv) &&
                  info.linked == 0 && info.base.pool_id[0] == 0,
              "%d tokens: %s", lens[k], err.msg);
        free(info.tokens);
        cache_free(&b);
        cache_free(&a);
    }
    ak_store_close(st);
}

/* A corrupt block is CORRUPT when it is read, but a prelink that supplies
 * the blocks up to and past it makes the load a hit that reads none of
 * them: bytes_read is the header plus exactly the blocks read. Direct path
 * (same block size), the other-block-size path, and a sealed file. */
TEST(store_prelinked_blocks_are_not_read) {
    const char *dir = dir_for("prelink");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache a;
    enum { N = 200, NB = 7 };
    REQUIRE(cache_make(&a, &s, 32, AK_KV_Q8, AK_KV_Q4, 256, N, 77) == 0, "fill");
    REQUIRE(ak_store_save(st, "p", a.kv, a.tokens, a.n, FP, "m", &err) == 0, "save: %s", err.msg);
    file_image f;
    REQUIRE(image_read(file_of(dir, "p"), &f) == 0, "read");
    uint64_t hdr = 8 + f.N, data = f.len - hdr;
    REQUIRE(data % NB == 0, "data of %llu bytes is not %d blocks", (unsigned long long)data, NB);
    /* the whole intact file, no prelink: everything read */
    ak_kv *kv = ak_kv_new(a.pool, AK_KV_Q8, AK_KV_Q4, 256, &err);
    ak_store_load_info info;
    CHECK(ak_store_load(st, "p", FP, VOCAB, kv, &info, &err) == AK_STORE_HIT && info.bytes_read == f.len,
          "intact: %s, %llu of %zu bytes", err.msg, (unsigned long long)info.bytes_read, f.len);
    free(info.tokens);
    ak_kv_free(kv);
    /* a prelink that links blocks of a (same pool) but does nothing else */
    REQUIRE(flip_block(file_of(dir, "p"), 5, 2) == 0, "flip");
    size_t bad_len;
    uint8_t *bad = (uint8_t *)ak_read_file(file_of(dir, "p"), &bad_len, &err);
    REQUIRE(bad, "read");
    for (int linked = 0; linked < NB; linked++) {   /* whole blocks only: the last is partial */
        REQUIRE(write_bytes(file_of(dir, "p"), bad, bad_len) == 0, "write");
        kv = ak_kv_new(a.pool, AK_KV_Q8, AK_KV_Q4, 256, &err);
        prelink_ctx pc = {.link_src = a.kv, .link_blocks = linked};
        ak_store_status r = ak_store_load_linked(st, &(ak_store_load_args){.id = "p", .fingerprint = FP, .vocab = VOCAB,
                                                 .kv = kv, .prelink = test_prelink, .ud = &pc}, &info, &err);
        int L = linked * 32;
        if (linked <= 2) {   /* block 2 is read: caught, quarantined, kv untouched */
            CHECK(r == AK_STORE_CORRUPT && strstr(err.msg, "block 2 (positions 64..95;") && quarantined(dir, "p") == 1 &&
                      ak_kv_length(kv) == 0,
                  "%d blocks linked: %s %s", linked, ak_store_status_name(r), err.msg);
        } else {
            uint64_t want = hdr + data / NB * (uint64_t)(NB - linked);
            CHECK(r == AK_STORE_HIT && kv_equal(a.kv, kv) && info.linked == L && info.n_tokens == N &&
                      info.bytes_read == want && pc.calls == 1 && pc.n_seen == N,
                  "%d blocks linked: %s %s; linked %d, %llu bytes read, expected %llu", linked,
                  ak_store_status_name(r), err.msg, info.linked, (unsigned long long)info.bytes_read,
                  (unsigned long long)want);
            free(info.tokens);
        }
        ak_kv_free(kv);
    }
    /* a full budget: room for a's 7 blocks and the 4 blocks past 3 linked
     * ones, but not while the caller's sequence still holds its old block:
     * the image is read (blocks 3..6 only) and verified first, then the
     * sequence emptied and filled */
    REQUIRE(write_bytes(file_of(dir, "p"), bad, bad_len) == 0, "write");
    size_t bb = ak_block_pool_block_bytes(a.pool, AK_KV_Q8, AK_KV_Q4);
    kv = ak_kv_new(a.pool, AK_KV_Q8, AK_KV_Q4, 256, &err);
    float zk[2 * 64] = {0}, zv[2 * 32] = {0};
    REQUIRE(kv && ak_kv_prepare(kv, 0, 1, &err) == 0 && ak_kv_write(kv, 0, 0, zk, zv, &err) == 0, "%s", err.msg);
    {   /* the control: one block less is too little even with the sequence emptied */
        ak_block_pool_set_budget(a.pool, (NB + 3) * bb);
        prelink_ctx pc = {.link_src = a.kv, .link_blocks = 3};
        ak_store_status r = ak_store_load_linked(st, &(ak_store_load_args){.id = "p", .fingerprint = FP, .vocab = VOCAB,
                                                 .kv = kv, .prelink = test_prelink, .ud = &pc}, &info, &err);
        CHECK(r == AK_STORE_ERROR && err.code == AK_ERR_KV_BUDGET && ak_kv_length(kv) == 0 && exists(file_of(dir, "p")),
              "budget of %d blocks: %s %s", NB + 3, ak_store_status_name(r), err.msg);
        REQUIRE(ak_kv_prepare(kv, 0, 1, &err) == 0 && ak_kv_write(kv, 0, 0, zk, zv, &err) == 0, "%s", err.msg);
    }
    ak_block_pool_set_budget(a.pool, (NB + 4) * bb);
    {
        prelink_ctx pc = {.link_src = a.kv, .link_blocks = 3};
        ak_store_status r = ak_store_load_linked(st, &(ak_store_load_args){.id = "p", .fingerprint = FP, .vocab = VOCAB,
                                                 .kv = kv, .prelink = test_prelink, .ud = &pc}, &info, &err);
        uint64_t want = hdr + data / NB * (uint64_t)(NB - 3);
        CHECK(r == AK_STORE_HIT && kv_equal(a.kv, kv) && info.linked == 96 && info.bytes_read == want,
              "full budget, 3 blocks linked: %s %s; %llu bytes read, expected %llu", ak_store_status_name(r), err.msg,
              (unsigned long long)info.bytes_read, (unsigned long long)want);
        if (r == AK_STORE_HIT) free(info.tokens);
    }
    ak_block_pool_set_budget(a.pool, 0);
    ak_kv_free(kv);
    /* another block size (16): the prelink links 16-position blocks of a
     * sequence restored there before; the file's block 1 is corrupt */
    REQUIRE(ak_store_save(st, "p", a.kv, a.tokens, a.n, FP, "m", &err) == 0, "save: %s", err.msg);
    ak_block_pool *p16 = ak_block_pool_new(&s, 16, 0, &err);
    ak_kv *ref = p16 ? ak_kv_new(p16, AK_KV_Q8, AK_KV_Q4, 256, &err) : NULL;
    REQUIRE(ref && ak_store_load(st, "p", FP, VOCAB, ref, NULL, &err) == AK_STORE_HIT && kv_equal(a.kv, ref),
            "restore into blocks of 16: %s", err.msg);
    REQUIRE(flip_block(file_of(dir, "p"), 0, 1) == 0, "flip");
    free(bad);
    bad = (uint8_t *)ak_read_file(file_of(dir, "p"), &bad_len, &err);
    REQUIRE(bad, "read");
    const int links16[] = {0, 2, 3, 4, 12};
    for (int k = 0; k < 5; k++) {
        REQUIRE(write_bytes(file_of(dir, "p"), bad, bad_len) == 0, "write");
        kv = ak_kv_new(p16, AK_KV_Q8, AK_KV_Q4, 256, &err);
        prelink_ctx pc = {.link_src = ref, .link_blocks = links16[k]};
        ak_store_status r = ak_store_load_linked(st, &(ak_store_load_args){.id = "p", .fingerprint = FP, .vocab = VOCAB,
                                                 .kv = kv, .prelink = test_prelink, .ud = &pc}, &info, &err);
        int L = links16[k] * 16, j0 = L / 32;   /* file blocks before j0 are not read */
        if (j0 <= 1) {
            CHECK(r == AK_STORE_CORRUPT && strstr(err.msg, "block 1 (positions 32..63;") && quarantined(dir, "p") == 1,
                  "blocks of 16, %d linked: %s %s", links16[k], ak_store_status_name(r), err.msg);
        } else {
            uint64_t want = hdr + data / NB * (uint64_t)(NB - j0);
            CHECK(r == AK_STORE_HIT && kv_equal(a.kv, kv) && info.linked == L && info.bytes_read == want,
                  "blocks of 16, %d linked: %s %s; %llu bytes read, expected %llu", links16[k],
                  ak_store_status_name(r), err.msg, (unsigned long long)info.bytes_read, (unsigned long long)want);
            free(info.tokens);
        }
        ak_kv_free(kv);
    }
    ak_kv_free(ref);
    ak_block_pool_free(p16);
    free(bad);
    image_free(&f);
    ak_store_close(st);
    /* sealed: the seal is read whole, but the linked positions are kept */
    uint8_t key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(3 * i + 1);
    st = ak_store_open(dir_for("prelink-sealed"), key, &err);
    REQUIRE(st, "open: %s", err.msg);
    REQUIRE(ak_store_save(st, "p", a.kv, a.tokens, a.n, FP, "m", &err) == 0, "save: %s", err.msg);
    kv = ak_kv_new(a.pool, AK_KV_Q8, AK_KV_Q4, 256, &err);
    prelink_ctx pc = {.link_src = a.kv, .link_blocks = 3};
    CHECK(ak_store_load_linked(st, &(ak_store_load_args){.id = "p", .fingerprint = FP, .vocab = VOCAB, .kv = kv,
                               .prelink = test_prelink, .ud = &pc}, &info, &err) == AK_STORE_HIT &&
              kv_equal(a.kv, kv) && info.linked == 96,
          "sealed, 3 blocks linked: %s", err.msg);
    /* the linked blocks are a's own (shared), the rest were read */
    int start, count;
    CHECK(ak_kv_span(kv, 2, &start, &count) == ak_kv_span(a.kv, 2, &start, &count) &&
              ak_kv_span(kv, 3, &start, &count) != ak_kv_span(a.kv, 3, &start, &count),
          "the linked blocks were not kept");
    free(info.tokens);
    ak_kv_free(kv);
    ak_store_close(st);
    cache_free(&a);
}

/* A sequence that starts with a pool's base: the file holds only the own
 * positions (4 blocks of 32 for 100 own positions after a base of 70) and
 * records the base; a restore with a prelink that attaches the base reads
 * back the same vectors as the original at every position, base included;
 * with an own block linked too, that block is not read. */
TEST(store_base_round_trip) {
    const char *dir = dir_for("base");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    enum { B = 70, N = 170, OWN_BLOCKS = 4 };
    cache p;
    REQUIRE(cache_make(&p, &s, 32, AK_KV_Q4, AK_KV_Q8, 256, B, 5) == 0, "fill");
    ak_kv *a = ak_kv_new(p.pool, AK_KV_Q4, AK_KV_Q8, 256, &err);
    REQUIRE(a && ak_kv_attach_base(a, p.kv, B, &err) == 0 && ak_kv_prepare(a, B, N, &err) == 0, "%s", err.msg);
    int32_t tokens[N];
    memcpy(tokens, p.tokens, sizeof(int32_t) * B);
    ak_rng rng;
    ak_rng_seed(&rng, 6);
    float k[2 * 64], v[2 * 32];
    for (int pos = B; pos < N; pos++) {
        tokens[pos] = (int32_t)(ak_rng_u32(&rng) % VOCAB);
        for (int l = 0; l < s.n_layer; l++) {
            for (int i = 0; i < 2 * 64; i++) k[i] = ak_rng_normal(&rng);
            for (int i = 0; i < 2 * 32; i++) v[i] = ak_rng_normal(&rng);
            REQUIRE(ak_kv_write(a, l, pos, k, v, &err) == 0, "%s", err.msg);
        }
    }
    ak_store_base base = {"doc", "", B};
    ak_pool_content_hash(FP, &s, AK_KV_Q4, AK_KV_Q8, p.tokens, B, base.pool_hash);
    /* the snapshot's base must be the sequence's */
    CHECK(ak_store_snapshot("ag", a, tokens, N, FP, NULL, &err) == NULL && err.code == AK_ERR_INVALID,
          "a based sequence saved without its base");
    ak_store_base wrong = base;
    wrong.base_len = 64;
    CHECK(ak_store_snapshot_base("ag", a, tokens, N, &wrong, FP, NULL, &err) == NULL && err.code == AK_ERR_INVALID,
          "a base of another length accepted");
    ak_snapshot *sn = ak_store_snapshot_base("ag", a, tokens, N, &base, FP, "m", &err);
    REQUIRE(sn && ak_store_write_snapshot(st, sn, &err) == 0, "save: %s", err.msg);
    ak_snapshot_free(sn);

    /* the file: own blocks only, the base recorded */
    file_image f;
    REQUIRE(image_read(file_of(dir, "ag"), &f) == 0, "read");
    uint64_t block_bytes = 0;
    for (int l = 0; l < s.n_layer; l++)
        block_bytes += (uint64_t)s.n_head_kv * 32 *
                       (ak_kv_format_code_bytes(AK_KV_Q4, s.head_dim_k) + ak_kv_format_meta_bytes(AK_KV_Q4, s.head_dim_k) +
                        ak_kv_format_code_bytes(AK_KV_Q8, s.head_dim_v) + ak_kv_format_meta_bytes(AK_KV_Q8, s.head_dim_v));
    uint64_t b0, e0;
    int nb = -1;
    tensor_at(&f, 0, &b0, &e0, &nb);
    const char *pid = meta_of(&f, "pool_id"), *ph = meta_of(&f, "pool_hash"), *bl = meta_of(&f, "base_len");
    CHECK(nb == OWN_BLOCKS && f.len == 8 + f.N + OWN_BLOCKS * block_bytes,
          "file of %zu bytes, %d blocks; expected the header + %d blocks of %llu bytes", f.len, nb, OWN_BLOCKS,
          (unsigned long long)block_bytes);
    CHECK(pid && !strcmp(pid, "doc") && ph && !strcmp(ph, base.pool_hash) && bl && !strcmp(bl, "70") &&
              !strcmp(meta_of(&f, "n_tokens"), "170"),
          "base metadata");
    char *want = expected_block_sums(&f);
    CHECK(!strcmp(meta_of(&f, "block_checksums"), want), "block checksums of a based file");
    free(want);
    char files[700];
    snprintf(files, sizeof files, "'%s'", file_of(dir, "ag"));
    char cmd[900];
    snprintf(cmd, sizeof cmd, "timeout -k 5 120 python3 tests/check_safetensors.py %s > /dev/null 2>&1", files);
    CHECK(system(cmd) == 0, "check_safetensors.py rejects a based file");

    /* restores: the base attached, then also one own block linked */
    for (int linked = 0; linked < 2; linked++) {
        ak_kv *r = ak_kv_new(p.pool, AK_KV_Q4, AK_KV_Q8, 256, &err);
        prelink_ctx pc = {.base_src = p.kv, .link_src = linked ? a : NULL, .link_blocks = linked};
        ak_store_load_info info;
        ak_store_status rs = ak_store_load_linked(st, &(ak_store_load_args){.id = "ag", .fingerprint = FP,
                                                  .vocab = VOCAB, .kv = r, .prelink = test_prelink, .ud = &pc}, &info,
                                                  &err);
        uint64_t want_bytes = 8 + f.N + (uint64_t)(OWN_BLOCKS - linked) * block_bytes;
        CHECK(rs == AK_STORE_HIT && info.linked == B + 32 * linked && !strcmp(info.base.pool_id, "doc") &&
                  info.base.base_len == B && !strcmp(info.base.pool_hash, base.pool_hash) &&
                  info.bytes_read == want_bytes && ak_kv_length(r) == N && ak_kv_base_len(r) == B,
              "%d linked: %s %s (linked %d, %llu bytes read, expected %llu)", linked, ak_store_status_name(rs),
              err.msg, info.linked, (unsigned long long)info.bytes_read, (unsigned long long)want_bytes);
        CHECK(pc.calls == 1 && !strcmp(pc.seen.pool_id, "doc") && pc.seen.base_len == B, "the callback saw no base");
        CHECK(info.n_tokens == N && info.tokens && !memcmp(info.tokens, tokens, sizeof tokens), "tokens");
        int bad = 0;
        float k2[2 * 64], v2[2 * 32];
        for (int pos = 0; rs == AK_STORE_HIT && pos < N; pos++)
            for (int l = 0; l < s.n_layer; l++) {
                if (ak_kv_read(a, l, pos, k, v, &err) || ak_kv_read(r, l, pos, k2, v2, &err) ||
                    memcmp(k, k2, sizeof k) || memcmp(v, v2, sizeof v))
                    bad++;
            }
        CHECK(bad == 0, "%d linked: %d (position, layer) vectors differ from the original", linked, bad);
        free(info.tokens);
        ak_kv_free(r);
    }
    /* the index knows the base without reading the file, also after reopening */
    for (int round = 0; round < 2; round++) {
        ak_store_entry e;
        CHECK(ak_store_lookup(st, "ag", &e) == 0 && !strcmp(e.base.pool_id, "doc") && e.base.base_len == B &&
                  !strcmp(e.base.pool_hash, base.pool_hash) && e.n_tokens == N,
              "round %d: index entry without the base", round);
        ak_store_close(st);
        st = ak_store_open(dir, NULL, &err);
        REQUIRE(st, "reopen: %s", err.msg);
    }
    CHECK(ak_store_verify(st, "ag", FP, VOCAB, &err) == AK_STORE_HIT, "verify a based file: %s", err.msg);
    image_free(&f);
    ak_kv_free(a);
    cache_free(&p);
    ak_store_close(st);
}

/* A based file is a miss, left in place with the sequence untouched, when
 * nothing can supply its base: no prelink, or a prelink that fails (STALE
 * for "not found" and "stale", ERROR with the callback's code otherwise),
 * or one that leaves the wrong positions (ERROR). */
TEST(store_base_without_pool_is_stale) {
    const char *dir = dir_for("basestale");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache p;
    REQUIRE(cache_make(&p, &s, 32, AK_KV_F16, AK_KV_F16, 256, 50, 8) == 0, "fill");
    ak_kv *a = ak_kv_new(p.pool, AK_KV_F16, AK_KV_F16, 256, &err);
    REQUIRE(a && ak_kv_attach_base(a, p.kv, 40, &err) == 0, "%s", err.msg);
    float k[2 * 64] = {1}, v[2 * 32] = {2};
    REQUIRE(ak_kv_prepare(a, 40, 45, &err) == 0, "%s", err.msg);
    for (int pos = 40; pos < 45; pos++)
        for (int l = 0; l < s.n_layer; l++) REQUIRE(ak_kv_write(a, l, pos, k, v, &err) == 0, "%s", err.msg);
    ak_store_base base = {"gone", "0123456789abcdef", 40};
    ak_snapshot *sn = ak_store_snapshot_base("ag", a, p.tokens, 45, &base, FP, "m", &err);
    REQUIRE(sn && ak_store_write_snapshot(st, sn, &err) == 0, "save: %s", err.msg);
    ak_snapshot_free(sn);
    ak_kv *r = ak_kv_new(p.pool, AK_KV_F16, AK_KV_F16, 256, &err);
    REQUIRE(r, "%s", err.msg);
    err.code = 0;
    ak_store_status rs = ak_store_load(st, "ag", FP, VOCAB, r, NULL, &err);
    CHECK(rs == AK_STORE_STALE && err.code == AK_ERR_STALE && strstr(err.msg, "starts with pool gone") &&
              strstr(err.msg, "no pool supplied"),
          "no prelink: %s %s", ak_store_status_name(rs), err.msg);
    printf("  e.g. %s\n", err.msg);
    struct { int code; ak_store_status st; int want_code; } fails[] = {
        {AK_ERR_NOT_FOUND, AK_STORE_STALE, AK_ERR_STALE}, {AK_ERR_STALE, AK_STORE_STALE, AK_ERR_STALE},
        {AK_ERR_NOMEM, AK_STORE_ERROR, AK_ERR_NOMEM}};
    for (int i = 0; i < 3; i++) {
        prelink_ctx pc = {.base_src = p.kv, .fail_code = fails[i].code};
        err.code = 0;
        rs = ak_store_load_linked(st, &(ak_store_load_args){.id = "ag", .fingerprint = FP, .vocab = VOCAB, .kv = r,
                                  .prelink = test_prelink, .ud = &pc}, NULL, &err);
        CHECK(rs == fails[i].st && err.code == fails[i].want_code && strstr(err.msg, "pool gone is gone") && pc.calls == 1,
              "prelink failing with %s: %s (code %s) %s", ak_err_code_name(fails[i].code), ak_store_status_name(rs),
              ak_err_code_name(err.code), err.msg);
    }
    prelink_ctx pc = {.base_src = p.kv, .wrong_base = 32};
    rs = ak_store_load_linked(st, &(ak_store_load_args){.id = "ag", .fingerprint = FP, .vocab = VOCAB, .kv = r,
                              .prelink = test_prelink, .ud = &pc}, NULL, &err);
    CHECK(rs == AK_STORE_ERROR && err.code == AK_ERR_INVALID, "a base of 32 for 40: %s %s", ak_store_status_name(rs),
          err.msg);
    CHECK(exists(file_of(dir, "ag")) && ak_kv_length(r) == 0 && ak_kv_n_blocks(r) == 0,
          "a miss moved the file or touched the sequence");
    /* and it is a sound file: with its base it loads */
    pc = (prelink_ctx){p.kv, NULL, 0, 0, 0, 0, {{0}}, 0};
    CHECK(ak_store_load_linked(st, &(ak_store_load_args){.id = "ag", .fingerprint = FP, .vocab = VOCAB, .kv = r,
                               .prelink = test_prelink, .ud = &pc}, NULL, &err) == AK_STORE_HIT &&
              ak_kv_length(r) == 45,
          "with its base: %s", err.msg);
    ak_kv_free(r);
    ak_kv_free(a);
    cache_free(&p);
    ak_store_close(st);
}
