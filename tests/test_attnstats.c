/* test_attnstats.c - the attention-statistics hook (attnstats.h) against an
 * independent double-precision reference: probabilities recomputed here from
 * the keys read back from the cache and queries recomputed from the model's
 * f32 weights (layer 0 of a real model), or given to the hook directly
 * (sliding-window and global layers of gemma3, two sequences in a batch);
 * the sums its definitions imply; and that it changes no logit. */
#include <string.h>

#include "engine/attnstats.h"
#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "engine/model.h"
#include "test.h"

/* Reference accumulators: per query head h and slot, mass and entropy sums
 * (one chosen layer), and query counts. */
typedef struct {
    int H, n;
    double *mass;   /* (H, n) */
    double *ent;    /* (H, n) */
    int *nq;        /* (n) */
    int *seen;      /* (n) queries whose visible range held the slot */
} ref_stats;

static void ref_init(ref_stats *r, int H, int n) {
    r->H = H;
    r->n = n;
    r->mass = calloc((size_t)H * n, sizeof(double));
    r->ent = calloc((size_t)H * n, sizeof(double));
    r->nq = calloc(n, sizeof(int));
    r->seen = calloc(n, sizeof(int));
}

static void ref_free(ref_stats *r) { free(r->mass); free(r->ent); free(r->nq); free(r->seen); }

/* One layer's keys as the reference reads them: slot-major, kstride floats
 * apart, KV head j at offset j * d; `group` query heads share a KV head. */
typedef struct {
    const float *K;
    size_t kstride;
    int d, group;
    double scale;
} ref_keys;

/* Adds query head h's softmax over keys [lo, p] to r: the definition,
 * written out plainly. */
static void ref_add(ref_stats *r, const ref_keys *k, int h, int p, int lo, const double *q) {
    const float *K = k->K;
    size_t kstride = k->kstride;
    int d = k->d, koff = (h / k->group) * d;
    double scale = k->scale;
    double *s = malloc(sizeof(double) * (p + 1)), mx = -1e300, z = 0;
    for (int t = lo; t <= p; t++) {
        double acc = 0;
        for (int i = 0; i < d; i++) acc += q[i] * K[(size_t)t * kstride + koff + i];
        s[t] = acc * scale;
        if (s[t] > mx) mx = s[t];
    }
    for (int t = lo; t <= p; t++) z += exp(s[t] - mx);
    double H = 0;
    for (int t = lo; t <= p; t++) {
        double pr = exp(s[t] - mx) / z;
        r->mass[(size_t)h * r->n + t] += pr;
        if (pr > 0) H -= pr * log(pr);
    }
    r->ent[(size_t)h * r->n + p] += H;
    for (int t = lo; t <= p && h == 0; t++) r->seen[t]++;
    free(s);
}

/* max over slots of |a - b| / max(|b|, floor). */
static double rel_diff(const double *a, const double *b, int n, double floor) {
    double w = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]) / (fabs(b[i]) > floor ? fabs(b[i]) : floor);
        if (d > w) w = d;
    }
    return w;
}

/* Compares st (one chosen layer) with r: per-head masses, total mass,
 * variance across heads and entropy, to rel relative error. */
