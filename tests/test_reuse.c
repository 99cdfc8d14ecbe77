/* test_reuse.c - ak_reuse_prefill (reuse.h) on the tiny trained model:
 * FULL equals a plain prefill of the whole context bit for bit; NONE equals
 * a sequence built independently (the prefix prefilled, the chunk prefilled
 * alone at 0, each vector read back and written at its new position, keys
 * shifted, the rest prefilled); bad arguments are refused by code. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kv/blockpool.h"
#include "kv/kvformat.h"
#include "engine/reuse.h"
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
    if (kv && ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = tok, .n = n}, &err) < 0) {
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
    int rc = kv ? ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = all, .n = n, .logits = out}, &err) : -1;
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
        ak_reuse_part parts[4] = {{.tokens = P, .n = RP, .chunk = NULL}, {.tokens = X, .n = RX, .chunk = cx},
                                  {.tokens = Y, .n = RY, .chunk = cy}, {.tokens = Q, .n = RQ, .chunk = NULL}};
        /* full: the plain prefill's bits */
        REQUIRE(rplain(&e, pool, f, all, N, ref) == 0, "plain");
        ak_kv *kv = rnew(pool, f);
        ak_reuse_params p = {.method = AK_REUSE_FULL, .ratio = 0.5f, .check_layer = -1};
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
        CHECK(ak_eval(e.ctx, ind, &(ak_eval_args){.tokens = P, .n = RP}, &err) == 0, "%s", err.msg);
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
        CHECK(ak_eval(e.ctx, ind, &(ak_eval_args){.tokens = Q, .n = RQ, .pos0 = at, .logits = ref}, &err) == 0,
              "%s", err.msg);
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
    ak_reuse_part parts[3] = {{.tokens = P, .n = RP, .chunk = NULL}, {.tokens = X, .n = RX, .chunk = cx},
                              {.tokens = Q, .n = RQ, .chunk = NULL}};
    ak_reuse_params p = {.method = AK_REUSE_CACHEBLEND, .ratio = 1.5f, .check_layer = -1};
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
    ak_reuse_part over[2] = {{.tokens = big, .n = RCTX - RX + 1, .chunk = NULL}, {.tokens = X, .n = RX, .chunk = cx}};
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
    REQUIRE(ak_eval(e.ctx, ref, &(ak_eval_args){.tokens = tok, .n = N, .logits = lr}, &err) == 0, "%s", err.msg);
    ak_kv *seq[N];
    float *outs[N] = {0};
    for (int i = 0; i < N; i++) seq[i] = kv;
    outs[N - 1] = lg;
    ak_batch b = {.n = N, .token = tok, .pos = pos, .seq = seq, .logits_out = outs};
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
    ak_batch bb = {.n = N, .token = tok, .pos = pos, .seq = seq};
    ak_kv *kv2 = rnew(pool, AK_KV_F32);
    for (int i = 0; i < N; i++) seq[i] = kv2;
    CHECK(ak_forward_layers(e.ctx, &bb, x, 0, a, &err) == 0, "%s", err.msg);
    for (int j = 0; j < 3; j++) memcpy(xs + j * dim, x + (size_t)sp[j] * dim, sizeof(float) * dim);
    CHECK(ak_forward_layers(e.ctx, &bb, x, a, L, &err) == 0, "%s", err.msg);
    ak_batch b3 = {.n = 3, .token = st, .pos = sp, .seq = seq};
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

/* The chunks X and Y computed alone (cx, cy) in format f, and where a
 * context built over them lives. */
typedef struct {
    tenv *e;
    ak_block_pool *pool;
    ak_kv_format f;
    const ak_kv *cx, *cy;
} rchunks;

/* The context P X Y Q with both chunks of c placed by params p into a fresh
 * sequence of c's format; logits into out (if not NULL), stats into st.
 * Returns the sequence, or NULL with a test failure recorded. */
