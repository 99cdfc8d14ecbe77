/* sampler.h - picking the next token from logits.
 *
 * Order of operations (as llama.cpp's default chain): repetition penalty over
 * the last `repeat_last_n` tokens, then greedy if temp <= 0; otherwise top-k,
 * top-p, min-p, temperature, and a draw from the seeded RNG. The same seed and
 * the same logits give the same tokens.
 */
#ifndef AK_SAMPLER_H
#define AK_SAMPLER_H

#include <stdint.h>

#include "util.h"

typedef struct {
    float temp;            /* <= 0: greedy (argmax) */
    int top_k;             /* <= 0: off */
    float top_p;           /* >= 1: off */
    float min_p;           /* <= 0: off */
    float repeat_penalty;  /* 1: off */
    int repeat_last_n;     /* how many recent tokens the penalty looks at */
    uint64_t seed;
} ak_sampler_params;

/* Defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, penalty 1.0 (off),
 * last_n 64, seed 0. */
ak_sampler_params ak_sampler_defaults(void);

typedef struct ak_sampler ak_sampler;

/* Returns NULL and sets err on bad parameters or out of memory. */
ak_sampler *ak_sampler_new(const ak_sampler_params *p, int vocab, ak_error *err);
void ak_sampler_free(ak_sampler *s);
/* Picks a token. logits (vocab floats) are modified in place; history holds
 * the tokens seen so far (prompt and generated). */
int32_t ak_sample(ak_sampler *s, float *logits, const int32_t *history, int n_history);
/* Index of the largest logit (first one on ties). */
int32_t ak_argmax(const float *logits, int n);

#endif
