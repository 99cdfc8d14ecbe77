/* routes_responses.c - OpenAI's Responses API on agent memory:
 * POST /v1/responses (whole or streamed), GET and DELETE
 * /v1/responses/{id}, GET /v1/responses/{id}/input_items; POST
 * /v1/conversations, GET and DELETE /v1/conversations/{id}, GET and POST
 * /v1/conversations/{id}/items.
 *
 * A stored response is a point in an agent's history: the record (rstore.h)
 * keeps its items as text (what GET and a continuation need) and names the
 * agent whose KV holds them. A continuation (previous_response_id, a
 * conversation, or a resent conversation whose items begin with a stored
 * response's: responses.h, THE CHAIN HASH) is rendered as the whole
 * conversation and served by that agent, so only what its history lacks is
 * prefilled (after a restart too: the agent's KV is on disk); when the KV is
 * gone the text is prefilled again, never an error. A record holds only the
 * items its own request added: the history is the chain of records.
 *
 * The record's body: {"response": the response object as answered,
 * "input": the items this request added (a string input as one user
 * message item), "previous": the id it continues ("" none), "chain": the
 * chain hash of every item through its output, 16 hex digits}. A
 * conversation's: {"conversation": {id, object, created_at, metadata},
 * "items": [...], "chain": ...}.
 */
#include "serve/run.h"
#include "serve/responses.h"
#include "store/rstore.h"
#include "base/buf.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_CHAIN 10000   /* records a history may chain through */
#define RID (AK_RSTORE_ID_MAX + 1)   /* a record id and its NUL */

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static int given(const cJSON *v) { return v && !cJSON_IsNull(v); }

/* A stored record's parsed body and meta. */
typedef struct {
    cJSON *doc;
    ak_rstore_meta meta;
} record;

/* Reads record id into *r. Returns its status (OK: r->doc set). */
static ak_rstore_status read_record(ak_server *s, const char *id, record *r) {
    char *body = NULL;
    size_t len = 0;
    ak_error err = {0};
    memset(r, 0, sizeof *r);
    ak_rstore_status st = ak_rstore_get(s->cfg.rstore, id, &body, &len, &r->meta, &err);
    if (st != AK_RSTORE_OK) {
        if (st == AK_RSTORE_CORRUPT || st == AK_RSTORE_ERROR) logf_(s, "responses: %s", err.msg);
        return st;
    }
    r->doc = cJSON_ParseWithLength(body, len);
    free(body);
    if (!r->doc) {
        logf_(s, "responses: record %s is not JSON", id);
        return AK_RSTORE_CORRUPT;
    }
    return AK_RSTORE_OK;
}

static uint64_t doc_chain(const cJSON *doc) {
    const cJSON *c = get(doc, "chain");
    return cJSON_IsString(c) ? strtoull(c->valuestring, NULL, 16) : 0;
}

/* Appends a copy of each element of src to dst. Returns 0 or -1. */
static int append_all(cJSON *dst, const cJSON *src) {
    const cJSON *it;
    cJSON_ArrayForEach(it, src) {
        cJSON *c = cJSON_Duplicate(it, 1);
        if (!c || !cJSON_AddItemToArray(dst, c)) {
            cJSON_Delete(c);
            return -1;
        }
    }
    return 0;
}

/* The items of response id and its ancestors, oldest first, into *items
 * (a new array); *top gets the record of id (the caller frees its doc).
 * Returns OK, ABSENT (a record of the chain is gone: *missing names it),
 * CORRUPT or ERROR. */
static ak_rstore_status chain_items(ak_server *s, const char *id, cJSON **items, record *top, char *missing) {
    record *chain = NULL;
    int n = 0, cap = 0;
    ak_rstore_status st = AK_RSTORE_OK;
    char cur[RID];
    snprintf(cur, sizeof cur, "%s", id);
    while (st == AK_RSTORE_OK && cur[0] && n < MAX_CHAIN) {
        if (n == cap) {   /* grown as the chain is walked: most chains are short */
            record *g = realloc(chain, sizeof *chain * (size_t)(cap = cap ? 2 * cap : 16));
            if (!g) {
                st = AK_RSTORE_ERROR;
                break;
            }
            chain = g;
        }
        st = read_record(s, cur, &chain[n]);
        if (st != AK_RSTORE_OK) {
            snprintf(missing, RID, "%s", cur);
            break;
        }
        const cJSON *prev = get(chain[n].doc, "previous");
        snprintf(cur, sizeof cur, "%s", cJSON_IsString(prev) ? prev->valuestring : "");
        n++;
    }
    *items = st == AK_RSTORE_OK ? cJSON_CreateArray() : NULL;
    for (int i = n - 1; *items && i >= 0; i--)
        if (append_all(*items, get(chain[i].doc, "input")) < 0 ||
            append_all(*items, get(get(chain[i].doc, "response"), "output")) < 0) {
            cJSON_Delete(*items);
            *items = NULL;
            st = AK_RSTORE_ERROR;
        }
    if (st == AK_RSTORE_OK && n) {
        *top = chain[0];
        chain[0].doc = NULL;
    }
    for (int i = 0; i < n; i++) cJSON_Delete(chain[i].doc);
    free(chain);
    return st;
}

