/* test_choices_server.c - OpenAI's n over HTTP on stories260K (f32 KV).
 *
 * The references are the same server's answers to requests of n = 1 (the
 * documented contract: choice i of a request with seed s is the reply of
 * the same request with n = 1 and seed s + i; greedy choices are the greedy
 * reply), and counts written out here:
 *   - n = 3 greedy: three choices, index 0, 1, 2, each the n = 1 reply;
 *     usage.prompt_tokens the n = 1 request's, completion_tokens three
 *     times its; the prompt prefilled once (the /metrics counter of
 *     prefilled tokens grows by the answer's agentkv.prefilled, not three
 *     times it) and every decode step holding all three choices (the batch
 *     size histogram: one prefill step of one sequence, then steps of
 *     three);
 *   - sampled with a seed: choice i equals the n = 1 request of seed + i,
 *     chat and completions; not all choices alike;
 *   - streamed n = 2: each index's deltas concatenate to the unstreamed
 *     choice's text, each index gets one role chunk and one finish chunk,
 *     usage comes once, last;
 *   - log-probabilities per choice: each choice's tokens spell its text;
 *   - response_format held for every choice (each parses to the schema);
 *   - with an agent, the agent's history after the turn is the one a
 *     request of n = 1 giving choice 0's reply leaves, and the next turn's
 *     cached_tokens are equal;
 *   - n = 9: 400 invalid_value naming n and the limit.
 */
#include <cjson/cJSON.h>
#include <string.h>

#include "server_rig.h"
#include "test.h"

#define N_CTX 512
#define QUESTION "Once upon a time"
#define CHAT "/v1/chat/completions"
#define COMPL "/v1/completions"

/* What a request asks for (bodies are built from it). */
typedef struct {
    const char *agent;        /* NULL: anonymous */
    int max_tokens;
    double temp;
    long seed;                /* < 0: none */
    int n;
    const char *extra;        /* more members (",\"stream\":true"), or NULL */
    const char *messages;     /* chat: the messages' JSON; NULL: the one question */
} ask;

/* The body of a chat (chat = 1) or completions request for a. */
static void body_of(const ask *a, int chat, char *out, size_t cap) {
    char agent[160] = "", seed[48] = "";
    if (a->agent) snprintf(agent, sizeof agent, ",\"agent_id\":\"%s\"", a->agent);
    if (a->seed >= 0) snprintf(seed, sizeof seed, ",\"seed\":%ld", a->seed);
    snprintf(out, cap, "{\"model\":\"m\",%s%s%s,\"max_tokens\":%d,\"temperature\":%g,\"n\":%d%s%s}",
             chat ? "\"messages\":" : "\"prompt\":\"" QUESTION "\"",
             chat ? (a->messages ? a->messages : "[{\"role\":\"user\",\"content\":\"" QUESTION "\"}]") : "", agent,
             a->max_tokens, a->temp, a->n, seed, a->extra ? a->extra : "");
}

/* Posts a; fails the test unless it answers 200. */
static reply post(ak_test_ctx *t, const rig *r, int chat, const ask *a) {
    char body[4096];
    body_of(a, chat, body, sizeof body);
    reply x = http(r->port, "POST", chat ? CHAT : COMPL, body);
    CHECK(x.status == 200, "%s: %d %s", body, x.status, x.body ? x.body : "");
    return x;
}

static const cJSON *choice_at(const reply *x, int i) {
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(x->j, "choices"), i);
}

/* Choice i's text: a chat message's content, or a completion's text. */
static const char *text_at(const reply *x, int i) {
    const cJSON *c = choice_at(x, i), *m = cJSON_GetObjectItemCaseSensitive(c, "message");
    return m ? str(m, "content") : str(c, "text");
}

static const char *finish_at(const reply *x, int i) { return str(choice_at(x, i), "finish_reason"); }

static double usage(const reply *x, const char *name) {
    return num(cJSON_GetObjectItemCaseSensitive(x->j, "usage"), name);
}

static int same(const char *a, const char *b) { return a && b && !strcmp(a, b); }

