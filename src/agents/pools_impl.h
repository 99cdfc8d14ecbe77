/* pools_impl.h - pools (pools.c) as the restore and turn code above them
 * see them: the record of a pool known this run. A resident set of the
 * registry (agent_impl.h: THE DIRECTION). Not a public header. */
#ifndef AK_AGENTS_POOLS_IMPL_H
#define AK_AGENTS_POOLS_IMPL_H

#include "agents/agent_impl.h"

/* A pool as this process knows it. */
typedef struct pool_rec {
    char id[AK_AGENT_ID_MAX + 1];
    char hash[17];              /* content hash ("" while building) */
    int32_t *tokens;            /* (n) */
    int n;
    ak_kv_format fk, fv;
    ak_kv *kv;                  /* NULL unless resident */
    char *source;               /* what it was made from (JSON), or NULL */
    int64_t created;
    uint64_t file_bytes;
    int building;               /* ak_pool_begin called, not yet committed */
} pool_rec;

/* The pool id known this run (resident or not, built or building), or
 * NULL. */
pool_rec *pools_find(const ak_agents *a, const char *id);

/* The pool, resident (loaded from the store if need be), or NULL with err
 * set (AK_ERR_NOT_FOUND, AK_ERR_STALE, AK_ERR_CORRUPT, ...). */
pool_rec *pools_resolve(ak_agents *a, const char *id, ak_error *err);

#endif
