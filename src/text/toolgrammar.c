/* toolgrammar.c - see toolgrammar.h */
#include "text/toolgrammar.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jsonschema.h"

/* One family's call syntax: opener lead CALL (sep CALL)* close, where CALL
 * is pre N mid A post. sep NULL: one call only. */
typedef struct {
    const char *opener, *lead, *pre, *mid, *post, *sep, *close;
    int reopens;   /* sep holds the opener: after the opener, the grammar is one call (auto re-arms for the next) */
} syntax;

enum { V_DEFAULT = 0, V_MISTRAL_SMALL32 = 1, V_DEEPSEEK_R1 = 1 };

static const syntax hermes = {.opener = "<tool_call>", .lead = "", .pre = "\n{\"name\": \"",
                              .mid = "\", \"arguments\": ", .post = "}\n</tool_call>", .sep = "\n<tool_call>",
                              .close = "", .reopens = 1};
static const syntax llama3 = {.opener = "{\"name\": \"", .lead = "", .pre = "", .mid = "\", \"parameters\": ",
                              .post = "}", .sep = NULL, .close = ""};
static const syntax mistral_nemo = {.opener = "[TOOL_CALLS]", .lead = "[", .pre = "{\"name\": \"",
                                    .mid = "\", \"arguments\": ", .post = "}", .sep = ", ", .close = "]"};
static const syntax mistral_small32 = {.opener = "[TOOL_CALLS]", .lead = "", .pre = "", .mid = "[ARGS]",
                                       .post = "", .sep = "[TOOL_CALLS]", .close = "",
                                       .reopens = 1};
static const syntax deepseek_v31 = {.opener = "<｜tool▁calls▁begin｜>", .lead = "", .pre = "<｜tool▁call▁begin｜>",
                                    .mid = "<｜tool▁sep｜>", .post = "<｜tool▁call▁end｜>", .sep = "",
                                    .close = "<｜tool▁calls▁end｜>"};
