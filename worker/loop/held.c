/* See held.h. */
#include "worker/loop/held.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer.h"
#include "engine/util/json_exact.h"
#include "worker/jobs/answer_json.h"
#include "worker/jobs/result.h"
#include "worker/jobs/summarize.h"
#include "worker/store/result_line.h"

struct wk_job *wk_job_new(struct rq_job *rj, double now_mono, double now_wall)
{
    struct wk_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->rj = *rj;
    memset(rj, 0, sizeof *rj);
    j->state = -1;
    j->run.owner = j;
    j->fetched_mono = now_mono;
    j->started_at = now_wall;
    j->created_at = NAN;
    j->first_token_at = NAN;
    j->ttft_ms = j->latency_ms = NAN;
    j->status = RQ_STATUS_FAILED;
    j->batch = db_batch_empty();
    return j;
}

void wk_job_free(struct wk_job *j)
{
    if (!j)
        return;
    rq_job_free(&j->rj);
    sum_free(j->sum); /* before the job it borrows from */
    job_free(&j->job);
    free(j->output);
    free(j->reasoning);
    free(j->error);
    free(j->params);
    free(j->metadata);
    free(j->result);
    free(j->output_json);
    free(j->hash_result);
    free((char *)j->batch.id);
    free((char *)j->batch.input);
    free((char *)j->batch.state);
    free(j);
}

const char *wk_job_id(const struct wk_job *j)
{
    if (j->job.id && j->job.id[0])
        return j->job.id;
    if (j->rj.id[0])
        return j->rj.id;
    return j->row_id;
}

static const char *token_bytes(const void *ctx, int32_t id, size_t *len)
{
    return tok_token_bytes((const struct tok *)ctx, id, len);
}

static char *dump(const json_t *v)
{
    return v ? json_dumps_exact(v, JSON_COMPACT) : NULL;
}

void wk_job_admitted(struct wk_job *j)
{
    job_drop_input(&j->job);
    if (j->job.metadata && j->rj.len > WK_BIG_JOB_BYTES) {
        json_decref(j->job.metadata);
        j->job.metadata = NULL;
        j->metadata_dropped = true;
    }
}

/* What every finished job records: an id to write under, params, metadata. */
static void common(struct wk_job *j, double now_wall)
{
    if (j->metadata_dropped && !j->job.metadata) /* for the row and the result line */
        j->job.metadata = job_metadata_of(j->rj.raw, j->rj.len);
    if (!j->job.id && !j->rj.id[0] && !j->row_id[0]) {
        uuid7(j->row_id);
        if (j->job.form == JOB_FORM_LLMQ && (j->job.id = strdup(j->row_id)) != NULL) /* the result names it */
            j->job.id_generated = true;
    }
    if (j->parsed && !j->params) {
        json_t *p = job_params_json(&j->job);
        j->params = dump(p);
        json_decref(p);
    }
    if (j->job.metadata && !j->metadata)
        j->metadata = dump(j->job.metadata);
    j->finished_at = now_wall;
}

/* Once the row's metadata text and the result line are made, the job's parsed metadata is not
 * read again: a job with megabytes of metadata does not keep a third copy until its ack. */
static void drop_metadata(struct wk_job *j)
{
    if (j->metadata && j->result) {
        json_decref(j->job.metadata);
        j->job.metadata = NULL;
    }
}

static void set_error(struct wk_job *j, int rc, const char *err)
{
    free(j->error);
    j->error = strdup(err && *err ? err : "unknown error");
    j->error_rc = rc;
}

int wk_job_finish_failed(struct wk_job *j, const struct wk_ctx *c, int rc, const char *err, double now_wall)
{
    common(j, now_wall);
    j->status = RQ_STATUS_FAILED;
    j->finish_reason = NULL;
    j->after = WK_AFTER_DEAD;
    set_error(j, rc, err);
    free(j->output);
    j->output = NULL;
    j->output_len = 0;
    free(j->reasoning);
    j->reasoning = NULL;
    j->reasoning_len = 0;
    j->reasoning_tokens = -1;
    free(j->output_json);
    j->output_json = NULL;
    struct res_output o = res_failed(rc, j->error);
    o.model = c->model_name;
    o.prompt_tokens = j->prompt_tokens;
    free(j->result);
    j->result = res_line(&j->job, &o, NULL, NULL);
    drop_metadata(j);
    if (isnan(j->latency_ms))
        j->latency_ms = (now_wall - j->started_at) * 1e3;
    return j->error ? 0 : -1;
}

