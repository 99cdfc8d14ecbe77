/* routes_completions.c - POST /v1/chat/completions and /v1/completions:
 * the body parsed (api.h), the request submitted to the scheduler and its
 * text answered whole or streamed as server-sent events; a client that
 * leaves is noticed and its request cancelled. */
#include "serve/server_impl.h"

#include "base/buf.h"
#include "text/toolcall.h"
#include "serve/logprobs_json.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* A response id: prefix, the server's salt and a serial number. */
static void make_id(ak_server *s, const char *prefix, char *out, size_t cap) {
    pthread_mutex_lock(&s->mu);
    uint64_t n = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    snprintf(out, cap, "%s-%016llx%08llx", prefix, (unsigned long long)s->id_salt, (unsigned long long)n);
}

static const char *finish_name(ak_finish f) { return f == AK_FINISH_LENGTH ? "length" : "stop"; }

/* The usage object of a finished request. */
static cJSON *usage_json(const ak_req_result *res) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", res->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", res->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", res->prompt_tokens + res->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", res->turn.reused);
    /* memory tokens a reuse method recomputed (cacheblend, agentkvshift): part of cached_tokens */
    cJSON_AddNumberToObject(d, "memory_recomputed_tokens", res->mem_recomputed);
    return u;
}

/* agentkv's own object: the agent's tier, reuse and timings. */
static cJSON *agentkv_json(const ak_api_request *p, const ak_req_result *res) {
    cJSON *a = cJSON_CreateObject();
    if (p->agent_id[0]) cJSON_AddStringToObject(a, "agent_id", p->agent_id);
    else cJSON_AddNullToObject(a, "agent_id");
    if (p->pool[0]) cJSON_AddStringToObject(a, "pool", p->pool);
    else cJSON_AddNullToObject(a, "pool");
    cJSON_AddStringToObject(a, "tier", ak_tier_name(res->turn.tier));
    cJSON_AddStringToObject(a, "match", ak_match_name(res->turn.match));
    cJSON_AddNumberToObject(a, "reused", res->turn.reused);
    cJSON_AddNumberToObject(a, "shared", res->turn.shared);
    cJSON_AddNumberToObject(a, "prefilled", res->turn.prefilled);
    cJSON_AddNumberToObject(a, "restore_ms", res->turn.restore_ms);
    cJSON_AddBoolToObject(a, "restored_ahead", res->turn.restored_ahead);
    cJSON_AddNumberToObject(a, "prefill_ms", res->turn.prefill_ms);
    cJSON_AddNumberToObject(a, "memory_reuse_ms", res->mem_ms);
    cJSON_AddNumberToObject(a, "queue_ms", res->queue_ms);
    cJSON_AddNumberToObject(a, "ttft_ms", res->ttft_ms);
    cJSON_AddNumberToObject(a, "decode_ms", res->decode_ms);
    cJSON_AddNumberToObject(a, "evicted", res->turn.evicted);
    return a;
}

/* The skeleton of a response or chunk object. */
static cJSON *response_head(ak_server *s, const ak_api_request *p, const char *id, long created, int chunk) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "object", p->chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
    cJSON_AddNumberToObject(j, "created", (double)created);
    cJSON_AddStringToObject(j, "model", s->cfg.model_id);
    cJSON_AddStringToObject(j, "system_fingerprint", s->cfg.model->fingerprint);
    return j;
}

/* A new choice object of index `index` appended to j's "choices" (made if
 * need be). */
static cJSON *new_choice(cJSON *j, int index) {
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(j, "choices");
    if (!choices) choices = cJSON_AddArrayToObject(j, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", index);
    return c;
}

/* Choice `index`: for chat chunks a delta, for chat a message, else text.
 * Returns the choice object. */
static cJSON *add_choice(cJSON *j, const ak_api_request *p, int chunk, int index, const char *role, const char *text,
                         const char *finish) {
    cJSON *c = new_choice(j, index);
    if (p->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, chunk ? "delta" : "message");
        if (role) cJSON_AddStringToObject(m, "role", role);
        if (text) cJSON_AddStringToObject(m, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text ? text : "");
    }
    cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    return c;
}

/* 1 when a chat reply goes through the reply parser: tools may be called,
 * or the family writes reasoning (qwen3, deepseek3). */
