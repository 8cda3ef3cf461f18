/* See collect_stream.h. */
#include "worker/cli/collect_stream.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "queue/collect.h"
#include "queue/conn.h"
#include "queue/rq.h"
#include "worker/cli/cli.h"
#include "worker/store/db.h"
#include "worker/store/merge.h"
#include "worker/store/row_json.h"

#define TRIM_S 1.0    /* the streams are trimmed at most this often */
#define RETRY_S 1.0   /* after a failure, the next round waits this long */
#define ONCE_FAILS 10 /* --once gives up after this many failures in a row */

static void nap(double secs)
{
    double end = rq_wall_s() + secs;
    while (!cli_interrupted() && rq_wall_s() < end) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Merges one entry's row. 0 written or skipped (malformed: counted), -1 the merge failed (err). */
static int merge_entry(struct merge *m, const struct rq_entry *e, struct collect_stats *st)
{
    json_error_t jerr;
    json_t *o = e->row ? json_loadb(e->row, e->row_len, JSON_ALLOW_NUL, &jerr) : NULL;
    int rc = 0, bad = 0;
    if (e->stream == RQ_RS_RESULTS) {
        struct db_result r;
        struct db_batch b;
        bad = !o || row_json_read_result(o, &r, &b);
        if (!bad)
            rc = (r.batch ? merge_add_batch(m, r.batch) : 0) || merge_add_job(m, &r) ? -1 : 0;
    } else if (e->kind && !strcmp(e->kind, "worker")) {
        struct db_worker_row w;
        bad = !o || row_json_read_worker(o, &w);
        if (!bad) {
            rc = merge_add_worker(m, &w);
            st->worker_rows += rc == 0;
        }
    } else {
        struct db_metrics mr;
        bad = !o || row_json_read_metrics(o, &mr);
        if (!bad) {
            rc = merge_add_metrics(m, &mr);
            st->metrics_rows += rc == 0;
        }
    }
    if (bad) {
        st->malformed++;
        fprintf(stderr, "llmq collect: %s entry %s has no readable row; acknowledged and skipped\n",
                rq_rstream_name(e->stream), e->eid);
    }
    json_decref(o);
    return rc;
}

/* Writes es into db in one merge (its transactions), 0 when all of it is committed. */
static int write_entries(struct db *db, const struct rq_entries *es, int batch, struct collect_stats *st)
{
    char err[1024];
    struct merge_stats ms;
    struct merge *m = merge_open(db, (size_t)batch + 1, &ms, err, sizeof err);
    int rc = m ? 0 : -1;
    for (int i = 0; rc == 0 && i < es->n; i++)
        rc = merge_entry(m, &es->e[i], st);
    if (rc == 0)
        rc = merge_flush(m);
    if (rc)
        fprintf(stderr, "llmq collect: %s: %s (the entries stay pending and are written again)\n",
                db_path(db), err);
    else {
        st->jobs_written += ms.jobs.written;
        st->jobs_kept += ms.jobs.kept;
        st->malformed += ms.jobs.rejected;
        if (ms.jobs.rejected)
            fprintf(stderr, "llmq collect: %lld rows refused by %s, acknowledged and skipped: %s\n",
                    (long long)ms.jobs.rejected, db_path(db), merge_rejected(m));
    }
    merge_close(m);
    return rc;
}

/* Entries pending in the group on either stream (on any consumer), or -1 (rq_error). */
static int64_t group_pending(struct rq *q, const char *group)
{
    int64_t total = 0;
    for (int s = 0; s < RQ_RS_N; s++) {
        struct rq_group_info g[16];
        int64_t len, dropped;
        int ng;
        if (rq_rstream_info(q, s, &len, &dropped, g, 16, &ng))
            return -1;
        for (int i = 0; i < ng && i < 16; i++)
            if (!strcmp(g[i].name, group))
                total += g[i].pending;
    }
    return total;
}

int collect_stream(struct rq *q, struct db *db, const struct collect_opts *o, struct collect_stats *st)
{
    memset(st, 0, sizeof *st);
    double t0 = rq_wall_s(), next_trim = 0, next_claim = 0;
    if (rq_group_create(q, o->group)) {
        fprintf(stderr, "llmq collect: %s\n", rq_error(q));
        return 1;
    }
    struct rq_entries es = {0};
    bool own = true; /* first what is pending on this consumer already (a restart under its name) */
    int fails = 0, rc = 0;
    while (!cli_interrupted()) {
        rq_entries_clear(&es);
        double now = rq_wall_s();
        int n = 0, claimed = 0;
        if (own) {
            n = rq_group_read(q, o->group, o->consumer, o->batch, 0, true, &es);
        } else if (now >= next_claim) {
            n = claimed = rq_group_claim(q, o->group, o->consumer, o->claim_idle_ms, o->batch, &es);
            if (n == 0)
                next_claim = now + o->claim_idle_ms / 2000.0;
        }
        if (n == 0)
            n = rq_group_read(q, o->group, o->consumer, o->batch, o->once ? 0 : 1000, false, &es);
        bool failed = n < 0;
        if (failed) {
            fprintf(stderr, "llmq collect: %s\n", rq_error(q));
            /* the group is gone (a Redis that restarted without persistence, XGROUP DESTROY) */
            if (strstr(rq_error(q), "NOGROUP") && rq_group_create(q, o->group) == 0)
                fprintf(stderr, "llmq collect: group %s created again\n", o->group);
        } else if (n == 0 && own) {
            own = false;
            continue;
        } else if (n > 0) {
            failed = write_entries(db, &es, o->batch, st) != 0;
            if (!failed && rq_group_ack(q, o->group, &es)) {
                fprintf(stderr, "llmq collect: %s (the rows are written; their entries come again)\n",
                        rq_error(q));
                failed = true;
            }
            if (!failed) {
                st->entries += n;
                st->claimed += claimed > 0 ? claimed : 0;
            }
        }
        if (failed) {
            own = true;
            if (o->once && ++fails >= ONCE_FAILS) {
                rc = 1;
                break;
            }
            nap(RETRY_S);
            continue;
        }
        fails = 0;
        now = rq_wall_s();
        if (now >= next_trim || (n == 0 && o->once)) {
            int64_t t = 0;
            if (rq_streams_trim(q, &t) == 0)
                st->trimmed += t;
            else if (!o->quiet)
                fprintf(stderr, "llmq collect: trimming: %s\n", rq_error(q));
            next_trim = now + TRIM_S;
        }
        if (n == 0 && o->once) {
            /* caught up, unless entries are pending on another consumer (one that died: they are
               claimed once idle for claim_idle_ms) */
            int64_t p = group_pending(q, o->group);
            if (p == 0)
                break;
            next_claim = 0;
            nap(p < 0 ? RETRY_S : 0.2);
        }
    }
    rq_entries_free(&es);
    st->seconds = rq_wall_s() - t0;
    return rc;
}
