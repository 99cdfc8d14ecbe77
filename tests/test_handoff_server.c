/* test_handoff_server.c - handoff reuse over HTTP, in process (model,
 * scheduler and server started here; loopback sockets with timeouts). A
 * triage agent reads a document; specialists take the conversation over
 * with system prompts of their own, of lengths that put the shared
 * history at key shifts that are and are not multiples of the KV block:
 *   - with handoff reuse off (the default, and "none" asked) nothing is
 *     taken from another agent, and the answers are those of a fresh
 *     server that never saw the triage agent (the reference: a plain
 *     prefill of the same prompt);
 *   - cacheblend at ratio 1 recomputes every placed token: the answer is
 *     the reference's, token for token, while the usage says the history
 *     was placed from the triage agent (placement at the right positions,
 *     the key shift, the tokens' order);
 *   - agentkvshift and cacheblend at ratio r recompute ceil(r n) of n;
 *   - spans cross agents only within one API key (trust domain); an agent
 *     deleted is no source; bad settings are 400s naming handoff_reuse;
 *   - the Responses API takes the same field and reports the same usage. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server_rig.h"
#include "test.h"

#define N_CTX 1024
#define MODEL "models/tiny-llama-h64-gqa-f32.gguf"

static const char *DOC =
    "The mill stood where the river bent twice before it reached the town. Every autumn the farmers brought "
    "their grain in carts, and the miller weighed each sack on an iron scale that his grandfather had made. "
    "He wrote the weights in a ledger with a green cover, one line for each farmer, and at the end of the "
    "season he read the ledger aloud in the square so that nobody could say the scale had lied. One year the "
    "river rose so high that the wheel stopped, and the grain waited in the loft for eleven days while the "
    "water went down. The farmers worried that the grain would spoil, but the loft was dry and the sacks were "
    "sound, and when the wheel turned again the miller ground day and night until every sack was flour.";

/* The heads: the triage agent's, then the specialists'. Their token
 * counts differ from the triage head's by amounts that are and are not
 * multiples of 32 (the test checks the shifts it gets). */
static const char *TRIAGE = "You are the triage agent. Read the document and decide who answers.";
static const char *HEADS[] = {
    "You are the billing specialist.",
    "You are the history specialist. You know the town, its river and its mill, and you answer questions about "
    "them in one short sentence that quotes the document where you can, without guessing.",
    "You are a triage agent. Read the document and decide who answers.",
};
#define N_HEADS 3

/* A greedy chat {system head, user DOC} for agent (NULL: anonymous) with
 * extra members (a JSON object or NULL) and header lines (or NULL). */
static reply chat(int port, const char *agent, const char *head, const char *extra, const char *headers) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", "m");
    if (agent) cJSON_AddStringToObject(j, "agent_id", agent);
    cJSON *msgs = cJSON_AddArrayToObject(j, "messages");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "system");
    cJSON_AddStringToObject(m, "content", head);
    cJSON_AddItemToArray(msgs, m);
    m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", DOC);
    cJSON_AddItemToArray(msgs, m);
    cJSON_AddNumberToObject(j, "max_tokens", 16);
    cJSON_AddNumberToObject(j, "temperature", 0);
    json_merge(j, extra);
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    reply r = http_hdr(port, "POST", "/v1/chat/completions", body, headers);
    free(body);
    return r;
}

/* usage.prompt_tokens_details's member / the agentkv object's. */
static double detail(const reply *r, const char *name) {
    return num(cJSON_GetObjectItem(cJSON_GetObjectItem(r->j, "usage"), "prompt_tokens_details"), name);
}
static const cJSON *akv(const reply *r) { return cJSON_GetObjectItem(r->j, "agentkv"); }

/* The reference answers: each head's chat on a fresh server that holds no
 * other agent (a plain prefill), into ref[i] (malloc'd). Returns 0, or -1
 * having failed the test. */
