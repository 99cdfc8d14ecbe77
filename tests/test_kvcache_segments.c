/* test_kvcache_segments.c - a sequence whose base is several segments
 * (kvcache.h: SHARED BASE, SEGMENTS AND LINKED BLOCKS): an earlier
 * sequence's positions (its own partial last block included), a run of
 * mixed blocks (a card's) after them, own positions after those. Every
 * check compares with an independent expectation: attention (plain and
 * windowed, decode and runs) with a double-precision reference over the
 * same dequantized vectors laid out flat, reads with the sources' reads,
 * spans with the tiling the segments imply. */
#include <string.h>

#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "test.h"

#define SL 2   /* layers */
#define SH 2   /* KV heads */
#define SD 64  /* head dim */

/* Writes random vectors at positions [from, to) of kv (prepared first). */
static int fill_seg(ak_kv *kv, int from, int to, ak_rng *rng) {
    ak_error err = {{0}};
    float k[SH * SD], v[SH * SD];
    int rc = ak_kv_prepare(kv, from, to, &err);
    for (int p = from; rc == 0 && p < to; p++)
        for (int l = 0; l < SL && rc == 0; l++) {
            for (int i = 0; i < SH * SD; i++) k[i] = ak_rng_normal(rng) * (i % 8 == 1 ? 3.0f : 1.0f);
            for (int i = 0; i < SH * SD; i++) v[i] = ak_rng_normal(rng);
            rc = ak_kv_write(kv, l, p, k, v, &err);
        }
    return rc;
}

/* A sequence holding n positions in mixed blocks whose slots cycle through
 * the card widths' formats (keys q2/q4/q8/f16, values tq2/tq4/q8/f16), filled
 * with random vectors. */
static ak_kv *mixed_seq(ak_block_pool *pool, int n, ak_rng *rng, ak_error *err) {
    static const ak_kv_format kf[4] = {AK_KV_Q2, AK_KV_Q4, AK_KV_Q8, AK_KV_F16};
    static const ak_kv_format vf[4] = {AK_KV_TQ2, AK_KV_TQ4, AK_KV_Q8, AK_KV_F16};
    int T = ak_block_pool_block_tokens(pool), nb = (n + T - 1) / T;
    ak_block *bl[16];
    ak_kv *kv = ak_kv_new(pool, AK_KV_F16, AK_KV_F16, 1024, err);
    if (!kv || nb > 16) return NULL;
    for (int b = 0; b < nb; b++) {
        int cnt = b < nb - 1 ? T : n - b * T;
        ak_kv_format fk[64], fv[64];
        for (int s = 0; s < cnt; s++) {
            fk[s] = kf[(b * 3 + s) % 4];
            fv[s] = vf[(b + s * 5) % 4];
        }
        if (!(bl[b] = ak_block_alloc_mixed(pool, fk, fv, cnt, err))) return NULL;
    }
    int rc = ak_kv_attach_blocks(kv, bl, nb, n, err);
    for (int b = 0; b < nb; b++) ak_block_unref(pool, bl[b]);
    if (rc < 0) return NULL;
    float k[SH * SD], v[SH * SD];
    for (int p = 0; p < n; p++)
        for (int l = 0; l < SL; l++) {
            for (int i = 0; i < SH * SD; i++) k[i] = ak_rng_normal(rng);
            for (int i = 0; i < SH * SD; i++) v[i] = ak_rng_normal(rng);
            if (ak_kv_write(kv, l, p, k, v, err) < 0) return NULL;
        }
    return kv;
}

/* The worst relative error, over layers, heads and the nt tokens of a run
 * at pos0 (each seeing [max(0, p - window + 1), p]), of
 * ak_kv_attend_run_window against a double reference over the vectors read
 * back from kv. */
