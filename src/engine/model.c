/* model.c - loading llama/qwen2/qwen3/gemma3/deepseek2 GGUF models and the forward pass. */
#include "engine/model.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <xxhash.h>

#include "engine/attnstats.h"
#include "kv/blockpool.h"
#include "kernels/kernels.h"
#include "base/vmath.h"

/* ---- loading ------------------------------------------------------------ */

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
     * fault per page made the copy ten times slower than the copying, and
     * decode walks all of it every token (fewer TLB misses). */
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
    ak_pool *pool = ak_pool_new(0, &perr);
    ak_pool_run(pool, pack_task, &j);   /* NULL pool: the caller does it all */
    ak_pool_free(pool);
    if (c->tied_output) m->tok_embd.packed = m->output.packed;
    free(ws);
    return (int64_t)total;
}

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

/* ---- forward ------------------------------------------------------------ */

#define LOGIT_ROWS 32   /* output projection is done this many tokens at a time */

struct ak_ctx {
    const ak_model *m;
    ak_pool *pool;
    int max_batch;
    float *x;       // (B, dim) residual stream
    float *xb;      // (B, dim) normed input of a sublayer
    float *q;       // (B, n_head * head_dim)
    float *k;       // (B, n_head_kv * head_dim_k) as cached (MLA: latent | rope key)
    float *v;       // (B, n_head_kv * head_dim_v)
    float *att;     // (B, n_head * head_dim_v) attention output (MLA: latent space)
    float *hb;      // (B, widest FFN: dense, shared experts or one expert)
    float *hb2;     // (B, widest FFN)
    /* MLA only, else NULL */
    float *qa;      // (B, n_head * head_dim_k) queries with k_b absorbed, then their rope part
    float *ga;      // (B, max(kv_lora, qk_nope, v_head)) one head's rows gathered
    float *gb;      // (B, that) its projection
    float *vo;      // (B, n_head * v_head) value heads, the input of attn_output
    /* MoE only, else NULL */
    float *probs;   // (B, n_expert) router probabilities
    int32_t *sel;   // (B, n_expert_used) chosen experts
    float *selw;    // (B, n_expert_used) their weights
    int32_t *etok;  // (B) tokens routed to one expert, (B) their weights as floats follow in etw
    float *etw;     // (B)
    float *ex;      // (B, dim) those tokens' inputs
    float *ey;      // (B, dim) the expert's outputs
    float *moe;     // (B, dim) the weighted sum of routed experts
    float *logits;  // (LOGIT_ROWS, vocab)
    float *rope_cs; // (2, B, rope_dim) cos, sin pairs per token: global layers, then sliding-window ones
    int32_t *rows;  // (B) indices of tokens that want logits
    float *run_scratch;     // (threads, run_scratch_n) for ak_kv_attend_run, grown on demand
    size_t run_scratch_n;
    int32_t *units;         // (B * n_head_kv, 3) attention work: first token, tokens, KV head
    int pos_offset;         /* RoPE position = cache slot + pos_offset (ak_ctx_set_pos_offset) */
    ak_attn_stats *stats;   /* attached attention statistics, or NULL (off) */
};

ak_ctx *ak_ctx_new(const ak_model *m, int max_batch, int n_threads, ak_error *err) {
    if (max_batch < 1) max_batch = 1;
    ak_ctx *c = ak_calloc(1, sizeof *c, err);
    if (!c) return NULL;
    const ak_config *cf = &m->cfg;
    c->m = m;
    c->max_batch = max_batch;
    size_t B = max_batch, qd = (size_t)cf->n_head * cf->head_dim;
    size_t kd = (size_t)cf->n_head_kv * m->spec.head_dim_k, vd = (size_t)cf->n_head_kv * m->spec.head_dim_v;
    size_t ad = (size_t)cf->n_head * m->spec.head_dim_v;
    size_t fw = cf->ffn;
    if ((size_t)cf->n_expert_shared * cf->expert_ffn > fw) fw = (size_t)cf->n_expert_shared * cf->expert_ffn;
    if ((size_t)cf->expert_ffn > fw) fw = cf->expert_ffn;
    c->pool = ak_pool_new(n_threads, err);
    if (!c->pool) { free(c); return NULL; }
    c->x = ak_malloc(B * cf->dim * sizeof(float), err);
    c->xb = ak_malloc(B * cf->dim * sizeof(float), err);
    c->q = ak_malloc(B * qd * sizeof(float), err);
    c->k = ak_malloc(B * kd * sizeof(float), err);
    c->v = ak_malloc(B * vd * sizeof(float), err);
    c->att = ak_malloc(B * ad * sizeof(float), err);
    c->hb = ak_malloc(B * fw * sizeof(float), err);
    c->hb2 = ak_malloc(B * fw * sizeof(float), err);
    int bad = 0;
    if (cf->kv_lora) {
        size_t g = cf->kv_lora;
        if ((size_t)cf->qk_nope > g) g = cf->qk_nope;
        if ((size_t)cf->v_head > g) g = cf->v_head;
        c->qa = ak_malloc(B * cf->n_head * m->spec.head_dim_k * sizeof(float), err);
        c->ga = ak_malloc(B * g * sizeof(float), err);
        c->gb = ak_malloc(B * g * sizeof(float), err);
        c->vo = ak_malloc(B * cf->n_head * cf->v_head * sizeof(float), err);
        bad |= !c->qa || !c->ga || !c->gb || !c->vo;
    }
    if (cf->n_expert) {
        c->probs = ak_malloc(B * cf->n_expert * sizeof(float), err);
        c->sel = ak_malloc(B * cf->n_expert_used * sizeof(int32_t), err);
        c->selw = ak_malloc(B * cf->n_expert_used * sizeof(float), err);
        c->etok = ak_malloc(B * sizeof(int32_t), err);
        c->etw = ak_malloc(B * sizeof(float), err);
        c->ex = ak_malloc(B * cf->dim * sizeof(float), err);
        c->ey = ak_malloc(B * cf->dim * sizeof(float), err);
        c->moe = ak_malloc(B * cf->dim * sizeof(float), err);
        bad |= !c->probs || !c->sel || !c->selw || !c->etok || !c->etw || !c->ex || !c->ey || !c->moe;
    }
    c->logits = ak_malloc((size_t)LOGIT_ROWS * cf->vocab * sizeof(float), err);
    c->rope_cs = ak_malloc(2 * B * cf->rope_dim * sizeof(float), err);
    c->rows = ak_malloc(B * sizeof(int32_t), err);
    c->units = ak_malloc(B * cf->n_head_kv * 3 * sizeof(int32_t), err);
    if (bad || !c->units || !c->x || !c->xb || !c->q || !c->k || !c->v || !c->att || !c->hb || !c->hb2 || !c->logits ||
        !c->rope_cs || !c->rows) {
        ak_ctx_free(c);
        return NULL;
    }
    return c;
}

