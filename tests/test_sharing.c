/* test_sharing.c - memory shared between sequences: a shared base whose last
 * block is partly filled (attention must read each block for the positions it
 * holds), blocks linked from the pool's content index, the index itself, and
 * the property that makes content addressing sound: a prefix's cache bits do
 * not depend on how its tokens were batched. */
#include <string.h>

#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "engine/model.h"
#include "test.h"

static ak_cache_spec small_spec(void) {
    ak_cache_spec s = {.n_layer = 2, .n_head_kv = 2, .head_dim_k = 16, .head_dim_v = 16, .n_ctx = 512};
    return s;
}

/* Random keys and values at positions [from, to) of every layer. */
static int fill_random(ak_kv *kv, const ak_cache_spec *s, int from, int to, ak_rng *rng) {
    ak_error err = {0};
    float k[64], v[64];
    if (ak_kv_prepare(kv, from, to, &err) != 0) return -1;
    for (int p = from; p < to; p++)
        for (int l = 0; l < s->n_layer; l++) {
            for (int i = 0; i < s->n_head_kv * s->head_dim_k; i++) k[i] = ak_rng_normal(rng);
            for (int i = 0; i < s->n_head_kv * s->head_dim_v; i++) v[i] = ak_rng_normal(rng);
            if (ak_kv_write(kv, l, p, k, v, &err) != 0) return -1;
        }
    return 0;
}

/* One KV head of a layer of kv (in spec s) and the attention scale: what
 * ref_attend reads. */
typedef struct {
    const ak_kv *kv;
    const ak_cache_spec *s;
    int l, h;
    float scale;
} ref_head;

/* Double-precision causal attention of query q on head r->h of layer r->l
 * at position `at` over the vectors r->kv reads back at [lo, at] into out
 * (head_dim_v): the reference. */
static void ref_attend(const ref_head *r, const float *q, int lo, int at, double *out) {
    const ak_kv *kv = r->kv;
    const ak_cache_spec *s = r->s;
    int l = r->l, h = r->h;
    float scale = r->scale;
    int d = s->head_dim_k, dv = s->head_dim_v;
    float k[64], v[64];
    double mx = -1e300, sum = 0, *sc = malloc(sizeof(double) * (size_t)(at + 1));
    for (int p = lo; p <= at; p++) {
        ak_kv_read(kv, l, p, k, v, NULL);
        double x = 0;
        for (int j = 0; j < d; j++) x += (double)q[j] * k[h * d + j];
        sc[p] = x * scale;
        if (sc[p] > mx) mx = sc[p];
    }
    for (int j = 0; j < dv; j++) out[j] = 0;
    for (int p = lo; p <= at; p++) {
        ak_kv_read(kv, l, p, k, v, NULL);
        double w = exp(sc[p] - mx);
        sum += w;
        for (int j = 0; j < dv; j++) out[j] += w * v[h * dv + j];
    }
    for (int j = 0; j < dv; j++) out[j] /= sum;
    free(sc);
}

/* Worst relative error of a prefill run of nt tokens from pos0 (window w)
 * against the reference, every layer and head. */
static double run_error(const ak_kv *kv, const ak_cache_spec *s, int pos0, int nt, int w, ak_rng *rng) {
    int d = s->head_dim_k, dv = s->head_dim_v;
    float *q = malloc(sizeof(float) * (size_t)nt * d), *out = malloc(sizeof(float) * (size_t)nt * dv);
    float *scratch = malloc(sizeof(float) * ak_kv_attend_run_scratch(kv, nt));
    double ref[64], worst = 0;
    float scale = 0.25f;
    for (int l = 0; l < s->n_layer; l++)
        for (int h = 0; h < s->n_head_kv; h++) {
            for (int i = 0; i < nt * d; i++) q[i] = ak_rng_normal(rng);
            ak_kv_attend_run_window(kv, &(ak_kv_query){.layer = l, .kv_head = h, .q = q, .qstride = (size_t)d, .n_q = 1,
                                    .scale = scale, .out = out, .ostride = (size_t)dv,
                                    .scratch = scratch}, nt, pos0, w);
            const ref_head rh = {.kv = kv, .s = s, .l = l, .h = h, .scale = scale};
            for (int t = 0; t < nt; t++) {
                int at = pos0 + t, lo = w > 0 && at - w + 1 > 0 ? at - w + 1 : 0;
                ref_attend(&rh, q + (size_t)t * d, lo, at, ref);
                double rm = 0, dm = 0;
                for (int j = 0; j < dv; j++) {
                    rm = fmax(rm, fabs(ref[j]));
                    dm = fmax(dm, fabs(ref[j] - out[(size_t)t * dv + j]));
                }
                worst = fmax(worst, dm / (rm > 1e-6 ? rm : 1e-6));
            }
        }
    free(q);
    free(out);
    free(scratch);
    return worst;
}

