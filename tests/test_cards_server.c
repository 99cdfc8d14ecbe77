/* test_cards_server.c - CacheCards over HTTP, in process (model, scheduler
 * and server started here; loopback sockets with timeouts):
 *   - export (POST /v1/agents/{id}/cards, bits 16) + import (replace) +
 *     chat: the receiver answers the next turn of the conversation exactly
 *     as the sender does, with every card token reused (nothing of the card
 *     prefilled); /v1/agents names the card;
 *   - importance vs uniform at 4 bits: both import and answer, with other
 *     width histograms; the importance widths are those of an attention
 *     statistics pass computed here independently (and not those of the
 *     token ids alone); topology gives positions read from an imported
 *     card overlap 1 (widths of a pass computed here with those overlaps);
 *   - every bad input gives its status and code and disturbs nothing (a
 *     witness agent answers the same, the agents keep their contexts);
 *   - the card's download is the file, and `agentkv card inspect` reads it;
 *   - `agentkv card export|import|ls|rm` offline make what the server makes. */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "engine/attnstats.h"
#include "agents/bitalloc.h"
#include "base/buf.h"
#include "store/cards.h"
#include "serve/server.h"
#include "server_rig.h"
#include "test.h"

#define N_CTX 1024
#define MODEL "models/stories260K.gguf"

/* A greedy chat turn of agent on messages (a JSON array). */
static reply chat(int port, const char *agent, const char *messages, int max_tokens) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", "m");
    cJSON_AddStringToObject(j, "agent_id", agent);
    cJSON_AddItemToObject(j, "messages", cJSON_Parse(messages));
    cJSON_AddNumberToObject(j, "max_tokens", max_tokens);
    cJSON_AddNumberToObject(j, "temperature", 0);
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    reply r = http(port, "POST", "/v1/chat/completions", body);
    free(body);
    return r;
}

/* agentkv.reused and usage.prompt_tokens of a chat reply. */
static int reused(const reply *r) { return (int)num(cJSON_GetObjectItem(r->j, "agentkv"), "reused"); }
static int prompt_tokens(const reply *r) { return (int)num(cJSON_GetObjectItem(r->j, "usage"), "prompt_tokens"); }

/* POST /v1/agents/{agent}/cards with body (JSON text). */
static reply post_card(int port, const char *agent, const char *body) {
    char path[300];
    snprintf(path, sizeof path, "/v1/agents/%s/cards", agent);
    return http(port, "POST", path, body);
}

/* POST /v1/agents/{agent}/import {"card": card, "mode": mode}. */
static reply import_card(int port, const char *agent, const char *card, const char *mode) {
    char path[300], body[400];
    snprintf(path, sizeof path, "/v1/agents/%s/import", agent);
    snprintf(body, sizeof body, "{\"card\":\"%s\",\"mode\":\"%s\"}", card, mode);
    return http(port, "POST", path, body);
}

/* GET /v1/agents/id: the object (to free) or NULL. */
static cJSON *agent_get(int port, const char *id) {
    char path[256];
    snprintf(path, sizeof path, "/v1/agents/%s", id);
    reply r = http(port, "GET", path, NULL);
    cJSON *j = r.status == 200 ? r.j : NULL;
    if (j) r.j = NULL;
    reply_free(&r);
    return j;
}

/* Tokens at width w ("2", "4", "8", "16") of a card object's side ("widths_k"). */
static int hist(const cJSON *card, const char *side, const char *w) {
    return (int)num(cJSON_GetObjectItem(card, side), w);
}

#define Q1 "[{\"role\":\"user\",\"content\":\"Lily had a red ball. She played in the park with her dog.\"}]"
#define STORY "Once upon a time there was a little girl named Lily. She had a red ball and a big dog. " \
              "Every day they went to the park and played near the tree. One day the dog ran after a cat " \
              "and Lily was sad, but the dog came back with the ball and they were happy again."

/* ------------------------------------------------------------ the tests */

