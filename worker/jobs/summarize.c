/* See summarize.h. */
#include "worker/jobs/summarize.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat_template.h"
#include "engine/tokenizer.h"
#include "engine/util/array.h"
#include "engine/util/buf.h"
#include "engine/util/errfmt.h"
#include "engine/util/hash.h"
#include "worker/jobs/chunker.h"
#include "worker/jobs/grammar_cache.h"
#include "worker/jobs/result.h"
#include "worker/jobs/summary_tree.h"
#include "worker/jobs/template.h"

/* Tokens kept free in every part's context besides the template and the output: a rendered part
 * does not tokenize to exactly the sum of its pieces ({part} and {parts} grow with the count,
 * merges across a seam). */
#define SUM_MARGIN 16
/* The default overlap: a chunk's eighth, at most this many tokens. */
#define SUM_OVERLAP_MAX 128

struct restored {
    int level, index, first, last;
    char *output;
    size_t output_len;
    int prompt_tokens, completion_tokens;
    enum finish_reason finish;
    bool used;
};

struct level {
    struct sum_part *parts;
    int n, n_committed;
};

struct sum_job {
    const struct job *job;
    const struct tok *tok;
    const struct chat_template *ct;
    int max_model_len;
    int part_max, root_max; /* max_tokens of an inner part and of the root */
    int chunk_tokens, overlap_tokens;
    int reduce_budget; /* tokens a reduce step's summaries may take */
    struct doc_chunk *chunks;
    int n_chunks;
    struct level levels[SUM_MAX_LEVELS];
    int n_levels;
    int next; /* sum_next's place in the last level */
    struct restored *restored;
    size_t n_restored, cap_restored;
    char plan[SUM_PLAN_LEN + 1];
};

/* ---- rendering a part */

/* The text of a part: its template rendered with the job's vars and the part's. */
static int render_text(const struct sum_job *s, int level, int index, int count, const char *doc, size_t len,
                       char **out, char *err, size_t errlen)
{
    const struct job_summarize *js = s->job->summarize;
    json_t *vars = js->vars ? json_deep_copy(js->vars) : json_object();
    if (!vars || json_object_set_new(vars, "document", json_stringn(doc, len)) ||
        json_object_set_new(vars, "part", json_integer(index + 1)) ||
        json_object_set_new(vars, "parts", json_integer(count)) ||
        json_object_set_new(vars, "level", json_integer(level))) {
        json_decref(vars);
        errfmt(err, errlen, "out of memory");
        return JOB_ERR_INTERNAL;
    }
    const char *name = level == 0 ? js->map_template : js->reduce_template;
    char var[TMPL_MAX_NAME + 1], msg[256];
    int rc = tmpl_render(level == 0 ? js->map_text : js->reduce_text, vars, out, var, msg, sizeof msg);
    json_decref(vars);
    if (rc == TMPL_ERR_NOMEM) {
        errfmt(err, errlen, "out of memory");
        return JOB_ERR_INTERNAL;
    }
    if (rc == TMPL_ERR_MISSING) {
        errfmt(err, errlen, "field 'vars': template '%s' needs '%s'", name, var);
        return JOB_ERR_INVALID;
    }
    if (rc) {
        errfmt(err, errlen, "template '%s': %s", name, msg);
        return JOB_ERR_INVALID;
    }
    return 0;
}

/* The request of a text: the job's, with the text as one user message (or the prompt without a
 * chat template), max_tokens and no constraint unless it is the root. */
