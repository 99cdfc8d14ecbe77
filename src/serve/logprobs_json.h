/* logprobs_json.h - the log-probabilities a request recorded (sched.h:
 * ak_request_logprobs) written in OpenAI's shapes, whole or chunk by chunk.
 *
 * Chat: choices[].logprobs = {"content": [{token, logprob, bytes,
 * top_logprobs: [{token, logprob, bytes}]}], "refusal": null}.
 * Completions (the legacy shape): choices[].logprobs = {tokens,
 * token_logprobs, top_logprobs: [{token: logprob}], text_offset}, where a
 * token's dict holds the top alternatives and the token itself (so up to
 * logprobs + 1 of them, as OpenAI's) and text_offset counts characters
 * (code points) of the completion's text before the token's.
 *
 * A token's text is its bytes (ak_token_bytes) as UTF-8, each invalid part
 * replaced by U+FFFD (the streaming decoder's rule); "bytes" are the bytes
 * themselves.
 */
#ifndef AK_LOGPROBS_JSON_H
#define AK_LOGPROBS_JSON_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "serve/sched.h"
#include "text/tokenizer.h"

/* How far a reader has answered a request's log-probabilities. Zeroed at
 * the start. */
typedef struct {
    int next;                 /* entries already written */
    size_t bytes, chars;      /* text already written: bytes, characters */
} ak_lp_cursor;

/* What ak_logprobs_add writes. */
typedef struct {
    ak_request *r;
    int choice;               /* which choice of r (ak_request_logprobs_choice) */
    const ak_tokenizer *tk;
    int chat;                 /* 1: chat's shape, 0: the legacy one */
    const char *text;         /* the text this answer carries: the choice's text from byte
                                 cur->bytes on, n bytes (NULL when n is 0) */
    size_t n;
    size_t upto;              /* entries whose text starts before this byte ((size_t)-1 at the end:
                                 ak_request_logprobs) */
    int always;               /* 1: an object even with no entries (a whole answer) */
} ak_lp_add;

/* Puts the log-probabilities of the entries from cur->next that a->upto
 * takes in the "logprobs" member of c, a choice object of an answer
 * (replacing its null), and moves cur past them and past a->text. Without
 * entries (and without a->always) the member stays as it was. Returns 0,
 * or -1 when out of memory (c is then unchanged; cur too). */
int ak_logprobs_add(cJSON *c, const ak_lp_add *a, ak_lp_cursor *cur);

#endif
