# Shared helpers of the worker integration tests (tests/cli/test_worker_*.sh), sourced by them:
# a real redis-server on a free loopback port in a temp dir, a tiny model, a fast config, workers
# run in the background with their logs kept, and SQLite checks through the sqlite3 shell.
#
#   . "$(dirname "$0")/worker_lib.sh"
#   redis_start                     # $PORT, $URL; redis_start --appendonly yes for persistence
#   make_model; write_config        # $M (model dir), $CFG (llmq.yaml), $DB (results database)
#   worker_start w1 --drain         # pid in $W_w1 (log $T/w1.log)
#   wait_rows 100                   # until 100 rows exist (fails the test after $WAIT_S s)
#   wait_until "what" COMMAND...    # until COMMAND succeeds (the same limit)
#   worker_wait w1                  # until worker w1 exits; its status in $WRC
#   interrupt "$pid"                # Ctrl-C to a background command once it listens for it
#   finish                          # prints the tally, exits 1 if anything failed
#
# A test waits for the event it needs (a row, a log line, a Redis key, a process exit), never for a
# fixed time: on a busy machine everything takes longer, and a window that fits an idle one fails
# there although nothing is wrong. Each wait is bounded by WAIT_S seconds of wall-clock time (default
# 120, far beyond what any of them needs), so a real hang still fails, naming what it waited for.
set -u
fail=0
pass=0
T=$(mktemp -d -t llmq-wtest-XXXXXX) # under $TMPDIR (/tmp where unset), as scratch_dir_make
REDIS_PID=
WORKER_PIDS=()
LLMQ=${LLMQ_BIN:?run through ctest (LLMQ_BIN is not set)}
WAIT_S=${WAIT_S:-120}

cleanup() {
  for p in "${WORKER_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  [ -n "$REDIS_PID" ] && kill -9 "$REDIS_PID" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT

ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
# check NAME CONDITION-COMMAND...: ok when it succeeds
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }
# eq NAME GOT WANT
eq() { if [ "$2" == "$3" ]; then ok "$1"; else bad "$1: got '$2', want '$3'"; fi; }

