#!/usr/bin/env bash
# A worker killed (kill -9) after its rows are committed and before it acknowledged them in
# Redis (queues.max_attempts 1): the worker that takes its list back, a restart under the same id
# (recovery) or another worker on the same database file (reaper), finds the committed rows and
# acknowledges the jobs with them: every job completed once, its hash completed with its result,
# nothing dead-lettered, nothing run again. The crash between commit and ack is made certain: the
# jobs finish while SQLite is locked by another process (no row, so no ack), redis-server is
# frozen (SIGSTOP), the lock is released: the rows are committed while every Redis step fails,
# and then the worker is killed. Lines without an id (not JSON) whose failed rows are committed
# the same way are dead-lettered with those rows, once, not failed again into second rows; and
# when the reaper cannot see the row (another database file), the line goes back marked, and a
# worker that can see it fails it again under the same row id (the row written over). With
# results_stream on, each row acknowledged that way goes onto llmq:results once, as committed.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config "results_stream:" "  enabled: true"
export LLMQ_QUEUES_MAX_ATTEMPTS=1 LLMQ_REDIS_CONNECT_TIMEOUT_MS=200
N=10
trap 'kill -CONT "$REDIS_PID" 2>/dev/null; cleanup' EXIT

counted() { [ "$(rcli HGET "llmq:job:$1$2" attempts)" = 1 ] && [ "$(rcli HGET "llmq:job:$1$2" worker)" = "$3" ]; }
all_running() { # PREFIX WORKER: all N jobs fetched by WORKER and running in its engine
  [ "$(rcli LLEN "llmq:processing:$2")" = "$N" ] || return 1
  local i
  for i in $(seq 0 $((N - 1))); do counted "$1" "$i" "$2" || return 1; done
}
rows_of() { sql "SELECT count(*) FROM jobs WHERE id LIKE '$1%'"; }
rows_are() { [ "$(rows_of "$1")" = "$2" ]; }
has_worker_row() { [ "$(sql "SELECT count(*) FROM workers WHERE id = '$1'")" = 1 ]; }
no_heartbeat() { [ "$(rcli EXISTS "llmq:worker:$1")" = 0 ]; }
# lock_db TAG: another process holds the SQLite write lock until $T/unlock-TAG exists
lock_db() {
  python3 - "$DB" "$T/locked-$1" "$T/unlock-$1" <<'PY' &
import os, sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN IMMEDIATE")
open(sys.argv[2], "w").close()
while not os.path.exists(sys.argv[3]):
    time.sleep(0.05)
c.execute("COMMIT")
PY
  WORKER_PIDS+=("$!")
  wait_until "the SQLite lock" test -f "$T/locked-$1"
}
# commit_then_crash PREFIX WORKER: N jobs run on WORKER while another process holds the SQLite
# write lock, so their rows cannot be committed (nor, therefore, acknowledged); redis is frozen,
# then the lock released: the rows are committed and the ack cannot happen. WORKER is killed
# once the N rows exist, and redis thawed.
commit_then_crash() {
  worker_start "$2"
  local pid_var="W_$2"
  wait_until "$2's workers row" has_worker_row "$2" || return 1
  lock_db "$1" || return 1
  jobs_file "$T/$1.jsonl" "$N" "$1" '{"max_tokens": 3}'
  push_file "$T/$1.jsonl"
  wait_until "$2 to run the $N jobs" all_running "$1" "$2" || return 1
  kill -STOP "$REDIS_PID"
  touch "$T/unlock-$1"
  eq "$1: no row before redis froze (so no ack either)" "$(rows_of "$1")" 0
  wait_until "$2 to commit the $N rows with redis frozen" rows_are "$1" "$N"
  kill -9 "${!pid_var}"
  wait "${!pid_var}" 2>/dev/null
  kill -CONT "$REDIS_PID"
  eq "$1: the killed worker's list still holds the jobs" "$(rcli LLEN "llmq:processing:$2")" "$N"
  sql "SELECT id, started_at FROM jobs WHERE id LIKE '$1%' ORDER BY id" >"$T/$1.rows"
}
# settled PREFIX WORKER: WORKER's list is empty and every job's hash is final
settled() {
  [ "$(rcli LLEN "llmq:processing:$2")" = 0 ] || return 1
  local i s
  for i in $(seq 0 $((N - 1))); do
    s=$(rcli HGET "llmq:job:$1$i" status)
    [ "$s" = completed ] || [ "$s" = failed ] || return 1
  done
}
check_acked() { # PREFIX WORKER(the one that crashed)
  local i st res bad_hash=
  for i in $(seq 0 $((N - 1))); do
    st=$(rcli HGET "llmq:job:$1$i" status)
    res=$(rcli HGET "llmq:job:$1$i" result | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["id"], r["status"])' 2>/dev/null)
    [ "$st" = completed ] && [ "$res" = "$1$i completed" ] || bad_hash="$bad_hash $1$i:$st/$res"
  done
  eq "$1: every hash completed with its result" "${bad_hash# }" ""
  eq "$1: nothing dead-lettered" "$(rcli LLEN llmq:dead)" 0
  eq "$1: nothing put back" "$(rcli LLEN llmq:queue:short)" 0
  eq "$1: one completed row per job" "$(sql "SELECT count(*) FROM jobs WHERE id LIKE '$1%' AND status = 'completed'")" "$N"
  # the rows on the results stream: one per job, each the committed row (its started_at)
  eq "$1: each committed row published once, as committed" "$(python3 - "$PORT" "$1" <<'PY'
import json, subprocess, sys
rows = []
for line in subprocess.run(["redis-cli", "-p", sys.argv[1], "XRANGE", "llmq:results", "-", "+"], capture_output=True, text=True).stdout.split("\n"):
    if line.startswith("{"):
        r = json.loads(line)
        if r["id"].startswith(sys.argv[2]):
            rows.append("%s|%s" % (r["id"], repr(r["started_at"])))
print(" ".join(sorted(rows)))
PY
)" "$(python3 -c 'import sqlite3, sys; print(" ".join(sorted("%s|%r" % r for r in sqlite3.connect(sys.argv[1]).execute("SELECT id, started_at FROM jobs WHERE id LIKE ?", (sys.argv[2] + "%",)))))' "$DB" "$1")"
  sql "SELECT id, started_at FROM jobs WHERE id LIKE '$1%' ORDER BY id" >"$T/$1.after"
  cmp -s "$T/$1.rows" "$T/$1.after" && ok "$1: no job ran again (rows unchanged)" ||
    bad "$1: rows changed: $(diff "$T/$1.rows" "$T/$1.after" | head -4 | tr "\n" " ")"
  [ "$(python3 - "$PORT" "$1" <<'PY'
import subprocess, sys
out = subprocess.run(["redis-cli", "-p", sys.argv[1], "XRANGE", "llmq:events", "-", "+"], capture_output=True, text=True).stdout.split("\n")
done = [out[i + 1] for i in range(len(out) - 3) if out[i] == "id" and out[i + 1].startswith(sys.argv[2]) and out[i + 3] == "completed"]
print(len(done), len(set(done)))
PY
)" = "$N $N" ] && ok "$1: one completed event per job" || bad "$1: completed events"
}

