/* chat_tools.c - the families with tool markup of their own: chatml
 * (Qwen2.5), qwen3, llama3, mistral and deepseek3, with and without tools
 * (chat.h). */
#include <stdlib.h>
#include <string.h>

#include "text/chat_impl.h"
#include "text/pyjson.h"

static const char *const role_names[] = {"system", "user", "assistant", "tool"};

/* ---- JSON as the templates print it ---------------------------------------- */

/* Moves a JSON buffer's text into b as content; a failed buffer fails b. */
static void put_buf(sbuf *b, ak_buf *j) {
    if (j->failed) b->failed = 1;
    else CONTENT(b, akc_putn(b, j->p ? j->p : "", j->len));
    ak_buf_free(j);
}

void akc_put_tojson(sbuf *b, const char *json, int indent) {
    ak_buf j = {0};
    ak_error err = {0};
    if (!json) json = "{}";
    int rc = ak_pyjson_reprint(&j, json, strlen(json), indent, &err);
    if (rc == 1) ak_pyjson_dump_string(&j, json, strlen(json));
    else if (rc < 0) j.failed = 1;
    put_buf(b, &j);
}

/* A call's arguments as qwen3's and Hermes' templates print them: a string
 * (text that is not JSON, or a JSON string) as it is, anything else tojson. */
static void put_args_raw_string(sbuf *b, const char *args) {
    if (!args) args = "{}";
    ak_pyjson doc;
    ak_error err = {0};
    if (ak_pyjson_parse(args, strlen(args), &doc, &err) < 0) {
        if (err.code == AK_ERR_NOMEM) b->failed = 1;
        else CONTENT(b, akc_puts(b, args));
        return;
    }
    ak_buf j = {0};
    if (doc.v[0].kind == AK_PYJSON_STRING) ak_buf_append(&j, doc.v[0].s, doc.v[0].len);
    else ak_pyjson_dump(&j, &doc, 0, -1);
    ak_pyjson_free(&doc);
    put_buf(b, &j);
}

/* The tool object a template prints whole (chat.h), in JSON; the parameters
 * as a string when they are not JSON (params_text). */
static void tool_object(ak_buf *j, const ak_chat_tool *t, int params_text) {
    ak_buf_puts(j, "{\"type\": \"function\", \"function\": {\"name\": ");
    ak_pyjson_dump_string(j, t->name, strlen(t->name));
    if (t->description) {
        ak_buf_puts(j, ", \"description\": ");
        ak_pyjson_dump_string(j, t->description, strlen(t->description));
    }
    if (t->parameters) {
        ak_buf_puts(j, ", \"parameters\": ");
        if (params_text) ak_pyjson_dump_string(j, t->parameters, strlen(t->parameters));
        else ak_buf_puts(j, t->parameters);
    }
    if (t->strict) ak_buf_puts(j, t->strict > 0 ? ", \"strict\": true" : ", \"strict\": false");
    ak_buf_puts(j, "}}");
}

/* Tool t as tojson(indent) prints it, as content. */
static void put_tool(sbuf *b, const ak_chat_tool *t, int indent) {
    ak_buf src = {0}, j = {0};
    ak_error err = {0};
    tool_object(&src, t, 0);
    int rc = src.failed ? -1 : ak_pyjson_reprint(&j, src.p, src.len, indent, &err);
    if (rc == 1) {   /* parameters that are not JSON */
        ak_buf_clear(&src);
        tool_object(&src, t, 1);
        rc = src.failed ? -1 : ak_pyjson_reprint(&j, src.p, src.len, indent, &err);
    }
    if (rc != 0) j.failed = 1;
    ak_buf_free(&src);
    put_buf(b, &j);
}