TEST(sharing_base_with_partial_block_attends_exactly) {
    ak_cache_spec s = small_spec();
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&s, 16, 0, &err);
    REQUIRE(pool, "%s", err.msg);
    ak_kv *src = ak_kv_new(pool, AK_KV_F32, AK_KV_F32, 200, &err), *kv = ak_kv_new(pool, AK_KV_F32, AK_KV_F32, 200, &err);
    REQUIRE(src && kv, "%s", err.msg);
    ak_rng rng;
    ak_rng_seed(&rng, 7);
    REQUIRE(fill_random(src, &s, 0, 45, &rng) == 0, "fill the source");
    REQUIRE(ak_kv_attach_base(kv, src, 45, &err) == 0, "attach: %s", err.msg);
    CHECK(ak_kv_length(kv) == 45 && ak_kv_base_len(kv) == 45, "length %d base %d", ak_kv_length(kv), ak_kv_base_len(kv));
    REQUIRE(fill_random(kv, &s, 45, 100, &rng) == 0, "fill own positions");
    /* 3 base blocks (16 + 16 + 13 positions) shared, 4 own blocks (55 positions from 45) */
    ak_block_pool_stats st;
    ak_block_pool_get_stats(pool, &st);
    size_t bb = ak_block_pool_block_bytes(pool, AK_KV_F32, AK_KV_F32);
    CHECK(st.blocks == 7, "7 blocks live, got %zu (the partial base block must not be copied)", st.blocks);
    CHECK(st.shared == 3 * bb && ak_kv_private_bytes(kv) == 4 * bb && ak_kv_bytes(kv) == 7 * bb,
          "shared %zu private %zu total %zu (block %zu)", st.shared, ak_kv_private_bytes(kv), ak_kv_bytes(kv), bb);
    int start, count;
    CHECK(ak_kv_span_count(kv) == 7, "spans %d", ak_kv_span_count(kv));
    CHECK(ak_kv_span(kv, 2, &start, &count) && start == 32 && count == 13, "base tail span %d+%d", start, count);
    CHECK(ak_kv_span(kv, 3, &start, &count) && start == 45 && count == 16, "first own span %d+%d", start, count);
    /* runs across the base's end, decode steps, windows */
    const int cases[][3] = {{0, 100, 0}, {40, 10, 0}, {44, 2, 0}, {45, 1, 0}, {99, 1, 0}, {30, 40, 7}, {60, 20, 20}};
    double worst = 0;
    for (int c = 0; c < 7; c++) worst = fmax(worst, run_error(kv, &s, cases[c][0], cases[c][1], cases[c][2], &rng));
    CHECK(worst < 1e-5, "attention over a base with a partial block: relative error %.3e", worst);
    printf("    max relative error vs double reference %.2e\n", worst);
    /* the source is untouched by the sharer's writes */
    float k0[64], v0[64], k1[64], v1[64];
    for (int p = 32; p < 45; p++) {
        ak_kv_read(src, 1, p, k0, v0, NULL);
        ak_kv_read(kv, 1, p, k1, v1, NULL);
        CHECK(!memcmp(k0, k1, sizeof(float) * 32) && !memcmp(v0, v1, sizeof(float) * 32), "base position %d differs", p);
    }
    ak_kv_free(kv);
    ak_kv_free(src);
    ak_block_pool_get_stats(pool, &st);
    CHECK(st.blocks == 0 && st.shared == 0 && st.logical == 0, "left %zu blocks, shared %zu, logical %zu", st.blocks,
          st.shared, st.logical);
    ak_block_pool_free(pool);
}

/* A card-like base of mixed blocks (each token's key and value in a width
 * of its own: 2, 4, 8 or 16 bits, rotated value formats among them), own
 * tokens after it: attention reads the mixed blocks in place and matches the
 * double reference over what they hold; each block is sized to its slots. */
/* one_class: each block's keys of one width and its values of one width
 * (a uniform-width card: decoded in place), rotated values in block 0,
 * plain ones in block 1; else each slot a width of its own. */
static void mixed_blocks_attend(ak_test_ctx *t, int one_class) {
    ak_cache_spec s = {.n_layer = 2, .n_head_kv = 2, .head_dim_k = 32, .head_dim_v = 32, .n_ctx = 512};
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&s, 16, 0, &err);
    REQUIRE(pool, "%s", err.msg);
    const ak_kv_format kf[4] = {AK_KV_Q2, AK_KV_Q4, AK_KV_Q8, AK_KV_F16};
    const ak_kv_format vf[4] = {AK_KV_TQ2, AK_KV_TQ4, AK_KV_Q8, AK_KV_F16};
    enum { N = 45 };
    int nb = (N + 15) / 16;
    ak_block *blocks[3];
    ak_rng rng;
    ak_rng_seed(&rng, 21);
    size_t want_bytes = 0;
    for (int i = 0; i < nb; i++) {
        ak_kv_format fk[16], fv[16];
        int cnt = i < nb - 1 ? 16 : N - 16 * i;
        for (int j = 0; j < cnt; j++) {
            fk[j] = kf[ak_rng_u32(&rng) % 4];
            fv[j] = vf[ak_rng_u32(&rng) % 4];
            if (one_class) {
                fk[j] = kf[(i + 1) % 4];
                fv[j] = vf[i == 0 ? 1 : (i + 1) % 4];   /* tq4 (rotated), then q8, f16 */
            }
            want_bytes += (size_t)s.n_layer * s.n_head_kv *
                          (ak_kv_format_get(fk[j])->vec_bytes(32) + ak_kv_format_get(fv[j])->vec_bytes(32));
        }
        blocks[i] = ak_block_alloc_mixed(pool, fk, fv, cnt, &err);
        REQUIRE(blocks[i], "mixed block %d: %s", i, err.msg);
    }
    ak_kv_format rot[1] = {AK_KV_TQ4}, ok1[1] = {AK_KV_Q8};
    CHECK(!ak_block_alloc_mixed(pool, rot, ok1, 1, &err) && err.code == AK_ERR_INVALID, "rotated keys must be refused");
    ak_kv *kv = ak_kv_new(pool, AK_KV_Q8, AK_KV_Q8, 200, &err);
    REQUIRE(kv && ak_kv_attach_blocks(kv, blocks, nb, N, &err) == 0, "attach: %s", err.msg);
    for (int i = 0; i < nb; i++) ak_block_unref(pool, blocks[i]);   /* the sequence holds them now */
    CHECK(ak_kv_bytes(kv) == want_bytes, "mixed blocks take %zu bytes, their slots %zu", ak_kv_bytes(kv), want_bytes);
    CHECK(ak_kv_has_mixed(kv), "has mixed");
    /* fill the card's positions, then own ones after it */
    float k[64], v[64];
    for (int p = 0; p < N; p++)
        for (int l = 0; l < s.n_layer; l++) {
            for (int i = 0; i < 64; i++) k[i] = ak_rng_normal(&rng) * (i % 8 == 1 ? 3.0f : 1.0f);
            for (int i = 0; i < 64; i++) v[i] = ak_rng_normal(&rng);
            REQUIRE(ak_kv_write(kv, l, p, k, v, &err) == 0, "write %d: %s", p, err.msg);
        }
    REQUIRE(fill_random(kv, &s, N, 80, &rng) == 0, "own positions");
    CHECK(ak_kv_stored(kv, 0, 0, 0, 0, 3) == NULL, "a mixed block's vectors are not agent-file components");
    const int cases[][3] = {{0, 80, 0}, {40, 10, 0}, {44, 1, 0}, {79, 1, 0}, {20, 30, 9}};
    double worst = 0;
    for (int c = 0; c < 5; c++) worst = fmax(worst, run_error(kv, &s, cases[c][0], cases[c][1], cases[c][2], &rng));
    CHECK(worst < 1e-5, "attention over mixed-width blocks (one class a side: %d): relative error %.3e", one_class,
          worst);
    printf("    mixed widths%s: max relative error vs double reference %.2e\n", one_class ? " (one class a side)" : "",
           worst);
    ak_kv_free(kv);
    ak_block_pool_stats st;
    ak_block_pool_get_stats(pool, &st);
    CHECK(st.used == 0 && st.mixed_bytes == 0 && st.blocks == 0, "left: %zu bytes, %zu mixed, %zu blocks", st.used,
          st.mixed_bytes, st.blocks);
    ak_block_pool_free(pool);
}

