/* test_gguf.c - GGUF reader and writer: round trips of every metadata type
 * and of tensor data, and malformed files, each of which must be a clean
 * error naming the file and the problem (run under `make asan` to catch any
 * read past the end). */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/gguf.h"
#include "test.h"

/* ---- helpers ---------------------------------------------------------------- */

static const char *tmp_file(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", test_tmp_dir(), name);
    return buf;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* A growable byte string, to hand-craft (mal)formed files. */
typedef struct {
    uint8_t p[4096];
    size_t len;
} bytes;

static void b_put(bytes *b, const void *p, size_t n) {
    if (b->len + n > sizeof b->p) { fprintf(stderr, "test bytes overflow\n"); abort(); }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}
static void b_u8(bytes *b, uint8_t v) { b_put(b, &v, 1); }
static void b_u32(bytes *b, uint32_t v) { b_put(b, &v, 4); }
static void b_u64(bytes *b, uint64_t v) { b_put(b, &v, 8); }
static void b_str(bytes *b, const char *s) { b_u64(b, strlen(s)); b_put(b, s, strlen(s)); }
static void b_pad(bytes *b, size_t align) { while (b->len % align) b_u8(b, 0); }
static void b_header(bytes *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b_u32(b, GGUF_MAGIC);
    b_u32(b, version);
    b_u64(b, n_tensors);
    b_u64(b, n_kv);
}
static void b_tensor(bytes *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off) {
    b_str(b, name);
    b_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) b_u64(b, ne[d]);
    b_u32(b, type);
    b_u64(b, off);
}
static void b_kv_u32(bytes *b, const char *key, uint32_t v) {
    b_str(b, key);
    b_u32(b, GGUF_TYPE_UINT32);
    b_u32(b, v);
}

/* Opens the image both from an exact-size heap copy (so a sanitizer sees any
 * overread) and from a file; both must fail with a message that names the
 * file and contains `want`. */
static void expect_bad_(ak_test_ctx *t, const char *file, int line, const void *img, size_t n, const char *want) {
    ak_error err = {{0}};
    gguf_file f;
    void *copy = malloc(n ? n : 1);
    memcpy(copy, img, n);
    int rc = gguf_open_buffer(&f, copy, n, "bad-image.gguf", &err);
    if (rc == 0) {
        gguf_close(&f);
        ak_test_fail(t, file, line, "buffer of %zu bytes accepted, expected '%s'", n, want);
    } else if (!strstr(err.msg, "bad-image.gguf") || !strstr(err.msg, want)) {
        ak_test_fail(t, file, line, "buffer error '%s' lacks the name or '%s'", err.msg, want);
    }
    free(copy);

    char path[512];
    tmp_file(path, sizeof path, "bad-file.gguf");
    if (write_bytes(path, img, n) < 0) { ak_test_fail(t, file, line, "cannot write %s", path); return; }
    err.msg[0] = 0;
    rc = gguf_open(&f, path, &err);
    if (rc == 0) {
        gguf_close(&f);
        ak_test_fail(t, file, line, "file of %zu bytes accepted, expected '%s'", n, want);
    } else if (!strstr(err.msg, path) || !strstr(err.msg, want)) {
        ak_test_fail(t, file, line, "file error '%s' lacks the path or '%s'", err.msg, want);
    }
    unlink(path);
}
#define expect_bad(b, want) expect_bad_(t, __FILE__, __LINE__, (b)->p, (b)->len, want)

/* ---- writer -> reader round trip ------------------------------------------------ */

static const char *long_str =
    "a string with UTF-8 \xe2\x96\x81 and \"quotes\", newlines\n and tabs\t, long enough to matter";

typedef struct {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
    size_t nbytes;
} tdesc;

static const tdesc rt_tensors[] = {
    {.name = "a.f32", .type = GGML_TYPE_F32, .n_dims = 2, .ne = {5, 3, 1, 1}, .nbytes = 60},
    /* 60: not a multiple of 32 */
    {.name = "b.f16", .type = GGML_TYPE_F16, .n_dims = 1, .ne = {7, 1, 1, 1}, .nbytes = 14},
    {.name = "c.q8_0", .type = GGML_TYPE_Q8_0, .n_dims = 2, .ne = {64, 2, 1, 1}, .nbytes = 4 * 34},
    {.name = "d.q4_0", .type = GGML_TYPE_Q4_0, .n_dims = 4, .ne = {32, 1, 1, 2}, .nbytes = 2 * 18},
    {.name = "e.bf16", .type = GGML_TYPE_BF16, .n_dims = 3, .ne = {3, 2, 2, 1}, .nbytes = 24},
};
#define N_RT (int)(sizeof rt_tensors / sizeof rt_tensors[0])

static void fill(uint8_t *p, size_t n, int seed) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 31 + (size_t)seed * 7 + 1);
}

