#!/usr/bin/env bash
# Deadlines and priority end to end, with a real redis-server and SQLite:
# - jobs of priority -1 and 0 pushed together, with room in the lane for one at a time: the worker
#   fetches both (FIFO, the -1 first) and the engine starts the 0 first;
# - a job with timeout_s that cannot finish in time (ignore_eos, 32000 tokens of a 32768-token tiny
#   model: minutes on a CPU) fails with finish_reason timeout and the text so far, in its row, its
#   result line and its hash; it is acknowledged, not retried or dead-lettered;
# - `llmq run` honours timeout_s the same way.
# Both timeouts are 2 s: the first token comes within milliseconds of the fetch, the whole output would
# take far longer than 2 s on any machine, so neither side of the check depends on the machine's speed.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model --max-position 32768
write_config
export LLMQ_QUEUES_SHORT_MAX_NUM_SEQS=1 # the short lane runs one job at a time and holds two
contains() { [[ "$1" == *"$2"* ]]; }

# ---- priority: pushed -1 first, 0 second; the 0 starts first
cat >"$T/prio.jsonl" <<EOF
{"id": "lo", "prompt": "low priority", "max_tokens": 8, "ignore_eos": true, "priority": -1}
{"id": "hi", "prompt": "high priority", "max_tokens": 8, "ignore_eos": true}
EOF
push_file "$T/prio.jsonl"
worker_start prio --drain
worker_wait prio
eq "priority worker exit status" "$WRC" 0
eq "both completed" "$(sql "SELECT group_concat(id || ':' || status, ' ') FROM (SELECT * FROM jobs ORDER BY id)")" "hi:completed lo:completed"
eq "fetched together (FIFO: lo first)" "$(sql "SELECT count(DISTINCT started_at) FROM jobs")" 1
eq "the priority 0 job got its first token first" \
  "$(sql "SELECT (SELECT first_token_at FROM jobs WHERE id = 'hi') < (SELECT first_token_at FROM jobs WHERE id = 'lo')")" 1
eq "priority in the stored parameters" "$(sql "SELECT json_extract(params, '$.priority') FROM jobs WHERE id = 'lo'")" -1

# ---- timeout_s in the worker
echo '{"id": "slow", "prompt": "go on", "max_tokens": 32000, "ignore_eos": true, "timeout_s": 2}' >"$T/slow.jsonl"
push_file "$T/slow.jsonl"
worker_start tmo --drain
worker_wait tmo
eq "timeout worker exit status (a job failed: 3)" "$WRC" 3
eq "row: failed, timeout" "$(sql "SELECT status, finish_reason, attempts FROM jobs WHERE id = 'slow'")" "failed|timeout|1"
eq "row: partial text and tokens" \
  "$(sql "SELECT length(output) > 0, completion_tokens > 0, completion_tokens < 32000 FROM jobs WHERE id = 'slow'")" "1|1|1"
check "row: the error names timeout_s" contains "$(sql "SELECT error FROM jobs WHERE id = 'slow'")" "timeout_s (2 s) passed after"
eq "result line: failed, timeout, the same text" \
  "$(sql "SELECT json_extract(result, '$.status'), json_extract(result, '$.finish_reason'), json_extract(result, '$.text') = output, json_extract(result, '$.usage.completion_tokens') = completion_tokens FROM jobs WHERE id = 'slow'")" \
  "failed|timeout|1|1"
eq "hash: failed, timeout" "$(rcli HMGET llmq:job:slow status finish_reason | tr '\n' ' ')" "failed timeout "
eq "hash: the tokens generated" "$(rcli HGET llmq:job:slow completion_tokens)" "$(sql "SELECT completion_tokens FROM jobs WHERE id = 'slow'")"
check "hash: the error" contains "$(rcli HGET llmq:job:slow error)" "timeout_s (2 s) passed after"
eq "not dead-lettered, not retried" "$(rcli LLEN llmq:dead)/$(rcli ZCARD llmq:retry)" "0/0"

# ---- timeout_s in llmq run (counted from when the line is read)
cat >"$T/run.jsonl" <<EOF
{"id": "r-slow", "prompt": "go on", "max_tokens": 32000, "ignore_eos": true, "timeout_s": 2}
{"id": "r-fast", "prompt": "short", "max_tokens": 4, "ignore_eos": true, "timeout_s": 600}
EOF
"$LLMQ" run -c "$CFG" -i "$T/run.jsonl" -o "$T/run.out" 2>"$T/run.log"
eq "run exit status" "$?" 0
eq "run: the slow line failed by timeout with text, the other completed" "$(python3 - "$T/run.out" <<'PY'
import json, sys
a, b = (json.loads(l) for l in open(sys.argv[1]))
print(a["status"], a["finish_reason"], len(a["text"]) > 0, a["usage"]["completion_tokens"] > 0,
      "timeout_s (2 s)" in a["error"], b["status"], b["finish_reason"])
PY
)" "failed timeout True True True completed length"
check "run: the failed line on stderr" grep -q "line 1 (r-slow): timeout_s (2 s) passed" "$T/run.log"
finish
