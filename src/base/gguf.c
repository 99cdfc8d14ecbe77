/* gguf.c - GGUF v3 reader. The format is specified in gguf.h.
 *
 * The parser walks the mapping with a cursor that checks every read against
 * the end of the file, so a malformed or hostile file can only produce an
 * error message, never an out-of-bounds read. */
#include "base/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    const uint8_t *p, *end, *base;
    const char *name;
    ak_error *err;
    int failed;
} cursor;

static int cur_fail(cursor *c, const char *what) {
    if (!c->failed)
        ak_fail(c->err, "%s: %s (at byte %zu)", c->name, what, (size_t)(c->p - c->base));
    c->failed = 1;
    return -1;
}

static int cur_read(cursor *c, void *dst, size_t n, const char *what) {
    if (c->failed) return -1;
    if ((size_t)(c->end - c->p) < n) {
        char msg[160];
        snprintf(msg, sizeof msg, "file is truncated: %s needs %zu bytes, %zu left", what, n,
                 (size_t)(c->end - c->p));
        return cur_fail(c, msg);
    }
    memcpy(dst, c->p, n);
    c->p += n;
    return 0;
}

static uint32_t rd_u32(cursor *c, const char *what) {
    uint32_t v = 0;
    cur_read(c, &v, 4, what);
    return v;
}

static uint64_t rd_u64(cursor *c, const char *what) {
    uint64_t v = 0;
    cur_read(c, &v, 8, what);
    return v;
}

static int rd_str(cursor *c, gguf_str *s, const char *what) {
    s->len = rd_u64(c, what);
    s->data = "";
    if (c->failed) return -1;
    if (s->len > (uint64_t)(c->end - c->p)) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s has length %llu, past the end of the file", what,
                 (unsigned long long)s->len);
        return cur_fail(c, msg);
    }
    s->data = (const char *)c->p;
    c->p += s->len;
    return 0;
}

size_t gguf_type_size(uint32_t t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

/* Decodes one scalar of type t at p into kv's union. */
static void decode_scalar(gguf_kv *kv, uint32_t t, const uint8_t *p) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_BOOL: kv->v.u64 = p[0]; break;
    case GGUF_TYPE_INT8: kv->v.i64 = (int8_t)p[0]; break;
    case GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, p, 2); kv->v.u64 = x; break; }
    case GGUF_TYPE_INT16: { int16_t x; memcpy(&x, p, 2); kv->v.i64 = x; break; }
    case GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, p, 4); kv->v.u64 = x; break; }
    case GGUF_TYPE_INT32: { int32_t x; memcpy(&x, p, 4); kv->v.i64 = x; break; }
    case GGUF_TYPE_FLOAT32: { float x; memcpy(&x, p, 4); kv->v.f64 = x; break; }
    case GGUF_TYPE_UINT64: memcpy(&kv->v.u64, p, 8); break;
    case GGUF_TYPE_INT64: memcpy(&kv->v.i64, p, 8); break;
    case GGUF_TYPE_FLOAT64: memcpy(&kv->v.f64, p, 8); break;
    }
}