static int prepare_text(const struct sum_job *s, const char *text, int max_tokens, bool root,
                        int max_model_len, struct job_input *in, char *err, size_t errlen)
{
    struct job tmp = *s->job;
    tmp.summarize = NULL;
    tmp.prompt = NULL;
    tmp.prompt_ids = NULL;
    tmp.n_prompt_ids = 0;
    tmp.messages = NULL;
    tmp.max_tokens = max_tokens;
    tmp.max_tokens_given = true;
    tmp.truncate = JOB_TRUNCATE_NONE; /* parts are sized to fit */
    if (!root)
        memset(&tmp.constraint, 0, sizeof tmp.constraint);
    json_t *msgs = NULL;
    if (s->ct) {
        msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", text);
        if (!msgs) {
            memset(in, 0, sizeof *in);
            errfmt(err, errlen, "out of memory");
            return JOB_ERR_INTERNAL;
        }
        tmp.messages = msgs;
        tmp.chat = true;
    } else {
        tmp.prompt = (char *)text;
    }
    int rc = job_prepare(&tmp, s->tok, s->ct, max_model_len, in, err, errlen);
    json_decref(msgs);
    return rc;
}

/* Prompt tokens of a level's template around an empty document. */
static int overhead(const struct sum_job *s, int level, int *tokens, char *err, size_t errlen)
{
    char *text = NULL;
    int rc = render_text(s, level, 0, 1, "", 0, &text, err, errlen);
    if (rc)
        return rc;
    struct job_input in;
    rc = prepare_text(s, text, 1, false, 0, &in, err, errlen);
    free(text);
    *tokens = in.n_tokens;
    job_input_free(&in);
    return rc;
}

/* ---- levels */

static void trim(const char **p, size_t *len)
{
    while (*len && strchr(" \t\r\n", (*p)[0]))
        (*p)++, (*len)--;
    while (*len && strchr(" \t\r\n", (*p)[*len - 1]))
        (*len)--;
}

static int set_output(const struct sum_job *s, struct sum_part *p, const char *text, size_t len)
{
    trim(&text, &len);
    char *out = malloc(len + 1);
    if (!out)
        return -1;
    memcpy(out, text, len);
    out[len] = 0;
    int32_t *ids = NULL;
    size_t n = 0;
    char err[128];
    if (tok_encode_ex(s->tok, out, len, false, &ids, &n, err, sizeof err)) {
        free(out);
        return -1;
    }
    free(ids);
    free(p->output);
    p->output = out;
    p->output_len = len;
    p->output_tokens = (int)n;
    return 0;
}

/* Marks the parts of the newest level that a stored row has as committed. */
static int apply_restored(struct sum_job *s)
{
    struct level *lv = &s->levels[s->n_levels - 1];
    for (size_t i = 0; i < s->n_restored; i++) {
        struct restored *r = &s->restored[i];
        if (r->used || r->level != s->n_levels - 1 || r->index < 0 || r->index >= lv->n)
            continue;
        struct sum_part *p = &lv->parts[r->index];
        if (p->root || p->state != SUM_TODO || p->first != r->first || p->last != r->last)
            continue;
        if (set_output(s, p, r->output, r->output_len))
            return -1;
        r->used = true;
        p->restored = true;
        p->prompt_tokens = r->prompt_tokens;
        p->completion_tokens = r->completion_tokens;
        p->finish = r->finish;
        p->state = SUM_COMMITTED;
        lv->n_committed++;
    }
    return 0;
}

static struct level *new_level(struct sum_job *s, int n)
{
    if (s->n_levels == SUM_MAX_LEVELS)
        return NULL;
    struct level *lv = &s->levels[s->n_levels];
    lv->parts = calloc((size_t)n, sizeof *lv->parts);
    if (!lv->parts)
        return NULL;
    lv->n = n;
    lv->n_committed = 0;
    for (int i = 0; i < n; i++) {
        lv->parts[i].level = s->n_levels;
        lv->parts[i].index = i;
        lv->parts[i].root = n == 1;
    }
    s->n_levels++;
    s->next = 0;
    return lv;
}

