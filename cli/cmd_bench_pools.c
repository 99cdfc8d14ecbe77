/* cmd_bench_pools.c - agentkv bench pools: what a shared pool (agent.h,
 * POOLS) saves and costs, measured side by side in one run on one model:
 *
 *   1. memory: N agents attached to one pool, each with a private suffix,
 *      for N = 1, 2, 4, 8, 16 (agents added one at a time to one pool that
 *      is prefilled once): the block pool's bytes in use, beside N private
 *      copies (N x the measured bytes of one agent that prefilled the
 *      document and its suffix alone, in the same formats), beside the
 *      floor (the pool's tokens once plus every suffix, at the formats'
 *      bytes per token); and, for information, what the content index
 *      saves without a pool (N agents each prefilling the document: full
 *      blocks are linked, a partly filled one is not);
 *   2. time: the first turn (TTFT) of an agent attached to the pool (only
 *      its suffix is prefilled) vs one that prefills document + suffix
 *      privately; and the aggregate decode tokens/s of B pooled agents
 *      decoding together (one ak_forward of B tokens per step) vs B private
 *      copies of the same caches (same bits, private memory).
 *
 * The agents have no store (memory only): nothing here measures the disk.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agents/agent.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv bench pools -m MODEL [flags]\n"
    "  Memory and speed of agents sharing one pool (a document prefilled once) vs agents\n"
    "  holding private copies of it, in one run:\n"
    "  1. memory: N agents attached to one pool of --pool-tokens tokens, each with its own\n"
    "     --suffix tokens, for each N of --agents: bytes in use (measured) beside N private\n"
    "     copies (N x the measured bytes of one agent that prefilled document + suffix alone)\n"
    "     and the floor (pool tokens once + N suffixes, at the formats' bytes per token);\n"
    "     also N agents prefilling the document privately, sharing full blocks through the\n"
    "     content index (no pool).\n"
    "  2. time: first-turn TTFT of a pooled agent vs a private prefill of document + suffix;\n"
    "     aggregate decode tokens/s of --decode-agents pooled agents batched vs the same\n"
    "     number of private copies of their caches, each step run for both one right after\n"
    "     the other (median of --reps runs).\n"
    "  The pool is prefilled once (tens of seconds for 4K tokens of a 1B model on 2 cores),\n"
    "  and so is each private agent (--ttft-reps times).\n"
    "\n"
    "  -m, --model FILE        GGUF model (bench/pools.sh makes a synthetic llama-1b, 8K context)\n"
    "  --pool-tokens N         document tokens in the pool (default 4096)\n"
    "  --suffix N              private tokens per agent after the document (default 64)\n"
    "  --agents LIST           agent counts of the memory table (default 1,2,4,8,16)\n"
    "  --decode-agents B       agents decoding together (default 8; at most the largest N)\n"
    "  --decode-tokens N       tokens each decodes per measured run (default 32)\n"
    "  --reps N                decode runs of each kind, median reported (default 3)\n"
    "  --ttft-reps N           private prefills of document + suffix timed (default 3)\n"
    "  -t, --threads N         threads (default: all cores)\n"
    "  --json                  one JSON object on stdout instead of the tables\n"
    "  --json-out FILE         the tables on stdout and the JSON object into FILE\n"
    "  -ctk, -ctv F            formats of the pool and of every agent, pooled or private\n"
    "                          (default q8 keys, tq3 values: PolyKV's)\n"
    "  --kv-block N, --center, --no-center   as in the other commands (agentkv run --help)\n"
    "  Tokens are random ids (the cost of a token does not depend on which it is); decoded\n"
    "  tokens are fed, not sampled.\n";

#define MAX_LIST 16
#define POOL_ID "bench-doc"

/* Bytes one position takes in formats fk/fv, computed from the formats
 * alone: for every layer and KV head, one key vector (code stream +
 * metadata of head_dim_k values) and one value vector (head_dim_v). */
static double bytes_per_token(const ak_cache_spec *s, ak_kv_format fk, ak_kv_format fv) {
    size_t k = ak_kv_format_code_bytes(fk, s->head_dim_k) + ak_kv_format_meta_bytes(fk, s->head_dim_k);
    size_t v = ak_kv_format_code_bytes(fv, s->head_dim_v) + ak_kv_format_meta_bytes(fv, s->head_dim_v);
    return (double)s->n_layer * s->n_head_kv * (double)(k + v);
}

/* One block pool with its agents (no store: memory only), and the context
 * their turns run on. */
typedef struct {
    ak_block_pool *pool;
    ak_agents *ag;
    ak_ctx *ctx;   /* not owned */
} rig;

/* Opens r: a block pool for m's cache (centered as co asks, which may run
 * the calibration once per process) and agents of n_ctx positions in
 * formats fk/fv, their turns on ctx. Returns 0, or -1 with err set (r is
 * then closed). */
static int rig_open(rig *r, const ak_model *m, ak_ctx *ctx, const ak_tokenizer *tk, const cache_opts *co, int n_ctx,
                    ak_error *err) {
    memset(r, 0, sizeof *r);
    r->ctx = ctx;
    if (!(r->pool = ak_block_pool_new(&m->spec, co->block_tokens, co->budget, err))) return -1;
    if (cache_center(co, ctx, tk, r->pool, "bench pools") < 0) {
        ak_block_pool_free(r->pool);
        r->pool = NULL;
        return ak_fail(err, "calibration failed");
    }
    ak_agents_config ac = {.model = m, .pool = r->pool, .fk = co->fk, .fv = co->fv, .n_ctx = n_ctx,
                           .save = AK_SAVE_ON_SHUTDOWN};
    if (!(r->ag = ak_agents_new(&ac, err))) {
        ak_block_pool_free(r->pool);
        r->pool = NULL;
        return -1;
    }
    return 0;
}

