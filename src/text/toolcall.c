/* toolcall.c - content, reasoning and tool calls out of a streamed reply
 * (toolcall.h). */
#include "text/toolcall.h"

#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "text/pyjson.h"

#define HEAD_MAX 65536   /* a call's name and the members before its arguments: past this it is text */
#define NAME_MAX_LEN 512 /* mistral's and deepseek's names, in text */

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";
static const char HERMES_OPEN[] = "<tool_call>", HERMES_CLOSE[] = "</tool_call>";
static const char PY_TAG[] = "<|python_tag|>";
static const char M_CALLS[] = "[TOOL_CALLS]", M_ARGS[] = "[ARGS]", M_CALL_ID[] = "[CALL_ID]";
#define DS_BAR "\xef\xbd\x9c"
#define DS_SP "\xe2\x96\x81"
static const char DS_CALLS_BEGIN[] = "<" DS_BAR "tool" DS_SP "calls" DS_SP "begin" DS_BAR ">";
static const char DS_CALLS_END[] = "<" DS_BAR "tool" DS_SP "calls" DS_SP "end" DS_BAR ">";
static const char DS_CALL_BEGIN[] = "<" DS_BAR "tool" DS_SP "call" DS_SP "begin" DS_BAR ">";
static const char DS_CALL_END[] = "<" DS_BAR "tool" DS_SP "call" DS_SP "end" DS_BAR ">";
static const char DS_SEP[] = "<" DS_BAR "tool" DS_SP "sep" DS_BAR ">";

typedef enum { FMT_HERMES, FMT_LLAMA3, FMT_MISTRAL, FMT_DEEPSEEK } fmt_t;

typedef enum {
    S_START,       /* nothing decided yet: the reply may open with <think> or (llama3) a call */
    S_TEXT,        /* content */
    S_THINK,       /* reasoning */
    S_HEAD,        /* a JSON call object before its arguments' value */
    S_BUFFERED,    /* a JSON call object whose arguments come before its name: taken whole */
    S_ARGS,        /* a JSON call's arguments' value */
    S_TAIL,        /* the rest of a JSON call object after its arguments */
    S_HERMES_CLOSE,/* after a call object: "</tool_call>" */
    S_LLAMA_AFTER, /* after a llama3 call: another one, or text */
    S_MISTRAL,     /* after "[TOOL_CALLS]": "[" (a list) or a name */
    S_MISTRAL_LIST,/* between the objects of a list */
    S_MISTRAL_NAME,/* NAME[CALL_ID]ID[ARGS] */
    S_DS_BETWEEN,  /* between deepseek calls */
    S_DS_HEAD,     /* a deepseek call before its arguments */
    S_DS_ARGS      /* a deepseek call's arguments */
} state_t;

/* A JSON value scanned as it streams: where it ends. */
typedef struct {
    int started, depth, in_str, esc, scalar;
} jscan;

typedef struct {
    ak_toolcall_call pub;
    char *name;
    ak_buf args;
} call_t;

typedef struct {
    ak_toolcall_kind kind;
    int index;
    size_t off, len;   /* the text in the arena */
} raw_event;

struct ak_toolcall {
    ak_toolcall_opts o;
    fmt_t fmt;
    int think;            /* the family reasons in <think> */
    state_t st;
    ak_buf pend;          /* text received, not decided */
    ak_buf arena;         /* this feed's event texts */
    raw_event *raw;
    int n_raw, cap_raw;
    ak_toolcall_event *ev;
    int cap_ev;
    ak_buf content, reasoning;
    call_t *calls;
    int n_calls, cap_calls;
    int cur;              /* the call being parsed: its index, or -1 when dropped (parallel off) */
    jscan js;             /* the arguments' value, then (S_TAIL) the object around it */
    int tail_object;      /* the arguments sit in an object that S_TAIL closes */
    state_t after;        /* where a JSON call goes when its object is closed */
    int think_lead;       /* newlines right after <think> are still dropped */
    int content_lead;     /* newlines right after </think> are still dropped */
    int after_call;       /* content since the last call is whitespace so far */
    int r1;               /* the deepseek call has R1's form */
    int seam;             /* markup was taken out since the last event: the next starts anew */
    int finished, failed;
};

/* ---- output ----------------------------------------------------------------- */

