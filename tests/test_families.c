/* test_families.c - what the model families beyond llama/qwen2 add to the
 * engine: sliding-window attention (gemma3's local layers) against a direct
 * computation, and the one-line error for an architecture the engine does
 * not run. The families' arithmetic as a whole is checked against llama.cpp
 * in test_golden.c. */
#include <cjson/cJSON.h>
#include <string.h>
#include <unistd.h>

#include "kv/blockpool.h"
#include "text/chat.h"
#include "base/gguf.h"
#include "kv/kvcache.h"
#include "engine/model.h"
#include "engine/perplexity.h"
#include "text/sampler.h"
#include "store/store.h"
#include "engine/synth.h"
#include "text/tokenizer.h"
#include "test.h"

/* Attention of query q over keys/values [lo, p] in double: the reference. */
static void naive_attend(const float *K, const float *V, int d, int lo, int p, const float *q, float scale,
                         double *out) {
    double mx = -1e300, l = 0;
    for (int j = lo; j <= p; j++) {
        double s = 0;
        for (int i = 0; i < d; i++) s += (double)q[i] * K[(size_t)j * d + i];
        if (s * scale > mx) mx = s * scale;
    }
    for (int i = 0; i < d; i++) out[i] = 0;
    for (int j = lo; j <= p; j++) {
        double s = 0;
        for (int i = 0; i < d; i++) s += (double)q[i] * K[(size_t)j * d + i];
        double w = exp(s * scale - mx);
        l += w;
        for (int i = 0; i < d; i++) out[i] += w * V[(size_t)j * d + i];
    }
    for (int i = 0; i < d; i++) out[i] /= l;
}

/* A token at position p of a window-W layer sees exactly positions
 * p-W+1..p: ak_kv_attend_run_window equals a direct softmax over those (f32
 * cache, so only rounding differs), for windows smaller than, equal to and
 * larger than a block, runs that start inside, at and past the window, and
 * decode (runs of one); a token's result does not depend on the run it was
 * computed in (bit for bit); window 0 is ak_kv_attend_run's full causal
 * attention, bit for bit. */
TEST(attend_window_matches_direct_softmax) {
    enum { N = 100, D = 16, NQ = 2, T = 8 };
    ak_cache_spec spec = {.n_layer = 1, .n_head_kv = 1, .head_dim_k = D, .head_dim_v = D, .n_ctx = N};
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&spec, T, 0, &err);
    REQUIRE(pool, "pool: %s", err.msg);
    ak_kv *kv = ak_kv_new(pool, AK_KV_F32, AK_KV_F32, N, &err);
    REQUIRE(kv, "kv: %s", err.msg);
    static float K[N * D], V[N * D], Q[N * NQ * D], out[N * NQ * D], one[NQ * D], full[NQ * D];
    ak_rng r;
    ak_rng_seed(&r, 11);
    for (int i = 0; i < N * D; i++) { K[i] = ak_rng_normal(&r); V[i] = ak_rng_normal(&r); }
    for (int i = 0; i < N * NQ * D; i++) Q[i] = ak_rng_normal(&r);
    REQUIRE(ak_kv_prepare(kv, 0, N, &err) == 0, "prepare: %s", err.msg);
    for (int p = 0; p < N; p++) REQUIRE(ak_kv_write(kv, 0, p, K + p * D, V + p * D, &err) == 0, "write: %s", err.msg);
    float *scratch = malloc(sizeof(float) * ak_kv_attend_run_scratch(kv, NQ * N));
    REQUIRE(scratch, "scratch");
    const float scale = 0.25f;
    static const int windows[] = {1, 5, 8, 16, 33, 200};
    static const int runs[][2] = {{0, 40}, {3, 17}, {20, 16}, {37, 63}, {90, 10}, {99, 1}, {50, 1}, {7, 1}};
    int bad = 0, notsame = 0;
    double worst = 0;
    for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; wi++) {
        int W = windows[wi];
        for (size_t ri = 0; ri < sizeof runs / sizeof runs[0]; ri++) {
            int pos0 = runs[ri][0], nt = runs[ri][1];
            ak_kv_attend_run_window(kv, &(ak_kv_query){.layer = 0, .kv_head = 0, .q = Q + (size_t)pos0 * NQ * D,
                                    .qstride = NQ * D, .n_q = NQ, .scale = scale, .out = out, .ostride = NQ * D,
                                    .scratch = scratch}, nt, pos0, W);
            for (int tk = 0; tk < nt; tk++) {
                int p = pos0 + tk, lo = p - W + 1 > 0 ? p - W + 1 : 0;
                for (int h = 0; h < NQ; h++) {
                    double ref[D];
                    naive_attend(K, V, D, lo, p, Q + ((size_t)p * NQ + h) * D, scale, ref);
                    for (int i = 0; i < D; i++) {
                        double e = fabs(out[((size_t)tk * NQ + h) * D + i] - ref[i]);
                        if (e > worst) worst = e;
                        if (e > 1e-5) bad++;
                    }
                }
                /* the same token decoded alone */
                ak_kv_attend_run_window(kv, &(ak_kv_query){.layer = 0, .kv_head = 0, .q = Q + (size_t)p * NQ * D,
                                        .n_q = NQ, .scale = scale, .out = one, .scratch = scratch}, 1, p, W);
                if (memcmp(one, out + (size_t)tk * NQ * D, sizeof one)) notsame++;
            }
        }
    }
    CHECK(bad == 0, "%d outputs differ from the direct windowed softmax (worst %g)", bad, worst);
    CHECK(notsame == 0, "%d tokens differ between their run and decoding alone", notsame);
    /* no window: full causal attention, the same bits as ak_kv_attend_run */
    int diff0 = 0;
    for (int p = 0; p < N; p += 7) {
        ak_kv_attend_run_window(kv, &(ak_kv_query){.layer = 0, .kv_head = 0, .q = Q + (size_t)p * NQ * D, .n_q = NQ,
                                .scale = scale, .out = one, .scratch = scratch}, 1, p, 0);
        ak_kv_attend_run(kv, &(ak_kv_query){.layer = 0, .kv_head = 0, .q = Q + (size_t)p * NQ * D, .n_q = NQ,
                         .scale = scale, .out = full, .scratch = scratch}, 1, p);
        diff0 += memcmp(one, full, sizeof one) != 0;
        double ref[D];
        naive_attend(K, V, D, 0, p, Q + (size_t)p * NQ * D, scale, ref);
        for (int i = 0; i < D; i++) diff0 += fabs(one[i] - ref[i]) > 1e-5;
    }
    CHECK(diff0 == 0, "window 0: %d mismatches against full causal attention", diff0);
    free(scratch);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
}