/* Writes the round-trip file; alignment 0 means "leave the default". */
static int write_roundtrip(const char *path, uint32_t alignment, ak_error *err) {
    gguf_writer *w = gguf_writer_open(path, err);
    if (!w) return -1;
    if (alignment) gguf_writer_kv_u32(w, "general.alignment", alignment);
    gguf_writer_kv_u32(w, "t.u32", 0xdeadbeefu);
    gguf_writer_kv_i32(w, "t.i32", -123456);
    gguf_writer_kv_f32(w, "t.f32", 3.25f);
    gguf_writer_kv_bool(w, "t.true", 1);
    gguf_writer_kv_bool(w, "t.false", 0);
    gguf_writer_kv_str(w, "t.str", long_str);
    gguf_writer_kv_str(w, "t.empty", "");
    const char *strs[] = {"a", "", "ccc", "\xe2\x96\x81x", long_str};
    gguf_writer_kv_arr_str(w, "t.arr_str", strs, 5);
    gguf_str with_nul[2] = {{.len = 3, .data = "x\0y"}, {.len = 0, .data = NULL}};
    gguf_writer_kv_arr_str_len(w, "t.arr_str_len", with_nul, 2);
    uint8_t u8[] = {0, 1, 255};
    int8_t i8[] = {-128, 0, 127};
    uint16_t u16[] = {0, 65535};
    int16_t i16[] = {-32768, 32767};
    uint32_t u32[] = {0, 4000000000u, 7};
    int32_t i32[] = {INT32_MIN, -1, INT32_MAX};
    float f32[] = {-1.5f, 0.0f, 1e30f};
    uint8_t bools[] = {1, 0, 1, 1};
    uint64_t u64[] = {UINT64_MAX, 1ull << 40};
    int64_t i64[] = {INT64_MIN, -5, INT64_MAX};
    double f64[] = {3.141592653589793, -2.5e300};
    gguf_writer_kv_arr(w, "t.arr_u8", GGUF_TYPE_UINT8, u8, 3);
    gguf_writer_kv_arr(w, "t.arr_i8", GGUF_TYPE_INT8, i8, 3);
    gguf_writer_kv_arr(w, "t.arr_u16", GGUF_TYPE_UINT16, u16, 2);
    gguf_writer_kv_arr(w, "t.arr_i16", GGUF_TYPE_INT16, i16, 2);
    gguf_writer_kv_arr(w, "t.arr_u32", GGUF_TYPE_UINT32, u32, 3);
    gguf_writer_kv_arr(w, "t.arr_i32", GGUF_TYPE_INT32, i32, 3);
    gguf_writer_kv_arr(w, "t.arr_f32", GGUF_TYPE_FLOAT32, f32, 3);
    gguf_writer_kv_arr(w, "t.arr_bool", GGUF_TYPE_BOOL, bools, 4);
    gguf_writer_kv_arr(w, "t.arr_u64", GGUF_TYPE_UINT64, u64, 2);
    gguf_writer_kv_arr(w, "t.arr_i64", GGUF_TYPE_INT64, i64, 3);
    gguf_writer_kv_arr(w, "t.arr_f64", GGUF_TYPE_FLOAT64, f64, 2);
    gguf_writer_kv_arr(w, "t.arr_empty", GGUF_TYPE_UINT32, NULL, 0);
    for (int i = 0; i < N_RT; i++)
        gguf_writer_tensor(w, rt_tensors[i].name, rt_tensors[i].type, rt_tensors[i].n_dims, rt_tensors[i].ne);
    gguf_writer_begin_data(w);
    for (int i = 0; i < N_RT; i++) {
        uint8_t data[256];
        fill(data, rt_tensors[i].nbytes, i);
        /* stream in two pieces: the writer must join them */
        size_t half = rt_tensors[i].nbytes / 3;
        gguf_writer_write(w, data, half);
        gguf_writer_write(w, data + half, rt_tensors[i].nbytes - half);
    }
    return gguf_writer_close(w, err);
}

static void check_arr(ak_test_ctx *t, const gguf_file *f, const char *key, uint32_t type, const void *want,
                      uint64_t n, size_t es) {
    const gguf_kv *kv = gguf_get_arr(f, key, type, NULL);
    CHECK(kv != NULL, "array %s missing or mistyped", key);
    if (!kv) return;
    CHECK(kv->v.arr.count == n, "%s count %llu", key, (unsigned long long)kv->v.arr.count);
    CHECK(kv->v.arr.count != n || n == 0 || memcmp(kv->v.arr.data, want, n * es) == 0, "%s elements differ", key);
}

