/* chat.c - native renderers for the chat-template families (see chat.h). */
#include "text/chat_impl.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- growable output buffer (chat_impl.h) ---------------------------- */

void akc_putn(sbuf *b, const char *s, size_t n) {
    if (b->failed || n == 0) return;
    if (n > SIZE_MAX / 4 - b->len) { b->failed = 1; return; }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) { b->failed = 1; return; }
        b->p = q;
        if (b->track) {
            uint8_t *m = realloc(b->mask, cap);
            if (!m) { b->failed = 1; return; }
            b->mask = m;
        }
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    if (b->track) memset(b->mask + b->len, b->content ? 1 : 0, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void akc_puts(sbuf *b, const char *s) { if (s) akc_putn(b, s, strlen(s)); }

static int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

void akc_put_trim(sbuf *b, const char *s) {
    size_t n = strlen(s), a = 0;
    while (a < n && is_ws(s[a])) a++;
    while (n > a && is_ws(s[n - 1])) n--;
    akc_putn(b, s + a, n - a);
}

/* ---- roles --------------------------------------------------------------- */

/* Checks every message and fills roles[]; -1 with err set on a bad one. */
static int classify(const ak_chat_msg *msgs, int n, role_t *roles, ak_error *err) {
    for (int i = 0; i < n; i++) {
        if (!msgs[i].role) return ak_fail(err, "chat: message %d has no role", i);
        if (strcmp(msgs[i].role, "system") == 0) roles[i] = ROLE_SYSTEM;
        else if (strcmp(msgs[i].role, "user") == 0) roles[i] = ROLE_USER;
        else if (strcmp(msgs[i].role, "assistant") == 0) roles[i] = ROLE_ASSISTANT;
        else if (strcmp(msgs[i].role, "tool") == 0) roles[i] = ROLE_TOOL;
        else
            return ak_fail(err, "chat: message %d has unknown role \"%.64s\" "
                                "(expected system, user, assistant or tool)", i, msgs[i].role);
        if (msgs[i].n_calls < 0 || (msgs[i].n_calls > 0 && (!msgs[i].calls || roles[i] != ROLE_ASSISTANT)))
            return ak_fail(err, "chat: message %d: tool calls belong to an assistant message", i);
        for (int k = 0; k < msgs[i].n_calls; k++)
            if (!msgs[i].calls[k].name) return ak_fail(err, "chat: message %d: call %d has no name", i, k);
        if (!msgs[i].content && !msgs[i].n_calls) return ak_fail(err, "chat: message %d has no content", i);
    }
    return 0;
}

/* ---- template inspection ----------------------------------------------- */

static int has(const char *t, size_t n, const char *needle) {
    return memmem(t, n, needle, strlen(needle)) != NULL;
}

static ak_chat_family detect_n(const char *t, size_t n) {
    if (!t || n == 0) return AK_CHAT_PLAIN;
    if (has(t, n, "<|start_header_id|>")) return AK_CHAT_LLAMA3;
    if (has(t, n, "<|im_start|>"))
        return has(t, n, "reasoning_content") && has(t, n, "</think>") ? AK_CHAT_QWEN3 : AK_CHAT_CHATML;
    if (has(t, n, "<start_of_turn>")) return has(t, n, "first_user_prefix") ? AK_CHAT_GEMMA3 : AK_CHAT_GEMMA;
    if (has(t, n, "<|user|>") && has(t, n, "<|end|>")) return AK_CHAT_PHI3;
    if (has(t, n, "[INST]")) return has(t, n, "<<SYS>>") ? AK_CHAT_LLAMA2 : AK_CHAT_MISTRAL;
    if (has(t, n, "<\xef\xbd\x9cUser\xef\xbd\x9c>")) return AK_CHAT_DEEPSEEK3;
    if (has(t, n, "'Assistant: ' + message['content'] + eos_token")) return AK_CHAT_DEEPSEEK2;
    return AK_CHAT_PLAIN;
}

void akc_put_unescaped(sbuf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n) {
            char c = s[++i];
            char o = c == 'n' ? '\n' : c == 't' ? '\t' : c;
            akc_putn(b, &o, 1);
        } else {
            akc_putn(b, &s[i], 1);
        }
    }
}

