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
    bad_args(t, args, 2, "--data FILE is required");
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
