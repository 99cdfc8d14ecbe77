/* perplexity.h - perplexity by llama.cpp's method, and KL divergence of the
 * next-token distributions against a saved baseline.
 *
 * The token stream is cut into non-overlapping chunks of n_ctx tokens (a
 * trailing partial chunk is dropped). If bos >= 0 each chunk's first token is
 * replaced by it. In each chunk the tokens at positions n_ctx/2+1 .. n_ctx-1
 * are scored, each by the logits of the position before it, which have seen
 * all earlier tokens of the chunk. PPL = exp(mean negative log-likelihood).
 *
 * KL baseline file (little-endian), written by a first run and read by a
 * second one over the same text, model and n_ctx:
 *     char[8]  "AKKLBASE"
 *     u32      version (1)
 *     u32      top_k K
 *     u32      n_ctx
 *     u32      vocab
 *     u64      positions P (scored positions)
 *     u64      hash of the scored token ids (FNV-1a 64 over their int32 bytes)
 *     f64      baseline mean NLL
 *     P records: K x (i32 token id, f32 log-probability), sorted by
 *                probability, descending; then f32 log of the remaining mass.
 * The baseline is kept as its top K tokens plus one "rest" bucket (K = 32 by
 * default), and KL(base || new) is computed on that collapsed distribution:
 * exact for the mass in the top K, a lower bound for the tail.
 */
#ifndef AK_PERPLEXITY_H
#define AK_PERPLEXITY_H

#include "engine/model.h"

#define AK_KL_DEFAULT_TOP_K 32

typedef struct {
    double ppl;
    double ppl_stderr;
    double mean_nll;
    int chunks;
    long scored;
    /* with a KL baseline to compare against: */
    int have_kl;
    double base_ppl;
    double delta_ppl_pct;     /* (ppl - base_ppl) / base_ppl * 100 */
    double kl_mean;           /* mean KL(base || this) per position, nats */
    double kl_max;
    double top1_agree;        /* share of positions whose argmax agrees */
} ak_ppl_result;

/* Called after each chunk with the running perplexity (may be NULL). */
typedef void (*ak_ppl_chunk_fn)(void *ud, int chunk, int n_chunks, double ppl_so_far);

typedef struct {
    int max_chunks;           /* 0: all */
    int32_t bos;              /* < 0: don't replace chunk starts */
    const char *kl_base_out;  /* write the baseline here (may be NULL) */
    const char *kl_base_in;   /* compare against this baseline (may be NULL) */
    int kl_top_k;             /* 0: AK_KL_DEFAULT_TOP_K */
    ak_ppl_chunk_fn cb;
    void *ud;
} ak_ppl_opts;

/* Computes the perplexity of ids[0..n) with chunks of n_ctx tokens. kv must
 * hold >= n_ctx positions; c's max batch may be smaller than n_ctx. Returns 0,
 * or -1 with err set (fewer tokens than one chunk, a baseline that is
 * missing, truncated or for other tokens, an I/O error). */
int ak_perplexity(ak_ctx *c, ak_kv *kv, const int32_t *ids, size_t n, int n_ctx, const ak_ppl_opts *o,
                  ak_ppl_result *res, ak_error *err);

#endif
