/* api_tools.c - see api_tools.h */
#include "serve/api_tools.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(ak_api_error *b, int status, const char *code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Fills b (its param already set); always returns -1. */
static int bad(ak_api_error *b, int status, const char *code, const char *fmt, ...) {
    b->status = status;
    b->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->msg, sizeof b->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* b's param: a path built in its param_buf. Returns b for chaining. */
static ak_api_error *at(ak_api_error *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ak_api_error *at(ak_api_error *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->param_buf, sizeof b->param_buf, fmt, ap);
    va_end(ap);
    b->param = b->param_buf;
    return b;
}

/* Strings packed after an array of structs in one allocation: a first pass
 * with base NULL counts, a second copies. */
typedef struct {
    char *base;
    size_t used;
} packer;

/* s (NULL stays NULL) copied into the pack; its copy, or NULL when counting. */
static const char *pack(packer *k, const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *out = k->base ? memcpy(k->base + k->used, s, n) : NULL;
    k->used += n;
    return out;
}

/* A tool name as OpenAI takes it: 1-64 of [A-Za-z0-9_-]. */
static int name_valid(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 64) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* Checks tools[i] and returns its "function" object, or NULL with b set. */
static const cJSON *check_tool(const cJSON *tool, int i, ak_api_error *b) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(tool, "type");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
    if (!cJSON_IsObject(tool)) return bad(at(b, "tools[%d]", i), 400, "invalid_type", "tools[%d] must be an object", i), NULL;
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
        return bad(at(b, "tools[%d].type", i), 400, "invalid_value", "tools[%d].type must be \"function\"", i), NULL;
    if (!cJSON_IsObject(fn))
        return bad(at(b, "tools[%d].function", i), 400, fn ? "invalid_type" : "missing_required_parameter",
                   "tools[%d].function must be an object", i), NULL;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(fn, "description");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(fn, "strict");
    if (!cJSON_IsString(name))
        return bad(at(b, "tools[%d].function.name", i), 400, name ? "invalid_type" : "missing_required_parameter",
                   "tools[%d].function.name must be a string", i), NULL;
    if (!name_valid(name->valuestring))
        return bad(at(b, "tools[%d].function.name", i), 400, "invalid_value",
                   "tools[%d].function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -", i), NULL;
    if (desc && !cJSON_IsNull(desc) && !cJSON_IsString(desc))
        return bad(at(b, "tools[%d].function.description", i), 400, "invalid_type",
                   "tools[%d].function.description must be a string", i), NULL;
    if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
        return bad(at(b, "tools[%d].function.parameters", i), 400, "invalid_type",
                   "tools[%d].function.parameters must be a JSON Schema object", i), NULL;
    if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
        return bad(at(b, "tools[%d].function.strict", i), 400, "invalid_type",
                   "tools[%d].function.strict must be a boolean", i), NULL;
    return fn;
}

/* Fills t->tools from the checked array (two passes: count, copy). */
static int pack_tools(const cJSON *tools, ak_api_tools *t, ak_api_error *b) {
    size_t head = sizeof(ak_chat_tool) * (size_t)t->n_tools;
    packer k = {0};
    for (int pass = 0; pass < 2; pass++) {
        k.used = head;
        int i = 0;
        const cJSON *tool;
        cJSON_ArrayForEach(tool, tools) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
            const cJSON *desc = cJSON_GetObjectItemCaseSensitive(fn, "description");
            const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
            const cJSON *strict = cJSON_GetObjectItemCaseSensitive(fn, "strict");
            char *ptext = cJSON_IsObject(params) ? cJSON_PrintUnformatted(params) : NULL;
            if (cJSON_IsObject(params) && !ptext) return bad(at(b, "tools"), 500, NULL, "out of memory");
            ak_chat_tool x = {.name = pack(&k, cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring),
                              .description = pack(&k, cJSON_IsString(desc) ? desc->valuestring : NULL),
                              .parameters = pack(&k, ptext),
                              .strict = cJSON_IsBool(strict) ? (cJSON_IsTrue(strict) ? 1 : -1) : 0};
            free(ptext);
            if (k.base) t->tools[i] = x;
            i++;
        }
        if (pass == 0) {
            if (!(k.base = malloc(k.used))) return bad(at(b, "tools"), 500, NULL, "out of memory");
            t->blob = k.base;
            t->tools = (ak_chat_tool *)(void *)k.base;
        }
    }
    return 0;
}

