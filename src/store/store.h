/* LAYER store/ (src/store/): agent, pool, memory and card files: the
 * image codec, directory and Redis backends, sealing, the index; CacheCards.
 * Promises: a save is atomic (the previous image stays whole until the new
 * one is committed); no byte reaches a sequence before the whole image is
 * verified; a failure says which of ABSENT, STALE, CORRUPT, ERROR it is.
 * Decides no policy: what to save and when is the agents layer's.
 * May use: base, kv, engine. Used by: agents, serve. The table:
 * scripts/check-layers.sh.
 *
 * store.h - the persistent store of agent KV caches: one safetensors file
 * per agent, written atomically, verified completely before restore,
 * optionally sealed (encrypted and authenticated) at rest.
 *
 * A store is a directory:
 *     <dir>/<agent_id>.safetensors          one agent (plain or sealed)
 *     <dir>/.<agent_id>.safetensors.tmp.*   a save in flight (or a stale one);
 *                                           internal names start with '.',
 *                                           which no agent id can
 *     <dir>/quarantine/<agent_id>.safetensors.<reason>.<unix time>
 *                                           files found corrupt, moved aside
 * The file format is specified in docs/agent-file-format.md (and at the top
 * of store_codec.c; the layers: store.c). That is the directory backend;
 * with ak_store_open_at a store may instead keep the same images in Redis
 * (store_redis.c: chunks under a manifest, leases; docs/store.md): every
 * guarantee and status below holds there too, "file" meaning the image.
 *
 * Saving is two steps so that an agent manager holds its locks only while
 * memory is copied: ak_store_snapshot copies the first n tokens of a live
 * sequence into an owned snapshot (no I/O), ak_store_write_snapshot does the
 * file I/O (any thread, any time later), ak_snapshot_free frees it.
 *
 * Loading never lets a byte reach the sequence before the whole file has
 * been verified (structure, metadata, model, geometry, formats, token ids,
 * every checksum, and for sealed files every authentication tag). A load that
 * does not hit says why in err (one line naming the file: the caller logs
 * it) and in its status:
 *   ABSENT   no file for this id;
 *   STALE    a sound file this caller cannot use (another model fingerprint,
 *            cache spec, KV format, a newer format version, longer than the
 *            sequence's capacity, sealed under another key, sealed while the
 *            store has no key or plain while it has one, seal version 1):
 *            left in place;
 *   CORRUPT  torn, truncated, tampered or malformed: moved to quarantine/
 *            (by ak_store_load; ak_store_verify only reports);
 *   ERROR    undecided (read error, out of memory, KV budget exhausted):
 *            the file is left in place.
 *
 * The index. A store keeps in memory what its directory holds: each agent
 * file's entry (size, mtime, the header's metadata) and the quarantined
 * files, built at ak_store_open and kept current by this store's own saves,
 * loads (a hit refreshes the entry and its use time), removals, quarantine
 * moves, inspections and gc. Listing (ak_store_list, ak_store_lookup) and
 * ak_store_gc read the index and touch no file but the ones gc deletes;
 * files another process adds, changes or deletes meanwhile are seen at the
 * next open (or when this store loads or inspects them).
 *
 * Every function may be called from any thread; the index is guarded by a
 * mutex inside the store (saves run on writer threads while others list).
 * Two saves of one id race benignly (each file is whole; the last rename
 * wins). The caller must not write a sequence while ak_store_snapshot reads
 * it, nor use it while ak_store_load fills it.
 */
#ifndef AK_STORE_H
#define AK_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kvcache.h"
#include "kv/kvformat.h"
#include "base/ids.h"
#include "base/util.h"

#define AK_STORE_KEY_BYTES 32

typedef struct ak_store ak_store;
typedef struct ak_snapshot ak_snapshot;

typedef enum {
    AK_STORE_HIT = 0,
    AK_STORE_ABSENT,
    AK_STORE_STALE,
    AK_STORE_CORRUPT,
    AK_STORE_ERROR
} ak_store_status;

