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
 * LEASES (one node serves an agent): ak_backend_lease_hold takes the lease
 * of an agent (SET NX PX, a token random per process and lease) or renews
 * it; a thread named "ak-lease" renews every held lease each third of the
 * lease time, and releases those not used for LEASE_IDLE_MS; the manifest
 * write is fenced by the token (a node whose lease expired or was taken
 * cannot overwrite); a node that finds its lease gone stops writing that
 * agent and logs one line. The thread is joined at close.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sodium.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "store/store_backend.h"
#include "store/store_impl.h"

#define CHUNK_BYTES ((size_t)1 << 20)
#define CHUNK_TTL_MS 600000LL          /* an uncommitted chunk lives 10 minutes */
#define OLD_CHUNK_TTL_MS 60000LL       /* a replaced generation's chunks: a minute for readers */
#define CONNECT_MS 2000
#define COMMAND_MS 30000
#define POOL_MAX 8                     /* idle connections kept */
#define SCAN_MAX_ROUNDS 100000         /* SCAN calls per listing, at most */
#define MAX_CHUNKS (1 << 20)
#define PIPE_DEPTH 4                   /* chunk SETs in flight on one connection */
#define FETCH_AHEAD 6                  /* chunk GETs in flight on one connection (a restore) */
#define HEAD_MAX ((size_t)1 << 20)    /* header bytes copied into a manifest, at most */
#define SLOTS 16                       /* chunks at hand per open image (1 MiB each) */

typedef struct conn {
    redisContext *c;
    struct conn *next;
} conn;

typedef struct {
    char id[AK_AGENT_ID_MAX + 1];
    char token[33];
    double last_used;                  /* ak_now() of the last hold */
} lease;

typedef struct {
    ak_store_backend base;
    char host[256];
    int port, db;
    char *password;                    /* NULL: no AUTH */
    char url[300];
    pthread_mutex_t mu;                /* the pool and the leases */
    conn *idle;
    int n_idle;
    /* leases */
    int lease_ms;
    lease *leases;
    int n_leases, cap_leases;
    pthread_t lease_thread;
    int lease_thread_on;
    pthread_cond_t lease_cv;
    int stopping;
    void (*log)(void *ud, const char *line);
    void *log_ud;
    ak_store_backend *cache;           /* the read-through cache (a directory backend), or NULL */
    int64_t cache_room;                /* bytes its copies may take (ak_backend_cache_room), < 0: no bound */
} redis_backend;

struct ak_blob_put {
    redis_backend *r;
    conn *cn;
    int kind;
    char id[AK_AGENT_ID_MAX + 1];
    char gen[17];
    uint64_t total, done;
    uint8_t *buf;
    size_t used;
    int n;
    char *sums;                        /* n * 16 hex digits */
    int pending;                       /* pipelined SETs not yet answered */
    uint64_t head_n;                   /* put_head: header bytes to copy into the manifest (0: none) */
    uint8_t *head;                     /* their copy, once written */
};

/* A chunk at hand: a reader took part of it and the rest is for the next
 * (a restore reads 256 KiB at a time), or it was fetched ahead. */
typedef struct {
    int idx;                           /* the chunk, -1: free */
    int ready;                         /* 0: being fetched */
    int refs;                          /* readers copying from it */
    uint8_t *buf;                      /* its bytes (chunk bytes, kept for the next chunk: no page faults) */
    uint64_t len, used;                /* bytes; bytes delivered so far */
    uint64_t tick;                     /* last use, for eviction */
} slot;

struct ak_blob_get {
    redis_backend *r;
    int kind;
    char id[AK_AGENT_ID_MAX + 1];
    char gen[17];
    uint64_t bytes, chunk;
    int n;
    uint64_t *sums;
    uint8_t *head;                     /* the manifest's copy of the first head_n bytes, checked, or NULL */
    uint64_t head_n;
    pthread_mutex_t mu;                /* the slots and the cache fields (readv runs on two threads) */
    pthread_cond_t cv;                 /* a slot became ready or free */
    slot slots[SLOTS];
    uint64_t tick;
    int ahead;                         /* a restore reads it: fetch ahead */
    ak_blob_get *cg;                   /* the cached copy (a directory get), or NULL */
    int cache_bad;                     /* a chunk of it failed its sum: deleted, Redis read */
    ak_blob_put *cput;                 /* the copy being made (a directory put), or NULL */
    uint8_t *cached;                   /* cached[i]: chunk i written to cput */
    int cache_failed;                  /* a write to cput failed: dropped at close */
};

static const char kind_letter[4] = {'a', 'p', 'm', 'c'};

/* "akv:{<k>:<id>}:<rest>" into out. */
static void key_of(int kind, const char *id, const char *rest, char *out, size_t n) {
    snprintf(out, n, "akv:{%c:%s}:%s", kind_letter[kind], id, rest);
}

/* ------------------------------------------------------------ connections */

/* An idle connection, or a new one (connect, AUTH, SELECT). NULL with err
 * set if Redis cannot be reached. */
