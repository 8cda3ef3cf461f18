#!/usr/bin/env bash
# `llmq run` end to end on a tiny random model (CPU backend): mixed good and bad lines, input order,
# both OpenAI shapes, token ids, logprobs, context limits, and batch independence (a greedy or
# seeded job gives the same tokens alone, in a big batch, and in a batch of two at a time).
. "$(dirname "$0")/cli_lib.sh"

# ---- the command line
check_merged "--help" 0 "$LLMQ_BIN" run --help
echo "$out" | grep -q "Usage: llmq run" || bad "--help has no Usage line"
check_merged "bad flag" 2 "$LLMQ_BIN" run --no-such-flag
echo "$out" | grep -q -- "--no-such-flag" || bad "bad flag not named: $out"
check_merged "no input" 2 "$LLMQ_BIN" run --model "$tmp/m" --output "$tmp/o"
echo "$out" | grep -q -- "--input is required" || bad "missing --input not explained: $out"
check_merged "no output" 2 "$LLMQ_BIN" run --model "$tmp/m" --input "$tmp/i"
check_merged "no model" 2 env -u LLMQ_CONFIG "$LLMQ_BIN" run --input "$tmp/i" --output "$tmp/o"
echo "$out" | grep -q -- "--model is required" || bad "missing --model not explained: $out"
check_merged "bad value" 2 "$LLMQ_BIN" run --model "$tmp/m" --input "$tmp/i" --output "$tmp/o" --max-num-seqs abc
echo "$out" | grep -q -- "--max-num-seqs" || bad "bad value does not name the flag: $out"
check_merged "bad backend" 2 "$LLMQ_BIN" run --model "$tmp/m" --input "$tmp/i" --output "$tmp/o" --backend tpu
check_merged "extra argument" 2 "$LLMQ_BIN" run --model "$tmp/m" --input "$tmp/i" --output "$tmp/o" extra

check_merged "make-tiny-model" 0 "$LLMQ_BIN" make-tiny-model "$tmp/model"
M=$tmp/model
# engine.num_kv_blocks: exactly that many blocks, or a clear error when one sequence cannot fit
echo '{"prompt": "a", "max_tokens": 2}' >"$tmp/kv.jsonl"
check_merged "num_kv_blocks 300" 0 env LLMQ_ENGINE_NUM_KV_BLOCKS=300 "$LLMQ_BIN" run --model "$M" \
  --input "$tmp/kv.jsonl" --output "$tmp/kv.out" --backend cpu --threads 2
echo "$out" | grep -q "KV cache 300 blocks of 32 tokens" || bad "num_kv_blocks 300 not taken: $out"
check_merged "num_kv_blocks too few" 1 env LLMQ_ENGINE_NUM_KV_BLOCKS=2 "$LLMQ_BIN" run --model "$M" \
  --input "$tmp/kv.jsonl" --output "$tmp/kv.out" --backend cpu --threads 2
echo "$out" | grep -q "from num_kv_blocks) cannot hold one sequence" && echo "$out" | grep -q "raise num_kv_blocks" ||
  bad "num_kv_blocks 2: unclear error: $out"
check_merged "input missing" 1 "$LLMQ_BIN" run --model "$M" --input "$tmp/nope.jsonl" --output "$tmp/o"
echo "$out" | grep -q "nope.jsonl" || bad "missing input not named: $out"
echo '{"prompt": "a"}' >"$tmp/one.jsonl"
check_merged "model missing" 1 "$LLMQ_BIN" run --model "$tmp/no-model" --input "$tmp/one.jsonl" --output "$tmp/o"
[ "$out" = "llmq run: model $tmp/no-model: not a model folder (it does not exist)" ] && ok "model missing: said once" ||
  bad "model missing: $out"
mkdir "$tmp/empty-model"
check_merged "no config.json" 1 "$LLMQ_BIN" run --model "$tmp/empty-model" --input "$tmp/one.jsonl" --output "$tmp/o"
[ "$out" = "llmq run: model $tmp/empty-model: not a model folder (no config.json)" ] && ok "no config.json: said once" ||
  bad "no config.json: $out"
check_merged "same file" 2 "$LLMQ_BIN" run --model "$M" --input "$tmp/one.jsonl" --output "$tmp/one.jsonl"

# ---- a mixed batch
long=$(printf 'x%.0s' $(seq 1 200))
cat >"$tmp/in.jsonl" <<EOF
{"id": "a", "prompt": "Hello there", "max_tokens": 24, "temperature": 0, "ignore_eos": true, "return_token_ids": true}
this is not JSON
{"id": "c", "prompt": ""}
{"prompt": "xyz", "max_tokens": 5, "temperature": 0, "ignore_eos": true, "return_token_ids": true, "logprobs": 3}

{"id": "e", "prompt": "seeded", "max_tokens": 12, "temperature": 1.0, "seed": 1234, "ignore_eos": true, "return_token_ids": true}
{"custom_id": "chat-1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "whatever", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 2}}
{"custom_id": "cmpl-1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once", "max_tokens": 4, "temperature": 0, "logprobs": 1}}
{"custom_id": "bad-oai", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "n": 3}}
{"id": "long", "prompt": "$long", "max_tokens": 5}
{"id": "clamped", "prompt": "${long:0:60}"}
{"id": "msgs", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}], "max_tokens": 3, "temperature": 0, "enable_thinking": false, "metadata": {"doc": 7}}
{"id": "one", "prompt": "q", "max_tokens": 1, "temperature": 0}
{"id": "stopids", "prompt": "Hello there", "max_tokens": 24, "temperature": 0, "ignore_eos": true, "return_token_ids": true, "stop_token_ids": [STOPID]}
EOF
# job "a" alone first: its 5th generated id becomes a stop id for the last job
head -1 "$tmp/in.jsonl" >"$tmp/a.jsonl"
check_merged "run one job" 0 "$LLMQ_BIN" run --model "$M" --input "$tmp/a.jsonl" --output "$tmp/a.out" --backend cpu --threads 2
echo "$out" | grep -q "1 job: 1 completed, 0 failed" || bad "summary line: $out"
stopid=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["token_ids"][4])' "$tmp/a.out")
sed -i "s/STOPID/$stopid/" "$tmp/in.jsonl"
check_merged "run mixed" 0 "$LLMQ_BIN" run --model "$M" --input "$tmp/in.jsonl" --output "$tmp/out.jsonl" \
  --backend cpu --max-model-len 64 --threads 2
echo "$out" | grep -q "13 jobs: 9 completed, 4 failed" || bad "summary line: $out"
printf '%s' "$out" | grep -q $'\r' && bad "progress drawn although stderr is not a terminal"
echo "$out" | grep -q "line 2: invalid JSON" || bad "failed line 2 not reported with its number: $out"
if python3 - "$tmp/a.out" "$tmp/out.jsonl" <<'PY' && ok "job a: same tokens alone and in the mixed batch" || bad "job a differs alone and in the batch"
import json, sys
a = json.loads(open(sys.argv[1]).readline()); b = json.loads(open(sys.argv[2]).readline())
sys.exit(0 if a["token_ids"] == b["token_ids"] and a["text"] == b["text"] else 1)
PY

python3 - "$tmp/in.jsonl" "$tmp/out.jsonl" <<'EOF'
import json, sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
out = [json.loads(l) for l in open(sys.argv[2])]
errs = []
def want(cond, msg):
    if not cond: errs.append(msg)
want(len(out) == len(lines) == 13, f"{len(out)} results for {len(lines)} jobs")
ids = [o.get("id") if "custom_id" not in o else o["custom_id"] for o in out]
want(ids[0] == "a" and ids[2] == "c" and ids[4] == "e" and ids[5] == "chat-1" and ids[6] == "cmpl-1"
     and ids[7] == "bad-oai" and ids[8] == "long" and ids[9] == "clamped" and ids[10] == "msgs"
     and ids[11] == "one" and ids[12] == "stopids", f"results not in input order: {ids}")
a, notjson, empty, gen, e, chat, cmpl, badoai, lng, clamped, msgs, one, stopids = out
# llmq form, completed
want(a["status"] == "completed" and a["finish_reason"] == "length", f"a: {a}")
want(a["usage"]["completion_tokens"] == 24 == len(a["token_ids"]), f"a usage: {a['usage']}")
want(a["usage"]["prompt_tokens"] == len(a["prompt_token_ids"]) > 0, "a prompt ids")
want(isinstance(a["text"], str) and "logprobs" not in a and "error" not in a, f"a fields: {sorted(a)}")
# failures: not JSON (an id is assigned), empty prompt
want(notjson["status"] == "failed" and "invalid JSON" in notjson["error"] and len(notjson["id"]) == 36
     and notjson["error_code"] == "invalid_json",
     f"not json: {notjson}")
want(empty == {"id": "c", "status": "failed", "error": "field 'prompt': must not be empty",
              "error_code": "invalid_request"}, f"empty: {empty}")
# an assigned id; logprobs with 3 alternatives; greedy picks the top one
want(len(gen["id"]) == 36 and gen["id"][14] == "7", f"generated id: {gen['id']}")
lp = gen["logprobs"]
want(len(lp) == gen["usage"]["completion_tokens"] == 5, f"logprobs entries: {len(lp)}")
for i, entry in enumerate(lp):
    top = entry["top_logprobs"]
    want(entry["token_id"] == gen["token_ids"][i], f"logprob {i} token_id")
    want(len(top) == 3, f"logprob {i}: {len(top)} alternatives")
    want(all(top[k]["logprob"] >= top[k + 1]["logprob"] for k in range(len(top) - 1)), f"logprob {i} not sorted")
    want(top[0]["token_id"] == entry["token_id"] and abs(top[0]["logprob"] - entry["logprob"]) < 1e-6,
         f"greedy token {i} is not the most likely one: {entry}")
    want(entry["logprob"] <= 0, f"logprob {i} > 0")
# OpenAI chat
want(chat["id"].startswith("batch_req_") and chat["error"] is None, f"chat envelope: {chat}")
r = chat["response"]
want(r["status_code"] == 200 and r["request_id"], "chat status")
b = r["body"]
want(b["object"] == "chat.completion" and b["model"] == "model" and isinstance(b["created"], int), f"chat body: {b}")
c0 = b["choices"][0]
want(c0["index"] == 0 and c0["message"]["role"] == "assistant" and isinstance(c0["message"]["content"], str), "chat choice")
want(c0["finish_reason"] in ("stop", "length"), "chat finish_reason")
want(b["usage"]["total_tokens"] == b["usage"]["prompt_tokens"] + b["usage"]["completion_tokens"], "chat usage")
content = c0["logprobs"]["content"]
want(len(content) == b["usage"]["completion_tokens"], "chat logprobs length")
want(all(len(x["top_logprobs"]) == 2 and isinstance(x["bytes"], list) and isinstance(x["token"], str) for x in content),
     "chat logprob entries")
# OpenAI completion
cb = cmpl["response"]["body"]
want(cb["object"] == "text_completion" and isinstance(cb["choices"][0]["text"], str), f"completion body: {cb}")
clp = cb["choices"][0]["logprobs"]
want(len(clp["tokens"]) == len(clp["token_logprobs"]) == len(clp["top_logprobs"]) == cb["usage"]["completion_tokens"] == 4,
     f"completion logprobs: {clp}")
# OpenAI error
want(badoai["response"] is None and badoai["error"]["code"] == "invalid_request"
     and "body.n" in badoai["error"]["message"] and badoai["custom_id"] == "bad-oai", f"bad openai: {badoai}")
# context: a prompt over max_model_len fails; a default max_tokens is clamped to what fits
want(lng["status"] == "failed" and "max_model_len is 64" in lng["error"], f"long: {lng}")
want(clamped["status"] == "completed" and clamped["usage"]["prompt_tokens"] + clamped["usage"]["completion_tokens"] <= 64,
     f"clamped: {clamped}")
# messages with metadata echoed
want(msgs["status"] == "completed" and msgs["metadata"] == {"doc": 7}, f"msgs: {msgs}")
want(one["usage"]["completion_tokens"] == 1 and one["finish_reason"] in ("length", "stop"), f"one: {one}")
# a stop token id ends generation there, and is counted
want(stopids["finish_reason"] == "stop" and stopids["token_ids"] == a["token_ids"][:len(stopids["token_ids"])]
     and stopids["token_ids"][-1] == a["token_ids"][4] and len(stopids["token_ids"]) <= 5, f"stopids: {stopids}")
for m in errs: print("FAIL", m)
sys.exit(1 if errs else 0)
EOF
then ok "mixed batch results"; else bad "mixed batch results"; fi

# ---- batch independence: greedy and seeded jobs give the same tokens alone and in any batch
if python3 - "$tmp/many.jsonl" <<'EOF'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(40):
        job = {"id": f"g{i}", "prompt": "The quick brown fox " * (1 + i % 7) + str(i), "max_tokens": 3 + (i * 7) % 29,
               "temperature": 0, "ignore_eos": True, "return_token_ids": True}
        if i % 5 == 4:
            job.update(temperature=0.9, top_p=0.95, seed=100 + i)
        f.write(json.dumps(job) + "\n")
EOF
check_merged "big batch" 0 "$LLMQ_BIN" run --model "$M" --input "$tmp/many.jsonl" --output "$tmp/many.out" --backend cpu --threads 2
check_merged "two at a time" 0 "$LLMQ_BIN" run --model "$M" --input - --output - --backend cpu --threads 2 \
  --max-num-seqs 2 --max-num-batched-tokens 64 <"$tmp/many.jsonl"
