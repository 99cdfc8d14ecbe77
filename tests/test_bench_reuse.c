/* test_bench_reuse.c - agentkv bench reuse: its KL / PPL / agreement
 * arithmetic (cli/bench_reuse_metrics.h) against values computed by hand,
 * and the command end to end on stories260K (tiny shapes): the JSON's
 * documented shape, the harness check (the `full` rows are a second full
 * run scored against the first: KL 0, agreement 1), the plot, and clear
 * errors on bad arguments. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>

#include "../cli/bench_reuse_metrics.h"
#include "base/util.h"
#include "test.h"

/* ---- the arithmetic ------------------------------------------------------- */

TEST(bench_reuse_metrics_known_values) {
    double lp[3], lq[3];
    /* softmax(0, 0) = (1/2, 1/2) */
    const float z[2] = {0, 0};
    brm_log_softmax(z, 2, lp);
    CHECK(fabs(lp[0] + log(2.0)) < 1e-12 && fabs(lp[1] + log(2.0)) < 1e-12, "log_softmax(0,0) = %g %g", lp[0], lp[1]);
    /* large logits must not overflow: softmax(1000, 1000 + ln 3) = (1/4, 3/4) */
    const float big[2] = {1000.0f, 1000.0f + (float)log(3.0)};
    brm_log_softmax(big, 2, lq);
    CHECK(fabs(exp(lq[0]) - 0.25) < 1e-4 && fabs(exp(lq[1]) - 0.75) < 1e-4, "softmax(big) = %g %g", exp(lq[0]),
          exp(lq[1]));

    /* p = (1/2, 1/2), q = (3/4, 1/4): KL(p||q) = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3) */
    const float g1[2] = {(float)log(3.0), 0};
    brm_log_softmax(z, 2, lp);
    brm_log_softmax(g1, 2, lq);
    CHECK(fabs(brm_kl(lp, lq, 2) - 0.14384103622589042) < 1e-6, "KL = %.9f, by hand 0.143841036", brm_kl(lp, lq, 2));
    CHECK(brm_kl(lp, lp, 2) == 0, "KL(p||p) = %g", brm_kl(lp, lp, 2));

    /* p = softmax(1, 0), q = softmax(0, 2): KL(p||q) = 1.006842059 and
     * KL(q||p) = 0.828724910 (by hand; the direction matters) */
    const float r2[2] = {1, 0}, g2[2] = {0, 2};
    brm_log_softmax(r2, 2, lp);
    brm_log_softmax(g2, 2, lq);
    CHECK(fabs(brm_kl(lp, lq, 2) - 1.006842059414764) < 1e-6, "KL(p||q) = %.9f, by hand 1.006842059",
          brm_kl(lp, lq, 2));
    CHECK(fabs(brm_kl(lq, lp, 2) - 0.8287249104088981) < 1e-6, "KL(q||p) = %.9f, by hand 0.828724910",
          brm_kl(lq, lp, 2));

    /* accumulated over two positions: the first agrees (argmax 0 both: a tie
     * goes to the lowest id) with next token 1 (NLL ln 4 under q, ln 2
     * under p); the second disagrees, has no next token */
    brm_acc acc;
    memset(&acc, 0, sizeof acc);
    brm_acc_add(&acc, z, g1, 2, 1, lp, lq);
    brm_acc_add(&acc, r2, g2, 2, -1, lp, lq);
    brm_result r = brm_finish(&acc);
    CHECK(acc.n_kl == 2 && acc.n_nll == 1, "counted %ld positions, %ld next tokens", acc.n_kl, acc.n_nll);
    CHECK(fabs(r.kl - (0.14384103622589042 + 1.006842059414764) / 2) < 1e-6, "mean KL %.9f", r.kl);
    CHECK(fabs(r.kl_max - 1.006842059414764) < 1e-6, "max KL %.9f", r.kl_max);
    CHECK(r.agree == 0.5, "agree %g, by hand 0.5", r.agree);
    CHECK(fabs(r.ppl - 4) < 1e-5 && fabs(r.ppl_ref - 2) < 1e-5, "ppl %g (4), full %g (2)", r.ppl, r.ppl_ref);
    CHECK(fabs(r.dppl - 2) < 1e-5 && fabs(r.dppl_rel - 1) < 1e-5, "dppl %g (2), relative %g (1)", r.dppl, r.dppl_rel);

    /* merging two halves gives the same as accumulating everything at once */
    brm_acc a1, a2;
    memset(&a1, 0, sizeof a1);
    memset(&a2, 0, sizeof a2);
    brm_acc_add(&a1, z, g1, 2, 1, lp, lq);
    brm_acc_add(&a2, r2, g2, 2, -1, lp, lq);
    brm_acc_merge(&a1, &a2);
    brm_result m = brm_finish(&a1);
    CHECK(m.kl == r.kl && m.agree == r.agree && m.ppl == r.ppl && m.kl_max == r.kl_max, "merge differs");

    /* three tokens, PPL over two next tokens: exp((ln 2 + ln 4) / 2) = sqrt 8 */
    const float u3[3] = {0, 0, 0};
    memset(&acc, 0, sizeof acc);
    brm_acc_add(&acc, u3, u3, 3, 0, lp, lq);   /* NLL ln 3 both */
    brm_acc_add(&acc, u3, u3, 3, 2, lp, lq);
    r = brm_finish(&acc);
    CHECK(fabs(r.ppl - 3) < 1e-9 && r.dppl == 0 && r.kl == 0 && r.agree == 1, "uniform: ppl %g dppl %g kl %g", r.ppl,
          r.dppl, r.kl);
}

