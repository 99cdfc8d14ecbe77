/* test_api.c - request-body parsing (src/serve/api.c) without a server: the caps on
 * messages and content parts (and that a list near the cap parses in linear
 * time), integers far out of range refused with 400 before any conversion,
 * and chat content tokenized as text. */
#include <string.h>

#include "../fuzz/utf8_check.h"
#include "serve/api.h"
#include "serve/api_fields.h"
#include "base/buf.h"
#include "base/gguf.h"
#include "test.h"

typedef struct {
    ak_tokenizer *tok;
    ak_api_config cfg;
} api_rig;

static int api_open(ak_test_ctx *t, api_rig *r) {
    char path[512];
    gguf_file f;
    ak_error err = {0};
    memset(r, 0, sizeof *r);
    if (gguf_open(&f, test_path(path, sizeof path, "models/stories260K.gguf"), &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "%s", err.msg);
        return -1;
    }
    r->tok = ak_tokenizer_load(&f, &err);
    gguf_close(&f);
    if (!r->tok) {
        ak_test_fail(t, __FILE__, __LINE__, "%s", err.msg);
        return -1;
    }
    r->cfg = (ak_api_config){r->tok, "m", AK_CHAT_PLAIN, NULL, 1 << 20};
    return 0;
}

/* Parses body; returns the status (200 when accepted) and fills *e. */
static int parse(api_rig *r, const char *body, int chat, ak_api_error *e) {
    ak_api_request p;
    int rc = ak_api_parse(&r->cfg, body, strlen(body), chat, NULL, 7, &p, e);
    ak_api_request_free(&p);
    return rc == 0 ? 200 : e->status;
}

/* A chat body with n messages of content `content` (a JSON value). */
static char *chat_body(int n, const char *content) {
    ak_buf b = {0};
    ak_buf_puts(&b, "{\"model\":\"m\",\"messages\":[");
    for (int i = 0; i < n; i++) ak_buf_printf(&b, "%s{\"role\":\"user\",\"content\":%s}", i ? "," : "", content);
    ak_buf_puts(&b, "]}");
    return ak_buf_take(&b);
}

TEST(api_message_and_part_caps) {
    api_rig r;
    if (api_open(t, &r) < 0) return;
    ak_api_error e;
    char *body = chat_body(AK_API_MAX_MESSAGES, "\"a\"");
    REQUIRE(body, "oom");
    double t0 = ak_now();
    CHECK(parse(&r, body, 1, &e) == 200, "%d messages (the cap) accepted: %s", AK_API_MAX_MESSAGES, e.msg);
    double dt = ak_now() - t0;
    CHECK(dt < 3.0, "%d messages took %.2f s", AK_API_MAX_MESSAGES, dt);
    free(body);
    body = chat_body(AK_API_MAX_MESSAGES + 1, "\"a\"");
    CHECK(parse(&r, body, 1, &e) == 400 && e.code && !strcmp(e.code, "too_many_messages"),
          "%d messages: status %d code %s", AK_API_MAX_MESSAGES + 1, e.status, e.code ? e.code : "-");
    free(body);

    ak_buf parts = {0};
    ak_buf_puts(&parts, "[");
    for (int i = 0; i < AK_API_MAX_PARTS; i++) ak_buf_printf(&parts, "%s{\"type\":\"text\",\"text\":\"p%d \"}", i ? "," : "", i);
    size_t at_cap = parts.len;
    ak_buf_puts(&parts, "]");
    REQUIRE(!parts.failed, "oom");
    body = chat_body(1, parts.p);
    CHECK(parse(&r, body, 1, &e) == 200, "%d parts accepted: %s", AK_API_MAX_PARTS, e.msg);
    free(body);
    parts.len = at_cap;
    ak_buf_puts(&parts, ",{\"type\":\"text\",\"text\":\"x\"}]");
    body = chat_body(1, parts.p);
    CHECK(parse(&r, body, 1, &e) == 400 && e.code && !strcmp(e.code, "too_many_parts"), "%d parts: status %d",
          AK_API_MAX_PARTS + 1, e.status);
    free(body);
    ak_buf_free(&parts);

    /* a huge list past the cap is refused at once, without indexing or
     * tokenizing (indexing each message from the list head is n^2/2 = 2e10
     * steps here: minutes) */
    body = chat_body(200000, "\"a\"");
    t0 = ak_now();
    CHECK(parse(&r, body, 1, &e) == 400, "200000 messages refused");
    CHECK(ak_now() - t0 < 5.0, "refusing 200000 messages took %.2f s", ak_now() - t0);
    free(body);
    ak_tokenizer_free(r.tok);
}

TEST(api_huge_numbers_are_400) {
    api_rig r;
    if (api_open(t, &r) < 0) return;
    static const char *const fields[] = {"n", "max_tokens", "max_completion_tokens", "seed", "temperature", "top_p"};
    static const char *const values[] = {"1e300", "-1e300", "1e19", "-1e19", "9223372036854775808", "1.5e308",
                                         "-9.3e18", "4.7e18"};
    for (size_t f = 0; f < sizeof fields / sizeof *fields; f++) {
        for (size_t v = 0; v < sizeof values / sizeof *values; v++) {
            for (int chat = 0; chat <= 1; chat++) {
                char body[512];
                snprintf(body, sizeof body, "{\"model\":\"m\",%s,\"%s\":%s}",
                         chat ? "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]" : "\"prompt\":\"hi\"", fields[f],
                         values[v]);
                ak_api_error e;
                int st = parse(&r, body, chat, &e);
                CHECK(st == 400 && e.param && !strcmp(e.param, fields[f]), "%s = %s: status %d param %s", fields[f],
                      values[v], st, e.param ? e.param : "-");
            }
        }
    }
    /* the edges still parse */
    ak_api_error e;
    CHECK(parse(&r, "{\"model\":\"m\",\"prompt\":\"hi\",\"seed\":4611686018427387904,\"max_tokens\":16777216}", 0, &e) == 200,
          "seed 2^62, max_tokens 2^24: %s", e.msg);
    CHECK(parse(&r, "{\"model\":\"m\",\"prompt\":\"hi\",\"seed\":-4611686018427387904}", 0, &e) == 200, "seed -2^62: %s",
          e.msg);
    CHECK(parse(&r, "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":2.5}", 0, &e) == 400, "max_tokens 2.5");
    ak_tokenizer_free(r.tok);
}

TEST(api_parse_rejects_bad_bodies) {
    api_rig r;
    if (api_open(t, &r) < 0) return;
    static const struct { const char *body; int chat, status; } cases[] = {
        {"", 1, 400}, {"[]", 1, 400}, {"{\"model\":\"x\",\"prompt\":\"a\"}", 0, 404},
        {"{\"model\":\"m\"}", 1, 400}, {"{\"model\":\"m\",\"messages\":[]}", 1, 400},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"wizard\",\"content\":\"a\"}]}", 1, 400},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}", 1, 400},
        {"{\"model\":\"m\",\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 0, 400},
        {"{\"model\":\"m\",\"prompt\":\"a\",\"stop\":[\"\"]}", 0, 400},
        {"{\"model\":\"m\",\"prompt\":\"a\",\"agent_id\":\"../x\"}", 0, 400},
        {"{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", 0, 400},
        {"{\"model\":\"m\",\"prompt\":[\"a\"],\"stop\":[\"a\",\"b\",\"c\",\"d\"],\"temperature\":0}", 0, 200},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ak_api_error e;
        int st = parse(&r, cases[i].body, cases[i].chat, &e);
        CHECK(st == cases[i].status, "%s: %d, want %d (%s)", cases[i].body, st, cases[i].status, e.msg);
    }
    ak_tokenizer_free(r.tok);
}

