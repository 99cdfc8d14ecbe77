/* store_redis_get.c - the Redis backend's reads (store_backend.h: GET; the
 * keys: store_redis.c). Opening reads the manifest (one HGETALL); chunks
 * are then read on demand into a few reused chunk buffers (SLOTS), GETs
 * pipelined ahead once a restore announces itself (get_prefetch), their
 * replies read off the socket by hand straight into a slot, each chunk
 * checked against its sum before a byte of it is delivered. A plain
 * image's header is served from the manifest's copy. The read-through
 * cache's copies (store_redis_cache.c) stand in for Redis where sound.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sodium.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "store/store_redis_impl.h"

/* The field named f of an HGETALL / HMGET reply laid out as pairs. */
static const char *field(const redisReply *rp, const char *f) {
    for (size_t i = 0; i + 1 < rp->elements; i += 2)
        if (rp->element[i]->type == REDIS_REPLY_STRING && !strcmp(rp->element[i]->str, f) &&
            rp->element[i + 1]->type == REDIS_REPLY_STRING)
            return rp->element[i + 1]->str;
    return NULL;
}

/* The value element of field f (as field), or NULL. */
static const redisReply *field_reply(const redisReply *rp, const char *f) {
    for (size_t i = 0; i + 1 < rp->elements; i += 2)
        if (rp->element[i]->type == REDIS_REPLY_STRING && !strcmp(rp->element[i]->str, f) &&
            rp->element[i + 1]->type == REDIS_REPLY_STRING)
            return rp->element[i + 1];
    return NULL;
}

/* Empties slot s (its buffer is kept for the next chunk). Call with g->mu
 * held. */
static void slot_clear(slot *s) {
    s->idx = -1;
    s->ready = s->refs = 0;
    s->len = s->used = s->tick = 0;
}

/* The slot of chunk c, or NULL. Call with g->mu held. */
static slot *slot_find(ak_blob_get *g, int c) {
    for (int i = 0; i < SLOTS; i++)
        if (g->slots[i].idx == c) return &g->slots[i];
    return NULL;
}

/* A slot for a new chunk: a free one, else the least recently used ready
 * one no reader holds (emptied). NULL if every slot is busy. Call with
 * g->mu held. */
static slot *slot_take(ak_blob_get *g) {
    slot *best = NULL;
    for (int i = 0; i < SLOTS; i++) {
        slot *s = &g->slots[i];
        if (s->idx < 0) return s;
        if (s->ready && !s->refs && (!best || s->tick < best->tick)) best = s;
    }
    if (best) slot_clear(best);
    return best;
}

/* A GET's reply read off the socket by hand: hiredis would copy each
 * 1 MiB bulk string from its buffer into a fresh allocation (page faults
 * every time); here it lands in the slot's buffer once. The staging buffer
 * holds what a read brought beyond what was asked; large reads go straight
 * to their destination. Used only while hiredis's own reader buffer is
 * empty and for replies it will never see (they are all read here). */
typedef struct {
    int fd;
    char st[4096];
    size_t pos, len;
} raw_in;

