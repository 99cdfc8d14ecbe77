/* main.c - the test runner: runs every registered TEST (or those whose name
 * contains argv[1]) and prints "N passed, N failed, N skipped" last. Exit
 * status 1 when any test failed; skips alone do not fail the run.
 * AK_TESTS_EXCLUDE="name1,name2" leaves out the tests with exactly those
 * names (the sanitizer run leaves out the slowest, which the plain run has
 * covered); a line before the summary says how many were left out, and a
 * name that matches no test is an error (a renamed test must not silently
 * come back, nor a typo leave its test in).
 * AK_TEST_JOBS=N runs the tests in N worker processes (each takes the next
 * test when free; each has its own temporary directory); every test's output
 * is still printed whole and in name order. */
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "test.h"
#include "base/util.h"

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

struct cJSON *test_first_golden(const char *rel) {
    char path[512];
    char *text = ak_read_file(test_path(path, sizeof path, rel), NULL, NULL);
    if (!text) return NULL;
    char *nl = strchr(text, '\n');
    if (nl) *nl = 0;
    cJSON *j = cJSON_Parse(text);
    free(text);
    return j;
}

static char tmp_dir[256];
const char *test_tmp_dir(void) {
    if (!tmp_dir[0]) {
        snprintf(tmp_dir, sizeof tmp_dir, "/tmp/agentkv-test-XXXXXX");
        if (!mkdtemp(tmp_dir)) { perror("mkdtemp"); exit(1); }
    }
    return tmp_dir;
}

test_cli_result test_cli_run(const char *args, int timeout_s) {
    test_cli_result r = {.code = -1};
    const char *b = getenv("AK_BIN");
    char out_path[512], err_path[512], cmd[4096];
    snprintf(out_path, sizeof out_path, "%s/cli.out", test_tmp_dir());
    snprintf(err_path, sizeof err_path, "%s/cli.err", test_tmp_dir());
    snprintf(cmd, sizeof cmd, "timeout -k 10 %d %s %s >%s 2>%s </dev/null", timeout_s, b && *b ? b : "build/agentkv",
             args, out_path, err_path);
    int st = system(cmd);
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = ak_read_file(out_path, NULL, NULL);
    r.err = ak_read_file(err_path, NULL, NULL);
    if (!r.out) r.out = calloc(1, 1);
    if (!r.err) r.err = calloc(1, 1);
    return r;
}

void test_cli_free(test_cli_result *r) {
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

int test_dial_loopback(int port, int timeout_ms) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
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

/* Runs test i, printing its result line; returns 0 passed, 1 failed, 2 skipped. */
static int run_one(int i) {
    ak_test_ctx t = { .name = tests[i].name, .skip_reason = "" };
    double t0 = ak_now();
    tests[i].fn(&t);
    double dt = ak_now() - t0;
    int r;
    if (t.failures) { r = 1; printf("FAIL %s (%.2fs)\n", tests[i].name, dt); }
    else if (t.skip_reason[0]) { r = 2; printf("SKIP %s: %s (%.2fs)\n", tests[i].name, t.skip_reason, dt); }
    else { r = 0; printf("ok   %s (%.2fs)\n", tests[i].name, dt); }
    fflush(stdout);
    fflush(stderr);
    return r;
}

static void remove_tmp_dir(void) {
    if (tmp_dir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
        tmp_dir[0] = 0;
    }
}

/* One worker process of a parallel run: takes the next test's position in
 * sel[] from the pipe `queue` until it is empty, runs it with stdout and
 * stderr (its subprocesses' too) going to OUT/K.out, then writes its result
 * as one byte to OUT/K.st (written last: the parent prints K once that file
 * exists). Has its own temporary directory. Never returns. */
static void worker(int queue, const int *sel, const char *out) {
    char path[512];
    int32_t k;
    while (read(queue, &k, sizeof k) == (ssize_t)sizeof k) {
        snprintf(path, sizeof path, "%s/%d.out", out, (int)k);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(3);
        fflush(stdout);
        fflush(stderr);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        char r = (char)('0' + run_one(sel[k]));
        char tmp[520];
        snprintf(tmp, sizeof tmp, "%s/%d.st.tmp", out, (int)k);
        snprintf(path, sizeof path, "%s/%d.st", out, (int)k);
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, &r, 1) != 1) _exit(3);
        close(fd);
        if (rename(tmp, path) != 0) _exit(3);
    }
    remove_tmp_dir();
    _exit(0);
}

