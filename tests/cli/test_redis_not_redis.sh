#!/usr/bin/env bash
# A Redis URL that reaches something other than Redis says so: a real HTTP server (python3's
# http.server) answers PING with HTTP, a listener that never answers stays silent, a closed port
# refuses; `llmq status` exits 69 (Redis unreachable, docs/CLI.md) with a line that tells these apart. No Redis is started.
. "$(dirname "$0")/cli_lib.sh"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
listening() { python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' "$1" 2>/dev/null; }
# wait_listening PORT: up to 10 s
wait_listening() { for _ in $(seq 100); do listening "$1" && return 0; sleep 0.1; done; return 1; }

http=$(free_port)
python3 -m http.server "$http" --bind 127.0.0.1 --directory "$tmp" >/dev/null 2>&1 &
pids+=($!)
silent=$(free_port)
python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
conns = []
while True:
    conns.append(s.accept()[0])  # never answers
' "$silent" &
pids+=($!)
closed=$(free_port)
wait_listening "$http" && wait_listening "$silent" || { bad "the listeners did not start"; finish; exit; }

check "an HTTP server: exit 69" 69 "$LLMQ_BIN" status --redis "redis://127.0.0.1:$http"
grep -q "redis 127.0.0.1:$http: not a Redis server: its answer to PING is not in the Redis protocol" "$tmp/err" &&
  ok "an HTTP server: not a Redis server" || bad "an HTTP server: $(cat "$tmp/err")"
export LLMQ_REDIS_CONNECT_TIMEOUT_MS=300
check "a silent listener: exit 69" 69 "$LLMQ_BIN" status --redis "redis://127.0.0.1:$silent"
grep -q "redis 127.0.0.1:$silent: PING: no answer within 300 ms: something listens there but does not answer" "$tmp/err" &&
  ok "a silent listener: said so" || bad "a silent listener: $(cat "$tmp/err")"
check "a closed port: exit 69" 69 "$LLMQ_BIN" status --redis "redis://127.0.0.1:$closed"
grep -q "redis 127.0.0.1:$closed: Connection refused" "$tmp/err" && ok "a closed port: refused" ||
  bad "a closed port: $(cat "$tmp/err")"
finish
