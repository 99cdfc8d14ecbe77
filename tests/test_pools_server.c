/* test_pools_server.c - pools and shared KV over HTTP, in process (model,
 * scheduler and server started here; loopback sockets with timeouts):
 *   - POST/GET/DELETE /v1/pools and their refusals;
 *   - a chat on a pool answers (greedy) exactly what the same conversation
 *     without the pool answers on another agent with the same K/V formats,
 *     turn after turn; the pooled agent reads the pool's blocks without
 *     holding them (private_bytes < bytes) and /metrics counts them once;
 *   - 8 agents on one pool fit a KV budget that 8 private copies would not;
 *   - 8 agents with the same long system prompt and no pool share its
 *     blocks automatically (content index): /metrics and /v1/agents show it;
 *   - unknown / invalid pools, a pool + prompt longer than the context,
 *     DELETE while attached (409 naming the agent), a corrupt pool file, a
 *     pool of another model; pools survive a restart. */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/buf.h"
#include "serve/server.h"
#include "server_rig.h"
#include "test.h"

#define N_CTX 1024

/* POST /v1/pools with a text or messages (JSON) prefix. */
static reply make_pool(int port, const char *id, const char *text, const char *messages) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    if (text) cJSON_AddStringToObject(j, "text", text);
    if (messages) cJSON_AddItemToObject(j, "messages", cJSON_Parse(messages));
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    reply r = http(port, "POST", "/v1/pools", body);
    free(body);
    return r;
}

/* A greedy chat turn: messages (a JSON array), agent and pool may be NULL. */
static reply chat(int port, const char *agent, const char *pool, const char *messages, int max_tokens) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", "m");
    if (agent) cJSON_AddStringToObject(j, "agent_id", agent);
    if (pool) cJSON_AddStringToObject(j, "pool", pool);
    cJSON_AddItemToObject(j, "messages", cJSON_Parse(messages));
    cJSON_AddNumberToObject(j, "max_tokens", max_tokens);
    cJSON_AddNumberToObject(j, "temperature", 0);
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    reply r = http(port, "POST", "/v1/chat/completions", body);
    free(body);
    return r;
}

/* The value of the sample "name value" in /metrics, or -1. */
static double metric(int port, const char *name) {
    reply r = http(port, "GET", "/metrics", NULL);
    double v = -1;
    size_t n = strlen(name);
    for (char *l = r.body; l && *l;) {
        if (!strncmp(l, name, n) && l[n] == ' ') { v = atof(l + n + 1); break; }
        char *nl = strchr(l, '\n');
        l = nl ? nl + 1 : NULL;
    }
    reply_free(&r);
    return v;
}

/* GET /v1/agents/id (status; the object in *out, to free). */
static int agent_get(int port, const char *id, cJSON **out) {
    char path[256];
    snprintf(path, sizeof path, "/v1/agents/%s", id);
    reply r = http(port, "GET", path, NULL);
    int st = r.status;
    *out = r.j;
    r.j = NULL;
    reply_free(&r);
    return st;
}

/* About n tokens of story text for long prefixes (deterministic). */
static char *story(int words) {
    static const char *const w[] = {"the", "little", "dog", "ran", "to", "the", "park", "and", "saw", "a", "big",
                                    "red", "ball", "near", "tree", "she", "was", "happy", "all", "day"};
    ak_buf b = {0};
    for (int i = 0; i < words; i++) ak_buf_printf(&b, "%s%s", i ? " " : "", w[(i * 7 + i / 20) % 20]);
    return ak_buf_take(&b);
}

/* ------------------------------------------------------------ the tests */

