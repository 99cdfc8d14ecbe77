/* perplexity.h - perplexity by llama.cpp's method.
 *
 * The token stream is cut into non-overlapping chunks of n_ctx tokens (a
 * trailing partial chunk is dropped). If bos >= 0 each chunk's first token is
 * replaced by it. In each chunk the tokens at positions n_ctx/2+1 .. n_ctx-1
 * are scored, each by the logits of the position before it, which have seen
 * all earlier tokens of the chunk. PPL = exp(mean negative log-likelihood).
 */
#ifndef AK_PERPLEXITY_H
#define AK_PERPLEXITY_H

#include "model.h"

typedef struct {
    double ppl;
    double ppl_stderr;
    double mean_nll;
    int chunks;
    long scored;
} ak_ppl_result;

/* Called after each chunk with the running perplexity (may be NULL). */
typedef void (*ak_ppl_chunk_fn)(void *ud, int chunk, int n_chunks, double ppl_so_far);

/* Computes the perplexity of ids[0..n) with chunks of n_ctx tokens, at most
 * max_chunks (0: all). kv must hold >= n_ctx positions; c's max batch may be
 * smaller than n_ctx. Returns 0, or -1 with err set (e.g. fewer tokens than
 * one chunk). */
int ak_perplexity(ak_ctx *c, ak_kv *kv, const int32_t *ids, size_t n, int n_ctx, int32_t bos, int max_chunks,
                  ak_ppl_chunk_fn cb, void *ud, ak_ppl_result *res, ak_error *err);

#endif
