#!/usr/bin/env bash
# The kernel timeline library (contrib/lab/ktrace/ktrace.c) on a real run: `llmq bench` on the GPU with
# CUDA_INJECTION64_PATH set writes one CSV row per kernel (graph nodes included) with demangled names
# and sane times, and ktrace_summary.py finds the decode steps and the layer in it. Skips (77) without
# a GPU or where the build has no libllmq_ktrace.so (no CUPTI in the toolkit).
. "$LLMQ_SOURCE_DIR/tests/cli/cli_lib.sh"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no NVIDIA GPU here (nvidia-smi -L fails)"; exit 77
fi
lib=$LLMQ_BUILD_DIR/libllmq_ktrace.so
[ -f "$lib" ] || { echo "skipped: $lib not built (the CUDA toolkit has no CUPTI)"; exit 77; }

check "traced bench" 0 env CUDA_INJECTION64_PATH="$lib" LLMQ_KTRACE="$tmp/t.csv" "$LLMQ_BIN" bench \
  --random-weights qwen3-0.6b --workload single --input-len 64 --output-len 48 --backend cuda
expect "traced bench" failed 0
py "traced bench" "d['steps'] >= 48"
[ -s "$tmp/t.csv" ] && ok "csv written" || bad "no CSV at $tmp/t.csv"
out=$(python3 - "$tmp/t.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
names = " ".join(r["name"] for r in rows)
bad = [r for r in rows if not (0 < int(r["start_ns"]) <= int(r["end_ns"])) or int(r["grid"]) < 1]
print(len(rows), len(bad), all(k in names for k in ("embedding_vec_kernel<", "attention_decode_kernel<", "sample_kernel<")),
      any(r["name"].startswith("_Z") for r in rows))
PY
)
read -r n nbad named mangled <<<"$out"
[ "$n" -ge $((48 * 28 * 5)) ] 2>/dev/null && ok "rows ($n)" || bad "only $n kernel rows for 48 steps of 28 layers"
[ "$nbad" = 0 ] && ok "times and grids" || bad "$nbad rows with end < start, zero times or no grid"
[ "$named" = True ] && ok "demangled kernel names" || bad "embedding/attention/sample kernels not found by name"
[ "$mangled" = False ] && ok "no mangled names left" || bad "some names are still mangled"
check "summary" 0 python3 "$LLMQ_SOURCE_DIR/contrib/lab/ktrace/ktrace_summary.py" "$tmp/t.csv" --last 32
grep -qE "^[0-9]+ steps, 32 analysed" <<<"$out" && ok "decode steps found" || bad "summary: $out"
grep -qE "^one layer \([0-9]+ kernels, averaged over 27 layers" <<<"$out" && ok "layers found" || bad "summary: $out"
finish
