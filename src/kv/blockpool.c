/* blockpool.c - see blockpool.h */
#include "kv/blockpool.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
/* compiled in with our target flags (as in store.c) */
#define XXH_INLINE_ALL
#include <xxhash.h>

/* Block memory comes from slabs: 32 MiB mappings advised to use transparent
 * huge pages, each cut into blocks of one size, with a free list per size.
 * Touching fresh 4 KiB pages made a restore into new blocks much slower
 * than into reused ones (docs/store.md); huge pages and reuse remove most
 * of it. Slabs are returned to the system only
 * when the pool is freed; the budget counts live blocks. */
#define SLAB_BYTES ((size_t)32 << 20)
#define MAX_CLASSES 16

typedef struct slab {
    struct slab *next;
    uint8_t *base;
    size_t len;
} slab;

typedef struct {
    size_t bytes;        /* block size of this class (0: unused entry) */
    void *free;          /* free blocks, linked through their first bytes */
    uint8_t *carve;      /* next uncut block of the newest slab */
    uint8_t *carve_end;
} size_class;

struct ak_block_pool {
    ak_cache_spec spec;
    int block_tokens;
    int n_groups;                     /* layer groups (cachespec.h) */
    int group_layers[AK_KV_MAX_GROUPS];   /* layers in each */
    int *layer_index;                 /* (n_layer) each layer's place within its group */
    int window_release;               /* new sequences release local blocks that slide out */
    pthread_mutex_t mu;
    ak_block_pool_stats st;   /* guarded by mu */
    size_class classes[MAX_CLASSES];  /* guarded by mu */
    slab *slabs;                      /* guarded by mu */
    /* centering (blockpool.h): set only while no block exists, then read
     * without the lock */
    float *center[2];                 /* K: n_layer * n_head_kv * head_dim_k, V likewise; or NULL */
    unsigned center_mask[2];          /* formats each applies to */
    char center_id[33];
    /* the content index: buckets of blocks chained through hnext, keyed by
     * hash; guarded by mu. Holds no reference: a block leaves it when freed. */
    ak_block **bucket;
    size_t n_bucket;                  /* a power of two, or 0 */
    uint64_t salt;                    /* model fingerprint's hash (ak_block_pool_set_model) */
};

/* Memory for one block of `bytes`, 64-byte aligned; NULL when out of memory.
 * A size without a class gets one while classes are left (only while half
 * are left when `spare`: mixed blocks, whose sizes vary with their widths,
 * must not take the classes uniform blocks need). *plain is set to 1 for
 * memory not cut from a slab (block_mem_put frees it). Called with p->mu
 * held. */
static void *block_mem_get(ak_block_pool *p, size_t bytes, int spare, int *plain) {
    bytes = (bytes + 63) & ~(size_t)63;
    size_class *c = NULL;
#if defined(__SANITIZE_ADDRESS__)
    /* under AddressSanitizer every block is its own allocation, so an
     * overrun of one block is caught instead of landing in its neighbour */
    (void)p;
    void *m0 = NULL;
    *plain = 1;
    return posix_memalign(&m0, 64, bytes) == 0 ? m0 : NULL;
#endif
    *plain = 0;
    for (int i = 0; i < MAX_CLASSES && !c; i++)
        if (p->classes[i].bytes == bytes || (p->classes[i].bytes == 0 && (!spare || i < MAX_CLASSES / 2)))
            c = &p->classes[i];
    if (!c) { /* too many distinct sizes: plain allocation */
        void *m = NULL;
        *plain = 1;
        return posix_memalign(&m, 64, bytes) == 0 ? m : NULL;
    }
    c->bytes = bytes;
    if (c->free) {
        void *m = c->free;
        memcpy(&c->free, m, sizeof(void *));
        return m;
    }
    /* the null test first: arithmetic on a null pointer is undefined */
    if (!c->carve || bytes > (size_t)(c->carve_end - c->carve)) {
        size_t len = bytes > SLAB_BYTES ? (bytes + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1) : SLAB_BYTES;
        slab *sl = malloc(sizeof *sl);
        void *m = sl ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
        if (m == MAP_FAILED) { free(sl); return NULL; }
#ifdef MADV_HUGEPAGE
        madvise(m, len, MADV_HUGEPAGE); /* advice: harmless where unsupported */
#endif
        sl->base = m;
        sl->len = len;
        sl->next = p->slabs;
        p->slabs = sl;
        c->carve = m;
        c->carve_end = (uint8_t *)m + len / bytes * bytes;
    }
    void *m = c->carve;
    c->carve += bytes;
    return m;
}

