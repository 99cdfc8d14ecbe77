/* common.h - what several commands share: loading a model with its tokenizer
 * and drawing progress on a terminal. */
#ifndef AK_CLI_COMMON_H
#define AK_CLI_COMMON_H

#include "../src/model.h"
#include "../src/tokenizer.h"

typedef struct {
    const char *label;
    int enabled;        /* only when stderr is a terminal */
    int last_pct;
    double t0;
} progress;

void progress_init(progress *p, const char *label);
/* ak_progress_fn-compatible: draws "label [=====>    ] 42%" on stderr. */
void progress_update(void *p, double frac);
/* Clears the line. */
void progress_done(progress *p);

typedef struct {
    ak_model *model;
    ak_tokenizer *tok;
    double load_s;
} loaded_model;

/* Loads model and tokenizer from path, with a progress bar; on failure prints
 * "agentkv CMD: <reason>" and returns -1. */
int load_model(loaded_model *lm, const char *cmd, const char *path);
void unload_model(loaded_model *lm);

/* Reads a prompt file; on failure prints the error and returns NULL. */
char *read_prompt_file(const char *cmd, const char *path, size_t *len);

#endif