/* The level after a complete one (every part committed). */
static int next_level(struct sum_job *s, char *err, size_t errlen)
{
    for (;;) {
        const struct level *below = &s->levels[s->n_levels - 1];
        if (below->n_committed < below->n || below->n == 1)
            return 0;
        int *lens = malloc((size_t)below->n * sizeof *lens), *ends = malloc((size_t)below->n * sizeof *ends);
        if (!lens || !ends) {
            free(lens);
            free(ends);
            errfmt(err, errlen, "out of memory");
            return JOB_ERR_INTERNAL;
        }
        for (int i = 0; i < below->n; i++)
            lens[i] = below->parts[i].output_tokens;
        int ng = summary_groups(lens, below->n, SUM_SEP, s->reduce_budget, ends);
        free(lens);
        struct level *lv = ng > 0 ? new_level(s, ng) : NULL;
        if (!lv) {
            free(ends);
            if (ng <= 0)
                errfmt(err, errlen, "level %d: two summaries do not fit one reduce step (%d tokens)",
                       s->n_levels - 1, s->reduce_budget);
            else
                errfmt(err, errlen, "the summary tree is deeper than %d levels", SUM_MAX_LEVELS);
            return ng <= 0 ? JOB_ERR_CONTEXT : JOB_ERR_INTERNAL;
        }
        below = &s->levels[s->n_levels - 2];
        for (int g = 0, start = 0; g < ng; start = ends[g++]) {
            struct sum_part *p = &lv->parts[g];
            p->first = start;
            p->last = ends[g] - 1;
            p->doc_start = below->parts[start].doc_start;
            p->doc_end = below->parts[ends[g] - 1].doc_end;
        }
        free(ends);
        if (apply_restored(s)) {
            errfmt(err, errlen, "out of memory");
            return JOB_ERR_INTERNAL;
        }
    }
}

/* ---- the plan */

