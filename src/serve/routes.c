/* routes.c - the route table of the HTTP server and its dispatch; the small
 * routes (health, metrics, models, agents). The other handlers are in
 * routes_completions.c, routes_pools.c and routes_cards.c. */
#include "serve/server_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum MHD_Result (*route_fn)(const ak_route_req *q);

/* How a path's {id} is checked (400 when it is not valid). */
typedef enum { ID_ANY = 0, ID_AGENT, ID_POOL, ID_CARD, ID_MEMORY, ID_RECORD } id_kind;


static const struct {
    const char *noun, *param, *code;
    int (*valid)(const char *id);
} id_kinds[] = {
    [ID_AGENT] = {.noun = "agent", .param = "agent_id", .code = "invalid_agent_id", .valid = ak_agent_id_valid},
    [ID_POOL] = {.noun = "pool", .param = "pool", .code = "invalid_pool_id", .valid = ak_pool_id_valid},
    [ID_CARD] = {.noun = "card", .param = "card", .code = "invalid_card_id", .valid = ak_agent_id_valid},
    [ID_MEMORY] = {.noun = "memory", .param = "memory", .code = "invalid_memory_id", .valid = ak_agent_id_valid},
    [ID_RECORD] = {.noun = "response or conversation", .param = "id", .code = "invalid_id", .valid = ak_rstore_id_valid},
};

/* The wording of a 405 for a pattern (its rows' methods are the allowed ones):
 * USE "use POST for /v1/completions", LIST "method PUT not allowed here
 * (POST or GET /v1/pools)" and the row's hint, BARE "method PUT not allowed
 * here". */
typedef enum { REFUSE_USE, REFUSE_LIST, REFUSE_BARE } refusal;

/* One row: requests with this method (NULL: any) whose URL matches pattern
 * go to fn. A pattern is literal text and parameters: {id} (checked as
 * id_kind says) or {*}; a parameter ends where the pattern's next character
 * occurs in the URL, or at the URL's end when it ends the pattern. The rows
 * of one pattern are together; the first row whose pattern matches decides
 * the label, the id check and the 405. */
typedef struct {
    const char *method;
    const char *pattern;
    route_fn fn;
    const char *label;        /* the endpoint /metrics counts it under */
    id_kind id;
    int body;                 /* 1: reads a JSON body (413 over max_body, 503 over the buffered cap) */
    int keyless;              /* 1: served without the API key (ak_route_keyless) */
    refusal refuse;
    const char *hint;         /* REFUSE_LIST: after the allowed methods (NULL: none) */
} route;

static enum MHD_Result health(const ak_route_req *q);
static enum MHD_Result metrics(const ak_route_req *q);
static enum MHD_Result models_list(const ak_route_req *q);
static enum MHD_Result model_get(const ak_route_req *q);
static enum MHD_Result agents_list(const ak_route_req *q);
static enum MHD_Result agents_need_id(const ak_route_req *q);
static enum MHD_Result agent_get(const ak_route_req *q);
static enum MHD_Result agent_delete(const ak_route_req *q);
static enum MHD_Result agent_unknown_action(const ak_route_req *q);

#define MAKE_CARD_HINT "; make one with POST /v1/agents/{id}/cards"

