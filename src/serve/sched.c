/* sched.c - see sched.h
 *
 * Threads and locks. s->mu guards everything a non-engine thread can touch:
 * the incoming queue, the ops queue, the I/O queues, each request's shared
 * part (text, visible, done, result, cancelled, refs) and the stopping flag.
 * The engine thread alone walks the waiting and active lists and calls into
 * the agents; it takes s->mu only to exchange messages. Readers wait on
 * out_cv, the engine on engine_cv, the I/O thread on io_cv.
 */
#include "serve/sched_impl.h"
#include "text/generate.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum { R_QUEUED, R_PREFILL, R_DECODE, R_DONE } rstate;

/* One choice of a request: its sampler, generator, decode sequence and text. */
typedef struct {
    /* engine thread only */
    ak_kv *kv;                    /* its decode sequence: the agent's for choice 0, a fork of it made
                                     when the prefill ends for the others (owned) */
    ak_sampler *smp;
    ak_gen gen;                   /* sampling, end checks, text, stop strings (generate.h) */
    int32_t next_tok;
    int pos;                      /* positions its sequence holds */
    float *logits;
    float *raw;                   /* logprobs: the step's raw logits, copied before the sampler
                                     changes them in place (NULL: not asked) */
    int live;                     /* decoding: started and not ended */
    int fed;                      /* its token is in this step's batch */
    double t_last;                /* when its last token was sampled */
    /* shared, under s->mu */
    char *text;
    size_t len, cap, visible;
    ak_req_logprob *lp;           /* one per kept token (logprobs asked), cut with the text */
    int n_lp, lp_cap;
} choice;

struct ak_request {
    ak_sched *s;
    struct ak_request *next;      /* incoming / waiting / active list link */
    /* parameters, immutable after submit */
    char id[AK_AGENT_ID_MAX + 2];
    int anonymous;
    char pool[AK_AGENT_ID_MAX + 1];   /* the pool the prompt starts with ("" if none); for a
                                         pool job, the pool it makes */
    int pool_job;                 /* makes pool `pool` from the prompt instead of serving an agent */
    ak_kv_format pfk, pfv;        /* a pool job's formats */
    char *source;                 /* a pool job's source (may be NULL) */
    int committed;                /* a pool job's pool was committed */
    int32_t *prompt;
    int n_prompt, max_tokens, n_reserve, stop_at_eog;
    char *stop[AK_MAX_STOP];
    int n_stop;
    size_t stop_max;              /* longest stop string */
    int n_mem;                    /* memories placed with reuse "none" (sched.h) */
    char mem_id[AK_MAX_MEMORIES][AK_AGENT_ID_MAX + 1];
    int mem_at[AK_MAX_MEMORIES], mem_len[AK_MAX_MEMORIES];
    int mem_next;                 /* engine: the first memory not yet placed or passed */
    int mem_full;                 /* reuse full: computed, not placed (sched.h) */
    ak_reuse_params mem_reuse;    /* the method memories are placed by (NONE: ak_agent_place_memory) */
    int handoff;                  /* look for a span at admission (sched.h) */
    ak_reuse_params handoff_reuse;
    uint32_t domain;
    ak_span_found span;           /* engine: the span found (len 0: none, or placed or given up) */
    char pinned[AK_AGENT_ID_MAX + 1];   /* engine: the span's likely source, kept from eviction from
                                     admission until the span is placed or given up ("": none) */
    ak_reprompt reprompt;         /* the prompt's rebuild over the agent's history (fn NULL: none
                                     or done; engine thread) */
    /* engine thread only */
    rstate state;
    ak_kv *kv;                    /* the agent's sequence (the prompt's prefill, choice 0's decode) */
    int pos, step_k, prefetch_tried;
    ak_grammar_ref *grammar;      /* structured output: the grammar held (a reference), NULL: none */
    char *grammar_after;          /* lazy: held from after this text */
    ak_gen_constraint con;        /* each generator's constraint over grammar */
    int top_logprobs;
    double t_submit, t_admit, t_first, prefill_s;
    int sampled;                  /* a first token was sampled (ttft recorded) */
    int n_ch;                     /* choices (0 for a pool job) */
    choice ch[AK_MAX_CHOICES];    /* their parts under s->mu are shared */
    /* shared, under s->mu */
    int refs;
    int done, cancelled;
    ak_req_result res;
};

/* An operation posted to the engine thread (ak_sched_post). */
typedef struct post_item {
    struct post_item *next;
    ak_sched_fn fn;
    void *ctx;
    int rc, done;
    ak_error err;
} post_item;

typedef struct io_item {
    struct io_item *next;
    ak_restore_job *job;
} io_item;

struct ak_sched {
    ak_sched_config cfg;
    ak_ctx *ctx;
    pthread_t engine, io;
    int engine_started, io_started, shut;
    pthread_mutex_t mu;
    pthread_cond_t engine_cv, out_cv, io_cv;
    int stopping;
    ak_request *incoming, *incoming_tail;
    post_item *posts;
    io_item *io_queue, *io_done;
    /* engine thread only */
    ak_request *waiting, *active;
    int n_active, n_waiting, n_io, n_anon;
    int changed;                  /* a request finished or started this round */
    double prefill_tps;           /* measured prompt tokens per second (EMA), 0 until known */
    int32_t *b_tok, *b_pos;
    ak_kv **b_seq;
    float **b_logits;
};

#define logf_(s, ...) ak_logf((s)->cfg.log, (s)->cfg.log_ud, __VA_ARGS__)

static void free_request(ak_request *r) {
    if (r->reprompt.free) r->reprompt.free(r->reprompt.ud);
    for (int i = 0; i < r->n_ch; i++) {
        choice *c = &r->ch[i];
        if (i > 0) ak_kv_free(c->kv);   /* a fork (ended choices freed theirs on the engine thread) */
        ak_sampler_free(c->smp);
        ak_gen_free(&c->gen);
        free(c->logits);
        free(c->raw);
        free(c->lp);
        free(c->text);
    }
    free(r->prompt);
    ak_grammar_ref_release(r->grammar);
    free(r->grammar_after);
    free(r->source);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r);
}

/* Drops one reference; call with s->mu held. */
static void unref_locked(ak_request *r) {
    if (--r->refs == 0) free_request(r);
}

void ak_request_release(ak_request *r) {
    if (!r) return;
    ak_sched *s = r->s;
    pthread_mutex_lock(&s->mu);
    unref_locked(r);
    pthread_mutex_unlock(&s->mu);
}

void ak_request_cancel(ak_request *r) {
    pthread_mutex_lock(&r->s->mu);
    r->cancelled = 1;
    pthread_cond_signal(&r->s->engine_cv);
    pthread_mutex_unlock(&r->s->mu);
}

/* Waits on out_cv until r is done or wake(r, arg) says so (s->mu held),
 * or timeout_ms passes (< 0: no limit). Returns 1 if done, else 0. */
static int wait_until(ak_request *r, int (*wake)(const ak_request *r, const void *arg), const void *arg,
                      int timeout_ms) {
    ak_sched *s = r->s;
    struct timespec until;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
    }
    pthread_mutex_lock(&s->mu);
    while (!r->done && !wake(r, arg)) {
        if (timeout_ms < 0) pthread_cond_wait(&s->out_cv, &s->mu);
        else if (pthread_cond_timedwait(&s->out_cv, &s->mu, &until) != 0) break;
    }
    int done = r->done;
    pthread_mutex_unlock(&s->mu);
    return done;
}

/* wait_until's test: the first choice shows more than *(size_t *)arg bytes. */
static int text_past(const ak_request *r, const void *arg) {
    return r->n_ch && r->ch[0].visible > *(const size_t *)arg;
}

/* wait_until's test: the version moved from *(uint64_t *)arg. */
static int version_moved(const ak_request *r, const void *arg) { return r->res.version != *(const uint64_t *)arg; }

int ak_request_wait(ak_request *r, size_t have, int timeout_ms) { return wait_until(r, text_past, &have, timeout_ms); }

int ak_request_wait_news(ak_request *r, uint64_t seen, int timeout_ms) {
    return wait_until(r, version_moved, &seen, timeout_ms);
}

/* Something readers wait for happened to r (call with s->mu held). */
static void news_locked(ak_sched *s, ak_request *r) {
    r->res.version++;
    pthread_cond_broadcast(&s->out_cv);
}

