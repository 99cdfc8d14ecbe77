/* grammar.h - the byte-level grammar engine of constrained decoding: a
 * grammar of rules, a per-sequence matcher that follows it byte by byte,
 * and the shortest way to close from any point.
 *
 * THE CONTRACT.
 *   - A grammar is a set of rules. Each rule is an automaton over bytes whose
 *     byte edges are deterministic; a state may also CALL another rule (run
 *     it to one of its accepting states, then go on at a return state). A
 *     state may call several rules and have byte edges too: alternatives
 *     that share a prefix are followed together (the matcher holds a set of
 *     stacks, as a GLR parser does), so anyOf of two objects needs no
 *     look-ahead. Rules never match the empty string (every call consumes a
 *     byte), so a call chain without bytes in between cannot loop.
 *   - ak_gbuild_finish computes, for every state, the fewest bytes that end
 *     the rule from there (calls cost their rule's shortest match), drops the
 *     states from which no end is reachable, and refuses a grammar whose
 *     root matches nothing (AK_GRAM_E_UNSATISFIABLE: a schema that admits no
 *     instance, a recursion without a base case). So every state a matcher
 *     can be in has a way to close: output cut by a budget is never invalid.
 *   - A compiled grammar is immutable: any number of matchers, on any
 *     threads, may share it. A matcher is one sequence's state; it is not
 *     shared. ak_gmatch_feed either takes all the bytes given or none
 *     (state unchanged).
 *   - Lazy start (tool calls): a matcher starts in FREE mode when made with
 *     ak_gmatch_new_free and accepts any bytes until ak_gmatch_begin starts
 *     a rule at the current byte position; the bytes of the token that ran
 *     past the opener are then fed to it. A matcher can begin at any rule
 *     (ak_gbuild_finish keeps every rule, the root is the default).
 *   - Limits: a stack holds at most AK_GMATCH_MAX_DEPTH frames (a push past
 *     it is refused, so the nesting of a recursive schema stops there); a
 *     matcher holds at most AK_GMATCH_MAX_STACKS live alternatives (past it
 *     the last ones are dropped: the output stays valid, fewer ambiguous
 *     parses are kept).
 *
 * Errors: codes (ak_gram_code), never message texts to compare. The message
 * names the keyword and the schema path for a person (and the server's 400).
 */
#ifndef AK_GRAMMAR_H
#define AK_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

/* What went wrong, for a caller to branch on. */
typedef enum {
    AK_GRAM_OK = 0,
    AK_GRAM_E_JSON,          /* the schema text is not JSON */
    AK_GRAM_E_SCHEMA,        /* a keyword's value has the wrong type or range */
    AK_GRAM_E_UNSUPPORTED,   /* a keyword that changes validity and is not supported */
    AK_GRAM_E_REF,           /* a $ref that does not resolve (or is not into this document) */
    AK_GRAM_E_UNSATISFIABLE, /* no instance is valid (false, contradictions, recursion without base case) */
    AK_GRAM_E_TOO_LARGE,     /* past a size limit (enum, states, a regex that explodes) */
    AK_GRAM_E_DEPTH,         /* nested past AK_JS_MAX_DEPTH */
    AK_GRAM_E_REGEX,         /* a pattern outside the supported regex subset, or malformed */
    AK_GRAM_E_NOMEM,         /* out of memory */
    AK_GRAM_E_INVALID        /* a bad argument to the API */
} ak_gram_code;

typedef struct {
    int code;            /* an ak_gram_code */
    char keyword[48];    /* the keyword at fault ("" when none) */
    char path[192];      /* JSON pointer of the schema node ("" at the root) */
    char msg[320];       /* one line for a person */
} ak_gram_error;

