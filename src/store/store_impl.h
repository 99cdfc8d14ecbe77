/* store_impl.h - internals shared by the store's files (not an API):
 * store.c (open, the index, listing, gc, quarantine), store_codec.c (the
 * image format) and store_snapshot.c (its writer), store_save.c,
 * store_load.c, the backends (store_dir.c, store_backend.h), store_pool.c,
 * store_memory.c, store_card.c and store_seal.c (the seal below).
 *
 * A sealed file (see docs/agent-file-format.md) is
 *     plain header   56 bytes:
 *         0  "AKVSEAL1"            magic
 *         8  u32 LE version        2
 *         12 u32 LE chunk_bytes    plaintext bytes per chunk (4 KiB .. 16 MiB)
 *         16 u64 LE plain_bytes    size of the sealed safetensors image
 *         24 8 bytes key id        BLAKE2b-64 keyed by the key, of "agentkv key id v1"
 *         32 24 bytes              crypto_secretstream_xchacha20poly1305 header
 *     chunks         ceil(plain_bytes / chunk_bytes) of them, each the next
 *                    chunk_bytes (the last: the rest) of the image pushed
 *                    through the secretstream with additional data the first
 *                    32 header bytes followed by the agent id (its bytes, no
 *                    terminator; a pool's: "pools/<id>"), so 17 bytes longer;
 *                    the last carries TAG_FINAL, every other TAG_MESSAGE.
 * The id in the additional data binds the file to its agent: the file of one
 * agent copied or renamed to another's name (or into pools/) fails
 * authentication in its first chunk. Version 1 (additional data: the 32 header bytes only) is no
 * longer read (STALE: the agent recomputes and is re-saved as version 2).
 */
#ifndef AK_STORE_IMPL_H
#define AK_STORE_IMPL_H

#include <limits.h>
#include <stdio.h>
#include <pthread.h>
#include <sodium.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store.h"
#include "store/store_backend.h"

#define AK_SEAL_MAGIC "AKVSEAL1"
#define AK_SEAL_VERSION 2u
#define AK_SEAL_AD_BYTES 32            /* the header bytes in the additional data */
#define AK_SEAL_ID_MAX 160             /* the file's binding after them: an agent id
                                          (<= 128) or "pools/" and a pool id */
#define AK_SEAL_HEADER_BYTES (AK_SEAL_AD_BYTES + crypto_secretstream_xchacha20poly1305_HEADERBYTES)
#define AK_SEAL_ABYTES crypto_secretstream_xchacha20poly1305_ABYTES
#define AK_SEAL_CHUNK (64u * 1024)
#define AK_SEAL_MIN_CHUNK 4096u
#define AK_SEAL_MAX_CHUNK (16u * 1024 * 1024)

typedef struct {
    uint32_t version;
    uint32_t chunk;
    uint64_t plain_bytes;
    uint8_t key_id[8];
} ak_seal_info;

typedef struct {
    crypto_secretstream_xchacha20poly1305_state st;
    uint8_t ad[AK_SEAL_AD_BYTES + AK_SEAL_ID_MAX];   /* header bytes, agent id */
    size_t ad_len;
    uint32_t chunk;
    uint64_t plain_bytes;
    uint64_t done;      /* plaintext bytes pushed or pulled so far */
} ak_seal;

/* Calls sodium_init once (thread-safe). Returns 0, or -1 if libsodium cannot
 * start. */
int ak_seal_init(void);
/* The 8-byte public identifier of a key (a keyed hash: reveals nothing). */
void ak_seal_key_id(const uint8_t key[32], uint8_t id[8]);
/* Size of the sealed file for an image of plain_bytes in chunks of chunk
 * bytes; 0 on overflow. */
uint64_t ak_seal_file_bytes(uint64_t plain_bytes, uint32_t chunk);
/* Decodes the fixed fields of a plain header (the caller checked the
 * magic). */
void ak_seal_parse(const uint8_t hdr[AK_SEAL_HEADER_BYTES], ak_seal_info *out);

/* Starts sealing an image of plain_bytes (>= 1) for agent id (at most
 * AK_SEAL_ID_MAX bytes; longer is cut) and writes the header. */
