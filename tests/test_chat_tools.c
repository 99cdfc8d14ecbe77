/* test_chat_tools.c - tools, tool calls, tool results and thinking rendered
 * natively (chat.h), compared byte for byte with the models' real templates
 * rendered by Jinja the way model servers do (tests/chat_ref.py over the
 * conversations of tests/data/chat_tools.json, the templates read from
 * ../shared/templates); JSON printed as Python's json module prints it
 * (pyjson.h, against python3 itself); the documented format without a
 * template; the errors. */
#include <string.h>

#include <cjson/cJSON.h>

#include "text/chat.h"
#include "text/pyjson.h"
#include "test.h"

#define SUITE "tests/data/chat_tools.json"

/* Runs cmd through the shell and returns its whole stdout (malloc'd), or
 * NULL when it cannot run or exits non-zero. */
static char *run_capture(const char *cmd) {
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    ak_buf b = {0};
    char chunk[4096];
    size_t k;
    while ((k = fread(chunk, 1, sizeof chunk, p)) > 0) ak_buf_append(&b, chunk, k);
    int rc = pclose(p);
    if (rc != 0 || b.failed) {
        ak_buf_free(&b);
        return NULL;
    }
    return b.p ? ak_buf_take(&b) : strdup("");
}

/* 1 when python3 with Jinja2 can run the reference renderer. */
static int have_jinja(void) {
    return system("python3 -c 'import jinja2' >/dev/null 2>&1") == 0;
}

/* The line of the reference output (JSONL) for the case named name, or NULL. */
static cJSON *find_line(cJSON *const *lines, int n, const char *name) {
    for (int i = 0; i < n; i++) {
        const char *ln = cJSON_GetStringValue(cJSON_GetObjectItem(lines[i], "name"));
        if (ln && !strcmp(ln, name)) return lines[i];
    }
    return NULL;
}

/* A conversation and tools of the suite as chat.h takes them; the strings
 * point into the cJSON tree, the parameters are printed (owned). */
typedef struct {
    ak_chat_msg m[32];
    ak_chat_call calls[32][4];
    int n;
    ak_chat_tool tools[8];
    char *params[8];
    int n_tools;
} conv;

static void conv_free(conv *c) {
    for (int i = 0; i < c->n_tools; i++) free(c->params[i]);
}

/* Fills c from the suite's messages and tools (may be NULL). Returns 0, or
 * -1 when they do not fit. */
static int conv_from_json(conv *c, const cJSON *msgs, const cJSON *tools) {
    memset(c, 0, sizeof *c);
    const cJSON *e;
    cJSON_ArrayForEach(e, msgs) {
        if (c->n == 32) return -1;
        ak_chat_msg *m = &c->m[c->n];
        m->role = cJSON_GetStringValue(cJSON_GetObjectItem(e, "role"));
        m->content = cJSON_GetStringValue(cJSON_GetObjectItem(e, "content"));
        m->reasoning = cJSON_GetStringValue(cJSON_GetObjectItem(e, "reasoning_content"));
        m->tool_call_id = cJSON_GetStringValue(cJSON_GetObjectItem(e, "tool_call_id"));
        const cJSON *k;
        cJSON_ArrayForEach(k, cJSON_GetObjectItem(e, "tool_calls")) {
            if (m->n_calls == 4) return -1;
            const cJSON *f = cJSON_GetObjectItem(k, "function");
            c->calls[c->n][m->n_calls++] = (ak_chat_call){
                .id = cJSON_GetStringValue(cJSON_GetObjectItem(k, "id")),
                .name = cJSON_GetStringValue(cJSON_GetObjectItem(f, "name")),
                .arguments = cJSON_GetStringValue(cJSON_GetObjectItem(f, "arguments"))};
        }
        if (m->n_calls) m->calls = c->calls[c->n];
        c->n++;
    }
    cJSON_ArrayForEach(e, tools) {
        if (c->n_tools == 8) return -1;
        const cJSON *f = cJSON_GetObjectItem(e, "function"), *p = cJSON_GetObjectItem(f, "parameters"),
                    *s = cJSON_GetObjectItem(f, "strict");
        int i = c->n_tools++;
        c->params[i] = p ? cJSON_PrintUnformatted(p) : NULL;
        c->tools[i] = (ak_chat_tool){.name = cJSON_GetStringValue(cJSON_GetObjectItem(f, "name")),
                                     .description = cJSON_GetStringValue(cJSON_GetObjectItem(f, "description")),
                                     .parameters = c->params[i],
                                     .strict = cJSON_IsTrue(s) ? 1 : cJSON_IsFalse(s) ? -1 : 0};
    }
    return 0;
}

