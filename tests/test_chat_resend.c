/* test_chat_resend.c - a conversation resent in full is rendered over the
 * agent's own tokens (chat_resend.h), for every family and for SentencePiece
 * and byte-level BPE vocabularies.
 *
 * The histories are built here from the tokenizer alone: a turn's prompt is
 * ak_chat_tokenize of the messages so far (what the server sends when no
 * reply came before), its reply the ids of the reply's text taken one
 * character at a time, so that they are not the ids a re-rendering would
 * give. The references: the rebuilt prompt starts with the whole history
 * (the agent's cache is reused up to its end), what follows is no longer
 * than the newest message rendered alone, and the template wins where it
 * rewrites (nothing replaced).
 */
#include <stdlib.h>
#include <string.h>

#include "text/chat_resend.h"
#include "base/gguf.h"
#include "text/tokenizer.h"
#include "test.h"

ak_tokenizer *test_chatml_tokenizer(ak_test_ctx *t);
ak_tokenizer *test_load_tokenizer(ak_test_ctx *t, const char *rel);

/* ids of text one UTF-8 character at a time (as a model might emit them),
 * appended to (*v, *n). */
static void push_chars(int32_t **v, int *n, const ak_tokenizer *tk, const char *text) {
    for (size_t i = 0; text[i];) {
        size_t k = 1;
        while (((unsigned char)text[i + k] & 0xC0) == 0x80) k++;
        int32_t *ids = NULL;
        size_t m = 0;
        ak_error err = {0};
        if (ak_tokenize(tk, text + i, k, AK_TOK_CONTINUE, &ids, &m, &err) == 0) {
            *v = realloc(*v, sizeof **v * (size_t)(*n + (int)m));
            memcpy(*v + *n, ids, sizeof *ids * m);
            *n += (int)m;
        }
        free(ids);
        i += k;
    }
}

/* The plain prompt of msgs[0..n) (what a first turn sends). */
static int32_t *prompt_of(ak_test_ctx *t, const ak_tokenizer *tk, ak_chat_family f, const ak_chat_msg *m, int n,
                          int gen, int *len) {
    int32_t *ids = NULL;
    size_t k = 0;
    ak_error err = {0};
    if (ak_chat_tokenize(m, n,
                         &(ak_chat_opts){.family = f, .add_generation_prompt = gen},
                         tk, AK_TOK_ADD_SPECIAL, &ids, &k, &err) < 0)
        ak_test_fail(t, __FILE__, __LINE__, "%s: %s", ak_chat_family_name(f), err.msg);
    *len = (int)k;
    return ids;
}

static const char *const replies[] = {
    " \n Sure: make a branch with `git branch NAME`.\n ",
    "\n\n- one\n- two  \n",
    "  ok, done\t",
};

/* Three turns of family f, with a system message, resent in full: at turns
 * 2 and 3 the prompt keeps the whole history and adds no more than the
 * newest message. The history after each turn is the prompt the server
 * would send (the function under test from turn 2 on) and the reply's ids. */
static void three_turns(ak_test_ctx *t, const ak_tokenizer *tk, ak_chat_family f, const char *tk_name) {
    ak_chat_msg m[8] = {
        {.role = "system", .content = "You answer questions about git."},
        {.role = "user", .content = "How do I make a branch?"},
    };
    int n = 2, nh = 0;
    int32_t *hist = prompt_of(t, tk, f, m, n, 1, &nh);
    if (!hist) return;
    static const char *const users[] = {"And then?", "What about merging?"};
    for (int turn = 0; turn < 3; turn++) {
        if (turn > 0) {
            ak_chat_resent rs;
            ak_error err = {0};
            int rc = ak_chat_tokenize_resent(m, n, &(ak_chat_opts){.family = f}, tk, hist, nh, &rs, &err);
            int32_t *ids = rs.ids;
            size_t k = rs.n_ids;
            int replaced = rs.n_replaced;
            CHECK(rc == 0, "%s/%s: %s", ak_chat_family_name(f), tk_name, err.msg);
            int kept = 0;
            while (ids && kept < nh && kept < (int)k && ids[kept] == hist[kept]) kept++;
            CHECK(replaced == turn && kept == nh, "%s/%s turn %d: %d of %d replies replaced, %d of the %d history tokens kept",
                  ak_chat_family_name(f), tk_name, turn + 1, replaced, turn, kept, nh);
            /* what follows the history: the rendering's text after the last
             * reply (as the template put it: trimmed by some) */
            char *text = NULL;
            REQUIRE(ak_chat_render(m, n,
                                   &(ak_chat_opts){.family = f, .add_generation_prompt = 1},
                                   &text, &err) == 0, "%s", err.msg);
            const char *last = replies[turn - 1];
            size_t a = 0, z = strlen(last);
            while (a < z && strchr(" \t\n", last[a])) a++;
            while (z > a && strchr(" \t\n", last[z - 1])) z--;
            char *shown = strndup(last + a, z - a), *at = NULL;
            for (char *p = text; (p = strstr(p, shown)) != NULL; p++) at = p;
            int32_t *tail = NULL;
            size_t nt = 0;
            if (at) {
                at += strlen(shown);
                while (*at && strchr(" \t\n", *at) && at < text + strlen(text) && !strncmp(at, last + z, 1)) at++;
                ak_tokenize(tk, at, strlen(at), AK_TOK_PARSE_SPECIAL | AK_TOK_CONTINUE, &tail, &nt, &err);
            }
            CHECK(ids && at && (int)k - nh <= (int)nt + 1, "%s/%s turn %d: %d tokens after the history, the text after the reply is %zu",
                  ak_chat_family_name(f), tk_name, turn + 1, (int)k - nh, nt);
            free(tail);
            free(shown);
            free(text);
            if (ids) {
                free(hist);
                hist = ids;
                nh = (int)k;
            }
        }
        push_chars(&hist, &nh, tk, replies[turn]);
        if (turn == 2) break;
        m[n++] = (ak_chat_msg){.role = "assistant", .content = replies[turn]};
        m[n++] = (ak_chat_msg){.role = "user", .content = users[turn]};
    }
    free(hist);
}

