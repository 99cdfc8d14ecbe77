/* test_tokenizer.c - tokenizer against llama.cpp's test vectors, round trips,
 * the streaming decoder, special tokens, bad metadata, speed. */
#include <string.h>

#include "test.h"
#include "base/gguf.h"
#include "text/tokenizer.h"
#include "base/util.h"

/* Loads the tokenizer of a shared GGUF file (closing the file at once, which
 * also checks that the tokenizer copied what it needs). */
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

/* tokenize (no BOS/EOS, no special parsing unless flags say so) */
static int tok(const ak_tokenizer *tk, const char *s, size_t n, int flags, int32_t **ids, size_t *n_ids) {
    ak_error err = {0};
    int rc = ak_tokenize(tk, s, n, flags, ids, n_ids, &err);
    if (rc < 0) fprintf(stderr, "  tokenize error: %s\n", err.msg);
    return rc;
}

static void fmt_ids(char *buf, size_t cap, const int32_t *ids, size_t n) {
    size_t o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n && o + 16 < cap; i++) o += (size_t)snprintf(buf + o, cap - o, " %d", ids[i]);
}

/* ---- llama.cpp test vectors --------------------------------------------------
 * NAME.inp: strings, each followed by "\n__ggml_vocab_test__\n" (the file
 * ends with that separator); NAME.out: one line of ids per string. */
static void golden(ak_test_ctx *t, const char *name, int min_vocab) {
    char rel[256], path[1024];
    ak_error err = {0};
    snprintf(rel, sizeof rel, "golden/tokenizer/%s.gguf", name);
    ak_tokenizer *tk = load_tk(t, rel);
    REQUIRE(tk, "no tokenizer");
    CHECK(ak_tokenizer_vocab_size(tk) >= min_vocab, "vocab %d", ak_tokenizer_vocab_size(tk));

    size_t inp_len, out_len;
    snprintf(rel, sizeof rel, "golden/tokenizer/%s.inp", name);
    char *inp = ak_read_file(test_path(path, sizeof path, rel), &inp_len, &err);
    snprintf(rel, sizeof rel, "golden/tokenizer/%s.out", name);
    char *out = ak_read_file(test_path(path, sizeof path, rel), &out_len, &err);
    if (!inp || !out) {
        free(inp); free(out); ak_tokenizer_free(tk);
        REQUIRE(0, "%s", err.msg);
    }

    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sep_len = sizeof sep - 1;
    char *s = inp, *line = out;
    int n = 0, pass = 0;
    for (;;) {
        char *e = memmem(s, inp_len - (size_t)(s - inp), sep, sep_len);
        if (!e) break;
        char *nl = strchr(line, '\n');
        if (!nl) { CHECK(0, "%s.out has fewer lines than %s.inp has strings", name, name); break; }
        *nl = 0;
        int32_t want[1024];
        size_t nw = 0;
        for (char *p = line, *q;; p = q) {
            long v = strtol(p, &q, 10);
            if (q == p || nw == 1024) break;
            want[nw++] = (int32_t)v;
        }
        int32_t *ids = NULL;
        size_t ni = 0;
        int rc = tok(tk, s, (size_t)(e - s), 0, &ids, &ni);
        int ok = rc == 0 && ni == nw && memcmp(ids, want, nw * sizeof *ids) == 0;
        if (ok) pass++;
        else {
            char a[2048], b[2048];
            fmt_ids(a, sizeof a, want, nw);
            fmt_ids(b, sizeof b, ids, ni);
            CHECK(0, "%s #%d \"%.*s\": want%s got%s", name, n, (int)(e - s > 60 ? 60 : e - s), s, a, b);
        }
        free(ids);
        n++;
        s = e + sep_len;
        line = nl + 1;
    }
    CHECK(s == inp + inp_len, "%s.inp: text after the last separator", name);
    CHECK(n >= 40, "%s: only %d test strings", name, n);
    printf("     %s: %d/%d test vectors pass\n", name, pass, n);
    free(inp); free(out);
    ak_tokenizer_free(tk);
}

