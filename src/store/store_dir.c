/* store_dir.c - the directory backend (store_backend.h): the embedded
 * default, one file per image.
 *
 * Layout of a store directory <dir>:
 *     <dir>/<id>.safetensors             an agent's image
 *     <dir>/pools/<id>.safetensors       a pool's
 *     <dir>/memories/<id>.safetensors    a memory's
 *     <dir>/<kind dir>/.<id>.safetensors.tmp.<pid>.<tid>
 *                                        a put in flight (or a dead one's):
 *                                        internal names start with '.',
 *                                        which no id can
 *     <dir>/quarantine/<prefix><id>.safetensors.<reason>.<unix time>[.k]
 *                                        images moved aside
 * (cards/ is store_card.c's own.) A backend opened with
 * ak_backend_dir_open_suffix (rstore.c's records) holds one kind of file,
 * <dir>/<id><suffix>, with temp files .<id><suffix>.tmp.<pid>.<tid> and
 * quarantine/<id><suffix>.<reason>.<unix time>[.k].
 *
 * A put: the temp file in the image's directory, fallocate, write, fsync,
 * close, rename over <id>.safetensors, fsync of the directory. A crash at
 * any point leaves the old file or the new one, never a mix; leftover temp
 * files are removed at the next open (those of processes no longer
 * running, malformed ones, and any older than an hour). A get reads the
 * file it opened (its inode: a rename over it does not disturb the
 * reader), with pread/preadv, so a restore reads straight into blocks.
 * Times are the files' mtimes (a load touches the file).
 *
 * Fault injection (read at open, for the crash tests), compiled only with
 * AK_FAULT_INJECTION defined: the Makefile builds a second object of this
 * file for the test binary; the library and the shipped agentkv ignore
 * these variables:
 *   AK_FAULT_KILL_AT=N       a put raises SIGKILL on itself at its Nth step
 *                            (counted per put from 1: fallocate, each
 *                            write() call, fsync, rename, directory fsync);
 *                            a write step first writes half its bytes
 *   AK_FAULT_FAIL_AT=N[:ERR] the Nth step fails with ENOSPC (or EIO, EDQUOT)
 *                            instead of running
 *   AK_FAULT_WRITE_CHUNK=B   bytes per write() (default 1 MiB), so that tiny
 *                            images take many steps
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "store/store_backend.h"
#include "store/store_impl.h"

#define TMP_TAIL ".tmp."
#define DEFAULT_WRITE_CHUNK (1u << 20)
#define STALE_TMP_SECONDS 3600

typedef struct {
    ak_store_backend base;
    char dir[PATH_MAX];
    char kdir[4][PATH_MAX];     /* per kind: dir, dir/pools, dir/memories, dir/cards */
    char qdir[PATH_MAX];        /* dir/quarantine */
    char suffix[16];            /* of every image file: AK_STORE_SUFFIX, or another (ak_backend_dir_open_suffix) */
    char tmp_mark[24];          /* suffix + TMP_TAIL: in every temp file's name */
    int n_kinds;                /* the kinds whose directories hold images (their temps are cleaned at open) */
    /* fault injection (read only with AK_FAULT_INJECTION): step numbers,
     * 0 = off */
    long kill_at, fail_at;
    int fail_errno;
    size_t write_chunk;         /* bytes per write() */
} dir_backend;

struct ak_blob_put {
    const dir_backend *d;
    int kind;
    int fd;
    int step;
    char tmp[PATH_MAX], path[PATH_MAX];
};

struct ak_blob_get {
    int fd;
    struct stat st;
};

/* <kind's dir>/<id><the backend's suffix> into out. Returns 0, or -1 if
 * too long. */
static int kpath_of(const dir_backend *d, int kind, const char *id, char *out, size_t n) {
    int w = snprintf(out, n, "%s/%s%s", d->kdir[kind], id, d->suffix);
    return w < 0 || (size_t)w >= n ? -1 : 0;
}

static int dir_where(const ak_store_backend *b, int kind, const char *id, char *out, size_t n) {
    return kpath_of((const dir_backend *)b, kind, id, out, n);
}

