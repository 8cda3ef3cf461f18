#!/usr/bin/env bash
# `llmq worker --drain`, the cron job: it gives up at once (exit 1, one line) when Redis cannot be
# reached within --connect-timeout; started right after another worker was killed with a whole
# batch in its processing list and its heartbeat still fresh, it waits for that heartbeat to lapse,
# reaps the list at once and runs every job before it exits 0; its exit status is 3 and its last
# line counts them when jobs failed.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config

# ---- Redis unreachable at the start: exit 69 after --connect-timeout, with one line
dead_port=$(free_port)
t0=$(date +%s.%N)
worker_start nored --redis "redis://u:hunter2@127.0.0.1:$dead_port/0" --drain --connect-timeout 2
worker_wait nored
took=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t0" "$(date +%s.%N)")
eq "unreachable Redis: exit status" "$WRC" 69
eq "unreachable Redis: one line" "$(wc -l <"$T/nored.log")" 1
grep -q "ERROR redis redis://u:\*\*\*\*@127.0.0.1:$dead_port/0 cannot be reached: Connection refused (for 2 s" "$T/nored.log" &&
  ok "the line names the address (password hidden) and the reason" || bad "the line: $(cat "$T/nored.log")"
python3 -c "import sys; sys.exit(0 if 2.0 <= float(sys.argv[1]) < 20 else 1)" "$took" &&
  ok "it tried for the 2 s of --connect-timeout ($took s), not the default 30" || bad "it gave up after $took s"
"$LLMQ" worker -c "$CFG" --connect-timeout 2 >"$T/flag.log" 2>&1
eq "--connect-timeout without --drain: usage error" "$?" 2

# ---- a drain worker right after a crash: it waits for the dead worker's batch and runs it
# a fetches the whole batch at once (its lane holds 32 + 8) and is killed while the long jobs run;
# its heartbeat outlives it by 5 s. b's reaper would run only every 300 s: b must reap a's list
# as soon as the heartbeat lapses, not at its reaper's pace.
N=16
python3 - "$T/batch.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(16):
        n = 4 if i < 4 else 800  # the short ones make rows while the long ones still run
        f.write(json.dumps({"id": "b%d" % i, "prompt": "Document %d" % i, "max_tokens": n, "ignore_eos": True,
                            "temperature": 0}) + "\n")
PY
push_file "$T/batch.jsonl"
LLMQ_WORKER_HEARTBEAT_TTL_S=5 worker_start a --max-num-seqs 32
wait_rows 4
kill -9 "$W_a"
wait "$W_a" 2>/dev/null
held=$(rcli LLEN llmq:processing:a)
echo "killed a with $held jobs in its processing list and $(rows) rows written"
[ "$held" -gt 0 ] && ok "a held jobs when killed" || bad "a held nothing when killed (the machine too slow?)"
eq "the queue was empty: a had fetched everything" "$(rcli LLEN llmq:queue:short)" 0
eq "a's heartbeat is still there" "$(rcli EXISTS llmq:worker:a)" 1

LLMQ_WORKER_REAPER_INTERVAL_S=300 worker_start b --drain
worker_wait b
eq "b exit status" "$WRC" 0
log_has b "drain: waiting for worker a: $held jobs in llmq:processing:a; it may still finish them, and if it has died its heartbeat lapses within" &&
  ok "b said once what it waits for" || bad "no waiting line: $(grep drain "$T/b.log")"
eq "b said it once" "$(log_count b "drain: waiting for worker a")" 1
log_has b "reaper: worker a lapsed (no heartbeat): $held jobs put back" && ok "b reaped a's list" || bad "b did not reap a"
eq "one row per job" "$(sql "SELECT count(DISTINCT id) || '/' || count(*) FROM jobs")" "$N/$N"
eq "all completed" "$(sql "SELECT count(*) FROM jobs WHERE status = 'completed'")" "$N"
eq "b ran what a held" "$(sql "SELECT count(*) FROM jobs WHERE worker_id = 'b' AND attempts = 2")" "$held"
lists=$(rcli --scan --pattern 'llmq:*' | while read -r k; do [ "$(rcli TYPE "$k")" = list ] && echo "$k"; done)
eq "no Redis list holds anything" "$lists" ""
eq "retry set empty" "$(rcli ZCARD llmq:retry)" 0
eq "no workers left registered" "$(rcli SCARD llmq:workers)" 0
last=$(tail -1 "$T/b.log")
[[ $last == *"worker b stopped after"*"$held jobs done ($held completed, 0 failed, 0 cancelled), 0 dead-lettered"*"; exit status 0" ]] &&
  ok "b's last line: the summary, exit status 0" || bad "b's last line: $last"

# ---- failed jobs: exit status 3, counted in the last line
rcli LPUSH llmq:queue:short 'not json' >/dev/null
rcli LPUSH llmq:queue:short '{"id": "too-long", "prompt": "x", "max_tokens": 99999999}' >/dev/null
rcli LPUSH llmq:queue:short '{"id": "fine", "prompt": "x", "max_tokens": 3}' >/dev/null
worker_start c --drain
worker_wait c
eq "c exit status: jobs failed" "$WRC" 3
last=$(tail -1 "$T/c.log")
[[ $last == *"worker c stopped after"*"3 jobs done (1 completed, 2 failed, 0 cancelled), 2 dead-lettered (0 reaped from crashed workers)"*"; exit status 3 (jobs failed or were dead-lettered)" ]] &&
  ok "c's last line counts them" || bad "c's last line: $last"
eq "dead letters" "$(rcli LLEN llmq:dead)" 2
finish
