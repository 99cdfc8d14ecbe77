/* store_card.c - card files of a store (store.h, "CARDS"). The card file
 * format, version 1 (also in docs/card-file-format.md):
 *
 * <dir>/cards/<id>.safetensors is a safetensors file:
 *     u64 LE  N                header length, a multiple of 8
 *     N bytes JSON             one object, padded with spaces to N bytes
 *     data                     the tensors' bytes, back to back, in the
 *                              order below, no gaps
 * The JSON object holds "__metadata__" (first) and one entry per tensor
 * ({"dtype", "shape", "data_offsets": [begin, end]}), in this order:
 *     widths_k  U8 [n_tokens]   each token's key width: 2, 4, 8 or 16
 *     widths_v  U8 [n_tokens]   value widths
 *     then for l = 0..n_layer-1, side k then v, width w = 2, 4, 8, 16 used
 *     by at least one token of that side, each component of the width's
 *     format (kvformat.h: ak_kv_format_components, in its order):
 *     layers.<l>.<k|v>.w<w>.<component>   D [n_w, n_head_kv] + the
 *                              component's own shape
 *     (e.g. q4 keys at head dim 64: layers.0.k.w4.codes U8 [n_4, H, 32] and
 *     layers.0.k.w4.scale_min F16 [n_4, H, 2, 2]) holding the n_w tokens of
 *     that width in token order, each token's heads in order: entry (i, h)
 *     at (i * n_head_kv + h) * component_bytes. Formats of a width: keys
 *     2 q2, 4 q4, 8 q8, 16 f16; values 2 tq2, 4 tq4, 8 q8, 16 f16 (never
 *     centered). The bytes are the vectors' stored bytes (kvformat.c),
 *     little-endian. No block size: a card is cut into blocks of the
 *     receiving pool's size when imported.
 *
 * __metadata__ maps strings to strings:
 *     format              "agentkv.card"
 *     format_version      "1" (another version: STALE)
 *     card_id             the id (equal to the file name's)
 *     source_agent        the agent it was made from ("" if none)
 *     model_fingerprint   ak_model.fingerprint
 *     model_name          informational
 *     n_layer n_head_kv head_dim_k head_dim_v n_ctx     the cache spec
 *     n_tokens            1.. tokens of the card
 *     pos_offset          the position of its first token in its source
 *     tokens              their ids, decimal, comma-separated
 *     formats_k           "2:q2,4:q4,8:q8,16:f16" (the width -> format map)
 *     formats_v           "2:tq2,4:tq4,8:q8,16:f16"
 *     policy              how the widths were chosen ([a-z0-9_-]{1,31})
 *     budget_k budget_v   the average bits asked for ("%.17g")
 *     created             unix seconds
 *     card_hash           the content hash (cards.h: ak_card_content_hash)
 *     checksum_algorithm  "xxh3-64"
 *     tensor_checksums    XXH3_64bits of each tensor's bytes, in the order
 *                         above, 16 lowercase hex digits each, comma-separated
 *     metadata_checksum   XXH3_64bits over every other metadata entry sorted
 *                         by key (bytewise), each as key, 0x00, value, 0x00
 * Integers are canonical decimal (no sign, no leading zero; pos_offset and
 * created may be 0). Readers ignore metadata keys they do not know (the
 * checksum covers them).
 *
 * A sealed card wraps this whole image as agent files do (store_impl.h),
 * bound to "cards/<id>": a card copied to another name, or into the agents'
 * directory, fails authentication.
 *
 * Saving and loading go through the store's backend (store_backend.h,
 * kind AK_FILE_CARD) as agents' images do: the directory's cards/ (temp,
 * fsync, rename, directory fsync), or Redis (chunks under a manifest), so
 * nodes sharing a Redis store share their cards. Loading reads the
 * whole image (cards are small: a 2K-token card of a 1B model at 4 bits is
 * about 16 MB), unseals it, checks everything above (every tensor's
 * checksum, the metadata checksum, the widths, the token ids, the content
 * hash recomputed from the contents) and only then returns the card.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "store/cards.h"
#include "store/store.h"
#include "store/store_impl.h"

#define CARD_FORMAT "agentkv.card"
#define CARD_VERSION 1
/* (names, temp files and quarantine names are the backend's: a card is
 * kind AK_FILE_CARD, quarantined as "card+<id>...": store.c) */
#define CARD_FORMATS_K "2:q2,4:q4,8:q8,16:f16"
#define CARD_FORMATS_V "2:tq2,4:tq4,8:q8,16:f16"
#define CARD_MAX_TENSORS (2 + 64 * 1024)

/* ak_card_alloc_for_load (cards.c): an empty card whose counts come from
 * its widths, its vector arrays allocated. */
ak_card *ak_card_alloc_for_load(const ak_cache_spec *spec, int n, const uint8_t *wk, const uint8_t *wv, ak_error *err);

/* ---- paths and the index ------------------------------------------------ */

/* The slot of id in the sorted card index (*found = 1 when there). Call
 * with s->mu held. */
static int card_slot(const ak_store *s, const char *id, int *found) {
    int lo = 0, hi = s->n_cidx;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (strcmp(s->cidx[mid].id, id) < 0) lo = mid + 1;
        else hi = mid;
    }
    *found = lo < s->n_cidx && !strcmp(s->cidx[lo].id, id);
    return lo;
}

/* Inserts or replaces e in the index. Call with s->mu held. Out of memory:
 * the card is not listed until the next open. */
static void index_put_locked(ak_store *s, const ak_store_card_entry *e) {
    int found, k = card_slot(s, e->id, &found);
    if (found) {
        s->cidx[k] = *e;
        return;
    }
    if (s->n_cidx == s->cap_cidx) {
        int nc = s->cap_cidx ? s->cap_cidx * 2 : 8;
        ak_store_card_entry *ni = realloc(s->cidx, sizeof *ni * (size_t)nc);
        if (!ni) return;
        s->cidx = ni;
        s->cap_cidx = nc;
    }
    memmove(s->cidx + k + 1, s->cidx + k, sizeof *s->cidx * (size_t)(s->n_cidx - k));
    s->cidx[k] = *e;
    s->n_cidx++;
}

