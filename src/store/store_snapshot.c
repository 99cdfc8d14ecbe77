/* store_snapshot.c - the image writer (store_codec.h): a sequence copied
 * into a snapshot laid out as the file's tensors (ak_store_snapshot,
 * ak_store_snapshot_base; ak_store_snapshot_kind for pools and memories),
 * and the snapshot's safetensors header with its block and metadata
 * checksums (aks_build_header). The format is specified at the top of
 * store_codec.c, which also holds what the writer shares with the reader
 * (the tensor layout, the runs of positions, the checksums, the metadata
 * hash, the canonical base), so that an image built here parses there to
 * the same metadata and tensors. No I/O: the save path (store_save.c)
 * writes the header and the snapshot's data through a backend.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sodium.h>
/* see store_codec.c: XXH3 with our target flags */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kv/blockpool.h"
#include "store/store_codec.h"

/* 1 when base b (canonical) is one pool or card segment: the single base
 * of a version 4 file. */
static int base_single(const ak_store_base *b) { return b->n_seg == 1 && b->seg[0].kind != AK_SEG_OWN; }

/* ---------------------------------------------------------- corrections */

/* The "corrections" metadata of kv's ranges below n_tokens (format at the
 * top) into *out (malloc'd), or NULL when there are none. Returns 0, or -1
 * out of memory. */
static int corrections_string(const ak_kv *kv, int n_tokens, char **out) {
    *out = NULL;
    const ak_cache_spec *sp = ak_block_pool_spec(ak_kv_pool(kv));
    size_t per = (size_t)sp->n_head_kv * (size_t)(sp->head_dim_k + sp->head_dim_v), cap = 1, len = 0;
    int nr = 0;
    for (int r = 0; r < ak_kv_corrections(kv); r++) {
        int st, n;
        ak_kv_correction_get(kv, r, &st, &n, NULL, NULL);
        if (st >= n_tokens) continue;
        cap += 3 * 12 + 4 + (size_t)n * 8 + (size_t)sp->n_layer * (1 + per * 8) + 2;
        nr++;
    }
    if (!nr) return 0;
    char *s = malloc(cap);
    if (!s) return -1;
    for (int r = 0; r < ak_kv_corrections(kv); r++) {
        int st, n, l0;
        const float *w;
        ak_kv_correction_get(kv, r, &st, &n, &l0, &w);
        if (st >= n_tokens) continue;
        if (st + n > n_tokens) n = n_tokens - st;   /* a history shorter than the cache */
        len += (size_t)snprintf(s + len, cap - len, "%s%d:%d:%d:", len ? ";" : "", st, n, l0);
        for (int j = 0; j < n; j++) {
            uint32_t u;
            memcpy(&u, &w[j], 4);
            len += (size_t)snprintf(s + len, cap - len, "%08x", u);
        }
        s[len++] = ':';
        for (int l = 0; l < sp->n_layer; l++) s[len++] = ak_kv_correction_mu(kv, r, l, 0) ? '1' : '0';
        s[len++] = ':';
        for (int l = 0; l < sp->n_layer; l++) {
            const float *mk = ak_kv_correction_mu(kv, r, l, 0), *mv = ak_kv_correction_mu(kv, r, l, 1);
            size_t kd = (size_t)sp->n_head_kv * sp->head_dim_k, vd = (size_t)sp->n_head_kv * sp->head_dim_v;
            for (size_t i = 0; i < kd + vd; i++) {
                float f = !mk ? 0.0f : i < kd ? mk[i] : mv[i - kd];
                uint32_t u;
                memcpy(&u, &f, 4);
                len += (size_t)snprintf(s + len, cap - len, "%08x", u);
            }
        }
        s[len] = 0;
    }
    *out = s;
    return 0;
}

/* ---------------------------------------------------------------- snapshot */

