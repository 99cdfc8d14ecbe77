/* test_store_redis_more.c - the Redis store's restore path and listing
 * against a real redis-server (test_store_redis.h): an image of many chunks
 * restored by the two restore threads byte-equal, from Redis and from the
 * read-through cache's copy (made chunk by chunk), a damaged middle chunk
 * CORRUPT; listing from the manifest's copy of the header (no chunk read),
 * a manifest without it (older builds) or with a damaged one still listed
 * from the chunks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "store/cards.h"
#include "test_store_redis.h"
#include "test_store_util.h"

/* Loads id from st into a fresh sequence shaped like c: 1 if it equals c
 * (tokens and every stored byte), 0 if not, -1 if not a hit (*st_out gets
 * the status). */
static int loads_like(ak_store *st, const char *id, const cache *c, ak_store_status *st_out) {
    cache b;
    if (cache_empty_like(&b, c, 32) != 0) return -1;
    ak_store_load_info info;
    ak_error err = {{0}};
    ak_store_status s = ak_store_load(st, id, FP, VOCAB, b.kv, &info, &err);
    if (st_out) *st_out = s;
    int r = -1;
    if (s == AK_STORE_HIT)
        r = info.n_tokens == c->n && !memcmp(info.tokens, c->tokens, 4 * (size_t)c->n) && kv_equal(c->kv, b.kv);
    if (s == AK_STORE_HIT) free(info.tokens);
    cache_free(&b);
    return r;
}

/* Runs a command with one %s argument; returns the reply (or NULL). */
static redisReply *rcmd(redisContext *c, const char *fmt, const char *arg) {
    return redisCommand(c, fmt, arg);
}

/* The manifest's generation of agent id into gen (17 bytes). 0, or -1. */
static int gen_of(redisContext *c, const char *id, char gen[17]) {
    char key[160];
    snprintf(key, sizeof key, "akv:{a:%s}:m", id);
    redisReply *g = rcmd(c, "HGET %s gen", key);
    int ok = g && g->type == REDIS_REPLY_STRING && g->len == 16;
    if (ok) memcpy(gen, g->str, 17);
    if (g) freeReplyObject(g);
    return ok ? 0 : -1;
}