static int parse_kv(cursor *c, gguf_kv *kv) {
    if (rd_str(c, &kv->key, "metadata key") < 0) return -1;
    kv->type = rd_u32(c, "metadata value type");
    if (c->failed) return -1;
    char msg[256];
    if (kv->type == GGUF_TYPE_STRING) return rd_str(c, &kv->v.str, "string value");
    if (kv->type == GGUF_TYPE_ARRAY) {
        uint32_t et = rd_u32(c, "array element type");
        uint64_t n = rd_u64(c, "array count");
        if (c->failed) return -1;
        kv->v.arr.type = et;
        kv->v.arr.count = n;
        kv->v.arr.data = c->p;
        kv->v.arr.strs = NULL;
        if (et == GGUF_TYPE_STRING) {
            /* each string takes at least 8 bytes: cheap bound before allocating */
            if (n > (uint64_t)(c->end - c->p) / 8) {
                snprintf(msg, sizeof msg, "array '%.*s' has %llu strings, more than the file can hold",
                         (int)(kv->key.len > 64 ? 64 : kv->key.len), kv->key.data, (unsigned long long)n);
                return cur_fail(c, msg);
            }
            kv->v.arr.strs = malloc((n ? n : 1) * sizeof(gguf_str));
            if (!kv->v.arr.strs) return cur_fail(c, "out of memory for a string array");
            for (uint64_t i = 0; i < n; i++)
                if (rd_str(c, &kv->v.arr.strs[i], "array string") < 0) return -1;
            return 0;
        }
        size_t es = gguf_type_size(et);
        if (!es) {
            snprintf(msg, sizeof msg, "array '%.*s' has unsupported element type %u",
                     (int)(kv->key.len > 64 ? 64 : kv->key.len), kv->key.data, et);
            return cur_fail(c, msg);
        }
        if (n > (uint64_t)(c->end - c->p) / es) {
            snprintf(msg, sizeof msg, "array '%.*s' has %llu elements, past the end of the file",
                     (int)(kv->key.len > 64 ? 64 : kv->key.len), kv->key.data, (unsigned long long)n);
            return cur_fail(c, msg);
        }
        c->p += n * es;
        return 0;
    }
    size_t sz = gguf_type_size(kv->type);
    if (!sz) {
        snprintf(msg, sizeof msg, "metadata '%.*s' has unknown value type %u",
                 (int)(kv->key.len > 64 ? 64 : kv->key.len), kv->key.data, kv->type);
        return cur_fail(c, msg);
    }
    uint8_t buf[8];
    if (cur_read(c, buf, sz, "metadata value") < 0) return -1;
    decode_scalar(kv, kv->type, buf);
    return 0;
}

uint32_t gguf_type_block_elems(uint32_t t) {
    switch (t) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: return 1;
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q8_0: case GGML_TYPE_Q8_1: return 32;
    case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K: case GGML_TYPE_Q8_K: return 256;
    default: return 0;
    }
}

uint32_t gguf_type_block_bytes(uint32_t t) {
    switch (t) {
    case GGML_TYPE_F32: return 4;
    case GGML_TYPE_F16: case GGML_TYPE_BF16: return 2;
    case GGML_TYPE_Q4_0: return 18;
    case GGML_TYPE_Q4_1: return 20;
    case GGML_TYPE_Q5_0: return 22;
    case GGML_TYPE_Q5_1: return 24;
    case GGML_TYPE_Q8_0: return 34;
    case GGML_TYPE_Q8_1: return 36;
    case GGML_TYPE_Q2_K: return 84;
    case GGML_TYPE_Q3_K: return 110;
    case GGML_TYPE_Q4_K: return 144;
    case GGML_TYPE_Q5_K: return 176;
    case GGML_TYPE_Q6_K: return 210;
    case GGML_TYPE_Q8_K: return 292;
    default: return 0;
    }
}

const char *gguf_tensor_type_name(uint32_t t) {
    switch (t) {
    case GGML_TYPE_F32: return "F32";
    case GGML_TYPE_F16: return "F16";
    case GGML_TYPE_BF16: return "BF16";
    case GGML_TYPE_Q4_0: return "Q4_0";
    case GGML_TYPE_Q4_1: return "Q4_1";
    case GGML_TYPE_Q5_0: return "Q5_0";
    case GGML_TYPE_Q5_1: return "Q5_1";
    case GGML_TYPE_Q8_0: return "Q8_0";
    case GGML_TYPE_Q8_1: return "Q8_1";
    case GGML_TYPE_Q2_K: return "Q2_K";
    case GGML_TYPE_Q3_K: return "Q3_K";
    case GGML_TYPE_Q4_K: return "Q4_K";
    case GGML_TYPE_Q5_K: return "Q5_K";
    case GGML_TYPE_Q6_K: return "Q6_K";
    case GGML_TYPE_Q8_K: return "Q8_K";
    default: return "?";
    }
}

const char *gguf_type_name(uint32_t t) {
    static const char *names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                  "string", "array", "u64", "i64", "f64"};
    return t < GGUF_TYPE_COUNT ? names[t] : "?";
}

