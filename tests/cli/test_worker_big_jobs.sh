#!/usr/bin/env bash
# Large valid jobs (just under queues.max_job_bytes) with small jobs behind them: every one is
# done, once. A fetch moves a bounded number of bytes and never decodes a job inside Redis, so no
# script runs past the client's command timeout (lowered here to 150 ms so that a dozen big jobs
# in one fetch would outlast it, and the worker hand them back and fetch them again for ever),
# and the worker holds at most queues.fetch_max_bytes of jobs (plus one).
. "$(dirname "$0")/worker_lib.sh"
redis_start
rcli CONFIG SET slowlog-log-slower-than 150000 >/dev/null # commands of 150 ms or more
rcli SLOWLOG RESET >/dev/null
make_model
write_config
BIG=16
SMALL=20
N=$((BIG + SMALL))
python3 - "$T/jobs.jsonl" "$BIG" "$SMALL" <<'PY'
import json, sys
path, big, small = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "w") as f:
    for i in range(big):  # 3.9 MB of metadata each, under the 4 MiB max_job_bytes
        f.write(json.dumps({"id": "big%d" % i, "prompt": "Big %d" % i, "max_tokens": 4, "temperature": 0,
                            "metadata": {"blob": "%d" % i + "x" * 3900000}}) + "\n")
    for i in range(small):
        f.write(json.dumps({"id": "small%d" % i, "prompt": "Small %d" % i, "max_tokens": 4, "temperature": 0}) + "\n")
PY
push_file "$T/jobs.jsonl"
eq "queued" "$(rcli LLEN llmq:queue:short)" "$N"

LLMQ_REDIS_CONNECT_TIMEOUT_MS=150 LLMQ_QUEUES_FETCH_MAX_BYTES=1MiB worker_start w1 --drain
worker_wait w1
eq "w1 exit status" "$WRC" 0
eq "one row per job" "$(rows)" "$N"
eq "distinct ids" "$(sql "SELECT count(DISTINCT id) FROM jobs")" "$N"
eq "all completed" "$(sql "SELECT count(*) FROM jobs WHERE status = 'completed'")" "$N"
eq "each delivered once" "$(sql "SELECT count(*) FROM jobs WHERE attempts = 1")" "$N"
# the worker lets a large job's parsed metadata go while it runs and reads it again at the end
eq "big metadata kept" "$(sql "SELECT count(*) FROM jobs WHERE id LIKE 'big%' AND length(metadata) > 3900000
  AND json_extract(metadata, '$.blob') = json_extract(result, '$.metadata.blob')
  AND substr(json_extract(metadata, '$.blob'), 1, length(substr(id, 4))) = substr(id, 4)")" "$BIG"
eq "queue empty" "$(rcli LLEN llmq:queue:short)" 0
eq "processing empty" "$(rcli LLEN llmq:processing:w1)" 0
eq "nothing dead" "$(rcli LLEN llmq:dead)" 0
# for the record (a busy machine may stall a command past 150 ms now and then; the jobs still
# finish, once): the old fetch timed out on every try, handing the jobs back each time
echo "fetches handed back: $(log_count w1 'fetch lost its reply'); start events: $(rcli XRANGE llmq:events - + | grep -c '^attempt$') for $N jobs"
slow=$(rcli SLOWLOG GET 100 | grep -ci "evalsha")
[ "$slow" -eq 0 ] || rcli SLOWLOG GET 100 | cut -c1-120 | head -60
eq "no script ran 150 ms or more" "$slow" 0
finish
