#!/usr/bin/env bash
# Map-reduce summary jobs ("document" + "summarize") through real workers, Redis and SQLite on the
# CPU backend: a tiny random Qwen3 with the real Qwen3 tokenizer and max_model_len 512, documents of
# about 5 and 50 contexts in English and in Chinese. Checked: one row per job, with usage.chunks and
# usage.depth matching the committed parts (job_parts); chunks that cover the document in order with
# overlap and never split a UTF-8 character; levels that shrink (a tree); the same summaries from
# `llmq run`. A worker killed with -9 between levels is resumed by the next one without computing
# its committed parts again. Cancel and timeout_s stop a job's parts, llmq status shows the parts,
# the final step is under the job's constraint, and sizes that cannot work fail clearly.
. "$(dirname "$0")/worker_lib.sh"
QTOK=${LLMQ_ASSETS:-}/qwen3-tokenizer
[ -f "$QTOK/tokenizer.json" ] || { echo "SKIPPED: no Qwen3 tokenizer in \$LLMQ_ASSETS (tests/assets/fetch.sh)"; exit 77; }
redis_start
make_model --tokenizer "$QTOK"
write_config
sed -i "s|^  path: \"$M\"|&\n  max_model_len: 512|" "$CFG"
sed -i "s|^queues:|&\n  long_threshold_tokens: 400|" "$CFG"

# docs: en5, zh5 (about 5 contexts), en50 (about 50), made by a seeded generator
python3 - "$T" <<'PY'
import json, random, sys
d = sys.argv[1]
random.seed(7)
words = ("report budget council river station energy market harbour school village engineer museum "
         "winter policy tunnel bridge record season archive garden").split()
zh = ["委员会在周一讨论了新的预算方案。", "河边的车站将在明年春天重新开放。", "工程师们提出了三个不同的建议！",
      "市场的价格在冬季有所上升。", "学校决定扩建图书馆和实验室？", "档案馆保存了这个村庄一百年的记录。",
      "新的隧道缩短了两座城市之间的距离，", "博物馆的展览吸引了很多游客；"]
def en(n):
    paras = []
    while sum(len(p) for p in paras) < n:
        sents = []
        for _ in range(random.randint(2, 6)):
            s = " ".join(random.choice(words) for _ in range(random.randint(5, 14)))
            sents.append(s.capitalize() + random.choice([".", ".", "!", "?"]))
        paras.append(" ".join(sents))
    return "\n\n".join(paras)
def cn(n):
    paras = []
    while sum(len(p.encode()) for p in paras) < n:
        paras.append("".join(random.choice(zh) for _ in range(random.randint(3, 8))))
    return "\n\n".join(paras)
docs = {"en5": en(13000), "zh5": cn(11000), "en50": en(130000)}  # about 2.6k, 2.6k and 26k tokens
for k, v in docs.items():
    open(f"{d}/{k}.txt", "w").write(v)
with open(f"{d}/jobs.jsonl", "w") as f:
    for k in ("en5", "zh5"):
        f.write(json.dumps({"id": k, "document": docs[k], "max_tokens": 24, "ignore_eos": True,
                            "temperature": 0, "summarize": {"max_tokens": 12, "chunk_tokens": 300,
                                                            "overlap_tokens": 20}}) + "\n")
PY
"$LLMQ" enqueue -c "$CFG" "$T/jobs.jsonl" >/dev/null 2>"$T/enq.log" || bad "enqueue: $(cat "$T/enq.log")"
# the big one through --map-reduce, with the default chunk size (what 512 leaves)
"$LLMQ" enqueue -c "$CFG" --map-reduce --id en50 --var document=@"$T/en50.txt" --set max_tokens=16 \
  --set ignore_eos=true --set temperature=0 --set summarize='{"max_tokens": 40}' >/dev/null 2>>"$T/enq.log" ||
  bad "enqueue --map-reduce: $(cat "$T/enq.log")"
eq "all three wait in the short queue (a worker moves them to the long one)" "$(rcli LLEN llmq:queue:short)" 3

# w1 runs two parts at a time and is killed between levels: en50's chunks are all summarized and
# the first summary of level 1 is committed
LLMQ_WORKER_HEARTBEAT_TTL_S=3 worker_start w1 --max-num-seqs 2
level1() { [ "$(sql "SELECT count(*) FROM job_parts WHERE job_id = 'en50' AND level = 1")" -ge 1 ] 2>/dev/null; }
wait_until "en50 to commit a part of level 1" level1
kill -9 "$W_w1"
wait "$W_w1" 2>/dev/null
snap=$(sql "SELECT level, part, created_at FROM job_parts WHERE job_id = 'en50' ORDER BY level, part")
nsnap=$(echo "$snap" | grep -c .)
total0=$(sql "SELECT count(*) FROM jobs WHERE id = 'en50'")
echo "killed w1 with $nsnap parts of en50 committed"
eq "en50 was not finished when w1 died" "$total0" 0

