/* cmd_info.c - agentkv info: what a model file holds. */
#include <stdio.h>
#include <string.h>

#include "../src/kernels.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv info -m MODEL [--metadata]\n"
    "  architecture, hyperparameters, cache spec, tokenizer and the tensor table\n"
    "  --metadata   also list every metadata key\n";

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
    int meta = 0;
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) model_path = args_value(&a, f);
        else if (!strcmp(f, "--metadata")) meta = 1;
        else args_unknown(&a, f);
    }
    if (!a.failed && !model_path) args_error(&a, "-m MODEL is required");
    if (a.failed) return AK_EXIT_USAGE;
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
