/* test_sampler.c - the sampler's OpenAI fields against hand-computed
 * references: frequency and presence penalties over the generated tokens
 * (logits after each step, in binary fractions so the floats are exact),
 * their order after the repetition penalty, logit biases (the logits, and
 * the probability a bias gives a token when drawing), and that without
 * them the logits are left untouched. */
#include <math.h>
#include <string.h>

#include "text/sampler.h"
#include "test.h"

/* Greedy params with every truncation off. */
static ak_sampler_params plain(void) {
    ak_sampler_params p = ak_sampler_defaults();
    p.temp = 0;
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0;
    return p;
}

/* 1 when a[0..n) == b[0..n) exactly. */
static int same(const float *a, const float *b, int n) { return !memcmp(a, b, sizeof *a * (size_t)n); }

TEST(sampler_frequency_presence_hand_computed) {
    ak_sampler_params p = plain();
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    ak_error err = {0};
    ak_sampler *s = ak_sampler_new(&p, 5, &err);
    REQUIRE(s, "%s", err.msg);
    static const float base[5] = {2.0f, 1.5f, 1.0f, 0.5f, -1.0f};
    /* logit[t] = base[t] - 0.5 * count[t] - 0.25 * (count[t] > 0), count over the tokens picked before */
    static const struct { float after[5]; int32_t pick; } steps[] = {
        {.after = {2.0f, 1.5f, 1.0f, 0.5f, -1.0f}, .pick = 0},     /* nothing generated yet */
        {.after = {1.25f, 1.5f, 1.0f, 0.5f, -1.0f}, .pick = 1},    /* 0 once: 2 - 0.5 - 0.25 */
        {.after = {1.25f, 0.75f, 1.0f, 0.5f, -1.0f}, .pick = 0},   /* 0 once, 1 once */
        {.after = {0.75f, 0.75f, 1.0f, 0.5f, -1.0f}, .pick = 2},   /* 0 twice: 2 - 1 - 0.25 */
        {.after = {0.75f, 0.75f, 0.25f, 0.5f, -1.0f}, .pick = 0},  /* ties go to the lower id */
        {.after = {0.25f, 0.75f, 0.25f, 0.5f, -1.0f}, .pick = 1},  /* 0 three times: 2 - 1.5 - 0.25 */
    };
    int32_t hist[8];
    for (int k = 0; k < (int)(sizeof steps / sizeof *steps); k++) {
        float l[5];
        memcpy(l, base, sizeof l);
        int32_t tok = ak_sample(s, l, hist, k);
        CHECK(same(l, steps[k].after, 5), "step %d: logits %g %g %g %g %g", k, l[0], l[1], l[2], l[3], l[4]);
        CHECK(tok == steps[k].pick, "step %d: picked %d, want %d", k, tok, steps[k].pick);
        hist[k] = tok;
    }
    ak_sampler_free(s);

    /* a negative presence penalty favours what was said; the prompt (history) does not count */
    p = plain();
    p.presence_penalty = -1.0f;
    s = ak_sampler_new(&p, 3, &err);
    REQUIRE(s, "%s", err.msg);
    int32_t prompt[4] = {1, 1, 2, 2};
    float l[3] = {1.0f, 0.5f, 0.75f};
    CHECK(ak_sample(s, l, prompt, 4) == 0 && l[1] == 0.5f && l[2] == 0.75f, "the prompt's tokens are not penalized");
    float l2[3] = {0.5f, 1.0f, 0.75f};
    CHECK(ak_sample(s, l2, prompt, 4) == 0 && l2[0] == 1.5f, "0 generated once: 0.5 + 1 = %g", l2[0]);
    ak_sampler_free(s);
}

