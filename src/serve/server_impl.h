/* server_impl.h - the parts of the HTTP server (server.h) its files share.
 * Internal to src/serve/:
 *   server.c             libmicrohttpd glue: connections, body buffering, the
 *                        guards on headers, libmicrohttpd's own errors
 *   reply.c              responses: JSON bodies, OpenAI's error shape, the
 *                        table of ak_err_code -> HTTP status
 *   routes.c             the route table and its dispatch; health, metrics,
 *                        models and agents
 *   routes_completions.c /v1/chat/completions and /v1/completions (SSE too)
 *   routes_pools.c       pools and memories
 *   routes_cards.c       CacheCards
 *   routes_console.c     the console: a page that reads the API (GET /)
 *   routes_responses.c   the Responses API and conversations (responses.h
 *                        reads requests and writes replies; run.h runs them)
 */
#ifndef AK_SERVER_IMPL_H
#define AK_SERVER_IMPL_H

#include "serve/api.h"
#include "serve/server.h"

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

struct ak_server {
    ak_server_config cfg;
    struct MHD_Daemon *d;
    int port;
    pthread_mutex_t mu;       /* guards next_id */
    uint64_t next_id;
    uint64_t id_salt;
    atomic_size_t buffered;   /* request-body bytes reserved by all connections */
    pthread_key_t conn_key;   /* a connection thread's MHD_Connection (see protocol_error) */
    ak_grammars *grammars;    /* compiled response formats, per schema (grammars.h) */
    /* each agent's latest stored response (routes_responses.c: a branch gets an agent of its own), a
       table by hash of the agent id (a slot another agent takes forgets the first's head); guarded by mu */
    struct {
        char agent[AK_AGENT_ID_MAX + 1];
        char head[72];
    } resp_heads[1024];
};

/* One connection's request: its body as it arrives. */
typedef struct {
    char *body;
    size_t len, cap;
    size_t reserved;          /* bytes of s->buffered this request holds */
    int too_large;            /* over max_body: the rest is discarded, 413 */
    int over_cap;             /* over max_buffered: the rest is discarded, 503 */
    uint32_t domain;          /* the trust domain of its key (server.h: api_keys) */
} ak_conn;

#define logf_(s, ...) ak_logf((s)->cfg.log, (s)->cfg.log_ud, __VA_ARGS__)

/* Frees the request's body and gives its share of the buffered-body budget
 * back (a handler calls it once the body is parsed). */
void ak_server_release_body(ak_server *s, ak_conn *cn);
/* The client's socket of c, or -1 when libmicrohttpd does not say. */
int ak_server_conn_fd(struct MHD_Connection *c);

/* ------------------------------------------------------------ routes */

/* A request as a route's handler sees it. */
typedef struct {
    ak_server *s;
    struct MHD_Connection *c;
    ak_conn *cn;              /* its body (complete) */
    const char *url, *method;
    const char *ep;           /* the route's /metrics label */
    const char *id;           /* the path's {id} (NUL-terminated; "" if the pattern has none) */
    const char *param;        /* where the pattern's first {...} starts in url ("" if none) */
} ak_route_req;

/* Answers a request that reached url (headers and body read): the route
 * table's handler for it, or 404, 405 or 400 for a bad path id. */
enum MHD_Result ak_route_dispatch(ak_server *s, struct MHD_Connection *c, ak_conn *cn, const char *url,
                                  const char *method);
/* The /metrics label of url (the route table's, "other" for none). */
const char *ak_route_label(const char *url);
/* 1 when url is served without the API key (/health, the console's files:
 * they hold no data; the data they show comes from routes that need it). */
int ak_route_keyless(const char *url);

