/* test_jsonschema.c - JSON Schema to grammar (src/text/jsonschema.c,
 * grammar.c, regex.c): the official JSON Schema test suite (draft 2020-12,
 * read from AK_SHARED/json-schema-tests at run time) with counts per
 * keyword, hand-written Pydantic- and Zod-style schemas, the errors of
 * unsupported keywords and bad input, the shortest close, regexes and
 * number bounds against expectations worked out by hand. */
#include <dirent.h>
#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/buf.h"
#include "base/util.h"
#include "test.h"
#include "text/jsonschema.h"
#include "text/regex.h"

/* Whether g accepts text s whole. */
static int accepts(const ak_grammar *g, const char *s) {
    ak_gmatch *m = ak_gmatch_new(g);
    if (!m) return -1;
    int ok = ak_gmatch_feed(m, s, strlen(s)) == 0 && ak_gmatch_accepting(m);
    ak_gmatch_free(m);
    return ok;
}

static ak_grammar *compile_opts(const char *schema, int any_order, ak_gram_error *e) {
    ak_js_opts o = {.any_order = any_order};
    return ak_jsonschema_compile(schema, strlen(schema), &o, e);
}

/* Compact JSON of v as a validator sees it: numbers in the shortest text
 * that reads back the same (cJSON's own print rounds to 15 digits), the
 * rest as cJSON prints it. */
static void print_json(ak_buf *b, const cJSON *v) {
    if (cJSON_IsNumber(v)) {
        char t[64];
        double x = v->valuedouble;
        if (x == floor(x) && fabs(x) < 1e15) snprintf(t, sizeof t, "%.0f", x);
        else
            for (int p = 1; p <= 17; p++) {
                snprintf(t, sizeof t, "%.*g", p, x);
                if (strtod(t, NULL) == x) break;
            }
        ak_buf_append(b, t, strlen(t));
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        int obj = cJSON_IsObject(v);
        ak_buf_append(b, obj ? "{" : "[", 1);
        for (const cJSON *k = v->child; k; k = k->next) {
            if (k != v->child) ak_buf_append(b, ",", 1);
            if (obj) {
                cJSON *ks = cJSON_CreateString(k->string);
                char *kt = cJSON_PrintUnformatted(ks);
                ak_buf_append(b, kt, strlen(kt));
                ak_buf_append(b, ":", 1);
                free(kt);
                cJSON_Delete(ks);
            }
            print_json(b, k);
        }
        ak_buf_append(b, obj ? "}" : "]", 1);
    } else {
        char *t = cJSON_PrintUnformatted(v);
        ak_buf_append(b, t, strlen(t));
        free(t);
    }
}

/* The suite's files whose keyword is supported: every case that compiles
 * must be decided right. */
static const char *const supported_files[] = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
    "maxItems", "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "anyOf", "oneOf", "allOf", "ref", "defs", "boolean_schema", "default", "format", "content",
    "infinite-loop-detection", "anchor", NULL};
static const char *const unsupported_kw[] = {
    "not", "if", "then", "else", "patternProperties", "propertyNames", "minProperties", "maxProperties",
    "dependentRequired", "dependentSchemas", "dependencies", "contains", "minContains", "maxContains",
    "uniqueItems", "multipleOf", "unevaluatedItems", "unevaluatedProperties", "$dynamicRef", "$recursiveRef", NULL};

static int listed(const char *const *l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return 1;
    return 0;
}

