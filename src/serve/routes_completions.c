/* routes_completions.c - POST /v1/chat/completions and /v1/completions:
 * the body parsed (api.h), the request submitted to the scheduler and its
 * text answered whole or streamed as server-sent events; a client that
 * leaves is noticed and its request cancelled. */
#include "serve/run.h"

#include "base/buf.h"
#include "text/toolcall.h"
#include "serve/logprobs_json.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

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
    /* tokens placed from another agent's KV (handoff reuse), and those of them recomputed */
    cJSON_AddNumberToObject(d, "handoff_reused_tokens", res->handoff_reused);
    cJSON_AddNumberToObject(d, "handoff_recomputed_tokens", res->handoff_recomputed);
    return u;
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
    ak_toolcall *tc;          /* a parsed reply's parser (ak_run_parsed_reply), else NULL */
    ak_lp_cursor lp;          /* log-probabilities sent (p.logprobs) */
} stream_choice;

/* The state of one SSE stream. */
typedef struct {
    ak_server *s;
    ak_run run;               /* the request, its parse, id and client socket */
    ak_buf out;               /* formatted events not yet handed to MHD */
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
        cJSON *j = response_head(st->s, &st->run.p, st->run.id, st->run.created, 1);
        add_chat_choice(j, 1, index, d, NULL);
        if (emit(st, j) < 0) return -1;
    }
    return 0;
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
    cJSON *j = response_head(st->s, &st->run.p, st->run.id, st->run.created, 1);
    lp_target to = {.r = st->run.r, .choice = i, .c = add_choice(j, &st->run.p, 1, i, NULL, chunk, NULL)};
    if (add_logprobs(st->s, &st->run.p, &to, &sc->lp, chunk, n, LP_CHUNK) < 0) {
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
    cJSON *j = response_head(st->s, &st->run.p, st->run.id, st->run.created, 1);
    lp_target to = {.r = st->run.r, .choice = i,
                    .c = sc->tc ? add_chat_choice(j, 1, i, NULL, chat_finish(f, sc->tc))
                                : add_choice(j, &st->run.p, 1, i, NULL, NULL, finish_name(f))};
    add_logprobs(st->s, &st->run.p, &to, &sc->lp, NULL, 0, LP_REST);
    if (done) cJSON_AddItemToObject(j, "agentkv", ak_run_agentkv_json(&st->run.p, res));
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
    sc->have = ak_request_read_choice(st->run.r, i, sc->have, &chunk, &n, &res);
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
    for (int i = 0; st->run.p.chat && i < st->run.p.n; i++) {
        if (st->ch[i].sent_role) continue;
        cJSON *j = response_head(st->s, &st->run.p, st->run.id, st->run.created, 1);
        add_choice(j, &st->run.p, 1, i, "assistant", "", NULL);
        st->ch[i].sent_role = roles = 1;
        if (emit(st, j) < 0) return -1;
    }
    if (roles) return 0;
    if (ak_run_wait_news(&st->run, st->seen, 0) < 0) return -1;   /* the client left */
    ak_req_result res;
    ak_request_read(st->run.r, 0, NULL, NULL, &res);
    st->seen = res.version;   /* what changes from here on is news for the next wait */
    for (int i = 0; i < st->run.p.n; i++)
        if (!st->ch[i].ended && choice_news(st, i) < 0) return -1;
    ak_request_read(st->run.r, 0, NULL, NULL, &res);
    if (res.finish == AK_FINISH_NONE) return 0;
    if (res.finish == AK_FINISH_ERROR) {
        emit(st, ak_http_error_json(ak_run_failed_status(&res), res.error, NULL, NULL));
    } else {
        for (int i = 0; i < st->run.p.n; i++)
            if (!st->ch[i].ended) return 0;   /* its end comes at the next round */
        if (st->run.p.include_usage) {
            cJSON *j = response_head(st->s, &st->run.p, st->run.id, st->run.created, 1);
            cJSON_AddArrayToObject(j, "choices");
            cJSON_AddItemToObject(j, "usage", usage_json(&res));
            cJSON_AddItemToObject(j, "agentkv", ak_run_agentkv_json(&st->run.p, &res));
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
    ak_request_cancel(st->run.r); /* a no-op when it finished */
    for (int i = 0; i < st->run.p.n; i++) ak_toolcall_free(st->ch[i].tc);
    ak_run_free(&st->run);
    ak_buf_free(&st->out);
    free(st);
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

/* Choice i of finished request r appended whole to answer j: its text (a
 * chat reply parsed into content, reasoning and calls when ak_run_parsed_reply
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
    if (ak_run_parsed_reply(s, p)) {
        ak_toolcall *tc = ak_run_reply_parser(s, p, id, i, &err);
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
    const char *ep = q->ep;
    ak_run run;
    enum MHD_Result reply;
    const ak_run_args a = {.body = q->cn->body, .len = q->cn->len, .chat = chat, .id_prefix = chat ? "chatcmpl" : "cmpl",
                           .agent_header = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Agent-Id")};
    if (!ak_run_start(q, &a, &run, &reply)) return reply;
    ak_error err = {0};
    if (run.p.stream) {
        stream *st = calloc(1, sizeof *st);
        if (!st) {
            ak_request_cancel(run.r);
            ak_run_free(&run);
            return ak_http_error(s, c, ep, 500, NULL, NULL, "out of memory");
        }
        st->s = s;
        st->run = run;
        for (int i = 0; i < st->run.p.n && ak_run_parsed_reply(s, &st->run.p); i++)   /* one parser per choice */
            if (!(st->ch[i].tc = ak_run_reply_parser(s, &st->run.p, st->run.id, i, &err))) {
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
    if (ak_run_wait_news(&run, 0, 1) < 0) return ak_run_client_left(q, &run);
    ak_req_result res;
    ak_request_read(run.r, 0, NULL, NULL, &res);
    if (res.finish == AK_FINISH_ERROR) {
        ak_run_free(&run);
        return ak_http_error(s, c, ep, ak_run_failed_status(&res), NULL, NULL, "%s", res.error);
    }
    cJSON *j = response_head(s, &run.p, run.id, run.created, 0);
    int rc = 0;
    for (int i = 0; i < run.p.n && rc == 0; i++) rc = add_whole_choice(s, &run.p, run.r, j, run.id, i);
    if (rc < 0) {
        cJSON_Delete(j);
        ak_run_free(&run);
        return ak_http_error(s, c, ep, 500, NULL, NULL, "out of memory");
    }
    cJSON_AddItemToObject(j, "usage", usage_json(&res));
    cJSON_AddItemToObject(j, "agentkv", ak_run_agentkv_json(&run.p, &res));
    ak_run_free(&run);
    return ak_http_json(s, c, ep, 200, j);
}

enum MHD_Result ak_route_chat(const ak_route_req *q) { return complete(q, 1); }

enum MHD_Result ak_route_completion(const ak_route_req *q) { return complete(q, 0); }
