/* test_structured.c - constrained decoding in the generator (generate.h:
 * CONSTRAINED DECODING) on a real model: qwen3-tiny (random weights, the
 * GPT-2 vocabulary of 50257 tokens) run by the engine, its logits given to
 * a generator that carries a JSON-Schema constraint. Every output is
 * parsed with cJSON and checked against the schema's constraints by hand
 * (never by the grammar's own matcher): greedy and sampled, a generous
 * budget and budgets so tight that the close is forced (finish LENGTH, the
 * output still valid, at the fewest tokens exactly the shortest instance),
 * a lazy start after "</think>" and one begun by the caller. */
#include <cjson/cJSON.h>
#include <string.h>

#include "base/gguf.h"
#include "engine/model.h"
#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "text/generate.h"
#include "text/jsonschema.h"
#include "text/tokmask.h"
#include "test.h"

/* The schema as Pydantic writes a model with an optional nested one. */
static const char *schema =
    "{\"$defs\":{\"Contact\":{\"properties\":{\"email\":{\"pattern\":\"^[a-z]+@[a-z]+\\\\.com$\",\"title\":\"Email\","
    "\"type\":\"string\"}},\"required\":[\"email\"],\"title\":\"Contact\",\"type\":\"object\","
    "\"additionalProperties\":false}},"
    "\"properties\":{\"name\":{\"maxLength\":12,\"title\":\"Name\",\"type\":\"string\"},"
    "\"age\":{\"maximum\":120,\"minimum\":0,\"title\":\"Age\",\"type\":\"integer\"},"
    "\"tags\":{\"items\":{\"enum\":[\"red\",\"green\",\"blue\"],\"type\":\"string\"},\"maxItems\":3,\"title\":\"Tags\","
    "\"type\":\"array\"},"
    "\"contact\":{\"anyOf\":[{\"$ref\":\"#/$defs/Contact\"},{\"type\":\"null\"}],\"description\":\"how to reach them\"}},"
    "\"required\":[\"name\",\"age\",\"tags\",\"contact\"],\"title\":\"Person\",\"type\":\"object\","
    "\"additionalProperties\":false}";

/* The schema's shortest instance, written out by hand: "" for the
 * string, 0 for the integer, [] and null. */
static const char *shortest = "{\"name\":\"\",\"age\":0,\"tags\":[],\"contact\":null}";

