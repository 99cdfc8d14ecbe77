/* test_kvcache.c - the block pool and attention on stored formats.
 * Attention is checked against a double-precision reference computed over the
 * dequantized cache (what the kernel must compute exactly, up to rounding). */
#include <string.h>

#include "../src/blockpool.h"
#include "../src/kvcache.h"
#include "test.h"

static ak_cache_spec spec_of(int layers, int kv_heads, int d, int n_ctx) {
    ak_cache_spec s = {layers, kv_heads, d, d, n_ctx};
    return s;
}

/* Fills positions [0, n) of every layer with random vectors (heavy channels
 * in keys, like real models). */
static int fill(ak_kv *kv, const ak_cache_spec *s, int from, int n, ak_rng *rng) {
    ak_error err = {{0}};
    int nk = s->n_head_kv * s->head_dim_k, nv = s->n_head_kv * s->head_dim_v;
    float *k = malloc(sizeof(float) * nk), *v = malloc(sizeof(float) * nv);
    int rc = ak_kv_prepare(kv, from, n, &err);
    for (int p = from; rc == 0 && p < n; p++)
        for (int l = 0; l < s->n_layer && rc == 0; l++) {
            for (int i = 0; i < nk; i++) k[i] = ak_rng_normal(rng) * (i % 8 == 1 ? 3.0f : 1.0f);
            for (int i = 0; i < nv; i++) v[i] = ak_rng_normal(rng);
            rc = ak_kv_write(kv, l, p, k, v, &err);
        }
    free(k);
    free(v);
    return rc;
}

/* max relative error of ak_kv_attend vs a double reference over the
 * dequantized cache, for every layer / KV head */
static double attention_error(const ak_kv *kv, const ak_cache_spec *s, int group, int n, ak_rng *rng) {
    int dk = s->head_dim_k, dv = s->head_dim_v, nk = s->n_head_kv * dk, nv = s->n_head_kv * dv;
    float *K = malloc(sizeof(float) * (size_t)n * nk), *V = malloc(sizeof(float) * (size_t)n * nv);
    float *q = malloc(sizeof(float) * group * dk), *out = malloc(sizeof(float) * group * dv);
    float *scratch = malloc(sizeof(float) * ak_kv_attend_scratch(s, group));
    double *sc = malloc(sizeof(double) * n), worst = 0;
    float scale = 1.0f / sqrtf((float)dk);
    for (int l = 0; l < s->n_layer; l++) {
        for (int p = 0; p < n; p++) ak_kv_read(kv, l, p, K + (size_t)p * nk, V + (size_t)p * nv, NULL);
        for (int h = 0; h < s->n_head_kv; h++) {
            for (int i = 0; i < group * dk; i++) q[i] = ak_rng_normal(rng);
            ak_kv_attend(kv, l, h, q, group, n, scale, out, scratch);
            for (int g = 0; g < group; g++) {
                double mx = -1e300, sum = 0;
                for (int p = 0; p < n; p++) {
                    double d = 0;
                    for (int j = 0; j < dk; j++) d += (double)q[g * dk + j] * K[(size_t)p * nk + h * dk + j];
                    sc[p] = d * scale;
                    if (sc[p] > mx) mx = sc[p];
                }
                for (int p = 0; p < n; p++) { sc[p] = exp(sc[p] - mx); sum += sc[p]; }
                double ref_max = 0, diff_max = 0;
                for (int j = 0; j < dv; j++) {
                    double r = 0;
                    for (int p = 0; p < n; p++) r += sc[p] * V[(size_t)p * nv + h * dv + j];
                    r /= sum;
                    if (fabs(r) > ref_max) ref_max = fabs(r);
                    double e = fabs(r - out[g * dv + j]);
                    if (e > diff_max) diff_max = e;
                }
                double rel = diff_max / (ref_max > 1e-6 ? ref_max : 1e-6);
                if (rel > worst) worst = rel;
            }
        }
    }
    free(K); free(V); free(q); free(out); free(scratch); free(sc);
    return worst;
}

