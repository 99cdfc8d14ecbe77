/* test_agent.c - agents over the block pool and the store: token-level
 * prefix matching, tiers, exact restores, eviction under a RAM budget, and
 * recovery from bad files. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include "agents/agent.h"
#include "text/sampler.h"
#include "engine/synth.h"
#include "text/tokenizer.h"
#include "test.h"
#include "agent_turn.h"

typedef struct {
    ak_model *m;
    ak_ctx *ctx;
    float *logits;
} env;

static int env_open(ak_test_ctx *t, env *e, const char *path) {
    ak_error err = {{0}};
    memset(e, 0, sizeof *e);
    e->m = ak_model_load(path, NULL, NULL, &err);
    e->ctx = e->m ? ak_ctx_new(e->m, 64, 2, &err) : NULL;
    e->logits = e->m ? malloc(sizeof(float) * e->m->cfg.vocab) : NULL;
    if (!e->ctx || !e->logits) { ak_test_fail(t, __FILE__, __LINE__, "%s: %s", path, err.msg); return -1; }
    return 0;
}

static void env_close(env *e) {
    ak_ctx_free(e->ctx);
    ak_model_free(e->m);
    free(e->logits);
}

static const char *mem_dir(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", test_tmp_dir(), name);
    return buf;
}

static ak_agents *agents_for(env *e, ak_block_pool **pool, ak_store *store, ak_kv_format fk, ak_kv_format fv,
                             size_t budget) {
    ak_error err = {{0}};
    *pool = ak_block_pool_new(&e->m->spec, 0, budget, &err);
    ak_agents_config c = {.model = e->m, .pool = *pool, .store = store, .fk = fk, .fv = fv, .n_ctx = 512, .save = AK_SAVE_EVERY_TURN};
    return *pool ? ak_agents_new(&c, &err) : NULL;
}

/* A greedy turn (agent_turn.h) on e. */
static int turn(ak_test_ctx *t, env *e, ak_agents *ag, turn_req r) {
    return greedy_turn(t, e->ctx, e->logits, e->m->cfg.vocab, ag, r);
}

