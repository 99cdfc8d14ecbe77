/* regex.c - pattern -> AST -> Thompson NFA over bytes -> DFA by subsets.
 * Contract: regex.h. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/regex.h"

#define MAX_CP 0x10FFFF

/* ---- code point sets --------------------------------------------------------- */

typedef struct { uint32_t lo, hi; } cprange;
typedef struct { cprange *r; int n, cap; } cpset;

static int cs_add(cpset *s, uint32_t lo, uint32_t hi) {
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 8;
        cprange *r = realloc(s->r, (size_t)nc * sizeof *r);
        if (!r) return -1;
        s->r = r;
        s->cap = nc;
    }
    s->r[s->n++] = (cprange){.lo = lo, .hi = hi};
    return 0;
}

static int cmp_range(const void *a, const void *b) {
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts and merges the ranges. */
static void cs_norm(cpset *s) {
    if (s->n < 2) return;
    qsort(s->r, (size_t)s->n, sizeof *s->r, cmp_range);
    int w = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[w].hi + 1) {
            if (s->r[i].hi > s->r[w].hi) s->r[w].hi = s->r[i].hi;
        } else s->r[++w] = s->r[i];
    }
    s->n = w + 1;
}

/* Replaces s by its complement over [0, MAX_CP]. */
static int cs_negate(cpset *s) {
    cs_norm(s);
    cpset o = {0};
    uint32_t next = 0;
    int rc = 0;
    for (int i = 0; i < s->n && rc == 0; i++) {
        if (s->r[i].lo > next) rc = cs_add(&o, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (rc == 0 && next <= MAX_CP) rc = cs_add(&o, next, MAX_CP);
    free(s->r);
    *s = o;
    return rc;
}

/* ---- the AST ----------------------------------------------------------------- */

enum { N_SET, N_CAT, N_ALT, N_REP, N_EMPTY };
typedef struct { int kind, a, b, min, max; cpset set; } rnode;

typedef struct {
    const char *p;
    size_t i, n;
    rnode *nd;
    int nn, ncap;
    ak_gram_error *e;
    int err;
} parser;

static int rx_fail(parser *ps, int code, const char *what) {
    if (!ps->err) {
        ps->err = 1;
        ak_gram_fail(ps->e, code, "pattern", "", "%s at offset %zu", what, ps->i);
    }
    return -1;
}

static int new_node(parser *ps, int kind) {
    if (ps->nn >= AK_REGEX_MAX_NFA) return rx_fail(ps, AK_GRAM_E_TOO_LARGE, "pattern too large");
    if (ps->nn == ps->ncap) {
        int nc = ps->ncap ? ps->ncap * 2 : 32;
        rnode *r = realloc(ps->nd, (size_t)nc * sizeof *r);
        if (!r) return rx_fail(ps, AK_GRAM_E_NOMEM, "out of memory");
        ps->nd = r;
        ps->ncap = nc;
    }
    memset(&ps->nd[ps->nn], 0, sizeof ps->nd[0]);
    ps->nd[ps->nn].kind = kind;
    return ps->nn++;
}

static int bin_node(parser *ps, int kind, int a, int b) {
    int k = new_node(ps, kind);
    if (k >= 0) {
        ps->nd[k].a = a;
        ps->nd[k].b = b;
    }
    return k;
}

/* Decodes one UTF-8 character at ps->i; -1 on invalid UTF-8. */
static long next_cp(parser *ps) {
    const uint8_t *s = (const uint8_t *)ps->p + ps->i;
    size_t left = ps->n - ps->i;
    uint32_t c = s[0];
    int len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!len || (size_t)len > left) return -1;
    if (len > 1) c &= 0x3F >> (len - 1);
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return -1;
        c = (c << 6) | (s[k] & 0x3F);
    }
    if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > MAX_CP)) || (c >= 0xD800 && c <= 0xDFFF)) return -1;
    ps->i += (size_t)len;
    return (long)c;
}

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Reads n hex digits; -1 when they are not there. */
static long read_hex(parser *ps, int n) {
    long v = 0;
    for (int k = 0; k < n; k++) {
        int h = ps->i < ps->n ? hexval((uint8_t)ps->p[ps->i]) : -1;
        if (h < 0) return -1;
        v = v * 16 + h;
        ps->i++;
    }
    return v;
}

