/* threadpool.h - a persistent pool of worker threads with a cheap barrier.
 *
 * Threads are created once; ak_threads_run wakes them, runs fn on every thread
 * (the calling thread is thread 0) and returns when all have finished. No
 * thread is created per operation. A pool is used by one caller at a time.
 */
#ifndef AK_THREADPOOL_H
#define AK_THREADPOOL_H

#include "base/util.h"

typedef struct ak_threads ak_threads;
typedef void (*ak_task_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0 means all cores. Returns NULL and sets err on failure. */
ak_threads *ak_threads_new(int n_threads, ak_error *err);
void ak_threads_free(ak_threads *pool);
int ak_threads_size(const ak_threads *pool);
/* Runs fn(ctx, ith, nth) for ith in [0, nth) concurrently; blocks until done.
 * pool may be NULL: then fn(ctx, 0, 1) runs on the caller. */
void ak_threads_run(ak_threads *pool, ak_task_fn fn, void *ctx);
/* Parallel regions run so far: ak_threads_run calls on this pool (each one a
 * wake-up of the workers and a wait for all of them when it has more than
 * one thread). 0 for a NULL pool. Read by the caller between runs (bench
 * engine prints it per decoded token). */
uint64_t ak_threads_runs(const ak_threads *pool);
/* A scratch buffer of at least `bytes` bytes owned by the pool, 64-byte
 * aligned, grown on demand and reused by later calls (contents not kept).
 * Returns NULL if pool is NULL or memory is exhausted. */
void *ak_threads_scratch(ak_threads *pool, size_t bytes);
/* From now on ak_threads_scratch fails (NULL) for requests over `bytes`, as if
 * memory were exhausted; SIZE_MAX lifts the limit. For tests that inject the
 * out-of-memory paths of the scratch's users. */
void ak_threads_limit_scratch(ak_threads *pool, size_t bytes);
/* How long a wait (a worker for work, the caller for the workers) spins
 * before it blocks on a condition variable: `seconds` (default 200e-6; a
 * short pause loop always comes first). 0 blocks almost at once, which puts
 * every run through the sleep and wake-up hand-offs (tests of them; an idle
 * pool that must not spin). Call between runs. */
void ak_threads_set_spin(ak_threads *pool, double seconds);

#endif
