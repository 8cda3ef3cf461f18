#!/usr/bin/env bash
# contrib/systemd/llmq-worker@.service, the template unit (one instance per GPU), against what
# `cmake --install` lays down and against a real worker:
#  - `DESTDIR=... cmake --install BUILD --prefix /usr/local` installs the binary the unit runs,
#    the config file it names (/etc/llmq/llmq.yaml) and the docs its Documentation= points at
#    (each in the install manifest and on disk); a second install keeps an edited config;
#  - `systemd-analyze verify` finds nothing wrong with an instance of it (where systemd is
#    installed); TimeoutStopSec exceeds worker.shutdown_timeout_s;
#  - its ExecStart, run as systemd runs it for instance N (specifiers and $$ resolved), starts a
#    worker on device N with id <host>-gpuN whose /health answers on port 9464 + N, which stops
#    with exit 0 on SIGTERM; an instance that is not a GPU index exits 2 saying so.
. "$(dirname "$0")/worker_lib.sh"
SRC=${LLMQ_SOURCE_DIR:?run through ctest}
BUILD=${LLMQ_BUILD_DIR:?run through ctest}
UNIT=$SRC/contrib/systemd/llmq-worker@.service
unset LLMQ_METRICS_PORT

# ---- the install
ROOT=$T/root
if DESTDIR=$ROOT cmake --install "$BUILD" --prefix /usr/local >"$T/install.log" 2>&1; then
  ok "cmake --install with DESTDIR and --prefix /usr/local"
else
  bad "cmake --install: $(tail -3 "$T/install.log")"
fi
python3 - "$UNIT" "$BUILD/install_manifest.txt" "$ROOT" <<'PY' && ok "the unit's binary, config and Documentation= are installed" || bad "unit paths vs the install"
import re, sys, os
unit, manifest, root = sys.argv[1:4]
text = open(unit).read()
installed = {l.strip() for l in open(manifest) if l.strip()}
m = re.search(r"exec (/\S+) worker -c (/\S+) ", text)
paths = [m.group(1), m.group(2)]
docs = re.search(r"^Documentation=(.*)$", text, re.M).group(1).split()
assert docs and all(d.startswith("file://") for d in docs), docs
paths += [d[len("file://"):] for d in docs]
for p in paths:
    assert p in installed, f"{p}: not in the install manifest"
    assert os.path.isfile(root + p), f"{p}: not installed"
assert paths[1] == "/etc/llmq/llmq.yaml", paths[1]
PY
echo "# edited" >>"$ROOT/etc/llmq/llmq.yaml"
DESTDIR=$ROOT cmake --install "$BUILD" --prefix /usr/local >"$T/install2.log" 2>&1
eq "a second install keeps the edited config" "$(tail -1 "$ROOT/etc/llmq/llmq.yaml")" "# edited"

# ---- static checks of the unit
if command -v systemd-analyze >/dev/null; then
  mkdir -p "$T/units"
  cp "$UNIT" "$T/units/"
  out=$(cd "$T/units" && systemd-analyze verify llmq-worker@1.service 2>&1)
  rc=$?
  mine=$(printf '%s\n' "$out" | grep -F "llmq-worker@")
  [ $rc -eq 0 ] && [ -z "$mine" ] && ok "systemd-analyze verify llmq-worker@1.service is clean" || bad "systemd-analyze verify: rc $rc: $out"
else
  echo "skip systemd-analyze verify: systemd is not installed"
fi
shutdown_s=$("$LLMQ" config --get worker.shutdown_timeout_s)
stop_s=$(sed -n 's/^TimeoutStopSec=//p' "$UNIT")
[ -n "$stop_s" ] && [ "$stop_s" -gt "$shutdown_s" ] && grep -q '^KillSignal=SIGTERM' "$UNIT" &&
  grep -q '^Restart=on-failure' "$UNIT" && ok "unit: SIGTERM, TimeoutStopSec $stop_s > shutdown_timeout_s $shutdown_s" ||
  bad "unit: TimeoutStopSec '$stop_s' vs worker.shutdown_timeout_s $shutdown_s"

# ---- its ExecStart for instance N, as systemd would run it, with the test's binary and config
redis_start
make_model
write_config
# exec_start INSTANCE: the ExecStart command line, one argument per line
exec_start() {
  python3 - "$UNIT" "$1" "$(uname -n)" "$LLMQ" "$CFG" <<'PY'
import re, shlex, sys
unit, inst, host, llmq, cfg = sys.argv[1:6]
line = re.search(r"^ExecStart=(.*)$", open(unit).read(), re.M).group(1)
line = re.sub(r"%([iH%])", lambda m: {"i": inst, "H": host, "%": "%"}[m.group(1)], line).replace("$$", "$")
line = line.replace("exec /usr/local/bin/llmq ", f"exec {shlex.quote(llmq)} ").replace(" -c /etc/llmq/llmq.yaml ", f" -c {shlex.quote(cfg)} ")
for a in shlex.split(line):
    print(a)
PY
}
# a GPU index whose port 9464 + N is free here (engine.device is 0..255)
N=$(python3 -c '
import socket
for n in range(1, 256):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 9464 + n)); print(n); break
    except OSError: pass
    finally: s.close()')
mapfile -t cmd < <(exec_start "$N")
"${cmd[@]}" >"$T/unit.log" 2>&1 &
UPID=$!
WORKER_PIDS+=("$UPID")
ID="$(uname -n)-gpu$N"
health_ok() { python3 -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2).status != 200)" 2>/dev/null; }
wait_until "/health of llmq-worker@$N on port $((9464 + N))" health_ok $((9464 + N)) &&
  ok "llmq-worker@$N: /health answers on port 9464 + $N"
eq "its worker id" "$(rcli HGET "llmq:worker:$ID" host)" "$(uname -n)"
grep -q "worker $ID: " "$T/unit.log" && ok "the log names the worker $ID" || bad "no 'worker $ID' in the log"
kill -TERM "$UPID"
wait_until "llmq-worker@$N to stop" exited "$UPID"
wait "$UPID"
eq "SIGTERM stops it with exit 0" "$?" 0

mapfile -t cmd < <(exec_start gpu1)
"${cmd[@]}" >"$T/bad.out" 2>&1
eq "an instance that is not a GPU index exits 2" "$?" 2
grep -q "llmq-worker@gpu1: the instance must be a GPU index" "$T/bad.out" && ok "and says so" || bad "bad instance: $(cat "$T/bad.out")"
finish