/* The value of metric `name` (a line "name value") in the rig's metrics, or -1. */
static double metric(const rig *r, const char *name) {
    char *m = ak_metrics_render(r->metrics, NULL);
    double v = -1;
    size_t n = strlen(name);
    for (const char *p = m; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ') { v = atof(p + n + 1); break; }
    free(m);
    return v;
}

/* Each choice of x: index i and, with want (n = 1 answers, one per
 * choice), want[i]'s text and finish reason. */
static void check_choices(ak_test_ctx *t, const reply *x, int n, const reply *want, const char *what) {
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(x->j, "choices")) == n, "%s: %d choices: %s", what,
          cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(x->j, "choices")), x->body ? x->body : "");
    for (int i = 0; i < n; i++) {
        CHECK(num(choice_at(x, i), "index") == i, "%s: choices[%d].index %g", what, i, num(choice_at(x, i), "index"));
        if (!want) continue;
        CHECK(same(text_at(x, i), text_at(&want[i], 0)), "%s: choice %d '%s', n = 1 '%s'", what, i,
              text_at(x, i) ? text_at(x, i) : "(none)", text_at(&want[i], 0) ? text_at(&want[i], 0) : "(none)");
        CHECK(same(finish_at(x, i), finish_at(&want[i], 0)), "%s: choice %d finish %s, n = 1 %s", what, i,
              finish_at(x, i) ? finish_at(x, i) : "(none)", finish_at(&want[i], 0) ? finish_at(&want[i], 0) : "(none)");
    }
}

TEST(server_choices_greedy_one_prefill_one_batch) {
    rig r;
    if (rig_start(t, &r, "models/stories260K.gguf", 0, "n-greedy", AK_KV_F32, AK_KV_F32, N_CTX) < 0) return;
    ask a = {.agent = "greedy-one", .max_tokens = 24, .temp = 0, .seed = -1, .n = 1};
    reply one = post(t, &r, 1, &a);
    REQUIRE(text_at(&one, 0) && usage(&one, "completion_tokens") >= 1, "n = 1: %s", one.body ? one.body : "");
    double pre0 = metric(&r, "agentkv_prefill_tokens_total"), sum0 = metric(&r, "agentkv_batch_size_sum"),
           cnt0 = metric(&r, "agentkv_batch_size_count");
    a.agent = "greedy-three";   /* a new agent: its prompt computed, not reused */
    a.n = 3;
    reply three = post(t, &r, 1, &a);
    double pre1 = metric(&r, "agentkv_prefill_tokens_total"), sum1 = metric(&r, "agentkv_batch_size_sum"),
           cnt1 = metric(&r, "agentkv_batch_size_count");
    reply want[3] = {one, one, one};
    check_choices(t, &three, 3, want, "n = 3 greedy");
    for (int i = 0; i < 3; i++)
        CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(choice_at(&three, i), "logprobs")), "choice %d logprobs", i);
    CHECK(usage(&three, "prompt_tokens") == usage(&one, "prompt_tokens"), "prompt_tokens %g, n = 1 %g",
          usage(&three, "prompt_tokens"), usage(&one, "prompt_tokens"));
    CHECK(usage(&three, "completion_tokens") == 3 * usage(&one, "completion_tokens"), "completion_tokens %g, n = 1 %g",
          usage(&three, "completion_tokens"), usage(&one, "completion_tokens"));
    CHECK(usage(&three, "total_tokens") == usage(&three, "prompt_tokens") + usage(&three, "completion_tokens"),
          "total_tokens %g", usage(&three, "total_tokens"));
    /* prefilled once: the engine computed the answer's prefilled tokens, not three times them */
    double prefilled = num(cJSON_GetObjectItemCaseSensitive(three.j, "agentkv"), "prefilled");
    CHECK(prefilled >= 1 && pre1 - pre0 == prefilled, "prefill tokens computed %g, the answer's prefilled %g",
          pre1 - pre0, prefilled);
    /* one prefill step of one sequence, then every step held all three choices */
    double steps = cnt1 - cnt0, seqs = sum1 - sum0;
    CHECK(steps >= usage(&one, "completion_tokens") && seqs == 1 + 3 * (steps - 1),
          "%g steps ran %g sequences (want 1 + 3 per decode step)", steps, seqs);
    reply_free(&three);
    reply_free(&one);

    /* completions: the same path */
    ask c = {.max_tokens = 16, .temp = 0, .seed = -1, .n = 1};
    reply c1 = post(t, &r, 0, &c);
    c.n = 2;
    reply c2 = post(t, &r, 0, &c);
    reply cw[2] = {c1, c1};
    check_choices(t, &c2, 2, cw, "completions n = 2 greedy");
    CHECK(usage(&c2, "completion_tokens") == 2 * usage(&c1, "completion_tokens"), "completions: completion_tokens %g",
          usage(&c2, "completion_tokens"));
    reply_free(&c2);
    reply_free(&c1);

    /* above the limit: 400 naming n and the limit */
    for (int chat = 0; chat <= 1; chat++) {
        char body[512];
        body_of(&(ask){.max_tokens = 4, .seed = -1, .n = 9}, chat, body, sizeof body);
        reply x = http(r.port, "POST", chat ? CHAT : COMPL, body);
        const char *param = str(cJSON_GetObjectItemCaseSensitive(x.j, "error"), "param");
        CHECK(x.status == 400 && same(param, "n") && same(err_code(&x), "invalid_value") && strstr(err_msg(&x), "8"),
              "n = 9: %d %s", x.status, x.body ? x.body : "");
        reply_free(&x);
    }
    rig_stop(&r);
}