TEST(tokenizer_golden_llama_spm) { golden(t, "llama-spm", 32000); }
TEST(tokenizer_golden_gpt2) { golden(t, "gpt-2", 50257); }
TEST(tokenizer_golden_deepseek_llm) { golden(t, "deepseek-llm", 100000); }
TEST(tokenizer_golden_starcoder) { golden(t, "starcoder", 49152); }
TEST(tokenizer_golden_falcon) { golden(t, "falcon", 65024); }

/* ---- metadata ------------------------------------------------------------------ */

TEST(tokenizer_metadata) {
    ak_tokenizer *tk = load_tk(t, "golden/tokenizer/llama-spm.gguf");
    REQUIRE(tk, "llama-spm");
    CHECK(strcmp(ak_tokenizer_model_name(tk), "llama") == 0, "model %s", ak_tokenizer_model_name(tk));
    CHECK(ak_tokenizer_bos(tk) == 1 && ak_tokenizer_eos(tk) == 2 && ak_tokenizer_unk(tk) == 0, "ids");
    CHECK(ak_tokenizer_add_bos(tk) == 1 && ak_tokenizer_add_eos(tk) == 0, "add bos/eos");
    CHECK(ak_tokenizer_add_space_prefix(tk) == 1, "space prefix");
    CHECK(ak_token_is_eog(tk, 2) && !ak_token_is_eog(tk, 1) && !ak_token_is_eog(tk, -5), "eog");
    CHECK(ak_token_type(tk, 1) == AK_TOKEN_CONTROL && ak_token_type(tk, 13) == AK_TOKEN_BYTE, "types");
    CHECK(ak_token_type(tk, 32000) == -1, "type out of range");
    CHECK(ak_token_lookup(tk, "<0x0A>", 6) == 13, "lookup <0x0A> = %d", ak_token_lookup(tk, "<0x0A>", 6));
    CHECK(ak_token_lookup(tk, "no such piece!", 14) == -1, "lookup miss");
    const char *b;
    size_t n;
    CHECK(ak_token_bytes(tk, 13, &b, &n) == 0 && n == 1 && b[0] == '\n', "byte token decodes");
    CHECK(ak_token_bytes(tk, 1, &b, &n) == 0 && n == 0, "control token decodes to nothing");
    CHECK(ak_token_text(tk, 1, &b, &n) == 0 && n == 3 && memcmp(b, "<s>", 3) == 0, "text of <s>");
    int32_t *ids;
    size_t ni;
    REQUIRE(tok(tk, "Hello", 5, AK_TOK_ADD_SPECIAL, &ids, &ni) == 0, "tokenize");
    CHECK(ni >= 2 && ids[0] == 1, "BOS first");
    free(ids);
    ak_tokenizer_free(tk);

    tk = load_tk(t, "golden/tokenizer/gpt-2.gguf");
    REQUIRE(tk, "gpt-2");
    CHECK(strcmp(ak_tokenizer_model_name(tk), "gpt2") == 0, "model");
    CHECK(strcmp(ak_tokenizer_pre_name(tk), "gpt-2") == 0, "pre %s", ak_tokenizer_pre_name(tk));
    CHECK(ak_tokenizer_add_bos(tk) == 0, "gpt2 adds no BOS");
    CHECK(ak_tokenizer_eot(tk) == 50256 && ak_token_is_eog(tk, 50256), "eot %d", ak_tokenizer_eot(tk));
    CHECK(ak_token_lookup(tk, "Hello", 5) == 15496, "Hello = %d", ak_token_lookup(tk, "Hello", 5));
    CHECK(ak_token_bytes(tk, 220, &b, &n) == 0 && n == 1 && b[0] == ' ', "Ġ decodes to a space");
    REQUIRE(tok(tk, "Hello", 5, AK_TOK_ADD_SPECIAL, &ids, &ni) == 0, "tokenize");
    CHECK(ni == 1 && ids[0] == 15496, "no BOS added: %zu", ni);
    free(ids);
    ak_tokenizer_free(tk);

    tk = load_tk(t, "golden/tokenizer/deepseek-llm.gguf");
    REQUIRE(tk, "deepseek");
    CHECK(ak_tokenizer_add_bos(tk) == 1 && ak_tokenizer_bos(tk) == 100000, "deepseek BOS");
    REQUIRE(tok(tk, "Hi", 2, AK_TOK_ADD_SPECIAL, &ids, &ni) == 0, "tokenize");
    CHECK(ni >= 2 && ids[0] == 100000, "BOS added");
    free(ids);
    ak_tokenizer_free(tk);
}

