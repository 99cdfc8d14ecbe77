/* LAYER kv/ (src/kv/): KV formats, the cache spec, the block pool,
 * sequences (this header), content-addressed prefixes.
 * Promises: KV memory lives in reference-counted blocks under a byte
 * budget, shared copy-on-write; attention reaches it only through this
 * interface and reads each format as stored; a token's entries are the
 * same bits however they were computed. Knows no model, file or agent:
 * the cache spec says the geometry.
 * May use: base. Used by: engine, store, agents, serve. The table:
 * scripts/check-layers.sh.
 *
 * kvcache.h - one sequence's KV cache, reached only through this interface.
 *
 * A sequence is a block table over a shared block pool (blockpool.h): block i
 * holds positions [i*T, (i+1)*T) for every layer, in the sequence's K and V
 * formats (kvformat.h); with sliding-window layers, a table per layer group
 * (LAYER GROUPS below). The forward pass prepares the positions it is about
 * to write, writes each layer's keys and values, and asks for attention over
 * the first n positions; it never indexes cache memory itself. Attention
 * decodes one block at a time into f32 scratch (once for every query that
 * reads it) with an online softmax over blocks, so its scratch is one
 * block's worth per head, whatever n is.
 */
#ifndef AK_KVCACHE_H
#define AK_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kv/cachespec.h"
#include "kv/kvformat.h"
#include "base/util.h"

typedef struct ak_kv ak_kv;
typedef struct ak_block_pool ak_block_pool;
typedef struct ak_block ak_block;

/* A sequence of up to n_ctx positions whose blocks come from pool, storing
 * keys in fk and values in fv. Returns NULL with err set when n_ctx is not
 * positive or longer than the model's context, or a format cannot store the
 * head dimension. Allocates no block yet. */
ak_kv *ak_kv_new(ak_block_pool *pool, ak_kv_format fk, ak_kv_format fv, int n_ctx, ak_error *err);
/* A new sequence sharing every block of src (copy-on-write). */
ak_kv *ak_kv_fork(const ak_kv *src, ak_error *err);
/* Releases the sequence's block references. NULL is fine. */
void ak_kv_free(ak_kv *kv);

int ak_kv_capacity(const ak_kv *kv);
/* Number of positions held (the highest written position + 1). */
int ak_kv_length(const ak_kv *kv);
ak_kv_format ak_kv_format_k(const ak_kv *kv);
ak_kv_format ak_kv_format_v(const ak_kv *kv);
ak_block_pool *ak_kv_pool(const ak_kv *kv);
/* Forgets positions >= n and releases whole blocks past them. */
void ak_kv_truncate(ak_kv *kv, int n);
/* Bytes of the blocks this sequence references (shared ones included). */
size_t ak_kv_bytes(const ak_kv *kv);
int ak_kv_n_blocks(const ak_kv *kv);

/* LAYER GROUPS (cachespec.h). A sequence of a model with sliding-window
 * layers holds, for each span of positions, a block of the global layers
 * and one of the local layers. Once a local block lies wholly before
 * (length - window) no later token can see it: ak_kv_release_window drops
 * the sequence's reference to it (a shared block stays alive for its
 * other holders), so a long sequence's local layers cost about a window of
 * positions. Reading a released position (ak_kv_read, ak_kv_stored) fails;
 * the forward pass checks ak_kv_window_check before computing a token.
 * Shared blocks carry both groups: a base (ak_kv_attach_base), a segment
 * (ak_kv_append_groups), a linked span (ak_kv_link_groups); a sequence
 * that others build on (a pool's, a memory's) turns releasing off, so
 * that it keeps every block of both groups.
 * With one group (every other family) none of this changes anything. */
/* Layer groups of the sequence (1 or 2). */
int ak_kv_groups(const ak_kv *kv);
/* Blocks the sequence holds of group g (0 global or all, 1 local). */
int ak_kv_group_blocks(const ak_kv *kv, int group);
/* The first position whose local-layer vectors may still be held: every
 * local block ending at or before it was released (0 with one group). */
