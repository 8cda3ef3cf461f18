#!/usr/bin/env bash
# Structured output around the engine: `llmq enqueue` refuses a job whose JSON Schema js_compile
# refuses (or that asks for two constraints), naming the line, the keyword and its JSON pointer,
# and pushes nothing (a real redis-server); `llmq results --format csv --columns` flattens fields of
# jobs.output_json from a real SQLite file whose schema is schemas/NNN_*.sql, each field checked
# against SQLite's own json_extract (python3's sqlite3 module) and Python's csv reader.
. "$(dirname "$0")/worker_lib.sh"
SRC=${LLMQ_SOURCE_DIR:?run through ctest (LLMQ_SOURCE_DIR is not set)}

# ---- enqueue: refused before anything is pushed
redis_start
cat >"$T/bad.jsonl" <<'EOF2'
{"id": "ok-1", "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "doc", "schema": {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"], "additionalProperties": false}, "strict": true}}}
{"id": "bad-1", "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "doc", "schema": {"type": "object", "properties": {"tags": {"type": "object", "patternProperties": {"^a": {}}}}}}}}
{"custom_id": "bad-2", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "x"}], "regex": "[a-z]+", "choice": ["a"]}}
EOF2
out=$("$LLMQ" enqueue --redis "$URL" --no-batch "$T/bad.jsonl" 2>&1); eq "a refused schema fails enqueue" "$?" 1
echo "$out" | grep -qF "line 2: field 'response_format.json_schema.schema': unsupported keyword 'patternProperties' at /properties/tags" &&
  ok "the message names the line, keyword and pointer" || bad "enqueue message: $out"
echo "$out" | grep -qF "line 3: fields 'body.regex' and 'body.choice' exclude each other" &&
  ok "two constraints are named" || bad "enqueue message: $out"
eq "nothing pushed" "$(rcli --scan --pattern 'llmq:*' | grep -c . )" 0
head -1 "$T/bad.jsonl" >"$T/good.jsonl"
"$LLMQ" enqueue --redis "$URL" --no-batch "$T/good.jsonl" >/dev/null 2>&1; eq "a good schema is enqueued" "$?" 0
eq "one job pushed" "$(rcli LLEN llmq:queue:short)" 1

