#!/usr/bin/env bash
# contrib/lab/overlap_probe on the GPU, scaled down: the serial line and one row per SM split, with times
# that are positive numbers, exit 0. Skips (77) without a GPU, in a build without CUDA, or where the
# driver has no green contexts.
. "$LLMQ_SOURCE_DIR/tests/cli/cli_lib.sh"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no NVIDIA GPU here (nvidia-smi -L fails)"; exit 77
fi
probe=$LLMQ_BUILD_DIR/llmq_overlap_probe
[ -x "$probe" ] || { echo "skipped: $probe not built (no CUDA in this build)"; exit 77; }
out=$("$probe" --batch 16 --ctx 128 --sms 16,32 --reps 3 2>"$tmp/err"); rc=$?
if [ $rc = 77 ]; then echo "skipped: $out"; exit 77; fi
[ $rc = 0 ] && ok "probe ran" || bad "probe exit $rc: $(tail -3 "$tmp/err") $out"
grep -qE "^serial on all SMs: attention [0-9.]+ ms .* = [0-9.]+ ms$" <<<"$out" && ok "serial line" ||
  bad "no serial line: $out"
rows=$(grep -cE "^ +[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+x$" <<<"$out")
[ "$rows" = 2 ] && ok "a row per split" || bad "want 2 rows of times, got $rows: $out"
finish
