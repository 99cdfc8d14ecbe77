/* run.c - see run.h */
#include "serve/run.h"

#include <errno.h>
#include <stdio.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

void ak_run_make_id(ak_server *s, const char *prefix, char *out, size_t cap) {
    pthread_mutex_lock(&s->mu);
    uint64_t n = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    snprintf(out, cap, "%s-%016llx%08llx", prefix, (unsigned long long)s->id_salt, (unsigned long long)n);
}

cJSON *ak_run_agentkv_json(const ak_api_request *p, const ak_req_result *res) {
    cJSON *a = cJSON_CreateObject();
    if (p->agent_id[0]) cJSON_AddStringToObject(a, "agent_id", p->agent_id);
    else cJSON_AddNullToObject(a, "agent_id");
    if (p->pool[0]) cJSON_AddStringToObject(a, "pool", p->pool);
    else cJSON_AddNullToObject(a, "pool");
    cJSON_AddStringToObject(a, "tier", ak_tier_name(res->turn.tier));
    cJSON_AddStringToObject(a, "match", ak_match_name(res->turn.match));
    cJSON_AddNumberToObject(a, "reused", res->turn.reused);
    cJSON_AddNumberToObject(a, "shared", res->turn.shared);
    cJSON_AddNumberToObject(a, "prefilled", res->turn.prefilled);
    cJSON_AddNumberToObject(a, "restore_ms", res->turn.restore_ms);
    cJSON_AddBoolToObject(a, "restored_ahead", res->turn.restored_ahead);
    cJSON_AddNumberToObject(a, "prefill_ms", res->turn.prefill_ms);
    cJSON_AddNumberToObject(a, "memory_reuse_ms", res->mem_ms);
    cJSON_AddNumberToObject(a, "handoff_reused", res->handoff_reused);
    cJSON_AddNumberToObject(a, "handoff_recomputed", res->handoff_recomputed);
    cJSON_AddNumberToObject(a, "handoff_ms", res->handoff_ms);
    cJSON_AddNumberToObject(a, "handoff_shift", res->handoff_shift);
    if (res->handoff_from[0]) cJSON_AddStringToObject(a, "handoff_from", res->handoff_from);
    else cJSON_AddNullToObject(a, "handoff_from");
    cJSON_AddNumberToObject(a, "queue_ms", res->queue_ms);
    cJSON_AddNumberToObject(a, "ttft_ms", res->ttft_ms);
    cJSON_AddNumberToObject(a, "decode_ms", res->decode_ms);
    cJSON_AddNumberToObject(a, "evicted", res->turn.evicted);
    return a;
}

int ak_run_parsed_reply(const ak_server *s, const ak_api_request *p) {
    return p->chat && ((p->tools.n_tools > 0 && p->tools.choice != AK_TOOL_CHOICE_NONE) ||
                       s->cfg.family == AK_CHAT_QWEN3 || s->cfg.family == AK_CHAT_DEEPSEEK3);
}

ak_toolcall *ak_run_reply_parser(ak_server *s, const ak_api_request *p, const char *id, int index, ak_error *err) {
    uint64_t seed = 1469598103934665603ull;   /* FNV-1a of the answer id: ids differ per answer */
    for (const char *c = id; *c; c++) seed = (seed ^ (uint8_t)*c) * 1099511628211ull;
    if (index) seed = (seed ^ (uint64_t)index) * 1099511628211ull;   /* and per choice */
    const ak_toolcall_opts o = {.family = s->cfg.family,
                                .tools = p->tools.n_tools > 0 && p->tools.choice != AK_TOOL_CHOICE_NONE,
                                .parallel = p->tools.parallel, .in_reasoning = p->tools.in_reasoning, .id_seed = seed};
    return ak_toolcall_new(&o, err);
}

/* 1 when the peer has closed or reset the connection (or shut down its
 * sending side: an HTTP client does that only when leaving). Data waiting to
 * be read (a pipelined request) is not a departure. Never blocks. */
