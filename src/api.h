/* api.h - OpenAI request bodies (/v1/chat/completions, /v1/completions)
 * parsed and validated into what the scheduler needs, without any HTTP
 * connection: the server calls it with the body bytes and the X-Agent-Id
 * header's value, and so can a fuzzer.
 *
 * Fields read (others are ignored, as OpenAI's clients send many):
 *   model (string, required, must equal the served model id)
 *   agent_id (string; must agree with the header when both are given)
 *   messages (chat, required): 1..AK_API_MAX_MESSAGES objects {role, content};
 *     role system|developer|user|assistant; content a string, null, or an
 *     array of at most AK_API_MAX_PARTS parts {"type":"text","text":...}
 *   prompt (completions, required): a string or an array of one string
 *   n (only 1), max_tokens / max_completion_tokens (1..2^24),
 *   temperature [0, 2], top_p (0, 1], seed (|seed| <= 2^62),
 *   stream, stream_options.include_usage (booleans),
 *   stop (a string or an array of at most 4 non-empty strings), user (string).
 * Numbers are range-checked as doubles before any conversion, so 1e300 is a
 * 400 like any other out-of-range value.
 */
#ifndef AK_API_H
#define AK_API_H

#include <stddef.h>
#include <stdint.h>

#include "agent.h"
#include "chat.h"
#include "sampler.h"
#include "sched.h"
#include "tokenizer.h"

#define AK_API_MAX_MESSAGES 4096   /* messages in one chat request */
#define AK_API_MAX_PARTS    256    /* content parts in one message */

/* What the parser needs to know about the server. */
typedef struct {
    const ak_tokenizer *tok;
    const char *model_id;      /* the name requests must give in "model" */
    ak_chat_family family;
    const char *template_text; /* may be NULL */
    int n_ctx;
} ak_api_config;

/* A completion request, validated. */
typedef struct {
    int chat;
    char agent_id[AK_AGENT_ID_MAX + 1];   /* "" when anonymous */
    int32_t *tokens;
    size_t n_tokens;
    int max_tokens;           /* >= 1 after a successful parse (clamped to the context) */
    ak_sampler_params sp;
    int seed_given;           /* 0: sp.seed is the caller's default_seed */
    char *stop[AK_MAX_STOP];
    int n_stop;
    int stream, include_usage;
} ak_api_request;

/* Why a body was refused: the HTTP status and OpenAI's error fields. */
typedef struct {
    int status;               /* 400, 404 (unknown model) or 500 (out of memory) */
    const char *param, *code; /* static strings or NULL */
    char msg[600];
} ak_api_error;

/* Parses body[0..len) (need not be NUL-terminated) for the chat (chat = 1)
 * or completions endpoint. agent_header is the X-Agent-Id header's value or
 * NULL; default_seed is used when the body gives no seed. On success returns
 * 0 and fills *out (free it with ak_api_request_free). On failure returns -1
 * with *e set; *out then holds nothing to free (ak_api_request_free is still
 * safe to call). */
int ak_api_parse(const ak_api_config *cfg, const char *body, size_t len, int chat, const char *agent_header,
                 uint64_t default_seed, ak_api_request *out, ak_api_error *e);

/* Frees what ak_api_parse allocated; the struct is zeroed. NULL is fine. */
void ak_api_request_free(ak_api_request *r);

#endif
