/* test_cli.c - the agentkv binary end to end: output against the golden
 * references, exit codes, and one-line errors on bad flags and bad files. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>

#include "kv/kvformat.h"
#include "engine/model.h"
#include "base/util.h"
#include "test.h"

typedef test_cli_result cmd_result;

/* Runs `agentkv ARGS` through the shell, capturing stdout and stderr; a run
 * past 300 s is killed (code 124, or 137 when SIGTERM was not enough). */
static cmd_result run_cli(const char *args) { return test_cli_run(args, 300); }

static void free_result(cmd_result *r) { test_cli_free(r); }

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

TEST(cli_run_greedy_matches_golden) {
    cJSON *g = test_first_golden("golden/stories260K/greedy.jsonl");
    REQUIRE(g, "cannot read the golden file");
    char args[1024], path[512];
    snprintf(args, sizeof args, "run -m %s -p '%s' -n %d --temp 0",
             test_path(path, sizeof path, "models/stories260K.gguf"),
             cJSON_GetObjectItem(g, "prompt")->valuestring, cJSON_GetObjectItem(g, "n_predict")->valueint);
    cmd_result r = run_cli(args);
    CHECK(r.code == 0, "exit %d: %s", r.code, r.err);
    const char *cont = cJSON_GetObjectItem(g, "continuation")->valuestring;
    size_t cl = strlen(cont);
    CHECK(strncmp(r.out, cont, cl) == 0 && !strcmp(r.out + cl, "\n"), "stdout \"%s\" != golden \"%s\"", r.out, cont);
    CHECK(strstr(r.err, "prefill") && strstr(r.err, "decode") && strstr(r.err, "tok/s"), "no timings on stderr: %s",
          r.err);
    free_result(&r);

    snprintf(args, sizeof args, "run -m %s -p '%s' -n %d --temp 0 --json",
             test_path(path, sizeof path, "models/stories260K.gguf"),
             cJSON_GetObjectItem(g, "prompt")->valuestring, cJSON_GetObjectItem(g, "n_predict")->valueint);
    r = run_cli(args);
    cJSON *j = cJSON_Parse(r.out);
    CHECK(r.code == 0 && j, "exit %d, stdout not JSON: %s", r.code, r.out);
    if (j) {
        cJSON *text = cJSON_GetObjectItem(j, "text"), *gen = cJSON_GetObjectItem(j, "generated_tokens");
        CHECK(cJSON_IsString(text) && !strcmp(text->valuestring, cont), "json text differs from golden");
        CHECK(cJSON_IsNumber(gen) && gen->valueint == cJSON_GetObjectItem(g, "n_predict")->valueint,
              "generated_tokens wrong");
        CHECK(cJSON_GetObjectItem(j, "prompt_tokens") && cJSON_GetObjectItem(j, "timings"), "fields missing");
        cJSON_Delete(j);
    }
    free_result(&r);
    cJSON_Delete(g);
}

TEST(cli_run_seed_is_deterministic) {
    char args[1024], path[512];
    snprintf(args, sizeof args, "run -m %s -p 'Once upon a time' -n 40 --temp 0.9 --top-k 50 --seed 1234",
             test_path(path, sizeof path, "models/stories260K.gguf"));
    cmd_result a = run_cli(args), b = run_cli(args);
    CHECK(a.code == 0 && b.code == 0, "exit %d / %d: %s", a.code, b.code, a.err);
    CHECK(strlen(a.out) > 20 && !strcmp(a.out, b.out), "same seed, different output:\n%s\n%s", a.out, b.out);
    free_result(&a);
    free_result(&b);
}

