/* bitalloc.c - bit allocation for CacheCards (contract and formulas in
 * bitalloc.h; the reasoning in docs/bit-allocation.md). */
#include "bitalloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const int ak_bitalloc_widths_table[AK_BITALLOC_N_WIDTHS] = {2, 4, 8, 16};

/* Weights of I's terms. Mass is the most direct signal (a token's K/V error
 * reaches the output in proportion to the attention it receives), so it
 * weighs twice any other term; it enters squared (add_mass_term). */
#define W_MASS 0.4
#define W_VARIANCE 0.2
#define W_ENTROPY 0.2
#define W_FREQ 0.2

static const char *const policy_names[] = {"uniform", "importance", "topology"};
static const char *const segment_names[AK_SEG_COUNT] = {"other", "system", "task", "tool", "user", "assistant"};
/* Segment priors of T: what a downstream agent is likely to read again.
 * The system prompt is shared by the whole chain and the task statement is
 * what each hop works on (high); tool output holds facts that are sometimes
 * re-read (medium); user turns carry some instructions; the agent's own
 * turns and template glue are mostly chit-chat (low). */
static const double segment_priors[AK_SEG_COUNT] = {0.2, 1.0, 0.9, 0.5, 0.3, 0.2};

/* Fills p with the defaults of bitalloc.h. */
void ak_bitalloc_params_init(ak_bitalloc_params *p) {
    memset(p, 0, sizeof *p);
    p->policy = AK_BITALLOC_TOPOLOGY;
    p->budget_k = 4.0;
    p->budget_v = 0.0;
    p->lambda = 1.0;
    p->n_sinks = 4;
    p->sink_bits = 8;
    p->spread = 0;
    for (int i = 0; i < AK_BITALLOC_N_WIDTHS; i++) p->err[i] = ldexp(1.0, -2 * ak_bitalloc_widths_table[i]);
}

/* Parses a policy name; AK_ERR_INVALID for anything unknown. */
int ak_bitalloc_policy_parse(const char *name, ak_bitalloc_policy *out, ak_error *err) {
    for (int i = 0; name && i < (int)(sizeof policy_names / sizeof policy_names[0]); i++)
        if (strcmp(name, policy_names[i]) == 0) {
            *out = (ak_bitalloc_policy)i;
            return 0;
        }
    return ak_failc(err, AK_ERR_INVALID, "unknown bit allocation policy '%s' (uniform, importance, topology)",
                    name ? name : "(null)");
}

/* The name of a policy, "?" when out of range. */
const char *ak_bitalloc_policy_name(ak_bitalloc_policy p) {
    return (int)p >= 0 && (int)p < (int)(sizeof policy_names / sizeof policy_names[0]) ? policy_names[p] : "?";
}

/* Parses a segment name; AK_ERR_INVALID for anything unknown. */
int ak_bitalloc_segment_parse(const char *name, ak_segment *out, ak_error *err) {
    for (int i = 0; name && i < AK_SEG_COUNT; i++)
        if (strcmp(name, segment_names[i]) == 0) {
            *out = (ak_segment)i;
            return 0;
        }
    return ak_failc(err, AK_ERR_INVALID,
                    "unknown segment '%s' (system, task, tool, user, assistant, other)", name ? name : "(null)");
}

/* The name of a segment, "?" when out of range. */
const char *ak_bitalloc_segment_name(ak_segment s) {
    return (int)s >= 0 && (int)s < AK_SEG_COUNT ? segment_names[s] : "?";
}

/* The prior of a segment, 0 when out of range. */
double ak_bitalloc_segment_prior(ak_segment s) {
    return (int)s >= 0 && (int)s < AK_SEG_COUNT ? segment_priors[s] : 0.0;
}

/* True when b is a budget the allocator takes ([2, 16]; NaN is not). */
static int budget_ok(double b) { return b >= 2.0 && b <= 16.0; }

/* Splits a total average so keys get twice the bits above 2 that values
 * get, keys capped at 16; the mean of the two stays total. */
int ak_bitalloc_split_budget(double total, double *budget_k, double *budget_v, ak_error *err) {
    if (!budget_ok(total)) return ak_failc(err, AK_ERR_INVALID, "bit budget %g outside [2, 16]", total);
    double k = 2.0 + 4.0 * (total - 2.0) / 3.0;
    if (k > 16.0) k = 16.0;
    *budget_k = k;
    *budget_v = 2.0 * total - k;
    return 0;
}

/* Checks a statistic array: every entry finite and >= 0 (> 0 when
 * positive is set). */
static int stat_ok(const double *x, int n, int positive, const char *what, ak_error *err) {
    for (int i = 0; i < n; i++)
        if (!(x[i] >= 0.0) || !isfinite(x[i]) || (positive && x[i] == 0.0))
            return ak_failc(err, AK_ERR_INVALID, "%s of token %d is %g (must be finite and %s 0)", what, i, x[i],
                            positive ? ">" : ">=");
    return 0;
}

