/* test_sched.c - the engine loop: batched, chunked-prefill greedy output
 * equals the reference (llama.cpp's goldens, and per-agent sequential
 * re-prefill), agents stay isolated under eviction, admission errors. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "serve/sched.h"
#include "test.h"

typedef struct {
    ak_model *m;
    ak_tokenizer *tok;
    ak_block_pool *pool;
    ak_store *store;
    ak_agents *agents;
    ak_sched *s;
} rig;

static int rig_open(ak_test_ctx *t, rig *r, const char *model, size_t budget, const char *mem_dir, int max_active,
                    int step_tokens) {
    ak_error err = {{0}};
    memset(r, 0, sizeof *r);
    char path[512];
    r->m = ak_model_load(test_path(path, sizeof path, model), NULL, NULL, &err);
    if (r->m) r->tok = ak_tokenizer_load(&r->m->gguf, &err);
    if (r->tok) r->pool = ak_block_pool_new(&r->m->spec, 0, budget, &err);
    if (r->pool && mem_dir) r->store = ak_store_open(mem_dir, NULL, &err);
    if (r->pool && (!mem_dir || r->store)) {
        ak_agents_config ac = {.model = r->m, .pool = r->pool, .store = r->store, .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = 512, .save = AK_SAVE_EVERY_TURN};
        r->agents = ak_agents_new(&ac, &err);
    }
    if (r->agents) {
        ak_sched_config sc = {.model = r->m, .tok = r->tok, .agents = r->agents, .pool = r->pool, .store = r->store, .n_threads = 2, .n_ctx = 512, .step_tokens = step_tokens, .max_active = max_active};
        r->s = ak_sched_start(&sc, &err);
    }
    if (!r->s) { ak_test_fail(t, __FILE__, __LINE__, "%s: %s", model, err.msg); return -1; }
    return 0;
}

static void rig_close(rig *r) {
    ak_sched_free(r->s);
    ak_agents_free(r->agents);
    ak_store_close(r->store);
    ak_block_pool_free(r->pool);
    ak_tokenizer_free(r->tok);
    ak_model_free(r->m);
}

/* Submits a greedy request for text (tokenized as `agentkv run` does). */
static ak_request *submit_text(ak_test_ctx *t, rig *r, const char *agent, const char *text, int max_tokens, int eog) {
    int32_t *ids = NULL;
    size_t n = 0;
    ak_error err = {{0}};
    if (ak_tokenize(r->tok, text, strlen(text), AK_TOK_ADD_SPECIAL, &ids, &n, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "tokenize: %s", err.msg);
        return NULL;
    }
    ak_req_params p = {0};
    p.agent_id = agent;
    p.prompt = ids;
    p.n_prompt = (int)n;
    p.max_tokens = max_tokens;
    p.sp = ak_sampler_defaults();
    p.sp.temp = 0;
    p.stop_at_eog = eog;
    ak_request *q = ak_sched_submit(r->s, &p, &err);
    free(ids);
    if (!q) ak_test_fail(t, __FILE__, __LINE__, "submit: %s %s", ak_err_code_name(err.code), err.msg);
    return q;
}

/* Waits for the whole text of q; returns it malloc'd (and the result). */
static char *collect(ak_request *q, ak_req_result *res) {
    while (!ak_request_wait(q, (size_t)-1, -1)) {
    }
    char *text = NULL;
    size_t n = 0;
    ak_request_read(q, 0, &text, &n, res);
    if (!text) text = strdup("");
    return text;
}

/* Greedy continuation of text from a fresh cache (prefill in one go, then
 * token by token): the reference the scheduler's output must equal. */
