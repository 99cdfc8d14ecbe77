/* cmd_bench_cards.c - agentkv bench cards: what handing a KV cache from
 * agent to agent as a CacheCard (cards.h, agent.h: CARDS) costs and loses,
 * in two modes of one command:
 *
 *   handoff (default): at each context length of --contexts, a sender agent
 *     prefills the context once (untimed for the ratios; it collects
 *     attention statistics, attnstats.h, as it goes). Then per rep, side by
 *     side: (a) export a card of the sender's whole context (uniform 8 bits,
 *     uniform 4 bits, importance 4 bits from the sender's statistics), import
 *     it into a fresh receiver (replace) and run the receiver's own short
 *     turn to its first token's logits; (c) a warm restore of the sender's
 *     agent file from the store plus the same turn. Once per context: (b) a
 *     receiver that re-prefills the context and the turn. Ratios (b)/(a) and
 *     (a)/(c). Also bytes per token of cards at each budget vs f16.
 *
 *   quality (--quality): on a trained model and a real text, a chain of 5
 *     agents A -> B -> C -> D -> E at the kv level (ak_card_make,
 *     ak_card_attach: exactly what an import "replace" does for a card cut at
 *     position 0): each agent runs its own segment of the text with an
 *     attention-statistics object attached (its own forward passes only),
 *     exports a card of its whole context under a budget and policy, the next
 *     attaches it and runs its own segment; E then runs a held-out segment.
 *     Mean KL divergence of E's next-token distributions and delta
 *     perplexity vs an f16 full prefill of the same text, per policy and
 *     budget; the adaptive policies under two allocations: the chain's
 *     (qopts_quality: measured errors, a floor, keys and values in one
 *     allocation) and bitalloc.h's defaults.
 *
 * Everything is measured in one process on one model; see
 * docs/cards-bench.md for the method and the figures.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agents/agent.h"
#include "engine/attnstats.h"
#include "agents/bitalloc.h"
#include "store/cards.h"
#include "text/sampler.h"
#include "args.h"
#include "commands.h"
#include "common.h"

int cmd_bench_cards(int argc, char **argv);

static const char *usage_text =
    "usage: agentkv bench cards -m MODEL [flags]            handoff TTFT (default)\n"
    "       agentkv bench cards --quality -m MODEL --text FILE [flags]\n"
    "  Handoff: at each context of --contexts a sender agent prefills the context once (with\n"
    "  attention statistics attached); then per rep, timed side by side: (a) export a card of\n"
    "  its whole context (uniform 8 bits, uniform 4 bits, importance 4 bits from the sender's\n"
    "  statistics) + import into a fresh receiver + the receiver's own turn of --turn tokens\n"
    "  to its first token; (c) a warm restore of the sender's agent file + the same turn;\n"
    "  once per context (b) a receiver re-prefilling context + turn. Ratios (b)/(a), (a)/(c).\n"
    "  Bytes per token of cards at budgets 3, 4, 6, 8, 16 vs f16 (first context).\n"
    "  Quality: a chain of 5 agents over a text (each adds its segment, exports a card of its\n"
    "  whole context, the next imports it); E then reads a held-out segment: mean KL and\n"
    "  delta perplexity vs an f16 prefill of the same text, per policy and budget.\n"
    "\n"
    "  -m, --model FILE        GGUF model (bench/cards.sh: a synthetic llama-1b, 8K context, for\n"
    "                          handoff; ../shared/models/tiny-llama-h64-gqa-f32.gguf for quality)\n"
    "  --contexts LIST         handoff context lengths (default 1024,4096,8192)\n"
    "  --turn N                the receiver's own turn, tokens (default 16)\n"
    "  --reps N                handoff and warm-restore reps per context, median (default 3)\n"
    "  --dir DIR               store directory for agent and card files (default\n"
    "                          ./agentkv-bench-cards; emptied of this run's files at the end)\n"
    "  --quality               the quality chain instead of the handoff\n"
    "  --text FILE             quality: the text (e.g. ../shared/golden/tiny-llama-h64/val.txt)\n"
    "  --tokens N              quality: tokens per window (default: the model's context - 24)\n"
    "  --windows N             quality: windows of the text, consecutive (default 4)\n"
    "  --budgets LIST          quality: average bits per token (default 3,4,6,8)\n"
    "  Quality, the adaptive rows' allocation ('chain'; rows 'default' always use bitalloc.h's defaults):\n"
    "  --errors measured|model each token's K/V error measured at each width (default) or 4^-w\n"
    "  --weight mix|mass|none  what I(t) is (default mass)   --mass-power X  its power (default 0.5)\n"
    "  --floor W               every token at least W bits when the budget pays it (default 4; 0 none)\n"
    "  --sinks N               first tokens pinned at 8 bits (default 0)\n"
    "  --key-weight X          one allocation over keys and values, a key's error weighing X a value's\n"
    "                          (default 0.1; 0: each side under its own budget)\n"
    "  --keep                  tokens handed in keep their widths\n"
    "  --legacy                the chain rows use bitalloc.h's defaults too\n"
    "  Diagnostics: --kv-shift D  every policy: keys budget + D, values budget - D;\n"
    "  --probe k|v:W:DEC       importance rows: all 4 bits but decile DEC (0..9) of each agent's own\n"
    "                          tokens by mass per query at W bits on keys or values\n"
    "  -t, --threads N         threads (default: all cores)\n"
    "  --json-out FILE         the tables on stdout and one JSON object into FILE\n"
    "  -ctk, -ctv F            the agents' own formats (default f16; the sender's cache and the\n"
    "                          agent file the warm restore reads)\n";

#define MAX_LIST 16
#define N_HOPS 5

/* ---- widths from attention statistics --------------------------------- */

/* How the quality chain's adaptive cards are allocated (flags of the
 * quality mode; docs/cards-bench.md, "Quality", says what each changes). */
typedef struct {
    int measured;                     /* each token's K/V error measured at each width (1) or the model 4^-w */
    ak_bitalloc_weighting weighting;  /* params' weighting: what I(t) is */
    double mass_power;                /* params' mass_power */
    int floor_bits;                   /* params' min_bits */
    int sinks;                        /* params' n_sinks */
    double key_weight;                /* params' key_weight (0: keys and values apart) */
    int keep;                         /* tokens handed in keep their widths (input keep_k / keep_v) */
    double kv_shift;                  /* every policy, diagnostics: keys get budget + kv_shift, values
                                         budget - kv_shift (0: both the budget) */
    int probe_side, probe_w, probe_dec; /* diagnostics: importance rows replaced by a probe (probe_side
                                         -1: none): every token 4 bits but decile probe_dec (0..9) of
                                         the agent's own tokens by mass per exposure, at probe_w on
                                         probe_side (0 keys, 1 values); tokens handed in keep theirs */
} qopts;

/* bitalloc.h's defaults (params_init): modeled errors, the four-feature
 * mix, 4 sinks at 8 bits, sides apart. The handoff's cards and the quality
 * table's "imp-model" rows. */
static qopts qopts_default(void) {
    ak_bitalloc_params bp;
    ak_bitalloc_params_init(&bp);
    qopts o = {.weighting = bp.weighting, .mass_power = bp.mass_power, .floor_bits = bp.min_bits, .sinks = bp.n_sinks,
               .key_weight = bp.key_weight, .probe_side = -1};
    return o;
}

/* The quality chain's allocation: measured errors under
 * ak_bitalloc_params_measured's options (I = m~^0.5, a 4-bit floor, no
 * sinks, keys and values in one allocation at key weight 0.1;
 * docs/cards-bench.md: what the data supported). */
static qopts qopts_quality(void) {
    ak_bitalloc_params bp;
    ak_bitalloc_params_init(&bp);
    ak_bitalloc_params_measured(&bp);
    qopts o = {.measured = 1, .weighting = bp.weighting, .mass_power = bp.mass_power, .floor_bits = bp.min_bits,
               .sinks = bp.n_sinks, .key_weight = bp.key_weight, .probe_side = -1};
    return o;
}

/* The probe of qopts (diagnostics): overwrites wk, wv for positions [0, n)
 * of kv. key[p]: the token's mass per exposure. */
static void probe_widths(const qopts *o, const ak_kv *kv, const double *mass, const double *expo, int n, uint8_t *wk,
                         uint8_t *wv) {
    int own = 0;
    for (int p = 0; p < n; p++) {
        int a, b;
        if (kv && ak_card_slot_widths(kv, p, &a, &b)) wk[p] = (uint8_t)a, wv[p] = (uint8_t)b;
        else wk[p] = wv[p] = 4, own++;
    }
    for (int p = 0; p < n; p++) {
        int a, b;
        if (kv && ak_card_slot_widths(kv, p, &a, &b)) continue;
        /* rank among the own tokens, ties by position (O(n^2): diagnostics on 1K tokens) */
        int below = 0;
        double x = mass[p] / expo[p];
        for (int q = 0; q < n; q++) {
            if (kv && ak_card_slot_widths(kv, q, &a, &b)) continue;
            double y = mass[q] / expo[q];
            if (y < x || (y == x && q < p)) below++;
        }
        if (below * 10 / own == o->probe_dec) {
            if (o->probe_side == 0) wk[p] = (uint8_t)o->probe_w;
            else wv[p] = (uint8_t)o->probe_w;
        }
    }
}

/* Adds each position p < n of kv's key and value errors at widths 2, 4, 8,
 * 16 over every layer and KV head (ak_bitalloc_measure_errors on the
 * vectors ak_kv_read gives back) into ek[4p..] and ev[4p..] (zeroed first).
 * Returns 0, or -1 with err set. */
