/* test_rstore.c - the stored responses and conversations (src/store/rstore.h):
 * the record file format against the header's specification, round trips,
 * replace, delete, expiry on a moved clock, budget eviction, the chain and
 * conversation lookups and their rebuild at open, corrupt files (every
 * flipped byte, every truncation) quarantined, hostile ids, injected I/O
 * failures and a writer killed at every step of a put. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include "store/rstore.h"
#include "test.h"
#include "test_store_util.h"

#define TTL 2592000   /* AK_RSTORE_DEFAULT_TTL_S spelled out: 30 days */

/* The tests' clock: unix seconds the test sets. */
typedef struct {
    int64_t t;
} tclock;

static int64_t tclock_now(void *ud) { return ((tclock *)ud)->t; }

/* Opens dir with the test clock c (ttl, budget 0: the defaults). */
static ak_rstore *rs_open(const char *dir, tclock *c, int64_t ttl, uint64_t budget, ak_error *err) {
    return ak_rstore_open(&(ak_rstore_opts){.dir = dir, .ttl_s = ttl, .budget_bytes = budget, .now = tclock_now,
                                            .now_ud = c},
                          err);
}

static ak_rstore_meta meta_of(char kind, uint64_t chain, const char *agent, const char *conv) {
    ak_rstore_meta m;
    memset(&m, 0, sizeof m);
    m.kind = kind;
    m.chain_hash = chain;
    snprintf(m.agent, sizeof m.agent, "%s", agent);
    snprintf(m.conversation, sizeof m.conversation, "%s", conv);
    return m;
}

/* <dir>/<id>.rec */
static const char *rec_path(const char *dir, const char *id) {
    static char buf[4][700];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, 700, "%s/%s.rec", dir, id);
    return b;
}

static int put_str(ak_rstore *s, const char *id, const char *body, ak_rstore_meta m, ak_error *err) {
    return ak_rstore_put(s, id, body, strlen(body), &m, err);
}

/* 1 if get(id) is OK with exactly body. */
static int holds(ak_rstore *s, const char *id, const char *body) {
    char *b = NULL;
    size_t n = 0;
    ak_error err = {{0}};
    int ok = ak_rstore_get(s, id, &b, &n, NULL, &err) == AK_RSTORE_OK && n == strlen(body) && !memcmp(b, body, n) &&
             b[n] == 0;
    free(b);
    return ok;
}

/* Files in dir/quarantine named "<id>.rec.*". */
static int rq_count(const char *dir, const char *id) {
    char qd[700];
    snprintf(qd, sizeof qd, "%s/quarantine", dir);
    DIR *d = opendir(qd);
    if (!d) return 0;
    int n = 0;
    size_t il = strlen(id);
    for (struct dirent *e; (e = readdir(d));) n += !strncmp(e->d_name, id, il) && !strncmp(e->d_name + il, ".rec.", 5);
    closedir(d);
    return n;
}