static ak_kv *rbuild(ak_test_ctx *t, const rchunks *c, const ak_reuse_params *p, float *out, ak_reuse_stats *st) {
    tenv *e = c->e;
    const ak_kv *cx = c->cx, *cy = c->cy;
    ak_error err = {{0}};
    int32_t P[RP], X[RX], Y[RY], Q[RQ];
    rtexts(e->vocab, P, X, Y, Q);
    ak_reuse_part parts[4] = {{.tokens = P, .n = RP, .chunk = NULL}, {.tokens = X, .n = RX, .chunk = cx},
                              {.tokens = Y, .n = RY, .chunk = cy}, {.tokens = Q, .n = RQ, .chunk = NULL}};
    ak_kv *kv = rnew(c->pool, c->f);
    if (!kv || ak_reuse_prefill(e->ctx, kv, parts, 4, p, out, st, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "%s r=%g: %s", ak_reuse_method_name(p->method), (double)p->ratio, err.msg);
        ak_kv_free(kv);
        return NULL;
    }
    return kv;
}

/* Vectors of layers [l0, l1) at positions [p0, p1) that differ between a and b. */
static int rdiffs(const ak_kv *a, const ak_kv *b, int l0, int l1, int p0, int p1, size_t kd) {
    ak_error err = {{0}};
    float x[1024], y[1024];
    int n = 0;
    for (int l = l0; l < l1; l++)
        for (int p = p0; p < p1; p++) {
            ak_kv_read(a, l, p, x, x + kd, &err);
            ak_kv_read(b, l, p, y, y + kd, &err);
            n += memcmp(x, y, sizeof(float) * 2 * kd) != 0;
        }
    return n;
}

/* CacheBlend and AgentKVShift at ratio 1 equal full bit for bit (every
 * chunk token recomputed, in the plain block layout); at ratio 0 the cache
 * holds full's bits at layers below the check layer and none's from it on;
 * in between the counts are ceil(r * n) per chunk. */
TEST(reuse_blend_ratio_1_is_full_and_ratio_0_is_none_above_the_check_layer) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    REQUIRE(pool, "pool");
    int32_t P[RP], X[RX], Y[RY], Q[RQ];
    rtexts(e.vocab, P, X, Y, Q);
    int V = e.vocab, L = e.m->cfg.n_layer, N = RP + RX + RY + RQ;
    size_t kd = (size_t)e.m->spec.n_head_kv * e.m->spec.head_dim_k;
    float *ref = malloc(sizeof(float) * V), *got = malloc(sizeof(float) * V);
    const ak_kv_format fmts[] = {AK_KV_F32, AK_KV_Q4};
    for (int fi = 0; fi < 2; fi++) {
        ak_kv_format f = fmts[fi];
        ak_kv *cx = rchunk(&e, pool, f, X, RX), *cy = rchunk(&e, pool, f, Y, RY);
        REQUIRE(cx && cy, "chunks");
        const rchunks ch = {.e = &e, .pool = pool, .f = f, .cx = cx, .cy = cy};
        ak_reuse_params full = {.method = AK_REUSE_FULL, .check_layer = -1},
            none = {.method = AK_REUSE_NONE, .check_layer = -1};
        ak_reuse_stats st;
        ak_kv *kf = rbuild(t, &ch, &full, ref, &st), *kn = rbuild(t, &ch, &none, NULL, &st);
        REQUIRE(kf && kn, "full, none");
        for (int mi = 0; mi < 2; mi++) {
            ak_reuse_params p = {.method = mi ? AK_REUSE_AGENTKVSHIFT : AK_REUSE_CACHEBLEND, .ratio = 1.0f,
                                 .check_layer = -1};
            ak_kv *kv = rbuild(t, &ch, &p, got, &st);
            REQUIRE(kv, "r=1");
            CHECK(memcmp(ref, got, sizeof(float) * V) == 0, "%s %s r=1: logits differ from full by %g",
                  ak_kv_format_get(f)->name, ak_reuse_method_name(p.method), rmaxdiff(ref, got, V));
            CHECK(rdiffs(kv, kf, 0, L, 0, N, kd) == 0, "r=1: cache differs from full's");
            CHECK(st.n_recomputed == RX + RY && st.check_layer == 1, "r=1 stats %d %d", st.n_recomputed, st.check_layer);
            ak_kv_free(kv);
            p.ratio = 0.0f;
            kv = rbuild(t, &ch, &p, got, &st);
            REQUIRE(kv, "r=0");
            CHECK(st.n_recomputed == 0, "r=0 recomputed %d", st.n_recomputed);
            CHECK(rdiffs(kv, kf, 0, 1, 0, N - RQ, kd) == 0, "r=0: layer 0 differs from full's");
            CHECK(rdiffs(kv, kn, 1, L, 0, N - RQ, kd) == 0, "r=0: layers >= 1 differ from none's");
            int d0 = rdiffs(kv, kn, 0, 1, RP, N - RQ, kd);
            CHECK(d0 > 0, "r=0: layer 0 of the chunks equals none's: nothing was recomputed below the check layer");
            CHECK(ak_kv_corrections(kv) == 0, "r=0: no correction expected");
            ak_kv_free(kv);
            p.ratio = 0.1f;   /* 45 -> 5, 38 -> 4 */
            kv = rbuild(t, &ch, &p, got, &st);
            CHECK(kv && st.n_recomputed == 5 + 4, "r=0.1 recomputed %d", st.n_recomputed);
            CHECK(kv && ak_kv_corrections(kv) == (mi ? 2 : 0), "corrections %d", kv ? ak_kv_corrections(kv) : -1);
            ak_kv_free(kv);
        }
        ak_kv_free(kf); ak_kv_free(kn); ak_kv_free(cx); ak_kv_free(cy);
    }
    free(ref); free(got);
    ak_block_pool_free(pool);
    tenv_close(&e);
}

