/* test_window_server.c - a gemma3 model (sliding-window layers: kvcache.h
 * LAYER GROUPS; gemma3-tiny, window 16) behind the server, in process:
 *   - a chat on a pool answers (greedy) exactly what the same conversation
 *     without the pool answers on another agent, turn after turn, with
 *     contexts well past the window (the pooled agent releases its own
 *     references to the pool's local blocks, the pool keeps them);
 *   - a chat with a memory placed by reuse none answers, twice the same on
 *     two agents, its tokens counted as cached;
 *   - after a restart the agents come back warm (version 7 files with a
 *     base or segments) and answer as the agents they are compared with. */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server_rig.h"
#include "test.h"

#define GEMMA3 "models/gemma3-tiny.gguf"
#define WCTX 512
#define SYS_TEXT                                                                                                     \
    "You are a storyteller. Lily had a red ball. She liked to play with it in the park every day. One day a big "  \
    "dog came and took the ball. Lily was sad, but her mom said they would find it."
#define FACT "Max the dog liked to run after the ball near the pond and under the big old tree in the park."

/* A greedy chat: messages (a JSON array); agent, pool and memories (a JSON
 * array) may be NULL. */
static reply wchat(int port, const char *agent, const char *pool, const char *memories, const char *messages,
                   int max_tokens) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", "m");
    if (agent) cJSON_AddStringToObject(j, "agent_id", agent);
    if (pool) cJSON_AddStringToObject(j, "pool", pool);
    if (memories) {
        cJSON_AddItemToObject(j, "memories", cJSON_Parse(memories));
        cJSON_AddStringToObject(j, "reuse", "none");
    }
    cJSON_AddItemToObject(j, "messages", cJSON_Parse(messages));
    cJSON_AddNumberToObject(j, "max_tokens", max_tokens);
    cJSON_AddNumberToObject(j, "temperature", 0);
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    reply r = http(port, "POST", "/v1/chat/completions", body);
    free(body);
    return r;
}

static double cached(const reply *r) {
    return num(cJSON_GetObjectItem(cJSON_GetObjectItem(r->j, "usage"), "prompt_tokens_details"), "cached_tokens");
}

static const char *tier(const reply *r) { return str(cJSON_GetObjectItem(r->j, "agentkv"), "tier"); }

