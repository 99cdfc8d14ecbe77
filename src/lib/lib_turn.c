/* lib_turn.c - the public API's turns (include/agentkv.h: agentkv_agent_turn):
 * the prompt built (a chat rendered over the agent's own replies, or
 * tokens with a pool and memories), the agent's turn opened, the rest
 * prefilled with memories placed between the chunks, then the generation
 * step of text/generate.h fed back through the agent. */
#include <stdlib.h>
#include <string.h>

#include "lib/lib.h"
#include "agents/memories.h"
#include "engine/reuse.h"
#include "text/chat_resend.h"
#include "text/generate.h"

/* A turn's prompt as the agents layer takes it. */
typedef struct {
    int32_t *own;                       /* tokens made here (a chat), or NULL */
    const int32_t *tokens;
    int n;
    const char *mem_id[AK_KV_MAX_SEGMENTS];
    int at[AK_KV_MAX_SEGMENTS], len[AK_KV_MAX_SEGMENTS];
    int k;
    const char *stop[AK_GEN_MAX_STOP];  /* borrowed: the caller's and static strings */
    int n_stop;
} prompt;

/* The chat of o as the agent's prompt: rendered with the generation
 * prompt, replies the agent's history holds standing for their tokens
 * (chat_resend.h; the agent is restored first so that its history is
 * known), and the family's end of turn as a stop string when it is text,
 * not one end-of-generation token. Returns 0, or -1 with e set. */
static int chat_prompt(agentkv_agent *a, const agentkv_turn_options *o, prompt *p, ak_error *e) {
    const agentkv_model *m = a->s->m;
    ak_lib_chat c;
    if (ak_lib_chat_make(m, o->messages, o->n_messages, o->chat, &c, e) < 0) return -1;
    c.opts.add_generation_prompt = 1;
    int rc = -1;
    size_t n_ids = 0;
    if (ak_lib_restore(a, e) < 0 ||
        ak_chat_tokenize(c.msgs, o->n_messages, &c.opts, m->tok, AK_TOK_ADD_SPECIAL, &p->own, &n_ids, e) < 0)
        goto done;
    int nh = 0;
    const int32_t *h = ak_agent_history(a->s->agents, a->id, &nh);
    ak_chat_resent rs = {0};
    if (h && nh > 0 && ak_chat_tokenize_resent(c.msgs, o->n_messages, &c.opts, m->tok, h, nh, &rs, e) < 0) goto done;
    if (rs.n_replaced > 0) {
        free(p->own);
        p->own = rs.ids;
        n_ids = rs.n_ids;
    }
    p->tokens = p->own;
    p->n = (int)n_ids;
    const char *eot = ak_chat_end_of_turn(m->family);
    int32_t *ids = NULL;
    size_t n_eot = 0;
    ak_error ignore = {{0}};
    int special = ak_tokenize(m->tok, eot, strlen(eot), AK_TOK_PARSE_SPECIAL, &ids, &n_eot, &ignore) == 0 &&
                  n_eot == 1 && ak_token_is_eog(m->tok, ids[0]);
    free(ids);
    if (!special) {
        if (p->n_stop == AK_GEN_MAX_STOP) {
            ak_failc(e, AK_ERR_INVALID, "at most %d stop strings with messages", AK_GEN_MAX_STOP - 1);
            goto done;
        }
        p->stop[p->n_stop++] = eot;
    }
    rc = 0;
done:
    ak_lib_chat_free(&c);
    return rc;
}

/* o's memories as positions: each one's tokens looked up (loaded if need
 * be) and checked against the prompt's, in order, none reaching its end.
 * Returns 0, or -1 with e set. */