TEST(jsonschema_official_suite) {
    char dir[1024];
    test_path(dir, sizeof dir, "json-schema-tests/draft2020-12");
    DIR *d = opendir(dir);
    if (!d) SKIP("no %s", dir);
    struct dirent *de;
    char *names[128];
    int nn = 0;
    while ((de = readdir(d)) && nn < 128)
        if (strstr(de->d_name, ".json")) names[nn++] = strdup(de->d_name);
    closedir(d);
    for (int i = 1; i < nn; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char *x = names[j]; names[j] = names[j - 1]; names[j - 1] = x;
        }
    long tot_pass = 0, tot_fail = 0, tot_unsup = 0;
    double t0 = ak_now(), compile_s = 0;
    int n_compiled = 0;
    for (int fi = 0; fi < nn; fi++) {
        char kw[128], path[1400];
        snprintf(kw, sizeof kw, "%s", names[fi]);
        *strstr(kw, ".json") = 0;
        snprintf(path, sizeof path, "%s/%s", dir, names[fi]);
        char *txt = ak_read_file(path, NULL, NULL);
        cJSON *doc = txt ? cJSON_Parse(txt) : NULL;
        free(txt);
        if (!doc) { CHECK(0, "cannot read %s", path); continue; }
        int pass = 0, fail = 0, unsup = 0, sup = listed(supported_files, kw);
        const cJSON *grp;
        cJSON_ArrayForEach(grp, doc) {
            ak_buf sb = {0};
            print_json(&sb, cJSON_GetObjectItem(grp, "schema"));
            ak_buf_append(&sb, "", 1);
            char *st = sb.p;
            ak_gram_error e = {0};
            double c0 = ak_now();
            ak_grammar *g = compile_opts(st, 1, &e);
            compile_s += ak_now() - c0;
            n_compiled++;
            const cJSON *tc;
            cJSON_ArrayForEach(tc, cJSON_GetObjectItem(grp, "tests")) {
                int valid = cJSON_IsTrue(cJSON_GetObjectItem(tc, "valid"));
                ak_buf b = {0};
                print_json(&b, cJSON_GetObjectItem(tc, "data"));
                ak_buf_append(&b, "", 1);
                if (!g && e.code == AK_GRAM_E_UNSATISFIABLE) {   /* no instance is valid */
                    if (!valid) pass++;
                    else {
                        fail++;
                        if (sup) CHECK(0, "%s / %s: compiled as unsatisfiable", kw, cJSON_GetObjectItem(grp, "description")->valuestring);
                    }
                } else if (!g) {
                    unsup++;
                    /* the error names a keyword the schema uses */
                    char quoted[80];
                    snprintf(quoted, sizeof quoted, "\"%s\"", e.keyword);
                    CHECK(e.keyword[0] && strstr(st, quoted), "%s: error names '%s', not in the schema (%s)", kw, e.keyword, e.msg);
                    if (listed(unsupported_kw, kw))
                        CHECK(e.code != AK_GRAM_E_UNSUPPORTED || listed(unsupported_kw, e.keyword) || !strcmp(e.keyword, "$ref") ||
                                  !strcmp(e.keyword, "oneOf"),
                              "%s: unsupported keyword error names '%s'", kw, e.keyword);
                } else if (accepts(g, (char *)b.p) == valid) pass++;
                else {
                    fail++;
                    if (strcmp(kw, "vocabulary"))   /* a metaschema's vocabularies are not read */
                        CHECK(0, "%s / %s / %s: %s %s", kw, cJSON_GetObjectItem(grp, "description")->valuestring,
                              cJSON_GetObjectItem(tc, "description")->valuestring, (char *)b.p, valid ? "rejected" : "accepted");
                }
                free(b.p);
            }
            ak_grammar_free(g);
            free(st);
        }
        printf("  suite %-28s %3d passed %3d failed %3d not compiled%s\n", kw, pass, fail, unsup, sup ? "" : "  (unsupported keyword)");
        tot_pass += pass;
        tot_fail += fail;
        tot_unsup += unsup;
        cJSON_Delete(doc);
        free(names[fi]);
    }
    printf("  suite total: %ld passed, %ld failed, %ld not compiled; %d schemas compiled in %.1f ms (%.3f ms each), run %.2f s\n",
           tot_pass, tot_fail, tot_unsup, n_compiled, compile_s * 1e3, compile_s * 1e3 / (n_compiled ? n_compiled : 1),
           ak_now() - t0);
}

/* ---- hand-written schemas --------------------------------------------------------- */

typedef struct { const char *s; int ok; } text_case;

/* Compiles schema and checks each case's text is accepted (ok 1) or not. */
static void check_cases(ak_test_ctx *t, const char *schema, const text_case *cases, size_t n) {
    ak_gram_error e = {0};
    ak_grammar *g = compile_opts(schema, 0, &e);
    REQUIRE(g, "compile: %s", e.msg);
    for (size_t i = 0; i < n; i++) CHECK(accepts(g, cases[i].s) == cases[i].ok, "%s: want %d", cases[i].s, cases[i].ok);
    ak_grammar_free(g);
}

/* As Pydantic v2 writes `class Pet(BaseModel): name: str; age: int | None = None;
 * owner: Owner | None = None; tags: list[str] = []` with Owner in $defs. */
