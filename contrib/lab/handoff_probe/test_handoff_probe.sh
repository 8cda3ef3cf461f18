#!/usr/bin/env bash
# contrib/lab/handoff_probe on the GPU, few replays: one line per hand-off (PDL, flag, plain) with a median
# that is a number, exit 0. Skips (77) without a GPU, in a build without CUDA, or below sm_90.
. "$LLMQ_SOURCE_DIR/tests/cli/cli_lib.sh"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no NVIDIA GPU here (nvidia-smi -L fails)"; exit 77
fi
probe=$LLMQ_BUILD_DIR/llmq_handoff_probe
[ -x "$probe" ] || { echo "skipped: $probe not built (no CUDA in this build)"; exit 77; }
out=$(timeout 120 "$probe" --ctas 132 --spin-us 2 --reps 20 2>"$tmp/err"); rc=$?
if [ $rc = 77 ]; then echo "skipped: $out"; exit 77; fi
[ $rc = 0 ] && ok "probe ran" || bad "probe exit $rc: $(tail -3 "$tmp/err") $out"
for way in pdl flag plain; do
  grep -qE "^$way .* hand-off median -?[0-9.]+ us \(min -?[0-9.]+, .*A's spread median [0-9.]+ us$" <<<"$out" &&
    ok "$way line" || bad "no $way line: $out"
done
for args in "--bogus 1" "--reps 0" "--ctas" "--ctas 12x"; do
  "$probe" $args >/dev/null 2>"$tmp/err2"; rc=$?
  [ $rc = 2 ] && grep -q "bad argument" "$tmp/err2" && grep -q "usage: llmq_handoff_probe" "$tmp/err2" &&
    ok "'$args': usage, exit 2" || bad "'$args': exit $rc, $(cat "$tmp/err2")"
done
"$probe" --help | grep -q "^usage: llmq_handoff_probe" && ok "--help" || bad "--help prints no usage"
finish
