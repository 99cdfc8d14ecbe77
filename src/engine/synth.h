/* synth.h - synthetic models: valid GGUF files with random weights in the
 * shape of real models, to measure speed and memory at realistic sizes
 * without downloading anything.
 *
 * Weights are drawn from N(0, 1/sqrt(fan_in)) (token embeddings N(0, 1), norms
 * 1 + N(0, 0.02), biases N(0, 0.02)) in f32, row by row, from a generator
 * seeded by (seed, tensor name, row). Each row is then converted to the weight
 * type with ak_quantize_row, so one seed gives the same underlying f32 weights
 * in every type: an F16 or Q4_0 model can be compared against the F32 model
 * of the same seed. Output is deterministic for a given build.
 *
 * Tensor and metadata names are llama.cpp's. 2-D matrices (token_embd
 * included) are in the weight type; norms and biases stay F32. The vocabulary
 * is a synthetic SentencePiece `llama` one (<unk>, <s>, </s>, 256 byte tokens,
 * then ▁-prefixed ASCII pieces with descending scores), the tokenizer.*
 * metadata of another GGUF copied verbatim (vocab_from), or a Hugging Face
 * tokenizer.json converted as llama.cpp's converter does (tokenizer_json,
 * text/hfvocab.h: a real model's vocabulary in a file of any shape).
 */
#ifndef AK_SYNTH_H
#define AK_SYNTH_H

#include <stdint.h>

#include "base/util.h"

/* Called after each chunk of tensor data with the fraction written, 0..1. */
typedef void (*ak_synth_progress_fn)(void *ctx, double frac);

typedef struct {
    const char *path;         /* output file (written as PATH.tmp, then renamed) */
    const char *arch;         /* "llama", "qwen2" (q/k/v biases), "qwen3" (q/k norms), "gemma3"
                               * (q/k norms, post-norms, sliding-window layers) or "deepseek2"
                               * (MLA, MoE: the fields below) */
    const char *name;         /* general.name; NULL: "synthetic <arch>" */
    int dim;                  /* embedding width */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int ffn;                  /* SwiGLU hidden width */
    int vocab;                /* ignored when vocab_from or tokenizer_json is set */
    int ctx;                  /* {arch}.context_length */
    float rope_base;
    float rms_eps;
    int tied;                 /* 1: no output.weight, token_embd is reused */
    uint32_t wtype;           /* F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K */
    uint64_t seed;
    const char *vocab_from;   /* GGUF whose tokenizer.* metadata is copied, or NULL */
    const char *tokenizer_json; /* or a Hugging Face tokenizer.json to convert (hfvocab.h), or NULL */
    int n_threads;            /* generation threads; <= 0: all cores */
    int head_dim;             /* 0: dim / n_heads; else written as attention.key_length */
    int window;               /* gemma3: sliding window of the local layers (0: 512) */
    float rope_base_swa;      /* gemma3: RoPE base of the local layers (0: 10000) */
    int swa_pattern;          /* gemma3: > 0 writes attention.sliding_window_pattern = N (every
                               * N-th layer global); 0 writes none (readers assume 6) */
    const uint8_t *swa_layers; /* gemma3: or n_layers flags (1: local), written as a bool array */
    /* deepseek2: head_dim is the query/key head (nope + rope), n_kv_heads is
     * ignored (one latent), ffn is the dense layers' width */
    int kv_lora;              /* latent width */
    int rope_dim;             /* rotated part of a head (0: head_dim / 3) */
    int v_head;               /* value head (0: head_dim - rope_dim) */
    int n_experts;            /* 0: every layer dense */
    int n_experts_used;
    int n_experts_shared;
    int expert_ffn;
    int n_dense_lead;         /* leading dense layers */
    /* YaRN RoPE scaling, as DeepSeek-V2(-Lite)'s files carry it: > 0 writes
     * rope.scaling.type "yarn", rope.scaling.factor, original_context_length
     * and yarn_log_multiplier (V2-Lite: 40, 4096, 0.0707) */
    float yarn_factor;        /* 0: no rope.scaling keys */
    int yarn_orig_ctx;        /* 0: the context length */
    float yarn_log_mul;       /* 0.1 x mscale_all_dim, as the converter writes it */
    ak_synth_progress_fn progress;  /* may be NULL */
    void *progress_ctx;
} ak_synth_opts;

/* Fills o with defaults: arch llama, rope base 10000, rms eps 1e-5, ctx 2048,
 * F16, seed 1, untied, no shape (dims 0), no vocab_from, all threads. */
void ak_synth_defaults(ak_synth_opts *o);

/* Sets arch, shape, vocab, ctx, rope base, tiedness and name of a preset
 * ("llama-1b", "llama-3b", "llama-8b", "qwen2-0.5b", "tinyllama-1.1b",
 * "stories15m", "qwen3-0.6b", "qwen3-1.7b", "gemma3-1b", "deepseek2-lite"
 * (DeepSeek-V2-Lite's shape), "deepseek2-lite-8l" (the same with 8 layers)); leaves path, type, seed, vocab_from, tokenizer_json and callbacks alone.
 * Returns 0, or -1 if the name is unknown. */
int ak_synth_preset(ak_synth_opts *o, const char *name);

/* Name of preset i (0-based), NULL past the last: for usage messages. */
const char *ak_synth_preset_name(int i);

/* Writes the model described by o. Returns 0, or -1 with err set to
 * "PATH: problem" (bad shape, unreadable vocab_from, a tokenizer_json of an
 * unsupported kind, both of those set, disk full, ...); on
 * failure nothing is left under o->path (an existing file stays as it was).
 * The data is streamed: memory use is a few chunks of rows, whatever the
 * model size. */
int ak_synth_write(const ak_synth_opts *o, ak_error *err);

#endif
