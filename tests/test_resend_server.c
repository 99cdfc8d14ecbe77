/* test_resend_server.c - over HTTP, on each chat family: a three-turn
 * conversation with a system message, resent in full each turn as agent
 * frameworks do (each reply as the server returned it, often starting or
 * ending with spaces and newlines), reuses the agent's whole history
 * (cached_tokens equals the agent's token count after the turn before); the
 * greedy reply over the reused cache equals a fresh prefill of the same
 * tokens; after a restart the fourth turn is served warm with the whole
 * history reused. Mistral, which moves the system message in front of the
 * last user message, reuses what its two renderings share (README). */
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "text/generate.h"
#include "server_rig.h"

typedef struct {
    const char *model;
    ak_chat_family family;
} fam_case;

static const fam_case cases[] = {
    {.model = "models/tiny-llama-h64-gqa-f32.gguf", .family = AK_CHAT_PLAIN},
    {.model = "models/tiny-llama-h64-gqa-f32.gguf", .family = AK_CHAT_LLAMA3},
    {.model = "models/tiny-llama-h64-gqa-f32.gguf", .family = AK_CHAT_CHATML},
    {.model = "models/tiny-llama-h64-gqa-f32.gguf", .family = AK_CHAT_LLAMA2},
    {.model = "models/tiny-llama-h64-gqa-f32.gguf", .family = AK_CHAT_GEMMA},
    {.model = "models/tiny-llama-h64-gqa-f32.gguf", .family = AK_CHAT_PHI3},
    {.model = "models/tiny-llama-h64-gqa-f32.gguf", .family = AK_CHAT_MISTRAL},
    {.model = "models/qwen3-tiny.gguf", .family = AK_CHAT_QWEN3},
    {.model = "models/deepseek2-tiny.gguf", .family = AK_CHAT_DEEPSEEK2},
    {.model = "models/gemma3-tiny.gguf", .family = AK_CHAT_GEMMA3},
};

#define N_CTX 1024
#define MAX_TOKENS 12

/* The conversation's messages as a JSON array string (malloc'd). */
static char *messages_json(const char *const *roles, char *const *texts, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", roles[i]);
        cJSON_AddStringToObject(m, "content", texts[i]);
        cJSON_AddItemToArray(a, m);
    }
    char *s = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    return s;
}

/* One greedy turn of agent id; fills the reply's text (malloc'd), prompt
 * and cached token counts. Returns 0, or -1 having failed the test. */
