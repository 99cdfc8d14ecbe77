/* agent_cards.c - CacheCards made from agents and imported into them
 * (agent.h: CARDS): per-token widths from the statistics pass and
 * bitalloc.h, the card written behind by the save queue; import by
 * replacing an agent's cache or appending to it.
 */
#include <stdlib.h>
#include <string.h>

#include "agents/agent_impl.h"
#include "agents/bitalloc.h"
#include "agents/card_set.h"
#include "agents/restore.h"
#include "engine/attnstats.h"
#include "store/cards.h"

/* Per-token statistics of a card's range, for bitalloc.h: 4 arrays of n
 * doubles in one block (mass, variance, entropy, exposure). */
typedef struct {
    double *buf;
    const double *mass, *var, *entropy, *exposure;
} range_stats;

/* Runs the statistics pass (agent.h: THE STATISTICS PASS) over g's tokens
 * [from, to) on context c into *rs (rs->buf malloc'd). Leaves c's position
 * offset and statistics hook as they were (none). Returns 0, or -1 with err
 * set (AK_ERR_KV_BUDGET, AK_ERR_NOMEM, a forward-pass error). */
static int stats_pass(ak_agents *a, agent *g, ak_ctx *c, int from, int to, range_stats *rs, ak_error *err) {
    int n = to - from;
    memset(rs, 0, sizeof *rs);
    /* room for the scratch as for a turn of n tokens, g kept in RAM (every
     * block: a pass holds its local ones until it ends) */
    int T = ak_block_pool_block_tokens(a->cfg.pool);
    if (agents_ensure_room(a, (size_t)((n + T - 1) / T) * ak_block_pool_block_bytes(a->cfg.pool, a->cfg.fk, a->cfg.fv), g,
                           err) < 0)
        return -1;
    ak_attn_stats *st = ak_attn_stats_new(a->cfg.model, NULL, 0, err);
    ak_kv *kv = st ? ak_kv_new(a->cfg.pool, a->cfg.fk, a->cfg.fv, n, err) : NULL;
    double *buf = kv ? malloc(sizeof(double) * 4 * (size_t)n) : NULL;
    int rc = -1;
    if (kv && !buf) ak_failc(err, AK_ERR_NOMEM, "out of memory");
    if (buf) {
        int off0 = ak_ctx_pos_offset(c);
        ak_attn_stats_set_seq(st, kv);
        ak_ctx_set_attn_stats(c, st);
        ak_ctx_set_pos_offset(c, off0 + from);   /* the tokens' own RoPE positions */
        rc = ak_eval(c, kv, &(ak_eval_args){.tokens = g->tokens + from, .n = n}, err);
        ak_ctx_set_pos_offset(c, off0);
        ak_ctx_set_attn_stats(c, NULL);
        if (rc == 0 && ak_attn_stats_length(st) != n)   /* one slot per token, or the hook is broken */
            rc = ak_failc(err, AK_ERR_GENERIC, "attention statistics: %d slots for %d tokens", ak_attn_stats_length(st), n);
    }
    if (rc == 0) {
        ak_attn_stats_mass(st, buf);
        ak_attn_stats_mass_var(st, buf + n);
        ak_attn_stats_entropy(st, buf + 2 * (size_t)n);
        ak_attn_stats_exposure(st, buf + 3 * (size_t)n);
        rs->buf = buf;
        rs->mass = buf;
        rs->var = buf + n;
        rs->entropy = buf + 2 * (size_t)n;
        rs->exposure = buf + 3 * (size_t)n;
    } else {
        free(buf);
    }
    ak_kv_free(kv);
    ak_attn_stats_free(st);
    return rc;
}

/* Widths for g's tokens [from, to) chosen by bitalloc.h under rq's budgets
 * and policy (NULL: uniform), each capped at the width the token already
 * has in a mixed block: a malloc'd array of the key widths followed by the
 * value widths, or NULL with err set (AK_ERR_INVALID for a budget outside
 * [2, 16] or an unknown policy; the statistics pass's errors). *policy gets
 * the policy's name. importance and topology are scored from attention when
 * rq->ctx is given (stats_pass), else from the token ids alone. */
