#!/usr/bin/env bash
# Nightly summarization with llmq: every file of a folder becomes one templated job, a worker
# runs until the queues are empty, and the night's results are exported as JSON lines.
#
#   nightly-summarize.sh [-c CONFIG] [-t TEMPLATE] [-v VAR] [-o OUTDIR] [-q short|long|auto] DOCS_DIR
#
#   -c CONFIG    llmq.yaml (default $LLMQ_CONFIG, else /etc/llmq/llmq.yaml). It must define the
#                template, e.g.  templates: {summarize: "Summarize this:\n{document}"}
#   -t TEMPLATE  template name (default summarize)
#   -v VAR       the template variable that gets each file's text (default document)
#   -o OUTDIR    where summaries-<date>.jsonl goes (default /var/lib/llmq/exports)
#   -q QUEUE     short, long or auto (default auto: long documents go to the long lane)
#   -W           do not start a worker: enqueue, wait for the running workers (the systemd
#                service) with `llmq wait ID...`, then export
#
# Each job gets the id nightly-<date>/<file name> (so a rerun of the same night overwrites its
# rows instead of adding new ones) and the metadata {"file": ..., "run": ...}. The export holds
# every job that finished since this run started (`llmq results --since`); `jq 'select(.metadata.run
# == "nightly-2025-06-01")'` picks this run's alone when other clients share the database.
#
# Crontab (crontab -e as the llmq user; 02:00 every night, a log per run):
#   0 2 * * *  /usr/local/share/llmq/nightly-summarize.sh -c /etc/llmq/llmq.yaml /srv/docs/inbox >>/var/log/llmq/nightly.log 2>&1
# (contrib/cron/crontab has the same line.) When the systemd worker service runs on the same
# GPU, use -W, or stop the service around the run: two workers on one GPU share its memory.
#
# Exit status: 0 all done; 1 something failed (bad documents are reported and skipped, the
# others still run); 2 wrong usage.
set -uo pipefail

LLMQ=${LLMQ:-llmq}
config=${LLMQ_CONFIG:-/etc/llmq/llmq.yaml}
template=summarize
var=document
outdir=/var/lib/llmq/exports
queue=auto
start_worker=1
usage() { sed -n '5,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while getopts "c:t:v:o:q:Wh" opt; do
  case $opt in
    c) config=$OPTARG ;;
    t) template=$OPTARG ;;
    v) var=$OPTARG ;;
    o) outdir=$OPTARG ;;
    q) queue=$OPTARG ;;
    W) start_worker=0 ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 1 ] || usage
docs=$1
[ -d "$docs" ] || { echo "nightly-summarize: $docs is not a folder" >&2; exit 2; }
command -v "$LLMQ" >/dev/null || { echo "nightly-summarize: $LLMQ not found (set LLMQ=/path/to/llmq)" >&2; exit 2; }

log() { echo "$(date '+%F %T') nightly-summarize: $*"; }
# A JSON string literal of $1 (file names: backslash and quote escaped, control characters refused).
json_str() {
  local s=$1
  [[ $s == *[[:cntrl:]]* ]] && return 1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  printf '"%s"' "$s"
}

stamp=$(date +%F)
run=nightly-$stamp
start=$(date +%s)
mkdir -p "$outdir" || exit 1
out=$outdir/summaries-$stamp.jsonl
status=0

# 1. enqueue: one job per regular file, its text in the template variable
n=0 bad=0 ids=()
for f in "$docs"/*; do
  [ -f "$f" ] || continue
  name=$(basename -- "$f")
  if ! jname=$(json_str "$name") || ! jrun=$(json_str "$run"); then
    log "skipping '$name': control characters in the name"; bad=$((bad + 1)); continue
  fi
  if "$LLMQ" enqueue -c "$config" --queue "$queue" --template "$template" --var "$var=@$f" \
      --id "$run/$name" --set metadata="{\"file\": $jname, \"run\": $jrun}" >/dev/null 2>"$outdir/.enqueue.err"; then
    n=$((n + 1))
    ids+=("$run/$name")
  else
    log "not queued: $name: $(grep -v 'job read' "$outdir/.enqueue.err" | head -3 | tr '\n' ' ')"
    bad=$((bad + 1))
  fi
done
rm -f "$outdir/.enqueue.err"
log "$n documents queued from $docs ($bad not queued)"
[ "$bad" -eq 0 ] || status=1

# 2. run: a worker until the queues, the retry set and crashed workers' lists are empty
if [ "$n" -gt 0 ]; then
  if [ "$start_worker" -eq 1 ]; then
    log "running llmq worker --drain"
    "$LLMQ" worker -c "$config" --drain --id "nightly-$(hostname -s)" || { log "worker failed (exit $?)"; status=1; }
  else
    log "waiting for the running workers"
    "$LLMQ" wait -c "$config" "${ids[@]}" >/dev/null ||
      { log "llmq wait failed (exit $?)"; status=1; }
  fi
fi

# 3. export this run's results (and anything else finished since it started)
if "$LLMQ" results -c "$config" --since "$start" --format jsonl --output "$out"; then
  log "$(wc -l <"$out") results in $out"
else
  log "export failed"; status=1
fi
exit $status
