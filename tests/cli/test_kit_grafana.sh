#!/usr/bin/env bash
# contrib/grafana/llmq.json and contrib/prometheus/prometheus.yml against a real worker:
#  - the dashboard is valid: JSON, unique panel ids, panels that do not overlap, every target on
#    the ${datasource} variable, every $variable it uses defined, the variables contrib/README.md
#    names (`model`, `worker`), and panels for the figures an operator needs (failed,
#    dead-lettered and retried jobs, queue time, end-to-end latency, per model, per worker);
#  - every metric it queries is served by the worker's /metrics (llmq_gpu_memory_used_bytes only by
#    GPU workers) with the labels it selects on, and is listed in docs/METRICS.md;
#  - where Debian's `prometheus` is installed: a real Prometheus scrapes the worker and every
#    query of the dashboard and of its variables returns data.
. "$(dirname "$0")/worker_lib.sh"
SRC=${LLMQ_SOURCE_DIR:?run through ctest}
K=$SRC/contrib
DASH=$K/grafana/llmq.json

# ---- static: the dashboard's structure, then the metric names it queries into $T/dash-metrics
python3 - "$DASH" "$K/README.md" <<'PY' && ok "the dashboard is valid and has the panels and variables the docs name" || bad "grafana dashboard"
import json, re, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
readme = open(sys.argv[2], encoding="utf-8").read()
panels = d["panels"]
ids = [p["id"] for p in panels]
assert len(ids) == len(set(ids)), f"duplicate panel ids {ids}"
cells = {}
for p in panels:
    g = p["gridPos"]
    assert g["x"] >= 0 and g["x"] + g["w"] <= 24, (p["title"], g)
    for x in range(g["x"], g["x"] + g["w"]):
        for y in range(g["y"], g["y"] + g["h"]):
            assert (x, y) not in cells, f"panels {cells[(x, y)]!r} and {p['title']!r} overlap"
            cells[(x, y)] = p["title"]
variables = {v["name"]: v for v in d["templating"]["list"]}
assert {"datasource", "model", "worker"} <= set(variables), sorted(variables)
for name in ("model", "worker"):
    assert f"`{name}`" in readme, f"contrib/README.md does not name the variable {name}"
builtin = {"__rate_interval", "__interval", "__range"}
exprs = []
for p in panels:
    if p["type"] == "row":
        continue
    assert p["datasource"]["uid"] == "${datasource}", p["title"]
    refs = [t["refId"] for t in p["targets"]]
    assert p["targets"] and len(refs) == len(set(refs)), p["title"]
    for t in p["targets"]:
        assert t["datasource"]["uid"] == "${datasource}", p["title"]
        exprs.append((p["title"], t["expr"]))
for name, v in variables.items():
    if v["type"] == "query":
        exprs.append((f"variable {name}", v["query"]["query"]))
for title, e in exprs:
    for ref in re.findall(r"\$\{?(\w+)", e):
        assert ref in variables or ref in builtin, f"{title}: ${ref} is not a variable"
text = "\n".join(e for _, e in exprs)
need = ["llmq_jobs_total{status=\"failed\"", "llmq_jobs_dead_lettered_total", "llmq_jobs_retried_total",
        "llmq_retry_depth", "llmq_dead_depth", "llmq_request_queue_time_seconds_bucket",
        "llmq_e2e_request_latency_seconds_bucket", "llmq_time_to_first_token_seconds_bucket",
        "llmq_inter_token_latency_seconds_bucket", "sum by (model", "sum by (worker", "$instance"]
missing = [n for n in need if n not in text]
assert not missing, f"no panel queries {missing}"
PY
python3 - "$DASH" >"$T/dash-metrics" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
text = json.dumps([p.get("targets", []) for p in d["panels"]] + d["templating"]["list"])
for n in sorted({re.sub(r"_(bucket|sum|count)$", "", n) for n in re.findall(r"\bllmq_[a-z_]+\b", text)}):
    print(n)
PY
[ -s "$T/dash-metrics" ] || bad "no metric names read from the dashboard"
undoc=$(while read -r m; do grep -q "\b$m\b" "$SRC/docs/METRICS.md" || echo "$m"; done <"$T/dash-metrics")
[ -z "$undoc" ] && ok "every dashboard metric is in docs/METRICS.md" || bad "not in docs/METRICS.md: $undoc"

python3 - "$K/prometheus/prometheus.yml" <<'PY' && ok "prometheus.yml parses and scrapes 127.0.0.1:9464/metrics" || bad "prometheus.yml"
import sys
try:
    import yaml
except ImportError:
    print("note: python3 has no yaml module: prometheus.yml checked as text only")
    text = open(sys.argv[1]).read()
    sys.exit(0 if "127.0.0.1:9464" in text and "/metrics" in text else 1)