static int raw_push(ak_toolcall *p, ak_toolcall_kind kind, int index, const char *s, size_t n) {
    raw_event *last = p->n_raw ? &p->raw[p->n_raw - 1] : NULL;
    int text = kind == AK_TOOLCALL_CONTENT || kind == AK_TOOLCALL_REASONING || kind == AK_TOOLCALL_ARGS;
    int seam = p->seam;
    p->seam = 0;
    if (text && !seam && last && last->kind == kind && last->index == index) {   /* one event: extend it */
        p->arena.len--;   /* its NUL */
        ak_buf_append(&p->arena, s, n);
        ak_buf_append(&p->arena, "", 1);
        last->len += n;
        return p->arena.failed ? -1 : 0;
    }
    if (p->n_raw == p->cap_raw) {
        int cap = p->cap_raw ? p->cap_raw * 2 : 8;
        raw_event *v = realloc(p->raw, sizeof *v * (size_t)cap);
        if (!v) return -1;
        p->raw = v;
        p->cap_raw = cap;
    }
    p->raw[p->n_raw++] = (raw_event){.kind = kind, .index = index, .off = p->arena.len, .len = n};
    ak_buf_append(&p->arena, s, n);
    ak_buf_append(&p->arena, "", 1);
    return p->arena.failed ? -1 : 0;
}

/* Content or reasoning text, the dropped leading newlines left out. */
static void emit_text(ak_toolcall *p, ak_toolcall_kind kind, const char *s, size_t n) {
    int *lead = kind == AK_TOOLCALL_REASONING ? &p->think_lead : &p->content_lead;
    if (*lead) {
        while (n && *s == '\n') s++, n--;
        if (n) *lead = 0;
    }
    if (!n) return;
    ak_buf_append(kind == AK_TOOLCALL_REASONING ? &p->reasoning : &p->content, s, n);
    if (raw_push(p, kind, 0, s, n) < 0) p->failed = 1;
}

static void consume(ak_toolcall *p, size_t n) { ak_buf_consume(&p->pend, n); }

/* A call begins: reported unless parallel calls are off and one is done. */
static void call_begin(ak_toolcall *p, const char *name, size_t len) {
    p->cur = -1;
    if (!p->o.parallel)
        for (int i = 0; i < p->n_calls; i++)
            if (p->calls[i].pub.complete) return;
    if (p->n_calls == p->cap_calls) {
        int cap = p->cap_calls ? p->cap_calls * 2 : 4;
        call_t *v = realloc(p->calls, sizeof *v * (size_t)cap);
        if (!v) {
            p->failed = 1;
            return;
        }
        p->calls = v;
        p->cap_calls = cap;
    }
    call_t *c = &p->calls[p->n_calls];
    *c = (call_t){.name = strndup(name, len)};
    if (!c->name) {
        p->failed = 1;
        return;
    }
    ak_toolcall_id(p->o.family, p->o.id_seed, p->n_calls, c->pub.id);
    c->pub.name = c->name;
    c->pub.arguments = "";
    p->cur = p->n_calls++;
    if (raw_push(p, AK_TOOLCALL_CALL_START, p->cur, "", 0) < 0) p->failed = 1;
}

static void call_args(ak_toolcall *p, const char *s, size_t n) {
    if (p->cur < 0 || !n) return;
    call_t *c = &p->calls[p->cur];
    if (ak_buf_append(&c->args, s, n) < 0 || raw_push(p, AK_TOOLCALL_ARGS, p->cur, s, n) < 0) p->failed = 1;
    c->pub.arguments = c->args.p;
    c->pub.len = c->args.len;
}

static void call_end(ak_toolcall *p, int complete) {
    if (p->cur < 0) return;
    p->calls[p->cur].pub.complete = complete;
    if (raw_push(p, AK_TOOLCALL_CALL_END, p->cur, "", 0) < 0) p->failed = 1;
    p->cur = -1;
    p->after_call = 1;
}

/* ---- text ---------------------------------------------------------------------- */

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int starts(const char *s, size_t n, const char *m) {
    size_t k = strlen(m);
    return n >= k && !memcmp(s, m, k);
}

/* s[0..n) is a proper prefix of m (more text may complete it). */
static int partial(const char *s, size_t n, const char *m) {
    size_t k = strlen(m);
    return n < k && !memcmp(s, m, n);
}

/* The earliest of markers m[0..k) in s[0..n): its position (*which set), or
 * -1 with *hold the length of the longest end of s that begins one. */
