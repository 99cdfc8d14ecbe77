/* synth.c - synthetic models (see synth.h). */
#include "engine/synth.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/gguf.h"
#include "kernels/kernels.h"
#include "base/threadpool.h"
#include "text/hfvocab.h"

#define CHUNK_BYTES (8u << 20)   /* tensor data generated and written per step */
#define MIN_SYNTH_VOCAB 260      /* 3 specials + 256 bytes + at least one piece */

typedef struct {
    const char *name, *arch;
    int dim, n_layers, n_heads, n_kv_heads, ffn, vocab, ctx;
    float rope_base, rms_eps;
    int tied;
    int head_dim, window;   /* 0: dim / n_heads; 0: no sliding window */
} preset;

/* Real models' shapes. Context lengths are kept modest (the metadata value
 * sizes KV caches in some tools), vocabularies are the real ones except the
 * Llama 3.x models, which use a Llama-2-sized 32000 here. */
static const preset presets[] = {
    {"llama-1b",       "llama", 2048, 16, 32, 8,  8192, 32000,  8192, 500000.0f, 1e-5f, 1},
    {"llama-3b",       "llama", 3072, 28, 24, 8,  8192, 32000,  8192, 500000.0f, 1e-5f, 1},
    {"llama-8b",       "llama", 4096, 32, 32, 8, 14336, 32000,  8192, 500000.0f, 1e-5f, 0},
    {"qwen2-0.5b",     "qwen2",  896, 24, 14, 2,  4864, 151936, 8192, 1000000.0f, 1e-6f, 1},
    {"tinyllama-1.1b", "llama", 2048, 22, 32, 4,  5632, 32000,  2048, 10000.0f, 1e-5f, 0},
    {"stories15m",     "llama",  288,  6,  6, 6,   768, 32000,   256, 10000.0f, 1e-5f, 1},
    {"qwen3-0.6b",     "qwen3", 1024, 28, 16, 8,  3072, 151936, 8192, 1000000.0f, 1e-6f, 1, 128, 0},
    {"qwen3-1.7b",     "qwen3", 2048, 28, 16, 8,  6144, 151936, 8192, 1000000.0f, 1e-6f, 1, 128, 0},
    {"gemma3-1b",      "gemma3", 1152, 26, 4, 1,  6912, 262144, 8192, 1000000.0f, 1e-6f, 1, 256, 512},
    /* DeepSeek-V2-Lite without its YaRN scaling (kv_lora 512, rope 64,
     * v_head 128, 64 experts of 1408, 6 used, 2 shared, layer 0 dense) */
    {"deepseek2-lite", "deepseek2", 2048, 27, 16, 1, 10944, 102400, 4096, 10000.0f, 1e-6f, 0, 192, 0},
    {"deepseek2-lite-8l", "deepseek2", 2048, 8, 16, 1, 10944, 102400, 4096, 10000.0f, 1e-6f, 0, 192, 0},
};
#define N_PRESETS (int)(sizeof presets / sizeof presets[0])

void ak_synth_defaults(ak_synth_opts *o) {
    memset(o, 0, sizeof *o);
    o->arch = "llama";
    o->ctx = 2048;
    o->rope_base = 10000.0f;
    o->rms_eps = 1e-5f;
    o->wtype = GGML_TYPE_F16;
    o->seed = 1;
}

int ak_synth_preset(ak_synth_opts *o, const char *name) {
    for (int i = 0; i < N_PRESETS; i++) {
        const preset *p = &presets[i];
        if (strcmp(p->name, name) != 0) continue;
        o->arch = p->arch;
        o->dim = p->dim;
        o->n_layers = p->n_layers;
        o->n_heads = p->n_heads;
        o->n_kv_heads = p->n_kv_heads;
        o->ffn = p->ffn;
        o->vocab = p->vocab;
        o->ctx = p->ctx;
        o->rope_base = p->rope_base;
        o->rms_eps = p->rms_eps;
        o->tied = p->tied;
        o->head_dim = p->head_dim;
        o->window = p->window;
        o->rope_base_swa = 0;
        o->name = p->name;
        if (!strcmp(p->arch, "deepseek2")) {
            o->kv_lora = 512; o->rope_dim = 64; o->v_head = 128; o->n_experts = 64; o->n_experts_used = 6;
            o->n_experts_shared = 2; o->expert_ffn = 1408; o->n_dense_lead = 1;
        }
        return 0;
    }
    return -1;
}

const char *ak_synth_preset_name(int i) { return i >= 0 && i < N_PRESETS ? presets[i].name : NULL; }

/* ---- random weights ------------------------------------------------------ */

/* splitmix64's output function: a good 64-bit mixer. Applied to a counter,
 * it gives a random stream whose i-th value is computed independently of the
 * others, which lets the compiler vectorize the generator below. */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static inline float as_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t as_u32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

#define GEN_BLOCK 16   /* normal pairs per block: a fixed trip count vectorizes */

/* Box-Muller for GEN_BLOCK pairs of N(0,1) numbers: pair i of the stream
 * `base` is (r cos t, r sin t), r = sqrt(-2 ln u). libm's logf/sincosf would
 * cost ~20 ns per number and block vectorization (errno), so ln, sqrt and
 * sin/cos are done here with +, *, / only: polynomials accurate to ~1e-7
 * and deterministic (no libm version dependence). */
