/* grammar.c - the grammar builder, its compiled tables, the per-sequence
 * matcher (a set of stacks) and the shortest close. Contract: grammar.h. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar.h"

#define INF_DIST (LONG_MAX / 4)

/* ---- errors --------------------------------------------------------------- */

/* Formats the error into e (when not NULL); returns -1. */
int ak_gram_fail(ak_gram_error *e, int code, const char *keyword, const char *path, const char *fmt, ...) {
    if (!e) return -1;
    e->code = code;
    snprintf(e->keyword, sizeof e->keyword, "%s", keyword ? keyword : "");
    snprintf(e->path, sizeof e->path, "%s", path ? path : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* AK_ERR_NOMEM for E_NOMEM, AK_ERR_NONE for OK, AK_ERR_INVALID otherwise. */
int ak_gram_err_code(int code) {
    return code == AK_GRAM_OK ? AK_ERR_NONE : code == AK_GRAM_E_NOMEM ? AK_ERR_NOMEM : AK_ERR_INVALID;
}

/* The code's short name; "?" for an unknown code. */
const char *ak_gram_code_name(int code) {
    static const char *const names[] = {"ok", "json", "schema", "unsupported", "ref", "unsatisfiable",
                                        "too-large", "depth", "regex", "nomem", "invalid"};
    return code >= 0 && code < (int)(sizeof names / sizeof names[0]) ? names[code] : "?";
}

/* ---- byte DFAs ------------------------------------------------------------ */

/* A new state; -1 past max_states or out of memory. */
int ak_bdfa_add(ak_bdfa *d, int max_states) {
    if (d->n >= max_states) return -1;
    if (d->n == d->cap) {
        int nc = d->cap ? d->cap * 2 : 16;
        if (nc > max_states) nc = max_states;
        int32_t *nx = realloc(d->next, (size_t)nc * 256 * sizeof *nx);
        if (!nx) return -1;
        d->next = nx;
        int32_t *tg = realloc(d->tag, (size_t)nc * sizeof *tg);
        if (!tg) return -1;
        d->tag = tg;
        d->cap = nc;
    }
    memset(d->next + (size_t)d->n * 256, 0xff, 256 * sizeof *d->next);
    d->tag[d->n] = -1;
    return d->n++;
}

/* Frees the tables; d may be reused after. */
void ak_bdfa_free(ak_bdfa *d) {
    free(d->next);
    free(d->tag);
    memset(d, 0, sizeof *d);
}

/* Whether d accepts s[0..n). */
int ak_bdfa_match(const ak_bdfa *d, const void *s, size_t n) {
    const uint8_t *p = s;
    int q = d->n ? 0 : -1;
    for (size_t i = 0; i < n && q >= 0; i++) q = d->next[(size_t)q * 256 + p[i]];
    return q >= 0 && d->tag[q] >= 0;
}

/* A hash map from a pair of ints to a state index, for product BFS. */
typedef struct {
    int64_t *keys;
    int32_t *vals;
    size_t cap, n;
} pairmap;

static size_t pm_hash(int64_t k) {
    uint64_t x = (uint64_t)k * 0x9E3779B97F4A7C15ull;
    return (size_t)(x ^ (x >> 29));
}

/* Looks k up; returns its value or -1. */
static int32_t pm_get(const pairmap *m, int64_t k) {
    if (!m->cap) return -1;
    for (size_t i = pm_hash(k) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->vals[i] < 0) return -1;
        if (m->keys[i] == k) return m->vals[i];
    }
}

/* Inserts k -> v (k absent); returns 0 or -1 on out of memory. */
static int pm_put(pairmap *m, int64_t k, int32_t v) {
    if ((m->n + 1) * 2 > m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 64;
        int64_t *nk = malloc(nc * sizeof *nk);
        int32_t *nv = malloc(nc * sizeof *nv);
        if (!nk || !nv) { free(nk); free(nv); return -1; }
        memset(nv, 0xff, nc * sizeof *nv);
        for (size_t i = 0; i < m->cap; i++)
            if (m->vals[i] >= 0) {
                size_t j = pm_hash(m->keys[i]) & (nc - 1);
                while (nv[j] >= 0) j = (j + 1) & (nc - 1);
                nk[j] = m->keys[i];
                nv[j] = m->vals[i];
            }
        free(m->keys);
        free(m->vals);
        m->keys = nk;
        m->vals = nv;
        m->cap = nc;
    }
    size_t j = pm_hash(k) & (m->cap - 1);
    while (m->vals[j] >= 0) j = (j + 1) & (m->cap - 1);
    m->keys[j] = k;
    m->vals[j] = v;
    m->n++;
    return 0;
}

static void pm_free(pairmap *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* Intersection or union of a and b over the reachable pairs (-1 stands for
 * "no state" on one side in a union). Contract: grammar.h. */
int ak_bdfa_product(const ak_bdfa *a, const ak_bdfa *b, int mode, int max_states, ak_bdfa *out, ak_gram_error *e) {
    int intersect = mode == AK_BDFA_AND, label = mode == AK_BDFA_LABEL;
    memset(out, 0, sizeof *out);
    pairmap pm = {0};
    int32_t *qa = NULL, *qb = NULL;
    size_t qcap = 0;
    int rc = -1;
    if (!a->n || (!b->n && mode != AK_BDFA_LABEL)) {
        if (ak_bdfa_add(out, max_states) < 0) goto nomem;
        return 0;
    }
#define PAIR(x, y) (((int64_t)(x) + 1) * 0x100000000ll + ((int64_t)(y) + 1))
    if (ak_bdfa_add(out, max_states) < 0 || pm_put(&pm, PAIR(0, 0), 0) < 0) goto nomem;
    qcap = 64;
    qa = malloc(qcap * sizeof *qa);
    qb = malloc(qcap * sizeof *qb);
    if (!qa || !qb) goto nomem;
    qa[0] = 0;
    qb[0] = 0;
    for (int s = 0; s < out->n; s++) {
        int x = qa[s], y = qb[s];
        int ta = x >= 0 ? a->tag[x] : -1, tb = y >= 0 ? b->tag[y] : -1;
        out->tag[s] = intersect ? (ta >= 0 && tb >= 0 ? ta : -1) : label ? (ta >= 0 ? (tb >= 0 ? tb : ta) : -1)
                                                                 : (ta >= 0 ? ta : tb);
        for (int c = 0; c < 256; c++) {
            int nx = x >= 0 ? a->next[(size_t)x * 256 + c] : -1;
            int ny = y >= 0 ? b->next[(size_t)y * 256 + c] : -1;
            if (intersect ? (nx < 0 || ny < 0) : label ? nx < 0 : (nx < 0 && ny < 0)) continue;
            int32_t t = pm_get(&pm, PAIR(nx, ny));
            if (t < 0) {
                t = ak_bdfa_add(out, max_states);
                if (t < 0) {
                    if (out->n >= max_states) {
                        ak_gram_fail(e, AK_GRAM_E_TOO_LARGE, "", "", "automaton past %d states", max_states);
                        goto out;
                    }
                    goto nomem;
                }
                if (pm_put(&pm, PAIR(nx, ny), t) < 0) goto nomem;
                if ((size_t)t >= qcap) {
                    qcap *= 2;
                    int32_t *na = realloc(qa, qcap * sizeof *qa);
                    if (!na) goto nomem;
                    qa = na;
                    int32_t *nb = realloc(qb, qcap * sizeof *qb);
                    if (!nb) goto nomem;
                    qb = nb;
                }
                qa[t] = nx;
                qb[t] = ny;
            }
            out->next[(size_t)s * 256 + c] = t;
        }
    }
#undef PAIR
    rc = 0;
    goto out;
nomem:
    ak_gram_fail(e, AK_GRAM_E_NOMEM, "", "", "out of memory building an automaton");
out:
    pm_free(&pm);
    free(qa);
    free(qb);
    if (rc < 0) ak_bdfa_free(out);
    return rc;
}

/* Valid UTF-8 (the Unicode table of well-formed sequences). States: 0 start
 * (accepts), 1..3 continuation bytes left, 4: after E0 (A0-BF), 5: after ED
 * (80-9F), 6: after F0 (90-BF), 7: after F4 (80-8F). */
static int utf8_dfa(ak_bdfa *d) {
    for (int i = 0; i < 8; i++)
        if (ak_bdfa_add(d, 8) < 0) return -1;
    int32_t *n = d->next;
    d->tag[0] = 0;
#define SET(s, lo, hi, t) for (int c_ = (lo); c_ <= (hi); c_++) n[(s) * 256 + c_] = (t)
    SET(0, 0x00, 0x7F, 0);
    SET(0, 0xC2, 0xDF, 1);
    SET(0, 0xE1, 0xEC, 2);
    SET(0, 0xEE, 0xEF, 2);
    SET(0, 0xE0, 0xE0, 4);
    SET(0, 0xED, 0xED, 5);
    SET(0, 0xF1, 0xF3, 3);
    SET(0, 0xF0, 0xF0, 6);
    SET(0, 0xF4, 0xF4, 7);
    SET(1, 0x80, 0xBF, 0);
    SET(2, 0x80, 0xBF, 1);
    SET(3, 0x80, 0xBF, 2);
    SET(4, 0xA0, 0xBF, 1);
    SET(5, 0x80, 0x9F, 1);
    SET(6, 0x90, 0xBF, 2);
    SET(7, 0x80, 0x8F, 2);
#undef SET
    return 0;
}

/* Valid UTF-8 of min..max code points: the UTF-8 automaton times a counter
 * of lead bytes (a count past min saturates when there is no maximum).
 * Contract: grammar.h. */
int ak_bdfa_utf8_len(long min_chars, long max_chars, int max_states, ak_bdfa *out, ak_gram_error *e) {
    memset(out, 0, sizeof *out);
    if (min_chars < 0) min_chars = 0;
    if (max_chars >= 0 && max_chars < min_chars) {
        if (ak_bdfa_add(out, 1) < 0) return ak_gram_fail(e, AK_GRAM_E_NOMEM, "", "", "out of memory");
        return 0;   /* accepts nothing */
    }
    long cap = max_chars >= 0 ? max_chars : min_chars;
    if (cap + 1 > max_states) return ak_gram_fail(e, AK_GRAM_E_TOO_LARGE, "", "", "string length %ld past the limit", cap);
    ak_bdfa u = {0}, cnt = {0};
    if (utf8_dfa(&u) < 0) goto nomem;
    for (long i = 0; i <= cap; i++) {
        if (ak_bdfa_add(&cnt, (int)cap + 1) < 0) goto nomem;
        cnt.tag[i] = i >= min_chars ? 0 : -1;
    }
    for (long i = 0; i <= cap; i++)
        for (int c = 0; c < 256; c++) {
            int cont = c >= 0x80 && c <= 0xBF;
            long t = cont ? i : i + 1;
            if (t > cap) t = max_chars >= 0 ? -1 : cap;
            cnt.next[i * 256 + c] = (int32_t)t;
        }
    int rc = ak_bdfa_product(&u, &cnt, AK_BDFA_AND, max_states, out, e);
    ak_bdfa_free(&u);
    ak_bdfa_free(&cnt);
    return rc;
nomem:
    ak_bdfa_free(&u);
    ak_bdfa_free(&cnt);
    return ak_gram_fail(e, AK_GRAM_E_NOMEM, "", "", "out of memory");
}

/* ---- the builder ------------------------------------------------------------ */

typedef struct { int32_t from, to, next; uint8_t lo, hi; } bedge;
typedef struct { int32_t from, rule, to; } bcall;

struct ak_gbuild {
    int n, cap;
    int32_t *rule, *ehead;
    uint8_t *acc;
    bedge *e;
    int ne, ecap;
    bcall *c;
    int nc, ccap;
    int32_t *rstart;
    int nr, rcap;
    int failed;   /* a limit or memory ran out: finish fails */
};

/* A new empty builder, or NULL. */
ak_gbuild *ak_gbuild_new(void) { return calloc(1, sizeof(ak_gbuild)); }

/* Frees the builder (NULL is fine). */
void ak_gbuild_free(ak_gbuild *b) {
    if (!b) return;
    free(b->rule);
    free(b->ehead);
    free(b->acc);
    free(b->e);
    free(b->c);
    free(b->rstart);
    free(b);
}

/* Grows *p (elements of sz) to hold need; returns 0 or -1. */
static int grow(void **p, int *cap, int need, size_t sz) {
    if (need <= *cap) return 0;
    int nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * sz);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

/* A new state of rule r; -1 past the limit or out of memory. */
static int new_state(ak_gbuild *b, int r) {
    if (b->failed) return -1;
    if (b->n >= AK_GRAM_MAX_STATES) { b->failed = AK_GRAM_E_TOO_LARGE; return -1; }
    if (b->n == b->cap) {
        int c = b->cap, c2 = c, c3 = c;
        if (grow((void **)&b->rule, &c, b->n + 1, sizeof *b->rule) < 0 ||
            grow((void **)&b->ehead, &c2, b->n + 1, sizeof *b->ehead) < 0 ||
            grow((void **)&b->acc, &c3, b->n + 1, sizeof *b->acc) < 0) {
            b->failed = AK_GRAM_E_NOMEM;
            return -1;
        }
        b->cap = c;
    }
    b->rule[b->n] = r;
    b->ehead[b->n] = -1;
    b->acc[b->n] = 0;
    return b->n++;
}

/* A new rule (with its start state); -1 on failure. */
int ak_gbuild_rule(ak_gbuild *b) {
    if (b->failed) return -1;
    if (grow((void **)&b->rstart, &b->rcap, b->nr + 1, sizeof *b->rstart) < 0) {
        b->failed = AK_GRAM_E_NOMEM;
        return -1;
    }
    int s = new_state(b, b->nr);
    if (s < 0) return -1;
    b->rstart[b->nr] = s;
    return b->nr++;
}

int ak_gbuild_start(const ak_gbuild *b, int r) { return r >= 0 && r < b->nr ? b->rstart[r] : -1; }
int ak_gbuild_n_states(const ak_gbuild *b) { return b->n; }

/* A new state in rule r; -1 on failure. */
int ak_gbuild_state(ak_gbuild *b, int r) { return r >= 0 && r < b->nr ? new_state(b, r) : -1; }

/* Marks s accepting (ignored for an invalid s). */
void ak_gbuild_accept(ak_gbuild *b, int s) {
    if (s >= 0 && s < b->n) b->acc[s] = 1;
}

/* A byte edge s -[lo,hi]-> t. */
void ak_gbuild_bytes(ak_gbuild *b, int s, int lo, int hi, int t) {
    if (b->failed) return;
    if (s < 0 || t < 0 || s >= b->n || t >= b->n || lo < 0 || hi > 255 || lo > hi) {
        if (!b->failed) b->failed = AK_GRAM_E_INVALID;
        return;
    }
    if (grow((void **)&b->e, &b->ecap, b->ne + 1, sizeof *b->e) < 0) { b->failed = AK_GRAM_E_NOMEM; return; }
    b->e[b->ne] = (bedge){.from = s, .to = t, .next = b->ehead[s], .lo = (uint8_t)lo, .hi = (uint8_t)hi};
    b->ehead[s] = b->ne++;
}

/* s calls rule r, continuing at t. */
void ak_gbuild_call(ak_gbuild *b, int s, int r, int t) {
    if (b->failed) return;
    if (s < 0 || t < 0 || s >= b->n || t >= b->n || r < 0 || r >= b->nr) {
        b->failed = AK_GRAM_E_INVALID;
        return;
    }
    if (grow((void **)&b->c, &b->ccap, b->nc + 1, sizeof *b->c) < 0) { b->failed = AK_GRAM_E_NOMEM; return; }
    b->c[b->nc++] = (bcall){.from = s, .rule = r, .to = t};
}

/* The target of s's byte edge on byte c, or -1. */
static int edge_on(const ak_gbuild *b, int s, int c) {
    for (int i = b->ehead[s]; i >= 0; i = b->e[i].next)
        if (c >= b->e[i].lo && c <= b->e[i].hi) return b->e[i].to;
    return -1;
}

/* A literal from `from`, reusing single-byte edges already there. Returns the
 * final state or -1. */
int ak_gbuild_literal(ak_gbuild *b, int from, const char *s, size_t n) {
    int q = from;
    for (size_t i = 0; i < n && q >= 0; i++) {
        int c = (uint8_t)s[i];
        int t = edge_on(b, q, c);
        if (t < 0) {
            t = new_state(b, b->rule[q]);
            if (t < 0) return -1;
            ak_gbuild_bytes(b, q, c, c, t);
        }
        q = t;
    }
    return b->failed ? -1 : q;
}

/* Copies d into rule r, d's start merged into from. */
int ak_gbuild_dfa(ak_gbuild *b, int r, int from, const ak_bdfa *d, int32_t *map) {
    if (!d->n) return 0;
    int32_t *m = map ? map : malloc((size_t)d->n * sizeof *m);
    if (!m) { b->failed = AK_GRAM_E_NOMEM; return -1; }
    m[0] = from;
    for (int i = 1; i < d->n; i++) {
        m[i] = new_state(b, r);
        if (m[i] < 0) break;
    }
    int reenter = 0;
    for (size_t k = 0; k < (size_t)d->n * 256 && !reenter; k++) reenter = d->next[k] == 0;
    int start2 = reenter ? new_state(b, r) : from;   /* d's start when re-entered */
    for (int i = 0; i < d->n && !b->failed; i++) {
        const int32_t *row = d->next + (size_t)i * 256;
        for (int c = 0; c < 256;) {
            if (row[c] < 0) { c++; continue; }
            int e = c;
            while (e + 1 < 256 && row[e + 1] == row[c]) e++;
            int to = row[c] == 0 ? start2 : m[row[c]];
            ak_gbuild_bytes(b, m[i], c, e, to);
            if (i == 0 && reenter) ak_gbuild_bytes(b, start2, c, e, to);
            c = e + 1;
        }
    }
    if (reenter && d->tag[0] >= 0) ak_gbuild_accept(b, start2);
    if (!map) free(m);
    return b->failed ? -1 : 0;
}

/* ---- the compiled grammar ------------------------------------------------------ */

struct ak_grammar {
    int n, nr, ncls, root;
    uint8_t cls[256];
    int32_t *trans;      /* n * ncls */
    uint8_t *acc, *has_bytes;
    int32_t *call_off, *call_rule, *call_ret;
    int32_t *rstart, *srule;
    long *dist;          /* fewest bytes to the end of the state's rule */
    /* the first step of a shortest close: kind 0 end, 1 byte, 2 call */
    uint8_t *best_kind, *best_byte;
    int32_t *best_to;    /* byte: target; call: index into call_rule/call_ret */
};

/* Frees g (NULL is fine). */
void ak_grammar_free(ak_grammar *g) {
    if (!g) return;
    free(g->trans);
    free(g->acc);
    free(g->has_bytes);
    free(g->call_off);
    free(g->call_rule);
    free(g->call_ret);
    free(g->rstart);
    free(g->srule);
    free(g->dist);
    free(g->best_kind);
    free(g->best_byte);
    free(g->best_to);
    free(g);
}

int ak_grammar_root(const ak_grammar *g) { return g->root; }
int ak_grammar_n_rules(const ak_grammar *g) { return g->nr; }
int ak_grammar_n_states(const ak_grammar *g) { return g->n; }
long ak_grammar_rule_min(const ak_grammar *g, int r) {
    return r >= 0 && r < g->nr ? g->dist[g->rstart[r]] : -1;
}

/* Fills t with g's tables. */
void ak_grammar_get_tables(const ak_grammar *g, ak_grammar_tables *t) {
    *t = (ak_grammar_tables){.n_states = g->n, .n_rules = g->nr, .n_cls = g->ncls, .cls = g->cls,
                             .trans = g->trans, .accept = g->acc, .call_off = g->call_off,
                             .call_rule = g->call_rule, .call_ret = g->call_ret, .rule_start = g->rstart,
                             .state_rule = g->srule};
}

/* Whether the rules' start-state calls (calls made before a byte is read)
 * form a cycle; 1 when they do. color: 0 new, 1 on the path, 2 done. */
static int left_cycle(const ak_grammar *g, int r, uint8_t *color) {
    /* iterative DFS over rules with an explicit stack of (rule, next call) */
    int32_t *st = malloc((size_t)(g->nr + 1) * 2 * sizeof *st);
    if (!st) return -1;
    int sp = 0, cyc = 0;
    st[0] = r;
    st[1] = g->call_off[g->rstart[r]];
    color[r] = 1;
    sp = 1;
    while (sp > 0 && !cyc) {
        int cr = st[(sp - 1) * 2];
        int s = g->rstart[cr];
        int ci = st[(sp - 1) * 2 + 1];
        if (ci >= g->call_off[s + 1]) {
            color[cr] = 2;
            sp--;
            continue;
        }
        st[(sp - 1) * 2 + 1] = ci + 1;
        int callee = g->call_rule[ci];
        if (color[callee] == 1) cyc = 1;
        else if (color[callee] == 0) {
            color[callee] = 1;
            st[sp * 2] = callee;
            st[sp * 2 + 1] = g->call_off[g->rstart[callee]];
            sp++;
        }
    }
    free(st);
    return cyc;
}

/* Compiles the builder. Contract: grammar.h. */
ak_grammar *ak_gbuild_finish(ak_gbuild *b, int root, ak_gram_error *e) {
    if (b->failed) {
        ak_gram_fail(e, b->failed, "", "",
                     b->failed == AK_GRAM_E_TOO_LARGE ? "grammar past %d states" : "grammar building failed (limit %d)",
                     AK_GRAM_MAX_STATES);
        return NULL;
    }
    if (root < 0 || root >= b->nr) {
        ak_gram_fail(e, AK_GRAM_E_INVALID, "", "", "no such root rule");
        return NULL;
    }
    ak_grammar *g = calloc(1, sizeof *g);
    if (!g) goto nomem;
    int n = g->n = b->n;
    g->nr = b->nr;
    g->root = root;
    /* byte classes: a boundary wherever some edge starts or ends */
    uint8_t cut[257] = {0};
    cut[0] = 1;
    for (int i = 0; i < b->ne; i++) {
        cut[b->e[i].lo] = 1;
        cut[b->e[i].hi + 1] = 1;
    }
    int nc = -1;
    for (int c = 0; c < 256; c++) {
        if (cut[c]) nc++;
        g->cls[c] = (uint8_t)nc;
    }
    g->ncls = nc + 1;
    g->trans = malloc((size_t)n * g->ncls * sizeof *g->trans);
    g->acc = malloc((size_t)n);
    g->has_bytes = calloc((size_t)n, 1);
    g->call_off = calloc((size_t)n + 1, sizeof *g->call_off);
    g->call_rule = malloc(((size_t)b->nc + 1) * sizeof *g->call_rule);
    g->call_ret = malloc(((size_t)b->nc + 1) * sizeof *g->call_ret);
    g->rstart = malloc((size_t)g->nr * sizeof *g->rstart);
    g->srule = malloc((size_t)n * sizeof *g->srule);
    g->dist = malloc((size_t)n * sizeof *g->dist);
    g->best_kind = calloc((size_t)n, 1);
    g->best_byte = calloc((size_t)n, 1);
    g->best_to = malloc((size_t)n * sizeof *g->best_to);
    if (!g->trans || !g->acc || !g->has_bytes || !g->call_off || !g->call_rule || !g->call_ret || !g->rstart ||
        !g->srule || !g->dist || !g->best_kind || !g->best_byte || !g->best_to)
        goto nomem;
    memset(g->trans, 0xff, (size_t)n * g->ncls * sizeof *g->trans);
    memcpy(g->acc, b->acc, (size_t)n);
    memcpy(g->rstart, b->rstart, (size_t)g->nr * sizeof *g->rstart);
    memcpy(g->srule, b->rule, (size_t)n * sizeof *g->srule);
    for (int i = 0; i < b->ne; i++) {
        const bedge *ed = &b->e[i];
        for (int c = g->cls[ed->lo]; c <= g->cls[ed->hi]; c++) {
            int32_t *slot = &g->trans[(size_t)ed->from * g->ncls + c];
            if (*slot >= 0 && *slot != ed->to) {
                ak_gram_fail(e, AK_GRAM_E_INVALID, "", "", "overlapping byte edges at state %d", ed->from);
                ak_grammar_free(g);
                return NULL;
            }
            *slot = ed->to;
        }
    }
    for (int i = 0; i < b->nc; i++) g->call_off[b->c[i].from + 1]++;
    for (int s = 0; s < n; s++) g->call_off[s + 1] += g->call_off[s];
    {
        int32_t *fill = malloc(((size_t)n + 1) * sizeof *fill);
        if (!fill) goto nomem;
        memcpy(fill, g->call_off, ((size_t)n + 1) * sizeof *fill);
        for (int i = 0; i < b->nc; i++) {
            int k = fill[b->c[i].from]++;
            g->call_rule[k] = b->c[i].rule;
            g->call_ret[k] = b->c[i].to;
        }
        free(fill);
    }
    for (int r = 0; r < g->nr; r++)
        if (g->acc[g->rstart[r]]) {
            ak_gram_fail(e, AK_GRAM_E_INVALID, "", "", "rule %d matches the empty string", r);
            ak_grammar_free(g);
            return NULL;
        }
    /* shortest close: relax until stable (most edges point to later states,
     * so a backward sweep settles most of them in one pass) */
    for (int s = 0; s < n; s++) g->dist[s] = g->acc[s] ? 0 : INF_DIST;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int s = n - 1; s >= 0; s--) {
            long d = g->dist[s];
            for (int i = b->ehead[s]; i >= 0; i = b->e[i].next) {
                long t = g->dist[b->e[i].to];
                if (t < INF_DIST && t + 1 < d) d = t + 1;
            }
            for (int k = g->call_off[s]; k < g->call_off[s + 1]; k++) {
                long rm = g->dist[g->rstart[g->call_rule[k]]], t = g->dist[g->call_ret[k]];
                if (rm < INF_DIST && t < INF_DIST && rm + t < d) d = rm + t;
            }
            if (d < g->dist[s]) {
                g->dist[s] = d;
                changed = 1;
            }
        }
    }
    if (g->dist[g->rstart[root]] >= INF_DIST) {
        ak_gram_fail(e, AK_GRAM_E_UNSATISFIABLE, "", "", "the grammar matches nothing (no instance is valid)");
        ak_grammar_free(g);
        return NULL;
    }
    /* drop what cannot close; record each state's first closing step */
    for (int s = 0; s < n; s++) {
        int32_t *row = g->trans + (size_t)s * g->ncls;
        for (int c = 0; c < g->ncls; c++) {
            if (row[c] >= 0 && g->dist[row[c]] >= INF_DIST) row[c] = -1;
            if (row[c] >= 0) g->has_bytes[s] = 1;
        }
        g->best_kind[s] = 0;
        g->best_to[s] = -1;
        if (g->acc[s] || g->dist[s] >= INF_DIST) continue;
        int found = 0;
        /* the smallest byte among the shortest ways, so closes are stable */
        for (int i = b->ehead[s]; i >= 0; i = b->e[i].next)
            if (g->dist[b->e[i].to] + 1 == g->dist[s] && (!found || b->e[i].lo < g->best_byte[s])) {
                g->best_kind[s] = 1;
                g->best_byte[s] = b->e[i].lo;
                g->best_to[s] = b->e[i].to;
                found = 1;
            }
        for (int k = g->call_off[s]; k < g->call_off[s + 1] && !found; k++) {
            long rm = g->dist[g->rstart[g->call_rule[k]]], t = g->dist[g->call_ret[k]];
            if (rm < INF_DIST && t < INF_DIST && rm + t == g->dist[s]) {
                g->best_kind[s] = 2;
                g->best_to[s] = k;
                found = 1;
            }
        }
    }
    {
        /* compact the calls: drop those into rules or returns that cannot close */
        int w = 0;
        for (int s = 0, k = 0; s < n; s++) {
            int end = g->call_off[s + 1];
            g->call_off[s] = w;
            for (; k < end; k++) {
                if (g->dist[g->rstart[g->call_rule[k]]] >= INF_DIST || g->dist[g->call_ret[k]] >= INF_DIST) continue;
                if (g->best_kind[s] == 2 && g->best_to[s] == k) g->best_to[s] = w;
                g->call_rule[w] = g->call_rule[k];
                g->call_ret[w] = g->call_ret[k];
                w++;
            }
        }
        g->call_off[n] = w;
    }
    {
        uint8_t *color = calloc((size_t)g->nr, 1);
        if (!color) goto nomem;
        int cyc = 0;
        for (int r = 0; r < g->nr && !cyc; r++)
            if (!color[r]) cyc = left_cycle(g, r, color);
        free(color);
        if (cyc) {
            ak_gram_fail(e, cyc < 0 ? AK_GRAM_E_NOMEM : AK_GRAM_E_INVALID, "", "",
                         cyc < 0 ? "out of memory" : "rules call each other before reading a byte");
            ak_grammar_free(g);
            return NULL;
        }
    }
    return g;
nomem:
    ak_gram_fail(e, AK_GRAM_E_NOMEM, "", "", "out of memory compiling the grammar");
    ak_grammar_free(g);
    return NULL;
}

