/* memories.c - memory chunks (memories.h): records, content addressing,
 * persistence through the store (store_memory.c) and the position-shifted
 * copies that placements share.
 *
 * A record (mem_rec) is one id; its content (mem_body: tokens, formats,
 * hash, the resident sequence at position 0 and the shifted copies) is
 * shared by every record of the same content hash, reference counted, so
 * the same text is computed (or loaded) once however many ids name it.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agents/agent_impl.h"
#include "agents/memories.h"
#include "agents/memories_impl.h"

/* Shifted copies kept per content: the positions a memory is placed at
 * most recently (a system prompt is usually one length for many agents). */
#define MEM_SHIFTS 4

typedef struct mem_body {
    char hash[17];
    int32_t *tokens;            /* (n) */
    int n;
    ak_kv_format fk, fv;
    ak_kv *kv;                  /* positions [0, n) at position 0; NULL unless resident */
    ak_kv *shift[MEM_SHIFTS];   /* the same tokens with their keys rotated to start at shift_at[i], in
                                   formats shift_fk/fv[i] (the memory's: the same blocks, copied
                                   where the keys were rewritten; others: converted) */
    int shift_at[MEM_SHIFTS];
    ak_kv_format shift_fk[MEM_SHIFTS], shift_fv[MEM_SHIFTS];
    int shift_next;             /* the slot the next new position replaces */
    int refs;                   /* records naming it */
    int pinned;                 /* in use by mems_blocks_at: not evicted meanwhile */
} mem_body;

typedef struct mem_rec {
    char id[AK_AGENT_ID_MAX + 1];
    mem_body *body;             /* NULL until used or made this run */
    char *text;                 /* malloc'd, or NULL (then the store's entry has it) */
    int64_t created;
    uint64_t file_bytes;
} mem_rec;

int ak_memory_tokenize(const ak_tokenizer *tok, const char *text, size_t len, int32_t **ids, int *n, ak_error *err) {
    *ids = NULL;
    *n = 0;
    if (!text || len == 0) return ak_failc(err, AK_ERR_INVALID, "memory: empty text");
    if (len > AK_MEMORY_MAX_TEXT)
        return ak_failc(err, AK_ERR_INVALID, "memory: text of %zu bytes is longer than %d", len, AK_MEMORY_MAX_TEXT);
    size_t k = 0;
    /* flags 0: no BOS/EOS (the chunk sits mid-prompt), control-token text stays text */
    if (ak_tokenize(tok, text, len, 0, ids, &k, err) < 0) return -1;
    if (k == 0) {
        free(*ids);
        *ids = NULL;
        return ak_failc(err, AK_ERR_INVALID, "memory: the text has no tokens");
    }
    *n = (int)k;
    return 0;
}

static void body_unref(ak_agents *a, mem_body *b) {
    (void)a;
    if (!b || --b->refs > 0) return;
    for (int i = 0; i < MEM_SHIFTS; i++) ak_kv_free(b->shift[i]);
    ak_kv_free(b->kv);
    free(b->tokens);
    free(b);
}

static void rec_free(ak_agents *a, mem_rec *r) {
    if (!r) return;
    body_unref(a, r->body);
    free(r->text);
    free(r);
}

/* Frees every memory record (the registry's resident set hook). */
static void mems_free_all(ak_agents *a) {
    for (int i = 0; i < a->n_mems; i++) rec_free(a, a->mems[i]);
    free(a->mems);
    a->mems = NULL;
    a->n_mems = a->cap_mems = 0;
}

static mem_rec *rec_find(const ak_agents *a, const char *id) {
    for (int i = 0; i < a->n_mems; i++)
        if (!strcmp(a->mems[i]->id, id)) return a->mems[i];
    return NULL;
}

/* A resident body of content hash, or NULL. */
static mem_body *body_find(const ak_agents *a, const char *hash) {
    for (int i = 0; i < a->n_mems; i++) {
        mem_body *b = a->mems[i]->body;
        if (b && b->kv && !strcmp(b->hash, hash)) return b;
    }
    return NULL;
}

