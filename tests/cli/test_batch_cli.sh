#!/usr/bin/env bash
# The batch commands end to end on a real redis-server and SQLite file (tiny model, CPU backend):
# `llmq batch status|list|wait|cancel`, `llmq results --batch` in every format with OpenAI's errors
# file, and `llmq requeue --batch --status failed`. A job fails deterministically on a first worker
# whose model.max_model_len is too small for it and completes on a second one; a wait started
# before any worker returns on the batch-done message with the exit status of a batch with a
# failure; a cancelled batch's queued jobs end cancelled without running, a running one stops.
. "$(dirname "$0")/worker_lib.sh"

redis_start
make_model --max-position 32768 # room for a job that runs until it is cancelled
write_config

cat >"$T/nb.jsonl" <<'EOF2'
{"custom_id": "r-1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once", "max_tokens": 3, "temperature": 0}}
{"custom_id": "r-2", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}}
{"custom_id": "r-3", "method": "POST", "url": "/v1/completions", "body": {"prompt": "needs room", "max_tokens": 100, "temperature": 0}}
EOF2
"$LLMQ" enqueue -c "$CFG" --batch nb "$T/nb.jsonl" 2>/dev/null; eq "enqueue nb" "$?" 0

# ---- status and an unknown id
out=$("$LLMQ" batch status -c "$CFG" nb); eq "status of a queued batch exits 0" "$?" 0
echo "$out" | grep -q "^batch nb: queued" && echo "$out" | grep -q "3 jobs: 3 queued, 0 running" &&
  ok "status shows state and counts" || bad "status: $out"
"$LLMQ" batch status -c "$CFG" nope >/dev/null 2>&1; eq "status of an unknown batch exits 1" "$?" 1
"$LLMQ" batch wait -c "$CFG" nope >/dev/null 2>&1; eq "wait for an unknown batch exits 3" "$?" 3
"$LLMQ" batch frob >/dev/null 2>&1; eq "an unknown batch command exits 2" "$?" 2

# ---- wait, started before any worker: returns on the batch-done message, exit 1 (a job failed)
"$LLMQ" batch wait -c "$CFG" nb >"$T/wait-nb.out" 2>&1 &
wpid=$!
WORKER_PIDS+=("$wpid")
subscribed() { [ "$(rcli PUBSUB NUMSUB llmq:batch-done | tail -1)" = 1 ]; }
wait_until "batch wait to subscribe" subscribed
LLMQ_MODEL_MAX_MODEL_LEN=64 worker_start w1 --drain # r-3 needs more than 64 tokens: it fails here
worker_wait w1
wait_until "batch wait to return" exited "$wpid"
wait "$wpid"; eq "wait: completed with a failure exits 1" "$?" 1
eq "wait prints the final counts" "$(cat "$T/wait-nb.out")" "batch nb: completed; 3 jobs: 0 queued, 0 running, 2 completed, 1 failed, 0 cancelled"
eq "r-3 failed on w1" "$(sql "SELECT status, error_code FROM jobs WHERE id = 'nb/r-3'")" "failed|context_length_exceeded"
"$LLMQ" batch wait -c "$CFG" nb >/dev/null; eq "wait for a finished batch returns at once, exit 1" "$?" 1
out=$("$LLMQ" batch status -c "$CFG" nb); echo "$out" | grep -q "database  3 rows, .* latency p50 [0-9]* ms, p95" &&
  ok "status adds the database's rows and latency" || bad "status with db: $out"
eq "status --format json" "$("$LLMQ" batch status -c "$CFG" --format json nb | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["state"], j["completed"], j["failed"], j["db"]["rows"])')" "completed 2 1 3"