/* ---- the matcher --------------------------------------------------------------- */

/* A set of stacks: stack i is fr[off[i] .. off[i] + len[i]), its top last. */
typedef struct {
    int n, cap;
    int32_t *off, *len;
    int32_t *fr;
    size_t nf, fcap;
    int complete;       /* some parse ends exactly here */
    int32_t ht[AK_GMATCH_MAX_STACKS * 2];   /* dedup table: stack index + 1, 0 empty */
} stackset;

struct ak_gmatch {
    const ak_grammar *g;
    int free_mode;
    uint64_t pos;
    stackset a, b;       /* a: current; b: scratch for the next */
    int32_t *work;       /* AK_GMATCH_MAX_DEPTH + 1 frames */
};

static void ss_free(stackset *s) {
    free(s->off);
    free(s->len);
    free(s->fr);
}

static void ss_clear(stackset *s) {
    s->n = 0;
    s->nf = 0;
    s->complete = 0;
    memset(s->ht, 0, sizeof s->ht);
}

static uint32_t frames_hash(const int32_t *f, int len) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < len; i++) h = (h ^ (uint32_t)f[i]) * 16777619u;
    return h;
}

/* Adds stack w[0..len) unless present or the set is full. Returns 0 or -1
 * (memory). */
static int ss_add(stackset *s, const int32_t *w, int len) {
    if (s->n >= AK_GMATCH_MAX_STACKS) return 0;
    uint32_t h = frames_hash(w, len);
    size_t mask = sizeof s->ht / sizeof s->ht[0] - 1, i = h & mask;
    for (; s->ht[i]; i = (i + 1) & mask) {
        int k = s->ht[i] - 1;
        if (s->len[k] == len && !memcmp(s->fr + s->off[k], w, (size_t)len * sizeof *w)) return 0;
    }
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 8;
        int32_t *o = realloc(s->off, (size_t)nc * sizeof *o);
        if (!o) return -1;
        s->off = o;
        int32_t *l = realloc(s->len, (size_t)nc * sizeof *l);
        if (!l) return -1;
        s->len = l;
        s->cap = nc;
    }
    if (s->nf + (size_t)len > s->fcap) {
        size_t nc = s->fcap ? s->fcap * 2 : 64;
        while (nc < s->nf + (size_t)len) nc *= 2;
        int32_t *f = realloc(s->fr, nc * sizeof *f);
        if (!f) return -1;
        s->fr = f;
        s->fcap = nc;
    }
    memcpy(s->fr + s->nf, w, (size_t)len * sizeof *w);
    s->off[s->n] = (int32_t)s->nf;
    s->len[s->n] = len;
    s->nf += (size_t)len;
    s->ht[i] = ++s->n;
    return 0;
}