/* The slot of agent's latest response in s->resp_heads. */
static size_t head_slot(const ak_server *s, const char *agent) {
    uint64_t h = 1469598103934665603ull;
    for (; *agent; agent++) h = (h ^ (uint8_t)*agent) * 1099511628211ull;
    return (size_t)(h % (sizeof s->resp_heads / sizeof s->resp_heads[0]));
}

/* 1 when agent's history has gone on past response id (another response of
 * its chain was stored since): a continuation of id is then a branch. 0
 * when id is its latest, or not known (a restart, a slot taken over). */
static int agent_moved_on(ak_server *s, const char *agent, const char *id) {
    pthread_mutex_lock(&s->mu);
    size_t i = head_slot(s, agent);
    int moved = !strcmp(s->resp_heads[i].agent, agent) && strcmp(s->resp_heads[i].head, id);
    pthread_mutex_unlock(&s->mu);
    return moved;
}

/* Response id is agent's latest now. */
static void set_head(ak_server *s, const char *agent, const char *id) {
    if (!agent[0]) return;
    pthread_mutex_lock(&s->mu);
    size_t i = head_slot(s, agent);
    snprintf(s->resp_heads[i].agent, sizeof s->resp_heads[i].agent, "%s", agent);
    snprintf(s->resp_heads[i].head, sizeof s->resp_heads[i].head, "%s", id);
    pthread_mutex_unlock(&s->mu);
}

/* What a request continues and who serves it. */
typedef struct {
    cJSON *history;           /* items before the input (NULL: none) */
    char previous[RID];        /* the record it continues ("" none) */
    uint64_t base;            /* that record's chain hash */
    int skip;                 /* input items the matched record already holds (resent conversation) */
    char agent[AK_AGENT_ID_MAX + 1];   /* the agent whose KV holds the history ("" none) */
    char conversation[RID];    /* the conversation it belongs to ("" none) */
    cJSON *conv_doc;          /* that conversation's record */
} continuation;

static void continuation_free(continuation *c) {
    cJSON_Delete(c->history);
    cJSON_Delete(c->conv_doc);
}

/* A resent conversation: the longest prefix of input whose chain hash a
 * stored response has. Sets c (previous, base, skip, agent) when found. */
static void match_resent(ak_server *s, const cJSON *input, continuation *c) {
    int n = cJSON_GetArraySize(input);
    uint64_t *h = n > 0 ? malloc(sizeof *h * (size_t)n) : NULL;
    if (!h) return;
    uint64_t acc = 0;
    const cJSON *it = input->child;
    for (int i = 0; i < n; i++, it = it->next) h[i] = acc = ak_resp_item_hash(acc, it);
    for (int k = n; k >= 1; k--) {
        char id[RID];
        if (!h[k - 1]) continue;
        if (ak_rstore_find_chain(s->cfg.rstore, h[k - 1], id) < 0) continue;
        record r;
        if (read_record(s, id, &r) != AK_RSTORE_OK) continue;
        snprintf(c->previous, sizeof c->previous, "%s", id);
        c->base = h[k - 1];
        c->skip = k;
        snprintf(c->agent, sizeof c->agent, "%s", r.meta.agent);
        cJSON_Delete(r.doc);
        break;
    }
    free(h);
}

/* Reads previous_response_id / conversation of req into c. Returns 0, or
 * -1 with the error answered (*reply). */
static int find_continuation(const ak_route_req *q, const cJSON *req, continuation *c, enum MHD_Result *reply) {
    ak_server *s = q->s;
    memset(c, 0, sizeof *c);
    const cJSON *prev = get(req, "previous_response_id"), *conv = get(req, "conversation");
    if (given(conv) && cJSON_IsObject(conv)) conv = get(conv, "id");
    if (given(prev) && !cJSON_IsString(prev)) {
        *reply = ak_http_error(s, q->c, q->ep, 400, "previous_response_id", "invalid_type", "previous_response_id must be a string");
        return -1;
    }
    if (given(conv) && !cJSON_IsString(conv)) {
        *reply = ak_http_error(s, q->c, q->ep, 400, "conversation", "invalid_type",
                               "conversation must be a string or {\"id\": string}");
        return -1;
    }
    if (given(prev) && given(conv)) {
        *reply = ak_http_error(s, q->c, q->ep, 400, "conversation", "invalid_value",
                               "previous_response_id and conversation cannot both be given");
        return -1;
    }
    if ((given(prev) || given(conv)) && !s->cfg.rstore) {
        *reply = ak_http_error(s, q->c, q->ep, 400, given(prev) ? "previous_response_id" : "conversation",
                               "unsupported_parameter", "this server stores no responses (serve with --memory-dir)");
        return -1;
    }
    if (given(prev)) {
        record top = {0};
        char missing[RID] = "";
        ak_rstore_status st = chain_items(s, prev->valuestring, &c->history, &top, missing);
        if (st != AK_RSTORE_OK) {
            *reply = st == AK_RSTORE_ERROR
                         ? ak_http_error(s, q->c, q->ep, 500, NULL, NULL, "the stored responses could not be read")
                         : ak_http_error(s, q->c, q->ep, 400, "previous_response_id", "previous_response_not_found",
                                         "Previous response with id '%.80s' not found.", missing);
            return -1;
        }
        snprintf(c->previous, sizeof c->previous, "%s", prev->valuestring);
        c->base = doc_chain(top.doc);
        /* a branch: an agent of its own, whose prefill links the blocks the
         * chain's agent holds of the common history (content-addressed) */
        if (!agent_moved_on(s, top.meta.agent, prev->valuestring))
            snprintf(c->agent, sizeof c->agent, "%s", top.meta.agent);
        cJSON_Delete(top.doc);
        return 0;
    }
    if (given(conv)) {
        record r;
        if (read_record(s, conv->valuestring, &r) != AK_RSTORE_OK || r.meta.kind != 'c') {
            cJSON_Delete(r.doc);
            *reply = ak_http_error(s, q->c, q->ep, 404, "conversation", "conversation_not_found",
                                   "Conversation with id '%.80s' not found.", conv->valuestring);
            return -1;
        }
        c->conv_doc = r.doc;
        c->history = cJSON_Duplicate(get(r.doc, "items"), 1);
        c->base = doc_chain(r.doc);
        snprintf(c->conversation, sizeof c->conversation, "%s", conv->valuestring);
        snprintf(c->agent, sizeof c->agent, "%s", r.meta.agent);
        return 0;
    }
    if (s->cfg.rstore && cJSON_IsArray(get(req, "input"))) match_resent(s, get(req, "input"), c);
    return 0;
}

