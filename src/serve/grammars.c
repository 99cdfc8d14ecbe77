/* grammars.c - see grammars.h
 *
 * Locks: c->mu guards the list, every entry's refs, state and tick, the
 * cache's refs and its statistics; c->cv wakes callers waiting for a build.
 * A build runs without the lock, its entry marked BUILDING. */
#include "serve/grammars.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "text/jsonschema.h"
#include "text/toolgrammar.h"

typedef enum { E_BUILDING, E_READY } estate;

struct ak_grammar_ref {
    ak_grammars *c;
    struct ak_grammar_ref *next;
    ak_grammar_kind kind;
    char *text;
    size_t len;
    estate state;
    int refs;                 /* the cache's (while listed) and each holder's */
    int listed;               /* in c->head */
    uint64_t tick;            /* last use */
    size_t bytes;
    ak_grammar *g;
    ak_tokmask *tm;
};

struct ak_grammars {
    const ak_tokenizer *tok;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ak_vocab_index *v;        /* built on first use, under mu */
    ak_grammar_ref *head;
    int n, max_entries;
    size_t bytes, max_bytes;
    uint64_t tick;
    int refs;                 /* the owner's (until ak_grammars_free) and one per entry alive */
    ak_grammars_stats st;
};

ak_grammars *ak_grammars_new(const ak_tokenizer *tok, int max_entries, size_t max_bytes, ak_error *err) {
    ak_grammars *c = ak_calloc(1, sizeof *c, err);
    if (!c) return NULL;
    c->tok = tok;
    c->max_entries = max_entries > 0 ? max_entries : AK_GRAMMARS_DEFAULT_ENTRIES;
    c->max_bytes = max_bytes ? max_bytes : AK_GRAMMARS_DEFAULT_BYTES;
    c->refs = 1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    return c;
}

/* Frees the cache once nothing refers to it; call with c->mu held (it is
 * released either way). */