/* Hidden files (temp files start with '.') in dir. */
static int hidden_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* The whole file at path (malloc'd; *n bytes), or NULL. */
static char *slurp(const char *path, size_t *n) {
    ak_error err = {{0}};
    return ak_read_file(path, n, &err);
}

/* ------------------------------------------------------------- the format */

TEST(rstore_file_is_the_specified_format) {
    const char *dir = dir_for("rs-format");
    tclock c = {1000};
    ak_error err = {{0}};
    ak_rstore *s = rs_open(dir, &c, 100, 0, &err);
    REQUIRE(s, "open: %s", err.msg);
    /* empty body: XXH64 of no bytes is ef46db3751d8e999 (xxHash's test vector) */
    REQUIRE(put_str(s, "resp_1", "", meta_of('r', 0xab, "agent-1", "conv_1"), &err) == 0, "put: %s", err.msg);
    const char *line = "AKRS1 id=resp_1 kind=r seq=1 created=1000 expires=1100 chain=00000000000000ab agent=agent-1 "
                       "conv=conv_1 len=0 body=ef46db3751d8e999";
    char want[600];
    snprintf(want, sizeof want, "%s head=%016" PRIx64 "\n", line, (uint64_t)XXH64(line, strlen(line), 0));
    size_t n = 0;
    char *got = slurp(rec_path(dir, "resp_1"), &n);
    REQUIRE(got, "no file");
    CHECK(n == strlen(want) && !memcmp(got, want, n), "file:\n%.*s\nwant:\n%s", (int)n, got, want);
    free(got);

    /* a body with a newline and a NUL after the line, exactly */
    c.t = 1005;
    const char body[] = "{\"a\":\n1}\0x";
    REQUIRE(ak_rstore_put(s, "c-2", body, sizeof body - 1, &(ak_rstore_meta){.kind = 'c'}, &err) == 0, "put: %s",
            err.msg);
    char line2[300];
    snprintf(line2, sizeof line2, "AKRS1 id=c-2 kind=c seq=2 created=1005 expires=1105 chain=0000000000000000 agent= "
             "conv= len=10 body=%016" PRIx64, (uint64_t)XXH64(body, 10, 0));
    snprintf(want, sizeof want, "%s head=%016" PRIx64 "\n", line2, (uint64_t)XXH64(line2, strlen(line2), 0));
    got = slurp(rec_path(dir, "c-2"), &n);
    REQUIRE(got, "no file");
    CHECK(n == strlen(want) + 10 && !memcmp(got, want, strlen(want)) && !memcmp(got + strlen(want), body, 10),
          "file of c-2 differs from the specification");
    free(got);

    /* a file written by hand to the specification is read */
    ak_rstore_close(s);
    snprintf(line2, sizeof line2, "AKRS1 id=hand kind=r seq=7 created=5 expires=99999 chain=1234567890abcdef "
             "agent=a.b conv=c1 len=2 body=%016" PRIx64, (uint64_t)XXH64("hi", 2, 0));
    snprintf(want, sizeof want, "%s head=%016" PRIx64 "\nhi", line2, (uint64_t)XXH64(line2, strlen(line2), 0));
    REQUIRE(write_bytes(rec_path(dir, "hand"), want, strlen(want)) == 0, "write");
    s = rs_open(dir, &c, 100, 0, &err);
    REQUIRE(s, "open: %s", err.msg);
    char *b = NULL;
    size_t bl = 0;
    ak_rstore_meta m;
    CHECK(ak_rstore_get(s, "hand", &b, &bl, &m, &err) == AK_RSTORE_OK && bl == 2 && !strcmp(b, "hi"), "hand: %s",
          err.msg);
    CHECK(m.kind == 'r' && m.chain_hash == 0x1234567890abcdefull && !strcmp(m.agent, "a.b") &&
              !strcmp(m.conversation, "c1"),
          "hand meta");
    free(b);
    char id[65];
    CHECK(ak_rstore_find_chain(s, 0x1234567890abcdefull, id) == 0 && !strcmp(id, "hand"), "hand not indexed at open");
    /* the next new record is numbered after the largest seq seen (7) */
    REQUIRE(put_str(s, "next", "x", meta_of('r', 0, "", ""), &err) == 0, "put: %s", err.msg);
    got = slurp(rec_path(dir, "next"), &n);
    CHECK(got && strstr(got, " seq=8 "), "seq after reopen: %s", got ? got : "(none)");
    free(got);
    ak_rstore_close(s);
}

/* ------------------------------------------------- put, get, replace, delete */

TEST(rstore_put_get_round_trip) {
    const char *dir = dir_for("rs-rt");
    tclock c = {1000};
    ak_error err = {{0}};
    ak_rstore *s = rs_open(dir, &c, 0, 0, &err);
    REQUIRE(s, "open: %s", err.msg);
    char body[5000];
    for (int i = 0; i < 4999; i++) body[i] = (char)(' ' + (i * 7) % 90);
    body[4999] = 0;
    REQUIRE(put_str(s, "resp_a", body, meta_of('r', 42, "planner", "conv_x"), &err) == 0, "put: %s", err.msg);
    char *b = NULL;
    size_t n = 0;
    ak_rstore_meta m;
    memset(&m, 0x55, sizeof m);
    REQUIRE(ak_rstore_get(s, "resp_a", &b, &n, &m, &err) == AK_RSTORE_OK, "get: %s", err.msg);
    CHECK(n == 4999 && !memcmp(b, body, n) && b[n] == 0, "body differs");
    CHECK(m.kind == 'r' && m.chain_hash == 42 && !strcmp(m.agent, "planner") && !strcmp(m.conversation, "conv_x"),
          "meta differs");
    free(b);
    /* NULL out pointers are fine */
    CHECK(ak_rstore_get(s, "resp_a", NULL, NULL, NULL, &err) == AK_RSTORE_OK, "get without outputs");
    CHECK(ak_rstore_get(s, "nope", &b, &n, &m, &err) == AK_RSTORE_ABSENT && err.code == AK_ERR_NOT_FOUND,
          "missing record: %s", err.msg);
    ak_rstore_stats st;
    ak_rstore_get_stats(s, &st);
    CHECK(st.records == 1 && st.bytes == (uint64_t)file_size(rec_path(dir, "resp_a")) && !st.expired && !st.evicted &&
              !st.quarantined,
          "stats: %d records %" PRIu64 " bytes", st.records, st.bytes);
    ak_rstore_close(s);
}

TEST(rstore_replace_and_delete) {
    const char *dir = dir_for("rs-replace");
    tclock c = {1000};
    ak_error err = {{0}};
    ak_rstore *s = rs_open(dir, &c, 100, 0, &err);
    REQUIRE(s, "open: %s", err.msg);
    REQUIRE(put_str(s, "a", "first", meta_of('r', 1, "", "cv"), &err) == 0, "put: %s", err.msg);
    c.t = 1001;
    REQUIRE(put_str(s, "b", "bee", meta_of('r', 2, "", "cv"), &err) == 0, "put: %s", err.msg);
    c.t = 1050;
    REQUIRE(put_str(s, "a", "second, longer", meta_of('r', 3, "ag", "cv"), &err) == 0, "replace: %s", err.msg);
    CHECK(holds(s, "a", "second, longer"), "replace not read back");
    ak_rstore_meta m;
    CHECK(ak_rstore_get(s, "a", NULL, NULL, &m, &err) == AK_RSTORE_OK && m.chain_hash == 3 && !strcmp(m.agent, "ag"),
          "replaced meta");
    char id[65];
    CHECK(ak_rstore_find_chain(s, 1, id) == -1, "the old chain hash still found");
    CHECK(ak_rstore_find_chain(s, 3, id) == 0 && !strcmp(id, "a"), "the new chain hash not found");
    /* the replace keeps its place (seq 1, created 1000) and expires 100 s after it */
    size_t n;
    char *got = slurp(rec_path(dir, "a"), &n);
    CHECK(got && strstr(got, " seq=1 created=1000 expires=1150 "), "replaced header: %s", got ? got : "");
    free(got);
    ak_rstore_stats st;
    ak_rstore_get_stats(s, &st);
    CHECK(st.records == 2 && st.bytes == (uint64_t)(file_size(rec_path(dir, "a")) + file_size(rec_path(dir, "b"))),
          "stats after replace: %d %" PRIu64, st.records, st.bytes);
    c.t = 1120;   /* b (1001 + 100) expired, a (1050 + 100) not */
    CHECK(holds(s, "a", "second, longer"), "the replace did not renew the expiry");
    CHECK(ak_rstore_get(s, "b", NULL, NULL, NULL, &err) == AK_RSTORE_ABSENT, "b outlived its time");

    CHECK(ak_rstore_delete(s, "a", &err) == AK_RSTORE_OK, "delete: %s", err.msg);
    CHECK(!exists(rec_path(dir, "a")), "file left after delete");
    CHECK(ak_rstore_get(s, "a", NULL, NULL, NULL, &err) == AK_RSTORE_ABSENT, "deleted record read");
    CHECK(ak_rstore_delete(s, "a", &err) == AK_RSTORE_ABSENT, "second delete");
    CHECK(ak_rstore_delete(s, "never", &err) == AK_RSTORE_ABSENT, "delete of a record never written");
    CHECK(ak_rstore_find_chain(s, 3, id) == -1, "deleted record still found by chain");
    ak_rstore_get_stats(s, &st);
    CHECK(st.records == 0 && st.bytes == 0 && st.expired == 1, "stats after delete: %d %" PRIu64 " %" PRIu64,
          st.records, st.bytes, st.expired);
    ak_rstore_close(s);
}

/* ------------------------------------------------------------------ expiry */

TEST(rstore_expiry_on_a_moved_clock) {
    const char *dir = dir_for("rs-expiry");
    tclock c = {1000};
    ak_error err = {{0}};
    ak_rstore *s = rs_open(dir, &c, 100, 0, &err);
    REQUIRE(s, "open: %s", err.msg);
    const uint64_t H = 0xfeedull;
    REQUIRE(put_str(s, "y", "old", meta_of('r', H, "", "cv"), &err) == 0, "put: %s", err.msg);
    REQUIRE(put_str(s, "x", "new", meta_of('r', H, "", "cv"), &err) == 0, "put: %s", err.msg);
    REQUIRE(put_str(s, "z", "zzz", meta_of('c', 0, "", ""), &err) == 0, "put: %s", err.msg);
    c.t = 1050;
    REQUIRE(put_str(s, "y", "old2", meta_of('r', H, "", "cv"), &err) == 0, "replace: %s", err.msg);
    char id[65];
    CHECK(ak_rstore_find_chain(s, H, id) == 0 && !strcmp(id, "x"), "newest of the chain: %s", id);
    c.t = 1099;
    CHECK(holds(s, "x", "new"), "x gone before its time");
    c.t = 1100;   /* x and z expire now (1000 + 100); y at 1150 */
    CHECK(ak_rstore_find_chain(s, H, id) == 0 && !strcmp(id, "y"), "an expired record found by chain: %s", id);
    CHECK(exists(rec_path(dir, "x")), "find_chain deleted a file");
    CHECK(ak_rstore_get(s, "x", NULL, NULL, NULL, &err) == AK_RSTORE_ABSENT && err.code == AK_ERR_NOT_FOUND,
          "x after its ttl");
    CHECK(!exists(rec_path(dir, "x")), "expired file left after get");
    int calls = ak_rstore_each_in_conversation(s, "cv", NULL, NULL);
    CHECK(calls == 0, "NULL fn: %d", calls);
    ak_rstore_stats st;
    ak_rstore_get_stats(s, &st);   /* meets z too */
    CHECK(st.records == 1 && st.expired == 2 && !exists(rec_path(dir, "z")), "stats: %d records, %" PRIu64 " expired",
          st.records, st.expired);
    ak_rstore_close(s);
    /* open deletes what expired meanwhile */
    c.t = 1150;
    s = rs_open(dir, &c, 100, 0, &err);
    REQUIRE(s, "open: %s", err.msg);
    ak_rstore_get_stats(s, &st);
    CHECK(st.records == 0 && st.expired == 1 && !exists(rec_path(dir, "y")), "open: %d records, %" PRIu64 " expired",
          st.records, st.expired);
    /* a record this store never indexed (another store wrote it) expires as well */
    ak_rstore *o = rs_open(dir, &c, 50, 0, &err);
    REQUIRE(o, "open: %s", err.msg);
    REQUIRE(put_str(o, "ext", "e", meta_of('r', 0, "", ""), &err) == 0, "put: %s", err.msg);   /* expires 1200 */
    ak_rstore_close(o);
    c.t = 1200;
    CHECK(ak_rstore_get(s, "ext", NULL, NULL, NULL, &err) == AK_RSTORE_ABSENT && !exists(rec_path(dir, "ext")),
          "ext after its ttl");
    ak_rstore_get_stats(s, &st);
    CHECK(st.records == 0 && st.expired == 2, "ext: %d records, %" PRIu64 " expired", st.records, st.expired);
    ak_rstore_close(s);
}

/* ------------------------------------------------------------------ budget */

TEST(rstore_budget_evicts_oldest_first) {
    const char *dir = dir_for("rs-budget");
    /* every file here: this line (ids e1..e9, seq 1..9, created 1000, the
     * default ttl) and 1000 body bytes */
    const size_t file = strlen("AKRS1 id=e1 kind=r seq=1 created=1000 expires=2593000 chain=0000000000000000 agent= "
                               "conv= len=1000 body=0123456789abcdef head=0123456789abcdef\n") + 1000;
    const uint64_t budget = 3 * file + file / 2;
    tclock c = {1000};
    ak_error err = {{0}};
    ak_rstore *s = rs_open(dir, &c, 0, budget, &err);
    REQUIRE(s, "open: %s", err.msg);
    char body[1001];
    memset(body, 'x', 1000);
    body[1000] = 0;
    char id[16];
    for (int i = 1; i <= 3; i++) {
        snprintf(id, sizeof id, "e%d", i);
        REQUIRE(put_str(s, id, body, meta_of('r', 0, "", ""), &err) == 0, "put: %s", err.msg);
        CHECK(file_size(rec_path(dir, id)) == (long)file, "%s: %ld bytes, want %zu", id, file_size(rec_path(dir, id)),
              file);
    }
    body[0] = 'y';
    REQUIRE(put_str(s, "e2", body, meta_of('r', 0, "", ""), &err) == 0, "replace: %s", err.msg);   /* keeps its place */
    ak_rstore_stats st;
    ak_rstore_get_stats(s, &st);
    CHECK(st.records == 3 && st.bytes == 3 * file && st.evicted == 0, "before: %d %" PRIu64, st.records, st.bytes);
    REQUIRE(put_str(s, "e4", body, meta_of('r', 0, "", ""), &err) == 0, "put: %s", err.msg);
    CHECK(!exists(rec_path(dir, "e1")) && exists(rec_path(dir, "e2")) && exists(rec_path(dir, "e3")) &&
              exists(rec_path(dir, "e4")),
          "e1 (oldest) should have gone");
    CHECK(ak_rstore_get(s, "e1", NULL, NULL, NULL, &err) == AK_RSTORE_ABSENT, "evicted record read");
    REQUIRE(put_str(s, "e5", body, meta_of('r', 0, "", ""), &err) == 0, "put: %s", err.msg);
    CHECK(!exists(rec_path(dir, "e2")) && exists(rec_path(dir, "e3")), "e2 (next oldest, though rewritten) should go");
    ak_rstore_get_stats(s, &st);
    CHECK(st.records == 3 && st.bytes == 3 * file && st.evicted == 2, "after: %d %" PRIu64 " %" PRIu64, st.records,
          st.bytes, st.evicted);

    /* one record over the budget by itself (body within it): every other goes, never it */
    size_t big = (size_t)budget - 10;
    char *bb = malloc(big);
    REQUIRE(bb, "malloc");
    memset(bb, 'b', big);
    REQUIRE(ak_rstore_put(s, "e6", bb, big, &(ak_rstore_meta){.kind = 'r'}, &err) == 0, "big put: %s", err.msg);
    ak_rstore_get_stats(s, &st);
    CHECK(st.records == 1 && exists(rec_path(dir, "e6")) && st.evicted == 5 &&
              st.bytes == (uint64_t)file_size(rec_path(dir, "e6")),
          "big: %d records, %" PRIu64 " evicted", st.records, st.evicted);
    /* a body larger than the budget is refused, nothing changes */
    char *huge = malloc(budget + 1);
    REQUIRE(huge, "malloc");
    memset(huge, 'h', budget + 1);
    CHECK(ak_rstore_put(s, "e7", huge, budget + 1, &(ak_rstore_meta){.kind = 'r'}, &err) == -1 &&
              err.code == AK_ERR_INVALID,
          "over-budget body accepted");
    ak_rstore_get_stats(s, &st);
    CHECK(st.records == 1 && !exists(rec_path(dir, "e7")) && exists(rec_path(dir, "e6")), "the refusal changed things");
    free(huge);
    free(bb);
    ak_rstore_close(s);
}

/* ------------------------------------------------ chain and conversations */

typedef struct {
    char ids[8][65];
    int n, stop_at;
    ak_rstore *s;
    int bodies_ok;
} visit;

static int visit_fn(const char *id, void *ud) {
    visit *v = ud;
    if (v->n < 8) snprintf(v->ids[v->n], 65, "%s", id);
    v->n++;
    /* the callback may use the store (no lock held) */
    char *b = NULL;
    size_t n;
    ak_error err = {{0}};
    if (ak_rstore_get(v->s, id, &b, &n, NULL, &err) != AK_RSTORE_OK || strcmp(b, id)) v->bodies_ok = 0;
    free(b);
    return v->n == v->stop_at;
}

/* Checks that conversation conv lists exactly want (n ids, in order). */
static void check_conv(ak_test_ctx *t, ak_rstore *s, const char *conv, const char *const *want, int n) {
    visit v = {.s = s, .bodies_ok = 1};
    int calls = ak_rstore_each_in_conversation(s, conv, visit_fn, &v);
    CHECK(calls == n && v.n == n && v.bodies_ok, "%s: %d calls, want %d", conv, calls, n);
    for (int i = 0; i < n && i < v.n; i++)
        CHECK(!strcmp(v.ids[i], want[i]), "%s[%d] = %s, want %s", conv, i, v.ids[i], want[i]);
}

/* Writes the chain and conversation fixture: body = id. */
static int chain_fixture(ak_rstore *s, tclock *c, ak_error *err) {
    struct { const char *id; char kind; uint64_t h; const char *conv; } r[] = {
        {"c1", 'c', 0, ""}, {"r4", 'r', 0x11, "c1"}, {"r2", 'r', 0x11, "c2"}, {"r1", 'r', 0x22, "c1"},
        {"r3", 'r', 0x11, "c1"}, {"cz", 'c', 0x11, ""},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        c->t = 1000;   /* one second for all: the order is the order written, not the clock's */
        if (put_str(s, r[i].id, r[i].id, meta_of(r[i].kind, r[i].h, "", r[i].conv), err) != 0) return -1;
    }
    return 0;
}

TEST(rstore_find_chain_newest_first) {
    const char *dir = dir_for("rs-chain");
    tclock c = {1000};
    ak_error err = {{0}};
    ak_rstore *s = rs_open(dir, &c, 0, 0, &err);
    REQUIRE(s, "open: %s", err.msg);
    REQUIRE(chain_fixture(s, &c, &err) == 0, "put: %s", err.msg);
    char id[65];
    /* 0x11: r4, r2, r3 responses (cz is a conversation, newer still) */
    CHECK(ak_rstore_find_chain(s, 0x11, id) == 0 && !strcmp(id, "r3"), "0x11: %s", id);
    CHECK(ak_rstore_find_chain(s, 0x22, id) == 0 && !strcmp(id, "r1"), "0x22: %s", id);
    CHECK(ak_rstore_find_chain(s, 0x33, id) == -1, "0x33 found");
    CHECK(ak_rstore_find_chain(s, 0, id) == -1, "0 found");
    CHECK(ak_rstore_delete(s, "r3", &err) == AK_RSTORE_OK, "delete: %s", err.msg);
    CHECK(ak_rstore_find_chain(s, 0x11, id) == 0 && !strcmp(id, "r2"), "after delete: %s", id);
    ak_rstore_close(s);
}

TEST(rstore_conversation_in_write_order) {
    const char *dir = dir_for("rs-conv");
    tclock c = {1000};
    ak_error err = {{0}};
    ak_rstore *s = rs_open(dir, &c, 0, 0, &err);
    REQUIRE(s, "open: %s", err.msg);
    REQUIRE(chain_fixture(s, &c, &err) == 0, "put: %s", err.msg);
    const char *c1[] = {"r4", "r1", "r3"}, *c2[] = {"r2"};
    check_conv(t, s, "c1", c1, 3);
    check_conv(t, s, "c2", c2, 1);
    check_conv(t, s, "c3", NULL, 0);
    check_conv(t, s, "bad/conv", NULL, 0);
    visit v = {.s = s, .bodies_ok = 1, .stop_at = 2};
    CHECK(ak_rstore_each_in_conversation(s, "c1", visit_fn, &v) == 2 && v.n == 2, "stop after two: %d", v.n);
    /* a record moved to another conversation by a replace keeps its place:
     * r4 was written before r2 */
    REQUIRE(put_str(s, "r4", "r4", meta_of('r', 0x11, "", "c2"), &err) == 0, "put: %s", err.msg);
    const char *c1b[] = {"r1", "r3"}, *c2b[] = {"r4", "r2"};
    check_conv(t, s, "c1", c1b, 2);
    check_conv(t, s, "c2", c2b, 2);
    ak_rstore_close(s);
}

TEST(rstore_reopen_rebuilds_the_index) {
    const char *dir = dir_for("rs-reopen");
    tclock c = {1000};
    ak_error err = {{0}};
    ak_rstore *s = rs_open(dir, &c, 0, 0, &err);
    REQUIRE(s, "open: %s", err.msg);
    REQUIRE(chain_fixture(s, &c, &err) == 0, "put: %s", err.msg);
    /* enough records to grow the tables past their first size */
    for (int i = 0; i < 150; i++) {
        char id[16];
        snprintf(id, sizeof id, "f%03d", i);
        REQUIRE(put_str(s, id, id, meta_of('r', 0x1000 + (uint64_t)i, "", i % 2 ? "c9" : ""), &err) == 0, "put: %s",
                err.msg);
    }
    ak_rstore_stats a, b;
    ak_rstore_get_stats(s, &a);
    ak_rstore_close(s);
    s = rs_open(dir, &c, 0, 0, &err);
    REQUIRE(s, "reopen: %s", err.msg);
    ak_rstore_get_stats(s, &b);
    CHECK(a.records == 156 && b.records == 156 && a.bytes == b.bytes, "stats %d/%d %" PRIu64 "/%" PRIu64, a.records,
          b.records, a.bytes, b.bytes);
    char id[65];
    CHECK(ak_rstore_find_chain(s, 0x11, id) == 0 && !strcmp(id, "r3"), "0x11 after reopen: %s", id);
    CHECK(ak_rstore_find_chain(s, 0x1000 + 77, id) == 0 && !strcmp(id, "f077"), "f077 after reopen: %s", id);
    const char *c1[] = {"r4", "r1", "r3"};
    check_conv(t, s, "c1", c1, 3);
    visit v = {.s = s, .bodies_ok = 1};
    CHECK(ak_rstore_each_in_conversation(s, "c9", visit_fn, &v) == 75 && v.bodies_ok, "c9: %d", v.n);
    CHECK(!strcmp(v.ids[0], "f001") && !strcmp(v.ids[7], "f015"), "c9 order: %s .. %s", v.ids[0], v.ids[7]);
    /* a record written after the reopen comes after the others */
    REQUIRE(put_str(s, "r0", "r0", meta_of('r', 0x11, "", "c1"), &err) == 0, "put: %s", err.msg);
    const char *c1b[] = {"r4", "r1", "r3", "r0"};
    check_conv(t, s, "c1", c1b, 4);
    CHECK(ak_rstore_find_chain(s, 0x11, id) == 0 && !strcmp(id, "r0"), "0x11 newest: %s", id);
    ak_rstore_close(s);
}

/* ---------------------------------------------------------------- corrupt */

TEST(rstore_every_flipped_byte_and_truncation_is_corrupt) {
    const char *dir = dir_for("rs-corrupt");
    tclock c = {1000};
    ak_error err = {{0}};
    ak_rstore *s = rs_open(dir, &c, 0, 0, &err);
    REQUIRE(s, "open: %s", err.msg);
    REQUIRE(put_str(s, "keep", "{\"k\":1}", meta_of('r', 5, "a", "cv"), &err) == 0, "put: %s", err.msg);
    REQUIRE(put_str(s, "v", "{\"id\":\"v\",\"x\":[1,2,3]}", meta_of('r', 9, "ag", "cv"), &err) == 0, "put: %s",
            err.msg);
    size_t n = 0;
    char *orig = slurp(rec_path(dir, "v"), &n);
    REQUIRE(orig && n > 150, "no file");
    uint64_t q = 0;
    int wrong = 0;
    const uint8_t flips[] = {0x01, 0x20, 0x80};
    char *bad = malloc(n);
    REQUIRE(bad, "malloc");
    for (size_t p = 0; p < n; p++)
        for (int f = 0; f < 3; f++) {
            memcpy(bad, orig, n);
            bad[p] = (char)(bad[p] ^ flips[f]);
            REQUIRE(write_bytes(rec_path(dir, "v"), bad, n) == 0, "write");
            ak_rstore_status st = ak_rstore_get(s, "v", NULL, NULL, NULL, &err);
            if (st != AK_RSTORE_CORRUPT || err.code != AK_ERR_CORRUPT || exists(rec_path(dir, "v"))) {
                if (wrong++ < 5) CHECK(0, "byte %zu ^ %02x: %s (%s)", p, flips[f], ak_rstore_status_name(st), err.msg);
            }
            q++;
        }
    for (size_t len = 0; len < n; len++) {
        REQUIRE(write_bytes(rec_path(dir, "v"), orig, len) == 0, "write");
        ak_rstore_status st = ak_rstore_get(s, "v", NULL, NULL, NULL, &err);
        if (st != AK_RSTORE_CORRUPT || exists(rec_path(dir, "v"))) {
            if (wrong++ < 10) CHECK(0, "cut to %zu bytes: %s (%s)", len, ak_rstore_status_name(st), err.msg);
        }
        q++;
    }
    /* bytes after the body */
    REQUIRE(write_bytes(rec_path(dir, "v"), orig, n) == 0 && write_bytes(rec_path(dir, "v2"), orig, n) == 0, "write");
    FILE *fp = fopen(rec_path(dir, "v"), "ab");
    REQUIRE(fp && fputc('\n', fp) != EOF && fclose(fp) == 0, "append");
    CHECK(ak_rstore_get(s, "v", NULL, NULL, NULL, &err) == AK_RSTORE_CORRUPT, "a byte past the body accepted");
    q++;
    /* a sound record under another record's name */
    CHECK(ak_rstore_get(s, "v2", NULL, NULL, NULL, &err) == AK_RSTORE_CORRUPT && strstr(err.msg, "another"),
          "v's file as v2: %s", err.msg);
    q++;
    printf("  e.g. %s\n", err.msg);
    ak_rstore_stats st;
    ak_rstore_get_stats(s, &st);
    CHECK(st.quarantined == q && st.records == 1, "quarantined %" PRIu64 " of %" PRIu64 ", %d records", st.quarantined,
          q, st.records);
    CHECK(rq_count(dir, "v") >= 1 && rq_count(dir, "v") + rq_count(dir, "v2") <= AK_STORE_QUARANTINE_MAX,
          "quarantine/ holds %d", rq_count(dir, "v"));
    CHECK(holds(s, "keep", "{\"k\":1}"), "the other record was affected");
    char id[65];
    CHECK(ak_rstore_find_chain(s, 9, id) == -1 && ak_rstore_find_chain(s, 5, id) == 0, "index after quarantine");

    /* a corrupt file found at open is quarantined there */
    ak_rstore_close(s);
    memcpy(bad, orig, n);
    bad[20] ^= 0x01;
    REQUIRE(write_bytes(rec_path(dir, "v"), bad, n) == 0, "write");
    s = rs_open(dir, &c, 0, 0, &err);
    REQUIRE(s, "open: %s", err.msg);
    ak_rstore_get_stats(s, &st);
    CHECK(st.quarantined == 1 && st.records == 1 && !exists(rec_path(dir, "v")), "open: %" PRIu64 " quarantined",
          st.quarantined);
    CHECK(holds(s, "keep", "{\"k\":1}"), "the other record was affected");
    free(bad);
    free(orig);
    ak_rstore_close(s);
}

/* ------------------------------------------------------------ hostile ids */

TEST(rstore_hostile_ids_refused) {
    const char *dir = dir_for("rs-ids/inner");
    tclock c = {1000};
    ak_error err = {{0}};
    ak_rstore *s = rs_open(dir, &c, 0, 0, &err);
    REQUIRE(s, "open: %s", err.msg);
    char long_id[70];
    memset(long_id, 'a', 65);
    long_id[65] = 0;
    const char *bad[] = {"../x", "", "a/b", "a.b", ".x", "..", "a b", "a\nb", "x\xc3\xa9", long_id};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.code = 0;
        CHECK(put_str(s, bad[i], "x", meta_of('r', 0, "", ""), &err) == -1 && err.code == AK_ERR_INVALID,
              "put of \"%s\" accepted", bad[i]);
        CHECK(ak_rstore_get(s, bad[i], NULL, NULL, NULL, &err) == AK_RSTORE_ABSENT && err.code == AK_ERR_INVALID,
              "get of \"%s\"", bad[i]);
        CHECK(ak_rstore_delete(s, bad[i], &err) == AK_RSTORE_ABSENT && err.code == AK_ERR_INVALID, "delete of \"%s\"",
              bad[i]);
        CHECK(!ak_rstore_id_valid(bad[i]), "\"%s\" valid", bad[i]);
    }
    CHECK(put_str(s, NULL, "x", meta_of('r', 0, "", ""), &err) == -1 && err.code == AK_ERR_INVALID, "NULL id");
    CHECK(!exists(rec_path(dir_for("rs-ids"), "x")), "a file was written outside the directory");
    long_id[64] = 0;   /* 64 characters: the longest */
    CHECK(put_str(s, long_id, "x", meta_of('r', 0, "", ""), &err) == 0 && holds(s, long_id, "x"), "64-char id: %s",
          err.msg);
    CHECK(put_str(s, "Az09_-", "x", meta_of('c', 0, "", ""), &err) == 0, "every class of character: %s", err.msg);
    /* bad meta */
    CHECK(put_str(s, "m", "x", meta_of('x', 0, "", ""), &err) == -1 && err.code == AK_ERR_INVALID, "kind 'x'");
    CHECK(put_str(s, "m", "x", meta_of('r', 0, "../a", ""), &err) == -1 && err.code == AK_ERR_INVALID, "agent ../a");
    CHECK(put_str(s, "m", "x", meta_of('r', 0, "a b", ""), &err) == -1 && err.code == AK_ERR_INVALID, "agent a b");
    CHECK(put_str(s, "m", "x", meta_of('r', 0, "", "a.b"), &err) == -1 && err.code == AK_ERR_INVALID, "conv a.b");
    CHECK(ak_rstore_put(s, "m", "x", 1, NULL, &err) == -1 && err.code == AK_ERR_INVALID, "no meta");
    CHECK(!exists(rec_path(dir, "m")), "a refused put wrote a file");
    ak_rstore_close(s);
    CHECK(ak_rstore_open(&(ak_rstore_opts){.dir = dir, .ttl_s = -1}, &err) == NULL && err.code == AK_ERR_INVALID,
          "negative ttl");
}

/* ------------------------------------------------------ failures, crashes */

TEST(rstore_injected_io_failure_keeps_the_previous_record) {
    const char *dir = dir_for("rs-enospc");
    tclock c = {1000};
    ak_error err = {{0}};
    ak_rstore *s = rs_open(dir, &c, 0, 0, &err);
    REQUIRE(s, "open: %s", err.msg);
    char nw[700];
    memset(nw, 'n', sizeof nw - 1);
    nw[sizeof nw - 1] = 0;
    int steps = -1;
    for (int n = 1; n < 40 && steps < 0; n++) {
        REQUIRE(put_str(s, "r", "old", meta_of('r', 1, "", "cv"), &err) == 0, "put: %s", err.msg);
        char spec[32];
        snprintf(spec, sizeof spec, "%d:ENOSPC", n);
        setenv("AK_FAULT_FAIL_AT", spec, 1);
        setenv("AK_FAULT_WRITE_CHUNK", "128", 1);
        ak_rstore *f = rs_open(dir, &c, 0, 0, &err);
        unsetenv("AK_FAULT_FAIL_AT");
        unsetenv("AK_FAULT_WRITE_CHUNK");
        REQUIRE(f, "open: %s", err.msg);
        int rc = put_str(f, "r", nw, meta_of('r', 2, "", "cv2"), &err);
        int dir_fsync = rc != 0 && strstr(err.msg, "may not survive");
        if (rc == 0) steps = n - 1;
        else if (!dir_fsync)
            CHECK(err.code == AK_ERR_NOSPACE && strstr(err.msg, "intact"), "step %d: %s", n, err.msg);
        /* the failing store's own index, and a fresh one */
        const char *want = rc == 0 || dir_fsync ? nw : "old";
        char id[65];
        CHECK(holds(f, "r", want) && ak_rstore_find_chain(f, rc == 0 || dir_fsync ? 2 : 1, id) == 0,
              "step %d: the failing store does not hold the %s record", n, want == nw ? "new" : "old");
        ak_rstore_close(f);
        CHECK(holds(s, "r", want), "step %d: the file is not the %s record", n, want == nw ? "new" : "old");
        CHECK(hidden_files(dir) == 0, "step %d: a temp file was left", n);
    }
    CHECK(steps >= 8, "a put took only %d steps", steps);   /* fallocate, 6+ writes, fsync, rename, dir fsync */
    ak_rstore_close(s);
}

