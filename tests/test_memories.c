/* test_memories.c - memory chunks (memories.h) on a real tiny model: a
 * memory holds the bytes of its tokens prefilled alone at position 0 (an
 * independent ak_eval); the same content under a second id is computed once
 * and its blocks shared (pool stats); placed in a turn with reuse "none" the
 * next logits equal an independently built cache (the prefix computed
 * alone, the chunk computed alone at 0 and key-shifted by the prefix's
 * length, copied into one plain sequence) and differ measurably from a
 * prefill of the whole prompt ("full", which equals a plain prefill bit
 * for bit); memories persist across a restart, an agent holding a placed
 * memory restores bit for bit without it; bad inputs (ids, unknown, other
 * contents, too long, corrupt file, another model's file) are refused by
 * code. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agents/agent.h"
#include "agents/memories.h"
#include "test.h"
#include "test_model_env.h"
#include "test_store_util.h"


#define MCTX 256
enum { NP = 37, NX = 29, NY = 40, NQ = 5 };

/* P (the system prefix), X and Y (two chunks), Q (the rest of the prompt). */
static void texts(int vocab, int32_t *P, int32_t *X, int32_t *Y, int32_t *Q) {
    for (int i = 0; i < NP; i++) P[i] = i ? (int32_t)((i * 37 + 11) % vocab) : 1;
    for (int i = 0; i < NX; i++) X[i] = (int32_t)((i * 53 + 7) % vocab);
    for (int i = 0; i < NY; i++) Y[i] = (int32_t)((i * 71 + 5) % vocab);
    for (int i = 0; i < NQ; i++) Q[i] = (int32_t)((i * 19 + 3) % vocab);
}

static ak_agents *agents_at(tenv *e, ak_block_pool **pool, ak_store *store) {
    ak_error err = {{0}};
    *pool = ak_block_pool_new(&e->m->spec, 0, 0, &err);
    ak_agents_config c = {.model = e->m, .pool = *pool, .store = store, .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = MCTX, .save = AK_SAVE_EVERY_TURN};
    return *pool ? ak_agents_new(&c, &err) : NULL;
}

/* A fresh f16 cache of pool with tokens[0..n) prefilled from position 0
 * (its last logits into e->logits). */
static ak_kv *alone(tenv *e, ak_block_pool *pool, const int32_t *tokens, int n) {
    ak_error err = {{0}};
    ak_kv *kv = ak_kv_new(pool, AK_KV_F16, AK_KV_F16, MCTX, &err);
    if (kv && ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = tokens, .n = n, .logits = e->logits}, &err) < 0) {
        ak_kv_free(kv);
        return NULL;
    }
    return kv;
}

static double max_abs_diff(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* A turn with memories placed the way the scheduler does it (reuse
 * "none"): the prompt is P, then each chunk in ms[] (k of them, lengths
 * ls), then Q; prefill up to each chunk, place it, prefill the rest. Agent
 * o->id, the prompt o->tokens[0..o->n), memory i at o->at[i] (o->k of
 * them). Last logits into out. Returns 0, or -1 with the error printed. */
static int turn_with(tenv *e, ak_agents *ag, const ak_turn_opts *o, const char *const *ms, float *out, ak_turn *ti) {
    const char *id = o->id;
    const int32_t *prompt = o->tokens;
    const int n = o->n, *at = o->at, k = o->k;
    ak_error err = {{0}};
    ak_kv *kv;
    int len[8] = {0};
    for (int i = 0; i < k; i++) {
        ak_memory_info mi;
        if (ak_memory_get(ag, ms[i], &mi, NULL, &err) < 0) goto fail;
        len[i] = mi.n_tokens;
    }
    if (ak_agent_open(ag, &(ak_turn_opts){.id = id, .tokens = prompt, .n = n, .n_reserve = n, .at = at, .len = len,
                      .k = k}, &kv, ti, &err) < 0) goto fail;
    int pos = ti->reused;
    for (int i = 0; i < k; i++) {
        if (pos > at[i]) continue;   /* reused already */
        if (at[i] > pos && ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = prompt + pos, .n = at[i] - pos, .pos0 = pos},
                                   &err) < 0) goto fail;
        if (ak_agent_place_memory(ag, &(ak_place_opts){.id = id, .mem_id = ms[i], .tokens = prompt, .at = at[i]}, &kv,
                                  &err) < 0) goto fail;
        pos = ak_kv_length(kv);
    }
    if (ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = prompt + pos, .n = n - pos, .pos0 = pos, .logits = out},
                &err) < 0 || ak_agent_commit(ag, id, prompt, n, &err) < 0 || ak_agent_end(ag, id, &err) < 0)
        goto fail;
    return 0;
fail:
    fprintf(stderr, "turn_with %s: %s\n", id, err.msg);
    ak_agent_abort(ag, id);
    return -1;
}

/* tokens[0..n) computed alone in formats fk/fv, then copied vector by
 * vector (dequantized, quantized again) into an f16 sequence. */
static ak_kv *alone_as(tenv *e, ak_block_pool *pool, ak_kv_format fk, ak_kv_format fv, const int32_t *tokens, int n) {
    ak_error err = {{0}};
    ak_kv *src = ak_kv_new(pool, fk, fv, MCTX, &err), *dst = ak_kv_new(pool, AK_KV_F16, AK_KV_F16, MCTX, &err);
    int rc = src && dst && ak_eval(e->ctx, src, &(ak_eval_args){.tokens = tokens, .n = n}, &err) == 0 &&
                     ak_kv_prepare(dst, 0, n, &err) == 0 ? 0 : -1;
    float k[1024], v[1024];
    for (int l = 0; rc == 0 && l < e->m->spec.n_layer; l++)
        for (int p = 0; rc == 0 && p < n; p++) {
            rc = ak_kv_read(src, l, p, k, v, &err);
            if (rc == 0) rc = ak_kv_write(dst, l, p, k, v, &err);
        }
    ak_kv_free(src);
    if (rc < 0) {
        ak_kv_free(dst);
        return NULL;
    }
    return dst;
}