/* "hit", "absent", "stale", "corrupt", "error". */
const char *ak_store_status_name(ak_store_status st);

/* Reads an encryption key: the file must hold exactly 32 bytes (raw, e.g.
 * `(umask 077; head -c 32 /dev/urandom > key)`) and be private to its owner
 * (no mode bit in 077, as ssh requires of private keys: AK_ERR_PERMISSION
 * otherwise, naming the mode). Returns 0, or -1 with err set. */
int ak_store_read_key(const char *path, uint8_t key[AK_STORE_KEY_BYTES], ak_error *err);

/* Opens the store in dir, creating the directory (and its parents, mode
 * 0700) if missing, removes stale temporary files (those of processes no
 * longer running, or older than an hour) and builds the index (reads every
 * agent file's header, lists quarantine/, deleting its oldest files beyond
 * the bound below). key: NULL for plain files, else 32
 * bytes (copied): every file is then sealed, and only sealed files under the
 * same key are loaded. In test builds only (AK_FAULT_INJECTION), reads the
 * fault-injection variables (see store_dir.c: AK_FAULT_KILL_AT, AK_FAULT_FAIL_AT,
 * AK_FAULT_WRITE_CHUNK). Returns NULL with err set on failure. */
ak_store *ak_store_open(const char *dir, const uint8_t *key, ak_error *err);
/* Where a store lives (ak_store_open_at). */
typedef struct {
    const char *url;            /* a directory (as ak_store_open), or redis://host:port[/db]: the
                                   images live in Redis (src/store/store_redis.c; docs/store.md) */
    const char *password_file;  /* Redis only: the AUTH password, the first line of a file private
                                   to its owner (as key files); NULL: none */
    const char *local_dir;      /* Redis only: a local directory for what stays on this node (cards)
                                   and the read-through cache of images; NULL: a private temporary
                                   directory, no cache */
    int lease_ms;               /* Redis only: an agent's lease time (0: AK_STORE_LEASE_MS) */
    void (*log)(void *ud, const char *line);   /* lines about leases lost or writes fenced (NULL: stderr) */
    void *log_ud;
} ak_store_where;

/* Opens the store w->url: a directory exactly as ak_store_open, or a Redis
 * server (connected once at open: unreachable is an error here; later
 * failures are per operation, ERROR for a load, a failed save). With Redis,
 * one node serves an agent at a time: a save takes the agent's lease (or
 * fails with AK_ERR_BUSY while another node holds it), a hit takes it when
 * free; a held lease is renewed by a thread while the agent is used and
 * released once it is not (store_redis.c). Returns NULL with err set. */
ak_store *ak_store_open_at(const ak_store_where *w, const uint8_t *key, ak_error *err);
/* 1 if the store keeps its images in Redis. */
int ak_store_remote(const ak_store *s);

/* Wipes the key and frees the store. NULL is fine. */
void ak_store_close(ak_store *s);
const char *ak_store_dir(const ak_store *s);
int ak_store_sealed(const ak_store *s);

/* Copies positions [0, n_tokens) of kv (n_tokens <= ak_kv_length(kv)) and
 * their token ids into a new snapshot, laid out as the file's tensors. Memory
 * copies only; no I/O. fingerprint identifies the model (ak_model.fingerprint,
 * 1..64 printable characters), model_name is informational (may be NULL).
 * Returns NULL with err set on bad arguments or out of memory. */
ak_snapshot *ak_store_snapshot(const char *agent_id, const ak_kv *kv, const int32_t *tokens, int n_tokens,
                               const char *fingerprint, const char *model_name, ak_error *err);
