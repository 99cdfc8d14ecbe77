/* test_shift.c - the position shift (ak_model_shift_keys) and the context's
 * RoPE position offset (ak_ctx_set_pos_offset), against computing at the new
 * positions directly: layer-0 keys depend only on the token and its
 * position, and RoPE attention only on relative positions, so a shifted
 * cache must equal (to rounding) one computed delta positions later, on
 * every family's RoPE (llama interleaved pairs, qwen3 NeoX with q/k norms,
 * gemma3 local/global bases and windows, deepseek2's MLA rope key). */
#include <string.h>

#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "engine/model.h"
#include "test.h"

typedef struct {
    ak_model *m;
    ak_block_pool *pool;
    ak_ctx *c;
} shift_env;

/* Loads a model of ../shared/models with an unlimited pool (T-token blocks)
 * and a context of max_batch tokens; 0 if the file is missing (skip). */
static int env_open(ak_test_ctx *t, shift_env *e, const char *rel, int T, int max_batch) {
    char path[512];
    ak_error err = {{0}};
    memset(e, 0, sizeof *e);
    e->m = ak_model_load(test_path(path, sizeof path, rel), NULL, NULL, &err);
    if (!e->m) { ak_test_fail(t, __FILE__, __LINE__, "%s: %s", rel, err.msg); return 0; }
    e->pool = ak_block_pool_new(&e->m->spec, T, 0, &err);
    e->c = e->pool ? ak_ctx_new(e->m, max_batch, 2, &err) : NULL;
    if (!e->c) { ak_test_fail(t, __FILE__, __LINE__, "%s: %s", rel, err.msg); return 0; }
    return 1;
}

static void env_close(shift_env *e) {
    ak_ctx_free(e->c);
    ak_block_pool_free(e->pool);
    ak_model_free(e->m);
}

/* n pseudo-random token ids of the model's vocabulary (above the first 3,
 * the usual control tokens). */
static void some_tokens(const ak_model *m, int32_t *tok, int n, uint64_t seed) {
    ak_rng r;
    ak_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) tok[i] = 3 + (int32_t)(ak_rng_u32(&r) % (uint32_t)(m->cfg.vocab - 3));
}

/* A fresh f32 sequence holding tokens[0..n) computed with RoPE offset off. */
static ak_kv *prefill(ak_test_ctx *t, shift_env *e, const int32_t *tok, int n, int off, ak_kv_format fk) {
    ak_error err = {{0}};
    ak_kv *kv = ak_kv_new(e->pool, fk, AK_KV_F32, 256, &err);
    if (!kv) { ak_test_fail(t, __FILE__, __LINE__, "kv: %s", err.msg); return NULL; }
    ak_ctx_set_pos_offset(e->c, off);
    int rc = ak_eval(e->c, kv, &(ak_eval_args){.tokens = tok, .n = n}, &err);
    ak_ctx_set_pos_offset(e->c, 0);
    if (rc < 0) { ak_test_fail(t, __FILE__, __LINE__, "prefill: %s", err.msg); ak_kv_free(kv); return NULL; }
    return kv;
}

/* max |a - b| over the keys of layers [l0, l1) and positions [0, n), and
 * max |a| (the scale the difference is judged against). */
static double key_diff(const shift_env *e, const ak_kv *a, const ak_kv *b, int l0, int l1, int n, double *scale) {
    int kd = e->m->spec.n_head_kv * e->m->spec.head_dim_k, vd = e->m->spec.n_head_kv * e->m->spec.head_dim_v;
    float *ka = malloc(sizeof(float) * kd), *kb = malloc(sizeof(float) * kd), *v = malloc(sizeof(float) * vd);
    double worst = 0, mx = 0;
    ak_error err = {{0}};
    for (int l = l0; l < l1; l++)
        for (int p = 0; p < n; p++) {
            if (ak_kv_read(a, l, p, ka, v, &err) < 0 || ak_kv_read(b, l, p, kb, v, &err) < 0) { worst = INFINITY; continue; }
            for (int i = 0; i < kd; i++) {
                double d = fabs((double)ka[i] - kb[i]);
                if (d > worst) worst = d;
                if (fabs(ka[i]) > mx) mx = fabs(ka[i]);
            }
        }
    free(ka); free(kb); free(v);
    *scale = mx;
    return worst;
}

