#!/usr/bin/env bash
# The command line's contract: help, version, unknown commands and flags exit 2 with a message.
set -u
fail=0
check() { # check NAME WANT_RC CMD... ; stdout+stderr in $out
  local name=$1 want=$2; shift 2
  out=$("$@" 2>&1); local rc=$?
  if [ "$rc" -ne "$want" ]; then echo "FAIL $name: exit $rc, want $want; output: $out"; fail=1; else echo "ok $name"; fi
}
check "no args" 2 "$LLMQ_BIN"
check "help" 0 "$LLMQ_BIN" help
echo "$out" | grep -q "Commands:" || { echo "FAIL help lists no commands"; fail=1; }
check "--version" 0 "$LLMQ_BIN" --version
echo "$out" | grep -Eq '^llmq [0-9]+\.[0-9]+\.[0-9]+' || { echo "FAIL version line: $out"; fail=1; }
check "unknown command" 2 "$LLMQ_BIN" frobnicate
echo "$out" | grep -q "unknown command 'frobnicate'" || { echo "FAIL unknown command message: $out"; fail=1; }
check "help unknown" 2 "$LLMQ_BIN" help frobnicate
# every listed command answers --help with exit 0 and a Usage line, and rejects an unknown flag with 2
for cmd in $("$LLMQ_BIN" help | awk '/^Commands:/{on=1;next} on && !NF {exit} on {print $1}' | grep -v '^help$'); do
  check "$cmd --help" 0 "$LLMQ_BIN" "$cmd" --help
  echo "$out" | grep -q "Usage:" || { echo "FAIL $cmd --help has no Usage line"; fail=1; }
  check "$cmd --no-such-flag" 2 "$LLMQ_BIN" "$cmd" --no-such-flag
  echo "$out" | grep -q -- "--no-such-flag" || { echo "FAIL $cmd does not name the bad flag: $out"; fail=1; }
done
[ $fail -eq 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail
