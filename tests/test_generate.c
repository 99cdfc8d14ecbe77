/* test_generate.c - the generation step (src/text/generate.c) driven through a
 * known token sequence: greedy sampling of one-hot logits picks each token
 * in turn, so the expected text, stop point and counts follow from the
 * tokens alone (ak_detokenize of each prefix, strstr for the stop string). */
#include <string.h>

#include "text/generate.h"
#include "base/gguf.h"
#include "test.h"

/* qwen2-tiny's byte-level BPE tokenizer, or NULL (failure recorded). */
static ak_tokenizer *gen_tok(ak_test_ctx *t) {
    char path[512];
    gguf_file f;
    ak_error err = {0};
    if (gguf_open(&f, test_path(path, sizeof path, "models/qwen2-tiny.gguf"), &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "%s", err.msg);
        return NULL;
    }
    ak_tokenizer *tk = ak_tokenizer_load(&f, &err);
    gguf_close(&f);
    if (!tk) ak_test_fail(t, __FILE__, __LINE__, "%s", err.msg);
    return tk;
}

/* Logits that make greedy sampling pick tok. */
static void one_hot(float *logits, int vocab, int32_t tok) {
    for (int i = 0; i < vocab; i++) logits[i] = -10.0f;
    logits[tok] = 10.0f;
}

/* A greedy sampler over the tokenizer's vocabulary. */
static ak_sampler *greedy(int vocab) {
    ak_sampler_params sp = ak_sampler_defaults();
    sp.temp = 0;
    sp.repeat_penalty = 1.0f;
    ak_error err = {0};
    return ak_sampler_new(&sp, vocab, &err);
}

TEST(generate_stop_string_across_tokens) {
    ak_tokenizer *tk = gen_tok(t);
    REQUIRE(tk, "no tokenizer");
    const char *src = "The cat sat on the mat, and the dog sat on the rug.";
    const char *stop_s = " on the";
    int32_t *ids = NULL;
    size_t n = 0;
    ak_error err = {0};
    REQUIRE(ak_tokenize(tk, src, strlen(src), 0, &ids, &n, &err) == 0, "%s", err.msg);
    int vocab = ak_tokenizer_vocab_size(tk);
    /* expected: the first k whose text holds the stop string, and the text
     * before its first occurrence */
    int k_stop = -1;
    long cut = -1;
    for (size_t k = 1; k <= n && k_stop < 0; k++) {
        size_t len = 0;
        char *txt = ak_detokenize(tk, ids, k, &len, &err);
        REQUIRE(txt, "%s", err.msg);
        const char *p = strstr(txt, stop_s);
        if (p) { k_stop = (int)k; cut = p - txt; }
        free(txt);
    }
    REQUIRE(k_stop > 1, "stop string not found in the tokens");
    /* it must span a token boundary for the test to mean something */
    size_t l1 = 0;
    char *before = ak_detokenize(tk, ids, (size_t)k_stop - 1, &l1, &err);
    REQUIRE(before, "%s", err.msg);
    CHECK((long)l1 > cut, "the stop string does not start before the last token");
    free(before);

    ak_sampler *smp = greedy(vocab);
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    REQUIRE(smp && logits, "setup");
    int32_t prompt[2] = {ids[0], ids[0]};
    const char *stops[2] = {"zzz never", stop_s};
    ak_gen g;
    REQUIRE(ak_gen_init(&g, &(ak_gen_opts){.tok = tk, .smp = smp, .prompt = prompt, .n_prompt = 2, .max_tokens = 1000,
                        .n_ctx = 4096, .stop_at_eog = 1, .stop = stops, .n_stop = 2}, &err) == 0, "%s", err.msg);
    size_t shown = 0;
    ak_gen_status st = AK_GEN_MORE;
    int steps = 0;
    for (size_t i = 0; i < n && st == AK_GEN_MORE; i++) {
        one_hot(logits, vocab, ids[i]);
        ak_gen_out out;
        st = ak_gen_step(&g, logits, 2 + (int)i, &out, &err);
        steps++;
        CHECK(out.sampled && out.tok == ids[i], "step %zu: token %d, want %d", i, out.tok, ids[i]);
        CHECK(out.visible >= shown, "step %zu: visible went back %zu -> %zu", i, shown, out.visible);
        /* what is shown never reaches into the stop string */
        CHECK(out.visible <= (size_t)cut, "step %zu: %zu bytes shown, the stop string starts at %ld", i,
              out.visible, cut);
        shown = out.visible;
        if (st == AK_GEN_STOP) CHECK(out.cut == cut, "cut at %ld, want %ld", out.cut, cut);
        else CHECK(out.cut == -1, "cut %ld without a stop", out.cut);
    }
    CHECK(st == AK_GEN_STOP, "status %d, want STOP", (int)st);
    CHECK(steps == k_stop, "stopped after %d tokens, want %d", steps, k_stop);
    CHECK(g.n_gen == k_stop, "n_gen %d, want %d", g.n_gen, k_stop);
    CHECK(g.len == (size_t)cut && !strncmp(g.text, src, (size_t)cut) && g.text[cut] == 0, "text '%s'", g.text);
    CHECK(g.n_hist == 2 + k_stop && g.hist[2] == ids[0] && g.hist[1 + k_stop] == ids[k_stop - 1], "history");
    ak_gen_free(&g);
    free(logits);
    free(ids);
    ak_sampler_free(smp);
    ak_tokenizer_free(tk);
}