/* Drops id from the index. Call with s->mu held. */
static void index_del_locked(ak_store *s, const char *id) {
    int found, k = card_slot(s, id, &found);
    if (!found) return;
    memmove(s->cidx + k, s->cidx + k + 1, sizeof *s->cidx * (size_t)(s->n_cidx - k - 1));
    s->n_cidx--;
}

void ak_store_card_index_free(ak_store *s) {
    free(s->cidx);
    s->cidx = NULL;
    s->n_cidx = s->cap_cidx = 0;
    s->cards_indexed = 0;
}

void ak_store_card_entry_of(const ak_card *c, ak_store_card_entry *e) {
    memset(e, 0, sizeof *e);
    snprintf(e->id, sizeof e->id, "%s", c->id);
    e->readable = 1;
    e->n_tokens = c->n_tokens;
    e->pos_offset = c->pos_offset;
    e->spec = c->spec;
    snprintf(e->fingerprint, sizeof e->fingerprint, "%s", c->fingerprint);
    snprintf(e->model_name, sizeof e->model_name, "%s", c->model_name);
    snprintf(e->source_agent, sizeof e->source_agent, "%s", c->source_agent);
    snprintf(e->policy, sizeof e->policy, "%s", c->policy);
    e->budget_k = c->budget_k;
    e->budget_v = c->budget_v;
    long sk = 0, sv = 0;
    for (int i = 0; i < c->n_tokens; i++) {
        sk += c->widths_k[i];
        sv += c->widths_v[i];
    }
    e->mean_k = c->n_tokens ? (double)sk / c->n_tokens : 0;
    e->mean_v = c->n_tokens ? (double)sv / c->n_tokens : 0;
    e->created = c->created;
    snprintf(e->hash, sizeof e->hash, "%s", c->hash);
}

/* The index entry of a card object and of its file (size and time from st,
 * if not NULL). */
static void entry_of(const ak_store *s, const ak_card *c, const ak_blob_info *st, ak_store_card_entry *e) {
    ak_store_card_entry_of(c, e);
    if (st) {
        e->bytes = st->bytes;
        e->mtime = st->mtime;
    }
    e->sealed = s->has_key;
}

void ak_store_card_index_del(ak_store *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    index_del_locked(s, id);
    pthread_mutex_unlock(&s->mu);
}

/* What a load checks a card against: its id (the file's name) and, when
 * given, the model, the cache spec and the vocabulary. */
typedef struct {
    const char *id;
    const char *fingerprint;     /* NULL: any model */
    const ak_cache_spec *spec;   /* NULL: any cache spec */
    int vocab;                   /* token ids below it (<= 0: not checked) */
} card_want;

static ak_store_status load_card(ak_store *s, const card_want *w, int move, ak_card **out, ak_blob_info *st,
                                 ak_error *err);

/* Builds the card index once: the backend's cards, each read (its entry
 * unreadable when it does not verify; nothing moved). */
static void ensure_indexed(ak_store *s) {
    pthread_mutex_lock(&s->mu);
    int done = s->cards_indexed;
    s->cards_indexed = 1;
    pthread_mutex_unlock(&s->mu);
    if (done) return;
    ak_blob_name *v = NULL;
    int nv = 0;
    ak_error le = {{0}};
    if (s->be->ops->list(s->be, AK_FILE_CARD, &v, &nv, &le) != 0) return;   /* listed as none until the next open */
    for (int i = 0; i < nv; i++) {
        if (!ak_agent_id_valid(v[i].id)) continue;
        ak_card *c = NULL;
        ak_blob_info st;
        ak_error e = {{0}};
        ak_store_card_entry ent;
        memset(&ent, 0, sizeof ent);
        if (load_card(s, &(card_want){.id = v[i].id}, 0, &c, &st, &e) == AK_STORE_HIT) {
            entry_of(s, c, &st, &ent);
            ak_card_free(c);
        } else {
            snprintf(ent.id, sizeof ent.id, "%s", v[i].id);
            ent.bytes = v[i].info.bytes;
            ent.mtime = v[i].info.mtime;
        }
        pthread_mutex_lock(&s->mu);
        index_put_locked(s, &ent);
        pthread_mutex_unlock(&s->mu);
    }
    free(v);
}

/* ---- writing ------------------------------------------------------------ */

typedef struct {
    char name[64];
    const char *dtype;
    int ndim;
    int64_t shape[4];
    const uint8_t *data;
    size_t bytes;
} card_tensor;

/* Lists c's tensors in file order into t (room for CARD_MAX_TENSORS).
 * Returns their number. */
static int card_tensors(const ak_card *c, card_tensor *t) {
    int nt = 0, H = c->spec.n_head_kv;
    for (int side = 0; side < 2; side++) {
        card_tensor *x = &t[nt++];
        snprintf(x->name, sizeof x->name, "%s", side ? "widths_v" : "widths_k");
        x->dtype = "U8";
        x->ndim = 1;
        x->shape[0] = c->n_tokens;
        x->data = side ? c->widths_v : c->widths_k;
        x->bytes = (size_t)c->n_tokens;
    }
    for (int l = 0; l < c->spec.n_layer; l++)
        for (int side = 0; side < 2; side++)
            for (int cls = 0; cls < AK_CARD_N_WIDTHS; cls++) {
                if (!c->count[side][cls]) continue;
                int w = ak_card_class_width(cls), d = side ? c->spec.head_dim_v : c->spec.head_dim_k;
                ak_kv_component cp[2];
                int ncomp = ak_kv_format_components(side ? ak_card_value_format(w) : ak_card_key_format(w), d, cp);
                for (int comp = 0; comp < ncomp; comp++) {
                    card_tensor *x = &t[nt++];
                    snprintf(x->name, sizeof x->name, "layers.%d.%c.w%d.%s", l, side ? 'v' : 'k', w, cp[comp].name);
                    x->dtype = cp[comp].dtype;
                    x->shape[0] = c->count[side][cls];
                    x->shape[1] = H;
                    x->ndim = 2;
                    for (int k = 0; k < cp[comp].ndim; k++) x->shape[x->ndim++] = cp[comp].shape[k];
                    x->data = c->data[ak_card_slot(l, side, cls, comp)];
                    x->bytes = ak_card_component_bytes(c, side, cls, comp);
                }
            }
    return nt;
}

