/* test_synth.c - synthetic models: shapes, metadata, determinism, and the
 * promise that every weight type holds the same underlying f32 weights. */
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/gguf.h"
#include "kernels/kernels.h"
#include "engine/synth.h"
#include "test.h"

static const uint32_t all_types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
#define N_TYPES 5

/* The tiny llama of the tests: dim 64, 2 layers, 4 heads (head dim 16), 2 KV
 * heads, ffn 128, vocab 300. */
static void tiny_opts(ak_synth_opts *o, const char *path, uint32_t type, uint64_t seed) {
    ak_synth_defaults(o);
    o->path = path;
    o->arch = "llama";
    o->dim = 64;
    o->n_layers = 2;
    o->n_heads = 4;
    o->n_kv_heads = 2;
    o->ffn = 128;
    o->vocab = 300;
    o->ctx = 512;
    o->tied = 0;
    o->wtype = type;
    o->seed = seed;
    o->n_threads = 2;
}

static const char *tmp_path(char *buf, size_t n, const char *fmt, const char *a) {
    char name[128];
    snprintf(name, sizeof name, fmt, a);
    snprintf(buf, n, "%s/%s", test_tmp_dir(), name);
    return buf;
}

static const char *type_lower(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: return "f32";
    case GGML_TYPE_F16: return "f16";
    case GGML_TYPE_BF16: return "bf16";
    case GGML_TYPE_Q8_0: return "q8_0";
    default: return "q4_0";
    }
}

static int same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *pa = ak_read_file(a, &na, NULL), *pb = ak_read_file(b, &nb, NULL);
    int same = pa && pb && na == nb && memcmp(pa, pb, na) == 0;
    free(pa);
    free(pb);
    return same;
}

static uint64_t meta_u64(const gguf_file *f, const char *key) {
    uint64_t v = 0;
    if (gguf_get_u64(f, key, &v, NULL) < 0) return UINT64_MAX;
    return v;
}

/* Checks one tensor's presence, shape and type. */
static void check_tensor(ak_test_ctx *t, const gguf_file *f, const char *name, uint32_t type, uint32_t n_dims,
                         uint64_t ne0, uint64_t ne1) {
    const gguf_tensor *g = gguf_find_tensor(f, name);
    CHECK(g != NULL, "%s: tensor %s missing", f->path, name);
    if (!g) return;
    CHECK(g->type == type, "%s: %s has type %s, want %s", f->path, name, gguf_tensor_type_name(g->type),
          gguf_tensor_type_name(type));
    CHECK(g->n_dims == n_dims && g->ne[0] == ne0 && g->ne[1] == ne1, "%s: %s has %u dims [%llu, %llu]", f->path,
          name, g->n_dims, (unsigned long long)g->ne[0], (unsigned long long)g->ne[1]);
}

