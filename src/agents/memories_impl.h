/* memories_impl.h - memories (memories.c) as the turn code above them
 * places them. A resident set of the registry (agent_impl.h: THE
 * DIRECTION). Not a public header. */
#ifndef AK_AGENTS_MEMORIES_IMPL_H
#define AK_AGENTS_MEMORIES_IMPL_H

#include "agents/agent_impl.h"

/* A memory's content, owned by the memory (valid while it is known). */
typedef struct {
    const int32_t *tokens;    /* its n tokens */
    int n;
    const char *hash;         /* its content hash */
} mem_content;

/* Memory id's blocks with their keys at positions [at, at + n), in formats
 * fk/fv (the memory's: its own vectors; others: converted, each vector
 * dequantized and quantized again): a sequence whose positions [0, n) hold
 * them, owned by the memory and shared by every placement at `at` in those
 * formats; its content into *out. NULL with err set (memories.h:
 * ak_memory_kv's errors). */
const ak_kv *mems_blocks_at(ak_agents *a, const char *id, int at, ak_kv_format fk, ak_kv_format fv, mem_content *out,
                            ak_error *err);

#endif
