/* test_tokmask.c - token masks (src/text/tokmask.c) against the brute force
 * (each token's bytes fed to a fresh copy of the state), on the small shared
 * vocabularies and on a made-up one with split UTF-8; the budget's forced
 * close; the lazy (FREE) start. */
#include <string.h>

#include <cjson/cJSON.h>

#include "base/gguf.h"
#include "base/util.h"
#include "test.h"
#include "text/jsonschema.h"
#include "text/tokmask.h"

static ak_tokenizer *load_tk(ak_test_ctx *t, const char *rel) {
    char path[1024];
    gguf_file f;
    ak_error err = {0};
    if (gguf_open(&f, test_path(path, sizeof path, rel), &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "%s", err.msg);
        return NULL;
    }
    ak_tokenizer *tk = ak_tokenizer_load(&f, &err);
    gguf_close(&f);
    if (!tk) ak_test_fail(t, __FILE__, __LINE__, "%s: %s", rel, err.msg);
    return tk;
}

/* The reference: token i allowed iff its bytes, fed to a copy of m, are
 * taken (an empty end-of-generation token iff m is accepting). */
static int brute_allowed(const ak_vocab_index *v, const ak_gmatch *m, int32_t i, const uint8_t *eog) {
    size_t len;
    const char *b = ak_vocab_index_token(v, i, &len);
    if (!len) return eog && eog[i] && ak_gmatch_accepting(m);
    ak_gmatch *c = ak_gmatch_clone(m);
    int ok = ak_gmatch_feed(c, b, len) == 0;
    ak_gmatch_free(c);
    return ok;
}

static const char *const schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{\"anyOf\":[{\"type\":\"integer\",\"minimum\":0},{\"type\":\"null\"}]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]}},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\",\"tags\",\"ok\"],"
    "\"additionalProperties\":false}",
    "{\"type\":\"object\"}",
    "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"pattern\":\"^[a-f0-9]{4}$\"},\"x\":{\"type\":\"number\"}},"
    "\"required\":[\"id\",\"x\"]},\"minItems\":1,\"maxItems\":3}",
    "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"a\"]},"
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"c\":{\"type\":\"boolean\"}},\"required\":[\"a\",\"c\"]}]}",
};

/* Random walks under the mask: at every step the mask equals the brute
 * force; the chosen token is allowed; the walk ends accepted or at the
 * step limit. Returns the steps checked. */
static int walk_and_compare(ak_test_ctx *t, const ak_vocab_index *v, const uint8_t *eog, const ak_grammar *g, uint64_t seed,
                            int steps) {
    ak_gram_error e = {0};
    ak_tokmask *tm = ak_tokmask_new(g, v, &e);
    if (!tm) { ak_test_fail(t, __FILE__, __LINE__, "tokmask: %s", e.msg); return 0; }
    ak_tmscratch *sc = ak_tmscratch_new(tm);
    ak_gmatch *m = ak_gmatch_new(g);
    int32_t n = ak_vocab_index_size(v);
    uint32_t *mask = calloc(ak_tokmask_words(tm), 4);
    int32_t *allowed = malloc((size_t)n * sizeof *allowed);
    ak_rng r;
    ak_rng_seed(&r, seed);
    int checked = 0, bad = 0;
    for (int s = 0; s < steps && bad < 3; s++) {
        long cnt = ak_tokmask_fill(tm, m, sc, mask);
        int na = 0;
        for (int32_t i = 0; i < n && bad < 3; i++) {
            int got = mask[i >> 5] >> (i & 31) & 1, want = brute_allowed(v, m, i, eog);
            if (got != want) {
                size_t len;
                const char *b = ak_vocab_index_token(v, i, &len);
                ak_test_fail(t, __FILE__, __LINE__, "step %d token %d '%.*s': mask %d, brute force %d", s, i, (int)len, b, got, want);
                bad++;
            }
            if (got) allowed[na++] = i;
        }
        CHECK(cnt == na, "count %ld vs %d bits", cnt, na);
        checked++;
        if (!na) { CHECK(0, "step %d: nothing allowed", s); break; }
        /* prefer ending once accepting, half the time */
        int32_t pick = allowed[ak_rng_u32(&r) % (uint32_t)na];
        if (ak_gmatch_accepting(m) && (ak_rng_u32(&r) & 1)) break;
        size_t pl;
        ak_vocab_index_token(v, pick, &pl);
        if (!pl) break;   /* an end-of-generation token */
        CHECK(ak_tokmask_accept(tm, m, pick) == 0, "accepting an allowed token failed");
    }
    free(mask);
    free(allowed);
    ak_gmatch_free(m);
    ak_tmscratch_free(sc);
    ak_tokmask_free(tm);
    return checked;
}

