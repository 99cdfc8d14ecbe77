/* test_logprobs_server.c - logprobs over HTTP against the engine run here.
 *
 * A greedy chat turn on stories260K (a 512-token vocabulary) asks for
 * logprobs and top_logprobs 20; the test renders the same prompt, runs the
 * forward pass itself on a fresh context (ak_eval) token by token, and
 * computes each step's log-softmax in long double: every reported value
 * must lie within 1e-4 of it, the token must be the argmax (greedy), the
 * top list must be the 20 largest, sorted. The values are the model's own:
 * a logit_bias that bans the greedy token changes the text but not the
 * numbers. The streamed answer's entries, chunk by chunk, carry the text
 * of their chunk and concatenate to the whole answer's. Completions' legacy
 * shape, a stop string's cut, and the 400s. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "engine/model.h"
#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "server_rig.h"
#include "text/chat.h"
#include "test.h"

#define N_CTX 512
#define TOL 1e-4
#define PROMPT "Once upon a time"

/* The reference: the prompt's tokens and, per generated step, the model's
 * log-softmax (long double) over the vocabulary, computed here. */
typedef struct {
    ak_ctx *ctx;
    ak_block_pool *pool;
    ak_kv *kv;
    float *logits;
    long double *lp;          /* this step's log-probabilities (vocab) */
    int vocab, pos;
} ref;

static void ref_close(ref *f) {
    ak_kv_free(f->kv);
    ak_block_pool_free(f->pool);
    ak_ctx_free(f->ctx);
    free(f->logits);
    free(f->lp);
}

/* log-softmax of f->logits into f->lp, in long double. */
static void ref_softmax(ref *f) {
    long double mx = f->logits[0], s = 0;
    for (int i = 1; i < f->vocab; i++)
        if (f->logits[i] > mx) mx = f->logits[i];
    for (int i = 0; i < f->vocab; i++) s += expl((long double)f->logits[i] - mx);
    long double lse = mx + logl(s);
    for (int i = 0; i < f->vocab; i++) f->lp[i] = (long double)f->logits[i] - lse;
}

/* A fresh context and cache on the rig's model, the prompt ids[0..n)
 * evaluated. Returns 0, or -1 having failed the test. */
static int ref_open(ak_test_ctx *t, ref *f, const rig *r, const int32_t *ids, int n) {
    ak_error err = {{0}};
    memset(f, 0, sizeof *f);
    f->vocab = r->m->cfg.vocab;
    f->logits = malloc(sizeof(float) * (size_t)f->vocab);
    f->lp = malloc(sizeof(long double) * (size_t)f->vocab);
    f->ctx = ak_ctx_new(r->m, 64, 1, &err);
    if (f->ctx) f->pool = ak_block_pool_new(&r->m->spec, 0, 0, &err);
    if (f->pool) f->kv = ak_kv_new(f->pool, AK_KV_F32, AK_KV_F32, N_CTX, &err);
    if (!f->kv || !f->logits || !f->lp ||
        ak_eval(f->ctx, f->kv, &(ak_eval_args){.tokens = ids, .n = n, .logits = f->logits}, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "reference: %s", err.msg);
        return -1;
    }
    f->pos = n;
    ref_softmax(f);
    return 0;
}

/* Feeds token id (the next step's logits). */
static int ref_feed(ak_test_ctx *t, ref *f, int32_t id) {
    ak_error err = {{0}};
    if (ak_eval(f->ctx, f->kv, &(ak_eval_args){.tokens = &id, .n = 1, .pos0 = f->pos++, .logits = f->logits}, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "reference: %s", err.msg);
        return -1;
    }
    ref_softmax(f);
    return 0;
}

/* The reference's argmax (lowest id on ties). */
static int32_t ref_argmax(const ref *f) {
    int32_t b = 0;
    for (int32_t i = 1; i < f->vocab; i++)
        if (f->lp[i] > f->lp[b]) b = i;
    return b;
}

/* 1 when the entry's "bytes" are token id's bytes. */
static int bytes_are(const cJSON *e, const ak_tokenizer *tk, int32_t id) {
    const char *b;
    size_t n;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(e, "bytes");
    if (ak_token_bytes(tk, id, &b, &n) < 0 || cJSON_GetArraySize(arr) != (int)n) return 0;
    for (size_t i = 0; i < n; i++)
        if ((int)cJSON_GetArrayItem(arr, (int)i)->valuedouble != (unsigned char)b[i]) return 0;
    return 1;
}

