/* sched_ops.c - the scheduler's management operations (sched.h: agents,
 * gauges, pools, memories, cards). Each is a small function and the context
 * it reads and fills, run on the engine thread between two steps by
 * ak_sched_post while the caller waits; the public ak_sched_* functions wrap
 * them. Errors are ak_err_codes only (the server maps them to HTTP).
 */
#include "serve/sched_impl.h"
#include "store/cards.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- agents */

/* The store's files, listed by the caller (from the store's index, off the
 * engine thread: no file is read). */
typedef struct {
    ak_store_entry *files;
    int n;
} file_list;

/* Lists the store's files on the calling thread into *fl (nothing without
 * a store). Returns 0, or -1 with err set (*fl then empty). */
static int list_files(ak_sched *s, file_list *fl, ak_error *err) {
    ak_store_entry *files = NULL;
    int n = 0;
    ak_store *store = ak_sched_config_of(s)->store;
    if (store && ak_store_list(store, &files, &n, err) < 0) return -1;
    fl->files = files;
    fl->n = n;
    return 0;
}

/* ak_agents_listing's busy callback (ud: the scheduler). */
static int busy_of(void *ud, const char *id) { return ak_sched_agent_busy(ud, id); }

typedef struct {
    ak_sched *s;
    file_list fl;
    ak_sched_agent *list;     /* out, malloc'd */
    int n;
} list_agents_op;

/* Every agent, in RAM or only in the store's files, with its busy flag. */
static int op_list_agents(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    (void)engine;
    list_agents_op *o = ctx;
    ak_listing_opts lo = {.files = o->fl.files, .n_files = o->fl.n, .busy = busy_of, .ud = o->s};
    return ak_agents_listing(ag, &lo, &o->list, &o->n, NULL, err);
}

int ak_sched_list_agents(ak_sched *s, ak_sched_agent **out, int *n, ak_error *err) {
    list_agents_op o = {.s = s};
    if (list_files(s, &o.fl, err) < 0) return -1;
    int rc = ak_sched_post(s, op_list_agents, &o, err);
    free(o.fl.files);
    if (rc < 0) return -1;
    *out = o.list;
    *n = o.n;
    return 0;
}

typedef struct {
    const ak_sched *s;
    const char *id;
} agent_op;

/* Forgets agent id unless a request of it runs or waits: 0, 1 unknown,
 * 2 busy. */
static int op_remove_agent(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    (void)engine;
    agent_op *o = ctx;
    if (ak_sched_agent_busy(o->s, o->id)) return 2;
    return ak_agent_remove(ag, o->id, err);
}

int ak_sched_remove_agent(ak_sched *s, const char *id, ak_error *err) {
    agent_op o = {.s = s, .id = id};
    return ak_sched_post(s, op_remove_agent, &o, err);
}

typedef struct {
    const ak_sched *s;
    file_list fl;
    ak_metrics_gauges *g;     /* out */
} gauges_op;

/* The gauges of /metrics: the census of agents, the pool, the queues. */
static int op_gauges(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    (void)engine;
    gauges_op *o = ctx;
    ak_agents_census c;
    ak_listing_opts lo = {.files = o->fl.files, .n_files = o->fl.n};
    if (ak_agents_listing(ag, &lo, NULL, NULL, &c, err) < 0) return -1;
    int n_active, n_waiting;
    ak_sched_counts(o->s, &n_active, &n_waiting);
    ak_metrics_gauges_collect(o->g, ag, ak_sched_config_of(o->s)->pool, c.hot, c.warm, c.warm_bytes, n_active,
                              n_waiting);
    return 0;
}

void ak_sched_gauges(ak_sched *s, ak_metrics_gauges *g) {
    memset(g, 0, sizeof *g);
    gauges_op o = {.s = s, .g = g};
    ak_error err = {{0}};
    list_files(s, &o.fl, &err);   /* no files listed: warm gauges read 0 */
    ak_sched_post(s, op_gauges, &o, NULL);
    free(o.fl.files);
}

