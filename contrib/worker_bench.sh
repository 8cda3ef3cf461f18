#!/usr/bin/env bash
# The whole queue path's speed on a real model: N jobs of about IN prompt tokens and exactly OUT
# generated tokens pushed into Redis, one `llmq worker --drain` to SQLite, and `llmq bench` on the
# same model, configuration and lengths for comparison. Prints one JSON line: the worker's jobs/s and
# tokens/s from its first fetch to its last row (from the SQLite rows), its TTFT percentiles (a job's
# start to its first token), the bench line's numbers, and the worker's share of the bench's
# throughput (what Redis, SQLite, tokenizing and the job bookkeeping cost).
#
#   contrib/worker_bench.sh MODEL_DIR [N [IN [OUT]]] [-- extra llmq.yaml lines...]
#   LLMQ=build/llmq contrib/worker_bench.sh /models/Qwen3-14B-FP8 1000 512 128 -- "engine:" "  backend: cuda"
#
# Defaults: N 1000, IN 512, OUT 128 (the chat workload of docs/BENCH.md). The prompts are random
# words (fixed seed), as many as make about IN tokens with the model's tokenizer (counted on a sample
# with `llmq tokenize`); the line reports the mean the worker counted, and the bench runs with that
# length. Needs redis-server, redis-cli, sqlite3 and python3; everything runs in a temporary folder
# (a redis-server on a free loopback port).
set -euo pipefail
LLMQ=${LLMQ:-llmq}
[ $# -ge 1 ] || { sed -n '2,17p' "$0"; exit 2; }
MODEL=$(cd "$1" && pwd); shift
N=1000 IN=512 OUT=128
for v in N IN OUT; do
  if [ $# -gt 0 ] && [ "$1" != "--" ]; then printf -v "$v" '%s' "$1"; shift; fi
done
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
for prog in redis-server redis-cli sqlite3 python3; do
  command -v "$prog" >/dev/null || { echo "worker_bench: $prog is not installed" >&2; exit 1; }
done

T=$(mktemp -d /tmp/llmq-worker-bench-XXXXXX)
REDIS_PID=
cleanup() {
  if [ -n "$REDIS_PID" ]; then
    redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || kill -9 "$REDIS_PID" 2>/dev/null
    wait "$REDIS_PID" 2>/dev/null || true
  fi
  rm -rf "$T"
}
trap cleanup EXIT
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --dir "$T" --save "" --appendonly no >"$T/redis.log" 2>&1 &
REDIS_PID=$!
for _ in $(seq 100); do redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done

DB=$T/results.db
CFG=$T/llmq.yaml
printf 'redis:\n  url: "redis://127.0.0.1:%s"\nmodel:\n  path: "%s"\nsqlite:\n  path: "%s"\n' "$PORT" "$MODEL" "$DB" >"$CFG"
for line in "$@"; do echo "$line" >>"$CFG"; done

# the jobs, LPUSHed by redis-cli (not llmq) before the worker starts
python3 - "$N" "$IN" "$OUT" "$LLMQ" "$MODEL" <<'PY' | redis-cli -p "$PORT" --pipe >/dev/null
import json, random, subprocess, sys
n, n_in, n_out = (int(a) for a in sys.argv[1:4])
llmq, model = sys.argv[4:6]
letters = "abcdefghijklmnopqrstuvwxyz"
def words(rng, k):
    return " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(k))
# words a token with this model's tokenizer, from a 2,000-word sample
sample = words(random.Random(1), 2000)
ids = json.loads(subprocess.run([llmq, "tokenize", "--model", model], input=json.dumps({"text": sample}) + "\n",
                                capture_output=True, text=True, check=True).stdout)["ids"]
n_words = max(1, round(n_in * 2000 / len(ids)))
rng = random.Random(0)
def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)
for i in range(n):
    job = {"id": "wb%d" % i, "prompt": words(rng, n_words), "max_tokens": n_out, "ignore_eos": True,
           "temperature": 0}
    sys.stdout.buffer.write(resp("LPUSH", "llmq:queue:short", json.dumps(job)))
PY

"$LLMQ" worker -c "$CFG" --id bench --drain >"$T/worker.log" 2>&1 ||
  { echo "worker_bench: the worker failed:" >&2; tail -20 "$T/worker.log" >&2; exit 1; }
done_rows=$(sqlite3 "$DB" "SELECT count(*) FROM jobs WHERE status = 'completed'")
[ "$done_rows" = "$N" ] || { echo "worker_bench: $done_rows of $N jobs completed" >&2; tail -20 "$T/worker.log" >&2; exit 1; }
mean_in=$(sqlite3 "$DB" "SELECT CAST(round(avg(prompt_tokens)) AS INTEGER) FROM jobs")

"$LLMQ" bench --model "$MODEL" --config "$CFG" --workload chat -n "$N" --input-len "$mean_in" \
  --output-len "$OUT" >"$T/bench.json" 2>"$T/bench.log" ||
  { echo "worker_bench: llmq bench failed:" >&2; tail -20 "$T/bench.log" >&2; exit 1; }

python3 - "$DB" "$T/bench.json" "$MODEL" <<'PY'
import json, sqlite3, sys
db, bench_path, model = sys.argv[1:4]
c = sqlite3.connect(db)
rows = c.execute("SELECT started_at, finished_at, prompt_tokens, completion_tokens, ttft_ms "
                 "FROM jobs WHERE status = 'completed'").fetchall()
def pct(xs, p):  # linear between closest ranks, as llmq bench
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * p / 100
    f = int(k)
    return xs[f] + (xs[min(f + 1, len(xs) - 1)] - xs[f]) * (k - f)
t_start, t1 = min(r[0] for r in rows), max(r[1] for r in rows)
prompt, out = sum(r[2] for r in rows), sum(r[3] for r in rows)
secs = t1 - t_start  # from the worker's first fetch: the bench's clock starts at its first request too
bench = json.load(open(bench_path))
line = {
    "engine": "llmq worker", "model": model.rstrip("/").split("/")[-1], "jobs": len(rows),
    "prompt_tokens_mean": round(prompt / len(rows), 1), "output_len": round(out / len(rows), 1),
    "seconds": round(secs, 3), "jobs_per_s": round(len(rows) / secs, 3),
    "output_tokens_per_s": round(out / secs, 1), "total_tokens_per_s": round((prompt + out) / secs, 1),
    "ttft_ms_p50": round(pct([r[4] for r in rows], 50), 1), "ttft_ms_p95": round(pct([r[4] for r in rows], 95), 1),
    "bench": {k: bench[k] for k in ("backend", "requests", "input_len", "output_len", "seconds",
                                    "output_tokens_per_s", "total_tokens_per_s", "ttft_ms_p50", "ttft_ms_p95")},
}
line["worker_share_of_bench"] = round(line["total_tokens_per_s"] / bench["total_tokens_per_s"], 3)
print(json.dumps(line))
PY