static int measure_errors(const ak_kv *kv, const ak_cache_spec *sp, int n, double *ek, double *ev, ak_error *err) {
    float *kb = malloc(sizeof(float) * (size_t)sp->n_head_kv * sp->head_dim_k);
    float *vb = malloc(sizeof(float) * (size_t)sp->n_head_kv * sp->head_dim_v);
    int rc = -1;
    if (!kb || !vb) { ak_failc(err, AK_ERR_NOMEM, "out of memory"); goto done; }
    memset(ek, 0, sizeof(double) * AK_BITALLOC_N_WIDTHS * (size_t)n);
    memset(ev, 0, sizeof(double) * AK_BITALLOC_N_WIDTHS * (size_t)n);
    for (int p = 0; p < n; p++)
        for (int l = 0; l < sp->n_layer; l++) {
            if (ak_kv_read(kv, l, p, kb, vb, err) < 0 ||
                ak_bitalloc_measure_errors(kb, sp->n_head_kv, sp->head_dim_k, 0, ek + (size_t)p * AK_BITALLOC_N_WIDTHS,
                                           err) < 0 ||
                ak_bitalloc_measure_errors(vb, sp->n_head_kv, sp->head_dim_v, 1, ev + (size_t)p * AK_BITALLOC_N_WIDTHS,
                                           err) < 0)
                goto done;
        }
    rc = 0;
done:
    free(kb);
    free(vb);
    return rc;
}

/* The widths to allocate for a card of positions [0, n) (stats_widths). */
typedef struct {
    const ak_attn_stats *st;    /* the statistics (importance, topology) */
    const ak_kv *kv;            /* the sequence; NULL: no caps, no measured errors */
    const ak_cache_spec *sp;    /* kv's spec, for measured errors */
    const int32_t *tokens;      /* tokens[0..n) */
    int n;
    const uint8_t *segment;     /* topology's segments; may be NULL */
    const int32_t *overlap;     /* topology's prior hand-offs; may be NULL */
    ak_bitalloc_policy policy;
    double budget;              /* average bits, both sides */
    const qopts *o;             /* the allocation; NULL: qopts_default */
} widths_req;

/* Widths for positions [0, q->n) of q->kv under q->budget average bits
 * (both sides) with policy q->policy and allocation q->o (its kv_shift and
 * probe apply), into wk and wv (n bytes each). For importance and topology
 * the scores come from q->st (which must have seen every slot < n as a
 * key): mass, its variance across heads, exposure, the entropy of the slots
 * st saw as queries (a slot the agent never ran as a query gets the mean
 * entropy of those it did: neutral after normalization), the token ids;
 * segment and overlap feed topology; with o->measured, each token's errors
 * at each width measured on kv's vectors. A token kv holds in a mixed block
 * is capped at the width it has, so the greedy spends the budget on the
 * others. Uniform spreads the higher of two widths evenly. res (may be
 * NULL) gets the allocation's result. Returns 0, or -1 with err set. */
static int stats_widths(const widths_req *q, uint8_t *wk, uint8_t *wv, ak_bitalloc_result *res, ak_error *err) {
    const ak_attn_stats *st = q->st;
    const ak_kv *kv = q->kv;
    const ak_cache_spec *sp = q->sp;
    const int32_t *tokens = q->tokens;
    const int n = q->n;
    const uint8_t *segment = q->segment;
    const int32_t *overlap = q->overlap;
    const ak_bitalloc_policy pol = q->policy;
    const double budget = q->budget;
    qopts def = qopts_default();
    const qopts *o = q->o ? q->o : &def;
    int L = st ? ak_attn_stats_length(st) : 0;
    if (pol != AK_BITALLOC_UNIFORM && L < n)
        return ak_failc(err, AK_ERR_INVALID, "statistics cover %d slots, the card %d", L, n);
    size_t cells = (size_t)(L > n ? L : n);
    int measured = o->measured && kv && pol != AK_BITALLOC_UNIFORM;
    double *mass = malloc(sizeof(double) * cells), *var = malloc(sizeof(double) * cells);
    double *ent = malloc(sizeof(double) * cells), *expo = malloc(sizeof(double) * cells);
    double *ek = measured ? malloc(sizeof(double) * AK_BITALLOC_N_WIDTHS * (size_t)n) : NULL;
    double *ev = measured ? malloc(sizeof(double) * AK_BITALLOC_N_WIDTHS * (size_t)n) : NULL;
    int64_t *qc = malloc(sizeof(int64_t) * cells);
    uint8_t *ck = malloc((size_t)n), *cv = malloc((size_t)n), *kk = malloc((size_t)n), *kvv = malloc((size_t)n);
    int rc = -1;
    if (!mass || !var || !ent || !expo || !qc || !ck || !cv || !kk || !kvv || (measured && (!ek || !ev))) {
        ak_failc(err, AK_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int p = 0; p < n; p++) {
        int a, b;
        if (kv && ak_card_slot_widths(kv, p, &a, &b)) ck[p] = (uint8_t)a, cv[p] = (uint8_t)b;
        else ck[p] = cv[p] = 16;
    }
    ak_bitalloc_input in;
    memset(&in, 0, sizeof in);
    in.n = n;
    in.tokens = tokens;
    in.segment = segment;
    in.overlap = overlap;
    in.cap_k = ck;
    in.cap_v = cv;
    if (o->keep && kv) {
        /* a card's tokens keep their widths; the agent's own: none (0) */
        for (int p = 0; p < n; p++) {
            int a, b;
            if (ak_card_slot_widths(kv, p, &a, &b)) kk[p] = (uint8_t)a, kvv[p] = (uint8_t)b;
            else kk[p] = kvv[p] = 0;
        }
        in.keep_k = kk;
        in.keep_v = kvv;
    }
    if (pol != AK_BITALLOC_UNIFORM) {
        ak_attn_stats_mass(st, mass);
        ak_attn_stats_mass_var(st, var);
        ak_attn_stats_entropy(st, ent);
        ak_attn_stats_exposure(st, expo);
        ak_attn_stats_query_count(st, qc);
        double es = 0;
        int en = 0;
        for (int p = 0; p < n; p++)
            if (qc[p] > 0) es += ent[p], en++;
        for (int p = 0; p < n; p++) {
            if (qc[p] == 0) ent[p] = en ? es / en : 0;
            if (!(expo[p] > 0)) {
                ak_failc(err, AK_ERR_INVALID, "slot %d was never seen as a key", p);
                goto done;
            }
        }
        in.mass = mass;
        in.variance = var;
        in.entropy = ent;
        in.exposure = expo;
        if (measured) {
            if (measure_errors(kv, sp, n, ek, ev, err) < 0) goto done;
            in.err_k = ek;
            in.err_v = ev;
        }
    }
    ak_bitalloc_params bp;
    ak_bitalloc_params_init(&bp);
    bp.policy = pol;
    bp.budget_k = budget;
    bp.budget_v = 0;
    bp.spread = 1;
    if (pol != AK_BITALLOC_UNIFORM) {
        bp.weighting = o->weighting;
        bp.mass_power = o->mass_power;
        bp.min_bits = o->floor_bits;
        bp.n_sinks = o->sinks;
        bp.key_weight = o->key_weight;
    }
    if (o->kv_shift != 0 && budget < 16) bp.budget_k = budget + o->kv_shift, bp.budget_v = budget - o->kv_shift;
    rc = ak_bitalloc_run(&in, &bp, wk, wv, res, err);
    if (rc == 0 && o->probe_side >= 0 && pol == AK_BITALLOC_IMPORTANCE) probe_widths(o, kv, mass, expo, n, wk, wv);
done:
    free(mass); free(var); free(ent); free(expo); free(qc); free(ck); free(cv); free(kk); free(kvv); free(ek); free(ev);
    return rc;
}

/* ---- quality ------------------------------------------------------------ */

typedef struct {
    ak_bitalloc_policy policy;
    double budget;
    double kl;              /* mean over windows and held-out positions, nats */
    double ppl, ppl_ref;    /* held-out perplexity of E and of the f16 prefill (all windows) */
    double nll, nll_ref;    /* sums */
    long n_nll, n_kl;
    double mean_k, mean_v;  /* mean widths of the last card (D's), first window */
    int hist_k[AK_CARD_N_WIDTHS];   /* D's card: key widths 2, 4, 8, 16 (tokens), first window */
    int hist_v[AK_CARD_N_WIDTHS];   /* and value widths */
    double bpt_first;       /* vector bytes per token of A's card, first window */
    double bpt_f16;
    int top1_agree;         /* held-out positions whose argmax equals the reference's */
    int defaults;           /* allocated with bitalloc.h's defaults (qopts_default), not the chain's */
} qrow;

/* Rows per budget: uniform, importance, topology under the chain's
 * allocation, then importance and topology under bitalloc.h's defaults. */
#define ROWS_PER_BUDGET 5

/* log-softmax of logits[0..n) into out (double). */
static void log_softmax(const float *logits, int n, double *out) {
    double mx = logits[0];
    for (int i = 1; i < n; i++) if (logits[i] > mx) mx = logits[i];
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)logits[i] - mx);
    double lz = mx + log(s);
    for (int i = 0; i < n; i++) out[i] = (double)logits[i] - lz;
}