/* ----------------------------------------------------------------- pools */

/* An operation on pool id, or on all of them; what it gives back. */
typedef struct {
    const ak_sched *s;
    const char *id;
    ak_pool_info *info;       /* get: one (the caller's); list: n, malloc'd */
    int32_t *tokens;          /* tokens: malloc'd, n of them */
    char *source;             /* tokens: the pool's source, malloc'd (may be NULL) */
    int n;
} pool_op;

static int op_pool_get(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    (void)engine;
    pool_op *o = ctx;
    return ak_pool_get(ag, o->id, o->info, err);
}

static int op_pools_list(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    (void)engine;
    pool_op *o = ctx;
    return ak_pools_list(ag, &o->info, &o->n, err);
}

static int op_pool_tokens(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    (void)engine;
    pool_op *o = ctx;
    return ak_pool_tokens(ag, o->id, &o->tokens, &o->n, &o->source, err);
}

/* Removes the pool, refused while a pool job is making it. */
static int op_pool_remove(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    (void)engine;
    pool_op *o = ctx;
    if (ak_sched_pool_job_active(o->s, o->id)) return ak_failc(err, AK_ERR_BUSY, "pool '%s' is being created", o->id);
    return ak_pool_remove(ag, o->id, err);
}

int ak_sched_pool_get(ak_sched *s, const char *id, ak_pool_info *info, ak_error *err) {
    pool_op o = {.s = s, .id = id, .info = info};
    return ak_sched_post(s, op_pool_get, &o, err) < 0 ? -1 : 0;
}

int ak_sched_pools_list(ak_sched *s, ak_pool_info **out, int *n, ak_error *err) {
    pool_op o = {.s = s};
    if (ak_sched_post(s, op_pools_list, &o, err) < 0) return -1;
    *out = o.info;
    *n = o.n;
    return 0;
}

int ak_sched_pool_tokens(ak_sched *s, const char *id, int32_t **tokens, int *n, char **source, ak_error *err) {
    pool_op o = {.s = s, .id = id};
    if (ak_sched_post(s, op_pool_tokens, &o, err) < 0) return -1;
    *tokens = o.tokens;
    *n = o.n;
    *source = o.source;
    return 0;
}

int ak_sched_pool_remove(ak_sched *s, const char *id, ak_error *err) {
    pool_op o = {.s = s, .id = id};
    return ak_sched_post(s, op_pool_remove, &o, err);
}

/* -------------------------------------------------------------- memories */

typedef struct {
    const ak_tokenizer *tok;
    const char *id;
    const char *text;         /* add: the memory's text; never NULL */
    ak_kv_format fk, fv;      /* add */
    ak_memory_info *info;     /* add, get: one (the caller's); list: n, malloc'd */
    char **text_out;          /* get: its text, malloc'd (may be NULL: not wanted) */
    int32_t *tokens;          /* tokens: malloc'd, n of them */
    int n;
    int computed;             /* add: 1 computed now, 0 shared with known content */
} memory_op;

/* Tokenizes and adds the memory, prefilling it with the engine's context
 * (free between steps), and reads its info back. */
static int op_memory_add(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    memory_op *o = ctx;
    int32_t *ids = NULL;
    int n = 0;
    int rc = ak_memory_tokenize(o->tok, o->text, strlen(o->text), &ids, &n, err);
    if (rc == 0) rc = ak_memory_add(ag, engine, &(ak_memory_request){.id = o->id, .text = o->text, .tokens = ids,
                                    .n = n, .fk = o->fk, .fv = o->fv}, &o->computed, err);
    free(ids);
    if (rc == 0) rc = ak_memory_get(ag, o->id, o->info, NULL, err);
    return rc;
}