static const char *const shift_models[] = {"models/stories260K.gguf", "models/qwen3-tiny.gguf",
                                           "models/gemma3-tiny.gguf", "models/deepseek2-tiny.gguf"};

/* (a) Layer-0 keys depend only on the token and its position: tokens
 * computed at [0, n) then shifted by delta equal the same tokens computed
 * with RoPE positions [delta, delta + n) (offset delta), to f32 rounding,
 * on each family; values are untouched (bit for bit). The angles differ
 * only by float rounding of pos * inv_freq, so positions stay small here
 * (ulp(64) = 7.6e-6). A shift by 0 changes nothing; a negative delta too. */
TEST(shift_layer0_keys_match_direct_offset) {
    enum { N = 24, DELTA = 37 };
    for (size_t mi = 0; mi < sizeof shift_models / sizeof shift_models[0]; mi++) {
        shift_env e;
        if (!env_open(t, &e, shift_models[mi], 16, 8)) return;
        int32_t tok[N];
        some_tokens(e.m, tok, N, 5 + mi);
        ak_kv *a = prefill(t, &e, tok, N, 0, AK_KV_F32), *d = prefill(t, &e, tok, N, DELTA, AK_KV_F32);
        ak_kv *back = prefill(t, &e, tok, N, DELTA, AK_KV_F32), *orig = prefill(t, &e, tok, N, 0, AK_KV_F32);
        REQUIRE(a && d && back && orig, "prefill");
        double scale, before = key_diff(&e, a, d, 0, 1, N, &scale);
        int vd = e.m->spec.n_head_kv * e.m->spec.head_dim_v, kd = e.m->spec.n_head_kv * e.m->spec.head_dim_k;
        float *k = malloc(sizeof(float) * kd), *v0 = malloc(sizeof(float) * vd), *v1 = malloc(sizeof(float) * vd);
        ak_error err = {{0}};
        REQUIRE(ak_model_shift_keys(e.m, a, 0, N, 0, &err) == 0, "shift 0: %s", err.msg);
        double same0;
        CHECK(key_diff(&e, a, orig, 0, e.m->cfg.n_layer, N, &same0) == 0, "%s: a shift by 0 changed keys",
              shift_models[mi]);
        REQUIRE(ak_model_shift_keys(e.m, a, 0, N, DELTA, &err) == 0, "shift: %s", err.msg);
        double s2, after = key_diff(&e, a, d, 0, 1, N, &s2);
        fprintf(stderr, "  %s: layer-0 keys shifted by %d vs computed at offset %d: max |diff| %.3g (keys up to %.3g; "
                "unshifted %.3g)\n", shift_models[mi], DELTA, DELTA, after, scale, before);
        CHECK(before > 100 * after, "%s: the offset run's keys did not differ from offset 0's (%g vs %g)",
              shift_models[mi], before, after);
        CHECK(after <= 1e-5 * scale, "%s: shifted layer-0 keys differ by %g (scale %g)", shift_models[mi], after, scale);
        /* values bit for bit */
        int vbad = 0;
        for (int l = 0; l < e.m->cfg.n_layer; l++)
            for (int p = 0; p < N; p++) {
                ak_kv_read(a, l, p, k, v0, &err);
                ak_kv_read(orig, l, p, k, v1, &err);
                vbad += memcmp(v0, v1, sizeof(float) * vd) != 0;
            }
        CHECK(vbad == 0, "%s: %d values changed by the shift", shift_models[mi], vbad);
        /* a negative delta: computed at offset delta, shifted back to 0 */
        REQUIRE(ak_model_shift_keys(e.m, back, 0, N, -DELTA, &err) == 0, "shift back: %s", err.msg);
        double s3, neg = key_diff(&e, back, orig, 0, 1, N, &s3);
        CHECK(neg <= 1e-5 * s3, "%s: offset-%d keys shifted by -%d differ from offset 0's by %g", shift_models[mi],
              DELTA, DELTA, neg);
        free(k); free(v0); free(v1);
        ak_kv_free(a); ak_kv_free(d); ak_kv_free(back); ak_kv_free(orig);
        env_close(&e);
    }
}

/* Shifting by delta then by -delta restores f32 keys (every layer) to float
 * rounding of two rotations: the two angles are exact negatives. Also with
 * a pool that centers f32 keys on a large mean: the shift rotates the key
 * attention sees, not the stored difference (rotating k - mu would move the
 * keys by R(delta) mu - mu, far beyond rounding). */
