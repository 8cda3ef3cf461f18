/* The plan of `llmq bench --workload mapreduce` (bench_mapreduce.h). */
#include "worker/cli/bench_mapreduce.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/jobs/summary_tree.h"

#define KEY_MAP_TEMPLATE 0xfffffff0u /* the "document" whose ids are the map template */
#define KEY_REDUCE_TEMPLATE 0xfffffff1u
#define KEY_SEP 0xfffffff2u

struct bench_mr {
    struct bench_mr_opts o;
    int n_chunks, depth;    /* per document; depth as summary_depth predicts */
    int *width, *base;      /* [depth]: slots of a level, and the first of them in a document */
    int per_doc, n_slots;   /* slots of a document, of all */
    int32_t *out;           /* [n_slots][out_len]: each slot's summary */
    int *out_n;             /* [n_slots]: its length */
    int *lo, *hi;           /* [n_slots]: a reduce slot's members, slots [lo, hi) of the level before */
    unsigned char *state;   /* [n_slots]: 0 not made, 1 ready, 2 submitted, 3 finished */
    int *ready, head, tail; /* FIFO of ready slots (each enters once) */
    int *lens, *ends;       /* [n_chunks]: summary_groups' scratch */
    int *left;              /* [docs]: requests of a document's running level not finished */
    double *t_docs;         /* [docs]: when its last summary came; 0 before */
    int docs_done, max_depth;
    struct bench_mr_level levels[32];
    int n_levels;
};

/* Document `doc`'s id at position pos: a hash of (seed, doc, pos), so that neighbouring chunks share
 * their overlap without the documents being stored. */
static int32_t doc_id(const struct bench_mr *m, uint32_t doc, uint32_t pos)
{
    uint64_t z = m->o.seed * 0xd1b54a32d192ed03ull + ((uint64_t)doc << 32 | pos) + 0x632be59bd9b4e019ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (int32_t)(z % (uint64_t)m->o.vocab);
}

void bench_mr_free(struct bench_mr *m)
{
    if (!m)
        return;
    free(m->width);
    free(m->base);
    free(m->out);
    free(m->out_n);
    free(m->lo);
    free(m->hi);
    free(m->state);
    free(m->ready);
    free(m->lens);
    free(m->ends);
    free(m->left);
    free(m->t_docs);
    free(m);
}

struct bench_mr *bench_mr_new(const struct bench_mr_opts *o, char *err, size_t errlen)
{
    if (o->docs < 1 || o->doc_len < 1 || o->chunk < 1 || o->out_len < 1 || o->vocab < 1) {
        snprintf(err, errlen, "documents, their length, the chunk and the summary length must be >= 1");
        return NULL;
    }
    if (o->overlap < 0 || o->overlap >= o->chunk) {
        snprintf(err, errlen, "the overlap (%d tokens) must be below the chunk (%d tokens)", o->overlap,
                 o->chunk);
        return NULL;
    }
    int step = o->chunk - o->overlap;
    long long chunks = o->doc_len <= o->chunk ? 1 : (o->doc_len - o->overlap + (long long)step - 1) / step;
    int depth = summary_depth((int)chunks, o->out_len, BENCH_MR_SEP_TOKENS, o->budget);
    if (depth < 1 || depth > 32) {
        snprintf(err, errlen,
                 "two summaries of %d tokens and %d separator tokens do not fit a reduce prompt's %d tokens "
                 "(max_model_len less the output and a %d-token template)",
                 o->out_len, BENCH_MR_SEP_TOKENS, o->budget, BENCH_MR_TEMPLATE_TOKENS);
        return NULL;
    }
    struct bench_mr *m = calloc(1, sizeof *m);
    if (!m)
        goto oom;
    m->o = *o;
    m->n_chunks = (int)chunks;
    m->depth = depth;
    m->width = calloc((size_t)depth, sizeof *m->width);
    m->base = calloc((size_t)depth, sizeof *m->base);
    if (!m->width || !m->base)
        goto oom;
    for (int l = 0; l < depth; l++) {
        m->width[l] = summary_level_width(m->n_chunks, o->out_len, BENCH_MR_SEP_TOKENS, o->budget, l);
        m->base[l] = m->per_doc;
        m->per_doc += m->width[l];
    }
    if ((long long)m->per_doc * o->docs > 1 << 28) {
        snprintf(err, errlen, "%d documents of %d chunks are too many requests", o->docs, m->n_chunks);
        bench_mr_free(m);
        return NULL;
    }
    size_t n = (size_t)m->per_doc * (size_t)o->docs;
    m->n_slots = (int)n;
    m->out = malloc(n * (size_t)o->out_len * sizeof *m->out);
    m->out_n = calloc(n, sizeof *m->out_n);
    m->lo = calloc(n, sizeof *m->lo);
    m->hi = calloc(n, sizeof *m->hi);
    m->state = calloc(n, 1);
    m->ready = malloc(n * sizeof *m->ready);
    m->lens = malloc((size_t)m->n_chunks * sizeof *m->lens);
    m->ends = malloc((size_t)m->n_chunks * sizeof *m->ends);
    m->left = calloc((size_t)o->docs, sizeof *m->left);
    m->t_docs = calloc((size_t)o->docs, sizeof *m->t_docs);
    if (!m->out || !m->out_n || !m->lo || !m->hi || !m->state || !m->ready || !m->lens || !m->ends ||
        !m->left || !m->t_docs)
        goto oom;
    for (int d = 0; d < o->docs; d++) { /* the map level, document by document */
        m->left[d] = m->n_chunks;
        for (int c = 0; c < m->n_chunks; c++) {
            int s = d * m->per_doc + c;
            m->state[s] = 1;
            m->ready[m->tail++] = s;
        }
    }
    m->n_levels = 1;
    return m;
oom:
    bench_mr_free(m);
    snprintf(err, errlen, "out of memory for the map-reduce plan");
    return NULL;
}

