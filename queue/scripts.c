/* See scripts.h. The scripts share a prelude (PRELUDE) with the common KEYS/ARGV and helpers;
 * each body follows it. Job states written here match queue/ack.c and docs/QUEUE.md. */
#include "queue/scripts.h"

#include <stdio.h>
#include <string.h>

#include "queue/conn.h"

/* clang-format off */
#define PRELUDE \
"local EVENTS, DEAD, CANCEL, PROC = KEYS[1], KEYS[2], KEYS[3], KEYS[4]\n" \
"local JOB, QUEUE, WORKER, NOW = ARGV[1], ARGV[2], ARGV[3], ARGV[4]\n" \
"local MAXLEN, TTL, DEFQ = ARGV[5], tonumber(ARGV[6]), ARGV[7]\n" \
"local MAXBYTES, MAXATT = tonumber(ARGV[8]), tonumber(ARGV[9])\n" \
"-- the job's id (or nil) and whether it is JSON at all (rq_job_id's rule)\n" \
"local function job_id(raw)\n" \
"  if MAXBYTES > 0 and #raw > MAXBYTES then return nil, true end\n" \
"  local ok, j = pcall(cjson.decode, raw)\n" \
"  if not ok then return nil, false end\n" \
"  if type(j) ~= 'table' then return nil, true end\n" \
"  local v\n" \
"  if j.custom_id ~= nil or j.body ~= nil or j.url ~= nil or j.method ~= nil then v = j.custom_id else v = j.id end\n" \
"  if type(v) == 'string' and #v > 0 and #v <= 256 and not string.find(v, '%c') then return v, true end\n" \
"  return nil, true\n" \
"end\n" \
"local function event(id, status, worker, ...)\n" \
"  redis.call('XADD', EVENTS, 'MAXLEN', '~', MAXLEN, '*', 'id', id or '', 'status', status, 'worker', worker, 'ts', NOW, ...)\n" \
"end\n" \
"local function dead_entry(raw, id, err, attempts, worker, queue)\n" \
"  return '{\"id\":' .. (id and cjson.encode(id) or 'null') .. ',\"error\":' .. cjson.encode(err) ..\n" \
"    ',\"failed_at\":' .. NOW .. ',\"attempts\":' .. tostring(tonumber(attempts) or 0) ..\n" \
"    ',\"worker\":' .. cjson.encode(worker) .. ',\"queue\":' .. cjson.encode(queue) .. ',\"job\":' .. cjson.encode(raw) .. '}'\n" \
"end\n" \
"local function to_dead(raw, id, err, attempts, worker, queue)\n" \
"  redis.call('LPUSH', DEAD, dead_entry(raw, id, err, attempts, worker, queue))\n" \
"  if id then\n" \
"    local hk = JOB .. id\n" \
"    redis.call('HSET', hk, 'status', 'failed', 'error', err, 'finished_at', NOW, 'worker', worker, 'queue', queue)\n" \
"    if TTL > 0 then redis.call('EXPIRE', hk, TTL) end\n" \
"  end\n" \
"  event(id, 'failed', worker, 'queue', queue, 'error', err)\n" \
"end\n" \
"-- marks a job running for the caller; returns its delivery count and whether a cancel is pending\n" \
"local function start(id, queue)\n" \
"  if not id then return 0, 0 end\n" \
"  local hk = JOB .. id\n" \
"  redis.call('HSET', hk, 'status', 'running', 'worker', WORKER, 'queue', queue, 'started_at', NOW,\n" \
"             'progress', '0', 'completion_tokens', '0')\n" \
"  redis.call('HSETNX', hk, 'created_at', NOW)\n" \
"  redis.call('PERSIST', hk)\n" \
"  local a = redis.call('HINCRBY', hk, 'attempts', 1)\n" \
"  local c = redis.call('SISMEMBER', CANCEL, id)\n" \
"  event(id, 'running', WORKER, 'queue', queue, 'attempt', a)\n" \
"  return a, c\n" \
"end\n" \
"-- the queue a job came from: its hash's, else the default\n" \
"local function origin(id)\n" \
"  if id then\n" \
"    local q = redis.call('HGET', JOB .. id, 'queue')\n" \
"    if q and q ~= '' then return q end\n" \
"  end\n" \
"  return DEFQ\n" \
"end\n"

