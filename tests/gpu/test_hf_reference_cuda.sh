#!/usr/bin/env bash
# `llmq run --backend cuda` against Hugging Face transformers' fp32 goldens (tests/fixtures/models):
# the fixture prompts, greedy, logprobs 5, all in one batch. Compared position by position up to a
# sequence's first differing id (after it the contexts differ): a differing id is allowed only where
# the golden top-2 gap is small, logprobs are measured against the golden ones.
#
# Each checkpoint runs twice: in bf16 (the default) and in fp16 mode (model.dtype fp16: weights,
# activations and KV cache in fp16). The issue's bars (ids equal wherever the golden gap exceeds 0.05,
# logprobs within 0.02) are printed as met or not met for both, and are fp16 mode's pass criterion.
# In bf16 they cannot be: these tiny models are peaked (logit std 4-8), so bf16 arithmetic alone
# moves their logprobs further than 0.02 (transformers' own bf16 lands 0.04-0.12 away). There, where
# torch and transformers are importable (the GPU machine), the same checkpoints are run through
# transformers in bf16 (bf16_spread.py, teacher-forced) and llmq must stay within twice transformers'
# own bf16 distance (at least 0.02); elsewhere within 0.25. Transformers' fp16 distance is printed
# beside fp16 mode's. Skips (77) without a GPU.
set -euo pipefail
fix=$LLMQ_SOURCE_DIR/tests/fixtures/models
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no NVIDIA GPU here (nvidia-smi -L fails)"; exit 77
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# every entry with goldens whose head_dim the CUDA kernels support (64, 128)
names=$(python3 - "$fix" <<'PY'
import json, os, sys
fix = sys.argv[1]
spec = json.load(open(os.path.join(fix, "models.json")))
for m in spec["models"] + spec.get("gpu_models", []):
    d = int(m["args"][m["args"].index("--head-dim") + 1])
    if d not in (64, 128):
        print(f"note: {m['name']}: head_dim {d} is CPU-only (the CUDA attention kernels take 64 and 128)", file=sys.stderr)
    elif not os.path.exists(os.path.join(fix, m["name"] + ".jsonl")):
        print(f"note: {m['name']}: no goldens yet (make_hf_fixtures.py --only {m['name']})", file=sys.stderr)
    else:
        print(m["name"])
PY
)
[ -n "$names" ] || { echo "FAIL: no fixture checkpoint with goldens that the CUDA backend can run"; exit 1; }
for name in $names; do
  args=$(python3 -c "import json; s = json.load(open('$fix/models.json')); print(' '.join(' '.join(m['args']) for m in s['models'] + s.get('gpu_models', []) if m['name']=='$name'))")
  "$LLMQ_BIN" make-tiny-model "$tmp/models/$name" $args >/dev/null
  want=$(cut -c1-64 "$fix/$name.sha256"); got=$(sha256sum "$tmp/models/$name/model.safetensors" | cut -c1-64)
  [ "$want" = "$got" ] || { echo "FAIL $name: checkpoint differs from the fixture's (regenerate fixtures)"; exit 1; }
done
: >"$tmp/hf_bf16.jsonl"; : >"$tmp/hf_fp16.jsonl"
if python3 -c "import torch, transformers; assert torch.cuda.is_available()" 2>/dev/null; then
  python3 "$fix/bf16_spread.py" --models "$tmp/models" >"$tmp/hf_bf16.jsonl"
  python3 "$fix/bf16_spread.py" --models "$tmp/models" --dtype float16 >"$tmp/hf_fp16.jsonl"
  cat "$tmp/hf_bf16.jsonl" "$tmp/hf_fp16.jsonl"
else
  echo "note: torch/transformers not importable here; llmq is held to a fixed 0.25 in bf16 (fp16: the issue's 0.02)"
fi
fail=0
for mode in bf16 fp16; do
for name in $names; do
  python3 - "$fix/$name.jsonl" > "$tmp/$name.in.jsonl" <<'PY'
import json, sys
for i, line in enumerate(open(sys.argv[1])):
    f = json.loads(line)
    print(json.dumps({"id": f"p{i}", "prompt": f["prompt"], "max_tokens": len(f["ids"]), "temperature": 0,
                      "ignore_eos": True, "logprobs": 5, "return_token_ids": True}))
PY
  LLMQ_MODEL_DTYPE=$mode "$LLMQ_BIN" run --model "$tmp/models/$name" --backend cuda --max-model-len 4096 \
    --input "$tmp/$name.in.jsonl" --output "$tmp/$name.out.jsonl" 2>"$tmp/$name.err" ||
    { if grep -q "built without the CUDA backend" "$tmp/$name.err"; then
        echo "skipped: this llmq was built without the CUDA backend"; exit 77; fi
      echo "FAIL $name ($mode): llmq run failed:"; tail -5 "$tmp/$name.err"; fail=1; continue; }
  python3 - "$fix/$name.jsonl" "$tmp/$name.out.jsonl" "$name" "$tmp/hf_$mode.jsonl" "$mode" <<'PY' || fail=1
import json, sys
ref = [json.loads(l) for l in open(sys.argv[1])]
out = [json.loads(l) for l in open(sys.argv[2])]
name, mode = sys.argv[3], sys.argv[5]
hf = {r["model"]: r for r in map(json.loads, open(sys.argv[4]))}
if mode == "fp16":
    tol, why = 0.02, "the issue's bar" + (f"; transformers fp16 {hf[name]['max_abs_dlogprob']:.4f}" if name in hf else "")
elif name in hf:
    tol = max(0.02, 2 * hf[name]["max_abs_dlogprob"])
    why = f"2 x transformers bf16's {hf[name]['max_abs_dlogprob']:.4f}"
else:
    tol, why = 0.25, "fixed"
assert len(ref) == len(out), f"{len(out)} results for {len(ref)} prompts"
worst, n, flips, flips_issue, bad = 0.0, 0, 0, 0, []
ds = []
for i, (r, o) in enumerate(zip(ref, out)):
    if o["status"] != "completed":
        bad.append(f"prompt {i}: {o.get('status')} {o.get('error')}")
        continue
    for t, (step, lp) in enumerate(zip(r["steps"], o["logprobs"])):
        d = abs(lp["logprob"] - step["logprob"]) if o["token_ids"][t] == step["id"] else None
        if d is None:
            flips += 1
            flips_issue += step["gap"] > 0.05
            if step["gap"] > (0.05 if mode == "fp16" else 2 * tol):
                bad.append(f"prompt {i} step {t}: id {o['token_ids'][t]} != {step['id']} with golden gap {step['gap']:.3f}")
            break
        ds.append(d)
        n += 1
ds.sort()
worst = ds[-1] if ds else 0.0
p99 = ds[min(len(ds) - 1, int(0.99 * len(ds)))] if ds else 0.0
mean = sum(ds) / len(ds) if ds else 0.0
if worst > tol:
    bad.append(f"max |dlogprob| {worst:.4f} > {tol:.4f}")
issue = "met" if worst <= 0.02 and flips_issue == 0 else "not met"
print(f"{'FAIL' if bad else 'ok  '} {name} {mode}: {n} positions, max |dlogprob| {worst:.4f} p99 {p99:.4f} mean {mean:.4f} "
      f"(tol {tol:.4f}: {why}), {flips} sequences diverge ({flips_issue} where the golden gap > 0.05); issue bars {issue}")
for b in bad:
    print("     " + b)
sys.exit(1 if bad else 0)
PY
done
done
[ $fail -eq 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail
