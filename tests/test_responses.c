/* test_responses.c - the Responses API's reading and writing
 * (src/serve/responses_in.c, responses_out.c) without a server: request
 * bodies against the chat bodies they mean (written out by hand from the
 * two APIs' documentation), the refusals, the chain hash's equalities, and
 * a reply's output items and stream events against hand-written lists. */
#include <string.h>

#include "serve/responses.h"
#include "test.h"

/* The chat body of a Responses body (text); NULL with the error in b. */
static cJSON *chat_of(const char *req_text, const char *history_text, ak_api_error *b) {
    cJSON *req = cJSON_Parse(req_text), *hist = history_text ? cJSON_Parse(history_text) : NULL, *chat = NULL;
    memset(b, 0, sizeof *b);
    if (ak_resp_chat_body(req, hist, &chat, b) < 0) chat = NULL;
    cJSON_Delete(req);
    cJSON_Delete(hist);
    return chat;
}

TEST(responses_request_is_the_chat_body_it_means) {
    ak_api_error b;
    cJSON *chat = chat_of(
        "{\"model\":\"m\",\"instructions\":\"Be terse.\",\"max_output_tokens\":9,\"temperature\":0.5,"
        "\"reasoning\":{\"effort\":\"none\",\"summary\":\"auto\"},\"store\":true,\"metadata\":{\"a\":\"b\"},"
        "\"include\":[\"reasoning.encrypted_content\"],\"truncation\":\"disabled\","
        "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"description\":\"d\",\"parameters\":{\"type\":\"object\"},\"strict\":true}],"
        "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},\"parallel_tool_calls\":false,"
        "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"s\",\"schema\":{\"type\":\"object\"},\"strict\":true},"
        "\"verbosity\":\"low\"},"
        "\"input\":[{\"role\":\"user\",\"content\":\"Hi\"},"
        "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[]},"
        "{\"type\":\"message\",\"id\":\"msg_1\",\"role\":\"assistant\",\"status\":\"completed\","
        "\"content\":[{\"type\":\"output_text\",\"text\":\"Let me \",\"annotations\":[]},{\"type\":\"output_text\",\"text\":\"look.\"}]},"
        "{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\",\"status\":\"completed\"},"
        "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"one\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c2\",\"output\":[{\"type\":\"input_text\",\"text\":\"two\"}]},"
        "{\"type\":\"message\",\"role\":\"developer\",\"content\":[{\"type\":\"input_text\",\"text\":\"Note.\"}]}]}",
        "[{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Before.\"}]}]", &b);
    REQUIRE(chat, "refused: %s (%s)", b.msg, b.param ? b.param : "-");
    cJSON *want = cJSON_Parse(
        "{\"messages\":[{\"role\":\"system\",\"content\":\"Be terse.\"},{\"role\":\"user\",\"content\":\"Before.\"},"
        "{\"role\":\"user\",\"content\":\"Hi\"},"
        "{\"role\":\"assistant\",\"content\":\"Let me look.\",\"tool_calls\":["
        "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
        "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
        "{\"role\":\"tool\",\"content\":\"one\",\"tool_call_id\":\"c1\"},{\"role\":\"tool\",\"content\":\"two\",\"tool_call_id\":\"c2\"},"
        "{\"role\":\"developer\",\"content\":\"Note.\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\",\"parameters\":{\"type\":\"object\"},\"strict\":true}}],"
        "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s\",\"schema\":{\"type\":\"object\"},\"strict\":true}},"
        "\"model\":\"m\",\"temperature\":0.5,\"parallel_tool_calls\":false,\"max_tokens\":9,\"reasoning_effort\":\"none\"}");
    char *got = cJSON_PrintUnformatted(chat);
    CHECK(cJSON_Compare(chat, want, 1), "got %s", got);
    free(got);
    cJSON_Delete(chat);
    cJSON_Delete(want);

    /* a string input is one user message; json_object */
    chat = chat_of("{\"model\":\"m\",\"input\":\"Hey\",\"text\":{\"format\":{\"type\":\"json_object\"}},\"stream\":true}", NULL, &b);
    want = cJSON_Parse("{\"messages\":[{\"role\":\"user\",\"content\":\"Hey\"}],\"response_format\":{\"type\":\"json_object\"},"
                       "\"model\":\"m\",\"stream\":true}");
    CHECK(chat && cJSON_Compare(chat, want, 1), "string input");
    cJSON_Delete(chat);
    cJSON_Delete(want);
}