/* tools[]: each checked, names unique, packed into t. */
static int read_tools(const cJSON *tools, ak_api_tools *t, ak_api_error *b) {
    if (!tools || cJSON_IsNull(tools)) return 0;
    if (!cJSON_IsArray(tools)) return bad(at(b, "tools"), 400, "invalid_type", "tools must be an array");
    int i = 0;
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools) {
        const cJSON *fn = check_tool(tool, i, b);
        if (!fn) return -1;
        const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
        int j = 0;
        for (const cJSON *o = tools->child; o != tool; o = o->next, j++)
            if (!strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "function"), "name")
                            ->valuestring, name))
                return bad(at(b, "tools[%d].function.name", i), 400, "invalid_value",
                           "tools[%d] and tools[%d] are both named '%s'", j, i, name);
        i++;
    }
    t->n_tools = i;
    return i ? pack_tools(tools, t, b) : 0;
}

/* tool_choice: a string (the field table checked its values) or
 * {"type": "function", "function": {"name": N}} naming one of the tools. */
static int read_choice(const cJSON *c, ak_api_tools *t, ak_api_error *b) {
    t->choice = AK_TOOL_CHOICE_AUTO;
    if (!c || cJSON_IsNull(c)) return 0;
    if (cJSON_IsString(c)) {
        if (!strcmp(c->valuestring, "none")) t->choice = AK_TOOL_CHOICE_NONE;
        else if (!strcmp(c->valuestring, "required")) t->choice = AK_TOOL_CHOICE_REQUIRED;
        else if (strcmp(c->valuestring, "auto"))
            return bad(at(b, "tool_choice"), 400, "invalid_value", "tool_choice must be none, auto or required");
    } else {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(c) || !cJSON_IsString(type) || strcmp(type->valuestring, "function"))
            return bad(at(b, "tool_choice.type"), 400, "invalid_value", "tool_choice.type must be \"function\"");
        if (!cJSON_IsString(name))
            return bad(at(b, "tool_choice.function.name"), 400, "missing_required_parameter",
                       "tool_choice.function.name must be a string");
        t->named = -1;
        for (int i = 0; i < t->n_tools; i++)
            if (!strcmp(t->tools[i].name, name->valuestring)) t->named = i;
        if (t->named < 0)
            return bad(at(b, "tool_choice.function.name"), 400, "invalid_value",
                       "tool_choice names the function '%.64s', which is not among the tools", name->valuestring);
        t->choice = AK_TOOL_CHOICE_NAMED;
    }
    if (t->choice != AK_TOOL_CHOICE_NONE && t->choice != AK_TOOL_CHOICE_AUTO && !t->n_tools)
        return bad(at(b, "tool_choice"), 400, "invalid_value", "tool_choice asks for a call, but no tools are given");
    return 0;
}

/* reasoning_effort "none" and chat_template_kwargs.enable_thinking. */
static int read_thinking(const cJSON *body, ak_api_tools *t, ak_api_error *b) {
    const cJSON *effort = cJSON_GetObjectItemCaseSensitive(body, "reasoning_effort");
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(body, "chat_template_kwargs");
    t->think = AK_CHAT_THINK_DEFAULT;
    if (cJSON_IsString(effort)) t->think = strcmp(effort->valuestring, "none") ? AK_CHAT_THINK_ON : AK_CHAT_THINK_OFF;
    if (!kw || cJSON_IsNull(kw)) return 0;
    if (!cJSON_IsObject(kw)) return bad(at(b, "chat_template_kwargs"), 400, "invalid_type", "chat_template_kwargs must be an object");
    const cJSON *on = cJSON_GetObjectItemCaseSensitive(kw, "enable_thinking");
    if (!on || cJSON_IsNull(on)) return 0;
    if (!cJSON_IsBool(on))
        return bad(at(b, "chat_template_kwargs.enable_thinking"), 400, "invalid_type",
                   "chat_template_kwargs.enable_thinking must be a boolean");
    t->think = cJSON_IsTrue(on) ? AK_CHAT_THINK_ON : AK_CHAT_THINK_OFF;
    return 0;
}

int ak_api_parse_tools(const cJSON *body, ak_api_tools *t, ak_api_error *b) {
    memset(t, 0, sizeof *t);
    t->parallel = 1;
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(body, "parallel_tool_calls");
    if (cJSON_IsBool(par)) t->parallel = cJSON_IsTrue(par);   /* its type: the field table's */
    if (read_tools(cJSON_GetObjectItemCaseSensitive(body, "tools"), t, b) < 0 ||
        read_choice(cJSON_GetObjectItemCaseSensitive(body, "tool_choice"), t, b) < 0 || read_thinking(body, t, b) < 0) {
        ak_api_tools_free(t);
        return -1;
    }
    return 0;
}

