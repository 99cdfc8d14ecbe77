/* test_window.c - gemma3's per-layer windowed KV layout (kvcache.h LAYER
 * GROUPS) on the tiny gemma3 file (window 16, 6 layers, every 6th global):
 * the local group keeps only the blocks its window can see, the pool's
 * bytes drop by what was released, the logits stay those of a sequence
 * that keeps everything, and a version 7 agent file stores and restores
 * exactly the live blocks. Every expectation is computed here from the
 * window, the block size and the length, not read back from the code. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "agents/agent.h"
#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "engine/model.h"
#include "text/sampler.h"
#include "store/store.h"
#include "store/store_impl.h"
#include "base/util.h"
#include "test.h"

enum { WT = 8 };   /* block size of these tests: two blocks a window */

/* Local blocks a sequence of len positions in blocks of T keeps when those
 * wholly before (len - W) are released: block i ([iT, (i+1)T)) stays when
 * (i + 1) T > len - W. Counted block by block. */
static int expect_local(int len, int T, int W) {
    int n = 0;
    for (int i = 0; i * T < len; i++) n += (i + 1) * T > len - W;
    return n;
}

/* Bytes one position of one layer takes in formats fk/fv (all KV heads). */
static size_t pos_bytes(const ak_model *m, ak_kv_format fk, ak_kv_format fv) {
    int dk = m->spec.head_dim_k, dv = m->spec.head_dim_v;
    return (size_t)m->cfg.n_head_kv * (ak_kv_format_code_bytes(fk, dk) + ak_kv_format_meta_bytes(fk, dk) +
                                       ak_kv_format_code_bytes(fv, dv) + ak_kv_format_meta_bytes(fv, dv));
}

/* Layers with a window (local), from the model's layers, not the spec. */
static int local_layers(const ak_model *m) {
    int n = 0;
    for (int l = 0; l < m->cfg.n_layer; l++) n += m->layers[l].window > 0;
    return n;
}

static ak_model *load_gemma3(ak_test_ctx *t) {
    char path[512];
    ak_error err = {{0}};
    ak_model *m = ak_model_load(test_path(path, sizeof path, "models/gemma3-tiny.gguf"), NULL, NULL, &err);
    if (!m) ak_test_fail(t, __FILE__, __LINE__, "load: %s", err.msg);
    return m;
}

/* (1) Generating well past several windows: after every step the local
 * group holds the expected blocks and the global group all of them; the
 * pool's bytes are those of the blocks held (it got back the released
 * ones); the logits equal bit for bit those of a twin sequence that keeps
 * every block (and so the greedy tokens). A truncation back below what was
 * released is refused by code. */
