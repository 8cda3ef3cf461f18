/* The continuous-batching scheduler (see scheduler.h). */
#include "engine/scheduler.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/array.h"
#include "engine/util/list.h"

/* The waiting sequences of one priority in a lane: the oldest first, preempted ones back at the
 * front. */
struct wait_queue {
    int priority;
    struct list wait;
};

struct lane {
    struct sched_lane_opts o; /* resolved: no zeros, never above the global caps */
    struct wait_queue *q;     /* [n_q] by priority, highest first; one per priority ever added, so a
                                 preempted sequence always finds its own */
    int n_q;
    size_t q_cap;
    int n_waiting;
    int n_running;
};

struct sched {
    struct sched_opts o;
    struct kv_pool *kv;
    int num_lanes, watermark;
    struct lane lanes[SCHED_MAX_LANES];
    struct list run; /* running sequences in running order (ranks_before: effective priority, arrival) */
    int n_isolated;  /* isolated sequences among them (at most one) */
    uint64_t next_arrival;
    /* admission_reserve: sequences finished after running, and the sum of their shares of max_tokens
     * generated */
    int n_finished;
    double finished_share;
    /* the current plan */
    struct sched_item *items;
    struct sched_seq **preempted;
    struct sched_seq **failed;
    size_t failed_cap;
    struct sched_out out;
    /* the admission order's merge: the next sequence of each priority of a lane (struct walk) */
    struct sched_seq **heap;
    size_t heap_cap;
};

/* What is left of one step's caps while it is planned. */
struct budget {
    int tokens;
    int lane_tokens[SCHED_MAX_LANES];
    bool preempted;
    double share; /* sched_reserve_share for this step */
    int reserve;  /* blocks the running sequences are expected to need still (admission_reserve) */
};

/* ADMIT_HELD: an isolated sequence while another one runs (it waits; the next may go). */
enum admit { ADMIT_OK, ADMIT_NO_ROOM, ADMIT_NO_FIT, ADMIT_FAILED, ADMIT_HELD, ADMIT_OOM };

struct sched_opts sched_opts_default(void)
{
    struct sched_opts o;
    memset(&o, 0, sizeof o);
    o.max_num_seqs = 256;
    o.max_num_batched_tokens = 8192;
    o.max_model_len = 4096;
    o.watermark_blocks = -1;
    o.admission_reserve = 1.0;
    o.num_lanes = 1;
    return o;
}

int sched_bucket(int n)
{
    int b = 0;
    while (n > 1) {
        n >>= 1;
        b++;
    }
    return b;
}

static int min_i(int a, int b)
{
    return a < b ? a : b;
}
static int cap_or(int v, int global)
{
    return v > 0 && v < global ? v : global;
}

struct sched *sched_create(const struct sched_opts *o, struct kv_pool *kv, char *err, size_t errlen)
{
    if (o->max_num_seqs < 1 || o->max_num_batched_tokens < 1 || o->max_model_len < 1 ||
        o->long_prefill_chunk < 0) {
        snprintf(err, errlen,
                 "scheduler: max_num_seqs %d, max_num_batched_tokens %d, max_model_len %d must be >= 1 "
                 "(long_prefill_chunk %d >= 0)",
                 o->max_num_seqs, o->max_num_batched_tokens, o->max_model_len, o->long_prefill_chunk);
        return NULL;
    }
    if (o->num_lanes < 0 || o->num_lanes > SCHED_MAX_LANES) {
        snprintf(err, errlen, "scheduler: %d lanes (1..%d)", o->num_lanes, SCHED_MAX_LANES);
        return NULL;
    }
    struct sched *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "scheduler: out of memory");
        return NULL;
    }
    s->o = *o;
    s->kv = kv;
    s->num_lanes = o->num_lanes ? o->num_lanes : 1;
    static const struct sched_lane_opts no_caps; /* one lane: the global caps */
    for (int l = 0; l < s->num_lanes; l++) {
        const struct sched_lane_opts *lo = o->num_lanes == 0 ? &no_caps : &o->lanes[l];
        if (lo->max_num_seqs < 0 || lo->max_num_batched_tokens < 0 || lo->max_model_len < 0) {
            snprintf(err, errlen, "scheduler: lane %d has a negative cap", l);
            sched_free(s);
            return NULL;
        }
        s->lanes[l].o.max_num_seqs = cap_or(lo->max_num_seqs, o->max_num_seqs);
        s->lanes[l].o.max_num_batched_tokens = cap_or(lo->max_num_batched_tokens, o->max_num_batched_tokens);
        s->lanes[l].o.max_model_len = cap_or(lo->max_model_len, o->max_model_len);
    }
    if (!(o->admission_reserve >= 0 && o->admission_reserve <= 1)) {
        snprintf(err, errlen, "scheduler: admission_reserve %g is not in [0, 1]", o->admission_reserve);
        sched_free(s);
        return NULL;
    }
    if (!(o->priority_aging_s >= 0) || !isfinite(o->priority_aging_s)) {
        snprintf(err, errlen, "scheduler: priority_aging_s %g is not a number >= 0", o->priority_aging_s);
        sched_free(s);
        return NULL;
    }
    s->watermark = o->watermark_blocks >= 0 ? o->watermark_blocks : kv_num_blocks(kv) / 100;
    if (o->watermark_blocks < 0 && s->watermark < 1)
        s->watermark = 1;
    s->items = calloc((size_t)o->max_num_seqs, sizeof *s->items);
    s->preempted = calloc((size_t)o->max_num_seqs, sizeof *s->preempted);
    if (!s->items || !s->preempted) {
        snprintf(err, errlen, "scheduler: out of memory for %d sequences", o->max_num_seqs);
        sched_free(s);
        return NULL;
    }
    return s;
}

