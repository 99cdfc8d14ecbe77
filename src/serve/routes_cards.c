/* routes_cards.c - CacheCards over HTTP (docs/cards.md): POST
 * /v1/agents/{id}/cards makes one of an agent's context, POST
 * /v1/agents/{id}/import puts one in an agent, /v1/cards lists, gets
 * (?download=1: the file's bytes) and deletes them. */
#include "serve/server_impl.h"

#include <stdlib.h>
#include <string.h>

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

/* card_json of a list's item: no histograms (a list reads no card). */
static cJSON *card_item_json(const void *item) { return card_json(item, NULL); }

/* The answer to a card operation that failed with err: its code's status
 * (reply.c) with OpenAI's code: card_not_found (agent_not_found when
 * agent_missing: the operation's agent is what a NOT_FOUND names),
 * card_stale, card_corrupt, agent_busy, card_exists, kv_budget; else none. */
static enum MHD_Result card_error(const ak_route_req *q, const ak_error *err, int agent_missing) {
    ak_server *s = q->s;
    int status = ak_http_status_of(err->code);
    switch (err->code) {
    case AK_ERR_NOT_FOUND:
        if (agent_missing) return ak_http_error(s, q->c, q->ep, status, "agent_id", "agent_not_found", "%s", err->msg);
        return ak_http_error(s, q->c, q->ep, status, "card", "card_not_found", "%s", err->msg);
    case AK_ERR_STALE: return ak_http_error(s, q->c, q->ep, status, "card", "card_stale", "%s", err->msg);
    case AK_ERR_CORRUPT:
        return ak_http_error(s, q->c, q->ep, status, "card", "card_corrupt", "%s (moved to quarantine)", err->msg);
    case AK_ERR_BUSY: return ak_http_error(s, q->c, q->ep, status, "agent_id", "agent_busy", "%s", err->msg);
    case AK_ERR_EXISTS: return ak_http_error(s, q->c, q->ep, status, "id", "card_exists", "%s", err->msg);
    case AK_ERR_KV_BUDGET: return ak_http_error(s, q->c, q->ep, status, NULL, "kv_budget", "%s", err->msg);
    default: return ak_http_error(s, q->c, q->ep, status, NULL, NULL, "%s", err->msg);
    }
}

/* POST /v1/agents/{id}/cards: makes a card of the agent's context; 201. */
enum MHD_Result ak_route_card_make(const ak_route_req *q) {
    ak_server *s = q->s;
    ak_api_card_request p;
    ak_api_error b;
    if (ak_api_parse_card(q->cn->body, q->cn->len, &p, &b) < 0)
        return ak_http_error(s, q->c, q->ep, b.status, b.param, b.code, "%s", b.msg);
    ak_card_request rq = {.card_id = p.id, .from = p.from, .to = p.to, .policy = p.policy, .budget_k = p.bits_k,
                          .budget_v = p.bits_v};
    ak_sched_card card;
    ak_error err = {0};
    if (ak_sched_card_make(s->cfg.sched, q->id, &rq, &card, &err) < 0) {
        if (err.code == AK_ERR_INVALID)   /* id, bits and policy were checked: the range */
            return ak_http_error(s, q->c, q->ep, 400, "range", "invalid_range", "%s", err.msg);
        return card_error(q, &err, 1);
    }
    logf_(s, "card %s: from agent %s, %d tokens, %s, %.2f/%.2f bits", card.e.id, q->id, card.e.n_tokens, card.e.policy,
          card.e.mean_k, card.e.mean_v);
    return ak_http_json(s, q->c, q->ep, 201, card_json(&card.e, &card));
}

/* POST /v1/agents/{id}/import: the agent's context becomes the card
 * (mode "replace", the default) or the card goes after it ("append"). */
enum MHD_Result ak_route_card_import(const ak_route_req *q) {
    ak_server *s = q->s;
    char card_id[AK_AGENT_ID_MAX + 1];
    ak_import_mode mode;
    ak_api_error b;
    if (ak_api_parse_import(q->cn->body, q->cn->len, card_id, &mode, &b) < 0)
        return ak_http_error(s, q->c, q->ep, b.status, b.param, b.code, "%s", b.msg);
    int n = 0;
    ak_error err = {0};
    if (ak_sched_card_import(s->cfg.sched, q->id, card_id, mode, &n, &err) < 0) {
        /* ids and mode were checked: the card (with the agent's tokens, for
         * append) does not fit the context, or the agent's segments are full */
        if (err.code == AK_ERR_INVALID)
            return ak_http_error(s, q->c, q->ep, 400, "card", "context_length_exceeded", "%s", err.msg);
        return card_error(q, &err, 0);
    }
    const char *mname = mode == AK_IMPORT_APPEND ? "append" : "replace";
    logf_(s, "agent %s: imported card %s (%s, %d tokens)", q->id, card_id, mname, n);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", q->id);
    cJSON_AddStringToObject(j, "object", "agent.import");
    cJSON_AddStringToObject(j, "card", card_id);
    cJSON_AddStringToObject(j, "mode", mname);
    cJSON_AddNumberToObject(j, "tokens", n);
    return ak_http_json(s, q->c, q->ep, 200, j);
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
enum MHD_Result ak_route_card_get(const ak_route_req *q) {
    ak_server *s = q->s;
    ak_sched_card card;
    ak_error err = {0};
    if (ak_sched_card_get(s->cfg.sched, q->id, &card, &err) < 0) return card_error(q, &err, 0);
    if (!wants_download(q->c)) return ak_http_json(s, q->c, q->ep, 200, card_json(&card.e, &card));
    char *bytes = NULL;
    size_t len = 0;
    if (ak_sched_card_file(s->cfg.sched, q->id, &bytes, &len, &err) < 0) return card_error(q, &err, 0);
    struct MHD_Response *r = MHD_create_response_from_buffer(len, bytes, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(bytes);
        return MHD_NO;
    }
    char disp[AK_AGENT_ID_MAX + 64];
    snprintf(disp, sizeof disp, "attachment; filename=\"%s.safetensors\"", q->id);
    MHD_add_response_header(r, "Content-Type", "application/octet-stream");
    MHD_add_response_header(r, "Content-Disposition", disp);
    ak_http_add_cors(s, q->c, r);
    enum MHD_Result rc = MHD_queue_response(q->c, 200, r);
    MHD_destroy_response(r);
    ak_metrics_request(s->cfg.metrics, q->ep, 200);
    return rc;
}

/* GET /v1/cards: every card. */
enum MHD_Result ak_route_cards_list(const ak_route_req *q) {
    ak_store_card_entry *v = NULL;
    int n = 0;
    ak_error err = {0};
    int rc = ak_sched_cards_list(q->s->cfg.sched, &v, &n, &err);
    return ak_http_items(q, rc, &err, v, n, sizeof *v, card_item_json);
}

/* DELETE /v1/cards/{id}: refused (409, naming them) while agents hold it. */
enum MHD_Result ak_route_card_delete(const ak_route_req *q) {
    ak_error err = {0};
    int rc = ak_sched_card_remove(q->s->cfg.sched, q->id, &err);
    if (rc == 1) return ak_http_error(q->s, q->c, q->ep, 404, "card", "card_not_found", "no card '%s'", q->id);
    if (rc < 0 && err.code == AK_ERR_BUSY) return ak_http_error(q->s, q->c, q->ep, 409, "card", "card_busy", "%s", err.msg);
    if (rc < 0) return ak_http_error(q->s, q->c, q->ep, ak_http_status_of(err.code), NULL, NULL, "%s", err.msg);
    return ak_http_deleted(q, "card");
}
