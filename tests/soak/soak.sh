#!/usr/bin/env bash
# Soak test of `llmq worker` under faults: a real redis-server with AOF, W workers under a
# supervisor that restarts them, jobs of mixed sizes pushed while faults are injected at random
# (seeded) times for a fixed duration: kill -9 of a worker, SIGTERM of a worker, kill -9 of
# redis-server and a restart from its AOF, a SQLite database locked for a few seconds. Then the
# faults stop, the workers drain, and soak_check.py checks that every job has exactly one row, none
# is lost, none is dead-lettered that did not fail on its own, nothing is left in a Redis list and
# every job hash is final and agrees with its row. Exit status 0 only when every check passes.
# Not part of ctest; tests/soak/README.md and docs/WORKER.md ("Soak test") describe it.
#
#   tests/soak/soak.sh --build BUILD_DIR --minutes N --workers W --jobs J [--seed S] [--out DIR]
set -u
set -m # every background job in its own process group: the cleanup kills each group whole

HERE=$(cd "$(dirname "$0")" && pwd)
usage() {
  cat <<EOF
Usage: $0 --build BUILD_DIR --minutes N --workers W --jobs J [options]

  --build DIR        the build directory holding the llmq binary
  --minutes N        how long faults are injected (decimals allowed: 0.5)
  --workers W        workers, each under a supervisor that restarts it (ids w1..wW)
  --jobs J           jobs to push, spread over the first 80 % of the fault period
  --seed S           random seed of the jobs, the fault schedule and the restart delays
                     (default: from the clock; printed for reproduction)
  --out DIR          keep everything here (logs, databases, AOF, jobs, verdict.json); default a
                     temp dir, removed when the run passes
  --faults LIST      comma-separated kinds to inject (default kill9,sigterm,redis,sqlite_lock)
  --interval A-B     seconds between faults, drawn uniformly (default 2-8)
  --db-layout L      mixed (default: w1 and w2 share one file, every other worker has its own;
                     with fewer than 3 workers each has its own), shared, separate
  --max-tokens N     each job's max_tokens is drawn from 4..N (default 128): longer jobs mean
                     more jobs held, and running, when a fault hits
  --drain-timeout S  how long the workers get to drain after the faults stop (default 300)
EOF
}

BUILD='' MINUTES='' WORKERS='' NJOBS='' SEED='' OUT='' FAULTS=kill9,sigterm,redis,sqlite_lock INTERVAL=2-8
LAYOUT=mixed DRAIN_S=300 MAX_TOKENS=128
while [ $# -gt 0 ]; do
  case $1 in
  --build) BUILD=$2; shift 2 ;;
  --minutes) MINUTES=$2; shift 2 ;;
  --workers) WORKERS=$2; shift 2 ;;
  --jobs) NJOBS=$2; shift 2 ;;
  --seed) SEED=$2; shift 2 ;;
  --out) OUT=$2; shift 2 ;;
  --faults) FAULTS=$2; shift 2 ;;
  --interval) INTERVAL=$2; shift 2 ;;
  --db-layout) LAYOUT=$2; shift 2 ;;
  --drain-timeout) DRAIN_S=$2; shift 2 ;;
  --max-tokens) MAX_TOKENS=$2; shift 2 ;;
  -h | --help) usage; exit 0 ;;
  *) echo "unknown option: $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$BUILD" ] && [ -n "$MINUTES" ] && [ -n "$WORKERS" ] && [ -n "$NJOBS" ] || { usage >&2; exit 2; }
LLMQ=$BUILD/llmq
[ -x "$LLMQ" ] || { echo "no llmq binary in $BUILD" >&2; exit 2; }
[[ $WORKERS =~ ^[1-9][0-9]*$ && $NJOBS =~ ^[1-9][0-9]*$ && $DRAIN_S =~ ^[0-9]+$ && $MAX_TOKENS =~ ^[1-9][0-9]*$ ]] ||
  { echo "--workers, --jobs, --drain-timeout, --max-tokens: positive integers" >&2; exit 2; }