int wk_job_finish_cancelled(struct wk_job *j, const struct wk_ctx *c, double now_wall)
{
    common(j, now_wall);
    j->status = RQ_STATUS_CANCELLED;
    j->finish_reason = finish_reason_name(FINISH_CANCELLED);
    j->after = WK_AFTER_ACK;
    j->output = strdup("");
    j->output_len = 0;
    struct res_output o = {.finish = FINISH_CANCELLED, .text = "", .model = c->model_name};
    j->result = res_line(&j->job, &o, NULL, NULL);
    drop_metadata(j);
    j->latency_ms = (now_wall - j->started_at) * 1e3;
    return j->output ? 0 : -1;
}

/* The end of a job that ran (o->finish STOP, LENGTH, CANCELLED or TIMEOUT; o->text its answer):
 * status, output, the result line and a JSON answer; the reasoning is the caller's. A timeout is
 * final (another attempt would take as long): failed, acknowledged, not dead-lettered, with its
 * text so far. 0, or -1 out of memory (the job is then failed with that message). */
static int finish_output(struct wk_job *j, const struct wk_ctx *c, struct res_output *o, double now_wall)
{
    j->status = o->finish == FINISH_CANCELLED ? RQ_STATUS_CANCELLED
                : o->finish == FINISH_TIMEOUT ? RQ_STATUS_FAILED
                                              : RQ_STATUS_COMPLETED;
    j->finish_reason = finish_reason_name(o->finish);
    j->after = WK_AFTER_ACK;
    if (o->finish == FINISH_TIMEOUT) {
        char why[160];
        job_timeout_error(&j->job, o->completion_tokens, why, sizeof why);
        set_error(j, JOB_ERR_TIMEOUT, why);
    }
    const char *text = o->text ? o->text : "";
    j->output = malloc(o->text_len + 1);
    if (j->output) {
        memcpy(j->output, text, o->text_len);
        j->output[o->text_len] = 0;
        j->output_len = o->text_len;
    }
    o->error = j->error;
    o->error_rc = j->error_rc;
    o->model = c->model_name;
    o->created = (int64_t)now_wall;
    j->result = res_line(&j->job, o, c->tok ? token_bytes : NULL, c->tok);
    bool incomplete;
    json_t *answer = answer_json(j->job.constraint.kind, text, o->text_len, o->finish, &incomplete);
    free(j->output_json);
    /* the row's copy is the text itself, which parsed as one JSON value: SQLite stores it minified
     * with its numbers as written (db.h) */
    j->output_json = answer ? strndup(text, o->text_len) : NULL;
    json_decref(answer);
    if (!j->output || !j->result || (o->finish == FINISH_TIMEOUT && !j->error) ||
        (o->has_reasoning && !j->reasoning) || (answer && !j->output_json)) {
        wk_job_finish_failed(j, c, JOB_ERR_INTERNAL, "out of memory while storing the result",
                             j->finished_at);
        return -1;
    }
    drop_metadata(j);
    return 0;
}

int wk_job_finish_seq(struct wk_job *j, const struct wk_ctx *c, const struct engine_seq *s, double now_mono,
                      double now_wall)
{
    common(j, now_wall);
    j->prompt_tokens = s->n_prompt;
    j->completion_tokens = s->n_output;
    double fin = s->t_finished > 0 ? s->t_finished : now_mono;
    if (s->t_first_token > 0) {
        j->first_token_at = now_wall - (now_mono - s->t_first_token);
        j->ttft_ms = (s->t_first_token - j->fetched_mono) * 1e3;
    }
    j->latency_ms = (fin - j->fetched_mono) * 1e3;
    j->finished_at = now_wall - (now_mono - fin);
    if (s->finish == FINISH_ERROR) {
        const char *why = s->error[0] ? s->error : "the engine failed";
        wk_job_finish_failed(j, c, JOB_ERR_ENGINE, why, j->finished_at);
        return 0;
    }
    j->reasoning_tokens = -1;
    if (s->has_reasoning) {
        j->reasoning = malloc(s->reasoning_len + 1);
        if (j->reasoning) {
            memcpy(j->reasoning, s->reasoning, s->reasoning_len + 1);
            j->reasoning_len = s->reasoning_len;
            j->reasoning_tokens = s->n_reasoning_tokens;
        }
    }
    struct res_output o = {
        .finish = s->finish,
        .text = s->text,
        .text_len = s->text_len,
        .reasoning = s->reasoning,
        .reasoning_len = s->reasoning_len,
        .has_reasoning = s->has_reasoning,
        .reasoning_tokens = s->n_reasoning_tokens,
        .prompt_tokens = s->n_prompt,
        .completion_tokens = s->n_output,
        .truncated_tokens = j->truncated_tokens,
        .prompt_ids = s->tokens,
        .token_ids = s->tokens + s->n_prompt,
        .logprobs = s->logprobs,
    };
    return finish_output(j, c, &o, now_wall);
}

