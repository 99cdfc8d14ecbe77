/* test_memories_server.c - memory chunks over HTTP, in process (model,
 * scheduler and server started here; loopback sockets with timeouts):
 *   - POST/GET/DELETE /v1/memories: made once (201, computed), the same id
 *     and text again (200, not computed), another id with the same text
 *     (shared: not computed, two sharers), listed, its text returned;
 *   - a chat with "memories" and reuse none places the chunk (its tokens
 *     counted as cached, not prefilled; the prompt holds the chunk's
 *     tokens: prompt_tokens grows by them), answers greedily the same
 *     twice, and its next turn extends through the chunk; reuse full
 *     computes the same prompt as a plain one: an agent whose first turn
 *     was full answers its second turn as an anonymous full request does;
 *   - bad input by status and code: bad JSON, hostile ids, missing or too
 *     long text, bad formats, unknown memories (404), an unknown method, a
 *     ratio outside [0, 1] or not a number, memories on a completion, more
 *     memory tokens than the context (400 context_length_exceeded), with
 *     reuse none, cacheblend and agentkvshift;
 *   - cacheblend and agentkvshift: recomputed tokens reported (ceil(r n)
 *     of the chunk), at ratio 1 the answer is full's, the agent's next turn
 *     extends through the chunk;
 *   - memories survive a restart; a corrupt file is 500 memory_corrupt (and
 *     quarantined), another model's file 409 memory_stale. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "agents/memories.h"
#include "store/store.h"
#include "server_rig.h"
#include "test.h"

#define N_CTX 256
#define MODEL "models/stories260K.gguf"

static const char *FACT =
    "Lily had a red ball. She liked to play with it in the park every day after school with her dog Max.";

/* POST /v1/memories {id, text} (formats: NULL for the default). */
static reply add_memory(int port, const char *id, const char *text, const char *ctk) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "text", text);
    if (ctk) cJSON_AddStringToObject(j, "cache_type_k", ctk);
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    reply r = http(port, "POST", "/v1/memories", body);
    free(body);
    return r;
}

/* A greedy chat: a system message and one user message; memories (a JSON
 * array or NULL), reuse (NULL: absent), extra (a JSON object's members
 * merged, or NULL). */
static reply chat(int port, const char *agent, const char *memories, const char *reuse, const char *user,
                  const char *extra, int max_tokens) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", "m");
    if (agent) cJSON_AddStringToObject(j, "agent_id", agent);
    if (memories) cJSON_AddItemToObject(j, "memories", cJSON_Parse(memories));
    if (reuse) cJSON_AddStringToObject(j, "reuse", reuse);
    char msgs[1024];
    snprintf(msgs, sizeof msgs,
             "[{\"role\":\"system\",\"content\":\"You tell short stories.\"},{\"role\":\"user\",\"content\":\"%s\"}]",
             user);
    cJSON_AddItemToObject(j, "messages", cJSON_Parse(msgs));
    cJSON_AddNumberToObject(j, "max_tokens", max_tokens);
    cJSON_AddNumberToObject(j, "temperature", 0);
    json_merge(j, extra);
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    reply r = http(port, "POST", "/v1/chat/completions", body);
    free(body);
    return r;
}

static double usage(const reply *r, const char *name) { return num(cJSON_GetObjectItem(r->j, "usage"), name); }
static double cached(const reply *r) {
    return num(cJSON_GetObjectItem(cJSON_GetObjectItem(r->j, "usage"), "prompt_tokens_details"), "cached_tokens");
}