ak_snapshot *ak_store_snapshot_kind(int kind, const ak_store_save_args *a, const ak_store_base *base,
                                    const char *pool_hash, ak_error *err) {
    const char *agent_id = a->id, *fingerprint = a->fingerprint;
    const ak_kv *kv = a->kv;
    const int32_t *tokens = a->tokens;
    int n_tokens = a->n_tokens;
    const char *what = ak_kind_word(kind);
    if (!ak_agent_id_valid(agent_id)) { ak_failc(err, AK_ERR_INVALID, "store: invalid %s id", what); return NULL; }
    if (!aks_fingerprint_ok(fingerprint)) {
        ak_failc(err, AK_ERR_INVALID, "store: %s %s: model fingerprint must be 1..64 printable characters", what, agent_id);
        return NULL;
    }
    if (n_tokens < 0 || n_tokens > ak_kv_length(kv) || (n_tokens > 0 && !tokens)) {
        ak_failc(err, AK_ERR_INVALID, "store: %s %s: %d tokens to save but the cache holds %d", what, agent_id, n_tokens,
                 ak_kv_length(kv));
        return NULL;
    }
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 0) { ak_failc(err, AK_ERR_INVALID, "store: %s %s: negative token id at %d", what, agent_id, i); return NULL; }
    /* the file's base: what the sequence shares (a base of 0 positions is none) */
    ak_store_base b;
    memset(&b, 0, sizeof b);
    if (kind == AK_FILE_AGENT && base && (base->n_seg > 0 || (base->pool_id[0] && base->base_len > 0))) b = *base;
    char why0[160];
    if (aks_base_normalize(&b, n_tokens, why0, sizeof why0) < 0) {
        ak_failc(err, AK_ERR_INVALID, "store: agent %s: bad base: %s", agent_id, why0);
        return NULL;
    }
    int kb = ak_kv_base_len(kv);
    if (kind == AK_FILE_AGENT && b.base_len != kb) {
        ak_failc(err, AK_ERR_INVALID, "store: agent %s: the sequence's shared base holds %d positions, the file's "
                 "base says %d", agent_id, kb, b.base_len);
        return NULL;
    }
    /* the file's runs mirror the sequence's segments: their lengths must agree */
    int kl[AK_KV_MAX_SEGMENTS], kns = ak_kv_segments(kv, kl), same = kind != AK_FILE_AGENT || kns == b.n_seg;
    for (int k = 0; same && k < kns; k++) same = kl[k] == b.seg[k].len;
    if (!same) {
        ak_failc(err, AK_ERR_INVALID, "store: agent %s: the sequence's %d segments are not the base's %d", agent_id, kns,
                 b.n_seg);
        return NULL;
    }
    if (ak_kind_pooled(kind) && !aks_hash_ok(pool_hash)) {
        ak_failc(err, AK_ERR_INVALID, "store: %s %s: bad content hash", what, agent_id);
        return NULL;
    }
    ak_snapshot *sn = ak_calloc(1, sizeof *sn, err);
    if (!sn) return NULL;
    sn->kind = kind;
    sn->base = b;
    if (ak_kind_pooled(kind)) {
        snprintf(sn->pool_hash, sizeof sn->pool_hash, "%s", pool_hash);
        if (!(sn->source = strdup(a->source ? a->source : ""))) {
            ak_failc(err, AK_ERR_NOMEM, "store: pool %s: out of memory", agent_id);
            free(sn);
            return NULL;
        }
    }
    snprintf(sn->id, sizeof sn->id, "%s", agent_id);
    snprintf(sn->fingerprint, sizeof sn->fingerprint, "%s", fingerprint);
    snprintf(sn->model_name, sizeof sn->model_name, "%s", a->model_name ? a->model_name : "");
    for (char *p = sn->model_name; *p; p++)   /* keep the metadata one clean line */
        if ((unsigned char)*p < 32 || *p == 127) *p = '?';
    sn->spec = *ak_block_pool_spec(ak_kv_pool(kv));
    sn->fk = ak_kv_format_k(kv);
    sn->fv = ak_kv_format_v(kv);
    sn->block_tokens = ak_block_pool_block_tokens(ak_kv_pool(kv));
    sn->n_tokens = n_tokens;
    sn->created = (int64_t)time(NULL);
    for (int v = 0; v < 2; v++) {
        const char *c = ak_block_pool_center_id(ak_kv_pool(kv), v, v ? sn->fv : sn->fk);
        snprintf(sn->center[v], sizeof sn->center[v], "%s", c ? c : "none");
    }
    char why[128];
    file_runs ru;
    aks_runs_of(&b, n_tokens, sn->block_tokens, &ru);
    /* the local layers' released blocks (kvcache.h LAYER GROUPS): an agent
     * file of version 7 leaves them out (with a base, the own file blocks
     * that end at or before window_first, which the sequence released
     * span for span); a file of another kind cannot */
    int wf = ak_kv_window_first(kv);
    if (wf > n_tokens) wf = b.base_len > 0 ? n_tokens : n_tokens / sn->block_tokens * sn->block_tokens;
    if (wf > 0 && (kind != AK_FILE_AGENT || (b.base_len == 0 && wf % sn->block_tokens))) {
        ak_failc(err, AK_ERR_INVALID,
                 "store: %s %s: its sliding-window layers released positions before %d; only an agent file can "
                 "leave them out",
                 what, agent_id, wf);
        ak_snapshot_free(sn);
        return NULL;
    }
    sn->window_first = wf;
    const aks_layout ly = {.spec = &sn->spec, .fk = sn->fk, .fv = sn->fv, .nb = ru.blk0[ru.n], .T = sn->block_tokens,
                           .lb0 = aks_local_b0(&ru, wf, sn->block_tokens)};
    sn->nt = aks_layout_tensors(&ly, &sn->t, &sn->data_bytes, why, sizeof why);
    if (sn->nt < 0) {
        ak_failc(err, AK_ERR_INVALID, "store: %s %s: %s", what, agent_id, why);
        ak_snapshot_free(sn);
        return NULL;
    }
    sn->tokens = ak_malloc(sizeof(int32_t) * (size_t)n_tokens, err);
    sn->data = sn->tokens ? aks_big_alloc(sn->data_bytes) : NULL;
    if (!sn->data) {
        if (sn->tokens) ak_failc(err, AK_ERR_NOMEM, "store: %s %s: out of memory for a %llu-byte snapshot", what, agent_id,
                                (unsigned long long)sn->data_bytes);
        ak_snapshot_free(sn);
        return NULL;
    }
    if (n_tokens) memcpy(sn->tokens, tokens, sizeof(int32_t) * (size_t)n_tokens);
    if (kind == AK_FILE_AGENT && corrections_string(kv, n_tokens, &sn->corrections) < 0) {
        ak_failc(err, AK_ERR_NOMEM, "store: agent %s: out of memory for its corrections", agent_id);
        ak_snapshot_free(sn);
        return NULL;
    }
    if (aks_transfer((ak_kv *)kv, 0, sn->data, sn->t, sn->nt, &ru, 0, sn->block_tokens) != 0) {
        ak_fail(err, "store: %s %s: a cached vector below position %d is not readable", what, agent_id, n_tokens);
        ak_snapshot_free(sn);
        return NULL;
    }
    return sn;
}

