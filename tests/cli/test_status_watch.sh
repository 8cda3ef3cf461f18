#!/usr/bin/env bash
# `llmq status --watch` against a real redis-server and a worker running a long job (tiny model,
# CPU backend): with stdout a file it prints plain frames, one per interval, until SIGINT, and
# exits 0; under `script` (a pseudo-terminal) it redraws in place with ANSI codes and gives the
# cursor back on Ctrl-C. The worker's heartbeat carries the engine's KV usage and queue lengths,
# which the frames and --json show; the running job has a progress bar.
. "$(dirname "$0")/worker_lib.sh"

out=$("$LLMQ" status --help); eq "status --help" "$?" 0
echo "$out" | grep -q -- "--interval" || bad "status --help does not mention --interval"
out=$("$LLMQ" status --interval 0 2>&1); eq "bad --interval" "$?" 2
out=$("$LLMQ" status --interval x 2>&1); eq "bad --interval text" "$?" 2

redis_start
make_model --max-position 32768
write_config
# a job that runs long on a worker that takes only from the short queue, and three that wait on the long one
cat >"$T/jobs.jsonl" <<'EOF2'
{"id": "long-1", "prompt": "runs a while", "max_tokens": 30000, "ignore_eos": true, "temperature": 0}
EOF2
"$LLMQ" enqueue -c "$CFG" "$T/jobs.jsonl" 2>/dev/null
worker_start w1 --queues short
running() { [ "$(rcli HGET llmq:job:long-1 completion_tokens)" -ge 20 ] 2>/dev/null; }
wait_until "the long job to run" running && ok "the long job runs"
for i in 1 2 3; do echo "{\"id\": \"q-$i\", \"prompt\": \"waits\", \"max_tokens\": 2}"; done | "$LLMQ" enqueue -c "$CFG" --queue long - 2>/dev/null
# a heartbeat sent while the job runs (one a second)
hb() { [ "$(rcli HGET llmq:worker:w1 running)" = 1 ] && [ -n "$(rcli HGET llmq:worker:w1 kv_usage)" ]; }
wait_until "a heartbeat with kv_usage" hb && ok "the heartbeat has kv_usage" ||
  echo "  heartbeat: $(rcli HGETALL llmq:worker:w1 | tr '\n' ' ')"
kv=$(rcli HGET llmq:worker:w1 kv_usage)
python3 -c "import sys; v = float('$kv'); sys.exit(0 if 0 < v <= 1 else 1)" && ok "kv_usage in (0, 1] while a job runs ($kv)" || bad "kv_usage $kv"
eq "heartbeat: running" "$(rcli HGET llmq:worker:w1 running)" 1

# frames OUT N PATTERN: OUT holds at least N lines that match the grep pattern
frames() { [ "$(grep -c -- "$3" "$1" 2>/dev/null)" -ge "$2" ]; }

# ---- stdout is a file: plain frames, SIGINT ends it with 0 (sent once two frames are out)
"$LLMQ" status -c "$CFG" --watch --interval 1 >"$T/plain.out" 2>"$T/plain.err" &
pid=$!
wait_until "two plain frames" frames "$T/plain.out" 2 "^queues:  short 0  long 3"
interrupt "$pid"; wait "$pid"
eq "--watch (file) exits 0 on SIGINT" "$?" 0
n=$(grep -c "^queues:  short 0  long 3" "$T/plain.out")
[ "$n" -ge 2 ] && ok "a frame per interval ($n)" || bad "$n frames: $(cat "$T/plain.out" "$T/plain.err")"
grep -q $'\033' "$T/plain.out" && bad "ANSI codes in output to a file" || ok "no ANSI codes in output to a file"
grep -q "^workers: 1 live, 0 lapsed" "$T/plain.out" && ok "workers line" || bad "no workers line"
grep -Eq "^  w1 +live .* 1 +0 +\[[#-]{10}\] +[0-9]+%" "$T/plain.out" && ok "worker row with running, waiting, KV bar" || bad "worker row: $(grep '^  w1' "$T/plain.out" | head -1)"
grep -Eq "^  long-1 +w1 +short +\[#*-+\] +[0-9]+% +[0-9]+ +[0-9.]+ " "$T/plain.out" && ok "job row with a progress bar and tok/s" || bad "job row: $(grep '^  long-1' "$T/plain.out" | head -1)"
# the job's numbers are Redis's: progress = completion_tokens / max_tokens
python3 - "$T/plain.out" <<'PY' && ok "progress bar agrees with the token count" || bad "progress bar off"
import re, sys
for l in open(sys.argv[1]):
    m = re.match(r"  long-1 +w1 +short +\[(#*)(-*)\] +(\d+)% +(\d+) ", l)
    if m:
        full, pct, toks = len(m.group(1)), int(m.group(3)), int(m.group(4))
        want = 100 * toks / 30000
        if abs(pct - want) > 1 or abs(full - round(20 * want / 100)) > 1:
            print(l, want); sys.exit(1)
PY
"$LLMQ" status -c "$CFG" -w --interval 0.5 --json >"$T/json.out" &
pid=$!
wait_until "two JSON frames" frames "$T/json.out" 2 "^{"
interrupt "$pid"; wait "$pid"
eq "--watch --json exits 0" "$?" 0
python3 - "$T/json.out" <<'PY' && ok "--json frames carry kv_usage, running, waiting, progress" || bad "--json frames"
import json, sys
fr = [json.loads(l) for l in open(sys.argv[1])]
assert len(fr) >= 2, len(fr)
w = fr[-1]["workers"][0]
assert 0 < w["kv_usage"] <= 1 and w["running"] == 1 and w["waiting"] == 0, w
j = fr[-1]["jobs"][0]
assert j["id"] == "long-1" and 0 < j["progress"] < 1 and j["prompt_tokens"] > 0, j
assert fr[-1]["queues"] == {"short": 0, "long": 3}, fr[-1]["queues"]
PY

# ---- a terminal (script's pseudo-terminal): in place, cursor hidden and given back
if command -v script >/dev/null; then
  script -qec "exec '$LLMQ' status -c '$CFG' --watch --interval 0.5" /dev/null >"$T/tty.out" 2>&1 &
  pid=$!
  wait_until "two frames on the terminal" frames "$T/tty.out" 2 "queues:  short 0  long 3"
  read -r child _ <"/proc/$pid/task/$pid/children" # llmq itself: script's shell execs it
  interrupt "$child"; wait "$pid"
  eq "--watch on a terminal exits 0 on Ctrl-C" "$?" 0
  grep -q $'\033\\[?25l' "$T/tty.out" && ok "cursor hidden" || bad "cursor not hidden"
  grep -q $'\033\\[?25h' "$T/tty.out" && ok "cursor given back" || bad "cursor not restored"
  n=$(grep -o $'\033\\[H' "$T/tty.out" | wc -l)
  [ "$n" -ge 2 ] && ok "redrawn in place ($n frames from home)" || bad "$n cursor-home codes"
  grep -q $'\033\\[J' "$T/tty.out" && ok "cleared to the end" || bad "no clear-to-end"
  grep -q "Ctrl-C to stop" "$T/tty.out" && ok "says how to stop" || bad "no hint"
  grep -q "queues:  short 0  long 3" "$T/tty.out" && ok "queue line on the terminal" || bad "no queue line on the terminal"
else
  echo "script(1) not installed: the terminal case is not tested"
fi

"$LLMQ" cancel -c "$CFG" long-1 >/dev/null
kill -TERM "$W_w1"; worker_wait w1
finish
