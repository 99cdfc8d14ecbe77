/* store_redis.c - the Redis backend (store_backend.h), via hiredis.
 *
 * URL: redis://host:port[/db] (loopback or any host the operator names;
 * db 0..15, default 0), an optional password (AUTH) read from a file. Every
 * request has a bounded time: connect 2 s, each command 30 s (a chunk is
 * 1 MiB); a failed connection is dropped and the next operation connects
 * again (one attempt per operation: the caller takes the cold path and
 * says so). Connections are pooled (hiredis contexts are not shared between
 * threads).
 *
 * KEYS (tag = "<k>:<id>", k = a (agent), p (pool), m (memory), c (card); the braces
 * make every key of one image hash to one Redis Cluster slot):
 *     akv:{tag}:m                 the manifest, a hash, written last:
 *         v       "1"
 *         gen     16 hex digits, the put's random generation
 *         n       chunks
 *         bytes   the image's size
 *         chunk   bytes per chunk (the last holds the rest)
 *         sums    n XXH3-64 of the chunks, 16 hex digits each, no separator
 *         mtime   "<sec>.<nsec>" of the last put or touch (Redis TIME)
 *         head    (optional) a copy of the image's first bytes, its header
 *                 (put_head; at most HEAD_MAX), so opening or listing an
 *                 image reads no chunk; hsum its XXH3-64 (16 hex digits).
 *                 A manifest without it (older builds) reads chunk 0.
 *     akv:{tag}:c:<gen>:<i>       chunk i of generation gen: the image's bytes
 *                                 [i * chunk, ...) (the image: the same
 *                                 safetensors bytes as a file, or its seal)
 *     akv:{tag}:lease             the agent's lease: a node's random token,
 *                                 with an expiry (SET NX PX)
 *     akv:{tag}:q:<reason>.<unix time>[.k]
 *                                 a quarantined manifest (its chunks kept)
 * A put writes its chunks with an expiry (CHUNK_TTL_MS), then one Lua
 * script checks the lease (fencing), makes the chunks persistent, gives the
 * previous generation's chunks a short expiry (readers holding its manifest
 * finish within it) and replaces the manifest, atomically. A writer killed
 * before the script leaves only expiring chunks (Redis deletes them: no
 * half image is ever visible). A reader reads the manifest, then chunks on
 * demand into a few reused chunk buffers (SLOTS; GETs pipelined ahead once
 * a restore announces itself with get_prefetch; replies read off the socket
 * by hand, no hiredis copy), each checked against its sum before a byte of
 * it is delivered (a mismatch reads as EBADMSG: the load judges the image
 * CORRUPT); no buffer of the whole image is made. The header of a plain
 * image is served from the manifest's copy (head), so listing reads no
 * chunk.
 *
 * LEASES (one node serves an agent): store_redis_lease.c. The files of
 * this backend: store_redis_impl.h.
 */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>

#include "store/store_redis_impl.h"

/* ------------------------------------------------------------ connections */

/* An idle connection, or a new one (connect, AUTH, SELECT). NULL with err
 * set if Redis cannot be reached. */
