#!/usr/bin/env bash
# Collector throughput: rows per second `llmq collect --redis` writes into one SQLite file.
# A redis-server on a free loopback port gets N result rows shaped like the chat workload's
# (docs/BENCH.md: a 512-token prompt, 128 generated tokens: ~2.6 KB of request, ~0.6 KB of
# output, the result line) from 20 worker ids, then one collector drains the stream
# (--once); the time from its start to its exit over N is the rate. Prints one JSON line.
#
#   tests/soak/collect_speed.sh --build BUILD_DIR [--rows N] [--batch-size B]
set -u
build= rows=50000 batch=1000
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    *) echo "usage: $0 --build BUILD_DIR [--rows N] [--batch-size B]" >&2; exit 2 ;;
  esac
done
[ -x "$build/llmq" ] || { echo "$0: no llmq in '$build' (--build BUILD_DIR)" >&2; exit 2; }
LLMQ=$(cd "$build" && pwd)/llmq
T=$(mktemp -d -t llmq-cspeed-XXXXXX)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$T" >"$T/redis.log" 2>&1 &
rpid=$!
trap 'kill "$rpid" 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT
until redis-cli -p "$port" PING >/dev/null 2>&1; do sleep 0.05; done

# N XADD commands in RESP, piped in (what the workers' ack scripts would have added)
python3 - "$rows" >"$T/rows.resp" <<'PY'
import json, random, sys
n = int(sys.argv[1])
rnd = random.Random(1)
words = "the of and to in a is that for it as with was on be by this are from at or an which".split()
def text(k):
    return " ".join(rnd.choice(words) for _ in range(k))
def resp(*a):
    out = [f"*{len(a)}\r\n"]
    for x in a:
        b = x.encode()
        out.append(f"${len(b)}\r\n")
        out.append(x + "\r\n")
    return "".join(out)
t0 = 1796600000.0
w = sys.stdout
for i in range(n):
    wid = f"gpu{i % 20:02d}-4242"
    prompt = text(420)
    out = text(100)
    jid = f"chat-{i:07d}"
    started = t0 + i * 0.02
    request = json.dumps({"id": jid, "messages": [{"role": "user", "content": prompt}], "max_tokens": 128})
    result = json.dumps({"id": jid, "status": "completed", "text": out, "finish_reason": "length",
                         "usage": {"prompt_tokens": 512, "completion_tokens": 128}})
    row = {"id": jid, "queue": "short", "status": "completed", "model": "qwen3-14b",
           "params": json.dumps({"max_tokens": 128, "temperature": 0.7}), "output": out,
           "finish_reason": "length", "prompt_tokens": 512, "completion_tokens": 128, "attempts": 1,
           "worker_id": wid, "created_at": started - 0.5, "started_at": started,
           "first_token_at": started + 0.08, "finished_at": started + 2.9, "ttft_ms": 80.0,
           "latency_ms": 2900.0, "queue_ms": 500.0, "result": result, "request_form": "llmq",
           "request": request, "reasoning_tokens": -1}
    w.write(resp("XADD", "llmq:results", "*", "id", jid, "worker", wid, "row", json.dumps(row, separators=(",", ":"))))
PY
redis-cli -p "$port" --pipe <"$T/rows.resp" >/dev/null
bytes=$(redis-cli -p "$port" MEMORY USAGE llmq:results SAMPLES 0)
t0=$(date +%s.%N)
out=$("$LLMQ" collect --redis "redis://127.0.0.1:$port" --db "$T/central.db" --group bench --batch-size "$batch" --once --json)
rc=$?
t1=$(date +%s.%N)
n=$(sqlite3 "$T/central.db" "SELECT count(*) FROM jobs")
python3 - "$rows" "$n" "$t0" "$t1" "$batch" "$bytes" "$rc" "$(redis-cli -p "$port" XLEN llmq:results)" <<'PY'
import json, sys
rows, n, t0, t1, batch, mem, rc, left = sys.argv[1:9]
secs = float(t1) - float(t0)
print(json.dumps({"rows": int(rows), "written": int(n), "seconds": round(secs, 2),
                  "rows_per_s": round(int(n) / secs), "batch": int(batch),
                  "stream_bytes_per_row": round(int(mem) / int(rows)), "exit": int(rc),
                  "stream_left": int(left)}))
PY
[ "$rc" = 0 ] && [ "$n" = "$rows" ]
