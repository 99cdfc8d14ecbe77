/* test_model_env.h - the trained tiny model (tiny-llama-h64, f32) loaded
 * with a 2-thread context of 64 tokens a step and a logits buffer: what
 * the card, append and memory tests run turns on. */
#ifndef AK_TEST_MODEL_ENV_H
#define AK_TEST_MODEL_ENV_H

#include <stdlib.h>
#include <string.h>

#include "engine/model.h"
#include "test.h"

typedef struct {
    ak_model *m;
    ak_ctx *ctx;
    float *logits;   /* (vocab) */
    int vocab;
} tenv;

/* Loads it; 0, or -1 having recorded the failure in t. */
static inline int tenv_open(ak_test_ctx *t, tenv *e) {
    ak_error err = {{0}};
    char path[600];
    memset(e, 0, sizeof *e);
    e->m = ak_model_load(test_path(path, sizeof path, "models/tiny-llama-h64-gqa-f32.gguf"), NULL, NULL, &err);
    e->ctx = e->m ? ak_ctx_new(e->m, 64, 2, &err) : NULL;
    e->vocab = e->m ? e->m->cfg.vocab : 0;
    e->logits = e->m ? malloc(sizeof(float) * (size_t)e->vocab) : NULL;
    if (!e->ctx || !e->logits) { ak_test_fail(t, __FILE__, __LINE__, "%s: %s", path, err.msg); return -1; }
    return 0;
}

static inline void tenv_close(tenv *e) {
    ak_ctx_free(e->ctx);
    ak_model_free(e->m);
    free(e->logits);
}

#endif