static long find_marker(const char *s, size_t n, const char *const *m, int k, int *which, size_t *hold) {
    long best = -1;
    for (int i = 0; i < k; i++) {
        const char *f = memmem(s, n, m[i], strlen(m[i]));
        if (f && (best < 0 || f - s < best)) {
            best = f - s;
            *which = i;
        }
    }
    *hold = 0;
    if (best >= 0) return best;
    for (int i = 0; i < k; i++) {
        size_t ml = strlen(m[i]);
        for (size_t h = ml - 1 < n ? ml - 1 : n; h > *hold; h--)
            if (!memcmp(s + n - h, m[i], h)) {
                *hold = h;
                break;
            }
    }
    return -1;
}

/* The call openers of the family, in text. */
static int openers(const ak_toolcall *p, const char **m) {
    if (!p->o.tools) return 0;
    switch (p->fmt) {
    case FMT_HERMES: m[0] = HERMES_OPEN; return 1;
    case FMT_LLAMA3: m[0] = PY_TAG; return 1;
    case FMT_MISTRAL: m[0] = M_CALLS; return 1;
    case FMT_DEEPSEEK: m[0] = DS_CALLS_BEGIN; m[1] = DS_CALL_BEGIN; return 2;
    }
    return 0;
}

static int st_text(ak_toolcall *p, int final) {
    const char *m[2];
    int k = openers(p, m), which = 0;
    size_t n = p->pend.len, hold;
    const char *s = p->pend.p;
    long at = find_marker(s, n, m, k, &which, &hold);
    size_t end = at >= 0 ? (size_t)at : final ? n : n - hold, keep = end;
    if (k) {
        /* whitespace before a call is dropped (the templates put it back),
         * held while undecided; at the reply's end it stays, unless all the
         * text after a call is whitespace */
        size_t t = end;
        while (t && is_ws(s[t - 1])) t--;
        keep = at >= 0 || !final ? t : p->after_call && t == 0 ? 0 : end;
    }
    if (keep) {
        emit_text(p, AK_TOOLCALL_CONTENT, s, keep);
        p->after_call = 0;
    }
    if (at < 0) {
        consume(p, final ? n : keep);
        return keep > 0 || (final && n > 0);
    }
    consume(p, (size_t)at + strlen(m[which]));
    switch (p->fmt) {
    case FMT_HERMES: p->st = S_HEAD; p->after = S_HERMES_CLOSE; break;
    case FMT_LLAMA3: p->st = S_HEAD; p->after = S_LLAMA_AFTER; break;
    case FMT_MISTRAL: p->st = S_MISTRAL; break;
    case FMT_DEEPSEEK: p->st = m[which] == DS_CALLS_BEGIN ? S_DS_BETWEEN : S_DS_HEAD; break;
    }
    return 1;
}

static int st_think(ak_toolcall *p, int final) {
    const char *m[1] = {THINK_CLOSE};
    int which;
    size_t n = p->pend.len, hold;
    const char *s = p->pend.p;
    long at = find_marker(s, n, m, 1, &which, &hold);
    size_t emit = at >= 0 ? (size_t)at : final ? n : n - hold, keep = emit;
    while (keep && s[keep - 1] == '\n') keep--;   /* dropped before </think>, held until then */
    emit_text(p, AK_TOOLCALL_REASONING, s, keep);
    if (at < 0) {
        consume(p, final ? n : keep);
        return keep > 0 || (final && n > 0);
    }
    consume(p, (size_t)at + sizeof THINK_CLOSE - 1);
    p->st = S_TEXT;
    p->content_lead = 1;
    return 1;
}

static int st_start(ak_toolcall *p, int final) {
    const char *s = p->pend.p;
    size_t n = p->pend.len, w = 0;
    while (w < n && is_ws(s[w])) w++;
    if (p->think && starts(s + w, n - w, THINK_OPEN)) {
        consume(p, w + sizeof THINK_OPEN - 1);
        p->st = S_THINK;
        p->think_lead = 1;
        return 1;
    }
    int llama = p->fmt == FMT_LLAMA3 && p->o.tools;
    if (llama && w < n && s[w] == '{') {
        p->st = S_HEAD;
        p->after = S_LLAMA_AFTER;
        return 1;
    }
    if (!final && ((p->think && partial(s + w, n - w, THINK_OPEN)) || (llama && w == n))) return 0;
    p->st = S_TEXT;
    return 1;
}

/* ---- JSON calls ------------------------------------------------------------------ */

/* Feeds c to the scanner: 1 when the value ends with c, 2 when it ended
 * before c (a number or literal), 0 when it goes on. */
