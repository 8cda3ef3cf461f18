#!/usr/bin/env bash
# A job's "truncate" end to end through `llmq run` on a tiny random model (CPU backend, its byte-level
# tokenizer and ChatML template) with --max-model-len 64: a prompt over the context fails without
# truncate and says how to fix it; with "start", "end" and "middle" it completes, its prompt ids are
# the slices of the full tokenization (`llmq tokenize`) that the mode keeps, and usage counts the
# dropped tokens. A messages job (Chinese text) and an OpenAI chat line are cut inside their content,
# the template's own tokens intact, in whole UTF-8 characters.
. "$(dirname "$0")/cli_lib.sh"

tiny_model "$tmp/m"
long=$(python3 -c 'print(" ".join(f"word{i}" for i in range(40)))')
zh=$(python3 -c 'print("".join(f"第{i}句春眠不觉晓处处闻啼鸟。" for i in range(8)))')
cat >"$tmp/in.jsonl" <<EOF
{"id": "none", "prompt": "$long", "max_tokens": 8}
{"id": "start", "prompt": "$long", "max_tokens": 8, "truncate": "start", "return_token_ids": true, "temperature": 0}
{"id": "end", "prompt": "$long", "max_tokens": 8, "truncate": "end", "return_token_ids": true, "temperature": 0}
{"id": "middle", "prompt": "$long", "max_tokens": 8, "truncate": "middle", "return_token_ids": true, "temperature": 0}
{"id": "fits", "prompt": "short", "max_tokens": 4, "truncate": "end"}
{"id": "chat", "messages": [{"role": "user", "content": "$zh"}], "max_tokens": 4, "truncate": "end", "return_token_ids": true}
{"custom_id": "oai", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "$zh"}], "max_tokens": 4, "truncate": "start"}}
{"id": "bad", "prompt": "x", "truncate": "left"}
EOF
printf '{"text": "%s"}\n' "$long" | "$LLMQ_BIN" tokenize --model "$tmp/m" >"$tmp/full.json" || bad "llmq tokenize"
check_merged "run" 0 "$LLMQ_BIN" run --model "$tmp/m" --input "$tmp/in.jsonl" --output "$tmp/out.jsonl" \
  --backend cpu --max-model-len 64 --threads 2
echo "$out" | grep -q "8 jobs: 6 completed, 2 failed" || bad "summary line: $out"
# the chat job's prompt, decoded by the model's own tokenizer
python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(json.dumps({"ids": r[5].get("prompt_token_ids", [])}))' \
  "$tmp/out.jsonl" | "$LLMQ_BIN" tokenize --model "$tmp/m" >"$tmp/chat.json" || bad "decode the chat prompt"
if python3 - "$tmp/out.jsonl" "$tmp/full.json" "$tmp/chat.json" "$zh" <<'EOF'
import json, sys
none, start, end, middle, fits, chat, oai, badv = [json.loads(l) for l in open(sys.argv[1])]
full = json.load(open(sys.argv[2]))["ids"]
chat_text = json.load(open(sys.argv[3]))["text"]
zh = sys.argv[4]
errs = []
def want(cond, msg):
    if not cond: errs.append(msg)
want(len(full) > 64, f"the long prompt has only {len(full)} tokens")
want(none["status"] == "failed" and none["error_code"] == "context_length_exceeded"
     and '"truncate"' in none["error"] and '"summarize"' in none["error"], f"none: {none}")
keep = 64 - 8
for r, front in ((start, 0), (end, keep), (middle, keep // 2)):
    want(r["status"] == "completed", f"{r['id']}: {r}")
    u = r.get("usage", {})
    want(u.get("prompt_tokens") == keep and u.get("truncated_tokens") == len(full) - keep, f"{r['id']} usage: {u}")
    want(r.get("prompt_token_ids") == full[:front] + full[len(full) - (keep - front):], f"{r['id']}: wrong ids kept")
want(fits["status"] == "completed" and fits["usage"]["truncated_tokens"] == 0, f"fits: {fits}")
head, tail = "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"
want(chat["status"] == "completed" and chat["usage"]["truncated_tokens"] > 0
     and chat["usage"]["prompt_tokens"] <= 60, f"chat: {chat}")
want(chat_text.startswith(head) and chat_text.endswith(tail), f"chat template cut: {chat_text!r}")
kept = chat_text[len(head):len(chat_text) - len(tail)]
want(0 < len(kept) < len(zh) and zh.startswith(kept) and "\ufffd" not in kept, f"chat kept: {kept!r}")
b = oai["response"]["body"]["usage"] if oai.get("response") else {}
want(b.get("truncated_tokens", 0) > 0 and b["prompt_tokens"] <= 60, f"oai usage: {oai}")
want(badv["status"] == "failed" and badv["error_code"] == "invalid_request"
     and "field 'truncate': expected \"start\", \"end\" or \"middle\"" in badv["error"], f"bad: {badv}")
for m in errs: print("FAIL", m)
sys.exit(1 if errs else 0)
EOF
then ok "truncate results"; else bad "truncate results"; fi

finish