/* KEYS[5..] source queues; ARGV[10] 'p' (priority) or 'r' (round robin), ARGV[11] max total,
 * ARGV[12..] per-source caps. Returns per job: source index (0-based), raw, id or nil, attempts,
 * cancel pending (0/1). */
static const char fetch_src[] = PRELUDE
"local n = #KEYS - 4\n"
"local rr, max = ARGV[10] == 'r', tonumber(ARGV[11])\n"
"local cap, taken, empty = {}, {}, {}\n"
"for i = 1, n do cap[i] = tonumber(ARGV[11 + i]); taken[i] = 0 end\n"
"local out, total = {}, 0\n"
"local function take(i)\n"
"  local raw = redis.call('LMOVE', KEYS[4 + i], PROC, 'RIGHT', 'LEFT')\n"
"  if not raw then empty[i] = true; return false end\n"
"  local id = job_id(raw)\n"
"  local a, c = start(id, string.sub(KEYS[4 + i], #QUEUE + 1))\n"
"  out[#out + 1] = i - 1; out[#out + 1] = raw; out[#out + 1] = id or false\n"
"  out[#out + 1] = a; out[#out + 1] = c\n"
"  taken[i] = taken[i] + 1; total = total + 1\n"
"  return true\n"
"end\n"
"if rr then\n"
"  local moved = true\n"
"  while moved and total < max do\n"
"    moved = false\n"
"    for i = 1, n do\n"
"      if total < max and not empty[i] and taken[i] < cap[i] and take(i) then moved = true end\n"
"    end\n"
"  end\n"
"else\n"
"  for i = 1, n do\n"
"    while total < max and not empty[i] and taken[i] < cap[i] do take(i) end\n"
"  end\n"
"end\n"
"return out\n";

/* ARGV[10] queue, ARGV[11] raw as in the list, ARGV[12] raw with a new id ('' = keep),
 * ARGV[13] that id. Returns {found 0/1, id or nil, attempts, cancel pending}. */
static const char start_src[] = PRELUDE
"local raw, id = ARGV[11], nil\n"
"if ARGV[12] ~= '' then\n"
"  local i = redis.call('LPOS', PROC, raw)\n"
"  if not i then return {0, false, 0, 0} end\n"
"  redis.call('LSET', PROC, i, ARGV[12])\n"
"  id = ARGV[13]\n"
"else\n"
"  if not redis.call('LPOS', PROC, raw) then return {0, false, 0, 0} end\n"
"  id = job_id(raw)\n"
"end\n"
"local a, c = start(id, ARGV[10])\n"
"return {1, id or false, a, c}\n";

/* ARGV[10] raw, ARGV[11] target queue ('' = where it came from), ARGV[12] '1' = this delivery
 * does not count (attempts - 1), ARGV[13] reason. Pushes to the RIGHT: fetched next.
 * Returns 1, or 0 when the job was not in the processing list. */
static const char requeue_src[] = PRELUDE
"local raw = ARGV[10]\n"
"if redis.call('LREM', PROC, -1, raw) == 0 then return 0 end\n"
"local id = job_id(raw)\n"
"local q = ARGV[11]\n"
"if q == '' then q = origin(id) end\n"
"redis.call('RPUSH', QUEUE .. q, raw)\n"
"if id then\n"
"  local hk = JOB .. id\n"
"  redis.call('HSET', hk, 'status', 'queued', 'queue', q)\n"
"  if ARGV[12] == '1' and redis.call('HINCRBY', hk, 'attempts', -1) < 0 then redis.call('HSET', hk, 'attempts', 0) end\n"
"end\n"
"event(id, 'queued', WORKER, 'queue', q, 'reason', ARGV[13])\n"
"return 1\n";

/* KEYS[4] the lapsed worker's processing list, KEYS[5] <p>:workers, KEYS[6] its heartbeat key;
 * ARGV[10] its id, ARGV[11] '1' = only if the heartbeat key is gone (and SREM it from workers),
 * ARGV[12] the reason recorded on each job. Newest first to the RIGHT of its queue, so the
 * oldest is fetched first. Returns {1, requeued, dead}, or {-1, 0, 0} when the worker is alive. */