static void gen_block(uint64_t base, uint64_t i0, float *restrict co, float *restrict so) {
    for (int j = 0; j < GEN_BLOCK; j++) {
        uint64_t z = mix64(base + (i0 + (uint64_t)j + 1) * 0x9E3779B97F4A7C15ull);
        uint32_t hi = (uint32_t)(z >> 40), lo = (uint32_t)z;
        float u = (float)(int32_t)(hi + 1) * 0x1p-24f;                    /* (0, 1] */
        /* ln u = k ln 2 + ln m with m in [sqrt(1/2), sqrt(2)):
         * ln m = 2 atanh(t), t = (m - 1) / (m + 1), |t| < 0.172 */
        uint32_t ix = as_u32(u) - 0x3f3504f3u;
        int32_t k = (int32_t)((ix + 0x40000000u) >> 23) - 128;
        float m = as_f32((ix & 0x007fffffu) + 0x3f3504f3u);
        float f = m - 1.0f, t = f / (2.0f + f), t2 = t * t;
        float lnm = 2.0f * t * (1.0f + t2 * (1.0f / 3 + t2 * (1.0f / 5 + t2 * (1.0f / 7 + t2 * (1.0f / 9)))));
        float v = -2.0f * ((float)k * 0.693147180559945f + lnm);          /* >= 0 */
        /* sqrt v = v / sqrt v: bit-trick estimate, three Newton steps */
        float y = as_f32(0x5f3759dfu - (as_u32(v) >> 1));
        y = y * (1.5f - 0.5f * v * y * y);
        y = y * (1.5f - 0.5f * v * y * y);
        y = y * (1.5f - 0.5f * v * y * y);
        float r = v * y;
        /* angle = quadrant * pi/2 + phi, phi uniform in [-pi/4, pi/4) */
        float phi = ((float)(int32_t)(lo & 0x3fffffu) * 0x1p-22f - 0.5f) * 1.5707963267949f, p2 = phi * phi;
        float s = phi * (1.0f - p2 * (1.0f / 6 - p2 * (1.0f / 120 - p2 * (1.0f / 5040))));
        float c = 1.0f - p2 * (0.5f - p2 * (1.0f / 24 - p2 * (1.0f / 720 - p2 * (1.0f / 40320))));
        uint32_t q = lo >> 30, neg = (q & 2) << 30;
        float s1 = (q & 1) ? c : s, c1 = (q & 1) ? -s : c;
        co[j] = r * as_f32(as_u32(c1) ^ neg);
        so[j] = r * as_f32(as_u32(s1) ^ neg);
    }
}

/* Fills x[0..n) with mean + sigma * N(0,1) for row `row` of the tensor whose
 * stream key is `key` (seed and name hashed). Element i depends only on
 * (key, row, i). */
static void gen_row(uint64_t key, int64_t row, float mean, float sigma, float *x, int64_t n) {
    uint64_t base = mix64(key ^ ((uint64_t)row * 0xD1B54A32D192ED03ull));
    float c[GEN_BLOCK], s[GEN_BLOCK];
    for (int64_t i = 0; i < n; i += 2 * GEN_BLOCK) {
        gen_block(base, (uint64_t)i / 2, c, s);
        int64_t m = n - i < 2 * GEN_BLOCK ? n - i : 2 * GEN_BLOCK;
        for (int64_t j = 0; j < m; j++) x[i + j] = mean + sigma * ((j & 1) ? s[j / 2] : c[j / 2]);
    }
}

/* ---- the model's tensors ------------------------------------------------- */

typedef struct {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[3];       /* ne[0] = row length (fan-in), ne[1] = rows, ne[2] = matrices */
    uint32_t type;
    float mean, sigma;
} tspec;

/* Appends tensor t to the list (sized by the caller), named name (t's own
 * name is not read). */
static void add_t(tspec *ts, int *n, const char *name, tspec t) {
    snprintf(t.name, sizeof t.name, "%s", name);
    ts[(*n)++] = t;
}

static int head_dim_of(const ak_synth_opts *o) { return o->head_dim ? o->head_dim : o->dim / o->n_heads; }
static int ds_rope(const ak_synth_opts *o) { return o->rope_dim ? o->rope_dim : head_dim_of(o) / 3; }
static int ds_vhead(const ak_synth_opts *o) { return o->v_head ? o->v_head : head_dim_of(o) - ds_rope(o); }

/* The weight type for rows of n: W when its blocks divide n, else Q8_0
 * when they can, else F16 (llama.cpp's quantizer falls back likewise for
 * deepseek2's 1408-wide experts and 128-wide per-head projections). */
static uint32_t fit_type(uint32_t W, uint64_t n) {
    if (n % gguf_type_block_elems(W) == 0) return W;
    return gguf_type_block_elems(W) > 1 && n % 32 == 0 ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
}

/* deepseek2's tensors of layer l (MLA without q compression; a dense FFN
 * for the leading layers, else router, experts and shared experts). */
