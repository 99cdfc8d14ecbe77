/* utf8_check.h - an independent UTF-8 checker for the fuzz targets'
 * oracles (written apart from the library's decoder, so that the two can
 * disagree). Shortest forms only, no surrogates, at most U+10FFFF. */
#ifndef AK_FUZZ_UTF8_CHECK_H
#define AK_FUZZ_UTF8_CHECK_H

#include <stddef.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at p[0..n), or 0 if it is not one. */
static size_t utf8_seq(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    if (n < len || p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return len;
}

/* Copies in[0..n) to out with each invalid byte replaced by U+FFFD (out
 * needs 3n bytes); returns the output length. */
static inline size_t utf8_repair(const unsigned char *in, size_t n, unsigned char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_seq(in + i, n - i);
        if (l) {
            memcpy(out + o, in + i, l);
            o += l;
            i += l;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    return o;
}

/* 1 if p[0..n) is valid UTF-8. */
static int utf8_valid(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t l = utf8_seq(p + i, n - i);
        if (!l) return 0;
        i += l;
    }
    return 1;
}

#endif
