/* toolgrammar.h - the grammar that holds a reply to a family's tool-call
 * syntax (chat.h, toolcall.h), with each call's arguments valid for its
 * tool's parameters (jsonschema.h): what tool_choice "required", a named
 * function, and "auto" (from the call's opener on) constrain decoding to.
 *
 * THE SYNTAX, per family (what the templates render and toolcall.h parses):
 *   chatml, qwen3 and the families without markup of their own:
 *     "<tool_call>\n{\"name\": \"N\", \"arguments\": A}\n</tool_call>",
 *     parallel calls joined by "\n";
 *   llama3: {"name": "N", "parameters": A}, one call (its templates allow
 *     one a message);
 *   mistral: Nemo "[TOOL_CALLS][{\"name\": \"N\", \"arguments\": A}, ...]";
 *     Small 3.2 (template with "[SYSTEM_PROMPT]") "[TOOL_CALLS]N[ARGS]A",
 *     repeated for parallel calls;
 *   deepseek3: V3.1 "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>A
 *     <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>"; R1 (a template without
 *     "is_last_user") each call "<｜tool▁call▁begin｜>function<｜tool▁sep｜>N
 *     \n```json\nA\n```<｜tool▁call▁end｜>".
 * N is one of the tools' names; A is JSON valid for that tool's parameters
 * (any object when it has none) printed as the templates' tojson prints it
 * (": " and ", ", no other whitespace: the history then decodes to the
 * call as a template renders it when the client sends it back); a content
 * reply is compact JSON, as response_format's.
 *
 * THE SPEC. A grammar is described by a spec text (ak_toolg_spec), the key
 * under which the server caches its compiled form and token masks; the
 * same request gives the same text. Modes:
 *   AK_TOOLG_AFTER_OPENER  the grammar starts right after the opener
 *                          (one call where the opener begins each call)
 *                          (ak_toolg_opener; tool_choice auto: the
 *                          generator is lazy, free text until the opener);
 *   AK_TOOLG_CALLS         the whole reply is calls (the opener first,
 *                          or after up to four spaces or newlines with
 *                          lead_ws; "required" and a named function);
 *   AK_TOOLG_CALLS_OR_CONTENT  calls as AK_TOOLG_CALLS, or instead a JSON
 *                          reply valid for content_schema (tool_choice auto
 *                          beside response_format json_schema/json_object).
 */
#ifndef AK_TOOLGRAMMAR_H
#define AK_TOOLGRAMMAR_H

#include <stddef.h>

#include "text/chat.h"
#include "text/grammar.h"

typedef enum {
    AK_TOOLG_AFTER_OPENER = 0,
    AK_TOOLG_CALLS = 1,
    AK_TOOLG_CALLS_OR_CONTENT = 2
} ak_toolg_mode;

typedef struct {
    ak_chat_family family;
    const char *template_text;    /* the model's chat template (picks the mistral and deepseek3 variants), or NULL */
    const ak_chat_tool *tools;    /* the tools a call may name (a named choice: that one alone) */
    int n_tools;
    int parallel;                 /* 1: several calls where the family allows them */
    ak_toolg_mode mode;
    const char *content_schema;   /* AK_TOOLG_CALLS_OR_CONTENT: a JSON Schema text, or NULL: any JSON object */
    int lead_ws;                  /* 1: up to four spaces or newlines may come first (after "</think>");
                                     0: the calls or the content at once, as the templates render them */
} ak_toolg_opts;

/* The text that opens the calls in family f (and the template's variant):
 * "<tool_call>", "[TOOL_CALLS]", "{\"name\": \"" (llama3), or deepseek3's
 * "<｜tool▁calls▁begin｜>". Static. */
const char *ak_toolg_opener(ak_chat_family f, const char *template_text);

/* The spec text of o (malloc'd, NUL-terminated; *len its length), or NULL
 * out of memory. A tool's parameters that are not JSON are kept as a
 * string: the compile then fails with AK_GRAM_E_JSON naming the tool. */
char *ak_toolg_spec(const ak_toolg_opts *o, size_t *len);

/* Compiles a spec text. Returns the grammar, or NULL with e set: the JSON
 * Schema compiler's codes, e->path starting "/tools/I/parameters" (tool I's
 * schema) or "/content" (the content schema); AK_GRAM_E_INVALID for a spec
 * this module did not write. */
ak_grammar *ak_toolg_compile(const char *spec, size_t len, ak_gram_error *e);

#endif
