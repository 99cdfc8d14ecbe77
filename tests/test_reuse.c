/* test_reuse.c - ak_reuse_prefill (reuse.h) on the tiny trained model:
 * FULL equals a plain prefill of the whole context bit for bit; NONE equals
 * a sequence built independently (the prefix prefilled, the chunk prefilled
 * alone at 0, each vector read back and written at its new position, keys
 * shifted, the rest prefilled); bad arguments are refused by code. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../src/blockpool.h"
#include "../src/kvformat.h"
#include "../src/reuse.h"
#include "test.h"
#include "test_model_env.h"

#define RCTX 256
enum { RP = 21, RX = 45, RY = 38, RQ = 9 };

/* P (prefix), X and Y (chunks), Q (the question). */
static void rtexts(int vocab, int32_t *P, int32_t *X, int32_t *Y, int32_t *Q) {
    for (int i = 0; i < RP; i++) P[i] = i ? (int32_t)((i * 37 + 11) % vocab) : 1;
    for (int i = 0; i < RX; i++) X[i] = (int32_t)((i * 53 + 7) % vocab);
    for (int i = 0; i < RY; i++) Y[i] = (int32_t)((i * 71 + 5) % vocab);
    for (int i = 0; i < RQ; i++) Q[i] = (int32_t)((i * 19 + 3) % vocab);
}

static ak_kv *rnew(ak_block_pool *pool, ak_kv_format f) {
    ak_error err = {{0}};
    return ak_kv_new(pool, f, f, RCTX, &err);
}

/* A chunk: tokens prefilled alone at 0 into a fresh sequence of format f. */
static ak_kv *rchunk(tenv *e, ak_block_pool *pool, ak_kv_format f, const int32_t *tok, int n) {
    ak_error err = {{0}};
    ak_kv *kv = rnew(pool, f);
    if (kv && ak_eval(e->ctx, kv, tok, n, 0, NULL, NULL, NULL, NULL, &err) < 0) {
        ak_kv_free(kv);
        return NULL;
    }
    return kv;
}

