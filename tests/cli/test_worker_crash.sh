#!/usr/bin/env bash
# kill -9 of a worker in the middle of a batch, then a second worker: nothing is lost and nothing
# is done twice beyond the crashed worker's own jobs. Every row's output equals `llmq run`'s on
# the same (greedy) jobs, so a replayed job is also a correct one.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config
N=300
python3 - "$T/jobs.jsonl" "$N" <<'PY'
import json, random, sys
random.seed(3)
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({"id": "c%d" % i, "prompt": "Document %d: %s" % (i, "text " * random.randint(1, 20)),
                            "max_tokens": random.randint(60, 160), "ignore_eos": True, "temperature": 0}) + "\n")
PY
"$LLMQ" enqueue -c "$CFG" "$T/jobs.jsonl" 2>/dev/null || bad "enqueue"
# w1's heartbeat outlives it by 10 s (not the shared 2 s), so that it is still there when checked
# below however slow the machine is; w2 reaps w1's jobs once it has lapsed
LLMQ_WORKER_HEARTBEAT_TTL_S=10 worker_start w1 --max-num-seqs 32
wait_rows 60
kill -9 "$W_w1"
wait "$W_w1" 2>/dev/null
held=$(rcli LLEN llmq:processing:w1)
before=$(rows)
echo "killed w1 with $held jobs in its processing list and $before rows written"
[ "$held" -gt 0 ] && ok "w1 held jobs when killed" || bad "w1 held nothing when killed (test too slow?)"
[ "$before" -lt "$N" ] && ok "killed mid-batch" || bad "w1 had finished everything"
eq "w1's heartbeat is still there" "$(rcli EXISTS llmq:worker:w1)" 1

# a drain worker waits for w1's list, reaps it once the heartbeat has lapsed and runs the rest
worker_start w2 --drain
worker_wait w2
eq "w2 exit status" "$WRC" 0
eq "one row per job" "$(rows)" "$N"
eq "distinct ids" "$(sql "SELECT count(DISTINCT id) FROM jobs")" "$N"
eq "all completed" "$(sql "SELECT count(*) FROM jobs WHERE status = 'completed'")" "$N"
eq "w1's list reaped" "$(rcli LLEN llmq:processing:w1)" 0
eq "queue empty" "$(rcli LLEN llmq:queue:short)" 0
eq "nothing dead" "$(rcli LLEN llmq:dead)" 0
replayed=$(sql "SELECT count(*) FROM jobs WHERE attempts > 1")
[ "$replayed" -ge 1 ] && [ "$replayed" -le "$held" ] && ok "replays ($replayed) only of w1's held jobs ($held)" ||
  bad "$replayed replayed jobs, w1 held $held"
eq "replays written by w2" "$(sql "SELECT count(*) FROM jobs WHERE attempts > 1 AND worker_id = 'w2'")" "$replayed"
grep -q "reaper: 1 lapsed worker" "$T/w2.log" && ok "the reaper's log line" || bad "no reaper log line"
# completion events per job: more than one only for w1's held jobs
python3 - "$PORT" "$held" <<'PY' && ok "completed at most once except w1's held jobs" || bad "jobs completed twice"
import subprocess, sys, collections
out = subprocess.run(["redis-cli", "-p", sys.argv[1], "--no-raw", "XRANGE", "llmq:events", "-", "+"],
                     capture_output=True, text=True).stdout
# --no-raw prints fields as "N) value"; collect (id, status) pairs
vals = [l.split(") ", 1)[1].strip('"') for l in out.splitlines() if ") " in l]
done = collections.Counter()
for i in range(len(vals) - 3):
    if vals[i] == "id" and vals[i + 2] == "status" and vals[i + 3] == "completed":
        done[vals[i + 1]] += 1
twice = [k for k, v in done.items() if v > 1]
print("jobs completed twice:", len(twice))
sys.exit(0 if len(twice) <= int(sys.argv[2]) else 1)
PY
"$LLMQ" run --model "$M" --input "$T/jobs.jsonl" --output "$T/run.jsonl" --backend cpu --threads 1 2>/dev/null
python3 - "$T/run.jsonl" "$DB" <<'PY' && ok "every output equals llmq run's" || bad "outputs differ from llmq run's"
import json, sqlite3, sys
want = {}
for l in open(sys.argv[1]):
    r = json.loads(l)
    want[r["id"]] = (r["text"], r["usage"]["completion_tokens"])
got = {r[0]: (r[1], r[2]) for r in sqlite3.connect(sys.argv[2]).execute("SELECT id, output, completion_tokens FROM jobs")}
diff = [k for k in want if got.get(k) != want[k]]
print("differ:", diff[:5])
sys.exit(1 if diff or len(got) != len(want) else 0)
PY
finish
