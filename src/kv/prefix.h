/* prefix.h - content-addressed prefix sharing: a sequence's blocks named by
 * the token prefix they hold, linked instead of computed or read.
 *
 * The name of block i of a sequence (kvcache.h: its span [start, start +
 * count)) is the chain hash (blockpool.h: ak_block_chain_hash) of span i
 * over the hash of span i - 1, so it names the whole prefix up to the
 * span's end, where every block sits and its formats: two sequences whose
 * caches hold the same prefix with the same spans hold the same bits
 * (the kernels are batch invariant: tests/test_sharing.c), and one may use
 * the other's block. Only a "pure" sequence, whose every position was
 * computed by a forward pass of its tokens (or restored from a file of one,
 * or linked from such blocks), may publish; one that took positions from an
 * import, a shift or a correction must not.
 *
 * Thread-safety: what the block pool's is (any thread); a sequence is used
 * by one thread at a time.
 */
#ifndef AK_PREFIX_H
#define AK_PREFIX_H

#include <stdint.h>

#include "kv/kvcache.h"

/* Links to kv, from its length on, blocks of the pool's index that hold
 * tokens[length .. upto) span by span, stopping at the first span that is
 * not indexed or would end past upto. kv's length must be a link point
 * (kvcache.h) or nothing is linked. tokens[0 .. length) must be what kv
 * holds. Returns the number of positions linked (kv's length grew by it). */
int ak_prefix_link(ak_kv *kv, const int32_t *tokens, int upto);

/* Enters kv's full blocks covering tokens[0..n) (n <= length) in the index,
 * from block *next_span on (0: all); *next_span gets the first block not
 * yet full, where the next call may start. A block whose prefix is indexed
 * already under another block is replaced by that one (computed twice, held
 * once). Blocks of the shared base and partial blocks are left alone.
 * Returns the number of blocks replaced. */
int ak_prefix_publish(ak_kv *kv, const int32_t *tokens, int n, int *next_span);

#endif