/* Expands the stack w[0..len) (its top may be mid-closure) into the stacks
 * whose tops read bytes, adding them to s; a pop past the bottom marks s
 * complete. Returns 0 or -1 (memory). */
static int expand(const ak_grammar *g, stackset *s, int32_t *w, int len) {
    int q = w[len - 1];
    if (g->has_bytes[q] && ss_add(s, w, len) < 0) return -1;
    if (g->acc[q]) {
        if (len == 1) s->complete = 1;
        else if (expand(g, s, w, len - 1) < 0) return -1;
        w[len - 1] = q;   /* the pop leaves w[len-1] as it was; restore anyway */
    }
    if (len < AK_GMATCH_MAX_DEPTH)
        for (int k = g->call_off[q]; k < g->call_off[q + 1]; k++) {
            w[len - 1] = g->call_ret[k];
            w[len] = g->rstart[g->call_rule[k]];
            int rc = expand(g, s, w, len + 1);
            w[len - 1] = q;
            if (rc < 0) return -1;
        }
    return 0;
}

/* A matcher for g, FREE when free_mode. */
static ak_gmatch *gmatch_make(const ak_grammar *g, int free_mode) {
    ak_gmatch *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->g = g;
    m->work = malloc((AK_GMATCH_MAX_DEPTH + 1) * sizeof *m->work);
    if (!m->work) { free(m); return NULL; }
    m->free_mode = 1;
    if (!free_mode && ak_gmatch_begin(m, g->root) < 0) {
        ak_gmatch_free(m);
        return NULL;
    }
    return m;
}

