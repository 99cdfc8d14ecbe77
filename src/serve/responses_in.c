/* responses_in.c - a Responses request read into the chat body it means,
 * and the chain hash of items (responses.h). */
#include "serve/responses.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>


static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static int given(const cJSON *v) { return v && !cJSON_IsNull(v); }

/* The text of content: a string, or parts of the text types (input_text,
 * output_text, text; a refusal's text) concatenated. Returns a malloc'd
 * string, or NULL with b set (where names the content for the message). */
static char *parts_text(const cJSON *content, const char *where, ak_api_error *b) {
    if (cJSON_IsString(content)) {
        char *s = strdup(content->valuestring);
        if (!s) ak_api_fail(b, 500, NULL, NULL, "out of memory");
        return s;
    }
    if (!cJSON_IsArray(content)) {
        ak_api_fail(b, 400, where, "invalid_type", "%s must be a string or an array of text parts", where);
        return NULL;
    }
    size_t n = 0;
    int j = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, content) {
        const cJSON *type = get(p, "type");
        const char *key = cJSON_IsString(type) && !strcmp(type->valuestring, "refusal") ? "refusal" : "text";
        const cJSON *t = get(p, key);
        char path[160];
        snprintf(path, sizeof path, "%s[%d]", where, j);
        if (!cJSON_IsObject(p) || !cJSON_IsString(type)) {
            ak_api_fail(b, 400, path, "invalid_type", "%s must be an object with a type", path);
            return NULL;
        }
        if (strcmp(type->valuestring, "input_text") && strcmp(type->valuestring, "output_text") &&
            strcmp(type->valuestring, "text") && strcmp(type->valuestring, "refusal")) {
            ak_api_fail(b, 400, path, "unsupported_parameter", "%s.type '%.64s' is not supported (text parts only)", path,
                  type->valuestring);
            return NULL;
        }
        if (!cJSON_IsString(t)) {
            ak_api_fail(b, 400, path, "invalid_type", "%s.%s must be a string", path, key);
            return NULL;
        }
        n += strlen(t->valuestring);
        j++;
    }
    char *s = malloc(n + 1);
    if (!s) {
        ak_api_fail(b, 500, NULL, NULL, "out of memory");
        return NULL;
    }
    s[0] = 0;
    cJSON_ArrayForEach(p, content) {
        const cJSON *type = get(p, "type");
        strcat(s, get(p, !strcmp(type->valuestring, "refusal") ? "refusal" : "text")->valuestring);
    }
    return s;
}

/* A chat message {role, content} added to msgs; content taken (malloc'd,
 * NULL: null). Returns the message or NULL (memory). */
static cJSON *add_message(cJSON *msgs, const char *role, char *content) {
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddItemToArray(msgs, m)) {
        cJSON_Delete(m);
        free(content);
        return NULL;
    }
    cJSON_AddStringToObject(m, "role", role);
    if (content) cJSON_AddStringToObject(m, "content", content);
    else cJSON_AddNullToObject(m, "content");
    free(content);
    return m;
}

/* One item (at path `where`) as chat messages appended to msgs; *last_asst
 * is the assistant message calls may join (NULL: none; updated). Returns 0
 * or -1 with b set. */
