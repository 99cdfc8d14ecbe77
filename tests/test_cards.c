/* test_cards.c - CacheCards: card files (round trip of every width and
 * tensor, sizes, corrupt / truncated / stale / sealed files), cards built
 * as mixed blocks (each slot the card's bytes), and imports into agents on
 * a real tiny model (continuation equal to a re-prefill at 16 bits, close
 * at 8, no prefill of the card's tokens, bad input refused by code). */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agents/agent.h"
#include "store/cards.h"
#include "text/sampler.h"
#include "test.h"
#include "test_model_env.h"
#include "agent_turn.h"
#include "test_store_util.h"

static const char *card_dir_for(const char *name) {
    static char buf[2][512];
    static int k;
    char *b = buf[k++ & 1];
    snprintf(b, 512, "%s/cards-%s", test_tmp_dir(), name);
    return b;
}

/* Counts (and deletes) files of dir/quarantine named "card+<id>.safetensors.*". */
static int card_quarantined(const char *dir, const char *id) {
    char pre[200];
    snprintf(pre, sizeof pre, "card+%s", id);
    return quarantined(dir, pre);
}

/* Widths from a seeded generator: every width appears on both sides. */
static void random_widths(uint8_t *wk, uint8_t *wv, int n, uint64_t seed) {
    ak_rng rng;
    ak_rng_seed(&rng, seed);
    for (int i = 0; i < n; i++) {
        wk[i] = (uint8_t)(2 << (i < 4 ? i : (int)(ak_rng_u32(&rng) % 4)));
        wv[i] = (uint8_t)(2 << (i < 4 ? 3 - i : (int)(ak_rng_u32(&rng) % 4)));
    }
}

/* 1 if two cards hold the same metadata, widths, tokens and tensor bytes. */
static int cards_equal(const ak_card *a, const ak_card *b) {
    if (strcmp(a->id, b->id) || strcmp(a->source_agent, b->source_agent) || strcmp(a->fingerprint, b->fingerprint) ||
        strcmp(a->model_name, b->model_name) || strcmp(a->policy, b->policy) || strcmp(a->hash, b->hash) ||
        a->n_tokens != b->n_tokens || a->pos_offset != b->pos_offset || a->created != b->created ||
        a->budget_k != b->budget_k || a->budget_v != b->budget_v || memcmp(&a->spec, &b->spec, sizeof a->spec) ||
        memcmp(a->count, b->count, sizeof a->count))
        return 0;
    if (memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n_tokens) ||
        memcmp(a->widths_k, b->widths_k, (size_t)a->n_tokens) || memcmp(a->widths_v, b->widths_v, (size_t)a->n_tokens))
        return 0;
    for (int l = 0; l < a->spec.n_layer; l++)
        for (int s = 0; s < 2; s++)
            for (int c = 0; c < AK_CARD_N_WIDTHS; c++)
                for (int comp = 0; comp < 2; comp++) {
                    size_t n = ak_card_component_bytes(a, s, c, comp);
                    int i = ak_card_slot(l, s, c, comp);
                    if (n && memcmp(a->data[i], b->data[i], n)) return 0;
                }
    return 1;
}

/* Expected vector of one side of one position: the source's floats
 * through the width's format (quantize, dequantize). */
static void expect_vec(const float *x, int d, ak_kv_format f, float *out) {
    uint8_t tmp[4096];
    ak_kv_format_get(f)->quantize(x, d, tmp);
    ak_kv_format_get(f)->dequantize(tmp, d, out);
}

/* The stored bytes (codes then metadata, as quantize writes them) of entry
 * ent of (layer l, side sd, class cls) of card c, format f, dim d. */
static void card_vec(const ak_card *c, int l, int sd, int cls, size_t ent, ak_kv_format f, int d, uint8_t *out) {
    ak_kv_component cp[2];
    int nc = ak_kv_format_components(f, d, cp);
    for (int q = 0; q < nc; q++)
        memcpy(out + cp[q].offset, c->data[ak_card_slot(l, sd, cls, q)] + ent * cp[q].bytes, cp[q].bytes);
}

