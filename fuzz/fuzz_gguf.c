/* fuzz_gguf.c - libFuzzer target for the GGUF reader.
 *
 * Parses the input with gguf_open_buffer and, when it is accepted, touches
 * every byte the reader claims is valid: each key, each string value, each
 * element of each array (every string of string arrays), each tensor name and
 * the first and last byte of each tensor's data, plus the lookup functions.
 * AddressSanitizer turns any claim that points outside the input into a
 * crash. Run with `make fuzz`.
 *
 * Seeds (fuzz/corpus/gguf/) were written with agentkv's own writer: a header-only
 * file, a file with every metadata type and several tensor types, and a tiny
 * llama (`agentkv synth --dim 32 --layers 1 --heads 2 --kv-heads 1 --ffn 64
 * --vocab 260 --tied --type q4_0`).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/gguf.h"

/* Folds bytes into h so that the reads cannot be optimized away. */
static uint64_t touch(uint64_t h, const void *p, uint64_t n) {
    const uint8_t *b = p;
    for (uint64_t i = 0; i < n; i++) h = h * 31 + b[i];
    return h;
}


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file f;
    ak_error err = {{0}};
    if (gguf_open_buffer(&f, data, size, "fuzz-input", &err) < 0) {
        /* a rejection must say why, naming the input */
        if (!strstr(err.msg, "fuzz-input")) __builtin_trap();
        return 0;
    }
    uint64_t h = 0;
    char key[256];
    for (uint64_t i = 0; i < f.n_kv; i++) {
        const gguf_kv *kv = &f.kv[i];
        h = touch(h, kv->key.data, kv->key.len);
        if (kv->type == GGUF_TYPE_STRING) {
            h = touch(h, kv->v.str.data, kv->v.str.len);
        } else if (kv->type == GGUF_TYPE_ARRAY) {
            if (kv->v.arr.type == GGUF_TYPE_STRING) {
                for (uint64_t j = 0; j < kv->v.arr.count; j++)
                    h = touch(h, kv->v.arr.strs[j].data, kv->v.arr.strs[j].len);
            } else {
                size_t es = gguf_type_size(kv->v.arr.type);
                if (!es) __builtin_trap();   /* the reader must reject unknown element types */
                h = touch(h, kv->v.arr.data, kv->v.arr.count * es);
            }
        }
        /* lookups by key (skipped for keys holding a NUL, which C strings
         * cannot name) */
        if (kv->key.len < sizeof key && !memchr(kv->key.data, 0, kv->key.len)) {
            memcpy(key, kv->key.data, kv->key.len);
            key[kv->key.len] = 0;
            uint64_t u;
            float fl;
            int b;
            gguf_str s;
            if (!gguf_find(&f, key)) __builtin_trap();
            gguf_get_u64(&f, key, &u, &err);
            gguf_get_f32(&f, key, &fl, &err);
            gguf_get_bool(&f, key, &b, &err);
            if (gguf_get_str(&f, key, &s, &err) == 0) h = touch(h, s.data, s.len);
            gguf_get_arr(&f, key, GGUF_TYPE_STRING, &err);
        }
    }
    for (uint64_t i = 0; i < f.n_tensors; i++) {
        const gguf_tensor *t = &f.tensors[i];
        h = touch(h, t->name.data, t->name.len);
        if (t->nbytes) {
            const uint8_t *d = t->data;
            h = h * 31 + d[0] + d[t->nbytes - 1];
        }
        if (t->n_dims < 1 || t->n_dims > 4 || !gguf_type_block_elems(t->type)) __builtin_trap();
        if (t->name.len < sizeof key && !memchr(t->name.data, 0, t->name.len)) {
            memcpy(key, t->name.data, t->name.len);
            key[t->name.len] = 0;
            if (!gguf_find_tensor(&f, key)) __builtin_trap();
        }
        (void)gguf_tensor_type_name(t->type);
    }
    gguf_close(&f);
    /* keep h observable */
    volatile uint64_t sink = h;
    (void)sink;
    return 0;
}
