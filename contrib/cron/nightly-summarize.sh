#!/usr/bin/env bash
# Nightly summarization with llmq: every file of a folder becomes one templated job of the batch
# nightly-<date>, a worker runs until the queues are empty (or the running workers do, -W), and
# exactly that batch's results are exported as JSON lines.
#
#   nightly-summarize.sh [-c CONFIG] [-t TEMPLATE] [-v VAR] [-o OUTDIR] [-q short|long|auto] [-m] DOCS_DIR
#
#   -c CONFIG    llmq.yaml (default $LLMQ_CONFIG, else /etc/llmq/llmq.yaml). It must define the
#                template, e.g.  templates: {summarize: "Summarize this:\n{document}"}
#   -t TEMPLATE  template name (default summarize)
#   -v VAR       the template variable that gets each file's text (default document)
#   -o OUTDIR    where summaries-<date>.jsonl goes (default /var/lib/llmq/exports)
#   -q QUEUE     short, long or auto (default auto: long documents go to the long lane)
#   -W           do not start a worker: enqueue, wait for the running workers (the systemd
#                service) with `llmq batch wait nightly-<date>`, then export
#   -m           map-reduce: each file is a "document" job with "summarize" (docs/JOBS.md "Long
#                documents"), for files longer than the model's context; -t then names the map
#                template (default: the config's summarize_map, else the built-in one), -v is unused
#
# The jobs form one batch, nightly-<date> (`llmq enqueue --batch ... --append`); each job gets
# the id nightly-<date>/<file name> and the metadata {"file": ..., "run": ...}. A rerun of the
# same night adds to that batch and runs its documents again (--replace: their rows are replaced
# by the new results). The export is exactly that batch (`llmq results --batch nightly-<date>`),
# whatever else shares the database. Failed jobs are named on stderr with their error codes;
# `llmq requeue --batch nightly-<date>` runs them again once the cause is fixed.
#
# Crontab (crontab -e as the llmq user; 02:00 every night, a log per run):
#   0 2 * * *  /usr/local/share/llmq/nightly-summarize.sh -c /etc/llmq/llmq.yaml /srv/docs/inbox >>/var/log/llmq/nightly.log 2>&1
# (contrib/cron/crontab has the same line.) When the systemd worker service runs on the same
# GPU, use -W, or stop the service around the run: two workers on one GPU share its memory.
#
# Exit status: 0 every document's job completed; 1 something failed: a job of the batch failed or
# was cancelled (each is named, with its error code, on stderr), a document could not be queued
# (reported and skipped, the others still run), the worker or the export failed; 2 wrong usage.
set -uo pipefail

LLMQ=${LLMQ:-llmq}
config=${LLMQ_CONFIG:-/etc/llmq/llmq.yaml}
template=
var=document
map_reduce=0
outdir=/var/lib/llmq/exports
queue=auto
start_worker=1
usage() { sed -n '6,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while getopts "c:t:v:o:q:Wmh" opt; do
  case $opt in
    c) config=$OPTARG ;;
    t) template=$OPTARG ;;
    v) var=$OPTARG ;;
    o) outdir=$OPTARG ;;
    q) queue=$OPTARG ;;
    W) start_worker=0 ;;
    m) map_reduce=1 ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
# the job's input: a templated job (default template summarize), or a document with its map template
if [ "$map_reduce" -eq 1 ]; then
  input=(--map-reduce --var "document=@")
  [ -n "$template" ] && input=(--template "$template" "${input[@]}")
else
  input=(--template "${template:-summarize}" --var "$var=@")
fi
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
mkdir -p "$outdir" || exit 1
out=$outdir/summaries-$stamp.jsonl
status=0

# 1. enqueue: one job per regular file, its text in the template variable, all in batch $run
n=0 bad=0
for f in "$docs"/*; do
  [ -f "$f" ] || continue
  name=$(basename -- "$f")
  if ! jname=$(json_str "$name") || ! jrun=$(json_str "$run"); then
    log "skipping '$name': control characters in the name"; bad=$((bad + 1)); continue
  fi
  if "$LLMQ" enqueue -c "$config" --queue "$queue" --batch "$run" --append --replace "${input[@]:0:${#input[@]}-1}" \
      "${input[-1]}$f" --id "$run/$name" --set metadata="{\"file\": $jname, \"run\": $jrun}" \
      >/dev/null 2>"$outdir/.enqueue.err"; then
    n=$((n + 1))
  else
    log "not queued: $name: $(grep -v 'job read' "$outdir/.enqueue.err" | head -3 | tr '\n' ' ')"
    bad=$((bad + 1))
  fi
done
rm -f "$outdir/.enqueue.err"
log "$n documents queued from $docs ($bad not queued)"
[ "$bad" -eq 0 ] || status=1

# 2. run: a worker until the queues, the retry set and every worker's list are empty
if [ "$n" -gt 0 ]; then
  if [ "$start_worker" -eq 1 ]; then
    log "running llmq worker --drain"
    rc=0
    "$LLMQ" worker -c "$config" --drain --id "nightly-$(hostname -s)" || rc=$?
    case $rc in
      0 | 3) ;; # 3: jobs failed; named below from the batch
      *) log "worker failed (exit $rc)"; status=1 ;;
    esac
  else
    log "waiting for batch $run (the running workers)"
  fi
  # the batch is finished now (a drain worker ran everything); with -W this waits for it
  rc=0
  "$LLMQ" batch wait -c "$config" "$run" || rc=$?
  case $rc in
    0) ;;
    1 | 4) status=1 ;; # jobs failed or were cancelled: named below
    *) log "llmq batch wait failed (exit $rc)"; status=1 ;;
  esac
fi

# 3. export exactly this batch
if "$LLMQ" results -c "$config" --batch "$run" --format jsonl --output "$out"; then
  log "$(wc -l <"$out") results in $out"
else
  log "export failed"; status=1
fi

# 4. name every job of the batch that did not complete, with its error code (stderr)
failed=0
for st in failed cancelled; do
  while IFS= read -r line; do
    id=$(printf '%s' "$line" | sed -n 's/^{"id":"\(\([^"\\]\|\\.\)*\)".*/\1/p')
    code=$(printf '%s' "$line" | sed -n 's/.*"error_code":"\([^"]*\)".*/\1/p')
    echo "nightly-summarize: $st: $id (${code:-no code})" >&2
    failed=$((failed + 1))
  done < <("$LLMQ" results -c "$config" --batch "$run" --status "$st" --format jsonl 2>/dev/null)
done
if [ "$failed" -gt 0 ]; then
  log "$failed jobs of batch $run did not complete (named on stderr; llmq requeue --batch $run re-runs them)"
  status=1
fi
exit $status
