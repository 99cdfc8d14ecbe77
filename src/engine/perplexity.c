/* perplexity.c - see perplexity.h */
#include "engine/perplexity.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KL_MAGIC "AKKLBASE"
#define KL_VERSION 1

/* log-softmax of logits into lp (n floats); double sums for accuracy */
static void log_softmax(const float *logits, int n, float *lp) {
    float mx = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < n; i++) lp[i] = (float)(logits[i] - lse);
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 0x100000001b3ull; }
    return h;
}

typedef struct {
    FILE *f;
    const char *path;
    int k;
    int32_t *ids;   // (k) one record's ids
    float *lps;     // (k) one record's log-probabilities
} kl_file;

/* top k of lp (descending) into ids / vals; simple insertion since k is small */
static void top_k(const float *lp, int n, int k, int32_t *ids, float *vals) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m == k && lp[i] <= vals[k - 1]) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && vals[j - 1] < lp[i]) { vals[j] = vals[j - 1]; ids[j] = ids[j - 1]; j--; }
        vals[j] = lp[i];
        ids[j] = i;
    }
}

/* A KL baseline file's header after its magic and version: the top-k
 * kept per position, the context, the vocabulary, the scored positions,
 * the hash of the scored tokens, the mean NLL. */
typedef struct {
    uint32_t k, n_ctx, vocab;
    uint64_t pos, hash;
    double nll;
} kl_header;

/* Writes h's header to kf (writing), or reads it into h, field by field in
 * the file's order. Returns 0, or -1 with err set (a write or read failed,
 * not a baseline, another version, a top-k outside 1..4096). */
static int kl_header_io(kl_file *kf, int writing, kl_header *h, ak_error *err) {
    char magic[8];
    uint32_t ver = KL_VERSION;
    if (writing) {
        memcpy(magic, KL_MAGIC, 8);
        if (fwrite(magic, 8, 1, kf->f) != 1 || fwrite(&ver, 4, 1, kf->f) != 1 || fwrite(&h->k, 4, 1, kf->f) != 1 ||
            fwrite(&h->n_ctx, 4, 1, kf->f) != 1 || fwrite(&h->vocab, 4, 1, kf->f) != 1 ||
            fwrite(&h->pos, 8, 1, kf->f) != 1 || fwrite(&h->hash, 8, 1, kf->f) != 1 ||
            fwrite(&h->nll, 8, 1, kf->f) != 1)
            return ak_fail(err, "%s: write failed: %s", kf->path, strerror(errno));
        return 0;
    }
    if (fread(magic, 8, 1, kf->f) != 1 || memcmp(magic, KL_MAGIC, 8))
        return ak_fail(err, "%s: not a KL baseline file (bad magic)", kf->path);
    if (fread(&ver, 4, 1, kf->f) != 1 || fread(&h->k, 4, 1, kf->f) != 1 || fread(&h->n_ctx, 4, 1, kf->f) != 1 ||
        fread(&h->vocab, 4, 1, kf->f) != 1 || fread(&h->pos, 8, 1, kf->f) != 1 ||
        fread(&h->hash, 8, 1, kf->f) != 1 || fread(&h->nll, 8, 1, kf->f) != 1)
        return ak_fail(err, "%s: KL baseline is truncated (header)", kf->path);
    if (ver != KL_VERSION) return ak_fail(err, "%s: KL baseline version %u, expected %u", kf->path, ver, KL_VERSION);
    if (h->k < 1 || h->k > 4096) return ak_fail(err, "%s: KL baseline top-k %u is invalid", kf->path, h->k);
    return 0;
}

