/* common.h - what several commands share: loading a model with its tokenizer
 * and drawing progress on a terminal. */
#ifndef AK_CLI_COMMON_H
#define AK_CLI_COMMON_H

#include <agentkv.h>

#include "agents/agent.h"
#include "kv/blockpool.h"
#include "engine/model.h"
#include "args.h"
#include "text/tokenizer.h"

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
    agentkv_model *handle;    /* the public API's model (include/agentkv.h), owning the two below */
    ak_model *model;
    ak_tokenizer *tok;
    double load_s;
} loaded_model;

/* Loads model and tokenizer from path through the public API
 * (agentkv_model_load), with a progress bar; on failure prints
 * "agentkv CMD: <reason>" and returns -1. */
int load_model(loaded_model *lm, const char *cmd, const char *path);
void unload_model(loaded_model *lm);

/* KV cache flags shared by the commands that run the model. */
typedef struct {
    ak_kv_format fk, fv;    /* -ctk / -ctv, default f16 */
    size_t budget;          /* --kv-budget, 0 = unlimited */
    int block_tokens;       /* --kv-block, 0 = default */
    unsigned center;        /* --center: AK_CENTER_K / _V bits (default keys) */
} cache_opts;

#define CACHE_OPTS_HELP                                                                  \
    "  -ctk, --cache-type-k F   format of cached keys (default f16)\n"                   \
    "  -ctv, --cache-type-v F   format of cached values (default f16)\n"                 \
    "                           formats: f32 f16 bf16 q8 q4 q2 tq4 tq3 tq2 tcq3\n"       \
    "  --kv-budget BYTES        RAM budget of the KV block pool (e.g. 2G; default: none)\n" \
    "  --kv-block N             tokens per KV block (default 32)\n"                     \
    "  --center k|v|kv|none     store 4/3/2-bit K and/or V minus the model's mean (default k;\n" \
    "                           computed once per process over a built-in text)\n"        \
    "  --no-center              the same as --center none\n"

void cache_opts_init(cache_opts *o);
/* If flag is one of the cache flags, parses its value into o (errors go
 * through a) and returns 1; returns 0 for other flags. */
int cache_opts_parse(cache_opts *o, ak_args *a, const char *flag);
/* Installs the model's KV means in pool (which holds no block yet) when
 * o->center asks for a side whose format gains from centering; prints one
 * line while it computes them. Returns 0, or -1 after printing
 * "agentkv CMD: reason". */
int cache_center(const cache_opts *o, ak_ctx *ctx, const ak_tokenizer *tk, ak_block_pool *pool, const char *cmd);

/* Makes the block pool and one sequence of n_ctx positions; on failure prints
 * "agentkv CMD: reason" and returns -1 (nothing to free). */
int cache_open(const cache_opts *o, const ak_model *m, int n_ctx, const char *cmd, ak_block_pool **pool, ak_kv **kv);
void cache_close(ak_block_pool *pool, ak_kv *kv);

/* Agent memory flags shared by run and serve. */
typedef struct {
    const char *dir;          /* --memory-dir, default ./agentkv-memory */
    const char *key_file;     /* --memory-key-file, NULL: plain files */
    size_t disk_budget;       /* --disk-budget, 0 = none */
    ak_save_policy save;      /* --save-policy, default every turn */
    int no_prefix_sharing;    /* --no-prefix-sharing */
    const char *store_url;    /* --store redis://host:port[/db], NULL: the memory directory */
    const char *store_password_file;  /* --store-password-file */
    int store_lease_ms;       /* --store-lease-ms, 0: the default */
    int dir_given;            /* --memory-dir was given (with --store: the local directory) */
} store_opts;

#define MEMORY_OPTS_HELP                                                                       \
    "  --memory-dir DIR         where agent caches live (default ./agentkv-memory)\n"           \
    "  --memory-key-file F      seal agent files with this 32-byte key (XChaCha20-Poly1305)\n"  \
    "  --store URL              keep agent, pool and memory caches in Redis instead\n"            \
    "                           (redis://host:port[/db]; shared by every node using it: one node\n" \
    "                           writes an agent at a time, by lease); --memory-dir then names the\n" \
    "                           local directory (cards); docs/store.md\n"                          \
    "  --store-password-file F  the Redis password: the first line of F (mode 600)\n"             \
    "  --store-lease-ms N       an agent's lease in Redis (default 10000 ms)\n"                    \
    "  --disk-budget BYTES      keep the memory directory under this size (LRU files go first)\n" \
    "  --save-policy P          when an agent's cache is written: turn (after every turn, default),\n" \
    "                           evict (when it leaves RAM) or shutdown (at exit); all save at a\n" \
    "                           clean exit\n"                                                     \
    "  --no-prefix-sharing      agents never link blocks another agent computed for the same\n"  \
    "                           prefix (sharing shows, by timing, that some agent sent it before;\n" \
    "                           pools still share): docs/sharing.md\n"

/* Benchmarks' arithmetic: qsort order of doubles (increasing); the median of
 * v[0..n) (sorts v; 0 for n = 0); CPU milliseconds this process has used,
 * all threads (on a shared machine wall time measures the neighbours too). */
int bench_cmp_double(const void *a, const void *b);
double bench_median(double *v, int n);
double bench_cpu_ms(void);

void store_opts_init(store_opts *o);
/* If flag is one of the memory flags, parses its value into o (errors go
 * through a) and returns 1; returns 0 for other flags. */
int store_opts_parse(store_opts *o, ak_args *a, const char *flag);
/* Opens the store o names (reading its key, if any). Returns NULL with err set. */
ak_store *store_opts_open(const store_opts *o, ak_error *err);

/* Reads a prompt file; on failure prints the error and returns NULL. */
char *read_prompt_file(const char *cmd, const char *path, size_t *len);

#endif