int bench_mr_slots(const struct bench_mr *m)
{
    return m->n_slots;
}

int bench_mr_chunks(const struct bench_mr *m)
{
    return m->n_chunks;
}

int bench_mr_predicted_depth(const struct bench_mr *m)
{
    return m->depth;
}

int bench_mr_max_prompt(const struct bench_mr *m)
{
    return BENCH_MR_TEMPLATE_TOKENS + (m->o.chunk > m->o.budget ? m->o.chunk : m->o.budget);
}

/* The level of slot s (within its document). */
static int slot_level(const struct bench_mr *m, int s)
{
    int r = s % m->per_doc, l = 0;
    while (l + 1 < m->depth && r >= m->base[l + 1])
        l++;
    return l;
}

int bench_mr_next(struct bench_mr *m, int32_t *prompt, int *n_prompt)
{
    if (m->head == m->tail)
        return -1;
    int s = m->ready[m->head++], d = s / m->per_doc, l = slot_level(m, s), g = s % m->per_doc - m->base[l];
    int n = 0;
    for (int i = 0; i < BENCH_MR_TEMPLATE_TOKENS; i++)
        prompt[n++] = doc_id(m, l ? KEY_REDUCE_TEMPLATE : KEY_MAP_TEMPLATE, (uint32_t)i);
    if (l == 0) { /* chunk g of document d */
        int start = g * (m->o.chunk - m->o.overlap), end = start + m->o.chunk;
        end = end < m->o.doc_len ? end : m->o.doc_len;
        for (int p = start; p < end; p++)
            prompt[n++] = doc_id(m, (uint32_t)d, (uint32_t)p);
    } else { /* the group's summaries, separators between two */
        for (int c = m->lo[s]; c < m->hi[s]; c++) {
            for (int i = 0; c > m->lo[s] && i < BENCH_MR_SEP_TOKENS; i++)
                prompt[n++] = doc_id(m, KEY_SEP, (uint32_t)i);
            memcpy(prompt + n, m->out + (size_t)c * m->o.out_len, (size_t)m->out_n[c] * sizeof *prompt);
            n += m->out_n[c];
        }
    }
    m->state[s] = 2;
    m->levels[l].requests++;
    m->levels[l].prompt_tokens += n;
    *n_prompt = n;
    return s;
}

/* Document d's level l, its n summaries, is done: their groups become the next level's requests. */
static int next_level(struct bench_mr *m, int d, int l, int n, char *err, size_t errlen)
{
    int first = d * m->per_doc + m->base[l];
    for (int i = 0; i < n; i++)
        m->lens[i] = m->out_n[first + i];
    int g = summary_groups(m->lens, n, BENCH_MR_SEP_TOKENS, m->o.budget, m->ends);
    if (g < 1 || l + 1 >= m->depth || g > m->width[l + 1]) { /* cannot be: summaries <= out_len */
        snprintf(err, errlen, "document %d: level %d's %d summaries do not group as planned", d, l, n);
        return -1;
    }
    for (int k = 0; k < g; k++) {
        int s = d * m->per_doc + m->base[l + 1] + k;
        m->lo[s] = first + (k ? m->ends[k - 1] : 0);
        m->hi[s] = first + m->ends[k];
        m->state[s] = 1;
        m->ready[m->tail++] = s;
    }
    m->left[d] = g;
    if (m->n_levels < l + 2)
        m->n_levels = l + 2;
    return 0;
}

int bench_mr_finished(struct bench_mr *m, int slot, const int32_t *out, int n_out, double t, char *err,
                      size_t errlen)
{
    if (slot < 0 || slot >= m->n_slots || m->state[slot] != 2) {
        snprintf(err, errlen, "request slot %d was not running", slot);
        return -1;
    }
    if (n_out < 0 || n_out > m->o.out_len) {
        snprintf(err, errlen, "a summary of %d tokens (at most %d)", n_out, m->o.out_len);
        return -1;
    }
    int d = slot / m->per_doc, l = slot_level(m, slot);
    memcpy(m->out + (size_t)slot * m->o.out_len, out, (size_t)n_out * sizeof *out);
    m->out_n[slot] = n_out;
    m->state[slot] = 3;
    m->levels[l].finished++;
    m->levels[l].output_tokens += n_out;
    if (t > m->levels[l].t_end)
        m->levels[l].t_end = t;
    if (--m->left[d] > 0)
        return 0;
    int n = 0;
    while (n < m->width[l] && m->state[d * m->per_doc + m->base[l] + n] == 3)
        n++;
    if (n > 1)
        return next_level(m, d, l, n, err, errlen);
    m->t_docs[d] = t; /* one summary left: the document's */
    m->docs_done++;
    if (l + 1 > m->max_depth)
        m->max_depth = l + 1;
    return 0;
}

int bench_mr_levels(const struct bench_mr *m, const struct bench_mr_level **lv)
{
    *lv = m->levels;
    return m->n_levels;
}

int bench_mr_docs_done(const struct bench_mr *m, const double **t)
{
    *t = m->t_docs;
    return m->docs_done;
}

int bench_mr_depth(const struct bench_mr *m)
{
    return m->max_depth;
}