static int parse_tensor(cursor *c, gguf_tensor *t) {
    char msg[256];
    if (rd_str(c, &t->name, "tensor name") < 0) return -1;
    int nl = (int)(t->name.len > 64 ? 64 : t->name.len);
    t->n_dims = rd_u32(c, "tensor n_dims");
    if (c->failed) return -1;
    if (t->n_dims < 1 || t->n_dims > 4) {
        snprintf(msg, sizeof msg, "tensor '%.*s' has %u dimensions (1..4 allowed)", nl, t->name.data, t->n_dims);
        return cur_fail(c, msg);
    }
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    uint64_t nelem = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        t->ne[d] = rd_u64(c, "tensor dimension");
        if (c->failed) return -1;
        if (t->ne[d] == 0 || t->ne[d] > (1ull << 40) || nelem > (1ull << 42) / t->ne[d]) {
            snprintf(msg, sizeof msg, "tensor '%.*s' has an absurd shape (dim %u = %llu)", nl, t->name.data, d,
                     (unsigned long long)t->ne[d]);
            return cur_fail(c, msg);
        }
        nelem *= t->ne[d];
    }
    t->type = rd_u32(c, "tensor type");
    t->offset = rd_u64(c, "tensor offset");
    if (c->failed) return -1;
    uint32_t be = gguf_type_block_elems(t->type), bb = gguf_type_block_bytes(t->type);
    if (!be || !bb) {
        snprintf(msg, sizeof msg, "tensor '%.*s' has unknown type %u", nl, t->name.data, t->type);
        return cur_fail(c, msg);
    }
    if (t->ne[0] % be) {
        snprintf(msg, sizeof msg, "tensor '%.*s': row length %llu is not a multiple of the %s block (%u)", nl,
                 t->name.data, (unsigned long long)t->ne[0], gguf_tensor_type_name(t->type), be);
        return cur_fail(c, msg);
    }
    t->nbytes = nelem / be * bb;
    return 0;
}

static void free_kvs(gguf_file *f) {
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++)
            if (f->kv[i].type == GGUF_TYPE_ARRAY) free(f->kv[i].v.arr.strs);
    free(f->kv);
    free(f->tensors);
    f->kv = NULL;
    f->tensors = NULL;
}

