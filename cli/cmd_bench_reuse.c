/* cmd_bench_reuse.c - agentkv bench reuse: what reusing memory chunks' KV
 * (src/engine/reuse.h: none, cacheblend, agentkvshift, full) costs in quality and
 * saves in prefill time, on held-out text.
 *
 * Data (bench_reuse_data.h): contexts
 *
 *     [BOS if the model's tokenizer adds one] [chunk 1] ... [chunk k] [continuation]
 *
 * either cut from the running text of --data (k consecutive passages of T
 * tokens, then C tokens: the next k + 1 passages), or, with --notes, one
 * per query of a notes file (bench/make_notes.py): each chunk one whole
 * note (cut to T tokens when longer, never padded), the query's notes in an
 * order drawn from --seed, the query's text as the continuation.
 *
 * Per cache type (both K and V in it, keys centered as elsewhere): each
 * chunk's KV is computed alone at positions [0, T) in that type (ak_eval
 * on a fresh sequence: what a memory holds); the BOS is a fresh part.
 * Per method and ratio, ak_reuse_prefill builds the context's cache up to
 * the end of the chunks (timed: the prefill), then the continuation is
 * evaluated teacher-forced on that cache (ak_eval with every logit) and
 * compared position by position with the reference: `full` (everything
 * recomputed) in the same cache type, computed once per context and type.
 * Figures (bench_reuse_metrics.h): mean KL(full || method) over the C
 * continuation positions, PPL of the continuation's tokens and its
 * difference from full's (absolute, relative), argmax agreement, and the
 * prefill speedup (sum over contexts of full's prefill time / the method's).
 * The `full` row is a second full run scored like the others: KL 0 and
 * agreement 1 check the harness itself. `agentkvshift-w1` is agentkvshift
 * with every token's weight 1 (the ablation of the divergence weighting).
 *
 * --handoff A,B measures handoff reuse instead (agent.h: HANDOFF SPANS):
 * the history (the context's chunks, one run) is computed once after a head
 * of A tokens, [BOS] [head A] [history], as the agent that hands off holds
 * it, and placed from there, keys moved, into [BOS] [head B] [history]
 * [continuation] by each method; full is that context prefilled plainly.
 * The heads are held-out text too: the first A and B tokens of the next
 * two contexts' chunks. --residual works on it the same way (the history
 * one chunk).
 *
 * --speed-only skips the continuation and the scoring (for a synthetic
 * model whose random weights make KL meaningless); only prefill times.
 *
 * --residual measures the reuse residual instead of the methods
 * (bench_reuse_residual.h): per context `full` and `none` are built, and
 * each chunk's K/V difference between them is summed per layer and side.
 *
 * Output: a table on stdout (progress on stderr when it is a terminal),
 * --json: {"rows": [{"method", "ratio", "cache_type", "kl", "dppl",
 * "agree", "speedup", ...}]} instead (with --notes also "contexts": per
 * context its query, its notes in placed order and their tokens;
 * --residual: {"residual": [...]}), --plot FILE: an SVG of KL vs ratio,
 * one line per method, one panel per cache type. docs/memories-bench.md
 * and docs/reuse-notes.md have the figures.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kvformat.h"
#include "agents/memories.h"
#include "engine/reuse.h"
#include "args.h"
#include "bench_reuse_data.h"
#include "bench_reuse_metrics.h"
#include "bench_reuse_residual.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv bench reuse -m MODEL (--data FILE | --notes FILE.jsonl) [--json] [--plot out.svg] [flags]\n"
    "  Contexts [BOS] [chunk 1] ... [chunk k] [continuation] cut from FILE's text; each chunk's KV\n"
    "  computed alone at position 0 (as a memory's); per cache type, method and recompute ratio the\n"
    "  context's cache is built with ak_reuse_prefill (timed), the continuation scored teacher-forced\n"
    "  against full recompute in the same cache type: mean KL(full || method), PPL and dPPL, argmax\n"
    "  agreement, prefill speedup vs full.\n"
    "\n"
    "  -m, --model FILE       GGUF model\n"
    "  --data FILE            held-out text (e.g. ../shared/golden/tiny-llama-h64/val.txt), cut into chunks\n"
    "  --notes FILE           memory notes and queries, JSON lines (bench/make_notes.py): a context per\n"
    "                         query, its first K notes one whole chunk each (a note over --chunk-tokens\n"
    "                         cut there), in an order drawn from --seed, its text the continuation\n"
    "  --seed N               the notes' order (default 1)\n"
    "  --chunks K             chunks per context (default 4)\n"
    "  --chunk-tokens T       tokens per chunk (default 128; notes: at most)\n"
    "  --cont N               continuation tokens, scored (default 64)\n"
    "  --contexts N           contexts, at most (default 8; fewer when the text runs out)\n"
    "  --cache-types LIST     chunk and context cache formats (default f16,q4,tq2)\n"
    "  --ratios LIST          recompute ratios in percent (default 0,5,10,15,30,50,100)\n"
    "  --methods LIST         of none, cacheblend, agentkvshift, agentkvshift-w1, full\n"
    "                         (default all; full is always computed as the reference, and its row,\n"
    "                         a second full run scored like the others, is shown unless --speed-only)\n"
    "  --check-layer L        0-based layer where cacheblend/agentkvshift measure deviations\n"
    "                         (default: the library's, layer 1)\n"
    "  --speed-only           prefill times only: no continuation, no KL (random-weight models)\n"
    "  --handoff A,B          handoff reuse: the chunks as one history computed after a head of A tokens,\n"
    "                         placed after a head of B tokens (the heads: held-out text)\n"
    "  --residual             instead of the methods: the reuse residual (in context - alone, shifted)\n"
    "                         per layer, K and V: the share of its energy the per-chunk mean explains,\n"
    "                         and what agentkvshift's correction would remove of it\n"
    "  --reps N               timed runs of each prefill, median (default 1)\n"
    "  --center k|v|kv|none   keys/values of 4/3/2-bit formats stored minus the model's mean\n"
    "  --no-center            (default k, as everywhere)\n"
    "  -t, --threads N        threads (default: all cores)\n"
    "  --json                 {\"rows\": [...]} on stdout instead of the table\n"
    "  --plot FILE            SVG: KL vs ratio, one line per method, one panel per cache type\n";

#define MAX_LIST 16

/* The rows' methods: the library's four plus agentkvshift with unit
 * weights (the ablation). */
typedef enum { BM_NONE, BM_CACHEBLEND, BM_AKVS, BM_AKVS_W1, BM_FULL, BM_COUNT } bmethod;
static const char *const bm_name[BM_COUNT] = {"none", "cacheblend", "agentkvshift", "agentkvshift-w1", "full"};

/* Whether method m takes a recompute ratio (the others get one row). */
static int bm_uses_ratio(int m) {
    return m == BM_CACHEBLEND || m == BM_AKVS || m == BM_AKVS_W1;
}

/* ---- one prefill --------------------------------------------------------- */

/* Everything a context's runs share (one cache type). */
typedef struct {
    ak_ctx *ctx;
    ak_block_pool *pool;    /* the cache type's */
    ak_kv_format fmt;       /* K and V */
    int check_layer;        /* < 0: the library's default */
    int n_pre, k, C;
    const int *lens;        /* the k chunks' tokens */
    int n_chunk_tok;        /* their sum */
    const int32_t *toks;    /* the context's tokens */
    ak_kv **chunk_kv;       /* k chunks' caches, positions [0, lens[j]) */
    ak_reuse_part *parts;   /* n_pre + k parts */
    int n_parts;
} bcase;

/* Builds the context's cache with method bm at recompute ratio r in a
 * fresh sequence *kv (the previous one freed: a sequence carries
 * agentkvshift's corrections), timed: *ms the wall time of
 * ak_reuse_prefill, *cpu the CPU time this process spent in it (all
 * threads: on a shared machine less sensitive to the neighbours' load);
 * *st its counts. Returns 0, or -1 with err set. */
static int run_prefill(const bcase *c, ak_kv **kv, int bm, double r, double *ms, double *cpu, ak_reuse_stats *st,
                       ak_error *err) {
    ak_reuse_params p;
    memset(&p, 0, sizeof p);
    p.method = bm == BM_NONE ? AK_REUSE_NONE
               : bm == BM_CACHEBLEND ? AK_REUSE_CACHEBLEND
               : bm == BM_FULL ? AK_REUSE_FULL : AK_REUSE_AGENTKVSHIFT;
    p.ratio = (float)r;
    p.check_layer = c->check_layer;
    p.unit_weights = bm == BM_AKVS_W1;
    ak_kv_free(*kv);
    if (!(*kv = ak_kv_new(c->pool, c->fmt, c->fmt, c->n_pre + c->n_chunk_tok + c->C, err))) return -1;
    double c0 = bench_cpu_ms(), t0 = ak_now();
    int rc = ak_reuse_prefill(c->ctx, *kv, c->parts, c->n_parts, &p, NULL, st, err);
    *ms = (ak_now() - t0) * 1e3;
    *cpu = bench_cpu_ms() - c0;
    return rc;
}

/* What run_case measured: the medians of the prefill's wall and CPU
 * times, and the last run's counts. */
typedef struct {
    double ms, cpu;
    ak_reuse_stats st;
} case_result;

/* Medians of `reps` timed prefills (see run_prefill) with method bm at
 * ratio r into *res; then, unless logits is NULL, the continuation
 * evaluated on the cache with every position's logits into logits
 * (C x vocab). Returns 0, or -1 with err set. */
static int run_case(const bcase *c, ak_kv **kv, int bm, double r, int reps, case_result *res, float *logits,
                    ak_error *err) {
    double t[64], u[64];
    if (reps > 64) reps = 64;
    for (int i = 0; i < reps; i++)
        if (run_prefill(c, kv, bm, r, &t[i], &u[i], &res->st, err) < 0) return -1;
    res->ms = bench_median(t, reps);
    res->cpu = bench_median(u, reps);
    if (!logits) return 0;
    int at = c->n_pre + c->n_chunk_tok;
    return ak_eval(c->ctx, *kv, &(ak_eval_args){.tokens = c->toks + at, .n = c->C, .pos0 = at,
                   .all_logits = logits}, err);
}

/* ---- rows ---------------------------------------------------------------- */

typedef struct {
    int method;              /* bmethod */
    double ratio;            /* in [0, 1] */
    int ct;                  /* index into the cache types */
    brm_acc acc;             /* quality sums over every context */
    double ms, full_ms;      /* prefill time summed over contexts: this method's, full's (reference run) */
    double cpu, full_cpu;    /* the same in CPU time */
    long recomputed;         /* chunk tokens computed through every layer, summed over contexts */
    int check_layer;         /* the library's report (-1: none and full) */
} brow;

/* ---- the plot ------------------------------------------------------------ */

static const char *const bm_color[BM_COUNT] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#000000"};

/* Writes the SVG of KL vs ratio to path: one panel per cache type, one
 * polyline per ratio method, `none` as a dashed horizontal line (it takes
 * no ratio), log-scale KL (a KL of 0, ratio 100%'s, is a hollow marker on
 * the panel's floor, not joined to the line). Returns 0, or -1 with err set. */
static int write_plot(const char *path, const brow *rows, int n_rows, const ak_kv_format *cts, int n_ct,
                      const char *title, ak_error *err) {
    double lo = INFINITY, hi = 0;
    for (int i = 0; i < n_rows; i++) {
        brm_result r = brm_finish(&rows[i].acc);
        if (r.kl > 0 && r.kl < lo) lo = r.kl;
        if (r.kl > hi) hi = r.kl;
    }
    if (!(hi > 0)) lo = 1e-6, hi = 1;
    double y0 = floor(log10(lo)), y1 = ceil(log10(hi));
    if (y1 <= y0) y1 = y0 + 1;
    const int PW = 300, PH = 240, L = 60, R = 16, T = 40, B = 46, LEG = 180;
    const int W = n_ct * (L + PW + R) + LEG, H = T + PH + B;
    FILE *f = fopen(path, "w");
    if (!f) return ak_failc(err, AK_ERR_IO, "cannot write %s", path);
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%d\" y=\"16\" font-size=\"13\">%s</text>\n", 10, title);
    for (int c = 0; c < n_ct; c++) {
        int ox = c * (L + PW + R) + L;
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n", ox, T, PW,
                PH);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\">chunks and cache: %s</text>\n",
                ox + PW / 2, T - 6, ak_kv_format_get(cts[c])->name);
        for (int x = 0; x <= 100; x += 10) {
            double px = ox + PW * x / 100.0;
            fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>\n", px, T, px, T + PH);
            if (x % 20 == 0)
                fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", px, T + PH + 14, x);
        }
        for (double e = y0; e <= y1 + 1e-9; e += 1) {
            double py = T + PH - PH * (e - y0) / (y1 - y0);
            fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", ox, py, ox + PW, py);
            fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">1e%d</text>\n", ox - 4, py + 4, (int)e);
        }
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">recompute ratio (%%)</text>\n", ox + PW / 2,
                T + PH + 32);
        if (c == 0)
            fprintf(f, "<text transform=\"translate(14,%d) rotate(-90)\" text-anchor=\"middle\">mean KL(full || method), "
                       "nats</text>\n", T + PH / 2);
        for (int bm = 0; bm < BM_COUNT; bm++) {
            if (bm == BM_FULL) continue;   /* KL 0: the reference */
            char pts[4096];
            int np = 0, used = 0;
            pts[0] = 0;
            for (int i = 0; i < n_rows; i++) {
                if (rows[i].ct != c || rows[i].method != bm) continue;
                brm_result r = brm_finish(&rows[i].acc);
                double px = ox + PW * rows[i].ratio;
                int zero = !(r.kl > 0);
                double py = zero ? T + PH : T + PH - PH * (log10(r.kl) - y0) / (y1 - y0);
                if (bm == BM_NONE) {
                    fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"5,4\" "
                               "stroke-width=\"1.5\"/>\n", ox, py, ox + PW, py, bm_color[bm]);
                    continue;
                }
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\" stroke=\"%s\"/>\n", px, py,
                        zero ? "white" : bm_color[bm], bm_color[bm]);
                if (zero) continue;   /* not joined: the floor is no value */
                if (used < (int)sizeof pts - 40) used += snprintf(pts + used, sizeof pts - used, "%.1f,%.1f ", px, py);
                np++;
            }
            if (np > 1)
                fprintf(f, "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s/>\n", pts,
                        bm_color[bm], bm == BM_AKVS_W1 ? " stroke-dasharray=\"2,2\"" : "");
        }
    }
    int lx = n_ct * (L + PW + R) + 4, ly = T + 10, shown = 0;
    for (int bm = 0; bm < BM_FULL; bm++) {
        int run = 0;   /* only the methods measured */
        for (int i = 0; i < n_rows; i++) run |= rows[i].method == bm;
        if (!run) continue;
        int y = ly + 18 * shown++;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", lx, y,
                lx + 22, y, bm_color[bm],
                bm == BM_NONE ? " stroke-dasharray=\"5,4\"" : bm == BM_AKVS_W1 ? " stroke-dasharray=\"2,2\"" : "");
        fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", lx + 28, y + 4, bm_name[bm]);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\">full: KL 0 (reference)</text>\n", lx, ly + 18 * shown + 4);
    fprintf(f, "<text x=\"%d\" y=\"%d\">hollow, on the floor: KL 0</text>\n", lx, ly + 18 * shown + 22);
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0) return ak_failc(err, AK_ERR_IO, "cannot write %s", path);
    return 0;
}

