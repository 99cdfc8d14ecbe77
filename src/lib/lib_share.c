/* lib_share.c - the public API's pools, cards and memories
 * (include/agentkv.h; lib.h): what one agent computes and others share. */
#include <stdlib.h>
#include <string.h>

#include "lib/lib.h"
#include "agents/memories.h"

/* The public result of an internal removal: 0 removed, 1 unknown, -1 e. */
static agentkv_status removed(int rc, const char *what, const char *id, const ak_error *e, agentkv_error *err) {
    if (rc < 0) return ak_lib_fail(err, e);
    if (rc > 0) return ak_lib_failc(err, AGENTKV_ERR_NOT_FOUND, "%s %s: unknown", what, id);
    return ak_lib_ok(err);
}

AGENTKV_API agentkv_status agentkv_pool_create(agentkv_store *s, const agentkv_pool_options *o, agentkv_error *err) {
    if (!s || !o || !o->id || (!o->tokens && o->n_tokens))
        return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_pool_create: NULL argument");
    if (o->n_tokens > INT32_MAX) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "a pool of %zu tokens", o->n_tokens);
    ak_pool_request rq = {.id = o->id, .tokens = o->tokens, .n = (int)o->n_tokens, .source = o->source};
    agentkv_status st;
    if ((st = ak_lib_format(o->cache_type_k, AK_KV_Q8, "cache_type_k", &rq.fk, err)) ||
        (st = ak_lib_format(o->cache_type_v, AK_KV_TQ3, "cache_type_v", &rq.fv, err)))
        return st;
    ak_error e = {{0}};
    if (ak_pool_create(s->agents, s->ctx, &rq, NULL, NULL, &e) < 0) return ak_lib_fail(err, &e);
    return ak_lib_ok(err);
}

AGENTKV_API agentkv_status agentkv_pool_tokens(agentkv_store *s, const char *id, int32_t **tokens, size_t *n,
                                               agentkv_error *err) {
    if (!s || !id || !tokens || !n) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_pool_tokens: NULL argument");
    ak_error e = {{0}};
    int32_t *t = NULL;
    char *source = NULL;
    int nt = 0;
    if (ak_pool_tokens(s->agents, id, &t, &nt, &source, &e) < 0) return ak_lib_fail(err, &e);
    free(source);
    *tokens = t;   /* malloc'd: agentkv_free frees it */
    *n = (size_t)nt;
    return ak_lib_ok(err);
}

AGENTKV_API agentkv_status agentkv_pool_attach(agentkv_agent *a, const char *pool_id, agentkv_error *err) {
    if (!a || !pool_id) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_pool_attach: NULL argument");
    int32_t *t = NULL;
    size_t n = 0;
    agentkv_status st = agentkv_pool_tokens(a->s, pool_id, &t, &n, err);
    if (st != AGENTKV_OK) return st;
    st = agentkv_agent_turn(a, &(agentkv_turn_options){.tokens = t, .n_tokens = n, .pool_id = pool_id}, NULL, err);
    free(t);
    return st;
}

AGENTKV_API agentkv_status agentkv_pool_delete(agentkv_store *s, const char *id, agentkv_error *err) {
    if (!s || !id) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_pool_delete: NULL argument");
    ak_error e = {{0}};
    return removed(ak_pool_remove(s->agents, id, &e), "pool", id, &e, err);
}

AGENTKV_API agentkv_status agentkv_card_make(agentkv_agent *a, const agentkv_card_options *o,
                                             char card_id[AGENTKV_ID_MAX + 1], agentkv_error *err) {
    static const agentkv_card_options defaults = {0};
    if (!o) o = &defaults;
    if (!a || !card_id) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_card_make: NULL argument");
    card_id[0] = 0;
    if (o->bits_k < 0 || o->bits_v < 0) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "negative bits");
    /* 16 bits everywhere is the card without a budget: every token whole */
    int whole = o->bits_k == 0 || (o->bits_k == 16 && (o->bits_v == 0 || o->bits_v == 16));
    ak_card_request rq = {.card_id = o->card_id, .from = o->from, .to = o->to,
                          .policy = o->policy ? o->policy : "uniform", .budget_k = whole ? 0 : o->bits_k,
                          .budget_v = whole ? 0 : o->bits_v, .ctx = a->s->ctx};
    ak_error e = {{0}};
    if (ak_lib_restore(a, &e) < 0 || ak_agent_make_card(a->s->agents, a->id, &rq, card_id, &e) < 0)
        return ak_lib_fail(err, &e);
    return ak_lib_ok(err);
}

AGENTKV_API agentkv_status agentkv_card_import(agentkv_agent *a, const char *card_id, int append, agentkv_error *err) {
    if (!a || !card_id) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_card_import: NULL argument");
    ak_error e = {{0}};
    if (ak_agent_import_card_mode(a->s->agents, a->id, card_id, append ? AK_IMPORT_APPEND : AK_IMPORT_REPLACE, &e) < 0)
        return ak_lib_fail(err, &e);
    return ak_lib_ok(err);
}

AGENTKV_API agentkv_status agentkv_card_delete(agentkv_store *s, const char *card_id, agentkv_error *err) {
    if (!s || !card_id) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_card_delete: NULL argument");
    ak_error e = {{0}};
    return removed(ak_card_remove(s->agents, card_id, &e), "card", card_id, &e, err);
}

AGENTKV_API agentkv_status agentkv_memory_add(agentkv_store *s, const agentkv_memory_options *o, int *computed,
                                              agentkv_error *err) {
    if (!s || !o || !o->id || !o->text) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_memory_add: NULL argument");
    ak_memory_request rq = {.id = o->id, .text = o->text};
    agentkv_status st;
    if ((st = ak_lib_format(o->cache_type_k, (ak_kv_format)-1, "cache_type_k", &rq.fk, err)) ||
        (st = ak_lib_format(o->cache_type_v, (ak_kv_format)-1, "cache_type_v", &rq.fv, err)))
        return st;
    ak_error e = {{0}};
    int32_t *ids = NULL;
    if (ak_memory_tokenize(s->m->tok, o->text, strlen(o->text), &ids, &rq.n, &e) < 0) return ak_lib_fail(err, &e);
    rq.tokens = ids;
    int rc = ak_memory_add(s->agents, s->ctx, &rq, computed, &e);
    free(ids);
    if (rc < 0) return ak_lib_fail(err, &e);
    return ak_lib_ok(err);
}

AGENTKV_API agentkv_status agentkv_memory_delete(agentkv_store *s, const char *id, agentkv_error *err) {
    if (!s || !id) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_memory_delete: NULL argument");
    ak_error e = {{0}};
    return removed(ak_memory_remove(s->agents, id, &e), "memory", id, &e, err);
}

AGENTKV_API void agentkv_prompt_free(agentkv_prompt *p) {
    if (!p) return;
    free(p->tokens);
    for (int i = 0; i < p->n_memories; i++) free((char *)p->memories[i].id);
    free(p->memories);
    memset(p, 0, sizeof *p);
}

/* Appends tokens[0..n) to out's tokens. Returns 0, or -1 with e set. */
static int append_tokens(agentkv_prompt *out, const int32_t *tokens, size_t n, ak_error *e) {
    int32_t *t = realloc(out->tokens, (out->n_tokens + n + 1) * sizeof *t);
    if (!t) return ak_failc(e, AK_ERR_NOMEM, "out of memory");
    out->tokens = t;
    if (n) memcpy(t + out->n_tokens, tokens, n * sizeof *t);
    out->n_tokens += n;
    return 0;
}

/* Appends memory id's tokens to out with a reference at their position.
 * Returns 0, or -1 with e set (the memory's lookup errors, AK_ERR_NOMEM). */
static int append_memory(agentkv_store *s, agentkv_prompt *out, const char *id, ak_error *e) {
    int32_t *mt = NULL;
    int mn = 0;
    if (ak_memory_tokens(s->agents, id, &mt, &mn, e) < 0) return -1;
    agentkv_memory_ref *r = realloc(out->memories, (size_t)(out->n_memories + 1) * sizeof *r);
    char *copy = strdup(id);
    if (r) out->memories = r;
    if (!r || !copy || out->n_tokens > INT32_MAX) {
        free(copy);
        free(mt);
        return ak_failc(e, AK_ERR_NOMEM, "out of memory");
    }
    out->memories[out->n_memories++] = (agentkv_memory_ref){.id = copy, .at = (int)out->n_tokens};
    int rc = append_tokens(out, mt, (size_t)mn, e);
    free(mt);
    return rc;
}

AGENTKV_API agentkv_status agentkv_memory_compose(agentkv_store *s, const agentkv_part *parts, int n,
                                                  agentkv_prompt *out, agentkv_error *err) {
    if (!s || !out || n < 0 || (n && !parts))
        return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_memory_compose: NULL argument");
    memset(out, 0, sizeof *out);
    ak_error e = {{0}};
    for (int i = 0; i < n; i++) {
        const agentkv_part *pt = &parts[i];
        int rc;
        if (!pt->memory_id == !(pt->tokens && pt->n_tokens))
            rc = ak_failc(&e, AK_ERR_INVALID, "part %d: give either tokens or a memory id", i);
        else
            rc = pt->memory_id ? append_memory(s, out, pt->memory_id, &e) : append_tokens(out, pt->tokens, pt->n_tokens, &e);
        if (rc < 0) {
            agentkv_prompt_free(out);
            return ak_lib_fail(err, &e);
        }
    }
    return ak_lib_ok(err);
}