TEST(generate_eos_and_limits) {
    ak_tokenizer *tk = gen_tok(t);
    REQUIRE(tk, "no tokenizer");
    int vocab = ak_tokenizer_vocab_size(tk);
    int32_t eos = ak_tokenizer_eos(tk);
    REQUIRE(eos >= 0 && ak_token_is_eog(tk, eos), "no end-of-generation token");
    int32_t *ids = NULL;
    size_t n = 0;
    ak_error err = {0};
    REQUIRE(ak_tokenize(tk, "one two three four", 18, 0, &ids, &n, &err) == 0 && n >= 4, "tokenize");
    size_t l3 = 0;
    char *three = ak_detokenize(tk, ids, 3, &l3, &err);
    REQUIRE(three, "%s", err.msg);
    ak_sampler *smp = greedy(vocab);
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    REQUIRE(smp && logits, "setup");
    ak_gen_out out;
    ak_gen g;

    /* EOS ends (sampled, not kept) when stop_at_eog; kept otherwise */
    for (int at_eog = 1; at_eog >= 0; at_eog--) {
        REQUIRE(ak_gen_init(&g, &(ak_gen_opts){.tok = tk, .smp = smp, .prompt = ids, .n_prompt = 1, .max_tokens = 10,
                            .n_ctx = 4096, .stop_at_eog = at_eog}, &err) == 0, "%s", err.msg);
        one_hot(logits, vocab, ids[1]);
        CHECK(ak_gen_step(&g, logits, 1, &out, &err) == AK_GEN_MORE, "first token");
        one_hot(logits, vocab, eos);
        ak_gen_status st = ak_gen_step(&g, logits, 2, &out, &err);
        CHECK(out.sampled && out.tok == eos, "EOS not sampled");
        if (at_eog) CHECK(st == AK_GEN_STOP && g.n_gen == 1 && g.n_hist == 2, "EOS: status %d, n_gen %d", (int)st, g.n_gen);
        else CHECK(st == AK_GEN_MORE && g.n_gen == 2 && g.hist[2] == eos, "EOS kept: status %d, n_gen %d", (int)st, g.n_gen);
        ak_gen_free(&g);
    }

    /* max_tokens 3: the third token is kept and ends with LENGTH */
    REQUIRE(ak_gen_init(&g, &(ak_gen_opts){.tok = tk, .smp = smp, .max_tokens = 3, .n_ctx = 4096, .stop_at_eog = 1},
                        &err) == 0, "%s", err.msg);
    ak_gen_status st = AK_GEN_MORE;
    int steps = 0;
    while (st == AK_GEN_MORE && steps < 10) {
        one_hot(logits, vocab, ids[steps]);
        st = ak_gen_step(&g, logits, steps, &out, &err);
        steps++;
    }
    CHECK(st == AK_GEN_LENGTH && steps == 3 && g.n_gen == 3, "max_tokens: status %d after %d steps", (int)st, steps);
    const char *fp;
    size_t nf = ak_gen_flush(&g, &fp);
    CHECK(g.len == l3 + nf && !memcmp(g.text, three, l3), "text '%s', want '%s'", g.text, three);
    ak_gen_free(&g);

    /* the context: pos + 1 reaching n_ctx ends after the token; pos at
     * n_ctx samples nothing */
    REQUIRE(ak_gen_init(&g, &(ak_gen_opts){.tok = tk, .smp = smp, .prompt = ids, .n_prompt = 2, .max_tokens = 100,
                        .n_ctx = 4, .stop_at_eog = 1}, &err) == 0, "%s", err.msg);
    one_hot(logits, vocab, ids[2]);
    CHECK(ak_gen_step(&g, logits, 2, &out, &err) == AK_GEN_MORE, "pos 2 of 4");
    CHECK(ak_gen_step(&g, logits, 3, &out, &err) == AK_GEN_LENGTH && out.sampled && g.n_gen == 2, "pos 3 of 4");
    CHECK(ak_gen_step(&g, logits, 4, &out, &err) == AK_GEN_LENGTH && !out.sampled && g.n_gen == 2, "pos 4 of 4");
    ak_gen_free(&g);

    /* max_tokens 0: nothing is sampled */
    REQUIRE(ak_gen_init(&g, &(ak_gen_opts){.tok = tk, .smp = smp, .prompt = ids, .n_prompt = 1, .max_tokens = 0,
                        .n_ctx = 4096, .stop_at_eog = 1}, &err) == 0, "%s", err.msg);
    CHECK(ak_gen_step(&g, logits, 1, &out, &err) == AK_GEN_LENGTH && !out.sampled && g.n_gen == 0, "max_tokens 0");
    ak_gen_free(&g);

    /* an empty stop string is refused by code */
    const char *bad[1] = {""};
    CHECK(ak_gen_init(&g, &(ak_gen_opts){.tok = tk, .smp = smp, .prompt = ids, .n_prompt = 1, .max_tokens = 5,
                      .n_ctx = 4096, .stop_at_eog = 1, .stop = bad, .n_stop = 1}, &err) < 0 &&
          err.code == AK_ERR_INVALID, "empty stop");
    ak_gen_free(&g);

    free(three);
    free(logits);
    free(ids);
    ak_sampler_free(smp);
    ak_tokenizer_free(tk);
}