/* The expectation built by hand: P computed alone, X (in formats xk/xv,
 * then converted to f16) and Y each computed alone at 0 with their keys
 * shifted to where they go, all copied position by position into one
 * plain sequence, then Q computed after them; last logits into out. */
static int by_hand(tenv *e, ak_kv_format xk, ak_kv_format xv, const int32_t *P, const int32_t *X, const int32_t *Y,
                   const int32_t *Q, float *out) {
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&e->m->spec, 0, 0, &err);
    ak_kv *kp = alone(e, pool, P, NP), *kx = alone_as(e, pool, xk, xv, X, NX), *ky = alone(e, pool, Y, NY);
    ak_kv *kv = ak_kv_new(pool, AK_KV_F16, AK_KV_F16, MCTX, &err);
    int n = NP + NX + NY;
    int rc = kp && kx && ky && kv && ak_model_shift_keys(e->m, kx, 0, NX, NP, &err) == 0 &&
                     ak_model_shift_keys(e->m, ky, 0, NY, NP + NX, &err) == 0 && ak_kv_prepare(kv, 0, n, &err) == 0
                 ? 0
                 : -1;
    int H = e->m->spec.n_head_kv;
    float *k = malloc(sizeof(float) * (size_t)H * (e->m->spec.head_dim_k + e->m->spec.head_dim_v));
    float *v = k + (size_t)H * e->m->spec.head_dim_k;
    for (int l = 0; rc == 0 && l < e->m->spec.n_layer; l++)
        for (int p = 0; rc == 0 && p < n; p++) {
            const ak_kv *src = p < NP ? kp : p < NP + NX ? kx : ky;
            int q = p < NP ? p : p < NP + NX ? p - NP : p - NP - NX;
            rc = ak_kv_read(src, l, q, k, v, &err);
            if (rc == 0) rc = ak_kv_write(kv, l, p, k, v, &err);
        }
    if (rc == 0) rc = ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = Q, .n = NQ, .pos0 = n, .logits = out}, &err);
    if (rc < 0) fprintf(stderr, "by_hand: %s\n", err.msg);
    free(k);
    ak_kv_free(kp);
    ak_kv_free(kx);
    ak_kv_free(ky);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    return rc;
}

