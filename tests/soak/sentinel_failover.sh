#!/usr/bin/env bash
# What a Sentinel failover loses, with and without redis.wait_replicas (docs/FLEET.md): a master, a
# replica, three sentinels, two workers with their own databases. While the replica lags (stopped
# with SIGSTOP, its link cut by CLIENT KILL), the master is killed
# (kill -9) and the replica promoted. Then everything is drained (the old master back as a
# replica; a third --drain worker reaps the lists the two workers leave) and each job's rows are
# counted in the three databases.
#
#   tests/soak/sentinel_failover.sh --build build --wait 0     # the window: lost and twice-run jobs
#   tests/soak/sentinel_failover.sh --build build --wait 1     # none (exit 1 if any)
#
# Options: --jobs N (before the gap, default 300), --gap-batches B (enqueues of 20 jobs each while
# the replica is cut off, default 8), --max-tokens T (default 40). Prints the
# counts and RESULT: PASS or FAIL. With --wait 1 it fails on any lost or twice-run job; with
# --wait 0 it fails when a lost job is not one enqueued during the gap (the documented window).
set -u
BUILD=
WAITR=1
JOBS=300
GAPB=8
MAXT=40
while [ $# -gt 0 ]; do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --wait) WAITR=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --gap-batches) GAPB=$2; shift 2 ;;
    --max-tokens) MAXT=$2; shift 2 ;;
    *) echo "usage: $0 --build DIR [--wait 0|1] [--jobs N] [--gap-batches B] [--max-tokens T]" >&2; exit 2 ;;
  esac
done
[ -x "$BUILD/llmq" ] || { echo "$0: --build DIR must hold the llmq binary" >&2; exit 2; }
export LLMQ_BIN=$BUILD/llmq
WAIT_S=${WAIT_S:-300}
. "$(dirname "$0")/../cli/worker_lib.sh"
. "$(dirname "$0")/../cli/sentinel_lib.sh"
sentinel_setup

make_model
sentinel_config "  wait_replicas: $WAITR" "  wait_timeout_ms: 300"

jobs_file "$T/jobs.jsonl" "$JOBS" j- "{\"max_tokens\": $MAXT, \"ignore_eos\": true, \"temperature\": 0}"
"$LLMQ" enqueue -c "$CFG" --no-batch "$T/jobs.jsonl" >/dev/null 2>>"$T/enqueue.log" || { echo "first enqueue failed"; exit 1; }
cp "$T/jobs.jsonl" "$T/acked.jsonl" # the jobs whose enqueue reported success
worker_start w1 --db "$T/w1.db" --max-num-seqs 8
worker_start w2 --db "$T/w2.db" --max-num-seqs 8
dbrows() { sqlite3 -batch -noheader "$T/$1.db" "SELECT count(*) FROM jobs" 2>/dev/null || echo 0; }
started() { [ $(($(dbrows w1) + $(dbrows w2))) -ge $((JOBS / 4)) ]; }
wait_until "a quarter of the jobs" started

# the gap: the replica is stopped and its link cut (CLIENT KILL on the master; stopped, it cannot
# reconnect): what the master takes from here on is on the master alone
kill -STOP "$PID_replica"
redis-cli -p "$PM" client kill type replica >/dev/null
r0=$(($(dbrows w1) + $(dbrows w2))) # fetches and acks on the master alone
more() { [ $(($(dbrows w1) + $(dbrows w2))) -ge $((r0 + 20)) ]; }
holding() { grep -q "acks wait" "$T/w1.log" && grep -q "acks wait" "$T/w2.log"; }
if [ "$WAITR" = 0 ]; then wait_until "20 more rows during the gap" more; else wait_until "held acks" holding; fi
ok_gap=0 failed_gap=0
for b in $(seq 1 "$GAPB"); do
  jobs_file "$T/gap$b.jsonl" 20 "g$b-" '{"max_tokens": 4}'
  if "$LLMQ" enqueue -c "$CFG" --no-batch "$T/gap$b.jsonl" >/dev/null 2>>"$T/enqueue.log"; then
    ok_gap=$((ok_gap + 20)); cat "$T/gap$b.jsonl" >>"$T/acked.jsonl"
  else
    failed_gap=$((failed_gap + 20))
  fi
done # queued behind the jobs of the first enqueue: still waiting when the master dies
kill -9 "$PID_master"; wait "$PID_master" 2>/dev/null
kill -CONT "$PID_replica"
failed_over() { [ "$(master_port)" = "$PR" ]; }
wait_until "the failover" failed_over || exit 1
echo "failover: the replica on port $PR is the master"
rejoin_old # so WAIT can be answered again

# drain: the two workers until the queues are empty, then a --drain worker that reaps their lists
idle() { [ "$(redis-cli -p "$PR" llen llmq:queue:short)" = 0 ] && [ "$(redis-cli -p "$PR" zcard llmq:retry)" = 0 ]; }
wait_until "the queues to empty" idle
settled() { ! grep -q "acks wait" <(tail -n 3 "$T/w1.log" "$T/w2.log"); }
wait_until "held acks to go through" settled
kill -TERM "$W_w1" "$W_w2"; worker_wait w1; worker_wait w2
worker_start w3 --db "$T/w3.db" --drain
worker_wait w3

python3 - "$T" "$ok_gap" "$failed_gap" "$WAITR" <<'PY'
import json, sqlite3, sys, collections
t, ok_gap, failed_gap, waitr = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
acked = [json.loads(l)["id"] for l in open(t + "/acked.jsonl")]
rows = collections.Counter()
for w in ("w1", "w2", "w3"):
    try:
        for (i,) in sqlite3.connect(f"{t}/{w}.db").execute("SELECT id FROM jobs"):
            rows[i] += 1
    except sqlite3.Error:
        pass
lost = [i for i in acked if rows[i] == 0]
twice = [i for i in rows if rows[i] > 1]
outside = [i for i in lost if not i.startswith("g")]
print(f"wait_replicas {waitr}: jobs enqueued with success {len(acked)} ({ok_gap} during the gap), "
      f"enqueues refused during the gap {failed_gap} jobs")
print(f"lost (enqueue said ok, no row anywhere): {len(lost)}; run twice (rows in two databases): {len(twice)}")
print(f"lost outside the gap: {len(outside)}  first lost: {lost[:5]}  first twice: {twice[:5]}")
bad = (lost or twice) if waitr != "0" else outside
print("RESULT: " + ("FAIL" if bad else "PASS"))
sys.exit(1 if bad else 0)
PY
rc=$?
[ $rc -eq 0 ] || finish
exit $rc
