#!/usr/bin/env bash
# Thinking budgets on the CUDA backend: the forced close goes through the same engine path as on the
# CPU (tests/cli/test_reasoning.sh), and the CUDA backend's guessed next decode step must not keep a
# sampled id where the engine forced another. On a tiny random Qwen3 with the real Qwen3 tokenizer and
# prompts that end in "<think>\n", through `llmq run --backend cuda`: one job alone (decode steps
# that the backend guesses ahead), then eight at once with budgets 0 .. 7; for each, exactly N
# sampled reasoning ids, the close ("\n</think>\n\n", or without its newline after one), then the
# answer, max_tokens in all; the split equals the unsplit text of the same job as an OpenAI
# completion (same seed); two runs give the same lines. Skips (77) without a GPU or the tokenizer.
. "$(dirname "$0")/../cli/cli_lib.sh"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no NVIDIA GPU here (nvidia-smi -L fails)"; exit 77
fi
QTOK=${LLMQ_ASSETS:-}/qwen3-tokenizer
[ -f "$QTOK/tokenizer.json" ] || { echo "skipped: no Qwen3 tokenizer in \$LLMQ_ASSETS (tests/assets/fetch.sh)"; exit 77; }
tiny_model "$tmp/m" --tokenizer "$QTOK" --head-dim 64 # a head size the CUDA attention kernels take
python3 - "$tmp" <<'PY'
import json, sys
P = "<|im_start|>user\nWhat is 6 times 7?<|im_end|>\n<|im_start|>assistant\n<think>\n"
with open(sys.argv[1] + "/alone.jsonl", "w") as f:
    f.write(json.dumps({"id": "b5", "prompt": P, "max_tokens": 24, "thinking_budget": 5, "seed": 3,
                        "return_token_ids": True}) + "\n")
    f.write(json.dumps({"custom_id": "raw-b5", "url": "/v1/completions",
                        "body": {"prompt": P, "max_tokens": 24, "thinking_budget": 5, "seed": 3}}) + "\n")
with open(sys.argv[1] + "/many.jsonl", "w") as f:
    for n in range(8):
        f.write(json.dumps({"id": f"b{n}", "prompt": P, "max_tokens": 20, "thinking_budget": n, "seed": 10 + n,
                            "return_token_ids": True}) + "\n")
        f.write(json.dumps({"custom_id": f"raw-b{n}", "url": "/v1/completions",
                            "body": {"prompt": P, "max_tokens": 20, "thinking_budget": n, "seed": 10 + n}}) + "\n")
PY
for set in alone many; do
  for k in 1 2; do
    check_merged "$set run $k" 0 "$LLMQ_BIN" run --backend cuda --model "$tmp/m" -i "$tmp/$set.jsonl" -o "$tmp/$set.$k.jsonl"
  done
  if cmp -s <(grep -v custom_id "$tmp/$set.1.jsonl") <(grep -v custom_id "$tmp/$set.2.jsonl"); then
    ok "$set: two runs give the same lines"
  else
    bad "$set: two runs differ"
  fi
  if out=$(python3 - "$tmp/$set.1.jsonl" <<'PY'
import json, sys
r = {}
for l in open(sys.argv[1], encoding="utf-8"):
    d = json.loads(l)
    r[d.get("custom_id") or d["id"]] = d
errs = []
for k, d in r.items():
    if k.startswith("raw-"):
        continue
    ids = d["token_ids"]
    budget = int(k[1:])
    forced = ids[budget:budget + 3] == [198, 151668, 271] or (
        ids[budget:budget + 2] == [151668, 271] and (d["reasoning"].endswith("\n") or budget == 0))
    if not forced or {151667, 151668} & set(ids[:budget]):
        errs.append(f"{k}: ids {ids} do not close after {budget}")
    if 151668 not in ids or d["usage"]["reasoning_tokens"] != ids.index(151668) + 1:
        errs.append(f"{k}: reasoning_tokens {d['usage']['reasoning_tokens']}")
    raw = r["raw-" + k]["response"]["body"]["choices"][0]["text"]
    if raw != d["reasoning"] + "</think>" + d["text"]:
        errs.append(f"{k}: split {d['reasoning']!r} / {d['text']!r} is not the completion {raw!r}")
    if d["usage"]["completion_tokens"] != len(ids) or (d["finish_reason"] != "length" and 151645 not in ids):
        errs.append(f"{k}: usage {d['usage']}, finish {d['finish_reason']}")
print("; ".join(errs) if errs else f"{len(r) // 2} jobs")
sys.exit(1 if errs else 0)
PY
  ); then ok "$set: forced closes and splits ($out)"; else bad "$set: $out"; fi
done
finish