int akc_chatml_default_system(const char *t, const char **text, size_t *n) {
    static const char open[] = "<|im_start|>system";
    const char *p = t;
    while (t && (p = strstr(p, open)) != NULL) {
        p += sizeof open - 1;
        const char *s;
        if (p[0] == '\\' && p[1] == 'n') s = p + 2;
        else if (p[0] == '\n') s = p + 1;
        else continue;
        const char *e = strstr(s, "<|im_end|>");
        if (!e || e == s) continue;
        size_t len = (size_t)(e - s);
        if (memchr(s, '\'', len) || memchr(s, '"', len) || memchr(s, '{', len) ||
            memchr(s, '}', len) || memchr(s, '+', len))
            continue;
        *text = s;
        *n = len;
        return 1;
    }
    return 0;
}

void akc_llama3_date(sbuf *b, const char *t) {
    static const char key[] = "date_string = \"";
    const char *p = t ? strstr(t, key) : NULL;
    if (p) {
        p += sizeof key - 1;
        const char *e = strchr(p, '"');
        if (e && e > p && e - p < 64 && !memchr(p, '\n', (size_t)(e - p))) {
            akc_putn(b, p, (size_t)(e - p));
            return;
        }
    }
    akc_puts(b, AK_CHAT_LLAMA3_DATE);
}

/* ---- public API ----------------------------------------------------------- */

ak_chat_family ak_chat_detect(const char *template_text) {
    return template_text ? detect_n(template_text, strlen(template_text)) : AK_CHAT_PLAIN;
}

ak_chat_family ak_chat_detect_gguf(const gguf_file *f) {
    const gguf_kv *kv = f ? gguf_find(f, "tokenizer.chat_template") : NULL;
    if (!kv || kv->type != GGUF_TYPE_STRING) return AK_CHAT_PLAIN;
    return detect_n(kv->v.str.data, (size_t)kv->v.str.len);
}

char *ak_chat_template_gguf(const gguf_file *f, ak_error *err) {
    const gguf_kv *kv = f ? gguf_find(f, "tokenizer.chat_template") : NULL;
    if (!kv || kv->type != GGUF_TYPE_STRING) return NULL;
    size_t n = (size_t)kv->v.str.len;
    char *s = ak_malloc(n + 1, err);
    if (!s) return NULL;
    memcpy(s, kv->v.str.data, n);
    s[n] = '\0';
    return s;
}

static const char *const family_names[] = {
    "llama3", "chatml", "llama2", "mistral", "gemma", "phi3", "qwen3", "gemma3", "deepseek2", "plain", "deepseek3",
};
#define N_FAMILIES ((int)(sizeof family_names / sizeof family_names[0]))

const char *ak_chat_family_name(ak_chat_family f) {
    return (int)f >= 0 && (int)f < N_FAMILIES ? family_names[f] : "unknown";
}

int ak_chat_family_parse(const char *name, ak_chat_family *out, ak_error *err) {
    if (!name) return ak_fail(err, "chat: no template family name given");
    for (int i = 0; i < N_FAMILIES; i++) {
        if (strcasecmp(name, family_names[i]) == 0) {
            *out = (ak_chat_family)i;
            return 0;
        }
    }
    return ak_fail(err, "chat: unknown template family \"%.64s\" (expected llama3, chatml, "
                        "llama2, mistral, gemma, phi3, qwen3, gemma3, deepseek2, plain or deepseek3)", name);
}

