/* server.c - see server.h */
#include "serve/server.h"

#include "serve/api.h"
#include "base/buf.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct ak_server {
    ak_server_config cfg;
    struct MHD_Daemon *d;
    int port;
    pthread_mutex_t mu;       /* guards next_id */
    uint64_t next_id;
    uint64_t id_salt;
    atomic_size_t buffered;   /* request-body bytes reserved by all connections */
    pthread_key_t conn_key;   /* a connection thread's MHD_Connection (see protocol_error) */
};

/* One connection's request: its body as it arrives. */
typedef struct {
    char *body;
    size_t len, cap;
    size_t reserved;          /* bytes of s->buffered this request holds */
    int too_large;            /* over max_body: the rest is discarded, 413 */
    int over_cap;             /* over max_buffered: the rest is discarded, 503 */
} conn;

#define logf_(s, ...) ak_logf((s)->cfg.log, (s)->cfg.log_ud, __VA_ARGS__)

/* Grows the connection's share of the global body budget to `total` bytes.
 * Returns 0, or -1 (nothing changed) when all connections together would
 * hold more than max_buffered. */
static int reserve(ak_server *s, conn *cn, size_t total) {
    if (total <= cn->reserved) return 0;
    size_t add = total - cn->reserved;
    size_t before = atomic_fetch_add(&s->buffered, add);
    if (before + add > s->cfg.max_buffered || before + add < before) {
        atomic_fetch_sub(&s->buffered, add);
        return -1;
    }
    cn->reserved = total;
    return 0;
}

/* Frees the body and gives its share of the budget back. */
static void release_body(ak_server *s, conn *cn) {
    free(cn->body);
    cn->body = NULL;
    cn->len = cn->cap = 0;
    atomic_fetch_sub(&s->buffered, cn->reserved);
    cn->reserved = 0;
}

/* ------------------------------------------------------------ web guards */

/* The request headers a browser client may send: what the official openai
 * npm client sets (its x-stainless-* platform, retry and helper headers,
 * User-Agent, which Firefox lets a page set, and OpenAI-Organization /
 * OpenAI-Project when configured) and this server's X-Agent-Id. */
#define AK_CORS_ALLOW_HEADERS                                                                                          \
    "Content-Type, Authorization, X-Agent-Id, OpenAI-Organization, OpenAI-Project, User-Agent, "                       \
    "X-Stainless-Arch, X-Stainless-Lang, X-Stainless-OS, X-Stainless-Package-Version, X-Stainless-Runtime, "           \
    "X-Stainless-Runtime-Version, X-Stainless-Retry-Count, X-Stainless-Timeout, X-Stainless-Helper-Method, "           \
    "X-Stainless-Poll-Helper, X-Stainless-Custom-Poll-Interval"
#define AK_CORS_ALLOW_METHODS "GET, POST, DELETE, OPTIONS"
#define AK_CORS_MAX_AGE_S "600"

/* 1 when the n bytes at a equal the string b, ignoring ASCII case. */
static int eq_n(const char *a, size_t n, const char *b) { return strlen(b) == n && !strncasecmp(a, b, n); }

/* 1 when a host name of n bytes (as host_name gives it) is the name b,
 * ignoring ASCII case and one trailing dot of b. */
static int name_eq(const char *a, size_t n, const char *b) {
    size_t m = strlen(b);
    if (m > 1 && b[0] != '[' && b[m - 1] == '.') m--;
    return m == n && !strncasecmp(a, b, n);
}

/* Splits a Host header value into its name (an IPv6 literal keeps its
 * brackets; one trailing dot of a domain name is dropped) and an optional
 * all-digit port. Returns 0, or -1 when it is not of that form. */
static int host_name(const char *h, const char **name, size_t *len) {
    const char *end;
    if (h[0] == '[') {
        const char *rb = strchr(h, ']');
        if (!rb) return -1;
        end = rb + 1;
    } else {
        end = h + strcspn(h, ":");
    }
    if (*end == ':') {
        const char *p = end + 1;
        if (!*p || p[strspn(p, "0123456789")]) return -1;
    } else if (*end) {
        return -1;
    }
    *name = h;
    *len = (size_t)(end - h);
    if (*len > 1 && h[0] != '[' && h[*len - 1] == '.') (*len)--;
    return *len && !memchr(h, ' ', *len) ? 0 : -1;
}

/* 1 when a request with this Host header (NULL: none) may be served: the
 * check is off ("*" among allowed_hosts), or the header is missing (an
 * HTTP/1.0 client: browsers always send it, so no web page is behind such
 * a request; web_guard refuses HTTP/1.1 without it), or its name is
 * localhost, 127.0.0.1, [::1], the bound address or an allowed name. A page
 * whose own name an attacker rebound to 127.0.0.1 sends that name: refused. */
static int host_allowed(const ak_server *s, const char *host) {
    for (int i = 0; i < s->cfg.n_allowed_hosts; i++)
        if (!strcmp(s->cfg.allowed_hosts[i], "*")) return 1;
    if (!host) return 1;
    const char *name;
    size_t n;
    if (host_name(host, &name, &n) < 0) return 0;
    static const char *const local[] = {"localhost", "127.0.0.1", "[::1]"};
    for (size_t i = 0; i < sizeof local / sizeof *local; i++)
        if (eq_n(name, n, local[i])) return 1;
    if (name[0] == '[' ? n > 2 && eq_n(name + 1, n - 2, s->cfg.host) : name_eq(name, n, s->cfg.host)) return 1;
    for (int i = 0; i < s->cfg.n_allowed_hosts; i++)
        if (name_eq(name, n, s->cfg.allowed_hosts[i])) return 1;
    return 0;
}

/* The Access-Control-Allow-Origin value for a request from origin: origin
 * itself when cors_origins names it, "*" when it holds "*", NULL when the
 * origin is not allowed (or absent). */
static const char *cors_value(const ak_server *s, const char *origin) {
    if (!origin) return NULL;
    int any = 0;
    for (int i = 0; i < s->cfg.n_cors_origins; i++) {
        if (!strcmp(s->cfg.cors_origins[i], "*")) any = 1;
        else if (!strcasecmp(s->cfg.cors_origins[i], origin)) return origin;
    }
    return any ? "*" : NULL;
}

/* Adds the CORS headers of an ordinary response: with CORS on, Vary: Origin
 * (the answer depends on it, for caches), and Access-Control-Allow-Origin
 * when the request's Origin is allowed. Nothing with CORS off. */
static void add_cors(const ak_server *s, struct MHD_Connection *c, struct MHD_Response *r) {
    if (!s->cfg.n_cors_origins) return;
    const char *acao = cors_value(s, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"));
    if (acao) MHD_add_response_header(r, "Access-Control-Allow-Origin", acao);
    MHD_add_response_header(r, "Vary", "Origin");
}

/* 1 when a Content-Type value is application/json, parameters such as
 * "; charset=utf-8" allowed, case ignored. */
static int is_json_type(const char *ct) {
    ct += strspn(ct, " \t");
    size_t n = strcspn(ct, ";");
    while (n && (ct[n - 1] == ' ' || ct[n - 1] == '\t')) n--;
    return eq_n(ct, n, "application/json");
}

int ak_server_origin_valid(const char *o) {
    if (!o || !strcmp(o, "*") || !strcmp(o, "null")) return o != NULL;
    const char *sep = strstr(o, "://");
    if (!sep || sep == o || !sep[3]) return 0;
    for (const char *p = o; p < sep; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || strchr("+-.", *p)))
            return 0;
    const char *name;
    size_t n;
    return !strpbrk(sep + 3, "/?#@ ") && host_name(sep + 3, &name, &n) == 0;
}

int ak_server_host_name_valid(const char *h) {
    if (!h || !*h) return 0;
    if (!strcmp(h, "*")) return 1;
    const char *name;
    size_t n;
    size_t len = strlen(h);
    return !strpbrk(h, "/?#@") && host_name(h, &name, &n) == 0 && (h[0] == '[' ? h[len - 1] == ']' : !strchr(h, ':'));
}

/* ------------------------------------------------------------ responses */

/* Queues body (malloc'd, taken over; NULL: a 500 out-of-memory answer) with
 * its content type and, if retry_after is not NULL, a Retry-After header;
 * counts the answer in the metrics. Returns MHD's verdict. */
