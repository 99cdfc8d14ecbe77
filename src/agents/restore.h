/* restore.h - restoring agents (restore.c) for the turn and card code
 * above it: an agent's file brought back into RAM on the engine's thread.
 * The prefetch (agent.h: ak_agent_prefetch, ak_restore_job) is restore.c's
 * too. Not a public header; on the core, pools and cards (agent_impl.h:
 * THE DIRECTION). */
#ifndef AK_AGENTS_RESTORE_H
#define AK_AGENTS_RESTORE_H

#include "agents/agent_impl.h"

/* Brings g's cache (g->kv: an empty sequence) into RAM from the store if
 * there is a usable file: a hit sets its history, base and tier (t: tier,
 * restore_ms, restore_bytes, shared; t->evicted counts the agents evicted
 * to make room); a miss leaves it empty and says why in the log. err only
 * for a failure to set the history. */
void agent_restore(ak_agents *a, agent *g, ak_turn *t, ak_error *err);

/* Brings agent g's cache into RAM (restoring it) if it is not; g->kv stays
 * NULL with err set if no sequence can be made. */
void agent_make_hot(ak_agents *a, agent *g, ak_error *err);

#endif