/* Reports the first difference of got and want; 1 when equal. */
static int same(ak_test_ctx *t, const char *label, const char *got, const char *want) {
    if (!strcmp(got, want)) return 1;
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    ak_test_fail(t, __FILE__, __LINE__, "%s: differs at byte %zu\n--- got:\n%s\n--- want:\n%s", label, i, got, want);
    return 0;
}

TEST(chat_tools_match_the_real_templates) {
    if (!have_jinja()) SKIP("python3 with jinja2 is not installed (Debian: python3-jinja2)");
    char cmd[1024], path[1024];
    snprintf(cmd, sizeof cmd, "python3 tests/chat_ref.py %s < " SUITE, test_path(path, sizeof path, "templates"));
    char *ref = run_capture(cmd);
    REQUIRE(ref, "the reference renderer failed: %s", cmd);
    ak_error err = {0};
    size_t len;
    char *suite_text = ak_read_file(SUITE, &len, &err);
    REQUIRE(suite_text, "%s", err.msg);
    cJSON *suite = cJSON_Parse(suite_text);
    REQUIRE(suite, "%s is not JSON", SUITE);
    cJSON *lines[256];
    int n_lines = 0;
    char *save = NULL;
    for (char *l = strtok_r(ref, "\n", &save); l && n_lines < 256; l = strtok_r(NULL, "\n", &save))
        if ((lines[n_lines] = cJSON_Parse(l)) != NULL) n_lines++;
    int pass = 0, total = 0;
    const cJSON *cs;
    cJSON_ArrayForEach(cs, cJSON_GetObjectItem(suite, "cases")) {
        total++;
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(cs, "name"));
        const char *file = cJSON_GetStringValue(cJSON_GetObjectItem(cs, "template"));
        const char *as = cJSON_GetStringValue(cJSON_GetObjectItem(cs, "native_as"));
        cJSON *line = find_line(lines, n_lines, as ? as : name);
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(line, "rendered"));
        if (!want) {
            CHECK(0, "%s: no reference render (%s)", name,
                  line ? cJSON_GetStringValue(cJSON_GetObjectItem(line, "error")) : "missing");
            continue;
        }
        char rel[256];
        snprintf(rel, sizeof rel, "templates/%s", file);
        char *tmpl = ak_read_file(test_path(path, sizeof path, rel), &len, &err);
        if (!tmpl) {
            CHECK(0, "%s: %s", name, err.msg);
            continue;
        }
        const cJSON *tools_name = cJSON_GetObjectItem(cs, "tools");
        conv c;
        if (conv_from_json(&c, cJSON_GetObjectItem(cJSON_GetObjectItem(suite, "conversations"),
                                                   cJSON_GetStringValue(cJSON_GetObjectItem(cs, "conversation"))),
                           tools_name ? cJSON_GetObjectItem(cJSON_GetObjectItem(suite, "tools"),
                                                            cJSON_GetStringValue(tools_name))
                                      : NULL) < 0) {
            CHECK(0, "%s: conversation too long for the test", name);
            conv_free(&c);
            free(tmpl);
            continue;
        }
        const cJSON *kw = cJSON_GetObjectItem(cJSON_GetObjectItem(cs, "kwargs"), "enable_thinking");
        const cJSON *gen = cJSON_GetObjectItem(cs, "add_generation_prompt");
        ak_chat_opts o = {.family = ak_chat_detect(tmpl), .template_text = tmpl,
                          .add_generation_prompt = gen ? cJSON_IsTrue(gen) : 1,
                          .bos = cJSON_GetStringValue(cJSON_GetObjectItem(cs, "bos_token")),
                          .eos = cJSON_GetStringValue(cJSON_GetObjectItem(cs, "eos_token")),
                          .tools = c.tools, .n_tools = c.n_tools,
                          .think = cJSON_IsTrue(kw) ? AK_CHAT_THINK_ON : cJSON_IsFalse(kw) ? AK_CHAT_THINK_OFF
                                                                                          : AK_CHAT_THINK_DEFAULT};
        char *got = NULL;
        if (ak_chat_render(c.m, c.n, &o, &got, &err) < 0) CHECK(0, "%s: %s", name, err.msg);
        else if (same(t, name, got, want)) pass++;
        free(got);
        conv_free(&c);
        free(tmpl);
    }
    printf("  chat tools: %d/%d conversations render as their templates do\n", pass, total);
    CHECK(total >= 40, "only %d cases in %s", total, SUITE);
    for (int i = 0; i < n_lines; i++) cJSON_Delete(lines[i]);
    cJSON_Delete(suite);
    free(suite_text);
    free(ref);
}