ak_gmatch *ak_gmatch_new(const ak_grammar *g) { return gmatch_make(g, 0); }
ak_gmatch *ak_gmatch_new_free(const ak_grammar *g) { return gmatch_make(g, 1); }
const ak_grammar *ak_gmatch_grammar(const ak_gmatch *m) { return m->g; }
int ak_gmatch_is_free(const ak_gmatch *m) { return m->free_mode; }
uint64_t ak_gmatch_pos(const ak_gmatch *m) { return m->pos; }

/* Frees m (NULL is fine). */
void ak_gmatch_free(ak_gmatch *m) {
    if (!m) return;
    ss_free(&m->a);
    ss_free(&m->b);
    free(m->work);
    free(m);
}

/* Starts rule r at the current position. */
int ak_gmatch_begin(ak_gmatch *m, int r) {
    if (r < 0 || r >= m->g->nr) return -1;
    ss_clear(&m->a);
    m->work[0] = m->g->rstart[r];
    if (expand(m->g, &m->a, m->work, 1) < 0) return -1;
    m->free_mode = 0;
    m->pos = 0;
    return 0;
}

/* Starts at state s alone. */
int ak_gmatch_begin_state(ak_gmatch *m, int s) {
    if (s < 0 || s >= m->g->n) return -1;
    ss_clear(&m->a);
    m->work[0] = s;
    if (expand(m->g, &m->a, m->work, 1) < 0) return -1;
    m->free_mode = 0;
    m->pos = 0;
    return 0;
}