static double rmaxdiff(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* The whole context P X Y Q prefilled plainly: logits into out. */
static int rplain(tenv *e, ak_block_pool *pool, ak_kv_format f, const int32_t *all, int n, float *out) {
    ak_error err = {{0}};
    ak_kv *kv = rnew(pool, f);
    int rc = kv ? ak_eval(e->ctx, kv, all, n, 0, out, NULL, NULL, NULL, &err) : -1;
    ak_kv_free(kv);
    return rc;
}

TEST(reuse_full_equals_a_plain_prefill_and_none_the_chunks_moved_apart) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    REQUIRE(pool, "pool: %s", err.msg);
    int32_t P[RP], X[RX], Y[RY], Q[RQ], all[RP + RX + RY + RQ];
    rtexts(e.vocab, P, X, Y, Q);
    memcpy(all, P, sizeof P);
    memcpy(all + RP, X, sizeof X);
    memcpy(all + RP + RX, Y, sizeof Y);
    memcpy(all + RP + RX + RY, Q, sizeof Q);
    int N = RP + RX + RY + RQ, V = e.vocab;
    float *ref = malloc(sizeof(float) * V), *got = malloc(sizeof(float) * V);
    REQUIRE(ref && got, "oom");
    const ak_kv_format fmts[] = {AK_KV_F32, AK_KV_F16, AK_KV_Q4};
    for (int fi = 0; fi < 3; fi++) {
        ak_kv_format f = fmts[fi];
        ak_kv *cx = rchunk(&e, pool, f, X, RX), *cy = rchunk(&e, pool, f, Y, RY);
        REQUIRE(cx && cy, "chunks");
        ak_reuse_part parts[4] = {{P, RP, NULL}, {X, RX, cx}, {Y, RY, cy}, {Q, RQ, NULL}};
        /* full: the plain prefill's bits */
        REQUIRE(rplain(&e, pool, f, all, N, ref) == 0, "plain");
        ak_kv *kv = rnew(pool, f);
        ak_reuse_params p = {AK_REUSE_FULL, 0.5f, -1, 0};
        ak_reuse_stats st;
        CHECK(ak_reuse_prefill(e.ctx, kv, parts, 4, &p, got, &st, &err) == 0, "full: %s", err.msg);
        CHECK(memcmp(ref, got, sizeof(float) * V) == 0, "%s: full differs from a plain prefill by %g",
              ak_kv_format_get(f)->name, rmaxdiff(ref, got, V));
        CHECK(st.n_tokens == N && st.n_chunk_tokens == RX + RY && st.n_recomputed == RX + RY && st.check_layer == -1,
              "full stats %d %d %d %d", st.n_tokens, st.n_chunk_tokens, st.n_recomputed, st.check_layer);
        /* none: independently, each chunk vector read and written at its place, keys shifted */
        ak_kv *ind = rnew(pool, f);
        REQUIRE(ind, "kv");
        int at = 0;
        CHECK(ak_eval(e.ctx, ind, P, RP, 0, NULL, NULL, NULL, NULL, &err) == 0, "%s", err.msg);
        at = RP;
        const ak_kv *ch[2] = {cx, cy};
        int ln[2] = {RX, RY};
        size_t kd = (size_t)e.m->spec.n_head_kv * e.m->spec.head_dim_k;
        float *kvb = malloc(sizeof(float) * 2 * kd);
        for (int c = 0; c < 2; c++) {
            CHECK(ak_kv_prepare(ind, at, at + ln[c], &err) == 0, "%s", err.msg);
            for (int l = 0; l < e.m->cfg.n_layer; l++)
                for (int j = 0; j < ln[c]; j++) {
                    CHECK(ak_kv_read(ch[c], l, j, kvb, kvb + kd, &err) == 0, "%s", err.msg);
                    CHECK(ak_kv_write(ind, l, at + j, kvb, kvb + kd, &err) == 0, "%s", err.msg);
                }
            CHECK(ak_kv_set_length(ind, at + ln[c], &err) == 0, "%s", err.msg);
            CHECK(ak_model_shift_keys(e.m, ind, at, at + ln[c], at, &err) == 0, "%s", err.msg);
            at += ln[c];
        }
        free(kvb);
        CHECK(ak_eval(e.ctx, ind, Q, RQ, at, ref, NULL, NULL, NULL, &err) == 0, "%s", err.msg);
        ak_kv_truncate(kv, 0);
        p.method = AK_REUSE_NONE;
        CHECK(ak_reuse_prefill(e.ctx, kv, parts, 4, &p, got, &st, &err) == 0, "none: %s", err.msg);
        /* q4: a dequantized vector quantized again is the same code for
         * this format (absmax scale, codes on the grid), so equal too */
        CHECK(memcmp(ref, got, sizeof(float) * V) == 0, "%s: none differs from the independent build by %g",
              ak_kv_format_get(f)->name, rmaxdiff(ref, got, V));
        CHECK(st.n_recomputed == 0 && st.n_chunk_tokens == RX + RY, "none stats");
        /* and the full reference is not what none gives (the check can fail) */
        float *plain = malloc(sizeof(float) * V);
        rplain(&e, pool, f, all, N, plain);
        double dn = rmaxdiff(plain, got, V);
        CHECK(dn > 1e-3, "%s: none equals full (%g): the chunks never saw the prefix?", ak_kv_format_get(f)->name, dn);
        printf("  %s: none vs full max |dlogit| %.4f\n", ak_kv_format_get(f)->name, dn);
        free(plain);
        ak_kv_free(ind);
        ak_kv_free(kv);
        ak_kv_free(cx);
        ak_kv_free(cy);
    }
    free(ref);
    free(got);
    ak_block_pool_free(pool);
    tenv_close(&e);
}