# ---- cancel: queued jobs end cancelled without running
jobs_file "$T/cx.jsonl" 3 cx- '{"max_tokens": 4}'
"$LLMQ" enqueue -c "$CFG" --batch cx "$T/cx.jsonl" 2>/dev/null; eq "enqueue cx" "$?" 0
"$LLMQ" batch wait -c "$CFG" --timeout 0.3 cx >/dev/null 2>&1; eq "wait --timeout on an open batch exits 124" "$?" 124
out=$("$LLMQ" batch cancel -c "$CFG" cx); eq "cancel exits 0" "$?" 0
echo "$out" | grep -q "batch cx: cancelled; 0 running jobs asked to stop, 3 queued jobs" && ok "cancel says what it did" || bad "cancel: $out"
eq "state cancelled, counts unchanged" "$(rcli HMGET llmq:batch:cx state queued | tr '\n' ' ')" "cancelled 3 "
"$LLMQ" batch cancel -c "$CFG" nb >/dev/null 2>&1; eq "cancel of a completed batch exits 1" "$?" 1
"$LLMQ" batch wait -c "$CFG" cx >"$T/wait-cx.out" 2>&1 &
wpid=$!
WORKER_PIDS+=("$wpid")
worker_start w2 --drain
worker_wait w2
wait_until "batch wait cx to return" exited "$wpid"
wait "$wpid"; eq "wait: a cancelled batch exits 4" "$?" 4
eq "cx: every job cancelled, none ran" "$(sql "SELECT count(*), sum(status = 'cancelled'), sum(error_code = 'cancelled'), sum(completion_tokens) FROM jobs WHERE batch_id = 'cx'")" "3|3|3|0"
eq "cx counts exact" "$(rcli HMGET llmq:batch:cx total queued running completed failed cancelled state | tr '\n' ' ')" "3 0 0 0 0 3 cancelled "

# ---- cancel: a running job stops, keeping what it generated
echo '{"id": "cr-long", "prompt": "runs until cancelled", "max_tokens": 30000, "ignore_eos": true}' >"$T/cr.jsonl"
"$LLMQ" enqueue -c "$CFG" --batch cr "$T/cr.jsonl" 2>/dev/null
worker_start w3
running() { [ "$(rcli HGET llmq:job:cr-long completion_tokens)" -ge 2 ] 2>/dev/null; }
wait_until "job cr-long to run" running
out=$("$LLMQ" batch cancel -c "$CFG" cr); echo "$out" | grep -q "1 running job asked to stop" && ok "cancel asks the running job to stop" || bad "cancel cr: $out"
"$LLMQ" batch wait -c "$CFG" cr >/dev/null; eq "wait cr exits 4" "$?" 4
eq "cr-long cancelled with its tokens" "$(sql "SELECT status, completion_tokens > 0 FROM jobs WHERE id = 'cr-long'")" "cancelled|1"
kill -TERM "$W_w3"; worker_wait w3

# ---- list
out=$("$LLMQ" batch list -c "$CFG"); echo "$out" | head -1 | grep -q "^ID *STATE *CREATED" && ok "list has a header" || bad "list: $out"
eq "list: newest first" "$(echo "$out" | awk 'NR > 1 {print $1 ":" $2}' | tr '\n' ' ')" "cr:cancelled cx:cancelled nb:completed "
eq "list --format json --limit 1" "$("$LLMQ" batch list -c "$CFG" --format json -n 1 | python3 -c 'import json,sys; print(*[json.loads(l)["id"] + ":" + str(json.loads(l)["total"]) for l in sys.stdin])')" "cr:1"

