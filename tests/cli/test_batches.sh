#!/usr/bin/env bash
# Batches and job identity end to end on a real redis-server and SQLite file (tiny model, CPU
# backend): two nights' `llmq enqueue` of the same OpenAI file keep every row (key
# <batch>/<custom_id>), each batch's hash counts exactly and completes with an event and a PUBLISH
# on llmq:batch-done; a file with duplicate ids is refused with both line numbers and nothing is
# pushed; a known id is refused without --replace and runs again with it; a plain-LPUSH copy of a
# completed job, or of one running on a live worker, is not run twice (one row, a duplicate event,
# a log line), while a copy of a job whose worker lapsed runs; failed rows carry error_code.
. "$(dirname "$0")/worker_lib.sh"

redis_start
make_model --max-position 32768 # room for a job that runs until it is cancelled
write_config

cat >"$T/night.jsonl" <<'EOF'
{"custom_id": "r-1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once", "max_tokens": 3, "temperature": 0}}
{"custom_id": "r-2", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}}
{"custom_id": "r-3", "method": "POST", "url": "/v1/completions", "body": {"prompt": "too long", "max_tokens": 99999999}}
EOF

# ---- duplicate ids inside one file: refused with both line numbers, nothing pushed
{ cat "$T/night.jsonl"; echo; head -1 "$T/night.jsonl"; } >"$T/dup.jsonl"
out=$("$LLMQ" enqueue -c "$CFG" --batch dup "$T/dup.jsonl" 2>&1); eq "a file with a duplicate id exits 1" "$?" 1
echo "$out" | grep -q "line 5: id 'dup/r-1' is already on line 1" && ok "the duplicate is named with both lines" || bad "duplicate: $out"
eq "nothing pushed, no batch" "$(rcli LLEN llmq:queue:short) $(rcli EXISTS llmq:batch:dup) $(rcli ZCARD llmq:batches)" "0 0 0"

# ---- two nights of the same file
rcli SUBSCRIBE llmq:batch-done >"$T/sub.out" 2>&1 &
sub=$!
WORKER_PIDS+=("$sub")
subscribed() { [ "$(rcli PUBSUB NUMSUB llmq:batch-done | tail -1)" = 1 ]; }
wait_until "the subscriber" subscribed
b1=$("$LLMQ" enqueue -c "$CFG" "$T/night.jsonl" 2>"$T/e1.err"); eq "first night enqueued" "$?" 0
[[ "$b1" =~ ^batch_[0-9a-f]{32}$ ]] && ok "a new batch id on stdout" || bad "batch id '$b1'"
out=$("$LLMQ" enqueue -c "$CFG" --batch night-2 "$T/night.jsonl" 2>"$T/e2.err"); eq "second night enqueued" "$?" 0
eq "a named batch prints nothing" "$out" ""
eq "batch hash at enqueue" "$(rcli HMGET "llmq:batch:$b1" id input total queued running state | tr '\n' ' ')" "$b1 $T/night.jsonl 3 3 0 queued "
eq "batches by creation" "$(rcli ZRANGE llmq:batches 0 -1 | tr '\n' ' ')" "$b1 night-2 "
eq "job hash names its batch" "$(rcli HMGET llmq:job:night-2/r-1 status batch_id | tr '\n' ' ')" "queued night-2 "
out=$("$LLMQ" enqueue -c "$CFG" --batch night-2 --replace "$T/night.jsonl" 2>&1); eq "an existing batch name is refused" "$?" 1
echo "$out" | grep -q "batch 'night-2' exists" || bad "existing batch not explained: $out"

worker_start w1 --drain
worker_wait w1
eq "six rows: both nights kept" "$(sql "SELECT count(*) FROM jobs")" 6
eq "rows by batch" "$(sql "SELECT group_concat(batch_id = '$b1' OR batch_id = 'night-2', '') || ':' || group_concat(custom_id || '=' || status || '/' || coalesce(error_code, '-'), ',') FROM (SELECT * FROM jobs WHERE batch_id = 'night-2' ORDER BY custom_id)")" "111:r-1=completed/-,r-2=completed/-,r-3=failed/context_length_exceeded"
eq "first night's rows" "$(sql "SELECT count(*) FROM jobs WHERE batch_id = '$b1' AND id = '$b1/' || custom_id")" 3
for b in "$b1" night-2; do
  eq "batch $b counts" "$(rcli HMGET "llmq:batch:$b" total queued running completed failed cancelled state | tr '\n' ' ')" "3 0 0 2 1 0 completed "
  ttl=$(rcli TTL "llmq:batch:$b"); [ "$ttl" -gt 0 ] && ok "batch $b expires" || bad "batch $b TTL $ttl"