static int parsed_reply(const ak_server *s, const ak_api_request *p) {
    return p->chat && ((p->tools.n_tools > 0 && p->tools.choice != AK_TOOL_CHOICE_NONE) ||
                       s->cfg.family == AK_CHAT_QWEN3 || s->cfg.family == AK_CHAT_DEEPSEEK3);
}

/* The reply parser of choice `index` of a chat request (toolcall.h):
 * content, reasoning and the calls apart, ids seeded by the response id and
 * the choice. NULL with err set when out of memory. */
static ak_toolcall *reply_parser(ak_server *s, const ak_api_request *p, const char *id, int index, ak_error *err) {
    uint64_t seed = 1469598103934665603ull;   /* FNV-1a of the response id: ids differ per response */
    for (const char *c = id; *c; c++) seed = (seed ^ (uint8_t)*c) * 1099511628211ull;
    if (index) seed = (seed ^ (uint64_t)index) * 1099511628211ull;   /* and per choice */
    const ak_toolcall_opts o = {.family = s->cfg.family,
                                .tools = p->tools.n_tools > 0 && p->tools.choice != AK_TOOL_CHOICE_NONE,
                                .parallel = p->tools.parallel, .in_reasoning = p->tools.in_reasoning, .id_seed = seed};
    return ak_toolcall_new(&o, err);
}

/* A chat choice's finish reason: tool_calls when the reply made calls and
 * was not cut. */
static const char *chat_finish(ak_finish f, const ak_toolcall *tc) {
    return ak_toolcall_n_calls(tc) > 0 && f != AK_FINISH_LENGTH ? "tool_calls" : finish_name(f);
}

/* A tool call as OpenAI writes it in a message or a delta: index (deltas
 * only, index >= 0), id and type when id is given (a call's start), the
 * function's name (NULL: none), arguments (NULL: none). */
static cJSON *call_json(int index, const char *id, const char *name, const char *args) {
    cJSON *c = cJSON_CreateObject();
    if (index >= 0) cJSON_AddNumberToObject(c, "index", index);
    if (id) cJSON_AddStringToObject(c, "id", id);
    if (id) cJSON_AddStringToObject(c, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(c, "function");
    if (name) cJSON_AddStringToObject(f, "name", name);
    if (args) cJSON_AddStringToObject(f, "arguments", args);
    return c;
}

/* The delta of one parser event; NULL for events that make none (a call's end). */
static cJSON *event_delta(const ak_toolcall_event *e) {
    cJSON *d = NULL, *calls;
    switch (e->kind) {
    case AK_TOOLCALL_CONTENT:
    case AK_TOOLCALL_REASONING:
        d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, e->kind == AK_TOOLCALL_CONTENT ? "content" : "reasoning_content", e->text);
        break;
    case AK_TOOLCALL_CALL_START:
    case AK_TOOLCALL_ARGS:
        d = cJSON_CreateObject();
        calls = cJSON_AddArrayToObject(d, "tool_calls");
        cJSON_AddItemToArray(calls, e->kind == AK_TOOLCALL_ARGS ? call_json(e->index, NULL, NULL, e->text)
                                                                : call_json(e->index, e->id, e->name, ""));
        break;
    case AK_TOOLCALL_CALL_END: break;
    }
    return d;
}

/* The message of a whole chat reply: content (null when only calls came),
 * reasoning_content when there was reasoning, tool_calls. */
static cJSON *reply_message(const ak_toolcall *tc) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    size_t nc = 0, nr = 0;
    const char *content = ak_toolcall_content(tc, &nc), *reasoning = ak_toolcall_reasoning(tc, &nr);
    int calls = ak_toolcall_n_calls(tc);
    if (!nc && calls) cJSON_AddNullToObject(m, "content");
    else cJSON_AddStringToObject(m, "content", content);
    if (nr) cJSON_AddStringToObject(m, "reasoning_content", reasoning);
    if (calls) {
        cJSON *a = cJSON_AddArrayToObject(m, "tool_calls");
        for (int i = 0; i < calls; i++) {
            const ak_toolcall_call *c = ak_toolcall_get(tc, i);
            cJSON_AddItemToArray(a, call_json(-1, c->id, c->name, c->arguments));
        }
    }
    return m;
}

/* Chat choice `index` holding msg (consumed; NULL: an empty one) as its
 * message or delta. Returns the choice object. */