static enum MHD_Result send_body_ex(ak_server *s, struct MHD_Connection *c, const char *endpoint, int status,
                                    char *body, const char *content_type, const char *retry_after) {
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                                  "\"code\":null}}";
        body = strdup(oom);
        status = 500;
        if (!body) return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", content_type);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    add_cors(s, c, r);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    ak_metrics_request(s->cfg.metrics, endpoint, status);
    return rc;
}

static enum MHD_Result send_body(ak_server *s, struct MHD_Connection *c, const char *endpoint, int status,
                                 char *body, const char *content_type) {
    return send_body_ex(s, c, endpoint, status, body, content_type, NULL);
}

static enum MHD_Result send_json(ak_server *s, struct MHD_Connection *c, const char *endpoint, int status,
                                 cJSON *j) {
    char *body = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return send_body(s, c, endpoint, status, body, "application/json");
}

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

static cJSON *error_json(int status, const char *message, const char *param, const char *code) {
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", error_type(status));
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    return j;
}

static enum MHD_Result send_error(ak_server *s, struct MHD_Connection *c, const char *endpoint, int status,
                                  const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static enum MHD_Result send_error(ak_server *s, struct MHD_Connection *c, const char *endpoint, int status,
                                  const char *param, const char *code, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return send_json(s, c, endpoint, status, error_json(status, msg, param, code));
}

/* -------------------------------------------------------- completions */

static void make_id(ak_server *s, const char *prefix, char *out, size_t cap) {
    pthread_mutex_lock(&s->mu);
    uint64_t n = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    snprintf(out, cap, "%s-%016llx%08llx", prefix, (unsigned long long)s->id_salt, (unsigned long long)n);
}

static const char *finish_name(ak_finish f) { return f == AK_FINISH_LENGTH ? "length" : "stop"; }

static cJSON *usage_json(const ak_req_result *res) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", res->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", res->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", res->prompt_tokens + res->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", res->turn.reused);
    /* memory tokens a reuse method recomputed (cacheblend, agentkvshift): part of cached_tokens */
    cJSON_AddNumberToObject(d, "memory_recomputed_tokens", res->mem_recomputed);
    return u;
}

static cJSON *agentkv_json(const ak_api_request *p, const ak_req_result *res) {
    cJSON *a = cJSON_CreateObject();
    if (p->agent_id[0]) cJSON_AddStringToObject(a, "agent_id", p->agent_id);
    else cJSON_AddNullToObject(a, "agent_id");
    if (p->pool[0]) cJSON_AddStringToObject(a, "pool", p->pool);
    else cJSON_AddNullToObject(a, "pool");
    cJSON_AddStringToObject(a, "tier", ak_tier_name(res->turn.tier));
    cJSON_AddStringToObject(a, "match", ak_match_name(res->turn.match));
    cJSON_AddNumberToObject(a, "reused", res->turn.reused);
    cJSON_AddNumberToObject(a, "shared", res->turn.shared);
    cJSON_AddNumberToObject(a, "prefilled", res->turn.prefilled);
    cJSON_AddNumberToObject(a, "restore_ms", res->turn.restore_ms);
    cJSON_AddBoolToObject(a, "restored_ahead", res->turn.restored_ahead);
    cJSON_AddNumberToObject(a, "prefill_ms", res->turn.prefill_ms);
    cJSON_AddNumberToObject(a, "memory_reuse_ms", res->mem_ms);
    cJSON_AddNumberToObject(a, "queue_ms", res->queue_ms);
    cJSON_AddNumberToObject(a, "ttft_ms", res->ttft_ms);
    cJSON_AddNumberToObject(a, "decode_ms", res->decode_ms);
    cJSON_AddNumberToObject(a, "evicted", res->turn.evicted);
    return a;
}

/* The skeleton of a response or chunk object. */
static cJSON *response_head(ak_server *s, const ak_api_request *p, const char *id, long created, int chunk) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "object", p->chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
    cJSON_AddNumberToObject(j, "created", (double)created);
    cJSON_AddStringToObject(j, "model", s->cfg.model_id);
    cJSON_AddStringToObject(j, "system_fingerprint", s->cfg.model->fingerprint);
    return j;
}

/* A choice: for chat chunks a delta, for chat a message, else text. */
static void add_choice(cJSON *j, const ak_api_request *p, int chunk, const char *role, const char *text, const char *finish) {
    cJSON *choices = cJSON_AddArrayToObject(j, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (p->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, chunk ? "delta" : "message");
        if (role) cJSON_AddStringToObject(m, "role", role);
        if (text) cJSON_AddStringToObject(m, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text ? text : "");
    }
    cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
}

/* The state of one SSE stream. */
typedef struct {
    ak_server *s;
    ak_request *r;
    ak_api_request p;
    char id[64];
    long created;
    size_t have;              /* text bytes already sent */
    ak_buf out;               /* formatted events not yet handed to MHD */
    int fd;                   /* the client's socket, to notice it leaving (-1: unknown) */
    size_t out_pos;           /* bytes of out already handed to MHD */
    int sent_role, ended;
} stream;

/* The client's socket, or -1 when MHD does not say. */
static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? (int)ci->connect_fd : -1;
}

/* 1 when the peer has closed or reset the connection (or shut down its
 * sending side: an HTTP client does that only when leaving). Data waiting to
 * be read (a pipelined request) is not a departure. Never blocks. */
static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd pf = {fd, POLLIN | POLLRDHUP, 0};
    if (poll(&pf, 1, 0) <= 0) return 0;
    if (pf.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) return 1;
    char ch;
    ssize_t n = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* How often a waiting handler looks at its client's socket: a client that
 * leaves is noticed within this time and its request cancelled (it then ends
 * at the engine's next step). */
#define AK_GONE_POLL_MS 50

/* Waits like ak_request_wait (no limit), watching the client: returns 1 when
 * r finished, 0 when it has more than `have` bytes, -1 when the client left
 * (r is then cancelled). */
static int wait_watching(ak_request *r, size_t have, int fd) {
    for (;;) {
        int done = ak_request_wait(r, have, AK_GONE_POLL_MS);
        size_t len = ak_request_read(r, have, NULL, NULL, NULL);
        if (done) return 1;
        if (len > have) return 0;
        if (client_gone(fd)) {
            ak_request_cancel(r);
            return -1;
        }
    }
}

/* Appends one SSE event "data: JSON\n\n" for j (consumed) to the stream's
 * output. Returns 0, or -1 when out of memory (the stream then ends). */
static int emit(stream *st, cJSON *j) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    const char *src = s ? s : "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
    int rc = ak_buf_puts(&st->out, "data: ") | ak_buf_puts(&st->out, src) | ak_buf_puts(&st->out, "\n\n");
    free(s);
    return rc ? -1 : 0;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    while (st->out_pos == st->out.len) {
        st->out_pos = 0;
        ak_buf_clear(&st->out);
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        if (st->p.chat && !st->sent_role) {
            cJSON *j = response_head(st->s, &st->p, st->id, st->created, 1);
            add_choice(j, &st->p, 1, "assistant", "", NULL);
            st->sent_role = 1;
            if (emit(st, j) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        int done = wait_watching(st->r, st->have, st->fd);
        if (done < 0) return MHD_CONTENT_READER_END_WITH_ERROR;   /* the client left */
        char *chunk = NULL;
        size_t n = 0;
        ak_req_result res;
        st->have = ak_request_read(st->r, st->have, &chunk, &n, &res);
        if (n) {
            cJSON *j = response_head(st->s, &st->p, st->id, st->created, 1);
            add_choice(j, &st->p, 1, NULL, chunk, NULL);
            free(chunk);
            if (emit(st, j) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        free(chunk);
        if (!done) continue;
        if (res.finish == AK_FINISH_ERROR) {
            emit(st, error_json(res.status, res.error, NULL, NULL));
        } else {
            cJSON *j = response_head(st->s, &st->p, st->id, st->created, 1);
            add_choice(j, &st->p, 1, NULL, NULL, finish_name(res.finish));
            cJSON_AddItemToObject(j, "agentkv", agentkv_json(&st->p, &res));
            emit(st, j);
            if (st->p.include_usage) {
                j = response_head(st->s, &st->p, st->id, st->created, 1);
                cJSON_AddArrayToObject(j, "choices");
                cJSON_AddItemToObject(j, "usage", usage_json(&res));
                cJSON_AddItemToObject(j, "agentkv", agentkv_json(&st->p, &res));
                emit(st, j);
            }
        }
        if (ak_buf_puts(&st->out, "data: [DONE]\n\n") < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        st->ended = 1;
    }
    size_t n = st->out.len - st->out_pos;
    if (n > max) n = max;
    memcpy(buf, st->out.p + st->out_pos, n);
    st->out_pos += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream *st = cls;
    ak_request_cancel(st->r); /* a no-op when it finished */
    ak_request_release(st->r);
    ak_api_request_free(&st->p);
    ak_buf_free(&st->out);
    free(st);
}

/* The client of a running request closed its connection: the request was
 * cancelled (it ends at the engine's next step, its agent keeping what was
 * computed); counted as status 499 (nginx's "client closed request"). Closes
 * the connection. */
static enum MHD_Result client_left(ak_server *s, ak_request *r, ak_api_request *p, const char *ep) {
    ak_request_release(r);
    ak_api_request_free(p);
    ak_metrics_request(s->cfg.metrics, ep, 499);
    return MHD_NO;
}

/* 503 for a body refused because all connections together already buffer
 * max_buffered bytes; Retry-After asks the client to come back shortly. */
static enum MHD_Result send_busy(ak_server *s, struct MHD_Connection *c, const char *ep) {
    char msg[160];
    snprintf(msg, sizeof msg, "the server is buffering too many request bodies (%zu bytes); retry shortly",
             s->cfg.max_buffered);
    cJSON *j = error_json(503, msg, NULL, "server_busy");
    char *body = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return send_body_ex(s, c, ep, 503, body, "application/json", "1");
}

/* OpenAI's error code (and its param) for a request that failed with an
 * ak_err_code in the engine: a pool that vanished or broke between parsing
 * and admission, no KV room. NULL when there is none to give. */
static const char *code_of(int code, const char **param) {
    *param = NULL;
    switch (code) {
    case AK_ERR_NOT_FOUND: *param = "pool"; return "pool_not_found";
    case AK_ERR_STALE: *param = "pool"; return "pool_stale";
    case AK_ERR_CORRUPT: *param = "pool"; return "pool_corrupt";
    case AK_ERR_KV_BUDGET: return "kv_budget";
    default: return NULL;
    }
}

/* ak_api_pool_fn for the parser: the pool's tokens from the engine. */
static int pool_lookup(void *ud, const char *id, int32_t **tokens, int *n, char **source, ak_error *err) {
    ak_server *s = ud;
    return ak_sched_pool_tokens(s->cfg.sched, id, tokens, n, source, err);
}

/* ak_api_memory_fn for the parser: the memory's tokens from the engine. */
static int memory_lookup(void *ud, const char *id, int32_t **tokens, int *n, ak_error *err) {
    ak_server *s = ud;
    return ak_sched_memory_tokens(s->cfg.sched, id, tokens, n, err);
}

/* The parser's view of this server. */
static ak_api_config api_config(ak_server *s) {
    ak_api_config ac = {s->cfg.tok, s->cfg.model_id, s->cfg.family, s->cfg.template_text, s->cfg.n_ctx, pool_lookup, s,
                        memory_lookup, s};
    return ac;
}

static enum MHD_Result handle_completion(ak_server *s, struct MHD_Connection *c, conn *cn, int chat) {
    const char *ep = chat ? "/v1/chat/completions" : "/v1/completions";
    if (cn->too_large)
        return send_error(s, c, ep, 413, NULL, "request_too_large", "the request body is larger than %zu bytes",
                          s->cfg.max_body);
    if (cn->over_cap) return send_busy(s, c, ep);
    ak_api_config ac = api_config(s);
    pthread_mutex_lock(&s->mu);
    uint64_t seed = (uint64_t)time(NULL) ^ (s->id_salt + s->next_id * 0x9E3779B97F4A7C15ull);
    pthread_mutex_unlock(&s->mu);
    ak_api_request p;
    ak_api_error b;
    if (ak_api_parse(&ac, cn->body, cn->len, chat, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Agent-Id"), seed,
                     &p, &b) < 0)
        return send_error(s, c, ep, b.status, b.param, b.code, "%s", b.msg);
    release_body(s, cn);   /* parsed: the body no longer counts while the request runs */
    int fd = conn_fd(c);
    ak_req_params rp = {0};
    rp.agent_id = p.agent_id;
    rp.pool = p.pool;
    rp.prompt = p.tokens;
    rp.n_prompt = (int)p.n_tokens;
    rp.max_tokens = p.max_tokens;
    rp.sp = p.sp;
    for (int i = 0; i < p.n_stop; i++) rp.stop[i] = p.stop[i];
    rp.n_stop = p.n_stop;
    rp.stop_at_eog = 1;
    rp.n_mem = p.n_mem;   /* full: the same prompt computed as a plain one, from the first memory on */
    rp.mem_full = p.reuse == AK_REUSE_FULL;
    rp.mem_method = p.reuse;
    rp.mem_ratio = (float)p.recompute_ratio;
    for (int i = 0; i < p.n_mem; i++) {
        rp.mem_id[i] = p.mem_id[i];
        rp.mem_at[i] = p.mem_at[i];
        rp.mem_len[i] = p.mem_len[i];
    }
    rp.reprompt = ak_api_reprompt(&p);
    int status = 0;
    ak_error err = {0};
    ak_request *r = ak_sched_submit(s->cfg.sched, &rp, &status, &err);
    if (r) p.resend = NULL;   /* the scheduler's now */
    if (!r) {
        ak_api_request_free(&p);
        return send_error(s, c, ep, status, status == 400 ? "max_tokens" : NULL, NULL, "%s", err.msg);
    }
    char id[64];
    make_id(s, chat ? "chatcmpl" : "cmpl", id, sizeof id);
    long created = (long)time(NULL);
    /* wait for the first text (or the end), so that a request that fails
     * in the queue still gets its own HTTP status */
    if (wait_watching(r, 0, fd) < 0) return client_left(s, r, &p, ep);
    ak_req_result res;
    ak_request_read(r, 0, NULL, NULL, &res);
    if (res.finish == AK_FINISH_ERROR) {
        ak_request_release(r);
        ak_api_request_free(&p);
        const char *param, *code = code_of(res.code, &param);
        if (p.n_mem && param && !strcmp(param, "pool")) {   /* a memory that vanished or broke since the parse */
            param = "memories";
            code = res.code == AK_ERR_NOT_FOUND ? "memory_not_found" : res.code == AK_ERR_STALE ? "memory_stale"
                                                                                                 : "memory_corrupt";
        }
        return send_error(s, c, ep, res.status ? res.status : 500, param, code, "%s", res.error);
    }
    if (p.stream) {
        stream *st = calloc(1, sizeof *st);
        if (!st) {
            ak_request_cancel(r);
            ak_request_release(r);
            ak_api_request_free(&p);
            return send_error(s, c, ep, 500, NULL, NULL, "out of memory");
        }
        st->s = s;
        st->fd = fd;
        st->r = r;
        st->p = p;
        st->created = created;
        snprintf(st->id, sizeof st->id, "%s", id);
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
        if (!resp) {
            stream_free(st);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        add_cors(s, c, resp);
        enum MHD_Result rc = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        ak_metrics_request(s->cfg.metrics, ep, 200);
        return rc;
    }
    if (wait_watching(r, (size_t)-1, fd) < 0) return client_left(s, r, &p, ep);
    char *text = NULL;
    size_t n = 0;
    ak_request_read(r, 0, &text, &n, &res);
    ak_request_release(r);
    if (res.finish == AK_FINISH_ERROR) {
        free(text);
        ak_api_request_free(&p);
        return send_error(s, c, ep, res.status ? res.status : 500, NULL, NULL, "%s", res.error);
    }
    cJSON *j = response_head(s, &p, id, created, 0);
    add_choice(j, &p, 0, "assistant", text ? text : "", finish_name(res.finish));
    cJSON_AddItemToObject(j, "usage", usage_json(&res));
    cJSON_AddItemToObject(j, "agentkv", agentkv_json(&p, &res));
    free(text);
    ak_api_request_free(&p);
    return send_json(s, c, ep, 200, j);
}

/* ---------------------------------------------------------- other routes */

/* The answer to a DELETE that removed `what` (agent, pool) id, logged. */
static enum MHD_Result send_deleted(ak_server *s, struct MHD_Connection *c, const char *ep, const char *what, const char *id) {
    logf_(s, "%s %s: deleted", what, id);
    char object[32];
    snprintf(object, sizeof object, "%s.deleted", what);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "object", object);
    cJSON_AddBoolToObject(j, "deleted", 1);
    return send_json(s, c, ep, 200, j);
}

static cJSON *agent_json(const ak_sched_agent *a) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", a->id);
    cJSON_AddStringToObject(j, "object", "agent");
    cJSON_AddNumberToObject(j, "tokens", a->n_tokens);
    cJSON_AddStringToObject(j, "tier", ak_tier_name(a->tier));
    cJSON_AddNumberToObject(j, "bytes", (double)a->bytes);
    cJSON_AddNumberToObject(j, "private_bytes", (double)a->private_bytes);
    if (a->pool[0]) cJSON_AddStringToObject(j, "pool", a->pool);
    else cJSON_AddNullToObject(j, "pool");
    if (a->card[0]) cJSON_AddStringToObject(j, "card", a->card);
    else cJSON_AddNullToObject(j, "card");
    cJSON_AddNumberToObject(j, "last_used_at", (double)a->last_use);
    cJSON_AddBoolToObject(j, "busy", a->busy);
    return j;
}

static enum MHD_Result handle_agents(ak_server *s, struct MHD_Connection *c, const char *method, const char *id) {
    const char *ep = "/v1/agents";
    if (id && !ak_agent_id_valid(id))
        return send_error(s, c, ep, 400, "agent_id", "invalid_agent_id",
                          "invalid agent id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    ak_error err = {0};
    if (!strcmp(method, "DELETE")) {
        if (!id) return send_error(s, c, ep, 405, NULL, NULL, "DELETE needs /v1/agents/{id}");
        int rc = ak_sched_remove_agent(s->cfg.sched, id, &err);
        if (rc < 0) return send_error(s, c, ep, 500, NULL, NULL, "%s", err.msg);
        if (rc == 1) return send_error(s, c, ep, 404, "agent_id", "agent_not_found", "no agent '%s'", id);
        if (rc == 2)
            return send_error(s, c, ep, 409, "agent_id", "agent_busy", "agent '%s' has a request running or queued", id);
        return send_deleted(s, c, ep, "agent", id);
    }
    if (strcmp(method, "GET")) return send_error(s, c, ep, 405, NULL, NULL, "method %s not allowed here", method);
    ak_sched_agent *v = NULL;
    int n = 0;
    if (ak_sched_list_agents(s->cfg.sched, &v, &n, &err) < 0) return send_error(s, c, ep, 500, NULL, NULL, "%s", err.msg);
    cJSON *j = NULL;
    if (id) {
        for (int i = 0; i < n && !j; i++)
            if (!strcmp(v[i].id, id)) j = agent_json(&v[i]);
        free(v);
        if (!j) return send_error(s, c, ep, 404, "agent_id", "agent_not_found", "no agent '%s'", id);
        return send_json(s, c, ep, 200, j);
    }
    j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(j, "data");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(data, agent_json(&v[i]));
    free(v);
    return send_json(s, c, ep, 200, j);
}

/* ---------------------------------------------------------------- pools */

static cJSON *pool_json(const ak_pool_info *in) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", in->id);
    cJSON_AddStringToObject(j, "object", "pool");
    cJSON_AddNumberToObject(j, "tokens", in->n_tokens);
    cJSON_AddNumberToObject(j, "bytes", (double)in->bytes);
    cJSON_AddNumberToObject(j, "file_bytes", (double)in->file_bytes);
    const ak_kv_format_info *fk = ak_kv_format_get(in->fk), *fv = ak_kv_format_get(in->fv);
    cJSON_AddStringToObject(j, "cache_type_k", fk ? fk->name : "?");
    cJSON_AddStringToObject(j, "cache_type_v", fv ? fv->name : "?");
    cJSON_AddStringToObject(j, "hash", in->hash);
    cJSON_AddBoolToObject(j, "resident", in->resident);
    cJSON_AddNumberToObject(j, "readers", in->readers);
    cJSON_AddNumberToObject(j, "created", (double)in->created);
    return j;
}

/* POST /v1/pools: prefills and persists a pool (blocking until done). */
static enum MHD_Result create_pool(ak_server *s, struct MHD_Connection *c, conn *cn) {
    const char *ep = "/v1/pools";
    if (cn->too_large)
        return send_error(s, c, ep, 413, NULL, "request_too_large", "the request body is larger than %zu bytes",
                          s->cfg.max_body);
    if (cn->over_cap) return send_busy(s, c, ep);
    ak_api_config ac = api_config(s);
    ak_api_pool_request p;
    ak_api_error b;
    if (ak_api_parse_pool(&ac, cn->body, cn->len, &p, &b) < 0)
        return send_error(s, c, ep, b.status, b.param, b.code, "%s", b.msg);
    release_body(s, cn);
    ak_pool_info in;
    int status = 0;
    ak_error err = {0};
    int rc = ak_sched_pool_create(s->cfg.sched, p.id, p.tokens, (int)p.n_tokens, p.fk, p.fv, p.source, &in, &status,
                                  &err);
    char id[AK_AGENT_ID_MAX + 1];
    snprintf(id, sizeof id, "%s", p.id);
    ak_api_pool_request_free(&p);
    if (rc < 0) {
        if (err.code == AK_ERR_EXISTS)
            return send_error(s, c, ep, 409, "id", "pool_exists",
                              "%s (pools are write-once: DELETE /v1/pools/%s first)", err.msg, id);
        return send_error(s, c, ep, status, NULL, err.code == AK_ERR_KV_BUDGET ? "kv_budget" : NULL, "%s", err.msg);
    }
    logf_(s, "pool %s: %d tokens, %s/%s", in.id, in.n_tokens, ak_kv_format_get(in.fk)->name,
          ak_kv_format_get(in.fv)->name);
    return send_json(s, c, ep, 201, pool_json(&in));
}

/* DELETE /v1/pools/{id}: refused (409, naming them) while agents are attached. */
static enum MHD_Result delete_pool(ak_server *s, struct MHD_Connection *c, const char *id) {
    const char *ep = "/v1/pools";
    ak_error err = {0};
    int rc = ak_sched_pool_remove(s->cfg.sched, id, &err);
    if (rc == 1) return send_error(s, c, ep, 404, "pool", "pool_not_found", "no pool '%s'", id);
    if (rc < 0 && err.code == AK_ERR_BUSY) return send_error(s, c, ep, 409, "pool", "pool_busy", "%s", err.msg);
    if (rc < 0) return send_error(s, c, ep, 500, NULL, NULL, "%s", err.msg);
    return send_deleted(s, c, ep, "pool", id);
}

/* /v1/pools (POST: create, GET: list) and /v1/pools/{id} (GET, DELETE). */
static enum MHD_Result handle_pools(ak_server *s, struct MHD_Connection *c, conn *cn, const char *method,
                                    const char *id) {
    const char *ep = "/v1/pools";
    if (!id && !strcmp(method, "POST")) return create_pool(s, c, cn);
    if (id && !ak_pool_id_valid(id))
        return send_error(s, c, ep, 400, "pool", "invalid_pool_id",
                          "invalid pool id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    if (id && !strcmp(method, "DELETE")) return delete_pool(s, c, id);
    if (strcmp(method, "GET"))
        return send_error(s, c, ep, 405, NULL, NULL, "method %s not allowed here (%s)", method,
                          id ? "GET or DELETE /v1/pools/{id}" : "POST or GET /v1/pools");
    ak_error err = {0};
    if (id) {
        ak_pool_info in;
        if (ak_sched_pool_get(s->cfg.sched, id, &in, &err) < 0) {
            if (err.code == AK_ERR_NOT_FOUND) return send_error(s, c, ep, 404, "pool", "pool_not_found", "no pool '%s'", id);
            return send_error(s, c, ep, 500, NULL, NULL, "%s", err.msg);
        }
        return send_json(s, c, ep, 200, pool_json(&in));
    }
    ak_pool_info *v = NULL;
    int n = 0;
    if (ak_sched_pools_list(s->cfg.sched, &v, &n, &err) < 0) return send_error(s, c, ep, 500, NULL, NULL, "%s", err.msg);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(j, "data");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(data, pool_json(&v[i]));
    free(v);
    return send_json(s, c, ep, 200, j);
}

/* ------------------------------------------------------------- memories */

static cJSON *memory_json(const ak_memory_info *in, const char *text) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", in->id);
    cJSON_AddStringToObject(j, "object", "memory");
    cJSON_AddNumberToObject(j, "tokens", in->n_tokens);
    const ak_kv_format_info *fk = ak_kv_format_get(in->fk), *fv = ak_kv_format_get(in->fv);
    cJSON_AddStringToObject(j, "cache_type_k", fk ? fk->name : "?");
    cJSON_AddStringToObject(j, "cache_type_v", fv ? fv->name : "?");
    cJSON_AddStringToObject(j, "hash", in->hash);
    cJSON_AddBoolToObject(j, "resident", in->resident);
    cJSON_AddNumberToObject(j, "bytes", (double)in->bytes);
    cJSON_AddNumberToObject(j, "file_bytes", (double)in->file_bytes);
    cJSON_AddNumberToObject(j, "sharers", in->sharers);
    cJSON_AddNumberToObject(j, "created", (double)in->created);
    if (text) cJSON_AddStringToObject(j, "text", text);
    return j;
}

/* The HTTP status and OpenAI code of a memory error. */
static int memory_error(int code, const char **oc) {
    switch (code) {
    case AK_ERR_NOT_FOUND: *oc = "memory_not_found"; return 404;
    case AK_ERR_EXISTS: *oc = "memory_exists"; return 409;
    case AK_ERR_STALE: *oc = "memory_stale"; return 409;
    case AK_ERR_CORRUPT: *oc = "memory_corrupt"; return 500;
    case AK_ERR_KV_BUDGET: *oc = "kv_budget"; return 503;
    default: *oc = NULL; return ak_sched_status_of(code);
    }
}

/* POST /v1/memories: computes (or shares) and persists a memory. 201 when
 * it was made now, 200 when the id already held this content. */
static enum MHD_Result create_memory(ak_server *s, struct MHD_Connection *c, conn *cn) {
    const char *ep = "/v1/memories";
    if (cn->too_large)
        return send_error(s, c, ep, 413, NULL, "request_too_large", "the request body is larger than %zu bytes",
                          s->cfg.max_body);
    if (cn->over_cap) return send_busy(s, c, ep);
    ak_api_memory_request p;
    ak_api_error b;
    if (ak_api_parse_memory(cn->body, cn->len, &p, &b) < 0)
        return send_error(s, c, ep, b.status, b.param, b.code, "%s", b.msg);
    release_body(s, cn);
    ak_memory_info in, before;
    ak_error err = {0};
    int existed = ak_sched_memory_get(s->cfg.sched, p.id, &before, NULL, &err) == 0;
    int computed = 0;
    int rc = ak_sched_memory_add(s->cfg.sched, p.id, p.text, p.fk, p.fv, &in, &computed, &err);
    ak_api_memory_request_free(&p);
    if (rc < 0) {
        const char *oc;
        int st = memory_error(err.code, &oc);
        return send_error(s, c, ep, st, err.code == AK_ERR_EXISTS ? "id" : err.code == AK_ERR_INVALID ? "text" : NULL, oc,
                          "%s", err.msg);
    }
    cJSON *j = memory_json(&in, NULL);
    cJSON_AddBoolToObject(j, "computed", computed);
    return send_json(s, c, ep, existed ? 200 : 201, j);
}

/* /v1/memories (POST: add, GET: list) and /v1/memories/{id} (GET, DELETE). */
static enum MHD_Result handle_memories(ak_server *s, struct MHD_Connection *c, conn *cn, const char *method,
                                       const char *id) {
    const char *ep = "/v1/memories";
    if (!id && !strcmp(method, "POST")) return create_memory(s, c, cn);
    if (id && !ak_agent_id_valid(id))
        return send_error(s, c, ep, 400, "memory", "invalid_memory_id",
                          "invalid memory id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    ak_error err = {0};
    const char *oc;
    if (id && !strcmp(method, "DELETE")) {
        int rc = ak_sched_memory_remove(s->cfg.sched, id, &err);
        if (rc == 1) return send_error(s, c, ep, 404, "memory", "memory_not_found", "no memory '%s'", id);
        if (rc < 0) {
            int st = memory_error(err.code, &oc);   /* oc is set by the call: not in the same argument list */
            return send_error(s, c, ep, st, NULL, oc, "%s", err.msg);
        }
        return send_deleted(s, c, ep, "memory", id);
    }
    if (strcmp(method, "GET"))
        return send_error(s, c, ep, 405, NULL, NULL, "method %s not allowed here (%s)", method,
                          id ? "GET or DELETE /v1/memories/{id}" : "POST or GET /v1/memories");
    if (id) {
        ak_memory_info in;
        char *text = NULL;
        if (ak_sched_memory_get(s->cfg.sched, id, &in, &text, &err) < 0) {
            int st = memory_error(err.code, &oc);
            return send_error(s, c, ep, st, "memory", oc, "%s", err.msg);
        }
        cJSON *j = memory_json(&in, text);
        free(text);
        return send_json(s, c, ep, 200, j);
    }
    ak_memory_info *v = NULL;
    int n = 0;
    if (ak_sched_memories_list(s->cfg.sched, &v, &n, &err) < 0) return send_error(s, c, ep, 500, NULL, NULL, "%s", err.msg);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(j, "data");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(data, memory_json(&v[i], NULL));
    free(v);
    return send_json(s, c, ep, 200, j);
}

/* ---------------------------------------------------------------- cards */

/* A card as JSON: the index entry's fields, and the width histograms when
 * known (hist: NULL in a list). */
static cJSON *card_json(const ak_store_card_entry *e, const ak_sched_card *hist) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", e->id);
    cJSON_AddStringToObject(j, "object", "card");
    cJSON_AddNumberToObject(j, "tokens", e->n_tokens);
    cJSON_AddNumberToObject(j, "pos_offset", e->pos_offset);
    if (hist) cJSON_AddBoolToObject(j, "saved", hist->saved);
    if (e->source_agent[0]) cJSON_AddStringToObject(j, "source_agent", e->source_agent);
    else cJSON_AddNullToObject(j, "source_agent");
    cJSON_AddStringToObject(j, "policy", e->policy);
    cJSON_AddNumberToObject(j, "budget_k", e->budget_k);
    cJSON_AddNumberToObject(j, "budget_v", e->budget_v);
    cJSON_AddNumberToObject(j, "mean_bits_k", e->mean_k);
    cJSON_AddNumberToObject(j, "mean_bits_v", e->mean_v);
    cJSON_AddNumberToObject(j, "bytes", (double)e->bytes);
    cJSON_AddStringToObject(j, "hash", e->hash);
    cJSON_AddStringToObject(j, "model", e->model_name);
    cJSON_AddNumberToObject(j, "created", (double)e->created);
    if (hist) {   /* {"2": tokens, "4": ..., "8": ..., "16": ...} per side */
        static const char *const w[4] = {"2", "4", "8", "16"};
        cJSON *hk = cJSON_AddObjectToObject(j, "widths_k"), *hv = cJSON_AddObjectToObject(j, "widths_v");
        for (int i = 0; i < 4; i++) {
            cJSON_AddNumberToObject(hk, w[i], hist->count_k[i]);
            cJSON_AddNumberToObject(hv, w[i], hist->count_v[i]);
        }
    }
    return j;
}

/* The answer to a card operation that failed with err: 404 card_not_found
 * (agent_not_found when agent_missing: the operation's agent is what a
 * NOT_FOUND names), 409 card_stale / agent_busy / card_exists, 500
 * card_corrupt, 503 kv_budget, else by code. */
static enum MHD_Result send_card_error(ak_server *s, struct MHD_Connection *c, const char *ep, const ak_error *err,
                                       int agent_missing) {
    switch (err->code) {
    case AK_ERR_NOT_FOUND:
        if (agent_missing) return send_error(s, c, ep, 404, "agent_id", "agent_not_found", "%s", err->msg);
        return send_error(s, c, ep, 404, "card", "card_not_found", "%s", err->msg);
    case AK_ERR_STALE: return send_error(s, c, ep, 409, "card", "card_stale", "%s", err->msg);
    case AK_ERR_CORRUPT: return send_error(s, c, ep, 500, "card", "card_corrupt", "%s (moved to quarantine)", err->msg);
    case AK_ERR_BUSY: return send_error(s, c, ep, 409, "agent_id", "agent_busy", "%s", err->msg);
    case AK_ERR_EXISTS: return send_error(s, c, ep, 409, "id", "card_exists", "%s", err->msg);
    case AK_ERR_KV_BUDGET: return send_error(s, c, ep, 503, NULL, "kv_budget", "%s", err->msg);
    default: return send_error(s, c, ep, ak_sched_status_of(err->code), NULL, NULL, "%s", err->msg);
    }
}

/* A body that cannot be read: 413 or 503 (the caller's checks on cn). */
static int body_refused(ak_server *s, struct MHD_Connection *c, conn *cn, const char *ep, enum MHD_Result *out) {
    if (cn->too_large)
        *out = send_error(s, c, ep, 413, NULL, "request_too_large", "the request body is larger than %zu bytes",
                          s->cfg.max_body);
    else if (cn->over_cap) *out = send_busy(s, c, ep);
    else return 0;
    return 1;
}

/* POST /v1/agents/{id}/cards: makes a card of the agent's context. */
static enum MHD_Result make_card(ak_server *s, struct MHD_Connection *c, conn *cn, const char *agent) {
    const char *ep = "/v1/agents";   /* endpoint_of's label for the URL */
    enum MHD_Result out;
    if (body_refused(s, c, cn, ep, &out)) return out;
    ak_api_card_request p;
    ak_api_error b;
    if (ak_api_parse_card(cn->body, cn->len, &p, &b) < 0) return send_error(s, c, ep, b.status, b.param, b.code, "%s", b.msg);
    ak_card_request rq;
    memset(&rq, 0, sizeof rq);
    rq.card_id = p.id;
    rq.from = p.from;
    rq.to = p.to;
    rq.policy = p.policy;
    rq.budget_k = p.bits_k;
    rq.budget_v = p.bits_v;
    ak_sched_card card;
    ak_error err = {0};
    if (ak_sched_card_make(s->cfg.sched, agent, &rq, &card, &err) < 0) {
        if (err.code == AK_ERR_INVALID)   /* id, bits and policy were checked: the range */
            return send_error(s, c, ep, 400, "range", "invalid_range", "%s", err.msg);
        return send_card_error(s, c, ep, &err, 1);
    }
    logf_(s, "card %s: from agent %s, %d tokens, %s, %.2f/%.2f bits", card.e.id, agent, card.e.n_tokens, card.e.policy,
          card.e.mean_k, card.e.mean_v);
    return send_json(s, c, ep, 201, card_json(&card.e, &card));
}

/* POST /v1/agents/{id}/import: the agent's context becomes the card
 * (mode "replace", the default) or the card goes after it ("append"). */
static enum MHD_Result import_card(ak_server *s, struct MHD_Connection *c, conn *cn, const char *agent) {
    const char *ep = "/v1/agents";
    enum MHD_Result out;
    if (body_refused(s, c, cn, ep, &out)) return out;
    char card_id[AK_AGENT_ID_MAX + 1];
    ak_import_mode mode;
    ak_api_error b;
    if (ak_api_parse_import(cn->body, cn->len, card_id, &mode, &b) < 0)
        return send_error(s, c, ep, b.status, b.param, b.code, "%s", b.msg);
    int n = 0;
    ak_error err = {0};
    if (ak_sched_card_import(s->cfg.sched, agent, card_id, mode, &n, &err) < 0) {
        /* ids and mode were checked: the card (with the agent's tokens, for
         * append) does not fit the context, or the agent's segments are full */
        if (err.code == AK_ERR_INVALID)
            return send_error(s, c, ep, 400, "card", "context_length_exceeded", "%s", err.msg);
        return send_card_error(s, c, ep, &err, 0);
    }
    const char *mname = mode == AK_IMPORT_APPEND ? "append" : "replace";
    logf_(s, "agent %s: imported card %s (%s, %d tokens)", agent, card_id, mname, n);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", agent);
    cJSON_AddStringToObject(j, "object", "agent.import");
    cJSON_AddStringToObject(j, "card", card_id);
    cJSON_AddStringToObject(j, "mode", mname);
    cJSON_AddNumberToObject(j, "tokens", n);
    return send_json(s, c, ep, 200, j);
}

/* /v1/agents/{id}/{action}: id is `rest` up to the slash. */
static enum MHD_Result handle_agent_action(ak_server *s, struct MHD_Connection *c, conn *cn, const char *method,
                                           const char *rest) {
    const char *slash = strchr(rest, '/');
    char id[AK_AGENT_ID_MAX + 2];
    size_t n = (size_t)(slash - rest);
    const char *ep = "/v1/agents";
    if (n > AK_AGENT_ID_MAX) n = AK_AGENT_ID_MAX + 1;   /* too long: invalid below */
    memcpy(id, rest, n);
    id[n] = 0;
    const char *action = slash + 1;
    int cards = !strcmp(action, "cards"), import = !strcmp(action, "import");
    if (!cards && !import) return send_error(s, c, ep, 404, NULL, "unknown_url", "unknown URL /v1/agents/%.200s", rest);
    if (!ak_agent_id_valid(id))
        return send_error(s, c, ep, 400, "agent_id", "invalid_agent_id",
                          "invalid agent id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    if (strcmp(method, "POST")) return send_error(s, c, ep, 405, NULL, NULL, "use POST for /v1/agents/{id}/%s", action);
    return cards ? make_card(s, c, cn, id) : import_card(s, c, cn, id);
}

/* 1 when the client asks for the card's bytes: ?download=1 (or true) or
 * Accept: application/octet-stream. */
static int wants_download(struct MHD_Connection *c) {
    const char *d = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "download");
    if (d && (!strcmp(d, "1") || !strcmp(d, "true"))) return 1;
    const char *acc = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Accept");
    return acc && strstr(acc, "application/octet-stream") != NULL;
}

/* GET /v1/cards/{id}: the card object, or its file's bytes. */
static enum MHD_Result get_card(ak_server *s, struct MHD_Connection *c, const char *id) {
    const char *ep = "/v1/cards";
    ak_sched_card card;
    ak_error err = {0};
    if (ak_sched_card_get(s->cfg.sched, id, &card, &err) < 0) return send_card_error(s, c, ep, &err, 0);
    if (!wants_download(c)) return send_json(s, c, ep, 200, card_json(&card.e, &card));
    char *bytes = NULL;
    size_t len = 0;
    if (ak_sched_card_file(s->cfg.sched, id, &bytes, &len, &err) < 0) return send_card_error(s, c, ep, &err, 0);
    struct MHD_Response *r = MHD_create_response_from_buffer(len, bytes, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(bytes);
        return MHD_NO;
    }
    char disp[AK_AGENT_ID_MAX + 64];
    snprintf(disp, sizeof disp, "attachment; filename=\"%s.safetensors\"", id);
    MHD_add_response_header(r, "Content-Type", "application/octet-stream");
    MHD_add_response_header(r, "Content-Disposition", disp);
    add_cors(s, c, r);
    enum MHD_Result rc = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    ak_metrics_request(s->cfg.metrics, ep, 200);
    return rc;
}

/* /v1/cards (GET: list) and /v1/cards/{id} (GET, DELETE). */
static enum MHD_Result handle_cards(ak_server *s, struct MHD_Connection *c, const char *method, const char *id) {
    const char *ep = "/v1/cards";
    if (id && !ak_agent_id_valid(id))
        return send_error(s, c, ep, 400, "card", "invalid_card_id",
                          "invalid card id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    ak_error err = {0};
    if (id && !strcmp(method, "DELETE")) {
        int rc = ak_sched_card_remove(s->cfg.sched, id, &err);
        if (rc == 1) return send_error(s, c, ep, 404, "card", "card_not_found", "no card '%s'", id);
        if (rc < 0 && err.code == AK_ERR_BUSY) return send_error(s, c, ep, 409, "card", "card_busy", "%s", err.msg);
        if (rc < 0) return send_error(s, c, ep, ak_sched_status_of(err.code), NULL, NULL, "%s", err.msg);
        return send_deleted(s, c, ep, "card", id);
    }
    if (strcmp(method, "GET"))
        return send_error(s, c, ep, 405, NULL, NULL, "method %s not allowed here (%s)", method,
                          id ? "GET or DELETE /v1/cards/{id}" : "GET /v1/cards; make one with POST /v1/agents/{id}/cards");
    if (id) return get_card(s, c, id);
    ak_store_card_entry *v = NULL;
    int n = 0;
    if (ak_sched_cards_list(s->cfg.sched, &v, &n, &err) < 0) return send_error(s, c, ep, 500, NULL, NULL, "%s", err.msg);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(j, "data");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(data, card_json(&v[i], NULL));
    free(v);
    return send_json(s, c, ep, 200, j);
}

/* The endpoint label of a URL for /metrics. */
static const char *endpoint_of(const char *url) {
    static const char *const known[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/agents",
                                        "/v1/pools", "/v1/cards", "/v1/memories", "/health", "/metrics"};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (!strcmp(url, known[i])) return known[i];
    if (!strncmp(url, "/v1/agents/", 11)) return "/v1/agents";
    if (!strncmp(url, "/v1/models/", 11)) return "/v1/models";
    if (!strncmp(url, "/v1/pools/", 10)) return "/v1/pools";
    if (!strncmp(url, "/v1/cards/", 10)) return "/v1/cards";
    if (!strncmp(url, "/v1/memories/", 13)) return "/v1/memories";
    return "other";
}

/* The model object OpenAI's /v1/models lists and /v1/models/{id} returns. */
static cJSON *model_json(const ak_server *s) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->cfg.model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "agentkv");
    return m;
}

/* GET /v1/models/{id}: the served model, or 404 model_not_found. */
static enum MHD_Result get_model(ak_server *s, struct MHD_Connection *c, const char *method, const char *id) {
    const char *ep = "/v1/models";
    if (strcmp(method, "GET")) return send_error(s, c, ep, 405, NULL, NULL, "use GET for /v1/models/{id}");
    if (strcmp(id, s->cfg.model_id))
        return send_error(s, c, ep, 404, "model", "model_not_found", "The model '%.200s' does not exist (this server serves '%s')",
                          id, s->cfg.model_id);
    return send_json(s, c, ep, 200, model_json(s));
}

/* 204 to a CORS preflight from an allowed origin: the methods and request
 * headers browsers may use, cached for AK_CORS_MAX_AGE_S. */
static enum MHD_Result send_preflight(ak_server *s, struct MHD_Connection *c, const char *ep) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    add_cors(s, c, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", AK_CORS_ALLOW_METHODS);
    MHD_add_response_header(r, "Access-Control-Allow-Headers", AK_CORS_ALLOW_HEADERS);
    MHD_add_response_header(r, "Access-Control-Max-Age", AK_CORS_MAX_AGE_S);
    enum MHD_Result rc = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    ak_metrics_request(s->cfg.metrics, ep, 204);
    return rc;
}

/* Answers a request that the guards against web pages refuse on its headers
 * (see server.h; /health is exempt from the Host check, for probes that
 * name the machine by an address) or a CORS preflight; *out is then MHD's
 * verdict. Returns 0 when the request goes on. */
static int web_guard(ak_server *s, struct MHD_Connection *c, const char *url, const char *method,
                     const char *version, const char *ep, enum MHD_Result *out) {
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!host && strcmp(version, MHD_HTTP_VERSION_1_0))   /* HTTP/1.1 requires it (RFC 9112 3.2) */
        *out = send_error(s, c, ep, 400, NULL, "malformed_request", "an HTTP/1.1 request needs a Host header");
    else if (strcmp(url, "/health") && !host_allowed(s, host))
        *out = send_error(s, c, ep, 403, NULL, "host_not_allowed",
                          "Host '%.200s' is not a name of this server (allow it with serve --allowed-host)", host);
    else if (origin && !cors_value(s, origin))
        *out = send_error(s, c, ep, 403, NULL, "origin_not_allowed",
                          "requests from the web origin '%.200s' are not allowed (allow it with serve --cors-origin)",
                          origin);
    else if (origin && !strcmp(method, "OPTIONS"))
        *out = send_preflight(s, c, ep);
    else
        return 0;
    return 1;
}

/* Answers a request whose body the server cannot take, on its headers: a
 * body (or a POST's declared type) that is not application/json (415; a
 * form or text/plain body is what a web page can send without asking), or
 * a transfer coding other than chunked (501). *out is then MHD's verdict.
 * Returns 0 when the request goes on. */
static int body_type_guard(ak_server *s, struct MHD_Connection *c, const char *method, const char *ep,
                           enum MHD_Result *out) {
    const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    int has_body = te || (cl && cl[strspn(cl, "0")]);
    if ((has_body || (ct && !strcmp(method, "POST"))) && !(ct && is_json_type(ct)))
        *out = send_error(s, c, ep, 415, NULL, "unsupported_media_type",
                          "the request body must be JSON (Content-Type: application/json), not '%.100s'",
                          ct ? ct : "(none)");
    else if (te && strcasecmp(te, "chunked"))
        *out = send_error(s, c, ep, 501, NULL, "unsupported_transfer_encoding",
                          "Transfer-Encoding '%.100s' is not supported (send Content-Length or chunked)", te);
    else
        return 0;
    return 1;
}

static int authorized(ak_server *s, struct MHD_Connection *c) {
    if (!s->cfg.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return 0;
    h += 7;
    size_t a = strlen(h), b = strlen(s->cfg.api_key);
    return a == b && sodium_memcmp(h, s->cfg.api_key, a) == 0;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    ak_server *s = cls;
    conn *cn = *con_cls;
    if (!cn) {
        /* the first call: only the headers have arrived. Everything that can
         * be refused on them is refused now, before a body byte is read. */
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        const char *ep = endpoint_of(url);
        enum MHD_Result out;
        if (web_guard(s, c, url, method, version, ep, &out)) return out;
        if (strcmp(url, "/health") && !authorized(s, c))
            return send_error(s, c, ep, 401, NULL, "invalid_api_key",
                              "a valid API key is required (Authorization: Bearer KEY)");
        if (body_type_guard(s, c, method, ep, &out)) return out;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno || end == cl || v > s->cfg.max_body)
                return send_error(s, c, ep, 413, NULL, "request_too_large",
                                  "the request body is larger than %zu bytes", s->cfg.max_body);
            if (reserve(s, cn, (size_t)v) < 0) return send_busy(s, c, ep);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t add = *upload_size;
        *upload_size = 0;
        if (cn->too_large || cn->over_cap) return MHD_YES;   /* discarded */
        if (cn->len + add > s->cfg.max_body) {
            cn->too_large = 1;
            release_body(s, cn);
            return MHD_YES;
        }
        if (cn->len + add > cn->reserved && reserve(s, cn, cn->len + add) < 0) {
            cn->over_cap = 1;
            release_body(s, cn);
            return MHD_YES;
        }
        if (cn->len + add + 1 > cn->cap) {
            size_t nc = (cn->len + add + 1) * 2;
            if (nc > s->cfg.max_body + 1) nc = s->cfg.max_body + 1;
            char *nb = realloc(cn->body, nc);
            if (!nb) return MHD_NO;
            cn->body = nb;
            cn->cap = nc;
        }
        memcpy(cn->body + cn->len, upload, add);
        cn->len += add;
        return MHD_YES;
    }
    if (!strcmp(url, "/health")) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "status", "ok");
        cJSON_AddStringToObject(j, "model", s->cfg.model_id);
        return send_json(s, c, "/health", 200, j);
    }
    if (!strcmp(url, "/metrics")) {
        ak_metrics_gauges g;
        ak_sched_gauges(s->cfg.sched, &g);
        return send_body(s, c, "/metrics", 200, ak_metrics_render(s->cfg.metrics, &g), "text/plain; version=0.0.4");
    }
    if (!strcmp(url, "/v1/models")) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "object", "list");
        cJSON *data = cJSON_AddArrayToObject(j, "data");
        cJSON_AddItemToArray(data, model_json(s));
        return send_json(s, c, "/v1/models", 200, j);
    }
    if (!strncmp(url, "/v1/models/", 11)) return get_model(s, c, method, url + 11);
    if (!strcmp(url, "/v1/agents")) return handle_agents(s, c, method, NULL);
    if (!strncmp(url, "/v1/agents/", 11) && strchr(url + 11, '/')) return handle_agent_action(s, c, cn, method, url + 11);
    if (!strncmp(url, "/v1/agents/", 11)) return handle_agents(s, c, method, url + 11);
    if (!strcmp(url, "/v1/cards")) return handle_cards(s, c, method, NULL);
    if (!strncmp(url, "/v1/cards/", 10)) return handle_cards(s, c, method, url + 10);
    if (!strcmp(url, "/v1/pools")) return handle_pools(s, c, cn, method, NULL);
    if (!strncmp(url, "/v1/pools/", 10)) return handle_pools(s, c, cn, method, url + 10);
    if (!strcmp(url, "/v1/memories")) return handle_memories(s, c, cn, method, NULL);
    if (!strncmp(url, "/v1/memories/", 13)) return handle_memories(s, c, cn, method, url + 13);
    int chat = !strcmp(url, "/v1/chat/completions");
    if (chat || !strcmp(url, "/v1/completions")) {
        if (strcmp(method, "POST"))
            return send_error(s, c, chat ? "/v1/chat/completions" : "/v1/completions", 405, NULL, NULL,
                              "use POST for %s", url);
        return handle_completion(s, c, cn, chat);
    }
    return send_error(s, c, "other", 404, NULL, "unknown_url", "unknown URL %.200s", url);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c;
    (void)toe;
    ak_server *s = cls;
    conn *cn = *con_cls;
    if (cn) {
        release_body(s, cn);
        free(cn);
    }
    *con_cls = NULL;
}

/* ------------------------------------------------- libmicrohttpd's errors */

/* libmicrohttpd answers some broken requests itself, before or while the
 * handler reads them: a malformed chunked body (400) or a chunk size past
 * 64 bits (413), a header line it cannot parse (400), a malformed or huge Content-Length (400, 413), headers or a URL
 * too large for its buffer (431, 414), an HTTP version it does not speak
 * (505). Its page is compiled-in HTML and no option replaces it (0.9.75 to
 * 1.0.x). What it does offer: each such answer is announced through the
 * error logger, with the status, in the connection's own thread (one thread
 * per connection), before the page is queued. So the logger writes this
 * server's JSON answer to the socket first and shuts its sending side: the
 * client reads the JSON and the end of the stream; libmicrohttpd's page
 * then fails to send and it closes the connection.
 *
 * The connection of a thread is recorded (conn_key) when libmicrohttpd has
 * parsed a request line (the URI log callback): an error on a connection's
 * first request line itself (a version it refuses, a line too long) comes
 * before that and still gets libmicrohttpd's page. */

/* The status line prefix of the logger's announcement (libmicrohttpd's
 * transmit_error_response: "...(HTTP response code is %u ('%s'))..."). */
#define MHD_ERROR_ANNOUNCEMENT "Error processing request (HTTP response code is %u"