/* Adds the class of \d \w \s (negated for the capital letters) to s. */
static int class_escape(cpset *s, int c) {
    cpset t = {0};
    int rc = 0;
    switch (c | 0x20) {
    case 'd': rc = cs_add(&t, '0', '9'); break;
    case 'w': rc = cs_add(&t, '0', '9') | cs_add(&t, 'A', 'Z') | cs_add(&t, 'a', 'z') | cs_add(&t, '_', '_'); break;
    case 's':
        rc = cs_add(&t, 9, 13) | cs_add(&t, ' ', ' ') | cs_add(&t, 0xA0, 0xA0) | cs_add(&t, 0x1680, 0x1680) |
             cs_add(&t, 0x2000, 0x200A) | cs_add(&t, 0x2028, 0x2029) | cs_add(&t, 0x202F, 0x202F) |
             cs_add(&t, 0x205F, 0x205F) | cs_add(&t, 0x3000, 0x3000) | cs_add(&t, 0xFEFF, 0xFEFF);
        break;
    }
    if (!rc && c >= 'A' && c <= 'Z') rc = cs_negate(&t);
    for (int i = 0; i < t.n && !rc; i++) rc = cs_add(s, t.r[i].lo, t.r[i].hi);
    free(t.r);
    return rc;
}

/* An escape after '\' (ps->i at the character after it): a class into s
 * (returns 1) or one code point (returns 0, in *cp); -1 on error. */
static int parse_escape(parser *ps, cpset *s, long *cp, int in_class) {
    if (ps->i >= ps->n) return rx_fail(ps, AK_GRAM_E_REGEX, "pattern ends in '\\'");
    int c = (uint8_t)ps->p[ps->i];
    if (strchr("dDwWsS", c) && c) {
        ps->i++;
        if (class_escape(s, c) < 0) return rx_fail(ps, AK_GRAM_E_NOMEM, "out of memory");
        return 1;
    }
    ps->i++;
    switch (c) {
    case 't': *cp = 9; return 0;
    case 'n': *cp = 10; return 0;
    case 'r': *cp = 13; return 0;
    case 'f': *cp = 12; return 0;
    case 'v': *cp = 11; return 0;
    case '0': *cp = 0; return 0;
    case 'b':
        if (in_class) { *cp = 8; return 0; }
        return rx_fail(ps, AK_GRAM_E_REGEX, "unsupported word boundary \\b");
    case 'x': *cp = read_hex(ps, 2); break;
    case 'u':
        if (ps->i < ps->n && ps->p[ps->i] == '{') return rx_fail(ps, AK_GRAM_E_REGEX, "unsupported \\u{...}");
        *cp = read_hex(ps, 4);
        if (*cp >= 0xD800 && *cp <= 0xDFFF) return rx_fail(ps, AK_GRAM_E_REGEX, "unsupported surrogate escape");
        break;
    default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9'))
            return rx_fail(ps, AK_GRAM_E_REGEX, "unsupported escape (back-reference, \\p, \\B, ...)");
        if (c >= 0x80) { ps->i--; *cp = next_cp(ps); }
        else *cp = c;
    }
    if (*cp < 0) return rx_fail(ps, AK_GRAM_E_REGEX, "malformed escape");
    return 0;
}

/* One member of a class (a character or an escape) into s, or the
 * character in *cp (returns 0; 1 when a class escape went into s). */
static int class_atom(parser *ps, cpset *s, long *cp) {
    if (ps->p[ps->i] == '\\') {
        ps->i++;
        return parse_escape(ps, s, cp, 1);
    }
    *cp = next_cp(ps);
    if (*cp < 0) return rx_fail(ps, AK_GRAM_E_REGEX, "invalid UTF-8 in pattern");
    return 0;
}

