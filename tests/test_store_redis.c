/* test_store_redis.c - the store against a real redis-server (started here
 * on a loopback port, see test_store_redis.h): the backend-independent
 * behaviour run against both backends (the directory and Redis: round trip
 * byte-equal, sealed, listing from a second store, pools, memories, gc by
 * last use, statuses), and what only Redis has: chunks checked on read
 * (damage is CORRUPT and quarantined), orphaned chunks of a killed writer
 * expire and readers never see half an image (SIGKILL mid-save, repeated),
 * leases (a second node cannot write while the first holds one, takes over
 * once it expires; a node whose lease was taken is fenced), Redis stopped
 * and restarted mid-run (errors, no crash, saves resume). */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_store_redis.h"
#include "test_store_util.h"

/* ------------------------------------------------------------ the server */

/* A free loopback port (bound then released), or -1. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &l) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

redisContext *redis_conn(const redis_srv *r) {
    struct timeval tv = {.tv_sec = 2};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    if (!c || c->err) {
        if (c) redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    return c;
}

int redis_count(const redis_srv *r, const char *pattern) {
    redisContext *c = redis_conn(r);
    if (!c) return -1;
    redisReply *rp = redisCommand(c, "KEYS %s", pattern);
    int n = rp && rp->type == REDIS_REPLY_ARRAY ? (int)rp->elements : -1;
    if (rp) freeReplyObject(rp);
    redisFree(c);
    return n;
}

/* Deletes every key of the server. */
static void redis_flush(const redis_srv *r) {
    redisContext *c = redis_conn(r);
    redisReply *rp = c ? redisCommand(c, "FLUSHALL") : NULL;
    if (rp) freeReplyObject(rp);
    if (c) redisFree(c);
}

