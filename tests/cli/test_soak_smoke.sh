#!/usr/bin/env bash
# A few seconds of tests/soak/soak.sh, so the soak script and its checker keep working: two
# workers on one database, SIGTERMs and SQLite locks (faults the worker survives without running a
# job twice or counting a delivery), then the verdict must be PASS. Then the checker is shown that it
# fails: from the run's AOF and database, one completed job is dead-lettered by hand, another's row
# is deleted and a third is pushed again, and soak_check.py must report exactly those.
. "$(dirname "$0")/worker_lib.sh"
SOAK=$(dirname "$0")/../soak
OUT=$T/soak
bash "$SOAK/soak.sh" --build "$(dirname "$LLMQ")" --minutes 0.1 --workers 2 --jobs 120 --max-tokens 16 \
  --faults sigterm,sqlite_lock --interval 1-2 --db-layout shared --drain-timeout 60 --seed 3 --out "$OUT" \
  >"$T/soak.out" 2>&1
rc=$?
eq "soak exit status" "$rc" 0
grep -q "^RESULT: PASS" "$T/soak.out" && ok "verdict PASS" || { bad "verdict not PASS"; tail -40 "$T/soak.out"; }
faults=$(python3 -c 'import json, sys; print(sum(json.load(open(sys.argv[1])).values()))' "$OUT/faults.json")
[ "${faults:-0}" -ge 1 ] && ok "faults injected ($faults)" || bad "no fault injected"
eq "one row per job" "$(sqlite3 "$OUT/db/shared.db" "SELECT count(*) FROM jobs")" 120

# the checker must see a dead letter of a good job, a lost row and a job left in a queue
mkdir -p "$T/redis"
cp -r "$OUT/redis/appendonlydir" "$T/redis/"
redis_start --appendonly yes
DB=$OUT/db/shared.db
mapfile -t ids < <(sql "SELECT id FROM jobs WHERE status = 'completed' AND id LIKE 'SKs%' ORDER BY id LIMIT 3")
eq "three completed jobs to tamper with" "${#ids[@]}" 3
rcli LPUSH llmq:dead "{\"id\": \"${ids[0]}\", \"error\": \"by hand\", \"job\": \"{\\\"id\\\": \\\"${ids[0]}\\\"}\"}" >/dev/null
sql "DELETE FROM jobs WHERE id = '${ids[1]}'"
rcli LPUSH llmq:queue:short "{\"id\": \"${ids[2]}\", \"prompt\": \"again\"}" >/dev/null
python3 "$SOAK/soak_check.py" "$OUT" "$PORT" "$DB" >"$T/check.out" 2>&1
eq "checker exit status" "$?" 1
line() { grep -E "^$1: +[0-9]+$" "$T/check.out" | awk '{print $NF}'; }
eq "innocent dead letter found" "$(line "innocent dead")" 1
eq "lost job found" "$(line lost)" 1
eq "stranded job found" "$(line stranded)" 1
eq "nothing else" "$(line duplicates)/$(line "hash mismatch")" 0/0
grep -q "${ids[0]} .*by hand" "$T/check.out" && ok "the dead letter is printed with its error" || bad "dead letter not printed"
grep -q "^RESULT: FAIL (lost, innocent dead, stranded)" "$T/check.out" && ok "verdict FAIL" || { bad "verdict"; cat "$T/check.out"; }
finish
