/* The generation engine (see engine.h): requests in, the scheduler plans each step, the backend
 * runs it, and the host appends tokens, detokenizes incrementally and decides when to stop.
 *
 * Stopping, checked after each sampled token in vLLM's order: an EOS id (unless ignore_eos) or a
 * stop id -> "stop" (the id is kept in tokens but adds no text); then stop strings on the text
 * (once more than min_tokens tokens exist) -> "stop", text cut before the match; then max_tokens
 * -> "length". EOS and stop ids are banned from sampling until min_tokens tokens exist.
 *
 * Deadlines: at the start of a step, a seq whose deadline has passed finishes with "timeout" and
 * what it generated, like a cancel.
 *
 * Reasoning (engine/think.h): on a model that thinks, each token is routed to the reasoning or the
 * answer; the tags add no text. Stop strings are matched on the answer, and on the reasoning only
 * with stop_in_reasoning. A close forced by a thinking budget replaces the sampled ids (the backend
 * still runs the step; its logprob is written as 0) and then goes through the same rules as a
 * sampled token. */
#include "engine/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/grammar.h"
#include "engine/kv_blocks.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "engine/stop.h"
#include "engine/think.h"
#include "engine/tokenizer.h"
#include "engine/util/array.h"
#include "engine/util/list.h"
#include "engine/util/log.h"
#include "engine/util/mono.h"

struct eseq {
    struct engine_seq pub; /* first, so an engine_seq * is an eseq * */
    struct sched_seq sq;
    struct sampling_params spv; /* validated, seeded; be_seq.sp points here */
    int max_tokens, min_tokens;
    bool ignore_eos;
    int32_t *stop_ids; /* [n_stop_ids] */
    int n_stop_ids;
    int32_t *banned; /* [n_banned]: EOS ids (unless ignore_eos) and stop ids, until min_tokens */
    int n_banned;
    double deadline; /* engine_request.deadline; 0 = none */
    struct stop_matcher stop;
    struct tok_stream *ts;
    char *full; /* all answer text decoded so far (pub.text shows a prefix of it) */
    size_t full_len, full_cap, text_cap;
    char *rfull; /* all reasoning text decoded so far (pub.reasoning shows a prefix of it) */
    size_t rfull_len, rfull_cap, reasoning_cap;
    struct think_state think;
    bool split; /* reasoning apart from the answer (not engine_request.no_think_split) */
    bool stop_in_reasoning;
    size_t tokens_cap, logprobs_cap;
    bool cancel;            /* cancelled, finish not yet reported */
    bool admitted;          /* running since its last admission (for the cached-token count) */
    bool started;           /* a step has run it (once true, stays true: preemption included) */
    int prev_idx;           /* index in engine.prev while n_new_output is 1, else -1 */
    uint64_t changed_stamp; /* the step in whose *changed it is listed */
    struct list_node live;  /* in engine.live */
    struct gr_matcher *gm;  /* the request's grammar over the answer, or NULL */
    uint32_t *mask;         /* [gr_vocab_mask_words]: ids the next step may sample under gm */
    char *gerr;             /* why gm could not give a mask (finishes the seq at its next token) */
    bool gm_think;          /* the first token may open a think block beside gm's ids */
};

struct engine {
    const struct model *m;
    const struct tok *tok;
    struct engine_opts o;
    struct backend *be;
    struct kv_pool *kv;
    struct sched *s;
    int vocab, num_lanes;
    uint64_t seed_ctr;
    uint64_t stamp;      /* engine_step calls */
    struct be_seq *bseq; /* [max_num_seqs] */
    struct be_out *bout;
    struct engine_seq **changed;
    int n_changed;
    struct engine_seq **starting; /* [max_num_seqs]: the seqs a step runs for the first time */
    engine_start_fn on_start;
    void *on_start_ctx;
    size_t changed_cap;
    struct eseq **prev; /* seqs whose n_new_output is set */
    int n_prev;
    size_t prev_cap;
    struct eseq **cancels;
    int n_cancels;
    size_t cancels_cap;
    struct think_vocab think; /* the think tags, when the model has them */
    struct gr_vocab *gvocab;  /* for grammars; built on first use */
    struct eseq **pend;       /* [max_num_seqs]: seqs of this step whose masks fill_masks makes */
    int n_pend;
    struct list live;     /* every unreleased seq */
    double next_deadline; /* no unfinished seq has an earlier one (INFINITY: none has one) */
    struct engine_stats st;
};

const char *finish_reason_name(enum finish_reason r)
{
    switch (r) {
    case FINISH_STOP:
        return "stop";
    case FINISH_LENGTH:
        return "length";
    case FINISH_CANCELLED:
        return "cancelled";
    case FINISH_ERROR:
        return "error";
    case FINISH_TIMEOUT:
        return "timeout";
    default:
        return NULL;
    }
}

struct engine_opts engine_opts_default(void)
{
    struct engine_opts o;
    memset(&o, 0, sizeof o);
    o.be.block_size = 32;
    o.be.max_num_seqs = 512;
    o.be.max_num_batched_tokens = 16384;
    o.be.max_model_len = 0;
    o.be.threads = 0;
    o.be.gpu_memory_utilization = 0.92;
    o.be.kv_cache_bytes = 0;
    o.be.kv_dtype = DT_BF16;
    o.be.cuda_graphs = true;
    o.be.cuda_graph_max_batch = 512;
    o.long_prefill_chunk = 0;
    o.enable_prefix_caching = true;
    o.admission_reserve = 1.0;
    o.seed = 0;
    o.num_lanes = 1;
    o.priority_aging_s = 60;
    return o;
}