void ak_ctx_free(ak_ctx *c) {
    if (!c) return;
    ak_pool_free(c->pool);
    free(c->x); free(c->xb); free(c->q); free(c->k); free(c->v); free(c->att);
    free(c->hb); free(c->hb2); free(c->logits); free(c->rope_cs); free(c->rows);
    free(c->run_scratch); free(c->units);
    free(c->qa); free(c->ga); free(c->gb); free(c->vo);
    free(c->probs); free(c->sel); free(c->selw); free(c->etok); free(c->etw); free(c->ex); free(c->ey); free(c->moe);
    free(c);
}

int ak_ctx_max_batch(const ak_ctx *c) { return c->max_batch; }
void ak_ctx_set_pos_offset(ak_ctx *c, int offset) { c->pos_offset = offset; }
int ak_ctx_pos_offset(const ak_ctx *c) { return c->pos_offset; }
void ak_ctx_set_attn_stats(ak_ctx *c, ak_attn_stats *st) { c->stats = st; }
ak_pool *ak_ctx_pool(ak_ctx *c) { return c->pool; }
const ak_model *ak_ctx_model(const ak_ctx *c) { return c->m; }

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float s = 1.0f / sqrtf(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * s * w[i];
}

/* x[i] = gelu(x[i]) * u[i], GELU's tanh approximation (as llama.cpp's
 * ggml_gelu; it looks the value up in an FP16 table on CPUs, which moves
 * nothing measurable). */
static void gelu_mul(float *x, const float *u, size_t n) {
    const float k = 0.79788456080286535588f;   /* sqrt(2 / pi) */
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(k * v * (1.0f + 0.044715f * v * v))) * u[i];
    }
}

/* The cos/sin pairs (rope_dim floats) of RoPE position pos under the inverse
 * frequencies inv_freq (half of them): the angle is pos * inv_freq[j] in
 * float. The forward pass and the position shift both build their tables
 * here, so a shift rotates by exactly the angles a forward pass would. */
static void rope_table(const float *inv_freq, int half, int pos, float *cs) {
    for (int j = 0; j < half; j++) {
        float th = pos * inv_freq[j];
        cs[2 * j] = cosf(th);
        cs[2 * j + 1] = sinf(th);
    }
}

/* The inverse frequencies layer l rotates its keys and queries with: the
 * sliding-window layers' own base (gemma3), else the model's. */
static const float *layer_inv_freq(const ak_model *m, int l) {
    return m->layers[l].window && m->inv_freq_swa ? m->inv_freq_swa : m->inv_freq;
}

/* Rotates each head of vec (n_heads x head_dim) by the token's cos/sin. */
static void rope(float *vec, int n_heads, int head_dim, int rope_dim, const float *cs, ak_rope_style style) {
    int half = rope_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *x = vec + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            int a = style == AK_ROPE_NEOX ? i : 2 * i, b = style == AK_ROPE_NEOX ? i + half : 2 * i + 1;
            float x0 = x[a], x1 = x[b];
            x[a] = x0 * c - x1 * s;
            x[b] = x0 * s + x1 * c;
        }
    }
}

typedef struct {
    ak_ctx *c;
    const ak_batch *b;
    int layer;
    int n_units;
} attn_task;

/* Tokens of one sequence at consecutive positions attend together, this
 * many at a time (ak_kv_attend_run): each block is dequantized once for all
 * of them, and there are still enough units to keep the threads busy. */
#define RUN_TOKENS 16

/* Splits the batch into attention units (c->units): a run of up to
 * RUN_TOKENS consecutive tokens of one sequence at consecutive positions
 * (a decoding sequence's one token is a run of one), times one KV head (the
 * query heads that share it attend together), and grows the per-thread
 * scratch to what the largest unit needs. Returns the count, or -1 with err
 * set if the scratch cannot be had. */