TEST(synth_tiny_every_type) {
    for (int ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = all_types[ti];
        char path[512];
        tmp_path(path, sizeof path, "tiny-%s.gguf", type_lower(type));
        ak_synth_opts o;
        tiny_opts(&o, path, type, 42);
        ak_error err = {{0}};
        REQUIRE(ak_synth_write(&o, &err) == 0, "%s: %s", type_lower(type), err.msg);
        gguf_file f;
        REQUIRE(gguf_open(&f, path, &err) == 0, "%s", err.msg);

        CHECK(f.n_tensors == 1 + 2 * 9 + 2, "%s: %llu tensors", path, (unsigned long long)f.n_tensors);
        check_tensor(t, &f, "token_embd.weight", type, 2, 64, 300);
        check_tensor(t, &f, "output_norm.weight", GGML_TYPE_F32, 1, 64, 1);
        check_tensor(t, &f, "output.weight", type, 2, 64, 300);
        for (int l = 0; l < 2; l++) {
            char n[64];
#define TN(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
            check_tensor(t, &f, TN("attn_norm.weight"), GGML_TYPE_F32, 1, 64, 1);
            check_tensor(t, &f, TN("attn_q.weight"), type, 2, 64, 64);
            check_tensor(t, &f, TN("attn_k.weight"), type, 2, 64, 32);
            check_tensor(t, &f, TN("attn_v.weight"), type, 2, 64, 32);
            check_tensor(t, &f, TN("attn_output.weight"), type, 2, 64, 64);
            check_tensor(t, &f, TN("ffn_norm.weight"), GGML_TYPE_F32, 1, 64, 1);
            check_tensor(t, &f, TN("ffn_gate.weight"), type, 2, 64, 128);
            check_tensor(t, &f, TN("ffn_up.weight"), type, 2, 64, 128);
            check_tensor(t, &f, TN("ffn_down.weight"), type, 2, 128, 64);
            CHECK(!gguf_find_tensor(&f, TN("attn_q.bias")), "llama has no q bias");
#undef TN
        }

        gguf_str s;
        CHECK(gguf_get_str(&f, "general.architecture", &s, NULL) == 0 && gguf_str_eq(s, "llama"), "architecture");
        CHECK(gguf_get_str(&f, "general.name", &s, NULL) == 0 && s.len > 0, "general.name");
        CHECK(meta_u64(&f, "general.alignment") == 32, "alignment");
        uint64_t want_ft = type == GGML_TYPE_F32 ? 0 : type == GGML_TYPE_F16 ? 1 : type == GGML_TYPE_Q4_0 ? 2
                         : type == GGML_TYPE_Q8_0 ? 7 : 32;
        CHECK(meta_u64(&f, "general.file_type") == want_ft, "file_type %llu",
              (unsigned long long)meta_u64(&f, "general.file_type"));
        CHECK(meta_u64(&f, "llama.context_length") == 512, "context_length");
        CHECK(meta_u64(&f, "llama.embedding_length") == 64, "embedding_length");
        CHECK(meta_u64(&f, "llama.block_count") == 2, "block_count");
        CHECK(meta_u64(&f, "llama.feed_forward_length") == 128, "feed_forward_length");
        CHECK(meta_u64(&f, "llama.attention.head_count") == 4, "head_count");
        CHECK(meta_u64(&f, "llama.attention.head_count_kv") == 2, "head_count_kv");
        CHECK(meta_u64(&f, "llama.rope.dimension_count") == 16, "rope.dimension_count");
        float x = 0;
        CHECK(gguf_get_f32(&f, "llama.rope.freq_base", &x, NULL) == 0 && x == 10000.0f, "rope base %g", x);
        CHECK(gguf_get_f32(&f, "llama.attention.layer_norm_rms_epsilon", &x, NULL) == 0 && x == 1e-5f, "eps %g", x);

        const gguf_kv *tok = gguf_get_arr(&f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, NULL);
        const gguf_kv *sc = gguf_get_arr(&f, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, NULL);
        const gguf_kv *tt = gguf_get_arr(&f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, NULL);
        CHECK(gguf_get_str(&f, "tokenizer.ggml.model", &s, NULL) == 0 && gguf_str_eq(s, "llama"), "tokenizer model");
        CHECK(meta_u64(&f, "tokenizer.ggml.bos_token_id") == 1 && meta_u64(&f, "tokenizer.ggml.eos_token_id") == 2
                  && meta_u64(&f, "tokenizer.ggml.unknown_token_id") == 0, "special ids");
        REQUIRE(tok && sc && tt && tok->v.arr.count == 300 && sc->v.arr.count == 300 && tt->v.arr.count == 300,
                "tokenizer arrays");
        if (ti == 0) {
            const gguf_str *v = tok->v.arr.strs;
            int32_t types[300];
            float scores[300];
            memcpy(types, tt->v.arr.data, sizeof types);
            memcpy(scores, sc->v.arr.data, sizeof scores);
            CHECK(gguf_str_eq(v[0], "<unk>") && types[0] == 2, "<unk>");
            CHECK(gguf_str_eq(v[1], "<s>") && types[1] == 3, "<s>");
            CHECK(gguf_str_eq(v[2], "</s>") && types[2] == 3, "</s>");
            CHECK(gguf_str_eq(v[3], "<0x00>") && types[3] == 6, "<0x00>");
            CHECK(gguf_str_eq(v[258], "<0xFF>") && types[258] == 6, "<0xFF>");
            CHECK(gguf_str_eq(v[259], "\xe2\x96\x81") && types[259] == 1, "first piece is U+2581");
            for (int i = 260; i < 300; i++) {
                CHECK(types[i] == 1, "token %d type %d", i, types[i]);
                CHECK(scores[i] < scores[i - 1], "scores not descending at %d", i);
            }
            int dups = 0;
            for (int i = 0; i < 300; i++)
                for (int j = 0; j < i; j++)
                    if (v[i].len == v[j].len && !memcmp(v[i].data, v[j].data, v[i].len)) dups++;
            CHECK(dups == 0, "%d duplicate tokens", dups);
        }
        gguf_close(&f);
    }
}