TEST(cards_file_round_trip_every_width) {
    ak_cache_spec s = small_spec();
    cache src;
    REQUIRE(cache_make(&src, &s, 16, AK_KV_F32, AK_KV_F32, 256, 45, 7) == 0, "cache");
    enum { N = 40 };
    uint8_t wk[N], wv[N];
    random_widths(wk, wv, N, 3);
    ak_error err = {{0}};
    ak_card_params p = {.id = "c1", .source_agent = "alice", .fingerprint = FP, .model_name = "tiny", .from = 5,
                        .to = 45, .widths_k = wk, .widths_v = wv, .policy = "importance", .budget_k = 5.5};
    ak_card *c = ak_card_make(src.kv, src.tokens, &p, &err);
    REQUIRE(c, "make: %s", err.msg);
    for (int sd = 0; sd < 2; sd++)
        for (int k = 0; k < AK_CARD_N_WIDTHS; k++) CHECK(c->count[sd][k] > 0, "side %d width class %d unused", sd, k);
    CHECK(c->pos_offset == 5 && c->n_tokens == N && !memcmp(c->tokens, src.tokens + 5, sizeof(int32_t) * N), "range");
    CHECK(c->budget_k == 5.5, "budget_k %g", c->budget_k);
    /* every vector is the source's float through its width's format */
    int H = s.n_head_kv, worst = 0;
    float k[256], v[256], e[64];
    for (int l = 0; l < s.n_layer; l++) {
        int at[2][4] = {{0}};
        for (int i = 0; i < N; i++) {
            ak_kv_read(src.kv, l, 5 + i, k, v, NULL);
            for (int sd = 0; sd < 2; sd++) {
                int w = sd ? wv[i] : wk[i], cls = ak_card_width_class(w), d = sd ? s.head_dim_v : s.head_dim_k;
                ak_kv_format f = sd ? ak_card_value_format(w) : ak_card_key_format(w);
                for (int h = 0; h < H; h++) {
                    uint8_t vec[4096], got[4096];
                    ak_kv_format_get(f)->quantize((sd ? v : k) + h * d, d, vec);
                    card_vec(c, l, sd, cls, (size_t)at[sd][cls] * H + h, f, d, got);
                    if (memcmp(vec, got, ak_kv_format_get(f)->vec_bytes(d))) worst++;
                }
                at[sd][cls]++;
            }
        }
    }
    CHECK(worst == 0, "%d vectors are not the source's quantized bytes", worst);
    /* save, load, compare everything */
    const char *dir = card_dir_for("roundtrip");
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "%s", err.msg);
    REQUIRE(ak_store_save_card(st, c, &err) == 0, "save: %s", err.msg);
    ak_card *r = NULL;
    ak_store_status ls = ak_store_load_card(st, "c1", FP, &s, VOCAB, &r, &err);
    REQUIRE(ls == AK_STORE_HIT, "load: %s (%s)", ak_store_status_name(ls), err.msg);
    CHECK(cards_equal(c, r), "the loaded card differs from the saved one");
    ak_store_card_entry ent;
    CHECK(ak_store_lookup_card(st, "c1", &ent) == 0 && ent.n_tokens == N && !strcmp(ent.hash, c->hash) &&
              !strcmp(ent.source_agent, "alice") && ent.pos_offset == 5 && ent.readable,
          "index entry");
    ak_card_free(r);
    /* the index of a reopened store reads the file */
    ak_store_close(st);
    st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "%s", err.msg);
    ak_store_card_entry *list = NULL;
    int nl = 0;
    REQUIRE(ak_store_list_cards(st, &list, &nl, &err) == 0, "%s", err.msg);
    CHECK(nl == 1 && !strcmp(list[0].id, "c1") && list[0].readable && !strcmp(list[0].hash, c->hash) &&
              fabs(list[0].mean_k - c->budget_k) < 20,
          "%d cards listed", nl);
    free(list);
    /* the card as mixed blocks: each position reads back as the source's
     * vectors through the token's formats (no re-quantization on import) */
    ak_kv *kv = ak_kv_new(src.pool, AK_KV_Q8, AK_KV_Q8, 256, &err);
    REQUIRE(kv && ak_card_attach(c, kv, &err) == 0, "attach: %s", err.msg);
    CHECK(ak_kv_length(kv) == N && ak_kv_has_mixed(kv), "length %d", ak_kv_length(kv));
    int bad = 0;
    float kk[256], vv[256];
    for (int l = 0; l < s.n_layer; l++)
        for (int i = 0; i < N; i++) {
            ak_kv_read(src.kv, l, 5 + i, k, v, NULL);
            ak_kv_read(kv, l, i, kk, vv, NULL);
            for (int h = 0; h < H; h++) {
                expect_vec(k + h * s.head_dim_k, s.head_dim_k, ak_card_key_format(wk[i]), e);
                if (memcmp(e, kk + h * s.head_dim_k, sizeof(float) * s.head_dim_k)) bad++;
                expect_vec(v + h * s.head_dim_v, s.head_dim_v, ak_card_value_format(wv[i]), e);
                if (memcmp(e, vv + h * s.head_dim_v, sizeof(float) * s.head_dim_v)) bad++;
            }
            int a, b;
            if (!ak_card_slot_widths(kv, i, &a, &b) || a != wk[i] || b != wv[i]) bad++;
        }
    CHECK(bad == 0, "%d vectors of the imported card differ from the expected ones", bad);
    /* a card of a card keeps or lowers each width, never raises it */
    ak_card_params p2 = {.id = "c2", .source_agent = "bob", .fingerprint = FP, .to = N};   /* asks 16 everywhere */
    ak_card *c2 = ak_card_make(kv, c->tokens, &p2, &err);
    REQUIRE(c2, "%s", err.msg);
    CHECK(!memcmp(c2->widths_k, wk, N) && !memcmp(c2->widths_v, wv, N), "re-carded widths must stay capped");
    ak_card_free(c2);
    ak_kv_free(kv);
    ak_card_free(c);
    ak_store_close(st);
    cache_free(&src);
}

/* A card made on a thread pool is the card made on the caller, bit for bit;
 * a vector whose stored format is its width's format (q8 keys and values
 * at 8 bits, from a q8 source) is the stored bytes, copied; any other is the source's floats quantized into its
 * width's format (in the flushed-denormals mode every thread uses). */
TEST(cards_make_on_threads_copies_equal_formats) {
    ak_cache_spec s = small_spec();
    cache src;
    REQUIRE(cache_make(&src, &s, 16, AK_KV_Q8, AK_KV_Q8, 256, 70, 11) == 0, "cache");
    enum { N = 61 };
    uint8_t wk[N], wv[N];
    random_widths(wk, wv, N, 5);
    ak_error err = {{0}};
    ak_threads *tp = ak_threads_new(2, &err);
    REQUIRE(tp, "%s", err.msg);
    ak_card_params p = {.id = "c1", .source_agent = "alice", .fingerprint = FP, .model_name = "tiny", .from = 3,
                        .to = 3 + N, .widths_k = wk, .widths_v = wv, .policy = "given"};
    ak_card *c1 = ak_card_make(src.kv, src.tokens, &p, &err);
    p.threads = tp;
    ak_card *c2 = ak_card_make(src.kv, src.tokens, &p, &err);
    REQUIRE(c1 && c2, "make: %s", err.msg);
    CHECK(cards_equal(c1, c2) && !strcmp(c1->hash, c2->hash), "the card made on 2 threads differs");
    int H = s.n_head_kv, copied = 0, bad = 0;
    float k[256], v[256];
    unsigned mode = ak_flush_denormals();
    for (int l = 0; l < s.n_layer; l++) {
        int at[2][4] = {{0}};
        for (int i = 0; i < N; i++) {
            ak_kv_read(src.kv, l, 3 + i, k, v, NULL);
            for (int sd = 0; sd < 2; sd++) {
                int w = sd ? wv[i] : wk[i], cls = ak_card_width_class(w), d = sd ? s.head_dim_v : s.head_dim_k;
                ak_kv_format f = sd ? ak_card_value_format(w) : ak_card_key_format(w);
                ak_kv_component cp[2];
                int nc = ak_kv_format_components(f, d, cp);
                for (int h = 0; h < H; h++) {
                    uint8_t want[4096], got[4096];
                    size_t ent = (size_t)at[sd][cls] * H + h;
                    if (f == AK_KV_Q8) {   /* the source's own format: its bytes */
                        for (int q = 0; q < nc; q++)
                            memcpy(want + cp[q].offset, ak_kv_stored(src.kv, l, sd, q, h, 3 + i), cp[q].bytes);
                        copied++;
                    } else {
                        ak_kv_format_get(f)->quantize((sd ? v : k) + h * d, d, want);
                    }
                    card_vec(c2, l, sd, cls, ent, f, d, got);
                    if (memcmp(want, got, ak_kv_format_get(f)->vec_bytes(d))) bad++;
                }
                at[sd][cls]++;
            }
        }
    }
    ak_restore_denormals(mode);
    CHECK(copied > 0, "no vector at the source's format");
    CHECK(bad == 0, "%d vectors are neither the stored bytes nor the source quantized", bad);
    /* blocks filled on threads are the blocks filled here */
    ak_kv *a1 = ak_kv_new(src.pool, AK_KV_Q8, AK_KV_Q8, 256, &err), *a2 = ak_kv_new(src.pool, AK_KV_Q8, AK_KV_Q8, 256, &err);
    REQUIRE(a1 && a2 && ak_card_attach(c2, a1, &err) == 0 && ak_card_attach_on(c2, a2, tp, &err) == 0, "attach: %s",
            err.msg);
    int differ = 0;
    float k2[256], v2[256];
    for (int l = 0; l < s.n_layer; l++)
        for (int i = 0; i < N; i++) {
            ak_kv_read(a1, l, i, k, v, NULL);
            ak_kv_read(a2, l, i, k2, v2, NULL);
            differ += memcmp(k, k2, sizeof(float) * H * s.head_dim_k) || memcmp(v, v2, sizeof(float) * H * s.head_dim_v);
        }
    CHECK(differ == 0, "%d positions differ between blocks filled on threads and here", differ);
    ak_kv_free(a1);
    ak_kv_free(a2);
    ak_card_free(c1);
    ak_card_free(c2);
    ak_threads_free(tp);
    cache_free(&src);
}

