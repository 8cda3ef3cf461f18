#!/usr/bin/env bash
# `llmq collect --redis`: three workers (real redis-server, tiny model, CPU backend) with three
# local databases publish their rows to <p>:results; a collector writes them into one central
# database. Midway one worker and the collector are killed (-9); the worker comes back under its
# id, a second collector takes over what the first left pending. The central database ends with
# exactly one row per job, equal column for column to what `--from-db` makes of the three local
# files, and the stream is trimmed once collected. Then: two collectors of one group split the
# entries, a second group gets a copy of its own, the length cap drops and counts, `llmq status`
# shows a group's lag, and a worker without a local database (sqlite.path "") acknowledges a job
# only with its row in the stream. N jobs (default 240; tests/soak/fleet_collect.sh runs 3,000).
. "$(dirname "$0")/worker_lib.sh"
N=${FLEET_JOBS:-240}

# ---- the command line
out=$("$LLMQ" collect --redis redis://127.0.0.1:1 --group "a b" 2>&1); eq "collect: bad --group" "$?" 2
out=$("$LLMQ" collect --redis redis://127.0.0.1:1 --from-db x 2>&1); eq "collect: two modes" "$?" 2
out=$("$LLMQ" collect --redis redis://127.0.0.1:1 --db "$T/x.db" --once 2>&1); eq "collect: Redis away" "$?" 69

redis_start
make_model
write_config "results_stream:" "  enabled: true"
C=$T/central.db
collector() { # collector NAME [options]: in the background, pid in C_<NAME>, log $T/NAME.log
  local name=$1; shift
  "$LLMQ" collect -c "$CFG" --stream --db "$C" --group central --consumer "$name" --claim-idle-ms 1000 \
    --batch-size 16 "$@" >"$T/$name.log" 2>&1 &
  WORKER_PIDS+=("$!")
  printf -v "C_$name" '%s' "$!"
}
crows() { local n; n=$(sqlite3 "$C" "SELECT count(*) FROM jobs" 2>/dev/null); echo "${n:-0}"; }
crows_at_least() { [ "$(crows)" -ge "$1" ]; }
hrows_at_least() { local n; n=$(sqlite3 "$T/$1.db" "SELECT count(*) FROM jobs" 2>/dev/null); [ "${n:-0}" -ge "$2" ]; }

jobs_file "$T/jobs.jsonl" "$N" j '{"max_tokens": 2, "temperature": 0}'
push_file "$T/jobs.jsonl"
collector c1
SMALL=(--max-num-seqs 4 --short-max-num-seqs 4) # each holds a few jobs: all three get work
for w in w1 w2 w3; do worker_start "$w" --drain --db "$T/$w.db" "${SMALL[@]}"; done
wait_until "w2 to commit rows" hrows_at_least w2 10
kill -9 "$W_w2"; wait "$W_w2" 2>/dev/null
worker_start w2 --drain --db "$T/w2.db" "${SMALL[@]}" # the same id: it takes back its list (committed rows acknowledged)
wait_until "the collector to write $((N / 4)) rows" crows_at_least $((N / 4))
kill -9 "$C_c1"; wait "$C_c1" 2>/dev/null
C1_ROWS=$(crows)
for w in w1 w2 w3; do worker_wait "$w"; eq "worker $w --drain exit status" "$WRC" 0; done
collector c2 --once
wait_until "collector c2 to exit" exited "$C_c2"
wait "$C_c2"; eq "collector c2 --once exit status" "$?" 0
grep -q "claimed" "$T/c2.log" || bad "collector c2 printed no summary: $(cat "$T/c2.log")"
echo "local rows: w1 $(sqlite3 "$T/w1.db" "SELECT count(*) FROM jobs"), w2 $(sqlite3 "$T/w2.db" "SELECT count(*) FROM jobs"), w3 $(sqlite3 "$T/w3.db" "SELECT count(*) FROM jobs"); central before c1's kill: $C1_ROWS; $(cat "$T/c2.log")"

# the reference: the three local files merged into an empty database
"$LLMQ" collect --db "$T/merged.db" --from-db "$T/w1.db" --from-db "$T/w2.db" --from-db "$T/w3.db" --quiet
eq "collect --from-db exit status" "$?" 0
eq "central rows" "$(crows)" "$N"
eq "distinct ids" "$(sqlite3 "$C" "SELECT count(DISTINCT id) FROM jobs")" "$N"
eq "all completed" "$(sqlite3 "$C" "SELECT count(*) FROM jobs WHERE status = 'completed'")" "$N"
jobs_of() { sqlite3 -batch "$1" "SELECT * FROM jobs ORDER BY id"; }
eq "central rows = the merge of the local files, every column" "$(jobs_of "$C" | sha256sum)" "$(jobs_of "$T/merged.db" | sha256sum)"
[ "$(sqlite3 "$C" "SELECT count(*) FROM workers")" -ge 3 ] && ok "workers rows collected" || bad "workers rows: $(sqlite3 "$C" "SELECT id FROM workers")"
[ "$(sqlite3 "$C" "SELECT count(*) FROM worker_metrics")" -ge 3 ] && ok "metrics rows collected" || bad "no metrics rows collected"
eq "nothing pending in the group" "$(rcli XPENDING llmq:results central | head -1)" 0
eq "the results stream is trimmed" "$(rcli XLEN llmq:results)" 0

# ---- two collectors of one group split the entries; a second group gets a copy
rcli XGROUP CREATE llmq:results copy '$' >/dev/null
rcli XGROUP CREATE llmq:metrics copy '$' >/dev/null
jobs_file "$T/more.jsonl" 40 m '{"max_tokens": 2, "temperature": 0}'
push_file "$T/more.jsonl"
collector s1; collector s2
# both waiting in XREADGROUP before the rows come: each is served from the same adds
consumers_up() { local c; c=$(rcli XINFO CONSUMERS llmq:results central | grep -c -x -e s1 -e s2); [ "$c" = 2 ]; }
wait_until "collectors s1 and s2 to read the group" consumers_up
worker_start w4 --drain --db "$T/w4.db"
worker_wait w4; eq "worker w4 exit status" "$WRC" 0
wait_until "the central group to take all 40" crows_at_least $((N + 40))
interrupt "$C_s1"; interrupt "$C_s2"; wait "$C_s1" "$C_s2" 2>/dev/null
n1=$(grep -o '^llmq collect: [0-9]*' "$T/s1.log" | grep -o '[0-9]*$'); n2=$(grep -o '^llmq collect: [0-9]*' "$T/s2.log" | grep -o '[0-9]*$')
[ "${n1:-0}" -gt 0 ] && [ "${n2:-0}" -gt 0 ] && ok "both collectors of the group had entries ($n1, $n2)" || bad "no split: $n1 / $n2"
eq "lag of group copy in llmq status" "$("$LLMQ" status -c "$CFG" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print([g["lag"] for g in d["collect"]["results"]["groups"] if g["name"] == "copy"][0])')" 40
"$LLMQ" collect -c "$CFG" --stream --db "$T/copy.db" --group copy --once --quiet; eq "collect group copy" "$?" 0
eq "group copy: its own 40 rows" "$(sqlite3 "$T/copy.db" "SELECT count(*) FROM jobs")" 40
eq "after both groups: trimmed" "$(rcli XLEN llmq:results)" 0

# ---- the cap: no collector, 30 jobs, max_len 10: 20 dropped and counted
rcli XGROUP DESTROY llmq:results copy >/dev/null
write_config "results_stream:" "  enabled: true" "  max_len: 10"
jobs_file "$T/cap.jsonl" 30 k '{"max_tokens": 2, "temperature": 0}'
push_file "$T/cap.jsonl"
worker_start w5 --drain --db "$T/w5.db"
worker_wait w5; eq "worker w5 exit status" "$WRC" 0
eq "capped stream length" "$(rcli XLEN llmq:results)" 10
eq "dropped entries counted" "$(rcli HGET llmq:stream-dropped results)" 20
"$LLMQ" status -c "$CFG" | grep -q "dropped 20" && ok "status shows the dropped entries" || bad "status: $("$LLMQ" status -c "$CFG" 2>&1 | tail -5)"

# ---- no local database: the row is in the stream when the job is acknowledged
rcli DEL llmq:results llmq:stream-dropped >/dev/null
write_config "results_stream:" "  enabled: true"
sed -i "s|^  path: \"$DB\"|  path: \"\"|" "$CFG"
"$LLMQ" config -c "$CFG" >/dev/null; eq "sqlite.path \"\" with results_stream" "$?" 0
grep -v -e '^results_stream:' -e '^  enabled: true' "$CFG" >"$T/nostream.yaml"
out=$("$LLMQ" config -c "$T/nostream.yaml" 2>&1); eq "sqlite.path \"\" without results_stream: refused" "$?" 1
grep -q 'results_stream.enabled' <<<"$out" || bad "the refusal does not name results_stream.enabled: $out"
jobs_file "$T/nodb.jsonl" 12 n '{"max_tokens": 2, "temperature": 0}'
push_file "$T/nodb.jsonl"
worker_start w6 --drain
worker_wait w6; eq "worker w6 (no database) exit status" "$WRC" 0
eq "no database file written" "$(ls "$T" | grep -c '^results.db')" 0
eq "12 rows in the stream" "$(rcli XLEN llmq:results)" 12
eq "12 completed hashes" "$(for i in $(seq 0 11); do rcli HGET "llmq:job:n$i" status; done | grep -c completed)" 12
# and two entries no collector can write (no row; a row SQLite refuses): skipped, not stuck
rcli XADD llmq:results '*' id x1 worker w0 >/dev/null
rcli XADD llmq:results '*' id x2 worker w0 row '{"id":"x2","status":"completed","finished_at":1,"params":"{not json"}' >/dev/null
# a collector that read 5 entries and died before acknowledging them: claimed once idle
rcli XGROUP CREATE llmq:results central 0 >/dev/null # (the stream was deleted above, with its groups)
rcli XREADGROUP GROUP central gone COUNT 5 STREAMS llmq:results '>' >/dev/null
eq "5 entries pending on the dead consumer" "$(rcli XPENDING llmq:results central | head -1)" 5
out=$("$LLMQ" collect -c "$CFG" --stream --db "$T/nodb.db" --group central --once --json --claim-idle-ms 500 2>"$T/nodb.err")
eq "collect the no-database rows" "$?" 0
eq "their rows" "$(sqlite3 "$T/nodb.db" "SELECT count(*) FROM jobs WHERE status = 'completed' AND worker_id = 'w6'")" 12
eq "the two bad entries skipped" "$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["jobs_written"], d["malformed"])' "$out")" "12 2"
eq "no row for them" "$(sqlite3 "$T/nodb.db" "SELECT count(*) FROM jobs WHERE id LIKE 'x%'")" 0
grep -q "refused" "$T/nodb.err" && ok "the refused row is reported" || bad "no report of the refused row: $(cat "$T/nodb.err")"
eq "the stream is empty after them" "$(rcli XLEN llmq:results)" 0
eq "the dead consumer's 5 entries were claimed" "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["claimed"])' "$out")" 5
finish