static void list_deepseek2_layer(const ak_synth_opts *o, int l, tspec *ts, int *n) {
    const uint32_t W = o->wtype, F = GGML_TYPE_F32;
    const uint64_t dim = (uint64_t)o->dim, hd = (uint64_t)head_dim_of(o), R = (uint64_t)ds_rope(o);
    const uint64_t H = (uint64_t)o->n_heads, KL = (uint64_t)o->kv_lora, VH = (uint64_t)ds_vhead(o);
    const uint64_t NP = hd - R, ef = (uint64_t)o->expert_ffn, ne = (uint64_t)o->n_experts;
    const uint64_t sh = (uint64_t)o->n_experts_shared * ef, ffn = (uint64_t)o->ffn;
    const float s_dim = 1.0f / sqrtf((float)dim);
    char nm[64];
#define T(suffix, nd, ne0, ne1, ty, mu, sd)                                  \
    snprintf(nm, sizeof nm, "blk.%d." suffix, l);                           \
    add_t(ts, n, nm, (tspec){.n_dims = nd, .ne = {ne0, ne1, 1}, .type = ty, .mean = mu, .sigma = sd});
    T("attn_norm.weight", 1, dim, 1, F, 1.0f, 0.02f)
    T("attn_q.weight", 2, dim, H * hd, W, 0.0f, s_dim)
    T("attn_kv_a_mqa.weight", 2, dim, KL + R, W, 0.0f, s_dim)
    T("attn_kv_a_norm.weight", 1, KL, 1, F, 1.0f, 0.02f)
    T("attn_k_b.weight", 3, NP, KL, fit_type(W, NP), 0.0f, 1.0f / sqrtf((float)NP))
    ts[*n - 1].ne[2] = H;
    T("attn_v_b.weight", 3, KL, VH, fit_type(W, KL), 0.0f, 1.0f / sqrtf((float)KL))
    ts[*n - 1].ne[2] = H;
    T("attn_output.weight", 2, H * VH, dim, fit_type(W, H * VH), 0.0f, 1.0f / sqrtf((float)(H * VH)))
    T("ffn_norm.weight", 1, dim, 1, F, 1.0f, 0.02f)
    if (!ne || l < o->n_dense_lead) {
        T("ffn_gate.weight", 2, dim, ffn, W, 0.0f, s_dim)
        T("ffn_up.weight", 2, dim, ffn, W, 0.0f, s_dim)
        T("ffn_down.weight", 2, ffn, dim, fit_type(W, ffn), 0.0f, 1.0f / sqrtf((float)ffn))
    } else {
        T("ffn_gate_inp.weight", 2, dim, ne, F, 0.0f, s_dim)
        T("ffn_gate_exps.weight", 3, dim, ef, W, 0.0f, s_dim)
        ts[*n - 1].ne[2] = ne;
        T("ffn_up_exps.weight", 3, dim, ef, W, 0.0f, s_dim)
        ts[*n - 1].ne[2] = ne;
        T("ffn_down_exps.weight", 3, ef, dim, fit_type(W, ef), 0.0f, 1.0f / sqrtf((float)ef))
        ts[*n - 1].ne[2] = ne;
        if (sh) {
            T("ffn_gate_shexp.weight", 2, dim, sh, W, 0.0f, s_dim)
            T("ffn_up_shexp.weight", 2, dim, sh, W, 0.0f, s_dim)
            T("ffn_down_shexp.weight", 2, sh, dim, fit_type(W, sh), 0.0f, 1.0f / sqrtf((float)sh))
        }
    }
#undef T
}
static int is_arch(const ak_synth_opts *o, const char *a) { return strcmp(o->arch, a) == 0; }

/* Lists tensors in llama.cpp's order; returns the count. ts has room for
 * 3 + 16 * n_layers entries. */