conn *ak_redis_conn_get(redis_backend *r, ak_error *err) {
    pthread_mutex_lock(&r->mu);
    conn *cn = r->idle;
    if (cn) {
        r->idle = cn->next;
        r->n_idle--;
    }
    pthread_mutex_unlock(&r->mu);
    if (cn) return cn;
    struct timeval ct = {.tv_sec = CONNECT_MS / 1000, .tv_usec = (CONNECT_MS % 1000) * 1000},
                   tt = {.tv_sec = COMMAND_MS / 1000};
    redisContext *c = redisConnectWithTimeout(r->host, r->port, ct);
    if (!c || c->err) {
        ak_failc(err, AK_ERR_IO, "redis %s:%d: connect: %s", r->host, r->port, c ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tt);
    /* keep the reply buffer between replies: by default hiredis frees it once
     * empty, and every 1 MiB chunk then regrew it from 16 KiB (copies, page
     * faults: a third of a restore's time) */
    c->reader->maxbuf = 0;
    redisReply *rp = NULL;
    if (r->password) {
        rp = redisCommand(c, "AUTH %s", r->password);
        if (!rp || rp->type == REDIS_REPLY_ERROR) {
            ak_failc(err, AK_ERR_PERMISSION, "redis %s:%d: AUTH: %s", r->host, r->port,
                     rp ? rp->str : c->errstr);
            if (rp) freeReplyObject(rp);
            redisFree(c);
            return NULL;
        }
        freeReplyObject(rp);
    }
    if (r->db) {
        rp = redisCommand(c, "SELECT %d", r->db);
        if (!rp || rp->type == REDIS_REPLY_ERROR) {
            ak_failc(err, AK_ERR_IO, "redis %s:%d: SELECT %d: %s", r->host, r->port, r->db, rp ? rp->str : c->errstr);
            if (rp) freeReplyObject(rp);
            redisFree(c);
            return NULL;
        }
        freeReplyObject(rp);
    }
    cn = calloc(1, sizeof *cn);
    if (!cn) {
        redisFree(c);
        ak_failc(err, AK_ERR_NOMEM, "out of memory");
        return NULL;
    }
    cn->c = c;
    return cn;
}

/* Returns a connection to the pool, or frees it if it failed (its state is
 * unknown) or the pool is full. */
void ak_redis_conn_put(redis_backend *r, conn *cn) {
    if (!cn) return;
    pthread_mutex_lock(&r->mu);
    if (!cn->c->err && r->n_idle < POOL_MAX) {
        cn->next = r->idle;
        r->idle = cn;
        r->n_idle++;
        cn = NULL;
    }
    pthread_mutex_unlock(&r->mu);
    if (cn) {
        redisFree(cn->c);
        free(cn);
    }
}

/* Runs a command (argv form, binary safe); returns the reply, or NULL with
 * err set (connection error or an error reply; a connection error marks cn
 * failed). */
redisReply *ak_redis_cmd(redis_backend *r, conn *cn, ak_error *err, int argc, const char **argv, const size_t *len) {
    redisReply *rp = redisCommandArgv(cn->c, argc, argv, len);
    if (!rp) {
        ak_failc(err, AK_ERR_IO, "redis %s:%d: %s: %s", r->host, r->port, argv[0], cn->c->errstr[0] ? cn->c->errstr : "no reply");
        return NULL;
    }
    if (rp->type == REDIS_REPLY_ERROR) {
        int busy = !strncmp(rp->str, "LEASE", 5) || strstr(rp->str, "LEASE ");
        ak_failc(err, busy ? AK_ERR_BUSY : AK_ERR_IO, "redis %s:%d: %s: %s", r->host, r->port, argv[0], rp->str);
        freeReplyObject(rp);
        return NULL;
    }
    return rp;
}

/* cmd with string arguments (NULL-terminated). */
redisReply *ak_redis_cmds(redis_backend *r, conn *cn, ak_error *err, ...) {
    const char *argv[64];
    size_t len[64];
    int argc = 0;
    va_list ap;
    va_start(ap, err);
    for (const char *a; argc < 64 && (a = va_arg(ap, const char *));) {
        argv[argc] = a;
        len[argc++] = strlen(a);
    }
    va_end(ap);
    return ak_redis_cmd(r, cn, err, argc, argv, len);
}

/* Says line through the backend's log, or on stderr without one. */
void ak_redis_log(redis_backend *r, const char *line) {
    if (r->log) r->log(r->log_ud, line);
    else fprintf(stderr, "%s\n", line);
}

/* "sec.usec" (Redis TIME; NULL: 0) into sec and nsec. */
void ak_redis_parse_mtime(const char *s, int64_t *sec, int64_t *ns) {
    *sec = 0;
    *ns = 0;
    if (!s) return;
    char *end;
    *sec = strtoll(s, &end, 10);
    if (*end == '.') *ns = strtoll(end + 1, NULL, 10) * 1000;
}

/* ----------------------------------------------------------------- open */

static const ak_backend_ops redis_ops;

/* Parses redis://host:port[/db]. Returns 0, or -1 with err set. */
static int parse_url(redis_backend *r, const char *url, ak_error *err) {
    const char *p = url + strlen("redis://");
    const char *colon = strrchr(p, ':'), *slash = strchr(p, '/');
    if (strncmp(url, "redis://", 8) || !colon || colon == p || (slash && slash < colon) ||
        (size_t)(colon - p) >= sizeof r->host)
        return ak_failc(err, AK_ERR_INVALID, "store: %s: expected redis://host:port[/db]", url);
    memcpy(r->host, p, (size_t)(colon - p));
    r->host[colon - p] = 0;
    char num[16];
    size_t nl = slash ? (size_t)(slash - colon - 1) : strlen(colon + 1);
    int64_t x;
    if (nl == 0 || nl >= sizeof num) return ak_failc(err, AK_ERR_INVALID, "store: %s: bad port", url);
    memcpy(num, colon + 1, nl);
    num[nl] = 0;
    if (ak_parse_dec(num, 1, 65535, &x)) return ak_failc(err, AK_ERR_INVALID, "store: %s: bad port", url);
    r->port = (int)x;
    if (slash && slash[1]) {
        if (ak_parse_dec(slash + 1, 0, 15, &x)) return ak_failc(err, AK_ERR_INVALID, "store: %s: db must be 0..15", url);
        r->db = (int)x;
    }
    snprintf(r->url, sizeof r->url, "redis://%s:%d/%d", r->host, r->port, r->db);
    return 0;
}

/* See store_backend.h. */
ak_store_backend *ak_backend_redis_open(const char *url, const char *password, int lease_ms, const char *cache_dir,
                                        void (*log)(void *ud, const char *line), void *log_ud, ak_error *err) {
    redis_backend *r = ak_calloc(1, sizeof *r, err);
    if (!r) return NULL;
    r->base.ops = &redis_ops;
    if (parse_url(r, url, err) != 0) {
        free(r);
        return NULL;
    }
    if (password && !(r->password = strdup(password))) {
        free(r);
        ak_failc(err, AK_ERR_NOMEM, "out of memory");
        return NULL;
    }
    r->lease_ms = lease_ms > 0 ? lease_ms : AK_STORE_LEASE_MS;
    r->cache_room = -1;
    r->log = log;
    r->log_ud = log_ud;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->lease_cv, NULL);
    /* reachable now: a store that cannot reach Redis at open says so (later
     * failures are per operation: the cold path) */
    conn *cn = ak_redis_conn_get(r, err);
    if (!cn || (cache_dir && !(r->cache = ak_backend_dir_open(cache_dir, err)))) {
        if (cn) ak_redis_conn_put(r, cn);
        redis_ops.close(&r->base);
        return NULL;
    }
    ak_redis_conn_put(r, cn);
    return &r->base;
}

