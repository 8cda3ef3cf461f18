/* A map-reduce summary job as it runs (docs/JOBS.md "Long documents"): a "document" longer than any
 * context, summarized chunk by chunk (the map level), then the partial summaries summarized
 * together, level after level, while they do not fit one context (a tree, not a chain), until one
 * summary is left: the job's answer.
 *
 *   level 0   one part per chunk of the document (worker/jobs/chunker.h), the map template
 *   level n   one part per group of consecutive parts of level n-1 (worker/jobs/summary_tree.h,
 *             as many as fit one context), the reduce template with their summaries joined
 *   the root  the one part of the last level (level 0 when the document is one chunk): it gets the
 *             job's max_tokens and its structured-output constraint; the others summarize.max_tokens
 *
 * Every part is a request the caller runs through the engine like any job (all parts of all
 * documents batch together, each in the lane its length asks for). A level starts once every part
 * of the level below is committed (sum_committed), so what a level reads is durable: a caller that
 * stores each finished part (SQLite job_parts) and gives them back with sum_restore after a crash
 * resumes where it was. The plan id (sum_plan_id) names what the parts depend on: the document, the
 * job's parameters and templates, the chunk sizes and the vocabulary; parts of another plan are not
 * reused.
 *
 * Usage (the worker):
 *
 *     struct sum_job *s;
 *     if (sum_open(&job, tok, ct, max_model_len, &s, err, sizeof err)) fail the job (rc, err);
 *     for each stored part of (job id, sum_plan_id(s)): sum_restore(s, ...);
 *     loop:
 *         struct sum_part *p;
 *         while ((p = sum_next(s))) { sum_prepare(s, p, &in, ...); engine_add(...); }
 *         a part finished:   sum_done(s, p, text, ...);   store it
 *         its row committed: sum_committed(s, p);        (may open the next level: sum_next again)
 *         the root finished: sum_finished(s) is true; its text is the answer (sum_root)
 *     sum_free(s);
 *
 * Not thread-safe; one sum_job per job. The job, tokenizer and template are borrowed and must
 * outlive it. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "worker/jobs/job.h"

struct chat_template;
struct tok;

#define SUM_MAX_LEVELS 32
#define SUM_PLAN_LEN 16 /* hex digits of a plan id */
#define SUM_SEP 2       /* tokens counted for the blank line between two summaries in a reduce step */

enum sum_state {
    SUM_TODO,      /* waiting for sum_next */
    SUM_RUNNING,   /* handed out by sum_next */
    SUM_DONE,      /* finished (sum_done), its row not yet committed */
    SUM_COMMITTED, /* its row is committed (sum_committed), or it was restored */
};

struct sum_part {
    int level, index;          /* its place: level, and its order in the level from 0 */
    int first, last;           /* level 0: its chunk's index (both); else the parts of level-1 it reads */
    size_t doc_start, doc_end; /* the bytes of the document it covers */
    bool root;                 /* its answer is the job's */
    enum sum_state state;
    bool restored; /* taken from a stored row, not computed here */
    char *output;  /* owned, once done: the summary (surrounding whitespace trimmed) */
    size_t output_len;
    int output_tokens; /* tokens of output encoded alone (how much room it takes in a reduce) */
    int prompt_tokens, completion_tokens;
    enum finish_reason finish;
    void *user; /* the caller's (the worker: its engine seq's record while it runs) */
};

struct sum_job;
struct grammar_cache;

/* What the user of an engine seq of a job points to (the worker's and `llmq run`'s): its owner (the
 * caller's record of the job) and, for a part of a summary job, the part (NULL: the job runs in
 * one piece). A part's is made by sum_start_parts and kept in sum_part.user while it runs. */
struct sum_run {
    void *owner;
    struct sum_part *part;
    struct engine_seq *seq; /* borrowed from the engine until engine_release */
};

/* How sum_start_parts adds parts to the engine. */
struct sum_start {
    struct engine *eng;
    struct grammar_cache *grammars; /* the root's grammar (the job's constraint), if any */
    void *owner;                    /* sum_run.owner */
    double deadline;                /* engine_request.deadline of every part (0 = none) */
    bool isolated;                  /* engine_request.isolated */
    /* the lane of a part with n_prompt prompt tokens and max_tokens; NULL: lane 0 */
    int (*lane)(void *ctx, int n_prompt, int max_tokens);
    void *lane_ctx;
};

/* Adds every part of s that waits (sum_next) to the engine: the request sum_prepare makes, with the
 * deadline, isolation and lane of st, and for the root the job's grammar; each part's user is a new
 * struct sum_run in sum_part.user. *started += how many. 0, or an enum job_error with err (the parts
 * added before it stay in the engine: sum_stop_parts). */
int sum_start_parts(struct sum_job *s, const struct sum_start *st, int *started, char *err, size_t errlen);

/* Stops every part of s in engine e: cancelled, its seq's user NULL (its end is released without
 * being told anyone), its sum_run freed. Returns how many. Accepts NULL s. */