/* ---- output -------------------------------------------------------------- */

/* A JSON number, or null when not finite or `skip`. buf: 32 bytes. */
static const char *jnum(char *buf, double x, int skip) {
    if (skip || !isfinite(x)) return "null";
    snprintf(buf, 32, "%.6g", x);
    return buf;
}

/* Prints the rows as {"rows": [...] (speed_only: the quality fields null),
 * the object left open for the caller's other members and its "}". */
static void print_json(const brow *rows, int n_rows, const ak_kv_format *cts, int n_ctx, int positions,
                       int speed_only) {
    printf("{\"rows\": [");
    for (int i = 0; i < n_rows; i++) {
        const brow *w = &rows[i];
        brm_result r = brm_finish(&w->acc);
        char b[13][32];
        printf("%s\n  {\"method\": \"%s\", \"ratio\": %g, \"cache_type\": \"%s\", \"kl\": %s, \"dppl\": %s, "
               "\"agree\": %s, \"speedup\": %s, \"kl_max\": %s, \"ppl\": %s, \"ppl_full\": %s, \"dppl_rel\": %s, "
               "\"prefill_ms\": %s, \"full_ms\": %s, \"prefill_cpu_ms\": %s, \"full_cpu_ms\": %s, "
               "\"speedup_cpu\": %s, \"recomputed\": %.1f, \"check_layer\": %d, \"contexts\": %d, "
               "\"positions\": %d, \"reference\": \"full, same cache type\"}",
               i ? "," : "", bm_name[w->method], w->ratio, ak_kv_format_get(cts[w->ct])->name,
               jnum(b[0], r.kl, speed_only), jnum(b[1], r.dppl, speed_only), jnum(b[2], r.agree, speed_only),
               jnum(b[3], w->ms > 0 ? w->full_ms / w->ms : NAN, 0), jnum(b[4], r.kl_max, speed_only),
               jnum(b[5], r.ppl, speed_only), jnum(b[6], r.ppl_ref, speed_only), jnum(b[7], r.dppl_rel, speed_only),
               jnum(b[8], w->ms / n_ctx, 0), jnum(b[9], w->full_ms / n_ctx, 0), jnum(b[10], w->cpu / n_ctx, 0),
               jnum(b[11], w->full_cpu / n_ctx, 0), jnum(b[12], w->cpu > 0 ? w->full_cpu / w->cpu : NAN, 0),
               (double)w->recomputed / n_ctx, w->check_layer, n_ctx, speed_only ? 0 : positions);
    }
    printf("\n]");
}

/* Prints the recompute ratio at which cacheblend's KL (cache type c) falls
 * to target (agentkvshift's at 10%), linear between the measured ratios
 * (the paper's "baselines need 45-55%" read as KL). */
static void print_crossover(const brow *rows, int n_rows, int c, const char *ct, double target) {
    double r[MAX_LIST], kl[MAX_LIST];
    int n = 0;
    for (int i = 0; i < n_rows && n < MAX_LIST; i++)
        if (rows[i].ct == c && rows[i].method == BM_CACHEBLEND) {
            int at = n++;   /* insertion by ratio */
            while (at > 0 && r[at - 1] > rows[i].ratio) {
                r[at] = r[at - 1];
                kl[at] = kl[at - 1];
                at--;
            }
            r[at] = rows[i].ratio;
            kl[at] = brm_finish(&rows[i].acc).kl;
        }
    for (int i = 0; i < n; i++) {
        if (kl[i] > target) continue;
        if (i == 0) {
            printf("%s: cacheblend is at or below agentkvshift 10%%'s KL already at %.0f%%\n", ct, 100 * r[0]);
            return;
        }
        double x = r[i - 1] + (r[i] - r[i - 1]) * (kl[i - 1] - target) / (kl[i - 1] - kl[i]);
        printf("%s: cacheblend reaches agentkvshift 10%%'s KL at about %.0f%% recompute (linear between %.0f%% and "
               "%.0f%%)\n", ct, 100 * x, 100 * r[i - 1], 100 * r[i]);
        return;
    }
    if (n > 0 && r[n - 1] < 1)
        printf("%s: cacheblend stays above agentkvshift 10%%'s KL up to %.0f%%, the largest ratio measured below "
               "100%%\n", ct, 100 * r[n - 1]);
}

/* Prints the table, full's reference prefill time per cache type and, per
 * cache type, how agentkvshift at 10% compares with cacheblend at 30% when
 * both were run. */
static void print_table(const brow *rows, int n_rows, const ak_kv_format *cts, int n_ct, int n_ctx, int speed_only) {
    printf("%-5s %-15s %5s %10s %10s %9s %9s %8s %8s %11s %8s %11s %8s\n", "cache", "method", "ratio", "KL",
           "KL_max", "PPL", "dPPL", "dPPL%", "agree", "prefill_ms", "speedup", "cpu_ms", "cpu_x");
    for (int i = 0; i < n_rows; i++) {
        const brow *w = &rows[i];
        brm_result r = brm_finish(&w->acc);
        double sp = w->ms > 0 ? w->full_ms / w->ms : 0, spc = w->cpu > 0 ? w->full_cpu / w->cpu : 0;
        printf("%-5s %-15s %4.0f%% ", ak_kv_format_get(cts[w->ct])->name, bm_name[w->method], 100 * w->ratio);
        if (speed_only) printf("%10s %10s %9s %9s %8s %8s ", "-", "-", "-", "-", "-", "-");
        else
            printf("%10.3e %10.3e %9.4f %+9.4f %+7.2f%% %7.2f%% ", r.kl, r.kl_max, r.ppl, r.dppl, 100 * r.dppl_rel,
                   100 * r.agree);
        printf("%11.2f %7.2fx %11.2f %7.2fx\n", w->ms / n_ctx, sp, w->cpu / n_ctx, spc);
    }
    for (int c = 0; c < n_ct; c++)
        for (int i = 0; i < n_rows; i++)
            if (rows[i].ct == c) {
                printf("%s: full's prefill (the reference run): %.2f ms wall, %.2f ms CPU per context\n",
                       ak_kv_format_get(cts[c])->name, rows[i].full_ms / n_ctx, rows[i].full_cpu / n_ctx);
                break;
            }
    if (speed_only) return;
    for (int c = 0; c < n_ct; c++) {
        const brow *a = NULL, *b = NULL;
        for (int i = 0; i < n_rows; i++) {
            if (rows[i].ct != c) continue;
            if (rows[i].method == BM_AKVS && fabs(rows[i].ratio - 0.10) < 1e-9) a = &rows[i];
            if (rows[i].method == BM_CACHEBLEND && fabs(rows[i].ratio - 0.30) < 1e-9) b = &rows[i];
        }
        if (!a || !b) continue;
        double ka = brm_finish(&a->acc).kl, kb = brm_finish(&b->acc).kl;
        printf("%s: agentkvshift at 10%% KL %.3e %s cacheblend at 30%% KL %.3e (goal: at most)\n",
               ak_kv_format_get(cts[c])->name, ka, ka <= kb ? "<=" : ">", kb);
        print_crossover(rows, n_rows, c, ak_kv_format_get(cts[c])->name, ka);
    }
}