static int jscan_push(jscan *j, char c) {
    if (!j->started) {
        if (is_ws(c)) return 0;
        j->started = 1;
        if (c == '{' || c == '[') j->depth = 1;
        else if (c == '"') j->in_str = 1;
        else j->scalar = 1;
        return 0;
    }
    if (j->scalar) return c == ',' || c == '}' || c == ']' || is_ws(c) ? 2 : 0;
    if (j->in_str) {
        if (j->esc) j->esc = 0;
        else if (c == '\\') j->esc = 1;
        else if (c == '"') {
            j->in_str = 0;
            if (j->depth == 0) return 1;
        }
        return 0;
    }
    if (c == '"') j->in_str = 1;
    else if (c == '{' || c == '[') j->depth++;
    else if ((c == '}' || c == ']') && --j->depth == 0) return 1;
    return 0;
}

/* Where the JSON value at s[i..n) ends: its length, 0 when it does not end
 * within n. */
static size_t value_len(const char *s, size_t i, size_t n) {
    jscan j = {0};
    for (size_t k = i; k < n; k++) {
        int r = jscan_push(&j, s[k]);
        if (r == 1) return k + 1 - i;
        if (r == 2) return k - i;
    }
    return 0;
}

enum { HEAD_FAIL = -1, HEAD_MORE = 0, HEAD_OK = 1, HEAD_NO_ARGS = 2, HEAD_ARGS_FIRST = 3 };

typedef struct {
    size_t name_at, name_len;   /* the name's JSON string token */
    size_t value_at;            /* the arguments' value (HEAD_OK), or the closing '}' (HEAD_NO_ARGS) */
} head;

static size_t skip_ws(const char *s, size_t i, size_t n) {
    while (i < n && is_ws(s[i])) i++;
    return i;
}

/* A call object's members up to its arguments' value, in s[0..n) (leading
 * whitespace allowed). llama: the first member must be "name", or "type"
 * with "function". */
static int parse_head(const char *s, size_t n, int llama, head *h) {
    size_t i = skip_ws(s, 0, n);
    int have_name = 0, first = 1;
    if (i == n) return HEAD_MORE;
    if (s[i++] != '{') return HEAD_FAIL;
    for (;;) {
        i = skip_ws(s, i, n);
        if (i == n) return HEAD_MORE;
        if (s[i] != '"') return HEAD_FAIL;
        size_t kl = value_len(s, i, n);
        if (!kl) return HEAD_MORE;
        const char *key = s + i + 1;
        size_t klen = kl - 2;
        i = skip_ws(s, i + kl, n);
        if (i == n) return HEAD_MORE;
        if (s[i++] != ':') return HEAD_FAIL;
        i = skip_ws(s, i, n);
        if (i == n) return HEAD_MORE;
#define KEY(lit) (klen == sizeof lit - 1 && !memcmp(key, lit, klen))
        if (KEY("name")) {
            if (s[i] != '"') return HEAD_FAIL;
            size_t vl = value_len(s, i, n);
            if (!vl) return HEAD_MORE;
            h->name_at = i;
            h->name_len = vl;
            have_name = 1;
            i += vl;
        } else if (KEY("arguments") || KEY("parameters")) {
            if (llama && first) return HEAD_FAIL;
            h->value_at = i;
            return have_name ? HEAD_OK : llama ? HEAD_FAIL : HEAD_ARGS_FIRST;
        } else {
            if (llama && first && !(KEY("type") && starts(s + i, n - i, "\"function\""))) {
                if (KEY("type") && partial(s + i, n - i, "\"function\"")) return HEAD_MORE;
                return HEAD_FAIL;
            }
            size_t vl = value_len(s, i, n);
            if (!vl) return HEAD_MORE;
            i += vl;
        }
#undef KEY
        first = 0;
        i = skip_ws(s, i, n);
        if (i == n) return HEAD_MORE;
        if (s[i] == '}' && have_name) {
            h->value_at = i;
            return HEAD_NO_ARGS;
        }
        if (s[i++] != ',') return HEAD_FAIL;
    }
}

/* Begins a call named by the JSON string token s[0..n). */
static void call_begin_json(ak_toolcall *p, const char *s, size_t n) {
    ak_pyjson doc;
    ak_error err = {0};
    if (ak_pyjson_parse(s, n, &doc, &err) < 0) {
        if (err.code == AK_ERR_NOMEM) p->failed = 1;
        call_begin(p, s + 1, n >= 2 ? n - 2 : 0);
        return;
    }
    call_begin(p, doc.v[0].s, doc.v[0].len);
    ak_pyjson_free(&doc);
}

/* A call that did not parse: its text is content (the opener left out). */
static int give_back(ak_toolcall *p) {
    p->st = S_TEXT;
    p->after_call = 0;
    return 1;
}