TEST(memories_equal_the_chunk_prefilled_alone_and_are_computed_once) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    ak_block_pool *pool;
    ak_agents *ag = agents_at(&e, &pool, NULL);
    REQUIRE(ag, "agents");
    int32_t P[NP], X[NX], Y[NY], Q[NQ];
    texts(e.vocab, P, X, Y, Q);
    int computed = -1;
    REQUIRE(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "mx", .text = "x text", .tokens = X, .n = NX,
                          .fk = AK_KV_F16, .fv = AK_KV_F16}, &computed, &err) == 0, "add: %s",
            err.msg);
    CHECK(computed == 1, "the first add computed nothing");
    /* bit for bit the chunk prefilled alone at position 0, no BOS before it */
    ak_block_pool *rp = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    ak_kv *ref = alone(&e, rp, X, NX);
    REQUIRE(ref, "reference");
    const ak_kv *mk = ak_memory_kv(ag, "mx", &err);
    REQUIRE(mk, "kv: %s", err.msg);
    CHECK(kv_equal(mk, ref), "the memory's bytes are not the chunk's prefill alone");
    /* and not a prefill that starts with something else (the check can fail) */
    int32_t BX[NX + 1];
    BX[0] = 1;
    memcpy(BX + 1, X, sizeof X);
    ak_kv *withbos = alone(&e, rp, BX, NX + 1);
    REQUIRE(withbos, "bos");
    float a0[256], b0[256];
    int H = e.m->spec.n_head_kv, dk = e.m->spec.head_dim_k;
    REQUIRE(H * dk <= 128, "dims");
    REQUIRE(ak_kv_read(mk, 1, 3, a0, a0 + 128, &err) == 0 && ak_kv_read(withbos, 1, 4, b0, b0 + 128, &err) == 0, "read");
    CHECK(memcmp(a0, b0, sizeof(float) * (size_t)(H * dk)) != 0, "a BOS before the chunk changes nothing?");
    ak_kv_free(withbos);
    ak_kv_free(ref);
    ak_block_pool_free(rp);

    /* content addressing: the same tokens and formats under another id are
     * not computed again and take no block more */
    ak_block_pool_stats s0, s1;
    ak_block_pool_get_stats(pool, &s0);
    REQUIRE(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "mx2", .text = "x text", .tokens = X, .n = NX,
                          .fk = AK_KV_F16, .fv = AK_KV_F16}, &computed, &err) == 0, "add 2: %s",
            err.msg);
    ak_block_pool_get_stats(pool, &s1);
    CHECK(computed == 0 && s1.blocks == s0.blocks && ak_memory_kv(ag, "mx2", &err) == mk,
          "same content: computed %d, blocks %zu -> %zu", computed, s0.blocks, s1.blocks);
    ak_memory_info mi;
    REQUIRE(ak_memory_get(ag, "mx2", &mi, NULL, &err) == 0, "get: %s", err.msg);
    CHECK(mi.sharers == 2 && mi.n_tokens == NX && mi.resident, "info: sharers %d, %d tokens", mi.sharers, mi.n_tokens);
    /* re-adding the same id and content: a no-op; other content: refused */
    CHECK(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "mx", .text = "x text", .tokens = X, .n = NX,
                        .fk = AK_KV_F16, .fv = AK_KV_F16}, &computed, &err) == 0 && computed == 0,
          "idempotent add: %s", err.msg);
    CHECK(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "mx", .text = "y text", .tokens = Y, .n = NY,
                        .fk = AK_KV_F16, .fv = AK_KV_F16}, &computed, &err) < 0 &&
              err.code == AK_ERR_EXISTS, "other content under an id: %s", err.msg);
    /* other formats: other content, computed */
    REQUIRE(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "mxq", .text = "x text", .tokens = X, .n = NX,
                          .fk = AK_KV_Q8, .fv = AK_KV_Q8}, &computed, &err) == 0, "q8: %s", err.msg);
    ak_memory_info mq;
    REQUIRE(ak_memory_get(ag, "mxq", &mq, NULL, &err) == 0, "get q8");
    CHECK(computed == 1 && strcmp(mq.hash, mi.hash) && mq.fk == AK_KV_Q8, "q8 shared with f16?");

    /* bad inputs, by code */
    CHECK(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = ".hidden", .text = "x", .tokens = X, .n = NX,
                        .fk = AK_KV_F16, .fv = AK_KV_F16}, NULL, &err) < 0 &&
              err.code == AK_ERR_INVALID, "hidden id: %s", err.msg);
    CHECK(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "../up", .text = "x", .tokens = X, .n = NX,
                        .fk = AK_KV_F16, .fv = AK_KV_F16}, NULL, &err) < 0 &&
              err.code == AK_ERR_INVALID, "path id: %s", err.msg);
    int32_t longx[MCTX];
    for (int i = 0; i < MCTX; i++) longx[i] = (int32_t)((i * 7 + 1) % e.vocab);
    CHECK(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "long", .text = "x", .tokens = longx, .n = MCTX,
                        .fk = AK_KV_F16, .fv = AK_KV_F16}, NULL, &err) < 0 &&
              err.code == AK_ERR_INVALID, "too long: %s", err.msg);
    CHECK(ak_memory_kv(ag, "nope", &err) == NULL && err.code == AK_ERR_NOT_FOUND, "unknown: %s", err.msg);
    CHECK(ak_memory_get(ag, "nope", &mi, NULL, &err) < 0 && err.code == AK_ERR_NOT_FOUND, "unknown get: %s", err.msg);
    CHECK(ak_memory_remove(ag, "nope", &err) == 1, "remove unknown");

    /* removing one id keeps the other's (shared) blocks */
    REQUIRE(ak_memory_remove(ag, "mx", &err) == 0, "remove: %s", err.msg);
    CHECK(ak_memory_kv(ag, "mx2", &err) == mk && ak_memory_kv(ag, "mx", &err) == NULL, "after removal");
    ak_memory_info *v = NULL;
    int nv = 0;
    REQUIRE(ak_memories_list(ag, &v, &nv, &err) == 0, "list");
    CHECK(nv == 2 && !strcmp(v[0].id, "mx2") && !strcmp(v[1].id, "mxq"), "list: %d (%s)", nv, nv ? v[0].id : "");
    free(v);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    tenv_close(&e);
}

