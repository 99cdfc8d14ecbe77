/* cmd_pool.c - agentkv pool: make and look after pools (named, write-once
 * shared prefixes, agent.h: POOLS) in a memory directory, offline.
 *
 * create prefills the prefix with the model and writes pools/ID.safetensors
 * exactly as the server's POST /v1/pools does (the body is built and parsed
 * by the same code, src/serve/api.c, so a pool made here composes with chat
 * requests as one made over HTTP). ls, inspect and rm read only the store. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "serve/api.h"
#include "text/chat.h"
#include "store/store.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv pool create|ls|inspect|rm [flags]\n"
    "  create   --model M --id ID (--file F | --text S | --messages-json F) [flags]\n"
    "           prefill a pool once and write it to the memory directory (a server reads the\n"
    "           directory's index at start: create pools before starting it, or over HTTP)\n"
    "  ls       list the pools: tokens, formats, bytes, agents whose files start with each\n"
    "  inspect ID   one pool's metadata and source (JSON)\n"
    "  rm ID    delete a pool's file; refused while agent files start with it, unless --force\n"
    "           (those agents then recompute their whole prompt at their next turn)\n"
    "flags:\n"
    "  --memory DIR, --memory-dir DIR   the memory directory (default ./agentkv-memory)\n"
    "  --memory-key-file F      32-byte key of sealed files\n"
    "  -m, --model FILE         create: the GGUF model the pool is for\n"
    "  --id ID                  create: the pool's id (1-128 of [A-Za-z0-9_.-], not starting with '.')\n"
    "  --file F                 create: the prefix is this file's text (tokenized with the model's BOS)\n"
    "  --text S                 create: the prefix is this text\n"
    "  --messages-json F        create: the prefix is these chat messages (a JSON array of\n"
    "                           {role, content}, or {\"messages\": [...]}), rendered with the model's\n"
    "                           chat template without the generation prompt\n"
    "  --chat-template NAME     create: override the chat family (as serve)\n"
    "  -c, --ctx-size N         create: the context the pool must fit in (default: the model's, at\n"
    "                           most 4096, as serve)\n"
    "  -t, --threads N          create: threads (default: all cores)\n"
    "  -ctk, --cache-type-k F   create: format of the pool's keys (default q8)\n"
    "  -ctv, --cache-type-v F   create: format of the pool's values (default tq3)\n"
    "  --kv-budget, --kv-block, --center, --no-center   as serve\n"
    "  --force                  rm: delete even while agent files start with the pool\n"
    "  --json                   ls: as JSON\n";

typedef struct {
    const char *sub, *name;           /* subcommand, and the ID of inspect / rm */
    const char *model_path, *id, *file, *text, *messages_file, *template_arg;
    int n_ctx, n_threads, force, json, formats_given;
    store_opts mo;
    cache_opts co;
} pool_args;

static int check_args(pool_args *pa, ak_args *a);

/* Reads the flags into pa. Returns 0, or AK_EXIT_USAGE after printing why
 * (or 1 for --help: printed, nothing to do). */
static int parse_args(pool_args *pa, int argc, char **argv) {
    ak_args a;
    args_init(&a, "pool", argc, argv);
    memset(pa, 0, sizeof *pa);
    store_opts_init(&pa->mo);
    cache_opts_init(&pa->co);
    pa->co.fk = AK_KV_Q8;   /* a pool's defaults: shared by many, so small */
    pa->co.fv = AK_KV_TQ3;
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 1; }
        else if (!strcmp(f, "--memory")) { const char *v = args_value(&a, f); if (v) pa->mo.dir = v; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) pa->model_path = args_value(&a, f);
        else if (!strcmp(f, "--id")) pa->id = args_value(&a, f);
        else if (!strcmp(f, "--file")) pa->file = args_value(&a, f);
        else if (!strcmp(f, "--text")) pa->text = args_value(&a, f);
        else if (!strcmp(f, "--messages-json")) pa->messages_file = args_value(&a, f);
        else if (!strcmp(f, "--chat-template")) pa->template_arg = args_value(&a, f);
        else if (!strcmp(f, "-c") || !strcmp(f, "--ctx-size")) pa->n_ctx = (int)args_int(&a, f, 2, 1 << 24);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) pa->n_threads = (int)args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--force")) pa->force = 1;
        else if (!strcmp(f, "--json")) pa->json = 1;
        else if (f[0] == '-') {
            if (!store_opts_parse(&pa->mo, &a, f) && !cache_opts_parse(&pa->co, &a, f)) args_unknown(&a, f);
        } else if (!pa->sub) pa->sub = f;
        else if (!pa->name) pa->name = f;
        else args_error(&a, "unexpected argument '%s'", f);
    }
    return check_args(pa, &a);
}