static int op_memory_get(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    (void)engine;
    memory_op *o = ctx;
    return ak_memory_get(ag, o->id, o->info, o->text_out, err);
}

static int op_memories_list(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    (void)engine;
    memory_op *o = ctx;
    return ak_memories_list(ag, &o->info, &o->n, err);
}

static int op_memory_tokens(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    (void)engine;
    memory_op *o = ctx;
    return ak_memory_tokens(ag, o->id, &o->tokens, &o->n, err);
}

static int op_memory_remove(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    (void)engine;
    memory_op *o = ctx;
    return ak_memory_remove(ag, o->id, err);
}

int ak_sched_memory_add(ak_sched *s, const char *id, const char *text, ak_kv_format fk, ak_kv_format fv,
                        ak_memory_info *info, int *computed, ak_error *err) {
    memory_op o = {.tok = ak_sched_config_of(s)->tok, .id = id, .text = text ? text : "", .fk = fk, .fv = fv,
                   .info = info};
    if (ak_sched_post(s, op_memory_add, &o, err) < 0) return -1;
    if (computed) *computed = o.computed;
    return 0;
}

int ak_sched_memory_get(ak_sched *s, const char *id, ak_memory_info *info, char **text, ak_error *err) {
    memory_op o = {.id = id, .info = info, .text_out = text};
    return ak_sched_post(s, op_memory_get, &o, err) < 0 ? -1 : 0;
}

int ak_sched_memories_list(ak_sched *s, ak_memory_info **out, int *n, ak_error *err) {
    memory_op o = {0};
    if (ak_sched_post(s, op_memories_list, &o, err) < 0) return -1;
    *out = o.info;
    *n = o.n;
    return 0;
}

int ak_sched_memory_tokens(ak_sched *s, const char *id, int32_t **tokens, int *n, ak_error *err) {
    memory_op o = {.id = id};
    if (ak_sched_post(s, op_memory_tokens, &o, err) < 0) return -1;
    *tokens = o.tokens;
    *n = o.n;
    return 0;
}

int ak_sched_memory_remove(ak_sched *s, const char *id, ak_error *err) {
    memory_op o = {.id = id};
    return ak_sched_post(s, op_memory_remove, &o, err);
}

/* ----------------------------------------------------------------- cards */

typedef struct {
    const ak_sched *s;
    const char *agent_id;     /* make, import: the agent touched */
    const char *card_id;      /* import, get, remove */
    const ak_card_request *rq;   /* make */
    ak_import_mode mode;      /* import */
    ak_sched_card *card;      /* make, get: the result (the caller's) */
    ak_store_card_entry *list;   /* list: n, malloc'd */
    int n;                    /* import: the agent's new length; list: entries */
} card_op;

/* Fills out from card c: its index entry (with the file's size when the
 * store has it) and its width histograms. */
static void card_out(const ak_sched *s, const ak_card *c, ak_sched_card *out) {
    memset(out, 0, sizeof *out);
    ak_store_card_entry fe;
    ak_store *store = ak_sched_config_of(s)->store;
    if (store && ak_store_lookup_card(store, c->id, &fe) == 0 && !strcmp(fe.hash, c->hash)) {
        out->e = fe;
        out->saved = 1;
    } else {
        ak_store_card_entry_of(c, &out->e);
    }
    for (int k = 0; k < AK_CARD_N_WIDTHS && k < 4; k++) {
        out->count_k[k] = c->count[0][k];
        out->count_v[k] = c->count[1][k];
    }
}

/* Refuses an operation on an agent with a request running or queued, as
 * DELETE of an agent is. Returns 0, or -1 with err set (AK_ERR_BUSY). */
static int agent_idle(const card_op *o, ak_error *err) {
    if (!ak_sched_agent_busy(o->s, o->agent_id)) return 0;
    return ak_failc(err, AK_ERR_BUSY, "agent %s has a request running or queued", o->agent_id);
}