TEST(reuse_refuses_bad_arguments_by_code) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&e.m->spec, 0, 0, &err), *other = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    REQUIRE(pool && other, "pool");
    int32_t P[RP], X[RX], Y[RY], Q[RQ];
    rtexts(e.vocab, P, X, Y, Q);
    ak_kv *cx = rchunk(&e, pool, AK_KV_F16, X, RX), *co = rchunk(&e, other, AK_KV_F16, X, RX);
    ak_kv *kv = rnew(pool, AK_KV_F16);
    REQUIRE(cx && co && kv, "kvs");
    ak_reuse_part parts[3] = {{P, RP, NULL}, {X, RX, cx}, {Q, RQ, NULL}};
    ak_reuse_params p = {AK_REUSE_CACHEBLEND, 1.5f, -1, 0};
    CHECK(ak_reuse_prefill(e.ctx, kv, parts, 3, &p, NULL, NULL, &err) < 0 && err.code == AK_ERR_INVALID, "ratio 1.5");
    p.ratio = NAN;
    CHECK(ak_reuse_prefill(e.ctx, kv, parts, 3, &p, NULL, NULL, &err) < 0 && err.code == AK_ERR_INVALID, "ratio NaN");
    p.ratio = -0.1f;
    CHECK(ak_reuse_prefill(e.ctx, kv, parts, 3, &p, NULL, NULL, &err) < 0 && err.code == AK_ERR_INVALID, "ratio <0");
    p.ratio = 0.1f;
    p.check_layer = e.m->cfg.n_layer;
    CHECK(ak_reuse_prefill(e.ctx, kv, parts, 3, &p, NULL, NULL, &err) < 0 && err.code == AK_ERR_INVALID, "check layer");
    p.check_layer = -1;
    p.method = AK_REUSE_NONE;
    parts[1].n = RX + 1;   /* longer than the chunk */
    CHECK(ak_reuse_prefill(e.ctx, kv, parts, 3, &p, NULL, NULL, &err) < 0 && err.code == AK_ERR_INVALID, "short chunk");
    parts[1].n = RX;
    parts[1].chunk = co;
    CHECK(ak_reuse_prefill(e.ctx, kv, parts, 3, &p, NULL, NULL, &err) < 0 && err.code == AK_ERR_INVALID, "other pool");
    parts[1].chunk = cx;
    CHECK(ak_reuse_prefill(e.ctx, kv, parts, 2, &p, e.logits, NULL, &err) < 0 && err.code == AK_ERR_INVALID,
          "logits after a chunk");
    int32_t *big = calloc(RCTX, sizeof(int32_t));
    ak_reuse_part over[2] = {{big, RCTX - RX + 1, NULL}, {X, RX, cx}};
    CHECK(ak_reuse_prefill(e.ctx, kv, over, 2, &p, NULL, NULL, &err) < 0 && err.code == AK_ERR_INVALID,
          "past the capacity");
    CHECK(ak_kv_length(kv) == 0, "kv touched by refused calls");
    CHECK(ak_reuse_prefill(e.ctx, kv, parts, 3, &p, NULL, NULL, &err) == 0, "%s", err.msg);
    CHECK(ak_reuse_prefill(e.ctx, kv, parts, 3, &p, NULL, NULL, &err) < 0 && err.code == AK_ERR_INVALID, "not empty");
    ak_reuse_method m;
    CHECK(ak_reuse_method_parse("agentkvshift", &m) == 0 && m == AK_REUSE_AGENTKVSHIFT, "parse");
    CHECK(ak_reuse_method_parse("blend", &m) < 0, "parse unknown");
    CHECK(!strcmp(ak_reuse_method_name(AK_REUSE_CACHEBLEND), "cacheblend"), "name");
    free(big);
    ak_kv_free(kv);
    ak_kv_free(cx);
    ak_kv_free(co);
    ak_block_pool_free(pool);
    ak_block_pool_free(other);
    tenv_close(&e);
}

/* The layer-range entry points: embed, layers [0, a), layers [a, L) in
 * two calls give ak_eval's logits and cache bits; ak_layer_kv gives the
 * bits the pass then writes (an f32 cache holds them exactly); a token
 * written again at a held position (non-contiguous batch) leaves the same
 * cache as the first pass. */