/* '[' ... ']' (ps->i after '['). Returns a SET node. */
static int parse_class(parser *ps) {
    int k = new_node(ps, N_SET);
    if (k < 0) return -1;
    cpset s = {0};
    int neg = 0;
    if (ps->i < ps->n && ps->p[ps->i] == '^') { neg = 1; ps->i++; }
    for (;;) {
        if (ps->i >= ps->n) { free(s.r); return rx_fail(ps, AK_GRAM_E_REGEX, "unterminated class"); }
        if (ps->p[ps->i] == ']') { ps->i++; break; }
        long lo, hi;
        int r = class_atom(ps, &s, &lo);
        if (r < 0) { free(s.r); return -1; }
        if (r == 1) continue;
        if (ps->i + 1 < ps->n && ps->p[ps->i] == '-' && ps->p[ps->i + 1] != ']') {
            ps->i++;
            r = class_atom(ps, &s, &hi);
            if (r < 0) { free(s.r); return -1; }
            if (r == 1) { free(s.r); return rx_fail(ps, AK_GRAM_E_REGEX, "class escape as a range end"); }
            if (hi < lo) { free(s.r); return rx_fail(ps, AK_GRAM_E_REGEX, "range out of order"); }
        } else hi = lo;
        if (cs_add(&s, (uint32_t)lo, (uint32_t)hi) < 0) { free(s.r); return rx_fail(ps, AK_GRAM_E_NOMEM, "out of memory"); }
    }
    if (neg && cs_negate(&s) < 0) { free(s.r); return rx_fail(ps, AK_GRAM_E_NOMEM, "out of memory"); }
    cs_norm(&s);
    ps->nd[k].set = s;
    return k;
}

static int parse_alt(parser *ps, int top);

/* A set node of [lo, hi] (several ranges through extra calls). */
static int set_node(parser *ps, uint32_t lo, uint32_t hi) {
    int k = new_node(ps, N_SET);
    if (k >= 0 && cs_add(&ps->nd[k].set, lo, hi) < 0) return rx_fail(ps, AK_GRAM_E_NOMEM, "out of memory");
    return k;
}

/* An atom: group, class, '.', escape or character. */
static int parse_atom(parser *ps) {
    int c = (uint8_t)ps->p[ps->i];
    if (c == '(') {
        ps->i++;
        if (ps->i < ps->n && ps->p[ps->i] == '?') {
            if (ps->i + 1 < ps->n && ps->p[ps->i + 1] == ':') ps->i += 2;
            else if (ps->i + 2 < ps->n && ps->p[ps->i + 1] == '<' && ps->p[ps->i + 2] != '=' && ps->p[ps->i + 2] != '!') {
                while (ps->i < ps->n && ps->p[ps->i] != '>') ps->i++;
                if (ps->i >= ps->n) return rx_fail(ps, AK_GRAM_E_REGEX, "unterminated group name");
                ps->i++;
            } else return rx_fail(ps, AK_GRAM_E_REGEX, "unsupported look-around or group flag");
        }
        int k = parse_alt(ps, 0);
        if (k < 0) return -1;
        if (ps->i >= ps->n || ps->p[ps->i] != ')') return rx_fail(ps, AK_GRAM_E_REGEX, "missing ')'");
        ps->i++;
        return k;
    }
    if (c == '[') { ps->i++; return parse_class(ps); }
    if (c == '.') {
        ps->i++;
        int k = new_node(ps, N_SET);
        if (k < 0) return -1;
        cpset *s = &ps->nd[k].set;
        if (cs_add(s, 0, 9) | cs_add(s, 11, 12) | cs_add(s, 14, 0x2027) | cs_add(s, 0x202A, MAX_CP))
            return rx_fail(ps, AK_GRAM_E_NOMEM, "out of memory");
        return k;
    }
    if (c == '\\') {
        ps->i++;
        cpset s = {0};
        long cp;
        int r = parse_escape(ps, &s, &cp, 0);
        if (r < 0) { free(s.r); return -1; }
        if (r == 0) return set_node(ps, (uint32_t)cp, (uint32_t)cp);
        int k = new_node(ps, N_SET);
        if (k < 0) { free(s.r); return -1; }
        cs_norm(&s);
        ps->nd[k].set = s;
        return k;
    }
    if (c == '^' || c == '$') return rx_fail(ps, AK_GRAM_E_REGEX, "unsupported anchor inside the pattern");
    if (c == '*' || c == '+' || c == '?') return rx_fail(ps, AK_GRAM_E_REGEX, "nothing to repeat");
    if (c == ')' ) return rx_fail(ps, AK_GRAM_E_REGEX, "unbalanced ')'");
    long cp = next_cp(ps);
    if (cp < 0) return rx_fail(ps, AK_GRAM_E_REGEX, "invalid UTF-8 in pattern");
    return set_node(ps, (uint32_t)cp, (uint32_t)cp);
}