ak_snapshot *ak_store_snapshot(const char *agent_id, const ak_kv *kv, const int32_t *tokens, int n_tokens,
                               const char *fingerprint, const char *model_name, ak_error *err) {
    return ak_store_snapshot_base(agent_id, kv, tokens, n_tokens, NULL, fingerprint, model_name, err);
}

ak_snapshot *ak_store_snapshot_base(const char *agent_id, const ak_kv *kv, const int32_t *tokens, int n_tokens,
                                    const ak_store_base *base, const char *fingerprint, const char *model_name,
                                    ak_error *err) {
    const ak_store_save_args a = {.id = agent_id, .kv = kv, .tokens = tokens, .n_tokens = n_tokens,
                                  .fingerprint = fingerprint, .model_name = model_name};
    return ak_store_snapshot_kind(AK_FILE_AGENT, &a, base, NULL, err);
}

size_t ak_snapshot_bytes(const ak_snapshot *sn) {
    size_t nb = (size_t)aks_table_blocks(sn->t, sn->nt);
    return (size_t)sn->data_bytes + (size_t)sn->n_tokens * 8 + nb * 17 + (sn->source ? strlen(sn->source) : 0) +
           (sn->corrections ? strlen(sn->corrections) : 0) + 4096;
}

void ak_snapshot_free(ak_snapshot *sn) {
    if (!sn) return;
    /* a snapshot is the plaintext of what a sealed store encrypts: wiped
     * before the memory goes back to the allocator */
    if (sn->tokens) sodium_memzero(sn->tokens, sizeof(int32_t) * (size_t)sn->n_tokens);
    if (sn->data) sodium_memzero(sn->data, (size_t)sn->data_bytes);
    if (sn->source) sodium_memzero(sn->source, strlen(sn->source));
    free(sn->source);
    free(sn->corrections);
    free(sn->tokens);
    free(sn->t);
    free(sn->data);
    sodium_memzero(sn, sizeof *sn);
    free(sn);
}

/* ---------------------------------------------------- the metadata header */

/* The "block_checksums" string of sn (malloc'd), or NULL out of memory.
 * The pieces are hashed tensor by tensor (in file order: the data is read
 * once, front to back), then combined block by block. */