static char *reference(rig *r, const char *text, int n_gen) {
    ak_error err = {{0}};
    int32_t *ids = NULL;
    size_t n = 0;
    ak_tokenize(r->tok, text, strlen(text), AK_TOK_ADD_SPECIAL, &ids, &n, &err);
    ak_block_pool *pool = ak_block_pool_new(&r->m->spec, 0, 0, &err);
    ak_kv *kv = ak_kv_new(pool, AK_KV_F16, AK_KV_F16, 512, &err);
    ak_ctx *ctx = ak_ctx_new(r->m, 64, 2, &err);
    float *logits = malloc(sizeof(float) * r->m->cfg.vocab);
    int32_t *out = malloc(sizeof(int32_t) * (size_t)n_gen);
    ak_eval(ctx, kv, &(ak_eval_args){.tokens = ids, .n = (int)n, .logits = logits}, &err);
    int k = 0;
    for (; k < n_gen; k++) {
        out[k] = ak_argmax(logits, r->m->cfg.vocab);
        if (ak_token_is_eog(r->tok, out[k])) break;
        if (k + 1 < n_gen) ak_eval(ctx, kv, &(ak_eval_args){.tokens = &out[k], .n = 1, .pos0 = (int)n + k,
                                   .logits = logits}, &err);
    }
    char *s = ak_detokenize(r->tok, out, (size_t)k, &n, &err);
    free(out);
    free(logits);
    free(ids);
    ak_ctx_free(ctx);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    return s;
}

/* Every golden prompt at once, half of them named agents: the batched
 * decode (and a step size that cuts prefills into chunks) must reproduce
 * llama.cpp's greedy text exactly. */
static void goldens_batched(ak_test_ctx *t, const char *model, const char *golden, int step_tokens) {
    rig r;
    if (rig_open(t, &r, model, 0, NULL, 16, step_tokens) < 0) return;
    char path[512];
    size_t len;
    ak_error err = {{0}};
    char *jl = ak_read_file(test_path(path, sizeof path, golden), &len, &err);
    REQUIRE(jl, "%s", err.msg);
    ak_request *q[32];
    char *want[32];
    int n = 0;
    for (char *line = strtok(jl, "\n"); line && n < 32; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        if (!j) continue;
        const char *prompt = cJSON_GetObjectItem(j, "prompt")->valuestring;
        int np = cJSON_GetObjectItem(j, "n_predict")->valueint;
        want[n] = strdup(cJSON_GetObjectItem(j, "continuation")->valuestring);
        char id[32];
        snprintf(id, sizeof id, "golden-%d", n);
        q[n] = submit_text(t, &r, n % 2 ? id : NULL, prompt, np, 0);
        cJSON_Delete(j);
        if (!q[n]) { free(want[n]); break; }
        n++;
    }
    CHECK(n >= 2, "only %d golden prompts", n);
    for (int i = 0; i < n; i++) {
        ak_req_result res;
        char *got = collect(q[i], &res);
        CHECK(res.finish == AK_FINISH_LENGTH, "%s #%d: finish %d (%s)", model, i, res.finish, res.error);
        CHECK(!strcmp(got, want[i]), "%s #%d (batched with %d others):\n got  %s\n want %s", model, i, n - 1, got,
              want[i]);
        free(got);
        free(want[i]);
        ak_request_release(q[i]);
    }
    free(jl);
    rig_close(&r);
}

TEST(sched_batched_greedy_matches_goldens_stories260K) {
    goldens_batched(t, "models/stories260K.gguf", "golden/stories260K/greedy.jsonl", 256);
}

TEST(sched_chunked_prefill_matches_goldens_tiny_llama) {
    /* a step of 24 tokens: decode tokens of the others plus a few prompt tokens at a time */
    goldens_batched(t, "models/tiny-llama-h64-gqa-f32.gguf", "golden/tiny-llama-h64/greedy.jsonl", 24);
}

/* 32 agents, each told its own secret, in a KV budget that holds a few of
 * them: turn 2 of every agent must equal a re-prefill of its own history
 * alone (a leak or a mixed-up cache would change the greedy text), and
 * evicted agents come back from disk. */