/* The combinations parse_args cannot see flag by flag. */
static int check_args(pool_args *pa, ak_args *a) {
    const char *sub = pa->sub;
    if (!a->failed && !sub) args_error(a, "which subcommand? (create, ls, inspect, rm)");
    if (!a->failed && strcmp(sub, "create") && strcmp(sub, "ls") && strcmp(sub, "inspect") && strcmp(sub, "rm"))
        args_error(a, "unknown subcommand '%s' (create, ls, inspect, rm)", sub);
    if (a->failed) return AK_EXIT_USAGE;
    if (!strcmp(sub, "create")) {
        int sources = !!pa->file + !!pa->text + !!pa->messages_file;
        if (!pa->model_path) args_error(a, "create needs --model MODEL");
        else if (!pa->id) args_error(a, "create needs --id ID");
        else if (!ak_pool_id_valid(pa->id)) args_error(a, "invalid pool id '%s'", pa->id);
        else if (sources != 1) args_error(a, "create needs exactly one of --file, --text and --messages-json");
        else if (pa->name) args_error(a, "unexpected argument '%s'", pa->name);
    } else if (!strcmp(sub, "inspect") || !strcmp(sub, "rm")) {
        if (!pa->name) args_error(a, "%s needs ID", sub);
        else if (!ak_pool_id_valid(pa->name)) args_error(a, "invalid pool id '%s'", pa->name);
    } else if (pa->name) {
        args_error(a, "unexpected argument '%s'", pa->name);
    }
    return a->failed ? AK_EXIT_USAGE : 0;
}

/* ---------------------------------------------------------------- create */

/* The POST /v1/pools body create stands for: {"id", "text"} or {"id",
 * "messages"}. Returns a malloc'd JSON string, or NULL after printing why. */
static char *build_body(const pool_args *pa) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", pa->id);
    char *data = NULL;
    int ok = 1;
    if (pa->text) {
        cJSON_AddStringToObject(j, "text", pa->text);
    } else {
        size_t len = 0;
        data = read_prompt_file("pool", pa->file ? pa->file : pa->messages_file, &len);
        if (!data) ok = 0;
        else if (pa->file) cJSON_AddStringToObject(j, "text", data);
        else {
            cJSON *m = cJSON_ParseWithLength(data, len);
            cJSON *arr = cJSON_IsObject(m) ? cJSON_DetachItemFromObjectCaseSensitive(m, "messages") : m;
            if (arr != m) cJSON_Delete(m);
            if (!cJSON_IsArray(arr)) {
                fprintf(stderr, "agentkv pool: %s: not a JSON array of messages (nor {\"messages\": [...]})\n",
                        pa->messages_file);
                cJSON_Delete(arr);
                ok = 0;
            } else {
                cJSON_AddItemToObject(j, "messages", arr);
            }
        }
    }
    free(data);
    char *body = ok ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return body;
}

/* What create sets up: model, store, block pool, agents, a context. */
typedef struct create_rig {
    loaded_model lm;
    int loaded;
    char *template_text;
    ak_store *store;
    ak_block_pool *pool;
    ak_agents *agents;
    ak_ctx *ctx;
    int n_ctx;
} create_rig;

static void rig_free(create_rig *r) {
    ak_ctx_free(r->ctx);
    ak_agents_free(r->agents);
    ak_block_pool_free(r->pool);
    ak_store_close(r->store);
    free(r->template_text);
    if (r->loaded) unload_model(&r->lm);
}

/* Loads the model and opens everything create needs. Returns 0, or -1
 * after printing why. */
static int setup(create_rig *r, pool_args *pa) {
    memset(r, 0, sizeof *r);
    if (load_model(&r->lm, "pool", pa->model_path) < 0) return -1;
    r->loaded = 1;
    const ak_config *cfg = &r->lm.model->cfg;
    r->n_ctx = pa->n_ctx ? pa->n_ctx : cfg->n_ctx_train < 4096 ? cfg->n_ctx_train : 4096;
    ak_error err = {{0}};
    r->template_text = ak_chat_template_gguf(&r->lm.model->gguf, &err);
    if (!(r->store = store_opts_open(&pa->mo, &err))) goto fail;
    if (!(r->pool = ak_block_pool_new(&r->lm.model->spec, pa->co.block_tokens, pa->co.budget, &err))) goto fail;
    if (!(r->ctx = ak_ctx_new(r->lm.model, 512, pa->n_threads, &err))) goto fail;
    /* the model's KV means, as serve installs them: the pool's blocks are
     * then stored as the server's would be */
    if (cache_center(&pa->co, r->ctx, r->lm.tok, r->pool, "pool") < 0) return -1;
    ak_agents_config ac = {.model = r->lm.model, .pool = r->pool, .store = r->store, .fk = pa->co.fk, .fv = pa->co.fv,
                           .n_ctx = r->n_ctx, .save = AK_SAVE_EVERY_TURN};
    if (!(r->agents = ak_agents_new(&ac, &err))) goto fail;
    return 0;
fail:
    fprintf(stderr, "agentkv pool: %s\n", err.msg);
    return -1;
}

