/* test_textstop.c - stop strings and the held-back tail (src/text/textstop.c),
 * against expectations worked out by hand. */
#include <string.h>

#include "text/textstop.h"
#include "test.h"

/* scan with the text given as a C string */
static long scan(const char *text, size_t checked, const char *const *stop, int n, int ended, size_t *vis) {
    return ak_textstop_scan(text, strlen(text), checked, stop, n, ended, vis);
}

TEST(textstop_without_stops_shows_everything) {
    size_t vis = 99;
    CHECK(scan("Hello", 0, NULL, 0, 0, &vis) == -1, "a hit without stop strings");
    CHECK(vis == 5, "visible %zu, want 5", vis);
    const char *empty[] = {"", NULL};
    CHECK(scan("Hello", 0, empty, 2, 0, &vis) == -1 && vis == 5, "empty and NULL stops are ignored (vis %zu)", vis);
}

TEST(textstop_holds_back_the_prefix_of_a_stop_string) {
    const char *st[] = {"\nUser:"};
    size_t vis;
    /* "Hello\nUs": the tail "\nUs" (3 bytes) may become "\nUser:" */
    CHECK(scan("Hello\nUs", 0, st, 1, 0, &vis) == -1 && vis == 5, "vis %zu, want 5", vis);
    /* "Hello\nUx": no tail starts the stop string */
    CHECK(scan("Hello\nUx", 0, st, 1, 0, &vis) == -1 && vis == 8, "vis %zu, want 8", vis);
    /* the text shorter than the stop string, all of it a prefix */
    const char *hello[] = {"hello"};
    CHECK(scan("hel", 0, hello, 1, 0, &vis) == -1 && vis == 0, "vis %zu, want 0", vis);
    /* "xaa" against "aab": "aa" is held, not just "a" */
    const char *aab[] = {"aab"};
    CHECK(scan("xaa", 0, aab, 1, 0, &vis) == -1 && vis == 1, "vis %zu, want 1", vis);
    /* with two stop strings the longer held tail wins: "ab" of "abc" over "b" of "bz" */
    const char *two[] = {"bz", "abc"};
    CHECK(scan("xxab", 0, two, 2, 0, &vis) == -1 && vis == 2, "vis %zu, want 2", vis);
    /* generation ended: nothing is held */
    CHECK(scan("Hello\nUs", 0, st, 1, 1, &vis) == -1 && vis == 8, "ended: vis %zu, want 8", vis);
}

TEST(textstop_cuts_at_the_earliest_stop_string) {
    const char *st[] = {"\nUser:"};
    size_t vis;
    CHECK(scan("Hello\nUser: hi", 0, st, 1, 0, &vis) == 5 && vis == 5, "hit at 5 (vis %zu)", vis);
    CHECK(scan("Hello\nUser: hi", 0, st, 1, 1, &vis) == 5 && vis == 5, "ended: hit at 5 (vis %zu)", vis);
    /* "Hello World": "o" starts at 4, "lo W" at 3: the earliest start wins */
    const char *two[] = {"o", "lo W"};
    CHECK(scan("Hello World", 0, two, 2, 0, &vis) == 3 && vis == 3, "hit at 3 (vis %zu)", vis);
    /* an occurrence ending after `checked` is found, even starting before it */
    const char *stop[] = {"STOP"};
    CHECK(scan("xxSTOPyy", 5, stop, 1, 0, &vis) == 2 && vis == 2, "hit at 2 (vis %zu)", vis);
    /* checked past the end counts as the end: the last occurrence ended before it */
    CHECK(scan("xxSTO", 99, stop, 1, 0, &vis) == -1 && vis == 2, "no hit, vis %zu want 2", vis);
}

TEST(textstop_streams_byte_by_byte) {
    /* "aab" with stop "ab", one byte at a time: "a" held; "aa": the first a
     * is shown; "aab": the hit at 1 */
    const char *st[] = {"ab"};
    const char *text = "aab";
    size_t vis;
    CHECK(ak_textstop_scan(text, 1, 0, st, 1, 0, &vis) == -1 && vis == 0, "1 byte: vis %zu", vis);
    CHECK(ak_textstop_scan(text, 2, 1, st, 1, 0, &vis) == -1 && vis == 1, "2 bytes: vis %zu", vis);
    CHECK(ak_textstop_scan(text, 3, 2, st, 1, 0, &vis) == 1 && vis == 1, "3 bytes: vis %zu", vis);
}

TEST(textstop_long_stop_strings_and_utf8) {
    /* a 65-byte stop string holds back 64 bytes whatever they are */
    char stop[66], text[80];
    memset(stop, 'x', 65);
    stop[65] = 0;
    const char *st[] = {stop};
    /* "€" (E2 82 AC) + 63 'a': 66 bytes, the cut at 2 falls inside the euro
     * sign and moves back to its first byte, 0 */
    memcpy(text, "\xE2\x82\xAC", 3);
    memset(text + 3, 'a', 63);
    text[66] = 0;
    size_t vis;
    CHECK(scan(text, 0, st, 1, 0, &vis) == -1 && vis == 0, "vis %zu, want 0", vis);
    /* one more 'a': the cut at 3 is on a boundary */
    text[66] = 'a';
    text[67] = 0;
    CHECK(scan(text, 0, st, 1, 0, &vis) == -1 && vis == 3, "vis %zu, want 3", vis);
    /* a multi-byte stop string: "café" ends with "é", the start of "é!" */
    const char *e[] = {"\xC3\xA9!"};
    CHECK(scan("caf\xC3\xA9", 0, e, 1, 0, &vis) == -1 && vis == 3, "vis %zu, want 3", vis);
    CHECK(scan("caf\xC3\xA9!", 0, e, 1, 0, &vis) == 3 && vis == 3, "hit at 3, vis %zu", vis);
}