static const char *pydantic_schema =
    "{\"$defs\":{\"Owner\":{\"properties\":{\"name\":{\"title\":\"Name\",\"type\":\"string\"},"
    "\"email\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}],\"default\":null,\"title\":\"Email\"}},"
    "\"required\":[\"name\"],\"title\":\"Owner\",\"type\":\"object\"}},"
    "\"properties\":{\"name\":{\"title\":\"Name\",\"type\":\"string\",\"maxLength\":10},"
    "\"age\":{\"anyOf\":[{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},{\"type\":\"null\"}],\"default\":null,\"title\":\"Age\"},"
    "\"owner\":{\"anyOf\":[{\"$ref\":\"#/$defs/Owner\"},{\"type\":\"null\"}],\"default\":null},"
    "\"tags\":{\"default\":[],\"items\":{\"type\":\"string\"},\"title\":\"Tags\",\"type\":\"array\"}},"
    "\"required\":[\"name\"],\"title\":\"Pet\",\"type\":\"object\"}";

TEST(jsonschema_pydantic_style) {
    static const text_case cases[] = {
        {"{\"name\":\"Rex\"}", 1},
        {"{\"name\":\"Rex\",\"age\":3}", 1},
        {"{\"name\":\"Rex\",\"age\":null,\"owner\":null,\"tags\":[]}", 1},
        {"{\"name\":\"Rex\",\"owner\":{\"name\":\"Ann\",\"email\":null},\"tags\":[\"a\",\"b\"]}", 1},
        {"{\"name\":\"Rex\",\"owner\":{\"name\":\"Ann\",\"email\":\"a@b.c\"}}", 1},
        {"{\"name\":\"Rex\",\"extra\":1}", 1},             /* additionalProperties not false: allowed after */
        {"{\"age\":3}", 0},                                /* name required */
        {"{\"name\":\"Rex\",\"age\":151}", 0},             /* maximum */
        {"{\"name\":\"Rex\",\"age\":-1}", 0},              /* minimum */
        {"{\"name\":\"Rex\",\"age\":2.5}", 0},             /* integer */
        {"{\"name\":\"Rexxxxxxxxx\"}", 0},                 /* 11 > maxLength 10 */
        {"{\"name\":\"Rex\",\"owner\":{\"email\":null}}", 0},   /* Owner.name required */
        {"{\"name\":\"Rex\",\"tags\":[1]}", 0},
        {"{\"age\":3,\"name\":\"Rex\"}", 0},               /* schema order in generation mode */
        {"{\"name\":\"Rex\",\"name\":\"Rex\"}", 0},        /* no duplicate keys */
        {"{\"name\":\"Rex\"", 0},
        {"{ \"name\":\"Rex\"}", 0},                        /* compact by default */
    };
    check_cases(t, pydantic_schema, cases, sizeof cases / sizeof cases[0]);
    /* any order and whitespace by option */
    ak_gram_error e = {0};
    ak_js_opts o = {.any_order = 1, .ws = AK_JS_WS_ANY};
    ak_grammar *g = ak_jsonschema_compile(pydantic_schema, strlen(pydantic_schema), &o, &e);
    REQUIRE(g, "compile: %s", e.msg);
    CHECK(accepts(g, "{\"age\":3,\"name\":\"Rex\"}") == 1, "any order");
    CHECK(accepts(g, "{\n  \"name\" : \"Rex\" ,\n  \"tags\" : [ \"a\" ]\n}") == 1, "whitespace");
    CHECK(accepts(g, "{\"name\":\"Rex\",\"name\":\"Rex\"}") == 0, "duplicate key in any order");
    ak_grammar_free(g);
}

/* As zod-to-json-schema writes z.object({kind: z.literal("circle"), r:
 * z.number().positive()}).strict() in a discriminated union with a square. */