/* Frees the backend (no handle may be open): the leases released first,
 * then the idle connections and the cache. */
static void redis_close(ak_store_backend *b) {
    redis_backend *r = (redis_backend *)b;
    ak_redis_lease_stop(r);
    while (r->idle) {
        conn *n = r->idle->next;
        redisFree(r->idle->c);
        free(r->idle);
        r->idle = n;
    }
    if (r->cache) r->cache->ops->close(r->cache);
    if (r->password) sodium_memzero(r->password, strlen(r->password));
    free(r->password);
    free(r->leases);
    pthread_cond_destroy(&r->lease_cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* The manifest's key, after the server's URL. */
static int redis_where(const ak_store_backend *b, int kind, const char *id, char *out, size_t n) {
    char key[AK_AGENT_ID_MAX + 32];
    key_of(kind, id, "m", key, sizeof key);
    int w = snprintf(out, n, "%s %s", ((const redis_backend *)b)->url, key);
    return w < 0 || (size_t)w >= n ? -1 : 0;
}

/* The operations, by the file that holds them. */
static const ak_backend_ops redis_ops = {
    .name = "redis", .close = redis_close, .where = redis_where,
    /* store_redis_put.c */
    .put_begin = ak_redis_put_begin, .put_head = ak_redis_put_head, .put_write = ak_redis_put_write,
    .put_commit = ak_redis_put_commit, .put_abort = ak_redis_put_abort,
    /* store_redis_get.c */
    .get_open = ak_redis_get_open, .get_read = ak_redis_get_read, .get_readv = ak_redis_get_readv,
    .get_prefetch = ak_redis_get_prefetch, .get_touch = ak_redis_get_touch, .get_close = ak_redis_get_close,
    /* store_redis_index.c */
    .list = ak_redis_list, .remove = ak_redis_remove,
    .quarantine = ak_redis_quarantine, .quarantine_list = ak_redis_quarantine_list,
    .quarantine_drop = ak_redis_quarantine_drop,
    /* store_redis_cache.c */
    .cache_list = ak_redis_cache_list, .cache_drop = ak_redis_cache_drop, .cache_room = ak_redis_cache_room,
    /* store_redis_lease.c */
    .lease_hold = ak_redis_lease_hold, .lease_held = ak_redis_lease_held,
};
