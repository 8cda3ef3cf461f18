#!/usr/bin/env bash
# A running worker meets keys of the wrong type, one after another: a job whose hash is a string,
# a dead list that is a string while a job must be dead-lettered, a cancel set that is a string,
# the worker's own processing list as a string, the published templates as a string.
# No job disappears (each gets exactly one row, the bad job stays held until its key is fixed
# and is then dead-lettered), the other jobs keep flowing, the planted keys are left as they were,
# and the log names each key once instead of at every round.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config

# one job per line, llmq's form; $2.. are the ids
push_ids() {
  local f=$T/push.jsonl
  : >"$f"
  local id
  for id in "$@"; do printf '{"id":"%s","prompt":"Tell me about %s.","max_tokens":4}\n' "$id" "$id" >>"$f"; done
  push_file "$f"
}
has_row() { [ "$(sql "SELECT count(*) FROM jobs WHERE id = '$1'")" = 1 ]; }
warns() { grep -c -- "WARN.*$1" "$T/w1.log"; }

worker_start w1

# 1. the hash of job "evil" is a string: it runs without its hash, the others around it too
rcli SET llmq:job:evil x >/dev/null
push_ids a0 a1 evil a2 a3
wait_rows 5
eq "the job with a string hash ran once" "$(sql "SELECT status FROM jobs WHERE id = 'evil'")" completed
eq "its hash is left as it was" "$(rcli GET llmq:job:evil)" x
eq "the others completed" "$(sql "SELECT count(*) FROM jobs WHERE id LIKE 'a%' AND status = 'completed'")" 4

# 2. the dead list is a string when a malformed job must be dead-lettered: it stays held, the
#    others flow; once the key is deleted it is dead-lettered
rcli SET llmq:dead x >/dev/null
printf '{"id":"m1","prompt":17}\n' >"$T/bad.jsonl"
push_file "$T/bad.jsonl"
push_ids b0 b1 b2
wait_until "the malformed job's row and the good jobs' rows" rows_at_least 9
wait_until "a log line naming llmq:dead" log_has w1 "llmq:dead"
held() { [ -n "$(rcli LPOS llmq:processing:w1 '{"id":"m1","prompt":17}')" ]; }
check "the malformed job is still in the processing list" held
push_ids b3 b4
wait_rows 11
eq "the dead list is left as it was" "$(rcli GET llmq:dead)" x
rcli DEL llmq:dead >/dev/null
dead_one() { [ "$(rcli LLEN llmq:dead)" = 1 ]; }
wait_until "the malformed job dead-lettered once the key is fixed" dead_one
check "its dead entry holds the job" sh -c "redis-cli -p $PORT LINDEX llmq:dead 0 | grep -q m1"

# 3. the cancel set is a string: `llmq cancel` refuses naming it, running jobs are not disturbed
rcli SET llmq:cancel x >/dev/null
printf '{"id":"long","prompt":"Go on.","max_tokens":400,"ignore_eos":true}\n' >"$T/long.jsonl"
push_file "$T/long.jsonl"
push_ids c0 c1
out=$("$LLMQ" cancel -c "$CFG" c9 2>&1)
rc=$?
check "llmq cancel fails" test "$rc" -ne 0
check "llmq cancel names the key: $out" sh -c "echo '$out' | grep -q 'llmq:cancel'"
wait_rows 14
wait_until "a log line naming llmq:cancel" log_has w1 "llmq:cancel"
eq "the cancel set is left as it was" "$(rcli GET llmq:cancel)" x

# 4. the worker's own processing list is a string: it fetches nothing (the jobs wait in their
#    queue) until the key is deleted
proc_empty() { [ "$(rcli LLEN llmq:processing:w1)" = 0 ]; }
wait_until "the processing list to empty" proc_empty
rcli SET llmq:processing:w1 x >/dev/null
push_ids d0 d1
wait_until "a log line naming llmq:processing:w1" log_has w1 "llmq:processing:w1"
eq "the jobs wait in their queue" "$(rcli LLEN llmq:queue:short)" 2
rcli DEL llmq:processing:w1 >/dev/null
wait_rows 16

# 5. the published templates are a string: a job naming a template that is not in the config
#    fails with its reason (not handed back and fetched again for ever); the others flow
rcli SET llmq:templates x >/dev/null
printf '{"id":"t1","template":"nope","vars":{"document":"x"}}\n' >"$T/tpl.jsonl"
push_file "$T/tpl.jsonl"
push_ids e0
wait_rows 18
eq "the templated job failed with its reason" \
  "$(sql "SELECT status || ': ' || error FROM jobs WHERE id = 't1'" | grep -c "failed: .*template")" 1
dead_two() { [ "$(rcli LLEN llmq:dead)" = 2 ]; }
wait_until "the templated job dead-lettered" dead_two
eq "the templates key is left as it was" "$(rcli GET llmq:templates)" x

# every job exactly once, nothing stranded
wait_until "the processing list to empty" proc_empty
eq "one row per job" "$(sql "SELECT count(DISTINCT id) || '/' || count(*) FROM jobs")" "18/18"
eq "nothing left in the queue or the processing list" \
  "$(rcli LLEN llmq:queue:short)/$(rcli LLEN llmq:processing:w1)" "0/0"
# each key named once, not at every round (the worker kept running meanwhile)
eq "llmq:job:evil named once" "$(warns llmq:job:evil)" 1
eq "llmq:dead named once" "$(warns llmq:dead)" 1
eq "llmq:cancel named once" "$(warns llmq:cancel)" 1
eq "llmq:processing:w1 named once" "$(warns llmq:processing:w1)" 1
eq "llmq:templates named once" "$(warns llmq:templates)" 1
check "the worker is still running" kill -0 "$W_w1"
interrupt "$W_w1"
worker_wait w1
eq "worker exit status" "$WRC" 0
finish