/* ------------------------------------------------------------------ pools */

/* A pool table for the parser's lookup: one pool, or an error code. */
typedef struct {
    const char *id;
    int32_t *tokens;
    int n;
    const char *source;
    int fail_code;            /* AK_ERR_*: the lookup fails with it */
} fake_pool;

static int fake_lookup(void *ud, const char *id, int32_t **tokens, int *n, char **source, ak_error *err) {
    const fake_pool *fp = ud;
    if (fp->fail_code) return ak_failc(err, fp->fail_code, "lookup failed as told");
    if (strcmp(id, fp->id)) return ak_failc(err, AK_ERR_NOT_FOUND, "no pool '%s'", id);
    *tokens = malloc(sizeof **tokens * (size_t)fp->n);
    memcpy(*tokens, fp->tokens, sizeof **tokens * (size_t)fp->n);
    *n = fp->n;
    *source = fp->source ? strdup(fp->source) : NULL;
    return 0;
}

/* Parses a pool body; returns the status (201 when accepted). */
static int parse_pool(api_rig *r, const char *body, ak_api_pool_request *p, ak_api_error *e) {
    return ak_api_parse_pool(&r->cfg, body, strlen(body), p, e) == 0 ? 201 : e->status;
}

TEST(api_pool_body) {
    api_rig r;
    if (api_open(t, &r) < 0) return;
    ak_api_pool_request p;
    ak_api_error e;
    /* text: the model's BOS, then the text's tokens; default formats q8 / tq3 */
    const char *text = "Once upon a time there was a little dog.";
    REQUIRE(parse_pool(&r, "{\"id\":\"doc-1\",\"text\":\"Once upon a time there was a little dog.\"}", &p, &e) == 201,
            "text pool refused: %s", e.msg);
    int32_t *ids = NULL;
    size_t n = 0;
    ak_error err = {0};
    REQUIRE(ak_tokenize(r.tok, text, strlen(text), AK_TOK_ADD_SPECIAL, &ids, &n, &err) == 0, "%s", err.msg);
    CHECK(ids[0] == ak_tokenizer_bos(r.tok), "the reference starts with BOS");
    CHECK(p.n_tokens == n && !memcmp(p.tokens, ids, n * sizeof *ids), "text pool tokens = the text tokenized with BOS");
    CHECK(!strcmp(p.id, "doc-1") && p.fk == AK_KV_Q8 && p.fv == AK_KV_TQ3, "id %s, formats %d/%d", p.id, p.fk, p.fv);
    CHECK(p.source && !strcmp(p.source, "{\"text\":\"Once upon a time there was a little dog.\"}"), "source %s",
          p.source ? p.source : "(null)");
    free(ids);
    ak_api_pool_request_free(&p);
    /* messages: rendered without the generation prompt; roles normalized in the source */
    REQUIRE(parse_pool(&r,
                       "{\"id\":\"sys\",\"messages\":[{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":"
                       "\"Be kind.\"}]}],\"cache_type_k\":\"q4\",\"cache_type_v\":\"f16\"}",
                       &p, &e) == 201, "messages pool refused: %s", e.msg);
    ak_chat_msg m = {"system", "Be kind."};
    REQUIRE(ak_chat_tokenize(&m, 1,
                             &(ak_chat_opts){.family = AK_CHAT_PLAIN},
                             r.tok, AK_TOK_ADD_SPECIAL, &ids, &n, &err) == 0, "%s", err.msg);
    CHECK(p.n_tokens == n && !memcmp(p.tokens, ids, n * sizeof *ids), "messages pool = the messages rendered alone");
    CHECK(p.fk == AK_KV_Q4 && p.fv == AK_KV_F16, "formats given: %d/%d", p.fk, p.fv);
    CHECK(p.source && !strcmp(p.source, "{\"messages\":[{\"role\":\"system\",\"content\":\"Be kind.\"}]}"), "source %s",
          p.source ? p.source : "(null)");
    free(ids);
    ak_api_pool_request_free(&p);
    /* refusals */
    CHECK(parse_pool(&r, "{\"id\":\".x\",\"text\":\"a\"}", &p, &e) == 400 && !strcmp(e.code, "invalid_pool_id"),
          "id starting with '.'");
    CHECK(parse_pool(&r, "{\"text\":\"a\"}", &p, &e) == 400, "no id");
    CHECK(parse_pool(&r, "{\"id\":\"a\",\"text\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"b\"}]}", &p, &e) ==
          400, "both messages and text");
    CHECK(parse_pool(&r, "{\"id\":\"a\"}", &p, &e) == 400, "neither messages nor text");
    CHECK(parse_pool(&r, "{\"id\":\"a\",\"messages\":[]}", &p, &e) == 400, "no messages");
    CHECK(parse_pool(&r, "{\"id\":\"a\",\"text\":\"a\",\"cache_type_v\":\"q7\"}", &p, &e) == 400 &&
          !strcmp(e.param, "cache_type_v"), "unknown format");
    r.cfg.n_ctx = 8;
    CHECK(parse_pool(&r, "{\"id\":\"a\",\"text\":\"Once upon a time there was a little dog.\"}", &p, &e) == 400 &&
          !strcmp(e.code, "context_length_exceeded") && strstr(e.msg, " 8 tokens"),
          "a pool not shorter than the context: %s", e.msg);
    ak_tokenizer_free(r.tok);
}