TEST(memories_placed_with_reuse_none_equal_the_parts_computed_apart) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    ak_block_pool *pool;
    ak_agents *ag = agents_at(&e, &pool, NULL);
    REQUIRE(ag, "agents");
    int32_t P[NP], X[NX], Y[NY], Q[NQ], all[NP + NX + NY + NQ];
    texts(e.vocab, P, X, Y, Q);
    memcpy(all, P, sizeof P);
    memcpy(all + NP, X, sizeof X);
    memcpy(all + NP + NX, Y, sizeof Y);
    memcpy(all + NP + NX + NY, Q, sizeof Q);
    int n = NP + NX + NY + NQ;
    REQUIRE(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "mx", .text = "x", .tokens = X, .n = NX,
                          .fk = AK_KV_F16, .fv = AK_KV_F16}, NULL, &err) == 0 &&
                ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "my", .text = "y", .tokens = Y, .n = NY,
                              .fk = AK_KV_F16, .fv = AK_KV_F16}, NULL, &err) == 0,
            "add: %s", err.msg);
    float *got = malloc(sizeof(float) * (size_t)e.vocab), *want = malloc(sizeof(float) * (size_t)e.vocab);
    float *full = malloc(sizeof(float) * (size_t)e.vocab), *got2 = malloc(sizeof(float) * (size_t)e.vocab);
    const char *ms[2] = {"mx", "my"};
    int at[2] = {NP, NP + NX};
    ak_turn ti;
    REQUIRE(turn_with(&e, ag, &(ak_turn_opts){.id = "rx", .tokens = all, .n = n, .at = at, .k = 2}, ms, got, &ti) == 0,
            "turn");
    REQUIRE(by_hand(&e, AK_KV_F16, AK_KV_F16, P, X, Y, Q, want) == 0, "the expectation");
    /* full: a plain turn of the whole prompt, equal to a plain prefill */
    REQUIRE(turn_with(&e, ag, &(ak_turn_opts){.id = "fx", .tokens = all, .n = n}, NULL, got2, &ti) == 0, "full turn");
    ak_block_pool *fp = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    ak_kv *fkv = alone(&e, fp, all, n);
    REQUIRE(fkv, "full prefill");
    memcpy(full, e.logits, sizeof(float) * (size_t)e.vocab);
    ak_kv_free(fkv);
    ak_block_pool_free(fp);
    CHECK(!memcmp(got2, full, sizeof(float) * (size_t)e.vocab), "reuse full differs from a plain prefill");
    double d = max_abs_diff(got, want, e.vocab), dfull = max_abs_diff(got, full, e.vocab), mx = 0;
    for (int i = 0; i < e.vocab; i++) mx = fmax(mx, fabs((double)want[i]));
    printf("    reuse none: max |logit diff| vs the parts computed apart %.2e, vs full %.3f (max |logit| %.2f)\n", d,
           dfull, mx);
    /* the same f16 vectors, read from blocks split otherwise: float rounding only */
    CHECK(d < 1e-4 * (mx > 1 ? mx : 1), "reuse none vs the parts apart: max |diff| %.3g", d);
    CHECK(dfull > 1e-2 && dfull > 100 * d, "reuse none vs full: max |diff| %.3g (apart: %.3g)", dfull, d);
    ak_agent_info in;
    ak_agents_get(ag, ak_agents_find(ag, "rx"), &in);
    CHECK(in.impure && in.n_tokens == n && ak_agent_match_len(ag, "rx", all, n) == n, "rx: impure %d, %d tokens",
          in.impure, in.n_tokens);
    /* a memory in other formats (q8) is converted into the agent's (f16) at
     * its position: the expectation converts the chunk computed in q8 */
    REQUIRE(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "mxq", .text = "x", .tokens = X, .n = NX,
                          .fk = AK_KV_Q8, .fv = AK_KV_Q8}, NULL, &err) == 0, "q8: %s", err.msg);
    const char *mq[2] = {"mxq", "my"};
    float *gq = malloc(sizeof(float) * (size_t)e.vocab), *wq = malloc(sizeof(float) * (size_t)e.vocab);
    REQUIRE(turn_with(&e, ag, &(ak_turn_opts){.id = "rq", .tokens = all, .n = n, .at = at, .k = 2}, mq, gq, &ti) == 0,
            "q8 turn");
    REQUIRE(by_hand(&e, AK_KV_Q8, AK_KV_Q8, P, X, Y, Q, wq) == 0, "the q8 expectation");
    double dq = max_abs_diff(gq, wq, e.vocab), dq16 = max_abs_diff(gq, got, e.vocab);
    printf("    a q8 memory in an f16 agent: max |logit diff| vs converted by hand %.2e, vs the f16 memory %.2e\n", dq,
           dq16);
    CHECK(dq < 1e-4 * (mx > 1 ? mx : 1) && dq16 > 10 * dq, "q8 memory: %.3g vs by hand, %.3g vs f16", dq, dq16);
    free(gq);
    free(wq);
    /* a second agent at the same place shares the shifted copy: no new block for the chunks */
    ak_block_pool_stats s0, s1;
    ak_block_pool_get_stats(pool, &s0);
    REQUIRE(turn_with(&e, ag, &(ak_turn_opts){.id = "rx2", .tokens = all, .n = n, .at = at, .k = 2}, ms, got2,
                      &ti) == 0, "turn 2");
    ak_block_pool_get_stats(pool, &s1);
    int T = ak_block_pool_block_tokens(pool);
    size_t own = (size_t)((NP + T - 1) / T + (NQ + T - 1) / T);
    CHECK(s1.blocks - s0.blocks <= own && !memcmp(got, got2, sizeof(float) * (size_t)e.vocab),
          "the second placement took %zu blocks (own %zu)", s1.blocks - s0.blocks, own);
    /* the next turn extends through the chunks (token match) */
    int32_t more[NP + NX + NY + NQ + 2];
    memcpy(more, all, sizeof all);
    more[n] = 9, more[n + 1] = 10;
    REQUIRE(turn_with(&e, ag, &(ak_turn_opts){.id = "rx", .tokens = more, .n = n + 2, .at = at, .k = 2}, ms, got,
                      &ti) == 0, "turn 3");
    CHECK(ti.match == AK_MATCH_EXTEND && ti.reused == n, "next turn: match %s, reused %d", ak_match_name(ti.match),
          ti.reused);
    /* refusals: no turn, wrong position, wrong tokens, unknown memory */
    ak_kv *kv = NULL;
    CHECK(ak_agent_place_memory(ag, &(ak_place_opts){.id = "rx", .mem_id = "mx", .tokens = all, .at = NP}, &kv,
                                &err) < 0 && err.code == AK_ERR_INVALID,
          "no turn: %s", err.msg);
    int len2[2] = {NX, NY};
    int past[1] = {n - 3};
    CHECK(ak_agent_open(ag, &(ak_turn_opts){.id = "pz", .tokens = all, .n = n, .n_reserve = n, .at = past,
                        .len = len2, .k = 1}, &kv, &ti, &err) < 0 &&
              err.code == AK_ERR_INVALID, "a memory past the prompt's tokens: %s", err.msg);
    int bad_at[2] = {NP + 3, NP};
    CHECK(ak_agent_open(ag, &(ak_turn_opts){.id = "pz", .tokens = all, .n = n, .n_reserve = n, .at = bad_at,
                        .len = len2, .k = 2}, &kv, &ti, &err) < 0 &&
              err.code == AK_ERR_INVALID, "memories out of order: %s", err.msg);
    REQUIRE(ak_agent_open(ag, &(ak_turn_opts){.id = "pz", .tokens = all, .n = n, .n_reserve = n, .at = at,
                          .len = len2, .k = 2}, &kv, &ti, &err) == 0,
            "open: %s", err.msg);
    CHECK(ti.reused < NP, "linked past the first memory: reused %d", ti.reused);
    REQUIRE(ak_eval(e.ctx, kv, &(ak_eval_args){.tokens = all + ti.reused, .n = NP - ti.reused, .pos0 = ti.reused},
                    &err) == 0, "eval");
    ak_kv *kv0 = kv;
    CHECK(ak_agent_place_memory(ag, &(ak_place_opts){.id = "pz", .mem_id = "mx", .tokens = all, .at = NP + 1}, &kv,
                                &err) < 0 && err.code == AK_ERR_INVALID,
          "cache not at the position: %s", err.msg);
    CHECK(ak_agent_place_memory(ag, &(ak_place_opts){.id = "pz", .mem_id = "my", .tokens = all, .at = NP}, &kv,
                                &err) < 0 && err.code == AK_ERR_INVALID,
          "other tokens: %s", err.msg);
    CHECK(ak_agent_place_memory(ag, &(ak_place_opts){.id = "pz", .mem_id = "nope", .tokens = all, .at = NP}, &kv,
                                &err) < 0 && err.code == AK_ERR_NOT_FOUND,
          "unknown: %s", err.msg);
    CHECK(kv == kv0 && ak_kv_length(kv) == NP, "a refused placement changed the cache");
    ak_agent_abort(ag, "pz");
    free(got);
    free(got2);
    free(want);
    free(full);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    tenv_close(&e);
}

