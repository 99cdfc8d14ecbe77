/* test_server_hard.c - the HTTP server under hostile or careless clients, in
 * process (model, scheduler and server started here, raw sockets to
 * 127.0.0.1, every read and write bounded by a timeout):
 *   - streamed events of every size around the buffer boundaries (greedy +
 *     long stop strings: the client picks the chunk sizes) arrive whole and
 *     equal the non-streamed text;
 *   - a request without the API key is refused on its headers, before its
 *     body is sent; idle connections are closed after the timeout; one
 *     address cannot hold more than its connection limit; request bodies
 *     buffered across connections are capped (503 + Retry-After);
 *   - a client that leaves a running request (plain or streamed) frees its
 *     batch slot within about a second, and the agent keeps exactly what the
 *     documented rule says;
 *   - integer fields of 1e300, -1e300 and 1e19 get 400 over HTTP;
 *   - web pages cannot drive the server: a Host that is not an allowed name
 *     (DNS rebinding), an Origin that --cors-origin does not allow and a body
 *     that is not JSON (CSRF) are refused on the headers; allowed origins
 *     get CORS answers; libmicrohttpd's own errors (a malformed chunked
 *     body, headers too large) come as OpenAI JSON errors;
 *   - GET /v1/models/{id};
 *   - the console's files need no key and carry the strict CSP; a request
 *     from the page's own origin passes the Origin check. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/buf.h"
#include "serve/server.h"
#include "test.h"

typedef struct {
    ak_model *m;
    ak_tokenizer *tok;
    ak_block_pool *pool;
    ak_store *store;
    ak_agents *agents;
    ak_metrics *metrics;
    ak_sched *s;
    ak_server *srv;
    int port;
} srv_rig;

/* Starts a server on a free port of 127.0.0.1 for model (a path under the
 * shared directory); limits come from lim (its other fields are ignored). */
static int rig_start(ak_test_ctx *t, srv_rig *r, const char *model, const ak_server_config *lim, const char *mem) {
    ak_error err = {0};
    char path[512];
    memset(r, 0, sizeof *r);
    r->m = ak_model_load(test_path(path, sizeof path, model), NULL, NULL, &err);
    if (r->m) r->tok = ak_tokenizer_load(&r->m->gguf, &err);
    if (r->tok) r->pool = ak_block_pool_new(&r->m->spec, 0, 0, &err);
    if (r->pool && mem) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", test_tmp_dir(), mem);
        r->store = ak_store_open(dir, NULL, &err);
    }
    if (r->pool && (!mem || r->store)) {
        ak_agents_config ac = {.model = r->m, .pool = r->pool, .store = r->store, .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = 1024, .save = AK_SAVE_EVERY_TURN};
        r->agents = ak_agents_new(&ac, &err);
    }
    if (r->agents) r->metrics = ak_metrics_new(&err);
    if (r->metrics) {
        ak_sched_config sc = {.model = r->m, .tok = r->tok, .agents = r->agents, .pool = r->pool, .store = r->store, .n_threads = 2, .n_ctx = 1024, .step_tokens = 256, .max_active = 16, .metrics = r->metrics};
        r->s = ak_sched_start(&sc, &err);
    }
    if (r->s) {
        ak_server_config vc = *lim;
        vc.host = "127.0.0.1";
        vc.port = 0;
        vc.sched = r->s;
        vc.model = r->m;
        vc.tok = r->tok;
        vc.model_id = "m";
        vc.family = AK_CHAT_PLAIN;
        vc.template_text = NULL;
        vc.n_ctx = 1024;
        vc.metrics = r->metrics;
        vc.log = NULL;
        r->srv = ak_server_start(&vc, &err);
    }
    if (!r->srv) {
        ak_test_fail(t, __FILE__, __LINE__, "%s: %s", model, err.msg);
        return -1;
    }
    r->port = ak_server_port(r->srv);
    return 0;
}

static void rig_stop(srv_rig *r) {
    ak_server_quiesce(r->srv);
    ak_sched_shutdown(r->s);
    ak_server_stop(r->srv);
    ak_sched_free(r->s);
    ak_agents_free(r->agents);
    ak_metrics_free(r->metrics);
    ak_store_close(r->store);
    ak_block_pool_free(r->pool);
    ak_tokenizer_free(r->tok);
    ak_model_free(r->m);
}

/* ------------------------------------------------------------ a raw client */

static int dial(int port, int timeout_ms) { return test_dial_loopback(port, timeout_ms); }

static int send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Sends a request (Connection: close). extra: more header lines, each ending "\r\n". */
static int send_req(int fd, const char *method, const char *path, const char *extra, const char *body) {
    ak_buf b = {0};
    ak_buf_printf(&b, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s", method, path, extra ? extra : "");
    if (body) ak_buf_printf(&b, "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", strlen(body), body);
    else ak_buf_puts(&b, "\r\n");
    int rc = b.failed ? -1 : send_all(fd, b.p, b.len);
    ak_buf_free(&b);
    return rc;
}

/* Reads until EOF (or the socket's timeout). Returns the bytes (malloc'd) or
 * NULL if nothing came; *timed_out says whether the read timed out. */
static char *read_all(int fd, size_t *len, int *timed_out) {
    ak_buf b = {0};
    char tmp[8192];
    *timed_out = 0;
    for (;;) {
        ssize_t k = recv(fd, tmp, sizeof tmp, 0);
        if (k > 0) { ak_buf_append(&b, tmp, (size_t)k); continue; }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) *timed_out = 1;
        break;
    }
    *len = b.len;
    return ak_buf_take(&b);
}

/* An HTTP response: status (0 when none came) and the body, de-chunked. */
typedef struct {
    int status;
    char *head, *body;
    size_t body_len;
    int timed_out;
} resp;

static void resp_free(resp *r) {
    free(r->head);
    free(r->body);
}

static void parse_resp(resp *r, char *raw, size_t len) {
    memset(r, 0, sizeof *r);
    if (!raw) return;
    char *e = strstr(raw, "\r\n\r\n");
    if (strncmp(raw, "HTTP/1.", 7) || !e) { free(raw); return; }
    r->status = atoi(raw + 9);
    *e = 0;
    r->head = strdup(raw);
    char *p = e + 4, *end = raw + len;
    ak_buf b = {0};
    if (strcasestr(r->head, "transfer-encoding: chunked")) {
        while (p < end) {
            char *q;
            unsigned long n = strtoul(p, &q, 16);
            char *nl = strstr(q, "\r\n");
            if (!nl || n == 0) break;
            p = nl + 2;
            if ((size_t)(end - p) < n) n = (unsigned long)(end - p);
            ak_buf_append(&b, p, n);
            p += n + 2;
        }
    } else {
        ak_buf_append(&b, p, (size_t)(end - p));
    }
    r->body_len = b.len;
    r->body = ak_buf_take(&b);
    if (!r->body) r->body = strdup("");
    free(raw);
}

/* One whole exchange on a fresh connection. */
static resp http(int port, const char *method, const char *path, const char *extra, const char *body, int timeout_ms) {
    resp r = {0};
    int fd = dial(port, timeout_ms);
    if (fd < 0) return r;
    if (send_req(fd, method, path, extra, body) == 0) {
        size_t len;
        int to;
        char *raw = read_all(fd, &len, &to);
        parse_resp(&r, raw, len);
        r.timed_out = to;
    }
    close(fd);
    return r;
}

