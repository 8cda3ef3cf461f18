/* worker/metrics/prom.c against the Prometheus text exposition format 0.0.4
 * (https://prometheus.io/docs/instrumenting/exposition_formats/): exact texts for small families
 * written out by hand from the format's rules (HELP/TYPE lines, escaping of HELP text and label
 * values, le="+Inf", _sum and _count), value formatting, the rules it refuses to break; then the
 * worker's whole /metrics text (worker/metrics/metrics.c) through an independent checker of those rules,
 * with its figures compared against the inputs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/metrics/metrics.h"
#include "worker/metrics/prom.h"

static char *take(struct prom *p)
{
    assert_int_equal(p->err, 0);
    char *s = prom_take(p, NULL);
    assert_non_null(s);
    return s;
}

static void test_counter_and_gauge(void **state)
{
    struct prom p;
    prom_init(&p);
    assert_int_equal(prom_family(&p, "llmq_x_total", PROM_COUNTER, "Things done.\nSecond \\ line."), 0);
    assert_int_equal(prom_sample(&p, NULL, 0, 42), 0);
    assert_int_equal(prom_family(&p, "llmq_depth", PROM_GAUGE, "Depth."), 0);
    struct prom_label l[] = {{"queue", "a\"b\\c\nd"}, {"lane", "short"}};
    assert_int_equal(prom_sample(&p, l, 2, 0.25), 0);
    assert_int_equal(prom_family(&p, "no_help", PROM_UNTYPED, NULL), 0);
    assert_int_equal(prom_sample(&p, l + 1, 1, -3), 0);
    char *s = take(&p);
    assert_string_equal(s, "# HELP llmq_x_total Things done.\\nSecond \\\\ line.\n"
                           "# TYPE llmq_x_total counter\n"
                           "llmq_x_total 42\n"
                           "# HELP llmq_depth Depth.\n"
                           "# TYPE llmq_depth gauge\n"
                           "llmq_depth{queue=\"a\\\"b\\\\c\\nd\",lane=\"short\"} 0.25\n"
                           "# TYPE no_help untyped\n"
                           "no_help{lane=\"short\"} -3\n");
    free(s);
}

static void test_histogram_text(void **state)
{
    static const double b[] = {0.5, 1, 2.5};
    struct hist h;
    hist_init(&h, b, 3);
    hist_observe(&h, 0.5);
    hist_observe(&h, 0.7);
    hist_observe(&h, 3);
    struct prom p;
    prom_init(&p);
    prom_family(&p, "lat_seconds", PROM_HISTOGRAM, "Latency.");
    struct prom_label l = {"lane", "long"};
    assert_int_equal(prom_histogram(&p, &l, 1, &h), 0);
    prom_family(&p, "plain_seconds", PROM_HISTOGRAM, "No labels.");
    struct hist e;
    hist_init(&e, b, 1);
    assert_int_equal(prom_histogram(&p, NULL, 0, &e), 0);
    char *s = take(&p);
    assert_string_equal(s, "# HELP lat_seconds Latency.\n"
                           "# TYPE lat_seconds histogram\n"
                           "lat_seconds_bucket{lane=\"long\",le=\"0.5\"} 1\n"
                           "lat_seconds_bucket{lane=\"long\",le=\"1\"} 2\n"
                           "lat_seconds_bucket{lane=\"long\",le=\"2.5\"} 2\n"
                           "lat_seconds_bucket{lane=\"long\",le=\"+Inf\"} 3\n"
                           "lat_seconds_sum{lane=\"long\"} 4.2\n"
                           "lat_seconds_count{lane=\"long\"} 3\n"
                           "# HELP plain_seconds No labels.\n"
                           "# TYPE plain_seconds histogram\n"
                           "plain_seconds_bucket{le=\"0.5\"} 0\n"
                           "plain_seconds_bucket{le=\"+Inf\"} 0\n"
                           "plain_seconds_sum 0\n"
                           "plain_seconds_count 0\n");
    free(s);
}

static void fmt_is(double v, const char *want)
{
    char b[40];
    prom_format_value(v, b, sizeof b);
    if (strcmp(b, want))
        fail_msg("%.17g formatted as %s, want %s", v, b, want);
}

static void test_values(void **state)
{
    fmt_is(0, "0");
    fmt_is(-0.0, "0");
    fmt_is(42, "42");
    fmt_is(-7, "-7");
    fmt_is(0.1, "0.1");
    fmt_is(0.25, "0.25");
    fmt_is(1e-7, "1e-07");
    fmt_is(1.5e300, "1.5e+300");
    fmt_is(9007199254740992.0, "9007199254740992");
    fmt_is(1e17, "1e+17");
    fmt_is(INFINITY, "+Inf");
    fmt_is(-INFINITY, "-Inf");
    fmt_is(NAN, "NaN");
    /* the shortest text that reads back as the same double */
    srand(3);
    for (int i = 0; i < 2000; i++) {
        double v = ((double)rand() / RAND_MAX - 0.5) * pow(10, rand() % 40 - 20);
        char b[40];
        prom_format_value(v, b, sizeof b);
        assert_true(strtod(b, NULL) == v);
        assert_true(strlen(b) <= 24);
    }
    fmt_is(1.0 / 3, "0.3333333333333333");
}

