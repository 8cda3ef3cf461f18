#!/usr/bin/env bash
# contrib/bench/transformers_peer.py (the transformers peer of `llmq bench`) without a GPU or torch:
# --help answers and lists the workloads and modes, a wrong command line exits 2, and the script's
# workloads, model shapes (dense and Qwen3-MoE) and weight/prompt rules are llmq's. Those are read from
# the sources that define them (engine/bench.c, engine/random_model.c and .h, worker/cli/cmd_bench.c),
# from `llmq bench --help`, and from llmq itself: the CPU backend refuses the large shapes naming their
# parameter count, which the peer's shape must give to 0.1 B. So a shape or workload changed on one side only
# fails here. contrib/bench/ceilings.py's --help is checked too (a GPU run is not possible here).
. "$(dirname "$0")/cli_lib.sh"
peer=$LLMQ_SOURCE_DIR/contrib/bench/transformers_peer.py

check "--help" 0 python3 "$peer" --help
for w in chat decode summarize longdoc single static compiled cb --random-weights --model --num-prompts --dtype \
  qwen3-14b qwen3-8b qwen3-0.6b qwen3-30b-a3b; do
  grep -q -- "$w" <<<"$out" || bad "--help does not mention $w"
done
check "no workload" 2 python3 "$peer" --random-weights qwen3-14b
check "unknown workload" 2 python3 "$peer" --random-weights qwen3-14b --workload nope
check "unknown shape" 2 python3 "$peer" --random-weights qwen3-13b --workload chat
check "no model" 2 python3 "$peer" --workload chat
if ! python3 -c "import torch" 2>/dev/null; then
  check "a run without torch" 1 python3 "$peer" --random-weights qwen3-0.6b --workload single
  grep -q "needs torch and transformers" "$tmp/err" || bad "no message about torch: $(cat "$tmp/err")"
fi
check "ceilings.py --help" 0 python3 "$LLMQ_SOURCE_DIR/contrib/bench/ceilings.py" --help

check "--describe" 0 python3 "$peer" --describe
echo "$out" >"$tmp/peer.json"
"$LLMQ_BIN" bench --help >"$tmp/bench_help.txt" 2>&1 || bad "llmq bench --help failed"
for s in qwen3-14b qwen3-8b qwen3-30b-a3b; do # the CPU backend's refusal names the shape's parameters
  "$LLMQ_BIN" bench --random-weights "$s" --workload single --backend cpu >/dev/null 2>"$tmp/refusal_$s.txt"
  [ $? -eq 1 ] || bad "llmq bench --random-weights $s on the CPU did not refuse: $(cat "$tmp/refusal_$s.txt")"
done

python3 - "$tmp" "$LLMQ_SOURCE_DIR" <<'PY' && ok "the peer's workloads, shapes and rules are llmq's" || bad "the peer and llmq differ (above)"
import json, re, sys
tmp, src = sys.argv[1], sys.argv[2]
peer = json.load(open(f"{tmp}/peer.json"))
read = lambda p: open(f"{src}/{p}").read()
errors = []
def same(what, got, want):
    if got != want:
        errors.append(f"{what}: the peer has {got}, llmq has {want}")
def found(what, items):
    if not items:
        errors.append(f"{what}: not found (the format changed? update this test)")
    return items

# workloads: engine/bench.c's table, and what `llmq bench --help` tells users
table = found("WORKLOADS in engine/bench.c", re.findall(r'\{"(\w+)",\s*(\d+),\s*(\d+),\s*(\d+)\}', read("engine/bench.c")))
llmq_w = {w: dict(requests=int(n), input_len=int(i), output_len=int(o)) for w, n, i, o in table}
# mapreduce is a tree of requests made as the engine answers (docs/BENCH.md), which the peer does not run
if llmq_w.pop("mapreduce", None) is None:
    errors.append("mapreduce: not in engine/bench.c's table (update this test)")
same("workloads (engine/bench.c)", peer["workloads"], llmq_w)
helptext = open(f"{tmp}/bench_help.txt").read()
listed = found("workloads in llmq bench --help", re.findall(r"(\w+) \((\d+) x (\d+)(?: in)? / (\d+)(?: out)?\)", helptext))
same("workloads (llmq bench --help)", peer["workloads"],
     {w: dict(requests=int(n), input_len=int(i), output_len=int(o)) for w, n, i, o in listed})

