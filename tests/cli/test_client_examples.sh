#!/usr/bin/env bash
# The deployment kit in contrib/, run for real where its runtime exists:
#  - the client examples (redis-cli always; Python with redis-py, Node with the npm `redis`
#    package, Go with redigo, Debian's package or else the module proxy's, when they can be had)
#    push a job onto a real redis-server, a real worker on a tiny model runs it, and each
#    example's printed result must match the worker's SQLite row (status, token counts, text; the
#    text read from the job hash's result field, with no database named, and redis-cli's result
#    line equal to the row's);
#  - every example answers --help (exit 0, the timeout in seconds in all of them);
#  - the nightly cron script enqueues a folder with a template, drains it with its own worker and
#    exports the results with `llmq results`.
# The Grafana dashboard and Prometheus config are checked by test_kit_grafana.sh, the systemd unit
# by test_kit_systemd.sh, the Dockerfile by test_kit_docker.sh.
# An example whose runtime is missing is skipped with its reason; the rest still run.
. "$(dirname "$0")/worker_lib.sh"
SRC=${LLMQ_SOURCE_DIR:?run through ctest}
BUILD=${LLMQ_BUILD_DIR:?run through ctest}
K=$SRC/contrib
skip() { echo "skip $1"; }

# ---- a worker for the clients
redis_start
make_model
write_config 'templates:' '  summarize: "Summarize this:\n{document}"'
worker_start w1
printf 'The quick brown fox jumps over the lazy dog.\nA second line, "quoted".\n' >"$T/doc.txt"

