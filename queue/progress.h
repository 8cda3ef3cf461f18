/* Progress of running jobs into their hashes (<p>:job:<id>: progress, completion_tokens,
 * prompt_tokens, first_token_at; parts_done, parts_total and level for a summary job) and onto <p>:events, pipelined: one round trip for the whole
 * batch, however many jobs (a worker calls it every few generated tokens, not per token). */
#pragma once

struct rq;

struct rq_progress {
    const char *id;        /* the job's id (borrowed); NULL or "" = skipped */
    double progress;       /* 0..1; < 0 = leave as it is */
    int prompt_tokens;     /* < 0 = leave as it is */
    int completion_tokens; /* < 0 = leave as it is */
    double first_token_at; /* unix seconds; 0 = leave as it is */
    /* a map-reduce summary job: its parts done and in all (an estimate until the last level is
     * made), and the level that runs; parts_total <= 0 = not such a job (left out) */
    int parts_done, parts_total, level;
};

/* Writes p[0..n): per job one HSET and one XADD (MAXLEN ~ events_maxlen), all in one pipeline.
 * 0, or -1 (rq_error): the connection failed (nothing is known to be written), or some reply
 * was an error (the others were written; a job hash or events stream of the wrong type is named
 * in a BADKEY error, queue/badkey.h). */
int rq_progress(struct rq *q, const struct rq_progress *p, int n);
