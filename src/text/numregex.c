/* numregex.c - regexes for the JSON numbers on one side of a bound
 * (numregex.h): what jsonschema.c's minimum / maximum compile to. */
#include "text/numregex.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef ak_sbuf sbuf;
#define NN_ANY AK_NN_ANY

/* A growable string for regexes. */
static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *p = realloc(b->s, nc);
        if (!p) { b->oom = 1; return; }
        b->s = p;
        b->cap = nc;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_fmt(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_fmt(sbuf *b, const char *fmt, ...) {
    char t[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    if (n > 0) sb_put(b, t, (size_t)n < sizeof t ? (size_t)n : sizeof t - 1);
}

/* |d| as a plain decimal: integer digits into ip (no leading zeros, "0" for
 * none) and fraction digits into fp (no trailing zeros), from the shortest
 * text that reads back as d. Returns 0, or -1 when d is not finite or too
 * far from 1 for the buffers. */
static int plain_decimal(double d, char *ip, char *fp, size_t cap) {
    if (!isfinite(d)) return -1;
    d = fabs(d);
    char t[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(t, sizeof t, "%.*e", prec - 1, d);
        if (strtod(t, NULL) == d) break;
    }
    char dig[32];   /* value = 0.dig * 10^point */
    long nd = 0;
    char *ep = strchr(t, 'e');
    for (char *p = t; p < ep; p++)
        if (*p >= '0' && *p <= '9' && nd + 1 < (long)sizeof dig) dig[nd++] = *p;
    long point = atol(ep + 1) + 1;
    if (point > (long)cap - 40 || -point > (long)cap - 40) return -1;
    size_t il = 0, fl = 0;
    if (point <= 0) {
        ip[il++] = '0';
        for (long i = 0; i < -point; i++) fp[fl++] = '0';
        for (long i = 0; i < nd; i++) fp[fl++] = dig[i];
    } else {
        for (long i = 0; i < point; i++) ip[il++] = i < nd ? dig[i] : '0';
        for (long i = point; i < nd; i++) fp[fl++] = dig[i];
    }
    ip[il] = 0;
    fp[fl] = 0;
    size_t z = 0;
    while (ip[z] == '0' && ip[z + 1]) z++;
    memmove(ip, ip + z, strlen(ip + z) + 1);
    while (fl && fp[fl - 1] == '0') fp[--fl] = 0;
    return 0;
}

#define POS "(?:[1-9][0-9]*(?:\\.[0-9]+)?|0\\.[0-9]*[1-9][0-9]*)"

/* Non-negative integer parts greater (gt) or smaller than I, as
 * alternatives "a|b|..." (nothing written when there are none). */
static int int_cmp(sbuf *b, const char *I, int gt) {
    size_t k = strlen(I);
    int alts = 0;
    if (gt) { sb_fmt(b, "[1-9][0-9]{%zu,}", k); alts++; }
    else if (k >= 2) { sb_fmt(b, "0|[1-9][0-9]{0,%zu}", k - 2); alts++; }
    for (size_t i = 0; i < k; i++) {
        int d = I[i] - '0';
        int lo = gt ? d + 1 : (i == 0 && k > 1 ? 1 : 0), hi = gt ? 9 : d - 1;
        if (gt && i == 0 && k > 1 && lo < 1) lo = 1;
        if (lo > hi) continue;
        if (alts++) sb_str(b, "|");
        sb_put(b, I, i);
        sb_fmt(b, "[%d-%d][0-9]{%zu}", lo, hi, k - 1 - i);
    }
    return alts;
}

/* v >= (or >) I.F for non-negative v, as a regex. */
static void nn_ge(sbuf *b, const char *I, const char *F, int strict) {
    size_t m = strlen(F);
    sb_str(b, "(?:(?:");
    int_cmp(b, I, 1);
    sb_str(b, ")(?:\\.[0-9]+)?|");
    sb_str(b, I);
    if (!m) sb_str(b, strict ? "\\.[0-9]*[1-9][0-9]*" : "(?:\\.[0-9]+)?");
    else {
        sb_str(b, "\\.(?:");
        sb_str(b, F);
        sb_str(b, strict ? "[0-9]*[1-9][0-9]*" : "[0-9]*");
        for (size_t i = 0; i < m; i++)
            if (F[i] < '9') {
                sb_str(b, "|");
                sb_put(b, F, i);
                sb_fmt(b, "[%c-9][0-9]*", F[i] + 1);
            }
        sb_str(b, ")");
    }
    sb_str(b, ")");
}

/* v <= (or <) I.F for non-negative v, as a regex. */
static void nn_le(sbuf *b, const char *I, const char *F, int strict) {
    size_t m = strlen(F);
    sb_str(b, "(?:");
    sbuf t = {0};
    int lt = int_cmp(&t, I, 0);
    if (lt) {
        sb_str(b, "(?:");
        sb_str(b, t.s);
        sb_str(b, ")(?:\\.[0-9]+)?");
    }
    free(t.s);
    if (!m) {
        if (!strict) {
            if (lt) sb_str(b, "|");
            sb_str(b, I);
            sb_str(b, "(?:\\.0+)?");
        } else if (!lt) sb_str(b, "[^\\s\\S]");   /* nothing below 0 */
    } else {
        if (lt) sb_str(b, "|");
        sb_str(b, I);
        sb_str(b, "(?:\\.(?:");
        int alts = 0;
        if (!strict) { sb_str(b, F); sb_str(b, "0*"); alts++; }
        for (size_t j = 1; j < m; j++) {
            if (alts++) sb_str(b, "|");
            sb_put(b, F, j);
        }
        for (size_t i = 0; i < m; i++)
            if (F[i] > '0') {
                if (alts++) sb_str(b, "|");
                sb_put(b, F, i);
                sb_fmt(b, "[0-%c][0-9]*", F[i] - 1);
            }
        sb_str(b, "))?");
    }
    sb_str(b, ")");
}

/* The regex of numbers meeting one side of the bounds (lower when lower). */
int ak_numregex_side(sbuf *b, double v, int excl, int lower) {
    char I[512], F[512];
    if (plain_decimal(v, I, F, sizeof I) < 0) return -1;
    int neg = v < 0;
    sb_str(b, "(?:");
    if (lower) {
        if (!neg) nn_ge(b, I, F, excl);
        else { sb_str(b, NN_ANY "|-"); nn_le(b, I, F, excl); }
    } else {
        if (!neg) { nn_le(b, I, F, excl); sb_str(b, "|-" POS); }
        else { sb_str(b, "-"); nn_ge(b, I, F, excl); }
    }
    sb_str(b, ")");
    return 0;
}

/* Compiles a regex (full match) into d; -1 with the failure recorded. */
