/* gguf_write.c - GGUF v3 writer (API and format in gguf.h).
 *
 * Metadata and tensor infos are small, so they are serialized into memory as
 * they are added; tensor data is large (an 8B model is many GB), so it is
 * streamed through a fixed-size buffer straight to the file and never held.
 *
 * The file is written as PATH.tmp and renamed to PATH only after every byte
 * was written and fsync'd: a crash, a full disk or an abandoned writer never
 * leaves a half-written file under the final name.
 *
 * The setters take no ak_error (to keep call sites short): the first failure
 * is remembered in the writer, every later call returns -1 at once, and
 * gguf_writer_close reports it.
 */
#include "base/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define WBUF_CAP (4u << 20)      /* output buffer: few syscalls, bounded memory */
#define MAX_TENSOR_NAME 63       /* ggml's GGML_MAX_NAME is 64 including NUL */

typedef struct {
    char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
    uint64_t nbytes;
    uint64_t offset;             /* within the data section, set by begin_data */
} wtensor;

typedef struct {
    uint8_t *p;
    size_t len, cap;
} bytes;

struct gguf_writer {
    char path[512];
    char tmp[520];
    int fd;
    int failed;                  /* sticky; the message is in err */
    ak_error err;
    int data_started;

    bytes kv;                    /* serialized metadata pairs */
    uint64_t n_kv;
    char **keys;                 /* for duplicate detection */
    uint64_t keys_cap;
    uint32_t alignment;
    int alignment_set;

    wtensor *t;
    uint64_t n_t, t_cap;

    uint64_t cur;                /* tensor whose data is being written */
    uint64_t cur_done;           /* bytes of it written so far */
    uint64_t pos;                /* bytes handed to out() so far = file offset */

    uint8_t *buf;                /* output buffer, WBUF_CAP bytes */
    size_t buf_len;
};

/* ---- errors and small helpers ------------------------------------------ */

/* Records the first error as "PATH: problem"; always returns -1. */
static int wfail(gguf_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int wfail(gguf_writer *w, const char *fmt, ...) {
    if (w->failed) return -1;    /* keep the first, most specific error */
    int n = snprintf(w->err.msg, sizeof w->err.msg, "%s: ", w->path);
    if (n < 0 || (size_t)n >= sizeof w->err.msg) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err.msg + n, sizeof w->err.msg - (size_t)n, fmt, ap);
    va_end(ap);
    w->failed = 1;
    return -1;
}

static int bytes_put(gguf_writer *w, bytes *b, const void *p, size_t n) {
    if (b->cap - b->len < n) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->len < n) {
            if (cap > SIZE_MAX / 2) return wfail(w, "metadata too large");
            cap *= 2;
        }
        uint8_t *np = realloc(b->p, cap);
        if (!np) return wfail(w, "out of memory for metadata (%zu bytes)", cap);
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

static int put_u32(gguf_writer *w, bytes *b, uint32_t v) { return bytes_put(w, b, &v, 4); }
static int put_u64(gguf_writer *w, bytes *b, uint64_t v) { return bytes_put(w, b, &v, 8); }

static int put_str(gguf_writer *w, bytes *b, const char *s, uint64_t len) {
    if (put_u64(w, b, len) < 0) return -1;
    return bytes_put(w, b, s, (size_t)len);
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }


/* ---- output ------------------------------------------------------------- */

static int write_all(gguf_writer *w, const uint8_t *p, size_t n) {
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        ssize_t r = write(w->fd, p, chunk);
        if (r < 0) {
            if (errno == EINTR) continue;
            return wfail(w, "write failed: %s", strerror(errno));
        }
        if (r == 0) return wfail(w, "write failed: no progress");
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int flush_buf(gguf_writer *w) {
    if (w->buf_len == 0) return 0;
    size_t n = w->buf_len;
    w->buf_len = 0;
    return write_all(w, w->buf, n);
}

static int out(gguf_writer *w, const void *p, size_t n) {
    if (w->failed) return -1;
    if (n == 0) return 0;
    w->pos += n;
    if (w->buf_len + n <= WBUF_CAP) {
        memcpy(w->buf + w->buf_len, p, n);
        w->buf_len += n;
        return 0;
    }
    if (flush_buf(w) < 0) return -1;
    if (n >= WBUF_CAP) return write_all(w, p, n);   /* big pieces skip the copy */
    memcpy(w->buf, p, n);
    w->buf_len = n;
    return 0;
}

static int out_zeros(gguf_writer *w, uint64_t n) {
    static const uint8_t zero[256];
    while (n > 0) {
        size_t k = n > sizeof zero ? sizeof zero : (size_t)n;
        if (out(w, zero, k) < 0) return -1;
        n -= k;
    }
    return 0;
}

/* ---- setup ---------------------------------------------------------------- */

/* Creates PATH.tmp for writing. Returns NULL with err = "PATH: problem" if the
 * file cannot be created or memory is short. Nothing exists under PATH itself
 * until gguf_writer_close succeeds. */
gguf_writer *gguf_writer_open(const char *path, ak_error *err) {
    if (!path || !*path) {
        ak_fail(err, "gguf writer: empty output path");
        return NULL;
    }
    if (strlen(path) >= sizeof ((gguf_writer *)0)->path) {
        ak_fail(err, "%.64s...: path too long", path);
        return NULL;
    }
    gguf_writer *w = calloc(1, sizeof *w);
    uint8_t *buf = malloc(WBUF_CAP);
    if (!w || !buf) {
        free(w);
        free(buf);
        ak_fail(err, "%s: out of memory", path);
        return NULL;
    }
    w->buf = buf;
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path);
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        ak_fail(err, "%s: cannot create %s: %s", path, w->tmp, strerror(errno));
        free(w->buf);
        free(w);
        return NULL;
    }
    return w;
}