static void cache_unref_unlock(ak_grammars *c) {
    int last = --c->refs == 0;
    pthread_mutex_unlock(&c->mu);
    if (!last) return;
    ak_vocab_index_free(c->v);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

/* Frees entry e (refs 0, not listed); call with c->mu held, which stays held. */
static void entry_free_locked(ak_grammar_ref *e) {
    ak_tokmask_free(e->tm);
    ak_grammar_free(e->g);
    free(e->text);
    free(e);
}

/* Takes e off the list (dropping the list's reference); with c->mu held.
 * Returns 1 when e is to be freed (no holder left). */
static int unlist_locked(ak_grammars *c, ak_grammar_ref *e) {
    for (ak_grammar_ref **p = &c->head; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            break;
        }
    e->listed = 0;
    c->n--;
    if (e->state == E_READY) c->bytes -= e->bytes;
    return --e->refs == 0;
}

/* Drops a reference to e; with c->mu held (released on return). */
static void release_unlock(ak_grammar_ref *e) {
    ak_grammars *c = e->c;
    if (--e->refs > 0) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    entry_free_locked(e);
    cache_unref_unlock(c);
}

void ak_grammars_free(ak_grammars *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    /* an entry being built is unlisted too: its builder keeps its reference */
    ak_grammar_ref *e = c->head, *next;
    for (; e; e = next) {
        next = e->next;
        if (unlist_locked(c, e)) {
            entry_free_locked(e);
            c->refs--;   /* never the last: the owner's is still counted */
        }
    }
    cache_unref_unlock(c);
}

/* Drops least recently used ready entries until the limits hold; with c->mu held. */
static void evict_locked(ak_grammars *c) {
    while (c->n > c->max_entries || c->bytes > c->max_bytes) {
        ak_grammar_ref *lru = NULL;
        for (ak_grammar_ref *e = c->head; e; e = e->next)
            if (e->state == E_READY && (!lru || e->tick < lru->tick)) lru = e;
        if (!lru) return;
        c->st.evictions++;
        if (unlist_locked(c, lru)) {
            entry_free_locked(lru);
            c->refs--;   /* the owner's keeps it above 0 */
        }
    }
}

/* Compiles e's grammar and masks over v (no lock held). Returns 0, or -1 with err set. */
static int build(ak_grammar_ref *e, const ak_vocab_index *v, ak_gram_error *err) {
    e->g = e->kind == AK_GRAMMAR_JSON_OBJECT ? ak_json_object_grammar(NULL, err)
           : e->kind == AK_GRAMMAR_TOOL_CALLS ? ak_toolg_compile(e->text, e->len, err)
                                              : ak_jsonschema_compile(e->text, e->len, NULL, err);
    if (!e->g) return -1;
    if (!(e->tm = ak_tokmask_new(e->g, v, err))) return -1;
    int ns, ng;
    ak_tokmask_stats(e->tm, &ns, &ng, &e->bytes);
    return 0;
}

/* The listed entry of (kind, text), or NULL; with c->mu held. */
static ak_grammar_ref *find_locked(ak_grammars *c, ak_grammar_kind kind, const char *text, size_t len) {
    for (ak_grammar_ref *e = c->head; e; e = e->next)
        if (e->kind == kind && e->len == len && !memcmp(e->text, text, len)) return e;
    return NULL;
}

int ak_grammars_get(ak_grammars *c, ak_grammar_kind kind, const char *text, size_t len, ak_grammar_ref **out,
                    ak_gram_error *err) {
    *out = NULL;
    if (kind == AK_GRAMMAR_JSON_OBJECT) len = 0;
    pthread_mutex_lock(&c->mu);
    if (!c->v && !(c->v = ak_vocab_index_new(c->tok, err))) {
        pthread_mutex_unlock(&c->mu);
        return -1;
    }
    ak_grammar_ref *e;
    while ((e = find_locked(c, kind, text, len)) && e->state == E_BUILDING) pthread_cond_wait(&c->cv, &c->mu);
    if (e) {
        e->refs++;
        e->tick = ++c->tick;
        c->st.hits++;
        pthread_mutex_unlock(&c->mu);
        *out = e;
        return 0;
    }
    e = calloc(1, sizeof *e);
    if (e) e->text = malloc(len + 1);
    if (!e || !e->text) {
        free(e);
        pthread_mutex_unlock(&c->mu);
        return ak_gram_fail(err, AK_GRAM_E_NOMEM, NULL, NULL, "out of memory");
    }
    memcpy(e->text, text, len);
    e->text[len] = 0;
    *e = (ak_grammar_ref){.c = c, .next = c->head, .kind = kind, .text = e->text, .len = len, .state = E_BUILDING,
                          .refs = 2, .listed = 1};
    c->head = e;
    c->n++;
    c->refs++;
    const ak_vocab_index *v = c->v;
    pthread_mutex_unlock(&c->mu);
    int rc = build(e, v, err);
    pthread_mutex_lock(&c->mu);
    pthread_cond_broadcast(&c->cv);
    if (rc < 0) {
        /* not kept: waiters find nothing and build it themselves (and fail alike) */
        if (e->listed) unlist_locked(c, e);
        release_unlock(e);
        return -1;
    }
    e->state = E_READY;
    e->tick = ++c->tick;
    c->st.builds++;
    if (e->listed) {   /* else the cache was freed meanwhile: the caller's reference alone */
        c->bytes += e->bytes;
        evict_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
    *out = e;
    return 0;
}

void ak_grammar_ref_hold(ak_grammar_ref *r) {
    pthread_mutex_lock(&r->c->mu);
    r->refs++;
    pthread_mutex_unlock(&r->c->mu);
}

void ak_grammar_ref_release(ak_grammar_ref *r) {
    if (!r) return;
    pthread_mutex_lock(&r->c->mu);
    release_unlock(r);
}

const ak_grammar *ak_grammar_ref_grammar(const ak_grammar_ref *r) { return r->g; }
const ak_tokmask *ak_grammar_ref_masks(const ak_grammar_ref *r) { return r->tm; }
const ak_vocab_index *ak_grammar_ref_vocab(const ak_grammar_ref *r) { return r->c->v; }

void ak_grammars_get_stats(ak_grammars *c, ak_grammars_stats *st) {
    pthread_mutex_lock(&c->mu);
    *st = c->st;
    st->entries = c->n;
    st->bytes = c->bytes;
    pthread_mutex_unlock(&c->mu);
}