/* A sealed store writes a card through its staging chunk (header and
 * tensors crossing chunk edges) and reads back the same card; the file is
 * not the plaintext. */
TEST(cards_sealed_round_trip) {
    ak_cache_spec s = small_spec();
    cache src;
    REQUIRE(cache_make(&src, &s, 16, AK_KV_F32, AK_KV_F32, 512, 300, 9) == 0, "cache");
    enum { N = 290 };
    uint8_t wk[N], wv[N];
    random_widths(wk, wv, N, 8);
    ak_error err = {{0}};
    ak_card_params p = {.id = "sc", .source_agent = "alice", .fingerprint = FP, .model_name = "tiny", .from = 4,
                        .to = 4 + N, .widths_k = wk, .widths_v = wv, .policy = "given"};
    ak_card *c = ak_card_make(src.kv, src.tokens, &p, &err);
    REQUIRE(c, "make: %s", err.msg);
    REQUIRE(ak_card_vector_bytes(c) > 2 * (64 * 1024), "the card must span several seal chunks");
    uint8_t key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(i * 7 + 1);
    const char *dir = card_dir_for("sealed");
    ak_store *st = ak_store_open(dir, key, &err);
    REQUIRE(st, "%s", err.msg);
    REQUIRE(ak_store_save_card(st, c, &err) == 0, "save: %s", err.msg);
    ak_card *r = NULL;
    ak_store_status ls = ak_store_load_card(st, "sc", FP, &s, VOCAB, &r, &err);
    CHECK(ls == AK_STORE_HIT && cards_equal(c, r), "sealed load: %s (%s)", ak_store_status_name(ls), err.msg);
    ak_card_free(r);
    char path[1024];
    snprintf(path, sizeof path, "%s/cards/sc.safetensors", dir);
    FILE *f = fopen(path, "rb");
    REQUIRE(f, "no file %s", path);
    char head[64] = {0};
    size_t got = fread(head, 1, sizeof head - 1, f);
    fclose(f);
    CHECK(got > 0 && !memmem(head, got, "__metadata__", 12) && !memmem(head, got, "agentkv", 7),
          "the sealed file starts in plaintext");
    ak_store_close(st);
    ak_card_free(c);
    cache_free(&src);
}

TEST(cards_bytes_per_token_by_budget) {
    ak_cache_spec s = small_spec();
    cache src;
    REQUIRE(cache_make(&src, &s, 32, AK_KV_F32, AK_KV_F32, 128, 64, 11) == 0, "cache");
    ak_error err = {{0}};
    size_t f16 = 0;
    double ratio[4];
    for (int wi = 0; wi < 4; wi++) {
        int w = 2 << wi;
        uint8_t ws[64];
        memset(ws, w, sizeof ws);
        ak_card_params p = {.id = "b", .fingerprint = FP, .to = 64, .widths_k = ws, .widths_v = ws,
                            .policy = "uniform", .budget_k = w, .budget_v = w};
        ak_card *c = ak_card_make(src.kv, src.tokens, &p, &err);
        REQUIRE(c, "%s", err.msg);
        /* independently: each format's documented bits per value */
        double want = 64.0 * s.n_layer * s.n_head_kv *
                      (ak_kv_format_bits(ak_card_key_format(w), s.head_dim_k) * s.head_dim_k +
                       ak_kv_format_bits(ak_card_value_format(w), s.head_dim_v) * s.head_dim_v) / 8;
        CHECK(fabs((double)ak_card_vector_bytes(c) - want) < 1e-6, "width %d: %zu bytes, want %.1f", w,
              ak_card_vector_bytes(c), want);
        f16 = ak_card_f16_bytes(c);
        ratio[wi] = (double)ak_card_vector_bytes(c) / (double)f16;
        printf("    width %2d: %.1f bytes/token (f16 %.1f): %.3f of f16\n", w, ak_card_vector_bytes(c) / 64.0,
               f16 / 64.0, ratio[wi]);
        ak_card_free(c);
    }
    CHECK(fabs(ratio[3] - 1.0) < 1e-12, "16 bits is f16's size");
    CHECK(ratio[0] < ratio[1] && ratio[1] < ratio[2] && ratio[2] < ratio[3], "sizes grow with the width");
    CHECK(ratio[0] < 0.25 && ratio[1] < 0.35, "2 and 4 bits: %.3f %.3f of f16", ratio[0], ratio[1]);
    cache_free(&src);
}