/* Checks the writer accepts metadata now and that key is new; records it. */
static int begin_kv(gguf_writer *w, const char *key, uint32_t type) {
    if (w->failed) return -1;
    if (w->data_started) return wfail(w, "metadata '%s' added after the tensor data began", key ? key : "");
    if (!key || !*key) return wfail(w, "empty metadata key");
    size_t kl = strlen(key);
    if (kl > 65535) return wfail(w, "metadata key too long (%zu bytes)", kl);
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) return wfail(w, "duplicate metadata key '%s'", key);
    if (w->n_kv == w->keys_cap) {
        uint64_t cap = w->keys_cap ? w->keys_cap * 2 : 32;
        char **nk = realloc(w->keys, (size_t)cap * sizeof *nk);
        if (!nk) return wfail(w, "out of memory");
        w->keys = nk;
        w->keys_cap = cap;
    }
    char *k = strdup(key);
    if (!k) return wfail(w, "out of memory");
    w->keys[w->n_kv++] = k;
    if (put_str(w, &w->kv, key, kl) < 0) return -1;
    return put_u32(w, &w->kv, type);
}

int gguf_writer_kv_u32(gguf_writer *w, const char *key, uint32_t v) {
    if (!w) return -1;
    int is_align = key && strcmp(key, "general.alignment") == 0;
    if (is_align && !w->failed && (v == 0 || (v & (v - 1)) || v > (1u << 20)))
        return wfail(w, "general.alignment %u is not a power of two <= 1 MiB", v);
    if (begin_kv(w, key, GGUF_TYPE_UINT32) < 0) return -1;
    if (is_align) {
        w->alignment = v;
        w->alignment_set = 1;
    }
    return put_u32(w, &w->kv, v);
}

/* The reader takes general.alignment as an integer of any width, but the
 * writer keeps the one conventional encoding (u32). */
static int not_alignment(gguf_writer *w, const char *key) {
    if (key && strcmp(key, "general.alignment") == 0)
        return wfail(w, "general.alignment must be written as u32");
    return 0;
}

int gguf_writer_kv_i32(gguf_writer *w, const char *key, int32_t v) {
    if (!w || not_alignment(w, key) < 0 || begin_kv(w, key, GGUF_TYPE_INT32) < 0) return -1;
    return bytes_put(w, &w->kv, &v, 4);
}

int gguf_writer_kv_f32(gguf_writer *w, const char *key, float v) {
    if (!w || not_alignment(w, key) < 0 || begin_kv(w, key, GGUF_TYPE_FLOAT32) < 0) return -1;
    return bytes_put(w, &w->kv, &v, 4);
}

int gguf_writer_kv_bool(gguf_writer *w, const char *key, int v) {
    if (!w || not_alignment(w, key) < 0 || begin_kv(w, key, GGUF_TYPE_BOOL) < 0) return -1;
    uint8_t b = v ? 1 : 0;
    return bytes_put(w, &w->kv, &b, 1);
}

int gguf_writer_kv_str(gguf_writer *w, const char *key, const char *v) {
    if (!w || not_alignment(w, key) < 0) return -1;
    if (!v) return wfail(w, "metadata '%s': NULL string", key ? key : "");
    if (begin_kv(w, key, GGUF_TYPE_STRING) < 0) return -1;
    return put_str(w, &w->kv, v, strlen(v));
}