/* ---- special tokens ---------------------------------------------------------------- */

TEST(tokenizer_special_tokens) {
    ak_tokenizer *tk = load_tk(t, "golden/tokenizer/gpt-2.gguf");
    REQUIRE(tk, "gpt-2");
    const char *s = "a<|endoftext|>b";
    int32_t *ids;
    size_t ni;
    REQUIRE(tok(tk, s, strlen(s), AK_TOK_PARSE_SPECIAL, &ids, &ni) == 0, "tokenize");
    CHECK(ni == 3 && ids[1] == 50256, "parsed: %zu ids", ni);
    free(ids);
    REQUIRE(tok(tk, s, strlen(s), 0, &ids, &ni) == 0, "tokenize");
    int has = 0;
    for (size_t i = 0; i < ni; i++) has |= ids[i] == 50256;
    CHECK(ni > 3 && !has, "not parsed without the flag: %zu ids", ni);
    char *back = ak_detokenize(tk, ids, ni, NULL, NULL);
    CHECK(back && strcmp(back, s) == 0, "plain text round trip");
    free(back);
    free(ids);
    ak_tokenizer_free(tk);

    /* SPM: the dummy-prefix space also follows a special token, as in llama.cpp */
    tk = load_tk(t, "golden/tokenizer/llama-spm.gguf");
    REQUIRE(tk, "llama-spm");
    int32_t *a, *b;
    size_t na, nb;
    REQUIRE(tok(tk, "<s>Hello world", 14, AK_TOK_PARSE_SPECIAL, &a, &na) == 0, "tokenize");
    REQUIRE(tok(tk, "Hello world", 11, 0, &b, &nb) == 0, "tokenize");
    CHECK(na == nb + 1 && a[0] == 1 && memcmp(a + 1, b, nb * sizeof *b) == 0, "<s> + prefixed text");
    free(a); free(b);
    ak_tokenizer_free(tk);
}

/* ---- round trips -------------------------------------------------------------------- */

static const char *const fixed_strings[] = {
    "Once upon a time", "Hello, world!", "  two leading spaces", "trailing  ", "tabs\tand\nnewlines\r\n",
    "caf\xC3\xA9 na\xC3\xAFve", "\xE4\xB8\xAD\xE6\x96\x87\xE6\xB5\x8B\xE8\xAF\x95",           /* 中文测试 */
    "\xF0\x9F\xA6\x99 llama \xF0\x9F\x98\x80\xF0\x9F\x9A\x80",                                /* emoji */
    "\xD0\xBF\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82", "x\xE2\x80\x8Dy", "\xEA\xB0\x80\xEB\x82\x98 3.14159 2024",
    "a\xCC\x81 combining", "'s 're 've don't I'LL", "   ", "", "\x01\x02\x7F control bytes",
};

/* Random valid UTF-8 strings over a mix of ASCII, Latin, CJK, Cyrillic and emoji. */
static size_t random_string(ak_rng *r, char *buf) {
    static const char *const atoms[] = { "a", "b", "e", "t", "Z", " ", " ", "  ", "\n", "\t", ".", ",", "!",
        "'", "'s", "0", "7", "42", "-", "(", "\"", "\xC3\xA9", "\xC3\xBC", "\xC3\xB8", "\xE4\xB8\xAD",
        "\xE6\x96\x87", "\xD0\xB4", "\xD1\x8F", "\xF0\x9F\xA6\x99", "\xF0\x9F\x98\x81", "\xE2\x82\xAC",
        "the", "ing", " the", "\xE0\xB8\x81", "\xE2\x80\x8D", "\xC2\xA0" };
    size_t n = 0, k = 1 + ak_rng_u32(r) % 24;
    for (size_t i = 0; i < k; i++) {
        const char *a = atoms[ak_rng_u32(r) % (sizeof atoms / sizeof atoms[0])];
        memcpy(buf + n, a, strlen(a));
        n += strlen(a);
    }
    buf[n] = 0;
    return n;
}