static const route routes[] = {
    {.pattern = "/health", .fn = health, .label = "/health", .keyless = 1},
    {.method = "GET", .pattern = "/", .fn = ak_route_console, .label = "/console", .keyless = 1, .refuse = REFUSE_BARE},
    {.method = "GET", .pattern = "/console", .fn = ak_route_console, .label = "/console", .keyless = 1,
     .refuse = REFUSE_BARE},
    {.method = "GET", .pattern = "/console/{*}", .fn = ak_route_console, .label = "/console", .keyless = 1,
     .refuse = REFUSE_BARE},
    {.pattern = "/metrics", .fn = metrics, .label = "/metrics"},
    {.method = "POST", .pattern = "/v1/chat/completions", .fn = ak_route_chat, .label = "/v1/chat/completions",
     .body = 1},
    {.method = "POST", .pattern = "/v1/completions", .fn = ak_route_completion, .label = "/v1/completions", .body = 1},
    {.method = "POST", .pattern = "/v1/responses", .fn = ak_route_responses_create, .label = "/v1/responses", .body = 1},
    {.method = "GET", .pattern = "/v1/responses/{id}/input_items", .fn = ak_route_response_input_items,
     .label = "/v1/responses", .id = ID_RECORD, .refuse = REFUSE_BARE},
    {.method = "GET", .pattern = "/v1/responses/{id}", .fn = ak_route_response_get, .label = "/v1/responses",
     .id = ID_RECORD, .refuse = REFUSE_LIST},
    {.method = "DELETE", .pattern = "/v1/responses/{id}", .fn = ak_route_response_delete, .label = "/v1/responses",
     .id = ID_RECORD, .refuse = REFUSE_LIST},
    {.method = "POST", .pattern = "/v1/conversations", .fn = ak_route_conversation_create, .label = "/v1/conversations",
     .body = 1},
    {.method = "GET", .pattern = "/v1/conversations/{id}/items", .fn = ak_route_conversation_items,
     .label = "/v1/conversations", .id = ID_RECORD, .refuse = REFUSE_LIST},
    {.method = "POST", .pattern = "/v1/conversations/{id}/items", .fn = ak_route_conversation_items,
     .label = "/v1/conversations", .id = ID_RECORD, .body = 1, .refuse = REFUSE_LIST},
    {.method = "GET", .pattern = "/v1/conversations/{id}", .fn = ak_route_conversation_get, .label = "/v1/conversations",
     .id = ID_RECORD, .refuse = REFUSE_LIST},
    {.method = "DELETE", .pattern = "/v1/conversations/{id}", .fn = ak_route_conversation_delete,
     .label = "/v1/conversations", .id = ID_RECORD, .refuse = REFUSE_LIST},
    {.pattern = "/v1/models", .fn = models_list, .label = "/v1/models"},
    {.method = "GET", .pattern = "/v1/models/{id}", .fn = model_get, .label = "/v1/models"},
    {.method = "GET", .pattern = "/v1/agents", .fn = agents_list, .label = "/v1/agents", .refuse = REFUSE_BARE},
    {.method = "DELETE", .pattern = "/v1/agents", .fn = agents_need_id, .label = "/v1/agents", .refuse = REFUSE_BARE},
    {.method = "POST", .pattern = "/v1/agents/{id}/cards", .fn = ak_route_card_make, .label = "/v1/agents",
     .id = ID_AGENT, .body = 1},
    {.method = "POST", .pattern = "/v1/agents/{id}/import", .fn = ak_route_card_import, .label = "/v1/agents",
     .id = ID_AGENT, .body = 1},
    {.pattern = "/v1/agents/{*}/{*}", .fn = agent_unknown_action, .label = "/v1/agents"},
    {.method = "GET", .pattern = "/v1/agents/{id}", .fn = agent_get, .label = "/v1/agents", .id = ID_AGENT,
     .refuse = REFUSE_BARE},
    {.method = "DELETE", .pattern = "/v1/agents/{id}", .fn = agent_delete, .label = "/v1/agents", .id = ID_AGENT,
     .refuse = REFUSE_BARE},
    {.method = "GET", .pattern = "/v1/cards", .fn = ak_route_cards_list, .label = "/v1/cards", .refuse = REFUSE_LIST,
     .hint = MAKE_CARD_HINT},
    {.method = "GET", .pattern = "/v1/cards/{id}", .fn = ak_route_card_get, .label = "/v1/cards", .id = ID_CARD,
     .refuse = REFUSE_LIST},
    {.method = "DELETE", .pattern = "/v1/cards/{id}", .fn = ak_route_card_delete, .label = "/v1/cards", .id = ID_CARD,
     .refuse = REFUSE_LIST},
    {.method = "POST", .pattern = "/v1/pools", .fn = ak_route_pool_create, .label = "/v1/pools", .body = 1,
     .refuse = REFUSE_LIST},
    {.method = "GET", .pattern = "/v1/pools", .fn = ak_route_pools_list, .label = "/v1/pools", .refuse = REFUSE_LIST},
    {.method = "GET", .pattern = "/v1/pools/{id}", .fn = ak_route_pool_get, .label = "/v1/pools", .id = ID_POOL,
     .refuse = REFUSE_LIST},
    {.method = "DELETE", .pattern = "/v1/pools/{id}", .fn = ak_route_pool_delete, .label = "/v1/pools", .id = ID_POOL,
     .refuse = REFUSE_LIST},
    {.method = "POST", .pattern = "/v1/memories", .fn = ak_route_memory_create, .label = "/v1/memories", .body = 1,
     .refuse = REFUSE_LIST},
    {.method = "GET", .pattern = "/v1/memories", .fn = ak_route_memories_list, .label = "/v1/memories",
     .refuse = REFUSE_LIST},
    {.method = "GET", .pattern = "/v1/memories/{id}", .fn = ak_route_memory_get, .label = "/v1/memories",
     .id = ID_MEMORY, .refuse = REFUSE_LIST},
    {.method = "DELETE", .pattern = "/v1/memories/{id}", .fn = ak_route_memory_delete, .label = "/v1/memories",
     .id = ID_MEMORY, .refuse = REFUSE_LIST},
};

