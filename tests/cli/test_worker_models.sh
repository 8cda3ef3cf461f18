#!/usr/bin/env bash
# Routing by model and templates from Redis: a job naming a model this worker does not serve,
# pushed by a plain client to the unnamed queue, is moved to llmq:queue:<model>:short (not run, not
# dead-lettered) and `llmq status` shows it waiting with no live worker; a worker serving that name
# (an alias) runs it later. A worker publishes its templates to llmq:templates; `llmq enqueue` and a
# worker without the template resolve it from there; an unknown template is refused at enqueue; a
# worker whose config has another text under a published name refuses to run.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config "templates:" "  greet: \"Say hello to {who}.\""
export LLMQ_MODEL_NAME=tiny
cat >"$T/jobs.jsonl" <<'JSONL'
{"id": "u1", "prompt": "unnamed", "max_tokens": 3}
{"id": "o1", "model": "other-8b", "prompt": "for the other model", "max_tokens": 3}
{"custom_id": "o2", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "other-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}}
{"id": "t1", "model": "other-8b", "template": "nope", "vars": {}}
{"id": "a1", "model": "tiny", "prompt": "named, served", "max_tokens": 3}
JSONL
push_file "$T/jobs.jsonl"

worker_start w1 --drain
worker_wait w1
eq "w1 exit status" "$WRC" 0
eq "w1 ran the unnamed job and the one naming its model" "$(sql "SELECT group_concat(id || ':' || status || ':' || model, ' ') FROM (SELECT * FROM jobs ORDER BY id)")" "a1:completed:tiny u1:completed:tiny"
eq "jobs for other-8b moved to its queue" "$(rcli LLEN llmq:queue:other-8b:short)" 3
eq "nothing dead-lettered" "$(rcli LLEN llmq:dead)" 0
eq "a moved job's hash: queued on the model queue, delivery not counted" "$(rcli HMGET llmq:job:o1 status queue attempts | tr '\n' ' ')" "queued other-8b:short 0 "
eq "the model is in llmq:models" "$(rcli SISMEMBER llmq:models other-8b)" 1
rcli XRANGE llmq:events - + | grep -q route_model && ok "the move is an event" || bad "no route_model event"
eq "moves counted in the summary" "$(log_count w1 "3 moved to their model's queue")" 1
"$LLMQ" status -c "$CFG" >"$T/status.txt" 2>&1
grep -q "waiting for model 'other-8b': 3 jobs, no live worker serves it" "$T/status.txt" && ok "status shows the unserved model" || bad "status: $(cat "$T/status.txt")"
eq "status --json: models" "$("$LLMQ" status -c "$CFG" --json | python3 -c 'import json,sys; m=json.load(sys.stdin)["models"]["other-8b"]; print(m["short"], m["served"])')" "3 False"
rcli HGET llmq:templates greet | grep -q '"version"' && ok "w1 published its template" || bad "no published template: $(rcli HGET llmq:templates greet)"

# enqueue from a config without templates: the published one resolves; an unknown one is refused
CFG1=$CFG
write_config
CFG2=$CFG
echo '{"id": "e1", "model": "other-8b", "template": "greet", "vars": {"who": "Bob"}, "max_tokens": 3}' >"$T/good.jsonl"
"$LLMQ" enqueue -c "$CFG2" "$T/good.jsonl" 2>"$T/enq.err"
eq "enqueue of a published template" "$?" 0
eq "enqueue pushed it to the model's queue" "$(rcli LLEN llmq:queue:other-8b:short)" 4
echo '{"id": "e2", "template": "nope", "vars": {}}' >"$T/bad.jsonl"
"$LLMQ" enqueue -c "$CFG2" "$T/bad.jsonl" 2>"$T/enq2.err"
eq "enqueue of an unknown template fails" "$?" 1
grep -q "line 1: field 'template': no template named 'nope'" "$T/enq2.err" && ok "named with its line" || bad "enqueue: $(cat "$T/enq2.err")"
eq "nothing pushed" "$(rcli LLEN llmq:queue:short)/$(rcli EXISTS llmq:job:e2)" "0/0"

# a worker serving other-8b as an alias, without the template in its config, runs them
LLMQ_MODEL_ALIASES=other-8b worker_start w2 --drain
worker_wait w2
eq "w2 exit status (job t1 failed: 3)" "$WRC" 3
eq "w2 ran the other-8b jobs, recorded under its model.name" "$(sql "SELECT group_concat(id || ':' || status || ':' || model || ':' || queue, ' ') FROM (SELECT * FROM jobs WHERE id IN ('o1', 'o2', 'e1') ORDER BY id)")" "e1:completed:tiny:other-8b:short o1:completed:tiny:other-8b:short o2:completed:tiny:other-8b:short"
eq "a truly unknown template fails as invalid_request" "$(sql "SELECT status FROM jobs WHERE id = 't1'")" "failed"
eq "the model queue is empty" "$(rcli LLEN llmq:queue:other-8b:short)" 0

# another text under a published name: the worker refuses to run
write_config "templates:" "  greet: \"Greet {who} warmly.\""
worker_start w3 --drain
worker_wait w3
eq "w3 exit status" "$WRC" 1
log_has w3 "template 'greet': this config's text .* differs from the one published" && ok "w3 says why" || bad "w3 gave no reason"
finish