printf '%s\n' "$out" | grep '^{' >"$tmp/many2.out"
for i in 0 4 13 29; do
  sed -n "$((i + 1))p" "$tmp/many.jsonl" >"$tmp/alone.jsonl"
  "$LLMQ_BIN" run --model "$M" --input "$tmp/alone.jsonl" --output "$tmp/alone$i.out" --backend cpu --threads 2 2>/dev/null ||
    bad "job $i alone did not run"
done
python3 - "$tmp" <<'EOF'
import json, sys
d = sys.argv[1]
big = [json.loads(l) for l in open(f"{d}/many.out")]
small = [json.loads(l) for l in open(f"{d}/many2.out")]
errs = []
if [o["id"] for o in big] != [f"g{i}" for i in range(40)]: errs.append("big batch out of order")
if [o["id"] for o in small] != [f"g{i}" for i in range(40)]: errs.append("two-at-a-time batch out of order")
for i in range(40):
    if big[i]["token_ids"] != small[i]["token_ids"] or big[i]["text"] != small[i]["text"]:
        errs.append(f"job {i}: batch of 40 and batches of 2 differ")
    if big[i]["usage"]["completion_tokens"] != 3 + (i * 7) % 29: errs.append(f"job {i}: wrong length")
for i in (0, 4, 13, 29):
    alone = json.loads(open(f"{d}/alone{i}.out").readline())
    if alone["token_ids"] != big[i]["token_ids"] or alone["text"] != big[i]["text"]:
        errs.append(f"job {i}: alone {alone['token_ids']} != in batch {big[i]['token_ids']}")
for m in errs: print("FAIL", m)
sys.exit(1 if errs else 0)
EOF
then ok "batch independence (40 jobs: alone, all at once, two at a time)"; else bad "batch independence (40 jobs: alone, all at once, two at a time)"; fi

# ---- config file: sampling defaults and templates; the job overrides the defaults
cat >"$tmp/llmq.yaml" <<'EOF'
sampling:
  max_tokens: 7
  temperature: 0
  use_generation_config: false
templates:
  greet: "Say hello to {name}."
EOF
printf '%s\n' '{"id": "t", "template": "greet", "vars": {"name": "Ada"}, "ignore_eos": true}' \
  '{"id": "d", "prompt": "x", "ignore_eos": true}' '{"id": "o", "prompt": "x", "max_tokens": 2}' \
  '{"id": "n", "template": "nope"}' >"$tmp/tpl.jsonl"
check_merged "config and templates" 0 "$LLMQ_BIN" run -c "$tmp/llmq.yaml" --model "$M" --input "$tmp/tpl.jsonl" --output "$tmp/tpl.out" --backend cpu
if python3 - "$tmp/tpl.out" <<'EOF'
import json, sys
t, d, o, n = [json.loads(l) for l in open(sys.argv[1])]
errs = []
if t["status"] != "completed" or t["usage"]["completion_tokens"] != 7: errs.append(f"template job: {t}")
if d["usage"]["completion_tokens"] != 7: errs.append(f"config max_tokens not used: {d}")
if o["usage"]["completion_tokens"] > 2: errs.append(f"job max_tokens did not win: {o}")
if n["status"] != "failed" or "no template named 'nope'" not in n["error"]: errs.append(f"unknown template: {n}")
for m in errs: print("FAIL", m)
sys.exit(1 if errs else 0)
EOF
then ok "config defaults and templates"; else bad "config defaults and templates"; fi
check_merged "template without config" 0 "$LLMQ_BIN" run --model "$M" --input "$tmp/tpl.jsonl" --output "$tmp/tpl2.out" --backend cpu
head -1 "$tmp/tpl2.out" | grep -q "templates are not configured" || bad "template without config: $(head -1 "$tmp/tpl2.out")"

# ---- the progress bar appears on a terminal (script gives the command a pseudo-terminal)
if command -v script >/dev/null; then
  script -qec "$LLMQ_BIN run --model $M --input $tmp/many.jsonl --output $tmp/tty.out --backend cpu --threads 2" "$tmp/tty.log" >/dev/null 2>&1
  if grep -q "40/40 jobs" "$tmp/tty.log" && grep -q "tok/s" "$tmp/tty.log"; then ok "progress bar on a terminal"; else
    bad "no progress bar on a terminal: $(tr '\r' '\n' <"$tmp/tty.log" | tail -3)"; fi
fi

finish