done
eq "batches rows" "$(sql "SELECT group_concat(input = '$T/night.jsonl' AND total = 3 AND state = 'completed' AND finished_at >= created_at, '') FROM batches")" 11
eq "batch_summary" "$(sql "SELECT jobs, completed, failed, latency_p50_ms > 0, last_finished_at_iso LIKE '20%Z' FROM batch_summary WHERE batch_id = 'night-2'")" "3|2|1|1|1"
eq "job_failures" "$(sql "SELECT id, error_code FROM job_failures WHERE batch_id = 'night-2'")" "night-2/r-3|context_length_exceeded"
eq "the request as received" "$(sql "SELECT json_extract(request, '$.custom_id') || json_extract(request, '$.batch_id') FROM jobs WHERE id = 'night-2/r-1'")" "r-1night-2"
eq "failed hash has the code" "$(rcli HGET llmq:job:night-2/r-3 error_code)" context_length_exceeded
events() { rcli XRANGE llmq:events - + | grep -cx "$1"; }
eq "one batch_completed event per batch" "$(events batch_completed)" 2
published() { grep -qx "$b1" "$T/sub.out" && grep -qx night-2 "$T/sub.out"; }
wait_until "both batch ids on llmq:batch-done" published && ok "batch-done published"

# ---- a known id: refused without --replace, run again with it
out=$("$LLMQ" enqueue -c "$CFG" --batch night-2 --append "$T/night.jsonl" 2>&1); eq "known ids refused" "$?" 1
echo "$out" | grep -q "line 1: job 'night-2/r-1' is already completed .*--replace" && ok "the known id is named" || bad "known id: $out"
eq "nothing pushed" "$(rcli LLEN llmq:queue:short)" 0
"$LLMQ" enqueue -c "$CFG" --batch night-2 --append --replace "$T/night.jsonl" 2>/dev/null; eq "--replace pushes them" "$?" 0
eq "the batch is open again" "$(rcli HMGET llmq:batch:night-2 total queued completed failed state | tr '\n' ' ')" "3 3 0 0 running "
worker_start w2 --drain
worker_wait w2
eq "still six rows" "$(sql "SELECT count(*) FROM jobs")" 6
eq "the re-run wrote them" "$(sql "SELECT group_concat(worker_id, ',') FROM (SELECT worker_id FROM jobs WHERE batch_id = 'night-2' ORDER BY id)")" "w2,w2,w2"
eq "night-2 completed again" "$(rcli HMGET llmq:batch:night-2 completed failed state | tr '\n' ' ')" "2 1 completed "
eq "a second batch_completed" "$(events batch_completed)" 3

# ---- plain-LPUSH copies: of a completed job (not run), of a job whose worker lapsed (runs)
rcli LPUSH llmq:queue:short "$(sql "SELECT request FROM jobs WHERE id = 'night-2/r-1'")" >/dev/null
rcli HSET llmq:job:lapsed status running worker ghost >/dev/null
rcli LPUSH llmq:queue:short '{"id": "lapsed", "prompt": "x", "max_tokens": 2}' >/dev/null
worker_start w3 --drain
worker_wait w3
eq "the copy wrote no row" "$(sql "SELECT worker_id FROM jobs WHERE id = 'night-2/r-1'")" w2
eq "the lapsed worker's job ran" "$(sql "SELECT worker_id FROM jobs WHERE id = 'lapsed'")" w3
eq "a duplicate event" "$(events duplicate)" 1
log_has w3 "job night-2/r-1 arrived again while completed.*not run" && ok "the duplicate is logged" || bad "no duplicate log line"
eq "counts unchanged" "$(rcli HMGET llmq:batch:night-2 completed failed running | tr '\n' ' ')" "2 1 0 "

# ---- a copy of a job running on a live worker: not run
echo '{"id": "long", "prompt": "runs until cancelled", "max_tokens": 30000, "ignore_eos": true}' >"$T/long.jsonl"
"$LLMQ" enqueue -c "$CFG" --no-batch "$T/long.jsonl" 2>/dev/null; eq "enqueue --no-batch" "$?" 0
eq "a job without a batch" "$(rcli HEXISTS llmq:job:long batch_id)" 0
worker_start w4
running() { [ "$(rcli HGET llmq:job:long completion_tokens)" -ge 2 ] 2>/dev/null; }
wait_until "job long to run on w4" running
rcli LPUSH llmq:queue:short '{"id": "long", "prompt": "runs until cancelled", "max_tokens": 30000, "ignore_eos": true}' >/dev/null
dup2() { [ "$(events duplicate)" = 2 ]; }
wait_until "the running job's copy to be recognized" dup2 && ok "the running job's copy is a duplicate"
eq "... held by w4" "$(rcli HMGET llmq:job:long status worker | tr '\n' ' ')" "running w4 "
"$LLMQ" cancel -c "$CFG" long >/dev/null
wait_until "job long's row" rows_at_least 8
kill -TERM "$W_w4"; worker_wait w4
eq "one row for long" "$(sql "SELECT count(*), status, worker_id, batch_id IS NULL FROM jobs WHERE id = 'long'")" "1|cancelled|w4|1"
eq "cancelled has its code" "$(sql "SELECT error_code FROM jobs WHERE id = 'long'")" cancelled
finish
