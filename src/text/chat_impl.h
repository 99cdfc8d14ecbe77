/* chat_impl.h - what chat.c and chat_tools.c share: the output buffer that
 * marks message content apart from markup and records where messages land,
 * the roles, and the renderers of the families with tool markup of their
 * own (chat_tools.c). Only src/text/chat*.c include it. */
#ifndef AK_CHAT_IMPL_H
#define AK_CHAT_IMPL_H

#include <stdint.h>

#include "text/chat.h"

typedef struct {
    char *p;
    size_t len, cap;
    int failed;          /* an allocation failed; later appends are no-ops */
    /* Segments: with track set, mask[i] is 1 for bytes that came from a
     * message or the request (content) and 0 for the template's own markup. */
    int track, content;
    uint8_t *mask;
    /* Spans: where each assistant message's turn opens and its content
     * lands (ak_chat_rendering); NULL when not wanted. */
    ak_chat_span *spans;
} sbuf;

/* Appends s[0..n) (marked as content or markup as b->content says). */
void akc_putn(sbuf *b, const char *s, size_t n);
/* Appends a NUL-terminated string; NULL appends nothing. */
void akc_puts(sbuf *b, const char *s);
/* Appends s with ASCII whitespace stripped from both ends (Jinja's trim). */
void akc_put_trim(sbuf *b, const char *s);

/* Runs an append as message content (see sbuf.mask). */
#define CONTENT(b, stmt) do { (b)->content = 1; stmt; (b)->content = 0; } while (0)

/* Runs an append, recording that message i's content (for a reply with
 * calls: its whole turn after the generation prompt) lands there. */
#define MSG_SPAN(b, i, stmt) do {                                                \
        size_t at_ = (b)->len;                                                   \
        stmt;                                                                    \
        if ((b)->spans) { (b)->spans[i].at = (long)at_; (b)->spans[i].end = (long)(b)->len; } \
    } while (0)

/* CONTENT, recording where message i's content lands. */
#define MSG_CONTENT(b, i, stmt) MSG_SPAN(b, i, CONTENT(b, stmt))

/* Message i's turn opens here (its opening markup follows). */
static inline void akc_mark_open(sbuf *b, int i) {
    if (b->spans) b->spans[i].open = (long)b->len;
}

typedef enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL } role_t;

/* A rendering in progress: the messages, their roles, the options. */
typedef struct {
    sbuf *b;
    const ak_chat_msg *m;
    const role_t *r;
    int n;
    const ak_chat_opts *o;
    const char *bos, *eos;   /* never NULL */
    int gen;                 /* the generation prompt is wanted */
} akc_ctx;

/* The text of the tools block (qwen3's "# Tools ..." up to "</tool_call>",
 * each tool's JSON on a line of its own) as content. */
void akc_put_tools_block(sbuf *b, const ak_chat_opts *o);
/* JSON text (NULL: "{}") as the template's tojson prints the value it
 * holds (indent < 0: none), or, text that is not JSON, as tojson prints a
 * string; as content. */
void akc_put_tojson(sbuf *b, const char *json, int indent);

/* The families with tool markup of their own (chat_tools.c). Each returns
 * 0, or -1 with err set. */
int akc_render_chatml(const akc_ctx *c, ak_error *err);
int akc_render_qwen3(const akc_ctx *c, ak_error *err);
int akc_render_llama3(const akc_ctx *c, ak_error *err);
int akc_render_mistral(const akc_ctx *c, ak_error *err);
int akc_render_deepseek3(const akc_ctx *c, ak_error *err);

/* Finds a literal default system message in a ChatML template t (may be
 * NULL): the text between "<|im_start|>system\n" (escaped or real newline)
 * and "<|im_end|>" inside one string literal (no quotes, braces or '+' in
 * between), as written in the template (*text, *n: for akc_put_unescaped).
 * Returns 1 if found, else 0. */
int akc_chatml_default_system(const char *t, const char **text, size_t *n);
/* Copies the Jinja string-literal text s[0..n) into b, undoing the escapes
 * \n, \t, \\, \' and \". */
void akc_put_unescaped(sbuf *b, const char *s, size_t n);
/* Appends the Llama 3.1/3.2 date: the template's literal default
 * (`date_string = "..."`) if present, else AK_CHAT_LLAMA3_DATE. */
void akc_llama3_date(sbuf *b, const char *t);

#endif