TEST(chat_resend_every_family_keeps_the_history) {
    ak_tokenizer *spm = test_load_tokenizer(t, "models/tiny-llama-h64-gqa-f32.gguf");
    ak_tokenizer *bpe = test_load_tokenizer(t, "models/qwen3-tiny.gguf");
    ak_tokenizer *ctl = test_chatml_tokenizer(t);
    REQUIRE(spm && bpe && ctl, "tokenizers");
    for (int f = AK_CHAT_LLAMA3; f <= AK_CHAT_PLAIN; f++) {
        if (f == AK_CHAT_MISTRAL) continue;   /* moves the system message: below */
        three_turns(t, spm, (ak_chat_family)f, "spm");
        three_turns(t, bpe, (ak_chat_family)f, "bpe");
        three_turns(t, ctl, (ak_chat_family)f, "chatml-control");
    }
    ak_tokenizer_free(spm);
    ak_tokenizer_free(bpe);
    ak_tokenizer_free(ctl);
}

/* A conversation resent over an agent's history: messages m[0..n) in
 * family f, the history hist[0..nh). */
typedef struct {
    ak_chat_family f;
    const ak_chat_msg *m;
    int n;
    const int32_t *hist;
    int nh;
} resend_case;

/* Rebuilds c's messages over its history; returns how many replies were
 * replaced (-1 on error, recorded in t) and the common prefix with the
 * history in *kept; the rebuilt ids in *out (*nout of them, the caller
 * frees) when out is not NULL. */
static int rebuild(ak_test_ctx *t, const ak_tokenizer *tk, const resend_case *c, int *kept, int32_t **out,
                   size_t *nout) {
    ak_chat_family f = c->f;
    const ak_chat_msg *m = c->m;
    int n = c->n, nh = c->nh;
    const int32_t *hist = c->hist;
    ak_chat_resent rs;
    ak_error err = {0};
    if (ak_chat_tokenize_resent(m, n, &(ak_chat_opts){.family = f}, tk, hist, nh, &rs, &err) < 0) {
        ak_test_fail(t, __FILE__, __LINE__, "%s", err.msg);
        return -1;
    }
    int32_t *ids = rs.ids;
    size_t k = rs.n_ids;
    int replaced = rs.n_replaced;
    *kept = 0;
    while (ids && *kept < nh && *kept < (int)k && ids[*kept] == hist[*kept]) (*kept)++;
    if (out) {
        *out = ids;
        *nout = k;
    } else {
        free(ids);
    }
    return replaced;
}