static const char reap_src[] = PRELUDE
"local victim, reason = ARGV[10], ARGV[12]\n"
"if ARGV[11] == '1' and redis.call('EXISTS', KEYS[6]) == 1 then return {-1, 0, 0} end\n"
"local requeued, dead = 0, 0\n"
"while true do\n"
"  local raw = redis.call('LPOP', PROC)\n"
"  if not raw then break end\n"
"  local id, json = job_id(raw)\n"
"  if not json then\n"
"    to_dead(raw, nil, 'invalid JSON (' .. reason .. ')', 0, victim, DEFQ)\n"
"    dead = dead + 1\n"
"  else\n"
"    local q, a = DEFQ, 0\n"
"    if id then\n"
"      local h = redis.call('HMGET', JOB .. id, 'queue', 'attempts')\n"
"      if h[1] and h[1] ~= '' then q = h[1] end\n"
"      a = tonumber(h[2]) or 0\n"
"    end\n"
"    if id and a >= MAXATT then\n"
"      to_dead(raw, id, reason .. '; delivered ' .. a .. ' times (max_attempts ' .. MAXATT .. ')', a, victim, q)\n"
"      dead = dead + 1\n"
"    else\n"
"      redis.call('RPUSH', QUEUE .. q, raw)\n"
"      if id then redis.call('HSET', JOB .. id, 'status', 'queued', 'queue', q, 'error', reason) end\n"
"      event(id, 'queued', victim, 'queue', q, 'reason', 'reaped')\n"
"      requeued = requeued + 1\n"
"    end\n"
"  end\n"
"end\n"
"if ARGV[11] == '1' then redis.call('SREM', KEYS[5], victim) end\n"
"return {1, requeued, dead}\n";

/* KEYS[5] <p>:retry; ARGV[10] raw, ARGV[11] due (unix ms), ARGV[12] error.
 * Returns {1, attempts} scheduled, {2, attempts} dead-lettered (out of attempts, or no id to
 * count them by), {0, 0} not in the processing list. */
static const char retry_src[] = PRELUDE
"local raw, err = ARGV[10], ARGV[12]\n"
"if redis.call('LREM', PROC, -1, raw) == 0 then return {0, 0} end\n"
"local id = job_id(raw)\n"
"local q, a = DEFQ, 0\n"
"if id then\n"
"  local h = redis.call('HMGET', JOB .. id, 'queue', 'attempts')\n"
"  if h[1] and h[1] ~= '' then q = h[1] end\n"
"  a = tonumber(h[2]) or 0\n"
"end\n"
"if not id or a >= MAXATT then\n"
"  to_dead(raw, id, err, a, WORKER, q)\n"
"  return {2, a}\n"
"end\n"
"redis.call('ZADD', KEYS[5], ARGV[11], raw)\n"
"local due = tostring(tonumber(ARGV[11]) / 1000)\n"
"redis.call('HSET', JOB .. id, 'status', 'queued', 'error', err, 'retry_at', due)\n"
"event(id, 'queued', WORKER, 'queue', q, 'reason', 'retry', 'error', err, 'retry_at', due)\n"
"return {1, a}\n";

/* KEYS[5] <p>:retry; ARGV[10] now (unix ms), ARGV[11] most to move. To the LEFT of its queue
 * (behind what waits there). Returns how many moved. */
static const char retry_due_src[] = PRELUDE
"local due = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', ARGV[10], 'LIMIT', 0, ARGV[11])\n"
"for _, raw in ipairs(due) do\n"
"  redis.call('ZREM', KEYS[5], raw)\n"
"  local id = job_id(raw)\n"
"  local q = origin(id)\n"
"  redis.call('LPUSH', QUEUE .. q, raw)\n"
"  event(id, 'queued', WORKER, 'queue', q, 'reason', 'retry_due')\n"
"end\n"
"return #due\n";

/* ARGV[10] raw, ARGV[11] error, ARGV[12] queue, ARGV[13] id ('' = none). Returns 1, or 0 when
 * the job was not in the processing list. */
static const char dead_src[] = PRELUDE
"if redis.call('LREM', PROC, -1, ARGV[10]) == 0 then return 0 end\n"
"local id = ARGV[13] ~= '' and ARGV[13] or nil\n"
"local a = 0\n"
"if id then a = tonumber(redis.call('HGET', JOB .. id, 'attempts')) or 0 end\n"
"to_dead(ARGV[10], id, ARGV[11], a, WORKER, ARGV[12])\n"
"return 1\n";

/* ARGV[10] '1' = every entry, else ARGV[11..] the ids to requeue. Oldest entries first, each to
 * the LEFT of the queue it failed on, its hash reset (queued, attempts 0). Returns the count. */
