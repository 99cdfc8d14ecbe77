/* fuzz_jsonschema.c - libFuzzer target for the JSON Schema compiler and the
 * grammar matcher (src/text/jsonschema.c, grammar.c, regex.c).
 *
 * Input layout: the schema text, a NUL byte, then bytes to feed. The schema
 * must compile or fail with a code (and a non-empty message); when it
 * compiles, the bytes are fed one at a time to a matcher and:
 *   - a byte is taken or refused whole (a refused byte leaves the state as
 *     it was: the shortest close stays the same);
 *   - from every state the shortest close has the length said and, fed,
 *     ends in an accepting state;
 *   - the close of the start state is a whole match.
 * Run with `make fuzz FUZZ_TARGETS=jsonschema`. Seeds: fuzz/corpus/jsonschema/.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jsonschema.h"

#define MUST(cond, what)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "fuzz_jsonschema: %s (line %d)\n", what, __LINE__); \
            abort();                                                              \
        }                                                                         \
    } while (0)

/* Feeds the shortest close of m to a copy and checks it ends accepting. */
static void check_close(const ak_gmatch *m) {
    long n = ak_gmatch_close_len(m);
    MUST(n >= 0, "no close from a live state");
    char *buf = malloc((size_t)n + 1);
    MUST(buf != NULL, "out of memory");
    MUST(ak_gmatch_close_path(m, buf, (size_t)n + 1) == n, "close path length differs");
    ak_gmatch *c = ak_gmatch_clone(m);
    MUST(c != NULL, "clone");
    MUST(ak_gmatch_feed(c, buf, (size_t)n) == 0, "close path refused");
    MUST(ak_gmatch_accepting(c), "close path does not end a match");
    ak_gmatch_free(c);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t sl = nul ? (size_t)(nul - data) : size;
    ak_gram_error e = {0};
    ak_js_opts o = {.any_order = sl & 1, .ws = (sl >> 1) & 1, .max_states = 20000};
    ak_grammar *g = ak_jsonschema_compile((const char *)data, sl, &o, &e);
    if (!g) {
        MUST(e.code > AK_GRAM_OK && e.code <= AK_GRAM_E_INVALID && e.msg[0], "failure without a code and message");
        return 0;
    }
    ak_gmatch *m = ak_gmatch_new(g);
    MUST(m != NULL, "matcher");
    check_close(m);
    const uint8_t *feed = nul ? nul + 1 : data + size;
    size_t fl = nul ? size - sl - 1 : 0;
    for (size_t i = 0; i < fl && i < 4096; i++) {
        long before = ak_gmatch_close_len(m);
        if (ak_gmatch_feed_byte(m, feed[i]) < 0) {
            MUST(ak_gmatch_close_len(m) == before, "a refused byte changed the state");
            continue;
        }
        if ((i & 7) == 0) check_close(m);
    }
    check_close(m);
    ak_gmatch_free(m);
    ak_grammar_free(g);
    return 0;
}