const char *ak_chat_end_of_turn(ak_chat_family f) {
    switch (f) {
    case AK_CHAT_LLAMA3: return "<|eot_id|>";
    case AK_CHAT_CHATML: return "<|im_end|>";
    case AK_CHAT_QWEN3: return "<|im_end|>";
    case AK_CHAT_LLAMA2: return "</s>";
    case AK_CHAT_MISTRAL: return "</s>";
    case AK_CHAT_GEMMA: return "<end_of_turn>";
    case AK_CHAT_GEMMA3: return "<end_of_turn>";
    case AK_CHAT_PHI3: return "<|end|>";
    case AK_CHAT_DEEPSEEK2: return "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
    case AK_CHAT_PLAIN: return "\nUser:";
    case AK_CHAT_DEEPSEEK3: return "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
    }
    return "";
}

/* ---- renderers -------------------------------------------------------------- */

static const char *const role_names[] = { "system", "user", "assistant", "tool" };

static void render_llama2(sbuf *b, const ak_chat_msg *m, const role_t *r, int n,
                          const char *bos, const char *eos) {
    const char *sys = r[0] == ROLE_SYSTEM ? m[0].content : NULL;
    int first = sys ? 1 : 0;
    for (int i = first; i < n; i++) {
        if (r[i] == ROLE_SYSTEM) continue;   /* the template ignores later ones */
        sbuf c = {0};
        if (i == first && sys) {
            akc_puts(&c, "<<SYS>>\n");
            akc_puts(&c, sys);
            akc_puts(&c, "\n<</SYS>>\n\n");
        }
        akc_puts(&c, m[i].content);
        if (c.failed) { b->failed = 1; free(c.p); return; }
        const char *text = c.p ? c.p : "";
        if (r[i] == ROLE_USER) {
            akc_puts(b, bos);
            akc_puts(b, "[INST] ");
            CONTENT(b, akc_put_trim(b, text));
            akc_puts(b, " [/INST]");
        } else {
            akc_mark_open(b, i);
            akc_puts(b, " ");
            MSG_CONTENT(b, i, akc_put_trim(b, text));
            akc_puts(b, " ");
            akc_puts(b, eos);
        }
        free(c.p);
    }
}

/* One turn; i is the message whose content it shows alone (-1: a user turn,
 * which may carry pending system text). */
static void gemma_turn(sbuf *b, int i, const char *role, const char *pending, const char *content) {
    if (i >= 0) akc_mark_open(b, i);
    akc_puts(b, "<start_of_turn>");
    akc_puts(b, role);
    akc_puts(b, "\n");
    if (pending && content) {
        sbuf c = {0};
        akc_puts(&c, pending);
        akc_puts(&c, "\n\n");
        akc_puts(&c, content);
        if (c.failed) b->failed = 1;
        else CONTENT(b, akc_put_trim(b, c.p));
        free(c.p);
    } else if (i >= 0) {
        MSG_CONTENT(b, i, akc_put_trim(b, content));
    } else {
        CONTENT(b, akc_put_trim(b, pending ? pending : content));
    }
    akc_puts(b, "<end_of_turn>\n");
}

static void render_gemma(sbuf *b, const ak_chat_msg *m, const role_t *r, int n, int gen,
                         const char *bos) {
    const char *pending = NULL;   /* system text waiting for the next user turn */
    sbuf acc = {0};               /* joins several pending system messages */
    akc_puts(b, bos);
    for (int i = 0; i < n; i++) {
        if (r[i] == ROLE_SYSTEM) {
            if (pending) {
                akc_puts(&acc, "\n\n");
                akc_puts(&acc, m[i].content);
            } else {
                acc.len = 0;
                if (acc.p) acc.p[0] = '\0';
                akc_puts(&acc, m[i].content);
            }
            if (acc.failed) { b->failed = 1; break; }
            pending = acc.p ? acc.p : "";
        } else if (r[i] == ROLE_USER) {
            gemma_turn(b, -1, "user", pending, m[i].content);
            pending = NULL;
        } else {
            gemma_turn(b, i, "model", NULL, m[i].content);
        }
    }
    if (pending) gemma_turn(b, -1, "user", pending, NULL);
    free(acc.p);
    if (gen) akc_puts(b, "<start_of_turn>model\n");
}