static int add_item(cJSON *msgs, const cJSON *it, const char *where, cJSON **last_asst, ak_api_error *b) {
    char path[160];
    if (!cJSON_IsObject(it)) return ak_api_fail(b, 400, where, "invalid_type", "%s must be an object", where);
    const cJSON *type = get(it, "type");
    if (given(type) && !cJSON_IsString(type)) return ak_api_fail(b, 400, where, "invalid_type", "%s.type must be a string", where);
    const char *t = given(type) ? type->valuestring : "message";
    if (!strcmp(t, "message")) {
        const cJSON *role = get(it, "role");
        if (!cJSON_IsString(role))
            return ak_api_fail(b, 400, where, "missing_required_parameter", "%s.role must be a string", where);
        const char *r = role->valuestring;
        if (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "assistant")) {
            snprintf(path, sizeof path, "%s.role", where);
            return ak_api_fail(b, 400, path, "invalid_value", "%s '%.64s' is not one of user, system, developer, assistant",
                         path, r);
        }
        snprintf(path, sizeof path, "%s.content", where);
        char *text = parts_text(get(it, "content"), path, b);
        if (!text) return -1;
        cJSON *m = add_message(msgs, r, text);
        if (!m) return ak_api_fail(b, 500, NULL, NULL, "out of memory");
        *last_asst = strcmp(r, "assistant") ? NULL : m;
        return 0;
    }
    if (!strcmp(t, "function_call")) {
        const cJSON *call_id = get(it, "call_id"), *name = get(it, "name"), *args = get(it, "arguments");
        const char *miss = !cJSON_IsString(call_id) ? "call_id" : !cJSON_IsString(name) ? "name"
                         : !cJSON_IsString(args) ? "arguments" : NULL;
        if (miss) {
            snprintf(path, sizeof path, "%s.%s", where, miss);
            return ak_api_fail(b, 400, path, "invalid_type", "%s must be a string", path);
        }
        if (!*last_asst && !(*last_asst = add_message(msgs, "assistant", NULL)))
            return ak_api_fail(b, 500, NULL, NULL, "out of memory");
        cJSON *calls = cJSON_GetObjectItemCaseSensitive(*last_asst, "tool_calls");
        if (!calls) calls = cJSON_AddArrayToObject(*last_asst, "tool_calls");
        cJSON *c = cJSON_CreateObject();
        if (!calls || !c || !cJSON_AddItemToArray(calls, c)) {
            cJSON_Delete(c);
            return ak_api_fail(b, 500, NULL, NULL, "out of memory");
        }
        cJSON_AddStringToObject(c, "id", call_id->valuestring);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(f, "name", name->valuestring);
        cJSON_AddStringToObject(f, "arguments", args->valuestring);
        return 0;
    }
    if (!strcmp(t, "function_call_output")) {
        const cJSON *call_id = get(it, "call_id");
        if (!cJSON_IsString(call_id)) {
            snprintf(path, sizeof path, "%s.call_id", where);
            return ak_api_fail(b, 400, path, "invalid_type", "%s must be a string", path);
        }
        snprintf(path, sizeof path, "%s.output", where);
        char *text = parts_text(get(it, "output"), path, b);
        if (!text) return -1;
        cJSON *m = add_message(msgs, "tool", text);
        if (!m) return ak_api_fail(b, 500, NULL, NULL, "out of memory");
        cJSON_AddStringToObject(m, "tool_call_id", call_id->valuestring);
        *last_asst = NULL;
        return 0;
    }
    if (!strcmp(t, "reasoning")) return 0;   /* the templates drop earlier turns' reasoning */
    snprintf(path, sizeof path, "%s.type", where);
    return ak_api_fail(b, 400, path, "unsupported_parameter",
                 "%s '%.64s' is not supported (message, function_call, function_call_output, reasoning)", path, t);
}

/* Items (an array) at path base appended to msgs. Returns 0 or -1 with b set. */
static int add_items(cJSON *msgs, const cJSON *items, const char *base, ak_api_error *b) {
    cJSON *last = NULL;
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, items) {
        char where[64];
        snprintf(where, sizeof where, "%s[%d]", base, i++);
        if (add_item(msgs, it, where, &last, b) < 0) return -1;
    }
    return 0;
}