TEST(reuse_layer_ranges_equal_the_forward_pass) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    REQUIRE(pool, "pool");
    enum { N = 40 };
    int32_t tok[N], pos[N];
    for (int i = 0; i < N; i++) { tok[i] = (int32_t)((i * 29 + 3) % e.vocab); pos[i] = i; }
    int V = e.vocab, dim = e.m->cfg.dim, L = e.m->cfg.n_layer;
    size_t kd = (size_t)e.m->spec.n_head_kv * e.m->spec.head_dim_k;
    ak_kv *ref = rnew(pool, AK_KV_F32), *kv = rnew(pool, AK_KV_F32);
    float *lr = malloc(sizeof(float) * V), *lg = malloc(sizeof(float) * V), *x = malloc(sizeof(float) * N * dim);
    float *k = malloc(sizeof(float) * N * kd), *v = malloc(sizeof(float) * N * kd), *rk = malloc(sizeof(float) * 2 * kd);
    REQUIRE(ref && kv && lr && lg && x && k && v && rk, "oom");
    REQUIRE(ak_eval(e.ctx, ref, tok, N, 0, lr, NULL, NULL, NULL, &err) == 0, "%s", err.msg);
    ak_kv *seq[N];
    float *outs[N] = {0};
    for (int i = 0; i < N; i++) seq[i] = kv;
    outs[N - 1] = lg;
    ak_batch b = {N, tok, pos, seq, outs};
    int a = L / 2;
    CHECK(ak_model_embed(e.ctx, tok, N, x, &err) == 0, "%s", err.msg);
    CHECK(ak_forward_layers(e.ctx, &b, x, 0, a, &err) == 0, "%s", err.msg);
    CHECK(ak_layer_kv(e.ctx, &b, x, a, k, v, &err) == 0, "%s", err.msg);
    CHECK(ak_forward_layers(e.ctx, &b, x, a, L, &err) == 0, "%s", err.msg);
    CHECK(memcmp(lr, lg, sizeof(float) * V) == 0, "layer ranges differ from ak_eval by %g", rmaxdiff(lr, lg, V));
    int bad = 0;
    for (int l = 0; l < L; l++)
        for (int i = 0; i < N; i++) {
            float a1[512], a2[512];
            ak_kv_read(ref, l, i, a1, a1 + kd, &err);
            ak_kv_read(kv, l, i, a2, a2 + kd, &err);
            bad += memcmp(a1, a2, sizeof(float) * 2 * kd) != 0;
            if (l == a) {
                bad += memcmp(a1, k + i * kd, sizeof(float) * kd) != 0;
                bad += memcmp(a1 + kd, v + i * kd, sizeof(float) * kd) != 0;
            }
        }
    CHECK(bad == 0, "%d cache vectors differ", bad);
    /* tokens 5, 17, 33 again from layer a (their stream entering it): same bits */
    int32_t st[3] = {tok[5], tok[17], tok[33]}, sp[3] = {5, 17, 33};
    float *xs = malloc(sizeof(float) * 3 * dim);
    CHECK(ak_model_embed(e.ctx, tok, N, x, &err) == 0, "%s", err.msg);
    ak_batch bb = {N, tok, pos, seq, NULL};
    ak_kv *kv2 = rnew(pool, AK_KV_F32);
    for (int i = 0; i < N; i++) seq[i] = kv2;
    CHECK(ak_forward_layers(e.ctx, &bb, x, 0, a, &err) == 0, "%s", err.msg);
    for (int j = 0; j < 3; j++) memcpy(xs + j * dim, x + (size_t)sp[j] * dim, sizeof(float) * dim);
    CHECK(ak_forward_layers(e.ctx, &bb, x, a, L, &err) == 0, "%s", err.msg);
    ak_batch b3 = {3, st, sp, seq, NULL};
    CHECK(ak_forward_layers(e.ctx, &b3, xs, a, L, &err) == 0, "%s", err.msg);
    bad = 0;
    for (int l = 0; l < L; l++)
        for (int i = 0; i < N; i++) {
            float a1[512], a2[512];
            ak_kv_read(ref, l, i, a1, a1 + kd, &err);
            ak_kv_read(kv2, l, i, a2, a2 + kd, &err);
            bad += memcmp(a1, a2, sizeof(float) * 2 * kd) != 0;
        }
    CHECK(bad == 0, "recomputed tokens: %d cache vectors differ", bad);
    CHECK(ak_forward_layers(e.ctx, &b3, xs, a, a, &err) < 0 && err.code == AK_ERR_INVALID, "empty range");
    free(xs); free(lr); free(lg); free(x); free(k); free(v); free(rk);
    ak_kv_free(ref); ak_kv_free(kv); ak_kv_free(kv2);
    ak_block_pool_free(pool);
    tenv_close(&e);
}