int ak_gmatch_n_stacks(const ak_gmatch *m) { return m->free_mode ? 0 : m->a.n; }

/* Copies one stack set into another (dst's buffers reused). */
static int ss_copy(stackset *d, const stackset *s) {
    if (d->cap < s->n) {
        int32_t *o = realloc(d->off, (size_t)s->n * sizeof *o);
        if (!o) return -1;
        d->off = o;
        int32_t *l = realloc(d->len, (size_t)s->n * sizeof *l);
        if (!l) return -1;
        d->len = l;
        d->cap = s->n;
    }
    if (d->fcap < s->nf) {
        int32_t *f = realloc(d->fr, s->nf * sizeof *f);
        if (!f) return -1;
        d->fr = f;
        d->fcap = s->nf;
    }
    d->n = s->n;
    d->nf = s->nf;
    d->complete = s->complete;
    if (s->n) {
        memcpy(d->off, s->off, (size_t)s->n * sizeof *d->off);
        memcpy(d->len, s->len, (size_t)s->n * sizeof *d->len);
    }
    if (s->nf) memcpy(d->fr, s->fr, s->nf * sizeof *d->fr);
    memcpy(d->ht, s->ht, sizeof d->ht);
    return 0;
}

/* dst := src. */
int ak_gmatch_copy(ak_gmatch *dst, const ak_gmatch *src) {
    if (dst->g != src->g) return -1;
    dst->free_mode = src->free_mode;
    dst->pos = src->pos;
    return ss_copy(&dst->a, &src->a);
}

