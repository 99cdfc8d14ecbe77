/* store_backend.h - the byte backend under the store (not an API).
 *
 * The store (store.h) keeps images: an agent, pool, memory or card file's
 * bytes (store_codec.h: the safetensors image, or its seal; a card's:
 * store_card.c). Where those bytes live is a backend's business, behind
 * this table of operations:
 *   store_dir.c    a local directory (the embedded default): one file per
 *                  image, written as temp + fsync + rename + directory fsync;
 *   store_redis.c  a Redis server (hiredis): one value per image, large
 *                  images split into chunks under a manifest written last
 *                  (its files: store_redis_impl.h).
 * Everything above the backend (the codec, the save and load paths, the
 * index, gc, quarantine bookkeeping) is the same for both.
 *
 * THE OPERATIONS (ak_backend_ops, each described there; "-" where the
 * directory backend has none: NULL in its table):
 *   close, where                       the backend itself
 *   put_begin, put_write, put_commit,  writing an image (the directory's
 *   put_abort, put_head (dir: -)       puts also take ak_backend_dir_put_at)
 *   get_open, get_read, get_readv,     reading one
 *   get_prefetch, get_touch, get_close
 *   list, remove                       the images of a kind
 *   quarantine, quarantine_list,       images moved aside
 *   quarantine_drop
 *   cache_list, cache_drop,            the read-through cache's copies
 *   cache_room (dir: -)                (Redis with a local directory)
 *   lease_hold, lease_held (dir: -)    which node serves an agent
 * Callers reach the last five through ak_backend_cache_* and
 * ak_backend_lease_* below, which give a backend without them its
 * behaviour: no copies, and every lease held (one node owns a directory).
 *
 * What every backend promises:
 *   - put is atomic: between put_begin and put_commit nothing a reader can
 *     open changes; after a commit returning 0 or 1 readers see the new
 *     image whole; after a failure (or put_abort, or the process dying at
 *     any point) they see the previous image whole, or none if there was
 *     none. Leftovers of a dead writer are removed by the backend (at open,
 *     or by gc) and are never listed.
 *   - get returns exactly the bytes a committed put wrote (the backend
 *     verifies what it can: a truncated or torn value is reported as such;
 *     the codec then checks every byte against its checksums).
 *   - ids are ak_agent_id_valid ids (base/ids.h); kind is AK_FILE_AGENT,
 *     _POOL, _MEMORY or _CARD (store_impl.h): the same id of two kinds is
 *     two values.
 *   - every operation may be called from any thread, concurrently, except
 *     that a put or get handle is used by one thread at a time (get_readv
 *     may run on two threads at once on one handle: the restore's worker).
 * Errors: functions returning int give 0 on success and -1 with err set
 * (code from errno: ak_err_code_of_errno; the message names the operation
 * and the path or key, e.g. "write /dir/.a.safetensors.tmp.1.2: No space
 * left on device") unless said otherwise; the caller adds the context.
 */
#ifndef AK_STORE_BACKEND_H
#define AK_STORE_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "store/store.h"
#include "base/util.h"

/* Size and last-use time of a stored image. */
typedef struct {
    uint64_t bytes;
    int64_t mtime, mtime_ns;   /* unix time of the last put or touch */
} ak_blob_info;

/* One listed image. */
typedef struct {
    char id[AK_AGENT_ID_MAX + 1];
    ak_blob_info info;
} ak_blob_name;

/* One quarantined image (quarantine_list). */
typedef struct {
    char name[256];            /* the backend's name for it (a file name in quarantine/, a key's tail) */
    uint64_t bytes;
    int64_t t, tn;             /* when it was moved there */
} ak_blob_qname;

typedef struct ak_store_backend ak_store_backend;
typedef struct ak_blob_put ak_blob_put;   /* a put in flight */
typedef struct ak_blob_get ak_blob_get;   /* an open image */

/* An image to move to quarantine, and where to say what became of it (the
 * backend's quarantine operation; ak_store_quarantine_kind). */
typedef struct {
    int kind;                  /* AK_FILE_* */
    const char *id;
    ak_blob_get *g;            /* not NULL: only if the image is still the one g opened */
    const char *reason;        /* a short word for the new name */
    char *where;               /* out: the new place (a path or key), for messages; wn bytes */
    size_t wn;
    char *why;                 /* out: why it was not moved; whyn bytes */
    size_t whyn;
} ak_quarantine_args;