/* Makes the card; its statistics pass runs on the engine's context. */
static int op_card_make(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    card_op *o = ctx;
    if (agent_idle(o, err) < 0) return -1;
    ak_card_request rq = *o->rq;
    rq.ctx = engine;
    char cid[AK_AGENT_ID_MAX + 1];
    const ak_card *c = NULL;
    int rc = ak_agent_make_card(ag, o->agent_id, &rq, cid, err);
    if (rc == 0 && !(c = ak_card_get(ag, cid, err))) rc = -1;
    if (c) card_out(o->s, c, o->card);
    return rc;
}

static int op_card_import(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    (void)engine;
    card_op *o = ctx;
    if (agent_idle(o, err) < 0) return -1;
    int rc = ak_agent_import_card_mode(ag, o->agent_id, o->card_id, o->mode, err);
    if (rc == 0) {
        ak_agent_info in;
        ak_agents_get(ag, ak_agents_find(ag, o->agent_id), &in);
        o->n = in.n_tokens;
    }
    return rc;
}

static int op_card_get(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    (void)engine;
    card_op *o = ctx;
    ak_card_wait_saved(ag, o->card_id);   /* its file's size, once written behind */
    const ak_card *c = ak_card_get(ag, o->card_id, err);
    if (!c) return -1;
    card_out(o->s, c, o->card);
    return 0;
}

static int op_cards_list(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    (void)engine;
    card_op *o = ctx;
    return ak_cards_list(ag, &o->list, &o->n, err);
}

static int op_card_remove(void *ctx, ak_agents *ag, ak_ctx *engine, ak_error *err) {
    (void)engine;
    card_op *o = ctx;
    return ak_card_remove(ag, o->card_id, err);
}

int ak_sched_card_make(ak_sched *s, const char *agent_id, const ak_card_request *rq, ak_sched_card *out,
                       ak_error *err) {
    card_op o = {.s = s, .agent_id = agent_id, .rq = rq, .card = out};
    return ak_sched_post(s, op_card_make, &o, err) < 0 ? -1 : 0;
}

int ak_sched_card_import(ak_sched *s, const char *id, const char *card_id, ak_import_mode mode, int *n_tokens,
                         ak_error *err) {
    card_op o = {.s = s, .agent_id = id, .card_id = card_id, .mode = mode};
    if (ak_sched_post(s, op_card_import, &o, err) < 0) return -1;
    *n_tokens = o.n;
    return 0;
}

int ak_sched_card_get(ak_sched *s, const char *card_id, ak_sched_card *out, ak_error *err) {
    card_op o = {.s = s, .card_id = card_id, .card = out};
    return ak_sched_post(s, op_card_get, &o, err) < 0 ? -1 : 0;
}

int ak_sched_cards_list(ak_sched *s, ak_store_card_entry **out, int *n, ak_error *err) {
    card_op o = {.s = s};
    if (ak_sched_post(s, op_cards_list, &o, err) < 0) return -1;
    *out = o.list;
    *n = o.n;
    return 0;
}

int ak_sched_card_remove(ak_sched *s, const char *card_id, ak_error *err) {
    card_op o = {.s = s, .card_id = card_id};
    return ak_sched_post(s, op_card_remove, &o, err);
}

int ak_sched_card_file(ak_sched *s, const char *card_id, char **bytes, size_t *len, ak_error *err) {
    if (!card_id || !ak_agent_id_valid(card_id)) return ak_failc(err, AK_ERR_INVALID, "invalid card id");
    ak_store *store = ak_sched_config_of(s)->store;
    if (!store) return ak_failc(err, AK_ERR_NOT_FOUND, "card %s has no file (no memory directory)", card_id);
    ak_card_wait_saved(ak_sched_config_of(s)->agents, card_id);   /* a card just made is written behind */
    return ak_store_card_bytes(store, card_id, bytes, len, err);   /* the directory's or Redis's */
}