static int turn(ak_test_ctx *t, int port, const char *id, const char *msgs, char **text, int *prompt, int *cached) {
    char *body = malloc(strlen(msgs) + 256);
    sprintf(body, "{\"model\":\"m\",\"agent_id\":\"%s\",\"messages\":%s,\"max_tokens\":%d,\"temperature\":0}", id, msgs,
            MAX_TOKENS);
    reply r = http(port, "POST", "/v1/chat/completions", body);
    free(body);
    int ok = r.status == 200 && answer(&r);
    if (!ok) {
        ak_test_fail(t, __FILE__, __LINE__, "%s: HTTP %d %s", id, r.status, err_msg(&r));
        reply_free(&r);
        return -1;
    }
    cJSON *u = cJSON_GetObjectItem(r.j, "usage");
    *text = strdup(answer(&r));
    *prompt = (int)num(u, "prompt_tokens");
    *cached = (int)num(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens");
    reply_free(&r);
    return 0;
}

/* The agent's token count (GET /v1/agents/{id}), -1 if not listed. */
static int agent_tokens(int port, const char *id) {
    char path[256];
    snprintf(path, sizeof path, "/v1/agents/%s", id);
    reply r = http(port, "GET", path, NULL);
    int n = r.status == 200 ? (int)num(r.j, "tokens") : -1;
    reply_free(&r);
    return n;
}

/* Greedy generation from prompt[0..n) in a fresh agent of the rig's agents
 * (the scheduler stopped), by the server's rules (generate.h, the family's
 * end of turn as a stop string when it is not a token). Returns the text
 * (malloc'd) or NULL having failed the test. */
static char *fresh_greedy(ak_test_ctx *t, rig *r, ak_chat_family f, const int32_t *prompt, int n) {
    ak_error err = {0};
    ak_ctx *ctx = ak_ctx_new(r->m, 8, 2, &err);
    float *logits = malloc(sizeof(float) * (size_t)r->m->cfg.vocab);
    ak_sampler_params sp = ak_sampler_defaults();
    sp.temp = 0.0f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    ak_sampler *smp = ak_sampler_new(&sp, r->m->cfg.vocab, &err);
    const char *eot = ak_chat_end_of_turn(f);
    int32_t *ids = NULL;
    size_t ni = 0;
    int special = ak_tokenize(r->tok, eot, strlen(eot), AK_TOK_PARSE_SPECIAL, &ids, &ni, &err) == 0 && ni == 1 &&
                  ak_token_is_eog(r->tok, ids[0]);
    free(ids);
    const char *stop[1] = {eot};
    ak_gen g = {0};
    ak_turn tt;
    char *out = NULL;
    if (ctx && logits && smp &&
        ak_gen_init(&g, &(ak_gen_opts){.tok = r->tok, .smp = smp, .prompt = prompt, .n_prompt = n,
                    .max_tokens = MAX_TOKENS, .n_ctx = N_CTX, .stop_at_eog = 1, .stop = stop,
                    .n_stop = special ? 0 : 1}, &err) == 0 &&
        ak_agent_begin(r->agents, ctx, "fresh-prefill", prompt, n, logits, &tt, &err) == 0) {
        int pos = n;
        for (;;) {
            ak_gen_out o;
            ak_gen_status st = ak_gen_step(&g, logits, pos, &o, &err);
            if (st != AK_GEN_MORE) break;
            if (ak_agent_step(r->agents, ctx, "fresh-prefill", o.tok, logits, &err) < 0) break;
            pos++;
        }
        const char *fp;
        ak_gen_flush(&g, &fp);
        out = strdup(g.text ? g.text : "");
        ak_agent_end(r->agents, "fresh-prefill", &err);
    }
    if (!out) ak_test_fail(t, __FILE__, __LINE__, "fresh prefill: %s", err.msg);
    ak_gen_free(&g);
    ak_sampler_free(smp);
    free(logits);
    ak_ctx_free(ctx);
    return out;
}

/* What the first two turns' plain renderings share (mistral's reuse). */
static int shared_by_renderings(const ak_tokenizer *tk, ak_chat_family f, const char *const *roles, char *const *texts) {
    ak_chat_msg m[4];
    for (int i = 0; i < 4; i++) m[i] = (ak_chat_msg){.role = roles[i], .content = texts[i]};
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0, k = 0;
    ak_error err = {0};
    if (ak_chat_tokenize(m, 2,
                         &(ak_chat_opts){.family = f, .add_generation_prompt = 1},
                         tk, AK_TOK_ADD_SPECIAL, &a, &na, &err) == 0 &&
        ak_chat_tokenize(m, 4,
                         &(ak_chat_opts){.family = f, .add_generation_prompt = 1},
                         tk, AK_TOK_ADD_SPECIAL, &b, &nb, &err) == 0)
        while (k < na && k < nb && a[k] == b[k]) k++;
    free(a);
    free(b);
    return (int)k;
}

static void run_case(ak_test_ctx *t, const fam_case *c) {
    const char *fam = ak_chat_family_name(c->family);
    char mem[64], id[64];
    snprintf(mem, sizeof mem, "resend-%s", fam);
    snprintf(id, sizeof id, "agent-%s", fam);
    rig r;
    rig_opts o = {.model = c->model, .mem = mem, .fk = AK_KV_F32, .fv = AK_KV_F32, .n_ctx = N_CTX, .family = c->family};
    if (rig_start_opts(t, &r, &o) < 0) return;
    const char *roles[10] = {"system", "user"};
    char *texts[10] = {strdup("You answer questions about git, briefly."), strdup("How do I make a branch?")};
    static const char *const users[] = {"And then?", "What about merging?", "Thanks. One more thing?"};
    int n = 2, before = 0, prompt = 0, cached = 0, ws_edges = 0;
    char *last = NULL;
    for (int k = 0; k < 3; k++) {
        char *msgs = messages_json(roles, texts, n);
        char *text = NULL;
        int rc = turn(t, r.port, id, msgs, &text, &prompt, &cached);
        free(msgs);
        if (rc < 0) break;
        if (k > 0 && c->family == AK_CHAT_MISTRAL) {
            int want = k == 1 ? shared_by_renderings(r.tok, c->family, roles, texts) : -1;
            CHECK(k > 1 || cached == want, "%s turn %d: %d tokens cached, the renderings share %d", fam, k + 1, cached, want);
        } else if (k > 0) {
            CHECK(cached == before, "%s turn %d: %d of %d prompt tokens cached; the agent held %d", fam, k + 1, cached,
                  prompt, before);
        }
        size_t lt = strlen(text);
        ws_edges += lt && (strchr(" \n", text[0]) || strchr(" \n", text[lt - 1]));
        before = agent_tokens(r.port, id);
        free(last);
        last = strdup(text);
        roles[n] = "assistant";
        texts[n++] = text;
        roles[n] = "user";
        texts[n++] = strdup(users[k]);
    }
    /* the third reply against a fresh prefill of the very prompt it had */
    ak_server_quiesce(r.srv);
    ak_sched_shutdown(r.s);
    int nh = 0;
    const int32_t *h = ak_agent_history(r.agents, id, &nh);
    if (h && nh >= prompt && last) {
        int32_t *p = malloc(sizeof *p * (size_t)prompt);
        memcpy(p, h, sizeof *p * (size_t)prompt);
        char *fresh = fresh_greedy(t, &r, c->family, p, prompt);
        CHECK(fresh && !strcmp(fresh, last), "%s: reused-cache reply \"%s\" but a fresh prefill gives \"%s\"", fam, last,
              fresh ? fresh : "");
        free(fresh);
        free(p);
    } else {
        ak_test_fail(t, __FILE__, __LINE__, "%s: the agent holds %d tokens, its prompt had %d", fam, nh, prompt);
    }
    rig_stop(&r);
    /* a restart: the fourth turn, resent in full, is served from disk */
    if (c->family != AK_CHAT_MISTRAL && rig_start_opts(t, &r, &o) == 0) {
        char *msgs = messages_json(roles, texts, n), *text = NULL;
        if (turn(t, r.port, id, msgs, &text, &prompt, &cached) == 0)
            CHECK(cached == before, "%s after a restart: %d of %d prompt tokens cached; the agent held %d", fam, cached,
                  prompt, before);
        free(text);
        free(msgs);
        rig_stop(&r);
    }
    printf("    %s: replies with whitespace at an edge: %d of 3\n", fam, ws_edges);
    for (int i = 0; i < n; i++) free(texts[i]);
    free(last);
}

TEST(resend_server_every_family_reuses_the_history) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(t, &cases[i]);
}