TEST(memories_persist_and_bad_files_are_refused) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    const char *dir = dir_for("memories");
    ak_store *store = ak_store_open(dir, NULL, &err);
    REQUIRE(store, "%s", err.msg);
    ak_block_pool *pool;
    ak_agents *ag = agents_at(&e, &pool, store);
    REQUIRE(ag, "agents");
    int32_t P[NP], X[NX], Y[NY], Q[NQ], all[NP + NX + NQ];
    texts(e.vocab, P, X, Y, Q);
    memcpy(all, P, sizeof P);
    memcpy(all + NP, X, sizeof X);
    memcpy(all + NP + NX, Q, sizeof Q);
    int n = NP + NX + NQ;
    /* in q8, so that the holder (f16) converts it: its file must hold f16 only */
    REQUIRE(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "mx", .text = "the x text", .tokens = X, .n = NX,
                          .fk = AK_KV_Q8, .fv = AK_KV_Q8}, NULL, &err) == 0 &&
                ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "my", .text = "the y text", .tokens = Y, .n = NY,
                              .fk = AK_KV_Q8, .fv = AK_KV_F16}, NULL, &err) == 0,
            "add: %s", err.msg);
    char mpath[700];
    snprintf(mpath, sizeof mpath, "%s/memories/mx.safetensors", dir);
    CHECK(exists(mpath), "no file %s", mpath);
    float *hot = malloc(sizeof(float) * (size_t)e.vocab), *cold = malloc(sizeof(float) * (size_t)e.vocab);
    const char *ms[1] = {"mx"};
    int at[1] = {NP};
    ak_turn ti;
    REQUIRE(turn_with(&e, ag, &(ak_turn_opts){.id = "holder", .tokens = all, .n = n, .at = at, .k = 1}, ms, NULL,
                      &ti) == 0, "holder");
    ak_block_pool *rp = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    ak_kv *ref = ak_kv_new(rp, AK_KV_Q8, AK_KV_Q8, MCTX, &err);
    REQUIRE(ref && ak_eval(e.ctx, ref, &(ak_eval_args){.tokens = X, .n = NX}, &err) == 0, "ref: %s", err.msg);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_store_close(store);

    /* a restart: listed, loaded bit for bit, content addressing across files */
    store = ak_store_open(dir, NULL, &err);
    REQUIRE(store, "%s", err.msg);
    ag = agents_at(&e, &pool, store);
    ak_memory_info *v = NULL;
    int nv = 0;
    REQUIRE(ak_memories_list(ag, &v, &nv, &err) == 0, "list");
    CHECK(nv == 2 && !strcmp(v[0].id, "mx") && v[0].n_tokens == NX && !v[0].resident && v[0].file_bytes > 0 &&
              v[0].fk == AK_KV_Q8 && v[1].fk == AK_KV_Q8 && v[1].fv == AK_KV_F16, "after a restart: %d memories", nv);
    free(v);
    char *text = NULL;
    ak_memory_info mi;
    CHECK(ak_memory_get(ag, "mx", &mi, &text, &err) == 0 && text && !strcmp(text, "the x text"), "text: %s",
          text ? text : err.msg);
    free(text);
    const ak_kv *mk = ak_memory_kv(ag, "mx", &err);
    REQUIRE(mk, "load: %s", err.msg);
    CHECK(kv_equal(mk, ref), "the loaded memory differs from the prefill");
    int computed = -1;
    REQUIRE(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "mx-again", .text = "the x text", .tokens = X,
                          .n = NX, .fk = AK_KV_Q8, .fv = AK_KV_Q8}, &computed, &err) == 0,
            "again: %s", err.msg);
    CHECK(computed == 0 && ak_memory_kv(ag, "mx-again", &err) == mk, "the same content was computed again");
    /* the holder restores without the memory (its chunk is its own in its file), its turn as before */
    REQUIRE(ak_memory_remove(ag, "mx", &err) == 0 && ak_memory_remove(ag, "mx-again", &err) == 0, "remove");
    int32_t more[NP + NX + NQ + 1];
    memcpy(more, all, sizeof all);
    more[n] = 7;
    REQUIRE(turn_with(&e, ag, &(ak_turn_opts){.id = "holder", .tokens = more, .n = n + 1}, NULL, cold, &ti) == 0,
            "holder restored");
    CHECK(ti.tier == AK_TIER_WARM && ti.reused == n, "holder: tier %s, reused %d", ak_tier_name(ti.tier), ti.reused);
    /* its twin, hot all along, gives the same logits */
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ag = agents_at(&e, &pool, NULL);
    REQUIRE(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "mx", .text = "the x text", .tokens = X, .n = NX,
                          .fk = AK_KV_Q8, .fv = AK_KV_Q8}, NULL, &err) == 0, "twin add");
    REQUIRE(turn_with(&e, ag, &(ak_turn_opts){.id = "twin", .tokens = all, .n = n, .at = at, .k = 1}, ms, NULL,
                      &ti) == 0 &&
                turn_with(&e, ag, &(ak_turn_opts){.id = "twin", .tokens = more, .n = n + 1}, NULL, hot, &ti) == 0,
            "twin");
    CHECK(!memcmp(hot, cold, sizeof(float) * (size_t)e.vocab), "restored holder differs from its hot twin");
    ak_agents_free(ag);
    ak_block_pool_free(pool);

    /* corrupt: a flipped byte in the data -> CORRUPT, quarantined */
    ag = agents_at(&e, &pool, store);
    char ypath[700];
    snprintf(ypath, sizeof ypath, "%s/memories/my.safetensors", dir);
    size_t len;
    uint8_t *img = (uint8_t *)ak_read_file(ypath, &len, &err);
    REQUIRE(img && len > 100, "read %s", ypath);
    img[len - 10] ^= 0x40;
    REQUIRE(write_bytes(ypath, img, len) == 0, "write");
    free(img);
    CHECK(ak_memory_kv(ag, "my", &err) == NULL && err.code == AK_ERR_CORRUPT, "corrupt: %s", err.msg);
    CHECK(!exists(ypath), "the corrupt file was not moved to quarantine");
    /* truncated */
    REQUIRE(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "mt", .text = "t", .tokens = Y, .n = NY,
                          .fk = AK_KV_F16, .fv = AK_KV_F16}, NULL, &err) == 0, "mt");
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ag = agents_at(&e, &pool, store);
    snprintf(ypath, sizeof ypath, "%s/memories/mt.safetensors", dir);
    REQUIRE(truncate(ypath, 200) == 0, "truncate");
    CHECK(ak_memory_kv(ag, "mt", &err) == NULL && err.code == AK_ERR_CORRUPT, "truncated: %s", err.msg);
    /* another model's file: STALE, left in place */
    ak_block_pool *op = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    ak_kv *okv = alone(&e, op, X, NX);
    REQUIRE(okv && ak_store_save_memory(store, &(ak_store_save_args){.id = "other", .kv = okv, .tokens = X,
                                        .n_tokens = NX, .source = "x", .fingerprint = "another-model-fingerprint",
                                        .model_name = "m"}, &err) == 0,
            "other: %s", err.msg);
    CHECK(ak_memory_kv(ag, "other", &err) == NULL && err.code == AK_ERR_STALE, "another model: %s", err.msg);
    snprintf(ypath, sizeof ypath, "%s/memories/other.safetensors", dir);
    CHECK(exists(ypath), "a stale file was moved");
    /* an agent file is not a memory: a pool file renamed into memories/ is CORRUPT (its format) */
    ak_kv_free(okv);
    ak_block_pool_free(op);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_store_close(store);
    ak_kv_free(ref);
    ak_block_pool_free(rp);
    free(hot);
    free(cold);
    tenv_close(&e);
}