/* Frees the agents and then the block pool. A zeroed rig is fine. */
static void rig_close(rig *r) {
    ak_agents_free(r->ag);
    ak_block_pool_free(r->pool);
    memset(r, 0, sizeof *r);
}

/* Bytes of blocks in use in r's block pool. */
static size_t rig_used(rig *r) {
    ak_block_pool_stats st;
    ak_block_pool_get_stats(r->pool, &st);
    return st.used;
}

/* A first turn: agent id with prompt toks[0..n), attached to pool pool_id
 * (NULL: none), with a progress bar labelled `label` (NULL: none). */
typedef struct {
    const char *id, *pool_id;
    const int32_t *toks;
    int n;
    const char *label;
} pturn;

/* First turn q of r, as ak_agent_begin runs a turn: open (match, attach,
 * link, make room), prefill the tokens the cache lacks, commit, end.
 * logits gets the next-token logits; *ms the time of the whole turn up to
 * the logits (the commit and end included: a server answers after them)
 * and *cpu (may be NULL) the CPU time it took, all threads; *t the turn.
 * Returns 0, or -1 with err set. */
static int first_turn(rig *r, const pturn *q, float *logits, double *ms, double *cpu, ak_turn *t, ak_error *err) {
    ak_ctx *ctx = r->ctx;
    const char *id = q->id, *pool_id = q->pool_id, *label = q->label;
    const int32_t *toks = q->toks;
    const int n = q->n;
    ak_kv *kv;
    progress pg;
    if (label) progress_init(&pg, label);
    double c0 = bench_cpu_ms(), t0 = ak_now();
    if (ak_agent_open(r->ag, &(ak_turn_opts){.id = id, .pool_id = pool_id, .tokens = toks, .n = n, .n_reserve = n},
                      &kv, t, err) < 0) {
        if (label) progress_done(&pg);
        return -1;
    }
    if (ak_eval(ctx, kv, &(ak_eval_args){.tokens = toks + t->reused, .n = t->prefilled, .pos0 = t->reused,
                .logits = logits, .progress = label ? progress_update : NULL, .ud = label ? &pg : NULL}, err) < 0) {
        if (label) progress_done(&pg);
        ak_agent_abort(r->ag, id);
        return -1;
    }
    if (ak_agent_commit(r->ag, id, toks, n, err) < 0 || ak_agent_end(r->ag, id, err) < 0) {
        if (label) progress_done(&pg);
        return -1;
    }
    *ms = (ak_now() - t0) * 1e3;
    if (cpu) *cpu = bench_cpu_ms() - c0;
    if (label) progress_done(&pg);
    return 0;
}

/* ak_agent_info of agent id into *out. Returns 0, or -1 if unknown. */
static int agent_info(rig *r, const char *id, ak_agent_info *out) {
    int i = ak_agents_find(r->ag, id);
    if (i < 0) return -1;
    ak_agents_get(r->ag, i, out);
    return 0;
}

/* Largest |a[i] - b[i]| over n floats: 0 when every pair is equal, 1e30
 * when a pair holds a NaN (which equals nothing). */
static double max_abs_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - (double)b[i]);
        if (x != x) x = 1e30;
        if (x > d) d = x;
    }
    return d;
}

/* One decode step of B sequences: token tok[s] at position pos for each
 * sequence kvs[s], one ak_forward; logits into rows (B x vocab). Returns
 * its seconds, or -1 with err set. */
static double step(ak_ctx *ctx, ak_kv **kvs, int B, const int32_t *tok, int pos, float *rows, int vocab,
                   ak_error *err) {
    int32_t p[256];
    float *out[256];
    for (int s = 0; s < B; s++) {
        p[s] = pos;
        out[s] = rows + (size_t)s * vocab;
    }
    ak_batch b = {.n = B, .token = tok, .pos = p, .seq = kvs, .logits_out = out};
    double t0 = ak_now();
    if (ak_forward(ctx, &b, err) < 0) return -1;
    return ak_now() - t0;
}

/* Two sets of B sequences, pooled[] and priv[], each sequence holding
 * positions [0, n - 1) of its prompt prompts[s], to decode feeding
 * gen[s][0..n_gen); rows: B x vocab floats of scratch. */
typedef struct {
    ak_kv **pooled, **priv;
    int B;
    int32_t **prompts;
    int n;
    int32_t **gen;
    int n_gen, vocab;
    float *rows;
} side_by_side;

/* What decode_side_by_side measured: the sums of each set's steps' times,
 * ratios[i] step i's private time over its pooled time (n_gen of them), and
 * fp/lp, fv/lv (B x vocab each) the logits of the first and last timed
 * steps of the pooled and the private set. */
typedef struct {
    double sec_pooled, sec_priv;
    double *ratios;
    float *fp, *lp, *fv, *lv;
} side_by_side_out;

/* Decodes the two sets of d side by side: first the prompts' last tokens
 * (untimed: it gives every sequence the start a turn has), then n_gen
 * steps, each step run for one set and then the other (which first
 * alternates), each timed alone: on a machine shared with other work, the
 * load of the moment falls on both alike. Results into *o. Returns 0, or -1
 * with err set. */