int ak_perplexity(ak_ctx *c, ak_kv *kv, const int32_t *ids, size_t n, int n_ctx, const ak_ppl_opts *o,
                  ak_ppl_result *res, ak_error *err) {
    memset(res, 0, sizeof *res);
    if (n_ctx < 4) return ak_fail(err, "perplexity: context %d is too small", n_ctx);
    int n_chunks = (int)(n / (size_t)n_ctx);
    if (o->max_chunks > 0 && n_chunks > o->max_chunks) n_chunks = o->max_chunks;
    if (n_chunks < 1) return ak_fail(err, "perplexity: %zu tokens are fewer than one chunk of %d", n, n_ctx);
    if (ak_kv_capacity(kv) < n_ctx)
        return ak_fail(err, "perplexity: cache holds %d positions, chunks need %d", ak_kv_capacity(kv), n_ctx);
    int V = ak_ctx_model(c)->cfg.vocab, B = ak_ctx_max_batch(c), first = n_ctx / 2;
    uint64_t positions = (uint64_t)n_chunks * (n_ctx - 1 - first);
    /* the baseline must be for the same scored tokens */
    uint64_t hash = 0xcbf29ce484222325ull;
    for (int ch = 0; ch < n_chunks; ch++)
        hash = fnv1a(hash, ids + (size_t)ch * n_ctx + first + 1, sizeof(int32_t) * (n_ctx - 1 - first));

    kl_file kw = {0}, kr = {0};
    int rc = -1;
    int32_t *chunk = ak_malloc((size_t)n_ctx * sizeof(int32_t), err);
    int32_t *pos = ak_malloc((size_t)B * sizeof(int32_t), err);
    float **outs = ak_malloc((size_t)B * sizeof(float *), err);
    ak_kv **seqs = ak_malloc((size_t)B * sizeof(ak_kv *), err);
    /* logits only for the scored half of the chunk */
    float *logits = ak_malloc((size_t)(n_ctx - first) * V * sizeof(float), err);
    float *lp = ak_malloc((size_t)V * sizeof(float), err);
    if (!chunk || !pos || !outs || !seqs || !logits || !lp) goto out;

    double base_nll = 0;
    if (o->kl_base_in) {
        kr.path = o->kl_base_in;
        if (!(kr.f = fopen(kr.path, "rb"))) { ak_fail(err, "%s: %s", kr.path, strerror(errno)); goto out; }
        kl_header hd;
        if (kl_header_io(&kr, 0, &hd, err) < 0) goto out;
        base_nll = hd.nll;
        if ((int)hd.n_ctx != n_ctx || (int)hd.vocab != V || hd.pos != positions || hd.hash != hash) {
            ak_fail(err, "%s: KL baseline is for other tokens, context or vocabulary (n_ctx %u vs %d, %llu vs %llu "
                    "positions)", kr.path, hd.n_ctx, n_ctx, (unsigned long long)hd.pos, (unsigned long long)positions);
            goto out;
        }
        kr.k = (int)hd.k;
        kr.ids = ak_malloc(sizeof(int32_t) * hd.k, err);
        kr.lps = ak_malloc(sizeof(float) * hd.k, err);
        if (!kr.ids || !kr.lps) goto out;
    }
    if (o->kl_base_out) {
        kw.path = o->kl_base_out;
        kw.k = o->kl_top_k > 0 ? o->kl_top_k : AK_KL_DEFAULT_TOP_K;
        if (kw.k > V) kw.k = V;
        if (!(kw.f = fopen(kw.path, "wb"))) { ak_fail(err, "%s: %s", kw.path, strerror(errno)); goto out; }
        kw.ids = ak_malloc(sizeof(int32_t) * kw.k, err);
        kw.lps = ak_malloc(sizeof(float) * kw.k, err);
        if (!kw.ids || !kw.lps) goto out;
        /* the mean NLL is patched in at the end */
        kl_header hd = {.k = (uint32_t)kw.k, .n_ctx = (uint32_t)n_ctx, .vocab = (uint32_t)V, .pos = positions,
                        .hash = hash, .nll = 0};
        if (kl_header_io(&kw, 1, &hd, err) < 0) goto out;
    }

    double nll = 0, nll2 = 0, kl_sum = 0, kl_max = 0;
    long scored = 0, agree = 0;
    for (int ch = 0; ch < n_chunks; ch++) {
        memcpy(chunk, ids + (size_t)ch * n_ctx, n_ctx * sizeof(int32_t));
        if (o->bos >= 0) chunk[0] = o->bos;
        ak_kv_truncate(kv, 0);
        for (int i0 = 0; i0 < n_ctx; i0 += B) {
            int cnt = n_ctx - i0 < B ? n_ctx - i0 : B;
            for (int j = 0; j < cnt; j++) {
                int p = i0 + j;
                pos[j] = p;
                seqs[j] = kv;
                outs[j] = (p >= first && p < n_ctx - 1) ? logits + (size_t)(p - first) * V : NULL;
            }
            ak_batch b = {.n = cnt, .token = chunk + i0, .pos = pos, .seq = seqs, .logits_out = outs};
            if (ak_forward(c, &b, err) < 0) goto out;
        }
        for (int p = first; p < n_ctx - 1; p++) {
            log_softmax(logits + (size_t)(p - first) * V, V, lp);
            double l = -lp[chunk[p + 1]];
            nll += l;
            nll2 += l * l;
            scored++;
            if (kw.f) {
                top_k(lp, V, kw.k, kw.ids, kw.lps);
                double mass = 0;
                for (int j = 0; j < kw.k; j++) mass += exp(kw.lps[j]);
                float rest = (float)log(fmax(1.0 - mass, 1e-30));
                for (int j = 0; j < kw.k; j++)
                    if (fwrite(&kw.ids[j], 4, 1, kw.f) != 1 || fwrite(&kw.lps[j], 4, 1, kw.f) != 1) goto write_fail;
                if (fwrite(&rest, 4, 1, kw.f) != 1) goto write_fail;
            }
            if (kr.f) {
                float rest;
                for (int j = 0; j < kr.k; j++)
                    if (fread(&kr.ids[j], 4, 1, kr.f) != 1 || fread(&kr.lps[j], 4, 1, kr.f) != 1) goto read_fail;
                if (fread(&rest, 4, 1, kr.f) != 1) goto read_fail;
                double kl = 0, qmass = 0;
                int best = 0;
                for (int j = 0; j < kr.k; j++) {
                    if (kr.ids[j] < 0 || kr.ids[j] >= V) {
                        ak_fail(err, "%s: token id %d out of range", kr.path, kr.ids[j]);
                        goto out;
                    }
                    double pb = exp(kr.lps[j]), lq = lp[kr.ids[j]];
                    kl += pb * (kr.lps[j] - lq);
                    qmass += exp(lq);
                }
                double prest = exp(rest), qrest = fmax(1.0 - qmass, 1e-30);
                if (prest > 1e-30) kl += prest * (rest - log(qrest));
                for (int i = 1; i < V; i++)
                    if (lp[i] > lp[best]) best = i;
                agree += best == kr.ids[0];
                kl_sum += kl;
                if (kl > kl_max) kl_max = kl;
            }
        }
        if (o->cb) o->cb(o->ud, ch + 1, n_chunks, exp(nll / scored));
    }
    res->chunks = n_chunks;
    res->scored = scored;
    res->mean_nll = nll / scored;
    res->ppl = exp(res->mean_nll);
    double var = nll2 / scored - res->mean_nll * res->mean_nll;
    res->ppl_stderr = scored > 1 && var > 0 ? res->ppl * sqrt(var / (scored - 1)) : 0;
    if (kr.f) {
        res->have_kl = 1;
        res->base_ppl = exp(base_nll);
        res->delta_ppl_pct = (res->ppl - res->base_ppl) / res->base_ppl * 100;
        res->kl_mean = kl_sum / scored;
        res->kl_max = kl_max;
        res->top1_agree = (double)agree / scored;
    }
    if (kw.f) {
        /* patch the mean NLL into the header, then make the file durable */
        if (fseek(kw.f, 8 + 4 * 4 + 8 + 8, SEEK_SET) != 0 || fwrite(&res->mean_nll, 8, 1, kw.f) != 1 ||
            fflush(kw.f) != 0)
            goto write_fail;
        if (fclose(kw.f) != 0) { kw.f = NULL; goto write_fail; }
        kw.f = NULL;
    }
    rc = 0;
    goto out;
write_fail:
    ak_fail(err, "%s: write failed: %s", kw.path, strerror(errno));
    goto out;
read_fail:
    ak_fail(err, "%s: KL baseline is truncated", kr.path);
out:
    if (kw.f) fclose(kw.f);
    if (kr.f) fclose(kr.f);
    free(kw.ids); free(kw.lps); free(kr.ids); free(kr.lps);
    free(chunk); free(pos); free(outs); free(seqs); free(logits); free(lp);
    return rc;
}