static void check_roundtrip(ak_test_ctx *t, const gguf_file *f, uint32_t alignment) {
    CHECK(f->version == 3, "version %u", f->version);
    CHECK(f->alignment == alignment, "alignment %llu", (unsigned long long)f->alignment);
    CHECK(f->n_kv == 22, "n_kv %llu (21 + general.alignment)", (unsigned long long)f->n_kv);
    uint32_t u32 = 0;
    float f32 = 0;
    int b = -1;
    gguf_str s = {0};
    CHECK(gguf_get_u32(f, "t.u32", &u32, NULL) == 0 && u32 == 0xdeadbeefu, "t.u32 = %u", u32);
    CHECK(gguf_get_u32(f, "general.alignment", &u32, NULL) == 0 && u32 == alignment, "general.alignment = %u", u32);
    const gguf_kv *kv = gguf_find(f, "t.i32");
    CHECK(kv && kv->type == GGUF_TYPE_INT32 && kv->v.i64 == -123456, "t.i32");
    CHECK(gguf_get_f32(f, "t.f32", &f32, NULL) == 0 && f32 == 3.25f, "t.f32 = %g", f32);
    kv = gguf_find(f, "t.f32");
    CHECK(kv && kv->type == GGUF_TYPE_FLOAT32, "t.f32 type");
    CHECK(gguf_get_bool(f, "t.true", &b, NULL) == 0 && b == 1, "t.true = %d", b);
    CHECK(gguf_get_bool(f, "t.false", &b, NULL) == 0 && b == 0, "t.false = %d", b);
    CHECK(gguf_get_str(f, "t.str", &s, NULL) == 0 && gguf_str_eq(s, long_str), "t.str");
    CHECK(gguf_get_str(f, "t.empty", &s, NULL) == 0 && s.len == 0, "t.empty");
    kv = gguf_get_arr(f, "t.arr_str", GGUF_TYPE_STRING, NULL);
    CHECK(kv && kv->v.arr.count == 5, "t.arr_str");
    if (kv && kv->v.arr.count == 5) {
        const char *want[] = {"a", "", "ccc", "\xe2\x96\x81x", long_str};
        for (int i = 0; i < 5; i++) CHECK(gguf_str_eq(kv->v.arr.strs[i], want[i]), "t.arr_str[%d]", i);
    }
    kv = gguf_get_arr(f, "t.arr_str_len", GGUF_TYPE_STRING, NULL);
    CHECK(kv && kv->v.arr.count == 2 && kv->v.arr.strs[0].len == 3 && memcmp(kv->v.arr.strs[0].data, "x\0y", 3) == 0
              && kv->v.arr.strs[1].len == 0, "t.arr_str_len (embedded NUL, empty)");
    uint8_t u8[] = {0, 1, 255};
    int8_t i8[] = {-128, 0, 127};
    uint16_t u16[] = {0, 65535};
    int16_t i16[] = {-32768, 32767};
    uint32_t au32[] = {0, 4000000000u, 7};
    int32_t i32[] = {INT32_MIN, -1, INT32_MAX};
    float af32[] = {-1.5f, 0.0f, 1e30f};
    uint8_t bools[] = {1, 0, 1, 1};
    uint64_t u64[] = {UINT64_MAX, 1ull << 40};
    int64_t i64[] = {INT64_MIN, -5, INT64_MAX};
    double f64[] = {3.141592653589793, -2.5e300};
    check_arr(t, f, "t.arr_u8", GGUF_TYPE_UINT8, u8, 3, 1);
    check_arr(t, f, "t.arr_i8", GGUF_TYPE_INT8, i8, 3, 1);
    check_arr(t, f, "t.arr_u16", GGUF_TYPE_UINT16, u16, 2, 2);
    check_arr(t, f, "t.arr_i16", GGUF_TYPE_INT16, i16, 2, 2);
    check_arr(t, f, "t.arr_u32", GGUF_TYPE_UINT32, au32, 3, 4);
    check_arr(t, f, "t.arr_i32", GGUF_TYPE_INT32, i32, 3, 4);
    check_arr(t, f, "t.arr_f32", GGUF_TYPE_FLOAT32, af32, 3, 4);
    check_arr(t, f, "t.arr_bool", GGUF_TYPE_BOOL, bools, 4, 1);
    check_arr(t, f, "t.arr_u64", GGUF_TYPE_UINT64, u64, 2, 8);
    check_arr(t, f, "t.arr_i64", GGUF_TYPE_INT64, i64, 3, 8);
    check_arr(t, f, "t.arr_f64", GGUF_TYPE_FLOAT64, f64, 2, 8);
    check_arr(t, f, "t.arr_empty", GGUF_TYPE_UINT32, NULL, 0, 4);

    CHECK(f->n_tensors == N_RT, "n_tensors %llu", (unsigned long long)f->n_tensors);
    CHECK(f->data_offset % alignment == 0, "data offset %llu", (unsigned long long)f->data_offset);
    for (int i = 0; i < N_RT; i++) {
        const tdesc *d = &rt_tensors[i];
        const gguf_tensor *g = gguf_find_tensor(f, d->name);
        CHECK(g != NULL, "tensor %s missing", d->name);
        if (!g) continue;
        CHECK(g == &f->tensors[i], "tensor %s out of order", d->name);
        CHECK(g->type == d->type && g->n_dims == d->n_dims, "tensor %s type %u dims %u", d->name, g->type, g->n_dims);
        for (int k = 0; k < 4; k++) CHECK(g->ne[k] == d->ne[k], "tensor %s ne[%d] = %llu", d->name, k,
                                          (unsigned long long)g->ne[k]);
        CHECK(g->nbytes == d->nbytes, "tensor %s nbytes %llu", d->name, (unsigned long long)g->nbytes);
        CHECK(g->offset % alignment == 0, "tensor %s offset %llu", d->name, (unsigned long long)g->offset);
        uint8_t want[256];
        fill(want, d->nbytes, i);
        CHECK(memcmp(g->data, want, d->nbytes) == 0, "tensor %s data differs", d->name);
    }
}

