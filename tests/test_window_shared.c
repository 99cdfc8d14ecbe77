/* test_window_shared.c - gemma3 agents (sliding-window layers: kvcache.h
 * LAYER GROUPS) on shared bases, on the tiny gemma3 file (window 16,
 * blocks of 8 here, contexts of 90+ positions: the window is crossed many
 * times). A pool's and a memory's sequences keep every block of both
 * layer groups; an agent that starts from one releases its own references
 * as its window moves on, never changing the shared blocks; its logits
 * equal bit for bit those of a twin that prefilled the same tokens into a
 * plain sequence keeping every block; two agents on one base do not see
 * each other's tokens; saved (version 7 with a base) and restored warm by
 * a fresh process, it goes on bit for bit as the twin. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "agents/agent.h"
#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "agents/memories.h"
#include "engine/model.h"
#include "engine/reuse.h"
#include "text/sampler.h"
#include "store/store.h"
#include "base/util.h"
#include "test.h"

enum { ST = 8, SCTX = 256, NB = 40, NA = 12, GEN = 40 };

static ak_model *load_gemma3(ak_test_ctx *t) {
    char path[512];
    ak_error err = {{0}};
    ak_model *m = ak_model_load(test_path(path, sizeof path, "models/gemma3-tiny.gguf"), NULL, NULL, &err);
    if (!m) ak_test_fail(t, __FILE__, __LINE__, "load: %s", err.msg);
    return m;
}

/* Every stored vector of positions [0, n) of every layer of kv, in f32
 * (malloc'd), or NULL when one cannot be read. */
static float *dump(const ak_model *m, const ak_kv *kv, int n) {
    size_t per = (size_t)m->spec.n_head_kv * (size_t)(m->spec.head_dim_k + m->spec.head_dim_v);
    float *d = malloc(sizeof(float) * per * (size_t)n * (size_t)m->spec.n_layer);
    ak_error err = {{0}};
    for (int l = 0; d && l < m->spec.n_layer; l++)
        for (int p = 0; p < n; p++) {
            float *k = d + ((size_t)l * (size_t)n + (size_t)p) * per;
            if (ak_kv_read(kv, l, p, k, k + (size_t)m->spec.n_head_kv * m->spec.head_dim_k, &err) < 0) {
                free(d);
                return NULL;
            }
        }
    return d;
}

/* The blocks of kv's spans [0, nb) of both groups, and their reference
 * counts. */
typedef struct {
    ak_block *b[2][64];
    int refs[2][64];
    int nb;
} block_list;

static void list_blocks(ak_block_pool *pool, const ak_kv *kv, int nb, block_list *o) {
    o->nb = nb;
    for (int i = 0; i < nb; i++) {
        o->b[0][i] = ak_kv_span(kv, i, NULL, NULL);
        o->b[1][i] = ak_kv_local_span(kv, i);
        for (int g = 0; g < 2; g++) o->refs[g][i] = o->b[g][i] ? ak_block_refcount(pool, o->b[g][i]) : -1;
    }
}

/* A plain sequence (its own pool, keeping every block) with tokens[0..n)
 * prefilled; last logits into out. */
static ak_kv *twin_of(ak_test_ctx *t, ak_model *m, ak_ctx *c, ak_block_pool *pool, const int32_t *tokens, int n,
                      float *out) {
    ak_error err = {{0}};
    ak_kv *kv = ak_kv_new(pool, AK_KV_F16, AK_KV_F16, SCTX, &err);
    if (!kv || ak_eval(c, kv, &(ak_eval_args){.tokens = tokens, .n = n, .logits = out}, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "twin: %s", err.msg);
        ak_kv_free(kv);
        return NULL;
    }
    return kv;
}

/* What an agent and its twin step on: the context and their logits (la
 * the agent's, lt the twin's, vocab floats each). */
typedef struct {
    ak_ctx *c;
    float *la, *lt;
    int vocab;
} lockstep;

/* Greedy steps of agent id (of ag) and of its twin from the twin's logits,
 * `steps` of them, the tokens appended to hist[*n..]: returns the number of
 * steps whose logits differ (-1 on an error, recorded in t). */
static int step_both(ak_test_ctx *t, const lockstep *ls, ak_agents *ag, const char *id, ak_kv *twin, int32_t *hist,
                     int *n, int steps) {
    ak_ctx *c = ls->c;
    float *la = ls->la, *lt = ls->lt;
    int vocab = ls->vocab;
    ak_error err = {{0}};
    int differ = 0;
    for (int i = 0; i < steps; i++) {
        int32_t tok = ak_argmax(lt, vocab);
        if (ak_agent_step(ag, c, id, tok, la, &err) < 0 ||
            ak_eval(c, twin, &(ak_eval_args){.tokens = &tok, .n = 1, .pos0 = *n, .logits = lt}, &err) < 0) {
            ak_test_fail(t, __FILE__, __LINE__, "step %d of %s: %s", i, id, err.msg);
            return -1;
        }
        hist[(*n)++] = tok;
        differ += memcmp(la, lt, sizeof(float) * (size_t)vocab) != 0;
    }
    return differ;
}

