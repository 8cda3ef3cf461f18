#!/usr/bin/env bash
# Attempts count what a job did: a worker killed (kill -9) while it holds jobs that run in its
# engine and jobs that only wait for room counts a stall for the running ones only. Three
# workers in a row take the same jobs and are killed (queues.max_stalls 3): a job that ran in two
# of the lost deliveries runs isolated (one such job at a time, beside the others), the jobs that
# ran at every crash are dead-lettered as poison, the ones that never ran are put back with their
# counts unchanged, and every hash's attempts and stalls equal the crashes it ran in.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model --max-position 16384
write_config
K=3   # kills = queues.max_stalls
export LLMQ_QUEUES_MAX_STALLS=$K
S=8   # --max-num-seqs: jobs that run at once; the worker holds S + S/4 (room to admit next)
jobs_file "$T/jobs.jsonl" 12 j- '{"max_tokens": 16000, "ignore_eos": true}'
push_file "$T/jobs.jsonl"
declare -A ran # job id -> crashes it was running in
# running_on W: the ids whose hash says worker W generated tokens in this delivery
running_on() {
  local id
  for i in $(seq 0 11); do
    id=j-$i
    [ "$(rcli HGET llmq:job:$id worker)" = "$1" ] && [ "$(rcli HGET llmq:job:$id status)" = running ] &&
      [ "$(rcli HGET llmq:job:$id completion_tokens)" -gt 0 ] 2>/dev/null && echo "$id"
  done
}
# expect_running W: how many of W's held jobs run at once: up to S, of which one isolated at most
expect_running() {
  local id s iso=0 non=0
  for id in $(rcli LRANGE "llmq:processing:$1" 0 -1 | python3 -c 'import json,sys; [print(json.loads(l)["id"]) for l in sys.stdin]'); do
    s=$(rcli HGET "llmq:job:$id" stalls)
    if [ "${s:-0}" -ge 2 ]; then iso=1; else non=$((non + 1)); fi
  done
  local n=$((non + iso))
  [ "$n" -gt "$S" ] && n=$S
  echo "$n"
}
all_running() { local n; n=$(expect_running "$1"); [ "$n" -gt 0 ] && [ "$(running_on "$1" | wc -l)" -eq "$n" ]; }
isolated_at_once=0
no_heartbeat() { [ "$(rcli EXISTS "llmq:worker:$1")" = 0 ]; }
list_empty() { [ "$(rcli LLEN "llmq:processing:$1")" = 0 ]; }
# holds_all W: every job not dead-lettered is in W's list, up to what it holds at most (S + S/4)
holds_all() {
  local want=$((12 - $(rcli LLEN llmq:dead)))
  [ "$want" -gt $((S + S / 4)) ] && want=$((S + S / 4))
  [ "$(rcli LLEN "llmq:processing:$1")" = "$want" ]
}
waited=0
for k in $(seq 1 "$K"); do
  worker_start "a$k" --max-num-seqs "$S"
  pid_var="W_a$k"
  [ "$k" -gt 1 ] && { wait_until "a$((k - 1))'s list to be reaped" list_empty "a$((k - 1))" || break; }
  wait_until "a$k to hold the jobs" holds_all "a$k" || break
  wait_until "a$k to run its jobs" all_running "a$k" || break
  held=$(rcli LLEN "llmq:processing:a$k")
  running=$(running_on "a$k")
  kill -9 "${!pid_var}"
  wait "${!pid_var}" 2>/dev/null
  suspects=0
  for id in $running; do [ "${ran[$id]:-0}" -ge 2 ] && suspects=$((suspects + 1)); done
  [ "$suspects" -gt "$isolated_at_once" ] && isolated_at_once=$suspects
  for id in $running; do ran[$id]=$((${ran[$id]:-0} + 1)); done
  echo "kill $k: a$k held $held jobs, $(echo "$running" | wc -w) running"
  waited=$((waited + held - S))
  # the next worker's reaper takes a$k's list back once its heartbeat has lapsed
  wait_until "a$k's heartbeat to lapse" no_heartbeat "a$k"
done
[ "$waited" -gt 0 ] && ok "the killed workers held $waited jobs that had not started" ||
  bad "no held job was waiting (nothing to test)"
# a worker of the long queue only: its reaper takes a$K's list back, it runs none of them
LLMQ_WORKER_QUEUES=long worker_start last
wait_until "a$K's list to be reaped" list_empty "a$K"
kill -9 "$W_last"
wait "$W_last" 2>/dev/null
dead=$(rcli LRANGE llmq:dead 0 -1 | python3 -c 'import json,sys; print(" ".join(sorted(json.loads(l)["id"] for l in sys.stdin)))')
echo "dead-lettered: $dead"
want_dead=$(for id in "${!ran[@]}"; do [ "${ran[$id]}" -ge "$K" ] && echo "$id"; done | sort | xargs)
eq "dead-lettered: exactly the jobs that ran at all $K crashes" "$dead" "$want_dead"
[ -n "$want_dead" ] && ok "a job running at every crash is poison" || bad "no job ran at every crash"
eq "jobs that had run in two lost deliveries ran one at a time" "$isolated_at_once" 1
wrong=
for i in $(seq 0 11); do
  id=j-$i
  a=$(rcli HGET "llmq:job:$id" attempts)
  s=$(rcli HGET "llmq:job:$id" stalls)
  [ "${a:-0}/${s:-0}" = "${ran[$id]:-0}/${ran[$id]:-0}" ] || wrong="$wrong $id:$a/$s/${ran[$id]:-0}"
done
eq "every job's attempts and stalls = the crashes it ran in (id:attempts/stalls/ran)" "${wrong# }" ""
never=$(for i in $(seq 0 11); do [ -z "${ran[j-$i]:-}" ] && echo "j-$i"; done | xargs)
bad_never=
for id in $never; do
  case " $dead " in *" $id "*) bad_never="$bad_never $id" ;; esac
done
eq "no job that never ran is dead-lettered" "${bad_never# }" ""
finish
