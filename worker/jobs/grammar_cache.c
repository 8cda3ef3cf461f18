/* Compiled grammars of job constraints, least recently used evicted (worker/jobs/grammar_cache.h). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "engine/util/buf.h"
#include "engine/util/hash.h"
#include "worker/jobs/grammar_cache.h"
#include "worker/jobs/job.h"

struct entry {
    char *key; /* the constraint's canonical text (below) */
    size_t key_len;
    uint64_t hash;
    const struct gr_vocab *vocab;
    struct grammar *g; /* one reference */
    uint64_t used;     /* the tick of its last use */
};

struct grammar_cache {
    struct entry e[GRAMMAR_CACHE_SIZE];
    int n;
    uint64_t tick;
    unsigned long long compiled, hits;
};

struct grammar_cache *grammar_cache_new(void)
{
    return calloc(1, sizeof(struct grammar_cache));
}

void grammar_cache_free(struct grammar_cache *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n; i++) {
        free(c->e[i].key);
        gr_unref(c->e[i].g);
    }
    free(c);
}

/* The canonical text of k: its kind, then the schema's text with sorted keys, the regex, or each
 * choice preceded by its length; malloc'd, NULL when out of memory. */
static char *key_of(const struct job_constraint *k, size_t *len)
{
    struct buf b = {0};
    buf_printf(&b, "%d:", (int)k->kind);
    if (k->kind == JOB_CONSTRAINT_JSON_SCHEMA) {
        char *t = json_dumps(k->schema, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
        if (t)
            buf_puts(&b, t);
        else
            b.oom = true;
        free(t);
    } else if (k->kind == JOB_CONSTRAINT_REGEX) {
        buf_puts(&b, k->regex);
    } else if (k->kind == JOB_CONSTRAINT_CHOICE) {
        for (size_t i = 0; i < k->n_choices; i++)
            buf_printf(&b, "%zu:%s", strlen(k->choices[i]), k->choices[i]);
    }
    *len = b.len;
    return buf_take(&b);
}

static struct grammar *compile(const struct job_constraint *k, const struct gr_vocab *v, char *err,
                               size_t errlen)
{
    switch (k->kind) {
    case JOB_CONSTRAINT_JSON_SCHEMA: {
        struct js_schema *s = js_compile(k->schema, err, errlen);
        struct grammar *g = s ? gr_compile_schema(s, v, err, errlen) : NULL;
        js_free(s);
        return g;
    }
    case JOB_CONSTRAINT_JSON_OBJECT:
        return gr_compile_json_object(v, err, errlen);
    case JOB_CONSTRAINT_REGEX:
        return gr_compile_regex(k->regex, v, err, errlen);
    case JOB_CONSTRAINT_CHOICE:
        return gr_compile_choice((const char *const *)k->choices, k->n_choices, v, err, errlen);
    default:
        snprintf(err, errlen, "no constraint to compile");
        return NULL;
    }
}

struct grammar *grammar_cache_get(struct grammar_cache *c, const struct job_constraint *k,
                                  const struct gr_vocab *v, char *err, size_t errlen)
{
    size_t len;
    char *key = key_of(k, &len);
    if (!key) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    uint64_t h = fnv1a(FNV1A_INIT, key, len);
    c->tick++;
    for (int i = 0; i < c->n; i++) {
        struct entry *e = &c->e[i];
        if (e->hash == h && e->vocab == v && e->key_len == len && !memcmp(e->key, key, len)) {
            free(key);
            e->used = c->tick;
            c->hits++;
            return e->g;
        }
    }
    struct grammar *g = compile(k, v, err, errlen);
    if (!g) {
        free(key);
        return NULL;
    }
    c->compiled++;
    int slot = c->n;
    if (c->n == GRAMMAR_CACHE_SIZE) { /* the least recently used goes */
        slot = 0;
        for (int i = 1; i < c->n; i++)
            if (c->e[i].used < c->e[slot].used)
                slot = i;
        free(c->e[slot].key);
        gr_unref(c->e[slot].g);
    } else {
        c->n++;
    }
    c->e[slot] = (struct entry){.key = key, .key_len = len, .hash = h, .vocab = v, .g = g, .used = c->tick};
    return g;
}

int grammar_cache_for_job(struct grammar_cache *c, const struct job *j, struct engine *e,
                          struct grammar **out, char *err, size_t errlen)
{
    *out = NULL;
    if (j->constraint.kind == JOB_CONSTRAINT_NONE)
        return 0;
    const struct gr_vocab *v = engine_grammar_vocab(e, err, errlen);
    if (!v)
        return JOB_ERR_INTERNAL;
    char why[768];
    *out = grammar_cache_get(c, &j->constraint, v, why, sizeof why);
    if (!*out) {
        snprintf(err, errlen, "%s: %s", job_constraint_name(j->constraint.kind), why);
        return JOB_ERR_RESPONSE_FORMAT;
    }
    return 0;
}

void grammar_cache_stats(const struct grammar_cache *c, unsigned long long *compiled,
                         unsigned long long *hits)
{
    *compiled = c->compiled;
    *hits = c->hits;
}