/* ---- the command --------------------------------------------------------- */

/* Parses a comma-separated list of names with parse(name, &index) into out
 * (at most max); returns the count or 0 after args_error. */
static int parse_methods(ak_args *a, const char *v, int *out) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *s = strtok(buf, ","); s; s = strtok(NULL, ",")) {
        int found = -1;
        for (int m = 0; m < BM_COUNT; m++)
            if (!strcmp(s, bm_name[m])) found = m;
        if (found < 0) {
            args_error(a, "--methods: unknown method '%s' (none, cacheblend, agentkvshift, agentkvshift-w1, full)", s);
            return 0;
        }
        out[found] = 1;
        n++;
    }
    if (!n) args_error(a, "--methods: an empty list");
    return n;
}

/* The cache types of a comma-separated list into out (at most max). Returns
 * the count, or 0 after args_error. */
static int parse_types(ak_args *a, const char *v, ak_kv_format *out, int max) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *s = strtok(buf, ","); s; s = strtok(NULL, ",")) {
        if (n == max) { args_error(a, "--cache-types: at most %d", max); return 0; }
        if (ak_kv_format_parse(s, &out[n]) < 0) {
            args_error(a, "--cache-types: unknown format '%s' (%s)", s, ak_kv_format_names());
            return 0;
        }
        n++;
    }
    if (!n) args_error(a, "--cache-types: an empty list");
    return n;
}

/* What bench reuse was asked: its flags. */
typedef struct {
    const char *model_path, *data, *notes, *plot;
    int k, T, C, max_ctx, json, speed_only, residual, reps, n_threads, check_layer;
    int handoff, head_a, head_b;  /* --handoff A,B */
    long long seed;
    int ratios_pct[MAX_LIST], n_ratios;
    int want[BM_COUNT];           /* methods to measure */
    ak_kv_format cts[MAX_LIST];   /* cache types */
    int n_ct;
    cache_opts co;
} reuse_opts;

/* Parses argv into o. Returns -1 when the bench should run, else its exit
 * code: 0 after --help, AK_EXIT_USAGE after a usage error (printed). */
static int reuse_parse(int argc, char **argv, reuse_opts *o) {
    ak_args a;
    args_init(&a, "bench reuse", argc, argv);
    *o = (reuse_opts){.k = 4, .T = 128, .C = 64, .max_ctx = 8, .reps = 1, .check_layer = -1, .seed = 1,
                      .ratios_pct = {0, 5, 10, 15, 30, 50, 100}, .n_ratios = 7, .want = {1, 1, 1, 1, 1},
                      .cts = {AK_KV_F16, AK_KV_Q4, AK_KV_TQ2}, .n_ct = 3};
    cache_opts_init(&o->co);
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) o->model_path = args_value(&a, f);
        else if (!strcmp(f, "--data")) o->data = args_value(&a, f);
        else if (!strcmp(f, "--notes")) o->notes = args_value(&a, f);
        else if (!strcmp(f, "--seed")) o->seed = args_int(&a, f, 0, 1LL << 62);
        else if (!strcmp(f, "--plot")) o->plot = args_value(&a, f);
        else if (!strcmp(f, "--json")) o->json = 1;
        else if (!strcmp(f, "--speed-only")) o->speed_only = 1;
        else if (!strcmp(f, "--residual")) o->residual = 1;
        else if (!strcmp(f, "--chunks")) o->k = (int)args_int(&a, f, 1, 64);
        else if (!strcmp(f, "--chunk-tokens")) o->T = (int)args_int(&a, f, 1, 1 << 20);
        else if (!strcmp(f, "--cont")) o->C = (int)args_int(&a, f, 2, 1 << 20);
        else if (!strcmp(f, "--contexts")) o->max_ctx = (int)args_int(&a, f, 1, 10000);
        else if (!strcmp(f, "--check-layer")) o->check_layer = (int)args_int(&a, f, 0, 4096);
        else if (!strcmp(f, "--reps")) o->reps = (int)args_int(&a, f, 1, 64);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) o->n_threads = (int)args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--handoff")) {
            const char *v = args_value(&a, f);
            int ab[2] = {0, 0};
            if (v && args_int_list(&a, f, v, 1, 1 << 16, ab, 2) != 2) args_error(&a, "--handoff: two head lengths, A,B");
            o->handoff = 1, o->head_a = ab[0], o->head_b = ab[1];
        } else if (!strcmp(f, "--ratios")) {
            const char *v = args_value(&a, f);
            if (v) o->n_ratios = args_int_list(&a, f, v, 0, 100, o->ratios_pct, MAX_LIST);
        } else if (!strcmp(f, "--methods")) {
            const char *v = args_value(&a, f);
            if (v) {
                memset(o->want, 0, sizeof o->want);
                parse_methods(&a, v, o->want);
            }
        } else if (!strcmp(f, "--cache-types")) {
            const char *v = args_value(&a, f);
            if (v) o->n_ct = parse_types(&a, v, o->cts, MAX_LIST);
        } else if (!strcmp(f, "--center") || !strcmp(f, "--no-center")) cache_opts_parse(&o->co, &a, f);
        else args_unknown(&a, f);
    }
    if (!a.failed && !o->model_path) args_error(&a, "-m MODEL is required");
    if (!a.failed && !o->data == !o->notes) args_error(&a, "one of --data FILE and --notes FILE is required");
    if (!a.failed && o->plot && o->speed_only) args_error(&a, "--plot draws KL: not with --speed-only");
    if (!a.failed && o->residual && (o->speed_only || o->plot))
        args_error(&a, "--residual measures no method: not with --speed-only or --plot");
    if (a.failed) return AK_EXIT_USAGE;
    if (!o->speed_only) o->want[BM_FULL] = 1;   /* the harness check (the reference is computed either way) */
    return -1;
}

/* A run's state: what it was asked, the model's context, the rows it
 * fills, the continuation's logits (full's and a method's, C x vocab) and
 * scratch, the sequences of the context at hand, the residual sums
 * (--residual: per cache type, n_layer * 2), the progress bar. */
