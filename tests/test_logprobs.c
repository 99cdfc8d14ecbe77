/* test_logprobs.c - log-probabilities against values computed here from
 * the definition (log of exp over the sum of exps, in long double), the
 * top-k order with ties, and the edge cases (-inf logits, k above n). */
#include <math.h>

#include "text/logprobs.h"
#include "test.h"

/* log p(i) from the definition, in long double. */
static long double ref_lp(const float *l, int n, int i) {
    long double s = 0;
    for (int j = 0; j < n; j++) s += expl((long double)l[j]);
    return (long double)l[i] - logl(s);
}

TEST(logprobs_match_the_definition) {
    const float l[6] = {1.5f, -2.0f, 3.25f, 0.0f, 3.25f, -7.5f};
    double lse = ak_logsumexp(l, 6);
    ak_token_lp top[AK_TOP_LOGPROBS_MAX];
    int k = ak_top_logprobs(l, 6, lse, 4, top);
    CHECK(k == 4, "k == 4");
    /* 3.25 twice: the lower id first */
    const int32_t want[4] = {2, 4, 0, 3};
    double maxd = 0;
    for (int i = 0; i < 4; i++) {
        CHECK(top[i].id == want[i], "top[i].id == want[i]");
        double d = fabs((double)(top[i].logprob - ref_lp(l, 6, want[i])));
        if (d > maxd) maxd = d;
    }
    printf("    max |logprob - reference| = %.3g\n", maxd);
    CHECK(maxd < 1e-6, "maxd < 1e-6");
    /* the probabilities sum to one */
    long double s = 0;
    k = ak_top_logprobs(l, 6, lse, 20, top);
    CHECK(k == 6, "k == 6");
    for (int i = 0; i < k; i++) s += expl(top[i].logprob);
    CHECK(fabsl(s - 1) < 1e-6, "fabsl(s - 1) < 1e-6");
}

TEST(logprobs_large_logits_and_minus_infinity) {
    /* exp(1000) overflows a double: the max must be taken out first */
    const float l[3] = {1000.0f, 999.0f, -INFINITY};
    double lse = ak_logsumexp(l, 3);
    CHECK(isfinite(lse), "isfinite(lse)");
    ak_token_lp top[3];
    CHECK(ak_top_logprobs(l, 3, lse, 3, top) == 3, "ak_top_logprobs(l, 3, lse, 3, top) == 3");
    CHECK(fabs(top[0].logprob - (-log1p(exp(-1.0)))) < 1e-6, "top[0] %g", top[0].logprob);
    CHECK(fabs(top[1].logprob - (-1.0 - log1p(exp(-1.0)))) < 1e-6, "top[1] %g", top[1].logprob);
    CHECK(top[2].id == 2 && isinf(top[2].logprob) && top[2].logprob < 0, "top[2].id == 2 && isinf(top[2].logprob) && top[2].logprob < 0");
    CHECK(ak_top_logprobs(l, 3, lse, 0, top) == 0, "ak_top_logprobs(l, 3, lse, 0, top) == 0");
}

TEST(logprobs_top_k_over_a_large_vocabulary) {
    /* a pseudo-random vocabulary; the top 20 must be the 20 largest, sorted */
    enum { N = 50000 };
    static float l[N];
    uint32_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 1664525u + 1013904223u;
        l[i] = (float)(x >> 8) / (float)(1u << 24) * 20.0f - 10.0f;
    }
    double lse = ak_logsumexp(l, N);
    ak_token_lp top[AK_TOP_LOGPROBS_MAX];
    int k = ak_top_logprobs(l, N, lse, 25, top);
    CHECK(k == AK_TOP_LOGPROBS_MAX, "k == AK_TOP_LOGPROBS_MAX");
    float kth = l[top[k - 1].id];
    int larger = 0;
    for (int i = 0; i < N; i++) larger += l[i] > kth;
    CHECK(larger == k - 1, "larger == k - 1");
    for (int i = 1; i < k; i++) CHECK(top[i].logprob <= top[i - 1].logprob, "top[i].logprob <= top[i - 1].logprob");
}
