#!/usr/bin/env bash
# Structured output end to end on the CPU backend: a tiny random Qwen3 with the real Qwen3 tokenizer
# (its unconstrained output is noise, so every valid JSON is the grammar's doing) runs jobs under JSON
# Schemas (flat, nested, arrays, enums, anyOf, recursive $ref, patterns, formats, number bounds) at
# several seeds and temperatures, json_object, regexes and choices, as llmq jobs and as OpenAI Batch
# lines, through `llmq run`. Every output that ends by itself must parse and validate with
# python3-jsonschema (an independent validator) or fully match its regex with Python's re; outputs
# cut by max_tokens must say that their JSON is incomplete. A third of the jobs run again in another
# batch give the same outputs (determinism, independence from the batch).
. "$(dirname "$0")/worker_lib.sh"
command -v jq >/dev/null || { echo "SKIPPED: jq is not installed"; exit 77; }
python3 -c 'import jsonschema' 2>/dev/null || { echo "SKIPPED: python3-jsonschema is not installed"; exit 77; }
QTOK=${LLMQ_ASSETS:-}/qwen3-tokenizer
[ -f "$QTOK/tokenizer.json" ] || { echo "SKIPPED: no Qwen3 tokenizer in \$LLMQ_ASSETS (tests/assets/fetch.sh)"; exit 77; }
HERE=$(cd "$(dirname "$0")" && pwd)
SCHEMAS=$HERE/../fixtures/structured/schemas.json

make_model --tokenizer "$QTOK"
python3 "$HERE/structured_check.py" jobs "$SCHEMAS" "$T/jobs.jsonl" || { bad "writing the jobs"; finish; }
"$LLMQ" run --backend cpu --model "$M" -i "$T/jobs.jsonl" -o "$T/out.jsonl" --threads 2 2>"$T/run.log"
eq "llmq run exit" "$?" 0
if python3 "$HERE/structured_check.py" check "$SCHEMAS" "$T/jobs.jsonl" "$T/out.jsonl" >"$T/check.log"; then
  ok "every output parses and validates ($(tail -1 "$T/check.log"))"
else
  bad "structured outputs: $(grep FAIL "$T/check.log" | head -5) $(tail -1 "$T/check.log")"
fi

# determinism and batch independence: every third job again, in another batch, gives the same text
awk 'NR % 3 == 1' "$T/jobs.jsonl" >"$T/some.jsonl"
"$LLMQ" run --backend cpu --model "$M" -i "$T/some.jsonl" -o "$T/some_out.jsonl" --threads 2 2>>"$T/run.log"
texts() { jq -c '[.custom_id // .id, .text // .response.body.choices[0].message.content]' "$1" | sort; }
if [ -s "$T/some_out.jsonl" ] && [ -z "$(comm -13 <(texts "$T/out.jsonl") <(texts "$T/some_out.jsonl"))" ]; then
  ok "$(wc -l <"$T/some.jsonl") jobs again in another batch give the same outputs"
else
  bad "a second run differs: $(comm -13 <(texts "$T/out.jsonl") <(texts "$T/some_out.jsonl") | head -3)"
fi

# the reasoning split: a prompt that ends inside an open think block reasons freely for the thinking
# budget, the close is forced, then the answer is under the grammar (the forced "\n\n" is not in it)
P='<|im_start|>user\nPick one.<|im_end|>\n<|im_start|>assistant\n<think>\n'
cat >"$T/think.jsonl" <<EOF2
{"id": "c", "prompt": "$P", "thinking_budget": 4, "choice": ["alpha", "beta"], "max_tokens": 40, "seed": 5}
{"id": "r", "prompt": "$P", "thinking_budget": 2, "regex": "[0-9]{3}", "max_tokens": 40, "seed": 6}
{"id": "j", "prompt": "$P", "thinking_budget": 3, "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"enum": [1, 2]}}}, "max_tokens": 40, "seed": 7}
EOF2
"$LLMQ" run --backend cpu --model "$M" -i "$T/think.jsonl" -o "$T/think_out.jsonl" --threads 1 2>>"$T/run.log"
tline() { jq -c --arg id "$1" 'select(.id == $id)' "$T/think_out.jsonl"; }
case "$(tline c | jq -r .text)" in alpha|beta) ok "choice after a forced close: $(tline c | jq -c '[.text, .finish_reason]')";; *) bad "choice after think: $(tline c)";; esac
case "$(tline r | jq -r .text)" in [0-9][0-9][0-9]) ok "regex after a forced close";; *) bad "regex after think: $(tline r)";; esac
eq "json after a forced close parses" "$(tline j | jq -c '[.json == 1 or .json == 2, .finish_reason]')" '[true,"stop"]'
eq "the reasoning is kept apart" "$(tline c | jq -r '.reasoning | length > 0')" "true"

# refusals: a schema outside the subset, two constraints, a regex the grammar cannot express
cat >"$T/bad.jsonl" <<'EOF2'
{"id": "oneof", "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"oneOf": [{"type": "string"}]}}}}
{"id": "two", "prompt": "x", "regex": "a+", "choice": ["a"]}
{"id": "lookahead", "prompt": "x", "regex": "(?=a)a"}
{"id": "fine", "prompt": "x", "max_tokens": 5, "choice": ["ok"]}
EOF2
"$LLMQ" run --backend cpu --model "$M" -i "$T/bad.jsonl" -o "$T/bad_out.jsonl" --threads 1 2>>"$T/run.log"
line() { jq -c --arg id "$1" 'select(.id == $id)' "$T/bad_out.jsonl"; }
eq "a schema outside the subset fails its job" "$(line oneof | jq -r .error_code)" "invalid_response_format"
case "$(line oneof | jq -r .error)" in *"'oneOf' at /"*) ok "oneOf named";; *) bad "oneOf: $(line oneof)";; esac
eq "two constraints fail the job" "$(line two | jq -r .error_code)" "invalid_response_format"
case "$(line lookahead | jq -r .error)" in *lookahead*) ok "a lookahead is refused by name";; *) bad "lookahead: $(line lookahead)";; esac
eq "the good job beside them runs" "$(line fine | jq -r .text)" "ok"
finish
