/* cmd_run.c - agentkv run: generate a continuation of a prompt, through the
 * public API (include/agentkv.h) as a program embedding the library would. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <agentkv.h>

#include "agents/agent.h"
#include "engine/calib.h"
#include "kv/kvformat.h"
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

/* on_token of a turn: each piece of text to stdout as it comes (nothing
 * with --json, whose text is printed whole at the end). */
static int stream_piece(void *ud, int32_t token, const char *piece, size_t len) {
    (void)token;
    if (len && !*(const int *)ud) {
        fwrite(piece, 1, len, stdout);
        fflush(stdout);
    }
    return 0;
}

/* The --center sides as the public API names them. */
static const char *center_name(unsigned c) {
    return c == (AK_CENTER_K | AK_CENTER_V) ? "kv" : c == AK_CENTER_K ? "k" : c == AK_CENTER_V ? "v" : "none";
}

/* The store a run opens: the memory directory (or Redis) with --agent, RAM
 * only without it. */
static agentkv_store_options run_store_options(const run_opts *o, int n_ctx, int n_ids) {
    const cache_opts *co = &o->co;
    const store_opts *mo = &o->mo;
    agentkv_store_options so = {
        .cache_type_k = ak_kv_format_get(co->fk)->name, .cache_type_v = ak_kv_format_get(co->fv)->name,
        .kv_budget = co->budget, .block_tokens = co->block_tokens, .n_ctx = n_ctx, .center = center_name(co->center),
        .n_threads = o->n_threads, .max_batch = n_ids < 256 ? n_ids : 256, .log = log_line};
    if (o->agent_id) {
        so.url = mo->store_url;
        so.dir = mo->store_url && !mo->dir_given ? NULL : mo->dir;
        so.password_file = mo->store_password_file;
        so.lease_ms = mo->store_lease_ms;
        so.key_file = mo->key_file;
        so.save = mo->save == AK_SAVE_ON_EVICT ? AGENTKV_SAVE_ON_EVICT
                  : mo->save == AK_SAVE_ON_SHUTDOWN ? AGENTKV_SAVE_ON_SHUTDOWN : AGENTKV_SAVE_EVERY_TURN;
        so.disk_budget = mo->disk_budget;
        so.no_prefix_sharing = mo->no_prefix_sharing;
    }
    return so;
}

/* Prints what a turn did: the agent's line (with --agent), the text as
 * JSON (--json) or the line's end, and the timings. */
static void run_report(const run_opts *o, const agentkv_turn_result *r, double load_s) {
    if (o->agent_id)
        fprintf(stderr, "agent=%s match=%s tier=%s reused=%d prefilled=%d restore_ms=%.2f prefill_ms=%.2f\n",
                o->agent_id, r->match, r->tier == AGENTKV_TIER_HOT ? "hot" : r->tier == AGENTKV_TIER_WARM ? "warm" : "cold",
                r->reused, r->prefilled, r->restore_ms, r->prompt_ms - r->restore_ms);
    double pf_ms = r->prompt_ms, dec_ms = r->decode_ms;
    double pf_tps = pf_ms > 0 ? r->prompt_tokens / (pf_ms / 1e3) : 0;
    double dec_tps = r->generated > 0 && dec_ms > 0 ? r->generated / (dec_ms / 1e3) : 0;
    if (o->json) {
        printf("{\"prompt_tokens\": %d, \"generated_tokens\": %d, \"text\": ", r->prompt_tokens, r->generated);
        ak_json_write_string(stdout, r->text ? r->text : "", r->text_len);
        printf(", \"timings\": {\"load_ms\": %.2f, \"prefill_ms\": %.2f, \"prefill_tok_s\": %.2f, "
               "\"decode_ms\": %.2f, \"decode_tok_s\": %.2f}}\n",
               load_s * 1e3, pf_ms, pf_tps, dec_ms, dec_tps);
    } else {
        fputc('\n', stdout);
    }
    fflush(stdout);
    fprintf(stderr, "load %.1f ms | prefill %d tokens in %.1f ms (%.1f tok/s) | decode %d tokens in %.1f ms (%.1f tok/s)\n",
            load_s * 1e3, r->prompt_tokens, pf_ms, pf_tps, r->generated, dec_ms, dec_tps);
}

