/* model_load.c - loading a GGUF model (ak_model_load, ak_model_free; see
 * model.h): the architecture's metadata into ak_config and the cache
 * geometry, every tensor found, shape-checked and typed into ak_weight /
 * ak_layer (matrices point into the mapping; norms and biases are copied as
 * f32), the RoPE inverse frequencies (linear, per-frequency and YaRN
 * scaling), the fingerprint, and the packed copy of the weights the kernels
 * multiply fastest (kernels.h), made once here so that the forward pass
 * (forward.c) only reads. A failure leaves nothing allocated and sets err;
 * the loaded model is read-only from then on.
 */
#include "engine/model.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <xxhash.h>

#include "kernels/kernels.h"

/* Reads "{arch}.suffix" as u32 into *out; absent -> def (or error if def < 0). */
static int arch_u32(const ak_model *m, const char *suffix, int def, int *out, ak_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->cfg.arch_name, suffix);
    if (!gguf_find(&m->gguf, key)) {
        if (def < 0) return ak_fail(err, "%s: missing metadata key '%s'", m->gguf.path, key);
        *out = def;
        return 0;
    }
    uint32_t v;
    if (gguf_get_u32(&m->gguf, key, &v, err) < 0) return -1;
    if (v > (1u << 24)) return ak_fail(err, "%s: '%s' = %u is absurd", m->gguf.path, key, v);
    *out = (int)v;
    return 0;
}

/* Reads "{arch}.suffix" as f32 into *out; absent -> def. */
static int arch_f32(const ak_model *m, const char *suffix, float def, float *out, ak_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->cfg.arch_name, suffix);
    if (!gguf_find(&m->gguf, key)) { *out = def; return 0; }
    return gguf_get_f32(&m->gguf, key, out, err);
}

