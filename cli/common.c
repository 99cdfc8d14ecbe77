/* common.c - see common.h */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void progress_init(progress *p, const char *label) {
    p->label = label;
    p->enabled = isatty(2);
    p->last_pct = -1;
    p->t0 = ak_now();
}

void progress_update(void *ud, double frac) {
    progress *p = ud;
    if (!p || !p->enabled) return;
    int pct = (int)(frac * 100);
    if (pct == p->last_pct) return;
    /* don't flash a bar for things that finish at once */
    if (ak_now() - p->t0 < 0.3 && pct < 100) return;
    p->last_pct = pct;
    int w = 30, fill = (int)(frac * w);
    char bar[64];
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[w] = 0;
    fprintf(stderr, "\r%s [%s] %3d%%", p->label, bar, pct);
    fflush(stderr);
}

void progress_done(progress *p) {
    if (p->enabled && p->last_pct >= 0) fprintf(stderr, "\r\033[K");
    p->last_pct = -1;
}

int load_model(loaded_model *lm, const char *cmd, const char *path) {
    memset(lm, 0, sizeof *lm);
    ak_error err = {{0}};
    progress pg;
    progress_init(&pg, "loading model");
    double t0 = ak_now();
    lm->model = ak_model_load(path, progress_update, &pg, &err);
    progress_done(&pg);
    if (!lm->model) {
        fprintf(stderr, "agentkv %s: %s\n", cmd, err.msg);
        return -1;
    }
    lm->tok = ak_tokenizer_load(&lm->model->gguf, &err);
    if (!lm->tok) {
        fprintf(stderr, "agentkv %s: %s\n", cmd, err.msg);
        ak_model_free(lm->model);
        lm->model = NULL;
        return -1;
    }
    if (ak_tokenizer_vocab_size(lm->tok) != lm->model->cfg.vocab) {
        fprintf(stderr, "agentkv %s: %s: tokenizer has %d tokens but token_embd.weight has %d rows\n", cmd, path,
                ak_tokenizer_vocab_size(lm->tok), lm->model->cfg.vocab);
        unload_model(lm);
        return -1;
    }
    lm->load_s = ak_now() - t0;
    return 0;
}

void unload_model(loaded_model *lm) {
    ak_tokenizer_free(lm->tok);
    ak_model_free(lm->model);
    lm->tok = NULL;
    lm->model = NULL;
}

char *read_prompt_file(const char *cmd, const char *path, size_t *len) {
    ak_error err = {{0}};
    char *s = ak_read_file(path, len, &err);
    if (!s) fprintf(stderr, "agentkv %s: %s\n", cmd, err.msg);
    return s;
}
