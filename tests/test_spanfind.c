/* test_spanfind.c - the handoff span finder (kv/spanfind.h) against a
 * brute-force reference: the longest common run of a query range and a
 * source, by dynamic programming over every pair of positions. Heads of
 * lengths that are and are not multiples of a KV block (32) put the
 * shared history at unaligned offsets on both sides. */
#include <stdlib.h>
#include <string.h>

#include "kv/spanfind.h"
#include "test.h"

/* The reference: the length of the longest run q[b, b + len) ==
 * src[a, a + len) with from <= b and b + len <= upto (O(n * m)). */
static int longest_common(const int32_t *q, int from, int upto, const int32_t *src, int n_src) {
    int m = upto - from, best = 0;
    int *prev = calloc((size_t)n_src + 1, sizeof(int)), *cur = calloc((size_t)n_src + 1, sizeof(int));
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n_src; j++) {
            cur[j + 1] = q[from + i] == src[j] ? prev[j] + 1 : 0;
            if (cur[j + 1] > best) best = cur[j + 1];
        }
        int *t = prev;
        prev = cur;
        cur = t;
    }
    free(prev);
    free(cur);
    return best;
}

/* A deterministic pseudo-random token in [0, vocab). */
static int32_t rnd_tok(uint64_t *s, int vocab) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((*s >> 33) % (uint64_t)vocab);
}

static void fill(int32_t *t, int n, uint64_t *s, int vocab) {
    for (int i = 0; i < n; i++) t[i] = rnd_tok(s, vocab);
}

/* 1 when span sp is a true match of q and src inside the range. */
static int span_valid(const ak_span *sp, const int32_t *q, int from, int upto, const int32_t *src, int n_src) {
    return sp->len > 0 && sp->at >= from && sp->at + sp->len <= upto && sp->src_at >= 0 &&
           sp->src_at + sp->len <= n_src && !memcmp(q + sp->at, src + sp->src_at, sizeof(int32_t) * (size_t)sp->len);
}

TEST(spanfind_history_after_other_heads_at_unaligned_offsets) {
    enum { H = 300, TAIL = 20, NEW = 15 };
    static const int heads_a[] = {37, 64, 50, 95, 1};
    static const int heads_b[] = {50, 64, 37, 32, 130};
    for (int c = 0; c < 5; c++) {
        uint64_t seed = 42 + (uint64_t)c;
        int ha = heads_a[c], hb = heads_b[c];
        int n_src = ha + H + TAIL, n_q = hb + H + NEW;
        int32_t *src = malloc(sizeof(int32_t) * (size_t)n_src), *q = malloc(sizeof(int32_t) * (size_t)n_q);
        fill(src, n_src, &seed, 5000);
        fill(q, hb, &seed, 5000);
        memcpy(q + hb, src + ha, sizeof(int32_t) * H);   /* the same history after another head */
        fill(q + hb + H, NEW, &seed, 5000);
        int want = longest_common(q, 0, n_q, src, n_src);
        ak_error err = {0};
        ak_span_finder *f = ak_span_finder_new(q, 0, n_q - 1, 64, &err);
        REQUIRE(f, "finder: %s", err.msg);
        ak_span best = {0};
        int got = ak_span_scan(f, src, n_src, 7, &best);
        CHECK(got == 1, "heads %d/%d: nothing found", ha, hb);
        CHECK(span_valid(&best, q, 0, n_q - 1, src, n_src), "heads %d/%d: the span is not a match", ha, hb);
        CHECK(best.len == want, "heads %d/%d: span of %d tokens, the longest is %d", ha, hb, best.len, want);
        CHECK(best.len >= H && best.at <= hb && best.src_at <= ha && best.source == 7,
              "heads %d/%d: span [%d +%d) from %d, source %d, the history is at %d and %d", ha, hb, best.at, best.len,
              best.src_at, best.source, hb, ha);
        CHECK(best.src_at - best.at == ha - hb, "heads %d/%d: diagonal %d, want %d", ha, hb, best.src_at - best.at,
              ha - hb);
        ak_span_finder_free(f);
        free(src);
        free(q);
    }
}