TEST(sharing_mixed_width_blocks_attend_exactly) {
    mixed_blocks_attend(t, 0);
    mixed_blocks_attend(t, 1);
}

TEST(sharing_truncate_inside_base_never_copies) {
    ak_cache_spec s = small_spec();
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&s, 16, 0, &err);
    ak_kv *src = ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 200, &err), *kv = ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 200, &err);
    REQUIRE(src && kv, "%s", err.msg);
    ak_rng rng;
    ak_rng_seed(&rng, 9);
    REQUIRE(fill_random(src, &s, 0, 45, &rng) == 0, "fill");
    REQUIRE(ak_kv_attach_base(kv, src, 45, &err) == 0, "%s", err.msg);
    CHECK(ak_kv_attach_base(kv, src, 45, &err) < 0 && err.code == AK_ERR_INVALID, "a second base must be refused");
    REQUIRE(fill_random(kv, &s, 45, 60, &rng) == 0, "fill");
    float before[64], v[64], after[64];
    ak_kv_read(src, 0, 38, before, v, NULL);
    ak_kv_truncate(kv, 37);   /* inside the base's second block */
    CHECK(ak_kv_base_len(kv) == 37 && ak_kv_length(kv) == 37, "base %d length %d", ak_kv_base_len(kv), ak_kv_length(kv));
    REQUIRE(fill_random(kv, &s, 37, 50, &rng) == 0, "write past the shortened base");
    ak_kv_read(src, 0, 38, after, v, NULL);
    CHECK(!memcmp(before, after, sizeof(float) * 32), "the source's block was written through the base");
    ak_block_pool_stats st;
    ak_block_pool_get_stats(pool, &st);
    /* source: 3 blocks, of which kv shares 3 (37 positions: 16 + 16 + 5); kv's own: 1 (37..50) */
    CHECK(st.blocks == 4, "%zu blocks live, want 4", st.blocks);
    ak_kv_free(kv);
    ak_kv_free(src);
    ak_block_pool_free(pool);
}

TEST(sharing_content_index_links_and_forgets) {
    ak_cache_spec s = small_spec();
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&s, 16, 0, &err);
    REQUIRE(pool, "%s", err.msg);
    ak_block_pool_set_model(pool, "model-a");
    int32_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = 100 + i;
    uint64_t h = ak_block_chain_hash(pool, 0, 0, tok, 16, AK_KV_Q8, AK_KV_Q4);
    /* every input changes the hash */
    CHECK(h != ak_block_chain_hash(pool, 1, 0, tok, 16, AK_KV_Q8, AK_KV_Q4), "parent ignored");
    CHECK(h != ak_block_chain_hash(pool, 0, 16, tok, 16, AK_KV_Q8, AK_KV_Q4), "position ignored");
    CHECK(h != ak_block_chain_hash(pool, 0, 0, tok, 15, AK_KV_Q8, AK_KV_Q4), "length ignored");
    CHECK(h != ak_block_chain_hash(pool, 0, 0, tok, 16, AK_KV_Q4, AK_KV_Q4), "K format ignored");
    CHECK(h != ak_block_chain_hash(pool, 0, 0, tok, 16, AK_KV_Q8, AK_KV_Q8), "V format ignored");
    tok[7]++;
    CHECK(h != ak_block_chain_hash(pool, 0, 0, tok, 16, AK_KV_Q8, AK_KV_Q4), "a token ignored");
    tok[7]--;
    ak_block_pool_set_model(pool, "model-b");
    CHECK(h != ak_block_chain_hash(pool, 0, 0, tok, 16, AK_KV_Q8, AK_KV_Q4), "model ignored");
    ak_block_pool_set_model(pool, "model-a");

    ak_kv *a = ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 100, &err), *b = ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 100, &err);
    ak_kv *c = ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 100, &err);
    REQUIRE(a && b && c, "%s", err.msg);
    ak_rng rng;
    ak_rng_seed(&rng, 3);
    REQUIRE(fill_random(a, &s, 0, 20, &rng) == 0 && fill_random(c, &s, 0, 16, &rng) == 0, "fill");
    CHECK(ak_block_pool_lookup(pool, h) == NULL, "empty index found a block");
    ak_block *blk = ak_kv_span(a, 0, NULL, NULL);
    CHECK(ak_block_pool_publish(pool, blk, h) == blk, "publish");
    CHECK(ak_block_pool_publish(pool, blk, h ^ 1) == NULL, "a block indexed twice under two hashes");
    /* c computed the same block again: publishing hands back a's, c replaces its copy */
    ak_block *cb = ak_kv_span(c, 0, NULL, NULL), *dup = ak_block_pool_publish(pool, cb, h);
    CHECK(dup == blk, "publishing a duplicate must return the indexed block");
    CHECK(dup && ak_kv_replace_span(c, 0, dup) == 0, "replace");
    ak_block_unref(pool, dup);
    ak_block_pool_stats st;
    ak_block_pool_get_stats(pool, &st);
    CHECK(st.blocks == 2 && st.indexed == 1, "blocks %zu indexed %zu", st.blocks, st.indexed);
    ak_block *found = ak_block_pool_lookup(pool, h);
    CHECK(found == blk, "lookup");
    CHECK(ak_kv_link(b, found, &err) == 0 && ak_kv_length(b) == 16, "link: %s", err.msg);
    ak_block_unref(pool, found);
    CHECK(ak_kv_link_point(b) == 16, "link point %d", ak_kv_link_point(b));
    REQUIRE(fill_random(b, &s, 16, 18, &rng) == 0, "fill after the link");
    CHECK(ak_kv_link_point(b) == -1, "18 is not a block boundary");
    CHECK(ak_kv_link(b, blk, &err) < 0 && err.code == AK_ERR_INVALID, "link off a boundary must fail");
    size_t bb = ak_block_pool_block_bytes(pool, AK_KV_Q8, AK_KV_Q4);
    ak_block_pool_get_stats(pool, &st);
    CHECK(ak_block_refcount(pool, blk) == 3 && st.shared == bb && st.logical == 5 * bb && st.used == 3 * bb,
          "refs %d shared %zu logical %zu used %zu (block %zu)", ak_block_refcount(pool, blk), st.shared, st.logical,
          st.used, bb);
    float k[64], v[64], k2[64], v2[64];
    ak_kv_read(a, 1, 9, k, v, NULL);
    ak_kv_read(b, 1, 9, k2, v2, NULL);
    CHECK(!memcmp(k, k2, sizeof(float) * 32) && !memcmp(v, v2, sizeof(float) * 32), "a linked block reads as the original");
    /* a holds the indexed block alone once b and c let go; rewriting part of
     * it must copy it, not change what the index names */
    ak_kv_free(b);
    ak_kv_free(c);
    CHECK(ak_block_refcount(pool, blk) == 1, "a alone holds the indexed block");
    ak_kv_truncate(a, 8);
    REQUIRE(fill_random(a, &s, 8, 16, &rng) == 0, "rewrite inside the indexed block");
    CHECK(ak_kv_span(a, 0, NULL, NULL) != blk, "the indexed block was written in place");
    found = ak_block_pool_lookup(pool, h);
    CHECK(found == NULL, "the index still names a block no sequence holds");
    ak_block_unref(pool, found);
    ak_kv_free(a);
    CHECK(ak_block_pool_lookup(pool, h) == NULL, "a freed block stayed in the index");
    ak_block_pool_get_stats(pool, &st);
    CHECK(st.indexed == 0 && st.blocks == 0, "indexed %zu blocks %zu", st.indexed, st.blocks);
    ak_block_pool_free(pool);
}

