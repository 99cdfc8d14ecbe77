/* kernels_packed_layout.h - the R16 packed layout's kinds and record sizes,
 * shared by kernels_packed.c (x86 tiles and the threaded driver) and
 * kernels_packed_arm.c (NEON tiles).
 *
 * The layout itself is described at the top of kernels_packed.c: rows in
 * groups of GROUP = 16; per block of 32 columns a code record, then per
 * group the scale records. Both files lay records out and index the tile
 * tables by these kinds, so the numbering and the sizes live here once: a
 * change to one side that the other does not see would read wrong bytes,
 * not fail to build.
 */
#ifndef AK_KERNELS_PACKED_LAYOUT_H
#define AK_KERNELS_PACKED_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "base/gguf.h"

#define AK_PACKED_GROUP 16  /* rows per group */

/* The 32-block kinds, numbered as the tile tables are laid out. */
enum { PQ_Q40, PQ_Q80, PQ_Q41, PQ_Q50, PQ_Q51, PQ_KINDS };

/* The kind of a 32-block weight type (Q4_0 for any other type: callers
 * ask only for the five). */
static inline int pq_kind(uint32_t wtype) {
    switch (wtype) {
    case GGML_TYPE_Q8_0: return PQ_Q80;
    case GGML_TYPE_Q4_1: return PQ_Q41;
    case GGML_TYPE_Q5_0: return PQ_Q50;
    case GGML_TYPE_Q5_1: return PQ_Q51;
    default: return PQ_Q40;
    }
}

/* Whether the kind's scale records carry minimums m (Q4_1, Q5_1). */
static inline int pq_has_min(int kind) { return kind == PQ_Q41 || kind == PQ_Q51; }
/* Whether its code records carry a vector of fifth bits (Q5_0, Q5_1). */
static inline int pq_has_hbits(int kind) { return kind == PQ_Q50 || kind == PQ_Q51; }
/* Bytes of one code record (one block of 32 columns of 16 rows). */
static inline size_t pq_code_record_bytes(int kind) { return kind == PQ_Q80 ? 512 : pq_has_hbits(kind) ? 320 : 256; }
/* Bytes of one scale record: 16 f16 scales, then 16 f16 minimums if any. */
static inline size_t pq_scale_record_bytes(int kind) {
    return pq_has_min(kind) ? 4 * AK_PACKED_GROUP : 2 * AK_PACKED_GROUP;
}

#endif
