/* cachespec.h - what a model's KV cache looks like (its geometry).
 *
 * The one type both the block pool (blockpool.h: block sizes and layout) and
 * the sequences over it (kvcache.h) are sized from. It lives below both so
 * that the pool does not depend on the sequence interface above it.
 */
#ifndef AK_CACHESPEC_H
#define AK_CACHESPEC_H

/* The most layers a windowed spec (below) may name. */
#define AK_KV_MAX_LAYERS 256

/* LAYER GROUPS. A model whose layers all see the whole sequence has one
 * group: a block holds every layer. A model with sliding-window layers
 * (gemma3: 5 local layers to 1 global) has two: group 0 holds the global
 * layers, group 1 the local ones (window > 0, local[l] = 1). A sequence
 * then holds one block per group for each span of positions (kvcache.h),
 * each sized for its group's layers, so that a local group's blocks can
 * be released once they slide out of the window while the global group's
 * stay. Layers keep their order inside a group. */
#define AK_KV_MAX_GROUPS 2

/* What a model's cache looks like; derived from the GGUF metadata. */
typedef struct {
    int n_layer;
    int n_head_kv;
    int head_dim_k;
    int head_dim_v;
    int n_ctx;          /* the model's trained context length */
    int window;         /* positions a local layer sees; 0: no local layer (one group) */
    unsigned char local[AK_KV_MAX_LAYERS];   /* (n_layer, when window > 0) 1: layer l is local (group 1) */
} ak_cache_spec;

/* The group of layer l (0 global or all, 1 local). */
static inline int ak_spec_group(const ak_cache_spec *s, int l) {
    return s->window > 0 && l >= 0 && l < AK_KV_MAX_LAYERS && s->local[l] ? 1 : 0;
}

/* Number of layer groups: 2 when some layer is local, else 1. */
static inline int ak_spec_groups(const ak_cache_spec *s) {
    if (s->window <= 0) return 1;
    for (int l = 0; l < s->n_layer && l < AK_KV_MAX_LAYERS; l++)
        if (s->local[l]) return 2;
    return 1;
}

/* Layers in group g. */
static inline int ak_spec_group_layers(const ak_cache_spec *s, int g) {
    int n = 0;
    for (int l = 0; l < s->n_layer; l++) n += ak_spec_group(s, l) == g;
    return n;
}

/* The most positions a block may hold (a pool's block_tokens): the bound
 * attention's per-block scratch is sized for. */
#define AK_KV_MAX_BLOCK_TOKENS 4096

#endif