TEST(cli_tokenize_matches_reference) {
    /* first vector of the llama-spm tokenizer tests */
    char path[512], inp[512], args[2048];
    char *in = ak_read_file(test_path(path, sizeof path, "golden/tokenizer/llama-spm.inp"), NULL, NULL);
    char *out = ak_read_file(test_path(path, sizeof path, "golden/tokenizer/llama-spm.out"), NULL, NULL);
    REQUIRE(in && out, "cannot read test vectors");
    char *sep = strstr(in, "\n__ggml_vocab_test__\n");
    REQUIRE(sep, "no separator");
    *sep = 0;
    char *nl = strchr(out, '\n');
    if (nl) *nl = 0;
    snprintf(inp, sizeof inp, "%s/tok.txt", test_tmp_dir());
    FILE *f = fopen(inp, "wb");
    REQUIRE(f, "cannot write %s", inp);
    fputs(in, f);
    fclose(f);
    snprintf(args, sizeof args, "tokenize -m %s -f %s --no-bos",
             test_path(path, sizeof path, "golden/tokenizer/llama-spm.gguf"), inp);
    cmd_result r = run_cli(args);
    CHECK(r.code == 0, "exit %d: %s", r.code, r.err);
    /* the reference line may carry a leading space */
    const char *want = out;
    while (*want == ' ') want++;
    char *got = r.out;
    size_t gl = strlen(got);
    while (gl && (got[gl - 1] == '\n' || got[gl - 1] == ' ')) got[--gl] = 0;
    CHECK(!strcmp(got, want), "tokenize gave \"%s\", reference \"%s\"", got, want);
    free_result(&r);
    free(in);
    free(out);
}

TEST(cli_perplexity_matches_reference) {
    char args[1024], path[512], path2[512];
    snprintf(args, sizeof args, "perplexity -m %s -f %s -c 128",
             test_path(path, sizeof path, "models/stories260K.gguf"),
             test_path(path2, sizeof path2, "golden/stories260K/story.txt"));
    cmd_result r = run_cli(args);
    CHECK(r.code == 0, "exit %d: %s", r.code, r.err);
    double ppl = 0;
    const char *p = strstr(r.out, "PPL = ");
    CHECK(p && sscanf(p, "PPL = %lf", &ppl) == 1, "no 'PPL = X' in: %s", r.out);
    CHECK(fabs(ppl - 4.0278) / 4.0278 <= 0.002, "PPL %.4f vs reference 4.0278", ppl);
    free_result(&r);
}

TEST(cli_help_and_usage_errors) {
    const char *cmds[] = {"run", "tokenize", "info", "perplexity", "synth", "bench engine"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char args[256];
        snprintf(args, sizeof args, "%s --help", cmds[i]);
        cmd_result r = run_cli(args);
        CHECK(r.code == 0 && strstr(r.out, "usage:"), "%s --help: exit %d, out %s", cmds[i], r.code, r.out);
        free_result(&r);
        snprintf(args, sizeof args, "%s --no-such-flag", cmds[i]);
        r = run_cli(args);
        CHECK(r.code == 2 && count_lines(r.err) == 1 && strstr(r.err, "--no-such-flag"),
              "%s with an unknown flag: exit %d, stderr %s", cmds[i], r.code, r.err);
        free_result(&r);
    }
    const char *bad[] = {"run -m x.gguf -p hi -n abc", "run -m x.gguf -p hi --temp -1", "run -p hi",
                         "run -m x.gguf", "perplexity -m x.gguf -f y -c 0", "no-such-command", "run -m"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cmd_result r = run_cli(bad[i]);
        CHECK(r.code == 2 && count_lines(r.err) == 1, "'%s': exit %d, stderr %s", bad[i], r.code, r.err);
        free_result(&r);
    }
}

/* ---- bad model files, made by damaging a real one ------------------------ */

static unsigned char *load_stories(size_t *n) {
    char path[512];
    return (unsigned char *)ak_read_file(test_path(path, sizeof path, "models/stories260K.gguf"), n, NULL);
}

static const char *write_tmp(const char *name, const unsigned char *data, size_t n) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", test_tmp_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    fwrite(data, 1, n, f);
    fclose(f);
    return path;
}

static unsigned char *find_bytes(unsigned char *hay, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(hay + i, needle, k)) return hay + i;
    return NULL;
}

/* Runs `agentkv run` on a damaged file; expects exit 1 and one stderr line
 * that names the file and contains `why`. */
static void expect_bad_model(ak_test_ctx *t, const char *name, const unsigned char *data, size_t n,
                             const char *why) {
    const char *path = write_tmp(name, data, n);
    REQUIRE(path, "cannot write %s", name);
    char args[1024];
    snprintf(args, sizeof args, "run -m %s -p hello -n 4", path);
    cmd_result r = run_cli(args);
    CHECK(r.code == 1, "%s: exit %d (want 1), stderr %s", name, r.code, r.err);
    CHECK(count_lines(r.err) == 1, "%s: want one line on stderr, got: %s", name, r.err);
    CHECK(strstr(r.err, name) != NULL, "%s: message does not name the file: %s", name, r.err);
    CHECK(strstr(r.err, why) != NULL, "%s: message lacks '%s': %s", name, why, r.err);
    free_result(&r);
}

