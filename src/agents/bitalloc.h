/* bitalloc.h - bit allocation for CacheCards: a width per token from
 * {2, 4, 8, 16} for keys and for values, chosen greedily under an
 * average-bits budget from how important each token is to the agent that
 * computed it (I) and how likely the next agents are to need it (T).
 * (QKVShare's controller; the scoring and the greedy are documented in
 * docs/bit-allocation.md.)
 *
 * Scores, per token t of a range of n tokens (every feature "normalized"
 * below is divided by its mean over the range, so a typical token scores
 * about 1 and heavy hitters score their multiple of the mean; a feature
 * whose mean is 0 carries no information and counts as 1 everywhere):
 *
 *   I(t) = (0.4 m~^2 + 0.2 v~ + 0.2 e~ + 0.2 u~) / (sum of the weights of
 *          the features present)
 *     m~  attention mass the token receives (per query that could see it,
 *         when an exposure is given), normalized (squared: the error
 *         a token's K/V cause in the output has a variance that grows with
 *         the square of the attention it receives)
 *     v~  variance of that mass across heads (over exposure^2), normalized
 *     e~  entropy of the attention the token gives, normalized
 *     u~  inverse frequency ln(1 + n / count of the token id in the range),
 *         normalized
 *   (a feature passed as NULL is left out; with none, I(t) = 1)
 *
 *   T(t) = 1 - (1 - P(segment(t))) / (1 + overlap(t))
 *     P   the segment prior (ak_bitalloc_segment_prior: system 1.0, task
 *         0.9, tool 0.5, user 0.3, assistant 0.2, other 0.2)
 *     overlap  how many times this token's content was handed off before in
 *         the same chain (each hand-off halves the rest of the way to 1)
 *
 *   score s(t): uniform 1; importance I(t); topology I(t) * (1 + lambda T(t)).
 *
 * Allocation (ak_bitalloc_widths): every token starts at 2 bits; the first
 * n_sinks tokens are pinned to sink_bits (in order, while the budget allows);
 * then, over and over, the affordable upgrade step (2->4, 4->8, 8->16) of
 * largest gain per bit s(t) * (E(w) - E(w')) / (w' - w) is taken, E being
 * the modeled quantization error of a width (default 4^-w); equal gains go
 * to the earlier position. The budget is an integer number of bits: the
 * largest L with L / n <= B, so the mean width never exceeds B. Each token's
 * width never exceeds its cap. As E's gain per bit falls from step to step,
 * of two tokens neither pinned nor capped, the one with the strictly higher
 * score (or the earlier, on equal scores) never gets the lower width.
 *
 * Measured errors (input err_k / err_v, optional): E becomes each token's
 * own e_t(w), the squared error its vectors get in the card's format of
 * width w (ak_bitalloc_measure_errors), and the greedy minimizes
 *
 *     sum_t s(t) * e_t(w_t)    subject to    sum_t w_t <= L
 *
 * by marginal gains over each token's lower convex hull of (w, s e_t(w))
 * (a step may skip a width: 2 -> 8), within one hull step's drop of the
 * optimum (ak_bitalloc_widths with errors). Options of params, all off by
 * default (params_init keeps the behaviour above): a floor width
 * (min_bits) for every token when the budget pays it for all; per-token
 * kept widths (input keep_k / keep_v); I(t) from the mass alone
 * (m~^mass_power) or nothing (weighting); and one allocation over keys and
 * values together (key_weight > 0: a key's error weighs key_weight times a
 * value's, under the mean of the two budgets). Uniform ignores them all:
 * it stays one width for everyone. docs/bit-allocation.md says what the
 * 5-hop chain measured with each.
 *
 * Pure: no I/O, no global state; thread-safe (ak_bitalloc_run and
 * ak_bitalloc_widths allocate scratch memory and free it before returning).
 */
#ifndef AK_BITALLOC_H
#define AK_BITALLOC_H

#include <stdint.h>

#include "base/util.h"

/* The widths a token can get, in bits, in increasing order. */
#define AK_BITALLOC_N_WIDTHS 4
extern const int ak_bitalloc_widths_table[AK_BITALLOC_N_WIDTHS]; /* 2, 4, 8, 16 */

