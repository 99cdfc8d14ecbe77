/* test_kvcache.c - the block pool and attention on stored formats.
 * Attention is checked against a double-precision reference computed over the
 * dequantized cache (what the kernel must compute exactly, up to rounding). */
#include <string.h>

#include "kv/blockpool.h"
#include "engine/calib.h"
#include "kv/kvcache.h"
#include "test.h"

static ak_cache_spec spec_of(int layers, int kv_heads, int d, int n_ctx) {
    ak_cache_spec s = {.n_layer = layers, .n_head_kv = kv_heads, .head_dim_k = d, .head_dim_v = d, .n_ctx = n_ctx};
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

/* One layer's vectors read back from a cache (K, V: position x n_head_kv x
 * d, in the spec's dimensions), and the attention scale. */
typedef struct {
    const float *K, *V;
    const ak_cache_spec *s;
    float scale;
} ref_layer;

/* Double-precision attention of `group` queries q (dk each) over positions
 * [0, n) of KV head h of c into out (group x dv). */
static void ref_attention(const ref_layer *c, int h, const float *q, int group, int n, double *out) {
    const float *K = c->K, *V = c->V;
    const ak_cache_spec *s = c->s;
    float scale = c->scale;
    int dk = s->head_dim_k, dv = s->head_dim_v, nk = s->n_head_kv * dk, nv = s->n_head_kv * dv;
    double *sc = malloc(sizeof(double) * n);
    for (int g = 0; g < group; g++) {
        double mx = -1e300, sum = 0;
        for (int p = 0; p < n; p++) {
            double d = 0;
            for (int j = 0; j < dk; j++) d += (double)q[g * dk + j] * K[(size_t)p * nk + h * dk + j];
            sc[p] = d * scale;
            if (sc[p] > mx) mx = sc[p];
        }
        for (int p = 0; p < n; p++) { sc[p] = exp(sc[p] - mx); sum += sc[p]; }
        for (int j = 0; j < dv; j++) {
            double r = 0;
            for (int p = 0; p < n; p++) r += sc[p] * V[(size_t)p * nv + h * dv + j];
            out[g * dv + j] = r / sum;
        }
    }
    free(sc);
}

/* max relative error of ak_kv_attend vs a double reference over the
 * dequantized cache, for every layer / KV head */
static double attention_error(const ak_kv *kv, const ak_cache_spec *s, int group, int n, ak_rng *rng) {
    int dk = s->head_dim_k, dv = s->head_dim_v, nk = s->n_head_kv * dk, nv = s->n_head_kv * dv;
    float *K = malloc(sizeof(float) * (size_t)n * nk), *V = malloc(sizeof(float) * (size_t)n * nv);
    float *q = malloc(sizeof(float) * group * dk), *out = malloc(sizeof(float) * group * dv);
    float *scratch = malloc(sizeof(float) * ak_kv_attend_scratch(kv, group));
    double *ref = malloc(sizeof(double) * group * dv), worst = 0;
    float scale = 1.0f / sqrtf((float)dk);
    for (int l = 0; l < s->n_layer; l++) {
        for (int p = 0; p < n; p++) ak_kv_read(kv, l, p, K + (size_t)p * nk, V + (size_t)p * nv, NULL);
        for (int h = 0; h < s->n_head_kv; h++) {
            for (int i = 0; i < group * dk; i++) q[i] = ak_rng_normal(rng);
            ak_kv_attend(kv, &(ak_kv_query){.layer = l, .kv_head = h, .q = q, .n_q = group, .scale = scale, .out = out,
                         .scratch = scratch}, n);
            ref_attention(&(ref_layer){.K = K, .V = V, .s = s, .scale = scale}, h, q, group, n, ref);
            for (int g = 0; g < group; g++) {
                double ref_max = 0, diff_max = 0;
                for (int j = 0; j < dv; j++) {
                    ref_max = fmax(ref_max, fabs(ref[g * dv + j]));
                    diff_max = fmax(diff_max, fabs(ref[g * dv + j] - out[g * dv + j]));
                }
                worst = fmax(worst, diff_max / (ref_max > 1e-6 ? ref_max : 1e-6));
            }
        }
    }
    free(K); free(V); free(q); free(out); free(scratch); free(ref);
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

/* Random means for every layer and head of s (keys offset like real ones:
 * a few large channels), installed in pool under id "t" for the formats in
 * mask (both sides). */
static int set_random_centers(ak_block_pool *pool, const ak_cache_spec *s, unsigned mask, ak_rng *rng);

/* The prefill path: a run of consecutive tokens attending together (each
 * block dequantized once for all of them, causal within the run) gives, for
 * every token, the double reference over the positions it sees: every
 * format pair, runs that start mid-block and cross block boundaries, a last
 * partial block, group 1 and 4, blocks of 16 and 32, centered or not. */
TEST(kvcache_attend_run_matches_reference) {
    const int dims[] = {64, 8};
    ak_rng rng;
    ak_rng_seed(&rng, 4242);
    double worst_all = 0;
    int cases = 0;
    for (int di = 0; di < 2; di++)
        for (int f = 0; f < AK_KV_NFORMATS; f++)
            for (int pass = 0; pass < 2; pass++) {
                int d = dims[di];
                ak_kv_format fk = (ak_kv_format)f, fv = pass ? fk : (ak_kv_format)((f + 3) % AK_KV_NFORMATS);
                if (!ak_kv_format_supports(fk, d) || !ak_kv_format_supports(fv, d)) continue;
                int group = pass ? 4 : 1, T = (f + pass) % 2 ? 16 : 32;
                ak_cache_spec s = spec_of(2, 2, d, 512);
                ak_error err = {{0}};
                ak_block_pool *pool = ak_block_pool_new(&s, T, 0, &err);
                REQUIRE(pool, "pool: %s", err.msg);
                if (di == 0 && f % 2) REQUIRE(set_random_centers(pool, &s, 0, &rng) == 0, "centers");
                ak_kv *kv = ak_kv_new(pool, fk, fv, 300, &err);
                REQUIRE(kv && fill(kv, &s, 0, 150, &rng) == 0, "setup: %s", err.msg);
                int nk = s.n_head_kv * d, nv = s.n_head_kv * d, nt = 21, pos0 = 129 - nt;   /* 108..128 */
                float *K = malloc(sizeof(float) * 150 * nk), *V = malloc(sizeof(float) * 150 * nv);
                float *q = malloc(sizeof(float) * nt * group * d), *out = malloc(sizeof(float) * nt * group * d);
                float *scratch = malloc(sizeof(float) * ak_kv_attend_run_scratch(kv, nt * group));
                double *ref = malloc(sizeof(double) * group * d), worst = 0;
                float scale = 1.0f / sqrtf((float)d);
                for (int l = 0; l < 2; l++) {
                    for (int p = 0; p < 150; p++) ak_kv_read(kv, l, p, K + (size_t)p * nk, V + (size_t)p * nv, NULL);
                    for (int h = 0; h < 2; h++) {
                        for (int i = 0; i < nt * group * d; i++) q[i] = ak_rng_normal(&rng);
                        for (int i = 0; i < nt * group * d; i++) out[i] = NAN;
                        ak_kv_attend_run(kv, &(ak_kv_query){.layer = l, .kv_head = h, .q = q,
                                         .qstride = (size_t)group * d, .n_q = group, .scale = scale, .out = out,
                                         .ostride = (size_t)group * d, .scratch = scratch}, nt, pos0);
                        const ref_layer rl = {.K = K, .V = V, .s = &s, .scale = scale};
                        for (int t = 0; t < nt; t++) {
                            ref_attention(&rl, h, q + (size_t)t * group * d, group, pos0 + t + 1, ref);
                            double mx = 0, e = 0;
                            for (int i = 0; i < group * d; i++) {
                                mx = fmax(mx, fabs(ref[i]));
                                double o = out[(size_t)t * group * d + i];
                                e = isnan(o) ? INFINITY : fmax(e, fabs(o - ref[i]));
                            }
                            worst = fmax(worst, e / (mx > 1e-6 ? mx : 1e-6));
                        }
                    }
                }
                CHECK(worst <= 1e-4, "run attention K %s / V %s, d %d, group %d, block %d: relative error %.3e",
                      ak_kv_format_get(fk)->name, ak_kv_format_get(fv)->name, d, group, T, worst);
                worst_all = fmax(worst_all, worst);
                cases++;
                free(K); free(V); free(q); free(out); free(scratch); free(ref);
                ak_kv_free(kv);
                ak_block_pool_free(pool);
            }
    printf("    %d format/shape cases, max relative error vs double reference %.2e\n", cases, worst_all);
}

static int set_random_centers(ak_block_pool *pool, const ak_cache_spec *s, unsigned mask, ak_rng *rng) {
    size_t nk = (size_t)s->n_layer * s->n_head_kv * s->head_dim_k, nv = (size_t)s->n_layer * s->n_head_kv * s->head_dim_v;
    float *mk = malloc(sizeof(float) * nk), *mv = malloc(sizeof(float) * nv);
    for (size_t i = 0; i < nk; i++) mk[i] = ak_rng_normal(rng) * (i % 8 == 1 ? 4.0f : 1.0f);
    for (size_t i = 0; i < nv; i++) mv[i] = ak_rng_normal(rng);
    ak_error err = {{0}};
    int rc = ak_block_pool_set_centers(pool, mk, mv, "t", mask, mask, &err);
    free(mk);
    free(mv);
    return rc;
}

/* Centering an f32 cache changes nothing but rounding: attention over a
 * centered f32 cache equals attention over a plain one (1e-5 relative), and
 * the vectors read back equal what was written. Then with the quantized
 * formats: attention over centered blocks still equals the double reference
 * over the reconstructed vectors (which ak_kv_read returns with the means
 * added back), with K and V centered or not independently. */
TEST(kvcache_centering_is_exact_in_attention) {
    ak_cache_spec s = spec_of(2, 2, 64, 512);
    ak_error err = {{0}};
    ak_rng rng;
    ak_rng_seed(&rng, 808);
    ak_block_pool *plain = ak_block_pool_new(&s, 32, 0, &err), *cent = ak_block_pool_new(&s, 32, 0, &err);
    REQUIRE(plain && cent && set_random_centers(cent, &s, 1u << AK_KV_F32, &rng) == 0, "setup: %s", err.msg);
    CHECK(ak_block_pool_center(cent, 0, AK_KV_F32, 1, 1) && !ak_block_pool_center(cent, 0, AK_KV_F16, 1, 1) &&
              !ak_block_pool_center(plain, 0, AK_KV_F32, 0, 0) && !strcmp(ak_block_pool_center_id(cent, 1, AK_KV_F32), "t"),
          "centering applies to the masked formats only");
    ak_kv *a = ak_kv_new(plain, AK_KV_F32, AK_KV_F32, 300, &err), *b = ak_kv_new(cent, AK_KV_F32, AK_KV_F32, 300, &err);
    REQUIRE(a && b, "%s", err.msg);
    ak_rng r1, r2;
    ak_rng_seed(&r1, 9);
    ak_rng_seed(&r2, 9);
    REQUIRE(fill(a, &s, 0, 257, &r1) == 0 && fill(b, &s, 0, 257, &r2) == 0, "fill");
    float k1[128], v1[128], k2[128], v2[128];
    double rd = 0;
    for (int p = 0; p < 257; p += 17) {
        ak_kv_read(a, 1, p, k1, v1, NULL);
        ak_kv_read(b, 1, p, k2, v2, NULL);
        for (int i = 0; i < 128; i++) rd = fmax(rd, fmax(fabs(k1[i] - k2[i]), fabs(v1[i] - v2[i])));
    }
    CHECK(rd <= 1e-5, "read back differs by %g", rd);
    int group = 4;
    float q[4 * 64], o1[4 * 64], o2[4 * 64];
    size_t sa = ak_kv_attend_scratch(a, group), sb = ak_kv_attend_scratch(b, group);
    float *scratch = malloc(sizeof(float) * (sa > sb ? sa : sb));
    double worst = 0;
    const int lens[] = {1, 32, 33, 257};
    for (int li = 0; li < 4; li++)
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 2; h++) {
                for (int i = 0; i < group * 64; i++) q[i] = ak_rng_normal(&rng);
                ak_kv_attend(a, &(ak_kv_query){.layer = l, .kv_head = h, .q = q, .n_q = group, .scale = 0.125f,
                             .out = o1, .scratch = scratch}, lens[li]);
                ak_kv_attend(b, &(ak_kv_query){.layer = l, .kv_head = h, .q = q, .n_q = group, .scale = 0.125f,
                             .out = o2, .scratch = scratch}, lens[li]);
                double mx = 0, e = 0;
                for (int i = 0; i < group * 64; i++) {
                    mx = fmax(mx, fabs(o1[i]));
                    e = fmax(e, fabs(o1[i] - o2[i]));
                }
                worst = fmax(worst, e / (mx > 1e-6 ? mx : 1e-6));
            }
    CHECK(worst <= 1e-5, "centered f32 attention differs by %.3e relative", worst);
    printf("    centered vs plain f32 attention: max relative difference %.2e\n", worst);
    free(scratch);
    ak_kv_free(a);
    ak_kv_free(b);
    /* quantized formats, centered by default mask: exact w.r.t. the reconstruction */
    ak_block_pool *qp = ak_block_pool_new(&s, 32, 0, &err);
    REQUIRE(qp && set_random_centers(qp, &s, 0, &rng) == 0, "%s", err.msg);
    const ak_kv_format pairs[][2] = {{AK_KV_Q4, AK_KV_Q4}, {AK_KV_TQ4, AK_KV_TQ3}, {AK_KV_Q8, AK_KV_TQ2}, {AK_KV_Q2, AK_KV_F16}};
    for (int pi = 0; pi < 4; pi++) {
        ak_kv *kv = ak_kv_new(qp, pairs[pi][0], pairs[pi][1], 300, &err);
        REQUIRE(kv && fill(kv, &s, 0, 257, &rng) == 0, "fill %s", err.msg);
        double e = 0;
        for (int li = 0; li < 4; li++) e = fmax(e, attention_error(kv, &s, 2, lens[li], &rng));
        CHECK(e <= 1e-4, "centered K %s / V %s: relative error %.3e vs the reference", ak_kv_format_get(pairs[pi][0])->name,
              ak_kv_format_get(pairs[pi][1])->name, e);
        ak_kv_free(kv);
    }
    CHECK(set_random_centers(qp, &s, 0, &rng) == 0, "no blocks live: means may change");
    ak_kv *kv = ak_kv_new(qp, AK_KV_Q4, AK_KV_Q4, 64, &err);
    REQUIRE(kv && fill(kv, &s, 0, 1, &rng) == 0, "fill");
    CHECK(ak_block_pool_set_centers(qp, NULL, NULL, NULL, 0, 0, &err) < 0 && strstr(err.msg, "blocks"),
          "means changed under live blocks: %s", err.msg);
    ak_kv_free(kv);
    ak_block_pool_free(qp);
    ak_block_pool_free(plain);
    ak_block_pool_free(cent);
}

/* The calibration of stories260K against an independent computation of the
 * same definition (calib.h): the text in chunks of at most 512 tokens, each
 * a fresh f32 sequence starting with BOS, position 0 of each left out, the
 * plain mean of every other key and value per layer and head. Also: the
 * same id twice, and only formats that gain get it installed. */
TEST(calib_means_match_their_definition) {
    char path[1024];
    ak_error err = {{0}};
    ak_model *m = ak_model_load(test_path(path, sizeof path, "models/stories260K.gguf"), NULL, NULL, &err);
    ak_tokenizer *tk = m ? ak_tokenizer_load(&m->gguf, &err) : NULL;
    ak_ctx *ctx = tk ? ak_ctx_new(m, 64, 1, &err) : NULL;
    REQUIRE(ctx, "%s", err.msg);
    ak_calib c, c2;
    REQUIRE(ak_calib_compute(ctx, tk, &c, &err) == 0 && ak_calib_compute(ctx, tk, &c2, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(c.id, c2.id) && strlen(c.id) == 19 && !strncmp(c.id, "c1-", 3), "ids %s / %s", c.id, c2.id);
    const ak_cache_spec *s = &m->spec;
    int H = s->n_head_kv, dk = s->head_dim_k, dv = s->head_dim_v, L = s->n_layer;
    int32_t *ids = NULL;
    size_t n = 0;
    const char *text = ak_calib_text();
    REQUIRE(ak_tokenize(tk, text, strlen(text), AK_TOK_ADD_SPECIAL, &ids, &n, &err) == 0 && n > 100, "tokenize");
    int chunk = s->n_ctx < 512 ? s->n_ctx : 512;
    double *sk = calloc((size_t)L * H * dk, sizeof(double)), *sv = calloc((size_t)L * H * dv, sizeof(double));
    float *k = malloc(sizeof(float) * H * dk), *v = malloc(sizeof(float) * H * dv);
    int32_t *buf = malloc(sizeof(int32_t) * chunk);
    ak_block_pool *pool = ak_block_pool_new(s, 0, 0, &err);
    long cnt = 0;
    for (size_t at = 1; at < n;) {   /* ids[0] is BOS */
        int len = 1;
        buf[0] = ids[0];
        while (len < chunk && at < n) buf[len++] = ids[at++];
        ak_kv *kv = ak_kv_new(pool, AK_KV_F32, AK_KV_F32, chunk, &err);
        REQUIRE(kv && ak_eval(ctx, kv, &(ak_eval_args){.tokens = buf, .n = len}, &err) == 0, "%s", err.msg);
        for (int p = 1; p < len; p++, cnt++)
            for (int l = 0; l < L; l++) {
                ak_kv_read(kv, l, p, k, v, NULL);
                for (int i = 0; i < H * dk; i++) sk[(size_t)l * H * dk + i] += k[i];
                for (int i = 0; i < H * dv; i++) sv[(size_t)l * H * dv + i] += v[i];
            }
        ak_kv_free(kv);
    }
    double e = 0;
    for (size_t i = 0; i < (size_t)L * H * dk; i++) e = fmax(e, fabs(sk[i] / cnt - c.mu_k[i]));
    for (size_t i = 0; i < (size_t)L * H * dv; i++) e = fmax(e, fabs(sv[i] / cnt - c.mu_v[i]));
    CHECK(e <= 1e-5, "means differ from their definition by %g (%ld positions)", e, cnt);
    /* installing: q8/f16 gain nothing (no calibration run), q4 keys do */
    ak_block_pool *p2 = ak_block_pool_new(s, 0, 0, &err);
    CHECK(ak_calib_install(ctx, tk, p2, AK_KV_Q8, AK_KV_F16, AK_CENTER_K | AK_CENTER_V, &err) == 0 && !ak_block_pool_center_id(p2, 0, AK_KV_Q4),
          "q8/f16 installed means");
    CHECK(ak_calib_install(ctx, tk, p2, AK_KV_Q4, AK_KV_F16, AK_CENTER_K | AK_CENTER_V, &err) == 1 &&
              !strcmp(ak_block_pool_center_id(p2, 0, AK_KV_Q4), c.id) && !ak_block_pool_center_id(p2, 1, AK_KV_F16) &&
              !ak_block_pool_center_id(p2, 0, AK_KV_Q8),
          "q4 keys: %s", err.msg);
    ak_block_pool_free(p2);
    ak_block_pool_free(pool);
    free(buf); free(k); free(v); free(sk); free(sv); free(ids);
    ak_calib_free(&c);
    ak_calib_free(&c2);
    ak_ctx_free(ctx);
    ak_tokenizer_free(tk);
    ak_model_free(m);
}