TEST(cli_bad_model_files) {
    size_t n;
    unsigned char *orig = load_stories(&n);
    REQUIRE(orig && n > 4096, "cannot read stories260K.gguf");
    unsigned char *b = malloc(n);
    REQUIRE(b, "oom");

    memcpy(b, orig, n);
    expect_bad_model(t, "truncated.gguf", b, 1000, "truncated");

    memcpy(b, orig, n);
    b[0] = 'X';
    expect_bad_model(t, "magic.gguf", b, n, "magic");

    /* cutting the end off leaves the last tensor pointing past the file */
    expect_bad_model(t, "short.gguf", orig, n - 100, "past the end");

    memcpy(b, orig, n);
    uint64_t huge = 1ull << 62;
    memcpy(b + 16, &huge, 8); /* n_kv */
    expect_bad_model(t, "count.gguf", b, n, "absurd");

    memcpy(b, orig, n);
    unsigned char *k = find_bytes(b, n, "llama.embedding_length");
    REQUIRE(k, "key not found");
    k[strlen("llama.embedding_length") - 1] = 'X';
    expect_bad_model(t, "nokey.gguf", b, n, "llama.embedding_length");

    /* tensor type: after the name come n_dims (u32), ne (u64 each), type */
    memcpy(b, orig, n);
    unsigned char *tn = find_bytes(b, n, "output_norm.weight");
    REQUIRE(tn, "tensor not found");
    uint32_t nd;
    memcpy(&nd, tn + strlen("output_norm.weight"), 4);
    uint32_t bad_type = 99;
    memcpy(tn + strlen("output_norm.weight") + 4 + 8 * nd, &bad_type, 4);
    expect_bad_model(t, "ttype.gguf", b, n, "type");

    /* BOS id out of range */
    memcpy(b, orig, n);
    unsigned char *bos = find_bytes(b, n, "tokenizer.ggml.bos_token_id");
    REQUIRE(bos, "bos key not found");
    uint32_t big = 99999;
    memcpy(bos + strlen("tokenizer.ggml.bos_token_id") + 4, &big, 4);
    expect_bad_model(t, "bosid.gguf", b, n, "99999");

    /* a block count far beyond the file's tensors: refused at once, not
     * believed (it cost a fuzzer seconds and a gigabyte per input) */
    memcpy(b, orig, n);
    unsigned char *bc = find_bytes(b, n, "llama.block_count");
    REQUIRE(bc, "block_count key not found");
    uint32_t many = 2097153;
    memcpy(bc + strlen("llama.block_count") + 4, &many, 4);   /* after the value type (u32) */
    expect_bad_model(t, "layers.gguf", b, n, "2097153 layers");

    cmd_result r = run_cli("run -m /nonexistent/model.gguf -p hi");
    CHECK(r.code == 1 && count_lines(r.err) == 1 && strstr(r.err, "/nonexistent/model.gguf"),
          "missing file: exit %d, %s", r.code, r.err);
    free_result(&r);
    free(b);
    free(orig);
}

