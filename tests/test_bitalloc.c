/* test_bitalloc.c - the CacheCard bit allocator (src/agents/bitalloc.h): budgets met
 * exactly and spent, widths from {2, 4, 8, 16}, caps, pins, ties, the
 * monotonic order of scores, topology over importance, the score formulas
 * against hand-computed values, and the errors. */
#include <string.h>

#include "test.h"
#include "agents/bitalloc.h"
#include "kv/kvformat.h"

/* splitmix64: the property tests' own seeded generator. */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) / 9007199254740992.0; }
static int rng_int(uint64_t *s, int n) { return (int)(rng_next(s) % (uint64_t)n); }

/* Params with no sinks (so expectations need not account for pins). */
static ak_bitalloc_params params(ak_bitalloc_policy pol, double b) {
    ak_bitalloc_params p;
    ak_bitalloc_params_init(&p);
    p.policy = pol;
    p.budget_k = b;
    p.n_sinks = 0;
    return p;
}

/* The largest integer total L with L / n <= b, by counting down from 16 n. */
static long max_total(double b, int n) {
    long L = 16L * n;
    while ((double)L / n > b) L--;
    return L;
}

/* The largest width <= c. */
static int round_cap(int c) { return c >= 16 ? 16 : c >= 8 ? 8 : c >= 4 ? 4 : 2; }

/* Checks one side's widths w (K, or V when v_side) against r's report of
 * that side: valid widths, within caps, mean <= budget b, sum and counts as
 * reported, and the budget spent: no token below its cap could still afford
 * its next step. Failures are recorded in t. */
static void check_side(ak_test_ctx *t, const ak_bitalloc_result *r, int v_side, const uint8_t *w, const uint8_t *cap,
                       int n, double b, int iter) {
    const char *side = v_side ? "V" : "K";
    long sum = v_side ? r->sum_v : r->sum_k;
    double mean = v_side ? r->mean_v : r->mean_k;
    const int *count = v_side ? r->count_v : r->count_k;
    long s = 0;
    int cnt[4] = {0};
    for (int i = 0; i < n; i++) {
        int x = w[i];
        CHECK(x == 2 || x == 4 || x == 8 || x == 16, "iter %d %s: width %d of token %d", iter, side, x, i);
        if (cap) CHECK(x <= round_cap(cap[i]), "iter %d %s: width %d over cap %d", iter, side, x, cap[i]);
        s += x;
        cnt[x == 2 ? 0 : x == 4 ? 1 : x == 8 ? 2 : 3]++;
    }
    CHECK(s == sum, "iter %d %s: reported sum %ld, widths sum %ld", iter, side, sum, s);
    CHECK((double)s / n <= b, "iter %d %s: mean %.6f over budget %.6f", iter, side, (double)s / n, b);
    CHECK(mean == (double)s / n, "iter %d %s: reported mean %.6f", iter, side, mean);
    for (int k = 0; k < 4; k++) CHECK(cnt[k] == count[k], "iter %d %s: count of width %d", iter, side, 2 << k);
    long left = max_total(b, n) - s;
    CHECK(left >= 0, "iter %d %s: over the budget by %ld bits", iter, side, -left);
    for (int i = 0; i < n; i++) {
        int lim = cap ? round_cap(cap[i]) : 16;
        if (w[i] < lim) CHECK(w[i] > left, "iter %d %s: token %d (width %d) could take %ld bits left", iter, side, i,
                              w[i], left);
    }
}

/* Random inputs, budgets, policies, caps and sinks: the budget is met
 * exactly and spent, the widths are valid, the same inputs give the same
 * widths, and among tokens neither pinned nor capped a strictly higher score
 * never gets a lower width. */
TEST(bitalloc_budget_property) {
    uint64_t seed = 0x5EED16;
    enum { NMAX = 160 };
    double mass[NMAX], var[NMAX], ent[NMAX], expo[NMAX];
    int32_t tok[NMAX], ov[NMAX];
    uint8_t seg[NMAX], capk[NMAX], capv[NMAX], wk[NMAX], wv[NMAX], wk2[NMAX], wv2[NMAX];
    double score[NMAX];
    const double fixed[] = {2, 4, 8, 16, 3, 5, 6, 12};
    int checked_pairs = 0;
    for (int it = 0; it < 600; it++) {
        int n = 1 + rng_int(&seed, it % 5 == 0 ? 8 : NMAX);
        for (int i = 0; i < n; i++) {
            /* heavy-tailed masses, some exact ties */
            mass[i] = rng_int(&seed, 4) == 0 ? 1.0 : exp(4.0 * rng_unit(&seed)) - 1.0;
            var[i] = rng_unit(&seed);
            ent[i] = 3.0 * rng_unit(&seed);
            expo[i] = (double)(1 + rng_int(&seed, 200));
            tok[i] = rng_int(&seed, 12);
            seg[i] = (uint8_t)rng_int(&seed, AK_SEG_COUNT);
            ov[i] = rng_int(&seed, 3);
            capk[i] = (uint8_t)(2 + rng_int(&seed, 15));
            capv[i] = (uint8_t)(2 + rng_int(&seed, 15));
        }
        ak_bitalloc_params p = params((ak_bitalloc_policy)rng_int(&seed, 3),
                                      it % 3 == 0 ? fixed[rng_int(&seed, 8)] : 2.0 + 14.0 * rng_unit(&seed));
        p.budget_v = rng_int(&seed, 2) ? 0.0 : 2.0 + 14.0 * rng_unit(&seed);
        p.n_sinks = rng_int(&seed, 3) ? 0 : rng_int(&seed, 6);
        p.sink_bits = 2 << rng_int(&seed, 4);
        p.spread = rng_int(&seed, 2);
        p.lambda = 3.0 * rng_unit(&seed);
        int use_caps = rng_int(&seed, 3) == 0;
        ak_bitalloc_input in = {.n = n, .mass = rng_int(&seed, 4) ? mass : NULL,
                                .variance = rng_int(&seed, 2) ? var : NULL, .entropy = rng_int(&seed, 2) ? ent : NULL,
                                .exposure = rng_int(&seed, 2) ? expo : NULL, .tokens = rng_int(&seed, 2) ? tok : NULL,
                                .segment = rng_int(&seed, 2) ? seg : NULL, .overlap = rng_int(&seed, 2) ? ov : NULL,
                                .cap_k = use_caps ? capk : NULL, .cap_v = use_caps ? capv : NULL};
        ak_bitalloc_result r, r2;
        ak_error e = {{0}};
        REQUIRE(ak_bitalloc_run(&in, &p, wk, wv, &r, &e) == 0, "iter %d: %s", it, e.msg);
        double bv = p.budget_v == 0.0 ? p.budget_k : p.budget_v;
        check_side(t, &r, 0, wk, in.cap_k, n, p.budget_k, it);
        check_side(t, &r, 1, wv, in.cap_v, n, bv, it);
        REQUIRE(ak_bitalloc_run(&in, &p, wk2, wv2, &r2, &e) == 0, "iter %d: %s", it, e.msg);
        CHECK(memcmp(wk, wk2, (size_t)n) == 0 && memcmp(wv, wv2, (size_t)n) == 0, "iter %d: not deterministic", it);
        int sinks = p.policy == AK_BITALLOC_UNIFORM ? 0 : (p.n_sinks < n ? p.n_sinks : n);
        CHECK(r.pinned_k <= sinks && r.pinned_v <= sinks, "iter %d: %d/%d pinned of %d", it, r.pinned_k, r.pinned_v,
              sinks);
        for (int i = 0; i < r.pinned_k; i++) {
            int want = in.cap_k && round_cap(in.cap_k[i]) < p.sink_bits ? round_cap(in.cap_k[i]) : p.sink_bits;
            CHECK(wk[i] >= want, "iter %d: pinned sink %d has width %d < %d", it, i, wk[i], want);
        }
        if (p.budget_k >= 2.0 + (p.sink_bits - 2.0) * sinks / n)
            CHECK(r.pinned_k == sinks, "iter %d: budget %.3f fits every pin but only %d of %d pinned", it, p.budget_k,
                  r.pinned_k, sinks);
        /* Monotonic: over tokens past the pins, without caps. */
        if (use_caps) continue;
        ak_bitalloc_params ps = p;
        REQUIRE(ak_bitalloc_scores(&in, &ps, NULL, NULL, score, &e) == 0, "iter %d: %s", it, e.msg);
        int from = r.pinned_k > r.pinned_v ? r.pinned_k : r.pinned_v;
        for (int i = from; i < n; i++)
            for (int j = from; j < n; j++) {
                /* equal scores: the earlier wins, except in uniform's spread order */
                int tie = score[i] == score[j] && i < j && !(p.policy == AK_BITALLOC_UNIFORM && p.spread);
                if (!(score[i] > score[j] || tie)) continue;
                checked_pairs++;
                CHECK(wk[i] >= wk[j], "iter %d: K token %d (score %g) width %d < token %d (score %g) width %d", it,
                      i, score[i], wk[i], j, score[j], wk[j]);
                CHECK(wv[i] >= wv[j], "iter %d: V token %d width %d < token %d width %d", it, i, wv[i], j, wv[j]);
            }
    }
    CHECK(checked_pairs > 100000, "only %d ordered pairs checked", checked_pairs);
}

