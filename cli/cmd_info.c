/* cmd_info.c - agentkv info: what a model file holds, and the SIMD level
 * the kernels run at (src/base/cpu.h). */
#include <stdio.h>
#include <string.h>

#include "base/cpu.h"
#include "kernels/kernels.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv info -m MODEL [--metadata]\n"
    "       agentkv info --cpu | --simd-levels\n"
    "  architecture, hyperparameters, cache spec, tokenizer and the tensor table\n"
    "  --metadata     also list every metadata key\n"
    "  --cpu          only the SIMD level chosen and what the CPU offers\n"
    "  --simd-levels  the level running, then each lower one this binary can run\n"
    "                 here, one per line (AGENTKV_SIMD=LEVEL forces one)\n";

/* The SIMD lines: the level running (and the level of the code actually
 * reached, which a working dispatch makes the same), how it was chosen,
 * the levels this CPU supports and its features. */
static void print_cpu(void) {
    int level = ak_cpu_level();
    char feats[512], levels[96] = "";
    printf("level          %s (code running: %s, kernels %s)\n", ak_cpu_level_name(level),
           ak_cpu_level_name(ak_cpu_compiled_level()), ak_simd_name());
    if (ak_cpu_dispatched())
        printf("dispatch       at run time from cpuid; AGENTKV_SIMD=scalar|avx2|avx2vnni|avx512|avx512vnni forces a lower "
               "level\n");
    else if (ak_cpu_neon_level() >= 0)
        printf("dispatch       NEON extensions per product from getauxval; AGENTKV_NEON=plain|dotprod|i8mm lowers them\n");
    else
        printf("dispatch       none: built for one target (make ARCH=dispatch for all levels)\n");
    if (ak_cpu_neon_level() >= 0) printf("neon level     %s\n", ak_cpu_neon_level_name(ak_cpu_neon_level()));
    if (ak_cpu_note()[0]) printf("note           %s\n", ak_cpu_note());
    for (int l = AK_CPU_NLEVELS - 1; l >= 0; l--) {
        if (!ak_cpu_supports(l)) continue;
        size_t o = strlen(levels);
        snprintf(levels + o, sizeof levels - o, "%s%s%s", o ? " " : "", ak_cpu_level_name(l),
                 ak_cpu_built(l) ? "" : " (not built)");
    }
    printf("cpu levels     %s\n", levels);
    printf("cpu features   %s\n", ak_cpu_features(feats, sizeof feats));
}

/* One line per level: the running one, then every lower one that is both
 * built in and supported here (what `make test` runs the SIMD tests at). */
static void print_levels(void) {
    int level = ak_cpu_level();
    printf("%s\n", ak_cpu_level_name(level));
    if (level == AK_CPU_NEON) level = AK_CPU_AVX2;   /* below neon: scalar only */
    for (int l = level - 1; l >= 0; l--)
        if (ak_cpu_built(l) && ak_cpu_supports(l)) printf("%s\n", ak_cpu_level_name(l));
}

static void print_kv(const gguf_kv *kv) {
    printf("  %-48.*s ", (int)kv->key.len, kv->key.data);
    switch (kv->type) {
    case GGUF_TYPE_STRING:
        printf("%.*s%s\n", (int)(kv->v.str.len > 80 ? 80 : kv->v.str.len), kv->v.str.data,
               kv->v.str.len > 80 ? "..." : "");
        break;
    case GGUF_TYPE_ARRAY:
        printf("[%s x %llu]\n", gguf_type_name(kv->v.arr.type), (unsigned long long)kv->v.arr.count);
        break;
    case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64: printf("%g\n", kv->v.f64); break;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        printf("%lld\n", (long long)kv->v.i64);
        break;
    default: printf("%llu\n", (unsigned long long)kv->v.u64);
    }
}