/* The value of a Prometheus sample line "name value" in /metrics, or -1. */
static double metric(int port, const char *extra, const char *name) {
    resp r = http(port, "GET", "/metrics", extra, NULL, 5000);
    double v = -1;
    size_t n = strlen(name);
    for (char *l = r.body; l && *l;) {
        if (!strncmp(l, name, n) && l[n] == ' ') { v = atof(l + n + 1); break; }
        char *nl = strchr(l, '\n');
        l = nl ? nl + 1 : NULL;
    }
    resp_free(&r);
    return v;
}

/* GET /v1/agents/id: fills tokens and busy; returns the status. */
static int agent_info(int port, const char *id, int *tokens, int *busy) {
    char path[256];
    snprintf(path, sizeof path, "/v1/agents/%s", id);
    resp r = http(port, "GET", path, NULL, NULL, 5000);
    int st = r.status;
    cJSON *j = st == 200 ? cJSON_Parse(r.body) : NULL;
    if (j) {
        *tokens = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "tokens"));
        *busy = cJSON_IsTrue(cJSON_GetObjectItem(j, "busy"));
        cJSON_Delete(j);
    }
    resp_free(&r);
    return st;
}

/* The content deltas of a chat SSE body, concatenated, and whether it ended
 * with [DONE] after a finish_reason. Returns NULL when malformed. */
static char *sse_text(const char *body, int *complete) {
    ak_buf b = {0};
    int finished = 0, done = 0;
    ak_buf_puts(&b, "");
    for (const char *l = body; l && *l;) {
        const char *nl = strstr(l, "\n\n");
        if (strncmp(l, "data: ", 6) || !nl) { ak_buf_free(&b); return NULL; }
        if (!strncmp(l, "data: [DONE]", 12)) done = 1;
        else {
            cJSON *j = cJSON_ParseWithLength(l + 6, (size_t)(nl - l - 6));
            cJSON *c0 = j ? cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0) : NULL;
            if (!j) { ak_buf_free(&b); return NULL; }
            const char *s = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "delta"), "content"));
            if (s) ak_buf_puts(&b, s);
            if (cJSON_IsString(cJSON_GetObjectItem(c0, "finish_reason"))) finished = 1;
            cJSON_Delete(j);
        }
        l = nl + 2;
    }
    *complete = finished && done;
    return ak_buf_take(&b);
}

/* ------------------------------------------------------------ 1. streaming */

typedef struct {
    int port, stop_len, max_tokens;
    int ok;
    char why[200];
} stream_job;

/* A greedy chat request with a stop string of stop_len bytes that never
 * matches: the scheduler holds back stop_len - 1 bytes, so the last event
 * carries them all; streamed and plain text must be equal. */
static void *stream_one(void *arg) {
    stream_job *j = arg;
    char *stop = malloc((size_t)j->stop_len + 1);
    memset(stop, 'Z', (size_t)j->stop_len);
    stop[j->stop_len] = 0;
    char *body = NULL;
    resp a = {0}, b = {0};
    for (int streamed = 0; streamed <= 1; streamed++) {
        ak_buf q = {0};
        ak_buf_printf(&q, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a long story about a dog and a cat\"}],"
                          "\"temperature\":0,\"max_tokens\":%d,\"stop\":\"%s\",\"stream\":%s}",
                      j->max_tokens, stop, streamed ? "true" : "false");
        body = ak_buf_take(&q);
        *(streamed ? &b : &a) = http(j->port, "POST", "/v1/chat/completions", NULL, body, 20000);
        free(body);
    }
    free(stop);
    j->ok = 0;
    cJSON *ja = a.status == 200 ? cJSON_Parse(a.body) : NULL;
    const char *want = ja ? cJSON_GetStringValue(cJSON_GetObjectItem(
                                cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(ja, "choices"), 0), "message"),
                                "content"))
                          : NULL;
    int complete = 0;
    char *got = b.status == 200 ? sse_text(b.body, &complete) : NULL;
    if (!want) snprintf(j->why, sizeof j->why, "plain request: status %d", a.status);
    else if (!got) snprintf(j->why, sizeof j->why, "stream: status %d, malformed events", b.status);
    else if (!complete) snprintf(j->why, sizeof j->why, "stream without finish_reason and [DONE]");
    else if (strcmp(got, want)) snprintf(j->why, sizeof j->why, "streamed text differs (%zu vs %zu bytes)", strlen(got), strlen(want));
    else j->ok = 1;
    free(got);
    cJSON_Delete(ja);
    resp_free(&a);
    resp_free(&b);
    return NULL;
}

/* Lengths of the first event's JSON and of the last content event's JSON
 * minus its escaped text, from one streamed response whose text came in one
 * chunk; -1 when the body is not as expected. */
static int event_sizes(const char *body, int *first, int *content_overhead, int *text_len) {
    *first = *content_overhead = *text_len = -1;
    for (const char *l = body; l && !strncmp(l, "data: {", 7);) {
        const char *nl = strstr(l, "\n\n");
        if (!nl) return -1;
        int n = (int)(nl - l - 6);
        if (*first < 0) *first = n;
        cJSON *j = cJSON_ParseWithLength(l + 6, (size_t)n);
        cJSON *d = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "delta");
        const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(d, "content"));
        if (c && *c && !cJSON_GetObjectItem(d, "role")) {
            cJSON *s = cJSON_CreateString(c);
            char *esc = cJSON_PrintUnformatted(s);
            *content_overhead = n - (int)(strlen(esc) - 2);
            *text_len = (int)strlen(c);
            free(esc);
            cJSON_Delete(s);
        }
        cJSON_Delete(j);
        l = nl + 2;
    }
    return *first > 0 && *content_overhead > 0 ? 0 : -1;
}

/* Runs the jobs 16 at a time; reports up to 5 failures. */
static void run_jobs(ak_test_ctx *t, stream_job *jobs, int n_jobs) {
    enum { PAR = 16 };
    pthread_t th[PAR];
    int failed = 0;
    for (int base = 0; base < n_jobs; base += PAR) {
        int n = n_jobs - base < PAR ? n_jobs - base : PAR;
        for (int k = 0; k < n; k++) pthread_create(&th[k], NULL, stream_one, &jobs[base + k]);
        for (int k = 0; k < n; k++) pthread_join(th[k], NULL);
        for (int k = 0; k < n && failed < 5; k++)
            if (!jobs[base + k].ok) {
                failed++;
                ak_test_fail(t, __FILE__, __LINE__, "stop of %d bytes: %s", jobs[base + k].stop_len, jobs[base + k].why);
            }
    }
}

/* The API key of the tests that require one. */
static const char *const hard_key[] = {"sk-hard"};