static void render_gemma3(sbuf *b, const ak_chat_msg *m, const role_t *r, int n, int gen, const char *bos) {
    static const char *const shown[] = { "system", "user", "model" };
    const char *prefix = r[0] == ROLE_SYSTEM ? m[0].content : NULL;
    akc_puts(b, bos);
    if (prefix && n == 1) {   /* the template would drop it */
        akc_puts(b, "<start_of_turn>user\n");
        CONTENT(b, akc_put_trim(b, prefix));
        akc_puts(b, "<end_of_turn>\n");
    }
    for (int i = prefix ? 1 : 0; i < n; i++) {
        akc_mark_open(b, i);
        akc_puts(b, "<start_of_turn>");
        akc_puts(b, shown[r[i]]);
        akc_puts(b, "\n");
        if (prefix && i == 1) {
            CONTENT(b, akc_puts(b, prefix));
            akc_puts(b, "\n\n");
        }
        MSG_CONTENT(b, i, akc_put_trim(b, m[i].content));
        akc_puts(b, "<end_of_turn>\n");
    }
    if (gen) akc_puts(b, "<start_of_turn>model\n");
}

static void render_phi3(sbuf *b, const ak_chat_msg *m, const role_t *r, int n, int gen,
                        const char *eos) {
    for (int i = 0; i < n; i++) {
        if (r[i] == ROLE_SYSTEM && m[i].content[0] == '\0') continue;
        akc_mark_open(b, i);
        akc_puts(b, "<|");
        akc_puts(b, role_names[r[i]]);
        akc_puts(b, "|>\n");
        MSG_CONTENT(b, i, akc_puts(b, m[i].content));
        akc_puts(b, "<|end|>\n");
    }
    akc_puts(b, gen ? "<|assistant|>\n" : eos);
}

/* DeepSeek-V2's template (see chat.h). */
static void render_deepseek2(sbuf *b, const ak_chat_msg *m, const role_t *r, int n, int gen, const char *bos,
                             const char *eos) {
    static const char *const label[] = { "", "User: ", "Assistant: " };
    akc_puts(b, bos);
    for (int i = 0; i < n; i++) {
        akc_mark_open(b, i);
        akc_puts(b, label[r[i]]);
        MSG_CONTENT(b, i, akc_puts(b, m[i].content));
        akc_puts(b, r[i] == ROLE_ASSISTANT ? eos : "\n\n");
    }
    if (gen) akc_puts(b, "Assistant:");
}

static void render_plain(sbuf *b, const ak_chat_msg *m, const role_t *r, int n, int gen,
                         const char *bos) {
    static const char *const label[] = { "System: ", "User: ", "Assistant: " };
    akc_puts(b, bos);
    for (int i = 0; i < n; i++) {
        /* A reply generated after "Assistant:" starts with its own space;
         * echoed back as is it must not get a second one, or the agent's
         * cached reply would no longer match its own re-rendered tokens. */
        akc_mark_open(b, i);
        if (r[i] == ROLE_ASSISTANT && m[i].content[0] == ' ') akc_puts(b, "Assistant:");
        else akc_puts(b, label[r[i]]);
        MSG_CONTENT(b, i, akc_puts(b, m[i].content));
        akc_puts(b, "\n");
    }
    if (gen) akc_puts(b, "Assistant:");
}

/* ---- the documented format of the families without tool markup ---------- */

/* A conversation rewritten as system, user and assistant messages (chat.h,
 * "others"). */
typedef struct {
    ak_chat_msg *m;
    role_t *r;
    int *from;      /* the message each one is, unchanged; -1 for one made here */
    char **own;     /* the texts made here, n_own of them */
    int n, n_own;
} generic_conv;

static void generic_free(generic_conv *g) {
    for (int i = 0; i < g->n_own; i++) free(g->own[i]);
    free(g->own);
    free(g->m);
    free(g->r);
    free(g->from);
}

/* Appends a message made of t's text (taken over; "" when t is empty). */
static void generic_push(generic_conv *g, role_t r, sbuf *t, int *failed) {
    if (t->failed || (!t->p && !(t->p = calloc(1, 1)))) {
        *failed = 1;
        free(t->p);
        return;
    }
    static const char *const names[] = { "system", "user", "assistant", "tool" };
    g->own[g->n_own++] = t->p;
    g->m[g->n] = (ak_chat_msg){.role = names[r], .content = t->p};
    g->r[g->n] = r;
    g->from[g->n++] = -1;
}