/* Greedy tokens from a fresh cache, prompt prefilled in one go. */
static void reprefill(env *e, ak_kv_format fk, ak_kv_format fv, const int32_t *prompt, int n, int n_gen, int32_t *out) {
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

TEST(agent_prefix_matching) {
    env e;
    char path[512];
    if (env_open(t, &e, test_path(path, sizeof path, "models/stories260K.gguf")) < 0) return;
    ak_block_pool *pool;
    ak_agents *ag = agents_for(&e, &pool, NULL, AK_KV_F16, AK_KV_F16, 0);
    REQUIRE(ag, "agents");
    int32_t p[64], g[16];
    for (int i = 0; i < 64; i++) p[i] = 1 + (i * 13) % 500;
    ak_turn ti;
    REQUIRE(turn(t, &e, ag, (turn_req){.id = "a", .prompt = p, .n = 20, .n_gen = 4, .out = g, .info = &ti}) == 0,
            "turn 1");
    CHECK(ti.match == AK_MATCH_NEW && ti.tier == AK_TIER_COLD && ti.reused == 0 && ti.prefilled == 20,
          "new: %s/%s reused %d prefilled %d", ak_match_name(ti.match), ak_tier_name(ti.tier), ti.reused, ti.prefilled);
    /* the cache now holds p[0..20) + g[0..3): extend with those and 5 more */
    int32_t q[64];
    memcpy(q, p, 20 * sizeof(int32_t));
    memcpy(q + 20, g, 3 * sizeof(int32_t));
    for (int i = 23; i < 28; i++) q[i] = 7 + i;
    REQUIRE(turn(t, &e, ag, (turn_req){.id = "a", .prompt = q, .n = 28, .n_gen = 2, .out = g, .info = &ti}) == 0,
            "turn 2");
    CHECK(ti.match == AK_MATCH_EXTEND && ti.tier == AK_TIER_HOT && ti.reused == 23 && ti.prefilled == 5,
          "extend: %s/%s reused %d prefilled %d", ak_match_name(ti.match), ak_tier_name(ti.tier), ti.reused,
          ti.prefilled);
    /* history is q[0..28) + g[0]: the same prompt again is EXACT */
    q[28] = g[0];
    REQUIRE(turn(t, &e, ag, (turn_req){.id = "a", .prompt = q, .n = 29, .n_gen = 1, .out = g, .info = &ti}) == 0,
            "turn 3");
    CHECK(ti.match == AK_MATCH_EXACT && ti.reused == 28 && ti.prefilled == 1, "exact: %s reused %d prefilled %d",
          ak_match_name(ti.match), ti.reused, ti.prefilled);
    /* change token 10: DIVERGE keeps 10 */
    q[10] ^= 1;
    REQUIRE(turn(t, &e, ag, (turn_req){.id = "a", .prompt = q, .n = 29, .n_gen = 1, .out = g, .info = &ti}) == 0,
            "turn 4");
    CHECK(ti.match == AK_MATCH_DIVERGE && ti.reused == 10 && ti.prefilled == 19, "diverge: %s reused %d prefilled %d",
          ak_match_name(ti.match), ti.reused, ti.prefilled);
    /* a second agent never sees the first one's cache */
    REQUIRE(turn(t, &e, ag, (turn_req){.id = "b", .prompt = q, .n = 29, .n_gen = 1, .out = g, .info = &ti}) == 0,
            "agent b");
    CHECK(ti.match == AK_MATCH_NEW && ti.reused == 0, "agent b reused %d tokens of agent a", ti.reused);
    ak_error err = {{0}};
    CHECK(ak_agent_begin(ag, e.ctx, "../etc", q, 5, e.logits, &ti, &err) < 0 && strstr(err.msg, "invalid agent id"),
          "hostile id accepted: %s", err.msg);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    env_close(&e);
}

/* Generation after a warm restore == from the hot cache == after a full
 * re-prefill, token for token, for several cache formats. */
static void check_restore_exact(ak_test_ctx *t, const char *model_path, const char *dirname) {
    env e;
    if (env_open(t, &e, model_path) < 0) return;
    const ak_kv_format fmts[][2] = {{AK_KV_F16, AK_KV_F16}, {AK_KV_Q8, AK_KV_TQ3}, {AK_KV_Q4, AK_KV_Q4},
                                    {AK_KV_F32, AK_KV_F32}};
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
        ak_error err = {{0}};
        char d[64];
        snprintf(d, sizeof d, "%s-%zu", dirname, fi);
        ak_store *store = ak_store_open(mem_dir(d), NULL, &err);
        REQUIRE(store, "%s", err.msg);
        int32_t p[128], g1[12], g2[12], g3[12], g4[12];
        for (int i = 0; i < 40; i++) p[i] = 1 + (i * 31 + 7) % (e.m->cfg.vocab - 1);
        ak_turn ti;
        ak_block_pool *pool1, *pool2;
        ak_agents *hot = agents_for(&e, &pool1, store, fmts[fi][0], fmts[fi][1], 0);
        REQUIRE(hot && turn(t, &e, hot, (turn_req){.id = "x", .prompt = p, .n = 40, .n_gen = 12, .out = g1,
                                                   .info = &ti}) == 0, "turn 1");
        /* phase 2 prompt: everything so far plus the last generated token */
        memcpy(p + 40, g1, sizeof g1);
        /* saves are written by a background thread: wait for the file */
        REQUIRE(ak_agents_flush(hot, &err) == 0, "flush: %s", err.msg);
        /* warm: a new pool and agent set (as after a restart) restores the file */
        ak_agents *warm = agents_for(&e, &pool2, store, fmts[fi][0], fmts[fi][1], 0);
        REQUIRE(warm && turn(t, &e, warm, (turn_req){.id = "x", .prompt = p, .n = 52, .n_gen = 12, .out = g2,
                                                     .info = &ti}) == 0, "warm turn");
        CHECK(ti.tier == AK_TIER_WARM && ti.match == AK_MATCH_EXTEND && ti.reused == 51 && ti.prefilled == 1,
              "warm turn: %s/%s reused %d prefilled %d", ak_tier_name(ti.tier), ak_match_name(ti.match), ti.reused,
              ti.prefilled);
        REQUIRE(turn(t, &e, hot, (turn_req){.id = "x", .prompt = p, .n = 52, .n_gen = 12, .out = g3,
                                            .info = &ti}) == 0, "hot turn");
        CHECK(ti.tier == AK_TIER_HOT, "hot turn tier %s", ak_tier_name(ti.tier));
        reprefill(&e, fmts[fi][0], fmts[fi][1], p, 52, 12, g4);
        CHECK(!memcmp(g2, g3, sizeof g2), "K %s / V %s: warm and hot generations differ",
              ak_kv_format_get(fmts[fi][0])->name, ak_kv_format_get(fmts[fi][1])->name);
        CHECK(!memcmp(g2, g4, sizeof g2), "K %s / V %s: warm and re-prefill generations differ",
              ak_kv_format_get(fmts[fi][0])->name, ak_kv_format_get(fmts[fi][1])->name);
        ak_agents_free(hot);
        ak_agents_free(warm);
        ak_block_pool_free(pool1);
        ak_block_pool_free(pool2);
        ak_store_close(store);
    }
    env_close(&e);
}

