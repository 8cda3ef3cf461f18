#!/usr/bin/env bash
# The reasoning split and thinking budgets end to end, on a tiny random Qwen3 with the real Qwen3
# tokenizer (<think> 151667, </think> 151668): through `llmq run`, then through a worker on a real
# redis-server and SQLite file. A random model does not think, so the tests force the situations: a
# prompt that ends in "<think>\n" (as DeepSeek-R1's generation prompt does) starts the output in
# reasoning, and a thinking budget of N must give exactly N sampled reasoning tokens, then the close
# "\n</think>\n\n" (its newline left out after a token that ends with one), then answer tokens up to
# max_tokens. The split is checked against the unsplit text of the same job as an OpenAI completion
# (same seed, same ids): reasoning + "</think>" + text. Also: a block that never closes, budget 0,
# enable_thinking false, stop strings in the reasoning (ignored unless stop_in_reasoning) and in the
# answer, a model without think tokens (a budget is refused, nothing is split), determinism, an
# OpenAI chat line whose template opens the think block (message.reasoning_content), the SQLite
# columns, the Redis hash's result and the text stream.
. "$(dirname "$0")/worker_lib.sh"
command -v jq >/dev/null || { echo "SKIPPED: jq is not installed"; exit 77; }
QTOK=${LLMQ_ASSETS:-}/qwen3-tokenizer
[ -f "$QTOK/tokenizer.json" ] || { echo "SKIPPED: no Qwen3 tokenizer in \$LLMQ_ASSETS (tests/assets/fetch.sh)"; exit 77; }

make_model --tokenizer "$QTOK"
P='<|im_start|>user\nWhat is 6 times 7?<|im_end|>\n<|im_start|>assistant\n<think>\n'
cat >"$T/jobs.jsonl" <<EOF2
{"id": "b5", "prompt": "$P", "max_tokens": 16, "thinking_budget": 5, "seed": 3, "return_token_ids": true}
{"id": "b0", "prompt": "$P", "max_tokens": 6, "thinking_budget": 0, "seed": 3, "return_token_ids": true}
{"id": "open", "prompt": "$P", "max_tokens": 6, "seed": 4, "return_token_ids": true}
{"id": "plain", "prompt": "Hello", "max_tokens": 6, "seed": 4, "thinking_budget": 2}
{"id": "nothink", "messages": [{"role": "user", "content": "Hi"}], "enable_thinking": false, "max_tokens": 4, "seed": 4, "thinking_budget": 0, "return_token_ids": true}
{"custom_id": "raw5", "method": "POST", "url": "/v1/completions", "body": {"prompt": "$P", "max_tokens": 16, "thinking_budget": 5, "seed": 3}}
{"id": "neg", "prompt": "x", "thinking_budget": -1}
EOF2
"$LLMQ" run --backend cpu --model "$M" -i "$T/jobs.jsonl" -o "$T/out.jsonl" --threads 1 2>"$T/run.log"
eq "llmq run exit" "$?" 0
"$LLMQ" run --backend cpu --model "$M" -i "$T/jobs.jsonl" -o "$T/out2.jsonl" --threads 1 2>>"$T/run.log"
# line ID [FILE]: the result line of job ID (id, or custom_id)
line() { jq -c --arg id "$1" 'select((.custom_id // .id) == $id)' "${2:-$T/out.jsonl}"; }
# pyck LABEL EXPR: a Python expression over the results (r["b5"] ...), which must be true
pyck() {
  if python3 - "$T/out.jsonl" "$2" <<'PY'
import json, sys
r = {}
for l in open(sys.argv[1], encoding="utf-8"):
    d = json.loads(l)
    r[d.get("custom_id") or d["id"]] = d
ok = eval(sys.argv[2])
sys.exit(0 if ok else 1)
PY
  then ok "$1"; else bad "$1: $2 is false; $(cat "$T/out.jsonl")"; fi
}
# budget 5: five sampled ids, then the close, then the answer
pyck "b5: 5 reasoning ids, then the forced close" \
  'r["b5"]["token_ids"][5:8] == [198, 151668, 271] or (r["b5"]["token_ids"][5:7] == [151668, 271] and r["b5"]["reasoning"].endswith("\n"))'
pyck "b5: none of the 5 sampled ids is a tag" 'not set(r["b5"]["token_ids"][:5]) & {151667, 151668}'
pyck "b5: reasoning_tokens = 5 + the close's newline and tag" \
  'r["b5"]["usage"]["reasoning_tokens"] == r["b5"]["token_ids"].index(151668) + 1 and r["b5"]["token_ids"].index(151668) in (5, 6)'
pyck "b5: max_tokens bounds the whole" 'r["b5"]["usage"]["completion_tokens"] == 16 and r["b5"]["finish_reason"] == "length"'
pyck "b5: the answer starts after the close (its \\n\\n included)" 'r["b5"]["text"].startswith("\n\n") and len(r["b5"]["text"]) > 2'
pyck "b5: the split is the unsplit completion, cut at </think>" \
  'r["raw5"]["response"]["body"]["choices"][0]["text"] == r["b5"]["reasoning"] + "</think>" + r["b5"]["text"]'