TEST(cli_run_agent_restores_warm_across_processes) {
    char args[2048], path[512], dir[512];
    snprintf(dir, sizeof dir, "%s/cli-mem", test_tmp_dir());
    const char *model = test_path(path, sizeof path, "models/stories260K.gguf");
    snprintf(args, sizeof args, "run -m %s --agent planner --memory-dir %s -ctk q8 -ctv tq3 -p 'Once upon a time' -n 16 --temp 0",
             model, dir);
    cmd_result r1 = run_cli(args);
    CHECK(r1.code == 0 && strstr(r1.err, "tier=cold"), "first run: exit %d, %s", r1.code, r1.err);
    /* the second prompt extends the first one and its continuation */
    char prompt2[1024];
    char *nl = strchr(r1.out, '\n');
    if (nl) *nl = 0;
    snprintf(prompt2, sizeof prompt2, "Once upon a time%s. The end", r1.out);
    snprintf(args, sizeof args, "run -m %s --agent planner --memory-dir %s -ctk q8 -ctv tq3 -p '%s' -n 8 --temp 0",
             model, dir, prompt2);
    cmd_result r2 = run_cli(args);
    int reused = 0, prefilled = 0;
    const char *p = strstr(r2.err, "reused=");
    if (p) sscanf(p, "reused=%d prefilled=%d", &reused, &prefilled);
    CHECK(r2.code == 0 && strstr(r2.err, "tier=warm") && strstr(r2.err, "match=extend"), "second run: exit %d, %s",
          r2.code, r2.err);
    CHECK(reused > 10 && prefilled > 0 && prefilled < 8, "reused %d prefilled %d", reused, prefilled);
    /* same output as a plain run of the full prompt with the same cache format */
    snprintf(args, sizeof args, "run -m %s -ctk q8 -ctv tq3 -p '%s' -n 8 --temp 0", model, prompt2);
    cmd_result r3 = run_cli(args);
    CHECK(r3.code == 0 && !strcmp(r2.out, r3.out), "restored run \"%s\" != plain run \"%s\"", r2.out, r3.out);
    /* the file is readable by an independent safetensors reader */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "timeout -k 5 60 python3 tests/check_safetensors.py %s/planner.safetensors >/dev/null", dir);
    CHECK(system(cmd) == 0, "check_safetensors.py rejected the agent file");
    snprintf(args, sizeof args, "cache ls --memory-dir %s", dir);
    cmd_result r4 = run_cli(args);
    CHECK(r4.code == 0 && strstr(r4.out, "planner"), "cache ls: %s", r4.out);
    snprintf(args, sizeof args, "cache verify --memory-dir %s -m %s", dir, model);
    cmd_result r5 = run_cli(args);
    CHECK(r5.code == 0 && strstr(r5.out, "planner") && strstr(r5.out, "ok"), "cache verify: %s %s", r5.out, r5.err);
    snprintf(args, sizeof args, "run -m %s --agent ../evil --memory-dir %s -p hi", model, dir);
    cmd_result r6 = run_cli(args);
    CHECK(r6.code == 2 && strstr(r6.err, "invalid id"), "hostile agent id: exit %d %s", r6.code, r6.err);
    cmd_result *rs[] = {&r1, &r2, &r3, &r4, &r5, &r6};
    for (int i = 0; i < 6; i++) free_result(rs[i]);
}

TEST(cli_cache_flags_bad_input) {
    char args[1024], path[512];
    const char *model = test_path(path, sizeof path, "models/stories260K.gguf");
    struct { const char *flags; int code; const char *want; } cases[] = {
        {.flags = "-ctk q5_9", .code = 2, .want = "unknown cache format"},
        {.flags = "-ctv nope", .code = 2, .want = "unknown cache format"},
        {.flags = "--kv-budget 0", .code = 2, .want = "positive byte size"},
        {.flags = "--kv-budget lots", .code = 2, .want = "positive byte size"},
        {.flags = "-c 999999", .code = 1, .want = "longer than the model"},
        {.flags = "--kv-budget 1K", .code = 1, .want = "KV budget exhausted"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "run -m %s -p 'Once upon a time' -n 4 %s", model, cases[i].flags);
        cmd_result r = run_cli(args);
        CHECK(r.code == cases[i].code && count_lines(r.err) == 1 && strstr(r.err, cases[i].want),
              "'%s': exit %d (want %d), stderr: %s", cases[i].flags, r.code, cases[i].code, r.err);
        free_result(&r);
    }
    /* every format runs end to end */
    const char *fmts[] = {"f32", "f16", "bf16", "q8", "q4", "q2", "tq4", "tq3", "tq2"};
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        snprintf(args, sizeof args, "run -m %s -p 'Once upon a time' -n 8 --temp 0 -ctk q8 -ctv %s", model, fmts[i]);
        cmd_result r = run_cli(args);
        CHECK(r.code == 0 && strlen(r.out) > 8, "-ctv %s: exit %d %s", fmts[i], r.code, r.err);
        free_result(&r);
    }
}

/* `bench engine --json`: one JSON object with positive speeds, and the copy
 * measurement's fields numbers when it ran and null under --no-copy-bench
 * (they once read 0, a figure nobody measured). */
