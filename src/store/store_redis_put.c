/* store_redis_put.c - the Redis backend's writes (store_backend.h: PUT;
 * the keys and the commit: store_redis.c). A put buffers the image a chunk
 * at a time, SETs each chunk with an expiry (pipelined, PIPE_DEPTH in
 * flight) while summing it, and commits with one Lua script that checks
 * the lease (fencing), makes the chunks persistent, lets the previous
 * generation's expire and replaces the manifest.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "store/store_redis_impl.h"

/* store_backend.h's put_begin: a random generation names the put's chunks;
 * the connection is held until commit or abort (the pipelined SETs). */
ak_blob_put *ak_redis_put_begin(ak_store_backend *b, int kind, const char *id, uint64_t total, ak_error *err) {
    redis_backend *r = (redis_backend *)b;
    uint64_t n = (total + CHUNK_BYTES - 1) / CHUNK_BYTES;
    if (n == 0 || n > MAX_CHUNKS) {
        ak_failc(err, AK_ERR_INVALID, "%s: an image of %llu bytes", id, (unsigned long long)total);
        return NULL;
    }
    ak_blob_put *p = ak_calloc(1, sizeof *p, err);
    if (!p) return NULL;
    p->r = r;
    p->kind = kind;
    snprintf(p->id, sizeof p->id, "%s", id);
    p->total = total;
    uint8_t g[8];
    randombytes_buf(g, sizeof g);
    for (int i = 0; i < 8; i++) snprintf(p->gen + 2 * i, 3, "%02x", g[i]);
    p->buf = malloc(CHUNK_BYTES);
    p->sums = malloc((size_t)n * 16 + 1);
    if (!p->buf || !p->sums || !(p->cn = ak_redis_conn_get(r, err))) {
        if (!p->buf || !p->sums) ak_failc(err, AK_ERR_NOMEM, "out of memory");
        free(p->buf);
        free(p->sums);
        free(p);
        return NULL;
    }
    p->sums[0] = 0;
    return p;
}

/* Reads replies of pipelined SETs until at most keep are pending. Returns
 * 0, or -1 with err set (a failed SET: the put fails). */
static int drain(ak_blob_put *p, int keep, ak_error *err) {
    int rc = 0;
    while (p->pending > keep) {
        redisReply *rp = NULL;
        if (redisGetReply(p->cn->c, (void **)&rp) != REDIS_OK || !rp) {
            p->pending = 0;   /* the connection is broken: nothing more comes */
            return ak_failc(err, AK_ERR_IO, "redis %s:%d: SET: %s", p->r->host, p->r->port,
                            p->cn->c->errstr[0] ? p->cn->c->errstr : "no reply");
        }
        if (rp->type == REDIS_REPLY_ERROR && !rc)
            rc = ak_failc(err, AK_ERR_IO, "redis %s:%d: SET: %s", p->r->host, p->r->port, rp->str);
        freeReplyObject(rp);
        p->pending--;
    }
    return rc;
}

/* Writes the buffered chunk (with its expiry: see the top). */
static int flush_chunk(ak_blob_put *p, ak_error *err) {
    if (p->n == 0 && p->head_n && p->head_n <= p->used && (p->head = malloc((size_t)p->head_n)))
        memcpy(p->head, p->buf, (size_t)p->head_n);   /* no copy (out of memory): the manifest has no head */
    char key[AK_AGENT_ID_MAX + 64], rest[48], ttl[24];
    snprintf(rest, sizeof rest, "c:%s:%d", p->gen, p->n);
    key_of(p->kind, p->id, rest, key, sizeof key);
    snprintf(ttl, sizeof ttl, "%lld", CHUNK_TTL_MS);
    const char *argv[] = {"SET", key, (const char *)p->buf, "PX", ttl};
    size_t len[] = {3, strlen(key), p->used, 2, strlen(ttl)};
    /* pipelined: up to PIPE_DEPTH SETs in flight (the buffer is copied into
     * the connection's output at append) */
    if (redisAppendCommandArgv(p->cn->c, 5, argv, len) != REDIS_OK)
        return ak_failc(err, AK_ERR_IO, "redis %s:%d: SET: %s", p->r->host, p->r->port, p->cn->c->errstr);
    if (++p->pending >= PIPE_DEPTH && drain(p, 1, err) != 0) return -1;
    snprintf(p->sums + (size_t)p->n * 16, 17, "%016llx", (unsigned long long)XXH3_64bits(p->buf, p->used));
    p->n++;
    p->used = 0;
    return 0;
}