static int list_tensors(const ak_synth_opts *o, int vocab, int qkv_bias, tspec *ts) {
    const uint32_t W = o->wtype, F = GGML_TYPE_F32;
    const int qk_norm = is_arch(o, "qwen3") || is_arch(o, "gemma3"), post = is_arch(o, "gemma3");
    const uint64_t dim = (uint64_t)o->dim, hd = (uint64_t)head_dim_of(o);
    const uint64_t qd = hd * (uint64_t)o->n_heads, kvd = hd * (uint64_t)o->n_kv_heads, ffn = (uint64_t)o->ffn;
    const float s_dim = 1.0f / sqrtf((float)dim), s_q = 1.0f / sqrtf((float)qd), s_ffn = 1.0f / sqrtf((float)ffn);
    int n = 0;
    char nm[64];
    add_t(ts, &n, "token_embd.weight",
          (tspec){.n_dims = 2, .ne = {dim, (uint64_t)vocab, 1}, .type = W, .mean = 0.0f, .sigma = 1.0f});
    for (int l = 0; l < o->n_layers; l++) {
        if (is_arch(o, "deepseek2")) { list_deepseek2_layer(o, l, ts, &n); continue; }
#define T(suffix, nd, ne0, ne1, ty, mu, sd)                                  \
        snprintf(nm, sizeof nm, "blk.%d." suffix, l);                       \
        add_t(ts, &n, nm, (tspec){.n_dims = nd, .ne = {ne0, ne1, 1}, .type = ty, .mean = mu, .sigma = sd});
        T("attn_norm.weight", 1, dim, 1, F, 1.0f, 0.02f)
        T("attn_q.weight", 2, dim, qd, W, 0.0f, s_dim)
        if (qkv_bias) { T("attn_q.bias", 1, qd, 1, F, 0.0f, 0.02f) }
        T("attn_k.weight", 2, dim, kvd, W, 0.0f, s_dim)
        if (qkv_bias) { T("attn_k.bias", 1, kvd, 1, F, 0.0f, 0.02f) }
        T("attn_v.weight", 2, dim, kvd, W, 0.0f, s_dim)
        if (qkv_bias) { T("attn_v.bias", 1, kvd, 1, F, 0.0f, 0.02f) }
        T("attn_output.weight", 2, qd, dim, W, 0.0f, s_q)
        if (qk_norm) {
            T("attn_q_norm.weight", 1, hd, 1, F, 1.0f, 0.02f)
            T("attn_k_norm.weight", 1, hd, 1, F, 1.0f, 0.02f)
        }
        if (post) { T("post_attention_norm.weight", 1, dim, 1, F, 1.0f, 0.02f) }
        T("ffn_norm.weight", 1, dim, 1, F, 1.0f, 0.02f)
        T("ffn_gate.weight", 2, dim, ffn, W, 0.0f, s_dim)
        T("ffn_up.weight", 2, dim, ffn, W, 0.0f, s_dim)
        T("ffn_down.weight", 2, ffn, dim, W, 0.0f, s_ffn)
        if (post) { T("post_ffw_norm.weight", 1, dim, 1, F, 1.0f, 0.02f) }
#undef T
    }
    add_t(ts, &n, "output_norm.weight",
          (tspec){.n_dims = 1, .ne = {dim, 1, 1}, .type = F, .mean = 1.0f, .sigma = 0.02f});
    if (!o->tied)
        add_t(ts, &n, "output.weight",
              (tspec){.n_dims = 2, .ne = {dim, (uint64_t)vocab, 1}, .type = W, .mean = 0.0f, .sigma = s_dim});
    return n;
}

/* One chunk of rows of one tensor, split across the pool's threads. */
typedef struct {
    const tspec *t;
    uint64_t key;
    int64_t row0, nrows;
    size_t row_bytes;
    uint8_t *dst;
    float *scratch;          /* ne[0] floats per thread */
    int64_t scratch_stride;
} gen_job;

static void gen_task(void *ctx, int ith, int nth) {
    const gen_job *j = ctx;
    int64_t a = j->nrows * ith / nth, b = j->nrows * (ith + 1) / nth;
    int64_t n = (int64_t)j->t->ne[0];
    float *x = j->scratch + (int64_t)ith * j->scratch_stride;
    for (int64_t r = a; r < b; r++) {
        uint8_t *dst = j->dst + (size_t)r * j->row_bytes;
        if (j->t->type == GGML_TYPE_F32) {
            gen_row(j->key, j->row0 + r, j->t->mean, j->t->sigma, (float *)dst, n);
        } else {
            gen_row(j->key, j->row0 + r, j->t->mean, j->t->sigma, x, n);
            ak_quantize_row(j->t->type, x, dst, n);
        }
    }
}

/* ---- tokenizer ---------------------------------------------------------- */

/* Writes normal piece k of the synthetic vocabulary into buf (NUL-terminated).
 * Order: "▁", the 94 printable ASCII characters, then for L = 1, 2, ...:
 * "▁" + every lowercase word of length L, then (L >= 2) every bare lowercase
 * word of length L. All unique, and every piece longer than one character
 * splits into two shorter pieces, so SentencePiece merging can reach it. */
static void piece(uint64_t k, char *buf) {
    static const char sp[] = "\xe2\x96\x81";   /* U+2581 ▁ */
    if (k == 0) { memcpy(buf, sp, sizeof sp); return; }
    if (k <= 94) { buf[0] = (char)(32 + k); buf[1] = 0; return; }
    k -= 95;
    for (int L = 1;; L++) {
        uint64_t words = 1;
        for (int i = 0; i < L; i++) words *= 26;
        for (int prefixed = 1; prefixed >= 0; prefixed--) {
            if (!prefixed && L == 1) continue;   /* already among the ASCII singles */
            if (k < words) {
                char *p = buf;
                if (prefixed) { memcpy(p, sp, 3); p += 3; }
                for (int i = L - 1; i >= 0; i--) { p[i] = (char)('a' + k % 26); k /= 26; }
                p[L] = 0;
                return;
            }
            k -= words;
        }
    }
}

/* The synthetic SentencePiece vocabulary, built before the output exists. */
typedef struct {
    int n;
    gguf_str *toks;
    float *scores;
    int32_t *types;
    char *pool;
} synth_vocab;

static void synth_vocab_free(synth_vocab *v) {
    free(v->toks);
    free(v->scores);
    free(v->types);
    free(v->pool);
    memset(v, 0, sizeof *v);
}

