/* test_buf.c - the checked appender (src/base/buf.c): contents equal a reference
 * built with snprintf into a large array, the invariants len < cap and
 * p[len] == NUL hold after every call, and appends that exactly fill the
 * allocation (the boundary where an off-by-one NUL write would land) neither
 * reallocate nor write past it (the sanitizer build checks the latter). */
#include <stdint.h>
#include <string.h>

#include "base/buf.h"
#include "test.h"

/* The invariants of buf.h, checked against the expected contents. */
static int buf_ok(const ak_buf *b, const char *want, size_t want_len) {
    if (b->failed || !b->p) return 0;
    if (b->len >= b->cap || b->p[b->len] != '\0') return 0;
    return b->len == want_len && memcmp(b->p, want, want_len) == 0;
}

TEST(buf_exact_fit_boundaries) {
    ak_buf b = {0};
    char ref[8192];
    size_t rl = 0;
    REQUIRE(ak_buf_append(&b, "x", 1) == 0, "first append");
    ref[rl++] = 'x';
    /* fill to exactly cap - 1 bytes: the NUL lands in the last byte */
    size_t cap0 = b.cap;
    size_t fill = cap0 - 1 - b.len;
    char *p0 = b.p;
    memset(ref + rl, 'a', fill);
    REQUIRE(ak_buf_append(&b, ref + rl, fill) == 0, "exact-fit append");
    rl += fill;
    CHECK(b.cap == cap0 && b.p == p0, "an exact fit must not reallocate (cap %zu -> %zu)", cap0, b.cap);
    CHECK(b.len == b.cap - 1, "len %zu cap %zu", b.len, b.cap);
    CHECK(buf_ok(&b, ref, rl), "contents after the exact fit");
    /* one more byte must grow */
    REQUIRE(ak_buf_append(&b, "b", 1) == 0, "append past the fit");
    ref[rl++] = 'b';
    CHECK(b.cap > cap0, "the buffer grew (cap %zu)", b.cap);
    CHECK(buf_ok(&b, ref, rl), "contents after growing");

    /* printf: exactly the room left (no realloc), then one byte more than
     * the room (must grow) */
    for (int extra = 0; extra <= 1; extra++) {
        size_t room = b.cap - 1 - b.len;
        if (room < 8) {   /* make room without changing the boundary logic */
            REQUIRE(ak_buf_reserve(&b, 64) == 0, "reserve");
            room = b.cap - 1 - b.len;
        }
        size_t k = room + (size_t)extra;      /* bytes the printf writes */
        char *before = b.p;
        size_t cap_before = b.cap;
        REQUIRE(ak_buf_printf(&b, "%d:%*s", 123, (int)(k - 4), "z") == 0, "printf");
        rl += (size_t)snprintf(ref + rl, sizeof ref - rl, "%d:%*s", 123, (int)(k - 4), "z");
        CHECK(buf_ok(&b, ref, rl), "printf contents (extra %d)", extra);
        if (!extra)
            CHECK(b.p == before && b.cap == cap_before && b.len == b.cap - 1,
                  "a printf that exactly fits must not reallocate (len %zu cap %zu)", b.len, b.cap);
        else
            CHECK(b.cap > cap_before, "a printf one byte over the room must grow");
    }
    /* a formatted string longer than everything so far */
    char big[3000];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = 0;
    REQUIRE(ak_buf_printf(&b, "[%s]", big) == 0, "big printf");
    rl += (size_t)snprintf(ref + rl, sizeof ref - rl, "[%s]", big);
    CHECK(buf_ok(&b, ref, rl), "big printf contents");

    /* consume keeps the tail and the NUL */
    ak_buf_consume(&b, 10);
    CHECK(buf_ok(&b, ref + 10, rl - 10), "consume");
    char *s = ak_buf_take(&b);
    CHECK(s && strlen(s) == rl - 10, "take");
    CHECK(!b.p && !b.len && !b.cap, "take resets");
    free(s);
}

TEST(buf_every_size_up_to_1k) {
    /* every event size from 0 to 1024 bytes appended to an empty buffer,
     * as the SSE writer does: data: JSON \n\n */
    char json[1100];
    for (size_t n = 0; n <= 1024; n++) {
        ak_buf b = {0};
        memset(json, 'j', n);
        json[n] = 0;
        REQUIRE(ak_buf_puts(&b, "data: ") == 0 && ak_buf_puts(&b, json) == 0 && ak_buf_puts(&b, "\n\n") == 0,
                "append %zu", n);
        CHECK(b.len == n + 8 && b.len < b.cap && b.p[b.len] == 0 && !memcmp(b.p + 6, json, n), "size %zu", n);
        ak_buf_clear(&b);
        REQUIRE(ak_buf_printf(&b, "data: %s\n\n", json) == 0, "printf %zu", n);
        CHECK(b.len == n + 8 && b.len < b.cap && b.p[b.len] == 0 && !memcmp(b.p + 6, json, n), "printf size %zu", n);
        ak_buf_free(&b);
    }
}

TEST(buf_failure_is_sticky_and_harmless) {
    ak_buf b = {0};
    REQUIRE(ak_buf_puts(&b, "keep") == 0, "puts");
    CHECK(ak_buf_reserve(&b, SIZE_MAX - 2) == -1 && b.failed, "an overflowing size fails");
    CHECK(b.len == 4 && !strcmp(b.p, "keep"), "contents untouched by the failure");
    CHECK(ak_buf_append(&b, "x", 1) == -1 && b.len == 4, "later appends are refused");
    CHECK(ak_buf_printf(&b, "%d", 5) == -1 && b.len == 4, "later printfs are refused");
    CHECK(ak_buf_take(&b) == NULL, "take of a failed buffer is NULL");
    ak_buf_free(&b);
    ak_buf e = {0};
    CHECK(ak_buf_puts(&e, NULL) == 0 && e.len == 0, "NULL appends nothing");
    ak_buf_free(&e);
}