static int memory_places(agentkv_agent *a, const agentkv_turn_options *o, prompt *p, ak_error *e) {
    if (o->n_memories < 0 || (o->n_memories > 0 && !o->memories))
        return ak_failc(e, AK_ERR_INVALID, "%d memories without a list", o->n_memories);
    if (o->n_memories > AK_KV_MAX_SEGMENTS - 1)
        return ak_failc(e, AK_ERR_INVALID, "%d memories: a prompt holds at most %d", o->n_memories,
                        AK_KV_MAX_SEGMENTS - 1);
    int end = 0;
    for (int i = 0; i < o->n_memories; i++) {
        const agentkv_memory_ref *r = &o->memories[i];
        int32_t *mt = NULL;
        int mn = 0;
        if (!r->id) return ak_failc(e, AK_ERR_INVALID, "memory %d: no id", i);
        if (ak_memory_tokens(a->s->agents, r->id, &mt, &mn, e) < 0) return -1;
        int ok = r->at >= end && (long)r->at + mn < p->n &&
                 !memcmp(p->tokens + r->at, mt, (size_t)mn * sizeof *mt);
        free(mt);
        if (!ok)
            return ak_failc(e, AK_ERR_INVALID,
                            "memory %s: the prompt does not hold its %d tokens at %d (in order, before the prompt's end)",
                            r->id, mn, r->at);
        p->mem_id[i] = r->id;
        p->at[i] = r->at;
        p->len[i] = mn;
        end = r->at + mn;
    }
    p->k = o->n_memories;
    return 0;
}

/* A prefill's progress over several evaluations: each one's fraction is
 * scaled to its share of the turn's tokens. */
typedef struct {
    agentkv_progress_fn fn;
    void *ud;
    int done, total, part;
} progress;

/* ak_progress_fn: the fraction of the current evaluation, as the turn's. */
static void progress_part(void *ud, double frac) {
    progress *pg = ud;
    if (pg->fn && pg->total > 0) pg->fn(pg->ud, (pg->done + frac * pg->part) / pg->total);
}

/* Computes tokens [from, to) of p into kv at their positions (logits of
 * the last when logits is not NULL). Returns 0, or -1 with e set. */
static int prefill(agentkv_store *s, ak_kv *kv, const prompt *p, int from, int to, float *logits, progress *pg,
                   ak_error *e) {
    if (to <= from) return 0;
    pg->part = to - from;
    int rc = ak_eval(s->ctx, kv, &(ak_eval_args){.tokens = p->tokens + from, .n = to - from, .pos0 = from,
                     .logits = logits, .progress = pg->fn ? progress_part : NULL, .ud = pg}, e);
    pg->done += to - from;
    return rc;
}

/* The prompt's positions after an opened turn: computed, and memories
 * placed by the method reuse, up to the prompt's end, whose logits go to
 * s->logits. t's counts move the placed tokens from prefilled to reused.
 * Returns 0, or -1 with e set (the caller aborts the turn). */
static int fill(agentkv_agent *a, const prompt *p, const ak_reuse_params *reuse, ak_kv **kv, ak_turn *t,
                const agentkv_turn_options *o, ak_error *e) {
    agentkv_store *s = a->s;
    progress pg = {.fn = o->progress, .ud = o->progress_ud, .total = t->prefilled};
    int pos = t->reused;
    for (int i = 0; reuse->method != AK_REUSE_FULL && i < p->k; i++) {
        if (pos > p->at[i]) continue;   /* the agent's history held it already */
        if (prefill(s, *kv, p, pos, p->at[i], NULL, &pg, e) < 0) return -1;
        ak_place_opts pl = {.id = a->id, .mem_id = p->mem_id[i], .tokens = p->tokens, .at = p->at[i]};
        int rc = reuse->method == AK_REUSE_NONE ? ak_agent_place_memory(s->agents, &pl, kv, e)
                                                : ak_agent_reuse_memory(s->agents, s->ctx, &pl, reuse, kv, NULL, e);
        if (rc < 0) return -1;
        pos = p->at[i] + p->len[i];
        pg.done += p->len[i];
        t->reused += p->len[i];
        t->prefilled -= p->len[i];
    }
    return prefill(s, *kv, p, pos, p->n, s->logits, &pg, e);
}

/* Up to o->max_tokens tokens generated from s->logits after the prompt,
 * streamed through o->on_token and fed back into the agent; *finish says
 * why it ended. g is the caller's (freed by it). Returns 0, or -1 with e
 * set. */
