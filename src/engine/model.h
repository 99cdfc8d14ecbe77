/* LAYER engine/ (src/engine/): models and the forward pass, attention
 * statistics, calibration, reuse methods, synthetic models, perplexity.
 * Promises: one batched forward pass for prefill and decode of many
 * sequences, each token's logits and cache entries the same bits in any
 * batch; a model is read-only after load, so many threads share it.
 * Writes no file but synth's GGUF files and perplexity's KL base; knows no
 * agent or store.
 * May use: base, kernels, text, kv. Used by: store, agents, serve. The
 * table: scripts/check-layers.sh.
 *
 * model.h - architectures, weights and the forward pass.
 *
 * Supported architectures: `llama` (Llama 2 / 3.x, Mistral, SmolLM2,
 * TinyLlama, the stories models), `qwen2` (biases on q/k/v), `qwen3`
 * (per-head RMS norm of q and k before RoPE, no biases) and `gemma3` (text:
 * sliding-window layers with their own RoPE base, q/k norms, norms before
 * and after attention and FFN, GeGLU, embeddings scaled by sqrt(dim)) and
 * `deepseek2` (DeepSeek-V2-Lite: multi-head latent attention without a query
 * low-rank, mixture-of-experts FFN after leading dense layers). Weights are
 * memory-mapped from the GGUF file; nothing is copied but the small 1-D
 * tensors (norms, biases), which are kept as f32.
 *
 * The forward pass works on a batch of tokens, each with its own sequence
 * (KV cache) and position, so prefill of one prompt and decode of many agents
 * are the same call.
 */
#ifndef AK_MODEL_H
#define AK_MODEL_H

#include <stdint.h>

#include "base/gguf.h"
#include "kv/kvcache.h"
#include "base/threadpool.h"
#include "base/util.h"

typedef enum { AK_ARCH_LLAMA, AK_ARCH_QWEN2, AK_ARCH_QWEN3, AK_ARCH_GEMMA3, AK_ARCH_DEEPSEEK2 } ak_arch;
/* The FFN's gate activation: SwiGLU (silu(gate) * up) or GeGLU (gelu(gate) *
 * up, GELU's tanh approximation). */
typedef enum { AK_ACT_SILU, AK_ACT_GELU } ak_act;
/* How RoPE pairs the dimensions of a head: llama's (2i, 2i+1), or NeoX's
 * (i, i + rope_dim/2). llama.cpp picks per architecture; so do we. */
typedef enum { AK_ROPE_INTERLEAVED, AK_ROPE_NEOX } ak_rope_style;

typedef struct {
    ak_arch arch;
    char arch_name[32];
    char name[128];
    int dim;            /* embedding width */
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim;       /* dim / n_head unless the file says otherwise */
    int ffn;            /* hidden width of the SwiGLU FFN */
    int vocab;
    int n_ctx_train;
    int rope_dim;       /* rotated dimensions per head (<= head_dim) */
    float rope_base;
    float rms_eps;
    ak_rope_style rope_style;
    int rope_scaling_other; /* the file names a RoPE scaling other than none, linear or deepseek2's
                             * YaRN, which the forward pass does not apply: positions are then not a
                             * plain rotation (ak_model_shift_keys refuses) */
    float rope_mag;     /* YaRN (deepseek2): RoPE'd q and k are multiplied by this, else 1 */
    float yarn_factor;  /* YaRN: rope.scaling.factor (its frequency ramp is folded into inv_freq and its
                         * attention factor into attn_scale), 0: no YaRN */
    int yarn_orig_ctx;  /* YaRN: the original context its ramp is computed for */
    int tied_output;    /* output.weight absent: the embeddings are reused */
    int qkv_bias;
    int qk_norm;        /* per-head RMS norm of q and k before RoPE (qwen3, gemma3) */
    int post_norms;     /* RMS norm of the attention and FFN outputs before the residual add (gemma3) */
    ak_act act;
    float embd_scale;   /* input embeddings are multiplied by this (gemma3: sqrt(dim)), else 1 */
    float attn_scale;   /* scores are q . k * attn_scale (1/sqrt(head_dim) unless the file says otherwise) */
    int window;         /* sliding window of the local layers in positions, 0: none */
    int swa_pattern;    /* every swa_pattern-th layer (il % p == p - 1) is global, the others local */
    float rope_base_swa; /* RoPE base of the local layers */
    /* MLA (deepseek2): the cache holds, per token and layer, one "KV head"
     * of kv_lora normed latent floats then rope_dim RoPE'd key floats (K),
     * and the latent again (V); queries absorb the key up-projection and
     * the attention output the value one. head_dim is then the query head
     * (qk_nope + rope_dim), v_head the value head before attn_output. */
    int kv_lora;        /* latent width, 0: not MLA */
    int qk_nope;        /* un-rotated part of a query/key head */
    int v_head;         /* value head width */
    /* mixture of experts (deepseek2): layers >= n_dense_lead route each
     * token to n_expert_used of n_expert SwiGLU experts (expert_ffn wide),
     * weighted by their softmax router probability times expert_scale
     * (renormalised over the chosen ones when expert_norm), plus
     * n_expert_shared always-on experts (one SwiGLU n_expert_shared *
     * expert_ffn wide). n_expert 0: every layer dense. */
    int n_expert;
    int n_expert_used;
    int n_expert_shared;
    int expert_ffn;
    int n_dense_lead;
    float expert_scale;
    int expert_norm;
} ak_config;