static void expect_fail(struct prom *p, const char *msg_part)
{
    assert_int_equal(p->err, -1);
    if (!strstr(p->errmsg, msg_part))
        fail_msg("error \"%s\" lacks \"%s\"", p->errmsg, msg_part);
    /* sticky: nothing more is written and take gives nothing */
    size_t len = p->text.len;
    assert_int_equal(prom_family(p, "ok_name", PROM_GAUGE, "x"), -1);
    assert_int_equal(p->text.len, len);
    assert_null(prom_take(p, NULL));
}

static void test_rules(void **state)
{
    struct prom p;
    static const double b[] = {1};
    struct hist h;
    hist_init(&h, b, 1);

    prom_init(&p);
    assert_int_equal(prom_family(&p, "9bad", PROM_GAUGE, "x"), -1);
    expect_fail(&p, "not a metric name");
    prom_init(&p);
    prom_family(&p, "has-dash", PROM_GAUGE, "x");
    expect_fail(&p, "not a metric name");
    prom_init(&p);
    assert_int_equal(prom_family(&p, "ns:name_ok", PROM_GAUGE, "x"), 0); /* colons are allowed */
    prom_family(&p, "ns:name_ok", PROM_COUNTER, "again");
    expect_fail(&p, "declared twice");
    prom_init(&p);
    prom_sample(&p, NULL, 0, 1);
    expect_fail(&p, "before any family");
    prom_init(&p);
    prom_family(&p, "g", PROM_GAUGE, "x");
    struct prom_label reserved = {"__name__", "x"};
    prom_sample(&p, &reserved, 1, 1);
    expect_fail(&p, "not a label name");
    prom_init(&p);
    prom_family(&p, "g", PROM_GAUGE, "x");
    struct prom_label colon = {"a:b", "x"};
    prom_sample(&p, &colon, 1, 1);
    expect_fail(&p, "not a label name");
    prom_init(&p);
    prom_family(&p, "g", PROM_GAUGE, "x");
    struct prom_label twice[] = {{"a", "1"}, {"a", "2"}};
    prom_sample(&p, twice, 2, 1);
    expect_fail(&p, "given twice");
    prom_init(&p);
    prom_family(&p, "g", PROM_GAUGE, "x");
    struct prom_label novalue = {"a", NULL};
    prom_sample(&p, &novalue, 1, 1);
    expect_fail(&p, "no value");
    prom_init(&p);
    prom_family(&p, "h", PROM_HISTOGRAM, "x");
    struct prom_label le = {"le", "1"};
    prom_histogram(&p, &le, 1, &h);
    expect_fail(&p, "\"le\"");
    prom_init(&p);
    prom_family(&p, "h", PROM_HISTOGRAM, "x");
    prom_sample(&p, NULL, 0, 1);
    expect_fail(&p, "is a histogram");
    prom_init(&p);
    prom_family(&p, "g", PROM_GAUGE, "x");
    prom_histogram(&p, NULL, 0, &h);
    expect_fail(&p, "not a histogram");

    assert_true(prom_valid_metric_name("llmq_a:b_total"));
    assert_false(prom_valid_metric_name(""));
    assert_false(prom_valid_metric_name(NULL));
    assert_true(prom_valid_label_name("_x1"));
    assert_false(prom_valid_label_name("1x"));
    assert_false(prom_valid_label_name(""));

    /* nothing written: an empty text, not an error */
    prom_init(&p);
    size_t len = 9;
    char *s = prom_take(&p, &len);
    assert_non_null(s);
    assert_int_equal(len, 0);
    assert_string_equal(s, "");
    free(s);
    prom_free(NULL);
}

