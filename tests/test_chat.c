/* test_chat.c - chat templates: every golden render (Hugging Face's output for
 * real templates) reproduced byte for byte, family detection of every golden
 * template, the documented behaviours that have no golden (Gemma with a
 * system message, Llama 2, plain), and errors. */
#include <string.h>

#include <cjson/cJSON.h>

#include "text/chat.h"
#include "base/gguf.h"
#include "test.h"

static const char *const template_files[] = {
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "google-gemma-2-2b-it.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
};
static const ak_chat_family template_families[] = {
    AK_CHAT_CHATML, AK_CHAT_GEMMA, AK_CHAT_LLAMA3, AK_CHAT_LLAMA3, AK_CHAT_PHI3, AK_CHAT_MISTRAL,
};
#define N_TEMPLATES ((int)(sizeof template_files / sizeof template_files[0]))

static char *read_template(const char *file) {
    char rel[256], path[1024];
    snprintf(rel, sizeof rel, "golden/templates/%s", file);
    ak_error err = {{0}};
    size_t len;
    return ak_read_file(test_path(path, sizeof path, rel), &len, &err);
}

/* Compares got with want; on a mismatch reports both and the first
 * differing offset. Returns 1 when equal. */
static int same_text(ak_test_ctx *t, const char *label, const char *got, const char *want) {
    if (strcmp(got, want) == 0) return 1;
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    ak_test_fail(t, __FILE__, __LINE__, "%s: render differs at byte %zu\n--- got:\n%s\n--- want:\n%s",
                 label, i, got, want);
    return 0;
}

TEST(chat_golden_renders) {
    char path[1024];
    ak_error err = {{0}};
    size_t len;
    char *text = ak_read_file(test_path(path, sizeof path, "golden/templates/renders.jsonl"), &len, &err);
    REQUIRE(text, "%s", err.msg);
    int pass[N_TEMPLATES] = {0}, total[N_TEMPLATES] = {0}, lines = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!line[0]) continue;
        lines++;
        cJSON *j = cJSON_Parse(line);
        if (!j) { CHECK(0, "renders.jsonl line %d is not JSON", lines); continue; }
        const char *file = cJSON_GetStringValue(cJSON_GetObjectItem(j, "template_file"));
        const char *cas = cJSON_GetStringValue(cJSON_GetObjectItem(j, "case"));
        const char *bos = cJSON_GetStringValue(cJSON_GetObjectItem(j, "bos_token"));
        const char *eos = cJSON_GetStringValue(cJSON_GetObjectItem(j, "eos_token"));
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(j, "rendered"));
        cJSON *msgs = cJSON_GetObjectItem(j, "messages");
        int gen = cJSON_IsTrue(cJSON_GetObjectItem(j, "add_generation_prompt"));
        int ti = -1;
        for (int k = 0; file && k < N_TEMPLATES; k++)
            if (strcmp(file, template_files[k]) == 0) ti = k;
        if (ti < 0 || !want || !cJSON_IsArray(msgs)) {
            CHECK(0, "renders.jsonl line %d: unknown template or missing fields", lines);
            cJSON_Delete(j);
            continue;
        }
        total[ti]++;
        int n = cJSON_GetArraySize(msgs);
        ak_chat_msg m[16];
        REQUIRE(n <= 16, "too many messages");
        for (int k = 0; k < n; k++) {
            cJSON *e = cJSON_GetArrayItem(msgs, k);
            m[k] = (ak_chat_msg){.role = cJSON_GetStringValue(cJSON_GetObjectItem(e, "role")),
                                 .content = cJSON_GetStringValue(cJSON_GetObjectItem(e, "content"))};
        }
        char *tmpl = read_template(file);
        CHECK(tmpl, "cannot read %s", file);
        ak_chat_family fam = ak_chat_detect(tmpl);
        char *got = NULL;
        char label[256];
        snprintf(label, sizeof label, "%s [%s]", file, cas ? cas : "?");
        if (ak_chat_render(m, n,
                           &(ak_chat_opts){.family = fam, .template_text = tmpl, .add_generation_prompt = gen, .bos = bos, .eos = eos},
                           &got, &err) != 0) {
            CHECK(0, "%s: render failed: %s", label, err.msg);
        } else if (same_text(t, label, got, want)) {
            pass[ti]++;
        }
        free(got);
        free(tmpl);
        cJSON_Delete(j);
    }
    free(text);
    CHECK(lines >= 11, "expected at least 11 golden renders, found %d", lines);
    for (int k = 0; k < N_TEMPLATES; k++) {
        printf("  chat golden %-45s %d/%d\n", template_files[k], pass[k], total[k]);
        CHECK(total[k] > 0, "%s: no golden render", template_files[k]);
    }
}