pyck "raw5: completions report no reasoning" \
  '"completion_tokens_details" not in r["raw5"]["response"]["body"]["usage"] and "reasoning_content" not in r["raw5"]["response"]["body"]["choices"][0]'
# budget 0: the prompt ends with "\n", so the close comes without one of its own
pyck "b0: the close first" 'r["b0"]["token_ids"][:2] == [151668, 271] and r["b0"]["reasoning"] == "" and r["b0"]["usage"]["reasoning_tokens"] == 1'
pyck "b0: then the answer" 'r["b0"]["usage"]["completion_tokens"] == 6 and r["b0"]["text"].startswith("\n\n")'
# no budget, no close: everything is reasoning
pyck "open: never closed, all reasoning" \
  'r["open"]["text"] == "" and r["open"]["reasoning"] != "" and r["open"]["usage"]["reasoning_tokens"] == 6 == r["open"]["usage"]["completion_tokens"] and 151668 not in r["open"]["token_ids"]'
pyck "plain: an output without a think block has no reasoning (its budget unused)" \
  '"reasoning" not in r["plain"] and "reasoning_tokens" not in r["plain"]["usage"] and r["plain"]["usage"]["completion_tokens"] == 6'
# its prompt has the closed, empty block: a budget of 0 forces nothing, and nothing is reasoning
pyck "enable_thinking false: the prompt closes its think block" \
  'r["nothink"]["prompt_token_ids"][-4:] == [151667, 271, 151668, 271]'
pyck "enable_thinking false: no reasoning, no forced close" \
  '"reasoning" not in r["nothink"] and r["nothink"]["status"] == "completed" and 151668 not in r["nothink"]["token_ids"]'
pyck "thinking_budget -1: invalid_request naming the field" \
  'r["neg"]["error_code"] == "invalid_request" and "thinking_budget" in r["neg"]["error"]'
eq "two runs give the same llmq lines (seeds)" "$(grep -v custom_id "$T/out2.jsonl")" "$(grep -v custom_id "$T/out.jsonl")"

# ---- a chat job whose template opens the think block (as DeepSeek-R1's does): an OpenAI chat line
# renders b5's very prompt, so its message splits into reasoning_content and content as b5 does
printf '%s' '{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
<think>
{% endif %}' >"$T/r1.jinja"
echo '{"custom_id": "chat5", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "What is 6 times 7?"}], "max_tokens": 16, "thinking_budget": 5, "seed": 3}}' >"$T/chat.jsonl"
"$LLMQ" run --backend cpu --model "$M" --chat-template "$T/r1.jinja" -i "$T/chat.jsonl" -o "$T/chat_out.jsonl" --threads 1 2>>"$T/run.log"
cat "$T/chat_out.jsonl" >>"$T/out.jsonl"
pyck "chat: message.reasoning_content and content, as b5's reasoning and text" \
  'r["chat5"]["response"]["body"]["choices"][0]["message"]["reasoning_content"] == r["b5"]["reasoning"] != "" and r["chat5"]["response"]["body"]["choices"][0]["message"]["content"] == r["b5"]["text"]'
pyck "chat: usage.completion_tokens_details.reasoning_tokens" \
  'r["chat5"]["response"]["body"]["usage"]["completion_tokens_details"]["reasoning_tokens"] == r["b5"]["usage"]["reasoning_tokens"]'

# ---- stop strings: in the reasoning they change nothing unless stop_in_reasoning; in the answer they cut it
python3 - "$T/out.jsonl" "$T/jobs.jsonl" >"$T/stops.jsonl" <<'PY'
import json, sys
r = {json.loads(l).get("custom_id") or json.loads(l)["id"]: json.loads(l) for l in open(sys.argv[1], encoding="utf-8")}
b5 = r["b5"]
rs, tx = b5["reasoning"], b5["text"]
def pick(s, avoid):  # a substring of s (2..4 characters from the middle) found in neither avoid nor earlier in s
    for n in (4, 3, 2):
        for i in range(1, len(s) - n):
            c = s[i:i + n]
            if c.strip() and c not in avoid and s.find(c) == i:
                return c
    raise SystemExit("no stop string found")
sr = pick(rs, tx + "</think>")
st = pick(tx[2:], rs)
base = json.loads(open(sys.argv[2], encoding="utf-8").readline())  # b5's job
assert base["id"] == "b5"
del base["return_token_ids"]
for jid, extra in (("sr", {"stop": [sr]}), ("sr-on", {"stop": [sr], "stop_in_reasoning": True}), ("st", {"stop": [st]})):
    print(json.dumps(dict(base, id=jid, **extra)))
PY
"$LLMQ" run --backend cpu --model "$M" -i "$T/stops.jsonl" -o "$T/stops_out.jsonl" --threads 1 2>>"$T/run.log"
cat "$T/stops_out.jsonl" >>"$T/out.jsonl"
pyck "stop string in the reasoning: ignored" \
  'r["sr"]["reasoning"] == r["b5"]["reasoning"] and r["sr"]["text"] == r["b5"]["text"] and r["sr"]["finish_reason"] == "length"'