int ak_kv_window_first(const ak_kv *kv);
/* Turns releasing on or off for this sequence (by default as its pool
 * says: ak_block_pool_set_window_release); forks inherit it. */
void ak_kv_set_window_release(ak_kv *kv, int on);
/* When releasing is on: releases the local blocks wholly before (length -
 * window). Called after each forward pass. Returns the blocks released. */
int ak_kv_release_window(ak_kv *kv);
/* Releases the local blocks that end at or before pos, whatever the
 * setting (a restore of a file that holds only the live ones, before its
 * positions are prepared). Returns the blocks released. */
int ak_kv_release_window_below(ak_kv *kv, int pos);
/* 0 if a token at position pos finds every position its local layers'
 * window shows still held, else -1 with err set (AK_ERR_INVALID: the
 * sequence was truncated back below what it released). */
int ak_kv_window_check(const ak_kv *kv, int pos, ak_error *err);

/* Makes positions [from, to) writable: allocates missing blocks and copies
 * shared ones and those entered in the content index (copy-on-write: an
 * indexed block's bits are named by its hash, blockpool.h). Returns 0, or -1 with err set (budget
 * exhausted, past capacity) having changed nothing the sequence holds. */
int ak_kv_prepare(ak_kv *kv, int from, int to, ak_error *err);

/* Stores the key (n_head_kv * head_dim_k floats) and value (n_head_kv *
 * head_dim_v floats) of one position of one layer, quantizing them to the
 * sequence's formats. The position must have been prepared; returns -1 with
 * err set otherwise. k or v NULL leaves that side as it is (re-keying a
 * position already written, e.g. after a position shift). */
int ak_kv_write(ak_kv *kv, int layer, int pos, const float *k, const float *v, ak_error *err);

/* Reads back (dequantized) the key and value of one position of one layer,
 * all KV heads: k gets n_head_kv * head_dim_k floats, v likewise. Returns 0,
 * or -1 with err set if pos >= length. */
int ak_kv_read(const ak_kv *kv, int layer, int pos, float *k, float *v, ak_error *err);

/* Raw access for persistence and hand-off: the stored bytes of component
 * comp (0: the code stream, 1: the metadata; see ak_kv_format_components)
 * of one vector (key if is_v == 0, else value) of one layer, KV head and
 * position, in the sequence's format. Within a block, the components of
 * consecutive positions of one (layer, is_v, comp, head) are back to back,
 * and so are those of consecutive heads (blockpool.h): from head 0's first
 * slot, a block's whole component (n_head_kv * block_tokens entries) is one
 * run. ak_kv_stored needs pos < length; ak_kv_stored_mut needs pos
 * prepared (ak_kv_prepare): exclusively owned and not in the content index. Both return NULL when the
 * position is not available or the format has no component comp. */
const uint8_t *ak_kv_stored(const ak_kv *kv, int layer, int is_v, int comp, int head, int pos);
uint8_t *ak_kv_stored_mut(ak_kv *kv, int layer, int is_v, int comp, int head, int pos);
/* Exchanges the contents (blocks and length) of two sequences of the same
 * pool, formats and capacity: a restore fills a fresh sequence and swaps it
 * in only once it is verified. Returns 0, or -1 (nothing changed) if they
 * differ in pool, formats or capacity. */
int ak_kv_swap(ak_kv *a, ak_kv *b);
/* Declares positions [0, n) written (after filling them through
 * ak_kv_stored_mut). Returns 0, or -1 with err set if some are not prepared. */
int ak_kv_set_length(ak_kv *kv, int n, ak_error *err);

/* SHARED BASE, SEGMENTS AND LINKED BLOCKS. A sequence's positions map to
 * blocks in two parts. The base, positions [0, base_len), is a list of up to
 * AK_KV_MAX_SEGMENTS segments, one after the other: each is standard-mapped
 * from its own start s (its block j holds [s + j*T, s + (j+1)*T)) and its
 * last block may be partly filled. A segment's blocks are shared read-only
 * with where they came from (a pool, an earlier state of the same agent, a
 * card's mixed blocks: agent.h), never copied. The sequence's own positions
 * [base_len, ...) start a fresh block: own block j holds [base_len + j*T,
 * base_len + (j+1)*T). With no segment (every sequence that never attached
 * a base) this is the plain mapping. Attention reads each block for the
 * positions it holds, so a partial block in the middle costs nothing but
 * its empty slots. Truncating below base_len shortens the segment holding
 * the new last position and drops those after it (their blocks stay shared
 * where others hold them). */