static cJSON *add_chat_choice(cJSON *j, int chunk, int index, cJSON *msg, const char *finish) {
    cJSON *c = new_choice(j, index);
    cJSON_AddItemToObject(c, chunk ? "delta" : "message", msg ? msg : cJSON_CreateObject());
    cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    return c;
}

/* What an SSE stream sent of one choice. */
typedef struct {
    size_t have;              /* text bytes already sent */
    int sent_role;            /* chat: its role chunk was sent */
    int ended;                /* its finish chunk was sent */
    ak_toolcall *tc;          /* a parsed reply's parser (parsed_reply), else NULL */
    ak_lp_cursor lp;          /* log-probabilities sent (p.logprobs) */
} stream_choice;

/* The state of one SSE stream. */
typedef struct {
    ak_server *s;
    ak_request *r;
    ak_api_request p;
    char id[64];
    long created;
    ak_buf out;               /* formatted events not yet handed to MHD */
    int fd;                   /* the client's socket, to notice it leaving (-1: unknown) */
    size_t out_pos;           /* bytes of out already handed to MHD */
    int ended;                /* [DONE] is written */
    uint64_t seen;            /* the request's version (ak_req_result.version) already answered */
    stream_choice ch[AK_MAX_CHOICES];   /* p.n of them */
} stream;

/* Which of a request's log-probabilities add_logprobs puts in a choice. */
enum {
    LP_CHUNK = 0,   /* those of the tokens whose text starts in the text given */
    LP_REST = 1,    /* all the rest (the request has ended) */
    LP_WHOLE = 3    /* all the rest, as an object even with none (a whole answer) */
};

/* What add_logprobs puts where: choice `choice` of the request, in the
 * answer's choice object c. */
typedef struct {
    ak_request *r;
    int choice;
    cJSON *c;
} lp_target;

/* When p asked for log-probabilities, puts those of the target choice's
 * tokens that `which` names (text[0..n): the choice's text from cur's
 * place on) in its choice object (ak_logprobs_add). Returns 0, or -1 when
 * out of memory. */
static int add_logprobs(ak_server *s, const ak_api_request *p, const lp_target *to, ak_lp_cursor *cur,
                        const char *text, size_t n, int which) {
    if (!p->logprobs) return 0;
    ak_lp_add a = {.r = to->r, .choice = to->choice, .tk = s->cfg.tok, .chat = p->chat, .text = text, .n = n,
                   .upto = (which & LP_REST) ? (size_t)-1 : cur->bytes + n, .always = which == LP_WHOLE};
    return ak_logprobs_add(to->c, &a, cur);
}

/* 1 when the peer has closed or reset the connection (or shut down its
 * sending side: an HTTP client does that only when leaving). Data waiting to
 * be read (a pipelined request) is not a departure. Never blocks. */
static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd pf = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pf, 1, 0) <= 0) return 0;
    if (pf.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) return 1;
    char ch;
    ssize_t n = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* How often a waiting handler looks at its client's socket: a client that
 * leaves is noticed within this time and its request cancelled (it then ends
 * at the engine's next step). */
#define AK_GONE_POLL_MS 50

/* Waits (no limit) until r has news past version `seen` (sched.h:
 * ak_request_wait_news) or, with until_done, until it finished, watching
 * the client: returns 1 when r finished, 0 on news, -1 when the client left
 * (r is then cancelled). */
static int wait_watching(ak_request *r, uint64_t seen, int until_done, int fd) {
    for (;;) {
        int done = until_done ? ak_request_wait(r, (size_t)-1, AK_GONE_POLL_MS)
                              : ak_request_wait_news(r, seen, AK_GONE_POLL_MS);
        if (done) return 1;
        ak_req_result res;
        ak_request_read(r, 0, NULL, NULL, &res);
        if (!until_done && res.version != seen) return 0;
        if (client_gone(fd)) {
            ak_request_cancel(r);
            return -1;
        }
    }
}

/* Appends one SSE event "data: JSON\n\n" for j (consumed) to the stream's
 * output. Returns 0, or -1 when out of memory (the stream then ends). */
static int emit(stream *st, cJSON *j) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    const char *src = s ? s : "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
    int rc = ak_buf_puts(&st->out, "data: ") | ak_buf_puts(&st->out, src) | ak_buf_puts(&st->out, "\n\n");
    free(s);
    return rc ? -1 : 0;
}