struct engine_request engine_request_default(void)
{
    struct engine_request r;
    memset(&r, 0, sizeof r);
    r.sp = sampling_params_default();
    r.max_tokens = 16;
    r.skip_special_tokens = true;
    return r;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* ---- open / free */

static void fill_masks(void *ctx);

struct engine *engine_open(const struct model *m, const struct tok *tok, struct backend *be,
                           const struct engine_opts *o, char *err, size_t errlen)
{
    if (!m || !tok || !o || !be) {
        snprintf(err, errlen, "engine_open: model, tokenizer, backend and options are required");
        backend_free(be);
        return NULL;
    }
    if (o->num_lanes < 0 || o->num_lanes > ENGINE_MAX_LANES) {
        snprintf(err, errlen, "engine: %d lanes (1..%d)", o->num_lanes, ENGINE_MAX_LANES);
        backend_free(be);
        return NULL;
    }
    if (o->be.max_num_seqs < 1 || o->be.max_num_batched_tokens < 1) {
        snprintf(err, errlen, "engine: max_num_seqs %d and max_num_batched_tokens %d must be >= 1",
                 o->be.max_num_seqs, o->be.max_num_batched_tokens);
        backend_free(be);
        return NULL;
    }
    struct engine *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, errlen, "engine: out of memory");
        backend_free(be);
        return NULL;
    }
    e->be = be;
    e->m = m;
    e->tok = tok;
    e->o = *o;
    e->vocab = m->cfg.vocab;
    e->seed_ctr = o->seed;
    e->num_lanes = o->num_lanes ? o->num_lanes : 1;
    e->next_deadline = INFINITY;
    think_vocab_init(&e->think, tok);

    struct backend_opts bo = o->be;
    if (bo.max_model_len <= 0)
        bo.max_model_len = m->cfg.max_position;
    if (bo.max_model_len <= 0) {
        snprintf(err, errlen,
                 "engine: max_model_len is not set and the model has no max_position_embeddings");
        goto fail;
    }
    e->o.be = bo;
    e->kv = kv_pool_create(e->be->num_blocks, e->be->block_size, o->enable_prefix_caching, err, errlen);
    if (!e->kv)
        goto fail;
    int64_t cap = (int64_t)e->be->num_blocks * e->be->block_size;
    int mml = bo.max_model_len;
    if (mml > cap) {
        log_warn("engine: the KV pool holds %lld tokens (%d blocks of %d), less than max_model_len %d; "
                 "sequences are limited to %lld tokens",
                 (long long)cap, e->be->num_blocks, e->be->block_size, mml, (long long)cap);
        mml = (int)cap;
    }
    struct sched_opts so = sched_opts_default();
    so.max_num_seqs = bo.max_num_seqs;
    so.max_num_batched_tokens = bo.max_num_batched_tokens;
    so.max_model_len = mml;
    so.long_prefill_chunk = o->long_prefill_chunk;
    so.admission_reserve = o->admission_reserve;
    so.priority_aging_s = o->priority_aging_s;
    so.num_lanes = e->num_lanes;
    for (int l = 0; l < o->num_lanes; l++) {
        so.lanes[l].max_num_seqs = o->lanes[l].max_num_seqs;
        so.lanes[l].max_num_batched_tokens = o->lanes[l].max_num_batched_tokens;
        so.lanes[l].max_model_len = o->lanes[l].max_model_len;
    }
    e->s = sched_create(&so, e->kv, err, errlen);
    if (!e->s)
        goto fail;
    e->bseq = calloc((size_t)bo.max_num_seqs, sizeof *e->bseq);
    e->starting = calloc((size_t)bo.max_num_seqs, sizeof *e->starting);
    e->bout = calloc((size_t)bo.max_num_seqs, sizeof *e->bout);
    e->pend = calloc((size_t)bo.max_num_seqs, sizeof *e->pend);
    if (!e->bseq || !e->bout || !e->starting || !e->pend) {
        snprintf(err, errlen, "engine: out of memory");
        goto fail;
    }
    e->be->fill_masks = fill_masks;
    e->be->fill_masks_ctx = e;
    e->st.kv_blocks_total = e->be->num_blocks;
    log_info("engine: backend %s, KV pool %d blocks of %d tokens, max_model_len %d, prefix caching %s",
             backend_name(e->be), e->be->num_blocks, e->be->block_size, mml,
             o->enable_prefix_caching ? "on" : "off");
    return e;
fail:
    engine_free(e);
    return NULL;
}

static void seq_free(struct eseq *q)
{
    if (!q)
        return;
    stop_free(&q->stop);
    tok_stream_free(q->ts);
    kv_table_free(&q->sq.kv);
    free(q->pub.tokens);
    free(q->pub.text);
    free(q->pub.reasoning);
    free(q->pub.logprobs);
    free(q->full);
    free(q->rfull);
    free(q->stop_ids);
    free(q->banned);
    gr_matcher_free(q->gm);
    free(q->mask);
    free(q->gerr);
    free(q);
}