TEST(gguf_write_read_roundtrip) {
    char path[512], tmp[600];
    tmp_file(path, sizeof path, "roundtrip.gguf");
    ak_error err = {{0}};
    REQUIRE(write_roundtrip(path, 0, &err) == 0, "write: %s", err.msg);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(!file_exists(tmp), "%s left behind", tmp);
    gguf_file f;
    REQUIRE(gguf_open(&f, path, &err) == 0, "open: %s", err.msg);
    check_roundtrip(t, &f, 32);
    /* the file ends with the last tensor's padding */
    CHECK(f.size % 32 == 0, "file size %zu not padded", f.size);
    gguf_close(&f);
    unlink(path);
}

TEST(gguf_write_alignment_64) {
    char path[512];
    tmp_file(path, sizeof path, "align64.gguf");
    ak_error err = {{0}};
    REQUIRE(write_roundtrip(path, 64, &err) == 0, "write: %s", err.msg);
    gguf_file f;
    REQUIRE(gguf_open(&f, path, &err) == 0, "open: %s", err.msg);
    check_roundtrip(t, &f, 64);
    gguf_close(&f);
    unlink(path);
}

TEST(gguf_write_header_only) {
    char path[512];
    tmp_file(path, sizeof path, "header-only.gguf");
    ak_error err = {{0}};
    gguf_writer *w = gguf_writer_open(path, &err);
    REQUIRE(w, "open: %s", err.msg);
    gguf_writer_kv_str(w, "general.architecture", "llama");
    REQUIRE(gguf_writer_close(w, &err) == 0, "close without begin_data: %s", err.msg);  /* no tensors */
    gguf_file f;
    REQUIRE(gguf_open(&f, path, &err) == 0, "open: %s", err.msg);
    CHECK(f.n_tensors == 0 && f.n_kv == 2, "n_tensors %llu n_kv %llu", (unsigned long long)f.n_tensors,
          (unsigned long long)f.n_kv);
    gguf_close(&f);
    unlink(path);
}