/* Uniform at a representable budget: every token that width, pins
 * ignored (uniform means one width); between two widths, the higher goes
 * to the first tokens, or evenly spread. */
TEST(bitalloc_uniform_widths) {
    const int ns[] = {1, 7, 100};
    const int ws[] = {2, 4, 8, 16};
    uint8_t wk[100], wv[100];
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++) {
            ak_bitalloc_params p;
            ak_bitalloc_params_init(&p);   /* n_sinks 4: uniform must ignore them */
            p.policy = AK_BITALLOC_UNIFORM;
            p.budget_k = ws[b];
            ak_bitalloc_input in = {.n = ns[a]};
            ak_bitalloc_result r;
            ak_error e = {{0}};
            REQUIRE(ak_bitalloc_run(&in, &p, wk, wv, &r, &e) == 0, "%s", e.msg);
            for (int i = 0; i < ns[a]; i++)
                CHECK(wk[i] == ws[b] && wv[i] == ws[b], "n %d budget %d: token %d widths %d/%d", ns[a], ws[b], i,
                      wk[i], wv[i]);
            CHECK(r.mean_k == ws[b] && r.mean_v == ws[b], "n %d budget %d: means %g/%g", ns[a], ws[b], r.mean_k,
                  r.mean_v);
            CHECK(r.pinned_k == 0, "uniform pinned %d", r.pinned_k);
        }
    /* 5 bits over 8 tokens: 40 bits = all at 4 plus two at 8. */
    ak_bitalloc_params p = params(AK_BITALLOC_UNIFORM, 5.0);
    ak_bitalloc_input in = {.n = 8};
    ak_bitalloc_result r;
    ak_error e = {{0}};
    REQUIRE(ak_bitalloc_run(&in, &p, wk, wv, &r, &e) == 0, "%s", e.msg);
    const uint8_t first8[8] = {8, 8, 4, 4, 4, 4, 4, 4};
    CHECK(memcmp(wk, first8, 8) == 0, "first-first: %d %d %d %d %d %d %d %d", wk[0], wk[1], wk[2], wk[3], wk[4], wk[5],
          wk[6], wk[7]);
    CHECK(r.mean_k == 5.0, "mean %g", r.mean_k);
    p.spread = 1;
    REQUIRE(ak_bitalloc_run(&in, &p, wk, wv, &r, &e) == 0, "%s", e.msg);
    const uint8_t spread8[8] = {8, 4, 4, 4, 8, 4, 4, 4};
    CHECK(memcmp(wk, spread8, 8) == 0, "spread: %d %d %d %d %d %d %d %d", wk[0], wk[1], wk[2], wk[3], wk[4], wk[5],
          wk[6], wk[7]);
    /* 3 bits over 10 tokens, spread: every other token at 4. */
    in.n = 10;
    p.budget_k = 3.0;
    REQUIRE(ak_bitalloc_run(&in, &p, wk, wv, &r, &e) == 0, "%s", e.msg);
    for (int i = 0; i < 10; i++) CHECK(wk[i] == (i % 2 == 0 ? 4 : 2), "spread 3 bits: token %d width %d", i, wk[i]);
    /* 4.5 bits over 3 tokens: 13 bits allowed, no 4->8 step fits in 1: mean 4. */
    in.n = 3;
    p.budget_k = 4.5;
    REQUIRE(ak_bitalloc_run(&in, &p, wk, wv, &r, &e) == 0, "%s", e.msg);
    CHECK(r.sum_k == 12 && r.mean_k == 4.0, "4.5 over 3: sum %ld mean %g", r.sum_k, r.mean_k);
}

/* Equal scores go to the earlier position; leftover bits that fit no step
 * stay unspent. Scores 1, 3, 3, 1, 3 (default errors): 2->4 steps of the 3s
 * (positions 1, 2, 4), then of the 1s, then 4->8 of the 3s. */
TEST(bitalloc_ties_by_position) {
    const double s[5] = {1, 3, 3, 1, 3};
    ak_bitalloc_params p = params(AK_BITALLOC_IMPORTANCE, 4.0);
    uint8_t w[5];
    ak_error e = {{0}};
    struct { double b; long sum; uint8_t want[5]; } cases[] = {
        {.b = 2.8, .sum = 14, .want = {2, 4, 4, 2, 2}},
        {.b = 3.6, .sum = 18, .want = {4, 4, 4, 2, 4}},
        {.b = 4.4, .sum = 20, .want = {4, 4, 4, 4, 4}},
        {.b = 4.8, .sum = 24, .want = {4, 8, 4, 4, 4}},
        {.b = 5.6, .sum = 28, .want = {4, 8, 8, 4, 4}},
    };
    for (int c = 0; c < 5; c++) {
        long sum = ak_bitalloc_widths(&(ak_bitalloc_greedy){.score = s, .n = 5, .budget = cases[c].b, .sink_bits = 8,
                                      .model = p.err}, w, NULL, &e);
        CHECK(sum == cases[c].sum, "budget %g: sum %ld", cases[c].b, sum);
        CHECK(memcmp(w, cases[c].want, 5) == 0, "budget %g: %d %d %d %d %d", cases[c].b, w[0], w[1], w[2], w[3], w[4]);
    }
    /* All scores equal through the full path (importance, equal masses). */
    double m[8] = {2, 2, 2, 2, 2, 2, 2, 2};
    ak_bitalloc_input in = {.n = 8, .mass = m};
    uint8_t wk[8], wv[8];
    p.budget_k = 5.0;
    REQUIRE(ak_bitalloc_run(&in, &p, wk, wv, NULL, &e) == 0, "%s", e.msg);
    const uint8_t want[8] = {8, 8, 4, 4, 4, 4, 4, 4};
    CHECK(memcmp(wk, want, 8) == 0 && memcmp(wv, want, 8) == 0, "equal masses: %d %d %d", wk[0], wk[1], wk[2]);
}

/* Caps: no width over its token's cap (rounded down to a width); a card
 * made from an allocation, re-allocated at a higher budget with those widths
 * as caps, keeps or lowers each width; a capped high score leaves its bits
 * to others. */
