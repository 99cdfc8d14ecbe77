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

int cmd_synth(int argc, char **argv) {
    ak_args a;
    args_init(&a, "synth", argc, argv);
    ak_synth_opts o;
    ak_synth_defaults(&o);
    /* explicit flags override the preset whatever their order: collect them
     * first, apply the preset, then the flags */
    const char *like = NULL, *type = NULL, *arch = NULL;
    long long dim = 0, layers = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0, ctx = 0, threads = 0, head_dim = 0;
    long long seed = 1, kv_lora = -1, experts = -1, experts_used = -1, experts_shared = -1, expert_ffn = -1;
    double rope = 0, yarn = 0, yarn_log_mul = 0;
    long long yarn_orig = 0;
    int tied = -1;
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-o") || !strcmp(f, "--output")) o.path = args_value(&a, f);
        else if (!strcmp(f, "--like")) like = args_value(&a, f);
        else if (!strcmp(f, "--type")) type = args_value(&a, f);
        else if (!strcmp(f, "--seed")) seed = args_int(&a, f, 0, INT64_MAX);
        else if (!strcmp(f, "--arch")) arch = args_value(&a, f);
        else if (!strcmp(f, "--dim")) dim = args_int(&a, f, 1, 65536);
        else if (!strcmp(f, "--layers")) layers = args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--heads")) heads = args_int(&a, f, 1, 4096);
        else if (!strcmp(f, "--kv-heads")) kv_heads = args_int(&a, f, 1, 4096);
        else if (!strcmp(f, "--head-dim")) head_dim = args_int(&a, f, 2, 1024);
        else if (!strcmp(f, "--ffn")) ffn = args_int(&a, f, 1, 1 << 20);
        else if (!strcmp(f, "--vocab")) vocab = args_int(&a, f, 260, 1 << 24);
        else if (!strcmp(f, "--ctx")) ctx = args_int(&a, f, 1, 1 << 24);
        else if (!strcmp(f, "--rope-base")) rope = args_float(&a, f, 1e-3, 1e12);
        else if (!strcmp(f, "--threads")) threads = args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--vocab-from")) o.vocab_from = args_value(&a, f);
        else if (!strcmp(f, "--kv-lora")) kv_lora = args_int(&a, f, 2, 4096);
        else if (!strcmp(f, "--experts")) experts = args_int(&a, f, 0, 1024);
        else if (!strcmp(f, "--experts-used")) experts_used = args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--experts-shared")) experts_shared = args_int(&a, f, 0, 1024);
        else if (!strcmp(f, "--expert-ffn")) expert_ffn = args_int(&a, f, 1, 1 << 20);
        else if (!strcmp(f, "--yarn")) yarn = args_float(&a, f, 1.0, 1e6);
        else if (!strcmp(f, "--yarn-orig-ctx")) yarn_orig = args_int(&a, f, 1, 1 << 24);
        else if (!strcmp(f, "--yarn-log-mul")) yarn_log_mul = args_float(&a, f, 0.0, 100.0);
        else if (!strcmp(f, "--tied")) tied = 1;
        else if (!strcmp(f, "--untied")) tied = 0;
        else args_unknown(&a, f);
    }
    if (a.failed) return AK_EXIT_USAGE;
    if (!o.path) args_error(&a, "-o FILE is required");
    else if (like && ak_synth_preset(&o, like) < 0) args_error(&a, "unknown preset '%s' (see --help)", like);
    else if (type && parse_type(type, &o.wtype) < 0) args_error(&a, "--type: '%s' is not f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k or q6_k", type);
    else if (arch && strcmp(arch, "llama") && strcmp(arch, "qwen2") && strcmp(arch, "qwen3") && strcmp(arch, "gemma3") &&
             strcmp(arch, "deepseek2"))
        args_error(&a, "--arch: '%s' is not llama, qwen2, qwen3, gemma3 or deepseek2", arch);
    else if (vocab && o.vocab_from) args_error(&a, "--vocab and --vocab-from exclude each other");
    else if (!like) {
        const char *missing = !dim ? "--dim" : !layers ? "--layers" : !heads ? "--heads" : !kv_heads ? "--kv-heads"
                            : !ffn ? "--ffn" : !vocab && !o.vocab_from ? "--vocab (or --vocab-from)" : NULL;
        if (missing) args_error(&a, "%s is required without --like", missing);
    }
    if (a.failed) return AK_EXIT_USAGE;
    if (arch) { o.arch = arch; if (like) o.name = NULL; }
    if (dim) o.dim = (int)dim;
    if (layers) o.n_layers = (int)layers;
    if (heads) o.n_heads = (int)heads;
    if (kv_heads) o.n_kv_heads = (int)kv_heads;
    if (head_dim) o.head_dim = (int)head_dim;
    if (ffn) o.ffn = (int)ffn;
    if (vocab) o.vocab = (int)vocab;
    if (ctx) o.ctx = (int)ctx;
    if (rope) o.rope_base = (float)rope;
    if (tied >= 0) o.tied = tied;
    if (kv_lora >= 0) o.kv_lora = (int)kv_lora;
    if (experts >= 0) {   /* a MoE layout of our own: the first layer dense, as V2-Lite */
        o.n_experts = (int)experts;
        o.n_dense_lead = 1;
        o.n_experts_used = experts_used >= 0 ? (int)experts_used : (experts < 2 ? (int)experts : 2);
        o.n_experts_shared = experts_shared >= 0 ? (int)experts_shared : 0;
        o.expert_ffn = expert_ffn >= 0 ? (int)expert_ffn : o.ffn;
    } else {
        if (experts_used >= 0) o.n_experts_used = (int)experts_used;
        if (experts_shared >= 0) o.n_experts_shared = (int)experts_shared;
        if (expert_ffn >= 0) o.expert_ffn = (int)expert_ffn;
    }
    if (yarn > 0) { o.yarn_factor = (float)yarn; o.yarn_orig_ctx = (int)yarn_orig; o.yarn_log_mul = (float)yarn_log_mul; }
    else if (yarn_orig || yarn_log_mul) args_error(&a, "--yarn-orig-ctx and --yarn-log-mul need --yarn");
    if (a.failed) return AK_EXIT_USAGE;
    o.seed = (uint64_t)seed;
    o.n_threads = (int)threads;

    progress pg;
    progress_init(&pg, "synth");
    pg.enabled = args_stderr_is_tty();
    o.progress = progress_update;
    o.progress_ctx = &pg;
    ak_error err = {{0}};
    double t0 = ak_now();
    int rc = ak_synth_write(&o, &err);
    progress_done(&pg);
    if (rc < 0) {
        fprintf(stderr, "agentkv synth: %s\n", err.msg);
        return 1;
    }
    double dt = ak_now() - t0;

    /* read the result back: checks it and counts what it holds */
    gguf_file g;
    if (gguf_open(&g, o.path, &err) < 0) {
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
           o.path, o.name ? o.name : o.arch, hp, o.n_layers, o.dim,
           (unsigned long long)g.tensors[0].ne[1], gguf_tensor_type_name(o.wtype), hb, g.size,
           (unsigned long long)o.seed, dt);
    gguf_close(&g);
    return 0;
}