/* The header of an agent file as a string (malloc'd), or NULL. */
static char *file_header(const char *path) {
    size_t len;
    ak_error err = {{0}};
    uint8_t *img = (uint8_t *)ak_read_file(path, &len, &err);
    if (!img || len < 8) { free(img); return NULL; }
    uint64_t h = 0;
    for (int i = 0; i < 8; i++) h |= (uint64_t)img[i] << (8 * i);
    char *s = h <= len - 8 ? malloc(h + 1) : NULL;
    if (s) {
        memcpy(s, img + 8, h);
        s[h] = 0;
    }
    free(img);
    return s;
}

typedef struct {
    ak_block_pool *pool;
    ak_store *store;
    ak_agents *ag;
    int mem;   /* the shared base of the tests: a memory (1) or a pool (0) */
} rig;

/* Opens r on directory dir for model m, its base a memory (mem = 1) or a
 * pool (0). Returns 0, or -1 with err set. */
static int rig_open(rig *r, ak_model *m, const char *dir, int mem, ak_error *err) {
    memset(r, 0, sizeof *r);
    r->mem = mem;
    r->pool = ak_block_pool_new(&m->spec, ST, 0, err);
    r->store = r->pool ? ak_store_open(dir, NULL, err) : NULL;
    ak_agents_config cfg = {.model = m, .pool = r->pool, .store = r->store, .fk = AK_KV_F16, .fv = AK_KV_F16,
                            .n_ctx = SCTX, .save = AK_SAVE_EVERY_TURN};
    r->ag = r->store ? ak_agents_new(&cfg, err) : NULL;
    return r->ag ? 0 : -1;
}

static void rig_close(rig *r) {
    ak_agents_free(r->ag);
    ak_store_close(r->store);
    ak_block_pool_free(r->pool);
}

/* The shared base of these tests: a pool (r->mem = 0) or a memory
 * (r->mem = 1) of base[0..NB), made through the agents of r; its sequence
 * into *kv. Returns 0, or -1 with a test failure recorded. */
static int make_base(ak_test_ctx *t, rig *r, ak_ctx *c, const int32_t *base, const ak_kv **kv) {
    ak_error err = {{0}};
    if (r->mem) {
        int computed = 0;
        if (ak_memory_add(r->ag, c, &(ak_memory_request){.id = "m", .text = "the memory", .tokens = base, .n = NB,
                          .fk = AK_KV_F16, .fv = AK_KV_F16}, &computed, &err) < 0 ||
            !(*kv = ak_memory_kv(r->ag, "m", &err))) {
            ak_test_fail(t, __FILE__, __LINE__, "memory: %s", err.msg);
            return -1;
        }
        return 0;
    }
    ak_kv *pk;
    if (ak_pool_begin(r->ag, &(ak_pool_request){.id = "doc", .tokens = base, .n = NB, .fk = AK_KV_F16,
                      .fv = AK_KV_F16, .source = "src"}, &pk, &err) < 0 ||
        ak_eval(c, pk, &(ak_eval_args){.tokens = base, .n = NB}, &err) < 0 || ak_pool_commit(r->ag, "doc", &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "pool: %s", err.msg);
        return -1;
    }
    *kv = pk;
    return 0;
}

/* A turn of agent id whose prompt[0..n) starts with r's base (a pool's or
 * a memory's, placed at 0 with reuse "none"); last logits into la. Returns
 * 0, or -1 with a test failure recorded. */
static int turn_on_base(ak_test_ctx *t, rig *r, ak_ctx *c, const char *id, const int32_t *prompt, int n, float *la,
                        ak_turn *tu) {
    int mem = r->mem;
    ak_error err = {{0}};
    ak_kv *kv;
    int at = 0, len = NB;
    int rc = mem ? ak_agent_open(r->ag, &(ak_turn_opts){.id = id, .tokens = prompt, .n = n, .n_reserve = n, .at = &at,
                                 .len = &len, .k = 1}, &kv, tu, &err)
                 : ak_agent_open(r->ag, &(ak_turn_opts){.id = id, .pool_id = "doc", .tokens = prompt, .n = n,
                                 .n_reserve = n}, &kv, tu, &err);
    int pos = rc == 0 ? tu->reused : 0;
    if (rc == 0 && mem && pos == 0) {
        rc = ak_agent_place_memory(r->ag, &(ak_place_opts){.id = id, .mem_id = "m", .tokens = prompt, .at = 0}, &kv,
                                   &err);
        pos = NB;
    }
    if (rc == 0) rc = ak_eval(c, kv, &(ak_eval_args){.tokens = prompt + pos, .n = n - pos, .pos0 = pos,
                              .logits = la}, &err);
    if (rc == 0) rc = ak_agent_commit(r->ag, id, prompt, n, &err);
    if (rc < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "turn of %s: %s", id, err.msg);
        ak_agent_abort(r->ag, id);
        return -1;
    }
    return 0;
}

