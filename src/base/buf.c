/* buf.c - see buf.h */
#include "base/buf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ensures cap >= len + extra + 1 (the NUL). */
int ak_buf_reserve(ak_buf *b, size_t extra) {
    if (b->failed) return -1;
    if (extra > SIZE_MAX - 1 - b->len) { b->failed = 1; return -1; }
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) { cap = need; break; }
        cap *= 2;
    }
    char *q = realloc(b->p, cap);
    if (!q) { b->failed = 1; return -1; }
    if (!b->p) q[0] = '\0';
    b->p = q;
    b->cap = cap;
    return 0;
}

int ak_buf_append(ak_buf *b, const void *s, size_t n) {
    if (ak_buf_reserve(b, n) < 0) return -1;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

int ak_buf_puts(ak_buf *b, const char *s) {
    return s ? ak_buf_append(b, s, strlen(s)) : (b->failed ? -1 : 0);
}

int ak_buf_vprintf(ak_buf *b, const char *fmt, va_list ap) {
    if (b->failed) return -1;
    /* first try into the room there is; vsnprintf tells the size needed */
    va_list ap2;
    va_copy(ap2, ap);
    size_t room = b->cap > b->len ? b->cap - b->len : 0;
    int n = vsnprintf(room ? b->p + b->len : NULL, room, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        if (b->p) b->p[b->len] = '\0';
        return -1;
    }
    if ((size_t)n < room) {     /* it fitted, NUL included */
        b->len += (size_t)n;
        return 0;
    }
    if (b->p) b->p[b->len] = '\0';  /* undo the truncated attempt */
    if (ak_buf_reserve(b, (size_t)n) < 0) return -1;
    va_copy(ap2, ap);
    int m = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap2);
    va_end(ap2);
    if (m != n) {                   /* cannot happen with the same arguments */
        b->p[b->len] = '\0';
        return -1;
    }
    b->len += (size_t)n;
    return 0;
}

int ak_buf_printf(ak_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = ak_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void ak_buf_consume(ak_buf *b, size_t n) {
    if (!b->p) return;
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->p, b->p + n, b->len - n);
        b->len -= n;
    }
    b->p[b->len] = '\0';
}

void ak_buf_clear(ak_buf *b) {
    b->len = 0;
    b->failed = 0;
    if (b->p) b->p[0] = '\0';
}

char *ak_buf_take(ak_buf *b) {
    char *p = b->failed ? NULL : b->p;
    if (b->failed) free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
    return p;
}

void ak_buf_free(ak_buf *b) {
    if (!b) return;
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
}
