#!/usr/bin/env bash
# Push one job onto an llmq queue and wait until a worker has finished it, with nothing but
# redis-cli (and the sqlite3 shell for the text).
#
#   enqueue_wait.sh [-u REDIS_URL] [-p PREFIX] [-q short|long] [-n MAX_TOKENS] [-i ID] [-d DB]
#                   [-t SECONDS] PROMPT          (-t: seconds to wait, default 300)
#   enqueue_wait.sh -T TEMPLATE -V NAME=@FILE|NAME=TEXT [-V ...] [options]     (a templated job)
#
# Prints one JSON line: {"id", "status", "finish_reason", "prompt_tokens", "completion_tokens",
# "error", "text", "result"}: result is the job hash's `result` field (HGET), the result line
# `llmq results` exports, with the text in it; text (jobs.output) comes from SQLite with -d, for
# a result over the worker's redis.result_max_bytes (then result is {"truncated": true, ...}).
# Exit status 0 when the job completed, 1 when it failed or was cancelled, 2 on a timeout or a
# usage error.
#
# How it waits (docs/QUEUE.md): XREAD BLOCK on the events stream llmq:events wakes it whenever
# anything happens, and after each wake-up it reads the job hash's status; a job that ends while
# it is not blocked is still seen at the next HGET.
set -uo pipefail
url=redis://127.0.0.1:6379/0 prefix=llmq queue=short max_tokens=64 id= db= timeout=300 template=
vars=()
usage() { sed -n '5,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
case ${1-} in -h | --help) sed -n '5,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
while getopts "u:p:q:n:i:d:t:T:V:h" opt; do
  case $opt in
    u) url=$OPTARG ;; p) prefix=$OPTARG ;; q) queue=$OPTARG ;; n) max_tokens=$OPTARG ;;
    i) id=$OPTARG ;; d) db=$OPTARG ;; t) timeout=$OPTARG ;; T) template=$OPTARG ;; V) vars+=("$OPTARG") ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
if [ -n "$template" ]; then [ $# -eq 0 ] || usage; else [ $# -eq 1 ] || usage; fi
[[ $max_tokens =~ ^[0-9]+$ ]] || usage
case $queue in short | long) ;; *) usage ;; esac

r() { redis-cli -u "$url" --no-auth-warning "$@"; }

# A JSON string literal of $1: backslash, quote and control characters escaped.
json_str() {
  local s=$1 out= c i
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\r'/\\r}
  s=${s//$'\t'/\\t}
  if [[ $s == *[[:cntrl:]]* ]]; then # the rare other control bytes, one by one
    for ((i = 0; i < ${#s}; i++)); do
      c=${s:i:1}
      if [[ $c == [[:cntrl:]] ]]; then printf -v c '\\u%04x' "'$c"; fi
      out+=$c
    done
    s=$out
  fi
  printf '"%s"' "$s"
}

[ -n "$id" ] || id=$(cat /proc/sys/kernel/random/uuid 2>/dev/null || date +%s%N)
if [ -n "$template" ]; then
  v= sep=
  for kv in "${vars[@]}"; do
    name=${kv%%=*} val=${kv#*=}
    [ "$name" != "$kv" ] && [ -n "$name" ] || usage
    if [[ $val == @* ]]; then val=$(cat -- "${val#@}"; printf x) || exit 2; val=${val%x}; fi
    v+="$sep$(json_str "$name"): $(json_str "$val")" sep=", "
  done
  input="\"template\": $(json_str "$template"), \"vars\": {$v}"
else
  input="\"prompt\": $(json_str "$1")"
fi
job="{\"id\": $(json_str "$id"), $input, \"max_tokens\": $max_tokens, \"temperature\": 0}"
hkey=$prefix:job:$id events=$prefix:events

last=$(r XREVRANGE "$events" + - COUNT 1 | head -1)
[ -n "$last" ] || last=0-0
r HSET "$hkey" status queued queue "$queue" created_at "$(date +%s.%3N)" attempts 0 >/dev/null || exit 2
r LPUSH "$prefix:queue:$queue" "$job" >/dev/null || exit 2

deadline=$(($(date +%s) + timeout))
while :; do
  status=$(r HGET "$hkey" status)
  case $status in completed | failed | cancelled) break ;; esac
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "{\"id\": $(json_str "$id"), \"status\": \"timeout\"}"
    exit 2
  fi
  r XREAD COUNT 1 BLOCK 1000 STREAMS "$events" "$last" >/dev/null # wakes on any event
  newest=$(r XREVRANGE "$events" + - COUNT 1 | head -1)
  [ -n "$newest" ] && last=$newest
done

field() { r HGET "$hkey" "$1"; }
opt_str() { if [ -n "$1" ]; then json_str "$1"; else printf null; fi; }
finish=$(field finish_reason) err=$(field error) pt=$(field prompt_tokens) ct=$(field completion_tokens)
result=$(field result) # a JSON object already
text=null
if [ -n "$db" ]; then
  q="SELECT output FROM jobs WHERE id = '${id//\'/\'\'}'"
  out=$(sqlite3 -readonly "$db" ".mode list" ".nullvalue <NULL>" "$q"; printf x) || exit 2
  out=${out%x}
  out=${out%$'\n'} # the shell's newline after the value
  [ "$out" != "<NULL>" ] && [ -n "$(sqlite3 -readonly "$db" "SELECT 1 FROM jobs WHERE id = '${id//\'/\'\'}'")" ] &&
    text=$(json_str "$out")
fi
echo "{\"id\": $(json_str "$id"), \"status\": \"$status\", \"finish_reason\": $(opt_str "$finish"), \"prompt_tokens\": ${pt:-0}, \"completion_tokens\": ${ct:-0}, \"error\": $(opt_str "$err"), \"text\": $text, \"result\": ${result:-null}}"
[ "$status" = completed ]