TEST(api_pool_composition) {
    api_rig r;
    if (api_open(t, &r) < 0) return;
    ak_api_pool_request pp;
    ak_api_error e;
    ak_error err = {0};
    /* a pool of messages: chat = the pool's messages and the request's rendered together */
    REQUIRE(parse_pool(&r, "{\"id\":\"sys\",\"messages\":[{\"role\":\"system\",\"content\":\"You tell tales.\"}]}", &pp,
                       &e) == 201, "%s", e.msg);
    fake_pool fp = {"sys", pp.tokens, (int)pp.n_tokens, pp.source, 0};
    r.cfg.pool_lookup = fake_lookup;
    r.cfg.pool_ud = &fp;
    ak_api_request p;
    const char *body = "{\"model\":\"m\",\"pool\":\"sys\",\"messages\":[{\"role\":\"user\",\"content\":\"A cat?\"}]}";
    REQUIRE(ak_api_parse(&r.cfg, body, strlen(body), 1, NULL, 7, &p, &e) == 0, "%s", e.msg);
    ak_chat_msg two[2] = {{"system", "You tell tales."}, {"user", "A cat?"}};
    int32_t *ids = NULL;
    size_t n = 0;
    REQUIRE(ak_chat_tokenize(two, 2,
                             &(ak_chat_opts){.family = AK_CHAT_PLAIN, .add_generation_prompt = 1},
                             r.tok, AK_TOK_ADD_SPECIAL, &ids, &n, &err) == 0, "%s", err.msg);
    CHECK(p.n_tokens == n && !memcmp(p.tokens, ids, n * sizeof *ids), "pooled chat = both rendered together");
    CHECK(!memcmp(p.tokens, pp.tokens, pp.n_tokens * sizeof *ids) && p.n_pool_tokens == (int)pp.n_tokens &&
          !strcmp(p.pool, "sys"), "starts with the pool");
    free(ids);
    ak_api_request_free(&p);
    /* mistral puts the system message in front of the LAST user message:
     * the pool's [system, user] renders differently once more follow */
    ak_api_pool_request mp;
    r.cfg.family = AK_CHAT_MISTRAL;
    REQUIRE(parse_pool(&r, "{\"id\":\"sys\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\","
                       "\"content\":\"U\"}]}", &mp, &e) == 201, "%s", e.msg);
    fake_pool fm = {"sys", mp.tokens, (int)mp.n_tokens, mp.source, 0};
    r.cfg.pool_ud = &fm;
    body = "{\"model\":\"m\",\"pool\":\"sys\",\"messages\":[{\"role\":\"assistant\",\"content\":\"A\"},{\"role\":\"user\","
           "\"content\":\"V\"}]}";
    CHECK(parse(&r, body, 1, &e) == 400 && !strcmp(e.code, "pool_template_mismatch"), "mistral: %d %s", e.status, e.msg);
    ak_api_pool_request_free(&mp);
    /* a text pool: its tokens, then the conversation's without its BOS */
    r.cfg.family = AK_CHAT_PLAIN;
    ak_api_pool_request tp;
    REQUIRE(parse_pool(&r, "{\"id\":\"doc\",\"text\":\"The sun was warm.\"}", &tp, &e) == 201, "%s", e.msg);
    fake_pool ft = {"doc", tp.tokens, (int)tp.n_tokens, tp.source, 0};
    r.cfg.pool_ud = &ft;
    body = "{\"model\":\"m\",\"pool\":\"doc\",\"messages\":[{\"role\":\"user\",\"content\":\"A cat?\"}]}";
    REQUIRE(ak_api_parse(&r.cfg, body, strlen(body), 1, NULL, 7, &p, &e) == 0, "%s", e.msg);
    REQUIRE(ak_chat_tokenize(two + 1, 1,
                             &(ak_chat_opts){.family = AK_CHAT_PLAIN, .add_generation_prompt = 1},
                             r.tok, AK_TOK_ADD_SPECIAL, &ids, &n, &err) == 0, "%s",
            err.msg);
    CHECK(ids[0] == ak_tokenizer_bos(r.tok) && p.n_tokens == tp.n_tokens + n - 1 &&
          !memcmp(p.tokens, tp.tokens, tp.n_tokens * sizeof *ids) &&
          !memcmp(p.tokens + tp.n_tokens, ids + 1, (n - 1) * sizeof *ids), "text pool + conversation, one BOS");
    free(ids);
    ak_api_request_free(&p);
    /* completions: the pool's tokens, then the prompt's without its BOS */
    body = "{\"model\":\"m\",\"pool\":\"doc\",\"prompt\":\"A cat\"}";
    REQUIRE(ak_api_parse(&r.cfg, body, strlen(body), 0, NULL, 7, &p, &e) == 0, "%s", e.msg);
    REQUIRE(ak_tokenize(r.tok, "A cat", 5, AK_TOK_ADD_SPECIAL, &ids, &n, &err) == 0, "%s", err.msg);
    CHECK(p.n_tokens == tp.n_tokens + n - 1 && !memcmp(p.tokens + tp.n_tokens, ids + 1, (n - 1) * sizeof *ids),
          "completion with a pool");
    free(ids);
    ak_api_request_free(&p);
    /* pool + request not shorter than the context */
    r.cfg.n_ctx = (int)tp.n_tokens + 2;
    CHECK(parse(&r, body, 0, &e) == 400 && !strcmp(e.code, "context_length_exceeded"), "too long: %d %s", e.status,
          e.msg);
    r.cfg.n_ctx = 1 << 20;
    /* the lookup's errors, and ids refused before any lookup */
    CHECK(parse(&r, "{\"model\":\"m\",\"pool\":\"nope\",\"prompt\":\"a\"}", 0, &e) == 404 &&
          !strcmp(e.code, "pool_not_found"), "unknown pool: %d", e.status);
    CHECK(parse(&r, "{\"model\":\"m\",\"pool\":\"a/b\",\"prompt\":\"a\"}", 0, &e) == 400 &&
          !strcmp(e.code, "invalid_pool_id"), "invalid pool id: %d", e.status);
    CHECK(parse(&r, "{\"model\":\"m\",\"pool\":7,\"prompt\":\"a\"}", 0, &e) == 400, "pool not a string");
    ft.fail_code = AK_ERR_STALE;
    CHECK(parse(&r, body, 0, &e) == 409 && !strcmp(e.code, "pool_stale"), "another model's pool: %d", e.status);
    ft.fail_code = AK_ERR_CORRUPT;
    CHECK(parse(&r, body, 0, &e) == 500 && !strcmp(e.code, "pool_corrupt"), "corrupt pool: %d", e.status);
    r.cfg.pool_lookup = NULL;
    CHECK(parse(&r, body, 0, &e) == 400, "no pools on this server");
    ak_api_pool_request_free(&tp);
    ak_api_pool_request_free(&pp);
    ak_tokenizer_free(r.tok);
}

/* Parses a card body; returns the status (200 when accepted) and the code. */
static int parse_card(const char *body, ak_api_card_request *p, const char **code) {
    ak_api_error e;
    int rc = ak_api_parse_card(body, strlen(body), p, &e);
    *code = rc == 0 ? "" : (e.code ? e.code : "");
    return rc == 0 ? 200 : e.status;
}