TEST(chat_detect_golden_templates) {
    for (int k = 0; k < N_TEMPLATES; k++) {
        char *tmpl = read_template(template_files[k]);
        REQUIRE(tmpl, "cannot read %s", template_files[k]);
        ak_chat_family f = ak_chat_detect(tmpl);
        CHECK(f == template_families[k], "%s detected as %s, want %s", template_files[k],
              ak_chat_family_name(f), ak_chat_family_name(template_families[k]));
        free(tmpl);
    }
    CHECK(ak_chat_detect(NULL) == AK_CHAT_PLAIN, "NULL");
    CHECK(ak_chat_detect("") == AK_CHAT_PLAIN, "empty");
    CHECK(ak_chat_detect("{{ messages }}") == AK_CHAT_PLAIN, "no markers");
    CHECK(ak_chat_detect("{{ bos_token + '[INST] ' + '<<SYS>>\\n' }}") == AK_CHAT_LLAMA2, "llama2");
    CHECK(ak_chat_detect("{{ '[INST]' + x + '[/INST]' }}") == AK_CHAT_MISTRAL, "mistral");
}

TEST(chat_detect_gguf) {
    char path[1024];
    snprintf(path, sizeof path, "%s/chat_tmpl.gguf", test_tmp_dir());
    ak_error err = {{0}};
    gguf_writer *w = gguf_writer_open(path, &err);
    REQUIRE(w, "%s", err.msg);
    gguf_writer_kv_str(w, "general.architecture", "llama");
    gguf_writer_kv_str(w, "tokenizer.chat_template", "{{ '<|im_start|>' + m }}");
    gguf_writer_begin_data(w);
    REQUIRE(gguf_writer_close(w, &err) == 0, "%s", err.msg);
    gguf_file f;
    REQUIRE(gguf_open(&f, path, &err) == 0, "%s", err.msg);
    CHECK(ak_chat_detect_gguf(&f) == AK_CHAT_CHATML, "got %s", ak_chat_family_name(ak_chat_detect_gguf(&f)));
    char *tmpl = ak_chat_template_gguf(&f, &err);
    CHECK(tmpl && strcmp(tmpl, "{{ '<|im_start|>' + m }}") == 0, "template copy");
    free(tmpl);
    gguf_close(&f);

    snprintf(path, sizeof path, "%s/chat_none.gguf", test_tmp_dir());
    w = gguf_writer_open(path, &err);
    REQUIRE(w, "%s", err.msg);
    gguf_writer_kv_str(w, "general.architecture", "llama");
    gguf_writer_begin_data(w);
    REQUIRE(gguf_writer_close(w, &err) == 0, "%s", err.msg);
    REQUIRE(gguf_open(&f, path, &err) == 0, "%s", err.msg);
    CHECK(ak_chat_detect_gguf(&f) == AK_CHAT_PLAIN, "no template -> plain");
    CHECK(ak_chat_template_gguf(&f, &err) == NULL, "no template -> NULL");
    gguf_close(&f);
}

