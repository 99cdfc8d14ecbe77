/* tokmask.c - the vocabulary trie, the per-state precomputed masks and the
 * run-time mask. Contract: tokmask.h. */
#include <stdlib.h>
#include <string.h>

#include "text/tokmask.h"

/* ---- the vocabulary index --------------------------------------------------------- */

struct ak_vocab_index {
    int32_t n;
    char *bytes;
    size_t *off;
    uint32_t *len;
    uint8_t *eog;
    int max_len;
    /* the trie in preorder (a node per byte; the root is implicit): node i
     * reads byte nb[i] at depth nd[i] (1-based); its subtree is [i, nend[i]);
     * ntok[i] is the first token whose bytes end there (tnext chains the rest) */
    int32_t nn;
    uint8_t *nb;
    uint16_t *nd;
    int32_t *nend, *ntok, *tnext;
    int32_t *eogs;
    int32_t n_eog;
};

/* Byte order, a prefix first (qsort_r with the index as context). */
static int cmp_tok(const void *x, const void *y, void *ctx) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    const ak_vocab_index *v = ctx;
    uint32_t la = v->len[a], lb = v->len[b];
    int c = memcmp(v->bytes + v->off[a], v->bytes + v->off[b], la < lb ? la : lb);
    if (c) return c;
    return la < lb ? -1 : la > lb ? 1 : (a > b) - (a < b);
}

/* Frees v (NULL is fine). */
void ak_vocab_index_free(ak_vocab_index *v) {
    if (!v) return;
    free(v->bytes);
    free(v->off);
    free(v->len);
    free(v->eog);
    free(v->nb);
    free(v->nd);
    free(v->nend);
    free(v->ntok);
    free(v->tnext);
    free(v->eogs);
    free(v);
}

int32_t ak_vocab_index_size(const ak_vocab_index *v) { return v->n; }
int ak_vocab_index_max_len(const ak_vocab_index *v) { return v->max_len; }
const char *ak_vocab_index_token(const ak_vocab_index *v, int32_t id, size_t *len) {
    if (id < 0 || id >= v->n) { *len = 0; return ""; }
    *len = v->len[id];
    return v->bytes + v->off[id];
}

/* Builds the index from byte strings. Contract: tokmask.h. */
ak_vocab_index *ak_vocab_index_from_bytes(const char *const *bytes, const size_t *lens, const uint8_t *eog, int32_t n,
                                          ak_gram_error *e) {
    ak_vocab_index *v = calloc(1, sizeof *v);
    int32_t *order = NULL, *path = NULL;
    if (!v) goto nomem;
    v->n = n;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) total += lens[i];
    v->bytes = malloc(total + 1);
    v->off = malloc(((size_t)n + 1) * sizeof *v->off);
    v->len = malloc(((size_t)n + 1) * sizeof *v->len);
    v->eog = calloc((size_t)n + 1, 1);
    v->tnext = malloc(((size_t)n + 1) * sizeof *v->tnext);
    v->eogs = malloc(((size_t)n + 1) * sizeof *v->eogs);
    order = malloc(((size_t)n + 1) * sizeof *order);
    if (!v->bytes || !v->off || !v->len || !v->eog || !v->tnext || !v->eogs || !order) goto nomem;
    size_t at = 0;
    int32_t no = 0;
    for (int32_t i = 0; i < n; i++) {
        v->off[i] = at;
        v->len[i] = (uint32_t)(lens[i] > 65535 ? 65535 : lens[i]);
        memcpy(v->bytes + at, bytes[i], v->len[i]);
        at += v->len[i];
        v->eog[i] = eog ? eog[i] : 0;
        if (v->eog[i]) v->eogs[v->n_eog++] = i;
        v->tnext[i] = -1;
        if (v->len[i] > (uint32_t)v->max_len) v->max_len = (int)v->len[i];
        if (v->len[i]) order[no++] = i;
    }
    qsort_r(order, (size_t)no, sizeof *order, cmp_tok, v);
    /* nodes: at most total bytes */
    v->nb = malloc(total + 1);
    v->nd = malloc((total + 1) * sizeof *v->nd);
    v->nend = malloc((total + 1) * sizeof *v->nend);
    v->ntok = malloc((total + 1) * sizeof *v->ntok);
    path = malloc(((size_t)v->max_len + 1) * sizeof *path);
    if (!v->nb || !v->nd || !v->nend || !v->ntok || !path) goto nomem;
    int depth = 0;
    int32_t prev = -1;
    for (int32_t k = 0; k < no; k++) {
        int32_t t = order[k];
        const uint8_t *b = (const uint8_t *)v->bytes + v->off[t];
        int l = 0;
        if (prev >= 0) {
            const uint8_t *pb = (const uint8_t *)v->bytes + v->off[prev];
            int m = (int)(v->len[prev] < v->len[t] ? v->len[prev] : v->len[t]);
            while (l < m && pb[l] == b[l]) l++;
        }
        if (l > depth) l = depth;
        while (depth > l) v->nend[path[--depth]] = v->nn;
        for (; depth < (int)v->len[t]; depth++) {
            int32_t i = v->nn++;
            v->nb[i] = b[depth];
            v->nd[i] = (uint16_t)(depth + 1);
            v->ntok[i] = -1;
            path[depth] = i;
        }
        int32_t node = path[v->len[t] - 1];
        v->tnext[t] = v->ntok[node];
        v->ntok[node] = t;
        prev = t;
    }
    while (depth > 0) v->nend[path[--depth]] = v->nn;
    free(order);
    free(path);
    return v;
