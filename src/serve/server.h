/* LAYER serve/ (src/serve/), the highest: the HTTP server, request
 * parsing, the scheduler (continuous batching), metrics.
 * Promises: OpenAI's API and error shapes; every request body checked
 * (type, range, UTF-8, size) before it reaches an agent; hostile clients
 * refused on their headers; one engine thread runs the batch, an I/O
 * thread restores, a thread per connection waits.
 * May use: base, text, kv, engine, store, agents; no layer uses it (the
 * CLI's `agentkv serve` does). The table: scripts/check-layers.sh.
 *
 * server.h - the OpenAI-compatible HTTP front end (libmicrohttpd).
 *
 * Endpoints:
 *   POST   /v1/chat/completions   messages rendered with the model's chat template
 *   POST   /v1/completions        a raw prompt (tokenized as `agentkv run` does)
 *   GET    /v1/models             the one model served
 *   GET    /v1/models/{id}        that model (404 model_not_found for another id)
 *   GET    /v1/agents             every agent (in RAM or on disk)
 *   GET    /v1/agents/{id}        one agent
 *   DELETE /v1/agents/{id}        forget an agent (memory and file)
 *   POST   /v1/pools              prefill and persist a pool (a shared prefix; 201)
 *   GET    /v1/pools              every pool
 *   GET    /v1/pools/{id}         one pool
 *   DELETE /v1/pools/{id}         delete a pool (409 naming the agents attached to it)
 *   POST   /v1/agents/{id}/cards  make a CacheCard of the agent's context (201; docs/cards.md)
 *   POST   /v1/agents/{id}/import a card becomes the agent's context (mode "replace")
 *                                 or follows it (mode "append")
 *   GET    /v1/cards              every card
 *   GET    /v1/cards/{id}         one card (?download=1: its file's bytes)
 *   DELETE /v1/cards/{id}         delete a card (409 naming the agents that hold it)
 *   POST   /v1/memories           compute and persist a memory chunk (201; 200 when held)
 *   GET    /v1/memories           every memory
 *   GET    /v1/memories/{id}      one memory, with its text
 *   DELETE /v1/memories/{id}      delete a memory (docs/memories.md)
 *   GET    /health                liveness, no key needed, any Host
 *   GET    /, /console            the console: a page that reads this API (routes_console.c;
 *                                 no key needed for it, nor for /console/NAME, its files)
 *   GET    /metrics               Prometheus text format
 *   OPTIONS any                    a CORS preflight (204) from an origin cors_origins allows
 * The agent of a request is the header X-Agent-Id, or the body field
 * agent_id or prompt_cache_key (docs/agents.md); without one, cached
 * prefixes are reused but nothing persists.
 * A completion with "pool": ID starts from that pool's tokens, its agent
 * attached to the pool's blocks (api.h: POOLS says how the prompt is made).
 * Errors are OpenAI's body {"error": {"message", "type", "param", "code"}}.
 *
 * Hostile or careless clients: the API key, a declared body over max_body
 * (413) and the global cap on buffered body bytes (503 + Retry-After) are
 * checked on the headers, before any body byte is read; so are the guards
 * against web pages driving a local server (DNS rebinding, CSRF): a Host
 * that is not an allowed name (403 host_not_allowed), an Origin that
 * cors_origins does not allow (403 origin_not_allowed), a body that is not
 * application/json (415 unsupported_media_type). Errors libmicrohttpd finds
 * itself (a malformed chunked body or header line, headers too large) are
 * answered in the same JSON shape (server.c, "libmicrohttpd's errors": how,
 * and which errors of a connection's first request line keep its page).
 * Bodies are parsed by api.c (caps on messages and parts, numbers
 * range-checked). A client that closes its connection while its request
 * waits or generates is noticed within AK_GONE_POLL_MS
 * (routes_completions.c) and the request cancelled (the agent keeps what
 * the engine committed: docs/server.md); /metrics counts it as 499.
 *
 * Why libmicrohttpd: Debian ships and maintains it, it does HTTP/1.1 with
 * chunked responses (what SSE needs) and a thread per connection, so a
 * handler can block on its request while the engine runs the batch.
 */