/* Every stored byte of positions [0, n) of a and b is equal. */
static int same_bits(const ak_kv *a, const ak_kv *b, const ak_cache_spec *s, int n, int *where) {
    size_t ck = ak_kv_format_code_bytes(ak_kv_format_k(a), s->head_dim_k);
    size_t mk = ak_kv_format_meta_bytes(ak_kv_format_k(a), s->head_dim_k);
    size_t cv = ak_kv_format_code_bytes(ak_kv_format_v(a), s->head_dim_v);
    size_t mv = ak_kv_format_meta_bytes(ak_kv_format_v(a), s->head_dim_v);
    for (int p = 0; p < n; p++)
        for (int l = 0; l < s->n_layer; l++)
            for (int h = 0; h < s->n_head_kv; h++)
                for (int iv = 0; iv < 2; iv++)
                    for (int c = 0; c < 2; c++) {
                        size_t len = iv ? (c ? mv : cv) : (c ? mk : ck);
                        if (!len) continue;
                        const uint8_t *x = ak_kv_stored(a, l, iv, c, h, p), *y = ak_kv_stored(b, l, iv, c, h, p);
                        if (!x || !y || memcmp(x, y, len)) {
                            *where = p;
                            return 0;
                        }
                    }
    return 1;
}

/* The cache of a prompt computed in one batch, in uneven chunks, and one
 * token at a time must hold the same bits: that is what lets a block
 * computed by one agent stand for the same prefix in another. */
static void check_batch_invariance(ak_test_ctx *t, const char *rel, ak_kv_format fk, ak_kv_format fv) {
    char path[512];
    ak_error err = {{0}};
    ak_model *m = ak_model_load(test_path(path, sizeof path, rel), NULL, NULL, &err);
    REQUIRE(m, "%s: %s", rel, err.msg);
    ak_ctx *ctx = ak_ctx_new(m, 64, 2, &err);
    ak_block_pool *pool = ak_block_pool_new(&m->spec, 16, 0, &err);
    REQUIRE(ctx && pool, "%s", err.msg);
    float *logits = malloc(sizeof(float) * (size_t)m->cfg.vocab);
    enum { N = 100 };
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = 1 + (i * 37 + 11) % (m->cfg.vocab - 1);
    ak_kv *kv[3];
    for (int w = 0; w < 3; w++) {
        kv[w] = ak_kv_new(pool, fk, fv, 256, &err);
        REQUIRE(kv[w], "%s", err.msg);
    }
    /* one batch (the ctx splits it at its max batch of 64) */
    CHECK(ak_eval(ctx, kv[0], &(ak_eval_args){.tokens = tok, .n = N, .logits = logits}, &err) == 0, "%s", err.msg);
    const int chunks[] = {7, 30, 1, 45, 17};
    for (int i = 0, at = 0; i < 5; at += chunks[i++])
        CHECK(ak_eval(ctx, kv[1], &(ak_eval_args){.tokens = tok + at, .n = chunks[i], .pos0 = at, .logits = logits},
                      &err) == 0, "%s", err.msg);
    for (int p = 0; p < N; p++)
        CHECK(ak_eval(ctx, kv[2], &(ak_eval_args){.tokens = tok + p, .n = 1, .pos0 = p, .logits = logits}, &err) == 0,
              "%s", err.msg);
    int where = -1;
    CHECK(same_bits(kv[0], kv[1], &m->spec, N, &where), "%s %s/%s: chunked prefill differs at position %d", rel,
          ak_kv_format_get(fk)->name, ak_kv_format_get(fv)->name, where);
    CHECK(same_bits(kv[0], kv[2], &m->spec, N, &where), "%s %s/%s: token-by-token differs at position %d", rel,
          ak_kv_format_get(fk)->name, ak_kv_format_get(fv)->name, where);
    for (int w = 0; w < 3; w++) ak_kv_free(kv[w]);
    free(logits);
    ak_block_pool_free(pool);
    ak_ctx_free(ctx);
    ak_model_free(m);
}

TEST(sharing_prefix_cache_bits_are_batch_invariant) {
    check_batch_invariance(t, "models/stories260K.gguf", AK_KV_F16, AK_KV_F16);
    check_batch_invariance(t, "models/stories260K.gguf", AK_KV_Q8, AK_KV_TQ3);
    check_batch_invariance(t, "models/tiny-llama-h64-gqa-f32.gguf", AK_KV_Q4, AK_KV_Q4);
}

/* ---- agents: automatic sharing and pools ------------------------------- */
#include "agents/agent.h"
#include "text/sampler.h"

typedef struct {
    ak_model *m;
    ak_ctx *ctx;
    float *logits;
} share_env;