/* AgentKVShift's attention-time correction against the same correction
 * materialized: an f32 sequence holding, at every position and layer, the
 * stored vectors (read back) plus w_j mu_K, w_j mu_V written explicitly
 * where a range corrects them; continuing both with the same tokens gives
 * the same logits within float rounding (printed). Also: the weights are
 * the documented ones (unit_weights gives 1), the correction changes the
 * logits (else the test could not fail), and it survives a fork. */
TEST(reuse_agentkvshift_correction_equals_the_materialized_one) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    REQUIRE(pool, "pool");
    int32_t P[RP], X[RX], Y[RY], Q[RQ], T2[7];
    rtexts(e.vocab, P, X, Y, Q);
    for (int i = 0; i < 7; i++) T2[i] = (int32_t)((i * 13 + 17) % e.vocab);
    int V = e.vocab, L = e.m->cfg.n_layer, H = e.m->spec.n_head_kv, dk = e.m->spec.head_dim_k, N = RP + RX + RY + RQ;
    size_t kd = (size_t)H * dk;
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V), *u = malloc(sizeof(float) * V);
    const ak_kv_format fmts[] = {AK_KV_F32, AK_KV_Q4, AK_KV_TQ3};
    for (int fi = 0; fi < 3; fi++) {
        ak_kv_format f = fmts[fi];
        ak_kv *cx = rchunk(&e, pool, f, X, RX), *cy = rchunk(&e, pool, f, Y, RY);
        REQUIRE(cx && cy, "chunks");
        const rchunks ch = {.e = &e, .pool = pool, .f = f, .cx = cx, .cy = cy};
        ak_reuse_params p = {.method = AK_REUSE_AGENTKVSHIFT, .ratio = 0.2f, .check_layer = -1};
        ak_reuse_stats st;
        ak_kv *kv = rbuild(t, &ch, &p, NULL, &st);
        REQUIRE(kv && ak_kv_corrections(kv) == 2, "agentkvshift: %d ranges", kv ? ak_kv_corrections(kv) : -1);
        /* materialized */
        ak_kv *mat = rnew(pool, AK_KV_F32);
        REQUIRE(ak_kv_prepare(mat, 0, N, &err) == 0, "%s", err.msg);
        float vec[1024];
        int n_probe = 0, wbad = 0;
        for (int l = 0; l < L; l++)
            for (int pos = 0; pos < N; pos++) {
                ak_kv_read(kv, l, pos, vec, vec + kd, &err);
                for (int r = 0; r < ak_kv_corrections(kv); r++) {
                    int s0, n, l0;
                    const float *w;
                    ak_kv_correction_get(kv, r, &s0, &n, &l0, &w);
                    const float *mk = ak_kv_correction_mu(kv, r, l, 0), *mv = ak_kv_correction_mu(kv, r, l, 1);
                    if (pos < s0 || pos >= s0 + n || l < l0) continue;
                    if (!mk || !mv) { wbad++; continue; }
                    for (size_t d = 0; d < kd; d++) {
                        vec[d] += w[pos - s0] * mk[d];
                        vec[kd + d] += w[pos - s0] * mv[d];
                    }
                    if (l == l0) {
                        n_probe += w[pos - s0] == 0.0f;
                        wbad += !(w[pos - s0] >= 0.0f && w[pos - s0] <= 1.0001f);
                    }
                }
                ak_kv_write(mat, l, pos, vec, vec + kd, &err);
            }
        REQUIRE(ak_kv_set_length(mat, N, &err) == 0, "%s", err.msg);
        CHECK(wbad == 0, "%d weights or layers not as documented", wbad);
        CHECK(n_probe == 9 + 8, "probes (w = 0): %d, expected 9 + 8", n_probe);
        /* continue both */
        ak_kv *fk = ak_kv_fork(kv, &err);
        REQUIRE(fk && ak_kv_corrections(fk) == 2, "fork keeps the corrections");
        CHECK(ak_eval(e.ctx, kv, &(ak_eval_args){.tokens = T2, .n = 7, .pos0 = N, .logits = a}, &err) == 0,
              "%s", err.msg);
        CHECK(ak_eval(e.ctx, mat, &(ak_eval_args){.tokens = T2, .n = 7, .pos0 = N, .logits = b}, &err) == 0,
              "%s", err.msg);
        /* the continuation's own K/V are stored in f by kv and in f32 by
         * mat, so the logits are compared for the f32 cache; for every
         * format, attention itself is compared: every layer and KV head,
         * queries of a fixed pattern over the N positions of both */
        double d = rmaxdiff(a, b, V), da = 0;
        if (f == AK_KV_F32)
            CHECK(d < 2e-4, "%s: attention-time vs materialized correction: max |dlogit| %g", ak_kv_format_get(f)->name, d);
        int nq = e.m->cfg.n_head / H;
        float *qv = malloc(sizeof(float) * nq * dk), *o1 = malloc(sizeof(float) * nq * dk), *o2 = malloc(sizeof(float) * nq * dk);
        float *scr = malloc(sizeof(float) * ak_kv_attend_scratch(kv, nq));
        float *scr2 = malloc(sizeof(float) * ak_kv_attend_scratch(mat, nq));
        for (int l = 0; l < L; l++)
            for (int h = 0; h < H; h++) {
                for (int i = 0; i < nq * dk; i++) qv[i] = (float)sin(0.37 * i + l + 3.1 * h) * 2.0f;
                ak_kv_attend(kv, &(ak_kv_query){.layer = l, .kv_head = h, .q = qv, .n_q = nq,
                             .scale = e.m->cfg.attn_scale, .out = o1, .scratch = scr}, N);
                ak_kv_attend(mat, &(ak_kv_query){.layer = l, .kv_head = h, .q = qv, .n_q = nq,
                             .scale = e.m->cfg.attn_scale, .out = o2, .scratch = scr2}, N);
                da = fmax(da, rmaxdiff(o1, o2, nq * dk));
            }
        CHECK(da < 1e-4, "%s: attention with the correction vs materialized: max |d| %g", ak_kv_format_get(f)->name, da);
        free(qv); free(o1); free(o2); free(scr); free(scr2);
        CHECK(ak_eval(e.ctx, fk, &(ak_eval_args){.tokens = T2, .n = 7, .pos0 = N, .logits = u}, &err) == 0,
              "%s", err.msg);
        CHECK(memcmp(a, u, sizeof(float) * V) == 0, "the fork continues differently");
        /* without the correction the logits move (the check above can fail) */
        ak_kv_correction_clear(fk);
        ak_kv_truncate(fk, N);
        CHECK(ak_eval(e.ctx, fk, &(ak_eval_args){.tokens = T2, .n = 7, .pos0 = N, .logits = u}, &err) == 0,
              "%s", err.msg);
        double dc = rmaxdiff(a, u, V);
        CHECK(dc > 1e-3, "the correction changes nothing (%g)", dc);
        printf("  %s: corrected vs materialized: attention max |d| %.2e, logits max |d| %.2e%s; vs uncorrected %.4f\n",
               ak_kv_format_get(f)->name, da, d, f == AK_KV_F32 ? "" : " (continuation stored in another format)", dc);
        /* unit weights: all 1 but the probes */
        ak_reuse_params pu = p;
        pu.unit_weights = 1;
        ak_kv *ku = rbuild(t, &ch, &pu, NULL, &st);
        REQUIRE(ku, "unit weights");
        int ones = 0, zeros = 0;
        for (int r = 0; r < 2; r++) {
            int s0, n, l0;
            const float *w;
            ak_kv_correction_get(ku, r, &s0, &n, &l0, &w);
            for (int j = 0; j < n; j++) { ones += w[j] == 1.0f; zeros += w[j] == 0.0f; }
        }
        CHECK(ones == RX + RY - 17 && zeros == 17, "unit weights: %d ones, %d zeros", ones, zeros);
        ak_kv_free(ku);
        ak_kv_free(fk); ak_kv_free(mat); ak_kv_free(kv); ak_kv_free(cx); ak_kv_free(cy);
    }
    free(a); free(b); free(u);
    ak_block_pool_free(pool);
    tenv_close(&e);
}