TEST(cli_bench_engine_json) {
    char args[1024], path[512];
    const char *model = test_path(path, sizeof path, "models/stories260K.gguf");
    for (int no_copy = 0; no_copy < 2; no_copy++) {
        snprintf(args, sizeof args, "bench engine -m %s -p 8 -n 8 -r 1 --batch 2 --json%s", model,
                 no_copy ? " --no-copy-bench" : "");
        cmd_result r = run_cli(args);
        cJSON *j = r.code == 0 ? cJSON_Parse(r.out) : NULL;
        CHECK(j, "%s: exit %d, not one JSON object: %s %s", args, r.code, r.out, r.err);
        if (j) {
            const char *copy_fields[] = {"copy_gb_s", "read_gb_s", "tg_bw_pct", "batch_bw_pct"};
            for (int i = 0; i < 4; i++) {
                cJSON *f = cJSON_GetObjectItem(j, copy_fields[i]);
                CHECK(no_copy ? cJSON_IsNull(f) : cJSON_IsNumber(f) && f->valuedouble > 0,
                      "%s%s: %s", copy_fields[i], no_copy ? " under --no-copy-bench" : "", r.out);
            }
            double b1 = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "batch1_tok_s"));
            double bn = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "batch_tok_s"));
            double ratio = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "batch_ratio"));
            CHECK(b1 > 0 && bn > 0 && ratio > 0 && cJSON_GetNumberValue(cJSON_GetObjectItem(j, "pp_tok_s")) > 0 &&
                      cJSON_GetNumberValue(cJSON_GetObjectItem(j, "tg_tok_s")) > 0,
                  "figures must be positive: %s", r.out);
            cJSON_Delete(j);
        }
        free_result(&r);
    }
}

/* `bench pools --json` on a tiny model: the memory invariants the
 * benchmark exists to show, as exact equalities (no speeds): pooled agents
 * hold the pool once and only their own tokens (the floor, to the byte, for
 * whole blocks), the content index shares as much, private copies are N
 * times one agent, and pooled and private caches give the same logits. */
TEST(cli_bench_pools_invariants) {
    char args[1024], path[512];
    snprintf(args, sizeof args,
             "bench pools -m %s --pool-tokens 512 --suffix 32 --agents 1,2,3 --decode-agents 2 --reps 1 --ttft-reps 1 --json",
             test_path(path, sizeof path, "models/tiny-llama-h64-gqa-f32.gguf"));
    cmd_result r = run_cli(args);
    cJSON *j = r.code == 0 ? cJSON_Parse(r.out) : NULL;
    CHECK(j, "exit %d, not one JSON object: %s %s", r.code, r.out, r.err);
    if (j) {
        double bpt = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "bytes_per_token"));
        double one = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "private_agent_bytes"));
        cJSON *mem = cJSON_GetObjectItem(j, "memory"), *row;
        int rows = 0;
        cJSON_ArrayForEach(row, mem) {
            double n = cJSON_GetNumberValue(cJSON_GetObjectItem(row, "agents"));
            double pooled = cJSON_GetNumberValue(cJSON_GetObjectItem(row, "pooled_bytes"));
            double index = cJSON_GetNumberValue(cJSON_GetObjectItem(row, "content_index_bytes"));
            double priv = cJSON_GetNumberValue(cJSON_GetObjectItem(row, "private_copies_bytes"));
            CHECK(pooled == bpt * (512 + n * 32), "%g agents: %g bytes held, floor %g", n, pooled, bpt * (512 + n * 32));
            CHECK(index == pooled, "%g agents: content index %g bytes vs pool %g", n, index, pooled);
            CHECK(priv == n * one, "%g agents: private copies %g, not %g x %g", n, priv, n, one);
            rows++;
        }
        CHECK(rows == 3, "%d memory rows", rows);
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "first_logits_max_diff")) == 0 &&
                  cJSON_GetNumberValue(cJSON_GetObjectItem(j, "decode_logits_max_diff")) == 0,
              "pooled and private logits differ: %s", r.out);
        CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "private_copies_unshared")), "private copies shared blocks");
        cJSON_Delete(j);
    }
    free_result(&r);
}

/* `bench cards --quality` on the trained tiny model: the chain runs (its
 * 16-bit gate inside the command makes it exit non-zero when a lossless
 * chain is not lossless), more bits lose less, and a uniform 4-bit card
 * takes exactly the bytes its formats say (q4 keys, tq4 values). */