TEST(agent_restore_is_exact_stories260K) {
    char path[512];
    check_restore_exact(t, test_path(path, sizeof path, "models/stories260K.gguf"), "exact-stories");
}

TEST(agent_restore_is_exact_synthetic) {
    char path[512];
    snprintf(path, sizeof path, "%s/agent-synth.gguf", test_tmp_dir());
    ak_synth_opts o;
    ak_synth_defaults(&o);
    o.path = path; o.dim = 128; o.n_layers = 2; o.n_heads = 4; o.n_kv_heads = 2; o.ffn = 256; o.vocab = 400;
    o.ctx = 1024; o.wtype = GGML_TYPE_Q8_0; o.seed = 5; o.n_threads = 2;
    ak_error err = {{0}};
    REQUIRE(ak_synth_write(&o, &err) == 0, "%s", err.msg);
    check_restore_exact(t, path, "exact-synth");
}

/* The tiers of the turns after each agent's first, and the pool's peak. */
typedef struct {
    int warm, hot, cold;
    size_t peak;
} rr_tally;

/* Round-robin turns of n agents (3 rounds, 33 tokens a turn) under budget.
 * Returns the tally; a failure is recorded in t (the tally is then partial). */
static rr_tally round_robin(ak_test_ctx *t, env *e, ak_store *store, ak_kv_format fmt, size_t budget, int n) {
    rr_tally r = {0};
    ak_block_pool *pool;
    ak_agents *ag = agents_for(e, &pool, store, fmt, fmt, budget);
    if (!ag) { ak_test_fail(t, __FILE__, __LINE__, "agents"); return r; }
    static int32_t hist[24][128];
    int32_t gen[4];
    int len[24] = {0};
    for (int round = 0; round < 3; round++)
        for (int a = 0; a < n; a++) {
            char id[32];
            snprintf(id, sizeof id, "agent%d", a);
            for (int i = 0; i < 30; i++) hist[a][len[a] + i] = 5 + (a * 97 + (len[a] + i) * 13) % 4000;
            len[a] += 30;
            ak_turn ti;
            turn_req rq = {.id = id, .prompt = hist[a], .n = len[a], .n_gen = 4, .out = gen, .info = &ti};
            if (turn(t, e, ag, rq) < 0) goto out;
            if (round > 0) {
                r.warm += ti.tier == AK_TIER_WARM;
                r.hot += ti.tier == AK_TIER_HOT;
                r.cold += ti.tier == AK_TIER_COLD;
                CHECK(ti.reused == len[a] - 30, "%s reused %d of %d", id, ti.reused, len[a] - 30);
            }
            memcpy(hist[a] + len[a], gen, 3 * sizeof(int32_t));
            len[a] += 3;
        }
    ak_block_pool_stats st;
    ak_block_pool_get_stats(pool, &st);
    r.peak = st.peak;
out:
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    return r;
}

