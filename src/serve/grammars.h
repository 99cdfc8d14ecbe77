/* grammars.h - the server's compiled constraints (response_format): per
 * schema text, a grammar and its token masks over the server's one
 * vocabulary, built once and shared read-only by every request that sends
 * the same schema. The masks over a 151K-token vocabulary take seconds to
 * precompute: a schema kept here is never built again.
 *
 * THE CONTRACT.
 *   - One cache, one vocabulary (the tokenizer it was made with): the key
 *     is (kind, schema text); the vocabulary index is built on first use.
 *   - Thread-safe. A schema asked for while another thread builds it waits
 *     for that build (one compile per schema); builds of different schemas
 *     run at once on their callers' threads (the connections' threads,
 *     never the engine's).
 *   - Bounded: at most max_entries schemas and max_bytes of masks are kept;
 *     past either the least recently used is dropped. A dropped entry
 *     still held by a request lives until its last reference is released,
 *     and the cache itself until the last entry goes (so requests may
 *     outlive the server's reference to it).
 *   - A schema that fails to compile is not kept; its error (grammar.h's
 *     codes, the keyword and path at fault) comes back to each caller.
 */
#ifndef AK_GRAMMARS_H
#define AK_GRAMMARS_H

#include <stddef.h>
#include <stdint.h>

#include "text/grammar.h"
#include "text/tokenizer.h"
#include "text/tokmask.h"

typedef struct ak_grammars ak_grammars;
typedef struct ak_grammar_ref ak_grammar_ref;

typedef enum {
    AK_GRAMMAR_JSON_SCHEMA,   /* the text is a JSON Schema (jsonschema.h) */
    AK_GRAMMAR_JSON_OBJECT,   /* any JSON object (response_format json_object); the text is unused */
    AK_GRAMMAR_TOOL_CALLS     /* the text is a tool grammar's spec (toolgrammar.h: ak_toolg_spec) */
} ak_grammar_kind;

#define AK_GRAMMARS_DEFAULT_ENTRIES 64
#define AK_GRAMMARS_DEFAULT_BYTES   ((size_t)512 << 20)

/* A cache over tok's vocabulary (tok must outlive it and its entries);
 * limits of 0 take the defaults. NULL with err set on out of memory. */
ak_grammars *ak_grammars_new(const ak_tokenizer *tok, int max_entries, size_t max_bytes, ak_error *err);
/* Drops the caller's reference: entries not held are freed now, the rest
 * (and the cache) when their last reference is released. NULL is fine. */
void ak_grammars_free(ak_grammars *c);

/* The compiled constraint of (kind, text[0..len)), built if it is not kept:
 * *out is a reference the caller releases. Returns 0, or -1 with e set
 * (the compile's code: AK_GRAM_E_UNSUPPORTED with the keyword and path,
 * AK_GRAM_E_JSON, ..., AK_GRAM_E_NOMEM). */
int ak_grammars_get(ak_grammars *c, ak_grammar_kind kind, const char *text, size_t len, ak_grammar_ref **out,
                    ak_gram_error *e);
/* One more reference to r (another holder). */
void ak_grammar_ref_hold(ak_grammar_ref *r);
/* Drops a reference. NULL is fine. */
void ak_grammar_ref_release(ak_grammar_ref *r);
/* What a generator needs (generate.h: ak_gen_constraint); valid while r is held. */
const ak_grammar *ak_grammar_ref_grammar(const ak_grammar_ref *r);
const ak_tokmask *ak_grammar_ref_masks(const ak_grammar_ref *r);
const ak_vocab_index *ak_grammar_ref_vocab(const ak_grammar_ref *r);

/* What the cache holds and did. */
typedef struct {
    int entries;
    size_t bytes;             /* the kept masks' bytes */
    uint64_t hits, builds, evictions;
} ak_grammars_stats;
void ak_grammars_get_stats(ak_grammars *c, ak_grammars_stats *st);

#endif
