/* LAYER lib/ (src/lib/), beside serve/ at the top: the public C API,
 * include/agentkv.h, over the layers below.
 * Promises: every function of the public header is implemented here and
 * nowhere else, by calling the layers' own functions (no second copy of
 * their logic); handles are opaque; internal error codes become the
 * header's agentkv_status values one by one; nothing but the header's
 * functions is visible outside the shared library (built with hidden
 * visibility: AGENTKV_API marks what is exported).
 * May use: base, text, kv, engine, store, agents. Used by: the CLI (which
 * also reaches a loaded model's parts through this header). The table:
 * scripts/check-layers.sh.
 *
 * lib.h - what the files of the public API share (lib_model.c: versions,
 * errors, models, tokens, chat, KV formats; lib_store.c: stores and
 * agents; lib_turn.c: turns; lib_share.c: pools, cards, memories), and the
 * one door for programs of this project that need a public model's
 * internal parts. Not installed.
 */
#ifndef AK_LIB_H
#define AK_LIB_H

#include <agentkv.h>

#include "agents/agent.h"
#include "engine/model.h"
#include "text/chat.h"
#include "text/tokenizer.h"

struct agentkv_model {
    ak_model *model;
    ak_tokenizer *tok;
    ak_chat_family family;
    char *template_text;      /* the model's chat template, or NULL */
};

struct agentkv_store {
    const agentkv_model *m;
    ak_store *store;          /* NULL: memory only */
    ak_block_pool *pool;
    ak_agents *agents;
    ak_ctx *ctx;
    int n_ctx;
    ak_kv_format fk, fv;
    float *logits;            /* vocab floats, the turns' */
};

struct agentkv_agent {
    agentkv_store *s;
    char id[AK_AGENT_ID_MAX + 1];
};

/* Copies an internal error into the public one (err may be NULL) and
 * returns its status: each ak_err code has its agentkv_status. */
agentkv_status ak_lib_fail(agentkv_error *err, const ak_error *e);
/* An error of the public API's own: code and formatted message into err
 * (may be NULL). Returns code. */
agentkv_status ak_lib_failc(agentkv_error *err, agentkv_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Clears err (may be NULL) and returns AGENTKV_OK. */
agentkv_status ak_lib_ok(agentkv_error *err);
/* Parses a KV format name (NULL: def) into *out. Returns AGENTKV_OK or
 * AGENTKV_ERR_INVALID with err naming the valid ones; what says which
 * option it was. */
agentkv_status ak_lib_format(const char *name, ak_kv_format def, const char *what, ak_kv_format *out,
                             agentkv_error *err);

/* A conversation and chat options in the renderer's form: msgs, calls and
 * tools malloc'd, the strings still the caller's. */
typedef struct {
    ak_chat_msg *msgs;
    ak_chat_call *calls;
    ak_chat_tool *tools;
    ak_chat_opts opts;        /* the model's family and template, o's generation prompt, tools, thinking */
} ak_lib_chat;
/* Converts messages[0..n) and o (may be NULL) into *c. Returns 0, or -1
 * with err set (AK_ERR_INVALID: no messages, counts without lists;
 * AK_ERR_NOMEM); *c then holds nothing. */
int ak_lib_chat_make(const agentkv_model *m, const agentkv_message *messages, int n, const agentkv_chat_options *o,
                     ak_lib_chat *c, ak_error *err);
/* Frees what c holds; a zeroed c is fine. */
void ak_lib_chat_free(ak_lib_chat *c);

/* Brings agent a's cache into RAM from the store if it is not there and
 * has a file (a restore, as a turn would make), so that its history can
 * be read. Returns 0 (also when there was nothing to restore or the file
 * missed: the agent is then cold), or -1 with e set (no room now). */
int ak_lib_restore(agentkv_agent *a, ak_error *e);

/* For this project's programs (the CLI): a loaded model's engine model
 * and tokenizer, owned by m. */
ak_model *ak_lib_model(const agentkv_model *m);
ak_tokenizer *ak_lib_tokenizer(const agentkv_model *m);

#endif