TEST(responses_refusals_name_the_field) {
    static const struct { const char *body, *param, *code; } cases[] = {
        {"{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0].type", "unsupported_parameter"},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"u\"}]}]}",
         "input[0].content[0]", "unsupported_parameter"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", "input[0].type", "unsupported_parameter"},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "input[0].role", "invalid_value"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\"}]}", "input[0].arguments",
         "invalid_type"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"function_call_output\",\"output\":\"x\"}]}", "input[0].call_id", "invalid_type"},
        {"{\"model\":\"m\",\"input\":\"x\",\"background\":true}", "background", "unsupported_parameter"},
        {"{\"model\":\"m\",\"input\":\"x\",\"top_logprobs\":3}", "top_logprobs", "unsupported_parameter"},
        {"{\"model\":\"m\",\"input\":\"x\",\"truncation\":\"middle\"}", "truncation", "invalid_value"},
        {"{\"model\":\"m\",\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", "text.format.type", "invalid_value"},
        {"{\"model\":\"m\",\"input\":\"x\",\"tool_choice\":{\"type\":\"file_search\"}}", "tool_choice.type", "unsupported_parameter"},
        {"{\"model\":\"m\"}", "input", "missing_required_parameter"},
        {"{\"model\":\"m\",\"input\":5}", "input", "invalid_type"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ak_api_error b;
        cJSON *chat = chat_of(cases[i].body, NULL, &b);
        CHECK(!chat && b.status == 400 && b.param && !strcmp(b.param, cases[i].param) && b.code &&
                  !strcmp(b.code, cases[i].code),
              "case %zu: status %d param %s code %s (%s)", i, b.status, b.param ? b.param : "-", b.code ? b.code : "-",
              b.msg);
        cJSON_Delete(chat);
    }
}

/* The chain hash of items given as JSON text. */
static uint64_t chain_of(const char *text) {
    cJSON *a = cJSON_Parse(text);
    uint64_t h = ak_resp_chain_hash(0, a, cJSON_GetArraySize(a));
    cJSON_Delete(a);
    return h;
}

TEST(responses_chain_hash_equalities) {
    /* an output message resent as the SDK resends it, with other ids and status */
    uint64_t a = chain_of("[{\"role\":\"user\",\"content\":\"Hi\"},{\"type\":\"message\",\"id\":\"msg_1\",\"role\":\"assistant\","
                          "\"status\":\"completed\",\"content\":[{\"type\":\"output_text\",\"text\":\"Yo\",\"annotations\":[]}]},"
                          "{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1}\"}]");
    uint64_t b = chain_of("[{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Hi\"}]},"
                          "{\"type\":\"reasoning\",\"id\":\"rs\",\"summary\":[]},"
                          "{\"role\":\"assistant\",\"content\":\"Yo\"},"
                          "{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}]");
    CHECK(a && a == b, "the same conversation hashes alike: %llx %llx", (unsigned long long)a, (unsigned long long)b);
    CHECK(chain_of("[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Yo!\"}]") !=
              chain_of("[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Yo\"}]"),
          "another text, another hash");
    CHECK(chain_of("[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Yo\"}]") !=
              chain_of("[{\"role\":\"assistant\",\"content\":\"Hi\"},{\"role\":\"user\",\"content\":\"Yo\"}]"),
          "roles count");
    CHECK(chain_of("[{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"x\"}]") !=
              chain_of("[{\"type\":\"function_call_output\",\"call_id\":\"d\",\"output\":\"x\"}]"),
          "call ids count");
    /* prefixes chain: the hash of a list continued equals the whole list's */
    cJSON *all = cJSON_Parse("[{\"role\":\"user\",\"content\":\"A\"},{\"role\":\"assistant\",\"content\":\"B\"}]");
    uint64_t h1 = ak_resp_chain_hash(0, all, 1);
    CHECK(ak_resp_item_hash(h1, cJSON_GetArrayItem(all, 1)) == ak_resp_chain_hash(0, all, 2), "chained");
    cJSON_Delete(all);
}

/* The parser of a chatml reply with tools, fed text and finished. */
static ak_toolcall *parsed(const char *text) {
    ak_error err = {0};
    ak_toolcall *p = ak_toolcall_new(&(ak_toolcall_opts){.family = AK_CHAT_CHATML, .tools = 1, .parallel = 1, .id_seed = 7}, &err);
    const ak_toolcall_event *ev;
    if (p && (ak_toolcall_feed(p, text, strlen(text), &ev, &err) < 0 || ak_toolcall_finish(p, &ev, &err) < 0)) {
        ak_toolcall_free(p);
        return NULL;
    }
    return p;
}

#define REPLY "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>"