TEST(gemma3_window_releases_slid_out_blocks) {
    ak_model *m = load_gemma3(t);
    if (!m) return;
    ak_error err = {{0}};
    const int W = m->cfg.window, V = m->cfg.vocab, n0 = 24, steps = 72, nloc = local_layers(m);
    const int nglob = m->cfg.n_layer - nloc;
    ak_block_pool *pw = ak_block_pool_new(&m->spec, WT, 0, &err), *pf = ak_block_pool_new(&m->spec, WT, 0, &err);
    REQUIRE(pw && pf && W == 16 && nloc == 5 && nglob == 1, "setup: window %d, %d local layers (%s)", W, nloc, err.msg);
    ak_block_pool_set_window_release(pw, 1);
    ak_kv *kw = ak_kv_new(pw, AK_KV_F16, AK_KV_F16, 256, &err), *kf = ak_kv_new(pf, AK_KV_F16, AK_KV_F16, 256, &err);
    ak_ctx *c = ak_ctx_new(m, 32, 2, &err);
    float *lw = malloc(sizeof(float) * V), *lf = malloc(sizeof(float) * V);
    int32_t toks[24];
    for (int i = 0; i < n0; i++) toks[i] = 100 + (i * 211) % 20000;
    REQUIRE(kw && kf && c && lw && lf, "setup: %s", err.msg);
    REQUIRE(ak_kv_groups(kw) == 2 && ak_kv_groups(kf) == 2, "gemma3 has two layer groups");
    REQUIRE(ak_eval(c, kw, &(ak_eval_args){.tokens = toks, .n = n0, .logits = lw}, &err) == 0 &&
            ak_eval(c, kf, &(ak_eval_args){.tokens = toks, .n = n0, .logits = lf}, &err) == 0, "prefill: %s", err.msg);
    size_t pb = pos_bytes(m, AK_KV_F16, AK_KV_F16) * WT;   /* one layer's share of a block */
    int bad_count = 0, bad_bytes = 0, differ = 0, crossings = 0;
    for (int i = 0; i <= steps; i++) {
        int len = ak_kv_length(kw), nb = (len + WT - 1) / WT;
        int loc = expect_local(len, WT, W);
        if (ak_kv_group_blocks(kw, 1) != loc || ak_kv_group_blocks(kw, 0) != nb || ak_kv_group_blocks(kf, 1) != nb) {
            if (!bad_count++)
                ak_test_fail(t, __FILE__, __LINE__, "length %d: local %d (expected %d), global %d (%d), twin %d", len,
                             ak_kv_group_blocks(kw, 1), loc, ak_kv_group_blocks(kw, 0), nb, ak_kv_group_blocks(kf, 1));
        }
        ak_block_pool_stats sw, sf;
        ak_block_pool_get_stats(pw, &sw);
        ak_block_pool_get_stats(pf, &sf);
        size_t want = (size_t)nb * nglob * pb + (size_t)loc * nloc * pb;
        if (sw.used != want || sw.blocks != (size_t)(nb + loc) || sf.used - sw.used != (size_t)(nb - loc) * nloc * pb) {
            if (!bad_bytes++)
                ak_test_fail(t, __FILE__, __LINE__, "length %d: pool holds %zu bytes in %zu blocks, expected %zu in %d",
                             len, sw.used, sw.blocks, want, nb + loc);
        }
        differ += memcmp(lw, lf, sizeof(float) * V) != 0;
        if (i == steps) break;
        int32_t tok = ak_argmax(lf, V);
        REQUIRE(ak_eval(c, kw, &(ak_eval_args){.tokens = &tok, .n = 1, .pos0 = len, .logits = lw}, &err) == 0 &&
                ak_eval(c, kf, &(ak_eval_args){.tokens = &tok, .n = 1, .pos0 = len, .logits = lf}, &err) == 0,
                "decode at %d: %s", len, err.msg);
        crossings += (len + 1) % W == 0;
    }
    int len = ak_kv_length(kw);
    CHECK(len == n0 + steps && crossings >= 5, "length %d, %d windows crossed", len, crossings);
    CHECK(differ == 0, "%d of %d steps' logits differ from the sequence that keeps every block", differ, steps + 1);
    CHECK(ak_kv_window_first(kw) == (len - W) / WT * WT, "local layers hold from %d, expected %d",
          ak_kv_window_first(kw), (len - W) / WT * WT);
    /* a released position cannot be read back; a held one can */
    float *kbuf = malloc(sizeof(float) * 4 * (size_t)m->spec.n_head_kv * (m->spec.head_dim_k + m->spec.head_dim_v));
    int l0 = 0;
    while (!m->layers[l0].window) l0++;
    REQUIRE(kbuf, "oom");
    float *vbuf = kbuf + (size_t)m->spec.n_head_kv * m->spec.head_dim_k;
    CHECK(ak_kv_read(kw, l0, 0, kbuf, vbuf, &err) < 0 && err.code == AK_ERR_INVALID, "a released position was read");
    CHECK(ak_kv_read(kw, l0, len - 1, kbuf, vbuf, &err) == 0, "the last position: %s", err.msg);
    CHECK(ak_kv_stored(kw, l0, 0, 0, 0, 0) == NULL && ak_kv_stored(kw, l0, 0, 0, 0, len - 1) != NULL,
          "stored bytes of a released / held position");
    free(kbuf);
    /* back below what was released: the next token would need those keys */
    ak_kv_truncate(kw, 20);
    int32_t tok = 5;
    err.code = 0;
    CHECK(ak_eval(c, kw, &(ak_eval_args){.tokens = &tok, .n = 1, .pos0 = 20, .logits = lw}, &err) < 0 &&
          err.code == AK_ERR_INVALID, "a step after truncating below the released blocks was not refused (code %d)",
          err.code);
    /* a fork shares the local blocks too: freeing the original keeps them */
    ak_kv_truncate(kf, len);
    ak_kv *fk = ak_kv_fork(kf, &err);
    REQUIRE(fk, "fork: %s", err.msg);
    CHECK(ak_kv_group_blocks(fk, 1) == ak_kv_group_blocks(kf, 1), "fork's local blocks");
    printf("    gemma3 window %d, blocks of %d: after %d positions the local layers hold %d of %d blocks\n", W, WT, len,
           expect_local(len, WT, W), (len + WT - 1) / WT);
    ak_kv_free(fk);
    free(lw); free(lf);
    ak_ctx_free(c);
    ak_kv_free(kw); ak_kv_free(kf);
    ak_block_pool_free(pw); ak_block_pool_free(pf);
    ak_model_free(m);
}