/* In a child: opens dir with AK_FAULT_KILL_AT=n and puts body as "k". */
static void child_put(const char *dir, int n, const char *body) {
    char buf[32];
    snprintf(buf, sizeof buf, "%d", n);
    setenv("AK_FAULT_KILL_AT", buf, 1);
    setenv("AK_FAULT_WRITE_CHUNK", "100", 1);
    tclock c = {2000};
    ak_error err = {{0}};
    ak_rstore *s = rs_open(dir, &c, 0, 0, &err);
    if (!s) _exit(3);
    _exit(put_str(s, "k", body, meta_of('r', 2, "", ""), &err) == 0 ? 0 : 2);
}

TEST(rstore_writer_killed_mid_put_leaves_old_or_new) {
    const char *dir = dir_for("rs-crash");
    tclock c = {1000};
    ak_error err = {{0}};
    char nw[1200];
    memset(nw, 'N', sizeof nw - 1);
    nw[sizeof nw - 1] = 0;
    int steps = -1, trials = 0, seen[64] = {0};
    for (int n = 1; n < 64 && steps < 0; n++) {
        ak_rstore *s = rs_open(dir, &c, 0, 0, &err);
        REQUIRE(s, "open: %s", err.msg);
        REQUIRE(put_str(s, "k", "the old record", meta_of('r', 1, "", ""), &err) == 0, "put: %s", err.msg);
        fflush(NULL);
        pid_t pid = fork();
        REQUIRE(pid >= 0, "fork");
        if (pid == 0) child_put(dir, n, nw);
        int ws = 0;
        waitpid(pid, &ws, 0);
        if (WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL) {
            trials++;
        } else {
            CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "step %d: child status %d", n, ws);
            steps = n - 1;
        }
        /* this store (opened before) and a fresh one both see one whole version */
        int v = holds(s, "k", "the old record") ? 0 : holds(s, "k", nw) ? 1 : -1;
        ak_rstore_close(s);
        s = rs_open(dir, &c, 0, 0, &err);   /* removes the dead child's temp file */
        REQUIRE(s, "reopen: %s", err.msg);
        int v2 = holds(s, "k", "the old record") ? 0 : holds(s, "k", nw) ? 1 : -1;
        ak_rstore_stats st;
        ak_rstore_get_stats(s, &st);
        CHECK(v >= 0 && v == v2 && st.quarantined == 0, "killed at step %d: version %d / %d, %" PRIu64 " quarantined",
              n, v, v2, st.quarantined);
        CHECK(hidden_files(dir) == 0, "step %d: temp file left after reopening", n);
        seen[n] = v;
        ak_rstore_close(s);
    }
    REQUIRE(steps > 8, "a put took only %d steps", steps);
    /* the rename is the second-to-last step: killed at or before it, the
     * old record; at the directory fsync after it, the new one */
    for (int n = 1; n <= steps; n++)
        CHECK(seen[n] == (n >= steps), "killed at step %d of %d: version %d", n, steps, seen[n]);
    printf("  %d kills over %d steps\n", trials, steps);
}

