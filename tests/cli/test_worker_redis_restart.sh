#!/usr/bin/env bash
# Redis goes away in the middle of a run (a clean restart, then a crash with kill -9), with
# appendonly on so it keeps its data: the worker keeps its engine running, says so in its log,
# reconnects with backoff, and in the end every job has exactly one row and nothing is left over.
. "$(dirname "$0")/worker_lib.sh"
redis_start --appendonly yes --appendfsync always
make_model
write_config
N=300
jobs_file "$T/jobs.jsonl" "$N" r- '{"max_tokens": 150, "ignore_eos": true, "temperature": 0}'
push_file "$T/jobs.jsonl"
worker_start w1 --max-num-seqs 32

# 1. a clean restart (SIGTERM: Redis writes its AOF and exits); down until the worker has noticed
# and written rows meanwhile
wait_rows 40
lost=$(log_count w1 "connection lost")
redis_stop
r0=$(rows)
noticed() { [ "$(log_count w1 "connection lost")" -gt "$lost" ]; }
wait_until "w1 to log the lost connection" noticed
wait_rows $((r0 + 1)) && ok "rows written while Redis is down ($r0 -> $(rows))"
r1=$(rows)
redis_again || bad "redis did not come back"
wait_rows $((r1 + 40)) && ok "the worker goes on after the restart"

# 2. a crash (kill -9); down until the worker has noticed
lost=$(log_count w1 "connection lost")
kill -9 "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null; REDIS_PID=
wait_until "w1 to log the lost connection" noticed
redis_again || bad "redis did not come back after kill -9"
kill -0 "$W_w1" && ok "the worker survived both" || bad "the worker died"

done_all() { [ "$(rows)" -ge "$N" ] && [ "$(rcli LLEN llmq:queue:short)" = 0 ] && [ "$(rcli LLEN llmq:processing:w1)" = 0 ]; }
wait_until "all jobs done and the lists empty" done_all && ok "all jobs done, lists empty" ||
  echo "  $(rows) rows, queue $(rcli LLEN llmq:queue:short), processing $(rcli LLEN llmq:processing:w1)"
kill -TERM "$W_w1"; worker_wait w1; eq "exit status" "$WRC" 0
eq "one row per job" "$(sql "SELECT count(DISTINCT id) || '/' || count(*) FROM jobs")" "$N/$N"
eq "all completed" "$(sql "SELECT count(*) FROM jobs WHERE status = 'completed' AND completion_tokens = 150")" "$N"
eq "every hash completed" "$(for i in $(seq 0 $((N - 1))); do echo "HGET llmq:job:r-$i status"; done | rcli | sort | uniq -c | awk '{print $1, $2}')" "$N completed"
grep -qi "redis.*\(lost\|refused\|failed\)" "$T/w1.log" && ok "the outage is logged" || bad "no log line for the outage"
grep -qi "redis: working again\|reconnected\|back" "$T/w1.log" && ok "the recovery is logged" || bad "no log line for the recovery"
finish