TEST(cards_bad_files_are_refused_by_code) {
    ak_cache_spec s = small_spec();
    cache src;
    REQUIRE(cache_make(&src, &s, 16, AK_KV_F32, AK_KV_F32, 256, 30, 5) == 0, "cache");
    uint8_t wk[30], wv[30];
    random_widths(wk, wv, 30, 9);
    ak_error err = {{0}};
    const char *dir = card_dir_for("bad");
    ak_store *st = ak_store_open(dir, NULL, &err);
    REQUIRE(st, "%s", err.msg);
    ak_card_params p = {.id = "x", .fingerprint = FP, .to = 30, .widths_k = wk, .widths_v = wv};
    ak_card *c = ak_card_make(src.kv, src.tokens, &p, &err);
    REQUIRE(c && ak_store_save_card(st, c, &err) == 0, "save: %s", err.msg);
    char path[700];
    snprintf(path, sizeof path, "%s/cards/x.safetensors", dir);
    struct stat sb;
    REQUIRE(stat(path, &sb) == 0, "no file");
    size_t n = (size_t)sb.st_size;
    uint8_t *good = malloc(n), *bad = malloc(n);
    FILE *f = fopen(path, "rb");
    REQUIRE(f && fread(good, 1, n, f) == n, "read");
    fclose(f);
    ak_card *r = NULL;
    /* another model: STALE, left in place */
    CHECK(ak_store_load_card(st, "x", "fedcba9876543210", &s, VOCAB, &r, &err) == AK_STORE_STALE &&
              err.code == AK_ERR_STALE && exists(path),
          "another model: %s", err.msg);
    ak_cache_spec s2 = s;
    s2.n_layer = 2;
    CHECK(ak_store_load_card(st, "x", FP, &s2, VOCAB, &r, &err) == AK_STORE_STALE && exists(path), "another spec");
    CHECK(ak_store_load_card(st, "nope", FP, &s, VOCAB, &r, &err) == AK_STORE_ABSENT && err.code == AK_ERR_NOT_FOUND,
          "absent");
    /* a flipped byte anywhere (header, widths, each part of the data) and
     * every truncation: CORRUPT and quarantined, never a card */
    size_t at[] = {20, n / 3, n / 2, n - 1, n - 200};
    for (int i = 0; i < 5; i++) {
        memcpy(bad, good, n);
        bad[at[i]] ^= 0x10;
        REQUIRE(write_bytes(path, bad, n) == 0, "write");
        r = NULL;
        ak_store_status ls = ak_store_load_card(st, "x", FP, &s, VOCAB, &r, &err);
        CHECK(ls == AK_STORE_CORRUPT && err.code == AK_ERR_CORRUPT && !r, "flip at %zu: %s (%s)", at[i],
              ak_store_status_name(ls), err.msg);
        CHECK(!exists(path) && card_quarantined(dir, "x") == 1, "flip at %zu: not quarantined", at[i]);
    }
    size_t cut[] = {4, 100, n / 2, n - 1};
    for (int i = 0; i < 4; i++) {
        REQUIRE(write_bytes(path, good, cut[i]) == 0, "write");
        ak_store_status ls = ak_store_load_card(st, "x", FP, &s, VOCAB, &r, &err);
        CHECK(ls == AK_STORE_CORRUPT && err.code == AK_ERR_CORRUPT, "cut at %zu: %s", cut[i], ak_store_status_name(ls));
        CHECK(card_quarantined(dir, "x") == 1, "cut at %zu: not quarantined", cut[i]);
    }
    /* a token id outside the vocabulary of the caller */
    REQUIRE(write_bytes(path, good, n) == 0, "write");
    CHECK(ak_store_verify_card(st, "x", FP, &s, 1, &err) == AK_STORE_CORRUPT && exists(path), "vocab check");
    CHECK(ak_store_verify_card(st, "x", FP, &s, VOCAB, &err) == AK_STORE_HIT, "sound: %s", err.msg);
    /* the other id's name: the card_id inside does not match */
    char other[700];
    snprintf(other, sizeof other, "%s/cards/y.safetensors", dir);
    REQUIRE(write_bytes(other, good, n) == 0, "write");
    CHECK(ak_store_load_card(st, "y", FP, &s, VOCAB, &r, &err) == AK_STORE_CORRUPT, "renamed card");
    card_quarantined(dir, "y");
    /* removal */
    CHECK(ak_store_remove_card(st, "x", &err) == 0 && !exists(path) && ak_store_remove_card(st, "x", &err) == 1,
          "remove");
    ak_store_card_entry e;
    CHECK(ak_store_lookup_card(st, "x", &e) == 1, "removed card still indexed");
    ak_store_close(st);
    /* sealed: round trip under the key; plain store and another key: STALE */
    uint8_t key[32], key2[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(i * 7 + 1), key2[i] = (uint8_t)(i * 5 + 3);
    const char *sdir = card_dir_for("sealed");
    st = ak_store_open(sdir, key, &err);
    REQUIRE(st && ak_store_save_card(st, c, &err) == 0, "sealed save: %s", err.msg);
    r = NULL;
    CHECK(ak_store_load_card(st, "x", FP, &s, VOCAB, &r, &err) == AK_STORE_HIT && r && cards_equal(c, r),
          "sealed round trip: %s", err.msg);
    ak_card_free(r);
    ak_store_close(st);
    char spath[700];
    snprintf(spath, sizeof spath, "%s/cards/x.safetensors", sdir);
    FILE *sf = fopen(spath, "rb");
    REQUIRE(sf, "sealed file");
    uint8_t head[8];
    CHECK(fread(head, 1, 8, sf) == 8 && !memcmp(head, "AKVSEAL1", 8), "sealed magic");
    fclose(sf);
    st = ak_store_open(sdir, NULL, &err);
    CHECK(ak_store_load_card(st, "x", FP, &s, VOCAB, &r, &err) == AK_STORE_STALE && exists(spath), "sealed, no key");
    ak_store_close(st);
    st = ak_store_open(sdir, key2, &err);
    CHECK(ak_store_load_card(st, "x", FP, &s, VOCAB, &r, &err) == AK_STORE_STALE && exists(spath), "another key");
    ak_store_close(st);
    /* bad parameters */
    uint8_t w3[30];
    memset(w3, 3, sizeof w3);
    ak_card_params pb = p;
    pb.widths_k = w3;
    CHECK(!ak_card_make(src.kv, src.tokens, &pb, &err) && err.code == AK_ERR_INVALID, "width 3");
    pb = p;
    pb.to = 31;
    CHECK(!ak_card_make(src.kv, src.tokens, &pb, &err) && err.code == AK_ERR_INVALID, "range past the context");
    pb = p;
    pb.from = 10;
    pb.to = 10;
    CHECK(!ak_card_make(src.kv, src.tokens, &pb, &err) && err.code == AK_ERR_INVALID, "empty range");
    pb = p;
    pb.id = ".hidden";
    CHECK(!ak_card_make(src.kv, src.tokens, &pb, &err) && err.code == AK_ERR_INVALID, "bad id");
    free(good);
    free(bad);
    ak_card_free(c);
    cache_free(&src);
}

/* ---- imports on a real tiny model --------------------------------------- */


static ak_agents *agents_on(tenv *e, ak_block_pool **pool, ak_store *store) {
    ak_error err = {{0}};
    *pool = ak_block_pool_new(&e->m->spec, 0, 0, &err);
    ak_agents_config c = {.model = e->m, .pool = *pool, .store = store, .fk = AK_KV_F16, .fv = AK_KV_F16,
                          .n_ctx = 256, .save = AK_SAVE_EVERY_TURN};
    return *pool ? ak_agents_new(&c, &err) : NULL;
}

/* A greedy turn (agent_turn.h) on e. */
static int mturn(ak_test_ctx *t, tenv *e, ak_agents *ag, turn_req r) {
    return greedy_turn(t, e->ctx, e->logits, e->vocab, ag, r);
}

/* Greedy tokens of a fresh f16 cache with the prompt prefilled at once;
 * first logits into first. */
static void mreprefill(tenv *e, const int32_t *prompt, int n, int n_gen, int32_t *out, float *first) {
    ak_error err = {{0}};
    ak_block_pool *pool = ak_block_pool_new(&e->m->spec, 0, 0, &err);
    ak_kv *kv = ak_kv_new(pool, AK_KV_F16, AK_KV_F16, 256, &err);
    ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = prompt, .n = n, .logits = e->logits}, &err);
    memcpy(first, e->logits, sizeof(float) * (size_t)e->vocab);
    for (int i = 0; i < n_gen; i++) {
        out[i] = ak_argmax(e->logits, e->vocab);
        ak_eval(e->ctx, kv, &(ak_eval_args){.tokens = &out[i], .n = 1, .pos0 = n + i, .logits = e->logits}, &err);
    }
    ak_kv_free(kv);
    ak_block_pool_free(pool);
}