typedef enum {
    AK_BITALLOC_UNIFORM = 0,    /* the same width for every token (two nearest widths mixed) */
    AK_BITALLOC_IMPORTANCE,     /* s = I(t) */
    AK_BITALLOC_TOPOLOGY        /* s = I(t) * (1 + lambda T(t)) */
} ak_bitalloc_policy;

/* Where a token comes from in the context (the segment prior of T). */
typedef enum {
    AK_SEG_OTHER = 0,   /* anything else (template glue, unknown) */
    AK_SEG_SYSTEM,      /* system prompt: shared by every agent of the chain */
    AK_SEG_TASK,        /* the task statement handed down the chain */
    AK_SEG_TOOL,        /* tool output: facts, sometimes re-read downstream */
    AK_SEG_USER,        /* user turns */
    AK_SEG_ASSISTANT,   /* the agent's own turns (chit-chat, reasoning) */
    AK_SEG_COUNT
} ak_segment;

/* Per-token inputs of a range of n tokens. Every array but n may be NULL
 * (absent); present arrays have n entries. */
typedef struct {
    int n;
    const double *mass;       /* attention mass received (>= 0, finite; attnstats.h: ak_attn_stats_mass) */
    const double *variance;   /* its variance across heads (>= 0, finite; ak_attn_stats_mass_var) */
    const double *entropy;    /* entropy of the attention the token gives (>= 0, finite; ak_attn_stats_entropy) */
    const double *exposure;   /* how many query tokens could attend to the token (> 0, finite; on a
                                 causal model, length - slot): mass is divided by it and variance by
                                 its square, so a token is not favoured for having been in the
                                 context longer; NULL: mass and variance taken as they are */
    const int32_t *tokens;    /* token ids, for the inverse frequency */
    const uint8_t *segment;   /* ak_segment values; NULL: all AK_SEG_OTHER */
    const int32_t *overlap;   /* prior hand-offs of this content (>= 0); NULL: all 0 */
    const uint8_t *cap_k;     /* max key width per token (>= 2; rounded down to a width); NULL: 16 */
    const uint8_t *cap_v;     /* max value width per token, likewise */
    const double *err_k;      /* measured key error of each token at each width: n * 4 entries,
                                 token t's at err_k[4t + j] for width 2 << j (finite, >= 0;
                                 ak_bitalloc_measure_errors); NULL: params' modeled err */
    const double *err_v;      /* likewise for values */
    const uint8_t *keep_k;    /* per-token width to keep at least (a token handed in at that width
                                 that this allocation should not lower; 0: none; capped by cap_k;
                                 importance and topology only); NULL: none */
    const uint8_t *keep_v;    /* likewise for values */
} ak_bitalloc_input;

/* What I(t) is made of. */
typedef enum {
    AK_BITALLOC_WEIGHT_MIX = 0, /* the four-feature mix above */
    AK_BITALLOC_WEIGHT_MASS,    /* m~^mass_power alone (1 without a mass) */
    AK_BITALLOC_WEIGHT_NONE     /* 1: the measured errors alone decide */
} ak_bitalloc_weighting;

typedef struct {
    ak_bitalloc_policy policy;
    double budget_k;     /* average key bits, in [2, 16] */
    double budget_v;     /* average value bits in [2, 16]; 0: the same as budget_k */
    double lambda;       /* topology weight of T (>= 0) */
    int n_sinks;         /* the first n_sinks tokens are pinned (importance and topology only) */
    int sink_bits;       /* their minimum width: 2, 4, 8 or 16 */
    int spread;          /* uniform with a budget between two widths: 0 gives the
                            higher width to the first tokens, 1 spreads it evenly */
    double err[AK_BITALLOC_N_WIDTHS]; /* modeled error of widths 2, 4, 8, 16: strictly
                            decreasing, >= 0, with gain per bit falling step to step */
    int min_bits;        /* floor width of every token (importance and topology): 0 or 2
                            (none), 4, 8, 16; ignored on a side whose budget cannot pay it
                            for every token */
    ak_bitalloc_weighting weighting; /* what I(t) is */
    double mass_power;   /* the power of m~ with AK_BITALLOC_WEIGHT_MASS (> 0) */
    double key_weight;   /* 0: keys and values allocated apart, each under its budget; > 0
                            (importance and topology): one allocation over both sides under
                            the mean of the two budgets, a key's error weighing key_weight
                            times a value's (only the mean of both sides is then bounded) */
} ak_bitalloc_params;