/* Every scalar metadata type, including those the writer has no setter for. */
TEST(gguf_read_every_scalar_type) {
    bytes b = {.len = 0};
    b_header(&b, 3, 0, 12);
    struct { const char *key; uint32_t type; uint64_t raw; size_t n; } kvs[] = {
        {.key = "s.u8", .type = GGUF_TYPE_UINT8, .raw = 200, .n = 1},
        {.key = "s.i8", .type = GGUF_TYPE_INT8, .raw = 0x80, .n = 1},
        {.key = "s.u16", .type = GGUF_TYPE_UINT16, .raw = 60000, .n = 2},
        {.key = "s.i16", .type = GGUF_TYPE_INT16, .raw = 0x8001, .n = 2},
        {.key = "s.u32", .type = GGUF_TYPE_UINT32, .raw = 4000000000u, .n = 4},
        {.key = "s.i32", .type = GGUF_TYPE_INT32, .raw = 0xfffffffe, .n = 4},
        {.key = "s.u64", .type = GGUF_TYPE_UINT64, .raw = 1ull << 63, .n = 8},
        {.key = "s.i64", .type = GGUF_TYPE_INT64, .raw = (uint64_t)-3, .n = 8},
        {.key = "s.bool", .type = GGUF_TYPE_BOOL, .raw = 1, .n = 1},
    };
    for (int i = 0; i < 9; i++) {
        b_str(&b, kvs[i].key);
        b_u32(&b, kvs[i].type);
        b_put(&b, &kvs[i].raw, kvs[i].n);
    }
    float f = -0.375f;
    double d = 1.0 / 3.0;
    b_str(&b, "s.f32"); b_u32(&b, GGUF_TYPE_FLOAT32); b_put(&b, &f, 4);
    b_str(&b, "s.f64"); b_u32(&b, GGUF_TYPE_FLOAT64); b_put(&b, &d, 8);
    b_str(&b, "s.str"); b_u32(&b, GGUF_TYPE_STRING); b_str(&b, "hi");
    gguf_file g;
    ak_error err = {{0}};
    REQUIRE(gguf_open_buffer(&g, b.p, b.len, "scalars", &err) == 0, "%s", err.msg);
    const gguf_kv *kv;
    CHECK((kv = gguf_find(&g, "s.u8")) && kv->type == GGUF_TYPE_UINT8 && kv->v.u64 == 200, "u8");
    CHECK((kv = gguf_find(&g, "s.i8")) && kv->type == GGUF_TYPE_INT8 && kv->v.i64 == -128, "i8");
    CHECK((kv = gguf_find(&g, "s.u16")) && kv->v.u64 == 60000, "u16");
    CHECK((kv = gguf_find(&g, "s.i16")) && kv->v.i64 == -32767, "i16");
    CHECK((kv = gguf_find(&g, "s.u32")) && kv->v.u64 == 4000000000u, "u32");
    CHECK((kv = gguf_find(&g, "s.i32")) && kv->v.i64 == -2, "i32");
    CHECK((kv = gguf_find(&g, "s.u64")) && kv->v.u64 == 1ull << 63, "u64");
    CHECK((kv = gguf_find(&g, "s.i64")) && kv->v.i64 == -3, "i64");
    CHECK((kv = gguf_find(&g, "s.bool")) && kv->type == GGUF_TYPE_BOOL && kv->v.u64 == 1, "bool");
    CHECK((kv = gguf_find(&g, "s.f32")) && kv->v.f64 == -0.375, "f32");
    CHECK((kv = gguf_find(&g, "s.f64")) && kv->v.f64 == 1.0 / 3.0, "f64");
    gguf_str s;
    CHECK(gguf_get_str(&g, "s.str", &s, NULL) == 0 && gguf_str_eq(s, "hi"), "str");
    uint64_t u;
    CHECK(gguf_get_u64(&g, "s.u16", &u, NULL) == 0 && u == 60000, "u16 via get_u64");
    uint32_t u32;
    CHECK(gguf_get_u32(&g, "s.u64", &u32, &err) < 0 && strstr(err.msg, "s.u64"), "u64 2^63 fits u32?");
    CHECK(gguf_get_u32(&g, "absent", &u32, &err) < 0 && strstr(err.msg, "absent"), "absent key: %s", err.msg);
    gguf_close(&g);
}

/* ---- writer errors ----------------------------------------------------------- */

/* A writer that failed leaves nothing under PATH (an older file stays) and
 * no PATH.tmp; the message names the path and the problem. */
static void check_writer_failure(ak_test_ctx *t, gguf_writer *w, const char *path, const char *want) {
    ak_error err = {{0}};
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(gguf_writer_close(w, &err) < 0, "close succeeded, expected '%s'", want);
    CHECK(strstr(err.msg, path) && strstr(err.msg, want), "error '%s' lacks path or '%s'", err.msg, want);
    CHECK(!file_exists(tmp), "%s left behind", tmp);
    size_t n = 0;
    char *old = ak_read_file(path, &n, NULL);
    CHECK(old && n == 3 && memcmp(old, "old", 3) == 0, "the previous %s was clobbered", path);
    free(old);
}