/* A window of the quality mode: its tokens toks[0..N), the agents'
 * segments bounds[0..N_HOPS] ([bounds[h], bounds[h+1]) is agent h's own
 * turn; E then reads [bounds[N_HOPS], N)), where E's logits go (rows x
 * vocab), and what the chains run on. */
typedef struct {
    ak_ctx *ctx;
    const ak_model *m;
    ak_block_pool *pool;
    const int32_t *toks;
    int N;
    const int *bounds;
    float *elog;
} qwindow;

/* One chain over window w for row q: E reads [bounds[N_HOPS], N) with
 * every logit into w->elog. Each agent
 * has a fresh f16 sequence of n_ctx positions in pool; A's segment is the
 * task (AK_SEG_TASK), the others' their own turns (AK_SEG_ASSISTANT); a
 * token's overlap is how many hand-offs carried it before this one.
 * first_window: fills q's widths and bytes. Returns 0, or -1 with err set. */
static int quality_chain(const qwindow *w, const qopts *o, qrow *q, int first_window, ak_error *err) {
    ak_ctx *ctx = w->ctx;
    const ak_model *m = w->m;
    ak_block_pool *pool = w->pool;
    const int32_t *toks = w->toks;
    const int N = w->N;
    const int *bounds = w->bounds;
    float *elog = w->elog;
    int n_ctx = m->spec.n_ctx;
    ak_attn_stats *st = ak_attn_stats_new(m, NULL, 0, err);
    uint8_t *seg = malloc((size_t)N), *wk = malloc((size_t)N), *wv = malloc((size_t)N);
    int32_t *ov = malloc(sizeof(int32_t) * (size_t)N);
    ak_card *card = NULL;
    ak_kv *kv = NULL;
    int rc = -1;
    if (!st) goto done;
    if (!seg || !wk || !wv || !ov) { ak_failc(err, AK_ERR_NOMEM, "out of memory"); goto done; }
    for (int h = 0; h < N_HOPS; h++) {
        if (!(kv = ak_kv_new(pool, AK_KV_F16, AK_KV_F16, n_ctx, err))) goto done;
        if (card) {
            if (ak_card_attach(card, kv, err) < 0) goto done;
            ak_card_free(card);
            card = NULL;
        }
        int from = bounds[h], to = bounds[h + 1];
        ak_attn_stats_reset(st);
        ak_attn_stats_set_seq(st, kv);
        if (q->policy != AK_BITALLOC_UNIFORM) ak_ctx_set_attn_stats(ctx, st);
        int r = ak_eval(ctx, kv, &(ak_eval_args){.tokens = toks + from, .n = to - from, .pos0 = from}, err);
        ak_ctx_set_attn_stats(ctx, NULL);
        if (r < 0) goto done;
        if (h == N_HOPS - 1) {
            if (ak_eval(ctx, kv, &(ak_eval_args){.tokens = toks + to, .n = N - to, .pos0 = to, .all_logits = elog},
                        err) < 0) goto done;
            break;
        }
        /* this agent's card of its whole context [0, to) */
        for (int p = 0; p < to; p++) {
            int owner = 0;
            while (owner + 1 < N_HOPS && p >= bounds[owner + 1]) owner++;
            seg[p] = owner == 0 ? AK_SEG_TASK : AK_SEG_ASSISTANT;
            ov[p] = h - owner;
        }
        ak_bitalloc_result res;
        const widths_req wq = {.st = st, .kv = kv, .sp = &m->spec, .tokens = toks, .n = to, .segment = seg,
                               .overlap = ov, .policy = q->policy, .budget = q->budget, .o = o};
        if (stats_widths(&wq, wk, wv, &res, err) < 0) goto done;
        char id[48];
        snprintf(id, sizeof id, "hop-%d", h);
        ak_card_params cp = {.id = id, .fingerprint = "bench", .to = to, .widths_k = wk, .widths_v = wv,
                             .policy = ak_bitalloc_policy_name(q->policy), .budget_k = q->budget,
                             .budget_v = q->budget};
        if (!(card = ak_card_make(kv, toks, &cp, err))) goto done;
        if (first_window && h == 0) {
            q->bpt_first = (double)ak_card_vector_bytes(card) / card->n_tokens;
            q->bpt_f16 = (double)ak_card_f16_bytes(card) / card->n_tokens;
        }
        if (first_window && h == N_HOPS - 2) {
            long sk = 0, sv = 0;
            for (int p = 0; p < card->n_tokens; p++) sk += card->widths_k[p], sv += card->widths_v[p];
            q->mean_k = (double)sk / card->n_tokens;
            for (int p = 0; p < card->n_tokens; p++) q->hist_k[ak_card_width_class(card->widths_k[p])]++;
            for (int p = 0; p < card->n_tokens; p++) q->hist_v[ak_card_width_class(card->widths_v[p])]++;
            q->mean_v = (double)sv / card->n_tokens;
        }
        ak_kv_free(kv);
        kv = NULL;
    }
    rc = 0;
done:
    ak_ctx_set_attn_stats(ctx, NULL);
    ak_kv_free(kv);
    ak_card_free(card);
    ak_attn_stats_free(st);
    free(seg); free(wk); free(wv); free(ov);
    return rc;
}

/* What the quality mode was asked. */
typedef struct {
    const char *model_path, *text_path;
    int N;                  /* tokens per window (0: the model's context - 24) */
    int windows;
    const int *budgets;
    int n_budgets;
    const qopts *o;         /* the chain's allocation */
    int n_threads;
    const char *json_out;   /* NULL: none */
} quality_args;

/* Adds E's held-out logits elog to row q's sums against the reference's
 * rlog (H rows of vocab each): KL, top-1 agreement, the negative
 * log-likelihoods of the next tokens next[1..H); lr, le: vocab doubles of
 * scratch. */
static void score_row(qrow *q, const float *rlog, const float *elog, int H, int vocab, const int32_t *next, double *lr,
                      double *le) {
    for (int j = 0; j < H; j++) {
        const float *rj = rlog + (size_t)j * vocab, *ej = elog + (size_t)j * vocab;
        log_softmax(rj, vocab, lr);
        log_softmax(ej, vocab, le);
        double kl = 0;
        for (int v = 0; v < vocab; v++) kl += exp(lr[v]) * (lr[v] - le[v]);
        if (kl < 0) kl = 0;   /* rounding of two equal distributions */
        q->kl += kl;
        q->n_kl++;
        if (ak_argmax(rj, vocab) == ak_argmax(ej, vocab)) q->top1_agree++;
        if (j + 1 < H) {
            int32_t nx = next[j + 1];
            q->nll -= le[nx];
            q->nll_ref -= lr[nx];
            q->n_nll++;
        }
    }
}

/* Prints the quality table (n_rows rows) and, per budget, the best
 * adaptive row against uniform. */
static void quality_table(const quality_args *qa, const qrow *rows, int n_rows, const int *bounds, int H) {
    const qopts *o = qa->o;
    const int N = qa->N, windows = qa->windows, n_budgets = qa->n_budgets;
    const int *budgets = qa->budgets;
    const char *model_path = qa->model_path, *text_path = qa->text_path;
    printf("\ncards quality: %s, %d windows of %d tokens of %s; chain A -> B -> C -> D -> E, each hop a card of\n"
           "the whole context (A's %d tokens, then %d of each agent's own), E reads %d held-out tokens; vs an f16\n"
           "prefill of the same window. Statistics: each agent's own forward passes (attnstats, default layers).\n"
           "alloc 'chain': errors %s, weighting %s (mass power %g), floor %d, sinks %d, key weight %g%s%s;\n"
           "alloc 'default': bitalloc.h's defaults (modeled errors 4^-w, the four-feature mix, 4 sinks at 8 bits).\n\n",
           model_path, windows, N, text_path, bounds[1], N / 10, H, o->measured ? "measured" : "modeled 4^-w",
           o->weighting == AK_BITALLOC_WEIGHT_MIX ? "mix" : o->weighting == AK_BITALLOC_WEIGHT_MASS ? "mass" : "none",
           o->mass_power, o->floor_bits, o->sinks, o->key_weight, o->keep ? ", handed-in widths kept" : "",
           o->probe_side >= 0 ? ", importance rows are a PROBE" : "");
    printf("%-11s %-7s %6s %10s %9s %8s %8s %8s %10s %8s   %-15s %s\n", "policy", "alloc", "budget", "mean_KL", "dPPL_%",
           "top1_%", "D_bits_k", "D_bits_v", "A_bytes/t", "vs_f16", "D_keys_2/4/8/16", "D_vals_2/4/8/16");
    for (int i = 0; i < n_rows; i++) {
        const qrow *q = &rows[i];
        char hk[40], hv[40];
        snprintf(hk, sizeof hk, "%d/%d/%d/%d", q->hist_k[0], q->hist_k[1], q->hist_k[2], q->hist_k[3]);
        snprintf(hv, sizeof hv, "%d/%d/%d/%d", q->hist_v[0], q->hist_v[1], q->hist_v[2], q->hist_v[3]);
        printf("%-11s %-7s %6.1f %10.3e %+9.3f %8.2f %8.2f %8.2f %10.1f %7.3fx   %-15s %s\n",
               ak_bitalloc_policy_name(q->policy), q->policy == AK_BITALLOC_UNIFORM ? "-" : q->defaults ? "default" : "chain",
               q->budget, q->kl / q->n_kl, 100 * (q->ppl / q->ppl_ref - 1), 100.0 * q->top1_agree / q->n_kl, q->mean_k,
               q->mean_v, q->bpt_first, q->bpt_first / q->bpt_f16, hk, hv);
    }
    printf("f16 prefill held-out perplexity %.4f; D_bits = mean widths of D's card (after the caps of the chain);\n"
           "A_bytes/t = bytes per token of A's card (f16: %.1f).\n", rows[0].ppl_ref, rows[0].bpt_f16);
    for (int b = 0; b < n_budgets; b++) {
        const qrow *r = &rows[ROWS_PER_BUDGET * b];
        double ku = r[0].kl / r[0].n_kl;
        for (int d = 0; d < 2; d++) {
            const qrow *im = &r[1 + 2 * d], *tp = &r[2 + 2 * d];
            double ki = im->kl / im->n_kl, kt = tp->kl / tp->n_kl, kb = ki <= kt ? ki : kt;
            printf("at %d bits, alloc %-7s: best adaptive (%s) KL %.3e vs uniform %.3e: %s (%.2fx)\n", budgets[b],
                   d ? "default" : "chain", ki <= kt ? "importance" : "topology", kb, ku,
                   kb < ku ? "below uniform" : kb == ku ? "EQUAL to uniform" : "NOT below uniform", ku / kb);
        }
    }
}