/* usage as the Responses API writes it; reasoning_tokens: the reasoning's
 * text tokenized (the tokens the model spent on it, as near as the text
 * tells). */
static cJSON *usage_json(ak_server *s, const ak_req_result *res, const ak_toolcall *tc) {
    size_t nr = 0;
    const char *reasoning = ak_toolcall_reasoning(tc, &nr);
    int32_t *ids = NULL;
    size_t nids = 0;
    ak_error err = {0};
    if (nr && ak_tokenize(s->cfg.tok, reasoning, nr, 0, &ids, &nids, &err) < 0) nids = 0;
    free(ids);
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", res->prompt_tokens);
    cJSON *in = cJSON_AddObjectToObject(u, "input_tokens_details");
    cJSON_AddNumberToObject(in, "cached_tokens", res->turn.reused);
    cJSON_AddNumberToObject(in, "handoff_reused_tokens", res->handoff_reused);   /* as chat's usage */
    cJSON_AddNumberToObject(in, "handoff_recomputed_tokens", res->handoff_recomputed);
    cJSON_AddNumberToObject(u, "output_tokens", res->completion_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens",
                            nids < (size_t)res->completion_tokens ? (double)nids : res->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", res->prompt_tokens + res->completion_tokens);
    return u;
}

/* req's value of k, or null. */
static cJSON *echo(const cJSON *req, const char *k) {
    return given(get(req, k)) ? cJSON_Duplicate(get(req, k), 1) : cJSON_CreateNull();
}

/* The response object (without output: the caller adds it) of req. */
static cJSON *response_json(ak_server *s, const cJSON *req, const ak_run *run, const continuation *c) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", run->id);
    cJSON_AddStringToObject(r, "object", "response");
    cJSON_AddNumberToObject(r, "created_at", (double)run->created);
    cJSON_AddStringToObject(r, "status", "in_progress");
    cJSON_AddNullToObject(r, "error");
    cJSON_AddNullToObject(r, "incomplete_details");
    cJSON_AddItemToObject(r, "instructions", echo(req, "instructions"));
    cJSON_AddItemToObject(r, "max_output_tokens", echo(req, "max_output_tokens"));
    cJSON_AddStringToObject(r, "model", s->cfg.model_id);
    cJSON_AddArrayToObject(r, "output");
    const cJSON *par = get(req, "parallel_tool_calls");
    cJSON_AddBoolToObject(r, "parallel_tool_calls", !cJSON_IsFalse(par));
    cJSON_AddItemToObject(r, "previous_response_id", echo(req, "previous_response_id"));
    cJSON *reasoning = cJSON_AddObjectToObject(r, "reasoning");
    cJSON_AddItemToObject(reasoning, "effort", echo(get(req, "reasoning"), "effort"));
    cJSON_AddNullToObject(reasoning, "summary");
    const cJSON *store = get(req, "store");
    cJSON_AddBoolToObject(r, "store", !cJSON_IsFalse(store) && s->cfg.rstore);
    const cJSON *t = get(req, "temperature"), *tp = get(req, "top_p");
    cJSON_AddNumberToObject(r, "temperature", cJSON_IsNumber(t) ? t->valuedouble : 1.0);
    cJSON_AddNumberToObject(r, "top_p", cJSON_IsNumber(tp) ? tp->valuedouble : 1.0);
    const cJSON *text = get(req, "text");
    if (cJSON_IsObject(text) && given(get(text, "format"))) {
        cJSON_AddItemToObject(r, "text", cJSON_Duplicate(text, 1));
    } else {
        cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(r, "text"), "format"), "type", "text");
    }
    const cJSON *tc = get(req, "tool_choice");
    if (given(tc)) cJSON_AddItemToObject(r, "tool_choice", cJSON_Duplicate(tc, 1));
    else cJSON_AddStringToObject(r, "tool_choice", "auto");
    const cJSON *tools = get(req, "tools");
    cJSON_AddItemToObject(r, "tools", cJSON_IsArray(tools) ? cJSON_Duplicate(tools, 1) : cJSON_CreateArray());
    const cJSON *tr = get(req, "truncation");
    cJSON_AddStringToObject(r, "truncation", cJSON_IsString(tr) ? tr->valuestring : "disabled");
    const cJSON *md = get(req, "metadata");
    cJSON_AddItemToObject(r, "metadata", cJSON_IsObject(md) ? cJSON_Duplicate(md, 1) : cJSON_CreateObject());
    if (c->conversation[0]) cJSON_AddStringToObject(cJSON_AddObjectToObject(r, "conversation"), "id", c->conversation);
    else cJSON_AddNullToObject(r, "conversation");
    cJSON_AddItemToObject(r, "user", echo(req, "user"));
    return r;
}

