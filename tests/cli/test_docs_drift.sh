#!/usr/bin/env bash
# The docs against what a real worker writes, so they cannot drift apart unnoticed:
#  - every column table of docs/SQLITE.md (`jobs`, `batches`, `job_parts`, `workers`,
#    `worker_metrics`) names exactly the columns of that table in a database the worker made
#    (PRAGMA table_info), and the tables it documents exist;
#  - the dead-letter entry of docs/QUEUE.md: its `job` text pushed as is gets a dead entry with
#    the same fields, the same error and attempts, and both validate against
#    schemas/redis-dead-entry.schema.json;
#  - `gpu` on the CPU backend: NULL in SQLite's `workers` row, `cpu` in the heartbeat hash, as
#    docs/SQLITE.md and docs/QUEUE.md say.
. "$(dirname "$0")/worker_lib.sh"
SRC=${LLMQ_SOURCE_DIR:?run through ctest}

redis_start
make_model
write_config
# the documented dead entry's job, exactly as docs/QUEUE.md shows it
python3 - "$SRC/docs/QUEUE.md" >"$T/doc-dead.json" <<'PY' || bad "docs/QUEUE.md has no dead-letter entry example"
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
m = re.search(r"### Dead-letter entries `llmq:dead`\s*```json\n(.*?)```", text, re.S)
print(m.group(1).strip())
PY
doc_job=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["job"])' "$T/doc-dead.json")
rcli LPUSH llmq:queue:short "$doc_job" '{"id": "good-1", "prompt": "hello", "max_tokens": 4}' >/dev/null
worker_start w1
wait_rows 2
wait_until "the heartbeat hash" test -n "$(rcli HGET llmq:worker:w1 host)"
hb_gpu=$(rcli HGET llmq:worker:w1 gpu)

# ---- gpu on the CPU backend
eq "workers.gpu is NULL on the CPU backend (docs/SQLITE.md)" "$(sql "SELECT gpu IS NULL, backend FROM workers WHERE id = 'w1'")" "1|cpu"
grep -q '| `gpu` | TEXT | the GPU.s name; `NULL` on the CPU backend' "$SRC/docs/SQLITE.md" &&
  ok "docs/SQLITE.md says NULL" || bad "docs/SQLITE.md: the workers.gpu line changed"
eq "the heartbeat's gpu is 'cpu' on the CPU backend" "$hb_gpu" cpu
grep -q '`gpu` (the device.s name; `cpu` on the CPU backend' "$SRC/docs/QUEUE.md" &&
  ok "docs/QUEUE.md says cpu" || bad "docs/QUEUE.md: the heartbeat's gpu is not described as 'cpu' on the CPU backend"

kill -TERM "$W_w1"
worker_wait w1

# ---- the dead-letter entry
rcli LRANGE llmq:dead 0 -1 >"$T/dead.json"
python3 - "$T/doc-dead.json" "$T/dead.json" "$SRC/schemas" <<'PY' && ok "docs/QUEUE.md's dead entry is what a worker writes" || bad "dead entry drift"
import json, sys, pathlib
doc = json.load(open(sys.argv[1]))
real = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
assert len(real) == 1, real
real = real[0]
assert set(doc) == set(real), ("fields differ", sorted(doc), sorted(real))
for k in doc:
    assert type(doc[k]) is type(real[k]) or {type(doc[k]), type(real[k])} <= {int, float}, (k, doc[k], real[k])
for k in ("id", "error", "error_code", "attempts", "queue", "job"):
    assert doc[k] == real[k], f"{k}: docs say {doc[k]!r}, the worker wrote {real[k]!r}"
try:
    import jsonschema
except ImportError:
    print("note: python3-jsonschema is missing: the entries are not checked against the schema")
    sys.exit(0)
schemas = {s["$id"]: s for s in (json.loads(p.read_text()) for p in pathlib.Path(sys.argv[3]).glob("*.schema.json"))}
schema = schemas["urn:llmq:schema:redis-dead-entry"]
try:
    from referencing import Registry, Resource  # jsonschema >= 4.18
    reg = Registry().with_resources((i, Resource.from_contents(s)) for i, s in schemas.items())
    v = jsonschema.Draft202012Validator(schema, registry=reg)
except ImportError:  # Debian 12's jsonschema 4.10
    v = jsonschema.Draft202012Validator(schema, resolver=jsonschema.RefResolver("", schema, store=schemas))
for e in (doc, real):
    v.validate(e)
PY

# ---- docs/SQLITE.md's column tables against the database
python3 - "$SRC/docs/SQLITE.md" "$DB" <<'PY' && ok "docs/SQLITE.md's column tables match the database" || bad "docs/SQLITE.md columns drift"
import re, sqlite3, sys
text = open(sys.argv[1], encoding="utf-8").read()
con = sqlite3.connect(sys.argv[2])
documented = {}
for m in re.finditer(r"^## `(\w+)`[^\n]*\n(.*?)(?=^## )", text, re.S | re.M):
    table, body = m.group(1), m.group(2)
    rows = [l for l in body.splitlines() if l.startswith("| ")]
    if not rows or not rows[0].startswith("| column |"):
        continue
    cols = set()
    for l in rows[2:]:
        cols.update(re.findall(r"`(\w+)`", l.split("|")[1]))
    documented[table] = cols
assert {"jobs", "workers", "worker_metrics"} <= set(documented), sorted(documented)
failed = False
for table, cols in sorted(documented.items()):
    real = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
    if not real:
        print(f"{table}: documented but not in the database"); failed = True; continue
    if cols != real:
        print(f"{table}: not documented: {sorted(real - cols)}; documented but absent: {sorted(cols - real)}")
        failed = True
sys.exit(1 if failed else 0)
PY
finish