#ifndef AK_SERVER_H
#define AK_SERVER_H

#include "text/chat.h"
#include "serve/metrics.h"
#include "serve/sched.h"
#include "store/rstore.h"

typedef struct {
    const char *host;          /* address to bind (default 127.0.0.1) */
    int port;                  /* 0: any free port (see ak_server_port) */
    ak_sched *sched;
    const ak_model *model;
    const ak_tokenizer *tok;
    const char *model_id;      /* the name /v1/models lists and requests must name */
    const char *const *api_keys; /* keys a request may carry (Authorization: Bearer KEY); none: no
                                    key required. Each key is a trust domain of its own (its index:
                                    handoff reuse crosses agents only within one; without keys the
                                    whole server is domain 0) */
    int n_api_keys;
    int handoff;               /* handoff reuse for requests that do not set it (api.h: HANDOFF
                                  REUSE): 0 off, 1 by handoff_reuse's method */
    ak_reuse_params handoff_reuse;
    size_t max_body;           /* bytes; larger bodies get 413 (default 4 MiB) */
    ak_chat_family family;
    const char *template_text; /* the model's chat template (may be NULL) */
    int n_ctx;
    ak_metrics *metrics;
    ak_log_fn log;             /* may be NULL */
    void *log_ud;
    /* limits against hostile or broken clients (0: the default) */
    unsigned conn_timeout_s;   /* a connection idle this long is closed (default 30; time a
                                  request spends generating is not idle) */
    unsigned max_conns_per_ip; /* connections one client address may hold (default 128);
                                  more are closed at once */
    size_t max_buffered;       /* request-body bytes buffered across all connections (default
                                  64 MiB); a body that would go over gets 503 + Retry-After: 1 */
    /* against web pages driving the server (the strings are the caller's, kept while it runs) */
    const char *const *allowed_hosts; /* Host names allowed beside localhost, 127.0.0.1, [::1] and
                                         host; "*" turns the Host check off */
    int n_allowed_hosts;
    const char *const *cors_origins;  /* origins whose browser requests are allowed and get CORS
                                         headers ("*": any); none: every request with an Origin
                                         header is refused */
    int n_cors_origins;
    ak_rstore *rstore;         /* stored responses and conversations (rstore.h); NULL: none kept
                                  (answers say "store": false; previous_response_id is a 400) */
} ak_server_config;

#define AK_SERVER_DEFAULT_TIMEOUT_S      30u
#define AK_SERVER_DEFAULT_CONNS_PER_IP   128u
#define AK_SERVER_DEFAULT_MAX_BUFFERED   ((size_t)64 << 20)

typedef struct ak_server ak_server;

/* Binds and starts serving. Returns NULL with err set (address in use, bad host). */
ak_server *ak_server_start(const ak_server_config *cfg, ak_error *err);
/* The port actually bound. */
int ak_server_port(const ak_server *s);
/* Stops accepting new connections; those open go on. */
void ak_server_quiesce(ak_server *s);
/* 1 when every address host resolves to is a loopback address (127.0.0.0/8,
 * ::1, or an IPv4-mapped 127.x), so only this machine can connect; 0 when
 * any is not, or host does not resolve (NULL means the default 127.0.0.1). */
int ak_server_host_is_loopback(const char *host);
/* 1 when o is a value cors_origins may hold (serve --cors-origin): "*",
 * "null", or SCHEME://HOST[:PORT] as browsers send it (no path). */
int ak_server_origin_valid(const char *o);
/* 1 when h is a value allowed_hosts may hold (serve --allowed-host): "*",
 * a name or IPv4 address, or an IPv6 address in brackets; no port. */
int ak_server_host_name_valid(const char *h);
/* Waits for open connections to end and frees the server. NULL is fine. */
void ak_server_stop(ak_server *s);

#endif
