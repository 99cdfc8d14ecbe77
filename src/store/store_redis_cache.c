/* store_redis_cache.c - the Redis backend's read-through cache: copies of
 * images in a local directory (store_backend.h: THE READ-THROUGH CACHE).
 *
 * With a local directory, an image a restore read from Redis is kept there
 * (a directory backend under <local dir>/redis-cache) as "<k>.<gen>.<id>"
 * (ids up to 110 characters): the generation names the version, so a
 * manifest that moved on never meets an old copy. Chunks are written to the
 * copy as they arrive (positional writes into the put's temp file); at close
 * the chunks the restore did not need are fetched and the copy committed.
 * Opening an image whose generation is cached reads the file, each chunk
 * checked against the manifest's sum (the same check as a chunk from Redis);
 * a copy that fails it is deleted and Redis read instead. The manifest is
 * always read from Redis: it decides which version is current.
 */
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "store/store_redis_impl.h"

/* The copy's name in the cache of the image g opened, "<k>.<gen>.<id>":
 * 0, or -1 if it is longer than an id may be. */
static int cache_name(const ak_blob_get *g, char *out, size_t n) {
    int w = snprintf(out, n, "%c.%s.%s", kind_letter(g->kind), g->gen, g->id);
    return w < 0 || (size_t)w >= n || w > AK_AGENT_ID_MAX ? -1 : 0;
}

/* Opens the copy of g's generation, if the cache holds one of the image's
 * size (store_redis_impl.h). */
void ak_redis_cache_open(ak_blob_get *g) {
    redis_backend *r = g->r;
    char name[AK_AGENT_ID_MAX + 1], cwhy[64];
    ak_blob_info ci;
    ak_error ce = {{0}};
    if (r->cache && !cache_name(g, name, sizeof name) &&
        r->cache->ops->get_open(r->cache, AK_FILE_AGENT, name, &g->cg, &ci, cwhy, sizeof cwhy, &ce) != 0 && g->cg) {
        r->cache->ops->get_close(g->cg);
        g->cg = NULL;
    }
    if (g->cg && ci.bytes != g->bytes) { /* torn or foreign: replaced by the next restore's copy */
        r->cache->ops->get_close(g->cg);
        g->cg = NULL;
        r->cache->ops->remove(r->cache, AK_FILE_AGENT, name, &ce);
    }
}

/* Chunk c into s from the copy, checked: 1; 0 to read Redis instead. */
int ak_redis_cache_chunk(ak_blob_get *g, int c, slot *s) {
    uint64_t len = chunk_len(g, c);
    pthread_mutex_lock(&g->mu);
    int from_copy = g->cg && !g->cache_bad;
    pthread_mutex_unlock(&g->mu);
    if (!from_copy) return 0;
    if (g->r->cache->ops->get_read(g->cg, s->buf, (size_t)len, (uint64_t)c * g->chunk) == 0 &&
        XXH3_64bits(s->buf, (size_t)len) == g->sums[c]) {
        s->len = len;
        return 1;
    }
    /* damaged or torn copy: deleted, and Redis read instead (from now on) */
    char name[AK_AGENT_ID_MAX + 1];
    ak_error e = {{0}};
    pthread_mutex_lock(&g->mu);
    int first = !g->cache_bad;
    g->cache_bad = 1;
    pthread_mutex_unlock(&g->mu);
    if (first && !cache_name(g, name, sizeof name)) g->r->cache->ops->remove(g->r->cache, AK_FILE_AGENT, name, &e);
    return 0;
}

/* Writes verified chunk c to the copy being made, once. */
void ak_redis_cache_put_chunk(ak_blob_get *g, int c, const uint8_t *data, uint64_t len) {
    pthread_mutex_lock(&g->mu);
    int go = g->cput && !g->cached[c] && !g->cache_failed;
    if (go) g->cached[c] = 1;
    pthread_mutex_unlock(&g->mu);
    if (!go) return;
    ak_error e = {{0}};
    if (ak_backend_dir_put_at(g->cput, data, (size_t)len, (uint64_t)c * g->chunk, &e) != 0) {
        pthread_mutex_lock(&g->mu);
        g->cache_failed = 1;   /* the copy is dropped at close */
        pthread_mutex_unlock(&g->mu);
    }
}

/* Starts the copy of the image a restore reads: a put of the cache, its
 * chunks written as they arrive (ak_redis_cache_put_chunk). */