/* Adds w * x[t] / mean(x) to acc[t] for every t (x as doubles); a mean of 0
 * carries no information, so the term is w * 1 then. */
static void add_normalized(double *acc, const double *x, int n, double w) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += x[i];
    double mean = sum / n;
    for (int i = 0; i < n; i++) acc[i] += w * (mean > 0.0 ? x[i] / mean : 1.0);
}

/* Adds w * (m[t] / mean(m))^2 to acc[t]: quantization errors add up in the
 * output as p * delta, so their variance grows with the square of the
 * attention p a token receives; squaring keeps heavy hitters' scores as far
 * from the rest as their sensitivity is (a mean of 0: w * 1). */
static void add_mass_term(double *acc, const double *m, int n, double w) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += m[i];
    double mean = sum / n;
    for (int i = 0; i < n; i++) {
        double r = mean > 0.0 ? m[i] / mean : 1.0;
        acc[i] += w * r * r;
    }
}

/* Orders (token id, position) pairs by id then position. */
static int cmp_id_pos(const void *a, const void *b) {
    const int64_t *x = a, *y = b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

/* Fills idf[t] = ln(1 + n / count of tokens[t] in the range): sorts
 * (id, position) pairs, so no table as large as the vocabulary is needed. */
static int inverse_frequency(const int32_t *tokens, int n, double *idf, ak_error *err) {
    int64_t *pairs = ak_malloc((size_t)n * 2 * sizeof *pairs, err);
    if (!pairs) return -1;
    for (int i = 0; i < n; i++) {
        pairs[2 * i] = tokens[i];
        pairs[2 * i + 1] = i;
    }
    qsort(pairs, (size_t)n, 2 * sizeof *pairs, cmp_id_pos);
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && pairs[2 * j] == pairs[2 * i]) j++;
        double v = log(1.0 + (double)n / (j - i));
        for (int k = i; k < j; k++) idf[pairs[2 * k + 1]] = v;
        i = j;
    }
    free(pairs);
    return 0;
}

/* Computes I, T and s per token (formulas in bitalloc.h); outputs may be NULL. */
int ak_bitalloc_scores(const ak_bitalloc_input *in, const ak_bitalloc_params *p, double *importance,
                       double *transfer, double *score, ak_error *err) {
    int n = in->n;
    if (n <= 0) return ak_failc(err, AK_ERR_INVALID, "bit allocation over %d tokens", n);
    if ((int)p->policy < 0 || (int)p->policy > AK_BITALLOC_TOPOLOGY)
        return ak_failc(err, AK_ERR_INVALID, "unknown bit allocation policy %d", (int)p->policy);
    if (!(p->lambda >= 0.0) || !isfinite(p->lambda))
        return ak_failc(err, AK_ERR_INVALID, "topology weight lambda %g (must be finite and >= 0)", p->lambda);
    if (in->mass && stat_ok(in->mass, n, 0, "attention mass", err)) return -1;
    if (in->variance && stat_ok(in->variance, n, 0, "attention variance", err)) return -1;
    if (in->entropy && stat_ok(in->entropy, n, 0, "attention entropy", err)) return -1;
    if (in->exposure && stat_ok(in->exposure, n, 1, "exposure", err)) return -1;
    for (int i = 0; in->segment && i < n; i++)
        if (in->segment[i] >= AK_SEG_COUNT)
            return ak_failc(err, AK_ERR_INVALID, "segment %d of token %d is unknown", in->segment[i], i);
    for (int i = 0; in->overlap && i < n; i++)
        if (in->overlap[i] < 0)
            return ak_failc(err, AK_ERR_INVALID, "overlap of token %d is %d (must be >= 0)", i, (int)in->overlap[i]);

    double *imp = ak_calloc((size_t)n * 2, sizeof *imp, err);
    if (!imp) return -1;
    double *tmp = imp + n;
    double wsum = 0.0;
    /* Mass per query that could see the token: the cumulative mass of the
     * first tokens grows with the context's length, which says nothing of
     * what later queries (the receiver's) will give them. */
    if (in->mass) {
        for (int i = 0; i < n; i++) tmp[i] = in->exposure ? in->mass[i] / in->exposure[i] : in->mass[i];
        add_mass_term(imp, tmp, n, W_MASS);
        wsum += W_MASS;
    }
    if (in->variance) {
        for (int i = 0; i < n; i++)
            tmp[i] = in->exposure ? in->variance[i] / (in->exposure[i] * in->exposure[i]) : in->variance[i];
        add_normalized(imp, tmp, n, W_VARIANCE);
        wsum += W_VARIANCE;
    }
    if (in->entropy) add_normalized(imp, in->entropy, n, W_ENTROPY), wsum += W_ENTROPY;
    if (in->tokens) {
        if (inverse_frequency(in->tokens, n, tmp, err)) {
            free(imp);
            return -1;
        }
        add_normalized(imp, tmp, n, W_FREQ);
        wsum += W_FREQ;
    }
    for (int i = 0; i < n; i++) {
        double I = wsum > 0.0 ? imp[i] / wsum : 1.0;
        int seg = in->segment ? in->segment[i] : AK_SEG_OTHER;
        double o = in->overlap ? in->overlap[i] : 0;
        double T = 1.0 - (1.0 - segment_priors[seg]) / (1.0 + o);
        double s = p->policy == AK_BITALLOC_UNIFORM      ? 1.0
                   : p->policy == AK_BITALLOC_IMPORTANCE ? I
                                                         : I * (1.0 + p->lambda * T);
        if (importance) importance[i] = I;
        if (transfer) transfer[i] = T;
        if (score) score[i] = s;
    }
    free(imp);
    return 0;
}