TEST(api_card_body) {
    ak_api_card_request p;
    const char *code;
    CHECK(parse_card("{\"bits\":4}", &p, &code) == 200 && p.bits_k == 4 && p.bits_v == 4 && !p.id[0] && p.from == 0 &&
              p.to == 0 && !strcmp(p.policy, "uniform"),
          "defaults: %s", code);
    CHECK(parse_card("{\"id\":\"c-1\",\"range\":[3,40],\"bits_k\":6,\"bits_v\":2.5,\"policy\":\"topology\"}", &p,
                     &code) == 200 && !strcmp(p.id, "c-1") && p.from == 3 && p.to == 40 && p.bits_k == 6 &&
              p.bits_v == 2.5 && !strcmp(p.policy, "topology"),
          "every field: %s", code);
    CHECK(parse_card("{\"bits_k\":8}", &p, &code) == 200 && p.bits_v == 8, "bits_v defaults to bits_k");
    static const struct { const char *body, *code; } bad[] = {
        {"{", "invalid_json"},
        {"[1]", "invalid_json"},
        {"{}", "invalid_bits"},
        {"{\"bits_v\":4}", "invalid_bits"},
        {"{\"bits\":1.99}", "invalid_bits"},
        {"{\"bits\":16.01}", "invalid_bits"},
        {"{\"bits\":\"4\"}", "invalid_bits"},
        {"{\"bits\":1e300}", "invalid_bits"},
        {"{\"bits\":4,\"bits_k\":4}", "invalid_bits"},
        {"{\"bits\":4,\"policy\":\"greedy\"}", "unknown_policy"},
        {"{\"bits\":4,\"policy\":7}", "unknown_policy"},
        {"{\"bits\":4,\"range\":[4,4]}", "invalid_range"},
        {"{\"bits\":4,\"range\":[-1,4]}", "invalid_range"},
        {"{\"bits\":4,\"range\":[0,2.5]}", "invalid_range"},
        {"{\"bits\":4,\"range\":[0,1e300]}", "invalid_range"},
        {"{\"bits\":4,\"range\":[0,4,8]}", "invalid_range"},
        {"{\"bits\":4,\"range\":\"0:4\"}", "invalid_range"},
        {"{\"bits\":4,\"id\":\".hidden\"}", "invalid_card_id"},
        {"{\"bits\":4,\"id\":5}", "invalid_card_id"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int st = parse_card(bad[i].body, &p, &code);
        CHECK(st == 400 && !strcmp(code, bad[i].code), "%s: %d %s (want 400 %s)", bad[i].body, st, code, bad[i].code);
    }
}

TEST(api_import_body) {
    char id[AK_AGENT_ID_MAX + 1];
    ak_api_error e;
    const char *ok[] = {"{\"card\":\"c1\"}", "{\"card\":\"c1\",\"mode\":\"replace\"}", "{\"card\":\"c1\",\"mode\":null}"};
    ak_import_mode mode;
    for (int i = 0; i < 3; i++) {
        id[0] = 'x';
        mode = AK_IMPORT_APPEND;
        CHECK(ak_api_parse_import(ok[i], strlen(ok[i]), id, &mode, &e) == 0 && !strcmp(id, "c1") &&
                  mode == AK_IMPORT_REPLACE, "%s: %s", ok[i], e.msg);
    }
    const char *b = "{\"card\":\"c1\",\"mode\":\"append\"}";
    CHECK(ak_api_parse_import(b, strlen(b), id, &mode, &e) == 0 && !strcmp(id, "c1") && mode == AK_IMPORT_APPEND,
          "append: %s", e.msg);
    b = "{\"card\":\"c1\",\"mode\":\"merge\"}";
    CHECK(ak_api_parse_import(b, strlen(b), id, &mode, &e) < 0 && e.status == 400 && !strcmp(e.code, "unsupported_mode") &&
              strstr(e.msg, "replace") && strstr(e.msg, "append") && !id[0],
          "merge: %s", e.msg);
    static const struct { const char *body, *code; } bad[] = {
        {"{\"card\":\"c1\",\"mode\":\"merge\"}", "unsupported_mode"},
        {"{\"card\":\"c1\",\"mode\":1}", "unsupported_mode"},
        {"{\"mode\":\"replace\"}", "invalid_card_id"},
        {"{\"card\":\"a/b\"}", "invalid_card_id"},
        {"{\"card\":3}", "invalid_card_id"},
        {"\"c1\"", "invalid_json"},
        {"", "invalid_json"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = ak_api_parse_import(bad[i].body, strlen(bad[i].body), id, &mode, &e);
        CHECK(rc < 0 && e.status == 400 && e.code && !strcmp(e.code, bad[i].code), "%s: %s (want %s)", bad[i].body,
              e.code ? e.code : "-", bad[i].code);
    }
}

/* ------------------------------------------------- naming the agent */

/* Parses body with the X-Agent-Id header hdr (may be NULL) into *p (free
 * it); returns the status (200 when accepted). */
static int parse_hdr(api_rig *r, const char *body, int chat, const char *hdr, ak_api_request *p, ak_api_error *e) {
    return ak_api_parse(&r->cfg, body, strlen(body), chat, hdr, 7, p, e) == 0 ? 200 : e->status;
}

/* 1 when e names param with code (both compared as strings; NULL matches NULL). */
static int is_err(const ak_api_error *e, const char *param, const char *code) {
    int pm = param ? e->param && !strcmp(e->param, param) : !e->param;
    int cm = code ? e->code && !strcmp(e->code, code) : !e->code;
    return pm && cm;
}

TEST(api_prompt_cache_key_names_the_agent) {
    api_rig r;
    if (api_open(t, &r) < 0) return;
    ak_api_request p;
    ak_api_error e;
    static const char *const heads[2] = {"{\"model\":\"m\",\"prompt\":\"hi\"", "{\"model\":\"m\",\"messages\":[{\"role\":"
                                                                           "\"user\",\"content\":\"hi\"}]"};
    for (int chat = 0; chat <= 1; chat++) {
        char body[512];
        /* the key alone names the agent */
        snprintf(body, sizeof body, "%s,\"prompt_cache_key\":\"writer-1\"}", heads[chat]);
        CHECK(parse_hdr(&r, body, chat, NULL, &p, &e) == 200 && !strcmp(p.agent_id, "writer-1"), "key alone: %s / %s",
              p.agent_id, e.msg);
        ak_api_request_free(&p);
        /* the header wins over the key, even over one that is no agent id */
        CHECK(parse_hdr(&r, body, chat, "planner", &p, &e) == 200 && !strcmp(p.agent_id, "planner"), "header wins: %s",
              p.agent_id);
        ak_api_request_free(&p);
        snprintf(body, sizeof body, "%s,\"prompt_cache_key\":\"user:42 session\"}", heads[chat]);
        CHECK(parse_hdr(&r, body, chat, "planner", &p, &e) == 200 && !strcmp(p.agent_id, "planner"),
              "header with a key that is no agent id: %s", e.msg);
        ak_api_request_free(&p);
        /* agent_id and the key: equal is fine, different is a 400 */
        snprintf(body, sizeof body, "%s,\"agent_id\":\"w\",\"prompt_cache_key\":\"w\"}", heads[chat]);
        CHECK(parse_hdr(&r, body, chat, NULL, &p, &e) == 200 && !strcmp(p.agent_id, "w"), "agent_id = key: %s", e.msg);
        ak_api_request_free(&p);
        snprintf(body, sizeof body, "%s,\"agent_id\":\"w\",\"prompt_cache_key\":\"v\"}", heads[chat]);
        CHECK(parse_hdr(&r, body, chat, NULL, &p, &e) == 400 && is_err(&e, "prompt_cache_key", "invalid_value"),
              "agent_id != key: %d %s", e.status, e.msg);
        ak_api_request_free(&p);
        /* with the header, agent_id must still agree with it; the key does not matter */
        snprintf(body, sizeof body, "%s,\"agent_id\":\"w\",\"prompt_cache_key\":\"v\"}", heads[chat]);
        CHECK(parse_hdr(&r, body, chat, "w", &p, &e) == 200 && !strcmp(p.agent_id, "w"), "header = agent_id: %s", e.msg);
        ak_api_request_free(&p);
        /* keys that are no agent id: 400 naming prompt_cache_key */
        static const char *const bad[] = {"\"../x\"", "\".hidden\"", "\"\"", "\"a b\"", "\"user:42\""};
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            snprintf(body, sizeof body, "%s,\"prompt_cache_key\":%s}", heads[chat], bad[i]);
            CHECK(parse_hdr(&r, body, chat, NULL, &p, &e) == 400 && is_err(&e, "prompt_cache_key", "invalid_agent_id"),
                  "key %s: %d %s %s", bad[i], e.status, e.param ? e.param : "-", e.code ? e.code : "-");
            ak_api_request_free(&p);
        }
        char long_key[160];
        memset(long_key, 'k', 129);
        long_key[129] = 0;
        snprintf(body, sizeof body, "%s,\"prompt_cache_key\":\"%s\"}", heads[chat], long_key);
        CHECK(parse_hdr(&r, body, chat, NULL, &p, &e) == 400 && is_err(&e, "prompt_cache_key", "invalid_agent_id"),
              "a key of 129 characters");
        ak_api_request_free(&p);
        long_key[128] = 0;
        snprintf(body, sizeof body, "%s,\"prompt_cache_key\":\"%s\"}", heads[chat], long_key);
        CHECK(parse_hdr(&r, body, chat, NULL, &p, &e) == 200 && strlen(p.agent_id) == 128, "a key of 128 characters");
        ak_api_request_free(&p);
        snprintf(body, sizeof body, "%s,\"prompt_cache_key\":5}", heads[chat]);
        CHECK(parse_hdr(&r, body, chat, NULL, &p, &e) == 400 && is_err(&e, "prompt_cache_key", "invalid_type"),
              "key 5: %s", e.msg);
        ak_api_request_free(&p);
        /* null, or nothing at all: anonymous */
        snprintf(body, sizeof body, "%s,\"prompt_cache_key\":null}", heads[chat]);
        CHECK(parse_hdr(&r, body, chat, NULL, &p, &e) == 200 && !p.agent_id[0], "key null: anonymous");
        ak_api_request_free(&p);
        snprintf(body, sizeof body, "%s}", heads[chat]);
        CHECK(parse_hdr(&r, body, chat, NULL, &p, &e) == 200 && !p.agent_id[0], "nothing: anonymous");
        ak_api_request_free(&p);
    }
    ak_tokenizer_free(r.tok);
}

/* --------------------------------------------------------- the fields */

/* One extra member for a chat (chat 1) or completions (0) body: the
 * status, param and code wanted (param / code NULL: none). */
typedef struct {
    int chat;
    const char *member;
    int status;
    const char *param, *code;
} field_case;

static void run_field_cases(ak_test_ctx *t, api_rig *r, const field_case *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const field_case *c = &cases[i];
        ak_buf b = {0};
        ak_buf_printf(&b, "{\"model\":\"m\",%s,%s}",
                      c->chat ? "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]" : "\"prompt\":\"hi\"", c->member);
        ak_api_error e;
        memset(&e, 0, sizeof e);
        int st = parse(r, b.p, c->chat, &e);
        CHECK(st == c->status && (st == 200 || is_err(&e, c->param, c->code)),
              "%s %s: %d %s %s (%s); want %d %s %s", c->chat ? "chat" : "completions", c->member, st,
              e.param ? e.param : "-", e.code ? e.code : "-", e.msg, c->status, c->param ? c->param : "-",
              c->code ? c->code : "-");
        ak_buf_free(&b);
    }
}