#define AK_KV_MAX_SEGMENTS 8

/* Makes the empty sequence kv start with positions [0, base_len) of src
 * (base_len <= ak_kv_length(src)), sharing src's blocks (references
 * taken): src's segments up to base_len, and, when base_len passes src's
 * base, src's own positions below base_len as one more segment (frozen:
 * never written through kv, copied on write like any shared block). kv and
 * src must be of one pool; their formats may differ (each block carries its
 * own). Returns 0, or -1 with err set (AK_ERR_INVALID: kv not empty,
 * base_len out of range, longer than kv's capacity, more than
 * AK_KV_MAX_SEGMENTS segments). */
int ak_kv_attach_base(ak_kv *kv, const ak_kv *src, int base_len, ak_error *err);
/* Positions of the base, all segments (0 when none). */
int ak_kv_base_len(const ak_kv *kv);
/* The segments' lengths into lens (room for AK_KV_MAX_SEGMENTS); returns
 * their number (0 without a base). */
int ak_kv_segments(const ak_kv *kv, int *lens);
/* Appends blocks[0..nb) as one more segment of n positions (nb = ceil(n /
 * T); a mixed block must hold the slots asked of it) right after the base,
 * taking a reference to each: a card's blocks (blockpool.h: MIXED BLOCKS),
 * read in place. The sequence must hold no own positions (its length is
 * its base_len: attach the old state as a base first); blocks prepared
 * past the length are released. The length becomes base_len + n. Returns
 * 0, or -1 with err set (AK_ERR_INVALID: own positions held, no segment
 * left, past the capacity, a block too small); nothing changes then. */
int ak_kv_append_blocks(ak_kv *kv, ak_block *const *blocks, int nb, int n, ak_error *err);
/* ak_kv_append_blocks for a sequence of two layer groups (kvcache.h LAYER
 * GROUPS): blocks[i] of the global group, lblocks[i] of the local group
 * for the same span (none NULL: a released local block cannot be shared).
 * With one group lblocks is ignored. A shared segment (a pool's, a
 * memory's) is read by the positions after it through the window, so it
 * brings both. Returns 0, or -1 with err set (ak_kv_append_blocks'
 * errors; AK_ERR_INVALID: lblocks NULL or holding NULL with two groups, a
 * block of the other group). */
int ak_kv_append_groups(ak_kv *kv, ak_block *const *blocks, ak_block *const *lblocks, int nb, int n, ak_error *err);
/* ak_kv_append_blocks of ceil(n / T) fresh blocks of kv's formats, held by
 * kv alone: a segment whose positions are then filled through
 * ak_kv_stored_mut (a restore of a file's own segments, store.h). Returns 0,
 * or -1 with err set (ak_kv_append_blocks' errors, AK_ERR_KV_BUDGET). */
int ak_kv_append_empty(ak_kv *kv, int n, ak_error *err);
/* ak_kv_append_blocks on an empty sequence: the blocks are its first
 * segment (positions [0, n)). */
int ak_kv_attach_blocks(ak_kv *kv, ak_block *const *blocks, int nb, int n, ak_error *err);
/* The first position past the block that holds pos (its span's end: fewer
 * than T positions on for a partial segment block), or -1 when pos is
 * outside the capacity. */
int ak_kv_block_end(const ak_kv *kv, int pos);
/* 1 if some block of kv is a mixed block (such a sequence is not saved as
 * an agent file: ak_kv_stored gives NULL for its positions). */
int ak_kv_has_mixed(const ak_kv *kv);