/* How close each method gets to full on this context (printed, with the
 * one claim that holds by construction: ratio 1 is exact). KL(full || m)
 * of the next-token distribution after Q. */
static double rkl(const float *p, const float *q, int n) {
    double mp = -INFINITY, mq = -INFINITY, sp = 0, sq = 0, kl = 0;
    for (int i = 0; i < n; i++) { mp = fmax(mp, p[i]); mq = fmax(mq, q[i]); }
    for (int i = 0; i < n; i++) { sp += exp(p[i] - mp); sq += exp(q[i] - mq); }
    for (int i = 0; i < n; i++) {
        double lp = p[i] - mp - log(sp), lq = q[i] - mq - log(sq);
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

TEST(reuse_methods_kl_against_full_printed) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    REQUIRE(pool, "pool");
    int32_t P[RP], X[RX], Y[RY], Q[RQ];
    rtexts(e.vocab, P, X, Y, Q);
    int V = e.vocab;
    float *ref = malloc(sizeof(float) * V), *got = malloc(sizeof(float) * V);
    ak_kv *cx = rchunk(&e, pool, AK_KV_F16, X, RX), *cy = rchunk(&e, pool, AK_KV_F16, Y, RY);
    const rchunks ch = {.e = &e, .pool = pool, .f = AK_KV_F16, .cx = cx, .cy = cy};
    ak_reuse_params full = {.method = AK_REUSE_FULL, .check_layer = -1};
    ak_reuse_stats st;
    ak_kv_free(rbuild(t, &ch, &full, ref, &st));
    const float ratios[] = {0, 0.1f, 0.3f, 0.5f, 1};
    for (int mi = 0; mi < 3; mi++) {
        ak_reuse_method m = mi == 0 ? AK_REUSE_CACHEBLEND : AK_REUSE_AGENTKVSHIFT;
        printf("  %-12s%s", ak_reuse_method_name(m), mi == 2 ? "(w=1)" : "     ");
        for (int ri = 0; ri < 5; ri++) {
            ak_reuse_params p = {.method = m, .ratio = ratios[ri], .check_layer = -1, .unit_weights = mi == 2};
            ak_kv_free(rbuild(t, &ch, &p, got, &st));
            double kl = rkl(ref, got, V);
            printf(" r=%.1f KL %.5f", (double)ratios[ri], kl);
            if (ratios[ri] == 1) CHECK(kl == 0, "ratio 1 is not full");
        }
        printf("\n");
    }
    ak_kv_free(cx); ak_kv_free(cy);
    free(ref); free(got);
    ak_block_pool_free(pool);
    tenv_close(&e);
}

/* Every family: cacheblend and agentkvshift at ratio 1 equal full bit for
 * bit, at ratio 0.2 they run (a different cache); deepseek2 (MLA) refuses
 * them by code and still runs none and full. */
TEST(reuse_every_family_ratio_1_is_full) {
    const char *models[] = {"models/stories260K.gguf", "models/qwen2-tiny.gguf", "models/qwen3-tiny.gguf",
                            "models/gemma3-tiny.gguf", "models/deepseek2-tiny.gguf"};
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
        ak_error err = {{0}};
        char path[600];
        ak_model *m = ak_model_load(test_path(path, sizeof path, models[mi]), NULL, NULL, &err);
        REQUIRE(m, "%s: %s", path, err.msg);
        ak_ctx *c = ak_ctx_new(m, 32, 2, &err);
        ak_block_pool *pool = ak_block_pool_new(&m->spec, 0, 0, &err);
        REQUIRE(c && pool, "ctx");
        int V = m->cfg.vocab, mla = m->cfg.kv_lora > 0;
        int32_t P[9], X[41], Q[5];
        for (int i = 0; i < 9; i++) P[i] = (int32_t)((i * 37 + 11) % V);
        for (int i = 0; i < 41; i++) X[i] = (int32_t)((i * 53 + 7) % V);
        for (int i = 0; i < 5; i++) Q[i] = (int32_t)((i * 19 + 3) % V);
        ak_kv *cx = ak_kv_new(pool, AK_KV_F16, AK_KV_F16, 128, &err);
        REQUIRE(cx && ak_eval(c, cx, &(ak_eval_args){.tokens = X, .n = 41}, &err) == 0, "chunk: %s", err.msg);
        ak_reuse_part parts[3] = {{.tokens = P, .n = 9, .chunk = NULL}, {.tokens = X, .n = 41, .chunk = cx},
                                  {.tokens = Q, .n = 5, .chunk = NULL}};
        float *ref = malloc(sizeof(float) * V), *got = malloc(sizeof(float) * V);
        ak_reuse_params full = {.method = AK_REUSE_FULL, .check_layer = -1};
        ak_kv *kv = ak_kv_new(pool, AK_KV_F16, AK_KV_F16, 128, &err);
        CHECK(ak_reuse_prefill(c, kv, parts, 3, &full, ref, NULL, &err) == 0, "%s full: %s", models[mi], err.msg);
        for (int me = 0; me < 2; me++) {
            for (int r = 0; r < 2; r++) {
                ak_reuse_params p = {.method = me ? AK_REUSE_AGENTKVSHIFT : AK_REUSE_CACHEBLEND,
                                     .ratio = r ? 0.2f : 1.0f, .check_layer = -1};
                ak_kv_truncate(kv, 0);
                int rc = ak_reuse_prefill(c, kv, parts, 3, &p, got, NULL, &err);
                if (mla) {
                    CHECK(rc < 0 && err.code == AK_ERR_INVALID && ak_kv_length(kv) == 0, "%s: MLA %s not refused",
                          models[mi], ak_reuse_method_name(p.method));
                    continue;
                }
                CHECK(rc == 0, "%s %s: %s", models[mi], ak_reuse_method_name(p.method), err.msg);
                if (r == 0)
                    CHECK(rc == 0 && memcmp(ref, got, sizeof(float) * V) == 0, "%s %s r=1: differs from full by %g",
                          models[mi], ak_reuse_method_name(p.method), rmaxdiff(ref, got, V));
                else
                    CHECK(rc == 0 && memcmp(ref, got, sizeof(float) * V) != 0, "%s %s r=0.2 equals full",
                          models[mi], ak_reuse_method_name(p.method));
            }
        }
        ak_reuse_params none = {.method = AK_REUSE_NONE, .check_layer = -1};
        ak_kv_truncate(kv, 0);
        CHECK(ak_reuse_prefill(c, kv, parts, 3, &none, got, NULL, &err) == 0, "%s none: %s", models[mi], err.msg);
        free(ref);
        free(got);
        ak_kv_free(kv);
        ak_kv_free(cx);
        ak_block_pool_free(pool);
        ak_ctx_free(c);
        ak_model_free(m);
    }
}