/* The deltas of one index of a streamed answer. */
typedef struct {
    char text[4096];
    int roles, finishes;
    char finish[16];
} streamed_choice;

/* Splits a streamed answer (its events) by choices[0].index into out[0..n);
 * each chunk holds one choice, the usage chunk none and comes last (once).
 * Returns the usage chunk (borrowed from ev), or NULL. */
static const cJSON *split_stream(ak_test_ctx *t, const cJSON *ev, int n, streamed_choice *out) {
    const cJSON *j, *usage_chunk = NULL;
    int k = 0, n_ev = cJSON_GetArraySize(ev);
    memset(out, 0, sizeof *out * (size_t)n);
    cJSON_ArrayForEach(j, ev) {
        k++;
        const cJSON *choices = cJSON_GetObjectItemCaseSensitive(j, "choices");
        if (cJSON_GetObjectItemCaseSensitive(j, "usage")) {
            CHECK(!usage_chunk && k == n_ev && cJSON_GetArraySize(choices) == 0, "usage chunk %d of %d", k, n_ev);
            usage_chunk = j;
            continue;
        }
        CHECK(cJSON_GetArraySize(choices) == 1, "chunk %d: %d choices", k, cJSON_GetArraySize(choices));
        const cJSON *c = cJSON_GetArrayItem(choices, 0);
        int i = (int)num(c, "index");
        if (i < 0 || i >= n) {
            CHECK(0, "chunk %d: index %d", k, i);
            continue;
        }
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(c, "delta");
        const char *piece = d ? str(d, "content") : str(c, "text");
        if (piece) strncat(out[i].text, piece, sizeof out[i].text - strlen(out[i].text) - 1);
        if (d && str(d, "role")) out[i].roles++;
        if (str(c, "finish_reason")) {
            out[i].finishes++;
            snprintf(out[i].finish, sizeof out[i].finish, "%s", str(c, "finish_reason"));
        }
    }
    return usage_chunk;
}