/* The URI log callback: records this thread's connection for the logger.
 * Returns NULL, the handler's first *con_cls. */
static void *bind_thread(void *cls, const char *uri, struct MHD_Connection *c) {
    (void)uri;
    ak_server *s = cls;
    pthread_setspecific(s->conn_key, c);
    return NULL;
}

/* Sends all n bytes on a non-blocking socket, waiting at most 1 s in all
 * for room. Returns 0, or -1. */
static int send_bounded(int fd, const char *p, size_t n) {
    double t0 = ak_now();
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || ak_now() - t0 > 1.0) return -1;
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        poll(&pf, 1, 100);
    }
    return 0;
}

/* Reads and drops what the client still sends, for at most 300 ms and
 * 1 MiB, stopping once 50 ms pass without a byte: a socket closed with
 * unread data is reset, and a reset can destroy the answer before the
 * client has read it. */
static void drain(int fd) {
    char tmp[16384];
    size_t got = 0;
    double t0 = ak_now();
    while (got < ((size_t)1 << 20) && ak_now() - t0 < 0.3) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 50) <= 0) return;
        ssize_t k = recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
        if (k <= 0) return;
        got += (size_t)k;
    }
}

/* Writes this server's JSON answer for an error libmicrohttpd found in the
 * request on c (status: the one libmicrohttpd chose) and ends the sending
 * side of the connection. */
