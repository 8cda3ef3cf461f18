/* The plan of `llmq bench --workload mapreduce` (docs/BENCH.md): documents of random token ids,
 * split into overlapping chunks, each summarized (the map level); as a document's level finishes,
 * its summaries are combined by summary_groups (worker/jobs/summary_tree.h) into the requests of its
 * next level, until one summary is left. Documents advance independently. This file owns the
 * prompts and the bookkeeping; the caller submits what bench_mr_next gives to the engine and reports
 * each finished request with bench_mr_finished.
 *
 * Requests have fixed slots, so that their order (the bench's output_digest) does not depend on
 * which document finished a level first: document d's level l group g is slot
 * d * (slots per document) + (slots of its levels before l) + g, the levels sized as
 * summary_level_width gives them for summaries of out_len tokens (an upper bound of every level).
 *
 * A map prompt is BENCH_MR_TEMPLATE_TOKENS ids (the map template, the same in every map prompt) and
 * the chunk's ids; a reduce prompt is BENCH_MR_TEMPLATE_TOKENS ids (the reduce template) and its
 * group's summaries (the ids the engine generated), BENCH_MR_SEP_TOKENS ids between two. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define BENCH_MR_TEMPLATE_TOKENS 64 /* a map or reduce template's tokens, around the text */
#define BENCH_MR_SEP_TOKENS 2       /* between two summaries of a reduce prompt */

struct bench_mr_opts {
    int docs, doc_len;  /* documents and the tokens of each */
    int chunk, overlap; /* a chunk's document tokens, and those it shares with the next chunk */
    int out_len;        /* the most tokens of a summary */
    int budget;         /* a reduce prompt's summaries and separators, at most */
    int vocab;          /* ids are drawn from [0, vocab) */
    uint64_t seed;
};

struct bench_mr_level { /* one level of every document's tree */
    int requests;       /* submitted */
    int finished;
    int64_t prompt_tokens, output_tokens; /* of its submitted / finished requests */
    double t_end;                         /* the caller's clock when the last finished; 0 before */
};

struct bench_mr;

/* The plan, every map request ready to submit. NULL with a reason in err on bad options (overlap
 * not below chunk, a budget two summaries do not fit) or when out of memory. */
struct bench_mr *bench_mr_new(const struct bench_mr_opts *o, char *err, size_t errlen);
void bench_mr_free(struct bench_mr *m); /* NULL is fine */

/* Request slots: every slot index is below this. */
int bench_mr_slots(const struct bench_mr *m);
/* Chunks of one document: 1 when doc_len <= chunk, else ceil((doc_len - overlap) / (chunk - overlap)). */
int bench_mr_chunks(const struct bench_mr *m);
/* The levels of a document's tree (map level included) as summary_depth predicts them. */
int bench_mr_predicted_depth(const struct bench_mr *m);
/* The longest prompt a request can have (the size of bench_mr_next's buffer). */
int bench_mr_max_prompt(const struct bench_mr *m);

/* The next request to submit: its prompt into prompt[0..*n_prompt) (room for bench_mr_max_prompt
 * ids) and its slot returned; -1 when none is ready (all submitted, or waiting for a level). */
int bench_mr_next(struct bench_mr *m, int32_t *prompt, int *n_prompt);

/* Slot `slot` finished with the summary out[0..n_out) (n_out <= out_len) at time t. When that was
 * the last of its document's level, the next level's requests become ready (bench_mr_next), or the
 * document is done. Returns 0, or -1 with a reason in err (a slot not submitted or already finished,
 * a summary longer than out_len). */
int bench_mr_finished(struct bench_mr *m, int slot, const int32_t *out, int n_out, double t, char *err,
                      size_t errlen);

/* The levels run so far, *lv borrowed until the next call that changes m. */
int bench_mr_levels(const struct bench_mr *m, const struct bench_mr_level **lv);
/* Documents whose last summary came; their times in *t (borrowed; 0 for one not done), [docs]. */
int bench_mr_docs_done(const struct bench_mr *m, const double **t);
/* The deepest tree of a finished document (0 before one finished). */
int bench_mr_depth(const struct bench_mr *m);