static int attention_units(ak_ctx *c, const ak_batch *b, ak_error *err) {
    const ak_config *cf = &c->m->cfg;
    int group = cf->n_head / cf->n_head_kv, nth = ak_pool_size(c->pool), n = 0;
    size_t need = 0;
    for (int i = 0; i < b->n;) {
        int len = 1;
        while (len < RUN_TOKENS && i + len < b->n && b->seq[i + len] == b->seq[i] && b->pos[i + len] == b->pos[i] + len)
            len++;
        size_t k = ak_kv_attend_run_scratch(b->seq[i], group * len);
        if (k > need) need = k;
        for (int g = 0; g < cf->n_head_kv; g++) {
            c->units[3 * n] = i;
            c->units[3 * n + 1] = len;
            c->units[3 * n + 2] = g;
            n++;
        }
        i += len;
    }
    if (need > c->run_scratch_n) {
        float *p = realloc(c->run_scratch, need * (size_t)nth * sizeof(float));
        if (!p) return ak_fail(err, "out of memory for attention scratch (%zu bytes)", need * (size_t)nth * sizeof(float));
        c->run_scratch = p;
        c->run_scratch_n = need;
    }
    return n;
}

static void attn_worker(void *ud, int ith, int nth) {
    attn_task *t = ud;
    const ak_config *cf = &t->c->m->cfg;
    /* queries and outputs as the cache's K and V dims (the head dims, or
     * MLA's absorbed ones) */
    int group = cf->n_head / cf->n_head_kv, dk = t->c->m->spec.head_dim_k, dv = t->c->m->spec.head_dim_v;
    int window = t->c->m->layers[t->layer].window;
    size_t qs = (size_t)cf->n_head * dk, os = (size_t)cf->n_head * dv;
    const float *q = cf->kv_lora ? t->c->qa : t->c->q;
    float *scratch = t->c->run_scratch + t->c->run_scratch_n * ith;
    for (int u = ith; u < t->n_units; u += nth) {
        int i = t->c->units[3 * u], len = t->c->units[3 * u + 1], g = t->c->units[3 * u + 2];
        ak_kv_attend_run_window(t->b->seq[i], t->layer, g, q + i * qs + (size_t)g * group * dk, qs, group, len,
                                t->b->pos[i], window, cf->attn_scale, t->c->att + i * os + (size_t)g * group * dv,
                                os, scratch);
    }
}

/* Y (n x w->rows) = X (n x w->cols) W^T, from the packed copy when there is one. */
static void matmul(ak_pool *pool, const ak_weight *w, const float *X, int n, float *Y) {
    if (w->packed) ak_matmul_packed(pool, w->type, w->packed, w->rows, w->cols, X, n, Y, NULL);   /* cannot fail: packed where ak_packed_bytes > 0 */
    else ak_matmul(pool, w->type, w->data, w->rows, w->cols, X, n, Y);
}

/* Y[i] = X W[i]^T for n (2 or 3) matrices that read the same X (a layer's
 * Q, K, V; its gate and up): one parallel region and one quantization of X
 * where all are packed with the same type and width, else one product each.
 * The same bits either way (kernels.h). */
static void matmul_n(ak_pool *pool, int n, const ak_weight *const *w, const float *X, int ntok, float *const *Y) {
    const void *P[AK_MATMUL_PACKED_MAX];
    int64_t rows[AK_MATMUL_PACKED_MAX];
    int same = n <= AK_MATMUL_PACKED_MAX;
    for (int i = 0; i < n && same; i++) {
        same = w[i]->packed && w[i]->type == w[0]->type && w[i]->cols == w[0]->cols;
        P[i] = w[i]->packed;
        rows[i] = w[i]->rows;
    }
    if (same && ak_matmul_packed_n(pool, w[0]->type, n, P, rows, w[0]->cols, X, ntok, Y, NULL) == 0) return;
    for (int i = 0; i < n; i++) matmul(pool, w[i], X, ntok, Y[i]);
}

static void embed(const ak_model *m, int32_t tok, float *out) {
    const ak_weight *e = &m->tok_embd;
    ak_dequantize_row(e->type, (const uint8_t *)e->data + ak_row_bytes(e->type, e->cols) * tok, out, e->cols);
}

static int forward(ak_ctx *c, const ak_batch *b, ak_error *err);

/* Multi-head latent attention of layer l (deepseek2) on the normed inputs in
 * c->xb, its output projection left in c->xb. Per token it caches K = [the
 * RMS-normed latent (kv_lora) | the RoPE'd shared rope key (rope_dim)] and
 * V = the latent, one KV head for all query heads. A head's score
 * q_nope . k_nope + q_rope . k_rope equals (q_nope W_kb) . latent + q_rope .
 * k_rope, since k_nope = W_kb^T latent: each query absorbs its head's k_b
 * and attends over the cache as stored; the weighted latents then go
 * through the head's v_b (the weights sum to one, so this equals weighting
 * the expanded values). Returns 0, or -1 with err set by the cache. */
