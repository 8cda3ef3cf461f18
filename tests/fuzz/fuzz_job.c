/* libFuzzer target: arbitrary bytes as one job line through job_parse (worker/jobs/job.c), with job_opts
 * set as the worker sets them (a max_job_bytes limit, a templates hook), then through the result
 * writer (worker/jobs/result.c) as the worker answers that line. Built with clang
 * -fsanitize=fuzzer,address,undefined by tests/fuzz/CMakeLists.txt; any crash, leak, sanitizer
 * report or broken invariant (a message on stderr, then abort) fails the ctest `fuzz_job`.
 *
 * Invariants, from worker/jobs/job.h and docs/JOBS.md:
 *   success: exactly one input of the form's kind; every sampling value inside its documented
 *            bounds; ids and custom_ids 1..256 bytes without control characters; the job's key is
 *            the one rq_job_id (queue/jobid.c) reads from the same bytes; stops and stop ids
 *            within their limits; a messages job renders through the chat template; the completed
 *            result line is JSON that carries the id (custom_id) and the metadata back.
 *   failure: JOB_ERR_JSON, _TOO_LARGE (exactly when the line is over the limit) or _INVALID, with a
 *            non-empty message; the failed result line is JSON in the job's shape with that message
 *            and error code.
 *   always:  parsing the same bytes twice gives the same answer; job_free leaves nothing behind. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "queue/jobid.h"
#include "worker/jobs/job.h"
#include "worker/jobs/result.h"

#define MAX_JOB_BYTES 3072 /* queues.max_job_bytes here; the ctest lets inputs grow to 4096 */
#define TEMPLATE_NAME "summarize"
#define TEMPLATE_TEXT "Summarize {document} in {words} words. {{verbatim}}"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input as text for the report: printable ASCII as is, the rest escaped, at most ~600 bytes. */
static void print_input(const uint8_t *data, size_t size)
{
    fprintf(stderr, "input (%zu bytes): ", size);
    for (size_t i = 0; i < size && i < 600; i++)
        if (data[i] >= 0x20 && data[i] < 0x7f && data[i] != '\\')
            fputc(data[i], stderr);
        else
            fprintf(stderr, "\\x%02x", data[i]);
    fputc('\n', stderr);
}

static const uint8_t *cur_data;
static size_t cur_size;

/* A broken invariant: says which, with the input, and aborts so libFuzzer saves the input. */
static void broken(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void broken(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz_job: invariant broken: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    print_input(cur_data, cur_size);
    abort();
}

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            broken(__VA_ARGS__);                                                                             \
    } while (0)

/* The config's templates section: one template, as cfg_template_find answers. */
static const char *find_template(void *ctx, const char *name)
{
    CHECK(ctx == (void *)&find_template, "template_find got a context that is not job_opts.template_ctx");
    CHECK(name && name[0], "template_find called with an empty name");
    return strcmp(name, TEMPLATE_NAME) == 0 ? TEMPLATE_TEXT : NULL;
}

static void check_id(const char *id, size_t max)
{
    size_t n = strlen(id);
    CHECK(n >= 1 && n <= max, "id of %zu bytes", n);
    for (size_t i = 0; i < n; i++)
        CHECK((unsigned char)id[i] >= 0x20 && id[i] != 0x7f, "id with a control character at byte %zu", i);
}

