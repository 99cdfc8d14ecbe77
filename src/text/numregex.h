/* numregex.h - the JSON numbers on one side of a bound, as a regex.
 *
 * jsonschema.c compiles `minimum` / `maximum` (and their exclusive forms)
 * to byte automata by intersecting the plain number syntax with a regex
 * for "at least v" or "at most v" written digit by digit here. Pure string
 * building; no state.
 */
#ifndef AK_NUMREGEX_H
#define AK_NUMREGEX_H

#include <stddef.h>

/* A non-negative decimal without exponent. */
#define AK_NN_ANY "(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?"

/* A growable string (oom set, and appends stop, when memory runs out). */
typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} ak_sbuf;

/* Appends to b a regex (regex.h's subset) of the JSON numbers >= v (lower)
 * or <= v, strictly when excl. Returns 0, or -1 when v is not finite or too
 * far from 1 to be written; b->oom tells a failed allocation. */
int ak_numregex_side(ak_sbuf *b, double v, int excl, int lower);

#endif
