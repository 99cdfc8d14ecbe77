/* agent_turn.h - a greedy turn of an agent (ak_agent_begin, then a step a
 * token, then ak_agent_end): how the agent and card tests run their turns. */
#ifndef AK_TEST_AGENT_TURN_H
#define AK_TEST_AGENT_TURN_H

#include <string.h>

#include "agents/agent.h"
#include "text/sampler.h"
#include "test.h"

/* One greedy turn of an agent: its prompt, how many tokens to generate,
 * where they, the first logits (if first is not NULL) and the turn's
 * report go. */
typedef struct {
    const char *id;
    const int32_t *prompt;
    int n, n_gen;
    int32_t *out;    /* n_gen tokens */
    float *first;    /* vocab floats, or NULL */
    ak_turn *info;
} turn_req;

/* Turn r of an agent of ag on ctx (logits: vocab floats, the last step's
 * logits when it returns): begin with the prompt, then n_gen greedy tokens.
 * Returns 0, or -1 with a test failure recorded. */
static inline int greedy_turn(ak_test_ctx *t, ak_ctx *ctx, float *logits, int vocab, ak_agents *ag, turn_req r) {
    ak_error err = {{0}};
    if (ak_agent_begin(ag, ctx, r.id, r.prompt, r.n, logits, r.info, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "begin %s: %s", r.id, err.msg);
        return -1;
    }
    if (r.first) memcpy(r.first, logits, sizeof(float) * (size_t)vocab);
    for (int i = 0; i < r.n_gen; i++) {
        r.out[i] = ak_argmax(logits, vocab);
        if (i + 1 < r.n_gen && ak_agent_step(ag, ctx, r.id, r.out[i], logits, &err) < 0) {
            ak_test_fail(t, __FILE__, __LINE__, "step %s: %s", r.id, err.msg);
            return -1;
        }
    }
    if (ak_agent_end(ag, r.id, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "end %s: %s", r.id, err.msg);
        return -1;
    }
    return 0;
}

#endif
