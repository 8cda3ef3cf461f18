#!/usr/bin/env bash
# `llmq worker` takes the engine flags of `llmq run` and `llmq bench` (one table) and
# --metrics-port/--metrics-address, each over the config file's key; --quiet leaves warnings and
# errors only. Two --drain workers on an empty queue, their start-up log lines checked; then
# enqueue --quiet.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config # metrics.port 0, engine.block_size and model.max_model_len at their defaults

P=$(free_port)
worker_start a --drain --metrics-port "$P" --metrics-address 127.0.0.1 --max-model-len 512 --block-size 16 \
  --kv-cache-dtype auto --dtype auto --no-prefix-caching --short-max-num-seqs 4
worker_wait a
eq "worker with engine flags: exit status" "$WRC" 0
grep -q "metrics: http://127.0.0.1:$P/metrics" "$T/a.log" && ok "--metrics-port over metrics.port 0" ||
  bad "no metrics line on port $P: $(grep metrics "$T/a.log")"
grep -q "blocks of 16 tokens, max_model_len 512, prefix caching off" "$T/a.log" &&
  ok "--block-size, --max-model-len, --no-prefix-caching reach the engine" || bad "engine line: $(grep 'engine:' "$T/a.log")"
grep -q "short lane 4 seqs" "$T/a.log" && ok "--short-max-num-seqs reaches the lane" || bad "lanes: $(grep 'short lane' "$T/a.log")"

worker_start b --drain --quiet
worker_wait b
eq "worker --quiet: exit status" "$WRC" 0
[ -s "$T/b.log" ] && bad "--quiet logged: $(head -3 "$T/b.log")" || ok "--quiet: no info lines"

# ---- enqueue --quiet: no summary when every job was pushed; the summary when something was not
echo '{"id": "q1", "prompt": "hi", "max_tokens": 1}' >"$T/q.jsonl"
"$LLMQ" enqueue -c "$CFG" --no-batch --quiet "$T/q.jsonl" >/dev/null 2>"$T/q.err"
eq "enqueue --quiet: exit status" "$?" 0
[ -s "$T/q.err" ] && bad "enqueue --quiet printed: $(cat "$T/q.err")" || ok "enqueue --quiet: stderr empty"
eq "  the job was pushed" "$(rcli LLEN llmq:queue:short)" 1
"$LLMQ" enqueue -c "$CFG" --no-batch --quiet "$T/q.jsonl" >/dev/null 2>"$T/q.err"
eq "enqueue --quiet of a known id: exit status" "$?" 1
grep -q "nothing pushed" "$T/q.err" && ok "  says nothing was pushed" || bad "  stderr: $(cat "$T/q.err")"
finish
