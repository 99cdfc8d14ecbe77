/* pyjson.c - JSON as Python's json module reads and prints it (pyjson.h). */
#include "text/pyjson.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 512

typedef struct {
    const char *p, *end;
    ak_pyjson *doc;
    char *out;          /* next free byte of the arena */
    int nomem;
} parser;

static void skip_ws(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

/* A new node of the given kind; -1 when out of memory. */
static int new_node(parser *ps, ak_pyjson_kind kind) {
    ak_pyjson *d = ps->doc;
    if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 16;
        ak_pyjson_node *v = realloc(d->v, sizeof *v * (size_t)cap);
        if (!v) {
            ps->nomem = 1;
            return -1;
        }
        d->v = v;
        d->cap = cap;
    }
    d->v[d->n] = (ak_pyjson_node){.kind = kind, .first = -1, .next = -1};
    return d->n++;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Four hex digits at p (p + 4 <= end checked by the caller); -1 if not hex. */
static long hex4(const char *p) {
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p[i]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

static char *put_utf8(char *o, unsigned long cp) {
    if (cp < 0x80) {
        *o++ = (char)cp;
    } else if (cp < 0x800) {
        *o++ = (char)(0xC0 | cp >> 6);
        *o++ = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *o++ = (char)(0xE0 | cp >> 12);
        *o++ = (char)(0x80 | (cp >> 6 & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *o++ = (char)(0xF0 | cp >> 18);
        *o++ = (char)(0x80 | (cp >> 12 & 0x3F));
        *o++ = (char)(0x80 | (cp >> 6 & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
    }
    return o;
}

/* Decodes the string at ps->p (its opening quote) into the arena: *s, *len.
 * Returns 0, or -1 when it is not a JSON string json.loads takes. */
static int parse_string(parser *ps, const char **s, size_t *len) {
    const char *p = ps->p + 1;
    char *o = ps->out, *start = o;
    for (;;) {
        if (p >= ps->end) return -1;
        unsigned char c = (unsigned char)*p;
        if (c == '"') break;
        if (c < 0x20) return -1;
        if (c != '\\') {
            *o++ = (char)c;
            p++;
            continue;
        }
        if (p + 1 >= ps->end) return -1;
        char e = p[1];
        p += 2;
        switch (e) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            long cp = ps->end - p >= 4 ? hex4(p) : -1;
            if (cp < 0) return -1;
            p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return -1;   /* a low surrogate alone */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                long lo = ps->end - p >= 6 && p[0] == '\\' && p[1] == 'u' ? hex4(p + 2) : -1;
                if (lo < 0xDC00 || lo > 0xDFFF) return -1;
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            o = put_utf8(o, (unsigned long)cp);
            break;
        }
        default: return -1;
        }
    }
    ps->p = p + 1;
    ps->out = o;
    *s = start;
    *len = (size_t)(o - start);
    return 0;
}

/* A number at ps->p by json's grammar; the node's text is the source's. */
static int parse_number(parser *ps) {
    const char *p = ps->p, *start = p;
    int is_float = 0;
    if (p < ps->end && *p == '-') p++;
    if (p >= ps->end) return -1;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (p < ps->end && *p >= '0' && *p <= '9') p++;
    else return -1;
    if (p + 1 < ps->end && *p == '.' && p[1] >= '0' && p[1] <= '9') {
        is_float = 1;
        p++;
        while (p < ps->end && *p >= '0' && *p <= '9') p++;
    }
    if (p < ps->end && (*p == 'e' || *p == 'E')) {
        const char *q = p + 1;
        if (q < ps->end && (*q == '+' || *q == '-')) q++;
        if (q < ps->end && *q >= '0' && *q <= '9') {
            is_float = 1;
            while (q < ps->end && *q >= '0' && *q <= '9') q++;
            p = q;
        }
    }
    int i = new_node(ps, is_float ? AK_PYJSON_FLOAT : AK_PYJSON_INT);
    if (i < 0) return -1;
    ps->doc->v[i].s = start;
    ps->doc->v[i].len = (size_t)(p - start);
    ps->p = p;
    return i;
}

static int keycmp(const ak_pyjson_node *a, const ak_pyjson_node *b) {
    size_t n = a->klen < b->klen ? a->klen : b->klen;
    int c = memcmp(a->key, b->key, n);
    return c ? c : (a->klen > b->klen) - (a->klen < b->klen);
}

typedef struct {
    const ak_pyjson_node *v;
    int idx;
} member_ref;

static int cmp_member(const void *x, const void *y) {
    const member_ref *a = x, *b = y;
    int c = keycmp(a->v + a->idx, b->v + b->idx);
    return c ? c : (a->idx > b->idx) - (a->idx < b->idx);
}

/* A dict keeps a repeated key where it first appeared, with the value it had
 * last: each repeated member takes the last one's value and the later ones
 * are unlinked. Members are in ascending node order. Returns 0, or -1 when
 * out of memory. */
static int merge_repeated_keys(parser *ps, int obj) {
    ak_pyjson_node *v = ps->doc->v;
    int n = v[obj].n;
    if (n < 2) return 0;
    member_ref *m = malloc(sizeof *m * (size_t)n);
    if (!m) {
        ps->nomem = 1;
        return -1;
    }
    int k = 0;
    for (int c = v[obj].first; c >= 0; c = v[c].next) m[k++] = (member_ref){.v = v, .idx = c};
    qsort(m, (size_t)n, sizeof *m, cmp_member);
    for (int a = 0; a < n;) {
        int z = a + 1;
        while (z < n && !keycmp(v + m[a].idx, v + m[z].idx)) z++;
        if (z - a > 1) {
            ak_pyjson_node *keep = v + m[a].idx, *last = v + m[z - 1].idx;
            int next = keep->next;
            *keep = *last;
            keep->next = next;
            for (int r = a + 1; r < z; r++) {   /* unlink the later ones */
                for (int c = v[obj].first, prev = -1; c >= 0; prev = c, c = v[c].next) {
                    if (c != m[r].idx) continue;
                    if (prev < 0) v[obj].first = v[c].next;
                    else v[prev].next = v[c].next;
                    v[obj].n--;
                    break;
                }
            }
        }
        a = z;
    }
    free(m);
    return 0;
}

static int parse_value(parser *ps, int depth);

/* An array or object at ps->p (its opening bracket). */
static int parse_container(parser *ps, int depth) {
    int is_obj = *ps->p == '{';
    char close = is_obj ? '}' : ']';
    int i = new_node(ps, is_obj ? AK_PYJSON_OBJECT : AK_PYJSON_ARRAY);
    if (i < 0) return -1;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return i;
    }
    int last = -1;
    for (;;) {
        const char *key = NULL;
        size_t klen = 0;
        if (is_obj) {
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != '"' || parse_string(ps, &key, &klen) < 0) return -1;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return -1;
            ps->p++;
        }
        int c = parse_value(ps, depth + 1);
        if (c < 0) return -1;
        ak_pyjson_node *v = ps->doc->v;
        v[c].key = key;
        v[c].klen = klen;
        if (last < 0) v[i].first = c;
        else v[last].next = c;
        last = c;
        v[i].n++;
        skip_ws(ps);
        if (ps->p >= ps->end) return -1;
        if (*ps->p == ',') {
            ps->p++;
            continue;
        }
        if (*ps->p != close) return -1;
        ps->p++;
        break;
    }
    if (is_obj && merge_repeated_keys(ps, i) < 0) return -1;
    return i;
}

/* One value at ps->p (after whitespace); its node index, or -1. */
static int parse_value(parser *ps, int depth) {
    if (depth > MAX_DEPTH) return -1;
    skip_ws(ps);
    if (ps->p >= ps->end) return -1;
    static const struct {
        const char *word;
        ak_pyjson_kind kind;
    } words[] = {{"null", AK_PYJSON_NULL}, {"false", AK_PYJSON_FALSE}, {"true", AK_PYJSON_TRUE}};
    for (size_t w = 0; w < sizeof words / sizeof words[0]; w++) {
        size_t n = strlen(words[w].word);
        if ((size_t)(ps->end - ps->p) >= n && !memcmp(ps->p, words[w].word, n)) {
            ps->p += n;
            return new_node(ps, words[w].kind);
        }
    }
    static const char *const specials[] = {"NaN", "Infinity", "-Infinity"};   /* json.loads takes them */
    for (size_t w = 0; w < sizeof specials / sizeof specials[0]; w++) {
        size_t n = strlen(specials[w]);
        if ((size_t)(ps->end - ps->p) >= n && !memcmp(ps->p, specials[w], n)) {
            int i = new_node(ps, AK_PYJSON_FLOAT);
            if (i < 0) return -1;
            ps->doc->v[i].s = ps->p;
            ps->doc->v[i].len = n;
            ps->p += n;
            return i;
        }
    }
    char c = *ps->p;
    if (c == '{' || c == '[') return parse_container(ps, depth);
    if (c == '"') {
        const char *s;
        size_t len;
        if (parse_string(ps, &s, &len) < 0) return -1;
        int i = new_node(ps, AK_PYJSON_STRING);
        if (i < 0) return -1;
        ps->doc->v[i].s = s;
        ps->doc->v[i].len = len;
        return i;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number(ps);
    return -1;
}

int ak_pyjson_parse(const char *text, size_t len, ak_pyjson *doc, ak_error *err) {
    memset(doc, 0, sizeof *doc);
    doc->arena = malloc(len + 1);   /* decoded strings are never longer than their source */
    if (!doc->arena) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    parser ps = {.p = text, .end = text + len, .doc = doc, .out = doc->arena};
    int root = parse_value(&ps, 0);
    skip_ws(&ps);
    if (root == 0 && ps.p == ps.end) return 0;
    int nomem = ps.nomem;
    ak_pyjson_free(doc);
    if (nomem) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    return ak_failc(err, AK_ERR_INVALID, "not JSON");
}

void ak_pyjson_free(ak_pyjson *doc) {
    if (!doc) return;
    free(doc->v);
    free(doc->arena);
    memset(doc, 0, sizeof *doc);
}

int ak_pyjson_get(const ak_pyjson *doc, int obj, const char *key) {
    if (obj < 0 || obj >= doc->n || doc->v[obj].kind != AK_PYJSON_OBJECT) return -1;
    size_t kl = strlen(key);
    for (int c = doc->v[obj].first; c >= 0; c = doc->v[c].next)
        if (doc->v[c].klen == kl && !memcmp(doc->v[c].key, key, kl)) return c;
    return -1;
}

int ak_pyjson_dump_string(ak_buf *b, const char *s, size_t n) {
    ak_buf_append(b, "\"", 1);
    size_t run = 0;   /* bytes copied as they are, pending */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (!esc && c >= 0x20) {
            run++;
            continue;
        }
        ak_buf_append(b, s + i - run, run);
        run = 0;
        if (esc) ak_buf_puts(b, esc);
        else ak_buf_printf(b, "\\u%04x", c);
    }
    ak_buf_append(b, s + n - run, run);
    return ak_buf_append(b, "\"", 1);
}

/* A double as Python's repr prints it. */
static void dump_double(ak_buf *b, double x) {
    if (isnan(x)) {
        ak_buf_puts(b, "NaN");
        return;
    }
    if (isinf(x)) {
        ak_buf_puts(b, x < 0 ? "-Infinity" : "Infinity");
        return;
    }
    char t[40];
    for (int p = 1; p <= 17; p++) {   /* the shortest that reads back */
        snprintf(t, sizeof t, "%.*e", p - 1, x);
        if (strtod(t, NULL) == x) break;
    }
    const char *q = t;
    if (*q == '-') {
        ak_buf_puts(b, "-");
        q++;
    }
    char dig[24];
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') dig[nd++] = *q;
    int e = atoi(q + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    if (e < -4 || e >= 16) {
        ak_buf_append(b, dig, 1);
        if (nd > 1) {
            ak_buf_puts(b, ".");
            ak_buf_append(b, dig + 1, (size_t)nd - 1);
        }
        ak_buf_printf(b, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    } else if (e < 0) {
        ak_buf_puts(b, "0.");
        for (int z = 0; z < -e - 1; z++) ak_buf_puts(b, "0");
        ak_buf_append(b, dig, (size_t)nd);
    } else {
        for (int k = 0; k <= e; k++) ak_buf_append(b, k < nd ? dig + k : "0", 1);
        ak_buf_puts(b, ".");
        if (nd > e + 1) ak_buf_append(b, dig + e + 1, (size_t)(nd - e - 1));
        else ak_buf_puts(b, "0");
    }
}

static void newline(ak_buf *b, int indent, int level) {
    ak_buf_puts(b, "\n");
    for (int k = 0; k < indent * level; k++) ak_buf_puts(b, " ");
}

static void dump_at(ak_buf *b, const ak_pyjson *doc, int i, int indent, int level) {
    const ak_pyjson_node *v = &doc->v[i];
    switch (v->kind) {
    case AK_PYJSON_NULL: ak_buf_puts(b, "null"); return;
    case AK_PYJSON_FALSE: ak_buf_puts(b, "false"); return;
    case AK_PYJSON_TRUE: ak_buf_puts(b, "true"); return;
    case AK_PYJSON_INT:
        if (v->len == 2 && !memcmp(v->s, "-0", 2)) ak_buf_puts(b, "0");
        else ak_buf_append(b, v->s, v->len);
        return;
    case AK_PYJSON_FLOAT: {
        char t[64];
        if (v->len < sizeof t) {
            memcpy(t, v->s, v->len);
            t[v->len] = '\0';
            dump_double(b, strtod(t, NULL));
        } else {   /* digits beyond what a double holds: strtod reads them all the same */
            char *h = strndup(v->s, v->len);
            if (!h) b->failed = 1;
            else dump_double(b, strtod(h, NULL));
            free(h);
        }
        return;
    }
    case AK_PYJSON_STRING: ak_pyjson_dump_string(b, v->s, v->len); return;
    case AK_PYJSON_ARRAY:
    case AK_PYJSON_OBJECT: {
        int obj = v->kind == AK_PYJSON_OBJECT;
        if (v->n == 0) {
            ak_buf_puts(b, obj ? "{}" : "[]");
            return;
        }
        ak_buf_puts(b, obj ? "{" : "[");
        if (indent >= 0) newline(b, indent, level + 1);
        for (int c = v->first; c >= 0; c = doc->v[c].next) {
            if (obj) {
                ak_pyjson_dump_string(b, doc->v[c].key, doc->v[c].klen);
                ak_buf_puts(b, ": ");
            }
            dump_at(b, doc, c, indent, level + 1);
            if (doc->v[c].next < 0) break;
            if (indent >= 0) {
                ak_buf_puts(b, ",");
                newline(b, indent, level + 1);
            } else {
                ak_buf_puts(b, ", ");
            }
        }
        if (indent >= 0) newline(b, indent, level);
        ak_buf_puts(b, obj ? "}" : "]");
        return;
    }
    }
}

int ak_pyjson_dump(ak_buf *b, const ak_pyjson *doc, int i, int indent) {
    if (i >= 0 && i < doc->n) dump_at(b, doc, i, indent, 0);
    return b->failed ? -1 : 0;
}

int ak_pyjson_reprint(ak_buf *b, const char *text, size_t len, int indent, ak_error *err) {
    ak_pyjson doc;
    ak_error e = {0};
    if (ak_pyjson_parse(text, len, &doc, &e) < 0) {
        if (e.code != AK_ERR_NOMEM) return 1;
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    int rc = ak_pyjson_dump(b, &doc, 0, indent);
    ak_pyjson_free(&doc);
    return rc < 0 ? ak_failc(err, AK_ERR_NOMEM, "out of memory") : 0;
}
