#!/usr/bin/env bash
# Structured output on the CUDA backend: the jobs of tests/cli/test_structured_output.sh (JSON Schemas
# at several seeds and temperatures, json_object, regexes, choices) through `llmq run --backend cuda` on
# a tiny random Qwen3 with the real Qwen3 tokenizer. The masks reach the GPU sampler as bitmasks after
# the forward pass is enqueued; every output that ends by itself must parse and validate with
# python3-jsonschema or match its regex (tests/cli/structured_check.py), and two runs give the same
# lines. Skips (77) without a GPU, the tokenizer or python3-jsonschema.
. "$(dirname "$0")/../cli/cli_lib.sh"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no NVIDIA GPU here (nvidia-smi -L fails)"; exit 77
fi
QTOK=${LLMQ_ASSETS:-}/qwen3-tokenizer
[ -f "$QTOK/tokenizer.json" ] || { echo "skipped: no Qwen3 tokenizer in \$LLMQ_ASSETS (tests/assets/fetch.sh)"; exit 77; }
python3 -c 'import jsonschema' 2>/dev/null || { echo "skipped: python3-jsonschema is not installed"; exit 77; }
HERE=$(cd "$(dirname "$0")" && pwd)
SCHEMAS=$HERE/../fixtures/structured/schemas.json
tiny_model "$tmp/m" --tokenizer "$QTOK" --head-dim 64 # a head size the CUDA attention kernels take
python3 "$HERE/../cli/structured_check.py" jobs "$SCHEMAS" "$tmp/jobs.jsonl" || { bad "writing the jobs"; finish; exit; }
for k in 1 2; do
  check_merged "run $k" 0 "$LLMQ_BIN" run --backend cuda --model "$tmp/m" -i "$tmp/jobs.jsonl" -o "$tmp/out.$k.jsonl"
done
if python3 "$HERE/../cli/structured_check.py" check "$SCHEMAS" "$tmp/jobs.jsonl" "$tmp/out.1.jsonl" >"$tmp/check.log"; then
  ok "every output parses and validates ($(tail -1 "$tmp/check.log"))"
else
  bad "structured outputs: $(grep FAIL "$tmp/check.log" | head -5) $(tail -1 "$tmp/check.log")"
fi
texts() { python3 -c 'import json, sys
for l in open(sys.argv[1], encoding="utf-8"):
    d = json.loads(l)
    print(json.dumps([d.get("custom_id") or d["id"], d.get("text") or d["response"]["body"]["choices"][0]["message"]["content"]]))' "$1"; }
if cmp -s <(texts "$tmp/out.1.jsonl") <(texts "$tmp/out.2.jsonl"); then
  ok "two runs give the same outputs"
else
  bad "two runs differ"
fi
finish
