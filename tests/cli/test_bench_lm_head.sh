#!/usr/bin/env bash
# `llmq bench --lm-head-dtype` on tiny models (CPU backend): the output projection in fp8 where its
# shape allows (vocab and hidden size multiples of 128), reported in the JSON line (the roofline's
# count of it: tests/unit/test_bench_roofline.c); refused (kept bf16, with a log line) where the shape
# does not allow it; a bad value is a usage error. Also the roofline's attention keys of the line.
. "$(dirname "$0")/cli_lib.sh"

tiny_model "$tmp/a" --hidden 128 --heads 4 --kv-heads 2 --intermediate 256 --vocab 384 --no-tie
tiny_model "$tmp/t" --hidden 128 --heads 4 --kv-heads 2 --intermediate 256 --vocab 512 --tie
tiny_model "$tmp/u" # hidden 64, vocab 512: not 128-aligned
run() { "$LLMQ_BIN" bench --model "$1" --workload single --input-len 16 --output-len 4 --backend cpu --threads 1 "${@:2}"; }

check "--help" 0 "$LLMQ_BIN" bench --help
grep -q -- "--lm-head-dtype" <<<"$out" || bad "--help does not mention --lm-head-dtype"
check "bad value" 2 run "$tmp/a" --lm-head-dtype fp4
grep -q -- "--lm-head-dtype: .*fp4" "$tmp/err" || bad "the error does not name the flag and value: $(cat "$tmp/err")"

for m in a t; do
  check "$m: default" 0 run "$tmp/$m"
  expect "$m: default" lm_head_dtype '"bf16"'
  expect "$m: default" failed 0
  # attention's part of the roofline floor (tests/unit/test_bench_roofline.c has its arithmetic; the
  # seconds are rounded to 1e-6, which a tiny model's floor is)
  py "$m: attention's floor within the floor" \
    '0 <= d["attention_ideal_s"] <= d["ideal_s"] and 0 < d["attention_ideal_share"] < 1' 
  check "$m: fp8" 0 run "$tmp/$m" --lm-head-dtype fp8
  expect "$m: fp8" lm_head_dtype '"fp8"'
  expect "$m: fp8" failed 0
  grep -q "and lm_head hold fp8" "$tmp/err" || bad "$m: fp8: the backend does not log the fp8 lm_head: $(grep 'cpu backend' "$tmp/err")"
  check "$m: bf16" 0 run "$tmp/$m" --lm-head-dtype bf16
  expect "$m: bf16" lm_head_dtype '"bf16"'
done

check "unaligned: fp8 asked" 0 run "$tmp/u" --lm-head-dtype fp8
expect "unaligned: fp8 asked" lm_head_dtype '"bf16"'
expect "unaligned: fp8 asked" failed 0
grep -q "lm_head: .*128" "$tmp/err" || bad "unaligned: no log line says why it stays bf16: $(grep lm_head "$tmp/err")"

finish
