/* server.c - see server.h. libmicrohttpd's glue: a connection's request
 * is refused on its headers when it can be (the key, the web guards, the
 * body's type and size), its body buffered under the global cap, then
 * handed to the route table (routes.c); libmicrohttpd's own errors get this
 * server's JSON answer. */
#include "serve/server_impl.h"

#include "base/buf.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Grows the connection's share of the global body budget to `total` bytes.
 * Returns 0, or -1 (nothing changed) when all connections together would
 * hold more than max_buffered. */
static int reserve(ak_server *s, ak_conn *cn, size_t total) {
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
void ak_server_release_body(ak_server *s, ak_conn *cn) {
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
void ak_http_add_cors(const ak_server *s, struct MHD_Connection *c, struct MHD_Response *r) {
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


/* 1 when origin is the request's own, http:// or https:// and its Host
 * header: a page this server served (the console) calling it back, as
 * browsers send Origin on a same-origin POST or DELETE. Only a page loaded
 * from that very origin makes a browser send it, and the Host check has
 * passed by then, so the name is not a rebound one; with that check off
 * ("*" among allowed_hosts) it may be, and 0. */
static int same_origin(const ak_server *s, const char *host, const char *origin) {
    for (int i = 0; i < s->cfg.n_allowed_hosts; i++)
        if (!strcmp(s->cfg.allowed_hosts[i], "*")) return 0;
    if (!host) return 0;
    const char *rest = !strncasecmp(origin, "http://", 7)    ? origin + 7
                       : !strncasecmp(origin, "https://", 8) ? origin + 8
                                                             : NULL;
    return rest && !strcasecmp(rest, host);
}

/* 204 to a CORS preflight from an allowed origin: the methods and request
 * headers browsers may use, cached for AK_CORS_MAX_AGE_S. */
static enum MHD_Result send_preflight(ak_server *s, struct MHD_Connection *c, const char *ep) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    ak_http_add_cors(s, c, r);
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
        *out = ak_http_error(s, c, ep, 400, NULL, "malformed_request", "an HTTP/1.1 request needs a Host header");
    else if (strcmp(url, "/health") && !host_allowed(s, host))
        *out = ak_http_error(s, c, ep, 403, NULL, "host_not_allowed",
                             "Host '%.200s' is not a name of this server (allow it with serve --allowed-host)", host);
    else if (origin && !same_origin(s, host, origin) && !cors_value(s, origin))
        *out = ak_http_error(s, c, ep, 403, NULL, "origin_not_allowed",
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
        *out = ak_http_error(s, c, ep, 415, NULL, "unsupported_media_type",
                             "the request body must be JSON (Content-Type: application/json), not '%.100s'",
                             ct ? ct : "(none)");
    else if (te && strcasecmp(te, "chunked"))
        *out = ak_http_error(s, c, ep, 501, NULL, "unsupported_transfer_encoding",
                             "Transfer-Encoding '%.100s' is not supported (send Content-Length or chunked)", te);
    else
        return 0;
    return 1;
}

/* 1 when no key is required or the request carries one of them
 * (Authorization: Bearer KEY, each compared in constant time), with *domain
 * set to the key's index (0 without keys). */
static int authorized(ak_server *s, struct MHD_Connection *c, uint32_t *domain) {
    *domain = 0;
    if (!s->cfg.n_api_keys) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return 0;
    h += 7;
    size_t a = strlen(h);
    int found = 0;
    for (int i = 0; i < s->cfg.n_api_keys; i++) {   /* every key compared: the time does not say which matched */
        const char *k = s->cfg.api_keys[i];
        if (a == strlen(k) && sodium_memcmp(h, k, a) == 0 && !found) {
            found = 1;
            *domain = (uint32_t)i;
        }
    }
    return found;
}

/* libmicrohttpd's request handler, called per request on its connection's
 * thread: first with the headers (refused there if they can be), then with
 * each piece of the body (buffered, or discarded past a limit), then once
 * the body is complete: the route table answers. */
static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    ak_server *s = cls;
    ak_conn *cn = *con_cls;
    if (!cn) {
        /* the first call: only the headers have arrived. Everything that can
         * be refused on them is refused now, before a body byte is read. */
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        const char *ep = ak_route_label(url);
        enum MHD_Result out;
        if (web_guard(s, c, url, method, version, ep, &out)) return out;
        if (!authorized(s, c, &cn->domain) && !ak_route_keyless(url))
            return ak_http_error(s, c, ep, 401, NULL, "invalid_api_key",
                                 "a valid API key is required (Authorization: Bearer KEY)");
        if (body_type_guard(s, c, method, ep, &out)) return out;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno || end == cl || v > s->cfg.max_body) return ak_http_too_large(s, c, ep);
            if (reserve(s, cn, (size_t)v) < 0) return ak_http_busy(s, c, ep);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t add = *upload_size;
        *upload_size = 0;
        if (cn->too_large || cn->over_cap) return MHD_YES;   /* discarded */
        if (cn->len + add > s->cfg.max_body) {
            cn->too_large = 1;
            ak_server_release_body(s, cn);
            return MHD_YES;
        }
        if (cn->len + add > cn->reserved && reserve(s, cn, cn->len + add) < 0) {
            cn->over_cap = 1;
            ak_server_release_body(s, cn);
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
    return ak_route_dispatch(s, c, cn, url, method);
}

/* libmicrohttpd's end of a request: its body and buffer share go. */
static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c;
    (void)toe;
    ak_server *s = cls;
    ak_conn *cn = *con_cls;
    if (cn) {
        ak_server_release_body(s, cn);
        free(cn);
    }
    *con_cls = NULL;
}

int ak_server_conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? (int)ci->connect_fd : -1;
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
 * server's JSON answer (Connection: close, its Content-Length) to the
 * socket first; the client reads it and closes. The socket is not shut or
 * read behind libmicrohttpd's back: doing so crashed libmicrohttpd's
 * connection thread now and then. Its page follows the answer on the wire,
 * past the Content-Length a client reads, and it then closes the
 * connection.
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

/* Writes this server's JSON answer for an error libmicrohttpd found in the
 * request on c (status: the one libmicrohttpd chose) ahead of
 * libmicrohttpd's own page. */
static void protocol_error(ak_server *s, struct MHD_Connection *c, unsigned status) {
    int fd = ak_server_conn_fd(c);
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
    cJSON *j = ak_http_error_json((int)status, msg, NULL, code);
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
    if (!(s->grammars = ak_grammars_new(cfg->tok, 0, 0, err))) {
        free(s);
        return NULL;
    }
    if (pthread_key_create(&s->conn_key, NULL) != 0) {
        ak_fail(err, "server: cannot create a thread key");
        ak_grammars_free(s->grammars);
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
        ak_grammars_free(s->grammars);
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
        ak_grammars_free(s->grammars);
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
    ak_grammars_free(s->grammars);   /* what running requests hold lives until they end */
    pthread_key_delete(s->conn_key);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
