/* server.c - see server.h */
#include "server.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct ak_server {
    ak_server_config cfg;
    struct MHD_Daemon *d;
    int port;
    pthread_mutex_t mu;       /* guards next_id */
    uint64_t next_id;
    uint64_t id_salt;
};

/* One connection's request: its body as it arrives. */
typedef struct {
    char *body;
    size_t len, cap;
    int too_large;
} conn;

#define logf_(s, ...) ak_logf((s)->cfg.log, (s)->cfg.log_ud, __VA_ARGS__)

/* ------------------------------------------------------------ responses */

static enum MHD_Result send_body(ak_server *s, struct MHD_Connection *c, const char *endpoint, int status,
                                 char *body, const char *content_type) {
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                                  "\"code\":null}}";
        body = strdup(oom);
        status = 500;
        if (!body) return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", content_type);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    ak_metrics_request(s->cfg.metrics, endpoint, status);
    return rc;
}

static enum MHD_Result send_json(ak_server *s, struct MHD_Connection *c, const char *endpoint, int status,
                                 cJSON *j) {
    char *body = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return send_body(s, c, endpoint, status, body, "application/json");
}

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

static cJSON *error_json(int status, const char *message, const char *param, const char *code) {
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", error_type(status));
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    return j;
}

static enum MHD_Result send_error(ak_server *s, struct MHD_Connection *c, const char *endpoint, int status,
                                  const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static enum MHD_Result send_error(ak_server *s, struct MHD_Connection *c, const char *endpoint, int status,
                                  const char *param, const char *code, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return send_json(s, c, endpoint, status, error_json(status, msg, param, code));
}

/* ---------------------------------------------------- request parsing */

/* What a completion request asks for, validated. */
typedef struct {
    int chat;
    char agent_id[AK_AGENT_ID_MAX + 1];
    int32_t *tokens;
    size_t n_tokens;
    int max_tokens;           /* 0: not given */
    ak_sampler_params sp;
    char *stop[AK_MAX_STOP];
    int n_stop;
    int stream, include_usage;
} parsed;

static void free_parsed(parsed *p) {
    free(p->tokens);
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
}

/* A parse failure: status, param, code and message for the error body. */
typedef struct {
    int status;
    const char *param, *code;
    char msg[600];
} bad;

static int fail_bad(bad *b, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail_bad(bad *b, int status, const char *param, const char *code, const char *fmt, ...) {
    b->status = status;
    b->param = param;
    b->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->msg, sizeof b->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* Message content: a string, or an array of {"type": "text", "text": ...}
 * parts (concatenated). Returns a malloc'd string or NULL (b set). */
static char *content_text(const cJSON *content, int i, bad *b) {
    if (cJSON_IsString(content)) return strdup(content->valuestring);
    if (cJSON_IsNull(content)) return strdup("");
    if (!cJSON_IsArray(content)) {
        fail_bad(b, 400, "messages", "invalid_type", "messages[%d].content must be a string or an array of text parts", i);
        return NULL;
    }
    size_t len = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
            fail_bad(b, 400, "messages", "invalid_type",
                     "messages[%d].content: only parts of type \"text\" with a string \"text\" are supported", i);
            return NULL;
        }
        len += strlen(text->valuestring);
    }
    char *out = malloc(len + 1);
    if (!out) return NULL;
    out[0] = 0;
    size_t at = 0;
    cJSON_ArrayForEach(part, content) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t l = strlen(t);
        memcpy(out + at, t, l);
        at += l;
    }
    out[at] = 0;
    return out;
}

