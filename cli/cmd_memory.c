/* cmd_memory.c - agentkv memory: add, list and remove memory chunks
 * (memories.h) in a memory directory, offline.
 *
 * add computes the chunk's KV alone at position 0 with the model and writes
 * memories/ID.safetensors exactly as the server's POST /v1/memories does
 * (the body is parsed by the same code, src/serve/api.c, and the chunk tokenized
 * and computed by memories.c), so a memory made here is one a server
 * started on the directory places in chat requests. ls and rm read only
 * the store. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "serve/api.h"
#include "agents/memories.h"
#include "store/store.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv memory add|ls|rm [flags]\n"
    "  add      --model M --id ID (--file F | --text S) [flags]\n"
    "           compute a text's KV alone (no BOS, at position 0) and write it to the memory\n"
    "           directory; the same text in the same formats under another id is not computed\n"
    "           again (content-addressed). A server reads the directory's index at start: add\n"
    "           memories before starting it, or over HTTP (POST /v1/memories)\n"
    "  ls       list the memories: tokens, formats, bytes, content hash\n"
    "  rm ID    delete a memory's file (agents that placed it keep their copy)\n"
    "flags:\n"
    "  --memory DIR, --memory-dir DIR   the memory directory (default ./agentkv-memory)\n"
    "  --memory-key-file F      32-byte key of sealed files\n"
    "  -m, --model FILE         add: the GGUF model the memory is for\n"
    "  --id ID                  add: the memory's id (1-128 of [A-Za-z0-9_.-], not starting with '.')\n"
    "  --file F                 add: the chunk is this file's text\n"
    "  --text S                 add: the chunk is this text\n"
    "  -c, --ctx-size N         add: the context the chunk must fit in (default: the model's, at\n"
    "                           most 4096, as serve)\n"
    "  -t, --threads N          add: threads (default: all cores)\n"
    "  -ctk, --cache-type-k F   add: format of the keys (default: the agents' default, as serve)\n"
    "  -ctv, --cache-type-v F   add: format of the values (default: as serve)\n"
    "  --kv-budget, --kv-block, --center, --no-center   as serve\n"
    "  --json                   ls: as JSON\n";

typedef struct {
    const char *sub, *name;
    const char *model_path, *id, *file, *text;
    int n_ctx, n_threads, json;
    store_opts mo;
    cache_opts co;
} mem_args;

/* Reads the flags into ma. Returns 0, 1 for --help (printed), or
 * AK_EXIT_USAGE after printing why. */
static int parse_args(mem_args *ma, int argc, char **argv) {
    ak_args a;
    args_init(&a, "memory", argc, argv);
    memset(ma, 0, sizeof *ma);
    store_opts_init(&ma->mo);
    cache_opts_init(&ma->co);
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 1; }
        else if (!strcmp(f, "--memory")) { const char *v = args_value(&a, f); if (v) ma->mo.dir = v; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) ma->model_path = args_value(&a, f);
        else if (!strcmp(f, "--id")) ma->id = args_value(&a, f);
        else if (!strcmp(f, "--file")) ma->file = args_value(&a, f);
        else if (!strcmp(f, "--text")) ma->text = args_value(&a, f);
        else if (!strcmp(f, "-c") || !strcmp(f, "--ctx-size")) ma->n_ctx = (int)args_int(&a, f, 2, 1 << 24);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) ma->n_threads = (int)args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--json")) ma->json = 1;
        else if (f[0] == '-') {
            if (!store_opts_parse(&ma->mo, &a, f) && !cache_opts_parse(&ma->co, &a, f)) args_unknown(&a, f);
        } else if (!ma->sub) ma->sub = f;
        else if (!ma->name) ma->name = f;
        else args_error(&a, "unexpected argument '%s'", f);
    }
    const char *sub = ma->sub;
    if (!a.failed && !sub) args_error(&a, "which subcommand? (add, ls, rm)");
    if (!a.failed && strcmp(sub, "add") && strcmp(sub, "ls") && strcmp(sub, "rm"))
        args_error(&a, "unknown subcommand '%s' (add, ls, rm)", sub);
    if (a.failed) return AK_EXIT_USAGE;
    if (!strcmp(sub, "add")) {
        if (!ma->model_path) args_error(&a, "add needs --model MODEL");
        else if (!ma->id) args_error(&a, "add needs --id ID");
        else if (!ak_agent_id_valid(ma->id)) args_error(&a, "invalid memory id '%s'", ma->id);
        else if (!!ma->file + !!ma->text != 1) args_error(&a, "add needs exactly one of --file and --text");
        else if (ma->name) args_error(&a, "unexpected argument '%s'", ma->name);
    } else if (!strcmp(sub, "rm")) {
        if (!ma->name) args_error(&a, "rm needs ID");
        else if (!ak_agent_id_valid(ma->name)) args_error(&a, "invalid memory id '%s'", ma->name);
    } else if (ma->name) {
        args_error(&a, "unexpected argument '%s'", ma->name);
    }
    return a.failed ? AK_EXIT_USAGE : 0;
}