/* The prompt's tokens as the server renders a user message (plain family). */
static int32_t *chat_prompt(const ak_tokenizer *tk, size_t *n) {
    ak_chat_msg m = {.role = "user", .content = PROMPT};
    ak_chat_opts o = {.family = AK_CHAT_PLAIN, .add_generation_prompt = 1};
    int32_t *ids = NULL;
    ak_error err = {{0}};
    return ak_chat_tokenize(&m, 1, &o, tk, AK_TOK_ADD_SPECIAL, &ids, n, &err) < 0 ? NULL : ids;
}

/* Checks chat logprobs content[] against the reference, greedy: each token
 * the argmax, its logprob and the 20 top within TOL, sorted. bias_ban >= 0:
 * that token was banned by logit_bias at the first step (the text took
 * another, the numbers stay the model's). */
static void check_content(ak_test_ctx *t, const rig *r, const cJSON *content, int32_t bias_ban) {
    size_t np;
    int32_t *ids = chat_prompt(r->tok, &np);
    REQUIRE(ids, "chat_tokenize");
    ref f = {0};
    if (ref_open(t, &f, r, ids, (int)np) < 0) { free(ids); ref_close(&f); return; }
    free(ids);
    int n = cJSON_GetArraySize(content), i = 0;
    CHECK(n >= 4, "%d entries", n);
    double maxd = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, content) {
        int32_t want = ref_argmax(&f);
        if (i == 0 && bias_ban >= 0) {
            CHECK(want == bias_ban, "the banned token is the model's argmax");
            /* the next best: what the banned sampler picks */
            long double best = -INFINITY;
            for (int32_t k = 0; k < f.vocab; k++)
                if (k != bias_ban && f.lp[k] > best) { best = f.lp[k]; want = k; }
        }
        CHECK(bytes_are(e, r->tok, want), "entry %d: not token %d's bytes", i, want);
        double d = fabs(num(e, "logprob") - (double)f.lp[want]);
        if (d > maxd) maxd = d;
        CHECK(d < TOL, "entry %d: logprob %g, reference %Lg", i, num(e, "logprob"), f.lp[want]);
        /* the 20 largest, sorted; the first the model's argmax */
        const cJSON *top = cJSON_GetObjectItemCaseSensitive(e, "top_logprobs");
        CHECK(cJSON_GetArraySize(top) == 20, "entry %d: %d top", i, cJSON_GetArraySize(top));
        long double sorted[20];
        char taken[1024] = {0};
        for (int k = 0; k < 20; k++) {   /* the reference's 20 largest, by selection */
            int32_t b = -1;
            for (int32_t x = 0; x < f.vocab; x++)
                if (!taken[x] && (b < 0 || f.lp[x] > f.lp[b])) b = x;
            taken[b] = 1;
            sorted[k] = f.lp[b];
        }
        double prev = 1, sum = 0;
        int k = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, top) {
            double v = num(x, "logprob");
            CHECK(v <= prev, "entry %d: top not sorted at %d", i, k);
            CHECK(fabs(v - (double)sorted[k]) < TOL, "entry %d top %d: %g, reference %Lg", i, k, v, sorted[k]);
            if (k == 0) CHECK(bytes_are(x, r->tok, ref_argmax(&f)), "entry %d: top[0] is not the argmax", i);
            if (k == 0 && bias_ban < 0) CHECK(!strcmp(str(x, "token"), str(e, "token")), "entry %d: greedy", i);
            prev = v;
            sum += exp(v);
            k++;
        }
        /* 20 of 512 tokens: their mass is below 1 and at least the chosen one's */
        CHECK(sum <= 1 + 1e-5 && sum >= exp(num(e, "logprob")) - 1e-6, "entry %d: top mass %g", i, sum);
        if (ref_feed(t, &f, want) < 0) break;
        i++;
    }
    printf("    %d tokens, max |logprob - reference| = %.3g\n", n, maxd);
    ref_close(&f);
}

/* POSTs body to path; fails the test unless it answers 200. */
static reply post_ok(ak_test_ctx *t, const rig *r, const char *path, const char *body) {
    reply x = http(r->port, "POST", path, body);
    CHECK(x.status == 200, "%s: %d %s", path, x.status, x.body ? x.body : "");
    return x;
}

#define CHAT_BODY(extra)                                                                                          \
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"" PROMPT "\"}],\"max_tokens\":12," \
    "\"temperature\":0,\"logprobs\":true,\"top_logprobs\":20" extra "}"

