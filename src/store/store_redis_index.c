/* store_redis_index.c - what the Redis backend holds, by name
 * (store_backend.h: list, remove, QUARANTINE; the keys: store_redis.c):
 * images listed by their manifests' keys (SCAN, bounded), removed with
 * their chunks, and quarantined by renaming the manifest (its chunks kept
 * until the quarantined image is dropped).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store/store_redis_impl.h"

/* Calls f(ud, key) for every key matching pattern (SCAN, bounded). */
static int scan(redis_backend *r, const char *pattern, int (*f)(void *ud, const char *key), void *ud, ak_error *err) {
    conn *cn = ak_redis_conn_get(r, err);
    if (!cn) return -1;
    char cursor[32] = "0";
    int rc = 0;
    for (int round = 0; round < SCAN_MAX_ROUNDS; round++) {
        redisReply *rp = ak_redis_cmds(r, cn, err, "SCAN", cursor, "MATCH", pattern, "COUNT", "1000", (char *)NULL);
        if (!rp) { rc = -1; break; }
        if (rp->type != REDIS_REPLY_ARRAY || rp->elements != 2 || rp->element[0]->type != REDIS_REPLY_STRING) {
            freeReplyObject(rp);
            rc = ak_failc(err, AK_ERR_IO, "redis %s:%d: SCAN: unexpected reply", r->host, r->port);
            break;
        }
        snprintf(cursor, sizeof cursor, "%s", rp->element[0]->str);
        const redisReply *keys = rp->element[1];
        for (size_t i = 0; rc == 0 && i < keys->elements; i++)
            if (keys->element[i]->type == REDIS_REPLY_STRING && f(ud, keys->element[i]->str) != 0)
                rc = ak_failc(err, AK_ERR_NOMEM, "out of memory");
        freeReplyObject(rp);
        if (rc || !strcmp(cursor, "0")) break;
    }
    ak_redis_conn_put(r, cn);
    return rc;
}

/* Keys a scan found (strdup'd). */
typedef struct {
    char **keys;
    int n, cap;
} keylist;

/* Appends a copy of key to the keylist ud (scan's f): 0, or -1 out of
 * memory. */
static int collect(void *ud, const char *key) {
    keylist *l = ud;
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 64;
        char **nk = realloc(l->keys, sizeof *nk * (size_t)nc);
        if (!nk) return -1;
        l->keys = nk;
        l->cap = nc;
    }
    if (!(l->keys[l->n] = strdup(key))) return -1;
    l->n++;
    return 0;
}

/* Frees the keys and the list. */
static void keylist_free(keylist *l) {
    for (int i = 0; i < l->n; i++) free(l->keys[i]);
    free(l->keys);
}

/* store_backend.h's list: the manifests of kind (their ids checked), each
 * with its size and time. */
int ak_redis_list(ak_store_backend *b, int kind, ak_blob_name **out, int *n, ak_error *err) {
    redis_backend *r = (redis_backend *)b;
    char pattern[32];
    snprintf(pattern, sizeof pattern, "akv:{%c:*}:m", kind_letter(kind));
    keylist l = {0};
    *out = NULL;
    *n = 0;
    if (scan(r, pattern, collect, &l, err) != 0) {
        keylist_free(&l);
        return -1;
    }
    ak_blob_name *es = calloc((size_t)(l.n ? l.n : 1), sizeof *es);
    conn *cn = es ? ak_redis_conn_get(r, err) : NULL;
    if (!es || !cn) {
        if (!es) ak_failc(err, AK_ERR_NOMEM, "out of memory");
        free(es);
        keylist_free(&l);
        return -1;
    }
    int cnt = 0, rc = 0;
    for (int i = 0; i < l.n; i++) {
        /* the id between "akv:{k:" and "}:m" */
        size_t kl = strlen(l.keys[i]);
        if (kl < 10 || kl - 10 > AK_AGENT_ID_MAX) continue;
        char id[AK_AGENT_ID_MAX + 1];
        memcpy(id, l.keys[i] + 7, kl - 10);
        id[kl - 10] = 0;
        if (!ak_agent_id_valid(id)) continue;
        redisReply *rp = ak_redis_cmds(r, cn, err, "HMGET", l.keys[i], "bytes", "mtime", (char *)NULL);
        if (!rp) { rc = -1; break; }
        if (rp->type == REDIS_REPLY_ARRAY && rp->elements == 2 && rp->element[0]->type == REDIS_REPLY_STRING) {
            snprintf(es[cnt].id, sizeof es[cnt].id, "%s", id);
            es[cnt].info.bytes = strtoull(rp->element[0]->str, NULL, 10);
            ak_redis_parse_mtime(rp->element[1]->type == REDIS_REPLY_STRING ? rp->element[1]->str : NULL, &es[cnt].info.mtime,
                        &es[cnt].info.mtime_ns);
            cnt++;
        }
        freeReplyObject(rp);
    }
    ak_redis_conn_put(r, cn);
    keylist_free(&l);
    if (rc) {
        free(es);
        return -1;
    }
    *out = es;
    *n = cnt;
    return 0;
}

