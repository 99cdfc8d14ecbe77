/* cachespec.h - what a model's KV cache looks like (its geometry).
 *
 * The one type both the block pool (blockpool.h: block sizes and layout) and
 * the sequences over it (kvcache.h) are sized from. It lives below both so
 * that the pool does not depend on the sequence interface above it.
 */
#ifndef AK_CACHESPEC_H
#define AK_CACHESPEC_H

/* What a model's cache looks like; derived from the GGUF metadata. */
typedef struct {
    int n_layer;
    int n_head_kv;
    int head_dim_k;
    int head_dim_v;
    int n_ctx;          /* the model's trained context length */
} ak_cache_spec;

/* The most positions a block may hold (a pool's block_tokens): the bound
 * attention's per-block scratch is sized for. */
#define AK_KV_MAX_BLOCK_TOKENS 4096

#endif
