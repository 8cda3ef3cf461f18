#!/usr/bin/env bash
# Every flag the docs show on an `llmq <command>` line (README.md, docs/*.md), and every flag that
# opens a table row under a heading naming `llmq <command>`, is in that command's --help: a renamed
# or removed flag fails here until the docs follow. A line is cut at a pipe, ';', '&&' or '`'
# (another program's flags), and "llmq <command>:" (a message) is no command line; --help and
# --version are every command's (docs/CLI.md).
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
def check(words, flags, where):
    global checked
    for flag in flags:
        if flag in ("--help", "--version"):
            continue
        checked += 1
        if not re.search(re.escape(flag) + r"(?![a-z0-9-])", help_of(words)):
            bad.append(f"{where}: llmq {' '.join(words)} has no {flag}")
def command_of(text):
    m = re.search(r"\bllmq ([a-z][a-z-]*)(?![\w:-])((?: [a-z]+)?)", text)
    if not m or m.group(1) not in cmds:
        return None
    sub = m.group(2).strip()
    return [m.group(1)] + ([sub] if sub in subs.get(m.group(1), []) else [])
for path in files:
    section, level, fence = None, 0, False  # the command the heading above names, its level
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        where = f"{os.path.relpath(path, src)}:{n}"
        fence = fence != line.startswith("```")
        if line.startswith("#") and not fence:
            depth = len(line) - len(line.lstrip("#"))
            if command_of(line):
                section, level = command_of(line), depth
            elif depth <= level:
                section, level = None, 0
        elif section and line.startswith("| `-"):
            check(section, re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", line.split("|")[1]), where)
        for m in re.finditer(r"\bllmq ([a-z][a-z-]*)(?![\w:-])((?: [a-z]+)?)", line):
            cmd, sub = m.group(1), m.group(2).strip()
            if cmd not in cmds:
                continue
            words = [cmd] + ([sub] if sub in subs.get(cmd, []) else [])
            rest = re.split(r"\||;|&&|`", line[m.end():])[0]
            check(words, re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest), where)
for b in bad:
    print("FAIL " + b)
print(f"{checked} flags checked on documented command lines")
print(f"{0 if bad else 1} passed, {1 if bad else 0} failed")
sys.exit(1 if bad or checked < 50 else 0)
PY