/* Builds g from the conversation c renders. Returns 0, or -1 with err set
 * (out of memory). */
static int generic_build(const akc_ctx *c, generic_conv *g, ak_error *err) {
    int n = c->n, failed = 0, i = 0;
    memset(g, 0, sizeof *g);
    g->m = calloc((size_t)n + 1, sizeof *g->m);
    g->r = calloc((size_t)n + 1, sizeof *g->r);
    g->from = calloc((size_t)n + 1, sizeof *g->from);
    g->own = calloc((size_t)n + 1, sizeof *g->own);
    if (!g->m || !g->r || !g->from || !g->own) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    if (c->o->n_tools > 0) {
        sbuf t = {0};
        if (c->r[0] == ROLE_SYSTEM) {
            akc_puts(&t, c->m[i++].content);
            akc_puts(&t, "\n\n");
        }
        akc_put_tools_block(&t, c->o);
        generic_push(g, ROLE_SYSTEM, &t, &failed);
    }
    for (; i < n && !failed; i++) {
        const ak_chat_msg *m = &c->m[i];
        sbuf t = {0};
        if (c->r[i] == ROLE_TOOL) {
            for (; i < n && c->r[i] == ROLE_TOOL; i++) {   /* consecutive results: one message */
                if (t.len) akc_puts(&t, "\n");
                akc_puts(&t, "<tool_response>\n");
                akc_puts(&t, c->m[i].content);
                akc_puts(&t, "\n</tool_response>");
            }
            i--;
            generic_push(g, ROLE_USER, &t, &failed);
        } else if (m->n_calls > 0) {
            akc_puts(&t, m->content);
            for (int k = 0; k < m->n_calls; k++) {
                if (t.len) akc_puts(&t, "\n");
                akc_puts(&t, "<tool_call>\n{\"name\": \"");
                akc_puts(&t, m->calls[k].name);
                akc_puts(&t, "\", \"arguments\": ");
                akc_put_tojson(&t, m->calls[k].arguments, -1);
                akc_puts(&t, "}\n</tool_call>");
            }
            generic_push(g, ROLE_ASSISTANT, &t, &failed);
        } else {
            g->m[g->n] = *m;
            g->r[g->n] = c->r[i];
            g->from[g->n++] = i;
        }
    }
    return failed ? ak_failc(err, AK_ERR_NOMEM, "out of memory") : 0;
}

/* 1 when c has tools, calls or results. */
static int uses_tools(const akc_ctx *c) {
    if (c->o->n_tools > 0) return 1;
    for (int i = 0; i < c->n; i++)
        if (c->r[i] == ROLE_TOOL || c->m[i].n_calls > 0) return 1;
    return 0;
}

/* The families without tool markup of their own, on c's messages. */
static void render_simple(const akc_ctx *c) {
    sbuf *b = c->b;
    const ak_chat_msg *m = c->m;
    const role_t *r = c->r;
    int n = c->n, gen = c->gen;
    switch (c->o->family) {
    case AK_CHAT_LLAMA2: render_llama2(b, m, r, n, c->bos, c->eos); break;
    case AK_CHAT_GEMMA: render_gemma(b, m, r, n, gen, c->bos); break;
    case AK_CHAT_PHI3: render_phi3(b, m, r, n, gen, c->eos); break;
    case AK_CHAT_GEMMA3: render_gemma3(b, m, r, n, gen, c->bos); break;
    case AK_CHAT_DEEPSEEK2: render_deepseek2(b, m, r, n, gen, c->bos, c->eos); break;
    default: render_plain(b, m, r, n, gen, c->bos); break;
    }
}

/* A family without tool markup, in the documented format when the
 * conversation has tools: its messages rewritten, spans mapped back to the
 * messages left as they were. Returns 0, or -1 with err set. */