static int strcmp_gguf(const void *a, const void *b) {
    const gguf_str *x = *(const gguf_str *const *)a, *y = *(const gguf_str *const *)b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->data, y->data, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Finds two equal names among n records whose first field is a gguf_str.
 * Sorting makes this O(n log n): a hostile file with millions of keys must
 * not take hours to open. Returns -1 on out of memory, else 0 with *dup set
 * to a duplicated name or NULL. */
static int find_duplicate(const void *recs, uint64_t n, size_t rec_size, const gguf_str **dup) {
    *dup = NULL;
    if (n < 2) return 0;
    const gguf_str **v = malloc(n * sizeof *v);
    if (!v) return -1;
    for (uint64_t i = 0; i < n; i++) v[i] = (const gguf_str *)((const uint8_t *)recs + i * rec_size);
    qsort(v, n, sizeof *v, strcmp_gguf);
    for (uint64_t i = 1; i < n && !*dup; i++)
        if (strcmp_gguf(&v[i - 1], &v[i]) == 0) *dup = v[i];
    free(v);
    return 0;
}

static int parse(gguf_file *f, ak_error *err) {
    cursor c = {.p = f->map, .end = (const uint8_t *)f->map + f->size, .base = f->map, .name = f->path, .err = err};
    char msg[256];
    uint32_t magic = rd_u32(&c, "magic");
    if (c.failed) return -1;
    if (magic != GGUF_MAGIC) return ak_fail(err, "%s: not a GGUF file (bad magic 0x%08x)", f->path, magic);
    f->version = rd_u32(&c, "version");
    if (c.failed) return -1;
    if (f->version != 2 && f->version != 3)
        return ak_fail(err, "%s: unsupported GGUF version %u (2 and 3 are read)", f->path, f->version);
    f->n_tensors = rd_u64(&c, "tensor count");
    f->n_kv = rd_u64(&c, "metadata count");
    if (c.failed) return -1;
    /* every kv takes >= 12 bytes and every tensor info >= 24: bound the counts
     * by what the file could possibly hold before allocating anything */
    if (f->n_kv > f->size / 12) {
        uint64_t n = f->n_kv;
        f->n_kv = 0;
        return ak_fail(err, "%s: metadata count %llu is absurd for a %zu-byte file", f->path,
                       (unsigned long long)n, f->size);
    }
    if (f->n_tensors > f->size / 24) {
        uint64_t n = f->n_tensors;
        f->n_tensors = 0;
        return ak_fail(err, "%s: tensor count %llu is absurd for a %zu-byte file", f->path,
                       (unsigned long long)n, f->size);
    }
    f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof(gguf_kv));
    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof(gguf_tensor));
    if (!f->kv || !f->tensors) return ak_fail(err, "%s: out of memory", f->path);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        if (parse_kv(&c, &f->kv[i]) < 0) {
            f->n_kv = i + 1; /* free what was allocated */
            return -1;
        }
    }
    const gguf_str *dup;
    if (find_duplicate(f->kv, f->n_kv, sizeof(gguf_kv), &dup) < 0) return ak_fail(err, "%s: out of memory", f->path);
    if (dup)
        return ak_fail(err, "%s: duplicate metadata key '%.*s'", f->path, (int)(dup->len > 64 ? 64 : dup->len),
                       dup->data);
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *al = gguf_find(f, "general.alignment");
    if (al) {
        if (al->type != GGUF_TYPE_UINT32 && al->type != GGUF_TYPE_UINT64 && al->type != GGUF_TYPE_INT32)
            return ak_fail(err, "%s: general.alignment has type %s, expected an integer", f->path,
                           gguf_type_name(al->type));
        uint64_t a = al->v.u64;
        if (a == 0 || (a & (a - 1)) || a > (1u << 20))
            return ak_fail(err, "%s: general.alignment %llu is not a power of two <= 1 MiB", f->path,
                           (unsigned long long)a);
        f->alignment = a;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (parse_tensor(&c, &f->tensors[i]) < 0) return -1;
    uint64_t pos = (uint64_t)(c.p - c.base);
    f->data_offset = (pos + f->alignment - 1) / f->alignment * f->alignment;
    if (f->data_offset > f->size && f->n_tensors > 0)
        return ak_fail(err, "%s: file is truncated before the tensor data", f->path);
    uint64_t data_size = f->size > f->data_offset ? f->size - f->data_offset : 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        int nl = (int)(t->name.len > 64 ? 64 : t->name.len);
        if (t->offset % f->alignment) {
            snprintf(msg, sizeof msg, "tensor '%.*s' offset %llu is not aligned to %llu", nl, t->name.data,
                     (unsigned long long)t->offset, (unsigned long long)f->alignment);
            return ak_fail(err, "%s: %s", f->path, msg);
        }
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            return ak_fail(err, "%s: tensor '%.*s' (%llu bytes at data offset %llu) points past the end of the file",
                           f->path, nl, t->name.data, (unsigned long long)t->nbytes,
                           (unsigned long long)t->offset);
        t->data = (const uint8_t *)f->map + f->data_offset + t->offset;
    }
    if (find_duplicate(f->tensors, f->n_tensors, sizeof(gguf_tensor), &dup) < 0)
        return ak_fail(err, "%s: out of memory", f->path);
    if (dup)
        return ak_fail(err, "%s: duplicate tensor name '%.*s'", f->path, (int)(dup->len > 64 ? 64 : dup->len),
                       dup->data);
    return 0;
}

static void set_path(gguf_file *f, const char *path) {
    snprintf(f->path, sizeof f->path, "%s", path ? path : "(buffer)");
}

int gguf_open_buffer(gguf_file *f, const void *buf, size_t size, const char *name, ak_error *err) {
    memset(f, 0, sizeof *f);
    set_path(f, name);
    f->map = (void *)buf;
    f->size = size;
    if (parse(f, err) < 0) {
        free_kvs(f);
        memset(f, 0, sizeof *f);
        return -1;
    }
    return 0;
}

