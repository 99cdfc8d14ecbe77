/* cmd_bench_serve.c - agentkv bench serve: the scheduler's two promises,
 * measured in-process (no HTTP in the way):
 *   1. continuous batching: aggregate decode tokens/s of N agents decoding
 *      together vs the same N requests one after another (goal: >= 0.7 N x);
 *   2. restores hidden behind decoding: TTFT (after admission) of a warm
 *      agent whose file the I/O thread loaded while another agent decoded,
 *      vs the same agent restored on demand when admitted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve/sched.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv bench serve -m MODEL [flags]\n"
    "  --agents LIST   batch sizes to measure (default 1,2,4,8)\n"
    "  -p N            prompt tokens per agent (default 32)\n"
    "  -n N            tokens generated per agent (default 64)\n"
    "  --warm-ctx N    tokens of the warm agent in the restore test (default 1024; 0 = skip)\n"
    "  -t N            threads (default: all cores)\n"
    "  --json          one JSON object\n"
    CACHE_OPTS_HELP;

typedef struct {
    loaded_model lm;
    ak_block_pool *pool;
    ak_store *store;
    ak_agents *agents;
    ak_sched *s;
} rig;

/* What a rig runs on: the model, the cache's formats, the memory directory
 * (NULL: none), and the scheduler's sizes. */
typedef struct {
    const loaded_model *lm;
    const cache_opts *co;
    const char *mem;
    int n_ctx, n_threads;
    int max_active, step_tokens;
    int no_prefetch;   /* 1: warm agents restored only when admitted */
} rig_opts;

/* Opens r: a block pool, the store (if o->mem), agents saving every turn and
 * a running scheduler. Returns 0, or -1 with err set (rig_close frees what
 * was opened). */
static int rig_open(rig *r, const rig_opts *o, ak_error *err) {
    const loaded_model *lm = o->lm;
    memset(r, 0, sizeof *r);
    r->lm = *lm;
    if (!(r->pool = ak_block_pool_new(&lm->model->spec, o->co->block_tokens, 0, err))) return -1;
    if (o->mem && !(r->store = ak_store_open(o->mem, NULL, err))) return -1;
    ak_agents_config ac = {.model = lm->model, .pool = r->pool, .store = r->store, .fk = o->co->fk, .fv = o->co->fv,
                           .n_ctx = o->n_ctx, .save = AK_SAVE_EVERY_TURN};
    if (!(r->agents = ak_agents_new(&ac, err))) return -1;
    ak_sched_config sc = {.model = lm->model, .tok = lm->tok, .agents = r->agents, .pool = r->pool, .store = r->store,
                          .n_threads = o->n_threads, .n_ctx = o->n_ctx, .step_tokens = o->step_tokens,
                          .max_active = o->max_active, .no_prefetch = o->no_prefetch, .step_ms = 200};
    if (!(r->s = ak_sched_start(&sc, err))) return -1;
    return 0;
}

/* Stops the scheduler and frees what rig_open opened. */
static void rig_close(rig *r) {
    ak_sched_free(r->s);
    ak_agents_free(r->agents);
    ak_store_close(r->store);
    ak_block_pool_free(r->pool);
}

/* A greedy request of exactly n tokens for agent id (NULL: anonymous). */
static ak_request *submit(rig *r, const char *id, const int32_t *prompt, int n_prompt, int n, ak_error *err) {
    ak_req_params p = {0};
    p.agent_id = id;
    p.prompt = prompt;
    p.n_prompt = n_prompt;
    p.max_tokens = n;
    p.sp = ak_sampler_defaults();
    p.sp.temp = 0;
    return ak_sched_submit(r->s, &p, err);
}

static int finish(ak_request *q, ak_req_result *res, ak_error *err) {
    while (!ak_request_wait(q, (size_t)-1, -1)) {
    }
    ak_request_read(q, 0, NULL, NULL, res);
    ak_request_release(q);
    if (res->finish == AK_FINISH_ERROR) return ak_fail(err, "%s", res->error);
    return 0;
}