/* The decisions below look at a bounded prefix only, so that they do not
 * depend on how much text has come in one piece. */
static size_t upto(size_t n, size_t max) { return n < max ? n : max; }

static int st_head(ak_toolcall *p, int final) {
    head h = {0};
    int r = parse_head(p->pend.p, upto(p->pend.len, HEAD_MAX), p->after == S_LLAMA_AFTER, &h);
    if (r == HEAD_MORE && (final || p->pend.len >= HEAD_MAX)) r = final && p->after != S_LLAMA_AFTER ? -2 : HEAD_FAIL;
    switch (r) {
    case HEAD_MORE: return 0;
    case -2:   /* cut off before its name: dropped */
        consume(p, p->pend.len);
        p->st = S_TEXT;
        return 1;
    case HEAD_FAIL: return give_back(p);
    case HEAD_ARGS_FIRST: p->st = S_BUFFERED; return 1;
    case HEAD_NO_ARGS:
        call_begin_json(p, p->pend.p + h.name_at, h.name_len);
        call_args(p, "{}", 2);
        call_end(p, 1);
        consume(p, h.value_at + 1);
        p->st = p->after;
        return 1;
    default:
        call_begin_json(p, p->pend.p + h.name_at, h.name_len);
        consume(p, h.value_at);
        p->js = (jscan){0};
        p->tail_object = 1;
        p->st = S_ARGS;
        return 1;
    }
}

/* The arguments written as a JSON string: their text is the string's. */
static void args_from_string(ak_toolcall *p, const char *s, size_t n) {
    ak_pyjson doc;
    ak_error err = {0};
    if (ak_pyjson_parse(s, n, &doc, &err) < 0) {
        if (err.code == AK_ERR_NOMEM) p->failed = 1;
        call_args(p, s, n);
        return;
    }
    call_args(p, doc.v[0].s, doc.v[0].len);
    ak_pyjson_free(&doc);
}

static int st_args(ak_toolcall *p, int final) {
    if (!p->js.started) consume(p, skip_ws(p->pend.p, 0, p->pend.len));
    const char *s = p->pend.p;
    size_t n = p->pend.len, i = 0;
    if (n && !p->js.started && s[0] == '"') {   /* a string: taken whole */
        size_t vl = value_len(s, 0, n);
        if (!vl && !final) return 0;
        args_from_string(p, s, vl ? vl : n);
        consume(p, vl ? vl : n);
        call_end(p, vl > 0);
        p->js = (jscan){.started = 1, .depth = 1};
        p->st = p->tail_object ? S_TAIL : S_TEXT;
        return 1;
    }
    for (; i < n; i++) {
        int r = jscan_push(&p->js, s[i]);
        if (!r) continue;
        size_t end = r == 1 ? i + 1 : i;
        call_args(p, s, end);
        consume(p, end);
        call_end(p, 1);
        p->js = (jscan){.started = 1, .depth = 1};
        p->st = p->tail_object ? S_TAIL : S_TEXT;
        return 1;
    }
    call_args(p, s, n);   /* streamed as it comes */
    consume(p, n);
    if (final) {
        call_end(p, p->js.scalar);
        p->st = S_TEXT;
        return 1;
    }
    return n > 0;
}

static int st_tail(ak_toolcall *p, int final) {
    const char *s = p->pend.p;
    size_t n = p->pend.len;
    for (size_t i = 0; i < n; i++)
        if (jscan_push(&p->js, s[i]) == 1) {
            consume(p, i + 1);
            p->st = p->after;
            return 1;
        }
    consume(p, n);
    if (final) p->st = S_TEXT;
    return n > 0 || final;
}

/* A call object whose arguments came before its name: parsed whole. */
static int st_buffered(ak_toolcall *p, int final) {
    const char *s = p->pend.p;
    size_t n = p->pend.len, w = skip_ws(s, 0, upto(n, HEAD_MAX)), vl = value_len(s, w, upto(n, HEAD_MAX));
    if (!vl) {
        if (!final && n < HEAD_MAX) return 0;
        return give_back(p);
    }
    ak_pyjson doc;
    ak_error err = {0};
    if (ak_pyjson_parse(s + w, vl, &doc, &err) < 0) {
        if (err.code == AK_ERR_NOMEM) p->failed = 1;
        return give_back(p);
    }
    int name = ak_pyjson_get(&doc, 0, "name"), args = ak_pyjson_get(&doc, 0, "arguments");
    if (args < 0) args = ak_pyjson_get(&doc, 0, "parameters");
    if (name < 0 || doc.v[name].kind != AK_PYJSON_STRING) {
        ak_pyjson_free(&doc);
        return give_back(p);
    }
    call_begin(p, doc.v[name].s, doc.v[name].len);
    ak_buf a = {0};
    if (args >= 0 && doc.v[args].kind == AK_PYJSON_STRING) ak_buf_append(&a, doc.v[args].s, doc.v[args].len);
    else if (args >= 0) ak_pyjson_dump(&a, &doc, args, -1);
    else ak_buf_puts(&a, "{}");
    if (a.failed) p->failed = 1;
    else call_args(p, a.p, a.len);
    ak_buf_free(&a);
    ak_pyjson_free(&doc);
    call_end(p, 1);
    consume(p, w + vl);
    p->st = p->after;
    return 1;
}