/* A copy of src, or NULL. */
ak_gmatch *ak_gmatch_clone(const ak_gmatch *src) {
    ak_gmatch *m = gmatch_make(src->g, 1);
    if (m && ak_gmatch_copy(m, src) < 0) {
        ak_gmatch_free(m);
        return NULL;
    }
    return m;
}

/* One byte: the next set into m->b; returns 1 when some stack survives (or
 * the result is complete... never: a byte consumed leaves a top that read
 * it), 0 when none does, -1 on memory. */
static int step(ak_gmatch *m, int c) {
    const ak_grammar *g = m->g;
    stackset *cur = &m->a, *nx = &m->b;
    ss_clear(nx);
    int cl = g->cls[c];
    for (int i = 0; i < cur->n; i++) {
        const int32_t *f = cur->fr + cur->off[i];
        int len = cur->len[i];
        int t = g->trans[(size_t)f[len - 1] * g->ncls + cl];
        if (t < 0) continue;
        memcpy(m->work, f, (size_t)(len - 1) * sizeof *f);
        m->work[len - 1] = t;
        if (expand(g, nx, m->work, len) < 0) return -1;
    }
    return nx->n > 0 || nx->complete;
}

/* Feeds one byte. */
int ak_gmatch_feed_byte(ak_gmatch *m, int c) {
    if (m->free_mode) { m->pos++; return 0; }
    int ok = step(m, c & 0xff);
    if (ok <= 0) return -1;
    stackset t = m->a;
    m->a = m->b;
    m->b = t;
    m->pos++;
    return 0;
}