[ "$MAX_TOKENS" -ge 4 ] || { echo "--max-tokens: at least 4" >&2; exit 2; }
[[ $INTERVAL =~ ^([0-9]+)-([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -le "${BASH_REMATCH[2]}" ] || { echo "--interval A-B: whole seconds, A <= B" >&2; exit 2; }
IV_MIN=${BASH_REMATCH[1]} IV_MAX=${BASH_REMATCH[2]}
FAULT_S=$(awk -v m="$MINUTES" 'BEGIN { if (m + 0 <= 0) exit 1; printf "%d", m * 60 + 0.5 }') || { echo "--minutes: a positive number" >&2; exit 2; }
case $LAYOUT in mixed | shared | separate) ;; *) echo "--db-layout: mixed, shared or separate" >&2; exit 2 ;; esac
IFS=, read -r -a FAULT_KINDS <<<"$FAULTS"
for k in "${FAULT_KINDS[@]}"; do
  case $k in kill9 | sigterm | redis | sqlite_lock) ;; *) echo "--faults: unknown kind '$k'" >&2; exit 2 ;; esac
done
for prog in redis-server redis-cli sqlite3 python3; do
  command -v "$prog" >/dev/null || { echo "$prog is not installed (contrib/install-deps.sh installs it)" >&2; exit 2; }
done
SEED=${SEED:-$(( $(date +%s) % 1000000 ))}
[[ $SEED =~ ^[0-9]+$ ]] || { echo "--seed: a non-negative integer" >&2; exit 2; }
KEEP=1
if [ -z "$OUT" ]; then OUT=$(mktemp -d -t llmq-soak-XXXXXX); KEEP=0; fi
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
[ -z "$(ls -A "$OUT")" ] || { echo "--out $OUT is not empty" >&2; exit 2; }
mkdir -p "$OUT"/{jobs,logs,run,redis,db}
RANDOM=$SEED
T0=$SECONDS
log() { echo "$(date -u +%H:%M:%S) [+$((SECONDS - T0))s] $*" | tee -a "$OUT/soak.log"; }
log "seed $SEED: $0 --build $BUILD --minutes $MINUTES --workers $WORKERS --jobs $NJOBS --seed $SEED --faults $FAULTS --interval $INTERVAL --db-layout $LAYOUT --max-tokens $MAX_TOKENS"

