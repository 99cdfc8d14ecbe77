/* ids.h - the ids that name agents, pools, memories and cards.
 *
 * One rule for all of them, checked by every layer that takes an id from
 * outside (the CLI, the HTTP API, the agents, the store): an id is 1 to
 * AK_AGENT_ID_MAX characters of [A-Za-z0-9_.-] and does not start with
 * '.'. Such an id can only name a file inside the store's directory (no
 * '/', never "." or ".."), a Redis key without escaping, and never a
 * temporary or hidden file of the store (those start with '.'); an
 * ephemeral agent's name is '.' followed by a valid id (agents/agent.c).
 */
#ifndef AK_IDS_H
#define AK_IDS_H

/* The longest id, in characters (a buffer holds AK_AGENT_ID_MAX + 1). */
#define AK_AGENT_ID_MAX 128

/* 1 if id matches [A-Za-z0-9_.-]{1,128} and does not start with '.', else 0
 * (NULL is 0). Such an id can only name a file inside the store's
 * directory. */
int ak_agent_id_valid(const char *id);

#endif