/* ------------------------------------------------------------- open/close */

static int mkdir_p(const char *dir, ak_error *err) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0700) != 0 && errno != EEXIST) return ak_failc(err, ak_err_code_of_errno(errno), "store: mkdir %s: %s", buf, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0) return ak_failc(err, ak_err_code_of_errno(errno), "store: %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return ak_failc(err, AK_ERR_INVALID, "store: %s is not a directory", dir);
    return 0;
}

/* Parses a temp file name ".<id><suffix>.tmp.<pid>.<tid>" (or the
 * "<id>.safetensors.tmp.<pid>.<tid>" of older builds); returns the pid, 0 if
 * the rest is malformed, -1 if name is not a temp file of ours at all. An
 * image file (ending in the suffix) is never a temp file: an id may
 * contain ".safetensors.tmp.", but no id starts with '.', and an older
 * build's temp name ends in its thread id. */
static long temp_pid(const dir_backend *d, const char *name) {
    size_t len = strlen(name), sl = strlen(d->suffix);
    if (len >= sl && !strcmp(name + len - sl, d->suffix)) return -1;
    const char *m = NULL;   /* the last mark: an id before it may hold one too */
    for (const char *q = strstr(name, d->tmp_mark); q; q = strstr(q + 1, d->tmp_mark)) m = q;
    if (!m || m == name || (name[0] == '.' && m == name + 1)) return -1;
    const char *p = m + strlen(d->tmp_mark);
    char *end;
    errno = 0;
    long pid = strtol(p, &end, 10);
    if (errno || end == p || *end != '.' || pid <= 0) return 0;
    return pid;
}

/* Removes temp files left by saves that died: those whose process is gone,
 * malformed ones, and any older than an hour (a save never takes that long;
 * this also covers pids reused since, or pids of another PID namespace). A
 * temp file of a live process is a save in flight: it stays. */
static void remove_stale_temps(const dir_backend *db, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    time_t now = time(NULL);
    while ((e = readdir(d))) {
        long pid = temp_pid(db, e->d_name);
        if (pid < 0) continue;
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        int stale = pid == 0 || now - st.st_mtime > STALE_TMP_SECONDS;
        if (!stale && pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH) stale = 1;
        if (stale) unlink(path);
    }
    closedir(d);
}

#ifndef AK_FAULT_INJECTION
/* A release build: the fault variables are not read. */
static int parse_fault_env(dir_backend *s, ak_error *err) {
    (void)s;
    (void)err;
    return 0;
}
#else
/* Reads AK_FAULT_KILL_AT, AK_FAULT_FAIL_AT and AK_FAULT_WRITE_CHUNK into s.
 * Returns 0, or -1 with err set on a malformed value. */
static int parse_fault_env(dir_backend *s, ak_error *err) {
    const char *v;
    int64_t x;
    if ((v = getenv("AK_FAULT_KILL_AT")) && *v) {
        if (ak_parse_dec(v, 1, INT32_MAX, &x)) return ak_fail(err, "AK_FAULT_KILL_AT=%s: expected a step number >= 1", v);
        s->kill_at = (long)x;
    }
    if ((v = getenv("AK_FAULT_FAIL_AT")) && *v) {
        char num[32];
        const char *colon = strchr(v, ':');
        size_t k = colon ? (size_t)(colon - v) : strlen(v);
        if (k >= sizeof num) return ak_fail(err, "AK_FAULT_FAIL_AT=%s: bad step number", v);
        memcpy(num, v, k);
        num[k] = 0;
        if (ak_parse_dec(num, 1, INT32_MAX, &x)) return ak_fail(err, "AK_FAULT_FAIL_AT=%s: bad step number", v);
        s->fail_at = (long)x;
        s->fail_errno = ENOSPC;
        if (colon) {
            if (!strcmp(colon + 1, "ENOSPC")) s->fail_errno = ENOSPC;
            else if (!strcmp(colon + 1, "EIO")) s->fail_errno = EIO;
            else if (!strcmp(colon + 1, "EDQUOT")) s->fail_errno = EDQUOT;
            else return ak_fail(err, "AK_FAULT_FAIL_AT=%s: error must be ENOSPC, EIO or EDQUOT", v);
        }
    }
    if ((v = getenv("AK_FAULT_WRITE_CHUNK")) && *v) {
        if (ak_parse_dec(v, 1, 1 << 30, &x)) return ak_fail(err, "AK_FAULT_WRITE_CHUNK=%s: expected bytes >= 1", v);
        s->write_chunk = (size_t)x;
    }
    return 0;
}
#endif