void sched_free(struct sched *s)
{
    if (!s)
        return;
    free(s->items);
    free(s->preempted);
    free(s->failed);
    for (int l = 0; l < SCHED_MAX_LANES; l++)
        free(s->lanes[l].q);
    free(s->heap);
    free(s);
}

const struct sched_opts *sched_get_opts(const struct sched *s)
{
    return &s->o;
}

int sched_num_running(const struct sched *s, int lane)
{
    return lane < 0 ? s->run.n : lane < s->num_lanes ? s->lanes[lane].n_running : 0;
}

int sched_num_waiting(const struct sched *s, int lane)
{
    if (lane >= 0)
        return lane < s->num_lanes ? s->lanes[lane].n_waiting : 0;
    int n = 0;
    for (int l = 0; l < s->num_lanes; l++)
        n += s->lanes[l].n_waiting;
    return n;
}

bool sched_has_work(const struct sched *s)
{
    return s->run.n > 0 || sched_num_waiting(s, -1) > 0;
}

/* ---- lists */

static struct sched_seq *seq_of(struct list_node *n)
{
    return LIST_ITEM(n, struct sched_seq, link);
}

/* The index in L->q of `priority`'s queue, or where it would go (L->q is sorted, highest first). */
static int queue_index(const struct lane *L, int priority)
{
    int lo = 0, hi = L->n_q;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (L->q[mid].priority > priority)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The waiting queue of q's priority in its lane; it exists once q was added (sched_add). */
static struct list *wait_list(struct sched *s, const struct sched_seq *q)
{
    struct lane *L = &s->lanes[q->lane];
    int i = queue_index(L, q->priority);
    assert(i < L->n_q && L->q[i].priority == q->priority);
    return &L->q[i].wait;
}

/* Makes sure q's lane has a queue for its priority (and the merge heap room for all of them).
 * 0, or -1 when out of memory. */
static int wait_queue_add(struct sched *s, const struct sched_seq *q)
{
    struct lane *L = &s->lanes[q->lane];
    int i = queue_index(L, q->priority);
    if (i < L->n_q && L->q[i].priority == q->priority)
        return 0;
    if (array_reserve(&L->q, &L->q_cap, (size_t)L->n_q + 1, sizeof *L->q, 4) ||
        array_reserve(&s->heap, &s->heap_cap, (size_t)L->n_q + 1, sizeof *s->heap, 4))
        return -1;
    /* the lists' ends point at nodes, not at the queue records: moving the records is safe */
    memmove(L->q + i + 1, L->q + i, (size_t)(L->n_q - i) * sizeof *L->q);
    memset(&L->q[i], 0, sizeof L->q[i]);
    L->q[i].priority = q->priority;
    L->n_q++;
    return 0;
}

static void wait_unlink(struct sched *s, struct sched_seq *q)
{
    list_remove(wait_list(s, q), &q->link);
    s->lanes[q->lane].n_waiting--;
}

/* At the front or the back of its priority's queue. */
static void wait_push(struct sched *s, struct sched_seq *q, bool front)
{
    struct list *w = wait_list(s, q);
    if (front)
        list_push_front(w, &q->link);
    else
        list_push_back(w, &q->link);
    s->lanes[q->lane].n_waiting++;
    q->state = SCHED_WAITING;
}

/* Whether a goes before b, in admission order (the next waiting sequences of two priorities) and
 * in running order (the last is preempted first): one priority, by arrival; two, by effective
 * priority, priority + waited / aging. As every sequence ages at the same rate, that compares
 * t_arrival - priority * aging (earlier first), a key that never changes; ties by arrival. */
static bool ranks_before(const struct sched *s, const struct sched_seq *a, const struct sched_seq *b)
{
    if (a->priority != b->priority) {
        const double aging = s->o.priority_aging_s;
        if (!(aging > 0))
            return a->priority > b->priority;
        double va = a->t_arrival - a->priority * aging, vb = b->t_arrival - b->priority * aging;
        if (va != vb)
            return va < vb;
    }
    return a->arrival < b->arrival;
}

static void run_unlink(struct sched *s, struct sched_seq *q)
{
    list_remove(&s->run, &q->link);
    s->lanes[q->lane].n_running--;
    s->n_isolated -= q->isolated;
}

/* Inserts q in running order (ranks_before; from the tail: new admissions usually rank last). */
static void run_push(struct sched *s, struct sched_seq *q)
{
    struct list_node *after = s->run.tail;
    while (after && ranks_before(s, q, seq_of(after)))
        after = after->prev;
    list_insert_after(&s->run, after, &q->link);
    s->lanes[q->lane].n_running++;
    s->n_isolated += q->isolated;
    q->state = SCHED_RUNNING;
}

/* ---- add / finish */

int sched_add(struct sched *s, struct sched_seq *q, char *err, size_t errlen)
{
    if (q->lane < 0 || q->lane >= s->num_lanes) {
        snprintf(err, errlen, "lane %d does not exist (%d lanes)", q->lane, s->num_lanes);
        return -1;
    }
    if (q->n_tokens < 1 || !q->tokens) {
        snprintf(err, errlen, "empty prompt");
        return -1;
    }
    if (q->max_len < q->n_tokens) {
        snprintf(err, errlen, "max_len %d is below the %d tokens given", q->max_len, q->n_tokens);
        return -1;
    }
    int mml = s->lanes[q->lane].o.max_model_len;
    if (q->max_len > mml) {
        snprintf(err, errlen, "%d prompt tokens + %d to generate exceed max_model_len %d", q->n_tokens,
                 q->max_len - q->n_tokens, mml);
        return -1;
    }
    if (q->state == SCHED_WAITING || q->state == SCHED_RUNNING) {
        snprintf(err, errlen, "sequence added twice");
        return -1;
    }
    q->n_computed = q->n_cached = q->n_preemptions = 0;
    q->n_prompt = q->n_tokens;
    q->error[0] = 0;
    if (wait_queue_add(s, q)) {
        snprintf(err, errlen, "out of memory for priority %d", q->priority);
        return -1;
    }
    q->arrival = s->next_arrival++;
    kv_table_init(&q->kv);
    wait_push(s, q, false);
    return 0;
}

void sched_finish(struct sched *s, struct sched_seq *q)
{
    if (q->state == SCHED_WAITING)
        wait_unlink(s, q);
    else if (q->state == SCHED_RUNNING)
        run_unlink(s, q);
    else
        return;
    if (!q->error[0] && q->max_len > q->n_prompt && q->n_tokens > q->n_prompt) { /* ran and generated */
        s->n_finished++;
        s->finished_share += (double)(q->n_tokens - q->n_prompt) / (q->max_len - q->n_prompt);
    }
    kv_table_release(s->kv, &q->kv);
    kv_table_free(&q->kv);
    q->state = SCHED_DONE;
}

/* Removes q for good and lists it in out.failed with the reason. */
static int fail_seq(struct sched *s, struct sched_seq *q, const char *why)
{
    if (array_reserve(&s->failed, &s->failed_cap, (size_t)s->out.n_failed + 1, sizeof *s->failed, 16))
        return -2;
    s->out.failed = s->failed;
    snprintf(q->error, sizeof q->error, "%s", why);
    sched_finish(s, q);
    s->failed[s->out.n_failed++] = q;
    return 0;
}

/* Fails q when all of its n_tokens can never be resident in the pool at once. */
static int check_fits_alone(struct sched *s, struct sched_seq *q, bool *failed)
{
    int bs = kv_block_size(s->kv), nb = kv_num_blocks(s->kv);
    *failed = false;
    if (kv_blocks_for(s->kv, q->n_tokens) <= nb)
        return 0;
    char why[160];
    snprintf(why, sizeof why,
             "%d tokens need %d KV blocks of %d tokens; the whole pool has %d blocks (%d tokens)",
             q->n_tokens, kv_blocks_for(s->kv, q->n_tokens), bs, nb, nb * bs);
    *failed = true;
    return fail_seq(s, q, why);
}

static void preempt(struct sched *s, struct sched_seq *q)
{
    run_unlink(s, q);
    kv_table_release(s->kv, &q->kv);
    q->n_computed = 0;
    q->n_preemptions++;
    wait_push(s, q, true);
    s->preempted[s->out.n_preempted++] = q;
}

static void add_item(struct sched *s, struct budget *b, struct sched_seq *q, int n_new)
{
    assert(s->out.n_items < s->o.max_num_seqs);
    struct sched_item *it = &s->items[s->out.n_items++];
    it->seq = q;
    it->pos = q->n_computed;
    it->n_new = n_new;
    it->sample = q->n_computed + n_new == q->n_tokens;
    s->out.n_tokens += n_new;
    if (!(n_new == 1 && it->sample && q->n_computed > 0))
        s->out.n_prefill_items++;
    b->tokens -= n_new;
    b->lane_tokens[q->lane] -= n_new;
}

/* ---- running sequences */

static int schedule_running(struct sched *s, struct budget *b)
{
    struct sched_seq *q = seq_of(s->run.head);
    while (q && b->tokens > 0) {
        struct sched_seq *next = seq_of(q->link.next);
        int remaining = q->n_tokens - q->n_computed;
        assert(remaining >= 1); /* the caller appends each sampled token */
        int lane_left = b->lane_tokens[q->lane];
        if (lane_left <= 0) {
            q = next;
            continue;
        }
        int n_new = min_i(remaining, min_i(b->tokens, lane_left));
        if (s->o.long_prefill_chunk > 0)
            n_new = min_i(n_new, s->o.long_prefill_chunk);
        bool failed;
        if (check_fits_alone(s, q, &failed))
            return -2;
        if (failed) {
            q = next;
            continue;
        }
        bool self_preempted = false;
        int rc;
        while ((rc = kv_table_grow(s->kv, &q->kv, q->n_computed + n_new)) == -1) {
            struct sched_seq *victim = seq_of(s->run.tail);
            b->preempted = true;
            if (victim == q) {
                if (q ==
                    seq_of(s->run.head)) { /* alone and still short: cannot happen after the check above */
                    if (fail_seq(s, q, "the KV pool cannot hold this sequence even alone"))
                        return -2;
                } else {
                    preempt(s, q);
                }
                self_preempted = true;
                break;
            }
            preempt(s, victim);
        }
        if (rc == -2)
            return -2;
        if (self_preempted)
            break; /* q was the tail: nobody left behind it */
        add_item(s, b, q, n_new);
        q = seq_of(q->link.next); /* not `next`: preemption may have removed it */
    }
    return 0;
}

/* ---- admission */

#define RESERVE_PRIOR 8 /* admission_reserve counts as this many finished sequences */

double sched_reserve_share(const struct sched *s)
{
    const double r = s->o.admission_reserve;
    return r > 0 ? (RESERVE_PRIOR * r + s->finished_share) / (RESERVE_PRIOR + s->n_finished) : 0;
}

/* Blocks q is expected to need beyond `held`: up to its prompt and share of its max_tokens. */
static int reserve_of(const struct sched *s, const struct sched_seq *q, double share, int held)
{
    if (share <= 0)
        return 0;
    int want = q->n_prompt + (int)(share * (q->max_len - q->n_prompt) + 0.999);
    want = want < q->max_len ? want : q->max_len;
    int more = kv_blocks_for(s->kv, want) - held;
    return more > 0 ? more : 0;
}

/* Whether lane may admit anyone in this step: a running slot and tokens left, globally and in it. */
static bool lane_has_room(const struct sched *s, const struct budget *b, int lane)
{
    const struct lane *L = &s->lanes[lane];
    return s->run.n < s->o.max_num_seqs && L->n_running < L->o.max_num_seqs && b->tokens > 0 &&
           b->lane_tokens[lane] > 0;
}

static enum admit try_admit(struct sched *s, struct budget *b, struct sched_seq *q, bool allow_chunk)
{
    if (!lane_has_room(s, b, q->lane))
        return ADMIT_NO_ROOM;
    if (q->isolated && s->n_isolated > 0)
        return ADMIT_HELD;
    int room = min_i(b->tokens, b->lane_tokens[q->lane]);
    if (s->o.long_prefill_chunk > 0)
        room = min_i(room, s->o.long_prefill_chunk);
    if (!allow_chunk) { /* cheap test first: even its longest possible cached prefix leaves too much */
        int bs = kv_block_size(s->kv);
        int best_cached = kv_prefix_caching(s->kv) ? (q->n_tokens - 1) / bs * bs : 0;
        if (q->n_tokens - best_cached > room)
            return ADMIT_NO_FIT;
    }
    bool failed;
    if (check_fits_alone(s, q, &failed))
        return ADMIT_OOM;
    if (failed)
        return ADMIT_FAILED;
    int cached = kv_table_match(s->kv, &q->kv, q->tokens, q->n_tokens - 1);
    if (cached < 0)
        return ADMIT_OOM;
    int remaining = q->n_tokens - cached;
    int n_new = min_i(remaining, room);
    enum admit r = ADMIT_OK;
    int own = 0; /* its growth reserve, blocks */
    if (!allow_chunk && n_new < remaining) {
        r = ADMIT_NO_FIT;
    } else {
        int held = kv_blocks_for(s->kv, cached + n_new), need = held - q->kv.n_blocks;
        /* while others run: the watermark, their growth reserve and this one's own (what it will
         * need beyond this chunk's blocks) */
        own = reserve_of(s, q, b->share, held);
        int wm = s->run.n > 0 ? s->watermark + b->reserve + own : 0;
        if (need + wm > kv_num_free(s->kv))
            r = ADMIT_NO_ROOM;
        else if (kv_table_grow(s->kv, &q->kv, cached + n_new))
            r = ADMIT_OOM;
    }
    if (r != ADMIT_OK) {
        kv_table_release(s->kv, &q->kv);
        return r;
    }
    wait_unlink(s, q);
    run_push(s, q);
    q->n_computed = q->n_cached = cached;
    add_item(s, b, q, n_new);
    b->reserve += own;
    return ADMIT_OK;
}

static void heap_sift_down(const struct sched *s, struct sched_seq **h, int n, int i)
{
    struct sched_seq *x = h[i];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && ranks_before(s, h[c + 1], h[c]))
            c++;
        if (!ranks_before(s, h[c], x))
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

/* A walk of a lane's waiting sequences in admission order (see scheduler.h), merged as it goes: a
 * heap (s->heap) holds the next sequence of each priority. It survives the removal of the one at
 * hand (admitted or failed): its successor is in the heap before the caller sees it. With one
 * priority it is that queue's list in order, as the scheduler was before priorities. */
struct walk {
    struct sched *s;
    int n; /* sequences in the heap */
};

static void walk_start(struct sched *s, const struct lane *L, struct walk *w)
{
    w->s = s;
    w->n = 0;
    for (int i = 0; i < L->n_q; i++) /* the heap has room for every queue (wait_queue_add) */
        if (L->q[i].wait.head)
            s->heap[w->n++] = seq_of(L->q[i].wait.head);
    for (int i = w->n / 2 - 1; i >= 0; i--)
        heap_sift_down(s, s->heap, w->n, i);
}

static struct sched_seq *walk_next(struct walk *w)
{
    if (w->n == 0)
        return NULL;
    struct sched_seq **h = w->s->heap, *top = h[0], *next = seq_of(top->link.next);
    h[0] = next ? next : h[--w->n];
    if (w->n > 1)
        heap_sift_down(w->s, h, w->n, 0);
    return top;
}

static int admit_lane(struct sched *s, struct budget *b, int lane)
{
    struct lane *L = &s->lanes[lane];
    if (!L->n_waiting || !lane_has_room(s, b, lane))
        return 0;
    struct walk w;
    walk_start(s, L, &w);
    /* 1. the first in admission order (a failed one makes way for the next) */
    struct sched_seq *head;
    enum admit r = ADMIT_NO_ROOM;
    while ((head = walk_next(&w)) != NULL) {
        r = try_admit(s, b, head, true);
        if (r == ADMIT_OOM)
            return -2;
        if (r != ADMIT_FAILED && r != ADMIT_HELD)
            break;
    }
    if (r != ADMIT_OK)
        return 0;
    /* 2. others of its priority from its bucket whose whole prefill fits */
    int bucket = sched_bucket(head->n_tokens);
    struct sched_seq *q = seq_of(wait_list(s, head)->head), *next;
    for (; q; q = next) {
        next = seq_of(q->link.next);
        if (sched_bucket(q->n_tokens) != bucket)
            continue;
        r = try_admit(s, b, q, false);
        if (r == ADMIT_OOM)
            return -2;
        if (r == ADMIT_NO_ROOM)
            break;
    }
    /* 3. the rest in admission order, chunked if need be */
    walk_start(s, L, &w);
    while ((q = walk_next(&w)) != NULL) {
        r = try_admit(s, b, q, true);
        if (r == ADMIT_OOM)
            return -2;
        if (r == ADMIT_NO_ROOM)
            break;
    }
    return 0;
}

/* ---- lookahead */

/* A sampling item whose next step will write into a block it does not hold yet gets that block now,
 * out of what is free beyond the watermark after admission (never by preempting anyone): the next
 * step's K/V slot and block table are then known before this step's token is, which lets a backend
 * run the next decode step ahead of the host (docs/SCHEDULER.md, "Lookahead"). */
static int look_ahead(struct sched *s)
{
    for (int i = 0; i < s->out.n_items; i++) {
        const struct sched_item *it = &s->items[i];
        struct sched_seq *q = it->seq;
        const int next_ctx = it->pos + it->n_new + 1; /* the next step's context */
        if (!it->sample || next_ctx >= q->max_len || kv_blocks_for(s->kv, next_ctx) <= q->kv.n_blocks)
            continue;
        if (kv_num_free(s->kv) <= s->watermark)
            break;
        if (kv_table_grow(s->kv, &q->kv, next_ctx) == -2)
            return -2;
        s->out.n_lookahead++;
    }
    return 0;
}

int sched_schedule(struct sched *s, struct sched_out *out)
{
    memset(&s->out, 0, sizeof s->out);
    s->out.items = s->items;
    s->out.preempted = s->preempted;
    s->out.failed = s->failed;
    struct budget b = {.tokens = s->o.max_num_batched_tokens};
    for (int l = 0; l < s->num_lanes; l++)
        b.lane_tokens[l] = s->lanes[l].o.max_num_batched_tokens;
    int rc = schedule_running(s, &b);
    b.share = sched_reserve_share(s);
    if (b.share > 0)
        for (struct sched_seq *q = seq_of(s->run.head); q; q = seq_of(q->link.next))
            b.reserve += reserve_of(s, q, b.share, q->kv.n_blocks);
    for (int l = 0; rc == 0 && !b.preempted && l < s->num_lanes; l++)
        rc = admit_lane(s, &b, l);
    if (rc == 0)
        rc = look_ahead(s);
    *out = s->out;
    return rc;
}

void sched_commit(struct sched *s, const struct sched_out *out)
{
    for (int i = 0; i < out->n_items; i++) {
        struct sched_seq *q = out->items[i].seq;
        assert(q->state == SCHED_RUNNING && q->n_computed == out->items[i].pos);
        q->n_computed += out->items[i].n_new;
        kv_table_commit(s->kv, &q->kv, q->tokens, q->n_computed); /* out of memory only loses cache entries */
    }
}
