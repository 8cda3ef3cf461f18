#!/usr/bin/env python3
"""Summarize a kernel timeline written by libllmq_ktrace.so (contrib/lab/ktrace/ktrace.c).

usage: ktrace_summary.py TRACE.csv[.gz] [--last N] [--split KERNEL] [--whole] [--shapes REGEX]

Kernels are cut into steps at each launch whose name contains KERNEL (default: embedding, the first
kernel of every llmq step); only the most common step length is kept (the decode steps), and of those
the last N (default 64). For every kernel the table gives its duration (first CTA start to last CTA
end; with programmatic dependent launch this includes the time spent resident but waiting) and its
share of the critical path: how far it moves the latest end seen so far. The shares add up to the
step's span. The layer table averages the same numbers over every layer, taking the layer's length
from the distance between consecutive decode attention kernels (or q/k norm + RoPE kernels).

With --whole, the steps are not told apart: the table is every kernel's share of the whole run's
critical path (where a benchmark's wall time went, prefill and mixed steps included), and the time
no kernel ran (host work, copies, waits) is one line of its own; then the steps with and without a
prefill kernel, and the host's turn before each step (from the latest kernel end before it to its
first kernel's start: the copy back, the host's work, the uploads and the launch) by step kind.

With --shapes REGEX, the launches of every kernel whose name matches REGEX are told apart by their grid
(the launch's CTAs: a batch size, a token count): count, median and total duration of each, so that
one kernel's prefill launches and its decode launches can be compared with their bytes or flops."""
import argparse
import collections
import csv
import gzip
import itertools
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
    ap.add_argument("--whole", action="store_true", help="shares of the whole run, not of the decode steps")
    ap.add_argument("--shapes", metavar="REGEX", help="launches of the matching kernels by grid")
    a = ap.parse_args()
    rows = []
    with (gzip.open(a.trace, "rt") if a.trace.endswith(".gz") else open(a.trace)) as f:
        for r in csv.DictReader(f):
            rows.append((int(r["start_ns"]), int(r["end_ns"]), int(r["grid"]), short(r["name"])))
    rows.sort()
    if not rows:
        raise SystemExit("no kernels in " + a.trace)
    if a.shapes:
        shapes(rows, a.shapes)
        return
    if a.whole:
        whole(rows, a.split)
        return
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
    # the last --last steps that ran the most common sequence of kernels (names and grids): steps of
    # another batch size or context bucket run other GEMM algorithms and attention grids, and averaging
    # them position by position would mix kernels in the layer table
    n_mode = collections.Counter(len(s) for s in steps).most_common(1)[0][0]
    idx_n = [i for i, s in enumerate(steps) if len(s) == n_mode]
    sig = lambda s: tuple((r[3], r[2]) for r in s)
    common = collections.Counter(sig(steps[i]) for i in idx_n).most_common(1)[0][0]
    same = [i for i in idx_n if sig(steps[i]) == common]
    idx = same[-a.last:]
    sel = [steps[i] for i in idx]
    spans = [(s[-1][1] - s[0][0]) / 1e3 for s in sel]
    starts = [s[0][0] for s in sel]
    period = statistics.median([(b - a_) / 1e3 for a_, b in zip(starts, starts[1:])]) if len(sel) > 1 else 0
    print(
        f"{len(steps)} steps, {len(sel)} analysed of {n_mode} kernels each: the last with the most common "
        f"kernels and grids ({len(idx_n) - len(same)} other steps of {n_mode} kernels left out)"
    )
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


def whole(rows, split):
    """Every kernel's share of the run's critical path, the time no kernel covered, and the steps
    (cut at each kernel named like split) with and without a prefill kernel."""
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
    last_end, idle = rows[0][0], 0.0
    for st, en, _, nm in rows:
        e = agg[nm]
        e[0] += 1
        e[1] += (en - st) / 1e3
        e[2] += max(0, en - max(st, last_end)) / 1e3
        idle += max(0, st - last_end) / 1e3
        last_end = max(last_end, en)
    span = (last_end - rows[0][0]) / 1e3
    print(f"{len(rows)} kernels over {span / 1e3:.3f} ms (first start to last end)")
    print(f"\n{'kernel':60s} {'count':>8s} {'dur, ms':>11s} {'crit, ms':>11s} {'share':>6s}")
    for nm, (c, d, cr) in sorted(agg.items(), key=lambda kv: -kv[1][2]):
        print(f"{nm:60s} {c:8d} {d / 1e3:11.3f} {cr / 1e3:11.3f} {100 * cr / span:5.1f}%")
    print(f"{'(no kernel running)':60s} {'':8s} {'':11s} {idle / 1e3:11.3f} {100 * idle / span:5.1f}%")
    cuts = [i for i, r in enumerate(rows) if split in r[3]] + [len(rows)]
    kinds = collections.defaultdict(lambda: [0, 0.0])
    for i, j in zip(cuts, cuts[1:]):
        step = rows[i:j]
        kind = "with prefill" if any("prefill" in r[3] for r in step) else "decode only"
        kinds[kind][0] += 1
        kinds[kind][1] += (rows[j][0] if j < len(rows) else max(r[1] for r in step)) - step[0][0]
    print(f"\n{'steps':14s} {'count':>6s} {'ms':>11s} {'ms/step':>9s}  (a step's start to the next one's)")
    for kind, (c, t) in sorted(kinds.items()):
        print(f"{kind:14s} {c:6d} {t / 1e6:11.3f} {t / 1e6 / c:9.3f}")
    ends = list(itertools.accumulate((r[1] for r in rows), max))  # ends[i]: latest end of rows 0 .. i
    turns = collections.defaultdict(list)  # the first step has no turn before it
    for i, j in zip(cuts[1:], cuts[2:]):
        kind = "with prefill" if any("prefill" in r[3] for r in rows[i:j]) else "decode only"
        turns[kind].append(max(0, rows[i][0] - ends[i - 1]) / 1e3)
    print(f"\n{'host turn':14s} {'count':>6s} {'median us':>11s} {'ms':>9s}  (latest end before a step to its start)")
    for kind, v in sorted(turns.items()):
        print(f"{kind:14s} {len(v):6d} {statistics.median(v):11.1f} {sum(v) / 1e3:9.3f}")


def shapes(rows, pattern):
    """The launches of the kernels matching pattern, by (kernel, grid): count, median and total."""
    rx = re.compile(pattern)
    by = collections.defaultdict(list)
    for st, en, g, nm in rows:
        if rx.search(nm):
            by[(nm, g)].append((en - st) / 1e3)
    if not by:
        raise SystemExit(f"no kernel matches {pattern!r}")
    print(f"{'kernel':60s} {'grid':>8s} {'count':>6s} {'median us':>10s} {'total ms':>10s}")
    for (nm, g), v in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        print(f"{nm:60s} {g:8d} {len(v):6d} {statistics.median(v):10.1f} {sum(v) / 1e3:10.3f}")


if __name__ == "__main__":
    main()