/* The data section's size of a plain agent file (size - 8 - header). */
static long data_bytes_of(const char *path, char **header) {
    size_t len;
    ak_error err = {{0}};
    uint8_t *img = (uint8_t *)ak_read_file(path, &len, &err);
    if (!img || len < 8) { free(img); return -1; }
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)img[i] << (8 * i);
    if (n > len - 8) { free(img); return -1; }
    if (header && (*header = malloc(n + 1))) {
        memcpy(*header, img + 8, n);
        (*header)[n] = 0;
    }
    free(img);
    return (long)(len - 8 - n);
}

/* (3) + (4) A hot gemma3 agent that crossed the window at least 3 times is
 * saved (version 7: only the local layers' live blocks), restored warm into
 * a fresh pool and sequence, and continues bit for bit as the hot one; the
 * file's data is smaller than the one of a twin that keeps every block by
 * exactly the released blocks' bytes; a truncated or altered file is
 * CORRUPT, and the sequence it was loaded into is left as it was. */
static void check_window_file(ak_test_ctx *t, ak_kv_format fk, ak_kv_format fv) {
    ak_model *m = load_gemma3(t);
    if (!m) return;
    ak_error err = {{0}};
    const int W = m->cfg.window, V = m->cfg.vocab, n = 60, steps = 24, nloc = local_layers(m);
    char dir[600], pw7[700], pfull[700], pbad[700];
    snprintf(dir, sizeof dir, "%s/window-%s-%s", test_tmp_dir(), ak_kv_format_get(fk)->name, ak_kv_format_get(fv)->name);
    ak_block_pool *ph = ak_block_pool_new(&m->spec, WT, 0, &err), *pn = ak_block_pool_new(&m->spec, WT, 0, &err);
    ak_block_pool *pr = ak_block_pool_new(&m->spec, WT, 0, &err);
    REQUIRE(ph && pn && pr, "pools: %s", err.msg);
    ak_block_pool_set_window_release(ph, 1);
    ak_block_pool_set_window_release(pr, 1);
    ak_kv *hot = ak_kv_new(ph, fk, fv, 256, &err), *naive = ak_kv_new(pn, fk, fv, 256, &err);
    ak_kv *warm = ak_kv_new(pr, fk, fv, 256, &err);
    ak_ctx *c = ak_ctx_new(m, 64, 2, &err);
    ak_store *st = ak_store_open(dir, NULL, &err);
    float *lh = malloc(sizeof(float) * V), *lw = malloc(sizeof(float) * V);
    int32_t toks[60 + 24];
    for (int i = 0; i < n; i++) toks[i] = 7 + (i * 389) % 9000;
    REQUIRE(hot && naive && warm && c && st && lh && lw, "setup: %s", err.msg);
    REQUIRE(ak_eval(c, hot, &(ak_eval_args){.tokens = toks, .n = n, .logits = lh}, &err) == 0 &&
            ak_eval(c, naive, &(ak_eval_args){.tokens = toks, .n = n}, &err) == 0, "prefill: %s", err.msg);
    CHECK(n / W >= 3 && ak_kv_window_first(hot) > 0, "%d positions cross the window %d times", n, n / W);
    REQUIRE(ak_store_save(st, "w7", hot, toks, n, m->fingerprint, NULL, &err) == 0 &&
                ak_store_save(st, "full", naive, toks, n, m->fingerprint, NULL, &err) == 0,
            "save: %s", err.msg);
    snprintf(pw7, sizeof pw7, "%s/w7.safetensors", dir);
    snprintf(pfull, sizeof pfull, "%s/full.safetensors", dir);
    char *h7 = NULL, *hf = NULL;
    long d7 = data_bytes_of(pw7, &h7), dfull = data_bytes_of(pfull, &hf);
    int wf = ak_kv_window_first(hot), released = wf / WT;
    long expect = (long)released * nloc * (long)(pos_bytes(m, fk, fv) * WT);
    CHECK(d7 > 0 && dfull - d7 == expect, "data %ld bytes against %ld keeping every block: %ld less, expected %ld", d7,
          dfull, dfull - d7, expect);
    CHECK(h7 && strstr(h7, "\"format_version\":\"7\"") && hf && strstr(hf, "\"format_version\":\"5\""),
          "versions: the windowed file 7, the full one 5");
    printf("    gemma3 %s/%s: %d positions, local layers from %d: file data %ld bytes against %ld (ratio %.3f)\n",
           ak_kv_format_get(fk)->name, ak_kv_format_get(fv)->name, n, wf, d7, dfull, dfull > 0 ? (double)d7 / dfull : 0);
    free(h7); free(hf);

    /* restored warm in a fresh pool: the same live blocks, then the same logits */
    ak_store_load_info info;
    ak_store_status r = ak_store_load(st, "w7", m->fingerprint, V, warm, &info, &err);
    REQUIRE(r == AK_STORE_HIT && info.n_tokens == n, "restore: %s %s", ak_store_status_name(r), err.msg);
    free(info.tokens);
    CHECK(ak_kv_group_blocks(warm, 1) == ak_kv_group_blocks(hot, 1) &&
              ak_kv_group_blocks(warm, 0) == ak_kv_group_blocks(hot, 0) && ak_kv_window_first(warm) == wf,
          "restored %d/%d blocks from %d, hot %d/%d from %d", ak_kv_group_blocks(warm, 0), ak_kv_group_blocks(warm, 1),
          ak_kv_window_first(warm), ak_kv_group_blocks(hot, 0), ak_kv_group_blocks(hot, 1), wf);
    int differ = 0, tokdiff = 0;
    for (int i = 0; i < steps; i++) {
        int32_t tok = ak_argmax(lh, V);
        REQUIRE(ak_eval(c, hot, &(ak_eval_args){.tokens = &tok, .n = 1, .pos0 = n + i, .logits = lh}, &err) == 0 &&
                ak_eval(c, warm, &(ak_eval_args){.tokens = &tok, .n = 1, .pos0 = n + i, .logits = lw}, &err) == 0,
                "decode: %s", err.msg);
        differ += memcmp(lh, lw, sizeof(float) * V) != 0;
        tokdiff += ak_argmax(lh, V) != ak_argmax(lw, V);
    }
    CHECK(differ == 0 && tokdiff == 0, "%d of %d steps' logits (%d tokens) differ after the warm restore", differ,
          steps, tokdiff);
    CHECK(ak_kv_group_blocks(warm, 1) == expect_local(n + steps, WT, W), "the restored agent releases as it goes");

    /* into blocks of twice the size: the local layers from the block that
     * holds window_first on, then the same tokens as the hot agent (the
     * block order of the online softmax differs: close, not bit for bit) */
    {
        ak_block_pool *p2 = ak_block_pool_new(&m->spec, 2 * WT, 0, &err);
        REQUIRE(p2, "pool: %s", err.msg);
        ak_block_pool_set_window_release(p2, 1);
        ak_kv *w2 = ak_kv_new(p2, fk, fv, 256, &err);
        REQUIRE(w2, "kv: %s", err.msg);
        r = ak_store_load(st, "w7", m->fingerprint, V, w2, NULL, &err);
        CHECK(r == AK_STORE_HIT && ak_kv_window_first(w2) == wf / (2 * WT) * (2 * WT) &&
                  ak_kv_group_blocks(w2, 1) == (n + 2 * WT - 1) / (2 * WT) - wf / (2 * WT),
              "blocks of %d: %s %s, local from %d, %d local blocks", 2 * WT, ak_store_status_name(r), err.msg,
              ak_kv_window_first(w2), ak_kv_group_blocks(w2, 1));
        float *l2 = malloc(sizeof(float) * V);
        int32_t tok = toks[n - 1];
        double md = 0;
        REQUIRE(l2 &&
                ak_eval(c, naive, &(ak_eval_args){.tokens = &tok, .n = 1, .pos0 = n - 1, .logits = lh}, &err) == 0 &&
                ak_eval(c, w2, &(ak_eval_args){.tokens = &tok, .n = 1, .pos0 = n - 1, .logits = l2}, &err) == 0,
                "decode: %s", err.msg);
        for (int i = 0; i < V; i++) md = fabs(lh[i] - l2[i]) > md ? fabs(lh[i] - l2[i]) : md;
        CHECK(ak_argmax(lh, V) == ak_argmax(l2, V) && md < 1e-3, "blocks of %d: the last token's logits differ by %g",
              2 * WT, md);
        free(l2);
        ak_kv_free(w2);
        ak_block_pool_free(p2);
    }

    /* (4) truncated, and one byte of a local layer's last block altered */
    size_t len;
    uint8_t *img = (uint8_t *)ak_read_file(pw7, &len, &err);
    REQUIRE(img, "read: %s", err.msg);
    struct { const char *id; size_t keep; long flip; } bad[] = {
        {.id = "cut1", .keep = len - 1, .flip = -1}, {.id = "cut2", .keep = len / 2, .flip = -1},
        {.id = "cut3", .keep = 200, .flip = -1}, {.id = "flip", .keep = len, .flip = (long)len - 3}};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        snprintf(pbad, sizeof pbad, "%s/%s.safetensors", dir, bad[k].id);
        FILE *f = fopen(pbad, "wb");
        REQUIRE(f, "open %s", pbad);
        if (bad[k].flip >= 0) img[bad[k].flip] ^= 0x5a;
        fwrite(img, 1, bad[k].keep, f);
        fclose(f);
        if (bad[k].flip >= 0) img[bad[k].flip] ^= 0x5a;
        ak_kv *x = ak_kv_new(pr, fk, fv, 256, &err);
        REQUIRE(x, "kv: %s", err.msg);
        r = ak_store_load(st, bad[k].id, m->fingerprint, V, x, NULL, &err);
        CHECK(r == AK_STORE_CORRUPT && ak_kv_length(x) == 0 && ak_kv_n_blocks(x) == 0, "%s: %s (%s), %d positions",
              bad[k].id, ak_store_status_name(r), err.msg, ak_kv_length(x));
        ak_kv_free(x);
    }
    free(img);
    free(lh); free(lw);
    ak_store_close(st);
    ak_ctx_free(c);
    ak_kv_free(hot); ak_kv_free(naive); ak_kv_free(warm);
    ak_block_pool_free(ph); ak_block_pool_free(pn); ak_block_pool_free(pr);
    ak_model_free(m);
}

