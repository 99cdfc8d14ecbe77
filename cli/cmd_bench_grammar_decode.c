/* cmd_bench_grammar_decode.c - agentkv bench grammar --decode MODEL: what a
 * JSON-Schema constraint costs a real decode. B sequences decode together
 * (one forward pass of B tokens a step, the model's own logits), each
 * through its generator (generate.h): free, or held to the bench schema
 * (mask, pick, budget check, matcher) by a grammar compiled and masked
 * once. A sequence that ends (the document finished, or its max_tokens)
 * gets a new generator and goes on at the next position, so the batch stays
 * full and both modes run the same forward passes at the same positions. The two modes' steps alternate in one
 * run (a step of B free lanes, a step of B constrained ones), so that a
 * busy machine slows both alike. Reported: tokens/s of each mode (the
 * median of the repeats), their ratio, and the generation step's own time
 * per token. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "engine/model.h"
#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "text/generate.h"
#include "text/jsonschema.h"

#define DEC_PROMPT 16

/* What the runs share: the model, its context and pool, the constraint. */
typedef struct {
    loaded_model lm;
    ak_ctx *ctx;
    ak_block_pool *pool;
    ak_vocab_index *v;
    ak_grammar *g;
    ak_tokmask *tm;
    int n_gen;
} dec_env;

/* One sequence of a run. */
typedef struct {
    ak_kv *kv;
    ak_sampler *smp;
    ak_gen gen;
    float *logits;
    int32_t prompt[DEC_PROMPT];
    int32_t tok;
    int pos;
} lane;

/* (Re)starts lane l's generator; its cache goes on (every lane of both
 * modes is at the same position each step). Returns 0, or -1. */
static int lane_start(const dec_env *e, lane *l, int con, ak_error *err) {
    ak_gen_constraint c = {.grammar = e->g, .masks = e->tm, .vocab = e->v, .rule = -1};
    ak_gen_free(&l->gen);
    return ak_gen_init(&l->gen, &(ak_gen_opts){.tok = e->lm.tok, .smp = l->smp, .prompt = l->prompt,
                                               .n_prompt = DEC_PROMPT, .max_tokens = e->n_gen,
                                               .n_ctx = DEC_PROMPT + e->n_gen + 2, .stop_at_eog = 1,
                                               .constraint = con ? &c : NULL}, err);
}

/* One mode's B lanes and the arrays of its forward pass. */
typedef struct {
    lane *ls;
    int32_t *tok, *pos;
    ak_kv **seq;
    float **lg;
    double s, gen_s;          /* seconds of the mode's steps, of its generation steps */
    long sampled;
} mode_run;

static void mode_free(mode_run *r, int B) {
    for (int i = 0; r->ls && i < B; i++) {
        ak_gen_free(&r->ls[i].gen);
        ak_sampler_free(r->ls[i].smp);
        ak_kv_free(r->ls[i].kv);
        free(r->ls[i].logits);
    }
    free(r->ls);
    free(r->tok);
    free(r->pos);
    free(r->seq);
    free(r->lg);
}

/* Sets up B lanes (prompt prefilled, generator started), constrained or
 * not. Returns 0, or -1 with err set. */
static int mode_open(dec_env *e, mode_run *r, int B, int con, ak_error *err) {
    int V = e->lm.model->cfg.vocab;
    r->ls = calloc((size_t)B, sizeof *r->ls);
    r->tok = malloc(sizeof *r->tok * (size_t)B);
    r->pos = malloc(sizeof *r->pos * (size_t)B);
    r->seq = malloc(sizeof *r->seq * (size_t)B);
    r->lg = malloc(sizeof *r->lg * (size_t)B);
    if (!r->ls || !r->tok || !r->pos || !r->seq || !r->lg) return ak_fail(err, "out of memory");
    ak_sampler_params sp = ak_sampler_defaults();
    sp.temp = 0;
    for (int i = 0; i < B; i++) {
        lane *l = &r->ls[i];
        for (int k = 0; k < DEC_PROMPT; k++) l->prompt[k] = 1 + (int32_t)((i * 7919 + k * 104729) % (V - 1));
        if (!(l->kv = ak_kv_new(e->pool, AK_KV_F16, AK_KV_F16, DEC_PROMPT + e->n_gen + 2, err)) ||
            !(l->smp = ak_sampler_new(&sp, V, err)) || !(l->logits = ak_malloc(sizeof(float) * (size_t)V, err)))
            return -1;
        if (ak_eval(e->ctx, l->kv, &(ak_eval_args){.tokens = l->prompt, .n = DEC_PROMPT, .logits = l->logits}, err) < 0 ||
            lane_start(e, l, con, err) < 0)
            return -1;
        l->pos = DEC_PROMPT;
        r->seq[i] = l->kv;
        r->lg[i] = l->logits;
    }
    return 0;
}

/* One step of a mode: each lane's generation step, then one forward pass
 * of its B tokens, timed. Returns 0, or -1 with err set. */