TEST(cards_server_export_import_chat_same_answer) {
    rig r;
    if (rig_start(t, &r, MODEL, 0, "cards-chat", AK_KV_F16, AK_KV_F16, N_CTX) < 0) return;
    reply a = chat(r.port, "alice", Q1, 24);
    REQUIRE(a.status == 200 && answer(&a), "alice: %d %s", a.status, a.body);
    int p1 = prompt_tokens(&a);
    cJSON *q2 = cJSON_Parse(Q1);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", answer(&a));
    cJSON_AddItemToArray(q2, m);
    m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", "What did the dog do next?");
    cJSON_AddItemToArray(q2, m);
    char *q2s = cJSON_PrintUnformatted(q2);
    cJSON_Delete(q2);
    reply_free(&a);
    /* the card: the first turn's prompt at 16 bits */
    char body[256];
    snprintf(body, sizeof body, "{\"id\":\"c16\",\"range\":[0,%d],\"bits\":16,\"policy\":\"uniform\"}", p1);
    a = post_card(r.port, "alice", body);
    REQUIRE(a.status == 201, "make: %d %s", a.status, a.body);
    CHECK(!strcmp(str(a.j, "object"), "card") && !strcmp(str(a.j, "id"), "c16") && (int)num(a.j, "tokens") == p1 &&
          num(a.j, "pos_offset") == 0 && !strcmp(str(a.j, "source_agent"), "alice") &&
          !strcmp(str(a.j, "policy"), "uniform") && num(a.j, "budget_k") == 16 && num(a.j, "mean_bits_k") == 16 &&
          num(a.j, "mean_bits_v") == 16 && hist(a.j, "widths_k", "16") == p1 && hist(a.j, "widths_v", "16") == p1 &&
          str(a.j, "hash") && strlen(str(a.j, "hash")) == 16 && num(a.j, "created") > 0,
          "card object: %s", a.body);
    reply_free(&a);
    /* written behind: a GET waits for the file and gives its size */
    a = http(r.port, "GET", "/v1/cards/c16", NULL);
    CHECK(a.status == 200 && num(a.j, "bytes") > 0 && cJSON_IsTrue(cJSON_GetObjectItem(a.j, "saved")), "GET: %s",
          a.body);
    reply_free(&a);
    a = import_card(r.port, "bob", "c16", "replace");
    CHECK(a.status == 200 && (int)num(a.j, "tokens") == p1, "import: %d %s", a.status, a.body);
    reply_free(&a);
    cJSON *bob = agent_get(r.port, "bob"), *alice = agent_get(r.port, "alice");
    CHECK(bob && str(bob, "card") && !strcmp(str(bob, "card"), "c16") && (int)num(bob, "tokens") == p1, "bob: %s",
          bob ? cJSON_PrintUnformatted(bob) : "none");
    CHECK(alice && cJSON_IsNull(cJSON_GetObjectItem(alice, "card")), "alice holds no card");
    cJSON_Delete(bob);
    cJSON_Delete(alice);
    /* the next turn: the receiver first, then the sender */
    reply rb = chat(r.port, "bob", q2s, 24);
    reply ra = chat(r.port, "alice", q2s, 24);
    REQUIRE(rb.status == 200 && ra.status == 200 && answer(&rb) && answer(&ra), "turn 2: %s / %s", rb.body, ra.body);
    CHECK(!strcmp(answer(&rb), answer(&ra)), "receiver '%s' vs sender '%s'", answer(&rb), answer(&ra));
    CHECK(strlen(answer(&rb)) > 0, "an answer");
    CHECK(reused(&rb) == p1 && prompt_tokens(&rb) > p1, "receiver reused %d of %d (the card: %d)", reused(&rb),
          prompt_tokens(&rb), p1);
    CHECK((int)num(cJSON_GetObjectItem(cJSON_GetObjectItem(rb.j, "usage"), "prompt_tokens_details"), "cached_tokens") ==
              p1, "cached_tokens: %s", rb.body);
    reply_free(&ra);
    reply_free(&rb);
    free(q2s);
    rig_stop(&r);
}

/* Import "append" over HTTP, and a chat turn after it. Alice answers Q1,
 * then the follow-up q2; her card "tail" holds q2's prompt past Q1's
 * (positions [p1, p2), computed after Q1's tokens). Rita answers Q1 (her
 * history: Q1's p1 prompt tokens) and appends the tail: her history is
 * hers followed by the card's, q2's prompt exactly, and as the card was
 * cut right after the same prefix the approximation is exact here: her
 * q2 turn reuses everything (the last token recomputed) and answers as
 * Alice did. */
TEST(cards_server_append_then_chat) {
    rig r;
    if (rig_start(t, &r, MODEL, 0, "cards-append", AK_KV_F16, AK_KV_F16, N_CTX) < 0) return;
    reply a = chat(r.port, "alice", Q1, 24);
    REQUIRE(a.status == 200 && answer(&a), "alice: %d %s", a.status, a.body);
    int p1 = prompt_tokens(&a);
    cJSON *q2 = cJSON_Parse(Q1);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", answer(&a));
    cJSON_AddItemToArray(q2, m);
    m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", "What did the dog do next?");
    cJSON_AddItemToArray(q2, m);
    char *q2s = cJSON_PrintUnformatted(q2);
    cJSON_Delete(q2);
    reply_free(&a);
    reply ra = chat(r.port, "alice", q2s, 24);
    REQUIRE(ra.status == 200 && answer(&ra), "alice q2: %d %s", ra.status, ra.body);
    int p2 = prompt_tokens(&ra);
    char body[256];
    snprintf(body, sizeof body, "{\"id\":\"tail\",\"range\":[%d,%d],\"bits\":16,\"policy\":\"uniform\"}", p1, p2);
    a = post_card(r.port, "alice", body);
    REQUIRE(a.status == 201 && num(a.j, "pos_offset") == p1, "make: %d %s", a.status, a.body);
    reply_free(&a);
    a = chat(r.port, "rita", Q1, 1);
    REQUIRE(a.status == 200, "rita: %d %s", a.status, a.body);
    reply_free(&a);
    cJSON *ri = agent_get(r.port, "rita");
    int nr = ri ? (int)num(ri, "tokens") : -1;
    cJSON_Delete(ri);
    REQUIRE(nr == p1, "rita holds %d tokens, Q1's prompt is %d", nr, p1);
    a = import_card(r.port, "rita", "tail", "append");
    CHECK(a.status == 200 && !strcmp(str(a.j, "mode"), "append") && !strcmp(str(a.j, "card"), "tail") &&
              (int)num(a.j, "tokens") == p2, "append: %d %s", a.status, a.body);
    reply_free(&a);
    ri = agent_get(r.port, "rita");
    CHECK(ri && (int)num(ri, "tokens") == p2, "rita after the append: %s", ri ? cJSON_PrintUnformatted(ri) : "none");
    cJSON_Delete(ri);
    reply rb = chat(r.port, "rita", q2s, 24);
    REQUIRE(rb.status == 200 && answer(&rb), "rita q2: %d %s", rb.status, rb.body);
    CHECK(reused(&rb) == p2 - 1 && prompt_tokens(&rb) == p2, "rita reused %d of %d", reused(&rb), prompt_tokens(&rb));
    CHECK(!strcmp(answer(&rb), answer(&ra)), "rita '%s' vs alice '%s'", answer(&rb), answer(&ra));
    a = http(r.port, "DELETE", "/v1/cards/tail", NULL);
    CHECK(a.status == 409 && !strcmp(err_code(&a), "card_busy") && strstr(err_msg(&a), "rita"), "delete held: %d %s",
          a.status, a.body);
    reply_free(&a);
    reply_free(&ra);
    reply_free(&rb);
    free(q2s);
    rig_stop(&r);
}