/* store_backend.h's put_head: the header's bytes are copied from the first
 * chunk into the manifest at commit. */
void ak_redis_put_head(ak_blob_put *p, uint64_t n) {
    /* a header longer than a chunk stays in the chunks */
    if (p->done == 0 && n > 0 && n <= HEAD_MAX && n <= CHUNK_BYTES && n <= p->total) p->head_n = n;
}

/* store_backend.h's put_write: a full chunk buffer is sent (flush_chunk). */
int ak_redis_put_write(ak_blob_put *p, const uint8_t *data, size_t n, ak_error *err) {
    if (p->done + n > p->total) return ak_failc(err, AK_ERR_INVALID, "%s: more bytes than announced", p->id);
    while (n > 0) {
        size_t k = CHUNK_BYTES - p->used < n ? CHUNK_BYTES - p->used : n;
        memcpy(p->buf + p->used, data, k);
        p->used += k;
        p->done += k;
        data += k;
        n -= k;
        if (p->used == CHUNK_BYTES && flush_chunk(p, err) != 0) return -1;
    }
    return 0;
}

/* Returns p's connection to the pool and frees p, its plain bytes wiped
 * (a chunk of a plain image, its header's copy). */
static void put_free(ak_blob_put *p) {
    ak_redis_conn_put(p->r, p->cn);
    sodium_memzero(p->buf, CHUNK_BYTES);
    free(p->buf);
    if (p->head) sodium_memzero(p->head, (size_t)p->head_n);
    free(p->head);
    free(p->sums);
    free(p);
}

/* store_backend.h's put_abort: the chunks written are deleted now if the
 * connection still works (else they expire by themselves). */
void ak_redis_put_abort(ak_blob_put *p) {
    if (!p) return;
    ak_error de = {{0}};
    if (p->cn && p->pending) drain(p, 0, &de);
    /* the chunks written expire by themselves; delete them now if we can */
    for (int i = 0; p->cn && !p->cn->c->err && i < p->n; i++) {
        char key[AK_AGENT_ID_MAX + 64], rest[48];
        snprintf(rest, sizeof rest, "c:%s:%d", p->gen, i);
        key_of(p->kind, p->id, rest, key, sizeof key);
        ak_error e = {{0}};
        redisReply *rp = ak_redis_cmds(p->r, p->cn, &e, "DEL", key, (char *)NULL);
        if (rp) freeReplyObject(rp);
    }
    put_free(p);
}

/* The commit (see the top): KEYS[1] manifest, KEYS[2] lease; ARGV: token
 * ("" when this node holds no lease: then nobody may), gen, n, bytes,
 * chunk, sums, the chunk keys' prefix, the old chunks' expiry, the lease
 * time, the header's copy ("": none) and its sum. A lease of ours that is gone (it expired, or Redis restarted empty)
 * and that no other node took is taken again: no other writer exists at
 * that instant; one another node holds fences the write. Returns the new
 * mtime "sec.usec". */