/* Renders and tokenizes the messages of a chat request into p->tokens. */
static int parse_messages(ak_server *s, const cJSON *msgs, parsed *p, bad *b) {
    if (!msgs) return fail_bad(b, 400, "messages", "missing_required_parameter", "messages is required");
    if (!cJSON_IsArray(msgs)) return fail_bad(b, 400, "messages", "invalid_type", "messages must be an array");
    int n = cJSON_GetArraySize(msgs);
    if (n < 1) return fail_bad(b, 400, "messages", "invalid_value", "messages must not be empty");
    ak_chat_msg *m = calloc((size_t)n, sizeof *m);
    char **texts = calloc((size_t)n, sizeof *texts);
    int rc = -1;
    if (!m || !texts) { fail_bad(b, 500, NULL, NULL, "out of memory"); goto done; }
    for (int i = 0; i < n; i++) {
        const cJSON *msg = cJSON_GetArrayItem(msgs, i);
        if (!cJSON_IsObject(msg)) { fail_bad(b, 400, "messages", "invalid_type", "messages[%d] must be an object", i); goto done; }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsString(role)) { fail_bad(b, 400, "messages", "invalid_type", "messages[%d].role must be a string", i); goto done; }
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system"; /* OpenAI's newer name for the system role */
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")) {
            fail_bad(b, 400, "messages", "invalid_value",
                     "messages[%d].role '%s' is not supported (system, developer, user, assistant)", i, role->valuestring);
            goto done;
        }
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (!content) { fail_bad(b, 400, "messages", "missing_required_parameter", "messages[%d].content is required", i); goto done; }
        if (!(texts[i] = content_text(content, i, b))) {
            if (!b->status) fail_bad(b, 500, NULL, NULL, "out of memory");
            goto done;
        }
        m[i].role = r;
        m[i].content = texts[i];
    }
    char *text = NULL;
    ak_error err = {{0}};
    /* BOS comes from the tokenizer (as the vocabulary asks), not the text */
    if (ak_chat_render(s->cfg.family, m, n, 1, NULL, NULL, s->cfg.template_text, &text, &err) < 0) {
        fail_bad(b, 400, "messages", "invalid_value", "%s", err.msg);
        goto done;
    }
    if (ak_tokenize(s->cfg.tok, text, strlen(text), AK_TOK_ADD_SPECIAL | AK_TOK_PARSE_SPECIAL, &p->tokens,
                    &p->n_tokens, &err) < 0) {
        fail_bad(b, 400, "messages", NULL, "%s", err.msg);
        free(text);
        goto done;
    }
    free(text);
    rc = 0;
done:
    for (int i = 0; texts && i < n; i++) free(texts[i]);
    free(texts);
    free(m);
    return rc;
}

/* Reads an integer field: absent -> 0 and *given 0; wrong type/range -> -1. */
static int get_int(const cJSON *body, const char *name, long lo, long hi, long *out, int *given, bad *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
    *given = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long)v->valuedouble)
        return fail_bad(b, 400, name, "invalid_type", "%s must be an integer", name);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return fail_bad(b, 400, name, "invalid_value", "%s must be between %ld and %ld", name, lo, hi);
    *out = (long)v->valuedouble;
    *given = 1;
    return 0;
}