/* Deletes a manifest and its chunks (KEYS[1]; ARGV[1] the chunk prefix).
 * Returns 0 if there was none. */
static const char REMOVE_LUA[] =
    "local g = redis.call('HGET', KEYS[1], 'gen')\n"
    "local n = redis.call('HGET', KEYS[1], 'n')\n"
    "if not g then return redis.call('DEL', KEYS[1]) end\n"
    "for i = 0, tonumber(n) - 1 do redis.call('DEL', ARGV[1] .. g .. ':' .. i) end\n"
    "return redis.call('DEL', KEYS[1])\n";

/* store_backend.h's remove. */
int ak_redis_remove(ak_store_backend *b, int kind, const char *id, ak_error *err) {
    redis_backend *r = (redis_backend *)b;
    char mkey[AK_AGENT_ID_MAX + 32], prefix[AK_AGENT_ID_MAX + 32];
    key_of(kind, id, "m", mkey, sizeof mkey);
    key_of(kind, id, "c:", prefix, sizeof prefix);
    conn *cn = ak_redis_conn_get(r, err);
    if (!cn) return -1;
    redisReply *rp = ak_redis_cmds(r, cn, err, "EVAL", REMOVE_LUA, "1", mkey, prefix, (char *)NULL);
    ak_redis_conn_put(r, cn);
    if (!rp) return -1;
    int gone = rp->type == REDIS_REPLY_INTEGER && rp->integer == 0;
    freeReplyObject(rp);
    return gone ? 1 : 0;
}

/* ------------------------------------------------------------ quarantine */

/* KEYS[1] manifest, KEYS[2] the quarantine key; ARGV[1] the generation the
 * reader opened ("" any). 0 none, -1 replaced, -2 name taken, 1 moved. */
static const char QUARANTINE_LUA[] =
    "local g = redis.call('HGET', KEYS[1], 'gen')\n"
    "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end\n"
    "if ARGV[1] ~= '' and g ~= ARGV[1] then return -1 end\n"
    "if redis.call('EXISTS', KEYS[2]) == 1 then return -2 end\n"
    "redis.call('RENAME', KEYS[1], KEYS[2])\n"
    "local t = redis.call('TIME')\n"
    "redis.call('HSET', KEYS[2], 'qtime', t[1] .. '.' .. t[2])\n"
    "return 1\n";

/* store_backend.h's quarantine: the manifest renamed to
 * "akv:{<k>:<id>}:q:<reason>.<unix time>[.k]" (prefix unused: the kind is
 * in the key). */
