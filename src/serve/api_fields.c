/* api_fields.c - see api_fields.h */
#include "serve/api_fields.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* Like ak_api_fail, with param "NAME.MEMBER" built in e->param_buf. */
static int fail_member(ak_api_error *e, const char *name, const char *member, const char *code, const char *what) {
    snprintf(e->param_buf, sizeof e->param_buf, "%s.%.64s", name, member);
    return ak_api_fail(e, 400, e->param_buf, code, "%s %s", e->param_buf, what);
}

/* ------------------------------------------------------------ UTF-8 */

ak_utf8_status ak_utf8_check(const char *str, size_t n, size_t *at) {
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        *at = i;
        if (c < 0xC0 || c > 0xF7) return AK_UTF8_BAD_BYTE;   /* a continuation byte, or no UTF-8 lead */
        uint32_t cp = c & (0x7F >> len);
        for (size_t k = 1; k < len; k++) {
            if (i + k >= n || (s[i + k] & 0xC0) != 0x80) return AK_UTF8_TRUNCATED;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len]) return AK_UTF8_OVERLONG;
        if (cp >= 0xD800 && cp <= 0xDFFF) return AK_UTF8_SURROGATE;
        if (cp > 0x10FFFF) return AK_UTF8_TOO_LARGE;
        i += len;
    }
    return AK_UTF8_OK;
}

const char *ak_utf8_status_name(ak_utf8_status st) {
    switch (st) {
    case AK_UTF8_OK: return "valid";
    case AK_UTF8_BAD_BYTE: return "a byte that starts no UTF-8 sequence";
    case AK_UTF8_TRUNCATED: return "a truncated sequence";
    case AK_UTF8_OVERLONG: return "an overlong encoding";
    case AK_UTF8_SURROGATE: return "a UTF-16 surrogate (U+D800..U+DFFF)";
    case AK_UTF8_TOO_LARGE: return "a code point above U+10FFFF";
    }
    return "?";
}

/* A string's path inside the body, built as the walk descends. Past the
 * buffer's end segments are dropped and the path ends with "...". */
typedef struct {
    char s[160];
    size_t len;
    int cut;
} json_path;