TEST(memories_server_crud_and_bad_bodies) {
    rig r;
    if (rig_start(t, &r, MODEL, 0, "mem-crud", AK_KV_F16, AK_KV_F16, N_CTX) < 0) return;
    reply a = add_memory(r.port, "fact1", FACT, NULL);
    CHECK(a.status == 201 && cJSON_IsTrue(cJSON_GetObjectItem(a.j, "computed")) && num(a.j, "tokens") > 10 &&
              !strcmp(str(a.j, "cache_type_k"), "f16"),
          "add: %d %s", a.status, a.body);
    int ntok = (int)num(a.j, "tokens");
    char hash[17];
    snprintf(hash, sizeof hash, "%s", str(a.j, "hash") ? str(a.j, "hash") : "");
    reply b = add_memory(r.port, "fact1", FACT, NULL);
    CHECK(b.status == 200 && cJSON_IsFalse(cJSON_GetObjectItem(b.j, "computed")), "again: %d %s", b.status, b.body);
    reply c = add_memory(r.port, "fact2", FACT, NULL);
    CHECK(c.status == 201 && cJSON_IsFalse(cJSON_GetObjectItem(c.j, "computed")) && num(c.j, "sharers") == 2 &&
              !strcmp(str(c.j, "hash"), hash),
          "same text, other id: %d %s", c.status, c.body);
    reply d = add_memory(r.port, "fact1", "Another text entirely.", NULL);
    CHECK(d.status == 409 && !strcmp(err_code(&d), "memory_exists"), "other text under an id: %d %s", d.status, d.body);
    reply q = add_memory(r.port, "factq", FACT, "q8");
    CHECK(q.status == 201 && cJSON_IsTrue(cJSON_GetObjectItem(q.j, "computed")) && strcmp(str(q.j, "hash"), hash),
          "other formats: %d %s", q.status, q.body);
    reply l = http(r.port, "GET", "/v1/memories", NULL);
    CHECK(l.status == 200 && cJSON_GetArraySize(cJSON_GetObjectItem(l.j, "data")) == 3, "list: %s", l.body);
    reply g = http(r.port, "GET", "/v1/memories/fact1", NULL);
    CHECK(g.status == 200 && str(g.j, "text") && !strcmp(str(g.j, "text"), FACT) && num(g.j, "tokens") == ntok,
          "get: %s", g.body);
    reply del = http(r.port, "DELETE", "/v1/memories/fact2", NULL);
    reply g2 = http(r.port, "GET", "/v1/memories/fact2", NULL);
    reply del2 = http(r.port, "DELETE", "/v1/memories/fact2", NULL);
    CHECK(del.status == 200 && g2.status == 404 && !strcmp(err_code(&g2), "memory_not_found") && del2.status == 404,
          "delete: %d, get after %d, again %d", del.status, g2.status, del2.status);
    /* bad bodies and ids */
    struct { const char *body; int status; const char *code; } bad[] = {
        {.body = "{not json", .status = 400, .code = "invalid_json"},
        {.body = "[]", .status = 400, .code = "invalid_type"},
        {.body = "{\"text\":\"x\"}", .status = 400, .code = "missing_required_parameter"},
        {.body = "{\"id\":\"../etc\",\"text\":\"x\"}", .status = 400, .code = "invalid_memory_id"},
        {.body = "{\"id\":\".hidden\",\"text\":\"x\"}", .status = 400, .code = "invalid_memory_id"},
        {.body = "{\"id\":\"a/b\",\"text\":\"x\"}", .status = 400, .code = "invalid_memory_id"},
        {.body = "{\"id\":7,\"text\":\"x\"}", .status = 400, .code = "invalid_memory_id"},
        {.body = "{\"id\":\"ok\"}", .status = 400, .code = "missing_required_parameter"},
        {.body = "{\"id\":\"ok\",\"text\":\"\"}", .status = 400, .code = "invalid_value"},
        {.body = "{\"id\":\"ok\",\"text\":5}", .status = 400, .code = "invalid_type"},
        {.body = "{\"id\":\"ok\",\"text\":\"x\",\"cache_type_k\":\"q17\"}", .status = 400, .code = "invalid_value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        reply x = http(r.port, "POST", "/v1/memories", bad[i].body);
        CHECK(x.status == bad[i].status && !strcmp(err_code(&x), bad[i].code), "%s: %d %s (want %d %s)", bad[i].body,
              x.status, x.body, bad[i].status, bad[i].code);
        reply_free(&x);
    }
    /* text longer than the context */
    char *big = malloc(8 * N_CTX + 1);
    for (int i = 0; i < 8 * N_CTX; i++) big[i] = "ab cd "[i % 6];
    big[8 * N_CTX] = 0;
    reply lg = add_memory(r.port, "big", big, NULL);
    CHECK(lg.status == 400, "a text longer than the context: %d %s", lg.status, lg.body);
    free(big);
    reply hx = http(r.port, "GET", "/v1/memories/.x", NULL);
    reply mx = http(r.port, "PUT", "/v1/memories/fact1", NULL);
    CHECK(hx.status == 400 && !strcmp(err_code(&hx), "invalid_memory_id") && mx.status == 405, "url: %d %d", hx.status,
          mx.status);
    reply ls2 = http(r.port, "GET", "/v1/memories", NULL);
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(ls2.j, "data")) == 2, "refusals added memories: %s", ls2.body);
    reply *all[] = {&a, &b, &c, &d, &q, &l, &g, &del, &g2, &del2, &lg, &hx, &mx, &ls2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) reply_free(all[i]);
    rig_stop(&r);
}