/* Whitespace, then marker m, or a prefix of it when more may come. 1: m
 * consumed; 0: wait; -1: something else (the whitespace consumed). */
static int expect(ak_toolcall *p, const char *m, int final) {
    const char *s = p->pend.p;
    size_t n = p->pend.len, w = skip_ws(s, 0, n);
    if (starts(s + w, n - w, m)) {
        consume(p, w + strlen(m));
        return 1;
    }
    if (!final && partial(s + w, n - w, m)) return 0;
    consume(p, w);
    return -1;
}

static int st_hermes_close(ak_toolcall *p, int final) {
    int r = expect(p, HERMES_CLOSE, final);
    if (r == 0) return 0;
    p->st = S_TEXT;
    return 1;
}

static int st_llama_after(ak_toolcall *p, int final) {
    const char *s = p->pend.p;
    size_t n = p->pend.len, w = 0;
    while (w < n && (is_ws(s[w]) || s[w] == ';')) w++;
    if (w < n && s[w] == '{') {
        consume(p, w);
        p->st = S_HEAD;
        return 1;
    }
    if (starts(s + w, n - w, PY_TAG)) {
        consume(p, w + sizeof PY_TAG - 1);
        p->st = S_HEAD;
        return 1;
    }
    if (!final && (w == n || partial(s + w, n - w, PY_TAG))) return 0;
    consume(p, w);
    p->st = S_TEXT;
    return 1;
}

/* ---- mistral -------------------------------------------------------------------- */

static int st_mistral(ak_toolcall *p, int final) {
    const char *s = p->pend.p;
    size_t n = p->pend.len, w = skip_ws(s, 0, n);
    if (w == n && !final) return 0;
    if (w < n && s[w] == '[') {
        consume(p, w + 1);
        p->st = S_MISTRAL_LIST;
    } else {
        consume(p, w);
        p->st = S_MISTRAL_NAME;
    }
    return 1;
}

static int st_mistral_list(ak_toolcall *p, int final) {
    const char *s = p->pend.p;
    size_t n = p->pend.len, w = 0;
    while (w < n && (is_ws(s[w]) || s[w] == ',')) w++;
    if (w == n) {
        consume(p, w);
        if (final) p->st = S_TEXT;
        return final;
    }
    consume(p, w);
    if (p->pend.p[0] == ']') {
        consume(p, 1);
        p->st = S_TEXT;
    } else if (p->pend.p[0] == '{') {
        p->st = S_HEAD;
        p->after = S_MISTRAL_LIST;
    } else {
        return give_back(p);
    }
    return 1;
}

/* Where marker m begins in the pending text after off, within a name's
 * length; NULL with *rc 0 when more text may bring it, else the call given
 * back (*rc 1). */
static const char *name_end(ak_toolcall *p, size_t off, const char *m, int final, int *rc) {
    size_t n = p->pend.len - off;
    const char *f = memmem(p->pend.p + off, upto(n, NAME_MAX_LEN), m, strlen(m));
    if (!f) *rc = final || n >= NAME_MAX_LEN ? give_back(p) : 0;
    return f;
}

/* NAME[ARGS] or NAME[CALL_ID]ID[ARGS], then the arguments' value. */
static int st_mistral_name(ak_toolcall *p, int final) {
    const char *s = p->pend.p;
    int rc;
    const char *a = name_end(p, 0, M_ARGS, final, &rc);
    if (!a) return rc;
    const char *id = memmem(s, (size_t)(a - s), M_CALL_ID, sizeof M_CALL_ID - 1);
    const char *end = id ? id : a;
    while (end > s && is_ws(end[-1])) end--;
    call_begin(p, s, (size_t)(end - s));
    consume(p, (size_t)(a - s) + sizeof M_ARGS - 1);
    p->js = (jscan){0};
    p->tail_object = 0;
    p->st = S_ARGS;
    return 1;
}