int cmd_info(int argc, char **argv) {
    ak_args a;
    args_init(&a, "info", argc, argv);
    const char *model_path = NULL;
    int meta = 0, cpu = 0, levels = 0;
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) model_path = args_value(&a, f);
        else if (!strcmp(f, "--metadata")) meta = 1;
        else if (!strcmp(f, "--cpu")) cpu = 1;
        else if (!strcmp(f, "--simd-levels")) levels = 1;
        else args_unknown(&a, f);
    }
    if (!a.failed && !model_path && !cpu && !levels) args_error(&a, "-m MODEL is required");
    if (a.failed) return AK_EXIT_USAGE;
    if (levels) { print_levels(); return 0; }
    if (!model_path) { print_cpu(); return 0; }
    loaded_model lm;
    if (load_model(&lm, "info", model_path) < 0) return 1;
    const ak_model *m = lm.model;
    const ak_config *c = &m->cfg;
    const gguf_file *g = &m->gguf;
    printf("file           %s (GGUF v%u, %zu bytes)\n", g->path, g->version, g->size);
    printf("name           %s\n", c->name[0] ? c->name : "(none)");
    printf("architecture   %s\n", c->arch_name);
    printf("dim            %d\nlayers         %d\nheads          %d\nkv heads       %d\nhead dim       %d\n",
           c->dim, c->n_layer, c->n_head, c->n_head_kv, c->head_dim);
    printf("ffn            %d\nvocab          %d\ncontext        %d\n", c->ffn, c->vocab, c->n_ctx_train);
    printf("rope           %s pairs, base %g, %d dims%s", c->rope_style == AK_ROPE_NEOX ? "neox" : "interleaved",
           c->rope_base, c->rope_dim, gguf_find_tensor(g, "rope_freqs.weight") ? ", llama3 frequency factors" : "");
    if (c->yarn_factor > 0)
        printf(", YaRN x%g from %d positions (q/k x %g; attention scale includes its factor)", c->yarn_factor,
               c->yarn_orig_ctx, c->rope_mag);
    printf("\n");
    printf("rms eps        %g\noutput         %s\nqkv bias       %s\n", c->rms_eps,
           c->tied_output ? "tied to token embeddings" : "output.weight", c->qkv_bias ? "yes" : "no");
    printf("attention      scale %g, q/k norm %s", c->attn_scale, c->qk_norm ? "yes" : "no");
    if (c->window > 0)   /* which layers are local, and their RoPE base */
        printf(", window %d on the local layers (all but every %d-th), whose RoPE base is %g", c->window,
               c->swa_pattern, c->rope_base_swa);
    printf("\nffn act        %s%s, embeddings x %g\n", c->act == AK_ACT_GELU ? "geglu (tanh)" : "swiglu",
           c->post_norms ? ", post-norms around attention and FFN" : "", c->embd_scale);
    printf("weights        %.2f MiB\n", m->weight_bytes / 1048576.0);
    printf("fingerprint    %s\n", m->fingerprint);
    const ak_cache_spec *s = &m->spec;
    printf("cache spec     %d layers x %d kv heads, K dim %d, V dim %d, ctx %d (f16: %zu bytes/token)\n",
           s->n_layer, s->n_head_kv, s->head_dim_k, s->head_dim_v, s->n_ctx,
           (size_t)s->n_layer * s->n_head_kv * (s->head_dim_k + s->head_dim_v) * 2);
    printf("tokenizer      %s (pre: %s), %d tokens, bos %d, eos %d, add bos %s\n", ak_tokenizer_model_name(lm.tok),
           ak_tokenizer_pre_name(lm.tok), ak_tokenizer_vocab_size(lm.tok), ak_tokenizer_bos(lm.tok),
           ak_tokenizer_eos(lm.tok), ak_tokenizer_add_bos(lm.tok) ? "yes" : "no");
    printf("kernels        %s\n", ak_simd_name());
    print_cpu();
    if (meta) {
        printf("\nmetadata (%llu keys):\n", (unsigned long long)g->n_kv);
        for (uint64_t i = 0; i < g->n_kv; i++) print_kv(&g->kv[i]);
    }
    printf("\ntensors (%llu):\n", (unsigned long long)g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        char shape[96];
        int o = snprintf(shape, sizeof shape, "[%llu", (unsigned long long)t->ne[0]);
        for (uint32_t d = 1; d < t->n_dims; d++)
            o += snprintf(shape + o, sizeof shape - o, ", %llu", (unsigned long long)t->ne[d]);
        snprintf(shape + o, sizeof shape - o, "]");
        printf("  %-32.*s %-5s %-20s %12llu bytes\n", (int)t->name.len, t->name.data, gguf_tensor_type_name(t->type),
               shape, (unsigned long long)t->nbytes);
    }
    unload_model(&lm);
    return 0;
}
