/* jsonschema.h - JSON Schema (draft 2020-12) compiled to a grammar
 * (grammar.h) whose matches are exactly JSON texts that the schema accepts.
 *
 * THE CONTRACT.
 *   - Supported: type (one or a list), enum, const; object: properties,
 *     required, additionalProperties; array: items, prefixItems, minItems,
 *     maxItems (and draft-7 `items: [..]` with additionalItems, read as
 *     prefixItems / items); string: minLength, maxLength, pattern (regex.h's
 *     subset, over the decoded string); integer and number: minimum,
 *     maximum, exclusiveMinimum, exclusiveMaximum (numbers, or draft-4
 *     booleans); anyOf; oneOf; allOf (merged keyword by keyword: properties
 *     and additionalProperties pairwise, bounds tightened, patterns and
 *     enums intersected); $ref to "#", "#/$defs/..", "#/definitions/.." or
 *     any JSON pointer into the same document, beside other keywords too
 *     (then it is one more allOf operand); true and false schemas.
 *   - Annotations are accepted and change nothing: $schema, $id, $anchor,
 *     $comment, $vocabulary, $defs, definitions, title, description,
 *     default, examples, deprecated, readOnly, writeOnly, format (an
 *     annotation in 2020-12), contentEncoding, contentMediaType,
 *     contentSchema, and keywords no vocabulary defines (discriminator,
 *     x-*, strict). A keyword that changes validity and is not supported
 *     (not, if/then/else, patternProperties, propertyNames, min/maxProperties,
 *     dependentRequired, dependentSchemas, dependencies, contains,
 *     min/maxContains, uniqueItems: true, multipleOf, unevaluatedItems,
 *     unevaluatedProperties, $dynamicRef, $recursiveRef, a $ref not into
 *     this document) is AK_GRAM_E_UNSUPPORTED naming it, never dropped. The
 *     value-free forms (uniqueItems: false, minItems: 0, ...) are accepted.
 *   - oneOf: exclusivity is kept by proof at compile time. The alternatives
 *     (each merged with the schema's other keywords) must be pairwise
 *     disjoint by type, by their enum/const values, by a property that both
 *     require with disjoint const/enum values (a discriminator, as Pydantic
 *     and Zod emit), or by a required property that the other's
 *     additionalProperties: false forbids; then oneOf is anyOf. Otherwise
 *     AK_GRAM_E_UNSUPPORTED names oneOf.
 *   - The language: compact JSON by default (AK_JS_WS_ANY allows JSON
 *     whitespace between tokens); object properties in the schema's order,
 *     each optional one skippable, additional ones (when allowed) after
 *     them (AK_JS_ANY_ORDER accepts any order, for validation; objects of
 *     up to AK_JS_ANY_ORDER_MAX named properties). Keys and strings with a
 *     pattern or an enum are written as cJSON prints them (raw UTF-8, the
 *     short escapes, \u00XX for other controls); other strings may use any
 *     JSON escape. Numbers with a bound are written without an exponent.
 *     Duplicate keys are never produced.
 *   - Bad input ends in bounded time and memory with a code: malformed
 *     (AK_GRAM_E_JSON / E_SCHEMA), nesting past AK_JS_MAX_DEPTH (E_DEPTH),
 *     enums past AK_JS_MAX_ENUM values (E_TOO_LARGE), grammars past
 *     AK_GRAM_MAX_STATES or opts.max_states (E_TOO_LARGE), a recursion
 *     without a base case or a schema no instance meets
 *     (E_UNSATISFIABLE), a $ref cycle that reads nothing (E_UNSATISFIABLE).
 */
#ifndef AK_JSONSCHEMA_H
#define AK_JSONSCHEMA_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "text/grammar.h"

#define AK_JS_MAX_DEPTH 128
#define AK_JS_MAX_ENUM 8192
#define AK_JS_ANY_ORDER_MAX 10

enum {
    AK_JS_WS_COMPACT = 0,   /* no whitespace */
    AK_JS_WS_ANY = 1,       /* any JSON whitespace between tokens */
    AK_JS_WS_PY = 2         /* ": " and ", ", no other whitespace (Python's json.dumps, the templates' tojson) */
};

typedef struct {
    int ws;          /* AK_JS_WS_* */
    int any_order;   /* 1: object properties in any order (validation) */
    int max_states;  /* 0: AK_GRAM_MAX_STATES */
} ak_js_opts;

/* Compiles schema text[0..len) (NULL opts: defaults). Returns the grammar,
 * or NULL with e set (codes above). */
ak_grammar *ak_jsonschema_compile(const char *text, size_t len, const ak_js_opts *opts, ak_gram_error *e);

/* The grammar of any JSON object (response_format json_object). */
ak_grammar *ak_json_object_grammar(const ak_js_opts *opts, ak_gram_error *e);

/* Adds schema (a parsed document: $ref pointers resolve in it) to builder
 * b as a rule and returns its id, or -1 with e set: for grammars that embed
 * several schemas (tool calls). The schema must outlive the call only. */
int ak_jsonschema_add(ak_gbuild *b, const cJSON *schema, const ak_js_opts *opts, ak_gram_error *e);

#endif