static double run_error(const ak_kv *kv, int pos0, int nt, int window, int group, ak_rng *rng) {
    int n = pos0 + nt, nk = SH * SD;
    float *K = malloc(sizeof(float) * (size_t)n * nk), *V = malloc(sizeof(float) * (size_t)n * nk);
    float *q = malloc(sizeof(float) * (size_t)nt * group * SD), *out = malloc(sizeof(float) * (size_t)nt * group * SD);
    float *scratch = malloc(sizeof(float) * ak_kv_attend_run_scratch(kv, nt * group));
    double worst = 0, sc[1024];
    float scale = 1.0f / sqrtf((float)SD);
    for (int l = 0; l < SL; l++) {
        for (int p = 0; p < n; p++) ak_kv_read(kv, l, p, K + (size_t)p * nk, V + (size_t)p * nk, NULL);
        for (int h = 0; h < SH; h++) {
            for (int i = 0; i < nt * group * SD; i++) q[i] = ak_rng_normal(rng);
            for (int i = 0; i < nt * group * SD; i++) out[i] = NAN;
            ak_kv_attend_run_window(kv, &(ak_kv_query){.layer = l, .kv_head = h, .q = q, .qstride = (size_t)group * SD,
                                    .n_q = group, .scale = scale, .out = out, .ostride = (size_t)group * SD,
                                    .scratch = scratch}, nt, pos0, window);
            for (int t = 0; t < nt; t++)
                for (int g = 0; g < group; g++) {
                    const float *qi = q + ((size_t)t * group + g) * SD;
                    int hi = pos0 + t, lo = window > 0 && hi - window + 1 > 0 ? hi - window + 1 : 0;
                    double mx = -1e300, sum = 0, ref[SD], rmax = 0, dmax = 0;
                    for (int p = lo; p <= hi; p++) {
                        double d = 0;
                        for (int j = 0; j < SD; j++) d += (double)qi[j] * K[(size_t)p * nk + h * SD + j];
                        sc[p] = d * scale;
                        if (sc[p] > mx) mx = sc[p];
                    }
                    for (int p = lo; p <= hi; p++) { sc[p] = exp(sc[p] - mx); sum += sc[p]; }
                    for (int j = 0; j < SD; j++) {
                        double r = 0;
                        for (int p = lo; p <= hi; p++) r += sc[p] * V[(size_t)p * nk + h * SD + j];
                        ref[j] = r / sum;
                        rmax = fmax(rmax, fabs(ref[j]));
                        double o = out[((size_t)t * group + g) * SD + j];
                        dmax = isnan(o) ? INFINITY : fmax(dmax, fabs(o - ref[j]));
                    }
                    worst = fmax(worst, dmax / (rmax > 1e-6 ? rmax : 1e-6));
                }
        }
    }
    free(K); free(V); free(q); free(out); free(scratch);
    return worst;
}

/* 1 if positions [from, to) of a read the same floats as [from - off, to -
 * off) of b, every layer. */
static int same_reads(const ak_kv *a, const ak_kv *b, int from, int to, int off) {
    float ka[SH * SD], va[SH * SD], kb[SH * SD], vb[SH * SD];
    for (int l = 0; l < SL; l++)
        for (int p = from; p < to; p++) {
            if (ak_kv_read(a, l, p, ka, va, NULL) < 0 || ak_kv_read(b, l, p - off, kb, vb, NULL) < 0) return 0;
            if (memcmp(ka, kb, sizeof ka) || memcmp(va, vb, sizeof va)) return 0;
        }
    return 1;
}

/* 1 if the spans of kv tile [0, length) in order, block i of segment k
 * starting at that segment's start + i * T and holding at most T and never
 * past its segment, then own blocks of T from base_len. */
static int spans_tile(const ak_kv *kv, int T) {
    int lens[AK_KV_MAX_SEGMENTS], ns = ak_kv_segments(kv, lens), at = 0, i = 0, start, count;
    for (int k = 0; k < ns; k++) {
        int s0 = at;
        for (int j = 0; j * T < lens[k]; j++, i++) {
            int want = lens[k] - j * T < T ? lens[k] - j * T : T;
            if (!ak_kv_span(kv, i, &start, &count) || start != s0 + j * T || count != want) return 0;
            if (ak_kv_block_end(kv, start) != start + count || ak_kv_block_end(kv, start + count - 1) != start + count)
                return 0;
        }
        at += lens[k];
    }
    if (at != ak_kv_base_len(kv)) return 0;
    for (; at < ak_kv_length(kv); at += T, i++)
        if (!ak_kv_span(kv, i, &start, &count) || start != at || count != T) return 0;
    return i == ak_kv_span_count(kv);
}

