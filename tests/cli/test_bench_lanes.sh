#!/usr/bin/env bash
# `llmq bench --background`: a longdoc load in the long lane beside the timed workload in the short
# lane, on a tiny model (CPU backend) with scaled-down lengths. The foreground must complete, the
# JSON line must carry the foreground's numbers and a background section, and the background must
# have kept to the long lane's token budget. Also: long contexts past the model's native length
# (--max-model-len above max_position_embeddings enables YaRN, logged).
. "$(dirname "$0")/cli_lib.sh"

tiny_model "$tmp/m"
fg=("$LLMQ_BIN" bench --model "$tmp/m" --workload chat -n 12 --input-len 48 --output-len 6 --backend cpu
  --threads 1 --max-num-batched-tokens 256)
bg=(--background longdoc:2 --background-input-len 1200 --background-output-len 4)

# ---- the command line
check "--help" 0 "$LLMQ_BIN" bench --help
for f in --background --background-input-len --lanes --long-max-num-seqs --long-max-num-batched-tokens --config; do
  grep -q -- "$f" <<<"$out" || bad "--help does not mention $f"
done
# the defaults --help prints are the ones the configuration has (llmq config), flag by flag
help=$out
cfg=$("$LLMQ_BIN" config 2>/dev/null)
for pair in max-num-seqs:max_num_seqs max-num-batched-tokens:max_num_batched_tokens block-size:block_size \
  gpu-memory-utilization:gpu_memory_utilization cuda-graph-max-batch:cuda_graph_max_batch \
  long-max-num-seqs:long_max_num_seqs long-max-num-batched-tokens:long_max_num_batched_tokens \
  short-max-num-seqs:short_max_num_seqs short-max-num-batched-tokens:short_max_num_batched_tokens; do
  flag=${pair%%:*} key=${pair#*:}
  want=$(awk -v k="$key:" '$1 == k { print $2; exit }' <<<"$cfg")
  [ -n "$want" ] || bad "llmq config shows no $key"
  grep -qE -- "--$flag .*\(default $want\)" <<<"$help" || bad "--help: --$flag does not print the default $key $want"
done
check "unknown background workload" 2 "${fg[@]}" --background nope
grep -q "nope" "$tmp/err" || bad "the error does not name the workload: $(cat "$tmp/err")"
check "bad background count" 2 "${fg[@]}" --background longdoc:zero
check "background lengths without --background" 2 "${fg[@]}" --background-input-len 100
check "bad lane cap" 2 "${fg[@]}" --long-max-num-seqs 0
check "missing config file" 1 "${fg[@]}" --lanes --config "$tmp/none.yaml"

# ---- with a background load, long lane budget 64 tokens a step
check "chat beside longdoc" 0 "${fg[@]}" "${bg[@]}" --long-max-num-batched-tokens 64
py "foreground: all requests, no failure" "d['requests'] == 12 and d['failed'] == 0 and d['workload'] == 'chat'"
py "foreground: TTFT and throughput" \
  "0 < d['ttft_ms_p50'] <= d['ttft_ms_p95'] <= d['ttft_ms_p99'] and d['output_tokens_per_s'] > 0"
py "foreground: its own tokens only" "abs(d['output_tokens_per_s'] * d['seconds'] - 12 * 6) < 0.01 * 72 + 1"
py "lanes section" "d['lanes']['long'] == {'max_num_seqs': 16, 'max_num_batched_tokens': 64, 'max_model_len': 1204}"
py "lanes: the short lane at most the global budget" "d['lanes']['short']['max_num_batched_tokens'] == 256"
py "background section" "set(d['background']) >= {'workload', 'lane', 'requests', 'finished', 'prefilled', \
'computed_tokens', 'output_tokens', 'computed_tokens_per_s', 'progress'}"
py "background: longdoc in the long lane" \
  "d['background']['workload'] == 'longdoc' and d['background']['lane'] == 'long' and d['background']['requests'] == 2"
py "background: it progressed" "d['background']['computed_tokens'] > 0 and 0 < d['background']['progress'] < 1"
py "background: within the long lane's 64 tokens a step" "d['background']['computed_tokens'] <= 64 * d['steps']"
py "background: not finished while the foreground ran" "d['background']['finished'] == 0"
py "prefix cache queried by both" "d['prefix_cache_queries'] >= 12 * 48 + 1200"

# the same from a config file's queues section (as `llmq worker` reads it)
printf 'queues:\n  long_max_num_seqs: 1\n  long_max_num_batched_tokens: 32\n' >"$tmp/llmq.yaml"
check "lane caps from --config" 0 "${fg[@]}" "${bg[@]}" --config "$tmp/llmq.yaml"
py "config: long lane caps" "d['lanes']['long']['max_num_seqs'] == 1 and d['lanes']['long']['max_num_batched_tokens'] == 32"
py "config: within 32 tokens a step" "0 < d['background']['computed_tokens'] <= 32 * d['steps']"
# a background short enough to finish while the foreground runs
check "background that finishes" 0 "${fg[@]}" --background longdoc:1 --background-input-len 40 \
  --background-output-len 2 --max-num-seqs 4
py "short background finished" "d['background']['finished'] == 1 and d['background']['output_tokens'] == 2 and d['failed'] == 0"

# ---- the same workload in the short lane without a background: the comparison run
check "chat in the short lane alone" 0 "${fg[@]}" --lanes
py "no background" "d['background'] is None and d['lanes'] is not None and d['failed'] == 0"
check "chat without lanes" 0 "${fg[@]}"
py "no lanes" "d['background'] is None and d['lanes'] is None"

# ---- long contexts: YaRN by --max-model-len above the native length (256 here)
"$LLMQ_BIN" make-tiny-model "$tmp/short" --max-position 256 >/dev/null || bad "make-tiny-model --max-position 256"
check "longdoc past the native length" 0 "$LLMQ_BIN" bench --model "$tmp/short" --workload longdoc -n 2 \
  --input-len 900 --output-len 4 --max-model-len 1024 --backend cpu --threads 1
grep -q 'YaRN enabled.*"factor": 4.0, "original_max_position_embeddings": 256' "$tmp/err" &&
  ok "YaRN factor 4 over 256 logged" || bad "no YaRN line: $(cat "$tmp/err")"
py "longdoc: max_model_len 1024, done" "d['max_model_len'] == 1024 and d['failed'] == 0 and d['input_len'] == 900"
check "within the native length" 0 "$LLMQ_BIN" bench --model "$tmp/short" --workload longdoc -n 1 \
  --input-len 200 --output-len 4 --backend cpu --threads 1
grep -q "YaRN" "$tmp/err" && bad "YaRN enabled within the native length: $(cat "$tmp/err")" || ok "no YaRN within 256"

finish
