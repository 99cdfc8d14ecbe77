/* test_store_redis_serve.c - two `agentkv serve` processes (the released
 * binary, AK_BIN) on two loopback ports sharing one Redis (started here):
 * an agent's first turn on node A, its second on node B, which restores it
 * warm from Redis (cached_tokens > 0) and answers exactly as one node
 * holding the agent in its memory directory does (greedy). */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "server_rig.h"
#include "test_store_redis.h"

static void nap_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct {
    pid_t pid;
    int port;
    char log[600];
} node;

/* Starts `agentkv serve` for stories260K on 127.0.0.1 (a free port) with
 * memory dir dir, and Redis url (NULL: the directory alone). Returns 0, or
 * -1 having failed the test (with the server's log). */
static int node_start(ak_test_ctx *t, node *n, const char *name, const char *dir, const char *url) {
    const char *bin = getenv("AK_BIN");
    if (!bin || !*bin) bin = "build/agentkv";
    char model[512];
    test_path(model, sizeof model, "models/stories260K.gguf");
    snprintf(n->log, sizeof n->log, "%s/%s.log", test_tmp_dir(), name);
    n->port = 0;
    n->pid = fork();
    if (n->pid < 0) {
        CHECK(0, "fork");
        return -1;
    }
    if (n->pid == 0) {
        int fd = open(n->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) _exit(126);
        dup2(fd, 2);
        dup2(fd, 1);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) dup2(nul, 0);
        if (url)
            execl(bin, bin, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "--memory-dir", dir, "--store",
                  url, "--store-lease-ms", "1000", "-c", "256", "-t", "1", "--model-id", "m", (char *)NULL);
        else
            execl(bin, bin, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "--memory-dir", dir, "-c", "256",
                  "-t", "1", "--model-id", "m", (char *)NULL);
        _exit(127);
    }
    char *text = NULL;
    for (int i = 0; i < 1500 && !n->port; i++) {   /* up to 30 s to load and start */
        free(text);
        text = ak_read_file(n->log, NULL, NULL);
        const char *p = text ? strstr(text, "on http://127.0.0.1:") : NULL;
        if (p) n->port = atoi(p + strlen("on http://127.0.0.1:"));
        else if (waitpid(n->pid, NULL, WNOHANG) == n->pid) break;
        else nap_ms(20);
    }
    if (!n->port) {
        kill(n->pid, SIGKILL);
        waitpid(n->pid, NULL, 0);
        n->pid = 0;
        CHECK(0, "node %s did not start:\n%s", name, text ? text : "");
        free(text);
        return -1;
    }
    free(text);
    return 0;
}

/* SIGTERM, then SIGKILL after 30 s. */
static void node_stop(node *n) {
    if (n->pid <= 0) return;
    kill(n->pid, SIGTERM);
    for (int i = 0; i < 1500; i++) {
        if (waitpid(n->pid, NULL, WNOHANG) == n->pid) {
            n->pid = 0;
            return;
        }
        nap_ms(20);
    }
    kill(n->pid, SIGKILL);
    waitpid(n->pid, NULL, 0);
    n->pid = 0;
}

/* One chat turn of agent ag: the messages so far (a JSON array's inside).
 * Returns the reply (status 0: no answer). */
static reply turn(int port, const char *ag, const char *messages) {
    char body[4096];
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"agent_id\":\"%s\",\"messages\":[%s],\"max_tokens\":12,\"temperature\":0}", ag, messages);
    return http(port, "POST", "/v1/chat/completions", body);
}

/* Waits (at most 10 s) until Redis holds a manifest for agent ag. */
static int wait_saved(const redis_srv *r, const char *ag) {
    char pat[200];
    snprintf(pat, sizeof pat, "akv:{a:%s}:m", ag);
    for (int i = 0; i < 200; i++) {
        if (redis_count(r, pat) == 1) return 1;
        nap_ms(50);
    }
    return 0;
}

/* What two turns said: both answers, turn 2's tier and cached tokens. */
typedef struct {
    char answer1[512], answer2[512], tier[16];
    double cached;
} two_answers;

/* Both turns on node a then b (b == a: one node), agent ag, into *o;
 * failures are recorded in t. */
static void two_turns(ak_test_ctx *t, int pa, int pb, const redis_srv *r, const char *ag, two_answers *o) {
    char *out1 = o->answer1, *out2 = o->answer2, *tier = o->tier;
    const char *m1 = "{\"role\":\"user\",\"content\":\"Once upon a time there was a little dog.\"}";
    reply a = turn(pa, ag, m1);
    const char *t1 = answer(&a);
    CHECK(a.status == 200 && t1, "turn 1: %d %s", a.status, a.body ? a.body : "");
    snprintf(out1, sizeof o->answer1, "%s", t1 ? t1 : "");
    reply_free(&a);
    if (r) CHECK(wait_saved(r, ag), "turn 1 was not saved to Redis");
    cJSON *js = cJSON_CreateString(out1);
    char *esc = js ? cJSON_PrintUnformatted(js) : NULL;   /* the answer as a JSON string */
    cJSON_Delete(js);
    char msgs[2048];
    snprintf(msgs, sizeof msgs, "%s,{\"role\":\"assistant\",\"content\":%s},{\"role\":\"user\",\"content\":\"What did "
             "the dog do next?\"}", m1, esc ? esc : "\"\"");
    free(esc);
    reply b = turn(pb, ag, msgs);
    const char *t2 = answer(&b);
    CHECK(b.status == 200 && t2, "turn 2: %d %s", b.status, b.body ? b.body : "");
    snprintf(out2, sizeof o->answer2, "%s", t2 ? t2 : "");
    const cJSON *ak = b.j ? cJSON_GetObjectItemCaseSensitive(b.j, "agentkv") : NULL;
    const cJSON *u = b.j ? cJSON_GetObjectItemCaseSensitive(b.j, "usage") : NULL;
    const cJSON *d = u ? cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details") : NULL;
    snprintf(tier, sizeof o->tier, "%s", str(ak, "tier") ? str(ak, "tier") : "?");
    o->cached = num(d, "cached_tokens");
    reply_free(&b);
}