static const char *zod_schema =
    "{\"$schema\":\"http://json-schema.org/draft-07/schema#\",\"type\":\"object\",\"properties\":{"
    "\"shape\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"type\":\"string\",\"const\":\"circle\"},"
    "\"r\":{\"type\":\"number\",\"exclusiveMinimum\":0}},\"required\":[\"kind\",\"r\"],\"additionalProperties\":false},"
    "{\"type\":\"object\",\"properties\":{\"kind\":{\"type\":\"string\",\"const\":\"square\"},\"side\":{\"type\":\"integer\"}},"
    "\"required\":[\"kind\",\"side\"],\"additionalProperties\":false}]},"
    "\"label\":{\"type\":\"string\",\"enum\":[\"a\",\"b\\\"c\"]},\"id\":{\"type\":\"string\",\"pattern\":\"^[a-z]{2}-\\\\d{3}$\"}},"
    "\"required\":[\"shape\",\"label\",\"id\"],\"additionalProperties\":false}";

TEST(jsonschema_zod_style) {
    static const text_case cases[] = {
        {"{\"shape\":{\"kind\":\"circle\",\"r\":0.5},\"label\":\"a\",\"id\":\"ab-123\"}", 1},
        {"{\"shape\":{\"kind\":\"square\",\"side\":2},\"label\":\"b\\\"c\",\"id\":\"zz-000\"}", 1},
        {"{\"shape\":{\"kind\":\"circle\",\"r\":0},\"label\":\"a\",\"id\":\"ab-123\"}", 0},      /* exclusiveMinimum */
        {"{\"shape\":{\"kind\":\"circle\",\"side\":2},\"label\":\"a\",\"id\":\"ab-123\"}", 0},   /* strict */
        {"{\"shape\":{\"kind\":\"square\",\"side\":2.5},\"label\":\"a\",\"id\":\"ab-123\"}", 0},
        {"{\"shape\":{\"kind\":\"circle\",\"r\":1},\"label\":\"c\",\"id\":\"ab-123\"}", 0},      /* enum */
        {"{\"shape\":{\"kind\":\"circle\",\"r\":1},\"label\":\"a\",\"id\":\"ab-1234\"}", 0},     /* pattern $ */
        {"{\"shape\":{\"kind\":\"circle\",\"r\":1},\"label\":\"a\",\"id\":\"Ab-123\"}", 0},
        {"{\"shape\":{\"kind\":\"circle\",\"r\":1},\"label\":\"a\",\"id\":\"ab-123\",\"x\":1}", 0},
    };
    check_cases(t, zod_schema, cases, sizeof cases / sizeof cases[0]);
}

TEST(jsonschema_oneof_exclusivity) {
    ak_gram_error e = {0};
    /* a discriminator (Pydantic's oneOf + discriminator): provably exclusive */
    const char *disc = "{\"oneOf\":[{\"$ref\":\"#/$defs/Cat\"},{\"$ref\":\"#/$defs/Dog\"}],\"discriminator\":{\"propertyName\":\"pet_type\"},"
                       "\"$defs\":{\"Cat\":{\"type\":\"object\",\"properties\":{\"pet_type\":{\"const\":\"cat\"},\"meows\":{\"type\":\"integer\"}},"
                       "\"required\":[\"pet_type\",\"meows\"]},\"Dog\":{\"type\":\"object\",\"properties\":{\"pet_type\":{\"enum\":[\"dog\"]},"
                       "\"barks\":{\"type\":\"number\"}},\"required\":[\"pet_type\",\"barks\"]}}}";
    ak_grammar *g = compile_opts(disc, 0, &e);
    REQUIRE(g, "discriminated oneOf: %s", e.msg);
    CHECK(accepts(g, "{\"pet_type\":\"cat\",\"meows\":3}") == 1, "cat");
    CHECK(accepts(g, "{\"pet_type\":\"dog\",\"barks\":1.5}") == 1, "dog");
    CHECK(accepts(g, "{\"pet_type\":\"cat\",\"barks\":1.5}") == 0, "cat without meows");
    ak_grammar_free(g);
    /* disjoint types */
    g = compile_opts("{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\"},{\"type\":\"null\"}]}", 0, &e);
    REQUIRE(g, "typed oneOf: %s", e.msg);
    CHECK(accepts(g, "\"x\"") == 1 && accepts(g, "7") == 1 && accepts(g, "null") == 1 && accepts(g, "1.5") == 0, "typed oneOf");
    ak_grammar_free(g);
    /* overlapping alternatives: refused, naming oneOf */
    g = compile_opts("{\"oneOf\":[{\"type\":\"integer\"},{\"minimum\":2}]}", 0, &e);
    CHECK(!g && e.code == AK_GRAM_E_UNSUPPORTED && !strcmp(e.keyword, "oneOf"), "overlapping oneOf: code %d kw %s", e.code, e.keyword);
    ak_grammar_free(g);
}