static int get_num(const cJSON *body, const char *name, double lo, double hi, double *out, bad *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v)) return fail_bad(b, 400, name, "invalid_type", "%s must be a number", name);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return fail_bad(b, 400, name, "invalid_value", "%s must be between %g and %g", name, lo, hi);
    *out = v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *body, const char *name, int *out, bad *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return fail_bad(b, 400, name, "invalid_type", "%s must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Parses and validates a completion request body (see server.h). */
static int parse_request(ak_server *s, struct MHD_Connection *c, const cJSON *body, int chat, parsed *p, bad *b) {
    memset(p, 0, sizeof *p);
    p->chat = chat;
    if (!cJSON_IsObject(body)) return fail_bad(b, 400, NULL, "invalid_type", "the request body must be a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
    if (!model) return fail_bad(b, 400, "model", "missing_required_parameter", "model is required");
    if (!cJSON_IsString(model)) return fail_bad(b, 400, "model", "invalid_type", "model must be a string");
    if (strcmp(model->valuestring, s->cfg.model_id))
        return fail_bad(b, 404, "model", "model_not_found", "The model '%.200s' does not exist (this server serves '%s')",
                        model->valuestring, s->cfg.model_id);
    /* the agent: header or body field; both must agree */
    const char *hdr = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Agent-Id");
    const cJSON *bid = cJSON_GetObjectItemCaseSensitive(body, "agent_id");
    if (bid && !cJSON_IsNull(bid) && !cJSON_IsString(bid))
        return fail_bad(b, 400, "agent_id", "invalid_type", "agent_id must be a string");
    const char *id = hdr ? hdr : (cJSON_IsString(bid) ? bid->valuestring : NULL);
    if (hdr && cJSON_IsString(bid) && strcmp(hdr, bid->valuestring))
        return fail_bad(b, 400, "agent_id", "invalid_value", "X-Agent-Id and agent_id name different agents");
    if (id) {
        if (!ak_agent_id_valid(id))
            return fail_bad(b, 400, "agent_id", "invalid_agent_id",
                            "invalid agent id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
        snprintf(p->agent_id, sizeof p->agent_id, "%s", id);
    }
    long v;
    int given;
    if (get_int(body, "n", 1, 1000000, &v, &given, b) < 0) return -1;
    if (given && v != 1) return fail_bad(b, 400, "n", "invalid_value", "only n = 1 is supported");
    if (get_int(body, "max_tokens", 1, 1 << 24, &v, &given, b) < 0) return -1;
    if (given) p->max_tokens = (int)v;
    if (get_int(body, "max_completion_tokens", 1, 1 << 24, &v, &given, b) < 0) return -1;
    if (given) p->max_tokens = (int)v;
    /* OpenAI's sampling: temperature (default 1) and top_p only */
    p->sp = ak_sampler_defaults();
    p->sp.temp = 1.0f;
    p->sp.top_k = 0;
    p->sp.top_p = 1.0f;
    p->sp.min_p = 0.0f;
    double d = p->sp.temp;
    if (get_num(body, "temperature", 0, 2, &d, b) < 0) return -1;
    p->sp.temp = (float)d;
    d = p->sp.top_p;
    if (get_num(body, "top_p", 1e-9, 1, &d, b) < 0) return -1;
    p->sp.top_p = (float)d;
    if (get_int(body, "seed", INT64_MIN / 2, INT64_MAX / 2, &v, &given, b) < 0) return -1;
    if (given) p->sp.seed = (uint64_t)v;
    else {
        pthread_mutex_lock(&s->mu);
        p->sp.seed = (uint64_t)time(NULL) ^ (s->id_salt + s->next_id * 0x9E3779B97F4A7C15ull);
        pthread_mutex_unlock(&s->mu);
    }
    if (get_bool(body, "stream", &p->stream, b) < 0) return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(body, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return fail_bad(b, 400, "stream_options", "invalid_type", "stream_options must be an object");
        if (get_bool(so, "include_usage", &p->include_usage, b) < 0) return -1;
    }
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(body, "user");
    if (user && !cJSON_IsNull(user) && !cJSON_IsString(user))
        return fail_bad(b, 400, "user", "invalid_type", "user must be a string");
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(body, "stop");
    if (stop && !cJSON_IsNull(stop)) {
        if (cJSON_IsString(stop)) {
            if (!stop->valuestring[0]) return fail_bad(b, 400, "stop", "invalid_value", "stop must not be empty");
            p->stop[p->n_stop++] = strdup(stop->valuestring);
        } else if (cJSON_IsArray(stop)) {
            if (cJSON_GetArraySize(stop) > 4) return fail_bad(b, 400, "stop", "invalid_value", "at most 4 stop sequences");
            const cJSON *x;
            cJSON_ArrayForEach(x, stop) {
                if (!cJSON_IsString(x) || !x->valuestring[0])
                    return fail_bad(b, 400, "stop", "invalid_type", "stop must be a string or an array of non-empty strings");
                p->stop[p->n_stop++] = strdup(x->valuestring);
            }
        } else {
            return fail_bad(b, 400, "stop", "invalid_type", "stop must be a string or an array of strings");
        }
        for (int i = 0; i < p->n_stop; i++)
            if (!p->stop[i]) return fail_bad(b, 500, NULL, NULL, "out of memory");
    }
    ak_error err = {{0}};
    if (chat) {
        if (parse_messages(s, cJSON_GetObjectItemCaseSensitive(body, "messages"), p, b) < 0) return -1;
        /* plain-text families end a turn with text, not a token */
        const char *eot = ak_chat_end_of_turn(s->cfg.family);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        int special = ak_tokenize(s->cfg.tok, eot, strlen(eot), AK_TOK_PARSE_SPECIAL, &ids, &n_ids, &err) == 0 &&
                      n_ids == 1 && ak_token_is_eog(s->cfg.tok, ids[0]);
        free(ids);
        if (!special && !(p->stop[p->n_stop++] = strdup(eot))) return fail_bad(b, 500, NULL, NULL, "out of memory");
    } else {
        const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(body, "prompt");
        if (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) == 1) prompt = cJSON_GetArrayItem(prompt, 0);
        if (!prompt) return fail_bad(b, 400, "prompt", "missing_required_parameter", "prompt is required");
        if (!cJSON_IsString(prompt))
            return fail_bad(b, 400, "prompt", "invalid_type", "prompt must be a string (or an array of one string)");
        if (ak_tokenize(s->cfg.tok, prompt->valuestring, strlen(prompt->valuestring), AK_TOK_ADD_SPECIAL, &p->tokens,
                        &p->n_tokens, &err) < 0)
            return fail_bad(b, 400, "prompt", NULL, "%s", err.msg);
    }
    if (p->n_tokens == 0) return fail_bad(b, 400, chat ? "messages" : "prompt", "invalid_value", "the prompt is empty");
    if ((long)p->n_tokens >= s->cfg.n_ctx)
        return fail_bad(b, 400, chat ? "messages" : "prompt", "context_length_exceeded",
                        "the prompt has %zu tokens; this server's context is %d tokens", p->n_tokens, s->cfg.n_ctx);
    long room = s->cfg.n_ctx - (long)p->n_tokens;
    if (!p->max_tokens || p->max_tokens > room) p->max_tokens = (int)room;
    return 0;
}

/* -------------------------------------------------------- completions */

static void make_id(ak_server *s, const char *prefix, char *out, size_t cap) {
    pthread_mutex_lock(&s->mu);
    uint64_t n = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    snprintf(out, cap, "%s-%016llx%08llx", prefix, (unsigned long long)s->id_salt, (unsigned long long)n);
}

static const char *finish_name(ak_finish f) { return f == AK_FINISH_LENGTH ? "length" : "stop"; }

static cJSON *usage_json(const ak_req_result *res) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", res->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", res->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", res->prompt_tokens + res->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", res->turn.reused);
    return u;
}

