#!/usr/bin/env bash
# The operator's queue commands on a real redis-server (and one short worker run, tiny model, CPU
# backend): `llmq enqueue --dry-run` without Redis; `llmq purge` of a queue, a model queue, the
# retry set and the dead list, with batch counts, the cancel set and `llmq wait` on a purged job;
# `llmq cancel` of unknown, queued and ended jobs, and the cancel set emptied when jobs end (a
# dead-lettered one included); `llmq dead list` in text and JSON.
. "$(dirname "$0")/worker_lib.sh"

# ---- enqueue --dry-run: validates with the config's templates, never contacts Redis
M=$T/model # not read by enqueue
URL=redis://127.0.0.1:1 # nothing listens there
write_config 'templates:' '  hello: "Say hello to {name}"'
cat >"$T/good.jsonl" <<'EOF2'
{"id": "d-1", "prompt": "one", "max_tokens": 2}
{"id": "d-2", "template": "hello", "vars": {"name": "Ann"}}
{"id": "d-3", "prompt": "three", "model": "m1"}
EOF2
out=$("$LLMQ" enqueue -c "$CFG" --dry-run "$T/good.jsonl" 2>&1); eq "dry run of a good file exits 0" "$?" 0
echo "$out" | grep -q "dry run: 3 jobs would be pushed (2 to llmq:queue:short, 0 to llmq:queue:long, 1 to model queues); nothing pushed, Redis not asked" &&
  ok "dry run prints the summary" || bad "dry run summary: $out"
out=$("$LLMQ" enqueue -c "$CFG" --dry-run --queue long --batch nb "$T/good.jsonl" 2>&1)
echo "$out" | grep -q "dry run: batch nb: 3 jobs would be pushed (0 to llmq:queue:short, 2 to llmq:queue:long" &&
  ok "dry run with --queue long and --batch" || bad "dry run long: $out"
printf '%s\n' '{"id": "x-1", "prompt": "ok"}' '{"id": "x-2", "template": "published-only"}' '{"id": "x-1", "prompt": "again"}' >"$T/bad.jsonl"
out=$("$LLMQ" enqueue -c "$CFG" --dry-run "$T/bad.jsonl" 2>&1); eq "dry run of a bad file exits 1" "$?" 1
echo "$out" | grep -q "line 2: .*published-only.*--dry-run does not see templates published in Redis" &&
  ok "dry run: an unknown template names what it did not look at" || bad "dry run template: $out"
echo "$out" | grep -q "line 3: .*x-1" && ok "dry run: a duplicate id in the file" || bad "dry run duplicate: $out"
echo "$out" | grep -q "nothing would be pushed" && ok "dry run: nothing would be pushed" || bad "dry run bad: $out"
out=$("$LLMQ" enqueue -c "$CFG" "$T/good.jsonl" 2>&1); eq "without --dry-run the same config needs Redis (exit 69)" "$?" 69

redis_start
make_model
write_config
jobs_file "$T/p.jsonl" 3 p- '{"max_tokens": 2}'
"$LLMQ" enqueue -c "$CFG" --batch pb "$T/p.jsonl" 2>/dev/null; eq "enqueue pb" "$?" 0
echo '{"id": "pm-1", "prompt": "x", "model": "m1"}' | "$LLMQ" enqueue -c "$CFG" --no-batch - 2>/dev/null

# ---- purge: a queue, with its hashes; the batch counts them cancelled; wait on one ends
"$LLMQ" purge -c "$CFG" >/dev/null 2>&1; eq "purge without --queue exits 2" "$?" 2
"$LLMQ" purge -c "$CFG" --queue foo >/dev/null 2>&1; eq "purge --queue foo exits 2" "$?" 2
"$LLMQ" purge -c "$CFG" --queue dead --model m1 >/dev/null 2>&1; eq "purge --model with dead exits 2" "$?" 2
"$LLMQ" wait -c "$CFG" --format json p-1 >"$T/wait.out" 2>&1 &
wpid=$!
WORKER_PIDS+=("$wpid")
blocks() { rcli CLIENT LIST | grep -q " flags=b .*cmd=xread"; }
wait_until "wait to block on the events stream" blocks
"$LLMQ" cancel -c "$CFG" p-2 >/dev/null; eq "cancel of a queued job exits 0" "$?" 0
out=$("$LLMQ" purge -c "$CFG" --queue short 2>"$T/err"); eq "purge without --yes exits 2" "$?" 2
eq "purge without --yes says what it would remove" "$out" "would remove 3 entries of llmq:queue:short and the hashes of their jobs"
grep -q "run it again with --yes" "$T/err" && ok "... and how to do it" || bad "purge refusal: $(cat "$T/err")"
eq "... and removes nothing" "$(rcli LLEN llmq:queue:short)" 3
out=$("$LLMQ" purge -c "$CFG" --queue short --yes); eq "purge --yes exits 0" "$?" 0
eq "purge says what it removed" "$out" "removed 3 entries of llmq:queue:short and 3 job hashes"
eq "the queue and the hashes are gone" "$(rcli LLEN llmq:queue:short)/$(rcli EXISTS llmq:job:p-0 llmq:job:p-1 llmq:job:p-2)" "0/0"
eq "the purged job left the cancel set" "$(rcli SISMEMBER llmq:cancel p-2)" 0
eq "the batch counts them cancelled" "$(rcli HMGET llmq:batch:pb total queued cancelled state | tr '\n' ' ')" "3 0 3 completed "
wait_until "wait on a purged job to return" exited "$wpid"
wait "$wpid"; eq "wait on a purged job exits 1" "$?" 1
eq "wait says purged" "$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["id"], d["status"])' "$T/wait.out")" "p-1 purged"
eq "a purged event per job" "$(rcli XRANGE llmq:events - + | grep -cx purged)" 3
out=$("$LLMQ" purge -c "$CFG" --queue short --yes); eq "an empty queue: exit 0" "$?/$out" "0/llmq:queue:short is empty: nothing to purge"
out=$("$LLMQ" purge -c "$CFG" --queue short --model m1 --yes)
eq "purge --model: the model's queue" "$out/$(rcli LLEN llmq:queue:m1:short)" "removed 1 entry of llmq:queue:m1:short and 1 job hash/0"
rcli HSET llmq:job:s-1 status queued queue long >/dev/null # waits in the long queue; a stale copy in short
rcli LPUSH llmq:queue:short '{"id": "s-1", "prompt": "x"}' >/dev/null
out=$("$LLMQ" purge -c "$CFG" --queue short --yes)
eq "a stale copy goes, the hash of the job waiting elsewhere stays" "$out/$(rcli HGET llmq:job:s-1 status)" "removed 1 entry of llmq:queue:short and 0 job hashes/queued"
rcli DEL llmq:job:s-1 >/dev/null
rcli HSET llmq:job:r-1 status queued queue short attempts 1 >/dev/null
rcli ZADD llmq:retry 99999999999999 '{"id": "r-1", "prompt": "x"}' >/dev/null
out=$("$LLMQ" purge -c "$CFG" --queue retry --yes)
eq "purge the retry set" "$out/$(rcli EXISTS llmq:retry llmq:job:r-1)" "removed 1 entry of llmq:retry and 1 job hash/0"

