/* test_toolcall.c - replies taken apart into content, reasoning and tool
 * calls (toolcall.h): hand-made replies in each family's markup, each fed
 * whole, cut in two at every byte, and a byte at a time, against the parts
 * written out by hand; the events in a valid order; the ids. */
#include <string.h>

#include "text/toolcall.h"
#include "test.h"

#define DS(x) "<\xef\xbd\x9c" x "\xef\xbd\x9c>"
#define DS_CALLS_BEGIN DS("tool\xe2\x96\x81" "calls\xe2\x96\x81" "begin")
#define DS_CALLS_END DS("tool\xe2\x96\x81" "calls\xe2\x96\x81" "end")
#define DS_CALL_BEGIN DS("tool\xe2\x96\x81" "call\xe2\x96\x81" "begin")
#define DS_CALL_END DS("tool\xe2\x96\x81" "call\xe2\x96\x81" "end")
#define DS_SEP DS("tool\xe2\x96\x81sep")

typedef struct {
    const char *name, *args;
    int complete;
} want_call;

typedef struct {
    const char *what;
    ak_toolcall_opts o;
    const char *text;
    const char *content, *reasoning;
    want_call calls[3];
    int n_calls;
} tc_case;

#define TOOLS(f) {.family = (f), .tools = 1, .parallel = 1, .id_seed = 7}

