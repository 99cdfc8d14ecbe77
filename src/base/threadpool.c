/* threadpool.c - see threadpool.h.
 *
 * Design: n-1 worker threads are created once. A run publishes (fn, ctx),
 * sets `pending` to n-1 and bumps the generation counter `gen`; workers
 * notice the new generation, run fn, and decrement `pending`. The caller runs
 * its own share as thread 0 and then waits for `pending` to reach zero.
 *
 * Both waits (workers for work, the caller for completion) spin on the atomic
 * for a short while, because in the forward pass the next run usually comes
 * within microseconds, and then fall back to a condition variable so that an
 * idle pool costs no CPU. A thread announces that it is about to sleep with a
 * sequentially consistent increment of a "sleeping" counter, re-checks the
 * condition under the mutex, and the other side only takes the mutex to
 * signal when it sees a sleeper: with seq_cst on both sides, either the
 * sleeper sees the new state or the waker sees the sleeper, so no wake-up is
 * lost and the common (spinning) case never touches the mutex. Both
 * announcements are read-modify-writes (see ak_threads_run for why).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "base/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__) || defined(__arm__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

/* Waiting: SPIN_PAUSES iterations of a plain pause loop (the answer usually
 * comes within a microsecond or two), then sched_yield in the loop so that a
 * thread the scheduler put on the same CPU as the spinner can run (without it
 * a run could cost a whole scheduler slice), for up to SPIN_SECONDS in all,
 * then block on the condition variable (ak_threads_set_spin changes the time). */
#define SPIN_PAUSES 128
#define SPIN_SECONDS 200e-6

typedef struct {
    ak_threads *pool;
    int ith;
    pthread_t tid;
} ak_worker;

struct ak_threads {
    int n;                      /* threads including the caller */
    ak_worker *workers;         /* n-1 of them */
    int started;                /* workers successfully created */

    ak_task_fn fn;              /* the current run, valid while pending > 0 */
    void *ctx;
    atomic_uint gen;            /* bumped once per run (and to stop) */
    atomic_int pending;         /* workers that have not finished this run */
    atomic_int stop;
    atomic_int sleepers;        /* workers blocked, or about to, on cv_work */
    atomic_int caller_sleeping; /* caller blocked, or about to, on cv_done */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;

    uint64_t runs;              /* ak_threads_run calls (ak_threads_runs); the one caller's */
    void *scratch;              /* ak_threads_scratch */
    size_t scratch_cap;
    size_t scratch_limit;       /* requests over it fail (ak_threads_limit_scratch) */
    _Atomic double spin_seconds; /* ak_threads_set_spin; read by the workers (last:
                                    off the lines the hand-offs write) */
};

/* One step of a bounded spin; i counts from 1. Returns 0 once the caller
 * should stop spinning and block. */
static int spin_step(unsigned i, double *t0, double limit) {
    if (i < SPIN_PAUSES) { cpu_relax(); return 1; }
    sched_yield();
    double now = ak_now();
    if (*t0 == 0) *t0 = now;
    return now - *t0 < limit;
}

/* Spin until *a != old: 1 if it changed, 0 if the caller should block. */
static int spin_until_change(atomic_uint *a, unsigned old, double limit) {
    double t0 = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(a, memory_order_acquire) != old) return 1;
        if (!spin_step(i, &t0, limit)) return 0;
    }
}

/* Spin until *a == 0: 1 if it did, 0 if the caller should block. */
static int spin_until_zero(atomic_int *a, double limit) {
    double t0 = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(a, memory_order_acquire) == 0) return 1;
        if (!spin_step(i, &t0, limit)) return 0;
    }
}