static int mla_attention(ak_ctx *c, const ak_batch *b, int l, int n_units, ak_error *err) {
    const ak_model *m = c->m;
    const ak_config *cf = &m->cfg;
    const ak_layer *L = &m->layers[l];
    int n = b->n, H = cf->n_head, hd = cf->head_dim, R = cf->rope_dim, KL = cf->kv_lora, NP = cf->qk_nope;
    int VH = cf->v_head, dk = KL + R;
    size_t qd = (size_t)H * hd;
    matmul(c->pool, &L->wq, c->xb, n, c->q);
    matmul(c->pool, &L->wk, c->xb, n, c->k);
    for (int i = 0; i < n; i++) {
        float *kv = c->k + (size_t)i * dk, *q = c->q + (size_t)i * qd;
        const float *cs = c->rope_cs + (size_t)i * R;
        rmsnorm(kv, kv, L->kv_norm, KL, cf->rms_eps);
        rope(kv + KL, 1, R, R, cs, cf->rope_style);
        rope(q + NP, H, hd, R, cs, cf->rope_style);   /* each head's last R dims */
        if (ak_kv_write(b->seq[i], l, b->pos[i], kv, kv, err) < 0) return -1;
    }
    for (int h = 0; h < H; h++) {   /* absorb k_b: qa = [q_nope W_kb | q_rope] */
        for (int i = 0; i < n; i++) memcpy(c->ga + (size_t)i * NP, c->q + i * qd + (size_t)h * hd, NP * sizeof(float));
        matmul(c->pool, &L->k_b[h], c->ga, n, c->gb);
        for (int i = 0; i < n; i++) {
            float *qa = c->qa + ((size_t)i * H + h) * dk;
            memcpy(qa, c->gb + (size_t)i * KL, KL * sizeof(float));
            memcpy(qa + KL, c->q + i * qd + (size_t)h * hd + NP, R * sizeof(float));
        }
    }
    /* the absorbed queries are what scores the cache as stored */
    if (c->stats && ak_attn_stats_observe(c->stats, c->pool, b, l, c->qa, (size_t)H * dk, err) < 0) return -1;
    attn_task at = {c, b, l, n_units};
    ak_pool_run(c->pool, attn_worker, &at);
    for (int h = 0; h < H; h++) {   /* each head's weighted latent through its v_b */
        for (int i = 0; i < n; i++)
            memcpy(c->ga + (size_t)i * KL, c->att + ((size_t)i * H + h) * KL, KL * sizeof(float));
        matmul(c->pool, &L->v_b[h], c->ga, n, c->gb);
        for (int i = 0; i < n; i++)
            memcpy(c->vo + ((size_t)i * H + h) * VH, c->gb + (size_t)i * VH, VH * sizeof(float));
    }
    matmul(c->pool, &L->wo, c->vo, n, c->xb);
    return 0;
}

/* The mixture-of-experts FFN of a MoE layer on the normed inputs in c->xb,
 * its output left in c->xb: per token, softmax over the router logits, the
 * n_expert_used most probable experts (ties: the lower index) weighted by
 * their probability (renormalised over them when expert_norm) times
 * expert_scale, plus the shared experts. Tokens are grouped by expert, so
 * each chosen expert's weights are read once for all its tokens, and an
 * expert no token chose is not read. A token's sum runs over its experts
 * in index order, whatever else the batch holds. */
static void moe_ffn(ak_ctx *c, const ak_layer *L, int n) {
    const ak_config *cf = &c->m->cfg;
    int E = cf->n_expert, K = cf->n_expert_used, dim = cf->dim, F = cf->expert_ffn;
    matmul(c->pool, &L->router, c->xb, n, c->probs);
    for (int i = 0; i < n; i++) {
        float *p = c->probs + (size_t)i * E, mx = p[0];
        for (int e = 1; e < E; e++) if (p[e] > mx) mx = p[e];
        double sum = 0;
        for (int e = 0; e < E; e++) { p[e] = expf(p[e] - mx); sum += p[e]; }
        float inv = (float)(1.0 / sum), wsum = 0;
        for (int e = 0; e < E; e++) p[e] *= inv;
        int32_t *sel = c->sel + (size_t)i * K;
        float *w = c->selw + (size_t)i * K;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= sel[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            sel[k] = best;
            w[k] = p[best];
            wsum += w[k];
        }
        for (int k = 0; k < K; k++) w[k] = (cf->expert_norm ? w[k] / wsum : w[k]) * cf->expert_scale;
    }
    memset(c->moe, 0, (size_t)n * dim * sizeof(float));
    for (int e = 0; e < E; e++) {
        int cnt = 0;
        for (int i = 0; i < n; i++)
            for (int k = 0; k < K; k++)
                if (c->sel[(size_t)i * K + k] == e) {
                    c->etok[cnt] = i;
                    c->etw[cnt] = c->selw[(size_t)i * K + k];
                    memcpy(c->ex + (size_t)cnt * dim, c->xb + (size_t)i * dim, dim * sizeof(float));
                    cnt++;
                }
        if (!cnt) continue;
        matmul(c->pool, &L->e_gate[e], c->ex, cnt, c->hb);
        matmul(c->pool, &L->e_up[e], c->ex, cnt, c->hb2);
        ak_silu_mul(c->hb, c->hb2, (size_t)cnt * F);
        matmul(c->pool, &L->e_down[e], c->hb, cnt, c->ey);
        for (int j = 0; j < cnt; j++) {
            float *o = c->moe + (size_t)c->etok[j] * dim, wj = c->etw[j];
            const float *y = c->ey + (size_t)j * dim;
            for (int d = 0; d < dim; d++) o[d] += wj * y[d];
        }
    }
    if (L->w_gate.rows) {   /* the shared experts, one SwiGLU */
        matmul(c->pool, &L->w_gate, c->xb, n, c->hb);
        matmul(c->pool, &L->w_up, c->xb, n, c->hb2);
        ak_silu_mul(c->hb, c->hb2, (size_t)n * L->w_gate.rows);
        matmul(c->pool, &L->w_down, c->hb, n, c->ey);
        for (size_t j = 0; j < (size_t)n * dim; j++) c->xb[j] = c->moe[j] + c->ey[j];
    } else {
        memcpy(c->xb, c->moe, (size_t)n * dim * sizeof(float));
    }
}