static int reference_answers(ak_test_ctx *t, char *ref[N_HEADS]) {
    rig r;
    const rig_opts o = {.model = MODEL, .mem = "ref", .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = N_CTX,
                        .family = AK_CHAT_PLAIN};
    if (rig_start_opts(t, &r, &o) < 0) return -1;
    int rc = 0;
    for (int i = 0; i < N_HEADS; i++) {
        char id[32];
        snprintf(id, sizeof id, "ref-%d", i);
        reply a = chat(r.port, id, HEADS[i], NULL, NULL);
        ref[i] = answer(&a) ? strdup(answer(&a)) : NULL;
        CHECK(a.status == 200 && ref[i] && detail(&a, "cached_tokens") == 0, "reference %d: %d %s", i, a.status,
              a.body ? a.body : "");
        if (!ref[i]) rc = -1;
        reply_free(&a);
    }
    rig_stop(&r);
    return rc;
}

TEST(handoff_reuse_placed_at_unaligned_shifts_ratio_one_is_full_prefill) {
    char *ref[N_HEADS] = {0};
    if (reference_answers(t, ref) < 0) goto out;
    rig r;
    const rig_opts o = {.model = MODEL, .mem = "h", .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = N_CTX,
                        .family = AK_CHAT_PLAIN};
    if (rig_start_opts(t, &r, &o) < 0) goto out;
    reply a = chat(r.port, "triage", TRIAGE, NULL, NULL);
    REQUIRE(a.status == 200, "triage: %d %s", a.status, a.body ? a.body : "");
    int doc_tokens = (int)num(a.j ? cJSON_GetObjectItem(a.j, "usage") : NULL, "prompt_tokens");
    reply_free(&a);
    /* cacheblend at ratio 1: placed from another agent, every token recomputed: the reference's answer */
    int shift_aligned = 0, shift_unaligned = 0;
    for (int i = 0; i < N_HEADS; i++) {
        char id[32];
        snprintf(id, sizeof id, "blend1-%d", i);
        a = chat(r.port, id, HEADS[i], "{\"handoff_reuse\":\"cacheblend:1\"}", NULL);
        int placed = (int)detail(&a, "handoff_reused_tokens"), shift = (int)num(akv(&a), "handoff_shift");
        const char *from = str(akv(&a), "handoff_from");
        CHECK(a.status == 200 && placed >= 150 && placed < doc_tokens &&
                  (int)detail(&a, "handoff_recomputed_tokens") == placed && detail(&a, "cached_tokens") >= placed && from,
              "head %d cacheblend:1: %d placed of %d, %d recomputed, from %s", i, placed, doc_tokens,
              (int)detail(&a, "handoff_recomputed_tokens"), from ? from : "(none)");
        CHECK(answer(&a) && ref[i] && !strcmp(answer(&a), ref[i]), "head %d cacheblend:1: '%s', the reference '%s'", i,
              answer(&a) ? answer(&a) : "(none)", ref[i] ? ref[i] : "");
        if (shift % 32 == 0) shift_aligned++;
        else shift_unaligned++;
        printf("    head %d: %d tokens placed from %s, key shift %d\n", i, placed, from ? from : "-", shift);
        reply_free(&a);
    }
    CHECK(shift_aligned >= 1 && shift_unaligned >= 1, "shifts: %d multiples of 32, %d not", shift_aligned,
          shift_unaligned);
    /* other ratios: ceil(r n) recomputed */
    static const char *const methods[] = {"agentkvshift:0.25", "cacheblend:0.1", "agentkvshift:0"};
    static const double ratios[] = {0.25, 0.1, 0};
    for (int k = 0; k < 3; k++) {
        char id[32], extra[64], head[512];
        snprintf(id, sizeof id, "part-%d", k);
        snprintf(extra, sizeof extra, "{\"handoff_reuse\":\"%s\"}", methods[k]);
        snprintf(head, sizeof head, "%s Be brief.", HEADS[k]);   /* a prompt no agent holds whole */
        a = chat(r.port, id, head, extra, NULL);
        int placed = (int)detail(&a, "handoff_reused_tokens"), rec = (int)detail(&a, "handoff_recomputed_tokens");
        CHECK(a.status == 200 && placed >= 150 && rec == (int)ceil(ratios[k] * placed - 1e-6) && answer(&a),
              "%s: %d placed, %d recomputed (want ceil(%g * %d))", methods[k], placed, rec, ratios[k], placed);
        reply_free(&a);
    }
    /* off by default, and "none" asked: nothing placed, the reference's answer (the agents
     * above are impure: none of their blocks is linked by prefix) */
    for (int i = 0; i < N_HEADS; i++) {
        char id[32];
        snprintf(id, sizeof id, "off-%d", i);
        a = chat(r.port, id, HEADS[i], i == 1 ? "{\"handoff_reuse\":\"none\"}" : NULL, NULL);
        CHECK(a.status == 200 && detail(&a, "handoff_reused_tokens") == 0 && cJSON_IsNull(cJSON_GetObjectItem(akv(&a), "handoff_from")),
              "head %d with handoff reuse off: %d %s", i, a.status, a.body ? a.body : "");
        CHECK(answer(&a) && ref[i] && !strcmp(answer(&a), ref[i]), "head %d off: '%s', the reference '%s'", i,
              answer(&a) ? answer(&a) : "(none)", ref[i] ? ref[i] : "");
        reply_free(&a);
    }
    rig_stop(&r);
out:
    for (int i = 0; i < N_HEADS; i++) free(ref[i]);
}

TEST(handoff_reuse_only_within_a_trust_domain) {
    static const char *const keys[] = {"key-one", "key-two"};
    rig r;
    const rig_opts o = {.model = MODEL, .mem = "d", .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = N_CTX,
                        .family = AK_CHAT_PLAIN, .api_keys = keys, .n_api_keys = 2, .handoff = 1,
                        .handoff_reuse = {.method = AK_REUSE_CACHEBLEND, .ratio = 0.5f, .check_layer = -1}};
    if (rig_start_opts(t, &r, &o) < 0) return;
    const char *one = "Authorization: Bearer key-one\r\n", *two = "Authorization: Bearer key-two\r\n";
    reply a = chat(r.port, "triage", TRIAGE, NULL, one);
    REQUIRE(a.status == 200, "triage: %d %s", a.status, a.body ? a.body : "");
    reply_free(&a);
    a = chat(r.port, "spec", HEADS[0], NULL, NULL);
    CHECK(a.status == 401, "no key: %d", a.status);
    reply_free(&a);
    /* the other key's requests: nothing of the triage agent, asked (the agent then deleted: a source
     * of that domain) or by the server's setting */
    a = chat(r.port, "spec-two-asked", HEADS[1], "{\"handoff_reuse\":\"agentkvshift:0.1\"}", two);
    CHECK(a.status == 200 && detail(&a, "handoff_reused_tokens") == 0 && detail(&a, "cached_tokens") == 0,
          "another domain, asked: %d, %g placed %s", a.status, detail(&a, "handoff_reused_tokens"), a.body ? a.body : "");
    reply_free(&a);
    a = http_hdr(r.port, "DELETE", "/v1/agents/spec-two-asked", NULL, two);
    CHECK(a.status == 200, "delete: %d %s", a.status, a.body ? a.body : "");
    reply_free(&a);
    a = chat(r.port, "spec-two", HEADS[0], NULL, two);
    CHECK(a.status == 200 && detail(&a, "handoff_reused_tokens") == 0 && detail(&a, "cached_tokens") == 0,
          "another domain: %d, %g placed %s", a.status, detail(&a, "handoff_reused_tokens"), a.body ? a.body : "");
    reply_free(&a);
    /* the same key's: placed from the triage agent (not from spec-two), at the server's ratio */
    a = chat(r.port, "spec-one", HEADS[2], NULL, one);
    int placed = (int)detail(&a, "handoff_reused_tokens");
    const char *from = str(akv(&a), "handoff_from");
    CHECK(a.status == 200 && placed >= 150 && from && !strcmp(from, "triage") &&
              (int)detail(&a, "handoff_recomputed_tokens") == (int)ceil(0.5 * placed - 1e-6),
          "same domain: %d placed from %s, %g recomputed", placed, from ? from : "(none)",
          detail(&a, "handoff_recomputed_tokens"));
    reply_free(&a);
    /* a request of the same key may opt out */
    a = chat(r.port, "spec-one-out", HEADS[1], "{\"handoff_reuse\":\"none\"}", one);
    CHECK(a.status == 200 && detail(&a, "handoff_reused_tokens") == 0, "opted out: %g placed",
          detail(&a, "handoff_reused_tokens"));
    reply_free(&a);
    rig_stop(&r);
}