int ak_redis_quarantine(ak_store_backend *b, const ak_quarantine_args *a, const char *prefix, ak_blob_qname *q) {
    redis_backend *r = (redis_backend *)b;
    int kind = a->kind;
    const char *id = a->id, *reason = a->reason;
    ak_blob_get *g = a->g;
    char *why = a->why;
    size_t whyn = a->whyn;
    char mkey[AK_AGENT_ID_MAX + 32];
    key_of(kind, id, "m", mkey, sizeof mkey);
    ak_error e = {{0}};
    conn *cn = ak_redis_conn_get(r, &e);
    if (!cn) {
        snprintf(why, whyn, "%s", e.msg);
        return -1;
    }
    long now = (long)time(NULL);
    int rc = -1;
    snprintf(why, whyn, "no free name");
    for (int k = 0; k < 100; k++) {
        char rest[80], qkey[AK_AGENT_ID_MAX + 128];
        if (k) snprintf(rest, sizeof rest, "q:%s.%ld.%d", reason, now, k);
        else snprintf(rest, sizeof rest, "q:%s.%ld", reason, now);
        key_of(kind, id, rest, qkey, sizeof qkey);
        redisReply *rp = ak_redis_cmds(r, cn, &e, "EVAL", QUARANTINE_LUA, "2", mkey, qkey, g ? g->gen : "", (char *)NULL);
        if (!rp) {
            snprintf(why, whyn, "%s", e.msg);
            break;
        }
        long long x = rp->type == REDIS_REPLY_INTEGER ? rp->integer : -3;
        freeReplyObject(rp);
        if (x == -2) continue;
        if (x == 0) rc = g ? -1 : 1;
        if (x == 0 && g) snprintf(why, whyn, "the image was removed meanwhile");
        if (x == -1) snprintf(why, whyn, "the image was replaced meanwhile; the new one was left in place");
        if (x == -3) snprintf(why, whyn, "unexpected reply");
        if (x == 1) {
            rc = 0;
            memset(q, 0, sizeof *q);
            snprintf(q->name, sizeof q->name, "%s", qkey);
            q->bytes = g ? g->bytes : 0;
            q->t = now;
            snprintf(a->where, a->wn, "%s %s", r->url, qkey);
        }
        break;
    }
    ak_redis_conn_put(r, cn);
    (void)prefix;   /* the kind is in the key */
    return rc;
}

/* store_backend.h's quarantine_list: the quarantined manifests, with the
 * size and the time they were moved. */
int ak_redis_quarantine_list(ak_store_backend *b, ak_blob_qname **out, int *n, ak_error *err) {
    redis_backend *r = (redis_backend *)b;
    keylist l = {0};
    *out = NULL;
    *n = 0;
    if (scan(r, "akv:{*}:q:*", collect, &l, err) != 0) {
        keylist_free(&l);
        return -1;
    }
    ak_blob_qname *qs = calloc((size_t)(l.n ? l.n : 1), sizeof *qs);
    conn *cn = qs ? ak_redis_conn_get(r, err) : NULL;
    int cnt = 0;
    for (int i = 0; cn && i < l.n; i++) {
        if (strlen(l.keys[i]) >= sizeof qs->name) continue;
        redisReply *rp = ak_redis_cmds(r, cn, err, "HMGET", l.keys[i], "bytes", "qtime", (char *)NULL);
        if (!rp) break;
        if (rp->type == REDIS_REPLY_ARRAY && rp->elements == 2) {
            snprintf(qs[cnt].name, sizeof qs[cnt].name, "%s", l.keys[i]);
            if (rp->element[0]->type == REDIS_REPLY_STRING) qs[cnt].bytes = strtoull(rp->element[0]->str, NULL, 10);
            ak_redis_parse_mtime(rp->element[1]->type == REDIS_REPLY_STRING ? rp->element[1]->str : NULL, &qs[cnt].t, &qs[cnt].tn);
            cnt++;
        }
        freeReplyObject(rp);
    }
    if (cn) ak_redis_conn_put(r, cn);
    keylist_free(&l);
    if (!qs) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    *out = qs;
    *n = cnt;
    return 0;
}

/* store_backend.h's quarantine_drop: the manifest and its chunks. */
void ak_redis_quarantine_drop(ak_store_backend *b, const char *name) {
    redis_backend *r = (redis_backend *)b;
    /* the chunks' prefix: the key up to and including "}:", then "c:" */
    const char *close = strstr(name, "}:q:");
    if (!close) return;
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%.*sc:", (int)(close - name + 2), name);
    ak_error e = {{0}};
    conn *cn = ak_redis_conn_get(r, &e);
    if (!cn) return;
    redisReply *rp = ak_redis_cmds(r, cn, &e, "EVAL", REMOVE_LUA, "1", name, prefix, (char *)NULL);
    if (rp) freeReplyObject(rp);
    ak_redis_conn_put(r, cn);
}
