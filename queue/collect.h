/* Reading the result streams (queue/results.h) through consumer groups: the Redis side of
 * `llmq collect --redis`.
 *
 *     rq_group_create(q, "central");                      // both streams, from their start
 *     struct rq_entries es = {0};
 *     rq_group_claim(q, "central", me, idle_ms, 1000, &es); // entries a dead collector left pending
 *     rq_group_read(q, "central", me, 1000, 1000, &es);      // new entries, waiting up to 1 s
 *     ... write es.e[0..n) into SQLite, commit ...
 *     rq_group_ack(q, "central", &es);                       // XACK only after the commit
 *     rq_streams_trim(q, &trimmed);                          // below every group's acknowledged part
 *     rq_entries_free(&es);
 *
 * Two collectors of one group share the entries (each gets its own); two groups each get them
 * all. An entry read and not acknowledged stays pending on its consumer; a collector that dies
 * leaves it there until another of its group claims it (XAUTOCLAIM, once idle long enough). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

struct rq;

/* The two streams, in the order reads name them. */
enum rq_rstream { RQ_RS_RESULTS, RQ_RS_METRICS, RQ_RS_N };
/* "results", "metrics" (the names in <p>:stream-dropped too). */
const char *rq_rstream_name(int s);
/* The stream's key (borrowed from q). */
const char *rq_rstream_key(const struct rq *q, int s);

/* One entry read. Strings are borrowed from the replies held by its struct rq_entries. */
struct rq_entry {
    int stream;       /* enum rq_rstream */
    char eid[48];     /* the entry's id ("1765000000000-0") */
    const char *kind; /* <p>:metrics: "worker" or "metrics"; NULL for results or when missing */
    const char *row;  /* the row's JSON (NUL-terminated, row_len bytes); NULL when the entry has none */
    size_t row_len;
};

/* What reads and claims brought, appended in order; the replies that own the strings. */
struct rq_entries {
    struct rq_entry *e;
    int n;
    size_t cap;
    redisReply **reply;
    int nreply;
    size_t capreply;
};
/* Forgets the entries and frees the replies (keeps the arrays). */
void rq_entries_clear(struct rq_entries *es);
/* Frees everything. Accepts NULL. */
void rq_entries_free(struct rq_entries *es);

/* Creates consumer group `group` on both streams (XGROUP CREATE ... 0 MKSTREAM), reading from
 * the oldest entry they still hold; one that exists is left as it is. 0, or -1 (rq_error). */
int rq_group_create(struct rq *q, const char *group);

/* Claims for `consumer` up to count entries of either stream that have been pending on another
 * consumer of the group (or this one, in an earlier run) at least min_idle_ms (XAUTOCLAIM), and
 * appends them to out. Returns how many were appended, or -1 (rq_error). */
int rq_group_claim(struct rq *q, const char *group, const char *consumer, int64_t min_idle_ms, int count,
                   struct rq_entries *out);

/* Reads up to count new entries of each stream for `consumer` (XREADGROUP ... >), waiting up to
 * block_ms (at most redis.block_timeout_ms; 0 = no wait) when there are none, and appends them to
 * out. With `own` instead the entries already pending on this consumer (read before and not
 * acknowledged: a failed write, a restart under the same name), without waiting. Returns how many
 * were appended, or -1 (rq_error). */
int rq_group_read(struct rq *q, const char *group, const char *consumer, int count, int block_ms, bool own,
                  struct rq_entries *out);

/* Acknowledges every entry of es (XACK, one pipeline). 0, or -1 (rq_error). */
int rq_group_ack(struct rq *q, const char *group, const struct rq_entries *es);

/* Trims each stream below what every one of its groups has acknowledged: below the oldest entry
 * pending in any group, and, of a group with none pending, through its last delivered entry
 * (XTRIM MINID). A stream without a group is not trimmed (only its length cap applies). *trimmed
 * (may be NULL) gets the entries removed. 0, or -1 (rq_error). */
int rq_streams_trim(struct rq *q, int64_t *trimmed);

/* One consumer group of a stream, as XINFO GROUPS tells. */
struct rq_group_info {
    char name[128];
    int64_t consumers;
    int64_t pending;  /* entries read and not yet acknowledged */
    int64_t lag;      /* entries not yet read; -1 when Redis cannot tell (or is older than 7.0) */
    char last_id[48]; /* the last entry delivered */
};

/* A stream's state: its length, entries the cap dropped (<p>:stream-dropped), and up to max of its
 * groups (*ng: how many there are, also when more than max). 0, or -1 (rq_error). */
int rq_rstream_info(struct rq *q, int s, int64_t *len, int64_t *dropped, struct rq_group_info *g, int max,
                    int *ng);
