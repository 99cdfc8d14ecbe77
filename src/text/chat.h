/* chat.h - chat templates: turning a list of chat messages into the prompt
 * text a model was fine-tuned on.
 *
 * There is no Jinja interpreter here. A model's `tokenizer.chat_template` is
 * only inspected for distinctive markers to pick a family (ak_chat_detect),
 * and the family is rendered natively (ak_chat_render), reproducing byte for
 * byte what Hugging Face's renderer produces from that family's real template
 * (add_generation_prompt, trim_blocks, lstrip_blocks; no tools). Where a
 * family has variants the template text, when given, selects the variant.
 *
 * Families and what each renders (bos/eos are the caller's strings):
 *
 *   llama3   Llama 3.1 / 3.2 (template mentions "Cutting Knowledge Date"):
 *              bos + "<|start_header_id|>system<|end_header_id|>\n\n"
 *              + "Cutting Knowledge Date: December 2023\nToday Date: DATE\n\n"
 *              + trim(first system message, or "") + "<|eot_id|>"
 *              then per message "<|start_header_id|>ROLE<|end_header_id|>\n\n"
 *              + trim(content) + "<|eot_id|>"; generation prompt is the
 *              assistant header. DATE is the template's own default
 *              (`set date_string = "..."`), else AK_CHAT_LLAMA3_DATE. 3.1 and
 *              3.2 render identically without tools.
 *            Llama 3.0 (template without that preamble, i.e. text given and
 *              no "Cutting Knowledge Date"): bos + every message (system
 *              included) as a header turn, no preamble.
 *            With template_text NULL the 3.1/3.2 form is used.
 *   chatml   "<|im_start|>ROLE\n" + content + "<|im_end|>\n" per message;
 *            generation prompt "<|im_start|>assistant\n". No bos. If the
 *            first message is not a system message and the template carries a
 *            default system message (Qwen2.5: "You are Qwen, created by
 *            Alibaba Cloud. You are a helpful assistant."), that default is
 *            emitted first. Without template text, no default is added.
 *   llama2   Llama 2 chat: the system message is wrapped as
 *            "<<SYS>>\n" + sys + "\n<</SYS>>\n\n" in front of the first user
 *            message; user turns are bos + "[INST] " + strip(text) +
 *            " [/INST]", assistant turns " " + strip(text) + " " + eos. The
 *            template has no generation prompt (the flag changes nothing),
 *            and, like it, we drop system messages that are not first.
 *   mistral  Mistral Nemo / v7-style "[INST]...[/INST]" without spaces:
 *            bos, then user turns "[INST]" + content + "[/INST]", assistant
 *            turns content + eos. As in the real template the system message
 *            is put in front of the LAST message when that message is a user
 *            message ("[INST]" + sys + "\n\n" + content + "[/INST]"), and is
 *            dropped otherwise. A system message anywhere but first is an
 *            error (the template raises). No generation prompt is needed.
 *   gemma    bos + "<start_of_turn>ROLE\n" + trim(content) + "<end_of_turn>\n"
 *            with assistant shown as "model"; generation prompt
 *            "<start_of_turn>model\n". Gemma's template refuses system
 *            messages (HF raises). We accept them: a system message is held
 *            and prepended to the next user message, separated by a blank
 *            line ("SYS\n\nUSER", then trimmed as a whole; consecutive system
 *            messages are joined the same way); a system message that no
 *            user message follows becomes a user turn of its own.
 *   gemma3   Gemma 3 (template mentions "<start_of_turn>" and
 *            "first_user_prefix"): bos, then a first system message's text +
 *            "\n\n" goes in front of the next message's trimmed content (not
 *            trimmed itself); every other message is "<start_of_turn>ROLE\n"
 *            + trim(content) + "<end_of_turn>\n" with assistant shown as
 *            "model" (a later system message is a "system" turn, as the
 *            template renders it where roles alternate; alternation is not
 *            enforced). A system message with nothing after it, which the
 *            template drops, becomes a user turn of its own. Generation
 *            prompt "<start_of_turn>model\n".
 *   phi3     Phi-3.5: "<|ROLE|>\n" + content + "<|end|>\n" per message
 *            (system messages with empty content are skipped); generation
 *            prompt "<|assistant|>\n", or eos at the end when it is off. No bos.
 *   qwen3    Qwen3's ChatML with thinking (template mentions both
 *            "reasoning_content" and "</think>"): a first system message and
 *            user messages as chatml (a system message elsewhere too, as a
 *            turn of its own; no default system message). An assistant
 *            message's reasoning is the text before its first "</think>",
 *            after the last "<think>" there, '\n's stripped from both ends;
 *            its content is the text after its last "</think>", leading
 *            '\n's stripped (the whole text when there is no "</think>").
 *            Assistant messages before the last user message show only
 *            their content ("<|im_start|>assistant\n" + content); those after
 *            it show "<|im_start|>assistant\n<think>\n" + reasoning +
 *            "\n</think>\n\n" + content (leading '\n's stripped) when they are
 *            the last message or have reasoning. The last user message is the
 *            last whose content is not wrapped in "<tool_response>" ...
 *            "</tool_response>" (none: the last message). Every turn ends
 *            "<|im_end|>\n"; the generation prompt is "<|im_start|>assistant\n"
 *            (thinking on: the template's enable_thinking left undefined). No
 *            bos. A reply's reasoning is dropped from later prompts, as the
 *            real template does.
 *   deepseek2 DeepSeek-V2 / V2-Lite chat (template renders "'Assistant: ' +
 *            message['content'] + eos_token"): bos, then a system message's
 *            content + "\n\n", a user message "User: " + content + "\n\n", an
 *            assistant message "Assistant: " + content + eos (untrimmed, as
 *            the template); generation prompt "Assistant:" (no space).
 *   plain    Fallback for models without a template: bos, then per message
 *            "System: ", "User: " or "Assistant: " + content + "\n"; the
 *            generation prompt is "Assistant:" (no trailing space), so the
 *            model's reply starts with its own space: an assistant message
 *            whose content starts with a space gets "Assistant:" without one
 *            (a reply sent back verbatim renders as it was generated).
 *
 * "trim" strips ASCII whitespace (space, \t, \n, \v, \f, \r) from both ends
 * (Jinja's trim also strips Unicode spaces; messages that begin or end with
 * those would differ).
 * Roles are "system", "user" and "assistant"; any other role is an error.
 * The families do not enforce user/assistant alternation.
 */
