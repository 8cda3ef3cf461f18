#!/usr/bin/env bash
# Redis Sentinel failover under running workers (docs/FLEET.md): a master, a replica and three
# sentinels (Debian's redis-sentinel) on loopback ports; `llmq enqueue` and two workers find the
# master through the sentinels (redis.sentinels), with redis.wait_replicas: 1. The master is killed
# (kill -9) with jobs running, after a planned failover (SENTINEL FAILOVER) and back; the sentinels
# promote the replica; the workers follow it each time. While the
# new master has no replica, an enqueue fails (its jobs are on one server only) and acks are held;
# once the old master is back as a replica, everything completes: every job exactly once, in one
# row of one of the two workers' databases. Events, not sleeps: the test waits for the sentinels'
# answers and the workers' log lines.
. "$(dirname "$0")/worker_lib.sh"
. "$(dirname "$0")/sentinel_lib.sh"
sentinel_setup
eq "the sentinels name the master" "$(master_port)" "$PM"

make_model
sentinel_config "  wait_replicas: 1" "  wait_timeout_ms: 2000"
eq "config keys" "$("$LLMQ" config -c "$CFG" --get redis.sentinels)" \
  "127.0.0.1:${SENT[0]}, 127.0.0.1:${SENT[1]}, 127.0.0.1:${SENT[2]}"

# enqueue FILE: `llmq enqueue` through the sentinels; its exit status in $?, stderr in $T/enqueue.log
enqueue() { "$LLMQ" enqueue -c "$CFG" --no-batch "$1" >/dev/null 2>"$T/enqueue.log"; }
N1=60 N2=40 N3=24 # jobs before the planned failover, after it, and held when the master is killed
jobs_file "$T/a.jsonl" "$N1" a- '{"max_tokens": 40, "ignore_eos": true, "temperature": 0}'
enqueue "$T/a.jsonl"
eq "enqueue through the sentinels" "$?" 0
eq "the jobs are on the master" "$(redis-cli -p "$PM" llen llmq:queue:short)" "$N1"
eq "and on the replica (WAIT)" "$(redis-cli -p "$PR" llen llmq:queue:short)" "$N1"

worker_start w1 --db "$T/w1.db" --max-num-seqs 8
worker_start w2 --db "$T/w2.db" --max-num-seqs 8
count() { sqlite3 -batch -noheader "$T/$1.db" "SELECT count(*) FROM jobs" 2>/dev/null || echo 0; }
total() { echo $(($(count w1) + $(count w2))); }
at_least() { [ "$(total)" -ge "$1" ]; }
both_ran() { [ "$(count w1)" -ge 5 ] && [ "$(count w2)" -ge 5 ]; }
wait_until "both workers to write rows" both_ran

# 1. a planned failover (the runbook's drill): the old master stays up and becomes a replica
redis-cli -p "${SENT[0]}" sentinel failover mymaster >/dev/null
failed_over() { [ "$(master_port)" = "$PR" ]; }
wait_until "the sentinels to move the master" failed_over && ok "planned failover"
followed() { log_has w1 "is 127.0.0.1:$PR, was 127.0.0.1:$PM" && log_has w2 "is 127.0.0.1:$PR, was 127.0.0.1:$PM"; }
wait_until "both workers to follow the planned failover" followed && ok "the workers follow it"
# the roles swap: the master is on $PM again below, its replica on $PR
t=$PM PM=$PR PR=$t
t=$PID_master PID_master=$PID_replica PID_replica=$t
old_synced() { redis-cli -p "$PR" info replication | grep -q "master_link_status:up"; }
wait_until "the old master to be a replica in sync" old_synced
jobs_file "$T/b.jsonl" "$N2" b- '{"max_tokens": 40, "ignore_eos": true, "temperature": 0}'
enqueue "$T/b.jsonl"
eq "enqueue on the new master" "$?" 0
wait_until "every job so far done on the new master" at_least $((N1 + N2)) && ok "jobs go on on the new master"

# 2. kill -9 the master while both workers hold jobs (long ones); the sentinels promote the replica
jobs_file "$T/c.jsonl" "$N3" c- '{"max_tokens": 400, "ignore_eos": true, "temperature": 0}'
enqueue "$T/c.jsonl"
eq "enqueue of long jobs" "$?" 0
holding() { [ "$(redis-cli -p "$PM" llen llmq:processing:w1)" -gt 0 ] && [ "$(redis-cli -p "$PM" llen llmq:processing:w2)" -gt 0 ]; }
wait_until "both workers to hold jobs" holding
kill -9 "$PID_master"
wait "$PID_master" 2>/dev/null
wait_until "the sentinels to promote the replica" failed_over && ok "failover to the replica"
wait_until "both workers to follow the failover" followed && ok "the workers follow the new master"

# the new master has no replica: acks are held (rows are written), an enqueue fails
held() { grep -q "0 of 1 replica confirmed" "$T/w1.log" "$T/w2.log"; }
wait_until "an ack held for want of a replica" held && ok "acks wait for a replica"
# ... counted on /metrics (the port each worker logged)
shortfalls() {
  local url
  url=$(grep -ho "http://127.0.0.1:[0-9]*/metrics" "$T/$1.log" | head -1)
  python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$url" \
    2>/dev/null | awk '/^llmq_redis_wait_shortfalls_total /{print $2}'
}
counted_any() { local a b; a=$(shortfalls w1); b=$(shortfalls w2); [ "${a:-0}" -gt 0 ] || [ "${b:-0}" -gt 0 ]; }
wait_until "llmq_redis_wait_shortfalls_total > 0" counted_any && ok "shortfalls counted on /metrics"
jobs_file "$T/x.jsonl" 5 x- '{"max_tokens": 8, "temperature": 0}'
enqueue "$T/x.jsonl"
rc=$?
check "enqueue without a replica fails (exit $rc)" test "$rc" -ne 0
check "and says why" grep -q "0 of 1 replica confirmed" "$T/enqueue.log"

# the old master comes back as a replica of the new one: acks and the rest go through
rejoin_old
want=$((N1 + N2 + N3 + 5))
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
  "$(cat "$T"/[abcx].jsonl | python3 -c 'import json, sys; [print("HGET llmq:job:" + json.loads(l)["id"] + " status") for l in sys.stdin]' |
    redis-cli -p "$PR" | sort | uniq -c | awk '{print $1, $2}')" \
  "$want completed"
"$LLMQ" status -c "$CFG" >"$T/status.out" 2>&1
eq "llmq status through the sentinels" "$?" 0
finish