/* BASES AND PREFIX LINKING. A sequence may start with a pool's positions
 * (kvcache.h: the shared base): its file then records the pool's id, its
 * content hash and how many of its positions the agent uses (base_len),
 * and holds only the agent's own positions [base_len, n_tokens) (its own
 * blocks; the token ids of all n_tokens).
 *
 * SEGMENTS. More generally the base is a list of segments (kvcache.h: up to
 * AK_KV_MAX_SEGMENTS), one after the other from position 0, each one of:
 *   AK_SEG_OWN   positions stored in this file (an agent's own positions
 *                frozen under a card appended after them: agent.h, import
 *                "append");
 *   AK_SEG_POOL  the first len positions of pool id (content hash hash);
 *                only as the first segment;
 *   AK_SEG_CARD  the first len positions of card id (content hash hash),
 *                its keys moved to start at the segment's position
 *                (cards.h: ak_card_shift).
 * The file then holds its own segments' positions and [base_len,
 * n_tokens), each run of positions starting a fresh file block. A base of
 * one pool or card segment is the single base above (pool_id, pool_hash,
 * base_len, card); a loaded file's base always has its segments listed
 * (n_seg, seg), and the single-base fields name its first segment when that
 * is a pool's or a card's (pool_id "" otherwise) with base_len the whole
 * base. A base given to a snapshot with n_seg = 0 is the single base. */
typedef enum { AK_SEG_OWN = 0, AK_SEG_POOL = 1, AK_SEG_CARD = 2 } ak_seg_kind;

typedef struct {
    int kind;                            /* ak_seg_kind */
    int len;                             /* positions, >= 1 */
    char id[AK_AGENT_ID_MAX + 1];        /* the pool's or the card's ("" for AK_SEG_OWN) */
    char hash[17];                       /* its content hash, 16 hex digits ("" for AK_SEG_OWN) */
} ak_store_seg;

typedef struct {
    char pool_id[AK_AGENT_ID_MAX + 1];   /* "" when the sequence has no base */
    char pool_hash[17];                  /* the pool's content hash, 16 hex digits */
    int base_len;                        /* positions taken from the pool */
    int card;                            /* 1: pool_id and pool_hash name a card (cards/), not a pool */
    int n_seg;                           /* segments of [0, base_len) listed in seg (0: the single base above) */
    ak_store_seg seg[AK_KV_MAX_SEGMENTS];
} ak_store_base;

/* ak_store_snapshot for a sequence with a base: kv's base_len must equal
 * base->base_len (or base is NULL / pool_id "" with no segment and kv has
 * none), and with segments listed, kv's segments (ak_kv_segments) must be
 * of their lengths. */
ak_snapshot *ak_store_snapshot_base(const char *agent_id, const ak_kv *kv, const int32_t *tokens, int n_tokens,
                                    const ak_store_base *base, const char *fingerprint, const char *model_name,
                                    ak_error *err);

/* Called by ak_store_load_linked once the file's header and metadata are
 * verified and before any tensor is read, with the file's base (pool_id ""
 * and no segment if none) and token ids, and kv: a fresh, empty sequence
 * of the load's formats and capacity. It links into kv what the caller
 * already holds in RAM: the pool's first base_len positions when the file
 * has a single base (ak_kv_attach_base), then possibly whole own blocks
 * found in the block pool's index (ak_kv_link). A base of segments is built
 * segment by segment in order: a pool's or a card's blocks, and for an
 * AK_SEG_OWN segment fresh blocks (ak_kv_append_empty) that the load then
 * fills from the file; nothing is linked past such a base. Returns 0 with kv
 * holding positions [0, L) where L = base_len + j * block_tokens for some j
 * (or L = n_tokens; j = 0 when the file has own segments), or -1 with err
 * set: the load is then a miss (STALE for AK_ERR_STALE or
 * AK_ERR_NOT_FOUND: the pool or card vanished or changed; ERROR
 * otherwise). The store reads and verifies only the blocks past L, and
 * those of the file's own segments. */
typedef int (*ak_store_prelink_fn)(void *ud, const ak_store_base *base, const int32_t *tokens, int n_tokens,
                                   ak_kv *kv, ak_error *err);

/* Bytes the snapshot holds (about the file size). */
size_t ak_snapshot_bytes(const ak_snapshot *snap);
void ak_snapshot_free(ak_snapshot *snap);

