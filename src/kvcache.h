/* kvcache.h - one sequence's KV cache, reached only through this interface.
 *
 * The forward pass writes the keys and values of new positions and asks for
 * attention over the first n positions; it never indexes cache memory itself.
 * This lets the storage become paged and quantized without touching the
 * forward pass. Today's storage: f16, contiguous per layer, [pos][kv_head][dim].
 */
#ifndef AK_KVCACHE_H
#define AK_KVCACHE_H

#include <stdint.h>

#include "util.h"

/* What a model's cache looks like; derived from the GGUF metadata. */
typedef struct {
    int n_layer;
    int n_head_kv;
    int head_dim_k;
    int head_dim_v;
    int n_ctx;          /* the model's trained context length */
} ak_cache_spec;

typedef struct ak_kv ak_kv;

/* A cache for up to n_ctx positions. Returns NULL and sets err on failure. */
ak_kv *ak_kv_new(const ak_cache_spec *spec, int n_ctx, ak_error *err);
void ak_kv_free(ak_kv *kv);
int ak_kv_capacity(const ak_kv *kv);
/* Number of positions written (the highest written position + 1). */
int ak_kv_length(const ak_kv *kv);
/* Forgets positions >= n (n <= length). */
void ak_kv_truncate(ak_kv *kv, int n);
/* Bytes of cache memory held. */
size_t ak_kv_bytes(const ak_kv *kv);

/* Stores the key (n_head_kv * head_dim_k floats) and value (n_head_kv *
 * head_dim_v floats) of one position of one layer. Returns 0, or -1 with err
 * set when pos is outside the capacity. */
int ak_kv_write(ak_kv *kv, int layer, int pos, const float *k, const float *v, ak_error *err);

/* out (head_dim_v floats) = softmax(q . K[0..n) * scale) . V[0..n) for query
 * vector q (head_dim_k floats) against kv head `kv_head` of `layer`. Online
 * softmax over chunks of positions: no O(n) scratch. n must be <= length. */
void ak_kv_attend(const ak_kv *kv, int layer, int kv_head, const float *q, int n, float scale, float *out);

#endif
