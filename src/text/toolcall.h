/* toolcall.h - a model's reply taken apart as it streams: content,
 * reasoning, and tool calls, in each chat family's own markup (chat.h).
 *
 * The caller feeds the generated text piece by piece, as it comes; each
 * feed returns the events that text decided, ready for OpenAI's streaming
 * deltas: a piece of content, a piece of reasoning, a call's start (its
 * index in the turn, its id, its function's name), a piece of its
 * arguments' JSON, its end. Markup is recognized as text, never as token
 * ids: an opener may arrive split over any number of pieces, and text that
 * may be the start of one is held back until it is decided (then emitted or
 * taken as markup); markup never reaches the content. The control tokens
 * of calls (Mistral's "[TOOL_CALLS]", Llama's "<|python_tag|>") decode to
 * their text (tokenizer.h), so the generated text holds them.
 *
 * Per family:
 *   chatml, qwen3, and the families without markup of their own (llama2,
 *   gemma, gemma3, phi3, deepseek2, plain): a call is "<tool_call>" + a JSON
 *   object {"name": N, "arguments": A} + "</tool_call>" (whitespace around
 *   the object, "parameters" for "arguments", other members ignored, A
 *   passed on as written, or decoded when it is a JSON string); calls and
 *   text may alternate.
 *   llama3: a call is the reply itself, a JSON object whose first member is
 *   "name" (or "type": "function" and then "name"), its arguments
 *   "parameters" (or "arguments"), with nothing before it but whitespace or
 *   after "<|python_tag|>" (anywhere); several, separated by whitespace or
 *   ';', where parallel calls are allowed. Text after the calls is content.
 *   mistral: "[TOOL_CALLS]" + a JSON array of such objects (Nemo), or
 *   "[TOOL_CALLS]" + N + "[ARGS]" + A, or N + "[CALL_ID]" + id + "[ARGS]" + A
 *   (Small 3.2), one or more.
 *   deepseek3: "<｜tool▁calls▁begin｜>" then per call "<｜tool▁call▁begin｜>" N
 *   "<｜tool▁sep｜>" A "<｜tool▁call▁end｜>" (V3.1) or "<｜tool▁call▁begin｜>function
 *   <｜tool▁sep｜>" N "\n```json\n" A "\n```<｜tool▁call▁end｜>" (R1), then
 *   "<｜tool▁calls▁end｜>".
 *   Reasoning (qwen3, deepseek3): a reply that opens with "<think>"
 *   (whitespace before it allowed), or starts inside reasoning
 *   (in_reasoning), is reasoning up to "</think>"; the newlines right after
 *   "<think>", right before "</think>" and right after it are dropped, as
 *   the templates put them back.
 * A call whose markup breaks before its name is known is given back as
 * content, its opener left out. Ids are generated: nine letters and digits
 * for mistral (its templates refuse others), "call_" and 24 for the rest,
 * the same for the same seed and index.
 */
#ifndef AK_TOOLCALL_H
#define AK_TOOLCALL_H

#include <stddef.h>
#include <stdint.h>

#include "base/util.h"
#include "text/chat.h"

typedef enum {
    AK_TOOLCALL_CONTENT,     /* text: a piece of the reply's content */
    AK_TOOLCALL_REASONING,   /* text: a piece of its reasoning */
    AK_TOOLCALL_CALL_START,  /* index, id, name: a call begins */
    AK_TOOLCALL_ARGS,        /* index, text: a piece of the call's arguments (JSON text) */
    AK_TOOLCALL_CALL_END     /* index: the call's arguments are complete */
} ak_toolcall_kind;

typedef struct {
    ak_toolcall_kind kind;
    int index;          /* CALL_START, ARGS, CALL_END: the call's index in the turn, from 0 */
    const char *text;   /* CONTENT, REASONING, ARGS: the piece (len bytes, NUL-terminated) */
    size_t len;
    const char *id;     /* CALL_START: the call's id */
    const char *name;   /* CALL_START: the function's name */
} ak_toolcall_event;

typedef struct {
    ak_chat_family family;
    int tools;          /* 1: calls are parsed (tools given, tool_choice not "none"); 0: text only */
    int parallel;       /* 1: several calls a turn (parallel_tool_calls); 0: calls after the first are dropped */
    int in_reasoning;   /* 1: the reply starts inside the reasoning (ak_chat_reasoning_open) */
    uint64_t id_seed;   /* the calls' ids derive from it */
} ak_toolcall_opts;

/* One call of the turn as parsed so far. */
typedef struct {
    char id[32];
    const char *name;
    const char *arguments;   /* the arguments' JSON text so far (NUL-terminated) */
    size_t len;
    int complete;            /* its end was seen */
} ak_toolcall_call;

typedef struct ak_toolcall ak_toolcall;

/* A parser for one reply. Returns NULL with err set (out of memory). */
ak_toolcall *ak_toolcall_new(const ak_toolcall_opts *o, ak_error *err);
/* NULL is fine. */
void ak_toolcall_free(ak_toolcall *p);

/* Feeds text[0..len) (any split, UTF-8 whole or not). Sets *ev to the
 * events it decided, in order (valid until the next feed, finish or free;
 * adjacent text of one kind comes as one event) and returns their number,
 * or -1 with err set (out of memory; the parser is then unusable). */
int ak_toolcall_feed(ak_toolcall *p, const char *text, size_t len, const ak_toolcall_event **ev, ak_error *err);

/* The reply ended: text held back is decided (a partial opener is
 * content), a call still open ends (its arguments as far as they came;
 * incomplete, see ak_toolcall_get), a call whose name never came is
 * dropped. Returns the events as ak_toolcall_feed does. Later feeds do
 * nothing. */
int ak_toolcall_finish(ak_toolcall *p, const ak_toolcall_event **ev, ak_error *err);

/* The whole reply so far: its content and reasoning (NUL-terminated, "" when
 * none; *len may be NULL), its calls. */
const char *ak_toolcall_content(const ak_toolcall *p, size_t *len);
const char *ak_toolcall_reasoning(const ak_toolcall *p, size_t *len);
int ak_toolcall_n_calls(const ak_toolcall *p);
/* Call i (0 <= i < n_calls), valid until the next feed, finish or free; NULL
 * when out of range. */
const ak_toolcall_call *ak_toolcall_get(const ak_toolcall *p, int i);

/* 1 when no more calls can come (parallel calls off and one call complete,
 * or llama3's one-call form ended): the caller may stop generating; else 0. */
int ak_toolcall_done(const ak_toolcall *p);

/* Writes the id of call `index` under seed for family f into out (at least
 * 32 bytes): mistral nine letters and digits, others "call_" + 24. */
void ak_toolcall_id(ak_chat_family f, uint64_t seed, int index, char *out);

#endif