/* ---- an independent checker of the text format, for whole texts */

struct family {
    char name[128];
    char type[16];
    int has_samples;
    /* histograms: the current series' last le and count */
    double last_le;
    double last_bucket;
    int saw_inf;
};

static int value_ok(const char *s, double *v)
{
    if (!strcmp(s, "+Inf") || !strcmp(s, "-Inf") || !strcmp(s, "NaN")) {
        *v = !strcmp(s, "NaN") ? NAN : s[0] == '+' ? INFINITY : -INFINITY;
        return 1;
    }
    char *end;
    *v = strtod(s, &end);
    return end != s && *end == 0 && strspn(s, "0123456789+-.e") == strlen(s);
}

static int name_char(char c, int first, int colon)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':') ||
           (!first && c >= '0' && c <= '9');
}

/* Checks text; on failure returns a message (static), else NULL; *nsamples counts samples. */
static const char *check_text(const char *text, int *nsamples)
{
    static char msg[512];
    struct family fams[128];
    int nf = 0;
    struct family *cur = NULL;
    *nsamples = 0;
    if (text[0] && text[strlen(text) - 1] != '\n')
        return "text does not end with a newline";
    char *copy = strdup(text), *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(line, "# HELP ", 7) || !strncmp(line, "# TYPE ", 7)) {
            int help = line[2] == 'H';
            char *name = line + 7, *sp = strchr(name, ' ');
            if (!sp)
                goto bad;
            *sp = 0;
            for (char *c = name; *c; c++)
                if (!name_char(*c, c == name, 1))
                    goto bad;
            const char *rest = sp + 1;
            if (help) {
                for (const char *c = rest; *c; c++)
                    if (*c == '\\' && c[1] != '\\' && c[1] != 'n')
                        goto bad;
                    else if (*c == '\\')
                        c++;
                /* HELP comes before its TYPE, as the clients write it: a new family */
                for (int i = 0; i < nf; i++)
                    if (!strcmp(fams[i].name, name))
                        goto bad;
                cur = &fams[nf++];
                memset(cur, 0, sizeof *cur);
                snprintf(cur->name, sizeof cur->name, "%s", name);
            } else {
                if (strcmp(rest, "counter") && strcmp(rest, "gauge") && strcmp(rest, "histogram") &&
                    strcmp(rest, "summary") && strcmp(rest, "untyped"))
                    goto bad;
                if (!cur || strcmp(cur->name, name)) {
                    for (int i = 0; i < nf; i++)
                        if (!strcmp(fams[i].name, name))
                            goto bad;
                    cur = &fams[nf++];
                    memset(cur, 0, sizeof *cur);
                    snprintf(cur->name, sizeof cur->name, "%s", name);
                }
                if (cur->type[0] || cur->has_samples)
                    goto bad;
                snprintf(cur->type, sizeof cur->type, "%s", rest);
            }
            continue;
        }
        if (line[0] == '#')
            continue;
        /* a sample: name{l="v",...} value */
        char name[160];
        size_t k = 0;
        const char *c = line;
        while (*c && name_char(*c, c == line, 1) && k < sizeof name - 1)
            name[k++] = *c++;
        name[k] = 0;
        if (!k || !cur || !cur->type[0])
            goto bad;
        int is_hist = !strcmp(cur->type, "histogram");
        const char *suffix = NULL;
        size_t fl = strlen(cur->name);
        if (!strcmp(name, cur->name) && !is_hist)
            suffix = "";
        else if (is_hist && !strncmp(name, cur->name, fl) &&
                 (!strcmp(name + fl, "_bucket") || !strcmp(name + fl, "_sum") ||
                  !strcmp(name + fl, "_count")))
            suffix = name + fl;
        if (!suffix) /* not of the current family: samples of a family are not grouped */
            goto bad;
        char le[256] = "";
        int nlabels = 0;
        if (*c == '{') {
            c++;
            while (*c != '}') {
                char ln[64];
                size_t n = 0;
                while (name_char(*c, n == 0, 0) && n < sizeof ln - 1)
                    ln[n++] = *c++;
                ln[n] = 0;
                if (!n || c[0] != '=' || c[1] != '"' || (ln[0] == '_' && ln[1] == '_'))
                    goto bad;
                c += 2;
                char val[256];
                size_t m = 0;
                while (*c && *c != '"') {
                    if (*c == '\\') {
                        if (c[1] != '\\' && c[1] != '"' && c[1] != 'n')
                            goto bad;
                        c++;
                    }
                    if (m < sizeof val - 1)
                        val[m++] = *c;
                    c++;
                }
                val[m] = 0;
                if (*c != '"')
                    goto bad;
                c++;
                if (!strcmp(ln, "le"))
                    snprintf(le, sizeof le, "%s", val);
                nlabels++;
                if (*c == ',')
                    c++;
                else if (*c != '}')
                    goto bad;
            }
            c++;
            if (!nlabels)
                goto bad;
        }
        if (*c != ' ')
            goto bad;
        double v;
        if (!value_ok(c + 1, &v))
            goto bad;
        if (is_hist && !strcmp(suffix, "_bucket")) {
            double lev;
            if (!le[0] || !value_ok(le, &lev))
                goto bad;
            if (cur->saw_inf) { /* a new series starts after +Inf */
                cur->saw_inf = 0;
                cur->last_le = -INFINITY;
                cur->last_bucket = 0;
            } else if (!cur->has_samples) {
                cur->last_le = -INFINITY;
            }
            if (!(lev > cur->last_le) || v < cur->last_bucket)
                goto bad;
            cur->last_le = lev;
            cur->last_bucket = v;
            cur->saw_inf = isinf(lev);
        } else if (is_hist && !strcmp(suffix, "_count")) {
            if (!isinf(cur->last_le) || v != cur->last_bucket)
                goto bad;
        } else if (le[0] && is_hist) {
            goto bad;
        }
        cur->has_samples = 1;
        (*nsamples)++;
        continue;
    bad:
        snprintf(msg, sizeof msg, "bad line: %s", line);
        free(copy);
        return msg;
    }
    free(copy);
    return NULL;
}