TEST(agent_capacity_and_eviction_round_robin) {
    env e;
    char path[512];
    if (env_open(t, &e, test_path(path, sizeof path, "models/tiny-llama-h64-gqa-f32.gguf")) < 0) return;
    ak_error err = {{0}};
    ak_store *store = ak_store_open(mem_dir("rr"), NULL, &err);
    REQUIRE(store, "%s", err.msg);
    /* agents end at 99 tokens = 4 blocks of 32; the budget holds 3 of them in f16 */
    ak_block_pool *probe = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    size_t f16_agent = 4 * ak_block_pool_block_bytes(probe, AK_KV_F16, AK_KV_F16);
    size_t budget = 3 * f16_agent + f16_agent / 2;
    int fit[2] = {(int)(budget / (4 * ak_block_pool_block_bytes(probe, AK_KV_Q4, AK_KV_Q4))),
                  (int)(budget / (4 * ak_block_pool_block_bytes(probe, AK_KV_TQ3, AK_KV_TQ3)))};
    ak_block_pool_free(probe);
    const ak_kv_format fmts[2] = {AK_KV_Q4, AK_KV_TQ3};
    for (int fi = 0; fi < 2; fi++) {
        /* as many agents as the budget holds: after their first turn, all hot */
        rr_tally r = round_robin(t, &e, store, fmts[fi], budget, fit[fi] < 24 ? fit[fi] : 24);
        int warm = r.warm, hot = r.hot, cold = r.cold;
        size_t peak = r.peak;
        printf("    budget %zu B (3 agents in f16): %d agents in %s, later turns %d hot %d warm %d cold, peak %zu B\n",
               budget, fit[fi], ak_kv_format_get(fmts[fi])->name, hot, warm, cold, peak);
        CHECK(cold == 0 && warm == 0, "%s: agents that fit were evicted (%d warm, %d cold)",
              ak_kv_format_get(fmts[fi])->name, warm, cold);
        CHECK(peak <= budget, "peak %zu over budget %zu", peak, budget);
        /* more agents than fit: evicted ones come back warm, never cold */
        int more = fit[fi] + 4 < 24 ? fit[fi] + 4 : 24;
        r = round_robin(t, &e, store, fmts[fi], budget, more);
        warm = r.warm, hot = r.hot, cold = r.cold, peak = r.peak;
        printf("    %d agents in %s: later turns %d hot %d warm %d cold, peak %zu B\n", more,
               ak_kv_format_get(fmts[fi])->name, hot, warm, cold, peak);
        CHECK(cold == 0, "%d cold re-prefills after the first turn", cold);
        CHECK(warm > 0, "no agent was evicted and restored");
        CHECK(peak <= budget, "peak %zu over budget %zu", peak, budget);
    }
    CHECK(fit[0] >= 10 && fit[1] >= 15, "the budget of 3 f16 agents holds only %d q4 / %d tq3 agents", fit[0], fit[1]);
    ak_store_close(store);
    env_close(&e);
}

TEST(agent_bad_file_takes_cold_path) {
    env e;
    char path[512];
    if (env_open(t, &e, test_path(path, sizeof path, "models/stories260K.gguf")) < 0) return;
    ak_error err = {{0}};
    ak_store *store = ak_store_open(mem_dir("bad"), NULL, &err);
    REQUIRE(store, "%s", err.msg);
    int32_t p[64], g1[8], g2[8], ref[8];
    for (int i = 0; i < 30; i++) p[i] = 1 + (i * 17) % 500;
    ak_turn ti;
    ak_block_pool *pool1, *pool2;
    ak_agents *a1 = agents_for(&e, &pool1, store, AK_KV_Q8, AK_KV_Q8, 0);
    REQUIRE(a1 && turn(t, &e, a1, (turn_req){.id = "z", .prompt = p, .n = 30, .n_gen = 8, .out = g1,
                                             .info = &ti}) == 0, "turn 1");
    ak_agents_free(a1);
    ak_block_pool_free(pool1);
    /* flip one byte in the middle of the file */
    char fp[600];
    snprintf(fp, sizeof fp, "%s/z.safetensors", mem_dir("bad"));
    FILE *f = fopen(fp, "r+b");
    REQUIRE(f, "no agent file %s", fp);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, sz - 20, SEEK_SET);
    int c = fgetc(f);
    fseek(f, sz - 20, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
    memcpy(p + 30, g1, 7 * sizeof(int32_t));
    ak_agents *a2 = agents_for(&e, &pool2, store, AK_KV_Q8, AK_KV_Q8, 0);
    REQUIRE(a2 && turn(t, &e, a2, (turn_req){.id = "z", .prompt = p, .n = 37, .n_gen = 8, .out = g2,
                                             .info = &ti}) == 0, "turn after corruption");
    CHECK(ti.tier == AK_TIER_COLD && ti.reused == 0 && ti.prefilled == 37, "corrupt file served as %s, reused %d",
          ak_tier_name(ti.tier), ti.reused);
    reprefill(&e, AK_KV_Q8, AK_KV_Q8, p, 37, 8, ref);
    CHECK(!memcmp(g2, ref, sizeof ref), "output after the cold path differs from a re-prefill");
    struct stat st;
    char qd[600];
    snprintf(qd, sizeof qd, "%s/quarantine", mem_dir("bad"));
    CHECK(stat(qd, &st) == 0, "bad file was not moved aside");
    ak_agents_free(a2);
    ak_block_pool_free(pool2);
    ak_store_close(store);
    env_close(&e);
}

