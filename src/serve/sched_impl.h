/* sched_impl.h - what the scheduler's management operations (sched_ops.c)
 * read of the scheduler (sched.c). Internal to src/serve/. Every function
 * here is for the engine thread only: call it from an operation run by
 * ak_sched_post. */
#ifndef AK_SCHED_IMPL_H
#define AK_SCHED_IMPL_H

#include "serve/sched.h"

/* The configuration the scheduler runs with (defaults filled in). */
const ak_sched_config *ak_sched_config_of(const ak_sched *s);
/* 1 when a request of agent id is running or queued. */
int ak_sched_agent_busy(const ak_sched *s, const char *id);
/* 1 while a pool job making pool id runs. */
int ak_sched_pool_job_active(const ak_sched *s, const char *id);
/* Requests running and waiting for admission. */
void ak_sched_counts(const ak_sched *s, int *n_active, int *n_waiting);

#endif
