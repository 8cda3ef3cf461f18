/* See stream.h; docs/QUEUE.md for the client's side. */
#include "worker/loop/stream.h"

#include <stdlib.h>
#include <string.h>

#include "engine/util/array.h"
#include "engine/util/log.h"
#include "queue/ack.h"
#include "queue/rq.h"

void wk_stream_init(struct wk_stream *s, int interval_ms)
{
    memset(s, 0, sizeof *s);
    s->interval_s = interval_ms / 1e3;
}

void wk_stream_free(struct wk_stream *s)
{
    if (!s)
        return;
    free(s->e);
    free(s->jobs);
    memset(s, 0, sizeof *s);
}

bool wk_stream_wants(const struct wk_job *j)
{
    return j->parsed && j->job.stream && j->rj.id[0];
}

void wk_stream_admit(struct wk_stream *s, const struct wk_job *j)
{
    if (wk_stream_wants(j))
        s->active = true;
}

static int room(struct wk_stream *s, size_t n)
{
    if (n <= s->cap)
        return 0;
    size_t cap = array_grown_cap(s->cap, n, 16);
    if (array_resize(&s->e, cap, sizeof *s->e) || array_resize(&s->jobs, cap, sizeof *s->jobs))
        return -1;
    s->cap = cap;
    return 0;
}

/* The length of text[0..n) without a trailing incomplete UTF-8 character. */
static size_t whole_chars(const char *text, size_t n)
{
    size_t i = n, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)text[i - 1] & 0xC0) == 0x80) { /* continuation bytes */
        i--;
        back++;
    }
    if (i == 0)
        return n;
    unsigned char lead = (unsigned char)text[i - 1];
    size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (want == 1 || back + 1 >= want)
        return n; /* ASCII last, or the last character is complete (or not UTF-8 at all: as is) */
    return i - 1;
}

/* Sends the collected entries; on success each job's stream_sent (stream_rsent) moves to the end of
 * its text (reasoning). */
static void send(struct wk_stream *s, struct rq *q, int n, bool advance)
{
    if (rq_stream_add(q, s->e, n)) {
        if (!s->trouble)
            log_warn(
                "redis: streaming text failed: %s; the jobs go on (streaming is best effort; logged once "
                "until it works again)",
                rq_error(q));
        s->trouble = true;
        return;
    }
    if (s->trouble)
        log_info("redis: streaming text works again");
    s->trouble = false;
    for (int i = 0; advance && i < n; i++) {
        s->jobs[i]->stream_sent = s->e[i].offset + s->e[i].text_len;
        if (s->e[i].has_reasoning)
            s->jobs[i]->stream_rsent = s->e[i].reasoning_offset + s->e[i].reasoning_len;
    }
}

void wk_stream_flush(struct wk_stream *s, struct rq *q, const struct list *running, double now_mono)
{
    if (!s->active || now_mono < s->next_flush)
        return;
    s->next_flush = now_mono + s->interval_s;
    int n = 0, streaming = 0;
    for (struct wk_job *j = wk_job_of(running->head); j; j = wk_job_of(j->link.next)) {
        if (!j->seq || !wk_stream_wants(j))
            continue;
        streaming++;
        const struct engine_seq *sq = j->seq;
        size_t upto = whole_chars(sq->text, sq->text_len);
        size_t rupto = sq->has_reasoning ? whole_chars(sq->reasoning, sq->reasoning_len) : 0;
        bool new_text = upto > j->stream_sent, new_reasoning = rupto > j->stream_rsent;
        if ((!new_text && !new_reasoning) || room(s, (size_t)n + 1))
            continue;
        s->jobs[n] = j;
        s->e[n++] = (struct rq_stream_entry){
            .id = j->rj.id,
            .offset = j->stream_sent,
            .text = sq->text + j->stream_sent,
            .text_len = new_text ? upto - j->stream_sent : 0,
            .has_reasoning = new_reasoning,
            .reasoning_offset = j->stream_rsent,
            .reasoning = new_reasoning ? sq->reasoning + j->stream_rsent : NULL,
            .reasoning_len = new_reasoning ? rupto - j->stream_rsent : 0,
        };
    }
    s->active = streaming > 0;
    if (n)
        send(s, q, n, true);
}

void wk_stream_end(struct wk_stream *s, struct rq *q, struct wk_job *const *jobs, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        struct wk_job *j = jobs[i];
        if (!wk_stream_wants(j) || room(s, (size_t)k + 1))
            continue;
        /* a failed job has no output: nothing more, and the text sent stays where it is */
        size_t sent = !j->output || j->stream_sent < j->output_len ? j->stream_sent : j->output_len;
        size_t rsent = j->stream_rsent < j->reasoning_len ? j->stream_rsent : j->reasoning_len;
        bool more_reasoning = j->reasoning && j->reasoning_len > rsent;
        s->jobs[k] = j;
        s->e[k++] = (struct rq_stream_entry){
            .id = j->rj.id,
            .offset = sent,
            .text = j->output ? j->output + sent : NULL,
            .text_len = j->output ? j->output_len - sent : 0,
            .has_reasoning = more_reasoning,
            .reasoning_offset = rsent,
            .reasoning = more_reasoning ? j->reasoning + rsent : NULL,
            .reasoning_len = more_reasoning ? j->reasoning_len - rsent : 0,
            .end = true,
            .status = rq_status_name(j->status),
            .finish_reason = j->finish_reason,
            .error = j->error,
        };
    }
    if (k)
        send(s, q, k, false);
}
