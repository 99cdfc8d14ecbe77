/* chat.h - chat templates: turning a list of chat messages into the prompt
 * text a model was fine-tuned on.
 *
 * There is no Jinja interpreter here. A model's `tokenizer.chat_template` is
 * only inspected for distinctive markers to pick a family (ak_chat_detect),
 * and the family is rendered natively (ak_chat_render), reproducing byte for
 * byte what Hugging Face's renderer produces from that family's real template
 * (add_generation_prompt, trim_blocks, lstrip_blocks; tools, tool calls and
 * tool results as below). Where a family has variants the template text,
 * when given, selects the variant.
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
 *   deepseek3 DeepSeek V3.1 and R1 (template mentions "<｜User｜>"): bos, the
 *            system prompt, then "<｜User｜>" + content per user message and
 *            "<｜Assistant｜>" + content + "<｜end▁of▁sentence｜>" per reply,
 *            the reply's text before its "</think>" dropped, as the two
 *            templates do (tools below). V3.1 (template mentions
 *            "is_last_user"; also without template text): every system
 *            message, joined by a blank line; a reply that follows a user
 *            message opens "<｜Assistant｜><think></think>"; the generation
 *            prompt, only after a user message, is "<｜Assistant｜><think>"
 *            with thinking on (AK_CHAT_THINK_ON), else
 *            "<｜Assistant｜><think></think>". R1: the last system message;
 *            the generation prompt "<｜Assistant｜><think>\n", then "</think>"
 *            unless thinking is on when the template reads enable_thinking,
 *            none after tool results.
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
 * Roles are "system", "user", "assistant" and "tool"; any other role is an
 * error. The families do not enforce user/assistant alternation.
 *
 * Tools (ak_chat_opts.tools), calls (an assistant message's calls) and
 * results (role "tool") are rendered the way each family's published
 * template renders them, JSON printed as Hugging Face's tojson prints it
 * (pyjson.h) and a call's arguments given to the template as the parsed
 * object (text that is not JSON stays a string); the tool a template prints
 * whole is {"type": "function", "function": {"name", "description",
 * "parameters", "strict"}} with the fields given, in that order:
 *   chatml   Qwen2.5: a system turn of the system message's text (or the
 *            template's default, or nothing) + "\n\n" + "# Tools ..." with
 *            each tool's JSON in <tools></tools>; a call
 *            "\n<tool_call>\n{\"name\": N, \"arguments\": A}\n</tool_call>"
 *            after "<|im_start|>assistant" and the reply's text (if any,
 *            after "\n"); consecutive results one user turn of
 *            "\n<tool_response>\nR\n</tool_response>" blocks.
 *            Hermes 3's tool_use template (it mentions "You are a function
 *            calling AI model"): bos, its function-calling system turn
 *            (always; each tool with a description of Python-typed
 *            parameters, as its macro writes them), every message a turn,
 *            calls without the text beside them, results in "tool" turns.
 *   qwen3    as chatml, the system text without a default; the first call
 *            follows the text with "\n" (none when there is no text), the
 *            others too; an assistant turn keeps its reasoning while it is
 *            after the last real user message (tool results are not one).
 *   llama3   3.1/3.2: "Environment: ipython\n" opens the system turn; the
 *            tools (JSON indented by 4) go into the first user message with
 *            the template's instructions (there must be one); a call is an
 *            assistant turn {"name": N, "parameters": A} (the text beside it
 *            dropped; several calls: one turn each, as the template renders
 *            them sent one by one); a result is an "ipython" turn of the
 *            result as a JSON string.
 *   mistral  Nemo: "[AVAILABLE_TOOLS][...][/AVAILABLE_TOOLS]" before the last
 *            user message (and before any earlier one with the same text);
 *            calls "[TOOL_CALLS][{\"name\": N, \"arguments\": A, \"id\": I}, ...]"
 *            + eos (the text beside them dropped); a result
 *            "[TOOL_RESULTS]{\"content\": R, \"call_id\": I}[/TOOL_RESULTS]".
 *            Small 3.2 (template mentions "[SYSTEM_PROMPT]"): the system
 *            prompt (the first system message, or the template's default
 *            with ak_chat_opts.today) in [SYSTEM_PROMPT]; the tools as one
 *            JSON list; a call "[TOOL_CALLS]N[CALL_ID]I[ARGS]A"; a result
 *            "[TOOL_RESULTS]I[TOOL_CONTENT]R[/TOOL_RESULTS]"; no generation
 *            prompt (the user's [/INST] ends the prompt).
 *            Ids are nine characters (the template refuses others): an id of
 *            another length is replaced by nine letters and digits derived
 *            from it (the same for the same id: a call and its result still
 *            match).
 *   deepseek3 the tools follow the system prompt ("\n\n## Tools\n..." as
 *            DeepSeek's model card writes them; the templates print none);
 *            V3.1 calls "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>A
 *            <｜tool▁call▁end｜>...<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
 *            after the text, results "<｜tool▁output▁begin｜>R<｜tool▁output▁end｜>";
 *            R1 "<｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\nA\n```
 *            <｜tool▁call▁end｜>" and "<｜tool▁outputs▁begin｜>" around its results
 *            (the template's first-call and first-result state is kept for
 *            the whole conversation, as it does).
 *   others   (llama2, gemma, gemma3, phi3, deepseek2, plain: no tool markup
 *            of their own; Phi-3.5's template drops tool messages) the
 *            documented format: the tools block of qwen3 follows the system
 *            text (a system message of its own when there is none), calls
 *            follow the reply's text as qwen3 writes them, and consecutive
 *            results are one user message of "<tool_response>\nR\n
 *            </tool_response>" blocks, one per line; then the family renders
 *            those messages.
 * Tool choice and parallel calls do not change the prompt (toolcall.h).
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
    AK_CHAT_PLAIN,
    AK_CHAT_DEEPSEEK3
} ak_chat_family;

#define AK_CHAT_N_FAMILIES (AK_CHAT_DEEPSEEK3 + 1)

/* The "Today Date" the Llama 3.1/3.2 templates print when the renderer has no
 * clock helper (their own default, and what the golden renders use). */