static void plan_id(struct sum_job *s)
{
    const struct job *j = s->job;
    const struct job_summarize *js = j->summarize;
    uint64_t h = fnv1a(FNV1A_INIT, js->document, js->document_len);
    h = fnv1a_str(h, js->map_text);
    h = fnv1a(h, "", 1);
    h = fnv1a_str(h, js->reduce_text);
    json_t *params = job_params_json(j);
    char *p = params ? json_dumps(params, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    h = fnv1a_str(h, p);
    free(p);
    json_decref(params);
    char *vars = js->vars ? json_dumps(js->vars, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    h = fnv1a_str(h, vars);
    free(vars);
    int32_t sizes[] = {s->chunk_tokens,  s->overlap_tokens,      s->part_max,   s->root_max,
                       s->reduce_budget, tok_vocab_size(s->tok), s->ct != NULL, j->enable_thinking};
    h = fnv1a(h, sizes, sizeof sizes);
    snprintf(s->plan, sizeof s->plan, "%016llx", (unsigned long long)h);
}

int sum_open(const struct job *j, const struct tok *tok, const struct chat_template *ct, int max_model_len,
             struct sum_job **out, char *err, size_t errlen)
{
    *out = NULL;
    const struct job_summarize *js = j->summarize;
    if (!js) {
        errfmt(err, errlen, "not a summarize job");
        return JOB_ERR_INVALID;
    }
    struct sum_job *s = calloc(1, sizeof *s);
    if (!s) {
        errfmt(err, errlen, "out of memory");
        return JOB_ERR_INTERNAL;
    }
    s->job = j;
    s->tok = tok;
    s->ct = ct && chat_template_present(ct) ? ct : NULL;
    s->max_model_len = max_model_len;
    s->root_max = j->max_tokens;
    s->part_max = js->max_tokens > 0 ? js->max_tokens : j->max_tokens;
    int out_max = s->part_max > s->root_max ? s->part_max : s->root_max;
    int map_over = 0, reduce_over = 0;
    int rc = overhead(s, 0, &map_over, err, errlen);
    if (!rc)
        rc = overhead(s, 1, &reduce_over, err, errlen);
    if (rc) {
        sum_free(s);
        return rc;
    }
    long long room = (long long)max_model_len - map_over - out_max - SUM_MARGIN;
    if (room < 16) {
        errfmt(err, errlen,
               "max_model_len is %d: no room for a chunk after the map template (%d tokens), the output "
               "(max_tokens %d) and a margin of %d",
               max_model_len, map_over, out_max, SUM_MARGIN);
        sum_free(s);
        return JOB_ERR_CONTEXT;
    }
    if (js->chunk_tokens > room) {
        errfmt(
            err, errlen,
            "field 'summarize.chunk_tokens': %d does not fit: max_model_len %d leaves %lld tokens after the "
            "map template (%d), the output (max_tokens %d) and a margin of %d",
            js->chunk_tokens, max_model_len, room, map_over, out_max, SUM_MARGIN);
        sum_free(s);
        return JOB_ERR_INVALID;
    }
    s->chunk_tokens = js->chunk_tokens > 0 ? js->chunk_tokens : (int)room;
    s->overlap_tokens = js->overlap_tokens;
    if (s->overlap_tokens < 0) {
        s->overlap_tokens = s->chunk_tokens / 8;
        if (s->overlap_tokens > SUM_OVERLAP_MAX)
            s->overlap_tokens = SUM_OVERLAP_MAX;
    }
    if (2 * s->overlap_tokens >= s->chunk_tokens) {
        errfmt(err, errlen, "field 'summarize.overlap_tokens': %d is half a chunk (%d tokens) or more",
               s->overlap_tokens, s->chunk_tokens);
        sum_free(s);
        return JOB_ERR_INVALID;
    }
    long long budget = (long long)max_model_len - reduce_over - out_max - SUM_MARGIN;
    if (budget < 2LL * (s->part_max + SUM_SEP)) {
        errfmt(
            err, errlen,
            "max_model_len is %d: a reduce step must hold two summaries of summarize.max_tokens %d besides "
            "the reduce template (%d tokens) and the output (max_tokens %d)",
            max_model_len, s->part_max, reduce_over, out_max);
        sum_free(s);
        return JOB_ERR_CONTEXT;
    }
    s->reduce_budget = budget > INT32_MAX ? INT32_MAX : (int)budget;
    if (chunk_document(tok, js->document, js->document_len, s->chunk_tokens, s->overlap_tokens, &s->chunks,
                       &s->n_chunks, err, errlen)) {
        sum_free(s);
        return JOB_ERR_INVALID;
    }
    struct level *lv = s->n_chunks > 0 ? new_level(s, s->n_chunks) : NULL;
    if (!lv) {
        if (s->n_chunks > 0)
            errfmt(err, errlen, "out of memory");
        else
            errfmt(err, errlen, "field 'document': no text to summarize");
        sum_free(s);
        return s->n_chunks > 0 ? JOB_ERR_INTERNAL : JOB_ERR_INVALID;
    }
    for (int i = 0; i < s->n_chunks; i++) {
        lv->parts[i].first = lv->parts[i].last = i;
        lv->parts[i].doc_start = s->chunks[i].start;
        lv->parts[i].doc_end = s->chunks[i].end;
    }
    plan_id(s);
    *out = s;
    return 0;
}

void sum_free(struct sum_job *s)
{
    if (!s)
        return;
    for (int l = 0; l < s->n_levels; l++) {
        for (int i = 0; i < s->levels[l].n; i++)
            free(s->levels[l].parts[i].output);
        free(s->levels[l].parts);
    }
    for (size_t i = 0; i < s->n_restored; i++)
        free(s->restored[i].output);
    free(s->restored);
    free(s->chunks);
    free(s);
}

const char *sum_plan_id(const struct sum_job *s)
{
    return s->plan;
}

int sum_restore(struct sum_job *s, int level, int index, int first, int last, const char *output, size_t len,
                int prompt_tokens, int completion_tokens, enum finish_reason finish)
{
    if (array_reserve(&s->restored, &s->cap_restored, s->n_restored + 1, sizeof *s->restored, 16))
        return -1;
    char *copy = malloc(len + 1);
    if (!copy)
        return -1;
    memcpy(copy, output, len);
    copy[len] = 0;
    s->restored[s->n_restored++] = (struct restored){
        level, index, first, last, copy, len, prompt_tokens, completion_tokens, finish, false};
    /* the newest level may take it now; later levels as they are made */
    if (level == s->n_levels - 1 && apply_restored(s))
        return -1;
    char err[64];
    return next_level(s, err, sizeof err) == 0 ? 0 : -1;
}

struct sum_part *sum_next(struct sum_job *s)
{
    struct level *lv = &s->levels[s->n_levels - 1];
    while (s->next < lv->n && lv->parts[s->next].state != SUM_TODO)
        s->next++;
    if (s->next == lv->n)
        return NULL;
    struct sum_part *p = &lv->parts[s->next++];
    p->state = SUM_RUNNING;
    return p;
}

int sum_prepare(struct sum_job *s, const struct sum_part *p, struct job_input *in, char *err, size_t errlen)
{
    const struct level *lv = &s->levels[p->level];
    char *text = NULL;
    int rc;
    if (p->level == 0) {
        const struct doc_chunk *c = &s->chunks[p->first];
        rc = render_text(s, 0, p->index, lv->n, s->job->summarize->document + c->start, c->end - c->start,
                         &text, err, errlen);
    } else {
        const struct level *below = &s->levels[p->level - 1];
        struct buf b = {0};
        for (int i = p->first; i <= p->last; i++) {
            if (i > p->first)
                buf_puts(&b, "\n\n");
            buf_append(&b, below->parts[i].output, below->parts[i].output_len);
        }
        if (b.oom) {
            buf_free(&b);
            memset(in, 0, sizeof *in);
            errfmt(err, errlen, "out of memory");
            return JOB_ERR_INTERNAL;
        }
        rc = render_text(s, p->level, p->index, lv->n, b.p ? b.p : "", b.len, &text, err, errlen);
        buf_free(&b);
    }
    if (rc) {
        memset(in, 0, sizeof *in);
        return rc;
    }
    rc = prepare_text(s, text, p->root ? s->root_max : s->part_max, p->root, s->max_model_len, in, err,
                      errlen);
    free(text);
    return rc;
}

int sum_done(struct sum_job *s, struct sum_part *p, const char *text, size_t len, int prompt_tokens,
             int completion_tokens, enum finish_reason finish)
{
    if (set_output(s, p, text ? text : "", text ? len : 0))
        return -1;
    p->prompt_tokens = prompt_tokens;
    p->completion_tokens = completion_tokens;
    p->finish = finish;
    p->state = SUM_DONE;
    return 0;
}

int sum_committed(struct sum_job *s, struct sum_part *p, char *err, size_t errlen)
{
    if (p->state == SUM_COMMITTED)
        return 0;
    p->state = SUM_COMMITTED;
    s->levels[p->level].n_committed++;
    return next_level(s, err, errlen);
}

const struct sum_part *sum_root(const struct sum_job *s)
{
    const struct level *lv = &s->levels[s->n_levels - 1];
    return lv->n == 1 ? &lv->parts[0] : NULL;
}

bool sum_finished(const struct sum_job *s)
{
    const struct sum_part *r = sum_root(s);
    return r && r->state >= SUM_DONE;
}

int sum_n_parts(const struct sum_job *s)
{
    int n = 0;
    for (int l = 0; l < s->n_levels; l++)
        n += s->levels[l].n;
    return n;
}

struct sum_part *sum_part_at(struct sum_job *s, int i)
{
    for (int l = 0; l < s->n_levels; l++) {
        if (i < s->levels[l].n)
            return &s->levels[l].parts[i];
        i -= s->levels[l].n;
    }
    return NULL;
}

void sum_get_totals(const struct sum_job *s, struct sum_totals *t)
{
    memset(t, 0, sizeof *t);
    t->chunks = s->n_chunks;
    t->chunk_tokens = s->chunk_tokens;
    t->overlap_tokens = s->overlap_tokens;
    t->reduce_budget = s->reduce_budget;
    for (int i = 0; i < s->n_chunks; i++)
        t->document_tokens += s->chunks[i].n_tokens;
    t->depth = s->n_levels;
    t->level = s->n_levels - 1;
    for (int l = 0; l < s->n_levels; l++)
        for (int i = 0; i < s->levels[l].n; i++) {
            const struct sum_part *p = &s->levels[l].parts[i];
            t->parts_total++;
            if (p->state < SUM_DONE)
                continue;
            t->parts_done++;
            t->parts_restored += p->restored;
            t->prompt_tokens += p->prompt_tokens;
            t->completion_tokens += p->completion_tokens;
            t->any_length = t->any_length || p->finish == FINISH_LENGTH;
        }
    /* the levels still to come, at most: every summary max-long */
    const struct level *last = &s->levels[s->n_levels - 1];
    int n = last->n;
    while (n > 1) {
        int per = s->reduce_budget / (s->part_max + SUM_SEP);
        per = per < 2 ? 2 : per;
        n = (n + per - 1) / per;
        t->parts_total += n;
    }
}

void sum_result(const struct sum_job *s, enum finish_reason how, struct res_output *o)
{
    struct sum_totals t;
    sum_get_totals(s, &t);
    const struct sum_part *root = sum_root(s);
    bool answered = (how == FINISH_STOP || how == FINISH_LENGTH) && root && root->output;
    o->finish = answered && t.any_length ? FINISH_LENGTH : how;
    o->text = answered ? root->output : "";
    o->text_len = answered ? root->output_len : 0;
    o->prompt_tokens = t.prompt_tokens > INT32_MAX ? INT32_MAX : (int)t.prompt_tokens;
    o->completion_tokens = t.completion_tokens > INT32_MAX ? INT32_MAX : (int)t.completion_tokens;
    o->chunks = t.chunks;
    o->depth = t.depth;
}

int sum_start_parts(struct sum_job *s, const struct sum_start *st, int *started, char *err, size_t errlen)
{
    for (struct sum_part *p; (p = sum_next(s));) {
        struct job_input in;
        int rc = sum_prepare(s, p, &in, err, errlen);
        struct sum_run *r = rc ? NULL : calloc(1, sizeof *r);
        if (!rc && !r)
            rc = errfmt_rc(err, errlen, JOB_ERR_INTERNAL, "out of memory");
        if (!rc) {
            in.req.lane = st->lane ? st->lane(st->lane_ctx, in.n_tokens, in.req.max_tokens) : 0;
            in.req.user = r;
            in.req.deadline = st->deadline;
            in.req.isolated = st->isolated;
            if (p->root)
                rc = grammar_cache_for_job(st->grammars, s->job, st->eng, &in.req.grammar, err, errlen);
            r->seq = rc ? NULL : engine_add(st->eng, &in.req, err, errlen);
            if (!rc && !r->seq)
                rc = JOB_ERR_ENGINE;
        }
        job_input_free(&in);
        if (rc) {
            free(r);
            return rc;
        }
        r->owner = st->owner;
        r->part = p;
        p->user = r;
        (*started)++;
    }
    return 0;
}

int sum_stop_parts(struct sum_job *s, struct engine *e)
{
    int n = 0;
    for (int l = 0; s && l < s->n_levels; l++)
        for (int i = 0; i < s->levels[l].n; i++) {
            struct sum_part *p = &s->levels[l].parts[i];
            struct sum_run *r = p->user;
            if (!r)
                continue;
            engine_cancel(e, r->seq);
            r->seq->user = NULL;
            free(r);
            p->user = NULL;
            n++;
        }
    return n;
}
