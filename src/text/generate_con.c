/* generate_con.c - a generator's constraint: the mask before the pick, the
 * budget that keeps a close within reach, the forced close, the lazy start
 * (generate.h: CONSTRAINED DECODING; generate_impl.h). */
#include "text/generate_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* How many picks a step may refuse for the budget before it takes the
 * close plan's next token (always within the budget). */
#define AK_GEN_CON_MAX_TRIES 16

struct ak_gen_con {
    ak_gen_constraint c;          /* the caller's; c.after points at after below */
    int rule;                     /* the rule it holds to */
    char *after;                  /* lazy: the text it begins after (NULL: none) */
    int n_after;
    int *fail;                    /* after's KMP failure function */
    int k;                        /* bytes of after the output ends with (free text) */
    int32_t *trig;                /* tokens whose bytes hold after's last byte: only they can complete it */
    int n_trig;
    int32_t *eog;                 /* end-of-generation tokens (lazy and required) */
    int n_eog;
    int32_t *after_tok;           /* after's tokens (required), n_after_tok of them; -1: none spells it */
    int n_after_tok;
    long start_plan;              /* the close plan's length from the rule's start */
    ak_gmatch *m;                 /* the output's state */
    ak_gmatch *tmp;               /* scratch: a pick tried before it is taken */
    ak_gmatch *start;             /* the rule's start, for the lazy start's checks */
    ak_tmscratch *scr;
    uint32_t *mask;
    int32_t *plan;                /* forced tokens: the close plan, or after's */
    long n_plan, plan_at, plan_cap;
    int closing;                  /* plan[plan_at..n_plan) is being emitted */
    int cut;                      /* the budget forced a close: the end is AK_GEN_LENGTH */
    int32_t n_index;              /* tokens of the vocabulary index */
    int n_logits;                 /* the logits' length (the sampler's vocabulary) */
};

/* The KMP step of after over byte b from k matched bytes. */
static int kmp_step(const ak_gen_con *c, int k, uint8_t b) {
    while (k > 0 && (uint8_t)c->after[k] != b) k = c->fail[k - 1];
    return (uint8_t)c->after[k] == b ? k + 1 : 0;
}

/* Where after completes in b[0..n) from k matched bytes: the index of its
 * last byte there, or -1 with *k_end the bytes matched at the end. */
static long trigger_at(const ak_gen_con *c, int k, const char *b, size_t n, int *k_end) {
    for (size_t i = 0; i < n; i++) {
        k = kmp_step(c, k, (uint8_t)b[i]);
        if (k == c->n_after) return (long)i;
    }
    *k_end = k;
    return -1;
}

/* Token t's bytes (none for a control token or an id past the index). */
static const char *token_bytes(const ak_gen_con *c, int32_t t, size_t *n) {
    *n = 0;
    if (t < 0 || t >= c->n_index) return "";
    return ak_vocab_index_token(c->c.vocab, t, n);
}

/* after's tokens by the tokenizer into *out (malloc'd), checked to spell
 * after byte for byte in v's tokens. Returns their count, or -1. */
static int after_tokens(const ak_tokenizer *tok, const ak_vocab_index *v, const char *after, int32_t **out) {
    int32_t *ids = NULL;
    size_t n = 0, at = 0, len = strlen(after);
    ak_error err = {0};
    *out = NULL;
    if (ak_tokenize(tok, after, len, AK_TOK_PARSE_SPECIAL, &ids, &n, &err) < 0) return -1;
    for (size_t i = 0; i < n && at <= len; i++) {
        size_t l = 0;
        const char *b = ids[i] >= 0 && ids[i] < ak_vocab_index_size(v) ? ak_vocab_index_token(v, ids[i], &l) : "";
        if (!l || at + l > len || memcmp(after + at, b, l)) { at = len + 1; break; }
        at += l;
    }
    if (at != len || n == 0 || n > 1024) {
        free(ids);
        return -1;
    }
    *out = ids;
    return (int)n;
}

/* The close plan from m into c->plan (grown as needed). Returns its
 * length, or -1 (no token spells it, or out of memory). */
static long plan_from(ak_gen_con *c, const ak_gmatch *m) {
    long cl = ak_gmatch_close_len(m);
    if (cl < 0) return -1;
    if (cl > c->plan_cap) {
        int32_t *p = realloc(c->plan, sizeof *p * (size_t)cl);
        if (!p) return -1;
        c->plan = p;
        c->plan_cap = cl;
    }
    return ak_tokmask_close_plan(c->c.masks, m, c->plan, (size_t)c->plan_cap);
}

