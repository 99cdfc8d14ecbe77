/* calib.h - model-level calibration of the KV cache: the key and value
 * means used for centering (blockpool.h).
 *
 * The key (value) mean of a model is, for each layer and KV head, the
 * average of the keys (after RoPE, as the cache stores them) or values the
 * model produces over a
 * fixed calibration text built into this module (a mix of prose, dialogue,
 * technical notes, a list and code, written for the purpose; no evaluation
 * text). It depends only on the model and that text, so every process
 * computes the same mean for the same model on the same machine; its id
 * (CALIB_VERSION and a hash of the values) is what agent files record.
 *
 * Subtracting them before quantizing changes nothing in attention (the
 * means are added back exactly, see blockpool.h) but lets 4-, 3- and 2-bit
 * formats spend their levels on the vectors' spread instead of their common
 * offset. Computing them costs one forward pass over the text (about 900
 * tokens), so ak_calib_install does it only when a format gains from it
 * (ak_kv_format_centers).
 */
#ifndef AK_CALIB_H
#define AK_CALIB_H

#include "kv/blockpool.h"
#include "engine/model.h"
#include "text/tokenizer.h"

/* The built-in calibration text (NUL-terminated). */
const char *ak_calib_text(void);

/* A model's calibration (see above and blockpool.h): the key and value
 * means per layer and KV head ([layer][head][d] floats). id names both:
 * "c1-" and 16 hex digits of their hash. */
typedef struct {
    float *mu_k, *mu_v;
    char id[33];
} ak_calib;

/* Computes ctx's model's calibration over the built-in text, tokenized with
 * tk (a BOS first if the tokenizer adds one), in chunks of at most 512
 * tokens (fewer if the model's context is shorter), each its own sequence
 * with an f32 cache; the first position of each chunk is left out (the sink
 * token's vectors are atypical). Returns 0, or -1 with err set (out is then
 * empty). */
int ak_calib_compute(ak_ctx *ctx, const ak_tokenizer *tk, ak_calib *out, ak_error *err);
void ak_calib_free(ak_calib *c);

/* Which sides ak_calib_install centers. */
#define AK_CENTER_K 1u
#define AK_CENTER_V 2u

/* If keys of format fk (with AK_CENTER_K in sides) or values of format fv
 * (with AK_CENTER_V) gain from centering: computes the calibration and sets
 * those sides' means in pool (which must hold no block yet; the pool applies
 * each to the formats that gain). Otherwise does nothing. Returns 0, 1 if
 * means were installed, or -1 with err set. */
int ak_calib_install(ak_ctx *ctx, const ak_tokenizer *tk, ak_block_pool *pool, ak_kv_format fk, ak_kv_format fv,
                     unsigned sides, ak_error *err);

#endif