TEST(memories_server_chat_none_and_full) {
    rig r;
    if (rig_start(t, &r, MODEL, 0, "mem-chat", AK_KV_F16, AK_KV_F16, N_CTX) < 0) return;
    reply a = add_memory(r.port, "fact", FACT, NULL);
    REQUIRE(a.status == 201, "add: %s", a.body);
    int ntok = (int)num(a.j, "tokens");
    reply_free(&a);
    reply plain = chat(r.port, "p", NULL, NULL, "Tell me about Lily.", NULL, 8);
    reply none = chat(r.port, "n", "[\"fact\"]", "none", "Tell me about Lily.", NULL, 8);
    reply none2 = chat(r.port, "n2", "[\"fact\"]", NULL, "Tell me about Lily.", NULL, 8);
    REQUIRE(plain.status == 200 && none.status == 200 && none2.status == 200, "chats: %d %d %d %s", plain.status,
            none.status, none2.status, none.body);
    CHECK(usage(&none, "prompt_tokens") == usage(&plain, "prompt_tokens") + ntok,
          "the prompt with the memory: %g tokens, without %g, the memory %d", usage(&none, "prompt_tokens"),
          usage(&plain, "prompt_tokens"), ntok);
    CHECK(cached(&none) >= ntok, "the chunk was computed, not placed: cached %g of %d", cached(&none), ntok);
    CHECK(answer(&none) && answer(&none2) && !strcmp(answer(&none), answer(&none2)),
          "reuse none (default) twice: \"%s\" vs \"%s\"", answer(&none), answer(&none2));
    /* the next turn of the agent extends through the placed chunk */
    reply next = chat(r.port, "n", "[\"fact\"]", "none", "Tell me about Lily.", NULL, 8);
    CHECK(next.status == 200 && cached(&next) >= usage(&none, "prompt_tokens") - 1, "next turn: cached %g of %g",
          cached(&next), usage(&next, "prompt_tokens"));
    /* an anonymous request places it too (on an internal agent) */
    reply anon = chat(r.port, NULL, "[\"fact\"]", "none", "Tell me about Lily.", NULL, 8);
    CHECK(anon.status == 200 && cached(&anon) >= ntok && answer(&anon) && !strcmp(answer(&anon), answer(&none)),
          "anonymous: %d cached %g, \"%s\"", anon.status, cached(&anon), answer(&anon));
    reply_free(&anon);
    /* full: the same prompt as a plain one */
    reply full = chat(r.port, "f", "[\"fact\"]", "full", "Tell me about Lily.", NULL, 8);
    reply full2 = chat(r.port, NULL, "[\"fact\"]", "full", "Tell me about Lily.", NULL, 8);
    CHECK(full.status == 200 && usage(&full, "prompt_tokens") == usage(&none, "prompt_tokens") && cached(&full) < ntok,
          "full: %d, %g tokens, cached %g", full.status, usage(&full, "prompt_tokens"), cached(&full));
    CHECK(answer(&full) && answer(&full2) && !strcmp(answer(&full), answer(&full2)), "full twice: \"%s\" vs \"%s\"",
          answer(&full), answer(&full2));
    /* full on the agent that placed the chunk: nothing from the chunk on is reused, the answer is full's */
    reply fn = chat(r.port, "n", "[\"fact\"]", "full", "Tell me about Lily.", NULL, 8);
    CHECK(fn.status == 200 && cached(&fn) < usage(&fn, "prompt_tokens") - ntok && answer(&fn) && answer(&full) &&
              !strcmp(answer(&fn), answer(&full)),
          "full after none: cached %g of %g, \"%s\" vs \"%s\"", cached(&fn), usage(&fn, "prompt_tokens"), answer(&fn),
          answer(&full));
    reply_free(&fn);
    printf("    reuse none: \"%s\"; full: \"%s\"\n", answer(&none) ? answer(&none) : "", answer(&full) ? answer(&full) : "");
    /* bad requests */
    struct { const char *mem, *reuse, *extra; int status; const char *code; } bad[] = {
        {.mem = "[\"nope\"]", .reuse = NULL, .extra = NULL, .status = 404, .code = "memory_not_found"},
        {.mem = "[\"../x\"]", .reuse = NULL, .extra = NULL, .status = 400, .code = "invalid_memory_id"},
        {.mem = "[5]", .reuse = NULL, .extra = NULL, .status = 400, .code = "invalid_type"},
        {.mem = "\"fact\"", .reuse = NULL, .extra = NULL, .status = 400, .code = "invalid_type"},
        {.mem = "[]", .reuse = NULL, .extra = NULL, .status = 400, .code = "invalid_value"},
        {.mem = "[\"fact\",\"fact\",\"fact\",\"fact\",\"fact\",\"fact\",\"fact\"]", .reuse = NULL, .extra = NULL,
         .status = 400, .code = "invalid_value"},
        {.mem = "[\"nope\"]", .reuse = "agentkvshift", .extra = NULL, .status = 404, .code = "memory_not_found"},
        {.mem = "[\"nope\"]", .reuse = "cacheblend", .extra = NULL, .status = 404, .code = "memory_not_found"},
        {.mem = "[\"fact\"]", .reuse = "agentkvshift", .extra = "{\"recompute_ratio\": 1.01}", .status = 400,
         .code = "invalid_value"},
        {.mem = "[\"fact\"]", .reuse = "cacheblend", .extra = "{\"recompute_ratio\": -1}", .status = 400,
         .code = "invalid_value"},
        {.mem = "[\"fact\"]", .reuse = "agentkvshift", .extra = "{\"recompute_ratio\": \"0.1\"}", .status = 400,
         .code = "invalid_type"},
        {.mem = "[\"fact\"]", .reuse = NULL, .extra = "{\"reuse\": 3}", .status = 400, .code = "invalid_type"},
        {.mem = "[\"fact\"]", .reuse = "sometimes", .extra = NULL, .status = 400, .code = "invalid_value"},
        {.mem = "[\"fact\"]", .reuse = "none", .extra = "{\"recompute_ratio\": 1.5}", .status = 400,
         .code = "invalid_value"},
        {.mem = "[\"fact\"]", .reuse = "none", .extra = "{\"recompute_ratio\": -0.1}", .status = 400,
         .code = "invalid_value"},
        {.mem = "[\"fact\"]", .reuse = "none", .extra = "{\"pool\": \"p\"}", .status = 404, .code = "pool_not_found"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        reply x = chat(r.port, "bad", bad[i].mem, bad[i].reuse, "Hi.", bad[i].extra, 4);
        CHECK(x.status == bad[i].status && !strcmp(err_code(&x), bad[i].code), "%s %s %s: %d %s (want %d %s)",
              bad[i].mem, bad[i].reuse ? bad[i].reuse : "-", bad[i].extra ? bad[i].extra : "", x.status, x.body,
              bad[i].status, bad[i].code);
        reply_free(&x);
    }
    reply ok = chat(r.port, "ok", "[\"fact\"]", "none", "Hi.", "{\"recompute_ratio\": 0.3}", 4);
    CHECK(ok.status == 200, "a ratio in range with none: %d %s", ok.status, ok.body);
    reply cm = http(r.port, "POST", "/v1/completions",
                    "{\"model\":\"m\",\"prompt\":\"Once\",\"memories\":[\"fact\"],\"max_tokens\":2}");
    CHECK(cm.status == 400 && !strcmp(err_code(&cm), "invalid_value"), "a completion with memories: %d %s", cm.status,
          cm.body);
    /* more memory tokens than the context: a long chunk, named as often as it takes */
    char longtext[1024];
    snprintf(longtext, sizeof longtext, "%s %s %s", FACT, FACT, FACT);
    reply lm = add_memory(r.port, "long", longtext, NULL);
    REQUIRE(lm.status == 201, "long: %s", lm.body);
    int nl = (int)num(lm.j, "tokens"), k = N_CTX / nl + 1;
    reply_free(&lm);
    REQUIRE(k <= AK_MAX_MEMORIES, "the long memory is too short (%d tokens)", nl);
    char many[256] = "[";
    for (int i = 0; i < k; i++) strcat(many, i ? ",\"long\"" : "\"long\"");
    strcat(many, "]");
    reply too = chat(r.port, "too", many, "none", "Hi.", NULL, 4);
    CHECK(too.status == 400 && !strcmp(err_code(&too), "context_length_exceeded"), "%d chunks of %d: %d %s", k, nl,
          too.status, too.body);
    for (int m = 0; m < 2; m++) {
        reply tb = chat(r.port, "too", many, m ? "agentkvshift" : "cacheblend", "Hi.", NULL, 4);
        CHECK(tb.status == 400 && !strcmp(err_code(&tb), "context_length_exceeded"), "%s: %d %s", m ? "akvs" : "cb",
              tb.status, tb.body);
        reply_free(&tb);
    }
    reply *all[] = {&plain, &none, &none2, &next, &full, &full2, &ok, &cm, &too};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) reply_free(all[i]);
    rig_stop(&r);
}

