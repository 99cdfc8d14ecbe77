/* perplexity.c - see perplexity.h */
#include "perplexity.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* log-softmax of logits at index target, in double for the sum */
static double log_prob(const float *logits, int n, int target) {
    float mx = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    return (double)logits[target] - mx - log(sum);
}

int ak_perplexity(ak_ctx *c, ak_kv *kv, const int32_t *ids, size_t n, int n_ctx, int32_t bos, int max_chunks,
                  ak_ppl_chunk_fn cb, void *ud, ak_ppl_result *res, ak_error *err) {
    memset(res, 0, sizeof *res);
    int n_chunks = (int)(n / (size_t)n_ctx);
    if (max_chunks > 0 && n_chunks > max_chunks) n_chunks = max_chunks;
    if (n_ctx < 4) return ak_fail(err, "perplexity: context %d is too small", n_ctx);
    if (n_chunks < 1) return ak_fail(err, "perplexity: %zu tokens are fewer than one chunk of %d", n, n_ctx);
    if (ak_kv_capacity(kv) < n_ctx)
        return ak_fail(err, "perplexity: cache holds %d positions, chunks need %d", ak_kv_capacity(kv), n_ctx);
    int V = ak_ctx_model(c)->cfg.vocab, B = ak_ctx_max_batch(c), first = n_ctx / 2;
    int32_t *chunk = ak_malloc((size_t)n_ctx * sizeof(int32_t), err);
    int32_t *pos = ak_malloc((size_t)B * sizeof(int32_t), err);
    float **outs = ak_malloc((size_t)B * sizeof(float *), err);
    ak_kv **seqs = ak_malloc((size_t)B * sizeof(ak_kv *), err);
    /* logits only for the scored half of the chunk */
    float *logits = ak_malloc((size_t)(n_ctx - first) * V * sizeof(float), err);
    int rc = -1;
    if (!chunk || !pos || !outs || !seqs || !logits) goto out;
    double nll = 0, nll2 = 0;
    long scored = 0;
    for (int ch = 0; ch < n_chunks; ch++) {
        memcpy(chunk, ids + (size_t)ch * n_ctx, n_ctx * sizeof(int32_t));
        if (bos >= 0) chunk[0] = bos;
        ak_kv_truncate(kv, 0);
        for (int i0 = 0; i0 < n_ctx; i0 += B) {
            int cnt = n_ctx - i0 < B ? n_ctx - i0 : B;
            for (int j = 0; j < cnt; j++) {
                int p = i0 + j;
                pos[j] = p;
                seqs[j] = kv;
                outs[j] = (p >= first && p < n_ctx - 1) ? logits + (size_t)(p - first) * V : NULL;
            }
            ak_batch b = {cnt, chunk + i0, pos, seqs, outs};
            if (ak_forward(c, &b, err) < 0) goto out;
        }
        for (int p = first; p < n_ctx - 1; p++) {
            double lp = -log_prob(logits + (size_t)(p - first) * V, V, chunk[p + 1]);
            nll += lp;
            nll2 += lp * lp;
            scored++;
        }
        if (cb) cb(ud, ch + 1, n_chunks, exp(nll / scored));
    }
    res->chunks = n_chunks;
    res->scored = scored;
    res->mean_nll = nll / scored;
    res->ppl = exp(res->mean_nll);
    double var = nll2 / scored - res->mean_nll * res->mean_nll;
    res->ppl_stderr = scored > 1 && var > 0 ? res->ppl * sqrt(var / (scored - 1)) : 0;
    rc = 0;
out:
    free(chunk); free(pos); free(outs); free(seqs); free(logits);
    return rc;
}