void ak_seal_begin(ak_seal *z, const uint8_t key[32], uint64_t plain_bytes, uint32_t chunk, const char *id,
                   uint8_t hdr[AK_SEAL_HEADER_BYTES]);
/* Seals the next chunk: in holds the next min(chunk, plain_bytes - done)
 * bytes of the image; out gets that many + AK_SEAL_ABYTES. Returns the bytes
 * written to out. */
size_t ak_seal_push(ak_seal *z, const uint8_t *in, uint8_t *out);

/* Starts opening a sealed file of agent id whose header is hdr (key
 * already matched by key id). Returns 0, or -1 if the secretstream header is
 * rejected. */
int ak_unseal_begin(ak_seal *z, const uint8_t key[32], const uint8_t hdr[AK_SEAL_HEADER_BYTES], const char *id);
/* Opens the next chunk (in: its min(chunk, rest) + AK_SEAL_ABYTES bytes) into
 * out. Returns 0; -1 if authentication fails (tampered, wrong key, torn);
 * -2 if the tag is wrong for the position (a final tag before the end, or
 * none at the end: chunks dropped or reordered). */
int ak_unseal_pull(ak_seal *z, const uint8_t *in, uint8_t *out);
/* Plaintext bytes of the next chunk (0 when done). */
size_t ak_seal_next_bytes(const ak_seal *z);

/* The kinds of file a store holds: agents (<dir>/<id>.safetensors), pools
 * (<dir>/pools/<id>.safetensors) and memories (<dir>/memories/<id>.safetensors,
 * laid out as pools: store_memory.c). */
enum { AK_FILE_AGENT = 0, AK_FILE_POOL = 1, AK_FILE_MEMORY = 2, AK_FILE_CARD = 3 };   /* cards: store_card.c */

/* A file in quarantine/. */
typedef struct ak_qfile {
    char name[NAME_MAX + 1];
    uint64_t bytes;
} ak_qfile;

/* A sorted index of files that ak_store_pool_entry describes (pools,
 * memories): entries by id, their sources owned. Guarded by the store's mu. */
typedef struct {
    ak_store_pool_entry *v;
    int n, cap;
} ak_entry_index;

struct ak_store {
    char dir[PATH_MAX];
    char pool_dir[PATH_MAX];    /* <dir>/pools (created on the first pool save) */
    char mem_dir[PATH_MAX];     /* <dir>/memories (created on the first memory save) */
    int has_key;
    uint8_t key[AK_STORE_KEY_BYTES];
    uint8_t key_id[8];
    ak_store_backend *be;       /* where the images live (store_backend.h) */
    int tmp_dir;                /* dir is a private temporary directory (Redis without a local one) */
    /* The index: what the directory holds, as found at open and changed by
     * this store since (saves, loads, removals, quarantine, gc), so that
     * listing, gauges and gc touch no file. Guarded by mu: saves run on
     * other threads than listings. */
    pthread_mutex_t mu;
    ak_store_entry *idx;        /* agent files, sorted by id */
    int n_idx, cap_idx;
    ak_qfile *q;                /* quarantined files, oldest first */
    int nq, cap_q;
    ak_entry_index pools;       /* pool files */
    ak_entry_index mems;        /* memory files (store_memory.c) */
    /* card files (store_card.c), sorted by id; built at the first card call */
    ak_store_card_entry *cidx;
    int n_cidx, cap_cidx;
    int cards_indexed;
};

#define AK_STORE_SUFFIX ".safetensors"

/* The kinds' words for messages, "agent", "pool", "memory". */
static inline const char *ak_kind_word(int kind) {
    return kind == AK_FILE_POOL ? "pool" : kind == AK_FILE_MEMORY ? "memory" : kind == AK_FILE_CARD ? "card" : "agent";
}

/* 1 for the kinds laid out as pools (a content hash and a source, no base):
 * pools and memories. */
static inline int ak_kind_pooled(int kind) { return kind == AK_FILE_POOL || kind == AK_FILE_MEMORY; }

/* What a sealed image of kind is bound to (the seal's additional data):
 * an agent's id, or "pools/<id>" / "memories/<id>", so that none can pass
 * for another. */