static const char TOOLS_INTRO[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char TOOLS_OUTRO[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>";

void akc_put_tools_block(sbuf *b, const ak_chat_opts *o) {
    akc_puts(b, TOOLS_INTRO);
    for (int k = 0; k < o->n_tools; k++) {
        akc_puts(b, "\n");
        put_tool(b, &o->tools[k], -1);
    }
    akc_puts(b, TOOLS_OUTRO);
}

/* ---- chatml and qwen3 ------------------------------------------------------ */

/* Tool result i of a run of consecutive ones, in one user turn. */
static void put_tool_response(const akc_ctx *c, int i) {
    sbuf *b = c->b;
    if (i == 0 || c->r[i - 1] != ROLE_TOOL) akc_puts(b, "<|im_start|>user");
    akc_puts(b, "\n<tool_response>\n");
    CONTENT(b, akc_puts(b, c->m[i].content));
    akc_puts(b, "\n</tool_response>");
    if (i == c->n - 1 || c->r[i + 1] != ROLE_TOOL) akc_puts(b, "<|im_end|>\n");
}

/* "{"name": "N", "arguments": " ... after <tool_call>\n. */
static void put_call_head(sbuf *b, const ak_chat_call *k) {
    akc_puts(b, "<tool_call>\n{\"name\": \"");
    CONTENT(b, akc_puts(b, k->name));
    akc_puts(b, "\", \"arguments\": ");
}

/* The system turn with the tools: sys (may be NULL) or the template's
 * default, then the tools block. */
static void put_tools_system(const akc_ctx *c, const char *sys, const char *def, size_t n_def) {
    sbuf *b = c->b;
    akc_puts(b, "<|im_start|>system\n");
    if (sys) {
        CONTENT(b, akc_puts(b, sys));
        akc_puts(b, "\n\n");
    } else if (def) {
        akc_put_unescaped(b, def, n_def);
        akc_puts(b, "\n\n");
    }
    akc_put_tools_block(b, c->o);
    akc_puts(b, "<|im_end|>\n");
}

/* ---- Hermes 3's tool_use template --------------------------------------------- */

/* A JSON Schema's type as the template's json_to_python_type macro writes
 * it (node < 0: no schema). Where the macro reads a missing "type" it finds
 * Jinja's undefined, which is iterable: "Union[]"; "array" reads its items
 * through the items filter, never a schema: "list[Union[]]". A type the
 * macro would recurse on forever (a string it does not know) is "Any". */
static void put_python_type(ak_buf *b, const ak_pyjson *d, int node, int depth) {
    int t = node >= 0 && d->v[node].kind == AK_PYJSON_OBJECT ? ak_pyjson_get(d, node, "type") : -1;
    if (t < 0) {
        ak_buf_puts(b, "Union[]");
        return;
    }
    const ak_pyjson_node *v = &d->v[t];
    static const char *const map[][2] = {
        {"string", "str"}, {"number", "float"}, {"integer", "int"}, {"boolean", "bool"}, {"array", "list[Union[]]"}};
    if (v->kind == AK_PYJSON_STRING) {
        for (size_t k = 0; k < sizeof map / sizeof map[0]; k++)
            if (v->len == strlen(map[k][0]) && !memcmp(v->s, map[k][0], v->len)) {
                ak_buf_puts(b, map[k][1]);
                return;
            }
        if (v->len == 6 && !memcmp(v->s, "object", 6)) {
            int extra = ak_pyjson_get(d, node, "additionalProperties");
            if (extra < 0 || depth > 64) {
                ak_buf_puts(b, "dict");
                return;
            }
            ak_buf_puts(b, "dict[str, ");
            put_python_type(b, d, extra, depth + 1);
            ak_buf_puts(b, "]");
            return;
        }
    } else if (v->kind == AK_PYJSON_ARRAY) {   /* each one as {"type": t} */
        ak_buf_puts(b, "Union[");
        for (int e = v->first; e >= 0; e = d->v[e].next) {
            const ak_pyjson_node *x = &d->v[e];
            const char *name = "Any";
            for (size_t k = 0; k < sizeof map / sizeof map[0]; k++)
                if (x->kind == AK_PYJSON_STRING && x->len == strlen(map[k][0]) && !memcmp(x->s, map[k][0], x->len))
                    name = map[k][1];
            if (x->kind == AK_PYJSON_STRING && x->len == 6 && !memcmp(x->s, "object", 6)) name = "dict";
            ak_buf_puts(b, name);
            if (d->v[e].next >= 0) ak_buf_puts(b, ",");
        }
        ak_buf_puts(b, "]");
        return;
    }
    ak_buf_puts(b, "Any");
}

/* One tool as the template writes it: a description made of the name, the
 * parameters' Python types and the description, then the Args lines (run
 * together, as the template does), and the parameters' JSON. */
static void put_hermes_tool(sbuf *b, const ak_chat_tool *t) {
    ak_pyjson d = {0};
    ak_error err = {0};
    int props = -1;
    if (t->parameters && ak_pyjson_parse(t->parameters, strlen(t->parameters), &d, &err) == 0)
        props = ak_pyjson_get(&d, 0, "properties");
    else if (err.code == AK_ERR_NOMEM)
        b->failed = 1;
    int any = props >= 0 && d.v[props].kind == AK_PYJSON_OBJECT && d.v[props].n > 0;
    ak_buf j = {0};
    ak_buf_puts(&j, t->name);
    ak_buf_puts(&j, "(");
    for (int p = any ? d.v[props].first : -1; p >= 0; p = d.v[p].next) {
        ak_buf_append(&j, d.v[p].key, d.v[p].klen);
        ak_buf_puts(&j, ": ");
        put_python_type(&j, &d, p, 0);
        if (d.v[p].next >= 0) ak_buf_puts(&j, ", ");
    }
    ak_buf_puts(&j, ") - ");
    ak_buf_puts(&j, t->description);
    ak_buf_puts(&j, "\n\n");
    for (int p = any ? d.v[props].first : -1; p >= 0; p = d.v[p].next) {
        if (p == d.v[props].first) ak_buf_puts(&j, "    Args:\n");
        ak_buf_puts(&j, "        ");
        ak_buf_append(&j, d.v[p].key, d.v[p].klen);
        ak_buf_puts(&j, "(");
        put_python_type(&j, &d, p, 0);
        ak_buf_puts(&j, "): ");
        int desc = ak_pyjson_get(&d, p, "description");
        if (desc >= 0 && d.v[desc].kind == AK_PYJSON_STRING) {
            const char *s = d.v[desc].s, *e = s + d.v[desc].len;
            while (s < e && strchr(" \t\n\r\v\f", *s)) s++;
            while (e > s && strchr(" \t\n\r\v\f", e[-1])) e--;
            ak_buf_append(&j, s, (size_t)(e - s));
        }
    }
    ak_pyjson_free(&d);
    akc_puts(b, "{\"type\": \"function\", \"function\": {\"name\": \"");
    CONTENT(b, akc_puts(b, t->name));
    akc_puts(b, "\", \"description\": \"");
    put_buf(b, &j);
    akc_puts(b, "\", \"parameters\": ");
    if (any) akc_put_tojson(b, t->parameters, -1);
    else akc_puts(b, "{}");
    akc_puts(b, "}");
}

/* Hermes 3's tool_use template: its function-calling system turn always (no
 * tools: an empty list), every system message a turn of its own, calls
 * without the text beside them, results in "tool" turns. */
static int render_hermes(const akc_ctx *c) {
    sbuf *b = c->b;
    const ak_chat_msg *m = c->m;
    akc_puts(b, c->bos);
    akc_puts(b, "<|im_start|>system\nYou are a function calling AI model. You are provided with function signatures "
                "within <tools></tools> XML tags. You may call one or more functions to assist with the user query. "
                "Don't make assumptions about what values to plug into functions. Here are the available tools: "
                "<tools> ");
    for (int k = 0; k < c->o->n_tools; k++) {
        put_hermes_tool(b, &c->o->tools[k]);
        if (k + 1 < c->o->n_tools) akc_puts(b, "\n");
    }
    akc_puts(b, " </tools>Use the following pydantic model json schema for each tool call you will make: "
                "{\"properties\": {\"name\": {\"title\": \"Name\", \"type\": \"string\"}, \"arguments\": "
                "{\"title\": \"Arguments\", \"type\": \"object\"}}, \"required\": [\"name\", \"arguments\"], "
                "\"title\": \"FunctionCall\", \"type\": \"object\"}}\nFor each function call return a json object "
                "with function name and arguments within <tool_call></tool_call> XML tags as follows:\n<tool_call>\n"
                "{\"name\": <function-name>, \"arguments\": <args-dict>}\n</tool_call><|im_end|>\n");
    for (int i = 0; i < c->n; i++) {
        if (c->r[i] == ROLE_TOOL) {
            if (i > 0 && c->r[i - 1] != ROLE_TOOL) akc_puts(b, "<|im_start|>tool\n");
            akc_puts(b, "<tool_response>\n");
            CONTENT(b, akc_puts(b, m[i].content));
            akc_puts(b, i + 1 < c->n ? "\n</tool_response>\n" : "\n</tool_response>");
            if (i + 1 == c->n || c->r[i + 1] != ROLE_TOOL) akc_puts(b, "<|im_end|>");
            continue;
        }
        akc_mark_open(b, i);
        akc_puts(b, "<|im_start|>");
        akc_puts(b, role_names[c->r[i]]);
        akc_puts(b, "\n");
        if (m[i].n_calls == 0) MSG_CONTENT(b, i, akc_puts(b, m[i].content));
        else
            MSG_SPAN(b, i, {
                for (int k = 0; k < m[i].n_calls; k++) {
                    if (k) akc_puts(b, "\n");
                    put_call_head(b, &m[i].calls[k]);
                    put_args_raw_string(b, m[i].calls[k].arguments);
                    akc_puts(b, "}\n</tool_call>");
                }
            });
        akc_puts(b, "<|im_end|>\n");
    }
    if (c->gen) akc_puts(b, "<|im_start|>assistant\n");
    return 0;
}

int akc_render_chatml(const akc_ctx *c, ak_error *err) {
    sbuf *b = c->b;
    const ak_chat_msg *m = c->m;
    const char *t = c->o->template_text;
    if (t && strstr(t, "You are a function calling AI model")) return render_hermes(c);
    const char *def = NULL;
    size_t n_def = 0;
    int has_def = akc_chatml_default_system(c->o->template_text, &def, &n_def), i = 0;
    if (c->o->n_tools > 0) {
        const char *sys = c->r[0] == ROLE_SYSTEM ? m[i++].content : NULL;
        put_tools_system(c, sys, has_def ? def : NULL, n_def);
    } else if (c->r[0] != ROLE_SYSTEM && has_def) {
        akc_puts(b, "<|im_start|>system\n");
        akc_put_unescaped(b, def, n_def);
        akc_puts(b, "<|im_end|>\n");
    }
    for (; i < c->n; i++) {
        if (c->r[i] == ROLE_TOOL) {
            put_tool_response(c, i);
            continue;
        }
        akc_mark_open(b, i);
        akc_puts(b, "<|im_start|>");
        akc_puts(b, role_names[c->r[i]]);
        akc_puts(b, "\n");
        if (m[i].n_calls > 0) {
            int text = m[i].content && m[i].content[0];
            MSG_SPAN(b, i, {
                if (text) CONTENT(b, akc_puts(b, m[i].content));
                for (int k = 0; k < m[i].n_calls; k++) {
                    if (k || text) akc_puts(b, "\n");
                    put_call_head(b, &m[i].calls[k]);
                    akc_put_tojson(b, m[i].calls[k].arguments, -1);
                    akc_puts(b, "}\n</tool_call>");
                }
            });
        } else {
            MSG_CONTENT(b, i, akc_puts(b, m[i].content));
        }
        akc_puts(b, "<|im_end|>\n");
    }
    if (c->gen) akc_puts(b, "<|im_start|>assistant\n");
    return 0;
}

/* The last occurrence of needle in s, or NULL. */
static const char *last_of(const char *s, const char *needle) {
    const char *hit = NULL;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p++) hit = p;
    return hit;
}

/* 1 if s starts with pre and ends with suf (Python's startswith/endswith). */
static int starts_ends(const char *s, const char *pre, const char *suf) {
    size_t n = strlen(s), a = strlen(pre), z = strlen(suf);
    return n >= a && n >= z && !strncmp(s, pre, a) && !strcmp(s + n - z, suf);
}

/* An assistant message as Qwen3's template reads it: the reasoning
 * [*rs, *re) ('\n's stripped from both ends) and the reply, returned. The
 * message's own reasoning when it has one (the reply as it is), else the
 * text before the content's first "</think>" after the last "<think>" there,
 * and the reply after its last "</think>", leading '\n's stripped. *given:
 * the reasoning is not empty before stripping (the template's test). */
static const char *qwen3_split(const ak_chat_msg *m, const char **rs, const char **re, int *given) {
    const char *c = m->content ? m->content : "";
    if (m->reasoning) {
        *rs = m->reasoning;
        *re = *rs + strlen(*rs);
        *given = *rs < *re;
    } else {
        const char *close = strstr(c, "</think>");
        *rs = *re = c;
        if (close) {
            *re = close;
            for (const char *p = c; (p = strstr(p, "<think>")) != NULL && p < close; p++) *rs = p + 7;
            c = last_of(c, "</think>") + 8;
            while (*c == '\n') c++;
        }
    }
    while (*rs < *re && **rs == '\n') (*rs)++;
    while (*re > *rs && (*re)[-1] == '\n') (*re)--;
    if (!m->reasoning) *given = *re > *rs;
    return c;
}

int akc_render_qwen3(const akc_ctx *c, ak_error *err) {
    sbuf *b = c->b;
    const ak_chat_msg *m = c->m;
    int n = c->n, i = 0;
    if (c->o->n_tools > 0) put_tools_system(c, c->r[0] == ROLE_SYSTEM ? m[i++].content : NULL, NULL, 0);
    /* the last real user query: assistant turns after it keep their reasoning */
    int last_query = n - 1;
    for (int k = n - 1; k >= 0; k--)
        if (c->r[k] == ROLE_USER && !starts_ends(m[k].content, "<tool_response>", "</tool_response>")) {
            last_query = k;
            break;
        }
    for (; i < n; i++) {
        if (c->r[i] == ROLE_TOOL) {
            put_tool_response(c, i);
            continue;
        }
        if (c->r[i] != ROLE_ASSISTANT) {
            akc_puts(b, "<|im_start|>");
            akc_puts(b, role_names[c->r[i]]);
            akc_puts(b, "\n");
            CONTENT(b, akc_puts(b, m[i].content));
            akc_puts(b, "<|im_end|>\n");
            continue;
        }
        const char *rs, *re;
        int given;
        const char *reply = qwen3_split(&m[i], &rs, &re, &given), *shown = reply;
        akc_mark_open(b, i);
        akc_puts(b, "<|im_start|>assistant\n");
        size_t turn = b->len;   /* a reply with calls: its span, think block and all */
        if (i > last_query && (i == n - 1 || given)) {
            akc_puts(b, "<think>\n");
            CONTENT(b, akc_putn(b, rs, (size_t)(re - rs)));
            akc_puts(b, "\n</think>\n\n");
            while (*shown == '\n') shown++;
        }
        if (m[i].n_calls == 0) {
            MSG_CONTENT(b, i, akc_puts(b, shown));
        } else {
            CONTENT(b, akc_puts(b, shown));
            for (int k = 0; k < m[i].n_calls; k++) {
                if (k > 0 || reply[0]) akc_puts(b, "\n");
                put_call_head(b, &m[i].calls[k]);
                put_args_raw_string(b, m[i].calls[k].arguments);
                akc_puts(b, "}\n</tool_call>");
            }
            if (b->spans) b->spans[i] = (ak_chat_span){.open = b->spans[i].open, .at = (long)turn, .end = (long)b->len};
        }
        akc_puts(b, "<|im_end|>\n");
    }
    if (c->gen) {
        akc_puts(b, "<|im_start|>assistant\n");
        if (c->o->think == AK_CHAT_THINK_OFF) akc_puts(b, "<think>\n\n</think>\n\n");
    }
    return 0;
}

/* ---- llama3 -------------------------------------------------------------------- */

int akc_render_llama3(const akc_ctx *c, ak_error *err) {
    sbuf *b = c->b;
    const ak_chat_msg *m = c->m;
    const char *tmpl = c->o->template_text;
    int v31 = !tmpl || strstr(tmpl, "Cutting Knowledge Date") != NULL, tools = c->o->n_tools > 0, i = 0;
    akc_puts(b, c->bos);
    if (v31) {
        akc_puts(b, "<|start_header_id|>system<|end_header_id|>\n\n");
        if (tools) akc_puts(b, "Environment: ipython\n");
        akc_puts(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
        akc_llama3_date(b, tmpl);
        akc_puts(b, "\n\n");
        if (c->r[0] == ROLE_SYSTEM) CONTENT(b, akc_put_trim(b, m[i++].content));
        akc_puts(b, "<|eot_id|>");
    }
    if (tools) {   /* in the first user message, as the template does by default */
        if (i >= c->n)
            return ak_failc(err, AK_ERR_INVALID, "chat: llama3 puts the tools in the first user message: there is none");
        akc_puts(b, "<|start_header_id|>user<|end_header_id|>\n\n"
                    "Given the following functions, please respond with a JSON for a function call with its "
                    "proper arguments that best answers the given prompt.\n\n"
                    "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name "
                    "and its value}.Do not use variables.\n\n");
        for (int k = 0; k < c->o->n_tools; k++) {
            put_tool(b, &c->o->tools[k], 4);
            akc_puts(b, "\n\n");
        }
        CONTENT(b, akc_put_trim(b, m[i].content ? m[i].content : ""));
        akc_puts(b, "<|eot_id|>");
        i++;
    }
    for (; i < c->n; i++) {
        if (c->r[i] == ROLE_TOOL) {   /* a string is iterable: the template prints it with tojson */
            ak_buf j = {0};
            akc_puts(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            ak_pyjson_dump_string(&j, m[i].content, strlen(m[i].content));
            put_buf(b, &j);
            akc_puts(b, "<|eot_id|>");
            continue;
        }
        akc_mark_open(b, i);
        if (m[i].n_calls == 0) {
            akc_puts(b, "<|start_header_id|>");
            akc_puts(b, role_names[c->r[i]]);
            akc_puts(b, "<|end_header_id|>\n\n");
            MSG_CONTENT(b, i, akc_put_trim(b, m[i].content));
            akc_puts(b, "<|eot_id|>");
            continue;
        }
        for (int k = 0; k < m[i].n_calls; k++) {   /* one call a turn */
            akc_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
            size_t at = b->len;
            akc_puts(b, "{\"name\": \"");
            CONTENT(b, akc_puts(b, m[i].calls[k].name));
            akc_puts(b, "\", \"parameters\": ");
            akc_put_tojson(b, m[i].calls[k].arguments, -1);
            akc_puts(b, "}");
            if (b->spans && m[i].n_calls == 1) b->spans[i].at = (long)at, b->spans[i].end = (long)b->len;
            akc_puts(b, "<|eot_id|>");
        }
    }
    if (c->gen) akc_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return 0;
}

/* ---- mistral ------------------------------------------------------------------- */

/* Appends a call id the template takes: id itself when it has nine bytes,
 * else nine letters and digits from its FNV-1a hash (the same for the same
 * id, so that a call and its result still match). */
static void put_mistral_id(sbuf *b, const char *id) {
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    if (!id) id = "";
    if (strlen(id) == 9) {
        CONTENT(b, akc_puts(b, id));
        return;
    }
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++) h = (h ^ *p) * 1099511628211ull;
    char out[9];
    for (int k = 0; k < 9; k++) {
        out[k] = digits[h % 62];
        h /= 62;
    }
    CONTENT(b, akc_putn(b, out, 9));
}

/* Nemo's "[AVAILABLE_TOOLS]": each member of the function object, a string
 * as it is between quotes, anything else tojson. */
static void put_available_tools(const akc_ctx *c) {
    sbuf *b = c->b;
    akc_puts(b, "[AVAILABLE_TOOLS][");
    for (int k = 0; k < c->o->n_tools; k++) {
        const ak_chat_tool *t = &c->o->tools[k];
        akc_puts(b, "{\"type\": \"function\", \"function\": {\"name\": \"");
        CONTENT(b, akc_puts(b, t->name));
        akc_puts(b, "\"");
        if (t->description) {
            akc_puts(b, ", \"description\": \"");
            CONTENT(b, akc_puts(b, t->description));
            akc_puts(b, "\"");
        }
        if (t->parameters) {
            ak_buf probe = {0};
            ak_error err = {0};
            int rc = ak_pyjson_reprint(&probe, t->parameters, strlen(t->parameters), -1, &err);
            akc_puts(b, ", \"parameters\": ");
            if (rc == 1) {   /* a string: as it is */
                akc_puts(b, "\"");
                CONTENT(b, akc_puts(b, t->parameters));
                akc_puts(b, "\"");
                ak_buf_free(&probe);
            } else {
                if (rc < 0) probe.failed = 1;
                put_buf(b, &probe);
            }
        }
        if (t->strict) akc_puts(b, t->strict > 0 ? ", \"strict\": true" : ", \"strict\": false");
        akc_puts(b, k + 1 < c->o->n_tools ? "}}, " : "}}]");
    }
    akc_puts(b, "[/AVAILABLE_TOOLS]");
}

/* A reply without calls: its text and eos, the turn's span recorded. */
static void put_mistral_reply(const akc_ctx *c, int i) {
    akc_mark_open(c->b, i);
    MSG_CONTENT(c->b, i, akc_puts(c->b, c->m[i].content));
    akc_puts(c->b, c->eos);
}

/* The end of the Jinja string literal opening at s (its quote char): the
 * closing quote, or NULL. */
static const char *literal_end(const char *s) {
    for (const char *p = s + 1; *p; p++) {
        if (*p == '\\' && p[1]) p++;
        else if (*p == *s) return p;
    }
    return NULL;
}

/* Mistral Small 3.2's default system message: the template's literal
 * `default_system_message = "..." + today + "..."`, with today's date. */
static void put_mistral_default_system(sbuf *b, const char *t, const char *today) {
    static const char key[] = "default_system_message = ", mid[] = " + today + ";
    const char *a = t ? strstr(t, key) : NULL, *e1 = a ? literal_end(a += sizeof key - 1) : NULL;
    if (!e1) return;
    akc_put_unescaped(b, a + 1, (size_t)(e1 - a - 1));
    const char *q = e1 + 1, *e2 = !strncmp(q, mid, sizeof mid - 1) ? literal_end(q += sizeof mid - 1) : NULL;
    if (!e2) return;
    akc_puts(b, today);
    akc_put_unescaped(b, q + 1, (size_t)(e2 - q - 1));
}

/* Mistral Small 3.2 (template with "[SYSTEM_PROMPT]"): the system prompt
 * (the first system message's, or the template's default) in
 * [SYSTEM_PROMPT], later system messages likewise; the tools as one JSON
 * list before the last user message (and any with its text); a call
 * "[TOOL_CALLS]N[CALL_ID]I[ARGS]A"; a result "[TOOL_RESULTS]I[TOOL_CONTENT]R
 * [/TOOL_RESULTS]"; no generation prompt. */
static int render_mistral_small(const akc_ctx *c) {
    sbuf *b = c->b;
    const ak_chat_msg *m = c->m;
    int i = 0, last_user = -1;
    akc_puts(b, c->bos);
    akc_puts(b, "[SYSTEM_PROMPT]");
    if (c->r[0] == ROLE_SYSTEM) CONTENT(b, akc_puts(b, m[i++].content));
    else put_mistral_default_system(b, c->o->template_text, c->o->today ? c->o->today : AK_CHAT_TODAY);
    akc_puts(b, "[/SYSTEM_PROMPT]");
    for (int k = i; k < c->n; k++)
        if (c->r[k] == ROLE_USER) last_user = k;
    for (; i < c->n; i++) {
        if (c->r[i] == ROLE_SYSTEM) {
            akc_puts(b, "[SYSTEM_PROMPT]");
            CONTENT(b, akc_puts(b, m[i].content));
            akc_puts(b, "[/SYSTEM_PROMPT]");
        } else if (c->r[i] == ROLE_USER) {
            if (c->o->n_tools > 0 && !strcmp(m[i].content, m[last_user].content)) {
                akc_puts(b, "[AVAILABLE_TOOLS][");
                for (int k = 0; k < c->o->n_tools; k++) {
                    if (k) akc_puts(b, ", ");
                    put_tool(b, &c->o->tools[k], -1);
                }
                akc_puts(b, "][/AVAILABLE_TOOLS]");
            }
            akc_puts(b, "[INST]");
            CONTENT(b, akc_puts(b, m[i].content));
            akc_puts(b, "[/INST]");
        } else if (c->r[i] == ROLE_TOOL) {
            akc_puts(b, "[TOOL_RESULTS]");
            put_mistral_id(b, m[i].tool_call_id);
            akc_puts(b, "[TOOL_CONTENT]");
            CONTENT(b, akc_puts(b, m[i].content));
            akc_puts(b, "[/TOOL_RESULTS]");
        } else if (m[i].n_calls > 0) {
            for (int k = 0; k < m[i].n_calls; k++) {
                akc_puts(b, "[TOOL_CALLS]");
                CONTENT(b, akc_puts(b, m[i].calls[k].name));
                akc_puts(b, "[CALL_ID]");
                put_mistral_id(b, m[i].calls[k].id);
                akc_puts(b, "[ARGS]");
                akc_put_tojson(b, m[i].calls[k].arguments, -1);
            }
            akc_puts(b, c->eos);
        } else {
            put_mistral_reply(c, i);
        }
    }
    return 0;
}

int akc_render_mistral(const akc_ctx *c, ak_error *err) {
    sbuf *b = c->b;
    const ak_chat_msg *m = c->m;
    int n = c->n;
    if (c->o->template_text && strstr(c->o->template_text, "[SYSTEM_PROMPT]")) return render_mistral_small(c);
    const char *sys = c->r[0] == ROLE_SYSTEM ? m[0].content : NULL;
    int first = sys ? 1 : 0, last_user = -1;
    for (int i = first; i < n; i++) {
        if (c->r[i] == ROLE_SYSTEM)
            return ak_fail(err, "chat: mistral accepts a system message only as the first "
                                "message (message %d is one)", i);
        if (c->r[i] == ROLE_USER) last_user = i;
    }
    akc_puts(b, c->bos);
    for (int i = first; i < n; i++) {
        if (c->r[i] == ROLE_USER) {
            /* the template compares messages: an earlier one with the same text gets the tools too */
            if (c->o->n_tools > 0 && !strcmp(m[i].content, m[last_user].content)) put_available_tools(c);
            akc_puts(b, "[INST]");
            b->content = 1;
            if (sys && i == n - 1) {
                akc_puts(b, sys);
                akc_puts(b, "\n\n");
            }
            akc_puts(b, m[i].content);
            b->content = 0;
            akc_puts(b, "[/INST]");
        } else if (c->r[i] == ROLE_TOOL) {
            akc_puts(b, "[TOOL_RESULTS]{\"content\": ");
            CONTENT(b, akc_puts(b, m[i].content));
            akc_puts(b, ", \"call_id\": \"");
            put_mistral_id(b, m[i].tool_call_id);
            akc_puts(b, "\"}[/TOOL_RESULTS]");
        } else if (m[i].n_calls > 0) {
            akc_puts(b, "[TOOL_CALLS][");
            for (int k = 0; k < m[i].n_calls; k++) {
                const ak_chat_call *call = &m[i].calls[k];
                ak_buf j = {0};
                ak_buf_puts(&j, "{\"name\": ");
                ak_pyjson_dump_string(&j, call->name, strlen(call->name));
                ak_buf_puts(&j, ", \"arguments\": ");
                put_buf(b, &j);
                akc_put_tojson(b, call->arguments, -1);
                akc_puts(b, ", \"id\": \"");
                put_mistral_id(b, call->id);
                akc_puts(b, k + 1 < m[i].n_calls ? "\"}, " : "\"}]");
            }
            akc_puts(b, c->eos);
        } else {
            put_mistral_reply(c, i);
        }
    }
    return 0;
}

/* ---- deepseek3 ----------------------------------------------------------------- */

#define DS_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DS_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define DS_EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>"
#define DS_OUTPUT_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_OUTPUT_END "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_OUTPUTS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_OUTPUTS_END "<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81" "end\xef\xbd\x9c>"

/* The tools as DeepSeek's model card lists them in the system prompt; R1's
 * call format in the instructions when r1. */
static void put_deepseek_tools(sbuf *b, const ak_chat_opts *o, int r1) {
    akc_puts(b, "## Tools\nYou have access to the following tools:\n");
    for (int k = 0; k < o->n_tools; k++) {
        const ak_chat_tool *t = &o->tools[k];
        akc_puts(b, "\n### ");
        CONTENT(b, akc_puts(b, t->name));
        akc_puts(b, "\nDescription: ");
        CONTENT(b, akc_puts(b, t->description));
        akc_puts(b, "\n\nParameters: ");
        akc_put_tojson(b, t->parameters, -1);
        akc_puts(b, "\n");
    }
    akc_puts(b, "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n" DS_CALLS_BEGIN DS_CALL_BEGIN);
    akc_puts(b, r1 ? "function" DS_SEP "tool_call_name\n```json\ntool_call_arguments\n```"
                   : "tool_call_name" DS_SEP "tool_call_arguments");
    akc_puts(b, DS_CALL_END "{{additional_tool_calls}}" DS_CALLS_END "\n\nWhere:\n\n"
                "- `tool_call_name` must be an exact match to one of the available tools\n"
                "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
                "- For multiple tool calls, chain them directly without separators or spaces\n");
}

/* The system prompt: every system message joined by a blank line (V3.1) or
 * the last one (R1), then the tools. */
static void put_deepseek_system(const akc_ctx *c, int r1) {
    sbuf *b = c->b;
    int last = -1, any = 0;
    for (int i = 0; i < c->n; i++)
        if (c->r[i] == ROLE_SYSTEM) last = i;
    for (int i = 0; i < c->n; i++) {
        if (c->r[i] != ROLE_SYSTEM || (r1 && i != last)) continue;
        if (any++) akc_puts(b, "\n\n");
        CONTENT(b, akc_puts(b, c->m[i].content));
    }
    if (c->o->n_tools > 0) {
        if (any) akc_puts(b, "\n\n");
        put_deepseek_tools(b, c->o, r1);
    }
}

/* The V3.1 template. */
static void render_deepseek_v31(const akc_ctx *c) {
    sbuf *b = c->b;
    const ak_chat_msg *m = c->m;
    int is_tool = 0, last_user = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->r[i] == ROLE_USER) {
            is_tool = 0;
            last_user = 1;
            akc_puts(b, DS_USER);
            CONTENT(b, akc_puts(b, m[i].content));
        } else if (c->r[i] == ROLE_TOOL) {
            last_user = 0;
            is_tool = 1;
            akc_puts(b, DS_OUTPUT_BEGIN);
            CONTENT(b, akc_puts(b, m[i].content));
            akc_puts(b, DS_OUTPUT_END);
        } else if (c->r[i] == ROLE_ASSISTANT) {
            if (last_user) {
                akc_mark_open(b, i);
                akc_puts(b, DS_ASSISTANT "<think></think>");
            }
            int after_user = last_user;
            last_user = 0;
            if (m[i].n_calls > 0) {
                is_tool = 0;
                size_t at = b->len;
                if (m[i].content) CONTENT(b, akc_puts(b, m[i].content));
                for (int k = 0; k < m[i].n_calls; k++) {
                    akc_puts(b, k ? DS_CALL_BEGIN : DS_CALLS_BEGIN DS_CALL_BEGIN);
                    CONTENT(b, akc_puts(b, m[i].calls[k].name));
                    akc_puts(b, DS_SEP);
                    akc_put_tojson(b, m[i].calls[k].arguments, -1);
                    akc_puts(b, DS_CALL_END);
                }
                akc_puts(b, DS_CALLS_END);
                if (b->spans && after_user) b->spans[i].at = (long)at, b->spans[i].end = (long)b->len;
                akc_puts(b, DS_EOS);
            } else if (is_tool) {
                is_tool = 0;
                CONTENT(b, akc_puts(b, m[i].content));
                akc_puts(b, DS_EOS);
            } else {
                const char *cut = strstr(m[i].content, "</think>");
                const char *reply = cut ? cut + 8 : m[i].content;
                if (after_user && reply == m[i].content) MSG_CONTENT(b, i, akc_puts(b, reply));
                else CONTENT(b, akc_puts(b, reply));
                akc_puts(b, DS_EOS);
            }
        }
    }
    if (c->gen && last_user && !is_tool)
        akc_puts(b, c->o->think == AK_CHAT_THINK_ON ? DS_ASSISTANT "<think>" : DS_ASSISTANT "<think></think>");
}