typedef struct {
    const char *key;
    const char *val;
} mpair;

static int cmp_mpair(const void *a, const void *b) { return strcmp(((const mpair *)a)->key, ((const mpair *)b)->key); }

/* XXH3 of the pairs sorted by key, each as key 0x00 value 0x00, as 16 hex
 * digits into out. Sorts p in place. */
static void metadata_hash(mpair *p, int n, char out[17]) {
    qsort(p, (size_t)n, sizeof *p, cmp_mpair);
    XXH3_state_t h;
    XXH3_64bits_reset(&h);
    for (int i = 0; i < n; i++) {
        XXH3_64bits_update(&h, p[i].key, strlen(p[i].key) + 1);
        XXH3_64bits_update(&h, p[i].val, strlen(p[i].val) + 1);
    }
    snprintf(out, 17, "%016llx", (unsigned long long)XXH3_64bits_digest(&h));
}

/* A malloc'd decimal, comma-separated list of c's token ids. */
static char *tokens_string(const int32_t *tok, int n) {
    char *s = malloc((size_t)n * 12 + 1), *p = s;
    if (!s) return NULL;
    *p = 0;
    for (int i = 0; i < n; i++) p += sprintf(p, i ? ",%d" : "%d", tok[i]);
    return s;
}

/* The file's header of c (the 8-byte length and the JSON, padded) in a
 * malloc'd buffer (*len bytes), and its tensors in file order (*tensors,
 * malloc'd, *n_tensors of them; their data are c's arrays: the file is
 * written from them, not from a copy). NULL with err set. */
static uint8_t *build_header(const ak_card *c, size_t *len, card_tensor **tensors, int *n_tensors, ak_error *err) {
    card_tensor *t = malloc(sizeof *t * CARD_MAX_TENSORS);
    if (!t) { ak_failc(err, AK_ERR_NOMEM, "store: card %s: out of memory", c->id); return NULL; }
    int nt = card_tensors(c, t);
    char *toks = tokens_string(c->tokens, c->n_tokens), *sums = malloc((size_t)nt * 17 + 1);
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject();
    uint8_t *img = NULL;
    char *json = NULL;
    if (!toks || !sums || !root || !meta) goto oom;
    sums[0] = 0;
    for (int i = 0; i < nt; i++)
        sprintf(sums + strlen(sums), i ? ",%016llx" : "%016llx", (unsigned long long)XXH3_64bits(t[i].data, t[i].bytes));
    char num[16][32];
    snprintf(num[0], 32, "%d", c->spec.n_layer);
    snprintf(num[1], 32, "%d", c->spec.n_head_kv);
    snprintf(num[2], 32, "%d", c->spec.head_dim_k);
    snprintf(num[3], 32, "%d", c->spec.head_dim_v);
    snprintf(num[4], 32, "%d", c->spec.n_ctx);
    snprintf(num[5], 32, "%d", c->n_tokens);
    snprintf(num[6], 32, "%d", c->pos_offset);
    snprintf(num[7], 32, "%.17g", c->budget_k);
    snprintf(num[8], 32, "%.17g", c->budget_v);
    snprintf(num[9], 32, "%lld", (long long)c->created);
    snprintf(num[10], 32, "%d", CARD_VERSION);
    mpair p[] = {
        {.key = "format", .val = CARD_FORMAT}, {.key = "format_version", .val = num[10]},
        {.key = "card_id", .val = c->id}, {.key = "source_agent", .val = c->source_agent},
        {.key = "model_fingerprint", .val = c->fingerprint}, {.key = "model_name", .val = c->model_name},
        {.key = "n_layer", .val = num[0]}, {.key = "n_head_kv", .val = num[1]}, {.key = "head_dim_k", .val = num[2]},
        {.key = "head_dim_v", .val = num[3]}, {.key = "n_ctx", .val = num[4]}, {.key = "n_tokens", .val = num[5]},
        {.key = "pos_offset", .val = num[6]}, {.key = "tokens", .val = toks},
        {.key = "formats_k", .val = CARD_FORMATS_K}, {.key = "formats_v", .val = CARD_FORMATS_V},
        {.key = "policy", .val = c->policy}, {.key = "budget_k", .val = num[7]}, {.key = "budget_v", .val = num[8]},
        {.key = "created", .val = num[9]}, {.key = "card_hash", .val = c->hash},
        {.key = "checksum_algorithm", .val = "xxh3-64"}, {.key = "tensor_checksums", .val = sums},
    };
    int np = (int)(sizeof p / sizeof p[0]);
    for (int i = 0; i < np; i++)
        if (!cJSON_AddStringToObject(meta, p[i].key, p[i].val)) goto oom;
    char mh[17];
    metadata_hash(p, np, mh);
    if (!cJSON_AddStringToObject(meta, "metadata_checksum", mh)) goto oom;
    cJSON_AddItemToObject(root, "__metadata__", meta);
    meta = NULL;
    size_t off = 0;
    for (int i = 0; i < nt; i++) {
        cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray(), *offs = cJSON_CreateArray();
        if (!o || !sh || !offs) { cJSON_Delete(o); cJSON_Delete(sh); cJSON_Delete(offs); goto oom; }
        cJSON_AddStringToObject(o, "dtype", t[i].dtype);
        for (int k = 0; k < t[i].ndim; k++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[k]));
        cJSON_AddItemToObject(o, "shape", sh);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + t[i].bytes)));
        cJSON_AddItemToObject(o, "data_offsets", offs);
        cJSON_AddItemToObject(root, t[i].name, o);
        off += t[i].bytes;
    }
    if (!(json = cJSON_PrintUnformatted(root))) goto oom;
    size_t jl = strlen(json), hl = (jl + 7) / 8 * 8;
    *len = 8 + hl;
    if (!(img = malloc(*len))) goto oom;
    for (int i = 0; i < 8; i++) img[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(img + 8, json, jl);
    memset(img + 8 + jl, ' ', hl - jl);
    *tensors = t;
    *n_tensors = nt;
    t = NULL;
    goto done;
oom:
    ak_failc(err, AK_ERR_NOMEM, "store: card %s: out of memory", c->id);
done:
    free(json);
    cJSON_Delete(root);
    cJSON_Delete(meta);
    free(toks);
    free(sums);
    free(t);
    return img;
}