/* The index of a tokenizer with its EOG flags (returned in *eog). */
static ak_vocab_index *index_of(ak_test_ctx *t, const ak_tokenizer *tk, uint8_t **eog) {
    ak_gram_error e = {0};
    ak_vocab_index *v = ak_vocab_index_new(tk, &e);
    if (!v) ak_test_fail(t, __FILE__, __LINE__, "index: %s", e.msg);
    int32_t n = ak_tokenizer_vocab_size(tk);
    *eog = malloc((size_t)n);
    for (int32_t i = 0; i < n; i++) (*eog)[i] = (uint8_t)ak_token_is_eog(tk, i);
    return v;
}

TEST(tokmask_matches_brute_force_on_shared_vocabularies) {
    static const char *const models[] = {"models/stories260K.gguf", "models/tiny-llama-h64-gqa-f32.gguf"};
    for (size_t mi = 0; mi < 2; mi++) {
        ak_tokenizer *tk = load_tk(t, models[mi]);
        if (!tk) return;
        uint8_t *eog;
        ak_vocab_index *v = index_of(t, tk, &eog);
        int total = 0;
        for (size_t si = 0; v && si < sizeof schemas / sizeof schemas[0]; si++) {
            ak_gram_error e = {0};
            ak_grammar *g = ak_jsonschema_compile(schemas[si], strlen(schemas[si]), NULL, &e);
            if (!g) { CHECK(0, "%s: %s", schemas[si], e.msg); continue; }
            for (uint64_t seed = 1; seed <= (mi ? 2u : 6u); seed++) total += walk_and_compare(t, v, eog, g, seed * 77 + si, mi ? 40 : 80);
            ak_grammar_free(g);
        }
        printf("  %s: %d masks checked against the brute force\n", models[mi], total);
        free(eog);
        ak_vocab_index_free(v);
        ak_tokenizer_free(tk);
    }
}

TEST(tokmask_split_utf8_and_byte_tokens) {
    /* every single byte, pieces that split characters, JSON-ish pieces */
    static const char *const pieces[] = {"\xC3", "\xA9", "\xC3\xA9", "\xE2\x82", "\xAC\"", "\"\xE2", "é\"}", "\"a",
                                         "\"}", "\":", "\",\"", "{\"", "ab", "abc", "\\", "\\u00", "e9", "\\n", "12", "-0",
                                         ".5", "e+", "true", "null", "]}", "[\"", "\":\"", "\xF0\x9F", "\x98\x80", ""};
    enum { NB = 256, NP = sizeof pieces / sizeof pieces[0] };
    const char *bytes[NB + NP];
    size_t lens[NB + NP];
    uint8_t eog[NB + NP] = {0};
    char single[NB];
    for (int i = 0; i < NB; i++) {
        single[i] = (char)i;
        bytes[i] = &single[i];
        lens[i] = 1;
    }
    for (int i = 0; i < NP; i++) {
        bytes[NB + i] = pieces[i];
        lens[NB + i] = strlen(pieces[i]);
    }
    eog[NB + NP - 1] = 1;   /* the empty piece ends generation */
    ak_gram_error e = {0};
    ak_vocab_index *v = ak_vocab_index_from_bytes(bytes, lens, eog, NB + NP, &e);
    REQUIRE(v, "index: %s", e.msg);
    static const char *const more[] = {
        "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}},\"required\":[\"s\"]}",
        "{\"type\":\"string\",\"pattern\":\"^\xC3\xA9+a$\"}", "{\"enum\":[\"\xC3\xA9\",\"\xE2\x82\xAC\",12,-0.5,{\"a\":[true,null]}]}"};
    int total = 0;
    for (size_t si = 0; si < 3; si++) {
        ak_grammar *g = ak_jsonschema_compile(more[si], strlen(more[si]), NULL, &e);
        if (!g) { CHECK(0, "%s: %s", more[si], e.msg); continue; }
        for (uint64_t seed = 1; seed <= 20; seed++) total += walk_and_compare(t, v, eog, g, seed, 60);
        ak_grammar_free(g);
    }
    printf("  %d masks checked\n", total);
    ak_vocab_index_free(v);
}

/* With max_tokens just above the close plan, a walk that follows the plan
 * once tokens_left <= its length ends in valid JSON within the budget. */
