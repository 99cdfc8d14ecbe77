/* test_bench_ttft_redis.c - agentkv bench ttft --store: one cold prefill of
 * stories260K at a tiny context, the image put in a real redis-server
 * (test_store_redis.h) and restored from there: the JSON's Redis row holds
 * the context's tokens, a positive time and the same bytes the directory's
 * warm restore read (the same image); Redis keeps nothing of it afterwards
 * but expiring chunks;
 * the stopped server's port fails with one error line and a nonzero exit;
 * bad flags are usage errors. */
#include <cjson/cJSON.h>
#include <string.h>
#include <sys/wait.h>

#include "base/util.h"
#include "test.h"
#include "test_store_redis.h"

typedef test_cli_result bt_result;

/* Runs `agentkv bench ttft ARGS` (AK_BIN), capturing stdout and stderr. */
static bt_result bt_run(const char *args) {
    char a[4096];
    snprintf(a, sizeof a, "bench ttft %s", args);
    return test_cli_run(a, 120);
}

static void bt_free(bt_result *r) { test_cli_free(r); }

static double num(const cJSON *o, const char *k) {
    const cJSON *x = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(x) ? x->valuedouble : -1;
}

/* Keys akv:* of r that do not expire (TTL -1), or -1 on error. Removing an
 * image leaves only its previous generation's chunks, on their one-minute
 * expiry (readers that opened it finish). */
static int persistent_keys(const redis_srv *r) {
    redisContext *c = redis_conn(r);
    redisReply *k = c ? redisCommand(c, "KEYS akv:*") : NULL;
    int n = k && k->type == REDIS_REPLY_ARRAY ? 0 : -1;
    for (size_t i = 0; n >= 0 && i < k->elements; i++) {
        redisReply *ttl = redisCommand(c, "TTL %s", k->element[i]->str);
        if (!ttl || ttl->type != REDIS_REPLY_INTEGER) n = -1;
        else n += ttl->integer == -1;
        if (ttl) freeReplyObject(ttl);
    }
    if (k) freeReplyObject(k);
    if (c) redisFree(c);
    return n;
}

/* Number of '\n'-terminated lines in s. */
static int lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

TEST(bench_ttft_store_redis_row_and_dead_port) {
    char model[512], dir[600], args[2048];
    test_path(model, sizeof model, "models/stories260K.gguf");
    snprintf(dir, sizeof dir, "%s/bench-ttft-dir", test_tmp_dir());
    redis_srv r = {0};
    if (redis_start(t, &r, 0) != 0) return;
    const int L = 40;
    snprintf(args, sizeof args, "-m %s --contexts %d --memory-dir %s --store %s -t 1 --json", model, L, dir, r.url);
    bt_result b = bt_run(args);
    int keys_left = persistent_keys(&r);
    redis_stop(&r);
    CHECK(b.code == 0, "exit %d: %s", b.code, b.err);
    cJSON *j = cJSON_Parse(b.out);
    cJSON *rows = j ? cJSON_GetObjectItem(j, "results") : NULL;
    cJSON *row = cJSON_GetArrayItem(rows, 0);
    cJSON *rd = row ? cJSON_GetObjectItem(row, "redis") : NULL;
    if (!cJSON_IsObject(rd)) {
        CHECK(0, "no Redis row in: %s", b.out);
    } else {
        CHECK(cJSON_GetArraySize(rows) == 1 && num(row, "context") == L, "rows: %s", b.out);
        CHECK(num(rd, "tokens") == L, "Redis restore supplied %g tokens, context %d", num(rd, "tokens"), L);
        CHECK(num(rd, "warm_ms") > 0 && num(rd, "restore_ms") > 0, "times: %s", b.out);
        CHECK(num(rd, "restore_ms") <= num(rd, "warm_ms"), "restore %g ms longer than its turn %g ms",
              num(rd, "restore_ms"), num(rd, "warm_ms"));
        /* the same L positions as the directory's first warm restore read */
        double bytes = num(rd, "restore_bytes");
        CHECK(bytes > 0 && bytes == num(row, "restore_bytes"), "Redis read %g bytes, the directory %g", bytes,
              num(row, "restore_bytes"));
        CHECK(fabs(num(rd, "restore_gb_s") - bytes / (num(rd, "restore_ms") * 1e6)) <= 1e-3 + 1e-3 * bytes,
              "GB/s %g does not match %g bytes in %g ms", num(rd, "restore_gb_s"), bytes, num(rd, "restore_ms"));
    }
    CHECK(keys_left == 0, "%d akv:* keys left in Redis (not expiring) after the bench", keys_left);
    cJSON_Delete(j);
    bt_free(&b);

    /* the same port with the server stopped: refused, one line, no JSON */
    b = bt_run(args);
    CHECK(b.code != 0 && b.code < 124, "dead port: exit %d", b.code);
    CHECK(strstr(b.err, "agentkv bench ttft: ") && lines(b.err) == 1, "dead port: stderr %s", b.err);
    CHECK(b.out[0] == 0, "dead port: stdout %s", b.out);
    bt_free(&b);

    /* usage errors: not a redis URL; a password file without --store */
    snprintf(args, sizeof args, "-m %s --store http://127.0.0.1:%d", model, r.port);
    b = bt_run(args);
    CHECK(b.code == 2 && strstr(b.err, "redis://"), "bad URL: exit %d, %s", b.code, b.err);
    bt_free(&b);
    snprintf(args, sizeof args, "-m %s --store-password-file /nonexistent", model);
    b = bt_run(args);
    CHECK(b.code == 2 && strstr(b.err, "--store"), "password file alone: exit %d, %s", b.code, b.err);
    bt_free(&b);
}