/* ---- deepseek ------------------------------------------------------------------- */

static int st_ds_between(ak_toolcall *p, int final) {
    int r = expect(p, DS_CALL_BEGIN, final);
    if (r == 0) return 0;
    if (r == 1) {
        p->st = S_DS_HEAD;
        return 1;
    }
    r = expect(p, DS_CALLS_END, final);
    if (r == 0) return 0;
    p->st = S_TEXT;
    return 1;
}

/* NAME<sep> (V3.1) or function<sep>NAME\n```json\n (R1). */
static int st_ds_head(ak_toolcall *p, int final) {
    const char *s = p->pend.p;
    size_t n = p->pend.len;
    int rc;
    const char *sep = name_end(p, 0, DS_SEP, final, &rc);
    if (!sep) return rc;
    size_t at = (size_t)(sep - s) + sizeof DS_SEP - 1;
    const char *a = s, *z = sep;
    while (a < z && is_ws(*a)) a++;
    while (z > a && is_ws(z[-1])) z--;
    p->r1 = z - a == 8 && !memcmp(a, "function", 8);
    if (!p->r1) {
        call_begin(p, a, (size_t)(z - a));
        consume(p, at);
    } else {
        const char *nl = name_end(p, at, "\n", final, &rc);
        if (!nl) return rc;
        size_t after = (size_t)(nl - s) + 1;
        if (n - after < 8 && !final && partial(s + after, n - after, "```json\n")) return 0;
        call_begin(p, s + at, (size_t)(nl - s) - at);
        if (starts(s + after, n - after, "```json")) after += 7;
        if (after < n && s[after] == '\n') after++;
        consume(p, after);
    }
    p->st = S_DS_ARGS;
    return 1;
}

static int st_ds_args(ak_toolcall *p, int final) {
    const char *m[2] = {DS_CALL_END, DS_CALLS_END};
    int which = 0;
    size_t n = p->pend.len, hold;
    const char *s = p->pend.p;
    long at = find_marker(s, n, m, 2, &which, &hold);
    size_t emit = at >= 0 ? (size_t)at : final ? n : n - hold, keep = emit;
    if (p->r1) {   /* R1 closes its arguments with "\n```": held, dropped at the end */
        while (keep && (is_ws(s[keep - 1]) || s[keep - 1] == '`')) keep--;
    }
    call_args(p, s, keep);
    if (at < 0 && !final) {
        consume(p, keep);
        return keep > 0;
    }
    call_end(p, at >= 0);
    consume(p, at >= 0 ? (size_t)at + strlen(m[which]) : n);
    p->st = at >= 0 && which == 0 ? S_DS_BETWEEN : S_TEXT;
    return 1;
}

/* ---- the driver ------------------------------------------------------------------ */

static int step(ak_toolcall *p, int final) {
    switch (p->st) {
    case S_START: return st_start(p, final);
    case S_TEXT: return st_text(p, final);
    case S_THINK: return st_think(p, final);
    case S_HEAD: return st_head(p, final);
    case S_BUFFERED: return st_buffered(p, final);
    case S_ARGS: return st_args(p, final);
    case S_TAIL: return st_tail(p, final);
    case S_HERMES_CLOSE: return st_hermes_close(p, final);
    case S_LLAMA_AFTER: return st_llama_after(p, final);
    case S_MISTRAL: return st_mistral(p, final);
    case S_MISTRAL_LIST: return st_mistral_list(p, final);
    case S_MISTRAL_NAME: return st_mistral_name(p, final);
    case S_DS_BETWEEN: return st_ds_between(p, final);
    case S_DS_HEAD: return st_ds_head(p, final);
    case S_DS_ARGS: return st_ds_args(p, final);
    }
    return 0;
}

/* Runs the states over what is pending, then hands out the events. */
static int run(ak_toolcall *p, int final, const ak_toolcall_event **ev, ak_error *err) {
    for (;;) {
        state_t was = p->st;
        if (p->failed || !step(p, final)) break;
        if (p->st != was) p->seam = 1;   /* text on both sides of markup: two events */
    }
    if (p->failed || p->pend.failed) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    if (p->n_raw > p->cap_ev) {
        ak_toolcall_event *v = realloc(p->ev, sizeof *v * (size_t)p->n_raw);
        if (!v) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
        p->ev = v;
        p->cap_ev = p->n_raw;
    }
    for (int i = 0; i < p->n_raw; i++) {
        const raw_event *r = &p->raw[i];
        const call_t *c = r->kind == AK_TOOLCALL_CONTENT || r->kind == AK_TOOLCALL_REASONING ? NULL : &p->calls[r->index];
        p->ev[i] = (ak_toolcall_event){.kind = r->kind, .index = c ? r->index : 0, .text = p->arena.p + r->off,
                                       .len = r->len, .id = c ? c->pub.id : NULL, .name = c ? c->name : NULL};
    }
    *ev = p->ev;
    return p->n_raw;
}

