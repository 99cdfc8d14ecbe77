/* fuzz_toolcall.c - libFuzzer target for the reply parsers of every chat
 * family (src/text/toolcall.c): content, reasoning and tool calls out of a
 * reply streamed in pieces.
 *
 * Input layout:
 *   byte 0      family (modulo the number of families)
 *   byte 1      bit 0 tools, bit 1 parallel calls, bit 2 starts inside the
 *               reasoning, bit 7 repair the text into valid UTF-8 first
 *   byte 2      seed of the piece sizes (1..16 bytes each)
 *   the rest    the reply's text (NULs too)
 * The text is fed whole to one parser and in pieces to another, then both
 * finish. Checked, besides crashes and sanitizer reports:
 *   - the pieces give exactly what the whole gives: content, reasoning,
 *     calls (ids, names, arguments, complete or not);
 *   - the events add up to what the parser keeps, in a valid order (a call
 *     starts once, with the next index, before its arguments and its end;
 *     no empty text event);
 *   - with tools off in a family without reasoning, the content is the text;
 *   - no content event holds a call opener of the family when tools are
 *     on, no reasoning event "</think>" (the content as a whole may: the
 *     text around a call that did not parse);
 *   - ids are distinct; valid UTF-8 in gives valid UTF-8 out, field by field.
 * Run with `make fuzz FUZZ_TARGETS=toolcall`. Seeds: fuzz/corpus/toolcall/.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "text/toolcall.h"
#include "utf8_check.h"

#define MUST(cond, what)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "fuzz_toolcall: %s (line %d)\n", what, __LINE__); \
            abort();                                                           \
        }                                                                      \
    } while (0)

/* What the events of one run added up to. */
typedef struct {
    ak_buf content, reasoning, args[64];
    int n_calls, open[64];
    const char *opener[2];   /* what no content event may hold */
} sum_t;

/* x[0..xl) and y[0..yl) are the same bytes (NULL is fine when empty). */
static int same(const char *x, size_t xl, const char *y, size_t yl) {
    return xl == yl && (xl == 0 || !memcmp(x, y, xl));
}

static void sum_free(sum_t *s) {
    ak_buf_free(&s->content);
    ak_buf_free(&s->reasoning);
    for (int i = 0; i < 64; i++) ak_buf_free(&s->args[i]);
}

static void take(sum_t *s, const ak_toolcall_event *ev, int n) {
    MUST(n >= 0, "feed failed");
    for (int i = 0; i < n; i++) {
        const ak_toolcall_event *e = &ev[i];
        int text = e->kind == AK_TOOLCALL_CONTENT || e->kind == AK_TOOLCALL_REASONING || e->kind == AK_TOOLCALL_ARGS;
        MUST(!text || (e->len > 0 && e->text[e->len] == '\0'), "empty or unterminated text event");
        for (int k = 0; k < 2 && e->kind == AK_TOOLCALL_CONTENT; k++)
            MUST(!s->opener[k] || !memmem(e->text, e->len, s->opener[k], strlen(s->opener[k])),
                 "an opener reached the content");
        MUST(e->kind != AK_TOOLCALL_REASONING || !memmem(e->text, e->len, "</think>", 8), "</think> reached the reasoning");
        if (e->kind == AK_TOOLCALL_CONTENT) ak_buf_append(&s->content, e->text, e->len);
        else if (e->kind == AK_TOOLCALL_REASONING) ak_buf_append(&s->reasoning, e->text, e->len);
        else if (e->kind == AK_TOOLCALL_CALL_START) {
            MUST(e->index == s->n_calls && e->index < 64 && e->id && e->name, "call started out of order");
            s->open[s->n_calls++] = 1;
        } else {
            MUST(e->index >= 0 && e->index < s->n_calls && s->open[e->index], "call event out of order");
            if (e->kind == AK_TOOLCALL_ARGS) ak_buf_append(&s->args[e->index], e->text, e->len);
            else s->open[e->index] = 0;
        }
    }
}

/* Runs a parser over text[0..n) in pieces of sizes drawn from rng (whole when
 * rng is 0), checks its events against what it keeps, and returns it. */