TEST(gguf_writer_errors) {
    char path[512];
    tmp_file(path, sizeof path, "werr.gguf");
    REQUIRE(write_bytes(path, "old", 3) == 0, "setup");
    ak_error err = {{0}};
    const uint64_t ne[2] = {32, 2}, ne33[1] = {33};
    gguf_writer *w;

    w = gguf_writer_open(path, &err);
    gguf_writer_kv_u32(w, "k", 1);
    CHECK(gguf_writer_kv_str(w, "k", "again") < 0, "duplicate key accepted");
    check_writer_failure(t, w, path, "duplicate metadata key 'k'");

    w = gguf_writer_open(path, &err);
    gguf_writer_tensor(w, "x", GGML_TYPE_F32, 2, ne);
    CHECK(gguf_writer_tensor(w, "x", GGML_TYPE_F16, 2, ne) < 0, "duplicate tensor accepted");
    check_writer_failure(t, w, path, "duplicate tensor name 'x'");

    w = gguf_writer_open(path, &err);
    gguf_writer_tensor(w, "x", 99, 2, ne);
    check_writer_failure(t, w, path, "unknown tensor type 99");

    w = gguf_writer_open(path, &err);
    gguf_writer_tensor(w, "x", GGML_TYPE_Q4_0, 1, ne33);
    check_writer_failure(t, w, path, "not a multiple");

    w = gguf_writer_open(path, &err);
    gguf_writer_tensor(w, "x", GGML_TYPE_F32, 5, ne);
    check_writer_failure(t, w, path, "dimensions");

    w = gguf_writer_open(path, &err);
    gguf_writer_kv_u32(w, "general.alignment", 48);
    check_writer_failure(t, w, path, "power of two");

    /* more bytes than the tensor holds */
    w = gguf_writer_open(path, &err);
    gguf_writer_tensor(w, "x", GGML_TYPE_F32, 2, ne);
    gguf_writer_begin_data(w);
    uint8_t data[512] = {0};
    CHECK(gguf_writer_write(w, data, 257) < 0, "overrun accepted");
    check_writer_failure(t, w, path, "overruns");

    /* abandoned half way: the rename must not happen */
    w = gguf_writer_open(path, &err);
    gguf_writer_tensor(w, "x", GGML_TYPE_F32, 2, ne);
    gguf_writer_tensor(w, "y", GGML_TYPE_F32, 2, ne);
    gguf_writer_begin_data(w);
    gguf_writer_write(w, data, 256);
    gguf_writer_write(w, data, 100);
    check_writer_failure(t, w, path, "tensor 'y': 100 of 256 bytes");

    /* metadata after the data began */
    w = gguf_writer_open(path, &err);
    gguf_writer_begin_data(w);
    gguf_writer_kv_u32(w, "late", 1);
    check_writer_failure(t, w, path, "after the tensor data began");

    /* a directory that does not exist */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.gguf", test_tmp_dir());
    err.msg[0] = 0;
    CHECK(gguf_writer_open(bad, &err) == NULL, "open in a missing directory succeeded");
    CHECK(strstr(err.msg, bad) && strstr(err.msg, "No such file"), "error '%s'", err.msg);
    unlink(path);
}

/* A full disk (ENOSPC) is reported with the path, and nothing is left. The
 * temporary file is made a link to /dev/full, which fails every write. */
TEST(gguf_writer_disk_full) {
    if (!file_exists("/dev/full")) SKIP("no /dev/full on this machine");
    char path[512], tmp[600];
    tmp_file(path, sizeof path, "full.gguf");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    REQUIRE(symlink("/dev/full", tmp) == 0, "symlink: %s", strerror(errno));
    ak_error err = {{0}};
    gguf_writer *w = gguf_writer_open(path, &err);
    REQUIRE(w, "open: %s", err.msg);
    const uint64_t ne[2] = {1024, 2048};   /* 8 MiB: larger than the writer's buffer */
    gguf_writer_tensor(w, "big", GGML_TYPE_F32, 2, ne);
    gguf_writer_begin_data(w);
    float *row = calloc(1024, sizeof *row);
    for (int r = 0; r < 2048; r++) gguf_writer_write(w, row, 1024 * sizeof *row);
    free(row);
    CHECK(gguf_writer_close(w, &err) < 0, "close succeeded on a full disk");
    CHECK(strstr(err.msg, path) && strstr(err.msg, strerror(ENOSPC)), "error '%s'", err.msg);
    CHECK(!file_exists(path), "%s exists", path);
    unlink(tmp);
}

/* ---- malformed files ---------------------------------------------------------- */

/* Every proper prefix of a valid file is rejected cleanly. */
TEST(gguf_rejects_every_truncation) {
    char path[512];
    tmp_file(path, sizeof path, "trunc-src.gguf");
    ak_error err = {{0}};
    REQUIRE(write_roundtrip(path, 0, &err) == 0, "write: %s", err.msg);
    size_t n = 0;
    char *img = ak_read_file(path, &n, &err);
    REQUIRE(img, "%s", err.msg);
    unlink(path);
    gguf_file f;
    REQUIRE(gguf_open_buffer(&f, img, n, "whole", &err) == 0, "whole file: %s", err.msg);
    gguf_close(&f);
    /* the last tensor is followed by padding: cutting only that is harmless */
    size_t end = 0;
    {
        gguf_file g;
        gguf_open_buffer(&g, img, n, "whole", NULL);
        const gguf_tensor *last = &g.tensors[g.n_tensors - 1];
        end = (size_t)(g.data_offset + last->offset + last->nbytes);
        gguf_close(&g);
    }
    int bad = 0;
    for (size_t len = 0; len < end; len++) {
        char *copy = malloc(len ? len : 1);   /* exact size: overreads are caught by ASan */
        memcpy(copy, img, len);
        err.msg[0] = 0;
        int rc = gguf_open_buffer(&f, copy, len, "cut.gguf", &err);
        if (rc == 0) { gguf_close(&f); bad++; CHECK(0, "prefix of %zu bytes accepted", len); }
        else if (!strstr(err.msg, "cut.gguf") ||
                 !(strstr(err.msg, "truncated") || strstr(err.msg, "past the end") || strstr(err.msg, "absurd") ||
                   strstr(err.msg, "more than the file"))) {
            bad++;
            CHECK(0, "prefix %zu: message '%s'", len, err.msg);
        }
        free(copy);
        if (bad > 5) break;
    }
    /* the same through gguf_open (its own size check comes first) */
    for (size_t len = 0; len < end && bad <= 5; len += 7) {
        tmp_file(path, sizeof path, "cut.gguf");
        write_bytes(path, img, len);
        err.msg[0] = 0;
        if (gguf_open(&f, path, &err) == 0) { gguf_close(&f); bad++; CHECK(0, "file prefix %zu accepted", len); }
        else CHECK(strstr(err.msg, path) && (strstr(err.msg, "truncated") || strstr(err.msg, "past the end") ||
                                            strstr(err.msg, "absurd") || strstr(err.msg, "more than the file")),
                   "file prefix %zu: '%s'", len, err.msg);
    }
    unlink(path);
    free(img);
}

