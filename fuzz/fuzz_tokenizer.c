/* fuzz_tokenizer.c - libFuzzer target for the tokenizer (src/text/tokenizer.c):
 * loading from hostile GGUF metadata, tokenizing with and without special
 * tokens, streaming detokenization.
 *
 * Input layout:
 *   u16 LE  L, then L bytes: the text to tokenize (L past the end: all of
 *           what is left, and no GGUF)
 *   the rest  a GGUF image (vocabulary-only files: tokenizer.ggml.* metadata,
 *           no tensors)
 * When the image parses and the tokenizer loads, the text is tokenized with
 * each of the four flag combinations, every id is looked at (bytes, text,
 * type, eog), the ids are decoded in one go and streamed through ak_detok.
 * Checked, besides crashes and sanitizer reports:
 *   - every id returned is inside the vocabulary;
 *   - the streamed output is valid UTF-8 and no push writes past the bound
 *     that ak_detok_bound promises;
 *   - when the stream held nothing invalid (no U+FFFD appeared that the raw
 *     bytes did not have), it equals the raw concatenation of the pieces.
 * Run with `make fuzz FUZZ_TARGETS=tokenizer`. Seeds: fuzz/corpus/tokenizer/,
 * vocabularies of the shared models and golden files cut down to a few
 * hundred tokens (fuzz/mkseeds.py), each with a test string.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"
#include "utf8_check.h"

/* Streams ids through ak_detok into one buffer and checks it against the
 * raw bytes (see the contract above). */
static void stream(const ak_tokenizer *tk, const int32_t *ids, size_t n) {
    size_t bound = ak_detok_bound(tk);
    /* a guard zone after the bound: a push may not touch it */
    char *piece = malloc(bound + 64);
    size_t raw_len = 0;
    ak_error err = {{0}};
    char *raw = ak_detokenize(tk, ids, n, &raw_len, &err);
    if (!piece || !raw) __builtin_trap();
    size_t cap = 3 * raw_len + 16, len = 0;
    char *out = malloc(cap);
    if (!out) abort();
    ak_detok d;
    ak_detok_init(&d);
    for (size_t i = 0; i < n; i++) {
        memset(piece + bound, 0xA5, 64);
        size_t np = 0;
        if (ak_detok_push(&d, tk, ids[i], piece, bound, &np) < 0) __builtin_trap();
        if (np > bound) __builtin_trap();
        for (int k = 0; k < 64; k++)
            if ((unsigned char)piece[bound + k] != 0xA5) __builtin_trap();
        if (len + np > cap) __builtin_trap();   /* more than 3 bytes a raw byte */
        memcpy(out + len, piece, np);
        len += np;
    }
    size_t nf = ak_detok_flush(&d, piece, bound);
    if (len + nf > cap) __builtin_trap();
    memcpy(out + len, piece, nf);
    len += nf;
    if (!utf8_valid((unsigned char *)out, len)) __builtin_trap();
    if (utf8_valid((unsigned char *)raw, raw_len) && (len != raw_len || memcmp(out, raw, len)))
        __builtin_trap();   /* valid bytes must pass through unchanged */
    /* an id out of range is refused without consuming anything */
    size_t np = 7;
    if (ak_detok_push(&d, tk, ak_tokenizer_vocab_size(tk), piece, bound, &np) != -1 || np != 0)
        __builtin_trap();
    free(out);
    free(raw);
    free(piece);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    size_t tl = data[0] | (size_t)data[1] << 8;
    data += 2;
    size -= 2;
    if (tl >= size) return 0;
    const char *text = (const char *)data;
    gguf_file f;
    ak_error err = {{0}};
    if (gguf_open_buffer(&f, data + tl, size - tl, "tok-fuzz", &err) < 0) return 0;
    ak_tokenizer *tk = ak_tokenizer_load(&f, &err);
    gguf_close(&f);   /* the tokenizer copies what it needs */
    if (!tk) return 0;
    int32_t nv = ak_tokenizer_vocab_size(tk);
    (void)ak_tokenizer_model_name(tk);
    (void)ak_tokenizer_pre_name(tk);
    int32_t specials[] = {ak_tokenizer_bos(tk), ak_tokenizer_eos(tk), ak_tokenizer_eot(tk),
                          ak_tokenizer_unk(tk), ak_tokenizer_pad(tk)};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        if (specials[i] < -1 || specials[i] >= nv) __builtin_trap();
    for (int flags = 0; flags < 4; flags++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (ak_tokenize(tk, text, tl, flags, &ids, &n, &err) < 0) {
            if (ids || n) __builtin_trap();
            continue;
        }
        if (!ids) __builtin_trap();
        for (size_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= nv) __builtin_trap();
            const char *b, *t;
            size_t bl, tl2;
            if (ak_token_bytes(tk, ids[i], &b, &bl) < 0 || ak_token_text(tk, ids[i], &t, &tl2) < 0) __builtin_trap();
            if (bl > ak_tokenizer_max_piece(tk)) __builtin_trap();
            if (ak_token_lookup(tk, t, tl2) < 0) __builtin_trap();   /* its own text names a token */
            (void)ak_token_type(tk, ids[i]);
            (void)ak_token_is_eog(tk, ids[i]);
        }
        stream(tk, ids, n);
        free(ids);
    }
    ak_tokenizer_free(tk);
    return 0;
}