/* Writes snap as <dir>/<agent_id>.safetensors: temp file in the same
 * directory, fsync, rename over the old file, fsync of the directory.
 * Returns 0, or -1 with err set ("store: PATH: what: strerror"); a failure
 * before the rename leaves the previous file intact and removes the temp. */
int ak_store_write_snapshot(ak_store *s, const ak_snapshot *snap, ak_error *err);

/* ak_store_snapshot + ak_store_write_snapshot + ak_snapshot_free. */
int ak_store_save(ak_store *s, const char *agent_id, const ak_kv *kv, const int32_t *tokens, int n_tokens,
                  const char *fingerprint, const char *model_name, ak_error *err);

typedef struct {
    int32_t *tokens;       /* n_tokens ids (malloc'd, the caller frees); NULL unless a hit */
    int n_tokens;
    uint64_t bytes_read;   /* bytes of the file read */
    double read_ms;        /* reading (and decrypting) the file */
    double verify_ms;      /* parsing, checks, checksums */
    double restore_ms;     /* copying the vectors into the sequence's blocks */
    double total_ms;
    int quarantined;       /* 1 if the file was moved to quarantine/ */
    int linked;            /* positions the prelink callback supplied (not read) */
    ak_store_base base;    /* the file's base (pool_id "" if none) */
} ak_store_load_info;

/* Restores agent_id into kv (not NULL): the file must be for the model `fingerprint`,
 * the cache spec of kv's pool, kv's K and V formats (the pool's block size
 * does not matter), hold at most ak_kv_capacity(kv) tokens, and token ids in
 * [0, vocab) (vocab <= 0: not checked). On a hit, kv's previous contents are
 * dropped and it holds the file's n_tokens positions (the ids are in info),
 * and the file's mtime is set to now (for ak_store_gc). On any other status kv
 * is untouched, except ERROR after the verification (KV budget exhausted),
 * which leaves kv empty. info may be NULL. */
ak_store_status ak_store_load(ak_store *s, const char *agent_id, const char *fingerprint, int vocab, ak_kv *kv,
                              ak_store_load_info *info, ak_error *err);

/* What a load restores and checks the file against (ak_store_load_linked,
 * ak_store_load_pool, ak_store_load_memory): as ak_store_load's arguments. */
typedef struct {
    const char *id;                /* the agent's, pool's or memory's */
    const char *fingerprint;       /* the model the file must be for */
    int vocab;                     /* token ids must be below it (<= 0: not checked) */
    ak_kv *kv;                     /* the sequence to fill (not NULL) */
    ak_store_prelink_fn prelink;   /* ak_store_load_linked only (pools and memories have no base): */
    void *ud;                      /* the callback and its first argument, or NULL */
} ak_store_load_args;

/* ak_store_load of a->id with a prelink callback (a->prelink NULL: as
 * ak_store_load, where a file with a base is then STALE: nothing can supply
 * it). info->bytes_read counts only the blocks read; info->linked gets L. */
ak_store_status ak_store_load_linked(ak_store *s, const ak_store_load_args *a, ak_store_load_info *info,
                                     ak_error *err);

/* Everything ak_store_load checks that needs no sequence: the whole file,
 * every checksum; the model if fingerprint is not NULL; token ids if vocab >
 * 0. Moves nothing. Returns the status ak_store_load would give (HIT when
 * sound). */
ak_store_status ak_store_verify(ak_store *s, const char *agent_id, const char *fingerprint, int vocab,
                                ak_error *err);

/* One agent file, as ak_store_list and ak_store_inspect see it. */
typedef struct {
    char id[AK_AGENT_ID_MAX + 1];
    uint64_t bytes;        /* file size */
    int64_t mtime;         /* unix seconds: last save or load */
    int64_t mtime_ns;      /* nanoseconds part */
    int sealed;
    int readable;          /* 1 if the metadata below were read (a plain file, or
                              sealed under this store's key, with a sound header);
                              else they are zero / "" */
    int n_tokens;
    ak_kv_format fk, fv;
    ak_cache_spec spec;
    int block_tokens;      /* the saving pool's (informational) */
    int64_t created;       /* unix seconds */
    char fingerprint[65];
    char model_name[128];
    ak_store_base base;    /* the pool the agent's file starts with (pool_id "" if none) */
} ak_store_entry;