void engine_free(struct engine *e)
{
    if (!e)
        return;
    while (e->live.head) {
        struct eseq *q = LIST_ITEM(e->live.head, struct eseq, live);
        list_remove(&e->live, &q->live);
        sched_finish(e->s, &q->sq);
        seq_free(q);
    }
    sched_free(e->s);
    kv_pool_free(e->kv);
    backend_free(e->be);
    free(e->bseq);
    free(e->starting);
    free(e->bout);
    free(e->changed);
    free(e->prev);
    free(e->cancels);
    gr_vocab_free(e->gvocab);
    free(e->pend);
    free(e);
}

const struct gr_vocab *engine_grammar_vocab(struct engine *e, char *err, size_t errlen)
{
    if (!e->gvocab)
        e->gvocab = gr_vocab_new(e->tok, e->vocab, e->m->cfg.eos_ids, e->m->cfg.n_eos, err, errlen);
    return e->gvocab;
}

bool engine_thinks(const struct engine *e)
{
    return think_vocab_ok(&e->think);
}

const char *engine_backend_name(const struct engine *e)
{
    return backend_name(e->be);
}

const struct backend *engine_backend(const struct engine *e)
{
    return e->be;
}

int engine_max_model_len(const struct engine *e, int lane)
{
    const struct sched_opts *so = sched_get_opts(e->s);
    int mml = so->max_model_len;
    if (lane >= 0 && lane < e->num_lanes && so->num_lanes > lane && so->lanes[lane].max_model_len > 0 &&
        so->lanes[lane].max_model_len < mml)
        mml = so->lanes[lane].max_model_len;
    return mml;
}

double engine_now(const struct engine *e)
{
    return e->o.clock ? e->o.clock(e->o.clock_ctx) : llmq_mono_s();
}

bool engine_has_work(const struct engine *e)
{
    return sched_has_work(e->s) || e->n_cancels > 0;
}

void engine_get_stats(const struct engine *e, struct engine_stats *st)
{
    *st = e->st;
    st->running = sched_num_running(e->s, -1);
    st->waiting = sched_num_waiting(e->s, -1);
    for (int l = 0; l < ENGINE_MAX_LANES; l++) {
        st->lane_running[l] = sched_num_running(e->s, l);
        st->lane_waiting[l] = sched_num_waiting(e->s, l);
    }
    struct kv_stats ks;
    kv_get_stats(e->kv, &ks);
    st->kv_blocks_used = ks.used;
    st->kv_blocks_total = ks.num_blocks;
    st->kv_blocks_cached = ks.cached;
    st->prefix_queries = ks.queries;
    st->prefix_hits = ks.hits;
}

/* ---- add */

static int check_sampling(struct sampling_params *sp, char *err, size_t errlen)
{
    if (!(sp->temperature >= 0) || !isfinite(sp->temperature)) {
        snprintf(err, errlen, "temperature must be a number >= 0, got %g", sp->temperature);
        return -1;
    }
    if (!(sp->top_p > 0 && sp->top_p <= 1)) {
        snprintf(err, errlen, "top_p must be in (0, 1], got %g", sp->top_p);
        return -1;
    }
    if (sp->top_k == -1)
        sp->top_k = 0; /* vLLM spells "off" -1 */
    if (sp->top_k < 0) {
        snprintf(err, errlen, "top_k must be >= 0 (or -1 for off), got %d", sp->top_k);
        return -1;
    }
    if (!(sp->min_p >= 0 && sp->min_p <= 1)) {
        snprintf(err, errlen, "min_p must be in [0, 1], got %g", sp->min_p);
        return -1;
    }
    if (!(sp->repetition_penalty > 0) || !isfinite(sp->repetition_penalty)) {
        snprintf(err, errlen, "repetition_penalty must be > 0, got %g", sp->repetition_penalty);
        return -1;
    }
    if (!(sp->presence_penalty >= -2 && sp->presence_penalty <= 2)) {
        snprintf(err, errlen, "presence_penalty must be in [-2, 2], got %g", sp->presence_penalty);
        return -1;
    }
    if (!(sp->frequency_penalty >= -2 && sp->frequency_penalty <= 2)) {
        snprintf(err, errlen, "frequency_penalty must be in [-2, 2], got %g", sp->frequency_penalty);
        return -1;
    }
    if (sp->logprobs < -1 || sp->logprobs > SAMPLING_MAX_LOGPROBS) {
        snprintf(err, errlen, "logprobs must be in [0, %d] (or absent), got %d", SAMPLING_MAX_LOGPROBS,
                 sp->logprobs);
        return -1;
    }
    return 0;
}

/* The index of the first of ids[0 .. n) outside the vocabulary [0, vocab), or -1 when none is. */
static int outside_vocab(const struct engine *e, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= e->vocab)
            return i;
    return -1;
}

