/* prefix.c - see prefix.h */
#include "kv/prefix.h"

#include <stdlib.h>

#include "kv/blockpool.h"

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

/* The index name of the local group's block of the span whose (global)
 * name is h (kvcache.h LAYER GROUPS): a chain hash no span has (position
 * -1, no tokens), over h. */
static uint64_t local_hash(const ak_kv *kv, uint64_t h) {
    return ak_block_chain_hash(ak_kv_pool(kv), h, -1, NULL, 0, ak_kv_format_k(kv), ak_kv_format_v(kv));
}

/* ak_prefix_link for a sequence of two layer groups. The spans are found
 * first (a global block each, and its local one where indexed), then as
 * many linked as leave every span the window of the new length shows with
 * its local block; the spans before that window are linked as released
 * when the sequence holds no local block before its length (else they
 * need theirs too). */
static int link_groups(ak_kv *kv, const int32_t *tokens, int upto) {
    ak_block_pool *pool = ak_kv_pool(kv);
    const int len0 = ak_kv_length(kv), W = ak_block_pool_spec(pool)->window, T = ak_block_pool_block_tokens(pool);
    const int bare = ak_kv_window_first(kv) == len0;
    int i0 = ak_kv_span_count(kv), n = 0, cap = 0;
    ak_block **g = NULL, **l = NULL;
    uint64_t h = chain_to(kv, tokens, i0);
    for (int i = i0;; i++) {
        int start = 0, count = 0;
        if (!ak_kv_span(kv, i, &start, &count) && count == 0) break;
        if (start != len0 + n * T || count != T || start + count > upto) break;
        h = span_hash(kv, h, i, tokens);
        ak_block *b = ak_block_pool_lookup(pool, h);
        if (!b) break;
        if (n == cap) {
            int nc = cap ? 2 * cap : 16;
            ak_block **ng = realloc(g, sizeof *ng * (size_t)nc), **nl = ng ? realloc(l, sizeof *nl * (size_t)nc) : NULL;
            if (ng) g = ng;
            if (!nl) {
                ak_block_unref(pool, b);
                break;
            }
            l = nl;
            cap = nc;
        }
        g[n] = b;
        l[n++] = ak_block_pool_lookup(pool, local_hash(kv, h));
    }
    /* the most spans k whose new length's window finds every local block */
    int k = n;
    for (; k > 0; k--) {
        int end = len0 + k * T, ok = 1;
        for (int j = 0; j < k && ok; j++) ok = l[j] || (bare && len0 + (j + 1) * T <= end - W);
        if (ok) break;
    }
    for (int j = 0; j < k; j++) {
        int before = bare && len0 + (j + 1) * T <= len0 + k * T - W;   /* outside the final window */
        if (ak_kv_link_groups(kv, g[j], before ? NULL : l[j], NULL) != 0) break;
    }
    for (int j = 0; j < n; j++) {   /* the lookups' references: the sequence took its own */
        ak_block_unref(pool, g[j]);
        ak_block_unref(pool, l[j]);
    }
    free(g);
    free(l);
    return ak_kv_length(kv) - len0;
}

int ak_prefix_link(ak_kv *kv, const int32_t *tokens, int upto) {
    int len0 = ak_kv_length(kv);
    if (ak_kv_link_point(kv) < 0) return 0;
    if (ak_kv_groups(kv) > 1) return link_groups(kv, tokens, upto);
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
        /* the local group's block under its own name (none once released):
         * one computed twice stays, as the global one of such a sequence */
        ak_block *lb = ak_kv_local_span(kv, i);
        if (lb && (r = ak_block_pool_publish(pool, lb, local_hash(kv, h))) && r != lb) ak_block_unref(pool, r);
    }
    *next_span = i;
    return replaced;
}