/* Code points of valid UTF-8 s (continuation bytes not counted). */
static long utf8_chars(const char *s) {
    long n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* 1 when s matches ^[a-z]+@[a-z]+\.com$. */
static int email_ok(const char *s) {
    const char *at = strchr(s, '@');
    size_t n = strlen(s);
    if (!at || at == s || n < 5 || strcmp(s + n - 4, ".com")) return 0;
    for (const char *p = s; p < s + n - 4; p++)
        if (p != at && !(*p >= 'a' && *p <= 'z')) return 0;
    return s + n - 4 > at + 1;
}

/* Why text is not an instance of the schema, checked by hand; NULL when it is. */
static const char *person_invalid(const char *text) {
    static char why[160];
    cJSON *j = cJSON_Parse(text);
    const char *bad = NULL;
    if (!cJSON_IsObject(j)) bad = "not a JSON object";
    int n = 0;
    for (const cJSON *m = j ? j->child : NULL; m && !bad; m = m->next, n++)
        if (strcmp(m->string, "name") && strcmp(m->string, "age") && strcmp(m->string, "tags") &&
            strcmp(m->string, "contact"))
            bad = "a member the schema does not name";
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name"), *age = cJSON_GetObjectItemCaseSensitive(j, "age");
    const cJSON *tags = cJSON_GetObjectItemCaseSensitive(j, "tags");
    const cJSON *contact = cJSON_GetObjectItemCaseSensitive(j, "contact");
    if (bad) {
    } else if (n != 4 || !name || !age || !tags || !contact) bad = "a required member missing (or one twice)";
    else if (!cJSON_IsString(name) || utf8_chars(name->valuestring) > 12) bad = "name: not a string of <= 12 chars";
    else if (!cJSON_IsNumber(age) || age->valuedouble != (double)(long)age->valuedouble || age->valuedouble < 0 ||
             age->valuedouble > 120)
        bad = "age: not an integer in [0, 120]";
    else if (!cJSON_IsArray(tags) || cJSON_GetArraySize(tags) > 3) bad = "tags: not an array of <= 3";
    else if (!cJSON_IsNull(contact)) {
        const cJSON *email = cJSON_GetObjectItemCaseSensitive(contact, "email");
        if (!cJSON_IsObject(contact) || cJSON_GetArraySize(contact) != 1 || !cJSON_IsString(email) ||
            !email_ok(email->valuestring))
            bad = "contact: neither null nor {\"email\": a@b.com}";
    }
    for (const cJSON *x = cJSON_IsArray(tags) ? tags->child : NULL; x && !bad; x = x->next)
        if (!cJSON_IsString(x) || (strcmp(x->valuestring, "red") && strcmp(x->valuestring, "green") &&
                                   strcmp(x->valuestring, "blue")))
            bad = "tags: an element not in the enum";
    cJSON_Delete(j);
    if (!bad) return NULL;
    snprintf(why, sizeof why, "%s", bad);
    return why;
}

/* The model, its tokenizer, the vocabulary index and the compiled schema. */
typedef struct {
    ak_model *m;
    ak_tokenizer *tok;
    ak_ctx *ctx;
    ak_block_pool *pool;
    ak_vocab_index *v;
    ak_grammar *g;
    ak_tokmask *tm;
    float *logits;
} env;

static void env_close(env *e) {
    ak_tokmask_free(e->tm);
    ak_grammar_free(e->g);
    ak_vocab_index_free(e->v);
    ak_block_pool_free(e->pool);
    ak_ctx_free(e->ctx);
    ak_tokenizer_free(e->tok);
    ak_model_free(e->m);
    free(e->logits);
}

/* Opens qwen3-tiny with grammar text (NULL: any JSON object). */
static int env_open(ak_test_ctx *t, env *e, const char *text) {
    char path[600];
    ak_error err = {{0}};
    ak_gram_error ge = {0};
    memset(e, 0, sizeof *e);
    e->m = ak_model_load(test_path(path, sizeof path, "models/qwen3-tiny.gguf"), NULL, NULL, &err);
    if (e->m) e->tok = ak_tokenizer_load(&e->m->gguf, &err);
    if (e->tok) e->ctx = ak_ctx_new(e->m, 64, 2, &err);
    if (e->ctx) e->pool = ak_block_pool_new(&e->m->spec, 0, 0, &err);
    e->logits = e->m ? malloc(sizeof(float) * (size_t)e->m->cfg.vocab) : NULL;
    if (!e->pool || !e->logits) {
        ak_test_fail(t, __FILE__, __LINE__, "%s: %s", path, err.msg);
        return -1;
    }
    e->v = ak_vocab_index_new(e->tok, &ge);
    e->g = !e->v ? NULL : text ? ak_jsonschema_compile(text, strlen(text), NULL, &ge) : ak_json_object_grammar(NULL, &ge);
    e->tm = e->g ? ak_tokmask_new(e->g, e->v, &ge) : NULL;
    if (!e->tm) {
        ak_test_fail(t, __FILE__, __LINE__, "grammar: %s", ge.msg);
        return -1;
    }
    return 0;
}

/* One generation's settings and what it gave. */
typedef struct {
    ak_gen_constraint con;
    int greedy;
    uint64_t seed;
    int max_tokens;
    int begin_after;       /* > 0: ak_gen_constrain_begin after this many tokens */
    size_t begin_at;       /* the text's length then */
    /* out */
    char *text;            /* malloc'd */
    ak_gen_status end;
    int n_gen, forced;
} run;

/* Runs the model from a short prompt under r->con until the generator ends.
 * Returns 0, or -1 having failed the test. */
static int generate(ak_test_ctx *t, env *e, run *r) {
    ak_error err = {{0}};
    ak_sampler_params sp = ak_sampler_defaults();
    if (r->greedy) sp.temp = 0;
    sp.seed = r->seed;
    ak_sampler *smp = ak_sampler_new(&sp, e->m->cfg.vocab, &err);
    int32_t *prompt = NULL;
    size_t np = 0;
    const char *ptxt = "Describe a person as JSON:";
    int n_ctx = 512;
    ak_kv *kv = smp ? ak_kv_new(e->pool, AK_KV_F32, AK_KV_F32, n_ctx, &err) : NULL;
    ak_gen g = {0};
    int rc = -1;
    if (!kv || ak_tokenize(e->tok, ptxt, strlen(ptxt), AK_TOK_ADD_SPECIAL, &prompt, &np, &err) < 0 ||
        ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = prompt, .n = (int)np, .logits = e->logits}, &err) < 0 ||
        ak_gen_init(&g, &(ak_gen_opts){.tok = e->tok, .smp = smp, .prompt = prompt, .n_prompt = (int)np,
                                       .max_tokens = r->max_tokens, .n_ctx = n_ctx, .stop_at_eog = 1,
                                       .constraint = &r->con}, &err) < 0)
        goto done;
    int pos = (int)np;
    r->forced = 0;
    for (;;) {
        if (r->begin_after > 0 && g.n_gen == r->begin_after &&
            ak_gen_constrain_begin(&g, -1, NULL, 0, &err) < 0)
            goto done;
        if (g.n_gen == r->begin_after) r->begin_at = g.len;
        ak_gen_out o;
        ak_gen_status st = ak_gen_step(&g, e->logits, pos, &o, &err);
        r->forced += o.forced;
        if (st != AK_GEN_MORE) {
            r->end = st;
            break;
        }
        if (ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = &o.tok, .n = 1, .pos0 = pos, .logits = e->logits}, &err) < 0)
            goto done;
        pos++;
    }
    const char *fp;
    ak_gen_flush(&g, &fp);
    r->text = strdup(g.text);
    r->n_gen = g.n_gen;
    rc = r->end == AK_GEN_ERROR ? -1 : 0;