/* Widths of tokens[0..n) = base->tokens of MODEL under policy (overlap:
 * base->overlap, NULL or n counts) at budget 5/5, scored from a statistics
 * pass run here (stats: 1) or the token ids alone (0), as docs/cards.md
 * says: f16 sequence, default layers, no caps. Returns 0, or -1 with a test
 * failure recorded. */
static int expected_widths_ex(ak_test_ctx *t, const ak_model *m, const ak_bitalloc_input *base, int stats,
                              ak_bitalloc_policy policy, uint8_t *wk, uint8_t *wv) {
    const int32_t *tokens = base->tokens;
    int n = base->n;
    ak_error err = {0};
    ak_block_pool *bp = ak_block_pool_new(&m->spec, 0, 0, &err);
    ak_kv *kv = bp ? ak_kv_new(bp, AK_KV_F16, AK_KV_F16, n, &err) : NULL;
    ak_ctx *c = kv ? ak_ctx_new(m, 64, 1, &err) : NULL;
    ak_attn_stats *st = c ? ak_attn_stats_new(m, NULL, 0, &err) : NULL;
    double *buf = calloc((size_t)n * 4, sizeof(double));
    int rc = -1;
    if (st && buf) {
        ak_attn_stats_set_seq(st, kv);
        ak_ctx_set_attn_stats(c, st);
        rc = ak_eval(c, kv, &(ak_eval_args){.tokens = tokens, .n = n}, &err);
        ak_ctx_set_attn_stats(c, NULL);
    }
    if (rc == 0) {
        ak_attn_stats_mass(st, buf);
        ak_attn_stats_mass_var(st, buf + n);
        ak_attn_stats_entropy(st, buf + 2 * n);
        ak_attn_stats_exposure(st, buf + 3 * n);
        ak_bitalloc_input in = {.n = n, .tokens = tokens, .overlap = base->overlap};
        if (stats) {
            in.mass = buf;
            in.variance = buf + n;
            in.entropy = buf + 2 * n;
            in.exposure = buf + 3 * n;
        }
        ak_bitalloc_params p;
        ak_bitalloc_params_init(&p);
        ak_bitalloc_params_measured(&p);   /* what the agents use for importance and topology */
        p.policy = policy;
        p.budget_k = 5;
        p.budget_v = 5;
        rc = ak_bitalloc_run(&in, &p, wk, wv, NULL, &err);
    }
    if (rc < 0) ak_test_fail(t, __FILE__, __LINE__, "expected widths: %s", err.msg);
    free(buf);
    ak_attn_stats_free(st);
    ak_ctx_free(c);
    ak_kv_free(kv);
    ak_block_pool_free(bp);
    return rc;
}

/* expected_widths_ex under importance, with no overlap. */
static int expected_widths(ak_test_ctx *t, const ak_model *m, const int32_t *tokens, int n, int stats, uint8_t *wk,
                           uint8_t *wv) {
    return expected_widths_ex(t, m, &(ak_bitalloc_input){.n = n, .tokens = tokens}, stats, AK_BITALLOC_IMPORTANCE, wk,
                              wv);
}

/* At 5 bits (at 4 the agents' allocation floors every token at 4: uniform),
 * importance moves bits from keys to values, and picks by attention which
 * values get 8. */