/* The handlers the route table names (routes_*.c). */
enum MHD_Result ak_route_chat(const ak_route_req *q);
enum MHD_Result ak_route_completion(const ak_route_req *q);
enum MHD_Result ak_route_pool_create(const ak_route_req *q);
enum MHD_Result ak_route_pools_list(const ak_route_req *q);
enum MHD_Result ak_route_pool_get(const ak_route_req *q);
enum MHD_Result ak_route_pool_delete(const ak_route_req *q);
enum MHD_Result ak_route_memory_create(const ak_route_req *q);
enum MHD_Result ak_route_memories_list(const ak_route_req *q);
enum MHD_Result ak_route_memory_get(const ak_route_req *q);
enum MHD_Result ak_route_memory_delete(const ak_route_req *q);
enum MHD_Result ak_route_card_make(const ak_route_req *q);
enum MHD_Result ak_route_card_import(const ak_route_req *q);
enum MHD_Result ak_route_cards_list(const ak_route_req *q);
enum MHD_Result ak_route_card_get(const ak_route_req *q);
enum MHD_Result ak_route_card_delete(const ak_route_req *q);
enum MHD_Result ak_route_console(const ak_route_req *q);
enum MHD_Result ak_route_responses_create(const ak_route_req *q);
enum MHD_Result ak_route_response_get(const ak_route_req *q);
enum MHD_Result ak_route_response_delete(const ak_route_req *q);
enum MHD_Result ak_route_response_input_items(const ak_route_req *q);
enum MHD_Result ak_route_conversation_create(const ak_route_req *q);
enum MHD_Result ak_route_conversation_get(const ak_route_req *q);
enum MHD_Result ak_route_conversation_delete(const ak_route_req *q);
enum MHD_Result ak_route_conversation_items(const ak_route_req *q);

/* The parser's view of this server (api.h), its pools and memories looked
 * up through the scheduler. */
ak_api_config ak_server_api_config(ak_server *s);

/* ------------------------------------------------------------ replies */

/* The HTTP status of an ak_err_code (reply.c's table; 500 for any code it
 * does not name). */
int ak_http_status_of(int code);
/* OpenAI's error object {"error": {message, type, param, code}} for status
 * (param and code may be NULL). */
cJSON *ak_http_error_json(int status, const char *message, const char *param, const char *code);
/* Adds the CORS headers of an ordinary response (see server.c). */
void ak_http_add_cors(const ak_server *s, struct MHD_Connection *c, struct MHD_Response *r);

/* Each queues a response on c, counts it in /metrics under ep, and returns
 * libmicrohttpd's verdict. */

/* body (malloc'd, taken over; NULL: a 500 out-of-memory answer) with its
 * content type and, if retry_after is not NULL, a Retry-After header. */
enum MHD_Result ak_http_body(ak_server *s, struct MHD_Connection *c, const char *ep, int status, char *body,
                             const char *content_type, const char *retry_after);
/* j (consumed; NULL: out of memory) as application/json. */
enum MHD_Result ak_http_json(ak_server *s, struct MHD_Connection *c, const char *ep, int status, cJSON *j);
/* OpenAI's error object with the formatted message. */
enum MHD_Result ak_http_error(ak_server *s, struct MHD_Connection *c, const char *ep, int status, const char *param,
                              const char *code, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
/* 503 for a body refused because all connections together already buffer
 * max_buffered bytes; Retry-After asks the client to come back shortly. */
enum MHD_Result ak_http_busy(ak_server *s, struct MHD_Connection *c, const char *ep);
/* 413 for a body over max_body. */
enum MHD_Result ak_http_too_large(ak_server *s, struct MHD_Connection *c, const char *ep);
/* The answer to a DELETE that removed `what` (agent, pool, ...) id, logged. */
enum MHD_Result ak_http_deleted(const ak_route_req *q, const char *what);
/* 200 with a body that outlives the server (a file of the console: not
 * copied, never freed) of content_type and the extra headers, name and
 * value pairs ending with a NULL name (headers may be NULL). */
enum MHD_Result ak_http_static(const ak_route_req *q, const void *data, size_t len, const char *content_type,
                               const char *const *headers);
/* An answer whose body is a list {"object": "list", "data": [...]}: data
 * (an array, consumed) wrapped. */
enum MHD_Result ak_http_list(const ak_route_req *q, cJSON *data);
/* The answer to a listing that returned rc (err set when < 0: 500): the n
 * items of `size` bytes at v (malloc'd, freed here), each as json makes it. */
enum MHD_Result ak_http_items(const ak_route_req *q, int rc, const ak_error *err, void *v, int n, size_t size,
                              cJSON *(*json)(const void *item));

#endif