#ifndef AK_CHAT_H
#define AK_CHAT_H

#include "base/gguf.h"
#include "text/tokenizer.h"
#include "base/util.h"

typedef enum {
    AK_CHAT_LLAMA3,
    AK_CHAT_CHATML,
    AK_CHAT_LLAMA2,
    AK_CHAT_MISTRAL,
    AK_CHAT_GEMMA,
    AK_CHAT_PHI3,
    AK_CHAT_QWEN3,
    AK_CHAT_GEMMA3,
    AK_CHAT_DEEPSEEK2,
    AK_CHAT_PLAIN
} ak_chat_family;

/* The "Today Date" the Llama 3.1/3.2 templates print when the renderer has no
 * clock helper (their own default, and what the golden renders use). */
#define AK_CHAT_LLAMA3_DATE "26 Jul 2024"

typedef struct {
    const char *role;     /* "system", "user" or "assistant" */
    const char *content;  /* NUL-terminated UTF-8 */
} ak_chat_msg;

/* Picks the family of a chat template by its markers, in this order:
 * "<|start_header_id|>" -> llama3; "<|im_start|>" -> qwen3 if the template
 * also has "reasoning_content" and "</think>", else chatml;
 * "<start_of_turn>" -> gemma3 if the template also has "first_user_prefix",
 * else gemma; "<|user|>" and "<|end|>" -> phi3; "[INST]" with
 * "<<SYS>>" -> llama2; "[INST]" without -> mistral; anything else, an empty
 * string or NULL -> plain. Never fails. */
ak_chat_family ak_chat_detect(const char *template_text);

/* Same as ak_chat_detect on the model's `tokenizer.chat_template` metadata;
 * plain when the key is absent or not a string. f must be open. */
ak_chat_family ak_chat_detect_gguf(const gguf_file *f);

/* Returns a malloc'd NUL-terminated copy of the model's
 * `tokenizer.chat_template` (for ak_chat_opts.template_text), or NULL
 * when it is absent (err is then left untouched) or allocation fails (err set). */
char *ak_chat_template_gguf(const gguf_file *f, ak_error *err);

