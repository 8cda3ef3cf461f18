#!/usr/bin/env bash
# contrib/lab/ktrace/ktrace_summary.py on a synthetic timeline whose answer is known: steps cut at the
# embedding kernel, the critical-path share of a kernel that starts before the one before it ends,
# the layer table (a layer begins at the decode attention), the step tables over the steps that ran
# the most common kernels and grids only, demangled names shortened, quoted CSV
# fields with commas; --whole's host turns before each step by kind; --shapes (one kernel's launches
# by grid); a gzip-compressed trace. The CUPTI library that writes real timelines:
# contrib/lab/ktrace/test_ktrace.sh.
. "$LLMQ_SOURCE_DIR/tests/cli/cli_lib.sh"
sum=$LLMQ_SOURCE_DIR/contrib/lab/ktrace/ktrace_summary.py

# 4 steps: embedding 2 us; 3 layers of [attention 3 us starting 1 us before the kernel before it
# ends, GEMV 10 us after a 0.2 us gap, RMSNorm 1.5 us after 0.1 us]; sample 2 us after 0.3 us; 5 us
# between steps. Per step: span 2 + 3 * (2 + 10.2 + 1.6) + 2.3 = 45.7 us, period 50.7 us.
python3 - "$tmp/t.csv" <<'PY'
import sys
att = "void (anonymous namespace)::attention_decode_kernel<128, false, true>(__nv_bfloat16 const*, int)"
gemv = "void gemv_kernel<8, 2, 1, 4, false, true, false, 1, false>(void const*, float const*)"
norm = "void rmsnorm_vec_kernel<4, true>(float*, __nv_bfloat16 const*)"
rows, t = [], 10_000
for step in range(4):
    rows.append((t, t + 2000, "void embedding_vec_kernel<float>(int const*)")); t += 2000
    for layer in range(3):
        s = t - 1000; rows.append((s, s + 3000, att)); t = s + 3000
        s = t + 200; rows.append((s, s + 10_000, gemv)); t = s + 10_000
        s = t + 100; rows.append((s, s + 1500, norm)); t = s + 1500
    s = t + 300; rows.append((s, s + 2000, "void sample_kernel<true>(float const*, int)")); t = s + 2000
    t += 5000
with open(sys.argv[1], "w") as f:
    f.write("start_ns,end_ns,grid,block,regs,graph_node,name\n")
    for st, en, name in reversed(rows):  # any order: the summary sorts by start
        f.write('%d,%d,132,256,64,0,"%s"\n' % (st, en, name.replace('"', '""')))
PY
check "summary" 0 python3 "$sum" "$tmp/t.csv"
has() { grep -qE -- "$2" <<<"$out" && ok "$1" || bad "$1: no line matching '$2' in: $out"; }
has "steps" "^4 steps, 4 analysed of 11 kernels each"
has "span and period" "step span 45\.7 us .*step period 50\.7 us"
has "attention share" "^attention_decode_kernel<128, false, true> +3 +9\.0 +6\.0 +132"
has "gemv share" "^gemv_kernel<8, 2, 1, 4, false, true, false, 1, false> +3 +30\.0 +30\.6"
has "total" "^total +47\.5 +45\.7"
has "layer table" "one layer \(3 kernels, averaged over 2 layers x 4 steps\)"
has "layer attention" "^attention_decode_kernel<128, false, true> +3\.00 +2\.00 +-1\.00 +132"
has "layer norm" "^rmsnorm_vec_kernel<4, true> +1\.50 +1\.60 +0\.10"
has "layer sum" "^layer +14\.50 +13\.80"
# --whole: shares of the whole run, 197.8 us (gaps in no kernel's share: 19.8 us of them, 1.2 a step
# and 5 between steps); steps with a prefill kernel apart (the last step's attention renamed: the
# file lists that step first)
check "--whole" 0 python3 "$sum" "$tmp/t.csv" --whole
has "whole span" "^44 kernels over 0\.198 ms"
has "whole gemv" "^gemv_kernel<8, 2, 1, 4, false, true, false, 1, false> +12 +0\.120 +0\.120 +60\.7%"
has "whole attention" "^attention_decode_kernel<128, false, true> +12 +0\.036 +0\.024 +12\.1%"
has "whole idle" "^\(no kernel running\) +0\.020 +10\.0%"
has "whole steps" "^decode only +4 +0\.198 +0\.049"
has "host turns" "^decode only +3 +5\.0 +0\.015$" # the 5 us before steps 2-4; none before the first
awk 'NR > 1 && NR <= 12 { sub(/attention_decode_kernel/, "attention_prefill_kernel") } { print }' "$tmp/t.csv" >"$tmp/p.csv"
check "--whole, a prefill step" 0 python3 "$sum" "$tmp/p.csv" --whole
has "prefill step" "^with prefill +1 +0\.046 +0\.046"
has "decode steps" "^decode only +3 +0\.152 +0\.051"
has "turn before the prefill step" "^with prefill +1 +5\.0 +0\.005$"
has "turns before decode steps" "^decode only +2 +5\.0 +0\.010$"
# --shapes: the last step's launches (listed first) with grid 64 instead of 132
sed -E '2,12s/^([0-9]+,[0-9]+),132,/\1,64,/' "$tmp/t.csv" >"$tmp/g.csv"
check "--shapes" 0 python3 "$sum" "$tmp/g.csv" --shapes 'attention_decode'
has "shape of grid 132" "^attention_decode_kernel<128, false, true> +132 +9 +3\.0 +0\.027$"
has "shape of grid 64" "^attention_decode_kernel<128, false, true> +64 +3 +3\.0 +0\.009$"
grep -q gemv <<<"$out" && bad "--shapes: a kernel that does not match is listed: $out" || ok "--shapes: matches only"
# the step tables leave that last step out (its kernels differ: another grid), rather than mixing it in
check "a step of other grids" 0 python3 "$sum" "$tmp/g.csv"
has "other step left out" "^4 steps, 3 analysed of 11 kernels each: .*\(1 other steps of 11 kernels left out\)"
has "other step: layer grid" "^attention_decode_kernel<128, false, true> +3\.00 +2\.00 +-1\.00 +132"
has "other step: step table grid" "^attention_decode_kernel<128, false, true> +3 +9\.0 +6\.0 +132"
check "--shapes, no match" 1 python3 "$sum" "$tmp/t.csv" --shapes 'no_such_kernel'
grep -q "no kernel matches" "$tmp/err" || bad "no match: no clear message: $(cat "$tmp/err")"
gzip -c "$tmp/t.csv" >"$tmp/t.csv.gz"
plain=$(python3 "$sum" "$tmp/t.csv" --whole)
check "a .gz trace" 0 python3 "$sum" "$tmp/t.csv.gz" --whole
[ "$out" = "$plain" ] && ok "a .gz trace reads the same" || bad "a .gz trace: $out"
check "--last 2" 0 python3 "$sum" "$tmp/t.csv" --last 2
has "--last" "^4 steps, 2 analysed"
printf 'start_ns,end_ns,grid,block,regs,graph_node,name\n' >"$tmp/empty.csv"
check "empty trace" 1 python3 "$sum" "$tmp/empty.csv"
grep -q "no kernels" "$tmp/err" || bad "empty trace: no clear message: $(cat "$tmp/err")"
finish