/* A span of another sequence placed at another position (handoff reuse):
 * the source holds P X, X at [RP, RP + RX); the target holds a head G of
 * another length and gets X placed after it by NONE. The reference for
 * the moved keys is the model itself run at the new positions: the source
 * recomputed with the context's position offset set to the shift (RoPE
 * attention sees only position differences, so every pre-rotation vector
 * is the same computation and the keys come out rotated for the new
 * positions), equal up to float rounding. At the same position the bytes
 * are the source's exactly. */
TEST(reuse_span_placed_from_another_sequence_moves_its_keys) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    REQUIRE(pool, "pool: %s", err.msg);
    int32_t P[RP], X[RX], Y[RY], Q[RQ], src_tok[RP + RX];
    rtexts(e.vocab, P, X, Y, Q);
    memcpy(src_tok, P, sizeof P);
    memcpy(src_tok + RP, X, sizeof X);
    const int G = RP + 13;   /* the target's head: 13 positions longer, not a block's multiple */
    int32_t head[RP + 13];
    for (int i = 0; i < G; i++) head[i] = i < RY ? Y[i] : Q[i % RQ];
    const ak_cache_spec *sp = &e.m->spec;
    int L = e.m->cfg.n_layer;
    size_t kd = (size_t)sp->n_head_kv * sp->head_dim_k, vd = (size_t)sp->n_head_kv * sp->head_dim_v;
    float *a = malloc(sizeof(float) * (kd + vd)), *b = malloc(sizeof(float) * (kd + vd));
    ak_kv *src = rchunk(&e, pool, AK_KV_F32, src_tok, RP + RX), *dst = rchunk(&e, pool, AK_KV_F32, head, G);
    ak_kv *same = rchunk(&e, pool, AK_KV_F32, P, RP);
    REQUIRE(a && b && src && dst && same, "setup");
    const ak_reuse_params none = {.method = AK_REUSE_NONE, .check_layer = -1};
    ak_reuse_part part = {.tokens = X, .n = RX, .chunk = src, .src_at = RP};
    REQUIRE(ak_reuse_place(e.ctx, dst, &part, &none, NULL, &err) == 0, "place at %d: %s", G, err.msg);
    REQUIRE(ak_reuse_place(e.ctx, same, &part, &none, NULL, &err) == 0, "place at %d: %s", RP, err.msg);
    CHECK(ak_kv_length(dst) == G + RX && ak_kv_length(same) == RP + RX, "lengths %d, %d", ak_kv_length(dst),
          ak_kv_length(same));
    /* at the same position: the source's values and keys exactly */
    double dsame = 0;
    for (int l = 0; l < L; l++)
        for (int j = 0; j < RX; j++) {
            ak_kv_read(src, l, RP + j, a, a + kd, &err);
            ak_kv_read(same, l, RP + j, b, b + kd, &err);
            dsame = fmax(dsame, rmaxdiff(a, b, (int)(kd + vd)));
        }
    CHECK(dsame == 0, "placed at its own position: max |diff| %g", dsame);
    /* moved by 13: the model's own keys at the new positions */
    ak_ctx_set_pos_offset(e.ctx, G - RP);
    ak_kv *moved = rchunk(&e, pool, AK_KV_F32, src_tok, RP + RX);
    ak_ctx_set_pos_offset(e.ctx, 0);
    REQUIRE(moved, "the reference");
    double dk = 0, dv = 0, kmax = 0, dstale = 0;
    for (int l = 0; l < L; l++)
        for (int j = 0; j < RX; j++) {
            ak_kv_read(moved, l, RP + j, a, a + kd, &err);
            ak_kv_read(dst, l, G + j, b, b + kd, &err);
            dk = fmax(dk, rmaxdiff(a, b, (int)kd));
            dv = fmax(dv, rmaxdiff(a + kd, b + kd, (int)vd));
            for (size_t i = 0; i < kd; i++) kmax = fmax(kmax, fabs(a[i]));
            ak_kv_read(src, l, RP + j, b, b + kd, &err);   /* unmoved: what a wrong shift would leave */
            dstale = fmax(dstale, rmaxdiff(a, b, (int)kd));
        }
    printf("    keys moved by %d: max |diff| %.3g (max |k| %.3g; unmoved keys differ by %.3g), values %.3g\n", G - RP,
           dk, kmax, dstale, dv);
    CHECK(dk <= 1e-3 * kmax && dv <= 1e-3 * kmax, "moved keys differ by %g, values by %g (max |k| %g)", dk, dv, kmax);
    CHECK(dstale > 100 * dk, "the unmoved keys are as close (%g vs %g): the check cannot tell", dstale, dk);
    /* a source position past the source: refused, the target unchanged */
    part.src_at = RP + 1;
    CHECK(ak_reuse_place(e.ctx, same, &part, &none, NULL, &err) < 0 && err.code == AK_ERR_INVALID &&
              ak_kv_length(same) == RP + RX, "a span past its source accepted");
    ak_kv_free(moved);
    ak_kv_free(src);
    ak_kv_free(dst);
    ak_kv_free(same);
    free(a);
    free(b);
    ak_block_pool_free(pool);
    tenv_close(&e);
}