static int share_env_open(ak_test_ctx *t, share_env *e, const char *rel) {
    char path[512];
    ak_error err = {{0}};
    memset(e, 0, sizeof *e);
    e->m = ak_model_load(test_path(path, sizeof path, rel), NULL, NULL, &err);
    e->ctx = e->m ? ak_ctx_new(e->m, 64, 2, &err) : NULL;
    e->logits = e->m ? malloc(sizeof(float) * (size_t)e->m->cfg.vocab) : NULL;
    if (!e->ctx || !e->logits) {
        ak_test_fail(t, __FILE__, __LINE__, "%s: %s", rel, err.msg);
        return -1;
    }
    return 0;
}

static void share_env_close(share_env *e) {
    ak_ctx_free(e->ctx);
    ak_model_free(e->m);
    free(e->logits);
}

/* A turn of agent o->id (o->pool_id may be NULL) with prompt
 * o->tokens[0..o->n) and n_gen greedy tokens into out. Returns 0, or -1
 * with a test failure recorded. */
static int pooled_turn(ak_test_ctx *t, share_env *e, ak_agents *ag, const ak_turn_opts *o, int n_gen, int32_t *out,
                       ak_turn *ti) {
    const char *id = o->id, *pool = o->pool_id;
    const int32_t *prompt = o->tokens;
    const int n = o->n;
    ak_error err = {{0}};
    ak_kv *kv;
    if (ak_agent_open(ag, &(ak_turn_opts){.id = id, .pool_id = pool, .tokens = prompt, .n = n,
                      .n_reserve = n + n_gen}, &kv, ti, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "open %s: %s", id, err.msg);
        return -1;
    }
    if (ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = prompt + ti->reused, .n = n - ti->reused, .pos0 = ti->reused,
                .logits = e->logits}, &err) < 0 || ak_agent_commit(ag, id, prompt, n, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "prefill %s: %s", id, err.msg);
        return -1;
    }
    for (int i = 0; i < n_gen; i++) {
        out[i] = ak_argmax(e->logits, e->m->cfg.vocab);
        if (i + 1 < n_gen && ak_agent_step(ag, e->ctx, id, out[i], e->logits, &err) < 0) {
            ak_test_fail(t, __FILE__, __LINE__, "step %s: %s", id, err.msg);
            return -1;
        }
    }
    if (ak_agent_end(ag, id, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "end %s: %s", id, err.msg);
        return -1;
    }
    return 0;
}

/* The reference: greedy tokens from a fresh private cache (formats fk/fv)
 * with the prompt prefilled in one go, in a pool of its own. */
static void private_greedy(share_env *e, ak_kv_format fk, ak_kv_format fv, const int32_t *prompt, int n, int n_gen,
                           int32_t *out) {
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&e->m->spec, 0, 0, &err);
    ak_kv *kv = ak_kv_new(pool, fk, fv, 512, &err);
    ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = prompt, .n = n, .logits = e->logits}, &err);
    for (int i = 0; i < n_gen; i++) {
        out[i] = ak_argmax(e->logits, e->m->cfg.vocab);
        ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = &out[i], .n = 1, .pos0 = n + i, .logits = e->logits}, &err);
    }
    ak_kv_free(kv);
    ak_block_pool_free(pool);
}

static ak_agents *share_agents_ex(share_env *e, ak_block_pool **pool, ak_store *store, ak_kv_format fk,
                                  ak_kv_format fv, int no_sharing) {
    ak_error err = {{0}};
    *pool = ak_block_pool_new(&e->m->spec, 0, 0, &err);
    ak_agents_config c = {.model = e->m, .pool = *pool, .store = store, .fk = fk, .fv = fv, .n_ctx = 512, .save = AK_SAVE_EVERY_TURN, .no_prefix_sharing = no_sharing};
    return *pool ? ak_agents_new(&c, &err) : NULL;
}

static ak_agents *share_agents(share_env *e, ak_block_pool **pool, ak_store *store, ak_kv_format fk, ak_kv_format fv) {
    return share_agents_ex(e, pool, store, fk, fv, 0);
}

/* 8 agents whose prompts start with one 200-token system prompt: its whole
 * blocks are computed once and held once, and every agent generates what a
 * private cache generates. */
static void common_prompt(ak_test_ctx *t, int no_sharing) {
    share_env e;
    if (share_env_open(t, &e, "models/stories260K.gguf") < 0) return;
    ak_block_pool *pool;
    ak_agents *ag = share_agents_ex(&e, &pool, NULL, AK_KV_Q8, AK_KV_Q4, no_sharing);
    REQUIRE(ag, "agents");
    enum { SYS = 200, OWN = 20, GEN = 8, NA = 8 };
    int32_t prompt[SYS + OWN], gen[GEN], ref[GEN];
    for (int i = 0; i < SYS; i++) prompt[i] = 1 + (i * 31 + 7) % 500;
    int T = ak_block_pool_block_tokens(pool);
    for (int k = 0; k < NA; k++) {
        char id[16];
        snprintf(id, sizeof id, "a%d", k);
        for (int i = 0; i < OWN; i++) prompt[SYS + i] = 1 + (k * 53 + i * 11) % 500;
        ak_turn ti;
        REQUIRE(pooled_turn(t, &e, ag, &(ak_turn_opts){.id = id, .tokens = prompt, .n = SYS + OWN}, GEN, gen, &ti) == 0,
                "turn %s", id);
        /* every whole block of the system prompt but the first agent's */
        int want = k == 0 || no_sharing ? 0 : SYS / T * T;
        CHECK(ti.reused == want && ti.shared == want, "%s reused %d shared %d, want %d", id, ti.reused, ti.shared, want);
        private_greedy(&e, AK_KV_Q8, AK_KV_Q4, prompt, SYS + OWN, GEN, ref);
        CHECK(!memcmp(gen, ref, sizeof gen), "%s: greedy output differs from a private cache's", id);
    }
    size_t bb = ak_block_pool_block_bytes(pool, AK_KV_Q8, AK_KV_Q4);
    int per_agent = (SYS + OWN + GEN - 1 + T - 1) / T, common = no_sharing ? 0 : SYS / T;
    ak_block_pool_stats st;
    ak_block_pool_get_stats(pool, &st);
    size_t want_used = (size_t)(common + NA * (per_agent - common)) * bb;
    CHECK(st.used == want_used, "%zu bytes held, want %zu (the common blocks once)", st.used, want_used);
    CHECK(st.shared == (size_t)common * bb, "shared %zu want %zu", st.shared, (size_t)common * bb);
    CHECK(st.logical == (size_t)NA * per_agent * bb, "logical %zu want %zu", st.logical, (size_t)NA * per_agent * bb);
    for (int i = 0; i < ak_agents_count(ag); i++) {
        ak_agent_info in;
        ak_agents_get(ag, i, &in);
        CHECK(in.bytes == (size_t)per_agent * bb && in.private_bytes == (size_t)(per_agent - common) * bb,
              "%s: bytes %zu private %zu", in.id, in.bytes, in.private_bytes);
    }
    ak_share_stats ss;
    ak_agents_share_stats(ag, &ss);
    CHECK(ss.linked_blocks == (uint64_t)(NA - 1) * common, "linked %llu blocks", (unsigned long long)ss.linked_blocks);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    share_env_close(&e);
}