static void check_shared_base(ak_test_ctx *t, int mem) {
    ak_model *m = load_gemma3(t);
    if (!m) return;
    ak_error err = {{0}};
    const int V = m->cfg.vocab, W = m->cfg.window;
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/window-shared-%s", test_tmp_dir(), mem ? "memory" : "pool");
    rig r;
    ak_ctx *c = ak_ctx_new(m, 64, 2, &err);
    ak_block_pool *tp = ak_block_pool_new(&m->spec, ST, 0, &err);
    float *la = malloc(sizeof(float) * V), *lt = malloc(sizeof(float) * V);
    static int32_t h1[SCTX], h2[SCTX];
    REQUIRE(c && tp && la && lt && W == 16 && rig_open(&r, m, dir, mem, &err) == 0, "setup: %s", err.msg);
    const lockstep ls = {.c = c, .la = la, .lt = lt, .vocab = V};
    for (int i = 0; i < NB; i++) h1[i] = h2[i] = 2 + (i * 313) % 15000;
    for (int i = 0; i < NA; i++) {
        h1[NB + i] = 5 + (i * 97) % 9000;
        h2[NB + i] = 11 + (i * 151) % 7000;
    }
    const ak_kv *bk;
    if (make_base(t, &r, c, h1, &bk) < 0) goto out;
    const int nbb = (NB + ST - 1) / ST;
    REQUIRE(ak_kv_group_blocks(bk, 0) == nbb && ak_kv_group_blocks(bk, 1) == nbb,
            "the base keeps %d/%d blocks, expected %d of each group", ak_kv_group_blocks(bk, 0), ak_kv_group_blocks(bk, 1),
            nbb);
    float *before = dump(m, bk, NB);
    block_list b0;
    list_blocks(r.pool, bk, nbb, &b0);
    REQUIRE(before, "dump of the base");

    /* agent 1 on the base, and its twin */
    ak_turn tu;
    int n1 = NB + NA;
    ak_kv *t1 = twin_of(t, m, c, tp, h1, n1, lt);
    if (!t1 || turn_on_base(t, &r, c, "a1", h1, n1, la, &tu) < 0) goto out_dump;
    int differ = memcmp(la, lt, sizeof(float) * V) != 0;
    int d = step_both(t, &ls, r.ag, "a1", t1, h1, &n1, GEN);
    REQUIRE(d >= 0 && ak_agent_end(r.ag, "a1", &err) == 0, "end: %s", err.msg);
    CHECK(differ + d == 0 && tu.shared == (mem ? 0 : NB), "agent 1: %d of %d steps differ from its twin, %d shared",
          differ + d, GEN + 1, tu.shared);
    /* what agent 1 holds of the base: a global block of each span; of the
     * local group only the spans that end after (length - W) */
    block_list b1;
    list_blocks(r.pool, bk, nbb, &b1);
    int bad = 0;
    for (int i = 0; i < nbb; i++) {
        int live = (i + 1) * ST > n1 - W;
        bad += b1.b[0][i] != b0.b[0][i] || b1.b[1][i] != b0.b[1][i] || b1.refs[0][i] != b0.refs[0][i] + 1 ||
               b1.refs[1][i] != b0.refs[1][i] + live;
    }
    CHECK(bad == 0 && n1 - W > NB, "%d of the base's spans: blocks or references not as expected after %d positions",
          bad, n1);

    /* agent 2 on the same base: its own tokens only */
    int n2 = NB + NA;
    ak_kv *t2 = twin_of(t, m, c, tp, h2, n2, lt);
    if (!t2 || turn_on_base(t, &r, c, "a2", h2, n2, la, &tu) < 0) goto out_twins;
    differ = memcmp(la, lt, sizeof(float) * V) != 0;
    d = step_both(t, &ls, r.ag, "a2", t2, h2, &n2, GEN / 2);
    REQUIRE(d >= 0 && ak_agent_end(r.ag, "a2", &err) == 0, "end: %s", err.msg);
    CHECK(differ + d == 0, "agent 2: %d of %d steps differ from its twin", differ + d, GEN / 2 + 1);
    float *after = dump(m, bk, NB);
    CHECK(after && memcmp(before, after, sizeof(float) * (size_t)m->spec.n_layer * NB * (size_t)m->spec.n_head_kv *
                                             (size_t)(m->spec.head_dim_k + m->spec.head_dim_v)) == 0,
          "the base's vectors changed");
    free(after);
    REQUIRE(ak_agents_flush(r.ag, &err) == 0, "flush: %s", err.msg);
    snprintf(path, sizeof path, "%s/a1.safetensors", dir);
    char *hdr = file_header(path);
    CHECK(hdr && strstr(hdr, "\"format_version\":\"7\"") && strstr(hdr, "\"window_first\"") &&
              strstr(hdr, "\"base_len\":\"40\""),
          "agent 1's file: version 7 with a base of %d", NB);
    free(hdr);
    rig_close(&r);
    memset(&r, 0, sizeof r);

    /* a fresh process: agent 1 restored warm (its base from the store),
     * one more prompt token, then steps, as its twin */
    REQUIRE(rig_open(&r, m, dir, mem, &err) == 0, "reopen: %s", err.msg);
    {
        ak_kv *kv;
        h1[n1] = 77;
        int n = n1 + 1;
        int rc = mem ? ak_agent_open(r.ag, &(ak_turn_opts){.id = "a1", .tokens = h1, .n = n, .n_reserve = n,
                                     .at = (int[]){0}, .len = (int[]){NB}, .k = 1}, &kv, &tu, &err)
                     : ak_agent_open(r.ag, &(ak_turn_opts){.id = "a1", .pool_id = "doc", .tokens = h1, .n = n,
                                     .n_reserve = n}, &kv, &tu, &err);
        REQUIRE(rc == 0, "reopen a1: %s", err.msg);
        CHECK(tu.tier == AK_TIER_WARM && tu.reused == n1, "a1 came back %s reusing %d of %d", ak_tier_name(tu.tier),
              tu.reused, n1);
        REQUIRE(ak_eval(c, kv, &(ak_eval_args){.tokens = h1 + tu.reused, .n = n - tu.reused, .pos0 = tu.reused,
                        .logits = la}, &err) == 0 && ak_agent_commit(r.ag, "a1", h1, n, &err) == 0 &&
                ak_eval(c, t1, &(ak_eval_args){.tokens = h1 + n1, .n = 1, .pos0 = n1, .logits = lt}, &err) == 0,
                "restored turn: %s", err.msg);
        n1 = n;
        differ = memcmp(la, lt, sizeof(float) * V) != 0;
        d = step_both(t, &ls, r.ag, "a1", t1, h1, &n1, GEN / 2);
        REQUIRE(d >= 0 && ak_agent_end(r.ag, "a1", &err) == 0, "end: %s", err.msg);
        CHECK(differ + d == 0, "restored agent 1: %d of %d steps differ from its twin", differ + d, GEN / 2 + 1);
    }
    printf("    gemma3 on a %s of %d positions: agents of %d and %d positions equal their twins\n",
           mem ? "memory" : "pool", NB, n1, n2);
out_twins:
    ak_kv_free(t2);
out_dump:
    ak_kv_free(t1);
    free(before);
out:
    rig_close(&r);
    free(la); free(lt);
    ak_block_pool_free(tp);
    ak_ctx_free(c);
    ak_model_free(m);
}