/* Sets r's status (and incomplete_details), output (consumed), usage and
 * agentkv object for a finished request. */
static void finish_response(cJSON *r, cJSON *output, cJSON *usage, cJSON *agentkv, int incomplete) {
    cJSON_ReplaceItemInObjectCaseSensitive(r, "status", cJSON_CreateString(incomplete ? "incomplete" : "completed"));
    if (incomplete) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
        cJSON_ReplaceItemInObjectCaseSensitive(r, "incomplete_details", d);
    }
    cJSON_ReplaceItemInObjectCaseSensitive(r, "output", output ? output : cJSON_CreateArray());
    cJSON_AddItemToObject(r, "usage", usage);
    cJSON_AddItemToObject(r, "agentkv", agentkv);
}

/* A copy of items with an id given to each item that has none. */
static cJSON *with_ids(ak_server *s, const cJSON *items) {
    cJSON *a = cJSON_Duplicate(items, 1);
    cJSON *it;
    cJSON_ArrayForEach(it, a) {
        if (!cJSON_IsObject(it) || get(it, "id")) continue;
        char id[64];
        ak_run_make_id(s, "item", id, sizeof id);
        cJSON_AddStringToObject(it, "id", id);
    }
    return a;
}

/* Stores response r (req's, continuing c) unless req says store: false;
 * appends its items to c's conversation. Failures are logged: the answer
 * stands, the next continuation finds nothing (400 or a re-prefill). */
static void store_response(ak_server *s, const cJSON *req, const continuation *c, const cJSON *r, const char *agent) {
    if (!s->cfg.rstore || cJSON_IsFalse(get(req, "store"))) return;
    cJSON *all = ak_resp_input_items(req), *input = cJSON_CreateArray();
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, all) if (i++ >= c->skip) cJSON_AddItemToArray(input, cJSON_Duplicate(it, 1));
    cJSON *in_ids = with_ids(s, input);
    const cJSON *output = get(r, "output");
    uint64_t h = ak_resp_chain_hash(ak_resp_chain_hash(c->base, in_ids, cJSON_GetArraySize(in_ids)), output,
                                    cJSON_GetArraySize(output));
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, h);
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddItemToObject(doc, "response", cJSON_Duplicate(r, 1));
    cJSON_AddItemToObject(doc, "input", cJSON_Duplicate(in_ids, 1));
    cJSON_AddStringToObject(doc, "previous", c->conversation[0] ? "" : c->previous);
    cJSON_AddStringToObject(doc, "chain", hex);
    char *body = cJSON_PrintUnformatted(doc);
    ak_rstore_meta m = {.kind = 'r', .chain_hash = c->conversation[0] ? 0 : h};
    snprintf(m.agent, sizeof m.agent, "%s", agent);
    snprintf(m.conversation, sizeof m.conversation, "%s", c->conversation);
    ak_error err = {0};
    const char *id = cJSON_GetObjectItemCaseSensitive(r, "id")->valuestring;
    if (!body || ak_rstore_put(s->cfg.rstore, id, body, strlen(body), &m, &err) < 0)
        logf_(s, "responses: %s not stored: %s", id, body ? err.msg : "out of memory");
    else
        set_head(s, agent, id);
    free(body);
    if (c->conversation[0] && c->conv_doc) {   /* the conversation goes on with this response's items */
        cJSON *conv = cJSON_Duplicate(c->conv_doc, 1);
        cJSON *items = cJSON_GetObjectItemCaseSensitive(conv, "items");
        if (items) {
            append_all(items, in_ids);
            append_all(items, output);
            cJSON_ReplaceItemInObjectCaseSensitive(conv, "chain", cJSON_CreateString(hex));
        }
        char *cb = cJSON_PrintUnformatted(conv);
        ak_rstore_meta cm = {.kind = 'c'};
        snprintf(cm.agent, sizeof cm.agent, "%s", agent);
        if (!cb || ak_rstore_put(s->cfg.rstore, c->conversation, cb, strlen(cb), &cm, &err) < 0)
            logf_(s, "responses: conversation %s not updated: %s", c->conversation, cb ? err.msg : "out of memory");
        free(cb);
        cJSON_Delete(conv);
    }
    cJSON_Delete(doc);
    cJSON_Delete(in_ids);
    cJSON_Delete(input);
    cJSON_Delete(all);
}

/* ---- the stream ---------------------------------------------------------- */

typedef struct {
    ak_server *s;
    ak_run run;
    cJSON *req;
    continuation c;
    cJSON *resp;              /* the response object so far */
    ak_toolcall *tc;
    ak_resp_stream *rs;
    cJSON *events;            /* events not yet written out */
    ak_buf out;
    size_t out_pos, have;
    int begun, ended;
} rstream;