TEST(sharing_agents_hold_a_common_prompt_once) { common_prompt(t, 0); }
TEST(sharing_off_holds_every_prompt_apart) { common_prompt(t, 1); }

/* Agents attached to a pool: answers equal a private cache's of the pool's
 * formats, the pool is held once (its partial last block too), and the
 * errors a client can cause are told apart by code. */
static void check_pool_answers(ak_test_ctx *t, const char *rel) {
    share_env e;
    if (share_env_open(t, &e, rel) < 0) return;
    ak_block_pool *pool;
    ak_agents *ag = share_agents(&e, &pool, NULL, AK_KV_F16, AK_KV_F16);
    REQUIRE(ag, "agents");
    enum { DOC = 150, OWN = 13, GEN = 10, NA = 3 };
    int32_t prompt[DOC + OWN], gen[GEN], ref[GEN];
    int vocab = e.m->cfg.vocab;
    for (int i = 0; i < DOC; i++) prompt[i] = 1 + (i * 29 + 3) % (vocab - 1);
    ak_error err = {{0}};
    REQUIRE(ak_pool_create(ag, e.ctx, &(ak_pool_request){.id = "doc", .tokens = prompt, .n = DOC, .fk = AK_KV_Q8,
                           .fv = AK_KV_TQ3, .source = "{\"text\":\"x\"}"}, NULL, NULL, &err) == 0,
            "create: %s", err.msg);
    CHECK(ak_pool_create(ag, e.ctx, &(ak_pool_request){.id = "doc", .tokens = prompt, .n = DOC, .fk = AK_KV_Q8,
                         .fv = AK_KV_TQ3}, NULL, NULL, &err) < 0 &&
              err.code == AK_ERR_EXISTS, "a second pool doc: code %d", err.code);
    int T = ak_block_pool_block_tokens(pool);
    size_t bb = ak_block_pool_block_bytes(pool, AK_KV_Q8, AK_KV_TQ3);
    for (int k = 0; k < NA; k++) {
        char id[16];
        snprintf(id, sizeof id, "p%d", k);
        for (int i = 0; i < OWN; i++) prompt[DOC + i] = 1 + (k * 41 + i * 17) % (vocab - 1);
        ak_turn ti;
        REQUIRE(pooled_turn(t, &e, ag, &(ak_turn_opts){.id = id, .pool_id = "doc", .tokens = prompt, .n = DOC + OWN},
                            GEN, gen, &ti) == 0, "turn %s", id);
        CHECK(ti.reused == DOC && ti.prefilled == OWN, "%s reused %d prefilled %d", id, ti.reused, ti.prefilled);
        private_greedy(&e, AK_KV_Q8, AK_KV_TQ3, prompt, DOC + OWN, GEN, ref);
        CHECK(!memcmp(gen, ref, sizeof gen), "%s (%s): greedy output with the pool differs from a private cache's", id, rel);
    }
    /* held: the pool's blocks once (the partial last one too), each agent's own */
    int pool_blocks = (DOC + T - 1) / T, own = (OWN + GEN - 1 + T - 1) / T;
    ak_block_pool_stats st;
    ak_block_pool_get_stats(pool, &st);
    CHECK(st.used == (size_t)(pool_blocks + NA * own) * bb, "%s: %zu bytes held, want %zu", rel, st.used,
          (size_t)(pool_blocks + NA * own) * bb);
    ak_pool_info pi;
    CHECK(ak_pool_get(ag, "doc", &pi, &err) == 0 && pi.n_tokens == DOC && pi.readers == NA && pi.resident &&
              pi.fk == AK_KV_Q8 && pi.fv == AK_KV_TQ3, "pool info: %d tokens, %d readers", pi.n_tokens, pi.readers);
    /* errors */
    ak_kv *kv;
    ak_turn ti;
    CHECK(ak_agent_open(ag, &(ak_turn_opts){.id = "q", .pool_id = "nope", .tokens = prompt, .n = DOC + 1,
                        .n_reserve = DOC + 1}, &kv, &ti, &err) < 0 &&
              err.code == AK_ERR_NOT_FOUND, "unknown pool: code %d (%s)", err.code, err.msg);
    CHECK(ak_agent_open(ag, &(ak_turn_opts){.id = "q", .pool_id = "../doc", .tokens = prompt, .n = DOC + 1,
                        .n_reserve = DOC + 1}, &kv, &ti, &err) < 0 &&
              err.code == AK_ERR_INVALID, "invalid pool id: code %d", err.code);
    prompt[5]++;
    CHECK(ak_agent_open(ag, &(ak_turn_opts){.id = "q", .pool_id = "doc", .tokens = prompt, .n = DOC + 1,
                        .n_reserve = DOC + 1}, &kv, &ti, &err) < 0 &&
              err.code == AK_ERR_INVALID, "a prompt that does not start with the pool: code %d", err.code);
    prompt[5]--;
    int32_t *big = calloc(600, sizeof *big);
    CHECK(ak_pool_create(ag, e.ctx, &(ak_pool_request){.id = "big", .tokens = big, .n = 512, .fk = AK_KV_Q8,
                         .fv = AK_KV_TQ3}, NULL, NULL, &err) < 0 &&
              err.code == AK_ERR_INVALID, "a pool as long as the context: code %d", err.code);
    free(big);
    CHECK(ak_pool_remove(ag, "doc", &err) < 0 && err.code == AK_ERR_BUSY && strstr(err.msg, "p0") &&
              strstr(err.msg, "p2"), "remove while attached: code %d: %s", err.code, err.msg);
    for (int k = 0; k < NA; k++) {
        char id[16];
        snprintf(id, sizeof id, "p%d", k);
        CHECK(ak_agent_remove(ag, id, &err) == 0, "remove %s", id);
    }
    CHECK(ak_pool_remove(ag, "doc", &err) == 0, "remove once unused: %s", err.msg);
    CHECK(ak_pool_get(ag, "doc", &pi, &err) < 0 && err.code == AK_ERR_NOT_FOUND, "removed pool still there");
    ak_block_pool_get_stats(pool, &st);
    CHECK(st.used == 0, "%zu bytes left after every agent and the pool went", st.used);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    share_env_close(&e);
}