TEST(server_stream_event_sizes_client_driven) {
    srv_rig r;
    ak_server_config lim = {0};
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    /* the sizes of this server's events: the role event, and a content
     * event's overhead around its text (one chunk: stop longer than the text) */
    char stop[1001];
    memset(stop, 'Z', 1000);
    stop[1000] = 0;
    char *body = malloc(1400);
    REQUIRE(body, "oom");
    snprintf(body, 1400, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a long story about a dog and a cat\"}],"
                         "\"temperature\":0,\"max_tokens\":200,\"stop\":\"%s\",\"stream\":true}", stop);
    resp a = http(r.port, "POST", "/v1/chat/completions", NULL, body, 20000);
    free(body);
    int first, over, text;
    REQUIRE(a.status == 200 && event_sizes(a.body, &first, &over, &text) == 0, "probe stream: %d", a.status);
    resp_free(&a);
    /* A writer that sizes its buffer from the first event ("data: " + JSON +
     * "\n\n" = first + 8, doubled) is exactly full when a later event is
     * 2 (first + 8) bytes: the last chunk's text is then 2 first + 8 - over
     * bytes. The client moves the last chunk's size with the stop length
     * (it holds back stop - 1 bytes): sweep it around that size, and
     * through the small sizes. */
    int target = 2 * first + 8 - over;
    REQUIRE(text > target + 20, "the greedy text (%d bytes) is too short for chunks of %d", text, target);
    enum { SMALL = 16, AROUND = 24 };
    stream_job jobs[SMALL + AROUND];
    int n = 0;
    for (int k = 1; k <= SMALL; k++) jobs[n++] = (stream_job){r.port, k, 200, 0, ""};
    for (int k = 0; k < AROUND; k++) jobs[n++] = (stream_job){r.port, target - 16 + k, 200, 0, ""};
    run_jobs(t, jobs, n);
    rig_stop(&r);
}

/* ------------------------------------------------------------ 2. limits */

static const char key_hdr[] = "Authorization: Bearer sk-hard\r\n";

TEST(server_unauthenticated_body_refused_on_headers) {
    srv_rig r;
    ak_server_config lim = {0};
    lim.api_keys = hard_key;
    lim.n_api_keys = 1;
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    /* headers announce 3 MB, no body byte follows: the answer must come anyway */
    int fd = dial(r.port, 3000);
    REQUIRE(fd >= 0, "connect");
    const char *h = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    "Content-Length: 3000000\r\n\r\n";
    REQUIRE(send_all(fd, h, strlen(h)) == 0, "send");
    double t0 = ak_now();
    size_t len;
    int to;
    char *raw = read_all(fd, &len, &to);
    resp a;
    parse_resp(&a, raw, len);
    close(fd);
    CHECK(a.status == 401, "no key, body not sent: status %d (timed out: %d)", a.status, a.timed_out || to);
    CHECK(ak_now() - t0 < 2.0, "answered after %.2f s", ak_now() - t0);
    resp_free(&a);
    /* the wrong key, same */
    fd = dial(r.port, 3000);
    REQUIRE(fd >= 0, "connect");
    h = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer nope\r\nContent-Length: 3000000\r\n\r\n";
    REQUIRE(send_all(fd, h, strlen(h)) == 0, "send");
    raw = read_all(fd, &len, &to);
    parse_resp(&a, raw, len);
    close(fd);
    CHECK(a.status == 401, "wrong key: status %d", a.status);
    resp_free(&a);
    /* a declared body over max_body: 413 on the headers too */
    fd = dial(r.port, 3000);
    REQUIRE(fd >= 0, "connect");
    h = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer sk-hard\r\n"
        "Content-Type: application/json\r\nContent-Length: 99000000\r\n\r\n";
    REQUIRE(send_all(fd, h, strlen(h)) == 0, "send");
    raw = read_all(fd, &len, &to);
    parse_resp(&a, raw, len);
    close(fd);
    CHECK(a.status == 413, "99 MB declared: status %d", a.status);
    resp_free(&a);
    /* /health needs no key; with the key everything works */
    a = http(r.port, "GET", "/health", NULL, NULL, 3000);
    CHECK(a.status == 200, "/health: %d", a.status);
    resp_free(&a);
    a = http(r.port, "POST", "/v1/completions", key_hdr, "{\"model\":\"m\",\"prompt\":\"Once\",\"max_tokens\":4}", 5000);
    CHECK(a.status == 200, "with the key: %d %s", a.status, a.body ? a.body : "");
    resp_free(&a);
    rig_stop(&r);
}

/* A greedy 1000-token request of agent "slow" (plain or streamed with
 * everything held back); records its status, whether it came whole, and
 * how long the connection was open. */
typedef struct {
    int port, stream;
    int status, complete;
    double secs;
} slow_job;

static void *slow_one(void *arg) {
    slow_job *j = arg;
    char stop[201];
    memset(stop, 'Z', 200);
    stop[200] = 0;
    char body[512];
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"prompt\":\"The\",\"max_tokens\":1000,\"temperature\":0,\"stream\":%s,\"stop\":\"%s\"}",
             j->stream ? "true" : "false", j->stream ? stop : "ZZZZ");
    double t0 = ak_now();
    resp a = http(j->port, "POST", "/v1/completions", "X-Agent-Id: slow\r\n", body, 180000);   /* a loaded sanitizer run: the third waits for two */
    j->secs = ak_now() - t0;
    j->status = a.status;
    j->complete = a.body && (j->stream ? strstr(a.body, "data: [DONE]") != NULL : strstr(a.body, "\"usage\"") != NULL);
    resp_free(&a);
    return NULL;
}

TEST(server_idle_connection_closed_after_timeout) {
    srv_rig r;
    ak_server_config lim = {0};
    lim.conn_timeout_s = 1;
    if (rig_start(t, &r, "models/tiny-llama-h64-gqa-f32.gguf", &lim, NULL) < 0) return;
    int fd = dial(r.port, 4000);
    REQUIRE(fd >= 0, "connect");
    double t0 = ak_now();
    char c;
    ssize_t k = recv(fd, &c, 1, 0);   /* nothing sent: the server must close */
    double dt = ak_now() - t0;
    close(fd);
    CHECK(k == 0 || (k < 0 && errno == ECONNRESET), "idle connection not closed (recv %zd, %.2f s)", k, dt);
    CHECK(dt < 3.0, "closed after %.2f s", dt);
    /* half a request line, then silence: closed too */
    fd = dial(r.port, 4000);
    REQUIRE(fd >= 0, "connect");
    send_all(fd, "POST /v1/comp", 13);
    t0 = ak_now();
    k = recv(fd, &c, 1, 0);
    dt = ak_now() - t0;
    close(fd);
    CHECK((k == 0 || (k < 0 && errno == ECONNRESET)) && dt < 3.0, "slow request line: recv %zd after %.2f s", k, dt);
    /* waiting for the engine longer than the timeout is not idleness: three
     * requests of one agent (run one after the other, 1000 tokens each), one
     * of them streamed with all its text held back by a long stop string;
     * the last to finish has been connected for all their generations. A
     * fast machine gets more of them, until one waited past 1.5 s. */
    enum { MAX_SLOW = 24 };
    slow_job jobs[MAX_SLOW];
    pthread_t th[MAX_SLOW];
    double longest = 0;
    for (int n = 3; n <= MAX_SLOW && longest <= 1.5; n *= 2) {
        for (int k = 0; k < n; k++) {
            jobs[k] = (slow_job){r.port, k == 1, 0, 0, 0};
            pthread_create(&th[k], NULL, slow_one, &jobs[k]);
        }
        for (int k = 0; k < n; k++) {
            pthread_join(th[k], NULL);
            CHECK(jobs[k].status == 200 && jobs[k].complete, "request %d (%s, %.2f s, timeout 1 s): status %d, %s", k,
                  jobs[k].stream ? "streamed" : "plain", jobs[k].secs, jobs[k].status,
                  jobs[k].complete ? "complete" : "cut");
            if (jobs[k].secs > longest) longest = jobs[k].secs;
        }
    }
    CHECK(longest > 1.5, "the longest request took only %.2f s: it does not test the timeout", longest);
    rig_stop(&r);
}