/* One chunk of choice `index` per event of a parser feed or finish (n
 * events at ev; n < 0: the parser failed, out of memory). Returns 0, or -1
 * (the stream ends). */
static int emit_events(stream *st, int index, const ak_toolcall_event *ev, int n) {
    if (n < 0) return -1;
    for (int i = 0; i < n; i++) {
        cJSON *d = event_delta(&ev[i]);
        if (!d) continue;
        cJSON *j = response_head(st->s, &st->p, st->id, st->created, 1);
        add_chat_choice(j, 1, index, d, NULL);
        if (emit(st, j) < 0) return -1;
    }
    return 0;
}

/* The status of a request that failed in the engine: its code's
 * (ak_http_status_of), but no KV room before admission means the request
 * can never fit, even alone (the scheduler waits for room while others
 * run): the client's error, 400. */
static int failed_status(const ak_req_result *res) {
    if (res->code == AK_ERR_KV_BUDGET && !res->admitted) return 400;
    return ak_http_status_of(res->code);
}

/* New text of choice i (chunk[0..n)) as chunks: a parsed reply's events
 * (content, reasoning and calls apart; no streamed logprobs), else the
 * text with the log-probabilities of its tokens. Returns 0, or -1 (the
 * stream ends). */
static int emit_text(stream *st, int i, const char *chunk, size_t n) {
    stream_choice *sc = &st->ch[i];
    if (sc->tc) {
        const ak_toolcall_event *ev = NULL;
        ak_error err = {0};
        int ne = ak_toolcall_feed(sc->tc, chunk, n, &ev, &err);
        return emit_events(st, i, ev, ne);
    }
    cJSON *j = response_head(st->s, &st->p, st->id, st->created, 1);
    lp_target to = {.r = st->r, .choice = i, .c = add_choice(j, &st->p, 1, i, NULL, chunk, NULL)};
    if (add_logprobs(st->s, &st->p, &to, &sc->lp, chunk, n, LP_CHUNK) < 0) {
        cJSON_Delete(j);
        return -1;
    }
    return emit(st, j);
}

/* The end of choice i as res says it: a parsed reply's last events, then
 * its finish chunk with the log-probabilities left (tokens of no text
 * left) and, once the request finished (done), the agentkv object.
 * Returns 0, or -1 (the stream ends). */
static int emit_choice_end(stream *st, int i, const ak_req_result *res, int done) {
    stream_choice *sc = &st->ch[i];
    ak_finish f = res->choice_finish[i];
    if (sc->tc) {
        const ak_toolcall_event *ev = NULL;
        ak_error err = {0};
        int ne = ak_toolcall_finish(sc->tc, &ev, &err);
        if (emit_events(st, i, ev, ne) < 0) return -1;
    }
    cJSON *j = response_head(st->s, &st->p, st->id, st->created, 1);
    lp_target to = {.r = st->r, .choice = i,
                    .c = sc->tc ? add_chat_choice(j, 1, i, NULL, chat_finish(f, sc->tc))
                                : add_choice(j, &st->p, 1, i, NULL, NULL, finish_name(f))};
    add_logprobs(st->s, &st->p, &to, &sc->lp, NULL, 0, LP_REST);
    if (done) cJSON_AddItemToObject(j, "agentkv", agentkv_json(&st->p, res));
    sc->ended = 1;
    return emit(st, j);
}

/* 1 when res says some choice of r other than i still runs. */
static int others_running(const ak_req_result *res, int i) {
    for (int k = 0; k < res->n_choices; k++)
        if (k != i && res->choice_finish[k] == AK_FINISH_NONE) return 1;
    return 0;
}

/* What choice i has new: its text, and its end once its text is whole. The
 * last choice to end waits for the request's end, so that its finish chunk
 * carries the whole agentkv object (with one choice, as it always did).
 * Returns 0, or -1 (the stream ends). */
static int choice_news(stream *st, int i) {
    stream_choice *sc = &st->ch[i];
    char *chunk = NULL;
    size_t n = 0;
    ak_req_result res;   /* read with the text: once it says the choice ended, the text is whole */
    sc->have = ak_request_read_choice(st->r, i, sc->have, &chunk, &n, &res);
    int rc = n ? emit_text(st, i, chunk, n) : 0;
    free(chunk);
    if (rc < 0 || res.finish == AK_FINISH_ERROR || res.choice_finish[i] == AK_FINISH_NONE) return rc;
    int done = res.finish != AK_FINISH_NONE;
    return done || others_running(&res, i) ? emit_choice_end(st, i, &res, done) : 0;
}