static const tc_case cases[] = {
    {.what = "hermes: text then a call", .o = TOOLS(AK_CHAT_CHATML),
     .text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
     .content = "Let me check.", .calls = {{"get_weather", "{\"city\": \"Paris\"}", 1}}, .n_calls = 1},
    {.what = "hermes: two calls", .o = TOOLS(AK_CHAT_CHATML),
     .text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n"
             "{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n",
     .content = "", .calls = {{"a", "{\"x\": 1}", 1}, {"b", "{}", 1}}, .n_calls = 2},
    {.what = "hermes: near misses are text", .o = TOOLS(AK_CHAT_CHATML),
     .text = "I like <tool_calls> and <toolbox> and <tool_cal", .content = "I like <tool_calls> and <toolbox> and <tool_cal"},
    {.what = "hermes: arguments as a JSON string", .o = TOOLS(AK_CHAT_CHATML),
     .text = "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
     .content = "", .calls = {{"f", "{\"a\": 1}", 1}}, .n_calls = 1},
    {.what = "hermes: arguments before the name", .o = TOOLS(AK_CHAT_CHATML),
     .text = "<tool_call>{\"arguments\": {\"x\": [1, \"}\"]}, \"name\": \"g\"}</tool_call>",
     .content = "", .calls = {{"g", "{\"x\": [1, \"}\"]}", 1}}, .n_calls = 1},
    {.what = "hermes: a call without arguments", .o = TOOLS(AK_CHAT_QWEN3),
     .text = "<tool_call>\n{\"name\": \"ping\"}\n</tool_call>", .content = "", .calls = {{"ping", "{}", 1}}, .n_calls = 1},
    {.what = "hermes: braces and quotes inside strings, other members", .o = TOOLS(AK_CHAT_GEMMA),
     .text = "<tool_call>{\"id\": \"x{\", \"name\": \"s\\u0021\", \"arguments\": {\"q\": \"a}b\\\"c{\", \"n\": [1, {\"d\": null}]}, "
             "\"extra\": [\"]\"]}</tool_call>after",
     .content = "after", .calls = {{"s!", "{\"q\": \"a}b\\\"c{\", \"n\": [1, {\"d\": null}]}", 1}}, .n_calls = 1},
    {.what = "hermes: broken markup is text", .o = TOOLS(AK_CHAT_CHATML),
     .text = "<tool_call>oops not json</tool_call> tail", .content = "oops not json</tool_call> tail"},
    {.what = "hermes: tools off", .o = {.family = AK_CHAT_CHATML},
     .text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
     .content = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"},
    {.what = "hermes: parallel calls off keeps the first", .o = {.family = AK_CHAT_CHATML, .tools = 1},
     .text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>",
     .content = "", .calls = {{"a", "{}", 1}}, .n_calls = 1},
    {.what = "hermes: cut inside the arguments", .o = TOOLS(AK_CHAT_CHATML),
     .text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ", .content = "",
     .calls = {{"f", "{\"a\": ", 0}}, .n_calls = 1},
    {.what = "hermes: cut before the name", .o = TOOLS(AK_CHAT_CHATML), .text = "Hi <tool_call>\n{\"na", .content = "Hi"},
    {.what = "hermes: UTF-8", .o = TOOLS(AK_CHAT_CHATML),
     .text = "Temp\xc3\xa9rature \xe2\x80\x94 <tool_call>{\"name\":\"t\",\"arguments\":{\"x\":\"\xc3\xa9\xf0\x9f\x98\x80\"}}</tool_call>",
     .content = "Temp\xc3\xa9rature \xe2\x80\x94", .calls = {{"t", "{\"x\":\"\xc3\xa9\xf0\x9f\x98\x80\"}", 1}}, .n_calls = 1},
    {.what = "hermes: a number as the arguments", .o = TOOLS(AK_CHAT_CHATML),
     .text = "<tool_call>{\"name\": \"n\", \"arguments\": 42}</tool_call>", .content = "", .calls = {{"n", "42", 1}}, .n_calls = 1},
    {.what = "hermes: text after the calls", .o = TOOLS(AK_CHAT_CHATML),
     .text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n\nDone  ", .content = "\n\nDone  ",
     .calls = {{"a", "{}", 1}}, .n_calls = 1},
    {.what = "qwen3: reasoning then a call", .o = TOOLS(AK_CHAT_QWEN3),
     .text = "<think>\nI should call.\n\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"P\"}}\n</tool_call>",
     .content = "", .reasoning = "I should call.", .calls = {{"w", "{\"c\": \"P\"}", 1}}, .n_calls = 1},
    {.what = "qwen3: empty reasoning", .o = {.family = AK_CHAT_QWEN3}, .text = "<think>\n\n</think>\n\nHello",
     .content = "Hello", .reasoning = ""},
    {.what = "qwen3: spaces before <think>", .o = {.family = AK_CHAT_QWEN3}, .text = "  <think>x\ny</think>y",
     .content = "y", .reasoning = "x\ny"},
    {.what = "qwen3: <think> later is text", .o = {.family = AK_CHAT_QWEN3}, .text = "a <think> b</think>",
     .content = "a <think> b</think>"},
    {.what = "qwen3: reasoning cut off", .o = {.family = AK_CHAT_QWEN3}, .text = "<think>\nhmm\n", .reasoning = "hmm"},
    {.what = "chatml: no reasoning markup", .o = {.family = AK_CHAT_CHATML}, .text = "<think>x</think>y",
     .content = "<think>x</think>y"},
    {.what = "llama3: the reply is a call", .o = TOOLS(AK_CHAT_LLAMA3),
     .text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
     .content = "", .calls = {{"get_weather", "{\"city\": \"Paris\"}", 1}}, .n_calls = 1},
    {.what = "llama3: type first", .o = TOOLS(AK_CHAT_LLAMA3),
     .text = "  {\"type\": \"function\", \"name\": \"f\", \"parameters\": {}}", .content = "",
     .calls = {{"f", "{}", 1}}, .n_calls = 1},
    {.what = "llama3: JSON that is no call", .o = TOOLS(AK_CHAT_LLAMA3), .text = "{\"answer\": 42}",
     .content = "{\"answer\": 42}"},
    {.what = "llama3: type not function", .o = TOOLS(AK_CHAT_LLAMA3), .text = "{\"type\": \"fun\"}",
     .content = "{\"type\": \"fun\"}"},
    {.what = "llama3: python tag", .o = TOOLS(AK_CHAT_LLAMA3),
     .text = "<|python_tag|>{\"name\": \"f\", \"arguments\": {\"a\": 1}}", .content = "",
     .calls = {{"f", "{\"a\": 1}", 1}}, .n_calls = 1},
    {.what = "llama3: a call later in the text is text", .o = TOOLS(AK_CHAT_LLAMA3),
     .text = "Sure, {\"name\": \"f\"}", .content = "Sure, {\"name\": \"f\"}"},
    {.what = "llama3: two calls", .o = TOOLS(AK_CHAT_LLAMA3),
     .text = "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}", .content = "",
     .calls = {{"a", "{}", 1}, {"b", "{\"x\": 1}", 1}}, .n_calls = 2},
    {.what = "llama3: text after the call", .o = TOOLS(AK_CHAT_LLAMA3),
     .text = "{\"name\": \"a\", \"parameters\": {}} and more", .content = "and more",
     .calls = {{"a", "{}", 1}}, .n_calls = 1},
    {.what = "llama3: tools off", .o = {.family = AK_CHAT_LLAMA3}, .text = "{\"name\": \"a\", \"parameters\": {}}",
     .content = "{\"name\": \"a\", \"parameters\": {}}"},
    {.what = "mistral: a list", .o = TOOLS(AK_CHAT_MISTRAL),
     .text = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123xyz\"}, "
             "{\"name\": \"s\", \"arguments\": {}}]",
     .content = "", .calls = {{"get_weather", "{\"city\": \"Paris\"}", 1}, {"s", "{}", 1}}, .n_calls = 2},
    {.what = "mistral: names and [ARGS]", .o = TOOLS(AK_CHAT_MISTRAL),
     .text = "Hello [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]s[CALL_ID]abcdefghi[ARGS] {}",
     .content = "Hello", .calls = {{"get_weather", "{\"city\": \"Paris\"}", 1}, {"s", "{}", 1}}, .n_calls = 2},
    {.what = "mistral: near miss", .o = TOOLS(AK_CHAT_MISTRAL), .text = "[TOOL_CALL] [TOOL", .content = "[TOOL_CALL] [TOOL"},
    {.what = "deepseek V3.1: text and two calls", .o = TOOLS(AK_CHAT_DEEPSEEK3),
     .text = "Checking." DS_CALLS_BEGIN DS_CALL_BEGIN "get_weather" DS_SEP "{\"city\": \"Paris\"}" DS_CALL_END DS_CALL_BEGIN
             "s" DS_SEP "{}" DS_CALL_END DS_CALLS_END,
     .content = "Checking.", .calls = {{"get_weather", "{\"city\": \"Paris\"}", 1}, {"s", "{}", 1}}, .n_calls = 2},
    {.what = "deepseek R1: fenced arguments", .o = TOOLS(AK_CHAT_DEEPSEEK3),
     .text = DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP "get_weather\n```json\n{\"city\": \"Paris\"}\n```" DS_CALL_END
             "\n" DS_CALL_BEGIN "function" DS_SEP "s\n```json\n{\"q\": \"`x`\"}\n```" DS_CALL_END DS_CALLS_END,
     .content = "", .calls = {{"get_weather", "{\"city\": \"Paris\"}", 1}, {"s", "{\"q\": \"`x`\"}", 1}}, .n_calls = 2},
    {.what = "deepseek: starts inside the reasoning", .o = {.family = AK_CHAT_DEEPSEEK3, .tools = 1, .in_reasoning = 1},
     .text = "I think.\n</think>\n\nAnswer", .content = "Answer", .reasoning = "I think."},
    {.what = "deepseek: reasoning then a call", .o = {.family = AK_CHAT_DEEPSEEK3, .tools = 1, .parallel = 1},
     .text = "<think>plan</think>" DS_CALLS_BEGIN DS_CALL_BEGIN "f" DS_SEP "{\"a\": [1]}" DS_CALL_END DS_CALLS_END,
     .content = "", .reasoning = "plan", .calls = {{"f", "{\"a\": [1]}", 1}}, .n_calls = 1},
};

/* What a run of events built. */
typedef struct {
    char content[1024], reasoning[1024];
    char names[3][64], args[3][256], ids[3][32];
    int complete[3], n_calls, bad;
    char why[256];
} got_t;

static void cat(char *dst, size_t cap, const char *s, size_t n) {
    size_t l = strlen(dst);
    if (l + n < cap) {
        memcpy(dst + l, s, n);
        dst[l + n] = '\0';
    }
}

/* Adds events to g, checking their order: a call starts once, with the next
 * index, before its arguments and its end, and ends once. */
static void take(got_t *g, const ak_toolcall_event *ev, int n) {
    for (int i = 0; i < n; i++) {
        const ak_toolcall_event *e = &ev[i];
        if ((e->kind == AK_TOOLCALL_CONTENT || e->kind == AK_TOOLCALL_REASONING || e->kind == AK_TOOLCALL_ARGS) &&
            (e->len == 0 || e->text[e->len] != '\0')) {
            g->bad = 1;
            snprintf(g->why, sizeof g->why, "an empty or unterminated text event");
        }
        switch (e->kind) {
        case AK_TOOLCALL_CONTENT: cat(g->content, sizeof g->content, e->text, e->len); break;
        case AK_TOOLCALL_REASONING: cat(g->reasoning, sizeof g->reasoning, e->text, e->len); break;
        case AK_TOOLCALL_CALL_START:
            if (e->index != g->n_calls || g->n_calls == 3 || !e->name || !e->id) {
                g->bad = 1;
                snprintf(g->why, sizeof g->why, "call %d started as %d", g->n_calls, e->index);
                break;
            }
            snprintf(g->names[g->n_calls], sizeof g->names[0], "%s", e->name);
            snprintf(g->ids[g->n_calls], sizeof g->ids[0], "%s", e->id);
            g->complete[g->n_calls++] = -1;
            break;
        case AK_TOOLCALL_ARGS:
        case AK_TOOLCALL_CALL_END:
            if (e->index < 0 || e->index >= g->n_calls || g->complete[e->index] != -1) {
                g->bad = 1;
                snprintf(g->why, sizeof g->why, "an event of call %d out of order", e->index);
                break;
            }
            if (e->kind == AK_TOOLCALL_ARGS) cat(g->args[e->index], sizeof g->args[0], e->text, e->len);
            else g->complete[e->index] = 1;
            break;
        }
    }
}

/* Feeds c's text in the pieces cut at cuts[0..n_cuts) and checks the
 * result against c. Returns 1 when it matches. */
static int run_split(ak_test_ctx *t, const tc_case *c, const size_t *cuts, int n_cuts, const char *how) {
    ak_error err = {0};
    ak_toolcall *p = ak_toolcall_new(&c->o, &err);
    if (!p) {
        CHECK(0, "%s", err.msg);
        return 0;
    }
    static got_t g;
    memset(&g, 0, sizeof g);
    size_t len = strlen(c->text), at = 0;
    const ak_toolcall_event *ev;
    for (int i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        int n = ak_toolcall_feed(p, c->text + at, to - at, &ev, &err);
        if (n < 0) break;
        take(&g, ev, n);
        at = to;
    }
    int n = ak_toolcall_finish(p, &ev, &err);
    if (n >= 0) take(&g, ev, n);
    int ok = !g.bad && !strcmp(g.content, c->content ? c->content : "") &&
             !strcmp(g.reasoning, c->reasoning ? c->reasoning : "") && g.n_calls == c->n_calls;
    for (int k = 0; ok && k < c->n_calls; k++) {
        const ak_toolcall_call *pc = ak_toolcall_get(p, k);
        ok = !strcmp(g.names[k], c->calls[k].name) && !strcmp(g.args[k], c->calls[k].args) && g.complete[k] == 1 &&
             pc && pc->complete == c->calls[k].complete && !strcmp(pc->arguments, c->calls[k].args) &&
             !strcmp(pc->id, g.ids[k]) && !strcmp(pc->name, g.names[k]);
    }
    /* the whole reply as the parser keeps it */
    ok = ok && !strcmp(ak_toolcall_content(p, NULL), g.content) && !strcmp(ak_toolcall_reasoning(p, NULL), g.reasoning) &&
         ak_toolcall_n_calls(p) == g.n_calls;
    if (!ok)
        ak_test_fail(t, __FILE__, __LINE__,
                     "%s (%s): content '%s' reasoning '%s', %d calls (first: '%s' '%s' complete %d)%s%s; want '%s' '%s' %d",
                     c->what, how, g.content, g.reasoning, g.n_calls, g.names[0], g.args[0],
                     ak_toolcall_get(p, 0) ? ak_toolcall_get(p, 0)->complete : -1, g.bad ? ": " : "", g.why,
                     c->content ? c->content : "", c->reasoning ? c->reasoning : "", c->n_calls);
    ak_toolcall_free(p);
    return ok;
}

TEST(toolcall_every_split_gives_the_same_parts) {
    int n_cases = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n_cases; i++) {
        const tc_case *c = &cases[i];
        size_t len = strlen(c->text);
        if (!run_split(t, c, NULL, 0, "whole")) continue;
        int ok = 1;
        for (size_t k = 1; ok && k < len; k++) {
            char how[64];
            snprintf(how, sizeof how, "cut at %zu", k);
            ok = run_split(t, c, &k, 1, how);
        }
        size_t bytes[512];
        REQUIRE(len < 512, "case too long");
        for (size_t k = 1; k < len; k++) bytes[k - 1] = k;
        if (ok && len > 1) run_split(t, c, bytes, (int)len - 1, "a byte at a time");
    }
}