TEST(chat_tools_json_printed_as_python_does) {
    if (system("python3 -c 'import json' >/dev/null 2>&1") != 0) SKIP("python3 is not installed");
    static const char *const inputs[] = {
        "{}", "[]", " {\"a\" : 1 , \"b\":[true,false,null]} ", "{\"b\": 1, \"a\": {\"c\": [1, {\"d\": []}]}}",
        "\"caf\\u00e9 \\ud83d\\ude00 \\u0000\\u001f\\u007f / \\/ <&> \\\" \\\\ \\b\\f\\n\\r\\t\"",
        "[0, -0, 1, -1, 12345678901234567890123, 0.0, -0.0, 1.0, 1.5, 0.1, 1e16, 1e15, 123456789012345678.0, "
        "0.0001, 0.00001, 1e-7, 1.5e300, 2.5E-300, 1e400, -1e400, 4.9e-324, 1e-400, 3.141592653589793, "
        "100.0, 1E2, 1e+2, 0.5, 1234567890123456.7]",
        "{\"k\": 1, \"k\": 2, \"j\": 3, \"k\": {\"x\": 4}}", "\"\xc3\xa9t\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x98\x80\"",
        "[[[[[]]]], {\"\": \"\"}]", "true", "null", "-12.50e-1", "[NaN, Infinity, -Infinity]",
        /* not JSON for json.loads */
        "", "{", "[1,]", "{\"a\":1,}", "01", "1.", ".5", "+1", "nan", "-NaN", "'x'", "\"a\tb\"", "\"\\x41\"",
        "[1] 2", "tru", "{\"a\" 1}", "\"\\u12\"",
    };
    /* json.loads keeps a lone surrogate, which UTF-8 cannot hold: refused here */
    static const char *const surrogates[] = {"\"\\ud800\"", "\"\\udc00x\"", "[\"\\ud83dx\"]"};
    for (size_t i = 0; i < sizeof surrogates / sizeof surrogates[0]; i++) {
        ak_buf got = {0};
        ak_error err = {0};
        CHECK(ak_pyjson_reprint(&got, surrogates[i], strlen(surrogates[i]), -1, &err) == 1, "%s accepted", surrogates[i]);
        ak_buf_free(&got);
    }
    int n = (int)(sizeof inputs / sizeof inputs[0]);
    /* the inputs to python as a JSON list of strings */
    ak_buf list = {0};
    ak_buf_puts(&list, "[");
    for (int i = 0; i < n; i++) {
        if (i) ak_buf_puts(&list, ", ");
        ak_pyjson_dump_string(&list, inputs[i], strlen(inputs[i]));
    }
    ak_buf_puts(&list, "]");
    char file[1024];
    snprintf(file, sizeof file, "%s/pyjson_inputs.json", test_tmp_dir());
    FILE *f = fopen(file, "w");
    REQUIRE(f && fwrite(list.p, 1, list.len, f) == list.len && fclose(f) == 0, "cannot write %s", file);
    ak_buf_free(&list);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json, sys\n"
             "for s in json.load(open(sys.argv[1])):\n"
             "    try: v = json.loads(s)\n"
             "    except ValueError: print(json.dumps(None)); continue\n"
             "    print(json.dumps([json.dumps(v, ensure_ascii=False), json.dumps(v, ensure_ascii=False, indent=4)]))\n"
             "' %s",
             file);
    char *out = run_capture(cmd);
    REQUIRE(out, "python3 failed");
    char *save = NULL, *line = strtok_r(out, "\n", &save);
    for (int i = 0; i < n; i++, line = strtok_r(NULL, "\n", &save)) {
        REQUIRE(line, "python printed too few lines");
        cJSON *want = cJSON_Parse(line);
        REQUIRE(want, "python printed '%s'", line);
        for (int indent = -1; indent <= 4; indent += 5) {
            ak_buf got = {0};
            ak_error err = {0};
            int rc = ak_pyjson_reprint(&got, inputs[i], strlen(inputs[i]), indent, &err);
            if (cJSON_IsNull(want)) {
                CHECK(rc == 1 && got.len == 0, "'%s': json.loads refuses it, reprint gave %d", inputs[i], rc);
            } else {
                const char *w = cJSON_GetStringValue(cJSON_GetArrayItem(want, indent < 0 ? 0 : 1));
                CHECK(rc == 0 && w && !strcmp(got.p ? got.p : "", w), "'%s' (indent %d): got '%s', want '%s'",
                      inputs[i], indent, got.p ? got.p : "", w ? w : "?");
            }
            ak_buf_free(&got);
        }
        cJSON_Delete(want);
    }
    free(out);
}