/* A card's file is written behind: ak_card_wait_saved waits for it, a card
 * removed while its write is queued waits and removes the file, shutdown
 * writes what is queued; the card is usable from RAM meanwhile. */
TEST(cards_written_behind_land_on_wait_remove_and_shutdown) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    const char *dir = card_dir_for("behind");
    ak_store *store = ak_store_open(dir, NULL, &err);
    REQUIRE(store, "%s", err.msg);
    ak_block_pool *pool;
    ak_agents *ag = agents_on(&e, &pool, store);
    REQUIRE(ag, "agents");
    int32_t prompt[24], gen[2];
    for (int i = 0; i < 24; i++) prompt[i] = i ? (int32_t)((i * 29 + 5) % e.vocab) : 1;
    ak_turn ti;
    REQUIRE(mturn(t, &e, ag, (turn_req){.id = "alice", .prompt = prompt, .n = 24, .n_gen = 2, .out = gen,
                                         .info = &ti}) == 0, "alice");
    ak_card_request rq;
    memset(&rq, 0, sizeof rq);
    char ids[3][AK_AGENT_ID_MAX + 1];
    for (int k = 0; k < 3; k++) {
        rq.card_id = k == 0 ? "w0" : k == 1 ? "w1" : "w2";
        REQUIRE(ak_agent_make_card(ag, "alice", &rq, ids[k], &err) == 0, "make: %s", err.msg);
        REQUIRE(ak_card_get(ag, ids[k], &err), "in RAM: %s", err.msg);
    }
    ak_card_wait_saved(ag, "w0");
    ak_store_card_entry ce;
    CHECK(ak_store_lookup_card(store, "w0", &ce) == 0 && ce.bytes > 0, "w0's file after the wait");
    CHECK(ak_card_remove(ag, "w1", &err) == 0, "remove w1: %s", err.msg);
    CHECK(ak_store_lookup_card(store, "w1", &ce) != 0, "w1's file removed with it");
    ak_agents_free(ag);   /* writes w2 if still queued */
    ak_store_close(store);
    store = ak_store_open(dir, NULL, &err);
    REQUIRE(store, "%s", err.msg);
    ak_card *c = NULL;
    CHECK(ak_store_load_card(store, "w2", NULL, NULL, 0, &c, &err) == AK_STORE_HIT && c && c->n_tokens == 25,
          "w2 after shutdown: %s", err.msg);
    CHECK(ak_store_lookup_card(store, "w1", &ce) != 0, "w1 stays removed");
    ak_card_free(c);
    ak_store_close(store);
    ak_block_pool_free(pool);
    tenv_close(&e);
}

