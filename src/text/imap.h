/* imap.h - a small open-addressing map from int64 keys to non-negative
 * int32 values (jsonschema.c's string-state walks). imap_get returns -1
 * for an absent key; imap_put returns 0, or -1 when out of memory (the map
 * unchanged). A zeroed imap is empty; imap_free makes it so again. */
#ifndef AK_IMAP_H
#define AK_IMAP_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { int64_t *k; int32_t *v; size_t cap, n; } imap;

static inline int32_t imap_get(const imap *m, int64_t k) {
    if (!m->cap) return -1;
    for (size_t i = (size_t)((uint64_t)k * 0x9E3779B97F4A7C15ull >> 20) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->v[i] < 0) return -1;
        if (m->k[i] == k) return m->v[i];
    }
}

static inline int imap_put(imap *m, int64_t k, int32_t v) {
    if ((m->n + 1) * 2 > m->cap) {
        imap o = *m;
        m->cap = o.cap ? o.cap * 2 : 64;
        m->k = malloc(m->cap * sizeof *m->k);
        m->v = malloc(m->cap * sizeof *m->v);
        if (!m->k || !m->v) { free(m->k); free(m->v); *m = o; return -1; }
        memset(m->v, 0xff, m->cap * sizeof *m->v);
        m->n = 0;
        for (size_t i = 0; i < o.cap; i++)
            if (o.v[i] >= 0) imap_put(m, o.k[i], o.v[i]);
        free(o.k);
        free(o.v);
    }
    size_t i = (size_t)((uint64_t)k * 0x9E3779B97F4A7C15ull >> 20) & (m->cap - 1);
    while (m->v[i] >= 0) i = (i + 1) & (m->cap - 1);
    m->k[i] = k;
    m->v[i] = v;
    m->n++;
    return 0;
}

static inline void imap_free(imap *m) { free(m->k); free(m->v); memset(m, 0, sizeof *m); }

#endif
