#!/usr/bin/env python3
"""Writes `LPUSH KEY line` in Redis's wire protocol for every non-empty line of FILE, in order,
for `redis-cli --pipe`: a plain Redis client pushing jobs, byte for byte (no llmq involved).

    python3 tests/tools/resp_lpush/resp_lpush.py FILE KEY | redis-cli -p PORT --pipe
"""
import sys


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


with open(sys.argv[1], "rb") as f:
    for line in f:
        line = line.rstrip(b"\n")
        if line:
            sys.stdout.buffer.write(resp("LPUSH", sys.argv[2], line))
