/* kvcache.c - see kvcache.h. f16 storage, online-softmax attention. */
#include "kvcache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

struct ak_kv {
    ak_cache_spec spec;
    int capacity;
    int length;
    uint16_t *k;   /* (layer, capacity, n_head_kv, head_dim_k) f16 */
    uint16_t *v;   /* (layer, capacity, n_head_kv, head_dim_v) f16 */
};

ak_kv *ak_kv_new(const ak_cache_spec *spec, int n_ctx, ak_error *err) {
    if (n_ctx <= 0) { ak_fail(err, "KV cache: context size %d must be positive", n_ctx); return NULL; }
    ak_kv *kv = ak_calloc(1, sizeof *kv, err);
    if (!kv) return NULL;
    kv->spec = *spec;
    kv->capacity = n_ctx;
    size_t nk = (size_t)spec->n_layer * n_ctx * spec->n_head_kv * spec->head_dim_k;
    size_t nv = (size_t)spec->n_layer * n_ctx * spec->n_head_kv * spec->head_dim_v;
    kv->k = ak_malloc(nk * 2, err);
    kv->v = kv->k ? ak_malloc(nv * 2, err) : NULL;
    if (!kv->k || !kv->v) { ak_kv_free(kv); return NULL; }
    return kv;
}

void ak_kv_free(ak_kv *kv) {
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv);
}

int ak_kv_capacity(const ak_kv *kv) { return kv->capacity; }
int ak_kv_length(const ak_kv *kv) { return kv->length; }
void ak_kv_truncate(ak_kv *kv, int n) { if (n >= 0 && n < kv->length) kv->length = n; }

size_t ak_kv_bytes(const ak_kv *kv) {
    const ak_cache_spec *s = &kv->spec;
    return (size_t)s->n_layer * kv->capacity * s->n_head_kv * (s->head_dim_k + s->head_dim_v) * 2;
}

static void to_f16(uint16_t *dst, const float *src, int n) {
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) dst[i] = ak_f32_to_f16(src[i]);
}

int ak_kv_write(ak_kv *kv, int layer, int pos, const float *k, const float *v, ak_error *err) {
    const ak_cache_spec *s = &kv->spec;
    if (pos < 0 || pos >= kv->capacity)
        return ak_fail(err, "KV cache full: position %d is past the context size %d", pos, kv->capacity);
    int nk = s->n_head_kv * s->head_dim_k, nv = s->n_head_kv * s->head_dim_v;
    to_f16(kv->k + ((size_t)layer * kv->capacity + pos) * nk, k, nk);
    to_f16(kv->v + ((size_t)layer * kv->capacity + pos) * nv, v, nv);
    if (pos + 1 > kv->length) kv->length = pos + 1;
    return 0;
}

static float dot_f16(const uint16_t *a, const float *q, int n) {
    int i = 0;
    float s = 0;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + i))),
                              _mm512_loadu_ps(q + i), acc);
    s = _mm512_reduce_add_ps(acc);
#endif
    for (; i < n; i++) s += ak_f16_to_f32(a[i]) * q[i];
    return s;
}

static void axpy_f16(float *out, float w, const uint16_t *a, int n) {
    int i = 0;
#if defined(__AVX512F__)
    __m512 vw = _mm512_set1_ps(w);
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_fmadd_ps(vw, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + i))),
                                                  _mm512_loadu_ps(out + i)));
#endif
    for (; i < n; i++) out[i] += w * ak_f16_to_f32(a[i]);
}

#define ATT_CHUNK 64

void ak_kv_attend(const ak_kv *kv, int layer, int kv_head, const float *q, int n, float scale, float *out) {
    const ak_cache_spec *s = &kv->spec;
    int dk = s->head_dim_k, dv = s->head_dim_v;
    size_t kstride = (size_t)s->n_head_kv * dk, vstride = (size_t)s->n_head_kv * dv;
    const uint16_t *kb = kv->k + (size_t)layer * kv->capacity * kstride + (size_t)kv_head * dk;
    const uint16_t *vb = kv->v + (size_t)layer * kv->capacity * vstride + (size_t)kv_head * dv;
    float m = -INFINITY, l = 0, sc[ATT_CHUNK];
    for (int d = 0; d < dv; d++) out[d] = 0;
    for (int p0 = 0; p0 < n; p0 += ATT_CHUNK) {
        int c = n - p0 < ATT_CHUNK ? n - p0 : ATT_CHUNK;
        float cm = -INFINITY;
        for (int j = 0; j < c; j++) {
            sc[j] = dot_f16(kb + (size_t)(p0 + j) * kstride, q, dk) * scale;
            if (sc[j] > cm) cm = sc[j];
        }
        if (cm > m) { /* rescale what was accumulated under the old maximum */
            float r = expf(m - cm);
            l *= r;
            for (int d = 0; d < dv; d++) out[d] *= r;
            m = cm;
        }
        for (int j = 0; j < c; j++) {
            float w = expf(sc[j] - m);
            l += w;
            axpy_f16(out, w, vb + (size_t)(p0 + j) * vstride, dv);
        }
    }
    float inv = l > 0 ? 1.0f / l : 0;
    for (int d = 0; d < dv; d++) out[d] *= inv;
}
