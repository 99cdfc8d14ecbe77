/* cmd_bench_reuse.c - agentkv bench reuse: what reusing memory chunks' KV
 * (src/engine/reuse.h: none, cacheblend, agentkvshift, full) costs in quality and
 * saves in prefill time, on held-out text.
 *
 * Data. The text of --data is cut into passages, in order: a passage starts
 * at a word and takes words until its own tokenization (ak_memory_tokenize:
 * no BOS, special-token text kept as text, as a memory's) reaches the
 * wanted tokens; it keeps the first that many, and the next passage starts
 * at the next word. A context is k passages of T tokens (the chunks) and
 * one of C tokens (the continuation), the next k + 1 passages of the text:
 *
 *     [BOS if the model's tokenizer adds one] [chunk 1] ... [chunk k] [continuation]
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
 * --speed-only skips the continuation and the scoring (for a synthetic
 * model whose random weights make KL meaningless); only prefill times.
 *
 * Output: a table on stdout (progress on stderr when it is a terminal),
 * --json: {"rows": [{"method", "ratio", "cache_type", "kl", "dppl",
 * "agree", "speedup", ...}]} instead, --plot FILE: an SVG of KL vs ratio,
 * one line per method, one panel per cache type. docs/memories-bench.md
 * has the figures.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kvformat.h"
#include "agents/memories.h"
#include "engine/reuse.h"
#include "args.h"
#include "bench_reuse_metrics.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv bench reuse -m MODEL --data FILE [--json] [--plot out.svg] [flags]\n"
    "  Contexts [BOS] [chunk 1] ... [chunk k] [continuation] cut from FILE's text; each chunk's KV\n"
    "  computed alone at position 0 (as a memory's); per cache type, method and recompute ratio the\n"
    "  context's cache is built with ak_reuse_prefill (timed), the continuation scored teacher-forced\n"
    "  against full recompute in the same cache type: mean KL(full || method), PPL and dPPL, argmax\n"
    "  agreement, prefill speedup vs full.\n"
    "\n"
    "  -m, --model FILE       GGUF model\n"
    "  --data FILE            held-out text (e.g. ../shared/golden/tiny-llama-h64/val.txt)\n"
    "  --chunks K             chunks per context (default 4)\n"
    "  --chunk-tokens T       tokens per chunk (default 128)\n"
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

/* ---- passages ------------------------------------------------------------ */

/* ASCII whitespace: where passages may be cut (between words). */
static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* The next passage of text[0..len) from *pos: skips whitespace to a word,
 * then takes words until ak_memory_tokenize of the span gives at least
 * `want` tokens, and copies the first `want` into out. *pos moves past the
 * span. Returns 1 (a passage), 0 (the text ran out first), -1 with err set. */
static int next_passage(const ak_tokenizer *tk, const char *text, size_t len, size_t *pos, int want, int32_t *out,
                        ak_error *err) {
    size_t a = *pos;
    while (a < len && is_space(text[a])) a++;
    size_t b = a;
    while (b < len) {
        /* one more word (and the whitespace before it) */
        while (b < len && is_space(text[b])) b++;
        while (b < len && !is_space(text[b])) b++;
        int32_t *ids = NULL;
        int n = 0;
        if (ak_memory_tokenize(tk, text + a, b - a, &ids, &n, err) < 0) return -1;
        if (n >= want) {
            memcpy(out, ids, sizeof(int32_t) * (size_t)want);
            free(ids);
            *pos = b;
            return 1;
        }
        free(ids);
    }
    *pos = len;
    return 0;
}

/* The contexts: n_pre (0 or 1: the BOS) + k*T + C tokens each, row-major in
 * *toks (malloc'd), at most max_ctx of them. Returns how many (0 when the
 * text does not hold one), or -1 with err set. */