TEST(jsonschema_allof_refs_and_nesting) {
    ak_gram_error e = {0};
    const char *s = "{\"definitions\":{\"base\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"required\":[\"id\"]},"
                    "\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/node\"},\"maxItems\":2}},"
                    "\"required\":[\"v\"],\"additionalProperties\":false}},"
                    "\"allOf\":[{\"$ref\":\"#/definitions/base\"},{\"properties\":{\"tree\":{\"$ref\":\"#/definitions/node\"}},\"required\":[\"tree\"]}]}";
    ak_grammar *g = compile_opts(s, 0, &e);
    REQUIRE(g, "compile: %s", e.msg);
    CHECK(accepts(g, "{\"id\":1,\"tree\":{\"v\":1}}") == 1, "minimal");
    CHECK(accepts(g, "{\"id\":1,\"tree\":{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"v\":3,\"kids\":[{\"v\":4}]}]}}") == 1, "nested");
    CHECK(accepts(g, "{\"id\":1,\"tree\":{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3},{\"v\":4}]}}") == 0, "maxItems 2");
    CHECK(accepts(g, "{\"tree\":{\"v\":1}}") == 0, "id required through allOf");
    CHECK(accepts(g, "{\"id\":1,\"tree\":{\"v\":1,\"w\":2}}") == 0, "additionalProperties false inside");
    ak_grammar_free(g);
}

TEST(jsonschema_unsupported_keywords_are_named) {
    static const struct { const char *schema, *kw, *path; } cases[] = {
        {"{\"not\":{\"type\":\"string\"}}", "not", ""},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"multipleOf\":3}}}", "multipleOf", "/properties/a"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems", ""},
        {"{\"patternProperties\":{\"^x\":{}}}", "patternProperties", ""},
        {"{\"if\":{\"type\":\"string\"},\"then\":{\"minLength\":1}}", "if", ""},
        {"{\"items\":{\"contains\":{\"type\":\"null\"}}}", "contains", "/items"},
        {"{\"$ref\":\"http://example.com/other.json\"}", "$ref", ""},
        {"{\"type\":\"object\",\"minProperties\":2}", "minProperties", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ak_gram_error e = {0};
        ak_grammar *g = compile_opts(cases[i].schema, 0, &e);
        CHECK(!g && e.code == AK_GRAM_E_UNSUPPORTED && !strcmp(e.keyword, cases[i].kw) && !strcmp(e.path, cases[i].path),
              "%s: code %s keyword '%s' path '%s' (%s)", cases[i].schema, ak_gram_code_name(e.code), e.keyword, e.path, e.msg);
        CHECK(ak_gram_err_code(e.code) == AK_ERR_INVALID, "maps to invalid");
        ak_grammar_free(g);
    }
    /* annotations and value-free forms compile */
    const char *ann = "{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"$id\":\"x\",\"$comment\":\"c\",\"title\":\"T\","
                      "\"description\":\"d\",\"default\":1,\"examples\":[1],\"deprecated\":false,\"readOnly\":true,\"writeOnly\":false,"
                      "\"format\":\"date-time\",\"uniqueItems\":false,\"minProperties\":0,\"x-extra\":1,\"type\":\"string\"}";
    ak_gram_error e = {0};
    ak_grammar *g = compile_opts(ann, 0, &e);
    CHECK(g && accepts(g, "\"anything\"") == 1, "annotations: %s", e.msg);
    ak_grammar_free(g);
}

TEST(jsonschema_bad_input_is_bounded) {
    static const struct { const char *schema; int code; } cases[] = {
        {"{\"type\":", AK_GRAM_E_JSON},
        {"{\"type\":\"strin\"}", AK_GRAM_E_SCHEMA},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},\"required\":[\"a\"]}", AK_GRAM_E_UNSATISFIABLE},
        {"{\"$ref\":\"#\"}", AK_GRAM_E_UNSATISFIABLE},
        {"{\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}}}", AK_GRAM_E_UNSATISFIABLE},
        {"{\"$ref\":\"#/$defs/missing\"}", AK_GRAM_E_REF},
        {"{\"type\":\"string\",\"pattern\":\"(a|b)*a(a|b){24}\"}", AK_GRAM_E_TOO_LARGE},
        {"{\"type\":\"string\",\"pattern\":\"((a{100}){100}){100}\"}", AK_GRAM_E_TOO_LARGE},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", AK_GRAM_E_REGEX},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)\"}", AK_GRAM_E_REGEX},
        {"{\"type\":\"string\",\"maxLength\":100000000}", AK_GRAM_E_TOO_LARGE},
        {"{\"type\":\"array\",\"minItems\":100000000}", AK_GRAM_E_TOO_LARGE},
        {"{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", AK_GRAM_E_UNSATISFIABLE},
        {"false", AK_GRAM_E_UNSATISFIABLE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ak_gram_error e = {0};
        double t0 = ak_now();
        ak_grammar *g = compile_opts(cases[i].schema, 0, &e);
        double dt = ak_now() - t0;
        CHECK(!g && e.code == cases[i].code, "%s: code %s (%s), want %s", cases[i].schema, ak_gram_code_name(e.code), e.msg,
              ak_gram_code_name(cases[i].code));
        CHECK(dt < 3, "%s: %.2f s", cases[i].schema, dt);
        ak_grammar_free(g);
    }
    /* a huge enum, a schema nested 1000 deep, one nested 200 deep */
    ak_buf b = {0};
    ak_buf_append(&b, "{\"enum\":[", 9);
    for (int i = 0; i < 20000; i++) {
        char t[32];
        int n = snprintf(t, sizeof t, "%s%d", i ? "," : "", i);
        ak_buf_append(&b, t, (size_t)n);
    }
    ak_buf_append(&b, "]}", 3);
    ak_gram_error e = {0};
    ak_grammar *g = compile_opts((char *)b.p, 0, &e);
    CHECK(!g && e.code == AK_GRAM_E_TOO_LARGE && !strcmp(e.keyword, "enum"), "huge enum: %s", e.msg);
    ak_grammar_free(g);
    free(b.p);
    for (int depth = 200; depth <= 1000; depth += 800) {
        ak_buf d = {0};
        for (int i = 0; i < depth; i++) ak_buf_append(&d, "{\"items\":", 9);
        ak_buf_append(&d, "true", 4);
        for (int i = 0; i < depth; i++) ak_buf_append(&d, "}", 1);
        ak_buf_append(&d, "", 1);
        g = compile_opts((char *)d.p, 0, &e);
        CHECK(!g && e.code == AK_GRAM_E_DEPTH, "nested %d: %s", depth, e.msg);
        ak_grammar_free(g);
        free(d.p);
    }
}

