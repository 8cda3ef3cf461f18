/* See prom.h. */
#include "worker/metrics/prom.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/fmt_double.h"

void prom_init(struct prom *p)
{
    memset(p, 0, sizeof *p);
}

void prom_free(struct prom *p)
{
    if (!p)
        return;
    buf_free(&p->text);
    buf_free(&p->names);
    memset(p, 0, sizeof *p);
}

char *prom_take(struct prom *p, size_t *len)
{
    char *s = NULL;
    size_t n = p->text.len;
    if (!p->err)
        s = buf_take(&p->text);
    if (len)
        *len = s ? n : 0;
    prom_free(p);
    return s;
}

static int fail(struct prom *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct prom *p, const char *fmt, ...)
{
    if (!p->err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->errmsg, sizeof p->errmsg, fmt, ap);
        va_end(ap);
        p->err = -1;
    }
    return -1;
}

static void put(struct prom *p, const char *s, size_t n)
{
    if (!p->err && buf_append(&p->text, s, n))
        fail(p, "out of memory");
}

static void puts_(struct prom *p, const char *s)
{
    put(p, s, strlen(s));
}

/* s with the characters of `special` escaped (backslash, newline, and the quote when asked). */
static void put_escaped(struct prom *p, const char *s, int quote)
{
    const char *run = s;
    for (; *s; s++) {
        const char *esc = *s == '\\' ? "\\\\" : *s == '\n' ? "\\n" : quote && *s == '"' ? "\\\"" : NULL;
        if (!esc)
            continue;
        put(p, run, (size_t)(s - run));
        puts_(p, esc);
        run = s + 1;
    }
    put(p, run, (size_t)(s - run));
}

static int is_alpha_(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static int is_digit(int c)
{
    return c >= '0' && c <= '9';
}

int prom_valid_metric_name(const char *s)
{
    if (!s || !(is_alpha_(*s) || *s == ':'))
        return 0;
    for (s++; *s; s++)
        if (!is_alpha_(*s) && !is_digit(*s) && *s != ':')
            return 0;
    return 1;
}

int prom_valid_label_name(const char *s)
{
    if (!s || !is_alpha_(*s) || (s[0] == '_' && s[1] == '_'))
        return 0;
    for (s++; *s; s++)
        if (!is_alpha_(*s) && !is_digit(*s))
            return 0;
    return 1;
}

void prom_format_value(double v, char *buf, size_t n)
{
    if (isnan(v)) {
        snprintf(buf, n, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, n, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (v == floor(v) && fabs(v) <= 9007199254740992.0) {
        snprintf(buf, n, "%.0f", v == 0 ? 0.0 : v); /* no "-0" */
        return;
    }
    fmt_double(v, buf, n);
}

/* Whether name was declared already; declares it if not. */
static int declared(struct prom *p, const char *name)
{
    size_t len = strlen(name);
    for (size_t i = 0; i < p->names.len;) {
        size_t k = strcspn(p->names.p + i, "\n");
        if (k == len && !memcmp(p->names.p + i, name, len))
            return 1;
        i += k + 1;
    }
    if (buf_append(&p->names, name, len) || buf_append(&p->names, "\n", 1))
        return fail(p, "out of memory"), 1;
    return 0;
}

int prom_family(struct prom *p, const char *name, enum prom_type type, const char *help)
{
    static const char *const types[] = {"counter", "gauge", "histogram", "untyped"};
    if (p->err)
        return -1;
    if (!prom_valid_metric_name(name))
        return fail(p, "\"%.60s\" is not a metric name", name ? name : "(null)");
    if (strlen(name) >= sizeof p->family - 8) /* room for _bucket */
        return fail(p, "metric name %.60s... is too long", name);
    if ((int)type < 0 || type > PROM_UNTYPED)
        return fail(p, "%s: bad type %d", name, (int)type);
    if (declared(p, name))
        return p->err ? -1 : fail(p, "metric %s is declared twice", name);
    if (help) {
        puts_(p, "# HELP ");
        puts_(p, name);
        puts_(p, " ");
        put_escaped(p, help, 0);
        puts_(p, "\n");
    }
    puts_(p, "# TYPE ");
    puts_(p, name);
    puts_(p, " ");
    puts_(p, types[type]);
    puts_(p, "\n");
    snprintf(p->family, sizeof p->family, "%s", name);
    p->type = type;
    return p->err;
}

static int check_labels(struct prom *p, const struct prom_label *labels, int nlabels, int histogram)
{
    if (nlabels < 0 || (nlabels > 0 && !labels))
        return fail(p, "%s: bad label list", p->family);
    for (int i = 0; i < nlabels; i++) {
        if (!prom_valid_label_name(labels[i].name))
            return fail(p, "%s: \"%.60s\" is not a label name", p->family,
                        labels[i].name ? labels[i].name : "(null)");
        if (!labels[i].value)
            return fail(p, "%s: label %s has no value", p->family, labels[i].name);
        if (histogram && !strcmp(labels[i].name, "le"))
            return fail(p, "%s: a histogram's labels may not include \"le\"", p->family);
        for (int k = 0; k < i; k++)
            if (!strcmp(labels[i].name, labels[k].name))
                return fail(p, "%s: label %s given twice", p->family, labels[i].name);
    }
    return 0;
}

/* name{labels[,le="x"]} value\n */
static void line(struct prom *p, const char *suffix, const struct prom_label *labels, int nlabels,
                 const char *le, double value)
{
    char v[40];
    puts_(p, p->family);
    puts_(p, suffix);
    if (nlabels > 0 || le) {
        puts_(p, "{");
        for (int i = 0; i < nlabels; i++) {
            if (i)
                puts_(p, ",");
            puts_(p, labels[i].name);
            puts_(p, "=\"");
            put_escaped(p, labels[i].value, 1);
            puts_(p, "\"");
        }
        if (le) {
            puts_(p, nlabels ? ",le=\"" : "le=\"");
            puts_(p, le);
            puts_(p, "\"");
        }
        puts_(p, "}");
    }
    prom_format_value(value, v, sizeof v);
    puts_(p, " ");
    puts_(p, v);
    puts_(p, "\n");
}

int prom_sample(struct prom *p, const struct prom_label *labels, int nlabels, double value)
{
    if (p->err)
        return -1;
    if (!p->family[0])
        return fail(p, "a sample before any family");
    if (p->type == PROM_HISTOGRAM)
        return fail(p, "%s is a histogram: prom_histogram writes its samples", p->family);
    if (check_labels(p, labels, nlabels, 0))
        return -1;
    line(p, "", labels, nlabels, NULL, value);
    return p->err;
}

int prom_histogram(struct prom *p, const struct prom_label *labels, int nlabels, const struct hist *h)
{
    if (p->err)
        return -1;
    if (!p->family[0] || p->type != PROM_HISTOGRAM)
        return fail(p, "%s is not a histogram family", p->family[0] ? p->family : "(none)");
    if (check_labels(p, labels, nlabels, 1))
        return -1;
    for (int i = 0; i <= h->n; i++) {
        char le[40];
        prom_format_value(hist_bound(h, i), le, sizeof le);
        line(p, "_bucket", labels, nlabels, le, (double)hist_cumulative(h, i));
    }
    line(p, "_sum", labels, nlabels, NULL, h->sum);
    line(p, "_count", labels, nlabels, NULL, (double)h->count);
    return p->err;
}
