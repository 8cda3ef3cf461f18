#!/usr/bin/env bash
# Redis Sentinel failover under running workers (docs/FLEET.md): a master, a replica and three
# sentinels (Debian's redis-sentinel) on loopback ports; `llmq enqueue` and two workers find the
# master through the sentinels (redis.sentinels), with redis.wait_replicas: 1. The master is killed
# (kill -9) with jobs running; the sentinels promote the replica; the workers follow it. While the
# new master has no replica, an enqueue fails (its jobs are on one server only) and acks are held;
# once the old master is back as a replica, everything completes: every job exactly once, in one
# row of one of the two workers' databases. Events, not sleeps: the test waits for the sentinels'
# answers and the workers' log lines.
. "$(dirname "$0")/worker_lib.sh"
. "$(dirname "$0")/sentinel_lib.sh"
sentinel_setup
eq "the sentinels name the master" "$(master_port)" "$PM"

make_model
sentinel_config "  wait_replicas: 1" "  wait_timeout_ms: 300"
eq "config keys" "$("$LLMQ" config -c "$CFG" --get redis.sentinels)" \
  "127.0.0.1:${SENT[0]}, 127.0.0.1:${SENT[1]}, 127.0.0.1:${SENT[2]}"

N=120
jobs_file "$T/jobs.jsonl" "$N" s- '{"max_tokens": 60, "ignore_eos": true, "temperature": 0}'
"$LLMQ" enqueue -c "$CFG" --no-batch "$T/jobs.jsonl" >/dev/null 2>"$T/enqueue.log"
eq "enqueue through the sentinels" "$?" 0
eq "the jobs are on the master" "$(redis-cli -p "$PM" llen llmq:queue:short)" "$N"
eq "and on the replica (WAIT)" "$(redis-cli -p "$PR" llen llmq:queue:short)" "$N"

worker_start w1 --db "$T/w1.db" --max-num-seqs 8
worker_start w2 --db "$T/w2.db" --max-num-seqs 8
count() { sqlite3 -batch -noheader "$T/$1.db" "SELECT count(*) FROM jobs" 2>/dev/null || echo 0; }
total() { echo $(($(count w1) + $(count w2))); }
both_ran() { [ "$(count w1)" -ge 5 ] && [ "$(count w2)" -ge 5 ] && [ "$(total)" -ge $((N / 4)) ]; }
wait_until "both workers to write rows" both_ran

# kill -9 the master with jobs held; the sentinels promote the replica
kill -9 "$PID_master"
wait "$PID_master" 2>/dev/null
failed_over() { [ "$(master_port)" = "$PR" ]; }
wait_until "the sentinels to promote the replica" failed_over && ok "failover to the replica"
followed() { log_has w1 "is 127.0.0.1:$PR, was 127.0.0.1:$PM" && log_has w2 "is 127.0.0.1:$PR, was 127.0.0.1:$PM"; }
wait_until "both workers to follow the failover" followed && ok "the workers follow the new master"

# the new master has no replica: acks are held (rows are written), an enqueue fails
held() { grep -q "0 of 1 replica confirmed" "$T/w1.log" "$T/w2.log"; }
wait_until "an ack held for want of a replica" held && ok "acks wait for a replica"
jobs_file "$T/more.jsonl" 5 x- '{"max_tokens": 8, "temperature": 0}'
"$LLMQ" enqueue -c "$CFG" --no-batch "$T/more.jsonl" >/dev/null 2>"$T/enqueue2.log"
rc=$?
check "enqueue without a replica fails (exit $rc)" test "$rc" -ne 0
check "and says why" grep -q "0 of 1 replica confirmed" "$T/enqueue2.log"

# the old master comes back as a replica of the new one: acks and the rest go through
rejoin_old
want=$((N + 5))
done_all() {
  [ "$(total)" -ge "$want" ] && [ "$(redis-cli -p "$PR" llen llmq:queue:short)" = 0 ] &&
    [ "$(redis-cli -p "$PR" llen llmq:processing:w1)" = 0 ] && [ "$(redis-cli -p "$PR" llen llmq:processing:w2)" = 0 ]
}
wait_until "every job done and acknowledged" done_all && ok "all jobs done after the failover"
kill -TERM "$W_w1" "$W_w2"
worker_wait w1; eq "w1 exit status" "$WRC" 0
worker_wait w2; eq "w2 exit status" "$WRC" 0

ids=$( (sqlite3 -batch -noheader "$T/w1.db" "SELECT id FROM jobs"; sqlite3 -batch -noheader "$T/w2.db" "SELECT id FROM jobs") | sort)
eq "one row per job in the two databases, none twice" "$(echo "$ids" | wc -l)/$(echo "$ids" | sort -u | wc -l)" "$want/$want"
eq "every hash completed on the new master" \
  "$( (for i in $(seq 0 $((N - 1))); do echo "HGET llmq:job:s-$i status"; done
       for i in 0 1 2 3 4; do echo "HGET llmq:job:x-$i status"; done) | redis-cli -p "$PR" | sort | uniq -c | awk '{print $1, $2}')" \
  "$want completed"
check "llmq status through the sentinels" "$LLMQ" status -c "$CFG" >/dev/null
finish
