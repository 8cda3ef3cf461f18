#!/usr/bin/env python3
"""Summarize a kernel timeline written by libllmq_ktrace.so (contrib/ktrace/ktrace.c).

usage: ktrace_summary.py TRACE.csv [--last N] [--split KERNEL]

Kernels are cut into steps at each launch whose name contains KERNEL (default: embedding, the first
kernel of every llmq step); only the most common step length is kept (the decode steps), and of those
the last N (default 64). For every kernel the table gives its duration (first CTA start to last CTA
end; with programmatic dependent launch this includes the time spent resident but waiting) and its
share of the critical path: how far it moves the latest end seen so far. The shares add up to the
step's span. The layer table averages the same numbers over every layer, taking the layer's length
from the distance between consecutive decode attention kernels (or q/k norm + RoPE kernels)."""
import argparse
import collections
import csv
import re
import statistics


def short(name):
    """A demangled kernel name without its return type, namespaces and parameter list."""
    name = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "")
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list: the first "(" outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    base, lt, tmpl = name.partition("<")
    return (base.split("::")[-1] + lt + tmpl)[:60]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--last", type=int, default=64)
    ap.add_argument("--split", default="embedding")
    a = ap.parse_args()
    rows = []
    with open(a.trace) as f:
        for r in csv.DictReader(f):
            rows.append((int(r["start_ns"]), int(r["end_ns"]), int(r["grid"]), short(r["name"])))
    rows.sort()
    steps, cur = [], []
    for r in rows:
        if a.split in r[3] and cur:
            steps.append(cur)
            cur = []
        cur.append(r)
    if cur:
        steps.append(cur)
    if not steps:
        raise SystemExit("no kernels in " + a.trace)
    n_mode = collections.Counter(len(s) for s in steps).most_common(1)[0][0]
    idx = [i for i, s in enumerate(steps) if len(s) == n_mode][-a.last:]
    sel = [steps[i] for i in idx]
    spans = [(s[-1][1] - s[0][0]) / 1e3 for s in sel]
    starts = [s[0][0] for s in sel]
    period = statistics.median([(b - a_) / 1e3 for a_, b in zip(starts, starts[1:])]) if len(sel) > 1 else 0
    print(f"{len(steps)} steps, {len(sel)} analysed of {n_mode} kernels each")
    print(f"step span {statistics.mean(spans):.1f} us (first start to last end), step period {period:.1f} us")

    def shares(s):
        out, last_end = [], s[0][0]
        for st, en, g, nm in s:
            out.append((nm, g, (en - st) / 1e3, max(0, en - last_end) / 1e3, (st - last_end) / 1e3))
            last_end = max(last_end, en)
        return out

    per_step = [shares(s) for s in sel]
    agg = collections.OrderedDict()
    for sh in per_step:
        for nm, g, d, c, gap in sh:
            e = agg.setdefault(nm, [0, 0.0, 0.0, g])
            e[0] += 1
            e[1] += d
            e[2] += c
    n = len(per_step)
    print(f"\n{'kernel':60s} {'n/step':>6s} {'dur/step':>9s} {'crit/step':>9s} {'grid':>6s}")
    for nm, (c, d, cr, g) in sorted(agg.items(), key=lambda kv: -kv[1][2]):
        print(f"{nm:60s} {c // n:6d} {d / n:9.1f} {cr / n:9.1f} {g:6d}")
    print(f"{'total':60s} {'':6s} {sum(v[1] for v in agg.values()) / n:9.1f} {sum(v[2] for v in agg.values()) / n:9.1f}")

    # a layer begins at the decode attention, or at q/k norm + RoPE where that runs on its own
    marks = [i for i, r in enumerate(sel[0]) if "attention_decode_kernel" in r[3]]
    if len(marks) < 3:
        marks = [i for i, r in enumerate(sel[0]) if "rope" in r[3].lower()]
    if len(marks) < 3:
        return
    L = marks[1] - marks[0]
    first = marks[0]
    layers = len(marks)
    acc = [[0.0, 0.0, 0.0, 0, "", 0] for _ in range(L)]
    for sh in per_step:
        for li in range(layers - 1):
            for j in range(L):
                nm, g, d, c, gap = sh[first + li * L + j]
                e = acc[j]
                e[0] += d
                e[1] += c
                e[2] += gap
                e[3] += 1
                e[4] = nm
                e[5] = g
    print(f"\none layer ({L} kernels, averaged over {layers - 1} layers x {n} steps), us:")
    print(f"{'kernel':60s} {'dur':>7s} {'crit':>7s} {'gap':>7s} {'grid':>6s}")
    for d, c, gap, k, nm, g in acc:
        print(f"{nm:60s} {d / k:7.2f} {c / k:7.2f} {gap / k:7.2f} {g:6d}")
    print(f"{'layer':60s} {sum(e[0] / e[3] for e in acc):7.2f} {sum(e[1] / e[3] for e in acc):7.2f}")
    print("(gap: start minus the latest end before it; negative when the kernel became resident early)")


if __name__ == "__main__":
    main()
