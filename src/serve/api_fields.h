/* api_fields.h - the request fields OpenAI defines for POST
 * /v1/chat/completions and POST /v1/completions (and this server's own),
 * one table row each: the endpoints it belongs to, the JSON types and range
 * it may take, and what this server does with it (its disposition). api.c
 * runs the table over a body before reading the fields it honours, so a
 * well-typed body is refused only for asking what the server cannot do.
 *
 * Every check treats null as absent. A field not in the table for the
 * endpoint (a client's extra, or another endpoint's field) is accepted and
 * ignored. Also here: the UTF-8 check of every string of a parsed body
 * (values and object keys, at any depth), and the reading of the sampler
 * fields the table validated.
 */
#ifndef AK_API_FIELDS_H
#define AK_API_FIELDS_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "serve/api.h"

/* Which endpoints a row applies to. */
enum { AK_API_EP_CHAT = 1, AK_API_EP_COMPLETIONS = 2, AK_API_EP_BOTH = 3 };

/* The JSON types a field may take (a mask). INT is a number with an
 * integral value; NUMBER any finite number. */
enum {
    AK_JT_BOOL = 1,
    AK_JT_INT = 2,
    AK_JT_NUMBER = 4,
    AK_JT_STRING = 8,
    AK_JT_ARRAY = 16,
    AK_JT_OBJECT = 32,
};

/* What the server does with a well-typed, in-range value. */
typedef enum {
    AK_FIELD_HONOURED,    /* read and acted on (api.c, or ak_api_read_sampler_fields) */
    AK_FIELD_NO_EFFECT,   /* accepted, changes nothing here (SDK defaults, annotations) */
    AK_FIELD_LACKING,     /* a value other than the row's no-op values asks for a capability this
                             server lacks: 400 unsupported_parameter naming the field */
} ak_api_field_disposition;

/* The body-wide facts a row's checks may need. */
typedef struct {
    int32_t vocab;            /* token ids are < vocab (logit_bias) */
} ak_api_field_ctx;

typedef struct ak_api_field ak_api_field;
struct ak_api_field {
    const char *name;
    unsigned endpoints;       /* AK_API_EP_* */
    unsigned types;           /* AK_JT_* mask; anything else is 400 invalid_type */
    double lo, hi;            /* numbers: the range (400 invalid_value outside); lo == hi: no range */
    int lo_open;              /* lo itself is out of range */
    const char *const *values;   /* strings: the only values (400 invalid_value), NULL-terminated; NULL: any */
    ak_api_field_disposition disp;
    /* the value's structure (members, elements) beyond its type; NULL: none. Returns 0, or -1 with e set */
    int (*check)(const ak_api_field *f, const cJSON *v, const ak_api_field_ctx *ctx, ak_api_error *e);
    /* AK_FIELD_LACKING: 1 when v (valid, not null) asks for nothing the server lacks; NULL: every
     * value does */
    int (*noop)(const cJSON *v);
    const char *lacks;        /* AK_FIELD_LACKING: what the server cannot do, for the message */
};

/* The table and its length. */
const ak_api_field *ak_api_fields(size_t *n);

/* The row of name for the chat (chat = 1) or completions endpoint, or NULL. */
const ak_api_field *ak_api_field_find(const char *name, int chat);

/* Checks every member of body (an object) that has a row for the endpoint:
 * type (400 invalid_type), range or value (400 invalid_value), structure,
 * and a lacking capability (400 unsupported_parameter), param naming the
 * field (or the member inside it, e.g. "metadata.k"). Returns 0, or -1
 * with *e set. */
int ak_api_check_fields(const cJSON *body, int chat, const ak_api_field_ctx *ctx, ak_api_error *e);

/* Reads the sampler fields of a body ak_api_check_fields accepted into *sp:
 * top_k, min_p, repetition_penalty, frequency_penalty, presence_penalty and
 * logit_bias (*bias: malloc'd, sp->logit_bias points to it; the caller
 * frees it; NULL when absent). Fields absent or null leave *sp as it is.
 * Returns 0, or -1 with *e set (500 when out of memory). */
int ak_api_read_sampler_fields(const cJSON *body, ak_sampler_params *sp, ak_logit_bias **bias, ak_api_error *e);

/* Why a byte string is not UTF-8. */
typedef enum {
    AK_UTF8_OK,
    AK_UTF8_BAD_BYTE,        /* a byte that cannot start a sequence (0x80..0xC1, 0xF5..0xFF) */
    AK_UTF8_TRUNCATED,       /* a sequence cut short (end of string or a non-continuation byte) */
    AK_UTF8_OVERLONG,        /* a longer encoding of a code point than its shortest */
    AK_UTF8_SURROGATE,       /* U+D800..U+DFFF */
    AK_UTF8_TOO_LARGE,       /* above U+10FFFF */
} ak_utf8_status;

/* Checks s[0..n): AK_UTF8_OK, or the first fault with *at its byte offset. */
ak_utf8_status ak_utf8_check(const char *s, size_t n, size_t *at);

/* A name for the fault ("overlong encoding", ...). */
const char *ak_utf8_status_name(ak_utf8_status st);

/* Checks every string of a parsed body, values and object keys at any
 * depth. Returns 0, or -1 with *e set: 400 invalid_encoding, param the
 * path of the string (e.g. "messages[1].content", "stop[0]"; for a key,
 * the path of the member it names, its faulty bytes written \xNN) in
 * e->param_buf. */
int ak_api_check_utf8(const cJSON *root, ak_api_error *e);

#endif