#define AK_CHAT_LLAMA3_DATE "26 Jul 2024"
/* The same day as Mistral Small 3.2's template prints it, when
 * ak_chat_opts.today is NULL. */
#define AK_CHAT_TODAY "2024-07-26"

/* A tool call an assistant message made (OpenAI's tool_calls[i]). */
typedef struct {
    const char *id;         /* the call's id (NULL: ""), as the result's tool_call_id names it */
    const char *name;       /* the function's name */
    const char *arguments;  /* JSON text of an object, as OpenAI sends it (NULL: "{}") */
} ak_chat_call;

typedef struct {
    const char *role;          /* "system", "user", "assistant" or "tool" */
    const char *content;       /* NUL-terminated UTF-8; NULL (OpenAI's null) only beside calls */
    const char *reasoning;     /* assistant: its reasoning (reasoning_content), or NULL: what the
                                * content holds in <think></think>, for the families that read it */
    const ak_chat_call *calls; /* assistant: the calls it made, n_calls of them */
    int n_calls;
    const char *tool_call_id;  /* tool: the call this is the result of */
} ak_chat_msg;

/* A function the model may call (OpenAI's tools[i] of type "function"). */
typedef struct {
    const char *name;
    const char *description;  /* NULL: none */
    const char *parameters;   /* its arguments' JSON Schema as JSON text; NULL: none */
    int strict;               /* 0: not given, 1: "strict": true, -1: "strict": false */
} ak_chat_tool;

/* Thinking, for the families whose templates switch it (qwen3, deepseek3):
 * what enable_thinking (or reasoning_effort "none": off) asks for. */
typedef enum {
    AK_CHAT_THINK_DEFAULT,   /* the template's own default (enable_thinking undefined) */
    AK_CHAT_THINK_ON,
    AK_CHAT_THINK_OFF
} ak_chat_think;

/* Picks the family of a chat template by its markers, in this order:
 * "<|start_header_id|>" -> llama3; "<|im_start|>" -> qwen3 if the template
 * also has "reasoning_content" and "</think>", else chatml;
 * "<start_of_turn>" -> gemma3 if the template also has "first_user_prefix",
 * else gemma; "<|user|>" and "<|end|>" -> phi3; "[INST]" with
 * "<<SYS>>" -> llama2; "[INST]" without -> mistral; "<｜User｜>" ->
 * deepseek3; DeepSeek V2's "'Assistant: ' + message['content'] + eos_token"
 * -> deepseek2; anything else, an empty string or NULL -> plain. Never fails. */