/* Adds the stream's next events to its output, waiting for them: the roles
 * (chat), then each choice's news, then at the request's end the usage
 * (when asked) and [DONE], or the engine's error. Returns 0, or -1 (the
 * stream ends with an error: out of memory, the client left). */
static int stream_fill(stream *st) {
    int roles = 0;
    for (int i = 0; st->p.chat && i < st->p.n; i++) {
        if (st->ch[i].sent_role) continue;
        cJSON *j = response_head(st->s, &st->p, st->id, st->created, 1);
        add_choice(j, &st->p, 1, i, "assistant", "", NULL);
        st->ch[i].sent_role = roles = 1;
        if (emit(st, j) < 0) return -1;
    }
    if (roles) return 0;
    if (wait_watching(st->r, st->seen, 0, st->fd) < 0) return -1;   /* the client left */
    ak_req_result res;
    ak_request_read(st->r, 0, NULL, NULL, &res);
    st->seen = res.version;   /* what changes from here on is news for the next wait */
    for (int i = 0; i < st->p.n; i++)
        if (!st->ch[i].ended && choice_news(st, i) < 0) return -1;
    ak_request_read(st->r, 0, NULL, NULL, &res);
    if (res.finish == AK_FINISH_NONE) return 0;
    if (res.finish == AK_FINISH_ERROR) {
        emit(st, ak_http_error_json(failed_status(&res), res.error, NULL, NULL));
    } else {
        for (int i = 0; i < st->p.n; i++)
            if (!st->ch[i].ended) return 0;   /* its end comes at the next round */
        if (st->p.include_usage) {
            cJSON *j = response_head(st->s, &st->p, st->id, st->created, 1);
            cJSON_AddArrayToObject(j, "choices");
            cJSON_AddItemToObject(j, "usage", usage_json(&res));
            cJSON_AddItemToObject(j, "agentkv", agentkv_json(&st->p, &res));
            emit(st, j);
        }
    }
    if (ak_buf_puts(&st->out, "data: [DONE]\n\n") < 0) return -1;
    st->ended = 1;
    return 0;
}

/* libmicrohttpd's content reader of an SSE stream: the events as
 * stream_fill makes them. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    while (st->out_pos == st->out.len) {
        st->out_pos = 0;
        ak_buf_clear(&st->out);
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        if (stream_fill(st) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = st->out.len - st->out_pos;
    if (n > max) n = max;
    memcpy(buf, st->out.p + st->out_pos, n);
    st->out_pos += n;
    return (ssize_t)n;
}

/* libmicrohttpd's end of a stream: the request is cancelled if it runs. */
static void stream_free(void *cls) {
    stream *st = cls;
    ak_request_cancel(st->r); /* a no-op when it finished */
    ak_request_release(st->r);
    for (int i = 0; i < st->p.n; i++) ak_toolcall_free(st->ch[i].tc);
    ak_api_request_free(&st->p);
    ak_buf_free(&st->out);
    free(st);
}

/* The client of a running request closed its connection: the request was
 * cancelled (it ends at the engine's next step, its agent keeping what was
 * computed); counted as status 499 (nginx's "client closed request"). Closes
 * the connection. */
static enum MHD_Result client_left(ak_server *s, ak_request *r, ak_api_request *p, const char *ep) {
    ak_request_release(r);
    ak_api_request_free(p);
    ak_metrics_request(s->cfg.metrics, ep, 499);
    return MHD_NO;
}

/* OpenAI's error code (and its param) for a request that failed with an
 * ak_err_code in the engine: a pool that vanished or broke between parsing
 * and admission, no KV room. NULL when there is none to give. */
static const char *code_of(int code, const char **param) {
    *param = NULL;
    switch (code) {
    case AK_ERR_NOT_FOUND: *param = "pool"; return "pool_not_found";
    case AK_ERR_STALE: *param = "pool"; return "pool_stale";
    case AK_ERR_CORRUPT: *param = "pool"; return "pool_corrupt";
    case AK_ERR_KV_BUDGET: return "kv_budget";
    default: return NULL;
    }
}

/* ak_api_pool_fn for the parser: the pool's tokens from the engine. */
static int pool_lookup(void *ud, const char *id, int32_t **tokens, int *n, char **source, ak_error *err) {
    ak_server *s = ud;
    return ak_sched_pool_tokens(s->cfg.sched, id, tokens, n, source, err);
}