worker_start w2 --drain
worker_wait w2
eq "w2 exit status" "$WRC" 0
eq "one row per job" "$(sql "SELECT group_concat(id || ':' || status, ' ') FROM (SELECT id, status FROM jobs ORDER BY id)")" \
  "en5:completed en50:completed zh5:completed"
eq "w2 resumed en50 at level 1 from its committed parts" "$(log_count w2 'job en50: resuming at level 1 ')" 1
eq "the parts w1 committed were not computed again" \
  "$(sql "SELECT level, part, created_at FROM job_parts WHERE job_id = 'en50' AND worker_id = 'w1' ORDER BY level, part")" "$snap"
eq "w2 computed no chunk of en50 again" \
  "$(sql "SELECT count(*) FROM job_parts WHERE job_id = 'en50' AND level = 0 AND worker_id = 'w2'")" 0
eq "... and only the level-1 parts w1 had not committed" \
  "$(sql "SELECT count(*) FROM job_parts WHERE job_id = 'en50' AND level = 1 AND worker_id = 'w1'")" \
  "$(echo "$snap" | grep -c '^1|')"

# per job: usage.chunks = level-0 parts, usage.depth = stored levels + the root; levels shrink;
# chunks cover the document in order, overlap, and are whole UTF-8 text
for id in en5 zh5 en50; do
  sql "SELECT result FROM jobs WHERE id = '$id'" >"$T/$id.res"
  python3 - "$T/$id.res" "$DB" "$id" "$T/$id.txt" <<'PY' && ok "$id: tree and chunks check out" || bad "$id: tree or chunks"
import json, sqlite3, sys
res = json.loads(open(sys.argv[1]).readline())
db = sqlite3.connect(sys.argv[2])
doc = open(sys.argv[4], "rb").read()
rows = db.execute("SELECT level, part, first, last, doc_start, doc_end, output FROM job_parts "
                  "WHERE job_id = ? ORDER BY level, part", (sys.argv[3],)).fetchall()
levels = {}
for r in rows:
    levels.setdefault(r[0], []).append(r)
u = res["usage"]
err = []
if u["chunks"] != len(levels.get(0, [])): err.append(f"chunks {u['chunks']} vs {len(levels.get(0, []))} level-0 parts")
if u["depth"] != len(levels) + 1: err.append(f"depth {u['depth']} vs {len(levels)} stored levels + the root")
if sorted(levels) != list(range(len(levels))): err.append("levels not 0..n-1")
for l in range(1, len(levels)):
    below, here = levels[l - 1], levels[l]
    if len(here) * 2 > len(below) + 1: err.append(f"level {l} does not shrink: {len(here)} of {len(below)}")
    if here[0][2] != 0 or here[-1][3] != len(below) - 1: err.append(f"level {l} does not cover level {l-1}")
    for a, b in zip(here, here[1:]):
        if b[2] != a[3] + 1: err.append(f"level {l}: groups not consecutive")
top = levels[len(levels) - 1] if levels else []
if len(top) < 2 and len(levels) > 0: err.append("the last stored level has one part: it should have been the root")
ch = levels.get(0, [])
if ch and (ch[0][4] != 0 or ch[-1][5] != len(doc)): err.append(f"chunks cover {ch[0][4]}..{ch[-1][5]} of {len(doc)}")
for a, b in zip(ch, ch[1:]):
    if not (a[4] < b[4] < a[5] <= b[5]): err.append(f"chunks {a[1]}, {b[1]}: {a[4]}-{a[5]}, {b[4]}-{b[5]} not in order with overlap")
for c in ch:
    try: doc[c[4]:c[5]].decode("utf-8")
    except UnicodeDecodeError: err.append(f"chunk {c[1]} splits a UTF-8 character")
if res["finish_reason"] != "length": err.append(f"finish_reason {res['finish_reason']} (ignore_eos: every part is cut)")
if not res["text"]: err.append("no text")
print(sys.argv[3], "chunks", u["chunks"], "depth", u["depth"], "levels", [len(levels[l]) for l in sorted(levels)], *err)
sys.exit(1 if err else 0)
PY
done
# llmq run gives the same summaries (greedy; a part's output does not depend on its batch)
"$LLMQ" run --backend cpu --model "$M" --max-model-len 512 --threads 1 -i "$T/jobs.jsonl" -o "$T/run.jsonl" \
  2>"$T/run.log" || bad "llmq run: $(tail -3 "$T/run.log")"
