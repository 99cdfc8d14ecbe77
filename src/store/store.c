/* store.c - see store.h. The store above its backend: opening (which
 * backend, the key), the index of what the backend holds (agents, pools,
 * memories, quarantined images; built at open, kept current by this store's
 * saves, loads, removals, quarantine moves and gc), listing, lookup,
 * removal, gc and quarantine. The layers below:
 *   store_codec.c    the image format (specified there), parse and verify
 *   store_snapshot.c sequence -> snapshot and its header
 *   store_save.c     snapshot -> image -> backend put
 *   store_load.c     backend get -> verified image -> sequence
 *   store_backend.h  the byte backend interface; store_dir.c the directory
 *   store_seal.c     sealing (encryption) of images
 *   store_pool.c, store_memory.c, store_card.c   pools, memories, cards
 */
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "store/store_backend.h"
#include "store/store_codec.h"

#define POOL_QPREFIX "pool+"   /* quarantined pools: '+' is in no agent id */
#define MEMORY_QPREFIX "memory+"
#define CARD_QPREFIX "card+"

/* At most this many files stay in quarantine/ (the oldest go first): a
 * directory of corrupt files must not grow without bound. */
#define QUARANTINE_MAX_FILES AK_STORE_QUARANTINE_MAX

static int index_build(ak_store *s, ak_error *err);

int ak_store_read_key(const char *path, uint8_t key[AK_STORE_KEY_BYTES], ak_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ak_failc(err, ak_err_code_of_errno(errno), "key file %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return ak_failc(err, ak_err_code_of_errno(e), "key file %s: %s", path, strerror(e));
    }
    /* as ssh does with private keys: the mode bits decide (not access(),
     * which root would pass), so a key others may read is never used */
    if (sb.st_mode & (S_IRWXG | S_IRWXO)) {
        close(fd);
        return ak_failc(err, AK_ERR_PERMISSION, "key file %s: mode %04o lets group or others access it; it must be "
                        "private to its owner (chmod 600 %s)", path, (unsigned)(sb.st_mode & 07777), path);
    }
    uint8_t buf[AK_STORE_KEY_BYTES + 1];
    size_t n = 0;
    for (;;) {   /* read up to 33 bytes to tell "exactly 32" from "longer" */
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            sodium_memzero(buf, sizeof buf);
            return ak_failc(err, ak_err_code_of_errno(e), "key file %s: %s", path, strerror(e));
        }
        if (r == 0 || (n += (size_t)r) == sizeof buf) break;
    }
    close(fd);
    if (n != AK_STORE_KEY_BYTES) {
        sodium_memzero(buf, sizeof buf);
        return ak_failc(err, AK_ERR_INVALID, "key file %s: must hold exactly %d raw bytes, it has %s%zu", path, AK_STORE_KEY_BYTES,
                       n > AK_STORE_KEY_BYTES ? "more than " : "", n > AK_STORE_KEY_BYTES ? (size_t)AK_STORE_KEY_BYTES : n);
    }
    memcpy(key, buf, AK_STORE_KEY_BYTES);
    sodium_memzero(buf, sizeof buf);
    return 0;
}

/* ------------------------------------------------------------- open/close */

/* Reads a Redis password: the first line of path, which must be private to
 * its owner (as key files). Returns a malloc'd string, or NULL with err set. */
