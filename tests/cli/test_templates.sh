#!/usr/bin/env bash
# Prompt templates end to end: a real redis-server, a real worker on a tiny model.
#  - a templated job (pushed by redis-cli, and one built by `llmq enqueue --template --var @FILE`)
#    gives exactly the output and prompt length of the same text sent as one user message: the
#    reference is a plain `messages` job whose content is the template filled in by hand here;
#  - bad templated jobs (unknown template, missing var, a var that is not a string, prompt and
#    template both, vars without template) fail with their reason on llmq:dead and in SQLite,
#    and the worker goes on with the jobs behind them;
#  - a template with unbalanced braces stops the worker and `llmq enqueue` at config load with
#    the file, line and key path.
. "$(dirname "$0")/worker_lib.sh"
redis_start
make_model
write_config 'templates:' \
  '  summarize: "Summarize this:\n{document}\n\nIn {n} words. Literal braces: {{ok}}"' \
  '  plain: "{document}"'

# The rendered text, written out by hand from the template above.
DOC='The quick brown fox jumps over the lazy dog. {not a placeholder}'
RENDERED="Summarize this:
$DOC

In 12 words. Literal braces: {ok}"
FILEDOC='A document read from a file, "quoted", with a second line.
Second line.'
printf '%s' "$FILEDOC" >"$T/doc.txt"

python3 - "$T/jobs.jsonl" "$DOC" "$RENDERED" "$FILEDOC" <<'PY'
import json, sys
path, doc, rendered, filedoc = sys.argv[1:5]
common = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}
jobs = [
    # bad ones first: the worker must go on to the good ones behind them
    {"id": "bad-unknown", "template": "nope", "vars": {"document": doc}},
    {"id": "bad-missing", "template": "summarize", "vars": {"document": doc}},
    {"id": "bad-type", "template": "summarize", "vars": {"document": ["x"], "n": 12}},
    {"id": "bad-bool", "template": "plain", "vars": {"document": True}},
    {"id": "bad-both", "template": "plain", "prompt": "x", "vars": {"document": doc}},
    {"id": "bad-vars", "prompt": "x", "vars": {"document": doc}},
    {"id": "t1", "template": "summarize", "vars": {"document": doc, "n": 12, "unused": "x"}, **common},
    {"id": "r1", "messages": [{"role": "user", "content": rendered}], **common},
    {"id": "rf", "messages": [{"role": "user", "content": filedoc}], **common},
]
with open(path, "w") as f:
    for j in jobs:
        f.write(json.dumps(j) + "\n")
PY
push_file "$T/jobs.jsonl"
out=$("$LLMQ" enqueue -c "$CFG" --template plain --var document=@"$T/doc.txt" --id tf \
  --set max_tokens=12 --set temperature=0 --set ignore_eos=true --set metadata='{"file": "doc.txt"}' --print-ids 2>"$T/enq.err")
eq "llmq enqueue --template prints the id" "$out" tf
eq "queued" "$(rcli LLEN llmq:queue:short)" 10

worker_start w1 --drain
worker_wait w1
eq "worker exit status: jobs failed" "$WRC" 3
eq "one row per job" "$(rows)" 10

# the templated jobs against their hand-rendered references
for pair in t1:r1 tf:rf; do
  t=${pair%%:*} r=${pair##*:}
  eq "$t completed" "$(sql "SELECT status FROM jobs WHERE id = '$t'")" completed
  eq "$r completed" "$(sql "SELECT status FROM jobs WHERE id = '$r'")" completed
  got=$(sql "SELECT prompt_tokens || '|' || completion_tokens || '|' || hex(output) FROM jobs WHERE id = '$t'")
  want=$(sql "SELECT prompt_tokens || '|' || completion_tokens || '|' || hex(output) FROM jobs WHERE id = '$r'")
  [ -n "$got" ] && [ "$got" == "$want" ] && ok "$t: same prompt tokens and output as the messages job $r" \
    || bad "$t differs from $r: $got vs $want"
done
# the prompt really contains the document: more prompt tokens than the template's text alone
pt=$(sql "SELECT prompt_tokens FROM jobs WHERE id = 't1'")
[ "${pt:-0}" -gt "${#DOC}" ] && ok "t1's prompt holds the document ($pt tokens)" || bad "t1 prompt_tokens $pt"
eq "metadata of the enqueued job" "$(sql "SELECT json_extract(metadata, '\$.file') FROM jobs WHERE id = 'tf'")" doc.txt

# the bad ones: failed rows, dead letters with the reason, hashes failed
check_bad() {
  local id=$1 want=$2 err dead
  err=$(sql "SELECT status || ': ' || error FROM jobs WHERE id = '$id'")
  case "$err" in failed:*"$want"*) ok "$id failed: $want" ;; *) bad "$id: row '$err', want failed with '$want'" ;; esac
  dead=$(rcli LRANGE llmq:dead 0 -1 | python3 -c '
import json, sys
for l in sys.stdin:
    if l.strip():
        e = json.loads(l)
        if e.get("id") == sys.argv[1]:
            print(e["error"])' "$id")
  case "$dead" in *"$want"*) ok "$id on llmq:dead" ;; *) bad "$id: dead entry '$dead'" ;; esac
  eq "$id hash" "$(rcli HGET "llmq:job:$id" status)" failed
}
check_bad bad-unknown "field 'template': no template named 'nope' in the config"
check_bad bad-missing "field 'vars': template 'summarize' needs 'n'"
check_bad bad-type "field 'vars.document': expected a string or a number, got [\"x\"]"
check_bad bad-bool "field 'vars.document': expected a string or a number, got true"
check_bad bad-both "fields 'prompt', 'messages', 'template' and 'document' exclude each other"
check_bad bad-vars "field 'vars': only used with 'template'"
eq "6 dead letters" "$(rcli LLEN llmq:dead)" 6

# a malformed template is a config error with file, line and key path
cp "$CFG" "$T/bad.yaml"
printf '  broken: "Summarize {document"\n' >>"$T/bad.yaml"
line=$(grep -n 'broken:' "$T/bad.yaml" | cut -d: -f1)
"$LLMQ" worker -c "$T/bad.yaml" --drain >"$T/bad.out" 2>&1
rc=$?
[ "$rc" -ne 0 ] && ok "worker refuses the config (exit $rc)" || bad "worker accepted a bad template"
grep -qF "bad.yaml:$line: templates.broken: unmatched '{' at byte 10" "$T/bad.out" \
  && ok "worker names file, line and key" || bad "worker message: $(cat "$T/bad.out")"
"$LLMQ" enqueue -c "$T/bad.yaml" --template plain --var document=x >"$T/bad2.out" 2>&1
rc=$?
[ "$rc" -ne 0 ] && grep -qF "templates.broken: unmatched '{'" "$T/bad2.out" \
  && ok "enqueue refuses it too" || bad "enqueue with a bad template: rc $rc $(cat "$T/bad2.out")"
"$LLMQ" config -c "$CFG" --set 'templates.x={a b}' >"$T/bad3.out" 2>&1 && bad "--set accepted '{a b}'" ||
  { grep -q "is not a name" "$T/bad3.out" && ok "--set templates.x is checked too" || bad "--set: $(cat "$T/bad3.out")"; }
finish
