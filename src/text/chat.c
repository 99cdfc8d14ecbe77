/* chat.c - native renderers for the chat-template families (see chat.h). */
#include "text/chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- growable output buffer ------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
    int failed;          /* an allocation failed; later appends are no-ops */
    /* Segments: with track set, mask[i] is 1 for bytes that came from a
     * message (content) and 0 for the template's own markup. */
    int track, content;
    uint8_t *mask;
    /* Spans: where each assistant message's turn opens and its content
     * lands (ak_chat_rendering); NULL when not wanted. */
    ak_chat_span *spans;
} sbuf;

static void sb_putn(sbuf *b, const char *s, size_t n) {
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

static void sb_puts(sbuf *b, const char *s) { if (s) sb_putn(b, s, strlen(s)); }

/* Runs an append as message content (see sbuf.mask). */
#define CONTENT(b, stmt) do { (b)->content = 1; stmt; (b)->content = 0; } while (0)

/* Message i's turn opens here (its opening markup follows). */
static void mark_open(sbuf *b, int i) {
    if (b->spans) b->spans[i].open = (long)b->len;
}

/* CONTENT, recording where message i's content lands. */
#define MSG_CONTENT(b, i, stmt) do {                                             \
        size_t at_ = (b)->len;                                                   \
        CONTENT(b, stmt);                                                        \
        if ((b)->spans) { (b)->spans[i].at = (long)at_; (b)->spans[i].end = (long)(b)->len; } \
    } while (0)

static int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Appends s with ASCII whitespace stripped from both ends (Jinja trim). */
static void sb_put_trim(sbuf *b, const char *s) {
    size_t n = strlen(s), a = 0;
    while (a < n && is_ws(s[a])) a++;
    while (n > a && is_ws(s[n - 1])) n--;
    sb_putn(b, s + a, n - a);
}

/* ---- roles --------------------------------------------------------------- */

typedef enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT } role_t;

/* Checks every message and fills roles[]; -1 with err set on a bad one. */
static int classify(const ak_chat_msg *msgs, int n, role_t *roles, ak_error *err) {
    for (int i = 0; i < n; i++) {
        if (!msgs[i].role) return ak_fail(err, "chat: message %d has no role", i);
        if (!msgs[i].content) return ak_fail(err, "chat: message %d has no content", i);
        if (strcmp(msgs[i].role, "system") == 0) roles[i] = ROLE_SYSTEM;
        else if (strcmp(msgs[i].role, "user") == 0) roles[i] = ROLE_USER;
        else if (strcmp(msgs[i].role, "assistant") == 0) roles[i] = ROLE_ASSISTANT;
        else
            return ak_fail(err, "chat: message %d has unknown role \"%.64s\" "
                                "(expected system, user or assistant)", i, msgs[i].role);
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
    if (has(t, n, "'Assistant: ' + message['content'] + eos_token")) return AK_CHAT_DEEPSEEK2;
    return AK_CHAT_PLAIN;
}

/* Copies the Jinja string-literal text s[0..n) into b, undoing the escapes
 * \n, \t, \\, \' and \". */
static void sb_put_unescaped(sbuf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n) {
            char c = s[++i];
            char o = c == 'n' ? '\n' : c == 't' ? '\t' : c;
            sb_putn(b, &o, 1);
        } else {
            sb_putn(b, &s[i], 1);
        }
    }
}

/* Finds a literal default system message in a ChatML template: the text
 * between "<|im_start|>system\n" (escaped or real newline) and "<|im_end|>"
 * inside one string literal (no quotes, braces or '+' in between). Appends
 * the whole default system turn to b and returns 1 if found, else 0. */
static int chatml_default_system(sbuf *b, const char *t) {
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
        sb_puts(b, "<|im_start|>system\n");
        sb_put_unescaped(b, s, len);
        sb_puts(b, "<|im_end|>\n");
        return 1;
    }
    return 0;
}

/* Appends the Llama 3.1/3.2 date: the template's literal default
 * (`date_string = "..."`) if present, else AK_CHAT_LLAMA3_DATE. */
static void llama3_date(sbuf *b, const char *t) {
    static const char key[] = "date_string = \"";
    const char *p = t ? strstr(t, key) : NULL;
    if (p) {
        p += sizeof key - 1;
        const char *e = strchr(p, '"');
        if (e && e > p && e - p < 64 && !memchr(p, '\n', (size_t)(e - p))) {
            sb_putn(b, p, (size_t)(e - p));
            return;
        }
    }
    sb_puts(b, AK_CHAT_LLAMA3_DATE);
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
    "llama3", "chatml", "llama2", "mistral", "gemma", "phi3", "qwen3", "gemma3", "deepseek2", "plain",
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
                        "llama2, mistral, gemma, phi3, qwen3, gemma3, deepseek2 or plain)", name);
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
    }
    return "";
}

