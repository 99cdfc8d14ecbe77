/* sampler.h - picking the next token from logits.
 *
 * Order of operations: the logit biases are added; llama.cpp's repetition
 * penalty over the last `repeat_last_n` tokens; OpenAI's frequency and
 * presence penalties over the tokens this sampler has returned (the
 * generated ones):
 *     logit[t] -= frequency_penalty * count[t] + presence_penalty * (count[t] > 0);
 * then greedy if temp <= 0; otherwise (as llama.cpp's default chain) top-k,
 * top-p, min-p, temperature, and a draw from the seeded RNG. The same seed
 * and the same logits give the same tokens. With no biases and both OpenAI
 * penalties 0 the logits are not touched by those steps at all.
 */
#ifndef AK_SAMPLER_H
#define AK_SAMPLER_H

#include <stdint.h>

#include "base/util.h"

/* An additive bias on one token's logit (OpenAI's logit_bias). */
typedef struct {
    int32_t id;
    float bias;
} ak_logit_bias;

typedef struct {
    float temp;            /* <= 0: greedy (argmax) */
    int top_k;             /* <= 0: off */
    float top_p;           /* >= 1: off */
    float min_p;           /* <= 0: off */
    float repeat_penalty;  /* 1: off */
    int repeat_last_n;     /* how many recent tokens the penalty looks at */
    uint64_t seed;
    float frequency_penalty;   /* 0: off; per time a token was generated */
    float presence_penalty;    /* 0: off; once for a token generated at all */
    const ak_logit_bias *logit_bias;   /* n_logit_bias entries (ids outside the
                                          vocabulary ignored); borrowed: the
                                          sampler keeps its own copy */
    int n_logit_bias;
} ak_sampler_params;

/* Defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, penalty 1.0 (off),
 * last_n 64, seed 0, no OpenAI penalties, no biases. */
ak_sampler_params ak_sampler_defaults(void);

typedef struct ak_sampler ak_sampler;

/* Returns NULL and sets err on bad parameters or out of memory. */
ak_sampler *ak_sampler_new(const ak_sampler_params *p, int vocab, ak_error *err);
void ak_sampler_free(ak_sampler *s);
/* Picks a token. logits (vocab floats) are modified in place (the biases
 * and penalties applied); history holds the tokens seen so far (prompt and
 * generated) for the repetition penalty. The token returned counts as
 * generated for the frequency and presence penalties of later calls.
 * Equal to ak_sample_prepare, ak_sample_pick and ak_sample_accept in turn. */
int32_t ak_sample(ak_sampler *s, float *logits, const int32_t *history, int n_history);

/* The steps of ak_sample apart, for a caller that rules tokens out between
 * them (constrained decoding: a token set to -INFINITY after prepare is
 * never picked) or picks again after refusing a pick.
 *   prepare: the biases and penalties added to logits in place;
 *   pick: greedy, or the truncations and a draw (the RNG advances), over
 *     the tokens whose logit is not -INFINITY; returns -1 when every logit
 *     is -INFINITY; the token is not recorded;
 *   accept: tok counts as generated for later penalties. */
void ak_sample_prepare(ak_sampler *s, float *logits, const int32_t *history, int n_history);
int32_t ak_sample_pick(ak_sampler *s, const float *logits);
void ak_sample_accept(ak_sampler *s, int32_t tok);
/* The vocabulary size the sampler was made for (the logits' length). */
int ak_sampler_vocab(const ak_sampler *s);
/* Index of the largest logit (first one on ties). */
int32_t ak_argmax(const float *logits, int n);

#endif