TEST(gemma3_window_agents_on_a_pool) { check_shared_base(t, 0); }

TEST(gemma3_window_agents_on_a_memory) { check_shared_base(t, 1); }

/* Bytes one position of one layer takes in formats fk/fv (all KV heads). */
static size_t pos_bytes(const ak_model *m, ak_kv_format fk, ak_kv_format fv) {
    int dk = m->spec.head_dim_k, dv = m->spec.head_dim_v;
    return (size_t)m->cfg.n_head_kv * (ak_kv_format_code_bytes(fk, dk) + ak_kv_format_meta_bytes(fk, dk) +
                                       ak_kv_format_code_bytes(fv, dv) + ak_kv_format_meta_bytes(fv, dv));
}

/* A copy of the agent file at path (path + ".bad") whose window_first
 * names the block boundary T positions earlier: the local tensors' shapes
 * then disagree with it. Returns 0, or -1 having failed the test. */
static int window_first_moved(ak_test_ctx *t, const char *path, int wf, int T) {
    char bad[800], from[40], to[40];
    size_t len;
    ak_error err = {{0}};
    char *img = ak_read_file(path, &len, &err);
    int nf = snprintf(from, sizeof from, "\"window_first\":\"%d\"", wf);
    int nt = snprintf(to, sizeof to, "\"window_first\":\"%d\"", wf - T);
    char *at = img ? memmem(img, len < 65536 ? len : 65536, from, (size_t)nf) : NULL;
    if (!at || nf != nt || wf - T <= 0) {
        ak_test_fail(t, __FILE__, __LINE__, "window_first %d not found in %s", wf, path);
        free(img);
        return -1;
    }
    memcpy(at, to, (size_t)nt);
    snprintf(bad, sizeof bad, "%s.bad", path);
    FILE *f = fopen(bad, "wb");
    int ok = f && fwrite(img, 1, len, f) == len;
    if (f) fclose(f);
    free(img);
    if (!ok) ak_test_fail(t, __FILE__, __LINE__, "write %s", bad);
    return ok ? 0 : -1;
}