static const char COMMIT_LUA[] =
    "local l = redis.call('GET', KEYS[2])\n"
    "if ARGV[1] == '' then if l then return redis.error_reply('LEASE held by another node') end\n"
    "elseif not l then redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[9])\n"
    "elseif l ~= ARGV[1] then return redis.error_reply('LEASE lost: another node holds the agent now') end\n"
    "local n = tonumber(ARGV[3])\n"
    "for i = 0, n - 1 do\n"
    "  local k = ARGV[7] .. ARGV[2] .. ':' .. i\n"
    "  if redis.call('EXISTS', k) == 0 then return redis.error_reply('CHUNK ' .. i .. ' missing (expired?)') end\n"
    "  redis.call('PERSIST', k)\n"
    "end\n"
    "local og = redis.call('HGET', KEYS[1], 'gen')\n"
    "local on = redis.call('HGET', KEYS[1], 'n')\n"
    "if og and og ~= ARGV[2] and on then\n"
    "  for i = 0, tonumber(on) - 1 do redis.call('PEXPIRE', ARGV[7] .. og .. ':' .. i, ARGV[8]) end\n"
    "end\n"
    "local t = redis.call('TIME')\n"
    "local mt = t[1] .. '.' .. t[2]\n"
    "redis.call('DEL', KEYS[1])\n"
    "redis.call('HSET', KEYS[1], 'v', '1', 'gen', ARGV[2], 'n', ARGV[3], 'bytes', ARGV[4], 'chunk', ARGV[5], "
    "'sums', ARGV[6], 'mtime', mt)\n"
    "if ARGV[10] ~= '' then redis.call('HSET', KEYS[1], 'head', ARGV[10], 'hsum', ARGV[11]) end\n"
    "return mt\n";

/* store_backend.h's put_commit: the last chunk sent, every SET answered,
 * then COMMIT_LUA. A fenced write (the lease another node's) is logged and
 * this node stops writing the agent; p is freed either way. */
int ak_redis_put_commit(ak_blob_put *p, ak_blob_info *info, ak_error *err) {
    redis_backend *r = p->r;
    if (p->done != p->total) {
        ak_failc(err, AK_ERR_INVALID, "%s: %llu of %llu bytes written", p->id, (unsigned long long)p->done,
                 (unsigned long long)p->total);
        ak_redis_put_abort(p);
        return -1;
    }
    if ((p->used && flush_chunk(p, err) != 0) || drain(p, 0, err) != 0) {
        ak_redis_put_abort(p);
        return -1;
    }
    char mkey[AK_AGENT_ID_MAX + 32], lkey[AK_AGENT_ID_MAX + 32], prefix[AK_AGENT_ID_MAX + 32], tok[33];
    char n[16], bytes[24], chunk[24], old_ttl[24], lease_ms[24];
    key_of(p->kind, p->id, "m", mkey, sizeof mkey);
    key_of(p->kind, p->id, "lease", lkey, sizeof lkey);
    key_of(p->kind, p->id, "c:", prefix, sizeof prefix);
    ak_redis_lease_token(r, p->kind, p->id, tok);
    snprintf(n, sizeof n, "%d", p->n);
    snprintf(bytes, sizeof bytes, "%llu", (unsigned long long)p->total);
    snprintf(chunk, sizeof chunk, "%zu", CHUNK_BYTES);
    snprintf(old_ttl, sizeof old_ttl, "%lld", OLD_CHUNK_TTL_MS);
    snprintf(lease_ms, sizeof lease_ms, "%d", r->lease_ms);
    char hsum[17] = "";
    if (p->head) snprintf(hsum, sizeof hsum, "%016llx", (unsigned long long)XXH3_64bits(p->head, (size_t)p->head_n));
    const char *argv[] = {"EVAL", COMMIT_LUA, "2", mkey, lkey, tok, p->gen, n, bytes, chunk, p->sums, prefix, old_ttl,
                          lease_ms, p->head ? (const char *)p->head : "", hsum};
    size_t alen[16];
    for (int i = 0; i < 16; i++) alen[i] = i == 14 ? (p->head ? (size_t)p->head_n : 0) : strlen(argv[i]);   /* 14: binary */
    redisReply *rp = ak_redis_cmd(r, p->cn, err, 16, argv, alen);
    if (!rp) {
        if (err->code == AK_ERR_BUSY) {
            char line[800];
            snprintf(line, sizeof line, "store: redis: agent %s: not written: %s", p->id, err->msg);
            ak_redis_log(r, line);
            if (tok[0]) ak_redis_lease_lost(r, p->id);   /* taken by another node */
        }
        ak_redis_put_abort(p);
        return -1;
    }
    memset(info, 0, sizeof *info);
    info->bytes = p->total;
    ak_redis_parse_mtime(rp->type == REDIS_REPLY_STRING ? rp->str : NULL, &info->mtime, &info->mtime_ns);
    freeReplyObject(rp);
    put_free(p);
    return 0;
}