static int synth_vocab_build(synth_vocab *v, int n, const char *path, ak_error *err) {
    v->n = n;
    v->toks = calloc((size_t)n, sizeof *v->toks);
    v->scores = calloc((size_t)n, sizeof *v->scores);
    v->types = calloc((size_t)n, sizeof *v->types);
    v->pool = malloc((size_t)n * 16);   /* longest entry: "▁" + 5 letters + NUL */
    if (!v->toks || !v->scores || !v->types || !v->pool) {
        synth_vocab_free(v);
        return ak_fail(err, "%s: out of memory for a %d-token vocabulary", path, n);
    }
    char *p = v->pool;
    for (int i = 0; i < n; i++) {
        if (i == 0) { snprintf(p, 16, "<unk>"); v->types[i] = 2; }        /* UNKNOWN */
        else if (i == 1) { snprintf(p, 16, "<s>"); v->types[i] = 3; }    /* CONTROL */
        else if (i == 2) { snprintf(p, 16, "</s>"); v->types[i] = 3; }
        else if (i < 3 + 256) { snprintf(p, 16, "<0x%02X>", i - 3); v->types[i] = 6; }   /* BYTE */
        else {
            piece((uint64_t)(i - 259), p);
            v->types[i] = 1;                                          /* NORMAL */
            v->scores[i] = -(float)(i - 259);
        }
        v->toks[i].data = p;
        v->toks[i].len = strlen(p);
        p += v->toks[i].len + 1;
    }
    return 0;
}

static void synth_vocab_write(const synth_vocab *v, gguf_writer *w) {
    gguf_writer_kv_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_kv_arr_str_len(w, "tokenizer.ggml.tokens", v->toks, (uint64_t)v->n);
    gguf_writer_kv_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, v->scores, (uint64_t)v->n);
    gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->types, (uint64_t)v->n);
    gguf_writer_kv_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_writer_kv_bool(w, "tokenizer.ggml.add_bos_token", 1);
    gguf_writer_kv_bool(w, "tokenizer.ggml.add_eos_token", 0);
}

/* The tokenizer.* metadata of another GGUF, opened and checked before the
 * output is created, so that copying it cannot fail half way. */
typedef struct {
    gguf_file f;
    int vocab;
    char *strbuf;         /* room for the longest string value plus NUL */
} vocab_src;

static int is_tok_key(const gguf_kv *kv) {
    return kv->key.len >= 10 && memcmp(kv->key.data, "tokenizer.", 10) == 0;
}

/* The writer has setters for u32/i32/f32/bool/string and arrays; other
 * scalar widths are widened or narrowed to those when exact (a reader's typed
 * getters accept either). Returns 0 if kv can be copied that way. */
static int copyable(const gguf_kv *kv) {
    switch (kv->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        return kv->v.u64 <= UINT32_MAX ? 0 : -1;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        return kv->v.i64 >= INT32_MIN && kv->v.i64 <= INT32_MAX ? 0 : -1;
    case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64: case GGUF_TYPE_BOOL: case GGUF_TYPE_ARRAY:
        return 0;
    case GGUF_TYPE_STRING:   /* the setter takes a C string */
        return kv->v.str.len && memchr(kv->v.str.data, 0, kv->v.str.len) ? -1 : 0;
    }
    return -1;
}

static int vocab_src_open(vocab_src *v, const char *src, ak_error *err) {
    memset(v, 0, sizeof *v);
    if (gguf_open(&v->f, src, err) < 0) return -1;
    const gguf_kv *tk = gguf_get_arr(&v->f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, err);
    if (!tk) goto fail;
    if (tk->v.arr.count == 0 || tk->v.arr.count > (1u << 24)) {
        ak_fail(err, "%s: tokenizer.ggml.tokens has %llu tokens", src, (unsigned long long)tk->v.arr.count);
        goto fail;
    }
    v->vocab = (int)tk->v.arr.count;
    uint64_t longest = 0;
    for (uint64_t i = 0; i < v->f.n_kv; i++) {
        const gguf_kv *kv = &v->f.kv[i];
        if (!is_tok_key(kv)) continue;
        if (kv->key.len > 255 || copyable(kv) < 0) {
            ak_fail(err, "%s: cannot copy metadata '%.*s' (type %s)", src, (int)(kv->key.len > 64 ? 64 : kv->key.len),
                    kv->key.data, gguf_type_name(kv->type));
            goto fail;
        }
        if (kv->type == GGUF_TYPE_STRING && kv->v.str.len > longest) longest = kv->v.str.len;
    }
    v->strbuf = malloc((size_t)longest + 1);
    if (!v->strbuf) {
        ak_fail(err, "%s: out of memory", src);
        goto fail;
    }
    return 0;
fail:
    gguf_close(&v->f);
    return -1;
}

static void vocab_src_close(vocab_src *v) {
    gguf_close(&v->f);
    free(v->strbuf);
    memset(v, 0, sizeof *v);
}