typedef struct {
    const reuse_opts *o;
    const ak_tokenizer *tok;
    int vocab, n_pre;
    ak_ctx *ctx;
    const brd_set *data;
    brow *rows;
    int n_rows;
    float *ref, *got;
    double *lp, *lq;
    ak_kv *kv, *kv2;          /* the context's sequences (run_case replaces them) */
    ak_kv *chunk_kv[64];      /* the context's chunks computed alone */
    ak_reuse_part parts[65];
    int32_t *htoks;           /* --handoff: the context at hand, [BOS] [head B] [history] [continuation] */
    int hist_len;             /* its history's tokens (the one chunk's length) */
    brr_acc *resid;
    brm_acc *oracle;          /* --residual: per cache type, the quality of none then of each brr_oracle */
    progress pg;
    long done, total;         /* runs, for the progress bar */
} reuse_run;

/* The rows: per cache type, each wanted method (ratio methods once per
 * ratio), into R->rows. */
static void make_rows(reuse_run *R) {
    const reuse_opts *o = R->o;
    for (int c = 0; c < o->n_ct; c++)
        for (int bm = 0; bm < BM_COUNT; bm++) {
            if (!o->want[bm]) continue;
            int nr = bm_uses_ratio(bm) ? o->n_ratios : 1;
            for (int i = 0; i < nr; i++) {
                brow *w = &R->rows[R->n_rows++];
                w->method = bm;
                w->ct = c;
                w->ratio = bm_uses_ratio(bm) ? o->ratios_pct[i] / 100.0 : bm == BM_FULL ? 1 : 0;
            }
        }
}

/* --handoff: context x's history computed after head A (the source, in
 * R->chunk_kv[0]) and the context [BOS] [head B] [history] [continuation]
 * in R->htoks, described by *bc as one fresh part (BOS and head B) and
 * one chunk part placed from the source. The heads are the first A and B
 * chunk tokens of contexts x + 1 and x + 2 (cyclically). Returns 0, or -1
 * with err set (fewer than three contexts, a head longer than a context's
 * chunks). */
static int make_handoff_case(reuse_run *R, int c, ak_block_pool *pool, int x, bcase *bc, ak_error *err) {
    const reuse_opts *o = R->o;
    const brd_set *d = R->data;
    const int n_pre = R->n_pre, A = o->head_a, B = o->head_b, H = brd_chunk_tokens(d, x), C = d->C;
    const int ya = (x + 1) % d->n_ctx, yb = (x + 2) % d->n_ctx;
    if (d->n_ctx < 3 || brd_chunk_tokens(d, ya) < A || brd_chunk_tokens(d, yb) < B)
        return ak_failc(err, AK_ERR_INVALID, "--handoff %d,%d: the heads come from two other contexts' chunks, and "
                        "context %d or %d has fewer tokens (or there are fewer than 3 contexts)", A, B, ya, yb);
    const int32_t *ct = brd_ctx(d, x), *hist = ct + n_pre;
    int32_t *src = ak_malloc(sizeof(int32_t) * (size_t)(n_pre + A + H), err);
    free(R->htoks);
    R->htoks = ak_malloc(sizeof(int32_t) * (size_t)(n_pre + B + H + C), err);
    if (!src || !R->htoks) { free(src); return -1; }
    memcpy(src, ct, sizeof(int32_t) * (size_t)n_pre);
    memcpy(src + n_pre, brd_ctx(d, ya) + n_pre, sizeof(int32_t) * (size_t)A);
    memcpy(src + n_pre + A, hist, sizeof(int32_t) * (size_t)H);
    int32_t *h = R->htoks;
    memcpy(h, ct, sizeof(int32_t) * (size_t)n_pre);
    memcpy(h + n_pre, brd_ctx(d, yb) + n_pre, sizeof(int32_t) * (size_t)B);
    memcpy(h + n_pre + B, hist, sizeof(int32_t) * (size_t)(H + C));   /* the history, then the continuation */
    R->hist_len = H;
    int rc = (R->chunk_kv[0] = ak_kv_new(pool, o->cts[c], o->cts[c], n_pre + A + H, err)) ? 0 : -1;
    if (rc == 0) rc = ak_eval(R->ctx, R->chunk_kv[0], &(ak_eval_args){.tokens = src, .n = n_pre + A + H}, err);
    free(src);
    if (rc < 0) return -1;
    *bc = (bcase){.ctx = R->ctx, .pool = pool, .fmt = o->cts[c], .check_layer = o->check_layer, .n_pre = n_pre + B,
                  .k = 1, .lens = &R->hist_len, .n_chunk_tok = H, .C = C, .toks = h, .chunk_kv = R->chunk_kv,
                  .parts = R->parts, .n_parts = 2};
    R->parts[0] = (ak_reuse_part){.tokens = h, .n = n_pre + B};
    R->parts[1] = (ak_reuse_part){.tokens = h + n_pre + B, .n = H, .chunk = R->chunk_kv[0], .src_at = n_pre + A};
    return 0;
}

/* Context x's chunks computed alone in cache type c (blocks from pool)
 * into R->chunk_kv, and its parts into R->parts; *bc describes the case
 * (--handoff: make_handoff_case's). Returns 0, or -1 with err set. */
static int make_case(reuse_run *R, int c, ak_block_pool *pool, int x, bcase *bc, ak_error *err) {
    const reuse_opts *o = R->o;
    if (o->handoff) return make_handoff_case(R, c, pool, x, bc, err);
    const brd_set *d = R->data;
    const int32_t *ct = brd_ctx(d, x);
    const int k = d->k, n_pre = R->n_pre;
    ak_reuse_part *parts = R->parts;
    *bc = (bcase){.ctx = R->ctx, .pool = pool, .fmt = o->cts[c], .check_layer = o->check_layer, .n_pre = n_pre,
                  .k = k, .lens = d->lens + (size_t)x * k, .n_chunk_tok = brd_chunk_tokens(d, x), .C = d->C,
                  .toks = ct, .chunk_kv = R->chunk_kv, .parts = parts};
    if (n_pre) {
        memset(&parts[bc->n_parts], 0, sizeof parts[0]);
        parts[bc->n_parts].tokens = ct;
        parts[bc->n_parts].n = 1;
        bc->n_parts++;
    }
    const int32_t *cj = ct + n_pre;
    for (int j = 0; j < k; j++) {
        int n = bc->lens[j];
        if (!(R->chunk_kv[j] = ak_kv_new(pool, o->cts[c], o->cts[c], n, err)) ||
            ak_eval(R->ctx, R->chunk_kv[j], &(ak_eval_args){.tokens = cj, .n = n}, err) < 0)
            return -1;
        memset(&parts[bc->n_parts], 0, sizeof parts[0]);
        parts[bc->n_parts].tokens = cj;
        parts[bc->n_parts].n = n;
        parts[bc->n_parts].chunk = R->chunk_kv[j];
        bc->n_parts++;
        cj += n;
    }
    return 0;
}

/* Frees the context's chunk caches. */
static void drop_chunks(reuse_run *R) {
    for (int j = 0; j < 64; j++) {
        ak_kv_free(R->chunk_kv[j]);
        R->chunk_kv[j] = NULL;
    }
}

