/* LAYER text/ (src/text/): tokenizers, chat templates, resent
 * conversations, stop strings, sampling, the generation step.
 * Promises: text in, tokens out (and back) by the model's own rules; only
 * a template's own markup becomes control tokens; the generation step is
 * the one copy of the rules `agentkv run` and the server share. Runs no
 * model and holds no KV: the caller feeds logits and gets tokens.
 * May use: base. Used by: engine, agents, serve. The table:
 * scripts/check-layers.sh.
 *
 * tokenizer.h - text <-> token ids, built from a GGUF file's tokenizer.ggml.*
 * metadata. Reproduces llama.cpp's tokenizers for two model families:
 *
 *   "llama"  SentencePiece BPE: spaces become U+2581 ("▁"), a dummy-prefix space
 *            is added to the text (add_space_prefix, default on), adjacent
 *            pieces are merged best-score first; what does not form a token is
 *            written as byte tokens "<0xNN>".
 *   "gpt2"   byte-level BPE: the text is split into words by the regexes of the
 *            pre-tokenizer named in tokenizer.ggml.pre, each word's bytes are
 *            mapped to the GPT-2 printable alphabet and merged by the rank of
 *            the pair in tokenizer.ggml.merges.
 *
 * Special tokens. Before either algorithm runs, the text is cut at occurrences
 * of special tokens, longest token first (as llama.cpp does):
 *   - USER_DEFINED tokens are always cut out, as llama.cpp and Hugging Face
 *     do (e.g. DeepSeek's vocabulary has "ü" as a user-defined token);
 *   - CONTROL and UNKNOWN tokens ("<s>", "<|im_end|>", "<unk>") only with
 *     AK_TOK_PARSE_SPECIAL; otherwise their text is tokenized as plain text.
 *
 * Decoding. ak_token_bytes gives the bytes a token stands for: SPM "▁" -> " ",
 * "<0xNN>" -> that byte; BPE: the byte-level map reversed; CONTROL, UNKNOWN
 * and UNUSED tokens decode to nothing, except the control tokens of tool
 * calls ("<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]",
 * "[/THINK]": their text, for the reply parser); USER_DEFINED to their text. A token's
 * bytes need not be valid UTF-8 on their own (byte tokens, partial
 * characters): use ak_detok to turn a token stream into valid UTF-8 text.
 *
 * A tokenizer is immutable after loading; every function here may be called
 * from several threads at once on the same tokenizer.
 */
#ifndef AK_TOKENIZER_H
#define AK_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/gguf.h"
#include "base/util.h"

typedef struct ak_tokenizer ak_tokenizer;

/* Token types, as stored in tokenizer.ggml.token_type. */
enum {
    AK_TOKEN_UNDEFINED = 0, AK_TOKEN_NORMAL = 1, AK_TOKEN_UNKNOWN = 2, AK_TOKEN_CONTROL = 3,
    AK_TOKEN_USER_DEFINED = 4, AK_TOKEN_UNUSED = 5, AK_TOKEN_BYTE = 6
};

/* ak_tokenize flags. */
enum {
    AK_TOK_ADD_SPECIAL   = 1,  /* add BOS / EOS where the metadata asks for them */
    AK_TOK_PARSE_SPECIAL = 2,  /* turn the text of CONTROL tokens into those tokens */
    AK_TOK_CONTINUE      = 4   /* the text continues a sequence after a text token: SPM puts no
                                  dummy-prefix space at its start (it still does after a
                                  special token inside it) */
};

/* Builds the tokenizer described by f's metadata. Everything needed is
 * copied: f may be closed afterwards. Returns NULL with err set when the
 * metadata is missing, malformed or inconsistent (unknown model or
 * pre-tokenizer, arrays of the wrong type or length, a special token id out of
 * range). An id of 0xFFFFFFFF (or any negative id) means "no such token". */
ak_tokenizer *ak_tokenizer_load(const gguf_file *f, ak_error *err);

/* Frees everything; NULL is fine. */
void ak_tokenizer_free(ak_tokenizer *tk);

/* Tokenizes text[0..len) (any bytes; NUL is an ordinary byte). On success
 * returns 0 and stores a malloc'd array of *n_ids ids in *ids (the caller
 * frees it; it is non-NULL even when *n_ids is 0). On failure returns -1 with
 * err set, *ids NULL and *n_ids 0. Flags: AK_TOK_ADD_SPECIAL, AK_TOK_PARSE_SPECIAL.
 * Invalid UTF-8 is accepted: SPM writes the bytes as byte tokens; BPE replaces
 * each invalid byte by U+FFFD first, as llama.cpp does. */
int ak_tokenize(const ak_tokenizer *tk, const char *text, size_t len, int flags,
                int32_t **ids, size_t *n_ids, ak_error *err);

/* As ak_tokenize, where plain (NULL: none) marks bytes that no CONTROL or
 * UNKNOWN token may cover: plain[i] == 1 for text[i] that must stay text
 * even with AK_TOK_PARSE_SPECIAL (a chat message inside template markup).
 * A special token's text that overlaps a plain byte is tokenized as the text
 * around it is; USER_DEFINED tokens are cut out as always. With no plain byte
 * set the result is ak_tokenize's. */
int ak_tokenize_masked(const ak_tokenizer *tk, const char *text, size_t len, int flags, const uint8_t *plain,
                       int32_t **ids, size_t *n_ids, ak_error *err);