/* The R1 template; its first-call and first-result state lasts the whole
 * conversation, as the template's does. */
static void render_deepseek_r1(const akc_ctx *c) {
    sbuf *b = c->b;
    const ak_chat_msg *m = c->m;
    int is_first = 0, is_tool = 0, output_first = 1;
    for (int i = 0; i < c->n; i++) {
        if (c->r[i] == ROLE_USER) {
            is_tool = 0;
            akc_puts(b, DS_USER);
            CONTENT(b, akc_puts(b, m[i].content));
        } else if (c->r[i] == ROLE_TOOL) {
            is_tool = 1;
            akc_puts(b, output_first ? DS_OUTPUTS_BEGIN DS_OUTPUT_BEGIN : "\n" DS_OUTPUT_BEGIN);
            output_first = 0;
            CONTENT(b, akc_puts(b, m[i].content));
            akc_puts(b, DS_OUTPUT_END);
        } else if (c->r[i] == ROLE_ASSISTANT) {
            if (m[i].n_calls > 0) {
                is_tool = 0;
                for (int k = 0; k < m[i].n_calls; k++) {
                    akc_puts(b, is_first ? "\n" DS_CALL_BEGIN : DS_ASSISTANT DS_CALLS_BEGIN DS_CALL_BEGIN);
                    is_first = 1;
                    akc_puts(b, "function" DS_SEP);
                    CONTENT(b, akc_puts(b, m[i].calls[k].name));
                    akc_puts(b, "\n```json\n");
                    akc_put_tojson(b, m[i].calls[k].arguments, -1);
                    akc_puts(b, "\n```" DS_CALL_END);
                }
                akc_puts(b, DS_CALLS_END DS_EOS);
            }
            if (!m[i].content) continue;
            if (is_tool) {
                is_tool = 0;
                akc_puts(b, DS_OUTPUTS_END);
                CONTENT(b, akc_puts(b, m[i].content));
            } else {
                const char *cut = last_of(m[i].content, "</think>");
                const char *reply = cut ? cut + 8 : m[i].content;
                if (m[i].n_calls == 0) akc_mark_open(b, i);
                akc_puts(b, DS_ASSISTANT);
                if (m[i].n_calls == 0 && reply == m[i].content) MSG_CONTENT(b, i, akc_puts(b, reply));
                else CONTENT(b, akc_puts(b, reply));
            }
            akc_puts(b, DS_EOS);
        }
    }
    if (is_tool) akc_puts(b, DS_OUTPUTS_END);
    if (c->gen && !is_tool) {
        akc_puts(b, DS_ASSISTANT "<think>\n");
        const char *t = c->o->template_text;
        if (t && strstr(t, "enable_thinking") && c->o->think != AK_CHAT_THINK_ON) akc_puts(b, "</think>");
    }
}

int akc_render_deepseek3(const akc_ctx *c, ak_error *err) {
    const char *t = c->o->template_text;
    int r1 = t && !strstr(t, "is_last_user");
    akc_puts(c->b, c->bos);
    put_deepseek_system(c, r1);
    if (r1) render_deepseek_r1(c);
    else render_deepseek_v31(c);
    return 0;
}