TEST(memories_server_restart_corrupt_and_stale) {
    rig r;
    if (rig_start(t, &r, MODEL, 0, "mem-restart", AK_KV_F16, AK_KV_F16, N_CTX) < 0) return;
    reply a = add_memory(r.port, "keep", FACT, NULL), b = add_memory(r.port, "spoil", "The sun was warm and bright.", NULL);
    REQUIRE(a.status == 201 && b.status == 201, "add: %s %s", a.body, b.body);
    reply before = chat(r.port, "x", "[\"keep\"]", "none", "Tell me about Lily.", NULL, 8);
    REQUIRE(before.status == 200, "chat: %s", before.body);
    char dir[600];
    snprintf(dir, sizeof dir, "%s", ak_store_dir(r.store));
    rig_stop(&r);
    /* spoil one file while the server is down */
    char path[700];
    snprintf(path, sizeof path, "%s/memories/spoil.safetensors", dir);
    size_t len;
    ak_error err = {{0}};
    uint8_t *img = (uint8_t *)ak_read_file(path, &len, &err);
    REQUIRE(img && len > 64, "read %s: %s", path, err.msg);
    img[len - 5] ^= 0x10;
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(img, 1, len, f) == len, "write");
    fclose(f);
    free(img);
    if (rig_start(t, &r, MODEL, 0, "mem-restart", AK_KV_F16, AK_KV_F16, N_CTX) < 0) return;
    reply l = http(r.port, "GET", "/v1/memories", NULL);
    CHECK(l.status == 200 && cJSON_GetArraySize(cJSON_GetObjectItem(l.j, "data")) == 2, "after a restart: %s", l.body);
    reply after = chat(r.port, "y", "[\"keep\"]", "none", "Tell me about Lily.", NULL, 8);
    CHECK(after.status == 200 && answer(&after) && answer(&before) && !strcmp(answer(&after), answer(&before)),
          "after a restart: \"%s\" vs \"%s\"", answer(&after), answer(&before));
    reply sp = chat(r.port, "z", "[\"spoil\"]", "none", "Hi.", NULL, 4);
    CHECK(sp.status == 500 && !strcmp(err_code(&sp), "memory_corrupt"), "corrupt: %d %s", sp.status, sp.body);
    CHECK(access(path, F_OK) != 0, "the corrupt file is still in place");
    /* a memory another model made: refused as stale */
    ak_kv *kv = ak_kv_new(r.pool, AK_KV_F16, AK_KV_F16, N_CTX, &err);
    int32_t toks[4] = {10, 11, 12, 13};
    REQUIRE(kv && ak_kv_prepare(kv, 0, 4, &err) == 0 && ak_kv_set_length(kv, 4, &err) == 0, "kv: %s", err.msg);
    REQUIRE(ak_store_save_memory(r.store, &(ak_store_save_args){.id = "alien", .kv = kv, .tokens = toks, .n_tokens = 4,
                                 .source = "x", .fingerprint = "some-other-model", .model_name = "other"},
                                 &err) == 0, "save: %s",
            err.msg);
    ak_kv_free(kv);
    reply st = chat(r.port, "w", "[\"alien\"]", "none", "Hi.", NULL, 4);
    CHECK(st.status == 409 && !strcmp(err_code(&st), "memory_stale"), "another model's: %d %s", st.status, st.body);
    reply st2 = chat(r.port, "w", "[\"alien\"]", "agentkvshift", "Hi.", "{\"recompute_ratio\": 0.2}", 4);
    CHECK(st2.status == 409 && !strcmp(err_code(&st2), "memory_stale"), "another model's, agentkvshift: %d %s",
          st2.status, st2.body);
    reply_free(&st2);
    reply *all[] = {&a, &b, &before, &l, &after, &sp, &st};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) reply_free(all[i]);
    rig_stop(&r);
}