/* Under a KV budget a memory is dropped from RAM like an idle pool (its
 * file stays) when nothing else can make room, and comes back from its
 * file, bit for bit, when it is next used. */
TEST(memories_leave_ram_under_the_budget_and_come_back) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    const char *dir = dir_for("memories-budget");
    ak_store *store = ak_store_open(dir, NULL, &err);
    REQUIRE(store, "%s", err.msg);
    ak_block_pool *probe = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    size_t blk = ak_block_pool_block_bytes(probe, AK_KV_F16, AK_KV_F16);
    int T = ak_block_pool_block_tokens(probe);
    ak_block_pool_free(probe);
    ak_block_pool *pool = ak_block_pool_new(&e.m->spec, 0, 6 * blk, &err);
    REQUIRE(pool, "%s", err.msg);
    ak_agents_config c = {.model = e.m, .pool = pool, .store = store, .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = MCTX, .save = AK_SAVE_EVERY_TURN};
    ak_agents *ag = ak_agents_new(&c, &err);
    REQUIRE(ag, "%s", err.msg);
    int32_t P[NP], X[NX], Y[NY], Q[NQ];
    texts(e.vocab, P, X, Y, Q);
    REQUIRE(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "mx", .text = "x", .tokens = X, .n = NX,
                          .fk = AK_KV_F16, .fv = AK_KV_F16}, NULL, &err) == 0, "add: %s", err.msg);
    ak_block_pool *rp = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    ak_kv *ref = alone(&e, rp, X, NX);
    /* one agent whose turn needs the whole budget: only the memory can go */
    int n = 6 * T - 1;
    int32_t *big = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) big[i] = (int32_t)((i * 13 + 2) % e.vocab);
    ak_turn ti;
    REQUIRE(turn_with(&e, ag, &(ak_turn_opts){.id = "big", .tokens = big, .n = n}, NULL, NULL, &ti) == 0,
            "the big turn");
    ak_memory_info mi;
    REQUIRE(ak_memory_get(ag, "mx", &mi, NULL, &err) == 0, "get");
    CHECK(!mi.resident && mi.bytes == 0 && mi.file_bytes > 0, "the memory stayed in RAM: resident %d", mi.resident);
    /* used again: reloaded from its file (the idle agent makes room), the same bytes */
    const ak_kv *mk = ak_memory_kv(ag, "mx", &err);
    CHECK(mk && kv_equal(mk, ref), "the reloaded memory: %s", mk ? "differs" : err.msg);
    REQUIRE(ak_memory_get(ag, "mx", &mi, NULL, &err) == 0 && mi.resident, "resident again");
    /* without a store there is no file to come back from: never dropped */
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    pool = ak_block_pool_new(&e.m->spec, 0, 6 * blk, &err);
    ak_agents_config c2 = {.model = e.m, .pool = pool, .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = MCTX, .save = AK_SAVE_EVERY_TURN};
    ag = ak_agents_new(&c2, &err);
    REQUIRE(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "mx", .text = "x", .tokens = X, .n = NX,
                          .fk = AK_KV_F16, .fv = AK_KV_F16}, NULL, &err) == 0, "add: %s", err.msg);
    CHECK(turn_with(&e, ag, &(ak_turn_opts){.id = "big", .tokens = big, .n = n}, NULL, NULL, &ti) < 0,
          "the big turn fit beside the memory");
    REQUIRE(ak_memory_get(ag, "mx", &mi, NULL, &err) == 0 && mi.resident, "dropped without a store");
    free(big);
    ak_kv_free(ref);
    ak_block_pool_free(rp);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_store_close(store);
    tenv_close(&e);
}