/* Writes the quality figures as one JSON object into json_out. Returns 0, or
 * -1 with err set. */
static int quality_json(const quality_args *qa, const qrow *rows, int n_rows, const int *bounds, int H,
                        const char *json_out, ak_error *err) {
    const int N = qa->N, windows = qa->windows;
    const char *model_path = qa->model_path, *text_path = qa->text_path;
    FILE *jf = fopen(json_out, "w");
    if (!jf) { ak_failc(err, AK_ERR_IO, "cannot write %s", json_out); return -1; }
    fprintf(jf, "{\"mode\": \"quality\", \"model\": \"%s\", \"text\": \"%s\", \"windows\": %d, \"tokens\": %d, "
            "\"bounds\": [%d, %d, %d, %d, %d, %d], \"held_out\": %d, \"ppl_ref\": %.6f, \"rows\": [",
            model_path, text_path, windows, N, bounds[0], bounds[1], bounds[2], bounds[3], bounds[4], bounds[5],
            H, rows[0].ppl_ref);
    for (int i = 0; i < n_rows; i++) {
        const qrow *q = &rows[i];
        fprintf(jf, "%s{\"policy\": \"%s\", \"budget\": %g, \"mean_kl\": %.7f, \"ppl\": %.6f, \"dppl_pct\": %.5f, "
                "\"top1_agree_pct\": %.3f, \"last_card_bits_k\": %.4f, \"last_card_bits_v\": %.4f, "
                "\"first_card_bytes_per_token\": %.2f, \"f16_bytes_per_token\": %.2f, "
                "\"last_card_key_widths_2_4_8_16\": [%d, %d, %d, %d], "
                "\"last_card_value_widths_2_4_8_16\": [%d, %d, %d, %d], \"alloc\": \"%s\"}",
                i ? ", " : "", ak_bitalloc_policy_name(q->policy), q->budget, q->kl / q->n_kl, q->ppl,
                100 * (q->ppl / q->ppl_ref - 1), 100.0 * q->top1_agree / q->n_kl, q->mean_k, q->mean_v,
                q->bpt_first, q->bpt_f16, q->hist_k[0], q->hist_k[1], q->hist_k[2], q->hist_k[3], q->hist_v[0],
                q->hist_v[1], q->hist_v[2], q->hist_v[3],
                q->policy == AK_BITALLOC_UNIFORM ? "-" : q->defaults ? "default" : "chain");
    }
    fprintf(jf, "]}\n");
    if (fclose(jf) != 0) { ak_failc(err, AK_ERR_IO, "cannot write %s", json_out); return -1; }
    return 0;
}

/* The quality mode. Returns the exit code. */
static int run_quality(const quality_args *qa) {
    const char *model_path = qa->model_path, *text_path = qa->text_path, *json_out = qa->json_out;
    int N = qa->N;
    const int windows = qa->windows, n_budgets = qa->n_budgets, n_threads = qa->n_threads;
    const int *budgets = qa->budgets;
    const qopts *o = qa->o;
    loaded_model lm;
    if (load_model(&lm, "bench cards", model_path) < 0) return 1;
    const ak_model *m = lm.model;
    const int vocab = m->cfg.vocab;
    ak_error err = {{0}};
    int rc = 1;
    char *text = NULL;
    int32_t *all = NULL;
    size_t n_all = 0, len = 0;
    float *rlog = NULL, *elog = NULL;
    double *lr = NULL, *le = NULL;
    ak_block_pool *pool = NULL;
    qrow *rows = NULL;
    int n_rows = 0;
    ak_ctx *ctx = ak_ctx_new(m, 512, n_threads, &err);
    if (!ctx) goto fail;
    if (N <= 0) N = m->spec.n_ctx - 24;
    if (N > m->spec.n_ctx || N < 100) {
        ak_failc(&err, AK_ERR_INVALID, "--tokens %d: need 100 .. the model's context %d", N, m->spec.n_ctx);
        goto fail;
    }
    if (!(text = ak_read_file(text_path, &len, &err))) goto fail;
    if (ak_tokenize(lm.tok, text, len, AK_TOK_ADD_SPECIAL, &all, &n_all, &err) < 0) goto fail;
    if ((long)n_all < 1 + (long)windows * (N - 1)) {
        ak_failc(&err, AK_ERR_INVALID, "%s has %zu tokens, %d windows of %d need %ld", text_path, n_all, windows, N,
                 1 + (long)windows * (N - 1));
        goto fail;
    }
    /* segments: A 40%, B..E 10% each, the held-out 20% */
    int bounds[N_HOPS + 1];
    bounds[0] = 0;
    bounds[1] = N * 2 / 5;
    for (int h = 2; h <= N_HOPS; h++) bounds[h] = bounds[h - 1] + N / 10;
    const int H = N - bounds[N_HOPS];
    n_rows = ROWS_PER_BUDGET * n_budgets + 1;   /* and uniform 16: the chain's own error */
    qopts dflt = qopts_default();
    rows = calloc((size_t)n_rows, sizeof *rows);
    rlog = malloc(sizeof(float) * (size_t)H * vocab);
    elog = malloc(sizeof(float) * (size_t)H * vocab);
    lr = malloc(sizeof(double) * vocab);
    le = malloc(sizeof(double) * vocab);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)N);
    if (!rows || !rlog || !elog || !lr || !le || !toks) {
        free(toks);
        ak_failc(&err, AK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int b = 0, i = 0; b < n_budgets; b++)
        for (int p = 0; p < ROWS_PER_BUDGET; p++, i++) {
            rows[i].policy = (ak_bitalloc_policy)(p < 3 ? p : p - 2);
            rows[i].budget = budgets[b];
            rows[i].defaults = p >= 3;
        }
    rows[n_rows - 1].policy = AK_BITALLOC_UNIFORM;
    rows[n_rows - 1].budget = 16;
    if (!(pool = ak_block_pool_new(&m->spec, 0, 0, &err))) { free(toks); goto fail; }
    fprintf(stderr, "bench cards quality: %s, %d windows of %d tokens (A %d, B..E %d each, held-out %d), %d configs\n",
            model_path, windows, N, bounds[1], N / 10, H, n_rows);
    for (int w = 0; w < windows; w++) {
        toks[0] = all[0];
        memcpy(toks + 1, all + 1 + (size_t)w * (N - 1), sizeof(int32_t) * (size_t)(N - 1));
        /* the reference: an f16 prefill of the whole window */
        ak_kv *ref = ak_kv_new(pool, AK_KV_F16, AK_KV_F16, m->spec.n_ctx, &err);
        if (!ref || ak_eval(ctx, ref, &(ak_eval_args){.tokens = toks, .n = bounds[N_HOPS]}, &err) < 0 ||
            ak_eval(ctx, ref, &(ak_eval_args){.tokens = toks + bounds[N_HOPS], .n = H, .pos0 = bounds[N_HOPS],
                    .all_logits = rlog}, &err) < 0) {
            ak_kv_free(ref);
            free(toks);
            goto fail;
        }
        ak_kv_free(ref);
        for (int i = 0; i < n_rows; i++) {
            qrow *q = &rows[i];
            const qopts *qo = q->defaults ? &dflt : o;
            const qwindow win = {.ctx = ctx, .m = m, .pool = pool, .toks = toks, .N = N, .bounds = bounds, .elog = elog};
            if (quality_chain(&win, qo, q, w == 0, &err) < 0) { free(toks); goto fail; }
            score_row(q, rlog, elog, H, vocab, toks + bounds[N_HOPS], lr, le);
            fprintf(stderr, "  window %d/%d  %-10s %-7s %5.1f bits: KL so far %.3e\n", w + 1, windows,
                    ak_bitalloc_policy_name(q->policy), q->defaults ? "default" : "", q->budget, q->kl / q->n_kl);
        }
    }
    free(toks);
    for (int i = 0; i < n_rows; i++) {
        rows[i].ppl = exp(rows[i].nll / rows[i].n_nll);
        rows[i].ppl_ref = exp(rows[i].nll_ref / rows[i].n_nll);
    }
    quality_args shown = *qa;
    shown.N = N;   /* as resolved */
    quality_table(&shown, rows, n_rows, bounds, H);
    /* the 16-bit chain holds the f16 prefill's values: only the order of
     * sums differs, so its KL is rounding; anything more means the chain or
     * this measure is broken, and no figure above can be trusted */
    const qrow *q16 = &rows[n_rows - 1];
    if (!(q16->kl / q16->n_kl < 1e-6)) {
        ak_failc(&err, AK_ERR_GENERIC, "the 16-bit chain's mean KL is %.3g, not rounding (< 1e-6)", q16->kl / q16->n_kl);
        goto fail;
    }
    if (json_out && quality_json(&shown, rows, n_rows, bounds, H, json_out, &err) < 0) goto fail;
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "agentkv bench cards: %s\n", err.msg[0] ? err.msg : "failed");
done:
    free(text); free(all); free(rlog); free(elog); free(lr); free(le); free(rows);
    ak_block_pool_free(pool);
    ak_ctx_free(ctx);
    unload_model(&lm);
    return rc;
}

