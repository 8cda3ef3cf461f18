#!/usr/bin/env bash
# Results in Redis and text streaming, on a real redis-server, SQLite file and worker (tiny model,
# CPU backend): a finished job's hash holds in its `result` field the very line `llmq results`
# exports for its row (completed, OpenAI-form, failed and dead-lettered jobs alike); a cap of a
# few bytes (redis.result_max_bytes) leaves a marker instead and `llmq wait` still prints the
# result, from SQLite; `llmq wait` with Redis alone prints the text; a job with "stream": true
# has its text in llmq:stream:<id> (entries that add up to the final text, then one end entry),
# a job without it makes no stream key; `llmq config` shows the keys.
. "$(dirname "$0")/worker_lib.sh"
command -v jq >/dev/null || { echo "SKIPPED: jq is not installed"; exit 77; }

redis_start
make_model
write_config

# ---- the config keys
out=$("$LLMQ" config -c "$CFG")
for k in "result_max_bytes: 1MiB" "stream_maxlen: 10000" "stream_interval_ms: 100"; do
  echo "$out" | grep -q "^  $k" && ok "llmq config shows $k" || bad "llmq config lacks '$k'"
done

# ---- jobs of every ending, pushed by a plain Redis client
cat >"$T/jobs.jsonl" <<'EOF2'
{"id": "r-1", "prompt": "Hello there", "max_tokens": 8, "temperature": 0, "ignore_eos": true, "metadata": {"k": "v"}}
{"custom_id": "oa-1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}}
{"id": "bad-1", "prompt": "x", "max_tokens": -3}
{"id": "ctx-1", "prompt": "x", "max_tokens": 99999999}
{"id": "s-1", "prompt": "Stream this", "max_tokens": 40, "temperature": 0, "ignore_eos": true, "stream": true}
{"custom_id": "s-2", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once", "max_tokens": 6, "temperature": 0, "stream": true}}
EOF2
push_file "$T/jobs.jsonl"
LLMQ_REDIS_STREAM_INTERVAL_MS=0 worker_start w1 --drain # every step's text goes out: several entries
worker_wait w1
eq "worker w1 exit (bad-1 and ctx-1 fail)" "$WRC" 3

"$LLMQ" results --db "$DB" >"$T/export.jsonl"
# hash_result ID: the hash's result field, byte for byte (redis-cli adds one newline)
hash_result() { rcli HGET "llmq:job:$1" result; }
# exported ID: the exported line of job ID (its id, or custom_id for OpenAI lines), byte for byte
exported() {
  python3 -c 'import json, sys
for l in open(sys.argv[1], encoding="utf-8"):
    d = json.loads(l)
    if d.get("custom_id", d.get("id")) == sys.argv[2]:
        print(l.rstrip("\n"))' "$T/export.jsonl" "$1"
}
for id in r-1 oa-1 bad-1 ctx-1 s-1 s-2; do
  line=$(exported "$id")
  [ -n "$line" ] || { bad "$id: no exported line"; continue; }
  eq "$id: hash result is the exported line, byte for byte" "$(hash_result "$id")" "$line"
done
eq "a failed job's result carries its error" \
  "$(hash_result bad-1 | jq -r '.status + ": " + .error' | grep -c "failed: .*max_tokens")" 1
eq "a dead-lettered job's result: failed, over max_model_len" \
  "$(hash_result ctx-1 | jq -r .status)" failed
eq "OpenAI line: the batch output line" "$(hash_result oa-1 | jq -r '.custom_id + " " + (.response.status_code|tostring)')" "oa-1 200"

# ---- streams
# stream_check KEY: {"text": what the entries add up to (out = out[:offset] + text), "kinds": "text"
# or "end <status> <finish_reason>" per entry}, from XRANGE as JSON
stream_check() {
  rcli --json XRANGE "$1" - + | python3 -c '
import json, sys
entries = json.load(sys.stdin)
out, kinds = b"", []
for _id, f in entries:
    if not isinstance(f, dict):
        f = dict(zip(f[::2], f[1::2]))
    off = int(f["offset"])
    out = out[:off] + f["text"].encode()
    kinds.append("end %s %s" % (f["status"], f.get("finish_reason", "-")) if f.get("end") == "1" else "text")
json.dump({"text": out.decode(), "kinds": kinds}, sys.stdout)'
}
stream_check llmq:stream:s-1 >"$T/s1.json"
eq "s-1: the stream adds up to the output" "$(jq -r .text "$T/s1.json")" "$(sql "SELECT output FROM jobs WHERE id = 's-1'")"
eq "s-1: one end entry, the last" "$(jq -r '[.kinds[] | select(startswith("end"))] | length' "$T/s1.json") $(jq -r '.kinds[-1]' "$T/s1.json")" "1 end completed length"
n=$(jq '.kinds | length' "$T/s1.json")
[ "$n" -ge 3 ] && ok "s-1: text came in $n entries, not only at the end" || bad "s-1: $n entries"
ttl=$(rcli TTL llmq:stream:s-1)
[ "$ttl" -gt 0 ] && ok "s-1: the stream expires ($ttl s)" || bad "s-1: stream TTL $ttl"
stream_check llmq:stream:s-2 >"$T/s2.json"
eq "s-2 (OpenAI body.stream): adds up to the output" "$(jq -r .text "$T/s2.json")" "$(sql "SELECT output FROM jobs WHERE id = 's-2' OR custom_id = 's-2'")"
eq "no stream key for jobs that did not ask" "$(rcli --scan --pattern 'llmq:stream:*' | sort | tr '\n' ' ')" "llmq:stream:s-1 llmq:stream:s-2 "

# ---- llmq wait with Redis alone (no database here): the text from the hash
mkdir -p "$T/elsewhere"
out=$(cd "$T/elsewhere" && env -u LLMQ_CONFIG "$LLMQ" wait --redis "$URL" r-1); rc=$?
eq "wait, Redis only: exit 0" "$rc" 0
eq "wait, Redis only: the text" "$(echo "$out" | tail -n +2)" "$(sql "SELECT output FROM jobs WHERE id = 'r-1'" | sed 's/^/  /')"
out=$(cd "$T/elsewhere" && env -u LLMQ_CONFIG "$LLMQ" wait --redis "$URL" --format json oa-1)
eq "wait --format json, Redis only: the result line" "$(echo "$out" | jq -c .result)" "$(hash_result oa-1 | jq -c .)"

# ---- a cap of a few bytes: the marker, and wait reads the result from SQLite
echo '{"id": "cap-1", "prompt": "Capped", "max_tokens": 6, "temperature": 0, "ignore_eos": true}' >"$T/cap.jsonl"
push_file "$T/cap.jsonl"
LLMQ_REDIS_RESULT_MAX_BYTES=16 worker_start w2 --drain
worker_wait w2
"$LLMQ" results --db "$DB" >"$T/export.jsonl"
line=$(exported cap-1)
eq "cap: the marker names the line's size" "$(hash_result cap-1)" "{\"truncated\":true,\"in\":\"sqlite\",\"bytes\":$(printf %s "$line" | wc -c)}"
out=$("$LLMQ" wait -c "$CFG" --format json cap-1); rc=$?
eq "cap: wait exit 0" "$rc" 0
eq "cap: wait prints the result from SQLite" "$(echo "$out" | jq -c .result)" "$(echo "$line" | jq -c .)"
out=$(cd "$T/elsewhere" && env -u LLMQ_CONFIG "$LLMQ" wait --redis "$URL" cap-1)
echo "$out" | grep -q "in SQLite only" && ok "cap, no database: wait says where the result is" || bad "cap, no database: $out"
finish