/* The bytes token id decodes to (see the decoding rules above); not
 * NUL-terminated, may be empty. Returns 0, or -1 if id is out of range (then
 * *bytes = "" and *len = 0). The pointer lives as long as tk. */
int ak_token_bytes(const ak_tokenizer *tk, int32_t id, const char **bytes, size_t *len);

/* The token's vocabulary string as stored in the file (e.g. "▁the", "Ġthe",
 * "<0x0A>", "<|im_end|>"). Returns 0, or -1 if id is out of range. */
int ak_token_text(const ak_tokenizer *tk, int32_t id, const char **text, size_t *len);

/* The id whose vocabulary string is exactly piece[0..len), or -1. */
int32_t ak_token_lookup(const ak_tokenizer *tk, const char *piece, size_t len);

/* AK_TOKEN_* type of id (after llama.cpp's fix-ups: end-of-turn tokens such as
 * "<|im_end|>" are CONTROL), or -1 if id is out of range. */
int ak_token_type(const ak_tokenizer *tk, int32_t id);

/* 1 if generating id ends the generation: EOS, EOT, EOM and the tokens
 * llama.cpp treats so by their text ("<|eot_id|>", "<|im_end|>", "<|end|>",
 * "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>"). 0 otherwise,
 * including ids out of range. */
int ak_token_is_eog(const ak_tokenizer *tk, int32_t id);

int32_t ak_tokenizer_vocab_size(const ak_tokenizer *tk);
/* Special ids, -1 when the vocabulary has none. EOT comes from
 * tokenizer.ggml.eot_token_id, or else is found by text like llama.cpp does. */
int32_t ak_tokenizer_bos(const ak_tokenizer *tk);
int32_t ak_tokenizer_eos(const ak_tokenizer *tk);
int32_t ak_tokenizer_eot(const ak_tokenizer *tk);
int32_t ak_tokenizer_unk(const ak_tokenizer *tk);
int32_t ak_tokenizer_pad(const ak_tokenizer *tk);
/* Whether AK_TOK_ADD_SPECIAL adds BOS / EOS (metadata, or the model's default:
 * llama yes/no, gpt2 no/no, gpt2 with a llama3 pre-tokenizer yes/no). */
int ak_tokenizer_add_bos(const ak_tokenizer *tk);
int ak_tokenizer_add_eos(const ak_tokenizer *tk);
/* Whether SPM text gets the dummy-prefix space. */
int ak_tokenizer_add_space_prefix(const ak_tokenizer *tk);
/* "llama" or "gpt2". */
const char *ak_tokenizer_model_name(const ak_tokenizer *tk);
/* tokenizer.ggml.pre as given ("default" when absent or for SPM). */
const char *ak_tokenizer_pre_name(const ak_tokenizer *tk);
/* Longest ak_token_bytes over the vocabulary. */
size_t ak_tokenizer_max_piece(const ak_tokenizer *tk);

/* Decodes ids[0..n) into one malloc'd NUL-terminated string of the raw token
 * bytes concatenated (not UTF-8-repaired; the SPM dummy-prefix space is kept).
 * Returns NULL with err set if an id is out of range. *len may be NULL. */
char *ak_detokenize(const ak_tokenizer *tk, const int32_t *ids, size_t n, size_t *len, ak_error *err);

/* ---- streaming decoder ----------------------------------------------------
 * Turns tokens, one at a time, into valid UTF-8. A character whose bytes are
 * split over several tokens (byte-fallback tokens, BPE pieces) is held back
 * until it is complete. Bytes that cannot become valid UTF-8 (stray
 * continuation bytes, overlong forms, surrogates, a sequence cut short) are
 * emitted as U+FFFD, one per maximal invalid subpart (the Unicode / WHATWG
 * rule), so the output is always valid UTF-8.
 *
 *   ak_detok d; ak_detok_init(&d);
 *   char out[...]; size_t n;                  // ak_detok_bound(tk) bytes
 *   for each id: ak_detok_push(&d, tk, id, out, sizeof out, &n) -> write out[0..n)
 *   at the end:  n = ak_detok_flush(&d, out, sizeof out)       -> write out[0..n)
 */
typedef struct {
    unsigned char pend[4];   /* a valid but incomplete UTF-8 prefix */
    unsigned n_pend;
} ak_detok;

void ak_detok_init(ak_detok *d);

/* Bytes one push or flush may write at most: 3 * (max piece + 3). */
size_t ak_detok_bound(const ak_tokenizer *tk);

/* Appends token id's bytes; writes the characters completed so far to out and
 * their byte count to *n_out. Returns 0; or -1 with nothing consumed or
 * written (*n_out = 0) if id is out of range or cap is smaller than this push
 * could need (3 bytes per held-back and per piece byte; ak_detok_bound(tk)
 * always suffices). */
int ak_detok_push(ak_detok *d, const ak_tokenizer *tk, int32_t id, char *out, size_t cap, size_t *n_out);

/* Ends the stream: writes U+FFFD for a held-back incomplete character (needs
 * cap >= 3, else writes nothing and returns 0 keeping the state), resets d,
 * and returns the number of bytes written (0 or 3). */
size_t ak_detok_flush(ak_detok *d, char *out, size_t cap);

#endif