TEST(pools_server_create_list_get_delete) {
    rig r;
    if (rig_start(t, &r, "models/stories260K.gguf", 0, "pools-crud", AK_KV_Q8, AK_KV_TQ3, N_CTX) < 0) return;
    reply a = make_pool(r.port, "doc", "Once upon a time there was a little dog.", NULL);
    CHECK(a.status == 201, "create: %d %s", a.status, a.body);
    CHECK(str(a.j, "object") && !strcmp(str(a.j, "object"), "pool") && !strcmp(str(a.j, "id"), "doc"), "pool object");
    int tokens = (int)num(a.j, "tokens");
    CHECK(tokens > 5 && num(a.j, "bytes") > 0 && num(a.j, "file_bytes") > 0, "tokens %d bytes %g file %g", tokens,
          num(a.j, "bytes"), num(a.j, "file_bytes"));
    CHECK(!strcmp(str(a.j, "cache_type_k"), "q8") && !strcmp(str(a.j, "cache_type_v"), "tq3"), "default formats");
    CHECK(str(a.j, "hash") && strlen(str(a.j, "hash")) == 16, "hash");
    reply_free(&a);
    a = make_pool(r.port, "doc", "Something else.", NULL);
    CHECK(a.status == 409 && !strcmp(err_code(&a), "pool_exists"), "write-once: %d %s", a.status, a.body);
    reply_free(&a);
    a = make_pool(r.port, "bad/id", "x", NULL);
    CHECK(a.status == 400 && !strcmp(err_code(&a), "invalid_pool_id"), "invalid id: %d", a.status);
    reply_free(&a);
    a = http(r.port, "POST", "/v1/pools", "{\"id\":\"f\",\"text\":\"x\",\"cache_type_k\":\"q9\"}");
    CHECK(a.status == 400, "bad format name: %d", a.status);
    reply_free(&a);
    char *long_text = story(2000);
    a = make_pool(r.port, "long", long_text, NULL);
    free(long_text);
    CHECK(a.status == 400 && !strcmp(err_code(&a), "context_length_exceeded") && strstr(err_msg(&a), "1024"),
          "longer than the context: %d %s", a.status, a.body);
    reply_free(&a);
    a = make_pool(r.port, "sys", NULL, "[{\"role\":\"system\",\"content\":\"You tell short tales.\"}]");
    CHECK(a.status == 201, "messages pool: %d %s", a.status, a.body);
    reply_free(&a);
    a = http(r.port, "GET", "/v1/pools", NULL);
    cJSON *data = cJSON_GetObjectItem(a.j, "data");
    CHECK(a.status == 200 && cJSON_GetArraySize(data) == 2, "list: %d %s", a.status, a.body);
    CHECK(!strcmp(str(cJSON_GetArrayItem(data, 0), "id"), "doc") && !strcmp(str(cJSON_GetArrayItem(data, 1), "id"), "sys"),
          "sorted by id");
    reply_free(&a);
    a = http(r.port, "GET", "/v1/pools/doc", NULL);
    CHECK(a.status == 200 && (int)num(a.j, "tokens") == tokens && num(a.j, "readers") == 0, "get: %s", a.body);
    reply_free(&a);
    a = http(r.port, "GET", "/v1/pools/nope", NULL);
    CHECK(a.status == 404 && !strcmp(err_code(&a), "pool_not_found"), "get unknown: %d", a.status);
    reply_free(&a);
    a = http(r.port, "DELETE", "/v1/pools/doc", NULL);
    CHECK(a.status == 200 && cJSON_IsTrue(cJSON_GetObjectItem(a.j, "deleted")), "delete: %d %s", a.status, a.body);
    reply_free(&a);
    a = http(r.port, "GET", "/v1/pools/doc", NULL);
    CHECK(a.status == 404, "gone after delete: %d", a.status);
    reply_free(&a);
    a = http(r.port, "DELETE", "/v1/pools/doc", NULL);
    CHECK(a.status == 404, "delete twice: %d", a.status);
    reply_free(&a);
    a = make_pool(r.port, "doc", "A new text.", NULL);
    CHECK(a.status == 201, "an id is free again after delete: %d %s", a.status, a.body);
    reply_free(&a);
    rig_stop(&r);
}

/* The system prompt of the pooled-chat tests (~100 tokens). */
#define SYS_JSON(text) "[{\"role\":\"system\",\"content\":\"" text "\"}]"
#define SYS_TEXT "You are a storyteller. Lily had a red ball. She liked to play with it in the park every day. One day a big dog came and took the ball. Lily was sad, but her mom said they would find it. They looked under the tree and near the pond, and there it was."