static uint8_t *allocate_widths(ak_agents *a, agent *g, int from, int to, const ak_card_request *rq,
                                const char **policy, ak_error *err) {
    int n = to - from;
    ak_bitalloc_params bp;
    ak_bitalloc_params_init(&bp);
    if (ak_bitalloc_policy_parse(rq->policy ? rq->policy : "uniform", &bp.policy, err) < 0) return NULL;
    *policy = ak_bitalloc_policy_name(bp.policy);
    /* the options the 5-hop chain found best (docs/cards-bench.md, Quality;
     * bitalloc.h's defaults lose to uniform there), with modeled errors:
     * measuring every vector at every width costs seconds at 8K tokens */
    if (bp.policy != AK_BITALLOC_UNIFORM) ak_bitalloc_params_measured(&bp);
    bp.budget_k = rq->budget_k;
    bp.budget_v = rq->budget_v > 0 ? rq->budget_v : 0;
    /* refuse a bad budget before any pass is paid for */
    if (!(bp.budget_k >= 2 && bp.budget_k <= 16) || (bp.budget_v != 0 && !(bp.budget_v >= 2 && bp.budget_v <= 16))) {
        ak_failc(err, AK_ERR_INVALID, "budget %g/%g bits is outside [2, 16]", rq->budget_k, rq->budget_v);
        return NULL;
    }
    uint8_t *w = malloc((size_t)n * 4);
    int32_t *overlap = malloc(sizeof(int32_t) * (size_t)n);
    if (!w || !overlap) {
        free(w);
        free(overlap);
        ak_failc(err, AK_ERR_NOMEM, "out of memory");
        return NULL;
    }
    uint8_t *cap_k = w + 2 * (size_t)n, *cap_v = cap_k + n;
    for (int i = 0; i < n; i++) {
        int ck = 16, cv = 16;
        /* a token held in a mixed block came from a card: handed off once before */
        overlap[i] = ak_card_slot_widths(g->kv, from + i, &ck, &cv);
        cap_k[i] = (uint8_t)ck;
        cap_v[i] = (uint8_t)cv;
    }
    range_stats rs;
    memset(&rs, 0, sizeof rs);
    if (bp.policy != AK_BITALLOC_UNIFORM && rq->ctx && stats_pass(a, g, rq->ctx, from, to, &rs, err) < 0) {
        free(w);
        free(overlap);
        return NULL;
    }
    ak_bitalloc_input in;
    memset(&in, 0, sizeof in);
    in.n = n;
    in.mass = rs.mass;
    in.variance = rs.var;
    in.entropy = rs.entropy;
    in.exposure = rs.exposure;
    in.tokens = g->tokens + from;
    in.overlap = overlap;
    in.cap_k = cap_k;
    in.cap_v = cap_v;
    int rc = ak_bitalloc_run(&in, &bp, w, w + n, NULL, err);
    free(rs.buf);
    free(overlap);
    if (rc < 0) {
        free(w);
        return NULL;
    }
    return w;
}