nomem:
    ak_gram_fail(e, AK_GRAM_E_NOMEM, "", "", "out of memory indexing the vocabulary");
    free(order);
    free(path);
    ak_vocab_index_free(v);
    return NULL;
}

/* The index of a tokenizer's vocabulary. */
ak_vocab_index *ak_vocab_index_new(const ak_tokenizer *tk, ak_gram_error *e) {
    int32_t n = ak_tokenizer_vocab_size(tk);
    const char **b = malloc(((size_t)n + 1) * sizeof *b);
    size_t *l = malloc(((size_t)n + 1) * sizeof *l);
    uint8_t *eog = malloc((size_t)n + 1);
    ak_vocab_index *v = NULL;
    if (b && l && eog) {
        for (int32_t i = 0; i < n; i++) {
            ak_token_bytes(tk, i, &b[i], &l[i]);
            eog[i] = (uint8_t)ak_token_is_eog(tk, i);
        }
        v = ak_vocab_index_from_bytes(b, l, eog, n, e);
    } else ak_gram_fail(e, AK_GRAM_E_NOMEM, "", "", "out of memory");
    free(b);
    free(l);
    free(eog);
    return v;
}

/* ---- precomputed masks ---------------------------------------------------------------- */

/* One group's tokens: accepted whatever the stack (a bitset when many, else
 * a list), and the uncertain ones in trie order. */
typedef struct {
    uint32_t *bits;
    int32_t *acc;
    int32_t n_acc;
    int32_t *unc;
    int32_t n_unc;
} group_mask;

struct ak_tokmask {
    const ak_grammar *g;
    const ak_vocab_index *v;
    ak_grammar_tables t;
    int32_t *group;       /* per state; -1 for states that read no byte */
    int32_t n_groups;
    group_mask *gm;
    size_t words, bytes;
    long min_tokens;
};

/* Bytes that may follow each rule's end (over all its calls), as 256 flags
 * per rule: a first byte of the return state, or what follows its rule
 * when the return state may end it. */
