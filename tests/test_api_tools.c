/* test_api_tools.c - a chat request's tools, tool_choice, tool calls and
 * results in its history, and the thinking switches (src/serve/api_tools.c
 * through ak_api_parse), without a server: what is refused (status, code,
 * param), and that an accepted conversation tokenizes as the chat library
 * renders the same messages and tools written out by hand. */
#include <string.h>

#include "serve/api.h"
#include "base/gguf.h"
#include "test.h"

/* The stories260K tokenizer (any vocabulary spells the text). */
static ak_tokenizer *open_tok(ak_test_ctx *t) {
    char path[512];
    gguf_file f;
    ak_error err = {0};
    if (gguf_open(&f, test_path(path, sizeof path, "models/stories260K.gguf"), &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "%s", err.msg);
        return NULL;
    }
    ak_tokenizer *tok = ak_tokenizer_load(&f, &err);
    gguf_close(&f);
    if (!tok) ak_test_fail(t, __FILE__, __LINE__, "%s", err.msg);
    return tok;
}

#define TOOL "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\"," \
             "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}"
#define CALL_MSG "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\"," \
                 "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]}"
#define USER_MSG "{\"role\":\"user\",\"content\":\"Weather in Paris?\"}"

TEST(api_tools_refusals) {
    ak_tokenizer *tok = open_tok(t);
    if (!tok) return;
    ak_api_config cfg = {.tok = tok, .model_id = "m", .family = AK_CHAT_CHATML, .n_ctx = 1 << 20};
    static const struct { const char *body, *param, *code; } cases[] = {
        {"{\"model\":\"m\",\"messages\":[" USER_MSG "],\"tools\":[{\"type\":\"retrieval\"}]}", "tools[0].type",
         "invalid_value"},
        {"{\"model\":\"m\",\"messages\":[" USER_MSG "],\"tools\":[{\"type\":\"function\"}]}", "tools[0].function",
         "missing_required_parameter"},
        {"{\"model\":\"m\",\"messages\":[" USER_MSG "],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}",
         "tools[0].function.name", "invalid_value"},
        {"{\"model\":\"m\",\"messages\":[" USER_MSG "],\"tools\":[" TOOL "," TOOL "]}", "tools[1].function.name",
         "invalid_value"},
        {"{\"model\":\"m\",\"messages\":[" USER_MSG "],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
         "\"parameters\":[1]}}]}", "tools[0].function.parameters", "invalid_type"},
        {"{\"model\":\"m\",\"messages\":[" USER_MSG "],\"tools\":[" TOOL "],\"tool_choice\":{\"type\":\"function\","
         "\"function\":{\"name\":\"nope\"}}}", "tool_choice.function.name", "invalid_value"},
        {"{\"model\":\"m\",\"messages\":[" USER_MSG "],\"tool_choice\":\"required\"}", "tool_choice", "invalid_value"},
        {"{\"model\":\"m\",\"messages\":[" USER_MSG "],\"tools\":[" TOOL "],\"tool_choice\":\"sometimes\"}", "tool_choice",
         "invalid_value"},
        {"{\"model\":\"m\",\"messages\":[" USER_MSG "," CALL_MSG ",{\"role\":\"tool\",\"content\":\"sunny\"}]}",
         "messages[2].tool_call_id", "missing_required_parameter"},
        {"{\"model\":\"m\",\"messages\":[" USER_MSG "," CALL_MSG ",{\"role\":\"tool\",\"tool_call_id\":\"call_9\","
         "\"content\":\"sunny\"}]}", "messages[2].tool_call_id", "invalid_value"},
        {"{\"model\":\"m\",\"messages\":[" USER_MSG ",{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"x\"},"
         CALL_MSG "]}", "messages[1].tool_call_id", "invalid_value"},
        {"{\"model\":\"m\",\"messages\":[" USER_MSG ",{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
         "\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{}}}]}]}",
         "messages[1].tool_calls[0].function.arguments", "invalid_type"},
        {"{\"model\":\"m\",\"messages\":[" USER_MSG "],\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}}",
         "chat_template_kwargs.enable_thinking", "invalid_type"},
        {"{\"model\":\"m\",\"messages\":[" USER_MSG "],\"reasoning_effort\":\"extreme\"}", "reasoning_effort",
         "invalid_value"},
        {"{\"model\":\"m\",\"messages\":[" USER_MSG "],\"parallel_tool_calls\":1}", "parallel_tool_calls", "invalid_type"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ak_api_request p;
        ak_api_error e;
        int rc = ak_api_parse(&cfg, cases[i].body, strlen(cases[i].body), 1, NULL, 7, &p, &e);
        CHECK(rc < 0 && e.status == 400, "case %zu: accepted (%d)", i, e.status);
        CHECK(e.param && !strcmp(e.param, cases[i].param), "case %zu: param %s, want %s (%s)", i,
              e.param ? e.param : "(null)", cases[i].param, e.msg);
        CHECK(e.code && !strcmp(e.code, cases[i].code), "case %zu: code %s, want %s (%s)", i, e.code ? e.code : "(null)",
              cases[i].code, e.msg);
        ak_api_request_free(&p);
    }
    ak_tokenizer_free(tok);
}

/* The body's prompt must be the chat library's tokens of msgs with tool
 * (or none) and think. */
static void check_prompt(ak_test_ctx *t, const ak_api_config *cfg, const char *body, const ak_chat_msg *msgs, int n,
                         const ak_chat_tool *tool, ak_chat_think think) {
    ak_api_request p;
    ak_api_error e;
    int rc = ak_api_parse(cfg, body, strlen(body), 1, NULL, 7, &p, &e);
    CHECK(rc == 0, "refused: %s (%s)", e.msg, e.param ? e.param : "");
    if (rc < 0) return;
    const ak_chat_opts o = {.family = cfg->family, .add_generation_prompt = 1, .tools = tool, .n_tools = tool ? 1 : 0,
                            .think = think};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    ak_error err = {0};
    REQUIRE(ak_chat_tokenize(msgs, n, &o, cfg->tok, AK_TOK_ADD_SPECIAL, &ids, &n_ids, &err) == 0, "%s", err.msg);
    CHECK(n_ids == p.n_tokens && !memcmp(ids, p.tokens, sizeof *ids * n_ids), "%s: %zu tokens, want %zu", body,
          p.n_tokens, n_ids);
    free(ids);
    ak_api_request_free(&p);
}

TEST(api_tools_render_as_the_library) {
    ak_tokenizer *tok = open_tok(t);
    if (!tok) return;
    const ak_chat_tool tool = {.name = "get_weather", .description = "Weather",
                               .parameters = "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
                                             "\"required\":[\"city\"]}"};
    const ak_chat_call call = {.id = "call_1", .name = "get_weather", .arguments = "{\"city\":\"Paris\"}"};
    const ak_chat_msg msgs[] = {
        {.role = "user", .content = "Weather in Paris?"},
        {.role = "assistant", .content = NULL, .calls = &call, .n_calls = 1},
        {.role = "tool", .content = "sunny", .tool_call_id = "call_1"},
    };
    for (int fam = 0; fam < 2; fam++) {
        ak_api_config cfg = {.tok = tok, .model_id = "m", .family = fam ? AK_CHAT_QWEN3 : AK_CHAT_CHATML, .n_ctx = 1 << 20};
        check_prompt(t, &cfg,
                     "{\"model\":\"m\",\"messages\":[" USER_MSG "," CALL_MSG ",{\"role\":\"tool\",\"tool_call_id\":"
                     "\"call_1\",\"content\":\"sunny\"}],\"tools\":[" TOOL "],\"tool_choice\":\"auto\","
                     "\"parallel_tool_calls\":false}",
                     msgs, 3, &tool, AK_CHAT_THINK_DEFAULT);
        /* calls in the history without tools; thinking off both ways */
        check_prompt(t, &cfg,
                     "{\"model\":\"m\",\"messages\":[" USER_MSG "," CALL_MSG ",{\"role\":\"tool\",\"tool_call_id\":"
                     "\"call_1\",\"content\":\"sunny\"}],\"reasoning_effort\":\"none\"}",
                     msgs, 3, NULL, AK_CHAT_THINK_OFF);
        check_prompt(t, &cfg,
                     "{\"model\":\"m\",\"messages\":[" USER_MSG "],\"chat_template_kwargs\":{\"enable_thinking\":false}}",
                     msgs, 1, NULL, AK_CHAT_THINK_OFF);
    }
    /* thinking off changes qwen3's prompt: the reference above is not blind to it */
    const ak_chat_opts on = {.family = AK_CHAT_QWEN3, .add_generation_prompt = 1};
    const ak_chat_opts off = {.family = AK_CHAT_QWEN3, .add_generation_prompt = 1, .think = AK_CHAT_THINK_OFF};
    char *a = NULL, *b = NULL;
    ak_error err = {0};
    REQUIRE(ak_chat_render(msgs, 1, &on, &a, &err) == 0 && ak_chat_render(msgs, 1, &off, &b, &err) == 0, "%s", err.msg);
    CHECK(strcmp(a, b) != 0 && strstr(b, "<think>\n\n</think>\n\n"), "thinking off renders as on: %s", b);
    free(a);
    free(b);
    ak_tokenizer_free(tok);
}