/* Reads a decimal number (up to 100000); -1 when there is none. */
static long read_num(parser *ps) {
    long v = -1;
    while (ps->i < ps->n && ps->p[ps->i] >= '0' && ps->p[ps->i] <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (ps->p[ps->i] - '0');
        if (v > 100000) v = 100000;
        ps->i++;
    }
    return v;
}

/* An atom and its quantifier. */
static int parse_repeat(parser *ps) {
    int k = parse_atom(ps);
    while (k >= 0 && ps->i < ps->n) {
        int c = ps->p[ps->i];
        long mn, mx;
        if (c == '*') { mn = 0; mx = -1; ps->i++; }
        else if (c == '+') { mn = 1; mx = -1; ps->i++; }
        else if (c == '?') { mn = 0; mx = 1; ps->i++; }
        else if (c == '{') {
            size_t save = ps->i;
            ps->i++;
            mn = read_num(ps);
            mx = mn;
            if (mn >= 0 && ps->i < ps->n && ps->p[ps->i] == ',') {
                ps->i++;
                mx = read_num(ps);
            }
            if (mn < 0 || ps->i >= ps->n || ps->p[ps->i] != '}') {
                ps->i = save;   /* not a quantifier: '{' is a literal (Annex B) */
                return k;
            }
            ps->i++;
            if (mx >= 0 && mx < mn) return rx_fail(ps, AK_GRAM_E_REGEX, "quantifier range out of order");
        } else return k;
        if (ps->i < ps->n && ps->p[ps->i] == '?') ps->i++;   /* lazy: same strings */
        int r = new_node(ps, N_REP);
        if (r < 0) return -1;
        ps->nd[r].a = k;
        ps->nd[r].min = (int)mn;
        ps->nd[r].max = (int)mx;
        k = r;
    }
    return k;
}

/* Concatenation up to '|', ')' or the end (top: a '$' may end it). */
static int parse_cat(parser *ps, int top, int *dollar) {
    int k = new_node(ps, N_EMPTY);
    while (k >= 0 && ps->i < ps->n && ps->p[ps->i] != '|' && ps->p[ps->i] != ')') {
        if (top && ps->p[ps->i] == '$') {
            ps->i++;
            if (ps->i < ps->n && ps->p[ps->i] != '|') return rx_fail(ps, AK_GRAM_E_REGEX, "unsupported '$' inside the pattern");
            *dollar = 1;
            break;
        }
        int a = parse_repeat(ps);
        if (a < 0) return -1;
        k = bin_node(ps, N_CAT, k, a);
    }
    return k;
}

/* Any code point, repeated: the unanchored ends of a search. */
static int any_star(parser *ps) {
    int s = set_node(ps, 0, MAX_CP);
    if (s < 0) return -1;
    int r = new_node(ps, N_REP);
    if (r < 0) return -1;
    ps->nd[r].a = s;
    ps->nd[r].min = 0;
    ps->nd[r].max = -1;
    return r;
}

/* Alternatives; at the top each may be anchored with ^ and $ (a search
 * pads an unanchored end with any_star). */
static int parse_alt(parser *ps, int top) {
    int k = -1;
    for (;;) {
        int caret = 0, dollar = 0;
        if (top && ps->i < ps->n && ps->p[ps->i] == '^') { caret = 1; ps->i++; }
        int a = parse_cat(ps, top, &dollar);
        if (a < 0) return -1;
        if (top == 1) {   /* search */
            if (!caret) { int s = any_star(ps); if (s < 0) return -1; a = bin_node(ps, N_CAT, s, a); }
            if (!dollar) { int s = any_star(ps); if (s < 0) return -1; a = bin_node(ps, N_CAT, a, s); }
            if (a < 0) return -1;
        }
        k = k < 0 ? a : bin_node(ps, N_ALT, k, a);
        if (k < 0) return -1;
        if (ps->i < ps->n && ps->p[ps->i] == '|') { ps->i++; continue; }
        return k;
    }
}

/* ---- NFA ------------------------------------------------------------------------ */

/* Node: a byte range [lo, hi] to out (lo <= hi), or epsilon to out and out2
 * (lo > hi); the match node is the one index `match`. */
typedef struct { int32_t out, out2; uint8_t lo, hi, eps; } nnode;
typedef struct { nnode *v; int n, cap; int err; } nfa;
typedef struct { int start, end; } frag;

static int nfa_node(nfa *a, int eps, int lo, int hi) {
    if (a->n >= AK_REGEX_MAX_NFA) { a->err = AK_GRAM_E_TOO_LARGE; return -1; }
    if (a->n == a->cap) {
        int nc = a->cap ? a->cap * 2 : 64;
        nnode *v = realloc(a->v, (size_t)nc * sizeof *v);
        if (!v) { a->err = AK_GRAM_E_NOMEM; return -1; }
        a->v = v;
        a->cap = nc;
    }
    a->v[a->n] = (nnode){.out = -1, .out2 = -1, .lo = (uint8_t)lo, .hi = (uint8_t)hi, .eps = (uint8_t)eps};
    return a->n++;
}

static int encode_utf8(uint32_t c, uint8_t *o) {
    if (c < 0x80) { o[0] = (uint8_t)c; return 1; }
    if (c < 0x800) { o[0] = (uint8_t)(0xC0 | (c >> 6)); o[1] = (uint8_t)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (c >> 12)); o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F)); o[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (c >> 18)); o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F)); o[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

/* Adds the byte sequences of code points [lo, hi] as paths from st to en
 * (the utf8-ranges splitting: each piece is a product of byte ranges). */
static void utf8_paths(nfa *a, uint32_t lo, uint32_t hi, int st, int en) {
    if (a->err || lo > hi) return;
    if (lo < 0xD800 && hi > 0xDFFF) { utf8_paths(a, lo, 0xD7FF, st, en); utf8_paths(a, 0xE000, hi, st, en); return; }
    if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
    if (hi >= 0xD800 && hi <= 0xDFFF) hi = 0xD7FF;
    if (lo > hi) return;
    static const uint32_t lim[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= lim[i] && hi > lim[i]) { utf8_paths(a, lo, lim[i], st, en); utf8_paths(a, lim[i] + 1, hi, st, en); return; }
    uint8_t bl[4], bh[4];
    int n = encode_utf8(lo, bl);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) { utf8_paths(a, lo, lo | m, st, en); utf8_paths(a, (lo | m) + 1, hi, st, en); return; }
            if ((hi & m) != m) { utf8_paths(a, lo, (hi & ~m) - 1, st, en); utf8_paths(a, hi & ~m, hi, st, en); return; }
        }
    }
    encode_utf8(hi, bh);
    /* a chain st -> ... -> en through n range nodes; st fans out through a
     * new epsilon node so that st keeps two outs */
    int fan = nfa_node(a, 1, 1, 0);
    if (fan < 0) return;
    a->v[fan].out2 = a->v[st].out2;
    a->v[st].out2 = fan;
    int prev = fan;
    for (int i = 0; i < n; i++) {
        int r = nfa_node(a, 0, bl[i], bh[i]);
        if (r < 0) return;
        if (prev == fan) a->v[fan].out = r;
        else a->v[prev].out = r;
        prev = r;
    }
    a->v[prev].out = en;
}

/* Builds node k of the AST as a fragment. */
static frag build(nfa *a, const parser *ps, int k) {
    frag f = {.start = -1, .end = -1};
    const rnode *nd = &ps->nd[k];
    if (a->err) return f;
    switch (nd->kind) {
    case N_EMPTY:
        f.start = f.end = nfa_node(a, 1, 1, 0);
        return f;
    case N_SET:
        f.start = nfa_node(a, 1, 1, 0);
        f.end = nfa_node(a, 1, 1, 0);
        for (int i = 0; i < nd->set.n && !a->err; i++) utf8_paths(a, nd->set.r[i].lo, nd->set.r[i].hi, f.start, f.end);
        return f;
    case N_CAT: {
        frag x = build(a, ps, nd->a), y = build(a, ps, nd->b);
        if (a->err) return f;
        a->v[x.end].out = y.start;
        return (frag){.start = x.start, .end = y.end};
    }
    case N_ALT: {
        frag x = build(a, ps, nd->a), y = build(a, ps, nd->b);
        f.start = nfa_node(a, 1, 1, 0);
        f.end = nfa_node(a, 1, 1, 0);
        if (a->err) return f;
        a->v[f.start].out = x.start;
        a->v[f.start].out2 = y.start;
        a->v[x.end].out = f.end;
        a->v[y.end].out = f.end;
        return f;
    }
    default: {   /* N_REP */
        f.start = f.end = nfa_node(a, 1, 1, 0);
        for (int i = 0; i < nd->min && !a->err; i++) {
            frag x = build(a, ps, nd->a);
            if (a->err) return f;
            a->v[f.end].out = x.start;
            f.end = x.end;
        }
        if (nd->max < 0) {
            frag x = build(a, ps, nd->a);
            int s = nfa_node(a, 1, 1, 0), e = nfa_node(a, 1, 1, 0);
            if (a->err) return f;
            a->v[f.end].out = s;
            a->v[s].out = x.start;
            a->v[s].out2 = e;
            a->v[x.end].out = s;
            f.end = e;
        } else {
            /* (x(x(x)?)?)? with every optional copy able to skip to the end */
            int e = nfa_node(a, 1, 1, 0);
            for (int i = nd->min; i < nd->max && !a->err; i++) {
                frag x = build(a, ps, nd->a);
                int s = nfa_node(a, 1, 1, 0);
                if (a->err) return f;
                a->v[f.end].out = s;
                a->v[s].out = x.start;
                a->v[s].out2 = e;
                f.end = x.end;
            }
            if (a->err) return f;
            a->v[f.end].out = e;
            f.end = e;
        }
        return f;
    }
    }
}