TEST(pools_server_chat_equals_unpooled) {
    rig r;
    if (rig_start(t, &r, "models/stories260K.gguf", 0, "pools-chat", AK_KV_Q8, AK_KV_TQ3, N_CTX) < 0) return;
    reply a = make_pool(r.port, "sys", NULL, SYS_JSON(SYS_TEXT));
    REQUIRE(a.status == 201, "create: %d %s", a.status, a.body);
    double pool_bytes = num(a.j, "bytes");
    reply_free(&a);
    const char *turns[2] = {"Tell me about Lily.", "What did the dog do?"};
    char conv[4096] = "";   /* the request's own messages so far, without [ ] */
    for (int turn = 0; turn < 2; turn++) {
        char own[4200], full[8400];
        size_t l = strlen(conv);
        snprintf(conv + l, sizeof conv - l, "%s{\"role\":\"user\",\"content\":\"%s\"}", l ? "," : "", turns[turn]);
        snprintf(own, sizeof own, "[%s]", conv);
        snprintf(full, sizeof full, "[{\"role\":\"system\",\"content\":\"%s\"},%s]", SYS_TEXT, conv);
        reply p = chat(r.port, "pooled", "sys", own, 24);
        reply q = chat(r.port, "plain", NULL, full, 24);
        REQUIRE(p.status == 200 && q.status == 200, "turn %d: %d %s / %d %s", turn, p.status, p.body, q.status, q.body);
        const char *pa = answer(&p), *qa = answer(&q);
        CHECK(pa && qa && !strcmp(pa, qa) && pa[0], "turn %d: pooled '%s' vs plain '%s'", turn, pa ? pa : "",
              qa ? qa : "");
        cJSON *pu = cJSON_GetObjectItem(p.j, "usage"), *qu = cJSON_GetObjectItem(q.j, "usage");
        CHECK(num(pu, "prompt_tokens") == num(qu, "prompt_tokens"), "turn %d: same prompt (%g vs %g tokens)", turn,
              num(pu, "prompt_tokens"), num(qu, "prompt_tokens"));
        const char *pool_of = str(cJSON_GetObjectItem(p.j, "agentkv"), "pool");
        CHECK(pool_of && !strcmp(pool_of, "sys"), "the reply names its pool");
        /* the next turn carries the reply, as a client does */
        l = strlen(conv);
        cJSON *s = cJSON_CreateString(pa ? pa : "");
        char *esc = cJSON_PrintUnformatted(s);
        snprintf(conv + l, sizeof conv - l, ",{\"role\":\"assistant\",\"content\":%s}", esc);
        free(esc);
        cJSON_Delete(s);
        reply_free(&p);
        reply_free(&q);
    }
    cJSON *ag = NULL;
    REQUIRE(agent_get(r.port, "pooled", &ag) == 200, "GET /v1/agents/pooled");
    double bytes = num(ag, "bytes"), priv = num(ag, "private_bytes");
    CHECK(str(ag, "pool") && !strcmp(str(ag, "pool"), "sys"), "agent's pool: %s", str(ag, "pool") ? str(ag, "pool") : "null");
    CHECK(priv > 0 && priv < bytes && bytes - priv >= pool_bytes * 0.99, "pooled agent: bytes %g private %g pool %g",
          bytes, priv, pool_bytes);
    cJSON_Delete(ag);
    REQUIRE(agent_get(r.port, "plain", &ag) == 200, "GET /v1/agents/plain");
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(ag, "pool")), "an agent without a pool says null");
    double plain_bytes = num(ag, "bytes");
    cJSON_Delete(ag);
    /* the pool's blocks are held once: RAM in use is less than what the agents and the pool read */
    double used = metric(r.port, "agentkv_tier_bytes{tier=\"hot\"}");
    CHECK(used > 0 && used < bytes + plain_bytes + pool_bytes, "hot bytes %g < %g + %g + %g", used, bytes, plain_bytes,
          pool_bytes);
    CHECK(metric(r.port, "agentkv_kv_shared_bytes") >= pool_bytes * 0.99, "shared bytes %g (pool %g)",
          metric(r.port, "agentkv_kv_shared_bytes"), pool_bytes);
    CHECK(metric(r.port, "agentkv_kv_dedup_ratio") > 1.0, "dedup ratio %g", metric(r.port, "agentkv_kv_dedup_ratio"));
    CHECK(metric(r.port, "agentkv_pools") == 1 && metric(r.port, "agentkv_pools_resident") == 1, "pools gauges");
    a = http(r.port, "GET", "/v1/pools/sys", NULL);
    CHECK(a.status == 200 && num(a.j, "readers") >= 1, "the pool counts its reader: %s", a.body);
    reply_free(&a);
    /* DELETE while an agent is attached: 409 naming it */
    a = http(r.port, "DELETE", "/v1/pools/sys", NULL);
    CHECK(a.status == 409 && !strcmp(err_code(&a), "pool_busy") && strstr(err_msg(&a), "pooled"), "delete attached: %d %s",
          a.status, a.body);
    reply_free(&a);
    a = http(r.port, "DELETE", "/v1/agents/pooled", NULL);
    CHECK(a.status == 200, "delete the agent: %d", a.status);
    reply_free(&a);
    a = http(r.port, "DELETE", "/v1/pools/sys", NULL);
    CHECK(a.status == 200, "delete once nobody is attached: %d %s", a.status, a.body);
    reply_free(&a);
    rig_stop(&r);
}