static void rstream_free(void *cls) {
    rstream *st = cls;
    if (st->run.r) ak_request_cancel(st->run.r);   /* a no-op when it finished */
    ak_run_free(&st->run);
    cJSON_Delete(st->req);
    continuation_free(&st->c);
    cJSON_Delete(st->resp);
    ak_toolcall_free(st->tc);
    ak_resp_stream_free(st->rs);
    cJSON_Delete(st->events);
    ak_buf_free(&st->out);
    free(st);
}

/* The events waiting, written out as SSE ("event: T" and "data: JSON").
 * Returns 0 or -1 (memory). */
static int flush_events(rstream *st) {
    cJSON *e;
    while ((e = cJSON_DetachItemFromArray(st->events, 0))) {
        char *j = cJSON_PrintUnformatted(e);
        const cJSON *type = get(e, "type");
        int rc = !j || ak_buf_puts(&st->out, "event: ") || ak_buf_puts(&st->out, cJSON_IsString(type) ? type->valuestring : "")
                 || ak_buf_puts(&st->out, "\ndata: ") || ak_buf_puts(&st->out, j) || ak_buf_puts(&st->out, "\n\n");
        free(j);
        cJSON_Delete(e);
        if (rc) return -1;
    }
    return 0;
}

/* The request ended: the last events (completed, incomplete, or failed),
 * the response stored. Returns 0 or -1. */
static int stream_end(rstream *st) {
    ak_req_result res;
    ak_request_read(st->run.r, 0, NULL, NULL, &res);
    if (res.finish == AK_FINISH_ERROR) {
        cJSON *e = cJSON_CreateObject(), *r = cJSON_Duplicate(st->resp, 1);
        cJSON_AddStringToObject(e, "type", "response.failed");
        cJSON_AddNumberToObject(e, "sequence_number", 1e6);   /* after every other event of the stream */
        cJSON_ReplaceItemInObjectCaseSensitive(r, "status", cJSON_CreateString("failed"));
        cJSON *err = cJSON_CreateObject();
        cJSON_AddStringToObject(err, "code", "server_error");
        cJSON_AddStringToObject(err, "message", res.error);
        cJSON_ReplaceItemInObjectCaseSensitive(r, "error", err);
        cJSON_AddItemToObject(e, "response", r);
        cJSON_AddItemToArray(st->events, e);
        return 0;
    }
    const ak_toolcall_event *ev = NULL;
    ak_error err = {0};
    int n = ak_toolcall_finish(st->tc, &ev, &err);
    if (n < 0 || ak_resp_stream_feed(st->rs, ev, n) < 0) return -1;
    int incomplete = res.finish == AK_FINISH_LENGTH;
    finish_response(st->resp, cJSON_Duplicate(ak_resp_stream_items(st->rs), 1), usage_json(st->s, &res, st->tc),
                    ak_run_agentkv_json(&st->run.p, &res), incomplete);
    if (ak_resp_stream_end(st->rs, st->resp, incomplete) < 0) return -1;
    /* the last item is closed only by the stream's end: stored before it, the
     * record's output would be unfinished (no text), its chain hash not the
     * one a resent conversation has */
    cJSON *items = cJSON_Duplicate(ak_resp_stream_items(st->rs), 1);
    if (!items) return -1;
    cJSON_ReplaceItemInObjectCaseSensitive(st->resp, "output", items);
    store_response(st->s, st->req, &st->c, st->resp, st->run.p.agent_id);
    return 0;
}