TEST(jsonschema_shortest_close) {
    static const struct { const char *schema, *prefix, *closed; } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"]}", "",
         "{\"a\":\"\",\"b\":0}"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"]}", "{\"a\":\"hel",
         "{\"a\":\"hel\",\"b\":0}"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":2},\"minItems\":2}", "[\"x", "[\"x?\",\"??\"]"},
        {"{\"type\":\"integer\",\"minimum\":100}", "", "100"},
        {"{\"type\":\"string\",\"pattern\":\"^ab+c$\"}", "\"a", "\"abc\""},
        {"{\"type\":\"object\"}", "{\"k\":[{\"z\":[", "{\"k\":[{\"z\":[]}]}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ak_gram_error e = {0};
        ak_grammar *g = compile_opts(cases[i].schema, 0, &e);
        if (!g) { CHECK(0, "%s: %s", cases[i].schema, e.msg); continue; }
        ak_gmatch *m = ak_gmatch_new(g);
        CHECK(ak_gmatch_feed(m, cases[i].prefix, strlen(cases[i].prefix)) == 0, "prefix %s", cases[i].prefix);
        char out[256];
        long n = ak_gmatch_close_path(m, out, sizeof out);
        long want = (long)(strlen(cases[i].closed) - strlen(cases[i].prefix));
        CHECK(n == want && ak_gmatch_close_len(m) == want, "%s: close %ld bytes, want %ld", cases[i].prefix, n, want);
        /* the closed text: same length as the expected one, matching it
         * except where any character would do ('?') */
        char full[512];
        snprintf(full, sizeof full, "%s%.*s", cases[i].prefix, (int)(n > 0 ? n : 0), out);
        int same = strlen(full) == strlen(cases[i].closed);
        for (size_t k = 0; same && full[k]; k++) same = cases[i].closed[k] == '?' || cases[i].closed[k] == full[k];
        CHECK(same, "closed %s, want %s", full, cases[i].closed);
        CHECK(accepts(g, full) == 1, "closed text %s not accepted", full);
        ak_gmatch_free(m);
        ak_grammar_free(g);
    }
}