static void two_nodes_on(ak_test_ctx *t, redis_srv *r) {
    char da[600], db[600], dc[600];
    snprintf(da, sizeof da, "%s/node-a", test_tmp_dir());
    snprintf(db, sizeof db, "%s/node-b", test_tmp_dir());
    snprintf(dc, sizeof dc, "%s/node-single", test_tmp_dir());
    node a = {0}, b = {0}, c = {0};
    if (node_start(t, &a, "node-a", da, r->url) || node_start(t, &b, "node-b", db, r->url) ||
        node_start(t, &c, "node-single", dc, NULL)) {
        node_stop(&a);
        node_stop(&b);
        node_stop(&c);
        return;
    }
    two_answers ab = {.cached = 0}, single = {.cached = 0};
    two_turns(t, a.port, b.port, r, "wanderer", &ab);
    /* the same two turns on one node with its own directory (it keeps the
     * agent hot in RAM between them): B's warm restore from Redis must
     * answer exactly as that */
    two_turns(t, c.port, c.port, NULL, "wanderer", &single);
    const char *a1 = ab.answer1, *b2 = ab.answer2, *c1 = single.answer1, *c2 = single.answer2;
    const char *tier = ab.tier, *tier_c = single.tier;
    double cached = ab.cached, cached_c = single.cached;
    printf("  turn 2 on node B: tier %s, cached_tokens %.0f; single node: tier %s, cached_tokens %.0f\n", tier, cached,
           tier_c, cached_c);
    CHECK(!strcmp(tier, "warm") && cached > 0, "node B: tier %s, cached_tokens %.0f", tier, cached);
    CHECK(!strcmp(a1, c1), "turn 1 differs: A '%s', single '%s'", a1, c1);
    CHECK(!strcmp(b2, c2), "turn 2 differs: B '%s', single '%s'", b2, c2);
    CHECK(b2[0], "empty answer");
    node_stop(&a);
    node_stop(&b);
    node_stop(&c);
    char *log = ak_read_file(b.log, NULL, NULL);
    CHECK(log && strstr(log, r->url), "node B's log does not name the store:\n%s", log ? log : "");
    free(log);
}

TEST(store_redis_two_serve_nodes_share_an_agent) {
    redis_srv r = {0};
    if (redis_start(t, &r, 0) != 0) return;
    two_nodes_on(t, &r);
    redis_stop(&r);
}

/* Redis stopped under a serving node, then restarted on the same port
 * (one node: two would double the time under ASan): agent "survivor"'s
 * turn 1 is saved to Redis; with Redis gone, a turn of an agent the node
 * does not hold answers on the cold path and the log says why (the store
 * could not be asked), and survivor's turn 2 (held in RAM) answers too;
 * once Redis is back (empty: no persistence) survivor's next turn is saved
 * there again. */
static void redis_away_on(ak_test_ctx *t, redis_srv *r) {
    char db[600];
    snprintf(db, sizeof db, "%s/away-b", test_tmp_dir());
    node b = {0};
    if (node_start(t, &b, "away-b", db, r->url)) return;
    const char *m1 = "{\"role\":\"user\",\"content\":\"Once upon a time there was a little cat.\"}";
    reply x = turn(b.port, "survivor", m1);
    CHECK(x.status == 200 && answer(&x), "turn 1: %d %s", x.status, x.body ? x.body : "");
    reply_free(&x);
    CHECK(wait_saved(r, "survivor"), "turn 1 was not saved to Redis");
    int port = r->port;
    redis_stop(r);
    reply y = turn(b.port, "stranger", m1);
    const cJSON *ak = y.j ? cJSON_GetObjectItemCaseSensitive(y.j, "agentkv") : NULL;
    CHECK(y.status == 200 && answer(&y) && str(ak, "tier") && !strcmp(str(ak, "tier"), "cold"),
          "a turn with Redis gone: %d %s", y.status, y.body ? y.body : "");
    reply_free(&y);
    reply y2 = turn(b.port, "survivor", m1);
    CHECK(y2.status == 200 && answer(&y2), "survivor with Redis gone: %d %s", y2.status, y2.body ? y2.body : "");
    reply_free(&y2);
    char *log = ak_read_file(b.log, NULL, NULL);
    CHECK(log && strstr(log, "agent stranger: cache unreadable, recomputing: store: ") && strstr(log, "connect"),
          "the log does not say why it recomputed:\n%s", log ? log : "");
    free(log);
    if (redis_start(t, r, port) == 0) {
        reply z = turn(b.port, "survivor", m1);
        CHECK(z.status == 200 && answer(&z), "turn after the restart: %d %s", z.status, z.body ? z.body : "");
        reply_free(&z);
        CHECK(wait_saved(r, "survivor"), "no save reached the restarted Redis");
    }
    node_stop(&b);
}

TEST(store_redis_serve_survives_redis_going_away) {
    redis_srv r = {0};
    if (redis_start(t, &r, 0) != 0) return;
    redis_away_on(t, &r);
    redis_stop(&r);
}