/* Drops from RAM one shifted copy whose blocks no agent holds, else one
 * idle memory the store can give back (its file reloads it on use);
 * returns 1, or 0 if there is none (the registry's resident set hook). */
static int mems_evict_one(ak_agents *a) {
    /* first a shifted copy whose blocks no agent holds any more, then a
     * whole memory the store can give back */
    for (int i = 0; i < a->n_mems; i++) {
        mem_body *b = a->mems[i]->body;
        for (int k = 0; b && !b->pinned && k < MEM_SHIFTS; k++)
            if (b->shift[k] && ak_kv_private_bytes(b->shift[k]) > 0) {
                ak_kv_free(b->shift[k]);
                b->shift[k] = NULL;
                return 1;
            }
    }
    if (!a->cfg.store) return 0;
    for (int i = 0; i < a->n_mems; i++) {
        mem_body *b = a->mems[i]->body;
        if (!b || b->pinned || !b->kv || ak_kv_private_bytes(b->kv) == 0) continue;
        for (int k = 0; k < MEM_SHIFTS; k++) {
            ak_kv_free(b->shift[k]);
            b->shift[k] = NULL;
        }
        ak_kv_free(b->kv);
        b->kv = NULL;
        logf_(a, "memory %s: dropped from RAM (its file stays)", a->mems[i]->id);
        return 1;
    }
    return 0;
}

static const ak_resident_ops mem_set = {.evict_one = mems_evict_one, .free_all = mems_free_all};

/* Takes r into the list. Returns 0, or -1 with err set. */
static int rec_add(ak_agents *a, mem_rec *r, ak_error *err) {
    agents_resident_register(a, AK_RESIDENT_MEMORIES, &mem_set);
    if (a->n_mems == a->cap_mems) {
        int nc = a->cap_mems ? 2 * a->cap_mems : 4;
        mem_rec **nv = realloc(a->mems, sizeof *nv * (size_t)nc);
        if (!nv) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
        a->mems = nv;
        a->cap_mems = nc;
    }
    a->mems[a->n_mems++] = r;
    return 0;
}

static ak_err_code status_code(ak_store_status st) {
    switch (st) {
    case AK_STORE_ABSENT: return AK_ERR_NOT_FOUND;
    case AK_STORE_STALE: return AK_ERR_STALE;
    case AK_STORE_CORRUPT: return AK_ERR_CORRUPT;
    default: return AK_ERR_IO;
    }
}

/* Bytes n positions take in formats fk/fv. */
static size_t bytes_of(const ak_agents *a, int n, ak_kv_format fk, ak_kv_format fv) {
    int T = ak_block_pool_block_tokens(a->cfg.pool);
    return (size_t)((n + T - 1) / T) * ak_block_pool_block_bytes(a->cfg.pool, fk, fv);
}

/* Loads memory id's file into a new body (or finds a resident one of the
 * same content: shared). Returns it with one reference for the caller, or
 * NULL with err set. */
static mem_body *body_load(ak_agents *a, const char *id, const ak_store_pool_entry *e, ak_error *err) {
    mem_body *same = body_find(a, e->pool_hash);
    if (same && same->fk == e->e.fk && same->fv == e->e.fv) {
        same->refs++;
        return same;
    }
    if (agents_ensure_room(a, bytes_of(a, e->e.n_tokens, e->e.fk, e->e.fv), NULL, err) < 0) return NULL;
    mem_body *b = ak_calloc(1, sizeof *b, err);
    if (!b) return NULL;
    b->refs = 1;
    b->fk = e->e.fk;
    b->fv = e->e.fv;
    if (!(b->kv = ak_kv_new(a->cfg.pool, b->fk, b->fv, a->cfg.n_ctx, err))) {
        body_unref(a, b);
        return NULL;
    }
    ak_kv_set_window_release(b->kv, 0);   /* shared whole (see ak_memory_add) */
    ak_error le = {{0}};
    const ak_store_load_args la = {.id = id, .fingerprint = a->cfg.model->fingerprint,
                                   .vocab = a->cfg.model->cfg.vocab, .kv = b->kv};
    ak_store_status st = ak_store_load_memory(a->cfg.store, &la, &b->tokens, &b->n, b->hash, &le);
    if (st != AK_STORE_HIT) {
        body_unref(a, b);
        int code = st == AK_STORE_ERROR && le.code ? le.code : (int)status_code(st);
        if (st == AK_STORE_ABSENT) ak_failc(err, code, "memory %s does not exist", id);
        else if (st == AK_STORE_STALE) ak_failc(err, code, "memory %s cannot be used (made with another model?): %s", id, le.msg);
        else ak_failc(err, code, "memory %s: %s", id, le.msg);
        return NULL;
    }
    logf_(a, "memory %s: loaded (%d tokens, %s/%s)", id, b->n, ak_kv_format_get(b->fk)->name,
          ak_kv_format_get(b->fv)->name);
    return b;
}

