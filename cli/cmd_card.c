/* cmd_card.c - agentkv card: make, import and look after CacheCards
 * (cards.h, agent.h: CARDS) in a memory directory, offline.
 *
 * export and import open the agents of the directory with the model, as the
 * server does, and call the same functions its POST /v1/agents/{id}/cards
 * and /import call (importance and topology run the same statistics pass);
 * inspect, ls and rm read only the store. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agents/bitalloc.h"
#include "store/cards.h"
#include "store/store.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv card export|import|inspect|ls|rm [flags]\n"
    "  export   --model M --agent A --bits B [--policy P] [--range FROM:TO] [--id ID]\n"
    "           make a card of agent A's context (its file in the memory directory)\n"
    "  import   --model M --agent A --card ID [--mode replace|append]\n"
    "           replace (default): agent A's whole context becomes the card; append: the card\n"
    "           goes after A's own tokens, its keys shifted there (an approximation: the card\n"
    "           never saw A's tokens; docs/cards.md)\n"
    "  inspect ID   a card's metadata and its width histogram\n"
    "  ls       list the cards\n"
    "  rm ID    delete a card's file; refused while agent files hold it, unless --force\n"
    "flags:\n"
    "  --memory DIR, --memory-dir DIR   the memory directory (default ./agentkv-memory)\n"
    "  --memory-key-file F      32-byte key of sealed files\n"
    "  -m, --model FILE         export, import: the GGUF model the agents were served with\n"
    "  --agent A                export: the source agent; import: the receiving agent\n"
    "  --card ID                import: the card\n"
    "  --mode M                 import: replace (default) or append\n"
    "  --id ID                  export: the card's id (default <agent>-<n>)\n"
    "  --bits B                 export: average bits per token of keys and values, in [2, 16]\n"
    "  --bits-k K, --bits-v V   export: the same per side (bits-v defaults to bits-k)\n"
    "  --policy P               export: uniform (default), importance or topology (these two\n"
    "                           prefill the range once more for attention statistics)\n"
    "  --range FROM:TO          export: positions [FROM, TO) of the agent's context (default all)\n"
    "  -c, --ctx-size N         export, import: the context of the agents (default: the model's,\n"
    "                           at most 4096, as serve)\n"
    "  -t, --threads N          export: threads (default: all cores)\n"
    "  -ctk, -ctv, --kv-budget, --kv-block, --center, --no-center   as serve (the agents' formats)\n"
    "  --force                  rm: delete even while agent files hold the card\n";

typedef struct {
    const char *sub, *name;           /* subcommand, and the ID of inspect / rm */
    const char *model_path, *agent, *card, *id, *policy, *mode;
    double bits_k, bits_v;
    int from, to, n_ctx, n_threads, force;
    store_opts mo;
    cache_opts co;
} card_args;

static int check_args(card_args *ca, ak_args *a);

/* Parses "FROM:TO" into ca. Errors through a. */
static void parse_range(card_args *ca, ak_args *a, const char *v) {
    char *end = NULL;
    long f = v ? strtol(v, &end, 10) : -1;
    long t = end && *end == ':' ? strtol(end + 1, &end, 10) : -1;
    if (!v || !end || *end || f < 0 || t <= f || t > (1L << 30)) {
        args_error(a, "--range wants FROM:TO with 0 <= FROM < TO (got '%s')", v ? v : "");
        return;
    }
    ca->from = (int)f;
    ca->to = (int)t;
}

/* One flag of card's own into ca; 0 if f is not one of them. */
static int parse_flag(card_args *ca, ak_args *a, const char *f) {
    if (!strcmp(f, "--memory")) { const char *v = args_value(a, f); if (v) ca->mo.dir = v; }
    else if (!strcmp(f, "-m") || !strcmp(f, "--model")) ca->model_path = args_value(a, f);
    else if (!strcmp(f, "--agent")) ca->agent = args_value(a, f);
    else if (!strcmp(f, "--card")) ca->card = args_value(a, f);
    else if (!strcmp(f, "--mode")) ca->mode = args_value(a, f);
    else if (!strcmp(f, "--id")) ca->id = args_value(a, f);
    else if (!strcmp(f, "--policy")) ca->policy = args_value(a, f);
    else if (!strcmp(f, "--bits")) ca->bits_k = ca->bits_v = args_float(a, f, 2, 16);
    else if (!strcmp(f, "--bits-k")) ca->bits_k = args_float(a, f, 2, 16);
    else if (!strcmp(f, "--bits-v")) ca->bits_v = args_float(a, f, 2, 16);
    else if (!strcmp(f, "--range")) parse_range(ca, a, args_value(a, f));
    else if (!strcmp(f, "-c") || !strcmp(f, "--ctx-size")) ca->n_ctx = (int)args_int(a, f, 2, 1 << 24);
    else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) ca->n_threads = (int)args_int(a, f, 1, 1024);
    else if (!strcmp(f, "--force")) ca->force = 1;
    else return 0;
    return 1;
}