finish() {
  echo "$pass passed, $fail failed"
  if [ "$fail" -ne 0 ]; then
    for f in "$T"/*.log; do [ -f "$f" ] && { echo "---- $f (last 30 lines)"; tail -30 "$f"; }; done
    exit 1
  fi
  exit 0
}

# poll SECONDS COMMAND...: runs COMMAND every 0.1 s until it succeeds (returns 0) or SECONDS of
# wall-clock time have passed (returns 1).
poll() {
  local end=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -ge "$end" ] && return 1
    sleep 0.1
  done
}
# wait_until WHAT COMMAND...: poll with the limit of $WAIT_S seconds; when it runs out the test fails
# with a line naming WHAT it waited for, and wait_until returns 1.
wait_until() {
  local what=$1
  shift
  poll "$WAIT_S" "$@" && return 0
  bad "gave up after $WAIT_S s waiting for $what"
  return 1
}
exited() { ! kill -0 "$1" 2>/dev/null; }
# log_count NAME PATTERN: how many lines of worker NAME's log match the grep pattern
log_count() { local n; n=$(grep -c -- "$2" "$T/$1.log" 2>/dev/null); echo "${n:-0}"; }
# log_has NAME PATTERN: a line of worker NAME's log matches the grep pattern
log_has() { grep -q -- "$2" "$T/$1.log" 2>/dev/null; }

for prog in redis-server redis-cli sqlite3 python3; do
  command -v "$prog" >/dev/null || { echo "SKIPPED: $prog is not installed (contrib/install-deps.sh installs it)"; exit 77; }
done

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# redis_start [redis options...]: a fresh server; the options are kept for redis_again.
REDIS_OPTS=()
redis_start() {
  REDIS_OPTS=("$@")
  mkdir -p "$T/redis"
  local tries
  for tries in 1 2 3 4 5; do
    PORT=$(free_port)
    URL=redis://127.0.0.1:$PORT
    redis_again && return 0
  done
  echo "could not start redis-server"; cat "$T/redis/redis.log"; exit 1
}
# redis_again: starts the server again on the same port and dir (after redis_stop / redis_kill).
redis_again() {
  redis-server --port "$PORT" --bind 127.0.0.1 --dir "$T/redis" --logfile "$T/redis/redis.log" --save "" \
    --appendonly no "${REDIS_OPTS[@]}" >/dev/null 2>&1 &
  REDIS_PID=$!
  poll "$WAIT_S" redis_answers && kill -0 "$REDIS_PID" 2>/dev/null && return 0
  kill -9 "$REDIS_PID" 2>/dev/null
  REDIS_PID=
  return 1
}
# redis_answers: the server answers PING, or has exited (a port taken by another process: the caller
# then tries another)
redis_answers() {
  redis-cli -p "$PORT" ping 2>/dev/null | grep -q "PONG\|NOAUTH" || ! kill -0 "$REDIS_PID" 2>/dev/null
}
redis_stop() { [ -n "$REDIS_PID" ] && { kill -TERM "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null; REDIS_PID=; }; }
rcli() { redis-cli -p "$PORT" "$@"; }

# make_model [make-tiny-model options]: $M, a tiny random Qwen3 with the built-in byte tokenizer.
make_model() {
  M=$T/model
  "$LLMQ" make-tiny-model "$M" "$@" >/dev/null || { echo "make-tiny-model failed"; exit 1; }
}

# write_config [extra YAML lines...]: $CFG with short intervals so failures are noticed fast.
write_config() {
  DB=$T/results.db
  CFG=$T/llmq.yaml
  cat >"$CFG" <<EOF
redis:
  url: "$URL"
  block_timeout_ms: 200
  reconnect_max_ms: 500
queues:
  retry_backoff_base_ms: 100
  retry_backoff_max_ms: 1000
model:
  path: "$M"
engine:
  backend: cpu
  threads: 1
  cpu_kv_cache_bytes: 64MiB
sqlite:
  path: "$DB"
  busy_timeout_ms: 200
worker:
  heartbeat_interval_s: 1
  heartbeat_ttl_s: 2
  reaper_interval_s: 1
  shutdown_timeout_s: 10
metrics:
  interval_s: 1
  port: 0  # any free port: tests run side by side
EOF
  local line
  for line in "$@"; do echo "$line" >>"$CFG"; done
}

# worker_start NAME [options]: `llmq worker -c $CFG --id NAME options` in the background; its pid
# in W_<NAME> (dashes become underscores), its log in $T/NAME.log.
worker_start() {
  local name=$1; shift
  "$LLMQ" worker -c "$CFG" --id "$name" "$@" >>"$T/$name.log" 2>&1 &
  local pid=$!
  WORKER_PIDS+=("$pid")
  printf -v "W_${name//-/_}" '%s' "$pid"
}
# worker_wait NAME: until worker NAME (started by worker_start) exits; its status in $WRC (124, and
# the test fails, when it has not exited after $WAIT_S s).
worker_wait() {
  local var="W_${1//-/_}"
  if wait_until "worker $1 to exit" exited "${!var}"; then
    wait "${!var}"
    WRC=$?
    return 0
  fi
  WRC=124
  return 1
}
sql() { sqlite3 -batch -noheader "$DB" "$@" 2>/dev/null; }
rows() { local n; n=$(sql "SELECT count(*) FROM jobs" 2>/dev/null); echo "${n:-0}"; }
rows_at_least() { [ -f "$DB" ] && [ "$(rows)" -ge "$1" ]; }
# wait_rows N: until the jobs table has at least N rows.
wait_rows() { wait_until "$1 rows in the jobs table" rows_at_least "$1"; }
# interrupt PID: SIGINT to a command started in the background, once it catches SIGINT (bit 1 of
# SigCgt in /proc). A background job of a non-interactive shell starts with SIGINT ignored, so a
# SIGINT sent before the command has installed its handler would be lost.
catches_sigint() {
  local cgt
  cgt=$(awk '/^SigCgt:/ {print $2}' "/proc/$1/status" 2>/dev/null)
  [ -n "$cgt" ] && (( 0x$cgt & 2 ))
}
interrupt() {
  wait_until "process $1 to catch SIGINT" catches_sigint "$1"
  kill -INT "$1"
}

# jobs_file FILE N PREFIX [json fields]: N llmq jobs {"id": "PREFIX<i>", "prompt": "...", fields}.
jobs_file() {
  python3 - "$@" <<'PY'
import json, sys
path, n, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
with open(path, "w") as f:
    for i in range(n):
        j = {"id": f"{prefix}{i}", "prompt": f"Summarize document {i}: the quick brown fox."}
        j.update(extra)
        f.write(json.dumps(j) + "\n")
PY
}
# push_file FILE [QUEUE]: LPUSH every line with redis-cli (a client that is not llmq), in order.
push_file() {
  python3 "$(dirname "${BASH_SOURCE[0]}")/../tools/resp_lpush/resp_lpush.py" "$1" "llmq:queue:${2:-short}" |
    redis-cli -p "$PORT" --pipe >/dev/null
}