/* Appends the text of fmt; returns the length before, to pop back to. */
static size_t path_push(json_path *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static size_t path_push(json_path *p, const char *fmt, ...) {
    size_t was = p->len;
    char seg[160];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(seg, sizeof seg, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof seg || p->len + (size_t)n + 4 > sizeof p->s) {
        p->cut = 1;
        return was;
    }
    memcpy(p->s + p->len, seg, (size_t)n + 1);
    p->len += (size_t)n;
    return was;
}

/* Appends a member's key (a "." before it unless it is the first
 * segment): valid UTF-8 copied, any other byte written \xNN, so the path
 * itself is valid UTF-8. Returns the length before. */
static size_t path_push_key(json_path *p, const char *key) {
    size_t was = p->len, n = strlen(key), k = 0;
    char seg[sizeof p->s];
    if (p->len) seg[k++] = '.';
    for (size_t i = 0; i < n;) {
        size_t off;
        size_t good = ak_utf8_check(key + i, n - i, &off) == AK_UTF8_OK ? n - i : off;
        if (k + good + 5 > sizeof seg) {
            p->cut = 1;
            return was;
        }
        memcpy(seg + k, key + i, good);
        k += good;
        i += good;
        if (i < n) k += (size_t)snprintf(seg + k, sizeof seg - k, "\\x%02X", (unsigned char)key[i++]);
    }
    if (p->len + k + 4 > sizeof p->s) {
        p->cut = 1;
        return was;
    }
    memcpy(p->s + p->len, seg, k);
    p->len += k;
    p->s[p->len] = 0;
    return was;
}

static void path_pop(json_path *p, size_t to) {
    p->len = to;
    p->s[to] = 0;
}

/* Sets e for the faulty string at path p (what: "" for a value, "the key
 * of " for a key). */
static int utf8_fail(ak_api_error *e, const json_path *p, const char *what, ak_utf8_status st, size_t at) {
    if (p->len == 0) return ak_api_fail(e, 400, NULL, "invalid_encoding", "%sthe request body is not valid UTF-8: %s at byte %zu",
                                 what, ak_utf8_status_name(st), at);
    size_t n = p->len < sizeof e->param_buf - 4 ? p->len : sizeof e->param_buf - 4;
    memcpy(e->param_buf, p->s, n);
    if (p->cut) {
        memcpy(e->param_buf + n, "...", 3);
        n += 3;
    }
    e->param_buf[n] = 0;
    return ak_api_fail(e, 400, e->param_buf, "invalid_encoding", "%s%s is not valid UTF-8: %s at byte %zu", what, e->param_buf,
                ak_utf8_status_name(st), at);
}

/* Checks v and everything under it; p is v's path. */
static int walk_utf8(const cJSON *v, json_path *p, ak_api_error *e) {
    size_t at;
    ak_utf8_status st;
    if (cJSON_IsString(v) && v->valuestring) {
        if ((st = ak_utf8_check(v->valuestring, strlen(v->valuestring), &at)) != AK_UTF8_OK)
            return utf8_fail(e, p, "", st, at);
    } else if (cJSON_IsArray(v)) {
        int i = 0;
        for (const cJSON *c = v->child; c; c = c->next, i++) {
            size_t was = path_push(p, "[%d]", i);
            int rc = walk_utf8(c, p, e);
            path_pop(p, was);
            if (rc < 0) return -1;
        }
    } else if (cJSON_IsObject(v)) {
        for (const cJSON *c = v->child; c; c = c->next) {
            const char *key = c->string ? c->string : "";
            size_t was = path_push_key(p, key);
            if ((st = ak_utf8_check(key, strlen(key), &at)) != AK_UTF8_OK) return utf8_fail(e, p, "the key of ", st, at);
            int rc = walk_utf8(c, p, e);
            path_pop(p, was);
            if (rc < 0) return -1;
        }
    }
    return 0;
}

int ak_api_check_utf8(const cJSON *root, ak_api_error *e) {
    json_path p = {.len = 0};
    return walk_utf8(root, &p, e);
}

/* ------------------------------------------------------------ the table */

/* no-op values of lacking fields */
static int noop_false(const cJSON *v) { return !cJSON_IsTrue(v); }
static int noop_one(const cJSON *v) { return v->valuedouble == 1; }
static int noop_empty_string(const cJSON *v) { return !v->valuestring[0]; }
static int noop_empty_array(const cJSON *v) { return v->child == NULL; }
static int noop_none_or_auto(const cJSON *v) {
    return cJSON_IsString(v) && (!strcmp(v->valuestring, "none") || !strcmp(v->valuestring, "auto"));
}
static int noop_text_only(const cJSON *v) {
    for (const cJSON *c = v->child; c; c = c->next)
        if (strcmp(c->valuestring, "text")) return 0;
    return 1;
}

/* Characters (code points) of a valid UTF-8 string. */
static size_t utf8_chars(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* stream_options: its booleans typed; other members accepted. */
static int check_stream_options(const ak_api_field *f, const cJSON *v, const ak_api_field_ctx *ctx, ak_api_error *e) {
    static const char *const flags[] = {"include_usage", "include_obfuscation"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(v, flags[i]);
        if (x && !cJSON_IsNull(x) && !cJSON_IsBool(x)) return fail_member(e, f->name, flags[i], "invalid_type", "must be a boolean");
    }
    return 0;
}

/* metadata: at most 16 string values, keys of at most 64 characters, values of at most 512. */
static int check_metadata(const ak_api_field *f, const cJSON *v, const ak_api_field_ctx *ctx, ak_api_error *e) {
    int n = 0;
    for (const cJSON *c = v->child; c; c = c->next) {
        if (++n > 16) return ak_api_fail(e, 400, f->name, "invalid_value", "metadata has more than 16 keys");
        if (utf8_chars(c->string) > 64)
            return ak_api_fail(e, 400, f->name, "invalid_value", "metadata key '%.64s...' is longer than 64 characters", c->string);
        if (!cJSON_IsString(c)) return fail_member(e, f->name, c->string, "invalid_type", "must be a string");
        if (utf8_chars(c->valuestring) > 512)
            return fail_member(e, f->name, c->string, "invalid_value", "is longer than 512 characters");
    }
    return 0;
}

/* A token id written in decimal, canonical (no sign, no leading zero), below vocab: the id, else -1. */
static long token_key(const char *s, int32_t vocab) {
    if (!s[0] || (s[0] == '0' && s[1])) return -1;
    long id = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        id = id * 10 + (*s - '0');
        if (id >= vocab) return -1;
    }
    return id;
}

/* logit_bias: token id -> number in [-100, 100]. */
static int check_logit_bias(const ak_api_field *f, const cJSON *v, const ak_api_field_ctx *ctx, ak_api_error *e) {
    for (const cJSON *c = v->child; c; c = c->next) {
        if (token_key(c->string, ctx->vocab) < 0)
            return fail_member(e, f->name, c->string, "invalid_value", "does not name a token of this model's vocabulary "
                               "(keys are token ids in decimal)");
        if (!cJSON_IsNumber(c)) return fail_member(e, f->name, c->string, "invalid_type", "must be a number");
        if (!(c->valuedouble >= -100 && c->valuedouble <= 100))
            return fail_member(e, f->name, c->string, "invalid_value", "must be between -100 and 100");
    }
    return 0;
}

/* modalities: strings, each a modality OpenAI defines. */
static int check_modalities(const ak_api_field *f, const cJSON *v, const ak_api_field_ctx *ctx, ak_api_error *e) {
    for (const cJSON *c = v->child; c; c = c->next) {
        if (!cJSON_IsString(c)) return ak_api_fail(e, 400, f->name, "invalid_type", "modalities must be an array of strings");
        if (strcmp(c->valuestring, "text") && strcmp(c->valuestring, "audio"))
            return ak_api_fail(e, 400, f->name, "invalid_value", "modality '%.32s' is not one of text, audio", c->valuestring);
    }
    return 0;
}

/* tools, functions: arrays of objects. */
static int check_objects(const ak_api_field *f, const cJSON *v, const ak_api_field_ctx *ctx, ak_api_error *e) {
    int i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++)
        if (!cJSON_IsObject(c)) return ak_api_fail(e, 400, f->name, "invalid_type", "%s[%d] must be an object", f->name, i);
    return 0;
}