TEST(sharing_pool_answers_equal_private_caches) {
    check_pool_answers(t, "models/stories260K.gguf");
    check_pool_answers(t, "models/tiny-llama-h64-gqa-f32.gguf");
    check_pool_answers(t, "models/qwen3-tiny.gguf");
}

/* ---- sharing with the store --------------------------------------------- */
#include <sys/stat.h>
#include "store/store.h"

static const char *share_dir(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", test_tmp_dir(), name);
    return buf;
}

/* 8 agents with one 200-token prompt, saved; after a restart their warm
 * restores read the prompt's blocks once: the first restore reads them, the
 * others link them (through the engine's own restore and through prefetch
 * jobs as the I/O thread runs them). */
TEST(sharing_warm_restores_read_a_common_prompt_once) {
    share_env e;
    if (share_env_open(t, &e, "models/stories260K.gguf") < 0) return;
    ak_error err = {{0}};
    ak_store *store = ak_store_open(share_dir("share-warm"), NULL, &err);
    REQUIRE(store, "%s", err.msg);
    enum { SYS = 200, OWN = 20, GEN = 4, NA = 8 };
    int32_t prompt[NA][SYS + OWN + GEN], gen[GEN], ref[GEN];
    ak_block_pool *pool;
    ak_agents *ag = share_agents(&e, &pool, store, AK_KV_Q8, AK_KV_Q4);
    REQUIRE(ag, "agents");
    for (int k = 0; k < NA; k++) {
        char id[16];
        snprintf(id, sizeof id, "w%d", k);
        for (int i = 0; i < SYS; i++) prompt[k][i] = 1 + (i * 31 + 7) % 500;
        for (int i = 0; i < OWN; i++) prompt[k][SYS + i] = 1 + (k * 53 + i * 11) % 500;
        ak_turn ti;
        REQUIRE(pooled_turn(t, &e, ag, &(ak_turn_opts){.id = id, .tokens = prompt[k], .n = SYS + OWN}, GEN, gen,
                            &ti) == 0, "turn %s", id);
        memcpy(prompt[k] + SYS + OWN, gen, sizeof gen);
    }
    REQUIRE(ak_agents_flush(ag, &err) == 0, "flush: %s", err.msg);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    /* restart: agents 0..3 restored at their turn, 4..7 by prefetch jobs */
    ag = share_agents(&e, &pool, store, AK_KV_Q8, AK_KV_Q4);
    REQUIRE(ag, "agents");
    int T = ak_block_pool_block_tokens(pool);
    uint64_t read[NA];
    int n = SYS + OWN + GEN - 1;   /* what each file holds */
    for (int k = 0; k < NA; k++) {
        char id[16];
        snprintf(id, sizeof id, "w%d", k);
        ak_turn ti;
        if (k >= NA / 2) {
            ak_restore_job *job = NULL;
            REQUIRE(ak_agent_prefetch(ag, id, 0, &job, &err) == 1, "prefetch %s: %s", id, err.msg);
            ak_restore_job_run(job);
            ak_agent_prefetch_done(ag, job);
        }
        REQUIRE(pooled_turn(t, &e, ag, &(ak_turn_opts){.id = id, .tokens = prompt[k], .n = n + 1}, GEN, gen, &ti) == 0,
                "warm turn %s", id);
        CHECK(ti.tier == AK_TIER_WARM && ti.reused == n, "%s: %s, reused %d of %d", id, ak_tier_name(ti.tier), ti.reused, n);
        read[k] = ti.restore_bytes;
        private_greedy(&e, AK_KV_Q8, AK_KV_Q4, prompt[k], n + 1, GEN, ref);
        CHECK(!memcmp(gen, ref, sizeof gen), "%s: greedy output after the warm restore differs from a private cache's", id);
    }
    /* the file holds ceil(n / T) blocks; later restores read only those past the common ones */
    int blocks = (n + T - 1) / T, common = SYS / T;
    for (int k = 1; k < NA; k++) {
        double want = (double)read[0] * (blocks - common) / blocks;
        CHECK(read[k] <= want * 1.05 + 4096 && read[k] >= want * 0.95, "w%d read %llu bytes, want ~%.0f (the first read %llu)", k,
              (unsigned long long)read[k], want, (unsigned long long)read[0]);
    }
    printf("    first warm restore read %llu bytes, the 7 others %llu each (common prompt: %d of %d blocks)\n",
           (unsigned long long)read[0], (unsigned long long)read[1], common, blocks);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_store_close(store);
    share_env_close(&e);
}

/* Pooled agents survive a restart as files that record the pool; a pool
 * that changed or vanished makes them a miss that is recomputed, never
 * garbage; a corrupt pool file and one made by another model are refused
 * by code. */
