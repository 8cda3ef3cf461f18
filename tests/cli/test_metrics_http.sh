#!/usr/bin/env bash
# GET /metrics and GET /health of `llmq worker` (worker/metrics/http.c) on a real redis-server, a tiny model
# and a SQLite file: the text follows the exposition format's rules; while jobs run it shows them
# running; afterwards its counters and histograms equal what SQLite's jobs rows say (counts,
# token sums, every histogram bucket recomputed from the rows' times), its queue depths equal
# Redis's LLEN, and the worker_metrics rows written every interval add up to the same totals.
# /health answers 200 "ok", 503 naming Redis while Redis is down, and 200 again once it is back.
# A second worker on the same port logs why it has no metrics and still works.
. "$(dirname "$0")/worker_lib.sh"

redis_start
make_model
write_config
export LLMQ_METRICS_PORT=0 # any free port: tests run side by side

# get PATH [METHOD]: "STATUS BODY..." from the worker's metrics server
get() {
  python3 - "http://127.0.0.1:$MP$1" "${2:-GET}" <<'PY'
import sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1], method=sys.argv[2])
try:
    with urllib.request.urlopen(req, timeout=5) as r:
        body, code, ctype = r.read().decode(), r.status, r.headers.get("Content-Type", "")
except urllib.error.HTTPError as e:
    body, code, ctype = e.read().decode(), e.code, e.headers.get("Content-Type", "")
except Exception as e:
    body, code, ctype = str(e), 0, ""
sys.stdout.write(f"{code} {ctype}\n{body}")
PY
}
# scrape FILE: /metrics into FILE (body only); fails unless 200 with the format's content type
scrape() {
  local out
  out=$(get /metrics) || return 1
  [ "$(echo "$out" | head -1)" = "200 text/plain; version=0.0.4; charset=utf-8" ] || { echo "scrape: $(echo "$out" | head -3)"; return 1; }
  echo "$out" | tail -n +2 >"$1"
}
# val FILE 'name{labels}': the sample's value ("" when absent)
val() { awk -v k="$2" '$1 == k { print $2; exit }' "$1"; }

# the format's rules, checked by a separate reader
cat >"$T/check.py" <<'PY'
import math, re, sys
text = open(sys.argv[1]).read()
assert text.endswith("\n"), "no final newline"
name_re = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
label_re = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
sample_re = re.compile(rf"^({name_re})(?:\{{({label_re}(?:,{label_re})*)\}})? (\S+)$")
types, helps, done, cur = {}, set(), set(), None
hist = {}
for line in text.splitlines():
    m = re.match(rf"^# (HELP|TYPE) ({name_re}) (.*)$", line)
    if m:
        kind, name, rest = m.groups()
        if kind == "HELP":
            assert name not in helps and name not in types, f"HELP twice or after TYPE: {line}"
            assert not re.search(r"\\[^\\n]", rest), f"bad escape: {line}"
            helps.add(name)
        else:
            assert name not in types, f"TYPE twice: {line}"
            assert rest in ("counter", "gauge", "histogram", "summary", "untyped"), line
            types[name] = rest
        if cur != name:
            assert name not in done, f"family {name} split"
            if cur: done.add(cur)
            cur = name
        continue
    assert not line.startswith("#"), line
    m = sample_re.match(line)
    assert m, f"not a sample line: {line}"
    name, value = m.group(1), m.group(m.lastindex)
    v = float(value.replace("Inf", "inf"))
    labels = dict(re.findall(label_re, m.group(2) or ""))
    fam = name
    if types.get(cur) == "histogram":
        for suf in ("_bucket", "_sum", "_count"):
            if name == cur + suf: fam = cur
    assert fam == cur, f"sample {name} outside its family {cur}"
    if types[cur] == "counter":
        assert name.endswith("_total") and v >= 0, line
    if types[cur] == "histogram":
        key = (cur, tuple(sorted((k, x) for k, x in labels.items() if k != "le")))
        h = hist.setdefault(key, {"le": [], "c": []})
        if name.endswith("_bucket"):
            le = float(labels["le"].replace("Inf", "inf"))
            assert not h["le"] or le > h["le"][-1], f"le not ascending: {line}"
            assert not h["c"] or v >= h["c"][-1], f"buckets not cumulative: {line}"
            h["le"].append(le); h["c"].append(v)
        elif name.endswith("_count"):
            assert h["le"] and math.isinf(h["le"][-1]), f"no +Inf bucket before {line}"
            assert v == h["c"][-1], f"_count != +Inf bucket: {line}"
