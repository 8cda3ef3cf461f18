/* redis.wait_replicas: the writes that must survive a failover wait for replicas (WAIT).
 *
 * Redis replicates asynchronously: a master acknowledges a write before any replica has it, and a
 * failover (Sentinel promoting a replica) loses what the replica had not received. With
 * wait_replicas N > 0, rq follows these writes with WAIT N wait_timeout_ms on the same connection
 * (in the same round trip where it can), so they are on N replicas before rq reports them done:
 *
 *   - push (llmq enqueue): fewer than N confirmations fail the push (the jobs are on the master;
 *     the caller reports an error and may enqueue them again: a job with an id is refused while it
 *     is queued, so nothing runs twice);
 *   - ack: fewer than N fail the ack; the jobs stay held and the ack is sent again later (the ack
 *     script is idempotent; a batch its first run completed is reported by the run that succeeds,
 *     rq_result.batch_done); while the last WAIT fell short, an ack first checks with ROLE that N
 *     replicas are connected and fails at once when not, so a missing replica does not cost a
 *     WAIT timeout per ack;
 *   - fetch (the start of the fetched jobs, queue/fetch.c): fewer than N put the fetched jobs back
 *     on their queue (event reason replicas_short) and the fetch returns none, so no job runs
 *     whose fetch a failover could undo (it would be handed out again); while the last WAIT fell
 *     short, a fetch first checks with ROLE and takes nothing while fewer than N replicas are
 *     connected.
 *
 * Every shortfall is counted in q->wait_shortfalls. */
#pragma once
#include <stdbool.h>

#include <hiredis/hiredis.h>

struct rq;
struct rq_pipe;

/* Appends "WAIT <wait_replicas> <wait_timeout_ms>" to p when wait_replicas > 0. Returns the
 * commands added (0 or 1). */
int rq_wait_cmd(struct rq *q, struct rq_pipe *p);
/* WAIT's reply r after `what` ("ack"): 0 when wait_replicas replicas confirmed (and the shortfall
 * state ends); else the shortfall is counted and remembered, q->err says how many confirmed, and
 * -1. */
int rq_wait_check(struct rq *q, const redisReply *r, const char *what);
/* WAIT alone on the commands connection, checked like rq_wait_check; 0 at once when
 * wait_replicas is 0. -1 also when the connection failed (rq_wait_lost tells). */
int rq_wait(struct rq *q, const char *what);
/* Whether the last WAIT fell short (until one has enough confirmations again). */
bool rq_wait_short(const struct rq *q);
/* Whether the last rq_wait failed with the connection rather than a shortfall. */
bool rq_wait_lost(const struct rq *q);
/* While the last WAIT fell short: 0 when ROLE shows wait_replicas replicas connected (the write
 * may go ahead and WAIT), else -1 with q->err. 0 at once when there is no shortfall. */
int rq_wait_ready(struct rq *q, const char *what);
