#!/usr/bin/env bash
# `llmq tokenize` end to end (docs/PERFORMANCE.md "Tokenizer"): JSON lines {"text": ...} in, ids out,
# one process. The input is the prose of the core figure, one line per JSON line; the rate is MB of
# that text per second of wall-clock time, the tokenizer's load (a run on empty input) taken off.
# Best of 5 runs. It checks one output line per input line, each {"ids":[...]}, and asserts a floor
# far below the target so that a busy machine does not fail it but a per-line JSON tree or flush does.
# LLMQ_BENCH_TEXT=FILE changes the text.
set -u
tokdir=$LLMQ_ASSETS/qwen3-tokenizer
if [ ! -f "$tokdir/tokenizer.json" ]; then
  echo "SKIPPED: asset qwen3-tokenizer missing"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
text=${LLMQ_BENCH_TEXT:-$tmp/prose.txt}
if [ -z "${LLMQ_BENCH_TEXT:-}" ]; then
  cat /usr/share/common-licenses/* /usr/share/doc/nodejs/api/*.md >"$text" 2>/dev/null
  [ "$(wc -c <"$text")" -gt 1000000 ] || cat "$LLMQ_SOURCE_DIR"/docs/*.md "$LLMQ_SOURCE_DIR"/docs/*.md >"$text"
fi
python3 - "$text" "$tmp/in.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], encoding="utf-8", errors="replace") as f, open(sys.argv[2], "w") as o:
    for line in f:
        o.write(json.dumps({"text": line}) + "\n")
PY
# best SECONDS of 5 runs of tk <FILE
best() {
  python3 - "$1" "$tmp/out.jsonl" "$LLMQ_BIN" "$tokdir/tokenizer.json" <<'PY'
import subprocess, sys, time
best = 1e9
for _ in range(5):
    with open(sys.argv[1], "rb") as i, open(sys.argv[2], "wb") as o:
        t0 = time.monotonic()
        subprocess.run([sys.argv[3], "tokenize", "--tokenizer", sys.argv[4]], stdin=i, stdout=o, check=True)
        best = min(best, time.monotonic() - t0)
print(f"{best:.3f}")
PY
}
: >"$tmp/empty.jsonl"
load=$(best "$tmp/empty.jsonl")
all=$(best "$tmp/in.jsonl")
bytes=$(wc -c <"$text")
lines=$(wc -l <"$tmp/in.jsonl")
fail=0
[ "$(wc -l <"$tmp/out.jsonl")" = "$lines" ] || { echo "FAIL: $(wc -l <"$tmp/out.jsonl") output lines for $lines"; fail=1; }
grep -vqE '^\{"ids":\[[0-9,]*\]\}$' "$tmp/out.jsonl" && { echo "FAIL: a line other than {\"ids\":[...]}: $(grep -vmE1 '^\{"ids":\[[0-9,]*\]\}$' "$tmp/out.jsonl")"; fail=1; }
rate=$(python3 -c "print(f'{$bytes / max($all - $load, 1e-3) / 1e6:.1f}')")
echo "tokenize end to end: $bytes bytes of text in $lines JSON lines ($(wc -c <"$tmp/in.jsonl") bytes), $(nproc) cores:" \
  "best of 5 ${all} s, load ${load} s: $rate MB/s of text"
python3 -c "import sys; sys.exit(0 if $rate >= 5 else 1)" || { echo "FAIL: $rate MB/s is under the 5 MB/s floor"; fail=1; }
exit $fail