/* Same seed => same bytes (whatever the thread count); other seed => other. */
TEST(synth_deterministic) {
    const uint32_t types[] = {GGML_TYPE_F16, GGML_TYPE_Q4_0};
    for (int i = 0; i < 2; i++) {
        char a[512], b[512], c[512];
        tmp_path(a, sizeof a, "det-a-%s.gguf", type_lower(types[i]));
        tmp_path(b, sizeof b, "det-b-%s.gguf", type_lower(types[i]));
        tmp_path(c, sizeof c, "det-c-%s.gguf", type_lower(types[i]));
        ak_synth_opts o;
        ak_error err = {{0}};
        tiny_opts(&o, a, types[i], 7);
        o.n_threads = 1;
        REQUIRE(ak_synth_write(&o, &err) == 0, "%s", err.msg);
        tiny_opts(&o, b, types[i], 7);
        o.n_threads = 2;
        REQUIRE(ak_synth_write(&o, &err) == 0, "%s", err.msg);
        tiny_opts(&o, c, types[i], 8);
        REQUIRE(ak_synth_write(&o, &err) == 0, "%s", err.msg);
        CHECK(same_file(a, b), "%s: same seed, different bytes", type_lower(types[i]));
        CHECK(!same_file(a, c), "%s: different seed, same bytes", type_lower(types[i]));
        unlink(a);
        unlink(b);
        unlink(c);
    }
}

/* Every type is the F32 model of the same seed, converted: dequantized rows
 * match within the type's precision. Also sanity of the F32 statistics. */