typedef struct {
    const void *data;   /* rows of `type`, in the mapping */
    uint32_t type;
    int64_t rows;       /* output features */
    int64_t cols;       /* input features */
    const void *packed; /* the same matrix in the kernels' packed layout, or NULL */
} ak_weight;

typedef struct {
    float *attn_norm;   // (dim)
    ak_weight wq;       // (n_head * head_dim, dim)
    ak_weight wk;       // (n_head_kv * head_dim, dim); MLA: attn_kv_a_mqa (kv_lora + rope_dim, dim)
    ak_weight wv;       // (n_head_kv * head_dim, dim); MLA: unused (rows 0)
    float *bq;          // (n_head * head_dim)     qwen2 only, else NULL
    float *bk;          // (n_head_kv * head_dim)  qwen2 only
    float *bv;          // (n_head_kv * head_dim)  qwen2 only
    float *q_norm;      // (head_dim)  qk_norm only, else NULL
    float *k_norm;      // (head_dim)  qk_norm only
    float *kv_norm;     // (kv_lora)  MLA only: RMS norm of the latent
    ak_weight *k_b;     // (n_head) MLA only: (kv_lora, qk_nope) each, q_nope -> latent space
    ak_weight *v_b;     // (n_head) MLA only: (v_head, kv_lora) each, latent -> value head
    ak_weight wo;       // (dim, n_head * head_dim); MLA: (dim, n_head * v_head)
    float *post_attn_norm; // (dim)    post_norms only, else NULL
    float *ffn_norm;    // (dim)
    ak_weight w_gate;   // (ffn, dim); MoE layers: the shared experts' (n_expert_shared * expert_ffn, dim)
    ak_weight w_up;     // (ffn, dim); likewise
    ak_weight w_down;   // (dim, ffn); likewise
    ak_weight router;   // (n_expert, dim)  MoE layers only, else rows 0
    ak_weight *e_gate;  // (n_expert) (expert_ffn, dim) each, slices of one tensor; NULL: dense layer
    ak_weight *e_up;    // (n_expert) (expert_ffn, dim) each
    ak_weight *e_down;  // (n_expert) (dim, expert_ffn) each
    float *post_ffn_norm; // (dim)     post_norms only
    int window;         /* sliding window of this layer (positions), 0: it sees the whole sequence */
} ak_layer;

