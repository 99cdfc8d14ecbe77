/* server_rig.c - see server_rig.h */
#include "server_rig.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/util.h"

#define RIG_KILL_GRACE_S 10

const char *test_bin(void) {
    const char *b = getenv("AK_BIN");
    return b && *b ? b : "build/agentkv";
}

/* Runs cmd under `timeout -k RIG_KILL_GRACE_S limit_s` with its output to a log
 * in the test's temp dir. Returns the exit code (124: timed out, 128 + n:
 * killed by signal n); a non-zero code is recorded as a failure with the
 * log's tail. */
int run_script(ak_test_ctx *t, const char *cmd, const char *log_name, int limit_s) {
    char log[512], full[4096];
    snprintf(log, sizeof log, "%s/%s", test_tmp_dir(), log_name);
    snprintf(full, sizeof full, "timeout -k %d %d %s >%s 2>&1 </dev/null", RIG_KILL_GRACE_S, limit_s, cmd, log);
    int st = system(full);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (code != 0) {
        char *out = ak_read_file(log, NULL, NULL);
        size_t n = out ? strlen(out) : 0;
        ak_test_fail(t, __FILE__, __LINE__, "`%s` %s %d:\n%s", cmd,
                     code == 124 || code == 137 ? "timed out (killed), exit" : "exited", code,
                     out ? out + (n > 6000 ? n - 6000 : 0) : "");
        free(out);
    }
    return code;
}


int rig_start(ak_test_ctx *t, rig *r, const char *model, size_t budget, const char *mem, ak_kv_format fk,
              ak_kv_format fv, int n_ctx) {
    const rig_opts o = {.model = model, .budget = budget, .mem = mem, .fk = fk, .fv = fv, .n_ctx = n_ctx,
                        .family = AK_CHAT_PLAIN};
    return rig_start_opts(t, r, &o);
}

int rig_start_opts(ak_test_ctx *t, rig *r, const rig_opts *o) {
    const char *model = o->model, *mem = o->mem;
    size_t budget = o->budget;
    ak_kv_format fk = o->fk, fv = o->fv;
    int n_ctx = o->n_ctx;
    ak_error err = {0};
    char path[512], dir[512];
    memset(r, 0, sizeof *r);
    snprintf(dir, sizeof dir, "%s/%s", test_tmp_dir(), mem);
    r->m = ak_model_load(test_path(path, sizeof path, model), NULL, NULL, &err);
    if (r->m) r->tok = ak_tokenizer_load(&r->m->gguf, &err);
    if (r->tok) r->pool = ak_block_pool_new(&r->m->spec, 0, budget, &err);
    if (r->pool) r->store = ak_store_open(dir, NULL, &err);
    if (r->store) {
        ak_agents_config ac = {.model = r->m, .pool = r->pool, .store = r->store, .fk = fk, .fv = fv, .n_ctx = n_ctx,
                               .save = AK_SAVE_EVERY_TURN};
        r->agents = ak_agents_new(&ac, &err);
    }
    if (r->agents) r->metrics = ak_metrics_new(&err);
    if (r->metrics) {
        ak_sched_config sc = {.model = r->m, .tok = r->tok, .agents = r->agents, .pool = r->pool, .store = r->store,
                              .n_threads = 2, .n_ctx = n_ctx, .step_tokens = 256, .max_active = 16,
                              .metrics = r->metrics};
        r->s = ak_sched_start(&sc, &err);
    }
    if (r->s) {
        ak_server_config vc = {0};
        vc.host = "127.0.0.1";
        vc.sched = r->s;
        vc.model = r->m;
        vc.tok = r->tok;
        vc.model_id = "m";
        vc.family = o->family;
        vc.n_ctx = n_ctx;
        vc.metrics = r->metrics;
        vc.api_keys = o->api_keys;
        vc.n_api_keys = o->n_api_keys;
        vc.handoff = o->handoff;
        vc.handoff_reuse = o->handoff_reuse;
        r->srv = ak_server_start(&vc, &err);
    }
    if (!r->srv) {
        ak_test_fail(t, __FILE__, __LINE__, "%s: %s", model, err.msg);
        return -1;
    }
    r->port = ak_server_port(r->srv);
    return 0;
}

