/* lib_store.c - the public API's stores and agents (include/agentkv.h;
 * lib.h): a store is the agents layer's ak_agents with its block pool,
 * store backend and forward-pass context; an agent handle is an id. */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "lib/lib.h"
#include "engine/calib.h"
#include "kv/kvformat.h"

/* The centering sides a name asks for (NULL: keys). Returns 0, or -1. */
static int parse_center(const char *s, unsigned *out) {
    if (!s || !strcmp(s, "k")) *out = AK_CENTER_K;
    else if (!strcmp(s, "v")) *out = AK_CENTER_V;
    else if (!strcmp(s, "kv")) *out = AK_CENTER_K | AK_CENTER_V;
    else if (!strcmp(s, "none")) *out = 0;
    else return -1;
    return 0;
}

/* Opens the backend o names into *out (NULL when o names none). Returns 0,
 * or -1 with e set. */
static int open_backend(const agentkv_store_options *o, ak_store **out, ak_error *e) {
    *out = NULL;
    if (!o->url && !o->dir) return 0;
    uint8_t key[AK_STORE_KEY_BYTES];
    if (o->key_file && ak_store_read_key(o->key_file, key, e) < 0) return -1;
    ak_store_where w = {.url = o->url ? o->url : o->dir, .password_file = o->password_file,
                        .local_dir = o->url ? o->dir : NULL, .lease_ms = o->lease_ms, .log = o->log,
                        .log_ud = o->log_ud};
    *out = ak_store_open_at(&w, o->key_file ? key : NULL, e);
    sodium_memzero(key, sizeof key);
    return *out ? 0 : -1;
}

/* Installs the model's KV means in s's block pool when the sides asked
 * for gain from them, logging what it does. Returns 0, or -1 with e set. */
static int center(agentkv_store *s, unsigned sides, const agentkv_store_options *o, ak_error *e) {
    int k = (sides & AK_CENTER_K) && ak_kv_format_centers(s->fk);
    int v = (sides & AK_CENTER_V) && ak_kv_format_centers(s->fv);
    if (!k && !v) return 0;
    ak_logf(o->log, o->log_ud, "calibrating the model's %s means for centering", k && v ? "key and value" : k ? "key" : "value");
    double t0 = ak_now();
    if (ak_calib_install(s->ctx, s->m->tok, s->pool, s->fk, s->fv, sides, e) < 0) return -1;
    ak_logf(o->log, o->log_ud, "centering %s (%.1f s)", ak_block_pool_center_id(s->pool, k ? 0 : 1, k ? s->fk : s->fv),
            ak_now() - t0);
    return 0;
}

/* Checks o against model m and fills s's context and formats. Returns
 * AGENTKV_OK or AGENTKV_ERR_INVALID with err set; *sides gets the
 * centering asked for. */
static agentkv_status check_options(const agentkv_model *m, const agentkv_store_options *o, agentkv_store *s,
                                    unsigned *sides, agentkv_error *err) {
    const ak_cache_spec *sp = &m->model->spec;
    agentkv_status st;
    if ((st = ak_lib_format(o->cache_type_k, AK_KV_F16, "cache_type_k", &s->fk, err)) ||
        (st = ak_lib_format(o->cache_type_v, AK_KV_F16, "cache_type_v", &s->fv, err)))
        return st;
    if (!ak_kv_format_supports(s->fk, sp->head_dim_k))
        return ak_lib_failc(err, AGENTKV_ERR_INVALID, "KV format %s cannot store keys of head dim %d",
                            ak_kv_format_get(s->fk)->name, sp->head_dim_k);
    if (!ak_kv_format_supports(s->fv, sp->head_dim_v))
        return ak_lib_failc(err, AGENTKV_ERR_INVALID, "KV format %s cannot store values of head dim %d",
                            ak_kv_format_get(s->fv)->name, sp->head_dim_v);
    if (parse_center(o->center, sides) < 0)
        return ak_lib_failc(err, AGENTKV_ERR_INVALID, "center: '%s' is not k, v, kv or none", o->center);
    int train = m->model->cfg.n_ctx_train;
    s->n_ctx = o->n_ctx ? o->n_ctx : train < 4096 ? train : 4096;
    if (s->n_ctx <= 0) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "context size %d must be positive", s->n_ctx);
    if (sp->n_ctx > 0 && s->n_ctx > sp->n_ctx)
        return ak_lib_failc(err, AGENTKV_ERR_INVALID, "context size %d is longer than the model's %d", s->n_ctx,
                            sp->n_ctx);
    if (o->block_tokens < 0 || o->block_tokens > AK_KV_MAX_BLOCK_TOKENS || o->n_threads < 0 || o->max_batch < 0)
        return ak_lib_failc(err, AGENTKV_ERR_INVALID, "block_tokens, n_threads or max_batch out of range");
    return AGENTKV_OK;
}