static uint8_t *follow_sets(const ak_grammar_tables *t) {
    size_t n = (size_t)t->n_states, nr = (size_t)t->n_rules;
    uint8_t *first = calloc(n * 256, 1), *fol = calloc(nr * 256, 1);
    if (!first || !fol) { free(first); free(fol); return NULL; }
    for (size_t s = 0; s < n; s++)
        for (int b = 0; b < 256; b++)
            if (t->trans[s * t->n_cls + t->cls[b]] >= 0) first[s * 256 + b] = 1;
    for (int changed = 1; changed;) {
        changed = 0;
        for (size_t s = 0; s < n; s++)
            for (int k = t->call_off[s]; k < t->call_off[s + 1]; k++) {
                const uint8_t *src = first + (size_t)t->rule_start[t->call_rule[k]] * 256;
                for (int b = 0; b < 256; b++)
                    if (src[b] && !first[s * 256 + b]) { first[s * 256 + b] = 1; changed = 1; }
            }
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (size_t s = 0; s < n; s++)
            for (int k = t->call_off[s]; k < t->call_off[s + 1]; k++) {
                int ret = t->call_ret[k];
                uint8_t *dst = fol + (size_t)t->call_rule[k] * 256;
                const uint8_t *a = first + (size_t)ret * 256;
                const uint8_t *f = t->accept[ret] ? fol + (size_t)t->state_rule[ret] * 256 : NULL;
                for (int b = 0; b < 256; b++)
                    if (!dst[b] && (a[b] || (f && f[b]))) { dst[b] = 1; changed = 1; }
            }
    }
    free(first);
    return fol;
}

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0xBF58476D1CE4E5B9ull;
}

/* Groups of states that no token of at most k bytes tells apart: Moore's
 * refinement for k rounds (or until stable), starting from (accepting, the
 * rule's follow set). Signatures are 128-bit hashes. Returns the number of
 * groups, or -1 on memory. */
static int32_t group_states(const ak_grammar_tables *t, const uint8_t *fol, int k, int32_t *cls) {
    size_t n = (size_t)t->n_states;
    uint64_t *h1 = malloc(n * sizeof *h1), *h2 = malloc(n * sizeof *h2);
    int32_t *nc = malloc(n * sizeof *nc);
    size_t hcap = 1;
    while (hcap < n * 2) hcap *= 2;
    int32_t *ht = malloc(hcap * sizeof *ht);
    int32_t ngroups = -1;
    if (!h1 || !h2 || !nc || !ht) goto out;
    for (size_t s = 0; s < n; s++) {
        uint64_t a = mix(1, t->accept[s]), b = mix(2, t->accept[s]);
        const uint8_t *f = fol + (size_t)t->state_rule[s] * 256;
        for (int i = 0; i < 256; i++)
            if (f[i]) { a = mix(a, (uint64_t)i); b = mix(b, (uint64_t)i * 7 + 3); }
        h1[s] = a;
        h2[s] = b;
    }
    int32_t prev = -1;
    for (int round = 0; round <= k + 1; round++) {
        /* number the signatures */
        memset(ht, 0xff, hcap * sizeof *ht);
        int32_t ng = 0;
        for (size_t s = 0; s < n; s++) {
            size_t i = (size_t)(h1[s] ^ (h1[s] >> 29)) & (hcap - 1);
            for (;; i = (i + 1) & (hcap - 1)) {
                if (ht[i] < 0) { ht[i] = (int32_t)s; nc[s] = ng++; break; }
                size_t o = (size_t)ht[i];
                if (h1[o] == h1[s] && h2[o] == h2[s]) { nc[s] = nc[o]; break; }
            }
        }
        memcpy(cls, nc, n * sizeof *cls);
        if (ng == prev || round == k + 1) { ngroups = ng; break; }
        prev = ng;
        for (size_t s = 0; s < n; s++) {
            uint64_t a = mix(3, (uint64_t)cls[s]), b = mix(4, (uint64_t)cls[s]);
            const int32_t *row = t->trans + s * t->n_cls;
            for (int c = 0; c < t->n_cls; c++) {
                uint64_t x = row[c] < 0 ? 0xFFFFFFFFull : (uint64_t)cls[row[c]];
                a = mix(a, x);
                b = mix(b, x * 31 + (uint64_t)c);
            }
            /* calls: order-free (sum of their hashes) */
            uint64_t ca = 0, cb = 0;
            for (int q = t->call_off[s]; q < t->call_off[s + 1]; q++) {
                uint64_t x = mix(mix(5, (uint64_t)cls[t->rule_start[t->call_rule[q]]]), (uint64_t)cls[t->call_ret[q]]);
                ca += x;
                cb += mix(x, 6);
            }
            h1[s] = mix(a, ca);
            h2[s] = mix(b, cb);
        }
    }
out:
    free(h1);
    free(h2);
    free(nc);
    free(ht);
    return ngroups;
}

