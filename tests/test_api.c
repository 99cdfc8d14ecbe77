/* test_api.c - request-body parsing (src/api.c) without a server: the caps on
 * messages and content parts (and that a list near the cap parses in linear
 * time), integers far out of range refused with 400 before any conversion,
 * and chat content tokenized as text. */
#include <string.h>

#include "../src/api.h"
#include "../src/buf.h"
#include "../src/gguf.h"
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
    REQUIRE(ak_chat_tokenize(AK_CHAT_PLAIN, &m, 1, 0, NULL, r.tok, AK_TOK_ADD_SPECIAL, &ids, &n, &err) == 0, "%s", err.msg);
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
    REQUIRE(ak_chat_tokenize(AK_CHAT_PLAIN, two, 2, 1, NULL, r.tok, AK_TOK_ADD_SPECIAL, &ids, &n, &err) == 0, "%s", err.msg);
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
    REQUIRE(ak_chat_tokenize(AK_CHAT_PLAIN, two + 1, 1, 1, NULL, r.tok, AK_TOK_ADD_SPECIAL, &ids, &n, &err) == 0, "%s",
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