/* Fields the server accepts without acting on them, and its own and
 * OpenAI's honoured ones at their edges: never a 400 when well-typed. */
TEST(api_fields_accepted) {
    api_rig r;
    if (api_open(t, &r) < 0) return;
    static const field_case ok[] = {
        {1, "\"stream_options\":{\"include_usage\":true,\"include_obfuscation\":false}", 200},
        {1, "\"stream\":true,\"stream_options\":{\"include_obfuscation\":true,\"future_flag\":3}", 200},
        {1, "\"parallel_tool_calls\":true", 200},
        {1, "\"store\":false", 200},
        {1, "\"metadata\":{\"run\":\"7\",\"who\":\"planner\"}", 200},
        {1, "\"metadata\":{}", 200},
        {1, "\"prompt_cache_retention\":\"24h\"", 200},
        {1, "\"prompt_cache_retention\":\"in-memory\"", 200},
        {1, "\"user\":\"u-1\"", 200},
        {0, "\"user\":\"u-1\"", 200},
        {1, "\"safety_identifier\":\"hash-1\"", 200},
        {1, "\"service_tier\":\"auto\"", 200},
        {1, "\"reasoning_effort\":\"low\"", 200},
        {1, "\"verbosity\":\"medium\"", 200},
        {1, "\"modalities\":[\"text\"]", 200},
        {1, "\"logprobs\":false", 200},
        {1, "\"logprobs\":null", 200},
        {1, "\"top_logprobs\":null", 200},
        {1, "\"logprobs\":true,\"top_logprobs\":20", 200},
        {0, "\"logprobs\":5", 200},
        {1, "\"tool_choice\":\"none\"", 200},
        {1, "\"tool_choice\":\"auto\"", 200},
        {1, "\"tools\":[]", 200},
        {1, "\"tools\":null,\"functions\":null,\"function_call\":null", 200},
        {1, "\"functions\":[]", 200},
        {1, "\"function_call\":\"none\"", 200},
        {1, "\"response_format\":{\"type\":\"text\"}", 200},
        {1, "\"audio\":null,\"prediction\":null,\"web_search_options\":null", 200},
        {1, "\"n\":1", 200},
        {0, "\"n\":1", 200},
        {1, "\"n\":8", 200},
        {0, "\"n\":2", 200},
        {0, "\"echo\":false", 200},
        {0, "\"best_of\":1", 200},
        {0, "\"suffix\":\"\"", 200},
        {0, "\"suffix\":null", 200},
        {0, "\"logprobs\":null", 200},
        /* unknown fields, and fields of the other endpoint, are accepted */
        {1, "\"x_trace\":{\"a\":[1,2]},\"foo\":5", 200},
        {0, "\"tools\":5,\"metadata\":3,\"modalities\":[\"audio\"]", 200},
        {1, "\"echo\":true,\"best_of\":9,\"suffix\":\"s\"", 200},
        /* the sampler's, at their edges */
        {1, "\"top_k\":0,\"min_p\":0,\"frequency_penalty\":-2,\"presence_penalty\":2", 200},
        {0, "\"top_k\":40,\"min_p\":1,\"frequency_penalty\":2,\"presence_penalty\":-2,\"repetition_penalty\":100", 200},
        {1, "\"repetition_penalty\":0.01,\"logit_bias\":{}", 200},
        {1, "\"logit_bias\":{\"0\":-100,\"511\":100,\"7\":0.5}", 200},
        {1, "\"temperature\":0,\"top_p\":1,\"seed\":-1,\"max_completion_tokens\":3,\"stop\":null", 200},
        /* what an SDK sends when told everything */
        {1,
         "\"frequency_penalty\":0,\"presence_penalty\":0,\"logprobs\":false,\"n\":1,\"parallel_tool_calls\":true,"
         "\"store\":false,\"stream\":false,\"temperature\":1,\"top_p\":1,\"user\":\"\",\"tool_choice\":\"none\","
         "\"tools\":[],\"metadata\":{\"a\":\"b\"},\"service_tier\":\"default\",\"modalities\":[\"text\"],"
         "\"response_format\":{\"type\":\"text\"},\"prompt_cache_key\":\"k\"",
         200},
    };
    run_field_cases(t, &r, ok, sizeof ok / sizeof *ok);
    /* metadata at OpenAI's caps: 16 keys of 64 characters, values of 512 (multi-byte characters count once) */
    ak_buf b = {0};
    ak_buf_puts(&b, "\"metadata\":{");
    for (int i = 0; i < 16; i++) {
        ak_buf_printf(&b, "%s\"%02d", i ? "," : "", i);
        for (int k = 0; k < 62; k++) ak_buf_puts(&b, "k");
        ak_buf_puts(&b, "\":\"");
        for (int k = 0; k < 512; k++) ak_buf_puts(&b, "\xc3\xa9");
        ak_buf_puts(&b, "\"");
    }
    ak_buf_puts(&b, "}");
    field_case caps = {.chat = 1, .member = b.p, .status = 200};
    run_field_cases(t, &r, &caps, 1);
    ak_buf_free(&b);
    ak_tokenizer_free(r.tok);
}

/* Capabilities this server lacks: 400 unsupported_parameter naming the field. */
TEST(api_fields_lacking_are_400) {
    api_rig r;
    if (api_open(t, &r) < 0) return;
    const char *u = "unsupported_parameter";
    const field_case bad[] = {
        {1, "\"functions\":[{\"name\":\"f\"}]", 400, "functions", u},
        {1, "\"function_call\":{\"name\":\"f\"}", 400, "function_call", u},
        {1, "\"response_format\":{\"type\":\"json_object\"}", 400, "response_format", u},
        {1, "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s\"}}", 400, "response_format", u},
        {1, "\"audio\":{\"voice\":\"alloy\",\"format\":\"wav\"}", 400, "audio", u},
        {1, "\"modalities\":[\"text\",\"audio\"]", 400, "modalities", u},
        {1, "\"prediction\":{\"type\":\"content\",\"content\":\"x\"}", 400, "prediction", u},
        {1, "\"web_search_options\":{}", 400, "web_search_options", u},
        {0, "\"echo\":true", 400, "echo", u},
        {0, "\"best_of\":2", 400, "best_of", u},
        {0, "\"suffix\":\"the end\"", 400, "suffix", u},
    };
    run_field_cases(t, &r, bad, sizeof bad / sizeof *bad);
    ak_tokenizer_free(r.tok);
}

/* Wrong types (400 invalid_type) and values out of range (400 invalid_value), by name. */
TEST(api_fields_types_and_ranges) {
    api_rig r;
    if (api_open(t, &r) < 0) return;
    const char *ty = "invalid_type", *va = "invalid_value";
    const field_case bad[] = {
        {1, "\"tools\":5", 400, "tools", ty},
        {1, "\"tools\":[5]", 400, "tools", ty},
        {1, "\"tool_choice\":42", 400, "tool_choice", ty},
        {1, "\"tool_choice\":\"sometimes\"", 400, "tool_choice", va},
        {1, "\"tool_choice\":{\"function\":{}}", 400, "tool_choice.type", "missing_required_parameter"},
        {1, "\"logprobs\":\"yes\"", 400, "logprobs", ty},
        {0, "\"logprobs\":true", 400, "logprobs", ty},
        {0, "\"logprobs\":6", 400, "logprobs", va},
        {1, "\"top_logprobs\":999", 400, "top_logprobs", va},
        {1, "\"top_logprobs\":-1", 400, "top_logprobs", va},
        {1, "\"top_logprobs\":\"5\"", 400, "top_logprobs", ty},
        {1, "\"logprobs\":true,\"top_logprobs\":21", 400, "top_logprobs", va},
        /* top_logprobs needs logprobs true (OpenAI's rule) */
        {1, "\"top_logprobs\":5", 400, "top_logprobs", va},
        {1, "\"logprobs\":false,\"top_logprobs\":0", 400, "top_logprobs", va},
        {0, "\"logprobs\":-1", 400, "logprobs", va},
        {1, "\"metadata\":3", 400, "metadata", ty},
        {1, "\"metadata\":{\"a\":1}", 400, "metadata.a", ty},
        {1, "\"metadata\":[\"a\"]", 400, "metadata", ty},
        {1, "\"store\":1", 400, "store", ty},
        {1, "\"parallel_tool_calls\":\"no\"", 400, "parallel_tool_calls", ty},
        {1, "\"user\":7", 400, "user", ty},
        {1, "\"safety_identifier\":[]", 400, "safety_identifier", ty},
        {1, "\"service_tier\":\"turbo\"", 400, "service_tier", va},
        {1, "\"reasoning_effort\":\"max\"", 400, "reasoning_effort", va},
        {1, "\"verbosity\":3", 400, "verbosity", ty},
        {1, "\"prompt_cache_retention\":\"forever\"", 400, "prompt_cache_retention", va},
        {1, "\"modalities\":\"text\"", 400, "modalities", ty},
        {1, "\"modalities\":[\"video\"]", 400, "modalities", va},
        {1, "\"modalities\":[1]", 400, "modalities", ty},
        {1, "\"response_format\":\"text\"", 400, "response_format", ty},
        {1, "\"response_format\":{\"type\":\"xml\"}", 400, "response_format.type", va},
        {1, "\"response_format\":{}", 400, "response_format.type", "missing_required_parameter"},
        {1, "\"functions\":{}", 400, "functions", ty},
        {1, "\"function_call\":7", 400, "function_call", ty},
        {1, "\"function_call\":\"required\"", 400, "function_call", va},
        {1, "\"audio\":\"alloy\"", 400, "audio", ty},
        {1, "\"prediction\":\"x\"", 400, "prediction", ty},
        {1, "\"web_search_options\":true", 400, "web_search_options", ty},
        {1, "\"stream\":\"true\"", 400, "stream", ty},
        {1, "\"stream_options\":true", 400, "stream_options", ty},
        {1, "\"stream_options\":{\"include_usage\":\"yes\"}", 400, "stream_options.include_usage", ty},
        {1, "\"stream_options\":{\"include_obfuscation\":1}", 400, "stream_options.include_obfuscation", ty},
        {1, "\"n\":\"1\"", 400, "n", ty},
        {1, "\"n\":0", 400, "n", va},
        {1, "\"n\":9", 400, "n", va},
        {0, "\"n\":9", 400, "n", va},
        {1, "\"n\":1.5", 400, "n", ty},
        {0, "\"echo\":1", 400, "echo", ty},
        {0, "\"best_of\":21", 400, "best_of", va},
        {0, "\"best_of\":\"1\"", 400, "best_of", ty},
        {0, "\"suffix\":3", 400, "suffix", ty},
        {0, "\"prompt\":5", 400, "prompt", ty},
        {1, "\"temperature\":\"0\"", 400, "temperature", ty},
        {1, "\"temperature\":2.5", 400, "temperature", va},
        {1, "\"top_p\":0", 400, "top_p", va},
        {1, "\"seed\":1.5", 400, "seed", ty},
        {1, "\"stop\":5", 400, "stop", ty},
        {1, "\"max_tokens\":0", 400, "max_tokens", va},
        {1, "\"max_completion_tokens\":\"8\"", 400, "max_completion_tokens", ty},
        {1, "\"messages\":{}", 400, "messages", ty},
        {1, "\"pool\":[]", 400, "pool", ty},
        {1, "\"recompute_ratio\":2", 400, "recompute_ratio", va},
        /* the sampler's */
        {1, "\"top_k\":-1", 400, "top_k", va},
        {1, "\"top_k\":1.5", 400, "top_k", ty},
        {1, "\"top_k\":\"5\"", 400, "top_k", ty},
        {1, "\"min_p\":1.5", 400, "min_p", va},
        {1, "\"min_p\":-0.1", 400, "min_p", va},
        {1, "\"frequency_penalty\":2.5", 400, "frequency_penalty", va},
        {0, "\"frequency_penalty\":\"1\"", 400, "frequency_penalty", ty},
        {1, "\"presence_penalty\":-3", 400, "presence_penalty", va},
        {1, "\"presence_penalty\":1e300", 400, "presence_penalty", va},
        {1, "\"repetition_penalty\":0", 400, "repetition_penalty", va},
        {1, "\"repetition_penalty\":-1", 400, "repetition_penalty", va},
        {1, "\"logit_bias\":[1]", 400, "logit_bias", ty},
        {1, "\"logit_bias\":{\"5\":\"1\"}", 400, "logit_bias.5", ty},
        {1, "\"logit_bias\":{\"5\":101}", 400, "logit_bias.5", va},
        {1, "\"logit_bias\":{\"5\":-100.5}", 400, "logit_bias.5", va},
        {1, "\"logit_bias\":{\"512\":1}", 400, "logit_bias.512", va},
        {1, "\"logit_bias\":{\"99999999999999999999\":1}", 400, "logit_bias.99999999999999999999", va},
        {1, "\"logit_bias\":{\"-1\":1}", 400, "logit_bias.-1", va},
        {1, "\"logit_bias\":{\"abc\":1}", 400, "logit_bias.abc", va},
        {1, "\"logit_bias\":{\"07\":1}", 400, "logit_bias.07", va},
        {1, "\"logit_bias\":{\"\":1}", 400, "logit_bias.", va},
        {1, "\"logit_bias\":{\"7\":1,\"7\":2}", 400, "logit_bias.7", va},
    };
    run_field_cases(t, &r, bad, sizeof bad / sizeof *bad);
    /* metadata past OpenAI's caps: 17 keys, a key of 65 characters, a value of 513 */
    for (int k = 0; k < 3; k++) {
        ak_buf b = {0};
        ak_buf_puts(&b, "\"metadata\":{");
        for (int i = 0; i < (k == 0 ? 17 : 1); i++) ak_buf_printf(&b, "%s\"k%d\":\"v\"", i ? "," : "", i);
        if (k == 1) {
            ak_buf_puts(&b, ",\"");
            for (int i = 0; i < 65; i++) ak_buf_puts(&b, "\xe2\x9c\x93");
            ak_buf_puts(&b, "\":\"v\"");
        }
        if (k == 2) {
            ak_buf_puts(&b, ",\"long\":\"");
            for (int i = 0; i < 513; i++) ak_buf_puts(&b, "v");
            ak_buf_puts(&b, "\"");
        }
        ak_buf_puts(&b, "}");
        field_case c = {.chat = 1, .member = b.p, .status = 400, .param = k == 2 ? "metadata.long" : "metadata", .code = "invalid_value"};
        run_field_cases(t, &r, &c, 1);
        ak_buf_free(&b);
    }
    /* every row of the table has a name, endpoints and types; lacking rows say what is lacking */
    size_t n;
    const ak_api_field *f = ak_api_fields(&n);
    for (size_t i = 0; i < n; i++) {
        CHECK(f[i].name && f[i].endpoints && f[i].types, "row %zu", i);
        CHECK(f[i].disp != AK_FIELD_LACKING || f[i].lacks, "%s: lacking without saying what", f[i].name);
        CHECK(ak_api_field_find(f[i].name, f[i].endpoints & AK_API_EP_CHAT) != NULL, "%s: not found", f[i].name);
    }
    ak_tokenizer_free(r.tok);
}

TEST(api_sampler_fields_reach_the_sampler) {
    api_rig r;
    if (api_open(t, &r) < 0) return;
    ak_api_request p;
    ak_api_error e;
    const char *body = "{\"model\":\"m\",\"prompt\":\"hi\",\"top_k\":5,\"min_p\":0.125,\"repetition_penalty\":1.25,"
                       "\"frequency_penalty\":0.5,\"presence_penalty\":-0.25,\"logit_bias\":{\"10\":2.5,\"3\":-100}}";
    REQUIRE(parse_hdr(&r, body, 0, NULL, &p, &e) == 200, "%s", e.msg);
    CHECK(p.sp.top_k == 5 && p.sp.min_p == 0.125f && p.sp.repeat_penalty == 1.25f && p.sp.frequency_penalty == 0.5f &&
              p.sp.presence_penalty == -0.25f,
          "top_k %d min_p %g rep %g freq %g pres %g", p.sp.top_k, p.sp.min_p, p.sp.repeat_penalty,
          p.sp.frequency_penalty, p.sp.presence_penalty);
    CHECK(p.sp.n_logit_bias == 2 && p.sp.logit_bias == p.logit_bias && p.logit_bias[0].id == 3 &&
              p.logit_bias[0].bias == -100 && p.logit_bias[1].id == 10 && p.logit_bias[1].bias == 2.5f,
          "logit_bias: %d entries", p.sp.n_logit_bias);
    ak_api_request_free(&p);
    /* absent: OpenAI's sampling (no top-k, min-p, penalties or biases) */
    body = "{\"model\":\"m\",\"prompt\":\"hi\"}";
    REQUIRE(parse_hdr(&r, body, 0, NULL, &p, &e) == 200, "%s", e.msg);
    CHECK(p.sp.top_k == 0 && p.sp.min_p == 0 && p.sp.repeat_penalty == 1 && p.sp.frequency_penalty == 0 &&
              p.sp.presence_penalty == 0 && p.sp.n_logit_bias == 0 && !p.sp.logit_bias && !p.logit_bias,
          "defaults");
    ak_api_request_free(&p);
    ak_tokenizer_free(r.tok);
}

/* ---------------------------------------------------------------- UTF-8 */

