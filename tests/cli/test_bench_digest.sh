#!/usr/bin/env bash
# `llmq bench`'s output_digest: a fingerprint of every timed request's generated ids, so that two runs
# (two builds, two machines) show whether they generated the same tokens. On a tiny model (CPU backend,
# the fp32 oracle, whose tokens do not depend on how requests are batched): the same run twice and
# the same requests batched otherwise give one digest; other prompts (--seed) or another length give
# another.
. "$(dirname "$0")/cli_lib.sh"

tiny_model "$tmp/m"
run=("$LLMQ_BIN" bench --model "$tmp/m" --backend cpu --threads 1 --workload chat -n 6 --input-len 24 --output-len 5)

digest() { field output_digest; }
check "first run" 0 "${run[@]}"
py "a 16-digit hex digest" "len(d['output_digest']) == 16 and int(d['output_digest'], 16) >= 0 and d['failed'] == 0"
a=$(digest)
check "the same run again" 0 "${run[@]}"
[ "$(digest)" = "$a" ] && ok "the same run gives the same digest" || bad "digest $(digest) after $a"
check "one request a step" 0 "${run[@]}" --max-num-seqs 1
[ "$(digest)" = "$a" ] && ok "batching does not change the digest" || bad "max-num-seqs 1: $(digest), not $a"
check "other prompts" 0 "${run[@]}" --seed 7
[ "$(digest)" != "$a" ] && ok "other prompts, another digest" || bad "--seed 7 gave the same digest $a"
check "one token more" 0 "${run[@]}" --output-len 6
[ "$(digest)" != "$a" ] && ok "another length, another digest" || bad "--output-len 6 gave the same digest $a"
finish