/* Reads the flags into ca. Returns 0, or AK_EXIT_USAGE after printing why
 * (or 1 for --help: printed, nothing to do). */
static int parse_args(card_args *ca, int argc, char **argv) {
    ak_args a;
    args_init(&a, "card", argc, argv);
    memset(ca, 0, sizeof *ca);
    store_opts_init(&ca->mo);
    cache_opts_init(&ca->co);
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 1; }
        if (parse_flag(ca, &a, f)) continue;
        if (f[0] == '-') {
            if (!store_opts_parse(&ca->mo, &a, f) && !cache_opts_parse(&ca->co, &a, f)) args_unknown(&a, f);
        } else if (!ca->sub) ca->sub = f;
        else if (!ca->name) ca->name = f;
        else args_error(&a, "unexpected argument '%s'", f);
    }
    return check_args(ca, &a);
}

/* The combinations parse_args cannot see flag by flag. */
static int check_args(card_args *ca, ak_args *a) {
    const char *sub = ca->sub;
    static const char *const subs = "export, import, inspect, ls, rm";
    if (!a->failed && !sub) args_error(a, "which subcommand? (%s)", subs);
    if (!a->failed && strcmp(sub, "export") && strcmp(sub, "import") && strcmp(sub, "inspect") && strcmp(sub, "ls") &&
        strcmp(sub, "rm"))
        args_error(a, "unknown subcommand '%s' (%s)", sub, subs);
    if (a->failed) return AK_EXIT_USAGE;
    ak_bitalloc_policy pol;
    ak_error err = {{0}};
    int engine = !strcmp(sub, "export") || !strcmp(sub, "import");
    if (engine && !ca->model_path) args_error(a, "%s needs --model MODEL", sub);
    else if (engine && (!ca->agent || !ak_agent_id_valid(ca->agent))) args_error(a, "%s needs --agent ID (a valid id)", sub);
    else if (!strcmp(sub, "export") && ca->bits_k <= 0) args_error(a, "export needs --bits B (or --bits-k K)");
    else if (!strcmp(sub, "export") && ca->policy && ak_bitalloc_policy_parse(ca->policy, &pol, &err) < 0)
        args_error(a, "unknown --policy '%s' (uniform, importance, topology)", ca->policy);
    else if (!strcmp(sub, "export") && ca->id && !ak_agent_id_valid(ca->id)) args_error(a, "invalid card id '%s'", ca->id);
    else if (!strcmp(sub, "import") && (!ca->card || !ak_agent_id_valid(ca->card))) args_error(a, "import needs --card ID");
    else if (ca->mode && (strcmp(sub, "import") || (strcmp(ca->mode, "replace") && strcmp(ca->mode, "append"))))
        args_error(a, "--mode is import's: replace or append (got '%s')", ca->mode);
    else if ((!strcmp(sub, "inspect") || !strcmp(sub, "rm")) && (!ca->name || !ak_agent_id_valid(ca->name)))
        args_error(a, "%s needs a card ID", sub);
    else if (ca->name && strcmp(sub, "inspect") && strcmp(sub, "rm")) args_error(a, "unexpected argument '%s'", ca->name);
    if (ca->bits_v <= 0) ca->bits_v = ca->bits_k;
    return a->failed ? AK_EXIT_USAGE : 0;
}

/* ------------------------------------------------------------- reports */

/* Prints a card's metadata and its width histograms ("keys    2:N 4:N 8:N 16:N"). */
static void print_card(const ak_card *c, uint64_t file_bytes) {
    char when[32];
    time_t tt = (time_t)c->created;
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&tt));
    double mk = 0, mv = 0;
    for (int i = 0; i < c->n_tokens; i++) {
        mk += c->widths_k[i];
        mv += c->widths_v[i];
    }
    printf("card         %s\n", c->id);
    printf("tokens       %d\n", c->n_tokens);
    printf("pos_offset   %d\n", c->pos_offset);
    printf("source       %s\n", c->source_agent[0] ? c->source_agent : "-");
    printf("model        %s (%s)\n", c->model_name, c->fingerprint);
    printf("policy       %s, budget %.2f/%.2f bits, mean %.2f/%.2f\n", c->policy, c->budget_k, c->budget_v,
           mk / c->n_tokens, mv / c->n_tokens);
    printf("bytes        %zu of vectors (f16: %zu), file %llu\n", ak_card_vector_bytes(c), ak_card_f16_bytes(c),
           (unsigned long long)file_bytes);
    printf("hash         %s\n", c->hash);
    printf("created      %s\n", when);
    for (int s = 0; s < 2; s++)
        printf("%-12s 2:%d 4:%d 8:%d 16:%d\n", s ? "values" : "keys", c->count[s][0], c->count[s][1], c->count[s][2],
               c->count[s][3]);
}