/* agentkv memory add. Returns the exit code. */
static int run_add(mem_args *ma) {
    /* the POST /v1/memories body this stands for, parsed by the server's code */
    char *data = NULL;
    size_t dl = 0;
    if (ma->file && !(data = read_prompt_file("memory", ma->file, &dl))) return 1;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", ma->id);
    cJSON_AddStringToObject(j, "text", ma->text ? ma->text : data);
    free(data);
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    ak_api_memory_request p = {0};
    ak_api_error b;
    if (!body || ak_api_parse_memory(body, strlen(body), &p, &b) < 0) {
        fprintf(stderr, "agentkv memory: %s\n", body ? b.msg : "out of memory");
        free(body);
        return 1;
    }
    free(body);
    int rc = 1, loaded = 0;
    loaded_model lm;
    ak_store *store = NULL;
    ak_block_pool *pool = NULL;
    ak_agents *agents = NULL;
    ak_ctx *ctx = NULL;
    int32_t *ids = NULL;
    int n = 0;
    ak_error err = {{0}};
    if (load_model(&lm, "memory", ma->model_path) < 0) goto out;
    loaded = 1;
    const ak_config *cfg = &lm.model->cfg;
    int n_ctx = ma->n_ctx ? ma->n_ctx : cfg->n_ctx_train < 4096 ? cfg->n_ctx_train : 4096;
    if (!(store = store_opts_open(&ma->mo, &err)) ||
        !(pool = ak_block_pool_new(&lm.model->spec, ma->co.block_tokens, ma->co.budget, &err)) ||
        !(ctx = ak_ctx_new(lm.model, 512, ma->n_threads, &err)))
        goto fail;
    /* the model's KV means, as serve installs them: stored as a server stores them */
    if (cache_center(&ma->co, ctx, lm.tok, pool, "memory") < 0) goto out;
    ak_agents_config ac = {.model = lm.model, .pool = pool, .store = store, .fk = ma->co.fk, .fv = ma->co.fv,
                           .n_ctx = n_ctx, .save = AK_SAVE_EVERY_TURN};
    if (!(agents = ak_agents_new(&ac, &err))) goto fail;
    if (ak_memory_tokenize(lm.tok, p.text, strlen(p.text), &ids, &n, &err) < 0) goto fail;
    int computed = 0;
    double t0 = ak_now();
    if (ak_memory_add(agents, ctx, &(ak_memory_request){.id = p.id, .text = p.text, .tokens = ids, .n = n, .fk = p.fk,
                      .fv = p.fv}, &computed, &err) < 0) goto fail;
    ak_memory_info in;
    if (ak_memory_get(agents, p.id, &in, NULL, &err) < 0) goto fail;
    printf("memory %s: %d tokens, K/V %s/%s, %llu bytes on disk, hash %s, %s in %.2f s\n", in.id, in.n_tokens,
           ak_kv_format_get(in.fk)->name, ak_kv_format_get(in.fv)->name, (unsigned long long)in.file_bytes, in.hash,
           computed ? "computed" : "shared with a memory of the same content", ak_now() - t0);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "agentkv memory: %s\n", err.msg);
out:
    free(ids);
    ak_agents_free(agents);
    ak_ctx_free(ctx);
    ak_block_pool_free(pool);
    ak_store_close(store);
    if (loaded) unload_model(&lm);
    ak_api_memory_request_free(&p);
    return rc;
}

/* agentkv memory ls. Returns 0, or -1 with err set. */
static int run_ls(ak_store *s, const mem_args *ma, ak_error *err) {
    ak_store_pool_entry *v = NULL;
    int n = 0;
    if (ak_store_list_memories(s, &v, &n, err) < 0) return -1;
    cJSON *arr = ma->json ? cJSON_CreateArray() : NULL;
    if (!ma->json) printf("%-24s %8s %-9s %12s %-20s %s\n", "memory", "tokens", "K/V", "bytes", "created", "hash");
    for (int i = 0; i < n; i++) {
        const ak_store_entry *e = &v[i].e;
        char when[32], fmt[32];
        time_t tt = (time_t)e->created;
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&tt));
        if (e->readable)
            snprintf(fmt, sizeof fmt, "%s/%s", ak_kv_format_get(e->fk)->name, ak_kv_format_get(e->fv)->name);
        else snprintf(fmt, sizeof fmt, "%s", e->sealed ? "sealed" : "?");
        if (arr) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "id", e->id);
            cJSON_AddNumberToObject(o, "tokens", e->n_tokens);
            cJSON_AddStringToObject(o, "formats", fmt);
            cJSON_AddNumberToObject(o, "bytes", (double)e->bytes);
            cJSON_AddNumberToObject(o, "created", (double)e->created);
            cJSON_AddStringToObject(o, "hash", v[i].pool_hash);
            cJSON_AddStringToObject(o, "text", v[i].source ? v[i].source : "");
            cJSON_AddItemToArray(arr, o);
        } else {
            printf("%-24s %8d %-9s %12llu %-20s %s\n", e->id, e->n_tokens, fmt, (unsigned long long)e->bytes, when,
                   v[i].pool_hash);
        }
    }
    if (arr) {
        char *out = cJSON_PrintUnformatted(arr);
        printf("%s\n", out ? out : "[]");
        free(out);
        cJSON_Delete(arr);
    }
    ak_store_pool_entries_free(v, n);
    return 0;
}

int cmd_memory(int argc, char **argv) {
    mem_args ma;
    int rc = parse_args(&ma, argc, argv);
    if (rc == 1) return 0;   /* --help */
    if (rc) return rc;
    if (!strcmp(ma.sub, "add")) return run_add(&ma);
    ak_error err = {{0}};
    ak_store *s = store_opts_open(&ma.mo, &err);
    if (!s) {
        fprintf(stderr, "agentkv memory: %s\n", err.msg);
        return 1;
    }
    if (!strcmp(ma.sub, "ls")) {
        rc = run_ls(s, &ma, &err) < 0 ? 1 : 0;
        if (rc) fprintf(stderr, "agentkv memory: %s\n", err.msg);
    } else {
        int r = ak_store_remove_memory(s, ma.name, &err);
        if (r < 0) fprintf(stderr, "agentkv memory: %s\n", err.msg);
        if (r == 1) fprintf(stderr, "agentkv memory: no memory '%s' in %s\n", ma.name, ma.mo.dir);
        rc = r == 0 ? 0 : 1;
    }
    ak_store_close(s);
    return rc;
}
