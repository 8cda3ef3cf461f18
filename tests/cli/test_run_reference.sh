#!/usr/bin/env bash
# `llmq run --backend cpu` against Hugging Face transformers: the fixture prompts of
# tests/fixtures/models (token ids), greedy, logprobs 5, all in one batch and one by one; the
# generated ids must equal transformers' and every logprob must be within 1e-3.
# (tests/unit/test_hf_reference.c checks the same through the engine API with more batch shapes.)
set -euo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fix=$LLMQ_SOURCE_DIR/tests/fixtures/models
fail=0
# "models" and "gpu_models" (the head dimensions the CUDA kernels take; checked here on the CPU too)
for name in $(python3 -c "import json, os; s = json.load(open('$fix/models.json')); print(' '.join(m['name'] for m in s['models'] + s.get('gpu_models', []) if os.path.exists('$fix/' + m['name'] + '.jsonl')))"); do
  args=$(python3 -c "import json; s = json.load(open('$fix/models.json')); print(' '.join(' '.join(m['args']) for m in s['models'] + s.get('gpu_models', []) if m['name']=='$name'))")
  "$LLMQ_BIN" make-tiny-model "$tmp/$name" $args >/dev/null
  want=$(cut -c1-64 "$fix/$name.sha256"); got=$(sha256sum "$tmp/$name/model.safetensors" | cut -c1-64)
  [ "$want" = "$got" ] || { echo "FAIL $name: checkpoint differs from the fixture's (regenerate fixtures)"; exit 1; }
  python3 - "$fix/$name.jsonl" > "$tmp/$name.in.jsonl" <<'PY'
import json, sys
for i, line in enumerate(open(sys.argv[1])):
    f = json.loads(line)
    print(json.dumps({"id": f"p{i}", "prompt": f["prompt"], "max_tokens": len(f["ids"]), "temperature": 0,
                      "ignore_eos": True, "logprobs": 5, "return_token_ids": True}))
PY
  for mode in batch alone; do
    if [ $mode = batch ]; then
      "$LLMQ_BIN" run --model "$tmp/$name" --backend cpu --max-model-len 4096 --input "$tmp/$name.in.jsonl" --output "$tmp/$name.out.jsonl" 2>/dev/null
    else
      : >"$tmp/$name.out.jsonl"
      while IFS= read -r job; do
        printf '%s\n' "$job" | "$LLMQ_BIN" run --model "$tmp/$name" --backend cpu --max-model-len 4096 --input - --output - 2>/dev/null >>"$tmp/$name.out.jsonl"
      done <"$tmp/$name.in.jsonl"
    fi
    if python3 - "$fix/$name.jsonl" "$tmp/$name.out.jsonl" "$name $mode" <<'PY'
import json, sys
ref = [json.loads(l) for l in open(sys.argv[1])]
out = [json.loads(l) for l in open(sys.argv[2])]
assert len(ref) == len(out), f"{len(out)} results for {len(ref)} prompts"
worst = 0.0
for i, (r, o) in enumerate(zip(ref, out)):
    assert o["status"] == "completed", f"prompt {i}: {o}"
    assert o["token_ids"] == r["ids"], f"prompt {i}: ids {o['token_ids']} != transformers {r['ids']}"
    for t, (step, lp) in enumerate(zip(r["steps"], o["logprobs"])):
        d = max([abs(lp["logprob"] - step["logprob"])] +
                [abs(a["logprob"] - b[1]) for a, b in zip(lp["top_logprobs"], step["top"])])
        assert d <= 1e-3, f"prompt {i} step {t}: logprob differs by {d}"
        worst = max(worst, d)
print(f"ok   {sys.argv[3]}: {len(ref)} prompts, ids equal, max |dlogprob| {worst:.2e}")
PY
    then :; else fail=1; fi
  done
done
[ $fail -eq 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail
