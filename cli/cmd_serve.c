/* cmd_serve.c - agentkv serve: the OpenAI-compatible multi-agent server. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agents/agent.h"
#include "text/chat.h"
#include "serve/server.h"
#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv serve -m MODEL [flags]\n"
    "  serves the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models) plus agent memory\n"
    "  (/v1/agents), pools (/v1/pools: shared prefixes; a request with \"pool\": ID starts from one),\n"
    "  /health and /metrics. Name an agent with the header X-Agent-Id or the body field agent_id;\n"
    "  its KV cache persists in the memory directory and is restored on its next turn.\n"
    "  -m, --model FILE       GGUF model\n"
    "  --host ADDR            address to bind (default 127.0.0.1: loopback only)\n"
    "  --port N               port (default 8080; 0 = any free port, printed at start)\n"
    "  -c, --ctx-size N       positions per agent (default: the model's, at most 4096)\n"
    "  -t, --threads N        threads (default: all cores)\n"
    "  --max-agents N         requests running at once, batched together (default 16); more queue\n"
    "  --step-tokens N        tokens per engine step: decode tokens + a prefill chunk (default 256)\n"
    "  --step-ms MS           while agents decode, size prefill chunks so a step takes about MS\n"
    "                         (default 200; 0 = always --step-tokens)\n"
    "  --api-key-file F       require 'Authorization: Bearer KEY', KEY one of F's lines (each\n"
    "                         non-empty line a key, '#' a comment); each key is a trust domain\n"
    "  --handoff-reuse R      none (default), cacheblend:RATIO or agentkvshift:RATIO: a prompt's\n"
    "                         run of 64+ tokens that another hot agent of the same key holds\n"
    "                         (a handoff: the same history after another head) is placed from\n"
    "                         its KV, keys shifted, RATIO of it recomputed; a request's field\n"
    "                         handoff_reuse overrides it (docs/handoff.md)\n"
    "  --model-id NAME        the model name clients use (default: the file name without .gguf)\n"
    "  --chat-template F      override the chat family: llama3 chatml llama2 mistral gemma phi3 plain\n"
    "  --responses-ttl SECONDS   stored responses and conversations expire this long after their\n"
    "                         last write (default 2592000: 30 days, as OpenAI keeps them)\n"
    "  --responses-budget BYTES  disk for stored responses (default 1G); past it the oldest go first\n"
    "  --chat-template-file F a Jinja chat template (a model's published one) in place of the GGUF's:\n"
    "                         its family is detected from it, as from the GGUF's\n"
    "  --max-body BYTES       largest request body (default 4M; larger: 413, refused on Content-Length)\n"
    "  --max-buffered BYTES   request-body bytes buffered across all connections (default 64M);\n"
    "                         a body that would go over gets 503 with Retry-After: 1\n"
    "  --timeout SECONDS      close a connection idle this long (default 30; generating is not idle)\n"
    "  --max-conns-per-ip N   connections one client address may hold (default 128); more are closed\n"
    "  --allowed-host NAME    a Host name clients may use beside localhost, 127.0.0.1, [::1] and\n"
    "                         --host (repeatable; '*': no Host check, e.g. behind a proxy that checks\n"
    "                         it); other names get 403, against DNS rebinding\n"
    "  --cors-origin ORIGIN   let web pages of ORIGIN (scheme://host[:port], or '*') call the API\n"
    "                         (repeatable); without it every request with an Origin header gets 403\n"
    MEMORY_OPTS_HELP
    CACHE_OPTS_HELP
    "  (serve's default KV budget: half of the RAM left beside the weights)\n"
    "  SIGINT/SIGTERM: stop accepting, cut running requests, save every dirty agent (failed\n"
    "  saves retried), exit 0; exit 1 naming each agent that could not be saved.\n";

/* The most --allowed-host / --cors-origin values serve takes. */
#define MAX_WEB_NAMES 32