TEST(jsonschema_regex_subset) {
    static const struct { const char *re, *s; int ok; } cases[] = {
        {"^a.c$", "abc", 1}, {"^a.c$", "a\xC3\xA9" "c", 1}, {"^a.c$", "a\nc", 0}, {"^a.c$", "ac", 0},
        {"b", "abc", 1}, {"^b", "abc", 0}, {"c$", "abc", 1}, {"a$|^c", "cx", 1},
        {"^[^a-c]+$", "xyz", 1}, {"^[^a-c]+$", "xaz", 0}, {"^[^a-c]$", "\xE2\x82\xAC", 1},
        {"^\\d{3}-\\d{2,4}$", "123-45", 1}, {"^\\d{3}-\\d{2,4}$", "123-45678", 0},
        {"^(?:ab|cd)*$", "abcdab", 1}, {"^(?:ab|cd)*$", "abc", 0}, {"^\\w+@\\w+\\.com$", "me@x.com", 1},
        {"^\\s*$", " \t", 1}, {"^\\S$", " ", 0}, {"^x{2,}$", "xxx", 1}, {"^x{2,}$", "x", 0},
        {"^[\\-\\]]$", "]", 1}, {"^\\u00e9$", "\xC3\xA9", 1}, {"^a{,2}$", "a{,2}", 1}, {"^(?<n>a)b$", "ab", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ak_bdfa d = {0};
        ak_gram_error e = {0};
        if (ak_regex_compile(cases[i].re, strlen(cases[i].re), AK_RE_SEARCH, 4096, &d, &e) < 0) {
            CHECK(0, "%s: %s", cases[i].re, e.msg);
            continue;
        }
        CHECK(ak_bdfa_match(&d, cases[i].s, strlen(cases[i].s)) == cases[i].ok, "/%s/ on '%s': want %d", cases[i].re, cases[i].s, cases[i].ok);
        ak_bdfa_free(&d);
    }
}

/* Number bounds against the plain comparison, over integers and decimals. */
TEST(jsonschema_number_bounds) {
    static const char *const schemas[] = {
        "{\"type\":\"integer\",\"minimum\":-17,\"maximum\":203}",
        "{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":100}",
        "{\"type\":\"number\",\"minimum\":-2.5,\"exclusiveMaximum\":10.25}",
        "{\"type\":\"number\",\"exclusiveMinimum\":0.05}",
        "{\"type\":\"number\",\"maximum\":-0.5}",
        "{\"type\":\"number\",\"minimum\":0,\"maximum\":0}",
    };
    static const double lo[] = {-17, 0, -2.5, 0.05, -INFINITY, 0}, hi[] = {203, 100, 10.25, INFINITY, -0.5, 0};
    static const int lox[] = {0, 1, 0, 1, 0, 0}, hix[] = {0, 1, 1, 0, 0, 0}, isint[] = {1, 1, 0, 0, 0, 0};
    for (size_t k = 0; k < sizeof schemas / sizeof schemas[0]; k++) {
        ak_gram_error e = {0};
        ak_grammar *g = compile_opts(schemas[k], 0, &e);
        if (!g) { CHECK(0, "%s: %s", schemas[k], e.msg); continue; }
        int bad = 0;
        for (int i = -400; i <= 400 && bad < 3; i++)
            for (int f = 0; f < 4 && bad < 3; f++) {
                char num[64];
                static const char *const fr[] = {"", ".5", ".05", ".25"};
                snprintf(num, sizeof num, "%s%d%s", i < 0 ? "-" : "", i < 0 ? -i : i, fr[f]);
                double x = strtod(num, NULL);
                int want = (!isint[k] || !f) && (lox[k] ? x > lo[k] : x >= lo[k]) && (hix[k] ? x < hi[k] : x <= hi[k]);
                if (accepts(g, num) != want) { CHECK(0, "%s on %s: want %d", schemas[k], num, want); bad++; }
            }
        ak_grammar_free(g);
    }
}
