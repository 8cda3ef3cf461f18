#!/usr/bin/env bash
# `llmq wait` on a real redis-server, SQLite file and worker (tiny model, CPU backend): waiting on
# jobs before a worker starts (they end while it blocks on the events stream), on jobs that have
# already ended (at once, also after their hash expired: from SQLite), on a dead-lettered job
# (exit 1), on a job nobody runs (--timeout: exit 124), and the command line's errors. What it
# prints is compared with the job hashes and the SQLite rows.
. "$(dirname "$0")/worker_lib.sh"

# ---- the command line
out=$("$LLMQ" wait --help); eq "wait --help" "$?" 0
echo "$out" | grep -q "Usage: llmq wait" || bad "wait --help has no Usage line"
echo "$out" | grep -q "Examples:" || bad "wait --help has no examples"
out=$("$LLMQ" wait 2>&1); eq "wait without ids" "$?" 2
out=$("$LLMQ" wait --timeout soon x 2>&1); eq "wait: bad --timeout" "$?" 2
out=$("$LLMQ" wait --format xml x 2>&1); eq "wait: bad --format" "$?" 2
out=$(env -u LLMQ_CONFIG "$LLMQ" wait --redis redis://127.0.0.1:1 --db "$T/none.db" x 2>&1); eq "wait: --db missing" "$?" 69
out=$(env -u LLMQ_CONFIG "$LLMQ" wait --redis redis://127.0.0.1:1 x 2>&1); eq "wait: redis unreachable" "$?" 69
echo "$out" | grep -qi "refused\|connect" || bad "unreachable redis not explained: $out"

redis_start
make_model
write_config

# ---- jobs pushed, waiters started, then the worker
cat >"$T/enq.jsonl" <<'EOF2'
{"id": "ok-1", "prompt": "Hello there", "max_tokens": 8, "temperature": 0, "ignore_eos": true}
{"id": "ok-2", "messages": [{"role": "user", "content": "Summarize: cats sleep a lot."}], "max_tokens": 5, "temperature": 0}
{"custom_id": "oa-1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}}
EOF2
"$LLMQ" enqueue -c "$CFG" --batch w "$T/enq.jsonl" >/dev/null 2>&1 || bad "enqueue failed"
# pushed without a hash (a plain LPUSH): wait has to learn about it from the events
rcli LPUSH llmq:queue:short '{"id": "raw-1", "prompt": "raw push", "max_tokens": 3, "temperature": 0}' >/dev/null
# a job that is dead-lettered (over max_model_len): failed
rcli LPUSH llmq:queue:short '{"id": "dead-1", "prompt": "x", "max_tokens": 99999999}' >/dev/null

"$LLMQ" wait -c "$CFG" --format json --timeout 60 ok-1 ok-2 w/oa-1 raw-1 ok-1 >"$T/w1.out" 2>"$T/w1.err" &
w1=$!
"$LLMQ" wait -c "$CFG" --timeout 60 dead-1 >"$T/w2.out" 2>"$T/w2.err" &
w2=$!
# the notice comes once wait has read the job hashes
noticed() { grep -q "raw-1: not known to Redis yet" "$T/w1.err" || exited "$w1"; }
wait_until "wait's notice for raw-1" noticed
kill -0 "$w1" 2>/dev/null && ok "wait blocks while nothing runs" || bad "wait returned before the worker started: $(cat "$T/w1.err")"
grep -q "raw-1: not known to Redis yet" "$T/w1.err" && ok "a job without a hash is announced" || bad "no notice for raw-1: $(cat "$T/w1.err")"
worker_start w1 --drain
worker_wait w1
wait "$w1"; eq "wait on jobs that complete: exit 0" "$?" 0
wait "$w2"; eq "wait on a dead-lettered job: exit 1" "$?" 1
eq "one line per job (duplicate id once)" "$(wc -l <"$T/w1.out")" 4

python3 - "$T/w1.out" "$DB" "$PORT" <<'PY' && ok "json lines equal the SQLite rows and job hashes" || bad "json lines differ"
import json, sqlite3, subprocess, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
db = sqlite3.connect(sys.argv[2])
errs = []
ids = sorted(l["id"] for l in lines)
if ids != ["ok-1", "ok-2", "raw-1", "w/oa-1"]:
    errs.append(f"ids {ids}")
for l in lines:
    row = db.execute("SELECT status, result, prompt_tokens, completion_tokens, finish_reason, worker_id, attempts FROM jobs WHERE id = ?", (l["id"],)).fetchone()
    if row is None:
        errs.append(f"{l['id']}: no row"); continue
    st, res, pt, ct, fr, wid, att = row
    want = {"status": st, "prompt_tokens": pt, "completion_tokens": ct, "finish_reason": fr, "worker": wid, "attempts": att}
    got = {k: l.get(k) for k in want}
    if got != want:
        errs.append(f"{l['id']}: {got} != {want}")
    if l["result"] != json.loads(res):
        errs.append(f"{l['id']}: result differs: {l['result']} != {res}")
    h = subprocess.run(["redis-cli", "-p", sys.argv[3], "HGET", f"llmq:job:{l['id']}", "finished_at"], capture_output=True, text=True).stdout.strip()
    if abs(float(h) - l["finished_at"]) > 1e-6:
        errs.append(f"{l['id']}: finished_at {l['finished_at']} != hash {h}")
if errs:
    print("\n".join(errs)); sys.exit(1)
PY
grep -q "^dead-1: failed" "$T/w2.out" && ok "failed job printed" || bad "w2 printed: $(cat "$T/w2.out")"
grep -q "error: .*max_model_len" "$T/w2.out" && ok "its error printed" || bad "no error line: $(cat "$T/w2.out")"

# ---- jobs that have already ended: answered at once
t0=$(date +%s.%N)
out=$("$LLMQ" wait -c "$CFG" ok-1); rc=$?
t1=$(date +%s.%N)
eq "wait on an ended job: exit 0" "$rc" 0
python3 -c "import sys; sys.exit(0 if $t1 - $t0 < 3 else 1)" && ok "at once" || bad "took $(python3 -c "print($t1 - $t0)") s"
echo "$out" | head -1 | grep -q "^ok-1: completed (length), [0-9]* prompt + 8 completion tokens" && ok "text header line" || bad "header: $out"
want=$(sql "SELECT output FROM jobs WHERE id = 'ok-1'" | sed 's/^/  /')
eq "text: the output indented" "$(echo "$out" | tail -n +2)" "$want"
rcli DEL llmq:job:ok-2 >/dev/null # as if result_ttl_s had passed
out=$("$LLMQ" wait -c "$CFG" --format json ok-2); eq "hash expired: from SQLite, exit 0" "$?" 0
eq "its status" "$(echo "$out" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["status"], d["result"]["status"])')" "completed completed"
out=$("$LLMQ" wait -c "$CFG" ok-1 dead-1 >/dev/null 2>&1); eq "one of two failed: exit 1" "$?" 1
out=$(env -u LLMQ_CONFIG "$LLMQ" wait --redis "$URL" --db "$DB" --format json w/oa-1); eq "--redis and --db without a config" "$?" 0
eq "openai result line" "$(echo "$out" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["result"]["custom_id"], d["result"]["response"]["status_code"])')" "oa-1 200"

# ---- timeouts: a job nobody runs, an id nobody knows
echo '{"id": "later", "prompt": "nobody runs me", "max_tokens": 2}' | "$LLMQ" enqueue -c "$CFG" - 2>/dev/null
t0=$(date +%s.%N)
"$LLMQ" wait -c "$CFG" --timeout 1 later ok-1 >"$T/w3.out" 2>"$T/w3.err"; rc=$?
t1=$(date +%s.%N)
eq "timeout: exit 124" "$rc" 124
python3 -c "import sys; d = $t1 - $t0; sys.exit(0 if 0.9 <= d < 4 else 1)" && ok "after about a second" || bad "took $(python3 -c "print($t1 - $t0)") s"
grep -q "still pending: later" "$T/w3.err" && ok "pending job named" || bad "stderr: $(cat "$T/w3.err")"
grep -q "^ok-1: completed" "$T/w3.out" && ok "the finished one printed anyway" || bad "stdout: $(cat "$T/w3.out")"
"$LLMQ" wait -c "$CFG" --timeout 0.5 no-such-job >/dev/null 2>&1; eq "unknown id: exit 124" "$?" 124

# ---- a job that ends while wait blocks, cancelled: exit 1
"$LLMQ" wait -c "$CFG" --format json later >"$T/w4.out" 2>&1 &
w4=$!
blocks() { rcli CLIENT LIST | grep -q " flags=b .*cmd=xread"; } # wait's XREAD BLOCK on the events
wait_until "wait to block on the events stream" blocks
"$LLMQ" cancel -c "$CFG" later >/dev/null
worker_start w2 --drain
worker_wait w2
wait "$w4"; eq "cancelled: exit 1" "$?" 1
eq "cancelled status" "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' "$T/w4.out")" cancelled

# ---- Ctrl-C
"$LLMQ" wait -c "$CFG" never >/dev/null 2>&1 &
w5=$!
interrupt "$w5"; wait "$w5"; eq "Ctrl-C: exit 130" "$?" 130
finish