/* The checker itself rejects what breaks the rules (a checker that cannot fail proves nothing). */
static void test_checker_rejects(void **state)
{
    static const char *const bad[] = {
        "# TYPE a gauge\na 1", /* no final newline */
        "a 1\n",               /* a sample without TYPE */
        "# TYPE a gauge\nb 1\n",
        "# TYPE a gauge\n# TYPE a gauge\na 1\n",
        "# TYPE a gauge\na{x=\"1\\t\"} 1\n",
        "# TYPE a gauge\na{__x=\"1\"} 1\n",
        "# TYPE a gauge\na one\n",
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n",
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 3\nh_sum 1\nh_count 2\n",
        "# TYPE h histogram\nh_bucket{le=\"2\"} 2\nh_bucket{le=\"1\"} 3\n",
        "# TYPE h histogram\nh_bucket 1\n",
        "# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na 2\n",
        "# HELP a bad \\q escape\n# TYPE a gauge\na 1\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int n;
        if (!check_text(bad[i], &n))
            fail_msg("the checker accepted: %s", bad[i]);
    }
    int n;
    assert_null(check_text("# HELP a x\n# TYPE a gauge\na{b=\"\\\"\"} +Inf\n", &n));
    assert_int_equal(n, 1);
}

/* The value of the sample whose text before the value is `key`, or NAN when it is not there. */
static double sample(const char *text, const char *key)
{
    size_t k = strlen(key);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, key, k) && l[k] == ' ')
            return strtod(l + k + 1, NULL);
    return NAN;
}

static void test_worker_text(void **state)
{
    struct engine_stats st = {0};
    struct wk_metrics m;
    wk_metrics_init(&m, 0, &st);
    /* three jobs, one retried attempt, one dead letter */
    struct wk_finished a = {.status = DB_COMPLETED,
                            .finish_reason = "stop",
                            .completion_tokens = 11,
                            .ttft_ms = 20,
                            .e2e_ms = 120,
                            .queue_ms = 400};
    struct wk_finished b = {.status = DB_COMPLETED,
                            .finish_reason = "length",
                            .completion_tokens = 1,
                            .ttft_ms = 30,
                            .e2e_ms = 30,
                            .queue_ms = 2000};
    struct wk_finished c = {.status = DB_FAILED, .ttft_ms = NAN, .e2e_ms = NAN, .queue_ms = NAN};
    struct wk_finished r = {.status = DB_FAILED, .retried = 1, .ttft_ms = 5, .e2e_ms = 6, .queue_ms = 7};
    wk_metrics_finish(&m, &a);
    wk_metrics_finish(&m, &b);
    wk_metrics_finish(&m, &c);
    wk_metrics_finish(&m, &r);
    wk_metrics_dead(&m);
    wk_metrics_routed(&m, 2);
    int64_t depth[WK_METRICS_QUEUES] = {5, 0};
    wk_metrics_redis(&m, 1, depth, 1, 3);

    st.running = 3;
    st.lane_running[0] = 2;
    st.lane_running[1] = 1;
    st.lane_waiting[0] = 4;
    st.kv_blocks_used = 25;
    st.kv_blocks_total = 100;
    st.prefix_query_tokens = 160;
    st.prefix_hit_tokens = 64;
    st.preemptions = 2;
    st.grammar_masks = 7;
    st.grammar_mask_s = 0.25;
    st.prompt_tokens = 1000;
    st.generated_tokens = 12;
    struct wk_snapshot *s = calloc(1, sizeof *s);
    wk_metrics_snapshot(&m, &st, s);
    snprintf(s->worker_id, sizeof s->worker_id, "w\"1");
    snprintf(s->model, sizeof s->model, "/models/Qwen3 \\ 0.6B");
    snprintf(s->backend, sizeof s->backend, "cpu");
    snprintf(s->version, sizeof s->version, "0.1.0");
    s->started_at = 1.7e9;
    s->ready = s->redis_ok = s->sqlite_ok = 1;
    s->gpu_mem_bytes = -1;

    struct prom p;
    prom_init(&p);
    assert_int_equal(wk_metrics_format(s, &p), 0);
    char *text = take(&p);
    int n;
    const char *why = check_text(text, &n);
    if (why)
        fail_msg("%s\n%s", why, text);
    assert_true(n > 50);

    assert_true(sample(text,
                       "llmq_worker_info{worker=\"w\\\"1\",version=\"0.1.0\",model=\"/models/Qwen3 \\\\ "
                       "0.6B\",backend=\"cpu\"}") == 1);
    assert_true(sample(text, "llmq_worker_healthy") == 1);
    assert_true(sample(text, "llmq_queue_depth{queue=\"short\"}") == 5);
    assert_true(sample(text, "llmq_queue_depth{queue=\"long\"}") == 0);
    assert_true(sample(text, "llmq_retry_depth") == 1);
    assert_true(sample(text, "llmq_dead_depth") == 3);
    assert_true(sample(text, "llmq_num_requests_running{lane=\"short\"}") == 2);
    assert_true(sample(text, "llmq_num_requests_running{lane=\"long\"}") == 1);
    assert_true(sample(text, "llmq_num_requests_waiting{lane=\"short\"}") == 4);
    assert_true(sample(text, "llmq_kv_cache_usage_perc") == 0.25);
    assert_true(sample(text, "llmq_prefix_cache_queries_total") == 160);
    assert_true(sample(text, "llmq_prefix_cache_hits_total") == 64);
    assert_true(sample(text, "llmq_num_preemptions_total") == 2);
    assert_true(sample(text, "llmq_grammar_masks_total") == 7);
    assert_true(sample(text, "llmq_grammar_mask_seconds_total") == 0.25);
    assert_true(sample(text, "llmq_prompt_tokens_total") == 1000);
    assert_true(sample(text, "llmq_generation_tokens_total") == 12);
    assert_true(isnan(sample(text, "llmq_gpu_memory_used_bytes"))); /* not reported: left out */
    assert_true(sample(text, "llmq_jobs_total{status=\"completed\"}") == 2);
    assert_true(sample(text, "llmq_jobs_total{status=\"failed\"}") == 1);
    assert_true(sample(text, "llmq_jobs_total{status=\"cancelled\"}") == 0);
    assert_true(sample(text, "llmq_request_success_total{finished_reason=\"stop\"}") == 1);
    assert_true(sample(text, "llmq_request_success_total{finished_reason=\"length\"}") == 1);
    assert_true(sample(text, "llmq_jobs_dead_lettered_total") == 1);
    assert_true(sample(text, "llmq_jobs_retried_total") == 1);
    assert_true(sample(text, "llmq_jobs_routed_total") == 2);
    /* TTFT 0.02 s and 0.03 s (the failed job has none, the retried attempt is not counted) */
    assert_true(sample(text, "llmq_time_to_first_token_seconds_bucket{le=\"0.02\"}") == 1);
    assert_true(sample(text, "llmq_time_to_first_token_seconds_bucket{le=\"0.04\"}") == 2);
    assert_true(sample(text, "llmq_time_to_first_token_seconds_bucket{le=\"+Inf\"}") == 2);
    assert_true(fabs(sample(text, "llmq_time_to_first_token_seconds_sum") - 0.05) < 1e-12);
    /* ITL: job a's 10 intervals of 10 ms; job b has one token, no interval */
    assert_true(sample(text, "llmq_inter_token_latency_seconds_count") == 10);
    assert_true(sample(text, "llmq_inter_token_latency_seconds_bucket{le=\"0.01\"}") == 10);
    assert_true(fabs(sample(text, "llmq_inter_token_latency_seconds_sum") - 0.1) < 1e-12);
    assert_true(sample(text, "llmq_e2e_request_latency_seconds_bucket{le=\"0.3\"}") == 2);
    assert_true(sample(text, "llmq_e2e_request_latency_seconds_count") == 2);
    assert_true(sample(text, "llmq_request_queue_time_seconds_bucket{le=\"0.5\"}") == 1);
    assert_true(sample(text, "llmq_request_queue_time_seconds_bucket{le=\"2\"}") == 2);
    assert_true(sample(text, "llmq_request_queue_time_seconds_bucket{le=\"86400\"}") == 2);
    free(text);

    /* unhealthy, unknown queue depths, a GPU figure: the text stays valid */
    wk_metrics_redis(&m, 0, NULL, 0, 0);
    wk_metrics_snapshot(&m, &st, s);
    s->redis_ok = 0;
    snprintf(s->redis_err, sizeof s->redis_err, "Connection refused");
    s->gpu_mem_bytes = 123456789;
    char reason[256];
    assert_int_equal(wk_metrics_health(s, reason, sizeof reason), 0);
    assert_string_equal(reason, "redis: Connection refused");
    prom_init(&p);
    assert_int_equal(wk_metrics_format(s, &p), 0);
    text = take(&p);
    why = check_text(text, &n);
    if (why)
        fail_msg("%s\n%s", why, text);
    assert_true(sample(text, "llmq_worker_healthy") == 0);
    assert_true(isnan(sample(text, "llmq_queue_depth{queue=\"short\"}")));
    assert_true(isnan(sample(text, "llmq_retry_depth")));
    assert_true(sample(text, "llmq_gpu_memory_used_bytes") == 123456789);
    free(text);

    s->redis_ok = 1;
    s->sqlite_ok = 0;
    snprintf(s->sqlite_err, sizeof s->sqlite_err, "database is locked");
    assert_int_equal(wk_metrics_health(s, reason, sizeof reason), 0);
    assert_string_equal(reason, "sqlite: database is locked");
    s->sqlite_ok = 1;
    s->stopping = 1;
    assert_int_equal(wk_metrics_health(s, reason, sizeof reason), 0);
    assert_string_equal(reason, "stopping");
    s->stopping = 0;
    s->ready = 0;
    assert_int_equal(wk_metrics_health(s, reason, sizeof reason), 0);
    s->ready = 1;
    assert_int_equal(wk_metrics_health(s, reason, sizeof reason), 1);
    assert_string_equal(reason, "ok");
    free(s);
    wk_metrics_free(&m);
}

