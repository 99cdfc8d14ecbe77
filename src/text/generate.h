/* generate.h - the generation step: sample a token, check for the end,
 * turn it into text, look for stop strings.
 *
 * `agentkv run` and the server's scheduler generate by the same rules (so
 * that their greedy outputs agree); this is the one place they are written.
 * A generator holds the sampler's history (the prompt, then each token
 * kept), the streaming detokenizer's state, the text generated so far and
 * the stop strings. The caller runs the model: after each step that returns
 * AK_GEN_MORE it feeds the token out.tok at the next position and calls the
 * step again with the new logits.
 *
 * The rules, in order, at each step (pos: the position the sampled token
 * would take, i.e. the positions the cache holds):
 *   1. n_gen == max_tokens or pos >= n_ctx: AK_GEN_LENGTH, nothing sampled;
 *   2. a token is sampled; an end-of-generation token (when stop_at_eog)
 *      ends with AK_GEN_STOP and is not kept;
 *   3. the token is kept (history, n_gen) and its text appended;
 *   4. a stop string in the text (textstop.h) cuts the text where it starts:
 *      AK_GEN_STOP;
 *   5. n_gen reached max_tokens, or pos + 1 reached n_ctx (no room to feed
 *      it): AK_GEN_LENGTH; otherwise AK_GEN_MORE.
 * Not thread-safe: one generator per sequence, used by one thread.
 */
#ifndef AK_GENERATE_H
#define AK_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "text/sampler.h"
#include "text/tokenizer.h"
#include "base/util.h"

#define AK_GEN_MAX_STOP 16

typedef enum { AK_GEN_MORE, AK_GEN_STOP, AK_GEN_LENGTH, AK_GEN_ERROR } ak_gen_status;

typedef struct {
    const ak_tokenizer *tok;
    ak_sampler *smp;                  /* borrowed */
    int max_tokens, n_ctx, stop_at_eog;
    const char *stop[AK_GEN_MAX_STOP];   /* borrowed, non-empty */
    int n_stop;
    int32_t *hist;                    /* the prompt then the kept tokens (owned) */
    int n_hist, hist_cap;
    int n_gen;                        /* tokens kept */
    ak_detok dt;
    char *piece;                      /* the last step's new text (owned) */
    size_t piece_cap;
    char *text;                       /* the text so far, cut at a stop string (owned, NUL-terminated) */
    size_t len, cap;
    size_t visible;                   /* bytes of text that may be shown (textstop.h) */
    int stopped;                      /* the text was cut at a stop string */
} ak_gen;

/* What one step produced. */
typedef struct {
    int sampled;          /* a token was drawn (also an end-of-generation one) */
    int32_t tok;          /* that token */
    const char *piece;    /* the text it added (valid until the next call), before any cut */
    size_t n_piece;
    long cut;             /* >= 0: a stop string starts at this offset; the text ends there */
    size_t visible;       /* bytes of the text that may be shown now */
} ak_gen_out;

/* What a generator is set up with (ak_gen_init). */
typedef struct {
    const ak_tokenizer *tok;
    ak_sampler *smp;               /* borrowed, not freed */
    const int32_t *prompt;         /* prompt[0..n_prompt), copied into the history */
    int n_prompt;
    int max_tokens;                /* tokens kept at most */
    int n_ctx;                     /* positions of the context */
    int stop_at_eog;               /* an end-of-generation token ends it (rule 2) */
    const char *const *stop;       /* stop[0..n_stop): borrowed, must outlive g; none empty */
    int n_stop;                    /* at most AK_GEN_MAX_STOP */
} ak_gen_opts;

/* Sets g up for a sequence as o says. Returns 0, or -1 with err set
 * (AK_ERR_INVALID, AK_ERR_NOMEM); g is then safe to free. */
int ak_gen_init(ak_gen *g, const ak_gen_opts *o, ak_error *err);
/* Frees what g owns; a zeroed or freed g is fine. */
void ak_gen_free(ak_gen *g);

/* One step on logits (the model's output for the last position; the
 * sampler may change them) with the cache holding pos positions: the rules
 * in the header. Returns the status; AK_GEN_ERROR with err set when the
 * token cannot be decoded or memory runs out (the token is kept then). */
ak_gen_status ak_gen_step(ak_gen *g, float *logits, int pos, ak_gen_out *out, ak_error *err);

/* At the end: the bytes the detokenizer still held (an incomplete UTF-8
 * sequence, replaced as ak_detok_flush does) into *piece (valid until the
 * next call); returns their number, and appends them to the text. When the
 * text was cut at a stop string they lie after the cut: they are dropped
 * and 0 is returned, so that no caller shows bytes past a stop string.
 * 0 for a zeroed g. */
size_t ak_gen_flush(ak_gen *g, const char **piece);

#endif