/* Copies file `path` to stdout. */
static void cat_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return;
    char buf[8192];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stdout);
    fclose(f);
}

/* Runs the n tests sel[] in `jobs` worker processes, each taking the next
 * test when it is free, and prints each test's output whole, in sel[]'s
 * order, as soon as it and those before it have ended. A test whose worker
 * died before its result counts as failed, with a line saying so.
 * Adds to the three counts. */
static void run_parallel(const int *sel, int n, int jobs, int *passed, int *failed, int *skipped) {
    char out[] = "/tmp/agentkv-run-XXXXXX";
    int q[2];
    if (!mkdtemp(out) || pipe(q) != 0) { perror("parallel test run"); exit(1); }
    /* every position fits in the pipe at once (MAX_TESTS x 4 bytes < 64 KiB) */
    for (int32_t k = 0; k < n; k++)
        if (write(q[1], &k, sizeof k) != (ssize_t)sizeof k) { perror("parallel test run"); exit(1); }
    close(q[1]);
    fflush(stdout);
    fflush(stderr);
    int alive = 0;
    for (int j = 0; j < jobs && j < n; j++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); break; }
        if (pid == 0) worker(q[0], sel, out);
        alive++;
    }
    close(q[0]);
    char path[512];
    int next = 0;
    while (next < n) {
        snprintf(path, sizeof path, "%s/%d.st", out, next);
        FILE *f = fopen(path, "rb");
        if (f) {
            int c = fgetc(f);
            fclose(f);
            snprintf(path, sizeof path, "%s/%d.out", out, next);
            cat_file(path);
            if (c == '0') (*passed)++;
            else if (c == '2') (*skipped)++;
            else (*failed)++;
            fflush(stdout);
            next++;
            continue;
        }
        if (alive > 0) {
            int st;
            pid_t w = waitpid(-1, &st, WNOHANG);
            if (w > 0) { alive--; continue; }
            usleep(20000);
            continue;
        }
        /* every worker has ended and this test has no result */
        snprintf(path, sizeof path, "%s/%d.out", out, next);
        cat_file(path);
        printf("FAIL %s (its test process died before the test ended)\n", tests[sel[next]].name);
        (*failed)++;
        next++;
    }
    while (alive > 0 && wait(NULL) > 0) alive--;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", out);
}

int main(int argc, char **argv) {
    /* the in-process servers stand in for `agentkv serve`, which ignores
     * SIGPIPE as libmicrohttpd asks: a client gone mid-answer is an error
     * return there, not the end of the process */
    signal(SIGPIPE, SIG_IGN);
    const char *filter = argc > 1 ? argv[1] : NULL;
    const char *exclude = getenv("AK_TESTS_EXCLUDE");
    const char *jobs_env = getenv("AK_TEST_JOBS");
    int jobs = jobs_env && *jobs_env ? atoi(jobs_env) : 1;
    if (jobs < 1 || jobs > 64) {
        fprintf(stderr, "AK_TEST_JOBS must be 1 to 64\n");
        printf("0 passed, 1 failed, 0 skipped\n");
        return 1;
    }
    qsort(tests, n_tests, sizeof tests[0], cmp_tests);
    if (check_exclusions(exclude) != 0) {
        printf("0 passed, 1 failed, 0 skipped\n");
        return 1;
    }
    static int sel[MAX_TESTS];
    int n = 0, excluded = 0;
    for (int i = 0; i < n_tests; i++) {
        if (filter && !strstr(tests[i].name, filter)) continue;
        if (name_in_list(exclude, tests[i].name)) { excluded++; continue; }
        sel[n++] = i;
    }
    int passed = 0, failed = 0, skipped = 0;
    if (jobs > 1 && n > 1) {
        run_parallel(sel, n, jobs, &passed, &failed, &skipped);
    } else {
        for (int k = 0; k < n; k++) {
            int r = run_one(sel[k]);
            if (r == 0) passed++;
            else if (r == 1) failed++;
            else skipped++;
        }
        remove_tmp_dir();
    }
    if (excluded) printf("%d tests left out by AK_TESTS_EXCLUDE=%s\n", excluded, exclude);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