/* Loads path expecting failure; the message must be one line naming arch. */
static void expect_unsupported(ak_test_ctx *t, const char *path, const char *arch) {
    ak_error err = {{0}};
    ak_model *m = ak_model_load(path, NULL, NULL, &err);
    if (m) {
        ak_model_free(m);
        ak_test_fail(t, __FILE__, __LINE__, "%s (architecture %s) loaded", path, arch);
        return;
    }
    char quoted[64];
    snprintf(quoted, sizeof quoted, "'%s'", arch);
    CHECK(strstr(err.msg, "unsupported architecture") && strstr(err.msg, quoted), "%s: message does not name %s: %s",
          path, quoted, err.msg);
    CHECK(!strchr(err.msg, '\n'), "%s: message is more than one line: %s", path, err.msg);
    CHECK(err.code == AK_ERR_INVALID, "%s: code %d, expected AK_ERR_INVALID", path, err.code);
}

/* A file of an architecture the engine does not run is refused up front,
 * with one line naming it: a made-up one (only its architecture key and an
 * embedding, nothing else it would need). */
TEST(unsupported_architecture_one_line_error) {
    char path[512];
    snprintf(path, sizeof path, "%s/arch-mamba.gguf", test_tmp_dir());
    ak_error err = {{0}};
    gguf_writer *w = gguf_writer_open(path, &err);
    REQUIRE(w, "open: %s", err.msg);
    gguf_writer_kv_str(w, "general.architecture", "mamba");
    gguf_writer_kv_u32(w, "mamba.embedding_length", 8);
    uint64_t ne[2] = {8, 4};
    gguf_writer_tensor(w, "token_embd.weight", GGML_TYPE_F32, 2, ne);
    gguf_writer_begin_data(w);
    float z[32] = {0};
    gguf_writer_write(w, z, sizeof z);
    REQUIRE(gguf_writer_close(w, &err) == 0, "write: %s", err.msg);
    expect_unsupported(t, path, "mamba");
    unlink(path);
}

/* Qwen3's template, worked by hand from the real template's logic (ChatML;
 * an assistant turn's reasoning kept only after the last user query, and
 * always an explicit think block on a final assistant turn). */
