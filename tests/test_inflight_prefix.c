/* test_inflight_prefix.c - one document sent to several agents at once
 * (in process: model, scheduler and server started here; loopback
 * sockets). The requests arrive together; the first computes the shared
 * prefix and the others wait for it to commit, then link its blocks from
 * the content index (sched.c: wait_for_shared_prefix): the document is
 * computed once, not once per agent, and every answer is the one the
 * agent gets alone on a fresh server. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server_rig.h"
#include "test.h"

#define N_AGENTS 4
#define MODEL "models/tiny-llama-h64-gqa-f32.gguf"

static const char *DOC =
    "The lighthouse keeper climbed the hundred and twelve steps every evening at dusk, carrying a can of oil "
    "and a rag for the lens. From the gallery he could see the harbour, the fishing boats coming home in a "
    "line, and beyond them the dark water where the current ran fast around the rocks. He kept a log of every "
    "ship that passed, its flag and its heading, and in winter, when the storms came in from the west, he "
    "sometimes stayed awake all night to keep the lamp turning. The town paid him in coal and bread, and once "
    "a year the harbour master came to read the log and to sign it at the bottom of the last page. ";

typedef struct {
    int port, i;
    reply r;
} job;

/* The completion for agent i: the document and question i. */
static reply ask(int port, int i, const char *agent) {
    char prompt[4096];   /* the document three times: its prefill takes several engine steps */
    snprintf(prompt, sizeof prompt, "%s%s%sQuestion %d: what did the keeper carry up the steps on day %d?", DOC, DOC, DOC,
             i, i + 3);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", "m");
    cJSON_AddStringToObject(j, "agent_id", agent);
    cJSON_AddStringToObject(j, "prompt", prompt);
    cJSON_AddNumberToObject(j, "max_tokens", 8);
    cJSON_AddNumberToObject(j, "temperature", 0);
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    reply r = http(port, "POST", "/v1/completions", body);
    free(body);
    return r;
}

static void *ask_thread(void *arg) {
    job *jb = arg;
    char id[32];
    snprintf(id, sizeof id, "reader-%d", jb->i);
    jb->r = ask(jb->port, jb->i, id);
    return NULL;
}

static const char *text_of(const reply *r) {
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(r->j, "choices"), 0);
    return str(c, "text");
}

TEST(inflight_shared_prefix_computed_once) {
    rig r;
    const rig_opts o = {.model = MODEL, .mem = "ref", .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = 1024,
                        .family = AK_CHAT_PLAIN};
    /* the references: each question alone on a fresh server */
    char *ref[N_AGENTS] = {0};
    int doc_prompt = 0;
    for (int i = 0; i < N_AGENTS; i++) {
        if (rig_start_opts(t, &r, &o) < 0) goto out;
        reply a = ask(r.port, i, "alone");
        CHECK(a.status == 200 && text_of(&a), "reference %d: %d %s", i, a.status, a.body ? a.body : "");
        ref[i] = text_of(&a) ? strdup(text_of(&a)) : NULL;
        doc_prompt = (int)num(cJSON_GetObjectItem(a.j, "usage"), "prompt_tokens");
        reply_free(&a);
        rig_stop(&r);
    }
    rig_opts o2 = o;
    o2.mem = "together";
    if (rig_start_opts(t, &r, &o2) < 0) goto out;
    job jobs[N_AGENTS];
    pthread_t th[N_AGENTS];
    for (int i = 0; i < N_AGENTS; i++) {
        jobs[i] = (job){.port = r.port, .i = i};
        pthread_create(&th[i], NULL, ask_thread, &jobs[i]);
    }
    int prefilled = 0, linked = 0;
    for (int i = 0; i < N_AGENTS; i++) {
        pthread_join(th[i], NULL);
        reply *a = &jobs[i].r;
        const cJSON *ak = cJSON_GetObjectItem(a->j, "agentkv");
        CHECK(a->status == 200 && text_of(a) && ref[i] && !strcmp(text_of(a), ref[i]), "agent %d: '%s', alone '%s'",
              i, text_of(a) ? text_of(a) : "(none)", ref[i] ? ref[i] : "");
        prefilled += (int)num(ak, "prefilled");
        if (num(ak, "reused") >= doc_prompt / 2) linked++;
        reply_free(a);
    }
    /* the document (most of each prompt) computed once: the others link it, block by block */
    printf("    %d agents, prompts of %d tokens: %d prefilled in all, %d linked the document\n", N_AGENTS, doc_prompt,
           prefilled, linked);
    CHECK(linked == N_AGENTS - 1 && prefilled < doc_prompt + (N_AGENTS - 1) * 64,
          "%d prefilled for %d prompts of %d tokens (%d linked the document)", prefilled, N_AGENTS, doc_prompt, linked);
    rig_stop(&r);
out:
    for (int i = 0; i < N_AGENTS; i++) free(ref[i]);
}
