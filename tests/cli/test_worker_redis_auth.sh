#!/usr/bin/env bash
# A wrong Redis password never fixes itself: a worker whose credentials the server refuses
# (WRONGPASS, or NOAUTH when it gives none) exits 1 at the start with one ERROR line, a service
# worker as well as a --drain one, and takes no job. The right password works (the control).
. "$(dirname "$0")/worker_lib.sh"
PASS=s3cret-pw
redis_start --requirepass "$PASS"
rcli() { redis-cli -p "$PORT" -a "$PASS" --no-auth-warning "$@"; }
make_model
write_config
N=20
jobs_file "$T/jobs.jsonl" "$N" a- '{"max_tokens": 4, "temperature": 0}'
while read -r line; do rcli LPUSH llmq:queue:short "$line" >/dev/null; done <"$T/jobs.jsonl"
eq "jobs queued" "$(rcli LLEN llmq:queue:short)" "$N"

# refused URL NAME [options]: the worker exits 1 within 20 s (not after a start timeout), naming the cause
refused() {
  local url=$1 name=$2 cause=$3
  shift 3
  local t0=$SECONDS
  LLMQ_REDIS_URL=$url worker_start "$name" "$@"
  WAIT_S=20 worker_wait "$name"
  eq "$name: exit status" "$WRC" 1
  [ $((SECONDS - t0)) -le 15 ] && ok "$name: exits at once ($((SECONDS - t0)) s)" || bad "$name: took $((SECONDS - t0)) s"
  eq "$name: one ERROR line" "$(log_count "$name" "ERROR redis .* refused the credentials: .*$cause")" 1
  log_has "$name" "$PASS\|wrong-pw" && bad "$name: a password is in the log" || ok "$name: no password in the log"
  eq "$name: no job taken" "$(rcli LLEN llmq:queue:short)" "$N"
  eq "$name: no processing list" "$(rcli EXISTS "llmq:processing:$name")" 0
}
refused "redis://:wrong-pw@127.0.0.1:$PORT" service WRONGPASS
refused "redis://:wrong-pw@127.0.0.1:$PORT" drain WRONGPASS --drain
refused "redis://127.0.0.1:$PORT" nopass NOAUTH --drain

LLMQ_REDIS_URL="redis://:$PASS@127.0.0.1:$PORT" worker_start good --drain
worker_wait good
eq "the right password: exit status" "$WRC" 0
eq "the right password: every job done" "$(rows)" "$N"
finish