static int decode_side_by_side(ak_ctx *ctx, const side_by_side *d, side_by_side_out *o, ak_error *err) {
    ak_kv **pooled = d->pooled, **priv = d->priv;
    int32_t **prompts = d->prompts, **gen = d->gen;
    const int B = d->B, n = d->n, n_gen = d->n_gen, vocab = d->vocab;
    float *rows = d->rows, *fp = o->fp, *lp = o->lp, *fv = o->fv, *lv = o->lv;
    double *sec_pooled = &o->sec_pooled, *sec_priv = &o->sec_priv, *ratios = o->ratios;
    int32_t tok[256];
    if (B > 256) return ak_failc(err, AK_ERR_INVALID, "too many sequences");
    size_t row_bytes = sizeof(float) * (size_t)B * vocab;
    for (int s = 0; s < B; s++) tok[s] = prompts[s][n - 1];
    if (step(ctx, pooled, B, tok, n - 1, rows, vocab, err) < 0 || step(ctx, priv, B, tok, n - 1, rows, vocab, err) < 0)
        return -1;
    *sec_pooled = *sec_priv = 0;
    for (int i = 0; i < n_gen; i++) {
        for (int s = 0; s < B; s++) tok[s] = gen[s][i];
        double t[2];
        for (int k = 0; k < 2; k++) {
            int is_pooled = (k == 0) == (i % 2 == 0);
            t[is_pooled] = step(ctx, is_pooled ? pooled : priv, B, tok, n + i, rows, vocab, err);
            if (t[is_pooled] < 0) return -1;
            if (i == 0) memcpy(is_pooled ? fp : fv, rows, row_bytes);
            if (i == n_gen - 1) memcpy(is_pooled ? lp : lv, rows, row_bytes);
        }
        *sec_pooled += t[1];
        *sec_priv += t[0];
        ratios[i] = t[0] / t[1];
    }
    return 0;
}

/* Everything measured, for the report. */
typedef struct {
    int n_list, list[MAX_LIST];
    size_t pooled[MAX_LIST];      /* block pool .used with the pool and N agents */
    size_t content[MAX_LIST];     /* .used with N private agents sharing through the index */
    uint64_t linked[MAX_LIST];    /* blocks linked by those agents (ak_share_stats) */
    size_t own_sum[MAX_LIST];     /* sum of the pooled agents' private_bytes */
    size_t pool_bytes;            /* .used with the pool alone */
    size_t private_one;           /* .used with one private agent of document + suffix alone */
    size_t agent_bytes, agent_private;   /* pooled agent 0's ak_agent_info bytes / private_bytes */
    double bpt, bpt_f16;          /* bytes per token: the formats', f16's */
    int block_tokens;
    size_t block_bytes;           /* one block in the formats (ak_block_pool_block_bytes) */
    double pool_ms;               /* the pool's prefill (ak_pool_create) */
    /* first turns, medians over --ttft-reps of a private prefill, then in
     * the same rep a pooled agent and a linked one with the same prompt
     * (wall and CPU ms; ratios: medians of each rep's ratio) */
    double ttft_pooled, ttft_private, ttft_linked, ttft_ratio;
    double cpu_pooled, cpu_private, cpu_linked, cpu_ratio;
    double ttft_attach;           /* median of the pooled first turns while agents were added */
    double logits_diff;           /* pooled agent 0 vs private agent 0, first-turn logits */
    double dec_pooled, dec_private, dec_ratio;       /* medians over runs (ratio: each run's) */
    double dec_step_ratio;        /* median over every step of private time / pooled time */
    double dec_diff;              /* pooled vs private decode logits */
    int dec_private_ok;           /* every private copy holds all its bytes alone */
    int ttft_reps, reps, B, n_gen;
} results;

/* Prints the tables to stdout (json = NULL) or one JSON object to json. */
static void report(const results *R, const ak_model *m, const char *model_path, const cache_opts *co, int P, int S,
                   int nt, FILE *json) {
    const char *fk = ak_kv_format_get(co->fk)->name, *fv = ak_kv_format_get(co->fv)->name;
    const char *wt = gguf_tensor_type_name(m->layers[0].wq.type);
    if (json) {
        fprintf(json, "{\"model\": \"%s\", \"weight_type\": \"%s\", \"threads\": %d, \"pool_tokens\": %d, \"suffix\": %d, "
               "\"cache_type_k\": \"%s\", \"cache_type_v\": \"%s\", \"block_tokens\": %d, \"bytes_per_token\": %.1f, "
               "\"pool_bytes\": %zu, \"pool_prefill_ms\": %.1f, \"private_agent_bytes\": %zu, "
               "\"pooled_agent_bytes\": %zu, \"pooled_agent_private_bytes\": %zu, \"memory\": [",
               model_path, wt, nt, P, S, fk, fv, R->block_tokens, R->bpt, R->pool_bytes,
               R->pool_ms, R->private_one, R->agent_bytes, R->agent_private);
        for (int i = 0; i < R->n_list; i++) {
            int N = R->list[i];
            double floor = ((double)P + (double)N * S) * R->bpt, priv = (double)N * R->private_one;
            fprintf(json, "%s{\"agents\": %d, \"pooled_bytes\": %zu, \"private_copies_bytes\": %.0f, \"floor_bytes\": %.0f, "
                   "\"pooled_over_floor\": %.4f, \"private_over_pooled\": %.3f, \"f16_private_copies_bytes\": %.0f, "
                   "\"agents_own_bytes\": %zu, \"content_index_bytes\": %zu, \"content_index_linked_blocks\": %llu}",
                   i ? ", " : "", N, R->pooled[i], priv, floor, R->pooled[i] / floor, priv / R->pooled[i],
                   (double)N * (P + S) * R->bpt_f16, R->own_sum[i], R->content[i], (unsigned long long)R->linked[i]);
        }
        fprintf(json, "], \"ttft_pooled_ms\": %.2f, \"ttft_private_ms\": %.2f, \"ttft_ratio\": %.2f, "
               "\"ttft_content_linked_ms\": %.2f, \"cpu_pooled_ms\": %.2f, \"cpu_private_ms\": %.2f, "
               "\"cpu_ratio\": %.2f, \"cpu_content_linked_ms\": %.2f, \"ttft_pooled_while_adding_ms\": %.2f, "
               "\"ttft_reps\": %d, \"first_logits_max_diff\": %g, "
               "\"decode_agents\": %d, \"decode_tokens\": %d, \"decode_reps\": %d, \"decode_pooled_tok_s\": %.3f, "
               "\"decode_private_tok_s\": %.3f, \"decode_ratio\": %.3f, \"decode_step_ratio\": %.3f, "
               "\"decode_logits_max_diff\": %g, "
               "\"private_copies_unshared\": %s}\n",
               R->ttft_pooled, R->ttft_private, R->ttft_ratio, R->ttft_linked, R->cpu_pooled, R->cpu_private,
               R->cpu_ratio, R->cpu_linked, R->ttft_attach, R->ttft_reps, R->logits_diff, R->B,
               R->n_gen, R->reps, R->dec_pooled, R->dec_private, R->dec_ratio, R->dec_step_ratio, R->dec_diff,
               R->dec_private_ok ? "true" : "false");
        return;
    }
    const double MB = 1e6;
    printf("\npools: %s (%s weights, %d threads), K %s / V %s, %.0f bytes per token (computed from the formats;\n"
           "a block of %d tokens is %zu bytes%s), pool of %d tokens (%.2f MB, prefilled once in %.1f s), each agent\n"
           "%d tokens of its own\n",
           model_path, wt, nt, fk, fv, R->bpt, R->block_tokens, R->block_bytes,
           (double)R->block_bytes == R->block_tokens * R->bpt ? " = tokens x bytes per token" : ", NOT tokens x bytes per token",
           P, R->pool_bytes / MB, R->pool_ms / 1e3, S);
    printf("one private agent of %d tokens: %.2f MB (measured alone); a pooled agent reads %.2f MB and holds %.2f MB "
           "alone (ak_agent_info)\n\n",
           P + S, R->private_one / MB, R->agent_bytes / MB, R->agent_private / MB);
    printf("%4s %12s %12s %12s %12s %10s %14s | %12s %s\n", "N", "pooled_MB", "private_MB", "floor_MB", "pooled/floor",
           "priv/pool", "f16_private_MB", "index_MB", "(no pool: content index)");
    for (int i = 0; i < R->n_list; i++) {
        int N = R->list[i];
        double floor = ((double)P + (double)N * S) * R->bpt, priv = (double)N * R->private_one;
        printf("%4d %12.2f %12.2f %12.2f %12.4f %9.2fx %14.2f | %12.2f %s\n", N, R->pooled[i] / MB, priv / MB,
               floor / MB, R->pooled[i] / floor, priv / R->pooled[i], (double)N * (P + S) * R->bpt_f16 / MB,
               R->content[i] / MB, R->pooled[i] / floor <= 1.05 ? "" : "(pooled/floor above the 1.05 goal)");
    }
    printf("pooled = block pool bytes in use (pool + agents); private = N x one private agent; floor = (pool tokens\n"
           "+ N x suffix) x bytes per token; f16_private = N private f16 copies, computed; index = N agents each\n"
           "prefilling document + suffix without a pool, full blocks linked through the content index.\n");
    printf("PolyKV (paper): 3 and 10 agents both cost 0.116 GB at 2K tokens (pool only, flat in N); 15 agents at\n"
           "4K tokens of Llama-3-8B: 19.8 GB of f16 copies -> 0.45 GB (-97.7%%). Here at N = %d: %.4f GB, -%.1f%% vs\n"
           "same-format private copies, -%.1f%% vs f16 private copies.\n\n",
           R->list[R->n_list - 1], R->pooled[R->n_list - 1] / 1e9,
           100 * (1 - R->pooled[R->n_list - 1] / ((double)R->list[R->n_list - 1] * R->private_one)),
           100 * (1 - R->pooled[R->n_list - 1] / ((double)R->list[R->n_list - 1] * (P + S) * R->bpt_f16)));
    printf("first turn (TTFT: open + prefill + commit, to the first token's logits), median of %d rep(s), each a\n"
           "private prefill and right after it a linked and a pooled agent with the same new prompt:\n"
           "%49s %12s %12s\n"
           "  pooled agent (its %4d tokens prefilled)        %12.2f %12.2f\n"
           "  private agent (%5d tokens prefilled)          %12.2f %12.2f\n"
           "  no pool, the document's full blocks linked      %12.2f %12.2f\n"
           "  ratio private / pooled (median of reps' ratios) %11.1fx %11.1fx\n"
           "  (pooled first turns while agents 1..%d were added: median %.2f ms)\n"
           "  first-token logits, pooled vs private agent: max |diff| %g%s\n\n",
           R->ttft_reps, "", "wall_ms", "cpu_ms", S, R->ttft_pooled, R->cpu_pooled, P + S, R->ttft_private,
           R->cpu_private, R->ttft_linked, R->cpu_linked, R->ttft_ratio, R->cpu_ratio, R->list[R->n_list - 1],
           R->ttft_attach, R->logits_diff,
           R->logits_diff == 0 ? " (bit-identical)"
                               : "\n  (not bit-identical when the pool's end is not a block boundary: attention sums\n"
                                 "  blocks in another order there, and a last-bit difference can flip a quantized code,\n"
                                 "  of the cache or of the activations that quantized weights multiply)");
    printf("decode, %d agents together (one forward of %d tokens per step), %d steps a run, each step run for the\n"
           "pooled agents and for their private copies one right after the other, median of %d runs:\n"
           "  pooled (sharing the pool's blocks)     %10.2f tok/s\n"
           "  private copies (same bits, own memory) %10.2f tok/s%s\n"
           "  ratio pooled / private: median of the runs' %.3f, of every step's %.3f\n"
           "  logits pooled vs private: max |diff| %g%s\n",
           R->B, R->B, R->n_gen, R->reps, R->dec_pooled, R->dec_private,
           R->dec_private_ok ? "" : " (WARNING: some copy still shares blocks)", R->dec_ratio, R->dec_step_ratio,
           R->dec_diff, R->dec_diff == 0 ? " (bit-identical)" : "");
}

