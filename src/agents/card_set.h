/* card_set.h - the cards known this run (card_set.c): made here or loaded
 * from the store, immutable; the agent.h CARDS calls that only look them
 * up, list or remove them. A resident set of the registry (agent_impl.h);
 * making and importing cards is agent_cards.c's. Not a public header. */
#ifndef AK_AGENTS_CARD_SET_H
#define AK_AGENTS_CARD_SET_H

#include "agents/agent_impl.h"
#include "store/cards.h"

/* The card of id known this run, or NULL. */
const ak_card *cards_find(const ak_agents *a, const char *id);

/* Records c (taken over) as known this run. Returns 0, or -1 with err set
 * (c freed). */
int cards_add(ak_agents *a, ak_card *c, ak_error *err);

/* The card id, from RAM or loaded (verified completely) from the store, or
 * NULL with err set: AK_ERR_INVALID, AK_ERR_NOT_FOUND, AK_ERR_STALE,
 * AK_ERR_CORRUPT (quarantined), ... */
const ak_card *cards_resolve(ak_agents *a, const char *id, ak_error *err);

/* 1 if a card of id exists (in RAM or the store's index). */
int cards_exists(ak_agents *a, const char *id);

/* Makes the empty kv hold card c's blocks at positions [0, n_tokens) with
 * its keys as they are when they start at position `at` (cards.h:
 * ak_card_shift; deterministic). Copied on threads (NULL: here). Returns 0,
 * or -1 with err set. */
int cards_attach_at(const ak_agents *a, const ak_card *c, int at, ak_kv *kv, ak_threads *threads, ak_error *err);

#endif