/* Finds a 2-D weight of shape (rows, cols) in a type the kernels compute with. */
static int get_weight(ak_model *m, const char *name, int64_t rows, int64_t cols, ak_weight *w, ak_error *err) {
    const gguf_tensor *t = gguf_find_tensor(&m->gguf, name);
    if (!t) return ak_fail(err, "%s: missing tensor '%s'", m->gguf.path, name);
    if (t->ne[0] != (uint64_t)cols || t->ne[1] != (uint64_t)rows || t->ne[2] != 1 || t->ne[3] != 1)
        return ak_fail(err, "%s: tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]", m->gguf.path, name,
                       (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (long long)cols, (long long)rows);
    if (!ak_wtype_supported(t->type))
        return ak_fail(err, "%s: tensor '%s' has type %s, which this engine does not compute with", m->gguf.path,
                       name, gguf_tensor_type_name(t->type));
    w->data = t->data;
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    m->weight_bytes += t->nbytes;
    return 0;
}

/* Finds a 3-D tensor of n matrices of shape (rows, cols) (experts, or
 * per-head projections) and returns them as n weights that point into it,
 * in a new array. Returns NULL with err set when absent, misshapen or of a
 * type the kernels do not compute with. */
static ak_weight *get_weights3(ak_model *m, const char *name, int64_t n, int64_t rows, int64_t cols, ak_error *err) {
    const gguf_tensor *t = gguf_find_tensor(&m->gguf, name);
    if (!t) { ak_fail(err, "%s: missing tensor '%s'", m->gguf.path, name); return NULL; }
    if (t->ne[0] != (uint64_t)cols || t->ne[1] != (uint64_t)rows || t->ne[2] != (uint64_t)n || t->ne[3] != 1) {
        ak_fail(err, "%s: tensor '%s' has shape [%llu, %llu, %llu], expected [%lld, %lld, %lld]", m->gguf.path, name,
                (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                (long long)cols, (long long)rows, (long long)n);
        return NULL;
    }
    if (!ak_wtype_supported(t->type)) {
        ak_fail(err, "%s: tensor '%s' has type %s, which this engine does not compute with", m->gguf.path, name,
                gguf_tensor_type_name(t->type));
        return NULL;
    }
    ak_weight *w = ak_calloc(n, sizeof *w, err);
    if (!w) return NULL;
    size_t mat = ak_row_bytes(t->type, cols) * (size_t)rows;
    for (int64_t i = 0; i < n; i++) {
        w[i].data = (const uint8_t *)t->data + mat * i;
        w[i].type = t->type;
        w[i].rows = rows;
        w[i].cols = cols;
    }
    m->weight_bytes += t->nbytes;
    return w;
}

/* Copies a 1-D tensor of n elements (F32 or F16) into a new f32 array. */
static float *get_vec(ak_model *m, const char *name, int64_t n, int optional, ak_error *err) {
    const gguf_tensor *t = gguf_find_tensor(&m->gguf, name);
    if (!t) {
        if (!optional) ak_fail(err, "%s: missing tensor '%s'", m->gguf.path, name);
        return NULL;
    }
    if (t->ne[0] != (uint64_t)n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1) {
        ak_fail(err, "%s: tensor '%s' has %llu x %llu elements, expected %lld", m->gguf.path, name,
                (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (long long)n);
        return NULL;
    }
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && t->type != GGML_TYPE_BF16) {
        ak_fail(err, "%s: tensor '%s' has type %s, expected F32", m->gguf.path, name, gguf_tensor_type_name(t->type));
        return NULL;
    }
    float *v = ak_malloc(n * sizeof(float), err);
    if (v) ak_dequantize_row(t->type, t->data, v, n);
    return v;
}

/* The per-layer form of "{arch}.attention.sliding_window_pattern": an array
 * of n_layer booleans, true for a sliding-window layer. Returns its elements,
 * or NULL when the key is absent or a single number (err untouched then). */
static const uint8_t *swa_layers(const ak_model *m, ak_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", m->cfg.arch_name);
    const gguf_kv *kv = gguf_find(&m->gguf, key);
    if (!kv || kv->type != GGUF_TYPE_ARRAY) return NULL;
    if (kv->v.arr.type != GGUF_TYPE_BOOL || kv->v.arr.count != (uint64_t)m->cfg.n_layer) {
        ak_fail(err, "%s: '%s' is an array of %llu elements of type %u, expected %d booleans", m->gguf.path, key,
                (unsigned long long)kv->v.arr.count, kv->v.arr.type, m->cfg.n_layer);
        return NULL;
    }
    return kv->v.arr.data;
}

/* deepseek2's attention and FFN hyperparameters. The file's key_length and
 * value_length (dk, dv) are those of the latent cache llama.cpp keeps
 * (kv_lora_rank + rope dims, kv_lora_rank); the per-head sizes are the
 * "_mla" keys. Files of the older layout (one attn_kv_b tensor, per-head
 * key_length) fail later on the missing attn_k_b tensor. Sets head_dim,
 * rope_dim, kv_lora, qk_nope, v_head, n_head_kv (1: the latent is shared
 * by every head) and the MoE fields. Returns 0, or -1 with err set (query
 * compression, sigmoid gating or YaRN scaling, which are not implemented,
 * or inconsistent sizes). */
static int load_deepseek2(ak_model *m, int dk, int dv, ak_error *err) {
    ak_config *c = &m->cfg;
    int q_lora, gating, norm = 0;
    if (arch_u32(m, "attention.kv_lora_rank", -1, &c->kv_lora, err) < 0) return -1;
    if (arch_u32(m, "attention.q_lora_rank", 0, &q_lora, err) < 0) return -1;
    if (arch_u32(m, "attention.key_length_mla", dk, &c->head_dim, err) < 0) return -1;
    if (arch_u32(m, "attention.value_length_mla", dv, &c->v_head, err) < 0) return -1;
    if (arch_u32(m, "rope.dimension_count", -1, &c->rope_dim, err) < 0) return -1;
    if (arch_u32(m, "leading_dense_block_count", 0, &c->n_dense_lead, err) < 0) return -1;
    if (arch_u32(m, "expert_count", 0, &c->n_expert, err) < 0) return -1;
    if (arch_u32(m, "expert_used_count", 0, &c->n_expert_used, err) < 0) return -1;
    if (arch_u32(m, "expert_shared_count", 0, &c->n_expert_shared, err) < 0) return -1;
    if (arch_u32(m, "expert_feed_forward_length", 0, &c->expert_ffn, err) < 0) return -1;
    if (arch_u32(m, "expert_gating_func", 1, &gating, err) < 0) return -1;
    if (arch_f32(m, "expert_weights_scale", 1.0f, &c->expert_scale, err) < 0) return -1;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_weights_norm", c->arch_name);
    if (gguf_find(&m->gguf, key) && gguf_get_bool(&m->gguf, key, &norm, err) < 0) return -1;
    c->expert_norm = norm != 0;
    if (q_lora != 0)
        return ak_failc(err, AK_ERR_INVALID, "%s: deepseek2 with query compression (q_lora_rank %d) is not supported",
                        m->gguf.path, q_lora);
    if (gating != 1)
        return ak_failc(err, AK_ERR_INVALID, "%s: deepseek2 expert_gating_func %d is not supported (1: softmax)",
                        m->gguf.path, gating);
    /* YaRN is applied by load_yarn; linear scaling, which llama.cpp's
     * deepseek2 graph would combine with YaRN's attention factor, is not */
    snprintf(key, sizeof key, "%s.rope.scaling.type", c->arch_name);
    gguf_str st;
    if (gguf_find(&m->gguf, key) && gguf_get_str(&m->gguf, key, &st, NULL) == 0 && !gguf_str_eq(st, "none") &&
        !gguf_str_eq(st, "yarn"))
        return ak_failc(err, AK_ERR_INVALID, "%s: deepseek2 RoPE scaling '%.*s' is not supported (none or yarn)",
                        m->gguf.path, (int)(st.len > 16 ? 16 : st.len), st.data);
    c->qk_nope = c->head_dim - c->rope_dim;
    c->n_head_kv = 1;
    if (c->kv_lora <= 0 || c->rope_dim <= 0 || c->rope_dim % 2 || c->qk_nope <= 0 || c->v_head <= 0 ||
        (c->n_expert && (c->n_expert_used < 1 || c->n_expert_used > c->n_expert || c->expert_ffn < 1)) ||
        c->n_expert > 4096 || !(c->expert_scale > 0))
        return ak_fail(err, "%s: inconsistent deepseek2 sizes (kv_lora %d, head %d, rope %d, v head %d, experts %d/%d "
                       "of %d)", m->gguf.path, c->kv_lora, c->head_dim, c->rope_dim, c->v_head, c->n_expert_used,
                       c->n_expert, c->expert_ffn);
    if (c->n_expert == 0) c->n_dense_lead = c->n_layer;
    return 0;
}

/* The architecture and its hyperparameters from the metadata into m->cfg,
 * and the cache geometry into m->spec. Returns 0, or -1 with err set
 * (unsupported architecture, missing or inconsistent keys). */
static int load_config(ak_model *m, ak_error *err) {
    ak_config *c = &m->cfg;
    gguf_str arch;
    if (gguf_get_str(&m->gguf, "general.architecture", &arch, err) < 0) return -1;
    if (gguf_str_eq(arch, "llama")) c->arch = AK_ARCH_LLAMA;
    else if (gguf_str_eq(arch, "qwen2")) c->arch = AK_ARCH_QWEN2;
    else if (gguf_str_eq(arch, "qwen3")) c->arch = AK_ARCH_QWEN3;
    else if (gguf_str_eq(arch, "gemma3")) c->arch = AK_ARCH_GEMMA3;
    else if (gguf_str_eq(arch, "deepseek2")) c->arch = AK_ARCH_DEEPSEEK2;
    else
        return ak_failc(err, AK_ERR_INVALID,
                        "%s: unsupported architecture '%.*s' (llama, qwen2, qwen3, gemma3 and deepseek2 are supported)",
                        m->gguf.path, (int)(arch.len > 32 ? 32 : arch.len), arch.data);
    snprintf(c->arch_name, sizeof c->arch_name, "%.*s", (int)arch.len, arch.data);
    gguf_str name;
    if (gguf_find(&m->gguf, "general.name") && gguf_get_str(&m->gguf, "general.name", &name, NULL) == 0)
        snprintf(c->name, sizeof c->name, "%.*s", (int)(name.len > 120 ? 120 : name.len), name.data);
    if (arch_u32(m, "embedding_length", -1, &c->dim, err) < 0) return -1;
    if (arch_u32(m, "block_count", -1, &c->n_layer, err) < 0) return -1;
    if (arch_u32(m, "attention.head_count", -1, &c->n_head, err) < 0) return -1;
    if (arch_u32(m, "attention.head_count_kv", c->n_head, &c->n_head_kv, err) < 0) return -1;
    if (arch_u32(m, "feed_forward_length", -1, &c->ffn, err) < 0) return -1;
    if (arch_u32(m, "context_length", 2048, &c->n_ctx_train, err) < 0) return -1;
    if (c->dim <= 0 || c->n_layer <= 0 || c->n_head <= 0 || c->n_head_kv <= 0 || c->ffn <= 0)
        return ak_fail(err, "%s: hyperparameters must be positive (dim %d, layers %d, heads %d, kv heads %d, ffn %d)",
                       m->gguf.path, c->dim, c->n_layer, c->n_head, c->n_head_kv, c->ffn);
    if (c->n_head % c->n_head_kv)
        return ak_fail(err, "%s: %d heads is not a multiple of %d KV heads", m->gguf.path, c->n_head, c->n_head_kv);
    int hd_default = c->dim % c->n_head == 0 ? c->dim / c->n_head : -1;
    int dk, dv;
    if (arch_u32(m, "attention.key_length", hd_default, &dk, err) < 0) return -1;
    if (arch_u32(m, "attention.value_length", dk, &dv, err) < 0) return -1;
    if (c->arch == AK_ARCH_DEEPSEEK2) {
        if (load_deepseek2(m, dk, dv, err) < 0) return -1;
        dk = dv = c->head_dim;   /* the query head; the cache's dims are set below */
    }
    if (dk != dv || dk <= 0 || dk % 2)
        return ak_fail(err, "%s: head dims K %d / V %d are not supported (equal and even)", m->gguf.path, dk, dv);
    c->head_dim = dk;
    if (arch_u32(m, "rope.dimension_count", c->head_dim, &c->rope_dim, err) < 0) return -1;
    if (c->rope_dim > c->head_dim || c->rope_dim % 2)
        return ak_fail(err, "%s: rope.dimension_count %d is invalid for head dim %d", m->gguf.path, c->rope_dim,
                       c->head_dim);
    if (arch_f32(m, "rope.freq_base", 10000.0f, &c->rope_base, err) < 0) return -1;
    if (arch_f32(m, "attention.layer_norm_rms_epsilon", 1e-5f, &c->rms_eps, err) < 0) return -1;
    if (!(c->rope_base > 0) || !(c->rms_eps >= 0))
        return ak_fail(err, "%s: invalid rope.freq_base %g or rms epsilon %g", m->gguf.path, c->rope_base, c->rms_eps);
    /* llama.cpp rotates deepseek2's rope dims as interleaved pairs too */
    c->rope_style = c->arch == AK_ARCH_LLAMA || c->arch == AK_ARCH_DEEPSEEK2 ? AK_ROPE_INTERLEAVED : AK_ROPE_NEOX;
    c->qkv_bias = c->arch == AK_ARCH_QWEN2;
    c->qk_norm = c->arch == AK_ARCH_QWEN3 || c->arch == AK_ARCH_GEMMA3;
    c->post_norms = c->arch == AK_ARCH_GEMMA3;
    c->act = c->arch == AK_ARCH_GEMMA3 ? AK_ACT_GELU : AK_ACT_SILU;
    c->embd_scale = c->arch == AK_ARCH_GEMMA3 ? sqrtf((float)c->dim) : 1.0f;
    /* the query scale: the file's attention.scale when it has one; Gemma 3
     * 27B was trained with 1/sqrt(dim / n_head) (query_pre_attn_scalar 168,
     * not its head size 128), which its files do not record: llama.cpp
     * recognises it by its 62 layers, and so do we */
    float hd_scale = 1.0f / sqrtf((float)c->head_dim);
    if (c->arch == AK_ARCH_GEMMA3 && c->n_layer == 62) hd_scale = 1.0f / sqrtf((float)(c->dim / c->n_head));
    if (arch_f32(m, "attention.scale", hd_scale, &c->attn_scale, err) < 0) return -1;
    if (!(c->attn_scale > 0))
        return ak_fail(err, "%s: invalid attention.scale %g", m->gguf.path, c->attn_scale);
    c->window = 0;
    c->rope_mag = 1.0f;   /* YaRN (load_yarn) changes it */
    c->swa_pattern = 1;
    c->rope_base_swa = c->rope_base;
    if (c->arch == AK_ARCH_GEMMA3) {
        /* local layers see the last `window` positions; every 6th layer is
         * global unless the file gives another pattern */
        if (arch_u32(m, "attention.sliding_window", -1, &c->window, err) < 0) return -1;
        char pk[128];
        snprintf(pk, sizeof pk, "%s.attention.sliding_window_pattern", c->arch_name);
        const gguf_kv *pkv = gguf_find(&m->gguf, pk);
        if (pkv && pkv->type == GGUF_TYPE_ARRAY) {   /* per-layer flags: checked here, used per layer */
            if (!swa_layers(m, err)) return -1;
        } else if (arch_u32(m, "attention.sliding_window_pattern", 6, &c->swa_pattern, err) < 0) {
            return -1;
        }
        if (arch_f32(m, "rope.freq_base_swa", 10000.0f, &c->rope_base_swa, err) < 0) return -1;
        if (c->window < 1 || c->swa_pattern < 1 || !(c->rope_base_swa > 0))
            return ak_fail(err, "%s: invalid sliding window %d, pattern %d or RoPE base %g", m->gguf.path, c->window,
                           c->swa_pattern, c->rope_base_swa);
    }
    const gguf_tensor *emb = gguf_find_tensor(&m->gguf, "token_embd.weight");
    if (!emb) return ak_fail(err, "%s: missing tensor 'token_embd.weight'", m->gguf.path);
    if (emb->ne[1] < 1 || emb->ne[1] > (1u << 24))
        return ak_fail(err, "%s: token_embd.weight has an absurd vocabulary of %llu", m->gguf.path,
                       (unsigned long long)emb->ne[1]);
    c->vocab = (int)emb->ne[1];
    c->tied_output = gguf_find_tensor(&m->gguf, "output.weight") == NULL;

    m->spec.n_layer = c->n_layer;
    m->spec.n_head_kv = c->n_head_kv;
    m->spec.head_dim_k = c->kv_lora ? c->kv_lora + c->rope_dim : c->head_dim;
    m->spec.head_dim_v = c->kv_lora ? c->kv_lora : c->head_dim;
    m->spec.n_ctx = c->n_ctx_train;
    return 0;
}

/* The most RoPE pairs a YaRN head may have (a stack table in load_weights). */
#define AK_MAX_ROPE_HALF 512

/* One YaRN correction bound: the pair index whose wavelength fits n_rot
 * turns into the original context, for rope_dim dims of base `base`. */
static float yarn_corr_dim(int rope_dim, int n_orig, float n_rot, float base) {
    return rope_dim * logf(n_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

/* YaRN RoPE scaling of a deepseek2 file, as llama.cpp runs those files (so
 * that DeepSeek-V2(-Lite)'s real GGUFs compute what llama.cpp computes):
 * rope.scaling.factor s, rope.scaling.original_context_length n_orig
 * (default context_length), rope.scaling.yarn_log_multiplier L (the file
 * stores 0.1 x mscale_all_dim; M = L / 0.1), rope.scaling.attn_factor r
 * (default 1); beta_fast 32 and beta_slow 1 (llama.cpp reads no keys for
 * them on deepseek2).
 * - Frequencies: pair i of rope_dim has the wavelength of base^(-2i/R);
 *   with low = max(0, floor(corr(32))), high = min(R - 1, ceil(corr(1)))
 *   (corr: yarn_corr_dim) and ramp_i = 1 - clamp((i - low) / max(0.001,
 *   high - low), 0, 1), the angle is theta * (ramp_i + (1 - ramp_i) / s):
 *   high frequencies extrapolate, low ones interpolate. mult[i] (rope_dim / 2
 *   floats) receives that factor.
 * - Magnitude: RoPE'd q and k are multiplied by mag = A (1 + 0.1 ln s) with
 *   A = a0 r / (1 + 0.1 ln s), a0 = 1 when M != 0 (mscale = mscale_all_dim,
 *   llama.cpp's deepseek2 case), else 1 + 0.1 ln s; cfg.rope_mag = mag.
 * - Attention: the score scale is (mag (1 + 0.1 M ln s))^2 / sqrt(head
 *   size): cfg.attn_scale is multiplied by that square.
 * The factors are computed in float in llama.cpp's order. Returns 0, or -1
 * with err set (AK_ERR_INVALID: a factor below 1, an original context of 0,
 * values that are not finite). */
static int load_yarn(ak_model *m, float *mult, ak_error *err) {
    ak_config *c = &m->cfg;
    float s, log_mul, r;
    int n_orig;
    if (arch_f32(m, "rope.scaling.factor", 1.0f, &s, err) < 0) return -1;
    if (arch_u32(m, "rope.scaling.original_context_length", c->n_ctx_train, &n_orig, err) < 0) return -1;
    if (arch_f32(m, "rope.scaling.yarn_log_multiplier", 0.0f, &log_mul, err) < 0) return -1;
    if (arch_f32(m, "rope.scaling.attn_factor", 1.0f, &r, err) < 0) return -1;
    if (s == 0.0f) s = 1.0f;    /* llama.cpp: a factor of 0 means none */
    if (!(s >= 1.0f) || !isfinite(s) || n_orig <= 0 || !isfinite(log_mul) || !(r > 0) || !isfinite(r))
        return ak_failc(err, AK_ERR_INVALID, "%s: invalid YaRN scaling (factor %g, original context %d, log "
                        "multiplier %g, attention factor %g)", m->gguf.path, s, n_orig, log_mul, r);
    const float fs = 1.0f / s, M = log_mul / 0.1f, beta_fast = 32.0f, beta_slow = 1.0f;
    const int R = c->rope_dim, half = R / 2;
    float low = floorf(yarn_corr_dim(R, n_orig, beta_fast, c->rope_base));
    float high = ceilf(yarn_corr_dim(R, n_orig, beta_slow, c->rope_base));
    if (low < 0) low = 0;
    if (high > R - 1) high = (float)(R - 1);
    for (int i = 0; i < half; i++) {
        float y = (i - low) / fmaxf(0.001f, high - low);
        float ramp = 1.0f - fminf(1.0f, fmaxf(0.0f, y));
        mult[i] = fs * (1.0f - ramp) + ramp;
    }
    float ln_s = logf(1.0f / fs);
    float a0 = M != 0.0f ? 1.0f : (s <= 1.0f ? 1.0f : 0.1f * logf(s) + 1.0f);
    float a = a0 * (1.0f / (1.0f + 0.1f * logf(s))) * r;
    float mag = a * (1.0f + 0.1f * ln_s);
    float ms = mag * (1.0f + 0.1f * M * ln_s);
    c->rope_mag = mag;
    c->attn_scale *= ms * ms;
    c->yarn_factor = s;
    c->yarn_orig_ctx = n_orig;
    return 0;
}

/* Every tensor of m->cfg's architecture into m (matrices pointing into
 * the mapping, 1-D tensors copied as f32) and the RoPE inverse frequencies.
 * Returns 0, or -1 with err set; what was allocated is freed by
 * ak_model_free. */
static int load_weights(ak_model *m, ak_error *err) {
    const ak_config *c = &m->cfg;
    int64_t qd = (int64_t)c->n_head * c->head_dim, kvd = (int64_t)c->n_head_kv * c->head_dim;
    if (get_weight(m, "token_embd.weight", c->vocab, c->dim, &m->tok_embd, err) < 0) return -1;
    if (c->tied_output) m->output = m->tok_embd;
    else if (get_weight(m, "output.weight", c->vocab, c->dim, &m->output, err) < 0) return -1;
    if (!(m->out_norm = get_vec(m, "output_norm.weight", c->dim, 0, err))) return -1;
    /* every layer has tensors of its own: a block count beyond the file's
     * tensors is a lie, and believing it costs memory and time per layer */
    if ((uint64_t)c->n_layer > m->gguf.n_tensors)
        return ak_failc(err, AK_ERR_INVALID, "%s: %d layers, but the file holds only %llu tensors", m->gguf.path,
                        c->n_layer, (unsigned long long)m->gguf.n_tensors);
    m->layers = ak_calloc(c->n_layer, sizeof(ak_layer), err);
    if (!m->layers) return -1;
    for (int l = 0; l < c->n_layer; l++) {
        ak_layer *L = &m->layers[l];
        char n[96];
#define W(field, suffix, rows, cols)                                     \
        snprintf(n, sizeof n, "blk.%d.%s", l, suffix);                   \
        if (get_weight(m, n, rows, cols, &L->field, err) < 0) return -1;
#define V(field, suffix, len, opt)                                       \
        snprintf(n, sizeof n, "blk.%d.%s", l, suffix);                   \
        L->field = get_vec(m, n, len, opt, err);                         \
        if (!L->field && !(opt)) return -1;
#define W3(field, suffix, cnt, rows, cols)                               \
        snprintf(n, sizeof n, "blk.%d.%s", l, suffix);                   \
        if (!(L->field = get_weights3(m, n, cnt, rows, cols, err))) return -1;
        V(attn_norm, "attn_norm.weight", c->dim, 0)
        W(wq, "attn_q.weight", qd, c->dim)
        if (c->kv_lora) {   /* MLA: the latent and rope key, and the per-head up-projections */
            W(wk, "attn_kv_a_mqa.weight", c->kv_lora + c->rope_dim, c->dim)
            V(kv_norm, "attn_kv_a_norm.weight", c->kv_lora, 0)
            W3(k_b, "attn_k_b.weight", c->n_head, c->kv_lora, c->qk_nope)
            W3(v_b, "attn_v_b.weight", c->n_head, c->v_head, c->kv_lora)
            W(wo, "attn_output.weight", c->dim, (int64_t)c->n_head * c->v_head)
        } else {
            W(wk, "attn_k.weight", kvd, c->dim)
            W(wv, "attn_v.weight", kvd, c->dim)
            W(wo, "attn_output.weight", c->dim, qd)
        }
        V(ffn_norm, "ffn_norm.weight", c->dim, 0)
        if (c->qk_norm) {
            V(q_norm, "attn_q_norm.weight", c->head_dim, 0)
            V(k_norm, "attn_k_norm.weight", c->head_dim, 0)
        }
        if (c->post_norms) {
            V(post_attn_norm, "post_attention_norm.weight", c->dim, 0)
            V(post_ffn_norm, "post_ffw_norm.weight", c->dim, 0)
        }
        /* llama.cpp's pattern: layer l is local unless l % p == p - 1, or
         * the file's per-layer flags */
        const uint8_t *swa = c->window > 0 ? swa_layers(m, NULL) : NULL;
        int local = swa ? swa[l] != 0 : l % c->swa_pattern < c->swa_pattern - 1;
        L->window = c->window > 0 && local ? c->window : 0;
        /* the cache's layer groups (cachespec.h) */
        if (L->window && l < AK_KV_MAX_LAYERS) {
            m->spec.window = c->window;
            m->spec.local[l] = 1;
        }
        if (c->n_expert && l >= c->n_dense_lead) {
            int sh = c->n_expert_shared * c->expert_ffn;
            W(router, "ffn_gate_inp.weight", c->n_expert, c->dim)
            W3(e_gate, "ffn_gate_exps.weight", c->n_expert, c->expert_ffn, c->dim)
            W3(e_up, "ffn_up_exps.weight", c->n_expert, c->expert_ffn, c->dim)
            W3(e_down, "ffn_down_exps.weight", c->n_expert, c->dim, c->expert_ffn)
            if (sh) {
                W(w_gate, "ffn_gate_shexp.weight", sh, c->dim)
                W(w_up, "ffn_up_shexp.weight", sh, c->dim)
                W(w_down, "ffn_down_shexp.weight", c->dim, sh)
            }
        } else {
            W(w_gate, "ffn_gate.weight", c->ffn, c->dim)
            W(w_up, "ffn_up.weight", c->ffn, c->dim)
            W(w_down, "ffn_down.weight", c->dim, c->ffn)
        }
        if (c->qkv_bias) {
            V(bq, "attn_q.bias", qd, 0)
            V(bk, "attn_k.bias", kvd, 0)
            V(bv, "attn_v.bias", kvd, 0)
        }
#undef W
#undef W3
#undef V
    }
    /* RoPE: theta_i = pos * base^(-2i/rope_dim) / factor_i, with Llama-3.x's
     * per-frequency factors when the file has rope_freqs.weight, and / s for
     * linear scaling by s (rope.scaling.type "linear", rope.scaling.factor s;
     * Gemma 3 scales its global layers only). Sliding-window layers have a
     * base of their own. */
    int half = c->rope_dim / 2;
    m->inv_freq = ak_malloc(half * sizeof(float), err);
    if (!m->inv_freq) return -1;
    if (c->window > 0 && !(m->inv_freq_swa = ak_malloc(half * sizeof(float), err))) return -1;
    float *factors = NULL;
    if (gguf_find_tensor(&m->gguf, "rope_freqs.weight")) {
        factors = get_vec(m, "rope_freqs.weight", half, 0, err);
        if (!factors) return -1;
    }
    float linear = 1.0f;
    char key[96];
    snprintf(key, sizeof key, "%s.rope.scaling.type", c->arch_name);
    gguf_str st;
    int yarn = 0;
    if (gguf_find(&m->gguf, key) && gguf_get_str(&m->gguf, key, &st, NULL) == 0 && !gguf_str_eq(st, "none") &&
        !gguf_str_eq(st, "linear")) {
        yarn = c->arch == AK_ARCH_DEEPSEEK2 && gguf_str_eq(st, "yarn");
        m->cfg.rope_scaling_other = !yarn;
    }
    float yarn_mult[AK_MAX_ROPE_HALF];
    if (yarn) {
        if (half > AK_MAX_ROPE_HALF) { free(factors); return ak_fail(err, "%s: %d RoPE dims are too many for YaRN", m->gguf.path, c->rope_dim); }
        if (load_yarn(m, yarn_mult, err) < 0) { free(factors); return -1; }
    }
    if (gguf_find(&m->gguf, key) && gguf_get_str(&m->gguf, key, &st, NULL) == 0 && gguf_str_eq(st, "linear")) {
        if (arch_f32(m, "rope.scaling.factor", 1.0f, &linear, err) < 0) { free(factors); return -1; }
        if (!(linear > 0)) { free(factors); return ak_fail(err, "%s: invalid rope.scaling.factor %g", m->gguf.path, linear); }
    }
    for (int i = 0; i < half; i++) {
        double f = pow((double)c->rope_base, -2.0 * i / c->rope_dim);
        if (factors) f /= factors[i];
        if (yarn) f *= yarn_mult[i];
        m->inv_freq[i] = (float)(f / linear);
        if (m->inv_freq_swa) m->inv_freq_swa[i] = (float)pow((double)c->rope_base_swa, -2.0 * i / c->rope_dim);
    }
    free(factors);
    return 0;
}

/* Touches every page of the tensor data so the first forward pass does not
 * pay the page faults; reports progress because an 8B file takes seconds. */
static void page_in(ak_model *m, ak_progress_fn cb, void *ud) {
    const uint8_t *p = (const uint8_t *)m->gguf.map + m->gguf.data_offset;
    size_t n = m->gguf.size - m->gguf.data_offset, step = 1 << 22;
    if (m->gguf.owns_map) madvise((void *)((uintptr_t)m->gguf.map), m->gguf.size, MADV_WILLNEED);
    volatile uint8_t sink = 0;
    for (size_t off = 0; off < n; off += step) {
        size_t end = off + step < n ? off + step : n;
        for (size_t i = off; i < end; i += 4096) sink ^= p[i];
        if (cb) cb(ud, (double)end / n);
    }
    (void)sink;
}

/* The model fingerprint: XXH64 over the metadata (keys, types, values; the
 * tokenizer's vocabulary and merges among them), the tensor table (names,
 * types, shapes, offsets) and the first and last 4 KiB of every tensor's data,
 * so another model, another quantization or a fine-tune of the same shape all
 * fingerprint differently, without reading gigabytes of weights. */
static void fingerprint(ak_model *m) {
    const gguf_file *g = &m->gguf;
    XXH64_state_t *st = XXH64_createState();
    if (!st) { snprintf(m->fingerprint, sizeof m->fingerprint, "0000000000000000"); return; }
    XXH64_reset(st, 0x616b6b76);
    /* the metadata section is one contiguous byte range of the file */
    XXH64_update(st, g->map, (size_t)(g->data_offset < g->size ? g->data_offset : g->size));
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        size_t n = t->nbytes < 4096 ? t->nbytes : 4096;
        XXH64_update(st, t->data, n);
        XXH64_update(st, (const uint8_t *)t->data + t->nbytes - n, n);
    }
    snprintf(m->fingerprint, sizeof m->fingerprint, "%016llx", (unsigned long long)XXH64_digest(st));
    XXH64_freeState(st);
}

/* Drops the mapping's pages of [p, p + n) from this process (whole pages
 * inside the range only). They are clean file pages: touching them again
 * reads them back, so this is always safe. */
static void release_pages(const ak_model *m, const void *p, size_t n) {
    if (!m->gguf.owns_map) return;
    uintptr_t page = 4096, a = ((uintptr_t)p + page - 1) & ~(page - 1), b = ((uintptr_t)p + n) & ~(page - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

typedef struct {
    ak_model *m;
    ak_weight **ws;
    int nw;
    size_t total;
    ak_progress_fn cb;
    void *ud;
    atomic_int next;
    atomic_size_t done;
} pack_job;

/* Threads take matrices from a shared counter; thread 0 reports progress. */
static void pack_task(void *arg, int ith, int nth) {
    (void)nth;
    pack_job *j = arg;
    for (;;) {
        int i = atomic_fetch_add(&j->next, 1);
        if (i >= j->nw) break;
        ak_weight *w = j->ws[i];
        if (!w->packed) continue;
        ak_pack_weights(w->type, w->data, w->rows, w->cols, (void *)w->packed);
        release_pages(j->m, w->data, ak_row_bytes(w->type, w->cols) * (size_t)w->rows);
        size_t d = atomic_fetch_add(&j->done, ak_packed_bytes(w->type, w->rows, w->cols)) +
                   ak_packed_bytes(w->type, w->rows, w->cols);
        if (ith == 0 && j->cb) j->cb(j->ud, (double)d / j->total);
    }
}

/* Copies every matrix the kernels have a packed layout for (kernels.h) into
 * one allocation and points its ak_weight.packed there; the forward pass then
 * reads only the copy, so the mapping's pages of those matrices are released
 * and resident memory stays at one copy of the weights. Reports progress
 * (the copy reads every byte). Returns the number of bytes packed, or -1 and
 * sets err when the memory cannot be had. */
static int64_t pack_weights(ak_model *m, ak_progress_fn cb, void *ud, ak_error *err) {
    const ak_config *c = &m->cfg;
    /* per layer the 7 projections, and a MoE layer's router and experts;
     * an absent one (rows 0) has no packed size */
    int nw = (8 + 3 * c->n_expert + 2 * (c->kv_lora ? c->n_head : 0)) * c->n_layer + 1;
    ak_weight **ws = ak_malloc((size_t)nw * sizeof *ws, err);
    if (!ws) return -1;
    int k = 0;
    for (int l = 0; l < c->n_layer; l++) {
        ak_layer *L = &m->layers[l];
        ak_weight *lw[8] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down, &L->router };
        for (int i = 0; i < 8; i++) ws[k++] = lw[i];
        for (int h = 0; L->k_b && h < c->n_head; h++) {
            ws[k++] = &L->k_b[h];
            ws[k++] = &L->v_b[h];
        }
        for (int e = 0; L->e_gate && e < c->n_expert; e++) {
            ws[k++] = &L->e_gate[e];
            ws[k++] = &L->e_up[e];
            ws[k++] = &L->e_down[e];
        }
    }
    nw = k + 1;
    ws[k++] = &m->output;
    size_t total = 0;
    for (int i = 0; i < nw; i++) total += ak_packed_bytes(ws[i]->type, ws[i]->rows, ws[i]->cols);
    if (total == 0) { free(ws); return 0; }
    /* Anonymous memory in 2 MB pages where the kernel allows: a 4 KB page
     * fault per page made the copy far slower than the copying, and decode
     * walks all of it every token (fewer TLB misses). */
    size_t huge = (size_t)2 << 20, len = (total + huge - 1) / huge * huge;
    void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        free(ws);
        return ak_fail(err, "%s: out of memory for the %.1f MB packed copy of the weights", m->gguf.path, total / 1e6);
    }
#ifdef MADV_HUGEPAGE
    madvise(mem, len, MADV_HUGEPAGE);
#endif
    m->packed_mem = mem;
    m->packed_bytes = len;
    uint8_t *dst = m->packed_mem;
    for (int i = 0; i < nw; i++) {   /* place every copy first: the threads then fill them */
        size_t n = ak_packed_bytes(ws[i]->type, ws[i]->rows, ws[i]->cols);
        ws[i]->packed = n ? dst : NULL;
        dst += n;
    }
    /* the copy reads the whole file: all cores, a matrix at a time */
    pack_job j = { .m = m, .ws = ws, .nw = nw, .total = total, .cb = cb, .ud = ud };
    atomic_init(&j.next, 0);
    atomic_init(&j.done, 0);
    ak_error perr = {{0}};
    ak_threads *pool = ak_threads_new(0, &perr);
    ak_threads_run(pool, pack_task, &j);   /* NULL pool: the caller does it all */
    ak_threads_free(pool);
    if (c->tied_output) m->tok_embd.packed = m->output.packed;
    free(ws);
    return (int64_t)total;
}

/* See model.h: metadata, weights, fingerprint, then the packed copy (or
 * the mapping paged in). */
ak_model *ak_model_load(const char *path, ak_progress_fn cb, void *ud, ak_error *err) {
    ak_model *m = ak_calloc(1, sizeof *m, err);
    if (!m) return NULL;
    if (gguf_open(&m->gguf, path, err) < 0) { free(m); return NULL; }
    if (load_config(m, err) < 0 || load_weights(m, err) < 0) { ak_model_free(m); return NULL; }
    fingerprint(m);
    int64_t packed = pack_weights(m, cb, ud, err);
    if (packed < 0) { ak_model_free(m); return NULL; }
    /* a packed model was read whole by the packing; the rest is paged in */
    if (packed == 0) page_in(m, cb, ud);
    return m;
}

/* See model.h; takes a partly loaded model too. */
void ak_model_free(ak_model *m) {
    if (!m) return;
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layer; l++) {
            ak_layer *L = &m->layers[l];
            free(L->attn_norm); free(L->ffn_norm); free(L->bq); free(L->bk); free(L->bv);
            free(L->q_norm); free(L->k_norm); free(L->post_attn_norm); free(L->post_ffn_norm);
            free(L->kv_norm); free(L->k_b); free(L->v_b); free(L->e_gate); free(L->e_up); free(L->e_down);
        }
    free(m->layers);
    free(m->out_norm);
    free(m->inv_freq);
    free(m->inv_freq_swa);
    if (m->packed_mem) munmap(m->packed_mem, m->packed_bytes);
    gguf_close(&m->gguf);
    free(m);
}
