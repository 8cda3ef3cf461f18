#!/usr/bin/env bash
# `llmq collect --from-db`: three workers drain one queue into three databases of their own (real
# redis-server, tiny model, CPU backend); merging them into an empty database gives their union,
# merging again changes nothing (a dump before and after), the order of the sources does not
# matter, a job in two sources with different statuses ends as the upsert rules say, the sources
# are never changed, a source with an older schema is read through a migrated copy, and a source
# that is the target, newer, missing or not an llmq database is refused, naming the file.
. "$(dirname "$0")/worker_lib.sh"
SRC=${LLMQ_SOURCE_DIR:?run through ctest (LLMQ_SOURCE_DIR is not set)}

# ---- the command line
out=$("$LLMQ" collect --help); eq "collect --help" "$?" 0
grep -q "Usage: llmq collect" <<<"$out" || bad "collect --help has no Usage line"
out=$("$LLMQ" collect 2>&1); eq "collect without --from-db" "$?" 2
grep -q -- "--from-db FILE" <<<"$out" || bad "missing --from-db not explained: $out"
out=$("$LLMQ" collect --from-db x --format yaml 2>&1); eq "collect: bad --format" "$?" 2
out=$("$LLMQ" collect --from-db x stray 2>&1); eq "collect: stray argument" "$?" 2
out=$("$LLMQ" collect --frm-db x 2>&1); eq "collect: unknown option" "$?" 2
grep -q "did you mean --from-db" <<<"$out" || bad "unknown option not explained: $out"

# ---- three worker databases, made by real workers draining one queue
redis_start
make_model
write_config
# one worker after the other, so that each database gets rows: host1 four jobs of their own, host2
# two jobs of batch "nightly", host3 two more jobs appended to that batch
jobs_file "$T/jobs.jsonl" 4 j '{"max_tokens": 3, "temperature": 0}'
push_file "$T/jobs.jsonl"
worker_start w1 --drain --db "$T/host1.db"
worker_wait w1; eq "worker w1 --drain exit status" "$WRC" 0
jobs_file "$T/batch1.jsonl" 2 b '{"max_tokens": 3, "temperature": 0}'
"$LLMQ" enqueue -c "$CFG" --quiet --batch nightly "$T/batch1.jsonl" >/dev/null; eq "enqueue --batch" "$?" 0
worker_start w2 --drain --db "$T/host2.db"
worker_wait w2; eq "worker w2 --drain exit status" "$WRC" 0
jobs_file "$T/batch2.jsonl" 2 c '{"max_tokens": 3, "temperature": 0}'
"$LLMQ" enqueue -c "$CFG" --quiet --batch nightly --append "$T/batch2.jsonl" >/dev/null
eq "enqueue --batch --append" "$?" 0
worker_start w3 --drain --db "$T/host3.db"
worker_wait w3; eq "worker w3 --drain exit status" "$WRC" 0
n1=$(sqlite3 "$T/host1.db" "SELECT count(*) FROM jobs")
n2=$(sqlite3 "$T/host2.db" "SELECT count(*) FROM jobs")
n3=$(sqlite3 "$T/host3.db" "SELECT count(*) FROM jobs")
eq "rows per worker database" "$n1 $n2 $n3" "4 2 2"
echo "batch rows: $(sqlite3 "$T/host2.db" "SELECT * FROM batches") / $(sqlite3 "$T/host3.db" "SELECT * FROM batches")"
sums() { sha256sum "$T"/host[123].db; }
before=$(sums)

# jobs: every column, by id; batches likewise
dump() {
  sqlite3 -batch "$1" "SELECT * FROM jobs ORDER BY id" "SELECT * FROM batches ORDER BY id" \
    "SELECT * FROM workers ORDER BY id" "SELECT * FROM worker_metrics ORDER BY worker_id, ts"
}
union() { # the jobs rows of the three sources, by id (ids are unique across them here)
  for w in 1 2 3; do sqlite3 -batch "$T/host$w.db" "SELECT * FROM jobs"; done | sort
}