static int report_created(create_rig *r, const char *id, double secs);

/* agentkv pool create. */
static int run_create(pool_args *pa) {
    char *body = build_body(pa);
    if (!body) return 1;
    create_rig r;
    int rc = 1;
    ak_api_pool_request p = {0};
    if (setup(&r, pa) < 0) goto out;
    ak_chat_family family = ak_chat_detect(r.template_text);
    ak_error err = {{0}};
    if (pa->template_arg && ak_chat_family_parse(pa->template_arg, &family, &err) < 0) {
        fprintf(stderr, "agentkv pool: --chat-template: %s\n", err.msg);
        goto out;
    }
    ak_api_config ac = {.tok = r.lm.tok, .model_id = "", .family = family, .template_text = r.template_text,
                        .n_ctx = r.n_ctx};
    ak_api_error b;
    if (ak_api_parse_pool(&ac, body, strlen(body), &p, &b) < 0) {
        fprintf(stderr, "agentkv pool: %s\n", b.msg);
        goto out;
    }
    progress pg;
    progress_init(&pg, "prefilling the pool");
    double t0 = ak_now();
    ak_pool_request rq = {.id = p.id, .tokens = p.tokens, .n = (int)p.n_tokens, .fk = pa->co.fk, .fv = pa->co.fv,
                          .source = p.source};
    int cr = ak_pool_create(r.agents, r.ctx, &rq, progress_update, &pg, &err);   /* drawn only on a terminal */
    progress_done(&pg);
    if (cr < 0) {
        fprintf(stderr, "agentkv pool: %s\n", err.msg);
        goto out;
    }
    rc = report_created(&r, p.id, ak_now() - t0);
out:
    ak_api_pool_request_free(&p);
    if (r.loaded) rig_free(&r);
    free(body);
    return rc;
}

/* Prints what create made. Returns the exit code. */
static int report_created(create_rig *r, const char *id, double secs) {
    ak_pool_info in;
    ak_error err = {{0}};
    if (ak_pool_get(r->agents, id, &in, &err) < 0) {
        fprintf(stderr, "agentkv pool: %s\n", err.msg);
        return 1;
    }
    printf("pool %s: %d tokens, K/V %s/%s, %zu bytes in RAM, %llu bytes on disk, hash %s, prefilled in %.2f s\n",
           in.id, in.n_tokens, ak_kv_format_get(in.fk)->name, ak_kv_format_get(in.fv)->name, in.bytes,
           (unsigned long long)in.file_bytes, in.hash, secs);
    return 0;
}

/* ------------------------------------------------------------- the store */

/* Agent files of the store whose history starts with pool id, their names
 * into names (comma-separated, truncated to cap; names may be NULL).
 * Returns the count, or -1 with err set. */
static int agents_on(ak_store *s, const char *id, char *names, size_t cap, ak_error *err) {
    ak_store_entry *ents = NULL;
    int n = 0, count = 0;
    if (ak_store_list(s, &ents, &n, err) < 0) return -1;
    if (names) names[0] = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(ents[i].base.pool_id, id)) continue;
        size_t used = names ? strlen(names) : cap;
        if (used + 1 < cap) snprintf(names + used, cap - used, "%s%s", count ? ", " : "", ents[i].id);
        count++;
    }
    free(ents);
    return count;
}