/* A sealed store: a memory is written sealed and read back bit for bit; its
 * file copied under another id fails authentication (the seal binds
 * memories/<id>): CORRUPT; the store opened without the key: STALE. */
TEST(memories_sealed) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    const char *dir = dir_for("memories-sealed");
    uint8_t key[AK_STORE_KEY_BYTES];
    for (int i = 0; i < AK_STORE_KEY_BYTES; i++) key[i] = (uint8_t)(i * 7 + 3);
    ak_store *store = ak_store_open(dir, key, &err);
    REQUIRE(store, "%s", err.msg);
    ak_block_pool *pool;
    ak_agents *ag = agents_at(&e, &pool, store);
    int32_t P[NP], X[NX], Y[NY], Q[NQ];
    texts(e.vocab, P, X, Y, Q);
    REQUIRE(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "ms", .text = "x", .tokens = X, .n = NX,
                          .fk = AK_KV_F16, .fv = AK_KV_F16}, NULL, &err) == 0, "add: %s", err.msg);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_store_close(store);
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/memories/ms.safetensors", dir);
    snprintf(b, sizeof b, "%s/memories/copy.safetensors", dir);
    size_t len;
    char *img = ak_read_file(a, &len, &err);
    REQUIRE(img && len > 64 && !memcmp(img, "AKVSEAL1", 8), "not sealed");
    REQUIRE(write_bytes(b, img, len) == 0, "copy");
    free(img);
    store = ak_store_open(dir, key, &err);
    REQUIRE(store, "%s", err.msg);
    ag = agents_at(&e, &pool, store);
    ak_block_pool *rp = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    ak_kv *ref = alone(&e, rp, X, NX);
    const ak_kv *mk = ak_memory_kv(ag, "ms", &err);
    CHECK(mk && kv_equal(mk, ref), "sealed memory: %s", mk ? "differs" : err.msg);
    CHECK(ak_memory_kv(ag, "copy", &err) == NULL && err.code == AK_ERR_CORRUPT, "a sealed file under another id: %s",
          err.msg);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_store_close(store);
    store = ak_store_open(dir, NULL, &err);
    ag = agents_at(&e, &pool, store);
    CHECK(ak_memory_kv(ag, "ms", &err) == NULL && err.code == AK_ERR_STALE, "sealed, opened without the key: %s",
          err.msg);
    ak_kv_free(ref);
    ak_block_pool_free(rp);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_store_close(store);
    tenv_close(&e);
}

/* A turn whose memories are placed by a reuse method (ak_agent_reuse_memory)
 * with params p, its counts into st: as turn_with otherwise. */
static int turn_reuse(tenv *e, ak_agents *ag, const ak_turn_opts *o, const char *const *ms, const ak_reuse_params *p,
                      float *out, ak_reuse_stats *st) {
    const char *id = o->id;
    const int32_t *prompt = o->tokens;
    const int n = o->n, *at = o->at, k = o->k;
    ak_error err = {{0}};
    ak_kv *kv;
    ak_turn ti;
    int len[8] = {0};
    for (int i = 0; i < k; i++) {
        ak_memory_info mi;
        if (ak_memory_get(ag, ms[i], &mi, NULL, &err) < 0) goto fail;
        len[i] = mi.n_tokens;
    }
    if (ak_agent_open(ag, &(ak_turn_opts){.id = id, .tokens = prompt, .n = n, .n_reserve = n, .at = at, .len = len,
                      .k = k}, &kv, &ti, &err) < 0) goto fail;
    int pos = ti.reused;
    for (int i = 0; i < k; i++) {
        if (pos > at[i]) continue;
        if (at[i] > pos && ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = prompt + pos, .n = at[i] - pos, .pos0 = pos},
                                   &err) < 0) goto fail;
        if (ak_agent_reuse_memory(ag, e->ctx, &(ak_place_opts){.id = id, .mem_id = ms[i], .tokens = prompt,
                                  .at = at[i]}, p, &kv, st, &err) < 0) goto fail;
        pos = ak_kv_length(kv);
    }
    if (ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = prompt + pos, .n = n - pos, .pos0 = pos, .logits = out},
                &err) < 0 || ak_agent_commit(ag, id, prompt, n, &err) < 0 || ak_agent_end(ag, id, &err) < 0)
        goto fail;
    return 0;