/* Every agent file of the store (temp and quarantined files excluded), sorted
 * by id, into a malloc'd array (*out, the caller frees; *n entries), from
 * the index: no file is read. The metadata of a file is as its header said
 * when the index last read it (its metadata checksum checked, not the
 * tensors'). Returns 0, or -1 with err set. */
int ak_store_list(ak_store *s, ak_store_entry **out, int *n, ak_error *err);

/* The index entry of one agent, without I/O. Returns 0, or 1 if the index
 * has no file for id. */
int ak_store_lookup(ak_store *s, const char *agent_id, ak_store_entry *out);

/* The entry of one agent, read from its file (the index takes what was
 * read), and, if metadata_json is not NULL, its whole __metadata__ as a JSON
 * object (malloc'd, the caller frees). Returns 0; 1 if there is no such
 * file; -1 with err set if it cannot be read or its header is not sound. */
int ak_store_inspect(ak_store *s, const char *agent_id, ak_store_entry *out, char **metadata_json, ak_error *err);

/* Deletes the agent's file. Returns 0, 1 if there was none, -1 on error. */
int ak_store_remove(ak_store *s, const char *agent_id, ak_error *err);

/* Moves the agent's file to quarantine/<id>.safetensors.<reason>.<time>
 * (reason: a short word, [a-z0-9-]). quarantine/ holds at most
 * AK_STORE_QUARANTINE_MAX files: moving one more deletes the oldest.
 * Returns 0, 1 if there was none, -1 on error. */
int ak_store_quarantine(ak_store *s, const char *agent_id, const char *reason, ak_error *err);
#define AK_STORE_QUARANTINE_MAX 32

/* Deletes files until the agent files and the quarantined files of the
 * directory total at most disk_budget bytes: quarantined files first
 * (oldest first: they serve no agent), then least recently used agent files
 * (oldest mtime first, as the index knows them). Pool files are neither
 * counted nor deleted: they are explicit. No directory scan. Returns
 * the number of files deleted (*bytes_after, if not NULL, gets the total
 * left), or -1 with err set. */
int ak_store_gc(ak_store *s, uint64_t disk_budget, uint64_t *bytes_after, ak_error *err);

/* POOLS. Named shared prefixes (agent.h) live in <dir>/pools/<id>.safetensors,
 * the agent file format with "format": "agentkv.pool" and, besides, the
 * pool's content hash ("pool_hash": ak_pool_content_hash of its formats and
 * tokens) and an opaque "source" string (what the pool was made from, e.g.
 * its messages as JSON), with the same guarantees: atomic writes, complete
 * verification before any byte reaches a sequence, quarantine of corrupt
 * files (to quarantine/pool+<id>...: no agent id holds a '+'), the index.
 * Ids as for agents. */
typedef struct {
    ak_store_entry e;      /* as for agents; e.base unused */
    char pool_hash[17];
    char *source;          /* malloc'd (ak_store_pool_entries_free / free) or NULL */
} ak_store_pool_entry;

/* 16 hex digits naming a pool's contents: XXH3-64 over the model
 * fingerprint, the formats, the cache spec and the token ids. */
void ak_pool_content_hash(const char *fingerprint, const ak_cache_spec *spec, ak_kv_format fk, ak_kv_format fv,
                          const int32_t *tokens, int n_tokens, char out[17]);
/* A sequence to write as a pool or a memory (ak_store_save_pool,
 * ak_store_save_memory): positions [0, n_tokens) of kv (no base) and their
 * token ids. */
typedef struct {
    const char *id;            /* the pool's or memory's */
    const ak_kv *kv;
    const int32_t *tokens;
    int n_tokens;
    const char *source;        /* a pool's "source", a memory's text (NULL: "") */
    const char *fingerprint;   /* the model (as ak_store_snapshot) */
    const char *model_name;    /* informational (may be NULL) */
} ak_store_save_args;