/* What an allocation achieved, per side. */
typedef struct {
    long sum_k, sum_v;          /* total bits of the widths */
    double mean_k, mean_v;      /* sum / n: never above the budget */
    int count_k[AK_BITALLOC_N_WIDTHS], count_v[AK_BITALLOC_N_WIDTHS]; /* tokens at 2, 4, 8, 16 */
    int pinned_k, pinned_v;     /* sinks pinned (fewer than n_sinks when the budget ran short) */
} ak_bitalloc_result;

/* Defaults: policy topology, budget_k 4, budget_v 0 (same as keys), lambda
 * 1, n_sinks 4, sink_bits 8, spread 0, err = 4^-w (w = 2, 4, 8, 16). */
void ak_bitalloc_params_init(ak_bitalloc_params *p);

/* The options the 5-hop chain measured best with measured errors
 * (docs/bit-allocation.md, "What the 5-hop chain measured"): weighting
 * AK_BITALLOC_WEIGHT_MASS with mass_power 0.5, min_bits 4, n_sinks 0,
 * key_weight 0.1 (fitted on tiny-llama-h64). Leaves the policy, budgets and
 * everything else of p as they are. Meant with input err_k and err_v. */
void ak_bitalloc_params_measured(ak_bitalloc_params *p);

/* Parses "uniform", "importance" or "topology" into *out. Anything else
 * (NULL included): AK_ERR_INVALID. Returns 0 or -1. */
int ak_bitalloc_policy_parse(const char *name, ak_bitalloc_policy *out, ak_error *err);
/* The name ak_bitalloc_policy_parse reads ("?" for an unknown value). */
const char *ak_bitalloc_policy_name(ak_bitalloc_policy p);

/* Parses "system", "task", "tool", "user", "assistant" or "other" into
 * *out; anything else: AK_ERR_INVALID. Returns 0 or -1. */
int ak_bitalloc_segment_parse(const char *name, ak_segment *out, ak_error *err);
/* The name ak_bitalloc_segment_parse reads ("?" for an unknown value). */
const char *ak_bitalloc_segment_name(ak_segment s);
/* The segment prior P of T (table above); 0 for an unknown value. */
double ak_bitalloc_segment_prior(ak_segment s);

/* Splits an average of `total` bits over keys and values (their mean stays
 * `total`) so that keys get twice the bits above the 2-bit floor that values
 * get, keys capped at 16 (the rest to values): 4 -> 4.67 / 3.33, 8 -> 10 /
 * 6. Not the default (params_init gives both sides the same budget); for
 * callers that want keys favoured. total outside [2, 16]: AK_ERR_INVALID.
 * Returns 0 or -1. */
int ak_bitalloc_split_budget(double total, double *budget_k, double *budget_v, ak_error *err);

/* Computes, for each token of in, I(t), T(t) and the policy's score s(t)
 * (formulas above) into importance, transfer and score (n doubles each; any
 * may be NULL). Fails with AK_ERR_INVALID on n <= 0, a negative or
 * non-finite statistic, an exposure that is not finite and > 0, a segment >= AK_SEG_COUNT, a negative overlap, an
 * unknown policy or a negative or non-finite lambda; AK_ERR_NOMEM. Returns
 * 0 or -1. */
int ak_bitalloc_scores(const ak_bitalloc_input *in, const ak_bitalloc_params *p, double *importance,
                       double *transfer, double *score, ak_error *err);