static int make_contexts(const ak_tokenizer *tk, const char *text, size_t len, int n_pre, int32_t bos, int k, int T,
                         int C, int max_ctx, int32_t **toks, ak_error *err) {
    const int per = n_pre + k * T + C;
    int32_t *t = malloc(sizeof(int32_t) * (size_t)per * (size_t)max_ctx);
    if (!t) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    size_t pos = 0;
    int n = 0;
    for (; n < max_ctx; n++) {
        int32_t *c = t + (size_t)n * per;
        if (n_pre) c[0] = bos;
        int got = 1;
        for (int j = 0; j <= k && got == 1; j++)
            got = next_passage(tk, text, len, &pos, j < k ? T : C, c + n_pre + j * T, err);
        if (got < 0) { free(t); return -1; }
        if (got == 0) break;
    }
    *toks = t;
    return n;
}

/* ---- one prefill --------------------------------------------------------- */

/* Everything a context's runs share (one cache type). */
typedef struct {
    ak_ctx *ctx;
    ak_block_pool *pool;    /* the cache type's */
    ak_kv_format fmt;       /* K and V */
    int check_layer;        /* < 0: the library's default */
    int n_pre, k, T, C;
    const int32_t *toks;    /* the context's tokens */
    ak_kv **chunk_kv;       /* k chunks' caches, positions [0, T) */
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
    if (!(*kv = ak_kv_new(c->pool, c->fmt, c->fmt, c->n_pre + c->k * c->T + c->C, err))) return -1;
    double c0 = bench_cpu_ms(), t0 = ak_now();
    int rc = ak_reuse_prefill(c->ctx, *kv, c->parts, c->n_parts, &p, NULL, st, err);
    *ms = (ak_now() - t0) * 1e3;
    *cpu = bench_cpu_ms() - c0;
    return rc;
}

/* Medians of `reps` timed prefills (see run_prefill) into *ms and *cpu; then, unless
 * logits is NULL, the continuation evaluated on the cache with every
 * position's logits into logits (C x vocab). Returns 0, or -1 with err set. */
static int run_case(const bcase *c, ak_kv **kv, int bm, double r, int reps, double *ms, double *cpu,
                    ak_reuse_stats *st, float *logits, ak_error *err) {
    double t[64], u[64];
    if (reps > 64) reps = 64;
    for (int i = 0; i < reps; i++)
        if (run_prefill(c, kv, bm, r, &t[i], &u[i], st, err) < 0) return -1;
    *ms = bench_median(t, reps);
    *cpu = bench_median(u, reps);
    if (!logits) return 0;
    int at = c->n_pre + c->k * c->T;
    return ak_eval(c->ctx, *kv, c->toks + at, c->C, at, NULL, logits, NULL, NULL, err);
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
    int lx = n_ct * (L + PW + R) + 4, ly = T + 10;
    for (int bm = 0; bm < BM_FULL; bm++) {
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", lx, ly + 18 * bm,
                lx + 22, ly + 18 * bm, bm_color[bm],
                bm == BM_NONE ? " stroke-dasharray=\"5,4\"" : bm == BM_AKVS_W1 ? " stroke-dasharray=\"2,2\"" : "");
        fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", lx + 28, ly + 18 * bm + 4, bm_name[bm]);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\">full: KL 0 (reference)</text>\n", lx, ly + 18 * BM_FULL + 4);
    fprintf(f, "<text x=\"%d\" y=\"%d\">hollow, on the floor: KL 0</text>\n", lx, ly + 18 * BM_FULL + 22);
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

/* Prints the rows as {"rows": [...]} (speed_only: the quality fields null). */
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
    printf("\n]}\n");
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