/* ---- subset construction ------------------------------------------------------- */

typedef struct {
    int32_t *sets;       /* all DFA states' NFA sets, concatenated */
    size_t nsets, scap;
    int32_t *soff, *slen;
    int32_t *ht;         /* hash table of DFA state + 1 */
    size_t hcap;
} subsets;

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return a < b ? -1 : a > b;
}

/* The epsilon closure of the nodes in st[0..n) into out (sorted, distinct);
 * returns its size. mark: per-node scratch (generation numbers); the work
 * done is taken off *budget. */
static int closure(const nfa *a, const int32_t *st, int n, int32_t *out, uint32_t *mark, uint32_t gen, int32_t *work,
                   long *budget) {
    int sp = 0, k = 0;
    *budget -= n;
    for (int i = 0; i < n; i++) work[sp++] = st[i];
    while (sp) {
        int x = work[--sp];
        if (x < 0 || mark[x] == gen) continue;
        mark[x] = gen;
        (*budget)--;
        if (a->v[x].eps) {
            if (a->v[x].out >= 0) work[sp++] = a->v[x].out;
            if (a->v[x].out2 >= 0) work[sp++] = a->v[x].out2;
            if (a->v[x].out < 0 && a->v[x].out2 < 0) out[k++] = x;   /* the match node */
        } else out[k++] = x;
    }
    qsort(out, (size_t)k, sizeof *out, cmp_i32);
    *budget -= k;
    return k;
}

static uint32_t set_hash(const int32_t *s, int n) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)s[i]) * 16777619u;
    return h;
}

/* Finds or adds the DFA state of set s[0..n); returns its index or -1. */
static int subset_state(subsets *ss, ak_bdfa *d, const int32_t *s, int n, int max_states, int match, int *added) {
    *added = 0;
    uint32_t h = set_hash(s, n);
    for (size_t i = h & (ss->hcap - 1);; i = (i + 1) & (ss->hcap - 1)) {
        int k = ss->ht[i] - 1;
        if (k < 0) {
            int q = ak_bdfa_add(d, max_states);
            if (q < 0) return -1;
            if (ss->nsets + (size_t)n > ss->scap) {
                size_t nc = ss->scap ? ss->scap * 2 : 1024;
                while (nc < ss->nsets + (size_t)n) nc *= 2;
                int32_t *ns = realloc(ss->sets, nc * sizeof *ns);
                if (!ns) return -1;
                ss->sets = ns;
                ss->scap = nc;
            }
            memcpy(ss->sets + ss->nsets, s, (size_t)n * sizeof *s);
            ss->soff[q] = (int32_t)ss->nsets;
            ss->slen[q] = n;
            ss->nsets += (size_t)n;
            ss->ht[i] = q + 1;
            d->tag[q] = -1;
            for (int j = 0; j < n; j++)
                if (s[j] == match) d->tag[q] = 0;
            *added = 1;
            return q;
        }
        if (ss->slen[k] == n && !memcmp(ss->sets + ss->soff[k], s, (size_t)n * sizeof *s)) return k;
    }
}