TEST(synth_types_share_f32_weights) {
    char p32[512];
    tmp_path(p32, sizeof p32, "share-%s.gguf", "f32");
    ak_synth_opts o;
    ak_error err = {{0}};
    tiny_opts(&o, p32, GGML_TYPE_F32, 123);
    REQUIRE(ak_synth_write(&o, &err) == 0, "%s", err.msg);
    gguf_file f32;
    REQUIRE(gguf_open(&f32, p32, &err) == 0, "%s", err.msg);

    /* statistics of the f32 weights */
    struct { const char *name; float mean, sd; } stats[] = {
        {.name = "token_embd.weight", .mean = 0.0f, .sd = 1.0f},
        {.name = "blk.0.attn_q.weight", .mean = 0.0f, .sd = 0.125f},          /* 1/sqrt(64) */
        {.name = "blk.1.ffn_down.weight", .mean = 0.0f, .sd = 0.0884f},       /* 1/sqrt(128) */
        {.name = "blk.0.attn_norm.weight", .mean = 1.0f, .sd = 0.02f},
    };
    for (int i = 0; i < 4; i++) {
        const gguf_tensor *g = gguf_find_tensor(&f32, stats[i].name);
        REQUIRE(g, "%s missing", stats[i].name);
        const float *x = g->data;
        uint64_t n = g->nbytes / 4;
        double s = 0, s2 = 0;
        for (uint64_t k = 0; k < n; k++) { s += x[k]; s2 += (double)x[k] * x[k]; }
        double mean = s / n, sd = sqrt(s2 / n - mean * mean);
        CHECK(fabs(mean - stats[i].mean) < 0.2 * stats[i].sd + 4 * stats[i].sd / sqrt((double)n),
              "%s mean %g", stats[i].name, mean);
        /* the sample sd of n normals is off by ~1/sqrt(2n) relative */
        CHECK(fabs(sd - stats[i].sd) < (0.05 + 3 / sqrt(2.0 * n)) * stats[i].sd, "%s sd %g, want %g", stats[i].name,
              sd, stats[i].sd);
    }

    for (int ti = 1; ti < N_TYPES; ti++) {
        uint32_t type = all_types[ti];
        char path[512];
        tmp_path(path, sizeof path, "share-%s.gguf", type_lower(type));
        tiny_opts(&o, path, type, 123);
        REQUIRE(ak_synth_write(&o, &err) == 0, "%s", err.msg);
        gguf_file fq;
        REQUIRE(gguf_open(&fq, path, &err) == 0, "%s", err.msg);
        REQUIRE(fq.n_tensors == f32.n_tensors, "tensor counts differ");
        int bad = 0;
        for (uint64_t i = 0; i < f32.n_tensors && bad < 5; i++) {
            const gguf_tensor *a = &f32.tensors[i], *q = &fq.tensors[i];
            REQUIRE(gguf_str_eq(q->name, "") == gguf_str_eq(a->name, "") && q->name.len == a->name.len &&
                        !memcmp(q->name.data, a->name.data, a->name.len), "tensor order differs at %llu",
                    (unsigned long long)i);
            int64_t n0 = (int64_t)a->ne[0], rows = (int64_t)a->ne[1];
            if (a->n_dims == 1) {   /* norms stay f32: identical */
                CHECK(q->type == GGML_TYPE_F32 && !memcmp(q->data, a->data, a->nbytes), "%.*s differs",
                      (int)a->name.len, a->name.data);
                continue;
            }
            float *y = malloc((size_t)n0 * sizeof *y);
            size_t rb = ak_row_bytes(type, n0);
            for (int64_t r = 0; r < rows && bad < 5; r++) {
                const float *x = (const float *)a->data + r * n0;
                ak_dequantize_row(type, (const uint8_t *)q->data + (size_t)r * rb, y, n0);
                for (int64_t k0 = 0; k0 < n0; k0 += 32) {
                    float amax = 0;
                    for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(x[k0 + k]));
                    for (int k = 0; k < 32; k++) {
                        float want = x[k0 + k], got = y[k0 + k], tol;
                        switch (type) {
                        case GGML_TYPE_F16: tol = fabsf(want) * (1.0f / 2048) + 6e-8f; break;
                        case GGML_TYPE_BF16: tol = fabsf(want) * (1.0f / 256); break;
                        case GGML_TYPE_Q8_0: tol = amax / 127 * 0.6f + 1e-6f; break;
                        default: tol = amax / 8 * 1.05f + 1e-6f; break;
                        }
                        if (!(fabsf(got - want) <= tol)) {
                            bad++;
                            CHECK(0, "%s %.*s row %lld [%lld]: %g vs f32 %g", type_lower(type), (int)a->name.len,
                                  a->name.data, (long long)r, (long long)(k0 + k), got, want);
                            break;
                        }
                    }
                }
            }
            free(y);
        }
        gguf_close(&fq);
        unlink(path);
    }
    gguf_close(&f32);
    unlink(p32);
}

TEST(synth_qwen2_tied) {
    char path[512];
    tmp_path(path, sizeof path, "qwen2-%s.gguf", "tied");
    ak_synth_opts o;
    tiny_opts(&o, path, GGML_TYPE_Q8_0, 3);
    o.arch = "qwen2";
    o.tied = 1;
    o.rope_base = 1e6f;
    ak_error err = {{0}};
    REQUIRE(ak_synth_write(&o, &err) == 0, "%s", err.msg);
    gguf_file f;
    REQUIRE(gguf_open(&f, path, &err) == 0, "%s", err.msg);
    CHECK(!gguf_find_tensor(&f, "output.weight"), "tied model has output.weight");
    CHECK(f.n_tensors == 1 + 2 * 12 + 1, "%llu tensors", (unsigned long long)f.n_tensors);
    check_tensor(t, &f, "blk.1.attn_q.bias", GGML_TYPE_F32, 1, 64, 1);
    check_tensor(t, &f, "blk.1.attn_k.bias", GGML_TYPE_F32, 1, 32, 1);
    check_tensor(t, &f, "blk.1.attn_v.bias", GGML_TYPE_F32, 1, 32, 1);
    gguf_str s;
    CHECK(gguf_get_str(&f, "general.architecture", &s, NULL) == 0 && gguf_str_eq(s, "qwen2"), "architecture");
    CHECK(meta_u64(&f, "qwen2.block_count") == 2, "qwen2.block_count");
    float x = 0;
    CHECK(gguf_get_f32(&f, "qwen2.rope.freq_base", &x, NULL) == 0 && x == 1e6f, "rope base %g", x);
    gguf_close(&f);
    unlink(path);
}

