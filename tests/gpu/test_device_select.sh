#!/usr/bin/env bash
# engine.device (--device, LLMQ_ENGINE_DEVICE) picks the GPU the CUDA backend runs on: one worker per
# GPU on a multi-GPU host. On a tiny model with `llmq run --backend cuda`:
#   - device 0 given three ways (flag, environment, default) runs, and the log names device 0;
#   - the first index past the machine's devices fails with exit 1 and a message that names
#     engine.device, the index and the device count, for the flag and for the environment;
#   - with two or more GPUs: the last device runs, and its log names that device;
#   - --device outside the key's range (0..255) is a usage error (exit 2) naming the flag.
# Skips (77) without a GPU.
. "$(dirname "$0")/../cli/cli_lib.sh"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no NVIDIA GPU here (nvidia-smi -L fails)"; exit 77
fi
# the devices this process can use (CUDA_VISIBLE_DEVICES, if set, narrows and renumbers them)
n=$(nvidia-smi -L | wc -l)
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  n=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
fi
echo "devices: $n"
tiny_model "$tmp/m" --head-dim 64   # a head size the CUDA attention kernels take (64, 128)
printf '{"id": "a", "prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": true}\n' >"$tmp/in.jsonl"
run() { # run NAME WANT_RC [env...] -- [flags...]: llmq run on the tiny model, output in $out
  local name=$1 want=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  check_merged "$name" "$want" env "${envs[@]}" "$LLMQ_BIN" run --model "$tmp/m" --input "$tmp/in.jsonl" \
    --output "$tmp/out.jsonl" --backend cuda "$@"
}
names_device() { # names_device NAME D: the backend's log line says device D
  if echo "$out" | grep -q "cuda backend: .* on device $2,"; then ok "$1: log names device $2"; else bad "$1: no 'on device $2' in: $out"; fi
}
run "flag --device 0" 0 -- --device 0
names_device "flag --device 0" 0
run "LLMQ_ENGINE_DEVICE=0" 0 LLMQ_ENGINE_DEVICE=0 --
names_device "LLMQ_ENGINE_DEVICE=0" 0
run "default device" 0 --
names_device "default device" 0
grep -q '"status": *"completed"' "$tmp/out.jsonl" && ok "the job completed" || bad "job: $(cat "$tmp/out.jsonl")"

run "flag --device $n (one past the last)" 1 -- --device "$n"
echo "$out" | grep -q "engine.device $n: this machine has $n CUDA device" && ok "the error names the key, index and count" ||
  bad "device $n: unclear error: $out"
run "LLMQ_ENGINE_DEVICE=$n" 1 LLMQ_ENGINE_DEVICE="$n" --
echo "$out" | grep -q "engine.device $n:" && ok "the environment's index is refused the same way" || bad "env device $n: $out"

if [ "$n" -ge 2 ]; then
  last=$((n - 1))
  run "flag --device $last" 0 -- --device "$last"
  names_device "flag --device $last" "$last"
else
  echo "note: one GPU: running on another device is not tested here"
fi

run "--device 300" 2 -- --device 300
echo "$out" | grep -q -- "--device" && ok "the usage error names --device" || bad "--device 300: $out"
finish