/* Version 7 files, without and with a base, read by the independent
 * Python reader (tests/check_safetensors.py). */
TEST(gemma3_window_files_pass_python_checker) {
    ak_model *m = load_gemma3(t);
    if (!m) return;
    ak_error err = {{0}};
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/window-python", test_tmp_dir());
    rig r;
    ak_ctx *c = ak_ctx_new(m, 64, 2, &err);
    static int32_t toks[SCTX];
    for (int i = 0; i < 100; i++) toks[i] = 9 + (i * 277) % 11000;
    REQUIRE(c && rig_open(&r, m, dir, 0, &err) == 0, "setup: %s", err.msg);
    const ak_kv *bk;
    ak_turn tu;
    float *la = malloc(sizeof(float) * m->cfg.vocab);
    REQUIRE(la && make_base(t, &r, c, toks, &bk) == 0, "pool");
    /* "plain": no base, 72 positions; "based": the pool, then 60 of its own */
    if (turn_on_base(t, &r, c, "based", toks, 100, la, &tu) < 0) goto out;
    REQUIRE(ak_agent_end(r.ag, "based", &err) == 0, "end: %s", err.msg);
    REQUIRE(ak_agent_begin(r.ag, c, "plain", toks + 20, 72, la, &tu, &err) == 0 &&
                ak_agent_end(r.ag, "plain", &err) == 0 && ak_agents_flush(r.ag, &err) == 0,
            "plain: %s", err.msg);
    /* both read by the checker; a copy of the based one whose window_first
     * is the end of the span before the last one released is not (its
     * window_first: the end of the last span wholly before length - W) */
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "timeout -k 5 60 python3 tests/check_safetensors.py %s/plain.safetensors "
             "%s/based.safetensors >/dev/null", dir, dir);
    CHECK(system(cmd) == 0, "check_safetensors.py rejects a version 7 file");
    snprintf(path, sizeof path, "%s/based.safetensors", dir);
    if (window_first_moved(t, path, NB + (100 - 16 - NB) / ST * ST, ST) == 0) {
        snprintf(cmd, sizeof cmd, "timeout -k 5 60 python3 tests/check_safetensors.py %s.bad >/dev/null 2>&1", path);
        CHECK(system(cmd) != 0, "check_safetensors.py accepts a file whose window_first disagrees with its tensors");
    }
out:
    free(la);
    rig_close(&r);
    ak_ctx_free(c);
    ak_model_free(m);
}

/* Prefix-shared (content-index) blocks with sliding-window layers: agent
 * q2 whose prompt starts with what agent q1 computed links q1's blocks
 * (the global group's of every span, the local group's only for the spans
 * its window shows: those before are linked as released) and then equals
 * its twin bit for bit; q1 goes on after q2 as its own twin (its blocks
 * were not changed). */
