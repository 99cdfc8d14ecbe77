/* hfvocab.h - a Hugging Face tokenizer.json turned into llama.cpp's
 * tokenizer.ggml.* metadata, as its converter (convert_hf_to_gguf.py,
 * gguf-py's SpecialVocab) writes it, so that a GGUF can carry a real
 * model's vocabulary (`agentkv synth --tokenizer-json`).
 *
 * Supported: byte-level BPE (model.type "BPE", a ByteLevel decoder, no byte
 * fallback) whose pre-tokenizer is one llama.cpp names, found by its Split
 * regex: Llama 3's ("llama-bpe", with model.ignore_merges) or Qwen 2's
 * ("qwen2", single digits, without ignore_merges). Others are refused.
 *
 * What is written:
 *   tokens      model.vocab's strings as they are (byte-level alphabet), then
 *               added_tokens' contents at their ids (an added token wins an id
 *               both name); ids no entry names become "[PAD<id>]", UNUSED.
 *   token_type  NORMAL for model.vocab; an added token is CONTROL when it is
 *               special or looks special as the converter judges it (its text
 *               "<|...|>" or "<｜...｜>"), USER_DEFINED otherwise (Qwen's
 *               "<tool_call>", "<think>").
 *   merges      model.merges: "a b" strings as they are; ["a", "b"] pairs
 *               joined by a space, a space inside a part written as U+0120.
 *   bos, eos, padding ids: the added token whose content tokenizer_config.json
 *               (beside tokenizer.json, when there is one) names as bos_token,
 *               eos_token, pad_token; else BOS and EOS are the special tokens
 *               that open and close a TemplateProcessing post-processor's
 *               template, else the family's own (Llama 3 "<|begin_of_text|>" /
 *               "<|eot_id|>", Qwen 2 "<|endoftext|>" / "<|im_end|>"), each
 *               only when the added tokens have it.
 *   add_bos_token, add_eos_token: the config's booleans, else a
 *               TemplateProcessing post-processor that opens (closes) with a
 *               special token; left out when neither says (the tokenizer's
 *               default for the pre-tokenizer then holds).
 *   chat_template: the config's, when it is a string.
 */
#ifndef AK_HFVOCAB_H
#define AK_HFVOCAB_H

#include <stdint.h>

#include "base/gguf.h"
#include "base/util.h"

typedef struct ak_hfvocab ak_hfvocab;

/* Reads path (a tokenizer.json) and the tokenizer_config.json in its
 * directory when that exists. Returns NULL with err set ("PATH: problem")
 * when a file cannot be read or parsed, or the tokenizer is not one of the
 * supported kinds (the message says which part is not). */
ak_hfvocab *ak_hfvocab_load(const char *path, ak_error *err);

/* NULL is fine. */
void ak_hfvocab_free(ak_hfvocab *v);

/* Number of tokens written (highest id named + 1). */
int32_t ak_hfvocab_size(const ak_hfvocab *v);

/* The tokenizer.ggml.pre written ("llama-bpe" or "qwen2"). */
const char *ak_hfvocab_pre(const ak_hfvocab *v);

/* Writes the tokenizer.* pairs described above; failures stay in the
 * writer (reported at gguf_writer_close). */
void ak_hfvocab_write(const ak_hfvocab *v, gguf_writer *w);

#endif
