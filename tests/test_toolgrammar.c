/* test_toolgrammar.c - the grammar of tool calls (src/text/toolgrammar.c):
 * for each family's syntax, the calls the model's template renders (the
 * strings below are written from the published templates, chat.h's list)
 * are accepted, the reply parser (toolcall.h) takes the accepted text back
 * to the same name and arguments, and what breaks the syntax or a tool's
 * schema is refused; the modes (after the opener, calls, calls or content)
 * and the schema errors' paths. */
#include <string.h>

#include "text/toolcall.h"
#include "text/toolgrammar.h"
#include "test.h"

#define OK(c) CHECK(c, "%s", #c)

static const ak_chat_tool tools[] = {
    {.name = "get_weather",
     .parameters = "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
                   "\"unit\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\"],\"additionalProperties\":false}"},
    {.name = "get_time", .parameters = NULL},
};

/* The grammar of opts; NULL with a failure recorded. */
static ak_grammar *compile(ak_test_ctx *t, const ak_toolg_opts *o) {
    size_t n = 0;
    char *spec = ak_toolg_spec(o, &n);
    ak_gram_error e = {0};
    ak_grammar *g = spec ? ak_toolg_compile(spec, n, &e) : NULL;
    free(spec);
    if (!g) ak_test_fail(t, __FILE__, __LINE__, "compile: %s (%s)", e.msg, e.path);
    return g;
}

/* 1 when text is a whole match of g. */
static int matches(const ak_grammar *g, const char *text) {
    ak_gmatch *m = ak_gmatch_new(g);
    int ok = m && ak_gmatch_feed(m, text, strlen(text)) == 0 && ak_gmatch_accepting(m);
    ak_gmatch_free(m);
    return ok;
}

typedef struct {
    ak_chat_family family;
    const char *template_text;
    const char *reply;        /* a reply of two calls (one for llama3) as the template renders them */
    const char *bad[4];       /* replies the grammar refuses */
} family_case;