TEST(chat_resend_only_the_very_text) {
    ak_tokenizer *tk = test_load_tokenizer(t, "models/tiny-llama-h64-gqa-f32.gguf");
    REQUIRE(tk, "tokenizer");
    ak_chat_msg m[3] = {{.role = "user", .content = "Tell me about git."},
                        {.role = "assistant", .content = " Git tracks files.\n"},
                        {.role = "user", .content = "More?"}};
    for (int f = AK_CHAT_LLAMA3; f <= AK_CHAT_PLAIN; f++) {
        int np = 0, kept = 0;
        int32_t *hist = prompt_of(t, tk, (ak_chat_family)f, m, 1, 1, &np);
        REQUIRE(hist, "prompt");
        int nh = np;
        push_chars(&hist, &nh, tk, " Git tracks files.\n");
        const char *name = ak_chat_family_name(f);
        resend_case c = {.f = f, .m = m, .n = 3, .hist = hist, .nh = nh};
        /* the same text: replaced */
        CHECK(rebuild(t, tk, &c, &kept, NULL, NULL) == 1 && kept == nh, "%s: the reply was not replaced", name);
        /* an edited reply, one cut short (a stop string cut there: the ids
         * up to it stand for it), one going on past where the history
         * ends (a turn cut by max_tokens: the history is kept whole), a
         * different one: replaced only when the history's ids decode to
         * the text as far as they go */
        static const char *const edited[] = {" Git tracks files!\n", " Git tracks", " Git tracks files.\n\n", "x"};
        for (int e = 0; e < 4; e++) {
            ak_chat_msg m2[3] = {m[0], {.role = "assistant", .content = edited[e]}, m[2]};
            int r = rebuild(t, tk, &(resend_case){.f = f, .m = m2, .n = 3, .hist = hist, .nh = nh}, &kept, NULL, NULL);
            if (e == 1) CHECK(r == 1 && kept >= np + 1, "%s: a reply cut by a stop string: %d replaced, %d kept", name, r, kept);
            else if (e == 2) CHECK(r == 1 && kept == nh, "%s: a reply past the history: %d replaced, %d kept", name, r, kept);
            else CHECK(r == 0, "%s: edited reply %d replaced", name, e);
        }
        /* another history (another agent's, or this one's before the
         * reply): nothing replaced */
        c.nh = np - 1;
        CHECK(rebuild(t, tk, &c, &kept, NULL, NULL) == 0, "%s: replaced over a shorter prefix", name);
        /* a turn cut by max_tokens: the history lacks the last token sampled;
         * the reply's text goes on past it: the history is kept whole */
        c.nh = nh - 1;
        CHECK(rebuild(t, tk, &c, &kept, NULL, NULL) == 1 && kept == nh - 1,
              "%s: a history ending inside the reply was not kept", name);
        free(hist);
    }
    ak_tokenizer_free(tk);
}

/* Where the template rewrites earlier turns or the reply, it wins. */
TEST(chat_resend_template_wins) {
    ak_tokenizer *tk = test_load_tokenizer(t, "models/qwen3-tiny.gguf");
    REQUIRE(tk, "tokenizer");
    int np = 0, nh = 0, kept = 0;
    /* qwen3 drops the reasoning of replies before the last user message */
    const char *reply = "<think>\nfirst this\n</think>\n\nThe answer.";
    ak_chat_msg q[3] = {{.role = "user", .content = "Why?"}, {.role = "assistant", .content = reply},
                        {.role = "user", .content = "And?"}};
    int32_t *hist = prompt_of(t, tk, AK_CHAT_QWEN3, q, 1, 1, &np);
    REQUIRE(hist, "prompt");
    nh = np;
    push_chars(&hist, &nh, tk, reply);
    resend_case c = {.f = AK_CHAT_QWEN3, .m = q, .n = 3, .hist = hist, .nh = nh};
    CHECK(rebuild(t, tk, &c, &kept, NULL, NULL) == 0, "qwen3: a reasoning reply was replaced");
    CHECK(kept < nh, "qwen3: the reasoning should be gone from the prompt");
    free(hist);
    /* mistral puts the system message before the last user message: the
     * first turn's prompt is no prefix of the second's */
    ak_chat_msg s[4] = {{.role = "system", .content = "Be brief."}, {.role = "user", .content = "Hi"},
                        {.role = "assistant", .content = " Hello\n"}, {.role = "user", .content = "Bye"}};
    hist = prompt_of(t, tk, AK_CHAT_MISTRAL, s, 2, 1, &np);
    REQUIRE(hist, "prompt");
    nh = np;
    push_chars(&hist, &nh, tk, " Hello\n");
    c = (resend_case){.f = AK_CHAT_MISTRAL, .m = s, .n = 4, .hist = hist, .nh = nh};
    CHECK(rebuild(t, tk, &c, &kept, NULL, NULL) == 0, "mistral: replaced across a moved system message");
    free(hist);
    /* without a system message mistral keeps its replies */
    hist = prompt_of(t, tk, AK_CHAT_MISTRAL, s + 1, 1, 1, &np);
    REQUIRE(hist, "prompt");
    nh = np;
    push_chars(&hist, &nh, tk, " Hello\n");
    c = (resend_case){.f = AK_CHAT_MISTRAL, .m = s + 1, .n = 3, .hist = hist, .nh = nh};
    CHECK(rebuild(t, tk, &c, &kept, NULL, NULL) == 1 && kept == nh,
          "mistral without a system message: the reply was not replaced");
    free(hist);
    ak_tokenizer_free(tk);
}

