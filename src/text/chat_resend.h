/* chat_resend.h - a conversation a client resends, rendered over the
 * agent's own tokens.
 *
 * Agent frameworks resend the whole conversation each turn, every assistant
 * reply as the server returned it. Rendered again, a reply need not give the
 * tokens the model generated: templates trim content (Llama 3, Gemma), the
 * model chose the space or newline that follows the generation prompt, a
 * text split in two by a stop string tokenizes otherwise. The prompt would
 * then leave the agent's cache at its first reply and recompute everything
 * after it.
 *
 * The rule. The conversation is rendered as usual (ak_chat_render_tracked)
 * and walked message by message. At each assistant message i:
 *   1. the rendered text from where the walk stands up to where message i's
 *      turn opens, followed by the family's generation prompt, is tokenized
 *      (as a continuation of what precedes it: no BOS, no SentencePiece
 *      dummy space, except at the very start);
 *   2. if the tokens placed so far and those are a prefix of the history, and
 *      the history's next tokens decode (ak_detok, as the generator decoded
 *      them) to exactly the message's content, those history tokens stand
 *      for the content: both are placed and the walk goes on after the
 *      content in the rendering. A history token that the content's end cuts
 *      in two (a stop string began inside it) is left out and the content's
 *      rest tokenized as text;
 *   3. otherwise the message stays as the template renders it.
 * Then the rest of the rendering is tokenized (a continuation again).
 *
 * The template wins where it rewrites a message or earlier turns: a message
 * is replaced only when its rendered content is its content, or that with
 * ASCII whitespace trimmed from both ends (a qwen3 reply whose reasoning the
 * template drops keeps the template's form), and only when the history holds
 * the prompt up to it (mistral moves the system message in front of the last
 * user message: the earlier prompt is not a prefix, nothing is replaced).
 * A reply with tool calls (chatml, Hermes, qwen3, llama3 with one call,
 * deepseek3 V3.1 after a user message) is replaced when the history decodes
 * to its whole turn as rendered after the generation prompt: its reasoning,
 * text and calls, markup and all (the model wrote the calls' JSON as the
 * template prints it); the rest of a turn the history stops inside is
 * tokenized as rendered, markup as markup.
 *
 * Nothing the client says is trusted beyond that equality: history tokens
 * replace a message only when they decode to its very text, so the prompt
 * always means the conversation as sent; they are the agent's own history,
 * never another agent's.
 */
#ifndef AK_CHAT_RESEND_H
#define AK_CHAT_RESEND_H

#include <stdint.h>

#include "text/chat.h"
#include "text/tokenizer.h"

/* What ak_chat_tokenize_resent built. */
typedef struct {
    int32_t *ids;     /* the prompt (malloc'd) when n_replaced >= 1, else NULL */
    size_t n_ids;
    int n_replaced;   /* the assistant messages the history stood for */
} ak_chat_resent;

/* Tokenizes msgs[0..n) as o says (o's generation prompt, bos and eos are
 * ignored: the prompt ends with the generation prompt, the tokenizer's
 * BOS/EOS as AK_TOK_ADD_SPECIAL adds them) over the history hist[0..n_hist)
 * by the rule above. On success returns 0 with out->n_replaced the number of
 * assistant messages the history stood for; when that is at least 1,
 * out->ids and out->n_ids hold the prompt, else out->ids is NULL and the
 * caller's ak_chat_tokenize prompt stands. Returns -1 with err set when
 * rendering or tokenizing fails (*out zeroed). */
int ak_chat_tokenize_resent(const ak_chat_msg *msgs, int n, const ak_chat_opts *o, const ak_tokenizer *tok,
                            const int32_t *hist, int n_hist, ak_chat_resent *out, ak_error *err);

/* A request's conversation kept until the engine knows the agent's history:
 * the messages and options copied, the template text and tokenizer borrowed
 * (they must outlive it: the server's). */
typedef struct ak_chat_resend ak_chat_resend;

/* Copies msgs[0..n) and *o. Returns NULL with err set (out of memory). */
ak_chat_resend *ak_chat_resend_new(const ak_chat_msg *msgs, int n, const ak_chat_opts *o, const ak_tokenizer *tok,
                                   ak_error *err);
/* NULL is fine. */
void ak_chat_resend_free(ak_chat_resend *c);
/* The prompt starts with n_prefix tokens of something else (a pool made
 * from text) and then the conversation, its first token dropped when
 * drop_first (the BOS the prefix already has). The history is then read the
 * same way: its first n_prefix tokens are the prefix's, kept as they are. */
void ak_chat_resend_set_prefix(ak_chat_resend *c, int n_prefix, int drop_first);
/* A rebuilt prompt must start with the history's first n tokens (a pool
 * made from messages, rendered with the conversation), else it is not used. */
void ak_chat_resend_keep(ak_chat_resend *c, int n);
/* ak_chat_tokenize_resent over hist[0..n_hist) (after the prefix, if set:
 * the conversation's history, its first token put back when dropped; no
 * history shorter than the prefix has one): returns 1 with the prompt in
 * *ids (malloc'd) and *n_ids when at least one message was replaced, 0 when
 * none was (the prompt as first tokenized stands), -1 with err set on
 * failure. The signature of a scheduler's prompt rebuild (sched.h:
 * ak_reprompt) but for err. */
int ak_chat_resend_prompt(const ak_chat_resend *c, const int32_t *hist, int n_hist, int32_t **ids, int *n_ids,
                          ak_error *err);

#endif