TEST(chat_names_and_end_of_turn) {
    for (int f = AK_CHAT_LLAMA3; f <= AK_CHAT_PLAIN; f++) {
        ak_chat_family back;
        ak_error err = {{0}};
        const char *name = ak_chat_family_name((ak_chat_family)f);
        CHECK(ak_chat_family_parse(name, &back, &err) == 0 && back == (ak_chat_family)f,
              "round trip of %s", name);
        CHECK(ak_chat_end_of_turn((ak_chat_family)f)[0] != '\0', "%s has an end of turn", name);
    }
    ak_chat_family out;
    ak_error err = {{0}};
    CHECK(ak_chat_family_parse("ChatML", &out, &err) == 0 && out == AK_CHAT_CHATML, "case-insensitive");
    CHECK(ak_chat_family_parse("jinja", &out, &err) != 0 && strstr(err.msg, "jinja"), "unknown name");
    CHECK(ak_chat_family_parse(NULL, &out, &err) != 0, "NULL name");
    CHECK(strcmp(ak_chat_end_of_turn(AK_CHAT_LLAMA3), "<|eot_id|>") == 0, "llama3 eot");
    CHECK(strcmp(ak_chat_end_of_turn(AK_CHAT_CHATML), "<|im_end|>") == 0, "chatml eot");
    CHECK(strcmp(ak_chat_end_of_turn(AK_CHAT_GEMMA), "<end_of_turn>") == 0, "gemma eot");
    CHECK(strcmp(ak_chat_end_of_turn(AK_CHAT_PHI3), "<|end|>") == 0, "phi3 eot");
    CHECK(strcmp(ak_chat_end_of_turn(AK_CHAT_MISTRAL), "</s>") == 0, "mistral eot");
}

