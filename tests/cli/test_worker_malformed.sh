#!/usr/bin/env bash
# 500 jobs pushed by redis-cli, a tenth of them malformed in different ways (not JSON, wrong
# types, unknown fields, empty prompt, prompt over max_model_len, huge max_tokens, bad UTF-8 and
# escapes, too deep, too large, bad OpenAI lines): every good job gets exactly one completed row,
# every bad one a failed row with a clear error and an entry in llmq:dead, and the worker stays up.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config
export LLMQ_MODEL_MAX_MODEL_LEN=256 LLMQ_QUEUES_MAX_JOB_BYTES=64KiB

python3 - "$T/jobs.bin" "$T/expect.json" <<'PY'
import json, random, sys
random.seed(7)
long_prompt = "word " * 400          # ~2000 byte tokens: over max_model_len 256
bad = [
    (b"this is not json", "invalid JSON"),
    (b'{"id": "x1", "prompt": "a", "max_tokens": "5"}', "max_tokens"),
    (b'{"id": "x2", "prompt": 17}', "prompt"),
    (b'{"id": "x3", "prompt": "a", "colour": "red"}', "unknown field 'colour'"),
    (b'{"id": "x4", "prompt": ""}', "prompt"),
    (('{"id": "x5", "prompt": "%s"}' % long_prompt).encode(), "max_model_len"),
    (b'{"id": "x6", "prompt": "a", "max_tokens": 100000000}', "max_model_len"),
    (b'{"id": "x7", "prompt": "bad \\ud800 surrogate"}', "invalid JSON"),
    (b'{"id": "x8", "prompt": "bad \xff\xfe utf8"}', "invalid JSON"),
    (b'{"id": "x9", "prompt": "a", "stop": [1, 2]}', "stop"),
    (b'[1, 2, 3]', "invalid JSON"),
    ((b'{"id": "x11", "prompt": "a", "metadata": ' + b'[' * 40 + b']' * 40 + b'}'), "invalid JSON"),
    (('{"id": "x12", "prompt": "%s"}' % ("y" * 70000)).encode(), "max_job_bytes"),
    (b'{"custom_id": "x13", "method": "POST", "url": "/v1/embeddings", "body": {"input": "a"}}', "url"),
    (b'{"custom_id": "x14", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [], "n": 2}}', "body"),
    (b'{"id": "x15", "messages": [{"role": "", "content": "hi"}]}', "role"),
    (b'{"id": "x16", "prompt": "a", "temperature": -1}', "temperature"),
    (b'{"id": "x17", "prompt": "a", "top_p": 0}', "top_p"),
    (b'{"id": "x18", "prompt": "a", "prompt": "b"}', "duplicate"),
    (b'{"id": "x19", "prompt": "a", "max_tokens": -3}', "max_tokens"),
]
lines, expect = [], {"good": [], "bad": []}
nbad = 0
for i in range(500):
    if i % 10 == 3:
        raw, why = bad[nbad % len(bad)]
        # give each bad job its own id where it has one, so rows can be matched
        raw = raw.replace(b'"x', b'"bad%d-x' % nbad, 1) if b'"x' in raw[:40] else raw
        lines.append(raw)
        expect["bad"].append({"raw": raw.decode("utf-8", "replace")[:60], "why": why})
        nbad += 1
    else:
        jid = "g%d" % i
        lines.append(json.dumps({"id": jid, "prompt": "Summarize %d: %s" % (i, "lorem ipsum " * random.randint(0, 3)),
                                 "max_tokens": random.randint(1, 6), "temperature": 0}).encode())
        expect["good"].append(jid)
open(sys.argv[1], "wb").write(b"\n".join(lines) + b"\n")
json.dump(expect, open(sys.argv[2], "w"))
PY
push_file "$T/jobs.bin"
eq "500 jobs queued" "$(rcli LLEN llmq:queue:short)" 500
worker_start w1 --drain
worker_wait w1
eq "worker exit status: jobs failed" "$WRC" 3
eq "one row per job" "$(rows)" 500
eq "450 completed" "$(sql "SELECT count(*) FROM jobs WHERE status = 'completed'")" 450
eq "50 failed" "$(sql "SELECT count(*) FROM jobs WHERE status = 'failed'")" 50
eq "50 dead letters" "$(rcli LLEN llmq:dead)" 50
eq "no job left in Redis lists" "$(rcli LLEN llmq:queue:short)/$(rcli LLEN llmq:processing:w1)/$(rcli ZCARD llmq:retry)" "0/0/0"
python3 - "$DB" "$T/expect.json" "$PORT" <<'PY' && ok "every good job completed once, every bad one failed with its reason and dead-lettered" || bad "rows do not match the jobs"
import json, sqlite3, subprocess, sys
db = sqlite3.connect(sys.argv[1])
exp = json.load(open(sys.argv[2]))
errs = []
rows = {r[0]: r for r in db.execute("SELECT id, status, error, completion_tokens, attempts FROM jobs")}
for g in exp["good"]:
    r = rows.get(g)
    if not r or r[1] != "completed" or r[3] < 1 or r[4] != 1:
        errs.append(("good", g, r))
failed = [r for r in rows.values() if r[1] == "failed"]
whys = sorted(r[2] for r in failed)
for b in exp["bad"]:
    hit = [w for w in whys if b["why"] in w]
    if not hit:
        errs.append(("bad: no failed row with", b["why"], b["raw"]))
for r in failed:
    if not r[2] or len(r[2]) < 10:
        errs.append(("unclear error", r))
dead = subprocess.run(["redis-cli", "-p", sys.argv[3], "LRANGE", "llmq:dead", "0", "-1"], capture_output=True).stdout
entries = [json.loads(l) for l in dead.decode("utf-8", "replace").splitlines() if l.strip()]
dead_errors = sorted(e["error"] for e in entries)
if dead_errors != whys:
    errs.append(("dead list errors differ from the rows'", dead_errors[:3], whys[:3]))
for e in entries:
    if not e.get("job"):
        errs.append(("dead entry without the job", e))
if errs:
    for e in errs[:10]:
        print(e)
    sys.exit(1)
PY
eq "bad job's hash says failed" "$(rcli HGET llmq:job:bad3-x3 status)" failed
grep -q "dead-lettered" "$T/w1.log" && ok "dead letters are logged" || bad "no log line for dead letters"
finish
