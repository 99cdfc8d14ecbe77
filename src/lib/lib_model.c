/* lib_model.c - the public API's versions, errors, models, tokens, chat
 * templates and KV formats (include/agentkv.h; lib.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/lib.h"
#include "kv/kvformat.h"

AGENTKV_API const char *agentkv_version(void) { return AGENTKV_VERSION; }

static const char *const status_names[] = {
    [AGENTKV_OK] = "ok",
    [AGENTKV_ERR_GENERIC] = "generic",
    [AGENTKV_ERR_INVALID] = "invalid",
    [AGENTKV_ERR_NOMEM] = "nomem",
    [AGENTKV_ERR_IO] = "io",
    [AGENTKV_ERR_NOSPACE] = "nospace",
    [AGENTKV_ERR_KV_BUDGET] = "kv-budget",
    [AGENTKV_ERR_CORRUPT] = "corrupt",
    [AGENTKV_ERR_NOT_FOUND] = "not-found",
    [AGENTKV_ERR_STALE] = "stale",
    [AGENTKV_ERR_BUSY] = "busy",
    [AGENTKV_ERR_PERMISSION] = "permission",
    [AGENTKV_ERR_SHUTDOWN] = "shutdown",
    [AGENTKV_ERR_EXISTS] = "exists",
};

AGENTKV_API const char *agentkv_status_name(agentkv_status s) {
    return (int)s >= 0 && (size_t)s < sizeof status_names / sizeof *status_names ? status_names[s] : "unknown";
}

AGENTKV_API const char *agentkv_error_message(const agentkv_error *err) {
    if (!err) return "";
    return err->message[0] ? err->message : agentkv_status_name(err->code);
}

AGENTKV_API void agentkv_free(void *p) { free(p); }

/* The public status of an internal code (util.h), one for one. */
static agentkv_status status_of(int code) {
    switch (code) {
    case AK_ERR_NONE: return AGENTKV_OK;
    case AK_ERR_INVALID: return AGENTKV_ERR_INVALID;
    case AK_ERR_NOMEM: return AGENTKV_ERR_NOMEM;
    case AK_ERR_IO: return AGENTKV_ERR_IO;
    case AK_ERR_NOSPACE: return AGENTKV_ERR_NOSPACE;
    case AK_ERR_KV_BUDGET: return AGENTKV_ERR_KV_BUDGET;
    case AK_ERR_CORRUPT: return AGENTKV_ERR_CORRUPT;
    case AK_ERR_NOT_FOUND: return AGENTKV_ERR_NOT_FOUND;
    case AK_ERR_STALE: return AGENTKV_ERR_STALE;
    case AK_ERR_BUSY: return AGENTKV_ERR_BUSY;
    case AK_ERR_PERMISSION: return AGENTKV_ERR_PERMISSION;
    case AK_ERR_SHUTDOWN: return AGENTKV_ERR_SHUTDOWN;
    case AK_ERR_EXISTS: return AGENTKV_ERR_EXISTS;
    default: return AGENTKV_ERR_GENERIC;
    }
}

agentkv_status ak_lib_fail(agentkv_error *err, const ak_error *e) {
    agentkv_status s = status_of(e->code);
    if (s == AGENTKV_OK) s = AGENTKV_ERR_GENERIC;   /* a failure that set no code is still one */
    if (err) {
        err->code = s;
        snprintf(err->message, sizeof err->message, "%s", e->msg);
    }
    return s;
}