TEST(api_utf8_checker) {
    static const struct { const char *s; ak_utf8_status st; } cases[] = {
        {"plain", AK_UTF8_OK},
        {"\x7f", AK_UTF8_OK},
        {"\xc2\x80", AK_UTF8_OK},
        {"\xdf\xbf", AK_UTF8_OK},
        {"\xe0\xa0\x80", AK_UTF8_OK},
        {"\xed\x9f\xbf", AK_UTF8_OK},               /* U+D7FF */
        {"\xee\x80\x80", AK_UTF8_OK},               /* U+E000 */
        {"\xef\xbf\xbf", AK_UTF8_OK},
        {"\xf0\x90\x80\x80", AK_UTF8_OK},
        {"\xf4\x8f\xbf\xbf", AK_UTF8_OK},           /* U+10FFFF */
        {"h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9d\x84\x9e", AK_UTF8_OK},
        {"\x80", AK_UTF8_BAD_BYTE},
        {"a\xbf", AK_UTF8_BAD_BYTE},
        {"\xf8\x88\x80\x80\x80", AK_UTF8_BAD_BYTE},
        {"\xff", AK_UTF8_BAD_BYTE},
        {"\xc0\xaf", AK_UTF8_OVERLONG},
        {"\xc1\xbf", AK_UTF8_OVERLONG},
        {"\xe0\x9f\xbf", AK_UTF8_OVERLONG},
        {"\xf0\x8f\xbf\xbf", AK_UTF8_OVERLONG},
        {"\xed\xa0\x80", AK_UTF8_SURROGATE},
        {"\xed\xbf\xbf", AK_UTF8_SURROGATE},
        {"\xf4\x90\x80\x80", AK_UTF8_TOO_LARGE},
        {"\xf7\xbf\xbf\xbf", AK_UTF8_TOO_LARGE},
        {"\xc3", AK_UTF8_TRUNCATED},
        {"\xe2\x9c", AK_UTF8_TRUNCATED},
        {"\xf0\x9d\x84", AK_UTF8_TRUNCATED},
        {"\xe2\x9cx", AK_UTF8_TRUNCATED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t at = 99;
        ak_utf8_status st = ak_utf8_check(cases[i].s, strlen(cases[i].s), &at);
        CHECK(st == cases[i].st, "case %zu: %s, want %s", i, ak_utf8_status_name(st), ak_utf8_status_name(cases[i].st));
    }
    size_t at = 0;
    CHECK(ak_utf8_check("ab\xc0\xaf", 4, &at) == AK_UTF8_OVERLONG && at == 2, "offset %zu", at);
    /* agrees with the fuzzers' independent checker on random strings rich in high bytes */
    ak_rng rng;
    ak_rng_seed(&rng, 12345);
    int disagree = 0;
    for (int k = 0; k < 200000; k++) {
        unsigned char s[6];
        size_t n = 1 + ak_rng_u32(&rng) % 6;
        for (size_t i = 0; i < n; i++) {
            uint32_t x = ak_rng_u32(&rng);
            s[i] = (unsigned char)(x % 4 == 0 ? 0x80 | (x >> 8 & 0x3F) : x % 4 == 1 ? 0xC0 | (x >> 8 & 0x3F) : x >> 8);
            if (!s[i]) s[i] = 'a';
        }
        int ours = ak_utf8_check((const char *)s, n, &at) == AK_UTF8_OK;
        if (ours != utf8_valid(s, n)) disagree++;
    }
    CHECK(disagree == 0, "%d random strings judged differently", disagree);
}

TEST(api_utf8_in_bodies) {
    api_rig r;
    if (api_open(t, &r) < 0) return;
    ak_api_error e;
    /* valid multi-byte text anywhere is accepted (escaped pairs too) */
    static const field_case ok[] = {
        {1, "\"stop\":[\"\xc3\xa9t\xc3\xa9\",\"\xe2\x9c\x93\"],\"metadata\":{\"cl\xc3\xa9\":\"\xf0\x9d\x84\x9e\"}", 200},
        {1, "\"user\":\"\\ud83d\\ude00 \\u00e9\"", 200},
        {0, "\"suffix\":\"\",\"x\":{\"\xe6\x97\xa5\":[\"\xe6\x9c\xac\"]}", 200},
    };
    run_field_cases(t, &r, ok, sizeof ok / sizeof *ok);
    const char *c = "invalid_encoding";
    static const struct { int chat; const char *body, *param; } bad[] = {
        {1, "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"ok\"},{\"role\":\"user\",\"content\":\"a\xc0\xaf\"}]}",
         "messages[1].content"},
        {1, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"\xed\xa0\x80\"}]}]}",
         "messages[0].content[0].text"},
        {1, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stop\":[\"\xe2\x82\"]}", "stop[0]"},
        {1, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stop\":\"x\x80\"}", "stop"},
        {0, "{\"model\":\"m\",\"prompt\":\"\xf4\x90\x80\x80\"}", "prompt"},
        {0, "{\"model\":\"m\",\"prompt\":[\"ok\",\"\xff\"]}", "prompt[1]"},
        {1, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"metadata\":{\"k\xff\":\"v\"}}",
         "metadata.k\\xFF"},
        {1, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"\xfe\":1}", "\\xFE"},
        {1, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"x\":{\"y\":[{\"z\":\"\xc1\xbf\"}]}}",
         "x.y[0].z"},
        {1, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"user\":\"\xf0\x9d\x84\"}", "user"},
        /* before anything else: even the model's name */
        {1, "{\"model\":\"m\xe0\x9f\xbf\",\"messages\":[]}", "model"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&e, 0, sizeof e);
        int st = parse(&r, bad[i].body, bad[i].chat, &e);
        CHECK(st == 400 && is_err(&e, bad[i].param, c), "case %zu: %d %s %s (%s); want %s", i, st,
              e.param ? e.param : "-", e.code ? e.code : "-", e.msg, bad[i].param);
    }
    /* a long path is cut, never overrun, and stays valid UTF-8 */
    ak_buf b = {0};
    ak_buf_puts(&b, "{\"model\":\"m\",\"prompt\":\"hi\",\"x\":");
    for (int i = 0; i < 100; i++) ak_buf_puts(&b, "{\"\xc3\xa9\xc3\xa9\xc3\xa9\":");
    ak_buf_puts(&b, "\"\xff\"");
    for (int i = 0; i < 100; i++) ak_buf_puts(&b, "}");
    ak_buf_puts(&b, "}");
    int st = parse(&r, b.p, 0, &e);
    size_t at;
    CHECK(st == 400 && e.param && strlen(e.param) < sizeof e.param_buf && !strcmp(e.param + strlen(e.param) - 3, "...") &&
              ak_utf8_check(e.param, strlen(e.param), &at) == AK_UTF8_OK,
          "deep path: %d %s", st, e.param ? e.param : "-");
    ak_buf_free(&b);
    /* a lone surrogate escape: cJSON refuses to decode it, so the body is not JSON */
    st = parse(&r, "{\"model\":\"m\",\"prompt\":\"\\ud800\"}", 0, &e);
    CHECK(st == 400 && e.code && (!strcmp(e.code, "invalid_json") || !strcmp(e.code, c)), "\\ud800: %d %s", st,
          e.code ? e.code : "-");
    st = parse(&r, "{\"model\":\"m\",\"prompt\":\"\\udc00x\"}", 0, &e);
    CHECK(st == 400, "\\udc00: %d", st);
    /* the other bodies: pools, memories, cards, imports */
    ak_api_pool_request pp;
    CHECK(parse_pool(&r, "{\"id\":\"p\",\"text\":\"a\xc0\x80\"}", &pp, &e) == 400 && is_err(&e, "text", c),
          "pool text: %s", e.msg);
    CHECK(parse_pool(&r, "{\"id\":\"p\",\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xbf\xbf\"}]}", &pp, &e) == 400 &&
              is_err(&e, "messages[0].content", c),
          "pool messages: %s", e.msg);
    ak_api_memory_request mr;
    const char *mb = "{\"id\":\"m1\",\"text\":\"fine \xf5\x80\x80\x80\"}";
    CHECK(ak_api_parse_memory(mb, strlen(mb), &mr, &e) < 0 && e.status == 400 && is_err(&e, "text", c), "memory: %s",
          e.msg);
    ak_api_card_request cr;
    const char *cb = "{\"bits\":4,\"id\":\"c\xe0\x80\x80\"}";
    CHECK(ak_api_parse_card(cb, strlen(cb), &cr, &e) < 0 && e.status == 400 && is_err(&e, "id", c), "card: %s", e.msg);
    char id[AK_AGENT_ID_MAX + 1];
    ak_import_mode mode;
    const char *ib = "{\"card\":\"c1\",\"mode\":\"re\xf0\x80place\"}";
    CHECK(ak_api_parse_import(ib, strlen(ib), id, &mode, &e) < 0 && e.status == 400 && is_err(&e, "mode", c),
          "import: %s", e.msg);
    ak_tokenizer_free(r.tok);
}

/* What logprobs and top_logprobs ask for, as the parser hands it on: chat's
 * pair, completions' legacy count (0 still asks for the tokens' own). */
TEST(api_logprobs_fields) {
    api_rig r;
    if (api_open(t, &r) < 0) return;
    static const struct {
        int chat;
        const char *fields;
        int logprobs, top;
    } cases[] = {
        {1, "", 0, 0},
        {1, ",\"logprobs\":false", 0, 0},
        {1, ",\"logprobs\":true", 1, 0},
        {1, ",\"logprobs\":true,\"top_logprobs\":7", 1, 7},
        {1, ",\"logprobs\":true,\"top_logprobs\":null", 1, 0},
        {0, "", 0, 0},
        {0, ",\"logprobs\":null", 0, 0},
        {0, ",\"logprobs\":0", 1, 0},
        {0, ",\"logprobs\":5", 1, 5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"model\":\"m\",%s%s}",
                 cases[i].chat ? "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]" : "\"prompt\":\"hi\"",
                 cases[i].fields);
        ak_api_request p;
        ak_api_error e;
        int rc = ak_api_parse(&r.cfg, body, strlen(body), cases[i].chat, NULL, 7, &p, &e);
        CHECK(rc == 0, "%s: %s", body, rc == 0 ? "" : e.msg);
        if (rc == 0)
            CHECK(p.logprobs == cases[i].logprobs && p.top_logprobs == cases[i].top, "%s: logprobs %d top %d", body,
                  p.logprobs, p.top_logprobs);
        ak_api_request_free(&p);
    }
    ak_tokenizer_free(r.tok);
}
