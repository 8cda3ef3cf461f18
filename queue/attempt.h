/* Counting deliveries: a job's `attempts` (its hash) counts the deliveries in which it ran, not
 * the ones in which it was only held. The fetch marks a job running without counting; the worker
 * calls rq_attempt for the jobs its engine is about to run for the first time, before the engine
 * step that runs them, so a job that crashes the worker in its first step has that delivery
 * counted. Jobs handed back without having run (the reaper, start-up recovery, shutdown, routing)
 * therefore come back with the count they had, and the reaper's poison rule (max_attempts
 * deliveries: dead-lettered, queue/reaper.h) only sees crashes during which the job ran. */
#pragma once

#include "queue/fetch.h"

struct rq;

/* Counts one delivery for each of jobs[0..n) that has an id, in one round trip: HINCRBY attempts
 * in its hash while the hash says it runs on this worker. Sets each one's attempts to the new
 * count and counted to true; a job whose hash is no longer this worker's (reaped meanwhile, or
 * final) is left as it is. Jobs already counted are skipped. 0, or -1 (rq_error; nothing is
 * marked counted: call again). */
int rq_attempt(struct rq *q, struct rq_job *const *jobs, int n);
