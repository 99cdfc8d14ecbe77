/* test_lib.c - the public C API (include/agentkv.h) as a program embedding
 * it sees it: in process (the test binary links the library), and from
 * outside: the shared library's exported symbols against the header's
 * function list, and `make install` into a temporary DESTDIR with
 * examples/embed.c built by pkg-config and run twice (the second run
 * warm). References: the golden greedy continuation, the header itself,
 * the documented KV format sizes and template markup, the store's own
 * index read by the installed binary, the keys Redis holds. */
#include <agentkv.h>
#include <cjson/cJSON.h>
#include <libgen.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/util.h"
#include "test.h"
#include "test_store_redis.h"

/* Runs cmd through sh (stdin /dev/null, stdout and stderr into *out, never
 * NULL); returns its exit status (128 + signal, 124 past timeout_s). */
static int sh(const char *cmd, int timeout_s, char **out) {
    static int seq;
    char path[512], full[16384];
    snprintf(path, sizeof path, "%s/lib-sh-%d-%d.out", test_tmp_dir(), (int)getpid(), seq++);
    snprintf(full, sizeof full, "timeout -k 5 %d sh -c '%s' >%s 2>&1 </dev/null", timeout_s, cmd, path);
    int st = system(full);
    *out = ak_read_file(path, NULL, NULL);
    if (!*out) *out = calloc(1, 1);
    unlink(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The build directory: AK_BIN's (make test sets it), else build. */
static const char *build_dir(char *buf, size_t n) {
    const char *bin = getenv("AK_BIN");
    snprintf(buf, n, "%s", bin && *bin ? bin : "build/agentkv");
    return dirname(buf);
}

/* The function names include/agentkv.h declares with AGENTKV_API, sorted,
 * one per line, into a malloc'd string (NULL if the header is missing). */
static char *header_functions(int *count) {
    char *h = ak_read_file("include/agentkv.h", NULL, NULL);
    if (!h) return NULL;
    char *names[256];
    int n = 0;
    for (char *p = h; (p = strstr(p, "AGENTKV_API ")) && n < 256; p++) {
        if (p > h && p[-1] == ' ') continue;   /* "#define AGENTKV_API ..." */
        char *paren = strchr(p, '(');
        if (!paren) break;
        char *e = paren;
        while (e > p && e[-1] == ' ') e--;
        char *b = e;
        while (b > p && (b[-1] == '_' || (b[-1] >= 'a' && b[-1] <= 'z') || (b[-1] >= '0' && b[-1] <= '9'))) b--;
        names[n++] = strndup(b, (size_t)(e - b));
    }
    free(h);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char *x = names[j];
            names[j] = names[j - 1];
            names[j - 1] = x;
        }
    size_t len = 1;
    for (int i = 0; i < n; i++) len += strlen(names[i]) + 1;
    char *out = calloc(1, len);
    for (int i = 0; i < n; i++) {
        strcat(out, names[i]);
        strcat(out, "\n");
        free(names[i]);
    }
    *count = n;
    return out;
}

TEST(lib_exports_only_the_header) {
    int n = 0;
    char *want = header_functions(&n);
    REQUIRE(want && n >= 30, "include/agentkv.h: %d functions found", n);
    REQUIRE(!strncmp(want, "agentkv_", 8), "the first name does not start with agentkv_: %s", want);
    char bd[512], cmd[1024], *out;
    build_dir(bd, sizeof bd);
    snprintf(cmd, sizeof cmd, "test -f %s/libagentkv.so", bd);
    char *ignore;
    int missing = sh(cmd, 10, &ignore);
    free(ignore);
    if (missing) {
        free(want);
        SKIP("no %s/libagentkv.so (make lib builds it; make test does)", bd);
    }
    /* every defined dynamic symbol but the linker's own _init and _fini */
    snprintf(cmd, sizeof cmd,
             "nm -D --defined-only %s/libagentkv.so | awk \"{print \\$3}\" | grep -v -x -e _init -e _fini | sort",
             bd);
    CHECK(sh(cmd, 30, &out) == 0 && !strcmp(out, want), "exported symbols differ from the header's:\n%s\nheader:\n%s",
          out, want);
    free(out);
    /* the installable archive: its global definitions are the same list */
    snprintf(cmd, sizeof cmd, "nm -g --defined-only %s/pub/libagentkv.a | awk \"NF == 3 {print \\$3}\" | sort", bd);
    CHECK(sh(cmd, 30, &out) == 0 && !strcmp(out, want), "libagentkv.a's globals differ from the header's:\n%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "readelf -d %s/libagentkv.so", bd);
    char soname[64];
    snprintf(soname, sizeof soname, "[libagentkv.so.%d]", AGENTKV_VERSION_MAJOR);
    CHECK(sh(cmd, 10, &out) == 0 && strstr(out, "(SONAME)") && strstr(out, soname), "no SONAME %s: %s", soname, out);
    free(out);
    /* a dispatched build: the library carries every level's kernels */
    snprintf(cmd, sizeof cmd, "test -f %s/pic/dsp/stubs.o", bd);
    if (sh(cmd, 10, &out) == 0) {
        free(out);
        snprintf(cmd, sizeof cmd, "nm %s/libagentkv.so | grep -c -e \"__avx2$\" -e \"__avx512$\" -e \"__scalar$\"", bd);
        CHECK(sh(cmd, 30, &out) == 0 && atoi(out) > 10, "the dispatched kernels are not in the library: %s", out);
    }
    free(out);
    free(want);
}

typedef struct {
    int calls, cancel_after;
    char text[4096];
    size_t len;
} sink;

static int collect(void *ud, int32_t token, const char *piece, size_t len) {
    sink *s = ud;
    if (s->len + len < sizeof s->text) {
        memcpy(s->text + s->len, piece, len);
        s->len += len;
    }
    return token >= 0 && ++s->calls == s->cancel_after;
}

static agentkv_model *load_as(ak_test_ctx *t, const char *rel, const char *chat_template) {
    char path[512];
    agentkv_model *m = NULL;
    agentkv_error err = {0};
    agentkv_status st = agentkv_model_load(test_path(path, sizeof path, rel),
                                           &(agentkv_model_options){.chat_template = chat_template}, &m, &err);
    CHECK(st == AGENTKV_OK, "load %s: %s", rel, agentkv_error_message(&err));
    return m;
}

static agentkv_model *load(ak_test_ctx *t, const char *rel) { return load_as(t, rel, NULL); }

TEST(lib_turn_matches_golden_and_cancels) {
    cJSON *g = test_first_golden("golden/stories260K/greedy.jsonl");
    REQUIRE(g, "no golden file");
    const char *prompt = cJSON_GetObjectItem(g, "prompt")->valuestring;
    const char *cont = cJSON_GetObjectItem(g, "continuation")->valuestring;
    int n_predict = cJSON_GetObjectItem(g, "n_predict")->valueint;
    agentkv_model *m = load(t, "models/stories260K.gguf");
    agentkv_store *s = NULL;
    agentkv_agent *a = NULL;
    agentkv_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    agentkv_model_info mi;
    REQUIRE(m && agentkv_model_get_info(m, &mi) == AGENTKV_OK, "info");
    CHECK(!strcmp(mi.arch, "llama") && mi.vocab == 512 && mi.n_layer == 5 && mi.dim == 64 && mi.n_head_kv == 4,
          "info: %s vocab %d layers %d dim %d kv heads %d", mi.arch, mi.vocab, mi.n_layer, mi.dim, mi.n_head_kv);
    REQUIRE(agentkv_tokenize(m, prompt, strlen(prompt), AGENTKV_TOKENIZE_ADD_SPECIAL, &ids, &n, &err) == AGENTKV_OK &&
                n > 1 && ids[0] == mi.bos,
            "tokenize: %s", agentkv_error_message(&err));
    REQUIRE(agentkv_store_open(m, NULL, &s, &err) == AGENTKV_OK && agentkv_agent_get(s, "greedy", &a, &err) == AGENTKV_OK,
            "open: %s", agentkv_error_message(&err));
    sink k = {0};
    agentkv_turn_result r;
    agentkv_turn_options o = {.tokens = ids, .n_tokens = n, .max_tokens = n_predict, .on_token = collect, .ud = &k};
    REQUIRE(agentkv_agent_turn(a, &o, &r, &err) == AGENTKV_OK, "turn: %s", agentkv_error_message(&err));
    CHECK(!strcmp(r.text, cont) && k.len == strlen(cont) && !memcmp(k.text, cont, k.len),
          "greedy text \"%s\" (streamed \"%.*s\") != golden \"%s\"", r.text, (int)k.len, k.text, cont);
    CHECK(r.generated == n_predict && r.finish == AGENTKV_FINISH_LENGTH && r.tier == AGENTKV_TIER_COLD &&
              r.prompt_tokens == (int)n && r.prefilled == (int)n && !strcmp(r.match, "new"),
          "generated %d finish %d tier %d prompt %d prefilled %d match %s", r.generated, r.finish, r.tier,
          r.prompt_tokens, r.prefilled, r.match);
    agentkv_free(r.text);
    /* the same prompt in another agent, cancelled after 3 tokens: its text
     * is the golden's first 3 tokens' */
    agentkv_agent *b = NULL;
    sink c = {.cancel_after = 3};
    o.ud = &c;
    REQUIRE(agentkv_agent_get(s, "cancelled", &b, &err) == AGENTKV_OK, "get");
    CHECK(agentkv_agent_turn(b, &o, &r, &err) == AGENTKV_OK && r.finish == AGENTKV_FINISH_CANCELLED && r.generated == 3 &&
              c.calls == 3 && !strncmp(cont, r.text, r.text_len) && r.text_len > 0,
          "cancel: finish %d generated %d calls %d text \"%s\"", r.finish, r.generated, c.calls, r.text);
    agentkv_free(r.text);
    /* its cache holds the prompt and the tokens fed back: the 3rd was not */
    int32_t *h = NULL;
    size_t nh = 0;
    CHECK(agentkv_agent_tokens(b, &h, &nh, &err) == AGENTKV_OK && nh == n + 2 && !memcmp(h, ids, n * sizeof *ids),
          "history %zu tokens, want %zu", nh, n + 2);
    agentkv_free(h);
    agentkv_agent_release(b);
    agentkv_agent_release(a);
    CHECK(agentkv_store_close(s, &err) == AGENTKV_OK, "close: %s", agentkv_error_message(&err));
    agentkv_free(ids);
    agentkv_model_free(m);
    cJSON_Delete(g);
}

/* A turn of agent a on tokens[0..n) generating max tokens (greedy). */
static agentkv_status turn_of(agentkv_agent *a, const int32_t *tokens, size_t n, int max, agentkv_turn_result *r,
                              agentkv_error *err) {
    return agentkv_agent_turn(a, &(agentkv_turn_options){.tokens = tokens, .n_tokens = n, .max_tokens = max}, r, err);
}

TEST(lib_store_restart_save_evict_delete) {
    agentkv_model *m = load(t, "models/stories260K.gguf");
    REQUIRE(m, "model");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/lib-store", test_tmp_dir());
    agentkv_store_options so = {.dir = dir, .cache_type_k = "q8", .cache_type_v = "tq3",
                                .save = AGENTKV_SAVE_ON_SHUTDOWN};
    agentkv_store *s = NULL;
    agentkv_agent *a = NULL;
    agentkv_error err = {0};
    REQUIRE(agentkv_store_open(m, &so, &s, &err) == AGENTKV_OK && agentkv_agent_get(s, "ada", &a, &err) == AGENTKV_OK,
            "open: %s", agentkv_error_message(&err));
    int32_t *p1 = NULL, *more = NULL;
    size_t n1 = 0, nm = 0;
    const char *t1 = "Once upon a time", *t2 = " there was a dog";
    REQUIRE(!agentkv_tokenize(m, t1, strlen(t1), AGENTKV_TOKENIZE_ADD_SPECIAL, &p1, &n1, &err) &&
                !agentkv_tokenize(m, t2, strlen(t2), 0, &more, &nm, &err),
            "tokenize");
    agentkv_turn_result r;
    REQUIRE(turn_of(a, p1, n1, 8, &r, &err) == AGENTKV_OK, "turn 1: %s", agentkv_error_message(&err));
    agentkv_free(r.text);
    agentkv_agent_info in;
    char file[700];
    snprintf(file, sizeof file, "%s/ada.safetensors", dir);
    CHECK(agentkv_agent_get_info(a, &in, &err) == AGENTKV_OK && in.tier == AGENTKV_TIER_HOT && in.unsaved &&
              in.n_tokens == (int)n1 + 7 && access(file, F_OK) != 0,
          "before save: tier %d unsaved %d tokens %d", in.tier, in.unsaved, in.n_tokens);
    CHECK(agentkv_agent_save(a, &err) == AGENTKV_OK && access(file, F_OK) == 0, "save: %s", agentkv_error_message(&err));
    CHECK(agentkv_agent_get_info(a, &in, &err) == AGENTKV_OK && !in.unsaved, "still unsaved after save");
    CHECK(agentkv_agent_evict(a, &err) == AGENTKV_OK && agentkv_agent_get_info(a, &in, &err) == AGENTKV_OK &&
              in.tier == AGENTKV_TIER_WARM && in.n_tokens == (int)n1 + 7,
          "evict: tier %d tokens %d", in.tier, in.n_tokens);
    /* the whole history back, then the store closed and opened again */
    int32_t *h = NULL;
    size_t nh = 0;
    REQUIRE(agentkv_agent_tokens(a, &h, &nh, &err) == AGENTKV_OK && nh == n1 + 7, "history %zu", nh);
    agentkv_agent_release(a);
    REQUIRE(agentkv_store_close(s, &err) == AGENTKV_OK, "close: %s", agentkv_error_message(&err));
    REQUIRE(agentkv_store_open(m, &so, &s, &err) == AGENTKV_OK && agentkv_agent_get(s, "ada", &a, &err) == AGENTKV_OK,
            "reopen: %s", agentkv_error_message(&err));
    int32_t *p2 = malloc((nh + nm) * sizeof *p2);
    memcpy(p2, h, nh * sizeof *h);
    memcpy(p2 + nh, more, nm * sizeof *more);
    agentkv_turn_result w;
    REQUIRE(turn_of(a, p2, nh + nm, 6, &w, &err) == AGENTKV_OK, "warm turn: %s", agentkv_error_message(&err));
    CHECK(w.tier == AGENTKV_TIER_WARM && w.reused == (int)nh && w.prefilled == (int)nm && !strcmp(w.match, "extend"),
          "warm: tier %d reused %d (held %zu) prefilled %d (new %zu) %s", w.tier, w.reused, nh, w.prefilled, nm, w.match);
    /* the reference: the same prompt computed from nothing in RAM */
    agentkv_store *ram = NULL;
    agentkv_agent *c = NULL;
    agentkv_turn_result cold;
    REQUIRE(agentkv_store_open(m, &(agentkv_store_options){.cache_type_k = "q8", .cache_type_v = "tq3"}, &ram, &err) ==
                    AGENTKV_OK &&
                agentkv_agent_get(ram, "ref", &c, &err) == AGENTKV_OK && turn_of(c, p2, nh + nm, 6, &cold, &err) == 0,
            "reference: %s", agentkv_error_message(&err));
    CHECK(cold.tier == AGENTKV_TIER_COLD && cold.prefilled == (int)(nh + nm) && !strcmp(cold.text, w.text),
          "restored \"%s\" != computed \"%s\"", w.text, cold.text);
    agentkv_agent_info *list = NULL;
    int nl = 0;
    CHECK(agentkv_store_list_agents(s, &list, &nl, &err) == AGENTKV_OK && nl == 1 && !strcmp(list[0].id, "ada"),
          "list: %d agents", nl);
    agentkv_free(list);
    CHECK(agentkv_agent_delete(a, &err) == AGENTKV_OK && access(file, F_OK) != 0, "delete: %s",
          agentkv_error_message(&err));
    CHECK(agentkv_agent_delete(a, &err) == AGENTKV_ERR_NOT_FOUND && err.code == AGENTKV_ERR_NOT_FOUND,
          "second delete: %d", err.code);
    agentkv_free(w.text);
    agentkv_free(cold.text);
    agentkv_agent_release(c);
    agentkv_agent_release(a);
    agentkv_store_close(ram, NULL);
    agentkv_store_close(s, NULL);
    free(p2);
    agentkv_free(h);
    agentkv_free(p1);
    agentkv_free(more);
    agentkv_model_free(m);
}

TEST(lib_errors_formats_version) {
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", AGENTKV_VERSION_MAJOR, AGENTKV_VERSION_MINOR, AGENTKV_VERSION_PATCH);
    CHECK(!strcmp(agentkv_version(), v) && !strcmp(AGENTKV_VERSION, v), "version %s, header %s", agentkv_version(), v);
    agentkv_error err = {0};
    agentkv_model *m = NULL;
    CHECK(agentkv_model_load("/nonexistent/x.gguf", NULL, &m, &err) == AGENTKV_ERR_NOT_FOUND && !m &&
              strstr(agentkv_error_message(&err), "/nonexistent/x.gguf"),
          "missing model: %d %s", err.code, err.message);
    CHECK(!strcmp(agentkv_status_name(AGENTKV_ERR_KV_BUDGET), "kv-budget") &&
              !strcmp(agentkv_status_name(AGENTKV_ERR_EXISTS), "exists") && !strcmp(agentkv_status_name(99), "unknown"),
          "status names");
    agentkv_error empty = {.code = AGENTKV_ERR_BUSY};
    CHECK(!strcmp(agentkv_error_message(&empty), "busy") && !strcmp(agentkv_error_message(NULL), ""), "messages");
    /* the formats by name, as docs/kv-formats.md lists them and sizes them */
    const char *names[] = {"f32", "f16", "bf16", "q8", "q4", "q2", "tq4", "tq3", "tq2", "tcq3"};
    CHECK(agentkv_kv_format_count() == 10 && !agentkv_kv_format_name(10), "%d formats", agentkv_kv_format_count());
    for (int i = 0; i < 10; i++)
        CHECK(agentkv_kv_format_name(i) && !strcmp(agentkv_kv_format_name(i), names[i]), "format %d", i);
    double b = 0;
    CHECK(agentkv_kv_format_bits("q8", 64, &b) == AGENTKV_OK && fabs(b - 8.5) < 1e-9, "q8: %g bits", b);
    CHECK(agentkv_kv_format_bits("tq3", 128, &b) == AGENTKV_OK && fabs(b - 3.125) < 1e-9, "tq3 d128: %g bits", b);
    CHECK(agentkv_kv_format_bits("q9", 64, &b) == AGENTKV_ERR_INVALID, "q9 accepted");
    m = load(t, "models/stories260K.gguf");
    REQUIRE(m, "model");
    agentkv_store *s = NULL;
    agentkv_agent *a = NULL;
    CHECK(agentkv_store_open(m, &(agentkv_store_options){.cache_type_k = "q5"}, &s, &err) == AGENTKV_ERR_INVALID &&
              strstr(err.message, "q5") && !s,
          "unknown format: %d %s", err.code, err.message);
    CHECK(agentkv_store_open(m, &(agentkv_store_options){.n_ctx = 1 << 20}, &s, &err) == AGENTKV_ERR_INVALID &&
              strstr(err.message, "longer than the model"),
          "context: %d %s", err.code, err.message);
    REQUIRE(agentkv_store_open(m, &(agentkv_store_options){.kv_budget = 1024}, &s, &err) == AGENTKV_OK, "open");
    CHECK(agentkv_agent_get(s, "../up", &a, &err) == AGENTKV_ERR_INVALID && !a, "a hostile id was accepted");
    REQUIRE(agentkv_agent_get(s, "small", &a, &err) == AGENTKV_OK, "get");
    int32_t tok[4] = {1, 100, 101, 102};
    agentkv_message msg = {.role = "user", .content = "hi"};
    CHECK(agentkv_agent_turn(a, &(agentkv_turn_options){.tokens = tok, .n_tokens = 4, .messages = &msg, .n_messages = 1},
                             NULL, &err) == AGENTKV_ERR_INVALID,
          "both prompts accepted");
    CHECK(agentkv_agent_turn(a, &(agentkv_turn_options){0}, NULL, &err) == AGENTKV_ERR_INVALID, "no prompt accepted");
    CHECK(agentkv_agent_turn(a, &(agentkv_turn_options){.tokens = tok, .n_tokens = 4, .max_tokens = 2}, NULL, &err) ==
                  AGENTKV_ERR_KV_BUDGET &&
              strstr(err.message, "KV budget"),
          "1 KiB budget: %d %s", err.code, err.message);
    agentkv_agent_release(a);
    agentkv_store_close(s, NULL);
    agentkv_model_free(m);
}

/* Chat: the qwen3 family (qwen3-tiny has no template of its own: asked for
 * by name) renders its markup, and a conversation resent with the agent's
 * own reply reuses all it held. */
TEST(lib_chat_render_and_resend) {
    agentkv_model *m = load_as(t, "models/qwen3-tiny.gguf", "qwen3");
    REQUIRE(m, "model");
    agentkv_model_info mi;
    agentkv_model_get_info(m, &mi);
    CHECK(!strcmp(mi.chat_template, "qwen3"), "template %s", mi.chat_template);
    agentkv_model *plain = load(t, "models/qwen3-tiny.gguf");
    CHECK(plain && agentkv_model_get_info(plain, &mi) == AGENTKV_OK && !strcmp(mi.chat_template, "plain"),
          "qwen3-tiny without a template: %s", mi.chat_template);
    agentkv_model_free(plain);
    agentkv_error err = {0};
    agentkv_message msgs[3] = {{.role = "system", .content = "Be brief."}, {.role = "user", .content = "Hi <|im_end|>"}};
    char *text = NULL;
    REQUIRE(agentkv_chat_render(m, msgs, 2, &(agentkv_chat_options){.add_generation_prompt = 1}, &text, &err) ==
                AGENTKV_OK,
            "render: %s", agentkv_error_message(&err));
    const char *want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi <|im_end|><|im_end|>\n"
                       "<|im_start|>assistant\n";
    CHECK(!strcmp(text, want), "rendered:\n%s\nwant:\n%s", text, want);
    agentkv_free(text);
    /* tokens: for content without control-token text, those of the
     * rendered text with control tokens parsed (BOS as the vocabulary asks) */
    agentkv_message simple[2] = {{.role = "system", .content = "Be brief."}, {.role = "user", .content = "Hi"}};
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    REQUIRE(agentkv_chat_render(m, simple, 2, &(agentkv_chat_options){.add_generation_prompt = 1}, &text, &err) == 0 &&
                agentkv_chat_tokenize(m, simple, 2, &(agentkv_chat_options){.add_generation_prompt = 1}, &a, &na, &err) ==
                    0 &&
                agentkv_tokenize(m, text, strlen(text), AGENTKV_TOKENIZE_ADD_SPECIAL | AGENTKV_TOKENIZE_PARSE_SPECIAL, &b,
                                 &nb, &err) == 0,
            "tokenize: %s", agentkv_error_message(&err));
    CHECK(na == nb && na > 10 && !memcmp(a, b, na * sizeof *a), "chat tokens (%zu) != the rendering's (%zu)", na, nb);
    agentkv_free(text);
    agentkv_free(a);
    agentkv_free(b);
    agentkv_store *s = NULL;
    agentkv_agent *ag = NULL;
    REQUIRE(agentkv_store_open(m, NULL, &s, &err) == 0 && agentkv_agent_get(s, "chat", &ag, &err) == 0, "open");
    agentkv_turn_result r1, r2;
    REQUIRE(agentkv_agent_turn(ag, &(agentkv_turn_options){.messages = msgs, .n_messages = 2, .max_tokens = 6}, &r1,
                               &err) == AGENTKV_OK,
            "turn 1: %s", agentkv_error_message(&err));
    int32_t *h = NULL;
    size_t nh = 0;
    agentkv_agent_tokens(ag, &h, &nh, &err);
    agentkv_free(h);
    msgs[1].content = "Hi";
    agentkv_message conv[4] = {msgs[0], {.role = "user", .content = "Hi <|im_end|>"},
                               {.role = "assistant", .content = r1.text}, {.role = "user", .content = "More."}};
    REQUIRE(agentkv_agent_turn(ag, &(agentkv_turn_options){.messages = conv, .n_messages = 4, .max_tokens = 2}, &r2,
                               &err) == AGENTKV_OK,
            "turn 2: %s", agentkv_error_message(&err));
    CHECK(r2.tier == AGENTKV_TIER_HOT && r2.reused >= (int)nh - 1 && r2.prefilled < r2.prompt_tokens - (int)nh + 8,
          "resent: reused %d of a history of %zu, prefilled %d of %d (reply \"%s\")", r2.reused, nh, r2.prefilled,
          r2.prompt_tokens, r1.text);
    agentkv_free(r1.text);
    agentkv_free(r2.text);
    agentkv_agent_release(ag);
    agentkv_store_close(s, NULL);
    agentkv_model_free(m);
}

TEST(lib_pools_cards_memories) {
    agentkv_model *m = load(t, "models/stories260K.gguf");
    REQUIRE(m, "model");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/lib-share", test_tmp_dir());
    agentkv_error err = {0};
    agentkv_store *s = NULL;
    agentkv_agent *a = NULL, *b = NULL;
    REQUIRE(agentkv_store_open(m, &(agentkv_store_options){.dir = dir, .cache_type_k = "q8", .cache_type_v = "q8"}, &s,
                               &err) == AGENTKV_OK,
            "open: %s", agentkv_error_message(&err));
    REQUIRE(!agentkv_agent_get(s, "a", &a, &err) && !agentkv_agent_get(s, "b", &b, &err), "agents");
    const char *doc = "Once upon a time there was a little girl named Lily. She loved to play outside.";
    int32_t *pt = NULL, *q = NULL;
    size_t np = 0, nq = 0;
    REQUIRE(!agentkv_tokenize(m, doc, strlen(doc), AGENTKV_TOKENIZE_ADD_SPECIAL, &pt, &np, &err) &&
                !agentkv_tokenize(m, " One day", 8, 0, &q, &nq, &err),
            "tokenize");
    /* a pool: created once, attached, a turn after it shares its blocks */
    REQUIRE(agentkv_pool_create(s, &(agentkv_pool_options){.id = "doc", .tokens = pt, .n_tokens = np}, &err) ==
                AGENTKV_OK,
            "pool: %s", agentkv_error_message(&err));
    CHECK(agentkv_pool_create(s, &(agentkv_pool_options){.id = "doc", .tokens = pt, .n_tokens = np}, &err) ==
              AGENTKV_ERR_EXISTS,
          "a pool made twice: %d", err.code);
    int32_t *pool_tokens = NULL;
    size_t npt = 0;
    CHECK(agentkv_pool_tokens(s, "doc", &pool_tokens, &npt, &err) == AGENTKV_OK && npt == np &&
              !memcmp(pool_tokens, pt, np * sizeof *pt),
          "pool tokens: %zu", npt);
    agentkv_free(pool_tokens);
    REQUIRE(agentkv_pool_attach(a, "doc", &err) == AGENTKV_OK, "attach: %s", agentkv_error_message(&err));
    agentkv_agent_info in;
    CHECK(agentkv_agent_get_info(a, &in, &err) == 0 && !strcmp(in.pool, "doc") && in.n_tokens == (int)np,
          "attached: pool '%s' tokens %d", in.pool, in.n_tokens);
    int32_t *p2 = malloc((np + nq) * sizeof *p2);
    memcpy(p2, pt, np * sizeof *pt);
    memcpy(p2 + np, q, nq * sizeof *q);
    agentkv_turn_result r;
    REQUIRE(agentkv_agent_turn(a, &(agentkv_turn_options){.tokens = p2, .n_tokens = np + nq, .pool_id = "doc",
                               .max_tokens = 4}, &r, &err) == AGENTKV_OK,
            "pooled turn: %s", agentkv_error_message(&err));
    CHECK(r.reused == (int)np && r.prefilled == (int)nq, "pooled: reused %d prefilled %d", r.reused, r.prefilled);
    agentkv_free(r.text);
    CHECK(agentkv_pool_delete(s, "doc", &err) == AGENTKV_ERR_BUSY, "a held pool deleted: %d", err.code);
    /* a card of a's whole cache imported by b: b holds a's tokens */
    char card[AGENTKV_ID_MAX + 1];
    REQUIRE(agentkv_card_make(a, NULL, card, &err) == AGENTKV_OK, "card: %s", agentkv_error_message(&err));
    CHECK(!strcmp(card, "a-1") || !strncmp(card, "a-", 2), "card id %s", card);
    REQUIRE(agentkv_card_import(b, card, 0, &err) == AGENTKV_OK, "import: %s", agentkv_error_message(&err));
    int32_t *ha = NULL, *hb = NULL;
    size_t nha = 0, nhb = 0;
    CHECK(!agentkv_agent_tokens(a, &ha, &nha, &err) && !agentkv_agent_tokens(b, &hb, &nhb, &err) && nha == nhb &&
              !memcmp(ha, hb, nha * sizeof *ha),
          "b holds %zu tokens, a %zu", nhb, nha);
    REQUIRE(agentkv_agent_turn(b, &(agentkv_turn_options){.tokens = ha, .n_tokens = nha, .max_tokens = 1}, &r, &err) ==
                AGENTKV_OK,
            "turn after import: %s", agentkv_error_message(&err));
    CHECK(r.reused == (int)nha - 1 && r.prefilled == 1, "after import: reused %d of %zu", r.reused, nha);
    agentkv_free(r.text);
    agentkv_free(ha);
    agentkv_free(hb);
    /* a memory composed into a prompt: its tokens placed, not computed */
    int computed = -1;
    REQUIRE(agentkv_memory_add(s, &(agentkv_memory_options){.id = "lily", .text = " Lily had a red ball."}, &computed,
                               &err) == AGENTKV_OK && computed == 1,
            "memory: %s", agentkv_error_message(&err));
    agentkv_part parts[3] = {{.tokens = pt, .n_tokens = 5}, {.memory_id = "lily"}, {.tokens = q, .n_tokens = nq}};
    agentkv_prompt pr;
    REQUIRE(agentkv_memory_compose(s, parts, 3, &pr, &err) == AGENTKV_OK && pr.n_memories == 1 &&
                pr.memories[0].at == 5,
            "compose: %s", agentkv_error_message(&err));
    int mem_len = (int)pr.n_tokens - 5 - (int)nq;
    agentkv_agent *c = NULL;
    REQUIRE(!agentkv_agent_get(s, "c", &c, &err), "agent c");
    REQUIRE(agentkv_agent_turn(c, &(agentkv_turn_options){.tokens = pr.tokens, .n_tokens = pr.n_tokens,
                               .memories = pr.memories, .n_memories = pr.n_memories, .max_tokens = 2}, &r, &err) ==
                AGENTKV_OK,
            "memory turn: %s", agentkv_error_message(&err));
    CHECK(mem_len > 0 && r.reused >= mem_len && r.prefilled == (int)pr.n_tokens - r.reused,
          "memory turn: reused %d (memory %d) prefilled %d of %zu", r.reused, mem_len, r.prefilled, pr.n_tokens);
    agentkv_free(r.text);
    CHECK(agentkv_memory_delete(s, "lily", &err) == AGENTKV_OK &&
              agentkv_memory_delete(s, "lily", &err) == AGENTKV_ERR_NOT_FOUND,
          "memory delete");
    agentkv_prompt_free(&pr);
    agentkv_agent_release(a);
    agentkv_agent_release(b);
    agentkv_agent_release(c);
    CHECK(agentkv_store_close(s, &err) == AGENTKV_OK, "close: %s", agentkv_error_message(&err));
    free(p2);
    agentkv_free(pt);
    agentkv_free(q);
    agentkv_model_free(m);
}

/* Reads `agent: tier=T held=H reused=R prefilled=P` for name from an
 * embed run's output. Returns 1 when found. */
static int embed_line(const char *out, const char *name, char tier[8], int *held, int *reused, int *prefilled) {
    char key[64];
    snprintf(key, sizeof key, "%s: tier=", name);
    const char *p = strstr(out, key);
    return p && sscanf(p + strlen(key), "%7[a-z] held=%d reused=%d prefilled=%d", tier, held, reused, prefilled) == 4;
}

/* The installed agentkv's count of an agent's tokens (`cache ls`), -1 if
 * it does not list it. */
static int listed_tokens(const char *bin, const char *dir, const char *id) {
    char cmd[2048], *out;
    snprintf(cmd, sizeof cmd, "%s cache ls --memory-dir %s", bin, dir);
    int n = -1;
    if (sh(cmd, 60, &out) == 0)
        for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
            char id2[200];
            int k;
            if (sscanf(line, "%199s %d", id2, &k) == 2 && !strcmp(id2, id)) n = k;
        }
    free(out);
    return n;
}

TEST(lib_install_embed_warm_restart) {
    const char *mk = getenv("AK_MAKE");
    if (!mk || !*mk) SKIP("run by make test: the install needs its make and variables (AK_MAKE)");
    char root[512], cmd[8192], model[512], *out;
    snprintf(root, sizeof root, "%s/destdir", test_tmp_dir());
    test_path(model, sizeof model, "models/stories260K.gguf");
    snprintf(cmd, sizeof cmd, "%s -s --no-print-directory install DESTDIR=%s PREFIX=/usr/local", mk, root);
    int rc = sh(cmd, 600, &out);
    REQUIRE(rc == 0, "make install: exit %d: %s", rc, out);
    free(out);
    const char *files[] = {"bin/agentkv", "lib/libagentkv.a", "lib/libagentkv.so", ("lib/libagentkv.so." AGENTKV_VERSION),
                           "include/agentkv.h", "lib/pkgconfig/agentkv.pc", "share/man/man1/agentkv.1"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/usr/local/%s", root, files[i]);
        CHECK(access(p, R_OK) == 0, "not installed: %s", p);
    }
    /* the man page: troff that man renders, every command's flags in it */
    snprintf(cmd, sizeof cmd, "MANWIDTH=100 man -l %s/usr/local/share/man/man1/agentkv.1 2>&1 | col -b", root);
    CHECK(sh(cmd, 30, &out) == 0 && strstr(out, "AGENTKV(1)") && strstr(out, "--memory-dir") &&
              strstr(out, "--cache-type-k") && strstr(out, "usage: agentkv serve"),
          "man page: %.600s", out);
    free(out);
    /* built the way a user builds against it */
    const char *extra = getenv("AK_EMBED_CFLAGS");
    const char *pc = "PKG_CONFIG_PATH=%s/usr/local/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=%s pkg-config";
    char pcs[1200];
    snprintf(pcs, sizeof pcs, pc, root, root);
    snprintf(cmd, sizeof cmd,
             "cc -std=c11 -Wall -Wextra -Werror %s examples/embed.c -o %s/embed $(%s --cflags --libs agentkv) && "
             "cc -std=c11 %s examples/embed.c -o %s/embed-static $(%s --cflags agentkv) "
             "$(%s --static --libs agentkv | sed \"s/-lagentkv/-Wl,-Bstatic -lagentkv -Wl,-Bdynamic/\")",
             extra ? extra : "", root, pcs, extra ? extra : "", root, pcs, pcs);
    rc = sh(cmd, 120, &out);
    REQUIRE(rc == 0, "building embed.c: %s", out);
    free(out);
    char soname[64];
    snprintf(soname, sizeof soname, "[libagentkv.so.%d]", AGENTKV_VERSION_MAJOR);
    snprintf(cmd, sizeof cmd, "readelf -d %s/embed", root);
    CHECK(sh(cmd, 10, &out) == 0 && strstr(out, soname), "embed does not need %s: %s", soname, out);
    free(out);
    char mem[600], bin[700];
    snprintf(mem, sizeof mem, "%s/mem", root);
    snprintf(bin, sizeof bin, "%s/usr/local/bin/agentkv", root);
    int held1[2] = {0}, after1[2];
    const char *names[2] = {"planner", "writer"};
    for (int run = 0; run < 3; run++) {
        snprintf(cmd, sizeof cmd, "LD_LIBRARY_PATH=%s/usr/local/lib %s/%s %s %s", root, root,
                 run < 2 ? "embed" : "embed-static", model, mem);
        rc = sh(cmd, 60, &out);
        CHECK(rc == 0, "run %d: exit %d: %s", run + 1, rc, out);
        for (int i = 0; i < 2; i++) {
            char tier[8];
            int held, reused, prefilled;
            if (!embed_line(out, names[i], tier, &held, &reused, &prefilled)) {
                CHECK(0, "run %d: no line for %s in: %s", run + 1, names[i], out);
                continue;
            }
            if (run == 0) {
                CHECK(!strcmp(tier, "cold") && held == 0 && reused == 0 && prefilled > 0, "run 1, %s: %s held %d reused %d",
                      names[i], tier, held, reused);
            } else {
                /* warm: everything it held reused, only the new words computed */
                CHECK(!strcmp(tier, "warm") && held > 0 && held == after1[i] && reused == held && prefilled > 0 &&
                          prefilled <= held1[i] + 2,
                      "run %d, %s: tier %s held %d (the store listed %d) reused %d prefilled %d", run + 1, names[i], tier,
                      held, after1[i], reused, prefilled);
            }
            if (run == 0) held1[i] = prefilled;
            after1[i] = listed_tokens(bin, mem, names[i]);
            CHECK(after1[i] > held, "run %d: the store lists %s with %d tokens", run + 1, names[i], after1[i]);
        }
        free(out);
    }
}

/* The same restart on a Redis store: the second store (another process's,
 * as far as the store knows) restores the agent warm from Redis. */
TEST(lib_store_redis_restart) {
    redis_srv rs;
    if (redis_start(t, &rs, 0) != 0) return;
    agentkv_model *m = load(t, "models/stories260K.gguf");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/lib-redis-local", test_tmp_dir());
    agentkv_store_options so = {.url = rs.url, .dir = dir};
    agentkv_error err = {0};
    agentkv_store *s = NULL;
    agentkv_agent *a = NULL;
    int32_t *p = NULL, *h = NULL;
    size_t n = 0, nh = 0;
    agentkv_turn_result r = {0};
    const char *text = "Once upon a time";
    if (m && agentkv_tokenize(m, text, strlen(text), AGENTKV_TOKENIZE_ADD_SPECIAL, &p, &n, &err) == AGENTKV_OK &&
        agentkv_store_open(m, &so, &s, &err) == AGENTKV_OK && agentkv_agent_get(s, "red", &a, &err) == AGENTKV_OK &&
        turn_of(a, p, n, 6, &r, &err) == AGENTKV_OK && agentkv_agent_tokens(a, &h, &nh, &err) == AGENTKV_OK) {
        agentkv_free(r.text);
        agentkv_agent_release(a);
        a = NULL;
        CHECK(agentkv_store_close(s, &err) == AGENTKV_OK && redis_count(&rs, "*red*") > 0,
              "close: %s; keys of red in Redis: %d", agentkv_error_message(&err), redis_count(&rs, "*red*"));
        s = NULL;
        CHECK(agentkv_store_open(m, &so, &s, &err) == AGENTKV_OK && agentkv_agent_get(s, "red", &a, &err) == AGENTKV_OK &&
                  turn_of(a, h, nh, 2, &r, &err) == AGENTKV_OK && r.tier == AGENTKV_TIER_WARM &&
                  r.reused == (int)nh - 1 && !strcmp(r.match, "exact"),
              "after the restart: %s tier %d reused %d of %zu match %s", agentkv_error_message(&err), r.tier, r.reused,
              nh, r.match ? r.match : "");
        agentkv_free(r.text);
    } else {
        CHECK(0, "first store: %s", agentkv_error_message(&err));
    }
    agentkv_free(p);
    agentkv_free(h);
    agentkv_agent_release(a);
    agentkv_store_close(s, NULL);
    agentkv_model_free(m);
    redis_stop(&rs);
}