/* Compiles the pattern. Contract: regex.h. */
int ak_regex_compile(const char *pat, size_t len, int mode, int max_states, ak_bdfa *out, ak_gram_error *e) {
    memset(out, 0, sizeof *out);
    parser ps = {.p = pat, .n = len, .e = e};
    nfa a = {0};
    subsets ss = {0};
    int32_t *buf = NULL, *work = NULL, *tmp = NULL;
    uint32_t *mark = NULL;
    int rc = -1;
    int root = parse_alt(&ps, mode == AK_RE_SEARCH ? 1 : 2);
    if (root >= 0 && ps.i < ps.n) root = rx_fail(&ps, AK_GRAM_E_REGEX, "unbalanced ')'");
    if (root < 0) goto out;
    frag f = build(&a, &ps, root);
    int match = nfa_node(&a, 1, 1, 0);
    if (a.err) {
        ak_gram_fail(e, a.err, "pattern", "", a.err == AK_GRAM_E_TOO_LARGE ? "pattern expands past %d NFA nodes" : "out of memory (%d)",
                     AK_REGEX_MAX_NFA);
        goto out;
    }
    a.v[f.end].out = match;
    buf = malloc((size_t)a.n * sizeof *buf);
    work = malloc(((size_t)a.n * 3 + 16) * sizeof *work);
    tmp = malloc((size_t)a.n * sizeof *tmp);
    mark = calloc((size_t)a.n, sizeof *mark);
    ss.hcap = 1;
    while (ss.hcap < (size_t)max_states * 2) ss.hcap *= 2;
    ss.ht = calloc(ss.hcap, sizeof *ss.ht);
    ss.soff = malloc((size_t)max_states * sizeof *ss.soff);
    ss.slen = malloc((size_t)max_states * sizeof *ss.slen);
    if (!buf || !work || !tmp || !mark || !ss.ht || !ss.soff || !ss.slen) goto nomem;
    uint32_t gen = 1;
    /* bounds the time of a pattern whose sets are large (wide classes
     * repeated many times): the work of all closures together */
    long budget = 64L * 1000 * 1000;
    int n0 = closure(&a, &f.start, 1, buf, mark, gen++, work, &budget), added;
    if (subset_state(&ss, out, buf, n0, max_states, match, &added) < 0) goto toolarge;
    for (int q = 0; q < out->n; q++) {
        /* the byte intervals on which this set's range nodes agree */
        uint8_t cut[257] = {0};
        cut[0] = 1;
        for (int j = 0; j < ss.slen[q]; j++) {
            const nnode *nd = &a.v[ss.sets[ss.soff[q] + j]];
            if (nd->eps) continue;
            cut[nd->lo] = 1;
            cut[nd->hi + 1] = 1;
        }
        for (int c = 0; c < 256;) {
            int c2 = c + 1;
            while (c2 < 256 && !cut[c2]) c2++;
            int k = 0;
            budget -= ss.slen[q];
            for (int j = 0; j < ss.slen[q]; j++) {
                const nnode *nd = &a.v[ss.sets[ss.soff[q] + j]];
                if (!nd->eps && c >= nd->lo && c <= nd->hi) tmp[k++] = nd->out;
            }
            if (k) {
                int m = closure(&a, tmp, k, buf, mark, gen++, work, &budget);
                if (budget < 0) {
                    ak_gram_fail(e, AK_GRAM_E_TOO_LARGE, "pattern", "", "pattern too costly to compile");
                    goto out;
                }
                int t = m ? subset_state(&ss, out, buf, m, max_states, match, &added) : -1;
                if (m && t < 0) goto toolarge;
                for (int b = c; b < c2; b++) out->next[(size_t)q * 256 + b] = t;
            }
            c = c2;
        }
    }
    rc = 0;
    goto out;
toolarge:
    if (out->n >= max_states) ak_gram_fail(e, AK_GRAM_E_TOO_LARGE, "pattern", "", "pattern needs more than %d DFA states", max_states);
    else
nomem:
        ak_gram_fail(e, AK_GRAM_E_NOMEM, "pattern", "", "out of memory compiling a pattern");
out:
    for (int i = 0; i < ps.nn; i++) free(ps.nd[i].set.r);
    free(ps.nd);
    free(a.v);
    free(buf);
    free(work);
    free(tmp);
    free(mark);
    free(ss.sets);
    free(ss.soff);
    free(ss.slen);
    free(ss.ht);
    if (rc < 0) ak_bdfa_free(out);
    return rc;
}