struct engine_seq *engine_add(struct engine *e, const struct engine_request *r, char *err, size_t errlen)
{
    if (!r->prompt || r->n_prompt < 1) {
        snprintf(err, errlen, "the prompt is empty");
        return NULL;
    }
    int bad = outside_vocab(e, r->prompt, r->n_prompt);
    if (bad >= 0) {
        snprintf(err, errlen, "prompt token %d is id %d, outside the vocabulary [0, %d)", bad,
                 (int)r->prompt[bad], e->vocab);
        return NULL;
    }
    if (r->max_tokens < 1) {
        snprintf(err, errlen, "max_tokens must be >= 1, got %d", r->max_tokens);
        return NULL;
    }
    if (r->min_tokens < 0 || r->min_tokens > r->max_tokens) {
        snprintf(err, errlen, "min_tokens must be in [0, max_tokens = %d], got %d", r->max_tokens,
                 r->min_tokens);
        return NULL;
    }
    if (r->lane < 0 || r->lane >= e->num_lanes) {
        snprintf(err, errlen, "lane %d does not exist (%d lanes)", r->lane, e->num_lanes);
        return NULL;
    }
    int mml = engine_max_model_len(e, r->lane);
    if ((int64_t)r->n_prompt + r->max_tokens > mml) {
        if (r->n_prompt >= mml)
            snprintf(err, errlen, "the prompt has %d tokens; max_model_len is %d", r->n_prompt, mml);
        else
            snprintf(err, errlen,
                     "%d prompt tokens + max_tokens %d exceed max_model_len %d (at most %d new tokens)",
                     r->n_prompt, r->max_tokens, mml, mml - r->n_prompt);
        return NULL;
    }
    if (!(r->deadline >= 0) || !isfinite(r->deadline)) {
        snprintf(err, errlen, "deadline must be a time >= 0 (0 = none), got %g", r->deadline);
        return NULL;
    }
    if (r->n_stop < 0 || r->n_stop_ids < 0 || (r->n_stop_ids > 0 && !r->stop_ids)) {
        snprintf(err, errlen, "bad stop list");
        return NULL;
    }
    if ((bad = outside_vocab(e, r->stop_ids, r->n_stop_ids)) >= 0) {
        snprintf(err, errlen, "stop_token_ids[%d] = %d is outside the vocabulary [0, %d)", bad,
                 (int)r->stop_ids[bad], e->vocab);
        return NULL;
    }
    if (r->has_thinking_budget && r->thinking_budget < 0) {
        snprintf(err, errlen, "thinking_budget must be >= 0, got %d", r->thinking_budget);
        return NULL;
    }
    if (r->has_thinking_budget && !think_vocab_ok(&e->think)) {
        snprintf(err, errlen,
                 "thinking_budget: the model does not think (its tokenizer has no <think> and "
                 "</think> tokens)");
        return NULL;
    }
    if (r->grammar && (!e->gvocab || gr_grammar_vocab(r->grammar) != e->gvocab)) {
        snprintf(err, errlen, "the grammar was not compiled against this engine's vocabulary");
        return NULL;
    }
    if (r->grammar && r->ignore_eos) {
        snprintf(err, errlen, "a grammar ends the output with EOS: ignore_eos cannot be set with one");
        return NULL;
    }
    struct sampling_params sp = r->sp;
    if (check_sampling(&sp, err, errlen))
        return NULL;
    if (!r->has_seed)
        sp.seed = splitmix64(e->seed_ctr++);

    struct eseq *q = calloc(1, sizeof *q);
    if (!q)
        goto oom;
    q->prev_idx = -1;
    if (stop_init(&q->stop, r->stop, r->n_stop, err, errlen)) {
        seq_free(q);
        return NULL;
    }
    q->max_tokens = r->max_tokens;
    q->min_tokens = r->min_tokens;
    q->ignore_eos = r->ignore_eos;
    int n_eos = r->ignore_eos ? 0 : e->m->cfg.n_eos;
    q->stop_ids = malloc(((size_t)r->n_stop_ids + 1) * sizeof *q->stop_ids);
    q->banned = malloc(((size_t)r->n_stop_ids + (size_t)n_eos + 1) * sizeof *q->banned);
    int cap = r->n_prompt + (r->max_tokens < 64 ? r->max_tokens : 64);
    q->pub.tokens = malloc((size_t)cap * sizeof *q->pub.tokens);
    q->tokens_cap = (size_t)cap;
    q->ts = tok_stream_new(e->tok, r->skip_special_tokens);
    if (!q->stop_ids || !q->banned || !q->pub.tokens || !q->ts ||
        array_reserve(&q->pub.text, &q->text_cap, 64, 1, 64) ||
        array_reserve(&q->pub.reasoning, &q->reasoning_cap, 1, 1, 64))
        goto oom;
    if (r->grammar && (!(q->gm = gr_matcher_new(r->grammar)) ||
                       !(q->mask = malloc((size_t)gr_vocab_mask_words(e->gvocab) * sizeof *q->mask))))
        goto oom;
    think_start(&q->think, &e->think, r->prompt, r->n_prompt,
                r->has_thinking_budget ? r->thinking_budget : -1);
    if (q->gm && q->think.phase == THINK_MAYBE) { /* not after a prompt that closed a block itself */
        q->gm_think = true;
        for (int i = 0; i < r->n_prompt && q->gm_think; i++)
            q->gm_think = r->prompt[i] != e->think.close;
    }
    q->stop_in_reasoning = r->stop_in_reasoning;
    q->split = !r->no_think_split;
    q->pub.reasoning[0] = 0;
    if (r->n_stop_ids)
        memcpy(q->stop_ids, r->stop_ids, (size_t)r->n_stop_ids * sizeof *q->stop_ids);
    q->n_stop_ids = r->n_stop_ids;
    for (int i = 0; i < n_eos; i++)
        q->banned[q->n_banned++] = e->m->cfg.eos_ids[i];
    for (int i = 0; i < r->n_stop_ids; i++)
        q->banned[q->n_banned++] = r->stop_ids[i];
    memcpy(q->pub.tokens, r->prompt, (size_t)r->n_prompt * sizeof *q->pub.tokens);
    q->pub.text[0] = 0;
    q->pub.user = r->user;
    q->pub.n_prompt = r->n_prompt;
    q->pub.t_arrival = engine_now(e);
    q->deadline = r->deadline;
    if (sp.logprobs >= 0 && array_reserve(&q->pub.logprobs, &q->logprobs_cap, 4, sizeof *q->pub.logprobs, 16))
        goto oom;
    q->sq.tokens = q->pub.tokens;
    q->sq.n_tokens = r->n_prompt;
    q->sq.max_len = r->n_prompt + r->max_tokens;
    q->sq.lane = r->lane;
    q->sq.priority = r->priority;
    q->sq.isolated = r->isolated;
    q->sq.t_arrival = q->pub.t_arrival;
    q->sq.user = q;
    q->spv = sp;
    /* per-seq lists of a step never need to grow inside engine_step */
    size_t need = (size_t)e->live.n + 1;
    if (array_reserve(&e->changed, &e->changed_cap, need, sizeof *e->changed, 16) ||
        array_reserve(&e->prev, &e->prev_cap, need, sizeof *e->prev, 16) ||
        array_reserve(&e->cancels, &e->cancels_cap, need, sizeof *e->cancels, 16))
        goto oom;
    if (sched_add(e->s, &q->sq, err, errlen)) {
        seq_free(q);
        return NULL;
    }
    list_push_front(&e->live, &q->live);
    if (q->deadline > 0 && q->deadline < e->next_deadline)
        e->next_deadline = q->deadline;
    e->st.prompt_tokens += (uint64_t)r->n_prompt;
    return &q->pub;
oom:
    seq_free(q);
    snprintf(err, errlen, "out of memory for a request of %d prompt tokens", r->n_prompt);
    return NULL;
}