/* What bench pools was asked: its flags. */
typedef struct {
    const char *model_path, *json_out;
    int P, S;                     /* the pool's tokens, each agent's own */
    int B, n_gen, reps;           /* decode: agents, tokens, runs */
    int ttft_reps, n_threads, json;
    int n_list, list[MAX_LIST];   /* --agents */
    cache_opts co;
} pools_opts;

/* Parses argv into o. Returns -1 when the bench should run, else its exit
 * code: 0 after --help, AK_EXIT_USAGE after a usage error (printed). */
static int pools_parse(int argc, char **argv, pools_opts *o) {
    ak_args a;
    args_init(&a, "bench pools", argc, argv);
    *o = (pools_opts){.P = 4096, .S = 64, .B = 8, .n_gen = 32, .reps = 3, .ttft_reps = 3, .n_list = 5,
                      .list = {1, 2, 4, 8, 16}};
    cache_opts_init(&o->co);
    o->co.fk = AK_KV_Q8;   /* a pool's default formats (agent.h) */
    o->co.fv = AK_KV_TQ3;
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) o->model_path = args_value(&a, f);
        else if (!strcmp(f, "--pool-tokens")) o->P = (int)args_int(&a, f, 1, 1 << 20);
        else if (!strcmp(f, "--suffix")) o->S = (int)args_int(&a, f, 1, 1 << 20);
        else if (!strcmp(f, "--decode-agents")) o->B = (int)args_int(&a, f, 1, 256);
        else if (!strcmp(f, "--decode-tokens")) o->n_gen = (int)args_int(&a, f, 1, 1 << 16);
        else if (!strcmp(f, "--reps")) o->reps = (int)args_int(&a, f, 1, 100);
        else if (!strcmp(f, "--ttft-reps")) o->ttft_reps = (int)args_int(&a, f, 1, 100);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) o->n_threads = (int)args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--json")) o->json = 1;
        else if (!strcmp(f, "--json-out")) o->json_out = args_value(&a, f);
        else if (!strcmp(f, "--agents")) {
            const char *v = args_value(&a, f);
            if (v) o->n_list = args_int_list(&a, f, v, 1, 256, o->list, MAX_LIST);
        } else if (!cache_opts_parse(&o->co, &a, f)) args_unknown(&a, f);
    }
    if (!a.failed && !o->model_path) args_error(&a, "-m MODEL is required");
    int max_n = 0;
    for (int i = 0; i < o->n_list; i++) {
        if (i > 0 && o->list[i] <= o->list[i - 1]) args_error(&a, "--agents must increase (agents are added one at a time)");
        if (o->list[i] > max_n) max_n = o->list[i];
    }
    if (!a.failed && o->B > max_n)
        args_error(&a, "--decode-agents %d is more than the largest of --agents (%d)", o->B, max_n);
    return a.failed ? AK_EXIT_USAGE : -1;
}

/* A pools run's state: what it was asked, the model and context, the
 * prompts (the document and each agent's suffix) and fed tokens, the two
 * rigs, the results, and the buffers the phases share. */
typedef struct {
    const pools_opts *o;
    const ak_model *m;
    const ak_tokenizer *tok;
    ak_ctx *ctx;
    int vocab, n, n_ctx, max_n;   /* n: a prompt's tokens (pool + suffix) */
    results R;
    rig pooled, priv;
    ak_rng rng;
    int32_t **prompts;            /* max_n of n tokens */
    int32_t **gen;                /* B of n_gen tokens */
    ak_kv **copies, **kvs;        /* B each */
    double *ttft_p;               /* max_n */
    double *tt;                   /* 8 x ttft_reps */
    int32_t *fresh;               /* n */
    double *dp, *dv, *dr, *step_ratio;
    float *logits_pool, *logits_priv, *rows, *fp, *lp, *fv, *lv;
} pools_run;

/* 1. The pool, prefilled once; agents attached one at a time: its size,
 * the memory with N agents, the pooled first turns. Returns 0, or -1 with
 * err set. */
static int pools_attach(pools_run *X, ak_error *err) {
    const pools_opts *o = X->o;
    const int P = o->P, S = o->S, n = X->n, n_ctx = X->n_ctx, max_n = X->max_n, vocab = X->vocab, json = o->json;
    const cache_opts *co = &o->co;
    const ak_model *m = X->m;
    ak_ctx *ctx = X->ctx;
    rig *pooled = &X->pooled;
    results *R = &X->R;
    int32_t **prompts = X->prompts;
    double *ttft_p = X->ttft_p;
    float *logits_pool = X->logits_pool, *logits_priv = X->logits_priv;
    if (rig_open(pooled, m, ctx, X->tok, co, n_ctx, err) < 0) return -1;
    {
        progress pg;
        progress_init(&pg, "pool prefill");
        double t0 = ak_now();
        int r = ak_pool_create(pooled->ag, ctx, &(ak_pool_request){.id = POOL_ID, .tokens = prompts[0], .n = P,
                               .fk = co->fk, .fv = co->fv}, progress_update, &pg, err);
        R->pool_ms = (ak_now() - t0) * 1e3;
        progress_done(&pg);
        if (r < 0) return -1;
    }
    R->pool_bytes = rig_used(pooled);
    R->block_tokens = ak_block_pool_block_tokens(pooled->pool);
    R->block_bytes = ak_block_pool_block_bytes(pooled->pool, co->fk, co->fv);
    if (!json) fprintf(stderr, "  pool: %d tokens in %.1f s, %.2f MB\n", P, R->pool_ms / 1e3, R->pool_bytes / 1e6);
    for (int s = 0, li = 0; s < max_n; s++) {
        char id[32];
        snprintf(id, sizeof id, "pooled-%02d", s);
        ak_turn t;
        if (first_turn(pooled, &(pturn){.id = id, .pool_id = POOL_ID, .toks = prompts[s], .n = n}, logits_pool,
                       &ttft_p[s], NULL, &t, err) < 0) return -1;
        if (t.prefilled != S) {
            ak_failc(err, AK_ERR_GENERIC, "pooled agent %s prefilled %d tokens, not its %d", id, t.prefilled, S);
            return -1;
        }
        if (s == 0) {
            ak_agent_info info;
            if (agent_info(pooled, id, &info) < 0) { ak_fail(err, "agent %s vanished", id); return -1; }
            R->agent_bytes = info.bytes;
            R->agent_private = info.private_bytes;
            memcpy(logits_priv, logits_pool, sizeof(float) * vocab);   /* kept: compared with the private agent's */
        }
        if (li < R->n_list && s + 1 == R->list[li]) {
            R->pooled[li] = rig_used(pooled);
            size_t own = 0;
            for (int k = 0; k <= s; k++) {
                char kid[32];
                ak_agent_info info;
                snprintf(kid, sizeof kid, "pooled-%02d", k);
                if (agent_info(pooled, kid, &info) == 0) own += info.private_bytes;
            }
            R->own_sum[li] = own;
            if (!json)
                fprintf(stderr, "  N=%-3d pooled %.2f MB (agents' own bytes %.2f MB), first turn %.1f ms\n", s + 1,
                        R->pooled[li] / 1e6, own / 1e6, ttft_p[s]);
            li++;
        }
    }
    memcpy(logits_pool, logits_priv, sizeof(float) * vocab);   /* pooled agent 0's */
    R->ttft_attach = bench_median(ttft_p, max_n);
    return 0;
}

