#!/usr/bin/env bash
# `llmq bench --shared-prefix` on a tiny model (CPU backend): the prefix cache's queries and hits
# (tokens, vLLM's counting) in the JSON line against what the scheduler must do.
#
# The expectation: every request is queried with its whole prompt (queries = requests x input_len).
# Blocks are registered in the cache after the step that computed them, so the requests admitted
# in the first step of the timed run (k1 of them) find nothing; every later one finds the shared
# prefix's full blocks, P = floor(min(N, input_len - 1) / block_size) * block_size tokens (the match
# stops at the first block holding a token of its own; random ids make a longer match
# impossible in practice). So hits = (requests - k1) * P, where the first step admits whole prompts
# while the token budget lasts and one more chunked into what is left: k1 = ceil(budget /
# input_len) when the pool and max_num_seqs allow, and k1 = 1 with --max-num-seqs 1 (each request
# runs alone). Without a shared prefix nothing is found; with the cache off nothing is counted.
. "$(dirname "$0")/cli_lib.sh"

tiny_model "$tmp/m"
N=100 L=200 BS=16 REQ=6
P=$(( (N < L - 1 ? N : L - 1) / BS * BS )) # 96
run=("$LLMQ_BIN" bench --model "$tmp/m" --workload summarize -n $REQ --input-len $L --output-len 4
  --block-size $BS --max-model-len 1024 --backend cpu --threads 1)

# ---- the command line
check "--help" 0 "$LLMQ_BIN" bench --help
grep -q -- "--shared-prefix" <<<"$out" || bad "--help does not mention --shared-prefix"
grep -q -- "--no-prefix-caching" <<<"$out" || bad "--help does not mention --no-prefix-caching"
check "prefix longer than the prompt" 2 "${run[@]}" --shared-prefix $((L + 1))
grep -q -- "--shared-prefix" "$tmp/err" || bad "the error does not name --shared-prefix: $(cat "$tmp/err")"
check "negative prefix" 2 "${run[@]}" --shared-prefix -3

# ---- one request at a time: every request after the first finds the prefix
check "shared prefix, one at a time" 0 "${run[@]}" --shared-prefix $N --max-num-seqs 1
expect "one at a time" shared_prefix $N
expect "one at a time" prefix_caching true
expect "one at a time" prefix_cache_queries $((REQ * L))
expect "one at a time" prefix_cache_hits $(((REQ - 1) * P))
rate=$(field prefix_cache_hit_rate)
python3 -c "import sys; r=float(sys.argv[1]); sys.exit(0 if abs(r - $(((REQ - 1) * P)) / $((REQ * L))) < 1e-3 and r > 0 else 1)" "$rate" &&
  ok "one at a time: hit rate $rate" || bad "one at a time: hit rate $rate"
expect "one at a time" failed 0

# ---- concurrent admission: a budget of two prompts admits k1 = 2 in the first step
check "shared prefix, budget 2 x input" 0 "${run[@]}" --shared-prefix $N --max-num-batched-tokens $((2 * L))
expect "budget 2L" prefix_cache_hits $(((REQ - 2) * P))
check "shared prefix, budget 1.5 x input" 0 "${run[@]}" --shared-prefix $N --max-num-batched-tokens $((3 * L / 2))
expect "budget 1.5L (one whole, one chunked)" prefix_cache_hits $(((REQ - 2) * P))
check "shared prefix, budget for all" 0 "${run[@]}" --shared-prefix $N --max-num-batched-tokens $((REQ * L))
expect "budget for all (all admitted before anything is cached)" prefix_cache_hits 0
# a prefix that is a whole number of blocks: the block after it is the first miss
check "shared prefix of 6 blocks" 0 "${run[@]}" --shared-prefix 96 --max-num-seqs 1
expect "prefix 96" prefix_cache_hits $(((REQ - 1) * 96))
# the whole prompt shared: the match stops one token short of the end, at a block boundary
check "whole prompt shared" 0 "${run[@]}" --shared-prefix $L --max-num-seqs 1
expect "prefix = prompt" prefix_cache_hits $(((REQ - 1) * ((L - 1) / BS * BS)))

# ---- no shared prefix: queried, never found
check "no shared prefix" 0 "${run[@]}" --max-num-seqs 1
expect "no prefix" shared_prefix 0
expect "no prefix" prefix_cache_queries $((REQ * L))
expect "no prefix" prefix_cache_hits 0
expect "no prefix" prefix_cache_hit_rate 0.0

# ---- the cache off: nothing counted (vLLM counts nothing either)
check "cache off" 0 "${run[@]}" --shared-prefix $N --max-num-seqs 1 --no-prefix-caching
expect "cache off" prefix_caching false
expect "cache off" prefix_cache_queries 0
expect "cache off" prefix_cache_hits 0
grep -q "prefix caching off" "$tmp/err" || bad "cache off: the engine does not log it: $(cat "$tmp/err")"

finish