static void compare(ak_test_ctx *t, const char *what, const ak_attn_stats *st, const ref_stats *r, double rel) {
    int n = r->n, H = r->H;
    CHECK(ak_attn_stats_length(st) == n, "%s: length %d, expected %d", what, ak_attn_stats_length(st), n);
    if (ak_attn_stats_length(st) != n) return;
    double *mass = calloc(n, sizeof(double)), *var = calloc(n, sizeof(double)), *ent = calloc(n, sizeof(double));
    double *rm = calloc(n, sizeof(double)), *rv = calloc(n, sizeof(double)), *re = calloc(n, sizeof(double));
    int64_t *nq = calloc(n, sizeof(int64_t));
    double *ex = calloc(n, sizeof(double));
    ak_attn_stats_exposure(st, ex);
    ak_attn_stats_mass(st, mass);
    ak_attn_stats_mass_var(st, var);
    ak_attn_stats_entropy(st, ent);
    ak_attn_stats_query_count(st, nq);
    double worst_head = 0;
    for (int h = 0; h < H; h++) {
        double w = rel_diff(ak_attn_stats_head_mass(st, 0, h), r->mass + (size_t)h * n, n, 1e-3);
        if (w > worst_head) worst_head = w;
    }
    int badq = 0;
    for (int i = 0; i < n; i++) {
        double mean = 0;
        for (int h = 0; h < H; h++) { rm[i] += r->mass[(size_t)h * n + i]; re[i] += r->ent[(size_t)h * n + i]; }
        mean = rm[i] / H;
        for (int h = 0; h < H; h++) rv[i] += (r->mass[(size_t)h * n + i] - mean) * (r->mass[(size_t)h * n + i] - mean);
        rv[i] /= H;
        re[i] = r->nq[i] ? re[i] / ((double)r->nq[i] * H) : 0;
        badq += nq[i] != r->nq[i] || ex[i] != r->seen[i];
    }
    double wm = rel_diff(mass, rm, n, 1e-3), wv = rel_diff(var, rv, n, 1e-6), we = rel_diff(ent, re, n, 1e-3);
    fprintf(stderr, "  %s: max relative error: head mass %.2g, mass %.2g, variance %.2g, entropy %.2g\n", what,
            worst_head, wm, wv, we);
    CHECK(worst_head <= rel, "%s: per-head mass off by %g", what, worst_head);
    CHECK(wm <= rel, "%s: mass off by %g", what, wm);
    CHECK(wv <= rel, "%s: variance off by %g", what, wv);
    CHECK(we <= rel, "%s: entropy off by %g", what, we);
    CHECK(badq == 0, "%s: %d query counts or exposures differ", what, badq);
    free(ex);
    free(mass); free(var); free(ent); free(rm); free(rv); free(re); free(nq);
}

/* Layer-0 query of token tok at RoPE position pos, recomputed from the f32
 * weights in double: embedding, RMS norm, Wq, RoPE (llama's interleaved
 * pairs). Only for f32 llama files without q/k norms or biases. */
static void layer0_query(const ak_model *m, int32_t tok, int pos, double *q) {
    const ak_config *cf = &m->cfg;
    int dim = cf->dim, qd = cf->n_head * cf->head_dim;
    const float *e = (const float *)m->tok_embd.data + (size_t)tok * dim, *W = m->layers[0].wq.data;
    double ss = 0, *x = malloc(sizeof(double) * dim);
    for (int i = 0; i < dim; i++) ss += (double)e[i] * e[i];
    double sc = 1.0 / sqrt(ss / dim + cf->rms_eps);
    for (int i = 0; i < dim; i++) x[i] = e[i] * sc * m->layers[0].attn_norm[i];
    for (int r = 0; r < qd; r++) {
        double acc = 0;
        for (int i = 0; i < dim; i++) acc += (double)W[(size_t)r * dim + i] * x[i];
        q[r] = acc;
    }
    for (int h = 0; h < cf->n_head; h++)
        for (int j = 0; j < cf->rope_dim / 2; j++) {
            double th = pos * (double)m->inv_freq[j], c = cos(th), s = sin(th);
            double *v = q + (size_t)h * cf->head_dim;
            double a = v[2 * j], b = v[2 * j + 1];
            v[2 * j] = a * c - b * s;
            v[2 * j + 1] = a * s + b * c;
        }
    free(x);
}

/* Layer 0 of real f32 llama models (stories260K, tiny-llama-h64): the hook's
 * mass, variance and entropy after a prefill in several chunks and a few
 * decoded tokens equal the double reference over ak_kv_read keys and
 * queries recomputed from the weights, to 1e-5 relative. */