/* Copies every tokenizer.* pair (all checked by vocab_src_open). */
static void vocab_src_copy(const vocab_src *v, gguf_writer *w) {
    for (uint64_t i = 0; i < v->f.n_kv; i++) {
        const gguf_kv *kv = &v->f.kv[i];
        if (!is_tok_key(kv)) continue;
        char key[256];
        memcpy(key, kv->key.data, kv->key.len);
        key[kv->key.len] = 0;
        switch (kv->type) {
        case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
            gguf_writer_kv_u32(w, key, (uint32_t)kv->v.u64);
            break;
        case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
            gguf_writer_kv_i32(w, key, (int32_t)kv->v.i64);
            break;
        case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64:
            gguf_writer_kv_f32(w, key, (float)kv->v.f64);
            break;
        case GGUF_TYPE_BOOL:
            gguf_writer_kv_bool(w, key, kv->v.u64 != 0);
            break;
        case GGUF_TYPE_STRING:
            if (kv->v.str.len) memcpy(v->strbuf, kv->v.str.data, kv->v.str.len);
            v->strbuf[kv->v.str.len] = 0;
            gguf_writer_kv_str(w, key, v->strbuf);
            break;
        case GGUF_TYPE_ARRAY:
            if (kv->v.arr.type == GGUF_TYPE_STRING)
                gguf_writer_kv_arr_str_len(w, key, kv->v.arr.strs, kv->v.arr.count);
            else
                gguf_writer_kv_arr(w, key, kv->v.arr.type, kv->v.arr.data, kv->v.arr.count);
            break;
        }
    }
}

/* ---- the file ------------------------------------------------------------ */

static uint32_t file_type(uint32_t wtype) {
    switch (wtype) {   /* llama.cpp's LLAMA_FTYPE_ALL_F32, MOSTLY_F16, ... */
    case GGML_TYPE_F32: return 0;
    case GGML_TYPE_F16: return 1;
    case GGML_TYPE_Q4_0: return 2;
    case GGML_TYPE_Q8_0: return 7;
    case GGML_TYPE_Q4_1: return 3;
    case GGML_TYPE_Q5_0: return 8;
    case GGML_TYPE_Q5_1: return 9;
    case GGML_TYPE_Q4_K: return 14;   /* Q4_K_S: every matrix Q4_K */
    case GGML_TYPE_Q5_K: return 16;   /* Q5_K_S */
    case GGML_TYPE_Q6_K: return 18;
    case GGML_TYPE_BF16: return 32;
    default: return 0;
    }
}

static int check_opts(const ak_synth_opts *o, int *qkv_bias, ak_error *err) {
    const char *p = o->path;
    if (!o->arch || (strcmp(o->arch, "llama") && strcmp(o->arch, "qwen2") && strcmp(o->arch, "qwen3") &&
                     strcmp(o->arch, "gemma3") && strcmp(o->arch, "deepseek2")))
        return ak_fail(err, "%s: architecture '%s' is not llama, qwen2, qwen3, gemma3 or deepseek2", p,
                       o->arch ? o->arch : "");
    if (!strcmp(o->arch, "deepseek2")) {
        int hd = o->head_dim, R = o->rope_dim ? o->rope_dim : hd / 3;
        if (o->kv_lora < 2 || o->kv_lora > 4096 || hd < 4 || R < 2 || R % 2 || R >= hd ||
            (o->v_head && (o->v_head < 1 || o->v_head > 1024)) || o->n_experts < 0 || o->n_experts > 1024 ||
            (o->n_experts && (o->n_experts_used < 1 || o->n_experts_used > o->n_experts || o->expert_ffn < 1 ||
                              o->n_experts_shared < 0 || o->n_dense_lead < 0)))
            return ak_fail(err, "%s: deepseek2 needs --head-dim, a kv_lora, an even rope part smaller than the head "
                           "and a consistent expert layout", p);
    }
    *qkv_bias = strcmp(o->arch, "qwen2") == 0;
    uint32_t t = o->wtype;
    if (!ak_wtype_supported(t))
        return ak_fail(err, "%s: weight type %s is not F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K",
                       p, gguf_tensor_type_name(t));
    if (o->dim < 1 || o->dim > 65536) return ak_fail(err, "%s: dim %d out of range", p, o->dim);
    if (o->n_layers < 1 || o->n_layers > 1024) return ak_fail(err, "%s: %d layers out of range", p, o->n_layers);
    if (o->n_heads < 1 || (!o->head_dim && o->dim % o->n_heads))
        return ak_fail(err, "%s: dim %d is not a multiple of %d heads", p, o->dim, o->n_heads);
    if (o->head_dim < 0 || o->head_dim > 1024 || head_dim_of(o) % 2)
        return ak_fail(err, "%s: head dim %d is odd or out of range (RoPE rotates pairs)", p, head_dim_of(o));
    if (o->yarn_factor < 0 || o->yarn_orig_ctx < 0 || !isfinite(o->yarn_factor) || !isfinite(o->yarn_log_mul))
        return ak_fail(err, "%s: YaRN factor %g, original context %d or log multiplier %g is invalid", p,
                       o->yarn_factor, o->yarn_orig_ctx, o->yarn_log_mul);
    if (o->window < 0 || o->rope_base_swa < 0 || o->swa_pattern < 0)
        return ak_fail(err, "%s: sliding window %d or its RoPE base %g is negative", p, o->window, o->rope_base_swa);
    if (o->n_kv_heads < 1 || o->n_heads % o->n_kv_heads)
        return ak_fail(err, "%s: %d heads is not a multiple of %d KV heads", p, o->n_heads, o->n_kv_heads);
    if (o->ffn < 1 || o->ffn > 1 << 20) return ak_fail(err, "%s: ffn %d out of range", p, o->ffn);
    if (o->ctx < 1) return ak_fail(err, "%s: context length %d out of range", p, o->ctx);
    if (o->vocab_from && o->tokenizer_json)
        return ak_fail(err, "%s: a vocabulary from a GGUF and from a tokenizer.json exclude each other", p);
    if (!o->vocab_from && !o->tokenizer_json && (o->vocab < MIN_SYNTH_VOCAB || o->vocab > 1 << 24))
        return ak_fail(err, "%s: vocab %d out of range [%d, %d]", p, o->vocab, MIN_SYNTH_VOCAB, 1 << 24);
    uint32_t be = gguf_type_block_elems(t);
    if (o->dim % (int)be || (strcmp(o->arch, "deepseek2") && o->ffn % (int)be))   /* deepseek2: fit_type */
        return ak_fail(err, "%s: dim %d and ffn %d must be multiples of %u for %s", p, o->dim, o->ffn, be,
                       gguf_tensor_type_name(t));
    if (!(o->rope_base > 0) || !(o->rms_eps > 0)) return ak_fail(err, "%s: rope base and rms eps must be > 0", p);
    return 0;
}