/* decode(tokenize(s)) == prefix + s over fixed and random strings */
static void round_trip(ak_test_ctx *t, const char *rel, const char *prefix) {
    ak_tokenizer *tk = load_tk(t, rel);
    REQUIRE(tk, "%s", rel);
    ak_rng r;
    ak_rng_seed(&r, 1234);
    int n_fixed = (int)(sizeof fixed_strings / sizeof fixed_strings[0]), bad = 0;
    for (int i = 0; i < n_fixed + 300 && bad < 5; i++) {
        char buf[256], want[300];
        size_t n;
        if (i < n_fixed) { n = strlen(fixed_strings[i]); memcpy(buf, fixed_strings[i], n + 1); }
        else n = random_string(&r, buf);
        int32_t *ids;
        size_t ni, nb;
        if (tok(tk, buf, n, 0, &ids, &ni) < 0) { CHECK(0, "%s: tokenize failed", rel); bad++; continue; }
        char *back = ak_detokenize(tk, ids, ni, &nb, NULL);
        /* SPM adds the dummy-prefix space, except to empty text */
        snprintf(want, sizeof want, "%s%s", n ? prefix : "", buf);
        if (!back || nb != strlen(want) || memcmp(back, want, nb) != 0) {
            CHECK(0, "%s: round trip of \"%s\" gave \"%s\"", rel, buf, back ? back : "(null)");
            bad++;
        }
        free(back);
        free(ids);
    }
    ak_tokenizer_free(tk);
}

TEST(tokenizer_roundtrip_spm_llama) { round_trip(t, "golden/tokenizer/llama-spm.gguf", " "); }
TEST(tokenizer_roundtrip_spm_stories) { round_trip(t, "models/stories260K.gguf", " "); }
TEST(tokenizer_roundtrip_spm_tiny_llama) { round_trip(t, "models/tiny-llama-h64-gqa-f32.gguf", " "); }
TEST(tokenizer_roundtrip_bpe_gpt2) { round_trip(t, "golden/tokenizer/gpt-2.gguf", ""); }
TEST(tokenizer_roundtrip_bpe_deepseek) { round_trip(t, "golden/tokenizer/deepseek-llm.gguf", ""); }
TEST(tokenizer_roundtrip_bpe_starcoder) { round_trip(t, "golden/tokenizer/starcoder.gguf", ""); }
TEST(tokenizer_roundtrip_bpe_falcon) { round_trip(t, "golden/tokenizer/falcon.gguf", ""); }
TEST(tokenizer_roundtrip_bpe_qwen2_tiny) { round_trip(t, "models/qwen2-tiny.gguf", ""); }

/* The models' own vocabularies: BOS, then text that decodes to " Once upon a time". */
static void once_upon(ak_test_ctx *t, const char *rel) {
    ak_tokenizer *tk = load_tk(t, rel);
    REQUIRE(tk, "%s", rel);
    const char *s = "Once upon a time";
    int32_t *ids;
    size_t ni, nb;
    REQUIRE(tok(tk, s, strlen(s), AK_TOK_ADD_SPECIAL, &ids, &ni) == 0, "tokenize");
    CHECK(ni >= 2 && ids[0] == ak_tokenizer_bos(tk) && ids[0] == 1, "BOS first (%d)", ni ? ids[0] : -1);
    char *back = ak_detokenize(tk, ids + 1, ni - 1, &nb, NULL);
    CHECK(back && strcmp(back, " Once upon a time") == 0, "decoded \"%s\"", back ? back : "");
    /* plain ASCII words need no byte fallback in these vocabularies */
    for (size_t i = 1; i < ni; i++) CHECK(ak_token_type(tk, ids[i]) == AK_TOKEN_NORMAL, "token %d", ids[i]);
    free(back);
    free(ids);
    ak_tokenizer_free(tk);
}

TEST(tokenizer_spm_once_upon_stories) { once_upon(t, "models/stories260K.gguf"); }
TEST(tokenizer_spm_once_upon_tiny_llama) { once_upon(t, "models/tiny-llama-h64-gqa-f32.gguf"); }

/* ---- streaming decoder ------------------------------------------------------------ */

