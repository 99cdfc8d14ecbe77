/* bench_reuse_residual.h - `agentkv bench reuse --residual`: what the reuse
 * residual of memory chunks looks like, layer by layer, K and V.
 *
 * A chunk placed in a context has two versions of its K/V: computed alone
 * at positions [0, n) with its keys rotated to where it now is (method
 * `none`: what reuse gives), and computed in context (`full`). The residual
 * r = full - none, per token and channel (KV head x head dim), read as
 * attention sees it (ak_kv_read: dequantized, un-centered). Sums, per layer
 * and side (K, V), over every chunk of every context
 * (bench_reuse_metrics.h has the arithmetic):
 *
 *   energy        sum |r|^2; rel: over sum |full|^2 (how large it is);
 *   offset        the share of the energy the per-chunk mean explains (the
 *                 premise of AgentKVShift: near 1 when the residual is one
 *                 offset per chunk plus small noise);
 *   offset_no1st  the same without each chunk's first token (computed alone
 *                 it saw nothing before it: the attention sink);
 *   offset_pre    K only: the same for the residual rotated back to RoPE
 *                 position 0 (token j's residual rotated by -(its position),
 *                 ak_model_shift_keys in an f32 scratch sequence): an offset
 *                 before RoPE is not one after it;
 *   probeR        the share of the non-probe tokens' residual energy that
 *                 AgentKVShift's correction would remove, in closed form:
 *                 probes = the ceil(R n) tokens of largest squared V
 *                 residual at the check layer (reuse.h's ranking, with the
 *                 in-context V standing for the recomputed one), mu = their
 *                 mean residual, every other token j corrected by w_j mu,
 *                 w_j = d_j / mean d_probes (reuse.h's weights); negative:
 *                 the correction adds error. Columns: R = 10% (probe10), its
 *                 ablations with every weight 1 (p10_w1), weights per KV head
 *                 from that head's V residual (p10_head), the offset taken
 *                 before RoPE and rotated to each token (p10_pre, K), and
 *                 R = 30% (probe30). Layers below the check layer: "-" (the
 *                 method recomputes them for every token).
 *
 * The probe columns are an estimate: in the method the probes are
 * recomputed over a cache whose other chunk tokens are corrected, not over
 * the full one; the offset columns are exact.
 *
 * The oracle (brr_apply_oracle): each chunk's exact mean residual, per
 * layer, K and V, added to every token of the `none` cache, the
 * continuation scored against full (cmd_bench_reuse.c): what the best
 * possible per-chunk offset buys in KL, with the K offset constant after
 * RoPE (as agentkvshift applies it) or before it (rotated to each token),
 * and with the V offset alone or the K offset alone.
 */
#ifndef AK_CLI_BENCH_REUSE_RESIDUAL_H
#define AK_CLI_BENCH_REUSE_RESIDUAL_H

#include "engine/model.h"
#include "kv/kvcache.h"
#include "base/util.h"

/* Sums of one layer and side. */
typedef struct {
    double energy, explained;          /* residual energy; explained by the per-chunk mean */
    double energy_nf, explained_nf;    /* without each chunk's first token */
    double explained_pre;              /* K: by the mean of the residual rotated back to position 0 */
    double kv_energy;                  /* of the in-context K/V */
    double before[2], after[2];        /* non-probe energy before/after the correction at 10%, 30% */
    double before_w1, after_w1;        /* 10%, unit weights */
    double before_head, after_head;    /* 10%, weights per KV head */
    double before_pre, after_pre;      /* K 10%: the offset before RoPE */
    long tokens;
} brr_acc;

/* One context's two caches. */
typedef struct {
    ak_ctx *ctx;
    const ak_kv *full, *none;   /* the context computed in full, and with its chunks placed by `none` */
    ak_block_pool *pool;        /* theirs: the f32 scratch of the rotation comes from it */
    int check_layer;            /* the probes' ranking layer (>= 0) */
} brr_input;

/* Adds the chunk at positions [at, at + n) of in's caches into acc
 * (n_layer * 2 entries: layer l's K at 2 l, V at 2 l + 1); mean (NULL, or
 * n_layer * (2 K width + V width) floats) gets its mean residual, per layer
 * the K channels, the V channels, then the K channels of the residual
 * rotated back to position 0. Returns 0, or -1 with err set. */
int brr_add_chunk(const brr_input *in, int at, int n, brr_acc *acc, float *mean, ak_error *err);

/* Which offsets the oracle adds. */
typedef enum {
    BRR_ORACLE_POST_ROPE,   /* K (constant after RoPE) and V */
    BRR_ORACLE_PRE_ROPE,    /* K (constant before RoPE, rotated to each token) and V */
    BRR_ORACLE_V,           /* V only */
    BRR_ORACLE_K,           /* K only (after RoPE) */
    BRR_ORACLE_COUNT
} brr_oracle;

/* Corrects the chunk at [at, at + n) of kv (a `none` cache: a plain
 * sequence of its own blocks) by its mean residual mean (brr_add_chunk's
 * layout) at every layer and token, the sides mode names. V, and K after
 * RoPE: a correction range of weight 1 from layer 0 (kvcache.h
 * CORRECTIONS; nothing stored changes). K before RoPE: rotated to each
 * token's position and added to the stored keys (ak_kv_write: a quantized
 * format quantizes them again). Returns 0, or -1 with err set. */
int brr_apply_oracle(const brr_input *in, ak_kv *kv, int at, int n, const float *mean, brr_oracle mode,
                     ak_error *err);

/* Prints acc (n_layer * 2) as a table of one cache type named ct, with
 * rows "all" per side summing the layers from check_layer on (or, json,
 * the per-layer rows as JSON objects, comma-separated after the first when
 * *first is 0). */
void brr_print(const brr_acc *acc, int n_layer, int check_layer, const char *ct, int json, int *first);

#endif