done:
    if (rc < 0) ak_test_fail(t, __FILE__, __LINE__, "generation: %s", err.msg);
    ak_gen_free(&g);
    ak_kv_free(kv);
    ak_sampler_free(smp);
    free(prompt);
    return rc;
}

TEST(structured_generation_valid_greedy_and_sampled) {
    env e;
    if (env_open(t, &e, schema) < 0) { env_close(&e); return; }
    ak_gen_constraint con = {.grammar = e.g, .masks = e.tm, .vocab = e.v, .rule = -1};
    long min = ak_gen_constraint_min_tokens(&con, e.tok);
    CHECK(min > 0 && min <= (long)strlen(shortest), "fewest tokens %ld for a %zu-byte shortest instance", min,
          strlen(shortest));
    int n_stop = 0;
    for (int i = 0; i < 9; i++) {
        run r = {.con = con, .greedy = i == 0, .seed = 1000 + (uint64_t)i, .max_tokens = 160};
        if (generate(t, &e, &r) < 0) break;
        const char *why = person_invalid(r.text);
        CHECK(!why, "run %d (%s): %s: %s", i, r.greedy ? "greedy" : "sampled", why, r.text);
        /* a grammar that finished ends STOP; a cut one LENGTH, at the budget */
        CHECK(r.end == AK_GEN_STOP || (r.end == AK_GEN_LENGTH && r.n_gen == r.max_tokens), "run %d: end %d after %d",
              i, r.end, r.n_gen);
        n_stop += r.end == AK_GEN_STOP;
        free(r.text);
    }
    printf("  %d of 9 runs finished the document on their own (the others were closed at the budget)\n", n_stop);
    env_close(&e);
}