/* tools[] in the Responses' flat shape as chat tools (into chat). */
static int add_tools(cJSON *chat, const cJSON *tools, ak_api_error *b) {
    if (!given(tools)) return 0;
    if (!cJSON_IsArray(tools)) return ak_api_fail(b, 400, "tools", "invalid_type", "tools must be an array");
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        char path[64];
        snprintf(path, sizeof path, "tools[%d]", i);
        const cJSON *type = get(t, "type");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type))
            return ak_api_fail(b, 400, path, "invalid_type", "%s must be an object with a type", path);
        if (strcmp(type->valuestring, "function")) {
            snprintf(path, sizeof path, "tools[%d].type", i);
            return ak_api_fail(b, 400, path, "unsupported_parameter",
                         "%s '%.64s' is not supported: this server runs function tools only", path, type->valuestring);
        }
        cJSON *fn = cJSON_CreateObject(), *w = cJSON_CreateObject();
        if (!fn || !w || !cJSON_AddItemToArray(out, w)) {
            cJSON_Delete(fn);
            cJSON_Delete(w);
            return ak_api_fail(b, 500, NULL, NULL, "out of memory");
        }
        cJSON_AddStringToObject(w, "type", "function");
        cJSON_AddItemToObject(w, "function", fn);
        static const char *const keys[] = {"name", "description", "parameters", "strict"};
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
            if (get(t, keys[k])) cJSON_AddItemToObject(fn, keys[k], cJSON_Duplicate(get(t, keys[k]), 1));
        i++;
    }
    return 0;
}

/* tool_choice: the strings as they are; {type: "function", name} as chat's. */
static int add_tool_choice(cJSON *chat, const cJSON *tc, ak_api_error *b) {
    if (!given(tc)) return 0;
    if (cJSON_IsString(tc)) {
        cJSON_AddItemToObject(chat, "tool_choice", cJSON_Duplicate(tc, 0));
        return 0;
    }
    const cJSON *type = get(tc, "type"), *name = get(tc, "name");
    if (!cJSON_IsObject(tc) || !cJSON_IsString(type))
        return ak_api_fail(b, 400, "tool_choice", "invalid_type", "tool_choice must be a string or an object with a type");
    if (strcmp(type->valuestring, "function"))
        return ak_api_fail(b, 400, "tool_choice.type", "unsupported_parameter",
                     "tool_choice.type '%.64s' is not supported (function)", type->valuestring);
    if (!cJSON_IsString(name))
        return ak_api_fail(b, 400, "tool_choice.name", "missing_required_parameter", "tool_choice.name must be a string");
    cJSON *o = cJSON_AddObjectToObject(chat, "tool_choice");
    cJSON_AddStringToObject(o, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "function"), "name", name->valuestring);
    return 0;
}

