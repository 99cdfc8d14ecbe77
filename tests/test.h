/* test.h - a tiny test harness. Each TEST registers itself at startup; the
 * runner (tests/main.c) runs them all (or those whose name contains argv[1])
 * and ends with the line "N passed, N failed, N skipped".
 *
 *   TEST(gguf_rejects_bad_magic) {
 *       CHECK(x == 1, "x was %d", x);      // records a failure, continues
 *       REQUIRE(p != NULL, "no p");         // records a failure, returns
 *       if (!have_root) SKIP("needs root"); // counted as skipped, returns
 *   }
 *
 * A skipped test is never counted as passed: the runner prints
 * "SKIP name: reason". A test that failed before it skipped counts as failed. */
#ifndef AK_TEST_H
#define AK_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    const char *name;
    int failures;
    char skip_reason[256];   /* non-empty: the test skipped itself (SKIP) */
} ak_test_ctx;

typedef void (*ak_test_fn)(ak_test_ctx *t);
void ak_test_register(const char *name, ak_test_fn fn);
void ak_test_fail(ak_test_ctx *t, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Marks the test skipped with a reason (printf format); the caller returns. */
void ak_test_skip(ak_test_ctx *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Directory of shared models and golden outputs (env AK_SHARED, default
 * "../shared"); test paths are built with test_path. */
const char *test_shared_dir(void);
/* Returns a static-per-call buffer path: shared_dir + "/" + rel. */
const char *test_path(char *buf, size_t n, const char *rel);
/* The first line of a golden JSONL file (shared_dir + "/" + rel) parsed
 * (a cJSON object, cJSON_Delete frees it), or NULL when it cannot be read
 * or parsed. */
struct cJSON *test_first_golden(const char *rel);
/* A fresh temporary directory for this test run (created once). */
const char *test_tmp_dir(void);
/* A TCP socket connected to 127.0.0.1:port with send and receive timeouts
 * of timeout_ms, or -1. */
int test_dial_loopback(int port, int timeout_ms);

#define TEST(name)                                                        \
    static void test_##name(ak_test_ctx *t);                              \
    __attribute__((constructor)) static void register_##name(void) {      \
        ak_test_register(#name, test_##name);                             \
    }                                                                     \
    static void test_##name(ak_test_ctx *t)

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (!(cond)) ak_test_fail(t, __FILE__, __LINE__, __VA_ARGS__);    \
    } while (0)

#define REQUIRE(cond, ...)                                                \
    do {                                                                  \
        if (!(cond)) {                                                    \
            ak_test_fail(t, __FILE__, __LINE__, __VA_ARGS__);             \
            return;                                                       \
        }                                                                 \
    } while (0)

/* Skips the rest of the test: reported as SKIP with the reason, counted
 * apart from passes. Use only where the test cannot run here (a missing
 * device, no privilege), never to hide a failure. */
#define SKIP(...)                                                         \
    do {                                                                  \
        ak_test_skip(t, __VA_ARGS__);                                     \
        return;                                                           \
    } while (0)

/* What a command run by test_cli_run printed and how it ended. */
typedef struct {
    int code;        /* exit status, 128 + signal, 124 or 137 when killed past its time */
    char *out, *err; /* stdout and stderr, whole (never NULL) */
} test_cli_result;

/* Runs `AK_BIN ARGS` (build/agentkv when AK_BIN is unset) through the
 * shell with stdin from /dev/null, capturing stdout and stderr; a run past
 * timeout_s is killed. Free with test_cli_free. */
test_cli_result test_cli_run(const char *args, int timeout_s);
void test_cli_free(test_cli_result *r);

#endif
