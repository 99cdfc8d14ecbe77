/* embed.c - two agents whose memory outlives the process, through libagentkv.
 *
 *   cc embed.c $(pkg-config --cflags --libs agentkv) -o embed
 *   ./embed MODEL.gguf ./mem     # first run: both agents start cold
 *   ./embed MODEL.gguf ./mem     # again: both come back warm from ./mem, and only
 *                                # the new words are computed, not what they hold
 *
 * Each run gives each agent what it already holds plus a few more words,
 * and prints per agent: where its memory came from, the tokens it held, how
 * many of them were reused and how many were computed. */
#include <agentkv.h>
#include <stdio.h>
#include <string.h>

static int print_piece(void *ud, int32_t token, const char *piece, size_t len) {
    (void)ud, (void)token;
    fwrite(piece, 1, len, stdout);
    return 0;   /* nonzero would cancel the turn */
}

static int turn(agentkv_store *store, const agentkv_model *model, const char *name, const char *text,
                agentkv_error *err) {
    agentkv_agent *agent = NULL;
    int32_t *held = NULL, *more = NULL, prompt[4096];
    size_t n_held = 0, n_more = 0;
    agentkv_turn_result r = {0};
    int ok = !agentkv_agent_get(store, name, &agent, err) && !agentkv_agent_tokens(agent, &held, &n_held, err) &&
             !agentkv_tokenize(model, text, strlen(text), n_held ? 0 : AGENTKV_TOKENIZE_ADD_SPECIAL, &more, &n_more, err) &&
             n_held + n_more <= 4096;
    if (ok) {
        memcpy(prompt, held, n_held * sizeof *held);   /* the whole context: what it holds, then the new text */
        memcpy(prompt + n_held, more, n_more * sizeof *more);
        printf("%s: ", name);
        ok = !agentkv_agent_turn(agent, &(agentkv_turn_options){.tokens = prompt, .n_tokens = n_held + n_more,
                                 .max_tokens = 12, .on_token = print_piece}, &r, err);
    }
    if (ok)
        printf("\n%s: tier=%s held=%zu reused=%d prefilled=%d\n", name,
               r.tier == AGENTKV_TIER_WARM ? "warm" : r.tier == AGENTKV_TIER_HOT ? "hot" : "cold", n_held, r.reused,
               r.prefilled);
    agentkv_free(r.text);
    agentkv_free(held);
    agentkv_free(more);
    agentkv_agent_release(agent);
    return ok ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf MEMORY_DIR\n", argv[0]);
        return 2;
    }
    agentkv_error err = {0};
    agentkv_model *model = NULL;
    agentkv_store *store = NULL;
    int ok = !agentkv_model_load(argv[1], NULL, &model, &err) &&
             !agentkv_store_open(model, &(agentkv_store_options){.dir = argv[2]}, &store, &err) &&
             !turn(store, model, "planner", " Once upon a time", &err) && !turn(store, model, "writer", " The cat", &err);
    ok = !agentkv_store_close(store, ok ? &err : NULL) && ok;   /* saves both agents */
    agentkv_model_free(model);
    if (!ok) fprintf(stderr, "embed (agentkv %s): %s\n", agentkv_version(), agentkv_error_message(&err));
    return ok ? 0 : 1;
}