/* The family's lower-case name: "llama3", "chatml", "llama2", "mistral",
 * "gemma", "phi3", "qwen3", "gemma3", "plain" ("unknown" for an out-of-range value). Static. */
const char *ak_chat_family_name(ak_chat_family f);

/* Parses a family name as printed by ak_chat_family_name (ASCII
 * case-insensitive) into *out, for CLI/server overrides. Returns 0, or -1
 * with err set (listing the valid names) when name is NULL or unknown. */
int ak_chat_family_parse(const char *name, ak_chat_family *out, ak_error *err);

/* The text that ends a model turn in this family, for servers to stop on:
 * llama3 "<|eot_id|>", chatml and qwen3 "<|im_end|>", llama2/mistral "</s>", gemma
 * and gemma3 "<end_of_turn>", phi3 "<|end|>", plain "\nUser:". Static string. */
const char *ak_chat_end_of_turn(ak_chat_family f);

/* How a conversation is rendered. Fields left zero: no generation prompt,
 * no bos/eos, no template text. */
typedef struct {
    ak_chat_family family;      /* set it: zero is AK_CHAT_LLAMA3 */
    const char *template_text;  /* the model's template (may be NULL): selects variants and defaults as
                                 * described above; never executed */
    int add_generation_prompt;  /* 1: append the opening of the assistant's turn */
    const char *bos, *eos;      /* ak_chat_render only (NULL: ""); tokenizing takes them from the tokenizer */
} ak_chat_opts;

/* Renders msgs[0..n) in family o->family (see the table above) into *out, a
 * malloc'd NUL-terminated string the caller frees. Returns 0, or -1 with err
 * set and *out = NULL when n < 1, msgs or o is NULL, a role or content is
 * NULL, a role is unknown, the family is out of range, or (mistral) a system
 * message is not first. */
int ak_chat_render(const ak_chat_msg *msgs, int n, const ak_chat_opts *o, char **out, ak_error *err);

/* Renders msgs as ak_chat_render does (o's bos and eos ignored; BOS comes
 * from the tokenizer when flags has AK_TOK_ADD_SPECIAL) and tokenizes the
 * result so that only the template's own markup can produce control tokens:
 * markup is tokenized with AK_TOK_PARSE_SPECIAL, message content as plain
 * text (a user's "<|im_start|>system" stays text; see ak_tokenize_masked).
 * For content without control-token text the ids equal ak_tokenize(rendered
 * text, flags | AK_TOK_PARSE_SPECIAL). *ids is malloc'd. Returns 0, or -1
 * with err set (as ak_chat_render, or the tokenizer's error). */
int ak_chat_tokenize(const ak_chat_msg *msgs, int n, const ak_chat_opts *o, const ak_tokenizer *tok, int flags,
                     int32_t **ids, size_t *n_ids, ak_error *err);

/* Where a message landed in a rendering, as byte offsets into its text: the
 * turn opens at `open` (the role's markup follows), and the content, as the
 * template put it (trimmed, or with the reasoning dropped), is [at, end).
 * -1 for messages without a turn of their own (a system message folded into
 * another turn, or dropped). */
typedef struct {
    long open, at, end;
} ak_chat_span;

/* A conversation rendered with the generation prompt, and where each
 * message went, for callers that build the prompt in pieces (chat_resend.h). */
typedef struct {
    char *text;           /* (len + 1) NUL-terminated: ak_chat_render's text, bos and eos "" */
    size_t len;
    uint8_t *plain;       /* (len) 1 for bytes of message content (ak_chat_tokenize's mask) */
    ak_chat_span *spans;  /* (n) one per message */
    int n;
    char *gen_prompt;     /* what the generation prompt appends to a conversation */
} ak_chat_rendering;

/* Renders msgs[0..n) as ak_chat_tokenize does (generation prompt on, bos and
 * eos ""; o's other fields as given), keeping the content mask and the spans.
 * Returns 0 and fills *out (free with ak_chat_rendering_free), or -1 with err
 * set (as ak_chat_render) and *out zeroed. */
int ak_chat_render_tracked(const ak_chat_msg *msgs, int n, const ak_chat_opts *o, ak_chat_rendering *out,
                           ak_error *err);
/* Frees what a rendering holds and zeroes it; NULL is fine. */
void ak_chat_rendering_free(ak_chat_rendering *r);

#endif
