/* gguf.h - reader (memory-mapped, fully bounds-checked) and writer for GGUF v3.
 *
 * File format (all integers little-endian):
 *
 *   header:
 *     u32  magic          "GGUF" = 0x46554747
 *     u32  version        3 (2 is read too: same layout)
 *     u64  n_tensors
 *     u64  n_kv
 *   n_kv metadata pairs:
 *     string key          (u64 length, then that many bytes, no NUL)
 *     u32    value_type   (gguf_type below)
 *     value:
 *       UINT8/INT8/BOOL: 1 byte; UINT16/INT16: 2; UINT32/INT32/FLOAT32: 4;
 *       UINT64/INT64/FLOAT64: 8; STRING: u64 length + bytes;
 *       ARRAY: u32 element type, u64 count, then count values of that type
 *              (arrays of strings are common: the tokenizer vocabulary;
 *               arrays of arrays are legal but unused and rejected here)
 *   n_tensors tensor infos:
 *     string name
 *     u32    n_dims       1..4
 *     u64    ne[n_dims]   elements per dimension, ne[0] is the fastest varying
 *     u32    type         ggml tensor type (gguf_tensor_type below)
 *     u64    offset       from the start of the data section; a multiple of
 *                         the alignment
 *   padding to a multiple of `general.alignment` (u32 metadata, default 32)
 *   data section: the tensors' bytes.
 *
 * A row of a tensor is ne[0] elements; quantized types store rows as blocks of
 * `gguf_type_block_elems` elements taking `gguf_type_block_bytes` bytes.
 *
 * Every count, length, offset and size is checked against the file size before
 * it is used; a malformed file is an error naming the file and the problem,
 * never a crash.
 */
#ifndef AK_GGUF_H
#define AK_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

#define GGUF_MAGIC 0x46554747u
#define GGUF_DEFAULT_ALIGNMENT 32

typedef enum {
    GGUF_TYPE_UINT8 = 0, GGUF_TYPE_INT8 = 1, GGUF_TYPE_UINT16 = 2, GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4, GGUF_TYPE_INT32 = 5, GGUF_TYPE_FLOAT32 = 6, GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8, GGUF_TYPE_ARRAY = 9, GGUF_TYPE_UINT64 = 10, GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12, GGUF_TYPE_COUNT
} gguf_type;

/* ggml tensor types (the numbering is the file format's). Only the types the
 * engine computes with are listed; others are reported by name as unsupported. */
typedef enum {
    GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6, GGML_TYPE_Q5_1 = 7, GGML_TYPE_Q8_0 = 8, GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10, GGML_TYPE_Q3_K = 11, GGML_TYPE_Q4_K = 12, GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14, GGML_TYPE_Q8_K = 15, GGML_TYPE_BF16 = 30, GGML_TYPE_COUNT = 40
} gguf_tensor_type;

typedef struct {
    uint64_t len;
    const char *data;     /* points into the mapping; NOT NUL-terminated */
} gguf_str;

typedef struct {
    gguf_str key;
    uint32_t type;        /* gguf_type */
    union {
        uint64_t u64;     /* any unsigned integer type, and BOOL */
        int64_t i64;      /* any signed integer type */
        double f64;       /* FLOAT32 and FLOAT64 */
        gguf_str str;
        struct {
            uint32_t type;        /* element type */
            uint64_t count;
            const uint8_t *data;  /* raw elements (numeric arrays) */
            gguf_str *strs;       /* element strings (string arrays), owned */
        } arr;
    } v;
} gguf_kv;

typedef struct {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[4];       /* unused dims are 1 */
    uint32_t type;        /* gguf_tensor_type */
    uint64_t offset;      /* relative to the data section */
    uint64_t nbytes;
    const void *data;     /* points into the mapping */
} gguf_tensor;

typedef struct {
    char path[512];
    void *map;            /* the whole file, read-only */
    size_t size;
    int owns_map;         /* 1 when map must be munmap'd */
    uint32_t version;
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset; /* file offset of the data section */
} gguf_file;

/* Opens and validates path (mmap). Returns 0 on success; -1 with err set to
 * "PATH: problem" on any failure, leaving f closed. */
int gguf_open(gguf_file *f, const char *path, ak_error *err);

/* Parses an in-memory image (not copied; must outlive f). Same checks as
 * gguf_open. `name` is used in error messages. */
int gguf_open_buffer(gguf_file *f, const void *buf, size_t size, const char *name, ak_error *err);

void gguf_close(gguf_file *f);

/* Metadata lookup: NULL when the key is absent. */
const gguf_kv *gguf_find(const gguf_file *f, const char *key);

/* Typed getters. Each returns 0 and stores the value if the key exists and has
 * a compatible type (any integer type for integers, FLOAT32/64 for floats);
 * returns -1 otherwise (and sets err if err != NULL, naming file and key). */
int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, ak_error *err);
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, ak_error *err);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, ak_error *err);
int gguf_get_bool(const gguf_file *f, const char *key, int *out, ak_error *err);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, ak_error *err);
/* Array of the given element type; count and kv pointer out. */
const gguf_kv *gguf_get_arr(const gguf_file *f, const char *key, uint32_t elem_type, ak_error *err);

/* Returns 1 if s equals the NUL-terminated c string. */
int gguf_str_eq(gguf_str s, const char *c);

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

const char *gguf_type_name(uint32_t type);          /* metadata value type */
/* Bytes of one numeric metadata value (or array element) of this type; 0 for
 * STRING, ARRAY and unknown types. */
size_t gguf_type_size(uint32_t type);
const char *gguf_tensor_type_name(uint32_t type);   /* "F32", "Q4_0", ... or "?" */
/* Elements and bytes per block; 0 for types the engine does not know. */
uint32_t gguf_type_block_elems(uint32_t type);
uint32_t gguf_type_block_bytes(uint32_t type);

/* ---- writer ---------------------------------------------------------------
 * Builds a GGUF file in memory (metadata and tensor infos) then streams the
 * tensor data. Usage: gguf_writer_init; add kvs and tensor infos (with their
 * final data sizes); gguf_writer_begin_data writes header + infos + padding;
 * gguf_writer_write_tensor for each tensor in the order added; then
 * gguf_writer_finish. All return 0 on success, -1 with err set. */
typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_open(const char *path, ak_error *err);
int gguf_writer_kv_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_kv_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_kv_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_kv_bool(gguf_writer *w, const char *key, int v);
int gguf_writer_kv_str(gguf_writer *w, const char *key, const char *v);
/* Array of strings (NUL-terminated) / of numeric elements (raw little-endian). */
int gguf_writer_kv_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n);
int gguf_writer_kv_arr_str_len(gguf_writer *w, const char *key, const gguf_str *v, uint64_t n);
int gguf_writer_kv_arr(gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n);
/* Declares a tensor; ne has n_dims entries. */
int gguf_writer_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne);
int gguf_writer_begin_data(gguf_writer *w);
/* Appends the bytes of the next declared tensor (may be called several times
 * per tensor to stream it; the writer pads when the byte count is reached). */
int gguf_writer_write(gguf_writer *w, const void *data, size_t n);
/* Closes the file; returns -1 (and removes nothing) if any step failed. */
int gguf_writer_close(gguf_writer *w, ak_error *err);

#endif