TEST(chat_gemma_system_message) {
    char *tmpl = read_template("google-gemma-2-2b-it.jinja");
    const ak_chat_msg m[] = {
        {.role = "system", .content = "  Be brief. "},
        {.role = "user", .content = "Hi there\n"},
        {.role = "assistant", .content = " Hello."},
        {.role = "user", .content = "Bye"},
    };
    char *out = NULL;
    ak_error err = {{0}};
    REQUIRE(ak_chat_render(m, 4,
                           &(ak_chat_opts){.family = AK_CHAT_GEMMA, .template_text = tmpl, .add_generation_prompt = 1, .bos = "<bos>", .eos = "<eos>"},
                           &out, &err) == 0, "%s", err.msg);
    same_text(t, "gemma+system", out,
              "<bos><start_of_turn>user\nBe brief. \n\nHi there<end_of_turn>\n"
              "<start_of_turn>model\nHello.<end_of_turn>\n"
              "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
    free(out);
    /* A system message with no user message after it is a user turn of its own. */
    const ak_chat_msg only[] = {{.role = "system", .content = "Rules."}};
    REQUIRE(ak_chat_render(only, 1,
                           &(ak_chat_opts){.family = AK_CHAT_GEMMA, .add_generation_prompt = 1, .bos = "<bos>"},
                           &out, &err) == 0, "%s", err.msg);
    same_text(t, "gemma system only", out,
              "<bos><start_of_turn>user\nRules.<end_of_turn>\n<start_of_turn>model\n");
    free(out);
    free(tmpl);
}

TEST(chat_llama2_plain_and_variants) {
    const ak_chat_msg m[] = {
        {.role = "system", .content = "Sys."},
        {.role = "user", .content = " Q1 "},
        {.role = "assistant", .content = "A1"},
        {.role = "user", .content = "Q2"},
    };
    char *out = NULL;
    ak_error err = {{0}};
    /* The template strips the whole first turn, so the space before Q1 stays. */
    REQUIRE(ak_chat_render(m, 4,
                           &(ak_chat_opts){.family = AK_CHAT_LLAMA2, .add_generation_prompt = 1, .bos = "<s>", .eos = "</s>"},
                           &out, &err) == 0, "%s", err.msg);
    same_text(t, "llama2", out,
              "<s>[INST] <<SYS>>\nSys.\n<</SYS>>\n\n Q1 [/INST] A1 </s><s>[INST] Q2 [/INST]");
    free(out);

    REQUIRE(ak_chat_render(m, 4,
                           &(ak_chat_opts){.family = AK_CHAT_PLAIN, .add_generation_prompt = 1},
                           &out, &err) == 0, "%s", err.msg);
    same_text(t, "plain", out, "System: Sys.\nUser:  Q1 \nAssistant: A1\nUser: Q2\nAssistant:");
    free(out);
    /* a reply echoed back with the space the model generated after "Assistant:" */
    const ak_chat_msg echo[] = { {.role = "user", .content = "Q1"}, {.role = "assistant", .content = " A1"},
                                {.role = "user", .content = "Q2"} };
    REQUIRE(ak_chat_render(echo, 3,
                           &(ak_chat_opts){.family = AK_CHAT_PLAIN, .add_generation_prompt = 1},
                           &out, &err) == 0, "%s", err.msg);
    same_text(t, "plain, echoed reply", out, "User: Q1\nAssistant: A1\nUser: Q2\nAssistant:");
    free(out);

    /* Llama 3.0 template (no date preamble): every message is a header turn. */
    const char *l30 = "{% set content = '<|start_header_id|>' + message['role'] + "
                      "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}";
    REQUIRE(ak_chat_render(m, 2,
                           &(ak_chat_opts){.family = AK_CHAT_LLAMA3, .template_text = l30, .add_generation_prompt = 1, .bos = "<|begin_of_text|>"},
                           &out, &err) == 0,
            "%s", err.msg);
    same_text(t, "llama3.0", out,
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nSys.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nQ1<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(out);

    /* ChatML without a template: no default system message. */
    REQUIRE(ak_chat_render(m + 1, 1,
                           &(ak_chat_opts){.family = AK_CHAT_CHATML, .add_generation_prompt = 1},
                           &out, &err) == 0, "%s", err.msg);
    same_text(t, "chatml bare", out, "<|im_start|>user\n Q1 <|im_end|>\n<|im_start|>assistant\n");
    free(out);

    /* Phi-3 without a generation prompt ends with eos. */
    REQUIRE(ak_chat_render(m + 1, 2,
                           &(ak_chat_opts){.family = AK_CHAT_PHI3, .bos = "<s>", .eos = "<|endoftext|>"},
                           &out, &err) == 0,
            "%s", err.msg);
    same_text(t, "phi3 no gen", out, "<|user|>\n Q1 <|end|>\n<|assistant|>\nA1<|end|>\n<|endoftext|>");
    free(out);

    /* Mistral with a system message not first is refused, as the template does. */
    const ak_chat_msg late[] = {{.role = "user", .content = "a"}, {.role = "system", .content = "b"}};
    CHECK(ak_chat_render(late, 2,
                         &(ak_chat_opts){.family = AK_CHAT_MISTRAL, .add_generation_prompt = 1, .bos = "<s>", .eos = "</s>"},
                         &out, &err) != 0 && !out,
          "mistral late system");
}

TEST(chat_errors) {
    char *out = (char *)1;
    ak_error err = {{0}};
    const ak_chat_msg bad[] = {{.role = "user", .content = "hi"}, {.role = "function", .content = "x"}};
    for (int f = AK_CHAT_LLAMA3; f < AK_CHAT_N_FAMILIES; f++) {
        out = (char *)1;
        err.msg[0] = '\0';
        CHECK(ak_chat_render(bad, 2,
                             &(ak_chat_opts){.family = (ak_chat_family)f, .add_generation_prompt = 1, .bos = "", .eos = ""},
                             &out, &err) != 0,
              "%s accepted role function", ak_chat_family_name((ak_chat_family)f));
        CHECK(out == NULL && strstr(err.msg, "function"), "%s: err '%s'",
              ak_chat_family_name((ak_chat_family)f), err.msg);
        out = (char *)1;
        CHECK(ak_chat_render(bad, 0,
                             &(ak_chat_opts){.family = (ak_chat_family)f, .add_generation_prompt = 1, .bos = "", .eos = ""},
                             &out, &err) != 0 && !out,
              "%s accepted no messages", ak_chat_family_name((ak_chat_family)f));
        CHECK(ak_chat_render(NULL, 3,
                             &(ak_chat_opts){.family = (ak_chat_family)f, .add_generation_prompt = 1, .bos = "", .eos = ""},
                             &out, &err) != 0,
              "NULL msgs");
    }
    const ak_chat_msg nocontent[] = {{.role = "user"}};
    CHECK(ak_chat_render(nocontent, 1,
                         &(ak_chat_opts){.family = AK_CHAT_CHATML, .add_generation_prompt = 1, .bos = "", .eos = ""},
                         &out, &err) != 0, "NULL content");
    CHECK(ak_chat_render(bad, 1,
                         &(ak_chat_opts){.family = (ak_chat_family)99, .add_generation_prompt = 1, .bos = "", .eos = ""},
                         &out, &err) != 0, "bad family");
}