/* Prompt tokens of agent i: distinct per agent, all in the vocabulary. */
static void make_prompt(int32_t *p, int n, int i, int vocab) {
    for (int k = 0; k < n; k++) p[k] = 1 + (int32_t)((i * 7919 + k * 104729) % (vocab - 1));
}

/* One run's settings and its prompt buffer (n_ctx + 16 tokens). */
typedef struct {
    loaded_model *lm;
    const cache_opts *co;
    int n_prompt, n_gen, warm_ctx, n_ctx, n_threads, vocab, json;
    int32_t *prompt;
} serve_bench;

/* What the restore test measured (medians of 3). */
typedef struct {
    double ttft_ahead, ttft_demand, restore_ahead, restore_demand;
    int ahead;     /* every restore ahead overlapped decoding */
    int warm_ok;   /* 2: every turn was warm */
} restore_result;

/* Continuous batching with N agents: decode tokens/s of N requests one
 * after another (*seq_tps) and all at once (*bat_tps). Returns 0, or -1
 * with err set. */
static int measure_batching(const serve_bench *b, int N, double *seq_tps, double *bat_tps, ak_error *err) {
    rig r;
    /* every prompt of the batch fits one step: all decode in lockstep after it */
    rig_opts ro = {.lm = b->lm, .co = b->co, .n_ctx = b->n_ctx, .n_threads = b->n_threads, .max_active = N,
                   .step_tokens = N * (b->n_prompt + 1)};
    if (rig_open(&r, &ro, err) < 0) { rig_close(&r); return -1; }
    /* sequential: one request at a time */
    double dec_s = 0;
    int dec_tok = 0;
    for (int i = 0; i < N; i++) {
        make_prompt(b->prompt, b->n_prompt, i, b->vocab);
        ak_request *q = submit(&r, NULL, b->prompt, b->n_prompt, b->n_gen, err);
        ak_req_result res;
        if (!q || finish(q, &res, err) < 0) { rig_close(&r); return -1; }
        dec_s += res.decode_ms / 1e3;
        dec_tok += res.completion_tokens - 1;
    }
    *seq_tps = dec_tok / dec_s;
    /* batched: all at once (fresh agents: new prompts) */
    ak_request *qs[256];
    for (int i = 0; i < N; i++) {
        make_prompt(b->prompt, b->n_prompt, 1000 + i, b->vocab);
        if (!(qs[i] = submit(&r, NULL, b->prompt, b->n_prompt, b->n_gen, err))) { rig_close(&r); return -1; }
    }
    double wall = 0;
    dec_tok = 0;
    for (int i = 0; i < N; i++) {
        ak_req_result res;
        if (finish(qs[i], &res, err) < 0) { rig_close(&r); return -1; }
        if (res.decode_ms / 1e3 > wall) wall = res.decode_ms / 1e3;
        dec_tok += res.completion_tokens - 1;
    }
    *bat_tps = dec_tok / wall;
    rig_close(&r);
    return 0;
}

/* The middle of three values. */
static double median3(double a, double b, double c) {
    return a < b ? (b < c ? b : a < c ? c : a) : (a < c ? a : b < c ? c : b);
}

/* Restores hidden behind decoding, in memory directory mem: a warm agent
 * of warm_ctx tokens waits while another decodes, restored ahead by the I/O
 * thread or on demand at admission, 3 reps of each. Returns 0, or -1 with
 * err set. */