/* Index in the width table of the largest width <= w, or -1 (w < 2). */
static int level_at_most(int w) {
    int l = -1;
    for (int i = 0; i < AK_BITALLOC_N_WIDTHS; i++)
        if (ak_bitalloc_widths_table[i] <= w) l = i;
    return l;
}

/* One candidate upgrade step of the greedy: token pos from level lv to lv + 1. */
typedef struct {
    double gain;     /* score * error drop per bit of the step */
    uint32_t rank;   /* tie order: position, or bit-reversed position with spread */
    int pos;
    int lv;
} step;

/* True when a goes before b: larger gain, then smaller rank. */
static int step_before(const step *a, const step *b) {
    return a->gain > b->gain || (a->gain == b->gain && a->rank < b->rank);
}

/* Restores the heap below index i (max-heap in step_before order). */
static void sift_down(step *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && step_before(&h[l], &h[m])) m = l;
        if (r < n && step_before(&h[r], &h[m])) m = r;
        if (m == i) return;
        step t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Bit-reverses i over `bits` bits: the van der Corput order, whose first k
 * entries spread over [0, 2^bits) as evenly as a prefix can. */
static uint32_t bit_reverse(uint32_t i, int bits) {
    uint32_t r = 0;
    for (int b = 0; b < bits; b++) r |= ((i >> b) & 1u) << (bits - 1 - b);
    return r;
}

/* The greedy of bitalloc.h over precomputed scores. */
long ak_bitalloc_widths(const double *score, int n, double budget, const uint8_t *cap, int n_sinks,
                        int sink_bits, int spread, const double err_model[AK_BITALLOC_N_WIDTHS],
                        uint8_t *bits, int *pinned, ak_error *err) {
    const int *W = ak_bitalloc_widths_table;
    if (n <= 0) return ak_failc(err, AK_ERR_INVALID, "bit allocation over %d tokens", n);
    if (!budget_ok(budget)) return ak_failc(err, AK_ERR_INVALID, "bit budget %g outside [2, 16]", budget);
    int sink_lv = -1;
    for (int i = 0; i < AK_BITALLOC_N_WIDTHS; i++)
        if (W[i] == sink_bits) sink_lv = i;
    if (sink_lv < 0) return ak_failc(err, AK_ERR_INVALID, "sink width %d is not 2, 4, 8 or 16", sink_bits);
    /* Gain per bit of each step; it must fall from step to step, which is
     * what makes a higher score never end below a lower one. */
    double per_bit[AK_BITALLOC_N_WIDTHS - 1];
    for (int i = 0; i < AK_BITALLOC_N_WIDTHS - 1; i++) {
        if (!isfinite(err_model[i]) || !(err_model[i + 1] >= 0.0) || !(err_model[i] > err_model[i + 1]))
            return ak_failc(err, AK_ERR_INVALID, "modeled errors must be finite, >= 0 and strictly decreasing");
        per_bit[i] = (err_model[i] - err_model[i + 1]) / (W[i + 1] - W[i]);
        if (i > 0 && per_bit[i] > per_bit[i - 1])
            return ak_failc(err, AK_ERR_INVALID, "modeled errors must gain less per bit at each wider step");
    }
    for (int i = 0; i < n; i++) {
        if (!(score[i] >= 0.0) || !isfinite(score[i]))
            return ak_failc(err, AK_ERR_INVALID, "score of token %d is %g (must be finite and >= 0)", i, score[i]);
        if (cap && cap[i] < 2) return ak_failc(err, AK_ERR_INVALID, "cap of token %d is %d (below 2)", i, cap[i]);
    }
    /* The largest integer total L with L / n <= budget, as the caller will
     * check it in doubles. */
    long limit = (long)floor(budget * n);
    while ((double)(limit + 1) / n <= budget) limit++;
    while ((double)limit / n > budget) limit--;

    step *heap = ak_malloc((size_t)n * sizeof *heap, err);
    if (!heap) return -1;
    int rbits = 0;
    while (rbits < 31 && (1u << rbits) < (uint32_t)n) rbits++;
    long used = 2L * n;
    int npin = 0;
    for (int i = 0; i < n; i++) bits[i] = 2;
    if (n_sinks > n) n_sinks = n;
    for (int i = 0; i < n_sinks; i++) {
        int lv = sink_lv, cl = cap ? level_at_most(cap[i]) : AK_BITALLOC_N_WIDTHS - 1;
        if (lv > cl) lv = cl;
        if (used + W[lv] - 2 > limit) break;   /* the budget wins over pins: first sinks first */
        used += W[lv] - 2;
        bits[i] = (uint8_t)W[lv];
        npin++;
    }
    int hn = 0;
    for (int i = 0; i < n; i++) {
        int lv = level_at_most(bits[i]), cl = cap ? level_at_most(cap[i]) : AK_BITALLOC_N_WIDTHS - 1;
        if (lv >= cl) continue;
        heap[hn].gain = score[i] * per_bit[lv];
        heap[hn].rank = spread ? bit_reverse((uint32_t)i, rbits) : (uint32_t)i;
        heap[hn].pos = i;
        heap[hn].lv = lv;
        hn++;
    }
    for (int i = hn / 2 - 1; i >= 0; i--) sift_down(heap, hn, i);
    while (hn > 0 && limit - used >= 2) {
        step *top = &heap[0];
        int cost = W[top->lv + 1] - W[top->lv];
        if (used + cost > limit) {
            /* Never affordable again (the budget only shrinks and this
             * token's later steps cost more): drop it. */
            heap[0] = heap[--hn];
            sift_down(heap, hn, 0);
            continue;
        }
        used += cost;
        top->lv++;
        bits[top->pos] = (uint8_t)W[top->lv];
        int cl = cap ? level_at_most(cap[top->pos]) : AK_BITALLOC_N_WIDTHS - 1;
        if (top->lv >= cl) {
            heap[0] = heap[--hn];
        } else {
            top->gain = score[top->pos] * per_bit[top->lv];
        }
        sift_down(heap, hn, 0);
    }
    free(heap);
    if (pinned) *pinned = npin;
    return used;
}

