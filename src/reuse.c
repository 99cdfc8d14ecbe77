/* reuse.c - see reuse.h */
#include "reuse.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvformat.h"

static const char *const method_names[] = {"none", "cacheblend", "agentkvshift", "full"};

const char *ak_reuse_method_name(ak_reuse_method m) {
    return (unsigned)m < sizeof method_names / sizeof method_names[0] ? method_names[m] : "?";
}

int ak_reuse_method_parse(const char *s, ak_reuse_method *m) {
    for (int i = 0; s && i < (int)(sizeof method_names / sizeof method_names[0]); i++)
        if (!strcmp(s, method_names[i])) {
            *m = (ak_reuse_method)i;
            return 0;
        }
    return -1;
}

/* Copies positions [0, n) of chunk into kv's positions [at, at + n) (kv
 * holds exactly [0, at)): the stored bytes when the formats match (one
 * pool: the same centering means), else each vector dequantized and
 * written again in kv's formats; then the keys are rotated by at plus the
 * context's position offset (the chunk was computed at RoPE positions
 * [0, n)). Returns 0, or -1 with err set. */
static int place_chunk(ak_ctx *c, ak_kv *kv, const ak_kv *chunk, int at, int n, ak_error *err) {
    const ak_cache_spec *sp = &ak_ctx_model(c)->spec;
    if (ak_kv_prepare(kv, at, at + n, err) < 0) return -1;
    ak_kv_format fk = ak_kv_format_k(kv), fv = ak_kv_format_v(kv);
    if (ak_kv_format_k(chunk) == fk && ak_kv_format_v(chunk) == fv) {
        for (int side = 0; side < 2; side++) {
            ak_kv_format f = side ? fv : fk;
            int d = side ? sp->head_dim_v : sp->head_dim_k;
            size_t bytes[2] = {ak_kv_format_code_bytes(f, d), ak_kv_format_meta_bytes(f, d)};
            for (int l = 0; l < sp->n_layer; l++)
                for (int comp = 0; comp < 2; comp++) {
                    if (!bytes[comp]) continue;
                    for (int h = 0; h < sp->n_head_kv; h++)
                        for (int j = 0; j < n; j++) {
                            const uint8_t *src = ak_kv_stored(chunk, l, side, comp, h, j);
                            uint8_t *dst = ak_kv_stored_mut(kv, l, side, comp, h, at + j);
                            if (!src || !dst)
                                return ak_failc(err, AK_ERR_INVALID, "chunk position %d cannot be copied", j);
                            memcpy(dst, src, bytes[comp]);
                        }
                }
        }
    } else {
        size_t kd = (size_t)sp->n_head_kv * sp->head_dim_k, vd = (size_t)sp->n_head_kv * sp->head_dim_v;
        float *k = ak_malloc((kd + vd) * sizeof(float), err);
        if (!k) return -1;
        int rc = 0;
        for (int l = 0; rc == 0 && l < sp->n_layer; l++)
            for (int j = 0; rc == 0 && j < n; j++)
                if (ak_kv_read(chunk, l, j, k, k + kd, err) < 0 || ak_kv_write(kv, l, at + j, k, k + kd, err) < 0)
                    rc = -1;
        free(k);
        if (rc < 0) return -1;
    }
    if (ak_kv_set_length(kv, at + n, err) < 0) return -1;
    int delta = at + ak_ctx_pos_offset(c);
    return delta ? ak_model_shift_keys(ak_ctx_model(c), kv, at, at + n, delta, err) : 0;
}

/* Checks the arguments against kv and the model (reuse.h's AK_ERR_INVALID
 * list). Returns the check layer to use (-1 for NONE and FULL), or -2
 * with err set. */