int gguf_writer_kv_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n) {
    if (!w || not_alignment(w, key) < 0) return -1;
    if (!v && n) return wfail(w, "metadata '%s': NULL array", key ? key : "");
    if (begin_kv(w, key, GGUF_TYPE_ARRAY) < 0) return -1;
    if (put_u32(w, &w->kv, GGUF_TYPE_STRING) < 0 || put_u64(w, &w->kv, n) < 0) return -1;
    for (uint64_t i = 0; i < n; i++) {
        const char *s = v[i] ? v[i] : "";
        if (put_str(w, &w->kv, s, strlen(s)) < 0) return -1;
    }
    return 0;
}

int gguf_writer_kv_arr_str_len(gguf_writer *w, const char *key, const gguf_str *v, uint64_t n) {
    if (!w || not_alignment(w, key) < 0) return -1;
    if (!v && n) return wfail(w, "metadata '%s': NULL array", key ? key : "");
    if (begin_kv(w, key, GGUF_TYPE_ARRAY) < 0) return -1;
    if (put_u32(w, &w->kv, GGUF_TYPE_STRING) < 0 || put_u64(w, &w->kv, n) < 0) return -1;
    for (uint64_t i = 0; i < n; i++)
        if (put_str(w, &w->kv, v[i].len ? v[i].data : "", v[i].len) < 0) return -1;
    return 0;
}

/* Numeric arrays: data holds n elements in the file's byte order
 * (little-endian; every platform agentkv builds on is). */
int gguf_writer_kv_arr(gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n) {
    if (!w || not_alignment(w, key) < 0) return -1;
    size_t es = gguf_type_size(elem_type);
    if (!es) return wfail(w, "metadata '%s': array element type %u is not numeric", key ? key : "", elem_type);
    if (!data && n) return wfail(w, "metadata '%s': NULL array", key ? key : "");
    if (n > SIZE_MAX / es) return wfail(w, "metadata '%s': array of %llu elements is too large",
                                        key ? key : "", (unsigned long long)n);
    if (begin_kv(w, key, GGUF_TYPE_ARRAY) < 0) return -1;
    if (put_u32(w, &w->kv, elem_type) < 0 || put_u64(w, &w->kv, n) < 0) return -1;
    return n ? bytes_put(w, &w->kv, data, (size_t)(n * es)) : 0;
}

/* Declares a tensor: validates shape and type the way the reader will, and
 * computes its data size (offsets wait for begin_data, since the alignment
 * may still change). */
int gguf_writer_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne) {
    if (!w || w->failed) return -1;
    if (w->data_started) return wfail(w, "tensor '%s' declared after the tensor data began", name ? name : "");
    if (!name || !*name) return wfail(w, "empty tensor name");
    if (strlen(name) > MAX_TENSOR_NAME)
        return wfail(w, "tensor name '%s' is longer than %d bytes", name, MAX_TENSOR_NAME);
    if (n_dims < 1 || n_dims > 4 || !ne) return wfail(w, "tensor '%s': %u dimensions (1..4 allowed)", name, n_dims);
    uint32_t be = gguf_type_block_elems(type), bb = gguf_type_block_bytes(type);
    if (!be || !bb) return wfail(w, "tensor '%s': unknown tensor type %u", name, type);
    if (ne[0] % be)
        return wfail(w, "tensor '%s': row length %llu is not a multiple of the %s block (%u)", name,
                     (unsigned long long)ne[0], gguf_tensor_type_name(type), be);
    uint64_t nelem = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        /* same bounds as the reader: what we write, we can read back */
        if (ne[d] == 0 || ne[d] > (1ull << 40) || nelem > (1ull << 42) / ne[d])
            return wfail(w, "tensor '%s': bad shape (dim %u = %llu)", name, d, (unsigned long long)ne[d]);
        nelem *= ne[d];
    }
    for (uint64_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) return wfail(w, "duplicate tensor name '%s'", name);
    if (w->n_t == w->t_cap) {
        uint64_t cap = w->t_cap ? w->t_cap * 2 : 64;
        wtensor *nt = realloc(w->t, (size_t)cap * sizeof *nt);
        if (!nt) return wfail(w, "out of memory");
        w->t = nt;
        w->t_cap = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return wfail(w, "out of memory");
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < (int)n_dims ? ne[d] : 1;
    t->nbytes = nelem / be * bb;
    w->n_t++;
    return 0;
}

/* Pads after the current tensor and moves on while tensors are complete
 * (zero-byte tensors do not exist: the reader rejects a zero dimension). */
