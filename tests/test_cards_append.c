/* test_cards_append.c - import mode "append" (agent.h): a card put after
 * the receiver's own tokens, its keys shifted there. On a real tiny model:
 * the receiver's next logits equal an independent construction (the
 * receiver's prefix computed alone, the card's text computed alone at
 * position 0 and key-shifted by the prefix's length with
 * ak_model_shift_keys), and measurably differ from a prefill of both texts
 * (the approximation); persistence (format 5 segments: own positions,
 * pools, cards) survives a restart bit for bit, through a turn and through
 * a prefetch on the restore path; a vanished card, a truncated file, a
 * segments record in a version 4 file are misses; a version 4 file is still
 * read; bad inputs are refused by code. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include "agents/agent.h"
#include "store/cards.h"
#include "text/sampler.h"
#include "test.h"
#include "test_model_env.h"
#include "test_store_util.h"


#define ACTX 256

static ak_agents *agents_at(tenv *e, ak_block_pool **pool, ak_store *store) {
    ak_error err = {{0}};
    *pool = ak_block_pool_new(&e->m->spec, 0, 0, &err);
    ak_agents_config c = {.model = e->m, .pool = *pool, .store = store, .fk = AK_KV_F16, .fv = AK_KV_F16,
                          .n_ctx = ACTX, .save = AK_SAVE_EVERY_TURN};
    return *pool ? ak_agents_new(&c, &err) : NULL;
}

/* One turn of agent o->id (o->pool_id may be NULL) with prompt
 * o->tokens[0..o->n): prefilled past what is reused, its last logits into
 * first (if not NULL); no token generated. Returns 0, or -1 with a test
 * failure recorded. */
static int aturn(ak_test_ctx *t, tenv *e, ak_agents *ag, const ak_turn_opts *o, float *first, ak_turn *ti) {
    const char *id = o->id, *pool = o->pool_id;
    const int32_t *prompt = o->tokens;
    const int n = o->n;
    ak_error err = {{0}};
    ak_kv *kv;
    if (ak_agent_open(ag, &(ak_turn_opts){.id = id, .pool_id = pool, .tokens = prompt, .n = n, .n_reserve = n}, &kv,
                      ti, &err) < 0 ||
        ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = prompt + ti->reused, .n = n - ti->reused, .pos0 = ti->reused,
                .logits = e->logits}, &err) < 0 ||
        ak_agent_commit(ag, id, prompt, n, &err) < 0 || ak_agent_end(ag, id, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "turn %s: %s", id, err.msg);
        return -1;
    }
    if (first) memcpy(first, e->logits, sizeof(float) * (size_t)e->vocab);
    return 0;
}

static double max_abs_diff(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* A fresh f32 cache in its own pool with tokens[0..n) prefilled from
 * position 0. */
static ak_kv *alone(tenv *e, ak_block_pool *pool, const int32_t *tokens, int n) {
    ak_error err = {{0}};
    ak_kv *kv = ak_kv_new(pool, AK_KV_F16, AK_KV_F16, ACTX, &err);
    if (kv && ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = tokens, .n = n, .logits = e->logits}, &err) < 0) {
        ak_kv_free(kv);
        return NULL;
    }
    return kv;
}

/* The expectation built by hand: positions [0, np) from P computed alone,
 * [np, np + nx) from X computed alone at position 0 with its keys shifted
 * by np, then the tokens q[0..nq) decoded after them; their last logits
 * into out. Returns 0, or -1. */
static int by_hand(tenv *e, const int32_t *P, int np, const int32_t *X, int nx, const int32_t *q, int nq, float *out) {
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&e->m->spec, 0, 0, &err);
    ak_kv *kp = pool ? alone(e, pool, P, np) : NULL, *kx = kp ? alone(e, pool, X, nx) : NULL;
    ak_kv *kv = kx ? ak_kv_new(pool, AK_KV_F16, AK_KV_F16, ACTX, &err) : NULL;
    int rc = kv && ak_model_shift_keys(e->m, kx, 0, nx, np, &err) == 0 && ak_kv_prepare(kv, 0, np + nx, &err) == 0 ? 0 : -1;
    int H = e->m->spec.n_head_kv;
    float *k = malloc(sizeof(float) * (size_t)H * (e->m->spec.head_dim_k + e->m->spec.head_dim_v));
    float *v = k + (size_t)H * e->m->spec.head_dim_k;
    for (int l = 0; rc == 0 && l < e->m->spec.n_layer; l++)
        for (int p = 0; rc == 0 && p < np + nx; p++) {
            rc = ak_kv_read(p < np ? kp : kx, l, p < np ? p : p - np, k, v, &err);
            if (rc == 0) rc = ak_kv_write(kv, l, p, k, v, &err);
        }
    if (rc == 0) rc = ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = q, .n = nq, .pos0 = np + nx, .logits = out}, &err);
    if (rc < 0) fprintf(stderr, "by_hand: %s\n", err.msg);
    free(k);
    ak_kv_free(kp);
    ak_kv_free(kx);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    return rc;
}

