/* api.c - see api.h */
#include "serve/api.h"
#include "serve/api_fields.h"
#include "serve/api_tools.h"
#include "agents/bitalloc.h"
#include "text/generate.h"
#include "text/toolgrammar.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void ak_api_request_free(ak_api_request *r) {
    if (!r) return;
    free(r->tokens);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->logit_bias);
    ak_chat_resend_free(r->resend);
    ak_grammar_ref_release(r->grammar);
    ak_api_tools_free(&r->tools);
    memset(r, 0, sizeof *r);
}

static int resend_fn(void *ud, const int32_t *hist, int n_hist, int32_t **ids, int *n_ids, ak_error *err) {
    return ak_chat_resend_prompt(ud, hist, n_hist, ids, n_ids, err);
}

static void resend_free(void *ud) { ak_chat_resend_free(ud); }

ak_reprompt ak_api_reprompt(const ak_api_request *r) {
    if (!r->resend) return (ak_reprompt){0};
    return (ak_reprompt){.fn = resend_fn, .ud = r->resend, .free = resend_free};
}

int ak_api_fail(ak_api_error *b, int status, const char *param, const char *code, const char *fmt, ...) {
    b->status = status;
    b->code = code;
    b->param = param;
    if (param && param != b->param_buf) {   /* a path the caller built on its stack outlives it here */
        snprintf(b->param_buf, sizeof b->param_buf, "%s", param);
        b->param = b->param_buf;
    }
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
        ak_api_fail(b, 400, "messages", "invalid_type", "messages[%d].content must be a string or an array of text parts", i);
        return NULL;
    } else {
        size_t len = 0;
        int n = 0;
        const cJSON *part;
        cJSON_ArrayForEach(part, content) {
            if (++n > AK_API_MAX_PARTS) {
                ak_api_fail(b, 400, "messages", "too_many_parts", "messages[%d].content has more than %d parts", i,
                         AK_API_MAX_PARTS);
                return NULL;
            }
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
                ak_api_fail(b, 400, "messages", "invalid_type",
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
    ak_api_fail(b, 500, NULL, NULL, "out of memory");
    return NULL;
}

/* Chat messages read from one or two JSON arrays (a pool's, a request's). */
typedef struct {
    ak_chat_msg *m;
    char **texts;             /* m[i].content, owned */
    char **calls;             /* m[i]'s tool calls or tool_call_id, owned (api_tools.h) */
    int n, cap;
} msg_list;

static void msg_list_free(msg_list *l) {
    for (int k = 0; k < l->n; k++) free(l->texts[k]), free(l->calls[k]);
    free(l->texts);
    free(l->calls);
    free(l->m);
    memset(l, 0, sizeof *l);
}

/* Appends the messages of msgs (an array of 1..AK_API_MAX_MESSAGES objects
 * {role, content}; the list is walked, never indexed) to l. Roles are
 * normalized (developer -> system). Returns 0, or -1 with b set. */
static int read_messages(const cJSON *msgs, msg_list *l, ak_api_error *b) {
    if (!msgs) return ak_api_fail(b, 400, "messages", "missing_required_parameter", "messages is required");
    if (!cJSON_IsArray(msgs)) return ak_api_fail(b, 400, "messages", "invalid_type", "messages must be an array");
    int n = 0;
    const cJSON *msg;
    cJSON_ArrayForEach(msg, msgs) {
        if (++n > AK_API_MAX_MESSAGES)
            return ak_api_fail(b, 400, "messages", "too_many_messages", "at most %d messages are accepted",
                            AK_API_MAX_MESSAGES);
    }
    if (n < 1) return ak_api_fail(b, 400, "messages", "invalid_value", "messages must not be empty");
    if (l->n + n > l->cap) {
        int nc = l->n + n;
        ak_chat_msg *m = realloc(l->m, sizeof *m * (size_t)nc);
        if (m) l->m = m;
        char **t = m ? realloc(l->texts, sizeof *t * (size_t)nc) : NULL;
        if (t) l->texts = t;
        char **c = t ? realloc(l->calls, sizeof *c * (size_t)nc) : NULL;
        if (c) l->calls = c;
        if (!m || !t || !c) return ak_api_fail(b, 500, NULL, NULL, "out of memory");
        l->cap = nc;
    }
    int i = 0;
    cJSON_ArrayForEach(msg, msgs) {
        if (!cJSON_IsObject(msg)) return ak_api_fail(b, 400, "messages", "invalid_type", "messages[%d] must be an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsString(role)) return ak_api_fail(b, 400, "messages", "invalid_type", "messages[%d].role must be a string", i);
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system"; /* OpenAI's newer name for the system role */
        else if (!strcmp(r, "system")) r = "system";
        else if (!strcmp(r, "user")) r = "user";
        else if (!strcmp(r, "assistant")) r = "assistant";
        else if (!strcmp(r, "tool")) r = "tool";
        else
            return ak_api_fail(b, 400, "messages", "invalid_value",
                            "messages[%d].role '%.64s' is not supported (system, developer, user, assistant, tool)", i,
                            role->valuestring);
        ak_chat_msg *m = &l->m[l->n];
        *m = (ak_chat_msg){.role = r};   /* r: a static string, the list outlives the JSON */
        if (ak_api_read_calls(msg, i, m, &l->calls[l->n], b) < 0) return -1;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
        char *text = NULL;
        if (!m->n_calls || (content && !cJSON_IsNull(content))) {   /* null beside calls: OpenAI's form */
            if (!content) {
                free(l->calls[l->n]);
                return ak_api_fail(b, 400, "messages", "missing_required_parameter", "messages[%d].content is required", i);
            }
            if (!(text = content_text(content, i, b))) {
                free(l->calls[l->n]);
                return -1;
            }
        }
        l->texts[l->n] = text;
        m->content = text;
        l->n++;
        i++;
    }
    return 0;
}

/* Renders l with the model's template and tokenizes it (content as text:
 * only the template's markup makes control tokens) into *ids. Returns 0, or
 * -1 with b set. */
static int tokenize_messages(const ak_api_config *cfg, const msg_list *l, const ak_api_tools *t, int gen_prompt,
                             int32_t **ids, size_t *n, ak_api_error *b) {
    ak_error err = {0};
    const ak_chat_opts o = {.family = cfg->family, .template_text = cfg->template_text, .add_generation_prompt = gen_prompt,
                            .tools = t ? t->tools : NULL, .n_tools = t ? t->n_tools : 0,
                            .think = t ? t->think : AK_CHAT_THINK_DEFAULT};
    if (ak_chat_tokenize(l->m, l->n, &o, cfg->tok, AK_TOK_ADD_SPECIAL, ids, n, &err) < 0)
        return ak_api_fail(b, 400, "messages", "invalid_value", "%s", err.msg);
    return 0;
}

/* Renders and tokenizes the messages of a chat request into p->tokens;
 * pool_msgs (may be NULL) go first (a pool made from messages). */
static int parse_messages(const ak_api_config *cfg, const cJSON *pool_msgs, const cJSON *msgs, ak_api_request *p,
                          ak_api_error *b) {
    msg_list l = {0};
    int rc = -1;
    if (pool_msgs && read_messages(pool_msgs, &l, b) < 0) {
        /* the pool's source was validated when it was made: a store written by something else */
        char why[sizeof b->msg];
        snprintf(why, sizeof why, "%s", b->msg);
        ak_api_fail(b, 500, "pool", "pool_corrupt", "pool '%s': its stored messages are not valid: %.400s", p->pool, why);
        goto done;
    }
    if (read_messages(msgs, &l, b) < 0 || ak_api_check_tool_results(l.m, l.n, b) < 0) goto done;
    rc = tokenize_messages(cfg, &l, &p->tools, 1, &p->tokens, &p->n_tokens, b);
    int replies = 0;
    for (int i = 0; i < l.n; i++) replies |= !strcmp(l.m[i].role, "assistant");
    if (rc == 0 && replies) {
        /* kept for the engine: the agent's history may stand for its replies */
        ak_error err = {0};
        const ak_chat_opts o = {.family = cfg->family, .template_text = cfg->template_text, .add_generation_prompt = 1,
                                .tools = p->tools.tools, .n_tools = p->tools.n_tools, .think = p->tools.think};
        if (!(p->resend = ak_chat_resend_new(l.m, l.n, &o, cfg->tok, &err)))
            rc = ak_api_fail(b, 500, NULL, NULL, "out of memory");
    }
done:
    msg_list_free(&l);
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
    if (!cJSON_IsNumber(v)) return ak_api_fail(b, 400, name, "invalid_type", "%s must be an integer", name);
    double d = v->valuedouble;
    if (isfinite(d) && d != floor(d)) return ak_api_fail(b, 400, name, "invalid_type", "%s must be an integer", name);
    if (!(d >= (double)lo && d <= (double)hi))
        return ak_api_fail(b, 400, name, "invalid_value", "%s must be between %ld and %ld", name, lo, hi);
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
    if (!cJSON_IsNumber(v)) return ak_api_fail(b, 400, name, "invalid_type", "%s must be a number", name);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return ak_api_fail(b, 400, name, "invalid_value", "%s must be between %g and %g", name, lo, hi);
    *out = v->valuedouble;
    return 0;
}

/* Reads a boolean. Absent: *out unchanged. */
static int get_bool(const cJSON *body, const char *name, int *out, ak_api_error *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return ak_api_fail(b, 400, name, "invalid_type", "%s must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* The pool a request names, looked up: its tokens and its source's
 * messages (NULL for a text pool) in *src (a cJSON tree the caller
 * deletes). Returns 0 (p->pool "" when the body names none), or -1 with b set. */
static int lookup_pool(const ak_api_config *cfg, const cJSON *body, ak_api_request *p, int32_t **toks, int *n,
                       cJSON **src, ak_api_error *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, "pool");
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return ak_api_fail(b, 400, "pool", "invalid_type", "pool must be a string");
    if (!ak_pool_id_valid(v->valuestring))
        return ak_api_fail(b, 400, "pool", "invalid_pool_id",
                        "invalid pool id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    if (!cfg->pool_lookup) return ak_api_fail(b, 400, "pool", "invalid_value", "this server has no pools");
    snprintf(p->pool, sizeof p->pool, "%s", v->valuestring);
    ak_error err = {0};
    char *source = NULL;
    if (cfg->pool_lookup(cfg->pool_ud, p->pool, toks, n, &source, &err) < 0) {
        switch (err.code) {
        case AK_ERR_NOT_FOUND: return ak_api_fail(b, 404, "pool", "pool_not_found", "no pool '%s'", p->pool);
        case AK_ERR_STALE: return ak_api_fail(b, 409, "pool", "pool_stale", "pool '%s': %s", p->pool, err.msg);
        case AK_ERR_CORRUPT: return ak_api_fail(b, 500, "pool", "pool_corrupt", "pool '%s': %s", p->pool, err.msg);
        case AK_ERR_KV_BUDGET:
            return ak_api_fail(b, 503, "pool", "kv_budget", "pool '%s' cannot be loaded now: %s", p->pool, err.msg);
        default: return ak_api_fail(b, 500, "pool", NULL, "pool '%s': %s", p->pool, err.msg);
        }
    }
    *src = source ? cJSON_Parse(source) : NULL;
    free(source);
    p->n_pool_tokens = *n;
    return 0;
}

/* p->tokens = pool[0..np) followed by p->tokens, whose leading BOS is
 * dropped when the pool starts with one (a prompt has one BOS). Returns 0,
 * or -1 with b set. */
static int prepend_pool(const ak_api_config *cfg, const int32_t *pool, int np, ak_api_request *p, ak_api_error *b) {
    int32_t bos = ak_tokenizer_bos(cfg->tok);
    size_t skip = np > 0 && p->n_tokens > 0 && pool[0] == bos && p->tokens[0] == bos ? 1 : 0;
    size_t n = (size_t)np + p->n_tokens - skip;
    int32_t *t = malloc(sizeof *t * (n ? n : 1));
    if (!t) return ak_api_fail(b, 500, NULL, NULL, "out of memory");
    memcpy(t, pool, sizeof *t * (size_t)np);
    if (p->n_tokens > skip) memcpy(t + np, p->tokens + skip, sizeof *t * (p->n_tokens - skip));
    free(p->tokens);
    p->tokens = t;
    p->n_tokens = n;
    return 0;
}

/* The reuse method and ratio of a request with memories (api.h: MEMORIES). */
static int parse_reuse(const cJSON *body, ak_api_request *p, ak_api_error *b) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(body, "reuse");
    p->reuse = AK_REUSE_NONE;
    if (r && !cJSON_IsNull(r)) {
        if (!cJSON_IsString(r)) return ak_api_fail(b, 400, "reuse", "invalid_type", "reuse must be a string");
        if (ak_reuse_method_parse(r->valuestring, &p->reuse) < 0)
            return ak_api_fail(b, 400, "reuse", "invalid_value",
                            "reuse '%.64s' is not one of none, full, cacheblend, agentkvshift", r->valuestring);
    }
    double ratio = AK_API_RECOMPUTE_RATIO;
    if (get_num(body, "recompute_ratio", 0, 1, &ratio, b) < 0) return -1;
    p->recompute_ratio = ratio;
    return 0;
}

/* The request's handoff reuse (api.h: HANDOFF REUSE), when it sets one.
 * Returns 0, or -1 with b set. */
static int parse_handoff(const cJSON *body, ak_api_request *p, ak_api_error *b) {
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(body, "handoff_reuse");
    if (!h || cJSON_IsNull(h)) return 0;
    if (!cJSON_IsString(h)) return ak_api_fail(b, 400, "handoff_reuse", "invalid_type", "handoff_reuse must be a string");
    ak_error e = {0};
    if (ak_reuse_spec_parse(h->valuestring, &p->handoff, &p->handoff_reuse, &e) < 0)
        return ak_api_fail(b, 400, "handoff_reuse", "invalid_value", "handoff_reuse %s", e.msg);
    if (p->handoff && p->n_mem)
        return ak_api_fail(b, 400, "handoff_reuse", "invalid_value", "handoff_reuse cannot be used with memories");
    p->handoff_given = 1;
    return 0;
}

/* Places the memories a chat request names into p->tokens (the whole
 * conversation rendered) after its system message (api.h: MEMORIES).
 * Returns 0 (nothing named: nothing done), or -1 with b set. */
static int place_memories(const ak_api_config *cfg, const cJSON *body, ak_api_request *p, ak_api_error *b) {
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(body, "memories");
    if (!ms || cJSON_IsNull(ms)) return 0;
    if (!cJSON_IsArray(ms)) return ak_api_fail(b, 400, "memories", "invalid_type", "memories must be an array of memory ids");
    int k = cJSON_GetArraySize(ms);
    if (k < 1 || k > AK_MAX_MEMORIES)
        return ak_api_fail(b, 400, "memories", "invalid_value", "memories must name 1 to %d memories", AK_MAX_MEMORIES);
    if (!p->chat) return ak_api_fail(b, 400, "memories", "invalid_value", "memories are placed in chat requests only");
    if (p->pool[0]) return ak_api_fail(b, 400, "memories", "invalid_value", "a request cannot name both a pool and memories");
    if (!cfg->memory_lookup) return ak_api_fail(b, 400, "memories", "invalid_value", "this server has no memories");
    if (parse_reuse(body, p, b) < 0) return -1;
    const cJSON *x;
    int i = 0;
    cJSON_ArrayForEach(x, ms) {
        if (!cJSON_IsString(x)) return ak_api_fail(b, 400, "memories", "invalid_type", "memories[%d] must be a string", i);
        if (!ak_agent_id_valid(x->valuestring))
            return ak_api_fail(b, 400, "memories", "invalid_memory_id",
                            "memories[%d]: invalid memory id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')", i);
        snprintf(p->mem_id[i++], sizeof p->mem_id[0], "%s", x->valuestring);
    }
    /* the split: where the system message ends, rendered alone */
    msg_list l = {0};
    size_t split = 0;
    if (read_messages(cJSON_GetObjectItemCaseSensitive(body, "messages"), &l, b) < 0) {
        msg_list_free(&l);
        return -1;
    }
    if (l.n > 0 && !strcmp(l.m[0].role, "system")) {
        int32_t *sys = NULL;
        size_t ns = 0;
        ak_error err = {0};
        const ak_chat_opts o = {.family = cfg->family, .template_text = cfg->template_text};
        int rc = ak_chat_tokenize(l.m, 1, &o, cfg->tok, AK_TOK_ADD_SPECIAL, &sys, &ns, &err);
        int ok = rc == 0 && ns <= p->n_tokens && !memcmp(sys, p->tokens, sizeof *sys * ns);
        free(sys);
        msg_list_free(&l);
        if (!ok)
            return ak_api_fail(b, 400, "memories", "memory_template_mismatch",
                            "this model's chat template (%s) renders the system message differently when other "
                            "messages follow it, so the memories cannot be placed after it: send reuse 'full' "
                            "without memories (the chunks as text) instead", ak_chat_family_name(cfg->family));
        split = ns;
    } else {
        msg_list_free(&l);
        split = p->n_tokens > 0 && p->tokens[0] == ak_tokenizer_bos(cfg->tok) ? 1 : 0;
    }
    /* the chunks' tokens, in order */
    int32_t *chunk[AK_MAX_MEMORIES] = {0};
    int nc[AK_MAX_MEMORIES] = {0}, rc = 0;
    size_t total = 0;
    for (int j = 0; j < k && rc == 0; j++) {
        ak_error err = {0};
        if (cfg->memory_lookup(cfg->memory_ud, p->mem_id[j], &chunk[j], &nc[j], &err) < 0) {
            switch (err.code) {
            case AK_ERR_NOT_FOUND: rc = ak_api_fail(b, 404, "memories", "memory_not_found", "no memory '%s'", p->mem_id[j]); break;
            case AK_ERR_STALE: rc = ak_api_fail(b, 409, "memories", "memory_stale", "memory '%s': %s", p->mem_id[j], err.msg); break;
            case AK_ERR_CORRUPT: rc = ak_api_fail(b, 500, "memories", "memory_corrupt", "memory '%s': %s", p->mem_id[j], err.msg); break;
            case AK_ERR_KV_BUDGET:
                rc = ak_api_fail(b, 503, "memories", "kv_budget", "memory '%s' cannot be loaded now: %s", p->mem_id[j], err.msg);
                break;
            default: rc = ak_api_fail(b, 500, "memories", NULL, "memory '%s': %s", p->mem_id[j], err.msg); break;
            }
        }
        total += (size_t)nc[j];
    }
    int32_t *t = rc == 0 ? malloc(sizeof *t * (p->n_tokens + total + 1)) : NULL;
    if (rc == 0 && !t) rc = ak_api_fail(b, 500, NULL, NULL, "out of memory");
    if (rc == 0) {
        memcpy(t, p->tokens, sizeof *t * split);
        size_t at = split;
        for (int j = 0; j < k; j++) {
            memcpy(t + at, chunk[j], sizeof *t * (size_t)nc[j]);
            p->mem_at[j] = (int)at;
            p->mem_len[j] = nc[j];
            at += (size_t)nc[j];
        }
        memcpy(t + at, p->tokens + split, sizeof *t * (p->n_tokens - split));
        free(p->tokens);
        p->tokens = t;
        p->n_tokens += total;
        p->n_mem = k;
        p->n_mem_tokens = (int)(total > INT32_MAX ? INT32_MAX : total);
    }
    for (int j = 0; j < k; j++) free(chunk[j]);
    return rc;
}

/* The prompt of a request (chat: messages; completions: prompt), starting
 * with the pool's tokens when it names one (see api.h: POOLS). */
static int parse_prompt(const ak_api_config *cfg, const cJSON *body, int chat, ak_api_request *p, ak_api_error *b) {
    int32_t *pool = NULL;
    int np = 0, rc = -1;
    cJSON *src = NULL;
    if (lookup_pool(cfg, body, p, &pool, &np, &src, b) < 0) goto done;
    const cJSON *pool_msgs = p->pool[0] && chat ? cJSON_GetObjectItemCaseSensitive(src, "messages") : NULL;
    if (pool_msgs && !cJSON_IsArray(pool_msgs)) pool_msgs = NULL;
    ak_error err = {0};
    if (chat) {
        if (parse_messages(cfg, pool_msgs, cJSON_GetObjectItemCaseSensitive(body, "messages"), p, b) < 0) goto done;
    } else {
        const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(body, "prompt");
        if (cJSON_IsArray(prompt) && prompt->child && !prompt->child->next) prompt = prompt->child;
        if (!prompt) { ak_api_fail(b, 400, "prompt", "missing_required_parameter", "prompt is required"); goto done; }
        if (!cJSON_IsString(prompt)) {
            ak_api_fail(b, 400, "prompt", "invalid_type", "prompt must be a string (or an array of one string)");
            goto done;
        }
        if (ak_tokenize(cfg->tok, prompt->valuestring, strlen(prompt->valuestring), AK_TOK_ADD_SPECIAL, &p->tokens,
                        &p->n_tokens, &err) < 0) {
            ak_api_fail(b, 400, "prompt", NULL, "%s", err.msg);
            goto done;
        }
    }
    if (pool_msgs && p->resend) ak_chat_resend_keep(p->resend, np);
    if (pool_msgs) {
        /* rendered together, the pool's messages must still render as the pool did alone */
        if (p->n_tokens < (size_t)np || memcmp(p->tokens, pool, sizeof *pool * (size_t)np)) {
            ak_api_fail(b, 400, "pool", "pool_template_mismatch",
                     "pool '%s' was made from messages, and this model's chat template (%s) renders those messages "
                     "differently when other messages follow them, so the conversation cannot start with the "
                     "pool's cache: make the pool from text, or send the messages without the pool",
                     p->pool, ak_chat_family_name(cfg->family));
            goto done;
        }
    } else if (p->pool[0]) {
        size_t n_conv = p->n_tokens;
        if (prepend_pool(cfg, pool, np, p, b) < 0) goto done;
        if (p->resend) ak_chat_resend_set_prefix(p->resend, np, p->n_tokens < (size_t)np + n_conv);
    }
    if (place_memories(cfg, body, p, b) < 0 || parse_handoff(body, p, b) < 0) goto done;
    if (p->n_mem) {   /* memories sit at fixed positions of the prompt as rendered */
        ak_chat_resend_free(p->resend);
        p->resend = NULL;
    }
    rc = 0;
done:
    free(pool);
    cJSON_Delete(src);
    return rc;
}

/* 1 when the family writes its reasoning before the reply under the
 * prompt rendered with thinking `think` (qwen3 unless off; a prompt that
 * leaves the model inside its reasoning): the grammar then holds from after
 * "</think>" (api.h: STRUCTURED OUTPUT). */
static int reasoning_first(const ak_api_config *cfg, ak_chat_think think) {
    if (think == AK_CHAT_THINK_OFF) return 0;   /* the prompt closed an empty reasoning */
    if (cfg->family == AK_CHAT_QWEN3) return 1;
    const ak_chat_opts o = {.family = cfg->family, .template_text = cfg->template_text, .add_generation_prompt = 1,
                            .think = think};
    return ak_chat_reasoning_open(&o);
}

/* The compiled grammar of (kind, text) from the server's cache into
 * p->grammar, its compile errors as 400s: a tool's schema named by its
 * index, the response format's otherwise. */
static int get_grammar(const ak_api_config *cfg, ak_grammar_kind kind, const char *text, ak_api_request *p,
                       ak_api_error *b) {
    ak_gram_error ge = {0};
    if (ak_grammars_get(cfg->grammars, kind, text, strlen(text), &p->grammar, &ge) == 0) return 0;
    if (ge.code == AK_GRAM_E_NOMEM) return ak_api_fail(b, 500, NULL, NULL, "out of memory");
    char param[96] = "response_format.json_schema.schema";
    const char *path = ge.path;
    int tool = -1, used = 0;
    if (kind == AK_GRAMMAR_TOOL_CALLS && sscanf(path, "/tools/%d/parameters%n", &tool, &used) == 1 && used > 0 &&
        tool >= 0 && tool < p->tools.n_tools) {
        /* the spec lists the named tool alone: its index among the request's tools */
        int index = p->tools.choice == AK_TOOL_CHOICE_NAMED ? p->tools.named : tool;
        snprintf(param, sizeof param, "tools[%d].function.parameters", index);
        path += used;
    } else if (kind == AK_GRAMMAR_TOOL_CALLS && !strncmp(path, "/content", 8)) {
        path += 8;
    }
    if (ge.code == AK_GRAM_E_UNSUPPORTED)
        return ak_api_fail(b, 400, param, "unsupported_schema_keyword", "%s: the keyword '%s' at '%s' is not supported (%.300s)",
                        param, ge.keyword, path[0] ? path : "/", ge.msg);
    return ak_api_fail(b, 400, param, "invalid_schema", "%s: %s (%s%s%s)", param, ge.msg, ak_gram_code_name(ge.code),
                    path[0] ? " at " : "", path);
}

/* The request's response_format (api.h: STRUCTURED OUTPUT): *kind and
 * *text (malloc'd: the schema as cJSON prints it, the key of the cache),
 * *text NULL and *kind -1 for free text. Returns 0, or -1 with b set. */
static int read_response_format(const ak_api_config *cfg, const cJSON *body, int *kind, char **text, ak_api_error *b) {
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(body, "response_format");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    *kind = -1;
    *text = NULL;
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type) || !strcmp(type->valuestring, "text")) return 0;   /* checked by the table */
    if (!cfg->grammars)
        return ak_api_fail(b, 400, "response_format", "unsupported_parameter", "this server has no structured output");
    *kind = AK_GRAMMAR_JSON_OBJECT;
    if (strcmp(type->valuestring, "json_schema")) return 0;
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!js) return ak_api_fail(b, 400, "response_format.json_schema", "missing_required_parameter",
                             "response_format.json_schema is required for type json_schema");
    if (!cJSON_IsObject(js))
        return ak_api_fail(b, 400, "response_format.json_schema", "invalid_type", "response_format.json_schema must be an object");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (!name) return ak_api_fail(b, 400, "response_format.json_schema.name", "missing_required_parameter",
                               "response_format.json_schema.name is required");
    if (!cJSON_IsString(name))
        return ak_api_fail(b, 400, "response_format.json_schema.name", "invalid_type",
                        "response_format.json_schema.name must be a string");
    if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
        return ak_api_fail(b, 400, "response_format.json_schema.strict", "invalid_type",
                        "response_format.json_schema.strict must be a boolean");
    if (schema && !cJSON_IsNull(schema) && !cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return ak_api_fail(b, 400, "response_format.json_schema.schema", "invalid_type",
                        "response_format.json_schema.schema must be a JSON Schema (an object or a boolean)");
    *kind = AK_GRAMMAR_JSON_SCHEMA;
    /* no schema: any value */
    *text = schema && !cJSON_IsNull(schema) ? cJSON_PrintUnformatted(schema) : strdup("true");
    if (!*text) return ak_api_fail(b, 500, NULL, NULL, "out of memory");
    return 0;
}

/* The spec of the tools' grammar (toolgrammar.h) for p's tools and choice,
 * a response format's schema beside them (fmt_kind, fmt_text); sets how the
 * generator holds it (grammar_after, grammar_required, grammar_free_after).
 * Returns the spec (malloc'd) or NULL (out of memory). */
static char *tools_spec(const ak_api_config *cfg, ak_api_request *p, int fmt_kind, const char *fmt_text, int think_first) {
    const ak_api_tools *t = &p->tools;
    ak_toolg_opts o = {.family = cfg->family, .template_text = cfg->template_text, .tools = t->tools,
                       .n_tools = t->n_tools, .parallel = t->parallel, .mode = AK_TOOLG_CALLS,
                       .lead_ws = think_first};
    if (t->choice == AK_TOOL_CHOICE_NAMED) {
        o.tools = &t->tools[t->named];
        o.n_tools = 1;
    }
    p->grammar_after = think_first ? "</think>" : NULL;
    p->grammar_required = 1;
    if (t->choice == AK_TOOL_CHOICE_AUTO && fmt_kind >= 0) {
        o.mode = AK_TOOLG_CALLS_OR_CONTENT;
        o.content_schema = fmt_kind == AK_GRAMMAR_JSON_SCHEMA ? fmt_text : NULL;
    } else if (t->choice == AK_TOOL_CHOICE_AUTO) {
        /* free text until the model opens a call; the call, once begun, is held */
        o.mode = AK_TOOLG_AFTER_OPENER;
        p->grammar_after = ak_toolg_opener(cfg->family, cfg->template_text);
        p->grammar_required = 0;
        p->grammar_free_after = 1;
    }
    return ak_toolg_spec(&o, NULL);
}

/* The request's constraint (api.h: STRUCTURED OUTPUT, TOOLS): the tools'
 * grammar when calls may come, else the response format's; asked is the
 * max_tokens the body gave (0: none). Returns 0, or -1 with b set. */
static int parse_constraint(const ak_api_config *cfg, const cJSON *body, int asked, ak_api_request *p, ak_api_error *b) {
    int kind = -1;
    char *text = NULL;
    if (read_response_format(cfg, body, &kind, &text, b) < 0) return -1;
    int calls = p->tools.n_tools > 0 && p->tools.choice != AK_TOOL_CHOICE_NONE;
    if (calls && !cfg->grammars) {   /* a configuration without a grammar cache: calls parsed, not held */
        free(text);
        if (p->tools.choice == AK_TOOL_CHOICE_AUTO) return 0;
        return ak_api_fail(b, 400, "tool_choice", "unsupported_parameter",
                        "this server has no constrained decoding: tool_choice must be auto or none");
    }
    const int think_first = reasoning_first(cfg, p->tools.think);
    int rc = 0;
    if (calls) {
        char *spec = tools_spec(cfg, p, kind, text, think_first);
        rc = spec ? get_grammar(cfg, AK_GRAMMAR_TOOL_CALLS, spec, p, b) : ak_api_fail(b, 500, NULL, NULL, "out of memory");
        free(spec);
    } else if (kind >= 0) {
        rc = get_grammar(cfg, (ak_grammar_kind)kind, text ? text : "", p, b);
        p->grammar_after = think_first ? "</think>" : NULL;
        p->grammar_required = 1;
    }
    free(text);
    if (rc < 0 || !p->grammar || !p->grammar_required) return rc;
    ak_gen_constraint con = {.grammar = ak_grammar_ref_grammar(p->grammar), .masks = ak_grammar_ref_masks(p->grammar),
                             .vocab = ak_grammar_ref_vocab(p->grammar), .rule = -1, .lazy = p->grammar_after != NULL,
                             .after = p->grammar_after, .required = 1};
    const char *what = calls ? "tool call" : "response format";
    long need = ak_gen_constraint_min_tokens(&con, cfg->tok);
    if (need < 0)
        return ak_api_fail(b, 400, calls ? "tools" : "response_format", "invalid_schema",
                        "this model's vocabulary cannot spell the shortest reply the %s allows", what);
    if (need > p->max_tokens)
        return ak_api_fail(b, 400, asked ? "max_tokens" : "messages", asked ? "invalid_value" : "context_length_exceeded",
                        "the shortest reply the %s allows takes %ld tokens; %s %d", what, need,
                        asked && asked <= p->max_tokens ? "max_tokens is" : "the context leaves room for", p->max_tokens);
    return 0;
}

/* logprobs and top_logprobs (api.h: LOGPROBS), their types and ranges
 * checked by the field table. Returns 0, or -1 with *b set. */
static int parse_logprobs(const cJSON *body, int chat, ak_api_request *p, ak_api_error *b) {
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(body, "logprobs");
    const cJSON *top = cJSON_GetObjectItemCaseSensitive(body, "top_logprobs");
    if (!chat) {
        p->logprobs = cJSON_IsNumber(lp);
        p->top_logprobs = p->logprobs ? (int)lp->valuedouble : 0;
        return 0;
    }
    p->logprobs = cJSON_IsTrue(lp);
    if (cJSON_IsNumber(top)) {
        if (!p->logprobs)
            return ak_api_fail(b, 400, "top_logprobs", "invalid_value", "top_logprobs requires logprobs to be true");
        p->top_logprobs = (int)top->valuedouble;
    }
    return 0;
}

/* Everything but the JSON parse (see ak_api_parse). */
static int parse_body(const ak_api_config *cfg, const cJSON *body, int chat, const char *hdr, uint64_t default_seed,
                      ak_api_request *p, ak_api_error *b) {
    p->chat = chat;
    if (!cJSON_IsObject(body)) return ak_api_fail(b, 400, NULL, "invalid_type", "the request body must be a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
    if (!model) return ak_api_fail(b, 400, "model", "missing_required_parameter", "model is required");
    if (!cJSON_IsString(model)) return ak_api_fail(b, 400, "model", "invalid_type", "model must be a string");
    if (strcmp(model->valuestring, cfg->model_id))
        return ak_api_fail(b, 404, "model", "model_not_found", "The model '%.200s' does not exist (this server serves '%.200s')",
                        model->valuestring, cfg->model_id);
    /* every field OpenAI defines: type, range, and what this server lacks (api_fields.h) */
    ak_api_field_ctx fctx = {.vocab = ak_tokenizer_vocab_size(cfg->tok)};
    if (ak_api_check_fields(body, chat, &fctx, b) < 0) return -1;
    /* the agent (api.h: AGENTS): the header; else agent_id or prompt_cache_key, which must agree */
    const cJSON *bid = cJSON_GetObjectItemCaseSensitive(body, "agent_id");
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(body, "prompt_cache_key");
    if (bid && !cJSON_IsNull(bid) && !cJSON_IsString(bid))
        return ak_api_fail(b, 400, "agent_id", "invalid_type", "agent_id must be a string");
    const char *id = hdr ? hdr : (cJSON_IsString(bid) ? bid->valuestring : NULL);
    const char *id_param = "agent_id";
    if (hdr && cJSON_IsString(bid) && strcmp(hdr, bid->valuestring))
        return ak_api_fail(b, 400, "agent_id", "invalid_value", "X-Agent-Id and agent_id name different agents");
    if (!hdr && cJSON_IsString(key)) {
        if (id && strcmp(id, key->valuestring))
            return ak_api_fail(b, 400, "prompt_cache_key", "invalid_value",
                            "agent_id and prompt_cache_key name different agents");
        id = key->valuestring;
        id_param = cJSON_IsString(bid) ? "agent_id" : "prompt_cache_key";
    }
    if (id) {
        if (!ak_agent_id_valid(id))
            return ak_api_fail(b, 400, id_param, "invalid_agent_id",
                            "%s: invalid agent id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')", id_param);
        snprintf(p->agent_id, sizeof p->agent_id, "%s", id);
    }
    long v;
    int given;
    if (get_int(body, "n", 1, AK_MAX_CHOICES, &v, &given, b) < 0) return -1;
    p->n = given ? (int)v : 1;
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
    if (ak_api_read_sampler_fields(body, &p->sp, &p->logit_bias, b) < 0) return -1;
    if (get_int(body, "seed", -(1L << 62), 1L << 62, &v, &given, b) < 0) return -1;
    p->seed_given = given;
    p->sp.seed = given ? (uint64_t)v : default_seed;
    if (parse_logprobs(body, chat, p, b) < 0) return -1;
    if (get_bool(body, "stream", &p->stream, b) < 0) return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(body, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return ak_api_fail(b, 400, "stream_options", "invalid_type", "stream_options must be an object");
        if (get_bool(so, "include_usage", &p->include_usage, b) < 0) return -1;
    }
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(body, "user");
    if (user && !cJSON_IsNull(user) && !cJSON_IsString(user))
        return ak_api_fail(b, 400, "user", "invalid_type", "user must be a string");
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(body, "stop");
    if (stop && !cJSON_IsNull(stop)) {
        if (cJSON_IsString(stop)) {
            if (!stop->valuestring[0]) return ak_api_fail(b, 400, "stop", "invalid_value", "stop must not be empty");
            if (!(p->stop[p->n_stop++] = strdup(stop->valuestring))) return ak_api_fail(b, 500, NULL, NULL, "out of memory");
        } else if (cJSON_IsArray(stop)) {
            const cJSON *x;
            cJSON_ArrayForEach(x, stop) {
                if (p->n_stop == 4) return ak_api_fail(b, 400, "stop", "invalid_value", "at most 4 stop sequences");
                if (!cJSON_IsString(x) || !x->valuestring[0])
                    return ak_api_fail(b, 400, "stop", "invalid_type", "stop must be a string or an array of non-empty strings");
                if (!(p->stop[p->n_stop++] = strdup(x->valuestring))) return ak_api_fail(b, 500, NULL, NULL, "out of memory");
            }
        } else {
            return ak_api_fail(b, 400, "stop", "invalid_type", "stop must be a string or an array of strings");
        }
    }
    if (chat && ak_api_parse_tools(body, &p->tools, b) < 0) return -1;
    if (chat) {
        const ak_chat_opts o = {.family = cfg->family, .template_text = cfg->template_text, .add_generation_prompt = 1,
                                .think = p->tools.think};
        p->tools.in_reasoning = ak_chat_reasoning_open(&o);
    }
    if (parse_prompt(cfg, body, chat, p, b) < 0) return -1;
    ak_error err = {0};
    if (chat) {
        /* plain-text families end a turn with text, not a token */
        const char *eot = ak_chat_end_of_turn(cfg->family);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        int special = ak_tokenize(cfg->tok, eot, strlen(eot), AK_TOK_PARSE_SPECIAL, &ids, &n_ids, &err) == 0 &&
                      n_ids == 1 && ak_token_is_eog(cfg->tok, ids[0]);
        free(ids);
        if (!special && !(p->stop[p->n_stop++] = strdup(eot))) return ak_api_fail(b, 500, NULL, NULL, "out of memory");
    }
    if (p->n_tokens == 0) return ak_api_fail(b, 400, chat ? "messages" : "prompt", "invalid_value", "the prompt is empty");
    if ((long)p->n_tokens >= cfg->n_ctx) {
        if (p->n_mem)
            return ak_api_fail(b, 400, "memories", "context_length_exceeded",
                            "the prompt has %zu tokens (%d of them the %d memories'); this server's context is %d tokens",
                            p->n_tokens, p->n_mem_tokens, p->n_mem, cfg->n_ctx);
        if (p->pool[0])
            return ak_api_fail(b, 400, chat ? "messages" : "prompt", "context_length_exceeded",
                            "the prompt has %zu tokens (%d of them pool '%s''s); this server's context is %d tokens",
                            p->n_tokens, p->n_pool_tokens, p->pool, cfg->n_ctx);
        return ak_api_fail(b, 400, chat ? "messages" : "prompt", "context_length_exceeded",
                        "the prompt has %zu tokens; this server's context is %d tokens", p->n_tokens, cfg->n_ctx);
    }
    long room = cfg->n_ctx - (long)p->n_tokens;
    int asked = p->max_tokens;
    if (!p->max_tokens || p->max_tokens > room) p->max_tokens = (int)room;
    return chat ? parse_constraint(cfg, body, asked, p, b) : 0;
}

int ak_api_parse(const ak_api_config *cfg, const char *body, size_t len, int chat, const char *agent_header,
                 uint64_t default_seed, ak_api_request *out, ak_api_error *e) {
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    cJSON *j = cJSON_ParseWithLength(body ? body : "", body ? len : 0);
    if (!j) return ak_api_fail(e, 400, NULL, "invalid_json", "the request body is not valid JSON");
    int rc = ak_api_check_utf8(j, e);
    if (rc == 0) rc = parse_body(cfg, j, chat, agent_header, default_seed, out, e);
    cJSON_Delete(j);
    if (rc < 0) ak_api_request_free(out);
    return rc;
}

/* ------------------------------------------------------------ pool bodies */

void ak_api_pool_request_free(ak_api_pool_request *r) {
    if (!r) return;
    free(r->tokens);
    free(r->source);
    memset(r, 0, sizeof *r);
}

/* A format field: absent or null keeps *f; else a name ak_kv_format_parse reads. */
static int get_format(const cJSON *body, const char *name, ak_kv_format *f, ak_api_error *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v) || ak_kv_format_parse(v->valuestring, f) < 0)
        return ak_api_fail(b, 400, name, "invalid_value", "%s must be one of %s", name, ak_kv_format_names());
    return 0;
}

/* The pool's messages as its source: {"messages": [{role, content}...]}
 * with roles normalized and content flattened to strings, so that later
 * requests render exactly what the pool was made from. NULL when out of memory. */
static char *messages_source(const msg_list *l) {
    cJSON *j = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(j, "messages");
    for (int i = 0; a && i < l->n; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", l->m[i].role);
        cJSON_AddStringToObject(m, "content", l->m[i].content);
        cJSON_AddItemToArray(a, m);
    }
    char *s = a ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return s;
}

/* Everything of ak_api_parse_pool but the JSON parse. */
static int parse_pool_body(const ak_api_config *cfg, const cJSON *body, ak_api_pool_request *p, ak_api_error *b) {
    if (!cJSON_IsObject(body)) return ak_api_fail(b, 400, NULL, "invalid_type", "the request body must be a JSON object");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(body, "id");
    if (!id) return ak_api_fail(b, 400, "id", "missing_required_parameter", "id is required");
    if (!cJSON_IsString(id) || !ak_pool_id_valid(id->valuestring))
        return ak_api_fail(b, 400, "id", "invalid_pool_id", "invalid pool id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    snprintf(p->id, sizeof p->id, "%s", id->valuestring);
    p->fk = AK_KV_Q8;
    p->fv = AK_KV_TQ3;
    if (get_format(body, "cache_type_k", &p->fk, b) < 0 || get_format(body, "cache_type_v", &p->fv, b) < 0) return -1;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(body, "text");
    if (cJSON_IsNull(msgs)) msgs = NULL;
    if (cJSON_IsNull(text)) text = NULL;
    if (!msgs == !text)
        return ak_api_fail(b, 400, msgs ? "text" : "messages", "invalid_value", "give exactly one of messages and text");
    if (msgs) {
        msg_list l = {0};
        int rc = read_messages(msgs, &l, b);
        for (int i = 0; rc == 0 && i < l.n; i++)   /* the pool's source keeps roles and content only */
            if (l.m[i].n_calls || !strcmp(l.m[i].role, "tool"))
                rc = ak_api_fail(b, 400, "messages", "invalid_value",
                              "messages[%d]: a pool's messages carry no tool calls or tool results", i);
        /* the pool ends where the next message would start: no generation prompt */
        if (rc == 0) rc = tokenize_messages(cfg, &l, NULL, 0, &p->tokens, &p->n_tokens, b);
        if (rc == 0 && !(p->source = messages_source(&l))) rc = ak_api_fail(b, 500, NULL, NULL, "out of memory");
        msg_list_free(&l);
        if (rc < 0) return -1;
    } else {
        if (!cJSON_IsString(text)) return ak_api_fail(b, 400, "text", "invalid_type", "text must be a string");
        ak_error err = {0};
        if (ak_tokenize(cfg->tok, text->valuestring, strlen(text->valuestring), AK_TOK_ADD_SPECIAL, &p->tokens,
                        &p->n_tokens, &err) < 0)
            return ak_api_fail(b, 400, "text", NULL, "%s", err.msg);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "text", text->valuestring);
        p->source = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
        if (!p->source) return ak_api_fail(b, 500, NULL, NULL, "out of memory");
    }
    const char *param = msgs ? "messages" : "text";
    if (p->n_tokens == 0) return ak_api_fail(b, 400, param, "invalid_value", "the pool is empty (no tokens)");
    if ((long)p->n_tokens >= cfg->n_ctx)
        return ak_api_fail(b, 400, param, "context_length_exceeded",
                        "the pool has %zu tokens; this server's context is %d tokens, and a pool must be shorter "
                        "(its agents add their own tokens after it)", p->n_tokens, cfg->n_ctx);
    return 0;
}

/* ------------------------------------------------------- memory bodies */

void ak_api_memory_request_free(ak_api_memory_request *r) {
    if (!r) return;
    free(r->text);
    memset(r, 0, sizeof *r);
}

/* Everything of ak_api_parse_memory but the JSON parse. */
static int parse_memory_body(const cJSON *body, ak_api_memory_request *p, ak_api_error *b) {
    if (!cJSON_IsObject(body)) return ak_api_fail(b, 400, NULL, "invalid_type", "the request body must be a JSON object");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(body, "id");
    if (!id) return ak_api_fail(b, 400, "id", "missing_required_parameter", "id is required");
    if (!cJSON_IsString(id) || !ak_agent_id_valid(id->valuestring))
        return ak_api_fail(b, 400, "id", "invalid_memory_id",
                        "invalid memory id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
    snprintf(p->id, sizeof p->id, "%s", id->valuestring);
    p->fk = p->fv = (ak_kv_format)-1;   /* the agents' formats */
    if (get_format(body, "cache_type_k", &p->fk, b) < 0 || get_format(body, "cache_type_v", &p->fv, b) < 0) return -1;
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(body, "text");
    if (!text || cJSON_IsNull(text)) return ak_api_fail(b, 400, "text", "missing_required_parameter", "text is required");
    if (!cJSON_IsString(text)) return ak_api_fail(b, 400, "text", "invalid_type", "text must be a string");
    size_t n = strlen(text->valuestring);
    if (n == 0) return ak_api_fail(b, 400, "text", "invalid_value", "text must not be empty");
    if (n > AK_MEMORY_MAX_TEXT)
        return ak_api_fail(b, 400, "text", "invalid_value", "text of %zu bytes is longer than %d", n, AK_MEMORY_MAX_TEXT);
    if (!(p->text = strdup(text->valuestring))) return ak_api_fail(b, 500, NULL, NULL, "out of memory");
    return 0;
}

int ak_api_parse_memory(const char *body, size_t len, ak_api_memory_request *out, ak_api_error *e) {
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    cJSON *j = cJSON_ParseWithLength(body ? body : "", body ? len : 0);
    if (!j) return ak_api_fail(e, 400, NULL, "invalid_json", "the request body is not valid JSON");
    int rc = ak_api_check_utf8(j, e);
    if (rc == 0) rc = parse_memory_body(j, out, e);
    cJSON_Delete(j);
    if (rc < 0) ak_api_memory_request_free(out);
    return rc;
}

int ak_api_parse_pool(const ak_api_config *cfg, const char *body, size_t len, ak_api_pool_request *out,
                      ak_api_error *e) {
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    cJSON *j = cJSON_ParseWithLength(body ? body : "", body ? len : 0);
    if (!j) return ak_api_fail(e, 400, NULL, "invalid_json", "the request body is not valid JSON");
    int rc = ak_api_check_utf8(j, e);
    if (rc == 0) rc = parse_pool_body(cfg, j, out, e);
    cJSON_Delete(j);
    if (rc < 0) ak_api_pool_request_free(out);
    return rc;
}

/* ---------------------------------------------------------------- cards */

/* Reads "range": [from, to] into p (absent or null: the whole history).
 * Returns 0, or -1 with b set. */
static int get_range(const cJSON *body, ak_api_card_request *p, ak_api_error *b) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(body, "range");
    if (!r || cJSON_IsNull(r)) return 0;
    const char *why = "range must be [from, to]: two integers with 0 <= from < to";
    if (!cJSON_IsArray(r) || cJSON_GetArraySize(r) != 2) return ak_api_fail(b, 400, "range", "invalid_range", "%s", why);
    double v[2];
    for (int i = 0; i < 2; i++) {
        const cJSON *x = cJSON_GetArrayItem(r, i);
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble != floor(x->valuedouble))
            return ak_api_fail(b, 400, "range", "invalid_range", "%s", why);
        v[i] = x->valuedouble;
    }
    if (!(v[0] >= 0 && v[0] < v[1] && v[1] <= (double)(1 << 30)))
        return ak_api_fail(b, 400, "range", "invalid_range", "%s (got [%g, %g])", why, v[0], v[1]);
    p->from = (int)v[0];
    p->to = (int)v[1];
    return 0;
}