static cJSON *agentkv_json(const parsed *p, const ak_req_result *res) {
    cJSON *a = cJSON_CreateObject();
    if (p->agent_id[0]) cJSON_AddStringToObject(a, "agent_id", p->agent_id);
    else cJSON_AddNullToObject(a, "agent_id");
    cJSON_AddStringToObject(a, "tier", ak_tier_name(res->turn.tier));
    cJSON_AddStringToObject(a, "match", ak_match_name(res->turn.match));
    cJSON_AddNumberToObject(a, "reused", res->turn.reused);
    cJSON_AddNumberToObject(a, "prefilled", res->turn.prefilled);
    cJSON_AddNumberToObject(a, "restore_ms", res->turn.restore_ms);
    cJSON_AddBoolToObject(a, "restored_ahead", res->turn.restored_ahead);
    cJSON_AddNumberToObject(a, "prefill_ms", res->turn.prefill_ms);
    cJSON_AddNumberToObject(a, "queue_ms", res->queue_ms);
    cJSON_AddNumberToObject(a, "ttft_ms", res->ttft_ms);
    cJSON_AddNumberToObject(a, "decode_ms", res->decode_ms);
    cJSON_AddNumberToObject(a, "evicted", res->turn.evicted);
    return a;
}

/* The skeleton of a response or chunk object. */
static cJSON *response_head(ak_server *s, const parsed *p, const char *id, long created, int chunk) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "object", p->chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
    cJSON_AddNumberToObject(j, "created", (double)created);
    cJSON_AddStringToObject(j, "model", s->cfg.model_id);
    cJSON_AddStringToObject(j, "system_fingerprint", s->cfg.model->fingerprint);
    return j;
}

