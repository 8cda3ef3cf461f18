#!/usr/bin/env bash
# Every flag the docs show on an `llmq <command>` line (README.md, docs/*.md) is in that command's
# --help: a renamed or removed flag fails here until the docs follow. The line is cut at a pipe,
# ';' or '&&' (another program's flags), and "llmq <command>:" (a message) is no command line;
# --help and --version are every command's (docs/CLI.md).
set -u
python3 - "$LLMQ_BIN" "$LLMQ_SOURCE_DIR" <<'PY'
import glob, os, re, subprocess, sys
llmq, src = sys.argv[1], sys.argv[2]
listing = subprocess.run([llmq, "help"], capture_output=True, text=True).stdout
cmds = [l.split()[0] for l in listing.split("Commands:")[1].splitlines() if l.strip()]
cmds = [c for c in cmds if c != "help"]
subs = {"batch": ["list", "status", "wait", "cancel"]}
helps = {}
def help_of(words):
    key = " ".join(words)
    if key not in helps:
        helps[key] = subprocess.run([llmq, *words, "--help"], capture_output=True, text=True).stdout
    return helps[key]
files = [os.path.join(src, "README.md")] + sorted(glob.glob(os.path.join(src, "docs", "*.md")))
checked, bad = 0, []
for path in files:
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        for m in re.finditer(r"\bllmq ([a-z][a-z-]*)(?![\w:-])((?: [a-z]+)?)", line):
            cmd, sub = m.group(1), m.group(2).strip()
            if cmd not in cmds:
                continue
            words = [cmd] + ([sub] if sub in subs.get(cmd, []) else [])
            rest = re.split(r"\||;|&&|`", line[m.end():])[0]
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
                if flag in ("--help", "--version"):
                    continue
                checked += 1
                if not re.search(re.escape(flag) + r"(?![a-z0-9-])", help_of(words)):
                    bad.append(f"{os.path.relpath(path, src)}:{n}: llmq {' '.join(words)} has no {flag}")
for b in bad:
    print("FAIL " + b)
print(f"{checked} flags checked on documented command lines")
print(f"{0 if bad else 1} passed, {1 if bad else 0} failed")
sys.exit(1 if bad or checked < 50 else 0)
PY
