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