TEST(bitalloc_caps) {
    enum { N = 64 };
    uint64_t seed = 77;
    double m[N];
    for (int i = 0; i < N; i++) m[i] = exp(5.0 * rng_unit(&seed));
    ak_bitalloc_input in = {.n = N, .mass = m};
    ak_bitalloc_params p = params(AK_BITALLOC_IMPORTANCE, 4.0);
    p.n_sinks = 2;
    uint8_t k1[N], v1[N], k2[N], v2[N];
    ak_bitalloc_result r;
    ak_error e = {{0}};
    REQUIRE(ak_bitalloc_run(&in, &p, k1, v1, &r, &e) == 0, "%s", e.msg);
    int mixed = r.count_k[0] + r.count_k[2] + r.count_k[3] > 0;
    CHECK(mixed, "a heavy-tailed mass at 4 bits should mix widths");
    in.cap_k = k1;
    in.cap_v = v1;
    p.budget_k = 8.0;
    REQUIRE(ak_bitalloc_run(&in, &p, k2, v2, &r, &e) == 0, "%s", e.msg);
    for (int i = 0; i < N; i++)
        CHECK(k2[i] <= k1[i] && v2[i] <= v1[i], "token %d raised: %d->%d / %d->%d", i, k1[i], k2[i], v1[i], v2[i]);
    /* The same budget with its own widths as caps gives them back. */
    p.budget_k = 4.0;
    REQUIRE(ak_bitalloc_run(&in, &p, k2, v2, &r, &e) == 0, "%s", e.msg);
    CHECK(memcmp(k1, k2, N) == 0, "re-allocation under own caps changed widths");
    /* A cap between widths rounds down; the highest score capped at 4 lets
     * the next one take 8: scores 10, 5, 1, 1 at 5 bits (20 bits). */
    const double s[4] = {10, 5, 1, 1};
    const uint8_t cap[4] = {7, 16, 16, 16};
    uint8_t w[4];
    long sum = ak_bitalloc_widths(&(ak_bitalloc_greedy){.score = s, .n = 4, .budget = 5.0, .cap = cap, .sink_bits = 8,
                                  .model = p.err}, w, NULL, &e);
    CHECK(sum == 20 && w[0] == 4 && w[1] == 8 && w[2] == 4 && w[3] == 4, "capped: sum %ld widths %d %d %d %d", sum,
          w[0], w[1], w[2], w[3]);
    const uint8_t bad[4] = {16, 1, 16, 16};
    e.code = 0;
    CHECK(ak_bitalloc_widths(&(ak_bitalloc_greedy){.score = s, .n = 4, .budget = 5.0, .cap = bad, .sink_bits = 8,
                             .model = p.err}, w, NULL, &e) < 0 && e.code == AK_ERR_INVALID,
          "a cap below 2 must fail INVALID (code %d)", e.code);
}

/* Importance: a heavy hitter gets the bits (hand-computed with the default
 * errors 4^-w), and widths follow the mass order. */
TEST(bitalloc_importance_order) {
    /* masses 1, 1, 1, 97: m~ = 0.04, 0.04, 0.04, 3.88; I = m~^2 = 0.0016,
     * ..., 15.05. At 4 bits (16): token 3 takes 2->4 (gain/bit 15.05 *
     * 0.0293), then 4->8 (15.05 * 0.000972 > 0.0016 * 0.0293), then token 0
     * takes 2->4 with the last 2 (0.0016 * 0.0293 > 15.05 * 1.9e-6 of 8->16,
     * which would not fit anyway). */
    double m[4] = {1, 1, 1, 97};
    ak_bitalloc_input in = {.n = 4, .mass = m};
    ak_bitalloc_params p = params(AK_BITALLOC_IMPORTANCE, 4.0);
    uint8_t wk[4], wv[4];
    ak_bitalloc_result r;
    ak_error e = {{0}};
    REQUIRE(ak_bitalloc_run(&in, &p, wk, wv, &r, &e) == 0, "%s", e.msg);
    CHECK(wk[0] == 4 && wk[1] == 2 && wk[2] == 2 && wk[3] == 8, "heavy hitter: %d %d %d %d", wk[0], wk[1], wk[2],
          wk[3]);
    /* Uniform on the same input: all 4. */
    p.policy = AK_BITALLOC_UNIFORM;
    REQUIRE(ak_bitalloc_run(&in, &p, wk, wv, &r, &e) == 0, "%s", e.msg);
    CHECK(wk[0] == 4 && wk[3] == 4, "uniform ignores mass: %d %d", wk[0], wk[3]);
    /* Distinct masses in shuffled order at 6 bits: widths sorted by mass. */
    enum { N = 32 };
    double mm[N];
    for (int i = 0; i < N; i++) mm[i] = (double)(1 + (i * 13) % N) * (double)(1 + (i * 13) % N);
    ak_bitalloc_input in2 = {.n = N, .mass = mm};
    uint8_t k[N], v[N];
    p.policy = AK_BITALLOC_IMPORTANCE;
    p.budget_k = 6.0;
    REQUIRE(ak_bitalloc_run(&in2, &p, k, v, &r, &e) == 0, "%s", e.msg);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            if (mm[i] > mm[j]) CHECK(k[i] >= k[j], "mass %g width %d < mass %g width %d", mm[i], k[i], mm[j], k[j]);
    CHECK(r.count_k[0] + r.count_k[2] + r.count_k[3] > 0, "distinct masses should not all get 4... got all %d", k[0]);
}

/* Topology: at equal importance, system-prompt tokens get the wider widths
 * over chit-chat even when they come later; importance alone gives them to
 * the earlier tokens. Overlap with prior hand-offs raises T. */
TEST(bitalloc_topology_boosts_system) {
    enum { N = 16 };
    uint8_t seg[N];
    for (int i = 0; i < N; i++) seg[i] = i < 8 ? AK_SEG_ASSISTANT : AK_SEG_SYSTEM;
    double m[N];
    for (int i = 0; i < N; i++) m[i] = 1.0f;
    ak_bitalloc_input in = {.n = N, .mass = m, .segment = seg};
    ak_bitalloc_params p = params(AK_BITALLOC_TOPOLOGY, 3.0);
    uint8_t k[N], v[N];
    ak_error e = {{0}};
    REQUIRE(ak_bitalloc_run(&in, &p, k, v, NULL, &e) == 0, "%s", e.msg);
    for (int i = 0; i < N; i++)
        CHECK(k[i] == (i < 8 ? 2 : 4), "topology: token %d (%s) width %d", i,
              ak_bitalloc_segment_name((ak_segment)seg[i]), k[i]);
    p.policy = AK_BITALLOC_IMPORTANCE;
    REQUIRE(ak_bitalloc_run(&in, &p, k, v, NULL, &e) == 0, "%s", e.msg);
    for (int i = 0; i < N; i++) CHECK(k[i] == (i < 8 ? 4 : 2), "importance: token %d width %d", i, k[i]);
    /* T by hand: system 1; assistant 0.2; other with overlap 1: 1 - 0.8 / 2. */
    uint8_t sg[3] = {AK_SEG_SYSTEM, AK_SEG_ASSISTANT, AK_SEG_OTHER};
    int32_t ov[3] = {0, 0, 1};
    ak_bitalloc_input in3 = {.n = 3, .segment = sg, .overlap = ov};
    double I[3], T[3], S[3];
    p.policy = AK_BITALLOC_TOPOLOGY;
    p.lambda = 2.0;
    REQUIRE(ak_bitalloc_scores(&in3, &p, I, T, S, &e) == 0, "%s", e.msg);
    CHECK(fabs(T[0] - 1.0) < 1e-12 && fabs(T[1] - 0.2) < 1e-12 && fabs(T[2] - 0.6) < 1e-12, "T %g %g %g", T[0], T[1],
          T[2]);
    CHECK(I[0] == 1.0 && I[2] == 1.0, "no statistics: I = 1 (%g)", I[0]);
    CHECK(fabs(S[0] - 3.0) < 1e-12 && fabs(S[1] - 1.4) < 1e-12 && fabs(S[2] - 2.2) < 1e-12, "S %g %g %g", S[0], S[1],
          S[2]);
    /* The overlapped "other" token (later) beats the assistant token (earlier). */
    uint8_t w3k[3], w3v[3];
    p.budget_k = 8.0 / 3.0;   /* 8 bits: one 2->4 step beyond the system token's */
    REQUIRE(ak_bitalloc_run(&in3, &p, w3k, w3v, NULL, &e) == 0, "%s", e.msg);
    CHECK(w3k[0] == 4 && w3k[1] == 2 && w3k[2] == 2, "8 bits: %d %d %d", w3k[0], w3k[1], w3k[2]);
    p.budget_k = 10.0 / 3.0;
    REQUIRE(ak_bitalloc_run(&in3, &p, w3k, w3v, NULL, &e) == 0, "%s", e.msg);
    CHECK(w3k[0] == 4 && w3k[1] == 2 && w3k[2] == 4, "10 bits: %d %d %d", w3k[0], w3k[1], w3k[2]);
}