static void log_line(void *ud, const char *line) {
    (void)ud;
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    fprintf(stderr, "%02d:%02d:%02d agentkv: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec, line);
}

/* The most keys an API key file may hold. */
#define MAX_API_KEYS 64

/* The keys of an API key file: each non-empty line, trimmed, is a key
 * (lines starting with '#' are comments), and each key is a trust domain
 * of its own. buf holds them (the caller frees it). */
typedef struct {
    char *buf;
    const char *key[MAX_API_KEYS];
    int n;
} api_keys;

/* Reads path into *k. Returns 0, or -1 with err set (unreadable, no key,
 * more than MAX_API_KEYS, the same key twice). */
static int read_api_keys(const char *path, api_keys *k, ak_error *err) {
    memset(k, 0, sizeof *k);
    if (!(k->buf = ak_read_file(path, NULL, err))) return -1;
    for (char *line = k->buf, *next; line && *line; line = next) {
        size_t n = strcspn(line, "\r\n");
        next = line[n] ? line + n + 1 : NULL;
        line[n] = 0;
        while (*line == ' ' || *line == '\t') line++, n--;
        while (n && (line[n - 1] == ' ' || line[n - 1] == '\t')) line[--n] = 0;
        if (!n || line[0] == '#') continue;
        if (k->n == MAX_API_KEYS) return ak_fail(err, "%s: more than %d API keys", path, MAX_API_KEYS);
        for (int i = 0; i < k->n; i++)
            if (!strcmp(k->key[i], line)) return ak_fail(err, "%s: line of key %d repeats key %d", path, k->n + 1, i + 1);
        k->key[k->n++] = line;
    }
    return k->n ? 0 : ak_fail(err, "%s: the API key file holds no key", path);
}

/* What serve was asked: its flags. */
typedef struct {
    const char *model_path, *host, *api_key_file, *model_id, *chat_template, *chat_template_file;
    int port, n_ctx, n_threads, max_agents, step_tokens, step_ms;
    size_t max_body, max_buffered, responses_budget;
    long responses_ttl;
    unsigned conn_timeout, conns_per_ip;
    const char *allowed_hosts[MAX_WEB_NAMES], *cors_origins[MAX_WEB_NAMES];
    int n_allowed_hosts, n_cors_origins;
    int handoff;             /* --handoff-reuse: 0 none, else by handoff_reuse */
    ak_reuse_params handoff_reuse;
    ak_chat_family family;   /* --chat-template's (AK_CHAT_PLAIN without it: detected later) */
    store_opts mo;
    cache_opts co;
} serve_opts;

/* Parses argv into o. Returns -1 when serve should run, else its exit code:
 * 0 after --help, AK_EXIT_USAGE after a usage error (printed). */
static int serve_parse(int argc, char **argv, serve_opts *o) {
    ak_args a;
    args_init(&a, "serve", argc, argv);
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080, o->max_agents = 16, o->step_tokens = 256, o->step_ms = 200;
    o->max_body = 4u << 20, o->max_buffered = AK_SERVER_DEFAULT_MAX_BUFFERED;
    o->conn_timeout = AK_SERVER_DEFAULT_TIMEOUT_S, o->conns_per_ip = AK_SERVER_DEFAULT_CONNS_PER_IP;
    store_opts_init(&o->mo);
    cache_opts_init(&o->co);
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) o->model_path = args_value(&a, f);
        else if (!strcmp(f, "--host")) o->host = args_value(&a, f);
        else if (!strcmp(f, "--port")) o->port = (int)args_int(&a, f, 0, 65535);
        else if (!strcmp(f, "--api-key-file")) o->api_key_file = args_value(&a, f);
        else if (!strcmp(f, "--model-id")) o->model_id = args_value(&a, f);
        else if (!strcmp(f, "--chat-template")) o->chat_template = args_value(&a, f);
        else if (!strcmp(f, "--chat-template-file")) o->chat_template_file = args_value(&a, f);
        else if (!strcmp(f, "--handoff-reuse")) {
            const char *v = args_value(&a, f);
            ak_error e = {{0}};
            if (v && ak_reuse_spec_parse(v, &o->handoff, &o->handoff_reuse, &e) < 0)
                args_error(&a, "--handoff-reuse: %s", e.msg);
        }
        else if (!strcmp(f, "--responses-ttl")) o->responses_ttl = (long)args_int(&a, f, 1, 100L * 365 * 86400);
        else if (!strcmp(f, "--responses-budget")) {
            const char *v = args_value(&a, f);
            if (v && (ak_parse_bytes(v, &o->responses_budget) < 0 || !o->responses_budget))
                args_error(&a, "--responses-budget: '%s' is not a positive byte size", v);
        }
        else if (!strcmp(f, "-c") || !strcmp(f, "--ctx-size")) o->n_ctx = (int)args_int(&a, f, 2, 1 << 24);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) o->n_threads = (int)args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--max-agents")) o->max_agents = (int)args_int(&a, f, 1, 4096);
        else if (!strcmp(f, "--step-tokens")) o->step_tokens = (int)args_int(&a, f, 1, 1 << 16);
        else if (!strcmp(f, "--step-ms")) o->step_ms = (int)args_int(&a, f, 0, 600000);
        else if (!strcmp(f, "--max-body")) {
            const char *v = args_value(&a, f);
            if (v && (ak_parse_bytes(v, &o->max_body) < 0 || !o->max_body))
                args_error(&a, "--max-body: '%s' is not a positive byte size", v);
        } else if (!strcmp(f, "--max-buffered")) {
            const char *v = args_value(&a, f);
            if (v && (ak_parse_bytes(v, &o->max_buffered) < 0 || !o->max_buffered))
                args_error(&a, "--max-buffered: '%s' is not a positive byte size", v);
        } else if (!strcmp(f, "--timeout")) o->conn_timeout = (unsigned)args_int(&a, f, 1, 86400);
        else if (!strcmp(f, "--max-conns-per-ip")) o->conns_per_ip = (unsigned)args_int(&a, f, 1, 512);
        else if (!strcmp(f, "--allowed-host")) {
            const char *v = args_value(&a, f);
            if (v && !ak_server_host_name_valid(v))
                args_error(&a, "--allowed-host: '%s' is not a host name ('*', a name, an IPv4 address or [IPv6]; no port)", v);
            else if (v && o->n_allowed_hosts == MAX_WEB_NAMES) args_error(&a, "--allowed-host: at most %d", MAX_WEB_NAMES);
            else if (v) o->allowed_hosts[o->n_allowed_hosts++] = v;
        } else if (!strcmp(f, "--cors-origin")) {
            const char *v = args_value(&a, f);
            if (v && !ak_server_origin_valid(v))
                args_error(&a, "--cors-origin: '%s' is not an origin ('*', or scheme://host[:port] without a path)", v);
            else if (v && o->n_cors_origins == MAX_WEB_NAMES) args_error(&a, "--cors-origin: at most %d", MAX_WEB_NAMES);
            else if (v) o->cors_origins[o->n_cors_origins++] = v;
        }
        else if (!store_opts_parse(&o->mo, &a, f) && !cache_opts_parse(&o->co, &a, f)) args_unknown(&a, f);
    }
    o->family = AK_CHAT_PLAIN;
    ak_error err = {{0}};
    if (!a.failed && !o->model_path) args_error(&a, "-m MODEL is required");
    if (!a.failed && o->chat_template && ak_chat_family_parse(o->chat_template, &o->family, &err) < 0)
        args_error(&a, "--chat-template: %s", err.msg);
    return a.failed ? AK_EXIT_USAGE : -1;
}