assert hist, "no histograms"
print("format ok:", len(types), "families")
PY

# ---- jobs: three on the long queue (this worker serves only short), then a batch on short
jobs_file "$T/long.jsonl" 3 long- '{"max_tokens": 4}'
push_file "$T/long.jsonl" long
# one job that runs for seconds (so the scrape sees it running), then short ones
rcli LPUSH llmq:queue:short '{"id": "slow", "prompt": "x", "max_tokens": 4000, "ignore_eos": true}' >/dev/null
jobs_file "$T/short.jsonl" 23 s- '{"max_tokens": 48, "ignore_eos": true, "temperature": 0}'
push_file "$T/short.jsonl"
rcli LPUSH llmq:queue:short '{"id": "toolong", "prompt": "x", "max_tokens": 99999999}' >/dev/null
N=25 # rows: 24 completed + 1 failed (dead-lettered)

worker_start w1 --queues short
port_logged() { grep -q "metrics: http://127.0.0.1:[0-9]*/metrics" "$T/w1.log"; }
wait_until "the metrics line in the log" port_logged && ok "the bound port is logged" || finish
MP=$(grep -o "metrics: http://127.0.0.1:[0-9]*" "$T/w1.log" | head -1 | sed 's/.*://')
[ "$MP" -gt 0 ] 2>/dev/null && ok "port 0 became a real port ($MP)" || bad "port '$MP'"

# while it works
busy() { scrape "$T/busy.txt" && r=$(val "$T/busy.txt" 'llmq_num_requests_running{lane="short"}') && [ "${r:-0}" -gt 0 ]; }
wait_until "running jobs in a scrape" busy && ok "running jobs show while the worker works"
python3 "$T/check.py" "$T/busy.txt" >/dev/null && ok "format while busy" || bad "format while busy: $(python3 "$T/check.py" "$T/busy.txt" 2>&1 | tail -1)"
eq "health while busy" "$(get /health | tr '\n' ' ')" "200 text/plain; charset=utf-8 ok "

wait_rows $N
# the interval after the last job: its worker_metrics row and the queue depths are current
interval_rows() { [ "$(sql "SELECT sum(jobs_done) FROM worker_metrics WHERE worker_id = 'w1'")" = "$N" ]; }
wait_until "worker_metrics rows that add up to $N jobs" interval_rows
# the publish that goes with that row: a scrape that counts every row
current() {
  scrape "$T/after.txt" &&
    [ "$(val "$T/after.txt" 'llmq_jobs_total{status="completed"}')" = "$(sql "SELECT count(*) FROM jobs WHERE status = 'completed'")" ] &&
    [ "$(val "$T/after.txt" 'llmq_jobs_total{status="failed"}')" = "$(sql "SELECT count(*) FROM jobs WHERE status = 'failed'")" ]
}
wait_until "a scrape that counts every row" current
python3 "$T/check.py" "$T/after.txt" >/dev/null && ok "format after" || bad "format after: $(python3 "$T/check.py" "$T/after.txt" 2>&1 | tail -1)"
eq "jobs_total completed = rows" "$(val "$T/after.txt" 'llmq_jobs_total{status="completed"}')" "$(sql "SELECT count(*) FROM jobs WHERE status = 'completed'")"
eq "jobs_total failed = rows" "$(val "$T/after.txt" 'llmq_jobs_total{status="failed"}')" "$(sql "SELECT count(*) FROM jobs WHERE status = 'failed'")"
eq "completed count" "$(val "$T/after.txt" 'llmq_jobs_total{status="completed"}')" 24
eq "finished_reason length" "$(val "$T/after.txt" 'llmq_request_success_total{finished_reason="length"}')" "$(sql "SELECT count(*) FROM jobs WHERE finish_reason = 'length'")"
eq "dead-lettered" "$(val "$T/after.txt" llmq_jobs_dead_lettered_total)" "$(rcli LLEN llmq:dead)"
eq "generation tokens = sum of completion_tokens" "$(val "$T/after.txt" llmq_generation_tokens_total)" "$(sql "SELECT sum(completion_tokens) FROM jobs")"
eq "prompt tokens = sum of prompt_tokens" "$(val "$T/after.txt" llmq_prompt_tokens_total)" "$(sql "SELECT sum(prompt_tokens) FROM jobs")"
eq "prefix cache queries = prompt tokens (each job once)" "$(val "$T/after.txt" llmq_prefix_cache_queries_total)" "$(val "$T/after.txt" llmq_prompt_tokens_total)"
eq "short queue depth = LLEN" "$(val "$T/after.txt" 'llmq_queue_depth{queue="short"}')" "$(rcli LLEN llmq:queue:short)"
eq "long queue depth = LLEN" "$(val "$T/after.txt" 'llmq_queue_depth{queue="long"}')" "$(rcli LLEN llmq:queue:long)"
eq "long queue depth" "$(val "$T/after.txt" 'llmq_queue_depth{queue="long"}')" 3
eq "dead depth" "$(val "$T/after.txt" llmq_dead_depth)" 1
eq "retry depth" "$(val "$T/after.txt" llmq_retry_depth)" "$(rcli ZCARD llmq:retry)"
eq "nothing running" "$(val "$T/after.txt" 'llmq_num_requests_running{lane="short"}')" 0
u=$(val "$T/after.txt" llmq_kv_cache_usage_perc)
python3 -c "import sys; u = float(sys.argv[1]); sys.exit(not 0 <= u <= 1)" "$u" && ok "kv usage in 0..1 ($u)" || bad "kv usage '$u'"