static const ak_backend_ops dir_ops;

/* out = the n bytes of dir, then leaf (out has room: checked by the caller).
 * memcpy, not snprintf: GCC cannot see that room and warns. */
static void dir_child(char *out, const char *dir, size_t n, const char *leaf) {
    memcpy(out, dir, n);
    memcpy(out + n, leaf, strlen(leaf) + 1);
}

/* ak_backend_dir_open and ak_backend_dir_open_suffix: image files end in
 * suffix; n_kinds of the kinds' directories hold them. */
static ak_store_backend *dir_open(const char *dir, const char *suffix, int n_kinds, ak_error *err) {
    dir_backend *d = ak_calloc(1, sizeof *d, err);
    if (!d) return NULL;
    snprintf(d->suffix, sizeof d->suffix, "%s", suffix);
    snprintf(d->tmp_mark, sizeof d->tmp_mark, "%s%s", suffix, TMP_TAIL);
    d->n_kinds = n_kinds;
    d->base.ops = &dir_ops;
    size_t n = strlen(dir);
    /* room for the longest subdirectory and a file name below it */
    if (n > sizeof d->dir - 256) {
        ak_failc(err, AK_ERR_INVALID, "store: directory name too long (%zu bytes)", n);
        free(d);
        return NULL;
    }
    memcpy(d->dir, dir, n + 1);
    while (n > 1 && d->dir[n - 1] == '/') d->dir[--n] = 0;
    dir_child(d->kdir[AK_FILE_AGENT], d->dir, n, "");
    dir_child(d->kdir[AK_FILE_POOL], d->dir, n, "/pools");
    dir_child(d->kdir[AK_FILE_MEMORY], d->dir, n, "/memories");
    dir_child(d->kdir[AK_FILE_CARD], d->dir, n, "/cards");
    dir_child(d->qdir, d->dir, n, "/quarantine");
    d->write_chunk = DEFAULT_WRITE_CHUNK;
    if (parse_fault_env(d, err) != 0 || mkdir_p(d->dir, err) != 0) {
        free(d);
        return NULL;
    }
    for (int k = 0; k < d->n_kinds; k++) remove_stale_temps(d, d->kdir[k]);
    return &d->base;
}

ak_store_backend *ak_backend_dir_open(const char *dir, ak_error *err) { return dir_open(dir, AK_STORE_SUFFIX, 4, err); }

ak_store_backend *ak_backend_dir_open_suffix(const char *dir, const char *suffix, ak_error *err) {
    size_t n = suffix ? strlen(suffix) : 0;
    int ok = n >= 2 && n < 16 && suffix[0] == '.';
    for (size_t i = 1; ok && i < n; i++)
        ok = (suffix[i] >= 'a' && suffix[i] <= 'z') || (suffix[i] >= '0' && suffix[i] <= '9');
    if (!ok || !strcmp(suffix, AK_STORE_SUFFIX)) {
        ak_failc(err, AK_ERR_INVALID, "store: bad file suffix for a directory backend");
        return NULL;
    }
    return dir_open(dir, suffix, 1, err);
}

static void dir_close(ak_store_backend *b) { free(b); }

/* ------------------------------------------------------------------- put */

enum { STEP_RUN, STEP_KILL, STEP_FAIL };

/* Counts one step of the put and says whether fault injection wants it to
 * die or fail. */