TEST(cards_server_importance_vs_uniform_5_bits) {
    rig r;
    if (rig_start(t, &r, MODEL, 0, "cards-policies", AK_KV_F16, AK_KV_F16, N_CTX) < 0) return;
    reply a = chat(r.port, "alice", "[{\"role\":\"user\",\"content\":\"" STORY "\"}]", 8);
    REQUIRE(a.status == 200, "alice: %d %s", a.status, a.body);
    reply_free(&a);
    a = post_card(r.port, "alice", "{\"id\":\"u4\",\"bits\":5,\"policy\":\"uniform\"}");
    reply b = post_card(r.port, "alice", "{\"id\":\"i4\",\"bits\":5,\"policy\":\"importance\"}");
    reply c = post_card(r.port, "alice", "{\"id\":\"t4\",\"bits_k\":5,\"bits_v\":5,\"policy\":\"topology\"}");
    REQUIRE(a.status == 201 && b.status == 201 && c.status == 201, "make: %s / %s / %s", a.body, b.body, c.body);
    int n = (int)num(a.j, "tokens");
    CHECK(hist(a.j, "widths_k", "4") + hist(a.j, "widths_k", "8") == n && hist(a.j, "widths_v", "4") +
          hist(a.j, "widths_v", "8") == n, "uniform 5: 4 and 8 bits: %s", a.body);
    CHECK(num(b.j, "mean_bits_v") > num(b.j, "mean_bits_k") && num(b.j, "mean_bits_k") >= 4 &&
          num(b.j, "mean_bits_k") + num(b.j, "mean_bits_v") <= 10,
          "importance 5: values above keys, keys at the floor or above, the mean of both within the budget: %s", b.body);
    CHECK(!strcmp(str(b.j, "policy"), "importance") && !strcmp(str(c.j, "policy"), "topology"), "policies");
    reply_free(&a);
    reply_free(&b);
    reply_free(&c);
    /* the importance widths are an attention-statistics pass's */
    ak_card *ic = NULL;
    ak_error err = {0};
    ak_card_wait_saved(r.agents, "i4");   /* written behind */
    REQUIRE(ak_store_load_card(r.store, "i4", NULL, NULL, 0, &ic, &err) == AK_STORE_HIT, "load i4: %s", err.msg);
    uint8_t *w = malloc((size_t)n * 4);
    REQUIRE(w && ic->n_tokens == n, "n");
    if (expected_widths(t, r.m, ic->tokens, n, 1, w, w + n) == 0) {
        CHECK(!memcmp(w, ic->widths_k, (size_t)n) && !memcmp(w + n, ic->widths_v, (size_t)n),
              "the card's widths are those of the statistics pass");
    }
    if (expected_widths(t, r.m, ic->tokens, n, 0, w + 2 * n, w + 3 * n) == 0)
        CHECK(memcmp(w, w + 2 * n, 2 * (size_t)n), "token ids alone would give other widths (the check can tell)");
    free(w);
    ak_card_free(ic);
    /* both import and answer, reusing the whole card */
    const char *q = "[{\"role\":\"user\",\"content\":\"" STORY "\"},{\"role\":\"user\",\"content\":\"And then?\"}]";
    const char *ids[2] = {"u4", "i4"}, *agents[2] = {"ub", "ib"};
    for (int i = 0; i < 2; i++) {
        a = import_card(r.port, agents[i], ids[i], "replace");
        CHECK(a.status == 200, "import %s: %d %s", ids[i], a.status, a.body);
        reply_free(&a);
        a = chat(r.port, agents[i], q, 8);
        CHECK(a.status == 200 && answer(&a) && reused(&a) > 0, "chat on %s: %d %s", ids[i], a.status, a.body);
        reply_free(&a);
    }
    rig_stop(&r);
}

/* Flips one byte near the end of path (tensor data). Returns 0 or -1. */
static int flip_byte(const char *path) {
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    int rc = -1;
    if (fseek(f, -3, SEEK_END) == 0) {
        int ch = fgetc(f);
        if (ch != EOF && fseek(f, -1, SEEK_CUR) == 0 && fputc(ch ^ 0x40, f) != EOF) rc = 0;
    }
    return fclose(f) == 0 ? rc : -1;
}

/* Writes card id of 8 tokens of m, with fingerprint fp, into store st
 * behind the server's back (a card made elsewhere). Returns 0 or -1. */
static int foreign_card(ak_test_ctx *t, const ak_model *m, ak_store *st, const char *id, const char *fp) {
    ak_error err = {0};
    int32_t toks[8] = {1, 20, 30, 40, 50, 60, 70, 80};
    ak_block_pool *bp = ak_block_pool_new(&m->spec, 0, 0, &err);
    ak_kv *kv = bp ? ak_kv_new(bp, AK_KV_F16, AK_KV_F16, 16, &err) : NULL;
    ak_ctx *c = kv ? ak_ctx_new(m, 16, 1, &err) : NULL;
    int rc = c ? ak_eval(c, kv, &(ak_eval_args){.tokens = toks, .n = 8}, &err) : -1;
    ak_card *card = NULL;
    if (rc == 0) {
        ak_card_params p = {.id = id, .source_agent = "elsewhere", .fingerprint = fp, .model_name = "x", .to = 8};
        card = ak_card_make(kv, toks, &p, &err);
    }
    rc = card ? ak_store_save_card(st, card, &err) : -1;
    if (rc < 0) ak_test_fail(t, __FILE__, __LINE__, "foreign card %s: %s", id, err.msg);
    ak_card_free(card);
    ak_ctx_free(c);
    ak_kv_free(kv);
    ak_block_pool_free(bp);
    return rc;
}

/* 1 if the quarantine of memory directory mem holds a file starting with prefix. */
static int quarantined(const char *mem, const char *prefix) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s/quarantine", test_tmp_dir(), mem);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d))) found = !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return found;
}