/* Sets metadata key of the agent file at path to value (NULL: leaves it)
 * with a metadata checksum recomputed by the format's rule (XXH3-64 of the
 * other entries sorted by key, each as key, 0x00, value, 0x00), so that only
 * what the value means decides. Returns 0, or -1. */
static int cmp_key(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }
static int set_meta(const char *path, const char *key, const char *value) {
    ak_error err = {{0}};
    size_t len;
    uint8_t *img = (uint8_t *)ak_read_file(path, &len, &err);
    if (!img || len < 8) return -1;
    uint64_t N = 0;
    for (int i = 7; i >= 0; i--) N = N << 8 | img[i];
    cJSON *root = cJSON_ParseWithLength((const char *)img + 8, (size_t)N);
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    if (!meta) return -1;
    cJSON_ReplaceItemInObjectCaseSensitive(meta, key, cJSON_CreateString(value));
    const char *keys[64];
    int k = 0;
    for (cJSON *it = meta->child; it && k < 64; it = it->next)
        if (strcmp(it->string, "metadata_checksum")) keys[k++] = it->string;
    qsort(keys, (size_t)k, sizeof *keys, cmp_key);
    XXH3_state_t *st = XXH3_createState();
    XXH3_64bits_reset(st);
    for (int i = 0; i < k; i++) {
        const char *v = cJSON_GetObjectItemCaseSensitive(meta, keys[i])->valuestring;
        XXH3_64bits_update(st, keys[i], strlen(keys[i]) + 1);
        XXH3_64bits_update(st, v, strlen(v) + 1);
    }
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits_digest(st));
    XXH3_freeState(st);
    cJSON_ReplaceItemInObjectCaseSensitive(meta, "metadata_checksum", cJSON_CreateString(hex));
    char *json = cJSON_PrintUnformatted(root);
    size_t jl = strlen(json), N2 = (jl + 7) / 8 * 8, out_len = 8 + N2 + (len - 8 - N);
    uint8_t *out = malloc(out_len);
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)N2 >> (8 * i));
    memcpy(out + 8, json, jl);
    memset(out + 8 + jl, ' ', N2 - jl);
    memcpy(out + 8 + N2, img + 8 + N, len - 8 - N);
    int rc = write_bytes(path, out, out_len);
    free(out);
    free(json);
    cJSON_Delete(root);
    free(img);
    return rc;
}

/* The metadata value of key in the agent file at path (malloc'd), or NULL. */
static char *get_meta(const char *path, const char *key) {
    size_t len;
    uint8_t *img = (uint8_t *)ak_read_file(path, &len, NULL);
    if (!img || len < 8) { free(img); return NULL; }
    uint64_t N = 0;
    for (int i = 7; i >= 0; i--) N = N << 8 | img[i];
    cJSON *root = cJSON_ParseWithLength((const char *)img + 8, (size_t)N);
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "__metadata__"), key);
    char *out = cJSON_IsString(it) ? strdup(it->valuestring) : NULL;
    cJSON_Delete(root);
    free(img);
    return out;
}

enum { NP = 37, NX = 29, NQ = 5 };

/* P (the receiver's), X (the card's text), Q (a turn after the append). */
static void texts(int vocab, int32_t *P, int32_t *X, int32_t *Q) {
    for (int i = 0; i < NP; i++) P[i] = i ? (int32_t)((i * 37 + 11) % vocab) : 1;
    for (int i = 0; i < NX; i++) X[i] = i ? (int32_t)((i * 53 + 7) % vocab) : 1;
    for (int i = 0; i < NQ; i++) Q[i] = (int32_t)((i * 19 + 3) % vocab);
}

TEST(cards_append_equals_the_parts_computed_apart) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    ak_block_pool *pool;
    ak_agents *ag = agents_at(&e, &pool, NULL);
    REQUIRE(ag, "agents");
    int32_t P[NP], X[NX], Q[NQ], all[NP + NX + NQ];
    texts(e.vocab, P, X, Q);
    memcpy(all, P, sizeof P);
    memcpy(all + NP, X, sizeof X);
    memcpy(all + NP + NX, Q, sizeof Q);
    ak_turn ti;
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "rx", .tokens = P, .n = NP}, NULL, &ti) == 0 &&
                aturn(t, &e, ag, &(ak_turn_opts){.id = "tx", .tokens = X, .n = NX}, NULL, &ti) == 0,
            "turns");
    ak_card_request rq;
    memset(&rq, 0, sizeof rq);
    rq.card_id = "cx";   /* all 16 bits */
    char cid[AK_AGENT_ID_MAX + 1];
    REQUIRE(ak_agent_make_card(ag, "tx", &rq, cid, &err) == 0, "make: %s", err.msg);
    REQUIRE(ak_agent_import_card_mode(ag, "rx", "cx", AK_IMPORT_APPEND, &err) == 0, "append: %s", err.msg);
    ak_agent_info in;
    ak_agents_get(ag, ak_agents_find(ag, "rx"), &in);
    CHECK(in.n_tokens == NP + NX && in.impure && ak_agent_match_len(ag, "rx", all, NP + NX) == NP + NX,
          "after the append: %d tokens, impure %d, history %d of P+X", in.n_tokens, in.impure,
          ak_agent_match_len(ag, "rx", all, NP + NX));
    float *got = malloc(sizeof(float) * (size_t)e.vocab), *want = malloc(sizeof(float) * (size_t)e.vocab);
    float *full = malloc(sizeof(float) * (size_t)e.vocab);
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "rx", .tokens = all, .n = NP + NX + NQ}, got, &ti) == 0,
            "rx after the append");
    CHECK(ti.match == AK_MATCH_EXTEND && ti.reused == NP + NX && ti.prefilled == NQ, "reused %d, prefilled %d",
          ti.reused, ti.prefilled);
    REQUIRE(by_hand(&e, P, NP, X, NX, Q, NQ, want) == 0, "the expectation");
    /* a prefill of P + X + Q: what the approximation differs from */
    ak_block_pool *fp = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    ak_kv *fkv = alone(&e, fp, all, NP + NX + NQ);
    REQUIRE(fkv, "full prefill");
    memcpy(full, e.logits, sizeof(float) * (size_t)e.vocab);
    ak_kv_free(fkv);
    ak_block_pool_free(fp);
    double d = max_abs_diff(got, want, e.vocab), dfull = max_abs_diff(got, full, e.vocab), mx = 0;
    for (int i = 0; i < e.vocab; i++) mx = fmax(mx, fabs((double)want[i]));
    printf("    appended card: max |logit diff| vs the parts computed apart %.2e, vs a prefill of both %.3f "
           "(max |logit| %.2f)\n", d, dfull, mx);
    /* the same f16 vectors summed class by class in a mixed block: equal up
     * to float rounding */
    CHECK(d < 1e-4 * (mx > 1 ? mx : 1), "append vs the parts apart: max |diff| %.3g", d);
    CHECK(dfull > 1e-2 && dfull > 100 * d, "append vs a prefill of both: max |diff| %.3g (apart: %.3g)", dfull, d);

    /* a receiver holding nothing: the same as replace */
    REQUIRE(ak_agent_import_card_mode(ag, "fresh", "cx", AK_IMPORT_APPEND, &err) == 0, "into nothing: %s", err.msg);
    REQUIRE(ak_agent_import_card(ag, "repl", "cx", &err) == 0, "replace: %s", err.msg);
    float *g2 = malloc(sizeof(float) * (size_t)e.vocab);
    int32_t xq[NX + 1];
    memcpy(xq, X, sizeof X);
    xq[NX] = 4;
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "fresh", .tokens = xq, .n = NX + 1}, got, &ti) == 0 &&
                aturn(t, &e, ag, &(ak_turn_opts){.id = "repl", .tokens = xq, .n = NX + 1}, g2, &ti) == 0,
            "turns after");
    ak_agents_get(ag, ak_agents_find(ag, "fresh"), &in);
    CHECK(!memcmp(got, g2, sizeof(float) * (size_t)e.vocab) && !strcmp(in.card, "cx"),
          "append into nothing differs from replace (card \"%s\")", in.card);

    /* bad input, each by code, the receiver as it was */
    CHECK(ak_agent_import_card_mode(ag, "rx", "nope", AK_IMPORT_APPEND, &err) < 0 && err.code == AK_ERR_NOT_FOUND,
          "unknown card: %s", err.msg);
    CHECK(ak_agent_import_card_mode(ag, "rx", "cx", (ak_import_mode)7, &err) < 0 && err.code == AK_ERR_INVALID,
          "unknown mode: %s", err.msg);
    CHECK(ak_agent_import_card_mode(ag, ".x", "cx", AK_IMPORT_APPEND, &err) < 0 && err.code == AK_ERR_INVALID,
          "bad id: %s", err.msg);
    {   /* busy: in a turn */
        ak_kv *kv;
        REQUIRE(ak_agent_open(ag, &(ak_turn_opts){.id = "rx", .tokens = all, .n = NP + NX + NQ,
                              .n_reserve = NP + NX + NQ}, &kv, &ti, &err) == 0, "open: %s", err.msg);
        CHECK(ak_agent_import_card_mode(ag, "rx", "cx", AK_IMPORT_APPEND, &err) < 0 && err.code == AK_ERR_BUSY,
              "busy: %s", err.msg);
        ak_agent_abort(ag, "rx");
    }
    ak_agents_get(ag, ak_agents_find(ag, "rx"), &in);   /* the open kept all but the last token */
    int nb = in.n_tokens;
    /* too long for the context: a long receiver */
    int32_t longp[ACTX];
    for (int i = 0; i < ACTX - NX; i++) longp[i] = (int32_t)((i * 7 + 1) % e.vocab);
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "big", .tokens = longp, .n = ACTX - NX}, NULL, &ti) == 0, "big");
    CHECK(ak_agent_import_card_mode(ag, "big", "cx", AK_IMPORT_APPEND, &err) < 0 && err.code == AK_ERR_INVALID,
          "too long: %s", err.msg);
    ak_agents_get(ag, ak_agents_find(ag, "big"), &in);
    CHECK(in.n_tokens == ACTX - NX && !in.impure, "big changed: %d tokens", in.n_tokens);
    /* segments: each append adds the positions before it and the card (an
     * own token between appends); the 5th makes 9 segments: refused, the
     * agent as it was */
    int32_t hist[ACTX];
    int nh = 2;
    hist[0] = 1, hist[1] = 2;
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "seg", .tokens = hist, .n = nh}, NULL, &ti) == 0, "seg");
    for (int k = 0; k < 4; k++) {
        REQUIRE(ak_agent_import_card_mode(ag, "seg", "cx", AK_IMPORT_APPEND, &err) == 0, "append %d: %s", k, err.msg);
        memcpy(hist + nh, X, sizeof X);
        nh += NX;
        hist[nh++] = 5;
        REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "seg", .tokens = hist, .n = nh}, NULL, &ti) == 0, "seg %d", k);
        CHECK(ti.reused == nh - 1, "append %d: reused %d of %d", k, ti.reused, nh);
    }
    CHECK(ak_agent_import_card_mode(ag, "seg", "cx", AK_IMPORT_APPEND, &err) < 0 && err.code == AK_ERR_INVALID,
          "a 9th segment: %s", err.msg);
    ak_agents_get(ag, ak_agents_find(ag, "seg"), &in);
    CHECK(in.n_tokens == nh && ak_agent_match_len(ag, "seg", hist, nh) == nh, "seg disturbed: %d tokens", in.n_tokens);
    ak_agents_get(ag, ak_agents_find(ag, "rx"), &in);
    CHECK(in.n_tokens == nb && ak_agent_match_len(ag, "rx", all, NP + NX + NQ) == nb, "rx disturbed");
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    free(got);
    free(want);
    free(full);
    free(g2);
    tenv_close(&e);
}

/* Persistence of appended agents (store.h: SEGMENTS). Twins: one stays hot
 * across its turns, its twin is saved after the append's first turn and
 * restored after a restart (by a turn, or by a prefetch on the restore
 * path): the restored one's logits must be the hot one's, bit for bit.
 * Receivers: plain (segments own, card) and pooled (pool, own, card). Then
 * what must be a miss: a truncated file, a version 4 file with segments, a
 * vanished card; and a version 4 file of a single card base is still read. */
TEST(cards_append_survives_a_restart) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    const char *dir = dir_for("cards-append");
    ak_store *store = ak_store_open(dir, NULL, &err);
    REQUIRE(store, "%s", err.msg);
    ak_block_pool *pool;
    ak_agents *ag = agents_at(&e, &pool, store);
    REQUIRE(ag, "agents");
    enum { NDOC = 20, NR = 3 };
    int32_t P[NP], X[NX], Q[NQ], all[NP + NX + NQ + NR];
    texts(e.vocab, P, X, Q);
    memcpy(all, P, sizeof P);
    memcpy(all + NP, X, sizeof X);
    memcpy(all + NP + NX, Q, sizeof Q);
    for (int i = 0; i < NR; i++) all[NP + NX + NQ + i] = (int32_t)(i + 9);
    const int n1 = NP + NX + NQ, n2 = n1 + NR;
    ak_turn ti;
    REQUIRE(ak_pool_create(ag, e.ctx, &(ak_pool_request){.id = "doc", .tokens = P, .n = NDOC, .fk = AK_KV_F16,
                           .fv = AK_KV_F16}, NULL, NULL, &err) == 0, "pool: %s",
            err.msg);
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "tx", .tokens = X, .n = NX}, NULL, &ti) == 0, "tx");
    ak_card_request rq;
    memset(&rq, 0, sizeof rq);
    rq.card_id = "cx";
    char cid[AK_AGENT_ID_MAX + 1];
    REQUIRE(ak_agent_make_card(ag, "tx", &rq, cid, &err) == 0, "make: %s", err.msg);
    const ak_card *c = ak_card_get(ag, "cx", &err);
    REQUIRE(c, "%s", err.msg);
    char chash[17];
    snprintf(chash, sizeof chash, "%s", c->hash);
    const char *plain[] = {"rx", "ry"}, *pooled[] = {"pz", "pw", "pv"};
    for (int i = 0; i < 2; i++) {
        REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = plain[i], .tokens = P, .n = NP}, NULL, &ti) == 0, "%s",
                plain[i]);
        REQUIRE(ak_agent_import_card_mode(ag, plain[i], "cx", AK_IMPORT_APPEND, &err) == 0, "%s: %s", plain[i], err.msg);
        REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = plain[i], .tokens = all, .n = n1}, NULL, &ti) == 0, "%s",
                plain[i]);
    }
    for (int i = 0; i < 3; i++) {
        REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = pooled[i], .pool_id = "doc", .tokens = P, .n = NP}, NULL,
                      &ti) == 0, "%s", pooled[i]);
        REQUIRE(ak_agent_import_card_mode(ag, pooled[i], "cx", AK_IMPORT_APPEND, &err) == 0, "%s: %s", pooled[i], err.msg);
        REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = pooled[i], .pool_id = "doc", .tokens = all, .n = n1}, NULL,
                      &ti) == 0, "%s", pooled[i]);
        CHECK(ti.reused == NP + NX, "%s with its pool after the append: reused %d (the pool re-attached?)", pooled[i],
              ti.reused);
    }
    /* twins that leave the appended history inside their own positions
     * (a prompt diverging at 20 of P's 37): the card and the positions
     * after it go, a segment of 20 own positions stays (a file with an own
     * segment and no card) */
    int32_t dv[30];
    memcpy(dv, P, sizeof(int32_t) * 20);
    for (int i = 20; i < 30; i++) dv[i] = (int32_t)((i * 11 + 2) % e.vocab);
    const char *dvg[] = {"rd", "re"};
    for (int i = 0; i < 2; i++) {
        REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = dvg[i], .tokens = P, .n = NP}, NULL, &ti) == 0, "%s", dvg[i]);
        REQUIRE(ak_agent_import_card_mode(ag, dvg[i], "cx", AK_IMPORT_APPEND, &err) == 0, "%s: %s", dvg[i], err.msg);
        REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = dvg[i], .tokens = dv, .n = 25}, NULL, &ti) == 0, "%s", dvg[i]);
        CHECK(ti.match == AK_MATCH_DIVERGE && ti.reused == 20, "%s diverging: %s, reused %d", dvg[i],
              ak_match_name(ti.match), ti.reused);
    }
    float *ld = malloc(sizeof(float) * (size_t)e.vocab);
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "rd", .tokens = dv, .n = 30}, ld, &ti) == 0, "rd hot");
    /* the hot ones' next turn: the reference */
    float *lr = malloc(sizeof(float) * (size_t)e.vocab), *lp = malloc(sizeof(float) * (size_t)e.vocab);
    float *got = malloc(sizeof(float) * (size_t)e.vocab);
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "rx", .tokens = all, .n = n2}, lr, &ti) == 0 &&
                aturn(t, &e, ag, &(ak_turn_opts){.id = "pz", .pool_id = "doc", .tokens = all, .n = n2}, lp, &ti) == 0,
            "hot turns");
    /* a single card base (replace) for the version 4 check below */
    REQUIRE(ak_agent_import_card(ag, "solo", "cx", &err) == 0, "solo: %s", err.msg);
    int32_t xq[NX + NQ];
    memcpy(xq, X, sizeof X);
    memcpy(xq + NX, Q, sizeof Q);
    float *ls = malloc(sizeof(float) * (size_t)e.vocab);
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "solo", .tokens = xq, .n = NX + NQ}, ls, &ti) == 0, "solo turn");
    CHECK(ak_card_remove(ag, "cx", &err) < 0 && err.code == AK_ERR_BUSY && strstr(err.msg, "ry"), "remove: %s", err.msg);
    REQUIRE(ak_agents_flush(ag, &err) == 0, "flush: %s", err.msg);
    /* the files: format 5, the segments as the format says */
    char want[400], *sg = get_meta(file_of(dir, "ry"), "segments"), *ver = get_meta(file_of(dir, "ry"), "format_version");
    snprintf(want, sizeof want, "own:%d,card:%d:cx:%s", NP, NX, chash);
    CHECK(sg && !strcmp(sg, want) && ver && !strcmp(ver, "5"), "ry's segments \"%s\" (want \"%s\"), version %s",
          sg ? sg : "none", want, ver ? ver : "none");
    free(sg);
    free(ver);
    sg = get_meta(file_of(dir, "pw"), "segments");
    ak_pool_info pi;
    REQUIRE(ak_pool_get(ag, "doc", &pi, &err) == 0, "%s", err.msg);
    snprintf(want, sizeof want, "pool:%d:doc:%s,own:%d,card:%d:cx:%s", NDOC, pi.hash, NP - NDOC, NX, chash);
    CHECK(sg && !strcmp(sg, want), "pw's segments \"%s\" (want \"%s\")", sg ? sg : "none", want);
    free(sg);
    sg = get_meta(file_of(dir, "re"), "segments");
    CHECK(sg && !strcmp(sg, "own:20"), "re's segments \"%s\" (want \"own:20\")", sg ? sg : "none");
    free(sg);
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "python3 tests/check_safetensors.py %s %s >/dev/null", file_of(dir, "ry"), file_of(dir, "pw"));
    CHECK(system(cmd) == 0, "check_safetensors.py rejects a file with segments");
    ak_agents_free(ag);
    ak_block_pool_free(pool);

    /* damage: pz's file truncated, pw's said to be version 4, solo's (a
     * single base) version 4 */
    struct stat sb;
    REQUIRE(stat(file_of(dir, "pz"), &sb) == 0 && truncate(file_of(dir, "pz"), sb.st_size - 3) == 0, "truncate");
    REQUIRE(set_meta(file_of(dir, "pw"), "format_version", "4") == 0 &&
                set_meta(file_of(dir, "solo"), "format_version", "4") == 0, "rewrite");
    ak_store_close(store);
    store = ak_store_open(dir, NULL, &err);
    REQUIRE(store, "%s", err.msg);
    ag = agents_at(&e, &pool, store);
    REQUIRE(ag, "agents after the restart");
    CHECK(ak_card_remove(ag, "cx", &err) < 0 && err.code == AK_ERR_BUSY && strstr(err.msg, "ry"),
          "remove with holders on disk: %s", err.msg);
    /* ry by a prefetch on the restore path */
    ak_restore_job *job = NULL;
    REQUIRE(ak_agent_prefetch(ag, "ry", 0, &job, &err) == 1, "prefetch: %s", err.msg);
    ak_restore_job_run(job);
    ak_agent_prefetch_done(ag, job);
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "ry", .tokens = all, .n = n2}, got, &ti) == 0, "ry");
    CHECK(ti.tier == AK_TIER_WARM && ti.restored_ahead && ti.reused == n1 && ti.prefilled == NR,
          "ry: tier %s, ahead %d, reused %d", ak_tier_name(ti.tier), ti.restored_ahead, ti.reused);
    CHECK(!memcmp(got, lr, sizeof(float) * (size_t)e.vocab), "ry restored: logits differ from the hot twin's (%.3g)",
          max_abs_diff(got, lr, e.vocab));
    /* rx by a turn: the same history, the same bits */
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "rx", .tokens = all, .n = n2}, got, &ti) == 0, "rx");
    CHECK(ti.tier == AK_TIER_WARM && ti.match == AK_MATCH_EXACT && !memcmp(got, lr, sizeof(float) * (size_t)e.vocab),
          "rx restored: tier %s, match %s", ak_tier_name(ti.tier), ak_match_name(ti.match));
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "pv", .pool_id = "doc", .tokens = all, .n = n2}, got, &ti) == 0,
            "pv");
    CHECK(ti.tier == AK_TIER_WARM && ti.reused == n1 && !memcmp(got, lp, sizeof(float) * (size_t)e.vocab),
          "pv restored (pool, own, card): tier %s, reused %d, max |diff| %.3g", ak_tier_name(ti.tier), ti.reused,
          max_abs_diff(got, lp, e.vocab));
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "re", .tokens = dv, .n = 30}, got, &ti) == 0, "re");
    CHECK(ti.tier == AK_TIER_WARM && ti.reused == 25 && !memcmp(got, ld, sizeof(float) * (size_t)e.vocab),
          "re restored (an own segment, no card): tier %s, reused %d", ak_tier_name(ti.tier), ti.reused);
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "solo", .tokens = xq, .n = NX + NQ}, got, &ti) == 0, "solo");
    CHECK(ti.tier == AK_TIER_WARM && ti.reused == NX + NQ - 1 && !memcmp(got, ls, sizeof(float) * (size_t)e.vocab),
          "a version 4 file: tier %s, reused %d", ak_tier_name(ti.tier), ti.reused);
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "pz", .pool_id = "doc", .tokens = all, .n = n2}, got, &ti) == 0 &&
                aturn(t, &e, ag, &(ak_turn_opts){.id = "pw", .pool_id = "doc", .tokens = all, .n = n2}, NULL, &ti) == 0,
            "pz, pw");
    CHECK(quarantined(dir, "pz") == 1 && quarantined(dir, "pw") == 1,
          "a truncated file and a version 4 file with segments are corrupt (quarantined)");
    {   /* recomputed: a prefill of the whole text now, not the approximation */
        ak_block_pool *fp = ak_block_pool_new(&e.m->spec, 0, 0, &err);
        ak_kv *fkv = fp ? alone(&e, fp, all, n2) : NULL;
        REQUIRE(fkv, "full prefill");
        CHECK(max_abs_diff(got, e.logits, e.vocab) < 1e-3 && max_abs_diff(got, lp, e.vocab) > 1e-1,
              "pz recomputed: %.3g from a prefill, %.3g from the appended twin", max_abs_diff(got, e.logits, e.vocab),
              max_abs_diff(got, lp, e.vocab));
        ak_kv_free(fkv);
        ak_block_pool_free(fp);
    }
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_store_close(store);

    /* the card vanishes behind the agents' back: a miss, recomputed */
    char cpath[700];
    snprintf(cpath, sizeof cpath, "%s/cards/cx.safetensors", dir);
    REQUIRE(unlink(cpath) == 0, "unlink the card");
    store = ak_store_open(dir, NULL, &err);
    REQUIRE(store, "%s", err.msg);
    ag = agents_at(&e, &pool, store);
    REQUIRE(ag, "agents");
    REQUIRE(aturn(t, &e, ag, &(ak_turn_opts){.id = "ry", .tokens = all, .n = n2}, got, &ti) == 0,
            "ry without its card");
    CHECK(ti.tier == AK_TIER_COLD && ti.reused == 0, "ry without its card: tier %s, reused %d", ak_tier_name(ti.tier),
          ti.reused);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_store_close(store);
    free(lr);
    free(lp);
    free(ls);
    free(ld);
    free(got);
    tenv_close(&e);
}

