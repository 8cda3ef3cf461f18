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

# 1. a clean restart (SIGTERM: Redis writes its AOF and exits), down for about a second
wait_rows 40 40 || bad "no rows before the restart"
redis_stop
r0=$(rows)
sleep 1.2
r1=$(rows)
[ "$r1" -gt "$r0" ] && ok "rows written while Redis is down ($r0 -> $r1)" || bad "no progress while Redis was down"
redis_again || bad "redis did not come back"
more() { [ "$(rows)" -ge $((r1 + 40)) ]; }
wait_for 30 more && ok "the worker goes on after the restart" || bad "no rows after the restart"

# 2. a crash (kill -9), down for about a second
kill -9 "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null; REDIS_PID=
sleep 1
redis_again || bad "redis did not come back after kill -9"
kill -0 "$W_w1" && ok "the worker survived both" || bad "the worker died"

done_all() { [ "$(rows)" -ge "$N" ] && [ "$(rcli LLEN llmq:queue:short)" = 0 ] && [ "$(rcli LLEN llmq:processing:w1)" = 0 ]; }
wait_for 50 done_all && ok "all jobs done, lists empty" || bad "not all done: $(rows) rows, queue $(rcli LLEN llmq:queue:short), processing $(rcli LLEN llmq:processing:w1)"
kill -TERM "$W_w1"; worker_wait "$W_w1" 20; eq "exit status" "$WRC" 0
eq "one row per job" "$(sql "SELECT count(DISTINCT id) || '/' || count(*) FROM jobs")" "$N/$N"
eq "all completed" "$(sql "SELECT count(*) FROM jobs WHERE status = 'completed' AND completion_tokens = 150")" "$N"
eq "every hash completed" "$(for i in $(seq 0 $((N - 1))); do echo "HGET llmq:job:r-$i status"; done | rcli | sort | uniq -c | awk '{print $1, $2}')" "$N completed"
grep -qi "redis.*\(lost\|refused\|failed\)" "$T/w1.log" && ok "the outage is logged" || bad "no log line for the outage"
grep -qi "redis: working again\|reconnected\|back" "$T/w1.log" && ok "the recovery is logged" || bad "no log line for the recovery"
finish