/* Submits a long greedy request of agent id straight to the scheduler (so
 * that it is surely queued or running when the next HTTP call arrives). */
static ak_request *long_request(rig *r, const char *id) {
    int32_t *toks = NULL;
    size_t n = 0;
    ak_error err = {0};
    if (ak_tokenize(r->tok, STORY, strlen(STORY), AK_TOK_ADD_SPECIAL, &toks, &n, &err) < 0) return NULL;
    ak_req_params p = {0};
    p.agent_id = id;
    p.prompt = toks;
    p.n_prompt = (int)n;
    p.max_tokens = N_CTX - (int)n - 8;
    p.sp = ak_sampler_defaults();
    p.sp.temp = 0;
    ak_request *q = ak_sched_submit(r->s, &p, &err);
    free(toks);
    return q;
}

/* Expects reply a to have status st and error code code. */
#define EXPECT(a, st, code, what)                                                                       \
    do {                                                                                                \
        reply a_ = (a);                                                                                 \
        CHECK(a_.status == (st) && !strcmp(err_code(&a_), (code)), "%s: %d %s", what, a_.status, a_.body); \
        reply_free(&a_);                                                                                \
    } while (0)

TEST(cards_server_bad_inputs) {
    rig r;
    const char *mem = "cards-bad";
    if (rig_start(t, &r, MODEL, 0, mem, AK_KV_F16, AK_KV_F16, N_CTX) < 0) return;
    reply a = chat(r.port, "witness", Q1, 16);
    REQUIRE(a.status == 200 && answer(&a), "witness: %d %s", a.status, a.body);
    char *before = strdup(answer(&a));
    reply_free(&a);
    a = chat(r.port, "alice", Q1, 16);
    REQUIRE(a.status == 200, "alice: %d %s", a.status, a.body);
    reply_free(&a);
    cJSON *al = agent_get(r.port, "alice");
    int alice_tokens = (int)num(al, "tokens");
    cJSON_Delete(al);
    EXPECT(post_card(r.port, "nobody", "{\"bits\":4}"), 404, "agent_not_found", "unknown agent");
    EXPECT(post_card(r.port, "alice", "{\"bits\":4,\"range\":[0,100000]}"), 400, "invalid_range", "range past the end");
    EXPECT(post_card(r.port, "alice", "{\"bits\":4,\"range\":[5,2]}"), 400, "invalid_range", "range backwards");
    EXPECT(post_card(r.port, "alice", "{\"bits\":4,\"range\":[0]}"), 400, "invalid_range", "range of one number");
    EXPECT(post_card(r.port, "alice", "{\"bits\":1}"), 400, "invalid_bits", "bits 1");
    EXPECT(post_card(r.port, "alice", "{\"bits\":17}"), 400, "invalid_bits", "bits 17");
    EXPECT(post_card(r.port, "alice", "{\"bits_k\":4,\"bits_v\":1.5}"), 400, "invalid_bits", "bits_v 1.5");
    EXPECT(post_card(r.port, "alice", "{\"policy\":\"uniform\"}"), 400, "invalid_bits", "no bits");
    EXPECT(post_card(r.port, "alice", "{\"bits\":4,\"policy\":\"random\"}"), 400, "unknown_policy", "policy");
    EXPECT(post_card(r.port, "alice", "{\"bits\":4,\"id\":\"a/b\"}"), 400, "invalid_card_id", "card id");
    EXPECT(post_card(r.port, "alice", "{bits"), 400, "invalid_json", "json");
    a = post_card(r.port, "alice", "{\"id\":\"c\",\"bits\":8}");
    CHECK(a.status == 201, "make c: %d %s", a.status, a.body);
    reply_free(&a);
    EXPECT(post_card(r.port, "alice", "{\"id\":\"c\",\"bits\":4}"), 409, "card_exists", "card id taken");
    /* a request of alice in flight: she is busy for cards and imports */
    ak_request *lr = long_request(&r, "alice");
    REQUIRE(lr, "long request");
    EXPECT(post_card(r.port, "alice", "{\"bits\":4}"), 409, "agent_busy", "make while generating");
    EXPECT(import_card(r.port, "alice", "c", "replace"), 409, "agent_busy", "import while generating");
    EXPECT(import_card(r.port, "alice", "c", "append"), 409, "agent_busy", "append while generating");
    ak_request_cancel(lr);
    ak_request_wait(lr, (size_t)-1, 60000);
    ak_request_release(lr);
    a = chat(r.port, "alice", Q1, 16);   /* back to the context she had */
    CHECK(a.status == 200, "alice again: %d", a.status);
    reply_free(&a);
    /* imports */
    a = import_card(r.port, "alice", "c", "merge");
    CHECK(a.status == 400 && !strcmp(err_code(&a), "unsupported_mode") && strstr(err_msg(&a), "replace") &&
              strstr(err_msg(&a), "append"), "merge: %d %s", a.status, a.body);
    reply_free(&a);
    EXPECT(import_card(r.port, "alice", "nope", "append"), 404, "card_not_found", "append an unknown card");
    EXPECT(import_card(r.port, "alice", "nope", "replace"), 404, "card_not_found", "unknown card");
    EXPECT(http(r.port, "POST", "/v1/agents/alice/import", "{\"mode\":\"replace\"}"), 400, "invalid_card_id", "no card");
    REQUIRE(foreign_card(t, r.m, r.store, "other-model", "0123456789abcdef") == 0, "other-model card");
    EXPECT(import_card(r.port, "alice", "other-model", "replace"), 409, "card_stale", "another model's card");
    EXPECT(import_card(r.port, "alice", "other-model", "append"), 409, "card_stale", "append another model's card");
    REQUIRE(foreign_card(t, r.m, r.store, "broken", r.m->fingerprint) == 0, "broken card");
    char path[700];
    snprintf(path, sizeof path, "%s/%s/cards/broken.safetensors", test_tmp_dir(), mem);
    CHECK(flip_byte(path) == 0, "flip %s", path);
    EXPECT(import_card(r.port, "alice", "broken", "replace"), 500, "card_corrupt", "corrupt card");
    /* (quarantined by the first refusal: now unknown) */
    EXPECT(import_card(r.port, "alice", "broken", "append"), 404, "card_not_found", "append a quarantined card");
    CHECK(quarantined(mem, "card+broken") && access(path, F_OK) != 0, "the corrupt card is in quarantine");
    al = agent_get(r.port, "alice");
    CHECK(al && (int)num(al, "tokens") == alice_tokens && cJSON_IsNull(cJSON_GetObjectItem(al, "card")),
          "alice kept her context through the refused imports");
    cJSON_Delete(al);
    /* removal */
    a = import_card(r.port, "bob", "c", "replace");
    CHECK(a.status == 200, "import c: %d %s", a.status, a.body);
    reply_free(&a);
    a = http(r.port, "DELETE", "/v1/cards/c", NULL);
    CHECK(a.status == 409 && !strcmp(err_code(&a), "card_busy") && strstr(err_msg(&a), "bob"), "delete held: %d %s",
          a.status, a.body);
    reply_free(&a);
    EXPECT(http(r.port, "DELETE", "/v1/cards/nope", NULL), 404, "card_not_found", "delete unknown");
    EXPECT(http(r.port, "GET", "/v1/cards/nope", NULL), 404, "card_not_found", "get unknown");
    EXPECT(http(r.port, "PUT", "/v1/cards", NULL), 405, "", "put");
    a = http(r.port, "GET", "/v1/cards", NULL);
    cJSON *data = cJSON_GetObjectItem(a.j, "data");
    CHECK(a.status == 200 && cJSON_GetArraySize(data) == 2 && !strcmp(str(cJSON_GetArrayItem(data, 0), "id"), "c") &&
              !strcmp(str(cJSON_GetArrayItem(data, 1), "id"), "other-model"),
          "list: %s", a.body);
    reply_free(&a);
    a = http(r.port, "DELETE", "/v1/agents/bob", NULL);
    CHECK(a.status == 200, "delete bob: %d", a.status);
    reply_free(&a);
    a = http(r.port, "DELETE", "/v1/cards/c", NULL);
    CHECK(a.status == 200, "delete c once no agent holds it: %d %s", a.status, a.body);
    reply_free(&a);
    a = chat(r.port, "witness", Q1, 16);
    CHECK(a.status == 200 && answer(&a) && !strcmp(answer(&a), before), "the witness answers the same: '%s' vs '%s'",
          answer(&a) ? answer(&a) : a.body, before);
    reply_free(&a);
    free(before);
    rig_stop(&r);
}

