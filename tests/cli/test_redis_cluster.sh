#!/usr/bin/env bash
# Redis Cluster (docs/FLEET.md): with redis.prefix "{llmq}" every key of llmq hashes to one slot, so
# enqueue, a worker and status work against a real cluster node (redis-server --cluster-enabled yes,
# one node serving every slot); every key they leave is in that one slot (CLUSTER KEYSLOT). With
# the plain prefix "llmq" the keys of one script call fall in several slots and the cluster refuses
# them (CROSSSLOT): the reason for the hash tag.
. "$(dirname "$0")/worker_lib.sh"
redis_start --cluster-enabled yes --cluster-config-file "$T/redis/nodes.conf"
rcli cluster addslotsrange 0 16383 >/dev/null
cluster_ok() { rcli cluster info | grep -q "cluster_state:ok"; }
wait_until "the cluster to serve every slot" cluster_ok
make_model
write_config
sed -i 's/^  url: .*/&\n  prefix: "{llmq}"/' "$CFG"
eq "prefix" "$("$LLMQ" config -c "$CFG" --get redis.prefix)" "{llmq}"

N=20
jobs_file "$T/jobs.jsonl" "$N" c- '{"max_tokens": 8, "temperature": 0}'
"$LLMQ" enqueue -c "$CFG" --batch b1 "$T/jobs.jsonl" >/dev/null 2>"$T/enqueue.log"
eq "enqueue on the cluster" "$?" 0
eq "queued under {llmq}" "$(rcli llen "{llmq}:queue:short")" "$N"
worker_start w1 --drain
worker_wait w1
eq "worker --drain" "$WRC" 0
eq "rows" "$(rows)" "$N"
eq "hashes completed" "$(rcli hget "{llmq}:job:c-0" status)" completed
eq "batch completed" "$(rcli hget "{llmq}:batch:b1" state)" completed
check "status" "$LLMQ" status -c "$CFG"
slots=$(rcli --scan | while read -r k; do rcli cluster keyslot "$k"; done | sort -u)
eq "every key in one slot" "$slots" "$(rcli cluster keyslot "{llmq}")"
check "keys were written" test "$(rcli dbsize)" -gt "$N"

# the plain prefix: one script's keys in several slots
sed -i 's/^  prefix: .*/  prefix: "llmq"/' "$CFG"
"$LLMQ" enqueue -c "$CFG" --no-batch "$T/jobs.jsonl" >/dev/null 2>"$T/enqueue2.log"
check "without the hash tag the cluster refuses" test "$?" -ne 0
check "CROSSSLOT" grep -q "CROSSSLOT" "$T/enqueue2.log"
finish