/* A walk of the trie from one state: per depth, the state reached (fast:
 * one stack of one frame with no calls or end; else a matcher). */
typedef struct {
    const ak_tokmask *tm;
    const uint8_t *simple;   /* per state: reads bytes only (no calls, not accepting) */
    const uint8_t *follow;   /* 256 flags: the bytes that may follow the start state's rule */
    ak_gmatch **mt;          /* max_len + 1 matchers */
    int32_t *fq;             /* fast state per depth, -1 when slow */
    uint8_t *comp, *unc;     /* per depth: the rule may end here / a token may continue past an end */
    int32_t *acc, *uncl;
    int32_t nacc, nunc;
} walker;

/* Walks the trie from state q, filling w->acc and w->uncl. Returns 0 or -1. */
static int walk(walker *w, int32_t q) {
    const ak_vocab_index *v = w->tm->v;
    const ak_grammar_tables *t = &w->tm->t;
    w->nacc = w->nunc = 0;
    if (w->simple[q]) {
        w->fq[0] = q;
        w->comp[0] = 0;
    } else {
        w->fq[0] = -1;
        if (ak_gmatch_begin_state(w->mt[0], q) < 0) return -1;
        w->comp[0] = (uint8_t)ak_gmatch_accepting(w->mt[0]);
    }
    w->unc[0] = 0;
    for (int32_t i = 0; i < v->nn;) {
        int d = v->nd[i], b = v->nb[i], live;
        w->unc[d] = w->unc[d - 1] || (w->comp[d - 1] && w->follow[b]);
        w->comp[d] = 0;
        if (w->fq[d - 1] >= 0) {
            int32_t nq = t->trans[(size_t)w->fq[d - 1] * t->n_cls + t->cls[b]];
            live = nq >= 0;
            if (live && w->simple[nq]) w->fq[d] = nq;
            else if (live) {
                w->fq[d] = -1;
                if (ak_gmatch_begin_state(w->mt[d], nq) < 0) return -1;
                w->comp[d] = (uint8_t)ak_gmatch_accepting(w->mt[d]);
            }
        } else {
            w->fq[d] = -1;
            if (ak_gmatch_copy(w->mt[d], w->mt[d - 1]) < 0) return -1;
            live = ak_gmatch_feed_byte(w->mt[d], b) == 0;
            if (live) w->comp[d] = (uint8_t)ak_gmatch_accepting(w->mt[d]);
        }
        if (live || w->unc[d])
            for (int32_t tk = v->ntok[i]; tk >= 0; tk = v->tnext[tk]) {
                if (live) w->acc[w->nacc++] = tk;
                else w->uncl[w->nunc++] = tk;
            }
        if (live) { i++; continue; }
        if (w->unc[d])   /* the whole subtree may go on past the end */
            for (int32_t j = i + 1; j < v->nend[i]; j++)
                for (int32_t tk = v->ntok[j]; tk >= 0; tk = v->tnext[tk]) w->uncl[w->nunc++] = tk;
        i = v->nend[i];
    }
    return 0;
}

/* Frees tm (NULL is fine). */
void ak_tokmask_free(ak_tokmask *tm) {
    if (!tm) return;
    for (int32_t i = 0; i < tm->n_groups && tm->gm; i++) {
        free(tm->gm[i].bits);
        free(tm->gm[i].acc);
        free(tm->gm[i].unc);
    }
    free(tm->gm);
    free(tm->group);
    free(tm);
}