void ak_redis_cache_begin(ak_blob_get *g) {
    pthread_mutex_lock(&g->mu);
    int make_copy = g->r->cache && !g->cg && !g->cput;
    pthread_mutex_unlock(&g->mu);
    char name[AK_AGENT_ID_MAX + 1];
    if (!make_copy || cache_name(g, name, sizeof name)) return;
    ak_error e = {{0}};
    uint8_t *cached = calloc((size_t)g->n, 1);
    ak_blob_put *p = cached ? g->r->cache->ops->put_begin(g->r->cache, AK_FILE_AGENT, name, g->bytes, &e) : NULL;
    if (!p) {
        free(cached);
        return;
    }
    pthread_mutex_lock(&g->mu);
    g->cached = cached;
    g->cput = p;
    pthread_mutex_unlock(&g->mu);
}

/* Deletes the least recently used copies until they take at most the room
 * the store gave the cache (none given: nothing). */
static void cache_prune(redis_backend *r) {
    pthread_mutex_lock(&r->mu);
    int64_t room = r->cache_room;
    pthread_mutex_unlock(&r->mu);
    if (room < 0) return;
    ak_blob_name *v = NULL;
    int nv = 0;
    ak_error e = {{0}};
    if (ak_redis_cache_list(&r->base, &v, &nv, &e) != 0) return;
    uint64_t total = 0;
    for (int i = 0; i < nv; i++) total += v[i].info.bytes;
    while (total > (uint64_t)room) {
        int o = -1;
        for (int i = 0; i < nv; i++)
            if (v[i].id[0] && (o < 0 || v[i].info.mtime < v[o].info.mtime ||
                               (v[i].info.mtime == v[o].info.mtime && v[i].info.mtime_ns < v[o].info.mtime_ns)))
                o = i;
        if (o < 0) break;
        r->cache->ops->remove(r->cache, AK_FILE_AGENT, v[o].id, &e);
        total -= v[o].info.bytes;
        v[o].id[0] = 0;
    }
    free(v);
}

/* Completes the copy a restore began (the chunks it did not read fetched
 * now), drops the image's copies of other generations, and commits it;
 * drops it if anything failed. Best effort. */
void ak_redis_cache_finish(ak_blob_get *g) {
    const ak_backend_ops *ops = g->r->cache->ops;
    for (int c = 0; c < g->n && !g->cache_failed; c++) {
        if (g->cached[c]) continue;
        slot *s = ak_redis_chunk_hold(g, c);   /* a fresh fetch writes the copy; one held already is written here */
        if (!s) {
            g->cache_failed = 1;
            break;
        }
        ak_redis_cache_put_chunk(g, c, s->buf, s->len);
        ak_redis_chunk_release(g, s, 0);
    }
    if (g->cache_failed) {
        ops->put_abort(g->cput);
        return;
    }
    char name[AK_AGENT_ID_MAX + 1];
    ak_error e = {{0}};
    ak_blob_name *v = NULL;
    int nv = 0;
    if (!cache_name(g, name, sizeof name) && ops->list(g->r->cache, AK_FILE_AGENT, &v, &nv, &e) == 0) {
        for (int i = 0; i < nv; i++) {   /* "<k>.<16 hex>.<id>" of this image, another generation */
            const char *x = v[i].id;
            if (x[0] == name[0] && x[1] == '.' && strlen(x) > 19 && x[18] == '.' && !strcmp(x + 19, g->id) &&
                strcmp(x, name))
                ops->remove(g->r->cache, AK_FILE_AGENT, x, &e);
        }
        free(v);
    }
    if (ops->put_commit(g->cput, &(ak_blob_info){0}, &e) >= 0) cache_prune(g->r);
}

/* ------------------------------------------------------ the operations */

/* store_backend.h's cache_list: none without a cache. */
int ak_redis_cache_list(ak_store_backend *b, ak_blob_name **out, int *n, ak_error *err) {
    *out = NULL;
    *n = 0;
    if (!((redis_backend *)b)->cache) return 0;
    ak_store_backend *c = ((redis_backend *)b)->cache;
    return c->ops->list(c, AK_FILE_AGENT, out, n, err);
}

/* store_backend.h's cache_drop. */
void ak_redis_cache_drop(ak_store_backend *b, const char *name) {
    if (!((redis_backend *)b)->cache) return;
    ak_store_backend *c = ((redis_backend *)b)->cache;
    ak_error e = {{0}};
    c->ops->remove(c, AK_FILE_AGENT, name, &e);
}

/* store_backend.h's cache_room (applied at the next copy's commit). */
void ak_redis_cache_room(ak_store_backend *b, int64_t room) {
    redis_backend *r = (redis_backend *)b;
    pthread_mutex_lock(&r->mu);
    r->cache_room = room;
    pthread_mutex_unlock(&r->mu);
}