/* I by hand: weights 0.4 mass (squared), 0.2 variance, 0.2 entropy, 0.2
 * inverse frequency over the features present, each divided by its mean. */
TEST(bitalloc_importance_formula) {
    double m[2] = {1, 3}, en[2] = {2, 2};
    int32_t tk[2] = {5, 5};
    ak_bitalloc_input in = {.n = 2, .mass = m, .entropy = en, .tokens = tk};
    ak_bitalloc_params p = params(AK_BITALLOC_IMPORTANCE, 4.0);
    double I[2], S[2];
    ak_error e = {{0}};
    REQUIRE(ak_bitalloc_scores(&in, &p, I, NULL, S, &e) == 0, "%s", e.msg);
    /* (0.4 * 0.5^2 + 0.2 + 0.2) / 0.8 and (0.4 * 1.5^2 + 0.2 + 0.2) / 0.8 */
    CHECK(fabs(I[0] - 0.625) < 1e-12 && fabs(I[1] - 1.625) < 1e-12, "I %g %g", I[0], I[1]);
    CHECK(S[0] == I[0] && S[1] == I[1], "importance score is I");
    /* Frequency only: ids 7, 7, 7, 9 -> idf ln(1 + 4/3), ln(5). */
    int32_t t4[4] = {7, 9, 7, 7};
    ak_bitalloc_input in4 = {.n = 4, .tokens = t4};
    double I4[4];
    REQUIRE(ak_bitalloc_scores(&in4, &p, I4, NULL, NULL, &e) == 0, "%s", e.msg);
    double a = log(1.0 + 4.0 / 3.0), b = log(5.0), mean = (3 * a + b) / 4;
    CHECK(fabs(I4[0] - a / mean) < 1e-12 && fabs(I4[1] - b / mean) < 1e-12 && I4[2] == I4[0] && I4[3] == I4[0],
          "idf I %g %g %g %g", I4[0], I4[1], I4[2], I4[3]);
    /* Exposure: masses 10, 5 seen by 10 and 2 queries are 1 and 2.5 per
     * query (m~ 0.571, 1.429); variances 8, 8 over 4 and 2 squared: 0.5, 2
     * (v~ 0.4, 1.6). (0.4 m~^2 + 0.2 v~) / 0.6. */
    double m2[2] = {10, 5}, v2[2] = {8, 8}, x2[2] = {4, 2}, x1[2] = {10, 2};
    ak_bitalloc_input inx = {.n = 2, .mass = m2, .exposure = x1};
    REQUIRE(ak_bitalloc_scores(&inx, &p, I, NULL, NULL, &e) == 0, "%s", e.msg);
    CHECK(fabs(I[0] - (1.0 / 1.75) * (1.0 / 1.75)) < 1e-12 && fabs(I[1] - (2.5 / 1.75) * (2.5 / 1.75)) < 1e-12,
          "exposure I %g %g", I[0], I[1]);
    ak_bitalloc_input inv = {.n = 2, .mass = m2, .variance = v2, .exposure = x2};
    REQUIRE(ak_bitalloc_scores(&inv, &p, I, NULL, NULL, &e) == 0, "%s", e.msg);
    /* per query: masses 2.5, 2.5 (m~ 1, 1); variances 0.5, 2 (v~ 0.4, 1.6) */
    CHECK(fabs(I[0] - (0.4 + 0.2 * 0.4) / 0.6) < 1e-12 && fabs(I[1] - (0.4 + 0.2 * 1.6) / 0.6) < 1e-12,
          "exposure variance I %g %g", I[0], I[1]);
    /* Variance only, all zero: no information, I = 1. */
    double z[4] = {0, 0, 0, 0};
    ak_bitalloc_input inz = {.n = 4, .variance = z};
    REQUIRE(ak_bitalloc_scores(&inz, &p, I4, NULL, NULL, &e) == 0, "%s", e.msg);
    CHECK(I4[0] == 1.0 && I4[3] == 1.0, "zero variance: I %g", I4[0]);
}

/* Sinks: pinned to sink_bits while the budget allows, first first. */
TEST(bitalloc_sinks) {
    enum { N = 20 };
    ak_bitalloc_input in = {.n = N};
    ak_bitalloc_params p = params(AK_BITALLOC_IMPORTANCE, 4.0);
    p.n_sinks = 4;
    p.sink_bits = 8;
    uint8_t k[N], v[N];
    ak_bitalloc_result r;
    ak_error e = {{0}};
    /* 80 bits: 40 base, 24 for four sinks, 16 for tokens 4..11 at 4. */
    REQUIRE(ak_bitalloc_run(&in, &p, k, v, &r, &e) == 0, "%s", e.msg);
    for (int i = 0; i < N; i++) {
        int want = i < 4 ? 8 : i < 12 ? 4 : 2;
        CHECK(k[i] == want && v[i] == want, "token %d width %d/%d want %d", i, k[i], v[i], want);
    }
    CHECK(r.pinned_k == 4 && r.pinned_v == 4 && r.sum_k == 80, "pinned %d sum %ld", r.pinned_k, r.sum_k);
    /* 2.5 bits (50): one sink fits (46), then tokens 1, 2 at 4. */
    p.budget_k = 2.5;
    p.budget_v = 4.0;
    REQUIRE(ak_bitalloc_run(&in, &p, k, v, &r, &e) == 0, "%s", e.msg);
    CHECK(r.pinned_k == 1 && k[0] == 8 && k[1] == 4 && k[2] == 4 && k[3] == 2 && r.sum_k == 50,
          "2.5 bits: pinned %d widths %d %d %d %d sum %ld", r.pinned_k, k[0], k[1], k[2], k[3], r.sum_k);
    CHECK(r.pinned_v == 4, "values keep their own budget (4): pinned %d", r.pinned_v);
    /* 2 bits: nothing can be pinned. */
    p.budget_k = 2.0;
    p.budget_v = 0.0;   /* the same as keys */
    REQUIRE(ak_bitalloc_run(&in, &p, k, v, &r, &e) == 0, "%s", e.msg);
    CHECK(r.pinned_v == 0 && memcmp(k, v, N) == 0, "V follows K's budget: pinned %d", r.pinned_v);
    CHECK(r.pinned_k == 0 && r.sum_k == 2 * N, "2 bits: pinned %d sum %ld", r.pinned_k, r.sum_k);
}

