#!/usr/bin/env bash
# Redis accepts connections but does not answer (redis-server stopped with SIGSTOP): the engine
# must not wait on it. (a) The held jobs finish and their rows are committed while Redis is
# frozen; once it answers again they are acknowledged, one row each. (b) A freeze longer than the
# heartbeat TTL, with a second worker running: every heartbeat lapses while Redis is frozen, yet
# the live worker keeps its jobs (it heartbeats as soon as Redis answers, within the reaper's
# grace) and no job runs twice. (c) SIGTERM while Redis is frozen: the worker exits within
# worker.shutdown_timeout_s plus a few seconds and leaves what it holds in its processing list,
# from which another worker's reaper takes it: nothing is lost.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config
export LLMQ_REDIS_CONNECT_TIMEOUT_MS=1000 # a command that gets no answer fails after 1 s
frozen=0
freeze() { kill -STOP "$REDIS_PID"; frozen=1; }
thaw() { kill -CONT "$REDIS_PID"; frozen=0; }
trap '[ "$frozen" = 1 ] && kill -CONT "$REDIS_PID" 2>/dev/null; cleanup' EXIT
holds() { [ "$(rcli LLEN "llmq:processing:$1")" -ge "$2" ]; }
# settled W...: the queue and the workers' processing lists are empty
settled() {
  [ "$(rcli LLEN llmq:queue:short)" = 0 ] || return 1
  local w
  for w in "$@"; do [ "$(rcli LLEN "llmq:processing:$w")" = 0 ] || return 1; done
}
dbrows() { sqlite3 -batch -noheader "$1" "SELECT count(*) FROM jobs" 2>/dev/null || echo 0; }
secs() { python3 -c "import time; print(time.monotonic())"; }
N=20

# ---- (a) the engine finishes its held jobs while Redis is frozen
jobs_file "$T/a.jsonl" "$N" a- '{"max_tokens": 300, "ignore_eos": true, "temperature": 0}'
push_file "$T/a.jsonl"
LLMQ_WORKER_HEARTBEAT_TTL_S=30 worker_start wa --max-num-seqs 32
wait_until "wa to hold the $N jobs" holds wa "$N"
freeze
r0=$(rows)
[ "$r0" -lt "$N" ] && ok "frozen with jobs running ($r0 of $N rows)" || bad "all $N jobs were done before the freeze (too fast?)"
t0=$(secs)
# a frozen Redis costs one command timeout (1 s here); the jobs need well under a second more
poll 10 rows_at_least "$N" && ok "all $N rows committed while Redis is frozen ($(python3 -c "print(round($(secs) - $t0, 1))") s)" ||
  bad "only $(rows) of $N rows after 10 s with Redis frozen: the engine waits on Redis"
thaw
wait_until "wa to acknowledge everything" settled wa && ok "acknowledged after Redis answers again"
eq "one row per job" "$(sql "SELECT count(DISTINCT id) || '/' || count(*) FROM jobs WHERE id LIKE 'a-%'")" "$N/$N"
eq "every hash completed" "$(for i in $(seq 0 $((N - 1))); do echo "HGET llmq:job:a-$i status"; done | rcli | sort | uniq -c | awk '{print $1, $2}')" "$N completed"
log_has wa "redis: working again" && ok "the recovery is logged" || bad "no recovery line"
kill -TERM "$W_wa"; worker_wait wa; eq "wa exit status" "$WRC" 0

# ---- (b) a freeze longer than the heartbeat TTL (2 s), a second worker running beside
rm -f "$DB"
jobs_file "$T/b.jsonl" "$N" b- '{"max_tokens": 600, "ignore_eos": true, "temperature": 0}'
push_file "$T/b.jsonl"
# wb1 holds every job; wb2 starts once it does, so it can take them only from wb1 (by reaping).
# wb1 has the default reconnect backoff (up to 5 s), so wb2 is back first once Redis answers.
LLMQ_REDIS_RECONNECT_MAX_MS=5000 worker_start wb1 --max-num-seqs 32
wait_until "wb1 to hold the $N jobs" holds wb1 "$N"
# wb2's reaper waits one heartbeat interval (2 s here) past a lapsed heartbeat before it reaps
LLMQ_SQLITE_PATH=$T/wb2.db LLMQ_WORKER_HEARTBEAT_INTERVAL_S=2 LLMQ_WORKER_HEARTBEAT_TTL_S=4 \
  worker_start wb2 --max-num-seqs 32