/* ---- renderers -------------------------------------------------------------- */

static const char *const role_names[] = { "system", "user", "assistant" };

static void render_llama3(sbuf *b, const ak_chat_msg *m, const role_t *r, int n, int gen,
                          const char *bos, const char *tmpl) {
    int v31 = !tmpl || strstr(tmpl, "Cutting Knowledge Date") != NULL;
    int i = 0;
    sb_puts(b, bos);
    if (v31) {
        sb_puts(b, "<|start_header_id|>system<|end_header_id|>\n\n"
                   "Cutting Knowledge Date: December 2023\nToday Date: ");
        llama3_date(b, tmpl);
        sb_puts(b, "\n\n");
        if (r[0] == ROLE_SYSTEM) CONTENT(b, sb_put_trim(b, m[i++].content));
        sb_puts(b, "<|eot_id|>");
    }
    for (; i < n; i++) {
        mark_open(b, i);
        sb_puts(b, "<|start_header_id|>");
        sb_puts(b, role_names[r[i]]);
        sb_puts(b, "<|end_header_id|>\n\n");
        MSG_CONTENT(b, i, sb_put_trim(b, m[i].content));
        sb_puts(b, "<|eot_id|>");
    }
    if (gen) sb_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void render_chatml(sbuf *b, const ak_chat_msg *m, const role_t *r, int n, int gen,
                          const char *tmpl) {
    if (r[0] != ROLE_SYSTEM) chatml_default_system(b, tmpl);
    for (int i = 0; i < n; i++) {
        mark_open(b, i);
        sb_puts(b, "<|im_start|>");
        sb_puts(b, role_names[r[i]]);
        sb_puts(b, "\n");
        MSG_CONTENT(b, i, sb_puts(b, m[i].content));
        sb_puts(b, "<|im_end|>\n");
    }
    if (gen) sb_puts(b, "<|im_start|>assistant\n");
}

static void render_llama2(sbuf *b, const ak_chat_msg *m, const role_t *r, int n,
                          const char *bos, const char *eos) {
    const char *sys = r[0] == ROLE_SYSTEM ? m[0].content : NULL;
    int first = sys ? 1 : 0;
    for (int i = first; i < n; i++) {
        if (r[i] == ROLE_SYSTEM) continue;   /* the template ignores later ones */
        sbuf c = {0};
        if (i == first && sys) {
            sb_puts(&c, "<<SYS>>\n");
            sb_puts(&c, sys);
            sb_puts(&c, "\n<</SYS>>\n\n");
        }
        sb_puts(&c, m[i].content);
        if (c.failed) { b->failed = 1; free(c.p); return; }
        const char *text = c.p ? c.p : "";
        if (r[i] == ROLE_USER) {
            sb_puts(b, bos);
            sb_puts(b, "[INST] ");
            CONTENT(b, sb_put_trim(b, text));
            sb_puts(b, " [/INST]");
        } else {
            mark_open(b, i);
            sb_puts(b, " ");
            MSG_CONTENT(b, i, sb_put_trim(b, text));
            sb_puts(b, " ");
            sb_puts(b, eos);
        }
        free(c.p);
    }
}

static int render_mistral(sbuf *b, const ak_chat_msg *m, const role_t *r, int n,
                          const char *bos, const char *eos, ak_error *err) {
    const char *sys = r[0] == ROLE_SYSTEM ? m[0].content : NULL;
    int first = sys ? 1 : 0;
    for (int i = first; i < n; i++)
        if (r[i] == ROLE_SYSTEM)
            return ak_fail(err, "chat: mistral accepts a system message only as the first "
                                "message (message %d is one)", i);
    sb_puts(b, bos);
    for (int i = first; i < n; i++) {
        if (r[i] == ROLE_USER) {
            sb_puts(b, "[INST]");
            b->content = 1;
            if (sys && i == n - 1) {
                sb_puts(b, sys);
                sb_puts(b, "\n\n");
            }
            sb_puts(b, m[i].content);
            b->content = 0;
            sb_puts(b, "[/INST]");
        } else {
            mark_open(b, i);
            MSG_CONTENT(b, i, sb_puts(b, m[i].content));
            sb_puts(b, eos);
        }
    }
    return 0;
}

/* One turn; i is the message whose content it shows alone (-1: a user turn,
 * which may carry pending system text). */
static void gemma_turn(sbuf *b, int i, const char *role, const char *pending, const char *content) {
    if (i >= 0) mark_open(b, i);
    sb_puts(b, "<start_of_turn>");
    sb_puts(b, role);
    sb_puts(b, "\n");
    if (pending && content) {
        sbuf c = {0};
        sb_puts(&c, pending);
        sb_puts(&c, "\n\n");
        sb_puts(&c, content);
        if (c.failed) b->failed = 1;
        else CONTENT(b, sb_put_trim(b, c.p));
        free(c.p);
    } else if (i >= 0) {
        MSG_CONTENT(b, i, sb_put_trim(b, content));
    } else {
        CONTENT(b, sb_put_trim(b, pending ? pending : content));
    }
    sb_puts(b, "<end_of_turn>\n");
}

static void render_gemma(sbuf *b, const ak_chat_msg *m, const role_t *r, int n, int gen,
                         const char *bos) {
    const char *pending = NULL;   /* system text waiting for the next user turn */
    sbuf acc = {0};               /* joins several pending system messages */
    sb_puts(b, bos);
    for (int i = 0; i < n; i++) {
        if (r[i] == ROLE_SYSTEM) {
            if (pending) {
                sb_puts(&acc, "\n\n");
                sb_puts(&acc, m[i].content);
            } else {
                acc.len = 0;
                if (acc.p) acc.p[0] = '\0';
                sb_puts(&acc, m[i].content);
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
    if (gen) sb_puts(b, "<start_of_turn>model\n");
}

static void render_gemma3(sbuf *b, const ak_chat_msg *m, const role_t *r, int n, int gen, const char *bos) {
    static const char *const shown[] = { "system", "user", "model" };
    const char *prefix = r[0] == ROLE_SYSTEM ? m[0].content : NULL;
    sb_puts(b, bos);
    if (prefix && n == 1) {   /* the template would drop it */
        sb_puts(b, "<start_of_turn>user\n");
        CONTENT(b, sb_put_trim(b, prefix));
        sb_puts(b, "<end_of_turn>\n");
    }
    for (int i = prefix ? 1 : 0; i < n; i++) {
        mark_open(b, i);
        sb_puts(b, "<start_of_turn>");
        sb_puts(b, shown[r[i]]);
        sb_puts(b, "\n");
        if (prefix && i == 1) {
            CONTENT(b, sb_puts(b, prefix));
            sb_puts(b, "\n\n");
        }
        MSG_CONTENT(b, i, sb_put_trim(b, m[i].content));
        sb_puts(b, "<end_of_turn>\n");
    }
    if (gen) sb_puts(b, "<start_of_turn>model\n");
}

static void render_phi3(sbuf *b, const ak_chat_msg *m, const role_t *r, int n, int gen,
                        const char *eos) {
    for (int i = 0; i < n; i++) {
        if (r[i] == ROLE_SYSTEM && m[i].content[0] == '\0') continue;
        mark_open(b, i);
        sb_puts(b, "<|");
        sb_puts(b, role_names[r[i]]);
        sb_puts(b, "|>\n");
        MSG_CONTENT(b, i, sb_puts(b, m[i].content));
        sb_puts(b, "<|end|>\n");
    }
    sb_puts(b, gen ? "<|assistant|>\n" : eos);
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

static void render_qwen3(sbuf *b, const ak_chat_msg *m, const role_t *r, int n, int gen) {
    /* the last real user query: assistant turns after it keep their reasoning */
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--)
        if (r[i] == ROLE_USER && !starts_ends(m[i].content, "<tool_response>", "</tool_response>")) {
            last_query = i;
            break;
        }
    for (int i = 0; i < n; i++) {
        const char *c = m[i].content;
        if (r[i] != ROLE_ASSISTANT) {
            sb_puts(b, "<|im_start|>");
            sb_puts(b, role_names[r[i]]);
            sb_puts(b, "\n");
            CONTENT(b, sb_puts(b, c));
            sb_puts(b, "<|im_end|>\n");
            continue;
        }
        /* reasoning [rs, re): before the first </think>, after the last
         * <think> in that part; the content follows the last </think> */
        const char *rs = c, *re = c, *close = strstr(c, "</think>");
        if (close) {
            re = close;
            for (const char *p = c; (p = strstr(p, "<think>")) != NULL && p < close; p++) rs = p + 7;
            c = last_of(c, "</think>") + 8;
            while (*c == '\n') c++;
        }
        while (rs < re && *rs == '\n') rs++;
        while (re > rs && re[-1] == '\n') re--;
        mark_open(b, i);
        sb_puts(b, "<|im_start|>assistant\n");
        if (i > last_query && (i == n - 1 || re > rs)) {
            sb_puts(b, "<think>\n");
            CONTENT(b, sb_putn(b, rs, (size_t)(re - rs)));
            sb_puts(b, "\n</think>\n\n");
            while (*c == '\n') c++;
        }
        MSG_CONTENT(b, i, sb_puts(b, c));
        sb_puts(b, "<|im_end|>\n");
    }
    if (gen) sb_puts(b, "<|im_start|>assistant\n");
}

/* DeepSeek-V2's template (see chat.h). */
static void render_deepseek2(sbuf *b, const ak_chat_msg *m, const role_t *r, int n, int gen, const char *bos,
                             const char *eos) {
    static const char *const label[] = { "", "User: ", "Assistant: " };
    sb_puts(b, bos);
    for (int i = 0; i < n; i++) {
        mark_open(b, i);
        sb_puts(b, label[r[i]]);
        MSG_CONTENT(b, i, sb_puts(b, m[i].content));
        sb_puts(b, r[i] == ROLE_ASSISTANT ? eos : "\n\n");
    }
    if (gen) sb_puts(b, "Assistant:");
}

static void render_plain(sbuf *b, const ak_chat_msg *m, const role_t *r, int n, int gen,
                         const char *bos) {
    static const char *const label[] = { "System: ", "User: ", "Assistant: " };
    sb_puts(b, bos);
    for (int i = 0; i < n; i++) {
        /* A reply generated after "Assistant:" starts with its own space;
         * echoed back as is it must not get a second one, or the agent's
         * cached reply would no longer match its own re-rendered tokens. */
        mark_open(b, i);
        if (r[i] == ROLE_ASSISTANT && m[i].content[0] == ' ') sb_puts(b, "Assistant:");
        else sb_puts(b, label[r[i]]);
        MSG_CONTENT(b, i, sb_puts(b, m[i].content));
        sb_puts(b, "\n");
    }
    if (gen) sb_puts(b, "Assistant:");
}

/* Renders into b (its track flag chosen by the caller). Returns 0, or -1
 * with err set; b is the caller's to free either way. */
static int render(const ak_chat_msg *msgs, int n, const ak_chat_opts *o, sbuf *b, ak_error *err) {
    if (!msgs || n < 1) return ak_fail(err, "chat: no messages to render");
    if (!o) return ak_fail(err, "chat: no rendering options");
    ak_chat_family f = o->family;
    if ((int)f < 0 || (int)f >= N_FAMILIES)
        return ak_fail(err, "chat: unknown template family %d", (int)f);
    const char *bos = o->bos ? o->bos : "", *eos = o->eos ? o->eos : "", *tmpl = o->template_text;
    role_t *roles = ak_malloc((size_t)n * sizeof *roles, err);
    if (!roles) return -1;
    if (classify(msgs, n, roles, err) != 0) { free(roles); return -1; }

    int gen = o->add_generation_prompt != 0;
    int rc = 0;
    switch (f) {
    case AK_CHAT_LLAMA3: render_llama3(b, msgs, roles, n, gen, bos, tmpl); break;
    case AK_CHAT_CHATML: render_chatml(b, msgs, roles, n, gen, tmpl); break;
    case AK_CHAT_LLAMA2: render_llama2(b, msgs, roles, n, bos, eos); break;
    case AK_CHAT_MISTRAL: rc = render_mistral(b, msgs, roles, n, bos, eos, err); break;
    case AK_CHAT_GEMMA: render_gemma(b, msgs, roles, n, gen, bos); break;
    case AK_CHAT_PHI3: render_phi3(b, msgs, roles, n, gen, eos); break;
    case AK_CHAT_QWEN3: render_qwen3(b, msgs, roles, n, gen); break;
    case AK_CHAT_GEMMA3: render_gemma3(b, msgs, roles, n, gen, bos); break;
    case AK_CHAT_DEEPSEEK2: render_deepseek2(b, msgs, roles, n, gen, bos, eos); break;
    case AK_CHAT_PLAIN: render_plain(b, msgs, roles, n, gen, bos); break;
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