#define N_ROUTES (sizeof routes / sizeof *routes)

/* Where a URL's parameters are. */
typedef struct {
    const char *id;           /* {id}'s first character (NULL: the pattern has none) */
    size_t id_len;
    const char *first;        /* the first parameter's first character (NULL: none) */
} params;

/* 1 when url matches pattern (see route), its parameters then in *p. */
static int match(const char *pattern, const char *url, params *p) {
    *p = (params){0};
    const char *u = url;
    while (*pattern) {
        if (*pattern != '{') {
            if (*pattern++ != *u++) return 0;
            continue;
        }
        int is_id = !strncmp(pattern, "{id}", 4);
        pattern = strchr(pattern, '}') + 1;
        const char stop[2] = {*pattern, 0};
        size_t n = *pattern ? strcspn(u, stop) : strlen(u);
        if (!p->first) p->first = u;
        if (is_id) {
            p->id = u;
            p->id_len = n;
        }
        u += n;
    }
    return !*u;
}

/* The first row whose pattern url matches, or NULL. */
static const route *find(const char *url, params *p) {
    for (size_t i = 0; i < N_ROUTES; i++)
        if (match(routes[i].pattern, url, p)) return &routes[i];
    return NULL;
}

const char *ak_route_label(const char *url) {
    params p;
    const route *r = find(url, &p);
    return r ? r->label : "other";
}

int ak_route_keyless(const char *url) {
    params p;
    const route *r = find(url, &p);
    return r && r->keyless;
}

/* The 405 for method on the pattern of row r. */
static enum MHD_Result not_allowed(const ak_route_req *q, const route *r) {
    char allowed[64] = "";
    for (size_t i = 0; i < N_ROUTES; i++) {
        if (strcmp(routes[i].pattern, r->pattern) || !routes[i].method) continue;
        size_t n = strlen(allowed);
        snprintf(allowed + n, sizeof allowed - n, "%s%s", n ? " or " : "", routes[i].method);
    }
    switch (r->refuse) {
    case REFUSE_USE: return ak_http_error(q->s, q->c, q->ep, 405, NULL, NULL, "use %s for %s", allowed, r->pattern);
    case REFUSE_LIST:
        return ak_http_error(q->s, q->c, q->ep, 405, NULL, NULL, "method %s not allowed here (%s %s%s)", q->method,
                             allowed, r->pattern, r->hint ? r->hint : "");
    default: return ak_http_error(q->s, q->c, q->ep, 405, NULL, NULL, "method %s not allowed here", q->method);
    }
}

enum MHD_Result ak_route_dispatch(ak_server *s, struct MHD_Connection *c, ak_conn *cn, const char *url,
                                  const char *method) {
    params p;
    const route *r = find(url, &p);
    if (!r) return ak_http_error(s, c, "other", 404, NULL, "unknown_url", "unknown URL %.200s", url);
    /* an {id} inside the path is cut to one character too long for an id,
     * which is then invalid; at the end it is the rest of the URL */
    char id[AK_AGENT_ID_MAX + 2] = "";
    const char *idp = id;
    if (p.id && !p.id[p.id_len]) {
        idp = p.id;
    } else if (p.id) {
        size_t n = p.id_len > AK_AGENT_ID_MAX ? AK_AGENT_ID_MAX + 1 : p.id_len;
        memcpy(id, p.id, n);
        id[n] = 0;
    }
    ak_route_req q = {.s = s, .c = c, .cn = cn, .url = url, .method = method, .ep = r->label, .id = idp,
                      .param = p.first ? p.first : ""};
    if (r->id != ID_ANY && !id_kinds[r->id].valid(idp))
        return ak_http_error(s, c, q.ep, 400, id_kinds[r->id].param, id_kinds[r->id].code,
                             "invalid %s id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')", id_kinds[r->id].noun);
    const route *hit = NULL;
    for (const route *x = r; x < routes + N_ROUTES && !hit; x++)
        if (!strcmp(x->pattern, r->pattern) && (!x->method || !strcmp(x->method, method))) hit = x;
    if (!hit) return not_allowed(&q, r);
    if (hit->body && cn->too_large) return ak_http_too_large(s, c, q.ep);
    if (hit->body && cn->over_cap) return ak_http_busy(s, c, q.ep);
    return hit->fn(&q);
}

/* ------------------------------------------------------- health, metrics */

/* GET /health: liveness and the model served. */
static enum MHD_Result health(const ak_route_req *q) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "status", "ok");
    cJSON_AddStringToObject(j, "model", q->s->cfg.model_id);
    return ak_http_json(q->s, q->c, q->ep, 200, j);
}