fail:
    fprintf(stderr, "turn_reuse %s: %s\n", id, err.msg);
    ak_agent_abort(ag, id);
    return -1;
}

/* An agent whose memories were placed by agentkvshift (its sequence holds
 * corrections) and one by cacheblend: saved (agent file version 6 with
 * "corrections" for the first), restored after a restart, their next turn
 * gives the logits of twins that stayed in RAM, bit for bit; the same turn
 * on a restored agent whose file lost its corrections would not (the
 * correction moves the logits: test_reuse.c). The placement itself equals
 * ak_reuse_place on a plain sequence (the agent's is [P] frozen, then the
 * chunk): checked through the recomputed count. */
TEST(memories_agentkvshift_agent_restores_bit_for_bit) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    const char *dir = dir_for("memories-akvs");
    ak_store *store = ak_store_open(dir, NULL, &err);
    REQUIRE(store, "%s", err.msg);
    ak_block_pool *pool;
    ak_agents *ag = agents_at(&e, &pool, store);
    REQUIRE(ag, "agents");
    int32_t P[NP], X[NX], Y[NY], Q[NQ], all[NP + NX + NY + NQ], more[NP + NX + NY + NQ + 1];
    texts(e.vocab, P, X, Y, Q);
    memcpy(all, P, sizeof P);
    memcpy(all + NP, X, sizeof X);
    memcpy(all + NP + NX, Y, sizeof Y);
    memcpy(all + NP + NX + NY, Q, sizeof Q);
    int n = NP + NX + NY + NQ;
    memcpy(more, all, sizeof all);
    more[n] = 42;
    REQUIRE(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "mx", .text = "the x text", .tokens = X, .n = NX,
                          .fk = AK_KV_F16, .fv = AK_KV_F16}, NULL, &err) == 0 &&
                ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "my", .text = "the y text", .tokens = Y, .n = NY,
                              .fk = AK_KV_Q8, .fv = AK_KV_Q8}, NULL, &err) == 0,
            "add: %s", err.msg);
    const char *ms[2] = {"mx", "my"};
    int at[2] = {NP, NP + NX};
    const char *ids[2] = {"shift", "blend"};
    ak_reuse_params ps[2] = {{AK_REUSE_AGENTKVSHIFT, 0.2f, -1, 0}, {AK_REUSE_CACHEBLEND, 0.2f, -1, 0}};
    float *hot = malloc(sizeof(float) * (size_t)e.vocab), *cold = malloc(sizeof(float) * (size_t)e.vocab);
    ak_reuse_stats st;
    for (int i = 0; i < 2; i++) {
        REQUIRE(turn_reuse(&e, ag, &(ak_turn_opts){.id = ids[i], .tokens = all, .n = n, .at = at, .k = 2}, ms, &ps[i],
                           NULL, &st) == 0, "%s", ids[i]);
        CHECK(st.n_recomputed == (int)ceil(0.2 * NY - 1e-6), "%s: last memory recomputed %d", ids[i], st.n_recomputed);
    }
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_store_close(store);
    /* the shifted agent's file says version 6 and holds the corrections */
    size_t fl = 0;
    char *img = ak_read_file(file_of(dir, "shift"), &fl, &err);
    CHECK(img && memmem(img, fl, "\"format_version\":\"6\"", 20) && memmem(img, fl, "\"corrections\":\"", 15),
          "no version 6 corrections in the agentkvshift agent's file");
    free(img);
    img = ak_read_file(file_of(dir, "blend"), &fl, &err);
    CHECK(img && memmem(img, fl, "\"format_version\":\"5\"", 20) && !memmem(img, fl, "\"corrections\"", 13),
          "the cacheblend agent's file should stay version 5");
    free(img);
    for (int i = 0; i < 2; i++) {
        store = ak_store_open(dir, NULL, &err);
        REQUIRE(store, "%s", err.msg);
        ag = agents_at(&e, &pool, store);
        ak_turn ti;
        REQUIRE(turn_with(&e, ag, &(ak_turn_opts){.id = ids[i], .tokens = more, .n = n + 1}, NULL, cold, &ti) == 0,
                "%s restored", ids[i]);
        CHECK(ti.tier == AK_TIER_WARM && ti.reused >= n, "%s: %s, reused %d of %d", ids[i], ak_tier_name(ti.tier),
              ti.reused, n);
        ak_agents_free(ag);
        ak_block_pool_free(pool);
        ak_store_close(store);
        /* the twin, in RAM all along */
        ag = agents_at(&e, &pool, NULL);
        REQUIRE(ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "mx", .text = "the x text", .tokens = X, .n = NX,
                              .fk = AK_KV_F16, .fv = AK_KV_F16}, NULL, &err) == 0 &&
                    ak_memory_add(ag, e.ctx, &(ak_memory_request){.id = "my", .text = "the y text", .tokens = Y,
                                  .n = NY, .fk = AK_KV_Q8, .fv = AK_KV_Q8}, NULL, &err) == 0,
                "twin add");
        REQUIRE(turn_reuse(&e, ag, &(ak_turn_opts){.id = "twin", .tokens = all, .n = n, .at = at, .k = 2}, ms, &ps[i],
                           NULL, &st) == 0 &&
                    turn_with(&e, ag, &(ak_turn_opts){.id = "twin", .tokens = more, .n = n + 1}, NULL, hot, &ti) == 0,
                "twin");
        CHECK(!memcmp(hot, cold, sizeof(float) * (size_t)e.vocab), "%s: restored differs from its hot twin by %g",
              ids[i], max_abs_diff(hot, cold, e.vocab));
        ak_agents_free(ag);
        ak_block_pool_free(pool);
    }
    free(hot);
    free(cold);
    tenv_close(&e);
}