/* A turn the KV budget cannot fit reports AK_ERR_KV_BUDGET (the scheduler
 * branches on the code to wait or to answer 400), an invalid id
 * AK_ERR_INVALID, a second open of a busy agent AK_ERR_BUSY. */
TEST(agent_errors_carry_codes) {
    env e;
    char path[512];
    if (env_open(t, &e, test_path(path, sizeof path, "models/stories260K.gguf")) < 0) return;
    ak_error err = {{0}};
    ak_block_pool *probe = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    REQUIRE(probe, "%s", err.msg);
    size_t block = ak_block_pool_block_bytes(probe, AK_KV_Q8, AK_KV_Q8);
    ak_block_pool_free(probe);
    ak_block_pool *pool;
    ak_agents *ag = agents_for(&e, &pool, NULL, AK_KV_Q8, AK_KV_Q8, 2 * block);
    REQUIRE(ag, "agents");
    int32_t p[200];
    for (int i = 0; i < 200; i++) p[i] = 1 + (i * 7) % 300;
    ak_kv *kv;
    ak_turn ti;
    CHECK(ak_agent_open(ag, &(ak_turn_opts){.id = "big", .tokens = p, .n = 200, .n_reserve = 200}, &kv, &ti,
                        &err) < 0 && err.code == AK_ERR_KV_BUDGET,
          "over budget: code %d (%s)", err.code, err.msg);
    CHECK(ak_agent_open(ag, &(ak_turn_opts){.id = "../x", .tokens = p, .n = 10, .n_reserve = 10}, &kv, &ti,
                        &err) < 0 && err.code == AK_ERR_INVALID,
          "invalid id: code %d", err.code);
    REQUIRE(ak_agent_open(ag, &(ak_turn_opts){.id = "a", .tokens = p, .n = 10, .n_reserve = 10}, &kv, &ti, &err) == 0,
            "open: %s", err.msg);
    CHECK(ak_agent_open(ag, &(ak_turn_opts){.id = "a", .tokens = p, .n = 10, .n_reserve = 10}, &kv, &ti,
                        &err) < 0 && err.code == AK_ERR_BUSY,
          "busy: code %d", err.code);
    ak_agent_abort(ag, "a");
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    env_close(&e);
}