# ---- merge into an empty database: the union
C=$T/central.db
out=$("$LLMQ" collect --db "$C" --from-db "$T/host1.db" --from-db "$T/host2.db" --from-db "$T/host3.db" --json)
eq "collect exit status" "$?" 0
eq "central rows" "$(sqlite3 "$C" "SELECT count(*) FROM jobs")" 8
eq "central rows are the union" "$(sqlite3 -batch "$C" "SELECT * FROM jobs" | sort)" "$(union)"
eq "workers: the union" "$(sqlite3 "$C" "SELECT * FROM workers ORDER BY id")" "$(for w in 1 2 3; do sqlite3 "$T/host$w.db" "SELECT * FROM workers"; done)"
eq "worker_metrics: the union" "$(sqlite3 "$C" "SELECT * FROM worker_metrics" | sort)" "$(for w in 1 2 3; do sqlite3 "$T/host$w.db" "SELECT * FROM worker_metrics"; done | sort)"
[ "$(sqlite3 "$C" "SELECT count(*) FROM worker_metrics")" -ge 3 ] && ok "metrics rows merged" || bad "no metrics rows merged"
eq "the batch row, finished" "$(sqlite3 "$C" "SELECT id, total, state, finished_at IS NOT NULL FROM batches")" "nightly|4|completed|1"
eq "the batch's jobs" "$(sqlite3 "$C" "SELECT jobs, completed FROM batch_summary WHERE batch_id = 'nightly'")" "4|4"
eq "the batch row is host3's, the later" "$(sqlite3 "$C" "SELECT * FROM batches")" "$(sqlite3 "$T/host3.db" "SELECT * FROM batches")"
eq "summary: read and written" "$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["ok"], sum(s["jobs"]["read"] for s in d["sources"]), sum(s["jobs"]["written"] for s in d["sources"]), sum(s["jobs"]["kept"] for s in d["sources"]))' "$out")" "True 8 8 0"
eq "sources unchanged" "$(sums)" "$before"

# ---- merging again changes nothing
d1=$(sqlite3 "$C" .dump)
out=$("$LLMQ" collect --db "$C" --from-db "$T/host1.db" --from-db "$T/host2.db" --from-db "$T/host3.db" --json)
eq "second collect exit status" "$?" 0
eq "second collect: the dump is the same" "$(sqlite3 "$C" .dump)" "$d1"
eq "second collect: nothing written, all kept" "$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(sum(s["jobs"]["written"] for s in d["sources"]), sum(s["jobs"]["kept"] for s in d["sources"]))' "$out")" "0 8"

# ---- a job in two sources: host1's completed row, and a later failed copy with more attempts
#      (an edited copy of host1's file: what a second host that failed the same job would hold)
cp "$T/host1.db" "$T/replay.db"
jid=$(sqlite3 "$T/host1.db" "SELECT id FROM jobs ORDER BY id LIMIT 1")
sqlite3 "$T/replay.db" "UPDATE jobs SET status = 'failed', error = 'boom', error_code = 'internal_error', finished_at = finished_at + 100, attempts = 3, worker_id = 'w9' WHERE id = '$jid'; DELETE FROM jobs WHERE id <> '$jid'"
want=$(sqlite3 "$C" "SELECT status, error IS NULL, worker_id FROM jobs WHERE id = '$jid'")
"$LLMQ" collect --quiet --db "$C" --from-db "$T/replay.db" 2>"$T/err"; eq "collect of a failed replay" "$?" 0
eq "--quiet prints nothing" "$(cat "$T/err")" ""
eq "completed outranks a later failure; attempts is the larger" "$(sqlite3 "$C" "SELECT status, error IS NULL, worker_id, attempts FROM jobs WHERE id = '$jid'")" "$want|3"
# into an empty database, failed first then completed: the same row (order does not matter)
C2=$T/central2.db
"$LLMQ" collect --quiet --db "$C2" --from-db "$T/replay.db" --from-db "$T/host3.db" --from-db "$T/host2.db" --from-db "$T/host1.db"
eq "reverse order, failed copy first: exit status" "$?" 0
eq "reverse order: the same rows" "$(dump "$C2")" "$(dump "$C")"
# a later completed copy replaces an earlier completed row
sqlite3 "$T/replay.db" "UPDATE jobs SET status = 'completed', error = NULL, error_code = NULL, output = 'later', attempts = 1"
"$LLMQ" collect --quiet --db "$C" --from-db "$T/replay.db"
eq "the later completed row wins, attempts kept" "$(sqlite3 "$C" "SELECT output, worker_id, attempts FROM jobs WHERE id = '$jid'")" "later|w9|3"
d2=$(sqlite3 "$C" .dump)
"$LLMQ" collect --quiet --db "$C" --from-db "$T/host1.db"
eq "merging the earlier source again keeps the later row" "$(sqlite3 "$C" .dump)" "$d2"