/* ---- a step's output */

static void changed_add(struct engine *e, struct eseq *q)
{
    if (q->changed_stamp == e->stamp)
        return;
    q->changed_stamp = e->stamp;
    e->changed[e->n_changed++] = &q->pub; /* capacity >= live seqs, grown by engine_add */
}

static void clear_new_outputs(struct engine *e)
{
    for (int i = 0; i < e->n_prev; i++)
        if (e->prev[i]) {
            e->prev[i]->pub.n_new_output = 0;
            e->prev[i]->prev_idx = -1;
        }
    e->n_prev = 0;
}

static int buf_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (!n)
        return 0;
    if (array_reserve(buf, cap, *len + n + 1, 1, 64))
        return -1;
    memcpy(*buf + *len, s, n);
    *len += n;
    return 0;
}

/* Appends decoded text to the answer, or to the reasoning while q is inside its think block. */
static int full_append(struct eseq *q, const char *s, size_t n)
{
    if (q->split && q->think.phase == THINK_IN)
        return buf_append(&q->rfull, &q->rfull_len, &q->rfull_cap, s, n);
    return buf_append(&q->full, &q->full_len, &q->full_cap, s, n);
}

/* Shows src[0, vis) in *dst (of *dst_len bytes shown, *cap allocated). */
static int show(char **dst, size_t *dst_len, size_t *cap, const char *src, size_t vis)
{
    if (vis < *dst_len) { /* only a final cut can shrink it; stop_visible_len prevents that */
        *dst_len = vis;
        (*dst)[vis] = 0;
        return 0;
    }
    if (vis == *dst_len)
        return 0;
    if (array_reserve(dst, cap, vis + 1, 1, 64))
        return -1;
    memcpy(*dst + *dst_len, src + *dst_len, vis - *dst_len);
    *dst_len = vis;
    (*dst)[vis] = 0;
    return 0;
}

/* Shows full[0, vis) as the seq's text. */
static int publish(struct eseq *q, size_t vis)
{
    return show(&q->pub.text, &q->pub.text_len, &q->text_cap, q->full, vis);
}

/* Shows rfull[0, vis) as the seq's reasoning. */
static int publish_reasoning(struct eseq *q, size_t vis)
{
    return show(&q->pub.reasoning, &q->pub.reasoning_len, &q->reasoning_cap, q->rfull, vis);
}

/* Finishes q (once): flushes the decoder when asked, shows the whole text, frees its blocks. */
/* Takes q off the list of pending cancels (where engine_cancel put it), keeping the others' order. */
static void cancels_remove(struct engine *e, const struct eseq *q)
{
    for (int i = 0; i < e->n_cancels; i++)
        if (e->cancels[i] == q) {
            memmove(e->cancels + i, e->cancels + i + 1, (size_t)(e->n_cancels - i - 1) * sizeof *e->cancels);
            e->n_cancels--;
            return;
        }
}