/* Reads a width budget `name` (absent: *out unchanged, *given 0). */
static int get_bits(const cJSON *body, const char *name, double *out, int *given, ak_api_error *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
    *given = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 2 && v->valuedouble <= 16))
        return ak_api_fail(b, 400, name, "invalid_bits", "%s must be a number of bits in [2, 16]", name);
    *out = v->valuedouble;
    *given = 1;
    return 0;
}

/* The fields of a card body (ak_api_parse_card). */
static int parse_card_body(const cJSON *j, ak_api_card_request *p, ak_api_error *b) {
    if (!cJSON_IsObject(j)) return ak_api_fail(b, 400, NULL, "invalid_json", "the request body must be a JSON object");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
    if (id && !cJSON_IsNull(id)) {
        if (!cJSON_IsString(id) || !ak_agent_id_valid(id->valuestring))
            return ak_api_fail(b, 400, "id", "invalid_card_id",
                            "invalid card id (use 1-128 of [A-Za-z0-9_.-], not starting with '.')");
        snprintf(p->id, sizeof p->id, "%s", id->valuestring);
    }
    if (get_range(j, p, b) < 0) return -1;
    int g, gk, gv;
    if (get_bits(j, "bits", &p->bits_k, &g, b) < 0 || get_bits(j, "bits_k", &p->bits_k, &gk, b) < 0 ||
        get_bits(j, "bits_v", &p->bits_v, &gv, b) < 0)
        return -1;
    if (g && (gk || gv)) return ak_api_fail(b, 400, "bits", "invalid_bits", "give bits, or bits_k (and bits_v), not both");
    if (!g && !gk)
        return ak_api_fail(b, 400, "bits", "invalid_bits", "bits (or bits_k, and optionally bits_v) is required");
    if (!gv) p->bits_v = p->bits_k;
    const cJSON *pol = cJSON_GetObjectItemCaseSensitive(j, "policy");
    const char *name = "uniform";
    if (pol && !cJSON_IsNull(pol)) {
        if (!cJSON_IsString(pol)) return ak_api_fail(b, 400, "policy", "unknown_policy", "policy must be a string");
        name = pol->valuestring;
    }
    ak_bitalloc_policy bp;
    ak_error err = {0};
    if (ak_bitalloc_policy_parse(name, &bp, &err) < 0)
        return ak_api_fail(b, 400, "policy", "unknown_policy", "unknown policy '%.64s' (uniform, importance, topology)", name);
    snprintf(p->policy, sizeof p->policy, "%s", ak_bitalloc_policy_name(bp));
    return 0;
}