/* Requests without an agent id are served by ephemeral agents (the prefix
 * cache): a conversation resent in full reuses, each turn, the prompt and
 * the reply of the turn before (all but the last token sampled, which the
 * cache never held when the turn ran out of max_tokens). */
TEST(resend_server_anonymous_reuses_the_last_turn) {
    static const ak_chat_family fams[] = {AK_CHAT_PLAIN, AK_CHAT_LLAMA3};
    for (int fi = 0; fi < 2; fi++) {
        rig r;
        rig_opts o = {.model = "models/tiny-llama-h64-gqa-f32.gguf", .mem = "resend-anon", .fk = AK_KV_F32, .fv = AK_KV_F32,
                      .n_ctx = N_CTX, .family = fams[fi]};
        if (rig_start_opts(t, &r, &o) < 0) return;
        const char *roles[8] = {"system", "user"};
        char *texts[8] = {strdup("You answer questions about git, briefly."), strdup("How do I make a branch?")};
        int n = 2, prompt = 0, cached = 0, prev = 0;
        for (int k = 0; k < 3; k++) {
            char *msgs = messages_json(roles, texts, n), *text = NULL;
            char *body = malloc(strlen(msgs) + 128);
            sprintf(body, "{\"model\":\"m\",\"messages\":%s,\"max_tokens\":%d,\"temperature\":0}", msgs, MAX_TOKENS);
            reply a = http(r.port, "POST", "/v1/chat/completions", body);
            free(body);
            free(msgs);
            if (a.status != 200 || !answer(&a)) {
                ak_test_fail(t, __FILE__, __LINE__, "anonymous turn %d: HTTP %d %s", k + 1, a.status, err_msg(&a));
                reply_free(&a);
                break;
            }
            cJSON *u = cJSON_GetObjectItem(a.j, "usage");
            prompt = (int)num(u, "prompt_tokens");
            cached = (int)num(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens");
            int completion = (int)num(u, "completion_tokens");
            if (k > 0)
                CHECK(cached >= prev, "%s anonymous turn %d: %d cached, the turn before held %d", ak_chat_family_name(fams[fi]),
                      k + 1, cached, prev);
            prev = prompt + completion - 1;
            text = strdup(answer(&a));
            reply_free(&a);
            roles[n] = "assistant";
            texts[n++] = text;
            roles[n] = "user";
            texts[n++] = strdup(k == 0 ? "And then?" : "What about merging?");
        }
        for (int i = 0; i < n; i++) free(texts[i]);
        rig_stop(&r);
    }
}
