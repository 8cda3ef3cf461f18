#!/usr/bin/env bash
# `llmq bench` takes the engine's options as `llmq run` and `llmq worker` do: the defaults, then
# --config FILE (its model, engine and queues sections), then LLMQ_* variables, then the flags. On a
# tiny model (CPU backend): the JSON line shows what each layer set (KV blocks, prefix caching,
# admission reserve, the backend, the lanes) and records every setting off its default with where it
# came from ("settings"), the model can come from model.path, and bad values fail with the flag or the
# file named.
. "$(dirname "$0")/cli_lib.sh"

tiny_model "$tmp/m"
cat >"$tmp/llmq.yaml" <<YAML
model:
  path: $tmp/m
engine:
  backend: cpu
  threads: 1
  block_size: 16
  num_kv_blocks: 300
  enable_prefix_caching: false
  admission_reserve: 0.5
YAML
run=("$LLMQ_BIN" bench --workload chat -n 4 --input-len 32 --output-len 4)

check "--help names the order" 0 "$LLMQ_BIN" bench --help
grep -q -- "then --config FILE, then LLMQ_\* variables, then the flags" <<<"$out" ||
  bad "--help does not say where the engine's options come from"

# the file alone: model.path, backend, KV blocks, prefix caching, admission reserve, the worker's lanes
check "from --config" 0 env -u LLMQ_ENGINE_NUM_KV_BLOCKS "${run[@]}" --config "$tmp/llmq.yaml"
expect "config" model '"m"'
expect "config" backend '"cpu"'
expect "config" kv_blocks 300
expect "config" prefix_caching false
expect "config" admission_reserve 0.5
expect "config: max_model_len the worker's (the model's)" max_model_len 4096
py "config: the worker's lanes" "d['lanes'] is not None and d['requests'] == 4 and d['failed'] == 0"
py "config: the line records the file's settings and lines" \
  "d['settings']['engine.num_kv_blocks'] == {'value': '300', 'from': '$tmp/llmq.yaml:7'} and \
d['settings']['model.path']['value'] == '$tmp/m' and 'engine.max_num_seqs' not in d['settings']"

# LLMQ_* over the file, flags over both
check "environment over the file" 0 env LLMQ_ENGINE_NUM_KV_BLOCKS=320 "${run[@]}" --config "$tmp/llmq.yaml"
expect "environment" kv_blocks 320
py "environment: recorded in the line" \
  "d['settings']['engine.num_kv_blocks']['from'] == 'env LLMQ_ENGINE_NUM_KV_BLOCKS'"
grep -q "engine.num_kv_blocks = 320 from the environment (LLMQ_ENGINE_NUM_KV_BLOCKS)" "$tmp/err" ||
  bad "the environment's setting is not logged: $(grep bench "$tmp/err")"
check "flags over the environment" 0 env LLMQ_ENGINE_ADMISSION_RESERVE=0.75 "${run[@]}" --config "$tmp/llmq.yaml" \
  --admission-reserve 0.25
expect "flags" admission_reserve 0.25
py "flags: recorded in the line" \
  "d['settings']['engine.admission_reserve'] == {'value': '0.25', 'from': 'flag --admission-reserve'}"
check "--model over model.path" 0 "${run[@]}" --config "$tmp/llmq.yaml" --model "$tmp/m"
expect "--model" model '"m"'

# without --config: the defaults (no lanes) and the flags
check "no config" 0 "${run[@]}" --model "$tmp/m" --backend cpu --threads 1 --no-prefix-caching
py "no config: one lane, prefix caching off" "d['lanes'] is None and d['prefix_caching'] is False"
expect "no config: max_model_len the longest request" max_model_len 36
check "environment without --config" 0 env LLMQ_ENGINE_NUM_KV_BLOCKS=40 "${run[@]}" --model "$tmp/m" \
  --backend cpu --threads 1 --block-size 16
expect "environment without --config" kv_blocks 40

# errors: a bad flag value names the flag (exit 2), a bad file names the file (exit 1), no model at all
check "bad --block-size" 2 "${run[@]}" --model "$tmp/m" --block-size 3
grep -q -- "--block-size" "$tmp/err" || bad "the error does not name --block-size: $(cat "$tmp/err")"
check "bad --backend" 2 "${run[@]}" --model "$tmp/m" --backend tpu
grep -q -- "--backend" "$tmp/err" || bad "the error does not name --backend: $(cat "$tmp/err")"
printf 'engine:\n  num_kv_blocks: many\n' >"$tmp/bad.yaml"
check "bad file" 1 "${run[@]}" --model "$tmp/m" --config "$tmp/bad.yaml"
grep -q "bad.yaml" "$tmp/err" || bad "the error does not name the file: $(cat "$tmp/err")"
check "no model" 2 "${run[@]}"
grep -q "model.path" "$tmp/err" || bad "the error does not mention model.path: $(cat "$tmp/err")"
finish