TEST(sched_32_agents_isolated_under_eviction) {
    const int N = 32;
    static const char *names[] = {"Tom", "Lily", "Sue", "Max", "Ben", "Anna", "Sam", "Mia"};
    static const char *things[] = {"ball", "cat", "tree", "boat"};
    char dir[512];
    snprintf(dir, sizeof dir, "%s/sched-32", test_tmp_dir());
    rig r;
    /* 32 tokens per block, 512 bytes per token (stories260K, f16): a budget of
     * 6 agents' 2-3 blocks each */
    if (rig_open(t, &r, "models/stories260K.gguf", 0, dir, 8, 64) < 0) return;
    size_t per_agent = ak_agents_bytes_for(r.agents, 96);
    ak_block_pool_set_budget(r.pool, per_agent * 6);
    char *p1[32], *p2[32], *out1[32];
    ak_request *q[32];
    for (int i = 0; i < N; i++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s had a secret %s. The secret was %d.", names[i % 8], things[(i / 8) % 4], i * 7 + 3);
        p1[i] = strdup(buf);
        char id[32];
        snprintf(id, sizeof id, "agent-%02d", i);
        q[i] = submit_text(t, &r, id, p1[i], 12, 1);
        REQUIRE(q[i], "submit %d", i);
    }
    for (int i = 0; i < N; i++) {
        ak_req_result res;
        out1[i] = collect(q[i], &res);
        CHECK(res.finish != AK_FINISH_ERROR, "turn 1 of agent %d: %s", i, res.error);
        ak_request_release(q[i]);
    }
    int warm = 0, ahead = 0;
    for (int i = 0; i < N; i++) {
        size_t l = strlen(p1[i]) + strlen(out1[i]) + 64;
        p2[i] = malloc(l);
        snprintf(p2[i], l, "%s%s What was the secret? It was", p1[i], out1[i]);
        char id[32];
        snprintf(id, sizeof id, "agent-%02d", i);
        q[i] = submit_text(t, &r, id, p2[i], 12, 1);
        REQUIRE(q[i], "submit %d", i);
    }
    for (int i = 0; i < N; i++) {
        ak_req_result res;
        char *got = collect(q[i], &res);
        CHECK(res.finish != AK_FINISH_ERROR, "turn 2 of agent %d: %s", i, res.error);
        CHECK(res.turn.reused > 0, "agent %d reused nothing in turn 2 (tier %s)", i, ak_tier_name(res.turn.tier));
        warm += res.turn.tier == AK_TIER_WARM;
        ahead += res.turn.tier == AK_TIER_WARM && res.turn.restored_ahead;
        char *want = reference(&r, p2[i], 12);
        CHECK(want && !strcmp(got, want), "agent %d turn 2:\n got  %s\n want %s", i, got, want ? want : "(null)");
        free(want);
        free(got);
        ak_request_release(q[i]);
        free(p1[i]);
        free(p2[i]);
        free(out1[i]);
    }
    CHECK(warm >= N / 2, "only %d of %d agents came back warm (the budget holds 6)", warm, N);
    /* most warm agents are loaded by the I/O thread (admission restores
     * when no room can be made while others run, or when a prefetched agent
     * was evicted again before its turn: how many depends on timing) */
    CHECK(ahead >= 1, "none of %d warm restores ran on the I/O thread", warm);
    rig_close(&r);
}

/* Requests of one agent run in arrival order, each seeing the last one's
 * cache; a request that can never fit is refused up front. */
TEST(sched_same_agent_serialized_and_admission_errors) {
    rig r;
    if (rig_open(t, &r, "models/stories260K.gguf", 0, NULL, 8, 256) < 0) return;
    ak_request *q[3];
    for (int i = 0; i < 3; i++) q[i] = submit_text(t, &r, "solo", "Once upon a time there was a dog", 8, 0);
    for (int i = 0; i < 3; i++) {
        REQUIRE(q[i], "submit");
        ak_req_result res;
        char *got = collect(q[i], &res);
        if (i > 0) CHECK(res.turn.tier == AK_TIER_HOT && res.turn.reused > 0, "request %d: tier %s reused %d", i,
                         ak_tier_name(res.turn.tier), res.turn.reused);
        free(got);
        ak_request_release(q[i]);
    }
    /* budget of one block: a 200-token request can never fit */
    ak_block_pool_set_budget(r.pool, ak_agents_bytes_for(r.agents, 32));
    int32_t ids[300];
    for (int i = 0; i < 300; i++) ids[i] = 1 + i % 200;
    ak_req_params p = {0};
    p.agent_id = "big";
    p.prompt = ids;
    p.n_prompt = 200;
    p.max_tokens = 8;
    p.sp = ak_sampler_defaults();
    ak_error err = {{0}};
    ak_request *x = ak_sched_submit(r.s, &p, &err);
    CHECK(!x && err.code == AK_ERR_KV_BUDGET && strstr(err.msg, "KV budget"), "code %d: %s", err.code, err.msg);
    ak_request_release(x);
    p.n_prompt = 300; /* longer than nothing, but also: invalid id */
    p.agent_id = "../etc/passwd";
    x = ak_sched_submit(r.s, &p, &err);
    CHECK(!x && err.code == AK_ERR_INVALID && strstr(err.msg, "invalid agent id"), "code %d: %s", err.code, err.msg);
    ak_request_release(x);
    p.agent_id = NULL;
    p.n_prompt = 0;
    x = ak_sched_submit(r.s, &p, &err);
    CHECK(!x && err.code == AK_ERR_INVALID, "empty prompt: code %d", err.code);
    ak_request_release(x);
    rig_close(&r);
}

