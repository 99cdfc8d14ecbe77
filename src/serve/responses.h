/* responses.h - OpenAI's Responses API over the chat machinery: a
 * POST /v1/responses body read into the chat body it means, a reply (the
 * reply parser's content, reasoning and calls) written out as a response's
 * output items or as the Responses stream's events, and the items of a
 * conversation reduced to a chain hash (how a resent conversation finds the
 * stored response it continues).
 *
 * THE REQUEST. `input` (a string, or items: {role, content} with content a
 * string or input_text/output_text parts, `message` items, `function_call`
 * {call_id, name, arguments}, `function_call_output` {call_id, output: a
 * string or parts}, `reasoning` items: accepted and dropped, as the
 * templates drop earlier turns' reasoning) after the history (the items of
 * the responses it continues), `instructions` first as a system message;
 * `tools` in the Responses' flat shape ({type: "function", name,
 * description, parameters, strict}; other tool types: 400 naming them),
 * `tool_choice` (auto, none, required, {type: "function", name}),
 * `parallel_tool_calls`, `text.format` (text, json_object, {type:
 * "json_schema", name, schema, strict}), `reasoning.effort`,
 * `max_output_tokens`, `temperature`, `top_p`, `stream`, `prompt_cache_key`,
 * agentkv's `handoff_reuse` become the chat body's fields, which the chat parser (api.h) then checks
 * as it checks a chat request. `store`, `previous_response_id`,
 * `conversation`, `metadata` are the caller's (routes_responses.c).
 * Accepted with no effect: `include`, `prompt_cache_retention`,
 * `service_tier`, `user`, `safety_identifier`, `truncation` ("disabled";
 * "auto" too: a conversation past the context is a 400 either way),
 * `text.verbosity`, `reasoning.summary`. `background: true`, `top_logprobs`,
 * `prompt` (a stored prompt) and any tool that is not a function: 400
 * unsupported_parameter naming them.
 *
 * THE CHAIN HASH. Each item has a canonical text (a message: its role and
 * its text; a call: its call_id, name and arguments as compact JSON when
 * they parse; a call's output: its call_id and text; reasoning and
 * references: nothing), and the hash of items[0..k) chains XXH64 over those
 * texts. A response is stored with the hash of every item it holds (history,
 * input, output); a request that resends a conversation finds the response
 * it continues by the longest prefix of its input whose hash is stored.
 */
#ifndef AK_RESPONSES_H
#define AK_RESPONSES_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "serve/api.h"
#include "text/toolcall.h"

/* Validates req (a POST /v1/responses body) and writes into *chat (a new
 * object, the caller deletes it) the chat body it means: history (an array
 * of items, NULL: none) then req's input as messages. Returns 0, or -1 with
 * b set (400 with param and code as OpenAI names them; 500 out of memory). */
int ak_resp_chat_body(const cJSON *req, const cJSON *history, cJSON **chat, ak_api_error *b);

/* req's input as an array of items (a string input: one user message item;
 * each item as given). A new array (the caller deletes it), or NULL when
 * out of memory. req must have passed ak_resp_chat_body. */
cJSON *ak_resp_input_items(const cJSON *req);

/* The chain hash of the array items' first n continued from h (0: from
 * the start). */
uint64_t ak_resp_chain_hash(uint64_t h, const cJSON *items, int n);
/* h continued by one item (h itself for an item that does not count). */
uint64_t ak_resp_item_hash(uint64_t h, const cJSON *item);

/* How a reply is written out: the ids its items take. */
typedef struct {
    uint64_t id_seed;          /* item ids derive from it (the response's id hashed) */
} ak_resp_ids;

/* The output items of a whole reply (tc finished): a reasoning item, a
 * message item (its output_text), the function calls, in the order the
 * reply gave them. incomplete: the reply was cut (items "incomplete"). A new
 * array, or NULL when out of memory. */
cJSON *ak_resp_output_items(const ak_toolcall *tc, const ak_resp_ids *ids, int incomplete);

/* The Responses stream of one reply: the parser's events in, the events
 * the official clients parse out, each with its sequence_number. */
typedef struct ak_resp_stream ak_resp_stream;

/* A stream writing events into out (an array the caller owns and empties
 * as it sends them). NULL when out of memory. */
ak_resp_stream *ak_resp_stream_new(const ak_resp_ids *ids, cJSON *out);
void ak_resp_stream_free(ak_resp_stream *st);
/* Appends the events that start a response: response.created and
 * response.in_progress, each holding resp (copied; its status is set to
 * "in_progress" and its output to []). Returns 0 or -1 (memory). */
int ak_resp_stream_begin(ak_resp_stream *st, const cJSON *resp);
/* Appends the events of the parser's events ev[0..n). Returns 0 or -1. */
int ak_resp_stream_feed(ak_resp_stream *st, const ak_toolcall_event *ev, int n);
/* Closes what is open and appends the terminal event: response.completed,
 * or response.incomplete when incomplete, holding resp with the output
 * items the stream wrote (resp is copied). Returns 0 or -1. */
int ak_resp_stream_end(ak_resp_stream *st, const cJSON *resp, int incomplete);
/* The output items the stream has written (its own array: valid until the
 * stream is freed). */
const cJSON *ak_resp_stream_items(const ak_resp_stream *st);

#endif
