# A master, a replica and three sentinels (Debian's redis-sentinel) on free loopback ports, for the
# Sentinel tests (tests/cli/test_worker_sentinel.sh, tests/soak/sentinel_failover.sh). Sourced after
# worker_lib.sh, whose cleanup kills every process started here (they go into WORKER_PIDS).
#
#   . "$(dirname "$0")/sentinel_lib.sh"
#   sentinel_setup             # $PM (master port), $PR (replica port), $PID_master, $PID_replica, SENT=(ports)
#   sentinel_config [lines]    # $CFG (write_config) with the sentinels, master_name, and the lines
#   master_port                # the port the first sentinel names as the master's
#   rejoin_old                 # the old master back on $PM as a replica of the new one
command -v redis-sentinel >/dev/null ||
  { echo "SKIPPED: redis-sentinel is not installed (contrib/install-deps.sh installs it)"; exit 77; }

# server NAME PORT [options]: a redis-server in $T/NAME, its pid in PID_NAME
server() {
  local name=$1 port=$2
  shift 2
  mkdir -p "$T/$name"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$T/$name" --logfile "$T/$name/redis.log" --save "" \
    --appendonly no "$@" >/dev/null 2>&1 &
  WORKER_PIDS+=($!)
  printf -v "PID_$name" '%s' $!
  wait_until "redis $name on port $port" pong "$port"
}
pong() { redis-cli -p "$1" ping 2>/dev/null | grep -q PONG; }
synced() { redis-cli -p "$PR" info replication | grep -q "master_link_status:up"; }
# every sentinel knows the replica and the two other sentinels (needed to elect a leader)
knows_all() {
  local p
  for p in "${SENT[@]}"; do
    [ "$(redis-cli -p "$p" sentinel replicas mymaster 2>/dev/null | grep -c "^name$")" -ge 1 ] || return 1
    [ "$(redis-cli -p "$p" sentinel sentinels mymaster 2>/dev/null | grep -c "^name$")" -ge 2 ] || return 1
  done
}
master_port() { redis-cli -p "${SENT[0]}" sentinel get-master-addr-by-name mymaster 2>/dev/null | sed -n 2p; }

# Short detection and failover times: a failover takes about 2 s.
sentinel_setup() {
  PM=$(free_port)
  PR=$(free_port)
  server master "$PM"
  server replica "$PR" --replicaof 127.0.0.1 "$PM"
  wait_until "the replica to sync" synced
  SENT=()
  local i p
  for i in 1 2 3; do
    p=$(free_port)
    SENT+=("$p")
    mkdir -p "$T/s$i"
    printf '%s\n' "port $p" "bind 127.0.0.1" "dir $T/s$i" "logfile $T/s$i/sentinel.log" \
      "sentinel monitor mymaster 127.0.0.1 $PM 2" "sentinel down-after-milliseconds mymaster 400" \
      "sentinel failover-timeout mymaster 2000" >"$T/s$i/sentinel.conf"
    redis-sentinel "$T/s$i/sentinel.conf" >/dev/null 2>&1 &
    WORKER_PIDS+=($!)
  done
  wait_until "the sentinels to know each other and the replica" knows_all
}

# sentinel_config [redis lines...]: write_config with redis.url where nothing listens (only the
# sentinels lead to the master) and the sentinels, master_name and the lines in the redis section.
sentinel_config() {
  URL=redis://127.0.0.1:1
  write_config
  local s="  sentinels: [127.0.0.1:${SENT[0]}, 127.0.0.1:${SENT[1]}, 127.0.0.1:${SENT[2]}]"
  python3 - "$CFG" "$s" "  master_name: mymaster" "$@" <<'PY'
import sys
p, extra = sys.argv[1], sys.argv[2:]
lines = open(p).read().splitlines()
i = lines.index("redis:") + 1
open(p, "w").write("\n".join(lines[:i] + extra + lines[i:]) + "\n")
PY
}

# rejoin_old: the killed master starts again on its port as a replica of the promoted one, with
# replica-priority 0 while it copies the data: Sentinel does not skip a replica in its first sync
# when it picks one to promote, and a second failover onto it would start from an empty copy.
rejoin_old() {
  server old "$PM" --replicaof 127.0.0.1 "$PR" --replica-priority 0
}
