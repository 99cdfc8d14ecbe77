/* responses_out.c - a reply written out as a response's output items and
 * as the Responses stream's events (responses.h). */
#include "serve/responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An item id: prefix and 24 hex digits from the seed and the item's serial. */
static void item_id(const ak_resp_ids *ids, const char *prefix, int serial, char *out, size_t cap) {
    uint64_t z = ids->id_seed + 0x9E3779B97F4A7C15ull * (uint64_t)(serial + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    snprintf(out, cap, "%s_%016llx%08x", prefix, (unsigned long long)z, (unsigned)(z >> 7) & 0xffffffffu);
}

/* A reasoning item holding text (NULL: no content yet). */
static cJSON *reasoning_item(const char *id, const char *text) {
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", "reasoning");
    cJSON_AddArrayToObject(it, "summary");
    cJSON *content = cJSON_AddArrayToObject(it, "content");
    if (text) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "reasoning_text");
        cJSON_AddStringToObject(p, "text", text);
        cJSON_AddItemToArray(content, p);
    }
    return it;
}

/* An output_text part holding text. */
static cJSON *text_part(const char *text) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "output_text");
    cJSON_AddStringToObject(p, "text", text);
    cJSON_AddArrayToObject(p, "annotations");
    cJSON_AddArrayToObject(p, "logprobs");
    return p;
}

/* A message item (status given) holding text (NULL: no content yet). */
static cJSON *message_item(const char *id, const char *status, const char *text) {
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", "message");
    cJSON_AddStringToObject(it, "status", status);
    cJSON_AddStringToObject(it, "role", "assistant");
    cJSON *content = cJSON_AddArrayToObject(it, "content");
    if (text) cJSON_AddItemToArray(content, text_part(text));
    return it;
}

/* A function_call item. */
static cJSON *call_item(const char *id, const char *status, const char *call_id, const char *name, const char *args) {
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", "function_call");
    cJSON_AddStringToObject(it, "status", status);
    cJSON_AddStringToObject(it, "call_id", call_id);
    cJSON_AddStringToObject(it, "name", name);
    cJSON_AddStringToObject(it, "arguments", args);
    return it;
}

cJSON *ak_resp_output_items(const ak_toolcall *tc, const ak_resp_ids *ids, int incomplete) {
    cJSON *a = cJSON_CreateArray();
    if (!a) return NULL;
    char id[48];
    int serial = 0;
    size_t nr = 0, nc = 0;
    const char *reasoning = ak_toolcall_reasoning(tc, &nr), *content = ak_toolcall_content(tc, &nc);
    int calls = ak_toolcall_n_calls(tc);
    if (nr) {
        item_id(ids, "rs", serial++, id, sizeof id);
        cJSON_AddItemToArray(a, reasoning_item(id, reasoning));
    }
    if (nc || (!calls && !nr)) {
        item_id(ids, "msg", serial++, id, sizeof id);
        cJSON_AddItemToArray(a, message_item(id, incomplete ? "incomplete" : "completed", content));
    }
    for (int i = 0; i < calls; i++) {
        const ak_toolcall_call *c = ak_toolcall_get(tc, i);
        item_id(ids, "fc", serial++, id, sizeof id);
        cJSON_AddItemToArray(a, call_item(id, c->complete ? "completed" : "incomplete", c->id, c->name, c->arguments));
    }
    return a;
}

/* ---- the stream ---------------------------------------------------------- */

typedef enum { OPEN_NONE, OPEN_REASONING, OPEN_MESSAGE, OPEN_CALL } open_kind;

struct ak_resp_stream {
    ak_resp_ids ids;
    cJSON *out;          /* the caller's: events appended */
    cJSON *items;        /* the output items written so far (closed ones whole) */
    int seq, serial;
    open_kind open;
    cJSON *item;         /* the open item (in items) */
    int index;           /* its output_index */
    char *text;          /* its text so far (reasoning, message) or arguments (call) */
    size_t len, cap;
};

ak_resp_stream *ak_resp_stream_new(const ak_resp_ids *ids, cJSON *out) {
    ak_resp_stream *st = calloc(1, sizeof *st);
    if (!st || !(st->items = cJSON_CreateArray())) {
        free(st);
        return NULL;
    }
    st->ids = *ids;
    st->out = out;
    return st;
}