/* 8 agents on one pool, all in RAM at once under a budget that 8 private
 * copies of the pool would exceed. */
TEST(pools_server_8_agents_fit_on_one_pool) {
    ak_error err = {0};
    char path[512];
    ak_model *m = ak_model_load(test_path(path, sizeof path, "models/stories260K.gguf"), NULL, NULL, &err);
    REQUIRE(m, "%s", err.msg);
    ak_block_pool *bp = ak_block_pool_new(&m->spec, 0, 0, &err);
    REQUIRE(bp, "%s", err.msg);
    size_t blk = ak_block_pool_block_bytes(bp, AK_KV_Q8, AK_KV_TQ3);
    int bt = ak_block_pool_block_tokens(bp);
    ak_block_pool_free(bp);
    ak_model_free(m);
    char *text = story(400);
    rig r;
    /* the pool (~20 blocks) + 8 agents x (~2 own blocks + a partial one); 8 copies need 8 x ~22 */
    size_t budget = blk * 60;
    if (rig_start(t, &r, "models/stories260K.gguf", budget, "pools-fit", AK_KV_Q8, AK_KV_TQ3, N_CTX) < 0) { free(text); return; }
    reply a = make_pool(r.port, "doc", text, NULL);
    free(text);
    REQUIRE(a.status == 201, "create: %d %s", a.status, a.body);
    int pool_tokens = (int)num(a.j, "tokens");
    reply_free(&a);
    CHECK(8 * ((pool_tokens + bt - 1) / bt + 2) > 60, "the budget must be too small for 8 copies (%d tokens)",
          pool_tokens);
    for (int i = 0; i < 8; i++) {
        char id[32], msg[128];
        snprintf(id, sizeof id, "reader-%d", i);
        snprintf(msg, sizeof msg, "[{\"role\":\"user\",\"content\":\"Question %d: who ran?\"}]", i);
        reply q = chat(r.port, id, "doc", msg, 8);
        CHECK(q.status == 200, "agent %d: %d %s", i, q.status, q.body);
        reply_free(&q);
    }
    int hot = 0;
    for (int i = 0; i < 8; i++) {
        char id[32];
        snprintf(id, sizeof id, "reader-%d", i);
        cJSON *ag = NULL;
        if (agent_get(r.port, id, &ag) == 200 && !strcmp(str(ag, "tier"), "hot")) hot++;
        cJSON_Delete(ag);
    }
    CHECK(hot == 8, "all 8 pooled agents in RAM at once: %d", hot);
    CHECK(metric(r.port, "agentkv_evictions_total") == 0, "nothing evicted");
    CHECK(metric(r.port, "agentkv_kv_dedup_ratio") > 4, "dedup ratio %g", metric(r.port, "agentkv_kv_dedup_ratio"));
    rig_stop(&r);
    /* a pool the whole budget cannot hold, even with nothing else in RAM: 503 */
    if (rig_start(t, &r, "models/stories260K.gguf", blk * 10, "pools-noroom", AK_KV_Q8, AK_KV_TQ3, N_CTX) < 0) return;
    text = story(400);   /* ~600 tokens: ~19 blocks */
    a = make_pool(r.port, "huge", text, NULL);
    free(text);
    CHECK(a.status == 503 && !strcmp(err_code(&a), "kv_budget"), "no KV room: %d %s", a.status, a.body);
    reply_free(&a);
    a = http(r.port, "GET", "/v1/pools/huge", NULL);
    CHECK(a.status == 404, "a failed create leaves no pool: %d", a.status);
    reply_free(&a);
    a = make_pool(r.port, "small", "A small pool fits.", NULL);
    CHECK(a.status == 201, "a pool that fits: %d %s", a.status, a.body);
    reply_free(&a);
    rig_stop(&r);
}

