/* api.c - see api.h */
#include "api.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void ak_api_request_free(ak_api_request *r) {
    if (!r) return;
    free(r->tokens);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

static int fail_bad(ak_api_error *b, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Fills b; always returns -1. */
static int fail_bad(ak_api_error *b, int status, const char *param, const char *code, const char *fmt, ...) {
    b->status = status;
    b->param = param;
    b->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->msg, sizeof b->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* Message content: a string, null, or an array of at most AK_API_MAX_PARTS
 * {"type": "text", "text": ...} parts (concatenated). Returns a malloc'd
 * string, or NULL with b set. */
static char *content_text(const cJSON *content, int i, ak_api_error *b) {
    char *out = NULL;
    if (cJSON_IsString(content)) out = strdup(content->valuestring);
    else if (cJSON_IsNull(content)) out = strdup("");
    else if (!cJSON_IsArray(content)) {
        fail_bad(b, 400, "messages", "invalid_type", "messages[%d].content must be a string or an array of text parts", i);
        return NULL;
    } else {
        size_t len = 0;
        int n = 0;
        const cJSON *part;
        cJSON_ArrayForEach(part, content) {
            if (++n > AK_API_MAX_PARTS) {
                fail_bad(b, 400, "messages", "too_many_parts", "messages[%d].content has more than %d parts", i,
                         AK_API_MAX_PARTS);
                return NULL;
            }
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
                fail_bad(b, 400, "messages", "invalid_type",
                         "messages[%d].content: only parts of type \"text\" with a string \"text\" are supported", i);
                return NULL;
            }
            len += strlen(text->valuestring);
        }
        if (!(out = malloc(len + 1))) goto oom;
        size_t at = 0;
        cJSON_ArrayForEach(part, content) {
            const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
            size_t l = strlen(t);
            memcpy(out + at, t, l);
            at += l;
        }
        out[at] = 0;
    }
    if (out) return out;
oom:
    fail_bad(b, 500, NULL, NULL, "out of memory");
    return NULL;
}

/* Renders and tokenizes the messages of a chat request into p->tokens: the
 * list is walked once (no indexing), at most AK_API_MAX_MESSAGES. */
static int parse_messages(const ak_api_config *cfg, const cJSON *msgs, ak_api_request *p, ak_api_error *b) {
    if (!msgs) return fail_bad(b, 400, "messages", "missing_required_parameter", "messages is required");
    if (!cJSON_IsArray(msgs)) return fail_bad(b, 400, "messages", "invalid_type", "messages must be an array");
    int n = 0;
    const cJSON *msg;
    cJSON_ArrayForEach(msg, msgs) {
        if (++n > AK_API_MAX_MESSAGES)
            return fail_bad(b, 400, "messages", "too_many_messages", "at most %d messages are accepted",
                            AK_API_MAX_MESSAGES);
    }
    if (n < 1) return fail_bad(b, 400, "messages", "invalid_value", "messages must not be empty");
    ak_chat_msg *m = calloc((size_t)n, sizeof *m);
    char **texts = calloc((size_t)n, sizeof *texts);
    int rc = -1, i = 0;
    if (!m || !texts) { fail_bad(b, 500, NULL, NULL, "out of memory"); goto done; }
    cJSON_ArrayForEach(msg, msgs) {
        if (!cJSON_IsObject(msg)) { fail_bad(b, 400, "messages", "invalid_type", "messages[%d] must be an object", i); goto done; }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsString(role)) { fail_bad(b, 400, "messages", "invalid_type", "messages[%d].role must be a string", i); goto done; }
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system"; /* OpenAI's newer name for the system role */
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")) {
            fail_bad(b, 400, "messages", "invalid_value",
                     "messages[%d].role '%.64s' is not supported (system, developer, user, assistant)", i,
                     role->valuestring);
            goto done;
        }
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (!content) { fail_bad(b, 400, "messages", "missing_required_parameter", "messages[%d].content is required", i); goto done; }
        if (!(texts[i] = content_text(content, i, b))) goto done;
        m[i].role = r;
        m[i].content = texts[i];
        i++;
    }
    ak_error err = {0};
    /* content is tokenized as text: only the template's markup makes control tokens */
    if (ak_chat_tokenize(cfg->family, m, n, 1, cfg->template_text, cfg->tok, AK_TOK_ADD_SPECIAL, &p->tokens,
                         &p->n_tokens, &err) < 0) {
        fail_bad(b, 400, "messages", "invalid_value", "%s", err.msg);
        goto done;
    }
    rc = 0;
done:
    for (int k = 0; texts && k < n; k++) free(texts[k]);
    free(texts);
    free(m);
    return rc;
}

/* Reads an integer field in [lo, hi]: absent or null -> 0 and *given 0;
 * not an integral number -> -1 (400 invalid_type); outside the range -> -1
 * (400 invalid_value). The range is checked on the double, before any
 * conversion (converting an out-of-range double to an integer is undefined). */
static int get_int(const cJSON *body, const char *name, long lo, long hi, long *out, int *given, ak_api_error *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
    *given = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v)) return fail_bad(b, 400, name, "invalid_type", "%s must be an integer", name);
    double d = v->valuedouble;
    if (isfinite(d) && d != floor(d)) return fail_bad(b, 400, name, "invalid_type", "%s must be an integer", name);
    if (!(d >= (double)lo && d <= (double)hi))
        return fail_bad(b, 400, name, "invalid_value", "%s must be between %ld and %ld", name, lo, hi);
    /* (double)hi may round up past hi; the result is clamped, not converted out of range */
    long x = d >= (double)hi ? hi : d <= (double)lo ? lo : (long)d;
    *out = x;
    *given = 1;
    return 0;
}