typedef struct {
    const char *name;   /* "dir", "redis" */
    /* Frees the backend (no handle may be open). */
    void (*close)(ak_store_backend *b);
    /* Where the image of (kind, id) lives, for messages: a path or a
     * redis://host:port/db key. Returns 0, or -1 if it does not fit n. */
    int (*where)(const ak_store_backend *b, int kind, const char *id, char *out, size_t n);

    /* PUT. put_begin starts writing an image of exactly total bytes;
     * put_write appends the next n bytes (the caller writes them all, in
     * order); put_commit makes the image the one readers get and frees p:
     * returns 0; -1 with err set if it failed (the previous image is intact);
     * 1 with err set if the image is in place but a durability step after it
     * failed (the directory's fsync). info gets the new image's size and
     * time. put_abort drops a put (nothing changes) and frees p. A failed
     * put_write leaves p to be aborted. */
    ak_blob_put *(*put_begin)(ak_store_backend *b, int kind, const char *id, uint64_t total, ak_error *err);
    int (*put_write)(ak_blob_put *p, const uint8_t *data, size_t n, ak_error *err);
    int (*put_commit)(ak_blob_put *p, ak_blob_info *info, ak_error *err);
    void (*put_abort)(ak_blob_put *p);

    /* GET. get_open opens the current image of (kind, id): returns 0 with
     * *g and *info set; 1 if there is none; 2 with why set if what is there
     * cannot be an image (not a regular file, a manifest that does not
     * parse, a chunk missing: the caller judges it CORRUPT); -1 with err set
     * on an error (unreachable, out of memory). The handle keeps reading the
     * image it opened even if a put replaces it meanwhile (a file's inode; a
     * Redis image's chunks are read at open). */
    int (*get_open)(ak_store_backend *b, int kind, const char *id, ak_blob_get **g, ak_blob_info *info,
                    char *why, size_t whyn, ak_error *err);
    /* Reads n bytes at off into dst: 0; -1 with errno set; -2 if the image
     * ends before off + n (it shrank under a reader of a file). */
    int (*get_read)(ak_blob_get *g, uint8_t *dst, size_t n, uint64_t off);
    /* As preadv(2): reads the iovecs' bytes, back to back from off; returns
     * bytes read (short at the end), or -1 with errno set. */
    ssize_t (*get_readv)(ak_blob_get *g, const struct iovec *iov, int cnt, uint64_t off);
    /* Hints that [off, off + len) (len 0: to the end) will be read soon, if
     * byte at_end is not at hand already. May be NULL. */
    void (*get_prefetch)(ak_blob_get *g, uint64_t at_end, const uint64_t *off, const uint64_t *len, int n);
    /* Marks the open image as used now (LRU time for gc); best effort. */
    void (*get_touch)(ak_blob_get *g);
    void (*get_close)(ak_blob_get *g);

    /* Every image of kind with its size and time, unsorted, into *out
     * (malloc'd; *n entries). A kind never written lists as empty. */
    int (*list)(ak_store_backend *b, int kind, ak_blob_name **out, int *n, ak_error *err);
    /* Deletes the image of (kind, id): 0; 1 if there was none; -1. */
    int (*remove)(ak_store_backend *b, int kind, const char *id, ak_error *err);

    /* QUARANTINE. Moves the image of (a->kind, a->id) aside under a new
     * name (prefix, the id, a->reason, the time: unique): if a->g is not
     * NULL only if the image is still the one a->g opened (else -1,
     * "replaced meanwhile"). Returns 0 with q (name, bytes, time) and
     * a->where set; 1 if there is no image; -1 with a->why set. */
    int (*quarantine)(ak_store_backend *b, const ak_quarantine_args *a, const char *prefix, ak_blob_qname *q);
    /* The quarantined images, unsorted (malloc'd). */
    int (*quarantine_list)(ak_store_backend *b, ak_blob_qname **out, int *n, ak_error *err);
    /* Deletes quarantined image name (gone already is fine). */
    void (*quarantine_drop)(ak_store_backend *b, const char *name);

    /* Says, before its first put_write, that the image's first n bytes are
     * its header (what a listing reads): the backend may keep a copy where
     * get_open finds it, so opening and listing read no image bytes
     * (Redis: the manifest's head field). May be NULL. */
    void (*put_head)(ak_blob_put *p, uint64_t n);

    /* THE READ-THROUGH CACHE's copies (NULL: the backend keeps none; see
     * ak_backend_cache_list). */
    int (*cache_list)(ak_store_backend *b, ak_blob_name **out, int *n, ak_error *err);
    void (*cache_drop)(ak_store_backend *b, const char *name);
    void (*cache_room)(ak_store_backend *b, int64_t room);
    /* LEASES (NULL: one node's backend, every lease held; see
     * ak_backend_lease_hold). */
    int (*lease_hold)(ak_store_backend *b, const char *id, ak_error *err);
    int (*lease_held)(ak_store_backend *b, const char *id);
} ak_backend_ops;