/* ------------------------------------------------------ export / import */

/* What export and import set up: model, store, block pool, agents, a context. */
typedef struct {
    loaded_model lm;
    int loaded;
    ak_store *store;
    ak_block_pool *pool;
    ak_agents *agents;
    ak_ctx *ctx;
} card_rig;

static void rig_free(card_rig *r) {
    ak_ctx_free(r->ctx);
    ak_agents_free(r->agents);   /* saves what import changed */
    ak_block_pool_free(r->pool);
    ak_store_close(r->store);
    if (r->loaded) unload_model(&r->lm);
}

/* Loads the model and opens the agents of the directory as serve does.
 * Returns 0, or -1 after printing why. */
static int setup(card_rig *r, card_args *ca) {
    memset(r, 0, sizeof *r);
    if (load_model(&r->lm, "card", ca->model_path) < 0) return -1;
    r->loaded = 1;
    const ak_config *cfg = &r->lm.model->cfg;
    int n_ctx = ca->n_ctx ? ca->n_ctx : cfg->n_ctx_train < 4096 ? cfg->n_ctx_train : 4096;
    ak_error err = {{0}};
    if (!(r->store = store_opts_open(&ca->mo, &err))) goto fail;
    if (!(r->pool = ak_block_pool_new(&r->lm.model->spec, ca->co.block_tokens, ca->co.budget, &err))) goto fail;
    if (!(r->ctx = ak_ctx_new(r->lm.model, 256, ca->n_threads, &err))) goto fail;
    if (cache_center(&ca->co, r->ctx, r->lm.tok, r->pool, "card") < 0) return -1;
    ak_agents_config ac = {.model = r->lm.model, .pool = r->pool, .store = r->store, .fk = ca->co.fk, .fv = ca->co.fv,
                           .n_ctx = n_ctx, .save = AK_SAVE_EVERY_TURN};
    if (!(r->agents = ak_agents_new(&ac, &err))) goto fail;
    ak_agents_set_threads(r->agents, ak_ctx_pool(r->ctx));
    return 0;
fail:
    fprintf(stderr, "agentkv card: %s\n", err.msg);
    return -1;
}

/* agentkv card export: the card made and printed. Returns the exit code. */
static int run_export(card_rig *r, const card_args *ca) {
    ak_card_request rq;
    memset(&rq, 0, sizeof rq);
    rq.card_id = ca->id;
    rq.from = ca->from;
    rq.to = ca->to;
    rq.policy = ca->policy ? ca->policy : "uniform";
    rq.budget_k = ca->bits_k;
    rq.budget_v = ca->bits_v;
    rq.ctx = r->ctx;
    char id[AK_AGENT_ID_MAX + 1];
    ak_error err = {{0}};
    double t0 = ak_now();
    const ak_card *c = NULL;
    if (ak_agent_make_card(r->agents, ca->agent, &rq, id, &err) < 0 || !(c = ak_card_get(r->agents, id, &err))) {
        fprintf(stderr, "agentkv card: %s\n", err.msg);
        return 1;
    }
    ak_store_card_entry e = {0};
    ak_store_lookup_card(r->store, id, &e);
    print_card(c, e.bytes);
    printf("made in      %.2f s\n", ak_now() - t0);
    return 0;
}

/* agentkv card import (--mode replace or append). Returns the exit code. */
static int run_import(card_rig *r, const card_args *ca) {
    ak_error err = {{0}};
    int append = ca->mode && !strcmp(ca->mode, "append");
    if (ak_agent_import_card_mode(r->agents, ca->agent, ca->card, append ? AK_IMPORT_APPEND : AK_IMPORT_REPLACE,
                                  &err) < 0 ||
        ak_agents_flush(r->agents, &err) < 0) {
        fprintf(stderr, "agentkv card: %s\n", err.msg);
        return 1;
    }
    const ak_card *c = ak_card_get(r->agents, ca->card, &err);
    int k = ak_agents_find(r->agents, ca->agent);
    ak_agent_info in = {0};
    if (k >= 0) ak_agents_get(r->agents, k, &in);
    if (append)
        printf("agent %s: card %s appended (%d tokens after its own; %d in all)\n", ca->agent, ca->card,
               c ? c->n_tokens : 0, in.n_tokens);
    else printf("agent %s: its context is card %s (%d tokens)\n", ca->agent, ca->card, c ? c->n_tokens : 0);
    return 0;
}

static int run_engine(card_args *ca) {
    card_rig r;
    int rc = 1;
    if (setup(&r, ca) == 0) rc = !strcmp(ca->sub, "export") ? run_export(&r, ca) : run_import(&r, ca);
    if (r.loaded) rig_free(&r);
    return rc;
}