/* 1 once the server answers PING (at most 5 s). */
static int wait_ping(const redis_srv *r) {
    for (int i = 0; i < 100; i++) {
        redisContext *c = redis_conn(r);
        if (c) {
            redisReply *rp = redisCommand(c, "PING");
            int ok = rp && rp->type == REDIS_REPLY_STATUS;
            if (rp) freeReplyObject(rp);
            redisFree(c);
            if (ok) return 1;
        }
        struct timespec ts = {.tv_nsec = 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}

int redis_start(ak_test_ctx *t, redis_srv *r, int port) {
    for (int attempt = 0; attempt < 3; attempt++) {
        int p = port ? port : free_port();
        if (p <= 0) continue;
        r->port = p;
        snprintf(r->dir, sizeof r->dir, "%s/redis-%d", test_tmp_dir(), p);
        mkdir(r->dir, 0700);
        snprintf(r->url, sizeof r->url, "redis://127.0.0.1:%d/0", p);
        char ps[16], log[600];
        snprintf(ps, sizeof ps, "%d", p);
        snprintf(log, sizeof log, "%s/redis.log", r->dir);
        r->pid = fork();
        if (r->pid == 0) {
            /* not the test's stdout: a pipe held open by a leftover server would hang its reader */
            FILE *nul = freopen("/dev/null", "w", stdout);
            (void)nul;
            nul = freopen("/dev/null", "w", stderr);
            (void)nul;
            execlp("redis-server", "redis-server", "--port", ps, "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--dir", r->dir, "--logfile", log, "--daemonize", "no", (char *)NULL);
            _exit(127);
        }
        if (r->pid < 0) break;
        if (wait_ping(r)) return 0;
        redis_stop(r);
        if (port) break;
    }
    CHECK(0, "could not start redis-server (is the redis-server package installed? scripts/deps.sh)");
    return -1;
}

void redis_stop(redis_srv *r) {
    if (r->pid <= 0) return;
    kill(r->pid, SIGTERM);
    for (int i = 0; i < 100; i++) {
        if (waitpid(r->pid, NULL, WNOHANG) == r->pid) {
            r->pid = 0;
            return;
        }
        struct timespec ts = {.tv_nsec = 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    r->pid = 0;
}

/* ------------------------------------------------------------ helpers */

/* Opens a store on the backend under test: a directory (redis NULL) or the
 * Redis server. */
static ak_store *open_on(const redis_srv *redis, const char *name, const uint8_t *key, int lease_ms, ak_error *err) {
    if (!redis) return ak_store_open(dir_for(name), key, err);
    ak_store_where w = {.url = redis->url, .lease_ms = lease_ms};
    return ak_store_open_at(&w, key, err);
}

/* Loads id from st into a fresh sequence shaped like c: 1 if it equals c
 * (tokens and every stored byte), 0 if not, -1 if not a hit. */
static int loads_as(ak_store *st, const char *id, const cache *c) {
    cache b;
    if (cache_empty_like(&b, c, 32) != 0) return -1;
    ak_store_load_info info;
    ak_error err = {{0}};
    ak_store_status s = ak_store_load(st, id, FP, VOCAB, b.kv, &info, &err);
    int r = -1;
    if (s == AK_STORE_HIT)
        r = info.n_tokens == c->n && !memcmp(info.tokens, c->tokens, 4 * (size_t)c->n) && kv_equal(c->kv, b.kv);
    else fprintf(stderr, "    load %s: %s: %s\n", id, ak_store_status_name(s), err.msg);
    if (s == AK_STORE_HIT) free(info.tokens);
    cache_free(&b);
    return r;
}

static void key_of(uint8_t key[32], int seed) {
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(seed * 31 + i * 7);
}

/* --------------------------------------------- backend-independent checks */

/* Round trip, overwrite, listing from a second store, inspect, verify,
 * remove, statuses: on the backend redis (NULL: a directory). */
static void round_trip(ak_test_ctx *t, const redis_srv *redis, const char *name) {
    ak_error err = {{0}};
    ak_store *a = open_on(redis, name, NULL, 0, &err);
    REQUIRE(a, "%s: open: %s", name, err.msg);
    ak_cache_spec s = {.n_layer = 4, .n_head_kv = 4, .head_dim_k = 128, .head_dim_v = 128, .n_ctx = 2048};
    cache c1, c2;
    /* up to 500 positions of q8/f16: a 3 MB image, three Redis chunks */
    REQUIRE(cache_make(&c1, &s, 32, AK_KV_Q8, AK_KV_F16, 512, 300, 1) == 0, "fill");
    REQUIRE(cache_make(&c2, &s, 32, AK_KV_Q8, AK_KV_F16, 512, 500, 2) == 0, "fill");
    REQUIRE(ak_store_save(a, "ag", c1.kv, c1.tokens, c1.n, FP, "m", &err) == 0, "%s: save: %s", name, err.msg);
    CHECK(loads_as(a, "ag", &c1) == 1, "%s: first version not restored byte-equal", name);
    REQUIRE(ak_store_save(a, "ag", c2.kv, c2.tokens, c2.n, FP, "m", &err) == 0, "%s: save: %s", name, err.msg);
    CHECK(loads_as(a, "ag", &c2) == 1, "%s: second version not restored byte-equal", name);
    /* another store (another node) sees what the first saved */
    ak_store *b = open_on(redis, name, NULL, 0, &err);
    REQUIRE(b, "%s: open: %s", name, err.msg);
    ak_store_entry e;
    CHECK(ak_store_lookup(b, "ag", &e) == 0 && e.n_tokens == 500 && e.bytes > 1000000 && e.readable, "%s: lookup", name);
    CHECK(loads_as(b, "ag", &c2) == 1, "%s: the other store does not restore it", name);
    CHECK(ak_store_verify(b, "ag", FP, VOCAB, &err) == AK_STORE_HIT, "%s: verify: %s", name, err.msg);
    char *meta = NULL;
    CHECK(ak_store_inspect(b, "ag", &e, &meta, &err) == 0 && meta && strstr(meta, "\"agentkv.agent\""), "%s: inspect", name);
    free(meta);
    cache d;
    REQUIRE(cache_empty_like(&d, &c1, 32) == 0, "fill");
    CHECK(ak_store_load(b, "ag", "another-model", VOCAB, d.kv, NULL, &err) == AK_STORE_STALE && err.code == AK_ERR_STALE,
          "%s: another model is not STALE", name);
    CHECK(ak_store_load(b, "nobody", FP, VOCAB, d.kv, NULL, &err) == AK_STORE_ABSENT && err.code == AK_ERR_NOT_FOUND,
          "%s: absent", name);
    CHECK(ak_store_remove(b, "ag", &err) == 0, "%s: remove: %s", name, err.msg);
    CHECK(ak_store_remove(b, "ag", &err) == 1, "%s: second remove", name);
    CHECK(ak_store_load(a, "ag", FP, VOCAB, d.kv, NULL, &err) == AK_STORE_ABSENT, "%s: removed but loads", name);
    cache_free(&d);
    cache_free(&c1);
    cache_free(&c2);
    ak_store_close(b);
    ak_store_close(a);
}

/* Sealed images: round trip, another key STALE, a plain store STALE. */
static void sealed(ak_test_ctx *t, const redis_srv *redis, const char *name) {
    uint8_t k1[32], k2[32];
    key_of(k1, 1);
    key_of(k2, 2);
    ak_error err = {{0}};
    ak_store *a = open_on(redis, name, k1, 0, &err);
    REQUIRE(a, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache c;
    REQUIRE(cache_make(&c, &s, 32, AK_KV_Q4, AK_KV_Q8, 512, 200, 3) == 0, "fill");
    REQUIRE(ak_store_save(a, "sec", c.kv, c.tokens, c.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    CHECK(loads_as(a, "sec", &c) == 1, "%s: sealed round trip", name);
    ak_store *b = open_on(redis, name, k2, 0, &err), *p = open_on(redis, name, NULL, 0, &err);
    REQUIRE(b && p, "open: %s", err.msg);
    cache d;
    REQUIRE(cache_empty_like(&d, &c, 32) == 0, "fill");
    CHECK(ak_store_load(b, "sec", FP, VOCAB, d.kv, NULL, &err) == AK_STORE_STALE && strstr(err.msg, "wrong key"),
          "%s: wrong key: %s", name, err.msg);
    CHECK(ak_store_load(p, "sec", FP, VOCAB, d.kv, NULL, &err) == AK_STORE_STALE && strstr(err.msg, "no key"),
          "%s: no key: %s", name, err.msg);
    cache_free(&d);
    cache_free(&c);
    ak_store_close(p);
    ak_store_close(b);
    ak_store_close(a);
}

/* Pools and memories: save, list from another store, load byte-equal,
 * remove. */
static void pools_memories(ak_test_ctx *t, const redis_srv *redis, const char *name) {
    ak_error err = {{0}};
    ak_store *a = open_on(redis, name, NULL, 0, &err);
    REQUIRE(a, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache c;
    REQUIRE(cache_make(&c, &s, 32, AK_KV_Q8, AK_KV_Q8, 512, 90, 4) == 0, "fill");
    REQUIRE(ak_store_save_pool(a, &(ak_store_save_args){.id = "doc", .kv = c.kv, .tokens = c.tokens, .n_tokens = c.n,
                               .source = "{\"src\":1}", .fingerprint = FP}, &err) == 0, "pool: %s", err.msg);
    REQUIRE(ak_store_save_memory(a, &(ak_store_save_args){.id = "mem1", .kv = c.kv, .tokens = c.tokens, .n_tokens = c.n,
                                 .source = "some text", .fingerprint = FP}, &err) == 0, "memory: %s", err.msg);
    ak_store *b = open_on(redis, name, NULL, 0, &err);
    REQUIRE(b, "open: %s", err.msg);
    ak_store_pool_entry pe;
    int found = ak_store_lookup_pool(b, "doc", &pe) == 0;
    CHECK(found && pe.e.n_tokens == 90 && pe.source && !strcmp(pe.source, "{\"src\":1}"),
          "%s: pool not listed by another store", name);
    if (found) free(pe.source);
    found = ak_store_lookup_memory(b, "mem1", &pe) == 0;
    CHECK(found && pe.source && !strcmp(pe.source, "some text"), "%s: memory not listed by another store", name);
    if (found) free(pe.source);
    for (int k = 0; k < 2; k++) {
        cache d;
        REQUIRE(cache_empty_like(&d, &c, 32) == 0, "fill");
        int32_t *tok = NULL;
        int n = 0;
        char h[17];
        ak_store_status st = k ? ak_store_load_memory(b, &(ak_store_load_args){.id = "mem1", .fingerprint = FP,
                                                      .vocab = VOCAB, .kv = d.kv}, &tok, &n, h, &err)
                               : ak_store_load_pool(b, &(ak_store_load_args){.id = "doc", .fingerprint = FP,
                                                    .vocab = VOCAB, .kv = d.kv}, &tok, &n, h, &err);
        CHECK(st == AK_STORE_HIT && n == c.n && !memcmp(tok, c.tokens, 4 * (size_t)n) && kv_equal(c.kv, d.kv),
              "%s: %s not restored: %s", name, k ? "memory" : "pool", err.msg);
        free(tok);
        cache_free(&d);
    }
    CHECK(ak_store_remove_pool(b, "doc", &err) == 0 && ak_store_remove_memory(b, "mem1", &err) == 0, "%s: remove", name);
    ak_store_pool_entry *v = NULL;
    int n = -1;
    CHECK(ak_store_list_pools(b, &v, &n, &err) == 0 && n == 0, "%s: pools left", name);
    ak_store_pool_entries_free(v, n > 0 ? n : 0);
    cache_free(&c);
    ak_store_close(b);
    ak_store_close(a);
}

/* gc deletes the least recently used agents first (a load counts as use). */
static void gc_lru(ak_test_ctx *t, const redis_srv *redis, const char *name) {
    ak_error err = {{0}};
    ak_store *a = open_on(redis, name, NULL, 0, &err);
    REQUIRE(a, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache c;
    REQUIRE(cache_make(&c, &s, 32, AK_KV_Q4, AK_KV_Q4, 512, 64, 5) == 0, "fill");
    const char *ids[] = {"g1", "g2", "g3"};
    for (int i = 0; i < 3; i++) {
        REQUIRE(ak_store_save(a, ids[i], c.kv, c.tokens, c.n, FP, NULL, &err) == 0, "save: %s", err.msg);
        struct timespec ts = {.tv_nsec = 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    CHECK(loads_as(a, "g1", &c) == 1, "%s: load g1", name);   /* g1 is now the most recently used */
    ak_store *b = open_on(redis, name, NULL, 0, &err);      /* the times come from the backend */
    REQUIRE(b, "open: %s", err.msg);
    ak_store_entry e;
    REQUIRE(ak_store_lookup(b, "g1", &e) == 0, "lookup");
    uint64_t one = e.bytes, after = 0;
    CHECK(ak_store_gc(b, one + one / 2, &after, &err) == 2 && after == one, "%s: gc removed other than 2", name);
    CHECK(ak_store_lookup(b, "g1", &e) == 0 && ak_store_lookup(b, "g2", &e) == 1 && ak_store_lookup(b, "g3", &e) == 1,
          "%s: gc did not keep the most recently used", name);
    ak_store_remove(b, "g1", &err);
    cache_free(&c);
    ak_store_close(b);
    ak_store_close(a);
}

TEST(store_backends_round_trip_dir_and_redis) {
    redis_srv r = {0};
    if (redis_start(t, &r, 0) != 0) return;
    round_trip(t, NULL, "bk-rt");
    round_trip(t, &r, "bk-rt");
    sealed(t, NULL, "bk-seal");
    sealed(t, &r, "bk-seal");
    pools_memories(t, NULL, "bk-pool");
    pools_memories(t, &r, "bk-pool");
    gc_lru(t, NULL, "bk-gc");
    redis_flush(&r);   /* gc counts every agent: only this test's */
    gc_lru(t, &r, "bk-gc");
    /* an image is its chunks and manifest, a lease is released at close:
     * nothing is left once the agents are gone */
    CHECK(redis_count(&r, "akv:*") == 0, "keys left: %d", redis_count(&r, "akv:*"));
    redis_stop(&r);
}

/* --------------------------------------------------------- Redis only */

/* store redis damaged chunk is corrupt and quarantined, against the server r (started and stopped by the test). */
static void store_redis_damaged_chunk_is_corrupt_and_quarantined_on(ak_test_ctx *t, redis_srv *r) {
    ak_error err = {{0}};
    ak_store *a = open_on(r, NULL, NULL, 0, &err);
    REQUIRE(a, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache c;
    REQUIRE(cache_make(&c, &s, 32, AK_KV_Q8, AK_KV_F16, 512, 400, 6) == 0, "fill");
    REQUIRE(ak_store_save(a, "dmg", c.kv, c.tokens, c.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    /* flip one byte of chunk 1 (the tensors) in place */
    redisContext *rc = redis_conn(r);
    REQUIRE(rc, "connect");
    redisReply *rp = redisCommand(rc, "KEYS akv:{a:dmg}:c:*:0");
    REQUIRE(rp && rp->type == REDIS_REPLY_ARRAY && rp->elements == 1, "chunk 0 not found");
    redisReply *g = redisCommand(rc, "STRLEN %s", rp->element[0]->str);
    long long at = g && g->type == REDIS_REPLY_INTEGER ? g->integer - 100 : 0;   /* in the tensors */
    if (g) freeReplyObject(g);
    g = redisCommand(rc, "GETRANGE %s %lld %lld", rp->element[0]->str, at, at);
    REQUIRE(g && g->type == REDIS_REPLY_STRING && g->len == 1, "getrange");
    char flip[2] = {(char)(g->str[0] ^ 0x10), 0};
    freeReplyObject(g);
    g = redisCommand(rc, "SETRANGE %s %lld %b", rp->element[0]->str, at, flip, (size_t)1);
    if (g) freeReplyObject(g);
    freeReplyObject(rp);
    redisFree(rc);
    cache d;
    REQUIRE(cache_empty_like(&d, &c, 32) == 0, "fill");
    ak_store_load_info info;
    ak_store_status st = ak_store_load(a, "dmg", FP, VOCAB, d.kv, &info, &err);
    CHECK(st == AK_STORE_CORRUPT && info.quarantined && ak_kv_length(d.kv) == 0, "damaged chunk: %s: %s",
          ak_store_status_name(st), err.msg);
    printf("  e.g. %s\n", err.msg);
    CHECK(redis_count(r, "akv:{a:dmg}:m") == 0 && redis_count(r, "akv:{a:dmg}:q:*") == 1, "not quarantined");
    /* a new store counts it among the quarantined (gc deletes it first) */
    ak_store *b = open_on(r, NULL, NULL, 0, &err);
    REQUIRE(b, "open: %s", err.msg);
    uint64_t after = 1;
    CHECK(ak_store_gc(b, 0, &after, &err) == 1 && after == 0, "gc of the quarantined image");
    CHECK(redis_count(r, "akv:{a:dmg}:[mcq]*") == 0, "image keys left after gc: %d", redis_count(r, "akv:{a:dmg}:[mcq]*"));
    cache_free(&d);
    cache_free(&c);
    ak_store_close(b);
    ak_store_close(a);
}

TEST(store_redis_damaged_chunk_is_corrupt_and_quarantined) {
    redis_srv r = {0};
    if (redis_start(t, &r, 0) != 0) return;
    store_redis_damaged_chunk_is_corrupt_and_quarantined_on(t, &r);
    redis_stop(&r);
}

/* The generation of agent "kill"'s manifest into gen ("" if none). */
static void manifest_gen(const redis_srv *r, char gen[17]) {
    gen[0] = 0;
    redisContext *c = redis_conn(r);
    redisReply *rp = c ? redisCommand(c, "HGET akv:{a:kill}:m gen") : NULL;
    if (rp && rp->type == REDIS_REPLY_STRING) snprintf(gen, 17, "%s", rp->str);
    if (rp) freeReplyObject(rp);
    if (c) redisFree(c);
}

/* In a child: saves versions of c as id until killed. */
static void save_forever(const char *url, const cache *a, const cache *b) {
    ak_error err = {{0}};
    ak_store_where w = {.url = url, .lease_ms = 300};   /* a short lease: the next child takes over */
    ak_store *st = ak_store_open_at(&w, NULL, &err);
    if (!st) _exit(3);
    for (int i = 0;; i++) {
        const cache *c = i & 1 ? a : b;   /* the new version first */
        ak_store_save(st, "kill", c->kv, c->tokens, c->n, FP, NULL, &err);
    }
}

/* store redis sigkill mid save leaves old or new, against the server r (started and stopped by the test). */
static void store_redis_sigkill_mid_save_leaves_old_or_new_on(ak_test_ctx *t, redis_srv *r) {
    ak_cache_spec s = {.n_layer = 4, .n_head_kv = 4, .head_dim_k = 128, .head_dim_v = 128, .n_ctx = 2048};
    cache c1, c2;
    /* about 4 MB each: several chunks, so a kill lands between them */
    REQUIRE(cache_make(&c1, &s, 32, AK_KV_F16, AK_KV_F16, 512, 480, 7) == 0, "fill");
    REQUIRE(cache_make(&c2, &s, 32, AK_KV_F16, AK_KV_F16, 512, 500, 8) == 0, "fill");
    ak_error err = {{0}};
    ak_store *b = open_on(r, NULL, NULL, 0, &err);
    REQUIRE(b, "open: %s", err.msg);
    /* how long a child takes to open and save, on this machine now: kills
     * land from a third of that to one and a half times it */
    double t0 = ak_now();
    ak_store *first = open_on(r, NULL, NULL, 300, &err);
    REQUIRE(first && ak_store_save(first, "kill", c2.kv, c2.tokens, c2.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    double save_s = ak_now() - t0;
    ak_store_close(first);
    REQUIRE(ak_store_save(b, "kill", c1.kv, c1.tokens, c1.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    ak_store_close(b);   /* releases the lease: the child takes it */
    ak_rng rng;
    ak_rng_seed(&rng, 5);
    int trials = 0, old = 0, nw = 0, commits = 0;
    /* 12 trials, and up to 12 more, each kill later, until some child
     * committed a save (a busy machine makes a child slower than the
     * measured save) */
    for (int i = 0; i < 24 && (i < 12 || !commits); i++) {
        char before[17] = "", after[17] = "";
        manifest_gen(r, before);
        pid_t pid = fork();
        if (pid == 0) save_forever(r->url, &c1, &c2);
        double d = save_s * (0.33 + 1.2 * (double)(ak_rng_u32(&rng) % 1000) / 1000.0) * (i < 12 ? 1.0 : 1.0 + (i - 11));
        struct timespec ts = {.tv_sec = (time_t)d, .tv_nsec = (long)((d - (double)(time_t)d) * 1e9)};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        manifest_gen(r, after);
        commits += strcmp(before, after) != 0;
        /* the dead child's lease stays until it expires (300 ms): reading needs none */
        b = open_on(r, NULL, NULL, 300, &err);
        REQUIRE(b, "open: %s", err.msg);
        int v1 = loads_as(b, "kill", &c1), v2 = v1 == 1 ? 0 : loads_as(b, "kill", &c2);
        CHECK(v1 == 1 || v2 == 1, "trial %d: the image is neither version (%d %d)", i, v1, v2);
        old += v1 == 1;
        nw += v2 == 1;
        trials++;
        ak_store_close(b);
        struct timespec lt = {.tv_nsec = 350 * 1000000L};   /* the dead child's lease expires */
        nanosleep(&lt, NULL);
    }
    CHECK(commits > 0, "no child committed a save before its kill in %d trials", trials);
    /* chunks of an unfinished put are never persistent: they expire */
    redisContext *rc = redis_conn(r);
    REQUIRE(rc, "connect");
    redisReply *rp = redisCommand(rc, "KEYS akv:{a:kill}:c:*");
    redisReply *m = redisCommand(rc, "HGET akv:{a:kill}:m gen");
    int orphans = 0, persistent_orphans = 0;
    for (size_t i = 0; rp && m && m->type == REDIS_REPLY_STRING && i < rp->elements; i++) {
        if (strstr(rp->element[i]->str, m->str)) continue;   /* the live generation */
        orphans++;
        redisReply *tt = redisCommand(rc, "PTTL %s", rp->element[i]->str);
        if (tt && tt->type == REDIS_REPLY_INTEGER && tt->integer < 0) persistent_orphans++;
        if (tt) freeReplyObject(tt);
    }
    if (rp) freeReplyObject(rp);
    if (m) freeReplyObject(m);
    redisFree(rc);
    CHECK(persistent_orphans == 0, "%d of %d orphaned chunks never expire", persistent_orphans, orphans);
    printf("  %d kills mid-save (a save: %.0f ms; %d trials with a commit): %d old, %d new, never half; %d orphaned "
           "chunks, all expiring\n", trials, save_s * 1e3, commits, old, nw, orphans);
    cache_free(&c1);
    cache_free(&c2);
}

TEST(store_redis_sigkill_mid_save_leaves_old_or_new) {
    redis_srv r = {0};
    if (redis_start(t, &r, 0) != 0) return;
    store_redis_sigkill_mid_save_leaves_old_or_new_on(t, &r);
    redis_stop(&r);
}

/* store redis lease blocks other node until expiry, against the server r (started and stopped by the test). */
static void store_redis_lease_blocks_other_node_until_expiry_on(ak_test_ctx *t, redis_srv *r) {
    ak_cache_spec s = small_spec();
    cache c1, c2;
    REQUIRE(cache_make(&c1, &s, 32, AK_KV_Q8, AK_KV_Q8, 512, 40, 9) == 0, "fill");
    REQUIRE(cache_make(&c2, &s, 32, AK_KV_Q8, AK_KV_Q8, 512, 50, 10) == 0, "fill");
    ak_error err = {{0}};
    /* node A (a child) saves and dies without releasing its 1.5 s lease */
    pid_t pid = fork();
    if (pid == 0) {
        ak_store *a = open_on(r, NULL, NULL, 1500, &err);
        _exit(a && ak_store_save(a, "own", c1.kv, c1.tokens, c1.n, FP, NULL, &err) == 0 ? 0 : 1);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    REQUIRE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "node A did not save");
    double t0 = ak_now();
    ak_store *b = open_on(r, NULL, NULL, 1500, &err);
    REQUIRE(b, "open: %s", err.msg);
    CHECK(ak_store_save(b, "own", c2.kv, c2.tokens, c2.n, FP, NULL, &err) == -1 && err.code == AK_ERR_BUSY,
          "node B wrote while A held the lease: %s", err.msg);
    printf("  e.g. %s\n", err.msg);
    CHECK(loads_as(b, "own", &c1) == 1, "B reads A's version");
    /* once the lease expires, B takes over */
    int ok = 0;
    while (!ok && ak_now() - t0 < 5) {
        struct timespec ts = {.tv_nsec = 100 * 1000000L};
        nanosleep(&ts, NULL);
        ok = ak_store_save(b, "own", c2.kv, c2.tokens, c2.n, FP, NULL, &err) == 0;
    }
    CHECK(ok && ak_now() - t0 >= 1.2, "B took over after %.2f s (lease 1.5 s): %s", ak_now() - t0, err.msg);
    CHECK(loads_as(b, "own", &c2) == 1, "B's version");
    /* fencing: B's lease taken by another token (as after an expiry) */
    redisContext *rc = redis_conn(r);
    REQUIRE(rc, "connect");
    redisReply *rp = redisCommand(rc, "SET akv:{a:own}:lease someone-else PX 60000");
    if (rp) freeReplyObject(rp);
    redisFree(rc);
    CHECK(ak_store_save(b, "own", c1.kv, c1.tokens, c1.n, FP, NULL, &err) == -1 && err.code == AK_ERR_BUSY,
          "a node whose lease was taken still wrote: %s", err.msg);
    printf("  e.g. %s\n", err.msg);
    CHECK(loads_as(b, "own", &c2) == 1, "the fenced write changed the image");
    cache_free(&c1);
    cache_free(&c2);
    ak_store_close(b);
}

TEST(store_redis_lease_blocks_other_node_until_expiry) {
    redis_srv r = {0};
    if (redis_start(t, &r, 0) != 0) return;
    store_redis_lease_blocks_other_node_until_expiry_on(t, &r);
    redis_stop(&r);
}

/* store redis restart mid run errors then resumes, against the server r (started and stopped by the test). */
static void store_redis_restart_mid_run_errors_then_resumes_on(ak_test_ctx *t, redis_srv *r) {
    ak_cache_spec s = small_spec();
    cache c;
    REQUIRE(cache_make(&c, &s, 32, AK_KV_Q4, AK_KV_Q8, 512, 100, 11) == 0, "fill");
    ak_error err = {{0}};
    ak_store *a = open_on(r, NULL, NULL, 0, &err);
    REQUIRE(a, "open: %s", err.msg);
    REQUIRE(ak_store_save(a, "rs", c.kv, c.tokens, c.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    int port = r->port;
    redis_stop(r);
    cache d;
    REQUIRE(cache_empty_like(&d, &c, 32) == 0, "fill");
    ak_store_status st = ak_store_load(a, "rs", FP, VOCAB, d.kv, NULL, &err);
    CHECK(st == AK_STORE_ERROR && strstr(err.msg, "redis") && ak_kv_length(d.kv) == 0, "load with Redis down: %s: %s",
          ak_store_status_name(st), err.msg);
    printf("  e.g. %s\n", err.msg);
    CHECK(ak_store_save(a, "rs", c.kv, c.tokens, c.n, FP, NULL, &err) == -1 && strstr(err.msg, "redis"),
          "save with Redis down: %s", err.msg);
    ak_store_entry *es = NULL;
    int n = 0;
    CHECK(ak_store_list(a, &es, &n, &err) == 0, "listing (the index) still answers");
    free(es);
    REQUIRE(redis_start(t, r, port) == 0, "restart");
    /* Redis came back empty (no persistence): the agent is absent, saves resume */
    CHECK(ak_store_load(a, "rs", FP, VOCAB, d.kv, NULL, &err) == AK_STORE_ABSENT, "after restart: %s", err.msg);
    CHECK(ak_store_save(a, "rs", c.kv, c.tokens, c.n, FP, NULL, &err) == 0, "save after restart: %s", err.msg);
    CHECK(loads_as(a, "rs", &c) == 1, "restore after restart");
    cache_free(&d);
    cache_free(&c);
    ak_store_close(a);
}

TEST(store_redis_restart_mid_run_errors_then_resumes) {
    redis_srv r = {0};
    if (redis_start(t, &r, 0) != 0) return;
    store_redis_restart_mid_run_errors_then_resumes_on(t, &r);
    redis_stop(&r);
}

/* The read-through cache: an image read whole from Redis is kept in the
 * local directory and served from there, checked against the manifest's
 * chunk sums: a damaged copy is dropped and Redis read again. */
static void read_through_on(ak_test_ctx *t, redis_srv *r) {
    ak_error err = {{0}};
    char local[600], cfile[800];
    snprintf(local, sizeof local, "%s/rt-local", test_tmp_dir());
    ak_store_where w = {.url = r->url, .local_dir = local};
    ak_store *a = ak_store_open_at(&w, NULL, &err);
    REQUIRE(a, "open: %s", err.msg);
    ak_cache_spec s = small_spec();
    cache c;
    REQUIRE(cache_make(&c, &s, 32, AK_KV_Q8, AK_KV_F16, 512, 300, 12) == 0, "fill");
    REQUIRE(ak_store_save(a, "rt", c.kv, c.tokens, c.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    CHECK(loads_as(a, "rt", &c) == 1, "first load (from Redis)");
    /* the copy is there, named by the manifest's generation */
    redisContext *rc = redis_conn(r);
    REQUIRE(rc, "connect");
    redisReply *g = redisCommand(rc, "HGET akv:{a:rt}:m gen");
    REQUIRE(g && g->type == REDIS_REPLY_STRING, "gen");
    snprintf(cfile, sizeof cfile, "%s/redis-cache/a.%s.rt.safetensors", local, g->str);
    freeReplyObject(g);
    CHECK(exists(cfile), "no cached copy %s", cfile);
    /* Redis's chunk damaged: the load is served by the sound local copy */
    redisReply *k = redisCommand(rc, "KEYS akv:{a:rt}:c:*:0");
    REQUIRE(k && k->type == REDIS_REPLY_ARRAY && k->elements == 1, "chunk");
    g = redisCommand(rc, "SETRANGE %s 100 XXXX", k->element[0]->str);
    if (g) freeReplyObject(g);
    CHECK(loads_as(a, "rt", &c) == 1, "not served from the local copy");
    /* the local copy damaged too: dropped, Redis read (and found corrupt) */
    FILE *f = fopen(cfile, "r+b");
    REQUIRE(f, "open the copy");
    fseek(f, 200, SEEK_SET);
    fputc('Z', f);
    fclose(f);
    cache d;
    REQUIRE(cache_empty_like(&d, &c, 32) == 0, "fill");
    CHECK(ak_store_load(a, "rt", FP, VOCAB, d.kv, NULL, &err) == AK_STORE_CORRUPT, "damaged copy and chunk: %s", err.msg);
    CHECK(!exists(cfile), "the damaged copy was kept");
    /* a new version: read from Redis, cached under its own generation */
    REQUIRE(ak_store_save(a, "rt", c.kv, c.tokens, c.n, FP, NULL, &err) == 0, "save: %s", err.msg);
    CHECK(loads_as(a, "rt", &c) == 1, "new version");
    freeReplyObject(k);
    redisFree(rc);
    cache_free(&d);
    cache_free(&c);
    ak_store_close(a);
}

TEST(store_redis_read_through_cache) {
    redis_srv r = {0};
    if (redis_start(t, &r, 0) != 0) return;
    read_through_on(t, &r);
    redis_stop(&r);
}

TEST(store_redis_unreachable_at_open_and_bad_urls) {
    ak_error err = {{0}};
    char url[64];
    int p = free_port();
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", p);
    ak_store_where w = {.url = url};
    CHECK(!ak_store_open_at(&w, NULL, &err) && err.code == AK_ERR_IO && strstr(err.msg, "connect"),
          "unreachable: %s", err.msg);
    const char *bad[] = {"redis://", "redis://host", "redis://h:0", "redis://h:70000", "redis://h:1/99", "redis://:1"};
    for (int i = 0; i < 6; i++) {
        w.url = bad[i];
        CHECK(!ak_store_open_at(&w, NULL, &err) && err.code == AK_ERR_INVALID, "%s accepted: %s", bad[i], err.msg);
    }
}