static int check_args(ak_ctx *c, const ak_kv *kv, const ak_reuse_part *parts, int n_parts, const ak_reuse_params *p,
                      const float *logits, ak_error *err) {
    const ak_model *m = ak_ctx_model(c);
    if (ak_kv_length(kv) != 0 || ak_kv_base_len(kv) != 0) {
        ak_failc(err, AK_ERR_INVALID, "the sequence must be empty");
        return -2;
    }
    if (!p || (unsigned)p->method > AK_REUSE_FULL) {
        ak_failc(err, AK_ERR_INVALID, "unknown reuse method");
        return -2;
    }
    if (!(p->ratio >= 0.0f && p->ratio <= 1.0f)) {   /* NaN fails too */
        ak_failc(err, AK_ERR_INVALID, "recompute ratio %g is outside [0, 1]", (double)p->ratio);
        return -2;
    }
    if (!parts || n_parts < 1) {
        ak_failc(err, AK_ERR_INVALID, "no parts to prefill");
        return -2;
    }
    int blend = p->method == AK_REUSE_CACHEBLEND || p->method == AK_REUSE_AGENTKVSHIFT;
    int check = -1;
    if (blend) {
        if (m->cfg.kv_lora) {
            ak_failc(err, AK_ERR_INVALID, "%s is not available for multi-head latent attention (%s)",
                     ak_reuse_method_name(p->method), m->cfg.arch_name);
            return -2;
        }
        check = p->check_layer >= 0 ? p->check_layer : (m->cfg.n_layer > 1 ? 1 : 0);
        if (check >= m->cfg.n_layer) {
            ak_failc(err, AK_ERR_INVALID, "check layer %d: the model has %d layers", check, m->cfg.n_layer);
            return -2;
        }
    }
    long total = 0;
    for (int i = 0; i < n_parts; i++) {
        const ak_reuse_part *pt = &parts[i];
        if (pt->n < 1 || !pt->tokens) {
            ak_failc(err, AK_ERR_INVALID, "part %d has no tokens", i);
            return -2;
        }
        if (pt->chunk) {
            if (ak_kv_length(pt->chunk) < pt->n) {
                ak_failc(err, AK_ERR_INVALID, "chunk of part %d holds %d positions, fewer than its %d tokens", i,
                         ak_kv_length(pt->chunk), pt->n);
                return -2;
            }
            if (ak_kv_pool(pt->chunk) != ak_kv_pool(kv)) {
                ak_failc(err, AK_ERR_INVALID, "chunk of part %d is of another block pool", i);
                return -2;
            }
            if (i == n_parts - 1 && logits && p->method != AK_REUSE_FULL) {
                ak_failc(err, AK_ERR_INVALID, "logits need the last part to be computed fresh");
                return -2;
            }
        }
        total += pt->n;
    }
    if (total > ak_kv_capacity(kv)) {
        ak_failc(err, AK_ERR_INVALID, "%ld tokens do not fit the sequence's %d positions", total,
                 ak_kv_capacity(kv));
        return -2;
    }
    return check;
}

int ak_reuse_prefill(ak_ctx *c, ak_kv *kv, const ak_reuse_part *parts, int n_parts, const ak_reuse_params *p,
                     float *logits, ak_reuse_stats *st, ak_error *err) {
    double t0 = ak_now();
    int check = check_args(c, kv, parts, n_parts, p, logits, err);
    if (check < -1) return -1;
    if (p->method == AK_REUSE_CACHEBLEND || p->method == AK_REUSE_AGENTKVSHIFT)
        return ak_failc(err, AK_ERR_INVALID, "%s: not built yet", ak_reuse_method_name(p->method));
    ak_reuse_stats s = {0};
    s.check_layer = check;
    int at = 0, rc = 0;
    for (int i = 0; rc == 0 && i < n_parts; i++) {
        const ak_reuse_part *pt = &parts[i];
        float *lg = i == n_parts - 1 ? logits : NULL;
        if (pt->chunk) s.n_chunk_tokens += pt->n;
        if (!pt->chunk || p->method == AK_REUSE_FULL) {
            rc = ak_eval(c, kv, pt->tokens, pt->n, at, lg, NULL, NULL, NULL, err);
            if (pt->chunk) s.n_recomputed += pt->n;
        } else {
            rc = place_chunk(c, kv, pt->chunk, at, pt->n, err);
        }
        at += pt->n;
    }
    if (rc < 0) {
        ak_kv_truncate(kv, 0);
        return -1;
    }
    s.n_tokens = at;
    s.ms = (ak_now() - t0) * 1e3;
    if (st) *st = s;
    return 0;
}
