/* memories.h - memory chunks: a text's KV computed once, alone, and placed
 * into any number of agents' turns (the AgentKVShift and CacheBlend papers).
 *
 * A memory is the KV cache of one chunk of text computed by itself:
 *   - tokenized on its own with no BOS and no EOS, special-token text not
 *     parsed (ak_memory_tokenize): the chunk goes in the middle of a
 *     conversation, where the prompt's own BOS (if any) is already behind
 *     it, and a user's text never turns into control tokens;
 *   - computed at positions [0, n) with nothing before it (no BOS: its
 *     first token is the first thing attention sees), one plain prefill;
 *   - stored in given K/V formats (default: the agents' formats).
 * Memories are content-addressed: the content hash is
 * ak_pool_content_hash(model fingerprint, cache spec, formats, token ids)
 * (the tokens are a function of the text), so the same text in the same
 * formats for the same model is computed once: a second id with the same
 * content shares the first one's blocks, and is loaded from its file
 * without a prefill. The id is the user's name for it (ids as agents').
 * With a store a memory is a file (store.h: MEMORIES), verified completely
 * before use; another model's file is refused (AK_ERR_STALE), a corrupt one
 * quarantined (AK_ERR_CORRUPT).
 *
 * In RAM a memory is an ordinary sequence of blocks (ak_kv, no base) at
 * positions [0, n). An agent's turn places it at position p
 * (ak_agent_place_memory, agent.h): the blocks with their keys rotated to
 * positions [p, p + n) (ak_model_shift_keys on a fork, so copied on write
 * once per position: every agent placing the memory at p shares that copy;
 * at p = 0 the memory's own blocks; a memory in other formats than the
 * agent's sequence is converted to them, once per position: an agent's
 * file holds one format), appended as one segment of the agent's
 * sequence (kvcache.h: SEGMENTS), read-only. An agent holding a memory's
 * blocks keeps them when the memory is removed (blocks are reference
 * counted); its file stores those positions as its own (store.h: an "own"
 * segment), so it restores without the memory.
 *
 * Every function runs on the agents' thread (the server's engine thread).
 */
#ifndef AK_MEMORIES_H
#define AK_MEMORIES_H

#include <stddef.h>
#include <stdint.h>

#include "agents/agent.h"
#include "engine/model.h"
#include "text/tokenizer.h"

/* The longest text a memory may be made from, in bytes (its tokens must
 * also be fewer than the context). */
#define AK_MEMORY_MAX_TEXT (1 << 20)

typedef struct {
    char id[AK_AGENT_ID_MAX + 1];
    char hash[17];            /* content hash */
    int n_tokens;
    ak_kv_format fk, fv;
    int resident;             /* its blocks are in RAM */
    size_t bytes;             /* RAM bytes of its blocks when resident */
    uint64_t file_bytes;      /* 0 without a store */
    int64_t created;          /* unix seconds (of its file, or of this run) */
    int sharers;              /* ids known in RAM holding the same content (itself included) */
} ak_memory_info;

/* The chunk's tokens as a memory holds them: text[0..len) tokenized with
 * no BOS/EOS added and special-token text kept as text. *ids malloc'd.
 * Returns 0, or -1 with err set (AK_ERR_INVALID: empty, longer than
 * AK_MEMORY_MAX_TEXT, no tokens). */
int ak_memory_tokenize(const ak_tokenizer *tok, const char *text, size_t len, int32_t **ids, int *n, ak_error *err);

/* A memory to add (ak_memory_add). */
typedef struct {
    const char *id;
    const char *text;         /* its text, kept with it */
    const int32_t *tokens;    /* ak_memory_tokenize of text: tokens[0..n) */
    int n;
    ak_kv_format fk, fv;      /* its K/V formats; (ak_kv_format)-1: the agents' */
} ak_memory_request;

/* Adds memory rq->id: the KV of its tokens computed alone at position 0
 * with c, in its formats, written to the store (if any) with the text.
 * When RAM or the store already holds the same content (hash), nothing is
 * computed: the blocks are shared (*computed = 0, else 1; may be NULL).
 * Re-adding an id with the same content is a no-op success. Returns 0, or
 * -1 with err set: AK_ERR_INVALID (bad id, empty, n >= the agents'
 * context, a format that cannot store the head dims), AK_ERR_EXISTS (the
 * id holds other content: remove it first), AK_ERR_KV_BUDGET, a store
 * error (nothing is added then). */
int ak_memory_add(ak_agents *a, ak_ctx *c, const ak_memory_request *rq, int *computed, ak_error *err);

/* Info about memory id and (text not NULL) its text (malloc'd), loading
 * nothing. Returns 0, or -1 with err set (AK_ERR_INVALID id,
 * AK_ERR_NOT_FOUND). */
int ak_memory_get(ak_agents *a, const char *id, ak_memory_info *out, char **text, ak_error *err);

/* Every memory (in RAM or in the store), sorted by id, into *out
 * (malloc'd). Returns 0, or -1 with err set. */
int ak_memories_list(ak_agents *a, ak_memory_info **out, int *n, ak_error *err);

/* Forgets memory id: its record, its file, and its blocks once nothing
 * else holds them (agents that placed it keep theirs). Returns 0, 1 if
 * unknown, -1 with err set. */
int ak_memory_remove(ak_agents *a, const char *id, ak_error *err);

/* The memory's tokens (*tokens malloc'd), loading it from the store if it is
 * not resident. Returns 0, or -1 with err set: AK_ERR_NOT_FOUND, AK_ERR_STALE
 * (another model), AK_ERR_CORRUPT (quarantined), AK_ERR_KV_BUDGET, ... */
int ak_memory_tokens(ak_agents *a, const char *id, int32_t **tokens, int *n, ak_error *err);

/* The memory's sequence at positions [0, n) (resident: loaded if need be;
 * valid until the memory is removed or the agents freed). NULL with err
 * set as ak_memory_tokens. */
const ak_kv *ak_memory_kv(ak_agents *a, const char *id, ak_error *err);

#endif
