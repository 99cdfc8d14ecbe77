/* server_rig.h - what the in-process server tests share: a model, its
 * agents, scheduler and HTTP server started on 127.0.0.1 (rig), and one
 * HTTP exchange on a fresh loopback connection with timeouts (reply). */
#ifndef AK_TEST_SERVER_RIG_H
#define AK_TEST_SERVER_RIG_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "agents/agent.h"
#include "serve/metrics.h"
#include "serve/sched.h"
#include "serve/server.h"
#include "text/tokenizer.h"
#include "test.h"

typedef struct {
    ak_model *m;
    ak_tokenizer *tok;
    ak_block_pool *pool;
    ak_store *store;
    ak_agents *agents;
    ak_metrics *metrics;
    ak_sched *s;
    ak_server *srv;
    int port;
} rig;

typedef struct {
    int status;               /* 0: no answer */
    cJSON *j;                 /* the body parsed (NULL if not JSON) */
    char *body;               /* NUL-terminated; len bytes (binary bodies too) */
    size_t len;
} reply;

/* Starts a server on 127.0.0.1 for model (a path under the shared
 * directory) with agents in K/V formats fk/fv, n_ctx positions, a KV budget
 * (0: none) and the memory directory mem under the test's temp dir.
 * Returns 0, or -1 having failed the test (naming the model). */
int rig_start(ak_test_ctx *t, rig *r, const char *model, size_t budget, const char *mem, ak_kv_format fk,
              ak_kv_format fv, int n_ctx);
/* rig_start with the chat family named (rig_start renders plain). */
typedef struct {
    const char *model, *mem;
    size_t budget;
    ak_kv_format fk, fv;
    int n_ctx;
    ak_chat_family family;
    const char *const *api_keys;   /* the server's keys (server.h), none: no key required */
    int n_api_keys;
    int handoff;                   /* the server's handoff reuse (server.h), 0: off */
    ak_reuse_params handoff_reuse;
} rig_opts;
int rig_start_opts(ak_test_ctx *t, rig *r, const rig_opts *o);
/* The agentkv binary the tests run: AK_BIN, else build/agentkv. */
const char *test_bin(void);
/* Runs cmd under `timeout -k 10 limit_s` (GNU timeout signals the whole
 * process group) with its output to log_name in the test's temp dir.
 * Returns the exit code (124: timed out, 128 + n: killed by signal n); a
 * non-zero code is recorded as a failure with the log's tail. */
int run_script(ak_test_ctx *t, const char *cmd, const char *log_name, int limit_s);
/* Stops and frees it all (the agents flushed first). */
void rig_stop(rig *r);

void reply_free(reply *r);
/* One exchange on a fresh connection (Connection: close), read to EOF;
 * every send and receive bounded by 60 s. accept: an Accept header or
 * NULL. status 0: no answer. */
reply http_ex(int port, const char *method, const char *path, const char *body, const char *accept);
reply http(int port, const char *method, const char *path, const char *body);
/* http_ex with headers: NULL, or header lines each ending in "\r\n". */
reply http_hdr(int port, const char *method, const char *path, const char *body, const char *headers);

/* A JSON object's number / string member (0 / NULL when absent). */
double num(const cJSON *j, const char *name);
const char *str(const cJSON *j, const char *name);
/* The code and message of an OpenAI error body ("" / the raw body if none). */
const char *err_code(const reply *r);
const char *err_msg(const reply *r);
/* Moves the members of the JSON object text extra (NULL: none) into j. */
void json_merge(cJSON *j, const char *extra);
/* The assistant's text of a chat reply (NULL if none). */
const char *answer(const reply *r);

/* The events of an SSE body as JSON objects (an array, [DONE] left out). */
cJSON *sse_events(const char *body);

/* Runs the agentkv binary (AK_BIN, else build/agentkv) with args, bounded
 * by 120 s; returns its exit code and its stderr+stdout in *out (malloc'd). */
int run_cli(const char *args, char **out);

#endif