/* Bad budgets, policies, sizes and inputs fail with AK_ERR_INVALID. */
TEST(bitalloc_errors) {
    ak_bitalloc_policy pol = AK_BITALLOC_UNIFORM;
    ak_error e = {{0}};
    const char *names[] = {"uniform", "importance", "topology"};
    for (int i = 0; i < 3; i++) {
        CHECK(ak_bitalloc_policy_parse(names[i], &pol, &e) == 0 && (int)pol == i, "parse %s", names[i]);
        CHECK(strcmp(ak_bitalloc_policy_name(pol), names[i]) == 0, "name %d", i);
    }
    const char *bad[] = {"adaptive", "", "Uniform", "topology ", NULL};
    for (int i = 0; i < 5; i++) {
        e.code = 0;
        CHECK(ak_bitalloc_policy_parse(bad[i], &pol, &e) == -1 && e.code == AK_ERR_INVALID, "policy '%s' code %d",
              bad[i] ? bad[i] : "(null)", e.code);
    }
    ak_segment sg;
    CHECK(ak_bitalloc_segment_parse("tool", &sg, &e) == 0 && sg == AK_SEG_TOOL, "segment tool");
    e.code = 0;
    CHECK(ak_bitalloc_segment_parse("chat", &sg, &e) == -1 && e.code == AK_ERR_INVALID, "segment chat");

    uint8_t k[4], v[4];
    ak_bitalloc_input in = {.n = 4};
    const double budgets[] = {1.99, 16.01, 0.0, -4.0, NAN, INFINITY};
    for (int i = 0; i < 6; i++) {
        ak_bitalloc_params p = params(AK_BITALLOC_TOPOLOGY, budgets[i]);
        e.code = 0;
        CHECK(ak_bitalloc_run(&in, &p, k, v, NULL, &e) == -1 && e.code == AK_ERR_INVALID, "budget %g code %d",
              budgets[i], e.code);
        p.budget_k = 4.0;
        p.budget_v = budgets[i] == 0.0 ? 17.0 : budgets[i];
        e.code = 0;
        CHECK(ak_bitalloc_run(&in, &p, k, v, NULL, &e) == -1 && e.code == AK_ERR_INVALID, "V budget %g code %d",
              p.budget_v, e.code);
        double bk, bv;
        e.code = 0;
        CHECK(ak_bitalloc_split_budget(budgets[i], &bk, &bv, &e) == -1 && e.code == AK_ERR_INVALID, "split %g",
              budgets[i]);
    }
    ak_bitalloc_params p = params(AK_BITALLOC_TOPOLOGY, 4.0);
    for (int n = 0; n >= -1; n--) {
        ak_bitalloc_input in0 = {.n = n};
        e.code = 0;
        CHECK(ak_bitalloc_run(&in0, &p, k, v, NULL, &e) == -1 && e.code == AK_ERR_INVALID, "n %d", n);
        double s[1] = {1};
        e.code = 0;
        CHECK(ak_bitalloc_widths(&(ak_bitalloc_greedy){.score = s, .n = n, .budget = 4.0, .sink_bits = 8,
                                 .model = p.err}, k, NULL, &e) == -1 && e.code == AK_ERR_INVALID,
              "widths n %d", n);
        e.code = 0;
        CHECK(ak_bitalloc_scores(&in0, &p, NULL, NULL, NULL, &e) == -1 && e.code == AK_ERR_INVALID, "scores n %d", n);
    }
    double neg[4] = {1, -1, 1, 1}, nan4[4] = {1, NAN, 1, 1}, zero1[4] = {1, 0, 1, 1};
    uint8_t badseg[4] = {0, 1, AK_SEG_COUNT, 2};
    int32_t badov[4] = {0, 0, -1, 0};
    ak_bitalloc_input bads[] = {{.n = 4, .mass = neg},       {.n = 4, .variance = nan4}, {.n = 4, .entropy = neg},
                                {.n = 4, .segment = badseg}, {.n = 4, .overlap = badov}, {.n = 4, .exposure = zero1},
                                {.n = 4, .exposure = nan4}};
    for (int i = 0; i < 7; i++) {
        e.code = 0;
        CHECK(ak_bitalloc_run(&bads[i], &p, k, v, NULL, &e) == -1 && e.code == AK_ERR_INVALID, "bad input %d", i);
    }
    ak_bitalloc_params q = p;
    q.policy = (ak_bitalloc_policy)7;
    e.code = 0;
    CHECK(ak_bitalloc_run(&in, &q, k, v, NULL, &e) == -1 && e.code == AK_ERR_INVALID, "policy 7");
    q = p;
    q.sink_bits = 5;
    e.code = 0;
    CHECK(ak_bitalloc_run(&in, &q, k, v, NULL, &e) == -1 && e.code == AK_ERR_INVALID, "sink bits 5");
    q = p;
    q.lambda = -1;
    e.code = 0;
    CHECK(ak_bitalloc_run(&in, &q, k, v, NULL, &e) == -1 && e.code == AK_ERR_INVALID, "lambda -1");
    q = p;
    q.err[2] = q.err[1];   /* not strictly decreasing */
    e.code = 0;
    CHECK(ak_bitalloc_run(&in, &q, k, v, NULL, &e) == -1 && e.code == AK_ERR_INVALID, "flat err table");
    q = p;
    q.err[0] = 1.0; q.err[1] = 0.9; q.err[2] = 0.1; q.err[3] = 0.0;   /* gain per bit rises 2->4 to 4->8 */
    e.code = 0;
    CHECK(ak_bitalloc_run(&in, &q, k, v, NULL, &e) == -1 && e.code == AK_ERR_INVALID, "convex err table");
    double bk, bv;
    CHECK(ak_bitalloc_split_budget(4.0, &bk, &bv, &e) == 0 && fabs(bk - 14.0 / 3) < 1e-12 &&
              fabs((bk + bv) / 2 - 4.0) < 1e-12, "split 4: %g / %g", bk, bv);
    CHECK(ak_bitalloc_split_budget(8.0, &bk, &bv, &e) == 0 && bk == 10.0 && bv == 6.0, "split 8: %g / %g", bk, bv);
    CHECK(ak_bitalloc_split_budget(14.0, &bk, &bv, &e) == 0 && bk == 16.0 && bv == 12.0, "split 14: %g / %g", bk, bv);
}

/* A long range (32K tokens, as a card of a long context) allocates quickly
 * and still meets the budget. */
TEST(bitalloc_long_range) {
    enum { N = 32768 };
    double *m = malloc(N * sizeof *m);
    int32_t *tk = malloc(N * sizeof *tk);
    uint8_t *k = malloc(N), *v = malloc(N);
    REQUIRE(m && tk && k && v, "malloc");
    uint64_t seed = 9;
    for (int i = 0; i < N; i++) {
        m[i] = exp(6.0 * rng_unit(&seed));
        tk[i] = rng_int(&seed, 5000);
    }
    ak_bitalloc_input in = {.n = N, .mass = m, .tokens = tk};
    ak_bitalloc_params p = params(AK_BITALLOC_IMPORTANCE, 4.3);
    ak_bitalloc_result r;
    ak_error e = {{0}};
    double t0 = ak_now();
    int rc = ak_bitalloc_run(&in, &p, k, v, &r, &e);
    double dt = ak_now() - t0;
    CHECK(rc == 0, "%s", e.msg);
    check_side(t, &r, 0, k, NULL, N, 4.3, 0);
    CHECK(dt < 1.0, "32K tokens took %.3f s", dt);
    free(m);
    free(tk);
    free(k);
    free(v);
}

/* ---- measured errors ------------------------------------------------- */

/* sum_t score[t] * errors[4t + level of w[t]]. */
static double objective(const double *score, const double *errors, const uint8_t *w, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += score[i] * errors[4 * i + (w[i] == 2 ? 0 : w[i] == 4 ? 1 : w[i] == 8 ? 2 : 3)];
    return s;
}

/* Brute force over every width vector (4^n) within the caps and the
 * budget's total L, at or above `floor` everywhere: the least objective. */
static double brute_force(const double *score, const double *errors, const uint8_t *cap, int n, long L, int floor) {
    double best = INFINITY;
    int combos = 1;
    for (int i = 0; i < n; i++) combos *= 4;
    uint8_t w[8];
    for (int c = 0; c < combos; c++) {
        long sum = 0;
        int ok = 1;
        for (int i = 0, x = c; i < n; i++, x /= 4) {
            w[i] = (uint8_t)(2 << (x % 4));
            int lim = cap ? round_cap(cap[i]) : 16;
            if (w[i] > lim || w[i] < (floor < lim ? floor : lim)) ok = 0;
            sum += w[i];
        }
        if (!ok || sum > L) continue;
        double o = objective(score, errors, w, n);
        if (o < best) best = o;
    }
    return best;
}

