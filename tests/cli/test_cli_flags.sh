#!/usr/bin/env bash
# The conventions of docs/CLI.md: option errors name the option as typed; the engine flags are one
# table that run, worker and bench share; short flags mean one thing; --version everywhere;
# --json = --format json; an unreachable Redis is exit 69 for every command; --quiet.
. "$(dirname "$0")/cli_lib.sh"
L=$LLMQ_BIN
dead=redis://127.0.0.1:1
says() { # says NAME TEXT: the last check's output holds TEXT
  if grep -qF -- "$2" <<<"$out"; then ok "$1"; else bad "$1: no '$2' in: $out"; fi
}

# ---- option errors: the option as typed and what is wrong
check_merged "--limit without value" 2 "$L" results --limit
says "  names --limit" "llmq results: --limit needs a value"
grep -q -- " -n" <<<"$out" && bad "  --limit reported as -n: $out" || ok "  not as -n"
check_merged "misspelt --limt" 2 "$L" results --limt 3
says "  did you mean" "unknown option --limt (did you mean --limit?)"
check_merged "-n without value" 2 "$L" results -n
says "  names -n" "-n needs a value"
check_merged "flag with a value it does not take" 2 "$L" worker --drain=yes
says "  takes no value" "--drain takes no value"
check_merged "ambiguous prefix" 2 "$L" worker --metrics
says "  lists both" "option --metrics is ambiguous (--metrics-port, --metrics-address)"
check_merged "unknown short flag" 2 "$L" status -x
says "  names -x" "unknown option -x"
check_merged "engine flag misspelt on run" 2 "$L" run --kv-cach-dtype fp8
says "  suggests the engine flag" "(did you mean --kv-cache-dtype?)"

# ---- one table of engine flags: bench's are run's and worker's, with the same --help line
"$L" bench --help | sed -n '/^Engine and model/,/^$/p' | grep -o '^  [a-z, -]*--[a-z-]*' | grep -o -- '--[a-z-]*$' >"$tmp/bench"
[ "$(wc -l <"$tmp/bench")" -ge 20 ] && ok "bench lists its engine flags" || bad "bench engine flags: $(cat "$tmp/bench")"
for cmd in run worker; do
  "$L" $cmd --help >"$tmp/help"
  missing=$(grep -v -- '-max-num-seqs$\|-batched-tokens$' "$tmp/bench" | while read -r f; do grep -q -- "$f " "$tmp/help" || echo "$f"; done)
  [ -z "$missing" ] && ok "$cmd takes every engine flag of bench" || bad "$cmd lacks: $missing"
done
for f in --dtype --kv-cache-dtype --lm-head-dtype --decode-weight-copies --gemm-tuning-file --max-model-len; do
  [ "$("$L" run --help | grep -- "  $f ")" = "$("$L" bench --help | grep -- "  $f ")" ] && ok "$f: one help line" ||
    bad "$f help differs between run and bench"
done
# a flag's value reaches its key (validated there, named by the flag) on run and worker
check_merged "run --kv-cache-dtype bad" 2 "$L" run --model "$tmp/none" -i x -o y --kv-cache-dtype fp4
says "  run names the flag" "--kv-cache-dtype"
check_merged "worker --dtype bad" 2 "$L" worker --model "$tmp/none" --dtype fp3
says "  worker names the flag" "--dtype"
check_merged "worker --metrics-port out of range" 2 "$L" worker --model "$tmp/none" --metrics-port 70000
says "  names --metrics-port" "--metrics-port"
check_merged "worker --metrics-address empty" 2 "$L" worker --model "$tmp/none" --metrics-address ""
says "  names --metrics-address" "--metrics-address"

# ---- short flags: one meaning each (-n how many, -w --watch, -t --timeout)
check_merged "status -n is not --interval" 2 "$L" status -n 5
check_merged "requeue -n is not --dry-run" 2 "$L" requeue -b x -n
check_merged "enqueue -t is not --template" 2 "$L" enqueue -t x
check_merged "bench -w is not --workload" 2 "$L" bench -w chat
check_merged "bench -n is --num-prompts (a count)" 2 "$L" bench -n 0 --workload chat
says "  a bad value names the long form" "--num-prompts: '0' is not an integer >= 1"
check_merged "batch list -n is --limit" 69 "$L" batch list --redis $dead -n 3
check_merged "wait -t is --timeout" 69 "$L" wait --redis $dead -t 1 x

# ---- --version on every subcommand
for cmd in $("$L" help | awk '/^Commands:/{on=1;next} on && !NF {exit} on {print $1}' | grep -v '^help$'); do
  check "$cmd --version" 0 "$L" $cmd --version
  grep -Eq '^llmq [0-9]+\.[0-9]+\.[0-9]+' <<<"$out" || bad "  $cmd --version printed: $out"
done

# ---- --json is --format json; status takes --format too
check_merged "status --format yaml" 2 "$L" status --redis $dead --format yaml
check_merged "status --format json" 69 "$L" status --redis $dead --format json
for cmd in "batch list" "batch status x" "wait x"; do
  check_merged "$cmd --json" 69 "$L" $cmd --redis $dead --json
done
"$L" make-tiny-model "$tmp/m" >/dev/null 2>&1 || bad "make-tiny-model"
printf 'x' >"$tmp/db" # not a database: both spellings fail the same way, after the option is taken
a=$("$L" results --db "$tmp/db" --json 2>&1); b=$("$L" results --db "$tmp/db" --format json 2>&1)
[ "$a" = "$b" ] && [ -n "$a" ] && ok "results --json = --format json" || bad "results --json: '$a' vs '$b'"

# ---- Redis unreachable: exit 69 everywhere
echo '{"prompt": "a", "max_tokens": 1}' >"$tmp/jobs.jsonl"
for args in "status" "batch list" "batch status b" "batch cancel b" "batch wait b" "cancel x" "requeue-dead x" \
  "wait x" "enqueue $tmp/jobs.jsonl"; do
  check_merged "unreachable: $args" 69 "$L" $args --redis $dead
done

# ---- --quiet: run prints neither bar nor summary; failed lines still
printf '{"id": "a", "prompt": "hi", "max_tokens": 2}\n{"id": "b"}\n' >"$tmp/in.jsonl"
"$L" run --model "$tmp/m" -i "$tmp/in.jsonl" -o "$tmp/out.jsonl" --quiet 2>"$tmp/q.err"
[ "$?" = 0 ] && [ "$(wc -l <"$tmp/out.jsonl")" = 2 ] && ok "run --quiet ran" || bad "run --quiet: $(cat "$tmp/q.err")"
grep -q 'line 2 (b)' "$tmp/q.err" && ! grep -q 'completed' "$tmp/q.err" && ok "  only the failed line on stderr" ||
  bad "  run --quiet stderr: $(cat "$tmp/q.err")"
"$L" run --model "$tmp/m" -i "$tmp/in.jsonl" -o "$tmp/out.jsonl" 2>"$tmp/v.err"
grep -q '2 jobs: 1 completed, 1 failed' "$tmp/v.err" && ok "  without it the summary" || bad "  summary: $(cat "$tmp/v.err")"
finish