int cmd_bench_reuse(int argc, char **argv) {
    ak_args a;
    args_init(&a, "bench reuse", argc, argv);
    const char *model_path = NULL, *data = NULL, *plot = NULL;
    int k = 4, T = 128, C = 64, max_ctx = 8, json = 0, speed_only = 0, reps = 1, n_threads = 0, check_layer = -1;
    int ratios_pct[MAX_LIST] = {0, 5, 10, 15, 30, 50, 100}, n_ratios = 7;
    int want[BM_COUNT] = {1, 1, 1, 1, 1};
    ak_kv_format cts[MAX_LIST] = {AK_KV_F16, AK_KV_Q4, AK_KV_TQ2};
    int n_ct = 3;
    cache_opts co;
    cache_opts_init(&co);
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) model_path = args_value(&a, f);
        else if (!strcmp(f, "--data")) data = args_value(&a, f);
        else if (!strcmp(f, "--plot")) plot = args_value(&a, f);
        else if (!strcmp(f, "--json")) json = 1;
        else if (!strcmp(f, "--speed-only")) speed_only = 1;
        else if (!strcmp(f, "--chunks")) k = (int)args_int(&a, f, 1, 64);
        else if (!strcmp(f, "--chunk-tokens")) T = (int)args_int(&a, f, 1, 1 << 20);
        else if (!strcmp(f, "--cont")) C = (int)args_int(&a, f, 2, 1 << 20);
        else if (!strcmp(f, "--contexts")) max_ctx = (int)args_int(&a, f, 1, 10000);
        else if (!strcmp(f, "--check-layer")) check_layer = (int)args_int(&a, f, 0, 4096);
        else if (!strcmp(f, "--reps")) reps = (int)args_int(&a, f, 1, 64);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) n_threads = (int)args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--ratios")) {
            const char *v = args_value(&a, f);
            if (v) n_ratios = args_int_list(&a, f, v, 0, 100, ratios_pct, MAX_LIST);
        } else if (!strcmp(f, "--methods")) {
            const char *v = args_value(&a, f);
            if (v) {
                memset(want, 0, sizeof want);
                parse_methods(&a, v, want);
            }
        } else if (!strcmp(f, "--cache-types")) {
            const char *v = args_value(&a, f);
            if (v) n_ct = parse_types(&a, v, cts, MAX_LIST);
        } else if (!strcmp(f, "--center") || !strcmp(f, "--no-center")) cache_opts_parse(&co, &a, f);
        else args_unknown(&a, f);
    }
    if (!a.failed && !model_path) args_error(&a, "-m MODEL is required");
    if (!a.failed && !data) args_error(&a, "--data FILE is required");
    if (!a.failed && plot && speed_only) args_error(&a, "--plot draws KL: not with --speed-only");
    if (a.failed) return AK_EXIT_USAGE;
    if (!speed_only) want[BM_FULL] = 1;   /* the harness check (the reference is computed either way) */

    loaded_model lm;
    if (load_model(&lm, "bench reuse", model_path) < 0) return 1;
    const ak_model *m = lm.model;
    const int vocab = m->cfg.vocab;
    ak_error err = {{0}};
    int rc = 1, n_ctx = 0, n_rows = 0;
    char *text = NULL;
    int32_t *toks = NULL;
    brow *rows = NULL;
    float *ref = NULL, *got = NULL;
    double *lp = NULL, *lq = NULL;
    ak_block_pool *pool = NULL;
    ak_kv *kv = NULL;
    ak_kv *chunk_kv[64] = {0};
    ak_reuse_part parts[65];
    ak_ctx *ctx = NULL;
    progress pg;
    progress_init(&pg, "bench reuse");
    const int n_pre = ak_tokenizer_add_bos(lm.tok) && ak_tokenizer_bos(lm.tok) >= 0 ? 1 : 0;
    const int per = n_pre + k * T + C;
    if (per > m->spec.n_ctx) {
        fprintf(stderr, "agentkv bench reuse: a context of %d tokens (%s%d chunks x %d + %d) exceeds the model's "
                        "context %d: use smaller --chunks, --chunk-tokens or --cont\n",
                per, n_pre ? "BOS + " : "", k, T, C, m->spec.n_ctx);
        unload_model(&lm);
        return AK_EXIT_USAGE;
    }
    for (int c = 0; c < n_ct; c++)
        if (!ak_kv_format_supports(cts[c], m->spec.head_dim_k) || !ak_kv_format_supports(cts[c], m->spec.head_dim_v)) {
            fprintf(stderr, "agentkv bench reuse: cache type %s cannot store this model's head dims (K %d, V %d)\n",
                    ak_kv_format_get(cts[c])->name, m->spec.head_dim_k, m->spec.head_dim_v);
            unload_model(&lm);
            return AK_EXIT_USAGE;
        }
    size_t len = 0;
    if (!(text = ak_read_file(data, &len, &err))) goto fail;
    n_ctx = make_contexts(lm.tok, text, len, n_pre, ak_tokenizer_bos(lm.tok), k, T, C, max_ctx, &toks, &err);
    if (n_ctx < 0) goto fail;
    if (n_ctx == 0) {
        ak_failc(&err, AK_ERR_INVALID, "%s does not hold one context (%d passages of %d tokens and one of %d): use "
                 "smaller --chunks, --chunk-tokens or --cont", data, k, T, C);
        goto fail;
    }
    /* rows: per cache type, each wanted method (ratio methods once per ratio) */
    rows = calloc((size_t)n_ct * BM_COUNT * MAX_LIST, sizeof *rows);
    ref = malloc(sizeof(float) * (size_t)C * vocab);
    got = malloc(sizeof(float) * (size_t)C * vocab);
    lp = malloc(sizeof(double) * vocab);
    lq = malloc(sizeof(double) * vocab);
    if (!rows || !ref || !got || !lp || !lq) { ak_failc(&err, AK_ERR_NOMEM, "out of memory"); goto fail; }
    for (int c = 0; c < n_ct; c++)
        for (int bm = 0; bm < BM_COUNT; bm++) {
            if (!want[bm]) continue;
            int nr = bm_uses_ratio(bm) ? n_ratios : 1;
            for (int i = 0; i < nr; i++) {
                brow *w = &rows[n_rows++];
                w->method = bm;
                w->ct = c;
                w->ratio = bm_uses_ratio(bm) ? ratios_pct[i] / 100.0 : bm == BM_FULL ? 1 : 0;
            }
        }
    if (!(ctx = ak_ctx_new(m, per, n_threads, &err))) goto fail;
    const int nt = ak_threads_size(ak_ctx_pool(ctx));
    fprintf(stderr, "bench reuse: %s, %d contexts of %s%d chunks x %d tokens + %d continuation tokens, %d threads%s\n",
            model_path, n_ctx, n_pre ? "BOS + " : "", k, T, C, nt, speed_only ? ", speed only" : "");
    const int runs_per_ctx = n_rows / n_ct + 1;
    long done = 0, total = (long)n_ct * n_ctx * runs_per_ctx;
    for (int c = 0; c < n_ct; c++) {
        cache_opts o = co;
        o.fk = o.fv = cts[c];
        if (!(pool = ak_block_pool_new(&m->spec, 0, 0, &err))) goto fail;
        if (cache_center(&o, ctx, lm.tok, pool, "bench reuse") < 0) { rc = 1; err.msg[0] = 0; goto fail; }
        for (int x = 0; x < n_ctx; x++) {
            const int32_t *ct = toks + (size_t)x * per;
            bcase bc = {.ctx = ctx, .pool = pool, .fmt = cts[c], .check_layer = check_layer, .n_pre = n_pre, .k = k,
                        .T = T, .C = C, .toks = ct, .chunk_kv = chunk_kv, .parts = parts};
            if (n_pre) {
                memset(&parts[bc.n_parts], 0, sizeof parts[0]);
                parts[bc.n_parts].tokens = ct;
                parts[bc.n_parts].n = 1;
                bc.n_parts++;
            }
            for (int j = 0; j < k; j++) {
                const int32_t *cj = ct + n_pre + j * T;
                if (!(chunk_kv[j] = ak_kv_new(pool, cts[c], cts[c], T, &err)) ||
                    ak_eval(ctx, chunk_kv[j], cj, T, 0, NULL, NULL, NULL, NULL, &err) < 0)
                    goto fail;
                memset(&parts[bc.n_parts], 0, sizeof parts[0]);
                parts[bc.n_parts].tokens = cj;
                parts[bc.n_parts].n = T;
                parts[bc.n_parts].chunk = chunk_kv[j];
                bc.n_parts++;
            }
            double full_ms, full_cpu;
            ak_reuse_stats st;
            if (c == 0 && x == 0) {
                /* warm-up: first-touch faults and scratch out of the timings */
                if (run_case(&bc, &kv, BM_FULL, 1, 1, &full_ms, &full_cpu, &st, NULL, &err) < 0) goto fail;
            }
            if (run_case(&bc, &kv, BM_FULL, 1, reps, &full_ms, &full_cpu, &st, speed_only ? NULL : ref, &err) < 0)
                goto fail;
            progress_update(&pg, (double)++done / total);
            for (int i = 0; i < n_rows; i++) {
                brow *w = &rows[i];
                if (w->ct != c) continue;
                double ms, cpu;
                if (run_case(&bc, &kv, w->method, w->ratio, reps, &ms, &cpu, &st, speed_only ? NULL : got, &err) < 0)
                    goto fail;
                w->ms += ms;
                w->cpu += cpu;
                w->full_cpu += full_cpu;
                w->recomputed += st.n_recomputed;
                w->check_layer = st.check_layer;
                w->full_ms += full_ms;
                for (int p = 0; !speed_only && p < C; p++) {
                    /* position p predicts continuation token p + 1 (none after the last) */
                    int next = p + 1 < C ? ct[n_pre + k * T + p + 1] : -1;
                    brm_acc_add(&w->acc, ref + (size_t)p * vocab, got + (size_t)p * vocab, vocab, next, lp, lq);
                }
                progress_update(&pg, (double)++done / total);
            }
            for (int j = 0; j < k; j++) {
                ak_kv_free(chunk_kv[j]);
                chunk_kv[j] = NULL;
            }
        }
        ak_kv_free(kv);
        kv = NULL;
        ak_block_pool_free(pool);
        pool = NULL;
    }
    progress_done(&pg);
    if (json) print_json(rows, n_rows, cts, n_ctx, n_ctx * C, speed_only);
    else {
        printf("bench reuse: %s (%s weights), %s; %d contexts of %s%d chunks x %d tokens + %d continuation tokens, "
               "%d threads\n",
               model_path, gguf_tensor_type_name(m->layers[0].wq.type), data, n_ctx, n_pre ? "BOS + " : "", k, T, C,
               nt);
        printf("reference: full recompute of the same context in the same cache type; chunks' KV computed alone at "
               "position 0 in that type\n");
        if (!speed_only)
            printf("KL(full || method) and agreement over %d continuation positions (teacher-forced), PPL over %d "
                   "next tokens\n", n_ctx * C, n_ctx * (C - 1));
        printf("prefill (ak_reuse_prefill of BOS + chunks): median of %d runs, mean per context; speedup: full's "
               "time / the method's (wall; cpu: this process's CPU time, all threads)\n", reps);
        print_table(rows, n_rows, cts, n_ct, n_ctx, speed_only);
    }
    if (plot && !speed_only) {
        char title[512];
        const char *base = strrchr(model_path, '/');
        snprintf(title, sizeof title, "agentkv bench reuse: %s, %d contexts, %d chunks x %d tokens, continuation %d",
                 base ? base + 1 : model_path, n_ctx, k, T, C);
        if (write_plot(plot, rows, n_rows, cts, n_ct, title, &err) < 0) goto fail;
        fprintf(stderr, "bench reuse: plot %s\n", plot);
    }
    rc = 0;
    goto done;
fail:
    progress_done(&pg);
    if (err.msg[0]) fprintf(stderr, "agentkv bench reuse: %s\n", err.msg);
done:
    for (int j = 0; j < 64; j++) ak_kv_free(chunk_kv[j]);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    ak_ctx_free(ctx);
    free(text); free(toks); free(rows); free(ref); free(got); free(lp); free(lq);
    unload_model(&lm);
    return rc;
}