/* Reads a number in [lo, hi] (NaN and infinities refused). Absent: *out unchanged. */
static int get_num(const cJSON *body, const char *name, double lo, double hi, double *out, ak_api_error *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v)) return fail_bad(b, 400, name, "invalid_type", "%s must be a number", name);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return fail_bad(b, 400, name, "invalid_value", "%s must be between %g and %g", name, lo, hi);
    *out = v->valuedouble;
    return 0;
}

/* Reads a boolean. Absent: *out unchanged. */
static int get_bool(const cJSON *body, const char *name, int *out, ak_api_error *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return fail_bad(b, 400, name, "invalid_type", "%s must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Everything but the JSON parse (see ak_api_parse). */
static int parse_body(const ak_api_config *cfg, const cJSON *body, int chat, const char *hdr, uint64_t default_seed,
                      ak_api_request *p, ak_api_error *b) {
    p->chat = chat;
    if (!cJSON_IsObject(body)) return fail_bad(b, 400, NULL, "invalid_type", "the request body must be a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
    if (!model) return fail_bad(b, 400, "model", "missing_required_parameter", "model is required");
    if (!cJSON_IsString(model)) return fail_bad(b, 400, "model", "invalid_type", "model must be a string");
    if (strcmp(model->valuestring, cfg->model_id))
        return fail_bad(b, 404, "model", "model_not_found", "The model '%.200s' does not exist (this server serves '%.200s')",
                        model->valuestring, cfg->model_id);
    /* the agent: header or body field; both must agree */
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
    if (get_int(body, "seed", -(1L << 62), 1L << 62, &v, &given, b) < 0) return -1;
    p->seed_given = given;
    p->sp.seed = given ? (uint64_t)v : default_seed;
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
            if (!(p->stop[p->n_stop++] = strdup(stop->valuestring))) return fail_bad(b, 500, NULL, NULL, "out of memory");
        } else if (cJSON_IsArray(stop)) {
            const cJSON *x;
            cJSON_ArrayForEach(x, stop) {
                if (p->n_stop == 4) return fail_bad(b, 400, "stop", "invalid_value", "at most 4 stop sequences");
                if (!cJSON_IsString(x) || !x->valuestring[0])
                    return fail_bad(b, 400, "stop", "invalid_type", "stop must be a string or an array of non-empty strings");
                if (!(p->stop[p->n_stop++] = strdup(x->valuestring))) return fail_bad(b, 500, NULL, NULL, "out of memory");
            }
        } else {
            return fail_bad(b, 400, "stop", "invalid_type", "stop must be a string or an array of strings");
        }
    }
    ak_error err = {0};
    if (chat) {
        if (parse_messages(cfg, cJSON_GetObjectItemCaseSensitive(body, "messages"), p, b) < 0) return -1;
        /* plain-text families end a turn with text, not a token */
        const char *eot = ak_chat_end_of_turn(cfg->family);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        int special = ak_tokenize(cfg->tok, eot, strlen(eot), AK_TOK_PARSE_SPECIAL, &ids, &n_ids, &err) == 0 &&
                      n_ids == 1 && ak_token_is_eog(cfg->tok, ids[0]);
        free(ids);
        if (!special && !(p->stop[p->n_stop++] = strdup(eot))) return fail_bad(b, 500, NULL, NULL, "out of memory");
    } else {
        const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(body, "prompt");
        if (cJSON_IsArray(prompt) && prompt->child && !prompt->child->next) prompt = prompt->child;
        if (!prompt) return fail_bad(b, 400, "prompt", "missing_required_parameter", "prompt is required");
        if (!cJSON_IsString(prompt))
            return fail_bad(b, 400, "prompt", "invalid_type", "prompt must be a string (or an array of one string)");
        if (ak_tokenize(cfg->tok, prompt->valuestring, strlen(prompt->valuestring), AK_TOK_ADD_SPECIAL, &p->tokens,
                        &p->n_tokens, &err) < 0)
            return fail_bad(b, 400, "prompt", NULL, "%s", err.msg);
    }
    if (p->n_tokens == 0) return fail_bad(b, 400, chat ? "messages" : "prompt", "invalid_value", "the prompt is empty");
    if ((long)p->n_tokens >= cfg->n_ctx)
        return fail_bad(b, 400, chat ? "messages" : "prompt", "context_length_exceeded",
                        "the prompt has %zu tokens; this server's context is %d tokens", p->n_tokens, cfg->n_ctx);
    long room = cfg->n_ctx - (long)p->n_tokens;
    if (!p->max_tokens || p->max_tokens > room) p->max_tokens = (int)room;
    return 0;
}

int ak_api_parse(const ak_api_config *cfg, const char *body, size_t len, int chat, const char *agent_header,
                 uint64_t default_seed, ak_api_request *out, ak_api_error *e) {
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    cJSON *j = cJSON_ParseWithLength(body ? body : "", body ? len : 0);
    if (!j) return fail_bad(e, 400, NULL, "invalid_json", "the request body is not valid JSON");
    int rc = parse_body(cfg, j, chat, agent_header, default_seed, out, e);
    cJSON_Delete(j);
    if (rc < 0) ak_api_request_free(out);
    return rc;
}