/* ---- handoff ------------------------------------------------------------ */

/* A block pool, a store and agents on it (no prefix sharing: a receiver
 * that re-prefills must compute, not link the sender's blocks). */
typedef struct {
    ak_store *store;
    ak_block_pool *pool;
    ak_agents *ag;
    ak_ctx *ctx;   /* what its turns run on (not owned) */
} rig;

/* What a rig is opened on: the model, its context (whose threads the
 * agents use) and tokenizer, the cache's formats, the store directory and
 * the save policy. */
typedef struct {
    const ak_model *m;
    ak_ctx *ctx;
    const ak_tokenizer *tk;
    const cache_opts *co;
    const char *dir;
    ak_save_policy save;
} rig_cfg;

/* Opens r as c says with agents of n_ctx positions. Returns 0, or -1 with
 * err set (r closed). */
static int rig_open(rig *r, const rig_cfg *c, int n_ctx, ak_error *err) {
    const ak_model *m = c->m;
    ak_ctx *ctx = c->ctx;
    const ak_tokenizer *tk = c->tk;
    const cache_opts *co = c->co;
    const char *dir = c->dir;
    const ak_save_policy save = c->save;
    memset(r, 0, sizeof *r);
    r->ctx = ctx;
    if (!(r->store = ak_store_open(dir, NULL, err))) return -1;
    if (!(r->pool = ak_block_pool_new(&m->spec, co->block_tokens, co->budget, err))) goto fail;
    if (cache_center(co, ctx, tk, r->pool, "bench cards") < 0) {
        ak_fail(err, "calibration failed");
        goto fail;
    }
    ak_agents_config ac = {.model = m, .pool = r->pool, .store = r->store, .fk = co->fk, .fv = co->fv, .n_ctx = n_ctx,
                           .save = save, .no_prefix_sharing = 1};
    if (!(r->ag = ak_agents_new(&ac, err))) goto fail;
    ak_agents_set_threads(r->ag, ak_ctx_pool(ctx));   /* imports fill card blocks on them, as the server's do */
    return 0;
fail:
    ak_block_pool_free(r->pool);
    ak_store_close(r->store);
    memset(r, 0, sizeof *r);
    return -1;
}

/* Frees the agents (saving what is dirty), the block pool, the store. A
 * zeroed rig is fine. */
static void rig_close(rig *r) {
    ak_agents_free(r->ag);
    ak_block_pool_free(r->pool);
    if (r->store) ak_store_close(r->store);
    memset(r, 0, sizeof *r);
}

/* A turn to time: agent id with prompt toks[0..n), a progress bar label
 * (NULL: none), and whether the turn is kept. */
typedef struct {
    const char *id;
    const int32_t *toks;
    int n;
    const char *label;
    int keep;
} turn_spec;

/* Turn q of r up to its first token's logits (into logits): open (match,
 * restore, make room), prefill what the cache lacks (with q's progress
 * bar); *ms gets that time (*cpu, if not NULL, the CPU time of all
 * threads). Then, out of the timing, commit + end (q->keep = 1) or abort
 * (keep = 0: the agent stays as it was, its file untouched). *t gets the
 * turn. Returns 0, or -1 with err set. */
static int timed_turn(rig *r, const turn_spec *q, float *logits, double *ms, double *cpu, ak_turn *t, ak_error *err) {
    ak_ctx *ctx = r->ctx;
    const char *id = q->id, *label = q->label;
    const int32_t *toks = q->toks;
    const int n = q->n, keep = q->keep;
    ak_kv *kv;
    progress pg;
    if (label) progress_init(&pg, label);
    double c0 = bench_cpu_ms(), t0 = ak_now();
    int rc = ak_agent_open(r->ag, &(ak_turn_opts){.id = id, .tokens = toks, .n = n, .n_reserve = n}, &kv, t, err);
    if (rc == 0 && ak_eval(ctx, kv, &(ak_eval_args){.tokens = toks + t->reused, .n = t->prefilled, .pos0 = t->reused,
                           .logits = logits, .progress = label ? progress_update : NULL,
                           .ud = label ? &pg : NULL}, err) < 0) {
        ak_agent_abort(r->ag, id);
        rc = -1;
    }
    *ms = (ak_now() - t0) * 1e3;
    if (cpu) *cpu = bench_cpu_ms() - c0;
    if (label) progress_done(&pg);
    if (rc < 0) return -1;
    if (!keep) {
        ak_agent_abort(r->ag, id);
        return 0;
    }
    return ak_agent_commit(r->ag, id, toks, n, err) < 0 || ak_agent_end(r->ag, id, err) < 0 ? -1 : 0;
}

#define N_VARIANTS 3
static const char *variant_name[N_VARIANTS] = {"uniform 8", "uniform 4", "importance 4"};

/* Everything measured at one context length (medians over reps). */
typedef struct {
    int n;
    double sender_ms, sender_cpu;     /* the sender's prefill, statistics attached (wall, CPU) */
    double reprefill_ms, reprefill_cpu;   /* (b) */
    double warm_ms, warm_restore_ms;  /* (c): the turn, and its restore part (ak_turn) */
    double warm_cpu;                  /* (c), CPU */
    double total_cpu[N_VARIANTS];     /* (a), CPU */
    uint64_t warm_bytes;              /* bytes the restore read */
    double total[N_VARIANTS], make[N_VARIANTS], import[N_VARIANTS], turn[N_VARIANTS];
    double ratio_b_a[N_VARIANTS], ratio_a_c[N_VARIANTS];   /* medians of the reps' ratios ((b) is one run) */
    double card_bpt[N_VARIANTS], mean_bits[N_VARIANTS];
    size_t card_file[N_VARIANTS];     /* bytes of the card file */
    int same_token[N_VARIANTS];       /* the receiver's first token equals the re-prefill's */
} hrow;

/* Bytes per token of cards at a budget, on the handoff model. */
typedef struct {
    double budget;
    double uniform, importance;
} brow;

/* One handoff (handoff): variant v (variant_name) of the card card_id
 * made from agent "sender" (whose statistics are st), imported into a fresh
 * agent recv_id whose turn is toks[0..n + turn) (the card's n tokens and
 * its own); logits: vocab floats of scratch. */
typedef struct {
    const ak_attn_stats *st;
    int v;
    const char *card_id, *recv_id;
    const int32_t *toks;
    int n, turn;
    float *logits;
} handoff_req;

/* What one handoff measured. */
typedef struct {
    double make;        /* widths from the statistics (importance), make and save the card, ms */
    double import;      /* ms */
    double turn;        /* the receiver's turn, ms */
    double cpu;         /* the CPU time of all three, all threads, ms */
    int32_t first;      /* the receiver's first token */
    double bpt, bits;   /* the card's vector bytes per token and mean width */
    size_t file_bytes;  /* its file */
} handoff_out;

/* Handoff q on r into *out. The card and the receiver are removed
 * afterwards. Returns 0, or -1 with err set. */
static int handoff(rig *r, const handoff_req *q, handoff_out *out, ak_error *err) {
    ak_ctx *ctx = r->ctx;
    const ak_attn_stats *st = q->st;
    const int v = q->v, n = q->n, turn = q->turn;
    const char *card_id = q->card_id, *recv_id = q->recv_id;
    const int32_t *toks = q->toks;
    float *logits = q->logits;
    double *make = &out->make, *import = &out->import, *tturn = &out->turn, *cpu = &out->cpu;
    int32_t *first = &out->first;
    double *bpt = &out->bpt, *bits = &out->bits;
    size_t *file_bytes = &out->file_bytes;
    uint8_t *wk = NULL, *wv = NULL;
    char cid[AK_AGENT_ID_MAX + 1];
    ak_card_request rq;
    memset(&rq, 0, sizeof rq);
    rq.card_id = card_id;
    rq.ctx = ctx;   /* as the server passes its engine's context: its threads make the card */
    double c0 = bench_cpu_ms(), t0 = ak_now();
    if (v == 2) {
        wk = malloc((size_t)n), wv = malloc((size_t)n);
        if (!wk || !wv) { free(wk); free(wv); return ak_failc(err, AK_ERR_NOMEM, "out of memory"); }
        const widths_req wq = {.st = st, .tokens = toks, .n = n, .policy = AK_BITALLOC_IMPORTANCE, .budget = 4};
        if (stats_widths(&wq, wk, wv, NULL, err) < 0) {
            free(wk); free(wv);
            return -1;
        }
        rq.widths_k = wk, rq.widths_v = wv, rq.policy = "importance", rq.budget_k = rq.budget_v = 4;
    } else {
        rq.policy = "uniform";
        rq.budget_k = rq.budget_v = v == 0 ? 8 : 4;
    }
    int rc = ak_agent_make_card(r->ag, "sender", &rq, cid, err);
    free(wk); free(wv);
    if (rc < 0) return -1;
    double t1 = ak_now();
    if (ak_agent_import_card(r->ag, recv_id, cid, err) < 0) return -1;
    double t2 = ak_now();
    ak_turn t;
    double c1 = bench_cpu_ms(), tcpu;
    const turn_spec ts = {.id = recv_id, .toks = toks, .n = n + turn, .keep = 1};
    if (timed_turn(r, &ts, logits, tturn, &tcpu, &t, err) < 0) return -1;
    *cpu = c1 - c0 + tcpu;
    *make = (t1 - t0) * 1e3;
    *import = (t2 - t1) * 1e3;
    *first = ak_argmax(logits, ak_ctx_model(ctx)->cfg.vocab);
    if (t.reused != n || t.prefilled != turn)
        return ak_failc(err, AK_ERR_GENERIC, "receiver %s reused %d and prefilled %d, not %d and %d", recv_id, t.reused,
                        t.prefilled, n, turn);
    const ak_card *c = ak_card_get(r->ag, cid, err);
    if (!c) return -1;
    long s = 0;
    for (int i = 0; i < c->n_tokens; i++) s += c->widths_k[i] + c->widths_v[i];
    *bits = (double)s / (2.0 * c->n_tokens);
    *bpt = (double)ak_card_vector_bytes(c) / c->n_tokens;
    *file_bytes = 0;
    ak_store_card_entry *list = NULL;
    int nl = 0;
    if (ak_cards_list(r->ag, &list, &nl, err) == 0) {
        for (int i = 0; i < nl; i++)
            if (!strcmp(list[i].id, cid)) *file_bytes = (size_t)list[i].bytes;
        free(list);
    }
    if (ak_agent_remove(r->ag, recv_id, err) < 0 || ak_card_remove(r->ag, cid, err) < 0) return -1;
    return 0;
}