/* The file's bytes as pieces: the header, then each tensor's data. */
typedef struct {
    const uint8_t *hdr;
    size_t hlen;
    const card_tensor *t;
    int nt;
    int at;         /* -1: in the header; else the tensor */
    size_t off;     /* within the current piece */
} pieces;

/* Copies the next n bytes of the pieces into dst (n no more than remain). */
static void pieces_read(pieces *p, uint8_t *dst, size_t n) {
    while (n) {
        const uint8_t *src = p->at < 0 ? p->hdr : p->t[p->at].data;
        size_t len = p->at < 0 ? p->hlen : p->t[p->at].bytes, k = len - p->off < n ? len - p->off : n;
        if (k) memcpy(dst, src + p->off, k);
        dst += k;
        n -= k;
        p->off += k;
        if (p->off == len) {
            p->at++;
            p->off = 0;
        }
    }
}

/* Writes the image (header, then the tensors' data, straight from the
 * card's arrays) into the backend put p, sealed under the store's key
 * (bound to "cards/<id>") when it has one, through one chunk of staging.
 * Returns 0, or -1 with err set. */
static int write_card_image(const ak_store *s, ak_blob_put *p, const char *id, const uint8_t *hdr, size_t hlen,
                            const card_tensor *t, int nt, ak_error *err) {
    const ak_backend_ops *ops = s->be->ops;
    size_t len = hlen;
    for (int i = 0; i < nt; i++) len += t[i].bytes;
    if (!s->has_key) {
        if (ops->put_write(p, hdr, hlen, err) != 0) return -1;
        for (int i = 0; i < nt; i++)
            if (t[i].bytes && ops->put_write(p, t[i].data, t[i].bytes, err) != 0) return -1;
        return 0;
    }
    char binding[AK_SEAL_ID_MAX + 1];
    snprintf(binding, sizeof binding, "cards/%s", id);
    ak_seal z;
    uint8_t head[AK_SEAL_HEADER_BYTES];
    ak_seal_begin(&z, s->key, len, AK_SEAL_CHUNK, binding, head);
    if (ops->put_write(p, head, sizeof head, err) != 0) return -1;
    uint8_t *in = malloc(AK_SEAL_CHUNK), *out = malloc(AK_SEAL_CHUNK + AK_SEAL_ABYTES);
    if (!in || !out) {
        free(in);
        free(out);
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    pieces pc = {.hdr = hdr, .hlen = hlen, .t = t, .nt = nt, .at = -1};
    size_t done = 0;
    int rc = 0;
    while (done < len) {
        size_t nb = ak_seal_next_bytes(&z);
        pieces_read(&pc, in, nb);
        size_t w = ak_seal_push(&z, in, out);
        if (ops->put_write(p, out, w, err) != 0) { rc = -1; break; }
        done += nb;
    }
    sodium_memzero(&z, sizeof z);
    sodium_memzero(in, AK_SEAL_CHUNK);   /* plaintext */
    free(in);
    free(out);
    return rc;
}

int ak_store_save_card(ak_store *s, const ak_card *c, ak_error *err) {
    if (!c || !ak_agent_id_valid(c->id)) return ak_failc(err, AK_ERR_INVALID, "store: invalid card id");
    if (c->n_tokens < 1) return ak_failc(err, AK_ERR_INVALID, "store: card %s: no tokens", c->id);
    ensure_indexed(s);
    size_t len;
    card_tensor *t = NULL;
    int nt = 0;
    uint8_t *img = build_header(c, &len, &t, &nt, err);
    if (!img) return -1;
    uint64_t plain = len;
    for (int i = 0; i < nt; i++) plain += t[i].bytes;
    uint64_t total = s->has_key ? ak_seal_file_bytes(plain, AK_SEAL_CHUNK) : plain;
    const ak_backend_ops *ops = s->be->ops;
    ak_error e = {{0}};
    ak_blob_info bi = {0};
    int rc = -1;
    ak_blob_put *p = ops->put_begin(s->be, AK_FILE_CARD, c->id, total, &e);
    if (p && !s->has_key && ops->put_head) ops->put_head(p, len);   /* listing reads only the header */
    if (p) {
        if (write_card_image(s, p, c->id, img, len, t, nt, &e) != 0) ops->put_abort(p);
        else rc = ops->put_commit(p, &bi, &e);
    }
    sodium_memzero(img, len);   /* the header: token ids */
    free(img);
    free(t);
    if (rc < 0)
        return ak_failc(err, e.code ? e.code : AK_ERR_IO, "store: saving card %s: %s (the previous file, if any, is "
                        "intact)", c->id, e.msg);
    ak_store_card_entry ce;
    entry_of(s, c, &bi, &ce);
    pthread_mutex_lock(&s->mu);
    index_put_locked(s, &ce);
    pthread_mutex_unlock(&s->mu);
    if (rc > 0)
        return ak_failc(err, e.code ? e.code : AK_ERR_IO, "store: saving card %s: %s (the new file is in place but may "
                        "not survive a crash)", c->id, e.msg);
    return 0;
}

/* ---- reading ------------------------------------------------------------ */

/* The verdict of a load: status, a quarantine reason and the message. */
typedef struct {
    ak_store_status st;
    const char *reason;
} verdict;

/* Sets err (code from the status) naming the card, records st and the
 * quarantine reason, returns st. */
static ak_store_status judge(verdict *v, ak_error *err, const char *id, ak_store_status st, const char *reason,
                             const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static ak_store_status judge(verdict *v, ak_error *err, const char *id, ak_store_status st, const char *reason,
                             const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int code = st == AK_STORE_STALE     ? AK_ERR_STALE
               : st == AK_STORE_CORRUPT ? AK_ERR_CORRUPT
               : st == AK_STORE_ABSENT  ? AK_ERR_NOT_FOUND
                                        : AK_ERR_IO;
    ak_failc(err, code, "store: card %s: %s", id, msg);
    v->st = st;
    v->reason = reason;
    return st;
}

/* judge for running out of memory: ERROR with code AK_ERR_NOMEM. */
static ak_store_status judge_oom(verdict *v, ak_error *err, const char *id) {
    judge(v, err, id, AK_STORE_ERROR, NULL, "out of memory");
    if (err) err->code = AK_ERR_NOMEM;
    return AK_STORE_ERROR;
}

/* Parses a canonical decimal in [lo, hi]. Returns 0, or -1. */
static int parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s || strlen(s) > 18 || (s[0] == '0' && s[1])) return -1;
    int64_t x = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        x = x * 10 + (*p - '0');
    }
    if (x < lo || x > hi) return -1;
    *out = x;
    return 0;
}