TEST(chat_qwen3_renders_as_its_template) {
    static const struct {
        const char *what;
        int n, gen;
        ak_chat_msg m[4];
        const char *want;
    } cases[] = {
        {.what = "system + user", .n = 2, .gen = 1,
         .m = {{.role = "system", .content = "S"}, {.role = "user", .content = "Hi"}},
         .want = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
        {.what = "earlier reasoning dropped", .n = 3, .gen = 1,
         .m = {{.role = "user", .content = "Hi"},
               {.role = "assistant", .content = "<think>\nreason\n</think>\n\nHello"},
               {.role = "user", .content = "More"}},
         .want = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
                 "<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n"},
        {.what = "final turn keeps reasoning", .n = 2, .gen = 0,
         .m = {{.role = "user", .content = "Hi"},
               {.role = "assistant", .content = "<think>\nreason\n</think>\n\nHello"}},
         .want = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nreason\n</think>\n\nHello<|im_end|>\n"},
        {.what = "final turn without reasoning", .n = 2, .gen = 0,
         .m = {{.role = "user", .content = "Hi"}, {.role = "assistant", .content = "\nHello"}},
         .want = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>\n"},
        {.what = "two turns after the query", .n = 3, .gen = 0,
         .m = {{.role = "user", .content = "Q"}, {.role = "assistant", .content = "x<think>a\n\n</think>b"},
               {.role = "assistant", .content = "\nc"}},
         .want = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\na\n</think>\n\nb<|im_end|>\n"
                 "<|im_start|>assistant\n<think>\n\n</think>\n\nc<|im_end|>\n"},
        {.what = "no reasoning, not last", .n = 3, .gen = 1,
         .m = {{.role = "user", .content = "Q"}, {.role = "assistant", .content = "\nplain"},
               {.role = "system", .content = "late"}},
         .want = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n\nplain<|im_end|>\n"
                 "<|im_start|>system\nlate<|im_end|>\n<|im_start|>assistant\n"},
        {.what = "tool response is no query", .n = 3, .gen = 1,
         .m = {{.role = "user", .content = "q"}, {.role = "assistant", .content = "<think>r</think>x"},
               {.role = "user", .content = "<tool_response>y</tool_response>"}},
         .want = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nx<|im_end|>\n"
                 "<|im_start|>user\n<tool_response>y</tool_response><|im_end|>\n<|im_start|>assistant\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        ak_error err = {{0}};
        int rc = ak_chat_render(cases[i].m, cases[i].n,
                                &(ak_chat_opts){.family = AK_CHAT_QWEN3, .add_generation_prompt = cases[i].gen, .bos = "<bos>", .eos = "<eos>"},
                                &out, &err);
        CHECK(rc == 0 && out && !strcmp(out, cases[i].want), "%s:\n    want \"%s\"\n    got  \"%s\" %s", cases[i].what,
              cases[i].want, out ? out : "(null)", err.msg);
        free(out);
    }
    /* detection: Qwen3's markers pick it; a plain ChatML template stays chatml */
    CHECK(ak_chat_detect("{%- if message.reasoning_content is string %}{{ '<|im_start|>' }}"
                         "{%- if '</think>' in content %}") == AK_CHAT_QWEN3, "qwen3 not detected");
    CHECK(ak_chat_detect("{{ '<|im_start|>' + message['role'] }}") == AK_CHAT_CHATML, "chatml taken for qwen3");
    CHECK(!strcmp(ak_chat_end_of_turn(AK_CHAT_QWEN3), "<|im_end|>"), "qwen3 end of turn");
    ak_chat_family f;
    ak_error err = {{0}};
    CHECK(ak_chat_family_parse("qwen3", &f, &err) == 0 && f == AK_CHAT_QWEN3, "parse qwen3");
}

/* A gemma3 agent whose context crossed the 16-position window several
 * times, saved and restored warm into a fresh sequence, continues exactly as
 * the hot one: every following step's logits equal, bit for bit (both
 * caches hold every position; the local layers mask to the window). */
static void check_gemma3_warm(ak_test_ctx *t, ak_kv_format fk, ak_kv_format fv) {
    char path[512], dir[512];
    ak_error err = {{0}};
    ak_model *m = ak_model_load(test_path(path, sizeof path, "models/gemma3-tiny.gguf"), NULL, NULL, &err);
    REQUIRE(m, "load: %s", err.msg);
    ak_tokenizer *tk = ak_tokenizer_load(&m->gguf, &err);
    const char *text = "Once upon a time there was a little girl named Lily. She loved to play outside in the park "
                       "with her friends. One day she saw a big red ball under a tree and ran to get it. The ball "
                       "was stuck, so she asked her brother to help.";
    snprintf(dir, sizeof dir, "%s/gemma3-warm-%s-%s", test_tmp_dir(), ak_kv_format_get(fk)->name,
             ak_kv_format_get(fv)->name);
    int32_t *ids = NULL;
    size_t n = 0;
    int V = m->cfg.vocab, steps = 40;
    ak_block_pool *pool = ak_block_pool_new(&m->spec, 0, 0, &err);
    ak_kv *hot = pool ? ak_kv_new(pool, fk, fv, 256, &err) : NULL, *warm = hot ? ak_kv_new(pool, fk, fv, 256, &err) : NULL;
    ak_ctx *c = ak_ctx_new(m, 64, 2, &err);
    ak_store *st = ak_store_open(dir, NULL, &err);
    float *lh = malloc(sizeof(float) * V), *lw = malloc(sizeof(float) * V);
    int differ = 0, first = -1;
    if (!tk || !warm || !c || !st || !lh || !lw ||
        ak_tokenize(tk, text, strlen(text), AK_TOK_ADD_SPECIAL, &ids, &n, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "setup: %s", err.msg);
        goto out;
    }
    if (n < 3 * 16) { ak_test_fail(t, __FILE__, __LINE__, "prompt of %zu tokens crosses the window too few times", n); goto out; }
    if (ak_eval(c, hot, &(ak_eval_args){.tokens = ids, .n = (int)n, .logits = lh}, &err) < 0 ||
        ak_store_save(st, "g3", hot, ids, (int)n, m->fingerprint, NULL, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "prefill/save: %s", err.msg);
        goto out;
    }
    ak_store_load_info info;
    ak_store_status r = ak_store_load(st, "g3", m->fingerprint, V, warm, &info, &err);
    if (r != AK_STORE_HIT || info.n_tokens != (int)n) {
        ak_test_fail(t, __FILE__, __LINE__, "restore: %s %s", ak_store_status_name(r), err.msg);
        goto out;
    }
    free(info.tokens);
    for (int i = 0; i < steps; i++) {
        int32_t tok = ak_argmax(lh, V);
        if (ak_eval(c, hot, &(ak_eval_args){.tokens = &tok, .n = 1, .pos0 = (int)n + i, .logits = lh}, &err) < 0 ||
            ak_eval(c, warm, &(ak_eval_args){.tokens = &tok, .n = 1, .pos0 = (int)n + i, .logits = lw}, &err) < 0) {
            ak_test_fail(t, __FILE__, __LINE__, "decode: %s", err.msg);
            goto out;
        }
        if (memcmp(lh, lw, sizeof(float) * V)) {
            differ++;
            if (first < 0) first = i;
        }
    }
    CHECK(differ == 0, "%s/%s: %d of %d steps after a warm restore differ from the hot sequence (first: step %d)",
          ak_kv_format_get(fk)->name, ak_kv_format_get(fv)->name, differ, steps, first);
    printf("    gemma3 %s/%s: %zu-token prompt, %d steps after a warm restore equal the hot ones\n",
           ak_kv_format_get(fk)->name, ak_kv_format_get(fv)->name, n, steps - differ);
out:
    free(ids); free(lh); free(lw);
    ak_store_close(st);
    ak_ctx_free(c);
    ak_kv_free(hot); ak_kv_free(warm);
    ak_block_pool_free(pool);
    ak_tokenizer_free(tk);
    ak_model_free(m);
}

TEST(gemma3_warm_restore_continues_as_hot) {
    check_gemma3_warm(t, AK_KV_F16, AK_KV_F16);
    check_gemma3_warm(t, AK_KV_Q8, AK_KV_TQ3);
}

/* Gemma 3's template, worked by hand from the real template's logic: the
 * first system message goes, untrimmed, in front of the next turn's trimmed
 * content; it takes system messages where Gemma 2's refuses them. */
TEST(chat_gemma3_renders_as_its_template) {
    static const struct {
        const char *what;
        int n, gen;
        ak_chat_msg m[3];
        const char *want;
    } cases[] = {
        {.what = "system + user", .n = 2, .gen = 1,
         .m = {{.role = "system", .content = "You are terse."}, {.role = "user", .content = "  Hi  "}},
         .want = "<bos><start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n<start_of_turn>model\n"},
        {.what = "turns", .n = 3, .gen = 1,
         .m = {{.role = "user", .content = "a"}, {.role = "assistant", .content = " b "},
               {.role = "user", .content = "c"}},
         .want = "<bos><start_of_turn>user\na<end_of_turn>\n<start_of_turn>model\nb<end_of_turn>\n"
                 "<start_of_turn>user\nc<end_of_turn>\n<start_of_turn>model\n"},
        {.what = "system kept as is", .n = 2, .gen = 0,
         .m = {{.role = "system", .content = " S "}, {.role = "user", .content = "u\n"}},
         .want = "<bos><start_of_turn>user\n S \n\nu<end_of_turn>\n"},
        {.what = "later system turn", .n = 2, .gen = 1,
         .m = {{.role = "user", .content = "u"}, {.role = "system", .content = " late"}},
         .want = "<bos><start_of_turn>user\nu<end_of_turn>\n<start_of_turn>system\nlate<end_of_turn>\n<start_of_turn>model\n"},
        {.what = "system alone", .n = 1, .gen = 1, .m = {{.role = "system", .content = " only "}},
         .want = "<bos><start_of_turn>user\nonly<end_of_turn>\n<start_of_turn>model\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        ak_error err = {{0}};
        int rc = ak_chat_render(cases[i].m, cases[i].n,
                                &(ak_chat_opts){.family = AK_CHAT_GEMMA3, .add_generation_prompt = cases[i].gen, .bos = "<bos>", .eos = "<eos>"},
                                &out, &err);
        CHECK(rc == 0 && out && !strcmp(out, cases[i].want), "%s:\n    want \"%s\"\n    got  \"%s\" %s", cases[i].what,
              cases[i].want, out ? out : "(null)", err.msg);
        free(out);
    }
    CHECK(ak_chat_detect("{{ bos_token }}{%- set first_user_prefix = '' -%}{{ '<start_of_turn>' }}") == AK_CHAT_GEMMA3,
          "gemma3 not detected");
    CHECK(ak_chat_detect("{{ '<start_of_turn>' + role }}") == AK_CHAT_GEMMA, "gemma taken for gemma3");
    CHECK(!strcmp(ak_chat_end_of_turn(AK_CHAT_GEMMA3), "<end_of_turn>"), "gemma3 end of turn");
}

/* Which gemma3 layers are local: every 6th global by default (llama.cpp's
 * pattern, the key absent), attention.sliding_window_pattern as a number N
 * (every N-th global) or as n_layer booleans (true: local). The same layout
 * written three ways gives the same logits bit for bit; another layout
 * other logits; a flag array of the wrong length is refused, naming the key. */
TEST(gemma3_layer_pattern_from_file) {
    static const uint8_t def6[6] = {1, 1, 1, 1, 1, 0}, none[6] = {0};
    static const struct { const char *what; int pattern; const uint8_t *flags; int local[6]; } v[] = {
        {.what = "no key", .pattern = 0, .flags = NULL, .local = {1, 1, 1, 1, 1, 0}},
        {.what = "pattern 6", .pattern = 6, .flags = NULL, .local = {1, 1, 1, 1, 1, 0}},
        {.what = "flags as pattern 6", .pattern = 0, .flags = def6, .local = {1, 1, 1, 1, 1, 0}},
        {.what = "pattern 3", .pattern = 3, .flags = NULL, .local = {1, 1, 0, 1, 1, 0}},
        {.what = "flags all global", .pattern = 0, .flags = none, .local = {0, 0, 0, 0, 0, 0}},
    };
    enum { NV = sizeof v / sizeof v[0], NTOK = 24, VOCAB = 300 };
    static float logits[NV][VOCAB];
    int32_t toks[NTOK];
    for (int i = 0; i < NTOK; i++) toks[i] = 5 + (i * 37) % 250;
    for (int i = 0; i < NV; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/g3-pattern-%d.gguf", test_tmp_dir(), i);
        ak_synth_opts o;
        ak_synth_defaults(&o);
        o.path = path; o.arch = "gemma3"; o.dim = 64; o.n_layers = 6; o.n_heads = 2; o.n_kv_heads = 1;
        o.head_dim = 32; o.ffn = 128; o.vocab = VOCAB; o.ctx = 64; o.wtype = GGML_TYPE_F32; o.seed = 3;
        o.window = 4; o.n_threads = 2; o.swa_pattern = v[i].pattern; o.swa_layers = v[i].flags;
        ak_error err = {{0}};
        REQUIRE(ak_synth_write(&o, &err) == 0, "synth %s: %s", v[i].what, err.msg);
        ak_model *m = ak_model_load(path, NULL, NULL, &err);
        REQUIRE(m, "%s: load: %s", v[i].what, err.msg);
        for (int l = 0; l < 6; l++)
            CHECK((m->layers[l].window != 0) == v[i].local[l] && (!m->layers[l].window || m->layers[l].window == 4),
                  "%s: layer %d window %d", v[i].what, l, m->layers[l].window);
        ak_block_pool *pool = ak_block_pool_new(&m->spec, 8, 0, &err);
        ak_kv *kv = pool ? ak_kv_new(pool, AK_KV_F32, AK_KV_F32, 64, &err) : NULL;
        ak_ctx *c = ak_ctx_new(m, 32, 2, &err);
        CHECK(kv && c && ak_eval(c, kv, &(ak_eval_args){.tokens = toks, .n = NTOK, .logits = logits[i]}, &err) == 0,
              "%s: eval: %s", v[i].what, err.msg);
        ak_ctx_free(c);
        ak_kv_free(kv);
        ak_block_pool_free(pool);
        ak_model_free(m);
        unlink(path);
    }
    CHECK(!memcmp(logits[0], logits[1], sizeof logits[0]), "pattern 6 written differs from the default");
    CHECK(!memcmp(logits[0], logits[2], sizeof logits[0]), "flags of pattern 6 differ from the default");
    CHECK(memcmp(logits[0], logits[3], sizeof logits[0]), "pattern 3 computes as pattern 6");
    CHECK(memcmp(logits[0], logits[4], sizeof logits[0]), "all-global flags compute as pattern 6");

    /* 5 flags for 6 layers: refused while reading the hyperparameters */
    char path[512];
    snprintf(path, sizeof path, "%s/g3-pattern-short.gguf", test_tmp_dir());
    ak_error err = {{0}};
    gguf_writer *w = gguf_writer_open(path, &err);
    REQUIRE(w, "open: %s", err.msg);
    gguf_writer_kv_str(w, "general.architecture", "gemma3");
    gguf_writer_kv_u32(w, "gemma3.embedding_length", 64);
    gguf_writer_kv_u32(w, "gemma3.block_count", 6);
    gguf_writer_kv_u32(w, "gemma3.attention.head_count", 2);
    gguf_writer_kv_u32(w, "gemma3.feed_forward_length", 128);
    gguf_writer_kv_u32(w, "gemma3.attention.sliding_window", 4);
    gguf_writer_kv_arr(w, "gemma3.attention.sliding_window_pattern", GGUF_TYPE_BOOL, def6, 5);
    REQUIRE(gguf_writer_close(w, &err) == 0, "write: %s", err.msg);
    ak_model *m = ak_model_load(path, NULL, NULL, &err);
    CHECK(!m && strstr(err.msg, "sliding_window_pattern") && strstr(err.msg, "5 elements"), "short flags: %s",
          m ? "loaded" : err.msg);
    ak_model_free(m);
    unlink(path);
}

/* Fills every K/V vector of gemma3's local layers at positions [from, to)
 * with 0xff bytes (NaN in f32): whatever reads one is poisoned. */
static int poison_local(ak_kv *kv, const ak_model *m, int from, int to) {
    const ak_cache_spec *s = &m->spec;
    for (int l = 0; l < s->n_layer; l++) {
        if (!m->layers[l].window) continue;
        for (int is_v = 0; is_v < 2; is_v++)
            for (int h = 0; h < s->n_head_kv; h++)
                for (int p = from; p < to; p++) {
                    uint8_t *x = ak_kv_stored_mut(kv, l, is_v, 0, h, p);
                    if (!x) return -1;
                    memset(x, 0xff, (size_t)ak_kv_format_code_bytes(AK_KV_F32, is_v ? s->head_dim_v : s->head_dim_k));
                }
    }
    return 0;
}

/* A local layer never reads a position that left its window: with those
 * positions' keys and values of every local layer overwritten by NaNs, every
 * decode step's logits equal the clean sequence's, bit for bit. This is what
 * lets a per-layer cache free the blocks that slide out. */
TEST(gemma3_local_layers_never_read_past_the_window) {
    char path[512];
    ak_error err = {{0}};
    ak_model *m = ak_model_load(test_path(path, sizeof path, "models/gemma3-tiny.gguf"), NULL, NULL, &err);
    REQUIRE(m, "load: %s", err.msg);
    const int W = m->cfg.window, V = m->cfg.vocab, n = 40, steps = 24;
    int32_t toks[40];
    for (int i = 0; i < n; i++) toks[i] = 100 + (i * 211) % 20000;
    ak_block_pool *pool = ak_block_pool_new(&m->spec, 8, 0, &err);
    ak_kv *clean = pool ? ak_kv_new(pool, AK_KV_F32, AK_KV_F32, 128, &err) : NULL;
    ak_kv *pois = clean ? ak_kv_new(pool, AK_KV_F32, AK_KV_F32, 128, &err) : NULL;
    ak_ctx *c = ak_ctx_new(m, 64, 2, &err);
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    int differ = 0, nan = 0;
    if (W != 16 || !pois || !c || !la || !lb ||
        ak_eval(c, clean, &(ak_eval_args){.tokens = toks, .n = n, .logits = la}, &err) < 0 ||
        ak_eval(c, pois, &(ak_eval_args){.tokens = toks, .n = n, .logits = lb}, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "setup (window %d): %s", W, err.msg);
        goto out;
    }
    for (int i = 0; i < steps; i++) {
        int p = n + i;   /* the next token's position: it sees p - W + 1 .. p */
        if (poison_local(pois, m, 0, p - W + 1) < 0) { ak_test_fail(t, __FILE__, __LINE__, "poison"); goto out; }
        int32_t tok = ak_argmax(la, V);
        if (ak_eval(c, clean, &(ak_eval_args){.tokens = &tok, .n = 1, .pos0 = p, .logits = la}, &err) < 0 ||
            ak_eval(c, pois, &(ak_eval_args){.tokens = &tok, .n = 1, .pos0 = p, .logits = lb}, &err) < 0) {
            ak_test_fail(t, __FILE__, __LINE__, "decode: %s", err.msg);
            goto out;
        }
        differ += memcmp(la, lb, sizeof(float) * V) != 0;
        nan += isnan(lb[0]);
    }
    CHECK(differ == 0, "%d of %d steps differ once positions out of the window hold NaNs (%d NaN logits)", differ,
          steps, nan);
out:
    free(la); free(lb);
    ak_ctx_free(c);
    ak_kv_free(clean); ak_kv_free(pois);
    ak_block_pool_free(pool);
    ak_model_free(m);
}

/* Sets float i of tensor `name` in buf, the bytes of GGUF file g (F32). */
static void poke(const gguf_file *g, char *buf, const char *name, size_t i, float v) {
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) return;
    size_t off = (size_t)((const char *)t->data - (const char *)g->map) + i * sizeof(float);
    memcpy(buf + off, &v, sizeof v);
}

/* Logits of a fixed prompt on model file path (f16 cache), into out (vocab
 * floats each, one row per position). Returns 0, or -1. */
static int moe_logits(const char *path, const int32_t *ids, int n, float *out) {
    ak_error err = {{0}};
    ak_model *m = ak_model_load(path, NULL, NULL, &err);
    ak_block_pool *pool = m ? ak_block_pool_new(&m->spec, 16, 0, &err) : NULL;
    ak_kv *kv = pool ? ak_kv_new(pool, AK_KV_F16, AK_KV_F16, 64, &err) : NULL;
    ak_ctx *c = kv ? ak_ctx_new(m, 8, 2, &err) : NULL;
    int rc = c ? ak_eval(c, kv, &(ak_eval_args){.tokens = ids, .n = n, .all_logits = out}, &err) : -1;
    ak_ctx_free(c);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    ak_model_free(m);
    return rc;
}

/* deepseek2's MoE reads only the experts a token chose: in a synthetic
 * model whose MoE layer's router can only ever pick experts 0-3 (the FFN
 * input is reduced to one dimension, on which experts 0/1 score +1, 2/3
 * score -1 and 6/7 score 0), filling experts 6 and 7 with NaN changes no
 * logit of a prefill (batches of 8: tokens grouped by expert) - a pass that
 * computed every expert and weighted the unchosen ones by 0 would get NaN. */
TEST(deepseek2_moe_reads_only_chosen_experts) {
    char path[512], poisoned[512], clean[512];
    snprintf(path, sizeof path, "%s/moe-src.gguf", test_tmp_dir());
    snprintf(clean, sizeof clean, "%s/moe-clean.gguf", test_tmp_dir());
    snprintf(poisoned, sizeof poisoned, "%s/moe-nan.gguf", test_tmp_dir());
    ak_synth_opts o;
    ak_synth_defaults(&o);
    o.path = path; o.arch = "deepseek2"; o.dim = 64; o.n_layers = 2; o.n_heads = 2; o.n_kv_heads = 1;
    o.head_dim = 24; o.rope_dim = 8; o.kv_lora = 32; o.ffn = 64; o.vocab = 300; o.ctx = 64;
    o.wtype = GGML_TYPE_F32; o.n_experts = 8; o.n_experts_used = 2; o.n_experts_shared = 1; o.expert_ffn = 32;
    o.n_dense_lead = 1; o.n_threads = 2;
    ak_error err = {{0}};
    REQUIRE(ak_synth_write(&o, &err) == 0, "synth: %s", err.msg);
    gguf_file g;
    REQUIRE(gguf_open(&g, path, &err) == 0, "open: %s", err.msg);
    size_t len = 0;
    char *buf = ak_read_file(path, &len, &err);
    REQUIRE(buf, "read: %s", err.msg);
    for (int d = 0; d < 64; d++) {
        poke(&g, buf, "blk.1.ffn_norm.weight", d, d == 0 ? 1.0f : 0.0f);
        static const float score[8] = {1, 1, -1, -1, 0.5f, -0.5f, 0, 0};
        for (int e = 0; e < 8; e++) poke(&g, buf, "blk.1.ffn_gate_inp.weight", (size_t)e * 64 + d, d ? 0 : score[e]);
    }
    FILE *f = fopen(clean, "wb");
    REQUIRE(f && fwrite(buf, 1, len, f) == len && fclose(f) == 0, "write %s", clean);
    for (int e = 6; e < 8; e++)
        for (size_t i = 0; i < 32 * 64; i++) {
            poke(&g, buf, "blk.1.ffn_gate_exps.weight", e * 32 * 64 + i, NAN);
            poke(&g, buf, "blk.1.ffn_up_exps.weight", e * 32 * 64 + i, NAN);
            poke(&g, buf, "blk.1.ffn_down_exps.weight", e * 32 * 64 + i, NAN);
        }
    f = fopen(poisoned, "wb");
    REQUIRE(f && fwrite(buf, 1, len, f) == len && fclose(f) == 0, "write %s", poisoned);
    free(buf);
    gguf_close(&g);
    enum { N = 20, V = 300 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = 3 + (i * 37) % 290;
    static float a[N * V], b[N * V];
    REQUIRE(moe_logits(clean, ids, N, a) == 0 && moe_logits(poisoned, ids, N, b) == 0, "eval");
    int nan = 0;
    for (int i = 0; i < N * V; i++) nan += isnan(b[i]) || isnan(a[i]);
    CHECK(nan == 0, "%d logits are NaN: an unchosen expert was computed", nan);
    CHECK(!memcmp(a, b, sizeof a), "logits differ with unchosen experts poisoned");
    unlink(path); unlink(clean); unlink(poisoned);
}

/* DeepSeek-V2(-Lite)-Chat's template, worked by hand from its text (below):
 * bos; system content + "\n\n"; "User: " + content + "\n\n"; "Assistant: "
 * + content + eos; generation prompt "Assistant:". */
TEST(chat_deepseek2_renders_as_its_template) {
    static const char tmpl[] =
        "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
        "{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == 'assistant' %}"
        "{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
        "{{ message['content'] + '\\n\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";
    CHECK(ak_chat_detect(tmpl) == AK_CHAT_DEEPSEEK2, "deepseek2 not detected");
    const char *eos = "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
    const char *bos = "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
    const ak_chat_msg msgs[] = {{.role = "system", .content = "Be brief."}, {.role = "user", .content = "Hi"},
                                {.role = "assistant", .content = " Hello!"}, {.role = "user", .content = "2+2?"}};
    char *out = NULL;
    ak_error err = {{0}};
    REQUIRE(ak_chat_render(msgs, 4,
                           &(ak_chat_opts){.family = AK_CHAT_DEEPSEEK2, .template_text = tmpl, .add_generation_prompt = 1, .bos = bos, .eos = eos},
                           &out, &err) == 0, "%s", err.msg);
    char want[512];
    snprintf(want, sizeof want, "%sBe brief.\n\nUser: Hi\n\nAssistant:  Hello!%sUser: 2+2?\n\nAssistant:", bos, eos);
    CHECK(!strcmp(out, want), "got '%s', want '%s'", out, want);
    free(out);
    REQUIRE(ak_chat_render(msgs + 1, 1,
                           &(ak_chat_opts){.family = AK_CHAT_DEEPSEEK2, .template_text = tmpl, .bos = bos, .eos = eos},
                           &out, &err) == 0, "%s", err.msg);
    snprintf(want, sizeof want, "%sUser: Hi\n\n", bos);
    CHECK(!strcmp(out, want), "no generation prompt: got '%s'", out);
    free(out);
    CHECK(!strcmp(ak_chat_end_of_turn(AK_CHAT_DEEPSEEK2), eos), "deepseek2 end of turn");
    ak_chat_family f;
    CHECK(ak_chat_family_parse("deepseek2", &f, &err) == 0 && f == AK_CHAT_DEEPSEEK2, "parse deepseek2");
}

/* The synthetic deepseek2 file with DeepSeek-V2-Lite's YaRN metadata that
 * tests/data/deepseek2-yarn/ was computed from (its README gives the same
 * `agentkv synth` command): seed 18, the DeepSeek LLM vocabulary of the
 * tiny golden file, factor 40, original context 4096, log multiplier
 * 0.0707; yarn 0 writes the same weights with no rope.scaling keys. */
static int write_yarn_file(const char *path, int yarn, ak_error *err) {
    char vocab[512];
    ak_synth_opts o;
    ak_synth_defaults(&o);
    o.path = path; o.arch = "deepseek2"; o.dim = 64; o.n_layers = 3; o.n_heads = 4; o.n_kv_heads = 1;
    o.head_dim = 48; o.kv_lora = 32; o.ffn = 128; o.ctx = 163840; o.wtype = GGML_TYPE_F32; o.seed = 18;
    o.n_experts = 8; o.n_experts_used = 2; o.n_experts_shared = 2; o.expert_ffn = 32; o.n_dense_lead = 1;
    o.vocab_from = test_path(vocab, sizeof vocab, "models/deepseek2-tiny.gguf");
    o.n_threads = 2;
    if (yarn) { o.yarn_factor = 40.0f; o.yarn_orig_ctx = 4096; o.yarn_log_mul = 0.0707f; }
    return ak_synth_write(&o, err);
}

/* Perplexity of story.txt at -c n_ctx with a cache of format fmt, by
 * llama.cpp's method (as test_golden.c). Returns it, or -1. */
static double yarn_ppl(ak_model *m, ak_tokenizer *tk, int n_ctx, ak_kv_format fmt, ak_error *err) {
    char path[512];
    size_t len = 0, n = 0;
    int32_t *ids = NULL;
    double ppl = -1;
    char *text = ak_read_file(test_path(path, sizeof path, "golden/stories260K/story.txt"), &len, err);
    ak_block_pool *pool = text ? ak_block_pool_new(&m->spec, 0, 0, err) : NULL;
    ak_kv *kv = pool ? ak_kv_new(pool, fmt, fmt, n_ctx, err) : NULL;
    ak_ctx *c = kv ? ak_ctx_new(m, 512, 2, err) : NULL;
    ak_ppl_result r;
    int bos = ak_tokenizer_add_bos(tk);
    if (c && ak_tokenize(tk, text, len, bos ? AK_TOK_ADD_SPECIAL : 0, &ids, &n, err) == 0 &&
        ak_perplexity(c, kv, ids, n, n_ctx, &(ak_ppl_opts){.bos = bos ? ak_tokenizer_bos(tk) : -1}, &r, err) == 0)
        ppl = r.ppl;
    free(text); free(ids);
    ak_ctx_free(c);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    return ppl;
}

/* Greedy ids of prompt (BOS added), n of them, into out. Returns 0, or -1. */
static int yarn_greedy(ak_model *m, ak_tokenizer *tk, const char *prompt, int n, int32_t *out, ak_error *err) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = -1, V = m->cfg.vocab;
    if (ak_tokenize(tk, prompt, strlen(prompt), AK_TOK_ADD_SPECIAL, &ids, &n_ids, err) < 0) return -1;
    ak_block_pool *pool = ak_block_pool_new(&m->spec, 0, 0, err);
    ak_kv *kv = pool ? ak_kv_new(pool, AK_KV_F32, AK_KV_F32, (int)n_ids + n + 1, err) : NULL;
    ak_ctx *c = kv ? ak_ctx_new(m, 64, 2, err) : NULL;
    float *logits = malloc(sizeof(float) * V);
    if (c && logits && ak_eval(c, kv, &(ak_eval_args){.tokens = ids, .n = (int)n_ids, .logits = logits}, err) == 0) {
        rc = 0;
        for (int i = 0; i < n && rc == 0; i++) {
            out[i] = ak_argmax(logits, V);
            if (i + 1 < n) rc = ak_eval(c, kv, &(ak_eval_args){.tokens = &out[i], .n = 1, .pos0 = (int)n_ids + i,
                                        .logits = logits}, err);
        }
    }
    free(ids); free(logits);
    ak_ctx_free(c);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    return rc;
}

/* YaRN as DeepSeek-V2(-Lite)'s files use it, against llama.cpp on a
 * synthetic file with that metadata (tests/data/deepseek2-yarn: llama.cpp's
 * greedy ids and its perplexity of story.txt at -c 128 with an F32 cache,
 * flash attention off). Greedy ids must be equal and the perplexity within
 * 0.01%. The same weights without the rope.scaling keys must miss the
 * reference by far (it is what makes the reference a test of YaRN: the
 * attention factor alone scales the scores by 1.59). */
TEST(deepseek2_yarn_matches_llama_cpp) {
    char path[512], plain[512];
    snprintf(path, sizeof path, "%s/ds2-yarn.gguf", test_tmp_dir());
    snprintf(plain, sizeof plain, "%s/ds2-noyarn.gguf", test_tmp_dir());
    ak_error err = {{0}};
    size_t len = 0;
    char *ref_text = ak_read_file("tests/data/deepseek2-yarn/reference.json", &len, &err);
    REQUIRE(ref_text, "reference (run from the repository root): %s", err.msg);
    cJSON *ref = cJSON_Parse(ref_text);
    free(ref_text);
    REQUIRE(ref, "reference.json does not parse");
    cJSON *ppl_ref = cJSON_GetObjectItem(cJSON_GetObjectItem(ref, "ppl_story_c128"), "f32_cache_fa_off");
    cJSON *greedy_ref = cJSON_GetObjectItem(ref, "greedy");
    if (!cJSON_IsNumber(ppl_ref) || !cJSON_IsArray(greedy_ref) || cJSON_GetArraySize(greedy_ref) < 1) {
        cJSON_Delete(ref);
        REQUIRE(0, "reference.json lacks ppl_story_c128.f32_cache_fa_off or greedy");
    }
    if (write_yarn_file(path, 1, &err) < 0 || write_yarn_file(plain, 0, &err) < 0) {
        cJSON_Delete(ref);
        REQUIRE(0, "synth: %s", err.msg);
    }
    ak_model *m = ak_model_load(path, NULL, NULL, &err);
    ak_tokenizer *tk = m ? ak_tokenizer_load(&m->gguf, &err) : NULL;
    if (!tk) { ak_model_free(m); cJSON_Delete(ref); REQUIRE(0, "load: %s", err.msg); }
    CHECK(m->cfg.yarn_factor == 40.0f && m->cfg.yarn_orig_ctx == 4096, "YaRN metadata not read (factor %g, ctx %d)",
          m->cfg.yarn_factor, m->cfg.yarn_orig_ctx);
    cJSON *g;
    cJSON_ArrayForEach(g, greedy_ref) {
        cJSON *p = cJSON_GetObjectItem(g, "prompt"), *want = cJSON_GetObjectItem(g, "tokens");
        int n = cJSON_GetArraySize(want);
        if (!cJSON_IsString(p) || n < 1 || n > 256) { CHECK(0, "bad greedy entry"); continue; }
        int32_t got[256];
        if (yarn_greedy(m, tk, p->valuestring, n, got, &err) < 0) { CHECK(0, "greedy: %s", err.msg); continue; }
        int first = -1;
        for (int i = 0; i < n && first < 0; i++)
            if (got[i] != cJSON_GetArrayItem(want, i)->valueint) first = i;
        CHECK(first < 0, "'%s': token %d is %d, llama.cpp's %d", p->valuestring, first, first < 0 ? 0 : got[first],
              first < 0 ? 0 : cJSON_GetArrayItem(want, first)->valueint);
    }
    double expect = ppl_ref->valuedouble, ppl = yarn_ppl(m, tk, 128, AK_KV_F32, &err);
    double rel = fabs(ppl - expect) / expect;
    printf("    YaRN deepseek2 -c 128 (f32 cache): PPL %.4f, llama.cpp %.4f, rel diff %.5f%%\n", ppl, expect, rel * 100);
    CHECK(ppl > 0 && rel <= 0.0001, "PPL %.4f differs from llama.cpp's %.4f by %.4f%% (%s)", ppl, expect, rel * 100,
          err.msg);
    ak_tokenizer_free(tk);
    ak_model_free(m);
    m = ak_model_load(plain, NULL, NULL, &err);
    tk = m ? ak_tokenizer_load(&m->gguf, &err) : NULL;
    if (tk) {
        double off = yarn_ppl(m, tk, 128, AK_KV_F32, &err);
        printf("    the same weights without YaRN: PPL %.4f (%+.2f%%)\n", off, (off - expect) / expect * 100);
        CHECK(off > 0 && fabs(off - expect) / expect > 0.01, "without YaRN the PPL %.4f is within 1%% of %.4f: the "
              "reference does not test YaRN", off, expect);
    } else {
        CHECK(0, "load without YaRN: %s", err.msg);
    }
    ak_tokenizer_free(tk);
    ak_model_free(m);
    cJSON_Delete(ref);
    unlink(path); unlink(plain);
}

/* A position shift of a YaRN file is a pure rotation by YaRN's angles: its
 * magnitude is in the stored key already. Layer-0 keys (token and position
 * only) computed at [0, n) and shifted by DELTA equal those computed with
 * RoPE offset DELTA, to f32 rounding; applying the magnitude again, or the
 * unscaled frequencies, would miss by far more. */
TEST(deepseek2_yarn_shift_is_a_rotation) {
    enum { N = 24, DELTA = 37 };
    char path[512];
    snprintf(path, sizeof path, "%s/ds2-yarn-shift.gguf", test_tmp_dir());
    ak_error err = {{0}};
    REQUIRE(write_yarn_file(path, 1, &err) == 0, "synth: %s", err.msg);
    ak_model *m = ak_model_load(path, NULL, NULL, &err);
    REQUIRE(m, "load: %s", err.msg);
    ak_block_pool *pool = ak_block_pool_new(&m->spec, 16, 0, &err);
    ak_ctx *c = pool ? ak_ctx_new(m, 8, 2, &err) : NULL;
    ak_kv *kv[2] = {NULL, NULL};
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = 5 + (i * 7919) % 100000;
    int ok = c != NULL;
    for (int r = 0; r < 2 && ok; r++) {
        kv[r] = ak_kv_new(pool, AK_KV_F32, AK_KV_F32, 64, &err);
        ak_ctx_set_pos_offset(c, r ? DELTA : 0);
        ok = kv[r] && ak_eval(c, kv[r], &(ak_eval_args){.tokens = tok, .n = N}, &err) == 0;
        ak_ctx_set_pos_offset(c, 0);
    }
    int kd = m->spec.head_dim_k, vd = m->spec.head_dim_v;
    float k0[256], k1[256], v[256];
    double before = 0, after = 0, scale = 0;
    if (ok && kd <= 256 && vd <= 256) {
        for (int p = 0; p < N; p++) {
            ak_kv_read(kv[0], 0, p, k0, v, &err);
            ak_kv_read(kv[1], 0, p, k1, v, &err);
            for (int i = 0; i < kd; i++) before = fmax(before, fabs((double)k0[i] - k1[i]));
        }
        ok = ak_model_shift_keys(m, kv[0], 0, N, DELTA, &err) == 0;
        for (int p = 0; ok && p < N; p++) {
            ak_kv_read(kv[0], 0, p, k0, v, &err);
            ak_kv_read(kv[1], 0, p, k1, v, &err);
            for (int i = 0; i < kd; i++) {
                after = fmax(after, fabs((double)k0[i] - k1[i]));
                scale = fmax(scale, fabs(k1[i]));
            }
        }
    }
    CHECK(ok, "setup or shift: %s", err.msg);
    printf("    YaRN layer-0 keys shifted by %d vs computed at offset %d: max |diff| %.3g (keys up to %.3g; "
           "unshifted %.3g)\n", DELTA, DELTA, after, scale, before);
    CHECK(ok && after <= 1e-5 * scale && before > 100 * after, "shifted keys differ by %g (scale %g, unshifted %g)",
          after, scale, before);
    ak_kv_free(kv[0]); ak_kv_free(kv[1]);
    ak_ctx_free(c);
    ak_block_pool_free(pool);
    ak_model_free(m);
    unlink(path);
}