TEST(handoff_reuse_bad_settings_deleted_source_and_responses) {
    rig r;
    const rig_opts o = {.model = MODEL, .mem = "b", .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = N_CTX,
                        .family = AK_CHAT_PLAIN};
    if (rig_start_opts(t, &r, &o) < 0) return;
    static const char *const bad[] = {"{\"handoff_reuse\":\"cacheblend\"}", "{\"handoff_reuse\":\"cacheblend:-0.1\"}",
                                      "{\"handoff_reuse\":\"cacheblend:1.01\"}", "{\"handoff_reuse\":\"full:0.5\"}",
                                      "{\"handoff_reuse\":\"agentkvshift:abc\"}", "{\"handoff_reuse\":\"\"}",
                                      "{\"handoff_reuse\":0.5}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        reply a = chat(r.port, "x", HEADS[0], bad[i], NULL);
        const char *param = str(cJSON_GetObjectItem(a.j, "error"), "param");
        CHECK(a.status == 400 && param && !strcmp(param, "handoff_reuse") &&
                  !strcmp(err_code(&a), i + 1 == sizeof bad / sizeof *bad ? "invalid_type" : "invalid_value"),
              "%s: %d %s", bad[i], a.status, a.body ? a.body : "");
        reply_free(&a);
    }
    /* a source deleted is no source */
    reply a = chat(r.port, "triage", TRIAGE, NULL, NULL);
    REQUIRE(a.status == 200, "triage: %d", a.status);
    reply_free(&a);
    a = http(r.port, "DELETE", "/v1/agents/triage", NULL);
    CHECK(a.status == 200, "delete: %d %s", a.status, a.body ? a.body : "");
    reply_free(&a);
    a = chat(r.port, "after-delete", HEADS[1], "{\"handoff_reuse\":\"cacheblend:0.3\"}", NULL);
    CHECK(a.status == 200 && detail(&a, "handoff_reused_tokens") == 0 && detail(&a, "cached_tokens") == 0,
          "after the source's deletion: %g placed", detail(&a, "handoff_reused_tokens"));
    reply_free(&a);
    /* the Responses API: instructions are the head, the same field, the same usage */
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", "m");
    cJSON_AddStringToObject(j, "instructions", HEADS[0]);
    cJSON_AddStringToObject(j, "input", DOC);
    cJSON_AddNumberToObject(j, "max_output_tokens", 8);
    cJSON_AddNumberToObject(j, "temperature", 0);
    cJSON_AddStringToObject(j, "handoff_reuse", "cacheblend:0.2");
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    a = http(r.port, "POST", "/v1/responses", body);
    free(body);
    const cJSON *in = cJSON_GetObjectItem(cJSON_GetObjectItem(a.j, "usage"), "input_tokens_details");
    int placed = (int)num(in, "handoff_reused_tokens");
    CHECK(a.status == 200 && placed >= 150 && (int)num(in, "handoff_recomputed_tokens") == (int)ceil(0.2 * placed - 1e-6),
          "responses: %d %s", a.status, a.body ? a.body : "");
    reply_free(&a);
    rig_stop(&r);
}

TEST(handoff_reuse_serve_flag_refuses_bad_settings) {
    static const char *const bad[] = {"full:0.5", "cacheblend", "agentkvshift:2", "cacheblend:x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char args[512], model[256], *out = NULL;
        snprintf(args, sizeof args, "serve -m %s --port 0 --handoff-reuse %s",
                 test_path(model, sizeof model, MODEL), bad[i]);
        int rc = run_cli(args, &out);
        CHECK(rc == 2 && out && strstr(out, "--handoff-reuse"), "serve --handoff-reuse %s: exit %d: %s", bad[i], rc,
              out ? out : "");
        free(out);
    }
}

/* Under a KV budget that holds two agents, the specialist's admission must
 * make room by evicting an idle agent: the least recently used one is the
 * triage agent it takes over from, which admission keeps (pins) while the
 * handoff is pending; another idle agent goes instead. */