static int measure_restore(const serve_bench *b, const char *mem, restore_result *out, ak_error *err) {
    rig r;
    make_prompt(b->prompt, b->warm_ctx + 8, 4242, b->vocab);
    if (!b->json) fprintf(stderr, "restore test: prefilling a %d-token agent once...\n", b->warm_ctx);
    rig_opts ro = {.lm = b->lm, .co = b->co, .mem = mem, .n_ctx = b->n_ctx, .n_threads = b->n_threads,
                   .max_active = 2, .step_tokens = 256};
    if (rig_open(&r, &ro, err) < 0) { rig_close(&r); return -1; }
    ak_request *q = submit(&r, "warm", b->prompt, b->warm_ctx, 1, err);
    ak_req_result res;
    if (!q || finish(q, &res, err) < 0) { rig_close(&r); return -1; }
    rig_close(&r); /* saved at shutdown: "warm" lives only on disk now */
    double ta[3][2], rs[3][2];
    int ahead = 0, warm = 0;
    for (int rep = 0; rep < 3; rep++)
        for (int mode = 0; mode < 2; mode++) {
            /* one batch slot: "warm" waits while "busy" decodes n_gen tokens */
            ro.max_active = 1;
            ro.no_prefetch = mode == 1;
            if (rig_open(&r, &ro, err) < 0) { rig_close(&r); return -1; }
            int32_t busy[64];
            make_prompt(busy, 16, 77 + mode + 2 * rep, b->vocab);
            ak_request *qb = submit(&r, NULL, busy, 16, b->n_gen, err);
            ak_request *qw = qb ? submit(&r, "warm", b->prompt, b->warm_ctx + 4, 2, err) : NULL;
            ak_req_result rb, rw;
            if (!qb || !qw || finish(qb, &rb, err) < 0 || finish(qw, &rw, err) < 0) { rig_close(&r); return -1; }
            ta[rep][mode] = rw.ttft_ms - rw.queue_ms;
            rs[rep][mode] = rw.turn.restore_ms;
            if (mode == 0) ahead += rw.turn.restored_ahead;
            warm += rw.turn.tier == AK_TIER_WARM;
            rig_close(&r);
        }
    out->ttft_ahead = median3(ta[0][0], ta[1][0], ta[2][0]);
    out->restore_ahead = median3(rs[0][0], rs[1][0], rs[2][0]);
    out->ttft_demand = median3(ta[0][1], ta[1][1], ta[2][1]);
    out->restore_demand = median3(rs[0][1], rs[1][1], rs[2][1]);
    out->ahead = ahead == 3;
    out->warm_ok = warm == 6 ? 2 : 0;
    if (!b->json) {
        fprintf(stderr, "  warm agent of %d tokens, waiting while another agent decodes %d tokens (median of 3):\n",
                b->warm_ctx, b->n_gen);
        fprintf(stderr, "    restored ahead by the I/O thread: TTFT after admission %8.2f ms (restore %.2f ms, %s)\n",
                out->ttft_ahead, out->restore_ahead, out->ahead ? "overlapped with decoding" : "NOT overlapped");
        fprintf(stderr, "    restored on demand at admission:  TTFT after admission %8.2f ms (restore %.2f ms)\n",
                out->ttft_demand, out->restore_demand);
        fprintf(stderr, "    both warm: %s\n", out->warm_ok == 2 ? "yes" : "NO");
    }
    return 0;
}

/* agentkv bench serve: parses the flags, measures batching per batch size
 * and the restore test, reports. Returns the exit code. */