/* Precomputes the masks. Contract: tokmask.h. */
ak_tokmask *ak_tokmask_new(const ak_grammar *g, const ak_vocab_index *v, ak_gram_error *e) {
    ak_tokmask *tm = calloc(1, sizeof *tm);
    uint8_t *fol = NULL, *simple = NULL;
    int32_t *cls = NULL, *rep = NULL;
    walker w = {0};
    int ok = 0;
    if (!tm) goto out;
    tm->g = g;
    tm->v = v;
    ak_grammar_get_tables(g, &tm->t);
    const ak_grammar_tables *t = &tm->t;
    size_t n = (size_t)t->n_states;
    tm->words = ((size_t)v->n + 31) / 32;
    fol = follow_sets(t);
    simple = malloc(n + 1);
    cls = malloc((n + 1) * sizeof *cls);
    tm->group = malloc((n + 1) * sizeof *tm->group);
    if (!fol || !simple || !cls || !tm->group) goto out;
    for (size_t s = 0; s < n; s++) simple[s] = !t->accept[s] && t->call_off[s] == t->call_off[s + 1];
    int32_t ng = group_states(t, fol, v->max_len, cls);
    if (ng < 0) goto out;
    /* only groups with a state that can be a stack's top (reads a byte) get a mask */
    rep = malloc(((size_t)ng + 1) * sizeof *rep);
    if (!rep) goto out;
    for (int32_t i = 0; i < ng; i++) rep[i] = -1;
    int32_t nmask = 0;
    int32_t *gid = malloc(((size_t)ng + 1) * sizeof *gid);
    if (!gid) goto out;
    for (int32_t i = 0; i < ng; i++) gid[i] = -1;
    for (size_t s = 0; s < n; s++) {
        int reads = 0;
        const int32_t *row = t->trans + s * t->n_cls;
        for (int c = 0; c < t->n_cls && !reads; c++) reads = row[c] >= 0;
        if (!reads) { tm->group[s] = -1; continue; }
        if (gid[cls[s]] < 0) {
            gid[cls[s]] = nmask;
            rep[nmask++] = (int32_t)s;
        }
        tm->group[s] = gid[cls[s]];
    }
    free(gid);
    tm->n_groups = nmask;
    tm->gm = calloc((size_t)nmask + 1, sizeof *tm->gm);
    w.tm = tm;
    w.simple = simple;
    w.mt = calloc((size_t)v->max_len + 2, sizeof *w.mt);
    w.fq = malloc(((size_t)v->max_len + 2) * sizeof *w.fq);
    w.comp = malloc((size_t)v->max_len + 2);
    w.unc = malloc((size_t)v->max_len + 2);
    w.acc = malloc(((size_t)v->n + 1) * sizeof *w.acc);
    w.uncl = malloc(((size_t)v->n + 1) * sizeof *w.uncl);
    if (!tm->gm || !w.mt || !w.fq || !w.comp || !w.unc || !w.acc || !w.uncl) goto out;
    for (int i = 0; i <= v->max_len; i++)
        if (!(w.mt[i] = ak_gmatch_new_free(g))) goto out;
    for (int32_t gi = 0; gi < nmask; gi++) {
        int32_t q = rep[gi];
        w.follow = fol + (size_t)t->state_rule[q] * 256;
        if (walk(&w, q) < 0) goto out;
        group_mask *gm = &tm->gm[gi];
        if ((size_t)w.nacc > tm->words) {
            gm->bits = calloc(tm->words, sizeof *gm->bits);
            if (!gm->bits) goto out;
            for (int32_t i = 0; i < w.nacc; i++) gm->bits[w.acc[i] >> 5] |= 1u << (w.acc[i] & 31);
            tm->bytes += tm->words * 4;
        } else if (w.nacc) {
            gm->acc = malloc((size_t)w.nacc * sizeof *gm->acc);
            if (!gm->acc) goto out;
            memcpy(gm->acc, w.acc, (size_t)w.nacc * sizeof *gm->acc);
            tm->bytes += (size_t)w.nacc * 4;
        }
        gm->n_acc = w.nacc;
        if (w.nunc) {
            gm->unc = malloc((size_t)w.nunc * sizeof *gm->unc);
            if (!gm->unc) goto out;
            memcpy(gm->unc, w.uncl, (size_t)w.nunc * sizeof *gm->unc);
            tm->bytes += (size_t)w.nunc * 4;
        }
        gm->n_unc = w.nunc;
    }
    {
        ak_gmatch *m = ak_gmatch_new(g);
        if (!m) goto out;
        tm->min_tokens = ak_tokmask_close_plan(tm, m, NULL, 0);
        ak_gmatch_free(m);
    }
    ok = 1;
out:
    if (!ok) ak_gram_fail(e, AK_GRAM_E_NOMEM, "", "", "out of memory precomputing token masks");
    for (int i = 0; w.mt && i <= v->max_len; i++) ak_gmatch_free(w.mt[i]);
    free(w.mt);
    free(w.fq);
    free(w.comp);
    free(w.unc);
    free(w.acc);
    free(w.uncl);
    free(fol);
    free(simple);
    free(cls);
    free(rep);
    if (!ok) {
        ak_tokmask_free(tm);
        return NULL;
    }
    return tm;
}