python3 - "$T/run.jsonl" "$DB" <<'PY' && ok "llmq run: the same texts and usage as the worker's rows" || bad "llmq run differs"
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[2])
for line in open(sys.argv[1]):
    r = json.loads(line)
    w = json.loads(db.execute("SELECT result FROM jobs WHERE id = ?", (r["id"],)).fetchone()[0])
    if (r["text"], r["usage"]) != (w["text"], w["usage"]):
        print(r["id"], r.get("usage"), w.get("usage")); sys.exit(1)
PY
eq "en50 has three levels or more (50 contexts)" "$(sql "SELECT count(DISTINCT level) >= 2 FROM job_parts WHERE job_id = 'en50'")" 1
eq "en5 is one reduce away (5 contexts)" "$(sql "SELECT max(level) FROM job_parts WHERE job_id = 'en5'")" 0

# cancel in the middle of a document, a timeout, a context too small, a model without room
python3 - "$T" <<'PY'
import json, sys
d = sys.argv[1]
doc = open(f"{d}/en50.txt").read()
with open(f"{d}/jobs2.jsonl", "w") as f:
    f.write(json.dumps({"id": "cx", "document": doc, "summarize": {"max_tokens": 8}, "max_tokens": 8,
                        "ignore_eos": True}) + "\n")
    f.write(json.dumps({"id": "slow", "document": doc[:20000], "summarize": {}, "max_tokens": 8,
                        "timeout_s": 0.001}) + "\n")
    f.write(json.dumps({"id": "tight", "document": doc[:3000], "summarize": {"max_tokens": 300},
                        "max_tokens": 8}) + "\n")
    f.write(json.dumps({"id": "toolong", "document": doc[:3000], "summarize": {"chunk_tokens": 5000},
                        "max_tokens": 8}) + "\n")
    f.write(json.dumps({"id": "choice", "document": doc[:8000], "summarize": {"max_tokens": 8},
                        "choice": ["positive", "negative"], "max_tokens": 8}) + "\n")
PY
"$LLMQ" enqueue -c "$CFG" "$T/jobs2.jsonl" >/dev/null 2>>"$T/enq.log" || bad "enqueue jobs2"
worker_start w3 --max-num-seqs 2
started() { [ "$(rcli HGET llmq:job:cx parts_done)" -ge 1 ] 2>/dev/null; }
wait_until "cx to finish a part" started
"$LLMQ" status -c "$CFG" --json >"$T/status.json" 2>/dev/null
python3 - "$T/status.json" <<'PY' && ok "llmq status shows cx's parts" || bad "llmq status: $(head -c 600 "$T/status.json")"
import json, sys
jobs = {j["id"]: j for j in json.load(open(sys.argv[1]))["jobs"]}
cx = jobs["cx"]
assert cx["parts_total"] >= cx["parts_done"] >= 1 and cx["level"] == 0, cx
PY
"$LLMQ" cancel -c "$CFG" cx >/dev/null 2>&1
is_cancelled() { [ "$(sql "SELECT status FROM jobs WHERE id = 'cx'")" = cancelled ]; }
wait_until "cx to be cancelled" is_cancelled
n1=$(sql "SELECT count(*) FROM job_parts WHERE job_id = 'cx'")
others_done() { [ "$(rows)" -ge 8 ]; }
wait_until "the other jobs to end" others_done
eq "cx: no part committed after its cancellation" "$(sql "SELECT count(*) FROM job_parts WHERE job_id = 'cx'")" "$n1"
eq "cx's hash" "$(rcli HGET llmq:job:cx status)" "cancelled"
eq "slow: timed out" "$(sql "SELECT error_code FROM jobs WHERE id = 'slow'")" "timeout"
eq "tight: a reduce step cannot hold two summaries" "$(sql "SELECT error_code FROM jobs WHERE id = 'tight'")" \
  "context_length_exceeded"
case "$(sql "SELECT error FROM jobs WHERE id = 'toolong'")" in
  *"summarize.chunk_tokens': 5000 does not fit"*) ok "toolong: chunk_tokens over the context is refused";;
  *) bad "toolong: $(sql "SELECT error_code, error FROM jobs WHERE id = 'toolong'")";;
esac
eq "choice: the final step is under the job's constraint" \
  "$(sql "SELECT status, output IN ('positive', 'negative'), json_extract(result, '\$.usage.chunks') > 1 FROM jobs WHERE id = 'choice'")" \
  "completed|1|1"
eq "the worker is still running" "$(kill -0 "$W_w3" 2>/dev/null && echo yes)" yes
interrupt "$W_w3"
worker_wait w3
finish