# shapes: engine/random_model.c's tables (dense, then MoE) and the constants every shape shares
rm = read("engine/random_model.c")
def const(pattern, what):
    m = re.search(pattern, rm)
    found(what, m)
    return m.group(1) if m else None
rows = found("SHAPES in engine/random_model.c", re.findall(
    r'\{"(qwen3-[\w.]+)",\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(true|false)\}', rm))
keys = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim"]
llmq_s = {r[0]: dict(zip(keys, map(int, r[1:7])), tie_word_embeddings=r[7] == "true") for r in rows}
m = re.search(r"MOE_SHAPES\[\] = \{(.*?)\n\};", rm, re.S)
moe_rows = found("MOE_SHAPES in engine/random_model.c", re.findall(
    r'\{"(qwen3-[\w.-]+)",' + r",".join([r"\s*(\d+)"] * 9) + r"\}", m.group(1) if m else ""))
# what random_model_config sets for every MoE shape: untied, normalized top-k, every layer MoE (no mlp_only)
moe_tie = const(r"MOE_SHAPES\[i\]\.head_dim, (true|false)\);", "the MoE shapes' tie_embeddings")
moe_norm = const(r"cfg->norm_topk_prob = (true|false);", "cfg->norm_topk_prob")
moe_step = const(r"cfg->decoder_sparse_step = (\d+);", "cfg->decoder_sparse_step")
for r in moe_rows:
    llmq_s[r[0]] = dict(zip(keys, map(int, r[1:7])), tie_word_embeddings=moe_tie == "true",
                        num_experts=int(r[7]), num_experts_per_tok=int(r[8]), moe_intermediate_size=int(r[9]),
                        norm_topk_prob=moe_norm == "true", decoder_sparse_step=int(moe_step or 0),
                        mlp_only_layers=[])
same("shapes (engine/random_model.c)", {s: {k: v for k, v in d.items() if k != "params"}
                                       for s, d in peer["shapes"].items()}, llmq_s)
c = peer["common"]
same("vocab", str(c["vocab_size"]), const(r"cfg->vocab = (\d+);", "cfg->vocab"))
same("max_position", str(c["max_position_embeddings"]), const(r"cfg->max_position = (\d+);", "cfg->max_position"))
same("rms_eps", c["rms_norm_eps"], float(const(r"cfg->rms_eps = ([\d.e+-]+)f?;", "cfg->rms_eps") or "nan"))
same("rope_theta", c["rope_theta"], float(const(r"cfg->rope_theta = ([\d.e+-]+);", "cfg->rope_theta") or "nan"))
same("qkv bias", c["attention_bias"], const(r"cfg->qkv_bias = (true|false);", "cfg->qkv_bias") == "true")
same("q/k norm (always in Qwen3)", True, const(r"cfg->qk_norm = (true|false);", "cfg->qk_norm") == "true")
eos = [int(x) for x in re.findall(r"cfg->eos_ids\[\d\] = (\d+);", rm)]
same("eos ids", c["eos_token_id"], found("cfg->eos_ids", eos))
same("pad id", str(c["pad_token_id"]), const(r"cfg->pad_id = (\d+);", "cfg->pad_id"))
m = re.search(r"#define RANDOM_MODEL_STD ([\d.]+)", read("engine/random_model.h"))
same("weight std (engine/random_model.h)", peer["weight_std"], float(found("RANDOM_MODEL_STD", m).group(1)) if m else None)
m = re.search(r"#define PROMPT_ID_RANGE (\d+)", read("worker/cli/cmd_bench.c"))
same("prompt id range (worker/cli/cmd_bench.c)", peer["prompt_id_range"], int(found("PROMPT_ID_RANGE", m).group(1)) if m else None)

# llmq's own parameter count of the large shapes, from its refusal on the CPU
for s in ("qwen3-14b", "qwen3-8b", "qwen3-30b-a3b"):
    m = re.search(r"\(([\d.]+) B parameters\)", open(f"{tmp}/refusal_{s}.txt").read())
    if found(f"the parameter count in llmq's refusal of {s}", m):
        same(f"{s} parameters (to 0.1 B)", f"{peer['shapes'][s]['params'] / 1e9:.1f}", m.group(1))
print("\n".join(errors))
sys.exit(1 if errors else 0)
PY
finish