/* Random vectors at positions [from, to) of kv (prepared here). */
static int fill_random(ak_kv *kv, int from, int to, ak_rng *rng) {
    ak_error err = {{0}};
    const ak_cache_spec *s = ak_block_pool_spec(ak_kv_pool(kv));
    int nk = s->n_head_kv * s->head_dim_k, nv = s->n_head_kv * s->head_dim_v;
    float *k = malloc(sizeof(float) * (size_t)(nk + nv)), *v = k + nk;
    int rc = ak_kv_prepare(kv, from, to, &err);
    for (int p = from; rc == 0 && p < to; p++)
        for (int l = 0; rc == 0 && l < s->n_layer; l++) {
            for (int i = 0; i < nk + nv; i++) k[i] = ak_rng_normal(rng);
            rc = ak_kv_write(kv, l, p, k, v, &err);
        }
    free(k);
    return rc;
}

/* The prelink of the store tests below: the file's segments, own ones as
 * fresh blocks, card ones from the blocks of the sequence ud. */
static int seg_prelink(void *ud, const ak_store_base *base, const int32_t *tokens, int n, ak_kv *kv, ak_error *err) {
    const ak_kv *card = ud;
    (void)tokens;
    (void)n;
    for (int k = 0; k < base->n_seg; k++) {
        int len = base->seg[k].len, T = ak_block_pool_block_tokens(ak_kv_pool(kv)), nb = (len + T - 1) / T;
        if (base->seg[k].kind == AK_SEG_OWN) {
            if (ak_kv_append_empty(kv, len, err) < 0) return -1;
            continue;
        }
        ak_block *b[16];
        for (int i = 0; i < nb && i < 16; i++) b[i] = ak_kv_span(card, i, NULL, NULL);
        if (nb > 16 || ak_kv_append_blocks(kv, b, nb, len, err) < 0) return -1;
    }
    return 0;
}