TEST(tokmask_budget_forces_a_valid_close) {
    ak_tokenizer *tk = load_tk(t, "models/tiny-llama-h64-gqa-f32.gguf");
    if (!tk) return;
    uint8_t *eog;
    ak_vocab_index *v = index_of(t, tk, &eog);
    ak_gram_error e = {0};
    ak_grammar *g = ak_jsonschema_compile(schemas[0], strlen(schemas[0]), NULL, &e);
    REQUIRE(g && v, "compile: %s", e.msg);
    ak_tokmask *tm = ak_tokmask_new(g, v, &e);
    REQUIRE(tm, "tokmask: %s", e.msg);
    long minimum = ak_tokmask_min_tokens(tm);
    /* the shortest instance {"name":"","age":0,"tags":[],"ok":true} in tokens: positive, at most its bytes */
    CHECK(minimum > 0 && minimum <= 39, "min tokens %ld", minimum);
    ak_tmscratch *sc = ak_tmscratch_new(tm);
    uint32_t *mask = calloc(ak_tokmask_words(tm), 4);
    int32_t n = ak_vocab_index_size(v), *allowed = malloc((size_t)n * sizeof *allowed), plan[256];
    for (long budget = minimum; budget < minimum + 12; budget++)
        for (uint64_t seed = 1; seed <= 4; seed++) {
            ak_gmatch *m = ak_gmatch_new(g);
            ak_rng r;
            ak_rng_seed(&r, seed * 1000 + (uint64_t)budget);
            long left = budget, np = -1, pi = 0;
            char text[4096];
            size_t tl = 0;
            while (left > 0 && !ak_gmatch_finished(m)) {
                int32_t pick;
                if (np < 0) {
                    long need = ak_tokmask_close_plan(tm, m, plan, 256);
                    if (need >= left) { np = need; pi = 0; }
                }
                if (np >= 0) {
                    if (pi >= np) break;
                    pick = plan[pi++];
                } else {
                    ak_tokmask_fill(tm, m, sc, mask);
                    int na = 0;
                    for (int32_t i = 0; i < n; i++)
                        if (mask[i >> 5] >> (i & 31) & 1 && !eog[i]) allowed[na++] = i;
                    if (!na) break;
                    /* a random allowed token that keeps a close within the budget */
                    pick = -1;
                    for (int tries = 0; tries < 8 && pick < 0; tries++) {
                        int32_t c = allowed[ak_rng_u32(&r) % (uint32_t)na];
                        if (ak_tokmask_budget_ok(tm, m, c, left)) pick = c;
                    }
                    if (pick < 0) {
                        np = ak_tokmask_close_plan(tm, m, plan, 256);
                        pi = 0;
                        continue;
                    }
                }
                size_t len;
                const char *b = ak_vocab_index_token(v, pick, &len);
                CHECK(ak_tokmask_accept(tm, m, pick) == 0, "token not taken");
                if (tl + len < sizeof text) { memcpy(text + tl, b, len); tl += len; }
                left--;
            }
            text[tl] = 0;
            CHECK(ak_gmatch_accepting(m), "budget %ld seed %llu: not closed: %s", budget, (unsigned long long)seed, text);
            cJSON *j = cJSON_Parse(text);
            CHECK(j != NULL, "budget %ld: not JSON: %s", budget, text);
            cJSON_Delete(j);
            ak_gmatch_free(m);
        }
    free(mask);
    free(allowed);
    ak_tmscratch_free(sc);
    ak_tokmask_free(tm);
    ak_grammar_free(g);
    ak_vocab_index_free(v);
    free(eog);
    ak_tokenizer_free(tk);
}

/* Lazy start: free text takes everything; after begin, the rule holds. */
TEST(tokmask_lazy_start) {
    ak_gram_error e = {0};
    ak_grammar *g = ak_json_object_grammar(NULL, &e);
    REQUIRE(g, "%s", e.msg);
    ak_gmatch *m = ak_gmatch_new_free(g);
    CHECK(ak_gmatch_is_free(m) && ak_gmatch_feed(m, "any text <call>", 15) == 0 && ak_gmatch_accepting(m), "free mode");
    CHECK(ak_gmatch_begin(m, ak_grammar_root(g)) == 0 && !ak_gmatch_is_free(m), "begin");
    CHECK(ak_gmatch_feed(m, "x", 1) < 0, "held to the rule");
    CHECK(ak_gmatch_feed(m, "{\"a\":1", 6) == 0 && !ak_gmatch_accepting(m) && ak_gmatch_close_len(m) == 1, "object opened");
    CHECK(ak_gmatch_feed(m, "}", 1) == 0 && ak_gmatch_finished(m), "closed");
    ak_gmatch_free(m);
    ak_grammar_free(g);
}