/* Waits (up to 10 s) until the writer has counted `n` failed attempts. */
static int wait_failures(ak_agents *ag, uint64_t n) {
    ak_save_stats ss;
    for (int i = 0; i < 1000; i++) {
        ak_agents_save_stats(ag, &ss);
        if (ss.failures >= n) return 0;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

/* A save that fails stays dirty, is retried, and is confirmed once the
 * directory is back: the memory directory disappears (renamed away) during
 * a turn, so the turn's queued save fails; after it returns a flush
 * succeeds and the file holds the turn. */
TEST(agent_failed_save_stays_dirty_and_is_retried) {
    env e;
    char path[512];
    if (env_open(t, &e, test_path(path, sizeof path, "models/stories260K.gguf")) < 0) return;
    char dir[512], away[600], file[700];
    snprintf(dir, sizeof dir, "%s", mem_dir("retry"));
    snprintf(away, sizeof away, "%s.away", dir);
    snprintf(file, sizeof file, "%s/r.safetensors", dir);
    ak_error err = {{0}};
    ak_store *store = ak_store_open(dir, NULL, &err);
    REQUIRE(store, "%s", err.msg);
    ak_block_pool *pool;
    ak_agents *ag = agents_for(&e, &pool, store, AK_KV_Q8, AK_KV_Q8, 0);
    REQUIRE(ag, "agents");
    int32_t p[40], g[4];
    for (int i = 0; i < 30; i++) p[i] = 1 + (i * 11) % 400;
    REQUIRE(rename(dir, away) == 0, "rename");
    ak_turn ti;
    REQUIRE(turn(t, &e, ag, (turn_req){.id = "r", .prompt = p, .n = 30, .n_gen = 4, .out = g, .info = &ti}) == 0,
            "turn");
    CHECK(wait_failures(ag, 1) == 0, "the save did not fail");
    ak_agent_info in;
    REQUIRE(ak_agents_count(ag) == 1, "count");
    ak_agents_get(ag, 0, &in);
    CHECK(in.dirty, "a failed save left the agent clean");
    CHECK(ak_agents_unsaved(ag) == 1, "unsaved %d", ak_agents_unsaved(ag));
    REQUIRE(rename(away, dir) == 0, "rename back");
    CHECK(ak_agents_flush(ag, &err) == 0, "flush after the directory returned: %s", err.msg);
    CHECK(access(file, F_OK) == 0, "no file after the retry");
    ak_agents_get(ag, 0, &in);
    CHECK(!in.dirty && ak_agents_unsaved(ag) == 0, "still dirty after a successful retry");
    ak_save_stats ss;
    ak_agents_save_stats(ag, &ss);
    CHECK(ss.failures >= 1 && ss.saves >= 1 && ss.abandoned == 0, "stats: %llu failures %llu saves %llu abandoned",
          (unsigned long long)ss.failures, (unsigned long long)ss.saves, (unsigned long long)ss.abandoned);
    /* the file holds the whole turn: 30 prompt tokens + 3 appended */
    ak_store_entry en;
    CHECK(ak_store_inspect(store, "r", &en, NULL, &err) == 0 && en.n_tokens == 33, "file has %d tokens: %s",
          en.n_tokens, err.msg);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_store_close(store);
    env_close(&e);
}

static void collect_log(void *ud, const char *line) {
    char *buf = ud;
    size_t l = strlen(buf);
    snprintf(buf + l, 8192 - l, "%s\n", line);
}

/* Saves that keep failing (fault injection: every save's first step fails
 * with ENOSPC): retried a bounded number of times, counted, and the flush
 * fails naming the agent with the disk-full code; the agent stays dirty. */
TEST(agent_save_that_keeps_failing_is_reported) {
    env e;
    char path[512];
    if (env_open(t, &e, test_path(path, sizeof path, "models/stories260K.gguf")) < 0) return;
    ak_error err = {{0}};
    setenv("AK_FAULT_FAIL_AT", "1:ENOSPC", 1);
    ak_store *store = ak_store_open(mem_dir("fail"), NULL, &err);
    unsetenv("AK_FAULT_FAIL_AT");
    REQUIRE(store, "%s", err.msg);
    static char log[8192];
    log[0] = 0;
    ak_block_pool *pool = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    ak_agents_config c = {.model = e.m, .pool = pool, .store = store, .fk = AK_KV_Q8, .fv = AK_KV_Q8, .n_ctx = 512, .save = AK_SAVE_EVERY_TURN, .log = collect_log, .log_ud = log};
    ak_agents *ag = pool ? ak_agents_new(&c, &err) : NULL;
    REQUIRE(ag, "agents: %s", err.msg);
    int32_t p[40], g[4];
    for (int i = 0; i < 30; i++) p[i] = 1 + (i * 13) % 400;
    ak_turn ti;
    REQUIRE(turn(t, &e, ag, (turn_req){.id = "doomed", .prompt = p, .n = 30, .n_gen = 4, .out = g,
                                       .info = &ti}) == 0, "turn");
    err = (ak_error){{0}};
    CHECK(ak_agents_flush(ag, &err) < 0, "flush reported success after failed saves");
    CHECK(strstr(err.msg, "doomed") && err.code == AK_ERR_NOSPACE, "flush error (code %d): %s", err.code, err.msg);
    ak_agent_info in;
    ak_agents_get(ag, 0, &in);
    CHECK(in.dirty && in.save_failed && strstr(in.save_error, "No space left"), "agent: dirty %d failed %d (%s)",
          in.dirty, in.save_failed, in.save_error);
    ak_save_stats ss;
    ak_agents_save_stats(ag, &ss);
    CHECK(ss.failures >= 2 && ss.failures <= 20 && ss.abandoned >= 1 && ss.saves == 0,
          "retries not bounded or not counted: %llu failures, %llu abandoned", (unsigned long long)ss.failures,
          (unsigned long long)ss.abandoned);
    ak_agents_free(ag);
    CHECK(strstr(log, "doomed") && strstr(log, "NOT saved"), "shutdown did not name the unsaved agent:\n%s", log);
    ak_block_pool_free(pool);
    ak_store_close(store);
    env_close(&e);
}

/* The disk budget still holds with gc moved to the writer thread: after
 * turns of three agents whose files each take most of the budget, only the
 * most recently saved file is left; and a smaller budget holds as soon as
 * the agents object exists. */
TEST(agent_disk_budget_applied_after_saves) {
    env e;
    char path[512];
    if (env_open(t, &e, test_path(path, sizeof path, "models/stories260K.gguf")) < 0) return;
    ak_error err = {{0}};
    ak_store *store = ak_store_open(mem_dir("budget"), NULL, &err);
    REQUIRE(store, "%s", err.msg);
    ak_block_pool *pool = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    REQUIRE(pool, "%s", err.msg);
    int32_t p[40], g[4];
    for (int i = 0; i < 30; i++) p[i] = 1 + (i * 5) % 400;
    /* the size of one agent's file, from a first agents object without a budget */
    ak_agents_config c = {.model = e.m, .pool = pool, .store = store, .fk = AK_KV_Q8, .fv = AK_KV_Q8, .n_ctx = 512, .save = AK_SAVE_EVERY_TURN};
    ak_agents *ag = ak_agents_new(&c, &err);
    ak_turn ti;
    REQUIRE(ag && turn(t, &e, ag, (turn_req){.id = "probe", .prompt = p, .n = 30, .n_gen = 4, .out = g,
                                             .info = &ti}) == 0 && ak_agents_flush(ag, &err) == 0,
            "probe: %s", err.msg);
    ak_agents_free(ag);
    ak_store_entry en;
    REQUIRE(ak_store_lookup(store, "probe", &en) == 0 && en.bytes > 0, "no probe file");
    REQUIRE(ak_store_remove(store, "probe", &err) == 0, "remove");
    c.disk_budget = en.bytes + en.bytes / 2;
    ag = ak_agents_new(&c, &err);
    REQUIRE(ag, "%s", err.msg);
    const char *ids[3] = {"b0", "b1", "b2"};
    for (int i = 0; i < 3; i++) {
        REQUIRE(turn(t, &e, ag, (turn_req){.id = ids[i], .prompt = p, .n = 30, .n_gen = 4, .out = g,
                                           .info = &ti}) == 0, "turn");
        REQUIRE(ak_agents_flush(ag, &err) == 0, "flush: %s", err.msg);
    }
    ak_store_entry *es;
    int n;
    REQUIRE(ak_store_list(store, &es, &n, &err) == 0, "list");
    CHECK(n == 1 && !strcmp(es[0].id, "b2"), "%d files left (first %s), expected only b2", n, n ? es[0].id : "-");
    free(es);
    char fp[600];
    snprintf(fp, sizeof fp, "%s/b0.safetensors", mem_dir("budget"));
    CHECK(access(fp, F_OK) != 0, "b0's file is still on disk");
    ak_agents_free(ag);
    /* a budget below what is on disk holds from the start, before any save */
    c.disk_budget = en.bytes / 2;
    ag = ak_agents_new(&c, &err);
    REQUIRE(ag, "%s", err.msg);
    REQUIRE(ak_store_list(store, &es, &n, &err) == 0, "list");
    CHECK(n == 0, "%d files left (first %s) under a budget smaller than one file, before any save", n,
          n ? es[0].id : "-");
    free(es);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_store_close(store);
    env_close(&e);
}
