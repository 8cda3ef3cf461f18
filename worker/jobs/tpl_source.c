/* See tpl_source.h. */
#include "worker/jobs/tpl_source.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/hash.h"
#include "engine/util/log.h"
#include "engine/util/mono.h"
#include "queue/badkey.h"
#include "queue/rq.h"
#include "queue/templates.h"
#include "worker/config/config.h"

struct entry {
    char *name;
    char *text; /* NULL: not published (as of fetched) */
    double fetched;
};

struct tpl_source {
    const struct cfg *c;
    struct rq *q;
    struct entry *e;
    size_t n, cap;
    bool failed;
    char err[512];
};

void tpl_version(const char *text, char out[TPL_VERSION_LEN + 1])
{
    snprintf(out, TPL_VERSION_LEN + 1, "%016" PRIx64, fnv1a_str(FNV1A_INIT, text));
}

struct tpl_source *tpl_source_new(const struct cfg *c, struct rq *q)
{
    struct tpl_source *s = calloc(1, sizeof *s);
    if (s) {
        s->c = c;
        s->q = q;
    }
    return s;
}

void tpl_source_free(struct tpl_source *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++) {
        free(s->e[i].name);
        free(s->e[i].text);
    }
    free(s->e);
    free(s);
}

bool tpl_source_failed(const struct tpl_source *s)
{
    return s->failed;
}

const char *tpl_source_error(const struct tpl_source *s)
{
    return s->err;
}

/* The text of a published value, checked against its version (malloc'd), or NULL when the value
 * is not one llmq wrote. */
static char *value_text(const char *value)
{
    json_t *v = json_loads(value, 0, NULL);
    const char *text = json_string_value(json_object_get(v, "text"));
    const char *ver = json_string_value(json_object_get(v, "version"));
    char want[TPL_VERSION_LEN + 1];
    char *out = NULL;
    if (text && ver) {
        tpl_version(text, want);
        if (!strcmp(want, ver))
            out = strdup(text);
    }
    json_decref(v);
    return out;
}

const char *tpl_source_find(void *ctx, const char *name)
{
    struct tpl_source *s = ctx;
    s->failed = false;
    s->err[0] = 0;
    const char *own = s->c ? cfg_template_find(s->c, name) : NULL;
    if (own || !s->q)
        return own;
    double now = llmq_mono_s();
    struct entry *e = NULL;
    for (size_t i = 0; i < s->n && !e; i++)
        if (!strcmp(s->e[i].name, name))
            e = &s->e[i];
    if (e && now - e->fetched < TPL_CACHE_S)
        return e->text;
    char *value = NULL;
    int rc = rq_template_get(s->q, name, &value);
    if (rc < 0) { /* keep serving what is cached; with nothing cached the caller hands the job back */
        snprintf(s->err, sizeof s->err, "%s", rq_error(s->q));
        const char *bad = rq_badkey_error(s->q);
        if (bad) { /* not transient: the job is judged without Redis's templates; the key named once */
            if (rq_badkey_first(s->q, bad))
                log_warn(
                    "redis: reading a template failed: %s; jobs naming a template that is not in the config "
                    "fail until the key is deleted or renamed",
                    bad + strlen("BADKEY "));
            return e ? e->text : NULL;
        }
        s->failed = !(e && e->text);
        return e ? e->text : NULL;
    }
    char *text = value ? value_text(value) : NULL;
    free(value);
    if (!e) {
        if (s->n == s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 8;
            struct entry *ne = realloc(s->e, cap * sizeof *ne);
            if (!ne) {
                free(text);
                return NULL;
            }
            s->e = ne;
            s->cap = cap;
        }
        e = &s->e[s->n];
        *e = (struct entry){.name = strdup(name)};
        if (!e->name) {
            free(text);
            return NULL;
        }
        s->n++;
    }
    free(e->text);
    e->text = text;
    e->fetched = now;
    return e->text;
}

int tpl_source_publish(struct tpl_source *s, const char *worker_id, char *err, size_t errlen)
{
    for (size_t i = 0; s->c && i < s->c->n_templates; i++) {
        const struct cfg_template *t = &s->c->templates[i];
        char ver[TPL_VERSION_LEN + 1];
        tpl_version(t->text, ver);
        json_t *v = json_pack("{s:s, s:s, s:s, s:f}", "text", t->text, "version", ver, "worker", worker_id,
                              "published_at", rq_wall_s());
        char *value = v ? json_dumps(v, JSON_COMPACT) : NULL;
        json_decref(v);
        if (!value) {
            snprintf(err, errlen, "templates: out of memory");
            return -2;
        }
        char *existing = NULL;
        int rc = rq_template_publish(s->q, t->name, value, &existing);
        free(value);
        if (rc < 0)
            return -1;
        if (rc == 0 && existing) {
            json_t *e = json_loads(existing, 0, NULL);
            const char *their = json_string_value(json_object_get(e, "version"));
            const char *who = json_string_value(json_object_get(e, "worker"));
            int conflict = !their || strcmp(their, ver) != 0;
            if (conflict)
                snprintf(
                    err, errlen,
                    "template '%s': this config's text (version %s) differs from the one published in %s "
                    "(version %s, by worker %s); every worker must render a template the same way. To "
                    "replace it: redis-cli HDEL %s %s, then restart the workers with the new text",
                    t->name, ver, s->q->keys.templates, their ? their : "?", who ? who : "?",
                    s->q->keys.templates, t->name);
            json_decref(e);
            free(existing);
            if (conflict)
                return -2;
        }
    }
    return 0;
}
