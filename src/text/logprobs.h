/* logprobs.h - the model's log-probabilities of the tokens it generated.
 *
 * What OpenAI's `logprobs` / `top_logprobs` report: for each generated
 * token, log p(token) under the model's own distribution at that step, and
 * the k most likely tokens with theirs. "The model's own" means the
 * log-softmax of the raw logits, before logit biases, penalties,
 * temperature, top-k/p and any output constraint: the numbers say what the
 * model believed, not how it was sampled. Ties rank the lower id first.
 * Pure functions; no state.
 */
#ifndef AK_LOGPROBS_H
#define AK_LOGPROBS_H

#include <stdint.h>

#define AK_TOP_LOGPROBS_MAX 20

/* One token and its log-probability. */
typedef struct {
    int32_t id;
    float logprob;
} ak_token_lp;

/* log(sum(exp(logits[0..n)))), computed stably (max subtracted, summed in
 * double). n >= 1. A logit of -inf counts as probability 0; +inf or NaN
 * logits give a non-finite result, which callers report as they find it. */
double ak_logsumexp(const float *logits, int n);

/* The k (0..AK_TOP_LOGPROBS_MAX, capped at n) most likely of logits[0..n)
 * into top[0..k), most likely first, each with logits[id] - lse. Returns
 * the number written. */
int ak_top_logprobs(const float *logits, int n, double lse, int k, ak_token_lp *top);

#endif
