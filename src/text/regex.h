/* regex.h - the regular expressions of JSON Schema's `pattern`, compiled to
 * a byte DFA of bounded size.
 *
 * THE CONTRACT. The subset of ECMA-262 supported: literals (UTF-8), `.`,
 * classes `[...]` / `[^...]` with ranges, the escapes \d \D \w \W \s \S
 * \t \n \r \f \v \0 \xHH \uHHHH and escaped punctuation, groups `( )`,
 * `(?: )` and `(?<name> )`, alternation `|`, the quantifiers * + ? {n}
 * {n,} {n,m} (lazy forms match the same strings), `^` at the start and `$`
 * at the end of a top-level alternative. Matching is over code points, so
 * the DFA accepts valid UTF-8 only; `.` and negated classes never match a
 * surrogate. Anything else (back-references, look-around, \b, \p{..},
 * anchors elsewhere) is AK_GRAM_E_REGEX, never silently changed.
 *
 * Sizes are bounded: the NFA by AK_REGEX_MAX_NFA nodes (a {n,m} that
 * expands past it) and the DFA by the caller's max_states; past either the
 * result is AK_GRAM_E_TOO_LARGE (a regex that explodes), found in time
 * linear in the limits.
 */
#ifndef AK_REGEX_H
#define AK_REGEX_H

#include <stddef.h>

#include "text/grammar.h"

#define AK_REGEX_MAX_NFA 40000

enum {
    AK_RE_SEARCH = 0,   /* JSON Schema: the pattern may match anywhere unless anchored */
    AK_RE_FULL = 1      /* the whole string must match (anchors are then redundant) */
};

/* Compiles pat[0..len) into out (tag 0 on accepting states). Returns 0, or
 * -1 with e set (AK_GRAM_E_REGEX with the offset in the message,
 * AK_GRAM_E_TOO_LARGE, AK_GRAM_E_NOMEM); out is then empty. */
int ak_regex_compile(const char *pat, size_t len, int mode, int max_states, ak_bdfa *out, ak_gram_error *e);

#endif