TEST(responses_output_items_and_stream_events) {
    ak_toolcall *tc = parsed(REPLY);
    REQUIRE(tc, "parser");
    const ak_resp_ids ids = {.id_seed = 42};
    cJSON *items = ak_resp_output_items(tc, &ids, 0);
    REQUIRE(items && cJSON_GetArraySize(items) == 2, "two items");
    cJSON *m = cJSON_GetArrayItem(items, 0), *f = cJSON_GetArrayItem(items, 1);
    const char *call_id = ak_toolcall_get(tc, 0)->id;
    CHECK(!strcmp(cJSON_GetObjectItem(m, "type")->valuestring, "message") &&
              !strcmp(cJSON_GetObjectItem(m, "status")->valuestring, "completed") &&
              !strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "content"), 0), "text")->valuestring,
                      "Let me check."),
          "the message item");
    CHECK(!strcmp(cJSON_GetObjectItem(f, "type")->valuestring, "function_call") &&
              !strcmp(cJSON_GetObjectItem(f, "name")->valuestring, "f") &&
              !strcmp(cJSON_GetObjectItem(f, "arguments")->valuestring, "{\"a\": 1}") &&
              !strcmp(cJSON_GetObjectItem(f, "call_id")->valuestring, call_id) &&
              !strncmp(cJSON_GetObjectItem(f, "id")->valuestring, "fc_", 3),
          "the function_call item");

    /* the same reply streamed in pieces of 5 bytes */
    cJSON *out = cJSON_CreateArray(), *resp = cJSON_Parse("{\"id\":\"resp-1\",\"object\":\"response\",\"status\":\"x\",\"output\":[]}");
    ak_resp_stream *st = ak_resp_stream_new(&ids, out);
    ak_error err = {0};
    ak_toolcall *p = ak_toolcall_new(&(ak_toolcall_opts){.family = AK_CHAT_CHATML, .tools = 1, .parallel = 1, .id_seed = 7}, &err);
    REQUIRE(st && p && ak_resp_stream_begin(st, resp) == 0, "stream");
    const ak_toolcall_event *ev;
    for (size_t i = 0; i < strlen(REPLY); i += 5) {
        size_t n = strlen(REPLY) - i < 5 ? strlen(REPLY) - i : 5;
        int k = ak_toolcall_feed(p, REPLY + i, n, &ev, &err);
        REQUIRE(k >= 0 && ak_resp_stream_feed(st, ev, k) == 0, "feed");
    }
    int k = ak_toolcall_finish(p, &ev, &err);
    REQUIRE(k >= 0 && ak_resp_stream_feed(st, ev, k) == 0 && ak_resp_stream_end(st, resp, 0) == 0, "end");
    /* the event types, deltas collapsed, as the official clients expect them */
    static const char *const want[] = {
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"};
    size_t w = 0;
    int seq_ok = 1, i = 0;
    const char *prev = "";
    char text[256] = "", args[256] = "";
    cJSON *e;
    cJSON_ArrayForEach(e, out) {
        const char *type = cJSON_GetObjectItem(e, "type")->valuestring;
        seq_ok &= (int)cJSON_GetObjectItem(e, "sequence_number")->valuedouble == i++;
        if (!strcmp(type, "response.output_text.delta")) strcat(text, cJSON_GetObjectItem(e, "delta")->valuestring);
        if (!strcmp(type, "response.function_call_arguments.delta")) strcat(args, cJSON_GetObjectItem(e, "delta")->valuestring);
        if (!strcmp(type, prev) && strstr(type, ".delta")) continue;
        CHECK(w < sizeof want / sizeof *want && !strcmp(type, want[w]), "event %zu: %s, want %s", w, type,
              w < sizeof want / sizeof *want ? want[w] : "(none)");
        w++;
        prev = type;
    }
    CHECK(w == sizeof want / sizeof *want && seq_ok, "%zu event kinds, sequence numbers in order: %d", w, seq_ok);
    CHECK(!strcmp(text, "Let me check.") && !strcmp(args, "{\"a\": 1}"), "deltas: '%s' '%s'", text, args);
    cJSON *last = cJSON_GetArrayItem(out, cJSON_GetArraySize(out) - 1);
    cJSON *final = cJSON_GetObjectItem(cJSON_GetObjectItem(last, "response"), "output");
    CHECK(cJSON_Compare(final, items, 1) || (cJSON_GetArraySize(final) == 2 &&
          !strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(final, 1), "arguments")->valuestring, "{\"a\": 1}")),
          "the terminal event's output");
    CHECK(!strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(last, "response"), "status")->valuestring, "completed"), "status");
    ak_toolcall_free(p);
    ak_resp_stream_free(st);
    cJSON_Delete(out);
    cJSON_Delete(resp);
    cJSON_Delete(items);
    ak_toolcall_free(tc);

    /* a cut reply: an incomplete message */
    tc = parsed("Cut he");
    items = ak_resp_output_items(tc, &ids, 1);
    CHECK(items && !strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(items, 0), "status")->valuestring, "incomplete"),
          "incomplete");
    cJSON_Delete(items);
    ak_toolcall_free(tc);
}