# ---- a source with an older schema (migrations 001..005, as an older llmq left it)
python3 - "$SRC" "$T/old.db" <<'PY' || bad "making the old database"
import glob, sqlite3, sys
src, path = sys.argv[1:3]
db = sqlite3.connect(path)
files = sorted(glob.glob(f"{src}/schemas/[0-9][0-9][0-9]_*.sql"))[:5]
for f in files:
    db.executescript(open(f, encoding="utf-8").read())
db.execute(f"PRAGMA user_version = {len(files)}")
db.execute(f"PRAGMA application_id = {0x6c6c6d71}")
db.execute("INSERT INTO jobs (id, status, output, finished_at) VALUES ('old-1', 'completed', 'from an old host', 1.8e9)")
db.commit()
PY
old_sum=$(sha256sum "$T/old.db")
"$LLMQ" collect --quiet --db "$C" --from-db "$T/old.db"; eq "older schema: exit status" "$?" 0
eq "older schema: its row" "$(sqlite3 "$C" "SELECT output FROM jobs WHERE id = 'old-1'")" "from an old host"
eq "older schema: the source is not migrated" "$(sqlite3 "$T/old.db" "PRAGMA user_version"):$(sha256sum "$T/old.db")" "5:$old_sum"
eq "older schema: no copy left behind" "$(ls "$T" | grep -c merge-)" 0

# ---- refused sources, each named
d3=$(sqlite3 "$C" .dump)
out=$("$LLMQ" collect --db "$C" --from-db "$C" 2>&1); eq "the target as a source" "$?" 1
grep -q "$C: it is the target database itself" <<<"$out" || bad "target as source not explained: $out"
cp "$T/host1.db" "$T/newer.db"; sqlite3 "$T/newer.db" "PRAGMA user_version = 99"
out=$("$LLMQ" collect --db "$C" --from-db "$T/newer.db" 2>&1); eq "a newer source" "$?" 1
grep -q "$T/newer.db.*newer than this llmq" <<<"$out" || bad "newer source not explained: $out"
echo "not a database" >"$T/text.db"
out=$("$LLMQ" collect --db "$C" --from-db "$T/text.db" --from-db "$T/host2.db" --json 2>"$T/err"); eq "not a database" "$?" 1
grep -q "$T/text.db" "$T/err" || bad "a file that is not a database not named: $(cat "$T/err")"
eq "the next source is still merged" "$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["ok"], [s["ok"] for s in d["sources"]], d["sources"][1]["jobs"]["kept"] == d["sources"][1]["jobs"]["read"])' "$out")" "False [False, True] True"
sqlite3 "$T/other.db" "CREATE TABLE t (a)"
out=$("$LLMQ" collect --db "$C" --from-db "$T/other.db" 2>&1); eq "another program's database" "$?" 1
grep -q "$T/other.db.*not an llmq database" <<<"$out" || bad "foreign database not explained: $out"
out=$("$LLMQ" collect --db "$C" --from-db "$T/none.db" 2>&1); eq "a missing source" "$?" 1
grep -q "$T/none.db" <<<"$out" || bad "missing source not named: $out"
[ -e "$T/none.db" ] && bad "a missing source was created" || ok "a missing source is not created"
eq "refused sources change nothing" "$(sqlite3 "$C" .dump)" "$d3"
eq "sources unchanged at the end" "$(sums)" "$before"
finish