/* 2. Private agents, no pool, against linked and pooled ones: first
 * turns' times and the content index's memory. Returns 0, or -1 with err
 * set. */
static int pools_first_turns(pools_run *X, ak_error *err) {
    const int P = X->o->P, n = X->n, n_ctx = X->n_ctx, max_n = X->max_n, vocab = X->vocab, json = X->o->json;
    const int ttft_reps = X->o->ttft_reps;
    rig *pooled = &X->pooled, *priv = &X->priv;
    const ak_model *m = X->m;
    ak_ctx *ctx = X->ctx;
    const cache_opts *co = &X->o->co;
    results *R = &X->R;
    int32_t **prompts = X->prompts, *fresh = X->fresh;
    double *tt = X->tt;
    float *logits_pool = X->logits_pool, *logits_priv = X->logits_priv;
    ak_rng rng = X->rng;
    /* 2. private agents, no pool: each rep in a fresh block pool (nothing
     * to link), its private prefill followed by the first turns of a linked
     * agent (same pool) and of a pooled one, both with a new prompt (the
     * document and a suffix no one computed), so that the three share the
     * machine's load of the moment; the last rep goes on with the
     * content-index agents of the memory table first */
    double *tv = tt, *tp = tt + ttft_reps, *tl = tt + 2 * ttft_reps, *cv = tt + 3 * ttft_reps;
    double *cp = tt + 4 * ttft_reps, *cl = tt + 5 * ttft_reps, *rw = tt + 6 * ttft_reps, *rc_ = tt + 7 * ttft_reps;
    memcpy(fresh, prompts[0], sizeof(int32_t) * P);
    for (int r = 0; r < ttft_reps; r++) {
        rig_close(priv);
        if (rig_open(priv, m, ctx, X->tok, co, n_ctx, err) < 0) return -1;
        ak_turn t;
        char label[48], id[32];
        snprintf(label, sizeof label, "private prefill %d/%d", r + 1, ttft_reps);
        if (first_turn(priv, &(pturn){.id = "private-00", .toks = prompts[0], .n = n, .label = label}, logits_priv,
                       &tv[r], &cv[r], &t, err) < 0) return -1;
        if (t.prefilled != n) {
            ak_failc(err, AK_ERR_GENERIC, "the private agent prefilled %d tokens, not %d", t.prefilled, n);
            return -1;
        }
        R->private_one = rig_used(priv);
        if (r == 0) R->logits_diff = max_abs_diff(logits_pool, logits_priv, (size_t)vocab);
        if (!json)
            fprintf(stderr, "  private agent: %d tokens in %.1f s, %.2f MB\n", n, tv[r] / 1e3, R->private_one / 1e6);
        for (int s = 1, li = 0; r == ttft_reps - 1 && s <= max_n; s++) {
            if (s > 1) {
                snprintf(id, sizeof id, "private-%02d", s - 1);
                double ms;
                if (first_turn(priv, &(pturn){.id = id, .toks = prompts[s - 1], .n = n}, logits_priv, &ms, NULL, &t,
                               err) < 0) return -1;
            }
            if (li < R->n_list && s == R->list[li]) {
                ak_share_stats ss;
                ak_agents_share_stats(priv->ag, &ss);
                R->content[li] = rig_used(priv);
                R->linked[li] = ss.linked_blocks;
                if (!json)
                    fprintf(stderr, "  N=%-3d no pool, content index: %.2f MB (%llu blocks linked)\n", s,
                            R->content[li] / 1e6, (unsigned long long)ss.linked_blocks);
                li++;
            }
        }
        for (int i = P; i < n; i++) fresh[i] = (int32_t)(ak_rng_u32(&rng) % vocab);
        snprintf(id, sizeof id, "linked-%02d", r);
        if (first_turn(priv, &(pturn){.id = id, .toks = fresh, .n = n}, logits_priv, &tl[r], &cl[r], &t,
                       err) < 0) return -1;
        snprintf(id, sizeof id, "first-%02d", r);
        if (first_turn(pooled, &(pturn){.id = id, .pool_id = POOL_ID, .toks = fresh, .n = n}, logits_pool, &tp[r],
                       &cp[r], &t, err) < 0) return -1;
        rw[r] = tv[r] / tp[r];
        rc_[r] = cv[r] / cp[r];
        if (!json)
            fprintf(stderr, "  first turns: private %.1f ms, linked %.1f ms, pooled %.1f ms\n", tv[r], tl[r], tp[r]);
    }
    rig_close(priv);
    R->ttft_private = bench_median(tv, ttft_reps);
    R->ttft_pooled = bench_median(tp, ttft_reps);
    R->ttft_linked = bench_median(tl, ttft_reps);
    R->cpu_private = bench_median(cv, ttft_reps);
    R->cpu_pooled = bench_median(cp, ttft_reps);
    R->cpu_linked = bench_median(cl, ttft_reps);
    R->ttft_ratio = bench_median(rw, ttft_reps);
    R->cpu_ratio = bench_median(rc_, ttft_reps);
    X->rng = rng;
    return 0;
}