/* What one side's greedy works from (ak_bitalloc_widths). */
typedef struct {
    const double *score;      /* n weights (>= 0, finite) */
    int n;
    double budget;            /* average bits, in [2, 16] */
    const uint8_t *cap;       /* max width per token (>= 2); NULL: 16 */
    const double *errors;     /* measured errors: n * 4 (finite, >= 0), token t's at widths 2, 4, 8,
                                 16 at errors[4t .. 4t + 3]; NULL: the model's */
    const double *model;      /* without errors: the modeled errors of widths 2, 4, 8, 16 (as
                                 params' err) */
    int min_bits;             /* floor width: 0 or 2 (none), 4, 8, 16 */
    const uint8_t *keep;      /* per-token width to start from (0: none; capped by cap); NULL: none */
    int n_sinks, sink_bits;   /* the first n_sinks tokens (<= 0: none) are pinned to sink_bits (2, 4,
                                 8 or 16; or their cap, if lower) */
    int spread;               /* ties: 0 to the earlier position, 1 to the earlier in an evenly
                                 spread order (bit-reversed positions) */
} ak_bitalloc_greedy;

/* The greedy alone: widths (2, 4, 8 or 16) for g's n tokens under an
 * average of g->budget bits, into bits[n]. Kept widths first (more than
 * the budget: AK_ERR_INVALID), then the floor for every token when the
 * budget pays it for all (else for none), then the sinks pinned while the
 * budget allows; then steps up by gain per bit, ties as g->spread says.
 * Without errors each step is the next width, of gain score[t] times the
 * model's error drop per bit. With errors the greedy minimizes sum_t
 * score[t] * errors[4t + level(t)]: each token's steps walk the lower
 * convex hull of its (bits, weighted error) points (a step may skip a
 * width: 2 -> 8), all tokens' steps taken in decreasing error drop per
 * bit; a step that no longer fits is replaced by the token's best one that
 * does. The result's objective is then within the drop of one hull step
 * (the largest of any token's) of the optimum over all width choices with
 * the same floor, pins and caps (the fractional-knapsack bound). *pinned
 * (if not NULL) gets the sinks pinned. Fails with AK_ERR_INVALID on n <=
 * 0, a budget outside [2, 16], a cap below 2, a bad score, sink_bits,
 * floor, measured error (negative or not finite) or model table (or none);
 * AK_ERR_NOMEM. Returns the total bits, or -1. */
long ak_bitalloc_widths(const ak_bitalloc_greedy *g, uint8_t *bits, int *pinned, ak_error *err);

/* Adds to out[j] (j = 0..3: widths 2, 4, 8, 16) the squared quantization
 * error sum_v ||x_v - deq(quant(x_v))||^2 of the n_vec vectors of d floats
 * at x (vector v at x + v * d) in the card format of that width for side
 * (0: keys q2, q4, q8, f16; 1: values tq2, tq4, q8, f16; cards.h), using
 * kvformat.h's quantize and dequantize, so the figures are the errors a card
 * made of these vectors will have. Fails with AK_ERR_INVALID on a bad side,
 * n_vec < 0 or a d the formats cannot store; AK_ERR_NOMEM. Returns 0 or -1. */
int ak_bitalloc_measure_errors(const float *x, int n_vec, int d, int side, double out[AK_BITALLOC_N_WIDTHS],
                               ak_error *err);

/* Scores in under p and allocates key widths into bits_k and value widths
 * into bits_v (n bytes each) under p's budgets; uniform scores every token
 * alike and pins nothing (p->spread applies to uniform only; the other
 * policies break ties by position). Importance and topology use in's
 * measured errors (per side, where given), keeps and p's floor, and with
 * p->key_weight > 0 allocate both sides in one greedy under the mean of the
 * two budgets (no pins; the mean of both sides' widths stays within it);
 * uniform ignores all four. res (if not NULL) gets what was achieved
 * (pinned 0 with key_weight). Fails as ak_bitalloc_scores and
 * ak_bitalloc_widths do (a budget_v other than 0 outside [2, 16], kept
 * widths the budget cannot pay, a key_weight negative or not finite too).
 * Deterministic: the same inputs give the same widths. Returns 0 or -1. */
int ak_bitalloc_run(const ak_bitalloc_input *in, const ak_bitalloc_params *p, uint8_t *bits_k,
                    uint8_t *bits_v, ak_bitalloc_result *res, ak_error *err);

#endif