TEST(cards_server_download_inspect) {
    rig r;
    if (rig_start(t, &r, MODEL, 0, "cards-dl", AK_KV_F16, AK_KV_F16, N_CTX) < 0) return;
    reply a = chat(r.port, "alice", "[{\"role\":\"user\",\"content\":\"" STORY "\"}]", 8);
    REQUIRE(a.status == 200, "alice: %d %s", a.status, a.body);
    reply_free(&a);
    a = post_card(r.port, "alice", "{\"id\":\"dl\",\"bits\":4,\"policy\":\"importance\"}");
    REQUIRE(a.status == 201, "make: %d %s", a.status, a.body);
    reply g = http(r.port, "GET", "/v1/cards/dl", NULL);   /* the file's size, once written */
    int n = (int)num(a.j, "tokens"), bytes = (int)num(g.j, "bytes");
    reply_free(&g);
    int h[4];
    static const char *const ws[4] = {"2", "4", "8", "16"};
    for (int i = 0; i < 4; i++) h[i] = hist(a.j, "widths_k", ws[i]);
    reply_free(&a);
    reply d = http(r.port, "GET", "/v1/cards/dl?download=1", NULL);
    reply e = http_ex(r.port, "GET", "/v1/cards/dl", NULL, "application/octet-stream");
    CHECK(d.status == 200 && (int)d.len == bytes && e.status == 200 && e.len == d.len &&
              !memcmp(d.body, e.body, d.len) && !d.j,
          "download: %d %zu bytes (card: %d), accept: %d %zu", d.status, d.len, bytes, e.status, e.len);
    reply_free(&e);
    a = http(r.port, "GET", "/v1/cards/dl", NULL);
    CHECK(a.status == 200 && a.j && (int)num(a.j, "tokens") == n, "without download: JSON: %s", a.body);
    reply_free(&a);
    rig_stop(&r);
    /* the downloaded bytes in a fresh memory directory, read by the CLI */
    char dir[600], path[700], args[1400], *out = NULL;
    snprintf(dir, sizeof dir, "%s/cards-dl-copy", test_tmp_dir());
    snprintf(path, sizeof path, "%s/cards", dir);
    mkdir(dir, 0700);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/cards/dl.safetensors", dir);
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(d.body, 1, d.len, f) == d.len && fclose(f) == 0, "write %s", path);
    reply_free(&d);
    snprintf(args, sizeof args, "card inspect dl --memory %s", dir);
    int rc = run_cli(args, &out);
    char want[64];
    snprintf(want, sizeof want, "tokens       %d", n);
    CHECK(rc == 0 && strstr(out, want) && strstr(out, "importance"), "inspect: exit %d: %s", rc, out);
    /* the histogram line of keys: "keys    2:%d 4:%d 8:%d 16:%d" */
    char hk[128];
    snprintf(hk, sizeof hk, "2:%d 4:%d 8:%d 16:%d", h[0], h[1], h[2], h[3]);
    CHECK(strstr(out, hk) != NULL, "histogram %s in: %s", hk, out);
    free(out);
}