TEST(server_logprobs_chat_match_the_forward_pass) {
    rig r;
    if (rig_start(t, &r, "models/stories260K.gguf", 0, "lp-chat", AK_KV_F32, AK_KV_F32, N_CTX) < 0) return;
    reply x = post_ok(t, &r, "/v1/chat/completions", CHAT_BODY(""));
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(x.j, "choices"), 0);
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(c0, "logprobs");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(lp, "content");
    REQUIRE(cJSON_IsArray(content), "choices[0].logprobs.content: %s", x.body);
    check_content(t, &r, content, -1);
    /* the tokens' texts make the reply */
    char whole[4096] = "";
    const cJSON *e;
    cJSON_ArrayForEach(e, content) strncat(whole, str(e, "token"), sizeof whole - strlen(whole) - 1);
    CHECK(answer(&x) && !strcmp(whole, answer(&x)), "tokens '%s', reply '%s'", whole, answer(&x));

    /* streamed: each chunk's entries carry its text; all of them the whole answer's */
    reply s = post_ok(t, &r, "/v1/chat/completions", CHAT_BODY(",\"stream\":true"));
    cJSON *ev = sse_events(s.body);
    cJSON *all = cJSON_CreateArray();
    const cJSON *j;
    cJSON_ArrayForEach(j, ev) {
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(c, "delta");
        const cJSON *cl = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "logprobs"), "content");
        const char *text = str(d, "content");
        char carried[1024] = "";
        cJSON_ArrayForEach(e, cl) {
            strncat(carried, str(e, "token"), sizeof carried - strlen(carried) - 1);
            cJSON_AddItemToArray(all, cJSON_Duplicate(e, 1));
        }
        CHECK(!strcmp(carried, text ? text : ""), "a chunk's text '%s', its entries' '%s'", text ? text : "", carried);
    }
    CHECK(cJSON_Compare(all, content, 1), "streamed entries differ from the whole answer's");
    cJSON_Delete(all);
    cJSON_Delete(ev);
    reply_free(&s);

    /* the model's numbers, not the sampler's: ban the greedy first token */
    size_t np;
    int32_t *ids = chat_prompt(r.tok, &np);
    ref f = {0};
    int32_t ban = ids && ref_open(t, &f, &r, ids, (int)np) == 0 ? ref_argmax(&f) : 0;
    ref_close(&f);
    free(ids);
    char body[600];
    snprintf(body, sizeof body, CHAT_BODY(",\"logit_bias\":{\"%d\":-100}"), (int)ban);
    reply b = post_ok(t, &r, "/v1/chat/completions", body);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(b.j, "choices"), 0);
    check_content(t, &r, cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c0, "logprobs"), "content"),
                  ban);
    reply_free(&b);
    reply_free(&x);
    rig_stop(&r);
}

/* Completions' legacy shape: tokens, token_logprobs, top_logprobs dicts
 * (logprobs alternatives and the token itself), text_offset; a stop
 * string's cut drops the entries of the tokens past it. */