static void protocol_error(ak_server *s, struct MHD_Connection *c, unsigned status) {
    int fd = conn_fd(c);
    if (fd < 0) return;
    const char *code, *msg;
    switch (status) {
    case 400: code = "malformed_request"; msg = "the HTTP request is malformed (request line, headers, Host, "
                                                 "Content-Length or chunked body encoding)"; break;
    case 413: code = "request_too_large"; msg = "a Content-Length or chunk size in the request is too large"; break;
    case 414: code = "uri_too_long"; msg = "the request URL is too long"; break;
    case 431: code = "request_header_fields_too_large"; msg = "the request headers are too large"; break;
    case 505: code = "http_version_not_supported"; msg = "the HTTP version is not supported (use HTTP/1.1)"; break;
    default: code = NULL; msg = "the HTTP request could not be processed"; break;
    }
    cJSON *j = error_json((int)status, msg, NULL, code);
    char *body = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!body) return;
    const char *acao = s->cfg.n_cors_origins ? cors_value(s, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin")) : NULL;
    const char *reason = MHD_get_reason_phrase_for(status);
    ak_buf b = {0};
    ak_buf_printf(&b, "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n",
                  status, reason && *reason ? reason : "Error", strlen(body));
    if (s->cfg.n_cors_origins) ak_buf_puts(&b, "Vary: Origin\r\n");
    if (acao) ak_buf_printf(&b, "Access-Control-Allow-Origin: %s\r\n", acao);
    ak_buf_printf(&b, "\r\n%s", body);
    free(body);
    if (!b.failed && send_bounded(fd, b.p, b.len) == 0) {
        shutdown(fd, SHUT_WR);
        drain(fd);
        ak_metrics_request(s->cfg.metrics, "other", (int)status);
    }
    ak_buf_free(&b);
}