void ak_resp_stream_free(ak_resp_stream *st) {
    if (!st) return;
    cJSON_Delete(st->items);
    free(st->text);
    free(st);
}

const cJSON *ak_resp_stream_items(const ak_resp_stream *st) { return st->items; }

/* A new event of type appended to the output (NULL: memory). */
static cJSON *event(ak_resp_stream *st, const char *type) {
    cJSON *e = cJSON_CreateObject();
    if (!e || !cJSON_AddItemToArray(st->out, e)) {
        cJSON_Delete(e);
        return NULL;
    }
    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddNumberToObject(e, "sequence_number", st->seq++);
    return e;
}

/* An event about the open item: item_id, output_index (and content_index). */
static cJSON *item_event(ak_resp_stream *st, const char *type, int content_index) {
    cJSON *e = event(st, type);
    if (!e) return NULL;
    cJSON_AddStringToObject(e, "item_id", cJSON_GetObjectItemCaseSensitive(st->item, "id")->valuestring);
    cJSON_AddNumberToObject(e, "output_index", st->index);
    if (content_index >= 0) cJSON_AddNumberToObject(e, "content_index", content_index);
    return e;
}

/* Appends s[0..n) to the open item's text. Returns 0 or -1. */
static int grow(ak_resp_stream *st, const char *s, size_t n) {
    if (st->len + n + 1 > st->cap) {
        size_t cap = (st->len + n + 1) * 2;
        char *t = realloc(st->text, cap);
        if (!t) return -1;
        st->text = t;
        st->cap = cap;
    }
    memcpy(st->text + st->len, s, n);
    st->len += n;
    st->text[st->len] = 0;
    return 0;
}

/* Opens item it (kind k): output_item.added, and for text items the
 * content part's content_part.added. Returns 0 or -1. */
static int open_item(ak_resp_stream *st, open_kind k, cJSON *it) {
    if (!it || !cJSON_AddItemToArray(st->items, it)) {
        cJSON_Delete(it);
        return -1;
    }
    st->open = k;
    st->item = it;
    st->index = cJSON_GetArraySize(st->items) - 1;
    st->len = 0;
    if (grow(st, "", 0) < 0) return -1;
    cJSON *e = event(st, "response.output_item.added");
    if (!e) return -1;
    cJSON_AddNumberToObject(e, "output_index", st->index);
    cJSON_AddItemToObject(e, "item", cJSON_Duplicate(it, 1));
    if (k == OPEN_CALL) return 0;
    if (!(e = item_event(st, "response.content_part.added", 0))) return -1;
    if (k == OPEN_MESSAGE) {
        cJSON_AddItemToObject(e, "part", text_part(""));
    } else {
        cJSON *p = cJSON_AddObjectToObject(e, "part");
        cJSON_AddStringToObject(p, "type", "reasoning_text");
        cJSON_AddStringToObject(p, "text", "");
    }
    return 0;
}

/* Closes the open item (status "completed" or "incomplete"): its done
 * events, the item made whole. Returns 0 or -1. */
static int close_item(ak_resp_stream *st, const char *status) {
    if (st->open == OPEN_NONE) return 0;
    cJSON *it = st->item, *e;
    const char *text = st->text ? st->text : "";
    if (st->open == OPEN_CALL) {
        cJSON_ReplaceItemInObjectCaseSensitive(it, "arguments", cJSON_CreateString(text));
        if (!(e = item_event(st, "response.function_call_arguments.done", -1))) return -1;
        cJSON_AddStringToObject(e, "name", cJSON_GetObjectItemCaseSensitive(it, "name")->valuestring);
        cJSON_AddStringToObject(e, "arguments", text);
    } else {
        int msg = st->open == OPEN_MESSAGE;
        if (!(e = item_event(st, msg ? "response.output_text.done" : "response.reasoning_text.done", 0))) return -1;
        cJSON_AddStringToObject(e, "text", text);
        if (msg) cJSON_AddArrayToObject(e, "logprobs");
        cJSON *part = msg ? text_part(text) : cJSON_CreateObject();
        if (!msg) {
            cJSON_AddStringToObject(part, "type", "reasoning_text");
            cJSON_AddStringToObject(part, "text", text);
        }
        if (!(e = item_event(st, "response.content_part.done", 0))) {
            cJSON_Delete(part);
            return -1;
        }
        cJSON_AddItemToObject(e, "part", cJSON_Duplicate(part, 1));
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(it, "content"), part);
    }
    if (st->open != OPEN_REASONING) cJSON_ReplaceItemInObjectCaseSensitive(it, "status", cJSON_CreateString(status));
    if (!(e = event(st, "response.output_item.done"))) return -1;
    cJSON_AddNumberToObject(e, "output_index", st->index);
    cJSON_AddItemToObject(e, "item", cJSON_Duplicate(it, 1));
    st->open = OPEN_NONE;
    st->item = NULL;
    return 0;
}