TEST(shift_back_restores_keys) {
    enum { N = 40, DELTA = 300 };
    for (int centered = 0; centered < 2; centered++)
        for (size_t mi = 0; mi < sizeof shift_models / sizeof shift_models[0]; mi++) {
            shift_env e;
            if (!env_open(t, &e, shift_models[mi], 16, 16)) return;
            ak_error err = {{0}};
            if (centered) {
                size_t nk = (size_t)e.m->spec.n_layer * e.m->spec.n_head_kv * e.m->spec.head_dim_k;
                float *mu = malloc(sizeof(float) * nk);
                ak_rng r;
                ak_rng_seed(&r, 3);
                for (size_t i = 0; i < nk; i++) mu[i] = 4 + ak_rng_normal(&r);
                REQUIRE(ak_block_pool_set_centers(e.pool, mu, NULL, "shift-test", 1u << AK_KV_F32, 0, &err) == 0,
                        "centers: %s", err.msg);
                free(mu);
                REQUIRE(ak_block_pool_center(e.pool, 0, AK_KV_F32, 0, 0), "f32 keys are not centered");
            }
            int32_t tok[N];
            some_tokens(e.m, tok, N, 9 + mi);
            ak_kv *a = prefill(t, &e, tok, N, 0, AK_KV_F32), *orig = prefill(t, &e, tok, N, 0, AK_KV_F32);
            ak_kv *d = prefill(t, &e, tok, 8, 5, AK_KV_F32);
            REQUIRE(a && orig && d, "prefill");
            REQUIRE(ak_model_shift_keys(e.m, a, 0, N, DELTA, &err) == 0, "shift: %s", err.msg);
            double scale, moved = key_diff(&e, a, orig, 0, e.m->cfg.n_layer, N, &scale);
            REQUIRE(ak_model_shift_keys(e.m, a, 0, N, -DELTA, &err) == 0, "shift back: %s", err.msg);
            double back = key_diff(&e, a, orig, 0, e.m->cfg.n_layer, N, &scale);
            CHECK(moved > 0.01 * scale, "%s: the shift moved keys by %g only", shift_models[mi], moved);
            CHECK(back <= 1e-6 * scale, "%s%s: keys after +%d and -%d differ by %g (scale %g)", shift_models[mi],
                  centered ? " (centered)" : "", DELTA, DELTA, back, scale);
            /* centered: a small exactness check of the shift itself */
            if (centered) {
                ak_kv *z = prefill(t, &e, tok, 8, 0, AK_KV_F32);
                REQUIRE(z, "prefill");
                REQUIRE(ak_model_shift_keys(e.m, z, 0, 8, 5, &err) == 0, "shift: %s", err.msg);
                double s, dd = key_diff(&e, z, d, 0, 1, 8, &s);
                CHECK(dd <= 1e-5 * s, "%s centered: layer-0 keys shifted by 5 differ from offset 5's by %g",
                      shift_models[mi], dd);
                ak_kv_free(z);
            }
            ak_kv_free(a); ak_kv_free(orig); ak_kv_free(d);
            env_close(&e);
        }
}

/* (b) One-segment context: after shifting every key of a cache by delta, the
 * next token decoded with RoPE offset delta sees the same relative positions,
 * so its logits equal those of the unshifted cache decoded at offset 0 (and
 * those of a cache computed at offset delta from the start) to rounding. N
 * passes gemma3's window of 16, so local layers mask inside the context. */