static void finish(struct engine *e, struct eseq *q, enum finish_reason why, const char *msg, bool flush)
{
    if (q->pub.finished)
        return;
    if (flush && q->ts) {
        const char *t;
        size_t n;
        tok_stream_flush(q->ts, &t, &n);
        full_append(q, t, n);
    }
    publish(q, q->full_len);
    publish_reasoning(q, q->rfull_len);
    q->pub.finished = true;
    q->pub.finish = why;
    if (msg)
        snprintf(q->pub.error, sizeof q->pub.error, "%s", msg);
    q->pub.t_finished = engine_now(e);
    if (q->cancel) { /* finished otherwise before its cancel was seen */
        cancels_remove(e, q);
        q->cancel = false;
    }
    sched_finish(e->s, &q->sq);
    changed_add(e, q);
}

static bool is_stop_id(const struct engine *e, const struct eseq *q, int32_t t)
{
    if (!q->ignore_eos)
        for (int i = 0; i < e->m->cfg.n_eos; i++)
            if (t == e->m->cfg.eos_ids[i])
                return true;
    for (int i = 0; i < q->n_stop_ids; i++)
        if (t == q->stop_ids[i])
            return true;
    return false;
}

/* Whether the last token of q (prompt or output) decodes to bytes that end with a newline. */
static bool ends_with_newline(const struct engine *e, const struct eseq *q)
{
    size_t n = 0;
    const char *b = tok_token_bytes(e->tok, q->pub.tokens[q->sq.n_tokens - 1], &n);
    return b && n > 0 && b[n - 1] == '\n';
}

/* The buffer of q's next mask under its grammar (owned by q), to be filled by fill_masks while the
 * backend runs the forward; NULL when nothing is masked: inside a think block, or while a thinking
 * budget forces its close. */
static const uint32_t *grammar_mask(struct engine *e, struct eseq *q)
{
    if (q->gerr || q->think.phase == THINK_IN || think_forcing(&q->think))
        return NULL;
    e->pend[e->n_pend++] = q;
    return q->mask;
}

/* backend.fill_masks: the masks of the step's seqs under a grammar (grammar_mask), from each grammar's
 * cache or by a walk of the vocabulary, on all cores when there are several. Before the first token of
 * a model that may open a think block (and whose prompt did not close one itself, as Qwen3's template
 * does with thinking off), the open tag is allowed beside the grammar's ids. A failure is kept in
 * q->gerr (the seq finishes with it at its next token) and its mask lets every id through meanwhile. */
static void fill_masks(void *ctx)
{
    struct engine *e = ctx;
    if (!e->n_pend)
        return;
    double t0 = llmq_mono_s();
    int words = gr_vocab_mask_words(e->gvocab);
    /* in parallel: a cache miss walks the vocabulary (milliseconds), a hit copies one mask; matchers
     * are distinct and a grammar's cache is locked */
#pragma omp parallel for schedule(dynamic, 1) if (e->n_pend >= 8)
    for (int i = 0; i < e->n_pend; i++) {
        struct eseq *q = e->pend[i];
        char err[256];
        if (gr_matcher_mask(q->gm, q->mask, err, sizeof err)) {
            q->gerr = strdup(err[0] ? err : "out of memory");
            memset(q->mask, 0xff, (size_t)words * sizeof *q->mask);
            continue;
        }
        if (q->gm_think && q->think.phase == THINK_MAYBE)
            q->mask[e->think.open >> 5] |= 1u << (e->think.open & 31);
    }
    e->st.grammar_masks += (uint64_t)e->n_pend;
    e->st.grammar_mask_s += llmq_mono_s() - t0;
    e->n_pend = 0;
}

/* Moves q's grammar over its new sampled token t when t belongs to the answer (route, before a no-split
 * request folds everything into the text); the tokens of a close a thinking budget forces (its
 * "\n\n" included) are not fed to it, so the grammar starts at the first sampled answer token. Returns true when q was finished instead: a mask that
 * failed, or a token the grammar refuses (a forced one). */
static bool grammar_take(struct engine *e, struct eseq *q, int32_t t, enum think_route route)
{
    if (q->gerr) {
        char msg[300];
        snprintf(msg, sizeof msg, "grammar: %s", q->gerr);
        finish(e, q, FINISH_ERROR, msg, true);
        return true;
    }
    if (route != THINK_ANSWER)
        return false;
    if (gr_matcher_accept(q->gm, t) == 0)
        return false;
    char msg[128];
    snprintf(msg, sizeof msg, "grammar: token %d does not continue the %s output", (int)t,
             gr_matcher_ended(q->gm) ? "ended" : "constrained");
    finish(e, q, FINISH_ERROR, msg, true);
    return true;
}

