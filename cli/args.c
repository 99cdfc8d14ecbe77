/* args.c - see args.h */
#include "args.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void args_init(ak_args *a, const char *cmd, int argc, char **argv) {
    a->cmd = cmd; a->argc = argc; a->argv = argv; a->i = 0; a->failed = 0;
}

const char *args_next(ak_args *a) {
    if (a->failed || a->i >= a->argc) return NULL;
    return a->argv[a->i++];
}

void args_error(ak_args *a, const char *fmt, ...) {
    if (a->failed) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "agentkv %s: ", a->cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    a->failed = 1;
}

const char *args_value(ak_args *a, const char *flag) {
    if (a->failed) return NULL;
    if (a->i >= a->argc) { args_error(a, "%s needs a value", flag); return NULL; }
    return a->argv[a->i++];
}

long long args_int(ak_args *a, const char *flag, long long lo, long long hi) {
    const char *v = args_value(a, flag);
    if (!v) return 0;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end) { args_error(a, "%s: '%s' is not an integer", flag, v); return 0; }
    if (x < lo || x > hi) { args_error(a, "%s: %lld is out of range [%lld, %lld]", flag, x, lo, hi); return 0; }
    return x;
}

double args_float(ak_args *a, const char *flag, double lo, double hi) {
    const char *v = args_value(a, flag);
    if (!v) return 0;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || x != x) { args_error(a, "%s: '%s' is not a number", flag, v); return 0; }
    if (x < lo || x > hi) { args_error(a, "%s: %g is out of range [%g, %g]", flag, x, lo, hi); return 0; }
    return x;
}

void args_unknown(ak_args *a, const char *flag) {
    args_error(a, "unknown flag '%s' (see agentkv %s --help)", flag, a->cmd);
}

int args_stderr_is_tty(void) { return isatty(2); }

int args_int_list(ak_args *a, const char *flag, const char *list, long lo, long hi, int *out, int max) {
    int n = 0;
    const char *p = list;
    if (a->failed || !list) return 0;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < lo || v > hi || (*end && *end != ',') || n == max) {
            args_error(a, "%s: bad list '%s' (up to %d integers in [%ld, %ld], comma-separated)", flag, list, max, lo, hi);
            return 0;
        }
        out[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (!n) args_error(a, "%s: empty list", flag);
    return n;
}