/* Every backend's state starts with this. */
struct ak_store_backend {
    const ak_backend_ops *ops;
};

/* The directory backend (store_dir.c): opens dir (creating it and its
 * parents, mode 0700), removes temp files of dead saves; in test builds
 * (AK_FAULT_INJECTION) reads the fault variables (store_dir.c). NULL with
 * err set on failure. */
ak_store_backend *ak_backend_dir_open(const char *dir, ak_error *err);
/* A directory backend for files other than the store's images (rstore.c's
 * records): kind AK_FILE_AGENT only, each image <dir>/<id><suffix> (suffix:
 * '.' and 1 to 14 of [a-z0-9], not AK_STORE_SUFFIX), written, read,
 * listed, removed and quarantined (quarantine/<id><suffix>.<reason>.<time>)
 * as ak_backend_dir_open's, with the same temp file clean-up at open and,
 * in test builds, the same fault injection. NULL with err set on failure. */
ak_store_backend *ak_backend_dir_open_suffix(const char *dir, const char *suffix, ak_error *err);

/* Writes n bytes at off into a put of the directory backend (pwrite: any
 * order, from several threads at once) instead of put_write; the caller
 * writes every byte of the announced total before put_commit (nothing
 * checks it here). 0, or -1 with err set. The Redis backend's cache writes
 * chunks as they arrive with it. */
int ak_backend_dir_put_at(ak_blob_put *p, const uint8_t *data, size_t n, uint64_t off, ak_error *err);

/* The Redis backend (store_redis.c): url redis://host:port[/db], password
 * (NULL: no AUTH), lease_ms (<= 0: AK_STORE_LEASE_MS) the lease time;
 * cache_dir (NULL: none) a local directory kept as a read-through cache;
 * log (NULL: stderr) gets the lines a lost lease or a fenced write says.
 * Connects once to check Redis is reachable. NULL with err set. */
ak_store_backend *ak_backend_redis_open(const char *url, const char *password, int lease_ms, const char *cache_dir,
                                        void (*log)(void *ud, const char *line), void *log_ud, ak_error *err);
#define AK_STORE_LEASE_MS 10000

/* THE READ-THROUGH CACHE's copies (the backend's cache_* operations; a
 * backend without them has none): cache_list lists them (name, size, last
 * use: the LRU time a load from the copy renews) as list does; cache_drop
 * deletes one; cache_room bounds the bytes they may take (< 0: no bound,
 * the default): each new copy then deletes the least recently used ones
 * beyond it. The store's gc counts them in the disk budget (store.c:
 * ak_store_gc). */
static inline int ak_backend_cache_list(ak_store_backend *b, ak_blob_name **out, int *n, ak_error *err) {
    if (b->ops->cache_list) return b->ops->cache_list(b, out, n, err);
    *out = NULL;
    *n = 0;
    return 0;
}
static inline void ak_backend_cache_drop(ak_store_backend *b, const char *name) {
    if (b->ops->cache_drop) b->ops->cache_drop(b, name);
}
static inline void ak_backend_cache_room(ak_store_backend *b, int64_t room) {
    if (b->ops->cache_room) b->ops->cache_room(b, room);
}

/* LEASES (the backend's lease_* operations; a backend without them is one
 * node's: always held). lease_hold takes agent id's lease for this node (or
 * notes it used, if held): 0; 1 with err set (AK_ERR_BUSY) if another node
 * holds it; -1 if Redis cannot be asked. A held lease is renewed while used
 * (every third of the lease time) and released once unused for a lease
 * time. lease_held: 1 if this node holds it. */
static inline int ak_backend_lease_hold(ak_store_backend *b, const char *id, ak_error *err) {
    return b->ops->lease_hold ? b->ops->lease_hold(b, id, err) : 0;
}
static inline int ak_backend_lease_held(ak_store_backend *b, const char *id) {
    return b->ops->lease_held ? b->ops->lease_held(b, id) : 1;
}

#endif
