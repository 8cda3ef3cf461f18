# Shared helpers of the worker integration tests (tests/cli/test_worker_*.sh), sourced by them:
# a real redis-server on a free loopback port in a temp dir, a tiny model, a fast config, workers
# run in the background with their logs kept, and SQLite checks through the sqlite3 shell.
#
#   . "$(dirname "$0")/worker_lib.sh"
#   redis_start                     # $PORT, $URL; redis_start --appendonly yes for persistence
#   make_model; write_config        # $M (model dir), $CFG (llmq.yaml), $DB (results database)
#   worker_start w1 --drain         # pid in $W_w1 (log $T/w1.log)
#   wait_rows 100 30 || bad "..."   # until 100 rows exist, at most 30 s
#   interrupt "$pid"                # Ctrl-C to a background command once it listens for it
#   finish                          # prints the tally, exits 1 if anything failed
set -u
fail=0
pass=0
T=$(mktemp -d /tmp/llmq-wtest-XXXXXX)
REDIS_PID=
WORKER_PIDS=()
LLMQ=${LLMQ_BIN:?run through ctest (LLMQ_BIN is not set)}

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
  local i
  for i in $(seq 1 200); do
    redis-cli -p "$PORT" ping 2>/dev/null | grep -q "PONG\|NOAUTH" && return 0
    kill -0 "$REDIS_PID" 2>/dev/null || break
    sleep 0.05
  done
  kill -9 "$REDIS_PID" 2>/dev/null
  REDIS_PID=
  return 1
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
# worker_wait PID SECONDS: waits for the worker to exit; its status in $WRC (124 on timeout).
worker_wait() {
  local pid=$1 secs=$2 i
  for i in $(seq 1 $((secs * 20))); do
    if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; WRC=$?; return 0; fi
    sleep 0.05
  done
  WRC=124
  return 1
}

sql() { sqlite3 -batch -noheader "$DB" "$@" 2>/dev/null; }
rows() { local n; n=$(sql "SELECT count(*) FROM jobs" 2>/dev/null); echo "${n:-0}"; }
# wait_rows N SECONDS: until the jobs table has at least N rows.
wait_rows() {
  local want=$1 secs=$2 i
  for i in $(seq 1 $((secs * 10))); do
    [ -f "$DB" ] && [ "$(rows)" -ge "$want" ] && return 0
    sleep 0.1
  done
  return 1
}
# interrupt PID: SIGINT to a command started in the background, once it catches SIGINT (bit 1 of
# SigCgt in /proc; up to 10 s). A background job of a non-interactive shell starts with SIGINT
# ignored, so a SIGINT sent before the command has installed its handler would be lost.
interrupt() {
  local cgt
  for _ in $(seq 200); do
    cgt=$(awk '/^SigCgt:/ {print $2}' "/proc/$1/status" 2>/dev/null)
    [ -n "$cgt" ] && (( 0x$cgt & 2 )) && break
    sleep 0.05
  done
  kill -INT "$1"
}

# wait_for SECONDS COMMAND...: until the command succeeds.
wait_for() {
  local secs=$1 i; shift
  for i in $(seq 1 $((secs * 20))); do "$@" && return 0; sleep 0.05; done
  return 1
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
  local q=${2:-short}
  python3 - "$1" "llmq:queue:$q" <<'PY' | redis-cli -p "$PORT" --pipe >/dev/null
import sys
def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)
with open(sys.argv[1], "rb") as f:
    for line in f:
        line = line.rstrip(b"\n")
        if line:
            sys.stdout.buffer.write(resp("LPUSH", sys.argv[2], line))
PY
}