TEST(server_connections_per_ip_limited) {
    srv_rig r;
    ak_server_config lim = {0};
    lim.max_conns_per_ip = 3;
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    int fds[3];
    for (int i = 0; i < 3; i++) {
        fds[i] = dial(r.port, 3000);
        CHECK(fds[i] >= 0, "connection %d", i);
        if (fds[i] >= 0) send_all(fds[i], "GET /he", 7);   /* held open, mid-request */
    }
    usleep(500000);
    /* the 4th from the same address gets no answer: it is closed at once */
    resp a = http(r.port, "GET", "/health", NULL, NULL, 3000);
    CHECK(a.status == 0 && !a.timed_out, "4th connection: status %d (timed out %d)", a.status, a.timed_out);
    resp_free(&a);
    close(fds[0]);
    /* a place is free once the server has seen the close */
    double t0 = ak_now();
    do {
        usleep(100000);
        a = http(r.port, "GET", "/health", NULL, NULL, 3000);
        if (a.status == 200) break;
        resp_free(&a);
    } while (ak_now() - t0 < 3.0);
    CHECK(a.status == 200, "after one closed: status %d", a.status);
    resp_free(&a);
    for (int i = 1; i < 3; i++) if (fds[i] >= 0) close(fds[i]);
    rig_stop(&r);
}

TEST(server_buffered_body_bytes_capped) {
    srv_rig r;
    ak_server_config lim = {0};
    lim.max_body = 80000;
    lim.max_buffered = 100000;
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    /* A announces 60000 bytes and sends a few */
    char *big = malloc(60001);
    REQUIRE(big, "oom");
    const char *head = "{\"model\":\"m\",\"prompt\":\"Once\",\"max_tokens\":2,\"x\":\"";
    memset(big, 'a', 60000);
    memcpy(big, head, strlen(head));
    memcpy(big + 60000 - 2, "\"}", 2);
    big[60000] = 0;
    int fa = dial(r.port, 5000);
    REQUIRE(fa >= 0, "connect");
    const char *h = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                    "Content-Type: application/json\r\nContent-Length: 60000\r\n\r\n";
    send_all(fa, h, strlen(h));
    send_all(fa, big, 1000);
    usleep(500000);   /* A's headers handled: its 60000 bytes are reserved */
    /* B's 60000 would take the total over 100000: 503 with Retry-After, on the headers */
    int fb = dial(r.port, 3000);
    REQUIRE(fb >= 0, "connect");
    send_all(fb, h, strlen(h));
    size_t len;
    int to;
    char *raw = read_all(fb, &len, &to);
    resp b;
    parse_resp(&b, raw, len);
    close(fb);
    CHECK(b.status == 503 && b.head && strcasestr(b.head, "Retry-After:"), "B: status %d, head %s", b.status,
          b.head ? b.head : "-");
    resp_free(&b);
    /* a chunked body (no length announced) counted as it arrives: refused too */
    fb = dial(r.port, 5000);
    REQUIRE(fb >= 0, "connect");
    const char *hc = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    send_all(fb, hc, strlen(hc));
    for (int i = 0; i < 6; i++) {
        char ch[32];
        snprintf(ch, sizeof ch, "2710\r\n");   /* 10000 bytes */
        send_all(fb, ch, strlen(ch));
        send_all(fb, big + 1000, 10000);
        send_all(fb, "\r\n", 2);
    }
    send_all(fb, "0\r\n\r\n", 5);
    raw = read_all(fb, &len, &to);
    parse_resp(&b, raw, len);
    close(fb);
    CHECK(b.status == 503, "chunked 60000 bytes beside A's 60000: status %d", b.status);
    resp_free(&b);
    /* A completes and is served; then B's size fits again */
    send_all(fa, big + 1000, 59000);
    raw = read_all(fa, &len, &to);
    parse_resp(&b, raw, len);
    close(fa);
    CHECK(b.status == 200, "A: status %d %s", b.status, b.body ? b.body : "");
    resp_free(&b);
    b = http(r.port, "POST", "/v1/completions", NULL, big, 5000);
    CHECK(b.status == 200, "B after A: status %d %s", b.status, b.body ? b.body : "");
    resp_free(&b);
    free(big);
    rig_stop(&r);
}

/* ------------------------------------------------------------ 3. abandoned */

/* Starts a long greedy request for agent id and leaves after leave_ms;
 * returns 0 if it could. stream: 0 plain, 1 streamed with all text held
 * back (a long stop string), 2 streamed with text flowing. */
static int abandon(int port, const char *id, int stream, int leave_ms) {
    char body[1024], hdr[200];
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"prompt\":\"The\",\"max_tokens\":1000,\"temperature\":0,\"stream\":%s,"
             "\"stop\":\"%s\"}",
             stream ? "true" : "false",
             stream == 1 ? "ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ"
                         : "ZZZZ");
    snprintf(hdr, sizeof hdr, "X-Agent-Id: %s\r\n", id);
    int fd = dial(port, 5000);
    if (fd < 0 || send_req(fd, "POST", "/v1/completions", hdr, body) < 0) return -1;
    usleep((useconds_t)leave_ms * 1000);
    close(fd);
    return 0;
}

static void check_abandoned(ak_test_ctx *t, const srv_rig *r, const char *id, int stream) {
    int port = r->port;
    int32_t *ids = NULL;
    size_t prompt = 0;
    ak_error err = {0};
    REQUIRE(ak_tokenize(r->tok, "The", 3, AK_TOK_ADD_SPECIAL, &ids, &prompt, &err) == 0, "%s", err.msg);
    free(ids);
    double gen0 = metric(port, NULL, "agentkv_completion_tokens_total");
    /* leave early: even a fast machine is then far from max_tokens (1000) */
    REQUIRE(abandon(port, id, stream, 100) == 0, "request");
    double t0 = ak_now();
    int tokens = 0, busy = 1, st = 0;
    while (ak_now() - t0 < 5.0) {
        st = agent_info(port, id, &tokens, &busy);
        if (st == 200 && !busy) break;
        usleep(20000);
    }
    double dt = ak_now() - t0;
    CHECK(st == 200 && !busy, "%s: agent still busy %.2f s after its client left", id, dt);
    CHECK(dt < 1.0, "%s: the slot was freed %.2f s after the client left", id, dt);
    CHECK(metric(port, NULL, "agentkv_requests_active") == 0, "%s: a request still running", id);
    /* the rule: the agent keeps the prompt and every generated token but the
     * last one sampled (not yet fed), as after max_tokens */
    double gen = metric(port, NULL, "agentkv_completion_tokens_total") - gen0;
    CHECK(gen > 0 && gen < 1000, "%s: %g tokens generated: the request ran to max_tokens (1000)", id, gen);
    CHECK(tokens == (int)prompt + (int)gen - 1, "%s: the agent holds %d tokens; prompt %zu + generated %g - 1 expected", id,
          tokens, prompt, gen);
}

