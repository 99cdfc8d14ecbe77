/* blockpool.h - the paged KV memory: fixed-size blocks under a byte budget.
 *
 * A block holds the keys and values of `block_tokens` consecutive positions
 * of one sequence, for every layer of its layer group (every layer, unless
 * the model has sliding-window layers: cachespec.h LAYER GROUPS) and KV
 * head, in the formats it was created with (K and V apart). Sequences own blocks through a block table (see
 * kvcache.h); blocks are reference-counted so that sequences can share them,
 * and a shared block is copied before it is written (copy-on-write).
 *
 * Layout of a block's bytes, for each layer l of its group in order, a K region then a V
 * region; each region (format f, head dim d, T = block_tokens, H = n_head_kv)
 * holds its vectors' components apart (ak_kv_format_components), each
 * component head-major:
 *     metadata: [H][T] of ak_kv_format_meta_bytes(f, d) bytes (scales,
 *               norm; absent for f32/f16/bf16)
 *     codes:    [H][T] code streams of ak_kv_format_code_bytes(f, d) bytes
 * Attention for one head streams two contiguous runs, its T metadata
 * entries and its T code streams. A whole component of a region (all heads)
 * is one run because that is how an agent file stores it: one tensor per
 * layer, K/V and component, shaped [blocks][H][T] (store.c), so a restore
 * reads each (layer, K/V, component, block) piece straight from the file
 * into the block, one contiguous range to another (for a 1B model: from
 * 512 B of tq norms to 32 KiB of f16 values). The layout before, each
 * head's metadata run followed by its codes run, cut a restore into H times
 * more, smaller pieces, and cost more CPU than the read itself
 * (docs/store.md).
 *
 * Default block size: 32 tokens. Small enough that a sequence wastes at most
 * 31 positions and that shared prefixes split at fine grain; large enough that
 * the per-block work in attention (format dispatch, online-softmax rescale)
 * is amortized over 32 vectors, and it equals the quantization group of q8/q4.
 *
 * The pool is thread-safe: allocation, reference counting and statistics are
 * guarded by a mutex (the server restores caches on an I/O thread).
 */
#ifndef AK_BLOCKPOOL_H
#define AK_BLOCKPOOL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/cachespec.h"
#include "kv/kvformat.h"
#include "base/util.h"

#define AK_DEFAULT_BLOCK_TOKENS 32

/* A mixed block (below): each slot's key and value in a format of its own. */
#define AK_MIX_CLASSES 4
typedef struct ak_block_mix {
    int count;                                  /* slots filled, from slot 0 */
    int ncls[2];                                /* formats used by keys [0] and values [1] */
    ak_kv_format fmt[2][AK_MIX_CLASSES];        /* those formats (distinct) */
    int n[2][AK_MIX_CLASSES];                   /* slots stored in each */
    size_t off[2][AK_MIX_CLASSES];              /* where each class starts in a layer's K (V) region */
    size_t region[2];                           /* bytes of one layer's K (V) region */
    uint8_t *cls[2];                            /* (T) each slot's class */
    uint16_t *rank[2];                          /* (T) its index among its class's slots */
    uint16_t *slots[2][AK_MIX_CLASSES];         /* (n) each class's slots, ascending */
} ak_block_mix;

typedef struct ak_block {
    int refcount;
    size_t bytes;           /* of data */
    int group;              /* the layer group it holds (cachespec.h); 0 for mixed blocks */
    ak_block_mix *mix;      /* NULL: every slot in fk / fv; else per slot (then fk, fv are unused) */
    ak_kv_format fk, fv;
    uint64_t hash;          /* its key in the content index (below); 0 = not indexed */
    struct ak_block *hnext; /* next block of its index bucket */
    uint8_t *data;          /* see the layout above */
    int plain;              /* data is its own allocation, not cut from one of the pool's slabs */
} ak_block;

typedef struct ak_block_pool ak_block_pool;

typedef struct {
    size_t budget;                       /* 0 = unlimited */
    size_t used;                         /* bytes of live blocks */
    size_t peak;
    size_t blocks;                       /* live blocks */
    size_t k_bytes[AK_KV_NFORMATS];      /* K bytes of live blocks, by format */
    size_t v_bytes[AK_KV_NFORMATS];      /* V bytes of live blocks, by format (uniform blocks) */
    size_t mixed_bytes;                  /* bytes of live mixed blocks */
    uint64_t alloc_failures;             /* allocations refused by the budget */
    size_t shared;                       /* bytes of live blocks held by more than one reference */
    size_t logical;                      /* bytes as the holders see them: each block's bytes times
                                            its references (logical / used: the dedup ratio) */
    size_t indexed;                      /* blocks in the content index */
    uint64_t index_hits;                 /* lookups that found a block */
} ak_block_pool_stats;

/* A pool for caches of the given spec. budget = 0 means no limit; block_tokens
 * <= 0 means the default. Returns NULL with err set on bad arguments. */