static const family_case cases[] = {
    {AK_CHAT_QWEN3, NULL,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n"
     "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
     {"<tool_call>\n{\"name\": \"get_wether\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\"}}\n</tool_call>",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"k\"}}\n</tool_call>",
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}"}},
    {AK_CHAT_CHATML, NULL,
     "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>\n"
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
     {"Sure. <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"x\": 1}}\n</tool_call>"}},
    {AK_CHAT_LLAMA3, NULL, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
     {"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"get_time\", \"parameters\": {}}",
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"}},
    {AK_CHAT_MISTRAL, NULL,
     "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
     "{\"name\": \"get_time\", \"arguments\": {}}]",
     {"[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
      "[TOOL_CALLS]{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"}},
    {AK_CHAT_MISTRAL, "{{ '[SYSTEM_PROMPT]' }}",
     "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}",
     {"[TOOL_CALLS]get_weather[ARGS]{}", "[TOOL_CALLS]get_weather{\"city\": \"Paris\"}"}},
    {AK_CHAT_DEEPSEEK3, "{% if is_last_user %}{% endif %}",
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>"
     "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     {"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>"}},
    {AK_CHAT_DEEPSEEK3, "{{ bos_token }}",
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```"
     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     {"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>"}},
};

/* The calls the parser reads in reply (family f): names and arguments
 * joined as "name(args);" into out. */
static void parsed_calls(ak_test_ctx *t, ak_chat_family f, const char *reply, char *out, size_t cap) {
    ak_error err = {0};
    ak_toolcall *p = ak_toolcall_new(&(ak_toolcall_opts){.family = f, .tools = 1, .parallel = 1}, &err);
    const ak_toolcall_event *ev = NULL;
    OK(p && ak_toolcall_feed(p, reply, strlen(reply), &ev, &err) >= 0 && ak_toolcall_finish(p, &ev, &err) >= 0);
    out[0] = 0;
    for (int i = 0; p && i < ak_toolcall_n_calls(p); i++) {
        const ak_toolcall_call *c = ak_toolcall_get(p, i);
        size_t n = strlen(out);
        snprintf(out + n, cap - n, "%s(%s);", c->name, c->arguments);
    }
    ak_toolcall_free(p);
}

TEST(toolgrammar_accepts_the_templates_calls_and_parses_back) {
    static const char *const want[] = {
        "get_weather({\"city\": \"Paris\", \"unit\": \"c\"});get_time({});",
        "get_time({\"zone\": \"UTC\"});get_weather({\"city\": \"Oslo\"});",
        "get_weather({\"city\": \"Paris\"});",
        "get_weather({\"city\": \"Paris\"});get_time({});",
        "get_weather({\"city\": \"Paris\"});get_time({});",
        "get_weather({\"city\": \"Paris\"});get_time({});",
        "get_weather({\"city\": \"Paris\"});",
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const family_case *c = &cases[i];
        ak_grammar *g = compile(t, &(ak_toolg_opts){.family = c->family, .template_text = c->template_text,
                                                    .tools = tools, .n_tools = 2, .parallel = 1,
                                                    .mode = AK_TOOLG_CALLS, .lead_ws = 1});
        if (!g) continue;
        CHECK(matches(g, c->reply), "case %zu: the template's calls refused: %s", i, c->reply);
        for (int k = 0; k < 4 && c->bad[k]; k++)
            CHECK(!matches(g, c->bad[k]), "case %zu: accepted %s", i, c->bad[k]);
        char got[512];
        parsed_calls(t, c->family, c->reply, got, sizeof got);
        CHECK(!strcmp(got, want[i]), "case %zu: parsed %s, want %s", i, got, want[i]);
        ak_grammar_free(g);
    }
}

TEST(toolgrammar_modes) {
    /* one call only when parallel calls are off */
    ak_toolg_opts o = {.family = AK_CHAT_QWEN3, .tools = tools, .n_tools = 2, .parallel = 0, .mode = AK_TOOLG_CALLS,
                       .lead_ws = 1};
    ak_grammar *g = compile(t, &o);
    if (g) {
        OK(matches(g, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
        OK(!matches(g, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
                             "{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
        OK(!matches(g, "plain text"));
        /* the arguments as tojson prints them, no other spacing */
        OK(!matches(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>"));
        OK(matches(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
        OK(!matches(g, "\n\n\n\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
        OK(matches(g, "\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
        ak_grammar_free(g);
    }
    /* without lead_ws the opener comes first */
    o.lead_ws = 0;
    if ((g = compile(t, &o))) {
        OK(!matches(g, "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
        OK(matches(g, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
        ak_grammar_free(g);
    }
    /* after the opener (auto: the generator starts it lazily) */
    o.mode = AK_TOOLG_AFTER_OPENER;
    if ((g = compile(t, &o))) {
        OK(matches(g, "\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
        OK(!matches(g, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
        ak_grammar_free(g);
    }
    /* the named tool alone */
    o = (ak_toolg_opts){.family = AK_CHAT_QWEN3, .tools = &tools[1], .n_tools = 1, .parallel = 1, .mode = AK_TOOLG_CALLS};
    if ((g = compile(t, &o))) {
        OK(matches(g, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
        OK(!matches(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\"}}\n</tool_call>"));
        ak_grammar_free(g);
    }
    /* calls, or a JSON reply valid for the content schema */
    o = (ak_toolg_opts){.family = AK_CHAT_LLAMA3, .tools = tools, .n_tools = 2, .mode = AK_TOOLG_CALLS_OR_CONTENT,
                        .content_schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"integer\"}},"
                                          "\"required\":[\"name\"]}"};
    if ((g = compile(t, &o))) {
        OK(matches(g, "{\"name\": \"get_time\", \"parameters\": {}}"));
        OK(matches(g, "{\"name\":7}"));
        OK(!matches(g, "{\"name\":\"get_time\"}"));
        OK(!matches(g, "{}"));
        ak_grammar_free(g);
    }
}

TEST(toolgrammar_schema_errors_name_the_tool) {
    const ak_chat_tool bad[] = {
        {.name = "ok", .parameters = "{\"type\":\"object\"}"},
        {.name = "odd", .parameters = "{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{\"type\":\"string\"}}}}"},
    };
    size_t n = 0;
    char *spec = ak_toolg_spec(&(ak_toolg_opts){.family = AK_CHAT_CHATML, .tools = bad, .n_tools = 2,
                                                .mode = AK_TOOLG_CALLS}, &n);
    ak_gram_error e = {0};
    ak_grammar *g = spec ? ak_toolg_compile(spec, n, &e) : NULL;
    OK(spec && !g);
    CHECK(e.code == AK_GRAM_E_UNSUPPORTED && !strcmp(e.keyword, "not") &&
                     !strncmp(e.path, "/tools/1/parameters", 19), "code %d keyword %s path %s", e.code, e.keyword, e.path);
    free(spec);
    const ak_chat_tool notjson[] = {{.name = "f", .parameters = "{nope"}};
    spec = ak_toolg_spec(&(ak_toolg_opts){.family = AK_CHAT_CHATML, .tools = notjson, .n_tools = 1,
                                          .mode = AK_TOOLG_CALLS}, &n);
    g = spec ? ak_toolg_compile(spec, n, &e) : NULL;
    OK(spec && !g && e.code == AK_GRAM_E_JSON && !strcmp(e.path, "/tools/0/parameters"));
    free(spec);
    g = ak_toolg_compile("{\"x\":1}", 7, &e);
    OK(!g && e.code == AK_GRAM_E_INVALID);
}