static int advance(gguf_writer *w) {
    while (w->cur < w->n_t && w->cur_done == w->t[w->cur].nbytes) {
        /* ggml pads every tensor, the last included */
        uint64_t end = w->pos;
        if (out_zeros(w, align_up(end, w->alignment) - end) < 0) return -1;
        w->cur++;
        w->cur_done = 0;
    }
    return 0;
}

/* Writes header, metadata, tensor infos and the padding before the data. */
int gguf_writer_begin_data(gguf_writer *w) {
    if (!w || w->failed) return -1;
    if (w->data_started) return wfail(w, "gguf_writer_begin_data called twice");
    if (!w->alignment_set) {
        if (gguf_writer_kv_u32(w, "general.alignment", GGUF_DEFAULT_ALIGNMENT) < 0) return -1;
    }
    uint64_t off = 0;
    for (uint64_t i = 0; i < w->n_t; i++) {
        off = align_up(off, w->alignment);
        w->t[i].offset = off;
        off += w->t[i].nbytes;   /* <= 2^44 per tensor: no overflow in practice */
    }
    bytes hdr = {0};
    put_u32(w, &hdr, GGUF_MAGIC);
    put_u32(w, &hdr, 3);
    put_u64(w, &hdr, w->n_t);
    put_u64(w, &hdr, w->n_kv);
    if (w->failed || out(w, hdr.p, hdr.len) < 0 || out(w, w->kv.p, w->kv.len) < 0) {
        free(hdr.p);
        return -1;
    }
    hdr.len = 0;
    for (uint64_t i = 0; i < w->n_t && !w->failed; i++) {
        const wtensor *t = &w->t[i];
        put_str(w, &hdr, t->name, strlen(t->name));
        put_u32(w, &hdr, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) put_u64(w, &hdr, t->ne[d]);
        put_u32(w, &hdr, t->type);
        put_u64(w, &hdr, t->offset);
    }
    if (!w->failed) out(w, hdr.p, hdr.len);
    free(hdr.p);
    if (w->failed) return -1;
    if (out_zeros(w, align_up(w->pos, w->alignment) - w->pos) < 0) return -1;
    w->data_started = 1;
    w->cur = 0;
    w->cur_done = 0;
    return advance(w);
}

int gguf_writer_write(gguf_writer *w, const void *data, size_t n) {
    if (!w || w->failed) return -1;
    if (!w->data_started) return wfail(w, "tensor data written before gguf_writer_begin_data");
    if (n == 0) return 0;
    if (w->cur >= w->n_t) return wfail(w, "%zu bytes of tensor data written after the last tensor", n);
    const wtensor *t = &w->t[w->cur];
    if (n > t->nbytes - w->cur_done)
        return wfail(w, "tensor '%s': write of %zu bytes overruns its %llu bytes (%llu already written)",
                     t->name, n, (unsigned long long)t->nbytes, (unsigned long long)w->cur_done);
    if (out(w, data, n) < 0) return -1;
    w->cur_done += n;
    return advance(w);
}

/* fsync of the directory makes the rename itself durable; best effort, as
 * some file systems refuse fsync on directories. */
static void sync_dir(const char *path) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* Finishes the file: flush, fsync, close, rename PATH.tmp -> PATH. A writer
 * with no tensors may be closed without begin_data (header-only file). On any
 * failure, now or earlier, PATH.tmp is deleted, PATH is left as it was, err
 * gets the first error and -1 is returned. Frees w in every case. */
int gguf_writer_close(gguf_writer *w, ak_error *err) {
    if (!w) return ak_fail(err, "gguf writer: NULL writer (open failed?)");
    if (!w->failed && !w->data_started) gguf_writer_begin_data(w);
    if (!w->failed && w->cur < w->n_t) {
        const wtensor *t = &w->t[w->cur];
        wfail(w, "closed before all tensor data was written (tensor '%s': %llu of %llu bytes, %llu tensors left)",
              t->name, (unsigned long long)w->cur_done, (unsigned long long)t->nbytes,
              (unsigned long long)(w->n_t - w->cur));
    }
    if (!w->failed) flush_buf(w);
    if (!w->failed && fsync(w->fd) < 0) wfail(w, "fsync failed: %s", strerror(errno));
    if (close(w->fd) < 0 && !w->failed) wfail(w, "close failed: %s", strerror(errno));
    if (!w->failed && rename(w->tmp, w->path) < 0)
        wfail(w, "cannot rename %s to it: %s", w->tmp, strerror(errno));
    int rc = 0;
    if (w->failed) {
        unlink(w->tmp);
        if (err) *err = w->err;
        rc = -1;
    } else {
        sync_dir(w->path);
    }
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (uint64_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w->kv.p);
    free(w->buf);
    free(w);
    return rc;
}