static int step(ak_blob_put *c) {
    c->step++;
#ifdef AK_FAULT_INJECTION
    if (c->d->kill_at == c->step) return STEP_KILL;
    if (c->d->fail_at == c->step) return STEP_FAIL;
#endif
    return STEP_RUN;
}

/* errno of an injected failure. */
static int fault_errno(const ak_blob_put *c) {
#ifdef AK_FAULT_INJECTION
    return c->d->fail_errno;
#else
    (void)c;
    return EIO;
#endif
}

/* Called before each non-write step: dies there if fault injection says
 * so; returns -1 with errno set if the step is to fail instead of running,
 * else 0. */
static int inject(ak_blob_put *c) {
    int f = step(c);
    if (f == STEP_KILL) raise(SIGKILL);
    if (f == STEP_FAIL) { errno = fault_errno(c); return -1; }
    return 0;
}

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* Fails a put step: err gets "what path: strerror(errno)". */
static int put_fail(ak_error *err, const char *what, const char *path) {
    int e = errno;
    return ak_failc(err, ak_err_code_of_errno(e), "%s %s: %s", what, path, strerror(e));
}

static ak_blob_put *dir_put_begin(ak_store_backend *b, int kind, const char *id, uint64_t total, ak_error *err) {
    dir_backend *d = (dir_backend *)b;
    ak_blob_put *c = ak_calloc(1, sizeof *c, err);
    if (!c) return NULL;
    c->d = d;
    c->kind = kind;
    c->fd = -1;
    const char *dir = d->kdir[kind];
    int w = snprintf(c->tmp, sizeof c->tmp, "%s/.%s%s%ld.%ld", dir, id, d->tmp_mark, (long)getpid(),
                     (long)syscall(SYS_gettid));
    if (kpath_of(d, kind, id, c->path, sizeof c->path) || w < 0 || (size_t)w >= sizeof c->tmp) {
        ak_failc(err, AK_ERR_INVALID, "path too long for %s", id);
        free(c);
        return NULL;
    }
    if (kind != AK_FILE_AGENT && mkdir(dir, 0700) != 0 && errno != EEXIST) {
        put_fail(err, "mkdir", dir);
        free(c);
        return NULL;
    }
    c->fd = open(c->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (c->fd < 0 && errno == EEXIST) { /* left by a dead thread of a reused pid */
        unlink(c->tmp);
        c->fd = open(c->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    }
    if (c->fd < 0) {
        put_fail(err, "open", c->tmp);
        free(c);
        return NULL;
    }
    /* reserve the blocks first: a full disk fails here, before any write */
    if (inject(c) != 0 ||
        (fallocate(c->fd, 0, 0, (off_t)total) != 0 && errno != EOPNOTSUPP && errno != ENOSYS && errno != EINVAL)) {
        put_fail(err, "fallocate", c->tmp);
        close(c->fd);
        unlink(c->tmp);
        free(c);
        return NULL;
    }
    return c;
}

/* write()s all n bytes in calls of at most write_chunk bytes, each a step. */
static int dir_put_write(ak_blob_put *c, const uint8_t *p, size_t n, ak_error *err) {
    while (n > 0) {
        size_t k = n < c->d->write_chunk ? n : c->d->write_chunk;
        int f = step(c);
        if (f == STEP_KILL) {
            if (write(c->fd, p, k / 2) < 0) { /* dying anyway */ }
            raise(SIGKILL);
        }
        if (f == STEP_FAIL) {
            errno = fault_errno(c);
            return put_fail(err, "write", c->tmp);
        }
        ssize_t w = write(c->fd, p, k);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return put_fail(err, "write", c->tmp);
        if (w == 0) {
            errno = EIO;
            return put_fail(err, "write", c->tmp);
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int ak_backend_dir_put_at(ak_blob_put *c, const uint8_t *p, size_t n, uint64_t off, ak_error *err) {
    while (n > 0) {
        ssize_t w = pwrite(c->fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return put_fail(err, "write", c->tmp);
        if (w == 0) {
            errno = EIO;
            return put_fail(err, "write", c->tmp);
        }
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

static void dir_put_abort(ak_blob_put *c) {
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    unlink(c->tmp);
    free(c);
}

static int dir_put_commit(ak_blob_put *c, ak_blob_info *info, ak_error *err) {
    if (inject(c) || fsync(c->fd) != 0) {
        put_fail(err, "fsync", c->tmp);
        dir_put_abort(c);
        return -1;
    }
    struct stat fst;
    if (fstat(c->fd, &fst) != 0) memset(&fst, 0, sizeof fst);
    int rc = close(c->fd);
    c->fd = -1;
    if (rc != 0) {
        put_fail(err, "close", c->tmp);
        dir_put_abort(c);
        return -1;
    }
    if (inject(c) || rename(c->tmp, c->path) != 0) {
        put_fail(err, "rename", c->path);
        dir_put_abort(c);
        return -1;
    }
    info->bytes = (uint64_t)fst.st_size;
    info->mtime = (int64_t)fst.st_mtim.tv_sec;
    info->mtime_ns = (int64_t)fst.st_mtim.tv_nsec;
    /* The new file is in place; without this fsync the rename itself might
     * not survive a power loss. */
    const char *dir = c->d->kdir[c->kind];
    rc = 0;
    if (inject(c) || fsync_dir(dir) != 0) {
        int e = errno;
        rc = 1;
        ak_failc(err, ak_err_code_of_errno(e), "fsync of directory %s: %s", dir, strerror(e));
    }
    free(c);
    return rc;
}

/* ------------------------------------------------------------------- get */

static int dir_get_open(ak_store_backend *b, int kind, const char *id, ak_blob_get **out, ak_blob_info *info,
                        char *why, size_t whyn, ak_error *err) {
    dir_backend *d = (dir_backend *)b;
    char path[PATH_MAX];
    if (kpath_of(d, kind, id, path, sizeof path))
        return ak_failc(err, AK_ERR_INVALID, "path too long");
    ak_blob_get *g = ak_calloc(1, sizeof *g, err);
    if (!g) return -1;
    g->fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (g->fd < 0) {
        int e = errno;
        free(g);
        if (e == ENOENT) return 1;
        return ak_failc(err, ak_err_code_of_errno(e), "open: %s", strerror(e));
    }
    if (fstat(g->fd, &g->st) != 0) {
        int e = errno;
        close(g->fd);
        free(g);
        return ak_failc(err, ak_err_code_of_errno(e), "fstat: %s", strerror(e));
    }
    info->bytes = (uint64_t)g->st.st_size;
    info->mtime = (int64_t)g->st.st_mtim.tv_sec;
    info->mtime_ns = (int64_t)g->st.st_mtim.tv_nsec;
    *out = g;
    if (!S_ISREG(g->st.st_mode)) {
        snprintf(why, whyn, "not a regular file");
        return 2;   /* the handle stays open: quarantine compares its inode */
    }
    posix_fadvise(g->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    posix_fadvise(g->fd, 0, 0, POSIX_FADV_WILLNEED);
    return 0;
}

static int dir_get_read(ak_blob_get *g, uint8_t *dst, size_t n, uint64_t off) {
    while (n > 0) {
        ssize_t k = pread(g->fd, dst, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) return -2;
        dst += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

static ssize_t dir_get_readv(ak_blob_get *g, const struct iovec *iov, int cnt, uint64_t off) {
    return preadv(g->fd, iov, cnt, (off_t)off);
}

/* WILLNEED has the kernel read the data ahead, but walking the page cache
 * for it costs a cached restore time (docs/store.md): asked only when
 * the image's last byte is not cached (a file is read and written in
 * order, so its last page is the last to leave the cache). */
static void dir_get_prefetch(ak_blob_get *g, uint64_t at_end, const uint64_t *off, const uint64_t *len, int n) {
    uint8_t probe;
    struct iovec pv = {.iov_base = &probe, .iov_len = 1};
    if (preadv2(g->fd, &pv, 1, (off_t)at_end, RWF_NOWAIT) == 1) return;
    for (int i = 0; i < n; i++) posix_fadvise(g->fd, (off_t)off[i], (off_t)len[i], POSIX_FADV_WILLNEED);
}

static void dir_get_touch(ak_blob_get *g) { futimens(g->fd, NULL); }

static void dir_get_close(ak_blob_get *g) {
    if (!g) return;
    if (g->fd >= 0) close(g->fd);
    free(g);
}

/* ----------------------------------------------------- listing, removal */

static int dir_list(ak_store_backend *b, int kind, ak_blob_name **out, int *n, ak_error *err) {
    dir_backend *d = (dir_backend *)b;
    const char *dir = d->kdir[kind];
    DIR *dh = opendir(dir);
    if (!dh && kind != AK_FILE_AGENT && errno == ENOENT) {   /* no pool (memory) saved yet */
        *out = NULL;
        *n = 0;
        return 0;
    }
    if (!dh) return ak_failc(err, ak_err_code_of_errno(errno), "opendir %s: %s", dir, strerror(errno));
    int cap = 16, cnt = 0;
    ak_blob_name *es = malloc(sizeof *es * (size_t)cap);
    if (!es) { closedir(dh); return ak_failc(err, AK_ERR_NOMEM, "out of memory"); }
    struct dirent *de;
    size_t sl = strlen(d->suffix);
    while ((de = readdir(dh))) {
        size_t len = strlen(de->d_name);
        if (len <= sl || strcmp(de->d_name + len - sl, d->suffix) || len - sl > AK_AGENT_ID_MAX) continue;
        char id[AK_AGENT_ID_MAX + 1];
        memcpy(id, de->d_name, len - sl);
        id[len - sl] = 0;
        if (!ak_agent_id_valid(id)) continue;
        char path[PATH_MAX];
        struct stat st;
        if (kpath_of(d, kind, id, path, sizeof path) || lstat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (cnt == cap) {
            ak_blob_name *ne = realloc(es, sizeof *ne * (size_t)(cap *= 2));
            if (!ne) { free(es); closedir(dh); return ak_failc(err, AK_ERR_NOMEM, "out of memory"); }
            es = ne;
        }
        ak_blob_name *e = &es[cnt++];
        memset(e, 0, sizeof *e);
        snprintf(e->id, sizeof e->id, "%s", id);
        e->info.bytes = (uint64_t)st.st_size;
        e->info.mtime = (int64_t)st.st_mtim.tv_sec;
        e->info.mtime_ns = (int64_t)st.st_mtim.tv_nsec;
    }
    closedir(dh);
    *out = es;
    *n = cnt;
    return 0;
}

static int dir_remove(ak_store_backend *b, int kind, const char *id, ak_error *err) {
    char path[PATH_MAX];
    if (kpath_of((dir_backend *)b, kind, id, path, sizeof path))
        return ak_failc(err, AK_ERR_INVALID, "path too long");
    if (unlink(path) != 0) {
        if (errno == ENOENT) return 1;
        return ak_failc(err, ak_err_code_of_errno(errno), "unlink %s: %s", path, strerror(errno));
    }
    return 0;
}

/* ------------------------------------------------------------ quarantine */

/* store_backend.h's quarantine: the file renamed into quarantine/ as
 * <prefix><id><suffix>.<reason>.<unix time>[.k]. */
static int dir_quarantine(ak_store_backend *b, const ak_quarantine_args *a, const char *prefix, ak_blob_qname *q) {
    dir_backend *d = (dir_backend *)b;
    const char *id = a->id, *reason = a->reason;
    ak_blob_get *g = a->g;
    char *dst = a->where, *why = a->why;
    size_t dn = a->wn, whyn = a->whyn;
    char path[PATH_MAX];
    if (kpath_of(d, a->kind, id, path, sizeof path)) {
        snprintf(why, whyn, "path too long");
        return -1;
    }
    struct stat gs, st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT && !g) return 1;
        snprintf(why, whyn, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (mkdir(d->qdir, 0700) != 0 && errno != EEXIST) {
        snprintf(why, whyn, "mkdir %s: %s", d->qdir, strerror(errno));
        return -1;
    }
    if (g && fstat(g->fd, &gs) == 0 && (gs.st_ino != st.st_ino || gs.st_dev != st.st_dev)) {
        /* replaced by a new save while we read it: the new file is not ours to move */
        snprintf(why, whyn, "the file was replaced meanwhile; the new one was left in place");
        return -1;
    }
    long now = (long)time(NULL);
    for (int k = 0; k < 1000; k++) {
        int w = k ? snprintf(dst, dn, "%s/%s%s%s.%s.%ld.%d", d->qdir, prefix, id, d->suffix, reason, now, k)
                  : snprintf(dst, dn, "%s/%s%s%s.%s.%ld", d->qdir, prefix, id, d->suffix, reason, now);
        if (w < 0 || (size_t)w >= dn) break;
        if (access(dst, F_OK) == 0) continue;
        if (rename(path, dst) == 0) {
            memset(q, 0, sizeof *q);
            snprintf(q->name, sizeof q->name, "%s", strrchr(dst, '/') + 1);
            struct stat qs;
            if (lstat(dst, &qs) == 0) {
                q->bytes = (uint64_t)qs.st_size;
                q->t = (int64_t)qs.st_ctim.tv_sec;
                q->tn = (int64_t)qs.st_ctim.tv_nsec;
            }
            return 0;
        }
        snprintf(why, whyn, "rename to %s: %s", dst, strerror(errno));
        return -1;
    }
    snprintf(why, whyn, "no free name in %s", d->qdir);
    return -1;
}

/* The quarantined files, with the time they were moved there (a rename
 * sets the change time). */
static int dir_quarantine_list(ak_store_backend *b, ak_blob_qname **out, int *n, ak_error *err) {
    dir_backend *d = (dir_backend *)b;
    *out = NULL;
    *n = 0;
    DIR *dh = opendir(d->qdir);
    if (!dh) return 0;   /* none yet */
    ak_blob_qname *qs = NULL;
    int nqs = 0, capqs = 0;
    struct dirent *de;
    while ((de = readdir(dh))) {
        if (de->d_name[0] == '.' || strlen(de->d_name) >= sizeof qs->name) continue;
        char path[PATH_MAX + NAME_MAX + 32];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", d->qdir, de->d_name);
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (nqs == capqs) {
            int nc = capqs ? capqs * 2 : 16;
            ak_blob_qname *n2 = realloc(qs, sizeof *n2 * (size_t)nc);
            if (!n2) break;
            qs = n2;
            capqs = nc;
        }
        snprintf(qs[nqs].name, sizeof qs[nqs].name, "%s", de->d_name);
        qs[nqs].bytes = (uint64_t)st.st_size;
        qs[nqs].t = (int64_t)st.st_ctim.tv_sec;
        qs[nqs].tn = (int64_t)st.st_ctim.tv_nsec;
        nqs++;
    }
    closedir(dh);
    (void)err;
    *out = qs;
    *n = nqs;
    return 0;
}

static void dir_quarantine_drop(ak_store_backend *b, const char *name) {
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", ((dir_backend *)b)->qdir, name);
    unlink(path);   /* gone already is as good */
}

static const ak_backend_ops dir_ops = {
    .name = "dir", .close = dir_close, .where = dir_where,
    .put_begin = dir_put_begin, .put_write = dir_put_write, .put_commit = dir_put_commit, .put_abort = dir_put_abort,
    .get_open = dir_get_open, .get_read = dir_get_read, .get_readv = dir_get_readv,
    .get_prefetch = dir_get_prefetch, .get_touch = dir_get_touch, .get_close = dir_get_close,
    .list = dir_list, .remove = dir_remove,
    .quarantine = dir_quarantine, .quarantine_list = dir_quarantine_list, .quarantine_drop = dir_quarantine_drop,
    /* no put_head: the file's first page is at hand anyway; no cache_*: a
     * directory is its own copy; no lease_*: one node owns a directory */
};