TEST(gemma3_window_prefix_shared_blocks) {
    ak_model *m = load_gemma3(t);
    if (!m) return;
    ak_error err = {{0}};
    const int V = m->cfg.vocab, W = m->cfg.window, NP = 64;
    ak_block_pool *pool = ak_block_pool_new(&m->spec, ST, 0, &err), *tp = ak_block_pool_new(&m->spec, ST, 0, &err);
    ak_agents_config cfg = {.model = m, .pool = pool, .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = SCTX,
                            .save = AK_SAVE_EVERY_TURN};
    ak_agents *ag = pool ? ak_agents_new(&cfg, &err) : NULL;
    ak_ctx *c = ak_ctx_new(m, 64, 2, &err);
    float *la = malloc(sizeof(float) * V), *lt = malloc(sizeof(float) * V);
    static int32_t h1[SCTX], h2[SCTX];
    REQUIRE(ag && tp && c && la && lt, "setup: %s", err.msg);
    const lockstep ls = {.c = c, .la = la, .lt = lt, .vocab = V};
    for (int i = 0; i < NP; i++) h1[i] = h2[i] = 4 + (i * 431) % 13000;
    for (int i = 0; i < 6; i++) h2[NP + i] = 17 + i * 5;
    ak_turn tu;
    int n1 = NP, n2 = NP + 6;
    ak_kv *t1 = twin_of(t, m, c, tp, h1, n1, lt);
    REQUIRE(t1 && ak_agent_begin(ag, c, "q1", h1, n1, la, &tu, &err) == 0 && ak_agent_end(ag, "q1", &err) == 0,
            "q1: %s", err.msg);
    int differ = memcmp(la, lt, sizeof(float) * V) != 0;
    ak_block_pool_stats s0, s1;
    ak_block_pool_get_stats(pool, &s0);
    ak_kv *t2 = twin_of(t, m, c, tp, h2, n2, lt);
    REQUIRE(t2 && ak_agent_begin(ag, c, "q2", h2, n2, la, &tu, &err) == 0, "q2: %s", err.msg);
    ak_block_pool_get_stats(pool, &s1);
    /* linked: q1's spans below NP (whole blocks before the last prompt
     * token); computed: the rest of the prompt, in fresh blocks of both
     * groups (one span: NP is a block boundary, NP + 6 within it) */
    size_t pb = pos_bytes(m, AK_KV_F16, AK_KV_F16) * ST;
    CHECK(tu.shared == NP && tu.reused == NP && s1.used - s0.used == (size_t)m->cfg.n_layer * pb,
          "q2 linked %d positions (reused %d), its pool grew by %zu bytes (expected %d and %zu)", tu.shared, tu.reused,
          s1.used - s0.used, NP, (size_t)m->cfg.n_layer * pb);
    differ += memcmp(la, lt, sizeof(float) * V) != 0;
    int d = step_both(t, &ls, ag, "q2", t2, h2, &n2, 30);
    REQUIRE(d >= 0 && ak_agent_end(ag, "q2", &err) == 0, "end: %s", err.msg);
    differ += d;
    /* q1 goes on: its blocks are what it computed */
    h1[n1] = 99;
    REQUIRE(ak_agent_begin(ag, c, "q1", h1, n1 + 1, la, &tu, &err) == 0 &&
                ak_eval(c, t1, &(ak_eval_args){.tokens = h1 + n1, .n = 1, .pos0 = n1, .logits = lt}, &err) == 0,
            "q1 again: %s", err.msg);
    n1++;
    differ += memcmp(la, lt, sizeof(float) * V) != 0;
    d = step_both(t, &ls, ag, "q1", t1, h1, &n1, 30);
    REQUIRE(d >= 0 && ak_agent_end(ag, "q1", &err) == 0, "end: %s", err.msg);
    differ += d;
    CHECK(differ == 0 && n2 - W > NP, "%d steps of q1 and q2 differ from their twins", differ);
    ak_kv_free(t1);
    ak_kv_free(t2);
    free(la); free(lt);
    ak_ctx_free(c);
    ak_agents_free(ag);
    ak_block_pool_free(pool); ak_block_pool_free(tp);
    ak_model_free(m);
}

/* Admission estimates with sliding-window layers: ak_agents_bytes_for
 * counts every span's global block and, of the local group, at most the
 * ceil(W / T) + 1 blocks a window of W positions touches; a long agent
 * never holds more than that after its turns. */
TEST(gemma3_window_bytes_for) {
    ak_model *m = load_gemma3(t);
    if (!m) return;
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&m->spec, ST, 0, &err);
    ak_agents_config cfg = {.model = m, .pool = pool, .fk = AK_KV_F16, .fv = AK_KV_Q8, .n_ctx = SCTX,
                            .save = AK_SAVE_EVERY_TURN};
    ak_agents *ag = pool ? ak_agents_new(&cfg, &err) : NULL;
    ak_ctx *c = ak_ctx_new(m, 64, 2, &err);
    REQUIRE(ag && c, "setup: %s", err.msg);
    int nloc = 0;
    for (int l = 0; l < m->cfg.n_layer; l++) nloc += m->layers[l].window > 0;
    const size_t pb = pos_bytes(m, AK_KV_F16, AK_KV_Q8) * ST;   /* one layer's share of a block */
    const int nglob = m->cfg.n_layer - nloc;
    /* window 16 in blocks of 8: 2 + 1 local blocks at most */
    struct { int n; int global, local; } want[] = {
        {.n = 1, .global = 1, .local = 1},   {.n = 8, .global = 1, .local = 1},   {.n = 9, .global = 2, .local = 2},
        {.n = 24, .global = 3, .local = 3},  {.n = 25, .global = 4, .local = 3},  {.n = 200, .global = 25, .local = 3},
    };
    for (size_t k = 0; k < sizeof want / sizeof *want; k++) {
        size_t e = (size_t)want[k].global * nglob * pb + (size_t)want[k].local * nloc * pb;
        CHECK(ak_agents_bytes_for(ag, want[k].n) == e, "%d positions: %zu bytes, expected %zu", want[k].n,
              ak_agents_bytes_for(ag, want[k].n), e);
    }
    static int32_t toks[SCTX];
    for (int i = 0; i < 150; i++) toks[i] = 13 + (i * 59) % 10000;
    float *la = malloc(sizeof(float) * m->cfg.vocab);
    ak_turn tu;
    REQUIRE(la && ak_agent_begin(ag, c, "long", toks, 150, la, &tu, &err) == 0 && ak_agent_end(ag, "long", &err) == 0,
            "turn: %s", err.msg);
    ak_block_pool_stats st;
    ak_block_pool_get_stats(pool, &st);
    CHECK(st.used <= ak_agents_bytes_for(ag, 150) && st.used == (size_t)19 * nglob * pb + (size_t)3 * nloc * pb,
          "an agent of 150 positions holds %zu bytes, the estimate %zu", st.used, ak_agents_bytes_for(ag, 150));
    free(la);
    ak_ctx_free(c);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_model_free(m);
}