/* agentkv memory add|ls|rm on a memory directory, then a server started on
 * it places the memory the CLI made. */
TEST(memories_cli_add_ls_rm) {
    rig r;
    if (rig_start(t, &r, MODEL, 0, "mem-cli", AK_KV_F16, AK_KV_F16, N_CTX) < 0) return;
    char dir[600], model[600], args[2048];
    snprintf(dir, sizeof dir, "%s", ak_store_dir(r.store));
    rig_stop(&r);
    test_path(model, sizeof model, MODEL);
    char *out = NULL;
    snprintf(args, sizeof args, "memory add -m %s --memory %s --id cli1 -ctk f16 -ctv f16 --text '%s'", model, dir, FACT);
    int rc = run_cli(args, &out);
    CHECK(rc == 0 && out && strstr(out, "memory cli1:") && strstr(out, "computed"), "add: %d %s", rc, out ? out : "");
    free(out);
    snprintf(args, sizeof args, "memory add -m %s --memory %s --id cli2 -ctk f16 -ctv f16 --text '%s'", model, dir, FACT);
    rc = run_cli(args, &out);
    CHECK(rc == 0 && out && strstr(out, "shared"), "add the same text: %d %s", rc, out ? out : "");
    free(out);
    snprintf(args, sizeof args, "memory add -m %s --memory %s --id ../x --text hi", model, dir);
    rc = run_cli(args, &out);
    CHECK(rc == 2, "a hostile id: %d %s", rc, out ? out : "");
    free(out);
    snprintf(args, sizeof args, "memory ls --json --memory %s", dir);
    rc = run_cli(args, &out);
    cJSON *l = out ? cJSON_Parse(out) : NULL;
    CHECK(rc == 0 && cJSON_GetArraySize(l) == 2 && !strcmp(str(cJSON_GetArrayItem(l, 0), "id"), "cli1") &&
              !strcmp(str(cJSON_GetArrayItem(l, 0), "text"), FACT),
          "ls: %d %s", rc, out ? out : "");
    cJSON_Delete(l);
    free(out);
    if (rig_start(t, &r, MODEL, 0, "mem-cli", AK_KV_F16, AK_KV_F16, N_CTX) < 0) return;
    reply c = chat(r.port, "a", "[\"cli1\"]", "none", "Tell me about Lily.", NULL, 4);
    reply g = http(r.port, "GET", "/v1/memories/cli1", NULL);
    CHECK(c.status == 200 && g.status == 200 && cached(&c) >= num(g.j, "tokens"), "chat on the CLI's memory: %d %s",
          c.status, c.body);
    reply_free(&c);
    reply_free(&g);
    rig_stop(&r);
    snprintf(args, sizeof args, "memory rm cli1 --memory %s", dir);
    rc = run_cli(args, &out);
    CHECK(rc == 0, "rm: %d %s", rc, out ? out : "");
    free(out);
    rc = run_cli(args, &out);
    CHECK(rc == 1 && out && strstr(out, "no memory"), "rm again: %d %s", rc, out ? out : "");
    free(out);
}