/* ---- the command ---------------------------------------------------------- */

typedef test_cli_result br_result;

/* Runs `agentkv bench reuse ARGS` (AK_BIN), capturing stdout and stderr. */
static br_result br_run(const char *args) {
    char a[4096];
    snprintf(a, sizeof a, "bench reuse %s", args);
    return test_cli_run(a, 300);
}

static void br_free(br_result *r) { test_cli_free(r); }

/* The row of rows with this method, cache type and ratio, or NULL. */
static cJSON *find_row(cJSON *rows, const char *method, const char *ct, double ratio) {
    cJSON *w;
    cJSON_ArrayForEach(w, rows) {
        cJSON *m = cJSON_GetObjectItem(w, "method"), *c = cJSON_GetObjectItem(w, "cache_type");
        cJSON *r = cJSON_GetObjectItem(w, "ratio");
        if (cJSON_IsString(m) && cJSON_IsString(c) && cJSON_IsNumber(r) && !strcmp(m->valuestring, method) &&
            !strcmp(c->valuestring, ct) && fabs(r->valuedouble - ratio) < 1e-9)
            return w;
    }
    return NULL;
}

static double num(cJSON *row, const char *k) {
    cJSON *x = cJSON_GetObjectItem(row, k);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

TEST(bench_reuse_json_shape_and_full_rows) {
    char model[512], data[512], args[2048], plot[512];
    test_path(model, sizeof model, "models/stories260K.gguf");
    test_path(data, sizeof data, "golden/stories260K/story.txt");
    snprintf(plot, sizeof plot, "%s/reuse.svg", test_tmp_dir());
    snprintf(args, sizeof args,
             "-m %s --data %s --json --plot %s --chunks 2 --chunk-tokens 24 --cont 12 --contexts 2 --ratios 0,10,100 "
             "-t 1",
             model, data, plot);
    br_result r = br_run(args);
    REQUIRE(r.code == 0, "exit %d: %s", r.code, r.err);
    cJSON *j = cJSON_Parse(r.out);
    REQUIRE(j && cJSON_IsObject(j), "not a JSON object: %.300s", r.out);
    CHECK(cJSON_GetArraySize(j) == 1, "the object has %d members, documented: only \"rows\"", cJSON_GetArraySize(j));
    cJSON *rows = cJSON_GetObjectItem(j, "rows");
    REQUIRE(cJSON_IsArray(rows), "no rows array");
    /* per cache type (f16, q4, tq2): none, full, and 3 ratio methods x 3 ratios */
    CHECK(cJSON_GetArraySize(rows) == 3 * (2 + 3 * 3), "%d rows", cJSON_GetArraySize(rows));
    cJSON *w;
    cJSON_ArrayForEach(w, rows) {
        const char *str_keys[] = {"method", "cache_type"};
        const char *num_keys[] = {"ratio", "kl", "dppl", "agree", "speedup"};
        for (int i = 0; i < 2; i++) CHECK(cJSON_IsString(cJSON_GetObjectItem(w, str_keys[i])), "no string %s", str_keys[i]);
        for (int i = 0; i < 5; i++) CHECK(cJSON_IsNumber(cJSON_GetObjectItem(w, num_keys[i])), "no number %s", num_keys[i]);
        double kl = num(w, "kl"), ag = num(w, "agree"), ra = num(w, "ratio");
        CHECK(kl >= 0 && ag >= 0 && ag <= 1 && ra >= 0 && ra <= 1 && num(w, "speedup") > 0, "a value out of range");
    }
    const char *cts[] = {"f16", "q4", "tq2"};
    for (int c = 0; c < 3; c++) {
        cJSON *full = find_row(rows, "full", cts[c], 1);
        REQUIRE(full, "no full row for %s", cts[c]);
        /* the harness: a second full run scored against the reference */
        CHECK(num(full, "kl") == 0 && num(full, "agree") == 1 && num(full, "dppl") == 0,
              "%s full: kl %g agree %g dppl %g (want 0, 1, 0)", cts[c], num(full, "kl"), num(full, "agree"),
              num(full, "dppl"));
        cJSON *none = find_row(rows, "none", cts[c], 0);
        REQUIRE(none, "no none row for %s", cts[c]);
        /* chunks computed alone are stale: the harness must see a difference */
        CHECK(num(none, "kl") > 1e-6, "%s none: kl %g, stale chunks should differ from full", cts[c], num(none, "kl"));
        const char *ms[] = {"cacheblend", "agentkvshift", "agentkvshift-w1"};
        for (int i = 0; i < 3; i++)
            for (int q = 0; q < 3; q++) {
                double ratio = q == 0 ? 0 : q == 1 ? 0.1 : 1;
                cJSON *row = find_row(rows, ms[i], cts[c], ratio);
                CHECK(row, "no %s row at %g for %s", ms[i], ratio, cts[c]);
                /* reuse.h: ratio 1 recomputes every chunk token, equal to full bit for bit */
                if (row && q == 2)
                    CHECK(num(row, "kl") == 0 && num(row, "agree") == 1, "%s %s at 100%%: kl %g agree %g", cts[c],
                          ms[i], num(row, "kl"), num(row, "agree"));
            }
    }
    cJSON_Delete(j);
    char *svg = ak_read_file(plot, NULL, NULL);
    CHECK(svg && strstr(svg, "<svg") && strstr(svg, "</svg>") && strstr(svg, "<polyline") && strstr(svg, "cacheblend"),
          "the plot %s is not the SVG of the lines", plot);
    free(svg);
    br_free(&r);
}

/* --handoff: the history placed from a sequence that computed it after
 * another head. full scored against itself is exact; ratio 1 recomputes
 * every placed token (reuse.h: full bit for bit); none (the history as the
 * other head left it, keys moved) differs; heads longer than the text or
 * one number are refused. */
TEST(bench_reuse_handoff_rows) {
    char model[512], data[512], args[2048];
    test_path(model, sizeof model, "models/stories260K.gguf");
    test_path(data, sizeof data, "golden/stories260K/story.txt");
    snprintf(args, sizeof args,
             "-m %s --data %s --json --chunks 2 --chunk-tokens 24 --cont 12 --contexts 3 --ratios 0,10,100 "
             "--cache-types f16 --methods none,cacheblend,agentkvshift,full --handoff 7,12 -t 1",
             model, data);
    br_result r = br_run(args);
    REQUIRE(r.code == 0, "exit %d: %s", r.code, r.err);
    cJSON *j = cJSON_Parse(r.out), *rows = cJSON_GetObjectItem(j, "rows");
    REQUIRE(cJSON_IsArray(rows) && cJSON_GetArraySize(rows) == 2 + 2 * 3, "rows: %.300s", r.out);
    cJSON *full = find_row(rows, "full", "f16", 1), *none = find_row(rows, "none", "f16", 0);
    REQUIRE(full && none, "no full or none row");
    CHECK(num(full, "kl") == 0 && num(full, "agree") == 1, "full: kl %g agree %g", num(full, "kl"), num(full, "agree"));
    CHECK(num(none, "kl") > 1e-6, "none: kl %g, the history after another head should differ", num(none, "kl"));
    const char *ms[] = {"cacheblend", "agentkvshift"};
    for (int i = 0; i < 2; i++) {
        cJSON *one = find_row(rows, ms[i], "f16", 1);
        CHECK(one && num(one, "kl") == 0 && num(one, "agree") == 1, "%s at 100%%: kl %g", ms[i], one ? num(one, "kl") : -1);
    }
    cJSON_Delete(j);
    br_free(&r);
    snprintf(args, sizeof args, "-m %s --data %s --chunks 2 --chunk-tokens 24 --cont 12 --contexts 3 --handoff 60,7 --cache-types f16",
             model, data);
    br_result b = br_run(args);
    CHECK(b.code == 1 && strstr(b.err, "--handoff 60,7"), "a head longer than the chunks: exit %d: %s", b.code, b.err);
    br_free(&b);
    snprintf(args, sizeof args, "-m %s --data %s --handoff 5", model, data);
    b = br_run(args);
    CHECK(b.code == 2 && strstr(b.err, "--handoff"), "one head length: exit %d: %s", b.code, b.err);
    br_free(&b);
}

/* One bad invocation: exit code `code` and a one-line error containing
 * `want` on stderr. */
static void bad_args(ak_test_ctx *t, const char *args, int code, const char *want) {
    br_result r = br_run(args);
    CHECK(r.code == code, "'%s': exit %d, want %d (%s)", args, r.code, code, r.err);
    CHECK(strstr(r.err, want) != NULL, "'%s': stderr '%s' lacks '%s'", args, r.err, want);
    CHECK(strstr(r.out, "\"rows\"") == NULL, "'%s': printed rows", args);
    br_free(&r);
}

TEST(bench_reuse_bad_args) {
    char model[512], data[512], args[2048];
    test_path(model, sizeof model, "models/stories260K.gguf");
    test_path(data, sizeof data, "golden/stories260K/story.txt");
    bad_args(t, "--data x.txt", 2, "-m MODEL is required");
    snprintf(args, sizeof args, "-m %s", model);
    bad_args(t, args, 2, "one of --data FILE and --notes FILE is required");
    snprintf(args, sizeof args, "-m %s --data %s --ratios 0,150", model, data);
    bad_args(t, args, 2, "--ratios");
    snprintf(args, sizeof args, "-m %s --data %s --ratios -5", model, data);
    bad_args(t, args, 2, "--ratios");
    snprintf(args, sizeof args, "-m %s --data %s --cache-types f16,q5", model, data);
    bad_args(t, args, 2, "unknown format 'q5'");
    snprintf(args, sizeof args, "-m %s --data %s --methods none,magic", model, data);
    bad_args(t, args, 2, "unknown method 'magic'");
    snprintf(args, sizeof args, "-m %s --data %s --plot x.svg --speed-only", model, data);
    bad_args(t, args, 2, "not with --speed-only");
    snprintf(args, sizeof args, "-m %s --data %s --frobnicate", model, data);
    bad_args(t, args, 2, "unknown flag '--frobnicate'");
    /* more tokens than the model's context (2048) */
    snprintf(args, sizeof args, "-m %s --data %s --chunks 4 --chunk-tokens 600", model, data);
    bad_args(t, args, 2, "exceeds the model's context 2048");
    /* a text too short for one context */
    snprintf(args, sizeof args, "-m %s --data %s --chunks 8 --chunk-tokens 200 --cont 8", model, data);
    bad_args(t, args, 1, "does not hold one context");
    snprintf(args, sizeof args, "-m %s --data %s/no-such-file.txt", model, test_tmp_dir());
    bad_args(t, args, 1, "no-such-file.txt");
}

/* ---- the residual arithmetic ------------------------------------------------ */

TEST(bench_reuse_offset_share_known_values) {
    double x = 0, e = 0;
    /* the same vector at every token: the mean explains all of it */
    const float same[6] = {1, -2, 1, -2, 1, -2};
    brm_offset_energy(same, 3, 2, 2, &x, &e);
    CHECK(e == 15 && x == 15, "constant residual: explained %g of %g, want 15 of 15 (share 1)", x, e);
    /* zero mean per channel: nothing explained */
    x = e = 0;
    const float zero_mean[4] = {1, 2, -1, -2};
    brm_offset_energy(zero_mean, 2, 2, 2, &x, &e);
    CHECK(e == 10 && x == 0, "zero-mean residual: explained %g of %g, want 0 of 10", x, e);
    /* (1, 3) in one channel: mean 2, energy 10, explained 2 * 2^2 = 8 (share 0.8); rows of stride 3 with
     * the third float not read */
    x = e = 0;
    const float strided[6] = {1, 0, 99, 3, 0, 99};
    brm_offset_energy(strided, 2, 2, 3, &x, &e);
    CHECK(e == 10 && x == 8, "strided: explained %g of %g, want 8 of 10", x, e);
    /* sums add across calls (energy-weighted shares) */
    brm_offset_energy(same, 3, 2, 2, &x, &e);
    CHECK(e == 25 && x == 23, "accumulated: %g of %g, want 23 of 25", x, e);

    /* the correction: rows 4, 2, 1 (one channel), probe {0}: mu = 4; weights 0.5 and 0.25 take the others
     * to 0 exactly (before 2^2 + 1^2 = 5, after 0); weights 1 take them to -2 and -3 (after 13) */
    const float r[3] = {4, 2, 1};
    const int probe[1] = {0};
    const unsigned char is_probe[3] = {1, 0, 0};
    const float w_exact[3] = {0, 0.5f, 0.25f}, w_one[3] = {0, 1, 1};
    double before = 0, after = 0;
    const brm_probes pe = {.probe = probe, .m = 1, .is_probe = is_probe, .w = w_exact};
    brm_probe_correction(r, 3, 1, 1, &pe, &before, &after);
    CHECK(before == 5 && after == 0, "exact weights: before %g after %g, want 5 and 0", before, after);
    before = after = 0;
    const brm_probes p1 = {.probe = probe, .m = 1, .is_probe = is_probe, .w = w_one};
    brm_probe_correction(r, 3, 1, 1, &p1, &before, &after);
    CHECK(before == 5 && after == 13, "unit weights: before %g after %g, want 5 and 13", before, after);
    /* two probes (rows 0, 1 of a two-channel residual): mu = (3, -1); row 2 = (3, -1) + (1, 1), weight 1:
     * before 16 + 0 = 16, after 1 + 1 = 2 */
    const float r2[6] = {4, 0, 2, -2, 4, 0};
    const int probe2[2] = {0, 1};
    const unsigned char is_probe2[3] = {1, 1, 0};
    before = after = 0;
    const brm_probes p2 = {.probe = probe2, .m = 2, .is_probe = is_probe2, .w = w_one};
    brm_probe_correction(r2, 3, 2, 2, &p2, &before, &after);
    CHECK(before == 16 && after == 2, "two probes: before %g after %g, want 16 and 2", before, after);
}

/* ---- notes ------------------------------------------------------------------ */

/* Writes s to dir/name; the path into path. */
static void write_text(char *path, size_t size, const char *dir, const char *name, const char *s) {
    snprintf(path, size, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(s, f);
        fclose(f);
    }
}

/* Tokens of the text in file path as `agentkv tokenize --no-bos` counts
 * them (no BOS, no special tokens: a memory's tokenization), or -1. */
static int count_tokens(const char *model, const char *path) {
    char a[2048];
    snprintf(a, sizeof a, "tokenize -m %s -f %s --no-bos", model, path);
    test_cli_result r = test_cli_run(a, 60);
    int n = -1;
    if (r.code == 0) {
        n = 0;
        for (char *p = strtok(r.out, " \n"); p; p = strtok(NULL, " \n")) n++;
    }
    test_cli_free(&r);
    return n;
}

static const char *const note_texts[4] = {
    "memory content: Mia saw a small brown dog near her garden.\nmemory keywords: dog, garden",
    "memory content: The owl said flying is hard at first.\nmemory tags: birds",
    "DATE: 1:56 pm on 8 May, 2023\nCONVERSATION:\nLeo said, \"Thank you for finding Max. I looked for him all "
    "day.\"\nMia said, \"You are welcome. Max is a good dog.\" Leo asked her to play with them, and they played "
    "with a red ball until the sun went down over the big green hill near the small house.",
    "memory content: Pip flew over the houses and the river."};

/* Runs bench reuse on the hand-written notes file; the parsed JSON into
 * *j (NULL when the run failed). */
static cJSON *notes_run(ak_test_ctx *t, const char *model, const char *notes, const char *extra) {
    char args[2048];
    snprintf(args, sizeof args,
             "-m %s --notes %s --chunks 3 --chunk-tokens 100 --cont 8 --contexts 4 --ratios 0,100 --cache-types f16 "
             "--methods none,cacheblend --json -t 1 %s", model, notes, extra);
    br_result r = br_run(args);
    CHECK(r.code == 0, "exit %d: %s", r.code, r.err);
    cJSON *j = r.code == 0 ? cJSON_Parse(r.out) : NULL;
    CHECK(j != NULL, "not JSON: %.300s", r.out);
    br_free(&r);
    return j;
}

TEST(bench_reuse_notes_whole_chunks) {
    char model[512], path[512], notes[512], np[4][512];
    test_path(model, sizeof model, "models/stories260K.gguf");
    const char *dir = test_tmp_dir();
    int ntok[4];
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "note%d.txt", i);
        write_text(np[i], sizeof np[i], dir, name, note_texts[i]);
        ntok[i] = count_tokens(model, np[i]);
        REQUIRE(ntok[i] > 0, "could not tokenize note %d", i);
    }
    REQUIRE(ntok[0] < 100 && ntok[1] < 100 && ntok[3] < 100 && ntok[2] > 100,
            "the notes were written so that only n2 exceeds 100 tokens: %d %d %d %d", ntok[0], ntok[1], ntok[2],
            ntok[3]);
    /* the file: a meta line (ignored), the notes as JSON strings, two queries, one naming only two notes
     * (skipped: --chunks 3) */
    char body[8192];
    int off = snprintf(body, sizeof body, "{\"type\": \"meta\", \"generator\": \"hand\"}\n");
    for (int i = 0; i < 4; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "note");
        char id[8];
        snprintf(id, sizeof id, "n%d", i);
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "text", note_texts[i]);
        char *s = cJSON_PrintUnformatted(o);
        off += snprintf(body + off, sizeof body - off, "%s\n", s);
        free(s);
        cJSON_Delete(o);
    }
    snprintf(body + off, sizeof body - off,
             "{\"type\": \"query\", \"id\": \"qa\", \"notes\": [\"n0\", \"n1\", \"n2\", \"n3\"], \"text\": \"Question: "
             "What did Mia find? Answer: a small brown dog near her garden, and she gave it water.\"}\n"
             "{\"type\": \"query\", \"id\": \"qshort\", \"notes\": [\"n0\", \"n1\"], \"text\": \"Question: Who is "
             "Pip? Answer: a little bird who could not fly at first.\"}\n"
             "\n"
             "{\"type\": \"query\", \"id\": \"qb\", \"notes\": [\"n3\", \"n2\", \"n0\"], \"text\": \"Question: Who "
             "flew? Answer: Pip flew over the houses and the river, and all the birds sang.\"}\n");
    write_text(notes, sizeof notes, dir, "notes.jsonl", body);

    cJSON *j = notes_run(t, model, notes, "");
    REQUIRE(j, "no JSON");
    cJSON *ctxs = cJSON_GetObjectItem(j, "contexts");
    REQUIRE(cJSON_IsArray(ctxs) && cJSON_GetArraySize(ctxs) == 2, "want 2 contexts (qa, qb; qshort skipped), got %d",
            cJSON_GetArraySize(ctxs));
    const char *want_q[2] = {"qa", "qb"};
    const char *want_set[2][3] = {{"n0", "n1", "n2"}, {"n3", "n2", "n0"}};
    char order[2][64];
    for (int x = 0; x < 2; x++) {
        cJSON *c = cJSON_GetArrayItem(ctxs, x), *q = cJSON_GetObjectItem(c, "query");
        cJSON *ns = cJSON_GetObjectItem(c, "notes"), *tk = cJSON_GetObjectItem(c, "chunk_tokens");
        REQUIRE(cJSON_IsString(q) && !strcmp(q->valuestring, want_q[x]), "context %d: query %s, want %s", x,
                cJSON_IsString(q) ? q->valuestring : "?", want_q[x]);
        REQUIRE(cJSON_GetArraySize(ns) == 3 && cJSON_GetArraySize(tk) == 3, "context %d: not 3 notes", x);
        order[x][0] = 0;
        int seen[3] = {0, 0, 0};
        for (int i = 0; i < 3; i++) {
            const char *id = cJSON_GetArrayItem(ns, i)->valuestring;
            strcat(order[x], id);
            int which = -1;
            for (int s = 0; s < 3; s++)
                if (!strcmp(id, want_set[x][s])) which = s;
            CHECK(which >= 0 && !seen[which], "context %d: note %s is not one of the query's first three, or twice",
                  x, id);
            if (which >= 0) seen[which] = 1;
            /* each chunk is the whole note: its token count, or 100 (cut at --chunk-tokens) */
            int n = id[1] - '0', want = ntok[n] < 100 ? ntok[n] : 100;
            CHECK(cJSON_GetArrayItem(tk, i)->valueint == want, "context %d chunk %d (%s): %d tokens, want %d", x, i,
                  id, cJSON_GetArrayItem(tk, i)->valueint, want);
        }
    }
    cJSON *rows = cJSON_GetObjectItem(j, "rows");
    cJSON *full = find_row(rows, "full", "f16", 1), *none = find_row(rows, "none", "f16", 0);
    REQUIRE(full && none, "no full or none row");
    CHECK(num(full, "kl") == 0 && num(full, "agree") == 1, "full: kl %g agree %g", num(full, "kl"), num(full, "agree"));
    CHECK(num(none, "kl") > 0, "none: kl %g: notes computed alone should differ", num(none, "kl"));
    const double none_kl = num(none, "kl");
    cJSON_Delete(j);

    /* the same seed gives the same orders; another seed other ones (seeds 1 and 2 differ here) */
    cJSON *j1 = notes_run(t, model, notes, "--seed 1"), *j2 = notes_run(t, model, notes, "--seed 2");
    REQUIRE(j1 && j2, "no JSON");
    char o1[2][64], o2[2][64];
    for (int x = 0; x < 2; x++) {
        o1[x][0] = o2[x][0] = 0;
        for (int i = 0; i < 3; i++) {
            strcat(o1[x], cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j1, "contexts"), x), "notes"), i)->valuestring);
            strcat(o2[x], cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j2, "contexts"), x), "notes"), i)->valuestring);
        }
    }
    CHECK(!strcmp(o1[0], order[0]) && !strcmp(o1[1], order[1]), "seed 1 (the default) gave %s %s, then %s %s",
          order[0], order[1], o1[0], o1[1]);
    CHECK(strcmp(o1[0], o2[0]) || strcmp(o1[1], o2[1]), "seeds 1 and 2 gave the same orders %s %s", o1[0], o1[1]);
    cJSON_Delete(j1);
    cJSON_Delete(j2);

    /* the residual: V at layer 0 depends on the token only (no attention before it), so its residual is
     * exactly 0; K at layer 0 differs by the rounding of the f16 position shift only */
    char args[2048];
    snprintf(args, sizeof args, "-m %s --notes %s --chunks 3 --chunk-tokens 100 --cont 8 --cache-types f16 --residual "
             "--json -t 1", model, notes);
    br_result r = br_run(args);
    REQUIRE(r.code == 0, "residual: exit %d: %s", r.code, r.err);
    cJSON *res = cJSON_Parse(r.out);
    cJSON *rr = cJSON_GetObjectItem(res, "residual");
    REQUIRE(cJSON_IsArray(rr) && cJSON_GetArraySize(rr) == 2 * 5, "residual: want 10 rows (5 layers x K, V): %.300s",
            r.out);
    cJSON *w;
    cJSON_ArrayForEach(w, rr) {
        int layer = cJSON_GetObjectItem(w, "layer")->valueint;
        const char *side = cJSON_GetObjectItem(w, "side")->valuestring;
        double rel = num(w, "rel_energy"), share = num(w, "offset_share");
        if (layer == 0 && side[0] == 'V')
            CHECK(rel == 0 && cJSON_IsNull(cJSON_GetObjectItem(w, "offset_share")), "layer 0 V: rel %g", rel);
        else if (layer == 0)
            CHECK(rel < 1e-4, "layer 0 K: rel %g, want rounding only", rel);
        else
            CHECK(rel > 0 && share >= 0 && share <= 1 && !isnan(num(w, "probe10")), "layer %d %s: rel %g share %g",
                  layer, side, rel, share);
        if (layer == 0) CHECK(cJSON_IsNull(cJSON_GetObjectItem(w, "probe10")), "layer 0: probe10 not null");
        /* every chunk token of both contexts: qa's n0, n1, n2 (cut to 100) and qb's n3, n2, n0 */
        double want_tok = ntok[0] + ntok[1] + 100 + ntok[3] + 100 + ntok[0];
        CHECK(num(w, "tokens") == want_tok, "layer %d %s: %g tokens, want %g", layer, side, num(w, "tokens"), want_tok);
    }
    /* the oracle: none scored like the methods' none, and each offset variant scored */
    cJSON *orc = cJSON_GetArrayItem(cJSON_GetObjectItem(res, "oracle"), 0);
    REQUIRE(orc, "residual: no oracle member");
    const char *variants[5] = {"kl_none", "kl_oracle", "kl_oracle_pre_rope", "kl_oracle_v", "kl_oracle_k"};
    for (int i = 0; i < 5; i++) CHECK(num(orc, variants[i]) >= 0, "oracle: %s is %g", variants[i], num(orc, variants[i]));
    CHECK(num(orc, "kl_none") == none_kl, "oracle: none's KL %g, the methods' none row %g (the same contexts)",
          num(orc, "kl_none"), none_kl);
    cJSON_Delete(res);
    br_free(&r);

    /* errors: an unknown note, both sources, a line that is not JSON */
    snprintf(body, sizeof body, "{\"type\": \"note\", \"id\": \"n0\", \"text\": \"a note\"}\n"
             "{\"type\": \"query\", \"id\": \"q\", \"notes\": [\"n0\", \"nx\"], \"text\": \"a question\"}\n");
    write_text(path, sizeof path, dir, "bad.jsonl", body);
    snprintf(args, sizeof args, "-m %s --notes %s --chunks 2", model, path);
    bad_args(t, args, 1, "names 'nx', not a note of the file");
    write_text(path, sizeof path, dir, "bad2.jsonl", "{\"type\": \"note\", \"id\": \"n0\", \"text\": \"a\"}\nnot json\n");
    snprintf(args, sizeof args, "-m %s --notes %s", model, path);
    bad_args(t, args, 1, "line 2: not a JSON object");
    snprintf(args, sizeof args, "-m %s --notes %s --data %s", model, notes, notes);
    bad_args(t, args, 2, "one of --data FILE and --notes FILE");
}
