# Shared preamble of the CLI tests that drive `llmq` directly, without Redis (tests/cli/test_run.sh,
# test_bench_*.sh), sourced by them; worker_lib.sh is the one of the worker tests. It gives a temp
# dir $tmp removed on exit, the ok/bad tally, checks of a command's exit status, JSON fields of the
# line in $out, and a tiny model:
#
#   . "$(dirname "$0")/cli_lib.sh"
#   tiny_model "$tmp/m"                        # or exits 1 ("FAIL make-tiny-model")
#   check "name" 0 "$LLMQ_BIN" bench ...       # stdout in $out, stderr in $tmp/err
#   check_merged "name" 2 "$LLMQ_BIN" run ...  # stdout and stderr together in $out
#   expect "label" prefix_cache_hits 480       # a key of the JSON line in $out
#   py "label" "d['failed'] == 0"              # a Python expression over it (as d)
#   finish                                     # prints the tally; its status is the test's
set -u
fail=0
pass=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
# finish: the last command of a test; prints the tally and returns 1 if anything failed
finish() {
  echo "$pass passed, $fail failed"
  [ $fail -eq 0 ]
}

check() { # check NAME WANT_RC CMD... ; stdout in $out, stderr in $tmp/err
  local name=$1 want=$2; shift 2
  out=$("$@" 2>"$tmp/err"); local rc=$?
  if [ "$rc" -ne "$want" ]; then bad "$name: exit $rc, want $want; $(tail -3 "$tmp/err") $out"; else ok "$name"; fi
}
check_merged() { # check_merged NAME WANT_RC CMD... ; stdout+stderr in $out
  local name=$1 want=$2; shift 2
  out=$("$@" 2>&1); local rc=$?
  if [ "$rc" -ne "$want" ]; then bad "$name: exit $rc, want $want; output: $out"; else ok "$name"; fi
}

# field NAME: a key of the JSON line in $out
field() { python3 -c 'import json,sys; v=json.loads(sys.argv[1])[sys.argv[2]]; print(json.dumps(v))' "$out" "$1"; }
expect() { # expect LABEL KEY WANT
  local got; got=$(field "$2")
  if [ "$got" = "$3" ]; then ok "$1: $2 = $3"; else bad "$1: $2 = $got, want $3"; fi
}
# py LABEL EXPR: evaluates a Python expression over the JSON line in $out (as d); fails the test when false
py() {
  local label=$1 expr=$2
  if python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if eval(sys.argv[2]) else 1)' "$out" "$expr"; then
    ok "$label"
  else
    bad "$label: $expr is false for $out"
  fi
}

# tiny_model DIR [make-tiny-model options]: a tiny random model in DIR, or the test ends (exit 1)
tiny_model() {
  "$LLMQ_BIN" make-tiny-model "$@" >/dev/null || { echo "FAIL make-tiny-model"; exit 1; }
}
