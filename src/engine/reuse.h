/* reuse.h - a context whose pieces include memory chunks computed
 * elsewhere (memories.h), prefilled by one of four reuse methods
 * (CacheBlend, AgentKVShift).
 *
 * A chunk's KV was computed alone at positions [0, n); placed at position
 * p its keys are rotated to [p, p + n) (ak_model_shift_keys) but its values
 * never saw what now precedes it: they are stale. A span of another
 * sequence (a handoff: the same history after another head) is the same
 * case with a source position s for 0: its keys move by p - s, and its
 * values saw the other head where this context has its own. The methods:
 *
 *   NONE          the chunk's K/V used as computed alone (keys shifted);
 *   CACHEBLEND    every chunk token is run through layers [0, check) over
 *                 the real context (see below); at the check layer its
 *                 fresh V is compared with the reused one (squared L2 over
 *                 all KV heads); the top ceil(ratio * n) tokens of each
 *                 chunk are recomputed through layers [check, n_layer), the
 *                 others keep their reused K/V at those layers;
 *   AGENTKVSHIFT  the same probes recomputed; at each layer l >= check and
 *                 KV head h the mean residual (fresh - reused) of K and of
 *                 V over the chunk's probes, mu_K and mu_V, is added to
 *                 every non-probe token j as w_j * mu (weights below), at
 *                 attention time (kvcache.h: CORRECTIONS): the stored K/V
 *                 of non-probe tokens are the reused bits;
 *   FULL          every token computed fresh (the reference).
 *
 * The context is processed part by part, in order: a fresh part is a plain
 * prefill over everything before it; a chunk part is placed, then (blend
 * methods) its tokens run through layers [0, check) as one prefill run at
 * their positions: token j of the chunk attends, at those layers, to every
 * earlier position (the fresh parts as computed, earlier chunks as their
 * method left them) and to chunk tokens 0..j computed in this run, so at
 * layers < check the chunk's K/V are exactly what a full prefill of the
 * same cache would hold; they are written (the chunk's own cells at those
 * layers become fresh). Then, layer by layer from check on, the selected
 * tokens (in position order) are recomputed: each attends, causally by
 * position, over what the cache holds at that layer (fresh tokens, other
 * chunk tokens as reused or corrected, selected tokens recomputed so far),
 * and writes its K/V at its position. AGENTKVSHIFT sets layer l's
 * correction before the probes attend at layer l.
 *
 * Weights (AGENTKVSHIFT): d_j is token j's squared L2 deviation of fresh
 * from reused V at the check layer (all KV heads), its divergence score;
 * w_j = d_j / (mean over the chunk's probes of d_p): a token that diverged
 * like an average probe gets the whole mean residual, one that did not
 * diverge gets none (probes are the most divergent, so w_j <= 1 up to
 * ties). When every probe's d is 0, w_j = 1. unit_weights: every
 * non-probe w_j = 1 (the ablation). Probes have w = 0 (they hold fresh
 * K/V). (sqrt(d_j) / mean sqrt(d_p), the deviation's norm rather than its
 * square, was tried first: a higher KL on both tiny models, docs/memories.md.)
 *
 * The sequence built has the plain mapping (no segments): each chunk's
 * stored bytes are copied into the sequence's own blocks (converted,
 * dequantized and requantized, when the chunk's formats differ), so the
 * chunk's blocks are never written, and a recomputed token's K/V replace
 * the reused ones only in this copy. Because the block layout is the
 * plain one, ratio 1 (CACHEBLEND or AGENTKVSHIFT) equals FULL bit for bit,
 * and ratio 0 equals NONE except at layers < check (tested).
 *
 * Cost: NONE computes the fresh parts only; the blend methods add, per
 * chunk token, layers [0, check) plus the K/V projection at the check
 * layer, and per selected token layers [check, n_layer) (AGENTKVSHIFT: a
 * second K/V projection per probe and layer, to take the residual before
 * the probes are written). With check = 1 of 16 layers and ratio 0.1 a
 * chunk token costs about (1 + 0.1 * 15) / 16 of FULL's, a 6.4x bound.
 */
#ifndef AK_REUSE_H
#define AK_REUSE_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kvcache.h"
#include "engine/model.h"
#include "base/util.h"

typedef enum { AK_REUSE_NONE, AK_REUSE_CACHEBLEND, AK_REUSE_AGENTKVSHIFT, AK_REUSE_FULL } ak_reuse_method;

typedef struct {
    ak_reuse_method method;
    float ratio;        /* recompute_ratio in [0, 1]: share of each chunk's tokens recomputed (the probes);
                         * per chunk ceil(ratio * n) tokens (ratio * n rounded up after removing 1e-6 of
                         * float noise: 0.1 of 30 is 3); NONE and FULL ignore it */
    int check_layer;    /* 0-based layer where deviations are measured; < 0: the default, layer 1 (CacheBlend's
                         * choice: layer 0's K/V depend on the token and position only, so their deviation
                         * from the reused ones is nil; layer 1 is the first that saw the context), or 0
                         * for a one-layer model */
    int unit_weights;   /* AGENTKVSHIFT ablation: every non-probe weight 1 */
} ak_reuse_params;

