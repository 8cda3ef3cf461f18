#!/usr/bin/env bash
# SQLite locked by another process for a while (a Python sqlite3 client holding BEGIN EXCLUSIVE): the
# worker keeps generating, keeps the finished jobs in memory (bounded: it stops fetching) and in
# its Redis processing list, says so in its log, and writes everything once the lock is gone.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config
export LLMQ_SQLITE_COMMIT_MAX_ROWS=16 # at most 4 x 16 finished jobs wait in memory
worker_start w1 --max-num-seqs 8
wait_until "the database" test -f "$DB"
has_worker_row() { [ "$(sql "SELECT count(*) FROM workers")" = 1 ]; }
wait_until "w1's workers row" has_worker_row

# hold the write lock until the checks below are done (touch $T/unlock), however long they take; the
# holder is one process, killed with the workers if the test ends early
locked() { [ -f "$T/locked" ]; }
python3 - "$DB" "$T" <<'PY' &
import os, sqlite3, sys, time
db, t = sys.argv[1:3]
c = sqlite3.connect(db, isolation_level=None)
c.execute("BEGIN EXCLUSIVE")
open(t + "/locked", "w").close()
while not os.path.exists(t + "/unlock"):
    time.sleep(0.1)
c.execute("COMMIT")
PY
LOCK_PID=$!
WORKER_PIDS+=("$LOCK_PID")
wait_until "the lock" locked
N=200
jobs_file "$T/jobs.jsonl" "$N" l- '{"max_tokens": 8, "temperature": 0}'
push_file "$T/jobs.jsonl"
# the worker finds SQLite locked at its first commit, and finishes jobs it cannot write until it has as
# many waiting as it keeps (4 x 16): then it stops fetching
lock_seen() { log_has w1 "sqlite: .*locked.*wait in memory" && log_has w1 "not fetching until they are written"; }
wait_until "w1 to log the lock and stop fetching" lock_seen
eq "no rows while locked" "$(rows)" 0
held=$(rcli LLEN llmq:processing:w1)
[ "$held" -gt 0 ] && ok "finished jobs stay in the processing list ($held)" || bad "nothing held while locked"
[ "$held" -le 100 ] && ok "bounded: the worker stopped fetching ($held held)" || bad "$held jobs held while SQLite is locked"
[ "$(rcli LLEN llmq:queue:short)" -gt 0 ] && ok "the rest waits in the queue" || bad "the worker took everything"
kill -0 "$W_w1" && ok "the worker is alive" || bad "the worker died"
eq "its heartbeat is alive" "$(rcli EXISTS llmq:worker:w1)" 1
grep -q "sqlite: .*locked.*wait in memory" "$T/w1.log" && ok "the lock is logged" || bad "no log line for the lock"
grep -q "not fetching until they are written" "$T/w1.log" && ok "the pause is logged" || bad "no log line for the pause"
touch "$T/unlock"
wait "$LOCK_PID"
all_done() { [ "$(rows)" -ge "$N" ] && [ "$(rcli LLEN llmq:processing:w1)" = 0 ]; }
wait_until "all rows written after the lock" all_done && ok "all rows written after the lock" ||
  echo "  after the lock: $(rows) rows, $(rcli LLEN llmq:processing:w1) held"
grep -q "sqlite: writing again" "$T/w1.log" && ok "the recovery is logged" || bad "no recovery line"
kill -TERM "$W_w1"; worker_wait w1; eq "exit status" "$WRC" 0
eq "one completed row per job" "$(sql "SELECT count(DISTINCT id) || '/' || count(*) FROM jobs WHERE status = 'completed'")" "$N/$N"
eq "queue empty" "$(rcli LLEN llmq:queue:short)" 0
finish