/* An object with a string "type" (tool_choice, function_call and
 * response_format objects); response_format's type one of OpenAI's. */
static int check_typed_object(const ak_api_field *f, const cJSON *v, const ak_api_field_ctx *ctx, ak_api_error *e) {
    if (!cJSON_IsObject(v)) return 0;   /* a string: the row's values */
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
    if (!strcmp(f->name, "function_call")) t = cJSON_GetObjectItemCaseSensitive(v, "name");
    const char *m = strcmp(f->name, "function_call") ? "type" : "name";
    if (!t) return fail_member(e, f->name, m, "missing_required_parameter", "is required");
    if (!cJSON_IsString(t)) return fail_member(e, f->name, m, "invalid_type", "must be a string");
    if (!strcmp(f->name, "response_format") && strcmp(t->valuestring, "text") && strcmp(t->valuestring, "json_object") &&
        strcmp(t->valuestring, "json_schema"))
        return fail_member(e, f->name, m, "invalid_value", "must be one of text, json_object, json_schema");
    return 0;
}

static const char *const tool_choices[] = {"none", "auto", "required", NULL};
static const char *const function_calls[] = {"none", "auto", NULL};
static const char *const service_tiers[] = {"auto", "default", "flex", "scale", "priority", NULL};
static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh", NULL};
static const char *const verbosities[] = {"low", "medium", "high", NULL};
static const char *const retentions[] = {"in-memory", "24h", NULL};

#define CHAT AK_API_EP_CHAT
#define COMPL AK_API_EP_COMPLETIONS
#define BOTH AK_API_EP_BOTH

/* The rows, by disposition. To implement a capability, make its row
 * AK_FIELD_HONOURED (the type and range checks stay) and read it in api.c. */