TEST(server_choices_sampled_seed_per_choice_and_streamed) {
    rig r;
    if (rig_start(t, &r, "models/stories260K.gguf", 0, "n-seed", AK_KV_F32, AK_KV_F32, N_CTX) < 0) return;
    for (int chat = 1; chat >= 0; chat--) {
        const char *what = chat ? "chat" : "completions";
        ask a = {.max_tokens = 24, .temp = 1, .seed = 1000, .n = 3};
        reply three = post(t, &r, chat, &a);
        reply one[3];
        double sum = 0;
        for (int i = 0; i < 3; i++) {
            ask s1 = {.max_tokens = 24, .temp = 1, .seed = 1000 + i, .n = 1};
            one[i] = post(t, &r, chat, &s1);
            sum += usage(&one[i], "completion_tokens");
        }
        check_choices(t, &three, 3, one, what);
        CHECK(!same(text_at(&three, 0), text_at(&three, 1)) || !same(text_at(&three, 1), text_at(&three, 2)),
              "%s: three seeds, one text '%s'", what, text_at(&three, 0) ? text_at(&three, 0) : "");
        CHECK(usage(&three, "prompt_tokens") == usage(&one[0], "prompt_tokens") &&
              usage(&three, "completion_tokens") == sum, "%s: usage %g + %g, the n = 1 requests' %g + %g", what,
              usage(&three, "prompt_tokens"), usage(&three, "completion_tokens"), usage(&one[0], "prompt_tokens"), sum);
        for (int i = 0; i < 3; i++) reply_free(&one[i]);
        reply_free(&three);

        /* streamed n = 2: the unstreamed texts, per index */
        ask u = {.max_tokens = 20, .temp = 1, .seed = 2000, .n = 2};
        reply whole = post(t, &r, chat, &u);
        u.extra = ",\"stream\":true,\"stream_options\":{\"include_usage\":true}";
        reply st = post(t, &r, chat, &u);
        cJSON *ev = sse_events(st.body);
        streamed_choice sc[2];
        const cJSON *uc = split_stream(t, ev, 2, sc);
        for (int i = 0; i < 2; i++) {
            CHECK(same(sc[i].text, text_at(&whole, i)), "%s streamed %d: '%s', unstreamed '%s'", what, i, sc[i].text,
                  text_at(&whole, i) ? text_at(&whole, i) : "");
            CHECK(sc[i].finishes == 1 && same(sc[i].finish, finish_at(&whole, i)), "%s streamed %d: %d finishes (%s)",
                  what, i, sc[i].finishes, sc[i].finish);
            CHECK(sc[i].roles == chat, "%s streamed %d: %d role chunks", what, i, sc[i].roles);
        }
        const cJSON *uu = cJSON_GetObjectItemCaseSensitive(uc, "usage");
        CHECK(uc && num(uu, "completion_tokens") == usage(&whole, "completion_tokens") &&
              num(uu, "prompt_tokens") == usage(&whole, "prompt_tokens"), "%s streamed usage: %s", what,
              st.body ? st.body : "");
        cJSON_Delete(ev);
        reply_free(&st);
        reply_free(&whole);
    }

    /* log-probabilities per choice: each choice's tokens spell its own text */
    ask l = {.max_tokens = 12, .temp = 1, .seed = 5, .n = 2, .extra = ",\"logprobs\":true"};
    reply lp = post(t, &r, 1, &l);
    for (int i = 0; i < 2; i++) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(choice_at(&lp, i), "logprobs"), "content");
        char spelled[2048] = "";
        const cJSON *e;
        cJSON_ArrayForEach(e, content) strncat(spelled, str(e, "token"), sizeof spelled - strlen(spelled) - 1);
        CHECK(cJSON_GetArraySize(content) >= 1 && same(spelled, text_at(&lp, i)), "logprobs of choice %d spell '%s', text '%s'",
              i, spelled, text_at(&lp, i) ? text_at(&lp, i) : "");
    }
    reply_free(&lp);

    /* the schema holds for every choice */
    ask sch = {.max_tokens = 40, .temp = 1, .seed = 77, .n = 3,
               .extra = ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":"
                        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"],"
                        "\"additionalProperties\":false}}}"};
    reply js = post(t, &r, 1, &sch);
    for (int i = 0; i < 3; i++) {
        cJSON *o = text_at(&js, i) ? cJSON_Parse(text_at(&js, i)) : NULL;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "a");
        CHECK(cJSON_IsObject(o) && cJSON_GetArraySize(o) == 1 && cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble),
              "choice %d is not {\"a\": integer}: %s", i, text_at(&js, i) ? text_at(&js, i) : "(none)");
        cJSON_Delete(o);
    }
    reply_free(&js);
    rig_stop(&r);
}