TEST(server_logprobs_completions_legacy_shape) {
    rig r;
    if (rig_start(t, &r, "models/stories260K.gguf", 0, "lp-legacy", AK_KV_F32, AK_KV_F32, N_CTX) < 0) return;
    const char *body = "{\"model\":\"m\",\"prompt\":\"" PROMPT "\",\"max_tokens\":16,\"temperature\":0,"
                       "\"logprobs\":3}";
    reply x = post_ok(t, &r, "/v1/completions", body);
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(x.j, "choices"), 0);
    const char *text = str(c0, "text");
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(c0, "logprobs");
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(lp, "tokens");
    const cJSON *lps = cJSON_GetObjectItemCaseSensitive(lp, "token_logprobs");
    const cJSON *tops = cJSON_GetObjectItemCaseSensitive(lp, "top_logprobs");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(lp, "text_offset");
    int n = cJSON_GetArraySize(toks);
    REQUIRE(text && n == 16 && cJSON_GetArraySize(lps) == n && cJSON_GetArraySize(tops) == n &&
                cJSON_GetArraySize(offs) == n, "legacy shape: %s", x.body);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const char *tok = cJSON_GetArrayItem(toks, i)->valuestring;
        const cJSON *d = cJSON_GetArrayItem(tops, i);
        double v = cJSON_GetArrayItem(lps, i)->valuedouble;
        /* stories260K's text is ASCII: characters are bytes */
        CHECK((size_t)cJSON_GetArrayItem(offs, i)->valuedouble == at, "text_offset[%d] %g, want %zu", i,
              cJSON_GetArrayItem(offs, i)->valuedouble, at);
        CHECK(!strncmp(text + at, tok, strlen(tok)), "token %d '%s' is not the text's at %zu", i, tok, at);
        at += strlen(tok);
        const cJSON *self = cJSON_GetObjectItemCaseSensitive(d, tok);
        CHECK(cJSON_GetArraySize(d) >= 3 && cJSON_GetArraySize(d) <= 4, "top_logprobs[%d]: %d", i, cJSON_GetArraySize(d));
        CHECK(self && fabs(self->valuedouble - v) < 1e-6, "top_logprobs[%d] lacks the token's own", i);
        double mx = -INFINITY;
        const cJSON *y;
        cJSON_ArrayForEach(y, d) if (y->valuedouble > mx) mx = y->valuedouble;
        CHECK(fabs(mx - v) < 1e-6, "greedy token %d is not its step's likeliest", i);
    }
    CHECK(at == strlen(text), "tokens cover %zu of %zu bytes", at, strlen(text));

    /* a stop string from the 6th token on: entries of tokens at or past it are dropped */
    size_t cut = (size_t)cJSON_GetArrayItem(offs, 5)->valuedouble;
    char stop[64];
    snprintf(stop, sizeof stop, "%.*s", (int)(strlen(text) - cut < 8 ? strlen(text) - cut : 8), text + cut);
    char *q = strchr(stop, '"');
    if (q) *q = 0;
    char sbody[512];
    snprintf(sbody, sizeof sbody, "{\"model\":\"m\",\"prompt\":\"" PROMPT "\",\"max_tokens\":16,"
             "\"temperature\":0,\"logprobs\":1,\"stop\":\"%s\"}", stop);
    reply s = post_ok(t, &r, "/v1/completions", sbody);
    const cJSON *sc = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(s.j, "choices"), 0);
    const cJSON *slp = cJSON_GetObjectItemCaseSensitive(sc, "logprobs");
    const char *stext = str(sc, "text");
    int sn = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(slp, "tokens"));
    CHECK(stext && strlen(stext) <= cut, "cut at '%s': text '%s'", stop, stext ? stext : "");
    CHECK(sn >= 1 && sn <= 5, "cut at '%s' (text '%s'): %d entries", stop, stext ? stext : "", sn);
    for (int i = 0; i < sn; i++)
        CHECK(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(slp, "text_offset"), i)->valuedouble <
                  (double)strlen(stext),
              "entry %d starts past the cut", i);
    reply_free(&s);

    /* streamed: the same arrays, concatenated */
    snprintf(sbody, sizeof sbody, "{\"model\":\"m\",\"prompt\":\"" PROMPT "\",\"max_tokens\":16,"
             "\"temperature\":0,\"logprobs\":3,\"stream\":true}");
    reply st = post_ok(t, &r, "/v1/completions", sbody);
    cJSON *ev = sse_events(st.body);
    cJSON *cat = cJSON_CreateObject();
    const char *names[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    for (int k = 0; k < 4; k++) cJSON_AddArrayToObject(cat, names[k]);
    const cJSON *j;
    cJSON_ArrayForEach(j, ev) {
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(c, "logprobs");
        for (int k = 0; l && !cJSON_IsNull(l) && k < 4; k++) {
            const cJSON *y;
            cJSON_ArrayForEach(y, cJSON_GetObjectItemCaseSensitive(l, names[k]))
                cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(cat, names[k]), cJSON_Duplicate(y, 1));
        }
    }
    CHECK(cJSON_Compare(cat, lp, 1), "streamed legacy logprobs differ from the whole answer's");
    cJSON_Delete(cat);
    cJSON_Delete(ev);
    reply_free(&st);
    reply_free(&x);
    rig_stop(&r);
}

TEST(server_logprobs_refusals) {
    rig r;
    if (rig_start(t, &r, "models/stories260K.gguf", 0, "lp-400", AK_KV_F32, AK_KV_F32, N_CTX) < 0) return;
    static const struct {
        const char *path, *body, *param, *code;
    } cases[] = {
        {"/v1/chat/completions", "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"top_logprobs\":3", "top_logprobs",
         "invalid_value"},
        {"/v1/chat/completions",
         "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true,\"top_logprobs\":21", "top_logprobs",
         "invalid_value"},
        {"/v1/chat/completions", "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":1", "logprobs",
         "invalid_type"},
        {"/v1/completions", "\"prompt\":\"hi\",\"logprobs\":6", "logprobs", "invalid_value"},
        {"/v1/completions", "\"prompt\":\"hi\",\"logprobs\":true", "logprobs", "invalid_type"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"model\":\"m\",%s}", cases[i].body);
        reply x = http(r.port, "POST", cases[i].path, body);
        const cJSON *err = cJSON_GetObjectItemCaseSensitive(x.j, "error");
        CHECK(x.status == 400 && !strcmp(err_code(&x), cases[i].code) && str(err, "param") &&
                  !strcmp(str(err, "param"), cases[i].param),
              "%s: %d %s", body, x.status, x.body ? x.body : "");
        reply_free(&x);
    }
    rig_stop(&r);
}