/* 1 when m's close fits in `room` tokens. */
static int close_fits(ak_gen_con *c, const ak_gmatch *m, long room) {
    long cl = ak_gmatch_close_len(m);
    if (cl < 0) return 0;
    if (cl <= room) return 1;   /* a token spells at least a byte */
    long np = ak_tokmask_close_plan(c->c.masks, m, NULL, 0);
    return np >= 0 && np <= room;
}

void ak_gen_con_free(ak_gen *g) {
    ak_gen_con *c = g->con;
    if (!c) return;
    free(c->after);
    free(c->fail);
    free(c->trig);
    free(c->eog);
    free(c->after_tok);
    ak_gmatch_free(c->m);
    ak_gmatch_free(c->tmp);
    ak_gmatch_free(c->start);
    ak_tmscratch_free(c->scr);
    free(c->mask);
    free(c->plan);
    free(c);
    g->con = NULL;
}

/* The lazy start's tables: after copied, its failure function, the tokens
 * that can complete it, and (required) the end-of-generation tokens and
 * after's tokens. Returns 0 or -1 (out of memory). */
static int init_after(ak_gen *g, ak_gen_con *c, const char *after) {
    c->n_after = (int)strlen(after);
    if (!(c->after = strdup(after)) || !(c->fail = malloc(sizeof *c->fail * (size_t)c->n_after))) return -1;
    c->fail[0] = 0;
    for (int i = 1, k = 0; i < c->n_after; i++) {
        while (k > 0 && c->after[i] != c->after[k]) k = c->fail[k - 1];
        if (c->after[i] == c->after[k]) k++;
        c->fail[i] = k;
    }
    c->c.after = c->after;
    char last = c->after[c->n_after - 1];
    if (!(c->trig = malloc(sizeof *c->trig * (size_t)(c->n_index ? c->n_index : 1)))) return -1;
    for (int32_t t = 0; t < c->n_index; t++) {
        size_t n;
        const char *b = token_bytes(c, t, &n);
        if (n && memchr(b, last, n)) c->trig[c->n_trig++] = t;
    }
    int32_t *fit = realloc(c->trig, sizeof *fit * (size_t)(c->n_trig ? c->n_trig : 1));   /* a few of the vocabulary */
    if (fit) c->trig = fit;
    if (!c->c.required) return 0;
    int n_eog = 0;
    for (int32_t t = 0; t < c->n_index; t++) n_eog += ak_token_is_eog(g->tok, t);
    if (!(c->eog = malloc(sizeof *c->eog * (size_t)(n_eog ? n_eog : 1)))) return -1;
    for (int32_t t = 0; t < c->n_index; t++)
        if (ak_token_is_eog(g->tok, t)) c->eog[c->n_eog++] = t;
    c->n_after_tok = after_tokens(g->tok, c->c.vocab, after, &c->after_tok);
    return 0;
}