static const char dead_requeue_src[] = PRELUDE
"local all, want = ARGV[10] == '1', {}\n"
"for i = 11, #ARGV do want[ARGV[i]] = true end\n"
"local entries = redis.call('LRANGE', DEAD, 0, -1)\n"
"local n = 0\n"
"for i = #entries, 1, -1 do\n"
"  local e = entries[i]\n"
"  local ok, d = pcall(cjson.decode, e)\n"
"  if ok and type(d) == 'table' and type(d.job) == 'string' then\n"
"    local id = type(d.id) == 'string' and d.id or nil\n"
"    if all or (id and want[id]) then\n"
"      redis.call('LREM', DEAD, -1, e)\n"
"      local q = (type(d.queue) == 'string' and d.queue ~= '') and d.queue or DEFQ\n"
"      if id then\n"
"        local hk = JOB .. id\n"
"        redis.call('DEL', hk)\n"
"        redis.call('HSET', hk, 'status', 'queued', 'queue', q, 'created_at', NOW, 'attempts', 0)\n"
"      end\n"
"      redis.call('LPUSH', QUEUE .. q, d.job)\n"
"      event(id, 'queued', WORKER, 'queue', q, 'reason', 'requeue_dead')\n"
"      n = n + 1\n"
"    end\n"
"  end\n"
"end\n"
"return n\n";

/* ARGV[10..] ids. Per id: 1 added to the cancel set, 0 its job already ended (completed,
 * failed or cancelled). */
static const char cancel_src[] = PRELUDE
"local out = {}\n"
"for i = 10, #ARGV do\n"
"  local s = redis.call('HGET', JOB .. ARGV[i], 'status')\n"
"  if s == 'completed' or s == 'failed' or s == 'cancelled' then\n"
"    out[#out + 1] = 0\n"
"  else\n"
"    redis.call('SADD', CANCEL, ARGV[i])\n"
"    event(ARGV[i], 'cancel_requested', WORKER)\n"
"    out[#out + 1] = 1\n"
"  end\n"
"end\n"
"return out\n";
/* clang-format on */

static const struct {
    const char *name, *src;
} scripts[RQ_SCRIPT_COUNT] = {
    [RQ_SCRIPT_FETCH] = {"fetch", fetch_src},
    [RQ_SCRIPT_START] = {"start", start_src},
    [RQ_SCRIPT_REQUEUE] = {"requeue", requeue_src},
    [RQ_SCRIPT_REAP] = {"reap", reap_src},
    [RQ_SCRIPT_RETRY] = {"retry", retry_src},
    [RQ_SCRIPT_RETRY_DUE] = {"retry_due", retry_due_src},
    [RQ_SCRIPT_DEAD] = {"dead", dead_src},
    [RQ_SCRIPT_DEAD_REQUEUE] = {"dead_requeue", dead_requeue_src},
    [RQ_SCRIPT_CANCEL] = {"cancel", cancel_src},
};

const char *rq_script_name(enum rq_script s)
{
    return s < RQ_SCRIPT_COUNT ? scripts[s].name : "?";
}

const char *rq_script_source(enum rq_script s)
{
    return s < RQ_SCRIPT_COUNT ? scripts[s].src : NULL;
}

int rq_scripts_load(struct rq_scripts *sc, struct rq_conn *c, int force)
{
    if (rq_conn_ready(c))
        return -1;
    if (!force && sc->epoch == c->epoch)
        return 0;
    rq_conn_discard(c);
    for (int i = 0; i < RQ_SCRIPT_COUNT; i++) {
        const char *argv[] = {"SCRIPT", "LOAD", scripts[i].src};
        if (rq_conn_append_argv(c, 3, argv, NULL))
            return -1;
    }
    int rc = 0;
    for (int i = 0; i < RQ_SCRIPT_COUNT; i++) {
        redisReply *r;
        if (rq_conn_read(c, &r))
            return -1;
        if (r->type == REDIS_REPLY_STRING && r->len == 40) {
            memcpy(sc->sha[i], r->str, 40);
            sc->sha[i][40] = 0;
        } else if (rc == 0) {
            snprintf(c->err, sizeof c->err, "SCRIPT LOAD %s: %.*s", scripts[i].name,
                     r->type == REDIS_REPLY_ERROR ? (int)r->len : 20,
                     r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
            rc = -1;
        }
        freeReplyObject(r);
    }
    if (rc == 0)
        sc->epoch = c->epoch;
    return rc;
}
