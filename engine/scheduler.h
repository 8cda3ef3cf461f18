/* The continuous-batching scheduler (vLLM v1-like, token-budget based).
 *
 * Each step has a budget of max_num_batched_tokens new tokens and at most max_num_seqs running
 * sequences. Running sequences go first, in running order (the admission order below, by
 * effective priority then arrival): a decode takes 1 token, a sequence still in prefill its next
 * chunk. Then, if nobody was preempted in this step,
 * waiting sequences are admitted, lane by lane, in admission order (below): the first one, then
 * waiting ones of its priority from its prompt-length bucket (power of two) whose whole prefill
 * fits, then the others in admission order. A prefill longer than what is left of the budget runs
 * in chunks over several steps; only the chunk that reaches the end of the known tokens samples.
 *
 * Admission order: each priority keeps its own queue (arrival order, preempted sequences at its
 * front); between priorities, the next sequence of each is compared by effective priority,
 * priority + (time waited since t_arrival) / priority_aging_s, ties to the earlier arrival. As
 * every sequence ages at the same rate, that is a fixed order: a sequence of priority p arriving
 * at t ranks like one of priority p + 1 arriving priority_aging_s later. With aging 0, priority
 * decides and arrival breaks ties. With one priority everywhere, the order is arrival (FIFO).
 *
 * Blocks: a running sequence that needs a new block when none is free preempts the last running
 * sequences in running order, lowest effective priority and youngest first (their blocks are
 * freed, they go to the front of their lane's queue of their priority and are recomputed on
 * readmission, generated tokens included), never one that runs before it, so the first running
 * sequence always makes progress and a readmitted one is not the first victim again.
 * Admission needs the chunk's blocks plus a small watermark while others run, plus a reserve for
 * the growth of the running sequences (admission_reserve, docs/SCHEDULER.md). A sequence that
 * could not fit even alone in the pool is failed (sched_out.failed, with a message in its error
 * field). With prefix caching, admission starts a sequence after its longest cached prefix of full
 * blocks (at most n_tokens - 1, so that its last token is always run).
 *
 * Lookahead: after admission, a sampling item whose next step starts a new block gets that block
 * now when more than the watermark is free, so that the next step's K/V slot is known a step
 * early (a backend may run that step before this one's token is read). Never by preemption.
 *
 * Isolation: at most one sequence marked isolated runs at a time; while one runs, the others
 * wait and the sequences after them in admission order are admitted as usual (a job suspected of
 * crashing the worker runs beside unsuspected ones only, so that a crash in its run tells).
 *
 * Lanes: every sequence has a lane (0..num_lanes-1) with its own caps on running sequences,
 * tokens per step and sequence length, inside the global ones.
 *
 * Use:
 *     sched_add(s, q)                 the caller owns q and its tokens
 *     sched_schedule(s, &out)         then run out.items on the backend;
 *     sched_commit(s, &out)           after a successful step (K/V of the items now computed);
 *     then for every item with sample: append the sampled token (q->n_tokens++) or sched_finish(q).
 * On a failed step: sched_finish every item's sequence (or reschedule: nothing was committed). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/kv_blocks.h"
#include "engine/util/list.h"

#define SCHED_MAX_LANES 4

struct sched_lane_opts {
    int max_num_seqs;           /* 0 = the global cap */
    int max_num_batched_tokens; /* 0 = the global cap */
    int max_model_len;          /* 0 = the global cap */
};

struct sched_opts {
    int max_num_seqs;           /* running sequences (>= 1) */
    int max_num_batched_tokens; /* new tokens per step (>= 1) */
    int max_model_len;          /* longest sequence, prompt + output (>= 1) */
    int long_prefill_chunk;     /* most tokens of one sequence per step; 0 = no cap of its own */
    int watermark_blocks;       /* free blocks admission leaves while others run; -1 = 1% (>= 1) */
    int num_lanes;              /* 0 or 1 = one lane */
    struct sched_lane_opts lanes[SCHED_MAX_LANES];
    /* Admission also leaves free the blocks the running sequences (and the one admitted) will still
     * need if each generates this share of its max_tokens; once sequences have finished, the share
     * they generated takes over (a running mean that starts from this value, 8 sequences strong).
     * 0 = no reserve. */
    double admission_reserve;
    double priority_aging_s; /* waiting this long raises the effective priority by 1; 0 = no aging */
};
/* max_num_seqs 256, max_num_batched_tokens 8192, max_model_len 4096, one lane, watermark -1,
 * admission_reserve 1, priority_aging_s 0. */