int wk_job_finish_summary(struct wk_job *j, const struct wk_ctx *c, enum finish_reason how, int error_rc,
                          const char *error, double now_mono, double now_wall)
{
    common(j, now_wall);
    struct res_output o = {0};
    sum_result(j->sum, how, &o);
    j->prompt_tokens = o.prompt_tokens;
    j->completion_tokens = o.completion_tokens;
    j->latency_ms = (now_mono - j->fetched_mono) * 1e3;
    j->reasoning_tokens = -1;
    if (how == FINISH_ERROR) {
        wk_job_finish_failed(j, c, error_rc ? error_rc : JOB_ERR_ENGINE, error ? error : "the engine failed",
                             now_wall);
        return 0;
    }
    return finish_output(j, c, &o, now_wall);
}

const char *wk_job_error_code(const struct wk_job *j)
{
    if (j->status == RQ_STATUS_COMPLETED)
        return NULL;
    if (j->status == RQ_STATUS_CANCELLED)
        return job_error_code(JOB_ERR_CANCELLED);
    return job_error_code(j->error_rc ? j->error_rc : JOB_ERR_ENGINE);
}

int wk_job_set_batch(struct wk_job *j, const struct db_batch *b)
{
    free((char *)j->batch.id);
    free((char *)j->batch.input);
    free((char *)j->batch.state);
    j->batch = *b;
    j->batch.id = b->id ? strdup(b->id) : NULL;
    j->batch.input = b->input ? strdup(b->input) : NULL;
    j->batch.state = b->state ? strdup(b->state) : NULL;
    return (b->id && !j->batch.id) || (b->input && !j->batch.input) || (b->state && !j->batch.state) ? -1 : 0;
}

void wk_job_row(const struct wk_job *j, const struct wk_ctx *c, struct db_result *r)
{
    *r = db_result_empty();
    r->id = wk_job_id(j);
    bool openai = j->job.form != JOB_FORM_LLMQ;
    r->custom_id = openai ? j->job.custom_id : NULL;
    r->batch_id = j->job.batch_id ? j->job.batch_id : j->rj.batch_id[0] ? j->rj.batch_id : NULL;
    if (r->batch_id && j->batch.id && !strcmp(j->batch.id, r->batch_id))
        r->batch = &j->batch;
    r->request = j->rj.raw;
    r->request_len = j->rj.len;
    r->error_code = wk_job_error_code(j);
    r->request_form = openai ? DB_FORM_OPENAI : DB_FORM_LLMQ;
    r->queue = j->rj.queue[0] ? j->rj.queue : NULL;
    r->status = j->status == RQ_STATUS_COMPLETED   ? DB_COMPLETED
                : j->status == RQ_STATUS_CANCELLED ? DB_CANCELLED
                                                   : DB_FAILED;
    r->model = c->model_name;
    r->params = j->params;
    r->output = j->output;
    r->output_len = j->output_len;
    r->reasoning = j->reasoning;
    r->reasoning_len = j->reasoning_len;
    r->reasoning_tokens = j->reasoning ? j->reasoning_tokens : -1;
    r->finish_reason = j->finish_reason;
    r->prompt_tokens = j->prompt_tokens;
    r->completion_tokens = j->completion_tokens;
    r->error = j->error;
    r->attempts = j->rj.attempts > 0 ? j->rj.attempts : 1;
    r->worker_id = c->worker_id;
    r->created_at = j->created_at;
    r->started_at = j->started_at;
    r->first_token_at = j->first_token_at;
    r->finished_at = j->finished_at;
    r->ttft_ms = j->ttft_ms;
    r->latency_ms = j->latency_ms;
    if (!isnan(j->created_at) && j->started_at >= j->created_at)
        r->queue_ms = (j->started_at - j->created_at) * 1e3;
    r->metadata = j->metadata;
    r->result = j->result;
    r->output_json = j->output_json;
}

void wk_job_degrade(struct wk_job *j)
{
    free(j->params);
    free(j->metadata);
    free(j->result);
    free(j->output_json);
    j->params = j->metadata = j->result = j->output_json = NULL;
    j->degraded = true;
}

const char *wk_job_hash_result(struct wk_job *j, const struct wk_ctx *c, int64_t max_bytes)
{
    free(j->hash_result);
    j->hash_result = NULL;
    struct db_result row;
    wk_job_row(j, c, &row);
    char *built;
    const char *line = db_result_line(&row, &built);
    if (!line)
        return NULL;
    size_t n = strlen(line);
    if ((int64_t)n <= max_bytes) {
        j->hash_result = built; /* NULL when the line is j->result itself */
        return line;
    }
    free(built);
    char marker[96];
    snprintf(marker, sizeof marker, "{\"truncated\":true,\"in\":\"sqlite\",\"bytes\":%zu}", n);
    j->hash_result = strdup(marker);
    return j->hash_result;
}