TEST(gguf_rejects_bad_header) {
    bytes b = {.len = 0};
    b_u32(&b, 0x46554746);   /* "FGUF" */
    b_u32(&b, 3); b_u64(&b, 0); b_u64(&b, 0);
    expect_bad(&b, "magic");
    b.len = 0;
    b_header(&b, 1, 0, 0);
    expect_bad(&b, "version 1");
    b.len = 0;
    b_header(&b, 4, 0, 0);
    expect_bad(&b, "version 4");
    b.len = 0;
    b_header(&b, 3, 0, 1ull << 62);
    expect_bad(&b, "absurd");
    b.len = 0;
    b_header(&b, 3, 1ull << 62, 0);
    expect_bad(&b, "absurd");
    b.len = 0;
    b_header(&b, 3, UINT64_MAX, UINT64_MAX);
    expect_bad(&b, "absurd");
}

TEST(gguf_rejects_bad_metadata) {
    bytes b = {.len = 0};
    /* key length 2^60 */
    b_header(&b, 3, 0, 1);
    b_u64(&b, 1ull << 60);
    b_put(&b, "key.....", 8);
    b_u32(&b, GGUF_TYPE_UINT32); b_u32(&b, 0);
    expect_bad(&b, "past the end");
    /* string value length 2^60 */
    b.len = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "k"); b_u32(&b, GGUF_TYPE_STRING); b_u64(&b, 1ull << 60); b_put(&b, "abcdefgh", 8);
    expect_bad(&b, "past the end");
    /* string length UINT64_MAX (pointer wrap-around) */
    b.len = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "k"); b_u32(&b, GGUF_TYPE_STRING); b_u64(&b, UINT64_MAX); b_put(&b, "abcdefgh", 8);
    expect_bad(&b, "past the end");
    /* numeric array count huge, and count * 8 overflowing 64 bits */
    b.len = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "k"); b_u32(&b, GGUF_TYPE_ARRAY); b_u32(&b, GGUF_TYPE_UINT32); b_u64(&b, 1ull << 61); b_u32(&b, 5);
    expect_bad(&b, "past the end");
    b.len = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "k"); b_u32(&b, GGUF_TYPE_ARRAY); b_u32(&b, GGUF_TYPE_UINT64); b_u64(&b, (1ull << 61) + 1); b_u64(&b, 5);
    expect_bad(&b, "past the end");
    /* string array count huge: must not allocate count entries first */
    b.len = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "k"); b_u32(&b, GGUF_TYPE_ARRAY); b_u32(&b, GGUF_TYPE_STRING); b_u64(&b, 1ull << 62); b_str(&b, "a");
    expect_bad(&b, "more than the file");
    /* string array whose last element runs off the end */
    b.len = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "k"); b_u32(&b, GGUF_TYPE_ARRAY); b_u32(&b, GGUF_TYPE_STRING); b_u64(&b, 2); b_str(&b, "a");
    b_u64(&b, 100); b_put(&b, "abc", 3);
    expect_bad(&b, "past the end");
    /* arrays of arrays, unknown value types */
    b.len = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "k"); b_u32(&b, GGUF_TYPE_ARRAY); b_u32(&b, GGUF_TYPE_ARRAY); b_u64(&b, 1); b_u64(&b, 0);
    expect_bad(&b, "element type 9");
    b.len = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "k"); b_u32(&b, 13); b_u64(&b, 0);
    expect_bad(&b, "type 13");
    b.len = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "k"); b_u32(&b, 0xffffffffu); b_u64(&b, 0);
    expect_bad(&b, "type 4294967295");
    /* duplicate key */
    b.len = 0;
    b_header(&b, 3, 0, 2);
    b_kv_u32(&b, "general.x", 1);
    b_kv_u32(&b, "general.x", 2);
    expect_bad(&b, "duplicate metadata key 'general.x'");
    /* alignment not a power of two, and zero */
    b.len = 0;
    b_header(&b, 3, 0, 1);
    b_kv_u32(&b, "general.alignment", 24);
    expect_bad(&b, "general.alignment");
    b.len = 0;
    b_header(&b, 3, 0, 1);
    b_kv_u32(&b, "general.alignment", 0);
    expect_bad(&b, "general.alignment");
}