TEST(structured_generation_cut_at_the_budget_still_parses) {
    env e;
    if (env_open(t, &e, schema) < 0) { env_close(&e); return; }
    ak_gen_constraint con = {.grammar = e.g, .masks = e.tm, .vocab = e.v, .rule = -1};
    long min = ak_gen_constraint_min_tokens(&con, e.tok);
    REQUIRE(min > 0, "no close plan");
    for (long extra = 0; extra <= 6; extra++)
        for (int greedy = 0; greedy < 2; greedy++) {
            run r = {.con = con, .greedy = greedy, .seed = 7 + (uint64_t)extra, .max_tokens = (int)(min + extra)};
            if (generate(t, &e, &r) < 0) { env_close(&e); return; }
            const char *why = person_invalid(r.text);
            CHECK(!why, "max_tokens %ld (%s): %s: %s", min + extra, greedy ? "greedy" : "sampled", why, r.text);
            CHECK(r.n_gen <= r.max_tokens, "%d tokens past max_tokens %d", r.n_gen, r.max_tokens);
            if (extra == 0) {
                /* no room for anything but the shortest close from the start */
                CHECK(r.end == AK_GEN_LENGTH && r.forced == r.n_gen, "max_tokens = fewest: end %d, %d of %d forced",
                      r.end, r.forced, r.n_gen);
                CHECK(!strcmp(r.text, shortest), "the fewest tokens gave %s, not %s", r.text, shortest);
            } else {
                CHECK(r.end == AK_GEN_STOP || r.end == AK_GEN_LENGTH, "end %d", r.end);
                CHECK(r.end == AK_GEN_STOP || r.forced > 0, "cut without a forced close");
            }
            free(r.text);
        }
    env_close(&e);
}

/* The text after the first "</think>" of r's output, checked; the text
 * before it must not hold an end of the free part. */
TEST(structured_generation_lazy_after_think) {
    env e;
    if (env_open(t, &e, schema) < 0) { env_close(&e); return; }
    ak_gen_constraint con = {.grammar = e.g, .masks = e.tm, .vocab = e.v, .rule = -1, .lazy = 1, .after = "</think>",
                             .required = 1};
    long min = ak_gen_constraint_min_tokens(&con, e.tok);
    ak_gen_constraint held = {.grammar = e.g, .masks = e.tm, .vocab = e.v, .rule = -1};
    long min_held = ak_gen_constraint_min_tokens(&held, e.tok);
    /* "</think>" in GPT-2's BPE: "</", "think", ">" */
    CHECK(min == min_held + 3, "lazy and required: %ld fewest tokens, held %ld", min, min_held);
    long budgets[] = {min, min + 2, 40, 120};
    for (int i = 0; i < 4; i++)
        for (int greedy = 0; greedy < 2; greedy++) {
            run r = {.con = con, .greedy = greedy, .seed = 31 + (uint64_t)i, .max_tokens = (int)budgets[i]};
            if (generate(t, &e, &r) < 0) { env_close(&e); return; }
            const char *at = strstr(r.text, "</think>");
            CHECK(at, "budget %ld: no </think> in %s", budgets[i], r.text);
            const char *why = at ? person_invalid(at + 8) : "";
            CHECK(!why, "budget %ld (%s): %s: %s", budgets[i], greedy ? "greedy" : "sampled", why, r.text);
            CHECK(r.end == AK_GEN_STOP || r.end == AK_GEN_LENGTH, "end %d", r.end);
            if (i == 0) CHECK(r.end == AK_GEN_LENGTH && r.forced == r.n_gen, "fewest: %d of %d forced", r.forced, r.n_gen);
            free(r.text);
        }
    env_close(&e);
}

TEST(structured_generation_begun_by_the_caller) {
    env e;
    if (env_open(t, &e, NULL) < 0) { env_close(&e); return; }
    /* lazy without after: free until ak_gen_constrain_begin (tool calls) */
    ak_gen_constraint con = {.grammar = e.g, .masks = e.tm, .vocab = e.v, .rule = -1, .lazy = 1};
    CHECK(ak_gen_constraint_min_tokens(&con, e.tok) == 0, "a lazy constraint that may never begin needs no tokens");
    for (int greedy = 0; greedy < 2; greedy++) {
        run r = {.con = con, .greedy = greedy, .seed = 5, .max_tokens = 80, .begin_after = 6};
        if (generate(t, &e, &r) < 0) break;
        /* the free part: the first 6 tokens' text (and any bytes the
         * detokenizer held then); the object after it */
        const char *obj = strchr(r.text + r.begin_at, '{');
        cJSON *j = obj ? cJSON_Parse(obj) : NULL;
        CHECK(r.n_gen > 6 && cJSON_IsObject(j), "%s: no JSON object after the free part: %s",
              greedy ? "greedy" : "sampled", r.text);
        cJSON_Delete(j);
        free(r.text);
    }
    env_close(&e);
}

