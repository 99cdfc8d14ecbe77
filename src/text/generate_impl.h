/* generate_impl.h - the generator's constraint (generate_con.c) as
 * generate.c drives it. Internal to src/text/. */
#ifndef AK_GENERATE_IMPL_H
#define AK_GENERATE_IMPL_H

#include "text/generate.h"

/* Sets g->con up for c (c->grammar not NULL) over the tokenizer g->tok.
 * Returns 0, or -1 with err set (AK_ERR_INVALID: masks or vocab missing, a
 * rule not the grammar's; AK_ERR_NOMEM). */
int ak_gen_con_init(ak_gen *g, const ak_gen_constraint *c, ak_error *err);
/* Frees g->con (NULL is fine) and sets it NULL. */
void ak_gen_con_free(ak_gen *g);
/* Picks this step's token under the constraint from logits (the sampler's
 * biases and penalties applied, refused tokens set to -inf; the caller has
 * read the raw logits before), with `left` tokens left this step (>= 1),
 * and advances the constraint by it. *forced: the token was not sampled.
 * Returns the token, or -1 with err set (out of memory). */
int32_t ak_gen_con_pick(ak_gen *g, float *logits, long left, int *forced, ak_error *err);
/* After the token picked was kept: 1 when the constraint ends the
 * generation (the grammar finished and nothing may follow) with *st the
 * end (AK_GEN_LENGTH when it was cut by the budget, else AK_GEN_STOP);
 * else 0 (with free_after the generator is free again). */
int ak_gen_con_done(ak_gen *g, ak_gen_status *st);

#endif