/* Appends a sampled token (or the one a thinking budget forces) and applies the stop rules. */
static void on_token(struct engine *e, struct eseq *q, const struct be_out *o)
{
    int32_t t = o->token;
    struct be_out forced;
    char msg[sizeof e->be->err + 64];
    if (t == -1) { /* its sampling failed (backend_ops.step): this sequence alone */
        snprintf(msg, sizeof msg, "backend %s: %s", backend_name(e->be),
                 e->be->err[0] ? e->be->err : "sampling failed");
        finish(e, q, FINISH_ERROR, msg, true);
        return;
    }
    if (t < 0 || t >= e->vocab) {
        snprintf(msg, sizeof msg, "backend %s returned token id %d, outside the vocabulary [0, %d)",
                 backend_name(e->be), (int)t, e->vocab);
        finish(e, q, FINISH_ERROR, msg, true);
        return;
    }
    if (think_forcing(&q->think)) { /* a thinking budget closes the block: this id instead */
        forced = *o;
        forced.token = t = think_forced(&q->think, &e->think, ends_with_newline(e, q));
        forced.logprob = 0;
        o = &forced;
    }
    int n = q->sq.n_tokens;
    if (array_reserve(&q->pub.tokens, &q->tokens_cap, (size_t)(n + 1), sizeof *q->pub.tokens, 16) ||
        (q->spv.logprobs >= 0 && array_reserve(&q->pub.logprobs, &q->logprobs_cap,
                                               (size_t)(q->pub.n_output + 1), sizeof *q->pub.logprobs, 16))) {
        finish(e, q, FINISH_ERROR, "out of memory for the output", true);
        return;
    }
    q->sq.tokens = q->pub.tokens;
    q->pub.tokens[n] = t;
    q->sq.n_tokens = n + 1;
    if (q->spv.logprobs >= 0)
        q->pub.logprobs[q->pub.n_output] = *o;
    int n_out = ++q->pub.n_output;
    q->pub.n_new_output = 1;
    if (q->prev_idx < 0) {
        q->prev_idx = e->n_prev;
        e->prev[e->n_prev++] = q;
    }
    if (q->pub.t_first_token == 0)
        q->pub.t_first_token = engine_now(e);
    e->st.generated_tokens++;
    changed_add(e, q);
    enum think_route route = think_push(&q->think, &e->think, t);
    if (q->gm && o != &forced && grammar_take(e, q, t, route)) /* a forced close is not the answer's */
        return;
    if (q->split) {
        q->pub.has_reasoning = q->think.seen;
        q->pub.n_reasoning_tokens = q->think.n_tokens;
    } else {
        route = THINK_ANSWER; /* tags and all in the text */
    }

    /* 1. EOS / stop ids: the id stays in tokens, its text is not added */
    if (n_out >= q->min_tokens && is_stop_id(e, q, t)) {
        finish(e, q, FINISH_STOP, NULL, true);
        return;
    }
    size_t old = q->full_len, rold = q->rfull_len;
    const char *piece;
    size_t len;
    char err[128];
    if (route == THINK_CLOSE) { /* the reasoning's last partial character, if any; the tag adds no text */
        tok_stream_flush(q->ts, &piece, &len);
        if (buf_append(&q->rfull, &q->rfull_len, &q->rfull_cap, piece, len)) {
            finish(e, q, FINISH_ERROR, "out of memory for the output text", false);
            return;
        }
    } else if (route == THINK_OPEN) {
        /* no text */
    } else if (q->gm && o == &forced) {
        /* the "\n\n" of a forced close: not part of an answer a grammar constrains */
    } else if (tok_stream_push(q->ts, t, &piece, &len, err, sizeof err) == 0) {
        if (full_append(q, piece, len)) {
            finish(e, q, FINISH_ERROR, "out of memory for the output text", false);
            return;
        }
    } else {
        log_debug("engine: token %d has no text: %s", (int)t, err); /* ids past the tokenizer's vocabulary */
    }
    /* 2. stop strings, once more than min_tokens tokens exist: on the answer, and on the reasoning
     * when the request asks */
    if (q->stop.n > 0 && n_out > q->min_tokens) {
        if (route == THINK_ANSWER) {
            long m = q->full ? stop_find(&q->stop, q->full, q->full_len, old) : -1;
            if (m >= 0) {
                q->full_len = (size_t)m;
                finish(e, q, FINISH_STOP, NULL, false);
                return;
            }
        } else if (route == THINK_REASONING && q->stop_in_reasoning) {
            long m = q->rfull ? stop_find(&q->stop, q->rfull, q->rfull_len, rold) : -1;
            if (m >= 0) {
                q->rfull_len = (size_t)m;
                finish(e, q, FINISH_STOP, NULL, false);
                return;
            }
        }
    }
    /* 3. max_tokens */
    if (n_out >= q->max_tokens) {
        finish(e, q, FINISH_LENGTH, NULL, true);
        return;
    }
    bool hold_reasoning =
        q->stop.n && q->rfull && q->stop_in_reasoning && q->split && q->think.phase == THINK_IN;
    if (publish(q, q->stop.n && q->full ? stop_visible_len(&q->stop, q->full, q->full_len) : q->full_len) ||
        publish_reasoning(q,
                          hold_reasoning ? stop_visible_len(&q->stop, q->rfull, q->rfull_len) : q->rfull_len))
        finish(e, q, FINISH_ERROR, "out of memory for the output text", false);
}

/* Finishes every unfinished seq whose deadline is at or before now with FINISH_TIMEOUT and finds
 * the next deadline. */
static void expire(struct engine *e, double now)
{
    double next = INFINITY;
    for (struct list_node *n = e->live.head; n; n = n->next) {
        struct eseq *q = LIST_ITEM(n, struct eseq, live);
        if (q->pub.finished || q->deadline <= 0)
            continue;
        if (now >= q->deadline) {
            char msg[96];
            snprintf(msg, sizeof msg, "the deadline passed after %d generated tokens", q->pub.n_output);
            finish(e, q, FINISH_TIMEOUT, msg, true);
        } else if (q->deadline < next) {
            next = q->deadline;
        }
    }
    e->next_deadline = next;
}

