/* api_tools.h - a chat request's tools, tool choice, thinking switches and
 * its messages' tool calls and results, read and validated (api.h: TOOLS).
 * The server's parser (api.c) calls these; nothing here touches HTTP. */
#ifndef AK_API_TOOLS_H
#define AK_API_TOOLS_H

#include <cjson/cJSON.h>

#include "serve/api.h"

/* Reads tools, tool_choice, parallel_tool_calls, reasoning_effort and
 * chat_template_kwargs.enable_thinking of body into *t (zeroed first; free
 * with ak_api_tools_free). Returns 0, or -1 with b set (400: a tool that is
 * not {"type": "function", "function": {"name", ...}}, a name given twice,
 * tool_choice naming no tool or asking for a call without tools, a
 * chat_template_kwargs that is not an object, an enable_thinking that is
 * not a boolean; 500: out of memory). */
int ak_api_parse_tools(const cJSON *body, ak_api_tools *t, ak_api_error *b);
void ak_api_tools_free(ak_api_tools *t);

/* The tool-call fields of message i (msg, its role already checked: an
 * assistant's "tool_calls", a tool message's "tool_call_id") into m (calls,
 * n_calls, tool_call_id), their strings in *owned (malloc'd, the caller
 * frees it; NULL when there is none). Returns 0, or -1 with b set (400: a
 * call that is not {"id", "type": "function", "function": {"name",
 * "arguments"}} with strings, a tool message without a string
 * tool_call_id). */
int ak_api_read_calls(const cJSON *msg, int i, ak_chat_msg *m, char **owned, ak_api_error *b);

/* Every tool message of m[0..n) must answer a call an earlier assistant
 * message made (its tool_call_id one of their ids). Returns 0, or -1 with
 * b set (400 invalid_value naming the message and the id). */
int ak_api_check_tool_results(const ak_chat_msg *m, int n, ak_api_error *b);

#endif
