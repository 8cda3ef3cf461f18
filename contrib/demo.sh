#!/usr/bin/env bash
# llmq's main job on its embedded default, from a fresh clone (after contrib/install-deps.sh), on
# the CPU backend, with nothing to download:
#   1. builds llmq;
#   2. starts a local redis-server on a free port (its files in the demo folder);
#   3. writes a tiny random Qwen3 checkpoint (with the real Qwen3 tokenizer when the test assets
#      were fetched into the build folder, else llmq's built-in byte-level tokenizer);
#   4. queues sample summarization jobs twice over: with redis-cli (as any client would) and with
#      `llmq enqueue` (which validates them first), and shows `llmq status`;
#   5. runs `llmq worker --drain --backend cpu`, which exits once the queues are empty;
#   6. prints the results from SQLite with the sqlite3 shell, and stops Redis.
# The results stay in $BUILD_DIR/demo/llmq.db (BUILD_DIR defaults to build/).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
for prog in cmake redis-server redis-cli sqlite3 python3; do
  command -v "$prog" >/dev/null || { echo "demo: $prog is missing; run contrib/install-deps.sh first" >&2; exit 1; }
done

echo "== 1. building llmq in $build/"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
[ -f "$build/CMakeCache.txt" ] && gen=() # keep the generator an existing build was made with
cmake -S . -B "$build" "${gen[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null
llmq=$build/llmq
"$llmq" --version | head -1

rm -rf "$build/demo"
mkdir -p "$build/demo/redis"
work=$(cd "$build/demo" && pwd)
redis_pid=
cleanup() {
  if [ -n "$redis_pid" ]; then
    kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

echo "== 2. starting redis-server"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --dir "$work/redis" --logfile "$work/redis/redis.log" \
  --save "" --appendonly no >/dev/null 2>&1 &
redis_pid=$!
up=
for _ in $(seq 1 400); do
  redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && { up=1; break; }
  sleep 0.05
done
[ -n "$up" ] || { echo "demo: redis-server did not start (see $work/redis/redis.log)" >&2; exit 1; }
echo "redis://127.0.0.1:$port (data in $work/redis)"

echo "== 3. writing a tiny random model"
tok_args=()
if [ -f "$build/assets/qwen3-tokenizer/tokenizer.json" ]; then
  tok_args=(--tokenizer "$build/assets/qwen3-tokenizer")
  echo "with the real Qwen3 tokenizer from $build/assets/qwen3-tokenizer"
else
  echo "with llmq's built-in byte-level tokenizer (run the tests once to fetch the real Qwen3 one)"
fi
"$llmq" make-tiny-model "$work/model" "${tok_args[@]}" >/dev/null
cat >"$work/llmq.yaml" <<EOF
# the demo's config: everything not set here has the default of conf/llmq.yaml
redis:
  url: "redis://127.0.0.1:$port"
model:
  path: "$work/model"
  name: "tiny-random-qwen3"
engine:
  backend: cpu
sqlite:
  path: "$work/llmq.db"
metrics:
  interval_s: 1
sampling:
  max_tokens: 24
  temperature: 0
templates:
  summarize: "Summarize the following document in one sentence.\n\n{document}\n\nSummary:"
EOF

echo "== 4. queueing sample summarization jobs"
doc() {
  case $1 in
    1) echo "The city council met on Tuesday to discuss the new bicycle lanes. After two hours of debate, members voted seven to two to extend the lanes along the river by next spring." ;;
    2) echo "Researchers measured the growth of tomato plants under red and blue light. Plants under blue light were shorter but produced more fruit over the eight-week trial." ;;
    3) echo "The library will close for renovation from June to August. During that time, books can be returned at the community centre, and the online catalogue stays available." ;;
    4) echo "A storm brought heavy rain to the coast overnight. Several roads flooded, two ferries were cancelled, and power was restored to most homes by the next afternoon." ;;
    5) echo "The company reported that sales of its electric scooters doubled this year, mostly in cities with new parking zones, while sales of its petrol models fell by a third." ;;
    6) echo "Volunteers planted four hundred trees in the old quarry on Saturday. The site will become a public park once the paths and benches are finished next year." ;;
  esac
}
# with redis-cli, as any client would: one LPUSH per job, llmq's own job form with a template
for i in 1 2 3; do
  job=$(python3 -c 'import json, sys; print(json.dumps({"id": "doc-" + sys.argv[1], "template": "summarize", "vars": {"document": sys.argv[2]}, "metadata": {"source": "redis-cli"}}))' "$i" "$(doc "$i")")
  redis-cli -p "$port" LPUSH llmq:queue:short "$job" >/dev/null
done
echo "3 jobs pushed with redis-cli LPUSH llmq:queue:short"
# with llmq enqueue: a JSONL file in both forms (llmq's, and an OpenAI Batch request line)
python3 - "$work/jobs.jsonl" "$(doc 4)" "$(doc 5)" "$(doc 6)" <<'PY'
import json, sys
path, d4, d5, d6 = sys.argv[1:5]
with open(path, "w") as f:
    f.write(json.dumps({"id": "doc-4", "messages": [{"role": "system", "content": "You write one-sentence summaries."},
                                                   {"role": "user", "content": d4}], "enable_thinking": False}) + "\n")
    f.write(json.dumps({"prompt": "Summary of: " + d5 + "\nSummary:", "max_tokens": 16, "metadata": {"source": "enqueue"}}) + "\n")
    f.write(json.dumps({"custom_id": "batch-doc-6", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"messages": [{"role": "user", "content": "Summarize: " + d6}], "max_tokens": 20}}) + "\n")
PY
"$llmq" enqueue -c "$work/llmq.yaml" "$work/jobs.jsonl" --print-ids | sed 's/^/  id /'
"$llmq" status -c "$work/llmq.yaml"

echo "== 5. running the worker until the queues are empty (llmq worker --drain --backend cpu)"
"$llmq" worker -c "$work/llmq.yaml" --drain --backend cpu

echo "== 6. the results, from SQLite ($work/llmq.db)"
sqlite3 -header -column "$work/llmq.db" \
  "SELECT id, status, finish_reason, completion_tokens AS tokens, round(latency_ms) AS ms, substr(replace(replace(output, char(10), ' '), char(13), ' '), 1, 60) AS output FROM jobs ORDER BY id"
sqlite3 -header -column "$work/llmq.db" "SELECT id, model, backend, jobs_done FROM workers"
echo
echo "The model is random (llmq make-tiny-model), so its outputs are gibberish; the point is the path:"
echo "Redis queue -> worker -> engine -> SQLite. With a real Qwen3 folder, pass --model DIR (and a GPU)."
echo "Explore: sqlite3 $work/llmq.db 'SELECT * FROM jobs'  (schema in docs/SQLITE.md)"
