#!/usr/bin/env bash
# A database the worker cannot write is a fault that waiting does not mend.
#  - At the start (the file is read-only for the worker): exit 1 with a line naming the path, before
#    any job is fetched. It used to open the file for reading, fetch the queue and sit on it with a
#    live heartbeat, and a --drain worker never exited.
#  - During a run (the file deleted and its directory made read-only, so no new file can be made):
#    the worker stops fetching, hands back what it holds to the front of the queue, acknowledges
#    nothing it could not write, and a --drain worker exits 1 after sqlite.unwritable_timeout_s;
#    a service worker waits holding nothing, and creates the database and fetches again once the
#    directory is writable again.
# Permissions do not bind root, so as root the workers run as nobody (setpriv).
. "$(dirname "$0")/worker_lib.sh"
AS_USER=() # the command prefix that runs a worker without privileges (setpriv execs it: same pid)
if [ "$(id -u)" = 0 ]; then
  command -v setpriv >/dev/null || { echo "SKIPPED: root without setpriv cannot drop privileges"; exit 77; }
  AS_USER=(setpriv --reuid=65534 --regid=65534 --clear-groups --)
fi
redis_start
make_model
write_config
chmod 755 "$T"
mkdir "$T/db"
[ "$(id -u)" = 0 ] && chown 65534:65534 "$T/db"
DB=$T/db/results.db
export LLMQ_SQLITE_PATH=$DB LLMQ_SQLITE_UNWRITABLE_TIMEOUT_S=2
# completed_ids PREFIX N: the ids PREFIX0 .. PREFIX<N-1> whose job hash says completed, sorted
completed_ids() {
  rcli EVAL "local r = {} for i = 0, tonumber(ARGV[2]) - 1 do
    if redis.call('HGET', 'llmq:job:' .. ARGV[1] .. i, 'status') == 'completed' then r[#r + 1] = ARGV[1] .. i end
  end return r" 0 "$1" "$2" | sort
}
# user_start NAME [options]: worker_start, run as the unprivileged user
user_start() {
  local name=$1; shift
  "${AS_USER[@]}" "$LLMQ" worker -c "$CFG" --id "$name" "$@" >>"$T/$name.log" 2>&1 &
  WORKER_PIDS+=("$!")
  printf -v "W_${name//-/_}" '%s' "$!"
}

# ---- read-only at the start
user_start w0 --drain # creates the database, finds nothing to do
worker_wait w0
eq "a first run creates the database" "$WRC/$(sql "SELECT count(*) FROM workers")" 0/1
chmod 444 "$DB"
N=40
jobs_file "$T/jobs.jsonl" "$N" r- '{"max_tokens": 4, "temperature": 0}'
push_file "$T/jobs.jsonl"
for mode in --drain ""; do
  name=ro${mode:+-drain}
  user_start "$name" $mode
  WAIT_S=30 worker_wait "$name"
  eq "read-only $name: exit status" "$WRC" 1
  log_has "$name" "ERROR sqlite: $DB: .*read-only" && ok "read-only $name: the line names the path" ||
    bad "read-only $name: $(grep ERROR "$T/$name.log" | head -2)"
  eq "read-only $name: no job fetched" "$(rcli LLEN llmq:queue:short)" "$N"
  eq "read-only $name: no processing list" "$(rcli EXISTS "llmq:processing:$name")" 0
done

# ---- a folder the worker cannot write in, and one that does not exist: said at the start
mkdir "$T/rodir" && chmod 555 "$T/rodir"
LLMQ_SQLITE_PATH=$T/rodir/r.db user_start rodir --drain
WAIT_S=30 worker_wait rodir
eq "read-only folder: exit status" "$WRC" 1
log_has rodir "ERROR sqlite: $T/rodir/r.db: permission denied: this process cannot write in the folder $T/rodir " &&
  ok "read-only folder: permission denied, the folder named" || bad "read-only folder: $(grep ERROR "$T/rodir.log" | head -2)"
LLMQ_SQLITE_PATH=$T/nodir/r.db user_start nodir --drain
WAIT_S=30 worker_wait nodir
eq "missing folder: exit status" "$WRC" 1
log_has nodir "ERROR sqlite: $T/nodir/r.db: cannot create it: the folder $T/nodir does not exist" &&
  ok "missing folder: said so" || bad "missing folder: $(grep ERROR "$T/nodir.log" | head -2)"

# ---- unwritable during a run: the file deleted, the directory read-only
chmod 644 "$DB"
rcli DEL llmq:queue:short >/dev/null
N=400
jobs_file "$T/jobs2.jsonl" "$N" u- '{"max_tokens": 32, "temperature": 0}'
push_file "$T/jobs2.jsonl"
user_start w2 --drain --max-num-seqs 2
wait_rows 8
kill -STOP "$W_w2"
sql "SELECT id FROM jobs WHERE id LIKE 'u-%'" | sort >"$T/before.txt"
[ "$(wc -l <"$T/before.txt")" -lt "$N" ] && ok "stopped mid-run ($(wc -l <"$T/before.txt") of $N rows)" || bad "all done before the deletion"
rm "$DB" "$DB-wal" "$DB-shm" && chmod 555 "$T/db" && ok "deleted the database, directory read-only" || bad "rm/chmod failed"
t0=$SECONDS
kill -CONT "$W_w2"
WAIT_S=30 worker_wait w2
eq "unwritable: --drain exits 1" "$WRC" 1
[ $((SECONDS - t0)) -le 12 ] && ok "within the bound ($((SECONDS - t0)) s, sqlite.unwritable_timeout_s 2)" ||
  bad "exit took $((SECONDS - t0)) s"
log_has w2 "ERROR sqlite: .*cannot be written: not fetching, [0-9]* jobs\? handed back" && ok "the hand-back is logged" ||
  bad "no hand-back line: $(grep ERROR "$T/w2.log" | head -3)"
log_has w2 "ERROR sqlite: the database could not be written for 2 s" && ok "the give-up is logged" || bad "no give-up line"
eq "nothing left in the processing list" "$(rcli LLEN llmq:processing:w2)" 0
completed_ids u- "$N" >"$T/acked.txt"
completed=$(wc -l <"$T/acked.txt")
eq "nothing acknowledged after the deletion" "$(comm -23 "$T/acked.txt" "$T/before.txt" | wc -l)" 0
eq "the rest is back in the queue" "$(rcli LLEN llmq:queue:short)" $((N - completed))
# ---- a service worker in the same fault waits without holding anything, and carries on once it can write
chmod 755 "$T/db"
rcli DEL llmq:queue:short >/dev/null
N=120
jobs_file "$T/jobs3.jsonl" "$N" s- '{"max_tokens": 32, "temperature": 0}'
push_file "$T/jobs3.jsonl"
user_start w3 --max-num-seqs 2
has_rows() { [ -f "$DB" ] && [ "$(rows)" -ge 4 ]; }
wait_until "w3's first rows" has_rows
kill -STOP "$W_w3"
sql "SELECT id FROM jobs WHERE id LIKE 's-%'" | sort >"$T/before3.txt"
[ "$(wc -l <"$T/before3.txt")" -lt "$N" ] && ok "service: stopped mid-run" || bad "service: all done before the deletion"
rm "$DB" "$DB-wal" "$DB-shm" && chmod 555 "$T/db"
kill -CONT "$W_w3"
handed_back() { log_has w3 "cannot be written: not fetching" && [ "$(rcli LLEN llmq:processing:w3)" = 0 ]; }
wait_until "w3 to hand everything back" handed_back && ok "service: nothing held while it cannot write"
kill -0 "$W_w3" && ok "service: still running" || bad "service: exited"
chmod 755 "$T/db"
resumed() { log_has w3 "sqlite: writing again after .*; fetching again"; }
wait_until "w3 to write again" resumed && ok "service: writes and fetches again once it can"
all_done() { [ "$(rcli LLEN llmq:queue:short)" = 0 ] && [ "$(rcli LLEN llmq:processing:w3)" = 0 ]; }
wait_until "w3 to finish the queue" all_done
kill -TERM "$W_w3"; worker_wait w3; eq "service: exit status" "$WRC" 0
completed_ids s- "$N" >"$T/acked3.txt"
eq "service: every job completed" "$(wc -l <"$T/acked3.txt")" "$N"
sql "SELECT id FROM jobs WHERE id LIKE 's-%'" | sort >"$T/after3.txt"
eq "service: every job has a row from before the deletion or in the new file" \
  "$(sort -u "$T/before3.txt" "$T/after3.txt" | wc -l)" "$N"

# the hand-back events (reason sqlite_unwritable) and the rest of Redis match schemas/redis-*.schema.json
if python3 -c 'import jsonschema' 2>/dev/null; then
  python3 "$(dirname "$0")/../tools/redis_schemas/redis_schemas.py" "$(dirname "$0")/../../schemas" --port "$PORT" \
    >"$T/schemas.json" 2>"$T/schemas.err"
  eq "redis matches its schemas" "$?/$(head -3 "$T/schemas.err")" "0/"
  grep -q '"sqlite_unwritable"' "$T/schemas.json" && ok "hand-back events say sqlite_unwritable" || bad "no such event"
fi
chmod 755 "$T/db"
finish