static inline void ak_seal_binding(int kind, const char *id, char out[AK_SEAL_ID_MAX + 1]) {
    snprintf(out, AK_SEAL_ID_MAX + 1, "%s%s", kind == AK_FILE_POOL ? "pools/" : kind == AK_FILE_MEMORY ? "memories/" : "", id);
}

/* Canonical decimal: digits only, no leading zero (but "0"), within [lo,
 * hi]. Returns 0 with *out set, or -1. */
static inline int ak_parse_dec(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s || (s[0] == '0' && s[1])) return -1;
    int64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        if (v > (INT64_MAX - (*p - '0')) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    if (v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* The index of agent entries and the pooled kinds' (store.c): put inserts or
 * replaces (a pooled entry's source is taken), del removes, quarantined
 * records a file moved to quarantine (bounded: the oldest beyond
 * AK_STORE_QUARANTINE_MAX are deleted). Each takes s->mu. */
void ak_store_index_put(ak_store *s, int kind, const ak_store_entry *e, ak_store_pool_entry *pe);
void ak_store_index_del(ak_store *s, int kind, const char *id);
void ak_store_index_quarantined(ak_store *s, const ak_blob_qname *q);

/* Moves the image of (a->kind, a->id) to quarantine (if a->g is not NULL,
 * only if it is still the one a->g opened) under the kind's prefix, and
 * updates the index. Returns 0 (a->where: the new place, for messages), 1
 * if there was none, -1 with a->why set. */
int ak_store_quarantine_kind(ak_store *s, const ak_quarantine_args *a);

/* Snapshot of a sequence (a's) for a file of kind (AK_FILE_*): agents may
 * have a base (NULL: none; a->source unused); pooled kinds record
 * pool_hash and a->source (copied; NULL is ""). See ak_store_snapshot_base.
 * NULL with err set on bad arguments or out of memory. */
ak_snapshot *ak_store_snapshot_kind(int kind, const ak_store_save_args *a, const ak_store_base *base,
                                    const char *pool_hash, ak_error *err);

/* ak_store_load_linked for a file of kind. For pools, on a hit *pool_hash
 * (if not NULL) gets the file's content hash. */
ak_store_status ak_store_load_kind(ak_store *s, int kind, const ak_store_load_args *a, ak_store_load_info *info,
                                   char *pool_hash, ak_error *err);
/* ak_store_save_pool and ak_store_save_memory after their checks: the
 * content hash, the snapshot, the write. 0, or -1 with err set. */
int ak_store_save_pooled(ak_store *s, int kind, const ak_store_save_args *a, ak_error *err);
/* ak_store_load_pool and ak_store_load_memory: a pooled kind's file (no
 * prelink), its token ids and content hash handed out (each if not NULL). */
ak_store_status ak_store_load_pooled(ak_store *s, int kind, const ak_store_load_args *a, int32_t **tokens,
                                     int *n_tokens, char hash[17], ak_error *err);

/* The pool and memory indexes (ix: &s->pools or &s->mems; store_pool.c).
 * Each takes s->mu itself. put: inserts or replaces the entry of e->e.id,
 * taking ownership of e->source (freed on failure). lookup: a copy with its
 * own source, 0; 1 if absent. list: copies of all (free them with
 * ak_store_pool_entries_free). free: the index's memory (at close). */
void ak_entry_index_put(ak_store *s, ak_entry_index *ix, ak_store_pool_entry *e);
void ak_entry_index_del(ak_store *s, ak_entry_index *ix, const char *id);
int ak_entry_index_lookup(ak_store *s, ak_entry_index *ix, const char *id, ak_store_pool_entry *out);
int ak_entry_index_list(ak_store *s, ak_entry_index *ix, ak_store_pool_entry **out, int *n, ak_error *err);
void ak_entry_index_free(ak_entry_index *ix);

/* Frees the card index (at close; store_card.c). */
void ak_store_card_index_free(ak_store *s);
/* Drops card id from the card index (store_card.c). */
void ak_store_card_index_del(ak_store *s, const char *id);

#endif