void ak_api_tools_free(ak_api_tools *t) {
    if (!t) return;
    free(t->blob);
    memset(t, 0, sizeof *t);
}

/* Checks call j of message i. Returns 0, or -1 with b set. */
static int check_call(const cJSON *call, int i, int j, ak_api_error *b) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(call, "id");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(call, "type");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    if (!cJSON_IsObject(call))
        return bad(at(b, "messages[%d].tool_calls[%d]", i, j), 400, "invalid_type", "messages[%d].tool_calls[%d] must be an object", i, j);
    if (!cJSON_IsString(id))
        return bad(at(b, "messages[%d].tool_calls[%d].id", i, j), 400, "invalid_type",
                   "messages[%d].tool_calls[%d].id must be a string", i, j);
    if (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "function")))
        return bad(at(b, "messages[%d].tool_calls[%d].type", i, j), 400, "invalid_value",
                   "messages[%d].tool_calls[%d].type must be \"function\"", i, j);
    if (!cJSON_IsObject(fn) || !cJSON_IsString(name))
        return bad(at(b, "messages[%d].tool_calls[%d].function.name", i, j), 400, "invalid_type",
                   "messages[%d].tool_calls[%d].function.name must be a string", i, j);
    if (!cJSON_IsString(args))
        return bad(at(b, "messages[%d].tool_calls[%d].function.arguments", i, j), 400, "invalid_type",
                   "messages[%d].tool_calls[%d].function.arguments must be a string (JSON text)", i, j);
    return 0;
}

int ak_api_read_calls(const cJSON *msg, int i, ak_chat_msg *m, char **owned, ak_api_error *b) {
    *owned = NULL;
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    const cJSON *tid = cJSON_GetObjectItemCaseSensitive(msg, "tool_call_id");
    if (!strcmp(m->role, "tool")) {
        if (!cJSON_IsString(tid))
            return bad(at(b, "messages[%d].tool_call_id", i), 400, tid ? "invalid_type" : "missing_required_parameter",
                       "messages[%d] (role tool) needs a string tool_call_id naming the call it answers", i);
        if (!(*owned = strdup(tid->valuestring))) return bad(at(b, "messages"), 500, NULL, "out of memory");
        m->tool_call_id = *owned;
        return 0;
    }
    if (!calls || cJSON_IsNull(calls)) return 0;
    if (strcmp(m->role, "assistant"))
        return bad(at(b, "messages[%d].tool_calls", i), 400, "invalid_value", "messages[%d]: only assistant messages make tool calls", i);
    if (!cJSON_IsArray(calls))
        return bad(at(b, "messages[%d].tool_calls", i), 400, "invalid_type", "messages[%d].tool_calls must be an array", i);
    int n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        if (check_call(c, i, n, b) < 0) return -1;
        n++;
    }
    if (!n) return 0;
    size_t head = sizeof(ak_chat_call) * (size_t)n;
    packer k = {0};
    for (int pass = 0; pass < 2; pass++) {
        k.used = head;
        int j = 0;
        cJSON_ArrayForEach(c, calls) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
            ak_chat_call x = {.id = pack(&k, cJSON_GetObjectItemCaseSensitive(c, "id")->valuestring),
                              .name = pack(&k, cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring),
                              .arguments = pack(&k, cJSON_GetObjectItemCaseSensitive(fn, "arguments")->valuestring)};
            if (k.base) ((ak_chat_call *)(void *)k.base)[j] = x;
            j++;
        }
        if (pass == 0 && !(k.base = *owned = malloc(k.used))) return bad(at(b, "messages"), 500, NULL, "out of memory");
    }
    m->calls = (const ak_chat_call *)(void *)k.base;
    m->n_calls = n;
    return 0;
}

int ak_api_check_tool_results(const ak_chat_msg *m, int n, ak_api_error *b) {
    for (int i = 0; i < n; i++) {
        if (strcmp(m[i].role, "tool")) continue;
        int found = 0;
        for (int k = 0; k < i && !found; k++)
            for (int j = 0; j < m[k].n_calls && !found; j++)
                found = m[k].calls[j].id && !strcmp(m[k].calls[j].id, m[i].tool_call_id);
        if (!found)
            return bad(at(b, "messages[%d].tool_call_id", i), 400, "invalid_value",
                       "messages[%d].tool_call_id '%.64s' answers no call an earlier assistant message made", i,
                       m[i].tool_call_id);
    }
    return 0;
}
