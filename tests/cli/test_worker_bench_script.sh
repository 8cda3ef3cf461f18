#!/usr/bin/env bash
# contrib/worker_bench.sh (the whole queue path's speed beside `llmq bench`) on a tiny model, CPU
# backend: its JSON line counts every job, calibrates the prompts to about the asked token count,
# reports the worker's and the bench's numbers, and a bad model fails with a message.
. "$(dirname "$0")/cli_lib.sh"
for prog in redis-server redis-cli sqlite3; do
  command -v "$prog" >/dev/null || { echo "SKIPPED: $prog is not installed (contrib/install-deps.sh installs it)"; exit 77; }
done
tiny_model "$tmp/m"
script=$LLMQ_SOURCE_DIR/contrib/worker_bench.sh
check "12 jobs" 0 env LLMQ="$LLMQ_BIN" bash "$script" "$tmp/m" 12 40 5 -- "engine:" "  backend: cpu" "  threads: 1"
py "every job, its lengths" "d['jobs'] == 12 and d['output_len'] == 5 and 30 <= d['prompt_tokens_mean'] <= 50"
py "the worker's numbers" "d['seconds'] > 0 and d['jobs_per_s'] > 0 and d['total_tokens_per_s'] > d['output_tokens_per_s'] > 0 \
and 0 <= d['ttft_ms_p50'] <= d['ttft_ms_p95']"
py "the bench's, on the same lengths" "d['bench']['requests'] == 12 and d['bench']['output_len'] == 5 and \
d['bench']['input_len'] == round(d['prompt_tokens_mean']) and d['bench']['backend'] == 'cpu' and d['worker_share_of_bench'] > 0"
check "no such model" 1 env LLMQ="$LLMQ_BIN" bash "$script" "$tmp/nope" 4
check "no arguments" 2 env LLMQ="$LLMQ_BIN" bash "$script"
grep -q "worker_bench.sh MODEL_DIR" <<<"$out" || bad "no usage text: $out"
finish