/* A copy of resp with status and output set (output: the stream's items,
 * or an empty array). NULL when out of memory. */
static cJSON *resp_copy(const ak_resp_stream *st, const cJSON *resp, const char *status, int with_items) {
    cJSON *r = cJSON_Duplicate(resp, 1);
    if (!r) return NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(r, "status");
    cJSON_AddStringToObject(r, "status", status);
    cJSON_DeleteItemFromObjectCaseSensitive(r, "output");
    cJSON_AddItemToObject(r, "output", with_items ? cJSON_Duplicate(st->items, 1) : cJSON_CreateArray());
    return r;
}

int ak_resp_stream_begin(ak_resp_stream *st, const cJSON *resp) {
    static const char *const types[] = {"response.created", "response.in_progress"};
    for (int i = 0; i < 2; i++) {
        cJSON *e = event(st, types[i]), *r = e ? resp_copy(st, resp, "in_progress", 0) : NULL;
        if (!r) return -1;
        cJSON_AddItemToObject(e, "response", r);
    }
    return 0;
}

/* One parser event as Responses events. Returns 0 or -1. */
static int feed_one(ak_resp_stream *st, const ak_toolcall_event *ev) {
    char id[48];
    cJSON *e;
    switch (ev->kind) {
    case AK_TOOLCALL_REASONING:
    case AK_TOOLCALL_CONTENT: {
        int msg = ev->kind == AK_TOOLCALL_CONTENT;
        open_kind want = msg ? OPEN_MESSAGE : OPEN_REASONING;
        if (st->open != want) {
            if (close_item(st, "completed") < 0) return -1;
            item_id(&st->ids, msg ? "msg" : "rs", st->serial++, id, sizeof id);
            if (open_item(st, want, msg ? message_item(id, "in_progress", NULL) : reasoning_item(id, NULL)) < 0)
                return -1;
        }
        if (grow(st, ev->text, ev->len) < 0) return -1;
        if (!(e = item_event(st, msg ? "response.output_text.delta" : "response.reasoning_text.delta", 0))) return -1;
        cJSON_AddStringToObject(e, "delta", ev->text);
        if (msg) cJSON_AddArrayToObject(e, "logprobs");
        return 0;
    }
    case AK_TOOLCALL_CALL_START:
        if (close_item(st, "completed") < 0) return -1;
        item_id(&st->ids, "fc", st->serial++, id, sizeof id);
        return open_item(st, OPEN_CALL, call_item(id, "in_progress", ev->id, ev->name, ""));
    case AK_TOOLCALL_ARGS:
        if (st->open != OPEN_CALL) return 0;   /* the parser sends arguments inside a call only */
        if (grow(st, ev->text, ev->len) < 0) return -1;
        if (!(e = item_event(st, "response.function_call_arguments.delta", -1))) return -1;
        cJSON_AddStringToObject(e, "delta", ev->text);
        return 0;
    case AK_TOOLCALL_CALL_END: return st->open == OPEN_CALL ? close_item(st, "completed") : 0;
    }
    return 0;
}

int ak_resp_stream_feed(ak_resp_stream *st, const ak_toolcall_event *ev, int n) {
    for (int i = 0; i < n; i++)
        if (feed_one(st, &ev[i]) < 0) return -1;
    return 0;
}

int ak_resp_stream_end(ak_resp_stream *st, const cJSON *resp, int incomplete) {
    if (close_item(st, incomplete ? "incomplete" : "completed") < 0) return -1;
    const char *status = incomplete ? "incomplete" : "completed";
    cJSON *e = event(st, incomplete ? "response.incomplete" : "response.completed");
    cJSON *r = e ? resp_copy(st, resp, status, 1) : NULL;
    if (!r) return -1;
    cJSON_AddItemToObject(e, "response", r);
    return 0;
}
