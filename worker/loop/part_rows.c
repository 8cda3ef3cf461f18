/* See part_rows.h. */
#include "worker/loop/part_rows.h"

#include <stdlib.h>
#include <string.h>

#include "engine/util/array.h"
#include "worker/jobs/summarize.h"

static void row_free(struct wk_part_row *r)
{
    free(r->job_id);
    free(r->plan);
    free(r->output);
}

int wk_part_rows_add(struct wk_part_rows *q, struct wk_job *j, struct sum_part *p, const char *job_id,
                     const char *plan, const char *worker_id, double now_wall)
{
    size_t cap = q->cap;
    if (array_reserve(&q->rows, &q->cap, q->n + 1, sizeof *q->rows, 64))
        return -1;
    if (q->cap != cap && (array_resize(&q->batch, q->cap, sizeof *q->batch) ||
                          array_resize(&q->done, q->cap, sizeof *q->done)))
        return -1;
    struct wk_part_row *r = &q->rows[q->n];
    memset(r, 0, sizeof *r);
    r->job = j;
    r->part = p;
    r->job_id = strdup(job_id);
    r->plan = strdup(plan);
    r->output = malloc(p->output_len + 1);
    if (!r->job_id || !r->plan || !r->output) {
        row_free(r);
        return -1;
    }
    memcpy(r->output, p->output ? p->output : "", p->output_len);
    r->output[p->output_len] = 0;
    r->row = (struct db_part){
        .job_id = r->job_id,
        .level = p->level,
        .part = p->index,
        .plan = r->plan,
        .first = p->first,
        .last = p->last,
        .doc_start = (int64_t)p->doc_start,
        .doc_end = (int64_t)p->doc_end,
        .output = r->output,
        .output_len = p->output_len,
        .prompt_tokens = p->prompt_tokens,
        .completion_tokens = p->completion_tokens,
        .finish_reason = finish_reason_name(p->finish),
        .worker_id = worker_id,
        .created_at = now_wall,
    };
    q->n++;
    return 0;
}

const struct db_part *wk_part_rows_send(struct wk_part_rows *q, size_t max, size_t *n)
{
    size_t k = q->n < max ? q->n : max;
    for (size_t i = 0; i < k; i++)
        q->batch[i] = q->rows[i].row;
    q->n_sent = k;
    *n = k;
    return q->batch;
}

void wk_part_rows_done(struct wk_part_rows *q, bool committed,
                       void (*fn)(void *ctx, struct wk_job *job, struct sum_part *part), void *ctx)
{
    size_t k = q->n_sent;
    q->n_sent = 0;
    if (!committed || k == 0)
        return; /* they stay first in the queue, for the next batch */
    /* off the queue before fn runs (q->done has room: it grows with q->rows) */
    struct wk_part_row *done = q->done;
    memcpy(done, q->rows, k * sizeof *done);
    memmove(q->rows, q->rows + k, (q->n - k) * sizeof *q->rows);
    q->n -= k;
    for (size_t i = 0; i < k; i++)
        if (done[i].job)
            fn(ctx, done[i].job, done[i].part);
    for (size_t i = 0; i < k; i++)
        row_free(&done[i]);
}

void wk_part_rows_forget(struct wk_part_rows *q, const struct wk_job *j)
{
    for (size_t i = 0; i < q->n; i++)
        if (q->rows[i].job == j)
            q->rows[i].job = NULL;
}

size_t wk_part_rows_waiting(const struct wk_part_rows *q)
{
    return q->n - q->n_sent;
}

void wk_part_rows_free(struct wk_part_rows *q)
{
    for (size_t i = 0; i < q->n; i++)
        row_free(&q->rows[i]);
    free(q->rows);
    free(q->batch);
    free(q->done);
    memset(q, 0, sizeof *q);
}