/* Feeds s[0..n), all or nothing. */
int ak_gmatch_feed(ak_gmatch *m, const void *s, size_t n) {
    if (m->free_mode) { m->pos += n; return 0; }
    const uint8_t *p = s;
    if (n == 1) return ak_gmatch_feed_byte(m, p[0]);
    /* keep the starting state in a third set so a failure can be undone */
    stackset save = {0};
    if (ss_copy(&save, &m->a) < 0) { ss_free(&save); return -1; }
    uint64_t pos0 = m->pos;
    for (size_t i = 0; i < n; i++)
        if (ak_gmatch_feed_byte(m, p[i]) < 0) {
            ss_copy(&m->a, &save);
            m->pos = pos0;
            ss_free(&save);
            return -1;
        }
    ss_free(&save);
    return 0;
}

int ak_gmatch_accepting(const ak_gmatch *m) { return m->free_mode || m->a.complete; }
int ak_gmatch_finished(const ak_gmatch *m) { return !m->free_mode && m->a.complete && m->a.n == 0; }

/* Distinct top states of the live stacks. */
int ak_gmatch_tops(const ak_gmatch *m, int32_t *tops, int cap) {
    int k = 0;
    for (int i = 0; i < m->a.n && k < cap; i++) {
        int32_t t = m->a.fr[m->a.off[i] + m->a.len[i] - 1];
        int dup = 0;
        for (int j = 0; j < k && !dup; j++) dup = tops[j] == t;
        if (!dup) tops[k++] = t;
    }
    return k;
}