# ---- cancel: unknown ids refused, ended jobs noted; the set empties as jobs end
jobs_file "$T/c.jsonl" 1 c- '{"max_tokens": 2}'
"$LLMQ" enqueue -c "$CFG" --no-batch "$T/c.jsonl" 2>/dev/null
out=$("$LLMQ" cancel -c "$CFG" nope c-0 2>"$T/err"); eq "cancel of an unknown id exits 1" "$?" 1
grep -q "nope: no such job" "$T/err" && ok "the unknown id is named on stderr" || bad "cancel unknown: $(cat "$T/err")"
eq "the known one is still asked" "$out" "c-0: cancel requested"
eq "the unknown id is not in the cancel set" "$(rcli SMEMBERS llmq:cancel)" "c-0"
ttl=$(rcli TTL llmq:cancel); [ "$ttl" -gt 0 ] && [ "$ttl" -le 86400 ] && ok "the cancel set expires after result_ttl_s" || bad "cancel set TTL $ttl"
for b in bad-1 bad-2; do # invalid jobs with a hash, cancelled while queued: dead-lettered at fetch
  rcli HSET "llmq:job:$b" status queued queue short created_at 1 attempts 0 >/dev/null
  rcli LPUSH llmq:queue:short "{\"id\": \"$b\", \"prompt\": \"x\", \"max_tokens\": -3}" >/dev/null
done
"$LLMQ" cancel -c "$CFG" bad-1 >/dev/null; eq "cancel bad-1 exits 0" "$?" 0
worker_start w1 --drain
worker_wait w1
eq "w1 exits 3 (it dead-lettered jobs)" "$WRC" 3
eq "c-0 cancelled, bad-1 dead-lettered" "$(rcli HGET llmq:job:c-0 status) $(rcli HGET llmq:job:bad-1 status)" "cancelled failed"
eq "the cancel set is empty once they ended" "$(rcli SCARD llmq:cancel)" 0
out=$("$LLMQ" cancel -c "$CFG" c-0 bad-1); eq "cancel of ended jobs exits 0" "$?" 0
eq "... with a note each" "$out" "c-0: already cancelled, nothing to cancel
bad-1: already failed, nothing to cancel"
eq "... and adds nothing" "$(rcli SCARD llmq:cancel)" 0

# ---- dead list
out=$("$LLMQ" dead list -c "$CFG"); eq "dead list exits 0" "$?" 0
echo "$out" | head -1 | grep -q "^FAILED_AT (UTC) *ID *ERROR_CODE *ATTEMPTS *QUEUE *ERROR" && ok "dead list has a header" || bad "dead list: $out"
eq "dead list: newest first, with codes" "$(echo "$out" | awk 'NR > 1 && NF > 5 {print $3 ":" $4}' | tr '\n' ' ')" "bad-2:invalid_request bad-1:invalid_request "
echo "$out" | grep "bad-1" | grep -q "max_tokens" && ok "dead list shows the error" || bad "dead list error: $out"
eq "dead list: count line" "$(echo "$out" | tail -1)" "2 dead entries in llmq:dead"
out=$("$LLMQ" dead list -c "$CFG" --json --limit 1)
eq "dead list --json --limit 1" "$(echo "$out" | python3 -c 'import json,sys; print(*[(lambda d: d["id"] + ":" + d["error_code"] + ":" + str("max_tokens" in d["error"]) + ":" + str(d["failed_at"] > 0))(json.loads(l)) for l in sys.stdin])')" "bad-2:invalid_request:True:True"
eq "--format json is --json" "$("$LLMQ" dead list -c "$CFG" --format json | wc -l)" 2
"$LLMQ" dead list -c "$CFG" --limit -1 >/dev/null 2>&1; eq "dead list --limit -1 exits 2" "$?" 2
"$LLMQ" dead frob >/dev/null 2>&1; eq "dead frob exits 2" "$?" 2
out=$("$LLMQ" purge -c "$CFG" --queue dead --yes)
eq "purge the dead list with the failed hashes" "$out/$(rcli EXISTS llmq:job:bad-1 llmq:job:bad-2)" "removed 2 entries of llmq:dead and 2 job hashes/0"
eq "dead list after the purge" "$("$LLMQ" dead list -c "$CFG")" "0 dead entries in llmq:dead"
finish
