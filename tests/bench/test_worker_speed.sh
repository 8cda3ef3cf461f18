#!/usr/bin/env bash
# The queue path's speed (docs/PERFORMANCE.md "Queue path"), with the tiny model on the CPU
# backend (one engine thread) so the engine's share stays small:
#   1. throughput: N jobs with max_tokens 1 LPUSHed by redis-cli into a running, idle worker;
#      jobs/s from the first LPUSH to the last committed row;
#   2. the worker's own overhead per engine step (Redis + SQLite + bookkeeping, engine_step
#      excluded) with 256 jobs running at once, from the worker's exit line.
# It checks that every job got its row and prints the numbers; the floors it asserts are far
# below the targets (1,000 jobs/s, < 1 ms per step) so that a busy machine does not fail it, but a
# broken path (a round trip per job, a transaction per row) does.
# LLMQ_BENCH_JOBS=N changes N (default 20000).
. "$(dirname "$0")/../cli/worker_lib.sh"
redis_start
make_model
write_config
# the chores at their default pace (the shared test config makes them fast for crash tests)
export LLMQ_WORKER_HEARTBEAT_INTERVAL_S=5 LLMQ_WORKER_HEARTBEAT_TTL_S=30 LLMQ_WORKER_REAPER_INTERVAL_S=10 \
  LLMQ_QUEUES_RETRY_BACKOFF_BASE_MS=1000 LLMQ_SQLITE_BUSY_TIMEOUT_MS=5000
N=${LLMQ_BENCH_JOBS:-20000}
python3 - "$T/jobs.jsonl" "$N" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({"id": "b%d" % i, "prompt": "doc %d" % i, "max_tokens": 1}) + "\n")
PY

# 1. throughput
worker_start w1 --stats
wait_until "the database" test -f "$DB"
ready() { [ "$(rcli EXISTS llmq:worker:w1)" = 1 ]; }
wait_until "w1's heartbeat" ready
t0=$(python3 -c 'import time; print(time.time())')
push_file "$T/jobs.jsonl"
t_push=$(python3 -c 'import time; print(time.time())')
wait_rows "$N" || echo "  $(rows) rows"
sleep 0.2
kill -TERM "$W_w1"; worker_wait w1
eq "worker exit status" "$WRC" 0
eq "one completed row per job" "$(sql "SELECT count(DISTINCT id) FROM jobs WHERE status = 'completed' AND completion_tokens = 1")" "$N"
eq "nothing left in Redis" "$(rcli LLEN llmq:queue:short)/$(rcli LLEN llmq:processing:w1)" "0/0"
IFS="|" read -r jps span worker_jps <<<"$(sql "SELECT $N / (max(finished_at) - $t0), max(finished_at) - $t0, count(*) / (max(finished_at) - min(started_at)) FROM jobs")"
printf 'throughput: %d jobs (max_tokens 1) from the first LPUSH to the last committed row in %.2f s: %.0f jobs/s (the push took %.2f s; the worker alone: %.0f jobs/s from its first fetch)\n' \
  "$N" "$span" "$jps" "$(python3 -c "print($t_push - $t0)")" "$worker_jps"
grep "worker stats:" "$T/w1.log" | sed 's/.*INFO  //'
python3 -c "import sys; sys.exit(0 if $jps >= 200 else 1)" && ok "throughput over the 200 jobs/s floor" || bad "throughput $jps jobs/s"

# 2. overhead per step at 256 running jobs
rcli FLUSHALL >/dev/null
jobs_file "$T/decode.jsonl" 256 d- '{"max_tokens": 256, "ignore_eos": true, "temperature": 0}'
push_file "$T/decode.jsonl"
worker_start w2 --drain --max-num-seqs 256 --stats
worker_wait w2
eq "decode run exit status" "$WRC" 0
eq "256 more rows" "$(sql "SELECT count(*) FROM jobs WHERE id LIKE 'd-%' AND completion_tokens = 256")" 256
line=$(grep "worker stats:" "$T/w2.log" | sed 's/.*INFO  //')
echo "$line"
full=$(echo "$line" | sed -n 's/.*at full batch \([0-9.]*\) us mean over \([0-9]*\) steps.*/\1 \2/p')
read -r us steps <<<"$full"
[ -n "$us" ] && [ "${steps:-0}" -ge 200 ] && ok "steps at 256 running jobs measured ($steps)" || bad "no full-batch steps in: $line"
printf 'overhead at 256 running jobs: %s us per step (mean over %s steps)\n' "$us" "$steps"
python3 -c "import sys; sys.exit(0 if ${us:-1e9} < 5000 else 1)" && ok "overhead under the 5 ms floor" || bad "overhead $us us per step"
finish