/* The store alone (no model): a sequence of segments (45 own positions, a
 * card's 21, 44 own) saved and loaded back byte for byte, into a pool of
 * the same block size (read straight into blocks) and of another (through
 * memory); the file passes the independent checker; malformed segments
 * records are CORRUPT, none reaches a sequence. */
TEST(store_segments_round_trip_and_bad_records) {
    const char *dir = dir_for("segments");
    ak_error err = {{0}};
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "%s", err.msg);
    ak_cache_spec s = small_spec();
    ak_rng rng;
    ak_rng_seed(&rng, 1616);
    ak_block_pool *p32 = ak_block_pool_new(&s, 32, 0, &err), *p16 = ak_block_pool_new(&s, 16, 0, &err);
    REQUIRE(p32 && p16, "%s", err.msg);
    ak_kv *A = ak_kv_new(p32, AK_KV_F16, AK_KV_F16, 256, &err), *C = ak_kv_new(p32, AK_KV_F16, AK_KV_F16, 256, &err);
    REQUIRE(A && C && fill_random(A, 0, 45, &rng) == 0 && fill_random(C, 0, 21, &rng) == 0, "sources");
    ak_kv *S = ak_kv_new(p32, AK_KV_F16, AK_KV_F16, 256, &err);
    ak_block *cb = ak_kv_span(C, 0, NULL, NULL);
    REQUIRE(S && ak_kv_attach_base(S, A, 45, &err) == 0 && ak_kv_append_blocks(S, &cb, 1, 21, &err) == 0 &&
            fill_random(S, 66, 110, &rng) == 0, "the sequence: %s", err.msg);
    int32_t tok[110];
    for (int i = 0; i < 110; i++) tok[i] = (int32_t)((i * 13 + 1) % VOCAB);
    ak_store_base b;
    memset(&b, 0, sizeof b);
    b.n_seg = 2;
    b.seg[0] = (ak_store_seg){.kind = AK_SEG_OWN, .len = 45, .id = "", .hash = ""};
    b.seg[1] = (ak_store_seg){.kind = AK_SEG_CARD, .len = 21, .id = "cc", .hash = "0123456789abcdef"};
    /* the base must describe the sequence's segments */
    ak_store_base wrong = b;
    wrong.seg[0].len = 44, wrong.seg[1].len = 22;
    CHECK(!ak_store_snapshot_base("sg", S, tok, 110, &wrong, FP, "m", &err) && err.code == AK_ERR_INVALID,
          "segments unlike the sequence's: %s", err.msg);
    wrong = b;
    wrong.seg[1].kind = AK_SEG_POOL;
    CHECK(!ak_store_snapshot_base("sg", S, tok, 110, &wrong, FP, "m", &err) && err.code == AK_ERR_INVALID,
          "a pool past the first: %s", err.msg);
    ak_snapshot *sn = ak_store_snapshot_base("sg", S, tok, 110, &b, FP, "m", &err);
    REQUIRE(sn && ak_store_write_snapshot(st, sn, &err) == 0, "save: %s", err.msg);
    ak_snapshot_free(sn);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "python3 tests/check_safetensors.py %s >/dev/null", file_of(dir, "sg"));
    CHECK(system(cmd) == 0, "check_safetensors.py rejects the file");
    /* back, same block size and another (the card's blocks copied there) */
    ak_kv *C16 = ak_kv_new(p16, AK_KV_F16, AK_KV_F16, 256, &err);
    REQUIRE(C16 && ak_kv_prepare(C16, 0, 21, &err) == 0, "C16");
    float kv_[2 * 3 * 64 * 2];
    for (int p = 0; p < 21; p++)
        for (int l = 0; l < s.n_layer; l++) {
            ak_kv_read(C, l, p, kv_, kv_ + 2 * 64, NULL);
            ak_kv_write(C16, l, p, kv_, kv_ + 2 * 64, NULL);
        }
    for (int pass = 0; pass < 2; pass++) {
        ak_kv *R = ak_kv_new(pass ? p16 : p32, AK_KV_F16, AK_KV_F16, 256, &err);
        ak_store_load_info info;
        ak_store_status rs = ak_store_load_linked(st, &(ak_store_load_args){.id = "sg", .fingerprint = FP,
                                                  .vocab = VOCAB, .kv = R, .prelink = seg_prelink,
                                                  .ud = pass ? C16 : C}, &info, &err);
        int lens[AK_KV_MAX_SEGMENTS];
        CHECK(rs == AK_STORE_HIT && info.n_tokens == 110 && info.base.n_seg == 2 && info.linked == 21 &&
                  ak_kv_segments(R, lens) == 2 && lens[0] == 45 && lens[1] == 21,
              "load (blocks of %d): %s %s", pass ? 16 : 32, ak_store_status_name(rs), err.msg);
        if (rs == AK_STORE_HIT) {
            CHECK(kv_equal(R, S), "blocks of %d: the loaded sequence differs", pass ? 16 : 32);
            free(info.tokens);
        }
        ak_kv_free(R);
    }
    /* malformed records: CORRUPT, whatever the rest says */
    static const char *bad[] = {
        "own:45,card:21:cc",                       /* a card without its hash */
        "own:0,card:66:cc:0123456789abcdef",       /* an empty segment */
        "own:45,card:20:cc:0123456789abcdef",      /* not base_len in all */
        "own:45,pool:21:cc:0123456789abcdef",      /* a pool past the first */
        "own:45,card:21:cc:0123456789ABCDEF",      /* not a content hash */
        "own:45,blob:21",                          /* an unknown kind */
        "own:45,card:21:.x:0123456789abcdef",      /* not an id */
        "own:045,card:21:cc:0123456789abcdef",     /* not canonical */
        "own:6,own:6,own:6,own:6,own:6,own:6,own:6,own:6,own:6,card:12:cc:0123456789abcdef",   /* 10 segments */
        "own:45,,card:21:cc:0123456789abcdef",     /* an empty record */
        "",                                        /* none */
    };
    size_t glen;
    char *good = ak_read_file(file_of(dir, "sg"), &glen, &err);
    REQUIRE(good, "%s", err.msg);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        REQUIRE(write_bytes(file_of(dir, "bad"), good, glen) == 0 && set_meta(file_of(dir, "bad"), "agent_id", "bad") == 0 &&
                    set_meta(file_of(dir, "bad"), "segments", bad[i]) == 0, "rewrite");
        ak_store_status vs = ak_store_verify(st, "bad", FP, VOCAB, &err);
        CHECK(vs == AK_STORE_CORRUPT, "segments \"%s\": %s (%s)", bad[i], ak_store_status_name(vs), err.msg);
    }
    /* and a sound rewrite of the same file verifies (the rewriting is not what fails) */
    REQUIRE(write_bytes(file_of(dir, "bad"), good, glen) == 0 && set_meta(file_of(dir, "bad"), "agent_id", "bad") == 0,
            "rewrite");
    CHECK(ak_store_verify(st, "bad", FP, VOCAB, &err) == AK_STORE_HIT, "the rewritten good file: %s", err.msg);
    free(good);
    ak_kv_free(S);
    ak_kv_free(A);
    ak_kv_free(C);
    ak_kv_free(C16);
    ak_block_pool_free(p32);
    ak_block_pool_free(p16);
    ak_store_close(st);
}