/* 3. Decode: B pooled agents and private copies of their caches, side by
 * side. Returns 0, or -1 with err set. */
static int pools_decode(pools_run *X, ak_error *err) {
    const int B = X->o->B, n_gen = X->o->n_gen, reps = X->o->reps, n = X->n, n_ctx = X->n_ctx, vocab = X->vocab;
    const int json = X->o->json;
    ak_ctx *ctx = X->ctx;
    rig *pooled = &X->pooled;
    results *R = &X->R;
    int32_t **prompts = X->prompts, **gen = X->gen;
    ak_kv **kvs = X->kvs, **copies = X->copies;
    double *dp = X->dp, *dv = X->dv, *dr = X->dr, *step_ratio = X->step_ratio;
    float *rows = X->rows, *fp = X->fp, *lp = X->lp, *fv = X->fv, *lv = X->lv;
    /* 3. decode: B pooled agents open a turn with their prompt (the cache
     * keeps n - 1 positions, the last is recomputed); private copies of
     * those caches are forks whose every block is then cloned. Both decode
     * the same fed tokens, step by step side by side. */
    R->dec_private_ok = 1;
    R->dec_diff = 0;
    for (int r = 0; r < reps; r++) {
        for (int s = 0; s < B; s++) {
            char id[32];
            snprintf(id, sizeof id, "pooled-%02d", s);
            ak_turn t;
            if (ak_agent_open(pooled->ag, &(ak_turn_opts){.id = id, .pool_id = POOL_ID, .tokens = prompts[s], .n = n,
                              .n_reserve = n_ctx}, &kvs[s], &t, err) < 0)
                return -1;
            if (ak_kv_length(kvs[s]) != n - 1) {
                ak_failc(err, AK_ERR_GENERIC, "agent %s reopened with %d positions, not %d", id, ak_kv_length(kvs[s]),
                         n - 1);
                return -1;
            }
            if (!(copies[s] = ak_kv_fork(kvs[s], err)) || ak_kv_prepare(copies[s], 0, n - 1, err) < 0) return -1;
            if (ak_kv_private_bytes(copies[s]) != ak_kv_bytes(copies[s])) R->dec_private_ok = 0;
        }
        const side_by_side d = {.pooled = kvs, .priv = copies, .B = B, .prompts = prompts, .n = n, .gen = gen,
                                .n_gen = n_gen, .vocab = vocab, .rows = rows};
        side_by_side_out so = {.ratios = step_ratio + (size_t)r * n_gen, .fp = fp, .lp = lp, .fv = fv, .lv = lv};
        if (decode_side_by_side(ctx, &d, &so, err) < 0) return -1;
        const double sp = so.sec_pooled, sv = so.sec_priv;
        dp[r] = (double)B * n_gen / sp;
        dv[r] = (double)B * n_gen / sv;
        dr[r] = sv / sp;
        double d1 = max_abs_diff(fp, fv, (size_t)B * vocab), d2 = max_abs_diff(lp, lv, (size_t)B * vocab);
        if (d1 > R->dec_diff) R->dec_diff = d1;
        if (d2 > R->dec_diff) R->dec_diff = d2;
        if (!json)
            fprintf(stderr, "  decode run %d/%d: pooled %.2f tok/s, private %.2f tok/s\n", r + 1, reps, dp[r], dv[r]);
        for (int s = 0; s < B; s++) {
            ak_kv_free(copies[s]);
            copies[s] = NULL;
            /* the agent's history is the prompt and what it decoded */
            int32_t *all = malloc(sizeof(int32_t) * (size_t)(n + n_gen));
            char id[32];
            snprintf(id, sizeof id, "pooled-%02d", s);
            if (!all) { ak_fail(err, "out of memory"); return -1; }
            memcpy(all, prompts[s], sizeof(int32_t) * n);
            memcpy(all + n, gen[s], sizeof(int32_t) * n_gen);
            int cr = ak_agent_commit(pooled->ag, id, all, n + n_gen, err);
            free(all);
            if (cr < 0 || ak_agent_end(pooled->ag, id, err) < 0) return -1;
        }
    }
    R->dec_pooled = bench_median(dp, reps);
    R->dec_private = bench_median(dv, reps);
    R->dec_ratio = bench_median(dr, reps);
    R->dec_step_ratio = bench_median(step_ratio, reps * n_gen);
    return 0;
}

/* agentkv bench pools: parses the flags; measures the pool and its agents'
 * memory and first turns, private agents against linked and pooled ones,
 * and decoding side by side; reports. Returns the exit code. */
