#!/usr/bin/env bash
# `llmq results` against a results database written by a real worker (redis-server, tiny model,
# CPU backend): jobs in both forms, completed and failed, finished in two rounds a few seconds
# apart. Every format is read back with Python's json and csv modules and compared with what
# SQLite holds (sqlite3 module); the --status, --since/--until (unix seconds, ISO 8601 in UTC,
# with an offset and in local time, ages) and --limit filters are checked against SQL queries.
. "$(dirname "$0")/worker_lib.sh"

# ---- the command line
out=$("$LLMQ" results --help); eq "results --help" "$?" 0
echo "$out" | grep -q "Usage: llmq results" || bad "results --help has no Usage line"
echo "$out" | grep -q "Examples:" || bad "results --help has no examples"
out=$("$LLMQ" results --format xml 2>&1); eq "bad --format" "$?" 2
out=$("$LLMQ" results --status done 2>&1); eq "bad --status" "$?" 2
out=$("$LLMQ" results --since yesterday 2>&1); eq "bad --since" "$?" 2
out=$("$LLMQ" results --until 2025-02-30 2>&1); eq "--until: Feb 30" "$?" 2
out=$("$LLMQ" results --limit 0 2>&1); eq "bad --limit" "$?" 2
out=$("$LLMQ" results extra 2>&1); eq "an operand" "$?" 2
out=$(env -u LLMQ_CONFIG "$LLMQ" results --db "$T/none.db" 2>&1); eq "no database" "$?" 1
echo "$out" | grep -q "no database at $T/none.db" || bad "missing database not explained: $out"

redis_start
make_model
write_config

