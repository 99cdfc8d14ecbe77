/* cmd_run.c - agentkv run: generate a continuation of a prompt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agents/agent.h"
#include "text/generate.h"
#include "text/sampler.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv run -m MODEL (-p PROMPT | -f PROMPT_FILE) [flags]\n"
    "  prints only the generated continuation to stdout (streaming); timings go to stderr\n"
    "  -m, --model FILE     GGUF model\n"
    "  -p, --prompt TEXT    prompt text\n"
    "  -f, --file FILE      read the prompt from a file\n"
    "  -n, --n-predict N    tokens to generate (default 128; stops early at end-of-generation)\n"
    "  -c, --ctx-size N     context size (default: the model's, at most 4096)\n"
    "  -t, --threads N      threads (default: all cores)\n"
    "  --temp T             temperature (default 0.8; 0 = greedy)\n"
    "  --top-k K            top-k (default 40; 0 = off)\n"
    "  --top-p P            top-p (default 0.95; 1 = off)\n"
    "  --min-p P            min-p (default 0.05; 0 = off)\n"
    "  --repeat-penalty R   repetition penalty (default 1.0 = off)\n"
    "  --repeat-last-n N    tokens the penalty looks back over (default 64)\n"
    "  --seed S             RNG seed (default: from the clock); same seed, same output\n"
    CACHE_OPTS_HELP
    "  --agent NAME         run as a persistent agent: its KV cache is restored from and saved to\n"
    "                       the memory directory; a prompt that extends the last one prefills only\n"
    "                       the new tokens (stderr: match, tier, reused, prefilled, restore_ms)\n"
    MEMORY_OPTS_HELP
    "  --no-bos             don't add the BOS token the vocabulary asks for\n"
    "  --json               print one JSON object (tokens, text, timings) instead of streaming\n";

static void log_line(void *ud, const char *line) {
    (void)ud;
    fprintf(stderr, "agentkv: %s\n", line);
}

/* What run was asked: its flags. */
typedef struct {
    const char *model_path, *prompt, *prompt_file, *agent_id;
    int n_predict, n_ctx, n_threads, json, no_bos;
    ak_sampler_params sp;
    cache_opts co;
    store_opts mo;
} run_opts;

/* Parses argv into o (the seed, unless --seed, from the clock). Returns -1
 * when run should go on, else its exit code: 0 after --help,
 * AK_EXIT_USAGE after a usage error (printed). */
static int run_parse(int argc, char **argv, run_opts *o) {
    ak_args a;
    args_init(&a, "run", argc, argv);
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->sp = ak_sampler_defaults();
    cache_opts_init(&o->co);
    store_opts_init(&o->mo);
    ak_sampler_params *sp = &o->sp;
    int seed_set = 0;
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) o->model_path = args_value(&a, f);
        else if (!strcmp(f, "-p") || !strcmp(f, "--prompt")) o->prompt = args_value(&a, f);
        else if (!strcmp(f, "-f") || !strcmp(f, "--file")) o->prompt_file = args_value(&a, f);
        else if (!strcmp(f, "-n") || !strcmp(f, "--n-predict")) o->n_predict = (int)args_int(&a, f, 0, 1 << 24);
        else if (!strcmp(f, "-c") || !strcmp(f, "--ctx-size")) o->n_ctx = (int)args_int(&a, f, 1, 1 << 24);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) o->n_threads = (int)args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--temp")) sp->temp = (float)args_float(&a, f, 0, 100);
        else if (!strcmp(f, "--top-k")) sp->top_k = (int)args_int(&a, f, 0, 1 << 24);
        else if (!strcmp(f, "--top-p")) sp->top_p = (float)args_float(&a, f, 1e-6, 1);
        else if (!strcmp(f, "--min-p")) sp->min_p = (float)args_float(&a, f, 0, 1);
        else if (!strcmp(f, "--repeat-penalty")) sp->repeat_penalty = (float)args_float(&a, f, 1e-3, 100);
        else if (!strcmp(f, "--repeat-last-n")) sp->repeat_last_n = (int)args_int(&a, f, 0, 1 << 24);
        else if (!strcmp(f, "--seed")) { sp->seed = (uint64_t)args_int(&a, f, 0, INT64_MAX); seed_set = 1; }
        else if (!strcmp(f, "--no-bos")) o->no_bos = 1;
        else if (!strcmp(f, "--json")) o->json = 1;
        else if (!strcmp(f, "--agent")) o->agent_id = args_value(&a, f);
        else if (!store_opts_parse(&o->mo, &a, f) && !cache_opts_parse(&o->co, &a, f)) args_unknown(&a, f);
    }
    if (!a.failed && !o->model_path) args_error(&a, "-m MODEL is required");
    if (!a.failed && !o->prompt == !o->prompt_file) args_error(&a, "give exactly one of -p PROMPT or -f PROMPT_FILE");
    if (!a.failed && o->agent_id && !ak_agent_id_valid(o->agent_id))
        args_error(&a, "--agent: invalid id '%s' (1-128 of [A-Za-z0-9_.-], not starting with '.')", o->agent_id);
    if (a.failed) return AK_EXIT_USAGE;
    if (!seed_set) sp->seed = (uint64_t)time(NULL);
    return -1;
}