TEST(attnstats_layer0_matches_reference) {
    static const char *const models[] = {"models/stories260K.gguf", "models/tiny-llama-h64-gqa-f32.gguf"};
    enum { N = 70, DEC = 5 };
    for (size_t mi = 0; mi < 2; mi++) {
        char path[512];
        ak_error err = {{0}};
        ak_model *m = ak_model_load(test_path(path, sizeof path, models[mi]), NULL, NULL, &err);
        REQUIRE(m, "%s: %s", models[mi], err.msg);
        REQUIRE(m->cfg.arch == AK_ARCH_LLAMA && m->tok_embd.type == GGML_TYPE_F32 && m->layers[0].wq.type ==
                GGML_TYPE_F32 && !m->layers[0].bq && !m->layers[0].q_norm, "%s: not an f32 llama", models[mi]);
        ak_block_pool *pool = ak_block_pool_new(&m->spec, 16, 0, &err);
        ak_ctx *c = ak_ctx_new(m, 24, 2, &err);
        ak_kv *kv = ak_kv_new(pool, AK_KV_F32, AK_KV_F32, 256, &err);
        int zero = 0;
        ak_attn_stats *st = ak_attn_stats_new(m, &zero, 1, &err);
        REQUIRE(pool && c && kv && st, "setup: %s", err.msg);
        ak_ctx_set_attn_stats(c, st);
        int32_t tok[N + DEC];
        ak_rng r;
        ak_rng_seed(&r, 17 + mi);
        for (int i = 0; i < N + DEC; i++) tok[i] = 3 + (int32_t)(ak_rng_u32(&r) % (uint32_t)(m->cfg.vocab - 3));
        REQUIRE(ak_eval(c, kv, &(ak_eval_args){.tokens = tok, .n = N}, &err) == 0, "prefill: %s", err.msg);
        for (int i = N; i < N + DEC; i++)
            REQUIRE(ak_eval(c, kv, &(ak_eval_args){.tokens = tok + i, .n = 1, .pos0 = i}, &err) == 0,
                    "decode: %s", err.msg);
        ak_ctx_set_attn_stats(c, NULL);
        int n = N + DEC, H = m->cfg.n_head, hd = m->cfg.head_dim, Hkv = m->cfg.n_head_kv;
        size_t ks = (size_t)Hkv * hd;
        float *K = malloc(sizeof(float) * ks * n), *v = malloc(sizeof(float) * ks);
        for (int p = 0; p < n; p++) REQUIRE(ak_kv_read(kv, 0, p, K + p * ks, v, &err) == 0, "read: %s", err.msg);
        ref_stats ref;
        ref_init(&ref, H, n);
        double *q = malloc(sizeof(double) * H * hd);
        for (int p = 0; p < n; p++) {
        const ref_keys keys = {.K = K, .kstride = ks, .d = hd, .group = H / Hkv, .scale = m->cfg.attn_scale};
            layer0_query(m, tok[p], p, q);
            for (int h = 0; h < H; h++) ref_add(&ref, &keys, h, p, 0, q + (size_t)h * hd);
            ref.nq[p]++;
        }
        compare(t, models[mi], st, &ref, 1e-5);
        ref_free(&ref);
        free(q); free(K); free(v);
        ak_attn_stats_free(st);
        ak_kv_free(kv);
        ak_ctx_free(c);
        ak_block_pool_free(pool);
        ak_model_free(m);
    }
}

/* The hook's arithmetic at two layers of the model rel (n_head: a head count
 * forced on it, 0 keeps the file's), given queries directly: keys and
 * queries drawn at random into an f32 cache, batches that are runs of one
 * sequence, decode-like single tokens, and a batch mixing a second sequence
 * that the tracked-sequence filter must leave out. Against the double
 * reference, to 1e-5 relative. */
static void observe_case(ak_test_ctx *t, const char *rel, int layer0, int layer1, int n_head) {
    char path[512];
    ak_error err = {{0}};
    ak_model *m = ak_model_load(test_path(path, sizeof path, rel), NULL, NULL, &err);
    REQUIRE(m, "%s: %s", rel, err.msg);
    int file_heads = m->cfg.n_head;
    if (n_head) m->cfg.n_head = n_head;   /* the hook reads the head count from here: other group sizes */
    enum { N = 60 };
    int H = m->cfg.n_head, Hkv = m->spec.n_head_kv, dk = m->spec.head_dim_k, dv = m->spec.head_dim_v;
    size_t ks = (size_t)Hkv * dk, qs = (size_t)H * dk;
    ak_block_pool *pool = ak_block_pool_new(&m->spec, 16, 0, &err);
    ak_kv *kv = ak_kv_new(pool, AK_KV_F32, AK_KV_F32, 256, &err), *other = ak_kv_new(pool, AK_KV_F32, AK_KV_F32, 256, &err);
    ak_threads *threads = ak_threads_new(3, &err);
    REQUIRE(pool && kv && other && threads, "setup: %s", err.msg);
    float *K = malloc(sizeof(float) * ks * N), *V = malloc(sizeof(float) * Hkv * dv), *Q = malloc(sizeof(float) * qs * N);
    ak_rng r;
    ak_rng_seed(&r, 99);
    for (size_t i = 0; i < ks * N; i++) K[i] = ak_rng_normal(&r);
    for (size_t i = 0; i < qs * N; i++) Q[i] = 0.5f * ak_rng_normal(&r);
    for (int i = 0; i < Hkv * dv; i++) V[i] = ak_rng_normal(&r);
    for (int li = 0; li < 2; li++) {
        int layer = li ? layer1 : layer0, window = m->layers[layer].window;
        ak_attn_stats *st = ak_attn_stats_new(m, &layer, 1, &err);
        REQUIRE(st, "stats: %s", err.msg);
        ak_attn_stats_set_seq(st, kv);
        ref_stats ref;
        ref_init(&ref, H, N);
        ak_kv_truncate(kv, 0);
        ak_kv_truncate(other, 0);
        /* batches: [0, 20), [20, 37) with the other sequence's tokens
         * interleaved, then single tokens */
        static const int runs[][2] = {{0, 20}, {20, 17}, {37, 1}, {38, 1}, {39, 21}};
        for (size_t ri = 0; ri < sizeof runs / sizeof runs[0]; ri++) {
            int p0 = runs[ri][0], nt = runs[ri][1], mixed = ri == 1;
            int32_t pos[64], tk[64];
            ak_kv *seqs[64];
            float *qb = malloc(sizeof(float) * qs * 64), *outs[64];
            int n = 0;
            for (int j = 0; j < nt; j++) {
                if (mixed) {   /* the other sequence at the same slots */
                    pos[n] = p0 + j; seqs[n] = other; tk[n] = 0; outs[n] = NULL;
                    for (size_t i = 0; i < qs; i++) qb[n * qs + i] = 1.0f;
                    n++;
                }
                pos[n] = p0 + j; seqs[n] = kv; tk[n] = 0; outs[n] = NULL;
                memcpy(qb + n * qs, Q + (size_t)(p0 + j) * qs, sizeof(float) * qs);
                n++;
            }
            REQUIRE(ak_kv_prepare(kv, p0, p0 + nt, &err) == 0, "prepare: %s", err.msg);
            REQUIRE(!mixed || ak_kv_prepare(other, 0, p0 + nt, &err) == 0, "prepare: %s", err.msg);
            for (int j = 0; j < nt; j++)
                REQUIRE(ak_kv_write(kv, layer, p0 + j, K + (size_t)(p0 + j) * ks, V, &err) == 0, "write: %s", err.msg);
            for (int j = 0; mixed && j < p0 + nt; j++)   /* the other sequence: every key it would see */
                REQUIRE(ak_kv_write(other, layer, j, K, V, &err) == 0, "write: %s", err.msg);
            ak_batch b = {.n = n, .token = tk, .pos = pos, .seq = seqs, .logits_out = outs};
            REQUIRE(ak_attn_stats_observe(st, threads, &b, layer, qb, qs, &err) == 0, "observe: %s", err.msg);
            /* a layer not chosen adds nothing */
            REQUIRE(ak_attn_stats_observe(st, threads, &b, (layer + 1) % m->cfg.n_layer, qb, qs, &err) == 0, "observe: %s", err.msg);
            free(qb);
            for (int j = 0; j < nt; j++) {
            const ref_keys keys = {.K = K, .kstride = ks, .d = dk, .group = H / Hkv, .scale = m->cfg.attn_scale};
                int p = p0 + j, lo = window && p - window + 1 > 0 ? p - window + 1 : 0;
                for (int h = 0; h < H; h++) {
                    double qd[512];
                    for (int i = 0; i < dk; i++) qd[i] = Q[(size_t)p * qs + (size_t)h * dk + i];
                    ref_add(&ref, &keys, h, p, lo, qd);
                }
                ref.nq[p]++;
            }
        }
        /* the hook's exponentials are float (vmath.h), 3e-7: the variance,
         * a difference of masses, shows it most (6e-7 measured) */
        char what[160];
        snprintf(what, sizeof what, "%s layer %d (window %d, %d query heads per KV head)", rel, layer, window,
                 H / Hkv);
        compare(t, what, st, &ref, 1e-5);
        /* reset forgets everything; the next pass starts from zero */
        ak_attn_stats_reset(st);
        CHECK(ak_attn_stats_length(st) == 0, "length %d after reset", ak_attn_stats_length(st));
        ref_free(&ref);
        ak_attn_stats_free(st);
    }
    free(K); free(V); free(Q);
    ak_threads_free(threads);
    ak_kv_free(kv); ak_kv_free(other);
    ak_block_pool_free(pool);
    m->cfg.n_head = file_heads;
    ak_model_free(m);
}

