/* attnstats.h - attention statistics: how much attention each token of a
 * sequence receives and how spread the attention each token gives is, the
 * importance signals a CacheCard's per-token bit widths are chosen from.
 *
 * Opt-in: an ak_attn_stats attached to a context (ak_ctx_set_attn_stats,
 * model.h) accumulates over every forward pass of that context until it is
 * detached (NULL, the default: the forward pass then only tests a pointer).
 * Attached or not, the logits and the cache are the same bits. An
 * ak_attn_stats is written during its context's forward passes: attach it
 * to one context at a time, and read it between passes.
 *
 * WHAT IS MEASURED. At each chosen layer l (a few: by default the first,
 * the middle n_layer/2 and the last), for each query token at cache slot q
 * of the tracked sequence and each query head h, the exact softmax
 * probabilities the layer's attention uses:
 *
 *   p[l,h,q](t) = exp(s(t)) / sum_u exp(s(u)),  s(t) = scale * Q[l,h,q] . K[l,g(h)](t)
 *
 * over the keys t the token sees: t <= q (causal), and t > q - window on a
 * sliding-window layer (gemma3's local layers). Q is the post-RoPE query the
 * forward pass used (MLA: with the key up-projection absorbed, as MLA scores
 * the cache), K the keys as attention reads them from the cache (dequantized,
 * centering added back: ak_kv_read), g(h) the KV head of query head h,
 * scale the model's attention scale. Scores and sums are in double, the
 * exponentials in float (relative error below 3e-7, vmath.h): probabilities
 * are exact to about 1e-6 relative.
 * From them, per slot of the sequence (n_l chosen layers, H query heads):
 *
 *   M[l,h](t)  = sum over query tokens q of p[l,h,q](t): the mass head h of
 *                layer l gives key t (every forward pass adds its queries);
 *   mass(t)    = sum over l, h of M[l,h](t). One query's probabilities sum
 *                to 1 per head, so one query adds n_l * H in all;
 *   mass_var(t)= (1 / n_l) sum over l of the population variance over h of
 *                M[l,h](t): how unevenly the heads of a layer attend to t
 *                (heads of different layers are not the same heads, so the
 *                variance is taken within a layer, then averaged);
 *   exposure(t)= the mean over l of the number of query tokens (over all
 *                passes) whose visible range held t: mass(t) / (n_l * H *
 *                exposure(t)) is the mean probability t got from a query
 *                that could see it (windows and re-evaluations included);
 *   entropy(q) = the mean over l, h and over the passes in which q was a
 *                query of -sum_t p[l,h,q](t) ln p[l,h,q](t), in nats: low
 *                when the token attends to few keys, ln(q + 1) at most.
 *
 * Positions are cache slots (what the forward pass's batch calls pos; a
 * context's RoPE position offset does not move them). A slot evaluated
 * again (a sequence truncated and refilled) adds again: reset to start over.
 *
 * WHICH TOKENS. Only tokens of the tracked sequence (ak_attn_stats_set_seq)
 * are counted, tokens of other sequences in the same batch are left alone;
 * with none set (the default), every token of every batch is counted at its
 * own slot, which is meaningful only when one sequence runs.
 *
 * COST. Per chosen layer and forward pass, the keys of the slots the batch's
 * tracked tokens see are read back once (ak_kv_read), and each query head
 * scores them again in double: about the work of the layer's attention
 * itself, on the context's threads. Memory: 2 * n_l * H doubles and n_l + 1
 * counters per slot.
 */
#ifndef AK_ATTNSTATS_H
#define AK_ATTNSTATS_H

#include <stdint.h>

#include "engine/model.h"
#include "base/threadpool.h"
#include "base/util.h"

/* Chosen layers at most. */
#define AK_ATTN_STATS_MAX_LAYERS 64

/* Statistics of model m at layers[0..n) (each in [0, n_layer); duplicates
 * are counted once, kept in increasing order), or the default first, middle
 * and last layers when layers is NULL or n is 0. Empty (length 0). Returns
 * NULL with err set (AK_ERR_INVALID: a layer out of range or more than
 * AK_ATTN_STATS_MAX_LAYERS; AK_ERR_NOMEM). */
ak_attn_stats *ak_attn_stats_new(const ak_model *m, const int *layers, int n, ak_error *err);
/* Frees st (NULL is fine). Detach it from every context first. */
void ak_attn_stats_free(ak_attn_stats *st);
/* Forgets everything measured (length 0); the layers, the tracked sequence
 * and the memory stay. */
void ak_attn_stats_reset(ak_attn_stats *st);
/* Counts only the tokens of kv from now on (NULL: every token). kv is only
 * compared, never read through this pointer outside a forward pass. */
void ak_attn_stats_set_seq(ak_attn_stats *st, const ak_kv *kv);

int ak_attn_stats_n_layers(const ak_attn_stats *st);
/* The i-th chosen layer (increasing), i < ak_attn_stats_n_layers. */
int ak_attn_stats_layer(const ak_attn_stats *st, int i);
/* Query heads per layer (H above). */
int ak_attn_stats_n_heads(const ak_attn_stats *st);
/* 1 + the highest slot seen as a key or a query: the arrays below have
 * this many entries. It grows with the sequence. */
int ak_attn_stats_length(const ak_attn_stats *st);

/* Fill out[0..length) (see the definitions above). Slots never seen as a
 * key have mass, variance and exposure 0; slots never seen as a query
 * entropy 0 (ak_attn_stats_query_count tells them apart). */
void ak_attn_stats_mass(const ak_attn_stats *st, double *out);
void ak_attn_stats_mass_var(const ak_attn_stats *st, double *out);
void ak_attn_stats_entropy(const ak_attn_stats *st, double *out);
void ak_attn_stats_exposure(const ak_attn_stats *st, double *out);
/* The number of forward passes in which each slot was a query token. */
void ak_attn_stats_query_count(const ak_attn_stats *st, int64_t *out);
/* M[l,h] of the i-th chosen layer, query head h: length entries, valid
 * until the next forward pass, reset or free. */
const double *ak_attn_stats_head_mass(const ak_attn_stats *st, int i, int h);

/* Called by the forward pass (forward.c) after layer `layer` wrote the batch's
 * keys into their sequences: q holds the batch's post-RoPE queries as the
 * layer scores the cache, token i's H heads at q + i * qstride, head_dim_k
 * floats each. Does nothing for a layer not chosen. Returns 0, or -1 with
 * err set (AK_ERR_NOMEM, a key that cannot be read back). */
int ak_attn_stats_observe(ak_attn_stats *st, ak_threads *pool, const ak_batch *b, int layer, const float *q,
                          size_t qstride, ak_error *err);

#endif