static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd pf = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pf, 1, 0) <= 0) return 0;
    if (pf.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) return 1;
    char ch;
    ssize_t n = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* How often a waiting handler looks at its client's socket: a client that
 * leaves is noticed within this time and its request cancelled (it then ends
 * at the engine's next step). */
#define AK_GONE_POLL_MS 50

int ak_run_wait(ak_run *run, size_t have) {
    for (;;) {
        int done = ak_request_wait(run->r, have, AK_GONE_POLL_MS);
        size_t len = ak_request_read(run->r, have, NULL, NULL, NULL);
        if (done) return 1;
        if (len > have) return 0;
        if (client_gone(run->fd)) {
            ak_request_cancel(run->r);
            return -1;
        }
    }
}

int ak_run_wait_news(ak_run *run, uint64_t seen, int until_done) {
    for (;;) {
        int done = until_done ? ak_request_wait(run->r, (size_t)-1, AK_GONE_POLL_MS)
                              : ak_request_wait_news(run->r, seen, AK_GONE_POLL_MS);
        if (done) return 1;
        ak_req_result res;
        ak_request_read(run->r, 0, NULL, NULL, &res);
        if (!until_done && res.version != seen) return 0;
        if (client_gone(run->fd)) {
            ak_request_cancel(run->r);
            return -1;
        }
    }
}

int ak_run_failed_status(const ak_req_result *res) {
    /* no KV room before admission: the request can never fit, even alone */
    if (res->code == AK_ERR_KV_BUDGET && !res->admitted) return 400;
    return ak_http_status_of(res->code);
}

const char *ak_run_error_code(int code, const char **param) {
    *param = NULL;
    switch (code) {
    case AK_ERR_NOT_FOUND: *param = "pool"; return "pool_not_found";
    case AK_ERR_STALE: *param = "pool"; return "pool_stale";
    case AK_ERR_CORRUPT: *param = "pool"; return "pool_corrupt";
    case AK_ERR_KV_BUDGET: return "kv_budget";
    default: return NULL;
    }
}

void ak_run_free(ak_run *run) {
    ak_request_release(run->r);
    ak_api_request_free(&run->p);
    run->r = NULL;
}

enum MHD_Result ak_run_client_left(const ak_route_req *q, ak_run *run) {
    ak_run_free(run);
    ak_metrics_request(q->s->cfg.metrics, q->ep, 499);   /* nginx's "client closed request" */
    return MHD_NO;
}

/* The scheduler's parameters of a parsed request (pointing into p). */
static ak_req_params req_params(ak_api_request *p) {
    ak_req_params rp = {.agent_id = p->agent_id, .pool = p->pool, .prompt = p->tokens, .n_prompt = (int)p->n_tokens,
                        .logprobs = p->logprobs, .top_logprobs = p->top_logprobs,
                        .max_tokens = p->max_tokens, .sp = p->sp, .n_stop = p->n_stop, .stop_at_eog = 1,
                        /* full: the same prompt computed as a plain one, from the first memory on */
                        .n_mem = p->n_mem, .mem_full = p->reuse == AK_REUSE_FULL, .mem_method = p->reuse,
                        .mem_ratio = (float)p->recompute_ratio, .reprompt = ak_api_reprompt(p),
                        .grammar = p->grammar, .grammar_after = p->grammar_after,
                        .grammar_required = p->grammar_required, .grammar_free_after = p->grammar_free_after,
                        .n_choices = p->n, .handoff = p->handoff, .handoff_reuse = p->handoff_reuse};
    for (int i = 0; i < p->n_stop; i++) rp.stop[i] = p->stop[i];
    for (int i = 0; i < p->n_mem; i++) {
        rp.mem_id[i] = p->mem_id[i];
        rp.mem_at[i] = p->mem_at[i];
        rp.mem_len[i] = p->mem_len[i];
    }
    return rp;
}

int ak_run_start(const ak_route_req *q, const ak_run_args *a, ak_run *run, enum MHD_Result *reply) {
    ak_server *s = q->s;
    memset(run, 0, sizeof *run);
    ak_api_config ac = ak_server_api_config(s);
    pthread_mutex_lock(&s->mu);
    uint64_t seed = (uint64_t)time(NULL) ^ (s->id_salt + s->next_id * 0x9E3779B97F4A7C15ull);
    pthread_mutex_unlock(&s->mu);
    ak_api_error b;
    int rc = ak_api_parse(&ac, a->body, a->len, a->chat, a->agent_header, seed, &run->p, &b);
    ak_server_release_body(s, q->cn);   /* parsed: the body no longer counts while the request runs */
    if (rc < 0) {
        *reply = ak_http_error(s, q->c, q->ep, b.status, b.param, b.code, "%s", b.msg);
        return 0;
    }
    run->fd = ak_server_conn_fd(q->c);
    ak_req_params rp = req_params(&run->p);
    if (!run->p.handoff_given) {   /* the server's setting */
        rp.handoff = s->cfg.handoff;   /* the scheduler leaves it off with memories */
        rp.handoff_reuse = s->cfg.handoff_reuse;
    }
    rp.domain = q->cn->domain;
    ak_error err = {0};
    run->r = ak_sched_submit(s->cfg.sched, &rp, &err);
    if (!run->r) {
        ak_api_request_free(&run->p);
        /* KV_BUDGET here: larger than the whole budget, it can never run */
        int status = err.code == AK_ERR_KV_BUDGET ? 400 : ak_http_status_of(err.code);
        *reply = ak_http_error(s, q->c, q->ep, status, status == 400 ? "max_tokens" : NULL, NULL, "%s", err.msg);
        return 0;
    }
    run->p.resend = NULL;   /* the scheduler's now */
    if (a->id) snprintf(run->id, sizeof run->id, "%s", a->id);
    else ak_run_make_id(s, a->id_prefix, run->id, sizeof run->id);
    run->created = (long)time(NULL);
    /* wait for the first text (or the end), so that a request that fails
     * in the queue still gets its own HTTP status */
    if (ak_run_wait_news(run, 0, 0) < 0) {
        *reply = ak_run_client_left(q, run);
        return 0;
    }
    ak_req_result res;
    ak_request_read(run->r, 0, NULL, NULL, &res);
    if (res.finish != AK_FINISH_ERROR) return 1;
    const char *param, *code = ak_run_error_code(res.code, &param);
    if (run->p.n_mem && param && !strcmp(param, "pool")) {   /* a memory that vanished or broke since the parse */
        param = "memories";
        code = res.code == AK_ERR_NOT_FOUND ? "memory_not_found" : res.code == AK_ERR_STALE ? "memory_stale"
                                                                                             : "memory_corrupt";
    }
    *reply = ak_http_error(s, q->c, q->ep, ak_run_failed_status(&res), param, code, "%s", res.error);
    ak_run_free(run);
    return 0;
}