TEST(sampler_penalties_after_the_repetition_penalty) {
    /* llama.cpp's repetition penalty first (over the history), then OpenAI's (over the generated) */
    ak_sampler_params p = plain();
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    ak_error err = {0};
    ak_sampler *s = ak_sampler_new(&p, 3, &err);
    REQUIRE(s, "%s", err.msg);
    int32_t hist[2] = {0, 0};
    float l[3] = {3.0f, 1.0f, 0.5f};
    CHECK(ak_sample(s, l, hist, 1) == 0 && l[0] == 1.5f, "step 1: 3 / 2 = %g", l[0]);
    float l2[3] = {3.0f, 1.0f, 0.5f};
    /* (3 / 2) - 0.5 - 0.25 = 0.75; the other order would give (3 - 0.75) / 2 = 1.125 */
    CHECK(ak_sample(s, l2, hist, 2) == 1 && l2[0] == 0.75f, "step 2: %g, want 0.75", l2[0]);
    ak_sampler_free(s);
}

TEST(sampler_logit_bias_hand_computed) {
    ak_logit_bias b[3] = {{.id = 2, .bias = 1.5f}, {.id = 0, .bias = -100}, {.id = 9, .bias = 5}};
    ak_sampler_params p = plain();
    p.logit_bias = b;
    p.n_logit_bias = 3;
    ak_error err = {0};
    ak_sampler *s = ak_sampler_new(&p, 4, &err);
    REQUIRE(s, "%s", err.msg);
    b[2].id = 1;   /* the sampler holds its own copy */
    float l[4] = {1.0f, 0.0f, 0.0f, 1.25f};
    int32_t tok = ak_sample(s, l, NULL, 0);
    static const float want[4] = {-99.0f, 0.0f, 1.5f, 1.25f};   /* id 9 is outside the vocabulary: ignored */
    CHECK(same(l, want, 4) && tok == 2, "logits %g %g %g %g, picked %d", l[0], l[1], l[2], l[3], tok);
    ak_sampler_free(s);

    /* drawing: logits (0, 0) with +ln 3 on token 1 give p(1) = 3 / (1 + 3) = 0.75 */
    ak_logit_bias one = {.id = 1, .bias = logf(3.0f)};
    p = plain();
    p.temp = 1;
    p.seed = 42;
    p.logit_bias = &one;
    p.n_logit_bias = 1;
    s = ak_sampler_new(&p, 2, &err);
    REQUIRE(s, "%s", err.msg);
    int ones = 0, draws = 20000;
    for (int i = 0; i < draws; i++) {
        float x[2] = {0, 0};
        ones += ak_sample(s, x, NULL, 0) == 1;
    }
    double f = (double)ones / draws;   /* sd sqrt(0.75 * 0.25 / 20000) = 0.003 */
    CHECK(fabs(f - 0.75) < 0.015, "p(1) = %.4f, want 0.75", f);
    ak_sampler_free(s);
}

TEST(sampler_without_openai_fields_leaves_logits_alone) {
    /* the same draws and untouched logits whether or not the zero fields are spelled out */
    ak_sampler_params p = ak_sampler_defaults();
    p.seed = 9;
    ak_sampler_params q = p;
    q.frequency_penalty = 0;
    q.presence_penalty = 0;
    q.n_logit_bias = 0;
    ak_error err = {0};
    ak_sampler *a = ak_sampler_new(&p, 64, &err), *b = ak_sampler_new(&q, 64, &err);
    REQUIRE(a && b, "%s", err.msg);
    ak_rng rng;
    ak_rng_seed(&rng, 3);
    int32_t hist[64];
    for (int k = 0; k < 64; k++) {
        float la[64], lb[64], ref[64];
        for (int i = 0; i < 64; i++) ref[i] = la[i] = lb[i] = ak_rng_normal(&rng);
        int32_t ta = ak_sample(a, la, hist, k), tb = ak_sample(b, lb, hist, k);
        CHECK(ta == tb && same(la, ref, 64) && same(lb, ref, 64), "step %d", k);
        hist[k] = ta;
    }
    ak_sampler_free(a);
    ak_sampler_free(b);
    /* bad parameters are refused */
    q.frequency_penalty = INFINITY;
    CHECK(!ak_sampler_new(&q, 4, &err), "an infinite penalty");
    q.frequency_penalty = 0;
    q.n_logit_bias = 2;
    q.logit_bias = NULL;
    CHECK(!ak_sampler_new(&q, 4, &err), "biases without their array");
}