TEST(shift_one_segment_logits_match) {
    enum { N = 40 };
    static const int deltas[] = {7, 333};
    for (size_t mi = 0; mi < sizeof shift_models / sizeof shift_models[0]; mi++) {
        shift_env e;
        if (!env_open(t, &e, shift_models[mi], 16, 16)) return;
        int V = e.m->cfg.vocab;
        int32_t tok[N + 1];
        some_tokens(e.m, tok, N + 1, 21 + mi);
        float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V), *lc = malloc(sizeof(float) * V);
        ak_error err = {{0}};
        for (size_t di = 0; di < sizeof deltas / sizeof deltas[0]; di++) {
            int delta = deltas[di];
            ak_kv *a = prefill(t, &e, tok, N, 0, AK_KV_F32), *b = prefill(t, &e, tok, N, 0, AK_KV_F32);
            ak_kv *c = prefill(t, &e, tok, N, delta, AK_KV_F32);
            REQUIRE(a && b && c, "prefill");
            REQUIRE(ak_eval(e.c, a, &(ak_eval_args){.tokens = tok + N, .n = 1, .pos0 = N, .logits = la}, &err) == 0,
                    "decode: %s", err.msg);
            REQUIRE(ak_model_shift_keys(e.m, b, 0, N, delta, &err) == 0, "shift: %s", err.msg);
            ak_ctx_set_pos_offset(e.c, delta);
            CHECK(ak_ctx_pos_offset(e.c) == delta, "offset not kept");
            REQUIRE(ak_eval(e.c, b, &(ak_eval_args){.tokens = tok + N, .n = 1, .pos0 = N, .logits = lb}, &err) == 0,
                    "decode: %s", err.msg);
            REQUIRE(ak_eval(e.c, c, &(ak_eval_args){.tokens = tok + N, .n = 1, .pos0 = N, .logits = lc}, &err) == 0,
                    "decode: %s", err.msg);
            ak_ctx_set_pos_offset(e.c, 0);
            double dab = 0, dac = 0, mx = 0;
            for (int i = 0; i < V; i++) {
                if (fabs(la[i] - lb[i]) > dab) dab = fabs(la[i] - lb[i]);
                if (fabs(la[i] - lc[i]) > dac) dac = fabs(la[i] - lc[i]);
                if (fabs(la[i]) > mx) mx = fabs(la[i]);
            }
            fprintf(stderr, "  %s delta %d: logits max |diff| shifted %.3g, computed at the offset %.3g (logits up "
                    "to %.3g)\n", shift_models[mi], delta, dab, dac, mx);
            CHECK(dab <= 1e-4 * (mx > 1 ? mx : 1), "%s delta %d: shifted cache's logits differ by %g",
                  shift_models[mi], delta, dab);
            CHECK(dac <= 1e-4 * (mx > 1 ? mx : 1), "%s delta %d: offset cache's logits differ by %g",
                  shift_models[mi], delta, dac);
            ak_kv_free(a); ak_kv_free(b); ak_kv_free(c);
        }
        free(la); free(lb); free(lc);
        env_close(&e);
    }
}

/* Refusals by code, nothing changed: a range outside what the sequence holds,
 * a reversed range, a RoPE scaling that is not a rotation, a model without
 * RoPE dims, positions of a shared base. A forked sequence is copied
 * on write: shifting the fork leaves the original's keys as they were. A
 * range inside a sequence is shifted and the rest left alone. */