/* Returns a block's memory to its class's free list. Called with p->mu held. */
static void block_mem_put(ak_block_pool *p, void *m, size_t bytes, int plain) {
    bytes = (bytes + 63) & ~(size_t)63;
    if (plain) {
        free(m);
        return;
    }
    for (int i = 0; i < MAX_CLASSES; i++)
        if (p->classes[i].bytes == bytes) {
            memcpy(m, &p->classes[i].free, sizeof(void *));
            p->classes[i].free = m;
            return;
        }
    free(m);
}

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
    if (spec->window > 0 && spec->n_layer > AK_KV_MAX_LAYERS) {
        free(p);
        ak_failc(err, AK_ERR_INVALID, "a windowed cache spec names at most %d layers (%d)", AK_KV_MAX_LAYERS,
                 spec->n_layer);
        return NULL;
    }
    if (!(p->layer_index = ak_calloc((size_t)spec->n_layer, sizeof(int), err))) {
        free(p);
        return NULL;
    }
    p->spec = *spec;
    p->block_tokens = block_tokens;
    p->n_groups = ak_spec_groups(spec);
    for (int l = 0; l < spec->n_layer; l++) {
        int g = ak_spec_group(spec, l);
        p->layer_index[l] = p->group_layers[g]++;
    }
    p->st.budget = budget;
    pthread_mutex_init(&p->mu, NULL);
    return p;
}

void ak_block_pool_free(ak_block_pool *p) {
    if (!p) return;
    for (slab *sl = p->slabs, *next; sl; sl = next) {
        next = sl->next;
        munmap(sl->base, sl->len);
        free(sl);
    }
    pthread_mutex_destroy(&p->mu);
    free(p->bucket);
    free(p->layer_index);
    free(p->center[0]);
    free(p->center[1]);
    free(p);
}

int ak_block_pool_set_centers(ak_block_pool *p, const float *mu_k, const float *mu_v, const char *id, unsigned k_mask,
                              unsigned v_mask, ak_error *err) {
    const float *mu[2] = {mu_k, mu_v};
    size_t n[2] = {(size_t)p->spec.n_layer * p->spec.n_head_kv * p->spec.head_dim_k,
                   (size_t)p->spec.n_layer * p->spec.n_head_kv * p->spec.head_dim_v};
    if (mu_k || mu_v) {
        size_t l = id ? strlen(id) : 0;
        if (l < 1 || l > 32) return ak_fail(err, "centering id must be 1..32 characters");
        for (size_t i = 0; i < l; i++)
            if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'z') || id[i] == '.' || id[i] == '-'))
                return ak_fail(err, "centering id \"%s\" has a character outside [0-9a-z.-]", id);
        for (int s = 0; s < 2; s++)
            for (size_t i = 0; mu[s] && i < n[s]; i++)
                if (!isfinite(mu[s][i])) return ak_fail(err, "centering mean has a non-finite value at %zu", i);
    }
    pthread_mutex_lock(&p->mu);
    size_t live = p->st.blocks;
    pthread_mutex_unlock(&p->mu);
    if (live) return ak_fail(err, "centering means set on a pool that holds %zu blocks", live);
    float *copy[2] = {NULL, NULL};
    for (int s = 0; s < 2; s++)
        if (mu[s]) {
            if (!(copy[s] = ak_malloc(n[s] * sizeof(float), err))) { free(copy[0]); return -1; }
            memcpy(copy[s], mu[s], n[s] * sizeof(float));
        }
    unsigned def = 0;
    for (int f = 0; f < AK_KV_NFORMATS; f++) def |= ak_kv_format_centers((ak_kv_format)f) ? 1u << f : 0;
    for (int s = 0; s < 2; s++) {
        free(p->center[s]);
        p->center[s] = copy[s];
    }
    p->center_mask[0] = k_mask ? k_mask : def;
    p->center_mask[1] = v_mask ? v_mask : def;
    snprintf(p->center_id, sizeof p->center_id, "%s", mu_k || mu_v ? id : "");
    return 0;
}