/* One piece of the context, in order. */
typedef struct {
    const int32_t *tokens;
    int n;              /* >= 1 */
    const ak_kv *chunk; /* NULL: computed fresh; else the chunk's KV: the part's tokens at positions [src_at,
                         * src_at + n) (the same block pool as the sequence, any formats) */
    int src_at;         /* where chunk holds them: 0 for a chunk computed alone; a span of another sequence
                         * sits at its own position there, its keys rotated for it (ak_reuse_place only) */
} ak_reuse_part;

typedef struct {
    double ms;          /* wall time of ak_reuse_prefill */
    int n_tokens;       /* positions filled: the sum of the parts' n */
    int n_chunk_tokens; /* tokens of chunk parts */
    int n_recomputed;   /* chunk tokens computed through every layer (FULL: all, NONE: 0, blend: the selected) */
    int check_layer;    /* the check layer used (-1 for NONE and FULL) */
} ak_reuse_stats;

/* Fills the empty sequence kv with the parts' positions, in order from 0:
 * chunk parts placed by p->method (header comment), fresh parts computed
 * over what precedes them. logits (vocab floats, may be NULL) gets the
 * next-token logits after the last token; it needs the last part to be
 * fresh. st (may be NULL) gets the counts and time. Afterwards the caller
 * continues kv with ak_eval/ak_forward; an AGENTKVSHIFT correction stays in
 * effect (kv carries it: kvcache.h CORRECTIONS). Uses c's position offset
 * as it is (normally 0). Returns 0, or -1 with err set:
 *   AK_ERR_INVALID  kv not empty, no parts, a part with n < 1 or no tokens,
 *                   a chunk shorter than its part, a src_at other than 0
 *                   (ak_reuse_place takes it), of another block pool or
 *                   geometry, the total past kv's capacity, ratio outside
 *                   [0, 1] or NaN, check_layer >= n_layer, logits asked
 *                   after a chunk part, a chunk placed past position 0 on a
 *                   model whose keys cannot be shifted (no RoPE, other
 *                   RoPE scalings), CACHEBLEND or AGENTKVSHIFT on an MLA
 *                   model (deepseek2: its layer-range entry points are not
 *                   written);
 *   AK_ERR_KV_BUDGET and the forward pass's errors.
 * On failure kv is left empty (truncated to 0, corrections dropped). */
int ak_reuse_prefill(ak_ctx *c, ak_kv *kv, const ak_reuse_part *parts, int n_parts, const ak_reuse_params *p,
                     float *logits, ak_reuse_stats *st, ak_error *err);

/* One chunk part appended to kv by p->method: kv holds positions [0, at)
 * (at = its length; it may have a base of segments and corrections of its
 * own), and afterwards [0, at + part->n), the chunk placed at at as
 * ak_reuse_prefill places it (FULL: computed). What follows is the
 * caller's (ak_eval). ak_reuse_prefill is this for each chunk part and
 * ak_eval for each fresh one; an agent's turn calls it per memory
 * (agent.h: ak_agent_reuse_memory) and per handoff span
 * (ak_agent_reuse_span: part->src_at the span's position in its source).
 * st gets this chunk's counts and time.
 * Returns 0, or -1 with err set (reuse_prefill's errors); kv is then
 * truncated back to at (a correction added for this chunk dropped). */
int ak_reuse_place(ak_ctx *c, ak_kv *kv, const ak_reuse_part *part, const ak_reuse_params *p, ak_reuse_stats *st,
                   ak_error *err);

/* The ranking of the blend methods: order[0..n) gets the token indices
 * by deviation d (n entries), larger first, ties the lower index; the
 * first ak_reuse_n_selected of them are the selected tokens (probes).
 * Returns 0, or -1 with err set (out of memory). */
int ak_reuse_rank(const double *d, int n, int *order, ak_error *err);
/* Tokens selected of a chunk of n at ratio r: ceil(r * n), float noise
 * removed first (0.1 of 30 is 3, not 4), within [0, n]. */
int ak_reuse_n_selected(float r, int n);

/* A setting "METHOD:R" as flags and requests write one (serve
 * --handoff-reuse, the request field handoff_reuse): "none" (nothing
 * reused: *on = 0), or "cacheblend:R" / "agentkvshift:R" with R the
 * recompute ratio in [0, 1] (*on = 1, *p set: check layer the default).
 * Returns 0, or -1 with err set (AK_ERR_INVALID: another method, a
 * missing, malformed or out-of-range R); *on and *p unchanged then. */
int ak_reuse_spec_parse(const char *s, int *on, ak_reuse_params *p, ak_error *err);
/* Writes a setting back as ak_reuse_spec_parse reads it ("none" when off). */
void ak_reuse_spec_format(int on, const ak_reuse_params *p, char *buf, size_t cap);

/* "none", "cacheblend", "agentkvshift", "full" ("?" for anything else). */
const char *ak_reuse_method_name(ak_reuse_method m);
/* Parses one of those names into *m. Returns 0, or -1 (unknown: *m unchanged). */
int ak_reuse_method_parse(const char *s, ak_reuse_method *m);

#endif