static const ak_api_field fields[] = {
    /* honoured: read by api.c */
    {.name = "model", .endpoints = BOTH, .types = AK_JT_STRING},
    {.name = "messages", .endpoints = CHAT, .types = AK_JT_ARRAY},
    {.name = "prompt", .endpoints = COMPL, .types = AK_JT_STRING | AK_JT_ARRAY},
    {.name = "max_tokens", .endpoints = BOTH, .types = AK_JT_INT, .lo = 1, .hi = 1 << 24},
    {.name = "max_completion_tokens", .endpoints = BOTH, .types = AK_JT_INT, .lo = 1, .hi = 1 << 24},
    {.name = "temperature", .endpoints = BOTH, .types = AK_JT_NUMBER, .lo = 0, .hi = 2},
    {.name = "top_p", .endpoints = BOTH, .types = AK_JT_NUMBER, .lo = 0, .hi = 1, .lo_open = 1},
    {.name = "seed", .endpoints = BOTH, .types = AK_JT_INT, .lo = -(double)(1LL << 62), .hi = (double)(1LL << 62)},
    {.name = "stream", .endpoints = BOTH, .types = AK_JT_BOOL},
    {.name = "stream_options", .endpoints = BOTH, .types = AK_JT_OBJECT, .check = check_stream_options},
    {.name = "stop", .endpoints = BOTH, .types = AK_JT_STRING | AK_JT_ARRAY},
    {.name = "prompt_cache_key", .endpoints = BOTH, .types = AK_JT_STRING},   /* names the agent (api.h) */
    /* honoured: this server's own */
    {.name = "agent_id", .endpoints = BOTH, .types = AK_JT_STRING},
    {.name = "pool", .endpoints = BOTH, .types = AK_JT_STRING},
    {.name = "memories", .endpoints = BOTH, .types = AK_JT_ARRAY},
    {.name = "reuse", .endpoints = BOTH, .types = AK_JT_STRING},
    {.name = "recompute_ratio", .endpoints = BOTH, .types = AK_JT_NUMBER, .lo = 0, .hi = 1},
    {.name = "handoff_reuse", .endpoints = BOTH, .types = AK_JT_STRING},
    /* honoured: the sampler's (ak_api_read_sampler_fields); top_k, min_p and
     * repetition_penalty are not OpenAI's, but llama.cpp's and vLLM's servers take them */
    {.name = "top_k", .endpoints = BOTH, .types = AK_JT_INT, .lo = 0, .hi = 1 << 30},
    {.name = "min_p", .endpoints = BOTH, .types = AK_JT_NUMBER, .lo = 0, .hi = 1},
    {.name = "repetition_penalty", .endpoints = BOTH, .types = AK_JT_NUMBER, .lo = 0, .hi = 100, .lo_open = 1},
    {.name = "frequency_penalty", .endpoints = BOTH, .types = AK_JT_NUMBER, .lo = -2, .hi = 2},
    {.name = "presence_penalty", .endpoints = BOTH, .types = AK_JT_NUMBER, .lo = -2, .hi = 2},
    {.name = "logit_bias", .endpoints = BOTH, .types = AK_JT_OBJECT, .check = check_logit_bias},
    /* honoured: structured output (api.c: parse_response_format; api.h: STRUCTURED OUTPUT) */
    {.name = "response_format", .endpoints = CHAT, .types = AK_JT_OBJECT, .check = check_typed_object},
    /* honoured: tools and thinking (api_tools.c; api.h: TOOLS); reasoning_effort "none" turns
     * thinking off, the other efforts on */
    {.name = "tools", .endpoints = CHAT, .types = AK_JT_ARRAY, .check = check_objects},
    {.name = "tool_choice", .endpoints = CHAT, .types = AK_JT_STRING | AK_JT_OBJECT, .values = tool_choices,
     .check = check_typed_object},
    {.name = "parallel_tool_calls", .endpoints = CHAT, .types = AK_JT_BOOL},
    {.name = "reasoning_effort", .endpoints = CHAT, .types = AK_JT_STRING, .values = efforts},
    {.name = "chat_template_kwargs", .endpoints = CHAT, .types = AK_JT_OBJECT},
    /* honoured: choices (api.h: CHOICES), at most AK_MAX_CHOICES */
    {.name = "n", .endpoints = BOTH, .types = AK_JT_INT, .lo = 1, .hi = AK_MAX_CHOICES},
    /* honoured: log-probabilities (api.c: parse_logprobs; api.h: LOGPROBS) */
    {.name = "logprobs", .endpoints = CHAT, .types = AK_JT_BOOL},
    {.name = "logprobs", .endpoints = COMPL, .types = AK_JT_INT, .lo = 0, .hi = 5},
    {.name = "top_logprobs", .endpoints = CHAT, .types = AK_JT_INT, .lo = 0, .hi = 20},
    /* accepted with no effect */
    {.name = "user", .endpoints = BOTH, .types = AK_JT_STRING, .disp = AK_FIELD_NO_EFFECT},
    {.name = "safety_identifier", .endpoints = CHAT, .types = AK_JT_STRING, .disp = AK_FIELD_NO_EFFECT},
    {.name = "store", .endpoints = CHAT, .types = AK_JT_BOOL, .disp = AK_FIELD_NO_EFFECT},
    {.name = "metadata", .endpoints = CHAT, .types = AK_JT_OBJECT, .disp = AK_FIELD_NO_EFFECT, .check = check_metadata},
    {.name = "prompt_cache_retention", .endpoints = CHAT, .types = AK_JT_STRING, .values = retentions,
     .disp = AK_FIELD_NO_EFFECT},
    {.name = "service_tier", .endpoints = CHAT, .types = AK_JT_STRING, .values = service_tiers, .disp = AK_FIELD_NO_EFFECT},
    {.name = "verbosity", .endpoints = CHAT, .types = AK_JT_STRING, .values = verbosities, .disp = AK_FIELD_NO_EFFECT},
    /* lacking: 400 unless the value asks for nothing */
    {.name = "functions", .endpoints = CHAT, .types = AK_JT_ARRAY, .disp = AK_FIELD_LACKING, .check = check_objects,
     .noop = noop_empty_array, .lacks = "function calling"},
    {.name = "function_call", .endpoints = CHAT, .types = AK_JT_STRING | AK_JT_OBJECT, .values = function_calls,
     .disp = AK_FIELD_LACKING, .check = check_typed_object, .noop = noop_none_or_auto, .lacks = "function calling"},
    {.name = "modalities", .endpoints = CHAT, .types = AK_JT_ARRAY, .disp = AK_FIELD_LACKING, .check = check_modalities,
     .noop = noop_text_only, .lacks = "output other than text (only [\"text\"])"},
    {.name = "audio", .endpoints = CHAT, .types = AK_JT_OBJECT, .disp = AK_FIELD_LACKING, .lacks = "audio output"},
    {.name = "prediction", .endpoints = CHAT, .types = AK_JT_OBJECT, .disp = AK_FIELD_LACKING,
     .lacks = "predicted outputs"},
    {.name = "web_search_options", .endpoints = CHAT, .types = AK_JT_OBJECT, .disp = AK_FIELD_LACKING,
     .lacks = "web search"},
    {.name = "echo", .endpoints = COMPL, .types = AK_JT_BOOL, .disp = AK_FIELD_LACKING, .noop = noop_false,
     .lacks = "echoing the prompt"},
    {.name = "best_of", .endpoints = COMPL, .types = AK_JT_INT, .lo = 0, .hi = 20, .disp = AK_FIELD_LACKING,
     .noop = noop_one, .lacks = "best-of sampling (best_of = 1 only)"},
    {.name = "suffix", .endpoints = COMPL, .types = AK_JT_STRING, .disp = AK_FIELD_LACKING, .noop = noop_empty_string,
     .lacks = "insertion (a suffix)"},
};

