#!/usr/bin/env bash
# A job's "truncate" through a worker (real redis-server, SQLite file, tiny model with its byte-level
# tokenizer): the short lane holds 64 tokens, the long lane 256. A job with truncate that only the
# short lane would have to cut goes to the long queue and runs there whole; one over the long lane
# too is cut there; without truncate it fails and says how to fix it. The row's result line counts
# the dropped tokens (usage.truncated_tokens, also in an OpenAI line's usage) and its params name
# the mode.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config
export LLMQ_MODEL_MAX_MODEL_LEN=256 LLMQ_QUEUES_SHORT_MAX_MODEL_LEN=64 LLMQ_QUEUES_LONG_THRESHOLD_TOKENS=62
mid=$(python3 -c 'print(" ".join(f"w{i}" for i in range(40)))')   # over 64 tokens, under 256
big=$(python3 -c 'print(" ".join(f"w{i}" for i in range(120)))')  # over 256 tokens
n_mid=$(printf '{"text": "%s"}\n' "$mid" | "$LLMQ" tokenize --model "$M" | jq '.ids | length')
n_big=$(printf '{"text": "%s"}\n' "$big" | "$LLMQ" tokenize --model "$M" | jq '.ids | length')
[ "$n_mid" -gt 64 ] && [ "$n_mid" -lt 250 ] && [ "$n_big" -gt 256 ] || bad "prompt sizes: $n_mid, $n_big"
cat >"$T/jobs.jsonl" <<EOF
{"id": "mid", "prompt": "$mid", "max_tokens": 4, "truncate": "end"}
{"id": "big", "prompt": "$big", "max_tokens": 4, "truncate": "start"}
{"id": "plain", "prompt": "$big", "max_tokens": 4}
{"custom_id": "oai", "url": "/v1/completions", "body": {"prompt": "$big", "max_tokens": 6, "truncate": "middle"}}
EOF
push_file "$T/jobs.jsonl"
worker_start w --drain
worker_wait w
eq "worker exit status (a job failed)" "$WRC" 3
eq "mid: moved to the long lane, run whole" \
  "$(sql "SELECT queue, status, prompt_tokens, json_extract(result, '\$.usage.truncated_tokens'), json_extract(params, '\$.truncate') FROM jobs WHERE id = 'mid'")" \
  "long|completed|$n_mid|0|end"
eq "big: cut to the long lane's 256 - 4" \
  "$(sql "SELECT queue, status, prompt_tokens, json_extract(result, '\$.usage.truncated_tokens'), json_extract(params, '\$.truncate') FROM jobs WHERE id = 'big'")" \
  "long|completed|252|$((n_big - 252))|start"
eq "oai: its usage counts the cut" \
  "$(sql "SELECT status, prompt_tokens, json_extract(result, '\$.response.body.usage.truncated_tokens') FROM jobs WHERE id = 'oai'")" \
  "completed|250|$((n_big - 250))"
eq "plain: fails" "$(sql "SELECT status, error_code FROM jobs WHERE id = 'plain'")" "failed|context_length_exceeded"
sql "SELECT error FROM jobs WHERE id = 'plain'" | grep -q '"truncate".*"summarize"' && ok "plain: the error names the ways out" ||
  bad "plain: $(sql "SELECT error FROM jobs WHERE id = 'plain'")"
finish
