/* See bench.h. */
#include "queue/bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/util/mono.h"
#include "queue/ack.h"
#include "queue/fetch.h"
#include "queue/progress.h"
#include "queue/push.h"
#include "queue/rq.h"

int rq_bench(struct rq *q, const char *queue, int jobs, int rounds, int job_bytes, struct rq_bench *out)
{
    memset(out, 0, sizeof *out);
    if (jobs < 1 || rounds < 1)
        return rq_fail(q, "bench: jobs and rounds must be at least 1");
    if (job_bytes < 64)
        job_bytes = 64;
    out->jobs = jobs;
    out->rounds = rounds;
    out->best_round_ms = 1e300;
    char *raw = malloc((size_t)jobs * ((size_t)job_bytes + 1));
    char(*ids)[40] = malloc((size_t)jobs * sizeof *ids);
    struct rq_push_item *items = malloc((size_t)jobs * sizeof *items);
    struct rq_job *got = calloc((size_t)jobs, sizeof *got);
    struct rq_progress *pr = malloc((size_t)jobs * sizeof *pr);
    struct rq_result *res = malloc((size_t)jobs * sizeof *res);
    int rc = 0;
    if (!raw || !ids || !items || !got || !pr || !res) {
        rc = rq_fail(q, "bench: out of memory");
        goto out;
    }
    for (int r = 0; r < rounds && rc == 0; r++) {
        for (int i = 0; i < jobs; i++) {
            char *s = raw + (size_t)i * ((size_t)job_bytes + 1);
            snprintf(ids[i], sizeof ids[i], "bench-%d-%d", r, i);
            int n =
                snprintf(s, (size_t)job_bytes + 1, "{\"id\":\"%s\",\"max_tokens\":1,\"prompt\":\"", ids[i]);
            while (n < job_bytes - 2) {
                s[n] = (char)('a' + n % 26);
                n++;
            }
            s[n++] = '"';
            s[n++] = '}';
            s[n] = 0;
            items[i] = (struct rq_push_item){s, (size_t)n, ids[i], NULL};
        }
        double t0 = llmq_mono_ms();
        if (rq_push(q, queue, NULL, RQ_PUSH_FORCE, items, jobs)) {
            rc = -1;
            break;
        }
        double t1 = llmq_mono_ms();
        unsigned long long rt0 = q->cmd.round_trips;
        int n = 0;
        struct rq_source src = {queue, jobs};
        while (n < jobs) {
            src.max = jobs - n;
            int k = rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, jobs - n, 0, got + n);
            if (k <= 0) {
                rc = k < 0 ? -1 : rq_fail(q, "bench: the queue ran dry after %d of %d jobs", n, jobs);
                break;
            }
            n += k;
        }
        if (rc)
            break;
        double t2 = llmq_mono_ms();
        for (int i = 0; i < n; i++)
            pr[i] = (struct rq_progress){.id = got[i].id, .progress = 0.5, .prompt_tokens = 100, .completion_tokens = 1, .first_token_at = t2 / 1e3};
        if (rq_progress(q, pr, n)) {
            rc = -1;
            break;
        }
        double t3 = llmq_mono_ms();
        for (int i = 0; i < n; i++)
            res[i] = (struct rq_result){.job = &got[i],
                                        .status = RQ_STATUS_COMPLETED,
                                        .prompt_tokens = 100,
                                        .completion_tokens = 1,
                                        .finish_reason = "length"};
        if (rq_ack(q, res, n) != n) {
            rc = rq_fail(q, "bench: ack: %s", rq_error(q));
            break;
        }
        double t4 = llmq_mono_ms();
        out->round_trips += q->cmd.round_trips - rt0;
        for (int i = 0; i < n; i++)
            rq_job_free(&got[i]);
        out->push_ms += t1 - t0;
        out->fetch_ms += t2 - t1;
        out->progress_ms += t3 - t2;
        out->ack_ms += t4 - t3;
        if (t4 - t1 < out->best_round_ms)
            out->best_round_ms = t4 - t1;
    }
    if (rc == 0) {
        out->push_ms /= rounds;
        out->fetch_ms /= rounds;
        out->progress_ms /= rounds;
        out->ack_ms /= rounds;
        out->round_ms = out->fetch_ms + out->progress_ms + out->ack_ms;
        out->jobs_per_s = out->round_ms > 0 ? jobs / (out->round_ms / 1e3) : 0;
        out->round_trips /= (unsigned long long)rounds;
    }
out:
    if (got)
        for (int i = 0; i < jobs; i++)
            rq_job_free(&got[i]);
    free(raw);
    free(ids);
    free(items);
    free(got);
    free(pr);
    free(res);
    return rc;
}