/* ak_api_memory_fn for the parser: the memory's tokens from the engine. */
static int memory_lookup(void *ud, const char *id, int32_t **tokens, int *n, ak_error *err) {
    ak_server *s = ud;
    return ak_sched_memory_tokens(s->cfg.sched, id, tokens, n, err);
}

ak_api_config ak_server_api_config(ak_server *s) {
    return (ak_api_config){.tok = s->cfg.tok, .model_id = s->cfg.model_id, .family = s->cfg.family,
                           .template_text = s->cfg.template_text, .n_ctx = s->cfg.n_ctx, .pool_lookup = pool_lookup,
                           .pool_ud = s, .memory_lookup = memory_lookup, .memory_ud = s, .grammars = s->grammars};
}

/* The scheduler's parameters of a parsed request (pointing into p). */
static ak_req_params req_params(ak_api_request *p) {
    ak_req_params rp = {.agent_id = p->agent_id, .pool = p->pool, .prompt = p->tokens, .n_prompt = (int)p->n_tokens,
                        .logprobs = p->logprobs, .top_logprobs = p->top_logprobs,
                        .max_tokens = p->max_tokens, .sp = p->sp, .n_stop = p->n_stop, .stop_at_eog = 1,
                        /* full: the same prompt computed as a plain one, from the first memory on */
                        .n_mem = p->n_mem, .mem_full = p->reuse == AK_REUSE_FULL, .mem_method = p->reuse,
                        .mem_ratio = (float)p->recompute_ratio, .reprompt = ak_api_reprompt(p),
                        .grammar = p->grammar, .grammar_after = p->grammar_after,
                        .grammar_required = p->grammar_required, .grammar_free_after = p->grammar_free_after,
                        .n_choices = p->n};
    for (int i = 0; i < p->n_stop; i++) rp.stop[i] = p->stop[i];
    for (int i = 0; i < p->n_mem; i++) {
        rp.mem_id[i] = p->mem_id[i];
        rp.mem_at[i] = p->mem_at[i];
        rp.mem_len[i] = p->mem_len[i];
    }
    return rp;
}

/* Choice i of finished request r appended whole to answer j: its text (a
 * chat reply parsed into content, reasoning and calls when parsed_reply
 * says), finish reason and log-probabilities; id is the response's.
 * Returns 0, or -1 when out of memory. */
static int add_whole_choice(ak_server *s, const ak_api_request *p, ak_request *r, cJSON *j, const char *id, int i) {
    char *text = NULL;
    size_t n = 0;
    ak_req_result res;
    ak_error err = {0};
    ak_request_read_choice(r, i, 0, &text, &n, &res);
    ak_finish f = res.choice_finish[i];
    int rc = 0;
    lp_target to = {.r = r, .choice = i};
    if (parsed_reply(s, p)) {
        ak_toolcall *tc = reply_parser(s, p, id, i, &err);
        const ak_toolcall_event *ev = NULL;
        if (!tc || ak_toolcall_feed(tc, text ? text : "", n, &ev, &err) < 0 || ak_toolcall_finish(tc, &ev, &err) < 0)
            rc = -1;   /* out of memory */
        if (tc) to.c = add_chat_choice(j, 0, i, reply_message(tc), chat_finish(f, tc));
        ak_toolcall_free(tc);
    } else {
        to.c = add_choice(j, p, 0, i, "assistant", text ? text : "", finish_name(f));
    }
    ak_lp_cursor lc = {0};
    if (rc == 0) rc = add_logprobs(s, p, &to, &lc, text, n, LP_WHOLE);
    free(text);
    return rc;
}

/* A completion (chat: rendered messages, else a raw prompt): submitted,
 * then answered once finished, or streamed (SSE) from its first text. */