/* observe_case on gemma3-tiny's layer 0 (sliding window 16) and layer 5
 * (global), and on deepseek2-tiny's MLA cache (one KV head) with groups of
 * 4 and of 3 query heads: every way the hook groups heads. */
TEST(attnstats_window_and_tracked_sequence) {
    char path[512];
    ak_error err = {{0}};
    ak_model *m = ak_model_load(test_path(path, sizeof path, "models/gemma3-tiny.gguf"), NULL, NULL, &err);
    REQUIRE(m, "gemma3: %s", err.msg);
    CHECK(m->layers[0].window == 16 && m->layers[5].window == 0, "gemma3-tiny: windows %d / %d", m->layers[0].window,
          m->layers[5].window);
    ak_model_free(m);
    observe_case(t, "models/gemma3-tiny.gguf", 0, 5, 0);      /* window 16 and global, groups of 2 */
    observe_case(t, "models/deepseek2-tiny.gguf", 0, 2, 0);   /* MLA: one KV head of 40 dims, a group of 4 */
    observe_case(t, "models/deepseek2-tiny.gguf", 0, 1, 3);   /* a group of 3: scored 2 + 1 */
}

/* Attached or not, the logits are the same bits (prefill and decode, every
 * family's forward path: llama, gemma3 windows, deepseek2's MLA). With the
 * default layers (first, middle, last): one decoded query adds exactly
 * n_layers * n_heads of mass in all; a prefill of n tokens adds n times
 * that; the variance equals the definition computed from the per-head
 * masses; entropies lie in [0, ln(slot + 1)]; the length follows the
 * sequence; bad layer choices are refused by code. */