static const syntax deepseek_r1 = {.opener = "<｜tool▁calls▁begin｜>", .lead = "",
                                   .pre = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>", .mid = "\n```json\n",
                                   .post = "\n```<｜tool▁call▁end｜>", .sep = "", .close = "<｜tool▁calls▁end｜>"};

/* The template's variant of family f (chat_tools.c tells them apart the same way). */
static int variant_of(ak_chat_family f, const char *t) {
    if (f == AK_CHAT_MISTRAL) return t && strstr(t, "[SYSTEM_PROMPT]") ? V_MISTRAL_SMALL32 : V_DEFAULT;
    if (f == AK_CHAT_DEEPSEEK3) return t && !strstr(t, "is_last_user") ? V_DEEPSEEK_R1 : V_DEFAULT;
    return V_DEFAULT;
}

static const syntax *syntax_of(int f, int variant) {
    switch (f) {
    case AK_CHAT_LLAMA3: return &llama3;
    case AK_CHAT_MISTRAL: return variant == V_MISTRAL_SMALL32 ? &mistral_small32 : &mistral_nemo;
    case AK_CHAT_DEEPSEEK3: return variant == V_DEEPSEEK_R1 ? &deepseek_r1 : &deepseek_v31;
    default: return &hermes;
    }
}

const char *ak_toolg_opener(ak_chat_family f, const char *template_text) {
    return syntax_of(f, variant_of(f, template_text))->opener;
}

/* text parsed as JSON, or (not JSON) as a JSON string holding it. */
static cJSON *json_or_string(const char *text) {
    cJSON *j = cJSON_Parse(text);
    return j ? j : cJSON_CreateString(text);
}

char *ak_toolg_spec(const ak_toolg_opts *o, size_t *len) {
    cJSON *s = cJSON_CreateObject(), *tools = s ? cJSON_AddArrayToObject(s, "tools") : NULL;
    int ok = tools && cJSON_AddNumberToObject(s, "family", o->family) &&
             cJSON_AddNumberToObject(s, "variant", variant_of(o->family, o->template_text)) &&
             cJSON_AddNumberToObject(s, "mode", o->mode) && cJSON_AddBoolToObject(s, "parallel", o->parallel != 0) &&
             cJSON_AddBoolToObject(s, "lead_ws", o->lead_ws != 0);
    for (int i = 0; ok && i < o->n_tools; i++) {
        cJSON *t = cJSON_CreateObject();
        ok = t && cJSON_AddItemToArray(tools, t) && cJSON_AddStringToObject(t, "name", o->tools[i].name);
        if (ok && o->tools[i].parameters) {
            cJSON *p = json_or_string(o->tools[i].parameters);
            ok = p && cJSON_AddItemToObject(t, "parameters", p);
        }
    }
    if (ok && o->mode == AK_TOOLG_CALLS_OR_CONTENT && o->content_schema) {
        cJSON *c = json_or_string(o->content_schema);
        ok = c && cJSON_AddItemToObject(s, "content", c);
    }
    char *text = ok ? cJSON_PrintUnformatted(s) : NULL;
    cJSON_Delete(s);
    if (text && len) *len = strlen(text);
    return text;
}

/* The compile's state. */
typedef struct {
    ak_gbuild *b;
    ak_gram_error *e;
    const syntax *sx;
    cJSON *any_object;   /* {"type": "object"}: a tool without parameters */
} tg;

/* A literal s from state from; from itself when s is empty. */
static int lit(tg *g, int from, const char *s) {
    return *s ? ak_gbuild_literal(g->b, from, s, strlen(s)) : from;
}

/* Schema (a parsed document) added as a rule; its errors' path prefixed
 * with where. Returns the rule or -1. */
static int add_schema(tg *g, const cJSON *schema, const char *where, int ws) {
    if (cJSON_IsString(schema)) {
        ak_gram_fail(g->e, AK_GRAM_E_JSON, "", where, "the schema is not valid JSON");
        return -1;
    }
    const ak_js_opts o = {.ws = ws};
    int r = ak_jsonschema_add(g->b, schema ? schema : g->any_object, &o, g->e);
    if (r < 0 && g->e) {
        char path[sizeof g->e->path];
        snprintf(path, sizeof path, "%s%s", where, g->e->path);
        memcpy(g->e->path, path, sizeof path);
    }
    return r;
}

/* The rule of one call: pre N mid A post for each tool. Returns it or -1. */
static int call_rule(tg *g, const cJSON *tools) {
    int r = ak_gbuild_rule(g->b);
    if (r < 0) return -1;
    int named = lit(g, ak_gbuild_start(g->b, r), g->sx->pre), i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        if (!cJSON_IsString(name) || !*name->valuestring) {
            ak_gram_fail(g->e, AK_GRAM_E_INVALID, "", "/tools", "a tool without a name");
            return -1;
        }
        char where[64];
        snprintf(where, sizeof where, "/tools/%d/parameters", i++);
        int args = add_schema(g, cJSON_GetObjectItemCaseSensitive(t, "parameters"), where, AK_JS_WS_PY);
        if (args < 0) return -1;
        int z = lit(g, named, name->valuestring);
        z = z < 0 ? -1 : lit(g, z, g->sx->mid);
        int w = z < 0 ? -1 : ak_gbuild_state(g->b, r);
        if (w < 0) return ak_gram_fail(g->e, AK_GRAM_E_NOMEM, "", "", "out of memory");
        ak_gbuild_call(g->b, z, args, w);
        int end = lit(g, w, g->sx->post);
        if (end < 0) return ak_gram_fail(g->e, AK_GRAM_E_NOMEM, "", "", "out of memory");
        ak_gbuild_accept(g->b, end);
    }
    if (!i) return ak_gram_fail(g->e, AK_GRAM_E_INVALID, "", "/tools", "no tools");
    return r;
}

/* The rule of the calls: opener (not in AFTER_OPENER mode) lead CALL
 * (sep CALL)* close. Returns it or -1. */
static int calls_rule(tg *g, int mode, int parallel, int call) {
    int r = ak_gbuild_rule(g->b);
    if (r < 0) return -1;
    int at = ak_gbuild_start(g->b, r);
    if (mode != AK_TOOLG_AFTER_OPENER) at = lit(g, at, g->sx->opener);
    if (at >= 0) at = lit(g, at, g->sx->lead);
    int t = at < 0 ? -1 : ak_gbuild_state(g->b, r);
    if (t < 0) return ak_gram_fail(g->e, AK_GRAM_E_NOMEM, "", "", "out of memory");
    ak_gbuild_call(g->b, at, call, t);
    if (parallel && g->sx->sep && !(mode == AK_TOOLG_AFTER_OPENER && g->sx->reopens)) {
        if (*g->sx->sep) {
            int u = lit(g, t, g->sx->sep);
            if (u < 0) return ak_gram_fail(g->e, AK_GRAM_E_NOMEM, "", "", "out of memory");
            ak_gbuild_call(g->b, u, call, t);
        } else {
            ak_gbuild_call(g->b, t, call, t);
        }
    }
    int end = lit(g, t, g->sx->close);
    if (end < 0) return ak_gram_fail(g->e, AK_GRAM_E_NOMEM, "", "", "out of memory");
    ak_gbuild_accept(g->b, end);
    return r;
}

