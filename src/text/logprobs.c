/* logprobs.c - log-probabilities of generated tokens (logprobs.h). */
#include "text/logprobs.h"

#include <math.h>

double ak_logsumexp(const float *logits, int n) {
    float mx = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > mx || logits[i] != logits[i]) mx = logits[i];
    if (!isfinite(mx)) return mx;
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)logits[i] - mx);
    return mx + log(s);
}

/* 1 when (a, ia) ranks above (b, ib): larger logit, then lower id. */
static int above(float a, int32_t ia, float b, int32_t ib) {
    return a > b || (a == b && ia < ib);
}

int ak_top_logprobs(const float *logits, int n, double lse, int k, ak_token_lp *top) {
    if (k > AK_TOP_LOGPROBS_MAX) k = AK_TOP_LOGPROBS_MAX;
    if (k > n) k = n;
    if (k <= 0) return 0;
    /* insertion into a sorted list of k: the vocabulary is scanned once and
     * almost every logit fails the first comparison with the k-th */
    float val[AK_TOP_LOGPROBS_MAX];
    int32_t ids[AK_TOP_LOGPROBS_MAX];
    int have = 0;
    for (int32_t i = 0; i < n; i++) {
        float v = logits[i];
        if (have == k && !above(v, i, val[k - 1], ids[k - 1])) continue;
        int j = have < k ? have++ : k - 1;
        while (j > 0 && above(v, i, val[j - 1], ids[j - 1])) {
            val[j] = val[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        val[j] = v;
        ids[j] = i;
    }
    for (int j = 0; j < have; j++) top[j] = (ak_token_lp){.id = ids[j], .logprob = (float)((double)val[j] - lse)};
    return have;
}