static enum MHD_Result complete(const ak_route_req *q, int chat) {
    ak_server *s = q->s;
    struct MHD_Connection *c = q->c;
    ak_conn *cn = q->cn;
    const char *ep = q->ep;
    ak_api_config ac = ak_server_api_config(s);
    pthread_mutex_lock(&s->mu);
    uint64_t seed = (uint64_t)time(NULL) ^ (s->id_salt + s->next_id * 0x9E3779B97F4A7C15ull);
    pthread_mutex_unlock(&s->mu);
    ak_api_request p;
    ak_api_error b;
    if (ak_api_parse(&ac, cn->body, cn->len, chat, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Agent-Id"), seed,
                     &p, &b) < 0)
        return ak_http_error(s, c, ep, b.status, b.param, b.code, "%s", b.msg);
    ak_server_release_body(s, cn);   /* parsed: the body no longer counts while the request runs */
    int fd = ak_server_conn_fd(c);
    ak_req_params rp = req_params(&p);
    ak_error err = {0};
    ak_request *r = ak_sched_submit(s->cfg.sched, &rp, &err);
    if (r) p.resend = NULL;   /* the scheduler's now */
    if (!r) {
        ak_api_request_free(&p);
        /* KV_BUDGET here: larger than the whole budget, it can never run */
        int status = err.code == AK_ERR_KV_BUDGET ? 400 : ak_http_status_of(err.code);
        return ak_http_error(s, c, ep, status, status == 400 ? "max_tokens" : NULL, NULL, "%s", err.msg);
    }
    char id[64];
    make_id(s, chat ? "chatcmpl" : "cmpl", id, sizeof id);
    long created = (long)time(NULL);
    /* wait for the first text (or the end), so that a request that fails
     * in the queue still gets its own HTTP status */
    if (wait_watching(r, 0, 0, fd) < 0) return client_left(s, r, &p, ep);
    ak_req_result res;
    ak_request_read(r, 0, NULL, NULL, &res);
    if (res.finish == AK_FINISH_ERROR) {
        ak_request_release(r);
        ak_api_request_free(&p);
        const char *param, *code = code_of(res.code, &param);
        if (p.n_mem && param && !strcmp(param, "pool")) {   /* a memory that vanished or broke since the parse */
            param = "memories";
            code = res.code == AK_ERR_NOT_FOUND ? "memory_not_found" : res.code == AK_ERR_STALE ? "memory_stale"
                                                                                                 : "memory_corrupt";
        }
        return ak_http_error(s, c, ep, failed_status(&res), param, code, "%s", res.error);
    }
    if (p.stream) {
        stream *st = calloc(1, sizeof *st);
        if (!st) {
            ak_request_cancel(r);
            ak_request_release(r);
            ak_api_request_free(&p);
            return ak_http_error(s, c, ep, 500, NULL, NULL, "out of memory");
        }
        st->s = s;
        st->fd = fd;
        st->r = r;
        st->p = p;
        st->created = created;
        snprintf(st->id, sizeof st->id, "%s", id);
        for (int i = 0; i < st->p.n && parsed_reply(s, &st->p); i++)   /* one parser per choice */
            if (!(st->ch[i].tc = reply_parser(s, &st->p, id, i, &err))) {
                stream_free(st);
                return ak_http_error(s, c, ep, 500, NULL, NULL, "out of memory");
            }
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
        if (!resp) {
            stream_free(st);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        ak_http_add_cors(s, c, resp);
        enum MHD_Result rc = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        ak_metrics_request(s->cfg.metrics, ep, 200);
        return rc;
    }
    if (wait_watching(r, 0, 1, fd) < 0) return client_left(s, r, &p, ep);
    ak_request_read(r, 0, NULL, NULL, &res);
    if (res.finish == AK_FINISH_ERROR) {
        ak_request_release(r);
        ak_api_request_free(&p);
        return ak_http_error(s, c, ep, failed_status(&res), NULL, NULL, "%s", res.error);
    }
    cJSON *j = response_head(s, &p, id, created, 0);
    int rc = 0;
    for (int i = 0; i < p.n && rc == 0; i++) rc = add_whole_choice(s, &p, r, j, id, i);
    ak_request_release(r);
    if (rc < 0) {
        cJSON_Delete(j);
        ak_api_request_free(&p);
        return ak_http_error(s, c, ep, 500, NULL, NULL, "out of memory");
    }
    cJSON_AddItemToObject(j, "usage", usage_json(&res));
    cJSON_AddItemToObject(j, "agentkv", agentkv_json(&p, &res));
    ak_api_request_free(&p);
    return ak_http_json(s, c, ep, 200, j);
}

enum MHD_Result ak_route_chat(const ak_route_req *q) { return complete(q, 1); }

enum MHD_Result ak_route_completion(const ak_route_req *q) { return complete(q, 0); }