int cmd_bench_serve(int argc, char **argv) {
    ak_args a;
    args_init(&a, "bench serve", argc, argv);
    const char *model_path = NULL;
    int n_prompt = 32, n_gen = 64, warm_ctx = 1024, n_threads = 0, json = 0;
    int agents_list[16] = {1, 2, 4, 8}, n_list = 4;
    cache_opts co;
    cache_opts_init(&co);
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) model_path = args_value(&a, f);
        else if (!strcmp(f, "-p")) n_prompt = (int)args_int(&a, f, 1, 4096);
        else if (!strcmp(f, "-n")) n_gen = (int)args_int(&a, f, 2, 4096);
        else if (!strcmp(f, "--warm-ctx")) warm_ctx = (int)args_int(&a, f, 0, 1 << 20);
        else if (!strcmp(f, "-t")) n_threads = (int)args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--json")) json = 1;
        else if (!strcmp(f, "--agents")) { const char *v = args_value(&a, f); if (v) n_list = args_int_list(&a, f, v, 1, 256, agents_list, 16); }
        else if (!cache_opts_parse(&co, &a, f)) args_unknown(&a, f);
    }
    if (!a.failed && !model_path) args_error(&a, "-m MODEL is required");
    if (a.failed) return AK_EXIT_USAGE;
    loaded_model lm;
    if (load_model(&lm, "bench serve", model_path) < 0) return 1;
    int n_ctx = n_prompt + n_gen + 8;
    if (warm_ctx + 16 > n_ctx) n_ctx = warm_ctx + 16;
    serve_bench b = {.lm = &lm, .co = &co, .n_prompt = n_prompt, .n_gen = n_gen, .warm_ctx = warm_ctx, .n_ctx = n_ctx,
                     .n_threads = n_threads, .vocab = lm.model->cfg.vocab, .json = json,
                     .prompt = malloc(sizeof(int32_t) * (size_t)(n_ctx + 16))};
    ak_error err = {{0}};
    int rc = 1;
    double seq_tps[16] = {0}, bat_tps[16] = {0};
    if (!b.prompt) { ak_fail(&err, "out of memory"); goto fail; }
    if (!json)
        fprintf(stderr, "batched vs sequential decode: %d prompt + %d generated tokens per agent, %s/%s cache\n",
                n_prompt, n_gen, ak_kv_format_get(co.fk)->name, ak_kv_format_get(co.fv)->name);
    for (int li = 0; li < n_list; li++) {
        int N = agents_list[li];
        if (measure_batching(&b, N, &seq_tps[li], &bat_tps[li], &err) < 0) goto fail;
        if (!json)
            fprintf(stderr, "  N=%-3d sequential %8.2f tok/s   batched %8.2f tok/s   speedup %5.2fx (goal >= %.1fx)\n", N,
                    seq_tps[li], bat_tps[li], bat_tps[li] / seq_tps[li], 0.7 * N);
    }
    /* restore hidden behind decoding */
    restore_result rr = {.ahead = 0};
    if (warm_ctx > 0) {
        char mem[] = "/tmp/agentkv-bench-serve-XXXXXX";
        if (!mkdtemp(mem)) { ak_fail(&err, "cannot make a temporary directory"); goto fail; }
        int r = measure_restore(&b, mem, &rr, &err);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", mem);
        if (system(cmd) != 0) fprintf(stderr, "bench serve: could not remove %s\n", mem);
        if (r < 0) goto fail;
    }
    if (json) {
        printf("{\"model\": \"%s\", \"prompt\": %d, \"generated\": %d, \"batching\": [", model_path, n_prompt, n_gen);
        for (int i = 0; i < n_list; i++)
            printf("%s{\"agents\": %d, \"sequential_tok_s\": %.3f, \"batched_tok_s\": %.3f, \"speedup\": %.3f}",
                   i ? ", " : "", agents_list[i], seq_tps[i], bat_tps[i], bat_tps[i] / seq_tps[i]);
        printf("], \"warm_ctx\": %d, \"ttft_after_admission_ms_restored_ahead\": %.3f, \"restore_ms_ahead\": %.3f, "
               "\"overlapped\": %s, \"ttft_after_admission_ms_on_demand\": %.3f, \"restore_ms_on_demand\": %.3f}\n",
               warm_ctx, rr.ttft_ahead, rr.restore_ahead, rr.ahead ? "true" : "false", rr.ttft_demand,
               rr.restore_demand);
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "agentkv bench serve: %s\n", err.msg);
done:
    free(b.prompt);
    unload_model(&lm);
    return rc;
}