/* Whitespace before the calls or the content: 1 to MAX_LEAD_WS spaces or
 * newlines (bounded: a model that likes newlines must still get to the
 * call). Returns the rule or -1. */
#define MAX_LEAD_WS 4
static int ws_rule(tg *g) {
    int r = ak_gbuild_rule(g->b);
    if (r < 0) return -1;
    int s = ak_gbuild_start(g->b, r);
    for (int i = 0; i < MAX_LEAD_WS; i++) {
        int n = ak_gbuild_state(g->b, r);
        if (n < 0) return ak_gram_fail(g->e, AK_GRAM_E_NOMEM, "", "", "out of memory");
        ak_gbuild_bytes(g->b, s, ' ', ' ', n);
        ak_gbuild_bytes(g->b, s, '\n', '\n', n);
        ak_gbuild_accept(g->b, n);
        s = n;
    }
    return r;
}

/* The root rule: the calls right after the opener (AFTER_OPENER), or
 * [ws] (calls | content) where content is allowed. */
static int root_rule(tg *g, const cJSON *spec, int call) {
    int mode = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(spec, "mode"));
    int parallel = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(spec, "parallel"));
    int calls = calls_rule(g, mode, parallel, call);
    if (calls < 0 || mode == AK_TOOLG_AFTER_OPENER) return calls;
    int content = -1;
    if (mode == AK_TOOLG_CALLS_OR_CONTENT &&
        (content = add_schema(g, cJSON_GetObjectItemCaseSensitive(spec, "content"), "/content", AK_JS_WS_COMPACT)) < 0)
        return -1;
    int lead_ws = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(spec, "lead_ws"));
    int ws = lead_ws ? ws_rule(g) : 0, r = ws < 0 ? -1 : ak_gbuild_rule(g->b);
    int s0 = r < 0 ? -1 : ak_gbuild_start(g->b, r), s1 = r < 0 ? -1 : ak_gbuild_state(g->b, r);
    int end = s1 < 0 ? -1 : ak_gbuild_state(g->b, r);
    if (end < 0) return ak_gram_fail(g->e, AK_GRAM_E_NOMEM, "", "", "out of memory");
    if (lead_ws) ak_gbuild_call(g->b, s0, ws, s1);
    for (int from = s0; ; from = s1) {
        ak_gbuild_call(g->b, from, calls, end);
        if (content >= 0) ak_gbuild_call(g->b, from, content, end);
        if (from == s1) break;
    }
    ak_gbuild_accept(g->b, end);
    return r;
}

ak_grammar *ak_toolg_compile(const char *text, size_t len, ak_gram_error *e) {
    cJSON *spec = cJSON_ParseWithLength(text, len);
    const cJSON *fam = cJSON_GetObjectItemCaseSensitive(spec, "family");
    const cJSON *var = cJSON_GetObjectItemCaseSensitive(spec, "variant");
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(spec, "tools");
    if (!cJSON_IsNumber(fam) || !cJSON_IsNumber(var) || !cJSON_IsArray(tools) ||
        !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(spec, "mode"))) {
        cJSON_Delete(spec);
        ak_gram_fail(e, AK_GRAM_E_INVALID, "", "", "not a tool grammar's spec");
        return NULL;
    }
    tg g = {.b = ak_gbuild_new(), .e = e, .sx = syntax_of((int)fam->valuedouble, (int)var->valuedouble),
            .any_object = cJSON_Parse("{\"type\":\"object\"}")};
    ak_grammar *out = NULL;
    if (!g.b || !g.any_object) {
        ak_gram_fail(e, AK_GRAM_E_NOMEM, "", "", "out of memory");
    } else {
        int call = call_rule(&g, tools);
        int root = call < 0 ? -1 : root_rule(&g, spec, call);
        if (root >= 0) out = ak_gbuild_finish(g.b, root, e);
    }
    ak_gbuild_free(g.b);
    cJSON_Delete(g.any_object);
    cJSON_Delete(spec);
    return out;
}
