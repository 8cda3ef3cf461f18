/* The terminal progress bar; see progress.h. */
#include "worker/cli/progress.h"
#include "engine/util/mono.h"

#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define REDRAW_S 0.1    /* at most ~10 draws a second */
#define RATE_SAMPLES 32 /* tokens/s over the last 32 draws (~3 s) */

struct progress {
    FILE *f;
    const char *unit, *rate_unit;
    int64_t total, done, tokens;
    double partial; /* work under way, in done's unit */
    bool active, drawn, no_rate;
    double t0, last_draw;
    int last_len; /* length of the last line drawn, to blank leftovers */
    struct {
        double t;
        int64_t tokens;
    } samples[RATE_SAMPLES];
    int n_samples, next_sample;
};

struct progress *progress_new_ex(FILE *f, const char *unit, int64_t total, bool active)
{
    struct progress *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->f = f;
    p->unit = unit ? unit : "";
    p->rate_unit = "tok/s";
    p->total = total;
    p->active = active;
    p->t0 = llmq_mono_s();
    p->last_draw = -1;
    return p;
}

struct progress *progress_new(FILE *f, const char *unit, int64_t total)
{
    const char *term = getenv("TERM");
    bool tty = f && isatty(fileno(f)) && !(term && !strcmp(term, "dumb"));
    return progress_new_ex(f, unit, total, tty);
}

bool progress_active(const struct progress *p)
{
    return p && p->active;
}

void progress_set_rate_unit(struct progress *p, const char *rate_unit)
{
    if (p && rate_unit)
        p->rate_unit = rate_unit;
}

void progress_hide_rate(struct progress *p)
{
    if (p)
        p->no_rate = true;
}

void progress_set_partial(struct progress *p, double partial)
{
    if (p)
        p->partial = partial > 0 ? partial : 0;
}

bool progress_due(const struct progress *p)
{
    return p && p->active && (p->last_draw < 0 || llmq_mono_s() - p->last_draw >= REDRAW_S);
}

void progress_set_total(struct progress *p, int64_t total)
{
    if (p)
        p->total = total;
}

static int term_width(FILE *f)
{
    struct winsize ws;
    if (f && ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
        return ws.ws_col;
    return 80;
}

/* 1234567 -> "1,234,567" */
static void commas(int64_t x, char *buf, size_t len)
{
    char raw[32], out[48];
    snprintf(raw, sizeof raw, "%lld", (long long)(x < 0 ? -x : x));
    size_t n = strlen(raw), k = 0;
    if (x < 0)
        out[k++] = '-';
    for (size_t i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0)
            out[k++] = ',';
        out[k++] = raw[i];
    }
    out[k] = 0;
    snprintf(buf, len, "%s", out);
}

/* 75 -> "1:15", 3725 -> "1:02:05" */
static void clock_str(double s, char *buf, size_t len)
{
    long t = s < 0 ? 0 : s > 360000000 ? 360000000 : (long)(s + 0.5); /* up to 100,000 hours */
    if (t >= 3600)
        snprintf(buf, len, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, len, "%ld:%02ld", t / 60, t % 60);
}

/* Tokens/s over the recent samples, or over everything before there are two. */
static double rate(const struct progress *p, int64_t tokens, double elapsed)
{
    if (p->n_samples >= 2) {
        int oldest = p->n_samples < RATE_SAMPLES ? 0 : p->next_sample;
        double dt = p->t0 + elapsed - p->samples[oldest].t;
        if (dt > 0.2)
            return (double)(tokens - p->samples[oldest].tokens) / dt;
    }
    return elapsed > 0 ? (double)tokens / elapsed : 0;
}

void progress_format(const struct progress *p, int64_t done, int64_t tokens, double elapsed_s, int width,
                     char *buf, size_t len)
{
    char d[32], t[32], tps[32], rate_text[64] = "", el[32], eta[48] = "";
    commas(done, d, sizeof d);
    commas(p->total, t, sizeof t);
    if (!p->no_rate) {
        commas((int64_t)(rate(p, tokens, elapsed_s) + 0.5), tps, sizeof tps);
        snprintf(rate_text, sizeof rate_text, "  %s %s", tps, p->rate_unit);
    }
    clock_str(elapsed_s, el, sizeof el);
    /* what is done, with the work under way: the fill, the percent and the ETA */
    double moved = (double)done + p->partial;
    if (p->total > 0 && moved > (double)p->total)
        moved = (double)p->total;
    char text[256];
    if (p->total > 0) {
        if (moved > 0 && done < p->total) {
            char e[32];
            clock_str(elapsed_s * ((double)p->total - moved) / moved, e, sizeof e);
            snprintf(eta, sizeof eta, "  ETA %s", e);
        }
        snprintf(text, sizeof text, "%s/%s %s  %3d%%%s  %s elapsed%s", d, t, p->unit,
                 (int)(100.0 * moved / (double)p->total), rate_text, el, eta);
    } else {
        snprintf(text, sizeof text, "%s %s%s  %s elapsed", d, p->unit, rate_text, el);
    }
    int room = width - 1 - (int)strlen(text) - 3; /* "[...] " and one spare column */
    int bar = room > 40 ? 40 : room;
    if (p->total > 0 && bar >= 10) {
        char b[48];
        int fill = (int)((double)bar * moved / (double)p->total);
        for (int i = 0; i < bar; i++)
            b[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
        if (fill == bar)
            b[bar - 1] = '=';
        b[bar] = 0;
        snprintf(buf, len, "[%s] %s", b, text);
    } else {
        snprintf(buf, len, "%.*s", width > 1 ? width - 1 : 1, text);
    }
}

static void draw(struct progress *p, double t)
{
    char line[512];
    progress_format(p, p->done, p->tokens, t - p->t0, term_width(p->f), line, sizeof line);
    int n = (int)strlen(line);
    fprintf(p->f, "\r%s%*s", line, p->last_len > n ? p->last_len - n : 0, "");
    fflush(p->f);
    p->last_len = n;
    p->drawn = true;
    p->last_draw = t;
    p->samples[p->next_sample].t = t;
    p->samples[p->next_sample].tokens = p->tokens;
    p->next_sample = (p->next_sample + 1) % RATE_SAMPLES;
    if (p->n_samples < RATE_SAMPLES)
        p->n_samples++;
}

void progress_update(struct progress *p, int64_t done, int64_t tokens)
{
    if (!p)
        return;
    p->done = done;
    p->tokens = tokens;
    if (!p->active)
        return;
    double t = llmq_mono_s();
    if (p->last_draw < 0 || t - p->last_draw >= REDRAW_S)
        draw(p, t);
}

void progress_finish(struct progress *p)
{
    if (!p || !p->active)
        return;
    draw(p, llmq_mono_s());
    fputc('\n', p->f);
    fflush(p->f);
    p->drawn = false;
    p->last_len = 0;
}

void progress_clear(struct progress *p)
{
    if (!p || !p->active || !p->drawn)
        return;
    fprintf(p->f, "\r%*s\r", p->last_len, "");
    fflush(p->f);
    p->drawn = false;
    p->last_len = 0;
    p->last_draw = -1;
}

void progress_free(struct progress *p)
{
    free(p);
}