TEST(tokenizer_detok_stream) {
    ak_tokenizer *tk = load_tk(t, "models/stories260K.gguf");
    REQUIRE(tk, "stories260K");
    const char *llama = "\xF0\x9F\xA6\x99";   /* U+1F999, 4 bytes, surely not in a 512-token vocab */
    int32_t *ids;
    size_t ni;
    REQUIRE(tok(tk, llama, 4, 0, &ids, &ni) == 0, "tokenize");
    /* "▁" then the 4 byte-fallback tokens */
    REQUIRE(ni == 5, "%zu tokens", ni);
    for (size_t i = 1; i < 5; i++) CHECK(ak_token_type(tk, ids[i]) == AK_TOKEN_BYTE, "byte token %zu", i);
    ak_detok d;
    ak_detok_init(&d);
    char out[4096];
    size_t n, total = 0;
    char all[64];
    for (size_t i = 0; i < ni; i++) {
        REQUIRE(ak_detok_push(&d, tk, ids[i], out, sizeof out, &n) == 0, "push");
        if (i == 0) CHECK(n == 1 && out[0] == ' ', "the space comes at once");
        else if (i < 4) CHECK(n == 0, "partial character held back after token %zu (%zu bytes)", i, n);
        else CHECK(n == 4 && memcmp(out, llama, 4) == 0, "the emoji comes whole with its last byte");
        memcpy(all + total, out, n);
        total += n;
    }
    CHECK(ak_detok_flush(&d, out, sizeof out) == 0, "nothing left");
    CHECK(total == 5 && memcmp(all, " \xF0\x9F\xA6\x99", 5) == 0, "stream == text");
    free(ids);

    /* invalid bytes become U+FFFD */
    int32_t xff = ak_token_lookup(tk, "<0xFF>", 6), xf0 = ak_token_lookup(tk, "<0xF0>", 6);
    int32_t x9f = ak_token_lookup(tk, "<0x9F>", 6), a = ak_token_lookup(tk, "<0x41>", 6);
    REQUIRE(xff >= 0 && xf0 >= 0 && x9f >= 0 && a >= 0, "byte tokens");
    ak_detok_init(&d);
    REQUIRE(ak_detok_push(&d, tk, xff, out, sizeof out, &n) == 0, "push");
    CHECK(n == 3 && memcmp(out, "\xEF\xBF\xBD", 3) == 0, "0xFF -> U+FFFD");
    REQUIRE(ak_detok_push(&d, tk, xf0, out, sizeof out, &n) == 0 && n == 0, "lead byte held");
    REQUIRE(ak_detok_push(&d, tk, x9f, out, sizeof out, &n) == 0 && n == 0, "continuation held");
    REQUIRE(ak_detok_push(&d, tk, a, out, sizeof out, &n) == 0, "push");
    CHECK(n == 4 && memcmp(out, "\xEF\xBF\xBD" "A", 4) == 0, "cut-short sequence -> U+FFFD then A (%zu)", n);
    REQUIRE(ak_detok_push(&d, tk, xf0, out, sizeof out, &n) == 0 && n == 0, "lead byte held");
    CHECK(ak_detok_flush(&d, out, sizeof out) == 3 && memcmp(out, "\xEF\xBF\xBD", 3) == 0, "flush -> U+FFFD");
    CHECK(ak_detok_flush(&d, out, sizeof out) == 0, "flush resets");
    /* errors leave the state alone */
    CHECK(ak_detok_push(&d, tk, 512, out, sizeof out, &n) == -1 && n == 0, "id out of range");
    CHECK(ak_detok_push(&d, tk, -1, out, sizeof out, &n) == -1, "negative id");
    CHECK(ak_detok_push(&d, tk, a, out, 2, &n) == -1, "cap too small");
    CHECK(ak_detok_bound(tk) >= 3 * (ak_tokenizer_max_piece(tk) + 3), "bound");
    ak_tokenizer_free(tk);

    /* BPE: an emoji split over byte-level tokens streams the same way */
    tk = load_tk(t, "golden/tokenizer/gpt-2.gguf");
    REQUIRE(tk, "gpt-2");
    const char *s = "hi \xF0\x9F\xA6\x99\xF0\x9F\x98\x81!";
    REQUIRE(tok(tk, s, strlen(s), 0, &ids, &ni) == 0, "tokenize");
    ak_detok_init(&d);
    total = 0;
    for (size_t i = 0; i < ni; i++) {
        REQUIRE(ak_detok_push(&d, tk, ids[i], out, sizeof out, &n) == 0, "push");
        for (size_t j = 0; j < n; j++) CHECK(j + 1 < n || (out[j] & 0xC0) != 0xC0, "ends mid-character");
        memcpy(all + total, out, n);
        total += n;
    }
    total += ak_detok_flush(&d, all + total, sizeof all - total);
    CHECK(total == strlen(s) && memcmp(all, s, total) == 0, "stream == text (%zu tokens)", ni);
    CHECK(ni > 4, "the emoji were split over several tokens (%zu)", ni);
    free(ids);
    ak_tokenizer_free(tk);
}