/* libmicrohttpd's content reader of a Responses stream. */
static ssize_t rstream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    rstream *st = cls;
    while (st->out_pos == st->out.len) {
        st->out_pos = 0;
        ak_buf_clear(&st->out);
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!st->begun) {
            st->begun = 1;
            if (ak_resp_stream_begin(st->rs, st->resp) < 0 || flush_events(st) < 0)
                return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        int done = ak_run_wait(&st->run, st->have);
        if (done < 0) return MHD_CONTENT_READER_END_WITH_ERROR;   /* the client left */
        char *chunk = NULL;
        size_t n = 0;
        ak_req_result res;
        st->have = ak_request_read(st->run.r, st->have, &chunk, &n, &res);
        if (n) {
            const ak_toolcall_event *ev = NULL;
            ak_error err = {0};
            int k = ak_toolcall_feed(st->tc, chunk, n, &ev, &err);
            free(chunk);
            if (k < 0 || ak_resp_stream_feed(st->rs, ev, k) < 0 || flush_events(st) < 0)
                return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        free(chunk);
        if (!done) continue;
        if (stream_end(st) < 0 || flush_events(st) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        st->ended = 1;
    }
    size_t n = st->out.len - st->out_pos;
    if (n > max) n = max;
    memcpy(buf, st->out.p + st->out_pos, n);
    st->out_pos += n;
    return (ssize_t)n;
}

/* ---- POST /v1/responses -------------------------------------------------- */

/* The seed of a response's item ids: FNV-1a of its id (unique per server). */
static uint64_t id_seed(const char *id) {
    uint64_t h = 1469598103934665603ull;
    for (; *id; id++) h = (h ^ (uint8_t)*id) * 1099511628211ull;
    return h;
}

/* The whole answer of a run that finished. */
static enum MHD_Result answer_whole(const ak_route_req *q, ak_run *run, const cJSON *req, continuation *c, cJSON *resp) {
    ak_server *s = q->s;
    if (ak_run_wait(run, (size_t)-1) < 0) {
        cJSON_Delete(resp);
        return ak_run_client_left(q, run);
    }
    char *text = NULL;
    size_t n = 0;
    ak_req_result res;
    ak_request_read(run->r, 0, &text, &n, &res);
    ak_error err = {0};
    ak_toolcall *tc = res.finish == AK_FINISH_ERROR ? NULL : ak_run_reply_parser(s, &run->p, run->id, 0, &err);
    const ak_toolcall_event *ev = NULL;
    int ok = tc && ak_toolcall_feed(tc, text ? text : "", n, &ev, &err) >= 0 && ak_toolcall_finish(tc, &ev, &err) >= 0;
    free(text);
    if (!ok) {
        ak_toolcall_free(tc);
        cJSON_Delete(resp);
        ak_run_free(run);
        return res.finish == AK_FINISH_ERROR
                   ? ak_http_error(s, q->c, q->ep, ak_run_failed_status(&res), NULL, NULL, "%s", res.error)
                   : ak_http_error(s, q->c, q->ep, 500, NULL, NULL, "out of memory");
    }
    int incomplete = res.finish == AK_FINISH_LENGTH;
    ak_resp_ids ids = {.id_seed = id_seed(run->id)};
    finish_response(resp, ak_resp_output_items(tc, &ids, incomplete), usage_json(s, &res, tc),
                    ak_run_agentkv_json(&run->p, &res), incomplete);
    ak_toolcall_free(tc);
    store_response(s, req, c, resp, run->p.agent_id);
    ak_run_free(run);
    return ak_http_json(s, q->c, q->ep, 200, resp);
}

/* Starts the stream of a run (its state takes run, req, c and resp). */
static enum MHD_Result answer_stream(const ak_route_req *q, ak_run *run, cJSON *req, continuation *c, cJSON *resp) {
    ak_server *s = q->s;
    rstream *st = calloc(1, sizeof *st);
    ak_error err = {0};
    if (st) {
        *st = (rstream){.s = s, .run = *run, .req = req, .c = *c, .resp = resp, .events = cJSON_CreateArray()};
        ak_resp_ids ids = {.id_seed = id_seed(run->id)};
        st->tc = ak_run_reply_parser(s, &run->p, run->id, 0, &err);
        st->rs = st->events ? ak_resp_stream_new(&ids, st->events) : NULL;
    } else {
        ak_run_free(run);
        cJSON_Delete(req);
        continuation_free(c);
        cJSON_Delete(resp);
    }
    struct MHD_Response *r = st && st->tc && st->rs
                                 ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, rstream_read, st, rstream_free)
                                 : NULL;
    if (!r) {
        if (st) rstream_free(st);
        return ak_http_error(s, q->c, q->ep, 500, NULL, NULL, "out of memory");
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    ak_http_add_cors(s, q->c, r);
    enum MHD_Result rc = MHD_queue_response(q->c, 200, r);
    MHD_destroy_response(r);
    ak_metrics_request(s->cfg.metrics, q->ep, 200);
    return rc;
}

/* The chat body's agent: the header's, prompt_cache_key's (the chat parser
 * reads both), else the continued history's, else (stored) the new
 * response's own. Sets chat's agent_id when it is ours to name. */
static void name_agent(const ak_route_req *q, cJSON *chat, const continuation *c, const cJSON *req, const char *id) {
    if (MHD_lookup_connection_value(q->c, MHD_HEADER_KIND, "X-Agent-Id") || given(get(req, "prompt_cache_key"))) return;
    const char *agent = c->agent[0] ? c->agent : NULL;
    if (!agent && c->conversation[0]) agent = c->conversation;
    if (!agent && q->s->cfg.rstore && !cJSON_IsFalse(get(req, "store"))) agent = id;
    if (agent) cJSON_AddStringToObject(chat, "agent_id", agent);
}

enum MHD_Result ak_route_responses_create(const ak_route_req *q) {
    ak_server *s = q->s;
    cJSON *req = cJSON_ParseWithLength(q->cn->body ? q->cn->body : "", q->cn->len);
    if (!cJSON_IsObject(req)) {
        cJSON_Delete(req);
        return ak_http_error(s, q->c, q->ep, 400, NULL, "invalid_json", "the request body must be a JSON object");
    }
    continuation c;
    enum MHD_Result reply;
    if (find_continuation(q, req, &c, &reply) < 0) {
        cJSON_Delete(req);
        return reply;
    }
    /* a resent conversation: the history is in the input itself */
    cJSON *chat = NULL;
    ak_api_error b = {0};
    if (ak_resp_chat_body(req, c.history, &chat, &b) < 0) {
        cJSON_Delete(req);
        continuation_free(&c);
        return ak_http_error(s, q->c, q->ep, b.status, b.param, b.code, "%s", b.msg);
    }
    char id[64];
    ak_run_make_id(s, "resp", id, sizeof id);
    name_agent(q, chat, &c, req, id);
    char *text = cJSON_PrintUnformatted(chat);
    cJSON_Delete(chat);
    if (!text) {
        cJSON_Delete(req);
        continuation_free(&c);
        return ak_http_error(s, q->c, q->ep, 500, NULL, NULL, "out of memory");
    }
    ak_run run;
    int started = ak_run_start(q, &(ak_run_args){.body = text, .len = strlen(text), .chat = 1, .id = id,
                                                 .agent_header = MHD_lookup_connection_value(q->c, MHD_HEADER_KIND,
                                                                                             "X-Agent-Id")},
                               &run, &reply);
    free(text);
    if (!started) {
        cJSON_Delete(req);
        continuation_free(&c);
        return reply;
    }
    cJSON *resp = response_json(s, req, &run, &c);
    if (run.p.stream) return answer_stream(q, &run, req, &c, resp);
    enum MHD_Result rc = answer_whole(q, &run, req, &c, resp);
    cJSON_Delete(req);
    continuation_free(&c);
    return rc;
}

/* ---- stored responses ---------------------------------------------------- */

/* Reads the record of the path's id (kind k) or answers 404 (*reply). */
static int path_record(const ak_route_req *q, char kind, record *r, enum MHD_Result *reply) {
    const char *what = kind == 'c' ? "Conversation" : "Response";
    if (!q->s->cfg.rstore || read_record(q->s, q->id, r) != AK_RSTORE_OK || r->meta.kind != kind) {
        if (q->s->cfg.rstore) cJSON_Delete(r->doc);
        *reply = ak_http_error(q->s, q->c, q->ep, 404, NULL, "not_found", "%s with id '%.80s' not found.", what, q->id);
        return -1;
    }
    return 0;
}

enum MHD_Result ak_route_response_get(const ak_route_req *q) {
    record r;
    enum MHD_Result reply;
    if (path_record(q, 'r', &r, &reply) < 0) return reply;
    cJSON *resp = cJSON_DetachItemFromObjectCaseSensitive(r.doc, "response");
    cJSON_Delete(r.doc);
    return ak_http_json(q->s, q->c, q->ep, 200, resp);
}

/* DELETE of a stored response or conversation (kind k). */
static enum MHD_Result delete_record(const ak_route_req *q, char kind) {
    record r;
    enum MHD_Result reply;
    if (path_record(q, kind, &r, &reply) < 0) return reply;
    cJSON_Delete(r.doc);
    ak_error err = {0};
    if (ak_rstore_delete(q->s->cfg.rstore, q->id, &err) == AK_RSTORE_ERROR)
        return ak_http_error(q->s, q->c, q->ep, 500, NULL, NULL, "%s", err.msg);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", q->id);
    cJSON_AddStringToObject(j, "object", kind == 'c' ? "conversation.deleted" : "response.deleted");
    cJSON_AddBoolToObject(j, "deleted", 1);
    return ak_http_json(q->s, q->c, q->ep, 200, j);
}

enum MHD_Result ak_route_response_delete(const ak_route_req *q) { return delete_record(q, 'r'); }

/* {"object": "list", "data": items (consumed), first_id, last_id, has_more}. */
static enum MHD_Result item_list(const ak_route_req *q, cJSON *items) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    int n = cJSON_GetArraySize(items);
    const cJSON *first = n ? get(cJSON_GetArrayItem(items, 0), "id") : NULL;
    const cJSON *last = n ? get(cJSON_GetArrayItem(items, n - 1), "id") : NULL;
    cJSON_AddItemToObject(j, "data", items);
    if (cJSON_IsString(first)) cJSON_AddStringToObject(j, "first_id", first->valuestring);
    else cJSON_AddNullToObject(j, "first_id");
    if (cJSON_IsString(last)) cJSON_AddStringToObject(j, "last_id", last->valuestring);
    else cJSON_AddNullToObject(j, "last_id");
    cJSON_AddBoolToObject(j, "has_more", 0);
    return ak_http_json(q->s, q->c, q->ep, 200, j);
}