/* --vocab-from: every tokenizer.* key copied, vocab size taken from it. */
TEST(synth_vocab_from) {
    char src[512], dst[512];
    tmp_path(src, sizeof src, "vocab-%s.gguf", "src");
    tmp_path(dst, sizeof dst, "vocab-%s.gguf", "dst");
    ak_synth_opts o;
    ak_error err = {{0}};
    tiny_opts(&o, src, GGML_TYPE_Q4_0, 1);
    o.vocab = 333;
    REQUIRE(ak_synth_write(&o, &err) == 0, "%s", err.msg);
    tiny_opts(&o, dst, GGML_TYPE_Q4_0, 1);
    o.vocab = 999;   /* ignored */
    o.vocab_from = src;
    REQUIRE(ak_synth_write(&o, &err) == 0, "%s", err.msg);
    gguf_file a, b;
    REQUIRE(gguf_open(&a, src, &err) == 0, "%s", err.msg);
    REQUIRE(gguf_open(&b, dst, &err) == 0, "%s", err.msg);
    check_tensor(t, &b, "token_embd.weight", GGML_TYPE_Q4_0, 2, 64, 333);
    int n_tok_keys = 0;
    for (uint64_t i = 0; i < a.n_kv; i++) {
        const gguf_kv *ka = &a.kv[i];
        if (ka->key.len < 10 || memcmp(ka->key.data, "tokenizer.", 10)) continue;
        n_tok_keys++;
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)ka->key.len, ka->key.data);
        const gguf_kv *kb = gguf_find(&b, key);
        CHECK(kb && kb->type == ka->type, "%s missing or retyped", key);
        if (!kb || kb->type != ka->type) continue;
        if (ka->type == GGUF_TYPE_ARRAY) {
            CHECK(kb->v.arr.type == ka->v.arr.type && kb->v.arr.count == ka->v.arr.count, "%s array", key);
            if (ka->v.arr.type == GGUF_TYPE_STRING) {
                for (uint64_t k = 0; k < ka->v.arr.count && kb->v.arr.count == ka->v.arr.count; k++)
                    CHECK(ka->v.arr.strs[k].len == kb->v.arr.strs[k].len &&
                              !memcmp(ka->v.arr.strs[k].data, kb->v.arr.strs[k].data, ka->v.arr.strs[k].len),
                          "%s[%llu] differs", key, (unsigned long long)k);
            }
        } else if (ka->type == GGUF_TYPE_STRING) {
            CHECK(ka->v.str.len == kb->v.str.len && !memcmp(ka->v.str.data, kb->v.str.data, ka->v.str.len), "%s", key);
        } else {
            CHECK(ka->v.u64 == kb->v.u64, "%s value", key);
        }
    }
    CHECK(n_tok_keys >= 8, "only %d tokenizer keys", n_tok_keys);
    gguf_close(&a);
    gguf_close(&b);

    /* a vocab_from that is not a GGUF: error names it, no output */
    char junk[512];
    tmp_path(junk, sizeof junk, "vocab-%s.txt", "junk");
    FILE *fp = fopen(junk, "w");
    REQUIRE(fp, "cannot write %s", junk);
    fputs("this is not a gguf file at all", fp);
    fclose(fp);
    unlink(dst);
    o.vocab_from = junk;
    CHECK(ak_synth_write(&o, &err) < 0, "junk vocab_from accepted");
    CHECK(strstr(err.msg, junk) != NULL, "error '%s'", err.msg);
    struct stat st;
    CHECK(stat(dst, &st) < 0, "%s written despite the error", dst);
    unlink(junk);
    unlink(src);
}

static void count_progress(void *ctx, double frac) {
    double *last = ctx;
    if (frac < last[0]) last[1] = 1;   /* went backwards */
    last[0] = frac;
    last[2]++;
}