/* The blocks of a sequence in order, each with the positions it spans:
 * block i holds [*start, *start + *count) (count: the positions the block
 * can hold, fewer than T only for a segment's partial last block; the last block's
 * span may extend past the length). ak_kv_span_count gives the number of
 * blocks covering [0, length). ak_kv_span returns block i (NULL where none
 * is allocated) and, for any i below the table's size (also past the
 * length: where block i would be), sets start and count; past the table it
 * returns NULL and sets nothing. */
int ak_kv_span_count(const ak_kv *kv);
/* (With two layer groups, ak_kv_block_at and ak_kv_span give the global
 * group's blocks; ak_kv_n_blocks, ak_kv_bytes and ak_kv_private_bytes count
 * both groups.) */
/* The block holding position pos (< length) and pos's slot in it, or NULL
 * (nothing set) when pos is not held. */
ak_block *ak_kv_block_at(const ak_kv *kv, int pos, int *slot);
ak_block *ak_kv_span(const ak_kv *kv, int i, int *start, int *count);
/* The local group's block of span i (the one ak_kv_span gives for the
 * global group), or NULL: one group, released, not allocated, or i out of
 * range. */
ak_block *ak_kv_local_span(const ak_kv *kv, int i);
/* Blocks that positions [0, n) of this sequence take (its base included). */
int ak_kv_blocks_for(const ak_kv *kv, int n);
/* Where the next own block starts: the position at which ak_kv_link can
 * add a whole block (base_len + j*T for the first j past the length),
 * valid only when the length is on such a boundary. Returns the length if
 * it is a block boundary, else -1. */
int ak_kv_link_point(const ak_kv *kv);
/* Appends block b (a full block of this sequence's geometry, e.g. found in
 * the pool's index, blockpool.h) at the sequence's end, taking a reference:
 * the length grows by T. The length must be a link point. Returns 0, or -1
 * with err set (not at a link point, past capacity); nothing changes then. */
int ak_kv_link(ak_kv *kv, ak_block *b, ak_error *err);
/* ak_kv_link for a sequence of two layer groups: b the global group's
 * block of the span, lb the local group's (both full blocks of this
 * sequence's formats, of their groups). lb NULL links the span as released
 * (kvcache.h LAYER GROUPS): only on a sequence that releases and holds no
 * local block before its length (window_first equal to the length); no
 * later token may see the span through its window. With one group it is
 * ak_kv_link (lb ignored). Returns 0, or -1 with err set (AK_ERR_INVALID:
 * ak_kv_link's, a block of another group or formats, lb NULL where the
 * local layers hold earlier positions); nothing changes then. */
int ak_kv_link_groups(ak_kv *kv, ak_block *b, ak_block *lb, ak_error *err);
/* Replaces the block at span i (exclusively owned, same formats) by b
 * (a reference taken): a block computed twice is held once. Returns 0, or
 * -1 if they cannot be swapped (nothing changes). */
int ak_kv_replace_span(ak_kv *kv, int i, ak_block *b);
/* Bytes of blocks this sequence holds alone (reference count 1). */
size_t ak_kv_private_bytes(const ak_kv *kv);

/* CORRECTIONS (AgentKVShift, reuse.h). A sequence may carry up to
 * AK_KV_MAX_CORRECTIONS corrected ranges of positions, not overlapping:
 * range r covers [start, start + n) with a weight w_j per position, and
 * for each layer l >= layer0 that has been set, per KV head, a key offset
 * mu_K (head_dim_k floats) and a value offset mu_V (head_dim_v). Attention
 * then reads position j of such a range at layer l as if it stored k_j +
 * w_j mu_K and v_j + w_j mu_V: its score gains w_j (q . mu_K) (times the
 * scale) and the output (sum_j p_j w_j) mu_V. The stored blocks are never
 * written (they may be shared and quantized); ak_kv_read and ak_kv_stored
 * give the stored, uncorrected vectors. Only the blocks of a uniform
 * format are corrected (a card's mixed blocks are not). A fork copies the
 * corrections, ak_kv_attach_base the part of them below its base_len,
 * ak_kv_swap exchanges them, ak_kv_truncate cuts them at the new length. */
