/* calib.c - see calib.h */
#include "engine/calib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY   /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "kv/kvcache.h"

/* Bumped whenever the text or the procedure changes: the id changes with
 * it, so files centered the old way become misses, not silently mixed. */
#define CALIB_VERSION 1
#define CALIB_CHUNK 512

/* Written for this purpose: varied registers so the mean is not one
 * genre's. Never an evaluation text. */
static const char calib_text[] =
    "The harbour was quiet in the early morning. A few boats rocked against the pier, and the smell of salt and "
    "diesel hung over the water. Mara walked past the fish market, where men in rubber boots were already "
    "stacking crates of ice, and turned up the narrow street that led to her aunt's bakery. The windows were "
    "fogged from the ovens inside.\n\n"
    "\"You're late,\" her aunt said without looking up from the dough. \"The bread won't wait for anyone.\"\n"
    "\"The bus broke down near the bridge. I walked the last two miles.\"\n"
    "\"Then wash your hands and start on the rolls. We open at seven.\"\n\n"
    "Installation notes\n\n"
    "1. Download the archive for your platform and verify its checksum.\n"
    "2. Extract it into a directory of your choice, for example /opt/tools.\n"
    "3. Add the bin directory to your PATH and open a new terminal.\n"
    "4. Run the self-test; it should report that every component was found.\n\n"
    "If the self-test fails, check that the configuration file is readable and that the port given in it is "
    "not already in use. Log files are written to the directory named by the LOG_DIR variable; when it is "
    "unset, they go to the current directory.\n\n"
    "Properties:\n"
    " - name: a short string that identifies the device.\n"
    " - rate: the sampling rate in hertz; must be one of 8000, 16000 or 48000.\n"
    " - enable-gpios: optional; the GPIO line that powers the chip.\n\n"
    "def moving_average(values, window):\n"
    "    \"\"\"Return the averages of each run of `window` consecutive values.\"\"\"\n"
    "    if window <= 0:\n"
    "        raise ValueError(\"window must be positive\")\n"
    "    total = sum(values[:window])\n"
    "    out = [total / window]\n"
    "    for i in range(window, len(values)):\n"
    "        total += values[i] - values[i - window]\n"
    "        out.append(total / window)\n"
    "    return out\n\n"
    "static int count_words(const char *s) {\n"
    "    int n = 0, in_word = 0;\n"
    "    for (; *s; s++) {\n"
    "        if (*s == ' ' || *s == '\\n') in_word = 0;\n"
    "        else if (!in_word) { in_word = 1; n++; }\n"
    "    }\n"
    "    return n;\n"
    "}\n\n"
    "Rivers carry sediment from the mountains to the sea. Where the current slows, at a bend or at the mouth, "
    "the heavier grains settle first: gravel, then sand, then silt. Over centuries these deposits build "
    "deltas, shift channels and bury the remains of older landscapes, which is why geologists read layers of "
    "rock much as historians read archives.\n\n"
    "Q: How many minutes are there in three and a half hours?\n"
    "A: Three hours are 180 minutes and half an hour is 30, so the answer is 210 minutes.\n\n"
    "The committee met on Tuesday to review the budget for the coming year. Most members agreed that the "
    "library needed new shelves and a better heating system, but there was a long discussion about whether "
    "to extend the opening hours on weekends. In the end they decided to run a trial for three months and "
    "count the visitors before making a final decision.\n\n"
    "| item | quantity | price |\n"
    "|------|----------|-------|\n"
    "| pens | 12 | 3.50 |\n"
    "| paper | 500 | 6.25 |\n"
    "| stapler | 1 | 9.99 |\n\n"
    "When the storm finally passed, the village came out to count the damage. Two roofs had lost their tiles, "
    "a tree lay across the road to the school, and the river had risen to within a hand's width of the old "
    "stone bridge. Nobody had been hurt. By evening the children were playing in the puddles again, and the "
    "baker had lit her ovens as if nothing had happened.\n";

const char *ak_calib_text(void) { return calib_text; }

/* The mean of the cnt vectors x + j*stride (j < cnt) of dimension d. */
static void mean_of(const float *x, size_t stride, long cnt, int d, float *mean) {
    double acc[1024] = {0};
    for (long j = 0; j < cnt; j++)
        for (int i = 0; i < d; i++) acc[i] += x[(size_t)j * stride + i];
    for (int i = 0; i < d; i++) mean[i] = (float)(acc[i] / (double)cnt);
}

void ak_calib_free(ak_calib *c) {
    free(c->mu_k);
    free(c->mu_v);
    memset(c, 0, sizeof *c);
}