/* The string value of key in meta, or NULL. */
static const char *mstr(const cJSON *meta, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(meta, key);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

/* Reads the whole image of card id into *img (malloc'd; *len bytes),
 * unsealing it when sealed; *g stays open (the caller closes it: a
 * quarantine moves only the image it read) and *st gets its size and time.
 * Returns HIT or a failed verdict. */
static ak_store_status read_image(const ak_store *s, const char *id, ak_blob_get **g, uint8_t **img, size_t *len,
                                  ak_blob_info *st, verdict *v, ak_error *err) {
    const ak_backend_ops *ops = s->be->ops;
    char why[160];
    ak_error e = {{0}};
    int oc = ops->get_open(s->be, AK_FILE_CARD, id, g, st, why, sizeof why, &e);
    if (oc == 1) return judge(v, err, id, AK_STORE_ABSENT, NULL, "no such card");
    if (oc < 0) return judge(v, err, id, AK_STORE_ERROR, NULL, "%s", e.msg);
    if (oc == 2) return judge(v, err, id, AK_STORE_CORRUPT, "notfile", "%s", why);
    if (st->bytes > ((uint64_t)1 << 40)) return judge(v, err, id, AK_STORE_ERROR, NULL, "%llu bytes",
                                                      (unsigned long long)st->bytes);
    size_t n = (size_t)st->bytes;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return judge_oom(v, err, id);
    int rc = n ? ops->get_read(*g, buf, n, 0) : 0;
    if (rc != 0) {
        int eno = errno;
        free(buf);
        if (rc == -2) return judge(v, err, id, AK_STORE_CORRUPT, "truncated", "the file shrank while read");
        if (eno == EBADMSG)
            return judge(v, err, id, AK_STORE_CORRUPT, "checksum", "stored bytes fail the backend's checksum");
        return judge(v, err, id, AK_STORE_ERROR, NULL, "read: %s", strerror(eno));
    }
    int sealed = n >= 8 && !memcmp(buf, AK_SEAL_MAGIC, 8);
    if (!sealed) {
        if (s->has_key) {
            free(buf);
            return judge(v, err, id, AK_STORE_STALE, NULL, "a plain file while the store is sealed");
        }
        *img = buf;
        *len = n;
        return AK_STORE_HIT;
    }
    if (!s->has_key) {
        free(buf);
        return judge(v, err, id, AK_STORE_STALE, NULL, "sealed, and the store has no key");
    }
    if (n < AK_SEAL_HEADER_BYTES) {
        free(buf);
        return judge(v, err, id, AK_STORE_CORRUPT, "truncated", "a sealed file shorter than its header");
    }
    ak_seal_info si;
    ak_seal_parse(buf, &si);
    if (si.version != AK_SEAL_VERSION) {
        free(buf);
        return judge(v, err, id, AK_STORE_STALE, NULL, "seal version %u", si.version);
    }
    if (memcmp(si.key_id, s->key_id, 8)) {
        free(buf);
        return judge(v, err, id, AK_STORE_STALE, NULL, "sealed under another key");
    }
    if (si.chunk < AK_SEAL_MIN_CHUNK || si.chunk > AK_SEAL_MAX_CHUNK || si.plain_bytes == 0 ||
        ak_seal_file_bytes(si.plain_bytes, si.chunk) != n) {
        free(buf);
        return judge(v, err, id, AK_STORE_CORRUPT, "truncated", "sealed size does not match its header");
    }
    char binding[AK_SEAL_ID_MAX + 1];
    snprintf(binding, sizeof binding, "cards/%s", id);
    ak_seal z;
    uint8_t *plain = malloc((size_t)si.plain_bytes);
    if (!plain || ak_unseal_begin(&z, s->key, buf, binding) != 0) {
        free(plain);
        free(buf);
        return plain ? judge(v, err, id, AK_STORE_CORRUPT, "auth", "the seal header is rejected")
                     : judge_oom(v, err, id);
    }
    const uint8_t *in = buf + AK_SEAL_HEADER_BYTES;
    size_t done = 0;
    while (done < si.plain_bytes) {
        size_t nb = ak_seal_next_bytes(&z);
        if (ak_unseal_pull(&z, in, plain + done) != 0) {
            sodium_memzero(&z, sizeof z);
            free(plain);
            free(buf);
            return judge(v, err, id, AK_STORE_CORRUPT, "auth", "authentication failed at byte %zu of the image", done);
        }
        in += nb + AK_SEAL_ABYTES;
        done += nb;
    }
    sodium_memzero(&z, sizeof z);
    free(buf);
    *img = plain;
    *len = (size_t)si.plain_bytes;
    return AK_STORE_HIT;
}

/* Checks the tensor entry `name` of root against the expected dtype, shape
 * and offsets [off, off + bytes). Returns 1 if it matches. */
static int tensor_matches(const cJSON *root, const card_tensor *t, size_t off) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, t->name);
    if (!cJSON_IsObject(o)) return 0;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype"), *sh = cJSON_GetObjectItemCaseSensitive(o, "shape"),
                *of = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
    if (!cJSON_IsString(dt) || strcmp(dt->valuestring, t->dtype) || !cJSON_IsArray(sh) || !cJSON_IsArray(of) ||
        cJSON_GetArraySize(sh) != t->ndim || cJSON_GetArraySize(of) != 2)
        return 0;
    for (int k = 0; k < t->ndim; k++) {
        const cJSON *x = cJSON_GetArrayItem(sh, k);
        if (!cJSON_IsNumber(x) || x->valuedouble != (double)t->shape[k]) return 0;
    }
    const cJSON *a = cJSON_GetArrayItem(of, 0), *b = cJSON_GetArrayItem(of, 1);
    return cJSON_IsNumber(a) && cJSON_IsNumber(b) && a->valuedouble == (double)off &&
           b->valuedouble == (double)(off + t->bytes);
}

