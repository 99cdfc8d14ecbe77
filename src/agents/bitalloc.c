/* bitalloc.c - bit allocation for CacheCards (contract and formulas in
 * bitalloc.h; the reasoning in docs/bit-allocation.md). */
#include "agents/bitalloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "store/cards.h"
#include "kv/kvformat.h"

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
    p->min_bits = 0;
    p->weighting = AK_BITALLOC_WEIGHT_MIX;
    p->mass_power = 1.0;
    p->key_weight = 0.0;
    for (int i = 0; i < AK_BITALLOC_N_WIDTHS; i++) p->err[i] = ldexp(1.0, -2 * ak_bitalloc_widths_table[i]);
}

/* The chain-measured options (bitalloc.h). Values carry most of the error
 * at 4 bits on our formats and a 2-bit token costs more than its squared
 * error says, hence the floor and the exchange rate between the sides. */
void ak_bitalloc_params_measured(ak_bitalloc_params *p) {
    p->weighting = AK_BITALLOC_WEIGHT_MASS;
    p->mass_power = 0.5;
    p->min_bits = 4;
    p->n_sinks = 0;
    p->key_weight = 0.1;
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

/* Adds (m[t] / mean(m))^power to acc[t] (a mean of 0: 1). */
static void add_mass_power(double *acc, const double *m, int n, double power) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += m[i];
    double mean = sum / n;
    for (int i = 0; i < n; i++) acc[i] += mean > 0.0 ? pow(m[i] / mean, power) : 1.0;
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
    if ((int)p->weighting < 0 || (int)p->weighting > AK_BITALLOC_WEIGHT_NONE)
        return ak_failc(err, AK_ERR_INVALID, "unknown weighting %d", (int)p->weighting);
    if (p->weighting == AK_BITALLOC_WEIGHT_MASS && (!(p->mass_power > 0.0) || !isfinite(p->mass_power)))
        return ak_failc(err, AK_ERR_INVALID, "mass power %g (must be finite and > 0)", p->mass_power);
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
    if (p->weighting == AK_BITALLOC_WEIGHT_NONE) {
        /* every token alike */
    } else if (in->mass && p->weighting == AK_BITALLOC_WEIGHT_MASS) {
        for (int i = 0; i < n; i++) tmp[i] = in->exposure ? in->mass[i] / in->exposure[i] : in->mass[i];
        add_mass_power(imp, tmp, n, p->mass_power);
        wsum = 1.0;
    } else if (p->weighting == AK_BITALLOC_WEIGHT_MASS) {
        /* no mass: every token alike */
    } else if (in->mass) {
        for (int i = 0; i < n; i++) tmp[i] = in->exposure ? in->mass[i] / in->exposure[i] : in->mass[i];
        add_mass_term(imp, tmp, n, W_MASS);
        wsum += W_MASS;
    }
    if (p->weighting != AK_BITALLOC_WEIGHT_MIX) {
        /* the mass alone, or nothing */
    } else if (in->variance) {
        for (int i = 0; i < n; i++)
            tmp[i] = in->exposure ? in->variance[i] / (in->exposure[i] * in->exposure[i]) : in->variance[i];
        add_normalized(imp, tmp, n, W_VARIANCE);
        wsum += W_VARIANCE;
    }
    if (p->weighting == AK_BITALLOC_WEIGHT_MIX && in->entropy) add_normalized(imp, in->entropy, n, W_ENTROPY), wsum += W_ENTROPY;
    if (p->weighting == AK_BITALLOC_WEIGHT_MIX && in->tokens) {
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
    int lv;          /* the token's level now */
    int to;          /* the level the step reaches */
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

/* Token t's weighted error at level j: score * its measured error, or
 * score * the model's. */
static double werr(const ak_bitalloc_greedy *g, int t, int j) {
    return g->score[t] * (g->errors ? g->errors[(size_t)t * AK_BITALLOC_N_WIDTHS + j] : g->model[j]);
}

/* Token t's best next step from level lv, to a level <= cl costing at most
 * `afford` bits: the level j of largest error drop per bit (e(lv) - e(j)) /
 * (W[j] - W[lv]), the nearest on ties. From the start, taking these steps
 * walks the lower convex hull of (bits, error): each step's drop per bit is
 * no larger than the previous one's, which is what makes the greedy over
 * all tokens' steps a marginal-analysis allocation. Fills *to and *gain;
 * returns 0 when no step is affordable or none lowers the error (a gain <
 * 0), else 1. With the model (adjacent steps only, convex by the table's
 * check) the step is always lv + 1 and its gain score * per_bit[lv]. */
static int next_step(const ak_bitalloc_greedy *g, const double *per_bit, int t, int lv, int cl, long afford, int *to,
                     double *gain) {
    const int *W = ak_bitalloc_widths_table;
    if (!g->errors) {
        if (lv >= cl || W[lv + 1] - W[lv] > afford) return 0;
        *to = lv + 1;
        *gain = g->score[t] * per_bit[lv];
        return 1;
    }
    int best = -1;
    double bg = 0.0, e0 = werr(g, t, lv);
    for (int j = lv + 1; j <= cl && W[j] - W[lv] <= afford; j++) {
        double r = (e0 - werr(g, t, j)) / (W[j] - W[lv]);
        if (best < 0 || r > bg) best = j, bg = r;
    }
    if (best < 0 || !(bg >= 0.0)) return 0;
    *to = best;
    *gain = bg;
    return 1;
}

/* The greedy of bitalloc.h (both error sources). Returns the total bits or
 * -1 (err set). */
static long greedy(const ak_bitalloc_greedy *g, uint8_t *bits, int *pinned, ak_error *err) {
    const int *W = ak_bitalloc_widths_table;
    int n = g->n;
    const uint8_t *cap = g->cap;
    if (n <= 0) return ak_failc(err, AK_ERR_INVALID, "bit allocation over %d tokens", n);
    if (!budget_ok(g->budget)) return ak_failc(err, AK_ERR_INVALID, "bit budget %g outside [2, 16]", g->budget);
    int sink_lv = -1, floor_lv = 0;
    for (int i = 0; i < AK_BITALLOC_N_WIDTHS; i++) {
        if (W[i] == g->sink_bits) sink_lv = i;
        if (W[i] == g->min_bits) floor_lv = i;
    }
    if (sink_lv < 0) return ak_failc(err, AK_ERR_INVALID, "sink width %d is not 2, 4, 8 or 16", g->sink_bits);
    if (g->min_bits != 0 && W[floor_lv] != g->min_bits)
        return ak_failc(err, AK_ERR_INVALID, "floor width %d is not 0, 2, 4, 8 or 16", g->min_bits);
    /* Gain per bit of each step of the model; it must fall from step to
     * step, which is what makes a higher score never end below a lower one. */
    double per_bit[AK_BITALLOC_N_WIDTHS - 1] = {0};
    for (int i = 0; !g->errors && i < AK_BITALLOC_N_WIDTHS - 1; i++) {
        const double *e = g->model;
        if (!isfinite(e[i]) || !(e[i + 1] >= 0.0) || !(e[i] > e[i + 1]))
            return ak_failc(err, AK_ERR_INVALID, "modeled errors must be finite, >= 0 and strictly decreasing");
        per_bit[i] = (e[i] - e[i + 1]) / (W[i + 1] - W[i]);
        if (i > 0 && per_bit[i] > per_bit[i - 1])
            return ak_failc(err, AK_ERR_INVALID, "modeled errors must gain less per bit at each wider step");
    }
    for (int i = 0; i < n; i++) {
        if (!(g->score[i] >= 0.0) || !isfinite(g->score[i]))
            return ak_failc(err, AK_ERR_INVALID, "score of token %d is %g (must be finite and >= 0)", i, g->score[i]);
        if (cap && cap[i] < 2) return ak_failc(err, AK_ERR_INVALID, "cap of token %d is %d (below 2)", i, cap[i]);
        for (int j = 0; g->errors && j < AK_BITALLOC_N_WIDTHS; j++) {
            double e = g->errors[(size_t)i * AK_BITALLOC_N_WIDTHS + j];
            if (!(e >= 0.0) || !isfinite(e))
                return ak_failc(err, AK_ERR_INVALID, "measured error of token %d at %d bits is %g (must be finite and >= 0)",
                                i, W[j], e);
        }
    }
    /* The largest integer total L with L / n <= budget, as the caller will
     * check it in doubles. */
    long limit = (long)floor(g->budget * n);
    while ((double)(limit + 1) / n <= g->budget) limit++;
    while ((double)limit / n > g->budget) limit--;

    step *heap = ak_malloc((size_t)n * sizeof *heap, err);
    if (!heap) return -1;
    int rbits = 0;
    while (rbits < 31 && (1u << rbits) < (uint32_t)n) rbits++;
    /* Kept widths first (a token never starts below its keep, nor above
     * its cap); a budget they do not fit in is the caller's error. Then the
     * floor, to every token or to none: a floor the budget cannot pay for
     * everywhere would go to the first tokens only, which is a position
     * policy, not a floor. */
    long used = 0, with_floor = 0;
    for (int i = 0; i < n; i++) {
        int cl = cap ? level_at_most(cap[i]) : AK_BITALLOC_N_WIDTHS - 1;
        int k = g->keep && g->keep[i] >= 2 ? level_at_most(g->keep[i]) : 0;
        if (k > cl) k = cl;
        int f = floor_lv > k ? (floor_lv < cl ? floor_lv : cl) : k;
        if (f < k) f = k;
        bits[i] = (uint8_t)W[k];
        used += W[k];
        with_floor += W[f];
    }
    if (used > limit) {
        free(heap);
        return ak_failc(err, AK_ERR_INVALID, "kept widths take %ld bits, more than the budget's %ld", used, limit);
    }
    if (floor_lv > 0 && with_floor <= limit) {
        used = with_floor;
        for (int i = 0; i < n; i++) {
            int cl = cap ? level_at_most(cap[i]) : AK_BITALLOC_N_WIDTHS - 1, k = level_at_most(bits[i]);
            int f = floor_lv < cl ? floor_lv : cl;
            if (f > k) bits[i] = (uint8_t)W[f];
        }
    }
    int npin = 0, n_sinks = g->n_sinks > n ? n : g->n_sinks;
    for (int i = 0; i < n_sinks; i++) {
        int lv = sink_lv, cl = cap ? level_at_most(cap[i]) : AK_BITALLOC_N_WIDTHS - 1, now = level_at_most(bits[i]);
        if (lv > cl) lv = cl;
        if (lv < now) lv = now;
        if (used + W[lv] - W[now] > limit) break;   /* the budget wins over pins: first sinks first */
        used += W[lv] - W[now];
        bits[i] = (uint8_t)W[lv];
        npin++;
    }
    int hn = 0;
    for (int i = 0; i < n; i++) {
        int lv = level_at_most(bits[i]), cl = cap ? level_at_most(cap[i]) : AK_BITALLOC_N_WIDTHS - 1, to;
        double gain;
        if (!next_step(g, per_bit, i, lv, cl, limit - used, &to, &gain)) continue;
        heap[hn].gain = gain;
        heap[hn].rank = g->spread ? bit_reverse((uint32_t)i, rbits) : (uint32_t)i;
        heap[hn].pos = i;
        heap[hn].lv = lv;
        heap[hn].to = to;
        hn++;
    }
    for (int i = hn / 2 - 1; i >= 0; i--) sift_down(heap, hn, i);
    while (hn > 0 && limit - used >= 2) {
        step *top = &heap[0];
        int cl = cap ? level_at_most(cap[top->pos]) : AK_BITALLOC_N_WIDTHS - 1;
        int cost = W[top->to] - W[top->lv];
        if (used + cost > limit) {
            /* The step no longer fits; the token's best step that does (a
             * shorter one off the hull; none with the model, whose steps
             * are adjacent) goes back in, or the token is done: the budget
             * only shrinks. */
            if (next_step(g, per_bit, top->pos, top->lv, cl, limit - used, &top->to, &top->gain)) {
                sift_down(heap, hn, 0);
            } else {
                heap[0] = heap[--hn];
                sift_down(heap, hn, 0);
            }
            continue;
        }
        used += cost;
        top->lv = top->to;
        bits[top->pos] = (uint8_t)W[top->lv];
        if (!next_step(g, per_bit, top->pos, top->lv, cl, limit - used, &top->to, &top->gain)) heap[0] = heap[--hn];
        sift_down(heap, hn, 0);
    }
    free(heap);
    if (pinned) *pinned = npin;
    return used;
}

/* The greedy of bitalloc.h over precomputed scores, measured errors or the
 * model. */
long ak_bitalloc_widths(const ak_bitalloc_greedy *g, uint8_t *bits, int *pinned, ak_error *err) {
    if (!g->errors && !g->model) return ak_failc(err, AK_ERR_INVALID, "no measured errors and no error model");
    return greedy(g, bits, pinned, err);
}

/* Quantizes each vector at each width's format of the side and adds the
 * squared distance of its dequantized copy (bitalloc.h). */
int ak_bitalloc_measure_errors(const float *x, int n_vec, int d, int side, double out[AK_BITALLOC_N_WIDTHS],
                               ak_error *err) {
    if (n_vec < 0 || (side != 0 && side != 1))
        return ak_failc(err, AK_ERR_INVALID, "error measure of %d vectors on side %d", n_vec, side);
    const ak_kv_format_info *fi[AK_BITALLOC_N_WIDTHS];
    size_t most = 0;
    for (int j = 0; j < AK_BITALLOC_N_WIDTHS; j++) {
        int w = ak_bitalloc_widths_table[j];
        ak_kv_format f = side ? ak_card_value_format(w) : ak_card_key_format(w);
        if (!ak_kv_format_supports(f, d))
            return ak_failc(err, AK_ERR_INVALID, "format %s cannot store vectors of %d values",
                            ak_kv_format_get(f) ? ak_kv_format_get(f)->name : "?", d);
        fi[j] = ak_kv_format_get(f);
        if (fi[j]->vec_bytes(d) > most) most = fi[j]->vec_bytes(d);
    }
    /* one buffer for the code, one for the copy, each aligned for floats */
    size_t words = (most + sizeof(float) - 1) / sizeof(float);
    float *buf = ak_malloc(sizeof(float) * (words + (size_t)d), err);
    if (!buf) return -1;
    float *copy = buf + words;
    for (int v = 0; v < n_vec; v++) {
        const float *xv = x + (size_t)v * d;
        for (int j = 0; j < AK_BITALLOC_N_WIDTHS; j++) {
            fi[j]->quantize(xv, d, buf);
            fi[j]->dequantize(buf, d, copy);
            double e = 0.0;
            for (int i = 0; i < d; i++) {
                double r = (double)xv[i] - copy[i];
                e += r * r;
            }
            out[j] += e;
        }
    }
    free(buf);
    return 0;
}

/* Fills one side's figures of a result from its widths. */
static void tally(const uint8_t *bits, int n, long sum, long *sum_out, double *mean, int *count) {
    *sum_out = sum;
    *mean = (double)sum / n;
    for (int i = 0; i < AK_BITALLOC_N_WIDTHS; i++) count[i] = 0;
    for (int i = 0; i < n; i++) count[level_at_most(bits[i])]++;
}

/* The joint allocation (params' key_weight > 0): keys and values as one
 * range of 2n items, keys first, under the mean budget b; a key's weight is
 * key_weight * s(t), a value's s(t); a side without measured errors uses
 * the model's table. No pins. Returns 0 or -1. */
static int run_joint(const ak_bitalloc_input *in, const ak_bitalloc_params *p, const double *score, double b,
                     int floor_bits, uint8_t *bits_k, uint8_t *bits_v, ak_error *err) {
    int n = in->n, rc = -1;
    size_t n2 = 2 * (size_t)n;
    int measured = in->err_k || in->err_v;
    double *s2 = ak_malloc(n2 * sizeof *s2, err);
    double *e2 = measured ? ak_malloc(n2 * AK_BITALLOC_N_WIDTHS * sizeof *e2, err) : NULL;
    uint8_t *u8 = ak_malloc(n2 * 3, err);   /* caps, keeps, widths */
    if (!s2 || (measured && !e2) || !u8) goto done;
    uint8_t *cap2 = u8, *keep2 = u8 + n2, *w2 = u8 + 2 * n2;
    for (int i = 0; i < n; i++) {
        s2[i] = p->key_weight * score[i];
        s2[n + i] = score[i];
        cap2[i] = in->cap_k ? in->cap_k[i] : 16;
        cap2[n + i] = in->cap_v ? in->cap_v[i] : 16;
        keep2[i] = in->keep_k ? in->keep_k[i] : 0;
        keep2[n + i] = in->keep_v ? in->keep_v[i] : 0;
        for (int j = 0; measured && j < AK_BITALLOC_N_WIDTHS; j++) {
            e2[(size_t)i * AK_BITALLOC_N_WIDTHS + j] = in->err_k ? in->err_k[(size_t)i * AK_BITALLOC_N_WIDTHS + j] : p->err[j];
            e2[((size_t)n + i) * AK_BITALLOC_N_WIDTHS + j] =
                in->err_v ? in->err_v[(size_t)i * AK_BITALLOC_N_WIDTHS + j] : p->err[j];
        }
    }
    if (n2 > (size_t)INT32_MAX) {
        ak_failc(err, AK_ERR_INVALID, "bit allocation over %d tokens", n);
        goto done;
    }
    ak_bitalloc_greedy g = {.score = s2, .errors = e2, .model = p->err, .n = (int)n2, .budget = b, .cap = cap2,
                            .min_bits = floor_bits, .n_sinks = 0, .sink_bits = p->sink_bits, .spread = 0,
                            .keep = keep2};
    if (greedy(&g, w2, NULL, err) < 0) goto done;
    memcpy(bits_k, w2, (size_t)n);
    memcpy(bits_v, w2 + n, (size_t)n);
    rc = 0;
done:
    free(s2);
    free(e2);
    free(u8);
    return rc;
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
    int uni = p->policy == AK_BITALLOC_UNIFORM;
    int sinks = uni ? 0 : p->n_sinks;
    int spread = uni ? p->spread : 0;
    int floor_bits = uni ? 0 : p->min_bits;
    int pk = 0, pv = 0;
    if (!uni && p->key_weight > 0.0) {
        if (!isfinite(p->key_weight)) {
            ak_failc(err, AK_ERR_INVALID, "key weight %g (must be finite and >= 0)", p->key_weight);
            goto done;
        }
        rc = run_joint(in, p, score, (bk + bv) / 2.0, floor_bits, bits_k, bits_v, err);
        if (rc < 0) goto done;
        long sk = 0, sv = 0;
        for (int i = 0; i < in->n; i++) sk += bits_k[i], sv += bits_v[i];
        if (res) {
            tally(bits_k, in->n, sk, &res->sum_k, &res->mean_k, res->count_k);
            tally(bits_v, in->n, sv, &res->sum_v, &res->mean_v, res->count_v);
            res->pinned_k = res->pinned_v = 0;
        }
        goto done;
    }
    if (!(p->key_weight >= 0.0)) {
        ak_failc(err, AK_ERR_INVALID, "key weight %g (must be finite and >= 0)", p->key_weight);
        goto done;
    }
    /* uniform stays one width for all: measured errors and the floor are
     * for the adaptive policies */
    ak_bitalloc_greedy gk = {.score = score, .errors = uni ? NULL : in->err_k, .model = p->err, .n = in->n,
                             .budget = bk, .cap = in->cap_k, .min_bits = floor_bits, .n_sinks = sinks,
                             .sink_bits = p->sink_bits, .spread = spread, .keep = uni ? NULL : in->keep_k};
    ak_bitalloc_greedy gv = {.score = score, .errors = uni ? NULL : in->err_v, .model = p->err, .n = in->n,
                             .budget = bv, .cap = in->cap_v, .min_bits = floor_bits, .n_sinks = sinks,
                             .sink_bits = p->sink_bits, .spread = spread, .keep = uni ? NULL : in->keep_v};
    long sk = greedy(&gk, bits_k, &pk, err);
    if (sk < 0) goto done;
    long sv = greedy(&gv, bits_v, &pv, err);
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