static void *worker_main(void *arg) {
    ak_worker *w = arg;
    ak_threads *p = w->pool;
    unsigned seen = 0;
    ak_flush_denormals(); /* workers only run kernels: see util.h */
    for (;;) {
        if (!spin_until_change(&p->gen, seen, atomic_load_explicit(&p->spin_seconds, memory_order_relaxed))) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen) pthread_cond_wait(&p->cv_work, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        p->fn(p->ctx, w->ith, p->n);
        /* The last worker out wakes the caller if it stopped spinning. */
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_sleeping)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

/* Publishes a new generation and wakes sleeping workers. */
static void bump_generation(ak_threads *p) {
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Creates a pool of n_threads threads (the caller counts as one; <= 0 means
 * one per online CPU). Workers are started now and live until ak_threads_free.
 * Returns NULL and sets err if memory or a thread cannot be had. */
ak_threads *ak_threads_new(int n_threads, ak_error *err) {
    if (n_threads <= 0) n_threads = ak_num_cpus();
    ak_threads *p = ak_calloc(1, sizeof *p, err);
    if (!p) return NULL;
    p->n = n_threads;
    p->scratch_limit = SIZE_MAX;
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_sleeping, 0);
    atomic_init(&p->spin_seconds, SPIN_SECONDS);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (n_threads > 1) {
        p->workers = ak_calloc((size_t)n_threads - 1, sizeof *p->workers, err);
        if (!p->workers) { ak_threads_free(p); return NULL; }
        for (int i = 1; i < n_threads; i++) {
            ak_worker *w = &p->workers[i - 1];
            w->pool = p;
            w->ith = i;
            int rc = pthread_create(&w->tid, NULL, worker_main, w);
            if (rc != 0) {
                ak_fail(err, "cannot create worker thread %d of %d: %s", i, n_threads, strerror(rc));
                ak_threads_free(p);
                return NULL;
            }
            p->started++;
        }
    }
    return p;
}

/* Stops and joins the workers and frees everything, scratch included.
 * Must not be called while a run is in progress. NULL is a no-op. */
void ak_threads_free(ak_threads *pool) {
    if (!pool) return;
    if (pool->started > 0) {
        atomic_store(&pool->stop, 1);
        pthread_mutex_lock(&pool->mu);   /* wake everyone, sleeping or not */
        atomic_fetch_add(&pool->gen, 1);
        pthread_cond_broadcast(&pool->cv_work);
        pthread_mutex_unlock(&pool->mu);
        for (int i = 0; i < pool->started; i++) pthread_join(pool->workers[i].tid, NULL);
    }
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv_work);
    pthread_cond_destroy(&pool->cv_done);
    free(pool->workers);
    free(pool->scratch);
    free(pool);
}

/* Number of threads, the caller included; 1 for a NULL pool. */
int ak_threads_size(const ak_threads *pool) { return pool ? pool->n : 1; }

/* Runs fn(ctx, ith, nth) on every thread (the caller is ith 0) and returns
 * once all have returned; everything they wrote is then visible to the
 * caller. Not reentrant: fn must not call ak_threads_run on the same pool. */
void ak_threads_run(ak_threads *pool, ak_task_fn fn, void *ctx) {
    if (pool) pool->runs++;
    if (!pool || pool->n == 1) { fn(ctx, 0, 1); return; }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store(&pool->pending, pool->n - 1);
    bump_generation(pool);
    fn(ctx, 0, pool->n);
    if (!spin_until_zero(&pool->pending, atomic_load_explicit(&pool->spin_seconds, memory_order_relaxed))) {
        pthread_mutex_lock(&pool->mu);
        /* An exchange, not a store: the announcement must be ordered before
         * the load of pending below. C11 promises that for a seq_cst store
         * too, and AArch64 hardware keeps STLR before LDAR, but qemu-user
         * (7.2, on an x86 host) lets that load pass the store, and then
         * both sides sleep. An atomic read-modify-write is a full barrier
         * everywhere, as on the workers' side (sleepers). */
        atomic_exchange(&pool->caller_sleeping, 1);
        while (atomic_load(&pool->pending) != 0) pthread_cond_wait(&pool->cv_done, &pool->mu);
        atomic_store(&pool->caller_sleeping, 0);
        pthread_mutex_unlock(&pool->mu);
    }
}

/* The number of ak_threads_run calls on pool so far (0 for NULL). Only the
 * pool's one caller writes it, so a plain read between runs is exact. */
uint64_t ak_threads_runs(const ak_threads *pool) { return pool ? pool->runs : 0; }

/* Returns a 64-byte aligned buffer of at least `bytes` bytes, reallocating
 * (without keeping the contents) only when it has to grow. The buffer stays
 * valid until the next call or ak_threads_free. NULL for a NULL pool or OOM. */
void *ak_threads_scratch(ak_threads *pool, size_t bytes) {
    if (!pool || bytes > pool->scratch_limit) return NULL;
    if (bytes <= pool->scratch_cap && pool->scratch) return pool->scratch;
    size_t cap = pool->scratch_cap + pool->scratch_cap / 2;   /* grow geometrically */
    if (cap < bytes) cap = bytes;
    if (cap > SIZE_MAX - 64) return NULL;
    cap = (cap + 63) & ~(size_t)63;   /* aligned_alloc wants a multiple */
    void *m = aligned_alloc(64, cap ? cap : 64);
    if (!m) return NULL;
    free(pool->scratch);
    pool->scratch = m;
    pool->scratch_cap = cap;
    return m;
}

/* Sets how long waits spin before they block (threadpool.h). */
void ak_threads_set_spin(ak_threads *pool, double seconds) {
    if (pool) atomic_store_explicit(&pool->spin_seconds, seconds > 0 ? seconds : 0, memory_order_relaxed);
}

/* Sets the size over which ak_threads_scratch fails (see threadpool.h). */
void ak_threads_limit_scratch(ak_threads *pool, size_t bytes) {
    if (pool) pool->scratch_limit = bytes;
}
