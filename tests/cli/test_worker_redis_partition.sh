#!/usr/bin/env bash
# One worker is cut off from Redis (its TCP path stalls: it reaches Redis through a forwarding
# process that is stopped with SIGSTOP) while another is not, for longer than the heartbeat TTL:
# the other worker's reaper takes the cut-off worker's jobs and runs them. The cut-off worker keeps
# running its engine, but past its heartbeat's lease it writes no rows; when Redis answers again
# it finds its jobs gone from its processing list and drops them without rows. Exactly one row per
# job across both workers' databases, nothing left anywhere.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config
export LLMQ_REDIS_CONNECT_TIMEOUT_MS=1000 # a command that gets no answer fails after 1 s
export LLMQ_ENGINE_CPU_KV_CACHE_BYTES=256MiB

# a TCP forwarder to Redis: w1's only path to it
python3 - "$PORT" "$T/proxy.port" <<'PY' >"$T/proxy.log" 2>&1 &
import asyncio, sys

async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    except Exception:
        pass
    finally:
        w.close()

async def handle(cr, cw):
    try:
        rr, rw = await asyncio.open_connection("127.0.0.1", int(sys.argv[1]))
    except Exception:
        cw.close()
        return
    await asyncio.gather(pipe(cr, rw), pipe(rr, cw))

async def main():
    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    with open(sys.argv[2] + ".tmp", "w") as f:
        f.write(str(srv.sockets[0].getsockname()[1]))
    import os
    os.rename(sys.argv[2] + ".tmp", sys.argv[2])
    async with srv:
        await srv.serve_forever()

asyncio.run(main())
PY
PROXY_PID=$!
stopped=0
trap '[ "$stopped" = 1 ] && kill -CONT "$PROXY_PID" 2>/dev/null; kill "$PROXY_PID" 2>/dev/null; cleanup' EXIT
wait_until "the forwarder to listen" test -s "$T/proxy.port"
PPORT=$(cat "$T/proxy.port")

N=12
jobs_file "$T/jobs.jsonl" "$N" p- '{"max_tokens": 1500, "ignore_eos": true, "temperature": 0}'
push_file "$T/jobs.jsonl"
holds() { [ "$(rcli LLEN "llmq:processing:$1")" -ge "$2" ]; }
LLMQ_REDIS_URL=redis://127.0.0.1:$PPORT worker_start w1 --max-num-seqs 16
wait_until "w1 to hold the $N jobs" holds w1 "$N"
LLMQ_SQLITE_PATH=$T/w2.db worker_start w2 --max-num-seqs 16
beats() { [ "$(rcli EXISTS "llmq:worker:$1")" = 1 ]; }
wait_until "w2 to heartbeat" beats w2

kill -STOP "$PROXY_PID"; stopped=1
r0=$(rows)
[ "$r0" -lt "$N" ] && ok "cut off with jobs running ($r0 of $N rows)" || bad "w1 was done before the cut (too fast?)"
reaped() { log_has w2 "reaper: worker w1 lapsed"; }
wait_until "w2 to reap w1's jobs" reaped && ok "w2 reaped w1's jobs (its heartbeat lapsed)"
# w1's jobs finish meanwhile; their rows must wait (its lease is over)
held_back() { log_has w1 "no heartbeat for"; }
wait_until "w1 to hold its rows back" held_back && ok "w1 holds its rows back past the lease"
kill -CONT "$PROXY_PID"; stopped=0

settled() {
  [ "$(rcli LLEN llmq:queue:short)" = 0 ] && [ "$(rcli LLEN llmq:processing:w1)" = 0 ] &&
    [ "$(rcli LLEN llmq:processing:w2)" = 0 ]
}
wait_until "the queue and both lists to empty" settled && ok "queue and processing lists empty"
dropped() { log_has w1 "dropped without a row"; }
wait_until "w1 to drop the reaped jobs" dropped && ok "w1 dropped the jobs reaped from it"
dbrows() { sqlite3 -batch -noheader "$1" "SELECT count(*) FROM jobs" 2>/dev/null || echo 0; }
all_rows() { [ $(($(dbrows "$DB") + $(dbrows "$T/w2.db"))) -ge "$N" ]; }
wait_until "a row for each job" all_rows
kill -TERM "$W_w1" "$W_w2"; worker_wait w1; eq "w1 exit status" "$WRC" 0; worker_wait w2; eq "w2 exit status" "$WRC" 0
python3 - "$DB" "$T/w2.db" "$N" <<'PY' && ok "exactly one row per job across both databases" || bad "a job ran twice or not at all"
import collections, sqlite3, sys
c = collections.Counter()
for db in sys.argv[1:3]:
    for (i,) in sqlite3.connect(db).execute("SELECT id FROM jobs"):
        c[i] += 1
twice = sorted(k for k, v in c.items() if v > 1)
print("jobs with rows: %d of %s; with two rows: %d %s" % (len(c), sys.argv[3], len(twice), twice[:5]))
sys.exit(0 if len(c) == int(sys.argv[3]) and not twice else 1)
PY
eq "every hash completed" "$(for i in $(seq 0 $((N - 1))); do echo "HGET llmq:job:p-$i status"; done | rcli | sort | uniq -c | awk '{print $1, $2}')" "$N completed"
finish