TEST(attnstats_off_is_bit_identical_and_sums_hold) {
    static const char *const models[] = {"models/stories260K.gguf", "models/gemma3-tiny.gguf",
                                         "models/deepseek2-tiny.gguf"};
    enum { N = 40 };
    for (size_t mi = 0; mi < 3; mi++) {
        char path[512];
        ak_error err = {{0}};
        ak_model *m = ak_model_load(test_path(path, sizeof path, models[mi]), NULL, NULL, &err);
        REQUIRE(m, "%s: %s", models[mi], err.msg);
        int V = m->cfg.vocab, L = m->cfg.n_layer, H = m->cfg.n_head;
        ak_block_pool *pool = ak_block_pool_new(&m->spec, 16, 0, &err);
        ak_ctx *c = ak_ctx_new(m, 16, 2, &err);
        ak_kv *a = ak_kv_new(pool, AK_KV_F32, AK_KV_F32, 256, &err), *b = ak_kv_new(pool, AK_KV_F32, AK_KV_F32, 256, &err);
        ak_attn_stats *st = ak_attn_stats_new(m, NULL, 0, &err);
        REQUIRE(pool && c && a && b && st, "setup: %s", err.msg);
        int nl = ak_attn_stats_n_layers(st);
        CHECK(nl == (L > 2 ? 3 : L) && ak_attn_stats_layer(st, 0) == 0 && ak_attn_stats_layer(st, nl - 1) == L - 1,
              "%s: default layers: %d chosen", models[mi], nl);
        int32_t tok[N + 1];
        for (int i = 0; i <= N; i++) tok[i] = 3 + (i * 37) % (V - 3);
        float *la = malloc(sizeof(float) * V * (N + 1)), *lb = malloc(sizeof(float) * V * (N + 1));
        REQUIRE(ak_eval(c, a, &(ak_eval_args){.tokens = tok, .n = N, .all_logits = la}, &err) == 0,
                "prefill: %s", err.msg);
        REQUIRE(ak_eval(c, a, &(ak_eval_args){.tokens = tok + N, .n = 1, .pos0 = N, .logits = la + (size_t)N * V},
                        &err) == 0, "decode: %s", err.msg);
        ak_ctx_set_attn_stats(c, st);
        REQUIRE(ak_eval(c, b, &(ak_eval_args){.tokens = tok, .n = N, .all_logits = lb}, &err) == 0,
                "prefill: %s", err.msg);
        double *mass = malloc(sizeof(double) * (N + 1)), *var = malloc(sizeof(double) * (N + 1));
        double *ent = malloc(sizeof(double) * (N + 1));
        CHECK(ak_attn_stats_length(st) == N, "%s: length %d after %d tokens", models[mi], ak_attn_stats_length(st), N);
        ak_attn_stats_mass(st, mass);
        double total = 0;
        for (int i = 0; i < N; i++) total += mass[i];
        CHECK(fabs(total - (double)N * nl * H) < 1e-9 * N * nl * H, "%s: prefill mass %.12g, expected %d", models[mi],
              total, N * nl * H);
        /* one decoded query: exactly n_layers * n_heads more */
        REQUIRE(ak_eval(c, b, &(ak_eval_args){.tokens = tok + N, .n = 1, .pos0 = N, .logits = lb + (size_t)N * V},
                        &err) == 0, "decode: %s", err.msg);
        CHECK(ak_attn_stats_length(st) == N + 1, "%s: length %d after decode", models[mi], ak_attn_stats_length(st));
        /* per chosen layer: the heads' masses summed over every key are the
         * (N + 1) queries so far times n_heads */
        int badl = 0;
        for (int i = 0; i < nl; i++) {
            double sum = 0;
            for (int h = 0; h < H; h++)
                for (int tt = 0; tt <= N; tt++) sum += ak_attn_stats_head_mass(st, i, h)[tt];
            badl += fabs(sum - (double)(N + 1) * H) > 1e-9 * (N + 1) * H;
        }
        CHECK(badl == 0, "%s: %d layers' masses do not sum to queries x heads", models[mi], badl);
        if (!m->layers[0].window) {   /* causal, no window: slot t was seen by the queries at t..N */
            double *ex = malloc(sizeof(double) * (N + 1));
            ak_attn_stats_exposure(st, ex);
            int bade = 0;
            for (int tt = 0; tt <= N; tt++) bade += ex[tt] != N + 1 - tt;
            CHECK(bade == 0, "%s: %d exposures differ from N + 1 - t", models[mi], bade);
            free(ex);
        }
        double *m2 = malloc(sizeof(double) * (N + 1)), added = 0;
        ak_attn_stats_mass(st, m2);
        for (int i = 0; i <= N; i++) added += m2[i] - (i < N ? mass[i] : 0);
        CHECK(fabs(added - nl * H) < 1e-9 * nl * H, "%s: one query added %.12g, expected %d", models[mi], added, nl * H);
        ak_attn_stats_mass_var(st, var);
        ak_attn_stats_entropy(st, ent);
        int badv = 0, bade = 0;
        for (int tt = 0; tt <= N; tt++) {
            double want = 0;
            for (int i = 0; i < nl; i++) {
                double mean = 0, v = 0;
                for (int h = 0; h < H; h++) mean += ak_attn_stats_head_mass(st, i, h)[tt] / H;
                for (int h = 0; h < H; h++) v += pow(ak_attn_stats_head_mass(st, i, h)[tt] - mean, 2) / H;
                want += v / nl;
            }
            badv += fabs(var[tt] - want) > 1e-12 + 1e-9 * want;
            bade += !(ent[tt] >= -1e-12 && ent[tt] <= log(tt + 1.0) + 1e-9);
        }
        CHECK(badv == 0, "%s: %d variances differ from the definition", models[mi], badv);
        CHECK(bade == 0, "%s: %d entropies outside [0, ln(slot + 1)]", models[mi], bade);
        CHECK(ent[0] == 0, "%s: the first token attends to itself only, entropy %g", models[mi], ent[0]);
        CHECK(!memcmp(la, lb, sizeof(float) * V * (N + 1)), "%s: logits differ with statistics attached", models[mi]);
        /* detached: nothing more is added */
        ak_ctx_set_attn_stats(c, NULL);
        ak_kv_truncate(b, N);
        REQUIRE(ak_eval(c, b, &(ak_eval_args){.tokens = tok + N, .n = 1, .pos0 = N, .logits = lb}, &err) == 0,
                "decode: %s", err.msg);
        double *m3 = malloc(sizeof(double) * (N + 1));
        ak_attn_stats_mass(st, m3);
        CHECK(!memcmp(m2, m3, sizeof(double) * (N + 1)), "%s: a detached pass changed the statistics", models[mi]);
        CHECK(!memcmp(lb, la + (size_t)N * V, sizeof(float) * V), "%s: detached decode differs", models[mi]);
        free(m2); free(m3); free(mass); free(var); free(ent); free(la); free(lb);
        ak_attn_stats_free(st);
        ak_kv_free(a); ak_kv_free(b);
        ak_ctx_free(c);
        ak_block_pool_free(pool);
        if (mi == 0) {   /* refusals */
            int bad[2] = {0, L};
            err.code = 0;
            CHECK(!ak_attn_stats_new(m, bad, 2, &err) && err.code == AK_ERR_INVALID, "layer %d accepted", L);
            int many[AK_ATTN_STATS_MAX_LAYERS + 1] = {0};
            err.code = 0;
            CHECK(!ak_attn_stats_new(m, many, AK_ATTN_STATS_MAX_LAYERS + 1, &err) && err.code == AK_ERR_INVALID,
                  "too many layers accepted");
            int dup[3] = {2, 0, 2};
            ak_attn_stats *d = ak_attn_stats_new(m, dup, 3, &err);
            CHECK(d && ak_attn_stats_n_layers(d) == 2 && ak_attn_stats_layer(d, 0) == 0 && ak_attn_stats_layer(d, 1) == 2,
                  "duplicates not merged in order");
            ak_attn_stats_free(d);
        }
        ak_model_free(m);
    }
}