/* Parses and verifies the card image img[0, len) of w->id against w into
 * *out (a new card). Returns HIT, or the status with v and err set. */
static ak_store_status parse_image(const card_want *w, const uint8_t *img, size_t len, ak_card **out, verdict *v,
                                   ak_error *err) {
    const char *id = w->id;
    if (len < 8) return judge(v, err, id, AK_STORE_CORRUPT, "truncated", "shorter than a safetensors header");
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)img[i] << (8 * i);
    if (hl % 8 || hl > len - 8 || hl > (64u << 20))
        return judge(v, err, id, AK_STORE_CORRUPT, "header", "header length %llu of a %zu-byte file",
                     (unsigned long long)hl, len);
    cJSON *root = cJSON_ParseWithLength((const char *)img + 8, (size_t)hl);
    ak_card *c = NULL;
    card_tensor *t = NULL;
    uint8_t *wk = NULL, *wv = NULL;
    ak_store_status st = AK_STORE_HIT;
    const cJSON *meta = root ? cJSON_GetObjectItemCaseSensitive(root, "__metadata__") : NULL;
    if (!cJSON_IsObject(meta)) {
        st = judge(v, err, id, AK_STORE_CORRUPT, "header", "the header is not JSON with __metadata__");
        goto out;
    }
    /* the metadata checksum first: a damaged header says nothing else */
    {
        int nm = cJSON_GetArraySize(meta), np = 0;
        mpair *p = malloc(sizeof *p * (size_t)(nm ? nm : 1));
        if (!p) { st = judge_oom(v, err, id); goto out; }
        const char *want = NULL;
        int bad = 0;
        for (const cJSON *x = meta->child; x; x = x->next) {
            if (!cJSON_IsString(x) || !x->string) { bad = 1; break; }
            if (!strcmp(x->string, "metadata_checksum")) want = x->valuestring;
            else p[np++] = (mpair){.key = x->string, .val = x->valuestring};
        }
        char got[17];
        if (!bad) metadata_hash(p, np, got);
        free(p);
        if (bad || !want || strcmp(want, got)) {
            st = judge(v, err, id, AK_STORE_CORRUPT, "metadata", "metadata checksum %s", bad ? "malformed" : "mismatch");
            goto out;
        }
    }
    const char *fmt = mstr(meta, "format"), *ver = mstr(meta, "format_version");
    int64_t x[8];
    if (!fmt || strcmp(fmt, CARD_FORMAT)) {
        st = judge(v, err, id, AK_STORE_CORRUPT, "metadata", "format \"%.40s\" is not " CARD_FORMAT, fmt ? fmt : "");
        goto out;
    }
    if (parse_int(ver, 0, 1000000, &x[0])) {
        st = judge(v, err, id, AK_STORE_CORRUPT, "metadata", "bad format_version");
        goto out;
    }
    if (x[0] != CARD_VERSION) {
        st = judge(v, err, id, AK_STORE_STALE, NULL, "format version %lld (this build reads %d)", (long long)x[0],
                   CARD_VERSION);
        goto out;
    }
    const char *cid = mstr(meta, "card_id"), *fp = mstr(meta, "model_fingerprint"), *src = mstr(meta, "source_agent"),
               *mn = mstr(meta, "model_name"), *toks = mstr(meta, "tokens"), *pol = mstr(meta, "policy"),
               *bk = mstr(meta, "budget_k"), *bv = mstr(meta, "budget_v"), *hash = mstr(meta, "card_hash"),
               *sums = mstr(meta, "tensor_checksums"), *fk = mstr(meta, "formats_k"), *fv = mstr(meta, "formats_v"),
               *alg = mstr(meta, "checksum_algorithm");
    const char *ints[8] = {"n_layer", "n_head_kv", "head_dim_k", "head_dim_v", "n_ctx", "n_tokens", "pos_offset", "created"};
    const int64_t hi[8] = {4096, 4096, 65536, 65536, INT32_MAX, 1 << 24, INT32_MAX, INT64_MAX / 2};
    for (int i = 0; i < 8; i++)
        if (parse_int(mstr(meta, ints[i]), i < 5 || i == 5 ? 1 : 0, hi[i], &x[i])) {
            st = judge(v, err, id, AK_STORE_CORRUPT, "metadata", "metadata %s missing or not a canonical integer", ints[i]);
            goto out;
        }
    if (!cid || strcmp(cid, id) || !fp || !*fp || strlen(fp) > 64 || !src || strlen(src) > AK_AGENT_ID_MAX || !mn ||
        !toks || !pol || strlen(pol) >= AK_CARD_POLICY_MAX || !bk || !bv || !hash || strlen(hash) != 16 || !sums ||
        !fk || !fv || !alg || strcmp(alg, "xxh3-64")) {
        st = judge(v, err, id, AK_STORE_CORRUPT, "metadata", "metadata missing or malformed (card_id \"%.40s\")",
                   cid ? cid : "");
        goto out;
    }
    if (strcmp(fk, CARD_FORMATS_K) || strcmp(fv, CARD_FORMATS_V)) {
        st = judge(v, err, id, AK_STORE_STALE, NULL, "another width-to-format map (%.40s / %.40s)", fk, fv);
        goto out;
    }
    if (w->fingerprint && strcmp(fp, w->fingerprint)) {
        st = judge(v, err, id, AK_STORE_STALE, NULL, "made with model %.64s, not %.64s", fp, w->fingerprint);
        goto out;
    }
    ak_cache_spec cs = {.n_layer = (int)x[0], .n_head_kv = (int)x[1], .head_dim_k = (int)x[2], .head_dim_v = (int)x[3],
                        .n_ctx = (int)x[4]};
    const ak_cache_spec *spec = w->spec;
    if (spec && (cs.n_layer != spec->n_layer || cs.n_head_kv != spec->n_head_kv || cs.head_dim_k != spec->head_dim_k ||
                 cs.head_dim_v != spec->head_dim_v)) {
        st = judge(v, err, id, AK_STORE_STALE, NULL, "cache spec %d layers x %d heads x %d/%d is not this model's",
                   cs.n_layer, cs.n_head_kv, cs.head_dim_k, cs.head_dim_v);
        goto out;
    }
    int n = (int)x[5];
    /* the widths (the first two tensors) say which tensors follow */
    size_t data0 = 8 + (size_t)hl, dlen = len - data0;
    card_tensor w2[2] = {{.name = "widths_k", .dtype = "U8", .ndim = 1, .shape = {n}, .bytes = (size_t)n},
                         {.name = "widths_v", .dtype = "U8", .ndim = 1, .shape = {n}, .bytes = (size_t)n}};
    if ((size_t)2 * n > dlen || !tensor_matches(root, &w2[0], 0) || !tensor_matches(root, &w2[1], (size_t)n)) {
        st = judge(v, err, id, AK_STORE_CORRUPT, "tensors", "widths tensors missing or malformed");
        goto out;
    }
    wk = (uint8_t *)img + data0;
    wv = wk + n;
    for (int i = 0; i < n; i++)
        if (!ak_card_width_valid(wk[i]) || !ak_card_width_valid(wv[i])) {
            st = judge(v, err, id, AK_STORE_CORRUPT, "widths", "token %d: widths %d / %d", i, wk[i], wv[i]);
            goto out;
        }
    for (int side = 0; side < 2; side++)
        for (int w = 2; w <= 16; w *= 2) {
            ak_kv_format f = side ? ak_card_value_format(w) : ak_card_key_format(w);
            if (!ak_kv_format_supports(f, side ? cs.head_dim_v : cs.head_dim_k)) {
                st = judge(v, err, id, AK_STORE_CORRUPT, "metadata", "head dims %d/%d no card format stores",
                           cs.head_dim_k, cs.head_dim_v);
                goto out;
            }
        }
    if (!(c = ak_card_alloc_for_load(&cs, n, wk, wv, err)) || !(t = malloc(sizeof *t * CARD_MAX_TENSORS))) {
        st = judge_oom(v, err, id);
        goto out;
    }
    int nt = card_tensors(c, t);
    if (cJSON_GetArraySize(root) != nt + 1 || strlen(sums) != (size_t)nt * 17 - 1) {
        st = judge(v, err, id, AK_STORE_CORRUPT, "tensors", "%d header entries and %zu checksum characters for %d tensors",
                   cJSON_GetArraySize(root) - 1, strlen(sums), nt);
        goto out;
    }
    size_t off = 0;
    for (int i = 0; i < nt; i++) {
        if (!tensor_matches(root, &t[i], off) || off + t[i].bytes > dlen) {
            st = judge(v, err, id, AK_STORE_CORRUPT, off + t[i].bytes > dlen ? "truncated" : "tensors",
                       "tensor %s missing, malformed or past the end", t[i].name);
            goto out;
        }
        char h[17];
        snprintf(h, sizeof h, "%016llx", (unsigned long long)XXH3_64bits(img + data0 + off, t[i].bytes));
        if (memcmp(h, sums + (size_t)i * 17, 16) || (i + 1 < nt && sums[(size_t)i * 17 + 16] != ',')) {
            st = judge(v, err, id, AK_STORE_CORRUPT, "checksum", "tensor %s fails its checksum", t[i].name);
            goto out;
        }
        if (i >= 2) memcpy((uint8_t *)t[i].data, img + data0 + off, t[i].bytes);   /* the card's own arrays */
        off += t[i].bytes;
    }
    if (off != dlen) {
        st = judge(v, err, id, AK_STORE_CORRUPT, "size", "%zu data bytes, the tensors take %zu", dlen, off);
        goto out;
    }
    /* token ids */
    {
        const char *p = toks;
        for (int i = 0; i < n; i++) {
            char *end;
            errno = 0;
            long tv = strtol(p, &end, 10);
            if (end == p || errno || tv < 0 || tv > INT32_MAX || (w->vocab > 0 && tv >= w->vocab) ||
                *end != (i + 1 < n ? ',' : 0) || (*p == '0' && end - p > 1) || *p == '+' || *p == '-') {
                st = judge(v, err, id, AK_STORE_CORRUPT, "tokens", "token id %d malformed or outside the vocabulary", i);
                goto out;
            }
            c->tokens[i] = (int32_t)tv;
            p = end + (i + 1 < n);
        }
    }
    char *e1, *e2;
    c->budget_k = strtod(bk, &e1);
    c->budget_v = strtod(bv, &e2);
    if (*e1 || *e2) {
        st = judge(v, err, id, AK_STORE_CORRUPT, "metadata", "budgets not numbers");
        goto out;
    }
    snprintf(c->id, sizeof c->id, "%s", id);
    snprintf(c->source_agent, sizeof c->source_agent, "%s", src);
    snprintf(c->fingerprint, sizeof c->fingerprint, "%s", fp);
    snprintf(c->model_name, sizeof c->model_name, "%s", mn);
    snprintf(c->policy, sizeof c->policy, "%s", pol);
    c->pos_offset = (int)x[6];
    c->created = x[7];
    ak_card_content_hash(c, c->hash);
    if (strcmp(c->hash, hash)) {
        st = judge(v, err, id, AK_STORE_CORRUPT, "hash", "card_hash %s is not the hash of its contents (%s)", hash, c->hash);
        goto out;
    }
    *out = c;
    c = NULL;