int sum_stop_parts(struct sum_job *s, struct engine *e);

/* Plans job j (j->summarize set) for contexts of max_model_len tokens: sizes the chunks (the job's
 * summarize.chunk_tokens, else what max_model_len leaves after the map template and the output),
 * splits the document and makes level 0. Fails with JOB_ERR_CONTEXT when max_model_len leaves no
 * room for a chunk or for two summaries in a reduce step, JOB_ERR_INVALID for options that do not
 * fit (a chunk_tokens over that room, an overlap of half a chunk or more), JOB_ERR_TEMPLATE when the
 * chat template fails; the message says which sizes are at fault. ct may be NULL or have no template
 * (chat_template_present): each part's text then goes to the model as a plain prompt. 0 with *out (sum_free),
 * or an enum job_error with err. */
int sum_open(const struct job *j, const struct tok *tok, const struct chat_template *ct, int max_model_len,
             struct sum_job **out, char *err, size_t errlen);
void sum_free(struct sum_job *s);

/* The plan id: SUM_PLAN_LEN hex digits (borrowed, lives as long as s). */
const char *sum_plan_id(const struct sum_job *s);

/* A part committed earlier under this plan (a stored row): used as soon as its level exists when
 * that level has a part at (level, index) that reads the same inputs (first, last); ignored
 * otherwise. output is copied. 0, or -1 out of memory. */
int sum_restore(struct sum_job *s, int level, int index, int first, int last, const char *output, size_t len,
                int prompt_tokens, int completion_tokens, enum finish_reason finish);

/* The next part to run (marked SUM_RUNNING), in document order; NULL when none is waiting (the
 * level's other parts run, or wait to be committed). */
struct sum_part *sum_next(struct sum_job *s);

/* The request of part p, as job_prepare makes one for the job: its template rendered with the
 * job's vars and document (the chunk's text, or the summaries it reads joined by blank lines), part
 * (from 1), parts (in its level) and level, as one user message through the chat template; the job's
 * sampling, stops and chat_template_kwargs; max_tokens the root's or a part's. No grammar: the
 * caller attaches the job's to the root's request. in borrows from the job and from s. 0, or an
 * enum job_error with err. */
int sum_prepare(struct sum_job *s, const struct sum_part *p, struct job_input *in, char *err, size_t errlen);

/* Part p finished with text[0..len) (trimmed and copied) after prompt_tokens + completion_tokens:
 * SUM_DONE. 0, or -1 out of memory (nothing changed). */
int sum_done(struct sum_job *s, struct sum_part *p, const char *text, size_t len, int prompt_tokens,
             int completion_tokens, enum finish_reason finish);

/* Part p's row is committed: SUM_COMMITTED. When it was the last of its level, the next level is
 * made (its parts wait for sum_next). 0, or an enum job_error with err: the summaries do not
 * group (cannot happen with the sizes sum_open checked) or out of memory. */
int sum_committed(struct sum_job *s, struct sum_part *p, char *err, size_t errlen);

/* The root is done: the job is finished. */
bool sum_finished(const struct sum_job *s);
/* The root part once its level exists, else NULL. */
const struct sum_part *sum_root(const struct sum_job *s);

/* Every part of the levels made so far, level by level: n (the count) into *n. */
struct sum_part *sum_part_at(struct sum_job *s, int i);
int sum_n_parts(const struct sum_job *s);

/* What the job's result and progress report. */
struct sum_totals {
    int chunks;                       /* parts of level 0 */
    int64_t document_tokens;          /* the chunks' tokens summed (an overlap counts twice) */
    int chunk_tokens, overlap_tokens; /* the sizes the chunks were made with */
    int reduce_budget;                /* tokens a reduce step's summaries may take (SUM_SEP between two) */
    int depth;                        /* levels made so far (the tree's depth once finished) */
    int level;                        /* the level running now */
    int parts_done;                   /* parts done or committed (restored ones included) */
    int parts_total;       /* parts of the levels made so far, plus those the next levels will have at
                              most (an estimate until the last level exists) */
    int parts_restored;    /* parts taken from stored rows */
    int64_t prompt_tokens; /* summed over every part done (restored ones included) */
    int64_t completion_tokens;
    bool any_length; /* some part ended at its max_tokens */
};
void sum_get_totals(const struct sum_job *s, struct sum_totals *t);

struct res_output;
/* The result of a job that ended how (FINISH_STOP or FINISH_LENGTH when its root finished; else
 * FINISH_TIMEOUT, FINISH_CANCELLED or FINISH_ERROR), into o's finish, text, usage, chunks and
 * depth (the rest of *o is left as it is): the root's summary when it answered, else ""; finish
 * FINISH_LENGTH when it answered and some part was cut by its max_tokens; tokens summed over every
 * part done, at most INT32_MAX. o->text borrows from s. */
void sum_result(const struct sum_job *s, enum finish_reason how, struct res_output *o);