/* Frees what s holds without saving (agentkv_store_close saves first). */
static void store_free(agentkv_store *s) {
    if (!s) return;
    ak_agents_free(s->agents);
    ak_ctx_free(s->ctx);
    ak_block_pool_free(s->pool);
    ak_store_close(s->store);
    free(s->logits);
    free(s);
}

AGENTKV_API agentkv_status agentkv_store_open(const agentkv_model *m, const agentkv_store_options *o,
                                              agentkv_store **out, agentkv_error *err) {
    static const agentkv_store_options defaults = {0};
    if (!o) o = &defaults;
    if (!m || !out) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_store_open: NULL model or out");
    *out = NULL;
    ak_error e = {{0}};
    agentkv_store *s = ak_calloc(1, sizeof *s, &e);
    if (!s) return ak_lib_fail(err, &e);
    s->m = m;
    unsigned sides = 0;
    agentkv_status st = check_options(m, o, s, &sides, err);
    if (st != AGENTKV_OK) {
        free(s);
        return st;
    }
    const ak_model *model = m->model;
    if (open_backend(o, &s->store, &e) < 0 ||
        !(s->pool = ak_block_pool_new(&model->spec, o->block_tokens, (size_t)o->kv_budget, &e)) ||
        !(s->ctx = ak_ctx_new(model, o->max_batch ? o->max_batch : 256, o->n_threads, &e)) ||
        center(s, sides, o, &e) < 0 ||
        !(s->logits = ak_malloc((size_t)model->cfg.vocab * sizeof(float), &e)))
        goto fail;
    ak_agents_config ac = {.model = model, .pool = s->pool, .store = s->store, .fk = s->fk, .fv = s->fv,
                           .n_ctx = s->n_ctx, .save = (ak_save_policy)o->save, .disk_budget = o->disk_budget,
                           .log = o->log, .log_ud = o->log_ud, .no_prefix_sharing = o->no_prefix_sharing};
    if (o->save != AGENTKV_SAVE_EVERY_TURN && o->save != AGENTKV_SAVE_ON_EVICT && o->save != AGENTKV_SAVE_ON_SHUTDOWN) {
        ak_failc(&e, AK_ERR_INVALID, "save: %d is not a save policy", (int)o->save);
        goto fail;
    }
    if (!(s->agents = ak_agents_new(&ac, &e))) goto fail;
    ak_agents_set_threads(s->agents, ak_ctx_pool(s->ctx));
    *out = s;
    return ak_lib_ok(err);
fail:
    store_free(s);
    return ak_lib_fail(err, &e);
}

AGENTKV_API agentkv_status agentkv_store_flush(agentkv_store *s, agentkv_error *err) {
    if (!s) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_store_flush: NULL store");
    ak_error e = {{0}};
    if (ak_agents_flush(s->agents, &e) < 0) return ak_lib_fail(err, &e);
    return ak_lib_ok(err);
}

AGENTKV_API agentkv_status agentkv_store_close(agentkv_store *s, agentkv_error *err) {
    if (!s) return ak_lib_ok(err);
    agentkv_status st = agentkv_store_flush(s, err);
    store_free(s);
    return st;
}

AGENTKV_API agentkv_status agentkv_agent_get(agentkv_store *s, const char *id, agentkv_agent **out,
                                             agentkv_error *err) {
    if (!s || !out) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_agent_get: NULL store or out");
    *out = NULL;
    if (!id || !ak_agent_id_valid(id))
        return ak_lib_failc(err, AGENTKV_ERR_INVALID, "invalid agent id '%s' (1-128 of [A-Za-z0-9_.-], not starting with '.')",
                            id ? id : "(null)");
    agentkv_agent *a = calloc(1, sizeof *a);
    if (!a) return ak_lib_failc(err, AGENTKV_ERR_NOMEM, "out of memory");
    a->s = s;
    snprintf(a->id, sizeof a->id, "%s", id);
    *out = a;
    return ak_lib_ok(err);
}

AGENTKV_API void agentkv_agent_release(agentkv_agent *a) { free(a); }

/* The public form of a listing's entry. */
static void info_of(const ak_agent_entry *e, int unsaved, agentkv_agent_info *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->id, sizeof out->id, "%s", e->id);
    out->n_tokens = e->n_tokens;
    out->tier = e->n_tokens == 0 ? AGENTKV_TIER_COLD : e->tier == AK_TIER_HOT ? AGENTKV_TIER_HOT : AGENTKV_TIER_WARM;
    out->bytes = e->bytes;
    out->unsaved = unsaved;
    snprintf(out->pool, sizeof out->pool, "%s", e->pool);
    snprintf(out->card, sizeof out->card, "%s", e->card);
}

/* 1 if agent id is known here and its history is not confirmed on disk. */
static int agent_unsaved(const agentkv_store *s, const char *id) {
    int i = ak_agents_find(s->agents, id);
    if (i < 0) return 0;
    ak_agent_info in;
    ak_agents_get(s->agents, i, &in);
    return in.dirty;
}

/* Every agent of s (known here, or only in the store) into *out, sorted
 * by id (malloc'd). Returns 0, or -1 with e set. */
static int listing(agentkv_store *s, ak_agent_entry **out, int *n, ak_error *e) {
    ak_store_entry *files = NULL;
    int n_files = 0;
    if (s->store && ak_store_list(s->store, &files, &n_files, e) < 0) return -1;
    int rc = ak_agents_listing(s->agents, &(ak_listing_opts){.files = files, .n_files = n_files}, out, n, NULL, e);
    free(files);
    return rc;
}

AGENTKV_API agentkv_status agentkv_store_list_agents(agentkv_store *s, agentkv_agent_info **out, int *n,
                                                     agentkv_error *err) {
    if (!s || !out || !n) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_store_list_agents: NULL argument");
    *out = NULL;
    *n = 0;
    ak_error e = {{0}};
    ak_agent_entry *v = NULL;
    int nv = 0;
    if (listing(s, &v, &nv, &e) < 0) return ak_lib_fail(err, &e);
    agentkv_agent_info *r = ak_calloc(nv ? (size_t)nv : 1, sizeof *r, &e);
    if (!r) {
        free(v);
        return ak_lib_fail(err, &e);
    }
    for (int i = 0; i < nv; i++) info_of(&v[i], agent_unsaved(s, v[i].id), &r[i]);
    free(v);
    *out = r;
    *n = nv;
    return ak_lib_ok(err);
}

AGENTKV_API agentkv_status agentkv_agent_get_info(agentkv_agent *a, agentkv_agent_info *out, agentkv_error *err) {
    if (!a || !out) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_agent_get_info: NULL argument");
    ak_error e = {{0}};
    ak_agent_entry *v = NULL;
    int nv = 0;
    if (listing(a->s, &v, &nv, &e) < 0) return ak_lib_fail(err, &e);
    memset(out, 0, sizeof *out);
    snprintf(out->id, sizeof out->id, "%s", a->id);
    out->tier = AGENTKV_TIER_COLD;
    for (int i = 0; i < nv; i++)
        if (!strcmp(v[i].id, a->id)) info_of(&v[i], agent_unsaved(a->s, a->id), out);
    free(v);
    return ak_lib_ok(err);
}

/* lib.h */
int ak_lib_restore(agentkv_agent *a, ak_error *e) {
    ak_agents *ag = a->s->agents;
    if (ak_agent_hot(ag, a->id)) return 0;
    ak_restore_job *job = NULL;
    int rc = ak_agent_prefetch(ag, a->id, 0, &job, e);
    if (rc <= 0) return rc;
    ak_restore_job_run(job);
    ak_agent_prefetch_done(ag, job);
    return 0;
}

AGENTKV_API agentkv_status agentkv_agent_tokens(agentkv_agent *a, int32_t **tokens, size_t *n, agentkv_error *err) {
    if (!a || !tokens || !n) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_agent_tokens: NULL argument");
    *tokens = NULL;
    *n = 0;
    ak_error e = {{0}};
    if (ak_lib_restore(a, &e) < 0) return ak_lib_fail(err, &e);
    int nh = 0;
    const int32_t *h = ak_agent_history(a->s->agents, a->id, &nh);
    if (!h || nh == 0) return ak_lib_ok(err);
    if (!(*tokens = ak_malloc((size_t)nh * sizeof **tokens, &e))) return ak_lib_fail(err, &e);
    memcpy(*tokens, h, (size_t)nh * sizeof **tokens);
    *n = (size_t)nh;
    return ak_lib_ok(err);
}

AGENTKV_API agentkv_status agentkv_agent_save(agentkv_agent *a, agentkv_error *err) {
    if (!a) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_agent_save: NULL agent");
    ak_error e = {{0}};
    if (ak_agent_save(a->s->agents, a->id, &e) < 0) return ak_lib_fail(err, &e);
    return ak_lib_ok(err);
}

AGENTKV_API agentkv_status agentkv_agent_evict(agentkv_agent *a, agentkv_error *err) {
    if (!a) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_agent_evict: NULL agent");
    ak_error e = {{0}};
    if (ak_agent_evict(a->s->agents, a->id, &e) < 0) return ak_lib_fail(err, &e);
    return ak_lib_ok(err);
}

AGENTKV_API agentkv_status agentkv_agent_delete(agentkv_agent *a, agentkv_error *err) {
    if (!a) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_agent_delete: NULL agent");
    ak_error e = {{0}};
    int rc = ak_agent_remove(a->s->agents, a->id, &e);
    if (rc < 0) return ak_lib_fail(err, &e);
    if (rc > 0) return ak_lib_failc(err, AGENTKV_ERR_NOT_FOUND, "agent %s: unknown", a->id);
    return ak_lib_ok(err);
}