# ---- a worker runs them (the tiny model, unconstrained until the engine has grammars: its noise
# is seldom JSON, so whatever it writes, the row, the result line and the Redis hash must agree)
make_model
write_config
cat >"$T/run.jsonl" <<'EOF2'
{"id": "obj-1", "prompt": "x", "max_tokens": 4, "seed": 3, "response_format": {"type": "json_object"}}
{"id": "ch-1", "prompt": "x", "max_tokens": 2, "choice": ["yes", "no"]}
{"custom_id": "oa-1", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": {"type": "object"}}}}}
EOF2
push_file "$T/run.jsonl"
worker_start w1 --drain
worker_wait w1
eq "the worker drained" "$WRC" 0
eq "four rows" "$(rows)" 4
for id in ok-1 obj-1 ch-1 oa-1; do
  rcli HGET "llmq:job:$id" result >"$T/hash-$id.json"
done
python3 - "$DB" "$T" <<'PY' && ok "rows, result lines and Redis hashes agree on json" || bad "structured rows"
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
want_kind = {"ok-1": "json_schema", "obj-1": "json_object", "ch-1": "choice", "oa-1": "json_schema"}
for rid, kind in want_kind.items():
    status, params, out, oj, result, fr = db.execute(
        "SELECT status, params, output, output_json, result, finish_reason FROM jobs WHERE id = ?", (rid,)).fetchone()
    assert status == "completed", (rid, status)
    assert json.loads(params)["constraint"] == kind, (rid, params)
    line = json.loads(result)
    assert json.loads(open(f"{sys.argv[2]}/hash-{rid}.json").read()) == line, rid
    try:
        parsed = json.loads(out)
    except ValueError:
        parsed = None
    if kind == "choice":
        assert oj is None and "json" not in line, rid
    elif rid == "oa-1":
        assert "json" not in json.dumps(line["response"]["body"]["choices"][0]), line  # OpenAI's shape
        assert line["response"]["body"]["choices"][0]["message"]["content"] == out
        assert (oj is None) == (parsed is None or (fr != "stop" and isinstance(parsed, (int, float)))), (rid, out, oj)
    else:
        assert line["json_incomplete"] == (oj is None), (rid, line, oj)
        assert line["json"] == (json.loads(oj) if oj is not None else None), (rid, line, oj)
        assert (oj is None) == (parsed is None or (fr != "stop" and isinstance(parsed, (int, float)))), (rid, out, oj)
PY

# ---- a results database with every migration, and rows with and without output_json
DB=$T/structured.db
python3 - "$SRC" "$DB" <<'PY' || { echo "FAIL making the database"; exit 1; }
import glob, sqlite3, sys
src, path = sys.argv[1:3]
db = sqlite3.connect(path)
files = sorted(glob.glob(f"{src}/schemas/[0-9][0-9][0-9]_*.sql"))
for f in files:
    db.executescript(open(f, encoding="utf-8").read())
db.execute(f"PRAGMA user_version = {len(files)}")
db.execute(f"PRAGMA application_id = {0x6c6c6d71}")  # "llmq"
rows = [
    ("r1", '{"title": "Cafe, \\"bar\\"", "sentiment": "pos", "entities": [{"name": "A"}, {"name": "B, C"}], '
           '"meta": {"k": [1, 2]}, "n": 0.10, "ok": true, "none": null, "odd, key": "x"}'),
    ("r2", '{"title": "line\\nbreak", "sentiment": "neg", "entities": [], "n": -3}'),
    ("r3", None),  # free text, or JSON cut by max_tokens
]
for i, (rid, js) in enumerate(rows):
    db.execute("INSERT INTO jobs (id, status, output, finished_at, output_json) VALUES (?, 'completed', 'text', ?, json(?))",
               (rid, 1.8e9 + i, js))
db.commit()
PY
R="$LLMQ results --db $DB"
COLS='id,$.title,$.sentiment,$.entities[1].name,$.meta,$.n,$.ok,$.none,$."odd, key",$.missing,$.entities[5]'
$R --format csv --columns "$COLS" >"$T/cols.csv"; eq "--columns exit" "$?" 0
python3 - "$DB" "$T/cols.csv" "$COLS" <<'PY' && ok "--columns fields equal json_extract's values" || bad "--columns differs"
import csv, json, sqlite3, sys
db_path, path, cols = sys.argv[1:4]
raw = open(path, "rb").read()
assert raw.endswith(b"\r\n"), "CSV lines end with CRLF"
rd = list(csv.reader(open(path, newline="", encoding="utf-8")))
names = ["id", "$.title", "$.sentiment", "$.entities[1].name", "$.meta", "$.n", "$.ok", "$.none",
         '$."odd, key"', "$.missing", "$.entities[5]"]
assert rd[0] == names, rd[0]
db = sqlite3.connect(db_path)
errs = []
for rec in rd[1:]:
    rid = rec[0]
    for name, got in zip(names[1:], rec[1:]):
        (w,) = db.execute("SELECT json_extract(output_json, ?) FROM jobs WHERE id = ?", (name, rid)).fetchone()
        if w is None:
            want = ""
        elif name == "$.ok":
            want = "true" if w else "false"  # json_extract gives 1; the CSV says true
        elif isinstance(w, float):
            want = None
            if float(got) != w:
                errs.append(f"{rid} {name}: {got!r} != {w!r}")
        else:
            want = str(w)
        if want is not None and got != want:
            errs.append(f"{rid} {name}: {got!r} != {want!r}")
assert len(rd) == 4, f"{len(rd) - 1} rows"
assert rd[1][3] == "B, C" and rd[1][4] == '{"k":[1,2]}' and rd[1][8] == "x", rd[1]
assert rd[2][1] == "line\nbreak" and rd[3][1:] == [""] * 10, (rd[2], rd[3])
if errs:
    print("\n".join(errs)); sys.exit(1)
PY
# the whole CSV has output_json as its last column
$R --format csv >"$T/all.csv"; eq "plain csv exit" "$?" 0
head -1 "$T/all.csv" | grep -q ',reasoning_tokens,output_json' && ok "output_json in the full CSV" || bad "header: $(head -1 "$T/all.csv")"
# errors: exit 2 and a message naming the entry
out=$($R --format csv --columns 'id,$.' 2>&1); eq "a bad path exits 2" "$?" 2
echo "$out" | grep -qF "bad JSON path '\$.': expected a member name after '.' at offset 1" && ok "bad path named" || bad "bad path: $out"
out=$($R --format csv --columns '$.a[x]' 2>&1); eq "a bad index exits 2" "$?" 2
echo "$out" | grep -qF "expected an array index [N]" && ok "bad index named" || bad "bad index: $out"
out=$($R --format csv --columns 'id,titel' 2>&1); eq "an unknown column exits 2" "$?" 2
echo "$out" | grep -qF "unknown column 'titel'" && ok "unknown column named" || bad "unknown column: $out"
out=$($R --columns '$.title' 2>&1); eq "--columns without csv exits 2" "$?" 2
finish
