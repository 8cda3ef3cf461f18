#!/usr/bin/env python3
"""Writes the soak test's jobs (tests/soak/soak.sh): N jobs in B slots, each slot up to four files
pushed together at the slot's time, and a manifest with one line per job saying what must become
of it.

    soak_jobs.py OUT_DIR N B SEED LONG_THRESHOLD MAX_JOB_BYTES MAX_TOKENS

Per slot K (files that would be empty are not written):
    K.enq-short.jsonl  `llmq enqueue --batch soak-SEED-Ks` (llmq form and OpenAI lines)
    K.enq-long.jsonl   `llmq enqueue --queue long --batch soak-SEED-Kl`
    K.push-short.bin   LPUSHed to llmq:queue:short by redis-cli, one job a line (plain client:
                       no batch; also the jobs without an id and the malformed ones)
    K.push-long.bin    LPUSHed to llmq:queue:long

manifest.jsonl, one object per job:
    tag     a string found exactly once in the job's text (the checker finds rows and dead
            entries by it, also for jobs whose key the worker makes up)
    key     the job's key (docs/QUEUE.md "A job's key"), null when the worker assigns it
    expect  "ok" (must complete) or "fail" (malformed: must fail on its own, with a failed
            row and one dead entry)
    kind, via, queue, batch, bytes
"""
import json
import random
import sys

out, n, slots, seed, threshold, max_job_bytes, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
rng = random.Random(seed)
WORDS = ("alpha beta gamma delta river stone cloud paper lamp orange window seven quiet north "
         "table garden silver market winter bridge").split()


def text(nbytes):
    """Lowercase words, exactly nbytes long (the tiny model's tokenizer: one token a byte)."""
    s = ""
    while len(s) < nbytes:
        s += rng.choice(WORDS) + " "
    return s[:nbytes]


def tag(kind, i):
    return "SK%s%06dZ" % (kind, i)


def sampling():
    j = {"max_tokens": rng.randint(4, max_tokens)}
    if rng.random() < 0.5:
        j["temperature"] = 0
    if rng.random() < 0.3:
        j["ignore_eos"] = True
    return j


# how many of each kind; the rest are short jobs
n_bad = max(1, n // 40) if n >= 20 else 0
n_big = max(1, min(12, n // 150)) if n >= 20 else 0
n_long = n // 6
n_oai = n // 6
n_noid = n // 20
n_short = n - n_bad - n_big - n_long - n_oai - n_noid
kinds = ["s"] * n_short + ["l"] * n_long + ["o"] * n_oai + ["n"] * n_noid + ["b"] * n_big + ["x"] * n_bad
rng.shuffle(kinds)

# malformed jobs, each failing on its own whatever the workers go through (the expected failures)
BAD = [
    lambda t: ("this is not json %s {" % t).encode(),
    lambda t: json.dumps({"id": t, "prompt": "a", "max_tokens": -3}).encode(),
    lambda t: json.dumps({"id": t, "prompt": "a", "colour": "red"}).encode(),
    lambda t: json.dumps({"id": t, "prompt": ""}).encode(),
    lambda t: json.dumps({"id": t, "prompt": text(5000), "max_tokens": 8}).encode(),  # over max_model_len
    lambda t: json.dumps({"custom_id": t, "url": "/v1/embeddings", "body": {"input": "a"}}).encode(),
    lambda t: json.dumps({"id": t, "prompt": "a", "temperature": -1}).encode(),
    # over queues.max_job_bytes: a big body that must fail (only the first of its turn, below)
    lambda t: json.dumps({"id": t, "prompt": "a", "metadata": {"blob": "z" * (max_job_bytes + 4096)}}).encode(),
]

slot_files = [{"enq-short": [], "enq-long": [], "push-short": [], "push-long": []} for _ in range(slots)]
manifest = []
nbad = 0
for i, kind in enumerate(kinds):
    t = tag(kind, i)
    k = i * slots // max(1, n)
    via = "push" if kind in ("n", "x") else rng.choice(["enq", "enq", "push"])
    queue = "short"
    key = t
    expect = "ok"
    if kind == "s":
        j = {"id": t, "prompt": "Summarize %d: %s" % (i, text(rng.randint(10, 120)))}
        j.update(sampling())
    elif kind == "l":
        # near the lane split: some are over it (the worker moves them to the long queue), some
        # under; a quarter are pushed to the long queue directly, where they stay
        j = {"id": t, "prompt": text(threshold + rng.randint(-40, 40))}
        j.update(sampling())
        if rng.random() < 0.25:
            queue = "long"
    elif kind == "o":
        body = {"messages": [{"role": "user", "content": text(rng.randint(10, 200))}],
                "max_tokens": rng.randint(4, max_tokens)}
        if rng.random() < 0.5:
            body["temperature"] = 0
        j = {"custom_id": t, "method": "POST", "url": "/v1/chat/completions", "body": body}
    elif kind == "n":
        j = {"prompt": "No id %d: %s" % (i, text(rng.randint(10, 80))), "metadata": {"tag": t}}
        j.update(sampling())
        key = None
    elif kind == "b":
        size = rng.randint(100, 600) * 1024
        j = {"id": t, "prompt": "Big %d: %s" % (i, text(40)), "metadata": {"blob": text(size)}}
        j.update(sampling())
    else:
        # the over-max_job_bytes variant once or twice only: it is a 1 MiB body
        variants = len(BAD) if nbad < 2 * len(BAD) else len(BAD) - 1
        raw = BAD[nbad % variants](t)
        nbad += 1
        expect = "fail"
        # no key for text that is not JSON, nor for a job over max_job_bytes (not parsed): the
        # worker gives its row a new UUIDv7, and it has no job hash
        key = None if raw.startswith(b"this is not") or len(raw) > max_job_bytes else t
    if kind != "x":
        raw = json.dumps(j).encode()
    batch = None
    if via == "enq":
        lane = "long" if queue == "long" else "short"
        batch = "soak-%d-%d%s" % (seed, k, lane[0])
        if kind == "o":
            key = "%s/%s" % (batch, t)
        slot_files[k]["enq-" + lane].append(raw)
    else:
        slot_files[k]["push-" + queue].append(raw)
    manifest.append({"tag": t, "key": key, "expect": expect, "kind": kind, "via": via, "queue": queue,
                     "batch": batch, "bytes": len(raw)})

for k, files in enumerate(slot_files):
    for name, lines in files.items():
        if lines:
            ext = "jsonl" if name.startswith("enq") else "bin"
            with open("%s/%d.%s.%s" % (out, k, name, ext), "wb") as f:
                f.write(b"\n".join(lines) + b"\n")
with open(out + "/manifest.jsonl", "w") as f:
    for m in manifest:
        f.write(json.dumps(m) + "\n")
counts = {}
for m in manifest:
    counts[m["kind"]] = counts.get(m["kind"], 0) + 1
print("jobs: %d (short %d, near the lane split %d, openai %d, without id %d, big %d, malformed %d) in %d slots"
      % (n, counts.get("s", 0), counts.get("l", 0), counts.get("o", 0), counts.get("n", 0), counts.get("b", 0),
         counts.get("x", 0), slots))