TEST(synth_bad_shapes_and_progress) {
    char path[512], tmp[600];
    tmp_path(path, sizeof path, "bad-%s.gguf", "shape");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    ak_synth_opts o;
    ak_error err = {{0}};
    struct stat st;

    tiny_opts(&o, path, GGML_TYPE_Q4_0, 1);
    o.dim = 80;   /* 80 / 4 heads = 20, but 80 % 32 != 0 */
    CHECK(ak_synth_write(&o, &err) < 0 && strstr(err.msg, path) && strstr(err.msg, "multiples of 32"), "'%s'", err.msg);
    tiny_opts(&o, path, GGML_TYPE_F16, 1);
    o.n_kv_heads = 3;
    CHECK(ak_synth_write(&o, &err) < 0 && strstr(err.msg, "KV heads"), "'%s'", err.msg);
    tiny_opts(&o, path, GGML_TYPE_F16, 1);
    o.arch = "gpt2";
    CHECK(ak_synth_write(&o, &err) < 0 && strstr(err.msg, "gpt2"), "'%s'", err.msg);
    tiny_opts(&o, path, GGML_TYPE_Q2_K, 1);   /* a type the engine does not compute with */
    CHECK(ak_synth_write(&o, &err) < 0 && strstr(err.msg, "Q2_K"), "'%s'", err.msg);
    tiny_opts(&o, path, GGML_TYPE_Q4_K, 1);   /* dim 64: not a whole super-block */
    CHECK(ak_synth_write(&o, &err) < 0 && strstr(err.msg, "multiples of 256"), "'%s'", err.msg);
    tiny_opts(&o, path, GGML_TYPE_F16, 1);
    o.vocab = 100;
    CHECK(ak_synth_write(&o, &err) < 0 && strstr(err.msg, "vocab 100"), "'%s'", err.msg);
    CHECK(stat(path, &st) < 0 && stat(tmp, &st) < 0, "files left after errors");

    double prog[3] = {0, 0, 0};
    tiny_opts(&o, path, GGML_TYPE_F16, 1);
    o.progress = count_progress;
    o.progress_ctx = prog;
    REQUIRE(ak_synth_write(&o, &err) == 0, "%s", err.msg);
    CHECK(prog[2] >= 1 && prog[1] == 0 && prog[0] == 1.0, "progress: %g calls, last %g, backwards %g", prog[2],
          prog[0], prog[1]);
    unlink(path);
}

TEST(synth_presets) {
    const char *names[] = {"llama-1b", "llama-3b", "llama-8b", "qwen2-0.5b", "tinyllama-1.1b", "stories15m",
                           "qwen3-0.6b", "qwen3-1.7b", "gemma3-1b", "deepseek2-lite", "deepseek2-lite-8l"};
    for (int i = 0; i < 11; i++) {
        ak_synth_opts o;
        ak_synth_defaults(&o);
        CHECK(ak_synth_preset(&o, names[i]) == 0, "preset %s", names[i]);
        CHECK(ak_synth_preset_name(i) && !strcmp(ak_synth_preset_name(i), names[i]), "preset %d name", i);
        CHECK(o.dim % o.n_heads == 0 && o.n_heads % o.n_kv_heads == 0 && o.dim % 32 == 0 && o.ffn % 32 == 0,
              "%s shape", names[i]);
    }
    CHECK(ak_synth_preset_name(11) == NULL, "preset list end");
    {   /* the families' own shapes: heads wider than dim / n_head, gemma3's window */
        ak_synth_opts q, g;
        ak_synth_defaults(&q);
        ak_synth_defaults(&g);
        CHECK(ak_synth_preset(&q, "qwen3-0.6b") == 0 && !strcmp(q.arch, "qwen3") && q.head_dim == 128 &&
              q.dim == 1024 && q.n_heads == 16 && q.n_kv_heads == 8 && q.window == 0, "qwen3-0.6b shape");
        CHECK(ak_synth_preset(&g, "gemma3-1b") == 0 && !strcmp(g.arch, "gemma3") && g.head_dim == 256 &&
              g.dim == 1152 && g.n_heads == 4 && g.n_kv_heads == 1 && g.window == 512 && g.n_layers == 26,
              "gemma3-1b shape");
    }
    ak_synth_opts o;
    ak_synth_defaults(&o);
    CHECK(ak_synth_preset(&o, "gpt-5") < 0, "unknown preset accepted");
    ak_synth_preset(&o, "llama-1b");
    CHECK(o.dim == 2048 && o.n_layers == 16 && o.n_heads == 32 && o.n_kv_heads == 8 && o.ffn == 8192 && o.tied &&
              o.vocab == 32000 && o.rope_base == 500000.0f && o.ctx == 8192, "llama-1b");
    ak_synth_preset(&o, "qwen2-0.5b");
    CHECK(!strcmp(o.arch, "qwen2") && o.dim == 896 && o.n_kv_heads == 2 && o.tied, "qwen2-0.5b");
}