/* agentkv pool ls. */
static int run_ls(ak_store *s, const pool_args *pa, ak_error *err) {
    ak_store_pool_entry *v = NULL;
    int n = 0;
    if (ak_store_list_pools(s, &v, &n, err) < 0) return -1;
    if (pa->json) printf("[");
    else printf("%-24s %8s %-9s %12s %7s %-20s %s\n", "pool", "tokens", "K/V", "bytes", "agents", "created", "hash");
    for (int i = 0; i < n; i++) {
        const ak_store_entry *e = &v[i].e;
        char when[32], fmt[32];
        int users = agents_on(s, e->id, NULL, 0, err);
        if (users < 0) break;
        time_t tt = (time_t)e->created;
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&tt));
        if (e->readable)
            snprintf(fmt, sizeof fmt, "%s/%s", ak_kv_format_get(e->fk)->name, ak_kv_format_get(e->fv)->name);
        else snprintf(fmt, sizeof fmt, "%s", e->sealed ? "sealed" : "?");
        if (pa->json)
            printf("%s{\"id\": \"%s\", \"tokens\": %d, \"formats\": \"%s\", \"bytes\": %llu, \"agents\": %d, "
                   "\"created\": %lld, \"hash\": \"%s\"}", i ? ", " : "", e->id, e->n_tokens, fmt,
                   (unsigned long long)e->bytes, users, (long long)e->created, v[i].pool_hash);
        else
            printf("%-24s %8d %-9s %12llu %7d %-20s %s\n", e->id, e->n_tokens, fmt, (unsigned long long)e->bytes, users,
                   when, v[i].pool_hash);
    }
    if (pa->json) printf("]\n");
    ak_store_pool_entries_free(v, n);
    return err->code ? -1 : 0;
}

/* agentkv pool inspect ID: one JSON object. Returns 0, 1 if unknown. */
static int run_inspect(ak_store *s, const char *id) {
    ak_store_pool_entry pe;
    if (ak_store_lookup_pool(s, id, &pe) != 0) return 1;
    const ak_store_entry *e = &pe.e;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", e->id);
    cJSON_AddStringToObject(j, "object", "pool");
    cJSON_AddNumberToObject(j, "tokens", e->n_tokens);
    cJSON_AddNumberToObject(j, "file_bytes", (double)e->bytes);
    cJSON_AddStringToObject(j, "cache_type_k", e->readable ? ak_kv_format_get(e->fk)->name : "?");
    cJSON_AddStringToObject(j, "cache_type_v", e->readable ? ak_kv_format_get(e->fv)->name : "?");
    cJSON_AddStringToObject(j, "hash", pe.pool_hash);
    cJSON_AddNumberToObject(j, "created", (double)e->created);
    cJSON_AddStringToObject(j, "model", e->model_name);
    cJSON_AddStringToObject(j, "fingerprint", e->fingerprint);
    cJSON_AddBoolToObject(j, "sealed", e->sealed);
    cJSON *src = pe.source ? cJSON_Parse(pe.source) : NULL;
    if (src) cJSON_AddItemToObject(j, "source", src);
    else if (pe.source) cJSON_AddStringToObject(j, "source", pe.source);
    else cJSON_AddNullToObject(j, "source");
    char *out = cJSON_Print(j);
    cJSON_Delete(j);
    printf("%s\n", out ? out : "{}");
    free(out);
    free(pe.source);
    return 0;
}

/* agentkv pool rm ID. Returns the exit code. */
static int run_rm(ak_store *s, const pool_args *pa, ak_error *err) {
    char names[600];
    int users = agents_on(s, pa->name, names, sizeof names, err);
    if (users < 0) return -1;
    if (users && !pa->force) {
        fprintf(stderr, "agentkv pool: pool '%s' is the start of %d agent file%s (%s): delete %s first, or use --force "
                        "(they then recompute their whole prompt)\n", pa->name, users, users == 1 ? "" : "s", names,
                users == 1 ? "it" : "them");
        return 1;
    }
    int r = ak_store_remove_pool(s, pa->name, err);
    if (r < 0) return -1;
    if (r == 1) {
        fprintf(stderr, "agentkv pool: no pool '%s' in %s\n", pa->name, pa->mo.dir);
        return 1;
    }
    return 0;
}

/* ls / inspect / rm: the store alone. */
static int run_store(pool_args *pa) {
    ak_error err = {{0}};
    ak_store *s = store_opts_open(&pa->mo, &err);
    if (!s) {
        fprintf(stderr, "agentkv pool: %s\n", err.msg);
        return 1;
    }
    int rc;
    if (!strcmp(pa->sub, "ls")) rc = run_ls(s, pa, &err);
    else if (!strcmp(pa->sub, "rm")) rc = run_rm(s, pa, &err);
    else {
        rc = run_inspect(s, pa->name);
        if (rc == 1) fprintf(stderr, "agentkv pool: no pool '%s' in %s\n", pa->name, pa->mo.dir);
    }
    if (rc < 0) {
        fprintf(stderr, "agentkv pool: %s\n", err.msg);
        rc = 1;
    }
    ak_store_close(s);
    return rc;
}

int cmd_pool(int argc, char **argv) {
    pool_args pa;
    int rc = parse_args(&pa, argc, argv);
    if (rc == 1) return 0;   /* --help */
    if (rc) return rc;
    return !strcmp(pa.sub, "create") ? run_create(&pa) : run_store(&pa);
}