/* ---- the server: response_format over HTTP (qwen3-tiny, in process) ---- */

#include <pthread.h>

#include "serve/grammars.h"
#include "server_rig.h"

/* A chat request with response_format rf (JSON text; NULL: none), greedy
 * when temp is 0. */
static reply chat_rf(int port, const char *rf, int max_tokens, double temp, int seed) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", "m");
    cJSON_AddItemToObject(j, "messages", cJSON_Parse("[{\"role\":\"user\",\"content\":\"Who is Ann? Answer in JSON.\"}]"));
    if (rf) cJSON_AddItemToObject(j, "response_format", cJSON_Parse(rf));
    if (max_tokens) cJSON_AddNumberToObject(j, "max_tokens", max_tokens);
    cJSON_AddNumberToObject(j, "temperature", temp);
    cJSON_AddNumberToObject(j, "seed", seed);
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    reply r = http(port, "POST", "/v1/chat/completions", body);
    free(body);
    return r;
}

/* response_format json_schema of schema text s. */
static char *rf_schema(const char *s) {
    size_t n = strlen(s) + 128;
    char *rf = malloc(n);
    if (rf) snprintf(rf, n, "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"person\",\"strict\":true,\"schema\":%s}}", s);
    return rf;
}

static const char *finish_of(const reply *r) {
    return str(cJSON_GetArrayItem(cJSON_GetObjectItem(r->j, "choices"), 0), "finish_reason");
}

/* The fewest tokens of a reply under schema over tok (after "</think>"'s when lazy). */
static long fewest(const ak_tokenizer *tok, const char *text, const char *after) {
    ak_gram_error ge = {0};
    ak_vocab_index *v = ak_vocab_index_new(tok, &ge);
    ak_grammar *g = v ? ak_jsonschema_compile(text, strlen(text), NULL, &ge) : NULL;
    ak_tokmask *tm = g ? ak_tokmask_new(g, v, &ge) : NULL;
    ak_gen_constraint c = {.grammar = g, .masks = tm, .vocab = v, .rule = -1, .lazy = after != NULL, .after = after,
                           .required = 1};
    long n = tm ? ak_gen_constraint_min_tokens(&c, tok) : -1;
    ak_tokmask_free(tm);
    ak_grammar_free(g);
    ak_vocab_index_free(v);
    return n;
}

typedef struct {
    int port, schema;   /* schema: with the response format */
    int seed;
    reply r;
} conc_req;

static void *conc_run(void *p) {
    conc_req *q = p;
    char *rf = q->schema ? rf_schema(schema) : NULL;
    q->r = chat_rf(q->port, rf, 120, 1.0, q->seed);
    free(rf);
    return NULL;
}

