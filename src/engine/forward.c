/* forward.c - the forward pass over a loaded model (see model.h): the
 * context's scratch (ak_ctx), then one batch through the layers in order:
 * checks and RoPE tables (batch_setup), embeddings, per layer attention
 * (grouped-query, or multi-head latent for deepseek2) and FFN (SwiGLU,
 * GeGLU or mixture of experts), each added to the residual stream, and the
 * logits of the tokens that want them. The layer-range entry points, ak_eval
 * and the position shift of cached keys reuse the same steps, so they give
 * the same bits. Reads the model only (model_load.c made it); writes the
 * batch's K/V into its sequences and the context's scratch.
 */
#include "engine/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/attnstats.h"
#include "kv/blockpool.h"
#include "kernels/kernels.h"
#include "base/vmath.h"

#define LOGIT_ROWS 32   /* output projection is done this many tokens at a time */

struct ak_ctx {
    const ak_model *m;
    ak_threads *pool;
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

/* The context's scratch, sized for max_batch tokens of m, and its pool
 * (see model.h). */
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
    c->pool = ak_threads_new(n_threads, err);
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
    ak_threads_free(c->pool);
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
ak_threads *ak_ctx_pool(ak_ctx *c) { return c->pool; }
const ak_model *ak_ctx_model(const ak_ctx *c) { return c->m; }

/* out = x / sqrt(mean(x^2) + eps) * w over n elements; out may be x. */
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

/* One layer's attention over the units of attention_units, for the pool. */
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
    int group = cf->n_head / cf->n_head_kv, nth = ak_threads_size(c->pool), n = 0;
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

/* Thread ith of nth: attends the units ith, ith + nth, ... of the task,
 * each writing its own rows of the context's attention output. */
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
        const ak_kv_query qr = {.layer = t->layer, .kv_head = g, .q = q + i * qs + (size_t)g * group * dk,
                                .qstride = qs, .n_q = group, .scale = cf->attn_scale,
                                .out = t->c->att + i * os + (size_t)g * group * dv, .ostride = os, .scratch = scratch};
        ak_kv_attend_run_window(t->b->seq[i], &qr, len, t->b->pos[i], window);
    }
}

/* Y (n x w->rows) = X (n x w->cols) W^T, from the packed copy when there is one. */
static void matmul(ak_threads *pool, const ak_weight *w, const float *X, int n, float *Y) {
    if (w->packed)   /* cannot fail: packed where ak_packed_bytes > 0 */
        ak_matmul_packed(pool, &(ak_matmul_args){ .wtype = w->type, .W = w->packed, .rows = w->rows, .cols = w->cols,
                                                  .X = X, .ntok = n, .Y = Y }, NULL);
    else ak_matmul(pool, w->type, w->data, w->rows, w->cols, X, n, Y);
}

/* Y[i] = X W[i]^T for n (2 or 3) matrices that read the same X (a layer's
 * Q, K, V; its gate and up): one parallel region and one quantization of X
 * where all are packed with the same type and width, else one product each.
 * The same bits either way (kernels.h). */
static void matmul_n(ak_threads *pool, int n, const ak_weight *const *w, const float *X, int ntok, float *const *Y) {
    ak_matmul_args a[AK_MATMUL_PACKED_MAX];
    int same = n <= AK_MATMUL_PACKED_MAX;
    for (int i = 0; i < n && same; i++) {
        same = w[i]->packed && w[i]->type == w[0]->type && w[i]->cols == w[0]->cols;
        a[i] = (ak_matmul_args){ .wtype = w[i]->type, .W = w[i]->packed, .rows = w[i]->rows, .cols = w[i]->cols,
                                 .X = X, .ntok = ntok, .Y = Y[i] };
    }
    if (same && ak_matmul_packed_n(pool, n, a, NULL) == 0) return;
    for (int i = 0; i < n; i++) matmul(pool, w[i], X, ntok, Y[i]);
}

/* The embedding row of token tok, as f32, into out (dim floats). */
static void embed(const ak_model *m, int32_t tok, float *out) {
    const ak_weight *e = &m->tok_embd;
    ak_dequantize_row(e->type, (const uint8_t *)e->data + ak_row_bytes(e->type, e->cols) * tok, out, e->cols);
}

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
    attn_task at = {.c = c, .b = b, .layer = l, .n_units = n_units};
    ak_threads_run(c->pool, attn_worker, &at);
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
    attn_task at = {.c = c, .b = b, .layer = l, .n_units = n_units};
    ak_threads_run(c->pool, attn_worker, &at);
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

/* One batch through the whole model: setup, embeddings, every layer, the
 * logits wanted, then the windows released. Returns 0, or -1 with err set. */
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

int ak_forward(ak_ctx *c, const ak_batch *b, ak_error *err) {
    unsigned fp_mode = ak_flush_denormals();
    int rc = forward(c, b, err);
    ak_restore_denormals(fp_mode);
    return rc;
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

/* ak_forward_layers without the floating-point mode: layers [l0, l1) on
 * the caller's residual stream x. */
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

/* ak_layer_kv without the floating-point mode: layer l's K and V of the
 * batch from the residual stream x, nothing written to a cache. */
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

int ak_eval(ak_ctx *c, ak_kv *kv, const ak_eval_args *a, ak_error *err) {
    const int32_t *tokens = a->tokens;
    const int n = a->n, pos0 = a->pos0;
    float *logits = a->logits, *all_logits = a->all_logits;
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
        ak_batch b = {.n = cnt, .token = tokens + i0, .pos = pos, .seq = seq, .logits_out = out};
        rc = ak_forward(c, &b, err);
        if (rc == 0 && all_logits && logits && i0 + cnt == n)
            memcpy(logits, all_logits + (size_t)(n - 1) * V, V * sizeof(float));
        if (a->progress) a->progress(a->ud, (double)(i0 + cnt) / n);
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