const float *ak_block_pool_center(const ak_block_pool *p, int is_v, ak_kv_format f, int layer, int head) {
    is_v = !!is_v;
    if (!p->center[is_v] || !((p->center_mask[is_v] >> f) & 1)) return NULL;
    int d = is_v ? p->spec.head_dim_v : p->spec.head_dim_k;
    return p->center[is_v] + ((size_t)layer * p->spec.n_head_kv + head) * d;
}

const char *ak_block_pool_center_id(const ak_block_pool *p, int is_v, ak_kv_format f) {
    is_v = !!is_v;
    return p->center[is_v] && ((p->center_mask[is_v] >> f) & 1) ? p->center_id : NULL;
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

int ak_block_pool_groups(const ak_block_pool *p) { return p->n_groups; }

void ak_block_pool_set_window_release(ak_block_pool *p, int on) { p->window_release = on != 0; }
int ak_block_pool_window_release(const ak_block_pool *p) { return p->window_release; }

size_t ak_block_pool_group_bytes(const ak_block_pool *p, int group, ak_kv_format fk, ak_kv_format fv) {
    if (group < 0 || group >= p->n_groups) return 0;
    return (size_t)p->group_layers[group] * (k_region(p, fk) + v_region(p, fv));
}

size_t ak_block_k_offset(const ak_block_pool *p, ak_kv_format fk, ak_kv_format fv, int layer) {
    return (size_t)p->layer_index[layer] * (k_region(p, fk) + v_region(p, fv));
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
    return ak_block_alloc_group(p, 0, fk, fv, err);
}

ak_block *ak_block_alloc_group(ak_block_pool *p, int group, ak_kv_format fk, ak_kv_format fv, ak_error *err) {
    if (!ak_kv_format_get(fk) || !ak_kv_format_get(fv)) {
        ak_fail(err, "invalid KV format");
        return NULL;
    }
    if (group < 0 || group >= p->n_groups) {
        ak_failc(err, AK_ERR_INVALID, "layer group %d of a pool of %d", group, p->n_groups);
        return NULL;
    }
    int nl = p->group_layers[group];
    size_t kb = (size_t)nl * k_region(p, fk), vb = (size_t)nl * v_region(p, fv);
    size_t bytes = kb + vb;
    pthread_mutex_lock(&p->mu);
    if (p->st.budget && p->st.used + bytes > p->st.budget) {
        p->st.alloc_failures++;
        size_t used = p->st.used, budget = p->st.budget;
        pthread_mutex_unlock(&p->mu);
        ak_failc(err, AK_ERR_KV_BUDGET, "KV budget exhausted: a %zu-byte block does not fit (%zu of %zu bytes in use)", bytes, used,
                budget);
        return NULL;
    }
    ak_block *b = malloc(sizeof *b);
    int plain = 0;
    void *data = b ? block_mem_get(p, bytes ? bytes : 64, 0, &plain) : NULL;
    if (!b || !data) {
        p->st.alloc_failures++;
        pthread_mutex_unlock(&p->mu);
        free(b);
        ak_failc(err, AK_ERR_NOMEM, "out of memory allocating a %zu-byte KV block", bytes);
        return NULL;
    }
    p->st.used += bytes;
    p->st.logical += bytes;
    b->refcount = 1;
    b->bytes = bytes;
    b->group = group;
    b->mix = NULL;
    b->fk = fk;
    b->fv = fv;
    b->hash = 0;
    b->hnext = NULL;
    b->data = data;
    b->plain = plain;
    p->st.blocks++;
    p->st.k_bytes[fk] += kb;
    p->st.v_bytes[fv] += vb;
    if (p->st.used > p->st.peak) p->st.peak = p->st.used;
    pthread_mutex_unlock(&p->mu);
    return b;
}

size_t ak_block_pool_prefault(ak_block_pool *p, ak_kv_format fk, ak_kv_format fv, size_t bytes) {
    if (!ak_kv_format_get(fk) || !ak_kv_format_get(fv)) return 0;
    /* blocks of group 0 (all layers, or the global ones of a windowed
     * pool: the local group's blocks are a few per sequence) */
    size_t bb = ak_block_pool_group_bytes(p, 0, fk, fv), n = bb ? (bytes + bb - 1) / bb : 0, got = 0;
    ak_block **b = n ? calloc(n, sizeof *b) : NULL;
    if (!b) return 0;
    for (; got < n; got++) {
        if (!(b[got] = ak_block_alloc(p, fk, fv, NULL))) break;
        memset(b[got]->data, 0, bb);   /* the touch is the point */
    }
    for (size_t i = 0; i < got; i++) ak_block_unref(p, b[i]);
    free(b);
    return got * bb;
}

ak_block *ak_block_clone(ak_block_pool *p, const ak_block *b, ak_error *err) {
    ak_block *c;
    if (b->mix) {   /* rebuilt from the slots' formats */
        ak_kv_format fk[AK_KV_MAX_BLOCK_TOKENS], fv[AK_KV_MAX_BLOCK_TOKENS];
        for (int s = 0; s < b->mix->count; s++) {
            fk[s] = b->mix->fmt[0][b->mix->cls[0][s]];
            fv[s] = b->mix->fmt[1][b->mix->cls[1][s]];
        }
        c = ak_block_alloc_mixed(p, fk, fv, b->mix->count, err);
    } else {
        c = ak_block_alloc_group(p, b->group, b->fk, b->fv, err);
    }
    if (c) memcpy(c->data, b->data, b->bytes);
    return c;
}

/* ---- mixed blocks (blockpool.h) ----------------------------------------- */

static void mix_free(ak_block_mix *m) {
    if (!m) return;
    for (int side = 0; side < 2; side++) {
        free(m->cls[side]);
        free(m->rank[side]);
        for (int c = 0; c < AK_MIX_CLASSES; c++) free(m->slots[side][c]);
    }
    free(m);
}

/* The classes of one side: formats in order of first use, each slot's
 * class and rank, each class's slots, offsets and the region's size.
 * Returns 0, or -1 with err set. */
static int mix_side(ak_block_mix *m, int side, const ak_kv_format *f, int count, int H, int d, int T, ak_error *err) {
    if (!(m->cls[side] = calloc((size_t)T, 1)) || !(m->rank[side] = calloc((size_t)T, sizeof(uint16_t))))
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    for (int s = 0; s < count; s++) {
        const ak_kv_format_info *fi = ak_kv_format_get(f[s]);
        if (!fi || !ak_kv_format_supports(f[s], d))
            return ak_failc(err, AK_ERR_INVALID, "slot %d: format cannot store head dim %d", s, d);
        if (side == 0 && fi->rotated)
            return ak_failc(err, AK_ERR_INVALID, "slot %d: a mixed block's keys cannot be in rotated format %s", s, fi->name);
        int c = 0;
        while (c < m->ncls[side] && m->fmt[side][c] != f[s]) c++;
        if (c == m->ncls[side]) {
            if (c == AK_MIX_CLASSES)
                return ak_failc(err, AK_ERR_INVALID, "a mixed block holds at most %d formats a side", AK_MIX_CLASSES);
            m->fmt[side][m->ncls[side]++] = f[s];
        }
        m->cls[side][s] = (uint8_t)c;
        m->rank[side][s] = (uint16_t)m->n[side][c]++;
    }
    size_t off = 0;
    for (int c = 0; c < m->ncls[side]; c++) {
        if (!(m->slots[side][c] = malloc(sizeof(uint16_t) * (size_t)m->n[side][c])))
            return ak_failc(err, AK_ERR_NOMEM, "out of memory");
        m->off[side][c] = off;
        off += (size_t)H * (size_t)m->n[side][c] * ak_kv_format_get(m->fmt[side][c])->vec_bytes(d);
    }
    for (int s = 0; s < count; s++) m->slots[side][m->cls[side][s]][m->rank[side][s]] = (uint16_t)s;
    m->region[side] = off;
    return 0;
}

static ak_block *alloc_mixed(ak_block_pool *p, const ak_kv_format *fk, const ak_kv_format *fv, int count, int zero,
                             ak_error *err) {
    int T = p->block_tokens, H = p->spec.n_head_kv;
    if (count < 1 || count > T) {
        ak_failc(err, AK_ERR_INVALID, "a mixed block of %d slots (blocks hold %d)", count, T);
        return NULL;
    }
    if (p->n_groups > 1) {   /* a mixed block holds every layer: no place in a per-group layout */
        ak_failc(err, AK_ERR_INVALID, "mixed blocks (cards) are not supported for a cache with sliding-window layers");
        return NULL;
    }
    ak_block_mix *m = calloc(1, sizeof *m);
    if (!m) {
        ak_failc(err, AK_ERR_NOMEM, "out of memory");
        return NULL;
    }
    m->count = count;
    if (mix_side(m, 0, fk, count, H, p->spec.head_dim_k, T, err) < 0 ||
        mix_side(m, 1, fv, count, H, p->spec.head_dim_v, T, err) < 0) {
        mix_free(m);
        return NULL;
    }
    size_t bytes = (size_t)p->spec.n_layer * (m->region[0] + m->region[1]);
    ak_block *b = malloc(sizeof *b);
    void *data = NULL;
    pthread_mutex_lock(&p->mu);
    int over = p->st.budget && p->st.used + bytes > p->st.budget;
    int plain = 0;
    if (over || !b || !(data = block_mem_get(p, bytes ? bytes : 64, 1, &plain))) {
        p->st.alloc_failures++;
        size_t used = p->st.used, budget = p->st.budget;
        pthread_mutex_unlock(&p->mu);
        free(b);
        mix_free(m);
        if (over)
            ak_failc(err, AK_ERR_KV_BUDGET, "KV budget exhausted: a %zu-byte block does not fit (%zu of %zu bytes in use)",
                     bytes, used, budget);
        else
            ak_failc(err, AK_ERR_NOMEM, "out of memory allocating a %zu-byte KV block", bytes);
        return NULL;
    }
    p->st.used += bytes;
    p->st.logical += bytes;
    p->st.mixed_bytes += bytes;
    p->st.blocks++;
    if (p->st.used > p->st.peak) p->st.peak = p->st.used;
    pthread_mutex_unlock(&p->mu);
    if (zero) memset(data, 0, bytes);
    *b = (ak_block){.refcount = 1, .bytes = bytes, .mix = m, .fk = fk[0], .fv = fv[0], .data = data, .plain = plain};
    return b;
}

ak_block *ak_block_alloc_mixed(ak_block_pool *p, const ak_kv_format *fk, const ak_kv_format *fv, int count,
                               ak_error *err) {
    return alloc_mixed(p, fk, fv, count, 1, err);
}

ak_block *ak_block_alloc_mixed_unfilled(ak_block_pool *p, const ak_kv_format *fk, const ak_kv_format *fv, int count,
                                        ak_error *err) {
    return alloc_mixed(p, fk, fv, count, 0, err);
}

static void mix_free(ak_block_mix *m);

/* One more reference to b, with the sharing statistics. Called with mu held. */
static void ref_locked(ak_block_pool *p, ak_block *b) {
    size_t n = b->bytes;
    if (++b->refcount == 2) p->st.shared += n;
    p->st.logical += n;
}

void ak_block_ref(ak_block_pool *p, ak_block *b) {
    pthread_mutex_lock(&p->mu);
    ref_locked(p, b);
    pthread_mutex_unlock(&p->mu);
}

/* Takes b out of the index (if it is in). Called with mu held. */
static void index_remove(ak_block_pool *p, ak_block *b) {
    if (!b->hash || !p->n_bucket) return;
    ak_block **pp = &p->bucket[b->hash & (p->n_bucket - 1)];
    while (*pp && *pp != b) pp = &(*pp)->hnext;
    if (*pp) {
        *pp = b->hnext;
        p->st.indexed--;
    }
    b->hash = 0;
    b->hnext = NULL;
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
    p->st.logical -= b->bytes;
    if (b->refcount == 1) p->st.shared -= b->bytes;
    if (last) {
        index_remove(p, b);
        p->st.used -= b->bytes;
        p->st.blocks--;
        if (b->mix) {
            p->st.mixed_bytes -= b->bytes;
            block_mem_put(p, b->data, b->bytes ? b->bytes : 64, b->plain);
        } else {
            int nl = p->group_layers[b->group];
            size_t kb = (size_t)nl * k_region(p, b->fk), vb = (size_t)nl * v_region(p, b->fv);
            p->st.k_bytes[b->fk] -= kb;
            p->st.v_bytes[b->fv] -= vb;
            block_mem_put(p, b->data, kb + vb ? kb + vb : 64, b->plain);
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (last) {
        mix_free(b->mix);
        free(b);
    }
}

void ak_block_pool_set_model(ak_block_pool *p, const char *fingerprint) {
    p->salt = XXH3_64bits(fingerprint, strlen(fingerprint));
}

uint64_t ak_block_chain_hash(const ak_block_pool *p, uint64_t parent, int first_pos, const int32_t *tok, int n,
                             ak_kv_format fk, ak_kv_format fv) {
    /* everything that decides the block's bits besides its tokens: the
     * prefix (parent), where the block sits, its formats, the pool's
     * geometry, centering and model */
    struct {
        uint64_t parent, salt;
        int32_t first_pos, n, fk, fv, T, pad;
        char center[33 + 7];
    } h;
    memset(&h, 0, sizeof h);
    h.parent = parent;
    h.salt = p->salt;
    h.first_pos = first_pos;
    h.n = n;
    h.fk = (int32_t)fk;
    h.fv = (int32_t)fv;
    h.T = p->block_tokens;
    /* the means subtracted from this format pair (or none) */
    const char *ck = ak_block_pool_center_id(p, 0, fk), *cv = ak_block_pool_center_id(p, 1, fv);
    snprintf(h.center, sizeof h.center, "%c%c%s", ck ? 'k' : '-', cv ? 'v' : '-', ck || cv ? p->center_id : "");
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, &h, sizeof h);
    XXH3_64bits_update(&st, tok, sizeof(int32_t) * (size_t)n);
    uint64_t r = XXH3_64bits_digest(&st);
    return r ? r : 1;
}

ak_block *ak_block_pool_lookup(ak_block_pool *p, uint64_t h) {
    if (!h) return NULL;
    pthread_mutex_lock(&p->mu);
    ak_block *b = p->n_bucket ? p->bucket[h & (p->n_bucket - 1)] : NULL;
    while (b && b->hash != h) b = b->hnext;
    if (b) {
        ref_locked(p, b);
        p->st.index_hits++;
    }
    pthread_mutex_unlock(&p->mu);
    return b;
}

/* Doubles the bucket array (rehashing every indexed block). Called with mu
 * held; returns 0, or -1 out of memory (the index is unchanged). */
static int index_grow(ak_block_pool *p) {
    size_t nn = p->n_bucket ? p->n_bucket * 2 : 1024;
    ak_block **nb = calloc(nn, sizeof *nb);
    if (!nb) return -1;
    for (size_t i = 0; i < p->n_bucket; i++)
        for (ak_block *b = p->bucket[i], *next; b; b = next) {
            next = b->hnext;
            b->hnext = nb[b->hash & (nn - 1)];
            nb[b->hash & (nn - 1)] = b;
        }
    free(p->bucket);
    p->bucket = nb;
    p->n_bucket = nn;
    return 0;
}

ak_block *ak_block_pool_publish(ak_block_pool *p, ak_block *b, uint64_t h) {
    if (!h) return NULL;
    pthread_mutex_lock(&p->mu);
    ak_block *r = NULL;
    if (b->hash) {
        r = b->hash == h ? b : NULL;
        goto out;
    }
    if (p->st.indexed >= p->n_bucket && index_grow(p) != 0) goto out;
    ak_block **head = &p->bucket[h & (p->n_bucket - 1)];
    for (ak_block *o = *head; o; o = o->hnext)
        if (o->hash == h) {
            ref_locked(p, o);   /* the caller's, for ak_kv_replace_span */
            r = o;
            goto out;
        }
    b->hash = h;
    b->hnext = *head;
    *head = b;
    p->st.indexed++;
    r = b;
out:
    pthread_mutex_unlock(&p->mu);
    return r;
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