/* A stop string completed by a token that also starts a multi-byte
 * character (" \xE2\x98" of " \xE2\x98\x83", a snowman, in GPT-2's
 * byte-level vocabulary): the detokenizer still holds that lead byte at the end, and
 * it lies after the cut, so ak_gen_flush gives nothing; without a stop
 * string the same flush gives its replacement. */
TEST(generate_flush_after_a_stop_string_gives_nothing) {
    ak_tokenizer *tk = gen_tok(t);
    REQUIRE(tk, "no tokenizer");
    const char *src = "sat \xE2\x98\x83";
    int32_t *ids = NULL;
    size_t n = 0;
    ak_error err = {0};
    REQUIRE(ak_tokenize(tk, src, strlen(src), 0, &ids, &n, &err) == 0, "%s", err.msg);
    REQUIRE(n >= 2, "%zu tokens", n);
    int vocab = ak_tokenizer_vocab_size(tk);
    ak_sampler *smp = greedy(vocab);
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    REQUIRE(smp && logits, "setup");
    /* the two first tokens: "sat" and " \xE2\x98" (checked: their text so
     * far is "sat " with two bytes held) */
    for (int with_stop = 0; with_stop < 2; with_stop++) {
        const char *stops[1] = {"sat "};
        ak_gen g;
        REQUIRE(ak_gen_init(&g, &(ak_gen_opts){.tok = tk, .smp = smp, .max_tokens = 100, .n_ctx = 4096,
                            .stop_at_eog = 1, .stop = stops, .n_stop = with_stop}, &err) == 0, "%s", err.msg);
        ak_gen_out out;
        ak_gen_status st = AK_GEN_MORE;
        for (int i = 0; i < 2 && st == AK_GEN_MORE; i++) {
            one_hot(logits, vocab, ids[i]);
            st = ak_gen_step(&g, logits, i, &out, &err);
        }
        const char *fp;
        size_t nf = ak_gen_flush(&g, &fp);
        if (with_stop) {
            CHECK(st == AK_GEN_STOP && g.len == 0, "status %d, text '%s'", (int)st, g.text);
            CHECK(nf == 0, "%zu bytes flushed past the stop string", nf);
        } else {
            CHECK(st == AK_GEN_MORE && nf > 0, "no byte held after 'sat ' (status %d, flushed %zu): the precondition",
                  (int)st, nf);
            CHECK(g.len == 4 + nf && !memcmp(g.text, "sat ", 4), "text '%s'", g.text);
        }
        ak_gen_free(&g);
    }
    free(logits);
    free(ids);
    ak_sampler_free(smp);
    ak_tokenizer_free(tk);
}