/* What the handoff mode was asked. */
typedef struct {
    const char *model_path;
    const int *contexts;
    int n_contexts, turn, reps;
    const char *dir;          /* the store directory */
    const cache_opts *co;
    int n_threads;
    const char *json_out;     /* NULL: none */
} handoff_args;

/* What the handoff mode measured, for the report. */
typedef struct {
    const hrow *R;            /* one per context */
    const brow *B;            /* bytes per token at each budget */
    int n_b;
    double bpt_f16;
    const char *wt;           /* the weights' type */
    int nt;                   /* threads */
} handoff_results;

/* Prints the handoff tables of res to stdout, or one JSON object to json. */
static void handoff_report(const handoff_args *a, const handoff_results *res, FILE *json) {
    const hrow *R = res->R;
    const brow *B = res->B;
    const int n_ctx_list = a->n_contexts, n_b = res->n_b, nt = res->nt, turn = a->turn, reps = a->reps;
    const double bpt_f16 = res->bpt_f16;
    const char *model_path = a->model_path, *wt = res->wt;
    const cache_opts *co = a->co;
    const char *fk = ak_kv_format_get(co->fk)->name, *fv = ak_kv_format_get(co->fv)->name;
    if (json) {
        fprintf(json, "{\"mode\": \"handoff\", \"model\": \"%s\", \"weight_type\": \"%s\", \"threads\": %d, "
                "\"turn\": %d, \"reps\": %d, \"cache_type_k\": \"%s\", \"cache_type_v\": \"%s\", "
                "\"f16_bytes_per_token\": %.1f, \"contexts\": [", model_path, wt, nt, turn, reps, fk, fv, bpt_f16);
        for (int i = 0; i < n_ctx_list; i++) {
            const hrow *h = &R[i];
            fprintf(json, "%s{\"context\": %d, \"sender_prefill_with_stats_ms\": %.2f, \"reprefill_ms\": %.2f, "
                    "\"warm_ms\": %.2f, \"warm_restore_ms\": %.2f, \"warm_restore_bytes\": %llu, "
                    "\"sender_prefill_with_stats_cpu_ms\": %.2f, \"reprefill_cpu_ms\": %.2f, \"warm_cpu_ms\": %.2f, "
                    "\"handoffs\": [",
                    i ? ", " : "", h->n, h->sender_ms, h->reprefill_ms, h->warm_ms, h->warm_restore_ms,
                    (unsigned long long)h->warm_bytes, h->sender_cpu, h->reprefill_cpu, h->warm_cpu);
            for (int v = 0; v < N_VARIANTS; v++)
                fprintf(json, "%s{\"variant\": \"%s\", \"total_ms\": %.3f, \"make_ms\": %.3f, \"import_ms\": %.3f, "
                        "\"turn_ms\": %.3f, \"total_cpu_ms\": %.3f, \"reprefill_over_handoff\": %.2f, \"handoff_over_warm\": %.3f, "
                        "\"card_bytes_per_token\": %.1f, \"card_mean_bits\": %.3f, \"card_file_bytes\": %zu, "
                        "\"same_first_token_as_reprefill\": %s}",
                        v ? ", " : "", variant_name[v], h->total[v], h->make[v], h->import[v], h->turn[v],
                        h->total_cpu[v], h->ratio_b_a[v], h->ratio_a_c[v], h->card_bpt[v], h->mean_bits[v], h->card_file[v],
                        h->same_token[v] ? "true" : "false");
            fprintf(json, "]}");
        }
        fprintf(json, "], \"bytes_per_token\": [");
        for (int i = 0; i < n_b; i++)
            fprintf(json, "%s{\"budget\": %g, \"uniform\": %.1f, \"importance\": %.1f}", i ? ", " : "", B[i].budget,
                    B[i].uniform, B[i].importance);
        fprintf(json, "]}\n");
        return;
    }
    printf("\ncards handoff: %s (%s weights, %d threads), agents' own cache K %s / V %s; the receiver's own turn\n"
           "%d tokens; medians of %d rep(s), each rep (a) and (c) side by side, (b) once per context.\n"
           "(a) = make the card (importance: widths from the sender's statistics, then the card) + save it (fsync)\n"
           "+ import into a fresh receiver + its turn to the first token's logits; (b) a fresh receiver prefilling\n"
           "context + turn; (c) the sender's agent file restored warm (page cache) by a fresh process-like agent set\n"
           "+ the same turn. Goals at 8K: (b)/(a) >= 200, (a)/(c) <= 1.5.\n\n",
           model_path, wt, nt, fk, fv, turn, reps);
    printf("%7s %-13s %11s %11s %11s %9s %8s %10s %11s %11s %11s\n", "context", "card", "(a)_ms", "(b)_ms", "(c)_ms",
           "(b)/(a)", "(a)/(c)", "make_ms", "import_ms", "turn_ms", "same_token");
    for (int i = 0; i < n_ctx_list; i++) {
        const hrow *h = &R[i];
        for (int v = 0; v < N_VARIANTS; v++)
            printf("%7d %-13s %11.1f %11.1f %11.1f %8.1fx %7.2fx %10.1f %11.1f %11.1f %11s\n", h->n, variant_name[v],
                   h->total[v], h->reprefill_ms, h->warm_ms, h->ratio_b_a[v], h->ratio_a_c[v], h->make[v],
                   h->import[v], h->turn[v], h->same_token[v] ? "yes" : "no");
    }
    printf("\n%7s %24s %14s %18s %14s %16s\n", "context", "sender_prefill+stats_ms", "(b)_ms", "stats_overhead",
           "(c)_restore_ms", "(c)_restore_MB");
    for (int i = 0; i < n_ctx_list; i++) {
        const hrow *h = &R[i];
        printf("%7d %24.1f %14.1f %+17.1f%% %14.1f %16.1f\n", h->n, h->sender_ms, h->reprefill_ms,
               100 * (h->sender_ms / h->reprefill_ms - 1), h->warm_restore_ms, h->warm_bytes / 1e6);
    }
    printf("\nCPU time (all threads; less sensitive to the neighbours' load than wall time), medians:\n"
           "%7s %-13s %11s %11s %11s %9s %8s %24s\n", "context", "card", "(a)_cpu", "(b)_cpu", "(c)_cpu", "(b)/(a)",
           "(a)/(c)", "sender_prefill+stats_cpu");
    for (int i = 0; i < n_ctx_list; i++) {
        const hrow *h = &R[i];
        for (int v = 0; v < N_VARIANTS; v++)
            printf("%7d %-13s %11.1f %11.1f %11.1f %8.1fx %7.2fx %24.1f\n", h->n, variant_name[v], h->total_cpu[v],
                   h->reprefill_cpu, h->warm_cpu, h->reprefill_cpu / h->total_cpu[v], h->total_cpu[v] / h->warm_cpu,
                   h->sender_cpu);
    }
    printf("importance 4: the statistics were collected during the sender's own prefill; their cost is in\n"
           "that prefill (stats_overhead: sender prefill with statistics vs the re-prefill (b) without, one run\n"
           "each, so machine noise included), not in (a); (a) includes computing the widths from them.\n");
    printf("\nbytes per token of cards (context %d) vs f16 %.1f:\n%8s %12s %8s %12s %8s\n", R[0].n, bpt_f16,
           "budget", "uniform", "vs_f16", "importance", "vs_f16");
    for (int i = 0; i < n_b; i++)
        printf("%8g %12.1f %7.3fx %12.1f %7.3fx\n", B[i].budget, B[i].uniform, B[i].uniform / bpt_f16,
               B[i].importance, B[i].importance / bpt_f16);
}

/* Views into a handoff run's timings, reps each (the per-variant ones
 * reps x N_VARIANTS, variant-major): (a) total, make, import, turn and CPU;
 * (c) wall, its restore and CPU; (a)/(c) of each rep. */
