#!/usr/bin/env python3
"""Push one job onto an llmq queue and wait until a worker has finished it (redis-py).

    pip install redis
    python3 enqueue_wait.py --prompt "Summarize: ..." --max-tokens 64
    python3 enqueue_wait.py --template summarize --var document=@report.txt --db /var/lib/llmq/llmq.db

Prints one JSON line: {"id", "status", "finish_reason", "prompt_tokens", "completion_tokens",
"error", "text"}. The text comes from the job hash's `result` field (the result line `llmq
results` exports); a result over the worker's redis.result_max_bytes is in SQLite only (the field
then holds {"truncated": true, ...}) and is read from --db when given (Python's own sqlite3
module). Exit status 0 when the job completed, 1 when it failed or was cancelled, 2 on a timeout
or a usage error.

How it waits (docs/QUEUE.md): remember the newest entry of the events stream llmq:events, push
the job, then XREAD from that entry on; an entry with the job's id and a final status
(completed, failed, cancelled) ends the wait. The job hash llmq:job:<id> is read after every
empty XREAD too, so a trimmed stream or a missed entry cannot make it hang.
"""
import argparse
import json
import sqlite3
import sys
import time
import uuid

FINAL = {"completed", "failed", "cancelled"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="Redis URL (redis.url)")
    p.add_argument("--prefix", default="llmq", help="key prefix (redis.prefix)")
    p.add_argument("--queue", default="short", choices=["short", "long"])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="the prompt, sent without a chat template")
    g.add_argument("--template", help="a template of the worker's config")
    p.add_argument("--var", action="append", default=[], metavar="NAME=TEXT|NAME=@FILE",
                   help="a template variable (repeatable); @FILE reads a file")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--id", help="job id (default: a new UUID)")
    p.add_argument("--db", help="the worker's SQLite database, to print the generated text")
    p.add_argument("--timeout", type=float, default=300, metavar="S", help="seconds to wait")
    return p.parse_args()


def build_job(a):
    job = {"id": a.id or str(uuid.uuid4()), "max_tokens": a.max_tokens, "temperature": a.temperature}
    if a.prompt is not None:
        job["prompt"] = a.prompt
    else:
        job["template"] = a.template
        job["vars"] = {}
        for v in a.var:
            name, sep, value = v.partition("=")
            if not sep:
                sys.exit(f"--var {v}: expected NAME=TEXT or NAME=@FILE")
            if value.startswith("@"):
                with open(value[1:], encoding="utf-8") as f:
                    value = f.read()
            job["vars"][name] = value
    return job


def main():
    a = parse_args()
    import redis  # after the arguments, so --help works without redis-py

    r = redis.Redis.from_url(a.redis, decode_responses=True)
    job = build_job(a)
    jid, pre = job["id"], a.prefix
    events, hkey = f"{pre}:events", f"{pre}:job:{jid}"

    newest = r.xrevrange(events, count=1)
    last = newest[0][0] if newest else "0-0"
    with r.pipeline(transaction=True) as p:  # the hash first, so the job can be followed at once
        p.hset(hkey, mapping={"status": "queued", "queue": a.queue, "created_at": f"{time.time():.3f}",
                              "attempts": 0})
        p.lpush(f"{pre}:queue:{a.queue}", json.dumps(job))
        p.execute()

    deadline = time.monotonic() + a.timeout
    status = None
    while status not in FINAL:
        if time.monotonic() > deadline:
            print(json.dumps({"id": jid, "status": "timeout"}))
            return 2
        for _, entries in r.xread({events: last}, block=1000, count=1000) or []:
            for entry_id, fields in entries:
                last = entry_id
                if fields.get("id") == jid and fields.get("status") in FINAL:
                    status = fields["status"]
        if status is None:
            s = r.hget(hkey, "status")
            status = s if s in FINAL else None

    h = r.hgetall(hkey)
    out = {"id": jid, "status": h.get("status", status), "finish_reason": h.get("finish_reason"),
           "prompt_tokens": int(h.get("prompt_tokens", 0)), "completion_tokens": int(h.get("completion_tokens", 0)),
           "error": h.get("error"), "text": None}
    result = json.loads(h["result"]) if h.get("result") else {"truncated": True}
    if not result.get("truncated"):
        out["text"] = result.get("text")  # llmq's result object
    elif a.db:
        db = sqlite3.connect(f"file:{a.db}?mode=ro", uri=True, timeout=10)
        row = db.execute("SELECT output, error FROM jobs WHERE id = ?", (jid,)).fetchone()
        if row:
            out["text"], out["error"] = row[0], row[1] or out["error"]
    print(json.dumps(out, ensure_ascii=False))
    return 0 if out["status"] == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
