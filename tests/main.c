/* main.c - the test runner: runs every registered TEST (or those whose name
 * contains argv[1]) and prints "N passed, N failed, N skipped" last. Exit
 * status 1 when any test failed; skips alone do not fail the run.
 * AK_TESTS_EXCLUDE="name1,name2" leaves out the tests with exactly those
 * names (the sanitizer run leaves out the slowest, which the plain run has
 * covered); a line before the summary says how many were left out, and a
 * name that matches no test is an error (a renamed test must not silently
 * come back, nor a typo leave its test in). */
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "test.h"
#include "../src/util.h"

#define MAX_TESTS 1024
static struct { const char *name; ak_test_fn fn; } tests[MAX_TESTS];
static int n_tests;

void ak_test_register(const char *name, ak_test_fn fn) {
    if (n_tests < MAX_TESTS) { tests[n_tests].name = name; tests[n_tests].fn = fn; n_tests++; }
}

void ak_test_fail(ak_test_ctx *t, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  FAIL %s (%s:%d): ", t->name, file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    t->failures++;
}

void ak_test_skip(ak_test_ctx *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->skip_reason, sizeof t->skip_reason, fmt, ap);
    va_end(ap);
    if (!t->skip_reason[0]) snprintf(t->skip_reason, sizeof t->skip_reason, "(no reason given)");
}

const char *test_shared_dir(void) {
    const char *d = getenv("AK_SHARED");
    return d && *d ? d : "../shared";
}

const char *test_path(char *buf, size_t n, const char *rel) {
    snprintf(buf, n, "%s/%s", test_shared_dir(), rel);
    return buf;
}

static char tmp_dir[256];
const char *test_tmp_dir(void) {
    if (!tmp_dir[0]) {
        snprintf(tmp_dir, sizeof tmp_dir, "/tmp/agentkv-test-XXXXXX");
        if (!mkdtemp(tmp_dir)) { perror("mkdtemp"); exit(1); }
    }
    return tmp_dir;
}

int test_dial_loopback(int port, int timeout_ms) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int cmp_tests(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Whether `name` is one of the comma-separated names in `list` (NULL: no). */
static int name_in_list(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && memcmp(p, name, n) == 0) return 1;
        p = e ? e + 1 : NULL;
    }
    return 0;
}

/* Checks that every name in the exclusion list names a registered test.
 * Returns 0 when they all do, -1 after printing the ones that do not. */
static int check_exclusions(const char *list) {
    int bad = 0;
    char name[256];
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len > 0 && len < sizeof name) {
            memcpy(name, p, len);
            name[len] = 0;
            int found = 0;
            for (int i = 0; i < n_tests && !found; i++) found = strcmp(tests[i].name, name) == 0;
            if (!found) { fprintf(stderr, "AK_TESTS_EXCLUDE names no test: %s\n", name); bad = 1; }
        }
        p = e ? e + 1 : NULL;
    }
    return bad ? -1 : 0;
}

int main(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    const char *exclude = getenv("AK_TESTS_EXCLUDE");
    qsort(tests, n_tests, sizeof tests[0], cmp_tests);
    if (check_exclusions(exclude) != 0) {
        printf("0 passed, 1 failed, 0 skipped\n");
        return 1;
    }
    int passed = 0, failed = 0, skipped = 0, excluded = 0;
    for (int i = 0; i < n_tests; i++) {
        if (filter && !strstr(tests[i].name, filter)) continue;
        if (name_in_list(exclude, tests[i].name)) { excluded++; continue; }
        ak_test_ctx t = { tests[i].name, 0, "" };
        double t0 = ak_now();
        tests[i].fn(&t);
        double dt = ak_now() - t0;
        if (t.failures) { failed++; printf("FAIL %s (%.2fs)\n", tests[i].name, dt); }
        else if (t.skip_reason[0]) { skipped++; printf("SKIP %s: %s (%.2fs)\n", tests[i].name, t.skip_reason, dt); }
        else { passed++; printf("ok   %s (%.2fs)\n", tests[i].name, dt); }
        fflush(stdout);
    }
    if (tmp_dir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
    }
    if (excluded) printf("%d tests left out by AK_TESTS_EXCLUDE=%s\n", excluded, exclude);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