int cmd_bench_pools(int argc, char **argv) {
    pools_opts o;
    int prc = pools_parse(argc, argv, &o);
    if (prc >= 0) return prc;
    const int P = o.P, S = o.S, B = o.B, n_gen = o.n_gen, reps = o.reps, ttft_reps = o.ttft_reps, json = o.json;
    int max_n = 0;
    for (int i = 0; i < o.n_list; i++)
        if (o.list[i] > max_n) max_n = o.list[i];
    loaded_model lm;
    if (load_model(&lm, "bench pools", o.model_path) < 0) return 1;
    const ak_model *m = lm.model;
    const int vocab = m->cfg.vocab, n = P + S, n_ctx = n + n_gen + 1;
    if (n_ctx > m->spec.n_ctx) {
        fprintf(stderr, "agentkv bench pools: %d pool + %d suffix + %d decoded tokens exceed the model's context %d\n", P,
                S, n_gen + 1, m->spec.n_ctx);
        unload_model(&lm);
        return AK_EXIT_USAGE;
    }
    ak_error err = {{0}};
    int rc = 1;
    pools_run X = {.o = &o, .m = m, .tok = lm.tok, .vocab = vocab, .n = n, .n_ctx = n_ctx, .max_n = max_n};
    results *R = &X.R;
    R->n_list = o.n_list;
    memcpy(R->list, o.list, sizeof o.list);
    X.copies = calloc((size_t)B, sizeof *X.copies);
    X.kvs = calloc((size_t)B, sizeof *X.kvs);
    X.prompts = calloc((size_t)max_n, sizeof *X.prompts);
    X.gen = calloc((size_t)B, sizeof *X.gen);
    X.ttft_p = calloc((size_t)max_n, sizeof(double));
    /* per ttft rep: wall and CPU of the private, pooled, linked turns, and the two ratios */
    X.tt = calloc((size_t)ttft_reps * 8, sizeof(double));
    X.fresh = malloc(sizeof(int32_t) * (size_t)n);   /* each rep's new prompt */
    X.dp = calloc((size_t)reps, sizeof(double));
    X.dv = calloc((size_t)reps, sizeof(double));
    X.dr = calloc((size_t)reps, sizeof(double));
    X.step_ratio = calloc((size_t)reps * n_gen, sizeof(double));
    X.logits_pool = malloc(sizeof(float) * vocab);
    X.logits_priv = malloc(sizeof(float) * vocab);
    X.rows = malloc(sizeof(float) * (size_t)B * vocab);
    X.fp = malloc(sizeof(float) * (size_t)B * vocab);
    X.lp = malloc(sizeof(float) * (size_t)B * vocab);
    X.fv = malloc(sizeof(float) * (size_t)B * vocab);
    X.lv = malloc(sizeof(float) * (size_t)B * vocab);
    X.ctx = ak_ctx_new(m, 512, o.n_threads, &err);
    int ok = X.copies && X.kvs && X.prompts && X.gen && X.ttft_p && X.tt && X.fresh && X.dp && X.dv && X.dr &&
             X.step_ratio && X.logits_pool && X.logits_priv && X.rows && X.fp && X.lp && X.fv && X.lv;
    for (int i = 0; ok && i < max_n; i++) ok = (X.prompts[i] = malloc(sizeof(int32_t) * (size_t)n)) != NULL;
    for (int i = 0; ok && i < B; i++) ok = (X.gen[i] = malloc(sizeof(int32_t) * (size_t)n_gen)) != NULL;
    if (!X.ctx) goto fail;
    if (!ok) { ak_fail(&err, "out of memory"); goto fail; }
    const int nt = ak_threads_size(ak_ctx_pool(X.ctx));
    R->bpt = bytes_per_token(&m->spec, o.co.fk, o.co.fv);
    R->bpt_f16 = bytes_per_token(&m->spec, AK_KV_F16, AK_KV_F16);
    R->ttft_reps = ttft_reps;
    R->reps = reps;
    R->B = B;
    R->n_gen = n_gen;

    /* the document (every prompt's start), each agent's suffix, the fed tokens */
    int32_t **prompts = X.prompts;
    ak_rng_seed(&X.rng, 7);
    for (int i = 0; i < P; i++) prompts[0][i] = (int32_t)(ak_rng_u32(&X.rng) % vocab);
    for (int s = 0; s < max_n; s++) {
        if (s) memcpy(prompts[s], prompts[0], sizeof(int32_t) * P);
        for (int i = P; i < n; i++) prompts[s][i] = (int32_t)(ak_rng_u32(&X.rng) % vocab);
    }
    for (int s = 0; s < B; s++)
        for (int i = 0; i < n_gen; i++) X.gen[s][i] = (int32_t)(ak_rng_u32(&X.rng) % vocab);
    if (!json)
        fprintf(stderr, "bench pools: %s, %d threads, K %s / V %s, pool %d tokens, suffix %d, up to %d agents\n",
                o.model_path, nt, ak_kv_format_get(o.co.fk)->name, ak_kv_format_get(o.co.fv)->name, P, S, max_n);
    if (pools_attach(&X, &err) < 0 || pools_first_turns(&X, &err) < 0 || pools_decode(&X, &err) < 0) goto fail;
    if (json) report(R, m, o.model_path, &o.co, P, S, nt, stdout);
    else {
        report(R, m, o.model_path, &o.co, P, S, nt, NULL);
        if (o.json_out) {
            FILE *jf = fopen(o.json_out, "w");
            if (!jf) { ak_fail(&err, "cannot write %s", o.json_out); goto fail; }
            report(R, m, o.model_path, &o.co, P, S, nt, jf);
            if (fclose(jf) != 0) { ak_fail(&err, "cannot write %s", o.json_out); goto fail; }
        }
    }
    fflush(stdout);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "agentkv bench pools: %s\n", err.msg[0] ? err.msg : "failed");
done:
    for (int s = 0; X.copies && s < B; s++) ak_kv_free(X.copies[s]);
    rig_close(&X.priv);
    rig_close(&X.pooled);
    ak_ctx_free(X.ctx);
    for (int i = 0; X.prompts && i < max_n; i++) free(X.prompts[i]);
    for (int i = 0; X.gen && i < B; i++) free(X.gen[i]);
    free(X.copies); free(X.kvs); free(X.prompts); free(X.gen); free(X.ttft_p); free(X.tt); free(X.fresh);
    free(X.dp); free(X.dv); free(X.dr); free(X.step_ratio); free(X.logits_pool); free(X.logits_priv); free(X.rows);
    free(X.fp); free(X.lp); free(X.fv); free(X.lv);
    unload_model(&lm);
    return rc;
}