int ak_forward(ak_ctx *c, const ak_batch *b, ak_error *err) {
    unsigned fp_mode = ak_flush_denormals();
    int rc = forward(c, b, err);
    ak_restore_denormals(fp_mode);
    return rc;
}

/* Checks a batch (token ids, positions within each sequence's capacity and
 * following what it holds with no gap: a position below the length is
 * written again), splits it into attention units, makes every position
 * writable (a full budget fails here, before any sequence changed) and
 * fills the RoPE tables. Returns the unit count, or -1 with err set. */
static int batch_setup(ak_ctx *c, const ak_batch *b, ak_error *err) {
    const ak_model *m = c->m;
    const ak_config *cf = &m->cfg;
    int n = b->n;
    if (n < 1 || n > c->max_batch) return ak_fail(err, "batch of %d tokens (1..%d allowed)", n, c->max_batch);
    for (int i = 0; i < n; i++) {
        if (b->token[i] < 0 || b->token[i] >= cf->vocab)
            return ak_fail(err, "token id %d is out of range (vocabulary %d)", b->token[i], cf->vocab);
        if (b->pos[i] < 0 || b->pos[i] >= ak_kv_capacity(b->seq[i]))
            return ak_fail(err, "position %d is past the context size %d", b->pos[i], ak_kv_capacity(b->seq[i]));
        /* positions must follow what the sequence holds: count earlier batch
         * tokens of the same sequence to know its length at this point */
        int expect = ak_kv_length(b->seq[i]);
        for (int j = 0; j < i; j++)
            if (b->seq[j] == b->seq[i] && b->pos[j] + 1 > expect) expect = b->pos[j] + 1;
        if (b->pos[i] > expect)
            return ak_fail(err, "position %d leaves a gap (sequence holds %d positions)", b->pos[i], expect);
    }
    int n_units = attention_units(c, b, err);
    if (n_units < 0) return -1;
    /* make every position writable first: a full budget fails here, before
     * any sequence changed */
    for (int i = 0; i < n; i++) {
        int seen = 0, lo = b->pos[i], hi = b->pos[i] + 1;
        for (int j = 0; j < i && !seen; j++) seen = b->seq[j] == b->seq[i];
        if (seen) continue;
        for (int j = i + 1; j < n; j++)
            if (b->seq[j] == b->seq[i]) {
                if (b->pos[j] < lo) lo = b->pos[j];
                if (b->pos[j] + 1 > hi) hi = b->pos[j] + 1;
            }
        /* a windowed sequence truncated below what its local layers released cannot go on */
        if (ak_kv_window_check(b->seq[i], lo, err) < 0 || ak_kv_prepare(b->seq[i], lo, hi, err) < 0) return -1;
    }
    int half = cf->rope_dim / 2;
    float *cs_swa = c->rope_cs + (size_t)c->max_batch * cf->rope_dim;   /* sliding-window layers' */
    for (int i = 0; i < n; i++) {
        /* the RoPE position: the slot moved by the context's offset */
        int rp = b->pos[i] + c->pos_offset;
        rope_table(m->inv_freq, half, rp, c->rope_cs + (size_t)i * cf->rope_dim);
        /* YaRN's magnitude: on q and k as computed, never in a shift (a
         * stored key already carries it) */
        if (cf->rope_mag != 1.0f)
            for (int j = 0; j < cf->rope_dim; j++) c->rope_cs[(size_t)i * cf->rope_dim + j] *= cf->rope_mag;
        if (m->inv_freq_swa) rope_table(m->inv_freq_swa, half, rp, cs_swa + (size_t)i * cf->rope_dim);
    }
    return n_units;
}

/* The input embeddings of the batch's tokens into c->x (scaled by
 * embd_scale). */
static void embed_batch(ak_ctx *c, const ak_batch *b) {
    const ak_config *cf = &c->m->cfg;
    int dim = cf->dim;
    for (int i = 0; i < b->n; i++) {
        embed(c->m, b->token[i], c->x + (size_t)i * dim);
        if (cf->embd_scale != 1.0f)
            for (int j = 0; j < dim; j++) c->x[(size_t)i * dim + j] *= cf->embd_scale;
    }
}

/* Queries, keys and values of layer l (not MLA) for the batch's n tokens
 * from the normed inputs in c->xb, into c->q, c->k, c->v: projections,
 * biases, q/k norms, RoPE; keys and values as the cache stores them. */