TEST(cli_bench_cards_quality_json) {
    char args[1536], path[512], text[512], out[600];
    const char *model = test_path(path, sizeof path, "models/tiny-llama-h64-gqa-f32.gguf");
    snprintf(out, sizeof out, "%s/cards-quality.json", test_tmp_dir());
    snprintf(args, sizeof args, "bench cards --quality -m %s --text %s --windows 1 --budgets 4,8 -t 2 --json-out %s",
             model, test_path(text, sizeof text, "golden/tiny-llama-h64/val.txt"), out);
    cmd_result r = run_cli(args);
    CHECK(r.code == 0, "exit %d: %s", r.code, r.err);
    size_t n = 0;
    char *js = ak_read_file(out, &n, NULL);
    cJSON *j = js ? cJSON_Parse(js) : NULL;
    free(js);
    free_result(&r);
    REQUIRE(j, "no JSON in %s", out);
    ak_error err = {{0}};
    ak_model *m = ak_model_load(model, NULL, NULL, &err);
    REQUIRE(m, "%s", err.msg);
    double want = (double)m->spec.n_layer * m->spec.n_head_kv *
                  (double)(ak_kv_format_get(AK_KV_Q4)->vec_bytes(m->spec.head_dim_k) +
                           ak_kv_format_get(AK_KV_TQ4)->vec_bytes(m->spec.head_dim_v));
    ak_model_free(m);
    double kl4 = -1, kl8 = -1;
    cJSON *row;
    cJSON_ArrayForEach(row, cJSON_GetObjectItem(j, "rows")) {
        const char *pol = cJSON_GetStringValue(cJSON_GetObjectItem(row, "policy"));
        double b = cJSON_GetNumberValue(cJSON_GetObjectItem(row, "budget"));
        double kl = cJSON_GetNumberValue(cJSON_GetObjectItem(row, "mean_kl"));
        CHECK(kl >= 0 && kl < 0.1, "%s at %g bits: KL %g", pol ? pol : "?", b, kl);
        if (!pol || strcmp(pol, "uniform")) continue;
        if (b == 4) {
            kl4 = kl;
            double bpt = cJSON_GetNumberValue(cJSON_GetObjectItem(row, "first_card_bytes_per_token"));
            CHECK(bpt == want, "uniform 4-bit card: %g bytes per token, the formats say %g", bpt, want);
        }
        if (b == 8) kl8 = kl;
    }
    CHECK(kl4 > 0 && kl8 >= 0 && kl8 < kl4, "uniform KL at 4 bits %g, at 8 bits %g: more bits must lose less", kl4, kl8);
    cJSON_Delete(j);
}

/* `agentkv info` says when a file's RoPE is YaRN-scaled (factor, original
 * context, q/k magnitude) and says nothing of it otherwise. */
TEST(cli_info_prints_yarn) {
    char path[512], args[1024];
    snprintf(path, sizeof path, "%s/yarn-info.gguf", test_tmp_dir());
    snprintf(args, sizeof args,
             "synth -o %s --arch deepseek2 --dim 64 --layers 1 --heads 4 --kv-heads 1 --head-dim 48 --kv-lora 32 "
             "--ffn 128 --experts 4 --experts-used 2 --experts-shared 1 --expert-ffn 32 --vocab 300 --ctx 163840 "
             "--yarn 40 --yarn-orig-ctx 4096 --yarn-log-mul 0.0707 --type f32 --seed 3", path);
    cmd_result r = run_cli(args);
    REQUIRE(r.code == 0, "synth: exit %d: %s", r.code, r.err);
    free_result(&r);
    snprintf(args, sizeof args, "info -m %s", path);
    r = run_cli(args);
    CHECK(r.code == 0 && strstr(r.out, "YaRN x40 from 4096 positions"), "info: exit %d: %s%s", r.code, r.out, r.err);
    free_result(&r);
    char model[512];
    snprintf(args, sizeof args, "info -m %s", test_path(model, sizeof model, "models/stories260K.gguf"));
    r = run_cli(args);
    CHECK(r.code == 0 && strstr(r.out, "rope ") && !strstr(r.out, "YaRN"), "info without YaRN: %s", r.out);
    free_result(&r);
    remove(path);
}