/* What the shared-base calls refuse by code (AK_ERR_INVALID, nothing
 * changed): a segment whose local block is missing, a linked span of
 * the wrong group, a span linked as released after a held one; and what
 * they accept: a span linked as released on an empty sequence (its local
 * layers then start after it). */
TEST(gemma3_window_shared_refusals_by_code) {
    ak_model *m = load_gemma3(t);
    if (!m) return;
    ak_error err = {{0}};
    ak_block_pool *p = ak_block_pool_new(&m->spec, ST, 0, &err);
    REQUIRE(p, "pool: %s", err.msg);
    ak_block_pool_set_window_release(p, 1);
    ak_kv *kv = ak_kv_new(p, AK_KV_F16, AK_KV_F16, 128, &err), *e = ak_kv_new(p, AK_KV_F16, AK_KV_F16, 128, &err);
    ak_ctx *c = ak_ctx_new(m, 64, 2, &err);
    int32_t toks[48];
    for (int i = 0; i < 48; i++) toks[i] = 21 + i * 89;
    REQUIRE(kv && e && c && ak_eval(c, kv, &(ak_eval_args){.tokens = toks, .n = 48}, &err) == 0,
            "prefill: %s", err.msg);
    REQUIRE(ak_kv_window_first(kv) == 32 && !ak_kv_local_span(kv, 0) && ak_kv_local_span(kv, 5),
            "local layers from %d", ak_kv_window_first(kv));
    ak_block *g0 = ak_kv_span(kv, 0, NULL, NULL), *g5 = ak_kv_span(kv, 5, NULL, NULL), *l5 = ak_kv_local_span(kv, 5);
    ak_block *none = NULL;
    err.code = 0;
    CHECK(ak_kv_append_groups(e, &g0, &none, 1, ST, &err) < 0 && err.code == AK_ERR_INVALID && ak_kv_length(e) == 0 &&
              ak_kv_n_blocks(e) == 0,
          "a segment without its local block: code %d", err.code);
    err.code = 0;
    CHECK(ak_kv_append_groups(e, &g5, NULL, 1, ST, &err) < 0 && err.code == AK_ERR_INVALID && ak_kv_length(e) == 0,
          "a segment of one group: code %d", err.code);
    err.code = 0;
    CHECK(ak_kv_append_groups(e, &l5, &g5, 1, ST, &err) < 0 && err.code == AK_ERR_INVALID && ak_kv_length(e) == 0,
          "a segment's groups swapped: code %d", err.code);
    err.code = 0;
    CHECK(ak_kv_link_groups(e, l5, l5, &err) < 0 && err.code == AK_ERR_INVALID && ak_kv_length(e) == 0,
          "a local block linked as the global one: code %d", err.code);
    /* empty: span 0 linked as released, then span 1 with its local block;
     * then a span without one after a held one is refused */
    int refs = ak_block_refcount(p, g5);
    CHECK(ak_kv_link_groups(e, g0, NULL, &err) == 0 && ak_kv_length(e) == ST && ak_kv_window_first(e) == ST &&
              ak_kv_link_groups(e, g5, l5, &err) == 0 && ak_kv_length(e) == 2 * ST &&
              ak_block_refcount(p, g5) == refs + 1 && ak_kv_group_blocks(e, 1) == 1,
          "linking: %s (length %d, local from %d)", err.msg, ak_kv_length(e), ak_kv_window_first(e));
    err.code = 0;
    CHECK(ak_kv_link_groups(e, g5, NULL, &err) < 0 && err.code == AK_ERR_INVALID && ak_kv_length(e) == 2 * ST,
          "a span linked as released after a held one: code %d", err.code);
    ak_kv_free(e);
    CHECK(ak_block_refcount(p, g5) == refs, "references after the sequence went: %d, expected %d",
          ak_block_refcount(p, g5), refs);
    ak_kv_free(kv);
    ak_ctx_free(c);
    ak_block_pool_free(p);
    ak_model_free(m);
}