static void layer_qkv(ak_ctx *c, const ak_batch *b, int l) {
    const ak_model *m = c->m;
    const ak_config *cf = &m->cfg;
    const ak_layer *L = &m->layers[l];
    int n = b->n, hd = cf->head_dim, qd = cf->n_head * hd, kvd = cf->n_head_kv * hd;
    float *cs_swa = c->rope_cs + (size_t)c->max_batch * cf->rope_dim;
    matmul_n(c->pool, 3, (const ak_weight *[]){&L->wq, &L->wk, &L->wv}, c->xb, n, (float *[]){c->q, c->k, c->v});
    for (int i = 0; i < n; i++) {
        float *q = c->q + (size_t)i * qd, *k = c->k + (size_t)i * kvd, *v = c->v + (size_t)i * kvd;
        if (L->bq) {
            for (int j = 0; j < qd; j++) q[j] += L->bq[j];
            for (int j = 0; j < kvd; j++) { k[j] += L->bk[j]; v[j] += L->bv[j]; }
        }
        if (L->q_norm) {   /* each head normed on its own, before RoPE */
            for (int h = 0; h < cf->n_head; h++) rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, L->q_norm, hd, cf->rms_eps);
            for (int h = 0; h < cf->n_head_kv; h++) rmsnorm(k + (size_t)h * hd, k + (size_t)h * hd, L->k_norm, hd, cf->rms_eps);
        }
        const float *cs = (L->window ? cs_swa : c->rope_cs) + (size_t)i * cf->rope_dim;
        rope(q, cf->n_head, hd, cf->rope_dim, cs, cf->rope_style);
        rope(k, cf->n_head_kv, hd, cf->rope_dim, cs, cf->rope_style);
    }
}

/* Layer l on the batch's residual stream c->x: attention (K/V written at
 * each token's position, attending over [0, pos] of its sequence) and the
 * FFN, each added to the stream. Returns 0, or -1 with err set. */
static int layer_forward(ak_ctx *c, const ak_batch *b, int l, int n_units, ak_error *err) {
    const ak_model *m = c->m;
    const ak_config *cf = &m->cfg;
    const ak_layer *L = &m->layers[l];
    int n = b->n, dim = cf->dim, hd = cf->head_dim;
    int qd = cf->n_head * hd, kvd = cf->n_head_kv * hd;
    for (int i = 0; i < n; i++) rmsnorm(c->xb + (size_t)i * dim, c->x + (size_t)i * dim, L->attn_norm, dim, cf->rms_eps);
    if (cf->kv_lora) {
        if (mla_attention(c, b, l, n_units, err) < 0) return -1;
        for (size_t j = 0; j < (size_t)n * dim; j++) c->x[j] += c->xb[j];
        for (int i = 0; i < n; i++) rmsnorm(c->xb + (size_t)i * dim, c->x + (size_t)i * dim, L->ffn_norm, dim, cf->rms_eps);
        if (L->e_gate) {
            moe_ffn(c, L, n);
        } else {
            matmul(c->pool, &L->w_gate, c->xb, n, c->hb);
            matmul(c->pool, &L->w_up, c->xb, n, c->hb2);
            ak_silu_mul(c->hb, c->hb2, (size_t)n * L->w_gate.rows);
            matmul(c->pool, &L->w_down, c->hb, n, c->xb);
        }
        for (size_t j = 0; j < (size_t)n * dim; j++) c->x[j] += c->xb[j];
        return 0;
    }
    layer_qkv(c, b, l);
    for (int i = 0; i < n; i++)
        if (ak_kv_write(b->seq[i], l, b->pos[i], c->k + (size_t)i * kvd, c->v + (size_t)i * kvd, err) < 0) return -1;
    /* statistics read the batch's keys back, so after every write */
    if (c->stats && ak_attn_stats_observe(c->stats, c->pool, b, l, c->q, (size_t)qd, err) < 0) return -1;
    attn_task at = {c, b, l, n_units};
    ak_pool_run(c->pool, attn_worker, &at);
    matmul(c->pool, &L->wo, c->att, n, c->xb);
    if (L->post_attn_norm)
        for (int i = 0; i < n; i++)
            rmsnorm(c->xb + (size_t)i * dim, c->xb + (size_t)i * dim, L->post_attn_norm, dim, cf->rms_eps);
    for (size_t j = 0; j < (size_t)n * dim; j++) c->x[j] += c->xb[j];

    for (int i = 0; i < n; i++) rmsnorm(c->xb + (size_t)i * dim, c->x + (size_t)i * dim, L->ffn_norm, dim, cf->rms_eps);
    matmul_n(c->pool, 2, (const ak_weight *[]){&L->w_gate, &L->w_up}, c->xb, n, (float *[]){c->hb, c->hb2});
    if (cf->act == AK_ACT_GELU) gelu_mul(c->hb, c->hb2, (size_t)n * cf->ffn);
    else ak_silu_mul(c->hb, c->hb2, (size_t)n * cf->ffn);
    matmul(c->pool, &L->w_down, c->hb, n, c->xb);
    if (L->post_ffn_norm)
        for (int i = 0; i < n; i++)
            rmsnorm(c->xb + (size_t)i * dim, c->xb + (size_t)i * dim, L->post_ffn_norm, dim, cf->rms_eps);
    for (size_t j = 0; j < (size_t)n * dim; j++) c->x[j] += c->xb[j];
    return 0;
}

/* Final norm and output projection of c->x, only for tokens that want
 * logits. */