c = yaml.safe_load(open(sys.argv[1]))
jobs = c["scrape_configs"]
targets = [t for j in jobs for s in j["static_configs"] for t in s["targets"]]
assert "127.0.0.1:9464" in targets, targets
assert all(j.get("metrics_path", "/metrics") == "/metrics" for j in jobs)
PY

# ---- a worker with a completed and a dead-lettered job, its metrics on a port of its own
redis_start
make_model
write_config
MPORT=$(free_port)
rcli LPUSH llmq:queue:short '{"id": "ok-1", "prompt": "hello", "max_tokens": 4}' \
  '{"id": "bad-1", "prompt": "hi", "max_tokens": -1}' >/dev/null
LLMQ_METRICS_PORT=$MPORT worker_start w1
wait_rows 2

# served: every family the dashboard queries has samples, with the labels it selects on (the
# Redis gauges appear after the first metrics interval: wait for them)
scrape_ok() {
  python3 - "$MPORT" "$T/dash-metrics" "$DASH" >"$T/scrape.out" 2>&1 <<'PY'
import json, re, sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
labels = {}
for l in body.splitlines():
    m = re.match(r"(llmq_\w+?)(?:_bucket|_sum|_count)?(?:\{(.*)\})? \S+$", l)
    if m and not l.startswith("#"):
        labels.setdefault(m.group(1), set()).update(re.findall(r"(\w+)=", m.group(2) or ""))
want = [m.strip() for m in open(sys.argv[2]) if m.strip()]
missing = [m for m in want if m not in labels and m != "llmq_gpu_memory_used_bytes"]
if missing:
    print("no samples at /metrics:", missing)
    sys.exit(1)
d = json.load(open(sys.argv[3]))
exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
exprs += [v["query"]["query"] for v in d["templating"]["list"] if v["type"] == "query"]
for e in exprs:
    for name, sel in re.findall(r"\b(llmq_[a-z_]+)\{([^}]*)\}", e):
        fam = re.sub(r"_(bucket|sum|count)$", "", name)
        for label in re.findall(r"(\w+)\s*=~?", sel):
            if label not in ("instance", "job") and fam in labels and label not in labels[fam]:
                print(f"{name} has no label {label}: {e}")
                sys.exit(1)
PY
}
if wait_until "every dashboard metric at /metrics" scrape_ok; then
  ok "the worker's /metrics serves every metric the dashboard queries, with its labels"
else
  cat "$T/scrape.out"
fi

# ---- a real Prometheus scraping the worker answers every query of the dashboard
if command -v prometheus >/dev/null; then
  PPORT=$(free_port)
  cat >"$T/prom.yml" <<EOF
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: llmq
    static_configs: [{targets: ["127.0.0.1:$MPORT"]}]
EOF
  prometheus --config.file="$T/prom.yml" --storage.tsdb.path="$T/prom-data" \
    --web.listen-address="127.0.0.1:$PPORT" >"$T/prometheus.log" 2>&1 &
  PROM_PID=$!
  WORKER_PIDS+=("$PROM_PID")
  # every query with the variables at All and a rate window of 5 s; the GPU's only on GPU workers
  all_answer() {
    python3 - "$PPORT" "$DASH" >"$T/queries.out" 2>&1 <<'PY'
import json, re, sys, urllib.parse, urllib.request
port, d = sys.argv[1], json.load(open(sys.argv[2]))
def query(e):
    e = e.replace("$__rate_interval", "5s")
    e = re.sub(r"\$\{?(model|worker|instance)\}?", ".*", e)
    m = re.fullmatch(r"label_values\((.*), (\w+)\)", e)
    path = f"/api/v1/series?match[]={urllib.parse.quote(m.group(1))}" if m else f"/api/v1/query?query={urllib.parse.quote(e)}"
    r = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5))
    assert r["status"] == "success", r
    if m:
        return [s for s in r["data"] if m.group(2) in s]
    return r["data"]["result"]
empty = []
for p in d["panels"]:
    for t in p.get("targets", []):
        if not query(t["expr"]) and "llmq_gpu_memory_used_bytes" not in t["expr"]:
            empty.append(f"{p['title']}: {t['expr']}")
for v in d["templating"]["list"]:
    if v["type"] == "query" and not query(v["query"]["query"]):
        empty.append(f"variable {v['name']}")
if empty:
    print("no data:", *empty, sep="\n  ")
    sys.exit(1)
PY
  }
  if wait_until "every dashboard query to return data from Prometheus" all_answer; then
    ok "Prometheus scraping the worker answers every dashboard query and variable"
  else
    cat "$T/queries.out"
  fi
else
  echo "skip Prometheus queries: prometheus is not installed (Debian package prometheus)"
fi

kill -TERM "$W_w1"
worker_wait w1
finish