TEST(server_abandoned_requests_cancelled) {
    srv_rig r;
    ak_server_config lim = {0};
    if (rig_start(t, &r, "models/tiny-llama-h64-gqa-f32.gguf", &lim, "hard-abandon") < 0) return;
    check_abandoned(t, &r, "quitter", 0);
    check_abandoned(t, &r, "quitter-sse", 1);
    check_abandoned(t, &r, "quitter-sse-flowing", 2);
    rig_stop(&r);
}

/* ------------------------------------------------------------ 6. numbers */

TEST(server_huge_integers_400_over_http) {
    srv_rig r;
    ak_server_config lim = {0};
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    static const char *const fields[] = {"n", "max_tokens", "max_completion_tokens", "seed"};
    static const char *const values[] = {"1e300", "-1e300", "1e19"};
    for (int f = 0; f < 4; f++)
        for (int v = 0; v < 3; v++)
            for (int chat = 0; chat <= 1; chat++) {
                char body[300];
                snprintf(body, sizeof body, "{\"model\":\"m\",%s,\"%s\":%s}",
                         chat ? "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]" : "\"prompt\":\"hi\"", fields[f],
                         values[v]);
                resp a = http(r.port, "POST", chat ? "/v1/chat/completions" : "/v1/completions", NULL, body, 5000);
                CHECK(a.status == 400, "%s = %s: status %d", fields[f], values[v], a.status);
                resp_free(&a);
            }
    rig_stop(&r);
}

/* ------------------------------------------------------------ 7. warning */

TEST(server_warns_when_exposed_without_key) {
    CHECK(ak_server_host_is_loopback("127.0.0.1") && ak_server_host_is_loopback("127.1.2.3") &&
              ak_server_host_is_loopback("::1") && ak_server_host_is_loopback("localhost") &&
              ak_server_host_is_loopback(NULL),
          "loopback addresses");
    CHECK(!ak_server_host_is_loopback("0.0.0.0") && !ak_server_host_is_loopback("::") &&
              !ak_server_host_is_loopback("10.1.2.3") && !ak_server_host_is_loopback("192.168.0.1") &&
              !ak_server_host_is_loopback("::ffff:10.0.0.1"),
          "addresses others can reach");
    /* the CLI warns before anything is bound (the model path is bad, so it
     * stops right after the warning; nothing listens) */
    const char *bin = getenv("AK_BIN");
    if (!bin || !*bin) bin = "build/agentkv";
    for (int k = 0; k < 3; k++) {
        char cmd[1024], out[4096];
        snprintf(cmd, sizeof cmd, "timeout 20 %s serve -m /nonexistent/model.gguf --host %s %s 2>&1", bin,
                 k == 1 ? "127.0.0.1" : "0.0.0.0", k == 2 ? "--api-key-file /nonexistent/key" : "");
        FILE *p = popen(cmd, "r");
        REQUIRE(p, "popen");
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = 0;
        pclose(p);
        int warned = strstr(out, "warning: --host") != NULL;
        CHECK(warned == (k == 0), "%s: warned %d:\n%s", cmd, warned, out);
    }
}

/* ------------------------------------------------------------ 8. web guards */

/* Sends raw bytes on a fresh connection and reads the answer to EOF. */
static resp raw_exchange(int port, const char *data, size_t len) {
    resp r = {0};
    int fd = dial(port, 5000);
    if (fd < 0) return r;
    if (send_all(fd, data, len) == 0) {
        size_t n;
        int to;
        char *raw = read_all(fd, &n, &to);
        parse_resp(&r, raw, n);
        r.timed_out = to;
    }
    close(fd);
    return r;
}

static resp raw_str(int port, const char *data) { return raw_exchange(port, data, strlen(data)); }

/* The OpenAI error code of a response body ("" when it is not one). */
static const char *code_of_resp(const resp *r, char *buf, size_t cap) {
    cJSON *j = r->body ? cJSON_Parse(r->body) : NULL;
    cJSON *e = cJSON_GetObjectItem(j, "error");
    const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(e, "code"));
    int shaped = cJSON_IsString(cJSON_GetObjectItem(e, "message")) && cJSON_IsString(cJSON_GetObjectItem(e, "type")) &&
                 cJSON_GetObjectItem(e, "param") && cJSON_GetObjectItem(e, "code");
    snprintf(buf, cap, "%s", shaped && c ? c : "");
    cJSON_Delete(j);
    return buf;
}

/* Headers of a request that announces a 3 MB JSON body that never comes:
 * an answer proves the request was refused on its headers. */
#define BIG_BODY_HEADERS "Content-Length: 3000000\r\nConnection: close\r\n\r\n"

/* One request line + header lines that announces a big body and is answered
 * without one within 2 s; returns the response. */
static resp refused_on_headers(ak_test_ctx *t, int port, const char *head) {
    double t0 = ak_now();
    resp r = raw_str(port, head);
    CHECK(ak_now() - t0 < 2.0, "answered after %.2f s (not on the headers?)", ak_now() - t0);
    return r;
}

