/* fuzz_stop.c - libFuzzer target for stop strings and the held-back tail
 * (src/text/textstop.c), differential against a naive reference.
 *
 * Input layout:
 *   byte 0      bits 0-2: number of stop strings (values above 5 wrap);
 *               bit 7: repair text and stop strings into valid UTF-8 first
 *   byte 1      seed of the chunk sizes (1..16 bytes each)
 *   per stop    one length byte L, then L bytes (the string ends at a NUL
 *               byte, as C strings do; lengths above AK_TEXTSTOP_EXACT test
 *               the long-string rule)
 *   the rest    the generated text
 * The text is appended chunk by chunk, as a decoder hands it out; after each
 * chunk ak_textstop_scan must give the same answer as the reference (which
 * rescans everything by brute force), and:
 *   - the shown length never exceeds the text, and with valid UTF-8 (which
 *     is then appended in whole characters) it never decreases;
 *   - no byte shown could belong to a stop string: no occurrence starts
 *     before it, and no tail that could still become one does;
 *   - with valid UTF-8 text and stop strings, the cut is on a character
 *     boundary;
 *   - once generation ends without a hit, everything is shown.
 * Run with `make fuzz FUZZ_TARGETS=stop`. Seeds: fuzz/corpus/stop/.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/textstop.h"
#include "utf8_check.h"

#define MAX_STOP 5

/* A broken invariant: says which, then crashes (libFuzzer keeps the input). */
#define MUST(cond, what)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "fuzz_stop: %s (line %d)\n", what, __LINE__); \
            abort();                                                       \
        }                                                                  \
    } while (0)

/* The rule of textstop.h, the slow way: every position of the whole text. */
static long ref_scan(const char *text, size_t len, char stop[][256], int n, int ended, size_t *visible) {
    for (size_t p = 0; p < len; p++)
        for (int i = 0; i < n; i++) {
            size_t sl = strlen(stop[i]);
            if (sl && len - p >= sl && !memcmp(text + p, stop[i], sl)) {
                *visible = p;
                return (long)p;
            }
        }
    if (ended) {
        *visible = len;
        return -1;
    }
    size_t vis = len;
    for (size_t p = 0; p < len && vis == len; p++)
        for (int i = 0; i < n; i++) {
            size_t sl = strlen(stop[i]);
            if (!sl || len - p >= sl) continue;
            if (sl > AK_TEXTSTOP_EXACT || !memcmp(text + p, stop[i], len - p)) {
                vis = p;
                break;
            }
        }
    for (int back = 0; back < 3 && vis > 0 && vis < len && ((unsigned char)text[vis] & 0xC0) == 0x80; back++) vis--;
    *visible = vis;
    return -1;
}

/* 1 if some stop string occurs in, or could still grow from, a position
 * before vis in text[0..len). */
static int shows_stop_byte(const char *text, size_t len, size_t vis, char stop[][256], int n) {
    for (size_t p = 0; p < vis; p++)
        for (int i = 0; i < n; i++) {
            size_t sl = strlen(stop[i]);
            size_t m = len - p < sl ? len - p : sl;
            if (sl && !memcmp(text + p, stop[i], m)) return 1;
        }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int n = data[0] & 7;
    if (n > MAX_STOP) n -= 3;  /* 6, 7 -> 3, 4 */
    int repair = data[0] >> 7;
    uint32_t rng = data[1] * 2654435761u + 1;
    size_t at = 2;
    static char stop[MAX_STOP][256];
    const char *stops[MAX_STOP];
    for (int i = 0; i < n; i++) {
        size_t l = at < size ? data[at++] : 0;
        if (l > size - at) l = size - at;
        unsigned char tmp[3 * 255 + 1];
        size_t m = repair ? utf8_repair(data + at, l, tmp) : (memcpy(tmp, data + at, l), l);
        if (m > 255) m = 255;
        /* cutting a repaired string may split its last character: drop it */
        while (repair && m && !utf8_valid(tmp, m)) m--;
        memcpy(stop[i], tmp, m);
        stop[i][m] = 0;
        stops[i] = stop[i];
        at += l;
    }
    size_t tn = size - at;
    char *text = malloc(3 * tn + 1);
    if (!text) abort();
    tn = repair ? utf8_repair(data + at, tn, (unsigned char *)text) : (memcpy(text, data + at, tn), tn);
    text[tn] = 0;
    int valid = utf8_valid((unsigned char *)text, tn);
    for (int i = 0; i < n; i++) valid = valid && utf8_valid((unsigned char *)stop[i], strlen(stop[i]));

    size_t len = 0, shown = 0;
    long hit = -1;
    while (len < tn && hit < 0) {
        rng = rng * 1103515245u + 12345u;
        size_t step = 1 + (rng >> 16) % 16;
        size_t prev = len;
        len = len + step < tn ? len + step : tn;
        /* valid text comes in whole characters, as the decoder hands it out */
        while (valid && len < tn && ((unsigned char)text[len] & 0xC0) == 0x80) len++;
        size_t vis = (size_t)-1, rvis = (size_t)-1;
        hit = ak_textstop_scan(text, len, prev, stops, n, 0, &vis);
        long rhit = ref_scan(text, len, stop, n, 0, &rvis);
        MUST(hit == rhit && vis == rvis, "differs from the reference");
        MUST(vis <= len, "shown length past the text");
        MUST(!valid || vis >= shown, "shown length taken back");
        MUST(hit >= 0 || !shows_stop_byte(text, len, vis, stop, n), "shows a byte that may belong to a stop string");
        MUST(hit < 0 || (size_t)hit >= shown, "a byte shown earlier belongs to the stop string");
        MUST(!valid || vis == len || ((unsigned char)text[vis] & 0xC0) != 0x80, "the cut splits a character");
        shown = vis;
    }
    if (hit < 0) {
        size_t vis = (size_t)-1;
        MUST(ak_textstop_scan(text, len, len, stops, n, 1, &vis) == -1 && vis == len, "ended but not all shown");
    }
    free(text);
    return 0;
}