static int render_generic(const akc_ctx *c, ak_error *err) {
    if (!uses_tools(c)) {
        render_simple(c);
        return 0;
    }
    generic_conv g;
    int rc = generic_build(c, &g, err);
    ak_chat_span *spans = c->b->spans, *tmp = NULL;
    if (rc == 0 && spans) {
        if (!(tmp = malloc(sizeof *tmp * (size_t)(g.n ? g.n : 1)))) rc = ak_failc(err, AK_ERR_NOMEM, "out of memory");
        for (int k = 0; tmp && k < g.n; k++) tmp[k] = (ak_chat_span){.open = -1, .at = -1, .end = -1};
    }
    if (rc == 0 && g.n > 0) {
        akc_ctx gc = *c;
        gc.m = g.m;
        gc.r = g.r;
        gc.n = g.n;
        c->b->spans = tmp;
        render_simple(&gc);
        c->b->spans = spans;
        for (int k = 0; spans && k < g.n; k++)
            if (g.from[k] >= 0) spans[g.from[k]] = tmp[k];
    }
    free(tmp);
    generic_free(&g);
    return rc;
}

/* Renders into b (its track flag chosen by the caller). Returns 0, or -1
 * with err set; b is the caller's to free either way. */
static int render(const ak_chat_msg *msgs, int n, const ak_chat_opts *o, sbuf *b, ak_error *err) {
    if (!msgs || n < 1) return ak_fail(err, "chat: no messages to render");
    if (!o) return ak_fail(err, "chat: no rendering options");
    ak_chat_family f = o->family;
    if ((int)f < 0 || (int)f >= N_FAMILIES)
        return ak_fail(err, "chat: unknown template family %d", (int)f);
    if (o->n_tools < 0 || (o->n_tools > 0 && !o->tools)) return ak_fail(err, "chat: a tool list without tools");
    for (int k = 0; k < o->n_tools; k++)
        if (!o->tools[k].name) return ak_fail(err, "chat: tool %d has no name", k);
    role_t *roles = ak_malloc((size_t)n * sizeof *roles, err);
    if (!roles) return -1;
    if (classify(msgs, n, roles, err) != 0) { free(roles); return -1; }

    const akc_ctx c = {.b = b, .m = msgs, .r = roles, .n = n, .o = o, .bos = o->bos ? o->bos : "",
                       .eos = o->eos ? o->eos : "", .gen = o->add_generation_prompt != 0};
    int rc;
    switch (f) {
    case AK_CHAT_LLAMA3: rc = akc_render_llama3(&c, err); break;
    case AK_CHAT_CHATML: rc = akc_render_chatml(&c, err); break;
    case AK_CHAT_MISTRAL: rc = akc_render_mistral(&c, err); break;
    case AK_CHAT_QWEN3: rc = akc_render_qwen3(&c, err); break;
    case AK_CHAT_DEEPSEEK3: rc = akc_render_deepseek3(&c, err); break;
    default: rc = render_generic(&c, err); break;
    }
    free(roles);
    if (rc == 0 && b->failed) rc = ak_fail(err, "chat: out of memory rendering the prompt");
    return rc;
}

int ak_chat_render(const ak_chat_msg *msgs, int n, const ak_chat_opts *o, char **out, ak_error *err) {
    *out = NULL;
    sbuf b = {0};
    int rc = render(msgs, n, o, &b, err);
    if (rc == 0 && !b.p) {   /* rendered nothing: still return "" */
        b.p = malloc(1);
        if (b.p) b.p[0] = '\0';
        else rc = ak_fail(err, "chat: out of memory rendering the prompt");
    }
    if (rc != 0) { free(b.p); return -1; }
    *out = b.p;
    return 0;
}