TEST(gemma3_window_agent_file_restores_warm_as_hot) {
    check_window_file(t, AK_KV_F16, AK_KV_F16);
    check_window_file(t, AK_KV_Q8, AK_KV_TQ3);
}

/* What cannot hold a windowed sequence refuses by code: a pool file of a
 * sequence whose local layers released blocks, a linked (prefix-shared)
 * block, shared blocks appended as a segment, a mixed (card) block; an
 * agent snapshot of it works. */
TEST(gemma3_window_refusals_by_code) {
    ak_model *m = load_gemma3(t);
    if (!m) return;
    ak_error err = {{0}};
    ak_block_pool *p = ak_block_pool_new(&m->spec, WT, 0, &err);
    REQUIRE(p, "pool: %s", err.msg);
    ak_block_pool_set_window_release(p, 1);
    ak_kv *kv = ak_kv_new(p, AK_KV_F16, AK_KV_F16, 128, &err), *e = ak_kv_new(p, AK_KV_F16, AK_KV_F16, 128, &err);
    ak_ctx *c = ak_ctx_new(m, 64, 2, &err);
    int32_t toks[48];
    for (int i = 0; i < 48; i++) toks[i] = 11 + i * 97;
    REQUIRE(kv && e && c && ak_eval(c, kv, &(ak_eval_args){.tokens = toks, .n = 48}, &err) == 0,
            "prefill: %s", err.msg);
    REQUIRE(ak_kv_window_first(kv) > 0, "nothing released");
    ak_block *b = ak_kv_span(kv, 0, NULL, NULL);
    err.code = 0;
    CHECK(ak_kv_link(e, b, &err) < 0 && err.code == AK_ERR_INVALID && ak_kv_length(e) == 0, "link: code %d", err.code);
    err.code = 0;
    CHECK(ak_kv_append_blocks(e, &b, 1, WT, &err) < 0 && err.code == AK_ERR_INVALID && ak_kv_length(e) == 0,
          "append: code %d", err.code);
    ak_kv_format fk[WT], fv[WT];
    for (int i = 0; i < WT; i++) fk[i] = fv[i] = AK_KV_Q8;
    err.code = 0;
    CHECK(ak_block_alloc_mixed(p, fk, fv, WT, &err) == NULL && err.code == AK_ERR_INVALID, "mixed: code %d", err.code);
    /* a pool file would have to hold every position of every layer */
    err.code = 0;
    ak_snapshot *sn = ak_store_snapshot_kind(AK_FILE_POOL, &(ak_store_save_args){.id = "px", .kv = kv, .tokens = toks,
                                             .n_tokens = 48, .source = "t", .fingerprint = m->fingerprint}, NULL,
                                             "0123456789abcdef", &err);
    CHECK(!sn && err.code == AK_ERR_INVALID, "pool snapshot of a windowed sequence: code %d", err.code);
    ak_snapshot_free(sn);
    /* an agent's is version 7 */
    sn = ak_store_snapshot("x", kv, toks, 48, m->fingerprint, NULL, &err);
    CHECK(sn != NULL, "agent snapshot: %s", err.msg);
    ak_snapshot_free(sn);
    ak_kv_free(e);
    ak_kv_free(kv);
    ak_ctx_free(c);
    ak_block_pool_free(p);
    ak_model_free(m);
}

