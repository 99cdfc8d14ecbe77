/* tokmask.h - which tokens of a vocabulary keep a grammar's output valid:
 * the per-step mask of constrained decoding, and the token path that
 * closes the output when the budget runs out.
 *
 * THE CONTRACT.
 *   - ak_vocab_index: a vocabulary's token bytes in a byte trie, built once
 *     per tokenizer (or from token strings: npm tokenizers, tests) and
 *     shared read-only. Tokens whose bytes are empty (control tokens) are
 *     never allowed, but the end-of-generation ones, which are allowed
 *     exactly when the output is a whole match.
 *   - ak_tokmask: one grammar over one vocabulary, built once and shared
 *     read-only by every sequence and thread. Building it groups grammar
 *     states that no token can tell apart (the same moves for as many
 *     bytes as the longest token has) and, per group, walks the trie from
 *     that state alone: a token whose bytes stay inside the state's rule (or
 *     end it exactly) is ACCEPTED or REJECTED whatever the stack below;
 *     one that runs past the rule's end, on a byte that may follow the rule
 *     somewhere, is UNCERTAIN. At run time a mask is the accepted sets of
 *     the live stacks' tops plus the uncertain tokens that the full state
 *     takes (checked in byte order, sharing prefixes).
 *   - A mask is exact: bit t is set iff feeding token t's bytes to the
 *     matcher succeeds (and for an end-of-generation token, iff the matcher
 *     is accepting). Tests compare it with that brute force.
 *   - Per sequence: an ak_gmatch (grammar.h) and an ak_tmscratch (scratch of
 *     the mask computation); nothing else is written.
 *   - The budget: ak_tokmask_close_plan gives the tokens of the shortest
 *     closing bytes (greedy longest tokens along them); a caller with
 *     tokens_left <= its length must follow that plan (kept by the caller)
 *     and ends valid. ak_tokmask_budget_ok says whether a token keeps a plan
 *     within the tokens left after it; ak_tokmask_min_tokens is the plan from
 *     the start: a max_tokens below it is refused up front.
 */
#ifndef AK_TOKMASK_H
#define AK_TOKMASK_H

#include <stddef.h>
#include <stdint.h>

#include "text/grammar.h"
#include "text/tokenizer.h"

typedef struct ak_vocab_index ak_vocab_index;
typedef struct ak_tokmask ak_tokmask;
typedef struct ak_tmscratch ak_tmscratch;

/* The index of tk's vocabulary (ak_token_bytes of each id; EOG by
 * ak_token_is_eog). NULL with e set on out of memory. */
ak_vocab_index *ak_vocab_index_new(const ak_tokenizer *tk, ak_gram_error *e);
/* The index of n tokens given as byte strings bytes[i][0..lens[i]); eog
 * (may be NULL) marks the end-of-generation tokens. Copies everything. */
ak_vocab_index *ak_vocab_index_from_bytes(const char *const *bytes, const size_t *lens, const uint8_t *eog, int32_t n,
                                          ak_gram_error *e);
void ak_vocab_index_free(ak_vocab_index *v);
int32_t ak_vocab_index_size(const ak_vocab_index *v);
/* The longest token in bytes. */
int ak_vocab_index_max_len(const ak_vocab_index *v);
/* Token id's bytes (pointer valid while v lives). */
const char *ak_vocab_index_token(const ak_vocab_index *v, int32_t id, size_t *len);

/* Precomputes g's masks over v (both must outlive the result). NULL with e
 * set (AK_GRAM_E_NOMEM). */
ak_tokmask *ak_tokmask_new(const ak_grammar *g, const ak_vocab_index *v, ak_gram_error *e);
void ak_tokmask_free(ak_tokmask *tm);
/* Grammar states, groups of states that share a mask, bytes held. */
void ak_tokmask_stats(const ak_tokmask *tm, int *n_states, int *n_groups, size_t *bytes);

/* Scratch for ak_tokmask_fill (one per sequence or thread). */
ak_tmscratch *ak_tmscratch_new(const ak_tokmask *tm);
void ak_tmscratch_free(ak_tmscratch *s);

/* Words of a mask: (vocab size + 31) / 32. */
size_t ak_tokmask_words(const ak_tokmask *tm);
/* Writes the mask of m's state (bit t of word t/32: token t allowed) and
 * returns how many tokens are allowed, or -1 on out of memory. In FREE mode
 * every token is allowed. */
long ak_tokmask_fill(const ak_tokmask *tm, const ak_gmatch *m, ak_tmscratch *s, uint32_t *mask);
/* Advances m by token tok: 0, or -1 when tok is not allowed (m unchanged).
 * An end-of-generation token is allowed (and changes nothing) when m is
 * accepting. */
int ak_tokmask_accept(const ak_tokmask *tm, ak_gmatch *m, int32_t tok);

/* The tokens that close m's output (the shortest closing bytes, cut into
 * the longest tokens along them), up to cap written to plan; returns their
 * number (0 when m is accepting), or -1 when no token sequence spells them
 * (a vocabulary without some byte). */
long ak_tokmask_close_plan(const ak_tokmask *tm, const ak_gmatch *m, int32_t *plan, size_t cap);
/* 1 when after tok the close plan fits in tokens_left - 1 tokens. */
int ak_tokmask_budget_ok(const ak_tokmask *tm, const ak_gmatch *m, int32_t tok, long tokens_left);
/* The close plan's length from the grammar's start: the fewest tokens a
 * max_tokens must allow. -1 as for close_plan. */
long ak_tokmask_min_tokens(const ak_tokmask *tm);

#endif
