/* run.h - a chat or completions request run for a route (internal to
 * src/serve/): parsed by the chat parser (api.h), submitted to the
 * scheduler, waited on while the client is watched; the pieces of its
 * answer that the chat, completions and Responses routes share. */
#ifndef AK_RUN_H
#define AK_RUN_H

#include "serve/server_impl.h"
#include "text/toolcall.h"

/* A running request. */
typedef struct {
    ak_api_request p;         /* the parsed request (owned) */
    ak_request *r;            /* the engine's request (a reference) */
    int fd;                   /* the client's socket (-1: unknown) */
    char id[64];              /* the answer's id */
    long created;             /* unix seconds */
} ak_run;

typedef struct {
    const char *body;         /* a chat (chat = 1) or completions body, len bytes */
    size_t len;
    int chat;
    const char *agent_header; /* X-Agent-Id's value, or NULL */
    const char *id_prefix;    /* the answer id's prefix ("chatcmpl", "cmpl") */
    const char *id;           /* the answer's id when the caller made it (NULL: made with id_prefix) */
} ak_run_args;

/* Parses a's body, submits it and waits for its first text (or its end: a
 * request that fails in the queue gets its own status). Returns 1 with *run
 * filled (release it with ak_run_free), or 0 when the request was answered
 * with an error (*reply: libmicrohttpd's verdict; nothing to free). The
 * connection's body is released once parsed. */
int ak_run_start(const ak_route_req *q, const ak_run_args *a, ak_run *run, enum MHD_Result *reply);
/* Waits until run has more than `have` bytes of text (0) or finished (1),
 * watching the client: -1 when it left (the request is then cancelled). */
int ak_run_wait(ak_run *run, size_t have);
/* Waits until run has news past version `seen` (sched.h:
 * ak_request_wait_news; 0) or, with until_done, until it finished (1),
 * watching the client: -1 when it left (the request is then cancelled). */
int ak_run_wait_news(ak_run *run, uint64_t seen, int until_done);
/* The client of a running request left: run freed, 499 counted, the
 * connection closed (the verdict to return). */
enum MHD_Result ak_run_client_left(const ak_route_req *q, ak_run *run);
void ak_run_free(ak_run *run);

/* The HTTP status of a request that failed in the engine. */
int ak_run_failed_status(const ak_req_result *res);
/* OpenAI's error code (and its param) for an engine failure, or NULL. */
const char *ak_run_error_code(int code, const char **param);
/* agentkv's own object of a finished request: tier, reuse and timings. */
cJSON *ak_run_agentkv_json(const ak_api_request *p, const ak_req_result *res);
/* An answer id: prefix, the server's salt and a serial number. */
void ak_run_make_id(ak_server *s, const char *prefix, char *out, size_t cap);
/* 1 when a chat reply goes through the reply parser (tools that may be
 * called, or a family that writes reasoning). */
int ak_run_parsed_reply(const ak_server *s, const ak_api_request *p);
/* The reply parser of choice `index` of a chat request, call ids seeded by
 * the answer id and the choice. NULL with err set when out of memory. */
ak_toolcall *ak_run_reply_parser(ak_server *s, const ak_api_request *p, const char *id, int index, ak_error *err);

#endif