/* libmicrohttpd's error logger: acts on its announcement of an error page
 * (see above); everything else it reports (a client that reset its
 * connection, say) is dropped, as before the logger was set. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    ak_server *s = cls;
    if (strncmp(fmt, MHD_ERROR_ANNOUNCEMENT, sizeof MHD_ERROR_ANNOUNCEMENT - 1)) return;
    struct MHD_Connection *c = pthread_getspecific(s->conn_key);
    if (c) protocol_error(s, c, va_arg(ap, unsigned));
}

ak_server *ak_server_start(const ak_server_config *cfg, ak_error *err) {
    if (sodium_init() < 0) {
        ak_fail(err, "server: libsodium failed to initialize");
        return NULL;
    }
    ak_server *s = ak_calloc(1, sizeof *s, err);
    if (!s) return NULL;
    s->cfg = *cfg;
    if (!s->cfg.host) s->cfg.host = "127.0.0.1";
    if (!s->cfg.max_body) s->cfg.max_body = 4u << 20;
    if (!s->cfg.conn_timeout_s) s->cfg.conn_timeout_s = AK_SERVER_DEFAULT_TIMEOUT_S;
    if (!s->cfg.max_conns_per_ip) s->cfg.max_conns_per_ip = AK_SERVER_DEFAULT_CONNS_PER_IP;
    if (!s->cfg.max_buffered) s->cfg.max_buffered = AK_SERVER_DEFAULT_MAX_BUFFERED;
    atomic_init(&s->buffered, 0);
    if (pthread_key_create(&s->conn_key, NULL) != 0) {
        ak_fail(err, "server: cannot create a thread key");
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    randombytes_buf(&s->id_salt, sizeof s->id_salt);
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(s->cfg.host, port, &hints, &ai);
    if (gai != 0 || !ai) {
        ak_fail(err, "server: cannot resolve host '%s': %s", s->cfg.host, gai_strerror(gai));
        pthread_key_delete(s->conn_key);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return NULL;
    }
    /* The idle timeout is MHD's own: it runs while MHD waits on the socket,
     * not while a handler or a stream callback waits for the engine, so a
     * long generation is never cut by it (test_server_hard checks this). */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* the logger first: libmicrohttpd says options before it may log to stderr */
    s->d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, handler, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                            MHD_OPTION_URI_LOG_CALLBACK, bind_thread, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_CONNECTION_LIMIT, 512u,
                            MHD_OPTION_CONNECTION_TIMEOUT, s->cfg.conn_timeout_s, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            s->cfg.max_conns_per_ip, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        ak_fail(err, "server: cannot listen on %s:%d (address in use or not permitted?)", s->cfg.host, cfg->port);
        pthread_key_delete(s->conn_key);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : cfg->port;
    return s;
}

int ak_server_port(const ak_server *s) { return s->port; }

int ak_server_host_is_loopback(const char *host) {
    if (!host) return 1;
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0 || !ai) return 0;
    int all = 1;
    for (struct addrinfo *p = ai; p && all; p = p->ai_next) {
        if (p->ai_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)p->ai_addr;
            all = (ntohl(a->sin_addr.s_addr) >> 24) == 127;
        } else if (p->ai_family == AF_INET6) {
            const struct in6_addr *a = &((const struct sockaddr_in6 *)p->ai_addr)->sin6_addr;
            all = IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
        } else {
            all = 0;
        }
    }
    freeaddrinfo(ai);
    return all;
}

void ak_server_quiesce(ak_server *s) {
    if (!s || !s->d) return;
    MHD_socket fd = MHD_quiesce_daemon(s->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void ak_server_stop(ak_server *s) {
    if (!s) return;
    if (s->d) MHD_stop_daemon(s->d);
    pthread_key_delete(s->conn_key);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