/* agentkv run: parses the flags, prefills the prompt (as an agent with
 * --agent), generates. Returns the exit code. */
int cmd_run(int argc, char **argv) {
    run_opts o;
    int prc = run_parse(argc, argv, &o);
    if (prc >= 0) return prc;
    const char *model_path = o.model_path, *prompt = o.prompt, *prompt_file = o.prompt_file;
    int n_predict = o.n_predict, n_ctx = o.n_ctx, n_threads = o.n_threads, json = o.json, no_bos = o.no_bos;
    ak_sampler_params sp = o.sp;
    cache_opts co = o.co;
    const char *agent_id = o.agent_id;
    store_opts mo = o.mo;

    char *file_text = NULL;
    size_t prompt_len = prompt ? strlen(prompt) : 0;
    if (prompt_file && !(file_text = read_prompt_file("run", prompt_file, &prompt_len))) return 1;
    if (file_text) prompt = file_text;

    loaded_model lm;
    if (load_model(&lm, "run", model_path) < 0) { free(file_text); return 1; }
    const ak_config *cfg = &lm.model->cfg;
    if (!n_ctx) n_ctx = cfg->n_ctx_train < 4096 ? cfg->n_ctx_train : 4096;

    int rc = 1;
    ak_error err = {{0}};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    ak_kv *kv = NULL;
    ak_block_pool *pool = NULL;
    ak_store *store = NULL;
    ak_agents *agents = NULL;
    ak_ctx *ctx = NULL;
    ak_sampler *smp = NULL;
    float *logits = NULL;
    ak_gen gen = {0};

    if (ak_tokenize(lm.tok, prompt, prompt_len, no_bos ? 0 : AK_TOK_ADD_SPECIAL, &ids, &n_ids, &err) < 0) goto fail;
    if (n_ids == 0) { ak_fail(&err, "the prompt is empty (no tokens)"); goto fail; }
    if ((long)n_ids + n_predict > n_ctx && (long)n_ids >= n_ctx) {
        ak_fail(&err, "prompt has %zu tokens, the context is %d (-c)", n_ids, n_ctx);
        goto fail;
    }
    if (agent_id) {
        if (!(store = store_opts_open(&mo, &err))) goto fail;
        if (!(pool = ak_block_pool_new(&lm.model->spec, co.block_tokens, co.budget, &err))) goto fail;
        ak_agents_config ac = {.model = lm.model, .pool = pool, .store = store, .fk = co.fk, .fv = co.fv,
                               .n_ctx = n_ctx, .save = mo.save, .disk_budget = mo.disk_budget, .log = log_line,
                               .no_prefix_sharing = mo.no_prefix_sharing};
        if (!(agents = ak_agents_new(&ac, &err))) goto fail;
    } else if (cache_open(&co, lm.model, n_ctx, "run", &pool, &kv) < 0) {
        goto done;
    }
    if (!(ctx = ak_ctx_new(lm.model, n_ids < 256 ? (int)n_ids : 256, n_threads, &err))) goto fail;
    if (cache_center(&co, ctx, lm.tok, pool, "run") < 0) goto done;
    if (!(smp = ak_sampler_new(&sp, cfg->vocab, &err))) goto fail;
    if (!(logits = ak_malloc((size_t)cfg->vocab * sizeof(float), &err))) goto fail;
    if (ak_gen_init(&gen, &(ak_gen_opts){.tok = lm.tok, .smp = smp, .prompt = ids, .n_prompt = (int)n_ids,
                    .max_tokens = n_predict, .n_ctx = n_ctx, .stop_at_eog = 1}, &err) < 0) goto fail;

    progress pg;
    progress_init(&pg, "prefill");
    double t0 = ak_now();
    if (agents) {
        ak_turn turn;
        if (ak_agent_begin(agents, ctx, agent_id, ids, (int)n_ids, logits, &turn, &err) < 0) goto fail;
        fprintf(stderr, "agent=%s match=%s tier=%s reused=%d prefilled=%d restore_ms=%.2f prefill_ms=%.2f\n",
                agent_id, ak_match_name(turn.match), ak_tier_name(turn.tier), turn.reused, turn.prefilled,
                turn.restore_ms, turn.prefill_ms);
    } else if (ak_eval(ctx, kv, &(ak_eval_args){.tokens = ids, .n = (int)n_ids, .logits = logits,
                       .progress = progress_update, .ud = &pg}, &err) < 0) {
        goto fail;
    }
    progress_done(&pg);
    double t1 = ak_now();

    /* the step (generate.h) samples, ends at end-of-generation or the
     * limits, and keeps the text; only feeding the model is done here */
    int pos = (int)n_ids;
    for (;;) {
        ak_gen_out out;
        ak_gen_status st = ak_gen_step(&gen, logits, pos, &out, &err);
        if (st == AK_GEN_ERROR) goto fail;
        if (out.n_piece && !json) {
            fwrite(out.piece, 1, out.n_piece, stdout);
            fflush(stdout);
        }
        if (st != AK_GEN_MORE) break;
        int32_t tok = out.tok;
        if (agents ? ak_agent_step(agents, ctx, agent_id, tok, logits, &err)
                   : ak_eval(ctx, kv, &(ak_eval_args){.tokens = &tok, .n = 1, .pos0 = pos, .logits = logits}, &err))
            goto fail;
        pos++;
    }
    const char *piece;
    size_t np = ak_gen_flush(&gen, &piece);
    double t2 = ak_now();
    if (agents && ak_agent_end(agents, agent_id, &err) < 0) goto fail;
    if (!json) {
        if (np) fwrite(piece, 1, np, stdout);
        fputc('\n', stdout);
        fflush(stdout);
    }
    int n_gen = gen.n_gen;
    double pf_ms = (t1 - t0) * 1e3, dec_ms = (t2 - t1) * 1e3;
    double pf_tps = n_ids / (t1 - t0), dec_tps = n_gen > 0 ? n_gen / (t2 - t1) : 0;
    if (json) {
        printf("{\"prompt_tokens\": %zu, \"generated_tokens\": %d, \"text\": ", n_ids, n_gen);
        ak_json_write_string(stdout, gen.text ? gen.text : "", gen.len);
        printf(", \"timings\": {\"load_ms\": %.2f, \"prefill_ms\": %.2f, \"prefill_tok_s\": %.2f, "
               "\"decode_ms\": %.2f, \"decode_tok_s\": %.2f}}\n",
               lm.load_s * 1e3, pf_ms, pf_tps, dec_ms, dec_tps);
    }
    fprintf(stderr, "load %.1f ms | prefill %zu tokens in %.1f ms (%.1f tok/s) | decode %d tokens in %.1f ms (%.1f tok/s)\n",
            lm.load_s * 1e3, n_ids, pf_ms, pf_tps, n_gen, dec_ms, dec_tps);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "agentkv run: %s\n", err.msg);
done:
    ak_gen_free(&gen);
    free(ids); free(logits); free(file_text);
    ak_sampler_free(smp);
    ak_ctx_free(ctx);
    ak_agents_free(agents);
    ak_store_close(store);
    cache_close(pool, kv);
    unload_model(&lm);
    return rc;
}