TEST(cards_import_replace_on_a_real_model) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    const char *dir = card_dir_for("import");
    ak_store *store = ak_store_open(dir, NULL, &err);
    REQUIRE(store, "%s", err.msg);
    ak_block_pool *pool;
    ak_agents *ag = agents_on(&e, &pool, store);
    REQUIRE(ag, "agents");
    enum { NP = 40, NG = 8 };
    int32_t prompt[NP], gen[NG], ref[NG], got[NG];
    for (int i = 0; i < NP; i++) prompt[i] = i ? (int32_t)((i * 37 + 11) % e.vocab) : 1;
    ak_turn ti;
    REQUIRE(mturn(t, &e, ag, (turn_req){.id = "alice", .prompt = prompt, .n = NP, .n_gen = NG, .out = gen,
                                         .info = &ti}) == 0, "alice");
    /* the card: alice's whole history at 16 bits */
    char cid[AK_AGENT_ID_MAX + 1];
    ak_card_request rq;
    memset(&rq, 0, sizeof rq);
    REQUIRE(ak_agent_make_card(ag, "alice", &rq, cid, &err) == 0, "make: %s", err.msg);
    CHECK(!strcmp(cid, "alice-1"), "generated id %s", cid);
    const ak_card *c16 = ak_card_get(ag, cid, &err);
    REQUIRE(c16, "%s", err.msg);
    int n = c16->n_tokens;
    CHECK(n == NP + NG - 1, "card of %d tokens, alice holds %d", n, NP + NG - 1);
    /* bob continues from the card: the card's tokens and one new one */
    int32_t *p2 = malloc(sizeof(int32_t) * (size_t)(n + 1));
    memcpy(p2, c16->tokens, sizeof(int32_t) * (size_t)n);
    p2[n] = (int32_t)(5 % e.vocab);
    REQUIRE(ak_agent_import_card(ag, "bob", cid, &err) == 0, "import: %s", err.msg);
    float *lref = malloc(sizeof(float) * (size_t)e.vocab), *lgot = malloc(sizeof(float) * (size_t)e.vocab);
    mreprefill(&e, p2, n + 1, NG, ref, lref);
    REQUIRE(mturn(t, &e, ag, (turn_req){.id = "bob", .prompt = p2, .n = n + 1, .n_gen = NG, .out = got, .first = lgot,
                                         .info = &ti}) == 0, "bob");
    CHECK(ti.reused == n && ti.prefilled == 1, "bob reused %d, prefilled %d (card %d)", ti.reused, ti.prefilled, n);
    CHECK(!memcmp(got, ref, sizeof got), "16-bit card: bob's continuation differs from a re-prefill");
    double d16 = 0;
    for (int i = 0; i < e.vocab; i++) d16 = fmax(d16, fabs((double)lgot[i] - lref[i]));
    /* the same f16 bits, summed class by class in a mixed block: not the
     * same order as a uniform block's, so equal up to float rounding */
    CHECK(d16 < 1e-4, "16-bit card: logits differ by %.3g", d16);
    /* a prompt that leaves the card after 20 tokens: the card's base is
     * shortened in place, the rest computed as a re-prefill would */
    {
        int32_t pd[24], rd[NG], gd[NG];
        memcpy(pd, c16->tokens, sizeof(int32_t) * 20);
        pd[20] = 9, pd[21] = 8, pd[22] = 7, pd[23] = 6;
        REQUIRE(ak_agent_import_card(ag, "gus", cid, &err) == 0, "import: %s", err.msg);
        float *ld = malloc(sizeof(float) * (size_t)e.vocab);
        mreprefill(&e, pd, 24, NG, rd, ld);
        free(ld);
        REQUIRE(mturn(t, &e, ag, (turn_req){.id = "gus", .prompt = pd, .n = 24, .n_gen = NG, .out = gd,
                                             .info = &ti}) == 0, "gus");
        CHECK(ti.match == AK_MATCH_DIVERGE && ti.reused == 20 && !memcmp(gd, rd, sizeof gd),
              "diverging inside the card: match %s, reused %d", ak_match_name(ti.match), ti.reused);
    }
    /* 8 bits: close logits */
    uint8_t *w8 = malloc((size_t)n);
    memset(w8, 8, (size_t)n);
    rq.card_id = "c8";
    rq.widths_k = rq.widths_v = w8;
    rq.policy = "uniform";
    REQUIRE(ak_agent_make_card(ag, "alice", &rq, cid, &err) == 0, "make 8: %s", err.msg);
    REQUIRE(ak_agent_import_card(ag, "carol", "c8", &err) == 0, "import 8: %s", err.msg);
    REQUIRE(mturn(t, &e, ag, (turn_req){.id = "carol", .prompt = p2, .n = n + 1, .n_gen = NG, .out = got,
                                         .first = lgot, .info = &ti}) == 0, "carol");
    CHECK(ti.reused == n && ti.prefilled == 1, "carol reused %d", ti.reused);
    double d8 = 0, mx = 0;
    for (int i = 0; i < e.vocab; i++) d8 = fmax(d8, fabs((double)lgot[i] - lref[i])), mx = fmax(mx, fabs((double)lref[i]));
    printf("    8-bit card: max |logit diff| %.4f (max |logit| %.2f); 16-bit: %.3g\n", d8, mx, d16);
    CHECK(d8 > 0 && d8 < 0.05 * mx, "8-bit card: max |diff| %.4f of %.2f", d8, mx);
    /* bad input, each refused by code, nothing else disturbed */
    CHECK(ak_agent_import_card(ag, "bob", "nope", &err) < 0 && err.code == AK_ERR_NOT_FOUND, "unknown: %s", err.msg);
    rq.card_id = "far";
    rq.from = 0;
    rq.to = n + 50;
    CHECK(ak_agent_make_card(ag, "alice", &rq, cid, &err) < 0 && err.code == AK_ERR_INVALID, "range: %s", err.msg);
    rq.to = 0;
    rq.card_id = "c8";
    CHECK(ak_agent_make_card(ag, "alice", &rq, cid, &err) < 0 && err.code == AK_ERR_EXISTS, "write-once: %s", err.msg);
    /* widths from bitalloc under a budget: the mean stays within it; a
     * budget outside [2, 16] is refused */
    memset(&rq, 0, sizeof rq);
    rq.card_id = "b4";
    rq.budget_k = 4;
    rq.budget_v = 3;
    REQUIRE(ak_agent_make_card(ag, "alice", &rq, cid, &err) == 0, "budget 4: %s", err.msg);
    const ak_card *b4 = ak_card_get(ag, "b4", &err);
    REQUIRE(b4, "%s", err.msg);
    long sk = 0, sv = 0;
    for (int i = 0; i < b4->n_tokens; i++) sk += b4->widths_k[i], sv += b4->widths_v[i];
    CHECK(sk <= 4L * b4->n_tokens && sk > 2L * b4->n_tokens && sv <= 3L * b4->n_tokens && !strcmp(b4->policy, "uniform"),
          "budget 4/3: %ld/%ld bits over %d tokens, policy %s", sk, sv, b4->n_tokens, b4->policy);
    rq.card_id = "b1";
    rq.budget_k = 1;
    CHECK(ak_agent_make_card(ag, "alice", &rq, cid, &err) < 0 && err.code == AK_ERR_INVALID, "budget 1: %s", err.msg);
    rq.budget_k = 17;
    CHECK(ak_agent_make_card(ag, "alice", &rq, cid, &err) < 0 && err.code == AK_ERR_INVALID, "budget 17: %s", err.msg);
    /* a card of offset 5 */
    memset(&rq, 0, sizeof rq);
    rq.card_id = "mid";
    rq.from = 5;
    REQUIRE(ak_agent_make_card(ag, "alice", &rq, cid, &err) == 0, "mid: %s", err.msg);
    CHECK(ak_agent_import_card(ag, "frank", "mid", &err) == 0, "a card of offset 5: %s", err.msg);
    /* another model's card, and a corrupt one, written straight to the store */
    {
        ak_kv *kv = ak_kv_new(pool, AK_KV_F16, AK_KV_F16, 256, &err);
        ak_kv_prepare(kv, 0, 4, &err);
        ak_eval(e.ctx, kv, &(ak_eval_args){.tokens = prompt, .n = 4, .logits = e.logits}, &err);
        ak_card_params cp = {.id = "other", .fingerprint = "feedfacefeedface", .to = 4};
        ak_card *oc = ak_card_make(kv, prompt, &cp, &err);
        REQUIRE(oc && ak_store_save_card(store, oc, &err) == 0, "%s", err.msg);
        snprintf(oc->fingerprint, sizeof oc->fingerprint, "%s", e.m->fingerprint);
        snprintf(oc->id, sizeof oc->id, "bad");
        ak_card_content_hash(oc, oc->hash);
        REQUIRE(ak_store_save_card(store, oc, &err) == 0, "%s", err.msg);
        ak_card_free(oc);
        ak_kv_free(kv);
        char path[700];
        snprintf(path, sizeof path, "%s/cards/bad.safetensors", dir);
        struct stat sb;
        REQUIRE(stat(path, &sb) == 0 && truncate(path, sb.st_size - 3) == 0, "truncate");
    }
    CHECK(ak_agent_import_card(ag, "bob", "other", &err) < 0 && err.code == AK_ERR_STALE, "other model: %s", err.msg);
    CHECK(ak_agent_import_card(ag, "bob", "bad", &err) < 0 && err.code == AK_ERR_CORRUPT, "corrupt: %s", err.msg);
    CHECK(card_quarantined(dir, "bad") == 1, "the corrupt card is not in quarantine");
    /* busy: an agent in a turn */
    REQUIRE(ak_agent_begin(ag, e.ctx, "dave", prompt, 3, e.logits, &ti, &err) == 0, "%s", err.msg);
    CHECK(ak_agent_import_card(ag, "dave", "c8", &err) < 0 && err.code == AK_ERR_BUSY, "busy: %s", err.msg);
    CHECK(ak_agent_end(ag, "dave", &err) == 0, "%s", err.msg);
    /* a card held by agents cannot be removed */
    CHECK(ak_card_remove(ag, "alice-1", &err) < 0 && err.code == AK_ERR_BUSY && strstr(err.msg, "bob"), "remove: %s",
          err.msg);
    /* bob undisturbed: his cache still continues as the re-prefill does */
    int32_t p3[300];
    memcpy(p3, p2, sizeof(int32_t) * (size_t)(n + 1));
    memcpy(p3 + n + 1, ref, sizeof(int32_t) * (NG - 1));
    int n3 = n + NG;
    p3[n3] = 9;
    int32_t ref3[NG], got3[NG];
    mreprefill(&e, p3, n3 + 1, NG, ref3, lref);
    REQUIRE(mturn(t, &e, ag, (turn_req){.id = "bob", .prompt = p3, .n = n3 + 1, .n_gen = NG, .out = got3,
                                         .info = &ti}) == 0, "bob again");
    CHECK(ti.reused == n3 && !memcmp(got3, ref3, sizeof got3), "bob after the refusals: reused %d of %d", ti.reused, n3);
    /* bob survives a restart: his file records the card, the restore
     * re-imports it (no recompute of the card's tokens) */
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ag = agents_on(&e, &pool, store);
    REQUIRE(ag, "agents again");
    int n4 = n3 + NG;
    memcpy(p3 + n3 + 1, ref3, sizeof(int32_t) * (NG - 1));
    p3[n4] = 7;
    int32_t ref4[NG], got4[NG];
    mreprefill(&e, p3, n4 + 1, NG, ref4, lref);
    REQUIRE(mturn(t, &e, ag, (turn_req){.id = "bob", .prompt = p3, .n = n4 + 1, .n_gen = NG, .out = got4,
                                         .info = &ti}) == 0, "bob restored");
    CHECK(ti.tier == AK_TIER_WARM && ti.reused == n4, "bob after a restart: tier %s, reused %d of %d",
          ak_tier_name(ti.tier), ti.reused, n4);
    CHECK(!memcmp(got4, ref4, sizeof got4), "bob's restored continuation differs from a re-prefill");
    /* a card that changed (bob's: re-made under its id with other contents
     * behind the agents' back) and one that vanished (carol's): their
     * agents' files are misses, recomputed, never garbage */
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_card *ch = NULL;
    REQUIRE(ak_store_load_card(store, "c8", e.m->fingerprint, &e.m->spec, e.vocab, &ch, &err) == AK_STORE_HIT, "%s",
            err.msg);
    snprintf(ch->id, sizeof ch->id, "alice-1");   /* same tokens, 8-bit contents */
    REQUIRE(ak_store_save_card(store, ch, &err) == 0, "%s", err.msg);
    ak_card_free(ch);
    char cpath[700];
    snprintf(cpath, sizeof cpath, "%s/cards/c8.safetensors", dir);
    REQUIRE(unlink(cpath) == 0, "unlink");
    ak_store_close(store);
    store = ak_store_open(dir, NULL, &err);
    ag = agents_on(&e, &pool, store);
    REQUIRE(ag, "agents a third time");
    int32_t got5[NG];
    REQUIRE(mturn(t, &e, ag, (turn_req){.id = "bob", .prompt = p3, .n = n4 + 1, .n_gen = NG, .out = got5,
                                         .info = &ti}) == 0, "bob with a changed card");
    CHECK(ti.tier == AK_TIER_COLD && ti.reused == 0 && !memcmp(got5, ref4, sizeof got5),
          "bob with a changed card: tier %s, reused %d", ak_tier_name(ti.tier), ti.reused);
    memcpy(p3, p2, sizeof(int32_t) * (size_t)(n + 1));
    memcpy(p3 + n + 1, got, sizeof(int32_t) * (NG - 1));
    p3[n + NG] = 2;
    REQUIRE(mturn(t, &e, ag, (turn_req){.id = "carol", .prompt = p3, .n = n + NG + 1, .n_gen = NG, .out = got5,
                                         .info = &ti}) == 0, "carol without her card");
    /* nothing from her file; whole blocks bob just computed (pure now) may be linked */
    CHECK(ti.tier == AK_TIER_COLD && ti.reused == ti.shared, "carol without her card: tier %s, reused %d, linked %d",
          ak_tier_name(ti.tier), ti.reused, ti.shared);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_store_close(store);
    free(p2);
    free(w8);
    free(lref);
    free(lgot);
    tenv_close(&e);
}