/* ------------------------------------------------------------- the store */

/* Agent files of store s that hold card id (their base starts with it or
 * has it as a later segment: an append): the count, names into names
 * (comma-separated, truncated to cap); -1 with err set. */
static int holders(ak_store *s, const char *id, char *names, size_t cap, ak_error *err) {
    ak_store_entry *ents = NULL;
    int n = 0, count = 0;
    if (ak_store_list(s, &ents, &n, err) < 0) return -1;
    names[0] = 0;
    for (int i = 0; i < n; i++) {
        int uses = 0;
        for (int k = 0; k < ents[i].base.n_seg; k++)
            uses |= ents[i].base.seg[k].kind == AK_SEG_CARD && !strcmp(ents[i].base.seg[k].id, id);
        if (!uses) continue;
        size_t used = strlen(names);
        if (used + 1 < cap) snprintf(names + used, cap - used, "%s%s", count ? ", " : "", ents[i].id);
        count++;
    }
    free(ents);
    return count;
}

/* agentkv card inspect ID: the whole card verified and printed. */
static int run_inspect(ak_store *s, const card_args *ca, ak_error *err) {
    ak_card *c = NULL;
    ak_store_status st = ak_store_load_card(s, ca->name, NULL, NULL, 0, &c, err);
    if (st != AK_STORE_HIT) {
        if (st == AK_STORE_ABSENT) fprintf(stderr, "agentkv card: no card '%s' in %s\n", ca->name, ca->mo.dir);
        else fprintf(stderr, "agentkv card: %s: %s\n", ak_store_status_name(st), err->msg);
        return 1;
    }
    ak_store_card_entry e = {0};
    ak_store_lookup_card(s, ca->name, &e);
    print_card(c, e.bytes);
    ak_card_free(c);
    return 0;
}

/* agentkv card ls. */
static int run_ls(ak_store *s, ak_error *err) {
    ak_store_card_entry *v = NULL;
    int n = 0;
    if (ak_store_list_cards(s, &v, &n, err) < 0) return -1;
    printf("%-24s %7s %6s %-10s %11s %12s %-16s %s\n", "card", "tokens", "offset", "policy", "mean k/v", "bytes",
           "source", "hash");
    for (int i = 0; i < n; i++) {
        char mean[32];
        snprintf(mean, sizeof mean, "%.2f/%.2f", v[i].mean_k, v[i].mean_v);
        printf("%-24s %7d %6d %-10s %11s %12llu %-16s %s\n", v[i].id, v[i].n_tokens, v[i].pos_offset,
               v[i].readable ? v[i].policy : (v[i].sealed ? "sealed" : "?"), mean, (unsigned long long)v[i].bytes,
               v[i].source_agent[0] ? v[i].source_agent : "-", v[i].hash);
    }
    free(v);
    return 0;
}

/* agentkv card rm ID. Returns the exit code, or -1 with err set. */
static int run_rm(ak_store *s, const card_args *ca, ak_error *err) {
    char names[600];
    int users = holders(s, ca->name, names, sizeof names, err);
    if (users < 0) return -1;
    if (users && !ca->force) {
        fprintf(stderr, "agentkv card: card '%s' is held by %d agent file%s (%s): delete %s first, or use --force "
                        "(they then recompute their whole prompt)\n", ca->name, users, users == 1 ? "" : "s", names,
                users == 1 ? "it" : "them");
        return 1;
    }
    int r = ak_store_remove_card(s, ca->name, err);
    if (r < 0) return -1;
    if (r == 1) {
        fprintf(stderr, "agentkv card: no card '%s' in %s\n", ca->name, ca->mo.dir);
        return 1;
    }
    return 0;
}

/* inspect / ls / rm: the store alone. */
static int run_store(card_args *ca) {
    ak_error err = {{0}};
    ak_store *s = store_opts_open(&ca->mo, &err);
    if (!s) {
        fprintf(stderr, "agentkv card: %s\n", err.msg);
        return 1;
    }
    int rc;
    if (!strcmp(ca->sub, "ls")) rc = run_ls(s, &err);
    else if (!strcmp(ca->sub, "rm")) rc = run_rm(s, ca, &err);
    else rc = run_inspect(s, ca, &err);
    if (rc < 0) {
        fprintf(stderr, "agentkv card: %s\n", err.msg);
        rc = 1;
    }
    ak_store_close(s);
    return rc;
}

int cmd_card(int argc, char **argv) {
    card_args ca;
    int rc = parse_args(&ca, argc, argv);
    if (rc == 1) return 0;   /* --help */
    if (rc) return rc;
    return !strcmp(ca.sub, "export") || !strcmp(ca.sub, "import") ? run_engine(&ca) : run_store(&ca);
}
