/* bench_reuse_data.h - the contexts `agentkv bench reuse` scores
 * (cli/cmd_bench_reuse.c), from running text or from memory notes:
 *
 *     [BOS if the model's tokenizer adds one] [chunk 1] ... [chunk k] [continuation]
 *
 * Every piece is tokenized as a memory is (ak_memory_tokenize: no BOS,
 * special-token text kept as text).
 *
 * Running text (brd_from_text): the text is cut into passages, in order: a
 * passage starts at a word and takes words until its own tokenization
 * reaches the wanted tokens and keeps the first that many; the next passage
 * starts at the next word. A context is the next k + 1 passages: k chunks of
 * exactly T tokens and a continuation of C.
 *
 * Notes (brd_from_notes): JSON lines (bench/make_notes.py writes them):
 *   {"type": "note", "id": "n1", "text": "..."}            a memory note
 *   {"type": "query", "id": "q1", "notes": ["n1", ...], "text": "..."}
 * other members and other types are ignored. A context per query, in file
 * order: its first k notes, each one whole chunk (one note, never a cut
 * across notes; a note of more than T tokens is cut to its first T, and
 * counted as truncated; a shorter one is not padded: chunks may differ in
 * length, as ak_reuse_prefill allows), placed in an order drawn from the
 * seed and the query's index (a Fisher-Yates shuffle with ak_rng seeded by
 * seed + 0x9E3779B97F4A7C15 * (query index + 1)), then the first C tokens
 * of the query's text as the continuation. A query naming fewer than k
 * notes or whose text has fewer than C tokens is skipped (counted).
 */
#ifndef AK_CLI_BENCH_REUSE_DATA_H
#define AK_CLI_BENCH_REUSE_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "base/util.h"
#include "text/tokenizer.h"

/* A context's shape. */
typedef struct {
    int n_pre;      /* 0, or 1: the BOS */
    int32_t bos;
    int k;          /* chunks */
    int T;          /* tokens per chunk: exactly (text), at most (notes) */
    int C;          /* continuation tokens */
} brd_shape;

/* The contexts. */
typedef struct {
    int n_ctx, k, n_pre, C;
    int32_t *toks;      /* every context's tokens, one after the other */
    size_t *off;        /* n_ctx + 1 entries: context x is toks[off[x] .. off[x + 1]) */
    int *lens;          /* n_ctx * k: tokens of chunk j of context x at lens[x * k + j] */
    char **ids;         /* notes: n_ctx * (k + 1) ids, per context the query's then its notes' in placed
                         * order (pointers into one allocation); NULL for running text */
    int n_truncated;    /* notes: chunks cut at T */
    int n_skipped;      /* notes: queries skipped (too few notes, a text shorter than C tokens) */
} brd_set;

/* Contexts from running text[0..len): at most max_ctx of them, fewer when
 * the text runs out. Returns how many (0: the text does not hold one), or
 * -1 with err set; *out is filled either way (brd_free it). */
int brd_from_text(const ak_tokenizer *tk, const char *text, size_t len, const brd_shape *sh, int max_ctx,
                  brd_set *out, ak_error *err);

/* Contexts from a notes file's text jsonl[0..len) (header comment), at most
 * max_ctx, the notes' order drawn from seed. Returns how many, or -1 with
 * err set (AK_ERR_INVALID: a line that is not a JSON object, a note or
 * query without a string id or text, a query naming an unknown note, two
 * notes with one id; the line number said); *out is filled either way
 * (brd_free it). */
int brd_from_notes(const ak_tokenizer *tk, const char *jsonl, size_t len, const brd_shape *sh, int max_ctx,
                   uint64_t seed, brd_set *out, ak_error *err);

/* Frees what s holds and empties it (a zeroed set is fine). */
void brd_free(brd_set *s);

/* Context x's tokens and count. */
static inline const int32_t *brd_ctx(const brd_set *s, int x) { return s->toks + s->off[x]; }
static inline int brd_ctx_len(const brd_set *s, int x) { return (int)(s->off[x + 1] - s->off[x]); }
/* Tokens of context x's chunks, summed. */
static inline int brd_chunk_tokens(const brd_set *s, int x) { return brd_ctx_len(s, x) - s->n_pre - s->C; }

#endif