TEST(kvcache_attention_matches_reference_every_format) {
    const int lens[] = {1, 31, 32, 33, 100, 257};
    const int groups[] = {1, 2, 4};
    const int dims[] = {64, 8};
    for (int di = 0; di < 2; di++)
        for (int f = 0; f < AK_KV_NFORMATS; f++) {
            ak_kv_format fk = (ak_kv_format)f, fv = (ak_kv_format)((f + 3) % AK_KV_NFORMATS);
            for (int pass = 0; pass < 2; pass++) {
                if (pass) fv = fk; /* same format for K and V, and a mixed pair */
                if (!ak_kv_format_supports(fk, dims[di]) || !ak_kv_format_supports(fv, dims[di])) continue;
                for (int gi = 0; gi < 3; gi++) {
                    ak_cache_spec s = spec_of(2, 2, dims[di], 512);
                    ak_error err = {{0}};
                    ak_block_pool *pool = ak_block_pool_new(&s, gi == 2 ? 16 : 32, 0, &err);
                    ak_kv *kv = pool ? ak_kv_new(pool, fk, fv, 300, &err) : NULL;
                    REQUIRE(kv, "setup: %s", err.msg);
                    ak_rng rng;
                    ak_rng_seed(&rng, 100 + f);
                    REQUIRE(fill(kv, &s, 0, 257, &rng) == 0, "fill");
                    double worst = 0;
                    for (int li = 0; li < 6; li++) {
                        double e = attention_error(kv, &s, groups[gi], lens[li], &rng);
                        if (e > worst) worst = e;
                    }
                    CHECK(worst <= 1e-4, "K %s / V %s, d %d, group %d: relative error %.3e > 1e-4",
                          ak_kv_format_get(fk)->name, ak_kv_format_get(fv)->name, dims[di], groups[gi], worst);
                    if (gi == 0 && pass == 1)
                        printf("    %-5s d=%-3d max relative error vs double reference %.2e\n",
                               ak_kv_format_get(fk)->name, dims[di], worst);
                    ak_kv_free(kv);
                    ak_block_pool_free(pool);
                }
            }
        }
}

TEST(kvcache_budget_exhaustion_is_clean) {
    ak_cache_spec s = spec_of(2, 2, 64, 4096);
    ak_error err = {{0}};
    ak_block_pool *probe = ak_block_pool_new(&s, 32, 0, &err);
    REQUIRE(probe, "%s", err.msg);
    size_t bb = ak_block_pool_block_bytes(probe, AK_KV_Q8, AK_KV_Q4);
    ak_block_pool_free(probe);
    /* room for exactly 3 blocks */
    ak_block_pool *pool = ak_block_pool_new(&s, 32, 3 * bb + bb / 2, &err);
    ak_kv *a = ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 4096, &err);
    ak_kv *b = ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 4096, &err);
    REQUIRE(a && b, "%s", err.msg);
    ak_rng rng;
    ak_rng_seed(&rng, 1);
    CHECK(fill(a, &s, 0, 64, &rng) == 0, "two blocks must fit");
    /* two more blocks for b do not fit: b must be left unchanged, a intact */
    CHECK(ak_kv_prepare(b, 0, 64, &err) < 0 && strstr(err.msg, "budget"), "expected a budget error, got '%s'",
          err.msg);
    CHECK(ak_kv_n_blocks(b) == 0 && ak_kv_length(b) == 0, "a failed prepare changed the sequence");
    ak_block_pool_stats st;
    ak_block_pool_get_stats(pool, &st);
    CHECK(st.used == 2 * bb && st.blocks == 2 && st.alloc_failures == 1, "stats: used %zu blocks %zu failures %llu",
          st.used, st.blocks, (unsigned long long)st.alloc_failures);
    size_t kb = ak_block_v_offset(pool, AK_KV_Q8, AK_KV_Q4, 0) - ak_block_k_offset(pool, AK_KV_Q8, AK_KV_Q4, 0);
    CHECK(st.k_bytes[AK_KV_Q8] == 2 * 2 * kb && st.v_bytes[AK_KV_Q4] == st.used - st.k_bytes[AK_KV_Q8],
          "bytes by format wrong: K q8 %zu V q4 %zu", st.k_bytes[AK_KV_Q8], st.v_bytes[AK_KV_Q4]);
    CHECK(ak_kv_prepare(b, 0, 32, &err) == 0, "one block still fits: %s", err.msg);
    ak_kv_truncate(a, 0);
    ak_block_pool_get_stats(pool, &st);
    CHECK(st.blocks == 1 && st.used == bb, "truncate did not free: %zu blocks", st.blocks);
    ak_kv_free(a);
    ak_kv_free(b);
    ak_block_pool_get_stats(pool, &st);
    CHECK(st.used == 0 && st.blocks == 0, "leak: %zu bytes", st.used);
    ak_block_pool_free(pool);
}

