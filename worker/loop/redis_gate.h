/* Whether the worker loop may talk to Redis now, and until when its heartbeat holds its jobs.
 *
 * A Redis that accepts connections but does not answer (a stopped process, DEBUG SLEEP, a lost
 * network path) makes every command wait for its timeout. The loop must not wait on it: once a
 * Redis step has failed with the connection lost or timed out, the gate closes and the loop skips
 * every Redis step (their work stays queued in memory: acks, progress, ...) while the engine keeps
 * stepping and rows keep being committed. A probe thread with its own connection tries
 * (connect + PING, every PROBE_MS, each bounded by the connection's timeouts) until Redis answers;
 * the loop sees that at its next check and opens the gate again. The loop never blocks on the
 * probe.
 *
 * The lease: a heartbeat sent at time t keeps this worker's jobs its own until t +
 * heartbeat_ttl_s at least (another worker's reaper waits for the key to expire, and then one
 * heartbeat interval more: queue/reaper.h). Job rows are committed only within the lease; past
 * it the worker first renews its heartbeat and checks which jobs are still in its processing list
 * (queue/owned.h).
 *
 * The struct is used by the loop's thread alone; the probe thread shares only its own part. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

struct rq_conn;
struct wk_probe;

struct wk_gate {
    bool closed;         /* Redis steps are skipped */
    double closed_since; /* monotonic seconds */
    double next_log;     /* while closed: the next "still unreachable" line */
    double lease_until;  /* monotonic seconds; 0 = no heartbeat has been sent yet */
    struct wk_probe *probe;
};

/* Starts the probe thread, idle until the gate closes; its connection is like `like` (address,
 * credentials, timeouts) and named `client_name` in CLIENT LIST. 0, or -1 with err. */
int wk_gate_start(struct wk_gate *g, const struct rq_conn *like, const char *client_name, char *err,
                  size_t errlen);
/* Stops the probe without waiting for it (a probe stuck on a frozen server ends by its timeout
 * and frees itself). Accepts a gate never started. */
void wk_gate_stop(struct wk_gate *g);

/* Closes the gate (a Redis step failed with the connection down) and wakes the probe. */
void wk_gate_close(struct wk_gate *g, double now);
/* Whether the probe has had an answer since the gate closed (then the caller reconnects and
 * calls wk_gate_reopen). False while open. */
bool wk_gate_answered(struct wk_gate *g);
/* Opens the gate. */
void wk_gate_reopen(struct wk_gate *g);
/* The probe's last failure ("no answer within 2000 ms (timeout)"), into buf. */
void wk_gate_error(struct wk_gate *g, char *buf, size_t len);

/* A heartbeat sent at monotonic time `sent` (before the call) succeeded: the lease runs to sent +
 * ttl_s. */
void wk_gate_lease(struct wk_gate *g, double sent, int ttl_s);
/* Whether the lease holds at monotonic time now. */
bool wk_gate_leased(const struct wk_gate *g, double now);