static conn *conn_get(redis_backend *r, ak_error *err) {
    pthread_mutex_lock(&r->mu);
    conn *cn = r->idle;
    if (cn) {
        r->idle = cn->next;
        r->n_idle--;
    }
    pthread_mutex_unlock(&r->mu);
    if (cn) return cn;
    struct timeval ct = {CONNECT_MS / 1000, (CONNECT_MS % 1000) * 1000}, tt = {COMMAND_MS / 1000, 0};
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
static void conn_put(redis_backend *r, conn *cn) {
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
static redisReply *cmd(redis_backend *r, conn *cn, ak_error *err, int argc, const char **argv, const size_t *len) {
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
static redisReply *cmds(redis_backend *r, conn *cn, ak_error *err, ...) {
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
    return cmd(r, cn, err, argc, argv, len);
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
    conn *cn = conn_get(r, err);
    if (!cn || (cache_dir && !(r->cache = ak_backend_dir_open(cache_dir, err)))) {
        if (cn) conn_put(r, cn);
        redis_ops.close(&r->base);
        return NULL;
    }
    conn_put(r, cn);
    return &r->base;
}

static void redis_close(ak_store_backend *b) {
    redis_backend *r = (redis_backend *)b;
    pthread_mutex_lock(&r->mu);
    r->stopping = 1;
    pthread_cond_broadcast(&r->lease_cv);
    int on = r->lease_thread_on;
    pthread_mutex_unlock(&r->mu);
    if (on) pthread_join(r->lease_thread, NULL);
    /* release what is still held: another node may take the agents at once */
    for (int i = 0; i < r->n_leases; i++) {
        ak_error e = {{0}};
        conn *cn = conn_get(r, &e);
        if (!cn) break;
        char key[AK_AGENT_ID_MAX + 32];
        key_of(AK_FILE_AGENT, r->leases[i].id, "lease", key, sizeof key);
        redisReply *rp = cmds(r, cn, &e, "EVAL",
                              "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
                              "1", key, r->leases[i].token, (char *)NULL);
        if (rp) freeReplyObject(rp);
        conn_put(r, cn);
    }
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

static int redis_where(const ak_store_backend *b, int kind, const char *id, char *out, size_t n) {
    char key[AK_AGENT_ID_MAX + 32];
    key_of(kind, id, "m", key, sizeof key);
    int w = snprintf(out, n, "%s %s", ((const redis_backend *)b)->url, key);
    return w < 0 || (size_t)w >= n ? -1 : 0;
}

/* ------------------------------------------------------------------ put */

static void lease_drop(redis_backend *r, int i);

/* The token of this node's lease on agent id into tok ("" if none held). */
static void lease_token(redis_backend *r, int kind, const char *id, char tok[33]) {
    tok[0] = 0;
    if (kind != AK_FILE_AGENT) return;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n_leases; i++)
        if (!strcmp(r->leases[i].id, id)) snprintf(tok, 33, "%s", r->leases[i].token);
    pthread_mutex_unlock(&r->mu);
}

static ak_blob_put *redis_put_begin(ak_store_backend *b, int kind, const char *id, uint64_t total, ak_error *err) {
    redis_backend *r = (redis_backend *)b;
    uint64_t n = (total + CHUNK_BYTES - 1) / CHUNK_BYTES;
    if (n == 0 || n > MAX_CHUNKS) {
        ak_failc(err, AK_ERR_INVALID, "%s: an image of %llu bytes", id, (unsigned long long)total);
        return NULL;
    }
    ak_blob_put *p = ak_calloc(1, sizeof *p, err);
    if (!p) return NULL;
    p->r = r;
    p->kind = kind;
    snprintf(p->id, sizeof p->id, "%s", id);
    p->total = total;
    uint8_t g[8];
    randombytes_buf(g, sizeof g);
    for (int i = 0; i < 8; i++) snprintf(p->gen + 2 * i, 3, "%02x", g[i]);
    p->buf = malloc(CHUNK_BYTES);
    p->sums = malloc((size_t)n * 16 + 1);
    if (!p->buf || !p->sums || !(p->cn = conn_get(r, err))) {
        if (!p->buf || !p->sums) ak_failc(err, AK_ERR_NOMEM, "out of memory");
        free(p->buf);
        free(p->sums);
        free(p);
        return NULL;
    }
    p->sums[0] = 0;
    return p;
}

/* Reads replies of pipelined SETs until at most keep are pending. Returns
 * 0, or -1 with err set (a failed SET: the put fails). */
static int drain(ak_blob_put *p, int keep, ak_error *err) {
    int rc = 0;
    while (p->pending > keep) {
        redisReply *rp = NULL;
        if (redisGetReply(p->cn->c, (void **)&rp) != REDIS_OK || !rp) {
            p->pending = 0;   /* the connection is broken: nothing more comes */
            return ak_failc(err, AK_ERR_IO, "redis %s:%d: SET: %s", p->r->host, p->r->port,
                            p->cn->c->errstr[0] ? p->cn->c->errstr : "no reply");
        }
        if (rp->type == REDIS_REPLY_ERROR && !rc)
            rc = ak_failc(err, AK_ERR_IO, "redis %s:%d: SET: %s", p->r->host, p->r->port, rp->str);
        freeReplyObject(rp);
        p->pending--;
    }
    return rc;
}

/* Writes the buffered chunk (with its expiry: see the top). */
static int flush_chunk(ak_blob_put *p, ak_error *err) {
    if (p->n == 0 && p->head_n && p->head_n <= p->used && (p->head = malloc((size_t)p->head_n)))
        memcpy(p->head, p->buf, (size_t)p->head_n);   /* no copy (out of memory): the manifest has no head */
    char key[AK_AGENT_ID_MAX + 64], rest[48], ttl[24];
    snprintf(rest, sizeof rest, "c:%s:%d", p->gen, p->n);
    key_of(p->kind, p->id, rest, key, sizeof key);
    snprintf(ttl, sizeof ttl, "%lld", CHUNK_TTL_MS);
    const char *argv[] = {"SET", key, (const char *)p->buf, "PX", ttl};
    size_t len[] = {3, strlen(key), p->used, 2, strlen(ttl)};
    /* pipelined: up to PIPE_DEPTH SETs in flight (the buffer is copied into
     * the connection's output at append) */
    if (redisAppendCommandArgv(p->cn->c, 5, argv, len) != REDIS_OK)
        return ak_failc(err, AK_ERR_IO, "redis %s:%d: SET: %s", p->r->host, p->r->port, p->cn->c->errstr);
    if (++p->pending >= PIPE_DEPTH && drain(p, 1, err) != 0) return -1;
    snprintf(p->sums + (size_t)p->n * 16, 17, "%016llx", (unsigned long long)XXH3_64bits(p->buf, p->used));
    p->n++;
    p->used = 0;
    return 0;
}

static void redis_put_head(ak_blob_put *p, uint64_t n) {
    /* a header longer than a chunk stays in the chunks */
    if (p->done == 0 && n > 0 && n <= HEAD_MAX && n <= CHUNK_BYTES && n <= p->total) p->head_n = n;
}

static int redis_put_write(ak_blob_put *p, const uint8_t *data, size_t n, ak_error *err) {
    if (p->done + n > p->total) return ak_failc(err, AK_ERR_INVALID, "%s: more bytes than announced", p->id);
    while (n > 0) {
        size_t k = CHUNK_BYTES - p->used < n ? CHUNK_BYTES - p->used : n;
        memcpy(p->buf + p->used, data, k);
        p->used += k;
        p->done += k;
        data += k;
        n -= k;
        if (p->used == CHUNK_BYTES && flush_chunk(p, err) != 0) return -1;
    }
    return 0;
}

static void redis_put_abort(ak_blob_put *p) {
    if (!p) return;
    ak_error de = {{0}};
    if (p->cn && p->pending) drain(p, 0, &de);
    /* the chunks written expire by themselves; delete them now if we can */
    for (int i = 0; p->cn && !p->cn->c->err && i < p->n; i++) {
        char key[AK_AGENT_ID_MAX + 64], rest[48];
        snprintf(rest, sizeof rest, "c:%s:%d", p->gen, i);
        key_of(p->kind, p->id, rest, key, sizeof key);
        ak_error e = {{0}};
        redisReply *rp = cmds(p->r, p->cn, &e, "DEL", key, (char *)NULL);
        if (rp) freeReplyObject(rp);
    }
    conn_put(p->r, p->cn);
    sodium_memzero(p->buf, CHUNK_BYTES);
    free(p->buf);
    if (p->head) sodium_memzero(p->head, (size_t)p->head_n);
    free(p->head);
    free(p->sums);
    free(p);
}

/* The commit (see the top): KEYS[1] manifest, KEYS[2] lease; ARGV: token
 * ("" when this node holds no lease: then nobody may), gen, n, bytes,
 * chunk, sums, the chunk keys' prefix, the old chunks' expiry, the lease
 * time, the header's copy ("": none) and its sum. A lease of ours that is gone (it expired, or Redis restarted empty)
 * and that no other node took is taken again: no other writer exists at
 * that instant; one another node holds fences the write. Returns the new
 * mtime "sec.usec". */
static const char COMMIT_LUA[] =
    "local l = redis.call('GET', KEYS[2])\n"
    "if ARGV[1] == '' then if l then return redis.error_reply('LEASE held by another node') end\n"
    "elseif not l then redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[9])\n"
    "elseif l ~= ARGV[1] then return redis.error_reply('LEASE lost: another node holds the agent now') end\n"
    "local n = tonumber(ARGV[3])\n"
    "for i = 0, n - 1 do\n"
    "  local k = ARGV[7] .. ARGV[2] .. ':' .. i\n"
    "  if redis.call('EXISTS', k) == 0 then return redis.error_reply('CHUNK ' .. i .. ' missing (expired?)') end\n"
    "  redis.call('PERSIST', k)\n"
    "end\n"
    "local og = redis.call('HGET', KEYS[1], 'gen')\n"
    "local on = redis.call('HGET', KEYS[1], 'n')\n"
    "if og and og ~= ARGV[2] and on then\n"
    "  for i = 0, tonumber(on) - 1 do redis.call('PEXPIRE', ARGV[7] .. og .. ':' .. i, ARGV[8]) end\n"
    "end\n"
    "local t = redis.call('TIME')\n"
    "local mt = t[1] .. '.' .. t[2]\n"
    "redis.call('DEL', KEYS[1])\n"
    "redis.call('HSET', KEYS[1], 'v', '1', 'gen', ARGV[2], 'n', ARGV[3], 'bytes', ARGV[4], 'chunk', ARGV[5], "
    "'sums', ARGV[6], 'mtime', mt)\n"
    "if ARGV[10] ~= '' then redis.call('HSET', KEYS[1], 'head', ARGV[10], 'hsum', ARGV[11]) end\n"
    "return mt\n";

/* "sec.usec" (Redis TIME) into sec and nsec. */
static void parse_mtime(const char *s, int64_t *sec, int64_t *ns) {
    *sec = 0;
    *ns = 0;
    if (!s) return;
    char *end;
    *sec = strtoll(s, &end, 10);
    if (*end == '.') *ns = strtoll(end + 1, NULL, 10) * 1000;
}

static int redis_put_commit(ak_blob_put *p, ak_blob_info *info, ak_error *err) {
    redis_backend *r = p->r;
    if (p->done != p->total) {
        ak_failc(err, AK_ERR_INVALID, "%s: %llu of %llu bytes written", p->id, (unsigned long long)p->done,
                 (unsigned long long)p->total);
        redis_put_abort(p);
        return -1;
    }
    if ((p->used && flush_chunk(p, err) != 0) || drain(p, 0, err) != 0) {
        redis_put_abort(p);
        return -1;
    }
    char mkey[AK_AGENT_ID_MAX + 32], lkey[AK_AGENT_ID_MAX + 32], prefix[AK_AGENT_ID_MAX + 32], tok[33];
    char n[16], bytes[24], chunk[24], old_ttl[24], lease_ms[24];
    key_of(p->kind, p->id, "m", mkey, sizeof mkey);
    key_of(p->kind, p->id, "lease", lkey, sizeof lkey);
    key_of(p->kind, p->id, "c:", prefix, sizeof prefix);
    lease_token(r, p->kind, p->id, tok);
    snprintf(n, sizeof n, "%d", p->n);
    snprintf(bytes, sizeof bytes, "%llu", (unsigned long long)p->total);
    snprintf(chunk, sizeof chunk, "%zu", CHUNK_BYTES);
    snprintf(old_ttl, sizeof old_ttl, "%lld", OLD_CHUNK_TTL_MS);
    snprintf(lease_ms, sizeof lease_ms, "%d", r->lease_ms);
    char hsum[17] = "";
    if (p->head) snprintf(hsum, sizeof hsum, "%016llx", (unsigned long long)XXH3_64bits(p->head, (size_t)p->head_n));
    const char *argv[] = {"EVAL", COMMIT_LUA, "2", mkey, lkey, tok, p->gen, n, bytes, chunk, p->sums, prefix, old_ttl,
                          lease_ms, p->head ? (const char *)p->head : "", hsum};
    size_t alen[16];
    for (int i = 0; i < 16; i++) alen[i] = i == 14 ? (p->head ? (size_t)p->head_n : 0) : strlen(argv[i]);   /* 14: binary */
    redisReply *rp = cmd(r, p->cn, err, 16, argv, alen);
    if (!rp) {
        if (err->code == AK_ERR_BUSY) {
            char line[800];
            snprintf(line, sizeof line, "store: redis: agent %s: not written: %s", p->id, err->msg);
            if (r->log) r->log(r->log_ud, line);
            else fprintf(stderr, "%s\n", line);
            if (tok[0]) { /* taken by another node: this node stops writing the agent (a later save asks again) */
                pthread_mutex_lock(&r->mu);
                for (int i = 0; i < r->n_leases; i++)
                    if (!strcmp(r->leases[i].id, p->id)) {
                        lease_drop(r, i);
                        break;
                    }
                pthread_mutex_unlock(&r->mu);
            }
        }
        redis_put_abort(p);
        return -1;
    }
    memset(info, 0, sizeof *info);
    info->bytes = p->total;
    parse_mtime(rp->type == REDIS_REPLY_STRING ? rp->str : NULL, &info->mtime, &info->mtime_ns);
    freeReplyObject(rp);
    conn_put(r, p->cn);
    sodium_memzero(p->buf, CHUNK_BYTES);
    free(p->buf);
    if (p->head) sodium_memzero(p->head, (size_t)p->head_n);
    free(p->head);
    free(p->sums);
    free(p);
    return 0;
}

/* ------------------------------------------------------------------ get */

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

/* READ-THROUGH CACHE. With a local directory, an image a restore read from
 * Redis is kept there (a directory backend under <local dir>/redis-cache)
 * as "<k>.<gen>.<id>" (ids up to 110 characters): the generation names the
 * version, so a manifest that moved on never meets an old copy. Chunks are
 * written to the copy as they arrive (positional writes into the put's
 * temp file); at close the chunks the restore did not need are fetched and
 * the copy committed. Opening an image whose generation is cached reads the
 * file, each chunk checked against the manifest's sum (the same check as a
 * chunk from Redis); a copy that fails it is deleted and Redis read
 * instead. The manifest is always read from Redis: it decides which
 * version is current. */
static int cache_name(const ak_blob_get *g, char *out, size_t n) {
    int w = snprintf(out, n, "%c.%s.%s", kind_letter[g->kind], g->gen, g->id);
    return w < 0 || (size_t)w >= n || w > AK_AGENT_ID_MAX ? -1 : 0;
}

/* Bytes of chunk c. */
static uint64_t chunk_len(const ak_blob_get *g, int c) {
    uint64_t off = (uint64_t)c * g->chunk;
    return c == g->n - 1 ? g->bytes - off : g->chunk;
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

/* Writes verified chunk c to the cached copy being made, once. */
static void cache_put_chunk(ak_blob_get *g, int c, const uint8_t *data, uint64_t len) {
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
        uint64_t len = chunk_len(g, want[j]);
        pthread_mutex_lock(&g->mu);
        int from_copy = g->cg && !g->cache_bad;
        pthread_mutex_unlock(&g->mu);
        if (from_copy) {
            if (g->r->cache->ops->get_read(g->cg, sl[j]->buf, (size_t)len, (uint64_t)want[j] * g->chunk) == 0 &&
                XXH3_64bits(sl[j]->buf, (size_t)len) == g->sums[want[j]]) {
                sl[j]->len = len;
                ok[j] = 1;
                continue;
            }
            /* damaged or torn copy: deleted, and Redis read instead (from now on) */
            char name[AK_AGENT_ID_MAX + 1];
            ak_error e = {{0}};
            pthread_mutex_lock(&g->mu);
            int first = !g->cache_bad;
            g->cache_bad = 1;
            pthread_mutex_unlock(&g->mu);
            if (first && !cache_name(g, name, sizeof name)) g->r->cache->ops->remove(g->r->cache, AK_FILE_AGENT, name, &e);
        }
        need[nn++] = j;
    }
    if (!nn) return ok[0] ? 0 : -1;
    ak_error e = {{0}};
    conn *cn = conn_get(g->r, &e);
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
    raw_in in = {c ? c->fd : -1, {0}, 0, 0};
    int broken = !done;
    for (int i = 0; i < sent && !broken; i++) {
        int j = need[i], why = 0;
        int rc = raw_chunk(g, &in, want[j], sl[j], &why);
        if (rc < 0) broken = 1;
        else if (rc == 0) {
            ok[j] = 1;
            cache_put_chunk(g, want[j], sl[j]->buf, sl[j]->len);
        } else if (j == 0) *eno = why;
    }
    if (broken && c) {   /* out of step (or a write failed): never reused */
        c->err = REDIS_ERR_IO;
        snprintf(c->errstr, sizeof c->errstr, "chunk reply: %s", errno ? strerror(errno) : "protocol");
    }
    if (cn) conn_put(g->r, cn);
    if (!ok[0] && !*eno) *eno = EIO;
    return ok[0] ? 0 : -1;
}

/* The slot holding chunk c, checked, with a reference held (chunk_release
 * drops it): fetched if no slot has it, and while a restore reads the image
 * (g->ahead) the next chunks with it. NULL with errno set on failure. */
static slot *chunk_hold(ak_blob_get *g, int c) {
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
static void chunk_release(ak_blob_get *g, slot *s, uint64_t used) {
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

static int redis_get_open(ak_store_backend *b, int kind, const char *id, ak_blob_get **out, ak_blob_info *info,
                          char *why, size_t whyn, ak_error *err) {
    redis_backend *r = (redis_backend *)b;
    char mkey[AK_AGENT_ID_MAX + 32];
    key_of(kind, id, "m", mkey, sizeof mkey);
    conn *cn = conn_get(r, err);
    if (!cn) return -1;
    redisReply *rp = cmds(r, cn, err, "HGETALL", mkey, (char *)NULL);
    conn_put(r, cn);
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
    memset(info, 0, sizeof *info);
    info->bytes = g->bytes;
    parse_mtime(field(rp, "mtime"), &info->mtime, &info->mtime_ns);
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
        slot *s = chunk_hold(g, c);
        if (!s) return -1;
        scatter(iov, cnt, lo - off, s->buf + (lo - c0), hi - lo);
        chunk_release(g, s, hi - lo);
    }
    return 0;
}

static int redis_get_read(ak_blob_get *g, uint8_t *dst, size_t n, uint64_t off) {
    if (n == 0) return 0;
    if (off + n > g->bytes) return -2;
    struct iovec v = {dst, n};
    return deliver(g, &v, 1, off, n);
}

static ssize_t redis_get_readv(ak_blob_get *g, const struct iovec *iov, int cnt, uint64_t off) {
    uint64_t n = 0;
    for (int i = 0; i < cnt; i++) n += iov[i].iov_len;
    if (off >= g->bytes) return 0;
    if (off + n > g->bytes) n = g->bytes - off;
    if (deliver(g, iov, cnt, off, n) != 0) return -1;
    return (ssize_t)n;
}

/* A restore reads the image from here on: chunks are fetched ahead
 * (pipelined), and with a local cache a copy is made of what arrives. */
static void redis_get_prefetch(ak_blob_get *g, uint64_t at_end, const uint64_t *off, const uint64_t *len, int n) {
    (void)at_end, (void)off, (void)len, (void)n;
    pthread_mutex_lock(&g->mu);
    g->ahead = 1;
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
    if (ak_backend_cache_list(&r->base, &v, &nv, &e) != 0) return;
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

/* Completes the cached copy a restore began (the chunks it did not read
 * fetched now), drops the image's copies of other generations, and commits
 * it; drops it if anything failed. Best effort. */
static void cache_finish(ak_blob_get *g) {
    const ak_backend_ops *ops = g->r->cache->ops;
    for (int c = 0; c < g->n && !g->cache_failed; c++) {
        if (g->cached[c]) continue;
        slot *s = chunk_hold(g, c);   /* a fresh fetch writes the copy; one held already is written here */
        if (!s) {
            g->cache_failed = 1;
            break;
        }
        cache_put_chunk(g, c, s->buf, s->len);
        chunk_release(g, s, 0);
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

static const char TOUCH_LUA[] =
    "if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[1] then return 0 end\n"
    "local t = redis.call('TIME')\n"
    "redis.call('HSET', KEYS[1], 'mtime', t[1] .. '.' .. t[2])\n"
    "return 1\n";

static void redis_get_touch(ak_blob_get *g) {
    if (g->cg) g->r->cache->ops->get_touch(g->cg);   /* the copy's last use: the cache's LRU order */
    char mkey[AK_AGENT_ID_MAX + 32];
    key_of(g->kind, g->id, "m", mkey, sizeof mkey);
    ak_error e = {{0}};
    conn *cn = conn_get(g->r, &e);
    if (!cn) return;
    redisReply *rp = cmds(g->r, cn, &e, "EVAL", TOUCH_LUA, "1", mkey, g->gen, (char *)NULL);
    if (rp) freeReplyObject(rp);
    conn_put(g->r, cn);
}

static void redis_get_close(ak_blob_get *g) {
    if (!g) return;
    if (g->cput) {
        g->ahead = 0;   /* the chunks still missing: typically only the header's */
        cache_finish(g);
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

/* ---------------------------------------------------------- names, scan */

/* Calls f(ud, key) for every key matching pattern (SCAN, bounded). */
static int scan(redis_backend *r, const char *pattern, int (*f)(void *ud, const char *key), void *ud, ak_error *err) {
    conn *cn = conn_get(r, err);
    if (!cn) return -1;
    char cursor[32] = "0";
    int rc = 0;
    for (int round = 0; round < SCAN_MAX_ROUNDS; round++) {
        redisReply *rp = cmds(r, cn, err, "SCAN", cursor, "MATCH", pattern, "COUNT", "1000", (char *)NULL);
        if (!rp) { rc = -1; break; }
        if (rp->type != REDIS_REPLY_ARRAY || rp->elements != 2 || rp->element[0]->type != REDIS_REPLY_STRING) {
            freeReplyObject(rp);
            rc = ak_failc(err, AK_ERR_IO, "redis %s:%d: SCAN: unexpected reply", r->host, r->port);
            break;
        }
        snprintf(cursor, sizeof cursor, "%s", rp->element[0]->str);
        const redisReply *keys = rp->element[1];
        for (size_t i = 0; rc == 0 && i < keys->elements; i++)
            if (keys->element[i]->type == REDIS_REPLY_STRING && f(ud, keys->element[i]->str) != 0)
                rc = ak_failc(err, AK_ERR_NOMEM, "out of memory");
        freeReplyObject(rp);
        if (rc || !strcmp(cursor, "0")) break;
    }
    conn_put(r, cn);
    return rc;
}

typedef struct {
    char **keys;
    int n, cap;
} keylist;

static int collect(void *ud, const char *key) {
    keylist *l = ud;
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 64;
        char **nk = realloc(l->keys, sizeof *nk * (size_t)nc);
        if (!nk) return -1;
        l->keys = nk;
        l->cap = nc;
    }
    if (!(l->keys[l->n] = strdup(key))) return -1;
    l->n++;
    return 0;
}

static void keylist_free(keylist *l) {
    for (int i = 0; i < l->n; i++) free(l->keys[i]);
    free(l->keys);
}

static int redis_list(ak_store_backend *b, int kind, ak_blob_name **out, int *n, ak_error *err) {
    redis_backend *r = (redis_backend *)b;
    char pattern[32];
    snprintf(pattern, sizeof pattern, "akv:{%c:*}:m", kind_letter[kind]);
    keylist l = {0};
    *out = NULL;
    *n = 0;
    if (scan(r, pattern, collect, &l, err) != 0) {
        keylist_free(&l);
        return -1;
    }
    ak_blob_name *es = calloc((size_t)(l.n ? l.n : 1), sizeof *es);
    conn *cn = es ? conn_get(r, err) : NULL;
    if (!es || !cn) {
        if (!es) ak_failc(err, AK_ERR_NOMEM, "out of memory");
        free(es);
        keylist_free(&l);
        return -1;
    }
    int cnt = 0, rc = 0;
    for (int i = 0; i < l.n; i++) {
        /* the id between "akv:{k:" and "}:m" */
        size_t kl = strlen(l.keys[i]);
        if (kl < 10 || kl - 10 > AK_AGENT_ID_MAX) continue;
        char id[AK_AGENT_ID_MAX + 1];
        memcpy(id, l.keys[i] + 7, kl - 10);
        id[kl - 10] = 0;
        if (!ak_agent_id_valid(id)) continue;
        redisReply *rp = cmds(r, cn, err, "HMGET", l.keys[i], "bytes", "mtime", (char *)NULL);
        if (!rp) { rc = -1; break; }
        if (rp->type == REDIS_REPLY_ARRAY && rp->elements == 2 && rp->element[0]->type == REDIS_REPLY_STRING) {
            snprintf(es[cnt].id, sizeof es[cnt].id, "%s", id);
            es[cnt].info.bytes = strtoull(rp->element[0]->str, NULL, 10);
            parse_mtime(rp->element[1]->type == REDIS_REPLY_STRING ? rp->element[1]->str : NULL, &es[cnt].info.mtime,
                        &es[cnt].info.mtime_ns);
            cnt++;
        }
        freeReplyObject(rp);
    }
    conn_put(r, cn);
    keylist_free(&l);
    if (rc) {
        free(es);
        return -1;
    }
    *out = es;
    *n = cnt;
    return 0;
}

/* Deletes a manifest and its chunks (KEYS[1]; ARGV[1] the chunk prefix).
 * Returns 0 if there was none. */
static const char REMOVE_LUA[] =
    "local g = redis.call('HGET', KEYS[1], 'gen')\n"
    "local n = redis.call('HGET', KEYS[1], 'n')\n"
    "if not g then return redis.call('DEL', KEYS[1]) end\n"
    "for i = 0, tonumber(n) - 1 do redis.call('DEL', ARGV[1] .. g .. ':' .. i) end\n"
    "return redis.call('DEL', KEYS[1])\n";

static int redis_remove(ak_store_backend *b, int kind, const char *id, ak_error *err) {
    redis_backend *r = (redis_backend *)b;
    char mkey[AK_AGENT_ID_MAX + 32], prefix[AK_AGENT_ID_MAX + 32];
    key_of(kind, id, "m", mkey, sizeof mkey);
    key_of(kind, id, "c:", prefix, sizeof prefix);
    conn *cn = conn_get(r, err);
    if (!cn) return -1;
    redisReply *rp = cmds(r, cn, err, "EVAL", REMOVE_LUA, "1", mkey, prefix, (char *)NULL);
    conn_put(r, cn);
    if (!rp) return -1;
    int gone = rp->type == REDIS_REPLY_INTEGER && rp->integer == 0;
    freeReplyObject(rp);
    return gone ? 1 : 0;
}

/* ------------------------------------------------------------ quarantine */

/* KEYS[1] manifest, KEYS[2] the quarantine key; ARGV[1] the generation the
 * reader opened ("" any). 0 none, -1 replaced, -2 name taken, 1 moved. */
static const char QUARANTINE_LUA[] =
    "local g = redis.call('HGET', KEYS[1], 'gen')\n"
    "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end\n"
    "if ARGV[1] ~= '' and g ~= ARGV[1] then return -1 end\n"
    "if redis.call('EXISTS', KEYS[2]) == 1 then return -2 end\n"
    "redis.call('RENAME', KEYS[1], KEYS[2])\n"
    "local t = redis.call('TIME')\n"
    "redis.call('HSET', KEYS[2], 'qtime', t[1] .. '.' .. t[2])\n"
    "return 1\n";

static int redis_quarantine(ak_store_backend *b, int kind, const char *id, ak_blob_get *g, const char *prefix,
                            const char *reason, ak_blob_qname *q, char *where, size_t wn, char *why, size_t whyn) {
    redis_backend *r = (redis_backend *)b;
    char mkey[AK_AGENT_ID_MAX + 32];
    key_of(kind, id, "m", mkey, sizeof mkey);
    ak_error e = {{0}};
    conn *cn = conn_get(r, &e);
    if (!cn) {
        snprintf(why, whyn, "%s", e.msg);
        return -1;
    }
    long now = (long)time(NULL);
    int rc = -1;
    snprintf(why, whyn, "no free name");
    for (int k = 0; k < 100; k++) {
        char rest[80], qkey[AK_AGENT_ID_MAX + 128];
        if (k) snprintf(rest, sizeof rest, "q:%s.%ld.%d", reason, now, k);
        else snprintf(rest, sizeof rest, "q:%s.%ld", reason, now);
        key_of(kind, id, rest, qkey, sizeof qkey);
        redisReply *rp = cmds(r, cn, &e, "EVAL", QUARANTINE_LUA, "2", mkey, qkey, g ? g->gen : "", (char *)NULL);
        if (!rp) {
            snprintf(why, whyn, "%s", e.msg);
            break;
        }
        long long x = rp->type == REDIS_REPLY_INTEGER ? rp->integer : -3;
        freeReplyObject(rp);
        if (x == -2) continue;
        if (x == 0) rc = g ? -1 : 1;
        if (x == 0 && g) snprintf(why, whyn, "the image was removed meanwhile");
        if (x == -1) snprintf(why, whyn, "the image was replaced meanwhile; the new one was left in place");
        if (x == -3) snprintf(why, whyn, "unexpected reply");
        if (x == 1) {
            rc = 0;
            memset(q, 0, sizeof *q);
            snprintf(q->name, sizeof q->name, "%s", qkey);
            q->bytes = g ? g->bytes : 0;
            q->t = now;
            snprintf(where, wn, "%s %s", r->url, qkey);
        }
        break;
    }
    conn_put(r, cn);
    (void)prefix;   /* the kind is in the key */
    return rc;
}

static int redis_quarantine_list(ak_store_backend *b, ak_blob_qname **out, int *n, ak_error *err) {
    redis_backend *r = (redis_backend *)b;
    keylist l = {0};
    *out = NULL;
    *n = 0;
    if (scan(r, "akv:{*}:q:*", collect, &l, err) != 0) {
        keylist_free(&l);
        return -1;
    }
    ak_blob_qname *qs = calloc((size_t)(l.n ? l.n : 1), sizeof *qs);
    conn *cn = qs ? conn_get(r, err) : NULL;
    int cnt = 0;
    for (int i = 0; cn && i < l.n; i++) {
        if (strlen(l.keys[i]) >= sizeof qs->name) continue;
        redisReply *rp = cmds(r, cn, err, "HMGET", l.keys[i], "bytes", "qtime", (char *)NULL);
        if (!rp) break;
        if (rp->type == REDIS_REPLY_ARRAY && rp->elements == 2) {
            snprintf(qs[cnt].name, sizeof qs[cnt].name, "%s", l.keys[i]);
            if (rp->element[0]->type == REDIS_REPLY_STRING) qs[cnt].bytes = strtoull(rp->element[0]->str, NULL, 10);
            parse_mtime(rp->element[1]->type == REDIS_REPLY_STRING ? rp->element[1]->str : NULL, &qs[cnt].t, &qs[cnt].tn);
            cnt++;
        }
        freeReplyObject(rp);
    }
    if (cn) conn_put(r, cn);
    keylist_free(&l);
    if (!qs) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    *out = qs;
    *n = cnt;
    return 0;
}

static void redis_quarantine_drop(ak_store_backend *b, const char *name) {
    redis_backend *r = (redis_backend *)b;
    /* the chunks' prefix: the key up to and including "}:", then "c:" */
    const char *close = strstr(name, "}:q:");
    if (!close) return;
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%.*sc:", (int)(close - name + 2), name);
    ak_error e = {{0}};
    conn *cn = conn_get(r, &e);
    if (!cn) return;
    redisReply *rp = cmds(r, cn, &e, "EVAL", REMOVE_LUA, "1", name, prefix, (char *)NULL);
    if (rp) freeReplyObject(rp);
    conn_put(r, cn);
}

/* ------------------------------------------------- the cache's copies */

int ak_backend_cache_list(ak_store_backend *b, ak_blob_name **out, int *n, ak_error *err) {
    *out = NULL;
    *n = 0;
    if (b->ops != &redis_ops || !((redis_backend *)b)->cache) return 0;
    ak_store_backend *c = ((redis_backend *)b)->cache;
    return c->ops->list(c, AK_FILE_AGENT, out, n, err);
}

void ak_backend_cache_drop(ak_store_backend *b, const char *name) {
    if (b->ops != &redis_ops || !((redis_backend *)b)->cache) return;
    ak_store_backend *c = ((redis_backend *)b)->cache;
    ak_error e = {{0}};
    c->ops->remove(c, AK_FILE_AGENT, name, &e);
}

void ak_backend_cache_room(ak_store_backend *b, int64_t room) {
    if (b->ops != &redis_ops) return;
    redis_backend *r = (redis_backend *)b;
    pthread_mutex_lock(&r->mu);
    r->cache_room = room;
    pthread_mutex_unlock(&r->mu);
}

/* ----------------------------------------------------------------- leases */

static const char RENEW_LUA[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end\n"
    "return 0\n";
static const char RELEASE_LUA[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end\n"
    "return 0\n";

static void lease_log(redis_backend *r, const char *fmt, const char *id, const char *what) {
    char line[400];
    snprintf(line, sizeof line, fmt, id, what);
    if (r->log) r->log(r->log_ud, line);
    else fprintf(stderr, "%s\n", line);
}

/* Drops lease i from the table. Call with r->mu held. */
static void lease_drop(redis_backend *r, int i) {
    memmove(r->leases + i, r->leases + i + 1, sizeof *r->leases * (size_t)(r->n_leases - i - 1));
    r->n_leases--;
}

/* The renewal thread ("ak-lease"): each third of the lease time renews
 * the leases in use, releases the idle ones, and drops (and logs) those
 * found lost. Ends when the backend closes (joined there). */
static void *lease_main(void *arg) {
    redis_backend *r = arg;
    pthread_setname_np(pthread_self(), "ak-lease");
    pthread_mutex_lock(&r->mu);
    while (!r->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = (long long)ts.tv_nsec + (long long)(r->lease_ms / 3) * 1000000LL;
        ts.tv_sec += (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        pthread_cond_timedwait(&r->lease_cv, &r->mu, &ts);
        if (r->stopping) break;
        int n = r->n_leases;
        lease *copy = n ? malloc(sizeof *copy * (size_t)n) : NULL;
        if (copy) memcpy(copy, r->leases, sizeof *copy * (size_t)n);
        pthread_mutex_unlock(&r->mu);
        double now = ak_now();
        for (int i = 0; copy && i < n; i++) {
            ak_error e = {{0}};
            conn *cn = conn_get(r, &e);
            if (!cn) break;   /* Redis away: the leases expire, and writes are refused (fenced) */
            char key[AK_AGENT_ID_MAX + 32], ms[24];
            key_of(AK_FILE_AGENT, copy[i].id, "lease", key, sizeof key);
            snprintf(ms, sizeof ms, "%d", r->lease_ms);
            int idle = (now - copy[i].last_used) * 1e3 > r->lease_ms;
            redisReply *rp = idle ? cmds(r, cn, &e, "EVAL", RELEASE_LUA, "1", key, copy[i].token, (char *)NULL)
                                  : cmds(r, cn, &e, "EVAL", RENEW_LUA, "1", key, copy[i].token, ms, (char *)NULL);
            int held = rp && rp->type == REDIS_REPLY_INTEGER && rp->integer == 1;
            if (rp) freeReplyObject(rp);
            conn_put(r, cn);
            if (!rp) continue;   /* undecided: tried again next round */
            pthread_mutex_lock(&r->mu);
            for (int j = 0; j < r->n_leases; j++)
                if (!strcmp(r->leases[j].id, copy[i].id) && !strcmp(r->leases[j].token, copy[i].token)) {
                    /* used again since the copy: kept for the next round */
                    if (idle && r->leases[j].last_used > copy[i].last_used) break;
                    if (!idle && !held)
                        lease_log(r, "store: redis: lost the lease on agent %s%s; this node stops writing it",
                                  copy[i].id, "");
                    if (idle || !held) lease_drop(r, j);
                    break;
                }
            pthread_mutex_unlock(&r->mu);
        }
        free(copy);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int ak_backend_lease_hold(ak_store_backend *b, const char *id, ak_error *err) {
    if (b->ops != &redis_ops) return 0;   /* one node owns a directory */
    redis_backend *r = (redis_backend *)b;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n_leases; i++)
        if (!strcmp(r->leases[i].id, id)) {
            r->leases[i].last_used = ak_now();
            pthread_mutex_unlock(&r->mu);
            return 0;
        }
    pthread_mutex_unlock(&r->mu);
    lease l;
    memset(&l, 0, sizeof l);
    snprintf(l.id, sizeof l.id, "%s", id);
    uint8_t t[16];
    randombytes_buf(t, sizeof t);
    for (int i = 0; i < 16; i++) snprintf(l.token + 2 * i, 3, "%02x", t[i]);
    char key[AK_AGENT_ID_MAX + 32], ms[24];
    key_of(AK_FILE_AGENT, id, "lease", key, sizeof key);
    snprintf(ms, sizeof ms, "%d", r->lease_ms);
    conn *cn = conn_get(r, err);
    if (!cn) return -1;
    redisReply *rp = cmds(r, cn, err, "SET", key, l.token, "NX", "PX", ms, (char *)NULL);
    conn_put(r, cn);
    if (!rp) return -1;
    int got = rp->type == REDIS_REPLY_STATUS;
    freeReplyObject(rp);
    if (!got) {
        ak_failc(err, AK_ERR_BUSY, "agent %s: its lease is held by another node", id);
        return 1;
    }
    l.last_used = ak_now();
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    if (r->n_leases == r->cap_leases) {
        int nc = r->cap_leases ? r->cap_leases * 2 : 16;
        lease *nl = realloc(r->leases, sizeof *nl * (size_t)nc);
        if (nl) {
            r->leases = nl;
            r->cap_leases = nc;
        }
    }
    if (r->n_leases < r->cap_leases) r->leases[r->n_leases++] = l;
    else rc = ak_failc(err, AK_ERR_NOMEM, "out of memory");
    if (!rc && !r->lease_thread_on && pthread_create(&r->lease_thread, NULL, lease_main, r) == 0) r->lease_thread_on = 1;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int ak_backend_lease_held(ak_store_backend *b, const char *id) {
    if (b->ops != &redis_ops) return 1;
    redis_backend *r = (redis_backend *)b;
    char tok[33];
    lease_token(r, AK_FILE_AGENT, id, tok);
    return tok[0] != 0;
}

static const ak_backend_ops redis_ops = {
    "redis", redis_close, redis_where,
    redis_put_begin, redis_put_write, redis_put_commit, redis_put_abort,
    redis_get_open, redis_get_read, redis_get_readv, redis_get_prefetch, redis_get_touch, redis_get_close,
    redis_list, redis_remove,
    redis_quarantine, redis_quarantine_list, redis_quarantine_drop,
    redis_put_head,
};
