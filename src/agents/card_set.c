/* card_set.c - the cards known this run (card_set.h): found, added,
 * loaded from the store, listed and removed; a card's blocks attached at a
 * position. Made and imported by agent_cards.c.
 */
#include <stdlib.h>
#include <string.h>

#include "agents/card_set.h"

/* Frees the cards known this run (the registry's resident set hook). */
static void cards_free_all(ak_agents *a) {
    for (int i = 0; i < a->n_cards; i++) ak_card_free(a->cards[i]);
    free(a->cards);
}

/* Cards are never dropped to make room: a card's blocks live in the agents
 * that imported it. */
static const ak_resident_ops card_set = {.evict_one = NULL, .free_all = cards_free_all};

/* Makes the empty kv hold card c's blocks at positions [0, n_tokens) with
 * its keys as they are when they start at position `at`: the card's own
 * when at is its offset, else those of the card moved there (cards.h:
 * ak_card_shift; deterministic, so a restore rebuilds the same bits).
 * Copied on threads (NULL: here). Returns 0, or -1 with err set. */
int cards_attach_at(const ak_agents *a, const ak_card *c, int at, ak_kv *kv, ak_threads *threads, ak_error *err) {
    if (c->pos_offset == at) return ak_card_attach_on(c, kv, threads, err);
    ak_card *s = ak_card_shift(c, a->cfg.model, at, err);
    if (!s) return -1;
    int rc = ak_card_attach_on(s, kv, threads, err);
    ak_card_free(s);
    return rc;
}

/* The card of id known this run, or NULL. */
const ak_card *cards_find(const ak_agents *a, const char *id) {
    for (int i = 0; i < a->n_cards; i++)
        if (!strcmp(a->cards[i]->id, id)) return a->cards[i];
    return NULL;
}

/* Records c (taken over) as known this run. Returns 0, or -1 with err set
 * (c freed). */
int cards_add(ak_agents *a, ak_card *c, ak_error *err) {
    agents_resident_register(a, AK_RESIDENT_CARDS, &card_set);
    if (a->n_cards == a->cap_cards) {
        int nc = a->cap_cards ? a->cap_cards * 2 : 8;
        ak_card **v = realloc(a->cards, sizeof *v * (size_t)nc);
        if (!v) {
            ak_card_free(c);
            return ak_failc(err, AK_ERR_NOMEM, "out of memory");
        }
        a->cards = v;
        a->cap_cards = nc;
    }
    a->cards[a->n_cards++] = c;
    return 0;
}

/* The card id, from RAM or loaded (verified completely) from the store,
 * or NULL with err set: AK_ERR_NOT_FOUND, AK_ERR_STALE, AK_ERR_CORRUPT
 * (quarantined), ... */
const ak_card *cards_resolve(ak_agents *a, const char *id, ak_error *err) {
    if (!id || !ak_agent_id_valid(id)) {
        ak_failc(err, AK_ERR_INVALID, "invalid card id");
        return NULL;
    }
    const ak_card *c = cards_find(a, id);
    if (c) return c;
    if (!a->cfg.store) {
        ak_failc(err, AK_ERR_NOT_FOUND, "no card %s", id);
        return NULL;
    }
    ak_card *lc = NULL;
    ak_store_status st = ak_store_load_card(a->cfg.store, id, a->cfg.model->fingerprint, &a->cfg.model->spec,
                                            a->cfg.model->cfg.vocab, &lc, err);
    if (st != AK_STORE_HIT) return NULL;   /* err says why, with its code */
    if (cards_add(a, lc, err) < 0) return NULL;
    return lc;
}

const ak_card *ak_card_get(ak_agents *a, const char *card_id, ak_error *err) { return cards_resolve(a, card_id, err); }

void ak_card_wait_saved(ak_agents *a, const char *card_id) { saves_wait(a->saves, card_id); }

/* 1 if a card of id exists (in RAM or the store's index). */
int cards_exists(ak_agents *a, const char *id) {
    ak_store_card_entry e;
    return cards_find(a, id) || (a->cfg.store && ak_store_lookup_card(a->cfg.store, id, &e) == 0);
}

