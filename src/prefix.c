/* prefix.c - see prefix.h */
#include "prefix.h"

#include "blockpool.h"

/* Hash of span i of kv over tokens, given the hash of span i - 1. */
static uint64_t span_hash(const ak_kv *kv, uint64_t parent, int i, const int32_t *tokens) {
    int start = 0, count = 0;
    ak_kv_span(kv, i, &start, &count);
    return ak_block_chain_hash(ak_kv_pool(kv), parent, start, tokens + start, count, ak_kv_format_k(kv),
                               ak_kv_format_v(kv));
}

/* The chain hash of spans [0, upto_span), or 0 for none. */
static uint64_t chain_to(const ak_kv *kv, const int32_t *tokens, int upto_span) {
    uint64_t h = 0;
    for (int i = 0; i < upto_span; i++) h = span_hash(kv, h, i, tokens);
    return h;
}

int ak_prefix_link(ak_kv *kv, const int32_t *tokens, int upto) {
    int len0 = ak_kv_length(kv);
    if (ak_kv_link_point(kv) < 0) return 0;
    ak_block_pool *pool = ak_kv_pool(kv);
    int i = ak_kv_span_count(kv);
    uint64_t h = chain_to(kv, tokens, i);
    for (;; i++) {
        int start = 0, count = 0;
        if (!ak_kv_span(kv, i, &start, &count) && count == 0) break;
        if (start != ak_kv_length(kv) || start + count > upto) break;
        h = span_hash(kv, h, i, tokens);
        ak_block *b = ak_block_pool_lookup(pool, h);
        if (!b) break;
        int rc = ak_kv_link(kv, b, NULL);
        ak_block_unref(pool, b);   /* the lookup's reference: the sequence took its own */
        if (rc != 0) break;
    }
    return ak_kv_length(kv) - len0;
}

int ak_prefix_publish(ak_kv *kv, const int32_t *tokens, int n, int *next_span) {
    ak_block_pool *pool = ak_kv_pool(kv);
    int T = ak_block_pool_block_tokens(pool), base = ak_kv_base_len(kv), replaced = 0, i;
    uint64_t h = 0;
    /* the chain runs from block 0 (a few microseconds for thousands of
     * tokens); blocks before *next_span were published already */
    for (i = 0;; i++) {
        int start = 0, count = 0;
        ak_block *b = ak_kv_span(kv, i, &start, &count);
        if (!b || start + count > n) break;
        h = span_hash(kv, h, i, tokens);
        if (i < *next_span || start < base || count != T) continue;   /* the base is its owner's to publish */
        ak_block *r = ak_block_pool_publish(pool, b, h);
        if (r && r != b) {
            if (ak_kv_replace_span(kv, i, r) == 0) replaced++;
            ak_block_unref(pool, r);
        }
    }
    *next_span = i;
    return replaced;
}
