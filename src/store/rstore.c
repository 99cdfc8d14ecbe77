/* rstore.c - the stored responses and conversations (rstore.h: the format,
 * the index, expiry and budget).
 *
 * Files go through the store's directory backend opened for the ".rec"
 * suffix (ak_backend_dir_open_suffix): its atomic puts, reads, listing,
 * removal and quarantine moves, and in the test binary its fault injection.
 *
 * The index: records live in slots of one array that never move (freed
 * slots are reused through a free list), so every structure below holds
 * slot numbers: three chained hash tables (by id, by chain hash, by
 * conversation; a slot's next[k] is its successor in table k's bucket) and
 * `ord`, the slots sorted by (seq, id): eviction's order. Everything is
 * guarded by mu.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/ids.h"
#include "store/rstore.h"
#include "store/store_backend.h"
#include "store/store_impl.h"

enum { T_ID = 0, T_CHAIN = 1, T_CONV = 2, N_TABLES = 3 };

#define UNLINKED (-2)   /* next[k] of a slot not in table k */
#define ST_EXPIRED 99   /* read_rec: the record has expired (not a public status) */

typedef struct {
    char id[AK_RSTORE_ID_MAX + 1];
    ak_rstore_meta m;
    uint64_t seq;
    int64_t created, expires;
    uint64_t bytes;            /* the file's size */
    uint64_t key[N_TABLES];    /* its hash in each table */
    int32_t next[N_TABLES];
    int used;
} rec;

struct ak_rstore {
    ak_store_backend *be;
    int64_t ttl;
    uint64_t budget;
    int64_t (*now)(void *ud);
    void *now_ud;
    pthread_mutex_t mu;
    rec *r;                    /* slots */
    int32_t cap, n_used, free_head;
    int32_t *bucket[N_TABLES]; /* heads, -1 empty; nb of each */
    uint32_t nb;
    int32_t *ord;              /* used slots by (seq, id) */
    uint64_t next_seq;
    int64_t min_expires;       /* no record expires before this (a lower bound) */
    uint64_t bytes;
    uint64_t expired, evicted, quarantined;
};

