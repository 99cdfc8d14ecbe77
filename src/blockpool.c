/* blockpool.c - see blockpool.h */
#include "blockpool.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ak_block_pool {
    ak_cache_spec spec;
    int block_tokens;
    pthread_mutex_t mu;
    ak_block_pool_stats st;   /* guarded by mu */
};

ak_block_pool *ak_block_pool_new(const ak_cache_spec *spec, int block_tokens, size_t budget, ak_error *err) {
    if (block_tokens <= 0) block_tokens = AK_DEFAULT_BLOCK_TOKENS;
    if (block_tokens > AK_KV_MAX_BLOCK_TOKENS) {
        ak_fail(err, "block size %d tokens is too large (at most %d)", block_tokens, AK_KV_MAX_BLOCK_TOKENS);
        return NULL;
    }
    if (spec->n_layer <= 0 || spec->n_head_kv <= 0 || spec->head_dim_k <= 0 || spec->head_dim_v <= 0) {
        ak_fail(err, "cache spec has non-positive sizes");
        return NULL;
    }
    ak_block_pool *p = ak_calloc(1, sizeof *p, err);
    if (!p) return NULL;
    p->spec = *spec;
    p->block_tokens = block_tokens;
    p->st.budget = budget;
    pthread_mutex_init(&p->mu, NULL);
    return p;
}

void ak_block_pool_free(ak_block_pool *p) {
    if (!p) return;
    pthread_mutex_destroy(&p->mu);
    free(p);
}

const ak_cache_spec *ak_block_pool_spec(const ak_block_pool *p) { return &p->spec; }
int ak_block_pool_block_tokens(const ak_block_pool *p) { return p->block_tokens; }

static size_t k_region(const ak_block_pool *p, ak_kv_format fk) {
    return (size_t)p->spec.n_head_kv * p->block_tokens * ak_kv_format_get(fk)->vec_bytes(p->spec.head_dim_k);
}

static size_t v_region(const ak_block_pool *p, ak_kv_format fv) {
    return (size_t)p->spec.n_head_kv * p->block_tokens * ak_kv_format_get(fv)->vec_bytes(p->spec.head_dim_v);
}

size_t ak_block_pool_block_bytes(const ak_block_pool *p, ak_kv_format fk, ak_kv_format fv) {
    return (size_t)p->spec.n_layer * (k_region(p, fk) + v_region(p, fv));
}

size_t ak_block_k_offset(const ak_block_pool *p, ak_kv_format fk, ak_kv_format fv, int layer) {
    return (size_t)layer * (k_region(p, fk) + v_region(p, fv));
}

size_t ak_block_v_offset(const ak_block_pool *p, ak_kv_format fk, ak_kv_format fv, int layer) {
    return ak_block_k_offset(p, fk, fv, layer) + k_region(p, fk);
}

void ak_block_pool_get_stats(ak_block_pool *p, ak_block_pool_stats *out) {
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    pthread_mutex_unlock(&p->mu);
}

void ak_block_pool_set_budget(ak_block_pool *p, size_t budget) {
    pthread_mutex_lock(&p->mu);
    p->st.budget = budget;
    pthread_mutex_unlock(&p->mu);
}

ak_block *ak_block_alloc(ak_block_pool *p, ak_kv_format fk, ak_kv_format fv, ak_error *err) {
    if (!ak_kv_format_get(fk) || !ak_kv_format_get(fv)) {
        ak_fail(err, "invalid KV format");
        return NULL;
    }
    size_t kb = (size_t)p->spec.n_layer * k_region(p, fk), vb = (size_t)p->spec.n_layer * v_region(p, fv);
    size_t bytes = kb + vb;
    pthread_mutex_lock(&p->mu);
    if (p->st.budget && p->st.used + bytes > p->st.budget) {
        p->st.alloc_failures++;
        size_t used = p->st.used, budget = p->st.budget;
        pthread_mutex_unlock(&p->mu);
        ak_fail(err, "KV budget exhausted: a %zu-byte block does not fit (%zu of %zu bytes in use)", bytes, used,
                budget);
        return NULL;
    }
    p->st.used += bytes; /* reserve before allocating outside the lock */
    pthread_mutex_unlock(&p->mu);
    ak_block *b = malloc(sizeof *b);
    void *data = NULL;
    if (b && posix_memalign(&data, 64, bytes ? bytes : 64) != 0) data = NULL;
    if (!b || !data) {
        free(b);
        pthread_mutex_lock(&p->mu);
        p->st.used -= bytes;
        pthread_mutex_unlock(&p->mu);
        ak_fail(err, "out of memory allocating a %zu-byte KV block", bytes);
        return NULL;
    }
    b->refcount = 1;
    b->fk = fk;
    b->fv = fv;
    b->hash = 0;
    b->data = data;
    pthread_mutex_lock(&p->mu);
    p->st.blocks++;
    p->st.k_bytes[fk] += kb;
    p->st.v_bytes[fv] += vb;
    if (p->st.used > p->st.peak) p->st.peak = p->st.used;
    pthread_mutex_unlock(&p->mu);
    return b;
}

ak_block *ak_block_clone(ak_block_pool *p, const ak_block *b, ak_error *err) {
    ak_block *c = ak_block_alloc(p, b->fk, b->fv, err);
    if (c) memcpy(c->data, b->data, ak_block_pool_block_bytes(p, b->fk, b->fv));
    return c;
}

void ak_block_ref(ak_block_pool *p, ak_block *b) {
    pthread_mutex_lock(&p->mu);
    b->refcount++;
    pthread_mutex_unlock(&p->mu);
}

int ak_block_refcount(ak_block_pool *p, const ak_block *b) {
    pthread_mutex_lock(&p->mu);
    int r = b->refcount;
    pthread_mutex_unlock(&p->mu);
    return r;
}

void ak_block_unref(ak_block_pool *p, ak_block *b) {
    if (!b) return;
    pthread_mutex_lock(&p->mu);
    int last = --b->refcount == 0;
    if (last) {
        size_t kb = (size_t)p->spec.n_layer * k_region(p, b->fk), vb = (size_t)p->spec.n_layer * v_region(p, b->fv);
        p->st.used -= kb + vb;
        p->st.blocks--;
        p->st.k_bytes[b->fk] -= kb;
        p->st.v_bytes[b->fv] -= vb;
    }
    pthread_mutex_unlock(&p->mu);
    if (last) {
        free(b->data);
        free(b);
    }
}

int ak_parse_bytes(const char *s, size_t *out) {
    char *end;
    if (!s || !*s || *s == '-') return -1;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0) || v != v) return -1;
    while (*end == ' ') end++;
    double mult = 1;
    char u = (char)toupper((unsigned char)*end);
    if (u == 'K') mult = 1e3;
    else if (u == 'M') mult = 1e6;
    else if (u == 'G') mult = 1e9;
    else if (u == 'T') mult = 1e12;
    else if (u && u != 'B') return -1;
    if (u && u != 'B') {
        end++;
        if (*end == 'i' || *end == 'I') { mult = mult == 1e3 ? 1024.0 : mult == 1e6 ? 1048576.0 : mult == 1e9 ? 1073741824.0 : 1099511627776.0; end++; }
        if (*end == 'B' || *end == 'b') end++;
    } else if (u == 'B') end++;
    if (*end) return -1;
    double bytes = v * mult;
    if (bytes > 1.8e19) return -1;
    *out = (size_t)bytes;
    return 0;
}