/* ---- bad input ---------------------------------------------------------------------
 * Small GGUF images built by hand (metadata only). */

typedef struct { uint8_t b[4096]; size_t n; } gbuf;

static void put(gbuf *g, const void *p, size_t n) { memcpy(g->b + g->n, p, n); g->n += n; }
static void put_u32(gbuf *g, uint32_t v) { put(g, &v, 4); }
static void put_u64(gbuf *g, uint64_t v) { put(g, &v, 8); }
static void put_str(gbuf *g, const char *s) { put_u64(g, strlen(s)); put(g, s, strlen(s)); }
static void kv_str(gbuf *g, const char *k, const char *v) { put_str(g, k); put_u32(g, GGUF_TYPE_STRING); put_str(g, v); }
static void kv_u32(gbuf *g, const char *k, uint32_t v) { put_str(g, k); put_u32(g, GGUF_TYPE_UINT32); put_u32(g, v); }
static void kv_strs(gbuf *g, const char *k, const char *const *v, int n) {
    put_str(g, k); put_u32(g, GGUF_TYPE_ARRAY); put_u32(g, GGUF_TYPE_STRING); put_u64(g, (uint64_t)n);
    for (int i = 0; i < n; i++) put_str(g, v[i]);
}
static void kv_f32s(gbuf *g, const char *k, int n) {
    put_str(g, k); put_u32(g, GGUF_TYPE_ARRAY); put_u32(g, GGUF_TYPE_FLOAT32); put_u64(g, (uint64_t)n);
    for (int i = 0; i < n; i++) { float f = -(float)i; put(g, &f, 4); }
}

static const char *const tiny_vocab[] = { "<unk>", "<s>", "</s>", "\342\226\201a", "a", "b", "<0x62>" };   /* "▁a" */

/* kind: 0 valid, 1 bos out of range, 2 unknown model, 3 scores too short,
 * 4 tokens not strings, 5 unknown pre-tokenizer, 6 no merges for gpt2 */
static ak_tokenizer *tiny(ak_test_ctx *t, int kind, ak_error *err) {
    gbuf g = { .n = 0 };
    int nkv = kind == 5 || kind == 6 ? 3 : 4;
    put_u32(&g, GGUF_MAGIC); put_u32(&g, 3); put_u64(&g, 0); put_u64(&g, (uint64_t)nkv);
    kv_str(&g, "tokenizer.ggml.model", kind == 2 ? "wordpiece-ish" : kind >= 5 ? "gpt2" : "llama");
    if (kind == 4) kv_u32(&g, "tokenizer.ggml.tokens", 7);
    else kv_strs(&g, "tokenizer.ggml.tokens", tiny_vocab, 7);
    if (kind == 5) { kv_str(&g, "tokenizer.ggml.pre", "no-such-pre"); }
    else if (kind == 6) { kv_str(&g, "tokenizer.ggml.pre", "gpt-2"); }
    else {
        kv_f32s(&g, "tokenizer.ggml.scores", kind == 3 ? 6 : 7);
        kv_u32(&g, "tokenizer.ggml.bos_token_id", kind == 1 ? 7 : 1);
    }
    gguf_file f;
    if (gguf_open_buffer(&f, g.b, g.n, "tiny.gguf", err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "gguf_open_buffer: %s", err->msg);
        return NULL;
    }
    ak_tokenizer *tk = ak_tokenizer_load(&f, err);
    gguf_close(&f);
    return tk;
}