agentkv_status ak_lib_failc(agentkv_error *err, agentkv_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

agentkv_status ak_lib_ok(agentkv_error *err) {
    if (err) {
        err->code = AGENTKV_OK;
        err->message[0] = 0;
    }
    return AGENTKV_OK;
}

agentkv_status ak_lib_format(const char *name, ak_kv_format def, const char *what, ak_kv_format *out,
                             agentkv_error *err) {
    if (!name) {
        *out = def;
        return AGENTKV_OK;
    }
    if (ak_kv_format_parse(name, out) < 0)
        return ak_lib_failc(err, AGENTKV_ERR_INVALID, "%s: unknown cache format '%s' (one of %s)", what, name,
                            ak_kv_format_names());
    return AGENTKV_OK;
}

ak_model *ak_lib_model(const agentkv_model *m) { return m->model; }
ak_tokenizer *ak_lib_tokenizer(const agentkv_model *m) { return m->tok; }

AGENTKV_API void agentkv_model_free(agentkv_model *m) {
    if (!m) return;
    ak_tokenizer_free(m->tok);
    ak_model_free(m->model);
    free(m->template_text);
    free(m);
}

AGENTKV_API agentkv_status agentkv_model_load(const char *path, const agentkv_model_options *o, agentkv_model **out,
                                              agentkv_error *err) {
    static const agentkv_model_options defaults = {0};
    if (!o) o = &defaults;
    if (!path || !out) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_model_load: NULL path or out");
    *out = NULL;
    ak_error e = {{0}};
    agentkv_model *m = ak_calloc(1, sizeof *m, &e);
    if (!m) return ak_lib_fail(err, &e);
    if (o->chat_template && ak_chat_family_parse(o->chat_template, &m->family, &e) < 0) {
        free(m);
        return ak_lib_failc(err, AGENTKV_ERR_INVALID, "chat_template: %s", e.msg);
    }
    if (!(m->model = ak_model_load(path, o->progress, o->progress_ud, &e))) {
        free(m);
        /* a file that cannot be opened says why; what else the loader could
         * not classify is a file it does not run */
        if (e.code == AK_ERR_GENERIC) e.code = access(path, R_OK) ? ak_err_code_of_errno(errno) : AK_ERR_INVALID;
        return ak_lib_fail(err, &e);
    }
    if (!(m->tok = ak_tokenizer_load(&m->model->gguf, &e))) goto fail;
    if (ak_tokenizer_vocab_size(m->tok) != m->model->cfg.vocab) {
        ak_failc(&e, AK_ERR_INVALID, "%s: tokenizer has %d tokens but token_embd.weight has %d rows", path,
                 ak_tokenizer_vocab_size(m->tok), m->model->cfg.vocab);
        goto fail;
    }
    e.code = AK_ERR_NONE;
    m->template_text = ak_chat_template_gguf(&m->model->gguf, &e);
    if (e.code != AK_ERR_NONE) goto fail;
    if (!o->chat_template) m->family = ak_chat_detect(m->template_text);
    *out = m;
    return ak_lib_ok(err);
fail:
    if (e.code == AK_ERR_GENERIC) e.code = AK_ERR_INVALID;
    agentkv_model_free(m);
    return ak_lib_fail(err, &e);
}

AGENTKV_API agentkv_status agentkv_model_get_info(const agentkv_model *m, agentkv_model_info *out) {
    if (!m || !out) return AGENTKV_ERR_INVALID;
    const ak_config *c = &m->model->cfg;
    *out = (agentkv_model_info){
        .arch = c->arch_name,
        .name = c->name,
        .fingerprint = m->model->fingerprint,
        .chat_template = ak_chat_family_name(m->family),
        .n_layer = c->n_layer,
        .dim = c->dim,
        .n_head = c->n_head,
        .n_head_kv = c->n_head_kv,
        .head_dim = c->head_dim,
        .vocab = c->vocab,
        .n_ctx_train = c->n_ctx_train,
        .bos = ak_tokenizer_bos(m->tok),
        .eos = ak_tokenizer_eos(m->tok),
        .weight_bytes = m->model->weight_bytes,
    };
    return AGENTKV_OK;
}

AGENTKV_API agentkv_status agentkv_tokenize(const agentkv_model *m, const char *text, size_t len, int flags,
                                            int32_t **tokens, size_t *n, agentkv_error *err) {
    if (!m || (!text && len) || !tokens || !n)
        return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_tokenize: NULL argument");
    if (flags & ~(AGENTKV_TOKENIZE_ADD_SPECIAL | AGENTKV_TOKENIZE_PARSE_SPECIAL))
        return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_tokenize: unknown flags 0x%x", (unsigned)flags);
    int f = (flags & AGENTKV_TOKENIZE_ADD_SPECIAL ? AK_TOK_ADD_SPECIAL : 0) |
            (flags & AGENTKV_TOKENIZE_PARSE_SPECIAL ? AK_TOK_PARSE_SPECIAL : 0);
    ak_error e = {{0}};
    if (ak_tokenize(m->tok, text ? text : "", len, f, tokens, n, &e) < 0) return ak_lib_fail(err, &e);
    return ak_lib_ok(err);
}

AGENTKV_API agentkv_status agentkv_detokenize(const agentkv_model *m, const int32_t *tokens, size_t n, char **text,
                                              size_t *len, agentkv_error *err) {
    if (!m || (!tokens && n) || !text)
        return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_detokenize: NULL argument");
    int vocab = ak_tokenizer_vocab_size(m->tok);
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return ak_lib_failc(err, AGENTKV_ERR_INVALID, "token %zu: id %d is outside the vocabulary (%d)", i,
                                (int)tokens[i], vocab);
    ak_error e = {{0}};
    size_t l = 0;
    if (!(*text = ak_detokenize(m->tok, tokens, n, &l, &e))) return ak_lib_fail(err, &e);
    if (len) *len = l;
    return ak_lib_ok(err);
}

AGENTKV_API int agentkv_token_is_eog(const agentkv_model *m, int32_t token) {
    return m && token >= 0 && token < ak_tokenizer_vocab_size(m->tok) && ak_token_is_eog(m->tok, token);
}

void ak_lib_chat_free(ak_lib_chat *c) {
    free(c->msgs);
    free(c->calls);
    free(c->tools);
    memset(c, 0, sizeof *c);
}

int ak_lib_chat_make(const agentkv_model *m, const agentkv_message *messages, int n, const agentkv_chat_options *o,
                     ak_lib_chat *c, ak_error *err) {
    memset(c, 0, sizeof *c);
    if (!messages || n < 1) return ak_failc(err, AK_ERR_INVALID, "no messages");
    int n_calls = 0;
    for (int i = 0; i < n; i++) {
        if (messages[i].n_calls < 0 || (messages[i].n_calls > 0 && !messages[i].calls))
            return ak_failc(err, AK_ERR_INVALID, "message %d: %d calls without a list", i, messages[i].n_calls);
        n_calls += messages[i].n_calls;
    }
    int n_tools = o ? o->n_tools : 0;
    if (n_tools < 0 || (n_tools > 0 && !o->tools)) return ak_failc(err, AK_ERR_INVALID, "%d tools without a list", n_tools);
    if (!(c->msgs = ak_calloc((size_t)n, sizeof *c->msgs, err)) ||
        (n_calls && !(c->calls = ak_calloc((size_t)n_calls, sizeof *c->calls, err))) ||
        (n_tools && !(c->tools = ak_calloc((size_t)n_tools, sizeof *c->tools, err)))) {
        ak_lib_chat_free(c);
        return -1;
    }
    for (int i = 0, k = 0; i < n; i++) {
        const agentkv_message *s = &messages[i];
        for (int j = 0; j < s->n_calls; j++)
            c->calls[k + j] = (ak_chat_call){.id = s->calls[j].id, .name = s->calls[j].name,
                                             .arguments = s->calls[j].arguments};
        c->msgs[i] = (ak_chat_msg){.role = s->role, .content = s->content, .reasoning = s->reasoning,
                                   .calls = s->n_calls ? c->calls + k : NULL, .n_calls = s->n_calls,
                                   .tool_call_id = s->tool_call_id};
        k += s->n_calls;
    }
    for (int i = 0; i < n_tools; i++)
        c->tools[i] = (ak_chat_tool){.name = o->tools[i].name, .description = o->tools[i].description,
                                     .parameters = o->tools[i].parameters};
    ak_chat_think think = !o || o->think == AGENTKV_THINK_DEFAULT ? AK_CHAT_THINK_DEFAULT
                          : o->think == AGENTKV_THINK_ON            ? AK_CHAT_THINK_ON
                                                                    : AK_CHAT_THINK_OFF;
    c->opts = (ak_chat_opts){.family = m->family, .template_text = m->template_text,
                             .add_generation_prompt = o && o->add_generation_prompt, .tools = c->tools,
                             .n_tools = n_tools, .think = think};
    return 0;
}

AGENTKV_API agentkv_status agentkv_chat_render(const agentkv_model *m, const agentkv_message *messages, int n,
                                               const agentkv_chat_options *o, char **text, agentkv_error *err) {
    if (!m || !text) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_chat_render: NULL argument");
    ak_error e = {{0}};
    ak_lib_chat c;
    if (ak_lib_chat_make(m, messages, n, o, &c, &e) < 0) return ak_lib_fail(err, &e);
    int rc = ak_chat_render(c.msgs, n, &c.opts, text, &e);
    ak_lib_chat_free(&c);
    if (rc < 0) return ak_lib_fail(err, &e);
    return ak_lib_ok(err);
}

AGENTKV_API agentkv_status agentkv_chat_tokenize(const agentkv_model *m, const agentkv_message *messages, int n,
                                                 const agentkv_chat_options *o, int32_t **tokens, size_t *n_tokens,
                                                 agentkv_error *err) {
    if (!m || !tokens || !n_tokens) return ak_lib_failc(err, AGENTKV_ERR_INVALID, "agentkv_chat_tokenize: NULL argument");
    ak_error e = {{0}};
    ak_lib_chat c;
    if (ak_lib_chat_make(m, messages, n, o, &c, &e) < 0) return ak_lib_fail(err, &e);
    int rc = ak_chat_tokenize(c.msgs, n, &c.opts, m->tok, AK_TOK_ADD_SPECIAL, tokens, n_tokens, &e);
    ak_lib_chat_free(&c);
    if (rc < 0) return ak_lib_fail(err, &e);
    return ak_lib_ok(err);
}

AGENTKV_API int agentkv_kv_format_count(void) { return AK_KV_NFORMATS; }

AGENTKV_API const char *agentkv_kv_format_name(int i) {
    return i >= 0 && i < AK_KV_NFORMATS ? ak_kv_format_get((ak_kv_format)i)->name : NULL;
}

AGENTKV_API agentkv_status agentkv_kv_format_bits(const char *name, int head_dim, double *bits) {
    ak_kv_format f;
    if (!name || !bits || ak_kv_format_parse(name, &f) < 0 || head_dim < 1 || !ak_kv_format_supports(f, head_dim))
        return AGENTKV_ERR_INVALID;
    *bits = ak_kv_format_bits(f, head_dim);
    return AGENTKV_OK;
}