/* An agent's history, read on the engine thread (ak_sched_post). */
typedef struct {
    const char *id;
    int32_t *tokens;
    int n;
} history;

static int read_history(void *ctx, ak_agents *agents, ak_ctx *engine, ak_error *err) {
    (void)engine;
    history *h = ctx;
    const int32_t *t = ak_agent_history(agents, h->id, &h->n);
    if (!t || !(h->tokens = malloc(sizeof *t * (size_t)(h->n ? h->n : 1))))
        return ak_failc(err, AK_ERR_NOT_FOUND, "agent %s: no history in RAM", h->id);
    memcpy(h->tokens, t, sizeof *t * (size_t)h->n);
    return 0;
}

TEST(server_choices_agent_keeps_choice_0) {
    rig r;
    if (rig_start(t, &r, "models/stories260K.gguf", 0, "n-agent", AK_KV_F32, AK_KV_F32, N_CTX) < 0) return;
    ask a = {.agent = "two", .max_tokens = 16, .temp = 1, .seed = 3000, .n = 2};
    reply two = post(t, &r, 1, &a);
    a.agent = "one";
    a.n = 1;
    reply one = post(t, &r, 1, &a);
    REQUIRE(same(text_at(&two, 0), text_at(&one, 0)), "choice 0 '%s', n = 1 '%s'",
            text_at(&two, 0) ? text_at(&two, 0) : "", text_at(&one, 0) ? text_at(&one, 0) : "");
    REQUIRE(!same(text_at(&two, 0), text_at(&two, 1)), "the two choices are alike: the check below tells nothing");
    /* the history of the agent of n = 2 is the one n = 1 with choice 0's reply left */
    history h2 = {.id = "two"}, h1 = {.id = "one"};
    ak_error err = {0};
    REQUIRE(ak_sched_post(r.s, read_history, &h2, &err) == 0 && ak_sched_post(r.s, read_history, &h1, &err) == 0,
            "%s", err.msg);
    CHECK(h2.n == h1.n && h1.n > usage(&one, "prompt_tokens") && !memcmp(h2.tokens, h1.tokens, sizeof(int32_t) * (size_t)h1.n),
          "histories: %d and %d tokens", h2.n, h1.n);
    free(h2.tokens);
    free(h1.tokens);
    /* the next turn, choice 0's reply sent back: both reuse as much */
    char msgs[2048];
    cJSON *m = cJSON_CreateArray(), *u = cJSON_CreateObject(), *as = cJSON_CreateObject(), *u2 = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", QUESTION);
    cJSON_AddStringToObject(as, "role", "assistant");
    cJSON_AddStringToObject(as, "content", text_at(&two, 0));
    cJSON_AddStringToObject(u2, "role", "user");
    cJSON_AddStringToObject(u2, "content", "And then?");
    cJSON_AddItemToArray(m, u);
    cJSON_AddItemToArray(m, as);
    cJSON_AddItemToArray(m, u2);
    REQUIRE(cJSON_PrintPreallocated(m, msgs, sizeof msgs, 0), "messages");
    cJSON_Delete(m);
    ask n2 = {.agent = "two", .max_tokens = 4, .temp = 0, .seed = -1, .n = 1, .messages = msgs};
    reply next2 = post(t, &r, 1, &n2);
    n2.agent = "one";
    reply next1 = post(t, &r, 1, &n2);
    double c2 = num(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(next2.j, "usage"),
                                                     "prompt_tokens_details"), "cached_tokens");
    double c1 = num(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(next1.j, "usage"),
                                                     "prompt_tokens_details"), "cached_tokens");
    CHECK(c2 == c1 && c1 > usage(&one, "prompt_tokens"), "next turn: cached %g, n = 1's agent %g (first prompt %g)", c2,
          c1, usage(&one, "prompt_tokens"));
    reply_free(&next1);
    reply_free(&next2);
    reply_free(&one);
    reply_free(&two);
    rig_stop(&r);
}