/* The name clients use for the model: --model-id, else the file name
 * without .gguf, into buf (n bytes). */
static void model_id_of(const serve_opts *o, char *buf, size_t n) {
    if (o->model_id) {
        snprintf(buf, n, "%s", o->model_id);
        return;
    }
    const char *base = strrchr(o->model_path, '/');
    snprintf(buf, n, "%s", base ? base + 1 : o->model_path);
    size_t l = strlen(buf);
    if (l > 5 && !strcmp(buf + l - 5, ".gguf")) buf[l - 5] = 0;
}

/* Waits for SIGINT or SIGTERM (blocked in sigs), then stops accepting, cuts
 * running requests, stops *server and frees *sched (both set to NULL) and
 * saves every dirty agent. Returns 0, or -1 with err set when an agent could
 * not be saved (each such agent is printed by name). */
static int serve_until_signal(const sigset_t *sigs, ak_server **server, ak_sched **sched, ak_agents *agents,
                              ak_error *err) {
    int sig = 0;
    sigwait(sigs, &sig);
    log_line(NULL, sig == SIGINT ? "SIGINT: shutting down" : "SIGTERM: shutting down");
    ak_server_quiesce(*server);   /* no new connections */
    ak_sched_shutdown(*sched);    /* queued requests get 503, running ones end with their text so far */
    ak_server_stop(*server);      /* open connections finish */
    *server = NULL;
    ak_sched_free(*sched);
    *sched = NULL;
    if (ak_agents_flush(agents, err) < 0) {
        /* each agent by name: an operator must know whose memory is lost */
        for (int i = 0; i < ak_agents_count(agents); i++) {
            ak_agent_info in;
            ak_agents_get(agents, i, &in);
            if (in.dirty)
                fprintf(stderr, "agentkv serve: agent %s NOT saved (%d tokens): %s\n", in.id, in.n_tokens,
                        in.save_error[0] ? in.save_error : "no save succeeded");
        }
        return -1;
    }
    return 0;
}