struct sched_opts sched_opts_default(void);

enum sched_state { SCHED_NEW, SCHED_WAITING, SCHED_RUNNING, SCHED_DONE };

/* A sequence as the scheduler sees it; embedded in the caller's own record. */
struct sched_seq {
    /* Set by the caller before sched_add. */
    const int32_t *tokens; /* prompt then generated ids; must stay valid and hold max_len ids */
    int n_tokens;          /* known tokens; the caller adds one after each sampled token */
    int max_len;           /* the most tokens it will reach (prompt + max_tokens) */
    int lane;
    int priority;     /* higher first (admission, running order, preemption last); 0 = default */
    bool isolated;    /* admitted only while no other isolated sequence runs */
    double t_arrival; /* seconds on the caller's clock when it arrived (aging); any origin, never
                         earlier than that of a sequence added before it */
    void *user;
    /* The scheduler's. */
    enum sched_state state;
    int n_computed; /* tokens whose K/V is in the cache */
    int n_cached;   /* tokens found in the prefix cache at its last admission */
    int n_preemptions;
    int n_prompt;                  /* n_tokens at sched_add */
    uint64_t arrival;              /* order of sched_add */
    struct kv_table kv;            /* its blocks */
    struct list_node link;         /* in its lane's queue of its priority, or the running list */
    char error[160];               /* why it failed (sched_out.failed) */
};

struct sched_item {
    struct sched_seq *seq;
    int pos; /* first position to run: tokens[pos, pos + n_new) */
    int n_new;
    bool sample; /* pos + n_new == n_tokens */
};

/* One step's plan; arrays owned by the scheduler, valid until the next sched_schedule. */
struct sched_out {
    struct sched_item *items;
    int n_items;
    int n_tokens;                 /* sum of n_new */
    int n_prefill_items;          /* items that are not single-token decodes */
    struct sched_seq **preempted; /* sent back to waiting in this step */
    int n_preempted;
    struct sched_seq **failed; /* removed for good (state DONE, blocks freed), error set */
    int n_failed;
    int n_lookahead; /* blocks handed out a step early (the lookahead, above) */
};

struct sched;

/* kv is borrowed and must outlive the scheduler. NULL with err for bad options. */
struct sched *sched_create(const struct sched_opts *o, struct kv_pool *kv, char *err, size_t errlen);
void sched_free(struct sched *s);

/* Queues q at the back of its lane's queue of its priority. Fails (-1 with err) for a bad lane, no
 * tokens, max_len over the lane's max_model_len, or no memory for a new priority's queue. */
int sched_add(struct sched *s, struct sched_seq *q, char *err, size_t errlen);

/* Plans one step. Returns 0, or -2 when out of memory. */
int sched_schedule(struct sched *s, struct sched_out *out);

/* Marks the items of the last plan as computed and registers their full blocks in the prefix
 * cache. */
void sched_commit(struct sched *s, const struct sched_out *out);

/* Removes q (waiting or running) for good and frees its blocks; state DONE. Harmless on a seq
 * that is already DONE or was never added. */
void sched_finish(struct sched *s, struct sched_seq *q);

int sched_num_running(const struct sched *s, int lane); /* lane -1 = all */
/* The share of max_tokens admission reserves blocks for now (admission_reserve, learned). */
double sched_reserve_share(const struct sched *s);
int sched_num_waiting(const struct sched *s, int lane);
bool sched_has_work(const struct sched *s);
const struct sched_opts *sched_get_opts(const struct sched *s);
/* Prompt-length bucket: floor(log2(n)) for n >= 1. */
int sched_bucket(int n_tokens);