/* The cost to close stack i of set s. */
static long stack_cost(const ak_grammar *g, const stackset *s, int i) {
    long c = 0;
    for (int j = 0; j < s->len[i]; j++) c += g->dist[s->fr[s->off[i] + j]];
    return c;
}

/* Index of the cheapest stack to close, or -1 when there is none. */
static int best_stack(const ak_gmatch *m, long *cost) {
    int bi = -1;
    long bc = INF_DIST;
    for (int i = 0; i < m->a.n; i++) {
        long c = stack_cost(m->g, &m->a, i);
        if (c < bc) { bc = c; bi = i; }
    }
    *cost = bc;
    return bi;
}

long ak_gmatch_close_len(const ak_gmatch *m) {
    if (m->free_mode || m->a.complete) return 0;
    long c;
    return best_stack(m, &c) >= 0 ? c : -1;
}

/* Writes the shortest path from state q to its rule's end into out at *n
 * (bounded by cap); returns 0 or -1 when it does not fit. */
static int close_from(const ak_grammar *g, int q, char *out, size_t cap, size_t *n) {
    while (!(g->acc[q] && g->dist[q] == 0)) {
        if (g->best_kind[q] == 1) {
            if (*n >= cap) return -1;
            out[(*n)++] = (char)g->best_byte[q];
            q = g->best_to[q];
        } else if (g->best_kind[q] == 2) {
            int k = g->best_to[q];
            if (close_from(g, g->rstart[g->call_rule[k]], out, cap, n) < 0) return -1;
            q = g->call_ret[k];
        } else return -1;
    }
    return 0;
}

long ak_gmatch_close_path(const ak_gmatch *m, char *out, size_t cap) {
    if (m->free_mode || m->a.complete) return 0;
    long c;
    int i = best_stack(m, &c);
    if (i < 0 || (size_t)c > cap) return -1;
    size_t n = 0;
    const int32_t *f = m->a.fr + m->a.off[i];
    for (int j = m->a.len[i] - 1; j >= 0; j--)
        if (close_from(m->g, f[j], out, cap, &n) < 0) return -1;
    return (long)n;
}