/* Shutdown with requests running and queued: running ones end with their
 * text so far (finish length), queued ones get 503, nothing hangs, and the
 * agents can be saved afterwards. */
TEST(sched_shutdown_cuts_running_and_fails_queued) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/sched-shutdown", test_tmp_dir());
    rig r;
    if (rig_open(t, &r, "models/tiny-llama-h64-gqa-f32.gguf", 0, dir, 2, 64) < 0) return;
    ak_request *q[6];
    for (int i = 0; i < 6; i++) {
        char id[16];
        snprintf(id, sizeof id, "cut-%d", i);
        q[i] = submit_text(t, &r, id, "Once upon a time there was a", 400, 0);
        REQUIRE(q[i], "submit %d", i);
    }
    /* let the first two get going */
    size_t have = 0;
    ak_request_wait(q[0], have, 10000);
    ak_sched_shutdown(r.s);
    int cut = 0, refused = 0;
    for (int i = 0; i < 6; i++) {
        ak_req_result res;
        char *text = collect(q[i], &res);
        if (res.finish == AK_FINISH_LENGTH && res.completion_tokens < 400) cut++;
        if (res.finish == AK_FINISH_ERROR && res.code == AK_ERR_SHUTDOWN) refused++;
        free(text);
        ak_request_release(q[i]);
    }
    CHECK(cut >= 1 && cut + refused == 6, "cut %d, refused %d of 6", cut, refused);
    ak_error err = {{0}};
    CHECK(ak_agents_flush(r.agents, &err) == 0, "flush after shutdown: %s", err.msg);
    char f[600];
    snprintf(f, sizeof f, "%s/cut-0.safetensors", dir);
    FILE *fp = fopen(f, "rb");
    CHECK(fp != NULL, "the cut agent was saved");
    if (fp) fclose(fp);
    rig_close(&r);
}

/* One batch slot: a warm agent's request waits while another agent decodes
 * 200 tokens; the I/O thread must have restored it by the time it runs. */
TEST(sched_warm_agent_restored_ahead_while_another_decodes) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/sched-ahead", test_tmp_dir());
    const char *text = "Once upon a time there was a little girl who liked to sing in the garden";
    rig r;
    if (rig_open(t, &r, "models/tiny-llama-h64-gqa-f32.gguf", 0, dir, 1, 64) < 0) return;
    ak_request *q = submit_text(t, &r, "sleeper", text, 4, 0);
    REQUIRE(q, "submit");
    ak_req_result res;
    free(collect(q, &res));
    ak_request_release(q);
    rig_close(&r); /* saved: "sleeper" is on disk only */
    if (rig_open(t, &r, "models/tiny-llama-h64-gqa-f32.gguf", 0, dir, 1, 64) < 0) return;
    ak_request *busy = submit_text(t, &r, NULL, "The little dog was sad because", 200, 0);
    ak_request *w = submit_text(t, &r, "sleeper", text, 4, 0);
    REQUIRE(busy && w, "submit");
    free(collect(busy, &res));
    free(collect(w, &res));
    CHECK(res.turn.tier == AK_TIER_WARM && res.turn.restored_ahead && res.turn.reused > 0,
          "tier %s, restored ahead %d, reused %d", ak_tier_name(res.turn.tier), res.turn.restored_ahead, res.turn.reused);
    ak_request_release(busy);
    ak_request_release(w);
    rig_close(&r);
}

/* ------------------------------------------- the server's shutdown path */

static void sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Sends one HTTP request (method, path, extra header lines, body) to
 * 127.0.0.1:port and reads the whole answer into
 * out (n bytes, NUL-terminated); 5 s timeouts on connect, send and receive.
 * Returns the bytes read, or -1. */