TEST(spanfind_range_bounds_and_minimum) {
    enum { N = 400 };
    uint64_t seed = 7;
    int32_t src[N], q[N];
    fill(src, N, &seed, 3000);
    memcpy(q, src, sizeof q);   /* the same text: the range alone bounds the span */
    ak_error err = {0};
    /* a range that starts and ends inside the common text */
    ak_span_finder *f = ak_span_finder_new(q, 101, 333, 64, &err);
    REQUIRE(f, "finder: %s", err.msg);
    ak_span best = {0};
    CHECK(ak_span_scan(f, src, N, 0, &best) == 1, "nothing found");
    CHECK(best.at == 101 && best.len == 232 && best.src_at == 101, "span [%d +%d) from %d, want [101 +232) from 101",
          best.at, best.len, best.src_at);
    /* a better span is kept, a shorter one does not replace it */
    ak_span keep = {.at = 0, .src_at = 0, .len = 1000, .source = 3};
    CHECK(ak_span_scan(f, src, N, 1, &keep) == 0 && keep.len == 1000 && keep.source == 3, "a shorter span replaced a longer");
    ak_span_finder_free(f);
    /* a common run of 63 tokens with a minimum of 64: nothing */
    int32_t a[200], b[200];
    fill(a, 200, &seed, 3000);
    fill(b, 200, &seed, 3000);
    memcpy(b + 77, a + 19, sizeof(int32_t) * 63);
    int want = longest_common(b, 0, 200, a, 200);
    CHECK(want >= 63 && want < 64, "the reference finds %d", want);
    f = ak_span_finder_new(b, 0, 200, 64, &err);
    REQUIRE(f, "finder: %s", err.msg);
    best = (ak_span){0};
    CHECK(ak_span_scan(f, a, 200, 0, &best) == 0 && best.len == 0, "a run of %d found under the minimum 64", best.len);
    ak_span_finder_free(f);
    /* the same with 64: found, at its offsets */
    memcpy(b + 77, a + 19, sizeof(int32_t) * 64);
    f = ak_span_finder_new(b, 0, 200, 64, &err);
    REQUIRE(f, "finder: %s", err.msg);
    CHECK(ak_span_scan(f, a, 200, 0, &best) == 1 && best.len == longest_common(b, 0, 200, a, 200) && best.at <= 77 &&
              span_valid(&best, b, 0, 200, a, 200),
          "span [%d +%d) from %d", best.at, best.len, best.src_at);
    ak_span_finder_free(f);
    /* bad arguments; a range shorter than the minimum finds nothing */
    CHECK(!ak_span_finder_new(q, 10, 5, 64, &err) && err.code == AK_ERR_INVALID, "an empty range accepted");
    CHECK(!ak_span_finder_new(q, 0, 100, 0, &err) && err.code == AK_ERR_INVALID, "minimum 0 accepted");
    f = ak_span_finder_new(q, 0, 50, 64, &err);
    REQUIRE(f, "finder: %s", err.msg);
    best = (ak_span){0};
    CHECK(ak_span_scan(f, src, N, 0, &best) == 0, "a span found in a range shorter than the minimum");
    ak_span_finder_free(f);
}

TEST(spanfind_longest_over_several_sources) {
    enum { Q = 600 };
    uint64_t seed = 99;
    int32_t q[Q], s1[300], s2[500], s3[200];
    fill(q, Q, &seed, 4000);
    fill(s1, 300, &seed, 4000);
    fill(s2, 500, &seed, 4000);
    fill(s3, 200, &seed, 4000);
    memcpy(s1 + 11, q + 100, sizeof(int32_t) * 90);    /* 90 tokens */
    memcpy(s2 + 203, q + 251, sizeof(int32_t) * 150);  /* 150: the longest */
    memcpy(s3 + 5, q + 450, sizeof(int32_t) * 120);    /* 120 */
    ak_error err = {0};
    ak_span_finder *f = ak_span_finder_new(q, 0, Q, 64, &err);
    REQUIRE(f, "finder: %s", err.msg);
    ak_span best = {0};
    ak_span_scan(f, s1, 300, 1, &best);
    ak_span_scan(f, s2, 500, 2, &best);
    ak_span_scan(f, s3, 200, 3, &best);
    CHECK(best.source == 2 && best.len == longest_common(q, 0, Q, s2, 500) && best.len >= 150,
          "source %d, %d tokens", best.source, best.len);
    CHECK(span_valid(&best, q, 0, Q, s2, 500), "not a match");
    ak_span_finder_free(f);
}

TEST(spanfind_repetitive_text_stays_bounded) {
    /* one token repeated: every window hashes alike; the scan must stay
     * linear and what it returns must be a true match of the minimum */
    enum { N = 20000 };
    int32_t *q = malloc(sizeof(int32_t) * N), *src = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) q[i] = src[i] = 5;
    ak_error err = {0};
    ak_span_finder *f = ak_span_finder_new(q, 0, N, 64, &err);
    REQUIRE(f, "finder: %s", err.msg);
    ak_span best = {0};
    CHECK(ak_span_scan(f, src, N, 0, &best) == 1, "nothing found");
    CHECK(span_valid(&best, q, 0, N, src, N) && best.len >= 64, "span [%d +%d) from %d", best.at, best.len,
          best.src_at);
    ak_span_finder_free(f);
    free(q);
    free(src);
}