static double recomputed(const reply *r) {
    return num(cJSON_GetObjectItem(cJSON_GetObjectItem(r->j, "usage"), "prompt_tokens_details"),
               "memory_recomputed_tokens");
}

TEST(memories_server_chat_cacheblend_and_agentkvshift) {
    rig r;
    if (rig_start(t, &r, MODEL, 0, "mem-blend", AK_KV_F16, AK_KV_F16, N_CTX) < 0) return;
    reply a = add_memory(r.port, "fact", FACT, NULL);
    REQUIRE(a.status == 201, "add: %s", a.body);
    int ntok = (int)num(a.j, "tokens");
    reply_free(&a);
    reply full = chat(r.port, NULL, "[\"fact\"]", "full", "Tell me about Lily.", NULL, 8);
    reply none = chat(r.port, NULL, "[\"fact\"]", "none", "Tell me about Lily.", NULL, 8);
    REQUIRE(full.status == 200 && none.status == 200, "full %d, none %d", full.status, none.status);
    const char *methods[] = {"cacheblend", "agentkvshift"};
    for (int m = 0; m < 2; m++) {
        char agent[32];
        snprintf(agent, sizeof agent, "b%d", m);
        reply x = chat(r.port, agent, "[\"fact\"]", methods[m], "Tell me about Lily.", "{\"recompute_ratio\": 0.3}", 8);
        CHECK(x.status == 200 && usage(&x, "prompt_tokens") == usage(&none, "prompt_tokens"), "%s: %d %s", methods[m],
              x.status, x.body);
        int want = (int)ceil(0.3 * ntok - 1e-6);
        CHECK(recomputed(&x) == want && cached(&x) >= ntok, "%s: recomputed %g (want %d of %d), cached %g", methods[m],
              recomputed(&x), want, ntok, cached(&x));
        /* other agents each (an agent whose history holds the chunk reuses it, however computed) */
        snprintf(agent, sizeof agent, "d%d", m);
        reply d = chat(r.port, agent, "[\"fact\"]", methods[m], "Tell me about Lily.", NULL, 8);   /* default 0.1 */
        CHECK(d.status == 200 && recomputed(&d) == (int)ceil(0.1 * ntok - 1e-6), "%s default ratio: %g of %d",
              methods[m], recomputed(&d), ntok);
        snprintf(agent, sizeof agent, "o%d", m);
        reply one = chat(r.port, agent, "[\"fact\"]", methods[m], "Tell me about Lily.", "{\"recompute_ratio\": 1}", 8);
        CHECK(one.status == 200 && recomputed(&one) == ntok && answer(&one) && answer(&full) &&
                  !strcmp(answer(&one), answer(&full)),
              "%s at 1: %g recomputed, \"%s\" vs full \"%s\"", methods[m], recomputed(&one), answer(&one) ? answer(&one) : "",
              answer(&full) ? answer(&full) : "");
        /* the next turn extends through the chunk: nothing recomputed */
        snprintf(agent, sizeof agent, "b%d", m);
        reply nx = chat(r.port, agent, "[\"fact\"]", methods[m], "Tell me about Lily.", "{\"recompute_ratio\": 0.3}", 8);
        CHECK(nx.status == 200 && recomputed(&nx) == 0 && cached(&nx) >= usage(&x, "prompt_tokens") - 1,
              "%s next turn: recomputed %g, cached %g", methods[m], recomputed(&nx), cached(&nx));
        printf("    %s r=0.3: \"%s\"\n", methods[m], answer(&x) ? answer(&x) : "");
        reply *all[] = {&x, &d, &one, &nx};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) reply_free(all[i]);
    }
    reply_free(&full);
    reply_free(&none);
    rig_stop(&r);
}