static int mode_step(dec_env *e, mode_run *r, int B, int con, ak_error *err) {
    double t0 = ak_now();
    for (int i = 0; i < B; i++) {
        lane *l = &r->ls[i];
        ak_gen_out o;
        double g0 = ak_now();
        ak_gen_status st = ak_gen_step(&l->gen, l->logits, l->pos, &o, err);
        r->gen_s += ak_now() - g0;
        r->sampled += o.sampled;
        if (st == AK_GEN_ERROR) return -1;
        /* the token is fed whatever the end (an end of generation too): the
         * forward passes of both modes stay alike */
        l->tok = o.sampled ? o.tok : l->prompt[0];
        if (st != AK_GEN_MORE && lane_start(e, l, con, err) < 0) return -1;
        r->tok[i] = l->tok;
        r->pos[i] = l->pos;
    }
    ak_batch b = {.n = B, .token = r->tok, .pos = r->pos, .seq = r->seq, .logits_out = r->lg};
    if (ak_forward(e->ctx, &b, err) < 0) return -1;
    for (int i = 0; i < B; i++) r->ls[i].pos++;
    r->s += ak_now() - t0;
    return 0;
}

/* B lanes free and B constrained decode n steps, their steps interleaved
 * (the first alternating) so that the machine's load falls on both alike;
 * swap: the lanes set up first are the constrained ones (a repeat swaps
 * them: the set set up first runs a few percent slower even when both are
 * free). tps[m] the tokens/s of mode m (1: constrained) with its generation
 * steps, gen_us[m] its generation step's mean time per token. Returns 0,
 * or -1 with err set. */
static int decode_pair(dec_env *e, int B, int swap, double tps[2], double gen_us[2], ak_error *err) {
    mode_run r[2] = {{0}};
    int rc = -1;
    if (mode_open(e, &r[0], B, swap, err) < 0 || mode_open(e, &r[1], B, !swap, err) < 0) goto done;
    for (int s = 0; s < e->n_gen; s++)
        for (int k = 0; k < 2; k++) {
            int m = (s + k) % 2;
            if (mode_step(e, &r[m], B, m ^ swap, err) < 0) goto done;
        }
    for (int m = 0; m < 2; m++) {
        tps[m ^ swap] = (double)B * e->n_gen / r[m].s;
        gen_us[m ^ swap] = r[m].sampled ? r[m].gen_s / (double)r[m].sampled * 1e6 : 0;
    }
    rc = 0;
done:
    mode_free(&r[0], B);
    mode_free(&r[1], B);
    return rc;
}

/* Opens the model and compiles schema over its vocabulary (printing the
 * compile and mask times). Returns 0, or -1 having printed why. */
static int dec_open(dec_env *e, const char *model, const char *schema, int max_batch, int n_threads) {
    ak_error err = {{0}};
    ak_gram_error ge = {0};
    if (load_model(&e->lm, "bench grammar", model) < 0) return -1;
    if (!(e->ctx = ak_ctx_new(e->lm.model, max_batch > DEC_PROMPT ? max_batch : DEC_PROMPT, n_threads, &err)) ||
        !(e->pool = ak_block_pool_new(&e->lm.model->spec, 0, 0, &err))) {
        fprintf(stderr, "agentkv bench grammar: %s\n", err.msg);
        return -1;
    }
    double t0 = ak_now();
    if (!(e->v = ak_vocab_index_new(e->lm.tok, &ge)) ||
        !(e->g = ak_jsonschema_compile(schema, strlen(schema), NULL, &ge))) {
        fprintf(stderr, "agentkv bench grammar: %s\n", ge.msg);
        return -1;
    }
    double t1 = ak_now();
    if (!(e->tm = ak_tokmask_new(e->g, e->v, &ge))) {
        fprintf(stderr, "agentkv bench grammar: %s\n", ge.msg);
        return -1;
    }
    fprintf(stderr, "bench grammar --decode: %s, vocabulary %d, %d threads; schema compiled in %.1f ms, masks in %.0f ms\n",
            model, ak_vocab_index_size(e->v), ak_threads_size(ak_ctx_pool(e->ctx)), (t1 - t0) * 1e3,
            (ak_now() - t1) * 1e3);
    return 0;
}

static void dec_close(dec_env *e) {
    ak_tokmask_free(e->tm);
    ak_grammar_free(e->g);
    ak_vocab_index_free(e->v);
    ak_block_pool_free(e->pool);
    ak_ctx_free(e->ctx);
    if (e->lm.model) unload_model(&e->lm);
}

int bench_grammar_decode(const bench_decode_opts *o) {
    dec_env e = {.n_gen = o->n_gen};
    int max_b = 1, rc = 1;
    for (int i = 0; i < o->n_batch; i++)
        if (o->batch[i] > max_b) max_b = o->batch[i];
    if (dec_open(&e, o->model, o->schema, max_b, o->n_threads) < 0) goto done;
    printf("| batch | free tok/s | constrained tok/s | ratio | generation step free µs/token | constrained µs/token |\n");
    printf("|---|---|---|---|---|---|\n");
    for (int bi = 0; bi < o->n_batch; bi++) {
        double tp[2][16], gu[2][16];
        ak_error err = {{0}};
        for (int r = 0; r < o->reps; r++) {
            double t2[2], g2[2];
            if (decode_pair(&e, o->batch[bi], r % 2, t2, g2, &err) < 0) {
                fprintf(stderr, "agentkv bench grammar: %s\n", err.msg);
                goto done;
            }
            for (int m = 0; m < 2; m++) {
                tp[m][r] = t2[m];
                gu[m][r] = g2[m];
            }
        }
        double f = bench_median(tp[0], o->reps), c = bench_median(tp[1], o->reps);
        printf("| %d | %.2f | %.2f | %.3f | %.1f | %.1f |\n", o->batch[bi], f, c, c / f, bench_median(gu[0], o->reps),
               bench_median(gu[1], o->reps));
        fflush(stdout);
    }
    rc = 0;
done:
    dec_close(&e);
    return rc;
}