/* ---- API ------------------------------------------------------------------------- */

ak_toolcall *ak_toolcall_new(const ak_toolcall_opts *o, ak_error *err) {
    ak_toolcall *p = ak_calloc(1, sizeof *p, err);
    if (!p) return NULL;
    p->o = *o;
    switch (o->family) {
    case AK_CHAT_LLAMA3: p->fmt = FMT_LLAMA3; break;
    case AK_CHAT_MISTRAL: p->fmt = FMT_MISTRAL; break;
    case AK_CHAT_DEEPSEEK3: p->fmt = FMT_DEEPSEEK; break;
    default: p->fmt = FMT_HERMES; break;
    }
    p->think = o->family == AK_CHAT_QWEN3 || o->family == AK_CHAT_DEEPSEEK3;
    p->st = o->in_reasoning ? S_THINK : S_START;
    p->think_lead = o->in_reasoning;
    p->cur = -1;
    if (ak_buf_reserve(&p->pend, 256) < 0) {   /* never NULL: the states read it */
        ak_failc(err, AK_ERR_NOMEM, "out of memory");
        ak_toolcall_free(p);
        return NULL;
    }
    return p;
}

void ak_toolcall_free(ak_toolcall *p) {
    if (!p) return;
    for (int i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        ak_buf_free(&p->calls[i].args);
    }
    free(p->calls);
    free(p->raw);
    free(p->ev);
    ak_buf_free(&p->pend);
    ak_buf_free(&p->arena);
    ak_buf_free(&p->content);
    ak_buf_free(&p->reasoning);
    free(p);
}

int ak_toolcall_feed(ak_toolcall *p, const char *text, size_t len, const ak_toolcall_event **ev, ak_error *err) {
    p->n_raw = 0;
    ak_buf_clear(&p->arena);
    *ev = p->ev;
    if (p->finished) return 0;
    if (ak_buf_append(&p->pend, text, len) < 0) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    return run(p, 0, ev, err);
}

int ak_toolcall_finish(ak_toolcall *p, const ak_toolcall_event **ev, ak_error *err) {
    p->n_raw = 0;
    ak_buf_clear(&p->arena);
    *ev = p->ev;
    if (p->finished) return 0;
    p->finished = 1;
    return run(p, 1, ev, err);
}

const char *ak_toolcall_content(const ak_toolcall *p, size_t *len) {
    if (len) *len = p->content.len;
    return p->content.p ? p->content.p : "";
}

const char *ak_toolcall_reasoning(const ak_toolcall *p, size_t *len) {
    if (len) *len = p->reasoning.len;
    return p->reasoning.p ? p->reasoning.p : "";
}

int ak_toolcall_n_calls(const ak_toolcall *p) { return p->n_calls; }

const ak_toolcall_call *ak_toolcall_get(const ak_toolcall *p, int i) {
    return i >= 0 && i < p->n_calls ? &p->calls[i].pub : NULL;
}

int ak_toolcall_done(const ak_toolcall *p) {
    if (p->o.parallel) return 0;
    for (int i = 0; i < p->n_calls; i++)
        if (p->calls[i].pub.complete) return 1;
    return 0;
}

/* splitmix64: a well-mixed 64-bit stream from a counter. */
static uint64_t mix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void ak_toolcall_id(ak_chat_family f, uint64_t seed, int index, char *out) {
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    uint64_t x = seed ^ (0xD6E8FEB86659FD93ull * (uint64_t)(index + 1)), z = 0;
    int n = f == AK_CHAT_MISTRAL ? 9 : 24, k = 0;
    if (f != AK_CHAT_MISTRAL) {
        memcpy(out, "call_", 5);
        k = 5;
    }
    for (int i = 0; i < n; i++) {
        if (i % 8 == 0) z = mix(&x);   /* 62^8 < 2^64: eight digits a draw */
        out[k++] = digits[z % 62];
        z /= 62;
    }
    out[k] = '\0';
}