void ak_tokmask_stats(const ak_tokmask *tm, int *n_states, int *n_groups, size_t *bytes) {
    *n_states = tm->t.n_states;
    *n_groups = tm->n_groups;
    *bytes = tm->bytes;
}

size_t ak_tokmask_words(const ak_tokmask *tm) { return tm->words; }

/* ---- the run-time mask ------------------------------------------------------------------ */

struct ak_tmscratch {
    ak_gmatch **md;   /* per depth */
    int depth;
    int32_t tops[AK_GMATCH_MAX_STACKS];
    int32_t groups[AK_GMATCH_MAX_STACKS];
};

ak_tmscratch *ak_tmscratch_new(const ak_tokmask *tm) {
    ak_tmscratch *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->depth = tm->v->max_len + 1;
    s->md = calloc((size_t)s->depth, sizeof *s->md);
    if (!s->md) { free(s); return NULL; }
    for (int i = 0; i < s->depth; i++)
        if (!(s->md[i] = ak_gmatch_new_free(tm->g))) { ak_tmscratch_free(s); return NULL; }
    return s;
}

void ak_tmscratch_free(ak_tmscratch *s) {
    if (!s) return;
    for (int i = 0; i < s->depth && s->md; i++) ak_gmatch_free(s->md[i]);
    free(s->md);
    free(s);
}

/* Checks the uncertain tokens of one group against the full state, in trie
 * order: a prefix fed once serves every token that shares it, and a prefix
 * that fails rules out the tokens after it that share it. Sets their bits. */
static int check_uncertain(const ak_tokmask *tm, const group_mask *gm, ak_tmscratch *s, uint32_t *mask) {
    const ak_vocab_index *v = tm->v;
    int have = 0, fail = 1 << 30;
    const uint8_t *pb = NULL;
    uint32_t pl = 0;
    for (int32_t k = 0; k < gm->n_unc; k++) {
        int32_t tk = gm->unc[k];
        if (mask[tk >> 5] >> (tk & 31) & 1) continue;
        const uint8_t *b = (const uint8_t *)v->bytes + v->off[tk];
        uint32_t len = v->len[tk], l = 0;
        if (pb) {
            uint32_t m = pl < len ? pl : len;
            while (l < m && pb[l] == b[l]) l++;
        }
        if (pb && (int)l >= fail) continue;   /* shares the prefix that failed */
        int d = (int)l < have ? (int)l : have;
        fail = 1 << 30;
        for (; d < (int)len; d++) {
            if (ak_gmatch_copy(s->md[d + 1], s->md[d]) < 0) return -1;
            if (ak_gmatch_feed_byte(s->md[d + 1], b[d]) < 0) { fail = d + 1; break; }
        }
        have = d;
        pb = b;
        pl = len;
        if (d == (int)len) mask[tk >> 5] |= 1u << (tk & 31);
    }
    return 0;
}