static int http_req(int port, const char *method, const char *path, const char *headers, const char *body, char *out,
                    size_t n) {
    int fd = test_dial_loopback(port, 5000);
    if (fd < 0) return -1;
    char req[2048];
    int l = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%s"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", method, path, headers, strlen(body), body);
    if (l <= 0 || (size_t)l >= sizeof req || write(fd, req, (size_t)l) != l) { close(fd); return -1; }
    size_t got = 0;
    for (int i = 0; i < 1000 && got + 1 < n; i++) {   /* bounded: at most 1000 reads of up to 5 s */
        ssize_t k = read(fd, out + got, n - 1 - got);
        if (k <= 0) break;
        got += (size_t)k;
    }
    out[got] = 0;
    close(fd);
    return (int)got;
}

/* Waits up to ms for pid to exit; kills it (SIGKILL) if it does not.
 * Returns its wait status, or -1 if it had to be killed. */
static int wait_exit(pid_t pid, int ms) {
    int ws = 0;
    for (int i = 0; i < ms / 20; i++) {
        if (waitpid(pid, &ws, WNOHANG) == pid) return ws;
        sleep_ms(20);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &ws, 0);
    return -1;
}

/* The released binary end to end: one turn of an agent while its memory
 * directory is gone (renamed away), so that every save fails; on SIGTERM
 * the server must not claim that every agent was saved: it exits non-zero
 * and names the agent on stderr. */
TEST(sched_serve_exits_nonzero_naming_unsaved_agents) {
    const char *bin = getenv("AK_BIN");
    if (!bin || !*bin) bin = "build/agentkv";
    char dir[512], away[600], log[600], model[512];
    snprintf(dir, sizeof dir, "%s/serve-unsaved", test_tmp_dir());
    snprintf(away, sizeof away, "%s.away", dir);
    snprintf(log, sizeof log, "%s/serve-unsaved.log", test_tmp_dir());
    test_path(model, sizeof model, "models/stories260K.gguf");
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) _exit(126);
        dup2(fd, 2);
        dup2(fd, 1);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) dup2(nul, 0);
        execl(bin, bin, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "--memory-dir", dir, "-c", "256",
              "-t", "1", "--model-id", "m", (char *)NULL);
        _exit(127);
    }
    int port = 0;
    char *text = NULL;
    for (int i = 0; i < 1500 && !port; i++) {   /* up to 30 s to load and start */
        free(text);
        text = ak_read_file(log, NULL, NULL);
        const char *p = text ? strstr(text, "on http://127.0.0.1:") : NULL;
        if (p) port = atoi(p + strlen("on http://127.0.0.1:"));
        else if (waitpid(pid, NULL, WNOHANG) == pid) break;
        else sleep_ms(20);
    }
    if (!port) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        REQUIRE(0, "the server did not start:\n%s", text ? text : "");
    }
    free(text);
    text = NULL;
    int moved = rename(dir, away) == 0;
    char resp[8192];
    int got = http_req(port, "POST", "/v1/completions", "X-Agent-Id: keeper\r\n",
                        "{\"model\":\"m\",\"prompt\":\"Once upon a time\",\"max_tokens\":4,\"temperature\":0}", resp,
                        sizeof resp);
    CHECK(got > 0 && strstr(resp, " 200 "), "the turn failed: %s", got > 0 ? resp : "no answer");
    /* the turn's save fails meanwhile (and is retried): /metrics counts it */
    long failures = 0;
    static char metrics[1 << 17];
    for (int i = 0; i < 100 && failures < 1; i++) {
        sleep_ms(50);
        got = http_req(port, "GET", "/metrics", "", "", metrics, sizeof metrics);
        const char *m = got > 0 ? strstr(metrics, "\nagentkv_store_save_failures_total ") : NULL;
        if (m) failures = atol(m + strlen("\nagentkv_store_save_failures_total "));
    }
    CHECK(failures >= 1, "/metrics shows %ld failed saves", failures);
    kill(pid, SIGTERM);
    int ws = wait_exit(pid, 60000);
    text = ak_read_file(log, NULL, NULL);
    CHECK(moved, "could not move the memory directory away");
    CHECK(ws != -1, "the server did not exit within 60 s of SIGTERM");
    CHECK(ws != -1 && WIFEXITED(ws) && WEXITSTATUS(ws) != 0, "exit status %d after a failed save:\n%s", ws,
          text ? text : "");
    CHECK(text && strstr(text, "keeper") && strstr(text, "NOT saved"), "the unsaved agent was not named:\n%s",
          text ? text : "");
    CHECK(text && !strstr(text, "every agent saved"), "claimed every agent saved:\n%s", text ? text : "");
    free(text);
}