int ak_gen_con_init(ak_gen *g, const ak_gen_constraint *k, ak_error *err) {
    const ak_grammar *gr = k->grammar;
    if (!k->masks || !k->vocab) return ak_failc(err, AK_ERR_INVALID, "generation: a constraint without its masks");
    int rule = k->rule < 0 ? ak_grammar_root(gr) : k->rule;
    if (rule >= ak_grammar_n_rules(gr)) return ak_failc(err, AK_ERR_INVALID, "generation: no rule %d in the grammar", rule);
    ak_gen_con *c = calloc(1, sizeof *c);
    if (!c) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    g->con = c;
    c->c = *k;
    c->c.after = NULL;
    c->rule = rule;
    c->n_index = ak_vocab_index_size(k->vocab);
    c->n_logits = ak_sampler_vocab(g->smp);
    c->n_after_tok = -1;
    c->m = k->lazy ? ak_gmatch_new_free(gr) : ak_gmatch_new(gr);
    c->start = ak_gmatch_new(gr);
    c->tmp = ak_gmatch_new(gr);
    c->scr = ak_tmscratch_new(k->masks);
    c->mask = malloc(sizeof *c->mask * (ak_tokmask_words(k->masks) + 1));
    int bad = !c->m || !c->start || !c->tmp || !c->scr || !c->mask || ak_gmatch_begin(c->start, rule) < 0 ||
              (!k->lazy && ak_gmatch_begin(c->m, rule) < 0);
    if (!bad && k->lazy && k->after && k->after[0] && init_after(g, c, k->after) < 0) bad = 1;
    if (bad) {
        ak_gen_con_free(g);
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    c->start_plan = ak_tokmask_close_plan(k->masks, c->start, NULL, 0);
    return 0;
}

/* Sets the logits of the tokens mask refuses to -inf (and of ids past the
 * index: no bytes the grammar could check). */
static void apply_mask(const ak_gen_con *c, float *logits) {
    int32_t n = c->n_index < c->n_logits ? c->n_index : c->n_logits;
    size_t words = ((size_t)n + 31) / 32;
    for (size_t w = 0; w < words; w++) {
        uint32_t off = ~c->mask[w];
        while (off) {
            int32_t t = (int32_t)(w * 32) + __builtin_ctz(off);
            off &= off - 1;
            if (t < n) logits[t] = -INFINITY;
        }
    }
    for (int32_t t = n; t < c->n_logits; t++) logits[t] = -INFINITY;
}

/* Rules out, in free text before after, the tokens that complete after
 * with a rest the grammar refuses or whose close would not fit in left - 1
 * tokens. Returns 0, or -1 (out of memory). */
static int rule_out_triggers(ak_gen_con *c, float *logits, long left) {
    for (int i = 0; i < c->n_trig; i++) {
        int32_t t = c->trig[i];
        if (t >= c->n_logits || logits[t] == -INFINITY) continue;
        size_t n;
        const char *b = token_bytes(c, t, &n);
        int k;
        long at = trigger_at(c, c->k, b, n, &k);
        if (at < 0) continue;
        if (ak_gmatch_copy(c->tmp, c->start) < 0) return -1;
        size_t rest = n - (size_t)at - 1;
        int ok = (!rest || ak_gmatch_feed(c->tmp, b + at + 1, rest) == 0) && close_fits(c, c->tmp, left - 1);
        if (!ok) logits[t] = -INFINITY;
    }
    return 0;
}

/* Advances the constraint by tok where the pick did not already: the
 * grammar fed, or in free text after looked for (and the grammar begun
 * right after it, fed the rest of the token). */
static void advance(ak_gen_con *c, int32_t tok) {
    if (!ak_gmatch_is_free(c->m)) {
        ak_tokmask_accept(c->c.masks, c->m, tok);   /* refused only by a fallback pick: nothing better exists */
        return;
    }
    if (!c->n_after) return;
    size_t n;
    const char *b = token_bytes(c, tok, &n);
    int k;
    long at = trigger_at(c, c->k, b, n, &k);
    if (at < 0) {
        c->k = k;
        return;
    }
    c->k = 0;
    ak_gmatch_begin(c->m, c->rule);
    size_t rest = n - (size_t)at - 1;
    if (rest) ak_gmatch_feed(c->m, b + at + 1, rest);   /* checked by rule_out_triggers */
    if (c->closing) c->n_plan = c->plan_at;   /* after's tokens done: the grammar's turn */
}

/* Starts emitting plan[0..np) now (the budget forces it). */
static int32_t force(ak_gen_con *c, long np, int *forced) {
    c->closing = 1;
    c->cut = 1;
    c->n_plan = np;
    c->plan_at = 1;
    *forced = 1;
    int32_t tok = c->plan[0];
    advance(c, tok);
    return tok;
}

/* The pick while the grammar holds: masked, and retried while a pick would
 * leave no room for the close. */
static int32_t pick_held(ak_gen *g, ak_gen_con *c, float *logits, long left, int *forced, ak_error *err) {
    long cl = ak_gmatch_close_len(c->m);
    if (cl > 0 && cl >= left) {
        long np = plan_from(c, c->m);
        if (np > 0 && np >= left) return force(c, np, forced);
    }
    ak_sample_prepare(g->smp, logits, g->hist, g->n_hist);
    if (ak_tokmask_fill(c->c.masks, c->m, c->scr, c->mask) < 0) {
        ak_failc(err, AK_ERR_NOMEM, "out of memory");
        return -1;
    }
    apply_mask(c, logits);
    for (int tries = 0; tries < AK_GEN_CON_MAX_TRIES; tries++) {
        int32_t tok = ak_sample_pick(g->smp, logits);
        if (tok < 0) break;
        if (ak_gmatch_copy(c->tmp, c->m) < 0) {
            ak_failc(err, AK_ERR_NOMEM, "out of memory");
            return -1;
        }
        if (ak_tokmask_accept(c->c.masks, c->tmp, tok) == 0 && close_fits(c, c->tmp, left - 1)) {
            ak_gmatch *t = c->m;
            c->m = c->tmp;
            c->tmp = t;
            ak_sample_accept(g->smp, tok);
            return tok;
        }
        logits[tok] = -INFINITY;
    }
    /* nothing sampled fits: the close plan's next token does */
    long np = plan_from(c, c->m);
    if (np > 0) {
        *forced = 1;
        advance(c, c->plan[0]);
        return c->plan[0];
    }
    int32_t tok = ak_argmax(logits, c->n_logits);   /* a whole match the plan cannot end: any end */
    advance(c, tok);
    return tok;
}

int32_t ak_gen_con_pick(ak_gen *g, float *logits, long left, int *forced, ak_error *err) {
    ak_gen_con *c = g->con;
    *forced = 0;
    if (c->closing && c->plan_at < c->n_plan) {
        int32_t tok = c->plan[c->plan_at++];
        *forced = 1;
        advance(c, tok);
        return tok;
    }
    c->closing = 0;
    if (!ak_gmatch_is_free(c->m)) return pick_held(g, c, logits, left, forced, err);
    if (c->n_after && c->c.required && c->n_after_tok > 0 && c->start_plan >= 0 &&
        left <= c->n_after_tok + c->start_plan) {
        /* just enough left for after and the shortest match: both forced */
        if (c->plan_cap < c->n_after_tok) {
            int32_t *p = realloc(c->plan, sizeof *p * (size_t)c->n_after_tok);
            if (!p) {
                ak_failc(err, AK_ERR_NOMEM, "out of memory");
                return -1;
            }
            c->plan = p;
            c->plan_cap = c->n_after_tok;
        }
        memcpy(c->plan, c->after_tok, sizeof *c->plan * (size_t)c->n_after_tok);
        return force(c, c->n_after_tok, forced);
    }
    ak_sample_prepare(g->smp, logits, g->hist, g->n_hist);
    if (c->c.required)
        for (int i = 0; i < c->n_eog; i++)
            if (c->eog[i] < c->n_logits) logits[c->eog[i]] = -INFINITY;
    if (c->n_after && rule_out_triggers(c, logits, left) < 0) {
        ak_failc(err, AK_ERR_NOMEM, "out of memory");
        return -1;
    }
    int32_t tok = ak_sample_pick(g->smp, logits);
    if (tok < 0) tok = ak_argmax(logits, c->n_logits);
    ak_sample_accept(g->smp, tok);
    advance(c, tok);
    return tok;
}

int ak_gen_con_done(ak_gen *g, ak_gen_status *st) {
    ak_gen_con *c = g->con;
    if (!c || ak_gmatch_is_free(c->m) || !ak_gmatch_finished(c->m)) return 0;
    if (c->c.free_after) {
        ak_gmatch *f = ak_gmatch_new_free(c->c.grammar);
        if (f) {
            ak_gmatch_free(c->m);
            c->m = f;
            c->k = 0;
            c->closing = 0;
            return 0;
        }
    }
    *st = c->cut ? AK_GEN_LENGTH : AK_GEN_STOP;
    return 1;
}

int ak_gen_constrain_begin(ak_gen *g, int rule, const char *tail, size_t n_tail, ak_error *err) {
    ak_gen_con *c = g->con;
    if (!c) return ak_failc(err, AK_ERR_INVALID, "generation: no constraint to begin");
    int r = rule < 0 ? c->rule : rule;
    if (r >= ak_grammar_n_rules(c->c.grammar)) return ak_failc(err, AK_ERR_INVALID, "generation: no rule %d", r);
    if (ak_gmatch_begin(c->tmp, r) < 0) return ak_failc(err, AK_ERR_INVALID, "generation: no rule %d", r);
    if (n_tail && ak_gmatch_feed(c->tmp, tail, n_tail) < 0)
        return ak_failc(err, AK_ERR_INVALID, "generation: the grammar refuses the text after the opener");
    ak_gmatch *t = c->m;
    c->m = c->tmp;
    c->tmp = t;
    c->k = 0;
    c->closing = 0;
    c->n_plan = c->plan_at = 0;
    return 0;
}

ak_gen_con_state ak_gen_constraint_state(const ak_gen *g) {
    const ak_gen_con *c = g->con;
    if (!c) return AK_GEN_CON_NONE;
    if (c->closing && c->plan_at < c->n_plan) return AK_GEN_CON_CLOSING;
    return ak_gmatch_is_free(c->m) ? AK_GEN_CON_FREE : AK_GEN_CON_HELD;
}

long ak_gen_constraint_min_tokens(const ak_gen_constraint *c, const ak_tokenizer *tok) {
    if (!c || !c->grammar) return 0;
    int lazy_after = c->lazy && c->after && c->after[0];
    if (c->lazy && !(lazy_after && c->required)) return 0;
    if (!c->masks || !c->vocab) return -1;
    ak_gmatch *m = ak_gmatch_new(c->grammar);
    long np = m && ak_gmatch_begin(m, c->rule < 0 ? ak_grammar_root(c->grammar) : c->rule) == 0
                  ? ak_tokmask_close_plan(c->masks, m, NULL, 0)
                  : -1;
    ak_gmatch_free(m);
    if (np < 0 || !c->lazy) return np;
    int32_t *ids;
    int na = after_tokens(tok, c->vocab, c->after, &ids);
    free(ids);
    return na < 0 ? -1 : np + na;
}