static char *read_password(const char *path, ak_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ak_failc(err, ak_err_code_of_errno(errno), "password file %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (sb.st_mode & (S_IRWXG | S_IRWXO))) {
        close(fd);
        ak_failc(err, AK_ERR_PERMISSION, "password file %s: group or others may access it (or it cannot be read); "
                 "it must be private to its owner (chmod 600 %s)", path, path);
        return NULL;
    }
    char buf[513];
    size_t n = 0;
    while (n < sizeof buf - 1) {
        ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    buf[strcspn(buf, "\r\n")] = 0;
    int empty = !buf[0];
    char *pw = empty ? NULL : strdup(buf);
    sodium_memzero(buf, sizeof buf);
    if (!pw) ak_failc(err, empty ? AK_ERR_INVALID : AK_ERR_NOMEM, "password file %s: %s", path, empty ? "empty" : "out of memory");
    return pw;
}

ak_store *ak_store_open_at(const ak_store_where *w, const uint8_t *key, ak_error *err) {
    const char *dir = w ? w->url : NULL;
    int redis = dir && !strncmp(dir, "redis://", 8);
    if (!dir || !*dir) { ak_failc(err, AK_ERR_INVALID, "store: empty directory name"); return NULL; }
    if (redis) dir = w->local_dir;
    /* room for "/<128-char id>.safetensors.tmp.<pid>.<tid>" after the dir */
    if (dir && strlen(dir) > PATH_MAX - 256) { ak_failc(err, AK_ERR_INVALID, "store: directory name too long"); return NULL; }
    if (ak_seal_init() != 0) { ak_fail(err, "store: libsodium failed to initialize"); return NULL; }
    ak_store *s = ak_calloc(1, sizeof *s, err);
    if (!s) return NULL;
    if (dir) snprintf(s->dir, sizeof s->dir, "%s", dir);
    else { /* Redis without a local directory: a private one (s->dir; every image, cards too, is in Redis) */
        snprintf(s->dir, sizeof s->dir, "%s/agentkv-store-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (!mkdtemp(s->dir)) {
            ak_failc(err, ak_err_code_of_errno(errno), "store: mkdtemp %s: %s", s->dir, strerror(errno));
            free(s);
            return NULL;
        }
        s->tmp_dir = 1;
    }
    size_t n = strlen(s->dir);
    while (n > 1 && s->dir[n - 1] == '/') s->dir[--n] = 0;
    if (n > sizeof s->dir - 256) {   /* a long TMPDIR; a given dir was checked above */
        ak_failc(err, AK_ERR_INVALID, "store: directory name too long (%zu bytes)", n);
        if (s->tmp_dir) rmdir(s->dir);
        free(s);
        return NULL;
    }
    /* memcpy, not snprintf: GCC cannot see the room checked just above */
    memcpy(s->pool_dir, s->dir, n);
    memcpy(s->pool_dir + n, "/pools", sizeof "/pools");
    memcpy(s->mem_dir, s->dir, n);
    memcpy(s->mem_dir + n, "/memories", sizeof "/memories");
    ak_error e = {{0}};
    if (redis) {
        char *pw = NULL;
        if (w->password_file && !(pw = read_password(w->password_file, &e))) {
            ak_failc(err, e.code, "store: %s", e.msg);
            free(s);
            return NULL;
        }
        char cache[PATH_MAX + 16];
        if (w->local_dir) snprintf(cache, sizeof cache, "%s/redis-cache", s->dir);
        s->be = ak_backend_redis_open(w->url, pw, w->lease_ms, w->local_dir ? cache : NULL, w->log, w->log_ud, &e);
        if (pw) sodium_memzero(pw, strlen(pw));
        free(pw);
    } else {
        s->be = ak_backend_dir_open(s->dir, &e);
    }
    if (!s->be) {
        if (e.code == AK_ERR_GENERIC || !e.code) ak_fail(err, "%s", e.msg);   /* a bad fault variable: its own words */
        else if (!strncmp(e.msg, "store: ", 7)) ak_failc(err, e.code, "%s", e.msg);
        else ak_failc(err, e.code, "store: %s", e.msg);
        if (s->tmp_dir) rmdir(s->dir);
        free(s);
        return NULL;
    }
    if (key) {
        s->has_key = 1;
        memcpy(s->key, key, AK_STORE_KEY_BYTES);
        ak_seal_key_id(s->key, s->key_id);
    }
    pthread_mutex_init(&s->mu, NULL);
    if (index_build(s, err) != 0) {
        ak_store_close(s);
        return NULL;
    }
    return s;
}

ak_store *ak_store_open(const char *dir, const uint8_t *key, ak_error *err) {
    if (dir && !strncmp(dir, "redis://", 8)) {   /* a directory path never starts so; ak_store_open_at is explicit */
        ak_failc(err, AK_ERR_INVALID, "store: %s: a Redis store is opened with ak_store_open_at", dir);
        return NULL;
    }
    ak_store_where w = {.url = dir};
    return ak_store_open_at(&w, key, err);
}

int ak_store_remote(const ak_store *s) { return strcmp(s->be->ops->name, "dir") != 0; }

void ak_store_close(ak_store *s) {
    if (!s) return;
    if (s->be) s->be->ops->close(s->be);
    if (s->tmp_dir) { /* the private directory of cards: removed if nothing was left in it */
        char p[PATH_MAX + 16];
        snprintf(p, sizeof p, "%s/cards", s->dir);
        rmdir(p);
        rmdir(s->dir);
    }
    free(s->idx);
    free(s->q);
    ak_entry_index_free(&s->pools);
    ak_entry_index_free(&s->mems);
    ak_store_card_index_free(s);
    pthread_mutex_destroy(&s->mu);
    sodium_memzero(s->key, sizeof s->key);
    free(s);
}

const char *ak_store_dir(const ak_store *s) { return s->dir; }
int ak_store_sealed(const ak_store *s) { return s->has_key; }

/* ------------------------------------------------------------ quarantine */

int ak_store_quarantine_kind(ak_store *s, const ak_quarantine_args *a) {
    const char *pre = a->kind == AK_FILE_POOL ? POOL_QPREFIX : a->kind == AK_FILE_MEMORY ? MEMORY_QPREFIX
                    : a->kind == AK_FILE_CARD ? CARD_QPREFIX : "";
    ak_blob_qname q;
    int rc = s->be->ops->quarantine(s->be, a, pre, &q);
    if (rc != 0) return rc;
    ak_store_index_del(s, a->kind, a->id);
    ak_store_index_quarantined(s, &q);
    return 0;
}

static int reason_ok(const char *r) {
    if (!r || !*r || strlen(r) > 32) return 0;
    for (; *r; r++)
        if (!((*r >= 'a' && *r <= 'z') || (*r >= '0' && *r <= '9') || *r == '-')) return 0;
    return 1;
}


int ak_store_quarantine(ak_store *s, const char *id, const char *reason, ak_error *err) {
    char path[PATH_MAX], dst[PATH_MAX], why[PATH_MAX + 64];
    if (!ak_agent_id_valid(id)) return ak_failc(err, AK_ERR_INVALID, "store: invalid agent id");
    if (!reason_ok(reason)) return ak_failc(err, AK_ERR_INVALID, "store: quarantine reason must be a short [a-z0-9-] word");
    if (s->be->ops->where(s->be, AK_FILE_AGENT, id, path, sizeof path)) return ak_failc(err, AK_ERR_INVALID, "store: path too long");
    int rc = ak_store_quarantine_kind(s, &(ak_quarantine_args){.kind = AK_FILE_AGENT, .id = id, .reason = reason,
                                                               .where = dst, .wn = sizeof dst, .why = why,
                                                               .whyn = sizeof why});
    if (rc < 0) return ak_failc(err, AK_ERR_IO, "store: %s: quarantine: %s", path, why);
    return rc;
}

/* ------------------------------------------------ listing, gc, removal */

static int cmp_entry_id(const void *a, const void *b) {
    return strcmp(((const ak_store_entry *)a)->id, ((const ak_store_entry *)b)->id);
}

static int cmp_entry_age(const void *a, const void *b) {
    const ak_store_entry *x = a, *y = b;
    if (x->mtime != y->mtime) return x->mtime < y->mtime ? -1 : 1;
    if (x->mtime_ns != y->mtime_ns) return x->mtime_ns < y->mtime_ns ? -1 : 1;
    return strcmp(x->id, y->id);
}

int ak_store_list(ak_store *s, ak_store_entry **out, int *n, ak_error *err) {
    pthread_mutex_lock(&s->mu);
    ak_store_entry *es = malloc(sizeof *es * (size_t)(s->n_idx ? s->n_idx : 1));
    if (es && s->n_idx) memcpy(es, s->idx, sizeof *es * (size_t)s->n_idx);
    int k = s->n_idx;
    pthread_mutex_unlock(&s->mu);
    if (!es) return ak_failc(err, AK_ERR_NOMEM, "store: out of memory");
    *out = es;
    *n = k;
    return 0;
}

int ak_store_lookup(ak_store *s, const char *id, ak_store_entry *out) {
    int rc = 1;
    pthread_mutex_lock(&s->mu);
    for (int lo = 0, hi = s->n_idx - 1; lo <= hi;) {
        int mid = (lo + hi) / 2, c = strcmp(s->idx[mid].id, id);
        if (!c) {
            *out = s->idx[mid];
            rc = 0;
            break;
        }
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int ak_store_remove(ak_store *s, const char *id, ak_error *err) {
    if (!ak_agent_id_valid(id)) return ak_failc(err, AK_ERR_INVALID, "store: invalid agent id");
    ak_error e = {{0}};
    int rc = s->be->ops->remove(s->be, AK_FILE_AGENT, id, &e);
    if (rc < 0) return ak_failc(err, e.code, "store: %s", e.msg);
    ak_store_index_del(s, AK_FILE_AGENT, id);
    return rc;
}

/* Deletes the oldest quarantined file. Call with s->mu held. */
static void drop_oldest_quarantined(ak_store *s) {
    s->be->ops->quarantine_drop(s->be, s->q[0].name);
    memmove(s->q, s->q + 1, sizeof *s->q * (size_t)(s->nq - 1));
    s->nq--;
}

/* Orders copies by last use, the least recent first. */
static int cmp_blob_age(const void *a, const void *b) {
    const ak_blob_name *x = a, *y = b;
    if (x->info.mtime != y->info.mtime) return x->info.mtime < y->info.mtime ? -1 : 1;
    if (x->info.mtime_ns != y->info.mtime_ns) return x->info.mtime_ns < y->info.mtime_ns ? -1 : 1;
    return strcmp(x->id, y->id);
}

int ak_store_gc(ak_store *s, uint64_t budget, uint64_t *bytes_after, ak_error *err) {
    int removed = 0;
    /* the read-through cache's copies (a Redis store with a local
     * directory) count too; listed before the lock (file system reads) */
    ak_blob_name *cp = NULL;
    int ncp = 0;
    ak_error ce = {{0}};
    if (ak_backend_cache_list(s->be, &cp, &ncp, &ce) != 0) ncp = 0;   /* unlisted: not counted this time */
    uint64_t copies = 0;
    for (int i = 0; i < ncp; i++) copies += cp[i].info.bytes;
    if (ncp) qsort(cp, (size_t)ncp, sizeof *cp, cmp_blob_age);
    pthread_mutex_lock(&s->mu);
    uint64_t total = copies;
    for (int i = 0; i < s->n_idx; i++) total += s->idx[i].bytes;
    for (int i = 0; i < s->nq; i++) total += s->q[i].bytes;
    /* corrupt files first (the oldest first): they serve no agent */
    while (total > budget && s->nq > 0) {
        total -= s->q[0].bytes;
        drop_oldest_quarantined(s);
        removed++;
    }
    /* then the cache's copies, least recently used first: the images stay
     * in Redis (only the speed of their next load is lost) */
    for (int i = 0; i < ncp && total > budget; i++) {
        ak_backend_cache_drop(s->be, cp[i].id);
        total -= cp[i].info.bytes;
        copies -= cp[i].info.bytes;
    }
    free(cp);
    ak_store_entry *es = NULL;
    int cnt = s->n_idx;
    if (total > budget) {
        es = malloc(sizeof *es * (size_t)(cnt ? cnt : 1));
        if (!es) {
            pthread_mutex_unlock(&s->mu);
            return ak_failc(err, AK_ERR_NOMEM, "store: gc: out of memory");
        }
        memcpy(es, s->idx, sizeof *es * (size_t)cnt);
        qsort(es, (size_t)cnt, sizeof *es, cmp_entry_age);
    }
    int rc = 0;
    for (int i = 0; es && i < cnt && total > budget; i++) {
        ak_error e = {{0}};
        if (s->be->ops->remove(s->be, AK_FILE_AGENT, es[i].id, &e) < 0) {
            rc = ak_failc(err, e.code, "store: gc: %s", e.msg);
            break;
        }
        /* index_del takes the lock: remove the entry here */
        for (int j = 0; j < s->n_idx; j++)
            if (!strcmp(s->idx[j].id, es[i].id)) {
                memmove(s->idx + j, s->idx + j + 1, sizeof *s->idx * (size_t)(s->n_idx - j - 1));
                s->n_idx--;
                break;
            }
        total -= es[i].bytes;
        removed++;
    }
    /* the room left to copies (what a load may add until the next gc) */
    uint64_t others = total - copies;
    pthread_mutex_unlock(&s->mu);
    free(es);
    ak_backend_cache_room(s->be, budget > others ? (int64_t)(budget - others) : 0);
    if (rc < 0) return -1;
    if (bytes_after) *bytes_after = total;
    return removed;
}


/* ---------------------------------------------------------------- index */

/* Inserts e (or replaces the entry of its id), keeping the order by id. */
static void index_put(ak_store *s, const ak_store_entry *e) {
    pthread_mutex_lock(&s->mu);
    int lo = 0, hi = s->n_idx;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (strcmp(s->idx[mid].id, e->id) < 0) lo = mid + 1;
        else hi = mid;
    }
    if (lo < s->n_idx && !strcmp(s->idx[lo].id, e->id)) {
        s->idx[lo] = *e;
    } else {
        if (s->n_idx == s->cap_idx) {
            int nc = s->cap_idx ? s->cap_idx * 2 : 16;
            ak_store_entry *ni = realloc(s->idx, sizeof *ni * (size_t)nc);
            if (!ni) {   /* out of memory: the file is simply not listed until the next open */
                pthread_mutex_unlock(&s->mu);
                return;
            }
            s->idx = ni;
            s->cap_idx = nc;
        }
        memmove(s->idx + lo + 1, s->idx + lo, sizeof *s->idx * (size_t)(s->n_idx - lo));
        s->idx[lo] = *e;
        s->n_idx++;
    }
    pthread_mutex_unlock(&s->mu);
}

static void index_del(ak_store *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    for (int j = 0; j < s->n_idx; j++)
        if (!strcmp(s->idx[j].id, id)) {
            memmove(s->idx + j, s->idx + j + 1, sizeof *s->idx * (size_t)(s->n_idx - j - 1));
            s->n_idx--;
            break;
        }
    pthread_mutex_unlock(&s->mu);
}

/* Appends a file to the quarantine list (the newest) and deletes the oldest
 * beyond QUARANTINE_MAX_FILES. Call with s->mu held. */
static void quarantine_add(ak_store *s, const char *name, uint64_t bytes) {
    for (int i = 0; i < s->nq; i++)   /* a name used again: its old file is gone (deleted behind our back) */
        if (!strcmp(s->q[i].name, name)) {
            memmove(s->q + i, s->q + i + 1, sizeof *s->q * (size_t)(s->nq - i - 1));
            s->nq--;
            break;
        }
    if (s->nq == s->cap_q) {
        int nc = s->cap_q ? s->cap_q * 2 : 8;
        ak_qfile *nq = realloc(s->q, sizeof *nq * (size_t)nc);
        if (!nq) return;   /* not counted until the next open */
        s->q = nq;
        s->cap_q = nc;
    }
    snprintf(s->q[s->nq].name, sizeof s->q[s->nq].name, "%s", name);
    s->q[s->nq].bytes = bytes;
    s->nq++;
    while (s->nq > QUARANTINE_MAX_FILES) drop_oldest_quarantined(s);
}

void ak_store_index_put(ak_store *s, int kind, const ak_store_entry *e, ak_store_pool_entry *pe) {
    if (kind == AK_FILE_AGENT) index_put(s, e);
    else ak_entry_index_put(s, kind == AK_FILE_MEMORY ? &s->mems : &s->pools, pe);
}

void ak_store_index_del(ak_store *s, int kind, const char *id) {
    if (kind == AK_FILE_CARD) ak_store_card_index_del(s, id);
    else if (kind == AK_FILE_AGENT) index_del(s, id);
    else ak_entry_index_del(s, kind == AK_FILE_MEMORY ? &s->mems : &s->pools, id);
}

void ak_store_index_quarantined(ak_store *s, const ak_blob_qname *q) {
    pthread_mutex_lock(&s->mu);
    quarantine_add(s, q->name, q->bytes);
    pthread_mutex_unlock(&s->mu);
}

static int cmp_qscan(const void *a, const void *b) {
    const ak_blob_qname *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    if (x->tn != y->tn) return x->tn < y->tn ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The images of kind as index entries (size and time only). */
static int scan_ids(ak_store *s, int kind, ak_store_entry **out, int *n, ak_error *err) {
    ak_blob_name *bn = NULL;
    int cnt = 0;
    ak_error e = {{0}};
    if (s->be->ops->list(s->be, kind, &bn, &cnt, &e) != 0) return ak_failc(err, e.code, "store: %s", e.msg);
    ak_store_entry *es = malloc(sizeof *es * (size_t)(cnt ? cnt : 1));
    if (!es) {
        free(bn);
        return ak_failc(err, AK_ERR_NOMEM, "store: out of memory");
    }
    for (int i = 0; i < cnt; i++) {
        memset(&es[i], 0, sizeof es[i]);
        snprintf(es[i].id, sizeof es[i].id, "%s", bn[i].id);
        es[i].bytes = bn[i].info.bytes;
        es[i].mtime = bn[i].info.mtime;
        es[i].mtime_ns = bn[i].info.mtime_ns;
    }
    free(bn);
    *out = es;
    *n = cnt;
    return 0;
}

/* Builds the index at open: every agent image's header (as ak_store_list
 * used to read on each call), the pools' and memories', and the
 * quarantined images, oldest first. Returns 0, or -1 with err set. */
static int index_build(ak_store *s, ak_error *err) {
    ak_store_entry *es = NULL;
    int cnt = 0;
    if (scan_ids(s, AK_FILE_AGENT, &es, &cnt, err) != 0) return -1;
    int k = 0;
    for (int i = 0; i < cnt; i++) {
        verdict v = {.st = AK_STORE_HIT};
        char id[AK_AGENT_ID_MAX + 1];
        snprintf(id, sizeof id, "%s", es[i].id);
        if (aks_read_entry(s, AK_FILE_AGENT, id, &es[k], NULL, NULL, &v) != 1) k++;   /* 1: removed since the scan */
    }
    qsort(es, (size_t)k, sizeof *es, cmp_entry_id);
    s->idx = es;
    s->n_idx = k;
    s->cap_idx = cnt;
    /* the pools, likewise (their index sorts itself) */
    if (scan_ids(s, AK_FILE_POOL, &es, &cnt, err) != 0) return -1;
    for (int i = 0; i < cnt; i++) {
        verdict v = {.st = AK_STORE_HIT};
        ak_store_entry e;
        ak_store_pool_entry pe;
        if (aks_read_entry(s, AK_FILE_POOL, es[i].id, &e, &pe, NULL, &v) != 1) ak_store_index_put(s, AK_FILE_POOL, NULL, &pe);
    }
    free(es);
    /* and the memories (store_memory.c) */
    if (scan_ids(s, AK_FILE_MEMORY, &es, &cnt, err) != 0) return -1;
    for (int i = 0; i < cnt; i++) {
        verdict v = {.st = AK_STORE_HIT};
        ak_store_entry e;
        ak_store_pool_entry pe;
        if (aks_read_entry(s, AK_FILE_MEMORY, es[i].id, &e, &pe, NULL, &v) != 1) ak_store_index_put(s, AK_FILE_MEMORY, NULL, &pe);
    }
    free(es);
    ak_blob_qname *qs = NULL;
    int nqs = 0;
    ak_error e = {{0}};
    if (s->be->ops->quarantine_list(s->be, &qs, &nqs, &e) != 0) return 0;   /* listed as none: gc cannot count them */
    if (nqs) qsort(qs, (size_t)nqs, sizeof *qs, cmp_qscan);
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < nqs; i++) quarantine_add(s, qs[i].name, qs[i].bytes);   /* also applies the bound */
    pthread_mutex_unlock(&s->mu);
    free(qs);
    return 0;
}