static int generate(agentkv_agent *a, const prompt *p, const agentkv_turn_options *o, ak_gen *g, agentkv_finish *finish,
                    ak_error *e) {
    agentkv_store *s = a->s;
    ak_sampler_params sp = ak_sampler_defaults();
    sp.temp = o->temperature;
    sp.top_k = o->top_k;
    sp.top_p = o->top_p > 0 ? o->top_p : 1;
    sp.min_p = o->min_p;
    sp.repeat_penalty = o->repeat_penalty > 0 ? o->repeat_penalty : 1;
    sp.repeat_last_n = o->repeat_last_n == 0 ? 64 : o->repeat_last_n < 0 ? 0 : o->repeat_last_n;
    sp.seed = o->seed;
    sp.frequency_penalty = o->frequency_penalty;
    sp.presence_penalty = o->presence_penalty;
    ak_sampler *smp = ak_sampler_new(&sp, s->m->model->cfg.vocab, e);
    if (!smp) return -1;
    int rc = -1;
    if (ak_gen_init(g, &(ak_gen_opts){.tok = s->m->tok, .smp = smp, .prompt = p->tokens, .n_prompt = p->n,
                    .max_tokens = o->max_tokens, .n_ctx = s->n_ctx, .stop_at_eog = !o->ignore_eos,
                    .stop = p->stop, .n_stop = p->n_stop}, e) < 0)
        goto done;
    size_t shown = 0;
    *finish = AGENTKV_FINISH_LENGTH;
    for (int pos = p->n;; pos++) {
        ak_gen_out out;
        int kept = g->n_gen;
        ak_gen_status st = ak_gen_step(g, s->logits, pos, &out, e);
        if (st == AK_GEN_ERROR) goto done;
        if (g->n_gen > kept && o->on_token) {
            size_t vis = out.visible > shown ? out.visible : shown;
            int stop = o->on_token(o->ud, out.tok, g->text + shown, vis - shown);
            shown = vis;
            if (stop) {
                *finish = AGENTKV_FINISH_CANCELLED;
                break;
            }
        }
        if (st != AK_GEN_MORE) {
            *finish = st == AK_GEN_STOP ? AGENTKV_FINISH_STOP : AGENTKV_FINISH_LENGTH;
            break;
        }
        if (ak_agent_step(s->agents, s->ctx, a->id, out.tok, s->logits, e) < 0) goto done;
    }
    const char *piece;
    ak_gen_flush(g, &piece);
    /* what was held back (a possible start of a stop string) is text after all */
    if (o->on_token && *finish != AGENTKV_FINISH_CANCELLED && g->len > shown)
        o->on_token(o->ud, -1, g->text + shown, g->len - shown);
    rc = 0;
done:
    ak_sampler_free(smp);
    return rc;
}

/* Checks what o asks for before anything is computed: one kind of
 * prompt, its companions, the reuse method. Returns 0, or -1 with e set. */
static int check_turn(const agentkv_turn_options *o, ak_reuse_params *reuse, ak_error *e) {
    if (!o->messages == !o->tokens)
        return ak_failc(e, AK_ERR_INVALID, "a turn takes exactly one of messages and tokens");
    if (o->messages && (o->pool_id || o->n_memories))
        return ak_failc(e, AK_ERR_INVALID, "a pool and memories go with a prompt of tokens, not messages");
    if (o->tokens && (o->n_tokens == 0 || o->n_tokens > INT32_MAX))
        return ak_failc(e, AK_ERR_INVALID, "the prompt has %zu tokens", o->n_tokens);
    if (o->max_tokens < 0) return ak_failc(e, AK_ERR_INVALID, "max_tokens %d is negative", o->max_tokens);
    if (o->n_stop < 0 || o->n_stop > AK_GEN_MAX_STOP || (o->n_stop && !o->stop))
        return ak_failc(e, AK_ERR_INVALID, "%d stop strings (at most %d)", o->n_stop, AK_GEN_MAX_STOP);
    for (int i = 0; i < o->n_stop; i++)
        if (!o->stop[i] || !o->stop[i][0]) return ak_failc(e, AK_ERR_INVALID, "stop string %d is empty", i);
    *reuse = (ak_reuse_params){.method = AK_REUSE_NONE, .ratio = 0.1f, .check_layer = -1};
    if (o->memory_reuse && ak_reuse_method_parse(o->memory_reuse, &reuse->method) < 0)
        return ak_failc(e, AK_ERR_INVALID, "memory_reuse: '%s' is not none, cacheblend, agentkvshift or full",
                        o->memory_reuse);
    return 0;
}