/* agentkv serve: parses the flags, loads the model, starts the agents, the
 * scheduler and the server, and serves until a signal. Returns the exit
 * code. */
int cmd_serve(int argc, char **argv) {
    serve_opts so;
    int prc = serve_parse(argc, argv, &so);
    if (prc >= 0) return prc;
    serve_opts *o = &so;
    cache_opts *co = &o->co;
    const store_opts *mo = &o->mo;
    const char *host = o->host;
    ak_chat_family family = o->family;
    ak_error err = {{0}};
    if (!o->api_key_file && !ak_server_host_is_loopback(host))
        fprintf(stderr, "agentkv serve: warning: --host %s is reachable from other machines and no --api-key-file "
                        "is set: anyone who can connect can use and delete every agent\n", host);

    /* the signals are taken by sigwait below: block them before any thread starts */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    loaded_model lm;
    if (load_model(&lm, "serve", o->model_path) < 0) return 1;
    const ak_config *cfg = &lm.model->cfg;
    int n_ctx = o->n_ctx;
    if (!n_ctx) n_ctx = cfg->n_ctx_train < 4096 ? cfg->n_ctx_train : 4096;
    if (n_ctx > cfg->n_ctx_train) {
        fprintf(stderr, "agentkv serve: -c %d is longer than the model's context of %d\n", n_ctx, cfg->n_ctx_train);
        unload_model(&lm);
        return AK_EXIT_USAGE;
    }
    int rc = 1;
    char *template_text = NULL, model_id[256];
    api_keys keys = {0};
    ak_store *store = NULL;
    ak_rstore *rstore = NULL;
    ak_block_pool *pool = NULL;
    ak_agents *agents = NULL;
    ak_metrics *metrics = NULL;
    ak_sched *sched = NULL;
    ak_server *server = NULL;
    model_id_of(o, model_id, sizeof model_id);
    if (o->chat_template_file) {
        if (!(template_text = ak_read_file(o->chat_template_file, NULL, &err))) goto fail;
    } else {
        template_text = ak_chat_template_gguf(&lm.model->gguf, &err);
    }
    if (!o->chat_template) family = ak_chat_detect(template_text);
    if (o->api_key_file && read_api_keys(o->api_key_file, &keys, &err) < 0) goto fail;
    if (!(store = store_opts_open(mo, &err))) goto fail;
    char rdir[4096];
    snprintf(rdir, sizeof rdir, "%s/responses", mo->dir);
    if (!(rstore = ak_rstore_open(&(ak_rstore_opts){.dir = rdir, .ttl_s = o->responses_ttl,
                                                    .budget_bytes = o->responses_budget}, &err)))
        goto fail;
    if (!co->budget) {
        /* a server without a budget would keep every agent in RAM forever:
         * default to half of what the machine has beside the weights */
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        size_t ram = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
        size_t w = lm.model->weight_bytes;
        co->budget = ram > w ? (ram - w) / 2 : 256u << 20;
    }
    if (!(pool = ak_block_pool_new(&lm.model->spec, co->block_tokens, co->budget, &err))) goto fail;
    {
        /* the model's KV means, before any block is written (agent files
         * record them: a restart computes the same and restores) */
        ak_ctx *cal = ak_ctx_new(lm.model, 512, o->n_threads, &err);
        if (!cal) goto fail;
        int crc = cache_center(co, cal, lm.tok, pool, "serve");
        ak_ctx_free(cal);
        if (crc < 0) goto done; /* cache_center printed why */
    }
    /* touch the first part of the hot tier now, not during a restore */
    ak_block_pool_prefault(pool, co->fk, co->fv, co->budget < (512u << 20) ? co->budget : (512u << 20));
    ak_agents_config ac = {.model = lm.model, .pool = pool, .store = store, .fk = co->fk, .fv = co->fv,
                           .n_ctx = n_ctx, .save = mo->save, .disk_budget = mo->disk_budget, .log = log_line,
                           .no_prefix_sharing = mo->no_prefix_sharing};
    if (!(agents = ak_agents_new(&ac, &err))) goto fail;
    if (!(metrics = ak_metrics_new(&err))) goto fail;
    ak_sched_config sc = {.model = lm.model, .tok = lm.tok, .agents = agents, .pool = pool, .store = store,
                          .n_threads = o->n_threads, .n_ctx = n_ctx, .step_tokens = o->step_tokens,
                          .max_active = o->max_agents, .metrics = metrics, .log = log_line, .step_ms = o->step_ms};
    if (!(sched = ak_sched_start(&sc, &err))) goto fail;
    ak_server_config vc = {.host = host, .port = o->port, .sched = sched, .model = lm.model, .tok = lm.tok,
                           .model_id = model_id, .api_keys = keys.key, .n_api_keys = keys.n,
                           .handoff = o->handoff, .handoff_reuse = o->handoff_reuse, .max_body = o->max_body, .family = family,
                           .template_text = template_text, .n_ctx = n_ctx, .metrics = metrics, .log = log_line,
                           .log_ud = NULL, .conn_timeout_s = o->conn_timeout, .max_conns_per_ip = o->conns_per_ip,
                           .max_buffered = o->max_buffered, .allowed_hosts = o->allowed_hosts,
                           .n_allowed_hosts = o->n_allowed_hosts, .cors_origins = o->cors_origins,
                           .n_cors_origins = o->n_cors_origins, .rstore = rstore};
    if (!(server = ak_server_start(&vc, &err))) goto fail;
    char handoff_name[48];
    ak_reuse_spec_format(o->handoff, &o->handoff_reuse, handoff_name, sizeof handoff_name);
    fprintf(stderr,
            "agentkv: serving %s on http://%s:%d  (chat template %s, context %d, KV %s/%s, budget %.1f MiB, "
            "memory %s%s%s%s%s)\n",
            model_id, host, ak_server_port(server), ak_chat_family_name(family), n_ctx, ak_kv_format_get(co->fk)->name,
            ak_kv_format_get(co->fv)->name, co->budget / 1048576.0, mo->store_url ? mo->store_url : mo->dir,
            mo->key_file ? ", sealed" : "", keys.n ? ", API key required" : "", o->handoff ? ", handoff reuse " : "",
            o->handoff ? handoff_name : "");
    fflush(stderr);
    if (serve_until_signal(&sigs, &server, &sched, agents, &err) < 0) {
        fprintf(stderr, "agentkv serve: saving agents at shutdown: %s\n", err.msg);
        goto done;
    }
    log_line(NULL, "every agent saved; bye");
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "agentkv serve: %s\n", err.msg);
done:
    ak_server_stop(server);
    ak_sched_free(sched);
    ak_agents_free(agents);
    ak_metrics_free(metrics);
    ak_block_pool_free(pool);
    ak_store_close(store);
    ak_rstore_close(rstore);
    free(keys.buf);
    free(template_text);
    unload_model(&lm);
    return rc;
}
