#!/usr/bin/env bash
# Long-job routing: a job pushed to the short queue whose prompt is over
# queues.long_threshold_tokens (or that fits only the long lane's max_model_len) is moved to the
# long queue without counting a delivery, and is run from there in the long lane: its row says
# queue = long. A worker that serves only the short queue leaves it there for the long workers.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config
export LLMQ_QUEUES_LONG_THRESHOLD_TOKENS=40 LLMQ_QUEUES_SHORT_MAX_MODEL_LEN=128
long=$(printf 'lorem ipsum %.0s' $(seq 1 20)) # 240 bytes: over 40 tokens with the byte-level tokenizer
cat >"$T/jobs.jsonl" <<EOF
{"id": "s1", "prompt": "short one", "max_tokens": 4}
{"id": "L1", "prompt": "$long", "max_tokens": 4}
{"id": "s2", "prompt": "short two", "max_tokens": 4}
{"id": "L2", "prompt": "long output", "max_tokens": 500}
{"id": "L3", "messages": [{"role": "user", "content": "$long"}], "max_tokens": 4}
{"id": "s3", "prompt": "short three", "max_tokens": 4}
EOF
push_file "$T/jobs.jsonl"

# a worker for the short queue only: the long jobs move to the long queue and stay there
worker_start short-only --queues short --drain
worker_wait short-only
eq "short worker exit status" "$WRC" 0
eq "short jobs done" "$(sql "SELECT group_concat(id || ':' || queue, ' ') FROM (SELECT * FROM jobs ORDER BY id)")" "s1:short s2:short s3:short"
eq "long jobs moved to the long queue" "$(rcli LLEN llmq:queue:long)" 3
eq "nothing left on the short queue" "$(rcli LLEN llmq:queue:short)" 0
eq "moves counted in the summary" "$(grep -c "3 moved to the long queue" "$T/short-only.log")" 1
eq "a moved job's hash: queued on long, delivery not counted" "$(rcli HMGET llmq:job:L1 status queue attempts | tr '\n' ' ')" "queued long 0 "
rcli XRANGE llmq:events - + | grep -q route_long && ok "the move is an event" || bad "no route_long event"

# a worker for the long queue runs them in its long lane
worker_start long-only --queues long --drain
worker_wait long-only
eq "long worker exit status" "$WRC" 0
eq "long jobs done from the long queue" "$(sql "SELECT group_concat(id || ':' || queue || ':' || status || ':' || attempts, ' ') FROM (SELECT * FROM jobs WHERE id LIKE 'L%' ORDER BY id)")" "L1:long:completed:1 L2:long:completed:1 L3:long:completed:1"
eq "L2 generated past the short lane's max_model_len" "$(sql "SELECT completion_tokens > 128 OR finish_reason = 'stop' FROM jobs WHERE id = 'L2'")" 1

# a worker for both: the same in one go
echo "{\"id\": \"L4\", \"prompt\": \"$long\", \"max_tokens\": 3}" | "$LLMQ" enqueue -c "$CFG" - 2>/dev/null
worker_start both --drain
worker_wait both
eq "routed and run by one worker" "$(sql "SELECT queue, status, attempts FROM jobs WHERE id = 'L4'")" "long|completed|1"
eq "all lists empty" "$(rcli LLEN llmq:queue:short)/$(rcli LLEN llmq:queue:long)/$(rcli LLEN llmq:dead)" "0/0/0"
finish