/* With nothing to replace the caller's prompt stands; with replies the
 * prompt still means the conversation as sent: its text, decoded, is the
 * rendering with each reply's own text in place. */
TEST(chat_resend_prompt_means_the_conversation) {
    ak_tokenizer *tk = test_load_tokenizer(t, "models/qwen3-tiny.gguf");
    REQUIRE(tk, "tokenizer");
    ak_chat_msg m[3] = {{.role = "user", .content = "Hi"}, {.role = "assistant", .content = "\n Hello there \n"},
                        {.role = "user", .content = "Bye"}};
    int np = 0;
    int32_t *hist = prompt_of(t, tk, AK_CHAT_LLAMA3, m, 1, 1, &np);
    REQUIRE(hist, "prompt");
    int nh = np, kept = 0;
    push_chars(&hist, &nh, tk, m[1].content);
    int32_t *ids = NULL;
    size_t k = 0;
    const resend_case c = {.f = AK_CHAT_LLAMA3, .m = m, .n = 3, .hist = hist, .nh = nh};
    REQUIRE(rebuild(t, tk, &c, &kept, &ids, &k) == 1, "llama3: not replaced");
    ak_error err = {0};
    char *text = ak_detokenize(tk, ids, k, NULL, &err);
    /* llama3's template trims content: the rebuilt prompt holds the reply
     * untrimmed, as generated, and the rest as rendered */
    const char *want = "<|start_header_id|>assistant<|end_header_id|>\n\n\n Hello there \n<|eot_id|>"
                       "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\n";
    CHECK(text && strlen(text) >= strlen(want) && !strcmp(text + strlen(text) - strlen(want), want),
          "llama3: the prompt's text ends %s", text ? text : "(none)");
    free(text);
    free(ids);
    free(hist);
    ak_tokenizer_free(tk);
}

/* A reply with tool calls, resent as the client got it (its text, reasoning
 * and calls as fields): the history stands for it when it decodes to the
 * turn as the template renders it, calls and all (the agent's cache is
 * reused past the call, the tool's result is all that is new); a reply the
 * template writes otherwise (JSON spaced differently) stays rendered. The
 * replies are written out here as each model writes them. */
TEST(chat_resend_replies_with_calls) {
    ak_tokenizer *tk = test_chatml_tokenizer(t);
    REQUIRE(tk, "tokenizer");
#define DSM(x) "<\xef\xbd\x9c" x "\xef\xbd\x9c>"
    static const struct {
        ak_chat_family f;
        const char *content, *reasoning, *reply;
        int replaced;
    } cases[] = {
        {AK_CHAT_CHATML, "Checking.", NULL,
         "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", 1},
        {AK_CHAT_CHATML, NULL, NULL, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
         1},
        {AK_CHAT_QWEN3, NULL, "Look it up.",
         "<think>\nLook it up.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
         "</tool_call>", 1},
        {AK_CHAT_LLAMA3, NULL, NULL, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", 1},
        {AK_CHAT_DEEPSEEK3, "Checking.", NULL,
         "Checking." DSM("tool\xe2\x96\x81" "calls\xe2\x96\x81" "begin") DSM("tool\xe2\x96\x81" "call\xe2\x96\x81" "begin")
         "get_weather" DSM("tool\xe2\x96\x81sep") "{\"city\": \"Paris\"}" DSM("tool\xe2\x96\x81" "call\xe2\x96\x81" "end")
         DSM("tool\xe2\x96\x81" "calls\xe2\x96\x81" "end"), 1},
        {AK_CHAT_CHATML, NULL, NULL, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>", 0},
    };
#undef DSM
    const ak_chat_call call = {.id = "call_1", .name = "get_weather", .arguments = "{\"city\": \"Paris\"}"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const ak_chat_msg m[] = {{.role = "user", .content = "Weather in Paris?"},
                                 {.role = "assistant", .content = cases[i].content, .reasoning = cases[i].reasoning,
                                  .calls = &call, .n_calls = 1},
                                 {.role = "tool", .tool_call_id = "call_1", .content = "21 C"}};
        int nh = 0, kept = 0;
        int32_t *hist = prompt_of(t, tk, cases[i].f, m, 1, 1, &nh);
        REQUIRE(hist, "prompt");
        push_chars(&hist, &nh, tk, cases[i].reply);
        const resend_case c = {.f = cases[i].f, .m = m, .n = 3, .hist = hist, .nh = nh};
        int r = rebuild(t, tk, &c, &kept, NULL, NULL);
        CHECK(r == cases[i].replaced && (!r || kept == nh), "%s case %zu: %d replaced (want %d), %d of %d history tokens kept",
              ak_chat_family_name(cases[i].f), i, r, cases[i].replaced, kept, nh);
        free(hist);
    }
    ak_tokenizer_free(tk);
}