static void batch_logits(ak_ctx *c, const ak_batch *b) {
    const ak_model *m = c->m;
    const ak_config *cf = &m->cfg;
    int n = b->n, dim = cf->dim, nr = 0;
    for (int i = 0; i < n; i++)
        if (b->logits_out && b->logits_out[i]) c->rows[nr++] = i;
    for (int r0 = 0; r0 < nr; r0 += LOGIT_ROWS) {
        int cnt = nr - r0 < LOGIT_ROWS ? nr - r0 : LOGIT_ROWS;
        for (int j = 0; j < cnt; j++)
            rmsnorm(c->xb + (size_t)j * dim, c->x + (size_t)c->rows[r0 + j] * dim, m->out_norm, dim, cf->rms_eps);
        matmul(c->pool, &m->output, c->xb, cnt, c->logits);
        for (int j = 0; j < cnt; j++)
            memcpy(b->logits_out[c->rows[r0 + j]], c->logits + (size_t)j * cf->vocab, cf->vocab * sizeof(float));
    }
}

/* After a whole forward pass: each sequence's local blocks that slid out
 * of the window are released (where the sequence does so: kvcache.h). */
static void release_windows(const ak_batch *b) {
    for (int i = 0; i < b->n; i++) ak_kv_release_window(b->seq[i]);
}

static int forward(ak_ctx *c, const ak_batch *b, ak_error *err) {
    int n_units = batch_setup(c, b, err);
    if (n_units < 0) return -1;
    embed_batch(c, b);
    for (int l = 0; l < c->m->cfg.n_layer; l++)
        if (layer_forward(c, b, l, n_units, err) < 0) return -1;
    batch_logits(c, b);
    release_windows(b);
    return 0;
}

int ak_model_embed(ak_ctx *c, const int32_t *tokens, int n, float *x, ak_error *err) {
    const ak_config *cf = &c->m->cfg;
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= cf->vocab)
            return ak_failc(err, AK_ERR_INVALID, "token id %d is out of range (vocabulary %d)", tokens[i], cf->vocab);
        embed(c->m, tokens[i], x + (size_t)i * cf->dim);
        if (cf->embd_scale != 1.0f)
            for (int j = 0; j < cf->dim; j++) x[(size_t)i * cf->dim + j] *= cf->embd_scale;
    }
    return 0;
}

/* The range entry points take the residual stream from the caller: they
 * run in c's scratch (c->x) like a whole forward pass, one batch at a
 * time. */
static int range_args(const ak_ctx *c, int l0, int l1, ak_error *err) {
    if (c->m->cfg.kv_lora)
        return ak_failc(err, AK_ERR_INVALID, "layer ranges are not available for multi-head latent attention");
    if (l0 < 0 || l1 > c->m->cfg.n_layer || l0 >= l1)
        return ak_failc(err, AK_ERR_INVALID, "layer range [%d, %d) of %d layers", l0, l1, c->m->cfg.n_layer);
    return 0;
}

static int forward_layers(ak_ctx *c, const ak_batch *b, float *x, int l0, int l1, ak_error *err) {
    if (range_args(c, l0, l1, err) < 0) return -1;
    int n_units = batch_setup(c, b, err);
    if (n_units < 0) return -1;
    size_t bytes = (size_t)b->n * c->m->cfg.dim * sizeof(float);
    memcpy(c->x, x, bytes);
    for (int l = l0; l < l1; l++)
        if (layer_forward(c, b, l, n_units, err) < 0) return -1;
    memcpy(x, c->x, bytes);
    if (l1 == c->m->cfg.n_layer) {
        batch_logits(c, b);
        release_windows(b);
    }
    return 0;
}

int ak_forward_layers(ak_ctx *c, const ak_batch *b, float *x, int l0, int l1, ak_error *err) {
    unsigned fp_mode = ak_flush_denormals();
    int rc = forward_layers(c, b, x, l0, l1, err);
    ak_restore_denormals(fp_mode);
    return rc;
}

static int layer_kv(ak_ctx *c, const ak_batch *b, const float *x, int l, float *k, float *v, ak_error *err) {
    if (range_args(c, l, l + 1, err) < 0) return -1;
    const ak_config *cf = &c->m->cfg;
    int n = b->n, dim = cf->dim;
    size_t kvd = (size_t)cf->n_head_kv * cf->head_dim;
    if (n < 1 || n > c->max_batch) return ak_fail(err, "batch of %d tokens (1..%d allowed)", n, c->max_batch);
    /* only the RoPE tables of batch_setup: nothing is written */
    int half = cf->rope_dim / 2;
    float *cs_swa = c->rope_cs + (size_t)c->max_batch * cf->rope_dim;
    for (int i = 0; i < n; i++) {
        int rp = b->pos[i] + c->pos_offset;
        rope_table(c->m->inv_freq, half, rp, c->rope_cs + (size_t)i * cf->rope_dim);
        if (cf->rope_mag != 1.0f)
            for (int j = 0; j < cf->rope_dim; j++) c->rope_cs[(size_t)i * cf->rope_dim + j] *= cf->rope_mag;
        if (c->m->inv_freq_swa) rope_table(c->m->inv_freq_swa, half, rp, cs_swa + (size_t)i * cf->rope_dim);
    }
    for (int i = 0; i < n; i++)
        rmsnorm(c->xb + (size_t)i * dim, x + (size_t)i * dim, c->m->layers[l].attn_norm, dim, cf->rms_eps);
    layer_qkv(c, b, l);
    memcpy(k, c->k, (size_t)n * kvd * sizeof(float));
    memcpy(v, c->v, (size_t)n * kvd * sizeof(float));
    return 0;
}