TEST(structured_server_response_format) {
    rig r;
    const rig_opts o = {.model = "models/qwen3-tiny.gguf", .mem = "structured", .fk = AK_KV_F32, .fv = AK_KV_F32,
                        .n_ctx = 1024, .family = AK_CHAT_CHATML};
    if (rig_start_opts(t, &r, &o) < 0) return;
    char *rf = rf_schema(schema);
    REQUIRE(rf, "oom");
    /* greedy, then sampled: a reply that validates by hand */
    for (int i = 0; i < 3; i++) {
        reply a = chat_rf(r.port, rf, 150, i ? 1.0 : 0, i);
        const char *c = answer(&a), *why = c ? person_invalid(c) : "no content";
        CHECK(a.status == 200 && !why, "run %d: %d %s: %s", i, a.status, why ? why : "", a.body ? a.body : "");
        const char *f = finish_of(&a);
        CHECK(f && (!strcmp(f, "stop") || !strcmp(f, "length")), "finish %s", f ? f : "none");
        reply_free(&a);
    }
    /* the fewest tokens: the close forced from the start, finish length; one fewer: 400 up front */
    long min = fewest(r.tok, schema, NULL);
    REQUIRE(min > 0, "no close plan");
    reply a = chat_rf(r.port, rf, (int)min, 1.0, 9);
    CHECK(a.status == 200 && answer(&a) && !strcmp(answer(&a), shortest) && finish_of(&a) &&
          !strcmp(finish_of(&a), "length"), "max_tokens %ld: %s", min, a.body ? a.body : "");
    reply_free(&a);
    a = chat_rf(r.port, rf, (int)min - 1, 1.0, 9);
    CHECK(a.status == 400 && !strcmp(err_code(&a), "invalid_value") &&
          !strcmp(str(cJSON_GetObjectItem(a.j, "error"), "param"), "max_tokens"), "max_tokens %ld: %d %s", min - 1,
          a.status, a.body ? a.body : "");
    reply_free(&a);
    /* any object */
    a = chat_rf(r.port, "{\"type\":\"json_object\"}", 60, 1.0, 4);
    cJSON *obj = answer(&a) ? cJSON_Parse(answer(&a)) : NULL;
    CHECK(a.status == 200 && cJSON_IsObject(obj), "json_object: %d %s", a.status, a.body ? a.body : "");
    cJSON_Delete(obj);
    reply_free(&a);
    free(rf);
    /* refusals: 400 naming what is wrong */
    static const struct {
        const char *rf, *param, *code, *says;
    } bad[] = {
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"object\",\"properties\":"
         "{\"a\":{\"type\":\"string\",\"not\":{\"const\":\"b\"}}}}}}",
         "response_format.json_schema.schema", "unsupported_schema_keyword", "'not' at '/properties/a'"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"array\",\"uniqueItems\":true}}}",
         "response_format.json_schema.schema", "unsupported_schema_keyword", "'uniqueItems'"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"object\",\"properties\":5}}}",
         "response_format.json_schema.schema", "invalid_schema", "properties"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"$ref\":\"#/$defs/nope\"}}}",
         "response_format.json_schema.schema", "invalid_schema", "nope"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":\"object\"}}",
         "response_format.json_schema.schema", "invalid_type", "schema"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{}}}", "response_format.json_schema.name",
         "missing_required_parameter", "name"},
        {"{\"type\":\"json_schema\"}", "response_format.json_schema", "missing_required_parameter", "json_schema"},
        {"{\"type\":\"yaml\"}", "response_format.type", "invalid_value", "json_schema"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        a = chat_rf(r.port, bad[i].rf, 50, 0, 0);
        const char *param = str(cJSON_GetObjectItem(a.j, "error"), "param");
        CHECK(a.status == 400 && param && !strcmp(param, bad[i].param) && !strcmp(err_code(&a), bad[i].code) &&
              strstr(err_msg(&a), bad[i].says), "case %zu: %d %s", i, a.status, a.body ? a.body : "");
        reply_free(&a);
    }
    /* constrained and free requests at once, batched together */
    conc_req q[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        q[i] = (conc_req){.port = r.port, .schema = i % 2 == 0, .seed = 20 + i};
        pthread_create(&th[i], NULL, conc_run, &q[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        const char *c = answer(&q[i].r), *why = c && q[i].schema ? person_invalid(c) : NULL;
        CHECK(q[i].r.status == 200 && c && !why, "concurrent %d (%s): %s %s", i, q[i].schema ? "schema" : "free",
              why ? why : "", q[i].r.body ? q[i].r.body : "");
        reply_free(&q[i].r);
    }
    rig_stop(&r);
}

TEST(structured_server_after_reasoning) {
    rig r;
    /* qwen3 writes its reasoning first: the schema holds after "</think>" */
    const rig_opts o = {.model = "models/qwen3-tiny.gguf", .mem = "structured-think", .fk = AK_KV_F32, .fv = AK_KV_F32,
                        .n_ctx = 1024, .family = AK_CHAT_QWEN3};
    if (rig_start_opts(t, &r, &o) < 0) return;
    char *rf = rf_schema(schema);
    long min = fewest(r.tok, schema, "</think>");
    REQUIRE(rf && min > 0, "setup");
    int budgets[] = {(int)min, 60, 200};
    for (int i = 0; i < 3; i++) {
        reply a = chat_rf(r.port, rf, budgets[i], 1.0, 40 + i);
        /* the JSON follows "</think>"; where the server gives the reasoning
         * apart (reasoning_content) the content is the JSON alone */
        const char *c = answer(&a), *at = c ? strstr(c, "</think>") : NULL;
        const char *why = c ? person_invalid(at ? at + 8 : c) : "no content";
        CHECK(a.status == 200 && !why, "max_tokens %d: %s: %s", budgets[i], why ? why : "", a.body ? a.body : "");
        if (i == 0) CHECK(finish_of(&a) && !strcmp(finish_of(&a), "length"), "fewest: finish %s", a.body ? a.body : "");
        reply_free(&a);
    }
    reply a = chat_rf(r.port, rf, (int)min - 1, 1.0, 1);
    CHECK(a.status == 400, "max_tokens below the fewest with </think>: %d", a.status);
    reply_free(&a);
    free(rf);
    rig_stop(&r);
}

/* ---- the server's cache of compiled schemas ---- */

typedef struct {
    ak_grammars *c;
    const char *text;
    ak_grammar_ref *ref;
    int rc;
} get_req;

static void *get_run(void *p) {
    get_req *q = p;
    ak_gram_error ge = {0};
    q->rc = ak_grammars_get(q->c, AK_GRAMMAR_JSON_SCHEMA, q->text, strlen(q->text), &q->ref, &ge);
    return NULL;
}

TEST(structured_grammar_cache_once_per_schema_lru) {
    char path[600];
    gguf_file f;
    ak_error err = {{0}};
    REQUIRE(gguf_open(&f, test_path(path, sizeof path, "models/stories260K.gguf"), &err) == 0, "%s", err.msg);
    ak_tokenizer *tok = ak_tokenizer_load(&f, &err);
    gguf_close(&f);
    REQUIRE(tok, "%s", err.msg);
    ak_grammars *c = ak_grammars_new(tok, 2, 0, &err);
    REQUIRE(c, "%s", err.msg);
    /* four callers of one schema at once: one build, the same entry */
    get_req q[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        q[i] = (get_req){.c = c, .text = schema};
        pthread_create(&th[i], NULL, get_run, &q[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    ak_grammars_stats st;
    ak_grammars_get_stats(c, &st);
    CHECK(st.builds == 1 && st.hits == 3 && st.entries == 1, "builds %llu hits %llu entries %d",
          (unsigned long long)st.builds, (unsigned long long)st.hits, st.entries);
    for (int i = 0; i < 4; i++) CHECK(q[i].rc == 0 && q[i].ref == q[0].ref, "caller %d: rc %d", i, q[i].rc);
    for (int i = 1; i < 4; i++) ak_grammar_ref_release(q[i].ref);
    /* two more schemas: the first, least recently used, is dropped from the cache but lives while held */
    ak_gram_error ge = {0};
    ak_grammar_ref *b = NULL, *d = NULL, *again = NULL;
    CHECK(ak_grammars_get(c, AK_GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\"}", 18, &b, &ge) == 0, "%s", ge.msg);
    CHECK(ak_grammars_get(c, AK_GRAMMAR_JSON_OBJECT, "", 0, &d, &ge) == 0, "%s", ge.msg);
    ak_grammars_get_stats(c, &st);
    CHECK(st.entries == 2 && st.evictions == 1, "entries %d evictions %llu", st.entries, (unsigned long long)st.evictions);
    ak_gmatch *m = ak_gmatch_new(ak_grammar_ref_grammar(q[0].ref));
    CHECK(m && ak_gmatch_feed(m, shortest, strlen(shortest)) == 0 && ak_gmatch_finished(m), "the evicted entry's grammar");
    ak_gmatch_free(m);
    /* a failed compile is not kept, and says why */
    CHECK(ak_grammars_get(c, AK_GRAMMAR_JSON_SCHEMA, "{\"not\":{}}", 10, &again, &ge) < 0 &&
          ge.code == AK_GRAM_E_UNSUPPORTED && !strcmp(ge.keyword, "not"), "unsupported: %d %s", ge.code, ge.keyword);
    ak_grammars_get_stats(c, &st);
    CHECK(st.entries == 2, "a failed compile kept (%d entries)", st.entries);
    /* the cache freed first: the held entries outlive it */
    ak_grammars_free(c);
    ak_grammar_ref_release(b);
    ak_grammar_ref_release(d);
    ak_grammar_ref_release(q[0].ref);
    ak_tokenizer_free(tok);
}