int ak_request_logprobs_choice(ak_request *r, int choice_i, int from, size_t upto, ak_req_logprob **out) {
    ak_sched *s = r->s;
    *out = NULL;
    if (choice_i < 0 || choice_i >= r->n_ch) return 0;
    const choice *c = &r->ch[choice_i];
    pthread_mutex_lock(&s->mu);
    int end = from < 0 ? 0 : from;
    while (end < c->n_lp && c->lp[end].offset < upto) end++;
    int n = end > from && from >= 0 ? end - from : 0;
    if (n && (*out = malloc(sizeof **out * (size_t)n))) memcpy(*out, c->lp + from, sizeof **out * (size_t)n);
    pthread_mutex_unlock(&s->mu);
    return *out ? n : 0;
}

int ak_request_logprobs(ak_request *r, int from, size_t upto, ak_req_logprob **out) {
    return ak_request_logprobs_choice(r, 0, from, upto, out);
}

size_t ak_request_read_choice(ak_request *r, int choice_i, size_t from, char **chunk, size_t *n,
                              ak_req_result *res) {
    ak_sched *s = r->s;
    const choice *c = choice_i >= 0 && choice_i < r->n_ch ? &r->ch[choice_i] : NULL;
    pthread_mutex_lock(&s->mu);
    size_t vis = c ? c->visible : 0;
    if (chunk) {
        *chunk = NULL;
        *n = 0;
        if (vis > from) {
            *chunk = malloc(vis - from + 1);
            if (*chunk) {
                memcpy(*chunk, c->text + from, vis - from);
                (*chunk)[vis - from] = 0;
                *n = vis - from;
            } else {
                vis = from; /* nothing consumed: the caller retries */
            }
        }
    }
    if (res) *res = r->res;
    pthread_mutex_unlock(&s->mu);
    return vis;
}

size_t ak_request_read(ak_request *r, size_t from, char **chunk, size_t *n, ak_req_result *res) {
    return ak_request_read_choice(r, 0, from, chunk, n, res);
}

/* ---------------------------------------------------------------- submit */

/* Bytes of blocks one further choice of a request may take: its own from
 * the prompt's end to the reservation, the first of them a copy of the
 * prompt's partly filled last block (in the agents' formats). */
static size_t fork_bytes(const ak_sched *s, int n_prompt, int n_reserve) {
    return ak_agents_bytes_for(s->cfg.agents, n_reserve - n_prompt + ak_block_pool_block_tokens(s->cfg.pool));
}

/* Sets up r's n_ch generators over prompt[0..n) into gens (r's own are not
 * touched), each with its choice's sampler. Returns 0, or -1 with err set,
 * none of gens left to free. */
static int init_gens(const ak_sched *s, ak_request *r, const int32_t *prompt, int n, ak_gen *gens, ak_error *err) {
    for (int i = 0; i < r->n_ch; i++) {
        memset(&gens[i], 0, sizeof gens[i]);
        if (ak_gen_init(&gens[i], &(ak_gen_opts){.tok = s->cfg.tok, .smp = r->ch[i].smp, .prompt = prompt,
                        .n_prompt = n, .max_tokens = r->max_tokens, .n_ctx = s->cfg.n_ctx,
                        .stop_at_eog = r->stop_at_eog, .stop = (const char *const *)r->stop, .n_stop = r->n_stop,
                        .constraint = r->grammar ? &r->con : NULL}, err) < 0) {
            for (int k = 0; k <= i; k++) ak_gen_free(&gens[k]);
            return -1;
        }
    }
    return 0;
}

/* Hands r to the engine. Returns 0, or -1 with err set (AK_ERR_SHUTDOWN)
 * when stopping (r is then the caller's to free). */