int gguf_open(gguf_file *f, const char *path, ak_error *err) {
    memset(f, 0, sizeof *f);
    set_path(f, path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ak_fail(err, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return ak_fail(err, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ak_fail(err, "%s: not a regular file", path);
    }
    if (st.st_size < 24) {
        close(fd);
        return ak_fail(err, "%s: file is truncated (%lld bytes, a GGUF header needs 24)", path, (long long)st.st_size);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return ak_fail(err, "%s: mmap failed: %s", path, strerror(e));
    f->map = map;
    f->size = (size_t)st.st_size;
    f->owns_map = 1;
    if (parse(f, err) < 0) {
        gguf_close(f);
        return -1;
    }
    return 0;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    free_kvs(f);
    if (f->owns_map && f->map) munmap(f->map, f->size);
    memset(f, 0, sizeof *f);
}

int gguf_str_eq(gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.data, c, n) == 0;
}

const gguf_kv *gguf_find(const gguf_file *f, const char *key) {
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (gguf_str_eq(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (gguf_str_eq(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

static const gguf_kv *need(const gguf_file *f, const char *key, ak_error *err) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) ak_fail(err, "%s: missing metadata key '%s'", f->path, key);
    return kv;
}

static int is_uint(uint32_t t) {
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64;
}
static int is_sint(uint32_t t) {
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}

int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, ak_error *err) {
    const gguf_kv *kv = need(f, key, err);
    if (!kv) return -1;
    if (is_uint(kv->type)) { *out = kv->v.u64; return 0; }
    if (is_sint(kv->type) && kv->v.i64 >= 0) { *out = (uint64_t)kv->v.i64; return 0; }
    return ak_fail(err, "%s: metadata '%s' has type %s, expected a non-negative integer", f->path, key,
                   gguf_type_name(kv->type));
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, ak_error *err) {
    uint64_t v;
    if (gguf_get_u64(f, key, &v, err) < 0) return -1;
    if (v > UINT32_MAX) return ak_fail(err, "%s: metadata '%s' = %llu is out of range", f->path, key, (unsigned long long)v);
    *out = (uint32_t)v;
    return 0;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out, ak_error *err) {
    const gguf_kv *kv = need(f, key, err);
    if (!kv) return -1;
    if (kv->type == GGUF_TYPE_FLOAT32 || kv->type == GGUF_TYPE_FLOAT64) { *out = (float)kv->v.f64; return 0; }
    if (is_uint(kv->type)) { *out = (float)kv->v.u64; return 0; }
    if (is_sint(kv->type)) { *out = (float)kv->v.i64; return 0; }
    return ak_fail(err, "%s: metadata '%s' has type %s, expected a number", f->path, key, gguf_type_name(kv->type));
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out, ak_error *err) {
    const gguf_kv *kv = need(f, key, err);
    if (!kv) return -1;
    if (kv->type == GGUF_TYPE_BOOL || is_uint(kv->type)) { *out = kv->v.u64 != 0; return 0; }
    return ak_fail(err, "%s: metadata '%s' has type %s, expected bool", f->path, key, gguf_type_name(kv->type));
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, ak_error *err) {
    const gguf_kv *kv = need(f, key, err);
    if (!kv) return -1;
    if (kv->type != GGUF_TYPE_STRING)
        return ak_fail(err, "%s: metadata '%s' has type %s, expected string", f->path, key, gguf_type_name(kv->type));
    *out = kv->v.str;
    return 0;
}

const gguf_kv *gguf_get_arr(const gguf_file *f, const char *key, uint32_t elem_type, ak_error *err) {
    const gguf_kv *kv = need(f, key, err);
    if (!kv) return NULL;
    if (kv->type != GGUF_TYPE_ARRAY || kv->v.arr.type != elem_type) {
        ak_fail(err, "%s: metadata '%s' is not an array of %s", f->path, key, gguf_type_name(elem_type));
        return NULL;
    }
    return kv;
}