/* Writes all metadata, the vocabulary from vs, else hv, else sv. Failures
 * stay in the writer (reported at close). */
static void write_metadata(gguf_writer *w, const ak_synth_opts *o, const vocab_src *vs, const ak_hfvocab *hv,
                           const synth_vocab *sv, int vocab) {
    char key[96], name[128];
    const char *a = o->arch;
    snprintf(name, sizeof name, "synthetic %s", o->name ? o->name : a);
    gguf_writer_kv_str(w, "general.architecture", a);
    gguf_writer_kv_str(w, "general.name", name);
    gguf_writer_kv_u32(w, "general.file_type", file_type(o->wtype));
    if (gguf_type_block_elems(o->wtype) > 1) gguf_writer_kv_u32(w, "general.quantization_version", 2);
    gguf_writer_kv_u32(w, "general.alignment", GGUF_DEFAULT_ALIGNMENT);
#define KV(kind, suffix, v) snprintf(key, sizeof key, "%s." suffix, a); gguf_writer_kv_##kind(w, key, v);
    KV(u32, "context_length", (uint32_t)o->ctx)
    KV(u32, "embedding_length", (uint32_t)o->dim)
    KV(u32, "block_count", (uint32_t)o->n_layers)
    KV(u32, "feed_forward_length", (uint32_t)o->ffn)
    KV(u32, "attention.head_count", (uint32_t)o->n_heads)
    KV(u32, "attention.head_count_kv", (uint32_t)(is_arch(o, "deepseek2") ? 1 : o->n_kv_heads))
    KV(f32, "rope.freq_base", o->rope_base)
    KV(f32, "attention.layer_norm_rms_epsilon", o->rms_eps)
    KV(u32, "rope.dimension_count", (uint32_t)(is_arch(o, "deepseek2") ? ds_rope(o) : head_dim_of(o)))
    KV(u32, "vocab_size", (uint32_t)vocab)
    if (is_arch(o, "deepseek2")) {   /* llama.cpp's layout: key/value_length are the latent cache's */
        KV(u32, "attention.key_length", (uint32_t)(o->kv_lora + ds_rope(o)))
        KV(u32, "attention.value_length", (uint32_t)o->kv_lora)
        KV(u32, "attention.key_length_mla", (uint32_t)o->head_dim)
        KV(u32, "attention.value_length_mla", (uint32_t)ds_vhead(o))
        KV(u32, "attention.q_lora_rank", 0)
        KV(u32, "attention.kv_lora_rank", (uint32_t)o->kv_lora)
        KV(u32, "leading_dense_block_count", (uint32_t)o->n_dense_lead)
        KV(u32, "expert_count", (uint32_t)o->n_experts)
        KV(u32, "expert_used_count", (uint32_t)o->n_experts_used)
        KV(u32, "expert_shared_count", (uint32_t)o->n_experts_shared)
        KV(u32, "expert_feed_forward_length", (uint32_t)o->expert_ffn)
        KV(f32, "expert_weights_scale", 1.0f)
        KV(u32, "expert_gating_func", 1)
    } else if (o->head_dim) {
        KV(u32, "attention.key_length", (uint32_t)o->head_dim)
        KV(u32, "attention.value_length", (uint32_t)o->head_dim)
    }
    if (o->yarn_factor > 0) {
        snprintf(key, sizeof key, "%s.rope.scaling.type", a);
        gguf_writer_kv_str(w, key, "yarn");
        KV(f32, "rope.scaling.factor", o->yarn_factor)
        KV(u32, "rope.scaling.original_context_length", (uint32_t)(o->yarn_orig_ctx > 0 ? o->yarn_orig_ctx : o->ctx))
        KV(f32, "rope.scaling.yarn_log_multiplier", o->yarn_log_mul)
    }
    if (is_arch(o, "gemma3")) {
        KV(u32, "attention.sliding_window", (uint32_t)(o->window ? o->window : 512))
        KV(f32, "rope.freq_base_swa", o->rope_base_swa > 0 ? o->rope_base_swa : 10000.0f)
        snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
        if (o->swa_layers) gguf_writer_kv_arr(w, key, GGUF_TYPE_BOOL, o->swa_layers, (uint64_t)o->n_layers);
        else if (o->swa_pattern > 0) gguf_writer_kv_u32(w, key, (uint32_t)o->swa_pattern);
    }
#undef KV
    if (vs) vocab_src_copy(vs, w);
    else if (hv) ak_hfvocab_write(hv, w);
    else synth_vocab_write(sv, w);
}

