/* cmd_cache.c - agentkv cache: look after a memory directory of agent caches. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include <time.h>

#include "store/store.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv cache ls|inspect NAME|verify [NAME]|rm NAME|gc [flags]\n"
    "  ls            list agent files: tokens, formats, bytes, last use, model\n"
    "  inspect NAME  one agent's metadata (JSON)\n"
    "  verify [NAME] check every file (or one) completely: structure, checksums, and\n"
    "                with -m the model fingerprint; corrupt files are reported, not moved\n"
    "  rm NAME       delete an agent's file\n"
    "  gc            delete least recently used files until --disk-budget is met\n"
    "flags:\n"
    "  --memory-dir DIR       the directory (default ./agentkv-memory)\n"
    "  --memory-key-file F    32-byte key of sealed files\n"
    "  -m MODEL               verify against this model's fingerprint\n"
    "  --disk-budget BYTES    for gc\n"
    "  --json                 ls as JSON\n";

int cmd_cache(int argc, char **argv) {
    ak_args a;
    args_init(&a, "cache", argc, argv);
    const char *sub = NULL, *name = NULL, *dir = "./agentkv-memory", *key_file = NULL, *model_path = NULL;
    size_t budget = 0;
    int json = 0, have_budget = 0;
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "--memory-dir")) dir = args_value(&a, f);
        else if (!strcmp(f, "--memory-key-file")) key_file = args_value(&a, f);
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) model_path = args_value(&a, f);
        else if (!strcmp(f, "--json")) json = 1;
        else if (!strcmp(f, "--disk-budget")) {
            const char *v = args_value(&a, f);
            if (v && ak_parse_bytes(v, &budget) < 0) args_error(&a, "--disk-budget: bad size '%s'", v);
            have_budget = 1;
        } else if (f[0] == '-') args_unknown(&a, f);
        else if (!sub) sub = f;
        else if (!name) name = f;
        else args_error(&a, "unexpected argument '%s'", f);
    }
    if (!a.failed && !sub) args_error(&a, "which subcommand? (ls, inspect, verify, rm, gc)");
    if (!a.failed && strcmp(sub, "ls") && strcmp(sub, "inspect") && strcmp(sub, "verify") && strcmp(sub, "rm") &&
        strcmp(sub, "gc"))
        args_error(&a, "unknown subcommand '%s' (ls, inspect, verify, rm, gc)", sub);
    if (!a.failed && (!strcmp(sub, "inspect") || !strcmp(sub, "rm")) && !name) args_error(&a, "%s needs NAME", sub);
    if (!a.failed && name && !ak_agent_id_valid(name)) args_error(&a, "invalid agent id '%s'", name);
    if (!a.failed && !strcmp(sub, "gc") && !have_budget) args_error(&a, "gc needs --disk-budget BYTES");
    if (a.failed) return AK_EXIT_USAGE;

    ak_error err = {{0}};
    uint8_t key[AK_STORE_KEY_BYTES];
    if (key_file && ak_store_read_key(key_file, key, &err) < 0) {
        fprintf(stderr, "agentkv cache: %s\n", err.msg);
        return 1;
    }
    ak_store *s = ak_store_open(dir, key_file ? key : NULL, &err);
    sodium_memzero(key, sizeof key);   /* the store keeps its own copy */
    if (!s) { fprintf(stderr, "agentkv cache: %s\n", err.msg); return 1; }
    int rc = 1;
    ak_store_entry *ents = NULL;
    int n = 0;
    if (!strcmp(sub, "ls")) {
        if (ak_store_list(s, &ents, &n, &err) < 0) goto fail;
        if (json) printf("[");
        else printf("%-24s %8s %-9s %12s %-20s %s\n", "agent", "tokens", "K/V", "bytes", "last use", "model");
        for (int i = 0; i < n; i++) {
            const ak_store_entry *e = &ents[i];
            char when[32], fmt[32];
            time_t tt = (time_t)e->mtime;
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&tt));
            if (e->readable)
                snprintf(fmt, sizeof fmt, "%s/%s", ak_kv_format_get(e->fk)->name, ak_kv_format_get(e->fv)->name);
            else snprintf(fmt, sizeof fmt, "%s", e->sealed ? "sealed" : "?");
            if (json) {
                printf("%s{\"id\": \"%s\", \"tokens\": %d, \"formats\": \"%s\", \"bytes\": %llu, \"mtime\": %lld, "
                       "\"sealed\": %s, \"fingerprint\": \"%s\"}", i ? ", " : "", e->id, e->n_tokens, fmt,
                       (unsigned long long)e->bytes, (long long)e->mtime, e->sealed ? "true" : "false",
                       e->fingerprint);
            } else {
                printf("%-24s %8d %-9s %12llu %-20s %s%s\n", e->id, e->n_tokens, fmt, (unsigned long long)e->bytes,
                       when, e->model_name[0] ? e->model_name : e->fingerprint, e->sealed ? " (sealed)" : "");
            }
        }
        if (json) printf("]\n");
        rc = 0;
    } else if (!strcmp(sub, "inspect")) {
        ak_store_entry e;
        char *meta = NULL;
        int r = ak_store_inspect(s, name, &e, &meta, &err);
        if (r == 1) { fprintf(stderr, "agentkv cache: no agent '%s' in %s\n", name, dir); goto out; }
        if (r < 0) goto fail;
        printf("%s\n", meta ? meta : "{}");
        free(meta);
        rc = 0;
    } else if (!strcmp(sub, "verify")) {
        char fp[65] = {0};
        int vocab = 0;
        if (model_path) {
            loaded_model lm;
            if (load_model(&lm, "cache", model_path) < 0) goto out;
            snprintf(fp, sizeof fp, "%s", lm.model->fingerprint);
            vocab = lm.model->cfg.vocab;
            unload_model(&lm);
        }
        if (name) {
            ents = calloc(1, sizeof *ents);
            if (!ents) goto out;
            snprintf(ents[0].id, sizeof ents[0].id, "%s", name);
            n = 1;
        } else if (ak_store_list(s, &ents, &n, &err) < 0) goto fail;
        int bad = 0;
        for (int i = 0; i < n; i++) {
            ak_error ve = {{0}};
            ak_store_status st = ak_store_verify(s, ents[i].id, model_path ? fp : NULL, vocab, &ve);
            printf("%-24s %s%s%s\n", ents[i].id, st == AK_STORE_HIT ? "ok" : ak_store_status_name(st),
                   st == AK_STORE_HIT ? "" : ": ", st == AK_STORE_HIT ? "" : ve.msg);
            bad += st != AK_STORE_HIT;
        }
        rc = bad ? 1 : 0;
    } else if (!strcmp(sub, "rm")) {
        int r = ak_store_remove(s, name, &err);
        if (r < 0) goto fail;
        if (r == 1) { fprintf(stderr, "agentkv cache: no agent '%s' in %s\n", name, dir); goto out; }
        rc = 0;
    } else {
        uint64_t left = 0;
        int r = ak_store_gc(s, budget, &left, &err);
        if (r < 0) goto fail;
        printf("gc: deleted %d files, %llu bytes left\n", r, (unsigned long long)left);
        rc = 0;
    }
    goto out;
fail:
    fprintf(stderr, "agentkv cache: %s\n", err.msg);
out:
    free(ents);
    ak_store_close(s);
    return rc;
}