typedef struct {
    double *ta, *tm, *ti, *tt, *tca;
    double *tw, *twr, *twc, *tac;
} hcols;

/* The columns of tv (reps x (5 N_VARIANTS + 4) doubles). */
static hcols hcols_of(double *tv, int reps) {
    hcols c = {.ta = tv, .tm = tv + reps * N_VARIANTS, .ti = tv + 2 * reps * N_VARIANTS,
               .tt = tv + 3 * reps * N_VARIANTS, .tw = tv + 4 * reps * N_VARIANTS};
    c.twr = c.tw + reps;
    c.tac = c.twr + reps;
    c.twc = c.tac + reps;
    c.tca = c.twc + reps;
    return c;
}

/* A handoff run's state: what it was asked, how its rigs open, the
 * context and turn's tokens, scratch logits, the timings, and the context
 * at hand's rigs and the sender's statistics. */
typedef struct {
    const handoff_args *a;
    const ak_model *m;
    rig_cfg rc;
    ak_rng rng;
    int32_t *toks;          /* max context + turn */
    float *logits;          /* vocab */
    double *tv;             /* hcols_of's */
    rig main_r, warm;
    ak_attn_stats *st;
} handoff_run;

/* Rep r of context h->n: each variant's handoff (its first token into
 * first[v]), then (c): a fresh agent set on the same store restores the
 * sender's file and takes the same turn. Returns 0, or -1 with err set. */
static int handoff_rep(handoff_run *H, hrow *h, int r, int32_t *first, ak_error *err) {
    const int n = h->n, turn = H->a->turn, reps = H->a->reps, vocab = H->m->cfg.vocab;
    const hcols c = hcols_of(H->tv, reps);
    for (int i = n; i < n + turn; i++) H->toks[i] = (int32_t)(ak_rng_u32(&H->rng) % vocab);
    for (int v = 0; v < N_VARIANTS; v++) {
        char cid[48], rid[48];
        snprintf(cid, sizeof cid, "bench-card-%d-%d-%d", n, r, v);
        snprintf(rid, sizeof rid, "receiver-%d-%d", r, v);
        int k = v * reps + r;
        const handoff_req q = {.st = H->st, .v = v, .card_id = cid, .recv_id = rid, .toks = H->toks, .n = n,
                               .turn = turn, .logits = H->logits};
        handoff_out o;
        if (handoff(&H->main_r, &q, &o, err) < 0) return -1;
        c.tm[k] = o.make, c.ti[k] = o.import, c.tt[k] = o.turn, c.tca[k] = o.cpu;
        first[v] = o.first;
        h->card_bpt[v] = o.bpt, h->mean_bits[v] = o.bits, h->card_file[v] = o.file_bytes;
        c.ta[k] = c.tm[k] + c.ti[k] + c.tt[k];
    }
    /* (c): a fresh agent set on the same store restores the sender's file */
    if (rig_open(&H->warm, &H->rc, n + turn, err) < 0) return -1;
    ak_turn t;
    const turn_spec ts = {.id = "sender", .toks = H->toks, .n = n + turn, .keep = 0};
    if (timed_turn(&H->warm, &ts, H->logits, &c.tw[r], &c.twc[r], &t, err) < 0) return -1;
    if (t.tier != AK_TIER_WARM || t.reused != n)
        return ak_failc(err, AK_ERR_GENERIC, "the warm restore was %s with %d reused, not warm with %d",
                        ak_tier_name(t.tier), t.reused, n);
    c.twr[r] = t.restore_ms;
    h->warm_bytes = t.restore_bytes;
    rig_close(&H->warm);
    fprintf(stderr, "  context %d rep %d/%d: handoff u8 %.1f ms, u4 %.1f ms, imp4 %.1f ms; warm %.1f ms\n", n, r + 1,
            reps, c.ta[r], c.ta[reps + r], c.ta[2 * reps + r], c.tw[r]);
    return 0;
}

/* Context h->n (its tokens already in H->toks) on H->main_r: the sender
 * prefills with statistics H->st attached and is saved to its file; then
 * per rep the handoffs and the warm restore; then once (b), a receiver
 * re-prefilling the context and the last rep's turn. Medians into h.
 * Returns 0, or -1 with err set. */
static int handoff_context(handoff_run *H, hrow *h, ak_error *err) {
    const int n = h->n, turn = H->a->turn, reps = H->a->reps, vocab = H->m->cfg.vocab;
    const hcols c = hcols_of(H->tv, reps);
    char label[64];
    snprintf(label, sizeof label, "sender prefill %d (+stats)", n);
    ak_turn t;
    ak_ctx_set_attn_stats(H->main_r.ctx, H->st);
    const turn_spec sender = {.id = "sender", .toks = H->toks, .n = n, .label = label, .keep = 1};
    int r0 = timed_turn(&H->main_r, &sender, H->logits, &h->sender_ms, &h->sender_cpu, &t, err);
    ak_ctx_set_attn_stats(H->main_r.ctx, NULL);
    if (r0 < 0 || ak_agents_flush(H->main_r.ag, err) < 0) return -1;
    fprintf(stderr, "  context %d: sender prefilled in %.1f s (statistics attached), file written\n", n,
            h->sender_ms / 1e3);
    int32_t first[N_VARIANTS];
    for (int r = 0; r < reps; r++)
        if (handoff_rep(H, h, r, first, err) < 0) return -1;
    /* (b): once, with the last rep's turn */
    snprintf(label, sizeof label, "re-prefill %d", n + turn);
    const turn_spec re = {.id = "reprefill", .toks = H->toks, .n = n + turn, .label = label, .keep = 1};
    if (timed_turn(&H->main_r, &re, H->logits, &h->reprefill_ms, &h->reprefill_cpu, &t, err) < 0) return -1;
    if (t.prefilled != n + turn)
        return ak_failc(err, AK_ERR_GENERIC, "the re-prefill computed %d tokens, not %d", t.prefilled, n + turn);
    int32_t ref_first = ak_argmax(H->logits, vocab);
    if (ak_agent_remove(H->main_r.ag, "reprefill", err) < 0) return -1;
    for (int v = 0; v < N_VARIANTS; v++) {
        double *a = c.ta + v * reps;
        for (int r = 0; r < reps; r++) c.tac[r] = a[r] / c.tw[r];
        h->ratio_a_c[v] = bench_median(c.tac, reps);
        h->same_token[v] = first[v] == ref_first;
        h->make[v] = bench_median(c.tm + v * reps, reps);
        h->import[v] = bench_median(c.ti + v * reps, reps);
        h->turn[v] = bench_median(c.tt + v * reps, reps);
        h->total[v] = bench_median(a, reps);
        h->total_cpu[v] = bench_median(c.tca + v * reps, reps);
        h->ratio_b_a[v] = h->reprefill_ms / h->total[v];
    }
    h->warm_ms = bench_median(c.tw, reps);
    h->warm_cpu = bench_median(c.twc, reps);
    h->warm_restore_ms = bench_median(c.twr, reps);
    fprintf(stderr, "  context %d: re-prefill %.1f s; handoff u8 %.1f ms (%.0fx faster), warm %.1f ms\n", n,
            h->reprefill_ms / 1e3, h->total[0], h->ratio_b_a[0], h->warm_ms);
    return 0;
}

/* Bytes per token of the sender's cards of its n tokens at each budget of
 * B[0..n_b), uniform and importance (untimed), into B; f16's into
 * *bpt_f16. Returns 0, or -1 with err set. */
static int card_sizes(handoff_run *H, int n, brow *B, int n_b, double *bpt_f16, ak_error *err) {
    for (int b = 0; b < n_b; b++) {
        for (int p = 0; p < 2; p++) {
            uint8_t *wk = malloc((size_t)n), *wv = malloc((size_t)n);
            char cid[48], got[AK_AGENT_ID_MAX + 1];
            snprintf(cid, sizeof cid, "bench-bytes-%d-%d", b, p);
            ak_card_request rq;
            memset(&rq, 0, sizeof rq);
            rq.card_id = cid;
            rq.widths_k = wk, rq.widths_v = wv;
            rq.policy = p ? "importance" : "uniform";
            rq.budget_k = rq.budget_v = B[b].budget;
            const widths_req wq = {.st = H->st, .tokens = H->toks, .n = n,
                                   .policy = p ? AK_BITALLOC_IMPORTANCE : AK_BITALLOC_UNIFORM, .budget = B[b].budget};
            int ok = wk && wv && stats_widths(&wq, wk, wv, NULL, err) == 0 &&
                     ak_agent_make_card(H->main_r.ag, "sender", &rq, got, err) == 0;
            free(wk); free(wv);
            if (!ok) return -1;
            const ak_card *c = ak_card_get(H->main_r.ag, got, err);
            if (!c) return -1;
            double bpt = (double)ak_card_vector_bytes(c) / c->n_tokens;
            *bpt_f16 = (double)ak_card_f16_bytes(c) / c->n_tokens;
            if (p) B[b].importance = bpt;
            else B[b].uniform = bpt;
            if (ak_card_remove(H->main_r.ag, got, err) < 0) return -1;
        }
    }
    return 0;
}