# ---- processes this script started, all killed by the cleanup
SUPS=()    # supervisor process groups
LOCKS=()   # SQLite lock holders (process groups); LOCK_DB[pid] the file each one holds
declare -A LOCK_DB=()
REDIS_PID=
RC=1
cleanup() {
  set +m # no job notices for what is killed below
  touch "$OUT/run/stop"
  local p f
  for p in "${SUPS[@]}" "${LOCKS[@]}"; do kill -9 -- "-$p" 2>/dev/null; done
  for f in "$OUT"/run/w*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  [ -n "$REDIS_PID" ] && kill -9 "$REDIS_PID" 2>/dev/null
  wait 2>/dev/null
  if [ "$RC" -eq 0 ] && [ "$KEEP" -eq 0 ]; then rm -rf "$OUT"; else echo "kept in $OUT"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# poll SECONDS COMMAND...: until COMMAND succeeds (0) or SECONDS have passed (1)
poll() {
  local end=$((SECONDS + $1)); shift
  until "$@"; do [ "$SECONDS" -ge "$end" ] && return 1; sleep 0.2; done
}
rcli() { redis-cli -p "$PORT" "$@"; }
# rand A B: an integer in [A, B] from the seeded generator
rand() { echo $(($1 + RANDOM % ($2 - $1 + 1))); }

# ---- redis-server with AOF. appendfsync always: a write is on disk before Redis answers it, so
# a kill -9 of redis-server forgets nothing a client was told had happened. With everysec the last
# second of acknowledged pushes, fetches and acks could vanish, and the checks would count jobs
# lost by Redis's own (documented) window as the worker's fault.
redis_up() {
  redis-server --port "$PORT" --bind 127.0.0.1 --dir "$OUT/redis" --logfile "$OUT/redis/redis.log" \
    --save "" --appendonly yes --appendfsync always >/dev/null 2>&1 &
  REDIS_PID=$!
  redis_answers() { rcli ping 2>/dev/null | grep -q PONG || ! kill -0 "$REDIS_PID" 2>/dev/null; }
  poll 60 redis_answers && kill -0 "$REDIS_PID" 2>/dev/null && rcli ping 2>/dev/null | grep -q PONG && return 0
  kill -9 "$REDIS_PID" 2>/dev/null; wait "$REDIS_PID" 2>/dev/null
  REDIS_PID=
  return 1
}
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
for _ in 1 2 3 4 5; do
  PORT=$(free_port)
  redis_up && break
done
[ -n "$REDIS_PID" ] || { echo "could not start redis-server"; tail "$OUT/redis/redis.log"; exit 1; }
log "redis-server on port $PORT (pid $REDIS_PID), appendonly yes, appendfsync always, dir $OUT/redis"

# ---- model, config, jobs
"$LLMQ" make-tiny-model "$OUT/model" >/dev/null || { echo "make-tiny-model failed"; exit 1; }
THRESHOLD=256 MAX_JOB_BYTES=1048576
CFG=$OUT/llmq.yaml
cat >"$CFG" <<EOF
# written by tests/soak/soak.sh: short intervals so that crashes are noticed fast
redis:
  url: "redis://127.0.0.1:$PORT"
  block_timeout_ms: 200
  reconnect_max_ms: 500
queues:
  long_threshold_tokens: $THRESHOLD
  max_job_bytes: $MAX_JOB_BYTES
  retry_backoff_base_ms: 100
  retry_backoff_max_ms: 1000
  result_ttl_s: 0  # keep every job hash for the final check
  events_maxlen: 10000000
  # an engine step well under heartbeat_ttl_s on one CPU thread (the default 16384-token prefill
  # chunks take seconds there, and a worker that stalls past its TTL is reaped while alive)
  short_max_num_batched_tokens: 2048
  long_max_num_batched_tokens: 1024
model:
  path: "$OUT/model"
engine:
  backend: cpu
  threads: 1
  cpu_kv_cache_bytes: 64MiB
  max_num_batched_tokens: 2048
sqlite:
  busy_timeout_ms: 200
worker:
  heartbeat_interval_s: 1
  heartbeat_ttl_s: 3
  reaper_interval_s: 1
  shutdown_timeout_s: 5
metrics:
  interval_s: 5
  port: 0
EOF
"$LLMQ" config -c "$CFG" >/dev/null 2>"$OUT/logs/config.log" || { echo "the config does not load:"; cat "$OUT/logs/config.log"; exit 1; }
SLOTS=$(( NJOBS / 50 + 1 )); [ "$SLOTS" -gt 40 ] && SLOTS=40
python3 "$HERE/soak_jobs.py" "$OUT/jobs" "$NJOBS" "$SLOTS" "$SEED" "$THRESHOLD" "$MAX_JOB_BYTES" "$MAX_TOKENS" | tee -a "$OUT/soak.log" ||
  { echo "soak_jobs.py failed"; exit 1; }

# ---- the databases: DBS[i] the file of worker i
DBS=()
for i in $(seq 1 "$WORKERS"); do
  case $LAYOUT in
  shared) DBS[i]=$OUT/db/shared.db ;;
  separate) DBS[i]=$OUT/db/w$i.db ;;
  mixed) if [ "$WORKERS" -ge 3 ] && [ "$i" -le 2 ]; then DBS[i]=$OUT/db/shared.db; else DBS[i]=$OUT/db/w$i.db; fi ;;
  esac
done
mapfile -t DB_FILES < <(printf '%s\n' "${DBS[@]}" | sort -u)
log "databases: $(for i in $(seq 1 "$WORKERS"); do printf 'w%d %s  ' "$i" "$(basename "${DBS[i]}")"; done)"

# ---- supervisors: run worker I, and again after it exits (after 0.2 to 4 s, seeded), until
# $OUT/run/stop exists. The running worker's pid is in run/wI.pid; each exit is a line of run/exits.
supervise() {
  local i=$1 db=$2 n=0 pid rc d
  RANDOM=$((SEED * 100 + i))
  while [ ! -e "$OUT/run/stop" ]; do
    n=$((n + 1))
    echo "---- run $n" >>"$OUT/logs/w$i.log"
    "$LLMQ" worker -c "$CFG" --id "w$i" --db "$db" >>"$OUT/logs/w$i.log" 2>&1 &
    pid=$!
    echo "$pid" >"$OUT/run/w$i.pid"
    wait "$pid"
    rc=$?
    rm -f "$OUT/run/w$i.pid"
    echo "w$i $n $rc $SECONDS" >>"$OUT/run/exits"
    [ -e "$OUT/run/stop" ] && break
    d=$((2 + RANDOM % 39)) # tenths of a second: another worker's reaper gets some of its jobs
    sleep "$((d / 10)).$((d % 10))"
  done
}
for i in $(seq 1 "$WORKERS"); do
  supervise "$i" "${DBS[i]}" 2>>"$OUT/logs/supervisors.log" & # bash's "Killed" lines
  SUPS+=("$!")
done
worker_pid() { cat "$OUT/run/w$1.pid" 2>/dev/null; }
all_up() { local i; for i in $(seq 1 "$WORKERS"); do [ -n "$(worker_pid "$i")" ] || return 1; done; }
poll 30 all_up || { echo "the workers did not start"; exit 1; }
log "$WORKERS workers under supervisors"

