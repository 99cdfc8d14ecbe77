/* routes_pools.c - /v1/pools (shared prefixes, agent.h: POOLS) and
 * /v1/memories (memories.h): create, list, get, delete. */
#include "serve/server_impl.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- pools */

static cJSON *pool_json(const void *item) {
    const ak_pool_info *in = item;
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

/* POST /v1/pools: prefills and persists a pool (blocking until done); 201. */
enum MHD_Result ak_route_pool_create(const ak_route_req *q) {
    ak_server *s = q->s;
    ak_api_config ac = ak_server_api_config(s);
    ak_api_pool_request p;
    ak_api_error b;
    if (ak_api_parse_pool(&ac, q->cn->body, q->cn->len, &p, &b) < 0)
        return ak_http_error(s, q->c, q->ep, b.status, b.param, b.code, "%s", b.msg);
    ak_server_release_body(s, q->cn);
    ak_pool_info in;
    ak_error err = {0};
    ak_sched_pool_params pp = {.id = p.id, .tokens = p.tokens, .n = (int)p.n_tokens, .fk = p.fk, .fv = p.fv,
                               .source = p.source};
    int rc = ak_sched_pool_create(s->cfg.sched, &pp, &in, &err);
    char id[AK_AGENT_ID_MAX + 1];
    snprintf(id, sizeof id, "%s", p.id);
    ak_api_pool_request_free(&p);
    if (rc < 0) {
        if (err.code == AK_ERR_EXISTS)
            return ak_http_error(s, q->c, q->ep, 409, "id", "pool_exists",
                                 "%s (pools are write-once: DELETE /v1/pools/%s first)", err.msg, id);
        return ak_http_error(s, q->c, q->ep, ak_http_status_of(err.code), NULL,
                             err.code == AK_ERR_KV_BUDGET ? "kv_budget" : NULL, "%s", err.msg);
    }
    logf_(s, "pool %s: %d tokens, %s/%s", in.id, in.n_tokens, ak_kv_format_get(in.fk)->name,
          ak_kv_format_get(in.fv)->name);
    return ak_http_json(s, q->c, q->ep, 201, pool_json(&in));
}

/* GET /v1/pools: every pool. */
enum MHD_Result ak_route_pools_list(const ak_route_req *q) {
    ak_pool_info *v = NULL;
    int n = 0;
    ak_error err = {0};
    int rc = ak_sched_pools_list(q->s->cfg.sched, &v, &n, &err);
    return ak_http_items(q, rc, &err, v, n, sizeof *v, pool_json);
}

/* GET /v1/pools/{id}: one pool, or 404. */
enum MHD_Result ak_route_pool_get(const ak_route_req *q) {
    ak_pool_info in;
    ak_error err = {0};
    if (ak_sched_pool_get(q->s->cfg.sched, q->id, &in, &err) < 0) {
        if (err.code == AK_ERR_NOT_FOUND)
            return ak_http_error(q->s, q->c, q->ep, 404, "pool", "pool_not_found", "no pool '%s'", q->id);
        return ak_http_error(q->s, q->c, q->ep, 500, NULL, NULL, "%s", err.msg);
    }
    return ak_http_json(q->s, q->c, q->ep, 200, pool_json(&in));
}

/* DELETE /v1/pools/{id}: refused (409, naming them) while agents are attached. */
enum MHD_Result ak_route_pool_delete(const ak_route_req *q) {
    ak_error err = {0};
    int rc = ak_sched_pool_remove(q->s->cfg.sched, q->id, &err);
    if (rc == 1) return ak_http_error(q->s, q->c, q->ep, 404, "pool", "pool_not_found", "no pool '%s'", q->id);
    if (rc < 0 && err.code == AK_ERR_BUSY) return ak_http_error(q->s, q->c, q->ep, 409, "pool", "pool_busy", "%s", err.msg);
    if (rc < 0) return ak_http_error(q->s, q->c, q->ep, 500, NULL, NULL, "%s", err.msg);
    return ak_http_deleted(q, "pool");
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

/* memory_json of a list's item: without its text. */
static cJSON *memory_item_json(const void *item) { return memory_json(item, NULL); }

/* The answer to a memory operation that failed with err: its code's status
 * (reply.c) with OpenAI's code for it (memory_not_found, memory_exists,
 * memory_stale, memory_corrupt, kv_budget; else none) and param. */
static enum MHD_Result memory_error(const ak_route_req *q, const ak_error *err, const char *param) {
    const char *oc;
    switch (err->code) {
    case AK_ERR_NOT_FOUND: oc = "memory_not_found"; break;
    case AK_ERR_EXISTS: oc = "memory_exists"; break;
    case AK_ERR_STALE: oc = "memory_stale"; break;
    case AK_ERR_CORRUPT: oc = "memory_corrupt"; break;
    case AK_ERR_KV_BUDGET: oc = "kv_budget"; break;
    default: oc = NULL; break;
    }
    return ak_http_error(q->s, q->c, q->ep, ak_http_status_of(err->code), param, oc, "%s", err->msg);
}

/* POST /v1/memories: computes (or shares) and persists a memory. 201 when
 * it was made now, 200 when the id already held this content. */
enum MHD_Result ak_route_memory_create(const ak_route_req *q) {
    ak_server *s = q->s;
    ak_api_memory_request p;
    ak_api_error b;
    if (ak_api_parse_memory(q->cn->body, q->cn->len, &p, &b) < 0)
        return ak_http_error(s, q->c, q->ep, b.status, b.param, b.code, "%s", b.msg);
    ak_server_release_body(s, q->cn);
    ak_memory_info in, before;
    ak_error err = {0};
    int existed = ak_sched_memory_get(s->cfg.sched, p.id, &before, NULL, &err) == 0;
    int computed = 0;
    int rc = ak_sched_memory_add(s->cfg.sched, p.id, p.text, p.fk, p.fv, &in, &computed, &err);
    ak_api_memory_request_free(&p);
    if (rc < 0)
        return memory_error(q, &err, err.code == AK_ERR_EXISTS ? "id" : err.code == AK_ERR_INVALID ? "text" : NULL);
    cJSON *j = memory_json(&in, NULL);
    cJSON_AddBoolToObject(j, "computed", computed);
    return ak_http_json(s, q->c, q->ep, existed ? 200 : 201, j);
}

/* GET /v1/memories: every memory. */
enum MHD_Result ak_route_memories_list(const ak_route_req *q) {
    ak_memory_info *v = NULL;
    int n = 0;
    ak_error err = {0};
    int rc = ak_sched_memories_list(q->s->cfg.sched, &v, &n, &err);
    return ak_http_items(q, rc, &err, v, n, sizeof *v, memory_item_json);
}

/* GET /v1/memories/{id}: one memory with its text. */
enum MHD_Result ak_route_memory_get(const ak_route_req *q) {
    ak_memory_info in;
    char *text = NULL;
    ak_error err = {0};
    if (ak_sched_memory_get(q->s->cfg.sched, q->id, &in, &text, &err) < 0) return memory_error(q, &err, "memory");
    cJSON *j = memory_json(&in, text);
    free(text);
    return ak_http_json(q->s, q->c, q->ep, 200, j);
}

/* DELETE /v1/memories/{id}. */
enum MHD_Result ak_route_memory_delete(const ak_route_req *q) {
    ak_error err = {0};
    int rc = ak_sched_memory_remove(q->s->cfg.sched, q->id, &err);
    if (rc == 1) return ak_http_error(q->s, q->c, q->ep, 404, "memory", "memory_not_found", "no memory '%s'", q->id);
    if (rc < 0) return memory_error(q, &err, NULL);
    return ak_http_deleted(q, "memory");
}