/* Through the agents: an agent's sliding-window layers release as it goes
 * (the agents' pool turns it on), so after a turn well past the window the
 * pool holds its global blocks and only the local blocks its window sees;
 * its greedy tokens are a fresh sequence's that keeps every block; a next
 * prompt that diverges before what the local layers still hold is computed
 * from the start and gives the fresh sequence's logits bit for bit. */
TEST(gemma3_window_agent_turns) {
    ak_model *m = load_gemma3(t);
    if (!m) return;
    ak_error err = {{0}};
    const int W = m->cfg.window, V = m->cfg.vocab, n = 30, gen = 40, T = AK_DEFAULT_BLOCK_TOKENS / 4;
    const int nloc = local_layers(m), nglob = m->cfg.n_layer - nloc;
    ak_block_pool *pool = ak_block_pool_new(&m->spec, T, 0, &err), *pf = ak_block_pool_new(&m->spec, T, 0, &err);
    REQUIRE(pool && pf, "pool: %s", err.msg);
    ak_agents_config cfg = {.model = m, .pool = pool, .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = 256,
                            .save = AK_SAVE_EVERY_TURN};
    ak_agents *ag = ak_agents_new(&cfg, &err);
    ak_ctx *c = ak_ctx_new(m, 64, 2, &err);
    ak_kv *ref = ak_kv_new(pf, AK_KV_F16, AK_KV_F16, 256, &err);
    float *la = malloc(sizeof(float) * V), *lr = malloc(sizeof(float) * V);
    int32_t toks[30 + 40 + 1];
    for (int i = 0; i < n; i++) toks[i] = 3 + (i * 577) % 12000;
    REQUIRE(ag && c && ref && la && lr, "setup: %s", err.msg);
    ak_turn tu;
    REQUIRE(ak_agent_begin(ag, c, "g", toks, n, la, &tu, &err) == 0, "begin: %s", err.msg);
    REQUIRE(ak_eval(c, ref, &(ak_eval_args){.tokens = toks, .n = n, .logits = lr}, &err) == 0, "ref: %s", err.msg);
    int differ = memcmp(la, lr, sizeof(float) * V) != 0;
    for (int i = 0; i < gen; i++) {
        toks[n + i] = ak_argmax(la, V);
        REQUIRE(ak_agent_step(ag, c, "g", toks[n + i], la, &err) == 0, "step: %s", err.msg);
        REQUIRE(ak_eval(c, ref, &(ak_eval_args){.tokens = &toks[n + i], .n = 1, .pos0 = n + i, .logits = lr},
                        &err) == 0, "ref: %s", err.msg);
        differ += memcmp(la, lr, sizeof(float) * V) != 0;
    }
    REQUIRE(ak_agent_end(ag, "g", &err) == 0, "end: %s", err.msg);
    CHECK(differ == 0, "%d of %d steps of the agent differ from a sequence keeping every block", differ, gen + 1);
    int len = n + gen, nb = (len + T - 1) / T, loc = expect_local(len, T, W);
    size_t pb = pos_bytes(m, AK_KV_F16, AK_KV_F16) * T;
    ak_block_pool_stats st;
    ak_block_pool_get_stats(pool, &st);
    CHECK(st.blocks == (size_t)(nb + loc) && st.used == (size_t)nb * nglob * pb + (size_t)loc * nloc * pb,
          "the agent's pool holds %zu blocks (%zu bytes), expected %d global + %d local", st.blocks, st.used, nb, loc);
    /* what growing to len + 2T positions needs: two more global blocks,
     * and local blocks for every span not released and not held */
    int want = (len + 2 * T + T - 1) / T, released = len > W ? (len - W) / T : 0;
    size_t need = (size_t)(want - nb) * nglob * pb + (size_t)(want - released - loc) * nloc * pb;
    CHECK(ak_agent_bytes_needed(ag, "g", len + 2 * T) == need, "bytes needed for %d positions: %zu, expected %zu",
          len + 2 * T, ak_agent_bytes_needed(ag, "g", len + 2 * T), need);
    /* diverge at position 3: far before the window, so computed from 0 */
    int32_t p2[8];
    memcpy(p2, toks, sizeof p2);
    p2[3] ^= 1;
    ak_kv_truncate(ref, 0);
    REQUIRE(ak_agent_begin(ag, c, "g", p2, 8, la, &tu, &err) == 0, "diverged begin: %s (code %d)", err.msg, err.code);
    REQUIRE(ak_eval(c, ref, &(ak_eval_args){.tokens = p2, .n = 8, .logits = lr}, &err) == 0, "ref: %s", err.msg);
    CHECK(tu.match == AK_MATCH_DIVERGE && memcmp(la, lr, sizeof(float) * V) == 0,
          "a prompt diverging before the window: match %d, logits %s", tu.match,
          memcmp(la, lr, sizeof(float) * V) ? "differ" : "equal");
    ak_agent_end(ag, "g", &err);
    ak_agents_free(ag);
    free(la); free(lr);
    ak_ctx_free(c);
    ak_kv_free(ref);
    ak_block_pool_free(pool); ak_block_pool_free(pf);
    ak_model_free(m);
}
