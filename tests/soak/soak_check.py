#!/usr/bin/env python3
"""The soak test's verdict (tests/soak/soak.sh): compares what became of every job with the
manifest written by soak_jobs.py, prints a summary and exits 0 only when every check passes.

    soak_check.py OUT_DIR PORT DB...

Reads OUT_DIR/jobs/manifest.jsonl, OUT_DIR/faults.json (counts by kind, from soak.sh) and
OUT_DIR/meta.json (seed, times, command), every DB given (the workers' results databases) and the
Redis server on 127.0.0.1:PORT. Writes OUT_DIR/verdict.json with the numbers.

Checks (each a line of the summary; any nonzero count in the first group fails the run):
  duplicates        a job with more than one row (in one file with two ids, or in two files)
  lost              a job with no row, not dead-lettered and in no Redis list
  innocent dead     a dead-letter entry of a job that did not fail on its own (printed with its error)
  innocent failed   a failed row of a job that should have completed
  expected failures a malformed job without exactly one failed row and one dead entry
  key mismatch      a row whose id is not the job's key (docs/QUEUE.md "A job's key")
  unknown rows      a row of no job the test pushed
  stranded          jobs left in llmq:queue:*, llmq:processing:* or llmq:retry
  hash mismatch     a job hash whose status is not final or differs from its row's
  batches           a batch hash not completed, or whose counts do not add up
"""
import glob
import json
import os
import re
import socket
import sqlite3
import sys
from collections import Counter, defaultdict

TAG = re.compile(rb"SK[a-z]\d{6}Z")
FINAL = ("completed", "failed", "cancelled")