int engine_step(struct engine *e, struct engine_seq ***changed, int *n_changed)
{
    e->stamp++;
    e->n_changed = 0;
    clear_new_outputs(e);
    int ret = 0;

    while (e->n_cancels > 0) /* finish() takes each off the list */
        finish(e, e->cancels[0], FINISH_CANCELLED, NULL, true);
    if (e->next_deadline < INFINITY) { /* a released or finished seq's may be stale: expire finds out */
        double now = engine_now(e);
        if (now >= e->next_deadline)
            expire(e, now);
    }

    struct sched_out out;
    if (sched_schedule(e->s, &out))
        log_error("engine: out of memory while scheduling; running the part of the step that was planned");
    for (int i = 0; i < out.n_failed; i++) {
        struct eseq *q = out.failed[i]->user;
        finish(e, q, FINISH_ERROR, q->sq.error, true);
    }
    for (int i = 0; i < out.n_preempted; i++) {
        struct eseq *q = out.preempted[i]->user;
        q->pub.n_preemptions = q->sq.n_preemptions;
        q->admitted = false;
        e->st.preemptions++;
    }
    if (out.n_items == 0)
        goto done;

    for (int i = 0; i < out.n_items; i++) {
        const struct sched_item *it = &out.items[i];
        struct eseq *q = it->seq->user;
        struct be_seq *b = &e->bseq[i];
        b->tokens = q->pub.tokens;
        b->n_prompt = q->pub.n_prompt;
        b->n_tokens = q->sq.n_tokens;
        b->pos = it->pos;
        b->n_new = it->n_new;
        b->block_table = q->sq.kv.blocks;
        b->n_blocks = q->sq.kv.n_blocks;
        b->sample = it->sample;
        b->sp = &q->spv;
        bool ban = q->pub.n_output < q->min_tokens && q->n_banned > 0;
        b->banned = ban ? q->banned : NULL;
        b->n_banned = ban ? q->n_banned : 0;
        b->allowed = q->gm && b->sample ? grammar_mask(e, q) : NULL;
        if (!q->admitted) {
            q->admitted = true;
            e->st.cached_tokens += (uint64_t)q->sq.n_cached;
            if (e->o.enable_prefix_caching && q->sq.n_preemptions == 0) {
                e->st.prefix_query_tokens += (uint64_t)q->sq.n_tokens;
                e->st.prefix_hit_tokens += (uint64_t)q->sq.n_cached;
            } else if (e->o.enable_prefix_caching) {
                e->st.prefix_preempted_query_tokens += (uint64_t)q->sq.n_tokens;
                e->st.prefix_preempted_hit_tokens += (uint64_t)q->sq.n_cached;
            }
        }
    }
    if (e->on_start) { /* before the backend runs them: a crash in this step is theirs too */
        int n = 0;
        for (int i = 0; i < out.n_items; i++) {
            struct eseq *q = out.items[i].seq->user;
            if (!q->started) {
                q->started = true;
                e->starting[n++] = &q->pub;
            }
        }
        if (n)
            e->on_start(e->on_start_ctx, e->starting, n);
    }
    e->st.steps++;
    int brc = backend_step(e->be, e->bseq, out.n_items, e->bout);
    if (e->n_pend) { /* the backend did not ask for the masks: it failed, or cannot */
        for (int i = 0; i < e->n_pend && brc == 0; i++)
            if (!e->pend[i]->gerr)
                e->pend[i]->gerr =
                    strdup("internal: the backend sampled without asking for the grammar's mask");
        e->n_pend = 0;
    }
    if (brc) {
        char msg[sizeof e->be->err + 64];
        snprintf(msg, sizeof msg, "backend %s: %s", backend_name(e->be), e->be->err);
        log_error("engine: step of %d sequences failed: %s", out.n_items, msg);
        for (int i = 0; i < out.n_items; i++)
            finish(e, out.items[i].seq->user, FINISH_ERROR, msg, true);
        ret = -1;
        goto done;
    }
    sched_commit(e->s, &out);
    e->st.computed_tokens += (uint64_t)out.n_tokens;
    for (int i = 0; i < out.n_items; i++)
        e->st.lane_computed_tokens[out.items[i].seq->lane] += (uint64_t)out.items[i].n_new;
    for (int i = 0; i < out.n_items; i++)
        if (out.items[i].sample)
            on_token(e, out.items[i].seq->user, &e->bout[i]);
done:
    *changed = e->changed;
    *n_changed = e->n_changed;
    return ret;
}

void engine_set_on_start(struct engine *e, engine_start_fn fn, void *ctx)
{
    e->on_start = fn;
    e->on_start_ctx = ctx;
}

void engine_cancel(struct engine *e, struct engine_seq *s)
{
    struct eseq *q = (struct eseq *)s;
    if (!q || q->pub.finished || q->cancel)
        return;
    q->cancel = true;
    e->cancels[e->n_cancels++] = q; /* capacity >= live seqs */
}

void engine_release(struct engine *e, struct engine_seq *s)
{
    struct eseq *q = (struct eseq *)s;
    if (!q)
        return;
    if (q->cancel)
        cancels_remove(e, q);
    if (q->prev_idx >= 0)
        e->prev[q->prev_idx] = NULL;
    sched_finish(e->s, &q->sq);
    list_remove(&e->live, &q->live);
    seq_free(q);
}