ak_block_pool *ak_block_pool_new(const ak_cache_spec *spec, int block_tokens, size_t budget, ak_error *err);
void ak_block_pool_free(ak_block_pool *p);

const ak_cache_spec *ak_block_pool_spec(const ak_block_pool *p);
int ak_block_pool_block_tokens(const ak_block_pool *p);
/* Bytes of T positions of every layer with these formats: one block of a
 * pool with one layer group; with two (cachespec.h), a block of each group
 * together (an upper bound on what a span of a sequence takes). */
size_t ak_block_pool_block_bytes(const ak_block_pool *p, ak_kv_format fk, ak_kv_format fv);
/* Layer groups of the pool's spec (1 or 2). */
int ak_block_pool_groups(const ak_block_pool *p);
/* Whether sequences created on this pool from now on release their local
 * group's blocks once those slide out of the window (kvcache.h:
 * ak_kv_release_window). Off by default: such a sequence no longer holds
 * the local layers' keys of early positions, which whoever reads or
 * rewrites every position (key shifts, reuse chunks, calibration) needs.
 * The agents' pool turns it on (agent.h). Not thread-safe: set it before
 * sequences are made. */
void ak_block_pool_set_window_release(ak_block_pool *p, int on);
int ak_block_pool_window_release(const ak_block_pool *p);
/* Bytes of one block of layer group g (0 when there is no such group). */
size_t ak_block_pool_group_bytes(const ak_block_pool *p, int group, ak_kv_format fk, ak_kv_format fv);
/* Byte offsets of layer l's K and V regions inside a block of l's layer
 * group (cachespec.h): the layers of a group follow one another in order,
 * so with one group this is l times a layer's K and V regions. */
size_t ak_block_k_offset(const ak_block_pool *p, ak_kv_format fk, ak_kv_format fv, int layer);
size_t ak_block_v_offset(const ak_block_pool *p, ak_kv_format fk, ak_kv_format fv, int layer);
void ak_block_pool_get_stats(ak_block_pool *p, ak_block_pool_stats *out);
/* Changes the budget; blocks already live stay (used may exceed it until
 * they are freed). */
void ak_block_pool_set_budget(ak_block_pool *p, size_t budget);

/* CENTERING. A pool may hold a key mean and a value mean (a model-level
 * constant, see calib.h): for each layer and KV head, a vector of
 * head_dim_k (head_dim_v) floats. Blocks whose K (V) format is in the pool's
 * centering set (by default the formats for which ak_kv_format_centers is
 * 1) store k - mu_k[layer][head] (v - mu_v[layer][head]) instead of k (v):
 * the quantizer then covers the vectors' spread around their mean, not
 * their common offset from zero. Reading a vector back adds the mean again,
 * and attention adds it back exactly: q . mu_k to the scores of a centered
 * key block, and mu_v times the softmax weight that went to centered value
 * blocks to the output. So attention over centered blocks equals attention
 * over the reconstructed vectors, whatever mix of formats a sequence holds.
 * The means are named by one short id that agent files record: a file
 * centered with other means (or none) is a miss, never mixed in. */

/* Sets the pool's means (mu_k and/or mu_v; NULL: that side not centered;
 * both NULL clears), copying n_layer * n_head_kv * head_dim_k (_v) floats.
 * id: 1..32 characters [0-9a-z.-] naming them; k_mask / v_mask: the formats
 * each applies to (bit f set: format f), 0 for the default set. Only while
 * the pool holds no block (mixing would corrupt caches); returns 0, or -1
 * with err set. */
int ak_block_pool_set_centers(ak_block_pool *p, const float *mu_k, const float *mu_v, const char *id, unsigned k_mask,
                              unsigned v_mask, ak_error *err);
/* The mean subtracted from keys (is_v = 0) or values (1) of format f at
 * layer l, KV head h, or NULL when such vectors are not centered. */
const float *ak_block_pool_center(const ak_block_pool *p, int is_v, ak_kv_format f, int layer, int head);
/* The id of the means applied to keys (values) of format f, or NULL when
 * they are not centered. */
const char *ak_block_pool_center_id(const ak_block_pool *p, int is_v, ak_kv_format f);

/* Makes memory for `bytes` worth of blocks of formats fk/fv ready in
 * advance: allocates them, touches every page, and puts them on the free
 * list, so that later allocations (a restore above all) do not pay the
 * first touch of fresh pages (measured: most of a restore's time on a VM).
 * Optional, e.g. once at startup for the whole budget. Counts against the
 * budget only while it runs; stops early (returning the bytes prepared)
 * when the budget or memory runs out. */
size_t ak_block_pool_prefault(ak_block_pool *p, ak_kv_format fk, ak_kv_format fv, size_t bytes);

/* A new block (refcount 1, contents undefined) of layer group 0 (every
 * layer with one group). Returns NULL with err set when the budget cannot
 * fit it ("KV budget exhausted: ...") or memory runs out; nothing else
 * changes then. */
