/* store_redis_impl.h - internals shared by the Redis backend's files (not
 * an API): the backend's state, its put and get handles, the key layout,
 * and the functions one file calls in another.
 *   store_redis.c        connections and commands, open and close, the
 *                        table of operations; the keys and the protocol
 *                        (its top comment)
 *   store_redis_put.c    the blob store's writes: chunks, then the manifest
 *   store_redis_get.c    the blob store's reads: the manifest, chunks on
 *                        demand into a few reused buffers, each verified
 *   store_redis_cache.c  the read-through cache (a local directory's copies)
 *   store_redis_index.c  listing, removing and quarantining images
 *   store_redis_lease.c  leases: take, renew, release, fencing
 */
#ifndef AK_STORE_REDIS_IMPL_H
#define AK_STORE_REDIS_IMPL_H

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <sys/uio.h>

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

/* The letter of a kind in its keys: a (agent), p (pool), m (memory), c
 * (card). */
static inline char kind_letter(int kind) { return "apmc"[kind]; }

/* "akv:{<k>:<id>}:<rest>" into out. */
static inline void key_of(int kind, const char *id, const char *rest, char *out, size_t n) {
    snprintf(out, n, "akv:{%c:%s}:%s", kind_letter(kind), id, rest);
}

/* Bytes of chunk c of the image g opened. */
static inline uint64_t chunk_len(const ak_blob_get *g, int c) {
    uint64_t off = (uint64_t)c * g->chunk;
    return c == g->n - 1 ? g->bytes - off : g->chunk;
}

/* CONNECTIONS (store_redis.c). conn_get: an idle connection, or a new one
 * (connect, AUTH, SELECT); NULL with err set if Redis cannot be reached.
 * conn_put: returns it to the pool, or frees it if it failed (its state is
 * unknown) or the pool is full. cmd runs a command (argv form, binary
 * safe): the reply, or NULL with err set (a connection error, or an error
 * reply: AK_ERR_BUSY if it names a LEASE, else AK_ERR_IO; a connection
 * error marks cn failed). cmds: cmd with string arguments, NULL-terminated. */
conn *ak_redis_conn_get(redis_backend *r, ak_error *err);
void ak_redis_conn_put(redis_backend *r, conn *cn);
redisReply *ak_redis_cmd(redis_backend *r, conn *cn, ak_error *err, int argc, const char **argv, const size_t *len);
redisReply *ak_redis_cmds(redis_backend *r, conn *cn, ak_error *err, ...);
/* Says line through the backend's log (stderr without one). */
void ak_redis_log(redis_backend *r, const char *line);
/* "sec.usec" (Redis TIME; NULL: 0) into sec and nsec. */
void ak_redis_parse_mtime(const char *s, int64_t *sec, int64_t *ns);

/* PUT (store_redis_put.c): the backend operations of store_backend.h. */
ak_blob_put *ak_redis_put_begin(ak_store_backend *b, int kind, const char *id, uint64_t total, ak_error *err);
int ak_redis_put_write(ak_blob_put *p, const uint8_t *data, size_t n, ak_error *err);
int ak_redis_put_commit(ak_blob_put *p, ak_blob_info *info, ak_error *err);
void ak_redis_put_abort(ak_blob_put *p);
void ak_redis_put_head(ak_blob_put *p, uint64_t n);

/* GET (store_redis_get.c): the backend operations of store_backend.h. */
int ak_redis_get_open(ak_store_backend *b, int kind, const char *id, ak_blob_get **out, ak_blob_info *info,
                      char *why, size_t whyn, ak_error *err);
int ak_redis_get_read(ak_blob_get *g, uint8_t *dst, size_t n, uint64_t off);
ssize_t ak_redis_get_readv(ak_blob_get *g, const struct iovec *iov, int cnt, uint64_t off);
void ak_redis_get_prefetch(ak_blob_get *g, uint64_t at_end, const uint64_t *off, const uint64_t *len, int n);
void ak_redis_get_touch(ak_blob_get *g);
void ak_redis_get_close(ak_blob_get *g);
/* The slot holding chunk c, checked, with a reference held
 * (ak_redis_chunk_release drops it after used bytes of it were delivered):
 * fetched if no slot has it, and while a restore reads the image
 * (g->ahead) the next chunks with it. NULL with errno set on failure. */
slot *ak_redis_chunk_hold(ak_blob_get *g, int c);
void ak_redis_chunk_release(ak_blob_get *g, slot *s, uint64_t used);

/* THE READ-THROUGH CACHE (store_redis_cache.c; every function does
 * nothing without one). cache_open: opens the copy of g's generation if
 * the cache holds one of the right size (a wrong one is deleted).
 * cache_chunk: chunk c into s from the copy, checked against its sum: 1;
 * 0 if there is no sound copy (a damaged one is deleted, and Redis read
 * from then on). cache_put_chunk: writes verified chunk c to the copy
 * being made, once. cache_begin: starts the copy of the image a restore
 * reads (none is made if one is open or begun). cache_finish: completes
 * it at close (the chunks not read fetched now), drops the copies of other
 * generations and commits it, or drops it if anything failed; best
 * effort. The operations cache_list, cache_drop, cache_room are
 * store_backend.h's. */
void ak_redis_cache_open(ak_blob_get *g);
int ak_redis_cache_chunk(ak_blob_get *g, int c, slot *s);
void ak_redis_cache_put_chunk(ak_blob_get *g, int c, const uint8_t *data, uint64_t len);
void ak_redis_cache_begin(ak_blob_get *g);
void ak_redis_cache_finish(ak_blob_get *g);
int ak_redis_cache_list(ak_store_backend *b, ak_blob_name **out, int *n, ak_error *err);
void ak_redis_cache_drop(ak_store_backend *b, const char *name);
void ak_redis_cache_room(ak_store_backend *b, int64_t room);

/* NAMES (store_redis_index.c): the backend operations of store_backend.h. */
int ak_redis_list(ak_store_backend *b, int kind, ak_blob_name **out, int *n, ak_error *err);
int ak_redis_remove(ak_store_backend *b, int kind, const char *id, ak_error *err);
int ak_redis_quarantine(ak_store_backend *b, const ak_quarantine_args *a, const char *prefix, ak_blob_qname *q);
int ak_redis_quarantine_list(ak_store_backend *b, ak_blob_qname **out, int *n, ak_error *err);
void ak_redis_quarantine_drop(ak_store_backend *b, const char *name);

/* LEASES (store_redis_lease.c). lease_hold, lease_held: the backend
 * operations of store_backend.h. lease_token: the token of this node's
 * lease on (kind, id) into tok ("" if none held; only agents have leases).
 * lease_lost: this node stops writing agent id (its lease was taken; a
 * later save asks again). lease_stop: at close, joins the renewal thread
 * and releases every lease still held (another node may take the agents at
 * once). */
int ak_redis_lease_hold(ak_store_backend *b, const char *id, ak_error *err);
int ak_redis_lease_held(ak_store_backend *b, const char *id);
void ak_redis_lease_token(redis_backend *r, int kind, const char *id, char tok[33]);
void ak_redis_lease_lost(redis_backend *r, const char *id);
void ak_redis_lease_stop(redis_backend *r);

#endif