/* ---------------------------------------------------------------- threads */

typedef struct {
    ak_rstore *s;
    int k;
    int bad;
} worker;

static void *worker_run(void *p) {
    worker *w = p;
    ak_error err = {{0}};
    for (int i = 0; i < 60; i++) {
        char id[32], body[64], got[65], pre[16];
        snprintf(id, sizeof id, "w%d-%d", w->k, i % 10);
        snprintf(body, sizeof body, "{\"w\":%d,\"i\":%d}", w->k, i);
        uint64_t h = 0x5000 + (uint64_t)w->k;
        if (put_str(w->s, id, body, meta_of('r', h, "", "shared"), &err) != 0 || !holds(w->s, id, body)) w->bad++;
        snprintf(pre, sizeof pre, "w%d-", w->k);
        if (ak_rstore_find_chain(w->s, h, got) != 0 || strncmp(got, pre, strlen(pre))) w->bad++;
        if (i % 7 == 0 && ak_rstore_delete(w->s, id, &err) != AK_RSTORE_OK) w->bad++;
    }
    return NULL;
}

TEST(rstore_threads_share_one_store) {
    const char *dir = dir_for("rs-threads");
    tclock c = {1000};
    ak_error err = {{0}};
    ak_rstore *s = rs_open(dir, &c, 0, 0, &err);
    REQUIRE(s, "open: %s", err.msg);
    worker w[4];
    pthread_t th[4];
    for (int k = 0; k < 4; k++) {
        w[k] = (worker){.s = s, .k = k};
        REQUIRE(pthread_create(&th[k], NULL, worker_run, &w[k]) == 0, "thread");
    }
    for (int k = 0; k < 4; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < 4; k++) CHECK(w[k].bad == 0, "worker %d: %d failures", k, w[k].bad);
    ak_rstore_stats st;
    ak_rstore_get_stats(s, &st);
    /* each worker ends with ids i%10 of i = 50..59, less those deleted last (i = 56) */
    CHECK(st.records == 4 * 9, "records: %d", st.records);
    ak_rstore_close(s);
}