/* Reads exactly n bytes into dst. 0, or -1 (closed, timed out). */
static int raw_read(raw_in *in, uint8_t *dst, size_t n) {
    size_t k = in->len - in->pos < n ? in->len - in->pos : n;
    memcpy(dst, in->st + in->pos, k);
    in->pos += k;
    dst += k;
    n -= k;
    while (n >= sizeof in->st) {
        ssize_t r = read(in->fd, dst, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        dst += r;
        n -= (size_t)r;
    }
    while (n) {
        ssize_t r = read(in->fd, in->st, sizeof in->st);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        in->pos = 0;
        in->len = (size_t)r;
        k = in->len < n ? in->len : n;
        memcpy(dst, in->st, k);
        in->pos = k;
        dst += k;
        n -= k;
    }
    return 0;
}

/* Reads one reply line (up to "\r\n", which is dropped) into line. 0, or
 * -1 (closed, or longer than n). */
static int raw_line(raw_in *in, char *line, size_t n) {
    for (size_t i = 0; i + 1 < n; i++) {
        uint8_t ch;
        if (raw_read(in, &ch, 1) != 0) return -1;
        if (ch == '\n' && i && line[i - 1] == '\r') {
            line[i - 1] = 0;
            return 0;
        }
        line[i] = (char)ch;
    }
    return -1;
}

/* Reads chunk c's GET reply into s: 0 with s filled; 1 if the reply says
 * why there is none (nil: ESTALE; an error reply: EIO; the length or sum
 * differs: EBADMSG; *eno set, the connection still in step); -1 if the
 * connection broke or spoke nonsense (not in step any more). */
static int raw_chunk(ak_blob_get *g, raw_in *in, int c, slot *s, int *eno) {
    char line[128];
    if (raw_line(in, line, sizeof line) != 0) return -1;
    if (line[0] == '-') {
        *eno = EIO;
        return 1;
    }
    if (line[0] != '$') return -1;
    char *end;
    long long n = strtoll(line + 1, &end, 10);
    if (*end || n < -1) return -1;
    if (n == -1) {
        *eno = ESTALE;
        return 1;
    }
    uint64_t len = chunk_len(g, c);
    uint8_t crlf[2];
    if ((uint64_t)n != len) {   /* not ours to keep: skipped through the slot's buffer */
        for (long long left = n; left > 0;) {
            size_t k = (uint64_t)left < g->chunk ? (size_t)left : (size_t)g->chunk;
            if (raw_read(in, s->buf, k) != 0) return -1;
            left -= (long long)k;
        }
        if (raw_read(in, crlf, 2) != 0) return -1;
        *eno = EBADMSG;
        return 1;
    }
    if (raw_read(in, s->buf, (size_t)len) != 0 || raw_read(in, crlf, 2) != 0) return -1;
    if (XXH3_64bits(s->buf, (size_t)len) != g->sums[c]) {
        *eno = EBADMSG;
        return 1;
    }
    s->len = len;
    return 0;
}

/* Fills slot sl[j] with chunk want[j] for the k chunks asked, from the
 * cached copy when there is a sound one, else from Redis (GETs pipelined on
 * one connection, FETCH_AHEAD at most in flight), each checked against its
 * sum in the slot's buffer. Sets ok[j]; returns 0, or -1 with *eno set to
 * why chunk want[0] failed: EIO (unreachable), ESTALE (a chunk gone: the
 * image was replaced and its old chunks expired), EBADMSG (its sum
 * differs), ENOMEM. */
static int fetch_chunks(ak_blob_get *g, const int *want, slot **sl, int *ok, int k, int *eno) {
    int need[FETCH_AHEAD], nn = 0;
    *eno = 0;
    for (int j = 0; j < k; j++) {
        ok[j] = 0;
        if (!sl[j]->buf && !(sl[j]->buf = malloc((size_t)g->chunk))) {
            if (j == 0) *eno = ENOMEM;
            continue;
        }
        if (ak_redis_cache_chunk(g, want[j], sl[j])) {
            ok[j] = 1;
            continue;
        }
        need[nn++] = j;
    }
    if (!nn) return ok[0] ? 0 : -1;
    ak_error e = {{0}};
    conn *cn = ak_redis_conn_get(g->r, &e);
    int sent = 0, done = 0;
    redisContext *c = cn ? cn->c : NULL;
    if (c && c->reader->pos == c->reader->len) {   /* hiredis holds no bytes of ours */
        for (; sent < nn; sent++) {
            char key[AK_AGENT_ID_MAX + 64], rest[48];
            snprintf(rest, sizeof rest, "c:%s:%d", g->gen, want[need[sent]]);
            key_of(g->kind, g->id, rest, key, sizeof key);
            if (redisAppendCommand(c, "GET %s", key) != REDIS_OK) break;
        }
        while (sent && !done)
            if (redisBufferWrite(c, &done) != REDIS_OK) break;
    }
    raw_in in = {.fd = c ? c->fd : -1};
    int broken = !done;
    for (int i = 0; i < sent && !broken; i++) {
        int j = need[i], why = 0;
        int rc = raw_chunk(g, &in, want[j], sl[j], &why);
        if (rc < 0) broken = 1;
        else if (rc == 0) {
            ok[j] = 1;
            ak_redis_cache_put_chunk(g, want[j], sl[j]->buf, sl[j]->len);
        } else if (j == 0) *eno = why;
    }
    if (broken && c) {   /* out of step (or a write failed): never reused */
        c->err = REDIS_ERR_IO;
        snprintf(c->errstr, sizeof c->errstr, "chunk reply: %s", errno ? strerror(errno) : "protocol");
    }
    if (cn) ak_redis_conn_put(g->r, cn);
    if (!ok[0] && !*eno) *eno = EIO;
    return ok[0] ? 0 : -1;
}

/* The slot holding chunk c, checked, with a reference held
 * (ak_redis_chunk_release drops it): fetched if no slot has it, and while a
 * restore reads the image (g->ahead) the next chunks with it. NULL with errno set on failure. */
slot *ak_redis_chunk_hold(ak_blob_get *g, int c) {
    pthread_mutex_lock(&g->mu);
    for (;;) {
        slot *s = slot_find(g, c);
        if (s && s->ready) {
            s->refs++;
            s->tick = ++g->tick;
            pthread_mutex_unlock(&g->mu);
            return s;
        }
        if (!s && (s = slot_take(g))) break;
        pthread_cond_wait(&g->cv, &g->mu);   /* another thread is fetching it, or every slot is in use */
    }
    int want[FETCH_AHEAD] = {0}, ok[FETCH_AHEAD] = {0}, k = 0;
    slot *sl[FETCH_AHEAD], *s = slot_find(g, -1);
    for (int a = c; a < g->n && k < (g->ahead ? FETCH_AHEAD : 1); a++) {
        if (a > c && slot_find(g, a)) continue;
        if (a > c && !(s = slot_take(g))) break;
        s->idx = a;   /* claimed (not ready): other readers of chunk a wait for it */
        s->ready = 0;
        want[k] = a;
        sl[k++] = s;
    }
    pthread_mutex_unlock(&g->mu);
    int eno = 0;
    fetch_chunks(g, want, sl, ok, k, &eno);
    pthread_mutex_lock(&g->mu);
    for (int j = 0; j < k; j++) {
        if (ok[j]) {
            sl[j]->ready = 1;
            sl[j]->tick = ++g->tick;
        } else {
            slot_clear(sl[j]);
        }
    }
    if (ok[0]) sl[0]->refs++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (!ok[0]) {
        errno = eno;
        return NULL;
    }
    return sl[0];
}

/* Drops a reference to s after used bytes of it were delivered; a chunk
 * delivered whole (each byte of an image is read once by a restore) is
 * freed at once. */
void ak_redis_chunk_release(ak_blob_get *g, slot *s, uint64_t used) {
    pthread_mutex_lock(&g->mu);
    s->used += used;
    s->refs--;
    if (!s->refs && s->used >= s->len) slot_clear(s);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Copies len bytes of src to the position pos of the bytes iov describes,
 * back to back. */
static void scatter(const struct iovec *iov, int cnt, uint64_t pos, const uint8_t *src, uint64_t len) {
    int i = 0;
    while (i < cnt && pos >= iov[i].iov_len) pos -= iov[i++].iov_len;
    for (; len && i < cnt; i++) {
        size_t k = iov[i].iov_len - (size_t)pos < len ? iov[i].iov_len - (size_t)pos : (size_t)len;
        memcpy((uint8_t *)iov[i].iov_base + pos, src, k);
        src += k;
        len -= k;
        pos = 0;
    }
}

/* store_backend.h's get_open: the manifest read and checked (2 if it does
 * not parse), the header's copy kept if sound, the cache's copy opened. */
int ak_redis_get_open(ak_store_backend *b, int kind, const char *id, ak_blob_get **out, ak_blob_info *info,
                          char *why, size_t whyn, ak_error *err) {
    redis_backend *r = (redis_backend *)b;
    char mkey[AK_AGENT_ID_MAX + 32];
    key_of(kind, id, "m", mkey, sizeof mkey);
    conn *cn = ak_redis_conn_get(r, err);
    if (!cn) return -1;
    redisReply *rp = ak_redis_cmds(r, cn, err, "HGETALL", mkey, (char *)NULL);
    ak_redis_conn_put(r, cn);
    if (!rp) return -1;
    if (rp->type != REDIS_REPLY_ARRAY || rp->elements == 0) {
        freeReplyObject(rp);
        return 1;
    }
    const char *v = field(rp, "v"), *gen = field(rp, "gen"), *n = field(rp, "n"), *bytes = field(rp, "bytes"),
               *chunk = field(rp, "chunk"), *sums = field(rp, "sums");
    int64_t xn, xb, xc;
    ak_blob_get *g = NULL;
    int rc = 2;
    if (!v || strcmp(v, "1") || !gen || strlen(gen) != 16 || ak_parse_dec(n, 1, MAX_CHUNKS, &xn) ||
        ak_parse_dec(bytes, 1, INT64_MAX, &xb) || ak_parse_dec(chunk, 1, 1 << 30, &xc) || !sums ||
        strlen(sums) != (size_t)xn * 16 || (uint64_t)(xb + xc - 1) / (uint64_t)xc != (uint64_t)xn) {
        snprintf(why, whyn, "malformed manifest %s", mkey);
        goto done;
    }
    rc = -1;
    if (!(g = ak_calloc(1, sizeof *g, err))) goto done;
    g->r = r;
    g->kind = kind;
    snprintf(g->id, sizeof g->id, "%s", id);
    snprintf(g->gen, sizeof g->gen, "%s", gen);
    g->bytes = (uint64_t)xb;
    g->chunk = (uint64_t)xc;
    g->n = (int)xn;
    g->sums = malloc(sizeof *g->sums * (size_t)xn);
    if (!g->sums) {
        ak_failc(err, AK_ERR_NOMEM, "out of memory");
        free(g);
        g = NULL;
        goto done;
    }
    for (int64_t i = 0; i < xn; i++) {
        char h[17];
        memcpy(h, sums + i * 16, 16);
        h[16] = 0;
        g->sums[i] = strtoull(h, NULL, 16);
    }
    /* the header's copy, if the manifest has one and it is sound (else the
     * chunks are read: nothing is lost) */
    const redisReply *hd = field_reply(rp, "head");
    const char *hsum = field(rp, "hsum");
    if (hd && hsum && hd->len > 0 && (uint64_t)hd->len <= g->bytes && (uint64_t)hd->len <= g->chunk &&
        strtoull(hsum, NULL, 16) == XXH3_64bits(hd->str, hd->len) && (g->head = malloc(hd->len))) {
        memcpy(g->head, hd->str, hd->len);
        g->head_n = hd->len;
    }
    for (int i = 0; i < SLOTS; i++) g->slots[i].idx = -1;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    ak_redis_cache_open(g);
    memset(info, 0, sizeof *info);
    info->bytes = g->bytes;
    ak_redis_parse_mtime(field(rp, "mtime"), &info->mtime, &info->mtime_ns);
    *out = g;
    rc = 0;
done:
    freeReplyObject(rp);
    return rc;
}

/* Delivers the image's bytes [off, off + n) into iov, chunk by chunk, each
 * chunk's checked bytes copied straight from its reply (or the cached
 * copy's buffer) into place. Returns 0, or -1 with errno set (fetch_chunks). */
static int deliver(ak_blob_get *g, const struct iovec *iov, int cnt, uint64_t off, uint64_t n) {
    if (off + n <= g->head_n) { /* the header, from the manifest's copy */
        scatter(iov, cnt, 0, g->head + off, n);
        return 0;
    }
    for (int c = (int)(off / g->chunk); n && (uint64_t)c * g->chunk < off + n; c++) {
        uint64_t c0 = (uint64_t)c * g->chunk, lo = off > c0 ? off : c0, hi = c0 + chunk_len(g, c);
        if (hi > off + n) hi = off + n;
        slot *s = ak_redis_chunk_hold(g, c);
        if (!s) return -1;
        scatter(iov, cnt, lo - off, s->buf + (lo - c0), hi - lo);
        ak_redis_chunk_release(g, s, hi - lo);
    }
    return 0;
}

/* store_backend.h's get_read. */
int ak_redis_get_read(ak_blob_get *g, uint8_t *dst, size_t n, uint64_t off) {
    if (n == 0) return 0;
    if (off + n > g->bytes) return -2;
    struct iovec v = {.iov_base = dst, .iov_len = n};
    return deliver(g, &v, 1, off, n);
}

/* store_backend.h's get_readv. */
ssize_t ak_redis_get_readv(ak_blob_get *g, const struct iovec *iov, int cnt, uint64_t off) {
    uint64_t n = 0;
    for (int i = 0; i < cnt; i++) n += iov[i].iov_len;
    if (off >= g->bytes) return 0;
    if (off + n > g->bytes) n = g->bytes - off;
    if (deliver(g, iov, cnt, off, n) != 0) return -1;
    return (ssize_t)n;
}

/* A restore reads the image from here on: chunks are fetched ahead
 * (pipelined), and with a local cache a copy is made of what arrives. */
void ak_redis_get_prefetch(ak_blob_get *g, uint64_t at_end, const uint64_t *off, const uint64_t *len, int n) {
    (void)at_end, (void)off, (void)len, (void)n;
    pthread_mutex_lock(&g->mu);
    g->ahead = 1;
    pthread_mutex_unlock(&g->mu);
    ak_redis_cache_begin(g);
}

static const char TOUCH_LUA[] =
    "if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[1] then return 0 end\n"
    "local t = redis.call('TIME')\n"
    "redis.call('HSET', KEYS[1], 'mtime', t[1] .. '.' .. t[2])\n"
    "return 1\n";

/* store_backend.h's get_touch: the manifest's mtime, if it is still the
 * generation g opened, and the cached copy's. */
void ak_redis_get_touch(ak_blob_get *g) {
    if (g->cg) g->r->cache->ops->get_touch(g->cg);   /* the copy's last use: the cache's LRU order */
    char mkey[AK_AGENT_ID_MAX + 32];
    key_of(g->kind, g->id, "m", mkey, sizeof mkey);
    ak_error e = {{0}};
    conn *cn = ak_redis_conn_get(g->r, &e);
    if (!cn) return;
    redisReply *rp = ak_redis_cmds(g->r, cn, &e, "EVAL", TOUCH_LUA, "1", mkey, g->gen, (char *)NULL);
    if (rp) freeReplyObject(rp);
    ak_redis_conn_put(g->r, cn);
}

/* store_backend.h's get_close: a copy begun is completed first; the
 * chunk buffers are wiped (a plain image's bytes). */
void ak_redis_get_close(ak_blob_get *g) {
    if (!g) return;
    if (g->cput) {
        g->ahead = 0;   /* the chunks still missing: typically only the header's */
        ak_redis_cache_finish(g);
    }
    for (int i = 0; i < SLOTS; i++)
        if (g->slots[i].buf) { /* may hold a plain image's bytes */
            sodium_memzero(g->slots[i].buf, (size_t)g->chunk);
            free(g->slots[i].buf);
        }
    if (g->cg) g->r->cache->ops->get_close(g->cg);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->cached);
    if (g->head) sodium_memzero(g->head, (size_t)g->head_n);
    free(g->head);
    free(g->sums);
    free(g);
}