/* Everything that can fail for reasons of our own (shape, vocab_from,
 * memory) is done before the output is created: after gguf_writer_open the
 * only failures are the writer's, and gguf_writer_close then removes
 * PATH.tmp (the API has no "abort": closing a healthy writer commits). */
int ak_synth_write(const ak_synth_opts *o, ak_error *err) {
    if (!o->path || !*o->path) return ak_fail(err, "synth: no output path");
    int qkv_bias = 0;
    if (check_opts(o, &qkv_bias, err) < 0) return -1;

    vocab_src vs;
    synth_vocab sv = {0};
    ak_hfvocab *hv = NULL;
    int vocab = o->vocab;
    if (o->vocab_from) {
        if (vocab_src_open(&vs, o->vocab_from, err) < 0) return -1;
        vocab = vs.vocab;
    } else if (o->tokenizer_json) {
        if (!(hv = ak_hfvocab_load(o->tokenizer_json, err))) return -1;
        vocab = ak_hfvocab_size(hv);
    } else if (synth_vocab_build(&sv, vocab, o->path, err) < 0) {
        return -1;
    }
    int rc = -1;
    ak_threads *pool = NULL;
    uint8_t *chunk = NULL;
    float *scratch = NULL;
    tspec *ts = calloc(3 + 16 * (size_t)o->n_layers, sizeof *ts);
    if (!ts) { ak_fail(err, "%s: out of memory", o->path); goto done; }
    int nt = list_tensors(o, vocab, qkv_bias, ts);
    uint64_t total = 0, written = 0;
    int64_t max_row = 0;
    for (int i = 0; i < nt; i++) {
        total += ak_row_bytes(ts[i].type, (int64_t)ts[i].ne[0]) * ts[i].ne[1] * ts[i].ne[2];
        if ((int64_t)ts[i].ne[0] > max_row) max_row = (int64_t)ts[i].ne[0];
    }
    pool = ak_threads_new(o->n_threads, err);
    if (!pool) goto done;
    int nth = ak_threads_size(pool);
    /* a chunk holds at least one row: the widest F32 row is 4 * max_row */
    size_t chunk_cap = CHUNK_BYTES > 4 * (size_t)max_row ? CHUNK_BYTES : 4 * (size_t)max_row;
    chunk = malloc(chunk_cap);
    scratch = malloc((size_t)nth * (size_t)max_row * sizeof(float));
    if (!chunk || !scratch) { ak_fail(err, "%s: out of memory", o->path); goto done; }

    gguf_writer *w = gguf_writer_open(o->path, err);
    if (!w) goto done;
    write_metadata(w, o, o->vocab_from ? &vs : NULL, hv, &sv, vocab);
    for (int i = 0; i < nt; i++) gguf_writer_tensor(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne);
    if (gguf_writer_begin_data(w) == 0) {
        for (int i = 0; i < nt; i++) {
            const tspec *t = &ts[i];
            size_t rb = ak_row_bytes(t->type, (int64_t)t->ne[0]);
            int64_t rows = (int64_t)(t->ne[1] * t->ne[2]), per = (int64_t)(chunk_cap / rb);
            gen_job j = {.t = t, .key = o->seed * 0x9E3779B97F4A7C15ull ^ fnv1a(t->name), .row0 = 0, .nrows = 0,
                         .row_bytes = rb, .dst = chunk, .scratch = scratch, .scratch_stride = max_row};
            for (int64_t r0 = 0; r0 < rows; r0 += per) {
                j.row0 = r0;
                j.nrows = rows - r0 < per ? rows - r0 : per;
                ak_threads_run(pool, gen_task, &j);
                if (gguf_writer_write(w, chunk, (size_t)j.nrows * rb) < 0) goto close;
                written += (uint64_t)j.nrows * rb;
                if (o->progress) o->progress(o->progress_ctx, total ? (double)written / (double)total : 1.0);
            }
        }
    }
close:
    /* the writer holds the first error of any of its calls */
    rc = gguf_writer_close(w, err);
done:
    if (o->vocab_from) vocab_src_close(&vs);
    ak_hfvocab_free(hv);
    synth_vocab_free(&sv);
    ak_threads_free(pool);
    free(chunk);
    free(scratch);
    free(ts);
    return rc;
}