/* No pool: 8 agents with the same ~500-token system prompt link its full
 * blocks from the content index instead of holding 8 copies. */
TEST(pools_server_automatic_sharing_8_agents) {
    rig r;
    if (rig_start(t, &r, "models/stories260K.gguf", 0, "pools-auto", AK_KV_Q8, AK_KV_TQ3, N_CTX) < 0) return;
    char *sys = story(450);
    for (int i = 0; i < 8; i++) {
        char id[32];
        snprintf(id, sizeof id, "worker-%d", i);
        cJSON *msgs = cJSON_CreateArray(), *m0 = cJSON_CreateObject(), *m1 = cJSON_CreateObject();
        cJSON_AddStringToObject(m0, "role", "system");
        cJSON_AddStringToObject(m0, "content", sys);
        cJSON_AddStringToObject(m1, "role", "user");
        char q[64];
        snprintf(q, sizeof q, "Task %d.", i);
        cJSON_AddStringToObject(m1, "content", q);
        cJSON_AddItemToArray(msgs, m0);
        cJSON_AddItemToArray(msgs, m1);
        char *js = cJSON_PrintUnformatted(msgs);
        cJSON_Delete(msgs);
        reply a = chat(r.port, id, NULL, js, 4);
        free(js);
        CHECK(a.status == 200, "agent %d: %d %s", i, a.status, a.body);
        if (i == 0) CHECK(num(cJSON_GetObjectItem(a.j, "usage"), "prompt_tokens") > 400, "a ~500-token prompt");
        reply_free(&a);
    }
    free(sys);
    CHECK(metric(r.port, "agentkv_kv_dedup_ratio") > 3, "dedup ratio %g", metric(r.port, "agentkv_kv_dedup_ratio"));
    CHECK(metric(r.port, "agentkv_kv_linked_blocks_total") >= 7 * 10, "linked blocks %g",
          metric(r.port, "agentkv_kv_linked_blocks_total"));
    CHECK(metric(r.port, "agentkv_kv_shared_bytes") > 0, "shared bytes");
    int sharing = 0;
    for (int i = 0; i < 8; i++) {
        char id[32];
        snprintf(id, sizeof id, "worker-%d", i);
        cJSON *ag = NULL;
        if (agent_get(r.port, id, &ag) == 200 && num(ag, "private_bytes") * 2 < num(ag, "bytes")) sharing++;
        CHECK(cJSON_IsNull(cJSON_GetObjectItem(ag, "pool")), "no pool");
        cJSON_Delete(ag);
    }
    CHECK(sharing == 8, "agents holding less than half of what they read alone: %d of 8", sharing);
    rig_stop(&r);
}