/* Fills res from the turn's counts, the generator and the times ms (the
 * prompt's, the generation's). Returns 0, or -1 with e set (out of memory
 * for the text). */
static int result(const ak_turn *t, const ak_gen *g, const prompt *p, agentkv_finish finish, const double ms[2],
                  agentkv_turn_result *res, ak_error *e) {
    *res = (agentkv_turn_result){
        .tier = t->tier == AK_TIER_HOT ? AGENTKV_TIER_HOT : t->tier == AK_TIER_WARM ? AGENTKV_TIER_WARM : AGENTKV_TIER_COLD,
        .match = ak_match_name(t->match),
        .prompt_tokens = p->n,
        .reused = t->reused,
        .prefilled = t->prefilled,
        .generated = g->n_gen,
        .finish = finish,
        .restore_ms = t->restore_ms,
        .prompt_ms = ms[0],
        .decode_ms = ms[1],
    };
    if (!(res->text = ak_malloc(g->len + 1, e))) return -1;
    if (g->len) memcpy(res->text, g->text, g->len);
    res->text[g->len] = 0;
    res->text_len = g->len;
    return 0;
}

AGENTKV_API agentkv_status agentkv_agent_turn(agentkv_agent *a, const agentkv_turn_options *o,
                                              agentkv_turn_result *res, agentkv_error *err) {
    if (res) memset(res, 0, sizeof *res);
    if (!a || !o) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_agent_turn: NULL agent or options");
    agentkv_store *s = a->s;
    ak_error e = {{0}};
    ak_reuse_params reuse;
    prompt p = {.tokens = o->tokens, .n = (int)o->n_tokens, .n_stop = o->n_stop};
    for (int i = 0; i < o->n_stop && i < AK_GEN_MAX_STOP; i++) p.stop[i] = o->stop[i];
    ak_gen g = {0};
    agentkv_finish finish = AGENTKV_FINISH_LENGTH;
    int opened = 0, committed = 0;
    double t0 = ak_now(), ms[2] = {0};   /* the prompt's, the generation's */
    if (check_turn(o, &reuse, &e) < 0 || (o->messages && chat_prompt(a, o, &p, &e) < 0) ||
        memory_places(a, o, &p, &e) < 0)
        goto fail;
    int n_reserve = o->max_tokens > s->n_ctx - p.n ? s->n_ctx : p.n + o->max_tokens;
    ak_turn_opts to = {.id = a->id, .flags = reuse.method == AK_REUSE_FULL && p.k ? AK_AGENT_RECOMPUTE_MEMORIES : 0,
                       .tokens = p.tokens, .n = p.n, .n_reserve = n_reserve, .pool_id = o->pool_id,
                       .at = p.at, .len = p.len, .k = p.k};
    ak_turn t;
    ak_kv *kv;
    if (ak_agent_open(s->agents, &to, &kv, &t, &e) < 0) goto fail;
    opened = 1;
    double tf = ak_now();
    if (fill(a, &p, &reuse, &kv, &t, o, &e) < 0) goto fail;
    t.prefill_ms = (ak_now() - tf) * 1e3;
    if (ak_agent_commit(s->agents, a->id, p.tokens, p.n, &e) < 0) goto fail;
    committed = 1;
    double t1 = ak_now();
    ms[0] = (t1 - t0) * 1e3;
    if (o->max_tokens > 0 && generate(a, &p, o, &g, &finish, &e) < 0) goto fail;
    ms[1] = (ak_now() - t1) * 1e3;
    committed = opened = 0;   /* ended, whatever the save says */
    if (ak_agent_end(s->agents, a->id, &e) < 0) goto fail;
    if (res && result(&t, &g, &p, finish, ms, res, &e) < 0) goto fail;
    ak_gen_free(&g);
    free(p.own);
    return ak_lib_ok(err);
fail:
    if (committed) {
        ak_error ignore = {{0}};   /* the turn's own error is the one reported */
        ak_agent_end(s->agents, a->id, &ignore);
    } else if (opened) {
        ak_agent_abort(s->agents, a->id);
    }
    ak_gen_free(&g);
    free(p.own);
    return ak_lib_fail(err, &e);
}