TEST(tokenizer_bad_input) {
    ak_error err = {0};
    ak_tokenizer *tk = tiny(t, 0, &err);
    REQUIRE(tk, "valid tiny vocab: %s", err.msg);
    int32_t *ids;
    size_t ni;
    REQUIRE(tok(tk, "ab", 2, AK_TOK_ADD_SPECIAL, &ids, &ni) == 0, "tokenize");
    /* BOS, "▁a" (a token), "b" */
    CHECK(ni == 3 && ids[0] == 1 && ids[1] == 3 && ids[2] == 5, "tiny: %zu ids", ni);
    free(ids);
    /* bytes with no <0xNN> token fall back to <unk>: "▁" (3 bytes) and "c" */
    REQUIRE(tok(tk, "c", 1, 0, &ids, &ni) == 0, "tokenize");
    CHECK(ni == 4 && ids[0] == 0 && ids[1] == 0 && ids[2] == 0 && ids[3] == 0, "unknown bytes -> <unk> (%zu)", ni);
    free(ids);
    const char *b;
    size_t n;
    CHECK(ak_token_bytes(tk, 7, &b, &n) == -1 && n == 0, "decode id out of range");
    CHECK(ak_token_bytes(tk, -1, &b, &n) == -1, "decode negative id");
    CHECK(ak_token_text(tk, 99, &b, &n) == -1, "text id out of range");
    int32_t bad[] = { 3, 7 };
    err.msg[0] = 0;
    CHECK(ak_detokenize(tk, bad, 2, NULL, &err) == NULL && strstr(err.msg, "out of range"), "detokenize: %s", err.msg);
    CHECK(ak_tokenize(tk, NULL, 3, 0, &ids, &ni, &err) == -1 && ids == NULL && ni == 0, "NULL text");
    ak_tokenizer_free(tk);

    static const char *const want[] = { "", "bos_token_id", "unsupported tokenizer model", "scores",
                                        "tokenizer.ggml.tokens", "unknown pre-tokenizer", "merges" };
    for (int k = 1; k <= 6; k++) {
        err.msg[0] = 0;
        tk = tiny(t, k, &err);
        CHECK(tk == NULL, "case %d loaded", k);
        CHECK(strstr(err.msg, want[k]) != NULL, "case %d: error \"%s\" should mention %s", k, err.msg, want[k]);
        ak_tokenizer_free(tk);
    }

    /* invalid UTF-8 and NUL bytes: BPE turns bad bytes into U+FFFD, never fails */
    tk = load_tk(t, "golden/tokenizer/gpt-2.gguf");
    REQUIRE(tk, "gpt-2");
    const char junk[] = "a\xFF\xC3(\xE2\x82\x00z\xF0\x9F\x98\xED\xA0\x80";
    REQUIRE(tok(tk, junk, sizeof junk - 1, AK_TOK_PARSE_SPECIAL, &ids, &ni) == 0, "tokenize junk");
    char *back = ak_detokenize(tk, ids, ni, &n, NULL);
    CHECK(back && n > 0 && memchr(back, 0, n) != NULL, "NUL byte kept");
    free(back);
    free(ids);
    ak_tokenizer_free(tk);
    tk = load_tk(t, "golden/tokenizer/llama-spm.gguf");
    REQUIRE(tk, "llama-spm");
    REQUIRE(tok(tk, junk, sizeof junk - 1, 0, &ids, &ni) == 0, "tokenize junk");
    back = ak_detokenize(tk, ids, ni, &n, NULL);
    CHECK(back && n == sizeof junk && memcmp(back + 1, junk, n - 1) == 0, "SPM keeps every byte");
    free(back);
    free(ids);
    ak_tokenizer_free(tk);
}

/* llama3-style BPE: a word that is a token is taken whole (ignore_merges), and
 * BOS is added by default; gpt-2 style merges it pair by pair. */