# 1. a restart under the same id takes back its list (recovery) and acknowledges the jobs
commit_then_crash a- w1
wait_until "w1's heartbeat to lapse" no_heartbeat w1
worker_start w1
wait_until "w1's list to be settled after its restart" settled a- w1
log_has w1 "acknowledged with the row it had committed" && ok "recovery says so in the log" ||
  bad "no recovery log line"
check_acked a- w1
interrupt "$W_w1"
worker_wait w1

# 2. another worker on the same database file reaps the list and acknowledges the jobs
commit_then_crash b- w2
worker_start w3
wait_until "w2's list to be settled by w3's reaper" settled b- w2
log_has w3 "had a committed row in this worker's database" && ok "the reaper says so in the log" ||
  bad "no reaper log line"
check_acked b- w2
interrupt "$W_w3"
worker_wait w3

# 3. lines that are not JSON (so without an id): w4 fails them, the failed rows are committed
# while redis is frozen, w4 is killed; w5's reaper dead-letters each once with the committed row
line_rows() { sql "SELECT count(*) FROM jobs WHERE status = 'failed' AND request LIKE 'c-%'"; }
line_rows_are() { [ "$(line_rows)" = "$1" ]; }
held_by() { [ "$(rcli LLEN "llmq:processing:$1")" = "$2" ]; }
worker_start w4
wait_until "w4's workers row" has_worker_row w4
lock_db c
for i in 0 1 2; do echo "c-$i is not JSON"; done >"$T/c.lines"
echo "c-0 is not JSON" >>"$T/c.lines" # a second line with the same text
push_file "$T/c.lines"
wait_until "w4 to hold the 4 lines" held_by w4 4
kill -STOP "$REDIS_PID"
# once w4 has given up on redis (the gate closed) no command of its own waits in redis's socket
wait_until "w4 to find redis unreachable" log_has w4 "without Redis"
touch "$T/unlock-c"
wait_until "w4 to commit the 4 failed rows with redis frozen" line_rows_are 4
kill -9 "$W_w4"
wait "$W_w4" 2>/dev/null
kill -CONT "$REDIS_PID"
eq "c: the killed worker's list still holds the lines" "$(rcli LLEN llmq:processing:w4)" 4
worker_start w5
wait_until "w4's list to be taken back by w5's reaper" held_by w4 0
wait_until "the 4 lines in the dead list" test "$(rcli LLEN llmq:dead)" = 4
eq "c: one failed row per line, none added" "$(line_rows)" 4
eq "c: the dead entries are the lines, each once" "$(rcli LRANGE llmq:dead 0 -1 | python3 -c 'import json,sys; print(" ".join(sorted(json.loads(l)["job"] for l in sys.stdin)))')" "$(sort "$T/c.lines" | xargs)"
eq "c: nothing put back" "$(rcli LLEN llmq:queue:short)" 0
eq "c: the 4 failed rows published" "$(rcli XRANGE llmq:results - + | grep -c '"status":"failed"')" 4
interrupt "$W_w5"
worker_wait w5
eq "c: still one failed row per line after w5 stopped" "$(line_rows)" 4