int ak_chat_tokenize(const ak_chat_msg *msgs, int n, const ak_chat_opts *o, const ak_tokenizer *tok, int flags,
                     int32_t **ids, size_t *n_ids, ak_error *err) {
    *ids = NULL;
    *n_ids = 0;
    sbuf b = {.track = 1};
    ak_chat_opts bare;
    if (o) {   /* the tokenizer adds BOS/EOS */
        bare = *o;
        bare.bos = bare.eos = NULL;
    }
    int rc = render(msgs, n, o ? &bare : NULL, &b, err);
    if (rc == 0)
        rc = ak_tokenize_masked(tok, b.p ? b.p : "", b.len, flags | AK_TOK_PARSE_SPECIAL, b.mask, ids, n_ids, err);
    free(b.p);
    free(b.mask);
    return rc;
}

void ak_chat_rendering_free(ak_chat_rendering *r) {
    if (!r) return;
    free(r->text);
    free(r->plain);
    free(r->spans);
    free(r->gen_prompt);
    memset(r, 0, sizeof *r);
}

/* The text the generation prompt appends in family f: the difference
 * between one user message rendered with and without it. Returns a
 * malloc'd string, or NULL with err set. */
static char *gen_prompt_text(const ak_chat_opts *o, ak_error *err) {
    const ak_chat_msg probe = {.role = "user", .content = "x"};
    ak_chat_opts on = *o, off = *o;
    on.add_generation_prompt = 1;
    off.add_generation_prompt = 0;
    on.bos = on.eos = off.bos = off.eos = NULL;
    on.tools = off.tools = NULL;   /* no family's generation prompt depends on them */
    on.n_tools = off.n_tools = 0;
    char *with = NULL, *without = NULL, *out = NULL;
    if (ak_chat_render(&probe, 1, &on, &with, err) == 0 && ak_chat_render(&probe, 1, &off, &without, err) == 0) {
        size_t lw = strlen(without);
        /* every family appends the prompt to the same text; phi3 without it
         * appends eos, which is "" here */
        if (strncmp(with, without, lw)) ak_fail(err, "chat: the generation prompt of %s is not a suffix", ak_chat_family_name(o->family));
        else if (!(out = strdup(with + lw))) ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    free(with);
    free(without);
    return out;
}

int ak_chat_reasoning_open(const ak_chat_opts *o) {
    ak_error err = {0};
    char *gp = o ? gen_prompt_text(o, &err) : NULL;
    if (!gp) return 0;
    const char *open = NULL, *close = NULL;
    for (const char *p = gp; (p = strstr(p, "<think>")) != NULL; p++) open = p;
    for (const char *p = gp; (p = strstr(p, "</think>")) != NULL; p++) close = p;
    int in = open && (!close || close < open);
    free(gp);
    return in;
}

int ak_chat_render_tracked(const ak_chat_msg *msgs, int n, const ak_chat_opts *o, ak_chat_rendering *out,
                           ak_error *err) {
    memset(out, 0, sizeof *out);
    if (n < 1 || !msgs) return ak_fail(err, "chat: no messages to render");
    if (!o) return ak_fail(err, "chat: no rendering options");
    ak_chat_opts bare = *o;
    bare.bos = bare.eos = NULL;
    bare.add_generation_prompt = 1;
    sbuf b = {.track = 1};
    if (!(b.spans = ak_malloc(sizeof *b.spans * (size_t)n, err))) return -1;
    for (int i = 0; i < n; i++) b.spans[i] = (ak_chat_span){.open = -1, .at = -1, .end = -1};
    int rc = render(msgs, n, &bare, &b, err);
    if (rc == 0 && !b.p) {   /* nothing rendered: an empty text, still owned */
        b.p = calloc(1, 1);
        b.mask = calloc(1, 1);
        if (!b.p || !b.mask) rc = ak_fail(err, "chat: out of memory rendering the prompt");
    }
    if (rc == 0 && !(out->gen_prompt = gen_prompt_text(&bare, err))) rc = -1;
    if (rc != 0) {
        free(b.p);
        free(b.mask);
        free(b.spans);
        ak_chat_rendering_free(out);
        return -1;
    }
    out->text = b.p;
    out->len = b.len;
    out->plain = b.mask;
    out->spans = b.spans;
    out->n = n;
    return 0;
}