/* The mask of m's state. Contract: tokmask.h. */
long ak_tokmask_fill(const ak_tokmask *tm, const ak_gmatch *m, ak_tmscratch *s, uint32_t *mask) {
    const ak_vocab_index *v = tm->v;
    size_t words = tm->words;
    if (ak_gmatch_is_free(m)) {
        memset(mask, 0xff, words * 4);
        if (v->n & 31) mask[words - 1] = (1u << (v->n & 31)) - 1;
        return v->n;
    }
    memset(mask, 0, words * 4);
    int nt = ak_gmatch_tops(m, s->tops, AK_GMATCH_MAX_STACKS), ng = 0;
    for (int i = 0; i < nt; i++) {
        int32_t gi = tm->group[s->tops[i]];
        int dup = gi < 0;
        for (int j = 0; j < ng && !dup; j++) dup = s->groups[j] == gi;
        if (dup) continue;
        s->groups[ng++] = gi;
        const group_mask *gm = &tm->gm[gi];
        if (gm->bits)
            for (size_t w = 0; w < words; w++) mask[w] |= gm->bits[w];
        else
            for (int32_t k = 0; k < gm->n_acc; k++) mask[gm->acc[k] >> 5] |= 1u << (gm->acc[k] & 31);
    }
    int have_unc = 0;
    for (int j = 0; j < ng; j++) have_unc |= tm->gm[s->groups[j]].n_unc > 0;
    if (have_unc) {
        if (ak_gmatch_copy(s->md[0], m) < 0) return -1;
        for (int j = 0; j < ng; j++)
            if (check_uncertain(tm, &tm->gm[s->groups[j]], s, mask) < 0) return -1;
    }
    if (ak_gmatch_accepting(m))
        for (int32_t k = 0; k < v->n_eog; k++) mask[v->eogs[k] >> 5] |= 1u << (v->eogs[k] & 31);
    long cnt = 0;
    for (size_t w = 0; w < words; w++) cnt += __builtin_popcount(mask[w]);
    return cnt;
}

/* Advances m by tok. */
int ak_tokmask_accept(const ak_tokmask *tm, ak_gmatch *m, int32_t tok) {
    const ak_vocab_index *v = tm->v;
    if (tok < 0 || tok >= v->n) return -1;
    if (!v->len[tok]) return v->eog[tok] && ak_gmatch_accepting(m) ? 0 : -1;
    return ak_gmatch_feed(m, v->bytes + v->off[tok], v->len[tok]);
}

/* The closing plan. Contract: tokmask.h. */
long ak_tokmask_close_plan(const ak_tokmask *tm, const ak_gmatch *m, int32_t *plan, size_t cap) {
    const ak_vocab_index *v = tm->v;
    long n = ak_gmatch_close_len(m);
    if (n <= 0) return n;
    char *path = malloc((size_t)n);
    if (!path) return -1;
    long count = 0;
    if (ak_gmatch_close_path(m, path, (size_t)n) != n) count = -1;
    for (long pos = 0; pos < n && count >= 0;) {
        /* the longest token spelling path[pos..): down the trie */
        int32_t i = 0, end = v->nn, best = -1;
        long bl = 0;
        for (long d = 0; pos + d < n && i < end; d++) {
            uint8_t c = (uint8_t)path[pos + d];
            while (i < end && v->nb[i] != c) i = v->nend[i];
            if (i >= end) break;
            if (v->ntok[i] >= 0) { best = v->ntok[i]; bl = d + 1; }
            end = v->nend[i];
            i++;
        }
        if (best < 0) { count = -1; break; }
        if (plan && (size_t)count < cap) plan[count] = best;
        count++;
        pos += bl;
    }
    free(path);
    return count;
}

/* Whether tok keeps a close plan within the budget. */
int ak_tokmask_budget_ok(const ak_tokmask *tm, const ak_gmatch *m, int32_t tok, long tokens_left) {
    ak_gmatch *c = ak_gmatch_clone(m);
    if (!c) return 0;
    int ok = ak_tokmask_accept(tm, c, tok) == 0;
    if (ok) {
        long p = ak_tokmask_close_plan(tm, c, NULL, 0);
        ok = p >= 0 && p <= tokens_left - 1;
    }
    ak_gmatch_free(c);
    return ok;
}

long ak_tokmask_min_tokens(const ak_tokmask *tm) { return tm->min_tokens; }