TEST(pools_server_bad_requests) {
    rig r;
    if (rig_start(t, &r, "models/stories260K.gguf", 0, "pools-bad", AK_KV_Q8, AK_KV_TQ3, N_CTX) < 0) return;
    reply a = chat(r.port, NULL, "nope", "[{\"role\":\"user\",\"content\":\"Hi\"}]", 4);
    CHECK(a.status == 404 && !strcmp(err_code(&a), "pool_not_found"), "unknown pool: %d %s", a.status, a.body);
    reply_free(&a);
    a = chat(r.port, NULL, ".hidden", "[{\"role\":\"user\",\"content\":\"Hi\"}]", 4);
    CHECK(a.status == 400 && !strcmp(err_code(&a), "invalid_pool_id"), "invalid pool id: %d %s", a.status, a.body);
    reply_free(&a);
    char *text = story(400);
    a = make_pool(r.port, "big", text, NULL);
    REQUIRE(a.status == 201, "create: %d %s", a.status, a.body);
    int n = (int)num(a.j, "tokens");
    reply_free(&a);
    /* pool + request over the context */
    char *msg = story(N_CTX - n + 50);
    cJSON *msgs = cJSON_CreateArray(), *m0 = cJSON_CreateObject();
    cJSON_AddStringToObject(m0, "role", "user");
    cJSON_AddStringToObject(m0, "content", msg);
    cJSON_AddItemToArray(msgs, m0);
    char *js = cJSON_PrintUnformatted(msgs);
    cJSON_Delete(msgs);
    a = chat(r.port, "long", "big", js, 4);
    CHECK(a.status == 400 && !strcmp(err_code(&a), "context_length_exceeded"), "too long: %d %s", a.status, a.body);
    reply_free(&a);
    free(js);
    free(msg);
    free(text);
    /* an anonymous request on the pool, and a completion on it */
    a = chat(r.port, NULL, "big", "[{\"role\":\"user\",\"content\":\"Who ran?\"}]", 4);
    CHECK(a.status == 200, "anonymous pooled chat: %d %s", a.status, a.body);
    reply_free(&a);
    a = http(r.port, "POST", "/v1/completions",
             "{\"model\":\"m\",\"pool\":\"big\",\"prompt\":\" and then\",\"max_tokens\":4,\"temperature\":0}");
    CHECK(a.status == 200 && num(cJSON_GetObjectItem(a.j, "usage"), "prompt_tokens") > n, "pooled completion: %d %s",
          a.status, a.body);
    reply_free(&a);
    rig_stop(&r);
}

/* Flips one byte near the end of path (tensor data). Returns 0 or -1. */
static int flip_byte(const char *path) {
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    int rc = -1;
    if (fseek(f, -3, SEEK_END) == 0) {
        int c = fgetc(f);
        if (c != EOF && fseek(f, -1, SEEK_CUR) == 0 && fputc(c ^ 0x40, f) != EOF) rc = 0;
    }
    return fclose(f) == 0 ? rc : -1;
}

TEST(pools_server_restart_corrupt_and_stale) {
    rig r;
    const char *mem = "pools-restart";
    if (rig_start(t, &r, "models/stories260K.gguf", 0, mem, AK_KV_Q8, AK_KV_TQ3, N_CTX) < 0) return;
    reply a = make_pool(r.port, "keep", NULL, SYS_JSON(SYS_TEXT));
    CHECK(a.status == 201, "create keep: %d %s", a.status, a.body);
    reply_free(&a);
    a = make_pool(r.port, "broken", "The cat sat on the mat and looked at the moon.", NULL);
    CHECK(a.status == 201, "create broken: %d %s", a.status, a.body);
    reply_free(&a);
    const char *q = "[{\"role\":\"user\",\"content\":\"Tell me about Lily.\"}]";
    a = chat(r.port, "keeper", "keep", q, 16);
    REQUIRE(a.status == 200, "chat: %d %s", a.status, a.body);
    char *before = strdup(answer(&a) ? answer(&a) : "");
    reply_free(&a);
    rig_stop(&r);
    /* another model's pool in the same directory */
    if (rig_start(t, &r, "models/tiny-llama-h64-gqa-f16.gguf", 0, mem, AK_KV_Q8, AK_KV_TQ3, N_CTX) < 0) { free(before); return; }
    a = make_pool(r.port, "other", "The kernel maps pages.", NULL);
    CHECK(a.status == 201, "create other (another model): %d %s", a.status, a.body);
    reply_free(&a);
    rig_stop(&r);
    char path[600];
    snprintf(path, sizeof path, "%s/%s/pools/broken.safetensors", test_tmp_dir(), mem);
    CHECK(flip_byte(path) == 0, "cannot flip a byte of %s", path);
    if (rig_start(t, &r, "models/stories260K.gguf", 0, mem, AK_KV_Q8, AK_KV_TQ3, N_CTX) < 0) { free(before); return; }
    a = http(r.port, "GET", "/v1/pools/keep", NULL);
    CHECK(a.status == 200, "the pool survived the restart: %d %s", a.status, a.body);
    reply_free(&a);
    /* the agent comes back warm on its pool and answers as before */
    a = chat(r.port, "fresh", "keep", q, 16);
    CHECK(a.status == 200 && answer(&a) && !strcmp(answer(&a), before), "after restart: '%s' vs '%s'",
          answer(&a) ? answer(&a) : a.body, before);
    reply_free(&a);
    free(before);
    a = chat(r.port, NULL, "broken", q, 4);
    CHECK((a.status == 500 || a.status == 409) && !strcmp(err_code(&a), "pool_corrupt"), "corrupt pool: %d %s",
          a.status, a.body);
    reply_free(&a);
    a = chat(r.port, NULL, "other", q, 4);
    CHECK(a.status == 409 && !strcmp(err_code(&a), "pool_stale"), "another model's pool: %d %s", a.status, a.body);
    reply_free(&a);
    a = chat(r.port, "bystander", NULL, q, 4);
    CHECK(a.status == 200, "other agents are still served: %d %s", a.status, a.body);
    reply_free(&a);
    rig_stop(&r);
}