/* The interval row carries the same figures (schemas/002_metrics.sql). */
static void test_interval_row(void **state)
{
    struct engine_stats st = {0};
    st.prompt_tokens = 100;
    st.generated_tokens = 50;
    st.prefix_query_tokens = 96;
    st.prefix_hit_tokens = 32;
    struct wk_metrics m;
    wk_metrics_init(&m, 10, &st);
    struct wk_finished a = {.status = DB_CANCELLED,
                            .finish_reason = "cancelled",
                            .completion_tokens = 3,
                            .ttft_ms = 1,
                            .e2e_ms = 5,
                            .queue_ms = 100};
    struct wk_finished r = {.status = DB_FAILED, .retried = 1};
    wk_metrics_finish(&m, &a);
    wk_metrics_finish(&m, &r);
    wk_metrics_dead(&m);
    int64_t depth[WK_METRICS_QUEUES] = {7, 2};
    wk_metrics_redis(&m, 1, depth, 0, 9);
    st.prompt_tokens = 130;
    st.generated_tokens = 60;
    st.prefix_query_tokens = 160;
    st.prefix_hit_tokens = 64;
    struct db_metrics row;
    wk_metrics_row(&m, 12, 1e9, &st, &row);
    assert_int_equal(row.jobs_done, 1);
    assert_int_equal(row.jobs_failed, 0);
    assert_int_equal(row.jobs_cancelled, 1);
    assert_int_equal(row.jobs_retried, 1);
    assert_int_equal(row.jobs_dead, 1);
    assert_int_equal(row.prompt_tokens, 30);
    assert_int_equal(row.generation_tokens, 10);
    assert_int_equal(row.prefix_cache_queries, 64);
    assert_int_equal(row.prefix_cache_hits, 32);
    assert_true(row.queue_p50_ms == 100 && row.queue_p95_ms == 100);
    assert_int_equal(row.queue_short, 7);
    assert_int_equal(row.queue_long, 2);
    assert_int_equal(row.retry_depth, 0);
    assert_int_equal(row.dead_depth, 9);
    /* the next interval starts empty; the depths stay until the next read */
    wk_metrics_redis(&m, 0, NULL, 0, 0);
    wk_metrics_row(&m, 13, 1e9 + 1, &st, &row);
    assert_int_equal(row.jobs_cancelled + row.jobs_retried + row.jobs_dead + row.prompt_tokens, 0);
    assert_true(isnan(row.queue_p50_ms));
    assert_int_equal(row.queue_short, -1);
    assert_int_equal(row.dead_depth, -1);
    /* the totals keep counting */
    assert_int_equal(m.tot.cancelled, 1);
    assert_int_equal(m.tot.retried, 1);
    wk_metrics_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counter_and_gauge),
        cmocka_unit_test(test_histogram_text),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_checker_rejects),
        cmocka_unit_test(test_worker_text),
        cmocka_unit_test(test_interval_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