int ak_agent_make_card(ak_agents *a, const char *agent_id, const ak_card_request *rq,
                       char card_id_out[AK_AGENT_ID_MAX + 1], ak_error *err) {
    saves_drain(a->saves);
    if (!agent_id || !ak_agent_id_valid(agent_id)) return ak_failc(err, AK_ERR_INVALID, "invalid agent id");
    ak_card_request none;
    memset(&none, 0, sizeof none);
    if (!rq) rq = &none;
    char id[AK_AGENT_ID_MAX + 1];
    if (rq->card_id && rq->card_id[0]) {
        if (!ak_agent_id_valid(rq->card_id)) return ak_failc(err, AK_ERR_INVALID, "invalid card id");
        if (cards_exists(a, rq->card_id)) return ak_failc(err, AK_ERR_EXISTS, "card %s exists (cards are write-once)", rq->card_id);
        snprintf(id, sizeof id, "%s", rq->card_id);
    } else {   /* "<agent>-<n>", the agent's part shortened to fit */
        int k = 1;
        for (;; k++) {
            char num[16];
            int nl = snprintf(num, sizeof num, "-%d", k);
            snprintf(id, sizeof id, "%.*s%s", AK_AGENT_ID_MAX - nl, agent_id, num);
            if (!cards_exists(a, id)) break;
        }
    }
    agent *g = agents_find(a, agent_id);
    ak_store_entry se;
    if (!g && a->cfg.store && ak_store_lookup(a->cfg.store, agent_id, &se) == 0 && !(g = agents_create(a, agent_id, err)))
        return -1;
    if (!g) return ak_failc(err, AK_ERR_NOT_FOUND, "no agent %s", agent_id);
    if (g->in_turn || g->restoring)
        return ak_failc(err, AK_ERR_BUSY, "agent %s is busy (a turn or a restore is in progress)", agent_id);
    agent_make_hot(a, g, err);
    if (!g->kv) return -1;
    if (g->n == 0) return ak_failc(err, AK_ERR_NOT_FOUND, "agent %s holds nothing to make a card of", agent_id);
    int to = rq->to > 0 ? rq->to : g->n;
    if (rq->from < 0 || to > g->n || rq->from >= to)
        return ak_failc(err, AK_ERR_INVALID, "agent %s: range [%d, %d) is outside its %d tokens", agent_id, rq->from, to,
                        g->n);
    agent_touch(a, g);
    ak_card_params p = {.id = id, .source_agent = agent_id, .fingerprint = a->cfg.model->fingerprint,
                        .model_name = a->cfg.model->cfg.name, .from = rq->from, .to = to,
                        .widths_k = rq->widths_k, .widths_v = rq->widths_v, .policy = rq->policy,
                        .budget_k = rq->budget_k, .budget_v = rq->budget_v, .threads = NULL};
    /* the engine's threads are free between steps (rq->ctx is the engine's context) */
    if (rq->ctx) p.threads = ak_ctx_pool(rq->ctx);
    uint8_t *wb = NULL;
    if (!rq->widths_k && !rq->widths_v && rq->budget_k > 0 &&
        !(wb = allocate_widths(a, g, rq->from, to, rq, &p.policy, err)))
        return -1;
    if (wb) {
        p.widths_k = wb;
        p.widths_v = wb + (to - rq->from);
    }
    ak_card *c = ak_card_make(g->kv, g->tokens, &p, err);
    free(wb);
    if (!c) return -1;
    /* the file is written behind, by the writer (its fsync alone can take
     * longer than the whole handoff); without a writer, here */
    if (a->cfg.store && !saves_running(a->saves) && ak_store_save_card(a->cfg.store, c, err) < 0) {
        ak_card_free(c);
        return -1;
    }
    pending *pw = NULL;
    if (saves_running(a->saves) && !(pw = calloc(1, sizeof *pw))) {
        ak_card_free(c);
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    if (cards_add(a, c, err) < 0) {
        free(pw);
        return -1;
    }
    if (pw) {
        snprintf(pw->id, sizeof pw->id, "%s", c->id);
        pw->card = c;
        saves_enqueue(a->saves, pw);
    }
    if (card_id_out) snprintf(card_id_out, AK_AGENT_ID_MAX + 1, "%s", id);
    logf_(a, "card %s: made from agent %s [%d, %d), %zu bytes (f16: %zu)", id, agent_id, rq->from, to,
          ak_card_vector_bytes(c), ak_card_f16_bytes(c));
    return 0;
}

/* The card c's blocks with its keys starting at position `at`, in kv's
 * pool: *blocks (malloc'd) holds *nb blocks, each with a reference for the
 * caller (cards.h: ak_card_to_blocks). Returns 0, or -1 with err set. */
static int card_blocks_at(const ak_agents *a, const ak_card *c, int at, ak_block ***blocks, int *nb, ak_error *err) {
    if (c->pos_offset == at) return ak_card_to_blocks(c, a->cfg.pool, a->threads, blocks, nb, err);
    ak_card *s = ak_card_shift(c, a->cfg.model, at, err);
    if (!s) return -1;
    int rc = ak_card_to_blocks(s, a->cfg.pool, a->threads, blocks, nb, err);
    ak_card_free(s);
    return rc;
}

/* Import "append" of card c into g, which holds p > 0 tokens in RAM: a new
 * sequence of g's formats whose base is g's positions [0, p) (its segments,
 * its own positions as one more: shared, not copied) followed by c's blocks
 * with their keys at [p, p + n), g's history followed by c's tokens.
 * Returns 0, or -1 with err set and g as it was. */
static int import_append(ak_agents *a, agent *g, const ak_card *c, ak_error *err) {
    int p = g->n;
    agent_segs_sync(g);
    ak_kv *kv = ak_kv_new(a->cfg.pool, ak_kv_format_k(g->kv), ak_kv_format_v(g->kv), a->cfg.n_ctx, err);
    if (!kv) return -1;
    ak_block **bl = NULL;
    int nb = 0, lens[AK_KV_MAX_SEGMENTS], rc = ak_kv_attach_base(kv, g->kv, p, err);
    int ns = ak_kv_segments(kv, lens);
    if (rc == 0 && ns >= AK_KV_MAX_SEGMENTS)   /* checked before the card is shifted and cut */
        rc = ak_failc(err, AK_ERR_INVALID, "agent %s: its context is %d segments already: at most %d (a card "
                      "appended is one, the positions before it another)", g->id, ns, AK_KV_MAX_SEGMENTS);
    if (rc == 0) rc = card_blocks_at(a, c, p, &bl, &nb, err);
    if (rc == 0) rc = ak_kv_append_blocks(kv, bl, nb, c->n_tokens, err);
    for (int i = 0; i < nb; i++) ak_block_unref(a->cfg.pool, bl[i]);   /* kv holds them now (or nothing does) */
    free(bl);
    if (rc < 0) {
        ak_kv_free(kv);
        return -1;
    }
    /* the history: g's tokens, then the card's (built apart: agent_set_history may move g's) */
    int32_t *h = malloc(sizeof(int32_t) * (size_t)(p + c->n_tokens));
    if (h) {
        memcpy(h, g->tokens, sizeof(int32_t) * (size_t)p);
        memcpy(h + p, c->tokens, sizeof(int32_t) * (size_t)c->n_tokens);
    }
    if (!h || agent_set_history(g, h, p + c->n_tokens, err) < 0) {   /* agent_set_history fails having changed nothing */
        if (!h) ak_failc(err, AK_ERR_NOMEM, "out of memory");
        free(h);
        ak_kv_free(kv);
        return -1;
    }
    free(h);
    /* the descriptors: g's segments, its own positions frozen (if any), the card */
    int k = g->n_segs;
    if (ns > k) g->segs[k++] = (ak_store_seg){.kind = AK_SEG_OWN, .len = 0, .id = "", .hash = ""};   /* attach_base made them one */
    agent_seg_named(g, k++, AK_SEG_CARD, c->id, c->hash);
    g->n_segs = k;
    ak_kv_free(g->kv);
    g->kv = kv;
    agent_segs_sync(g);
    return 0;
}

int ak_agent_import_card(ak_agents *a, const char *id, const char *card_id, ak_error *err) {
    return ak_agent_import_card_mode(a, id, card_id, AK_IMPORT_REPLACE, err);
}

int ak_agent_import_card_mode(ak_agents *a, const char *id, const char *card_id, ak_import_mode mode, ak_error *err) {
    saves_drain(a->saves);
    if (!id || !ak_agent_id_valid(id))
        return ak_failc(err, AK_ERR_INVALID, "invalid agent id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    if (mode != AK_IMPORT_REPLACE && mode != AK_IMPORT_APPEND)
        return ak_failc(err, AK_ERR_INVALID, "unknown import mode %d", (int)mode);
    agent *g = agents_find(a, id);
    if (g && (g->in_turn || g->restoring))
        return ak_failc(err, AK_ERR_BUSY, "agent %s is busy (a turn or a restore is in progress)", id);
    const ak_card *c = cards_resolve(a, card_id, err);
    if (!c) return -1;
    if (strcmp(c->fingerprint, a->cfg.model->fingerprint))
        return ak_failc(err, AK_ERR_STALE, "card %s was made with another model", card_id);
    if (c->n_tokens >= a->cfg.n_ctx)
        return ak_failc(err, AK_ERR_INVALID, "card %s: %d tokens do not fit the context of %d", card_id, c->n_tokens,
                        a->cfg.n_ctx);
    ak_store_entry se;
    if (!g && mode == AK_IMPORT_APPEND && a->cfg.store && ak_store_lookup(a->cfg.store, id, &se) == 0 &&
        !(g = agents_create(a, id, err)))   /* an agent known only by its file: appended to after a restore */
        return -1;
    if (!g && !(g = agents_create(a, id, err))) return -1;
    int append = 0;
    if (mode == AK_IMPORT_APPEND) {
        agent_make_hot(a, g, err);   /* what the card goes after: restored if need be */
        if (!g->kv) return -1;
        append = g->n > 0;     /* after nothing, append is replace */
        if (append && g->n + c->n_tokens >= a->cfg.n_ctx)
            return ak_failc(err, AK_ERR_INVALID, "agent %s: its %d tokens and card %s's %d do not fit the context of %d",
                            id, g->n, card_id, c->n_tokens, a->cfg.n_ctx);
    }
    /* room for the card's blocks (replace: what the agent holds now is dropped after) */
    if (agents_ensure_room(a, ak_card_vector_bytes(c), g, err) < 0) return -1;
    int p = g->n;
    if (append) {
        if (import_append(a, g, c, err) < 0) return -1;
    } else {
        ak_kv *kv = ak_kv_new(a->cfg.pool, a->cfg.fk, a->cfg.fv, a->cfg.n_ctx, err);
        if (!kv) return -1;
        if (cards_attach_at(a, c, 0, kv, a->threads, err) < 0 || agent_set_history(g, c->tokens, c->n_tokens, err) < 0) {
            ak_kv_free(kv);
            return -1;
        }
        agent_set_base(g, kv, AK_SEG_CARD, c->id, c->hash);
    }
    g->pub_spans = ak_kv_span_count(g->kv);
    g->version = ++a->next_version;
    g->ahead = 0;
    agent_touch(a, g);
    if (append) logf_(a, "agent %s: appended card %s (%d tokens after its %d)", id, c->id, c->n_tokens, p);
    else logf_(a, "agent %s: imported card %s (%d tokens)", id, c->id, c->n_tokens);
    return 0;
}