int ak_rstore_id_valid(const char *id) {
    if (!id || !id[0]) return 0;
    size_t n = 0;
    for (const char *p = id; *p; p++, n++) {
        char c = *p;
        if (n >= AK_RSTORE_ID_MAX) return 0;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

const char *ak_rstore_status_name(ak_rstore_status st) {
    switch (st) {
    case AK_RSTORE_OK: return "ok";
    case AK_RSTORE_ABSENT: return "absent";
    case AK_RSTORE_CORRUPT: return "corrupt";
    case AK_RSTORE_ERROR: return "error";
    }
    return "?";
}

/* The store's clock (unix seconds). */
static int64_t clock_now(const ak_rstore *s) { return s->now ? s->now(s->now_ud) : (int64_t)time(NULL); }

/* ------------------------------------------------------------- the index */

/* A hash spread over all 64 bits (the chain hash is the caller's). */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static uint64_t str_key(const char *v) { return XXH64(v, strlen(v), 0); }

/* 1 if slot a comes before slot b in write order. */
static int ord_before(const rec *a, const rec *b) {
    return a->seq != b->seq ? a->seq < b->seq : strcmp(a->id, b->id) < 0;
}

/* Position in ord of the first slot not before x. */
static int32_t ord_find(const ak_rstore *s, const rec *x) {
    int32_t lo = 0, hi = s->n_used;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (ord_before(&s->r[s->ord[mid]], x)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The slot of id, or -1. */
static int32_t find_id(const ak_rstore *s, const char *id) {
    if (!s->nb) return -1;
    for (int32_t i = s->bucket[T_ID][str_key(id) & (s->nb - 1)]; i >= 0; i = s->r[i].next[T_ID])
        if (!strcmp(s->r[i].id, id)) return i;
    return -1;
}

/* Puts slot i at the head of its bucket in each table it belongs to. */
static void link_tables(ak_rstore *s, int32_t i) {
    rec *x = &s->r[i];
    int in[N_TABLES] = {1, x->m.chain_hash != 0, x->m.conversation[0] != 0};
    for (int k = 0; k < N_TABLES; k++) {
        if (!in[k]) { x->next[k] = UNLINKED; continue; }
        int32_t *h = &s->bucket[k][x->key[k] & (s->nb - 1)];
        x->next[k] = *h;
        *h = i;
    }
}

/* Makes room for one more record (slots, ord, buckets at most one record
 * each), so that the insert after a put cannot fail. 0, or -1 with err. */
static int reserve_one(ak_rstore *s, ak_error *err) {
    if (s->n_used + 1 > s->cap) {
        if (s->cap > INT32_MAX / 4) return ak_failc(err, AK_ERR_NOMEM, "rstore: too many records");
        int32_t nc = s->cap ? s->cap * 2 : 64;
        rec *nr = realloc(s->r, sizeof *nr * (size_t)nc);
        if (!nr) return ak_failc(err, AK_ERR_NOMEM, "rstore: out of memory");
        s->r = nr;
        int32_t *no = realloc(s->ord, sizeof *no * (size_t)nc);
        if (!no) return ak_failc(err, AK_ERR_NOMEM, "rstore: out of memory");
        s->ord = no;
        for (int32_t i = nc - 1; i >= s->cap; i--) {   /* new slots onto the free list */
            memset(&s->r[i], 0, sizeof s->r[i]);
            s->r[i].next[T_ID] = s->free_head;
            s->free_head = i;
        }
        s->cap = nc;
    }
    if ((uint32_t)s->n_used + 1 > s->nb) {
        uint32_t nb = s->nb ? s->nb * 2 : 64;
        int32_t *b[N_TABLES] = {0};
        for (int k = 0; k < N_TABLES; k++) {
            b[k] = malloc(sizeof *b[k] * nb);
            if (!b[k]) {
                for (int j = 0; j < k; j++) free(b[j]);
                return ak_failc(err, AK_ERR_NOMEM, "rstore: out of memory");
            }
            for (uint32_t j = 0; j < nb; j++) b[k][j] = -1;
        }
        for (int k = 0; k < N_TABLES; k++) {
            free(s->bucket[k]);
            s->bucket[k] = b[k];
        }
        s->nb = nb;
        for (int32_t j = 0; j < s->n_used; j++) link_tables(s, s->ord[j]);
    }
    return 0;
}

/* Inserts x (its keys computed here) into the index; room reserved. */
static void index_insert(ak_rstore *s, const rec *x) {
    int32_t i = s->free_head;
    s->free_head = s->r[i].next[T_ID];
    rec *y = &s->r[i];
    *y = *x;
    y->used = 1;
    y->key[T_ID] = str_key(y->id);
    y->key[T_CHAIN] = mix64(y->m.chain_hash);
    y->key[T_CONV] = str_key(y->m.conversation);
    link_tables(s, i);
    int32_t at = ord_find(s, y);
    memmove(s->ord + at + 1, s->ord + at, sizeof *s->ord * (size_t)(s->n_used - at));
    s->ord[at] = i;
    s->n_used++;
    s->bytes += y->bytes;
    if (y->seq >= s->next_seq) s->next_seq = y->seq + 1;
    if (y->expires < s->min_expires) s->min_expires = y->expires;
}

/* Removes slot i from the index and frees it. */
static void index_remove(ak_rstore *s, int32_t i) {
    rec *x = &s->r[i];
    for (int k = 0; k < N_TABLES; k++) {
        if (x->next[k] == UNLINKED) continue;
        int32_t *p = &s->bucket[k][x->key[k] & (s->nb - 1)];
        while (*p != i) p = &s->r[*p].next[k];
        *p = x->next[k];
    }
    int32_t at = ord_find(s, x);
    memmove(s->ord + at, s->ord + at + 1, sizeof *s->ord * (size_t)(s->n_used - at - 1));
    s->n_used--;
    s->bytes -= x->bytes;
    memset(x, 0, sizeof *x);
    x->next[T_ID] = s->free_head;
    s->free_head = i;
}

/* 1 if the index entry a says what b (read from the file) says. */
static int same_rec(const rec *a, const rec *b) {
    return a->seq == b->seq && a->created == b->created && a->expires == b->expires && a->bytes == b->bytes &&
           a->m.kind == b->m.kind && a->m.chain_hash == b->m.chain_hash && !strcmp(a->m.agent, b->m.agent) &&
           !strcmp(a->m.conversation, b->m.conversation);
}

/* Drops id from the index if it is there. */
static void index_drop(ak_rstore *s, const char *id) {
    int32_t i = find_id(s, id);
    if (i >= 0) index_remove(s, i);
}

/* ----------------------------------------------------------- the format */

/* 16 lowercase hex digits of p[0..n) into *v: 0, or -1. */
static int hex16(const char *p, size_t n, uint64_t *v) {
    if (n != 16) return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < 16; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        x = x << 4 | (uint64_t)d;
    }
    *v = x;
    return 0;
}

/* A canonical decimal p[0..n) within [lo, INT64_MAX]: 0 with *v, or -1. */
static int dec(const char *p, size_t n, int64_t lo, int64_t *v) {
    char buf[24];
    if (n == 0 || n >= sizeof buf) return -1;
    memcpy(buf, p, n);
    buf[n] = 0;
    return ak_parse_dec(buf, lo, INT64_MAX, v);
}

/* Expects " <key>=" at *p (before end); *val, *vn get the value, up to the
 * next space or end; *p moves past it. 0, or -1. */
static int field(const char **p, const char *end, const char *key, const char **val, size_t *vn) {
    size_t kl = strlen(key);
    if ((size_t)(end - *p) < kl + 2 || (*p)[0] != ' ' || memcmp(*p + 1, key, kl) || (*p)[kl + 1] != '=') return -1;
    const char *v = *p + kl + 2, *e = v;
    while (e < end && *e != ' ') e++;
    *val = v;
    *vn = (size_t)(e - v);
    *p = e;
    return 0;
}

/* p[0..n) as a NUL-terminated string into out (cap bytes) if it fits and
 * valid() accepts it, or if empty and empty_ok. 0, or -1. */
static int str_field(const char *p, size_t n, char *out, size_t cap, int empty_ok, int (*valid)(const char *)) {
    if (n >= cap || memchr(p, 0, n)) return -1;
    memcpy(out, p, n);
    out[n] = 0;
    return (n == 0 && empty_ok) || (n > 0 && valid(out)) ? 0 : -1;
}

/* What a header line says. */
typedef struct {
    rec r;                /* id, meta, seq, created, expires (bytes: the file's) */
    uint64_t len, body_hash;
    size_t line;          /* the line's bytes with its '\n' */
} rhead;

/* Parses the header line at the start of p[0..n) (n <= AK_RSTORE_HEAD_MAX)
 * into h. Returns 0, or -1 with why set (a short phrase). */
static int parse_head(const char *p, size_t n, rhead *h, char *why, size_t whyn) {
    memset(h, 0, sizeof *h);
    const char *nl = memchr(p, '\n', n);
    if (!nl) {
        snprintf(why, whyn, n >= AK_RSTORE_HEAD_MAX ? "header line too long" : "truncated header line");
        return -1;
    }
    const char *c = p + strlen(AK_RSTORE_MAGIC), *v;
    size_t vn;
    int64_t x;
    if (nl - p < (ptrdiff_t)strlen(AK_RSTORE_MAGIC) || memcmp(p, AK_RSTORE_MAGIC, strlen(AK_RSTORE_MAGIC))) {
        snprintf(why, whyn, "not a record (bad magic)");
        return -1;
    }
#define BAD(what) do { snprintf(why, whyn, "malformed header: %s", what); return -1; } while (0)
    if (field(&c, nl, "id", &v, &vn) || str_field(v, vn, h->r.id, sizeof h->r.id, 0, ak_rstore_id_valid)) BAD("id");
    if (field(&c, nl, "kind", &v, &vn) || vn != 1 || (v[0] != 'r' && v[0] != 'c')) BAD("kind");
    h->r.m.kind = v[0];
    if (field(&c, nl, "seq", &v, &vn) || dec(v, vn, 1, &x)) BAD("seq");
    h->r.seq = (uint64_t)x;
    if (field(&c, nl, "created", &v, &vn) || dec(v, vn, 0, &h->r.created)) BAD("created");
    if (field(&c, nl, "expires", &v, &vn) || dec(v, vn, 1, &h->r.expires)) BAD("expires");
    if (field(&c, nl, "chain", &v, &vn) || hex16(v, vn, &h->r.m.chain_hash)) BAD("chain");
    if (field(&c, nl, "agent", &v, &vn) || str_field(v, vn, h->r.m.agent, sizeof h->r.m.agent, 1, ak_agent_id_valid))
        BAD("agent");
    if (field(&c, nl, "conv", &v, &vn) ||
        str_field(v, vn, h->r.m.conversation, sizeof h->r.m.conversation, 1, ak_rstore_id_valid))
        BAD("conv");
    if (field(&c, nl, "len", &v, &vn) || dec(v, vn, 0, &x)) BAD("len");
    h->len = (uint64_t)x;
    if (field(&c, nl, "body", &v, &vn) || hex16(v, vn, &h->body_hash)) BAD("body");
    const char *head_at = c;
    uint64_t want;
    if (field(&c, nl, "head", &v, &vn) || hex16(v, vn, &want) || c != nl) BAD("head");
#undef BAD
    if (XXH64(p, (size_t)(head_at - p), 0) != want) {
        snprintf(why, whyn, "header checksum mismatch");
        return -1;
    }
    h->line = (size_t)(nl - p) + 1;
    return 0;
}

/* The header line of a record into out (AK_RSTORE_HEAD_MAX bytes): its
 * length. */
static size_t format_head(const rec *x, const char *body, size_t len, char *out) {
    int n = snprintf(out, AK_RSTORE_HEAD_MAX,
                     "%s id=%s kind=%c seq=%" PRIu64 " created=%" PRId64 " expires=%" PRId64 " chain=%016" PRIx64
                     " agent=%s conv=%s len=%zu body=%016" PRIx64,
                     AK_RSTORE_MAGIC, x->id, x->m.kind, x->seq, x->created, x->expires, x->m.chain_hash, x->m.agent,
                     x->m.conversation, len, (uint64_t)XXH64(body, len, 0));
    uint64_t hh = XXH64(out, (size_t)n, 0);
    n += snprintf(out + n, AK_RSTORE_HEAD_MAX - (size_t)n, " head=%016" PRIx64 "\n", hh);
    return (size_t)n;
}

/* ----------------------------------------------------- files: quarantine */

/* Quarantined files, oldest first. */
static int cmp_qname(const void *a, const void *b) {
    const ak_blob_qname *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    if (x->tn != y->tn) return x->tn < y->tn ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Deletes the oldest quarantined files beyond AK_STORE_QUARANTINE_MAX. */
static void bound_quarantine(ak_rstore *s) {
    ak_blob_qname *q = NULL;
    int n = 0;
    ak_error e = {{0}};
    if (s->be->ops->quarantine_list(s->be, &q, &n, &e) != 0) return;
    if (n > AK_STORE_QUARANTINE_MAX) {
        qsort(q, (size_t)n, sizeof *q, cmp_qname);
        for (int i = 0; i < n - AK_STORE_QUARANTINE_MAX; i++) s->be->ops->quarantine_drop(s->be, q[i].name);
    }
    free(q);
}

/* Moves id's file (only if it is still the one g opened) to quarantine/
 * and drops it from the index; err gets "rstore: record ID: why (moved to
 * quarantine/)" (or why it was not moved), code AK_ERR_CORRUPT. Returns
 * AK_RSTORE_CORRUPT. */
static ak_rstore_status corrupt(ak_rstore *s, const char *id, ak_blob_get *g, const char *reason, const char *why,
                                ak_error *err) {
    char where[4200], qwhy[4200];
    ak_blob_qname q;
    ak_quarantine_args a = {.kind = AK_FILE_AGENT, .id = id, .g = g, .reason = reason, .where = where,
                            .wn = sizeof where, .why = qwhy, .whyn = sizeof qwhy};
    int rc = s->be->ops->quarantine(s->be, &a, "", &q);
    index_drop(s, id);
    if (rc == 0) {
        s->quarantined++;
        bound_quarantine(s);
        ak_failc(err, AK_ERR_CORRUPT, "rstore: record %s: %s (moved to quarantine/)", id, why);
    } else {
        ak_failc(err, AK_ERR_CORRUPT, "rstore: record %s: %s (not moved: %s)", id, why, rc == 1 ? "gone" : qwhy);
    }
    return AK_RSTORE_CORRUPT;
}

/* --------------------------------------------------------- files: reading */

/* Reads id's record: its header line into h (h->r.bytes the file size)
 * and, if body is not NULL, its body (malloc'd, NUL-terminated) checked
 * against body=. Returns OK; ABSENT (no file); ST_EXPIRED (the header is
 * sound and says the record expired by now: nothing else read); CORRUPT
 * (quarantined); ERROR. err set but for OK and ST_EXPIRED. */
static int read_rec(ak_rstore *s, const char *id, int64_t now, rhead *h, char **body, ak_error *err) {
    const ak_backend_ops *ops = s->be->ops;
    ak_blob_get *g = NULL;
    ak_blob_info bi = {0};
    char why[256] = "";
    ak_error e = {{0}};
    int rc = ops->get_open(s->be, AK_FILE_AGENT, id, &g, &bi, why, sizeof why, &e);
    if (rc == 1) {
        ak_failc(err, AK_ERR_NOT_FOUND, "rstore: no record %s", id);
        return AK_RSTORE_ABSENT;
    }
    if (rc < 0) {
        ak_failc(err, e.code ? e.code : AK_ERR_IO, "rstore: record %s: %s", id, e.msg);
        return AK_RSTORE_ERROR;
    }
    int st;
    if (rc == 2) {
        st = corrupt(s, id, g, "malformed", why, err);
        ops->get_close(g);
        return st;
    }
    char line[AK_RSTORE_HEAD_MAX];
    size_t n = bi.bytes < sizeof line ? (size_t)bi.bytes : sizeof line;
    int r = ops->get_read(g, (uint8_t *)line, n, 0);
    char *b = NULL;
    if (r == -1) {
        int en = errno;
        st = AK_RSTORE_ERROR;
        ak_failc(err, ak_err_code_of_errno(en), "rstore: record %s: read: %s", id, strerror(en));
    } else if (r == -2) {
        st = corrupt(s, id, g, "truncated", "the file shrank while read", err);
    } else if (parse_head(line, n, h, why, sizeof why)) {
        st = corrupt(s, id, g, "malformed", why, err);
    } else if (strcmp(h->r.id, id)) {
        st = corrupt(s, id, g, "malformed", "the header names another record", err);
    } else if (h->len > bi.bytes || bi.bytes - h->len != h->line) {
        st = corrupt(s, id, g, "truncated", "the file's size is not its header's", err);
    } else if (now >= h->r.expires) {
        st = ST_EXPIRED;
    } else if (!body) {
        st = AK_RSTORE_OK;
    } else if (h->len >= SIZE_MAX || !(b = malloc((size_t)h->len + 1))) {
        st = AK_RSTORE_ERROR;
        ak_failc(err, AK_ERR_NOMEM, "rstore: record %s: out of memory for %" PRIu64 " bytes", id, h->len);
    } else if ((r = h->len ? ops->get_read(g, (uint8_t *)b, (size_t)h->len, h->line) : 0) == -1) {
        int en = errno;
        st = AK_RSTORE_ERROR;
        ak_failc(err, ak_err_code_of_errno(en), "rstore: record %s: read: %s", id, strerror(en));
    } else if (r == -2) {
        st = corrupt(s, id, g, "truncated", "the file shrank while read", err);
    } else if (XXH64(b, (size_t)h->len, 0) != h->body_hash) {
        st = corrupt(s, id, g, "checksum", "the body fails its checksum", err);
    } else {
        b[h->len] = 0;
        *body = b;
        b = NULL;
        st = AK_RSTORE_OK;
    }
    free(b);
    h->r.bytes = bi.bytes;
    ops->get_close(g);
    return st;
}

/* Deletes id's file and index entry as expired. */
static void expire(ak_rstore *s, const char *id) {
    ak_error e = {{0}};
    s->be->ops->remove(s->be, AK_FILE_AGENT, id, &e);   /* a file that stays is deleted at the next open */
    index_drop(s, id);
    s->expired++;
}

/* Deletes every expired record the index holds, if any may have expired. */
static void sweep(ak_rstore *s, int64_t now) {
    if (now < s->min_expires) return;
    int64_t mn = INT64_MAX;
    for (int32_t i = 0; i < s->cap; i++) {
        if (!s->r[i].used) continue;
        if (s->r[i].expires <= now) {
            char id[AK_RSTORE_ID_MAX + 1];
            memcpy(id, s->r[i].id, sizeof id);
            expire(s, id);
        } else if (s->r[i].expires < mn) {
            mn = s->r[i].expires;
        }
    }
    s->min_expires = mn;
}

/* ------------------------------------------------------------ open, close */

/* The index from the directory: every record's header line; expired ones
 * deleted, corrupt ones quarantined, unreadable ones skipped. 0, or -1
 * with err (the directory cannot be listed, out of memory). */
static int scan(ak_rstore *s, ak_error *err) {
    ak_blob_name *names = NULL;
    int n = 0;
    ak_error e = {{0}};
    if (s->be->ops->list(s->be, AK_FILE_AGENT, &names, &n, &e) != 0)
        return ak_failc(err, e.code ? e.code : AK_ERR_IO, "rstore: %s", e.msg);
    int64_t now = clock_now(s);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (!ak_rstore_id_valid(names[i].id)) continue;   /* not a name a record can have: left alone */
        rhead h;
        ak_error re = {{0}};
        int st = read_rec(s, names[i].id, now, &h, NULL, &re);
        if (st == ST_EXPIRED) {
            expire(s, names[i].id);
        } else if (st == AK_RSTORE_OK) {
            rc = reserve_one(s, err);
            if (rc == 0) index_insert(s, &h.r);
        }
        /* ERROR: left in place, unindexed (a get says why); CORRUPT: quarantined */
    }
    free(names);
    bound_quarantine(s);
    return rc;
}

static void free_index(ak_rstore *s) {
    free(s->r);
    free(s->ord);
    for (int k = 0; k < N_TABLES; k++) free(s->bucket[k]);
}

ak_rstore *ak_rstore_open(const ak_rstore_opts *o, ak_error *err) {
    if (!o || !o->dir || !o->dir[0]) {
        ak_failc(err, AK_ERR_INVALID, "rstore: no directory");
        return NULL;
    }
    if (o->ttl_s < 0) {
        ak_failc(err, AK_ERR_INVALID, "rstore: negative time to live");
        return NULL;
    }
    ak_rstore *s = ak_calloc(1, sizeof *s, err);
    if (!s) return NULL;
    s->ttl = o->ttl_s ? o->ttl_s : AK_RSTORE_DEFAULT_TTL_S;
    s->budget = o->budget_bytes ? o->budget_bytes : AK_RSTORE_DEFAULT_BUDGET;
    s->now = o->now;
    s->now_ud = o->now_ud;
    s->free_head = -1;
    s->next_seq = 1;
    s->min_expires = INT64_MAX;
    pthread_mutex_init(&s->mu, NULL);
    s->be = ak_backend_dir_open_suffix(o->dir, AK_RSTORE_SUFFIX, err);
    if (!s->be || scan(s, err) != 0) {
        ak_rstore_close(s);
        return NULL;
    }
    return s;
}

void ak_rstore_close(ak_rstore *s) {
    if (!s) return;
    if (s->be) s->be->ops->close(s->be);
    free_index(s);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* ------------------------------------------------------------------- put */

/* 0 if meta is one put may index, else -1 with err. */
static int meta_ok(const ak_rstore_meta *m, ak_error *err) {
    if (!m || (m->kind != 'r' && m->kind != 'c'))
        return ak_failc(err, AK_ERR_INVALID, "rstore: a record's kind is 'r' or 'c'");
    if (!memchr(m->agent, 0, sizeof m->agent) || (m->agent[0] && !ak_agent_id_valid(m->agent)))
        return ak_failc(err, AK_ERR_INVALID, "rstore: invalid agent id");
    if (!memchr(m->conversation, 0, sizeof m->conversation) ||
        (m->conversation[0] && !ak_rstore_id_valid(m->conversation)))
        return ak_failc(err, AK_ERR_INVALID, "rstore: invalid conversation id");
    return 0;
}

/* Deletes records oldest first (by seq), all but slot keep, until the
 * records' bytes are within the budget. A record whose file cannot be deleted
 * stays (indexed: it still takes the bytes) and the next is tried. */
static void enforce_budget(ak_rstore *s, int32_t keep) {
    int32_t at = 0;
    while (s->bytes > s->budget && at < s->n_used) {
        int32_t i = s->ord[at];
        if (i == keep) { at++; continue; }
        ak_error e = {{0}};
        if (s->be->ops->remove(s->be, AK_FILE_AGENT, s->r[i].id, &e) < 0) { at++; continue; }
        index_remove(s, i);
        s->evicted++;
    }
}

/* ak_rstore_put under the lock. */
static int put_locked(ak_rstore *s, const char *id, const char *body, size_t len, const ak_rstore_meta *meta,
                      ak_error *err) {
    int64_t now = clock_now(s);
    if (now < 0) return ak_failc(err, AK_ERR_INVALID, "rstore: the clock is before 1970");
    sweep(s, now);
    if (reserve_one(s, err) != 0) return -1;
    rec x;
    memset(&x, 0, sizeof x);
    snprintf(x.id, sizeof x.id, "%s", id);
    x.m.kind = meta->kind;
    x.m.chain_hash = meta->chain_hash;
    snprintf(x.m.agent, sizeof x.m.agent, "%s", meta->agent);
    snprintf(x.m.conversation, sizeof x.m.conversation, "%s", meta->conversation);
    int32_t old = find_id(s, id);
    if (old >= 0) {   /* a replace keeps its place (find_id sees only live ones: swept) */
        x.seq = s->r[old].seq;
        x.created = s->r[old].created;
    } else {
        x.seq = s->next_seq;
        x.created = now;
    }
    x.expires = now > INT64_MAX - s->ttl ? INT64_MAX : now + s->ttl;
    char line[AK_RSTORE_HEAD_MAX];
    size_t hl = format_head(&x, body, len, line);
    const ak_backend_ops *ops = s->be->ops;
    ak_error e = {{0}};
    ak_blob_info bi = {0};
    int rc = -1;
    ak_blob_put *p = ops->put_begin(s->be, AK_FILE_AGENT, id, (uint64_t)hl + len, &e);
    if (p) {
        if (ops->put_write(p, (const uint8_t *)line, hl, &e) != 0 ||
            (len && ops->put_write(p, (const uint8_t *)body, len, &e) != 0))
            ops->put_abort(p);
        else rc = ops->put_commit(p, &bi, &e);
    }
    if (rc < 0)
        return ak_failc(err, e.code ? e.code : AK_ERR_IO, "rstore: writing record %s: %s (the previous record, if any, "
                        "is intact)", id, e.msg);
    if (old >= 0) index_remove(s, old);
    x.bytes = (uint64_t)hl + len;
    index_insert(s, &x);
    enforce_budget(s, find_id(s, id));
    if (rc > 0)
        return ak_failc(err, e.code ? e.code : AK_ERR_IO, "rstore: writing record %s: %s (the new record is in place "
                        "but may not survive a crash)", id, e.msg);
    return 0;
}

int ak_rstore_put(ak_rstore *s, const char *id, const char *body, size_t len, const ak_rstore_meta *meta,
                  ak_error *err) {
    if (!ak_rstore_id_valid(id)) return ak_failc(err, AK_ERR_INVALID, "rstore: invalid record id");
    if (meta_ok(meta, err) != 0) return -1;
    if (len && !body) return ak_failc(err, AK_ERR_INVALID, "rstore: no body");
    if (len > s->budget)
        return ak_failc(err, AK_ERR_INVALID, "rstore: record %s: %zu bytes is over the store's budget of %" PRIu64,
                        id, len, s->budget);
    pthread_mutex_lock(&s->mu);
    int rc = put_locked(s, id, body ? body : "", len, meta, err);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ------------------------------------------------------ get, delete, ... */

ak_rstore_status ak_rstore_get(ak_rstore *s, const char *id, char **body, size_t *len, ak_rstore_meta *meta,
                               ak_error *err) {
    if (!ak_rstore_id_valid(id)) {
        ak_failc(err, AK_ERR_INVALID, "rstore: invalid record id");
        return AK_RSTORE_ABSENT;
    }
    pthread_mutex_lock(&s->mu);
    int64_t now = clock_now(s);
    sweep(s, now);
    rhead h;
    char *b = NULL;
    int st = read_rec(s, id, now, &h, &b, err);
    if (st == AK_RSTORE_ABSENT) index_drop(s, id);
    if (st == ST_EXPIRED) {
        expire(s, id);
        ak_failc(err, AK_ERR_NOT_FOUND, "rstore: record %s has expired", id);
        st = AK_RSTORE_ABSENT;
    }
    if (st == AK_RSTORE_OK) {   /* the index takes what the file says (another process may have written it) */
        int32_t i = find_id(s, id);
        if (i >= 0 && !same_rec(&s->r[i], &h.r)) {
            index_remove(s, i);
            i = -1;
        }
        if (i < 0 && reserve_one(s, err) == 0) index_insert(s, &h.r);
        else if (i < 0) st = AK_RSTORE_ERROR;
    }
    pthread_mutex_unlock(&s->mu);
    if (st != AK_RSTORE_OK) {
        free(b);
        return (ak_rstore_status)st;
    }
    if (body) *body = b;
    else free(b);
    if (len) *len = (size_t)h.len;
    if (meta) *meta = h.r.m;
    return AK_RSTORE_OK;
}

ak_rstore_status ak_rstore_delete(ak_rstore *s, const char *id, ak_error *err) {
    if (!ak_rstore_id_valid(id)) {
        ak_failc(err, AK_ERR_INVALID, "rstore: invalid record id");
        return AK_RSTORE_ABSENT;
    }
    pthread_mutex_lock(&s->mu);
    int64_t now = clock_now(s);
    int32_t i = find_id(s, id);
    ak_rstore_status st;
    if (i >= 0 && s->r[i].expires <= now) {
        expire(s, id);
        ak_failc(err, AK_ERR_NOT_FOUND, "rstore: record %s has expired", id);
        st = AK_RSTORE_ABSENT;
    } else {
        ak_error e = {{0}};
        int rc = s->be->ops->remove(s->be, AK_FILE_AGENT, id, &e);
        if (rc < 0) {
            ak_failc(err, e.code ? e.code : AK_ERR_IO, "rstore: deleting record %s: %s", id, e.msg);
            st = AK_RSTORE_ERROR;
        } else {
            if (i >= 0) index_remove(s, i);
            if (rc == 1) ak_failc(err, AK_ERR_NOT_FOUND, "rstore: no record %s", id);
            st = rc == 0 ? AK_RSTORE_OK : AK_RSTORE_ABSENT;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

int ak_rstore_find_chain(ak_rstore *s, uint64_t h, char *id_out) {
    if (!h) return -1;
    pthread_mutex_lock(&s->mu);
    int64_t now = clock_now(s);
    int32_t best = -1;
    if (s->nb)
        for (int32_t i = s->bucket[T_CHAIN][mix64(h) & (s->nb - 1)]; i >= 0; i = s->r[i].next[T_CHAIN]) {
            const rec *x = &s->r[i];
            if (x->m.kind != 'r' || x->m.chain_hash != h || x->expires <= now) continue;
            if (best < 0 || ord_before(&s->r[best], x)) best = i;
        }
    if (best >= 0) memcpy(id_out, s->r[best].id, AK_RSTORE_ID_MAX + 1);
    pthread_mutex_unlock(&s->mu);
    return best >= 0 ? 0 : -1;
}

/* An id and its place, collected for each_in_conversation. */
typedef struct {
    uint64_t seq;
    char id[AK_RSTORE_ID_MAX + 1];
} conv_item;

static int cmp_conv_item(const void *a, const void *b) {
    const conv_item *x = a, *y = b;
    return x->seq != y->seq ? (x->seq < y->seq ? -1 : 1) : strcmp(x->id, y->id);
}

int ak_rstore_each_in_conversation(ak_rstore *s, const char *conv, int (*fn)(const char *id, void *ud), void *ud) {
    if (!ak_rstore_id_valid(conv) || !fn) return 0;
    pthread_mutex_lock(&s->mu);
    int64_t now = clock_now(s);
    uint64_t key = str_key(conv);
    int n = 0, cap = 0;
    conv_item *v = NULL;
    int oom = 0;
    if (s->nb)
        for (int32_t i = s->bucket[T_CONV][key & (s->nb - 1)]; i >= 0 && !oom; i = s->r[i].next[T_CONV]) {
            const rec *x = &s->r[i];
            if (strcmp(x->m.conversation, conv) || x->expires <= now) continue;
            if (n == cap) {
                int nc = cap ? cap * 2 : 16;
                conv_item *nv = realloc(v, sizeof *nv * (size_t)nc);
                if (!nv) { oom = 1; break; }
                v = nv;
                cap = nc;
            }
            v[n].seq = x->seq;
            memcpy(v[n].id, x->id, sizeof v[n].id);
            n++;
        }
    pthread_mutex_unlock(&s->mu);
    if (oom) {
        free(v);
        return -1;
    }
    if (n > 1) qsort(v, (size_t)n, sizeof *v, cmp_conv_item);
    int calls = 0;
    for (int i = 0; i < n; i++) {
        calls++;
        if (fn(v[i].id, ud)) break;
    }
    free(v);
    return calls;
}

void ak_rstore_get_stats(ak_rstore *s, ak_rstore_stats *st) {
    pthread_mutex_lock(&s->mu);
    sweep(s, clock_now(s));
    st->records = s->n_used;
    st->bytes = s->bytes;
    st->budget = s->budget;
    st->expired = s->expired;
    st->evicted = s->evicted;
    st->quarantined = s->quarantined;
    pthread_mutex_unlock(&s->mu);
}