# ---- pushing a slot's files: llmq enqueue (batches) and redis-cli LPUSH (a plain client)
lpush_file() {
  python3 "$HERE/../tools/resp_lpush/resp_lpush.py" "$1" "llmq:queue:$2" | redis-cli -p "$PORT" --pipe >/dev/null
}
push_slot() {
  local k=$1 f ok=0
  f=$OUT/jobs/$k.enq-short.jsonl
  [ -f "$f" ] && { "$LLMQ" enqueue -c "$CFG" --batch "soak-$SEED-${k}s" "$f" >/dev/null 2>>"$OUT/logs/enqueue.log" || ok=1; }
  f=$OUT/jobs/$k.enq-long.jsonl
  [ -f "$f" ] && { "$LLMQ" enqueue -c "$CFG" --queue long --batch "soak-$SEED-${k}l" "$f" >/dev/null 2>>"$OUT/logs/enqueue.log" || ok=1; }
  f=$OUT/jobs/$k.push-short.bin
  [ -f "$f" ] && { lpush_file "$f" short || ok=1; }
  f=$OUT/jobs/$k.push-long.bin
  [ -f "$f" ] && { lpush_file "$f" long || ok=1; }
  return $ok
}

# ---- faults
declare -A NFAULT=([kill9]=0 [sigterm]=0 [redis]=0 [sqlite_lock]=0)
pick_worker() { rand 1 "$WORKERS"; }
HELD_KILLED=0
fault_kill9() {
  local i p h; i=$(pick_worker); p=$(worker_pid "$i")
  [ -n "$p" ] || { log "kill9: w$i is between runs; skipped"; return 1; }
  h=$(rcli LLEN "llmq:processing:w$i")
  kill -9 "$p" 2>/dev/null && log "kill9: w$i (pid $p, holding $h jobs)" && HELD_KILLED=$((HELD_KILLED + h))
}
fault_sigterm() {
  local i p; i=$(pick_worker); p=$(worker_pid "$i")
  [ -n "$p" ] || { log "sigterm: w$i is between runs; skipped"; return 1; }
  kill -TERM "$p" 2>/dev/null && log "sigterm: w$i (pid $p, holding $(rcli LLEN "llmq:processing:w$i") jobs)"
}
fault_redis() {
  local down; down=$(rand 0 30)
  kill -9 "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null; REDIS_PID=
  sleep "$((down / 10)).$((down % 10))"
  redis_up || { log "redis: could not restart redis-server on port $PORT"; tail "$OUT/redis/redis.log"; exit 1; }
  log "redis: kill -9, down $((down / 10)).$((down % 10)) s, restarted from the AOF (pid $REDIS_PID, $(rcli DBSIZE) keys)"
}
fault_sqlite_lock() {
  local db held p
  db=${DB_FILES[$(rand 0 $((${#DB_FILES[@]} - 1)))]}
  for p in "${LOCKS[@]}"; do [ "${LOCK_DB[$p]}" = "$db" ] && { log "sqlite_lock: $(basename "$db") is locked already; skipped"; return 1; }; done
  [ -f "$db" ] || { log "sqlite_lock: $(basename "$db") does not exist yet; skipped"; return 1; }
  held=$(rand 2 8)
  # BEGIN EXCLUSIVE in the sqlite3 shell, held open by the sleep feeding its input
  ( (echo ".timeout 10000"; echo "BEGIN EXCLUSIVE;"; sleep "$held"; echo "COMMIT;") |
    sqlite3 "$db" >>"$OUT/logs/sqlite_lock.log" 2>&1 ) &
  p=$!
  LOCKS+=("$p")
  LOCK_DB[$p]=$db
  log "sqlite_lock: $(basename "$db") for $held s"
}
reap_locks() {
  local p left=()
  for p in "${LOCKS[@]}"; do
    if kill -0 "$p" 2>/dev/null; then left+=("$p"); else wait "$p" 2>/dev/null; unset "LOCK_DB[$p]"; fi
  done
  LOCKS=("${left[@]}")
}

# held: jobs in every queue, every processing list and the retry set
held() {
  local k n=0
  for k in $(rcli --scan --pattern 'llmq:queue:*') $(rcli --scan --pattern 'llmq:processing:*'); do
    n=$((n + $(rcli LLEN "$k" 2>/dev/null || echo 0)))
  done
  echo $((n + $(rcli ZCARD llmq:retry)))
}

# ---- the fault period: push a slot when due, inject a fault when due
FAULT_START=$SECONDS
END=$((FAULT_START + FAULT_S))
PUSH_SPAN=$((FAULT_S * 8 / 10))
next_slot=0
next_fault=$((SECONDS + $(rand "$IV_MIN" "$IV_MAX")))
log "faults for $FAULT_S s ($FAULTS every $INTERVAL s); $SLOTS slots of jobs over the first $PUSH_SPAN s"
while [ "$SECONDS" -lt "$END" ]; do
  if [ "$next_slot" -lt "$SLOTS" ] && [ "$SECONDS" -ge $((FAULT_START + next_slot * PUSH_SPAN / SLOTS)) ]; then
    push_slot "$next_slot" || { log "pushing slot $next_slot failed (logs/enqueue.log)"; exit 1; }
    next_slot=$((next_slot + 1))
  fi
  if [ "$SECONDS" -ge "$next_fault" ]; then
    kind=${FAULT_KINDS[$(rand 0 $((${#FAULT_KINDS[@]} - 1)))]}
    "fault_$kind" && NFAULT[$kind]=$((NFAULT[$kind] + 1))
    next_fault=$((SECONDS + $(rand "$IV_MIN" "$IV_MAX")))
  fi
  reap_locks
  sleep 0.2
done
while [ "$next_slot" -lt "$SLOTS" ]; do
  push_slot "$next_slot" || { log "pushing slot $next_slot failed (logs/enqueue.log)"; exit 1; }
  next_slot=$((next_slot + 1))
done
log "faults stop: $(for k in "${!NFAULT[@]}"; do printf '%s %d, ' "$k" "${NFAULT[$k]}"; done)$HELD_KILLED jobs held by the workers killed; $(held) jobs in Redis lists now"

# ---- drain: the locks end by themselves; the workers keep running (restarted if they exit)
# until every queue, processing list and the retry set are empty, or DRAIN_S has passed
poll 15 bash -c 'for p in "$@"; do kill -0 "$p" 2>/dev/null && exit 1; done; exit 0' _ "${LOCKS[@]}"
reap_locks
DRAIN_START=$SECONDS
drained() { [ "$(held)" = 0 ]; }
if poll "$DRAIN_S" drained; then
  log "drained after $((SECONDS - DRAIN_START)) s"
else
  log "not drained after $DRAIN_S s: $(held) jobs still in Redis lists"
fi
DRAIN_END=$SECONDS

# ---- stop the workers (SIGTERM, then kill -9 after 30 s) and check
touch "$OUT/run/stop"
for i in $(seq 1 "$WORKERS"); do p=$(worker_pid "$i"); [ -n "$p" ] && kill -TERM "$p" 2>/dev/null; done
sups_gone() { local p; for p in "${SUPS[@]}"; do kill -0 "$p" 2>/dev/null && return 1; done; return 0; }
if ! poll 30 sups_gone; then
  log "workers still running 30 s after SIGTERM: kill -9"
  for i in $(seq 1 "$WORKERS"); do p=$(worker_pid "$i"); [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done
  poll 10 sups_gone
fi
RUNS=$(awk '{ n++; s[$3]++ } END { printf "%d (exit status:", n; for (k in s) printf " %s x%d", k, s[k]; printf ")" }' "$OUT/run/exits" 2>/dev/null)
log "workers stopped; runs $RUNS"
ELAPSED=$((SECONDS - T0))
python3 - "$OUT" <<PY
import json
json.dump({$(for k in "${!NFAULT[@]}"; do printf '"%s": %d, ' "$k" "${NFAULT[$k]}"; done | sed 's/, $//')},
          open("$OUT/faults.json", "w"))
json.dump({"seed": $SEED, "elapsed_s": $ELAPSED, "fault_s": $FAULT_S, "drain_s": $((DRAIN_END - DRAIN_START)),
           "worker_runs": "$RUNS",
           "held_killed": $HELD_KILLED}, open("$OUT/meta.json", "w"))
PY
python3 "$HERE/soak_check.py" "$OUT" "$PORT" "${DB_FILES[@]}" | tee -a "$OUT/soak.log"
RC=${PIPESTATUS[0]}
echo "reproduce: $0 --build $BUILD --minutes $MINUTES --workers $WORKERS --jobs $NJOBS --seed $SEED --faults $FAULTS --interval $INTERVAL --db-layout $LAYOUT --max-tokens $MAX_TOKENS"
exit "$RC"