/* A card whose tokens sat at positions 5.. of their source: imported, its
 * keys are rotated to start at 0, and the receiver continues as a
 * re-prefill of the same tokens from position 0 does. The source is built
 * independently: the tokens computed at positions 5.. (the context's RoPE
 * offset) without anything before them. */
TEST(cards_import_shifts_a_card_of_another_offset) {
    tenv e;
    if (tenv_open(t, &e) < 0) return;
    ak_error err = {{0}};
    const char *dir = card_dir_for("shift");
    ak_store *store = ak_store_open(dir, NULL, &err);
    REQUIRE(store, "%s", err.msg);
    enum { N = 30, NG = 8, OFF = 5 };
    int32_t tok[N + 1 + 2 * NG], ref[NG], got[NG];
    for (int i = 0; i < N; i++) tok[i] = i ? (int32_t)((i * 53 + 7) % e.vocab) : 1;
    tok[N] = 3;
    ak_block_pool *sp = ak_block_pool_new(&e.m->spec, 0, 0, &err);
    ak_kv *skv = sp ? ak_kv_new(sp, AK_KV_F32, AK_KV_F32, 256, &err) : NULL;
    REQUIRE(skv, "%s", err.msg);
    ak_ctx_set_pos_offset(e.ctx, OFF);
    int rc = ak_eval(e.ctx, skv, &(ak_eval_args){.tokens = tok, .n = N, .logits = e.logits}, &err);
    ak_ctx_set_pos_offset(e.ctx, 0);
    REQUIRE(rc == 0, "eval at offset: %s", err.msg);
    ak_card_params cp = {.id = "s5", .source_agent = "src", .fingerprint = e.m->fingerprint, .to = N};
    ak_card *c = ak_card_make(skv, tok, &cp, &err);
    REQUIRE(c, "%s", err.msg);
    c->pos_offset = OFF;   /* where these tokens sat in their source */
    ak_card_content_hash(c, c->hash);
    REQUIRE(ak_store_save_card(store, c, &err) == 0, "%s", err.msg);
    /* shifting there and back again gives keys within f16 rounding */
    ak_card *s0 = ak_card_shift(c, e.m, 0, &err), *s5 = s0 ? ak_card_shift(s0, e.m, OFF, &err) : NULL;
    REQUIRE(s5, "%s", err.msg);
    CHECK(s0->pos_offset == 0 && strcmp(s0->hash, c->hash) && s5->pos_offset == OFF, "offsets and hashes");
    CHECK(!memcmp(s0->data[ak_card_slot(0, 1, 3, 0)], c->data[ak_card_slot(0, 1, 3, 0)],
                  ak_card_component_bytes(c, 1, 3, 0)), "values must not move");
    ak_card_free(s0);
    ak_card_free(s5);
    ak_card_free(c);
    ak_kv_free(skv);
    ak_block_pool_free(sp);
    ak_block_pool *pool;
    ak_agents *ag = agents_on(&e, &pool, store);
    REQUIRE(ag, "agents");
    REQUIRE(ak_agent_import_card(ag, "erin", "s5", &err) == 0, "import: %s", err.msg);
    float *lref = malloc(sizeof(float) * (size_t)e.vocab), *lgot = malloc(sizeof(float) * (size_t)e.vocab);
    mreprefill(&e, tok, N + 1, NG, ref, lref);
    ak_turn ti;
    REQUIRE(mturn(t, &e, ag, (turn_req){.id = "erin", .prompt = tok, .n = N + 1, .n_gen = NG, .out = got,
                                         .first = lgot, .info = &ti}) == 0, "erin");
    double dmax = 0, mx = 0;
    for (int i = 0; i < e.vocab; i++) dmax = fmax(dmax, fabs((double)lgot[i] - lref[i])), mx = fmax(mx, fabs((double)lref[i]));
    printf("    card of offset %d imported at 0: max |logit diff| vs a re-prefill %.2e (max |logit| %.2f)\n", OFF, dmax, mx);
    CHECK(ti.reused == N && ti.prefilled == 1, "reused %d", ti.reused);
    CHECK(!memcmp(got, ref, sizeof got) && dmax < 1e-3 * mx, "shifted card: tokens %s, max |diff| %.3g",
          memcmp(got, ref, sizeof got) ? "differ" : "equal", dmax);
    /* restarted: the restore shifts the card again to the same bits */
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ag = agents_on(&e, &pool, store);
    REQUIRE(ag, "agents again");
    memcpy(tok + N + 1, ref, sizeof(int32_t) * (NG - 1));
    int n2 = N + NG;
    tok[n2] = 4;
    int32_t ref2[NG], got2[NG];
    mreprefill(&e, tok, n2 + 1, NG, ref2, lref);
    /* restored ahead, as the server's I/O thread does */
    ak_restore_job *job = NULL;
    REQUIRE(ak_agent_prefetch(ag, "erin", 0, &job, &err) == 1 && job, "prefetch: %s", err.msg);
    ak_restore_job_run(job);
    ak_agent_prefetch_done(ag, job);
    REQUIRE(mturn(t, &e, ag, (turn_req){.id = "erin", .prompt = tok, .n = n2 + 1, .n_gen = NG, .out = got2,
                                         .info = &ti}) == 0, "erin restored");
    CHECK(ti.tier == AK_TIER_WARM && ti.restored_ahead && ti.reused == n2 && !memcmp(got2, ref2, sizeof got2),
          "erin after a restart: tier %s, ahead %d, reused %d of %d", ak_tier_name(ti.tier), ti.restored_ahead,
          ti.reused, n2);
    /* erin is impure: a turn that fills whole blocks of her own enters none
     * in the content index, where a plain agent's same turn enters its own */
    int32_t lp[N + 2 * NG + 80];
    int nl = n2 + 1 + NG - 1;
    memcpy(lp, tok, sizeof(int32_t) * (size_t)(n2 + 1));
    memcpy(lp + n2 + 1, got2, sizeof(int32_t) * (NG - 1));
    for (int i = 0; i < 75; i++) lp[nl++] = (int32_t)((i * 29 + 3) % e.vocab);
    ak_agent_info inf;
    int gi = ak_agents_find(ag, "erin");
    REQUIRE(gi >= 0, "erin unknown");
    ak_agents_get(ag, gi, &inf);
    CHECK(inf.impure && !strcmp(inf.card, "s5") && !inf.pool[0], "erin's info: card %s impure %d", inf.card, inf.impure);
    ak_block_pool_stats st0, st1, st2;
    ak_block_pool_get_stats(pool, &st0);
    REQUIRE(mturn(t, &e, ag, (turn_req){.id = "erin", .prompt = lp, .n = nl, .n_gen = 1, .out = got2,
                                         .info = &ti}) == 0, "erin long");
    ak_block_pool_get_stats(pool, &st1);
    CHECK(ti.reused == n2 + NG && st1.indexed == st0.indexed, "an impure agent published %zu blocks (reused %d)",
          st1.indexed - st0.indexed, ti.reused);
    REQUIRE(mturn(t, &e, ag, (turn_req){.id = "ctl", .prompt = lp, .n = nl, .n_gen = 1, .out = got2,
                                         .info = &ti}) == 0, "control");
    ak_block_pool_get_stats(pool, &st2);
    CHECK(st2.indexed >= st1.indexed + 3, "the control agent published %zu blocks", st2.indexed - st1.indexed);
    ak_agents_free(ag);
    ak_block_pool_free(pool);
    ak_store_close(store);
    free(lref);
    free(lgot);
    tenv_close(&e);
}