# check_result NAME ID OUTPUT-FILE EXIT: the example's JSON line against the worker's SQLite row
check_result() {
  local name=$1 id=$2 file=$3 rc=$4
  [ "$rc" -eq 0 ] || { bad "$name exited $rc: $(cat "$file" "$file.err" 2>/dev/null | tail -5)"; return; }
  python3 - "$file" "$DB" "$id" <<'PY' && ok "$name: enqueued, waited, result matches SQLite" || bad "$name: $(cat "$file" "$file.err" | tail -5)"
import json, sqlite3, sys
lines = [l for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
got = json.loads(lines[-1])
row = sqlite3.connect(sys.argv[2]).execute(
    "SELECT status, prompt_tokens, completion_tokens, output, finish_reason FROM jobs WHERE id = ?", (sys.argv[3],)).fetchone()
assert row, "no row"
want = {"id": sys.argv[3], "status": row[0], "prompt_tokens": row[1], "completion_tokens": row[2], "text": row[3],
        "finish_reason": row[4]}
bad = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
assert row[0] == "completed" and row[2] > 0, row
if bad:
    print("differs (got, want):", bad)
    sys.exit(1)
PY
}

# redis-cli: a prompt job and a templated job (the document from a file)
EX=$K/clients/redis-cli/enqueue_wait.sh
bash "$EX" -u "$URL" -n 8 -i cli-1 -d "$DB" -t 60 'Say "hello" \ back' >"$T/cli1.out" 2>"$T/cli1.out.err"
check_result "redis-cli example" cli-1 "$T/cli1.out" $?
bash "$EX" -u "$URL" -n 8 -i cli-2 -d "$DB" -t 60 -T summarize -V document=@"$T/doc.txt" >"$T/cli2.out" 2>"$T/cli2.out.err"
check_result "redis-cli example (template)" cli-2 "$T/cli2.out" $?
# without a database: the result line from the hash (HGET) is the row's
bash "$EX" -u "$URL" -n 8 -i cli-4 -t 60 'No database here' >"$T/cli4.out" 2>"$T/cli4.out.err"
rc=$?
python3 - "$T/cli4.out" "$DB" <<'PY2' && [ $rc -eq 0 ] && ok "redis-cli example: the result line from the hash" || bad "redis-cli result line: rc $rc $(cat "$T/cli4.out" "$T/cli4.out.err")"
import json, sqlite3, sys
got = json.loads(open(sys.argv[1], encoding="utf-8").read().splitlines()[-1])
res, out = sqlite3.connect(sys.argv[2]).execute("SELECT result, output FROM jobs WHERE id = 'cli-4'").fetchone()
assert got["result"] == json.loads(res), (got["result"], res)
assert got["result"]["text"] == out and got["text"] is None, got
PY2
# its result for a job that fails: exit 1 and the error
bash "$EX" -u "$URL" -n 8 -i cli-3 -d "$DB" -t 60 -T nope -V document=x >"$T/cli3.out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q '"status": "failed"' "$T/cli3.out" && grep -q "no template named 'nope'" "$T/cli3.out" &&
  ok "redis-cli example reports a failed job" || bad "redis-cli failed job: rc $rc $(cat "$T/cli3.out")"

# Python (redis-py: pip's, or Debian's python3-redis under the system python3)
PY=
for p in python3 /usr/bin/python3; do
  command -v "$p" >/dev/null && "$p" -c 'import redis' 2>/dev/null && { PY=$p; break; }
done
if [ -n "$PY" ]; then
  "$PY" "$K/clients/python/enqueue_wait.py" --redis "$URL" --template summarize --var document=@"$T/doc.txt" \
    --max-tokens 8 --id py-1 --timeout 60 >"$T/py.out" 2>"$T/py.out.err" # the text from the hash
  check_result "python example" py-1 "$T/py.out" $?
else
  skip "python example: the redis module is not importable by python3 (pip install redis, or apt install python3-redis)"
fi

# Node (npm `redis`, installed into the build folder once, from the npm registry)
NODE_DIR=$BUILD/contrib-clients/node
if command -v node >/dev/null && command -v npm >/dev/null; then
  mkdir -p "$NODE_DIR"
  cp "$K/clients/node/package.json" "$K/clients/node/enqueue_wait.js" "$NODE_DIR/"
  if [ -f "$NODE_DIR/node_modules/redis/package.json" ] ||
    (cd "$NODE_DIR" && npm install --no-audit --no-fund --silent >"$T/npm.log" 2>&1); then
    node "$NODE_DIR/enqueue_wait.js" --redis "$URL" --template summarize --var document=@"$T/doc.txt" \
      --max-tokens 8 --id node-1 --db "$DB" --timeout 60 >"$T/node.out" 2>"$T/node.out.err"
    check_result "node example" node-1 "$T/node.out" $?
    node "$NODE_DIR/enqueue_wait.js" --redis "$URL" --prompt "Hello from Node" --max-tokens 8 --id node-2 \
      --timeout 60 >"$T/node2.out" 2>"$T/node2.out.err" # no database: the text from the hash
    check_result "node example (prompt)" node-2 "$T/node2.out" $?
  else
    skip "node example: npm install failed (registry unreachable?): $(tail -2 "$T/npm.log" | tr '\n' ' ')"
  fi
else
  skip "node example: node or npm is not installed"
fi

# Go (redigo): built offline against Debian's golang-github-gomodule-redigo-dev where it is
# installed (go.mod's `go` line must suit Debian 12's Go 1.19), else through the module proxy
REDIGO=/usr/share/gocode/src/github.com/gomodule/redigo
gomod_go=$(sed -n 's/^go //p' "$K/clients/go/go.mod")
[ "$(printf '%s\n' "$gomod_go" 1.19 | sort -V | tail -1)" = 1.19 ] &&
  ok "go.mod asks for Go $gomod_go, which Debian 12's Go 1.19 can build and tidy" || bad "go.mod: go $gomod_go is newer than Debian 12's 1.19"
if command -v go >/dev/null; then
  GO_DIR=$BUILD/contrib-clients/go
  mkdir -p "$GO_DIR"
  cp "$K/clients/go/go.mod" "$K/clients/go/main.go" "$GO_DIR/"
  export GOPATH=$BUILD/contrib-clients/gopath GOCACHE=$BUILD/contrib-clients/gocache
  if [ -f "$REDIGO/go.mod" ]; then
    gobuild() { go mod edit -replace "github.com/gomodule/redigo=$REDIGO" && GOPROXY=off GOFLAGS=-mod=mod go build -o enqueue_wait .; }
    how="against Debian's redigo"
  else
    gobuild() { go mod tidy && go build -o enqueue_wait .; }
    how="through the module proxy"
  fi
  if (cd "$GO_DIR" && gobuild >"$T/go.log" 2>&1); then
    ok "go example builds with $(go env GOVERSION) $how"
    "$GO_DIR/enqueue_wait" --redis "$URL" --prompt "Hello from Go" --max-tokens 8 --id go-1 --timeout 60 \
      >"$T/go.out" 2>"$T/go.out.err"
    check_result "go example" go-1 "$T/go.out" $?
  elif [ -f "$REDIGO/go.mod" ]; then
    bad "go example: go build $how failed: $(tail -5 "$T/go.log")"
  else
    skip "go example: go mod tidy / go build failed (module proxy unreachable?): $(tail -2 "$T/go.log" | tr '\n' ' ')"
  fi
else
  skip "go example: go is not installed"
fi

# every example answers --help (exit 0, its options on stdout, the timeout in seconds) without
# needing Redis or its client library
helpcheck() {
  local name=$1; shift
  local out rc
  out=$("$@" --help 2>"$T/help.err")
  rc=$?
  [ $rc -eq 0 ] && grep -q -- "--prompt\|PROMPT" <<<"$out" && grep -qi "seconds" <<<"$out" &&
    ok "$name --help" || bad "$name --help: rc $rc: $out $(cat "$T/help.err")"
}
helpcheck "redis-cli example" bash "$K/clients/redis-cli/enqueue_wait.sh"
helpcheck "python example" python3 "$K/clients/python/enqueue_wait.py"
if command -v node >/dev/null; then helpcheck "node example" node "$K/clients/node/enqueue_wait.js"; else skip "node example --help: node is not installed"; fi
if [ -x "${GO_DIR:-/nonexistent}/enqueue_wait" ]; then helpcheck "go example" "$GO_DIR/enqueue_wait"; else skip "go example --help: not built"; fi

kill -TERM "$W_w1"
worker_wait w1

# ---- the nightly cron script: a folder of documents, a template, drain, export
mkdir -p "$T/inbox" "$T/exports"
for i in 1 2 3; do printf 'Document number %d.\nIt has "quotes" and a {brace}.\n' "$i" >"$T/inbox/doc $i.txt"; done
mkdir "$T/inbox/not-a-file"
LLMQ=$LLMQ LLMQ_METRICS_PORT=0 bash "$K/cron/nightly-summarize.sh" -c "$CFG" -o "$T/exports" -q short "$T/inbox" >"$T/cron.log" 2>&1
rc=$?
stamp=$(date +%F)
export_file=$T/exports/summaries-$stamp.jsonl
[ $rc -eq 0 ] && ok "nightly-summarize.sh exit 0" || bad "nightly-summarize.sh exit $rc: $(tail -5 "$T/cron.log")"
python3 - "$export_file" "$DB" "$stamp" <<'PY' && ok "nightly export: one completed, templated result per document" || bad "nightly export: $(tail -5 "$T/cron.log")"
import json, sqlite3, sys
path, db, stamp = sys.argv[1:4]
rows = [json.loads(l) for l in open(path, encoding="utf-8") if l.strip()]
mine = {r["id"]: r for r in rows if r["id"].startswith(f"nightly-{stamp}/")}
want = {f"nightly-{stamp}/doc {i}.txt" for i in (1, 2, 3)}
assert set(mine) == want, (sorted(mine), sorted(want))
con = sqlite3.connect(db)
for jid, r in mine.items():
    assert r["status"] == "completed", r
    assert r["metadata"] == {"file": jid.split("/", 1)[1], "run": f"nightly-{stamp}"}, r["metadata"]
    out, pt = con.execute("SELECT output, prompt_tokens FROM jobs WHERE id = ?", (jid,)).fetchone()
    assert r["text"] == out, (r["text"], out)
    assert pt > len("Summarize this:\nDocument number 1.\n"), pt  # the file's text is in the prompt
PY
grep -q "3 documents queued" "$T/cron.log" && ok "cron log counts the documents" || bad "cron log: $(cat "$T/cron.log")"
eq "the drain worker left nothing queued" "$(rcli LLEN llmq:queue:short)" 0
eq "the night is one completed batch" "$(rcli HMGET "llmq:batch:nightly-$stamp" total completed state | tr '\n' ' ')" "3 3 completed "

# ---- a document that fails (longer than the model's context): exit 1, the job named on stderr
mkdir -p "$T/inbox2"
python3 -c 'print("word " * 6000)' >"$T/inbox2/big.txt"
printf 'A short one.\n' >"$T/inbox2/small.txt"
LLMQ=$LLMQ LLMQ_METRICS_PORT=0 bash "$K/cron/nightly-summarize.sh" -c "$CFG" -o "$T/exports" -q short "$T/inbox2" >"$T/cron2.log" 2>&1
eq "nightly-summarize.sh with a failed document exits 1" "$?" 1
grep -q "nightly-summarize: failed: nightly-$stamp/big.txt (context_length_exceeded)" "$T/cron2.log" &&
  ok "the failed job is named with its error code" || bad "cron2 log: $(tail -5 "$T/cron2.log")"
eq "the export is exactly the night's batch" "$(wc -l <"$export_file")" 5

# ---- -m: the same long document as a map-reduce summary completes
rm "$T/inbox2/small.txt"
LLMQ=$LLMQ LLMQ_METRICS_PORT=0 bash "$K/cron/nightly-summarize.sh" -c "$CFG" -o "$T/exports" -q short -m "$T/inbox2" >"$T/cron3.log" 2>&1
eq "nightly-summarize.sh -m exit status" "$?" 0
eq "the long document is summarized in pieces" \
  "$(sql "SELECT status, json_extract(result, '\$.usage.chunks') > 1 FROM jobs WHERE id = 'nightly-$stamp/big.txt'")" \
  "completed|1"
finish
