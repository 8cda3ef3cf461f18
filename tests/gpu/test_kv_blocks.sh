#!/usr/bin/env bash
# engine.num_kv_blocks on the CUDA backend: exactly that many blocks (the log says so and a job runs),
# and a clear error naming the key when the count cannot hold one sequence of max_model_len (as the
# CPU backend, tests/cli/test_run.sh); without it, the pool gpu_memory_utilization leaves. On a tiny model with `llmq run --backend cuda`. Skips (77)
# without a GPU.
. "$(dirname "$0")/../cli/cli_lib.sh"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no NVIDIA GPU here (nvidia-smi -L fails)"; exit 77
fi
tiny_model "$tmp/m" --head-dim 64   # a head size the CUDA attention kernels take (64, 128)
printf '{"id": "a", "prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": true}\n' >"$tmp/in.jsonl"
check_merged "num_kv_blocks 300" 0 env LLMQ_ENGINE_NUM_KV_BLOCKS=300 "$LLMQ_BIN" run --model "$tmp/m" \
  --input "$tmp/in.jsonl" --output "$tmp/out.jsonl" --backend cuda
echo "$out" | grep -q "cuda backend: KV cache 300 blocks of 32 tokens = 9600 tokens.*(num_kv_blocks;" &&
  ok "the log shows 300 blocks from num_kv_blocks" || bad "num_kv_blocks 300 not taken: $out"
grep -q '"status": *"completed"' "$tmp/out.jsonl" && ok "the job completed" || bad "job: $(cat "$tmp/out.jsonl")"
# without num_kv_blocks the pool is what gpu_memory_utilization leaves (engine.cpu_kv_cache_bytes, 1 GiB
# by default, once reached the CUDA backend as a cap through the configuration)
check_merged "default KV size" 0 "$LLMQ_BIN" run --model "$tmp/m" --input "$tmp/in.jsonl" \
  --output "$tmp/out.jsonl" --backend cuda
echo "$out" | grep -q "cuda backend: KV cache .*(gpu_memory_utilization;" &&
  ok "the default pool is sized by gpu_memory_utilization" || bad "default KV size: $out"
check_merged "num_kv_blocks too few" 1 env LLMQ_ENGINE_NUM_KV_BLOCKS=2 "$LLMQ_BIN" run --model "$tmp/m" \
  --input "$tmp/in.jsonl" --output "$tmp/out.jsonl" --backend cuda --max-model-len 256
echo "$out" | grep -q "KV cache of 2 blocks (from num_kv_blocks) cannot hold one sequence of max_model_len 256" &&
  echo "$out" | grep -q "raise num_kv_blocks" && ok "too few blocks: the error names the key and max_model_len" ||
  bad "num_kv_blocks 2: unclear error: $out"
finish