# ---- results --batch: only that batch, in every format; the OpenAI errors file
eq "jsonl: nb's three" "$("$LLMQ" results --db "$DB" --batch nb | python3 -c 'import json,sys; print(*sorted(json.loads(l)["custom_id"] for l in sys.stdin))')" "r-1 r-2 r-3"
eq "csv: header and nb's rows" "$("$LLMQ" results --db "$DB" --batch nb --format csv | python3 -c 'import csv,sys; r=list(csv.DictReader(sys.stdin)); print(len(r), *sorted(set(x["batch_id"] for x in r)))')" "3 nb"
eq "jsonl: cx's three" "$("$LLMQ" results --db "$DB" --batch cx | wc -l)" 3
"$LLMQ" results --db "$DB" --batch nb --format openai -o "$T/out.jsonl" --errors "$T/err.jsonl" 2>/dev/null; eq "openai with --errors exits 0" "$?" 0
eq "output file: the completed requests" "$(python3 -c 'import json,sys; print(*sorted(json.loads(l)["custom_id"] + ":" + str(json.loads(l)["error"]) for l in open(sys.argv[1])))' "$T/out.jsonl")" "r-1:None r-2:None"
eq "errors file: OpenAI's shape" "$(python3 -c 'import json,sys; print(*[(lambda j: j["custom_id"] + ":" + str(j["response"]) + ":" + j["error"]["code"] + ":" + str(j["id"].startswith("batch_req_")))(json.loads(l)) for l in open(sys.argv[1])])' "$T/err.jsonl")" "r-3:None:context_length_exceeded:True"
"$LLMQ" results --db "$DB" --batch nb --errors "$T/e2.jsonl" >/dev/null 2>&1; eq "--errors without --format openai exits 2" "$?" 2

# ---- requeue --batch --status failed: exactly the failed one, the batch completes again
out=$("$LLMQ" requeue -c "$CFG" --batch nb --dry-run 2>/dev/null); eq "requeue --dry-run lists the failed job" "$out" "$(printf 'nb/r-3\tfailed\tcontext_length_exceeded')"
eq "dry run pushed nothing" "$(rcli LLEN llmq:queue:short)" 0
out=$("$LLMQ" requeue -c "$CFG" --batch nb); eq "requeue exits 0" "$?" 0
eq "requeue says how many" "$out" "requeued 1 failed job of batch nb"
eq "counts move from failed to queued" "$(rcli HMGET llmq:batch:nb total queued completed failed state | tr '\n' ' ')" "3 1 2 0 running "
eq "the job's hash is queued again" "$(rcli HMGET llmq:job:nb/r-3 status attempts batch_id | tr '\n' ' ')" "queued 0 nb "
out=$("$LLMQ" requeue -c "$CFG" --batch nb --status failed,cancelled 2>&1); eq "a second requeue while it is queued is refused" "$?" 1
echo "$out" | grep -q "refused, nothing pushed: job 'nb/r-3' is queued" && ok "the refusal names the job" || bad "refusal: $out"
eq "nothing pushed twice" "$(rcli LLEN llmq:queue:short)" 1
"$LLMQ" requeue -c "$CFG" --batch cx --status cancelled --dry-run 2>/dev/null | grep -c cancelled | grep -qx 3 && ok "dry run of cancelled jobs" || bad "dry run cancelled"
"$LLMQ" batch wait -c "$CFG" nb --timeout 0.2 >/dev/null 2>&1; eq "nb is open again" "$?" 124
"$LLMQ" requeue -c "$CFG" --batch nb --status failed,cancelled --status completed >/dev/null 2>&1; eq "--status completed is refused" "$?" 2
worker_start w4 --drain
worker_wait w4
eq "the re-run completed on w4" "$(sql "SELECT status, worker_id, error_code IS NULL FROM jobs WHERE id = 'nb/r-3'")" "completed|w4|1"
eq "the others were not run again" "$(sql "SELECT group_concat(worker_id) FROM (SELECT worker_id FROM jobs WHERE batch_id = 'nb' AND id != 'nb/r-3' ORDER BY id)")" "w1,w1"
eq "still three rows" "$(sql "SELECT count(*) FROM jobs WHERE batch_id = 'nb'")" 3
eq "nb completed, counts exact" "$(rcli HMGET llmq:batch:nb total queued running completed failed cancelled state | tr '\n' ' ')" "3 0 0 3 0 0 completed "
"$LLMQ" batch wait -c "$CFG" nb >/dev/null; eq "wait: all completed exits 0" "$?" 0
finish
