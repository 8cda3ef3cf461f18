#!/usr/bin/env python3
"""Validates what llmq keeps in Redis against schemas/redis-*.schema.json.

    redis_schemas.py SCHEMA_DIR                      # the schema files alone
    redis_schemas.py SCHEMA_DIR --port P [--prefix llmq]

Every *.schema.json in SCHEMA_DIR must be a valid 2020-12 schema with a unique $id. With --port, it
reads from the Redis server on 127.0.0.1:P every job hash, batch hash, entry of <prefix>:events,
dead-letter entry, published template and text-stream entry, validates each against its schema
(hashes and stream entries as JSON objects of strings; a field whose schema has contentMediaType
application/json is decoded and checked against its contentSchema, which jsonschema itself only
annotates) and checks that each batch's counts add up to its total. Prints one line per error and,
on stdout, a JSON summary of what it saw (counts, and the statuses, states, reasons and codes met),
so a test can check that its scenario covered what it meant to. Exit 0 all valid, 1 not, 2 usage.
Needs the jsonschema module (Debian: python3-jsonschema, 4.10 or newer)."""
import argparse
import glob
import json
import os
import socket
import sys

import jsonschema
from jsonschema import Draft202012Validator, ValidationError

# the schemas this checks Redis against (urn:llmq:schema:<kind>)
KINDS = ["redis-job-hash", "redis-batch-hash", "redis-event", "redis-dead-entry", "redis-template",
         "redis-stream-entry"]

# ---- the schemas


def load_schemas(folder):
    """{$id: schema} of every *.schema.json in folder, and errors about the files themselves."""
    by_id, errors = {}, []
    for path in sorted(glob.glob(os.path.join(folder, "*.schema.json"))):
        name = os.path.basename(path)
        try:
            with open(path, encoding="utf-8") as f:
                schema = json.load(f)
            Draft202012Validator.check_schema(schema)
        except (ValueError, jsonschema.SchemaError) as e:
            errors.append(f"{name}: {e}")
            continue
        sid = schema.get("$id")
        if not isinstance(sid, str) or not sid:
            errors.append(f"{name}: no $id")
        elif sid in by_id:
            errors.append(f"{name}: $id {sid} is also {by_id[sid][0]}'s")
        else:
            by_id[sid] = (name, schema)
    return {k: v[1] for k, v in by_id.items()}, errors


def content_schema(validator, sub, instance, schema):
    """contentSchema, checked: the string decoded as JSON must match it."""
    if schema.get("contentMediaType") != "application/json" or not isinstance(instance, str):
        return
    try:
        doc = json.loads(instance)
    except ValueError as e:
        yield ValidationError(f"not JSON text: {e}")
        return
    for err in validator.descend(doc, sub):
        yield err


Validator = jsonschema.validators.extend(Draft202012Validator, {"contentSchema": content_schema})


def validators(schemas):
    """{$id: a validator} that resolves $refs between the files without fetching anything."""
    try:
        from referencing import Registry, Resource  # jsonschema >= 4.18

        reg = Registry().with_resources((i, Resource.from_contents(s)) for i, s in schemas.items())
        return {i: Validator(s, registry=reg) for i, s in schemas.items()}
    except ImportError:  # jsonschema < 4.18 (Debian 12 has 4.10): RefResolver and urljoin
        import urllib.parse

        # urljoin leaves "#/$defs/x" unresolved against a urn: base unless urn is "relative"
        for uses in (urllib.parse.uses_relative, urllib.parse.uses_fragment):
            if "urn" not in uses:
                uses.append("urn")
        return {
            i: Validator(s, resolver=jsonschema.RefResolver.from_schema(s, store=dict(schemas)))
            for i, s in schemas.items()
        }


# ---- Redis (RESP2, enough for the read commands used here)


class Redis:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.f = self.s.makefile("rb")

    def __call__(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a.encode() if isinstance(a, str) else a
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.s.sendall(b"".join(out))
        return self.reply()

    def reply(self):
        line = self.f.readline()[:-2]
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2].decode("utf-8")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RuntimeError(f"unexpected reply {line!r}")

    def scan(self, pattern):
        cursor, keys = "0", []
        while True:
            cursor, batch = self("SCAN", cursor, "MATCH", pattern, "COUNT", "1000")
            keys += batch
            if cursor == "0":
                return sorted(set(keys))


def pairs(flat):
    return dict(zip(flat[::2], flat[1::2]))


# ---- checking


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("schema_dir")
    ap.add_argument("--port", type=int)
    ap.add_argument("--prefix", default="llmq")
    a = ap.parse_args()

    schemas, errors = load_schemas(a.schema_dir)
    for k in KINDS:
        if f"urn:llmq:schema:{k}" not in schemas:
            errors.append(f"schema urn:llmq:schema:{k} not found in {a.schema_dir}")
    summary = {"schemas": sorted(schemas)}
    if errors or a.port is None:
        for e in errors:
            print(e, file=sys.stderr)
        print(json.dumps(summary))
        return 1 if errors else 0
    val = validators(schemas)
    r = Redis(a.port)
    p = a.prefix

    def check(kind, where, doc, seen=()):
        s = summary.setdefault(kind, {"n": 0})
        s["n"] += 1
        for name in seen:
            if isinstance(doc, dict) and isinstance(doc.get(name), str):
                s.setdefault(name, set()).add(doc[name])
        found = val[f"urn:llmq:schema:{kind}"].iter_errors(doc)
        for e in sorted(found, key=lambda e: str(list(e.absolute_path))):
            path = "/".join(str(x) for x in e.absolute_path)
            errors.append(f"{where}: {path or '(top)'}: {e.message}")

    for key in r.scan(f"{p}:job:*"):
        h = pairs(r("HGETALL", key))
        check("redis-job-hash", key, h, ["status", "finish_reason", "error_code"])
        if "result" in h:  # a result line, or the size-cap marker
            kind = "marker" if h["result"].startswith('{"truncated"') else "line"
            summary["redis-job-hash"].setdefault("result", set()).add(kind)
    for key in r.scan(f"{p}:batch:*"):
        h = pairs(r("HGETALL", key))
        check("redis-batch-hash", key, h, ["state"])
        try:
            statuses = ("queued", "running", "completed", "failed", "cancelled")
            counts = sum(int(h[c]) for c in statuses)
            if counts != int(h["total"]):
                errors.append(f"{key}: the counts add up to {counts}, total is {h['total']}")
        except (KeyError, ValueError):
            pass  # the schema has said what is wrong
    for eid, fields in r("XRANGE", f"{p}:events", "-", "+"):
        check("redis-event", f"{p}:events {eid}", pairs(fields), ["status", "reason"])
    for i, raw in enumerate(r("LRANGE", f"{p}:dead", "0", "-1")):
        try:
            doc = json.loads(raw)
        except ValueError as e:
            errors.append(f"{p}:dead[{i}]: not JSON: {e}")
            continue
        check("redis-dead-entry", f"{p}:dead[{i}]", doc, ["error_code"])
    for name, raw in pairs(r("HGETALL", f"{p}:templates")).items():
        try:
            doc = json.loads(raw)
        except ValueError as e:
            errors.append(f"{p}:templates {name}: not JSON: {e}")
            continue
        check("redis-template", f"{p}:templates {name}", doc)
    for key in r.scan(f"{p}:stream:*"):
        for eid, fields in r("XRANGE", key, "-", "+"):
            check("redis-stream-entry", f"{key} {eid}", pairs(fields), ["status"])

    for e in errors:
        print(e, file=sys.stderr)
    print(json.dumps(summary, default=sorted, sort_keys=True))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
