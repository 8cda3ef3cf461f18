#!/usr/bin/env bash
# Two workers under one --id: the second is refused while the first lives (it would take the first
# one's processing list back and run its jobs twice); of two started at once exactly one runs;
# --force-id takes the id over, and the worker that loses it stops without acknowledging or
# handing back anything. Every job still ends with exactly one row.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config
N=20
jobs_file "$T/jobs.jsonl" "$N" d- '{"max_tokens": 1500, "ignore_eos": true, "temperature": 0}'
"$LLMQ" enqueue -c "$CFG" "$T/jobs.jsonl" 2>/dev/null || bad "enqueue"
held() { [ "$(rcli LLEN "llmq:processing:$1")" -ge "$2" ]; }

# 1. a live worker holds all 20 jobs; a second one under its id is refused, and takes nothing
worker_start dup --max-num-seqs "$N"
wait_until "dup to hold $N jobs" held dup "$N"
"$LLMQ" worker -c "$CFG" --id dup >"$T/second.log" 2>&1 &
second=$!
WORKER_PIDS+=("$second")
if wait_until "the second worker to exit" exited "$second"; then
  wait "$second"
  eq "second worker under a live id: exit status" "$?" 1
fi
grep -q "ERROR worker id dup is in use: llmq:worker:dup is held by another live worker (host .*, pid $W_dup) and lapses in [0-9.]* s" "$T/second.log" &&
  ok "the refusal names the id, the holder and when its heartbeat lapses" || bad "refusal line: $(grep ERROR "$T/second.log")"
grep -q "took back" "$T/second.log" && bad "the second worker took jobs back" || ok "the second worker took nothing back"
eq "dup still holds its jobs" "$(rcli LLEN llmq:processing:dup)" "$N"
eq "every job delivered once" "$(rcli HGET llmq:job:d-0 attempts)/$(rcli HGET llmq:job:d-19 attempts)" "1/1"
exited "$W_dup" && bad "dup died" || ok "dup still runs"

# 2. two started at the same moment under a fresh id: one wins, the other is refused
for k in a b; do
  "$LLMQ" worker -c "$CFG" --id twin --queues long >"$T/twin-$k.log" 2>&1 &
  printf -v "twin_$k" '%s' "$!"
  WORKER_PIDS+=("$!")
done
one_exited() { exited "$twin_a" || exited "$twin_b"; }
wait_until "one of the twins to exit" one_exited
loser=$twin_a winner=$twin_b lk=a
exited "$twin_a" || { loser=$twin_b winner=$twin_a lk=b; }
wait "$loser"
eq "twins: the loser's exit status" "$?" 1
grep -q "worker id twin is in use" "$T/twin-$lk.log" && ok "the loser says the id is in use" || bad "twin loser: $(tail -2 "$T/twin-$lk.log")"
eq "the heartbeat names the winner" "$(rcli HGET llmq:worker:twin pid)" "$winner"
exited "$winner" && bad "the winner died too" || ok "the winner runs"
kill -TERM "$winner"
wait "$winner"
eq "the winner stops cleanly" "$?" 0

# 3. --force-id takes the id over: dup stops without acks or hand-backs (exit 1), the new one takes
# its list back and does everything
worker_start dup2 --id dup --force-id --drain
wait_until "dup to notice its id was taken over" log_has dup "worker id dup was taken over"
worker_wait dup
eq "dup's exit status after losing its id" "$WRC" 1
log_has dup "handing .* back" && bad "dup handed jobs back" || ok "dup handed nothing back"
log_has dup2 "WARN  worker dup: took the id over from host .* pid $W_dup" && ok "the takeover is logged" ||
  bad "no takeover line: $(head -5 "$T/dup2.log")"
worker_wait dup2
eq "the new holder drains everything" "$WRC" 0
eq "one row per job" "$(sql "SELECT count(DISTINCT id) || '/' || count(*) FROM jobs")" "$N/$N"
eq "all completed" "$(sql "SELECT count(*) FROM jobs WHERE status = 'completed'")" "$N"
eq "nothing left in the list, the queue or dead" "$(rcli LLEN llmq:processing:dup)/$(rcli LLEN llmq:queue:short)/$(rcli LLEN llmq:dead)" "0/0/0"

# 4. a restart right after a crash (kill -9, heartbeat still fresh) on the same host is not refused:
# the earlier run's pid is gone, so its heartbeat is taken over
worker_start re --queues long
hb_there() { [ "$(rcli EXISTS llmq:worker:re)" = 1 ]; }
wait_until "re's heartbeat" hb_there
kill -9 "$W_re"
wait "$W_re" 2>/dev/null
worker_start re --queues long
wait_until "the restarted re to take the heartbeat over" log_has re "the earlier run under this id (pid [0-9]* on this host) is gone; taking its heartbeat over"
eq "the heartbeat names the new run" "$(rcli HGET llmq:worker:re pid)" "$W_re"
kill -TERM "$W_re"
worker_wait re
eq "the restarted worker stops cleanly" "$WRC" 0

# 5. the takeover is noticed at the next acknowledgement, not only at the next heartbeat: g beats
# every 30 s, acks every few ms while it works through short jobs
G=300
jobs_file "$T/g.jsonl" "$G" g- '{"max_tokens": 24, "ignore_eos": true}'
push_file "$T/g.jsonl"
LLMQ_WORKER_HEARTBEAT_INTERVAL_S=30 LLMQ_WORKER_HEARTBEAT_TTL_S=60 worker_start g --max-num-seqs 8
g_rows() { [ "$(sql "SELECT count(*) FROM jobs WHERE id LIKE 'g-%'")" -ge 8 ]; }
wait_until "g to write rows" g_rows
t0=$SECONDS
worker_start g2 --id g --force-id --queues long # takes g's list back onto the short queue, runs nothing
worker_wait g
eq "g's exit status after losing its id" "$WRC" 1
log_has g "worker id g was taken over" && ok "g noticed within $((SECONDS - t0)) s (heartbeat every 30 s)" ||
  bad "g did not say it was taken over: $(tail -2 "$T/g.log")"
[ $((SECONDS - t0)) -lt 20 ] && ok "before its next heartbeat" || bad "g took $((SECONDS - t0)) s"
kill -TERM "$W_g2"
worker_wait g2
worker_start g3 --drain
worker_wait g3
eq "g3 drains the rest" "$WRC" 0
eq "one row per g job" "$(sql "SELECT count(DISTINCT id) || '/' || count(*) FROM jobs WHERE id LIKE 'g-%'")" "$G/$G"
eq "nothing left over" "$(rcli LLEN llmq:processing:g)/$(rcli LLEN llmq:queue:short)/$(rcli LLEN llmq:dead)" "0/0/0"
finish