/* Fills one side's figures of a result from its widths. */
static void tally(const uint8_t *bits, int n, long sum, long *sum_out, double *mean, int *count) {
    *sum_out = sum;
    *mean = (double)sum / n;
    for (int i = 0; i < AK_BITALLOC_N_WIDTHS; i++) count[i] = 0;
    for (int i = 0; i < n; i++) count[level_at_most(bits[i])]++;
}

/* Scores and allocates both sides (bitalloc.h). */
int ak_bitalloc_run(const ak_bitalloc_input *in, const ak_bitalloc_params *p, uint8_t *bits_k,
                    uint8_t *bits_v, ak_bitalloc_result *res, ak_error *err) {
    if (in->n <= 0) return ak_failc(err, AK_ERR_INVALID, "bit allocation over %d tokens", in->n);
    double bk = p->budget_k, bv = p->budget_v == 0.0 ? p->budget_k : p->budget_v;
    if (!budget_ok(bk)) return ak_failc(err, AK_ERR_INVALID, "key bit budget %g outside [2, 16]", bk);
    if (!budget_ok(bv)) return ak_failc(err, AK_ERR_INVALID, "value bit budget %g outside [2, 16]", bv);
    double *score = ak_malloc((size_t)in->n * sizeof *score, err);
    if (!score) return -1;
    int rc = -1;
    if (ak_bitalloc_scores(in, p, NULL, NULL, score, err)) goto done;
    /* Uniform means one width for all: pinning sinks would make it another
     * policy (importance without statistics does that). */
    int sinks = p->policy == AK_BITALLOC_UNIFORM ? 0 : p->n_sinks;
    int spread = p->policy == AK_BITALLOC_UNIFORM ? p->spread : 0;
    int pk = 0, pv = 0;
    long sk = ak_bitalloc_widths(score, in->n, bk, in->cap_k, sinks, p->sink_bits, spread, p->err, bits_k, &pk, err);
    if (sk < 0) goto done;
    long sv = ak_bitalloc_widths(score, in->n, bv, in->cap_v, sinks, p->sink_bits, spread, p->err, bits_v, &pv, err);
    if (sv < 0) goto done;
    if (res) {
        tally(bits_k, in->n, sk, &res->sum_k, &res->mean_k, res->count_k);
        tally(bits_v, in->n, sv, &res->sum_v, &res->mean_v, res->count_v);
        res->pinned_k = pk;
        res->pinned_v = pv;
    }
    rc = 0;
done:
    free(score);
    return rc;
}