/* Context x in cache type c (blocks from pool): its chunks computed
 * alone, full's reference run (after a warm-up run when warm_up), then
 * every row of type c, their sums and quality into the rows. Returns 0, or
 * -1 with err set. */
static int run_context(reuse_run *R, int c, ak_block_pool *pool, int x, int warm_up, ak_error *err) {
    const reuse_opts *o = R->o;
    const int C = R->data->C, vocab = R->vocab, speed_only = o->speed_only;
    bcase bc;
    if (make_case(R, c, pool, x, &bc, err) < 0) return -1;
    const int32_t *cont = bc.toks + bc.n_pre + bc.n_chunk_tok;
    case_result full;
    /* warm-up: first-touch faults and scratch out of the timings */
    if (warm_up && run_case(&bc, &R->kv, BM_FULL, 1, 1, &full, NULL, err) < 0) return -1;
    if (run_case(&bc, &R->kv, BM_FULL, 1, o->reps, &full, speed_only ? NULL : R->ref, err) < 0) return -1;
    progress_update(&R->pg, (double)++R->done / R->total);
    for (int i = 0; i < R->n_rows; i++) {
        brow *w = &R->rows[i];
        if (w->ct != c) continue;
        case_result got;
        if (run_case(&bc, &R->kv, w->method, w->ratio, o->reps, &got, speed_only ? NULL : R->got, err) < 0)
            return -1;
        w->ms += got.ms;
        w->cpu += got.cpu;
        w->full_cpu += full.cpu;
        w->recomputed += got.st.n_recomputed;
        w->check_layer = got.st.check_layer;
        w->full_ms += full.ms;
        for (int p = 0; !speed_only && p < C; p++) {
            /* position p predicts continuation token p + 1 (none after the last) */
            int next = p + 1 < C ? cont[p + 1] : -1;
            brm_acc_add(&w->acc, R->ref + (size_t)p * vocab, R->got + (size_t)p * vocab, vocab, next, R->lp, R->lq);
        }
        progress_update(&R->pg, (double)++R->done / R->total);
    }
    drop_chunks(R);
    return 0;
}

/* Scores the continuation evaluated on R->kv2 against R->ref into a. */
static void score_continuation(reuse_run *R, const bcase *bc, brm_acc *a) {
    const int32_t *cont = bc->toks + bc->n_pre + bc->n_chunk_tok;
    for (int p = 0; p < bc->C; p++)
        brm_acc_add(a, R->ref + (size_t)p * R->vocab, R->got + (size_t)p * R->vocab, R->vocab,
                    p + 1 < bc->C ? cont[p + 1] : -1, R->lp, R->lq);
}

/* --residual: context x in cache type c, built by full and by none, each
 * chunk's residual into R->resid + c * n_layer * 2; then the continuation
 * scored against full on none and on none plus each oracle offset
 * (bench_reuse_residual.h: brr_oracle) into R->oracle[c * (1 +
 * BRR_ORACLE_COUNT) + ...]: none first. Returns 0, or -1 with err set. */
static int residual_context(reuse_run *R, int c, ak_block_pool *pool, int x, ak_error *err) {
    const ak_model *m = ak_ctx_model(R->ctx);
    const int L = m->cfg.n_layer;
    const size_t width = (size_t)m->spec.n_head_kv * (2 * m->spec.head_dim_k + m->spec.head_dim_v);
    bcase bc;
    case_result cr;
    if (make_case(R, c, pool, x, &bc, err) < 0 || run_case(&bc, &R->kv, BM_FULL, 1, 1, &cr, NULL, err) < 0 ||
        run_case(&bc, &R->kv2, BM_NONE, 0, 1, &cr, NULL, err) < 0)
        return -1;
    int check = R->o->check_layer >= 0 ? R->o->check_layer : L > 1 ? 1 : 0;
    const brr_input in = {.ctx = R->ctx, .full = R->kv, .none = R->kv2, .pool = pool, .check_layer = check};
    float *means = ak_malloc(sizeof(float) * (size_t)bc.k * L * width, err);
    if (!means) return -1;
    int rc = 0, at = bc.n_pre;
    for (int j = 0; rc == 0 && j < bc.k; j++) {
        rc = brr_add_chunk(&in, at, bc.lens[j], R->resid + (size_t)c * L * 2, means + (size_t)j * L * width, err);
        at += bc.lens[j];
    }
    /* the continuation: full's logits, none's, then none + the oracle's (none rebuilt: its continuation
     * must see the corrected chunks) */
    const int end = bc.n_pre + bc.n_chunk_tok;
    const ak_eval_args ea = {.tokens = bc.toks + end, .n = bc.C, .pos0 = end, .all_logits = R->ref};
    if (rc == 0) rc = ak_eval(R->ctx, R->kv, &ea, err);
    if (rc == 0) rc = run_case(&bc, &R->kv2, BM_NONE, 0, 1, &cr, R->got, err);
    brm_acc *acc = R->oracle + (size_t)c * (1 + BRR_ORACLE_COUNT);
    if (rc == 0) score_continuation(R, &bc, &acc[0]);
    const ak_eval_args eg = {.tokens = bc.toks + end, .n = bc.C, .pos0 = end, .all_logits = R->got};
    for (int mode = 0; mode < BRR_ORACLE_COUNT && rc == 0; mode++) {
        rc = run_prefill(&bc, &R->kv2, BM_NONE, 0, &cr.ms, &cr.cpu, &cr.st, err);
        const brr_input on = {.ctx = R->ctx, .full = R->kv, .none = R->kv2, .pool = pool, .check_layer = check};
        for (int j = 0, a = bc.n_pre; rc == 0 && j < bc.k; a += bc.lens[j], j++)
            rc = brr_apply_oracle(&on, R->kv2, a, bc.lens[j], means + (size_t)j * L * width, (brr_oracle)mode, err);
        if (rc == 0) rc = ak_eval(R->ctx, R->kv2, &eg, err);
        if (rc == 0) score_continuation(R, &bc, &acc[1 + mode]);
    }
    free(means);
    if (rc < 0) return -1;
    progress_update(&R->pg, (double)++R->done / R->total);
    drop_chunks(R);
    return 0;
}

/* Every context in every cache type. Returns 0; 1 when a cache type's
 * centering failed (said on stderr); or -1 with err set. */
static int run_all(reuse_run *R, ak_error *err) {
    const reuse_opts *o = R->o;
    const ak_model *m = ak_ctx_model(R->ctx);
    for (int c = 0; c < o->n_ct; c++) {
        cache_opts co = o->co;
        co.fk = co.fv = o->cts[c];
        ak_block_pool *pool = ak_block_pool_new(&m->spec, 0, 0, err);
        if (!pool) return -1;
        if (cache_center(&co, R->ctx, R->tok, pool, "bench reuse") < 0) { ak_block_pool_free(pool); return 1; }
        int rc = 0;
        for (int x = 0; x < R->data->n_ctx && rc == 0; x++)
            rc = o->residual ? residual_context(R, c, pool, x, err) : run_context(R, c, pool, x, c == 0 && x == 0, err);
        /* the sequences' blocks go back to the pool before it goes */
        drop_chunks(R);
        ak_kv_free(R->kv);
        ak_kv_free(R->kv2);
        R->kv = R->kv2 = NULL;
        ak_block_pool_free(pool);
        if (rc < 0) return -1;
    }
    return 0;
}