static void check_sampling(const struct job *j)
{
    const struct sampling_params *sp = &j->sp;
    CHECK(sp->temperature == 0 || (sp->temperature >= 1e-5f && sp->temperature <= 100),
          "temperature %g outside {0} and [1e-5, 100]", sp->temperature);
    CHECK(sp->top_p > 0 && sp->top_p <= 1, "top_p %g outside (0, 1]", sp->top_p);
    CHECK(sp->top_k >= 0, "top_k %d < 0", sp->top_k);
    CHECK(sp->min_p >= 0 && sp->min_p <= 1, "min_p %g outside [0, 1]", sp->min_p);
    CHECK(sp->repetition_penalty > 0 && isfinite(sp->repetition_penalty),
          "repetition_penalty %g not in (0, inf)", sp->repetition_penalty);
    CHECK(sp->presence_penalty >= -2 && sp->presence_penalty <= 2, "presence_penalty %g outside [-2, 2]",
          sp->presence_penalty);
    CHECK(sp->frequency_penalty >= -2 && sp->frequency_penalty <= 2, "frequency_penalty %g outside [-2, 2]",
          sp->frequency_penalty);
    CHECK(sp->logprobs >= -1 && sp->logprobs <= SAMPLING_MAX_LOGPROBS, "logprobs %d outside [-1, %d]",
          sp->logprobs, SAMPLING_MAX_LOGPROBS);
    CHECK(j->has_seed || sp->seed == 0, "a seed without has_seed");
    CHECK(j->max_tokens >= 1, "max_tokens %d < 1", j->max_tokens);
    CHECK(j->min_tokens >= 0 && j->min_tokens <= j->max_tokens, "min_tokens %d outside [0, max_tokens %d]",
          j->min_tokens, j->max_tokens);
    CHECK(j->n_stop >= 0 && j->n_stop <= JOB_MAX_STOP, "%d stop strings", j->n_stop);
    CHECK(j->n_stop == 0 || j->stop, "n_stop %d without stop", j->n_stop);
    for (int i = 0; i < j->n_stop; i++) {
        CHECK(j->stop[i], "stop[%d] is NULL", i);
        size_t n = strlen(j->stop[i]);
        CHECK(n >= 1 && n <= JOB_MAX_STOP_BYTES, "stop[%d] of %zu bytes", i, n);
    }
    CHECK(j->n_stop_ids >= 0 && j->n_stop_ids <= JOB_MAX_STOP_IDS, "%d stop token ids", j->n_stop_ids);
    CHECK(j->n_stop_ids == 0 || j->stop_ids, "n_stop_ids %d without stop_ids", j->n_stop_ids);
    for (int i = 0; i < j->n_stop_ids; i++)
        CHECK(j->stop_ids[i] >= 0, "stop_token_ids[%d] = %d", i, (int)j->stop_ids[i]);
    CHECK(!j->metadata || json_is_object(j->metadata), "metadata that is not an object");
}

/* Exactly one input, the kind the form allows, and a messages job's messages have the shape the chat template
 * gets. */
static void check_input(const struct job *j)
{
    int inputs = (j->prompt != NULL) + (j->prompt_ids != NULL) + (j->messages != NULL);
    CHECK(inputs == 1, "%d inputs set (prompt %d, prompt_ids %d, messages %d)", inputs, j->prompt != NULL,
          j->prompt_ids != NULL, j->messages != NULL);
    if (j->form == JOB_FORM_CHAT)
        CHECK(j->messages, "a chat completions job without messages");
    if (j->form == JOB_FORM_COMPLETION)
        CHECK(!j->messages, "a completions job with messages");
    if (j->prompt)
        CHECK(j->prompt[0], "an empty prompt");
    if (j->prompt_ids) {
        CHECK(j->n_prompt_ids >= 1, "%d prompt ids", j->n_prompt_ids);
        for (int i = 0; i < j->n_prompt_ids; i++)
            CHECK(j->prompt_ids[i] >= 0, "prompt id %d = %d", i, (int)j->prompt_ids[i]);
    } else {
        CHECK(j->n_prompt_ids == 0, "n_prompt_ids %d without prompt_ids", j->n_prompt_ids);
    }
    if (!j->messages) {
        CHECK(!j->tools && !j->documents && !j->chat_kwargs, "chat template inputs without messages");
        return;
    }
    CHECK(json_is_array(j->messages) && json_array_size(j->messages) >= 1, "messages: not a non-empty list");
    for (size_t i = 0; i < json_array_size(j->messages); i++) {
        json_t *m = json_array_get(j->messages, i);
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        CHECK(json_is_string(role) && json_string_length(role) > 0 &&
                  strcmp(json_string_value(role), "developer"),
              "messages[%zu].role not a normalised role", i);
        CHECK(json_is_string(content) || json_is_array(content) ||
                  (json_is_null(content) && !strcmp(json_string_value(role), "assistant")),
              "messages[%zu].content of a wrong type", i);
    }
    CHECK(!j->tools || (json_is_array(j->tools) && json_array_size(j->tools) > 0),
          "tools: not a non-empty list");
    CHECK(!j->chat_kwargs ||
              (json_is_object(j->chat_kwargs) && !json_object_get(j->chat_kwargs, "enable_thinking")),
          "chat_template_kwargs kept enable_thinking");
}