void rig_stop(rig *r) {
    ak_server_quiesce(r->srv);
    ak_sched_shutdown(r->s);
    ak_server_stop(r->srv);
    ak_sched_free(r->s);
    ak_error err = {0};
    if (r->agents) ak_agents_flush(r->agents, &err);
    ak_agents_free(r->agents);
    ak_metrics_free(r->metrics);
    ak_store_close(r->store);
    ak_block_pool_free(r->pool);
    ak_tokenizer_free(r->tok);
    ak_model_free(r->m);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------ a client */


void reply_free(reply *r) {
    cJSON_Delete(r->j);
    free(r->body);
    memset(r, 0, sizeof *r);
}

/* One exchange on a fresh connection (Connection: close), read to EOF;
 * every send and receive bounded by 60 s. headers: NULL or header lines. */
reply http_hdr(int port, const char *method, const char *path, const char *body, const char *headers) {
    reply r = {0};
    int fd = test_dial_loopback(port, 60000);
    if (fd < 0) return r;
    ak_buf b = {0};
    ak_buf_printf(&b, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n", method, path);
    if (headers) ak_buf_puts(&b, headers);
    if (body) ak_buf_printf(&b, "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", strlen(body), body);
    else ak_buf_puts(&b, "\r\n");
    int ok = !b.failed && send(fd, b.p, b.len, MSG_NOSIGNAL) == (ssize_t)b.len;
    ak_buf_free(&b);
    char tmp[8192];
    ssize_t k;
    while (ok && (k = recv(fd, tmp, sizeof tmp, 0)) > 0) ak_buf_append(&b, tmp, (size_t)k);
    close(fd);
    size_t total = b.len;
    char *raw = ak_buf_take(&b);
    char *sep = raw ? memmem(raw, total, "\r\n\r\n", 4) : NULL;
    if (sep && !strncmp(raw, "HTTP/1.", 7)) {
        r.status = atoi(raw + 9);
        r.len = total - (size_t)(sep + 4 - raw);
        r.body = malloc(r.len + 1);
        if (r.body) {
            memcpy(r.body, sep + 4, r.len);
            r.body[r.len] = 0;
            r.j = cJSON_Parse(r.body);
        }
    }
    free(raw);
    return r;
}

reply http_ex(int port, const char *method, const char *path, const char *body, const char *accept) {
    char h[256];
    if (accept) snprintf(h, sizeof h, "Accept: %s\r\n", accept);
    return http_hdr(port, method, path, body, accept ? h : NULL);
}

reply http(int port, const char *method, const char *path, const char *body) {
    return http_ex(port, method, path, body, NULL);
}

double num(const cJSON *j, const char *name) { return cJSON_GetNumberValue(cJSON_GetObjectItem(j, name)); }
const char *str(const cJSON *j, const char *name) { return cJSON_GetStringValue(cJSON_GetObjectItem(j, name)); }

/* The error code of an OpenAI error body ("" if none). */
const char *err_code(const reply *r) {
    const char *c = str(cJSON_GetObjectItem(r->j, "error"), "code");
    return c ? c : "";
}
const char *err_msg(const reply *r) {
    const char *c = str(cJSON_GetObjectItem(r->j, "error"), "message");
    return c ? c : (r->body ? r->body : "");
}

void json_merge(cJSON *j, const char *extra) {
    cJSON *x = extra ? cJSON_Parse(extra) : NULL, *it;
    while (x && (it = x->child)) {
        cJSON_DetachItemViaPointer(x, it);
        cJSON_AddItemToObject(j, it->string, it);
    }
    cJSON_Delete(x);
}

const char *answer(const reply *r) {
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(r->j, "choices"), 0);
    return str(cJSON_GetObjectItem(c0, "message"), "content");
}


cJSON *sse_events(const char *body) {
    cJSON *a = cJSON_CreateArray();
    for (const char *p = body; p && (p = strstr(p, "data: ")); p++) {
        p += 6;
        const char *end = strstr(p, "\n\n");
        if (!end) break;
        if (strncmp(p, "[DONE]", 6)) cJSON_AddItemToArray(a, cJSON_ParseWithLength(p, (size_t)(end - p)));
    }
    return a;
}

int run_cli(const char *args, char **out) {
    const char *bin = getenv("AK_BIN");
    char log[600], cmd[2048];
    snprintf(log, sizeof log, "%s/rig-cli.%d.log", test_tmp_dir(), (int)getpid());
    snprintf(cmd, sizeof cmd, "timeout 120 %s %s >%s 2>&1 </dev/null", bin && *bin ? bin : "build/agentkv", args, log);
    int st = system(cmd);
    *out = ak_read_file(log, NULL, NULL);
    if (!*out) *out = strdup("");
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}