int ak_layer_kv(ak_ctx *c, const ak_batch *b, const float *x, int l, float *k, float *v, ak_error *err) {
    unsigned fp_mode = ak_flush_denormals();
    int rc = layer_kv(c, b, x, l, k, v, err);
    ak_restore_denormals(fp_mode);
    return rc;
}

int ak_eval(ak_ctx *c, ak_kv *kv, const int32_t *tokens, int n, int pos0, float *logits, float *all_logits,
            ak_progress_fn cb, void *ud, ak_error *err) {
    int B = c->max_batch, V = c->m->cfg.vocab;
    int32_t *pos = ak_malloc((size_t)B * sizeof(int32_t), err);
    ak_kv **seq = ak_malloc((size_t)B * sizeof(ak_kv *), err);
    float **out = ak_malloc((size_t)B * sizeof(float *), err);
    int rc = 0;
    if (!pos || !seq || !out) rc = -1;
    for (int i0 = 0; rc == 0 && i0 < n; i0 += B) {
        int cnt = n - i0 < B ? n - i0 : B;
        for (int j = 0; j < cnt; j++) {
            pos[j] = pos0 + i0 + j;
            seq[j] = kv;
            out[j] = all_logits ? all_logits + (size_t)(i0 + j) * V
                     : (logits && i0 + j == n - 1) ? logits : NULL;
        }
        ak_batch b = {cnt, tokens + i0, pos, seq, out};
        rc = ak_forward(c, &b, err);
        if (rc == 0 && all_logits && logits && i0 + cnt == n)
            memcpy(logits, all_logits + (size_t)(n - 1) * V, V * sizeof(float));
        if (cb) cb(ud, (double)(i0 + cnt) / n);
    }
    free(pos); free(seq); free(out);
    return rc;
}

int ak_model_shift_keys(const ak_model *m, ak_kv *kv, int from, int to, int delta, ak_error *err) {
    const ak_config *cf = &m->cfg;
    const ak_cache_spec *sp = ak_block_pool_spec(ak_kv_pool(kv));
    if (sp->n_layer != m->spec.n_layer || sp->n_head_kv != m->spec.n_head_kv || sp->head_dim_k != m->spec.head_dim_k ||
        sp->head_dim_v != m->spec.head_dim_v)
        return ak_failc(err, AK_ERR_INVALID, "position shift: the cache is not of this model's geometry");
    if (cf->rope_dim <= 0)
        return ak_failc(err, AK_ERR_INVALID, "position shift: %s has no RoPE dimensions to rotate", m->gguf.path);
    /* a scaling other than linear (which only changes the frequencies) and
     * deepseek2's YaRN (frequencies too, folded into inv_freq; its magnitude
     * is in the stored key already, so the shift is a pure rotation) is not
     * run by the forward pass, and a shift must not pretend to be exact */
    if (cf->rope_scaling_other)
        return ak_failc(err, AK_ERR_INVALID, "position shift: %s names a RoPE scaling that is not a rotation by "
                        "position", m->gguf.path);
    int len = ak_kv_length(kv), base = ak_kv_base_len(kv);
    if (from < 0 || from > to || to > len)
        return ak_failc(err, AK_ERR_INVALID, "position shift of [%d, %d): outside the %d positions held", from, to, len);
    if (from < base)
        return ak_failc(err, AK_ERR_INVALID,
                        "position shift of [%d, %d): positions below %d are a shared base, not this sequence's own",
                        from, to, base);
    if (from == to || delta == 0) return 0;
    /* copy-on-write first: a shared or indexed block is copied, never changed */
    if (ak_kv_prepare(kv, from, to, err) < 0) return -1;
    int H = m->spec.n_head_kv, dk = m->spec.head_dim_k, dv = m->spec.head_dim_v, R = cf->rope_dim;
    float *k = ak_malloc(((size_t)H * dk + (size_t)H * dv + 2 * (size_t)R) * sizeof(float), err);
    if (!k) return -1;
    float *v = k + (size_t)H * dk, *cs = v + (size_t)H * dv, *cs_swa = cs + R;
    /* R(delta): the tables a forward pass builds for position delta */
    rope_table(m->inv_freq, R / 2, delta, cs);
    if (m->inv_freq_swa) rope_table(m->inv_freq_swa, R / 2, delta, cs_swa);
    int rc = 0;
    for (int l = 0; l < cf->n_layer && rc == 0; l++) {
        const float *lcs = layer_inv_freq(m, l) == m->inv_freq ? cs : cs_swa;
        for (int p = from; p < to && rc == 0; p++) {
            if ((rc = ak_kv_read(kv, l, p, k, v, err)) < 0) break;
            if (cf->kv_lora) rope(k + cf->kv_lora, 1, R, R, lcs, cf->rope_style);   /* MLA: only the rope key */
            else rope(k, H, dk, R, lcs, cf->rope_style);
            rc = ak_kv_write(kv, l, p, k, NULL, err);
        }
    }
    free(k);
    return rc;
}