typedef struct {
    gguf_file gguf;
    ak_config cfg;
    ak_cache_spec spec;
    ak_weight tok_embd; // (vocab, dim)
    float *out_norm;    // (dim)
    ak_weight output;   // (vocab, dim); the embeddings when tied
    ak_layer *layers;   // (n_layer)
    float *inv_freq;    // (rope_dim / 2) RoPE inverse frequencies, Llama-3 factors applied
    float *inv_freq_swa; // (rope_dim / 2) those of the sliding-window layers, or NULL (no window)
    size_t weight_bytes;
    void *packed_mem;   /* one mapping for every ak_weight.packed copy, or NULL */
    size_t packed_bytes;    /* its length */
    char fingerprint[17];   /* hex XXH64 identifying weights + tokenizer, see ak_model_load */
} ak_model;

/* Called with the fraction done while a long operation runs (may be NULL). */
typedef void (*ak_progress_fn)(void *ud, double frac);

/* Opens path, validates architecture, hyperparameters and every tensor's type
 * and shape, and pages the weights in (progress reported through cb). Returns
 * NULL and sets err ("PATH: problem") on failure. */
ak_model *ak_model_load(const char *path, ak_progress_fn cb, void *ud, ak_error *err);
void ak_model_free(ak_model *m);

/* A batch: token i is at position pos[i] of sequence seq[i]; its logits are
 * computed when logits_out[i] is not NULL (vocab floats). */
typedef struct {
    int n;
    const int32_t *token;
    const int32_t *pos;
    ak_kv *const *seq;
    float *const *logits_out;
} ak_batch;

/* Scratch for forward passes of up to max_batch tokens and the thread pool.
 * One context is used by one thread at a time. */
typedef struct ak_ctx ak_ctx;

ak_ctx *ak_ctx_new(const ak_model *m, int max_batch, int n_threads, ak_error *err);
void ak_ctx_free(ak_ctx *c);
int ak_ctx_max_batch(const ak_ctx *c);
ak_threads *ak_ctx_pool(ak_ctx *c);
const ak_model *ak_ctx_model(const ak_ctx *c);

/* POSITION OFFSET. A context runs every token whose cache slot is s with
 * RoPE position s + offset (default 0): a sequence computed with offset d
 * holds the keys it would hold at positions [d, d + n), in slots [0, n).
 * Slots still decide everything else (the causal mask, sliding windows, the
 * cache capacity); since RoPE attention depends only on the difference of
 * two positions, only the keys' absolute rotation changes. This lets a
 * cache whose keys were shifted by d (ak_model_shift_keys) be continued as
 * if it had been computed d positions later. Any int is accepted; slot +
 * offset must stay representable. */
void ak_ctx_set_pos_offset(ak_ctx *c, int offset);
int ak_ctx_pos_offset(const ak_ctx *c);

/* ATTENTION STATISTICS (attnstats.h). While st is attached, every forward
 * pass of this context also accumulates into st the exact attention
 * probabilities of st's layers; NULL (the default) detaches, and then the
 * forward pass does nothing more than test the pointer. The logits are the
 * same bits with or without st. st must outlive its attachment and belong
 * to this context's model. */
typedef struct ak_attn_stats ak_attn_stats;
void ak_ctx_set_attn_stats(ak_ctx *c, ak_attn_stats *st);

/* Runs the model on a batch (n <= max_batch). Writes each token's K/V into its
 * sequence, attends over positions [0, pos] of that sequence, and fills the
 * requested logits. Tokens of one sequence must come in increasing positions
 * with no gap after what the sequence holds. Returns 0, or -1 with err set
 * (token id out of range, position past a cache's capacity, ...). */
int ak_forward(ak_ctx *c, const ak_batch *b, ak_error *err);

/* What ak_eval runs and what it hands back. */
typedef struct {
    const int32_t *tokens;     /* tokens[0..n) */
    int n;
    int pos0;                  /* the position of tokens[0] */
    float *logits;             /* the last token's logits (vocab floats), or NULL */
    float *all_logits;         /* every token's (n x vocab), or NULL */
    ak_progress_fn progress;   /* told the fraction done after each batch, or NULL */
    void *ud;                  /* progress's */
} ak_eval_args;

/* Convenience: prefill/decode a->tokens of one sequence starting at
 * a->pos0 (in chunks of max_batch), with the logits a asks for. Returns 0,
 * or -1 with err set (as ak_forward). */