beats() { [ "$(rcli EXISTS "llmq:worker:$1")" = 1 ]; }
wait_until "wb2 to heartbeat" beats wb2
freeze
r0=$(rows)
[ "$r0" -lt "$N" ] && ok "frozen with wb1's jobs running ($r0 of $N rows)" || bad "wb1 was done before the freeze (too fast?)"
lapsed() { log_has wb1 "redis: .*failed" && log_has wb2 "redis: .*failed"; }
poll 10 lapsed || bad "the workers did not notice the freeze"
# frozen for well past wb1's heartbeat TTL (2 s)
sleep 5
thaw
wait_until "both workers to settle" settled wb1 wb2 && ok "queue and processing lists empty"
all_rows() { [ $(($(dbrows "$DB") + $(dbrows "$T/wb2.db"))) -ge "$N" ]; }
wait_until "a row for each job" all_rows
kill -TERM "$W_wb1" "$W_wb2"; worker_wait wb1; worker_wait wb2
python3 - "$DB" "$T/wb2.db" "$N" <<'PY' && ok "exactly one row per job across both databases" || bad "a job ran twice or not at all"
import collections, sqlite3, sys
n = int(sys.argv[3])
c = collections.Counter()
for db in sys.argv[1:3]:
    for (i,) in sqlite3.connect(db).execute("SELECT id FROM jobs WHERE id LIKE 'b-%'"):
        c[i] += 1
twice = sorted(k for k, v in c.items() if v > 1)
print("jobs with rows: %d of %d; with two rows: %d %s" % (len(c), n, len(twice), twice[:5]))
sys.exit(0 if len(c) == n and not twice else 1)
PY
reaped=$(rcli XRANGE llmq:events - + | grep -c '^reaped$')
eq "no job reaped from a live worker" "$reaped" 0
eq "every hash completed" "$(for i in $(seq 0 $((N - 1))); do echo "HGET llmq:job:b-$i status"; done | rcli | sort | uniq -c | awk '{print $1, $2}')" "$N completed"

# ---- (c) SIGTERM while Redis is frozen
rm -f "$DB"
jobs_file "$T/c.jsonl" 8 c- '{"max_tokens": 2500, "ignore_eos": true, "temperature": 0}'
push_file "$T/c.jsonl"
LLMQ_WORKER_SHUTDOWN_TIMEOUT_S=1 worker_start wc --max-num-seqs 8
wait_until "wc to hold the jobs" holds wc 8
freeze
t0=$(secs)
kill -TERM "$W_wc"
worker_wait wc
took=$(python3 -c "print(round($(secs) - $t0, 1))")
eq "wc exit status" "$WRC" 0
# shutdown_timeout_s (1) + one command timeout (1) + the wait for Redis at exit (2) + slack
python3 -c "import sys; sys.exit(0 if $took < 7 else 1)" && ok "exited $took s after SIGTERM with Redis frozen" ||
  bad "took $took s to exit with Redis frozen"
thaw
left=$(rcli LLEN llmq:processing:wc)
r=$(rows)
[ "$left" -gt 0 ] && [ $((left + r)) -ge 8 ] && ok "what it held stays in its processing list ($left jobs, $r rows)" ||
  bad "processing list $left, rows $r"
worker_start wd --drain
worker_wait wd
eq "wd exit status" "$WRC" 0
eq "one row per job" "$(sql "SELECT count(DISTINCT id) || '/' || count(*) FROM jobs WHERE id LIKE 'c-%'")" "8/8"
eq "nothing left" "$(rcli LLEN llmq:processing:wc)/$(rcli LLEN llmq:queue:short)" "0/0"
finish