TEST(kvcache_fork_is_copy_on_write) {
    ak_cache_spec s = spec_of(2, 2, 64, 512);
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&s, 32, 0, &err);
    ak_kv *a = ak_kv_new(pool, AK_KV_F32, AK_KV_F32, 512, &err);
    REQUIRE(a, "%s", err.msg);
    ak_rng rng;
    ak_rng_seed(&rng, 2);
    REQUIRE(fill(a, &s, 0, 40, &rng) == 0, "fill");
    ak_kv *b = ak_kv_fork(a, &err);
    REQUIRE(b, "%s", err.msg);
    ak_block_pool_stats st;
    ak_block_pool_get_stats(pool, &st);
    CHECK(st.blocks == 2, "fork must share blocks, have %zu", st.blocks);
    float ka[128], va[128], kb[128], vb[128];
    ak_kv_read(a, 1, 35, ka, va, NULL);
    /* b overwrites position 35 onward (DIVERGE): a must not see it */
    ak_kv_truncate(b, 35);
    REQUIRE(fill(b, &s, 35, 50, &rng) == 0, "fill b");
    ak_kv_read(a, 1, 35, kb, vb, NULL);
    CHECK(!memcmp(ka, kb, sizeof ka) && !memcmp(va, vb, sizeof va), "write to a fork changed the original");
    ak_kv_read(b, 1, 35, kb, vb, NULL);
    CHECK(memcmp(ka, kb, sizeof ka) != 0, "fork did not get its own data");
    ak_block_pool_get_stats(pool, &st);
    CHECK(st.blocks == 3, "expected the shared first block, a's second and b's copy of it, have %zu", st.blocks);
    ak_kv_free(a);
    ak_kv_free(b);
    ak_block_pool_get_stats(pool, &st);
    CHECK(st.blocks == 0, "leak of %zu blocks", st.blocks);
    ak_block_pool_free(pool);
}

TEST(kvcache_bad_arguments) {
    ak_cache_spec s = spec_of(2, 2, 64, 1024);
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&s, 0, 0, &err);
    REQUIRE(pool, "%s", err.msg);
    CHECK(!ak_kv_new(pool, AK_KV_F16, AK_KV_F16, 2048, &err) && strstr(err.msg, "longer than the model"),
          "context past the model's: '%s'", err.msg);
    CHECK(!ak_kv_new(pool, AK_KV_F16, AK_KV_F16, 0, &err), "zero context accepted");
    CHECK(!ak_kv_new(pool, (ak_kv_format)99, AK_KV_F16, 16, &err), "bad format accepted");
    ak_kv_format f;
    CHECK(ak_kv_format_parse("q5_9", &f) < 0, "unknown format name parsed");
    ak_kv *kv = ak_kv_new(pool, AK_KV_F16, AK_KV_F16, 64, &err);
    REQUIRE(kv, "%s", err.msg);
    float k[128] = {0}, v[128] = {0};
    CHECK(ak_kv_write(kv, 0, 3, k, v, &err) < 0, "write to an unprepared position accepted");
    CHECK(ak_kv_prepare(kv, 0, 65, &err) < 0 && strstr(err.msg, "full"), "prepare past capacity: '%s'", err.msg);
    CHECK(ak_kv_read(kv, 0, 0, k, v, &err) < 0, "read past length accepted");
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    CHECK(!ak_block_pool_new(&s, 100000, 0, &err), "absurd block size accepted");
    size_t b;
    CHECK(ak_parse_bytes("10.2G", &b) == 0 && b == (size_t)10.2e9, "10.2G -> %zu", b);
    CHECK(ak_parse_bytes("512MiB", &b) == 0 && b == 512u << 20, "512MiB -> %zu", b);
    CHECK(ak_parse_bytes("4096", &b) == 0 && b == 4096, "4096");
    CHECK(ak_parse_bytes("12X", &b) < 0 && ak_parse_bytes("-5", &b) < 0 && ak_parse_bytes("", &b) < 0,
          "bad sizes accepted");
}

TEST(kvformat_components_cover_each_vector) {
    const int dims[] = {8, 64, 80, 96, 128, 256};
    for (int f = 0; f < AK_KV_NFORMATS; f++)
        for (int i = 0; i < 6; i++) {
            ak_kv_component c[2];
            int n = ak_kv_format_components((ak_kv_format)f, dims[i], c);
            REQUIRE(n >= 1, "%s d=%d: no components", ak_kv_format_get((ak_kv_format)f)->name, dims[i]);
            size_t pos = 0;
            for (int j = 0; j < n; j++) {
                CHECK(c[j].offset == pos, "%s d=%d: component %s at %zu, expected %zu",
                      ak_kv_format_get((ak_kv_format)f)->name, dims[i], c[j].name, c[j].offset, pos);
                size_t el = !strcmp(c[j].dtype, "F32") ? 4 : !strcmp(c[j].dtype, "I8") || !strcmp(c[j].dtype, "U8") ? 1 : 2;
                int64_t cnt = 1;
                for (int k = 0; k < c[j].ndim; k++) cnt *= c[j].shape[k];
                CHECK((size_t)cnt * el == c[j].bytes, "%s d=%d: %s shape does not match its bytes",
                      ak_kv_format_get((ak_kv_format)f)->name, dims[i], c[j].name);
                pos += c[j].bytes;
            }
            CHECK(pos == ak_kv_format_get((ak_kv_format)f)->vec_bytes(dims[i]), "%s d=%d: components cover %zu of %zu",
                  ak_kv_format_get((ak_kv_format)f)->name, dims[i], pos,
                  ak_kv_format_get((ak_kv_format)f)->vec_bytes(dims[i]));
        }
}