TEST(toolcall_ids_and_done) {
    char a[32], b[32], m[32];
    ak_toolcall_id(AK_CHAT_QWEN3, 1, 0, a);
    ak_toolcall_id(AK_CHAT_QWEN3, 1, 1, b);
    ak_toolcall_id(AK_CHAT_MISTRAL, 1, 0, m);
    CHECK(strlen(a) == 29 && !strncmp(a, "call_", 5) && strspn(a + 5, "0123456789abcdefghijklmnopqrstuvwxyz"
                                                                       "ABCDEFGHIJKLMNOPQRSTUVWXYZ") == 24, "id '%s'", a);
    CHECK(strcmp(a, b), "two calls, one id '%s'", a);
    CHECK(strlen(m) == 9 && strspn(m, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") == 9,
          "mistral id '%s'", m);
    ak_toolcall_id(AK_CHAT_QWEN3, 2, 0, b);
    CHECK(strcmp(a, b), "another seed, the same id");
    ak_toolcall_id(AK_CHAT_QWEN3, 1, 0, b);
    CHECK(!strcmp(a, b), "the same seed and index, another id");

    /* parallel calls off: done once the first call is complete */
    ak_error err = {0};
    ak_toolcall *p = ak_toolcall_new(&(ak_toolcall_opts){.family = AK_CHAT_CHATML, .tools = 1}, &err);
    REQUIRE(p, "%s", err.msg);
    const ak_toolcall_event *ev;
    const char *part1 = "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": ", *part2 = "1}}";
    CHECK(ak_toolcall_feed(p, part1, strlen(part1), &ev, &err) >= 0 && !ak_toolcall_done(p), "done too early");
    CHECK(ak_toolcall_feed(p, part2, strlen(part2), &ev, &err) >= 0 && ak_toolcall_done(p), "not done");
    const ak_toolcall_call *c = ak_toolcall_get(p, 0);
    CHECK(c && c->complete && !strcmp(c->name, "a") && !strcmp(c->arguments, "{\"x\": 1}") && !ak_toolcall_get(p, 1),
          "the call as parsed");
    ak_toolcall_free(p);
}