TEST(shift_refusals_and_copy_on_write) {
    enum { N = 40 };
    shift_env e;
    if (!env_open(t, &e, "models/stories260K.gguf", 16, 16)) return;
    int32_t tok[N];
    some_tokens(e.m, tok, N, 77);
    ak_kv *a = prefill(t, &e, tok, N, 0, AK_KV_F32), *orig = prefill(t, &e, tok, N, 0, AK_KV_F32);
    REQUIRE(a && orig, "prefill");
    ak_error err = {{0}};
    double s;
    CHECK(ak_model_shift_keys(e.m, a, 0, N + 1, 3, &err) < 0 && err.code == AK_ERR_INVALID, "past the length: %d",
          err.code);
    err.code = 0;
    CHECK(ak_model_shift_keys(e.m, a, -1, 4, 3, &err) < 0 && err.code == AK_ERR_INVALID, "negative from: %d",
          err.code);
    err.code = 0;
    CHECK(ak_model_shift_keys(e.m, a, 9, 4, 3, &err) < 0 && err.code == AK_ERR_INVALID, "from > to: %d", err.code);
    /* where a shift cannot be exact (the loaded config changed in place: no
     * file here has these) */
    e.m->cfg.rope_scaling_other = 1;
    err.code = 0;
    CHECK(ak_model_shift_keys(e.m, a, 0, N, 3, &err) < 0 && err.code == AK_ERR_INVALID, "YaRN-like scaling: %d",
          err.code);
    e.m->cfg.rope_scaling_other = 0;
    int rd = e.m->cfg.rope_dim;
    e.m->cfg.rope_dim = 0;
    err.code = 0;
    CHECK(ak_model_shift_keys(e.m, a, 0, N, 3, &err) < 0 && err.code == AK_ERR_INVALID, "no RoPE: %d", err.code);
    e.m->cfg.rope_dim = rd;
    CHECK(key_diff(&e, a, orig, 0, e.m->cfg.n_layer, N, &s) == 0, "a refused shift changed keys");
    /* fork: copy on write */
    ak_kv *f = ak_kv_fork(a, &err);
    REQUIRE(f, "fork: %s", err.msg);
    REQUIRE(ak_model_shift_keys(e.m, f, 0, N, 11, &err) == 0, "shift fork: %s", err.msg);
    CHECK(key_diff(&e, a, orig, 0, e.m->cfg.n_layer, N, &s) == 0, "shifting a fork changed the original");
    CHECK(key_diff(&e, f, orig, 0, e.m->cfg.n_layer, N, &s) > 0, "the fork was not shifted");
    /* a range: [10, 30) moves, the rest stays */
    REQUIRE(ak_model_shift_keys(e.m, a, 10, 30, 11, &err) == 0, "shift range: %s", err.msg);
    int kd = e.m->spec.n_head_kv * e.m->spec.head_dim_k, vd = e.m->spec.n_head_kv * e.m->spec.head_dim_v;
    float *k0 = malloc(sizeof(float) * kd), *k1 = malloc(sizeof(float) * kd), *k2 = malloc(sizeof(float) * kd);
    float *v = malloc(sizeof(float) * vd);
    int wrong = 0;
    for (int l = 0; l < e.m->cfg.n_layer; l++)
        for (int p = 0; p < N; p++) {
            ak_kv_read(a, l, p, k0, v, &err);
            ak_kv_read(orig, l, p, k1, v, &err);
            ak_kv_read(f, l, p, k2, v, &err);
            int in = p >= 10 && p < 30;
            /* inside: as the fork shifted whole; outside: as before */
            wrong += memcmp(k0, in ? k2 : k1, sizeof(float) * kd) != 0;
        }
    CHECK(wrong == 0, "%d (layer, position) keys wrong after shifting [10, 30)", wrong);
    /* a shared base is not this sequence's to rotate */
    ak_kv *based = ak_kv_new(e.pool, AK_KV_F32, AK_KV_F32, 256, &err);
    REQUIRE(based, "kv: %s", err.msg);
    REQUIRE(ak_kv_attach_base(based, orig, 20, &err) == 0, "attach: %s", err.msg);
    REQUIRE(ak_eval(e.c, based, &(ak_eval_args){.tokens = tok + 20, .n = 10, .pos0 = 20}, &err) == 0,
            "extend: %s", err.msg);
    err.code = 0;
    CHECK(ak_model_shift_keys(e.m, based, 15, 25, 3, &err) < 0 && err.code == AK_ERR_INVALID, "base shifted: %d",
          err.code);
    CHECK(ak_model_shift_keys(e.m, based, 20, 30, 3, &err) == 0, "own positions past the base: %s", err.msg);
    free(k0); free(k1); free(k2); free(v);
    ak_kv_free(a); ak_kv_free(orig); ak_kv_free(f); ak_kv_free(based);
    env_close(&e);
}

/* A quantized key format: the shifted keys are the rotation of the stored
 * keys, quantized once more (q8: within its error of the exact rotation). */
TEST(shift_quantized_keys_requantized) {
    enum { N = 32, DELTA = 19 };
    shift_env e;
    if (!env_open(t, &e, "models/tiny-llama-h64-gqa-f32.gguf", 16, 16)) return;
    int32_t tok[N];
    some_tokens(e.m, tok, N, 31);
    ak_kv *q = prefill(t, &e, tok, N, 0, AK_KV_Q8), *d = prefill(t, &e, tok, N, DELTA, AK_KV_F32);
    ak_kv *f = prefill(t, &e, tok, N, 0, AK_KV_F32);
    REQUIRE(q && d && f, "prefill");
    ak_error err = {{0}};
    double s, qerr = key_diff(&e, q, f, 0, 1, N, &s);
    REQUIRE(ak_model_shift_keys(e.m, q, 0, N, DELTA, &err) == 0, "shift: %s", err.msg);
    double after = key_diff(&e, q, d, 0, 1, N, &s);
    fprintf(stderr, "  q8 keys: quantization error %.3g before, %.3g after a shift (vs exact at offset)\n", qerr, after);
    CHECK(after > 0 && after <= 3 * qerr + 1e-6, "q8 shifted keys differ by %g (quantization alone %g)", after, qerr);
    ak_kv_free(q); ak_kv_free(d); ak_kv_free(f);
    env_close(&e);
}