# every histogram bucket against the rows' own times
python3 - "$T/after.txt" "$DB" <<'PY' && ok "histograms equal SQLite's times" || bad "histograms differ from SQLite"
import re, sqlite3, sys
text = open(sys.argv[1]).read()
db = sqlite3.connect(sys.argv[2])
def series(name):
    b = [(float(le.replace("Inf", "inf")), float(v)) for le, v in re.findall(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', text, re.M)]
    s = float(re.search(rf"^{name}_sum (\S+)$", text, re.M).group(1))
    c = float(re.search(rf"^{name}_count (\S+)$", text, re.M).group(1))
    return b, s, c
bad = 0
for name, col in (("llmq_time_to_first_token_seconds", "ttft_ms"), ("llmq_e2e_request_latency_seconds", "latency_ms"),
                  ("llmq_request_queue_time_seconds", "queue_ms")):
    xs = [r[0] / 1e3 for r in db.execute(f"SELECT {col} FROM jobs WHERE {col} IS NOT NULL")]
    b, s, c = series(name)
    if c != len(xs) or abs(s - sum(xs)) > 1e-6 * max(1, sum(xs)):
        print(name, "count/sum", c, len(xs), s, sum(xs)); bad += 1
    for le, v in b:
        want = sum(1 for x in xs if x <= le)
        if v != want:
            print(name, "le", le, v, want); bad += 1
# inter-token latency: one observation per interval between tokens, at each job's mean
rows = list(db.execute("SELECT ttft_ms, latency_ms, completion_tokens FROM jobs WHERE completion_tokens > 1 AND ttft_ms IS NOT NULL"))
b, s, c = series("llmq_inter_token_latency_seconds")
n = sum(r[2] - 1 for r in rows)
tot = sum((r[1] - r[0]) / 1e3 for r in rows)
if c != n or abs(s - tot) > 1e-6 * max(1, tot):
    print("itl count/sum", c, n, s, tot); bad += 1
for le, v in b:
    want = sum(r[2] - 1 for r in rows if (r[1] - r[0]) / (r[2] - 1) / 1e3 <= le)
    if v != want:
        print("itl le", le, v, want); bad += 1
sys.exit(1 if bad else 0)
PY

# ---- worker_metrics rows: the same figures, interval by interval
eq "rows' jobs_done add up" "$(sql "SELECT sum(jobs_done), sum(jobs_failed), sum(jobs_dead) FROM worker_metrics WHERE worker_id = 'w1'")" "$N|1|1"
eq "rows' generation tokens add up" "$(sql "SELECT sum(generation_tokens) FROM worker_metrics WHERE worker_id = 'w1'")" "$(val "$T/after.txt" llmq_generation_tokens_total)"
eq "rows' prompt tokens add up" "$(sql "SELECT sum(prompt_tokens) FROM worker_metrics WHERE worker_id = 'w1'")" "$(val "$T/after.txt" llmq_prompt_tokens_total)"
eq "last row's depths" "$(sql "SELECT queue_short, queue_long, dead_depth, retry_depth FROM worker_metrics WHERE worker_id = 'w1' ORDER BY ts DESC LIMIT 1")" "0|3|1|0"
eq "queue time percentiles written" "$(sql "SELECT count(*) > 0 FROM worker_metrics WHERE queue_p50_ms >= 0 AND queue_p95_ms >= queue_p50_ms")" 1
eq "schema version: every migration applied" "$(sql "PRAGMA user_version")" "$(ls "${LLMQ_SOURCE_DIR:?run through ctest}"/schemas/[0-9][0-9][0-9]_*.sql | wc -l)"

# ---- other paths and methods
eq "404" "$(get /nope | head -1 | cut -d' ' -f1)" 404
eq "405 for POST" "$(get /metrics POST | head -1 | cut -d' ' -f1)" 405
eq "HEAD /health" "$(get /health HEAD | head -1 | cut -d' ' -f1)" 200

# ---- a second worker on the same port: a warning, and it works without metrics
LLMQ_METRICS_PORT=$MP worker_start w2 --queues short --drain
worker_wait w2
eq "w2 without metrics still runs (drain exit)" "$WRC" 0
grep -q "cannot listen on 127.0.0.1 port $MP" "$T/w2.log" && ok "w2 says why it has no metrics" || bad "w2 log: $(grep -i metric "$T/w2.log" | head -3)"

# ---- the Redis gauges from the first scrape (a metrics interval of an hour: none has passed)
LLMQ_METRICS_INTERVAL_S=3600 worker_start w3 --queues short
w3_port() { grep -q "metrics: http://127.0.0.1:[0-9]*/metrics" "$T/w3.log"; }
if wait_until "w3's metrics line" w3_port; then
  w1_port=$MP
  MP=$(grep -o "metrics: http://127.0.0.1:[0-9]*" "$T/w3.log" | head -1 | sed 's/.*://')
  scrape "$T/first.txt" || bad "w3: no first scrape"
  MP=$w1_port
  eq "first scrape: dead depth" "$(val "$T/first.txt" llmq_dead_depth)" "$(rcli LLEN llmq:dead)"
  eq "first scrape: retry depth" "$(val "$T/first.txt" llmq_retry_depth)" "$(rcli ZCARD llmq:retry)"
  eq "first scrape: long queue depth" "$(val "$T/first.txt" 'llmq_queue_depth{queue="long"}')" 3
fi
kill -TERM "$W_w3"; worker_wait w3; eq "w3 stops" "$WRC" 0

# ---- /health follows Redis
redis_stop
down() { o=$(get /health); [ "$(echo "$o" | head -1 | cut -d' ' -f1)" = 503 ] && echo "$o" | grep -q "^redis: "; }
wait_until "/health to answer 503 naming redis" down && ok "503 naming redis while it is down" ||
  echo "  health with redis down: $(get /health | tr '\n' ' ')"
scrape "$T/down.txt" && eq "healthy gauge 0" "$(val "$T/down.txt" llmq_worker_healthy)" 0 || bad "no scrape with redis down"
redis_again || bad "redis did not come back"
up() { [ "$(get /health | tail -1)" = ok ]; }
wait_until "/health to answer 200 again" up && ok "200 again once redis is back" ||
  echo "  health after redis came back: $(get /health | tr '\n' ' ')"

kill -TERM "$W_w1"; worker_wait w1; eq "w1 stops" "$WRC" 0
o=$(get /health); [ "$(echo "$o" | head -1 | cut -d' ' -f1)" = 0 ] && ok "the port is closed after exit" || bad "still answering: $o"
finish