#undef CHAT
#undef COMPL
#undef BOTH

const ak_api_field *ak_api_fields(size_t *n) {
    *n = sizeof fields / sizeof *fields;
    return fields;
}

const ak_api_field *ak_api_field_find(const char *name, int chat) {
    unsigned ep = chat ? AK_API_EP_CHAT : AK_API_EP_COMPLETIONS;
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        if ((fields[i].endpoints & ep) && !strcmp(fields[i].name, name)) return &fields[i];
    return NULL;
}

/* The JSON type of v as a mask bit (AK_JT_INT and AK_JT_NUMBER both for an
 * integral number), 0 for anything else. */
static unsigned json_type(const cJSON *v) {
    if (cJSON_IsBool(v)) return AK_JT_BOOL;
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        return !isfinite(d) || d == floor(d) ? AK_JT_INT | AK_JT_NUMBER : AK_JT_NUMBER;
    }
    if (cJSON_IsString(v)) return AK_JT_STRING;
    if (cJSON_IsArray(v)) return AK_JT_ARRAY;
    if (cJSON_IsObject(v)) return AK_JT_OBJECT;
    return 0;
}

/* "a string or an array" for a type mask. */
static void type_names(unsigned types, char *out, size_t cap) {
    static const struct { unsigned bit; const char *name; } names[] = {
        {AK_JT_BOOL, "a boolean"}, {AK_JT_INT, "an integer"}, {AK_JT_NUMBER, "a number"},
        {AK_JT_STRING, "a string"}, {AK_JT_ARRAY, "an array"},   {AK_JT_OBJECT, "an object"},
    };
    size_t at = 0;
    out[0] = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (types & names[i].bit && at < cap)
            at += (size_t)snprintf(out + at, cap - at, "%s%s", at ? " or " : "", names[i].name);
}