/* A file with one tensor "w" of the given shape/type/offset and `data` bytes
 * of data after the padding. */
static void one_tensor(bytes *b, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off, size_t data) {
    b->len = 0;
    b_header(b, 3, 1, 1);
    b_kv_u32(b, "general.alignment", 32);
    b_tensor(b, "w", n_dims, ne, type, off);
    b_pad(b, 32);
    for (size_t i = 0; i < data; i++) b_u8(b, (uint8_t)i);
}

TEST(gguf_rejects_bad_tensors) {
    bytes b = {.len = 0};
    const uint64_t ne8[1] = {8};
    one_tensor(&b, 1, ne8, GGML_TYPE_F32, 0, 32);
    gguf_file f;
    ak_error err = {{0}};
    REQUIRE(gguf_open_buffer(&f, b.p, b.len, "ok", &err) == 0, "the valid base: %s", err.msg);
    gguf_close(&f);

    one_tensor(&b, 1, ne8, GGML_TYPE_F32, 0, 31);
    expect_bad(&b, "past the end");
    one_tensor(&b, 1, ne8, GGML_TYPE_F32, 32, 32);
    expect_bad(&b, "past the end");
    one_tensor(&b, 1, ne8, GGML_TYPE_F32, UINT64_MAX - 31, 32);   /* offset + size wraps */
    expect_bad(&b, "past the end");
    one_tensor(&b, 1, ne8, GGML_TYPE_F32, 4, 64);
    expect_bad(&b, "not aligned");
    one_tensor(&b, 1, ne8, 99, 0, 64);
    expect_bad(&b, "unknown type 99");
    one_tensor(&b, 1, ne8, GGML_TYPE_COUNT + 1000, 0, 64);
    expect_bad(&b, "unknown type");
    const uint64_t ne5[5] = {1, 1, 1, 1, 8};
    one_tensor(&b, 5, ne5, GGML_TYPE_F32, 0, 64);
    expect_bad(&b, "5 dimensions");
    one_tensor(&b, 0, ne5, GGML_TYPE_F32, 0, 64);
    expect_bad(&b, "0 dimensions");
    const uint64_t big2[2] = {1ull << 32, 1ull << 32};   /* product 2^64 wraps to 0 */
    one_tensor(&b, 2, big2, GGML_TYPE_F32, 0, 64);
    expect_bad(&b, "absurd shape");
    const uint64_t big4[4] = {1ull << 16, 1ull << 16, 1ull << 16, 1ull << 16};
    one_tensor(&b, 4, big4, GGML_TYPE_F32, 0, 64);
    expect_bad(&b, "absurd shape");
    const uint64_t huge[1] = {UINT64_MAX};
    one_tensor(&b, 1, huge, GGML_TYPE_F32, 0, 64);
    expect_bad(&b, "absurd shape");
    const uint64_t zero[2] = {8, 0};
    one_tensor(&b, 2, zero, GGML_TYPE_F32, 0, 64);
    expect_bad(&b, "absurd shape");
    const uint64_t ne33[1] = {33};
    one_tensor(&b, 1, ne33, GGML_TYPE_Q4_0, 0, 64);
    expect_bad(&b, "not a multiple");

    /* tensor name length past the end */
    b.len = 0;
    b_header(&b, 3, 1, 0);
    b_u64(&b, 1ull << 60);
    b_put(&b, "wwwwwwwwwwwwwwwwwwwwwwwwwwwwwwww", 32);
    expect_bad(&b, "past the end");

    /* duplicate tensor name */
    b.len = 0;
    b_header(&b, 3, 2, 0);
    b_tensor(&b, "w", 1, ne8, GGML_TYPE_F32, 0);
    b_tensor(&b, "w", 1, ne8, GGML_TYPE_F32, 32);
    b_pad(&b, 32);
    for (int i = 0; i < 64; i++) b_u8(&b, 0);
    expect_bad(&b, "duplicate tensor name 'w'");
}

TEST(gguf_open_missing_file) {
    char path[512];
    tmp_file(path, sizeof path, "does-not-exist.gguf");
    gguf_file f;
    ak_error err = {{0}};
    CHECK(gguf_open(&f, path, &err) < 0, "opened a missing file");
    CHECK(strstr(err.msg, path) && strstr(err.msg, "No such file"), "error '%s'", err.msg);
    CHECK(gguf_open(&f, test_tmp_dir(), &err) < 0, "opened a directory");
    CHECK(strstr(err.msg, test_tmp_dir()) != NULL, "error '%s'", err.msg);
}
