/* test_store_redis.h - a real redis-server for the Redis store tests
 * (test_store_redis*.c): started by the test on a free loopback port with its
 * own temp directory, no persistence (--save "" --appendonly no), and
 * stopped by it. A test that cannot start one fails (never skips). */
#ifndef AK_TEST_STORE_REDIS_H
#define AK_TEST_STORE_REDIS_H

#include <hiredis/hiredis.h>
#include <sys/types.h>

#include "test.h"

typedef struct {
    pid_t pid;
    int port;
    char dir[512];
    char url[64];          /* redis://127.0.0.1:PORT/0 */
} redis_srv;

/* Starts redis-server on a free loopback port (port 0) or on port (a
 * restart); waits (at most 5 s) until it answers PING. Returns 0, or -1
 * having failed the test. */
int redis_start(ak_test_ctx *t, redis_srv *r, int port);
/* Stops it (SIGTERM, then SIGKILL after 5 s) and waits for it. */
void redis_stop(redis_srv *r);
/* A connection to it (NULL on failure; redisFree it). */
redisContext *redis_conn(const redis_srv *r);
/* Number of keys matching pattern (KEYS; tests only). -1 on error. */
int redis_count(const redis_srv *r, const char *pattern);

#endif