int ak_calib_compute(ak_ctx *ctx, const ak_tokenizer *tk, ak_calib *out, ak_error *err) {
    const ak_model *m = ak_ctx_model(ctx);
    const ak_cache_spec *s = &m->spec;
    int add_bos = ak_tokenizer_add_bos(tk);
    int32_t *ids = NULL, *buf = NULL;
    size_t n_ids = 0;
    memset(out, 0, sizeof *out);
    if (ak_tokenize(tk, calib_text, sizeof calib_text - 1, add_bos ? AK_TOK_ADD_SPECIAL : 0, &ids, &n_ids, err) < 0)
        return -1;
    int chunk = CALIB_CHUNK;
    if (s->n_ctx > 0 && s->n_ctx < chunk) chunk = s->n_ctx;
    int H = s->n_head_kv, dk = s->head_dim_k, dv = s->head_dim_v, L = s->n_layer;
    size_t tk_floats = (size_t)L * H * dk, tv_floats = (size_t)L * H * dv;   /* per token */
    /* every key and value of the text, token-major: [token][layer][head][d] */
    float *K = malloc(sizeof(float) * tk_floats * (n_ids + 1)), *V = malloc(sizeof(float) * tv_floats * (n_ids + 1));
    ak_block_pool *pool = ak_block_pool_new(s, 0, 0, err);
    ak_kv *kv = pool ? ak_kv_new(pool, AK_KV_F32, AK_KV_F32, chunk, err) : NULL;
    int rc = -1;
    long count = 0;
    if (!kv) goto out;
    buf = malloc(sizeof(int32_t) * (size_t)chunk);
    out->mu_k = malloc(sizeof(float) * tk_floats);
    out->mu_v = malloc(sizeof(float) * tv_floats);
    if (!K || !V || !buf || !out->mu_k || !out->mu_v) { ak_fail(err, "out of memory"); goto out; }
    /* chunks of the token stream; each after the first starts with BOS again
     * (as a fresh sequence would) when the tokenizer adds one */
    int32_t bos = add_bos && n_ids ? ids[0] : -1;
    size_t at = add_bos ? 1 : 0;
    while (at < n_ids) {
        int n = 0;
        if (bos >= 0) buf[n++] = bos;
        while (n < chunk && at < n_ids) buf[n++] = ids[at++];
        if (n < 2) break;
        ak_kv_truncate(kv, 0);
        if (ak_eval(ctx, kv, &(ak_eval_args){.tokens = buf, .n = n}, err) < 0) goto out;
        for (int p = 1; p < n; p++, count++)   /* position 0: the sink, left out */
            for (int l = 0; l < L; l++)
                if (ak_kv_read(kv, l, p, K + count * tk_floats + (size_t)l * H * dk,
                               V + count * tv_floats + (size_t)l * H * dv, err) < 0)
                    goto out;
    }
    if (count == 0) { ak_fail(err, "calibration text gave no tokens"); goto out; }
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            size_t ok = ((size_t)l * H + h) * dk, ov = ((size_t)l * H + h) * dv;
            mean_of(K + ok, tk_floats, count, dk, out->mu_k + ok);
            mean_of(V + ov, tv_floats, count, dv, out->mu_v + ov);
        }
    XXH3_state_t hs;
    XXH3_64bits_reset(&hs);
    XXH3_64bits_update(&hs, out->mu_k, sizeof(float) * tk_floats);
    XXH3_64bits_update(&hs, out->mu_v, sizeof(float) * tv_floats);
    snprintf(out->id, sizeof out->id, "c%d-%016llx", CALIB_VERSION, (unsigned long long)XXH3_64bits_digest(&hs));
    rc = 0;
out:
    if (rc) ak_calib_free(out);
    ak_kv_free(kv);
    ak_block_pool_free(pool);
    free(K);
    free(V);
    free(buf);
    free(ids);
    return rc;
}

int ak_calib_install(ak_ctx *ctx, const ak_tokenizer *tk, ak_block_pool *pool, ak_kv_format fk, ak_kv_format fv,
                     unsigned sides, ak_error *err) {
    if (!((sides & AK_CENTER_K) && ak_kv_format_centers(fk)) && !((sides & AK_CENTER_V) && ak_kv_format_centers(fv)))
        return 0;
    ak_calib c;
    if (ak_calib_compute(ctx, tk, &c, err) < 0) return -1;
    /* all of it; the pool applies each part to the formats that gain */
    int rc = ak_block_pool_set_centers(pool, sides & AK_CENTER_K ? c.mu_k : NULL, sides & AK_CENTER_V ? c.mu_v : NULL,
                                       c.id, 0, 0, err);
    ak_calib_free(&c);
    return rc < 0 ? -1 : 1;
}