enum MHD_Result ak_route_response_input_items(const ak_route_req *q) {
    record r;
    enum MHD_Result reply;
    if (path_record(q, 'r', &r, &reply) < 0) return reply;
    cJSON *items = cJSON_DetachItemFromObjectCaseSensitive(r.doc, "input");
    cJSON_Delete(r.doc);
    return item_list(q, items ? items : cJSON_CreateArray());
}

/* ---- conversations ------------------------------------------------------- */

/* The conversation object of a record's doc (a copy). */
static cJSON *conversation_json(const cJSON *doc) { return cJSON_Duplicate(get(doc, "conversation"), 1); }

/* Writes conversation doc (id, agent) back. Returns 0, or -1 with err. */
static int put_conversation(ak_server *s, const char *id, const cJSON *doc, const char *agent, ak_error *err) {
    char *body = cJSON_PrintUnformatted(doc);
    ak_rstore_meta m = {.kind = 'c'};
    snprintf(m.agent, sizeof m.agent, "%s", agent);
    int rc = body ? ak_rstore_put(s->cfg.rstore, id, body, strlen(body), &m, err) : ak_failc(err, AK_ERR_NOMEM, "out of memory");
    free(body);
    return rc;
}

/* items of a body (an array of items, at most AK_API_MAX_PARTS... checked by
 * the chat reading), each readable as a chat message; answered on error. */