/* A memory placed by the blending methods (cacheblend, agentkvshift) in a
 * gemma3 agent whose prefix and chunk are longer than the window: the
 * placement reads every chunk position of the check layer (a local one)
 * after recomputing some of them through the layers up to it (a pass
 * releases only once it went through the last layer); the logits are
 * those of ak_reuse_prefill on a plain sequence keeping every block
 * (close: the agent's own positions after the frozen chunk start a fresh
 * block, so the online softmax groups blocks differently) with the same
 * recomputed count. */
TEST(gemma3_window_memory_blended) {
    ak_model *m = load_gemma3(t);
    if (!m) return;
    ak_error err = {{0}};
    const int V = m->cfg.vocab, NP = 30, NX = 40, NQ = 6, n = NP + NX + NQ;
    ak_block_pool *pool = ak_block_pool_new(&m->spec, ST, 0, &err), *tp = ak_block_pool_new(&m->spec, ST, 0, &err);
    ak_agents_config cfg = {.model = m, .pool = pool, .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = SCTX,
                            .save = AK_SAVE_EVERY_TURN};
    ak_agents *ag = pool ? ak_agents_new(&cfg, &err) : NULL;
    ak_ctx *c = ak_ctx_new(m, 64, 2, &err);
    float *la = malloc(sizeof(float) * V), *lr = malloc(sizeof(float) * V);
    int32_t all[30 + 40 + 6];
    for (int i = 0; i < n; i++) all[i] = 6 + (i * 263) % 12000;
    REQUIRE(ag && tp && c && la && lr &&
                ak_memory_add(ag, c, &(ak_memory_request){.id = "mx", .text = "x", .tokens = all + NP, .n = NX,
                              .fk = AK_KV_F16, .fv = AK_KV_F16}, NULL, &err) == 0,
            "setup: %s", err.msg);
    ak_kv *chunk = ak_kv_new(tp, AK_KV_F16, AK_KV_F16, SCTX, &err);
    REQUIRE(chunk && ak_eval(c, chunk, &(ak_eval_args){.tokens = all + NP, .n = NX}, &err) == 0, "chunk: %s", err.msg);
    const ak_reuse_params ps[2] = {{.method = AK_REUSE_CACHEBLEND, .ratio = 0.2f, .check_layer = -1},
                                   {.method = AK_REUSE_AGENTKVSHIFT, .ratio = 0.2f, .check_layer = -1}};
    const char *ids[2] = {"blend", "shift"};
    for (int k = 0; k < 2; k++) {
        ak_kv *kv, *ref = ak_kv_new(tp, AK_KV_F16, AK_KV_F16, SCTX, &err);
        ak_turn tu;
        ak_reuse_stats sa, sr;
        int at = NP, len = NX;
        ak_reuse_part parts[3] = {{.tokens = all, .n = NP, .chunk = NULL},
                                  {.tokens = all + NP, .n = NX, .chunk = chunk},
        {.tokens = all + NP + NX, .n = NQ, .chunk = NULL}};
        REQUIRE(ref && ak_reuse_prefill(c, ref, parts, 3, &ps[k], lr, &sr, &err) == 0, "reference: %s", err.msg);
        int rc = ak_agent_open(ag, &(ak_turn_opts){.id = ids[k], .tokens = all, .n = n, .n_reserve = n, .at = &at,
                               .len = &len, .k = 1}, &kv, &tu, &err);
        if (rc == 0) rc = ak_eval(c, kv, &(ak_eval_args){.tokens = all, .n = NP}, &err);
        if (rc == 0) rc = ak_agent_reuse_memory(ag, c, &(ak_place_opts){.id = ids[k], .mem_id = "mx", .tokens = all,
                                                .at = NP}, &ps[k], &kv, &sa, &err);
        if (rc == 0) rc = ak_eval(c, kv, &(ak_eval_args){.tokens = all + NP + NX, .n = NQ, .pos0 = NP + NX,
                                  .logits = la}, &err);
        if (rc == 0) rc = ak_agent_commit(ag, ids[k], all, n, &err);
        if (rc == 0) rc = ak_agent_end(ag, ids[k], &err);
        CHECK(rc == 0, "%s: %s (code %d)", ids[k], err.msg, err.code);
        double md = 0;
        for (int i = 0; rc == 0 && i < V; i++) md = fabs(la[i] - lr[i]) > md ? fabs(la[i] - lr[i]) : md;
        CHECK(rc == 0 && sa.n_recomputed == sr.n_recomputed && sa.n_recomputed == 8 && md < 1e-3 &&
                  ak_argmax(la, V) == ak_argmax(lr, V),
              "%s: recomputed %d (reference %d), logits differ by %g", ids[k], sa.n_recomputed, sr.n_recomputed, md);
        ak_kv_free(ref);
    }
    ak_kv_free(chunk);
    free(la); free(lr);
    ak_ctx_free(c);
    ak_agents_free(ag);
    ak_block_pool_free(pool); ak_block_pool_free(tp);
    ak_model_free(m);
}
