#!/usr/bin/env bash
# Retry, then dead letter: a job that kills every worker running it (here: kill -9 while it runs)
# is put back by the reaper with its delivery counted as a stall, and after queues.max_stalls (3
# here) such deliveries the reaper moves it to llmq:dead instead; other jobs are not held back.
. "$(dirname "$0")/worker_lib.sh"
export LLMQ_QUEUES_MAX_STALLS=3
redis_start
make_model --max-position 16384
write_config
echo '{"id": "poison", "prompt": "never ends", "max_tokens": 16000, "ignore_eos": true}' | "$LLMQ" enqueue -c "$CFG" - 2>/dev/null
holds_poison() { [ "$(rcli HGET llmq:job:poison worker)" = "$1" ] && [ "$(rcli HGET llmq:job:poison status)" = running ]; }
for k in 1 2 3; do
  worker_start "p$k"
  pid_var="W_p$k"
  wait_until "worker p$k to run the poison job (delivery $k)" holds_poison "p$k" &&
    ok "delivery $k: worker p$k runs the job"
  # the delivery counts once the engine starts running it (just before its first step)
  counted() { [ "$(rcli HGET llmq:job:poison attempts)" = "$k" ]; }
  wait_until "delivery $k to be counted" counted && ok "delivery $k counted"
  kill -9 "${!pid_var}"
  wait "${!pid_var}" 2>/dev/null
done
# jobs pushed meanwhile still run once the last worker's list is reaped
jobs_file "$T/after.jsonl" 5 after- '{"max_tokens": 3}'
push_file "$T/after.jsonl"
# --drain waits for p3's list until p3's heartbeat lapses, then its reaper dead-letters the job
worker_start p4 --drain
worker_wait p4
eq "p4 exit status: a job was dead-lettered" "$WRC" 3
grep -q "dead-lettered (1 reaped from crashed workers)" "$T/p4.log" && ok "p4's summary counts it" ||
  bad "p4's summary: $(grep "stopped after" "$T/p4.log")"
eq "the poison job is dead" "$(rcli LLEN llmq:dead)" 1
entry=$(rcli LINDEX llmq:dead 0)
eq "dead entry names it, its attempts and the worker" "$(echo "$entry" | python3 -c 'import json,sys; e=json.load(sys.stdin); print(e["id"], e["attempts"], json.loads(e["job"])["id"], "p3" in e["error"] or e.get("worker") == "p3")')" "poison 3 poison True"
echo "dead entry: $entry" | cut -c1-300
eq "its hash says failed" "$(rcli HGET llmq:job:poison status)" failed
eq "the other jobs completed" "$(sql "SELECT count(*) FROM jobs WHERE id LIKE 'after-%' AND status = 'completed'")" 5
eq "no row claims the poison job completed" "$(sql "SELECT count(*) FROM jobs WHERE id = 'poison' AND status = 'completed'")" 0
eq "all lists empty" "$(rcli LLEN llmq:queue:short)/$(rcli LLEN llmq:processing:p3)/$(rcli ZCARD llmq:retry)" "0/0/0"
finish