TEST(sharing_pools_persist_and_fail_clean) {
    share_env e;
    if (share_env_open(t, &e, "models/stories260K.gguf") < 0) return;
    ak_error err = {{0}};
    ak_store *store = ak_store_open(share_dir("share-pools"), NULL, &err);
    REQUIRE(store, "%s", err.msg);
    enum { DOC = 100, OWN = 12, GEN = 6 };
    int32_t prompt[DOC + OWN + GEN], gen[GEN], ref[GEN];
    for (int i = 0; i < DOC + OWN; i++) prompt[i] = 1 + (i * 29 + 3) % 500;
    ak_block_pool *pool;
    ak_agents *ag = share_agents(&e, &pool, store, AK_KV_F16, AK_KV_F16);
    REQUIRE(ag, "agents");
    REQUIRE(ak_pool_create(ag, e.ctx, &(ak_pool_request){.id = "doc", .tokens = prompt, .n = DOC, .fk = AK_KV_Q8,
                           .fv = AK_KV_TQ3, .source = "{\"text\":\"d\"}"}, NULL, NULL, &err) == 0,
            "create: %s", err.msg);
    ak_turn ti;
    REQUIRE(pooled_turn(t, &e, ag, &(ak_turn_opts){.id = "reader", .pool_id = "doc", .tokens = prompt, .n = DOC + OWN},
                        GEN, gen, &ti) == 0, "turn");
    memcpy(prompt + DOC + OWN, gen, sizeof gen);
    REQUIRE(ak_agents_flush(ag, &err) == 0, "flush: %s", err.msg);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    /* the agent's file holds only its own blocks */
    ak_store_entry se;
    REQUIRE(ak_store_lookup(store, "reader", &se) == 0, "no file for reader");
    CHECK(!strcmp(se.base.pool_id, "doc") && se.base.base_len == DOC && se.n_tokens == DOC + OWN + GEN - 1,
          "file base %s/%d, %d tokens", se.base.pool_id, se.base.base_len, se.n_tokens);
    ak_store_pool_entry pe;
    REQUIRE(ak_store_lookup_pool(store, "doc", &pe) == 0, "no pool file");
    free(pe.source);
    CHECK(se.bytes < pe.e.bytes, "the agent's file (%llu bytes) is not smaller than the pool's (%llu)",
          (unsigned long long)se.bytes, (unsigned long long)pe.e.bytes);

    /* restart: warm, linking the pool loaded from its file */
    int n = DOC + OWN + GEN - 1;
    ag = share_agents(&e, &pool, store, AK_KV_F16, AK_KV_F16);
    REQUIRE(ag, "agents");
    REQUIRE(pooled_turn(t, &e, ag, &(ak_turn_opts){.id = "reader", .tokens = prompt, .n = n + 1}, GEN, gen, &ti) == 0,
            "warm turn");
    CHECK(ti.tier == AK_TIER_WARM && ti.reused == n, "after a restart: %s, reused %d of %d", ak_tier_name(ti.tier),
          ti.reused, n);
    private_greedy(&e, AK_KV_Q8, AK_KV_TQ3, prompt, n + 1, GEN, ref);
    CHECK(!memcmp(gen, ref, sizeof gen), "greedy output after a pooled restore differs from a private cache's");
    ak_pool_info pi;
    CHECK(ak_pool_get(ag, "doc", &pi, &err) == 0 && pi.readers == 1 && pi.resident, "pool after restart: readers %d",
          pi.readers);
    ak_agents_free(ag);
    ak_block_pool_free(pool);

    /* the pool replaced behind the agents' back (another process): a miss */
    REQUIRE(ak_store_remove_pool(store, "doc", &err) == 0, "%s", err.msg);
    ag = share_agents(&e, &pool, store, AK_KV_F16, AK_KV_F16);
    prompt[3]++;
    REQUIRE(ak_pool_create(ag, e.ctx, &(ak_pool_request){.id = "doc", .tokens = prompt, .n = DOC, .fk = AK_KV_Q8,
                           .fv = AK_KV_TQ3}, NULL, NULL, &err) == 0, "%s", err.msg);
    prompt[3]--;
    REQUIRE(pooled_turn(t, &e, ag, &(ak_turn_opts){.id = "reader", .tokens = prompt, .n = n + 1}, GEN, gen, &ti) == 0,
            "turn after the pool changed");
    CHECK(ti.tier == AK_TIER_COLD && ti.reused == 0, "a changed pool: %s, reused %d", ak_tier_name(ti.tier), ti.reused);
    private_greedy(&e, AK_KV_F16, AK_KV_F16, prompt, n + 1, GEN, ref);
    CHECK(!memcmp(gen, ref, sizeof gen), "recomputed after the pool changed: output differs");
    ak_agents_free(ag);
    ak_block_pool_free(pool);

    /* a corrupt pool file: CORRUPT, quarantined, nothing else disturbed */
    char path[600];
    snprintf(path, sizeof path, "%s/pools/doc.safetensors", share_dir("share-pools"));
    struct stat sst;
    REQUIRE(stat(path, &sst) == 0, "no %s", path);
    FILE *f = fopen(path, "r+b");
    REQUIRE(f, "open %s", path);
    fseek(f, (long)sst.st_size - 100, SEEK_SET);
    int c = fgetc(f);
    fseek(f, (long)sst.st_size - 100, SEEK_SET);
    fputc(c ^ 0x5a, f);
    fclose(f);
    ag = share_agents(&e, &pool, store, AK_KV_F16, AK_KV_F16);
    ak_kv *kv;
    CHECK(ak_agent_open(ag, &(ak_turn_opts){.id = "other", .pool_id = "doc", .tokens = prompt, .n = DOC + 1,
                        .n_reserve = DOC + 1}, &kv, &ti, &err) < 0 &&
              err.code == AK_ERR_CORRUPT, "a corrupt pool: code %d: %s", err.code, err.msg);
    CHECK(ak_agent_open(ag, &(ak_turn_opts){.id = "other", .pool_id = "doc", .tokens = prompt, .n = DOC + 1,
                        .n_reserve = DOC + 1}, &kv, &ti, &err) < 0 &&
              err.code == AK_ERR_NOT_FOUND, "after quarantine the pool is gone: code %d: %s", err.code, err.msg);
    ak_agents_free(ag);
    ak_block_pool_free(pool);

    /* a pool made with another model */
    share_env e2;
    if (share_env_open(t, &e2, "models/tiny-llama-h64-gqa-f32.gguf") == 0) {
        ak_store *s2 = ak_store_open(share_dir("share-pools-2"), NULL, &err);
        ak_agents *a2 = share_agents(&e2, &pool, s2, AK_KV_F16, AK_KV_F16);
        REQUIRE(a2, "agents");
        REQUIRE(ak_pool_create(a2, e2.ctx, &(ak_pool_request){.id = "m2", .tokens = prompt, .n = 40, .fk = AK_KV_Q8,
                               .fv = AK_KV_TQ3}, NULL, NULL, &err) == 0, "%s", err.msg);
        ak_agents_free(a2);
        ak_block_pool_free(pool);
        ag = share_agents(&e, &pool, s2, AK_KV_F16, AK_KV_F16);
        CHECK(ak_agent_open(ag, &(ak_turn_opts){.id = "x", .pool_id = "m2", .tokens = prompt, .n = 41,
                            .n_reserve = 41}, &kv, &ti, &err) < 0 && err.code == AK_ERR_STALE,
              "a pool of another model: code %d: %s", err.code, err.msg);
        ak_agents_free(ag);
        ak_block_pool_free(pool);
        ak_store_close(s2);
        share_env_close(&e2);
    }
    ak_store_close(store);
    share_env_close(&e);
}
