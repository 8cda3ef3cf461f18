#!/usr/bin/env bash
# The results database deleted while the worker runs (rm results.db results.db-wal results.db-shm):
# a connection keeps committing into the unlinked file, so rows written after the deletion would be
# acknowledged in Redis and lost. The worker notices that the path no longer names its file, logs
# one ERROR naming it, creates a new database there and writes every later row into it before the
# ack, and GET /health answers 503 saying so. The deletion happens while the worker is stopped
# (SIGSTOP), so the rows committed before it are known exactly: every job ends with one completed
# hash and a row either from before the deletion or in the new file.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config
export LLMQ_SQLITE_COMMIT_MAX_ROWS=8
worker_start w1 --max-num-seqs 4
N=400
jobs_file "$T/jobs.jsonl" "$N" d- '{"max_tokens": 16, "temperature": 0}'
push_file "$T/jobs.jsonl"
wait_rows 10

kill -STOP "$W_w1"
sql "SELECT id FROM jobs" | sort >"$T/before.txt" # committed before the deletion (acked or not)
before=$(wc -l <"$T/before.txt")
[ "$before" -lt "$N" ] && ok "stopped mid-run ($before of $N rows)" || bad "all done before the deletion"
rm "$DB" "$DB-wal" "$DB-shm" && ok "deleted the database while the worker is stopped" || bad "rm failed"
kill -CONT "$W_w1"

logged() { log_has w1 "ERROR sqlite: $DB: the file was deleted while the database was open"; }
wait_until "the ERROR line naming the path" logged && ok "one ERROR line names the path" ||
  echo "  log: $(grep -i sqlite "$T/w1.log" | tail -3)"
eq "logged once" "$(log_count w1 "the file was deleted while")" 1
log_has w1 "a new database was created at $DB" && ok "the log says a new database was created" || bad "no new-database line"

MP=$(grep -o "metrics: http://127.0.0.1:[0-9]*" "$T/w1.log" | head -1 | sed 's/.*://')
health() {
  python3 - "http://127.0.0.1:$MP/health" <<'PY'
import sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
PY
}
says_deleted() { case "$(health)" in "503 sqlite: "*"was deleted while the database was open"*) return 0 ;; esac; return 1; }
wait_until "/health to answer 503 naming the deletion" says_deleted && ok "/health: 503 naming the deletion" ||
  echo "  /health: $(health)"

all_done() { [ "$(rcli LLEN llmq:queue:short)" = 0 ] && [ "$(rcli LLEN llmq:processing:w1)" = 0 ]; }
wait_until "every job done" all_done
kill -TERM "$W_w1"; worker_wait w1; eq "exit status" "$WRC" 0

# every job completed in Redis, and each has a row that survives: before the deletion, or in the new file
completed=$(rcli EVAL "local n = 0 for i = 0, tonumber(ARGV[1]) - 1 do
  if redis.call('HGET', 'llmq:job:d-' .. i, 'status') == 'completed' then n = n + 1 end end return n" 0 "$N")
eq "every job completed in redis" "$completed" "$N"
[ -f "$DB" ] && ok "a database exists at the path again" || bad "no database at $DB"
sql "SELECT id FROM jobs" | sort >"$T/after.txt"
lost=$(sort -u "$T/before.txt" "$T/after.txt" | wc -l)
eq "every acknowledged job has a surviving row" "$lost" "$N"
eq "no job written twice into the new file" "$(sql "SELECT count(*) - count(DISTINCT id) FROM jobs")" 0
eq "the new file has the workers row" "$(sql "SELECT count(*) FROM workers WHERE id = 'w1'")" 1
eq "and its stop" "$(sql "SELECT stopped_at IS NOT NULL FROM workers WHERE id = 'w1'")" 1
finish