/* The chunks in words (describe_data's). */
static void describe_chunks(const reuse_run *R, char *buf, size_t size) {
    const brd_set *d = R->data;
    const reuse_opts *o = R->o;
    if (!o->notes) {
        snprintf(buf, size, "%d contexts of %s%d chunks x %d tokens + %d continuation tokens", d->n_ctx,
                 R->n_pre ? "BOS + " : "", d->k, o->T, d->C);
        return;
    }
    long sum = 0;
    int mx = 0;
    for (int i = 0; i < d->n_ctx * d->k; i++) {
        sum += d->lens[i];
        if (d->lens[i] > mx) mx = d->lens[i];
    }
    snprintf(buf, size, "%d contexts (queries) of %s%d whole notes (%.1f tokens on average, at most %d; %d of %d "
             "cut at --chunk-tokens %d) + %d continuation tokens (the query), notes' order from seed %lld; %d "
             "queries skipped", d->n_ctx, R->n_pre ? "BOS + " : "", d->k, (double)sum / (d->n_ctx * d->k), mx,
             d->n_truncated, d->n_ctx * d->k, o->T, d->C, o->seed, d->n_skipped);
}

/* The contexts in words into buf: "N contexts of BOS + K chunks x T tokens
 * + C continuation tokens" (notes: the notes' mean and largest tokens and
 * how many were cut). */
static void describe_data(const reuse_run *R, char *buf, size_t size) {
    const reuse_opts *o = R->o;
    if (o->handoff) {   /* the chunks as one history, after head A there and head B here */
        int at = snprintf(buf, size, "handoff: history computed after a %d-token head, placed after a %d-token head; ",
                          o->head_a, o->head_b);
        if (at > 0 && (size_t)at < size) describe_chunks(R, buf + at, size - (size_t)at);
        return;
    }
    describe_chunks(R, buf, size);
}


/* JSON "contexts" of a notes run: per context its query, notes (placed
 * order) and their tokens. */
static void print_json_contexts(const brd_set *d) {
    printf(", \"contexts\": [");
    for (int x = 0; x < d->n_ctx; x++) {
        char **ids = d->ids + (size_t)x * (d->k + 1);
        printf("%s\n  {\"query\": ", x ? "," : "");
        ak_json_write_string(stdout, ids[0], strlen(ids[0]));
        printf(", \"notes\": [");
        for (int j = 0; j < d->k; j++) {
            if (j) printf(", ");
            ak_json_write_string(stdout, ids[j + 1], strlen(ids[j + 1]));
        }
        printf("], \"chunk_tokens\": [");
        for (int j = 0; j < d->k; j++) printf("%s%d", j ? ", " : "", d->lens[(size_t)x * d->k + j]);
        printf("]}");
    }
    printf("\n]");
}

/* The oracle's columns: none, then each brr_oracle. */
static const char *const oracle_name[1 + BRR_ORACLE_COUNT] = {"none", "oracle", "oracle_pre_rope", "oracle_v",
                                                              "oracle_k"};

/* Prints the rows (JSON, or the text table) and writes the plot
 * (o->plot); --residual: the residual tables. Returns 0, or -1 with err
 * set. */
static int reuse_report(const reuse_run *R, const ak_model *m, ak_error *err) {
    const reuse_opts *o = R->o;
    const brd_set *d = R->data;
    const int n_ctx = d->n_ctx, C = d->C, L = m->cfg.n_layer;
    const int check = o->check_layer >= 0 ? o->check_layer : L > 1 ? 1 : 0;
    char what[512];
    describe_data(R, what, sizeof what);
    if (o->json) {
        if (o->residual) {
            int first = 1;
            printf("{\"residual\": [");
            for (int c = 0; c < o->n_ct; c++)
                brr_print(R->resid + (size_t)c * L * 2, L, check, ak_kv_format_get(o->cts[c])->name, 1, &first);
            printf("\n], \"oracle\": [");
            for (int c = 0; c < o->n_ct; c++) {
                printf("%s\n  {\"cache_type\": \"%s\"", c ? "," : "", ak_kv_format_get(o->cts[c])->name);
                for (int v = 0; v <= BRR_ORACLE_COUNT; v++) {
                    brm_result a = brm_finish(&R->oracle[(size_t)c * (1 + BRR_ORACLE_COUNT) + v]);
                    printf(", \"kl_%s\": %.6g, \"agree_%s\": %.6g", oracle_name[v], a.kl, oracle_name[v], a.agree);
                }
                printf("}");
            }
            printf("\n]");
        } else print_json(R->rows, R->n_rows, o->cts, n_ctx, n_ctx * C, o->speed_only);
        if (o->notes) print_json_contexts(d);
        printf("}\n");
    } else if (o->residual) {
        printf("bench reuse --residual: %s (%s weights), %s; %s, %d threads\n", o->model_path,
               gguf_tensor_type_name(m->layers[0].wq.type), o->notes ? o->notes : o->data, what,
               ak_threads_size(ak_ctx_pool(R->ctx)));
        printf("residual r = chunk K/V in context (full) - %s, keys shifted (none), per token and channel; sums over "
               "every chunk; check layer %d\n",
               o->handoff ? "the history computed after the other head" : "computed alone at position 0", check);
        printf("rel: |r|^2 / |full|^2; offset: share of |r|^2 the per-chunk mean explains (off_no1st: without each "
               "chunk's first token; off_pre: K rotated back to position 0);\nprobeR: share of the non-probe tokens' "
               "|r|^2 agentkvshift's correction removes at R%% probes (p10_w1: weights 1; p10_head: weights per KV "
               "head; p10_pre: K offset before RoPE); rows N+: layers N.. summed\n");
        for (int c = 0; c < o->n_ct; c++)
            brr_print(R->resid + (size_t)c * L * 2, L, check, ak_kv_format_get(o->cts[c])->name, 0, NULL);
        printf("oracle: none + each chunk's exact mean residual added at every layer and token; continuation "
               "KL(full || .) over %d positions (agreement)\n%-5s", n_ctx * C, "cache");
        for (int v = 0; v <= BRR_ORACLE_COUNT; v++) printf(" %20s", oracle_name[v]);
        printf("\n");
        for (int c = 0; c < o->n_ct; c++) {
            printf("%-5s", ak_kv_format_get(o->cts[c])->name);
            for (int v = 0; v <= BRR_ORACLE_COUNT; v++) {
                brm_result a = brm_finish(&R->oracle[(size_t)c * (1 + BRR_ORACLE_COUNT) + v]);
                printf("   %.3e (%5.1f%%)", a.kl, 100 * a.agree);
            }
            printf("\n");
        }
    } else {
        printf("bench reuse: %s (%s weights), %s; %s, %d threads\n", o->model_path,
               gguf_tensor_type_name(m->layers[0].wq.type), o->notes ? o->notes : o->data, what,
               ak_threads_size(ak_ctx_pool(R->ctx)));
        printf("reference: full recompute of the same context in the same cache type; %s\n",
               o->handoff ? "the history's KV computed after the other head, in that type, keys moved"
                          : "chunks' KV computed alone at position 0 in that type");
        if (!o->speed_only)
            printf("KL(full || method) and agreement over %d continuation positions (teacher-forced), PPL over %d "
                   "next tokens\n", n_ctx * C, n_ctx * (C - 1));
        printf("prefill (ak_reuse_prefill of BOS + %s): median of %d runs, mean per context; speedup: full's "
               "time / the method's (wall; cpu: this process's CPU time, all threads)\n",
               o->handoff ? "head + history" : "chunks", o->reps);
        print_table(R->rows, R->n_rows, o->cts, o->n_ct, n_ctx, o->speed_only);
    }
    if (o->plot && !o->speed_only) {
        char title[768];
        const char *base = strrchr(o->model_path, '/');
        const char *src = o->notes ? o->notes : o->data, *sb = strrchr(src, '/');
        snprintf(title, sizeof title, "agentkv bench reuse: %s, %s, %d contexts, %d %s, continuation %d",
                 base ? base + 1 : o->model_path, sb ? sb + 1 : src, n_ctx, d->k, o->notes ? "notes" : "chunks", C);
        if (write_plot(o->plot, R->rows, R->n_rows, o->cts, o->n_ct, title, err) < 0) return -1;
        fprintf(stderr, "bench reuse: plot %s\n", o->plot);
    }
    return 0;
}