/* GET /metrics: the counters and the engine's gauges, Prometheus text. */
static enum MHD_Result metrics(const ak_route_req *q) {
    ak_metrics_gauges g;
    ak_sched_gauges(q->s->cfg.sched, &g);
    if (q->s->cfg.rstore) {
        ak_rstore_stats rs;
        ak_rstore_get_stats(q->s->cfg.rstore, &rs);
        g.responses = rs.records;
        g.responses_bytes = rs.bytes;
        g.responses_budget = rs.budget;
        g.responses_expired = rs.expired;
        g.responses_evicted = rs.evicted;
    }
    return ak_http_body(q->s, q->c, q->ep, 200, ak_metrics_render(q->s->cfg.metrics, &g), "text/plain; version=0.0.4",
                        NULL);
}

/* ---------------------------------------------------------------- models */

/* The model object OpenAI's /v1/models lists and /v1/models/{id} returns. */
static cJSON *model_json(const ak_server *s) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->cfg.model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "agentkv");
    return m;
}

/* /v1/models: the one model served. */
static enum MHD_Result models_list(const ak_route_req *q) {
    cJSON *data = cJSON_CreateArray();
    cJSON_AddItemToArray(data, model_json(q->s));
    return ak_http_list(q, data);
}

/* GET /v1/models/{id}: the served model, or 404 model_not_found. */
static enum MHD_Result model_get(const ak_route_req *q) {
    ak_server *s = q->s;
    if (strcmp(q->id, s->cfg.model_id))
        return ak_http_error(s, q->c, q->ep, 404, "model", "model_not_found",
                             "The model '%.200s' does not exist (this server serves '%s')", q->id, s->cfg.model_id);
    return ak_http_json(s, q->c, q->ep, 200, model_json(s));
}

/* ---------------------------------------------------------------- agents */

static cJSON *agent_json(const void *item) {
    const ak_sched_agent *a = item;
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

/* GET /v1/agents: every agent, in RAM or on disk. */
static enum MHD_Result agents_list(const ak_route_req *q) {
    ak_sched_agent *v = NULL;
    int n = 0;
    ak_error err = {0};
    int rc = ak_sched_list_agents(q->s->cfg.sched, &v, &n, &err);
    return ak_http_items(q, rc, &err, v, n, sizeof *v, agent_json);
}

/* DELETE /v1/agents: refused, an agent is deleted by its id. */
static enum MHD_Result agents_need_id(const ak_route_req *q) {
    return ak_http_error(q->s, q->c, q->ep, 405, NULL, NULL, "DELETE needs /v1/agents/{id}");
}

/* GET /v1/agents/{id}: one agent, or 404. */
static enum MHD_Result agent_get(const ak_route_req *q) {
    ak_sched_agent *v = NULL;
    int n = 0;
    ak_error err = {0};
    if (ak_sched_list_agents(q->s->cfg.sched, &v, &n, &err) < 0)
        return ak_http_error(q->s, q->c, q->ep, 500, NULL, NULL, "%s", err.msg);
    cJSON *j = NULL;
    for (int i = 0; i < n && !j; i++)
        if (!strcmp(v[i].id, q->id)) j = agent_json(&v[i]);
    free(v);
    if (!j) return ak_http_error(q->s, q->c, q->ep, 404, "agent_id", "agent_not_found", "no agent '%s'", q->id);
    return ak_http_json(q->s, q->c, q->ep, 200, j);
}

/* DELETE /v1/agents/{id}: forgets the agent (memory and file); 409 while a
 * request of it runs or waits. */
static enum MHD_Result agent_delete(const ak_route_req *q) {
    ak_error err = {0};
    int rc = ak_sched_remove_agent(q->s->cfg.sched, q->id, &err);
    if (rc < 0) return ak_http_error(q->s, q->c, q->ep, 500, NULL, NULL, "%s", err.msg);
    if (rc == 1) return ak_http_error(q->s, q->c, q->ep, 404, "agent_id", "agent_not_found", "no agent '%s'", q->id);
    if (rc == 2)
        return ak_http_error(q->s, q->c, q->ep, 409, "agent_id", "agent_busy",
                             "agent '%s' has a request running or queued", q->id);
    return ak_http_deleted(q, "agent");
}

/* /v1/agents/{id}/{action} for an action there is not. */
static enum MHD_Result agent_unknown_action(const ak_route_req *q) {
    return ak_http_error(q->s, q->c, q->ep, 404, NULL, "unknown_url", "unknown URL /v1/agents/%.200s", q->param);
}