TEST(store_redis_many_chunks_restore_and_cached_copy) {
    redis_srv r = {0};
    if (redis_start(t, &r, 0) != 0) return;
    ak_error err = {{0}};
    char local[600], cfile[900];
    snprintf(local, sizeof local, "%s/mc-local", test_tmp_dir());
    ak_store_where wa = {.url = r.url, .local_dir = local}, wb = {.url = r.url};
    ak_store *a = ak_store_open_at(&wa, NULL, &err);
    ak_store *b = a ? ak_store_open_at(&wb, NULL, &err) : NULL;
    REQUIRE(a && b, "open: %s", err.msg);
    /* 1200 positions of 4 layers x 4 heads x (128 + 128) f16: about 9.8 MB,
     * 10 chunks, above the two-thread threshold of the restore */
    ak_cache_spec s = {.n_layer = 4, .n_head_kv = 4, .head_dim_k = 128, .head_dim_v = 128, .n_ctx = 2048};
    cache c;
    REQUIRE(cache_make(&c, &s, 32, AK_KV_F16, AK_KV_F16, 1280, 1200, 21) == 0, "fill");
    REQUIRE(ak_store_save(a, "big", c.kv, c.tokens, c.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    ak_store_entry e;
    REQUIRE(ak_store_lookup(a, "big", &e) == 0 && e.bytes > 8u << 20, "image of %llu bytes", (unsigned long long)e.bytes);
    CHECK(loads_like(b, "big", &c, NULL) == 1, "restore from Redis (no cache) differs");
    CHECK(loads_like(a, "big", &c, NULL) == 1, "restore from Redis (caching) differs");
    redisContext *rc = redis_conn(&r);
    REQUIRE(rc, "connect");
    char gen[17];
    REQUIRE(gen_of(rc, "big", gen) == 0, "gen");
    snprintf(cfile, sizeof cfile, "%s/redis-cache/a.%s.big.safetensors", local, gen);
    struct stat sb;
    CHECK(stat(cfile, &sb) == 0 && (uint64_t)sb.st_size == e.bytes, "no whole cached copy %s", cfile);
    /* a middle chunk damaged in Redis: the copy serves A, B finds it corrupt */
    char ck[200];
    snprintf(ck, sizeof ck, "akv:{a:big}:c:%s:5", gen);
    redisReply *x = redisCommand(rc, "SETRANGE %s 4096 XXXXXXXX", ck);
    REQUIRE(x && x->type == REDIS_REPLY_INTEGER, "damage chunk 5");
    freeReplyObject(x);
    CHECK(loads_like(a, "big", &c, NULL) == 1, "not served from the cached copy");
    ak_store_status st = AK_STORE_HIT;
    CHECK(loads_like(b, "big", &c, &st) == -1 && st == AK_STORE_CORRUPT, "damaged chunk 5: %s",
          ak_store_status_name(st));
    redisFree(rc);
    cache_free(&c);
    ak_store_close(b);
    ak_store_close(a);
    redis_stop(&r);
}

TEST(store_redis_listing_reads_the_manifest_not_chunks) {
    redis_srv r = {0};
    if (redis_start(t, &r, 0) != 0) return;
    ak_error err = {{0}};
    ak_store_where w = {.url = r.url};
    ak_store *a = ak_store_open_at(&w, NULL, &err);
    REQUIRE(a, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache c;
    REQUIRE(cache_make(&c, &s, 32, AK_KV_Q8, AK_KV_F16, 512, 300, 22) == 0, "fill");
    const char *ids[] = {"new", "old", "bad"};
    for (int i = 0; i < 3; i++)
        REQUIRE(ak_store_save(a, ids[i], c.kv, c.tokens, c.n, FP, "m", &err) == 0, "save: %s", err.msg);
    redisContext *rc = redis_conn(&r);
    REQUIRE(rc, "connect");
    redisReply *x = redisCommand(rc, "HEXISTS akv:{a:new}:m head");
    CHECK(x && x->type == REDIS_REPLY_INTEGER && x->integer == 1, "the manifest has no copy of the header");
    if (x) freeReplyObject(x);
    /* "old": a manifest as older builds wrote it; "bad": its copy damaged */
    x = redisCommand(rc, "HDEL akv:{a:old}:m head hsum");
    if (x) freeReplyObject(x);
    x = redisCommand(rc, "HSET akv:{a:bad}:m head garbage");
    if (x) freeReplyObject(x);
    /* every chunk of "new" gone: only the manifest can tell what it holds */
    char gen[17], ck[200];
    REQUIRE(gen_of(rc, "new", gen) == 0, "gen");
    snprintf(ck, sizeof ck, "akv:{a:new}:c:%s:0", gen);
    x = rcmd(rc, "DEL %s", ck);
    CHECK(x && x->type == REDIS_REPLY_INTEGER && x->integer == 1, "chunk 0 of new");
    if (x) freeReplyObject(x);
    ak_store *b = ak_store_open_at(&w, NULL, &err);
    REQUIRE(b, "open: %s", err.msg);
    for (int i = 0; i < 3; i++) {
        ak_store_entry e;
        int found = ak_store_lookup(b, ids[i], &e) == 0;
        CHECK(found && e.readable && e.n_tokens == c.n && e.spec.n_layer == s.n_layer && e.fk == AK_KV_Q8 &&
                  !strcmp(e.model_name, "m") && !strcmp(e.fingerprint, FP),
              "%s: not listed with its metadata (found %d, readable %d, tokens %d)", ids[i], found,
              found ? e.readable : -1, found ? e.n_tokens : -1);
    }
    /* without the copy, a missing chunk 0 leaves the metadata unknown */
    x = redisCommand(rc, "HDEL akv:{a:new}:m head hsum");
    if (x) freeReplyObject(x);
    ak_store *d = ak_store_open_at(&w, NULL, &err);
    REQUIRE(d, "open: %s", err.msg);
    ak_store_entry e;
    CHECK(ak_store_lookup(d, "new", &e) != 0 || !e.readable, "listed readable with neither chunk 0 nor the copy");
    CHECK(loads_like(d, "old", &c, NULL) == 1 && loads_like(d, "bad", &c, NULL) == 1, "old or bad manifest not restored");
    redisFree(rc);
    cache_free(&c);
    ak_store_close(d);
    ak_store_close(b);
    ak_store_close(a);
    redis_stop(&r);
}

/* 1 if the cached copy of agent id's current generation is on disk. */
static int copy_exists(redisContext *rc, const char *local, const char *id) {
    char gen[17], path[900];
    struct stat sb;
    if (gen_of(rc, id, gen) != 0) return -1;
    snprintf(path, sizeof path, "%s/redis-cache/a.%s.%s.safetensors", local, gen, id);
    return stat(path, &sb) == 0;
}

static void pause_ms(int ms) {
    struct timespec ts = {.tv_nsec = ms * 1000000L};
    nanosleep(&ts, NULL);
}

TEST(store_redis_cached_copies_count_in_the_disk_budget) {
    redis_srv r = {0};
    if (redis_start(t, &r, 0) != 0) return;
    ak_error err = {{0}};
    char local[600];
    snprintf(local, sizeof local, "%s/budget-local", test_tmp_dir());
    ak_store_where wa = {.url = r.url}, wb = {.url = r.url, .local_dir = local};
    ak_store *a = ak_store_open_at(&wa, NULL, &err);
    ak_store *b = a ? ak_store_open_at(&wb, NULL, &err) : NULL;
    REQUIRE(a && b, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache c;
    REQUIRE(cache_make(&c, &s, 32, AK_KV_Q8, AK_KV_Q8, 512, 200, 23) == 0, "fill");
    const char *ids[] = {"c1", "c2", "c3"};
    for (int i = 0; i < 3; i++)
        REQUIRE(ak_store_save(a, ids[i], c.kv, c.tokens, c.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    redisContext *rc = redis_conn(&r);
    REQUIRE(rc, "connect");
    ak_store_entry e;
    REQUIRE(ak_store_lookup(a, "c1", &e) == 0, "listed");
    uint64_t x = e.bytes;   /* every image (and copy) has this size */
    /* loaded on B in the order c2, c3, c1: each leaves a copy; c1 the most recently used */
    const char *order[] = {"c2", "c3", "c1"};
    for (int i = 0; i < 3; i++) {
        CHECK(loads_like(b, order[i], &c, NULL) == 1, "load %s", order[i]);
        pause_ms(20);
    }
    for (int i = 0; i < 3; i++) CHECK(copy_exists(rc, local, ids[i]) == 1, "no copy of %s", ids[i]);
    /* 3 images + 3 copies against 4.5 images: the two least recently used copies go, no image */
    uint64_t after = 0;
    CHECK(ak_store_gc(b, 4 * x + x / 2, &after, &err) == 0 && after == 4 * x, "gc: removed images or %llu bytes left",
          (unsigned long long)after);
    CHECK(copy_exists(rc, local, "c1") == 1 && copy_exists(rc, local, "c2") == 0 && copy_exists(rc, local, "c3") == 0,
          "gc did not drop the least recently used copies");
    for (int i = 0; i < 3; i++) CHECK(ak_store_lookup(b, ids[i], &e) == 0, "image %s removed", ids[i]);
    /* room left for copies: 1.5 images; a new copy (c3) evicts the older one (c1) */
    CHECK(loads_like(b, "c3", &c, NULL) == 1, "load c3");
    CHECK(copy_exists(rc, local, "c3") == 1 && copy_exists(rc, local, "c1") == 0,
          "a new copy beyond the budget did not evict the least recently used");
    /* room for two copies; c2 cached, then c3 loaded from its copy (renewing
     * its use), then c1 cached: c2 is the least recently used */
    CHECK(ak_store_gc(b, 5 * x, &after, &err) == 0 && after == 4 * x, "gc with room: %llu bytes", (unsigned long long)after);
    pause_ms(20);
    CHECK(loads_like(b, "c2", &c, NULL) == 1, "load c2");
    pause_ms(20);
    CHECK(loads_like(b, "c3", &c, NULL) == 1, "load c3 from its copy");
    pause_ms(20);
    CHECK(loads_like(b, "c1", &c, NULL) == 1, "load c1");
    CHECK(copy_exists(rc, local, "c1") == 1 && copy_exists(rc, local, "c3") == 1 && copy_exists(rc, local, "c2") == 0,
          "a load from a copy did not count as its use (c1 %d, c2 %d, c3 %d)", copy_exists(rc, local, "c1"),
          copy_exists(rc, local, "c2"), copy_exists(rc, local, "c3"));
    redisFree(rc);
    cache_free(&c);
    ak_store_close(b);
    ak_store_close(a);
    redis_stop(&r);
}

/* Cards live in the backend as agents do: a card saved on node A (a store
 * on Redis with its own local directory) is listed and loads equal on node
 * B (another local directory, the same Redis); sealed likewise; removed on
 * B, gone for a third store. */
TEST(store_redis_card_made_on_a_opens_on_b) {
    redis_srv r = {0};
    if (redis_start(t, &r, 0) != 0) return;
    ak_error err = {{0}};
    char la[600], lb[600];
    snprintf(la, sizeof la, "%s/card-a", test_tmp_dir());
    snprintf(lb, sizeof lb, "%s/card-b", test_tmp_dir());
    ak_store_where wa = {.url = r.url, .local_dir = la}, wb = {.url = r.url, .local_dir = lb};
    ak_store *a = ak_store_open_at(&wa, NULL, &err);
    REQUIRE(a, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache src;
    REQUIRE(cache_make(&src, &s, 16, AK_KV_F32, AK_KV_F32, 256, 45, 24) == 0, "cache");
    uint8_t wk[40], wv[40];
    for (int i = 0; i < 40; i++) {
        wk[i] = (uint8_t)(2 << (i % 4));
        wv[i] = (uint8_t)(2 << ((i + 1) % 4));
    }
    ak_card_params p = {"shared-card", "alice", FP, "tiny", 5, 45, wk, wv, "given", 0, 0, NULL};
    ak_card *c = ak_card_make(src.kv, src.tokens, &p, &err);
    REQUIRE(c, "make: %s", err.msg);
    REQUIRE(ak_store_save_card(a, c, &err) == 0, "save: %s", err.msg);
    CHECK(redis_count(&r, "akv:{c:shared-card}:m") == 1, "the card is not in Redis");
    struct stat sb;
    char local[800];
    snprintf(local, sizeof local, "%s/cards/shared-card.safetensors", la);
    CHECK(stat(local, &sb) != 0, "the card was written to node A's directory");
    ak_store *b = ak_store_open_at(&wb, NULL, &err);
    REQUIRE(b, "open: %s", err.msg);
    ak_store_card_entry ent;
    CHECK(ak_store_lookup_card(b, "shared-card", &ent) == 0 && ent.readable && ent.n_tokens == 40 &&
              !strcmp(ent.hash, c->hash) && !strcmp(ent.source_agent, "alice"),
          "node B does not list the card");
    ak_card *got = NULL;
    ak_store_status st = ak_store_load_card(b, "shared-card", FP, &s, VOCAB, &got, &err);
    CHECK(st == AK_STORE_HIT && got && got->n_tokens == c->n_tokens && !strcmp(got->hash, c->hash) &&
              !memcmp(got->tokens, c->tokens, sizeof(int32_t) * (size_t)c->n_tokens),
          "node B: %s: %s", ak_store_status_name(st), err.msg);
    ak_card_free(got);
    /* its file's bytes (the card download) come from Redis too: a safetensors
     * image of the listed size whose header is the card's */
    char *fb = NULL;
    size_t fl = 0;
    CHECK(ak_store_card_bytes(b, "shared-card", &fb, &fl, &err) == 0 && fl == ent.bytes && fl > 8 &&
              strstr(fb + 8, "\"agentkv.card\"") && strstr(fb + 8, c->hash),
          "card bytes on B: %s", err.msg);
    free(fb);
    CHECK(ak_store_card_bytes(b, "no-such-card", &fb, &fl, &err) < 0 && err.code == AK_ERR_NOT_FOUND && !fb,
          "a missing card's bytes");
    /* sealed: B with the key opens it, a store without the key finds it STALE */
    uint8_t key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(i * 13 + 5);
    ak_store *ak = ak_store_open_at(&wa, key, &err);
    REQUIRE(ak, "open sealed: %s", err.msg);
    ak_card_params ps = p;
    ps.id = "sealed-card";
    ak_card *cs = ak_card_make(src.kv, src.tokens, &ps, &err);
    REQUIRE(cs && ak_store_save_card(ak, cs, &err) == 0, "sealed save: %s", err.msg);
    ak_store *bk = ak_store_open_at(&wb, key, &err);
    REQUIRE(bk, "open sealed: %s", err.msg);
    st = ak_store_load_card(bk, "sealed-card", FP, &s, VOCAB, &got, &err);
    CHECK(st == AK_STORE_HIT && got && !strcmp(got->hash, cs->hash), "sealed card on B: %s: %s",
          ak_store_status_name(st), err.msg);
    ak_card_free(got);
    got = NULL;
    CHECK(ak_store_load_card(b, "sealed-card", FP, &s, VOCAB, &got, &err) == AK_STORE_STALE && !got,
          "a sealed card opened without the key");
    /* removed on B: gone for everyone */
    CHECK(ak_store_remove_card(b, "shared-card", &err) == 0, "remove: %s", err.msg);
    ak_store *d = ak_store_open_at(&wa, NULL, &err);
    REQUIRE(d, "open: %s", err.msg);
    CHECK(ak_store_lookup_card(d, "shared-card", &ent) == 1 && redis_count(&r, "akv:{c:shared-card}:*") == 0,
          "the removed card is still listed or in Redis");
    ak_card_free(cs);
    ak_card_free(c);
    cache_free(&src);
    ak_store_close(d);
    ak_store_close(bk);
    ak_store_close(ak);
    ak_store_close(b);
    ak_store_close(a);
    redis_stop(&r);
}