static char *block_sums_string(const ak_snapshot *sn) {
    int64_t nb = aks_table_blocks(sn->t, sn->nt);
    int nt = sn->nt ? sn->nt : 1;
    char *out = malloc((size_t)nb * 17 + 1);
    uint64_t *hs = malloc(sizeof *hs * (size_t)nt * (size_t)(nb ? nb : 1));
    uint8_t *scratch = malloc((size_t)nt * 8);
    if (!out || !hs || !scratch) {
        free(out);
        out = NULL;
    } else {
        /* block b's pieces, in tensor order, packed from hs[b * nt] (a
         * version 7 file's local tensors have none before their b0) */
        int *cnt = calloc((size_t)(nb ? nb : 1), sizeof *cnt);
        if (!cnt) {
            free(out);
            out = NULL;
            goto done;
        }
        for (int i = 0; i < sn->nt; i++)
            for (int64_t b = sn->t[i].b0; b < nb; b++)
                hs[(size_t)b * (size_t)nt + (size_t)cnt[b]++] = XXH3_64bits(
                    sn->data + sn->t[i].offset + (uint64_t)(b - sn->t[i].b0) * sn->t[i].piece, (size_t)sn->t[i].piece);
        out[0] = 0;
        for (int64_t b = 0; b < nb; b++) {
            if (b) out[b * 17 - 1] = ',';
            aks_hex64(aks_combine_hashes(hs + (size_t)b * (size_t)nt, cnt[b], scratch), out + b * 17);
        }
        free(cnt);
    }
done:
    free(hs);
    free(scratch);
    return out;
}

/* Builds the safetensors header of sn (u64 length + padded JSON) into a
 * malloc'd buffer of *len bytes; hashes every block on the way. */
