/* The Lua scripts that make multi-key steps atomic. They are loaded with SCRIPT LOAD once per
 * connection (after every reconnect) and run with EVALSHA; a NOSCRIPT answer (a SCRIPT FLUSH, a
 * failover) loads them again and repeats the call (see rq_pipe_exec).
 *
 * Every script takes the same first KEYS and ARGV, so one helper builds the call (rq_script_cmd
 * in queue/rq.h); its own keys and arguments follow:
 *
 *   KEYS[1] <p>:events   KEYS[2] <p>:dead   KEYS[3] <p>:cancel   KEYS[4] the processing list it
 *   works on (the caller's, or a lapsed worker's for the reaper)
 *   ARGV[1] <p>:job:   ARGV[2] <p>:queue:   ARGV[3] the caller's worker id   ARGV[4] now (unix s)
 *   ARGV[5] events MAXLEN   ARGV[6] result TTL s (0 = none)   ARGV[7] default queue name
 *   ARGV[8] max job bytes (0 = no limit)   ARGV[9] max_attempts   ARGV[10] <p>:batch:
 *   ARGV[11] <p>:batch-done (the channel)   ARGV[12] <p>:worker: (heartbeat keys)
 *
 * A job's key is read inside the scripts with the same rule as rq_job_id (queue/jobid.h), except
 * on the fetch path: fetch and start never decode a job (its size is bounded only by
 * queues.max_job_bytes), the worker reads the ids and passes them to start.
 *
 * Batch counts stay exact because every status change of a job hash happens in a script, through
 * the prelude's set_status(), which moves the count of the batch named by the hash's batch_id
 * (written at push) from the old status to the new one in the same atomic step; the step that
 * makes the last job final completes the batch (state, finished_at, TTL, a batch_completed event,
 * PUBLISH <p>:batch-done <id>). A hash without batch_id touches no batch. docs/QUEUE.md has the
 * batch hash's fields. */
#pragma once
#include <stdint.h>

struct rq_conn;

enum rq_script {
    RQ_SCRIPT_FETCH,        /* move up to N jobs (and a byte bound) from queues into processing, undecoded */
    RQ_SCRIPT_START,        /* mark jobs just moved into processing running, by the ids the caller read */
    RQ_SCRIPT_REQUEUE,      /* processing -> the front of a queue */
    RQ_SCRIPT_REAP,         /* a lapsed worker's processing list -> queues (or dead) */
    RQ_SCRIPT_RETRY,        /* processing -> retry zset (or dead when out of attempts) */
    RQ_SCRIPT_RETRY_DUE,    /* retry zset -> queues for entries that are due */
    RQ_SCRIPT_DEAD,         /* processing -> dead */
    RQ_SCRIPT_DEAD_REQUEUE, /* dead -> queues */
    RQ_SCRIPT_CANCEL,       /* add ids to the cancel set unless their job already ended */
    RQ_SCRIPT_ACK,          /* processing -> done: the final status of a batch of jobs */
    RQ_SCRIPT_PUSH,         /* client side: new jobs onto a queue, with their hashes and batch counts */
    RQ_SCRIPT_BATCH_OPEN,   /* create (or reopen for appending) a batch */
    RQ_SCRIPT_BATCH_SEAL,   /* end an enqueue: the batch may complete */
    RQ_SCRIPT_BATCH_CANCEL, /* cancel a batch: its state, and its running jobs into the cancel set */
    RQ_SCRIPT_BATCH_RERUN,  /* run a batch's finished jobs again from their stored requests */
    RQ_SCRIPT_ATTEMPT,      /* count a delivery of jobs that start running */
    RQ_SCRIPT_HEARTBEAT,    /* a worker's heartbeat, unless another instance holds its id */
    RQ_SCRIPT_PURGE,        /* operator: empty a queue, the retry set or the dead list, hashes too */
    RQ_SCRIPT_PUBLISH,      /* rows onto a results stream, under its length cap (queue/results.h) */
    RQ_SCRIPT_COUNT
};

#define RQ_SCRIPT_COMMON_KEYS 4
#define RQ_SCRIPT_COMMON_ARGS 12

/* SHA1s of the loaded scripts and the connection epoch they were loaded in. */
struct rq_scripts {
    char sha[RQ_SCRIPT_COUNT][41];
    uint64_t epoch; /* rq_conn.epoch at the last load; 0 = never */
};

/* "fetch", "start", ... */
const char *rq_script_name(enum rq_script s);
/* The full Lua source (a static string). */
const char *rq_script_source(enum rq_script s);
/* The prelude every script starts with (a static string): its helpers, job_id() among them, for
 * tests that run them on their own (tests/unit/test_rq_jobkey.c). */
const char *rq_script_prelude(void);

/* SCRIPT LOAD of every script in one round trip, unless already done on this connection
 * (force: regardless). 0, or -1 with the reason in c->err. */
int rq_scripts_load(struct rq_scripts *sc, struct rq_conn *c, int force);