/* agentkv pool create (offline) makes what POST /v1/pools makes: a server
 * started on the directory serves chats on it exactly like a pool made over
 * HTTP; ls lists it with its agents; rm refuses while an agent file starts
 * with it (naming the agent) unless --force. */
TEST(pools_cli_create_serve_rm) {
    char mem[600], model[512], args[2048], *out = NULL;
    snprintf(mem, sizeof mem, "%s/pools-cli", test_tmp_dir());
    test_path(model, sizeof model, "models/stories260K.gguf");
    char msgs[700];
    snprintf(msgs, sizeof msgs, "%s/pools-cli-msgs.json", test_tmp_dir());
    FILE *f = fopen(msgs, "w");
    REQUIRE(f, "cannot write %s", msgs);
    fputs(SYS_JSON(SYS_TEXT), f);
    fclose(f);
    snprintf(args, sizeof args, "pool create --model %s --memory %s --id crew --messages-json %s -c %d", model, mem,
             msgs, N_CTX);
    int rc = run_cli(args, &out);
    REQUIRE(rc == 0, "pool create: exit %d: %s", rc, out);
    free(out);
    rig r;
    if (rig_start(t, &r, "models/stories260K.gguf", 0, "pools-cli", AK_KV_Q8, AK_KV_TQ3, N_CTX) < 0) return;
    reply a = make_pool(r.port, "crew-http", NULL, SYS_JSON(SYS_TEXT));
    CHECK(a.status == 201, "the same pool over HTTP: %d %s", a.status, a.body);
    reply_free(&a);
    a = http(r.port, "GET", "/v1/pools/crew", NULL);
    reply b = http(r.port, "GET", "/v1/pools/crew-http", NULL);
    CHECK(a.status == 200 && b.status == 200 && num(a.j, "tokens") == num(b.j, "tokens") &&
          !strcmp(str(a.j, "hash"), str(b.j, "hash")), "CLI and HTTP pools alike: %s / %s", a.body, b.body);
    reply_free(&a);
    reply_free(&b);
    const char *q = "[{\"role\":\"user\",\"content\":\"Tell me about Lily.\"}]";
    a = chat(r.port, "cli-agent", "crew", q, 16);
    b = chat(r.port, "http-agent", "crew-http", q, 16);
    CHECK(a.status == 200 && b.status == 200 && answer(&a) && answer(&b) && !strcmp(answer(&a), answer(&b)),
          "answers: %s / %s", a.body, b.body);
    reply_free(&a);
    reply_free(&b);
    rig_stop(&r);
    snprintf(args, sizeof args, "pool ls --memory %s", mem);
    rc = run_cli(args, &out);
    CHECK(rc == 0 && strstr(out, "crew") && strstr(out, "crew-http"), "ls: exit %d: %s", rc, out);
    free(out);
    snprintf(args, sizeof args, "pool rm crew --memory %s", mem);
    rc = run_cli(args, &out);
    CHECK(rc == 1 && strstr(out, "cli-agent"), "rm while an agent file starts with it: exit %d: %s", rc, out);
    free(out);
    snprintf(args, sizeof args, "pool rm crew --memory %s --force", mem);
    rc = run_cli(args, &out);
    CHECK(rc == 0, "rm --force: exit %d: %s", rc, out);
    free(out);
    snprintf(args, sizeof args, "pool inspect crew --memory %s", mem);
    rc = run_cli(args, &out);
    CHECK(rc == 1, "inspect after rm: exit %d: %s", rc, out);
    free(out);
}