# 4. the same with a reaper on another database file: it cannot see w6's row, so the line goes
# back (marked in llmq:lines with w6); w6 restarted fails it again under its row's id
d_rows() { sql "SELECT count(*) FROM jobs WHERE request LIKE 'd-%'"; }
d_rows_are() { [ "$(d_rows)" = "$1" ]; }
dead_d() { rcli LRANGE llmq:dead 0 -1 | grep -c 'd-0 is not JSON'; }
dead_d_is() { [ "$(dead_d)" = "$1" ]; }
worker_start w6
wait_until "w6's workers row" has_worker_row w6
lock_db d
echo "d-0 is not JSON" >"$T/d.lines"
push_file "$T/d.lines"
wait_until "w6 to hold the line" held_by w6 1
kill -STOP "$REDIS_PID"
wait_until "w6 to find redis unreachable" log_has w6 "without Redis"
touch "$T/unlock-d"
wait_until "w6 to commit the failed row with redis frozen" d_rows_are 1
kill -9 "$W_w6"
wait "$W_w6" 2>/dev/null
kill -CONT "$REDIS_PID"
LLMQ_WORKER_QUEUES=long worker_start w7 --db "$T/other.db"
wait_until "w6's list to be taken back by w7's reaper" held_by w6 0
eq "d: the line is back in its queue" "$(rcli LRANGE llmq:queue:short 0 -1)" "d-0 is not JSON"
eq "d: marked with the worker that held it" "$(rcli HVALS llmq:lines)" w6
interrupt "$W_w7"
worker_wait w7
worker_start w6
wait_until "the line in the dead list" dead_d_is 1
wait_until "w6's list to be empty" held_by w6 0
log_has w6 "written over" && ok "d: w6 says it wrote over its row" || bad "d: no log line about the row"
eq "d: one failed row for the line" "$(d_rows)" 1
eq "d: the mark is gone" "$(rcli HLEN llmq:lines)" 0
interrupt "$W_w6"
worker_wait w6
eq "d: still one row after w6 stopped" "$(d_rows)" 1
finish