/* Sets e (may be NULL) and returns -1. */
int ak_gram_fail(ak_gram_error *e, int code, const char *keyword, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The ak_err_code for a grammar code (AK_ERR_NOMEM for E_NOMEM, AK_ERR_INVALID
 * otherwise), for callers that report through ak_error. */
int ak_gram_err_code(int code);
/* A short name of a code ("json", "schema", "unsupported", "ref",
 * "unsatisfiable", "too-large", "depth", "regex", "nomem", "invalid"). */
const char *ak_gram_code_name(int code);

/* ---- byte DFAs -------------------------------------------------------------
 * A deterministic automaton over bytes, the unit the regex compiler, the
 * JSON-string and number constructions hand to the builder. State 0 is the
 * start; next[s * 256 + b] is the next state or -1; tag[s] is -1 for a
 * state that does not accept, else a value the maker chose (which
 * alternative accepted). */
typedef struct {
    int n, cap;
    int32_t *next;
    int32_t *tag;
} ak_bdfa;

/* A new state (row of -1, tag -1); returns its index, or -1 when the DFA
 * would pass max_states (or memory runs out). */
int ak_bdfa_add(ak_bdfa *d, int max_states);
void ak_bdfa_free(ak_bdfa *d);
/* Products of two DFAs, over reachable pairs:
 *   AK_BDFA_AND    strings both accept (tags: a's);
 *   AK_BDFA_OR     strings either accepts (tags: a's where a accepts, else b's);
 *   AK_BDFA_LABEL  a's strings, tagged with b's tag where b accepts too, else
 *                  with a's (b labels some of a's strings: keys that are names).
 * Returns 0, or -1 with e set when more than max_states
 * (AK_GRAM_E_TOO_LARGE) or out of memory. */
enum { AK_BDFA_AND = 0, AK_BDFA_OR = 1, AK_BDFA_LABEL = 2 };
int ak_bdfa_product(const ak_bdfa *a, const ak_bdfa *b, int mode, int max_states, ak_bdfa *out, ak_gram_error *e);
/* Valid UTF-8 (no surrogates, no overlongs) whose code point count is in
 * [min_chars, max_chars] (max_chars < 0: no maximum). Returns 0 or -1. */
int ak_bdfa_utf8_len(long min_chars, long max_chars, int max_states, ak_bdfa *out, ak_gram_error *e);
/* Whether the DFA accepts s[0..n). */
int ak_bdfa_match(const ak_bdfa *d, const void *s, size_t n);

/* ---- building a grammar ---------------------------------------------------- */
typedef struct ak_gbuild ak_gbuild;
typedef struct ak_grammar ak_grammar;

/* Limits on a grammar's size (states over all rules) and a matcher's stacks. */
#define AK_GRAM_MAX_STATES  400000
#define AK_GMATCH_MAX_DEPTH 1024
#define AK_GMATCH_MAX_STACKS 256

ak_gbuild *ak_gbuild_new(void);
void ak_gbuild_free(ak_gbuild *b);
/* A new rule with its start state; returns the rule id, or -1 (limits,
 * memory: the builder then fails at finish). */
int ak_gbuild_rule(ak_gbuild *b);
/* The start state of rule r. */
int ak_gbuild_start(const ak_gbuild *b, int r);
/* A new state in rule r; returns its id or -1. */
int ak_gbuild_state(ak_gbuild *b, int r);
/* Marks state s accepting: the rule may end there. */
void ak_gbuild_accept(ak_gbuild *b, int s);
/* A byte edge from s to t on every byte in [lo, hi]. Byte edges of one state
 * must not overlap (finish fails with AK_GRAM_E_INVALID otherwise). */
void ak_gbuild_bytes(ak_gbuild *b, int s, int lo, int hi, int t);
/* s calls rule r; after r ends, the rule goes on at t. */
void ak_gbuild_call(ak_gbuild *b, int s, int r, int t);
/* A literal s[0..n) from state from, ending in a new state (returned, or -1);
 * shares the existing byte edges of from and of the states after it
 * (several literals from one state form a trie). */
int ak_gbuild_literal(ak_gbuild *b, int from, const char *s, size_t n);
/* Copies DFA d into rule r with d's start merged into state from (its
 * outgoing edges are added to from's; a transition back into d's start
 * goes to a copy of it, so from's other edges are not re-entered); for each
 * DFA state i, map[i] gets its grammar state (map may be NULL; d->n
 * entries). Accepting DFA states are not marked: the caller decides what
 * each tag leads to. Returns 0 or -1. */
int ak_gbuild_dfa(ak_gbuild *b, int r, int from, const ak_bdfa *d, int32_t *map);
/* The states made so far (for size checks). */
int ak_gbuild_n_states(const ak_gbuild *b);

/* Compiles the builder's rules into a grammar whose matchers start at rule
 * root. The builder stays usable only for ak_gbuild_free. Returns NULL with
 * e set: AK_GRAM_E_UNSATISFIABLE when root matches nothing, AK_GRAM_E_INVALID
 * for overlapping byte edges, a rule that matches the empty string or a call
 * cycle without bytes, AK_GRAM_E_TOO_LARGE, AK_GRAM_E_NOMEM. */
ak_grammar *ak_gbuild_finish(ak_gbuild *b, int root, ak_gram_error *e);

void ak_grammar_free(ak_grammar *g);
int ak_grammar_root(const ak_grammar *g);
int ak_grammar_n_rules(const ak_grammar *g);
int ak_grammar_n_states(const ak_grammar *g);
/* Fewest bytes of a whole match of rule r (its shortest instance). */
long ak_grammar_rule_min(const ak_grammar *g, int r);

/* ---- the per-sequence matcher --------------------------------------------- */
typedef struct ak_gmatch ak_gmatch;

/* A matcher at the start of g's root rule. NULL on out of memory. */
ak_gmatch *ak_gmatch_new(const ak_grammar *g);
/* A matcher in FREE mode: every byte is accepted until ak_gmatch_begin. */
ak_gmatch *ak_gmatch_new_free(const ak_grammar *g);
void ak_gmatch_free(ak_gmatch *m);
/* Starts rule r (ak_grammar_root for the root) here, dropping what the
 * matcher held. Returns 0, or -1 when r is not a rule of g. */
int ak_gmatch_begin(ak_gmatch *m, int r);
/* Makes dst the same state as src (same grammar). Returns 0 or -1 (memory). */
int ak_gmatch_copy(ak_gmatch *dst, const ak_gmatch *src);
/* A new matcher in src's state, or NULL. */
ak_gmatch *ak_gmatch_clone(const ak_gmatch *src);
const ak_grammar *ak_gmatch_grammar(const ak_gmatch *m);

/* Feeds bytes s[0..n): returns 0 when the whole of them keeps the output
 * valid (state advanced), -1 when some byte does not (state unchanged). */
int ak_gmatch_feed(ak_gmatch *m, const void *s, size_t n);
/* Feeds one byte; as ak_gmatch_feed. */
int ak_gmatch_feed_byte(ak_gmatch *m, int byte);
/* 1 when the bytes so far are a whole match (the document may end here); 1
 * in FREE mode. */
int ak_gmatch_accepting(const ak_gmatch *m);
/* 1 when no byte can follow (accepting and nothing more possible). */
int ak_gmatch_finished(const ak_gmatch *m);
/* 1 while in FREE mode. */
int ak_gmatch_is_free(const ak_gmatch *m);
/* Fewest bytes that close the match from here (0 when accepting; 0 in FREE
 * mode). */
long ak_gmatch_close_len(const ak_gmatch *m);
/* Writes the shortest closing bytes (ak_gmatch_close_len of them) to out
 * when they fit in cap; returns their count, or -1 when cap is too small. */
long ak_gmatch_close_path(const ak_gmatch *m, char *out, size_t cap);
/* Bytes fed since creation or the last begin. */
uint64_t ak_gmatch_pos(const ak_gmatch *m);

/* For the mask engine (tokmask.c): the live stacks' top states, written to
 * tops (up to cap, distinct); returns their count. */
/* Starts at grammar state s with nothing below it (a rule end there is
 * "complete": what follows would belong to an unknown caller). Returns 0 or
 * -1 for a bad state. */
int ak_gmatch_begin_state(ak_gmatch *m, int s);
/* The number of live stacks. */
int ak_gmatch_n_stacks(const ak_gmatch *m);
int ak_gmatch_tops(const ak_gmatch *m, int32_t *tops, int cap);

/* ---- the compiled grammar's tables (read only; for tokmask.c) ------------- */
typedef struct {
    int n_states, n_rules, n_cls;
    const uint8_t *cls;          /* byte -> class */
    const int32_t *trans;        /* n_states * n_cls, -1 = none */
    const uint8_t *accept;       /* per state */
    const int32_t *call_off;     /* n_states + 1: calls of state s are call_rule/call_ret[call_off[s]..call_off[s+1]) */
    const int32_t *call_rule, *call_ret;
    const int32_t *rule_start;   /* per rule */
    const int32_t *state_rule;   /* per state */
} ak_grammar_tables;
void ak_grammar_get_tables(const ak_grammar *g, ak_grammar_tables *t);

#endif
