#!/usr/bin/env bash
# `llmq run`'s progress bar on a terminal (a pty from script(1)): while the first jobs are still
# generating, the bar already moves with their tokens and shows an ETA, and the percent never goes
# back; at the end it says every job is done.
. "$(dirname "$0")/cli_lib.sh"
command -v script >/dev/null || { echo "SKIPPED: no script(1) for a pseudo-terminal"; exit 77; }
tiny_model "$tmp/m"
for i in 1 2 3; do echo '{"prompt": "hi", "max_tokens": 2000, "ignore_eos": true, "temperature": 0}'; done >"$tmp/in.jsonl"
TERM=xterm script -qfec "'$LLMQ_BIN' run --model '$tmp/m' --input '$tmp/in.jsonl' --output '$tmp/out.jsonl'" "$tmp/tty.log" >/dev/null
rc=$?
[ $rc -eq 0 ] && ok "run on a terminal: exit 0" || bad "run on a terminal: exit $rc"
tr '\r' '\n' <"$tmp/tty.log" | grep -a " jobs " >"$tmp/bars.txt"
python3 - "$tmp/bars.txt" <<'PY' && ok "the bar moves with the tokens before a job is done, with an ETA" || bad "bars: $(head -c 600 "$tmp/bars.txt")"
import re, sys
bars = [re.search(r"(\d+)/3 jobs +(\d+)%.*elapsed(  ETA \S+)?", l) for l in open(sys.argv[1], errors="replace")]
bars = [b for b in bars if b]
early = [b for b in bars if b.group(1) == "0" and int(b.group(2)) > 0]
assert early, "no bar with a percent before the first job was done"
assert all(b.group(3) for b in early), "a bar before the first job was done has no ETA"
pct = [int(b.group(2)) for b in bars]
assert pct == sorted(pct), pct
assert bars[-1].group(1) == "3" and pct[-1] == 100, bars[-1].group(0)
print(len(early), "bars before the first job was done; percents", pct[:3], "...", pct[-3:])
PY
finish
