#!/usr/bin/env bash
# Hostile clients of the metrics server: 40 slowloris connections (a partial request line, one more
# byte now and then) leave /health answering within a second, and a flood of idle connections past
# the connection limit logs at most one line per 10 s (with a count of those not shown) instead of
# one per refused connection.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config
worker_start m
wait_until "the metrics line" log_has m "metrics: http://"
MPORT=$(sed -n 's|.*metrics: http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$T/m.log" | head -1)
python3 - "$MPORT" <<'PY' && ok "/health answers within 1 s beside 40 slowloris connections" || bad "/health under slowloris"
import socket, sys, time, urllib.request
port = int(sys.argv[1])
slow = []
for i in range(40):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /he")
    slow.append(s)
worst = 0.0
for k in range(6):  # over about 3 s, while the slow ones keep dribbling
    for s in slow:
        try:
            s.sendall(b"a")
        except OSError:
            pass
    t = time.monotonic()
    try:
        body = urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=1).read()
    except Exception as e:
        print("health failed after %.2f s: %s" % (time.monotonic() - t, e))
        sys.exit(1)
    worst = max(worst, time.monotonic() - t)
    time.sleep(0.5)
print("slowest /health: %.3f s" % worst)
sys.exit(0 if worst < 1 else 1)
PY
# a flood past the limit: 400 connections opened at once and left idle
python3 - "$MPORT" <<'PY'
import socket, sys
port = int(sys.argv[1])
conns = []
for i in range(400):
    try:
        conns.append(socket.create_connection(("127.0.0.1", port), timeout=2))
    except OSError:
        pass
# the server closes at once the ones it refused (over 100 of them): wait for that, then let go
import select, time
closed, end = set(), time.monotonic() + 10
while len(closed) < 100 and time.monotonic() < end:
    r, _, _ = select.select([c for c in conns if c not in closed][:1000], [], [], 0.2)
    for c in r:
        try:
            if not c.recv(1):
                closed.add(c)
        except OSError:
            closed.add(c)
print("connections closed by the server:", len(closed))
for c in conns:
    c.close()
PY
health_ok() { python3 -c "import sys, urllib.request; urllib.request.urlopen('http://127.0.0.1:$MPORT/health', timeout=1)" 2>/dev/null; }
wait_until "/health to answer again after the flood" health_ok
refused=$(log_count m "metrics http:")
[ "$refused" -ge 1 ] && [ "$refused" -le 2 ] && ok "refused connections logged $refused time(s)" || bad "$refused metrics http lines"
kill -TERM "$W_m"
worker_wait m
eq "the worker stops cleanly" "$WRC" 0
log_has m "metrics http: [0-9]* more lines .* not shown" && ok "the lines not shown are counted" ||
  bad "no count of lines not shown: $(grep "metrics http" "$T/m.log" | head -3)"
finish