ak_chat_family ak_chat_detect(const char *template_text);

/* Same as ak_chat_detect on the model's `tokenizer.chat_template` metadata;
 * plain when the key is absent or not a string. f must be open. */
ak_chat_family ak_chat_detect_gguf(const gguf_file *f);

/* Returns a malloc'd NUL-terminated copy of the model's
 * `tokenizer.chat_template` (for ak_chat_opts.template_text), or NULL
 * when it is absent (err is then left untouched) or allocation fails (err set). */
char *ak_chat_template_gguf(const gguf_file *f, ak_error *err);

/* The family's lower-case name: "llama3", "chatml", "llama2", "mistral",
 * "gemma", "phi3", "qwen3", "gemma3", "deepseek2", "plain", "deepseek3"
 * ("unknown" for an out-of-range value). Static. */
const char *ak_chat_family_name(ak_chat_family f);

/* Parses a family name as printed by ak_chat_family_name (ASCII
 * case-insensitive) into *out, for CLI/server overrides. Returns 0, or -1
 * with err set (listing the valid names) when name is NULL or unknown. */
int ak_chat_family_parse(const char *name, ak_chat_family *out, ak_error *err);

/* The text that ends a model turn in this family, for servers to stop on:
 * llama3 "<|eot_id|>", chatml and qwen3 "<|im_end|>", llama2/mistral "</s>", gemma
 * and gemma3 "<end_of_turn>", phi3 "<|end|>", deepseek2 and deepseek3
 * "<｜end▁of▁sentence｜>", plain "\nUser:". Static string. */
const char *ak_chat_end_of_turn(ak_chat_family f);

/* How a conversation is rendered. Fields left zero: no generation prompt,
 * no bos/eos, no template text. */
typedef struct {
    ak_chat_family family;      /* set it: zero is AK_CHAT_LLAMA3 */
    const char *template_text;  /* the model's template (may be NULL): selects variants and defaults as
                                 * described above; never executed */
    int add_generation_prompt;  /* 1: append the opening of the assistant's turn */
    const char *bos, *eos;      /* ak_chat_render only (NULL: ""); tokenizing takes them from the tokenizer */
    const ak_chat_tool *tools;  /* the tools the model may call, n_tools of them (none: no tools block) */
    int n_tools;
    ak_chat_think think;
    const char *today;          /* "YYYY-MM-DD", for Mistral Small 3.2's default system message; NULL: AK_CHAT_TODAY */
} ak_chat_opts;

/* Renders msgs[0..n) in family o->family (see the table above) into *out, a
 * malloc'd NUL-terminated string the caller frees. Returns 0, or -1 with err
 * set and *out = NULL when n < 1, msgs or o is NULL, a role is NULL or
 * unknown, a content is NULL (but beside calls), calls are not an assistant's
 * or have no name, a tool has no name, the family is out of range, (mistral, Nemo's form)
 * a system message is not first, or (llama3 with tools) no message follows
 * the system message to carry them. */
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

/* 1 when the generation prompt o renders leaves the model inside its
 * reasoning (it ends with a "<think>" that no "</think>" follows: deepseek3
 * with thinking on), so that the reply starts with reasoning and has no
 * "<think>" of its own (ak_toolcall_opts.in_reasoning); else 0, also when
 * rendering fails. */
int ak_chat_reasoning_open(const ak_chat_opts *o);

/* Where a message landed in a rendering, as byte offsets into its text: the
 * turn opens at `open` (the role's markup follows), and the content, as the
 * template put it (trimmed, or with the reasoning dropped), is [at, end);
 * for a reply with calls, its whole turn after the generation prompt
 * (chat_resend.h). -1 for messages without a turn of their own (a system
 * message folded into another turn, or dropped), and at and end -1 for a
 * reply with calls the history cannot stand for (mistral's, whose ids are
 * the server's; llama3's of several calls, several turns; R1's). */
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