/* The record of id with its body resident, loading it from the store if
 * need be; NULL with err set. */
static mem_rec *rec_resolve(ak_agents *a, const char *id, ak_error *err) {
    if (!id || !ak_agent_id_valid(id)) {
        ak_failc(err, AK_ERR_INVALID, "invalid memory id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
        return NULL;
    }
    mem_rec *r = rec_find(a, id);
    if (r && r->body && r->body->kv) return r;
    ak_store_pool_entry e;
    if (!a->cfg.store || ak_store_lookup_memory(a->cfg.store, id, &e) != 0) {
        ak_failc(err, AK_ERR_NOT_FOUND, "memory %s does not exist", id);
        return NULL;
    }
    if (r && r->body) {   /* evicted: this record lets go of the empty body, the load shares or reloads */
        body_unref(a, r->body);
        r->body = NULL;
    }
    mem_body *b = body_load(a, id, &e, err);
    int fresh = !r;
    if (b && fresh) {
        r = ak_calloc(1, sizeof *r, err);
        if (r) {
            snprintf(r->id, sizeof r->id, "%s", id);
            r->created = e.e.created;
            r->file_bytes = e.e.bytes;
            if (rec_add(a, r, err) < 0) {
                free(r);
                r = NULL;
            }
        }
    }
    free(e.source);
    if (!b || !r) {
        body_unref(a, b);
        return NULL;
    }
    r->body = b;
    return r;
}

int ak_memory_add(ak_agents *a, ak_ctx *c, const ak_memory_request *rq, int *computed, ak_error *err) {
    const char *id = rq->id, *text = rq->text;
    const int32_t *tokens = rq->tokens;
    int n = rq->n;
    ak_kv_format fk = rq->fk, fv = rq->fv;
    if (computed) *computed = 0;
    if (!id || !ak_agent_id_valid(id))
        return ak_failc(err, AK_ERR_INVALID, "invalid memory id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    if (n < 1 || !tokens) return ak_failc(err, AK_ERR_INVALID, "memory %s: no tokens", id);
    if (n >= a->cfg.n_ctx)
        return ak_failc(err, AK_ERR_INVALID, "memory %s: %d tokens do not fit the context of %d (the turn needs room "
                        "for its own)", id, n, a->cfg.n_ctx);
    if ((int)fk < 0) fk = a->cfg.fk;   /* the agents' formats */
    if ((int)fv < 0) fv = a->cfg.fv;
    char hash[17];
    ak_pool_content_hash(a->cfg.model->fingerprint, ak_block_pool_spec(a->cfg.pool), fk, fv, tokens, n, hash);
    /* the id: free, or already this content (idempotent) */
    mem_rec *old = rec_find(a, id);
    ak_store_pool_entry e;
    int on_disk = a->cfg.store && ak_store_lookup_memory(a->cfg.store, id, &e) == 0;
    const char *old_hash = old && old->body ? old->body->hash : on_disk ? e.pool_hash : NULL;
    if (old_hash) {
        int same = !strcmp(old_hash, hash);
        if (on_disk) free(e.source);
        if (same) return 0;
        return ak_failc(err, AK_ERR_EXISTS, "memory %s exists with other contents (delete it first)", id);
    }
    if (on_disk) free(e.source);
    /* the content: resident, on disk under another id, or computed now */
    mem_body *b = body_find(a, hash);
    if (b) b->refs++;
    if (!b && a->cfg.store) {
        ak_store_pool_entry *v = NULL;
        int nv = 0;
        if (ak_store_list_memories(a->cfg.store, &v, &nv, err) < 0) return -1;
        for (int i = 0; i < nv && !b; i++) {
            if (strcmp(v[i].pool_hash, hash)) continue;
            ak_error le = {{0}};
            b = body_load(a, v[i].e.id, &v[i], &le);   /* a failed load: computed instead */
            if (!b) logf_(a, "memory %s: could not share %s's file: %s", id, v[i].e.id, le.msg);
        }
        ak_store_pool_entries_free(v, nv);
    }
    if (!b) {
        if (!(b = ak_calloc(1, sizeof *b, err))) return -1;
        b->refs = 1;
        b->fk = fk;
        b->fv = fv;
        b->n = n;
        snprintf(b->hash, sizeof b->hash, "%s", hash);
        if (!(b->tokens = malloc(sizeof(int32_t) * (size_t)n))) {
            body_unref(a, b);
            return ak_failc(err, AK_ERR_NOMEM, "out of memory");
        }
        memcpy(b->tokens, tokens, sizeof(int32_t) * (size_t)n);
        /* a memory's sliding-window layers keep every block (kvcache.h
         * LAYER GROUPS): placed anywhere, every position of it is seen by
         * the tokens that follow it; its copies (forks, shifts) inherit it */
        if ((b->kv = ak_kv_new(a->cfg.pool, fk, fv, a->cfg.n_ctx, err))) ak_kv_set_window_release(b->kv, 0);
        if (!b->kv ||
            agents_ensure_room(a, bytes_of(a, n, fk, fv), NULL, err) < 0 ||
            ak_eval(c, b->kv, &(ak_eval_args){.tokens = tokens, .n = n}, err) < 0) {
            body_unref(a, b);
            return -1;
        }
        if (computed) *computed = 1;
    }
    mem_rec *r = ak_calloc(1, sizeof *r, err);
    if (!r) {
        body_unref(a, b);
        return -1;
    }
    snprintf(r->id, sizeof r->id, "%s", id);
    r->body = b;
    r->created = (int64_t)time(NULL);
    if (text && !(r->text = strdup(text))) {
        rec_free(a, r);
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    if (a->cfg.store) {
        if (ak_store_save_memory(a->cfg.store, &(ak_store_save_args){.id = id, .kv = b->kv, .tokens = b->tokens,
                                 .n_tokens = b->n, .source = text, .fingerprint = a->cfg.model->fingerprint,
                                 .model_name = a->cfg.model->cfg.name}, err) < 0) {
            rec_free(a, r);
            return -1;
        }
        if (ak_store_lookup_memory(a->cfg.store, id, &e) == 0) {
            r->file_bytes = e.e.bytes;
            free(e.source);
        }
    }
    if (rec_add(a, r, err) < 0) {
        if (a->cfg.store) ak_store_remove_memory(a->cfg.store, id, NULL);
        rec_free(a, r);
        return -1;
    }
    logf_(a, "memory %s: %s (%d tokens, %s/%s, content %s)", id, computed && *computed ? "computed" : "shared", b->n,
          ak_kv_format_get(b->fk)->name, ak_kv_format_get(b->fv)->name, b->hash);
    return 0;
}

/* The number of records in RAM whose resident body is b. */
static int sharers_of(const ak_agents *a, const mem_body *b) {
    int k = 0;
    for (int i = 0; i < a->n_mems; i++) k += a->mems[i]->body == b;
    return k;
}

/* Info of record r (its store entry e, if any, for what r lacks). */
static void info_of(const ak_agents *a, const mem_rec *r, const ak_store_pool_entry *e, ak_memory_info *out) {
    memset(out, 0, sizeof *out);
    if (r) {
        snprintf(out->id, sizeof out->id, "%s", r->id);
        out->created = r->created;
        out->file_bytes = r->file_bytes;
    }
    if (e) {
        snprintf(out->id, sizeof out->id, "%s", e->e.id);
        snprintf(out->hash, sizeof out->hash, "%s", e->pool_hash);
        out->n_tokens = e->e.n_tokens;
        out->fk = e->e.fk;
        out->fv = e->e.fv;
        out->file_bytes = e->e.bytes;
        out->created = e->e.created;
    }
    if (r && r->body) {
        const mem_body *b = r->body;
        snprintf(out->hash, sizeof out->hash, "%s", b->hash);
        out->n_tokens = b->n;
        out->fk = b->fk;
        out->fv = b->fv;
        out->resident = b->kv != NULL;
        out->bytes = b->kv ? ak_kv_bytes(b->kv) : 0;
        out->sharers = sharers_of(a, b);
    }
}

int ak_memory_get(ak_agents *a, const char *id, ak_memory_info *out, char **text, ak_error *err) {
    if (text) *text = NULL;
    if (!id || !ak_agent_id_valid(id)) return ak_failc(err, AK_ERR_INVALID, "invalid memory id");
    mem_rec *r = rec_find(a, id);
    ak_store_pool_entry e;
    int on_disk = a->cfg.store && ak_store_lookup_memory(a->cfg.store, id, &e) == 0;
    if (!r && !on_disk) return ak_failc(err, AK_ERR_NOT_FOUND, "memory %s does not exist", id);
    info_of(a, r, on_disk ? &e : NULL, out);
    int rc = 0;
    if (text) {
        const char *t = r && r->text ? r->text : on_disk && e.source ? e.source : "";
        if (!(*text = strdup(t))) rc = ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    if (on_disk) free(e.source);
    return rc;
}

static int cmp_info(const void *x, const void *y) {
    return strcmp(((const ak_memory_info *)x)->id, ((const ak_memory_info *)y)->id);
}

int ak_memories_list(ak_agents *a, ak_memory_info **out, int *n, ak_error *err) {
    ak_store_pool_entry *v = NULL;
    int nv = 0;
    if (a->cfg.store && ak_store_list_memories(a->cfg.store, &v, &nv, err) < 0) return -1;
    ak_memory_info *w = calloc((size_t)(nv + a->n_mems + 1), sizeof *w);
    if (!w) {
        ak_store_pool_entries_free(v, nv);
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    int k = 0;
    for (int i = 0; i < nv; i++) info_of(a, rec_find(a, v[i].e.id), &v[i], &w[k++]);
    for (int i = 0; i < a->n_mems; i++) {
        int have = 0;
        for (int j = 0; j < nv && !have; j++) have = !strcmp(v[j].e.id, a->mems[i]->id);
        if (!have) info_of(a, a->mems[i], NULL, &w[k++]);
    }
    ak_store_pool_entries_free(v, nv);
    qsort(w, (size_t)k, sizeof *w, cmp_info);
    *out = w;
    *n = k;
    return 0;
}

int ak_memory_remove(ak_agents *a, const char *id, ak_error *err) {
    if (!id || !ak_agent_id_valid(id)) return ak_failc(err, AK_ERR_INVALID, "invalid memory id");
    int found = 0;
    for (int i = 0; i < a->n_mems; i++)
        if (!strcmp(a->mems[i]->id, id)) {
            rec_free(a, a->mems[i]);   /* blocks placed in agents stay theirs (reference counts) */
            a->mems[i] = a->mems[--a->n_mems];
            found = 1;
            break;
        }
    if (a->cfg.store) {
        int rc = ak_store_remove_memory(a->cfg.store, id, err);
        if (rc < 0) return -1;
        if (rc == 0) found = 1;
    }
    if (found) logf_(a, "memory %s: removed", id);
    return found ? 0 : 1;
}

int ak_memory_tokens(ak_agents *a, const char *id, int32_t **tokens, int *n, ak_error *err) {
    *tokens = NULL;
    *n = 0;
    mem_rec *r = rec_resolve(a, id, err);
    if (!r) return -1;
    if (!(*tokens = malloc(sizeof(int32_t) * (size_t)r->body->n))) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    memcpy(*tokens, r->body->tokens, sizeof(int32_t) * (size_t)r->body->n);
    *n = r->body->n;
    return 0;
}

const ak_kv *ak_memory_kv(ak_agents *a, const char *id, ak_error *err) {
    mem_rec *r = rec_resolve(a, id, err);
    return r ? r->body->kv : NULL;
}

/* A copy of b's positions in formats fk/fv (each vector dequantized and
 * quantized again), or NULL with err set. */
static ak_kv *convert(ak_agents *a, const mem_body *b, ak_kv_format fk, ak_kv_format fv, ak_error *err) {
    const ak_cache_spec *sp = ak_block_pool_spec(a->cfg.pool);
    ak_kv *kv = ak_kv_new(a->cfg.pool, fk, fv, a->cfg.n_ctx, err);
    if (kv) ak_kv_set_window_release(kv, 0);   /* shared whole, as the memory */
    float *k = kv ? ak_malloc(sizeof(float) * (size_t)sp->n_head_kv * (size_t)(sp->head_dim_k + sp->head_dim_v), err)
                  : NULL;
    int rc = k && ak_kv_prepare(kv, 0, b->n, err) == 0 ? 0 : -1;
    float *v = k ? k + (size_t)sp->n_head_kv * (size_t)sp->head_dim_k : NULL;
    for (int l = 0; rc == 0 && l < sp->n_layer; l++)
        for (int p = 0; rc == 0 && p < b->n; p++) {
            rc = ak_kv_read(b->kv, l, p, k, v, err);
            if (rc == 0) rc = ak_kv_write(kv, l, p, k, v, err);
        }
    free(k);
    if (rc < 0) {
        ak_kv_free(kv);
        return NULL;
    }
    return kv;
}

const ak_kv *mems_blocks_at(ak_agents *a, const char *id, int at, ak_kv_format fk, ak_kv_format fv, mem_content *out,
                            ak_error *err) {
    mem_rec *r = rec_resolve(a, id, err);
    if (!r) return NULL;
    mem_body *b = r->body;
    *out = (mem_content){.tokens = b->tokens, .n = b->n, .hash = b->hash};
    int same = fk == b->fk && fv == b->fv;
    if (at == 0 && same) return b->kv;
    for (int i = 0; i < MEM_SHIFTS; i++)
        if (b->shift[i] && b->shift_at[i] == at && b->shift_fk[i] == fk && b->shift_fv[i] == fv) return b->shift[i];
    /* same formats: a fork shares every block, and the shift copies each one
     * it rewrites (copy-on-write), so the memory's own blocks stay at
     * position 0; other formats: a converted copy (an agent's file holds
     * one format: a sequence must not mix them) */
    b->pinned++;   /* making room must not drop the memory being placed */
    int room = agents_ensure_room(a, same ? ak_kv_bytes(b->kv) : bytes_of(a, b->n, fk, fv), NULL, err);
    b->pinned--;
    if (room < 0) return NULL;
    ak_kv *s = same ? ak_kv_fork(b->kv, err) : convert(a, b, fk, fv, err);
    if (!s) return NULL;
    if (at != 0 && ak_model_shift_keys(a->cfg.model, s, 0, b->n, at, err) < 0) {
        ak_kv_free(s);
        return NULL;
    }
    int k = b->shift_next;
    b->shift_next = (k + 1) % MEM_SHIFTS;
    ak_kv_free(b->shift[k]);   /* agents holding its blocks keep them */
    b->shift[k] = s;
    b->shift_at[k] = at;
    b->shift_fk[k] = fk;
    b->shift_fv[k] = fv;
    return s;
}