TEST(kvcache_segments_attention_reads_spans) {
    const int Ts[] = {16, 32};
    ak_rng rng;
    ak_rng_seed(&rng, 1616);
    ak_cache_spec s = {.n_layer = SL, .n_head_kv = SH, .head_dim_k = SD, .head_dim_v = SD, .n_ctx = 1024};
    for (int ti = 0; ti < 2; ti++) {
        int T = Ts[ti];
        ak_error err = {{0}};
        ak_block_pool *pool = ak_block_pool_new(&s, T, 0, &err);
        REQUIRE(pool, "pool: %s", err.msg);
        /* A: 37 own positions (a partial last block); C: a card of 21 */
        ak_kv *A = ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 1024, &err), *C = mixed_seq(pool, 21, &rng, &err);
        REQUIRE(A && C && fill_seg(A, 0, 37, &rng) == 0, "setup: %s", err.msg);
        /* B: A's positions, then the card, then 26 own */
        ak_kv *B = ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 1024, &err);
        REQUIRE(B && ak_kv_attach_base(B, A, 37, &err) == 0, "attach: %s", err.msg);
        ak_block *cb[4];
        int ncb = ak_kv_span_count(C);
        for (int i = 0; i < ncb; i++) cb[i] = ak_kv_span(C, i, NULL, NULL);
        REQUIRE(fill_seg(B, 37, 40, &rng) == 0, "prepare past the base");
        /* own positions held: blocks cannot follow the segments */
        CHECK(ak_kv_append_blocks(B, cb, ncb, 21, &err) < 0 && err.code == AK_ERR_INVALID, "append after own positions");
        ak_kv_truncate(B, 37);
        REQUIRE(ak_kv_append_blocks(B, cb, ncb, 21, &err) == 0, "append: %s", err.msg);
        REQUIRE(fill_seg(B, 58, 84, &rng) == 0, "own after the card");
        int lens[AK_KV_MAX_SEGMENTS];
        CHECK(ak_kv_segments(B, lens) == 2 && lens[0] == 37 && lens[1] == 21 && ak_kv_base_len(B) == 58 &&
              ak_kv_length(B) == 84, "segments %d: %d, %d; base %d", ak_kv_segments(B, lens), lens[0], lens[1],
              ak_kv_base_len(B));
        CHECK(spans_tile(B, T), "T %d: spans do not tile the segments", T);
        CHECK(same_reads(B, A, 0, 37, 0) && same_reads(B, C, 37, 58, 37), "T %d: reads differ from the sources", T);
        CHECK(ak_kv_link_point(B) == -1 && ak_kv_blocks_for(B, 84) == ak_kv_span_count(B), "link point / blocks");
        /* attention: decode at several lengths, runs crossing the segment
         * boundaries, windows that start inside a segment */
        double w = 0;
        const int ends[] = {1, 20, 37, 38, 50, 58, 59, 84};
        for (int i = 0; i < 8; i++) w = fmax(w, run_error(B, ends[i] - 1, 1, 0, 4, &rng));
        w = fmax(w, run_error(B, 30, 54, 0, 2, &rng));
        w = fmax(w, run_error(B, 30, 54, 11, 1, &rng));
        w = fmax(w, run_error(B, 55, 29, 5, 4, &rng));
        CHECK(w <= 1e-4, "T %d: attention over segments: relative error %.3e", T, w);

        /* truncation inside the card keeps its prefix as the last segment */
        ak_kv *B2 = ak_kv_fork(B, &err);
        REQUIRE(B2, "fork: %s", err.msg);
        ak_kv_truncate(B2, 44);
        CHECK(ak_kv_segments(B2, lens) == 2 && lens[1] == 7 && ak_kv_base_len(B2) == 44 && spans_tile(B2, T),
              "truncated into the card: %d segments, base %d", ak_kv_segments(B2, lens), ak_kv_base_len(B2));
        REQUIRE(fill_seg(B2, 44, 70, &rng) == 0, "own after a cut card");
        CHECK(run_error(B2, 40, 30, 0, 2, &rng) <= 1e-4 && same_reads(B2, C, 37, 44, 37), "after the cut");
        CHECK(same_reads(B, C, 37, 58, 37) && same_reads(B, A, 0, 37, 0), "the fork's writes reached B");
        /* truncation inside the first segment drops the card */
        ak_kv_truncate(B2, 30);
        CHECK(ak_kv_segments(B2, lens) == 1 && lens[0] == 30 && ak_kv_length(B2) == 30 && spans_tile(B2, T),
              "truncated into A's positions");
        /* truncation at a segment boundary drops the segments after it */
        ak_kv *B3 = ak_kv_fork(B, &err);
        ak_kv_truncate(B3, 37);
        CHECK(ak_kv_segments(B3, lens) == 1 && ak_kv_base_len(B3) == 37 && ak_kv_length(B3) == 37, "at a boundary");

        /* B as the base of D: its own positions become a third segment, and
         * segments can be appended up to the maximum */
        ak_kv *D = ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 1024, &err);
        REQUIRE(D && ak_kv_attach_base(D, B, 84, &err) == 0, "attach B: %s", err.msg);
        CHECK(ak_kv_segments(D, lens) == 3 && lens[2] == 26 && spans_tile(D, T) && same_reads(D, B, 0, 84, 0),
              "B's own positions as a segment");
        int k = 3, len = 84;
        while (k < AK_KV_MAX_SEGMENTS) {
            REQUIRE(ak_kv_append_blocks(D, cb, ncb, 21, &err) == 0, "append %d: %s", k, err.msg);
            len += 21;
            k++;
        }
        CHECK(ak_kv_append_blocks(D, cb, ncb, 21, &err) < 0 && err.code == AK_ERR_INVALID && ak_kv_length(D) == len,
              "a segment past the maximum");
        REQUIRE(fill_seg(D, len, len + 9, &rng) == 0, "own after 8 segments");
        CHECK(spans_tile(D, T) && same_reads(D, C, len - 21, len, len - 21) && same_reads(D, B, 0, 84, 0),
              "8 segments: spans / reads");
        CHECK(run_error(D, 0, len + 9, 0, 1, &rng) <= 1e-4 && run_error(D, len - 40, 49, 17, 2, &rng) <= 1e-4,
              "attention over 8 segments");
        /* a base past the maximum */
        ak_kv *E = ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 1024, &err);
        CHECK(ak_kv_attach_base(E, D, len + 9, &err) < 0 && err.code == AK_ERR_INVALID && ak_kv_length(E) == 0 &&
              ak_kv_n_blocks(E) == 0, "a 9th segment through attach_base");
        /* swap carries the segments */
        ak_kv *F = ak_kv_new(pool, AK_KV_Q8, AK_KV_Q4, 1024, &err);
        REQUIRE(F && ak_kv_swap(F, B3) == 0, "swap");
        CHECK(ak_kv_segments(F, lens) == 1 && ak_kv_base_len(F) == 37 && ak_kv_base_len(B3) == 0 &&
              ak_kv_length(B3) == 0 && same_reads(F, A, 0, 37, 0), "swapped segments");
        /* once the sources are gone, B holds its blocks alone */
        ak_kv_free(A);
        ak_kv_free(C);
        ak_kv_free(B2);
        ak_kv_free(D);
        ak_kv_free(F);
        CHECK(ak_kv_private_bytes(B) == ak_kv_bytes(B) && ak_kv_bytes(B) > 0, "private bytes %zu of %zu",
              ak_kv_private_bytes(B), ak_kv_bytes(B));
        CHECK(run_error(B, 0, 84, 0, 1, &rng) <= 1e-4, "B after its sources are freed");
        ak_kv_free(B);
        ak_kv_free(B3);
        ak_kv_free(E);
        ak_block_pool_stats st;
        ak_block_pool_get_stats(pool, &st);
        CHECK(st.used == 0, "T %d: %zu bytes still held", T, st.used);
        ak_block_pool_free(pool);
    }
}