static int cmp_card_entry(const void *x, const void *y) {
    return strcmp(((const ak_store_card_entry *)x)->id, ((const ak_store_card_entry *)y)->id);
}

int ak_cards_list(ak_agents *a, ak_store_card_entry **out, int *n, ak_error *err) {
    ak_store_card_entry *v = NULL;
    int k = 0;
    if (a->cfg.store && ak_store_list_cards(a->cfg.store, &v, &k, err) < 0) return -1;
    ak_store_card_entry *w = realloc(v, sizeof *w * (size_t)(k + a->n_cards + 1));
    if (!w) {
        free(v);
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    v = w;
    int k0 = k;
    for (int i = 0; i < a->n_cards; i++) {
        const ak_card *c = a->cards[i];
        int have = 0;
        for (int j = 0; j < k0 && !have; j++) have = !strcmp(v[j].id, c->id);
        if (have) continue;
        ak_store_card_entry_of(c, &v[k++]);
    }
    qsort(v, (size_t)k, sizeof *v, cmp_card_entry);
    *out = v;
    *n = k;
    return 0;
}

/* 1 if one of g's segments is card card_id. */
static int holds_card(const agent *g, const char *card_id) {
    for (int k = 0; k < g->n_segs; k++)
        if (g->segs[k].kind == AK_SEG_CARD && !strcmp(g->segs[k].id, card_id)) return 1;
    return 0;
}

int ak_card_remove(ak_agents *a, const char *card_id, ak_error *err) {
    if (!card_id || !ak_agent_id_valid(card_id)) return ak_failc(err, AK_ERR_INVALID, "invalid card id");
    saves_drain(a->saves);
    /* its holders: agents in RAM, then agent files that record it */
    char names[8 * (AK_AGENT_ID_MAX + 2) + 8] = "";
    int held = 0;
    for (int i = 0; i < a->n; i++)
        if (holds_card(a->v[i], card_id) && (a->v[i]->kv || a->v[i]->n)) {
            if (held++ < 8) snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", held > 1 ? ", " : "", a->v[i]->id);
        }
    const ak_card *c = cards_find(a, card_id);
    ak_store_card_entry ce;
    const char *hash = c ? c->hash : NULL;
    if (!hash && a->cfg.store && ak_store_lookup_card(a->cfg.store, card_id, &ce) == 0) hash = ce.hash;
    if (a->cfg.store && hash) {
        ak_store_entry *es = NULL;
        int ne = 0;
        if (ak_store_list(a->cfg.store, &es, &ne, err) < 0) return -1;
        for (int i = 0; i < ne; i++) {
            int uses = 0;
            for (int k = 0; k < es[i].base.n_seg; k++)
                uses |= es[i].base.seg[k].kind == AK_SEG_CARD && !strcmp(es[i].base.seg[k].id, card_id) &&
                        !strcmp(es[i].base.seg[k].hash, hash);
            if (!uses) continue;
            agent *g = agents_find(a, es[i].id);
            if (g && (g->kv || g->n) && !holds_card(g, card_id)) continue;   /* its file is older than what it holds */
            if (g && holds_card(g, card_id)) continue;   /* counted above */
            if (held++ < 8) snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", held > 1 ? ", " : "", es[i].id);
        }
        free(es);
    }
    if (held)
        return ak_failc(err, AK_ERR_BUSY, "card %s is held by %d agent%s: %s%s", card_id, held, held > 1 ? "s" : "", names,
                        held > 8 ? ", ..." : "");
    saves_wait(a->saves, card_id);   /* its write, if queued, holds the card; and its file is then there to remove */
    int found = 0;
    for (int i = 0; i < a->n_cards; i++)
        if (!strcmp(a->cards[i]->id, card_id)) {
            ak_card_free(a->cards[i]);
            a->cards[i] = a->cards[--a->n_cards];
            found = 1;
            break;
        }
    if (a->cfg.store) {
        int r = ak_store_remove_card(a->cfg.store, card_id, err);
        if (r < 0) return -1;
        if (r == 0) found = 1;
    }
    return found ? 0 : 1;
}
