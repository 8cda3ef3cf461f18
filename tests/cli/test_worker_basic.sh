#!/usr/bin/env bash
# `llmq worker` end to end on a real redis-server and SQLite file (tiny model, CPU backend): jobs
# pushed by redis-cli (not llmq) in both forms come out as rows whose output matches `llmq run` on
# the same jobs; `llmq enqueue` (validation, ids, line numbers), `llmq status`, `llmq cancel` of a
# queued and of a running job, `llmq requeue-dead`, the workers and worker_metrics rows, and the
# command line's errors.
. "$(dirname "$0")/worker_lib.sh"

# ---- the command line
out=$("$LLMQ" worker --help 2>&1); eq "worker --help" "$?" 0
echo "$out" | grep -q "Usage: llmq worker" || bad "worker --help has no Usage line"
out=$("$LLMQ" worker --no-such 2>&1); eq "worker: bad flag" "$?" 2
out=$(env -u LLMQ_CONFIG "$LLMQ" worker --redis redis://127.0.0.1:1 2>&1); eq "worker without a model" "$?" 2
echo "$out" | grep -q -- "--model is required" || bad "missing --model not explained: $out"
out=$("$LLMQ" worker --model /nonexistent --queues middle 2>&1); eq "worker: bad --queues" "$?" 2
out=$("$LLMQ" enqueue --queue sideways 2>&1); eq "enqueue: bad --queue" "$?" 2
out=$("$LLMQ" cancel 2>&1); eq "cancel without ids" "$?" 2
out=$("$LLMQ" requeue-dead 2>&1); eq "requeue-dead without ids" "$?" 2
out=$("$LLMQ" requeue-dead --all x 2>&1); eq "requeue-dead --all and ids" "$?" 2
out=$("$LLMQ" status --redis redis://127.0.0.1:1 2>&1); eq "status: redis unreachable" "$?" 69
echo "$out" | grep -qi "refused\|connect" || bad "unreachable redis not explained: $out"

redis_start
make_model --max-position 32768 # room for a job that runs long enough to be cancelled
write_config
out=$("$LLMQ" worker -c "$CFG" --model "$T/no-model" 2>&1); eq "worker: missing model folder" "$?" 1
eq "worker: missing model folder, said once" "$(grep -c "model $T/no-model: not a model folder (it does not exist)$" <<<"$out")" 1

# ---- jobs from redis-cli, both forms, with and without ids
cat >"$T/jobs.jsonl" <<'EOF'
{"id": "a", "prompt": "Hello there", "max_tokens": 12, "temperature": 0, "ignore_eos": true, "metadata": {"doc": 1}}
{"id": "b", "messages": [{"role": "user", "content": "Summarize: cats sleep a lot."}], "max_tokens": 6, "temperature": 0, "enable_thinking": false}
{"prompt": "no id here", "max_tokens": 3, "temperature": 0}
{"custom_id": "oa-1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0}}
{"custom_id": "oa-2", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once", "max_tokens": 4, "temperature": 0}}
EOF
push_file "$T/jobs.jsonl"
worker_start w1 --drain
worker_wait w1
eq "worker --drain exit status" "$WRC" 0
eq "rows for redis-cli jobs" "$(rows)" 5
eq "all completed" "$(sql "SELECT count(*) FROM jobs WHERE status = 'completed'")" 5
eq "queue emptied" "$(rcli LLEN llmq:queue:short)" 0
eq "processing list emptied" "$(rcli LLEN llmq:processing:w1)" 0
eq "row a" "$(sql "SELECT queue, finish_reason, completion_tokens, prompt_tokens > 0, json_extract(metadata, '$.doc'), worker_id, request_form FROM jobs WHERE id = 'a'")" "short|length|12|1|1|w1|llmq"
eq "row a times" "$(sql "SELECT created_at <= started_at AND started_at <= first_token_at AND first_token_at <= finished_at AND ttft_ms >= 0 AND latency_ms >= ttft_ms AND queue_ms >= 0 FROM jobs WHERE id = 'a'")" 1
eq "OpenAI rows keep custom_id" "$(sql "SELECT group_concat(id || '=' || custom_id || ':' || request_form, ',') FROM (SELECT * FROM jobs WHERE custom_id IS NOT NULL ORDER BY id)")" "oa-1=oa-1:openai,oa-2=oa-2:openai"
gen=$(sql "SELECT id FROM jobs WHERE id NOT IN ('a', 'b', 'oa-1', 'oa-2')")
[[ "$gen" =~ ^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$ ]] && ok "a job without id got a UUIDv7" || bad "generated id '$gen'"
eq "its hash is completed" "$(rcli HGET "llmq:job:$gen" status)" completed
eq "hash a" "$(rcli HMGET llmq:job:a status completion_tokens worker | tr '\n' ' ')" "completed 12 w1 "
eq "params stored" "$(sql "SELECT json_extract(params, '$.max_tokens'), json_extract(params, '$.temperature') FROM jobs WHERE id = 'a'")" "12|0.0"
eq "a chat job's params keep enable_thinking" "$(sql "SELECT json_extract(params, '$.enable_thinking') FROM jobs WHERE id = 'b'")" "0"
eq "result column is the result line" "$(sql "SELECT json_extract(result, '$.custom_id'), json_extract(result, '$.response.status_code') FROM jobs WHERE id = 'oa-1'")" "oa-1|200"

# the same jobs through `llmq run` (the offline path, same engine): same texts
"$LLMQ" run --model "$M" --input "$T/jobs.jsonl" --output "$T/run.jsonl" --backend cpu --threads 1 2>/dev/null
python3 - "$T/run.jsonl" "$DB" <<'PY' && ok "outputs equal llmq run's" || bad "outputs differ from llmq run's"
import json, sqlite3, sys
run = [json.loads(l) for l in open(sys.argv[1])]
db = sqlite3.connect(sys.argv[2])
rows = {r[0]: r[1] for r in db.execute("SELECT id, output FROM jobs")}
texts = {}
for r in run:
    if "custom_id" in r:
        b = r["response"]["body"]
        c = b["choices"][0]
        texts[r["custom_id"]] = c["message"]["content"] if "message" in c else c["text"]
    elif r["id"] in ("a", "b"):
        texts[r["id"]] = r["text"]
bad = [k for k, v in texts.items() if rows.get(k) != v]
if bad or len(texts) != 4:
    print("differ:", bad, texts, rows)
    sys.exit(1)
PY
eq "workers row: stopped" "$(sql "SELECT id, backend, stopped_at >= started_at, jobs_done FROM workers")" "w1|cpu|1|5"
eq "a worker_metrics row" "$(sql "SELECT count(*) > 0, sum(jobs_done) FROM worker_metrics WHERE worker_id = 'w1'")" "1|5"
eq "heartbeat removed" "$(rcli EXISTS llmq:worker:w1)" 0
# the loop's timing line is a developer's figure: at debug level, or with --stats
grep -q "worker stats" "$T/w1.log" && bad "a timing line at info level: $(grep "worker stats" "$T/w1.log")" || ok "no timing line at info level"

# ---- enqueue: validation with line numbers, ids, both queues
cat >"$T/enq.jsonl" <<'EOF'
{"prompt": "first", "max_tokens": 2}

{"id": "e-2", "prompt": "second", "max_tokens": 2}
not json
{"id": "e-4", "prompt": "x", "max_token": 3}
{"custom_id": "oa-e", "method": "POST", "url": "/v1/completions", "body": {"prompt": "p", "max_tokens": 2}}
{"id": "e-6", "prompt": "", "max_tokens": 2}
EOF
out=$("$LLMQ" enqueue -c "$CFG" --print-ids "$T/enq.jsonl" 2>"$T/enq.err"); rc=$?
eq "enqueue with bad lines exits 1" "$rc" 1
grep -q "line 4: invalid JSON" "$T/enq.err" && ok "bad line 4 reported" || bad "line 4 not reported: $(cat "$T/enq.err")"
grep -q "line 5: unknown field 'max_token' (did you mean 'max_tokens'?)" "$T/enq.err" && ok "bad line 5 reported" || bad "line 5 not reported"
grep -q "line 7: " "$T/enq.err" && ok "bad line 7 reported" || bad "line 7 not reported"
grep -q "6 jobs read, 3 with problems: nothing pushed" "$T/enq.err" && ok "enqueue summary" || bad "summary: $(tail -1 "$T/enq.err")"
eq "a file with bad lines pushes nothing" "$(rcli LLEN llmq:queue:short) $(rcli ZCARD llmq:batches) $out" "0 0 "
grep -v -e "not json" -e '"max_token":' -e '"prompt": ""' "$T/enq.jsonl" >"$T/enq-good.jsonl"
out=$("$LLMQ" enqueue -c "$CFG" --batch enq-1 --print-ids "$T/enq-good.jsonl" 2>"$T/enq.err"); rc=$?
eq "enqueue of the good lines" "$rc" 0
grep -q "batch enq-1: 3 of 3 jobs pushed" "$T/enq.err" && ok "enqueue summary names the batch" || bad "summary: $(tail -1 "$T/enq.err")"
eq "enqueue printed 3 ids" "$(echo "$out" | wc -l)" 3
eq "ids in order (an OpenAI line's is batch/custom_id)" "$(echo "$out" | sed -n 2,3p | tr '\n' ' ')" "e-2 enq-1/oa-e "
id1=$(echo "$out" | head -1)
eq "queued in order, the id written into the job" "$(rcli LINDEX llmq:queue:short -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')" "$id1"
eq "hash created at enqueue" "$(rcli HGET "llmq:job:$id1" status)" queued
echo '{"id": "big", "prompt": "'"$(printf 'word %.0s' $(seq 1 100))"'"}' | "$LLMQ" enqueue -c "$CFG" --queue auto - 2>"$T/enq2.err" >/dev/null
eq "enqueue from stdin" "$?" 0
grep -q "1 to llmq:queue:short, 0 to llmq:queue:long" "$T/enq2.err" && ok "--queue auto: short" || bad "auto routing: $(cat "$T/enq2.err")"
# 500 bytes / 4 = 125 estimated tokens: long only when the threshold is lower
echo '{"id": "big2", "prompt": "'"$(printf 'word %.0s' $(seq 1 100))"'"}' | LLMQ_QUEUES_LONG_THRESHOLD_TOKENS=100 "$LLMQ" enqueue -c "$CFG" --queue auto - 2>"$T/enq3.err" >/dev/null
grep -q "0 to llmq:queue:short, 1 to llmq:queue:long" "$T/enq3.err" && ok "--queue auto: long" || bad "auto routing to long: $(cat "$T/enq3.err")"

# ---- status
out=$("$LLMQ" status -c "$CFG"); eq "status" "$?" 0
echo "$out" | grep -q "short 4  long 1" && ok "status shows queue depths" || bad "status: $out"
out=$("$LLMQ" status -c "$CFG" --json)
eq "status --json" "$(echo "$out" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["queues"]["short"], d["queues"]["long"], d["dead"])')" "4 1 0"
# its reals as stored: the shortest text that reads back (Python's repr), not 17 digits
python3 - "$out" <<'PY' && ok "status --json: reals written short" || bad "status --json reals: $out"
import json, re, sys
text = sys.argv[1]
reals = re.findall(r'(?<=[:\[,])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?=[,\]}])', re.sub(r'"(?:[^"\\]|\\.)*"', '""', text))
reals = [r for r in reals if "." in r or "e" in r.lower()]
assert any(r for r in reals), "no real in the output"
for r in reals:
    assert r == repr(float(r)), (r, repr(float(r)))
assert isinstance(json.loads(text)["time"], float)
PY

"$LLMQ" status -c "$CFG" --watch --json >"$T/watch.out" 2>&1 &
watch_pid=$!
printed() { [ "$(wc -l <"$T/watch.out")" -ge 1 ]; }
wait_until "status --watch to print a frame" printed && ok "status --watch printed"
interrupt "$watch_pid"; wait "$watch_pid"; eq "status --watch stops on Ctrl-C" "$?" 0

# ---- cancel a queued job, and a running one
rcli DEL llmq:queue:short llmq:queue:long >/dev/null
echo '{"id": "cq", "prompt": "never runs", "max_tokens": 5}' | "$LLMQ" enqueue -c "$CFG" - 2>/dev/null
out=$("$LLMQ" cancel -c "$CFG" cq); eq "cancel a queued job" "$?" 0
eq "cancel output" "$out" "cq: cancel requested"
echo '{"id": "cr", "prompt": "runs long", "max_tokens": 30000, "ignore_eos": true, "temperature": 0}' | "$LLMQ" enqueue -c "$CFG" - 2>/dev/null
worker_start w2 --stats
running() { [ "$(rcli HGET llmq:job:cr completion_tokens)" -ge 20 ] 2>/dev/null; }
wait_until "job cr to run" running && ok "job cr is running"
out=$("$LLMQ" cancel -c "$CFG" cr)
echo "$out" | grep -q "cr: cancel requested" && ok "cancel a running job" || bad "cancel: $out"
wait_rows 7
eq "queued job cancelled" "$(sql "SELECT status, finish_reason, completion_tokens, output FROM jobs WHERE id = 'cq'")" "cancelled|cancelled|0|"
r=$(sql "SELECT status, finish_reason, completion_tokens > 0 AND completion_tokens < 30000, length(output) > 0 FROM jobs WHERE id = 'cr'")
eq "running job cancelled with partial output" "$r" "cancelled|cancelled|1|1"
eq "hash cancelled" "$(rcli HGET llmq:job:cr status)" cancelled
eq "cancel set cleaned up" "$(rcli SISMEMBER llmq:cancel cr)" 0
out=$("$LLMQ" cancel -c "$CFG" cr); eq "cancel of an ended job exits 0" "$?" 0
eq "cancel of an ended job says so" "$out" "cr: already cancelled, nothing to cancel"

# ---- dead letters and requeue-dead (the worker w2 is still running)
rcli LPUSH llmq:queue:short '{"id": "d1", "prompt": "x", "max_tokens": 99999999}' >/dev/null
dead_one() { [ "$(rcli LLEN llmq:dead)" = 1 ]; }
wait_until "a dead letter" dead_one && ok "a job over max_model_len is dead-lettered"
eq "its row is failed with the reason" "$(sql "SELECT status, error LIKE '%max_model_len%' FROM jobs WHERE id = 'd1'")" "failed|1"
kill -TERM "$W_w2"; worker_wait w2; eq "worker stops on SIGTERM" "$WRC" 0
log_has w2 "INFO  worker stats: " && ok "--stats: the timing line at exit" || bad "--stats: no timing line at exit"
out=$("$LLMQ" requeue-dead -c "$CFG" d1); eq "requeue-dead ID" "$?" 0
eq "requeue-dead output" "$out" "requeued 1 job"
eq "back on its queue" "$(rcli LLEN llmq:queue:short)" 1
eq "dead list empty" "$(rcli LLEN llmq:dead)" 0
out=$("$LLMQ" requeue-dead -c "$CFG" nosuch); eq "requeue-dead of an unknown id exits 1" "$?" 1

# ---- AUTH with an ACL user and SELECT of a database, from the URL and from the config
redis_stop
REDIS_OPTS=(--requirepass s3cret --user worker on '>wpass' '~*' '&*' '+@all')
redis_again || bad "redis with a password did not start"
acli() { redis-cli -p "$PORT" -a s3cret --no-auth-warning "$@"; }
AURL="redis://worker:wpass@127.0.0.1:$PORT/3"
out=$(echo '{"id": "auth-1", "prompt": "hi", "max_tokens": 2}' | "$LLMQ" enqueue -c "$CFG" --redis "redis://127.0.0.1:$PORT" - 2>&1)
eq "enqueue without the password fails" "$?" 1
echo "$out" | grep -qi "auth\|password" && ok "the missing password is named" || bad "no auth error: $out"
echo '{"id": "auth-1", "prompt": "hi", "max_tokens": 2}' | "$LLMQ" enqueue -c "$CFG" --redis "$AURL" - 2>/dev/null
eq "enqueue as the ACL user into db 3" "$(acli -n 3 LLEN llmq:queue:short)" 1
eq "db 0 untouched" "$(acli -n 0 EXISTS llmq:job:auth-1)" 0
LLMQ_REDIS_USERNAME=worker LLMQ_REDIS_PASSWORD=wpass LLMQ_REDIS_DB=3 worker_start w3 --redis "redis://127.0.0.1:$PORT" --drain --log-level debug
worker_wait w3
log_has w3 "DEBUG worker stats: " && ok "--log-level debug: the timing line at exit" || bad "debug: no timing line at exit"
eq "worker with ACL user from the environment" "$WRC" 0
eq "its row" "$(sql "SELECT status, worker_id FROM jobs WHERE id = 'auth-1'")" "completed|w3"
eq "its hash in db 3" "$(acli -n 3 HGET llmq:job:auth-1 status)" completed
finish