#define AK_KV_MAX_CORRECTIONS 8
/* Adds a range [start, start + n) (held positions, not overlapping another)
 * corrected from layer layer0 on, with weights w[0..n) (copied); no layer is
 * set yet (nothing changes until ak_kv_correction_set). Returns the range's
 * index, or -1 with err set (AK_ERR_INVALID: out of range, overlapping, too
 * many; AK_ERR_NOMEM). */
int ak_kv_correction_add(ak_kv *kv, int start, int n, int layer0, const float *w, ak_error *err);
/* Sets layer `layer`'s offsets of range idx: mu_k (n_head_kv x head_dim_k
 * floats), mu_v (n_head_kv x head_dim_v). Returns 0, or -1 with err set
 * (AK_ERR_INVALID: no such range, layer below its layer0 or past the
 * model's). */
int ak_kv_correction_set(ak_kv *kv, int idx, int layer, const float *mu_k, const float *mu_v, ak_error *err);
/* Number of ranges; range idx's geometry and weights (valid until the
 * sequence changes), -1 if there is no such range. */
int ak_kv_corrections(const ak_kv *kv);
int ak_kv_correction_get(const ak_kv *kv, int idx, int *start, int *n, int *layer0, const float **w);
/* Range idx's offsets at layer (mu_K if is_v == 0, else mu_V, all KV heads),
 * or NULL when that layer is not set. */
const float *ak_kv_correction_mu(const ak_kv *kv, int idx, int layer, int is_v);
/* Drops every correction. */
void ak_kv_correction_clear(ak_kv *kv);

/* Floats of scratch ak_kv_attend needs for n_q queries on kv (or any
 * sequence of the same pool). */
size_t ak_kv_attend_scratch(const ak_kv *kv, int n_q);

/* What attention reads and where it writes: the queries of n_q query heads
 * that share one KV head of one layer, and their outputs. */
typedef struct {
    int layer, kv_head;
    const float *q;     /* n_q vectors of head_dim_k floats, one after the other (per token) */
    size_t qstride;     /* runs: floats from one token's queries to the next */
    int n_q;
    float scale;        /* of the scores q . k */
    float *out;         /* n_q vectors of head_dim_v floats (per token) */
    size_t ostride;     /* runs: floats from one token's outputs to the next */
    float *scratch;     /* ak_kv_attend_scratch or ak_kv_attend_run_scratch floats */
} ak_kv_query;

/* For each of the n_q query vectors q[i] of qr: out[i] = softmax(q[i] .
 * K[0..n) * scale) . V[0..n) over qr's layer and KV head. n <= length
 * (n <= 0: zeros); qr's strides are not used. The same arithmetic as
 * ak_kv_attend_run for a token at position n - 1: the result does not
 * depend on which call computed it. */
void ak_kv_attend(const ak_kv *kv, const ak_kv_query *qr, int n);

/* Floats of scratch ak_kv_attend_run needs for n_rows = n_q * nt query rows
 * on kv (or any sequence of the same pool). */
size_t ak_kv_attend_run_scratch(const ak_kv *kv, int n_rows);
/* ak_kv_attend for nt consecutive tokens of the sequence at positions pos0 ..
 * pos0 + nt - 1, each seeing positions [0, its own]: token t's n_q queries
 * are at qr->q + t * qr->qstride, its outputs at qr->out + t * qr->ostride.
 * Each block is dequantized once for all nt * n_q queries (prefill).
 * pos0 + nt <= length. */
void ak_kv_attend_run(const ak_kv *kv, const ak_kv_query *qr, int nt, int pos0);
/* ak_kv_attend_run for a sliding-window layer: the token at position p sees
 * only positions [p - window + 1, p] (and none before 0); blocks that no
 * token of the run sees are not read. window <= 0 means no window (the same
 * result as ak_kv_attend_run, bit for bit). */
void ak_kv_attend_run_window(const ak_kv *kv, const ak_kv_query *qr, int nt, int pos0, int window);

#endif