/* The contexts of o (its text or notes file) into *d. Returns 0, or -1
 * with err set (none to be had included). */
static int load_data(const reuse_opts *o, const ak_tokenizer *tk, int n_pre, brd_set *d, ak_error *err) {
    size_t len = 0;
    const char *path = o->notes ? o->notes : o->data;
    char *text = ak_read_file(path, &len, err);
    if (!text) return -1;
    const brd_shape sh = {.n_pre = n_pre, .bos = ak_tokenizer_bos(tk), .k = o->k, .T = o->T, .C = o->C};
    int n = o->notes ? brd_from_notes(tk, text, len, &sh, o->max_ctx, (uint64_t)o->seed, d, err)
                     : brd_from_text(tk, text, len, &sh, o->max_ctx, d, err);
    free(text);
    if (n < 0) return -1;
    if (n == 0) {
        if (o->notes)
            return ak_failc(err, AK_ERR_INVALID, "%s has no query naming %d notes with a text of %d tokens: use "
                            "smaller --chunks or --cont", path, o->k, o->C);
        return ak_failc(err, AK_ERR_INVALID, "%s does not hold one context (%d passages of %d tokens and one of %d): "
                        "use smaller --chunks, --chunk-tokens or --cont", path, o->k, o->T, o->C);
    }
    return 0;
}

/* agentkv bench reuse: parses the flags, makes the contexts from the text
 * or notes, runs every method on each in every cache type (or measures the
 * residual), reports. Returns the exit code. */
int cmd_bench_reuse(int argc, char **argv) {
    reuse_opts o;
    int prc = reuse_parse(argc, argv, &o);
    if (prc >= 0) return prc;
    const int k = o.k, T = o.T, C = o.C;
    loaded_model lm;
    if (load_model(&lm, "bench reuse", o.model_path) < 0) return 1;
    const ak_model *m = lm.model;
    const int vocab = m->cfg.vocab, L = m->cfg.n_layer;
    ak_error err = {{0}};
    int rc = 1;
    brd_set data;
    memset(&data, 0, sizeof data);
    reuse_run R = {.o = &o, .tok = lm.tok, .vocab = vocab, .data = &data};
    progress_init(&R.pg, "bench reuse");
    const int n_pre = R.n_pre = ak_tokenizer_add_bos(lm.tok) && ak_tokenizer_bos(lm.tok) >= 0 ? 1 : 0;
    const int per = n_pre + (o.handoff ? (o.head_a > o.head_b ? o.head_a : o.head_b) : 0) + k * T + C;
    if (per > m->spec.n_ctx) {
        fprintf(stderr, "agentkv bench reuse: a context of %d tokens (%s%d chunks x %d + %d) exceeds the model's "
                        "context %d: use smaller --chunks, --chunk-tokens or --cont\n",
                per, n_pre ? "BOS + " : "", k, T, C, m->spec.n_ctx);
        unload_model(&lm);
        return AK_EXIT_USAGE;
    }
    if (o.check_layer >= L) {
        fprintf(stderr, "agentkv bench reuse: --check-layer %d: the model has %d layers\n", o.check_layer, L);
        unload_model(&lm);
        return AK_EXIT_USAGE;
    }
    for (int c = 0; c < o.n_ct; c++)
        if (!ak_kv_format_supports(o.cts[c], m->spec.head_dim_k) || !ak_kv_format_supports(o.cts[c], m->spec.head_dim_v)) {
            fprintf(stderr, "agentkv bench reuse: cache type %s cannot store this model's head dims (K %d, V %d)\n",
                    ak_kv_format_get(o.cts[c])->name, m->spec.head_dim_k, m->spec.head_dim_v);
            unload_model(&lm);
            return AK_EXIT_USAGE;
        }
    if (load_data(&o, lm.tok, n_pre, &data, &err) < 0) goto fail;
    const int n_ctx = data.n_ctx;
    R.rows = calloc((size_t)o.n_ct * BM_COUNT * MAX_LIST, sizeof *R.rows);
    R.ref = malloc(sizeof(float) * (size_t)C * vocab);
    R.got = malloc(sizeof(float) * (size_t)C * vocab);
    R.lp = malloc(sizeof(double) * vocab);
    R.lq = malloc(sizeof(double) * vocab);
    R.resid = calloc((size_t)o.n_ct * L * 2, sizeof *R.resid);
    R.oracle = calloc((size_t)o.n_ct * (1 + BRR_ORACLE_COUNT), sizeof *R.oracle);
    if (!R.rows || !R.ref || !R.got || !R.lp || !R.lq || !R.resid || !R.oracle) {
        ak_failc(&err, AK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (!o.residual) make_rows(&R);
    if (!(R.ctx = ak_ctx_new(m, per, o.n_threads, &err))) goto fail;
    char what[512];
    describe_data(&R, what, sizeof what);
    fprintf(stderr, "bench reuse: %s, %s, %d threads%s\n", o.model_path, what, ak_threads_size(ak_ctx_pool(R.ctx)),
            o.residual ? ", residual" : o.speed_only ? ", speed only" : "");
    R.total = o.residual ? (long)o.n_ct * n_ctx : (long)o.n_ct * n_ctx * (R.n_rows / o.n_ct + 1);
    int arc = run_all(&R, &err);
    if (arc > 0) err.msg[0] = 0;   /* cache_center printed why */
    if (arc != 0) goto fail;
    progress_done(&R.pg);
    if (reuse_report(&R, m, &err) < 0) goto fail;
    rc = 0;
    goto done;
fail:
    progress_done(&R.pg);
    if (err.msg[0]) fprintf(stderr, "agentkv bench reuse: %s\n", err.msg);
done:
    drop_chunks(&R);
    ak_kv_free(R.kv);
    ak_kv_free(R.kv2);
    ak_ctx_free(R.ctx);
    brd_free(&data);
    free(R.rows); free(R.ref); free(R.got); free(R.lp); free(R.lq); free(R.resid); free(R.oracle); free(R.htoks);
    unload_model(&lm);
    return rc;
}