static void check_success(const struct job *j)
{
    CHECK(j->form == JOB_FORM_LLMQ || j->form == JOB_FORM_CHAT || j->form == JOB_FORM_COMPLETION, "form %d",
          (int)j->form);
    if (j->form != JOB_FORM_LLMQ)
        CHECK(j->id && j->custom_id, "an OpenAI line without custom_id");
    if (j->id)
        check_id(j->id, j->form == JOB_FORM_LLMQ ? JOB_MAX_ID_BYTES : RQ_ID_MAX);
    if (j->custom_id)
        check_id(j->custom_id, JOB_MAX_ID_BYTES);
    CHECK(!j->id_generated, "id_generated before job_assign_id");
    check_input(j);
    check_sampling(j);
    json_t *params = job_params_json(j);
    CHECK(json_is_object(params), "job_params_json did not give an object");
    json_decref(params);
}

/* Writes the worker's result line for the job and reads it back: JSON of the right shape with the
 * job's id (custom_id), the metadata, and for a failure the message and error code. */
static void check_result(const struct job *j, int rc, const char *err)
{
    static const int32_t ids[2] = {7, 8};
    struct res_output ok = {.finish = FINISH_STOP,
                            .text = "done",
                            .text_len = 4,
                            .prompt_tokens = 2,
                            .completion_tokens = 2,
                            .prompt_ids = ids,
                            .token_ids = ids,
                            .created = 1};
    struct res_output o = rc ? res_failed(rc, err) : ok;
    char *line = res_line(j, &o, NULL, NULL);
    CHECK(line, "res_line gave NULL");
    CHECK(!strchr(line, '\n'), "a result line with a newline");
    json_error_t jerr;
    json_t *r = json_loads(line, JSON_REJECT_DUPLICATES, &jerr);
    CHECK(json_is_object(r), "the result line is not a JSON object: %s (%s)", jerr.text, line);
    json_t *msg = json_string(err); /* NULL when err is not valid UTF-8 (the writer then repairs it) */
    if (j->form == JOB_FORM_LLMQ) {
        CHECK(json_is_string(json_object_get(r, "id")), "llmq result without an id: %s", line);
        CHECK(!strcmp(json_string_value(json_object_get(r, "id")), j->id), "llmq result id differs: %s",
              line);
        const char *status = json_string_value(json_object_get(r, "status"));
        CHECK(status && !strcmp(status, rc ? "failed" : "completed"), "llmq result status: %s", line);
        if (rc) {
            CHECK(json_is_string(json_object_get(r, "error")), "failed llmq result without error: %s", line);
            CHECK(!msg || json_equal(json_object_get(r, "error"), msg), "error message differs: %s", line);
        }
    } else {
        json_t *cid = json_object_get(r, "custom_id");
        CHECK(j->custom_id ? json_is_string(cid) && !strcmp(json_string_value(cid), j->custom_id)
                           : json_is_null(cid),
              "OpenAI result custom_id differs: %s", line);
        json_t *e = json_object_get(r, "error");
        if (rc) {
            CHECK(json_is_null(json_object_get(r, "response")), "failed OpenAI result with a response: %s",
                  line);
            const char *code = json_string_value(json_object_get(e, "code"));
            CHECK(code && !strcmp(code, job_error_code(rc)), "error.code differs: %s", line);
            CHECK(json_is_string(json_object_get(e, "message")), "error.message missing: %s", line);
            CHECK(!msg || json_equal(json_object_get(e, "message"), msg), "error.message differs: %s", line);
        } else {
            CHECK(json_is_null(e) && json_is_object(json_object_get(r, "response")), "OpenAI result: %s",
                  line);
        }
    }
    if (j->form == JOB_FORM_LLMQ) {
        json_t *meta = json_object_get(r, "metadata");
        CHECK(j->metadata ? json_equal(meta, j->metadata) : !meta, "metadata not echoed: %s", line);
    }
    json_decref(msg);
    json_decref(r);
    free(line);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cur_data = data;
    cur_size = size;
    /* a copy of exactly `size` bytes without a terminating NUL, so ASan catches a read past it */
    char *line = malloc(size ? size : 1);
    if (!line)
        return 0;
    memcpy(line, data, size);

    struct job_opts o = job_opts_default(); /* as worker.c and cmd_run.c set them */
    o.max_bytes = MAX_JOB_BYTES;
    o.template_find = find_template;
    o.template_ctx = (void *)&find_template;

    struct job j, again;
    char err[512], err2[512];
    memset(err, 'x', sizeof err);
    int rc = job_parse(line, size, &o, &j, err, sizeof err);
    CHECK(memchr(err, 0, sizeof err), "err is not NUL-terminated");

    /* the same bytes give the same answer */
    int rc2 = job_parse(line, size, &o, &again, err2, sizeof err2);
    CHECK(rc2 == rc && !strcmp(err, err2), "two parses differ: %d '%s' then %d '%s'", rc, err, rc2, err2);
    CHECK(again.form == j.form && (!again.id) == (!j.id) && (!j.id || !strcmp(again.id, j.id)),
          "two parses differ in form or id");
    job_free(&again);
    CHECK(!again.id && !again.prompt && !again.messages && !again.stop && !again.metadata,
          "job_free left pointers behind");

    if (rc == JOB_OK) {
        check_success(&j);
        char key[RQ_ID_MAX + 1];
        enum rq_idstate st = rq_job_id(line, size, MAX_JOB_BYTES, key);
        CHECK(j.id ? st == RQ_ID_FOUND && !strcmp(key, j.id) : st == RQ_ID_MISSING,
              "the parser's key '%s' and rq_job_id's '%s' (state %d) differ", j.id ? j.id : "(none)", key,
              (int)st);
    } else {
        CHECK(rc == JOB_ERR_JSON || rc == JOB_ERR_TOO_LARGE || rc == JOB_ERR_INVALID ||
                  rc == JOB_ERR_RESPONSE_FORMAT,
              "job_parse returned %d", rc);
        CHECK(err[0], "job_parse failed (%d) without a message", rc);
        CHECK(job_error_code(rc)[0], "no error code for %d", rc);
        CHECK(j.form == JOB_FORM_LLMQ || j.form == JOB_FORM_CHAT || j.form == JOB_FORM_COMPLETION, "form %d",
              (int)j.form);
        if (j.id)
            check_id(j.id, RQ_ID_MAX);
    }
    CHECK((rc == JOB_ERR_TOO_LARGE) == (size > MAX_JOB_BYTES), "a %zu-byte line (limit %d) gave %d", size,
          MAX_JOB_BYTES, rc);

    /* the worker names llmq jobs that have no id before it answers them */
    if (j.form == JOB_FORM_LLMQ) {
        bool had = j.id != NULL;
        CHECK(job_assign_id(&j) == 0 && j.id && j.id_generated == !had, "job_assign_id");
        CHECK(had || strlen(j.id) == JOB_ID_LEN, "a generated id of %zu characters", strlen(j.id));
    }
    check_result(&j, rc, err);

    job_free(&j);
    free(line);
    return 0;
}