/* Writes pool a->id (positions [0, a->n_tokens) of a->kv, no base)
 * atomically. Returns 0, or -1 with err set. */
int ak_store_save_pool(ak_store *s, const ak_store_save_args *a, ak_error *err);
/* Loads pool a->id into the empty a->kv (its formats must be the file's:
 * use ak_store_lookup_pool first to learn them; a->prelink is not used);
 * statuses as ak_store_load (CORRUPT files are quarantined). On a hit
 * *tokens (malloc'd), *n_tokens, and pool_hash are set (each if not NULL). */
ak_store_status ak_store_load_pool(ak_store *s, const ak_store_load_args *a, int32_t **tokens, int *n_tokens,
                                   char pool_hash[17], ak_error *err);
/* The index entry of a pool (no I/O; source copied, the caller frees it).
 * Returns 0, or 1 if there is no such pool file. */
int ak_store_lookup_pool(ak_store *s, const char *pool_id, ak_store_pool_entry *out);
/* Every pool file, sorted by id (malloc'd; free with
 * ak_store_pool_entries_free). Returns 0, or -1 with err set. */
int ak_store_list_pools(ak_store *s, ak_store_pool_entry **out, int *n, ak_error *err);
void ak_store_pool_entries_free(ak_store_pool_entry *v, int n);
/* Deletes a pool file. Returns 0, 1 if there was none, -1 on error. */
int ak_store_remove_pool(ak_store *s, const char *pool_id, ak_error *err);

/* MEMORIES. Memory chunks (memories.h: a text's KV computed alone at
 * position 0) live in <dir>/memories/<id>.safetensors: the pool file
 * layout (docs/agent-file-format.md) with "format": "agentkv.memory",
 * "pool_hash" the memory's content hash (ak_pool_content_hash of the model
 * fingerprint, its formats, the cache spec and its token ids: recomputed
 * and compared at every load) and "source" the chunk's text; the layout
 * is at the top of store_memory.c. The same guarantees as pools: atomic
 * writes, complete verification (every block checksum, the metadata
 * checksum, the content hash) before a byte reaches a sequence, another
 * model STALE, corrupt files moved to quarantine/memory+<id>..., sealed
 * under the store's key (binding "memories/<id>"). Ids as for agents. The
 * index of memories is built at ak_store_open and kept current by this
 * store's saves, loads, removals and quarantine moves; ak_store_gc neither
 * counts nor deletes memories. Entries are ak_store_pool_entry (pool_hash:
 * the content hash, source: the text). */
/* Writes memory a->id (positions [0, a->n_tokens) of a->kv, at least one,
 * no base) with its content hash and text (a->source) atomically (creating
 * memories/). Returns 0, or -1 with err set (the previous file, if any,
 * intact). */
int ak_store_save_memory(ak_store *s, const ak_store_save_args *a, ak_error *err);
/* Loads memory a->id into the empty a->kv (its formats must be the
 * file's: ak_store_lookup_memory first; a->prelink is not used). Statuses
 * as ak_store_load (CORRUPT files are quarantined, another model is
 * STALE). On a hit *tokens (malloc'd), *n_tokens and hash are set (each if
 * not NULL). */
ak_store_status ak_store_load_memory(ak_store *s, const ak_store_load_args *a, int32_t **tokens, int *n_tokens,
                                     char hash[17], ak_error *err);
/* The index entry of memory id (no I/O; source copied, the caller frees
 * it). Returns 0, or 1 if there is no such file. */
int ak_store_lookup_memory(ak_store *s, const char *id, ak_store_pool_entry *out);
/* Every memory file, sorted by id (free with ak_store_pool_entries_free).
 * Returns 0, or -1 with err set. */
int ak_store_list_memories(ak_store *s, ak_store_pool_entry **out, int *n, ak_error *err);
/* Deletes memory id's file. Returns 0, 1 if there was none, -1 on error. */
int ak_store_remove_memory(ak_store *s, const char *id, ak_error *err);

