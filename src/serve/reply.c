/* reply.c - the server's responses: JSON bodies, OpenAI's error shape and
 * the one table from ak_err_code to HTTP status (server_impl.h). */
#include "serve/server_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The HTTP status of each ak_err_code the engine, the agents or the store
 * report; a code not here (IO, NOMEM, CORRUPT, GENERIC, ...) is the
 * server's failure: 500. */
static const struct {
    int code;
    int status;
} http_status[] = {
    {.code = AK_ERR_INVALID, .status = 400},   /* a request that can never work */
    {.code = AK_ERR_NOT_FOUND, .status = 404},
    {.code = AK_ERR_EXISTS, .status = 409},    /* write-once things */
    {.code = AK_ERR_STALE, .status = 409},     /* sound, but another model's */
    {.code = AK_ERR_BUSY, .status = 409},      /* in use by a request or an agent */
    {.code = AK_ERR_KV_BUDGET, .status = 503}, /* no KV room now */
    {.code = AK_ERR_SHUTDOWN, .status = 503},
};

int ak_http_status_of(int code) {
    for (size_t i = 0; i < sizeof http_status / sizeof *http_status; i++)
        if (http_status[i].code == code) return http_status[i].status;
    return 500;
}

/* OpenAI's error type of an HTTP status. */
static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

cJSON *ak_http_error_json(int status, const char *message, const char *param, const char *code) {
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", error_type(status));
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    return j;
}

enum MHD_Result ak_http_body(ak_server *s, struct MHD_Connection *c, const char *ep, int status, char *body,
                             const char *content_type, const char *retry_after) {
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
    ak_http_add_cors(s, c, r);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    ak_metrics_request(s->cfg.metrics, ep, status);
    return rc;
}

enum MHD_Result ak_http_json(ak_server *s, struct MHD_Connection *c, const char *ep, int status, cJSON *j) {
    char *body = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return ak_http_body(s, c, ep, status, body, "application/json", NULL);
}

enum MHD_Result ak_http_error(ak_server *s, struct MHD_Connection *c, const char *ep, int status, const char *param,
                              const char *code, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ak_http_json(s, c, ep, status, ak_http_error_json(status, msg, param, code));
}

enum MHD_Result ak_http_busy(ak_server *s, struct MHD_Connection *c, const char *ep) {
    char msg[160];
    snprintf(msg, sizeof msg, "the server is buffering too many request bodies (%zu bytes); retry shortly",
             s->cfg.max_buffered);
    cJSON *j = ak_http_error_json(503, msg, NULL, "server_busy");
    char *body = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return ak_http_body(s, c, ep, 503, body, "application/json", "1");
}

enum MHD_Result ak_http_too_large(ak_server *s, struct MHD_Connection *c, const char *ep) {
    return ak_http_error(s, c, ep, 413, NULL, "request_too_large", "the request body is larger than %zu bytes",
                         s->cfg.max_body);
}

enum MHD_Result ak_http_deleted(const ak_route_req *q, const char *what) {
    logf_(q->s, "%s %s: deleted", what, q->id);
    char object[32];
    snprintf(object, sizeof object, "%s.deleted", what);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", q->id);
    cJSON_AddStringToObject(j, "object", object);
    cJSON_AddBoolToObject(j, "deleted", 1);
    return ak_http_json(q->s, q->c, q->ep, 200, j);
}

enum MHD_Result ak_http_list(const ak_route_req *q, cJSON *data) {
    cJSON *j = cJSON_CreateObject();
    if (!j) cJSON_Delete(data);
    cJSON_AddStringToObject(j, "object", "list");
    cJSON_AddItemToObject(j, "data", data);
    return ak_http_json(q->s, q->c, q->ep, 200, j);
}

enum MHD_Result ak_http_items(const ak_route_req *q, int rc, const ak_error *err, void *v, int n, size_t size,
                              cJSON *(*json)(const void *item)) {
    if (rc < 0) return ak_http_error(q->s, q->c, q->ep, 500, NULL, NULL, "%s", err->msg);
    cJSON *data = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(data, json((const char *)v + (size_t)i * size));
    free(v);
    return ak_http_list(q, data);
}

enum MHD_Result ak_http_static(const ak_route_req *q, const void *data, size_t len, const char *content_type,
                               const char *const *headers) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", content_type);
    for (const char *const *h = headers; h && h[0]; h += 2) MHD_add_response_header(r, h[0], h[1]);
    ak_http_add_cors(q->s, q->c, r);
    enum MHD_Result rc = MHD_queue_response(q->c, 200, r);
    MHD_destroy_response(r);
    ak_metrics_request(q->s->cfg.metrics, q->ep, 200);
    return rc;
}