/* agentkv run: parses the flags, then, through the public API
 * (include/agentkv.h), loads the model, opens the agent's store (RAM only
 * without --agent) and runs one turn that streams the continuation.
 * Returns the exit code. */
int cmd_run(int argc, char **argv) {
    run_opts o;
    int prc = run_parse(argc, argv, &o);
    if (prc >= 0) return prc;
    const char *prompt = o.prompt;
    char *file_text = NULL;
    size_t prompt_len = prompt ? strlen(prompt) : 0;
    if (o.prompt_file && !(file_text = read_prompt_file("run", o.prompt_file, &prompt_len))) return 1;
    if (file_text) prompt = file_text;

    int rc = 1;
    agentkv_error err = {0};
    agentkv_model *m = NULL;
    agentkv_store *s = NULL;
    agentkv_agent *agent = NULL;
    agentkv_turn_result res = {0};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    progress pg;
    progress_init(&pg, "loading model");
    double t0 = ak_now();
    agentkv_status st = agentkv_model_load(o.model_path, &(agentkv_model_options){.progress = progress_update,
                                           .progress_ud = &pg}, &m, &err);
    progress_done(&pg);
    double load_s = ak_now() - t0;
    if (st != AGENTKV_OK) goto fail;
    agentkv_model_info mi;
    agentkv_model_get_info(m, &mi);
    int n_ctx = o.n_ctx ? o.n_ctx : mi.n_ctx_train < 4096 ? mi.n_ctx_train : 4096;
    if (agentkv_tokenize(m, prompt, prompt_len, o.no_bos ? 0 : AGENTKV_TOKENIZE_ADD_SPECIAL, &ids, &n_ids, &err)) goto fail;
    if (n_ids == 0) {
        fprintf(stderr, "agentkv run: the prompt is empty (no tokens)\n");
        goto done;
    }
    if ((long)n_ids + o.n_predict > n_ctx && (long)n_ids >= n_ctx) {
        fprintf(stderr, "agentkv run: prompt has %zu tokens, the context is %d (-c)\n", n_ids, n_ctx);
        goto done;
    }
    agentkv_store_options so = run_store_options(&o, n_ctx, (int)n_ids);
    if (agentkv_store_open(m, &so, &s, &err) || agentkv_agent_get(s, o.agent_id ? o.agent_id : "run", &agent, &err))
        goto fail;
    const ak_sampler_params *sp = &o.sp;
    progress_init(&pg, "prefill");
    agentkv_turn_options to = {
        .tokens = ids, .n_tokens = n_ids, .max_tokens = o.n_predict, .temperature = sp->temp, .top_k = sp->top_k,
        .top_p = sp->top_p, .min_p = sp->min_p, .repeat_penalty = sp->repeat_penalty,
        .repeat_last_n = sp->repeat_last_n ? sp->repeat_last_n : -1, .seed = sp->seed, .on_token = stream_piece,
        .ud = &o.json, .progress = progress_update, .progress_ud = &pg};
    st = agentkv_agent_turn(agent, &to, &res, &err);
    progress_done(&pg);
    if (st != AGENTKV_OK) goto fail;
    run_report(&o, &res, load_s);
    agentkv_agent_release(agent);
    agent = NULL;
    st = agentkv_store_close(s, &err);
    s = NULL;
    if (st != AGENTKV_OK) goto fail;
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "agentkv run: %s\n", agentkv_error_message(&err));
done:
    agentkv_free(res.text);
    agentkv_free(ids);
    free(file_text);
    agentkv_agent_release(agent);
    agentkv_store_close(s, NULL);
    agentkv_model_free(m);
    return rc;
}