static int enqueue(ak_sched *s, ak_request *r, ak_error *err) {
    r->t_submit = ak_now();
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return ak_failc(err, AK_ERR_SHUTDOWN, "the server is shutting down");
    }
    if (s->incoming_tail) s->incoming_tail->next = r;
    else s->incoming = r;
    s->incoming_tail = r;
    pthread_cond_signal(&s->engine_cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

ak_request *ak_sched_submit(ak_sched *s, const ak_req_params *p, ak_error *err) {
    if (p->n_prompt < 1) { ak_failc(err, AK_ERR_INVALID, "the prompt is empty (no tokens)"); return NULL; }
    if (p->n_prompt >= s->cfg.n_ctx) {
        ak_failc(err, AK_ERR_INVALID, "the prompt has %d tokens; the context is %d, so nothing could be generated", p->n_prompt,
                s->cfg.n_ctx);
        return NULL;
    }
    if (p->max_tokens < 1) { ak_failc(err, AK_ERR_INVALID, "max_tokens must be at least 1"); return NULL; }
    int anonymous = !p->agent_id || !p->agent_id[0];
    if (!anonymous && !ak_agent_id_valid(p->agent_id)) {
        ak_failc(err, AK_ERR_INVALID, "invalid agent id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
        return NULL;
    }
    if (p->n_stop < 0 || p->n_stop > AK_MAX_STOP) { ak_failc(err, AK_ERR_INVALID, "at most %d stop sequences", AK_MAX_STOP); return NULL; }
    int pooled = p->pool && p->pool[0];
    if (pooled && !ak_pool_id_valid(p->pool)) {
        ak_failc(err, AK_ERR_INVALID, "invalid pool id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
        return NULL;
    }
    if (p->reprompt.fn && p->n_mem) {
        ak_failc(err, AK_ERR_INVALID, "a prompt rebuilt over the agent's history cannot hold memories");
        return NULL;
    }
    if (p->n_mem < 0 || p->n_mem > AK_MAX_MEMORIES) {
        ak_failc(err, AK_ERR_INVALID, "at most %d memories in a request", AK_MAX_MEMORIES);
        return NULL;
    }
    for (int i = 0; i < p->n_mem; i++)
        if (!p->mem_id[i] || !ak_agent_id_valid(p->mem_id[i]) || p->mem_len[i] < 1 ||
            p->mem_at[i] < (i ? p->mem_at[i - 1] + p->mem_len[i - 1] : 0) ||
            p->mem_at[i] + p->mem_len[i] >= p->n_prompt) {
            ak_failc(err, AK_ERR_INVALID, "memory %d: not a valid id, or not in order before the prompt's last token", i);
            return NULL;
        }
    int n_ch = p->n_choices ? p->n_choices : 1;
    if (n_ch < 1 || n_ch > AK_MAX_CHOICES) {
        ak_failc(err, AK_ERR_INVALID, "n (choices) must be between 1 and %d", AK_MAX_CHOICES);
        return NULL;
    }
    long reserve = (long)p->n_prompt + p->max_tokens;
    if (reserve > s->cfg.n_ctx) reserve = s->cfg.n_ctx;
    ak_block_pool_stats st;
    ak_block_pool_get_stats(s->cfg.pool, &st);
    size_t need = ak_agents_bytes_for(s->cfg.agents, (int)reserve) +
                  (size_t)(n_ch - 1) * fork_bytes(s, p->n_prompt, (int)reserve);
    /* a pooled agent shares the pool's blocks and stores its own in the
     * pool's formats: only admission (ak_agent_bytes_to_add) can say */
    if (!pooled && st.budget && need > st.budget) {
        ak_failc(err, AK_ERR_KV_BUDGET, "this request needs %zu bytes of KV cache for %ld tokens (prompt %d + max_tokens%s); "
                "the KV budget is %zu bytes: lower max_tokens or n, or shorten the prompt", need, reserve, p->n_prompt,
                n_ch > 1 ? ", and max_tokens more for each further choice" : "", st.budget);
        return NULL;
    }
    ak_request *r = ak_calloc(1, sizeof *r, err);
    if (!r) return NULL;
    r->s = s;
    r->refs = 2; /* the caller's and the engine's */
    r->anonymous = anonymous;
    if (!anonymous) snprintf(r->id, sizeof r->id, "%s", p->agent_id);
    if (pooled) snprintf(r->pool, sizeof r->pool, "%s", p->pool);
    r->n_mem = p->n_mem;
    r->mem_full = p->mem_full;
    r->mem_reuse = (ak_reuse_params){.method = p->mem_method, .ratio = p->mem_ratio, .check_layer = -1};
    for (int i = 0; i < p->n_mem; i++) {
        snprintf(r->mem_id[i], sizeof r->mem_id[i], "%s", p->mem_id[i]);
        r->mem_at[i] = p->mem_at[i];
        r->mem_len[i] = p->mem_len[i];
    }
    r->handoff = p->handoff && !p->n_mem;
    r->handoff_reuse = p->handoff_reuse;
    r->domain = p->domain;
    r->n_prompt = p->n_prompt;
    r->max_tokens = p->max_tokens;
    r->n_reserve = (int)reserve;
    r->stop_at_eog = p->stop_at_eog;
    int vocab = s->cfg.model->cfg.vocab;
    if (!(r->prompt = ak_malloc(sizeof(int32_t) * (size_t)p->n_prompt, err))) goto fail;
    r->n_ch = n_ch;
    for (int i = 0; i < n_ch; i++) {
        choice *c = &r->ch[i];
        if (!(c->logits = ak_malloc(sizeof(float) * (size_t)vocab, err))) goto fail;
        if (p->logprobs && !(c->raw = ak_malloc(sizeof(float) * (size_t)vocab, err))) goto fail;
        ak_sampler_params sp = p->sp;
        sp.seed += (uint64_t)i;   /* choice i draws as a request of seed + i would */
        if (!(c->smp = ak_sampler_new(&sp, vocab, err))) {
            if (err) err->code = AK_ERR_INVALID;   /* parameters the sampler refuses: the client's */
            goto fail;
        }
    }
    r->top_logprobs = p->top_logprobs < 0 ? 0 : p->top_logprobs > AK_TOP_LOGPROBS_MAX ? AK_TOP_LOGPROBS_MAX
                                                                                         : p->top_logprobs;
    memcpy(r->prompt, p->prompt, sizeof(int32_t) * (size_t)p->n_prompt);
    for (int i = 0; i < p->n_stop; i++) {
        if (!p->stop[i] || !p->stop[i][0]) { ak_failc(err, AK_ERR_INVALID, "stop sequences must not be empty"); goto fail; }
        if (!(r->stop[i] = strdup(p->stop[i]))) { ak_failc(err, AK_ERR_NOMEM, "out of memory"); goto fail; }
        r->n_stop = i + 1;
        size_t l = strlen(p->stop[i]);
        if (l > r->stop_max) r->stop_max = l;
    }
    if (p->grammar) {
        ak_grammar_ref_hold(p->grammar);
        r->grammar = p->grammar;
        if (p->grammar_after && !(r->grammar_after = strdup(p->grammar_after))) {
            ak_failc(err, AK_ERR_NOMEM, "out of memory");
            goto fail;
        }
        r->con = (ak_gen_constraint){.grammar = ak_grammar_ref_grammar(p->grammar),
                                     .masks = ak_grammar_ref_masks(p->grammar),
                                     .vocab = ak_grammar_ref_vocab(p->grammar), .rule = -1,
                                     .lazy = r->grammar_after != NULL, .after = r->grammar_after,
                                     .required = p->grammar_required, .free_after = p->grammar_free_after};
    }
    ak_gen gens[AK_MAX_CHOICES];
    if (init_gens(s, r, p->prompt, p->n_prompt, gens, err) < 0) {
        /* the prompt, limits and stop strings were checked above: what is
         * left is out of memory or a fault of the server, never the client's */
        if (err && err->code != AK_ERR_NOMEM) err->code = AK_ERR_GENERIC;
        goto fail;
    }
    for (int i = 0; i < n_ch; i++) r->ch[i].gen = gens[i];
    r->res.prompt_tokens = p->n_prompt;
    r->res.n_choices = n_ch;
    r->reprompt = p->reprompt;
    if (enqueue(s, r, err) < 0) {
        r->reprompt = (ak_reprompt){0};   /* the caller's again */
        goto fail;
    }
    return r;
fail:
    free_request(r);
    return NULL;
}

/* ---------------------------------------------------------------- engine */

static const char *agent_of(const ak_request *r) { return r->id; }

static int agent_active(const ak_sched *s, const char *id) {
    for (const ak_request *r = s->active; r; r = r->next)
        if (!strcmp(r->id, id)) return 1;
    return 0;
}

/* Bytes of blocks a pool job still needs to hold its n_prompt positions. */
static size_t pool_job_needs(const ak_sched *s, const ak_request *r) {
    int bt = ak_block_pool_block_tokens(s->cfg.pool);
    size_t want = (size_t)((r->n_prompt + bt - 1) / bt) * ak_block_pool_block_bytes(s->cfg.pool, r->pfk, r->pfv);
    size_t have = r->kv ? ak_kv_bytes(r->kv) : 0;
    return want > have ? want - have : 0;
}

/* Bytes r's further choices may still add: each fork's share (fork_bytes)
 * less the blocks it holds alone already; an ended one adds nothing. */
static size_t forks_outstanding(const ak_sched *s, const ak_request *r) {
    if (r->n_ch < 2 || r->state == R_DONE) return 0;
    size_t each = fork_bytes(s, r->n_prompt, r->n_reserve), sum = 0;
    for (int i = 1; i < r->n_ch; i++) {
        const choice *c = &r->ch[i];
        if (r->state == R_DECODE && !c->live) continue;
        size_t have = c->kv ? ak_kv_private_bytes(c->kv) : 0;
        sum += have < each ? each - have : 0;
    }
    return sum;
}

/* Bytes the running requests may still need to reach their reservations:
 * only what each will add (a pool's blocks and blocks linked from the
 * content index are shared, not counted again). */
static size_t outstanding(const ak_sched *s) {
    size_t sum = 0;
    for (const ak_request *r = s->active; r; r = r->next) {
        if (r->pool_job) sum += pool_job_needs(s, r);
        else
            sum += ak_agent_bytes_to_add(s->cfg.agents, agent_of(r), r->pool[0] ? r->pool : NULL, r->prompt,
                                         r->n_prompt, r->n_reserve) + forks_outstanding(s, r);
    }
    return sum;
}

/* Appends bytes to choice c's text (engine thread; takes s->mu). */
static int append_text(ak_sched *s, choice *c, const char *b, size_t n) {
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (c->len + n + 1 > c->cap) {
        size_t nc = (c->len + n + 1) * 2;
        char *nt = realloc(c->text, nc);
        if (!nt) rc = -1;
        else { c->text = nt; c->cap = nc; }
    }
    if (rc == 0) {
        memcpy(c->text + c->len, b, n);
        c->len += n;
        c->text[c->len] = 0;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Ends a pool job: a pool not committed is forgotten; the waiting caller
 * sees the result (code: an ak_err_code for AK_FINISH_ERROR, else 0).
 * Engine thread. */
static void finish_pool_job(ak_sched *s, ak_request *r, ak_finish why, int code, const char *msg) {
    if (r->state == R_PREFILL && !r->committed) ak_pool_abort(s->cfg.agents, r->pool);
    if (r->committed)
        logf_(s, "pool %s: created, %d tokens (%s/%s) in %.1f ms", r->pool, r->n_prompt, ak_kv_format_get(r->pfk)->name,
              ak_kv_format_get(r->pfv)->name, (ak_now() - r->t_submit) * 1e3);
    pthread_mutex_lock(&s->mu);
    /* cut at shutdown before its commit: the pool does not exist */
    if (!r->committed && why != AK_FINISH_ERROR) {
        why = AK_FINISH_ERROR;
        code = AK_ERR_SHUTDOWN;
        msg = "the server is shutting down";
    }
    r->res.finish = why;
    r->res.code = code;
    if (msg) snprintf(r->res.error, sizeof r->res.error, "%s", msg);
    r->done = 1;
    news_locked(s, r);
    pthread_mutex_unlock(&s->mu);
    r->state = R_DONE;
    s->changed = 1;
}

/* Unpins r's span source, if it pinned one. */
static void unpin_source(ak_sched *s, ak_request *r) {
    if (!r->pinned[0]) return;
    ak_agent_pin(s->cfg.agents, r->pinned, -1);
    r->pinned[0] = 0;
}

static void finish(ak_sched *s, ak_request *r, ak_finish why, int code, const char *msg);

/* Ends choice i of r with why: the bytes its generator held flushed into its
 * text (not for an error), its finish and tokens given to the readers, a
 * fork's sequence released. Engine thread. */
static void end_choice(ak_sched *s, ak_request *r, int i, ak_finish why) {
    choice *c = &r->ch[i];
    const char *fp;
    size_t nf = ak_gen_flush(&c->gen, &fp);
    if (nf && why != AK_FINISH_ERROR) append_text(s, c, fp, nf);
    c->live = 0;
    if (i > 0) {   /* choice 0's is the agent's */
        ak_kv_free(c->kv);
        c->kv = NULL;
    }
    pthread_mutex_lock(&s->mu);
    c->visible = c->len;
    r->res.choice_finish[i] = why;
    r->res.choice_tokens[i] = c->gen.n_gen;
    news_locked(s, r);
    pthread_mutex_unlock(&s->mu);
}

/* 1 while some choice of r decodes. */
static int any_live(const ak_request *r) {
    for (int i = 0; i < r->n_ch; i++)
        if (r->ch[i].live) return 1;
    return 0;
}

/* finish with error e, whose ak_err_code the reader gets in res.code. */
static void finish_err(ak_sched *s, ak_request *r, const ak_error *e) {
    finish(s, r, AK_FINISH_ERROR, e->code ? e->code : AK_ERR_GENERIC, e->msg);
}

/* Ends a request: the agent's turn ends (saved per the policy), readers see
 * the whole text and the result (code: an ak_err_code for AK_FINISH_ERROR,
 * else 0). Engine thread; r leaves the active list in the caller's sweep
 * (state R_DONE). */
static void finish(ak_sched *s, ak_request *r, ak_finish why, int code, const char *msg) {
    unpin_source(s, r);   /* cut or failed before its span was placed */
    if (r->pool_job) {
        finish_pool_job(s, r, why, code, msg);
        return;
    }
    int n_gen = 0;
    for (int i = 0; i < r->n_ch; i++) {
        if (r->res.choice_finish[i] == AK_FINISH_NONE) end_choice(s, r, i, why);
        n_gen += r->ch[i].gen.n_gen;
    }
    if (r->state == R_PREFILL || r->state == R_DECODE) {
        ak_error err = {{0}};
        if (why == AK_FINISH_ERROR) ak_agent_abort(s->cfg.agents, agent_of(r));
        if (ak_agent_end(s->cfg.agents, agent_of(r), &err) < 0)
            logf_(s, "agent %s: %s", agent_of(r), err.msg);
        ak_metrics_completion(s->cfg.metrics, n_gen);
    }
    if (r->state == R_PREFILL || r->state == R_DECODE) {
        const ak_turn *t = &r->res.turn;
        static const char *why_name[] = {"running", "stop", "length", "error"};
        char choices[32] = "";
        if (r->n_ch > 1) snprintf(choices, sizeof choices, " in %d choices", r->n_ch);
        logf_(s, "%s%s: %s/%s, %d prompt tokens (%d cached, %d prefilled%s), %d generated%s, ttft %.1f ms, %s",
              r->anonymous ? "anonymous " : "agent ", r->anonymous ? "request" : r->id, ak_tier_name(t->tier),
              ak_match_name(t->match), r->n_prompt, t->reused, t->prefilled,
              t->tier == AK_TIER_WARM ? (t->restored_ahead ? ", restored ahead" : ", restored on admission") : "",
              n_gen, choices, r->sampled ? (r->t_first - r->t_submit) * 1e3 : 0.0, why_name[why]);
    }
    double now = ak_now();
    pthread_mutex_lock(&s->mu);
    r->res.finish = why;
    r->res.code = code;
    if (msg) snprintf(r->res.error, sizeof r->res.error, "%s", msg);
    r->res.completion_tokens = n_gen;
    if (r->sampled) r->res.decode_ms = (now - r->t_first) * 1e3;
    r->done = 1;
    news_locked(s, r);
    pthread_mutex_unlock(&s->mu);
    r->state = R_DONE;
    s->changed = 1;
}

/* Records the log-probabilities of token tok, just kept by choice c, from
 * c->raw (the step's raw logits) with top alternatives, its text starting
 * at the text's current end. Engine thread. Returns 0, or -1 when out of
 * memory. */
static int record_logprob(ak_sched *s, choice *c, int top, int32_t tok) {
    int vocab = s->cfg.model->cfg.vocab;
    ak_req_logprob e = {.id = tok, .offset = c->len};
    double lse = ak_logsumexp(c->raw, vocab);
    e.logprob = (float)((double)c->raw[tok] - lse);
    e.n_top = ak_top_logprobs(c->raw, vocab, lse, top, e.top);
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (c->n_lp == c->lp_cap) {
        int nc = c->lp_cap ? c->lp_cap * 2 : 64;
        ak_req_logprob *nl = realloc(c->lp, sizeof *nl * (size_t)nc);
        if (!nl) rc = -1;
        else { c->lp = nl; c->lp_cap = nc; }
    }
    if (rc == 0) c->lp[c->n_lp++] = e;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Samples choice i's next token from its logits and hands its text out;
 * decides whether the choice goes on (its next_tok is fed at the next
 * step) or ends, and the request with its last choice. The rules are
 * `agentkv run`'s (the same step, generate.h), so that greedy output is
 * the same. */
static void next_token(ak_sched *s, ak_request *r, int i) {
    choice *c = &r->ch[i];
    ak_gen_out out;
    ak_error err = {{0}};
    int kept = c->gen.n_gen;
    /* the model's own distribution is read before the step changes the logits (logprobs.h) */
    if (c->raw) memcpy(c->raw, c->logits, sizeof(float) * (size_t)s->cfg.model->cfg.vocab);
    ak_gen_status st = ak_gen_step(&c->gen, c->logits, c->pos, &out, &err);
    if (out.sampled) {
        double now = ak_now();
        if (!r->sampled) {
            r->sampled = 1;
            r->t_first = now;
            double ttft = now - r->t_submit;
            ak_metrics_turn(s->cfg.metrics, r->res.turn.tier, r->n_prompt, r->res.turn.reused, ttft,
                            r->res.turn.restore_ms / 1e3, r->res.turn.restore_bytes, r->res.turn.restored_ahead);
            pthread_mutex_lock(&s->mu);
            r->res.ttft_ms = ttft * 1e3;
            pthread_mutex_unlock(&s->mu);
        } else if (c->t_last > 0) {   /* a further choice's first token follows no token of its own */
            ak_metrics_token(s->cfg.metrics, r->res.turn.tier, now - c->t_last);
        }
        c->t_last = now;
    }
    /* an end-of-generation token is not kept (n_gen unchanged): it has no entry */
    if (st != AK_GEN_ERROR && c->raw && c->gen.n_gen > kept && record_logprob(s, c, r->top_logprobs, out.tok) < 0)
        st = AK_GEN_ERROR;
    if (st == AK_GEN_ERROR || (out.n_piece && append_text(s, c, out.piece, out.n_piece) < 0)) {
        finish(s, r, AK_FINISH_ERROR, AK_ERR_GENERIC, "cannot decode a generated token (out of memory?)");
        return;
    }
    if (out.n_piece) {
        /* the readers' copy of the text follows the generator's: cut where
         * a stop string starts, shown up to what cannot become one */
        pthread_mutex_lock(&s->mu);
        if (out.cut >= 0) {
            c->len = (size_t)out.cut;
            c->text[c->len] = 0;
            while (c->n_lp && c->lp[c->n_lp - 1].offset >= c->len) c->n_lp--;   /* their text is cut */
        } else if (out.visible > c->visible) {
            c->visible = out.visible;
            news_locked(s, r);
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (st == AK_GEN_STOP || st == AK_GEN_LENGTH) {
        end_choice(s, r, i, st == AK_GEN_STOP ? AK_FINISH_STOP : AK_FINISH_LENGTH);
        if (!any_live(r)) finish(s, r, r->res.choice_finish[0], 0, NULL);
        return;
    }
    c->next_tok = out.tok;
}

/* The prefill of r ended (the agent's cache holds the prompt, choice 0's
 * logits are the next token's): choice 0 decodes on the agent's sequence,
 * each other on a fork of it (its blocks linked, copied where written) with
 * a copy of those logits; each samples its first token. Engine thread. */
static void start_choices(ak_sched *s, ak_request *r) {
    ak_error e = {{0}};
    for (int i = 0; i < r->n_ch; i++) {
        choice *c = &r->ch[i];
        c->kv = r->kv;
        if (i > 0) {
            if (!(c->kv = ak_kv_fork(r->kv, &e))) {
                finish_err(s, r, &e);
                return;
            }
            memcpy(c->logits, r->ch[0].logits, sizeof(float) * (size_t)s->cfg.model->cfg.vocab);
        }
        c->pos = r->pos;
        c->live = 1;
    }
    for (int i = 0; i < r->n_ch && r->state == R_DECODE; i++) next_token(s, r, i);
}

/* 1 when agent id's history starts with pool (or with none when pool is
 * ""), as far as the agents know (an unknown agent has none). */
static int agent_on_pool(const ak_sched *s, const char *id, const char *pool) {
    int i = ak_agents_find(s->cfg.agents, id);
    if (i < 0) return !pool[0];
    ak_agent_info in;
    ak_agents_get(s->cfg.agents, i, &in);
    return !strcmp(in.pool, pool);
}

/* An anonymous request reuses the idle ephemeral agent on the same pool (or
 * none) whose cache shares the longest prefix with its prompt, or gets a new
 * one; with max_active of them already, an idle one on another pool is
 * emptied and reused (its cache could not serve this prompt anyway). */
static void pick_anonymous(ak_sched *s, ak_request *r) {
    int best = -1, best_len = 0, spare = -1;
    char id[32];
    for (int i = 0; i < s->n_anon; i++) {
        snprintf(id, sizeof id, ".anon-%d", i);
        if (agent_active(s, id)) continue;
        if (!agent_on_pool(s, id, r->pool)) {
            if (spare < 0) spare = i;
            continue;
        }
        int m = ak_agent_match_len(s->cfg.agents, id, r->prompt, r->n_prompt);
        if (best < 0 || m > best_len) { best = i; best_len = m; }
    }
    if (best < 0 && spare >= 0 && s->n_anon >= s->cfg.max_active) {
        snprintf(id, sizeof id, ".anon-%d", spare);
        ak_error err = {{0}};
        ak_agent_remove(s->cfg.agents, id, &err);
        best = spare;
    } else if (best < 0 || (best_len == 0 && s->n_anon < s->cfg.max_active)) {
        best = s->n_anon++;
    }
    snprintf(r->id, sizeof r->id, ".anon-%d", best);
}

/* 1 while a pool job making pool id runs. */
static int pool_job_active(const ak_sched *s, const char *id) {
    for (const ak_request *r = s->active; r; r = r->next)
        if (r->pool_job && !strcmp(r->pool, id)) return 1;
    return 0;
}

static int id_listed(char (*ids)[AK_AGENT_ID_MAX + 2], int n, const char *id) {
    for (int i = 0; i < n; i++)
        if (!strcmp(ids[i], id)) return 1;
    return 0;
}

static void unlink_waiting(ak_sched *s, ak_request *r, ak_request *prev) {
    if (prev) prev->next = r->next;
    else s->waiting = r->next;
    r->next = NULL;
    s->n_waiting--;
}

#define MAX_IO 2   /* restores queued or running on the I/O thread */

/* Hands r's agent to the I/O thread if it is warm. Returns 1 if a restore
 * is now in flight, 0 if there is nothing to restore (hot, new, or no
 * usable file), -1 if it cannot start now (no room, I/O queue full). */
static int start_prefetch(ak_sched *s, ak_request *r) {
    if (s->n_io >= MAX_IO) return -1;
    ak_restore_job *job = NULL;
    ak_error err = {{0}};
    int rc = ak_agent_prefetch(s->cfg.agents, r->id, outstanding(s), &job, &err);
    if (rc <= 0) return rc;
    io_item *it = malloc(sizeof *it);
    if (!it) {
        ak_agent_prefetch_done(s->cfg.agents, job); /* nothing loaded: the turn restores */
        return 0;
    }
    it->job = job;
    it->next = NULL;
    pthread_mutex_lock(&s->mu);
    io_item **tail = &s->io_queue;
    while (*tail) tail = &(*tail)->next;
    *tail = it;
    s->n_io++;
    pthread_cond_signal(&s->io_cv);
    pthread_mutex_unlock(&s->mu);
    return 1;
}

/* Hands warm agents of requests still waiting for a slot to the I/O thread,
 * so their caches are in RAM when their turn comes. */
static void prefetch(ak_sched *s) {
    if (s->cfg.no_prefetch) return;
    for (ak_request *r = s->waiting; r && s->n_io < MAX_IO; r = r->next) {
        if (r->anonymous || r->pool_job || r->prefetch_tried) continue;
        int rc = start_prefetch(s, r);
        if (rc < 0) break; /* no room yet: retry at a later step */
        r->prefetch_tried = 1;
    }
}

/* Appends r (just unlinked from the waiting list) to the active list,
 * keeping admission order. */
static void activate(ak_sched *s, ak_request *r) {
    ak_request **tail = &s->active;
    while (*tail) tail = &(*tail)->next;
    *tail = r;
    s->n_active++;
    pthread_mutex_lock(&s->mu);
    r->res.admitted = 1;
    pthread_mutex_unlock(&s->mu);
}

/* Admits pool job r: begins the pool and reserves every block of its
 * prefill up front, so that its chunks cannot fail a batch for room.
 * Returns 1 when r left the waiting list (admitted or failed), 0 when it
 * waits (the same pool is being made, or no room while requests run). */
static int admit_pool_job(ak_sched *s, ak_request *r, ak_request *prev) {
    if (pool_job_active(s, r->pool)) return 0;
    ak_block_pool_stats st;
    ak_block_pool_get_stats(s->cfg.pool, &st);
    size_t need = pool_job_needs(s, r), busy = st.used + outstanding(s);
    int others = s->n_active > 0 || s->n_io > 0;
    if (others && st.budget && (busy > st.budget || need > st.budget - busy)) return 0;
    ak_error err = {{0}};
    ak_kv *kv = NULL;
    int rc = ak_pool_begin(s->cfg.agents, &(ak_pool_request){.id = r->pool, .tokens = r->prompt, .n = r->n_prompt,
                           .fk = r->pfk, .fv = r->pfv, .source = r->source}, &kv, &err);
    if (rc == 0 && ak_kv_prepare(kv, 0, r->n_prompt, &err) < 0) {
        ak_pool_abort(s->cfg.agents, r->pool);
        rc = -1;
    }
    if (rc < 0 && err.code == AK_ERR_KV_BUDGET && others) return 0;
    unlink_waiting(s, r, prev);
    if (rc < 0) {
        finish_err(s, r, &err);
        pthread_mutex_lock(&s->mu);
        unref_locked(r);
        pthread_mutex_unlock(&s->mu);
        return 1;
    }
    r->kv = kv;
    r->pos = 0;
    r->state = R_PREFILL;
    r->t_admit = ak_now();
    activate(s, r);
    return 1;
}

/* Rebuilds r's prompt over its agent's history (ak_reprompt), once, right
 * before the prompt is matched; only an agent in RAM has a history to
 * rebuild over (a warm one was restored ahead; an anonymous request's is
 * the ephemeral agent its prompt matched best). A rebuilt prompt replaces
 * the submitted one: the generator starts over on it and the reservation
 * follows its length. Engine thread. */
static void rebuild_prompt(ak_sched *s, ak_request *r) {
    ak_reprompt rp = r->reprompt;
    r->reprompt = (ak_reprompt){0};
    int n_hist = 0, n = 0;
    const int32_t *hist = ak_agent_history(s->cfg.agents, r->id, &n_hist);
    int32_t *ids = NULL;
    ak_error err = {{0}};
    /* a prompt that already holds the whole history has nothing to gain:
     * skip rendering it again on the engine thread */
    int whole = hist && ak_agent_match_len(s->cfg.agents, r->id, r->prompt, r->n_prompt) >= n_hist;
    int rc = hist && !whole ? rp.fn(rp.ud, hist, n_hist, &ids, &n, &err) : 0;
    if (rp.free) rp.free(rp.ud);
    if (rc < 0) logf_(s, "agent %s: the prompt was not rebuilt over its history: %s", r->id, err.msg);
    if (rc <= 0) return;
    ak_gen gens[AK_MAX_CHOICES];
    if (n < 1 || n >= s->cfg.n_ctx || init_gens(s, r, ids, n, gens, &err) < 0) {
        free(ids);
        return;
    }
    for (int i = 0; i < r->n_ch; i++) {
        ak_gen_free(&r->ch[i].gen);
        r->ch[i].gen = gens[i];
    }
    free(r->prompt);
    r->prompt = ids;
    r->n_prompt = n;
    long reserve = (long)n + r->max_tokens;
    r->n_reserve = (int)(reserve > s->cfg.n_ctx ? s->cfg.n_ctx : reserve);
    pthread_mutex_lock(&s->mu);
    r->res.prompt_tokens = n;
    pthread_mutex_unlock(&s->mu);
}

/* Before r's turn opens (which may evict agents to make room): finds the
 * longest span of r's prompt (before its last token) that another agent
 * holds, into r->span, and pins that agent so that the open does not
 * evict it. The search failing is logged and leaves r to a plain
 * prefill. */
static void find_span(ak_sched *s, ak_request *r) {
    ak_error e = {{0}};
    const ak_span_query q = {.id = agent_of(r), .domain = r->domain, .tokens = r->prompt, .from = 0,
                             .upto = r->n_prompt - 1, .min_len = AK_HANDOFF_MIN_SPAN};
    memset(&r->span, 0, sizeof r->span);
    if (q.upto < q.min_len) return;
    if (ak_agents_find_span(s->cfg.agents, &q, &r->span, &e) < 0)
        logf_(s, "agent %s: no handoff span looked for: %s", agent_of(r), e.msg);
    else if (r->span.len && ak_agent_pin(s->cfg.agents, r->span.src, +1) == 0)
        snprintf(r->pinned, sizeof r->pinned, "%s", r->span.src);
}

/* After r's turn opened with r->pos positions reused: the span cut to
 * start there (what the agent's own cache or the content index gave is
 * not placed again); dropped, and its source unpinned, when less than
 * the minimum is left. */
static void clip_span(ak_sched *s, ak_request *r) {
    ak_span_found *f = &r->span;
    if (f->len && f->at < r->pos) {
        int cut = r->pos - f->at;
        f->len = f->len > cut ? f->len - cut : 0;
        f->at += cut;
        f->src_at += cut;
    }
    if (f->len < AK_HANDOFF_MIN_SPAN) {
        f->len = 0;
        unpin_source(s, r);
    }
}

/* Places the span a prefilling request has reached, if any (its cache
 * holds exactly the positions before it). A source that no longer holds
 * it, or a placement that fails, leaves the tokens to the prefill (logged).
 */
static void place_span(ak_sched *s, ak_request *r) {
    if (!r->span.len || r->pos != r->span.at) return;
    ak_error e = {{0}};
    ak_reuse_stats st = {0};
    const ak_span_place pl = {.id = agent_of(r), .tokens = r->prompt, .at = r->pos, .src = r->span.src,
                              .src_at = r->span.src_at, .n = r->span.len};
    int n = r->span.len;
    r->span.len = 0;   /* placed or given up: once */
    unpin_source(s, r);   /* reuse_span checks the source again: still there or not, the pin has done its part */
    if (ak_agent_reuse_span(s->cfg.agents, s->ctx, &pl, &r->handoff_reuse, &r->kv, &st, &e) < 0) {
        /* the cache still holds [0, pos): the prefill goes on as if no span had been found */
        logf_(s, "agent %s: handoff span of %d tokens computed instead: %s", agent_of(r), n, e.msg);
        return;
    }
    r->pos += n;
    pthread_mutex_lock(&s->mu);
    r->res.turn.reused += n;   /* placed, not computed */
    r->res.turn.prefilled -= n;
    r->res.handoff_reused = n;
    r->res.handoff_recomputed = st.n_recomputed;
    r->res.handoff_ms = st.ms;
    r->res.handoff_shift = pl.at - pl.src_at;
    snprintf(r->res.handoff_from, sizeof r->res.handoff_from, "%s", r->span.src);
    pthread_mutex_unlock(&s->mu);
}

/* The shortest shared prefix a request waits for another to compute: two
 * blocks of the default size. */
#define AK_WAIT_PREFIX_MIN 64

/* 1 when r should wait for an active request that is computing, now, a
 * prefix of r's prompt that r's own cache lacks: once that one commits,
 * its blocks are in the content index and r's turn links them instead of
 * computing them a second time beside it (one document sent to many
 * agents at once). Only a producer whose blocks will be published counts
 * (no memories, no handoff span, its agent pure, sharing on). r waits at
 * most until that producer's prefill ends: it always progresses. */
static int wait_for_shared_prefix(ak_sched *s, const ak_request *r) {
    if (r->pool_job || r->n_mem) return 0;
    int own = -1;
    for (const ak_request *p = s->active; p; p = p->next) {
        if (p->state != R_PREFILL || p->pool_job || p->n_mem || p->span.len || p->res.handoff_reused) continue;
        int lim = p->n_prompt < r->n_prompt ? p->n_prompt : r->n_prompt;
        if (p->pos + AK_WAIT_PREFIX_MIN > lim) continue;   /* it has computed (nearly) all it could share */
        int c = 0;
        while (c < lim && p->prompt[c] == r->prompt[c]) c++;
        if (c < p->pos + AK_WAIT_PREFIX_MIN || !ak_agent_publishes(s->cfg.agents, agent_of(p))) continue;
        if (own < 0) own = r->anonymous ? 0 : ak_agent_prefix_held(s->cfg.agents, r->id, r->prompt, r->n_prompt);
        if (own + AK_WAIT_PREFIX_MIN <= c) return 1;
    }
    return 0;
}

/* Admits waiting requests in arrival order (see sched.h). */
static void admit(ak_sched *s) {
    char (*blocked)[AK_AGENT_ID_MAX + 2] = NULL;
    int n_blocked = 0;
    if (s->n_waiting) blocked = malloc(sizeof *blocked * (size_t)s->n_waiting);
    if (!blocked && s->n_waiting) return; /* out of memory: try next step */
    ak_request *prev = NULL, *r = s->waiting;
    while (r) {
        ak_request *nx = r->next;
        if (s->n_active >= s->cfg.max_active) break;
        if (r->pool_job) {
            if (!admit_pool_job(s, r, prev)) prev = r;
            r = nx;
            continue;
        }
        if (!r->anonymous && (id_listed(blocked, n_blocked, r->id) || agent_active(s, r->id) ||
                              ak_agent_restoring(s->cfg.agents, r->id))) {
            /* a later request of a busy agent waits behind the earlier one */
            if (!id_listed(blocked, n_blocked, r->id)) snprintf(blocked[n_blocked++], sizeof blocked[0], "%s", r->id);
            prev = r;
            r = nx;
            continue;
        }
        /* a warm agent is restored on the I/O thread while the batch goes
         * on; the request is admitted when its cache is in RAM */
        if (!r->anonymous && !s->cfg.no_prefetch && !r->prefetch_tried &&
            !ak_agent_hot(s->cfg.agents, r->id)) {
            int rc = start_prefetch(s, r);
            if (rc != 0 && (rc > 0 || s->n_active > 0 || s->n_io > 0)) {
                if (rc > 0) r->prefetch_tried = 1;
                snprintf(blocked[n_blocked++], sizeof blocked[0], "%s", r->id);
                prev = r;
                r = nx;
                continue;
            }
            r->prefetch_tried = 1; /* nothing to restore, or nothing else running: open restores */
        }
        if (wait_for_shared_prefix(s, r)) {   /* linked once the other commits */
            if (!r->anonymous) snprintf(blocked[n_blocked++], sizeof blocked[0], "%s", r->id);
            prev = r;
            r = nx;
            continue;
        }
        if (r->anonymous) pick_anonymous(s, r);
        if (r->reprompt.fn) rebuild_prompt(s, r);
        double t_open = ak_now(); /* a restore in the open is service time, not queueing */
        ak_error err = {{0}};
        ak_turn t;
        ak_kv *kv;
        int flags = (r->anonymous ? AK_AGENT_EPHEMERAL : 0) | (r->mem_full ? AK_AGENT_RECOMPUTE_MEMORIES : 0);
        if (r->handoff) find_span(s, r);
        ak_turn_opts to = {.id = r->id, .flags = flags, .pool_id = r->pool[0] ? r->pool : NULL, .tokens = r->prompt,
                           .n = r->n_prompt, .n_reserve = r->n_reserve,
                           .extra = outstanding(s) + forks_outstanding(s, r), .at = r->mem_at,
                           .len = r->mem_len, .k = r->n_mem, .domain = r->domain};
        if (ak_agent_open(s->cfg.agents, &to, &kv, &t, &err) < 0) {
            unpin_source(s, r);   /* looked for and pinned again at the next try */
            r->span.len = 0;
            if (err.code == AK_ERR_KV_BUDGET && (s->n_active > 0 || s->n_io > 0)) {
                /* room comes back when a running request ends */
                if (!r->anonymous) snprintf(blocked[n_blocked++], sizeof blocked[0], "%s", r->id);
                else r->id[0] = 0;
                prev = r;
                r = nx;
                continue;
            }
            unlink_waiting(s, r, prev);
            /* alone and still no room (AK_ERR_KV_BUDGET before admission):
             * this request can never fit */
            finish_err(s, r, &err);
            pthread_mutex_lock(&s->mu);
            unref_locked(r);
            pthread_mutex_unlock(&s->mu);
            r = nx;
            continue;
        }
        ak_metrics_evictions(s->cfg.metrics, t.evicted);
        unlink_waiting(s, r, prev);
        r->kv = kv;
        r->pos = t.reused;
        r->state = R_PREFILL;
        clip_span(s, r);
        r->t_admit = t_open;
        pthread_mutex_lock(&s->mu);
        r->res.turn = t;
        r->res.queue_ms = (r->t_admit - r->t_submit) * 1e3;
        pthread_mutex_unlock(&s->mu);
        activate(s, r);
        r = nx;
    }
    free(blocked);
}

/* Places the memories a prefilling request has reached (its cache holds
 * exactly the positions before the next one; those reused already are
 * passed). Returns 0, or -1 having finished the request with the error. */
static int place_memories(ak_sched *s, ak_request *r) {
    while (!r->mem_full && r->mem_next < r->n_mem) {
        int i = r->mem_next;
        if (r->pos > r->mem_at[i]) {   /* the agent's history held it already */
            r->mem_next++;
            continue;
        }
        if (r->pos < r->mem_at[i]) return 0;
        ak_error e = {{0}};
        ak_reuse_stats st = {0};
        int blend = r->mem_reuse.method == AK_REUSE_CACHEBLEND || r->mem_reuse.method == AK_REUSE_AGENTKVSHIFT;
        ak_place_opts pl = {.id = agent_of(r), .mem_id = r->mem_id[i], .tokens = r->prompt, .at = r->pos};
        int rc = blend ? ak_agent_reuse_memory(s->cfg.agents, s->ctx, &pl, &r->mem_reuse, &r->kv, &st, &e)
                       : ak_agent_place_memory(s->cfg.agents, &pl, &r->kv, &e);
        if (rc < 0) {
            finish_err(s, r, &e);
            return -1;
        }
        if (blend) {
            pthread_mutex_lock(&s->mu);
            r->res.mem_recomputed += st.n_recomputed;
            r->res.mem_ms += st.ms;
            pthread_mutex_unlock(&s->mu);
        }
        r->pos += r->mem_len[i];
        r->mem_next++;
        pthread_mutex_lock(&s->mu);
        r->res.turn.reused += r->mem_len[i];   /* placed, not computed */
        r->res.turn.prefilled -= r->mem_len[i];
        pthread_mutex_unlock(&s->mu);
    }
    return 0;
}

/* One forward pass over every running request (see sched.h). */
static void step(ak_sched *s) {
    int nb = 0, nseq = 0, cap = s->cfg.step_tokens;
    for (ak_request *r = s->active; r; r = r->next) {
        r->step_k = 0;
        if (r->state != R_DECODE) continue;
        for (int i = 0; i < r->n_ch; i++) {   /* each choice a sequence of the batch */
            choice *c = &r->ch[i];
            c->fed = c->live && nb < cap;
            if (!c->fed) continue;
            s->b_tok[nb] = c->next_tok;
            s->b_pos[nb] = c->pos;
            s->b_seq[nb] = c->kv;
            s->b_logits[nb] = c->logits;
            nb++;
            nseq++;
            r->step_k++;
        }
    }
    /* with agents decoding, a step's prefill chunk is what fits in step_ms
     * at the measured speed: their next token is never more than a step away */
    int n_decode = nb;
    if (n_decode && s->cfg.step_ms > 0 && s->prefill_tps > 0) {
        int chunk = (int)(s->prefill_tps * s->cfg.step_ms / 1e3);
        if (chunk < 16) chunk = 16;
        if (nb + chunk < cap) cap = nb + chunk;
    }
    for (ak_request *r = s->active; r && nb < cap; r = r->next) {
        if (r->state != R_PREFILL) continue;
        if (place_memories(s, r) < 0) continue;
        place_span(s, r);
        int k = r->n_prompt - r->pos;
        if (!r->mem_full && r->mem_next < r->n_mem) k = r->mem_at[r->mem_next] - r->pos;   /* up to the next memory */
        if (r->span.len && r->span.at > r->pos && r->span.at - r->pos < k) k = r->span.at - r->pos;   /* or span */
        if (k > cap - nb) k = cap - nb;
        for (int i = 0; i < k; i++) {
            int p = r->pos + i;
            s->b_tok[nb] = r->prompt[p];
            s->b_pos[nb] = p;
            s->b_seq[nb] = r->kv;
            s->b_logits[nb] = p == r->n_prompt - 1 && !r->pool_job ? r->ch[0].logits : NULL;
            nb++;
        }
        r->step_k = k;
        nseq++;
    }
    if (nb == 0) return;
    ak_batch b = {.n = nb, .token = s->b_tok, .pos = s->b_pos, .seq = s->b_seq, .logits_out = s->b_logits};
    ak_error err = {{0}};
    double t0 = ak_now();
    int rc = ak_forward(s->ctx, &b, &err);
    double dt = ak_now() - t0;
    ak_metrics_batch(s->cfg.metrics, nseq);
    if (rc == 0) ak_metrics_prefill(s->cfg.metrics, nb - n_decode);
    if (rc == 0 && nb - n_decode >= 16) {
        double tps = (nb - n_decode) / dt; /* decode tokens ride along almost free */
        s->prefill_tps = s->prefill_tps > 0 ? 0.7 * s->prefill_tps + 0.3 * tps : tps;
    }
    for (ak_request *r = s->active; r; r = r->next) {
        if (!r->step_k) continue;
        if (rc < 0) {
            logf_(s, "agent %s: forward pass failed: %s", agent_of(r), err.msg);
            finish(s, r, AK_FINISH_ERROR, AK_ERR_GENERIC, err.msg);   /* the engine's failure, whatever its cause */
            continue;
        }
        ak_error e = {{0}};
        if (r->state == R_PREFILL) {
            r->pos += r->step_k;
            r->prefill_s += dt;
            if (r->pos < r->n_prompt) continue;
            if (r->pool_job) {
                if (ak_pool_commit(s->cfg.agents, r->pool, &e) < 0) {
                    finish_err(s, r, &e);
                    continue;
                }
                r->committed = 1;
                finish(s, r, AK_FINISH_STOP, 0, NULL);
                continue;
            }
            if (ak_agent_commit(s->cfg.agents, agent_of(r), r->prompt, r->n_prompt, &e) < 0) {
                finish(s, r, AK_FINISH_ERROR, AK_ERR_GENERIC, e.msg);
                continue;
            }
            pthread_mutex_lock(&s->mu);
            r->res.turn.prefill_ms = r->prefill_s * 1e3;
            r->res.started = 1;
            pthread_mutex_unlock(&s->mu);
            r->state = R_DECODE;
            start_choices(s, r);
            continue;
        }
        for (int i = 0; i < r->n_ch && r->state == R_DECODE; i++) {
            choice *c = &r->ch[i];
            if (!c->fed) continue;
            c->fed = 0;
            /* the agent's history follows choice 0 */
            if (i == 0 && ak_agent_append(s->cfg.agents, agent_of(r), c->next_tok, &e) < 0) {
                finish(s, r, AK_FINISH_ERROR, AK_ERR_GENERIC, e.msg);
                break;
            }
            c->pos++;
            next_token(s, r, i);
        }
    }
}

/* Removes finished requests from the active list. */
static void sweep(ak_sched *s) {
    ak_request **pp = &s->active;
    while (*pp) {
        ak_request *r = *pp;
        if (r->state == R_DONE) {
            *pp = r->next;
            s->n_active--;
            pthread_mutex_lock(&s->mu);
            unref_locked(r);
            pthread_mutex_unlock(&s->mu);
        } else {
            pp = &r->next;
        }
    }
}

static int agent_busy(const ak_sched *s, const char *id) {
    if (agent_active(s, id)) return 1;
    for (const ak_request *r = s->waiting; r; r = r->next)
        if (!strcmp(r->id, id)) return 1;
    return 0;
}

/* Fails everything at shutdown: queued requests with AK_ERR_SHUTDOWN, running ones cut. */
static void shutdown_requests(ak_sched *s) {
    pthread_mutex_lock(&s->mu);
    ak_request *in = s->incoming;
    s->incoming = s->incoming_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    while (in) {
        ak_request *nx = in->next;
        in->next = s->waiting;
        s->waiting = in;
        s->n_waiting++;
        in = nx;
    }
    while (s->waiting) {
        ak_request *r = s->waiting;
        unlink_waiting(s, r, NULL);
        finish(s, r, AK_FINISH_ERROR, AK_ERR_SHUTDOWN, "the server is shutting down");
        pthread_mutex_lock(&s->mu);
        unref_locked(r);
        pthread_mutex_unlock(&s->mu);
    }
    for (ak_request *r = s->active; r; r = r->next) finish(s, r, AK_FINISH_LENGTH, 0, NULL);
    sweep(s);
}

static void *engine_main(void *arg) {
    ak_sched *s = arg;
    ak_flush_denormals();
    int idle = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (idle && !s->stopping && !s->incoming && !s->posts && !s->io_done)
            pthread_cond_wait(&s->engine_cv, &s->mu);
        ak_request *in = s->incoming;
        s->incoming = s->incoming_tail = NULL;
        post_item *posts = s->posts;
        s->posts = NULL;
        io_item *done = s->io_done;
        s->io_done = NULL;
        int stopping = s->stopping;
        /* cancellations (the client went away) */
        for (ak_request *r = s->active; r; r = r->next)
            if (r->cancelled && r->state != R_DONE) r->step_k = -1;
        pthread_mutex_unlock(&s->mu);
        ak_request **tail = &s->waiting;
        while (*tail) tail = &(*tail)->next;
        *tail = in;
        for (; in; in = in->next) s->n_waiting++;
        while (done) {
            io_item *nx = done->next;
            ak_agent_prefetch_done(s->cfg.agents, done->job);
            s->n_io--;
            free(done);
            done = nx;
        }
        while (posts) {
            post_item *nx = posts->next;
            posts->rc = posts->fn(posts->ctx, s->cfg.agents, s->ctx, &posts->err);
            pthread_mutex_lock(&s->mu);
            posts->done = 1;
            pthread_cond_broadcast(&s->out_cv);
            pthread_mutex_unlock(&s->mu);
            posts = nx;
        }
        if (stopping) break;
        for (ak_request *r = s->active; r; r = r->next)
            if (r->step_k == -1) { r->step_k = 0; finish(s, r, AK_FINISH_STOP, 0, NULL); }
        /* cancelled while queued */
        ak_request *prev = NULL;
        for (ak_request *r = s->waiting; r;) {
            ak_request *nx = r->next;
            pthread_mutex_lock(&s->mu);
            int c = r->cancelled;
            pthread_mutex_unlock(&s->mu);
            if (c) {
                unlink_waiting(s, r, prev);
                finish(s, r, AK_FINISH_STOP, 0, NULL);
                pthread_mutex_lock(&s->mu);
                unref_locked(r);
                pthread_mutex_unlock(&s->mu);
            } else {
                prev = r;
            }
            r = nx;
        }
        sweep(s);
        admit(s);
        prefetch(s);
        step(s);
        sweep(s);
        /* with nothing running, sleep unless this round freed an agent or
         * room that a waiting request may take */
        idle = s->n_active == 0 && !s->changed;
        s->changed = 0;
    }
    shutdown_requests(s);
    return NULL;
}

static void *io_main(void *arg) {
    ak_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->io_queue && !s->stopping) pthread_cond_wait(&s->io_cv, &s->mu);
        if (!s->io_queue) break;
        io_item *it = s->io_queue;
        s->io_queue = it->next;
        pthread_mutex_unlock(&s->mu);
        ak_restore_job_run(it->job);
        pthread_mutex_lock(&s->mu);
        it->next = s->io_done;
        s->io_done = it;
        pthread_cond_signal(&s->engine_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

ak_sched *ak_sched_start(const ak_sched_config *cfg, ak_error *err) {
    if (!cfg->model || !cfg->tok || !cfg->agents || !cfg->pool || cfg->n_ctx < 2) {
        ak_fail(err, "scheduler: model, tokenizer, agents, pool and a context are required");
        return NULL;
    }
    ak_sched *s = ak_calloc(1, sizeof *s, err);
    if (!s) return NULL;
    s->cfg = *cfg;
    if (s->cfg.max_active <= 0) s->cfg.max_active = 16;
    if (s->cfg.step_tokens <= 0) s->cfg.step_tokens = 256;
    if (s->cfg.step_ms < 0) s->cfg.step_ms = 0;
    if (s->cfg.step_tokens < s->cfg.max_active + 16) s->cfg.step_tokens = s->cfg.max_active + 16;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->engine_cv, NULL);
    pthread_cond_init(&s->out_cv, NULL);
    pthread_cond_init(&s->io_cv, NULL);
    int cap = s->cfg.step_tokens;
    s->b_tok = ak_malloc(sizeof(int32_t) * (size_t)cap, err);
    s->b_pos = ak_malloc(sizeof(int32_t) * (size_t)cap, err);
    s->b_seq = ak_malloc(sizeof(ak_kv *) * (size_t)cap, err);
    s->b_logits = ak_malloc(sizeof(float *) * (size_t)cap, err);
    if (!s->b_tok || !s->b_pos || !s->b_seq || !s->b_logits) goto fail;
    if (!(s->ctx = ak_ctx_new(cfg->model, cap, cfg->n_threads, err))) goto fail;
    ak_agents_set_threads(cfg->agents, ak_ctx_pool(s->ctx));   /* imports run between the engine's steps */
    if (pthread_create(&s->io, NULL, io_main, s) != 0) { ak_fail(err, "scheduler: cannot start the I/O thread"); goto fail; }
    s->io_started = 1;
    if (pthread_create(&s->engine, NULL, engine_main, s) != 0) { ak_fail(err, "scheduler: cannot start the engine"); goto fail; }
    s->engine_started = 1;
    return s;
fail:
    ak_sched_free(s);
    return NULL;
}

void ak_sched_shutdown(ak_sched *s) {
    if (!s || s->shut) return;
    s->shut = 1;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->engine_cv);
    pthread_cond_broadcast(&s->io_cv);
    pthread_mutex_unlock(&s->mu);
    if (s->engine_started) pthread_join(s->engine, NULL);
    if (s->io_started) pthread_join(s->io, NULL);
    /* restores that finished (or never started: their status says absent,
     * so nothing is installed) after the engine left */
    io_item *lists[2] = {s->io_queue, s->io_done};
    for (int i = 0; i < 2; i++)
        for (io_item *it = lists[i]; it;) {
            io_item *nx = it->next;
            ak_agent_prefetch_done(s->cfg.agents, it->job);
            free(it);
            it = nx;
        }
    s->io_queue = s->io_done = NULL;
}

void ak_sched_free(ak_sched *s) {
    if (!s) return;
    ak_sched_shutdown(s);
    if (s->ctx) ak_agents_set_threads(s->cfg.agents, NULL);
    ak_ctx_free(s->ctx);
    free(s->b_tok);
    free(s->b_pos);
    free(s->b_seq);
    free(s->b_logits);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->engine_cv);
    pthread_cond_destroy(&s->out_cv);
    pthread_cond_destroy(&s->io_cv);
    free(s);
}

int ak_sched_post(ak_sched *s, ak_sched_fn fn, void *ctx, ak_error *err) {
    post_item it = {.fn = fn, .ctx = ctx};
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return ak_failc(err, AK_ERR_SHUTDOWN, "the server is shutting down");
    }
    it.next = s->posts;
    s->posts = &it;
    pthread_cond_signal(&s->engine_cv);
    while (!it.done) pthread_cond_wait(&s->out_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    if (it.rc < 0 && err) *err = it.err;
    return it.rc;
}

const ak_sched_config *ak_sched_config_of(const ak_sched *s) { return &s->cfg; }

int ak_sched_agent_busy(const ak_sched *s, const char *id) { return agent_busy(s, id); }

int ak_sched_pool_job_active(const ak_sched *s, const char *id) { return pool_job_active(s, id); }

void ak_sched_counts(const ak_sched *s, int *n_active, int *n_waiting) {
    *n_active = s->n_active;
    *n_waiting = s->n_waiting;
}

/* ----------------------------------------------------------------- pools */

int ak_sched_pool_create(ak_sched *s, const ak_sched_pool_params *p, ak_pool_info *info, ak_error *err) {
    const char *id = p->id;
    int n = p->n;
    if (!id || !ak_pool_id_valid(id))
        return ak_failc(err, AK_ERR_INVALID, "invalid pool id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    if (n < 1) return ak_failc(err, AK_ERR_INVALID, "the pool is empty (no tokens)");
    if (n >= s->cfg.n_ctx)
        return ak_failc(err, AK_ERR_INVALID, "the pool has %d tokens; the context is %d, so no agent could add one", n,
                        s->cfg.n_ctx);
    ak_request *r = ak_calloc(1, sizeof *r, err);
    if (!r) return -1;
    r->s = s;
    r->refs = 2;
    r->pool_job = 1;
    snprintf(r->pool, sizeof r->pool, "%s", id);
    r->pfk = p->fk;
    r->pfv = p->fv;
    r->n_prompt = r->n_reserve = n;
    r->max_tokens = 1;
    r->res.prompt_tokens = n;
    if (!(r->prompt = ak_malloc(sizeof(int32_t) * (size_t)n, err))) goto fail;
    memcpy(r->prompt, p->tokens, sizeof(int32_t) * (size_t)n);
    if (p->source && !(r->source = strdup(p->source))) { ak_failc(err, AK_ERR_NOMEM, "out of memory"); goto fail; }
    if (enqueue(s, r, err) < 0) goto fail;
    ak_request_wait(r, (size_t)-1, -1);
    ak_req_result res;
    ak_request_read(r, 0, NULL, NULL, &res);
    ak_request_release(r);
    if (res.finish == AK_FINISH_ERROR) return ak_failc(err, res.code ? res.code : AK_ERR_GENERIC, "%s", res.error);
    return ak_sched_pool_get(s, id, info, err) < 0 ? -1 : 0;
fail:
    free_request(r);
    return -1;
}