/* A pool's prefill runs in the engine's batches in chunks: an agent that is
 * decoding meanwhile keeps getting tokens (a pool made in one blocking
 * prefill would stall it for the whole prefill: a step or two of text). */
TEST(sched_pool_create_keeps_decoding) {
    rig r;
    if (rig_open(t, &r, "models/stories260K.gguf", 0, NULL, 4, 32) < 0) return;
    ak_request *q = submit_text(t, &r, "talker", "Once upon a time", 480, 0);
    REQUIRE(q, "submit");
    ak_request_wait(q, 0, 10000);   /* decoding has begun */
    ak_buf b = {0};
    for (int i = 0; i < 60; i++) ak_buf_puts(&b, "The little dog ran to the park. ");
    int32_t *ids = NULL;
    size_t n = 0;
    ak_error err = {{0}};
    REQUIRE(ak_tokenize(r.tok, b.p, b.len, AK_TOK_ADD_SPECIAL, &ids, &n, &err) == 0, "%s", err.msg);
    ak_buf_free(&b);
    if (n > 450) n = 450;
    size_t before = ak_request_read(q, 0, NULL, NULL, NULL);
    ak_pool_info in;
    ak_sched_pool_params pp = {.id = "doc", .tokens = ids, .n = (int)n, .fk = AK_KV_Q8, .fv = AK_KV_TQ3,
                               .source = "{\"text\":\"...\"}"};
    int rc = ak_sched_pool_create(r.s, &pp, &in, &err);
    ak_req_result res;
    size_t after = ak_request_read(q, 0, NULL, NULL, &res);
    CHECK(rc == 0, "create: %s", err.msg);
    CHECK(res.finish == AK_FINISH_NONE, "the talker must still be decoding when the pool is done");
    /* ~14 steps of 32 tokens: about one token of text each */
    CHECK(after >= before + 8, "text while the pool prefilled: %zu -> %zu bytes", before, after);
    CHECK(in.n_tokens == (int)n && in.fk == AK_KV_Q8 && in.fv == AK_KV_TQ3 && !strcmp(in.id, "doc"), "info");
    int32_t *got = NULL;
    char *src = NULL;
    int m = 0;
    REQUIRE(ak_sched_pool_tokens(r.s, "doc", &got, &m, &src, &err) == 0, "%s", err.msg);
    CHECK(m == (int)n && !memcmp(got, ids, n * sizeof *ids) && src && !strcmp(src, "{\"text\":\"...\"}"),
          "tokens and source back");
    free(got);
    free(src);
    pp.source = NULL;
    CHECK(ak_sched_pool_create(r.s, &pp, &in, &err) < 0 && err.code == AK_ERR_EXISTS, "write-once: %d", err.code);
    int32_t full[512];   /* the rig's context */
    for (int i = 0; i < 512; i++) full[i] = ids[i % n];
    pp = (ak_sched_pool_params){.id = "long", .tokens = full, .n = 512, .fk = AK_KV_Q8, .fv = AK_KV_TQ3};
    CHECK(ak_sched_pool_create(r.s, &pp, &in, &err) < 0 && err.code == AK_ERR_INVALID, "not shorter than the context: %d",
          err.code);
    ak_pool_info *v = NULL;
    int nv = 0;
    CHECK(ak_sched_pools_list(r.s, &v, &nv, &err) == 0 && nv == 1, "list: %d", nv);
    free(v);
    CHECK(ak_sched_pool_remove(r.s, "doc", &err) == 0, "remove: %s", err.msg);
    CHECK(ak_sched_pool_remove(r.s, "doc", &err) == 1, "remove twice");
    CHECK(ak_sched_pool_get(r.s, "doc", &in, &err) < 0 && err.code == AK_ERR_NOT_FOUND, "gone");
    free(ids);
    ak_request_cancel(q);
    char *text = collect(q, &res);
    free(text);
    ak_request_release(q);
    rig_close(&r);
}