static ak_toolcall *parse(const ak_toolcall_opts *o, const char *text, size_t n, uint32_t rng, sum_t *s) {
    ak_error err = {0};
    ak_toolcall *p = ak_toolcall_new(o, &err);
    MUST(p, "new failed");
    const ak_toolcall_event *ev = NULL;
    for (size_t at = 0; at < n;) {
        size_t step = n - at;
        if (rng) {
            rng = rng * 1103515245u + 12345u;
            step = 1 + (rng >> 16) % 16;
            if (step > n - at) step = n - at;
        }
        int k = ak_toolcall_feed(p, text + at, step, &ev, &err);
        take(s, ev, k);
        at += step;
    }
    int k = ak_toolcall_finish(p, &ev, &err);
    take(s, ev, k);
    size_t len;
    const char *c = ak_toolcall_content(p, &len);
    MUST(same(c, len, s->content.p, s->content.len), "content differs from its events");
    c = ak_toolcall_reasoning(p, &len);
    MUST(same(c, len, s->reasoning.p, s->reasoning.len), "reasoning differs from its events");
    MUST(ak_toolcall_n_calls(p) == s->n_calls, "calls differ from their events");
    for (int i = 0; i < s->n_calls; i++) {
        const ak_toolcall_call *k = ak_toolcall_get(p, i);
        MUST(k && !s->open[i], "a call left open");
        MUST(same(k->arguments, k->len, s->args[i].p, s->args[i].len), "arguments differ from their events");
        for (int j = 0; j < i; j++) MUST(strcmp(k->id, ak_toolcall_get(p, j)->id), "two calls with one id");
    }
    return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    ak_toolcall_opts o = {.family = (ak_chat_family)(data[0] % AK_CHAT_N_FAMILIES), .tools = data[1] & 1,
                          .parallel = data[1] >> 1 & 1, .in_reasoning = data[1] >> 2 & 1, .id_seed = data[2]};
    size_t n = size - 3;
    char *text = malloc(3 * n + 1);
    if (!text) abort();
    n = data[1] & 0x80 ? utf8_repair(data + 3, n, (unsigned char *)text) : (memcpy(text, data + 3, n), n);
    int valid = utf8_valid((const unsigned char *)text, n);

    sum_t a = {0}, b = {0};
    if (o.tools) {
        static const char *const openers[] = {
            "<tool_call>", "<|python_tag|>", "[TOOL_CALLS]",
            "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>",
            "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"};
        int k = o.family == AK_CHAT_LLAMA3 ? 1 : o.family == AK_CHAT_MISTRAL ? 2 : o.family == AK_CHAT_DEEPSEEK3 ? 3 : 0;
        a.opener[0] = b.opener[0] = openers[k];
        if (k == 3) a.opener[1] = b.opener[1] = openers[4];
    }
    ak_toolcall *whole = parse(&o, text, n, 0, &a);
    ak_toolcall *split = parse(&o, text, n, data[2] * 2654435761u + 1, &b);
    MUST(same(a.content.p, a.content.len, b.content.p, b.content.len), "pieces change the content");
    MUST(same(a.reasoning.p, a.reasoning.len, b.reasoning.p, b.reasoning.len), "pieces change the reasoning");
    MUST(a.n_calls == b.n_calls, "pieces change the calls");
    for (int i = 0; i < a.n_calls; i++) {
        const ak_toolcall_call *x = ak_toolcall_get(whole, i), *y = ak_toolcall_get(split, i);
        MUST(!strcmp(x->id, y->id) && !strcmp(x->name, y->name) && x->complete == y->complete &&
                 same(x->arguments, x->len, y->arguments, y->len),
             "pieces change a call");
        MUST(!valid || (utf8_valid((const unsigned char *)x->name, strlen(x->name)) &&
                        utf8_valid((const unsigned char *)x->arguments, x->len)),
             "a call is not valid UTF-8");
    }
    MUST(!valid || (utf8_valid((const unsigned char *)a.content.p, a.content.len) &&
                    utf8_valid((const unsigned char *)a.reasoning.p, a.reasoning.len)),
         "content or reasoning is not valid UTF-8");
    int thinks = o.family == AK_CHAT_QWEN3 || o.family == AK_CHAT_DEEPSEEK3;
    if (!o.tools && !thinks && !o.in_reasoning)
        MUST(same(a.content.p, a.content.len, text, n) && a.n_calls == 0, "without tools the text is content");
    ak_toolcall_free(whole);
    ak_toolcall_free(split);
    sum_free(&a);
    sum_free(&b);
    free(text);
    return 0;
}
