#!/usr/bin/env bash
# SIGTERM in the middle of a batch: the worker stops fetching, lets running jobs finish within
# worker.shutdown_timeout_s, hands the rest back to the front of their queue and exits 0; a second
# worker then does exactly the jobs that are left. A second signal stops at once. SIGINT is the same.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config
export LLMQ_ENGINE_CPU_KV_CACHE_BYTES=256MiB
N=64
M_TOK=1200 # long enough that jobs are still running when the signals come
jobs_file "$T/jobs.jsonl" "$N" s- "{\"max_tokens\": $M_TOK, \"ignore_eos\": true, \"temperature\": 0}"
"$LLMQ" enqueue -c "$CFG" "$T/jobs.jsonl" 2>/dev/null || bad "enqueue"

# 1. SIGTERM with no time to finish (shutdown_timeout_s 0): the running jobs are handed back
LLMQ_WORKER_SHUTDOWN_TIMEOUT_S=0 worker_start w1 --max-num-seqs 16
wait_rows 16
t0=$(date +%s.%N)
kill -TERM "$W_w1"
worker_wait w1
t1=$(date +%s.%N)
eq "exit status after SIGTERM" "$WRC" 0
took=$(python3 -c "print(round($t1 - $t0, 2))")
python3 -c "import sys; sys.exit(0 if $took < 5 else 1)" && ok "stopped within the shutdown timeout (+ flush): $took s" || bad "took $took s"
r1=$(rows)
q1=$(rcli LLEN llmq:queue:short)
eq "rows + queued = all jobs" "$((r1 + q1))" "$N"
eq "nothing left in w1's processing list" "$(rcli LLEN llmq:processing:w1)" 0
eq "heartbeat removed" "$(rcli EXISTS llmq:worker:w1)/$(rcli SISMEMBER llmq:workers w1)" "0/0"
grep -q "received SIGTERM" "$T/w1.log" && ok "SIGTERM logged" || bad "no SIGTERM log line"
handed=$(sed -n 's/.*handing \([0-9]*\) unfinished job.*/\1/p' "$T/w1.log")
[ -n "$handed" ] && [ "$handed" -gt 0 ] && ok "hand-back of $handed jobs logged" || bad "no hand-back line"
# the handed-back jobs are at the front (the next fetch takes them first): queued again, the
# delivery not counted, no row
python3 - "$PORT" "$DB" "${handed:-0}" <<'PY' && ok "handed-back jobs are at the front, queued, uncounted, without rows" || bad "handed-back jobs"
import json, sqlite3, subprocess, sys
port, db, handed = sys.argv[1], sys.argv[2], int(sys.argv[3])
cli = lambda *a: subprocess.run(["redis-cli", "-p", port, *a], capture_output=True, text=True).stdout.splitlines()
front = [json.loads(x)["id"] for x in cli("LRANGE", "llmq:queue:short", str(-handed), "-1")]
rows = {r[0] for r in sqlite3.connect(db).execute("SELECT id FROM jobs")}
bad = []
for jid in front:
    h = dict(zip(*[iter(cli("HGETALL", "llmq:job:" + jid))] * 2))
    if h.get("status") != "queued" or h.get("attempts") != "0" or "started_at" not in h or jid in rows:
        bad.append((jid, h))
print("bad:", bad[:3])
sys.exit(1 if bad or len(front) != handed else 0)
PY
eq "stopped_at written" "$(sql "SELECT stopped_at IS NOT NULL FROM workers WHERE id = 'w1'")" 1

# 2. SIGINT with a long timeout: the running jobs finish, nothing is handed back. (Long: the shared
# 10 s could run out on a busy machine before the four jobs' 1200 tokens are generated.)
LLMQ_WORKER_SHUTDOWN_TIMEOUT_S=600 worker_start w2 --max-num-seqs 4
running2() { [ "$(rcli LLEN llmq:processing:w2)" -ge 4 ]; }
wait_until "w2 to run 4 jobs" running2
r2=$(rows)
kill -INT "$W_w2"
worker_wait w2
eq "exit status after SIGINT" "$WRC" 0
grep -q "handing [0-9]* unfinished" "$T/w2.log" && bad "w2 handed jobs back although it had time" || ok "w2 finished its running jobs"
r3=$(rows)
[ "$r3" -gt "$r2" ] && ok "running jobs finished after SIGINT ($r2 -> $r3 rows)" || bad "no rows after SIGINT"
eq "rows + queued = all jobs" "$((r3 + $(rcli LLEN llmq:queue:short)))" "$N"

# 3. two signals: the second one hands everything back at once (the timeout is long, so only the
# second signal can end the wait for the running jobs; the second comes once the first is logged)
LLMQ_WORKER_SHUTDOWN_TIMEOUT_S=600 worker_start w3 --max-num-seqs 16
running3() { [ "$(rcli LLEN llmq:processing:w3)" -ge 16 ]; }
wait_until "w3 to run 16 jobs" running3
kill -TERM "$W_w3"
wait_until "w3 to log the first SIGTERM" log_has w3 "received SIGTERM"
kill -TERM "$W_w3"
worker_wait w3
eq "exit status after two signals" "$WRC" 0
grep -q "received SIGTERM again" "$T/w3.log" && ok "second signal logged" || bad "no second-signal line"
eq "rows + queued = all jobs" "$(($(rows) + $(rcli LLEN llmq:queue:short)))" "$N"
eq "nothing left in w3's list" "$(rcli LLEN llmq:processing:w3)" 0

# 4. a last worker drains the rest: every job exactly once
worker_start w4 --drain
worker_wait w4
eq "w4 exit status" "$WRC" 0
eq "one row per job" "$(sql "SELECT count(DISTINCT id) || '/' || count(*) FROM jobs")" "$N/$N"
eq "all completed with all tokens" "$(sql "SELECT count(*) FROM jobs WHERE status = 'completed' AND completion_tokens = $M_TOK")" "$N"
eq "every job delivered once to the worker that finished it" "$(sql "SELECT max(attempts) FROM jobs")" 1
finish