class Redis:
    """A minimal RESP2 client: enough for LRANGE, HGET, SCAN and friends on binary data."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.f = self.s.makefile("rb")

    def _send(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.s.sendall(b"".join(out))

    def _read(self):
        line = self.f.readline()
        if not line:
            raise ConnectionError("redis closed the connection")
        t, rest = line[:1], line[1:-2]
        if t == b"+":
            return rest
        if t == b"-":
            raise RuntimeError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)
            return data[:-2]
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise RuntimeError("bad reply %r" % line)

    def cmd(self, *args):
        self._send(*args)
        return self._read()

    def pipeline(self, cmds):
        """Sends every command, then reads every reply (in chunks, to bound the buffers)."""
        out = []
        for i in range(0, len(cmds), 1000):
            chunk = cmds[i:i + 1000]
            buf = []
            for c in chunk:
                buf.append(b"*%d\r\n" % len(c))
                for a in c:
                    a = a if isinstance(a, bytes) else str(a).encode()
                    buf.append(b"$%d\r\n%s\r\n" % (len(a), a))
            self.s.sendall(b"".join(buf))
            out.extend(self._read() for _ in chunk)
        return out

    def scan(self, pattern):
        keys, cur = [], b"0"
        while True:
            cur, batch = self.cmd("SCAN", cur, "MATCH", pattern, "COUNT", 1000)
            keys.extend(batch)
            if cur == b"0":
                return sorted(set(keys))


def find_tag(*texts):
    for t in texts:
        if t is None:
            continue
        m = TAG.search(t if isinstance(t, bytes) else t.encode("utf-8", "surrogateescape"))
        if m:
            return m.group(0).decode()
    return None


def main():
    out, port, dbs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    manifest = {}
    for line in open(os.path.join(out, "jobs", "manifest.jsonl")):
        m = json.loads(line)
        manifest[m["tag"]] = m
    faults = json.load(open(os.path.join(out, "faults.json")))
    meta = json.load(open(os.path.join(out, "meta.json")))
    r = Redis(port)
    problems = defaultdict(list)  # check -> lines to print

    # rows in every database, by tag
    rows = defaultdict(list)  # tag -> [(db, id, status, error, attempts, worker, finished_at)]
    status_count = Counter()
    replayed = 0
    for db in dbs:
        if not os.path.exists(db):
            continue
        c = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=30)
        c.text_factory = bytes
        for rid, status, err, attempts, worker, request, metadata, finished in c.execute(
                "SELECT id, status, error, attempts, worker_id, request, metadata, finished_at FROM jobs"):
            rid, status = rid.decode("utf-8", "replace"), status.decode()
            t = find_tag(rid.encode(), metadata, request)
            rec = (os.path.basename(db), rid, status, (err or b"").decode("utf-8", "replace"), attempts,
                   (worker or b"").decode(), finished)
            status_count[status] += 1
            if attempts and attempts > 1:
                replayed += 1
            if t is None or t not in manifest:
                problems["unknown rows"].append("row %r in %s (%s)" % (rid, rec[0], status))
                continue
            rows[t].append(rec)
        c.close()

    # dead letters, by tag
    dead = defaultdict(list)
    for e in r.cmd("LRANGE", "llmq:dead", 0, -1) or []:
        try:
            d = json.loads(e)
        except ValueError:
            problems["unreadable dead entries"].append(e[:200].decode("utf-8", "replace"))
            continue
        t = find_tag((d.get("id") or "").encode(), (d.get("job") or "").encode("utf-8", "surrogateescape"))
        if t is None or t not in manifest:
            problems["unknown dead entries"].append("%s: %s" % (d.get("id"), d.get("error")))
            continue
        dead[t].append(d)

    # what is left in Redis lists
    stranded = {}
    for pattern in ("llmq:queue:*", "llmq:processing:*"):
        for k in r.scan(pattern):
            if r.cmd("TYPE", k) != b"list":
                continue
            n = r.cmd("LLEN", k)
            if n:
                stranded[k.decode()] = n
    n_retry = r.cmd("ZCARD", "llmq:retry")
    if n_retry:
        stranded["llmq:retry"] = n_retry
    in_lists = set()
    for k in stranded:
        items = r.cmd("ZRANGE", k, 0, -1) if k == "llmq:retry" else r.cmd("LRANGE", k, 0, -1)
        for it in items or []:
            t = find_tag(it)
            if t:
                in_lists.add(t)
    for k, n in stranded.items():
        problems["stranded"].append("%s: %d" % (k, n))

    # every job against the manifest
    expected_failures = 0
    for t, m in manifest.items():
        rs, ds = rows.get(t, []), dead.get(t, [])
        if len(rs) > 1:
            problems["duplicates"].append("%s: %d rows: %s" % (
                m["key"] or t, len(rs), ", ".join("%s %s in %s by %s" % (x[1], x[2], x[0], x[5]) for x in rs)))
        for x in rs:
            if m["key"] is not None and x[1] != m["key"]:
                problems["key mismatch"].append("%s: row id %r in %s" % (m["key"], x[1], x[0]))
        if m["expect"] == "ok":
            for d in ds:
                problems["innocent dead"].append("%s (%s, %d bytes): attempts %s, worker %s, error: %s" % (
                    d.get("id") or t, m["kind"], m["bytes"], d.get("attempts"), d.get("worker"), d.get("error")))
            for x in rs:
                if x[2] != "completed":
                    problems["innocent failed"].append("%s: %s row in %s by %s: %s" % (x[1], x[2], x[0], x[5], x[3]))
            if not rs and not ds:
                if t in in_lists:
                    pass  # counted as stranded
                else:
                    problems["lost"].append("%s (%s, via %s, queue %s)" % (m["key"] or t, m["kind"], m["via"],
                                                                            m["queue"]))
        else:
            expected_failures += 1
            # a second failed row is counted among the duplicates, not here
            if not rs or any(x[2] != "failed" for x in rs) or len(ds) != 1:
                problems["expected failures"].append("%s: %d rows (%s), %d dead entries (%s)" % (
                    m["key"] or t, len(rs), ", ".join(x[2] for x in rs), len(ds),
                    "; ".join(str(d.get("error"))[:80] for d in ds)))

    # job hashes: final and agreeing with the row; no job hash left in a non-final state
    # (of duplicate rows, the one a shared file would keep: completed > cancelled > failed)
    rank = {"failed": 0, "cancelled": 1, "completed": 2}
    ids = {}
    for t, rs in rows.items():
        for x in rs:
            if x[1] not in ids or rank.get(x[2], -1) > rank.get(ids[x[1]][1], -1):
                ids[x[1]] = (t, x[2])
    ids = [(t, rid, st) for rid, (t, st) in ids.items()]
    statuses = r.pipeline([("HGET", "llmq:job:" + rid, "status") for _, rid, _ in ids])
    seen = set()
    for (t, rid, st), hs in zip(ids, statuses):
        seen.add(rid)
        hs = hs.decode() if hs else None
        if hs is None and manifest[t]["key"] is None and manifest[t]["expect"] == "fail":
            continue  # not JSON or over max_job_bytes: no key was read, so there is no hash
        if hs != st:
            problems["hash mismatch"].append("llmq:job:%s is %s, its row %s" % (rid, hs, st))
    for k in r.scan("llmq:job:*"):
        if k.decode()[9:] in seen or r.cmd("TYPE", k) != b"hash":
            continue
        hs = r.cmd("HGET", k, "status")
        if hs is None or hs.decode() not in FINAL:
            problems["hash mismatch"].append("%s is %s with no row" % (k.decode(), hs and hs.decode()))

    # batches: completed, counts adding up
    batches = sorted({m["batch"] for m in manifest.values() if m["batch"]})
    for b in batches:
        h = r.cmd("HGETALL", "llmq:batch:" + b) or []
        h = {h[i].decode(): h[i + 1].decode() for i in range(0, len(h), 2)}
        want = sum(1 for m in manifest.values() if m["batch"] == b)
        counts = {k: int(h.get(k, 0)) for k in ("queued", "running", "completed", "failed", "cancelled")}
        if h.get("state") != "completed" or int(h.get("total", -1)) != want or \
                counts["completed"] + counts["failed"] + counts["cancelled"] != want:
            problems["batches"].append("%s: state %s, total %s (pushed %d), %s" % (
                b, h.get("state"), h.get("total"), want, " ".join("%s %d" % kv for kv in counts.items() if kv[1])))

    # why: innocent dead letters by error (worker ids folded), duplicates by the files their rows are in
    reasons = {"innocent dead": Counter(), "duplicates": Counter()}
    for t, m in manifest.items():
        if m["expect"] == "ok":
            done = [x[6] for x in rows.get(t, []) if x[2] == "completed"]
            for d in dead.get(t, []):
                why = re.sub(r"\bw\d+\b", "wN", str(d.get("error")))
                if done and min(done) < (d.get("failed_at") or 0):
                    why += " [after its completed row was committed]"
                elif done:
                    why += " [then completed by a worker still running it]"
                reasons["innocent dead"][why] += 1
        rs = rows.get(t, [])
        if len(rs) > 1:
            reasons["duplicates"]["rows in " + " + ".join(sorted(x[0] for x in rs))] += 1

    # the summary
    kinds = Counter(m["kind"] for m in manifest.values())
    n_rows = sum(status_count.values())
    order = ["duplicates", "lost", "innocent dead", "innocent failed", "expected failures", "key mismatch",
             "unknown rows", "unknown dead entries", "unreadable dead entries", "stranded", "hash mismatch",
             "batches"]
    print("==== soak summary (seed %s)" % meta["seed"])
    print("jobs:            %d (short %d, near the lane split %d, openai %d, without id %d, big %d, malformed %d)"
          % (len(manifest), kinds["s"], kinds["l"], kinds["o"], kinds["n"], kinds["b"], kinds["x"]))
    print("faults:          %s" % ", ".join("%s %d" % kv for kv in faults.items()))
    print("worker runs:     %s" % meta.get("worker_runs", "?"))
    print("held at kill -9: %s jobs in the processing lists of the workers killed" % meta.get("held_killed", "?"))
    print("rows:            %d in %d files (%s); %d with attempts > 1" % (
        n_rows, len([d for d in dbs if os.path.exists(d)]), ", ".join("%s %d" % kv for kv in sorted(status_count.items())),
        replayed))
    print("dead letters:    %d (%d expected failures)" % (sum(len(v) for v in dead.values()), expected_failures))
    print("stranded:        %d jobs in %d lists" % (sum(stranded.values()), len(stranded)))
    for k in order:
        print("%-16s %d" % (k + ":", len(problems.get(k, []))))
    print("elapsed:         %s s (faults %s s, drain %s s)" % (meta.get("elapsed_s"), meta.get("fault_s"),
                                                                meta.get("drain_s")))
    failed = [k for k in order if problems.get(k)]
    for k in failed:
        print("---- %s (%d)" % (k, len(problems[k])))
        if k in reasons:
            for why, n in reasons[k].most_common(8):
                print("  %5d x %s" % (n, why))
        for line in problems[k][:12]:
            print("  " + line)
        if len(problems[k]) > 12:
            print("  ... %d more in verdict.json" % (len(problems[k]) - 12))
    json.dump({"seed": meta["seed"], "jobs": len(manifest), "faults": faults, "rows": n_rows,
               "rows_by_status": status_count, "replayed_rows": replayed,
               "counts": {k: len(problems.get(k, [])) for k in order},
               "problems": {k: problems[k] for k in failed}}, open(os.path.join(out, "verdict.json"), "w"), indent=1)
    print("RESULT: %s" % ("PASS" if not failed else "FAIL (" + ", ".join(failed) + ")"))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
