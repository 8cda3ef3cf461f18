#!/usr/bin/env bash
# What the log says when Redis refuses or goes away: an OOM refusal (maxmemory reached, noeviction)
# is named as such with Redis's message, not only as an aborted transaction, and the jobs run once
# memory is back; a Redis outage logs at most one connection WARN line per 10 s for both
# connections together, however often they try to reconnect.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config
N=5
jobs_file "$T/jobs.jsonl" "$N" o- '{"max_tokens": 4}'
push_file "$T/jobs.jsonl"

# 1. maxmemory reached: every write is refused with OOM
rcli CONFIG SET maxmemory-policy noeviction >/dev/null
rcli CONFIG SET maxmemory 1 >/dev/null
worker_start w
wait_until "w to log a Redis failure" log_has w "WARN  redis: .* failed:"
first=$(grep -m1 "WARN  redis: .* failed:" "$T/w.log")
echo "first failure line: $first"
case "$first" in
*"OOM command not allowed"*"maxmemory is reached"*) ok "the failure says OOM, with Redis's message" ;;
*) bad "the failure line does not say OOM" ;;
esac
log_has w EXECABORT && bad "EXECABORT in the log" || ok "no bare EXECABORT"
eq "nothing taken while Redis refuses writes" "$(rcli LLEN llmq:queue:short)" "$N"
rcli CONFIG SET maxmemory 0 >/dev/null
wait_rows "$N"
eq "every job once, once memory is back" "$(sql "SELECT count(DISTINCT id) || '/' || count(*) FROM jobs")" "$N/$N"

# 2. Redis away for a few seconds: both connections retry every 100-500 ms (reconnect_max_ms 500)
conn_warns() { log_count w "connection): \(cannot connect\|connection lost\)"; }
before=$(conn_warns)
redis_stop
wait_until "w to notice that Redis is gone" log_has w "connection lost\|cannot connect"
sleep 4 # the outage itself (not a wait for an event): about 15 attempts per connection
redis_again || bad "redis did not come back"
wait_until "w to reconnect" log_has w "connected again"
warns=$(($(conn_warns) - before))
# one line when the outage starts; a second only if one connection's last failed attempt comes
# after the other one is back (a connection that is back starts the next outage's window)
[ "$warns" -ge 1 ] && [ "$warns" -le 2 ] && ok "$warns connection WARN line(s) for a 4 s outage" ||
  bad "$warns connection WARN lines for a 4 s outage: $(grep "connection): " "$T/w.log" | head -4)"
kill -TERM "$W_w"
worker_wait w
eq "the worker stops cleanly" "$WRC" 0
finish