/* With measured errors (random, neither monotone nor convex per token), the
 * greedy meets the budget, respects caps and the floor, and its objective
 * is within the stated bound of the brute-force optimum: the largest error
 * drop any token can make (an upper bound on one hull step's drop, computed
 * without the hull); most cases reach the optimum exactly. */
TEST(bitalloc_measured_near_optimal) {
    uint64_t seed = 0xB17A11;
    enum { NMAX = 6 };
    double score[NMAX], errors[4 * NMAX];
    uint8_t cap[NMAX], w[NMAX];
    int exact = 0, cases = 0, beat_model = 0;
    for (int it = 0; it < 3000; it++) {
        int n = 1 + rng_int(&seed, NMAX);
        for (int i = 0; i < n; i++) {
            score[i] = rng_int(&seed, 5) == 0 ? 0.0 : exp(3.0 * rng_unit(&seed));
            /* roughly falling with width, with random bumps (a 4-bit error
             * above the 2-bit one happens on measured data too) */
            double e = 1.0 + rng_unit(&seed);
            for (int j = 0; j < 4; j++) {
                errors[4 * i + j] = e * (0.5 + rng_unit(&seed));
                e *= rng_int(&seed, 6) == 0 ? 1.0 : 0.02 + 0.5 * rng_unit(&seed);
            }
            cap[i] = (uint8_t)(2 + rng_int(&seed, 15));
        }
        int use_caps = rng_int(&seed, 3) == 0, floor = rng_int(&seed, 3) == 0 ? 4 : 0;
        double b = rng_int(&seed, 3) == 0 ? (double)(2 << rng_int(&seed, 4)) : 2.0 + 14.0 * rng_unit(&seed);
        long L = max_total(b, n);
        ak_error e = {{0}};
        int pinned = -1;
        long sum = ak_bitalloc_widths(&(ak_bitalloc_greedy){.score = score, .errors = errors, .n = n, .budget = b,
                                      .cap = use_caps ? cap : NULL, .min_bits = floor, .sink_bits = 8}, w, &pinned, &e);
        REQUIRE(sum >= 0, "iter %d: %s", it, e.msg);
        long s = 0;
        for (int i = 0; i < n; i++) s += w[i];
        CHECK(s == sum && s <= L, "iter %d: sum %ld reported %ld, limit %ld", it, s, sum, L);
        CHECK(pinned == 0, "iter %d: %d pinned with no sinks", it, pinned);
        /* the floor holds everywhere when every token can pay it, else nowhere */
        long floor_cost = 0;
        for (int i = 0; i < n; i++) {
            int lim = use_caps ? round_cap(cap[i]) : 16;
            floor_cost += floor && floor < lim ? floor : (floor ? lim : 2);
        }
        int floored = floor && floor_cost <= L;
        for (int i = 0; i < n; i++) {
            int lim = use_caps ? round_cap(cap[i]) : 16;
            CHECK(w[i] <= lim, "iter %d: token %d width %d over cap %d", it, i, w[i], lim);
            if (floored) CHECK(w[i] >= (floor < lim ? floor : lim), "iter %d: token %d width %d under the floor", it, i,
                               w[i]);
        }
        double g = objective(score, errors, w, n);
        double opt = brute_force(score, errors, use_caps ? cap : NULL, n, L, floored ? floor : 0);
        double bound = 0.0;
        for (int i = 0; i < n; i++) {
            int lim = use_caps ? round_cap(cap[i]) : 16;
            int lo = floored && floor < lim ? (floor == 4 ? 1 : 0) : 0;
            double mx = -INFINITY, mn = INFINITY;
            for (int j = lo; j < 4 && (2 << j) <= lim; j++) {
                double x = score[i] * errors[4 * i + j];
                if (x > mx) mx = x;
                if (x < mn) mn = x;
            }
            if (mx - mn > bound) bound = mx - mn;
        }
        CHECK(g >= opt - 1e-12 * (1 + fabs(opt)), "iter %d: greedy %.17g below the optimum %.17g?", it, g, opt);
        CHECK(g <= opt + bound + 1e-12 * (1 + fabs(opt)), "iter %d: greedy %.6g, optimum %.6g, bound %.6g", it, g, opt,
              bound);
        cases++;
        if (g <= opt + 1e-12 * (1 + fabs(opt))) exact++;
        /* the modeled errors' allocation, scored on the measured errors,
         * is one candidate the measured greedy should usually match or beat */
        if (!use_caps && !floored) {
            ak_bitalloc_params p = params(AK_BITALLOC_IMPORTANCE, b);
            uint8_t wm[NMAX];
            REQUIRE(ak_bitalloc_widths(&(ak_bitalloc_greedy){.score = score, .n = n, .budget = b, .sink_bits = 8,
                                       .model = p.err}, wm, NULL, &e) >= 0, "%s", e.msg);
            if (g <= objective(score, errors, wm, n) + 1e-12) beat_model++;
        }
    }
    CHECK(exact * 10 >= cases * 8, "only %d of %d cases reach the optimum exactly", exact, cases);
    CHECK(beat_model > 0, "never compared with the model");
}

/* A measured table equal for every token to the model's table gives the
 * model's widths (the hull of a convex table is its adjacent steps). */
TEST(bitalloc_measured_matches_model) {
    uint64_t seed = 77;
    enum { N = 300 };
    double score[N], errors[4 * N];
    uint8_t a[N], b[N], cap[N];
    ak_bitalloc_params p = params(AK_BITALLOC_IMPORTANCE, 4.0);
    for (int it = 0; it < 50; it++) {
        for (int i = 0; i < N; i++) {
            score[i] = rng_int(&seed, 3) == 0 ? 1.0 : exp(5.0 * rng_unit(&seed));
            for (int j = 0; j < 4; j++) errors[4 * i + j] = p.err[j];
            cap[i] = (uint8_t)(2 + rng_int(&seed, 15));
        }
        double bud = 2.0 + 14.0 * rng_unit(&seed);
        const uint8_t *c = it % 2 ? cap : NULL;
        ak_error e = {{0}};
        long s1 = ak_bitalloc_widths(&(ak_bitalloc_greedy){.score = score, .n = N, .budget = bud, .cap = c,
                                     .sink_bits = 8, .model = p.err}, a, NULL, &e);
        long s2 = ak_bitalloc_widths(&(ak_bitalloc_greedy){.score = score, .errors = errors, .n = N, .budget = bud,
                                     .cap = c, .sink_bits = 8}, b, NULL, &e);
        CHECK(s1 >= 0 && s1 == s2 && memcmp(a, b, N) == 0, "iter %d: budget %.3f: totals %ld / %ld, widths %s", it,
              bud, s1, s2, memcmp(a, b, N) ? "differ" : "equal");
    }
}

/* Widths follow the measured errors: of two equal scores the token whose
 * 2-bit error is larger gets the bits; a token that loses nothing at 2
 * bits stays there; errors that fall only at 8 bits get a direct 2 -> 8
 * step (the hull skips 4). */