int ak_eval(ak_ctx *c, ak_kv *kv, const ak_eval_args *a, ak_error *err);

/* LAYER RANGES (reuse.h: CacheBlend and AgentKVShift run chosen tokens
 * through some layers only). The residual stream x of a batch (b->n x
 * dim floats) is the caller's: ak_model_embed gives the stream entering
 * layer 0 (the embeddings, scaled as the forward pass scales them);
 * ak_forward_layers runs the batch through layers [l0, l1) in place, the
 * same arithmetic as ak_forward's layers (so embed + [0, a) + [a, L)
 * computes ak_forward's bits); ak_layer_kv gives the K/V that layer l
 * would store for the batch from the stream entering it, writing nothing.
 * Not for multi-head latent attention (AK_ERR_INVALID).
 *
 * In ak_forward_layers each token writes its K/V at its position of its
 * sequence, at each layer of the range, and attends over positions [0,
 * pos] of the sequence as the cache then holds them at that layer (the
 * batch's earlier positions written first): causal by position. Positions
 * need not be contiguous: a position below the sequence's length is
 * written again (a recomputed token), one at or past it must follow with
 * no gap, as in ak_forward. When l1 is the last layer, the tokens with a
 * logits_out entry get their logits (logits_out may be NULL). Returns 0,
 * or -1 with err set (batch size, ids, positions, budget). */
int ak_model_embed(ak_ctx *c, const int32_t *tokens, int n, float *x, ak_error *err);
int ak_forward_layers(ak_ctx *c, const ak_batch *b, float *x, int l0, int l1, ak_error *err);
/* k (b->n x n_head_kv * head_dim_k) and v (likewise head_dim_v): keys
 * RoPE'd at the token's position (plus the context's offset) as written
 * by the forward pass. b->seq and b->logits_out are not used. Returns 0,
 * or -1 with err set. */
int ak_layer_kv(ak_ctx *c, const ak_batch *b, const float *x, int l, float *k, float *v, ak_error *err);

/* POSITION SHIFT. Re-rotates the stored keys of positions [from, to) of kv,
 * every layer and KV head, as if each token had been computed delta
 * positions later: RoPE rotates each pair of a key by an angle proportional
 * to its position, R(p + delta) = R(delta) R(p), so the stored (post-RoPE)
 * key is rotated by R(delta) with the model's own RoPE definition of that
 * layer (its inverse frequencies: per-layer base of gemma3's local layers,
 * Llama-3 factors, linear scaling; partial rotary dims; interleaved or NeoX
 * pairs; for MLA only the rope part of the cached key, the latent is not
 * positional). Values are untouched. Keys are read as attention sees them
 * (dequantized, un-centered) and written back through ak_kv_write, which
 * re-centers and re-quantizes: exact to f32 rounding for f32 caches (the
 * rotation angle is the forward pass's float delta * inv_freq, so the
 * result differs from computing at p + delta directly by the float
 * rounding of the angles, about ulp((p + delta) * inv_freq)); a quantized
 * key format adds one more quantization of each key.
 *
 * Refused (AK_ERR_INVALID, nothing changed): a model without RoPE (rope
 * dims 0: its keys carry no rotation this could adjust), positions outside
 * [0, length) of kv or from > to, positions in a shared base (ak_kv_base_len:
 * those blocks belong to a pool and other sequences). Blocks the sequence
 * shares copy-on-write (forks, the content index) are copied first, as any
 * write does (ak_kv_prepare; AK_ERR_KV_BUDGET if the budget cannot hold the
 * copies), so no other sequence sees the shift. deepseek2's YaRN shifts
 * like any RoPE (its angles are linear in the position; its magnitude is in
 * the stored key and is not applied again); other RoPE scalings the forward
 * pass does not run (rope_scaling_other) are refused.
 * Returns 0, or -1 with err set. */
int ak_model_shift_keys(const ak_model *m, ak_kv *kv, int from, int to, int delta, ak_error *err);

#endif