pyck "stop string in the reasoning with stop_in_reasoning: cut there, no answer" \
  'r["sr-on"]["finish_reason"] == "stop" and r["sr-on"]["text"] == "" and r["b5"]["reasoning"].startswith(r["sr-on"]["reasoning"]) and r["b5"]["reasoning"][len(r["sr-on"]["reasoning"]):].startswith(json.loads(open("'"$T"'/stops.jsonl").readline())["stop"][0])'
pyck "stop string in the answer: the answer cut, the reasoning whole" \
  'r["st"]["finish_reason"] == "stop" and r["st"]["reasoning"] == r["b5"]["reasoning"] and r["b5"]["text"].startswith(r["st"]["text"]) and len(r["st"]["text"]) < len(r["b5"]["text"])'

# ---- a model without think tokens: a budget is refused, "<think>" is plain text
"$LLMQ" make-tiny-model "$T/plainmodel" >/dev/null
printf '%s\n' '{"id": "pb", "prompt": "<think>\n", "thinking_budget": 4, "max_tokens": 3}' \
  '{"id": "pn", "prompt": "<think>\n", "max_tokens": 3, "seed": 1}' >"$T/plain.jsonl"
"$LLMQ" run --backend cpu --model "$T/plainmodel" -i "$T/plain.jsonl" -o "$T/plain_out.jsonl" --threads 1 2>>"$T/run.log"
eq "no think tokens: a budget is invalid_request" "$(line pb "$T/plain_out.jsonl" | jq -r .error_code)" invalid_request
eq "no think tokens: the error says why" "$(line pb "$T/plain_out.jsonl" | jq -r .error | grep -c "does not think")" 1
eq "no think tokens: no split" "$(line pn "$T/plain_out.jsonl" | jq -c '[has("reasoning"), .usage.completion_tokens]')" '[false,3]'

# ---- the worker: the same results, the SQLite columns, the Redis hash, the text stream
redis_start
write_config
grep -v '"neg"' "$T/jobs.jsonl" | jq -c 'if .id == "b5" then . + {"stream": true} else . end' >"$T/wjobs.jsonl"
push_file "$T/wjobs.jsonl"
LLMQ_REDIS_STREAM_INTERVAL_MS=0 worker_start w1 --drain
worker_wait w1
eq "worker exit" "$WRC" 0
for id in b5 b0 open plain nothink; do
  want=$(line "$id" | jq -c '{text, reasoning, usage, token_ids}')
  got=$(rcli HGET "llmq:job:$id" result | jq -c '{text, reasoning, usage, token_ids}')
  eq "worker $id: the result in Redis equals llmq run's" "$got" "$want"
  eq "worker $id: the row's result is the hash's" "$(sql "SELECT result FROM jobs WHERE id = '$id'")" "$(rcli HGET "llmq:job:$id" result)"
done
eq "SQLite b5: reasoning and reasoning_tokens columns" \
  "$(sql "SELECT json_object('text', output, 'reasoning', reasoning, 'n', reasoning_tokens) FROM jobs WHERE id = 'b5'")" \
  "$(line b5 | jq -c '{text, reasoning, n: .usage.reasoning_tokens}')"
eq "SQLite b0: an empty reasoning is '' with 1 token" "$(sql "SELECT quote(reasoning) || ' ' || reasoning_tokens FROM jobs WHERE id = 'b0'")" "'' 1"
eq "SQLite plain, nothink: NULL reasoning" \
  "$(sql "SELECT count(*) FROM jobs WHERE id IN ('plain', 'nothink') AND reasoning IS NULL AND reasoning_tokens IS NULL")" 2
eq "params keep thinking_budget" "$(sql "SELECT params ->> 'thinking_budget' FROM jobs WHERE id = 'b5'")" 5
# the stream of b5: its entries add up to the answer and, apart, to the reasoning; the reasoning
# comes first (entries with reasoning before any with text), the last entry ends it
streamed=$(rcli --json XRANGE llmq:stream:b5 - + | python3 -c '
import json, sys
out, rs, order = b"", b"", ""
for _id, f in json.load(sys.stdin):
    if not isinstance(f, dict):
        f = dict(zip(f[::2], f[1::2]))
    out = out[:int(f["offset"])] + f["text"].encode()
    if "reasoning" in f:
        rs = rs[:int(f["reasoning_offset"])] + f["reasoning"].encode()
        order += "r"
    if f["text"]:
        order += "t"
    if "end" in f:
        order += "e"
import re
print(json.dumps({"text": out.decode(), "reasoning": rs.decode(), "order": bool(re.fullmatch(r"r+t+e", order))}, ensure_ascii=False, separators=(",", ":")))')
eq "stream of b5: the answer and the reasoning, reasoning first" "$streamed" \
  "$(line b5 | jq -c '{text, reasoning, order: true}')"
finish