/* agentkv card export / import / ls / rm offline on a server's directory:
 * export makes what POST /v1/agents/{id}/cards makes (same widths, same
 * content hash), import gives an agent the card (a server then reuses it
 * all), rm refuses while that agent's file starts with it. */
TEST(cards_cli_export_import_rm) {
    rig r;
    const char *mem = "cards-cli";
    if (rig_start(t, &r, MODEL, 0, mem, AK_KV_F16, AK_KV_F16, N_CTX) < 0) return;
    reply a = chat(r.port, "alice", "[{\"role\":\"user\",\"content\":\"" STORY "\"}]", 8);
    REQUIRE(a.status == 200, "alice: %d %s", a.status, a.body);
    reply_free(&a);
    a = post_card(r.port, "alice", "{\"id\":\"http4\",\"bits\":4,\"policy\":\"topology\",\"range\":[3,60]}");
    REQUIRE(a.status == 201, "make: %d %s", a.status, a.body);
    int n = (int)num(a.j, "tokens");
    reply_free(&a);
    cJSON *aj = agent_get(r.port, "alice");
    int na = aj ? (int)num(aj, "tokens") : -1;
    cJSON_Delete(aj);
    rig_stop(&r);
    char dir[600], model[512], args[2048], *out = NULL;
    snprintf(dir, sizeof dir, "%s/%s", test_tmp_dir(), mem);
    test_path(model, sizeof model, MODEL);
    snprintf(args, sizeof args,
             "card export --model %s --memory %s --agent alice --id cli4 --bits 4 --policy topology --range 3:60 "
             "-ctk f16 -ctv f16 -c %d -t 2", model, dir, N_CTX);
    int rc = run_cli(args, &out);
    CHECK(rc == 0 && strstr(out, "topology"), "export: exit %d: %s", rc, out);
    free(out);
    ak_error err = {0};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "%s", err.msg);
    ak_card *h = NULL, *c = NULL;
    CHECK(ak_store_load_card(st, "http4", NULL, NULL, 0, &h, &err) == AK_STORE_HIT &&
              ak_store_load_card(st, "cli4", NULL, NULL, 0, &c, &err) == AK_STORE_HIT,
          "load: %s", err.msg);
    if (h && c)
        CHECK(h->n_tokens == n && c->n_tokens == n && c->pos_offset == 3 && !strcmp(h->hash, c->hash) &&
                  !memcmp(h->widths_k, c->widths_k, (size_t)n),
              "CLI and HTTP cards alike: %s / %s", h->hash, c->hash);
    ak_card_free(h);
    ak_card_free(c);
    ak_store_close(st);
    snprintf(args, sizeof args, "card import --model %s --memory %s --agent carol --card cli4 -ctk f16 -ctv f16 -c %d",
             model, dir, N_CTX);
    rc = run_cli(args, &out);
    CHECK(rc == 0 && strstr(out, "carol"), "import: exit %d: %s", rc, out);
    free(out);
    /* append: the card after alice's own tokens */
    snprintf(args, sizeof args,
             "card import --model %s --memory %s --agent alice --card cli4 --mode append -ctk f16 -ctv f16 -c %d", model,
             dir, N_CTX);
    rc = run_cli(args, &out);
    CHECK(rc == 0 && strstr(out, "appended"), "import --mode append: exit %d: %s", rc, out);
    free(out);
    snprintf(args, sizeof args, "card import --model %s --memory %s --agent alice --card cli4 --mode merge", model, dir);
    rc = run_cli(args, &out);
    CHECK(rc != 0 && strstr(out, "--mode"), "import --mode merge: exit %d: %s", rc, out);
    free(out);
    snprintf(args, sizeof args, "card ls --memory %s", dir);
    rc = run_cli(args, &out);
    CHECK(rc == 0 && strstr(out, "cli4") && strstr(out, "http4"), "ls: exit %d: %s", rc, out);
    free(out);
    snprintf(args, sizeof args, "card rm cli4 --memory %s", dir);
    rc = run_cli(args, &out);
    CHECK(rc == 1 && strstr(out, "carol") && strstr(out, "alice"),
          "rm while carol's file starts with it and alice's holds it after her own: exit %d: %s", rc, out);
    free(out);
    /* a server on the directory: carol continues from the card, all of it reused */
    if (rig_start(t, &r, MODEL, 0, mem, AK_KV_F16, AK_KV_F16, N_CTX) < 0) return;
    cJSON *cj = agent_get(r.port, "carol");
    CHECK(cj && str(cj, "card") && !strcmp(str(cj, "card"), "cli4") && (int)num(cj, "tokens") == n, "carol: %s",
          cj ? "card?" : "none");
    cJSON_Delete(cj);
    cj = agent_get(r.port, "alice");
    CHECK(cj && (int)num(cj, "tokens") == na + n, "alice after the append: %d tokens (%d + %d)",
          cj ? (int)num(cj, "tokens") : -1, na, n);
    cJSON_Delete(cj);
    rig_stop(&r);
    snprintf(args, sizeof args, "card rm cli4 --memory %s --force", dir);
    rc = run_cli(args, &out);
    CHECK(rc == 0, "rm --force: exit %d: %s", rc, out);
    free(out);
    snprintf(args, sizeof args, "card inspect cli4 --memory %s", dir);
    rc = run_cli(args, &out);
    CHECK(rc == 1, "inspect after rm: exit %d: %s", rc, out);
    free(out);
}

