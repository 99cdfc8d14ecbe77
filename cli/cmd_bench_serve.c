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

static int rig_open(rig *r, loaded_model *lm, const cache_opts *co, const char *mem, int n_ctx, int n_threads,
                    int max_active, int step_tokens, int no_prefetch, ak_error *err) {
    memset(r, 0, sizeof *r);
    r->lm = *lm;
    if (!(r->pool = ak_block_pool_new(&lm->model->spec, co->block_tokens, 0, err))) return -1;
    if (mem && !(r->store = ak_store_open(mem, NULL, err))) return -1;
    ak_agents_config ac = {lm->model, r->pool, r->store, co->fk, co->fv, n_ctx, AK_SAVE_EVERY_TURN, 0, NULL, NULL};
    if (!(r->agents = ak_agents_new(&ac, err))) return -1;
    ak_sched_config sc = {lm->model, lm->tok, r->agents, r->pool, r->store, n_threads, n_ctx, step_tokens, max_active,
                          NULL, NULL, NULL, no_prefetch, 200};
    if (!(r->s = ak_sched_start(&sc, err))) return -1;
    return 0;
}

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
    int vocab = lm.model->cfg.vocab, max_n = 1;
    for (int i = 0; i < n_list; i++) if (agents_list[i] > max_n) max_n = agents_list[i];
    int n_ctx = n_prompt + n_gen + 8;
    if (warm_ctx + 16 > n_ctx) n_ctx = warm_ctx + 16;
    ak_error err = {{0}};
    int rc = 1;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)(n_ctx + 16));
    double seq_tps[16] = {0}, bat_tps[16] = {0};
    if (!prompt) { ak_fail(&err, "out of memory"); goto fail; }
    if (!json)
        fprintf(stderr, "batched vs sequential decode: %d prompt + %d generated tokens per agent, %s/%s cache\n",
                n_prompt, n_gen, ak_kv_format_get(co.fk)->name, ak_kv_format_get(co.fv)->name);
    for (int li = 0; li < n_list; li++) {
        int N = agents_list[li];
        rig r;
        /* every prompt of the batch fits one step: all decode in lockstep after it */
        if (rig_open(&r, &lm, &co, NULL, n_ctx, n_threads, N, N * (n_prompt + 1), 0, &err) < 0) { rig_close(&r); goto fail; }
        /* sequential: one request at a time */
        double dec_s = 0;
        int dec_tok = 0;
        for (int i = 0; i < N; i++) {
            make_prompt(prompt, n_prompt, i, vocab);
            ak_request *q = submit(&r, NULL, prompt, n_prompt, n_gen, &err);
            ak_req_result res;
            if (!q || finish(q, &res, &err) < 0) { rig_close(&r); goto fail; }
            dec_s += res.decode_ms / 1e3;
            dec_tok += res.completion_tokens - 1;
        }
        seq_tps[li] = dec_tok / dec_s;
        /* batched: all at once (fresh agents: new prompts) */
        ak_request *qs[256];
        for (int i = 0; i < N; i++) {
            make_prompt(prompt, n_prompt, 1000 + i, vocab);
            if (!(qs[i] = submit(&r, NULL, prompt, n_prompt, n_gen, &err))) { rig_close(&r); goto fail; }
        }
        double wall = 0;
        dec_tok = 0;
        for (int i = 0; i < N; i++) {
            ak_req_result res;
            if (finish(qs[i], &res, &err) < 0) { rig_close(&r); goto fail; }
            if (res.decode_ms / 1e3 > wall) wall = res.decode_ms / 1e3;
            dec_tok += res.completion_tokens - 1;
        }
        bat_tps[li] = dec_tok / wall;
        rig_close(&r);
        if (!json)
            fprintf(stderr, "  N=%-3d sequential %8.2f tok/s   batched %8.2f tok/s   speedup %5.2fx (goal >= %.1fx)\n", N,
                    seq_tps[li], bat_tps[li], bat_tps[li] / seq_tps[li], 0.7 * N);
    }
    /* restore hidden behind decoding */
    double ttft_ahead = 0, ttft_demand = 0, restore_ahead = 0, restore_demand = 0;
    int ahead_flag = 0, warm_ok = 0;
    if (warm_ctx > 0) {
        char mem[] = "/tmp/agentkv-bench-serve-XXXXXX";
        if (!mkdtemp(mem)) { ak_fail(&err, "cannot make a temporary directory"); goto fail; }
        rig r;
        make_prompt(prompt, warm_ctx + 8, 4242, vocab);
        if (!json) fprintf(stderr, "restore test: prefilling a %d-token agent once...\n", warm_ctx);
        if (rig_open(&r, &lm, &co, mem, n_ctx, n_threads, 2, 256, 0, &err) < 0) { rig_close(&r); goto fail_mem; }
        ak_request *q = submit(&r, "warm", prompt, warm_ctx, 1, &err);
        ak_req_result res;
        if (!q || finish(q, &res, &err) < 0) { rig_close(&r); goto fail_mem; }
        rig_close(&r); /* saved at shutdown: "warm" lives only on disk now */
        double ta[3][2], rs[3][2];
        for (int rep = 0; rep < 3; rep++)
            for (int mode = 0; mode < 2; mode++) {
                /* one batch slot: "warm" waits while "busy" decodes n_gen tokens */
                if (rig_open(&r, &lm, &co, mem, n_ctx, n_threads, 1, 256, mode == 1, &err) < 0) { rig_close(&r); goto fail_mem; }
                int32_t busy[64];
                make_prompt(busy, 16, 77 + mode + 2 * rep, vocab);
                ak_request *qb = submit(&r, NULL, busy, 16, n_gen, &err);
                ak_request *qw = qb ? submit(&r, "warm", prompt, warm_ctx + 4, 2, &err) : NULL;
                ak_req_result rb, rw;
                if (!qb || !qw || finish(qb, &rb, &err) < 0 || finish(qw, &rw, &err) < 0) { rig_close(&r); goto fail_mem; }
                ta[rep][mode] = rw.ttft_ms - rw.queue_ms;
                rs[rep][mode] = rw.turn.restore_ms;
                if (mode == 0) ahead_flag += rw.turn.restored_ahead;
                warm_ok += rw.turn.tier == AK_TIER_WARM;
                rig_close(&r);
            }
        /* medians of 3 */
        for (int mode = 0; mode < 2; mode++) {
            double v[3] = {ta[0][mode], ta[1][mode], ta[2][mode]}, w[3] = {rs[0][mode], rs[1][mode], rs[2][mode]};
            for (int i = 0; i < 3; i++)
                for (int j = i + 1; j < 3; j++) {
                    if (v[j] < v[i]) { double x = v[i]; v[i] = v[j]; v[j] = x; }
                    if (w[j] < w[i]) { double x = w[i]; w[i] = w[j]; w[j] = x; }
                }
            if (mode == 0) { ttft_ahead = v[1]; restore_ahead = w[1]; }
            else { ttft_demand = v[1]; restore_demand = w[1]; }
        }
        ahead_flag = ahead_flag == 3;
        warm_ok = warm_ok == 6 ? 2 : 0;
        if (!json) {
            fprintf(stderr, "  warm agent of %d tokens, waiting while another agent decodes %d tokens (median of 3):\n", warm_ctx, n_gen);
            fprintf(stderr, "    restored ahead by the I/O thread: TTFT after admission %8.2f ms (restore %.2f ms, %s)\n",
                    ttft_ahead, restore_ahead, ahead_flag ? "overlapped with decoding" : "NOT overlapped");
            fprintf(stderr, "    restored on demand at admission:  TTFT after admission %8.2f ms (restore %.2f ms)\n",
                    ttft_demand, restore_demand);
            fprintf(stderr, "    both warm: %s\n", warm_ok == 2 ? "yes" : "NO");
        }
    fail_mem:;
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", mem);
        if (system(cmd) != 0) fprintf(stderr, "bench serve: could not remove %s\n", mem);
        if (err.msg[0]) goto fail;
    }
    if (json) {
        printf("{\"model\": \"%s\", \"prompt\": %d, \"generated\": %d, \"batching\": [", model_path, n_prompt, n_gen);
        for (int i = 0; i < n_list; i++)
            printf("%s{\"agents\": %d, \"sequential_tok_s\": %.3f, \"batched_tok_s\": %.3f, \"speedup\": %.3f}",
                   i ? ", " : "", agents_list[i], seq_tps[i], bat_tps[i], bat_tps[i] / seq_tps[i]);
        printf("], \"warm_ctx\": %d, \"ttft_after_admission_ms_restored_ahead\": %.3f, \"restore_ms_ahead\": %.3f, "
               "\"overlapped\": %s, \"ttft_after_admission_ms_on_demand\": %.3f, \"restore_ms_on_demand\": %.3f}\n",
               warm_ctx, ttft_ahead, restore_ahead, ahead_flag ? "true" : "false", ttft_demand, restore_demand);
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "agentkv bench serve: %s\n", err.msg);
done:
    free(prompt);
    unload_model(&lm);
    return rc;
}
