/* spanfind.h - where a run of a request's tokens recurs in other token
 * sequences, at any offset in either: the search behind handoff reuse
 * (an agent that takes over a conversation gets the same history after a
 * head of its own, so the history sits at another position than in the
 * agent that computed it, and rarely on a block boundary of either).
 *
 * The finder indexes every window of w consecutive tokens of the query's
 * range [from, upto) by a polynomial rolling hash (mod 2^64), then rolls
 * the same hash over a source sequence, left to right: each source window
 * whose hash is in the index is compared token by token (a hash never
 * decides), and an equal one is extended forward as far as the tokens
 * agree, within the query's range and the source (the first window of a
 * common run is the one that finds it). The longest span found over every source
 * scanned wins (the first found on a tie). Cost: O(query + source) per
 * source, plus the comparisons of the windows that match.
 *
 * Within one source, a window inside a span just found on the same
 * diagonal (the same source-minus-query offset) is not examined again, and
 * at most a few query windows of one hash are compared per source window
 * (spanfind.c: SPAN_MAX_TRIES): in text that repeats itself the span
 * found may then be one of its copies, not necessarily the longest; the
 * cost stays linear whatever the text.
 *
 * Thread-safety: a finder is used by one thread at a time; sources are
 * only read.
 */
#ifndef AK_SPANFIND_H
#define AK_SPANFIND_H

#include <stdint.h>

#include "base/util.h"

typedef struct {
    int at;       /* where the span starts in the query */
    int src_at;   /* where it starts in the source */
    int len;      /* tokens; 0: none found */
    int source;   /* the caller's number of the source (ak_span_scan's source_no) */
} ak_span;

typedef struct ak_span_finder ak_span_finder;

/* A finder for spans of at least min_len tokens (>= 1) of q[from, upto)
 * (0 <= from <= upto; q is kept, not copied: it must outlive the finder).
 * A range shorter than min_len gives a finder that finds nothing. Returns
 * NULL with err set (AK_ERR_INVALID: bad arguments; AK_ERR_NOMEM). */
ak_span_finder *ak_span_finder_new(const int32_t *q, int from, int upto, int min_len, ak_error *err);
void ak_span_finder_free(ak_span_finder *f);

/* Scans src[0, n_src) for spans of the query (header comment). When the
 * longest found is longer than best->len, sets *best to it (source =
 * source_no) and returns 1; else returns 0 and leaves *best alone. */
int ak_span_scan(ak_span_finder *f, const int32_t *src, int n_src, int source_no, ak_span *best);

#endif
