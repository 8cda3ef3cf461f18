#!/usr/bin/env bash
# schemas/redis-*.schema.json against what llmq really writes to Redis: a real redis-server and
# worker (tiny model, CPU backend) run jobs of every ending (completed, failed, cancelled at fetch
# and while running, timeout, dead-lettered, not JSON, a duplicate, reaped from a worker killed
# with -9, routed to the long queue and to a model queue, a batch via llmq enqueue, a streaming job,
# a template), and tests/tools/redis_schemas validates every job hash, batch hash, event,
# dead-letter entry, published template and text-stream entry against its schema, once while a job
# runs and once at the end. Then the same checker must fail on a hash with a field too many, an
# unknown event, and a schema missing a field the code writes.
. "$(dirname "$0")/worker_lib.sh"
python3 -c 'import jsonschema' 2>/dev/null ||
  { echo "SKIPPED: the Python module jsonschema is missing (contrib/install-deps.sh installs python3-jsonschema)"; exit 77; }
CHECKER=$(dirname "$0")/../tools/redis_schemas/redis_schemas.py
SCHEMAS=$(dirname "$0")/../../schemas

# ---- the schema files themselves: valid 2020-12, every $id unique
python3 "$CHECKER" "$SCHEMAS" >"$T/files.json" 2>"$T/files.err"
eq "schema files valid, \$ids unique" "$?/$(cat "$T/files.err")" "0/"
mkdir "$T/dupid" && cp "$SCHEMAS"/*.schema.json "$T/dupid/"
sed 's/"urn:llmq:schema:redis-template"/"urn:llmq:schema:redis-event"/' "$SCHEMAS/redis-template.schema.json" \
  >"$T/dupid/redis-template.schema.json"
python3 "$CHECKER" "$T/dupid" >/dev/null 2>"$T/dupid.err"
eq "a duplicate \$id is refused" "$?/$(grep -c 'is also redis-event.schema.json' "$T/dupid.err")" "1/1"

redis_start
make_model --max-position 32768 # room for a job that runs until it is cancelled
write_config "templates:" "  greet: \"Say hello to {who}.\""
export LLMQ_MODEL_NAME=tiny LLMQ_WORKER_PROGRESS_EVERY_TOKENS=2 LLMQ_QUEUES_LONG_THRESHOLD_TOKENS=40
export LLMQ_REDIS_RESULT_MAX_BYTES=400 # OpenAI result lines are longer: their hashes get the marker
# validate NAME [SCHEMA_DIR]: the checker over everything in Redis; summary in $T/NAME.json, errors
# in $T/NAME.err
validate() { python3 "$CHECKER" "${2:-$SCHEMAS}" --port "$PORT" >"$T/$1.json" 2>"$T/$1.err"; }
# seen NAME KIND FIELD: the values of FIELD the checker met in KIND, sorted, space-separated
seen() {
  python3 -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1])).get(sys.argv[2], {}).get(sys.argv[3], [])))' \
    "$T/$1.json" "$2" "$3"
}
hash_is() { [ "$(rcli HMGET "llmq:job:$1" status worker | tr '\n' ' ')" = "$2 $3 " ]; }

# ---- a worker dies (kill -9) while it runs a job: the next one reaps it
echo '{"id": "slow", "prompt": "go on", "max_tokens": 32000, "ignore_eos": true}' >"$T/slow.jsonl"
push_file "$T/slow.jsonl"
worker_start w0
wait_until "w0 to run slow" hash_is slow running w0
kill -9 "$W_w0"
worker_wait w0

# ---- jobs of every ending
long=$(printf 'lorem ipsum %.0s' $(seq 1 20)) # over 40 tokens with the byte-level tokenizer
cat >"$T/plain.jsonl" <<JSONL
{"id": "c1", "prompt": "Hello", "max_tokens": 8, "ignore_eos": true, "stream": true, "metadata": {"k": "v"}}
{"id": "bad-1", "prompt": "x", "max_tokens": -3}
not json {
{"prompt": "no id", "max_tokens": 2}
{"id": "d1", "prompt": "twice", "max_tokens": 4}
{"id": "d1", "prompt": "twice", "max_tokens": 4}
{"id": "cx1", "prompt": "cancelled at fetch", "max_tokens": 4}
{"id": "m1", "model": "other-8b", "prompt": "for another model", "max_tokens": 2}
{"id": "t1", "template": "greet", "vars": {"who": "Bob"}, "max_tokens": 4}
{"id": "L1", "prompt": "$long", "max_tokens": 2}
{"id": "tmo", "prompt": "go on", "max_tokens": 32000, "ignore_eos": true, "timeout_s": 1}
JSONL
cat >"$T/batch.jsonl" <<'JSONL'
{"custom_id": "b-1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}}
{"custom_id": "b-2", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once", "max_tokens": 6, "stream": true}}
{"custom_id": "b-3", "method": "POST", "url": "/v1/completions", "body": {"prompt": "too long", "max_tokens": 99999999}}
JSONL
rcli SADD llmq:cancel cx1 >/dev/null # before it is pushed: a client's SADD (llmq cancel refuses an unknown id)
push_file "$T/plain.jsonl"
"$LLMQ" enqueue -c "$CFG" --batch nightly "$T/batch.jsonl" 2>"$T/enq.err" || bad "enqueue: $(cat "$T/enq.err")"
echo '{"custom_id": "w-1", "method": "POST", "url": "/v1/completions", "body": {"model": "other-8b", "prompt": "waits", "max_tokens": 2}}' |
  "$LLMQ" enqueue -c "$CFG" --batch waiting - 2>"$T/enq2.err" || bad "enqueue: $(cat "$T/enq2.err")"

worker_start w1 --drain
wait_until "w1 to run the reaped job" hash_is slow running w1
validate running
eq "while a job runs: everything valid" "$?/$(head -c 2000 "$T/running.err")" "0/"
eq "while a job runs: a running hash was seen" "$(seen running redis-job-hash status | grep -cw running)" 1
"$LLMQ" cancel -c "$CFG" slow >/dev/null 2>&1
worker_wait w1
eq "w1 exit status (jobs failed: 3)" "$WRC" 3
"$LLMQ" requeue-dead -c "$CFG" bad-1 >/dev/null 2>&1 || bad "requeue-dead failed"
"$LLMQ" batch cancel -c "$CFG" waiting >"$T/bcancel.out" 2>&1 || bad "batch cancel: $(cat "$T/bcancel.out")"

# ---- everything Redis holds now
validate final
eq "at the end: everything valid" "$?/$(head -c 2000 "$T/final.err")" "0/"
# covers NAME KIND FIELD VALUES: the checker met at least these VALUES of FIELD in KIND (a loaded
# machine may add more: a fetch reply lost to a timeout is put back with reason fetch_lost)
covers() {
  local got
  got=$(seen final "$2" "$3")
  if has_all "$got" "$4"; then ok "$1"; else bad "$1: met '$got', want at least '$4'"; fi
}
has_all() { local w; for w in $2; do [[ " $1 " == *" $w "* ]] || return 1; done; }
covers "job hashes of every status but running" redis-job-hash status "cancelled completed failed queued"
covers "hash finish reasons" redis-job-hash finish_reason "cancelled length timeout"
covers "hash error codes" redis-job-hash error_code "cancelled context_length_exceeded timeout"
covers "results: lines and size-cap markers" redis-job-hash result "line marker"
covers "batch states" redis-batch-hash state "cancelled completed"
covers "event kinds" redis-event status \
  "batch_cancelled batch_completed cancel_requested cancelled completed duplicate failed queued running"
covers "reasons" redis-event reason "reaped requeue_dead route_long route_model"
covers "dead-letter codes" redis-dead-entry error_code "context_length_exceeded invalid_json"
covers "stream ends" redis-stream-entry status "completed"
eq "templates" "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["redis-template"]["n"])' "$T/final.json")" 1

# ---- the checker fails when what Redis holds and a schema disagree
rcli HSET llmq:job:c1 note x >/dev/null
rcli XADD llmq:events '*' id c1 status weird worker w1 ts 1 >/dev/null
rcli HINCRBY llmq:batch:nightly total 1 >/dev/null
validate broken
eq "a field too many, an unknown event and counts that miss the total fail" \
  "$?/$(grep -c "^llmq:job:c1: (top): Additional properties are not allowed ('note'" "$T/broken.err")/$(
    grep -c "status: 'weird' is not one of" "$T/broken.err")/$(grep -c "^llmq:batch:nightly: the counts add up to" "$T/broken.err")" \
  "1/1/1/1"
rcli HDEL llmq:job:c1 note >/dev/null
rcli HINCRBY llmq:batch:nightly total -1 >/dev/null
rcli XTRIM llmq:events MAXLEN 0 >/dev/null
mkdir "$T/noupdated" && cp "$SCHEMAS"/*.schema.json "$T/noupdated/"
python3 - "$T/noupdated/redis-job-hash.schema.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
del s["properties"]["updated_at"]
json.dump(s, open(sys.argv[1], "w"))
PY
validate noupdated "$T/noupdated"
eq "a schema without a field the worker writes fails" "$?/$(grep -c "'updated_at' was unexpected" "$T/noupdated.err" | sed 's/^[1-9][0-9]*$/some/')" "1/some"
finish