/* The handoff mode. Returns the exit code. */
static int run_handoff(const handoff_args *a) {
    loaded_model lm;
    if (load_model(&lm, "bench cards", a->model_path) < 0) return 1;
    const ak_model *m = lm.model;
    const int vocab = m->cfg.vocab, turn = a->turn, reps = a->reps;
    ak_error err = {{0}};
    int rc = 1, max_n = 0;
    for (int i = 0; i < a->n_contexts; i++) if (a->contexts[i] > max_n) max_n = a->contexts[i];
    if (max_n + turn > m->spec.n_ctx) {
        fprintf(stderr, "agentkv bench cards: context %d + turn %d exceed the model's context %d\n", max_n, turn,
                m->spec.n_ctx);
        unload_model(&lm);
        return AK_EXIT_USAGE;
    }
    handoff_run H = {.a = a, .m = m};
    hrow *R = calloc((size_t)a->n_contexts, sizeof *R);
    brow B[5] = {{.budget = 3}, {.budget = 4}, {.budget = 6}, {.budget = 8}, {.budget = 16}};
    double bpt_f16 = 0;
    H.toks = malloc(sizeof(int32_t) * (size_t)(max_n + turn));
    H.logits = malloc(sizeof(float) * vocab);
    H.tv = calloc((size_t)reps * (5 * N_VARIANTS + 4), sizeof(double));
    ak_ctx *ctx = ak_ctx_new(m, 512, a->n_threads, &err);
    if (!ctx) goto fail;
    if (!R || !H.toks || !H.logits || !H.tv) { ak_failc(&err, AK_ERR_NOMEM, "out of memory"); goto fail; }
    H.rc = (rig_cfg){.m = m, .ctx = ctx, .tk = lm.tok, .co = a->co, .dir = a->dir, .save = AK_SAVE_ON_SHUTDOWN};
    const int nt = ak_threads_size(ak_ctx_pool(ctx));
    ak_rng_seed(&H.rng, 11);
    fprintf(stderr, "bench cards handoff: %s, %d threads, contexts", a->model_path, nt);
    for (int i = 0; i < a->n_contexts; i++) fprintf(stderr, " %d", a->contexts[i]);
    fprintf(stderr, ", turn %d, %d reps, store %s\n", turn, reps, a->dir);
    for (int ci = 0; ci < a->n_contexts; ci++) {
        hrow *h = &R[ci];
        const int n = h->n = a->contexts[ci];
        for (int i = 0; i < n; i++) H.toks[i] = (int32_t)(ak_rng_u32(&H.rng) % vocab);
        if (rig_open(&H.main_r, &H.rc, n + turn, &err) < 0) goto fail;
        ak_agent_remove(H.main_r.ag, "sender", &err);   /* a file left by an interrupted run */
        if (!(H.st = ak_attn_stats_new(m, NULL, 0, &err))) goto fail;
        if (handoff_context(&H, h, &err) < 0) goto fail;
        /* bytes per token at each budget, on the first context */
        if (ci == 0 && card_sizes(&H, n, B, 5, &bpt_f16, &err) < 0) goto fail;
        if (ak_agent_remove(H.main_r.ag, "sender", &err) < 0) goto fail;
        rig_close(&H.main_r);
        ak_attn_stats_free(H.st);
        H.st = NULL;
    }
    const handoff_results res = {.R = R, .B = B, .n_b = 5, .bpt_f16 = bpt_f16,
                                 .wt = gguf_tensor_type_name(m->layers[0].wq.type), .nt = nt};
    handoff_report(a, &res, NULL);
    if (a->json_out) {
        FILE *jf = fopen(a->json_out, "w");
        if (!jf) { ak_failc(&err, AK_ERR_IO, "cannot write %s", a->json_out); goto fail; }
        handoff_report(a, &res, jf);
        if (fclose(jf) != 0) { ak_failc(&err, AK_ERR_IO, "cannot write %s", a->json_out); goto fail; }
    }
    fflush(stdout);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "agentkv bench cards: %s\n", err.msg[0] ? err.msg : "failed");
done:
    ak_ctx_set_attn_stats(ctx, NULL);
    rig_close(&H.warm);
    rig_close(&H.main_r);
    ak_attn_stats_free(H.st);
    ak_ctx_free(ctx);
    free(R); free(H.toks); free(H.logits); free(H.tv);
    unload_model(&lm);
    return rc;
}

/* The value of flag f as a real number in [lo, hi]; a usage error (and 0)
 * otherwise. */
static double arg_real(ak_args *a, const char *f, double lo, double hi) {
    const char *v = args_value(a, f);
    if (!v) return 0;
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= lo && x <= hi)) {
        args_error(a, "%s: a number in [%g, %g], not '%s'", f, lo, hi, v);
        return 0;
    }
    return x;
}

/* agentkv bench cards: parses the flags and runs one mode. */
int cmd_bench_cards(int argc, char **argv) {
    ak_args a;
    args_init(&a, "bench cards", argc, argv);
    const char *model_path = NULL, *json_out = NULL, *text = NULL, *dir = "agentkv-bench-cards";
    int contexts[MAX_LIST] = {1024, 4096, 8192}, n_contexts = 3;
    int budgets[MAX_LIST] = {3, 4, 6, 8}, n_budgets = 4;
    int turn = 16, reps = 3, n_threads = 0, quality = 0, N = 0, windows = 4;
    cache_opts co;
    cache_opts_init(&co);
    qopts qo = qopts_quality();
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) model_path = args_value(&a, f);
        else if (!strcmp(f, "--turn")) turn = (int)args_int(&a, f, 1, 4096);
        else if (!strcmp(f, "--reps")) reps = (int)args_int(&a, f, 1, 100);
        else if (!strcmp(f, "--dir")) dir = args_value(&a, f);
        else if (!strcmp(f, "--quality")) quality = 1;
        else if (!strcmp(f, "--text")) text = args_value(&a, f);
        else if (!strcmp(f, "--tokens")) N = (int)args_int(&a, f, 100, 1 << 20);
        else if (!strcmp(f, "--windows")) windows = (int)args_int(&a, f, 1, 1000);
        else if (!strcmp(f, "--errors")) {
            const char *v = args_value(&a, f);
            if (v && !strcmp(v, "measured")) qo.measured = 1;
            else if (v && !strcmp(v, "model")) qo.measured = 0;
            else if (v) args_error(&a, "--errors: measured or model, not '%s'", v);
        } else if (!strcmp(f, "--weight")) {
            const char *v = args_value(&a, f);
            if (v && !strcmp(v, "mix")) qo.weighting = AK_BITALLOC_WEIGHT_MIX;
            else if (v && !strcmp(v, "mass")) qo.weighting = AK_BITALLOC_WEIGHT_MASS;
            else if (v && !strcmp(v, "none")) qo.weighting = AK_BITALLOC_WEIGHT_NONE;
            else if (v) args_error(&a, "--weight: mix, mass or none, not '%s'", v);
        } else if (!strcmp(f, "--mass-power")) qo.mass_power = arg_real(&a, f, 0.01, 4);
        else if (!strcmp(f, "--floor")) {
            qo.floor_bits = (int)args_int(&a, f, 0, 16);
            if (qo.floor_bits != 0 && !ak_card_width_valid(qo.floor_bits)) args_error(&a, "--floor: 0, 2, 4, 8 or 16");
        } else if (!strcmp(f, "--sinks")) qo.sinks = (int)args_int(&a, f, 0, 1 << 20);
        else if (!strcmp(f, "--key-weight")) qo.key_weight = arg_real(&a, f, 0, 1e6);
        else if (!strcmp(f, "--keep")) qo.keep = 1;
        else if (!strcmp(f, "--legacy")) qo = qopts_default();
        else if (!strcmp(f, "--kv-shift")) qo.kv_shift = arg_real(&a, f, -14, 14);
        else if (!strcmp(f, "--probe")) {
            const char *v = args_value(&a, f);
            char side = 0;
            if (v && (sscanf(v, "%c:%d:%d", &side, &qo.probe_w, &qo.probe_dec) != 3 || (side != 'k' && side != 'v') ||
                      !ak_card_width_valid(qo.probe_w) || qo.probe_dec < 0 || qo.probe_dec > 9))
                args_error(&a, "--probe: SIDE:WIDTH:DECILE (k or v, 2/4/8/16, 0..9), not '%s'", v);
            qo.probe_side = side == 'k' ? 0 : 1;
        }
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) n_threads = (int)args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--json-out")) json_out = args_value(&a, f);
        else if (!strcmp(f, "--contexts")) {
            const char *v = args_value(&a, f);
            if (v) n_contexts = args_int_list(&a, f, v, 1, 1 << 20, contexts, MAX_LIST);
        } else if (!strcmp(f, "--budgets")) {
            const char *v = args_value(&a, f);
            if (v) n_budgets = args_int_list(&a, f, v, 2, 16, budgets, MAX_LIST);
        } else if (!cache_opts_parse(&co, &a, f)) args_unknown(&a, f);
    }
    if (!a.failed && !model_path) args_error(&a, "-m MODEL is required");
    if (!a.failed && quality && !text) args_error(&a, "--quality needs --text FILE");
    if (a.failed) return AK_EXIT_USAGE;
    if (quality) {
        const quality_args qa = {.model_path = model_path, .text_path = text, .N = N, .windows = windows,
                                 .budgets = budgets, .n_budgets = n_budgets, .o = &qo, .n_threads = n_threads,
                                 .json_out = json_out};
        return run_quality(&qa);
    }
    const handoff_args ha = {.model_path = model_path, .contexts = contexts, .n_contexts = n_contexts, .turn = turn,
                             .reps = reps, .dir = dir, .co = &co, .n_threads = n_threads, .json_out = json_out};
    return run_handoff(&ha);
}