/* Checks one member against its row. */
static int check_field(const ak_api_field *f, const cJSON *v, const ak_api_field_ctx *ctx, ak_api_error *e) {
    unsigned t = json_type(v);
    if (!(t & f->types)) {
        char want[96];
        type_names(f->types, want, sizeof want);
        return ak_api_fail(e, 400, f->name, "invalid_type", "%s must be %s", f->name, want);
    }
    if (t & (AK_JT_INT | AK_JT_NUMBER)) {
        double d = v->valuedouble;
        if (!isfinite(d)) return ak_api_fail(e, 400, f->name, "invalid_value", "%s must be a finite number", f->name);
        if (f->lo != f->hi && (d < f->lo || (f->lo_open && d == f->lo) || d > f->hi))
            return ak_api_fail(e, 400, f->name, "invalid_value", "%s must be %s %g and at most %g", f->name,
                        f->lo_open ? "greater than" : "at least", f->lo, f->hi);
    }
    if (t == AK_JT_STRING && f->values) {
        size_t i = 0;
        while (f->values[i] && strcmp(f->values[i], v->valuestring)) i++;
        if (!f->values[i]) {
            char list[160];
            size_t at = 0;
            for (size_t k = 0; f->values[k] && at < sizeof list; k++)
                at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", k ? ", " : "", f->values[k]);
            return ak_api_fail(e, 400, f->name, "invalid_value", "%s '%.64s' is not one of %s", f->name, v->valuestring, list);
        }
    }
    if (f->check && f->check(f, v, ctx, e) < 0) return -1;
    if (f->disp == AK_FIELD_LACKING && !(f->noop && f->noop(v)))
        return ak_api_fail(e, 400, f->name, "unsupported_parameter", "%s is not supported: this server has no %s", f->name,
                    f->lacks);
    return 0;
}

int ak_api_check_fields(const cJSON *body, int chat, const ak_api_field_ctx *ctx, ak_api_error *e) {
    for (const cJSON *c = body->child; c; c = c->next) {
        if (!c->string || cJSON_IsNull(c)) continue;
        const ak_api_field *f = ak_api_field_find(c->string, chat);
        if (f && check_field(f, c, ctx, e) < 0) return -1;
    }
    return 0;
}

/* ------------------------------------------------------ sampler fields */

static int bias_by_id(const void *a, const void *b) {
    int32_t x = ((const ak_logit_bias *)a)->id, y = ((const ak_logit_bias *)b)->id;
    return (x > y) - (x < y);
}

/* The number of a member that is present and not null, or NULL. */
static const cJSON *num(const cJSON *body, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
    return cJSON_IsNumber(v) ? v : NULL;
}

int ak_api_read_sampler_fields(const cJSON *body, ak_sampler_params *sp, ak_logit_bias **bias, ak_api_error *e) {
    const cJSON *v;
    *bias = NULL;
    if ((v = num(body, "top_k"))) sp->top_k = (int)v->valuedouble;
    if ((v = num(body, "min_p"))) sp->min_p = (float)v->valuedouble;
    if ((v = num(body, "repetition_penalty"))) sp->repeat_penalty = (float)v->valuedouble;
    if ((v = num(body, "frequency_penalty"))) sp->frequency_penalty = (float)v->valuedouble;
    if ((v = num(body, "presence_penalty"))) sp->presence_penalty = (float)v->valuedouble;
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(body, "logit_bias");
    int n = cJSON_IsObject(lb) ? cJSON_GetArraySize(lb) : 0;
    if (n == 0) return 0;
    ak_logit_bias *b = malloc(sizeof *b * (size_t)n);
    if (!b) return ak_api_fail(e, 500, NULL, NULL, "out of memory");
    int k = 0;
    for (const cJSON *c = lb->child; c && k < n; c = c->next) {
        /* validated by the table: a decimal token id and a number in [-100, 100] */
        b[k++] = (ak_logit_bias){.id = (int32_t)strtol(c->string, NULL, 10), .bias = (float)c->valuedouble};
    }
    qsort(b, (size_t)k, sizeof *b, bias_by_id);
    for (int i = 1; i < k; i++)
        if (b[i].id == b[i - 1].id) {
            int32_t id = b[i].id;
            free(b);
            snprintf(e->param_buf, sizeof e->param_buf, "logit_bias.%d", (int)id);
            return ak_api_fail(e, 400, e->param_buf, "invalid_value", "logit_bias names token %d more than once", (int)id);
        }
    *bias = b;
    sp->logit_bias = b;
    sp->n_logit_bias = k;
    return 0;
}