TEST(handoff_reuse_source_kept_when_admission_evicts) {
    rig r;
    rig_opts o = {.model = MODEL, .mem = "p0", .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = N_CTX,
                  .family = AK_CHAT_PLAIN};
    if (rig_start_opts(t, &r, &o) < 0) return;
    size_t per = ak_agents_bytes_for(r.agents, 320);   /* one agent: a prompt of about 300 tokens + 16 */
    rig_stop(&r);
    o.mem = "p";
    o.budget = per * 5 / 2;
    o.handoff = 1;
    o.handoff_reuse = (ak_reuse_params){.method = AK_REUSE_CACHEBLEND, .ratio = 0.3f, .check_layer = -1};
    if (rig_start_opts(t, &r, &o) < 0) return;
    reply a = chat(r.port, "triage", TRIAGE, NULL, NULL);
    CHECK(a.status == 200 && (int)num(cJSON_GetObjectItem(a.j, "usage"), "prompt_tokens") < 310, "triage: %d %s",
          a.status, a.body ? a.body : "");
    reply_free(&a);
    /* another agent, used after the triage agent, with other text of about the same length */
    char other[2048];
    snprintf(other, sizeof other, "%s", DOC);
    for (char *p = other; *p; p++)
        if (*p == 'e') *p = 'o';
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", "m");
    cJSON_AddStringToObject(j, "agent_id", "other");
    cJSON_AddStringToObject(j, "prompt", other);
    cJSON_AddNumberToObject(j, "max_tokens", 16);
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    a = http(r.port, "POST", "/v1/completions", body);
    free(body);
    CHECK(a.status == 200, "other: %d %s", a.status, a.body ? a.body : "");
    reply_free(&a);
    a = chat(r.port, "spec", HEADS[1], NULL, NULL);
    const char *from = str(akv(&a), "handoff_from");
    CHECK(a.status == 200 && detail(&a, "handoff_reused_tokens") >= 150 && from && !strcmp(from, "triage") &&
              num(akv(&a), "evicted") >= 1,
          "spec under the budget: %d, %g placed from %s, %g evicted", a.status, detail(&a, "handoff_reused_tokens"),
          from ? from : "(none)", num(akv(&a), "evicted"));
    reply_free(&a);
    rig_stop(&r);
}

/* The other families: qwen3 (every layer keeps every position: the run is
 * placed, and at ratio 1 the answer is a fresh server's), gemma3 (sliding
 * windows) and deepseek2 (latent attention), where no run is looked for
 * and the prompt is prefilled as usual (the same answer too). */
TEST(handoff_reuse_families) {
    static const char *const models[] = {"models/qwen3-tiny.gguf", "models/gemma3-tiny.gguf",
                                         "models/deepseek2-tiny.gguf"};
    for (int k = 0; k < 3; k++) {
        rig r;
        rig_opts o = {.model = models[k], .mem = "fam-ref", .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = N_CTX,
                      .family = AK_CHAT_CHATML};
        if (rig_start_opts(t, &r, &o) < 0) return;
        reply a = chat(r.port, "ref", HEADS[1], NULL, NULL);
        char *ref = answer(&a) ? strdup(answer(&a)) : NULL;
        CHECK(a.status == 200 && ref, "%s reference: %d %s", models[k], a.status, a.body ? a.body : "");
        reply_free(&a);
        rig_stop(&r);
        o.mem = "fam";
        o.handoff = 1;
        o.handoff_reuse = (ak_reuse_params){.method = AK_REUSE_CACHEBLEND, .ratio = 1, .check_layer = -1};
        if (rig_start_opts(t, &r, &o) < 0) { free(ref); return; }
        a = chat(r.port, "triage", TRIAGE, NULL, NULL);
        CHECK(a.status == 200, "%s triage: %d", models[k], a.status);
        reply_free(&a);
        a = chat(r.port, "spec", HEADS[1], NULL, NULL);
        int placed = (int)detail(&a, "handoff_reused_tokens");
        CHECK(a.status == 200 && (k == 0 ? placed >= 150 : placed == 0), "%s: %d, %d placed", models[k], a.status,
              placed);
        CHECK(answer(&a) && ref && !strcmp(answer(&a), ref), "%s: '%s', the reference '%s'", models[k],
              answer(&a) ? answer(&a) : "(none)", ref ? ref : "");
        reply_free(&a);
        free(ref);
        rig_stop(&r);
    }
}