int ak_api_parse_card(const char *body, size_t len, ak_api_card_request *out, ak_api_error *e) {
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    cJSON *j = cJSON_ParseWithLength(body ? body : "", body ? len : 0);
    if (!j) return ak_api_fail(e, 400, NULL, "invalid_json", "the request body is not valid JSON");
    int rc = ak_api_check_utf8(j, e);
    if (rc == 0) rc = parse_card_body(j, out, e);
    cJSON_Delete(j);
    return rc;
}

int ak_api_parse_import(const char *body, size_t len, char card_id[AK_AGENT_ID_MAX + 1], ak_import_mode *mode,
                        ak_api_error *e) {
    memset(e, 0, sizeof *e);
    card_id[0] = 0;
    *mode = AK_IMPORT_REPLACE;
    cJSON *j = cJSON_ParseWithLength(body ? body : "", body ? len : 0);
    if (!j) return ak_api_fail(e, 400, NULL, "invalid_json", "the request body is not valid JSON");
    int rc = ak_api_check_utf8(j, e);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "card");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "mode");
    if (rc < 0) {
        /* e says which string */
    } else if (!cJSON_IsObject(j)) rc = ak_api_fail(e, 400, NULL, "invalid_json", "the request body must be a JSON object");
    else if (!cJSON_IsString(c) || !ak_agent_id_valid(c->valuestring))
        rc = ak_api_fail(e, 400, "card", "invalid_card_id", "card must be a card id (1-128 of [A-Za-z0-9_.-])");
    else if (m && !cJSON_IsNull(m) &&
             (!cJSON_IsString(m) || (strcmp(m->valuestring, "replace") && strcmp(m->valuestring, "append"))))
        rc = ak_api_fail(e, 400, "mode", "unsupported_mode",
                      "mode '%.32s' is not supported: \"replace\" (the card becomes the agent's whole context) or "
                      "\"append\" (the card after the agent's own tokens)", cJSON_IsString(m) ? m->valuestring : "?");
    else {
        snprintf(card_id, AK_AGENT_ID_MAX + 1, "%s", c->valuestring);
        if (cJSON_IsString(m) && !strcmp(m->valuestring, "append")) *mode = AK_IMPORT_APPEND;
    }
    cJSON_Delete(j);
    return rc;
}