/* text.format as chat's response_format; text.verbosity: no effect here. */
static int add_format(cJSON *chat, const cJSON *text, ak_api_error *b) {
    if (!given(text)) return 0;
    if (!cJSON_IsObject(text)) return ak_api_fail(b, 400, "text", "invalid_type", "text must be an object");
    const cJSON *f = get(text, "format");
    if (!given(f)) return 0;
    const cJSON *type = get(f, "type");
    if (!cJSON_IsObject(f) || !cJSON_IsString(type))
        return ak_api_fail(b, 400, "text.format", "invalid_type", "text.format must be an object with a type");
    const char *t = type->valuestring;
    if (!strcmp(t, "text")) return 0;
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    if (!strcmp(t, "json_object")) {
        cJSON_AddStringToObject(rf, "type", "json_object");
        return 0;
    }
    if (strcmp(t, "json_schema"))
        return ak_api_fail(b, 400, "text.format.type", "invalid_value",
                     "text.format.type '%.64s' is not one of text, json_object, json_schema", t);
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    static const char *const keys[] = {"name", "schema", "strict", "description"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
        if (get(f, keys[k])) cJSON_AddItemToObject(js, keys[k], cJSON_Duplicate(get(f, keys[k]), 1));
    return 0;
}

/* The fields that ask for what this server does not do. */
static int refuse_lacking(const cJSON *req, ak_api_error *b) {
    const cJSON *bg = get(req, "background"), *tl = get(req, "top_logprobs"), *pr = get(req, "prompt");
    const cJSON *tr = get(req, "truncation");
    if (given(bg) && !cJSON_IsFalse(bg))
        return ak_api_fail(b, 400, "background", "unsupported_parameter", "background responses are not supported");
    if (given(tl) && !(cJSON_IsNumber(tl) && tl->valuedouble == 0))
        return ak_api_fail(b, 400, "top_logprobs", "unsupported_parameter", "top_logprobs is not supported on /v1/responses");
    if (given(pr)) return ak_api_fail(b, 400, "prompt", "unsupported_parameter", "stored prompts are not supported");
    if (given(tr) && !(cJSON_IsString(tr) && (!strcmp(tr->valuestring, "auto") || !strcmp(tr->valuestring, "disabled"))))
        return ak_api_fail(b, 400, "truncation", "invalid_value", "truncation must be auto or disabled");
    return 0;
}

/* The sampler and limit fields, renamed where the APIs differ. */
static void add_scalars(cJSON *chat, const cJSON *req) {
    static const char *const same[] = {"model", "temperature", "top_p", "parallel_tool_calls", "prompt_cache_key",
                                       "seed", "stream", "handoff_reuse"};
    for (size_t k = 0; k < sizeof same / sizeof *same; k++)
        if (given(get(req, same[k]))) cJSON_AddItemToObject(chat, same[k], cJSON_Duplicate(get(req, same[k]), 1));
    if (given(get(req, "max_output_tokens")))
        cJSON_AddItemToObject(chat, "max_tokens", cJSON_Duplicate(get(req, "max_output_tokens"), 1));
    const cJSON *effort = get(get(req, "reasoning"), "effort");
    if (given(effort)) cJSON_AddItemToObject(chat, "reasoning_effort", cJSON_Duplicate(effort, 1));
}

int ak_resp_chat_body(const cJSON *req, const cJSON *history, cJSON **chat, ak_api_error *b) {
    *chat = NULL;
    if (!cJSON_IsObject(req)) return ak_api_fail(b, 400, NULL, "invalid_type", "the request body must be a JSON object");
    const cJSON *input = get(req, "input"), *instr = get(req, "instructions"), *reasoning = get(req, "reasoning");
    if (!given(input) && !history)
        return ak_api_fail(b, 400, "input", "missing_required_parameter", "input is required");
    if (given(input) && !cJSON_IsString(input) && !cJSON_IsArray(input))
        return ak_api_fail(b, 400, "input", "invalid_type", "input must be a string or an array of items");
    if (given(instr) && !cJSON_IsString(instr))
        return ak_api_fail(b, 400, "instructions", "invalid_type", "instructions must be a string");
    if (given(reasoning) && !cJSON_IsObject(reasoning))
        return ak_api_fail(b, 400, "reasoning", "invalid_type", "reasoning must be an object");
    if (refuse_lacking(req, b) < 0) return -1;
    cJSON *c = cJSON_CreateObject(), *msgs = c ? cJSON_AddArrayToObject(c, "messages") : NULL;
    if (!msgs) {
        cJSON_Delete(c);
        return ak_api_fail(b, 500, NULL, NULL, "out of memory");
    }
    int rc = 0;
    if (given(instr) && !add_message(msgs, "system", strdup(instr->valuestring)))
        rc = ak_api_fail(b, 500, NULL, NULL, "out of memory");
    if (rc == 0 && history && add_items(msgs, history, "previous_response_id", b) < 0) rc = -1;
    if (rc == 0 && cJSON_IsString(input) && !add_message(msgs, "user", strdup(input->valuestring)))
        rc = ak_api_fail(b, 500, NULL, NULL, "out of memory");
    if (rc == 0 && cJSON_IsArray(input) && add_items(msgs, input, "input", b) < 0) rc = -1;
    if (rc == 0 && (add_tools(c, get(req, "tools"), b) < 0 || add_tool_choice(c, get(req, "tool_choice"), b) < 0 ||
                    add_format(c, get(req, "text"), b) < 0))
        rc = -1;
    if (rc == 0) add_scalars(c, req);
    if (rc < 0) {
        cJSON_Delete(c);
        return -1;
    }
    *chat = c;
    return 0;
}

cJSON *ak_resp_input_items(const cJSON *req) {
    const cJSON *input = get(req, "input");
    if (cJSON_IsArray(input)) return cJSON_Duplicate(input, 1);
    cJSON *a = cJSON_CreateArray();
    if (!a || !cJSON_IsString(input)) return a;
    cJSON *m = cJSON_CreateObject(), *parts = cJSON_CreateArray(), *p = cJSON_CreateObject();
    if (!m || !parts || !p || !cJSON_AddItemToArray(a, m)) {
        cJSON_Delete(m);
        cJSON_Delete(parts);
        cJSON_Delete(p);
        cJSON_Delete(a);
        return NULL;
    }
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddItemToObject(m, "content", parts);
    cJSON_AddItemToArray(parts, p);
    cJSON_AddStringToObject(p, "type", "input_text");
    cJSON_AddStringToObject(p, "text", input->valuestring);
    return a;
}

/* The hash of h continued by the item's canonical text (responses.h: THE
 * CHAIN HASH), or h unchanged for items that do not count. */
uint64_t ak_resp_item_hash(uint64_t h, const cJSON *it) {
    const cJSON *type = get(it, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "message";
    XXH64_state_t *st = XXH64_createState();
    if (!st) return h ^ 0x9E3779B97F4A7C15ull;   /* out of memory: a hash nothing matches */
    XXH64_reset(st, h);
    const char sep = 0x1f;
    ak_api_error b = {0};
    int counts = 1;
    if (!strcmp(t, "message")) {
        const cJSON *role = get(it, "role");
        char *text = parts_text(get(it, "content"), "content", &b);
        XXH64_update(st, "m", 1);
        if (cJSON_IsString(role)) XXH64_update(st, role->valuestring, strlen(role->valuestring));
        XXH64_update(st, &sep, 1);
        if (text) XXH64_update(st, text, strlen(text));
        free(text);
    } else if (!strcmp(t, "function_call")) {
        const cJSON *id = get(it, "call_id"), *name = get(it, "name"), *args = get(it, "arguments");
        XXH64_update(st, "c", 1);
        if (cJSON_IsString(id)) XXH64_update(st, id->valuestring, strlen(id->valuestring));
        XXH64_update(st, &sep, 1);
        if (cJSON_IsString(name)) XXH64_update(st, name->valuestring, strlen(name->valuestring));
        XXH64_update(st, &sep, 1);
        cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        char *canon = parsed ? cJSON_PrintUnformatted(parsed) : NULL;
        const char *a = canon ? canon : cJSON_IsString(args) ? args->valuestring : "";
        XXH64_update(st, a, strlen(a));
        free(canon);
        cJSON_Delete(parsed);
    } else if (!strcmp(t, "function_call_output")) {
        const cJSON *id = get(it, "call_id");
        char *text = parts_text(get(it, "output"), "output", &b);
        XXH64_update(st, "o", 1);
        if (cJSON_IsString(id)) XXH64_update(st, id->valuestring, strlen(id->valuestring));
        XXH64_update(st, &sep, 1);
        if (text) XXH64_update(st, text, strlen(text));
        free(text);
    } else {
        counts = 0;
    }
    uint64_t out = counts ? XXH64_digest(st) : h;
    XXH64_freeState(st);
    return out;
}

uint64_t ak_resp_chain_hash(uint64_t h, const cJSON *items, int n) {
    const cJSON *it = items ? items->child : NULL;
    for (int i = 0; i < n && it; i++, it = it->next) h = ak_resp_item_hash(h, it);
    return h;
}