static ak_tokenizer *tiny_bpe(ak_test_ctx *t, const char *pre) {
    static const char *const vocab[] = { "a", "b", "c", "ab", "abc", "<|begin_of_text|>", "\xC4\xA0" };
    static const char *const merges[] = { "a b" };
    gbuf g = { .n = 0 };
    put_u32(&g, GGUF_MAGIC); put_u32(&g, 3); put_u64(&g, 0); put_u64(&g, 5);
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", pre);
    kv_strs(&g, "tokenizer.ggml.tokens", vocab, 7);
    kv_strs(&g, "tokenizer.ggml.merges", merges, 1);
    kv_u32(&g, "tokenizer.ggml.bos_token_id", 5);
    gguf_file f;
    ak_error err = {0};
    if (gguf_open_buffer(&f, g.b, g.n, "tiny-bpe.gguf", &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "gguf_open_buffer: %s", err.msg);
        return NULL;
    }
    ak_tokenizer *tk = ak_tokenizer_load(&f, &err);
    gguf_close(&f);
    if (!tk) ak_test_fail(t, __FILE__, __LINE__, "%s", err.msg);
    return tk;
}

TEST(tokenizer_bpe_llama3_rules) {
    int32_t *ids;
    size_t ni;
    ak_tokenizer *tk = tiny_bpe(t, "llama-bpe");
    REQUIRE(tk, "llama-bpe");
    CHECK(ak_tokenizer_add_bos(tk) == 1, "llama3 adds BOS by default");
    REQUIRE(tok(tk, "abc", 3, AK_TOK_ADD_SPECIAL, &ids, &ni) == 0, "tokenize");
    CHECK(ni == 2 && ids[0] == 5 && ids[1] == 4, "BOS + whole word: %zu ids", ni);
    free(ids);
    /* " c": "Ġ" and "c" do not merge; a word that is not a token goes through BPE */
    REQUIRE(tok(tk, "ab c", 4, 0, &ids, &ni) == 0, "tokenize");
    CHECK(ni == 3 && ids[0] == 3 && ids[1] == 6 && ids[2] == 2, "ab, Ġ, c: %zu ids", ni);
    free(ids);
    ak_tokenizer_free(tk);

    tk = tiny_bpe(t, "gpt-2");
    REQUIRE(tk, "gpt-2");
    CHECK(ak_tokenizer_add_bos(tk) == 0, "gpt-2 adds no BOS");
    REQUIRE(tok(tk, "abc", 3, AK_TOK_ADD_SPECIAL, &ids, &ni) == 0, "tokenize");
    CHECK(ni == 2 && ids[0] == 3 && ids[1] == 2, "merged pair by pair: %zu ids", ni);
    free(ids);
    ak_tokenizer_free(tk);
}

/* ---- speed ---------------------------------------------------------------------------- */

static void speed(ak_test_ctx *t, const char *rel, double limit) {
    char path[1024];
    ak_error err = {0};
    size_t len;
    char *text = ak_read_file(test_path(path, sizeof path, "golden/tiny-llama-h64/val.txt"), &len, &err);
    REQUIRE(text, "%s", err.msg);
    ak_tokenizer *tk = load_tk(t, rel);
    if (!tk) { free(text); return; }
    int32_t *ids;
    size_t ni;
    double t0 = ak_now();
    int rc = tok(tk, text, len, AK_TOK_ADD_SPECIAL, &ids, &ni);
    double dt = ak_now() - t0;
    CHECK(rc == 0, "tokenize");
    if (rc == 0) {
        printf("     %s: val.txt %zu bytes -> %zu tokens in %.1f ms (%.1f MB/s)\n", rel, len, ni, dt * 1e3,
               len / dt / 1e6);
        CHECK(dt < limit, "%.3f s for %zu bytes", dt, len);
        char *back = ak_detokenize(tk, ids, ni, NULL, NULL);
        const char *p = back;
        if (p && *p == ' ' && ak_tokenizer_add_space_prefix(tk)) p++;   /* dummy prefix */
        CHECK(p && strcmp(p, text) == 0, "val.txt round trip");
        free(back);
        free(ids);
    }
    ak_tokenizer_free(tk);
    free(text);
}

TEST(tokenizer_speed_spm) { speed(t, "models/tiny-llama-h64-gqa-f32.gguf", 1.0); }
TEST(tokenizer_speed_bpe) { speed(t, "golden/tokenizer/gpt-2.gguf", 1.0); }
TEST(tokenizer_speed_bpe_many_specials) { speed(t, "golden/tokenizer/deepseek-llm.gguf", 1.0); }