TEST(gemma3_window_server_pool_and_memory) {
    rig r;
    if (rig_start(t, &r, GEMMA3, 0, "window-server", AK_KV_F16, AK_KV_F16, WCTX) < 0) return;
    reply a = http(r.port, "POST", "/v1/pools",
                   "{\"id\":\"sys\",\"cache_type_k\":\"f16\",\"cache_type_v\":\"f16\",\"messages\":[{\"role\":"
                   "\"system\",\"content\":\"" SYS_TEXT "\"}]}");
    REQUIRE(a.status == 201 && num(a.j, "tokens") > 32, "pool: %d %s", a.status, a.body);
    reply_free(&a);
    a = http(r.port, "POST", "/v1/memories", "{\"id\":\"fact\",\"text\":\"" FACT "\"}");
    REQUIRE(a.status == 201 && num(a.j, "tokens") > 16, "memory: %d %s", a.status, a.body);
    int mtok = (int)num(a.j, "tokens");
    reply_free(&a);
    /* pooled against plain, two turns of 24 tokens each */
    const char *turns[2] = {"Tell me about Lily.", "What did the dog do?"};
    char conv[4096] = "", last_pooled[2048] = "";
    for (int turn = 0; turn < 2; turn++) {
        char own[4200], full[8400];
        size_t l = strlen(conv);
        snprintf(conv + l, sizeof conv - l, "%s{\"role\":\"user\",\"content\":\"%s\"}", l ? "," : "", turns[turn]);
        snprintf(own, sizeof own, "[%s]", conv);
        snprintf(full, sizeof full, "[{\"role\":\"system\",\"content\":\"%s\"},%s]", SYS_TEXT, conv);
        reply p = wchat(r.port, "pooled", "sys", NULL, own, 24);
        reply q = wchat(r.port, "plain", NULL, NULL, full, 24);
        REQUIRE(p.status == 200 && q.status == 200, "turn %d: %d %s / %d %s", turn, p.status, p.body, q.status, q.body);
        const char *pa = answer(&p), *qa = answer(&q);
        CHECK(pa && qa && pa[0] && !strcmp(pa, qa), "turn %d: pooled '%s' vs plain '%s'", turn, pa ? pa : "",
              qa ? qa : "");
        snprintf(last_pooled, sizeof last_pooled, "%s", pa ? pa : "");
        l = strlen(conv);
        cJSON *s = cJSON_CreateString(pa ? pa : "");
        char *esc = cJSON_PrintUnformatted(s);
        snprintf(conv + l, sizeof conv - l, ",{\"role\":\"assistant\",\"content\":%s}", esc);
        free(esc);
        cJSON_Delete(s);
        reply_free(&p);
        reply_free(&q);
    }
    /* a memory placed by reuse none, on two agents: the same answer */
    const char *mmsg = "[{\"role\":\"system\",\"content\":\"You tell short stories.\"},"
                       "{\"role\":\"user\",\"content\":\"Where did Max run?\"}]";
    reply m1 = wchat(r.port, "m1", NULL, "[\"fact\"]", mmsg, 24), m2 = wchat(r.port, "m2", NULL, "[\"fact\"]", mmsg, 24);
    REQUIRE(m1.status == 200 && m2.status == 200, "memory chats: %d %s / %d %s", m1.status, m1.body, m2.status, m2.body);
    CHECK(answer(&m1) && answer(&m2) && answer(&m1)[0] && !strcmp(answer(&m1), answer(&m2)) && cached(&m1) >= mtok,
          "memory chats: '%s' / '%s', %g cached of a memory of %d", answer(&m1) ? answer(&m1) : "",
          answer(&m2) ? answer(&m2) : "", cached(&m1), mtok);
    char m1a[2048];
    snprintf(m1a, sizeof m1a, "%s", answer(&m1) ? answer(&m1) : "");
    reply_free(&m1);
    reply_free(&m2);
    rig_stop(&r);

    /* a restart: the pooled agent and m1 come back warm and go on as the
     * plain agent and m2 (restored too) do */
    if (rig_start(t, &r, GEMMA3, 0, "window-server", AK_KV_F16, AK_KV_F16, WCTX) < 0) return;
    {
        char own[4200], full[8400];
        size_t l = strlen(conv);
        snprintf(conv + l, sizeof conv - l, ",{\"role\":\"user\",\"content\":\"And then?\"}");
        snprintf(own, sizeof own, "[%s]", conv);
        snprintf(full, sizeof full, "[{\"role\":\"system\",\"content\":\"%s\"},%s]", SYS_TEXT, conv);
        reply p = wchat(r.port, "pooled", "sys", NULL, own, 24);
        reply q = wchat(r.port, "plain", NULL, NULL, full, 24);
        REQUIRE(p.status == 200 && q.status == 200, "after the restart: %d %s / %d %s", p.status, p.body, q.status,
                q.body);
        CHECK(tier(&p) && !strcmp(tier(&p), "warm") && answer(&p) && answer(&q) && !strcmp(answer(&p), answer(&q)),
              "after the restart: pooled %s '%s' vs plain '%s'", tier(&p) ? tier(&p) : "?", answer(&p) ? answer(&p) : "",
              answer(&q) ? answer(&q) : "");
        reply_free(&p);
        reply_free(&q);
    }
    {
        char msg[4096];
        cJSON *s = cJSON_CreateString(m1a);
        char *esc = cJSON_PrintUnformatted(s);
        snprintf(msg, sizeof msg,
                 "[{\"role\":\"system\",\"content\":\"You tell short stories.\"},"
                 "{\"role\":\"user\",\"content\":\"Where did Max run?\"},{\"role\":\"assistant\",\"content\":%s},"
                 "{\"role\":\"user\",\"content\":\"Why?\"}]",
                 esc);
        free(esc);
        cJSON_Delete(s);
        reply x = wchat(r.port, "m1", NULL, "[\"fact\"]", msg, 24), y = wchat(r.port, "m2", NULL, "[\"fact\"]", msg, 24);
        REQUIRE(x.status == 200 && y.status == 200, "memory after the restart: %d %s / %d %s", x.status, x.body,
                y.status, y.body);
        /* (the reply's text does not tokenize back into the tokens
         * generated, so the history diverges inside the window: the
         * prompt is computed again, the memory placed again) */
        CHECK(tier(&x) && !strcmp(tier(&x), "warm") && cached(&x) >= mtok && answer(&x) && answer(&y) &&
                  !strcmp(answer(&x), answer(&y)),
              "memory after the restart: %s, %g cached (memory %d), '%s' vs '%s'", tier(&x) ? tier(&x) : "?",
              cached(&x), mtok, answer(&x) ? answer(&x) : "", answer(&y) ? answer(&y) : "");
        reply_free(&x);
        reply_free(&y);
    }
    rig_stop(&r);
}
