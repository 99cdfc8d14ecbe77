/* sampler.c - see sampler.h */
#include "text/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct { float logit; int32_t id; } cand;

struct ak_sampler {
    ak_sampler_params p;
    int vocab;
    cand *c;      // (vocab) candidates, sorted by logit when needed
    float *w;     // (vocab) probabilities / weights of the candidates
    ak_rng rng;
    ak_logit_bias *bias;   // (p.n_logit_bias) the caller's biases, copied
    int32_t *count;        // (vocab) times each token was returned; NULL without OpenAI penalties
    int32_t *seen;         // (vocab) the tokens returned at least once, in first-return order
    int n_seen;
};

ak_sampler_params ak_sampler_defaults(void) {
    return (ak_sampler_params){
        .temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f, .repeat_last_n = 64,
    };
}

ak_sampler *ak_sampler_new(const ak_sampler_params *p, int vocab, ak_error *err) {
    if (vocab < 1) { ak_fail(err, "sampler: vocabulary of %d", vocab); return NULL; }
    if (!(p->repeat_penalty > 0)) { ak_fail(err, "sampler: repeat penalty must be > 0"); return NULL; }
    if (!(p->top_p > 0)) { ak_fail(err, "sampler: top-p must be > 0"); return NULL; }
    if (!isfinite(p->frequency_penalty) || !isfinite(p->presence_penalty)) {
        ak_fail(err, "sampler: penalties must be finite");
        return NULL;
    }
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias)) {
        ak_fail(err, "sampler: %d logit biases", p->n_logit_bias);
        return NULL;
    }
    ak_sampler *s = ak_calloc(1, sizeof *s, err);
    if (!s) return NULL;
    s->p = *p;
    s->p.logit_bias = NULL;   /* the copy below is the sampler's */
    s->vocab = vocab;
    s->c = ak_malloc((size_t)vocab * sizeof(cand), err);
    s->w = s->c ? ak_malloc((size_t)vocab * sizeof(float), err) : NULL;
    if (!s->w) { ak_sampler_free(s); return NULL; }
    if (p->n_logit_bias > 0) {
        if (!(s->bias = ak_malloc((size_t)p->n_logit_bias * sizeof *s->bias, err))) { ak_sampler_free(s); return NULL; }
        memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof *s->bias);
    }
    if (p->frequency_penalty != 0 || p->presence_penalty != 0) {
        s->count = ak_calloc((size_t)vocab, sizeof *s->count, err);
        s->seen = s->count ? ak_malloc((size_t)vocab * sizeof *s->seen, err) : NULL;
        if (!s->seen) { ak_sampler_free(s); return NULL; }
    }
    ak_rng_seed(&s->rng, p->seed);
    return s;
}

void ak_sampler_free(ak_sampler *s) {
    if (!s) return;
    free(s->c);
    free(s->w);
    free(s->bias);
    free(s->count);
    free(s->seen);
    free(s);
}

int32_t ak_argmax(const float *logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

static int cand_desc(const void *a, const void *b) {
    float x = ((const cand *)a)->logit, y = ((const cand *)b)->logit;
    if (x != y) return x < y ? 1 : -1;
    return ((const cand *)a)->id - ((const cand *)b)->id;
}

int32_t ak_sample_pick(ak_sampler *s, const float *logits) {
    const ak_sampler_params *p = &s->p;
    int V = s->vocab;
    if (p->temp <= 0) {
        int32_t best = ak_argmax(logits, V);
        return logits[best] == -INFINITY ? -1 : best;
    }

    /* tokens ruled out (-inf) are no candidates: a constrained step sorts
     * only what it may pick */
    int n = 0;
    for (int i = 0; i < V; i++)
        if (logits[i] != -INFINITY) { s->c[n].logit = logits[i]; s->c[n].id = i; n++; }
    if (n == 0) return -1;
    if (p->top_k > 0 && p->top_k < n) {
        /* partial selection would be faster; vocabularies are small enough */
        qsort(s->c, n, sizeof(cand), cand_desc);
        n = p->top_k;
    } else {
        qsort(s->c, n, sizeof(cand), cand_desc);
    }
    /* softmax of the remaining candidates (before temperature, as llama.cpp's
     * top-p and min-p see them) */
    float mx = s->c[0].logit;
    double sum = 0;
    float *prob = s->w;
    for (int i = 0; i < n; i++) { prob[i] = expf(s->c[i].logit - mx); sum += prob[i]; }
    for (int i = 0; i < n; i++) prob[i] = (float)(prob[i] / sum);
    if (p->top_p < 1.0f) {
        double cum = 0;
        for (int i = 0; i < n; i++) {
            cum += prob[i];
            if (cum >= p->top_p) { n = i + 1; break; }
        }
    }
    if (p->min_p > 0) {
        float thr = prob[0] * p->min_p;
        int k = 1;
        while (k < n && prob[k] >= thr) k++;
        n = k;
    }
    /* temperature, then draw */
    double tot = 0;
    float *w = s->w;
    for (int i = 0; i < n; i++) { w[i] = expf((s->c[i].logit - mx) / p->temp); tot += w[i]; }
    double r = ak_rng_uniform(&s->rng) * tot, acc = 0;
    int32_t pick = s->c[n - 1].id;
    for (int i = 0; i < n; i++) {
        acc += w[i];
        if (r < acc) { pick = s->c[i].id; break; }
    }
    return pick;
}

int ak_sampler_vocab(const ak_sampler *s) { return s->vocab; }

void ak_sample_accept(ak_sampler *s, int32_t tok) {
    if (s->count && tok >= 0 && tok < s->vocab && s->count[tok]++ == 0) s->seen[s->n_seen++] = tok;
}

int32_t ak_sample(ak_sampler *s, float *logits, const int32_t *history, int n_history) {
    ak_sample_prepare(s, logits, history, n_history);
    int32_t tok = ak_sample_pick(s, logits);
    if (tok < 0) tok = ak_argmax(logits, s->vocab);   /* every logit -inf: the first, as before */
    ak_sample_accept(s, tok);
    return tok;
}

void ak_sample_prepare(ak_sampler *s, float *logits, const int32_t *history, int n_history) {
    const ak_sampler_params *p = &s->p;
    int V = s->vocab;
    for (int i = 0; i < p->n_logit_bias; i++)
        if (s->bias[i].id >= 0 && s->bias[i].id < V) logits[s->bias[i].id] += s->bias[i].bias;
    if (p->repeat_penalty != 1.0f && p->repeat_last_n > 0) {
        /* penalize each distinct recent token once (as llama.cpp does) */
        int from = n_history > p->repeat_last_n ? n_history - p->repeat_last_n : 0;
        for (int i = from; i < n_history; i++) {
            int32_t t = history[i];
            if (t < 0 || t >= V) continue;
            int seen = 0;
            for (int j = from; j < i; j++)
                if (history[j] == t) { seen = 1; break; }
            if (seen) continue;
            logits[t] = logits[t] > 0 ? logits[t] / p->repeat_penalty : logits[t] * p->repeat_penalty;
        }
    }
    if (s->count) {
        /* OpenAI's formula, over the tokens generated so far (count > 0 exactly for the seen ones) */
        for (int i = 0; i < s->n_seen; i++) {
            int32_t t = s->seen[i];
            logits[t] -= p->frequency_penalty * (float)s->count[t] + p->presence_penalty;
        }
    }
}
