/* store_redis_lease.c - the Redis backend's leases (store_backend.h:
 * LEASES; the key: store_redis.c, akv:{a:<id>}:lease).
 *
 * One node serves an agent. lease_hold takes the lease of an agent (SET NX
 * PX, a token random per process and lease), or notes it used if held; a
 * thread named "ak-lease" renews every held lease each third of the lease
 * time, and releases those not used for a lease time; the manifest write is
 * fenced by the token (a node whose lease expired or was taken cannot
 * overwrite); a node that finds its lease gone stops writing that agent and
 * logs one line. At close the thread is joined and the leases still held are
 * released.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sodium.h>

#include "store/store_redis_impl.h"

/* KEYS[1] a lease, ARGV[1] our token: if the lease is still ours, RENEW
 * gives it ARGV[2] ms more and RELEASE deletes it (1); else 0. */
static const char RENEW_LUA[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end\n"
    "return 0\n";
static const char RELEASE_LUA[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end\n"
    "return 0\n";

/* Logs a line made of fmt with id and what. */
static void lease_log(redis_backend *r, const char *fmt, const char *id, const char *what) {
    char line[400];
    snprintf(line, sizeof line, fmt, id, what);
    ak_redis_log(r, line);
}

/* Drops lease i from the table. Call with r->mu held. */
static void lease_drop(redis_backend *r, int i) {
    memmove(r->leases + i, r->leases + i + 1, sizeof *r->leases * (size_t)(r->n_leases - i - 1));
    r->n_leases--;
}

/* The renewal thread ("ak-lease"): each third of the lease time renews
 * the leases in use, releases the idle ones, and drops (and logs) those
 * found lost. Ends when the backend closes (joined there). */
static void *lease_main(void *arg) {
    redis_backend *r = arg;
    pthread_setname_np(pthread_self(), "ak-lease");
    pthread_mutex_lock(&r->mu);
    while (!r->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = (long long)ts.tv_nsec + (long long)(r->lease_ms / 3) * 1000000LL;
        ts.tv_sec += (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        pthread_cond_timedwait(&r->lease_cv, &r->mu, &ts);
        if (r->stopping) break;
        int n = r->n_leases;
        lease *copy = n ? malloc(sizeof *copy * (size_t)n) : NULL;
        if (copy) memcpy(copy, r->leases, sizeof *copy * (size_t)n);
        pthread_mutex_unlock(&r->mu);
        double now = ak_now();
        for (int i = 0; copy && i < n; i++) {
            ak_error e = {{0}};
            conn *cn = ak_redis_conn_get(r, &e);
            if (!cn) break;   /* Redis away: the leases expire, and writes are refused (fenced) */
            char key[AK_AGENT_ID_MAX + 32], ms[24];
            key_of(AK_FILE_AGENT, copy[i].id, "lease", key, sizeof key);
            snprintf(ms, sizeof ms, "%d", r->lease_ms);
            int idle = (now - copy[i].last_used) * 1e3 > r->lease_ms;
            redisReply *rp = idle ? ak_redis_cmds(r, cn, &e, "EVAL", RELEASE_LUA, "1", key, copy[i].token, (char *)NULL)
                                  : ak_redis_cmds(r, cn, &e, "EVAL", RENEW_LUA, "1", key, copy[i].token, ms, (char *)NULL);
            int held = rp && rp->type == REDIS_REPLY_INTEGER && rp->integer == 1;
            if (rp) freeReplyObject(rp);
            ak_redis_conn_put(r, cn);
            if (!rp) continue;   /* undecided: tried again next round */
            pthread_mutex_lock(&r->mu);
            for (int j = 0; j < r->n_leases; j++)
                if (!strcmp(r->leases[j].id, copy[i].id) && !strcmp(r->leases[j].token, copy[i].token)) {
                    /* used again since the copy: kept for the next round */
                    if (idle && r->leases[j].last_used > copy[i].last_used) break;
                    if (!idle && !held)
                        lease_log(r, "store: redis: lost the lease on agent %s%s; this node stops writing it",
                                  copy[i].id, "");
                    if (idle || !held) lease_drop(r, j);
                    break;
                }
            pthread_mutex_unlock(&r->mu);
        }
        free(copy);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* store_backend.h's lease_hold: renewed by the thread started with the
 * first lease held. */
int ak_redis_lease_hold(ak_store_backend *b, const char *id, ak_error *err) {
    redis_backend *r = (redis_backend *)b;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n_leases; i++)
        if (!strcmp(r->leases[i].id, id)) {
            r->leases[i].last_used = ak_now();
            pthread_mutex_unlock(&r->mu);
            return 0;
        }
    pthread_mutex_unlock(&r->mu);
    lease l;
    memset(&l, 0, sizeof l);
    snprintf(l.id, sizeof l.id, "%s", id);
    uint8_t t[16];
    randombytes_buf(t, sizeof t);
    for (int i = 0; i < 16; i++) snprintf(l.token + 2 * i, 3, "%02x", t[i]);
    char key[AK_AGENT_ID_MAX + 32], ms[24];
    key_of(AK_FILE_AGENT, id, "lease", key, sizeof key);
    snprintf(ms, sizeof ms, "%d", r->lease_ms);
    conn *cn = ak_redis_conn_get(r, err);
    if (!cn) return -1;
    redisReply *rp = ak_redis_cmds(r, cn, err, "SET", key, l.token, "NX", "PX", ms, (char *)NULL);
    ak_redis_conn_put(r, cn);
    if (!rp) return -1;
    int got = rp->type == REDIS_REPLY_STATUS;
    freeReplyObject(rp);
    if (!got) {
        ak_failc(err, AK_ERR_BUSY, "agent %s: its lease is held by another node", id);
        return 1;
    }
    l.last_used = ak_now();
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    if (r->n_leases == r->cap_leases) {
        int nc = r->cap_leases ? r->cap_leases * 2 : 16;
        lease *nl = realloc(r->leases, sizeof *nl * (size_t)nc);
        if (nl) {
            r->leases = nl;
            r->cap_leases = nc;
        }
    }
    if (r->n_leases < r->cap_leases) r->leases[r->n_leases++] = l;
    else rc = ak_failc(err, AK_ERR_NOMEM, "out of memory");
    if (!rc && !r->lease_thread_on && pthread_create(&r->lease_thread, NULL, lease_main, r) == 0) r->lease_thread_on = 1;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* store_backend.h's lease_held. */
int ak_redis_lease_held(ak_store_backend *b, const char *id) {
    redis_backend *r = (redis_backend *)b;
    char tok[33];
    ak_redis_lease_token(r, AK_FILE_AGENT, id, tok);
    return tok[0] != 0;
}

/* The token of this node's lease on (kind, id) into tok ("" if none held;
 * only agents have leases). */
void ak_redis_lease_token(redis_backend *r, int kind, const char *id, char tok[33]) {
    tok[0] = 0;
    if (kind != AK_FILE_AGENT) return;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n_leases; i++)
        if (!strcmp(r->leases[i].id, id)) snprintf(tok, 33, "%s", r->leases[i].token);
    pthread_mutex_unlock(&r->mu);
}

/* Drops this node's lease on agent id from the table: its writes of the
 * agent stop (a later save asks for the lease again). */
void ak_redis_lease_lost(redis_backend *r, const char *id) {
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n_leases; i++)
        if (!strcmp(r->leases[i].id, id)) {
            lease_drop(r, i);
            break;
        }
    pthread_mutex_unlock(&r->mu);
}

/* Joins the renewal thread, then releases every lease still held: another
 * node may take the agents at once. */
void ak_redis_lease_stop(redis_backend *r) {
    pthread_mutex_lock(&r->mu);
    r->stopping = 1;
    pthread_cond_broadcast(&r->lease_cv);
    int on = r->lease_thread_on;
    pthread_mutex_unlock(&r->mu);
    if (on) pthread_join(r->lease_thread, NULL);
    for (int i = 0; i < r->n_leases; i++) {
        ak_error e = {{0}};
        conn *cn = ak_redis_conn_get(r, &e);
        if (!cn) break;
        char key[AK_AGENT_ID_MAX + 32];
        key_of(AK_FILE_AGENT, r->leases[i].id, "lease", key, sizeof key);
        redisReply *rp = ak_redis_cmds(r, cn, &e, "EVAL", RELEASE_LUA, "1", key, r->leases[i].token, (char *)NULL);
        if (rp) freeReplyObject(rp);
        ak_redis_conn_put(r, cn);
    }
}