# ---- round 1: llmq form, a failure (unknown field), OpenAI chat + completions + a failing line
cat >"$T/r1.jsonl" <<'EOF2'
{"id": "a-1", "prompt": "Hello, \"world\"", "max_tokens": 12, "temperature": 0.5, "seed": 1, "metadata": {"doc": "one, two"}}
{"id": "a-2", "messages": [{"role": "user", "content": "Summarize: cats sleep a lot."}], "max_tokens": 6, "temperature": 0}
{"id": "a-bad", "prompt": "x", "max_token": 3}
{"custom_id": "oa-1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0}}
{"custom_id": "oa-2", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once", "max_tokens": 4, "temperature": 0}}
{"custom_id": "oa-bad", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "n": 2}}
EOF2
push_file "$T/r1.jsonl"
worker_start w1 --drain
worker_wait w1
eq "round 1 rows" "$(rows)" 6
sleep 1.5
# ---- round 2
cat >"$T/r2.jsonl" <<'EOF2'
{"id": "b-1", "prompt": "line one\nline two", "max_tokens": 20, "temperature": 1, "seed": 7, "ignore_eos": true}
{"id": "b-2", "prompt": "short", "max_tokens": 2}
{"custom_id": "oa-3", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Bye"}], "max_tokens": 3}}
EOF2
push_file "$T/r2.jsonl"
worker_start w2 --drain
worker_wait w2
eq "round 2 rows" "$(rows)" 9
eq "failed rows" "$(sql "SELECT group_concat(id) FROM (SELECT id FROM jobs WHERE status = 'failed' ORDER BY id)")" "a-bad,oa-bad"

# a time between the rounds (whole seconds, so local-time forms without fractions work too)
SPLIT=$(sql "SELECT CAST(max(finished_at) AS INTEGER) + 1 FROM jobs WHERE id IN ('a-1','a-2','a-bad','oa-1','oa-2','oa-bad')")
second_min=$(sql "SELECT min(finished_at) >= $SPLIT FROM jobs WHERE id IN ('b-1','b-2','oa-3')")
[ "$second_min" = 1 ] || bad "the rounds overlap in whole seconds (test setup)"

# compare FILE FORMAT SQL-WHERE: the export in FILE equals the rows the WHERE clause selects
compare() {
  python3 - "$DB" "$@" <<'PY'
import csv, json, math, re, sqlite3, sys
db_path, path, fmt, where = sys.argv[1:5]
db = sqlite3.connect(db_path)
cols = [r[1] for r in db.execute("PRAGMA table_info(jobs)")]
rows = db.execute(f"SELECT * FROM jobs WHERE {where} ORDER BY finished_at, id").fetchall()
rows = [dict(zip(cols, r)) for r in rows]
errs = []
if fmt in ("jsonl", "openai"):
    lines = open(path, encoding="utf-8").read().split("\n")
    if lines[-1] != "":
        errs.append("no final newline")
    lines = lines[:-1]
    got = [json.loads(l) for l in lines]
    want = [json.loads(r["result"]) for r in rows]
    if got != want:
        errs.append(f"{len(got)} lines, want {len(want)}; first difference at {next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)}")
    if fmt == "openai":
        for g, r in zip(got, rows):
            if not re.fullmatch(r"batch_req_[0-9a-f]{32}", g["id"]) or g["custom_id"] != r["custom_id"]:
                errs.append(f"openai line ids: {g['id']} {g['custom_id']}")
            if r["status"] == "completed":
                if g["error"] is not None or g["response"]["status_code"] != 200 or not g["response"]["request_id"].startswith("req_"):
                    errs.append(f"openai ok line {g}")
                body = g["response"]["body"]
                c = body["choices"][0]
                text = c["message"]["content"] if body["object"] == "chat.completion" else c["text"]
                if text != r["output"] or body["usage"]["completion_tokens"] != r["completion_tokens"]:
                    errs.append(f"openai body differs from the row: {r['id']}")
            else:
                if g["response"] is not None or not g["error"]["code"] or not g["error"]["message"]:
                    errs.append(f"openai error line {g}")
else:
    raw = open(path, "rb").read()
    if rows and not raw.endswith(b"\r\n"):
        errs.append("CSV lines do not end with CRLF")
    rd = list(csv.reader(open(path, newline="", encoding="utf-8")))
    header, body = rd[0], rd[1:]
    want_cols = [c for c in cols if c not in ("result", "request")]
    if header != want_cols:
        errs.append(f"header {header}")
    if len(body) != len(rows):
        errs.append(f"{len(body)} rows, want {len(rows)}")
    for rec, r in zip(body, rows):
        for name, v in zip(header, rec):
            w = r[name]
            if w is None:
                ok = v == ""
            elif isinstance(w, float):
                ok = v != "" and float(v) == w
            elif isinstance(w, int):
                ok = v == str(w)
            else:
                ok = v == w
            if not ok:
                errs.append(f"{r['id']}.{name}: {v!r} != {w!r}")
    # NULL is an empty field, "" is a quoted empty string
    text = raw.decode()
if errs:
    print("\n".join(errs[:10])); sys.exit(1)
PY
}

R="$LLMQ results -c $CFG"
# ---- every format, all rows
$R >"$T/all.jsonl"; eq "jsonl exit" "$?" 0
compare "$T/all.jsonl" jsonl "1" && ok "jsonl equals the result column, in finished_at order" || bad "jsonl differs"
$R --format csv >"$T/all.csv"; eq "csv exit" "$?" 0
compare "$T/all.csv" csv "1" && ok "csv equals every column" || bad "csv differs"
$R --format openai >"$T/all.openai"; eq "openai exit" "$?" 0
compare "$T/all.openai" openai "request_form = 'openai'" && ok "openai: the batch lines, ok and error forms" || bad "openai differs"
eq "openai lines" "$(wc -l <"$T/all.openai")" 4
eq "an error line for the failed batch request" "$(grep -c '"response":null' "$T/all.openai")" 1

# ---- filters
$R --status failed >"$T/f.jsonl"; compare "$T/f.jsonl" jsonl "status = 'failed'" && ok "--status failed" || bad "--status failed"
$R --status completed --format csv >"$T/c.csv"; compare "$T/c.csv" csv "status = 'completed'" && ok "--status completed (csv)" || bad "--status completed"
$R --since "$SPLIT" >"$T/s.jsonl"; compare "$T/s.jsonl" jsonl "finished_at >= $SPLIT" && ok "--since unix seconds" || bad "--since unix"
eq "--since picks round 2" "$(wc -l <"$T/s.jsonl")" 3
$R --until "$SPLIT" --format csv >"$T/u.csv"; compare "$T/u.csv" csv "finished_at < $SPLIT" && ok "--until unix seconds" || bad "--until unix"
iso_utc=$(python3 -c "import datetime,sys; print(datetime.datetime.fromtimestamp($SPLIT, datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'))")
$R --since "$iso_utc" >"$T/s2.jsonl"; compare "$T/s2.jsonl" jsonl "finished_at >= $SPLIT" && ok "--since ISO 8601 UTC ($iso_utc)" || bad "--since $iso_utc"
iso_off=$(python3 -c "import datetime as d; print(d.datetime.fromtimestamp($SPLIT, d.timezone(d.timedelta(hours=5, minutes=30))).strftime('%Y-%m-%dT%H:%M:%S+05:30'))")
$R --since "$iso_off" >"$T/s3.jsonl"; compare "$T/s3.jsonl" jsonl "finished_at >= $SPLIT" && ok "--since ISO 8601 with an offset ($iso_off)" || bad "--since $iso_off"
iso_local=$(TZ=America/New_York python3 -c "import datetime; print(datetime.datetime.fromtimestamp($SPLIT).strftime('%Y-%m-%d %H:%M:%S'))")
TZ=America/New_York $R --until "$iso_local" >"$T/s4.jsonl"; compare "$T/s4.jsonl" jsonl "finished_at < $SPLIT" && ok "--until local time ($iso_local, New York)" || bad "--until $iso_local"
$R --since "$SPLIT" --until "$((SPLIT + 3600))" --status completed --format openai >"$T/s5.openai"
compare "$T/s5.openai" openai "finished_at >= $SPLIT AND status = 'completed' AND request_form = 'openai'" && ok "filters combined" || bad "filters combined"
eq "openai round 2" "$(wc -l <"$T/s5.openai")" 1
$R --since 1h >"$T/age.jsonl"; eq "--since 1h: everything" "$(wc -l <"$T/age.jsonl")" 9
$R --until 1h >"$T/age2.jsonl"; eq "--until 1h: nothing" "$(wc -l <"$T/age2.jsonl")" 0
$R --limit 2 >"$T/l.jsonl"; eq "--limit 2" "$(wc -l <"$T/l.jsonl")" 2
[ "$(head -2 "$T/all.jsonl")" == "$(cat "$T/l.jsonl")" ] && ok "--limit: the oldest first" || bad "--limit rows differ"

# ---- --output, --db, the config's path
$R --format csv --output "$T/out.csv" 2>"$T/out.err"; eq "--output exit" "$?" 0
cmp -s "$T/out.csv" "$T/all.csv" && ok "--output writes what stdout gets" || bad "--output differs"
grep -q "9 rows written to $T/out.csv" "$T/out.err" && ok "--output summary" || bad "summary: $(cat "$T/out.err")"
ls "$T"/out.csv.tmp-* >/dev/null 2>&1 && bad "a temporary file was left" || ok "no temporary file left"
"$LLMQ" results -c "$CFG" --output "$T/no/such/dir/x.jsonl" 2>/dev/null; eq "unwritable --output: exit 1" "$?" 1
mkdir -p "$T/adir/in" # a folder in the way: the rename fails, the folder stays, no temporary file
"$LLMQ" results -c "$CFG" --output "$T/adir" 2>"$T/adir.err"; eq "--output onto a folder: exit 1" "$?" 1
grep -q "cannot rename .*adir" "$T/adir.err" && ok "--output onto a folder: the error names it" || bad "adir: $(cat "$T/adir.err")"
[ -d "$T/adir/in" ] && ! ls "$T"/adir.tmp-* >/dev/null 2>&1 && ok "--output onto a folder: nothing changed" || bad "adir changed"
env -u LLMQ_CONFIG "$LLMQ" results --db "$DB" >"$T/db.jsonl"; cmp -s "$T/db.jsonl" "$T/all.jsonl" && ok "--db PATH" || bad "--db differs"
(cd "$T" && env -u LLMQ_CONFIG LLMQ_SQLITE_PATH="$DB" "$LLMQ" results --format csv >"$T/env.csv") && cmp -s "$T/env.csv" "$T/all.csv" && ok "the path from the environment" || bad "LLMQ_SQLITE_PATH"
finish
