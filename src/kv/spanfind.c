/* spanfind.c - see spanfind.h */
#include "kv/spanfind.h"

#include <stdlib.h>
#include <string.h>

/* The rolling hash's base: odd, so powers of it never vanish mod 2^64. */
#define SPAN_BASE 0x9E3779B97F4A7C15ull
/* Query windows examined per source window: text that repeats one window
 * many times (hostile or degenerate prompts) costs a bounded amount. */
#define SPAN_MAX_TRIES 8

struct ak_span_finder {
    const int32_t *q;
    int from, upto, w;
    uint64_t top;        /* SPAN_BASE^(w - 1): the weight of a window's first token */
    uint64_t *key;       /* (cap) hash of the window starting at slot's query position */
    int *pos;            /* (cap) that position, -1: empty slot */
    int *next;           /* (upto - from) the next query position with the same hash, -1: none */
    int cap;             /* slots, a power of two */
};

/* A token as a hash digit: never 0, so that runs of token 0 still hash. */
static inline uint64_t digit(int32_t t) { return (uint64_t)(uint32_t)t + 1; }

/* Slot of hash h (the high bits: the low ones of a polynomial hash of
 * small digits are poorly mixed). */
static inline int slot_of(const ak_span_finder *f, uint64_t h) {
    return (int)((h * 0xD6E8FEB86659FD93ull) >> 32) & (f->cap - 1);
}

/* The hash of t[0, w). */
static uint64_t window_hash(const int32_t *t, int w) {
    uint64_t h = 0;
    for (int i = 0; i < w; i++) h = h * SPAN_BASE + digit(t[i]);
    return h;
}

ak_span_finder *ak_span_finder_new(const int32_t *q, int from, int upto, int min_len, ak_error *err) {
    if (!q || from < 0 || upto < from || min_len < 1) {
        ak_failc(err, AK_ERR_INVALID, "span finder: bad range [%d, %d) or minimum %d", from, upto, min_len);
        return NULL;
    }
    ak_span_finder *f = ak_calloc(1, sizeof *f, err);
    if (!f) return NULL;
    *f = (ak_span_finder){.q = q, .from = from, .upto = upto, .w = min_len, .top = 1};
    for (int i = 1; i < min_len; i++) f->top *= SPAN_BASE;
    int n_win = upto - from - min_len + 1;
    if (n_win <= 0) return f;   /* finds nothing */
    f->cap = 16;
    while (f->cap < 2 * n_win) f->cap *= 2;
    f->key = ak_malloc(sizeof(uint64_t) * (size_t)f->cap, err);
    f->pos = ak_malloc(sizeof(int) * (size_t)f->cap, err);
    f->next = ak_malloc(sizeof(int) * (size_t)(upto - from), err);
    if (!f->key || !f->pos || !f->next) {
        ak_span_finder_free(f);
        return NULL;
    }
    for (int i = 0; i < f->cap; i++) f->pos[i] = -1;
    uint64_t h = window_hash(q + from, min_len);
    for (int j = from; j < from + n_win; j++) {
        if (j > from) h = (h - digit(q[j - 1]) * f->top) * SPAN_BASE + digit(q[j + min_len - 1]);
        int s = slot_of(f, h);
        while (f->pos[s] >= 0 && f->key[s] != h) s = (s + 1) & (f->cap - 1);
        /* one slot per distinct hash, its positions chained: later ones first */
        f->next[j - from] = f->pos[s];
        f->key[s] = h;
        f->pos[s] = j;
    }
    return f;
}

void ak_span_finder_free(ak_span_finder *f) {
    if (!f) return;
    free(f->key);
    free(f->pos);
    free(f->next);
    free(f);
}

/* The first query position of a window hashing to h, or -1. */
static int lookup(const ak_span_finder *f, uint64_t h) {
    int s = slot_of(f, h);
    while (f->pos[s] >= 0) {
        if (f->key[s] == h) return f->pos[s];
        s = (s + 1) & (f->cap - 1);
    }
    return -1;
}

int ak_span_scan(ak_span_finder *f, const int32_t *src, int n_src, int source_no, ak_span *best) {
    const int w = f->w;
    if (!f->cap || !src || n_src < w) return 0;
    const int32_t *q = f->q;
    ak_span top = {.len = 0};
    /* the spans found last (a ring): their diagonal (source minus query
     * position) and the source position where each ends. A window on one
     * of them lies inside a span already measured and is not examined
     * again. Windows are taken left to right, so the first window of a
     * span is the one that finds it: extending forward is enough. */
    struct { int diag, end; } cov[SPAN_MAX_TRIES];
    int n_cov = 0, next_cov = 0;
    uint64_t h = window_hash(src, w);
    for (int i = 0; i + w <= n_src; i++) {
        if (i > 0) h = (h - digit(src[i - 1]) * f->top) * SPAN_BASE + digit(src[i + w - 1]);
        int tries = 0;
        for (int j = lookup(f, h); j >= 0 && tries < SPAN_MAX_TRIES; j = f->next[j - f->from]) {
            tries++;
            int seen = 0;
            for (int k = 0; k < n_cov && !seen; k++) seen = cov[k].diag == i - j && i < cov[k].end;
            if (seen || memcmp(src + i, q + j, sizeof(int32_t) * (size_t)w)) continue;   /* or a hash collision */
            int len = w;
            while (i + len < n_src && j + len < f->upto && src[i + len] == q[j + len]) len++;
            if (len > top.len) top = (ak_span){.at = j, .src_at = i, .len = len, .source = source_no};
            cov[next_cov].diag = i - j;
            cov[next_cov].end = i + len;
            next_cov = (next_cov + 1) % SPAN_MAX_TRIES;
            if (n_cov < SPAN_MAX_TRIES) n_cov++;
        }
    }
    if (top.len <= best->len) return 0;
    *best = top;
    return 1;
}