/* Topology counts a prior hand-off: bob imports alice's 16-bit card, talks
 * on, and his topology card gives the positions he reads from the card
 * overlap 1 and his own 0 (the widths of a pass computed here with those overlaps, not those of
 * importance). */
TEST(cards_server_topology_counts_a_prior_handoff) {
    rig r;
    if (rig_start(t, &r, MODEL, 0, "cards-topology", AK_KV_F16, AK_KV_F16, N_CTX) < 0) return;
    reply a = chat(r.port, "alice", "[{\"role\":\"user\",\"content\":\"" STORY "\"}]", 8);
    REQUIRE(a.status == 200, "alice: %d %s", a.status, a.body);
    char body[128];
    snprintf(body, sizeof body, "{\"id\":\"a16\",\"bits\":16,\"range\":[0,%d]}", prompt_tokens(&a));
    reply_free(&a);
    a = post_card(r.port, "alice", body);
    REQUIRE(a.status == 201, "make: %d %s", a.status, a.body);
    int nc = (int)num(a.j, "tokens");
    reply_free(&a);
    a = import_card(r.port, "bob", "a16", "replace");
    REQUIRE(a.status == 200, "import: %d %s", a.status, a.body);
    reply_free(&a);
    a = chat(r.port, "bob", "[{\"role\":\"user\",\"content\":\"" STORY "\"},{\"role\":\"user\",\"content\":\""
             "Tell me more about the dog and the ball, and what Lily did after the park.\"}]", 16);
    /* the plain template renders the second user message where the card
     * ended with the assistant's prompt: bob keeps the common prefix of the
     * card (read in place) and computes the rest himself */
    REQUIRE(a.status == 200 && reused(&a) > nc / 2 && reused(&a) <= nc, "bob: %d %s", a.status, a.body);
    nc = reused(&a);
    reply_free(&a);
    reply tp = post_card(r.port, "bob", "{\"id\":\"bt\",\"bits\":5,\"policy\":\"topology\"}");
    reply im = post_card(r.port, "bob", "{\"id\":\"bi\",\"bits\":5,\"policy\":\"importance\"}");
    REQUIRE(tp.status == 201 && im.status == 201, "make: %s / %s", tp.body, im.body);
    reply_free(&tp);
    reply_free(&im);
    ak_card *bt = NULL, *bi = NULL;
    ak_error err = {0};
    ak_card_wait_saved(r.agents, "bt");   /* written behind */
    ak_card_wait_saved(r.agents, "bi");
    REQUIRE(ak_store_load_card(r.store, "bt", NULL, NULL, 0, &bt, &err) == AK_STORE_HIT &&
                ak_store_load_card(r.store, "bi", NULL, NULL, 0, &bi, &err) == AK_STORE_HIT,
            "load: %s", err.msg);
    int n = bt->n_tokens;
    int32_t *ov = calloc((size_t)n, sizeof *ov);
    uint8_t *w = malloc((size_t)n * 2);
    REQUIRE(ov && w && n > nc, "n %d card %d", n, nc);
    for (int i = 0; i < nc; i++) ov[i] = 1;
    const ak_bitalloc_input in = {.n = n, .tokens = bt->tokens, .overlap = ov};
    if (expected_widths_ex(t, r.m, &in, 1, AK_BITALLOC_TOPOLOGY, w, w + n) == 0)
        CHECK(!memcmp(w, bt->widths_k, (size_t)n) && !memcmp(w + n, bt->widths_v, (size_t)n),
              "topology widths are those of the pass with the card's positions at overlap 1");
    CHECK(memcmp(bt->widths_k, bi->widths_k, (size_t)n) || memcmp(bt->widths_v, bi->widths_v, (size_t)n),
          "topology differs from importance here");
    free(ov);
    free(w);
    ak_card_free(bt);
    ak_card_free(bi);
    rig_stop(&r);
}