out:
    ak_card_free(c);
    free(t);
    cJSON_Delete(root);
    return st;
}

/* Reads, verifies and (move) quarantines a corrupt card (the image read:
 * not one a save put in its place meanwhile); *st gets the image's size and
 * time on a hit. */
static ak_store_status load_card(ak_store *s, const card_want *w, int move, ak_card **out, ak_blob_info *st,
                                 ak_error *err) {
    const char *id = w->id;
    verdict v = {.st = AK_STORE_HIT};
    if (!ak_agent_id_valid(id)) {
        ak_failc(err, AK_ERR_INVALID, "store: invalid card id");
        return AK_STORE_ERROR;
    }
    uint8_t *img = NULL;
    size_t len = 0;
    ak_blob_get *g = NULL;
    ak_store_status r = read_image(s, id, &g, &img, &len, st, &v, err);
    if (r == AK_STORE_HIT) {
        r = parse_image(w, img, len, out, &v, err);
        sodium_memzero(img, len < 4096 ? len : 4096);
        free(img);
    }
    if (r == AK_STORE_HIT && g) s->be->ops->get_touch(g);   /* recently used */
    if (r == AK_STORE_CORRUPT && move) {
        char where[PATH_MAX], why[PATH_MAX + 64];
        ak_quarantine_args qa = {.kind = AK_FILE_CARD, .id = id, .g = g, .reason = v.reason ? v.reason : "corrupt",
                                 .where = where, .wn = sizeof where, .why = why, .whyn = sizeof why};
        if (ak_store_quarantine_kind(s, &qa) == 0) {
            size_t l = strlen(err->msg);
            snprintf(err->msg + l, sizeof err->msg - l, " (moved to quarantine/)");
        }
    }
    if (g) s->be->ops->get_close(g);
    if (r == AK_STORE_ABSENT) ak_store_card_index_del(s, id);
    return r;
}