static int check_items(const ak_route_req *q, const cJSON *items, enum MHD_Result *reply) {
    if (!given(items)) return 0;
    if (!cJSON_IsArray(items)) {
        *reply = ak_http_error(q->s, q->c, q->ep, 400, "items", "invalid_type", "items must be an array of items");
        return -1;
    }
    cJSON *probe = cJSON_CreateObject(), *chat = NULL;
    cJSON_AddItemToObject(probe, "input", cJSON_Duplicate(items, 1));
    ak_api_error b = {0};
    int rc = ak_resp_chat_body(probe, NULL, &chat, &b);
    cJSON_Delete(probe);
    cJSON_Delete(chat);
    if (rc < 0) *reply = ak_http_error(q->s, q->c, q->ep, b.status, b.param, b.code, "%s", b.msg);
    return rc;
}

enum MHD_Result ak_route_conversation_create(const ak_route_req *q) {
    ak_server *s = q->s;
    if (!s->cfg.rstore)
        return ak_http_error(s, q->c, q->ep, 400, NULL, "unsupported_parameter",
                             "this server stores no conversations (serve with --memory-dir)");
    cJSON *req = q->cn->len ? cJSON_ParseWithLength(q->cn->body, q->cn->len) : cJSON_CreateObject();
    enum MHD_Result reply;
    if (!cJSON_IsObject(req)) {
        cJSON_Delete(req);
        return ak_http_error(s, q->c, q->ep, 400, NULL, "invalid_json", "the request body must be a JSON object");
    }
    if (check_items(q, get(req, "items"), &reply) < 0) {
        cJSON_Delete(req);
        return reply;
    }
    char id[64];
    ak_run_make_id(s, "conv", id, sizeof id);
    cJSON *doc = cJSON_CreateObject(), *conv = cJSON_AddObjectToObject(doc, "conversation");
    cJSON_AddStringToObject(conv, "id", id);
    cJSON_AddStringToObject(conv, "object", "conversation");
    cJSON_AddNumberToObject(conv, "created_at", (double)time(NULL));
    const cJSON *md = get(req, "metadata");
    cJSON_AddItemToObject(conv, "metadata", cJSON_IsObject(md) ? cJSON_Duplicate(md, 1) : cJSON_CreateObject());
    cJSON *items = given(get(req, "items")) ? with_ids(s, get(req, "items")) : cJSON_CreateArray();
    cJSON_AddItemToObject(doc, "items", items);
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, ak_resp_chain_hash(0, items, cJSON_GetArraySize(items)));
    cJSON_AddStringToObject(doc, "chain", hex);
    ak_error err = {0};
    int rc = put_conversation(s, id, doc, id, &err);
    cJSON *out = rc == 0 ? conversation_json(doc) : NULL;
    cJSON_Delete(doc);
    cJSON_Delete(req);
    if (rc < 0) return ak_http_error(s, q->c, q->ep, ak_http_status_of(err.code), NULL, NULL, "%s", err.msg);
    return ak_http_json(s, q->c, q->ep, 200, out);
}

enum MHD_Result ak_route_conversation_get(const ak_route_req *q) {
    record r;
    enum MHD_Result reply;
    if (path_record(q, 'c', &r, &reply) < 0) return reply;
    cJSON *out = conversation_json(r.doc);
    cJSON_Delete(r.doc);
    return ak_http_json(q->s, q->c, q->ep, 200, out);
}

enum MHD_Result ak_route_conversation_delete(const ak_route_req *q) { return delete_record(q, 'c'); }

enum MHD_Result ak_route_conversation_items(const ak_route_req *q) {
    record r;
    enum MHD_Result reply;
    if (path_record(q, 'c', &r, &reply) < 0) return reply;
    if (!strcmp(q->method, "GET")) {
        cJSON *items = cJSON_DetachItemFromObjectCaseSensitive(r.doc, "items");
        cJSON_Delete(r.doc);
        return item_list(q, items ? items : cJSON_CreateArray());
    }
    cJSON *req = cJSON_ParseWithLength(q->cn->body ? q->cn->body : "", q->cn->len);
    if (!cJSON_IsObject(req) || !cJSON_IsArray(get(req, "items")) || check_items(q, get(req, "items"), &reply) < 0) {
        int json = cJSON_IsObject(req) && cJSON_IsArray(get(req, "items"));
        cJSON_Delete(req);
        cJSON_Delete(r.doc);
        return json ? reply
                    : ak_http_error(q->s, q->c, q->ep, 400, "items", "invalid_value",
                                    "the body must be {\"items\": [...]}");
    }
    cJSON *added = with_ids(q->s, get(req, "items"));
    cJSON *items = cJSON_GetObjectItemCaseSensitive(r.doc, "items");
    append_all(items, added);
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, ak_resp_chain_hash(doc_chain(r.doc), added, cJSON_GetArraySize(added)));
    cJSON_ReplaceItemInObjectCaseSensitive(r.doc, "chain", cJSON_CreateString(hex));
    ak_error err = {0};
    int rc = put_conversation(q->s, q->id, r.doc, r.meta.agent, &err);
    cJSON_Delete(r.doc);
    cJSON_Delete(req);
    if (rc < 0) {
        cJSON_Delete(added);
        return ak_http_error(q->s, q->c, q->ep, ak_http_status_of(err.code), NULL, NULL, "%s", err.msg);
    }
    return item_list(q, added);
}