TEST(server_guard_host_refused) {
    srv_rig r;
    ak_server_config lim = {0};
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    char code[64];
    /* a page of attacker.example whose name was rebound to 127.0.0.1 */
    resp a = refused_on_headers(t, r.port,
                                "POST /v1/chat/completions HTTP/1.1\r\nHost: attacker.example\r\n"
                                "Content-Type: application/json\r\n" BIG_BODY_HEADERS);
    CHECK(a.status == 403 && !strcmp(code_of_resp(&a, code, sizeof code), "host_not_allowed"), "POST chat: %d %s",
          a.status, a.body ? a.body : "");
    resp_free(&a);
    a = raw_str(r.port, "GET /v1/agents HTTP/1.1\r\nHost: attacker.example:8080\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 403 && !strcmp(code_of_resp(&a, code, sizeof code), "host_not_allowed"), "GET agents: %d %s",
          a.status, a.body ? a.body : "");
    resp_free(&a);
    /* the loopback names, with or without a port, are served */
    static const char *const ok_hosts[] = {"localhost", "LOCALHOST:1234", "127.0.0.1", "127.0.0.1:80", "[::1]",
                                           "[::1]:8080", "localhost."};
    for (size_t i = 0; i < sizeof ok_hosts / sizeof *ok_hosts; i++) {
        char req[256];
        snprintf(req, sizeof req, "GET /v1/agents HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", ok_hosts[i]);
        a = raw_str(r.port, req);
        CHECK(a.status == 200, "Host %s: %d %s", ok_hosts[i], a.status, a.body ? a.body : "");
        resp_free(&a);
    }
    /* names that only look like them are not */
    static const char *const bad_hosts[] = {"localhost.attacker.example", "127.0.0.1.nip.io", "[::1", "localhost:80x",
                                            "127.0.0.1 evil", ""};
    for (size_t i = 0; i < sizeof bad_hosts / sizeof *bad_hosts; i++) {
        char req[256];
        snprintf(req, sizeof req, "GET /v1/agents HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", bad_hosts[i]);
        a = raw_str(r.port, req);
        CHECK(a.status == 403 || a.status == 400, "Host '%s': %d %s", bad_hosts[i], a.status, a.body ? a.body : "");
        resp_free(&a);
    }
    /* no Host: served on HTTP/1.0 (no browser sends that), 400 on HTTP/1.1 */
    a = raw_str(r.port, "GET /v1/agents HTTP/1.0\r\n\r\n");
    CHECK(a.status == 200, "HTTP/1.0 without Host: %d", a.status);
    resp_free(&a);
    a = raw_str(r.port, "GET /v1/agents HTTP/1.1\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 400 && !strcmp(code_of_resp(&a, code, sizeof code), "malformed_request"),
          "HTTP/1.1 without Host: %d %s", a.status, a.body ? a.body : "");
    resp_free(&a);
    /* /health answers probes that name the machine by any address */
    a = raw_str(r.port, "GET /health HTTP/1.1\r\nHost: 10.1.2.3:8080\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 200, "/health: %d", a.status);
    resp_free(&a);
    rig_stop(&r);
}

TEST(server_guard_allowed_host_names) {
    static const char *const names[] = {"proxy.example", "[fd00::7]"};
    srv_rig r;
    ak_server_config lim = {0};
    lim.allowed_hosts = names;
    lim.n_allowed_hosts = 2;
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    static const char *const hosts[] = {"proxy.example", "PROXY.example:8443", "[fd00::7]:80", "attacker.example"};
    for (int i = 0; i < 4; i++) {
        char req[256];
        snprintf(req, sizeof req, "GET /v1/agents HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", hosts[i]);
        resp a = raw_str(r.port, req);
        CHECK(a.status == (i < 3 ? 200 : 403), "Host %s: %d", hosts[i], a.status);
        resp_free(&a);
    }
    rig_stop(&r);
    /* "*" turns the check off */
    static const char *const any[] = {"*"};
    lim.allowed_hosts = any;
    lim.n_allowed_hosts = 1;
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    resp a = raw_str(r.port, "GET /v1/agents HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 200, "--allowed-host '*': %d", a.status);
    resp_free(&a);
    rig_stop(&r);
    CHECK(ak_server_host_name_valid("*") && ak_server_host_name_valid("a.example") && ak_server_host_name_valid("[::1]") &&
              ak_server_host_name_valid("10.0.0.1"),
          "valid --allowed-host values");
    CHECK(!ak_server_host_name_valid("") && !ak_server_host_name_valid("a.example:80") &&
              !ak_server_host_name_valid("::1") && !ak_server_host_name_valid("http://a.example") &&
              !ak_server_host_name_valid("a b"),
          "invalid --allowed-host values");
}

TEST(server_guard_content_type_415) {
    srv_rig r;
    ak_server_config lim = {0};
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    char code[64];
    /* what a web form or a fetch without preflight can send; and no type at all */
    static const char *const types[] = {"Content-Type: text/plain\r\n", "Content-Type: application/x-www-form-urlencoded\r\n",
                                        "Content-Type: multipart/form-data; boundary=x\r\n", "Content-Type: application/jsonx\r\n",
                                        ""};
    for (int i = 0; i < 5; i++) {
        char req[512];
        snprintf(req, sizeof req, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n%s" BIG_BODY_HEADERS, types[i]);
        resp a = refused_on_headers(t, r.port, req);
        CHECK(a.status == 415 && !strcmp(code_of_resp(&a, code, sizeof code), "unsupported_media_type"), "%s: %d %s",
              types[i], a.status, a.body ? a.body : "");
        resp_free(&a);
    }
    /* a form POST without a body is refused too */
    resp a = raw_str(r.port, "POST /v1/agents/x/cards HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
                             "Content-Length: 0\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 415, "empty text/plain POST: %d", a.status);
    resp_free(&a);
    /* JSON with parameters, any case */
    const char *body = "{\"model\":\"m\",\"prompt\":\"Once\",\"max_tokens\":2}";
    char req[512];
    snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: Application/JSON ; charset=utf-8\r\n"
                              "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", strlen(body), body);
    a = raw_str(r.port, req);
    CHECK(a.status == 200, "application/json with a charset: %d %s", a.status, a.body ? a.body : "");
    resp_free(&a);
    /* a transfer coding the server cannot read */
    a = refused_on_headers(t, r.port, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                      "Transfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 501 && !strcmp(code_of_resp(&a, code, sizeof code), "unsupported_transfer_encoding"), "gzip: %d %s",
          a.status, a.body ? a.body : "");
    resp_free(&a);
    rig_stop(&r);
}

/* The value of header name in a response head ("" when absent). */
static const char *header_value(const resp *r, const char *name, char *buf, size_t cap) {
    buf[0] = 0;
    size_t n = strlen(name);
    for (const char *l = r->head; l && *l;) {
        if (!strncasecmp(l, name, n) && l[n] == ':') {
            const char *v = l + n + 1 + strspn(l + n + 1, " ");
            size_t len = strcspn(v, "\r\n");
            snprintf(buf, cap, "%.*s", (int)len, v);
            break;
        }
        const char *nl = strstr(l, "\r\n");
        l = nl ? nl + 2 : NULL;
    }
    return buf;
}

TEST(server_guard_origin_and_cors) {
    srv_rig r;
    ak_server_config lim = {0};
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    char code[64], v[1024];
    /* CORS off: any request with an Origin is refused, GET included, and a
     * preflight does not succeed */
    resp a = raw_str(r.port, "GET /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://evil.example\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 403 && !strcmp(code_of_resp(&a, code, sizeof code), "origin_not_allowed"), "GET agents: %d %s",
          a.status, a.body ? a.body : "");
    CHECK(!*header_value(&a, "Access-Control-Allow-Origin", v, sizeof v), "a refused origin got ACAO %s", v);
    resp_free(&a);
    a = refused_on_headers(t, r.port, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: null\r\n"
                                      "Content-Type: application/json\r\n" BIG_BODY_HEADERS);
    CHECK(a.status == 403 && !strcmp(code_of_resp(&a, code, sizeof code), "origin_not_allowed"), "POST chat: %d", a.status);
    resp_free(&a);
    a = raw_str(r.port, "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://localhost:3000\r\n"
                        "Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 403, "preflight with CORS off: %d", a.status);
    resp_free(&a);
    rig_stop(&r);

    static const char *const origins[] = {"http://app.example:3000"};
    lim.cors_origins = origins;
    lim.n_cors_origins = 1;
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    a = raw_str(r.port, "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://app.example:3000\r\n"
                        "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type,authorization,"
                        "x-agent-id,x-stainless-os\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 204, "preflight: %d", a.status);
    CHECK(!strcmp(header_value(&a, "Access-Control-Allow-Origin", v, sizeof v), "http://app.example:3000"), "ACAO %s", v);
    CHECK(!strcmp(header_value(&a, "Vary", v, sizeof v), "Origin"), "Vary %s", v);
    header_value(&a, "Access-Control-Allow-Methods", v, sizeof v);
    CHECK(strstr(v, "GET") && strstr(v, "POST") && strstr(v, "DELETE") && strstr(v, "OPTIONS"), "methods %s", v);
    CHECK(atoi(header_value(&a, "Access-Control-Max-Age", v, sizeof v)) > 0, "max age %s", v);
    CHECK(!*header_value(&a, "Access-Control-Allow-Credentials", v, sizeof v), "credentials %s", v);
    header_value(&a, "Access-Control-Allow-Headers", v, sizeof v);
    static const char *const wanted[] = {"Content-Type", "Authorization", "X-Agent-Id", "X-Stainless-OS",
                                         "X-Stainless-Arch", "X-Stainless-Lang", "X-Stainless-Package-Version",
                                         "X-Stainless-Runtime", "X-Stainless-Runtime-Version",
                                         "X-Stainless-Retry-Count", "X-Stainless-Timeout"};
    for (size_t i = 0; i < sizeof wanted / sizeof *wanted; i++)
        CHECK(strcasestr(v, wanted[i]) != NULL, "Allow-Headers lacks %s: %s", wanted[i], v);
    resp_free(&a);
    /* an allowed origin's ordinary answers carry ACAO: JSON, an error, a stream */
    a = raw_str(r.port, "GET /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://app.example:3000\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 200 && !strcmp(header_value(&a, "Access-Control-Allow-Origin", v, sizeof v), "http://app.example:3000"),
          "GET agents: %d, ACAO %s", a.status, v);
    CHECK(!strcmp(header_value(&a, "Vary", v, sizeof v), "Origin"), "Vary %s", v);
    resp_free(&a);
    a = raw_str(r.port, "GET /v1/nothing HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://app.example:3000\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 404 && *header_value(&a, "Access-Control-Allow-Origin", v, sizeof v), "404: %d, ACAO %s", a.status, v);
    resp_free(&a);
    a = http(r.port, "POST", "/v1/completions", "Origin: http://app.example:3000\r\n",
             "{\"model\":\"m\",\"prompt\":\"Once\",\"max_tokens\":3,\"stream\":true}", 10000);
    CHECK(a.status == 200 && a.body && strstr(a.body, "data: [DONE]") &&
              *header_value(&a, "Access-Control-Allow-Origin", v, sizeof v),
          "stream: %d, ACAO %s", a.status, v);
    resp_free(&a);
    /* another origin: 403, no ACAO */
    a = raw_str(r.port, "GET /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://app.example:3001\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 403 && !*header_value(&a, "Access-Control-Allow-Origin", v, sizeof v), "other origin: %d", a.status);
    resp_free(&a);
    /* no Origin (curl, SDKs outside browsers): served as before */
    a = http(r.port, "GET", "/v1/agents", NULL, NULL, 5000);
    CHECK(a.status == 200, "no Origin: %d", a.status);
    resp_free(&a);
    rig_stop(&r);

    static const char *const any[] = {"*"};
    lim.cors_origins = any;
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    a = raw_str(r.port, "GET /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://any.example\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 200 && !strcmp(header_value(&a, "Access-Control-Allow-Origin", v, sizeof v), "*"), "'*': %d, ACAO %s",
          a.status, v);
    resp_free(&a);
    rig_stop(&r);
    CHECK(ak_server_origin_valid("*") && ak_server_origin_valid("null") && ak_server_origin_valid("http://localhost:3000") &&
              ak_server_origin_valid("https://app.example") && ak_server_origin_valid("http://[::1]:8080"),
          "valid --cors-origin values");
    CHECK(!ak_server_origin_valid("app.example") && !ak_server_origin_valid("http://app.example/") &&
              !ak_server_origin_valid("http://") && !ak_server_origin_valid("http://a b") &&
              !ak_server_origin_valid("http://app.example:80x"),
          "invalid --cors-origin values");
}

TEST(server_protocol_errors_are_json) {
    srv_rig r;
    ak_server_config lim = {0};
    static const char *const origins[] = {"http://app.example"};
    lim.cors_origins = origins;
    lim.n_cors_origins = 1;
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    char code[64], v[256];
    const char *chunked = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Origin: http://app.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    /* a chunk size that is not hexadecimal; a chunk not ended by CRLF */
    static const char *const bodies[] = {"zz\r\nabc\r\n0\r\n\r\n", "5\r\n{\"mod\r\n3xyz\r\n0\r\n\r\n"};
    for (int i = 0; i < 2; i++) {
        char req[512];
        snprintf(req, sizeof req, "%s%s", chunked, bodies[i]);
        resp a = raw_str(r.port, req);
        CHECK(a.status == 400 && !strcmp(code_of_resp(&a, code, sizeof code), "malformed_request"), "chunked %d: %d %s", i,
              a.status, a.body ? a.body : "");
        CHECK(strcasestr(a.head ? a.head : "", "Content-Type: application/json") != NULL, "chunked %d: head %s", i,
              a.head ? a.head : "");
        CHECK(*header_value(&a, "Access-Control-Allow-Origin", v, sizeof v), "chunked %d: no ACAO", i);
        resp_free(&a);
    }
    /* a chunk size past 64 bits */
    char req[1024];
    snprintf(req, sizeof req, "%s%s", chunked, "fffffffffffffffffffff\r\nx\r\n0\r\n\r\n");
    resp a = raw_str(r.port, req);
    CHECK(a.status == 413 && !strcmp(code_of_resp(&a, code, sizeof code), "request_too_large"), "huge chunk: %d %s",
          a.status, a.body ? a.body : "");
    resp_free(&a);
    /* a malformed Content-Length, a header line without a colon, headers too large */
    a = raw_str(r.port, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 12abc\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 400 && !strcmp(code_of_resp(&a, code, sizeof code), "malformed_request"), "Content-Length: %d %s",
          a.status, a.body ? a.body : "");
    resp_free(&a);
    a = raw_str(r.port, "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 400 && *code_of_resp(&a, code, sizeof code), "header line: %d %s", a.status, a.body ? a.body : "");
    resp_free(&a);
    size_t big = 100000;
    char *huge = malloc(big + 200);
    REQUIRE(huge, "oom");
    int n = snprintf(huge, 200, "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ");
    memset(huge + n, 'a', big);
    memcpy(huge + n + big, "\r\n\r\n", 5);
    a = raw_str(r.port, huge);
    free(huge);
    CHECK(a.status == 431 && !strcmp(code_of_resp(&a, code, sizeof code), "request_header_fields_too_large"),
          "headers too large: %d %s", a.status, a.body ? a.body : "");
    resp_free(&a);
    /* the server still serves */
    a = http(r.port, "GET", "/health", NULL, NULL, 5000);
    CHECK(a.status == 200, "/health after: %d", a.status);
    resp_free(&a);
    rig_stop(&r);
}

TEST(server_models_retrieve) {
    srv_rig r;
    ak_server_config lim = {0};
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    resp a = http(r.port, "GET", "/v1/models/m", NULL, NULL, 5000);
    cJSON *j = a.status == 200 ? cJSON_Parse(a.body) : NULL;
    CHECK(j && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(j, "id")), "m") &&
              !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(j, "object")), "model") &&
              cJSON_IsNumber(cJSON_GetObjectItem(j, "created")) &&
              cJSON_IsString(cJSON_GetObjectItem(j, "owned_by")),
          "GET /v1/models/m: %d %s", a.status, a.body ? a.body : "");
    cJSON_Delete(j);
    resp_free(&a);
    char code[64];
    a = http(r.port, "GET", "/v1/models/gpt-4o", NULL, NULL, 5000);
    CHECK(a.status == 404 && !strcmp(code_of_resp(&a, code, sizeof code), "model_not_found"), "another id: %d %s",
          a.status, a.body ? a.body : "");
    j = cJSON_Parse(a.body ? a.body : "");
    const char *param = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "param"));
    CHECK(param && !strcmp(param, "model"), "param: %s", a.body ? a.body : "");
    cJSON_Delete(j);
    resp_free(&a);
    a = http(r.port, "DELETE", "/v1/models/m", NULL, NULL, 5000);
    CHECK(a.status == 405, "DELETE /v1/models/m: %d", a.status);
    resp_free(&a);
    rig_stop(&r);
}

/* ------------------------------------------------------------ 9. the console */

/* A raw request on 127.0.0.1 with the key: METHOD PATH, Host host, Origin
 * origin (NULL: none). */
static resp with_origin(int port, const char *method, const char *path, const char *host, const char *origin) {
    char req[1024];
    snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: %s\r\n%s%s%s%sConnection: close\r\n\r\n", method, path, host,
             origin ? "Origin: " : "", origin ? origin : "", origin ? "\r\n" : "", key_hdr);
    return raw_str(port, req);
}

/* The console (GET /, /console, /console/NAME) needs no key (the data it
 * reads does) and comes with the strict CSP, byte for byte the files of
 * src/serve/console/; a POST or DELETE whose Origin is the request's own
 * (http:// or https:// and its Host: the page calling back) passes the
 * Origin check, any other origin does not, nor the same one when the Host
 * check is off (next test). */
TEST(server_console_keyless_csp_same_origin) {
    srv_rig r;
    ak_server_config lim = {0};
    lim.api_keys = hard_key;
    lim.n_api_keys = 1;
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    char v[1024], code[64];
    static const char csp[] = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                              "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
    static const char *const pages[][3] = {
        {"/", "console.html", "text/html; charset=utf-8"},
        {"/console", "console.html", "text/html; charset=utf-8"},
        {"/console/console.js", "console.js", "text/javascript; charset=utf-8"},
        {"/console/console.css", "console.css", "text/css; charset=utf-8"},
    };
    for (size_t i = 0; i < sizeof pages / sizeof *pages; i++) {
        resp a = http(r.port, "GET", pages[i][0], NULL, NULL, 5000);
        char path[256];
        snprintf(path, sizeof path, "src/serve/console/%s", pages[i][1]);
        size_t len = 0;
        char *want = ak_read_file(path, &len, NULL);
        CHECK(a.status == 200 && want && a.body_len == len && !memcmp(a.body, want, len),
              "GET %s without the key: %d, %zu bytes (the file: %zu)", pages[i][0], a.status, a.body_len, len);
        CHECK(!strcmp(header_value(&a, "Content-Type", v, sizeof v), pages[i][2]), "%s: type %s", pages[i][0], v);
        CHECK(!strcmp(header_value(&a, "Content-Security-Policy", v, sizeof v), csp), "%s: CSP %s", pages[i][0], v);
        CHECK(!strcmp(header_value(&a, "X-Content-Type-Options", v, sizeof v), "nosniff") &&
                  !strcmp(header_value(&a, "X-Frame-Options", v, sizeof v), "DENY"),
              "%s: nosniff, DENY", pages[i][0]);
        free(want);
        resp_free(&a);
    }
    resp a = http(r.port, "GET", "/console/nothing.js", NULL, NULL, 5000);
    CHECK(a.status == 404 && !strcmp(code_of_resp(&a, code, sizeof code), "unknown_url"), "unknown file: %d", a.status);
    resp_free(&a);
    a = http(r.port, "POST", "/", NULL, "{}", 5000);
    CHECK(a.status == 405, "POST /: %d", a.status);
    resp_free(&a);
    a = http(r.port, "GET", "/v1/agents", NULL, NULL, 5000);
    CHECK(a.status == 401, "the data needs the key: %d", a.status);
    resp_free(&a);
    a = raw_str(r.port, "GET / HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n");
    CHECK(a.status == 403 && !strcmp(code_of_resp(&a, code, sizeof code), "host_not_allowed"), "foreign Host: %d",
          a.status);
    resp_free(&a);
    /* the page's own origin: past the guard (404: no such agent) */
    static const char *const own[][2] = {
        {"127.0.0.1", "http://127.0.0.1"}, {"127.0.0.1", "HTTPS://127.0.0.1"}, {"localhost:8080", "http://LOCALHOST:8080"}};
    for (size_t i = 0; i < sizeof own / sizeof *own; i++) {
        a = with_origin(r.port, "DELETE", "/v1/agents/nobody", own[i][0], own[i][1]);
        CHECK(a.status == 404 && !strcmp(code_of_resp(&a, code, sizeof code), "agent_not_found"),
              "Host %s, Origin %s: %d %s", own[i][0], own[i][1], a.status, a.body ? a.body : "");
        CHECK(!*header_value(&a, "Access-Control-Allow-Origin", v, sizeof v), "same origin got ACAO %s", v);
        resp_free(&a);
    }
    static const char *const other[][2] = {{"127.0.0.1", "http://127.0.0.1:1"},
                                           {"127.0.0.1", "http://localhost"},
                                           {"127.0.0.1", "null"},
                                           {"127.0.0.1", "http://127.0.0.1.evil.example"},
                                           {"127.0.0.1", "ftp://127.0.0.1"},
                                           {"localhost:8080", "http://localhost:80"}};
    for (size_t i = 0; i < sizeof other / sizeof *other; i++) {
        a = with_origin(r.port, "DELETE", "/v1/agents/nobody", other[i][0], other[i][1]);
        CHECK(a.status == 403 && !strcmp(code_of_resp(&a, code, sizeof code), "origin_not_allowed"),
              "Host %s, Origin %s: %d", other[i][0], other[i][1], a.status);
        resp_free(&a);
    }
    rig_stop(&r);
}

/* With the Host check off (--allowed-host '*') a name may be a rebound one:
 * an Origin equal to it is no proof of a page this server served. */
TEST(server_console_same_origin_needs_the_host_check) {
    static const char *const any[] = {"*"};
    const ak_server_config lim = {.api_keys = hard_key, .n_api_keys = 1, .allowed_hosts = any, .n_allowed_hosts = 1};
    srv_rig r;
    if (rig_start(t, &r, "models/stories260K.gguf", &lim, NULL) < 0) return;
    char code[64];
    resp a = with_origin(r.port, "DELETE", "/v1/agents/nobody", "rebound.example", "http://rebound.example");
    CHECK(a.status == 403 && !strcmp(code_of_resp(&a, code, sizeof code), "origin_not_allowed"), "%d %s", a.status,
          a.body ? a.body : "");
    resp_free(&a);
    a = with_origin(r.port, "DELETE", "/v1/agents/nobody", "rebound.example", NULL);
    CHECK(a.status == 404, "without an Origin: %d", a.status);
    resp_free(&a);
    rig_stop(&r);
}