ak_store_status ak_store_load_card(ak_store *s, const char *id, const char *fingerprint, const ak_cache_spec *spec,
                                   int vocab, ak_card **out, ak_error *err) {
    ensure_indexed(s);
    ak_blob_info st;
    ak_card *c = NULL;
    const card_want w = {.id = id, .fingerprint = fingerprint, .spec = spec, .vocab = vocab};
    ak_store_status r = load_card(s, &w, 1, &c, &st, err);
    if (r != AK_STORE_HIT) return r;
    ak_store_card_entry e;
    entry_of(s, c, &st, &e);
    pthread_mutex_lock(&s->mu);
    index_put_locked(s, &e);
    pthread_mutex_unlock(&s->mu);
    *out = c;
    return r;
}

ak_store_status ak_store_verify_card(ak_store *s, const char *id, const char *fingerprint, const ak_cache_spec *spec,
                                     int vocab, ak_error *err) {
    ak_blob_info st;
    ak_card *c = NULL;
    const card_want w = {.id = id, .fingerprint = fingerprint, .spec = spec, .vocab = vocab};
    ak_store_status r = load_card(s, &w, 0, &c, &st, err);
    ak_card_free(c);
    return r;
}

int ak_store_lookup_card(ak_store *s, const char *id, ak_store_card_entry *out) {
    ensure_indexed(s);
    pthread_mutex_lock(&s->mu);
    int found, k = card_slot(s, id ? id : "", &found);
    if (found) *out = s->cidx[k];
    pthread_mutex_unlock(&s->mu);
    return found ? 0 : 1;
}

int ak_store_list_cards(ak_store *s, ak_store_card_entry **out, int *n, ak_error *err) {
    ensure_indexed(s);
    pthread_mutex_lock(&s->mu);
    int k = s->n_cidx;
    ak_store_card_entry *v = malloc(sizeof *v * (size_t)(k ? k : 1));
    if (v && k) memcpy(v, s->cidx, sizeof *v * (size_t)k);
    pthread_mutex_unlock(&s->mu);
    if (!v) return ak_failc(err, AK_ERR_NOMEM, "store: out of memory");
    *out = v;
    *n = k;
    return 0;
}

int ak_store_remove_card(ak_store *s, const char *id, ak_error *err) {
    if (!ak_agent_id_valid(id)) return ak_failc(err, AK_ERR_INVALID, "store: invalid card id");
    ensure_indexed(s);
    ak_error e = {{0}};
    int rc = s->be->ops->remove(s->be, AK_FILE_CARD, id, &e);
    if (rc < 0) return ak_failc(err, e.code, "store: %s", e.msg);
    ak_store_card_index_del(s, id);
    return rc;
}

int ak_store_card_bytes(ak_store *s, const char *id, char **bytes, size_t *len, ak_error *err) {
    *bytes = NULL;
    *len = 0;
    if (!ak_agent_id_valid(id)) return ak_failc(err, AK_ERR_INVALID, "invalid card id");
    const ak_backend_ops *ops = s->be->ops;
    ak_blob_get *g = NULL;
    ak_blob_info bi;
    char why[160];
    ak_error e = {{0}};
    int rc = ops->get_open(s->be, AK_FILE_CARD, id, &g, &bi, why, sizeof why, &e);
    if (rc == 1) return ak_failc(err, AK_ERR_NOT_FOUND, "card %s has no file", id);
    if (rc < 0) return ak_failc(err, e.code ? e.code : AK_ERR_IO, "card %s: %s", id, e.msg);
    if (rc == 2) {
        ops->get_close(g);
        return ak_failc(err, AK_ERR_CORRUPT, "card %s: %s", id, why);
    }
    char *b = bi.bytes < ((uint64_t)1 << 40) ? malloc((size_t)bi.bytes + 1) : NULL;
    if (!b) {
        ops->get_close(g);
        return ak_failc(err, AK_ERR_NOMEM, "card %s: out of memory for %llu bytes", id, (unsigned long long)bi.bytes);
    }
    rc = bi.bytes ? ops->get_read(g, (uint8_t *)b, (size_t)bi.bytes, 0) : 0;
    int eno = errno;
    ops->get_close(g);
    if (rc != 0) {
        free(b);
        if (rc == -1 && eno == EBADMSG) return ak_failc(err, AK_ERR_CORRUPT, "card %s: stored bytes fail the backend's checksum", id);
        return ak_failc(err, AK_ERR_IO, "card %s: read: %s", id, rc == -2 ? "the file shrank while read" : strerror(eno));
    }
    b[bi.bytes] = 0;
    *bytes = b;
    *len = (size_t)bi.bytes;
    return 0;
}
