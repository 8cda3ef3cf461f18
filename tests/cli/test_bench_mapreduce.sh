#!/usr/bin/env bash
# `llmq bench --workload mapreduce` on a tiny model (CPU backend): documents longer than the context
# are summarized in chunks, and the summaries combined level by level until one is left per
# document. The levels, their requests and their prompt and output tokens in the JSON line are
# checked against a plan computed here from the options alone: chunks = ceil((doc - overlap) /
# (chunk - overlap)), a reduce prompt holds k = floor((budget + sep) / (out + sep)) summaries
# (budget = max_model_len - out - template), so a level of n gives ceil(n / k) requests; a group of
# m summaries has a prompt of template + m * out + (m - 1) * sep tokens, a chunk of template + its
# document tokens. Also: the line's depth against summary_depth's prediction, the digest that does
# not depend on how the documents' requests interleave, and the errors of bad options.
. "$(dirname "$0")/cli_lib.sh"

tiny_model "$tmp/m"
TPL=64 SEP=2
run=("$LLMQ_BIN" bench --model "$tmp/m" --backend cpu --threads 1 --workload mapreduce)

# plan DOCS DOC CHUNK OVERLAP OUT: checks the line in $out against the plan
plan() {
  python3 - "$out" "$@" "$TPL" "$SEP" <<'PY' && ok "plan $*" || bad "plan $*: $out"
import json, sys
d = json.loads(sys.argv[1])
docs, doc, chunk, ov, out, tpl, sep = map(int, sys.argv[2:9])
m = d["mapreduce"]
budget = d["max_model_len"] - out - tpl
step = chunk - ov
n = 1 if doc <= chunk else -(-(doc - ov) // step)
k = (budget + sep) // (out + sep)
widths = [n]
while widths[-1] > 1:
    widths.append(-(-widths[-1] // k))
ptok = [n * tpl + sum(min(i * step + chunk, doc) - i * step for i in range(n))]
for l in range(1, len(widths)):
    g, p = widths[l], widths[l - 1]
    ptok.append(g * tpl + p * out + (p - g) * sep)
want = {
    "documents": docs, "doc_len": doc, "chunk_len": chunk, "overlap": ov, "chunks": n,
    "template_tokens": tpl, "sep_tokens": sep, "reduce_budget": budget,
    "depth": len(widths), "predicted_depth": len(widths), "documents_done": docs,
    "requests_per_level": [docs * w for w in widths],
    "prompt_tokens_per_level": [docs * p for p in ptok],
    "output_tokens_per_level": [docs * w * out for w in widths],
}
bad = {key: (m[key], v) for key, v in want.items() if m[key] != v}
total = sum(want["prompt_tokens_per_level"]) + sum(want["output_tokens_per_level"])
checks = {
    "requests": d["requests"] == sum(want["requests_per_level"]),
    "failed": d["failed"] == 0,
    "input_len": d["input_len"] == chunk,
    "max_model_len": d["max_model_len"] == tpl + chunk + out,
    # seconds is rounded to 1 ms
    "total_tokens_per_s": abs(d["total_tokens_per_s"] * d["seconds"] - total) <= 6e-4 * d["total_tokens_per_s"] + 0.01 * total,
    "map before the end": 0 < m["map_seconds"] <= d["seconds"] + 1e-3 and m["level_end_s"][-1] <= d["seconds"] + 1e-3,
    "level ends in order": m["level_end_s"] == sorted(m["level_end_s"]),
    "documents' times": 0 < m["doc_seconds_p50"] <= m["doc_seconds_max"] <= d["seconds"] + 1e-3,
}
failed = [c for c, v in checks.items() if not v]
if bad or failed:
    print("mismatch:", bad, failed, file=sys.stderr)
    sys.exit(1)
PY
}

# ---- the command line
check "--help" 0 "$LLMQ_BIN" bench --help
for w in mapreduce --doc-len --overlap; do
  grep -q -- "$w" <<<"$out" || bad "--help does not mention $w"
done
check "--doc-len with chat" 2 "$LLMQ_BIN" bench --model "$tmp/m" --workload chat --doc-len 100
check "overlap not below the chunk" 2 "${run[@]}" --input-len 64 --overlap 64
grep -q -- "--overlap" "$tmp/err" || bad "the error does not name --overlap: $(cat "$tmp/err")"
check "with a shared prefix" 2 "${run[@]}" --shared-prefix 8
check "as a background" 2 "$LLMQ_BIN" bench --model "$tmp/m" --workload chat --background mapreduce
# two summaries of 40 tokens and the separator do not fit a 64-token reduce budget
check "summaries too long to combine" 1 "${run[@]}" -n 1 --doc-len 1000 --input-len 64 --output-len 40
grep -q "do not fit" "$tmp/err" || bad "the error does not say why: $(cat "$tmp/err")"

# ---- two documents of 1000 tokens: 18 chunks of 64 (overlap 8), 4-token summaries: 18 -> 2 -> 1
check "two documents" 0 "${run[@]}" -n 2 --doc-len 1000 --input-len 64 --overlap 8 --output-len 4
plan 2 1000 64 8 4
py "three levels" "d['mapreduce']['requests_per_level'] == [36, 4, 2]"
a=$(field output_digest)
check "one request a step" 0 "${run[@]}" -n 2 --doc-len 1000 --input-len 64 --overlap 8 --output-len 4 --max-num-seqs 1
plan 2 1000 64 8 4
[ "$(field output_digest)" = "$a" ] && ok "the digest does not depend on the interleaving" ||
  bad "max-num-seqs 1: digest $(field output_digest), not $a"
# a deeper tree: 54 chunks, 6 summaries a reduce prompt: 54 -> 9 -> 2 -> 1
check "a deeper tree" 0 "${run[@]}" -n 1 --doc-len 3000 --input-len 64 --overlap 8 --output-len 8
plan 1 3000 64 8 8
py "four levels" "d['mapreduce']['depth'] == 4"
# pairs only (25-token summaries): 6 -> 3 -> 2 (a pair and one alone) -> 1
check "pairs" 0 "${run[@]}" -n 2 --doc-len 300 --input-len 64 --overlap 8 --output-len 25
plan 2 300 64 8 25
# a document of one chunk: its map summary is the answer
check "one chunk" 0 "${run[@]}" -n 3 --doc-len 50 --input-len 64 --output-len 4
plan 3 50 64 1 4
py "one level" "d['mapreduce']['requests_per_level'] == [3] and d['mapreduce']['depth'] == 1"
finish