TEST(bitalloc_measured_follows_errors) {
    double score[3] = {1, 1, 1};
    double errors[12] = {1.0, 0.5, 0.4, 0.0,     /* worth 2 -> 4 */
                         9.0, 1.0, 0.9, 0.0,     /* the most to gain at 2 -> 4 */
                         1.0, 1.0, 1.0, 1.0};    /* nothing to gain */
    uint8_t w[3];
    ak_error e = {{0}};
    /* 10 bits: 2 + 2 + 2 and 4 to spend: token 1 first (4 per bit), then token 0 */
    CHECK(ak_bitalloc_widths(&(ak_bitalloc_greedy){.score = score, .errors = errors, .n = 3, .budget = 10.0 / 3,
                             .sink_bits = 8}, w, NULL, &e) == 10, "%s", e.msg);
    CHECK(w[0] == 4 && w[1] == 4 && w[2] == 2, "widths %d %d %d, want 4 4 2", w[0], w[1], w[2]);
    /* 2 -> 8 of drop 6 beats 2 -> 4 of drop 0.5 per bit */
    double skip[4] = {7.0, 6.0, 1.0, 0.9};
    double one = 1;
    CHECK(ak_bitalloc_widths(&(ak_bitalloc_greedy){.score = &one, .errors = skip, .n = 1, .budget = 8.0,
                             .sink_bits = 8}, w, NULL, &e) == 8 && w[0] == 8,
          "hull step: width %d", w[0]);
    /* 6 bits: the hull's 2 -> 8 step does not fit; the best that does (2 -> 4) is taken */
    CHECK(ak_bitalloc_widths(&(ak_bitalloc_greedy){.score = &one, .errors = skip, .n = 1, .budget = 6.0,
                             .sink_bits = 8}, w, NULL, &e) == 4 && w[0] == 4,
          "fallback step: width %d", w[0]);
    /* errors that rise with width: no bits spent on them */
    double rising[4] = {1.0, 2.0, 3.0, 4.0};
    CHECK(ak_bitalloc_widths(&(ak_bitalloc_greedy){.score = &one, .errors = rising, .n = 1, .budget = 16.0,
                             .sink_bits = 8}, w, NULL, &e) == 2 && w[0] == 2,
          "rising errors: width %d", w[0]);
    /* bad errors */
    double bad[4] = {1.0, NAN, 0.5, 0.0};
    e.code = 0;
    CHECK(ak_bitalloc_widths(&(ak_bitalloc_greedy){.score = &one, .errors = bad, .n = 1, .budget = 4.0,
                             .sink_bits = 8}, w, NULL, &e) == -1 &&
              e.code == AK_ERR_INVALID, "NaN error: code %d", e.code);
    bad[1] = -1.0;
    e.code = 0;
    CHECK(ak_bitalloc_widths(&(ak_bitalloc_greedy){.score = &one, .errors = bad, .n = 1, .budget = 4.0,
                             .sink_bits = 8}, w, NULL, &e) == -1 &&
              e.code == AK_ERR_INVALID, "negative error: code %d", e.code);
    e.code = 0;
    CHECK(ak_bitalloc_widths(&(ak_bitalloc_greedy){.score = &one, .errors = skip, .n = 1, .budget = 4.0,
                             .min_bits = 3, .sink_bits = 8}, w, NULL, &e) == -1 &&
              e.code == AK_ERR_INVALID, "floor 3: code %d", e.code);
}

/* ak_bitalloc_measure_errors against the formats' own quantize/dequantize
 * run here, on random vectors: the same sums, accumulated; errors fall with
 * width; f16's is within its rounding. */
TEST(bitalloc_measure_errors) {
    enum { D = 64, NV = 5 };
    float x[NV * D], y[D];
    uint64_t seed = 3;
    for (int i = 0; i < NV * D; i++) x[i] = (float)((rng_unit(&seed) - 0.5) * 4.0 + (i % 17 == 0 ? 9.0 : 0.0));
    const ak_kv_format fk[4] = {AK_KV_Q2, AK_KV_Q4, AK_KV_Q8, AK_KV_F16};
    const ak_kv_format fv[4] = {AK_KV_TQ2, AK_KV_TQ4, AK_KV_Q8, AK_KV_F16};
    for (int side = 0; side < 2; side++) {
        double got[4] = {0}, want[4] = {0};
        ak_error e = {{0}};
        REQUIRE(ak_bitalloc_measure_errors(x, NV, D, side, got, &e) == 0, "%s", e.msg);
        for (int j = 0; j < 4; j++) {
            const ak_kv_format_info *f = ak_kv_format_get(side ? fv[j] : fk[j]);
            uint8_t *buf = malloc(f->vec_bytes(D));
            REQUIRE(buf, "malloc");
            for (int v = 0; v < NV; v++) {
                f->quantize(x + v * D, D, buf);
                f->dequantize(buf, D, y);
                for (int i = 0; i < D; i++) want[j] += ((double)x[v * D + i] - y[i]) * ((double)x[v * D + i] - y[i]);
            }
            free(buf);
            CHECK(fabs(got[j] - want[j]) <= 1e-9 * want[j], "side %d width %d: %.9g vs %.9g", side, 2 << j, got[j],
                  want[j]);
        }
        CHECK(got[0] > got[1] && got[1] > got[2] && got[2] > got[3], "side %d: errors %g %g %g %g do not fall", side,
              got[0], got[1], got[2], got[3]);
        double sq = 0;
        for (int i = 0; i < NV * D; i++) sq += (double)x[i] * x[i];
        CHECK(got[3] <= sq * 0x1p-20, "side %d: f16 error %g over rounding (%g)", side, got[3], sq * 0x1p-20);
        double again[4] = {got[0], got[1], got[2], got[3]};
        REQUIRE(ak_bitalloc_measure_errors(x, NV, D, side, again, &e) == 0, "%s", e.msg);
        CHECK(fabs(again[1] - 2 * got[1]) <= 1e-12 * got[1], "side %d: not accumulated", side);
    }
    double o[4] = {0};
    ak_error e = {{0}};
    CHECK(ak_bitalloc_measure_errors(x, 1, D, 2, o, &e) == -1 && e.code == AK_ERR_INVALID, "side 2: code %d", e.code);
    e.code = 0;
    CHECK(ak_bitalloc_measure_errors(x, 1, 3, 0, o, &e) == -1 && e.code == AK_ERR_INVALID, "d 3: code %d", e.code);
}

/* Through ak_bitalloc_run: uniform ignores measured errors, keeps and the
 * floor (the baseline stays itself); importance keeps kept widths, refuses
 * keeps over the budget, honours the floor, and with WEIGHT_MASS scores
 * (m / mean m)^power. */
TEST(bitalloc_run_measured) {
    enum { N = 64 };
    double m[N], ek[4 * N], ev[4 * N];
    uint8_t keep[N], k1[N], v1[N], k2[N], v2[N];
    uint64_t seed = 5;
    for (int i = 0; i < N; i++) {
        m[i] = exp(5.0 * rng_unit(&seed));
        for (int j = 0; j < 4; j++) {
            ek[4 * i + j] = (1.0 + rng_unit(&seed)) * ldexp(1.0, -3 * j);
            ev[4 * i + j] = (1.0 + rng_unit(&seed)) * ldexp(1.0, -3 * j);
        }
        keep[i] = i % 8 == 0 ? 8 : 0;
    }
    ak_bitalloc_input plain = {.n = N, .mass = m};
    ak_bitalloc_input in = plain;
    in.err_k = ek, in.err_v = ev, in.keep_k = keep, in.keep_v = keep;
    ak_error e = {{0}};
    for (int b = 2; b <= 16; b++) {
        ak_bitalloc_params p = params(AK_BITALLOC_UNIFORM, b + 0.5 > 16 ? 16 : b + 0.5);
        p.min_bits = 4;
        REQUIRE(ak_bitalloc_run(&plain, &p, k1, v1, NULL, &e) == 0, "%s", e.msg);
        REQUIRE(ak_bitalloc_run(&in, &p, k2, v2, NULL, &e) == 0, "%s", e.msg);
        CHECK(memcmp(k1, k2, N) == 0 && memcmp(v1, v2, N) == 0, "budget %g: uniform changed by errors/keeps/floor",
              p.budget_k);
    }
    ak_bitalloc_params p = params(AK_BITALLOC_IMPORTANCE, 4.0);
    p.weighting = AK_BITALLOC_WEIGHT_MASS;
    p.mass_power = 1.0;
    ak_bitalloc_result r;
    REQUIRE(ak_bitalloc_run(&in, &p, k1, v1, &r, &e) == 0, "%s", e.msg);
    for (int i = 0; i < N; i++)
        if (keep[i]) CHECK(k1[i] >= 8 && v1[i] >= 8, "kept token %d at %d/%d", i, k1[i], v1[i]);
    CHECK(r.mean_k <= 4.0 && r.mean_v <= 4.0, "means %g %g", r.mean_k, r.mean_v);
    p.min_bits = 4;
    ak_bitalloc_input nokeep = in;
    nokeep.keep_k = nokeep.keep_v = NULL;
    REQUIRE(ak_bitalloc_run(&nokeep, &p, k1, v1, &r, &e) == 0, "%s", e.msg);
    for (int i = 0; i < N; i++) CHECK(k1[i] == 4 && v1[i] == 4, "floor 4 at budget 4: token %d at %d/%d", i, k1[i], v1[i]);
    p.budget_k = 6.0;
    REQUIRE(ak_bitalloc_run(&nokeep, &p, k1, v1, &r, &e) == 0, "%s", e.msg);
    for (int i = 0; i < N; i++) CHECK(k1[i] >= 4 && v1[i] >= 4, "floor 4 at budget 6: token %d at %d/%d", i, k1[i], v1[i]);
    /* keeps over the budget */
    uint8_t all8[N];
    memset(all8, 8, N);
    ak_bitalloc_input over = in;
    over.keep_k = all8;
    p.budget_k = 4.0;
    e.code = 0;
    CHECK(ak_bitalloc_run(&over, &p, k1, v1, NULL, &e) == -1 && e.code == AK_ERR_INVALID, "keeps over budget: code %d",
          e.code);
    /* WEIGHT_MASS scores by hand */
    double mm[4] = {1, 2, 3, 6}, sc[4];
    ak_bitalloc_input in4 = {.n = 4, .mass = mm};
    p.mass_power = 1.5;
    REQUIRE(ak_bitalloc_scores(&in4, &p, NULL, NULL, sc, &e) == 0, "%s", e.msg);
    for (int i = 0; i < 4; i++)
        CHECK(fabs(sc[i] - pow(mm[i] / 3.0, 1.5)) < 1e-12, "mass score %d: %g vs %g", i, sc[i], pow(mm[i] / 3.0, 1.5));
    p.weighting = AK_BITALLOC_WEIGHT_NONE;
    REQUIRE(ak_bitalloc_scores(&in4, &p, NULL, NULL, sc, &e) == 0, "%s", e.msg);
    for (int i = 0; i < 4; i++) CHECK(sc[i] == 1.0, "weight none: score %d %g", i, sc[i]);
    p.weighting = AK_BITALLOC_WEIGHT_MASS;
    p.mass_power = 0.0;
    e.code = 0;
    CHECK(ak_bitalloc_scores(&in4, &p, NULL, NULL, sc, &e) == -1 && e.code == AK_ERR_INVALID, "power 0: code %d", e.code);
}

/* Keys and values in one allocation (key_weight > 0): the two sides
 * together meet the mean budget over 2n items and spend it; a small key
 * weight sends the bits to values, a large one to keys; equal errors and
 * key weight 1 give both sides alike; caps hold. */
TEST(bitalloc_joint) {
    enum { N = 40 };
    double m[N], ek[4 * N], ev[4 * N];
    uint8_t k[N], v[N], cap[N];
    uint64_t seed = 21;
    for (int i = 0; i < N; i++) {
        m[i] = exp(3.0 * rng_unit(&seed));
        for (int j = 0; j < 4; j++) ek[4 * i + j] = ev[4 * i + j] = 16.0 * ldexp(1.0, -4 * j);
        cap[i] = (uint8_t)(2 + rng_int(&seed, 15));
    }
    ak_bitalloc_input in = {.n = N, .mass = m, .err_k = ek, .err_v = ev};
    ak_error e = {{0}};
    ak_bitalloc_result r;
    for (int it = 0; it < 40; it++) {
        ak_bitalloc_params p = params(it % 2 ? AK_BITALLOC_TOPOLOGY : AK_BITALLOC_IMPORTANCE, 2 + 14 * rng_unit(&seed));
        p.budget_v = 2 + 14 * rng_unit(&seed);
        p.key_weight = exp(4.0 * (rng_unit(&seed) - 0.5));
        ak_bitalloc_input c = in;
        if (it % 3 == 0) c.cap_k = cap, c.cap_v = cap;
        REQUIRE(ak_bitalloc_run(&c, &p, k, v, &r, &e) == 0, "iter %d: %s", it, e.msg);
        long L = max_total((p.budget_k + p.budget_v) / 2, 2 * N), s = 0;
        for (int i = 0; i < N; i++) {
            s += k[i] + v[i];
            if (c.cap_k) CHECK(k[i] <= round_cap(cap[i]) && v[i] <= round_cap(cap[i]), "iter %d: over cap", it);
        }
        CHECK(s == r.sum_k + r.sum_v && s <= L, "iter %d: total %ld (reported %ld), limit %ld", it, s,
              r.sum_k + r.sum_v, L);
        /* spent: no item below its cap could afford its next step (the
         * errors fall at every step, so every step has a gain) */
        for (int i = 0; i < N; i++) {
            int lim = c.cap_k ? round_cap(cap[i]) : 16;
            if (k[i] < lim) CHECK(k[i] > L - s, "iter %d: key %d at %d with %ld bits left", it, i, k[i], L - s);
            if (v[i] < lim) CHECK(v[i] > L - s, "iter %d: value %d at %d with %ld bits left", it, i, v[i], L - s);
        }
    }
    ak_bitalloc_params p = params(AK_BITALLOC_IMPORTANCE, 4.0);
    p.weighting = AK_BITALLOC_WEIGHT_NONE;
    p.key_weight = 0.01;
    REQUIRE(ak_bitalloc_run(&in, &p, k, v, &r, &e) == 0, "%s", e.msg);
    CHECK(r.sum_k == 2 * N && r.sum_v == 6 * N, "key weight 0.01: keys %ld values %ld bits, want %d and %d", r.sum_k,
          r.sum_v, 2 * N, 6 * N);
    p.key_weight = 100;
    REQUIRE(ak_bitalloc_run(&in, &p, k, v, &r, &e) == 0, "%s", e.msg);
    CHECK(r.sum_k == 6 * N && r.sum_v == 2 * N, "key weight 100: keys %ld values %ld bits", r.sum_k, r.sum_v);
    p.key_weight = 1;
    REQUIRE(ak_bitalloc_run(&in, &p, k, v, &r, &e) == 0, "%s", e.msg);
    CHECK(memcmp(k, v, N) == 0, "key weight 1, equal errors: sides differ");
    p.key_weight = NAN;
    e.code = 0;
    CHECK(ak_bitalloc_run(&in, &p, k, v, &r, &e) == -1 && e.code == AK_ERR_INVALID, "key weight NaN: code %d", e.code);
    p.key_weight = -1;
    e.code = 0;
    CHECK(ak_bitalloc_run(&in, &p, k, v, &r, &e) == -1 && e.code == AK_ERR_INVALID, "key weight -1: code %d", e.code);
}

/* ak_bitalloc_params_measured sets exactly the documented options and
 * nothing else. */
TEST(bitalloc_params_measured) {
    ak_bitalloc_params a, b;
    ak_bitalloc_params_init(&a);
    a.policy = AK_BITALLOC_TOPOLOGY;
    a.budget_k = 5.5;
    a.n_sinks = 7;
    b = a;
    ak_bitalloc_params_measured(&b);
    CHECK(b.weighting == AK_BITALLOC_WEIGHT_MASS && b.mass_power == 0.5 && b.min_bits == 4 && b.n_sinks == 0 &&
              b.key_weight == 0.1, "options %d %g %d %d %g", (int)b.weighting, b.mass_power, b.min_bits, b.n_sinks,
          b.key_weight);
    b.weighting = a.weighting, b.mass_power = a.mass_power, b.min_bits = a.min_bits, b.n_sinks = a.n_sinks;
    b.key_weight = a.key_weight;
    CHECK(memcmp(&a, &b, sizeof a) == 0, "other fields changed");
}