uint8_t *aks_build_header(const ak_snapshot *sn, size_t *len, ak_error *err) {
    enum { NP = 32 };
    char num[12][24], meta_hex[17], wfirst[24], wsize[24], locals[AK_KV_MAX_LAYERS + 1];
    char *tokens = NULL, *sums = NULL, *json = NULL;
    uint8_t *out = NULL;
    cJSON *root = NULL;
    if (!(sums = block_sums_string(sn))) goto oom;
    /* ",-2147483648" is 12 bytes: 12 a token and the NUL */
    size_t tcap = (size_t)sn->n_tokens * 12 + 1, tl = 0;
    if (!(tokens = malloc(tcap))) goto oom;
    tokens[0] = 0;
    for (int i = 0; i < sn->n_tokens; i++) {
        int w = snprintf(tokens + tl, tcap - tl, i ? ",%d" : "%d", sn->tokens[i]);
        if (w < 0 || (size_t)w >= tcap - tl) goto oom;
        tl += (size_t)w;
    }

    const ak_cache_spec *s = &sn->spec;
    int64_t ints[] = {s->n_layer, s->n_head_kv, s->head_dim_k, s->head_dim_v, s->n_ctx, sn->block_tokens,
                      sn->n_tokens, sn->created, sn->base.base_len};
    for (int i = 0; i < 9; i++) snprintf(num[i], sizeof num[i], "%lld", (long long)ints[i]);
    aks_pair p[NP] = {
        {.key = "format", .val = aks_kind_format(sn->kind)},
        {.key = "format_version", .val = sn->window_first ? "7" : sn->corrections ? "6" : AK_FORMAT_VERSION_STR},
        {.key = "agent_id", .val = sn->id}, {.key = "model_fingerprint", .val = sn->fingerprint},
        {.key = "model_name", .val = sn->model_name}, {.key = "n_layer", .val = num[0]},
        {.key = "n_head_kv", .val = num[1]}, {.key = "head_dim_k", .val = num[2]}, {.key = "head_dim_v", .val = num[3]},
        {.key = "n_ctx", .val = num[4]}, {.key = "kv_format_k", .val = ak_kv_format_get(sn->fk)->name},
        {.key = "kv_format_v", .val = ak_kv_format_get(sn->fv)->name}, {.key = "block_tokens", .val = num[5]},
        {.key = "n_tokens", .val = num[6]}, {.key = "tokens", .val = tokens}, {.key = "created", .val = num[7]},
        {.key = "checksum_algorithm", .val = "xxh3-64"}, {.key = "block_checksums", .val = sums},
        {.key = "key_center", .val = sn->center[0]}, {.key = "value_center", .val = sn->center[1]},
    };
    int np = 20;
    char segs[AK_KV_MAX_SEGMENTS * (AK_AGENT_ID_MAX + 48)];
    if (base_single(&sn->base)) {   /* a sequence without a base records none */
        p[np++] = (aks_pair){.key = "pool_id", .val = sn->base.pool_id};
        p[np++] = (aks_pair){.key = "pool_hash", .val = sn->base.pool_hash};
        p[np++] = (aks_pair){.key = "base_len", .val = num[8]};
        p[np++] = (aks_pair){.key = "base_kind", .val = sn->base.card ? "card" : "pool"};
    } else if (sn->base.n_seg > 0) {   /* segments (store.h): "kind:len[:id:hash]", comma-separated */
        size_t sl = 0;
        for (int k = 0; k < sn->base.n_seg; k++) {
            const ak_store_seg *g = &sn->base.seg[k];
            static const char *kinds[] = {"own", "pool", "card"};
            int w = g->kind == AK_SEG_OWN ? snprintf(segs + sl, sizeof segs - sl, "%s%s:%d", k ? "," : "", kinds[0], g->len)
                                          : snprintf(segs + sl, sizeof segs - sl, "%s%s:%d:%s:%s", k ? "," : "",
                                                     kinds[g->kind], g->len, g->id, g->hash);
            if (w < 0 || (size_t)w >= sizeof segs - sl) goto oom;
            sl += (size_t)w;
        }
        p[np++] = (aks_pair){.key = "segments", .val = segs};
        p[np++] = (aks_pair){.key = "base_len", .val = num[8]};
    }
    if (ak_kind_pooled(sn->kind)) {
        p[np++] = (aks_pair){.key = "pool_hash", .val = sn->pool_hash};
        p[np++] = (aks_pair){.key = "source", .val = sn->source ? sn->source : ""};
    }
    if (sn->corrections) p[np++] = (aks_pair){.key = "corrections", .val = sn->corrections};
    if (sn->window_first) {   /* version 7: which layers are local, their window, where they start */
        snprintf(wfirst, sizeof wfirst, "%d", sn->window_first);
        snprintf(wsize, sizeof wsize, "%d", s->window);
        for (int l = 0; l < s->n_layer && l < AK_KV_MAX_LAYERS; l++) locals[l] = ak_spec_group(s, l) ? '1' : '0';
        locals[s->n_layer < AK_KV_MAX_LAYERS ? s->n_layer : AK_KV_MAX_LAYERS] = 0;
        p[np++] = (aks_pair){.key = "window_first", .val = wfirst};
        p[np++] = (aks_pair){.key = "window", .val = wsize};
        p[np++] = (aks_pair){.key = "local_layers", .val = locals};
    }
    aks_pair sorted[NP];
    memcpy(sorted, p, sizeof(aks_pair) * np);
    if (aks_metadata_hash(sorted, np, meta_hex) != 0) goto oom;
    p[np++] = (aks_pair){.key = "metadata_checksum", .val = meta_hex};

    cJSON *meta;
    if (!(root = cJSON_CreateObject()) || !(meta = cJSON_AddObjectToObject(root, "__metadata__"))) goto oom;
    for (int i = 0; i < np; i++)
        if (!cJSON_AddStringToObject(meta, p[i].key, p[i].val)) goto oom;
    for (int i = 0; i < sn->nt; i++) {
        const tensor_desc *t = &sn->t[i];
        cJSON *o = cJSON_AddObjectToObject(root, t->name), *sh, *of;
        if (!o || !cJSON_AddStringToObject(o, "dtype", t->comp.dtype) || !(sh = cJSON_AddArrayToObject(o, "shape")))
            goto oom;
        for (int k = 0; k < t->ndim; k++)
            if (!cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[k]))) goto oom;
        if (!(of = cJSON_AddArrayToObject(o, "data_offsets")) ||
            !cJSON_AddItemToArray(of, cJSON_CreateNumber((double)t->offset)) ||
            !cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(t->offset + t->bytes))))
            goto oom;
    }
    if (!(json = cJSON_PrintUnformatted(root))) goto oom;
    size_t jl = strlen(json), N = (jl + 7) / 8 * 8;
    if (!(out = malloc(8 + N))) goto oom;
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)N >> (8 * i));
    memcpy(out + 8, json, jl);
    memset(out + 8 + jl, ' ', N - jl);
    *len = 8 + N;
    goto done;
oom:
    ak_failc(err, AK_ERR_NOMEM, "store: %s %s: out of memory building the file header", ak_kind_word(sn->kind), sn->id);
done:
    aks_wipe_tokens(root);   /* the token ids are plaintext of a sealed file */
    cJSON_Delete(root);
    free(sums);
    if (json) sodium_memzero(json, strlen(json));
    free(json);
    if (tokens) sodium_memzero(tokens, strlen(tokens));
    free(tokens);
    return out;
}