ak_block *ak_block_alloc(ak_block_pool *p, ak_kv_format fk, ak_kv_format fv, ak_error *err);
/* ak_block_alloc for the layers of group g (cachespec.h); AK_ERR_INVALID
 * for a group the pool does not have. */
ak_block *ak_block_alloc_group(ak_block_pool *p, int group, ak_kv_format fk, ak_kv_format fv, ak_error *err);
/* A new block with b's formats and contents (for copy-on-write). */
ak_block *ak_block_clone(ak_block_pool *p, const ak_block *b, ak_error *err);
void ak_block_ref(ak_block_pool *p, ak_block *b);
/* Drops a reference; frees the block at zero. NULL is fine. */
void ak_block_unref(ak_block_pool *p, ak_block *b);
int ak_block_refcount(ak_block_pool *p, const ak_block *b);

/* CONTENT INDEX. A full block whose contents are a pure function of a
 * token prefix (computed by a forward pass of those tokens from position 0,
 * or restored from a file of such a sequence: the kernels are batch
 * invariant, so every such computation gives the same bits) can be entered
 * in the pool's index under a chain hash (ak_block_chain_hash) that names
 * that prefix. A sequence about to compute the same tokens links the
 * indexed block instead (kvcache.h: ak_kv_link). A block leaves the index
 * when its last reference goes: the index holds no reference of its own.
 * Blocks that came from an import, a position shift or a correction must
 * never be entered: their bits are not the prefix's. */

/* Sets what every chain hash of this pool is salted with besides its
 * tokens: the model fingerprint (the pool's block size and centering ids
 * are added by the pool itself). Call before any hash is computed. */
void ak_block_pool_set_model(ak_block_pool *p, const char *fingerprint);
/* The hash of the block spanning positions [first_pos, first_pos + n)
 * with tokens tok[0..n), after a block whose hash is parent (0 for the
 * first block), in formats fk/fv: XXH3-64 over (parent, first_pos, n, fk,
 * fv, the pool's salt, the tokens). Never 0. */
uint64_t ak_block_chain_hash(const ak_block_pool *p, uint64_t parent, int first_pos, const int32_t *tok, int n,
                             ak_kv_format fk, ak_kv_format fv);
/* The indexed block of hash h with a reference taken for the caller, or
 * NULL when none. */
ak_block *ak_block_pool_lookup(ak_block_pool *p, uint64_t h);
/* Enters b under h. Returns b when entered (or already there); the block
 * already indexed under h when that is another one, with a reference taken
 * for the caller (who may replace its copy by it, ak_kv_replace_span, and
 * then drops that reference); or NULL when b is indexed under another hash
 * or out of memory (nothing entered). */
ak_block *ak_block_pool_publish(ak_block_pool *p, ak_block *b, uint64_t h);

/* MIXED BLOCKS: a bit width per token (CacheCards). Slot s of a mixed block
 * stores its key in format fk[s] and its value in fv[s]; the formats of a
 * side form at most AK_MIX_CLASSES classes. Layout, for each layer l in
 * order, a K region then a V region (as uniform blocks); a region holds its
 * classes one after the other (in the order of first use by the slots), and
 * class c holds its n_c slots' vectors as a uniform block holds T:
 *     metadata: [H][n_c] of meta_bytes(f_c, d)   codes: [H][n_c] of code_bytes(f_c, d)
 * slot s being entry rank[s] of its class. Only filled slots take room: a
 * block of 2-bit keys is a quarter of a block of 8-bit ones. Mixed blocks
 * are never centered, and their key formats must not be rotated (attention
 * scores each class against the plain query); value formats may be (tq*).
 * They are written once, slot by slot, by whoever builds them (a card
 * import), and read by attention in place, class by class. */

/* A mixed block for `count` slots (1..T) with the given per-slot formats,
 * zeroed.
 * Returns NULL with err set: a rotated or invalid key format, more than
 * AK_MIX_CLASSES formats on a side, a pool with two layer groups
 * (AK_ERR_INVALID: a mixed block holds every layer), the budget
 * (AK_ERR_KV_BUDGET). */
ak_block *ak_block_alloc_mixed(ak_block_pool *p, const ak_kv_format *fk, const ak_kv_format *fv, int count,
                               ak_error *err);
/* ak_block_alloc_mixed without the zeroing: the caller writes every byte
 * of every slot before anything reads the block (a card's import, which
 * fills the blocks on several threads: their pages are first touched
 * there, not here under the pool's lock). */
ak_block *ak_block_alloc_mixed_unfilled(ak_block_pool *p, const ak_kv_format *fk, const ak_kv_format *fv, int count,
                                        ak_error *err);

/* Parses a byte size: "512M", "10.2G", "4096", "1.5GiB"; returns 0, or -1. */
int ak_parse_bytes(const char *s, size_t *out);

#endif