/* A choice: for chat chunks a delta, for chat a message, else text. */
static void add_choice(cJSON *j, const parsed *p, int chunk, const char *role, const char *text, const char *finish) {
    cJSON *choices = cJSON_AddArrayToObject(j, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
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
}

/* The state of one SSE stream. */
typedef struct {
    ak_server *s;
    ak_request *r;
    parsed p;
    char id[64];
    long created;
    size_t have;              /* text bytes already sent */
    char *out;                /* formatted events not yet handed to MHD */
    size_t out_len, out_pos, out_cap;
    int sent_role, ended;
} stream;

static int emit(stream *st, cJSON *j) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    const char *src = s ? s : "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
    size_t n = strlen(src) + 8;
    if (st->out_len + n > st->out_cap) {
        size_t nc = (st->out_len + n) * 2;
        char *no = realloc(st->out, nc);
        if (!no) { free(s); return -1; }
        st->out = no;
        st->out_cap = nc;
    }
    st->out_len += (size_t)sprintf(st->out + st->out_len, "data: %s\n\n", src);
    free(s);
    return 0;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    while (st->out_pos == st->out_len) {
        st->out_pos = st->out_len = 0;
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        if (st->p.chat && !st->sent_role) {
            cJSON *j = response_head(st->s, &st->p, st->id, st->created, 1);
            add_choice(j, &st->p, 1, "assistant", "", NULL);
            st->sent_role = 1;
            if (emit(st, j) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        int done = ak_request_wait(st->r, st->have, -1);
        char *chunk = NULL;
        size_t n = 0;
        ak_req_result res;
        st->have = ak_request_read(st->r, st->have, &chunk, &n, &res);
        if (n) {
            cJSON *j = response_head(st->s, &st->p, st->id, st->created, 1);
            add_choice(j, &st->p, 1, NULL, chunk, NULL);
            free(chunk);
            if (emit(st, j) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        free(chunk);
        if (!done) continue;
        if (res.finish == AK_FINISH_ERROR) {
            emit(st, error_json(res.status, res.error, NULL, NULL));
        } else {
            cJSON *j = response_head(st->s, &st->p, st->id, st->created, 1);
            add_choice(j, &st->p, 1, NULL, NULL, finish_name(res.finish));
            cJSON_AddItemToObject(j, "agentkv", agentkv_json(&st->p, &res));
            emit(st, j);
            if (st->p.include_usage) {
                j = response_head(st->s, &st->p, st->id, st->created, 1);
                cJSON_AddArrayToObject(j, "choices");
                cJSON_AddItemToObject(j, "usage", usage_json(&res));
                cJSON_AddItemToObject(j, "agentkv", agentkv_json(&st->p, &res));
                emit(st, j);
            }
        }
        static const char done_line[] = "data: [DONE]\n\n";
        if (st->out_len + sizeof done_line > st->out_cap) {
            char *no = realloc(st->out, st->out_len + sizeof done_line);
            if (!no) return MHD_CONTENT_READER_END_WITH_ERROR;
            st->out = no;
            st->out_cap = st->out_len + sizeof done_line;
        }
        memcpy(st->out + st->out_len, done_line, sizeof done_line - 1);
        st->out_len += sizeof done_line - 1;
        st->ended = 1;
    }
    size_t n = st->out_len - st->out_pos;
    if (n > max) n = max;
    memcpy(buf, st->out + st->out_pos, n);
    st->out_pos += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream *st = cls;
    ak_request_cancel(st->r); /* a no-op when it finished */
    ak_request_release(st->r);
    free_parsed(&st->p);
    free(st->out);
    free(st);
}

static enum MHD_Result handle_completion(ak_server *s, struct MHD_Connection *c, conn *cn, int chat) {
    const char *ep = chat ? "/v1/chat/completions" : "/v1/completions";
    if (cn->too_large)
        return send_error(s, c, ep, 413, NULL, "request_too_large", "the request body is larger than %zu bytes",
                          s->cfg.max_body);
    cJSON *body = cJSON_ParseWithLength(cn->body ? cn->body : "", cn->len);
    if (!body) return send_error(s, c, ep, 400, NULL, "invalid_json", "the request body is not valid JSON");
    parsed p;
    bad b = {0};
    if (parse_request(s, c, body, chat, &p, &b) < 0) {
        cJSON_Delete(body);
        free_parsed(&p);
        return send_error(s, c, ep, b.status, b.param, b.code, "%s", b.msg);
    }
    cJSON_Delete(body);
    ak_req_params rp = {0};
    rp.agent_id = p.agent_id;
    rp.prompt = p.tokens;
    rp.n_prompt = (int)p.n_tokens;
    rp.max_tokens = p.max_tokens;
    rp.sp = p.sp;
    for (int i = 0; i < p.n_stop; i++) rp.stop[i] = p.stop[i];
    rp.n_stop = p.n_stop;
    rp.stop_at_eog = 1;
    int status = 0;
    ak_error err = {{0}};
    ak_request *r = ak_sched_submit(s->cfg.sched, &rp, &status, &err);
    if (!r) {
        free_parsed(&p);
        return send_error(s, c, ep, status, status == 400 ? "max_tokens" : NULL, NULL, "%s", err.msg);
    }
    char id[64];
    make_id(s, chat ? "chatcmpl" : "cmpl", id, sizeof id);
    long created = (long)time(NULL);
    /* wait for the first text (or the end), so that a request that fails
     * in the queue still gets its own HTTP status */
    ak_request_wait(r, 0, -1);
    ak_req_result res;
    ak_request_read(r, 0, NULL, NULL, &res);
    if (res.finish == AK_FINISH_ERROR) {
        ak_request_release(r);
        free_parsed(&p);
        return send_error(s, c, ep, res.status ? res.status : 500, NULL, NULL, "%s", res.error);
    }
    if (p.stream) {
        stream *st = calloc(1, sizeof *st);
        if (!st) {
            ak_request_cancel(r);
            ak_request_release(r);
            free_parsed(&p);
            return send_error(s, c, ep, 500, NULL, NULL, "out of memory");
        }
        st->s = s;
        st->r = r;
        st->p = p;
        st->created = created;
        snprintf(st->id, sizeof st->id, "%s", id);
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
        if (!resp) {
            stream_free(st);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result rc = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        ak_metrics_request(s->cfg.metrics, ep, 200);
        return rc;
    }
    while (!ak_request_wait(r, (size_t)-1, -1)) {
    }
    char *text = NULL;
    size_t n = 0;
    ak_request_read(r, 0, &text, &n, &res);
    ak_request_release(r);
    if (res.finish == AK_FINISH_ERROR) {
        free(text);
        free_parsed(&p);
        return send_error(s, c, ep, res.status ? res.status : 500, NULL, NULL, "%s", res.error);
    }
    cJSON *j = response_head(s, &p, id, created, 0);
    add_choice(j, &p, 0, "assistant", text ? text : "", finish_name(res.finish));
    cJSON_AddItemToObject(j, "usage", usage_json(&res));
    cJSON_AddItemToObject(j, "agentkv", agentkv_json(&p, &res));
    free(text);
    free_parsed(&p);
    return send_json(s, c, ep, 200, j);
}

/* ---------------------------------------------------------- other routes */

static cJSON *agent_json(const ak_sched_agent *a) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", a->id);
    cJSON_AddStringToObject(j, "object", "agent");
    cJSON_AddNumberToObject(j, "tokens", a->n_tokens);
    cJSON_AddStringToObject(j, "tier", ak_tier_name(a->tier));
    cJSON_AddNumberToObject(j, "bytes", (double)a->bytes);
    cJSON_AddNumberToObject(j, "last_used_at", (double)a->last_use);
    cJSON_AddBoolToObject(j, "busy", a->busy);
    return j;
}

static enum MHD_Result handle_agents(ak_server *s, struct MHD_Connection *c, const char *method, const char *id) {
    const char *ep = "/v1/agents";
    if (id && !ak_agent_id_valid(id))
        return send_error(s, c, ep, 400, "agent_id", "invalid_agent_id",
                          "invalid agent id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    ak_error err = {{0}};
    if (!strcmp(method, "DELETE")) {
        if (!id) return send_error(s, c, ep, 405, NULL, NULL, "DELETE needs /v1/agents/{id}");
        int rc = ak_sched_remove_agent(s->cfg.sched, id, &err);
        if (rc < 0) return send_error(s, c, ep, 500, NULL, NULL, "%s", err.msg);
        if (rc == 1) return send_error(s, c, ep, 404, "agent_id", "agent_not_found", "no agent '%s'", id);
        if (rc == 2)
            return send_error(s, c, ep, 409, "agent_id", "agent_busy", "agent '%s' has a request running or queued", id);
        logf_(s, "agent %s: deleted", id);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "id", id);
        cJSON_AddStringToObject(j, "object", "agent.deleted");
        cJSON_AddBoolToObject(j, "deleted", 1);
        return send_json(s, c, ep, 200, j);
    }
    if (strcmp(method, "GET")) return send_error(s, c, ep, 405, NULL, NULL, "method %s not allowed here", method);
    ak_sched_agent *v = NULL;
    int n = 0;
    if (ak_sched_list_agents(s->cfg.sched, &v, &n, &err) < 0) return send_error(s, c, ep, 500, NULL, NULL, "%s", err.msg);
    cJSON *j = NULL;
    if (id) {
        for (int i = 0; i < n && !j; i++)
            if (!strcmp(v[i].id, id)) j = agent_json(&v[i]);
        free(v);
        if (!j) return send_error(s, c, ep, 404, "agent_id", "agent_not_found", "no agent '%s'", id);
        return send_json(s, c, ep, 200, j);
    }
    j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(j, "data");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(data, agent_json(&v[i]));
    free(v);
    return send_json(s, c, ep, 200, j);
}

static int authorized(ak_server *s, struct MHD_Connection *c) {
    if (!s->cfg.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return 0;
    h += 7;
    size_t a = strlen(h), b = strlen(s->cfg.api_key);
    return a == b && sodium_memcmp(h, s->cfg.api_key, a) == 0;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    ak_server *s = cls;
    conn *cn = *con_cls;
    if (!cn) {
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cn->too_large) {
            if (cn->len + *upload_size > s->cfg.max_body) {
                cn->too_large = 1;
                free(cn->body);
                cn->body = NULL;
                cn->len = cn->cap = 0;
            } else {
                if (cn->len + *upload_size + 1 > cn->cap) {
                    size_t nc = (cn->len + *upload_size + 1) * 2;
                    if (nc > s->cfg.max_body + 1) nc = s->cfg.max_body + 1;
                    char *nb = realloc(cn->body, nc);
                    if (!nb) return MHD_NO;
                    cn->body = nb;
                    cn->cap = nc;
                }
                memcpy(cn->body + cn->len, upload, *upload_size);
                cn->len += *upload_size;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (!strcmp(url, "/health")) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "status", "ok");
        cJSON_AddStringToObject(j, "model", s->cfg.model_id);
        return send_json(s, c, "/health", 200, j);
    }
    const char *ep = !strcmp(url, "/metrics") ? "/metrics" : "other";
    if (!authorized(s, c))
        return send_error(s, c, ep, 401, NULL, "invalid_api_key", "a valid API key is required (Authorization: Bearer KEY)");
    if (!strcmp(url, "/metrics")) {
        ak_metrics_gauges g;
        ak_sched_gauges(s->cfg.sched, &g);
        return send_body(s, c, "/metrics", 200, ak_metrics_render(s->cfg.metrics, &g), "text/plain; version=0.0.4");
    }
    if (!strcmp(url, "/v1/models")) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "object", "list");
        cJSON *data = cJSON_AddArrayToObject(j, "data");
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "id", s->cfg.model_id);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", 0);
        cJSON_AddStringToObject(m, "owned_by", "agentkv");
        cJSON_AddItemToArray(data, m);
        return send_json(s, c, "/v1/models", 200, j);
    }
    if (!strcmp(url, "/v1/agents")) return handle_agents(s, c, method, NULL);
    if (!strncmp(url, "/v1/agents/", 11)) return handle_agents(s, c, method, url + 11);
    int chat = !strcmp(url, "/v1/chat/completions");
    if (chat || !strcmp(url, "/v1/completions")) {
        if (strcmp(method, "POST"))
            return send_error(s, c, chat ? "/v1/chat/completions" : "/v1/completions", 405, NULL, NULL,
                              "use POST for %s", url);
        return handle_completion(s, c, cn, chat);
    }
    return send_error(s, c, "other", 404, NULL, "unknown_url", "unknown URL %.200s", url);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    conn *cn = *con_cls;
    if (cn) {
        free(cn->body);
        free(cn);
    }
    *con_cls = NULL;
}

ak_server *ak_server_start(const ak_server_config *cfg, ak_error *err) {
    if (sodium_init() < 0) {
        ak_fail(err, "server: libsodium failed to initialize");
        return NULL;
    }
    ak_server *s = ak_calloc(1, sizeof *s, err);
    if (!s) return NULL;
    s->cfg = *cfg;
    if (!s->cfg.host) s->cfg.host = "127.0.0.1";
    if (!s->cfg.max_body) s->cfg.max_body = 4u << 20;
    pthread_mutex_init(&s->mu, NULL);
    randombytes_buf(&s->id_salt, sizeof s->id_salt);
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(s->cfg.host, port, &hints, &ai);
    if (gai != 0 || !ai) {
        ak_fail(err, "server: cannot resolve host '%s': %s", s->cfg.host, gai_strerror(gai));
        pthread_mutex_destroy(&s->mu);
        free(s);
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_CONNECTION_LIMIT, 512u,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        ak_fail(err, "server: cannot listen on %s:%d (address in use or not permitted?)", s->cfg.host, cfg->port);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : cfg->port;
    return s;
}

int ak_server_port(const ak_server *s) { return s->port; }

void ak_server_quiesce(ak_server *s) {
    if (!s || !s->d) return;
    MHD_socket fd = MHD_quiesce_daemon(s->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void ak_server_stop(ak_server *s) {
    if (!s) return;
    if (s->d) MHD_stop_daemon(s->d);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