/* A reply as the model writes it, parsed, then sent back as the assistant
 * message (content, reasoning, calls as parsed) and rendered: the template
 * writes the reply again, byte for byte (what lets an agent's cache stand
 * for its turn). The replies are written here in each template's form. */
TEST(toolcall_parsed_reply_renders_as_written) {
    static const struct {
        ak_chat_family f;
        const char *reply;
    } cases[] = {
        {AK_CHAT_QWEN3, "<think>\nLook it up.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                        "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"},
        {AK_CHAT_QWEN3, "<think>\nEasy.\n</think>\n\nIt is 4."},
        {AK_CHAT_CHATML, "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, 2.5]}}"
                         "\n</tool_call>"},
        {AK_CHAT_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"},
        {AK_CHAT_DEEPSEEK3, "Checking." DS_CALLS_BEGIN DS_CALL_BEGIN "get_weather" DS_SEP "{\"city\": \"Paris\"}" DS_CALL_END
                            DS_CALL_BEGIN "ping" DS_SEP "{}" DS_CALL_END DS_CALLS_END},
        {AK_CHAT_GEMMA, "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"},
    };
    const ak_chat_tool tools[] = {{.name = "get_weather", .parameters = "{\"type\": \"object\"}"}, {.name = "ping"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ak_error err = {0};
        ak_toolcall *p = ak_toolcall_new(&(ak_toolcall_opts){.family = cases[i].f, .tools = 1, .parallel = 1}, &err);
        REQUIRE(p, "%s", err.msg);
        const ak_toolcall_event *ev;
        REQUIRE(ak_toolcall_feed(p, cases[i].reply, strlen(cases[i].reply), &ev, &err) >= 0 &&
                    ak_toolcall_finish(p, &ev, &err) >= 0, "%s", err.msg);
        ak_chat_call calls[4];
        int n = ak_toolcall_n_calls(p);
        REQUIRE(n <= 4, "calls");
        for (int k = 0; k < n; k++) {
            const ak_toolcall_call *c = ak_toolcall_get(p, k);
            calls[k] = (ak_chat_call){.id = c->id, .name = c->name, .arguments = c->arguments};
        }
        const char *content = ak_toolcall_content(p, NULL), *reasoning = ak_toolcall_reasoning(p, NULL);
        const ak_chat_msg m[] = {{.role = "user", .content = "Weather in Paris?"},
                                 {.role = "assistant", .content = content[0] || !n ? content : NULL,
                                  .reasoning = reasoning[0] ? reasoning : NULL, .calls = n ? calls : NULL, .n_calls = n}};
        char *out = NULL;
        int rc = ak_chat_render(m, 2, &(ak_chat_opts){.family = cases[i].f, .tools = tools, .n_tools = 2}, &out, &err);
        CHECK(rc == 0 && strstr(out, cases[i].reply), "%s: the reply is not rendered as written:\n%s\n--- reply:\n%s",
              ak_chat_family_name(cases[i].f), rc == 0 ? out : err.msg, cases[i].reply);
        free(out);
        ak_toolcall_free(p);
    }
}

TEST(toolcall_reasoning_open_after_the_prompt) {
    const char *v31 = "{% if not thinking is defined %}{{ is_last_user }}<\xef\xbd\x9cUser\xef\xbd\x9c>";
    CHECK(ak_chat_reasoning_open(&(ak_chat_opts){.family = AK_CHAT_DEEPSEEK3, .template_text = v31,
                                                 .think = AK_CHAT_THINK_ON}),
          "V3.1 thinking on ends inside <think>");
    CHECK(!ak_chat_reasoning_open(&(ak_chat_opts){.family = AK_CHAT_DEEPSEEK3, .template_text = v31}),
          "V3.1 thinking off by default");
    CHECK(ak_chat_reasoning_open(&(ak_chat_opts){.family = AK_CHAT_DEEPSEEK3, .template_text = "<\xef\xbd\x9cUser\xef\xbd\x9c>"}),
          "R1 without enable_thinking: the prompt opens <think>");
    CHECK(!ak_chat_reasoning_open(&(ak_chat_opts){.family = AK_CHAT_QWEN3}), "qwen3: the model opens <think> itself");
    CHECK(!ak_chat_reasoning_open(&(ak_chat_opts){.family = AK_CHAT_QWEN3, .think = AK_CHAT_THINK_OFF}), "qwen3 off");
    CHECK(!ak_chat_reasoning_open(&(ak_chat_opts){.family = AK_CHAT_CHATML}), "chatml");
}
