/* textstop.c - see textstop.h */
#include "text/textstop.h"

#include <string.h>

/* Bytes at the end of text[0..len) held back for stop string s (of length
 * sl >= 1): the longest proper prefix of s that the text ends with; for long
 * stop strings simply sl - 1 (as much as could be such a prefix). */
static size_t held_for(const char *text, size_t len, const char *s, size_t sl) {
    size_t k = sl - 1 < len ? sl - 1 : len;
    if (sl > AK_TEXTSTOP_EXACT) return k;
    for (; k > 0; k--)
        if (!memcmp(text + len - k, s, k)) return k;
    return 0;
}

/* Scans for stop strings and computes the shown length; see textstop.h.
 * Returns the hit's offset or -1; never fails. */
long ak_textstop_scan(const char *text, size_t len, size_t checked, const char *const *stop, int n_stop,
                      int ended, size_t *visible) {
    if (checked > len) checked = len;
    long best = -1;
    size_t hold = 0;
    for (int i = 0; i < n_stop; i++) {
        size_t sl = stop[i] ? strlen(stop[i]) : 0;
        if (!sl) continue;
        /* an occurrence ending after `checked` starts at checked - sl + 1 or later */
        size_t from = checked >= sl ? checked - sl + 1 : 0;
        if (len - from >= sl) {
            const char *hit = memmem(text + from, len - from, stop[i], sl);
            if (hit && (best < 0 || hit - text < best)) best = hit - text;
        }
        size_t h = held_for(text, len, stop[i], sl);
        if (h > hold) hold = h;
    }
    if (best >= 0) {
        *visible = (size_t)best;
        return best;
    }
    if (ended) {
        *visible = len;
        return -1;
    }
    size_t vis = len - hold;
    /* a character is at most 4 bytes: its first byte is at most 3 back */
    for (int back = 0; back < 3 && vis > 0 && vis < len && ((unsigned char)text[vis] & 0xC0) == 0x80; back++)
        vis--;
    *visible = vis;
    return -1;
}