/* CARDS. CacheCards (cards.h) live in <dir>/cards/<id>.safetensors, format
 * "agentkv.card" version 1 (docs/card-file-format.md, store_card.c): per
 * layer, side and width class the class's vectors in token order, the
 * per-token widths, the token ids, the position offset, the source agent,
 * the model fingerprint, cache spec, policy and budgets. The same
 * guarantees as agent files: atomic writes, complete verification (every
 * tensor checksum, the metadata checksum, the content hash recomputed)
 * before a card is handed out, corrupt files moved to
 * quarantine/card+<id>.safetensors.<reason>.<time>, sealed under the
 * store's key (binding "cards/<id>"). Ids as for agents. The index of cards
 * is built at the first card call (a scan of cards/) and kept current by
 * this store's saves, loads, removals and quarantine moves; ak_store_gc
 * neither counts nor deletes cards (they are explicit, like pools). */
typedef struct ak_card ak_card;

typedef struct {
    char id[AK_AGENT_ID_MAX + 1];
    uint64_t bytes;        /* file size */
    int64_t mtime;         /* unix seconds */
    int sealed;
    int readable;          /* 1 if the fields below were read (else zero / "") */
    int n_tokens;
    int pos_offset;
    ak_cache_spec spec;
    char fingerprint[65];
    char model_name[128];
    char source_agent[AK_AGENT_ID_MAX + 1];
    char policy[32];
    double budget_k, budget_v;
    double mean_k, mean_v; /* the mean widths the card holds */
    int64_t created;
    char hash[17];         /* content hash (cards.h: ak_card_content_hash) */
} ak_store_card_entry;
/* What a card object says of itself as an entry (no file: bytes, mtime and
 * sealed are 0). */
struct ak_card;
void ak_store_card_entry_of(const struct ak_card *c, ak_store_card_entry *e);

/* Writes card c as cards/<c->id>.safetensors atomically (creating cards/).
 * Returns 0, or -1 with err set (the previous file, if any, intact). */
int ak_store_save_card(ak_store *s, const ak_card *c, ak_error *err);
/* Reads and verifies card id completely into a new card (*out, free with
 * ak_card_free). fingerprint (NULL: not checked): another model is STALE;
 * spec (NULL: not checked): another cache spec is STALE; vocab > 0: token
 * ids must be below it (else CORRUPT). Statuses as ak_store_load: ABSENT,
 * STALE (also: another format version, sealed under another key, sealed
 * while the store has no key or plain while it has one), CORRUPT (moved to
 * quarantine/), ERROR (read error, out of memory). */
ak_store_status ak_store_load_card(ak_store *s, const char *id, const char *fingerprint, const ak_cache_spec *spec,
                                   int vocab, ak_card **out, ak_error *err);
/* ak_store_load_card's checks without keeping the card or moving the file
 * (a CORRUPT file stays in place). */
ak_store_status ak_store_verify_card(ak_store *s, const char *id, const char *fingerprint, const ak_cache_spec *spec,
                                     int vocab, ak_error *err);
/* The index entry of card id (no I/O but the first card call's scan).
 * Returns 0, or 1 if the store has no such card. */
int ak_store_lookup_card(ak_store *s, const char *id, ak_store_card_entry *out);
/* Every card file, sorted by id, into *out (malloc'd, the caller frees).
 * Returns 0, or -1 with err set. */
int ak_store_list_cards(ak_store *s, ak_store_card_entry **out, int *n, ak_error *err);
/* Deletes card id's file. Returns 0, 1 if there was none, -1 on error. */
int ak_store_remove_card(ak_store *s, const char *id, ak_error *err);
/* The stored bytes of card id's file (as saved: sealed if the store is),
 * read through the store's backend (a directory's cards/, or Redis) into
 * *bytes (malloc'd, NUL-terminated after *len bytes). Returns 0, or -1 with
 * err set (AK_ERR_NOT_FOUND: no such card). */
int ak_store_card_bytes(ak_store *s, const char *id, char **bytes, size_t *len, ak_error *err);

#endif
