/* See scripts.h. The scripts share a prelude (PRELUDE) with the common KEYS/ARGV and helpers;
 * each body follows it. Job states written here match docs/QUEUE.md. */
#include "queue/scripts.h"

#include <stdio.h>
#include <string.h>

#include "queue/conn.h"

/* clang-format off */

/* Keys of the wrong type (docs/QUEUE.md, "Keys of the wrong type"). A key a script writes must be
 * absent or of the type llmq gives it. Each script checks the keys it will write with need()
 * before its first write, so a wrong-typed key fails it with nothing written and an error
 * "BADKEY <key> is a <type>, not a <type>" that names the key. Keys that only inform are
 * skipped instead: the events stream (event() writes nothing while it is not a stream) and the
 * cancel set for reads and removals (a non-set cancels nothing). */
#define KEYTYPES \
"-- the key's type when it is neither absent nor `want`, else nil\n" \
"local function wrong(k, want)\n" \
"  local t = redis.call('TYPE', k).ok\n" \
"  if t ~= 'none' and t ~= want then return t end\n" \
"  return nil\n" \
"end\n" \
"-- need(key, type, key, type, ...): fails the script naming the first key of the wrong type\n" \
"local function need(...)\n" \
"  local a = {...}\n" \
"  for i = 1, #a, 2 do\n" \
"    local t = wrong(a[i], a[i + 1])\n" \
"    if t then error({err = 'BADKEY ' .. a[i] .. ' is a ' .. t .. ', not a ' .. a[i + 1]}) end\n" \
"  end\n" \
"end\n"

/* Publishing a row to a results stream (queue/results.h): XADD, then, when the stream is longer
 * than cap (> 0), XTRIM MAXLEN cap (exact), the entries it took counted in the hash `dropped`
 * under `name`. cap '' = rows are not published (nothing happens). */
#define PUBLISH \
"local function publish(stream, dropped, cap, name, ...)\n" \
"  if cap == '' then return end\n" \
"  redis.call('XADD', stream, '*', ...)\n" \
"  local c = tonumber(cap) or 0\n" \
"  if c > 0 and redis.call('XLEN', stream) > c then\n" \
"    local d = redis.call('XTRIM', stream, 'MAXLEN', c)\n" \
"    if d > 0 then redis.call('HINCRBY', dropped, name, d) end\n" \
"  end\n" \
"end\n"

/* A job whose own hash, or the hash of the batch its hash names, has the wrong type is handled as
 * a job without an id in Redis: no script reads or writes those keys for it (they are left as
 * they are for the operator), it still runs and is acknowledged, retried or dead-lettered like
 * any job without an id. */
#define JOBREF \
"-- the key that keeps job `id` out of its Redis bookkeeping, and its type: its hash, or its\n" \
"-- batch's hash, when of the wrong type; else nil\n" \
"local function badkey(id)\n" \
"  if not id then return nil end\n" \
"  local hk = JOB .. id\n" \
"  local t = wrong(hk, 'hash')\n" \
"  if t then return hk, t end\n" \
"  local bid = redis.call('HGET', hk, 'batch_id')\n" \
"  if bid then\n" \
"    t = wrong(BATCH .. bid, 'hash')\n" \
"    if t then return BATCH .. bid, t end\n" \
"  end\n" \
"  return nil\n" \
"end\n" \
"-- job_id() for a script that writes the job's keys: no key when badkey() objects (then the\n" \
"-- bad key and its type follow)\n" \
"local function job_ref(raw)\n" \
"  local id, json = job_id(raw)\n" \
"  local bk, bt = badkey(id)\n" \
"  if bk then return nil, json, bk, bt end\n" \
"  return id, json\n" \
"end\n"

#define PRELUDE \
"local EVENTS, DEAD, CANCEL, PROC = KEYS[1], KEYS[2], KEYS[3], KEYS[4]\n" \
"local JOB, QUEUE, WORKER, NOW = ARGV[1], ARGV[2], ARGV[3], ARGV[4]\n" \
"local MAXLEN, TTL, DEFQ = ARGV[5], tonumber(ARGV[6]), ARGV[7]\n" \
"local MAXBYTES, MAXATT = tonumber(ARGV[8]), tonumber(ARGV[9])\n" \
"local BATCH, BATCH_DONE, HB = ARGV[10], ARGV[11], ARGV[12]\n" \
"local FINAL = {completed = true, failed = true, cancelled = true}\n" \
"-- an enqueue that never sealed its batch (killed) holds it open at most this long\n" \
"local ENQUEUE_LEASE_S = 3600\n" \
KEYTYPES \
PUBLISH \
"-- whether s is UTF-8 without stray or missing continuation bytes, overlong forms, surrogates or\n" \
"-- code points over U+10FFFF (what jansson reads)\n" \
"local function utf8_ok(s)\n" \
"  if not string.find(s, '[\\128-\\255]') then return true end\n" \
"  local ok = true\n" \
"  string.gsub(s, '[\\128-\\255][\\128-\\191]*', function(m)\n" \
"    local b, c, n = string.byte(m, 1), string.byte(m, 2) or 0, #m\n" \
"    if b >= 194 and b <= 223 then ok = ok and n == 2\n" \
"    elseif b >= 224 and b <= 239 then ok = ok and n == 3 and not (b == 224 and c < 160) and not (b == 237 and c > 159)\n" \
"    elseif b >= 240 and b <= 244 then ok = ok and n == 4 and not (b == 240 and c < 144) and not (b == 244 and c > 143)\n" \
"    else ok = false end\n" \
"  end)\n" \
"  return ok\n" \
"end\n" \
"-- an id or custom_id: 1..256 bytes of UTF-8 without C0 controls or DEL (queue/jobid.h)\n" \
"local function usable(v)\n" \
"  return type(v) == 'string' and #v > 0 and #v <= 256 and not string.find(v, '[%z\\1-\\31\\127]') and utf8_ok(v)\n" \
"end\n" \
"-- cjson with numbers as JSON writes them (no NaN, Infinity, hex, leading zeros or '+'), as jansson\n" \
"local JSON = nil\n" \
"-- the job's key (or nil) and whether it is JSON at all (rq_job_id's rule, queue/jobid.h)\n" \
"local function job_id(raw)\n" \
"  if MAXBYTES > 0 and #raw > MAXBYTES then return nil, true end\n" \
"  if not JSON then JSON = cjson.new(); JSON.decode_invalid_numbers(false) end\n" \
"  local ok, j = pcall(JSON.decode, raw)\n" \
"  if not ok then return nil, false end\n" \
"  if type(j) ~= 'table' then return nil, true end\n" \
"  if j.custom_id ~= nil or j.body ~= nil or j.url ~= nil or j.method ~= nil then\n" \
"    if not usable(j.custom_id) then return nil, true end\n" \
"    local b = j.batch_id\n" \
"    if b == nil or b == cjson.null then return j.custom_id, true end\n" \
"    if type(b) ~= 'string' or #b < 1 or #b > 64 or string.find(b, '[^%w._-]') then return nil, true end\n" \
"    return b .. '/' .. j.custom_id, true\n" \
"  end\n" \
"  if usable(j.id) then return j.id, true end\n" \
"  return nil, true\n" \
"end\n" \
JOBREF \
"local events_ok = nil\n" \
"local function event(id, status, worker, ...)\n" \
"  if events_ok == nil then events_ok = not wrong(EVENTS, 'stream') end\n" \
"  if not events_ok then return end\n" \
"  redis.call('XADD', EVENTS, 'MAXLEN', '~', MAXLEN, '*', 'id', id or '', 'status', status, 'worker', worker, 'ts', NOW, ...)\n" \
"end\n" \
"-- a batch's state from its counts. When every job is final (and no enqueue is still adding\n" \
"-- jobs) the batch completes, once: state, finished_at, its TTL, an event and a PUBLISH; the\n" \
"-- call returns its total then, else 0. A job that becomes not final again reopens it.\n" \
"local function batch_check(bid)\n" \
"  local bk = BATCH .. bid\n" \
"  local b = redis.call('HMGET', bk, 'state', 'total', 'running', 'completed', 'failed', 'cancelled', 'enqueuing', 'finished_at', 'enqueue_until')\n" \
"  if not b[1] then return 0 end\n" \
"  local total, c, f, x = tonumber(b[2]) or 0, tonumber(b[4]) or 0, tonumber(b[5]) or 0, tonumber(b[6]) or 0\n" \
"  local done = c + f + x\n" \
"  local enqueuing = (tonumber(b[7]) or 0) > 0 and (tonumber(b[9]) or 0) >= tonumber(NOW)\n" \
"  if total > 0 and done >= total and not enqueuing then\n" \
"    if b[8] then\n" \
"      if TTL > 0 and redis.call('TTL', bk) < 0 then redis.call('EXPIRE', bk, TTL) end\n" \
"      return 0\n" \
"    end\n" \
"    redis.call('HSET', bk, 'finished_at', NOW)\n" \
"    if b[1] ~= 'cancelled' then redis.call('HSET', bk, 'state', 'completed') end\n" \
"    if TTL > 0 then redis.call('EXPIRE', bk, TTL) end\n" \
"    event(nil, 'batch_completed', WORKER, 'batch_id', bid, 'total', total, 'completed', c, 'failed', f, 'cancelled', x)\n" \
"    redis.call('PUBLISH', BATCH_DONE, bid)\n" \
"    return total\n" \
"  end\n" \
"  if b[8] then\n" \
"    redis.call('HDEL', bk, 'finished_at')\n" \
"    redis.call('PERSIST', bk)\n" \
"  end\n" \
"  if b[1] == 'completed' or (b[1] == 'queued' and (done > 0 or (tonumber(b[3]) or 0) > 0)) then\n" \
"    redis.call('HSET', bk, 'state', 'running')\n" \
"  end\n" \
"  return 0\n" \
"end\n" \
"-- moves one job of batch bid from status `from` to `to` in its counts; batch_check's answer\n" \
"local function batch_move(bid, from, to)\n" \
"  if not bid or not from or from == to then return 0 end\n" \
"  local bk = BATCH .. bid\n" \
"  if redis.call('EXISTS', bk) == 0 then return 0 end\n" \
"  redis.call('HINCRBY', bk, from, -1)\n" \
"  redis.call('HINCRBY', bk, to, 1)\n" \
"  return batch_check(bid)\n" \
"end\n" \
"-- sets a job hash's status (and the fields that follow) and moves its batch's count with it:\n" \
"-- every status change of a job hash goes through here. Returns the batch id (or nil) and\n" \
"-- batch_check's answer.\n" \
"local function set_status(hk, to, ...)\n" \
"  local h = redis.call('HMGET', hk, 'status', 'batch_id')\n" \
"  redis.call('HSET', hk, 'status', to, ...)\n" \
"  return h[2], batch_move(h[2], h[1], to)\n" \
"end\n" \
"-- takes job `id` out of the cancel set: every step that makes a job final (or drops it) calls it\n" \
"local function uncancel(id)\n" \
"  if id and not wrong(CANCEL, 'set') then redis.call('SREM', CANCEL, id) end\n" \
"end\n" \
"local function dead_entry(raw, id, code, err, attempts, worker, queue)\n" \
"  return '{\"id\":' .. (id and cjson.encode(id) or 'null') .. ',\"error\":' .. cjson.encode(err) ..\n" \
"    ',\"error_code\":' .. cjson.encode(code) .. ',\"failed_at\":' .. NOW .. ',\"attempts\":' ..\n" \
"    tostring(tonumber(attempts) or 0) .. ',\"worker\":' .. cjson.encode(worker) .. ',\"queue\":' ..\n" \
"    cjson.encode(queue) .. ',\"job\":' .. cjson.encode(raw) .. '}'\n" \
"end\n" \
"-- returns batch_check's answer for the job's batch\n" \
"local function to_dead(raw, id, code, err, attempts, worker, queue)\n" \
"  redis.call('LPUSH', DEAD, dead_entry(raw, id, code, err, attempts, worker, queue))\n" \
"  local done = 0\n" \
"  if id then\n" \
"    local hk = JOB .. id\n" \
"    local _\n" \
"    _, done = set_status(hk, 'failed', 'error', err, 'error_code', code, 'finished_at', NOW, 'worker', worker, 'queue', queue)\n" \
"    if TTL > 0 then redis.call('EXPIRE', hk, TTL) end\n" \
"    uncancel(id)\n" \
"  end\n" \
"  event(id, 'failed', worker, 'queue', queue, 'error', err, 'error_code', code)\n" \
"  return done\n" \
"end\n" \
"-- a job's final status from its result: the hash's status, finished_at, worker, counters, error\n" \
"-- and code (removed when none), result; its TTL; its id out of the cancel set; an event. '' =\n" \
"-- none for fr, err, code, pt, ct, ft, res. Returns batch_check's answer for the job's batch.\n" \
"local function ack_job(id, st, q, fr, err, code, pt, ct, ft, res, worker)\n" \
"  local hk = JOB .. id\n" \
"  local f = {'finished_at', NOW, 'worker', worker}\n" \
"  local function add(name, v) if v ~= '' then f[#f + 1] = name; f[#f + 1] = v end end\n" \
"  if st == 'completed' then add('progress', '1') end\n" \
"  add('prompt_tokens', pt); add('completion_tokens', ct); add('first_token_at', ft)\n" \
"  add('finish_reason', fr); add('error', err); add('error_code', code); add('result', res)\n" \
"  local _, done = set_status(hk, st, unpack(f))\n" \
"  if err == '' then redis.call('HDEL', hk, 'error') end\n" \
"  if code == '' then redis.call('HDEL', hk, 'error_code') end\n" \
"  if TTL > 0 then redis.call('EXPIRE', hk, TTL) end\n" \
"  uncancel(id)\n" \
"  local e = {'queue', q}\n" \
"  if ct ~= '' then e[#e + 1] = 'completion_tokens'; e[#e + 1] = ct end\n" \
"  if err ~= '' then e[#e + 1] = 'error'; e[#e + 1] = err end\n" \
"  if code ~= '' then e[#e + 1] = 'error_code'; e[#e + 1] = code end\n" \
"  event(id, st, worker, unpack(e))\n" \
"  return done\n" \
"end\n" \
"-- whether a job arriving now is a copy of one that is final or held by a live worker (this one\n" \
"-- included): its status and holder then, else nil. Retries, the reaper, requeue-dead and\n" \
"-- `llmq enqueue --replace` set the hash to queued before a job comes back, so they pass.\n" \
"local function duplicate(id)\n" \
"  if not id then return nil end\n" \
"  local h = redis.call('HMGET', JOB .. id, 'status', 'worker')\n" \
"  if FINAL[h[1]] then return h[1], h[2] or '' end\n" \
"  if h[1] == 'running' and h[2] and (h[2] == WORKER or redis.call('EXISTS', HB .. h[2]) == 1) then return h[1], h[2] end\n" \
"  return nil\n" \
"end\n" \
"-- marks a job running for the caller; returns the delivery this is (attempts + 1: counted only\n" \
"-- once it runs, by the attempt script), whether a cancel is pending\n" \
"-- (its id is in the cancel set, or its batch is cancelled)\n" \
"-- and its batch (false when none)\n" \
"local function start(id, queue)\n" \
"  if not id then return 0, 0, false, 0 end\n" \
"  local hk = JOB .. id\n" \
"  local bid = set_status(hk, 'running', 'worker', WORKER, 'queue', queue, 'started_at', NOW,\n" \
"                         'progress', '0', 'completion_tokens', '0')\n" \
"  redis.call('HSETNX', hk, 'created_at', NOW)\n" \
"  redis.call('HDEL', hk, 'result', 'ran')\n" \
"  redis.call('PERSIST', hk)\n" \
"  redis.call('HSETNX', hk, 'attempts', 0)\n" \
"  local h = redis.call('HMGET', hk, 'attempts', 'stalls')\n" \
"  local a, s = (tonumber(h[1]) or 0) + 1, tonumber(h[2]) or 0\n" \
"  local c = wrong(CANCEL, 'set') and 0 or redis.call('SISMEMBER', CANCEL, id)\n" \
"  -- a job of a cancelled batch is cancelled when it is fetched, without running\n" \
"  if c == 0 and bid and redis.call('HGET', BATCH .. bid, 'state') == 'cancelled' then c = 1 end\n" \
"  event(id, 'running', WORKER, 'queue', queue, 'attempt', a)\n" \
"  return a, c, bid or false, s\n" \
"end\n" \
"-- the queue a job came from: its hash's, else the default\n" \
"local function origin(id)\n" \
"  if id then\n" \
"    local q = redis.call('HGET', JOB .. id, 'queue')\n" \
"    if q and q ~= '' then return q end\n" \
"  end\n" \
"  return DEFQ\n" \
"end\n"

/* KEYS[5..] source queues; ARGV[13] 'p' (priority) or 'r' (round robin), ARGV[14] max total,
 * ARGV[15] max bytes (0 = no bound), ARGV[16] bytes the caller took already (by BLMOVE),
 * ARGV[17..16+n] per-source caps, then optionally ARGV[17+n..16+2n] per-source group numbers:
 * sources of one group share their cap (taken counts per group). Only moves: the jobs are not
 * decoded and their hashes are not touched (the start script does that once the caller has read
 * their ids). Jobs are taken while the bytes taken (ARGV[16] included) are under the bound: the
 * first one always (when ARGV[16] is under it), so a call moves at most the bound plus one job.
 * Returns 2 values per job, in the order moved (so the last one moved is at index 0 of the
 * processing list): source index (0-based), raw; and -2, "<key>\n<type>" for a source queue of
 * the wrong type (not fetched from). */
static const char fetch_src[] = PRELUDE
"local n = #KEYS - 4\n"
"local rr, max, maxb, bytes = ARGV[13] == 'r', tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16])\n"
"local cap, taken, empty, grp = {}, {}, {}, {}\n"
"for i = 1, n do cap[i] = tonumber(ARGV[16 + i]); grp[i] = tonumber(ARGV[16 + n + i]) or i; taken[grp[i]] = 0 end\n"
"local out, total, full = {}, 0, false\n"
"need(PROC, 'list')\n"
"for i = 1, n do\n"
"  local t = wrong(KEYS[4 + i], 'list')\n"
"  if t then empty[i] = true; out[#out + 1] = -2; out[#out + 1] = KEYS[4 + i] .. '\\n' .. t end\n"
"end\n"
"local function take(i)\n"
"  if maxb > 0 and bytes >= maxb then full = true; return false end\n"
"  local raw = redis.call('LMOVE', KEYS[4 + i], PROC, 'RIGHT', 'LEFT')\n"
"  if not raw then empty[i] = true; return false end\n"
"  out[#out + 1] = i - 1; out[#out + 1] = raw\n"
"  taken[grp[i]] = taken[grp[i]] + 1; total = total + 1; bytes = bytes + #raw\n"
"  return true\n"
"end\n"
"if rr then\n"
"  local moved = true\n"
"  while moved and total < max and not full do\n"
"    moved = false\n"
"    for i = 1, n do\n"
"      if total < max and not full and not empty[i] and taken[grp[i]] < cap[i] and take(i) then moved = true end\n"
"    end\n"
"  end\n"
"else\n"
"  for i = 1, n do\n"
"    while total < max and not full and not empty[i] and taken[grp[i]] < cap[i] do take(i) end\n"
"  end\n"
"end\n"
"return out\n";

/* ARGV[13] n, ARGV[14] a marker no job equals, then 5 per job: queue, its index in the
 * processing list, its length in bytes, its id ('' = none), its JSON with that id added ('' =
 * keep: the id is its own). For jobs just moved there by the fetch script or BLMOVE (their ids
 * read by the caller): each is checked at its index (by length), given its new JSON (LSET), and
 * marked running (start()). A duplicate (see duplicate()) is taken out of the processing list
 * again with a duplicate event. A job whose hash (or its batch's) is of the wrong type is started
 * without its id (badkey()). KEYS[5] <p>:lines: a line without an id that the reaper put back
 * takes its mark from there. Returns 7 values per job: 1, attempts, cancel pending (0/1), batch
 * id or false, '' or "<key>\n<type>" when started without its id, stalls, the worker that held
 * it when the reaper put it back ('' = none, or it has an id) (started); -1, its status, its
 * holder, false, '', 0, '' (a duplicate); 0, false, false, false, '', 0, '' (not at that index:
 * not ours any more). */
static const char start_src[] = PRELUDE
"need(PROC, 'list')\n"
"local lines_ok = not wrong(KEYS[5], 'hash') -- it only informs: of another type, it is not read\n"
"local n, mark, out, dups = tonumber(ARGV[13]), ARGV[14], {}, 0\n"
"for i = 0, n - 1 do\n"
"  local k = 15 + i * 5\n"
"  local q, pos, len, id, new = ARGV[k], tonumber(ARGV[k + 1]), tonumber(ARGV[k + 2]), ARGV[k + 3], ARGV[k + 4]\n"
"  local raw = redis.call('LINDEX', PROC, pos)\n"
"  if id == '' then id = nil end\n"
"  local st, holder, bad = nil, nil, ''\n"
"  if not raw or #raw ~= len then\n"
"    out[#out + 1] = 0; out[#out + 1] = false; out[#out + 1] = false; out[#out + 1] = false; out[#out + 1] = ''; out[#out + 1] = 0; out[#out + 1] = ''\n"
"  else\n"
"    local bk, bt = badkey(id)\n"
"    if bk then id = nil; bad = bk .. '\\n' .. bt end\n"
"    if new ~= '' then\n"
"      redis.call('LSET', PROC, pos, new)\n"
"    else\n"
"      st, holder = duplicate(id)\n"
"    end\n"
"    if st then\n"
"      redis.call('LSET', PROC, pos, mark)\n"
"      dups = dups + 1\n"
"      if FINAL[st] then uncancel(id) end\n"
"      event(id, 'duplicate', WORKER, 'queue', q, 'job_status', st, 'job_worker', holder)\n"
"      out[#out + 1] = -1; out[#out + 1] = st; out[#out + 1] = holder; out[#out + 1] = false; out[#out + 1] = ''; out[#out + 1] = 0; out[#out + 1] = ''\n"
"    else\n"
"      local a, c, b, sl = start(id, q)\n"
"      local held = ''\n"
"      if not id and lines_ok then\n"
"        local f = redis.sha1hex(raw)\n"
"        held = redis.call('HGET', KEYS[5], f) or ''\n"
"        if held ~= '' then redis.call('HDEL', KEYS[5], f) end\n"
"      end\n"
"      out[#out + 1] = 1; out[#out + 1] = a; out[#out + 1] = c; out[#out + 1] = b; out[#out + 1] = bad; out[#out + 1] = sl; out[#out + 1] = held\n"
"    end\n"
"  end\n"
"end\n"
"if dups > 0 then redis.call('LREM', PROC, dups, mark) end\n"
"return out\n";

/* ARGV[13] raw, ARGV[14] target queue ('' = where it came from), ARGV[15] '1' = this delivery
 * does not count (attempts - 1, when the hash says running: a job moved by a fetch that never
 * got to mark it counted none), ARGV[16] reason. Pushes to the RIGHT: fetched next. A job whose
 * hash is final (someone finished it meanwhile) is dropped instead, with a duplicate event.
 * Returns 1, or 0 when the job was not in the processing list. */
static const char requeue_src[] = PRELUDE
"local raw = ARGV[13]\n"
"need(PROC, 'list')\n"
"local id = job_ref(raw)\n"
"local q = ARGV[14]\n"
"if q == '' then q = origin(id) end\n"
"need(QUEUE .. q, 'list')\n"
"if redis.call('LREM', PROC, -1, raw) == 0 then return 0 end\n"
"if id then\n"
"  local hk = JOB .. id\n"
"  local st = redis.call('HGET', hk, 'status')\n"
"  if FINAL[st] then\n"
"    uncancel(id)\n"
"    event(id, 'duplicate', WORKER, 'queue', q, 'job_status', st, 'reason', ARGV[16])\n"
"    return 1\n"
"  end\n"
"  set_status(hk, 'queued', 'queue', q)\n"
"  if ARGV[15] == '1' and st == 'running' and redis.call('HINCRBY', hk, 'attempts', -1) < 0 then redis.call('HSET', hk, 'attempts', 0) end\n"
"end\n"
"redis.call('RPUSH', QUEUE .. q, raw)\n"
"event(id, 'queued', WORKER, 'queue', q, 'reason', ARGV[16])\n"
"return 1\n";

/* KEYS[4] the lapsed worker's processing list, KEYS[5] <p>:workers, KEYS[6] its heartbeat key,
 * KEYS[7] its lapse mark (<p>:lapsed:<id>), KEYS[8] <p>:lines (a line without an id that goes
 * back is marked there with the lapsed worker's id, for the start script), KEYS[9] <p>:results,
 * KEYS[10] <p>:stream-dropped; ARGV[13] its id, ARGV[14] '1' = only if the heartbeat
 * key is gone (and SREM it from workers), ARGV[15] the reason recorded on each job, ARGV[16] the
 * grace in ms, ARGV[17] max_stalls; ARGV[18] n, ARGV[19] the results stream's cap ('' = rows are
 * not published), then 13 per job whose row the caller found
 * committed: its key (the job's id; for a line the caller found no id in, "\0<k>\0<the line>": the
 * k-th line of the list with that text), the row's worker, its started_at, status,
 * finish_reason, error, error code, prompt_tokens, completion_tokens, first_token_at, result
 * ('' = none, as for ack), the row's id and its JSON for <p>:results ('' = none). With ARGV[14] '1' a worker is reaped only once its heartbeat has stayed
 * gone for the grace as Redis counts it: the first call marks it (the mark's PTTL is the clock;
 * the worker's next heartbeat deletes the mark), so a worker that could not reach Redis, but comes
 * back as soon as Redis answers, keeps its jobs.
 * Newest first to the RIGHT of its queue, so the oldest is fetched first; a job whose hash is
 * final (finished: a copy) is dropped; a job whose row is committed for this very delivery (the
 * row's worker is the hash's and its started_at is not before the hash's: the fetch) is
 * acknowledged with it instead, as the worker's own ack would have (a failed row other than a
 * timeout is dead-lettered with its error, as the worker would have; a line without an id has
 * only failed rows). A job that ran in the delivery taken back (its `ran` field is the hash's
 * started_at) counts a stall; at max_stalls it is dead-lettered instead of put back. A job that
 * is not JSON goes back to the default queue (the next fetch fails it with a row). Returns {1,
 * requeued, dead, acked}, {-1, 0, 0, 0} when the worker is alive, {-2, ms, 0, 0} while its grace
 * runs (ms: how much of it is left). */
static const char reap_src[] = PRELUDE
"local victim, reason = ARGV[13], ARGV[15]\n"
"local MAXSTALLS = tonumber(ARGV[17]) or 1\n"
"if ARGV[14] == '1' then\n"
"  if redis.call('EXISTS', KEYS[6]) == 1 then return {-1, 0, 0, 0} end\n"
"  local grace = tonumber(ARGV[16]) or 0\n"
"  if grace > 0 then\n"
"    local left = redis.call('PTTL', KEYS[7])\n"
"    if left < 0 then\n"
"      redis.call('SET', KEYS[7], NOW, 'PX', 3 * grace)\n"
"      return {-2, grace, 0, 0}\n"
"    end\n"
"    local waited = 3 * grace - left\n"
"    if waited < grace then return {-2, grace - waited, 0, 0} end\n"
"  end\n"
"end\n"
"need(PROC, 'list', KEYS[5], 'set', DEAD, 'list')\n"
"local RESCAP = ARGV[19]\n"
"if RESCAP ~= '' then need(KEYS[9], 'stream', KEYS[10], 'hash') end\n"
"-- a committed row acknowledged here goes onto the results stream, as its worker's ack would have\n"
"local function publish_row(c)\n"
"  if ARGV[c + 12] ~= '' then publish(KEYS[9], KEYS[10], RESCAP, 'results', 'id', ARGV[c + 11], 'worker', ARGV[c + 1], 'row', ARGV[c + 12]) end\n"
"end\n"
"-- a line without an id put back: marked with the worker that held it, whose failed row the\n"
"-- next worker to fetch it may find in its own database (and then writes over, not beside it);\n"
"-- the mark only informs: a <p>:lines of another type is left as it is\n"
"local lines_ok = not wrong(KEYS[8], 'hash')\n"
"local function mark_line(raw)\n"
"  if not lines_ok then return end\n"
"  redis.call('HSET', KEYS[8], redis.sha1hex(raw), victim)\n"
"  redis.call('EXPIRE', KEYS[8], 7 * 86400)\n"
"end\n"
"local committed, lines = {}, false\n"
"for i = 0, (tonumber(ARGV[18]) or 0) - 1 do\n"
"  local c = 20 + i * 13\n"
"  committed[ARGV[c]] = c\n"
"  lines = lines or string.byte(ARGV[c], 1) == 0\n"
"end\n"
"local ref, seen, k = {}, {}, 0\n"
"for i, raw in ipairs(redis.call('LRANGE', PROC, 0, -1)) do\n"
"  local id, json = job_ref(raw)\n"
"  local lk = nil\n"
"  if lines then\n"
"    seen[raw] = (seen[raw] or 0) + 1\n"
"    lk = committed['\\0' .. seen[raw] .. '\\0' .. raw]\n"
"  end\n"
"  ref[i] = {id, json, lk}\n"
"  need(QUEUE .. origin(id), 'list')\n"
"end\n"
"if ARGV[14] == '1' then redis.call('DEL', KEYS[7]) end\n"
"local requeued, dead, acked = 0, 0, 0\n"
"while true do\n"
"  local raw = redis.call('LPOP', PROC)\n"
"  if not raw then break end\n"
"  k = k + 1\n"
"  local id, json = ref[k][1], ref[k][2]\n"
"  local lk = ref[k][3]\n"
"  if lk then\n"
"    -- a line without an id for the caller, whose failed row is committed: dead-lettered with\n"
"    -- it, as its worker would have, not failed again into a second row\n"
"    to_dead(raw, id, ARGV[lk + 6], ARGV[lk + 5], 0, ARGV[lk + 1], origin(id))\n"
"    publish_row(lk)\n"
"    acked = acked + 1\n"
"  elseif not json then\n"
"    -- not JSON: back to its queue like any other, where the next fetch fails it with a row and\n"
"    -- a dead entry (it never reaches the engine, so it cannot be the crash's cause)\n"
"    redis.call('RPUSH', QUEUE .. DEFQ, raw)\n"
"    mark_line(raw)\n"
"    event(nil, 'queued', victim, 'queue', DEFQ, 'reason', 'reaped')\n"
"    requeued = requeued + 1\n"
"  else\n"
"    local q, a, st, ck, ran = DEFQ, 0, nil, nil, false\n"
"    if id then\n"
"      local h = redis.call('HMGET', JOB .. id, 'queue', 'attempts', 'status', 'worker', 'started_at', 'ran')\n"
"      if h[1] and h[1] ~= '' then q = h[1] end\n"
"      a, st = tonumber(h[2]) or 0, h[3]\n"
"      ran = st == 'running' and h[4] == victim and h[5] ~= nil and h[6] == h[5]\n"
"      ck = committed[id]\n"
"      if ck and not (h[4] == ARGV[ck + 1] and tonumber(h[5]) and tonumber(h[5]) <= tonumber(ARGV[ck + 2]) + 0.002) then ck = nil end\n"
"    end\n"
"    if FINAL[st] then\n"
"      uncancel(id)\n"
"      event(id, 'duplicate', victim, 'queue', q, 'job_status', st, 'reason', 'reaped')\n"
"    elseif ck and ARGV[ck + 3] == 'failed' and ARGV[ck + 6] ~= 'timeout' then\n"
"      -- a failed row (bad input, out of attempts): dead-lettered, as its worker would have\n"
"      to_dead(raw, id, ARGV[ck + 6], ARGV[ck + 5], a, ARGV[ck + 1], q)\n"
"      if ARGV[ck + 10] ~= '' then redis.call('HSET', JOB .. id, 'result', ARGV[ck + 10]) end\n"
"      publish_row(ck)\n"
"      acked = acked + 1\n"
"    elseif ck then\n"
"      ack_job(id, ARGV[ck + 3], q, ARGV[ck + 4], ARGV[ck + 5], ARGV[ck + 6], ARGV[ck + 7], ARGV[ck + 8], ARGV[ck + 9], ARGV[ck + 10], ARGV[ck + 1])\n"
"      publish_row(ck)\n"
"      acked = acked + 1\n"
"    else\n"
"      local s = ran and redis.call('HINCRBY', JOB .. id, 'stalls', 1) or 0\n"
"      if ran and s >= MAXSTALLS then\n"
"        to_dead(raw, id, 'max_stalls_exceeded', reason .. '; its worker was lost while running it ' .. s .. ' times (queues.max_stalls ' .. MAXSTALLS .. ')', a, victim, q)\n"
"        dead = dead + 1\n"
"      else\n"
"        redis.call('RPUSH', QUEUE .. q, raw)\n"
"        if id then set_status(JOB .. id, 'queued', 'queue', q, 'error', reason) else mark_line(raw) end\n"
"        event(id, 'queued', victim, 'queue', q, 'reason', 'reaped')\n"
"        requeued = requeued + 1\n"
"      end\n"
"    end\n"
"  end\n"
"end\n"
"if ARGV[14] == '1' then redis.call('SREM', KEYS[5], victim) end\n"
"return {1, requeued, dead, acked}\n";

/* KEYS[5] <p>:retry; ARGV[13] raw, ARGV[14] due (unix ms), ARGV[15] error, ARGV[16] its code,
 * ARGV[17] the hash's result field when it dead-letters ('' = none). Out of attempts means
 * max_attempts deliveries that ended otherwise than with the worker gone (attempts - stalls).
 * Returns {1, attempts, 0} scheduled, {2, attempts, batch} dead-lettered (out of attempts, or no
 * id to count them by;
 * batch: its batch's total when this completed it, else 0), {0, 0, 0} not in the processing list. */
static const char retry_src[] = PRELUDE
"local raw, err, code = ARGV[13], ARGV[15], ARGV[16]\n"
"need(PROC, 'list', KEYS[5], 'zset', DEAD, 'list')\n"
"local id = job_ref(raw)\n"
"if redis.call('LREM', PROC, -1, raw) == 0 then return {0, 0, 0} end\n"
"local q, a, own = DEFQ, 0, 0\n"
"if id then\n"
"  local h = redis.call('HMGET', JOB .. id, 'queue', 'attempts', 'stalls')\n"
"  if h[1] and h[1] ~= '' then q = h[1] end\n"
"  a = tonumber(h[2]) or 0\n"
"  own = a - (tonumber(h[3]) or 0)\n"
"end\n"
"if not id or own >= MAXATT then\n"
"  local done = to_dead(raw, id, code, err, a, WORKER, q)\n"
"  if id and ARGV[17] and ARGV[17] ~= '' then redis.call('HSET', JOB .. id, 'result', ARGV[17]) end\n"
"  return {2, a, done}\n"
"end\n"
"redis.call('ZADD', KEYS[5], ARGV[14], raw)\n"
"local due = tostring(tonumber(ARGV[14]) / 1000)\n"
"set_status(JOB .. id, 'queued', 'error', err, 'error_code', code, 'retry_at', due)\n"
"event(id, 'queued', WORKER, 'queue', q, 'reason', 'retry', 'error', err, 'error_code', code, 'retry_at', due)\n"
"return {1, a, 0}\n";

/* KEYS[5] <p>:retry; ARGV[13] now (unix ms), ARGV[14] most to move. To the LEFT of its queue
 * (behind what waits there). Returns how many moved. */
static const char retry_due_src[] = PRELUDE
"need(KEYS[5], 'zset')\n"
"local due = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', ARGV[13], 'LIMIT', 0, ARGV[14])\n"
"local ids = {}\n"
"for i, raw in ipairs(due) do ids[i] = job_ref(raw) or false; need(QUEUE .. origin(ids[i] or nil), 'list') end\n"
"for i, raw in ipairs(due) do\n"
"  redis.call('ZREM', KEYS[5], raw)\n"
"  local id = ids[i] or nil\n"
"  local q = origin(id)\n"
"  redis.call('LPUSH', QUEUE .. q, raw)\n"
"  event(id, 'queued', WORKER, 'queue', q, 'reason', 'retry_due')\n"
"end\n"
"return #due\n";

/* KEYS[5] <p>:results, KEYS[6] <p>:stream-dropped; ARGV[13] raw, ARGV[14] error, ARGV[15] queue,
 * ARGV[16] id ('' = none), ARGV[17] the error's code, ARGV[18] the hash's result field ('' =
 * none), ARGV[19] the results stream's cap ('' = not published), ARGV[20] the row's id, ARGV[21]
 * the row ('' = none published). Returns {1, batch} (batch: its batch's total
 * when this completed it, else 0), or {0, 0} when the job was not in the processing list. */
static const char dead_src[] = PRELUDE
"need(PROC, 'list', DEAD, 'list')\n"
"if ARGV[19] ~= '' then need(KEYS[5], 'stream', KEYS[6], 'hash') end\n"
"local id = ARGV[16] ~= '' and ARGV[16] or nil\n"
"if badkey(id) then id = nil end\n"
"if redis.call('LREM', PROC, -1, ARGV[13]) == 0 then return {0, 0} end\n"
"local a = 0\n"
"if id then a = tonumber(redis.call('HGET', JOB .. id, 'attempts')) or 0 end\n"
"local done = to_dead(ARGV[13], id, ARGV[17], ARGV[14], a, WORKER, ARGV[15])\n"
"if id and ARGV[18] and ARGV[18] ~= '' then redis.call('HSET', JOB .. id, 'result', ARGV[18]) end\n"
"if ARGV[21] ~= '' then publish(KEYS[5], KEYS[6], ARGV[19], 'results', 'id', ARGV[20], 'worker', WORKER, 'row', ARGV[21]) end\n"
"return {1, done}\n";

/* ARGV[13..] ids of jobs this worker starts running. Per id: its attempts after counting this
 * delivery (HINCRBY 1), or -1 when its hash is not running on this worker (reaped meanwhile,
 * or final): then nothing is counted. A counted job's `ran` field becomes its `started_at` (this
 * delivery's fetch time), so the reaper can tell that it ran in the delivery it takes back. */
static const char attempt_src[] = PRELUDE
"local out = {}\n"
"for i = 13, #ARGV do\n"
"  local hk = JOB .. ARGV[i]\n"
"  local h = wrong(hk, 'hash') and {} or redis.call('HMGET', hk, 'status', 'worker', 'started_at')\n"
"  if h[1] == 'running' and h[2] == WORKER then\n"
"    redis.call('HSET', hk, 'ran', h[3] or '')\n"
"    out[#out + 1] = redis.call('HINCRBY', hk, 'attempts', 1)\n"
"  else\n"
"    out[#out + 1] = -1\n"
"  end\n"
"end\n"
"return out\n";

/* ARGV[13] '1' = every entry, else ARGV[14..] the ids to requeue. Oldest entries first, each to
 * the LEFT of the queue it failed on, its hash reset (queued, attempts 0) and kept in its batch
 * (whose count moves from the hash's status, or from failed when the hash has expired). Returns
 * the count. */
static const char dead_requeue_src[] = PRELUDE
"local all, want = ARGV[13] == '1', {}\n"
"for i = 14, #ARGV do want[ARGV[i]] = true end\n"
"need(DEAD, 'list')\n"
"local entries = redis.call('LRANGE', DEAD, 0, -1)\n"
"for _, e in ipairs(entries) do\n"
"  local ok, d = pcall(cjson.decode, e)\n"
"  local id = ok and type(d) == 'table' and type(d.id) == 'string' and d.id or nil\n"
"  if ok and type(d) == 'table' and type(d.job) == 'string' and (all or (id and want[id])) then\n"
"    need(QUEUE .. ((type(d.queue) == 'string' and d.queue ~= '') and d.queue or DEFQ), 'list')\n"
"    if id then\n"
"      need(JOB .. id, 'hash')\n"
"      local okj, j = pcall(cjson.decode, d.job)\n"
"      local bid = redis.call('HGET', JOB .. id, 'batch_id') or (okj and type(j) == 'table' and type(j.batch_id) == 'string' and j.batch_id)\n"
"      if bid then need(BATCH .. bid, 'hash') end\n"
"    end\n"
"  end\n"
"end\n"
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
"        local h = redis.call('HMGET', hk, 'status', 'batch_id')\n"
"        local bid, from = h[2], h[1]\n"
"        if not h[1] then\n"
"          local okj, j = pcall(cjson.decode, d.job)\n"
"          if okj and type(j) == 'table' and type(j.batch_id) == 'string' then bid, from = j.batch_id, 'failed' end\n"
"        end\n"
"        if bid and redis.call('EXISTS', BATCH .. bid) == 0 then bid = nil end\n"
"        redis.call('DEL', hk)\n"
"        redis.call('HSET', hk, 'status', 'queued', 'queue', q, 'created_at', NOW, 'attempts', 0)\n"
"        if bid then\n"
"          redis.call('HSET', hk, 'batch_id', bid)\n"
"          batch_move(bid, from, 'queued')\n"
"        end\n"
"      end\n"
"      redis.call('LPUSH', QUEUE .. q, d.job)\n"
"      event(id, 'queued', WORKER, 'queue', q, 'reason', 'requeue_dead')\n"
"      n = n + 1\n"
"    end\n"
"  end\n"
"end\n"
"return n\n";

/* ARGV[13..] ids. Per id: 1 added to the cancel set, the status of its job when it already ended
 * (completed, failed or cancelled), -1 no such job (no hash): nothing is added for it. A job that
 * ends takes its id out of the set (uncancel()); as a bound for ids nothing ever takes out (added
 * by clients for jobs that never came), each addition sets the set's expiry to the result TTL. */
static const char cancel_src[] = PRELUDE
"need(CANCEL, 'set')\n"
"for i = 13, #ARGV do need(JOB .. ARGV[i], 'hash') end\n"
"local out, added = {}, false\n"
"for i = 13, #ARGV do\n"
"  local s = redis.call('HGET', JOB .. ARGV[i], 'status')\n"
"  if not s then\n"
"    out[#out + 1] = -1\n"
"  elseif FINAL[s] then\n"
"    out[#out + 1] = s\n"
"  else\n"
"    redis.call('SADD', CANCEL, ARGV[i])\n"
"    event(ARGV[i], 'cancel_requested', WORKER)\n"
"    out[#out + 1] = 1\n"
"    added = true\n"
"  end\n"
"end\n"
"if added and TTL > 0 then redis.call('EXPIRE', CANCEL, TTL) end\n"
"return out\n";

/* KEYS[5] <p>:results, KEYS[6] <p>:stream-dropped; ARGV[13] n, ARGV[14] the results stream's
 * cap ('' = rows are not published), then 13 per job: raw, id ('' = none), status, queue,
 * finish_reason, error, error code ('' = none for these three), prompt_tokens, completion_tokens,
 * first_token_at ('' = leave as it is), result ('' = none), the row's id and the row (JSON; ''
 * = none published). Per job, in one script for the batch: LREM from the processing list; the
 * hash's final status, finished_at, counters, error and code (removed when none), result, its
 * TTL; SREM from the cancel set; an event; the row onto <p>:results (publish()), so a row is in
 * the stream exactly when its job is acknowledged. Returns 2 values per job: 1 if it was still in
 * the processing list (else 0), and its batch's total when this completed the batch (else 0). */
static const char ack_src[] = PRELUDE
"local n, out, cap = tonumber(ARGV[13]), {}, ARGV[14]\n"
"need(PROC, 'list')\n"
"if cap ~= '' then need(KEYS[5], 'stream', KEYS[6], 'hash') end\n"
"local cancel_ok = not wrong(CANCEL, 'set')\n"
"for i = 0, n - 1 do\n"
"  local k = 15 + i * 13\n"
"  local raw, id, st, q = ARGV[k], ARGV[k + 1], ARGV[k + 2], ARGV[k + 3]\n"
"  local fr, err, code = ARGV[k + 4], ARGV[k + 5], ARGV[k + 6]\n"
"  local pt, ct, ft, res = ARGV[k + 7], ARGV[k + 8], ARGV[k + 9], ARGV[k + 10]\n"
"  out[#out + 1] = redis.call('LREM', PROC, -1, raw)\n"
"  if id ~= '' and badkey(id) then id = '' end\n"
"  local done = 0\n"
"  if id ~= '' then done = ack_job(id, st, q, fr, err, code, pt, ct, ft, res, WORKER) end\n"
"  if ARGV[k + 12] ~= '' then publish(KEYS[5], KEYS[6], cap, 'results', 'id', ARGV[k + 11], 'worker', WORKER, 'row', ARGV[k + 12]) end\n"
"  out[#out + 1] = done\n"
"end\n"
"return out\n";

/* KEYS[5] the stream, KEYS[6] <p>:stream-dropped; ARGV[13] its cap ('' or 0 = none), ARGV[14]
 * its name in the dropped hash, ARGV[15] n, then 6 per entry: three field, value pairs. Adds the
 * entries in order (publish()). Returns n. */
static const char publish_src[] = PRELUDE
"local cap, name, n = ARGV[13], ARGV[14], tonumber(ARGV[15])\n"
"if cap == '' then cap = '0' end\n"
"need(KEYS[5], 'stream', KEYS[6], 'hash')\n"
"for i = 0, n - 1 do\n"
"  local k = 16 + i * 6\n"
"  publish(KEYS[5], KEYS[6], cap, name, ARGV[k], ARGV[k + 1], ARGV[k + 2], ARGV[k + 3], ARGV[k + 4], ARGV[k + 5])\n"
"end\n"
"return n\n";

/* KEYS[5] the queue; ARGV[13] batch id ('' = none), ARGV[14] mode: 'new' refuses a job whose
 * hash exists, 'replace' refuses one that is not final (queued or running) and resets a final
 * one, 'force' resets whatever is there; ARGV[15] n, then 2 per job: raw, id ('' = none: no
 * hash, and not allowed in a batch). Jobs are pushed in order (the first is fetched first), each
 * with a fresh hash (status queued, queue, created_at, attempts 0, batch_id) and an event; a job
 * new to the batch adds to its total and queued count, one already in it moves to queued.
 * Returns per job '' (pushed) or the status that refused it. */
static const char push_src[] = PRELUDE
"local bid, mode, n = ARGV[13], ARGV[14], tonumber(ARGV[15])\n"
"local q = string.sub(KEYS[5], #QUEUE + 1)\n"
"need(KEYS[5], 'list')\n"
"if bid ~= '' then need(BATCH .. bid, 'hash') end\n"
"for i = 0, n - 1 do if ARGV[17 + 2 * i] ~= '' then need(JOB .. ARGV[17 + 2 * i], 'hash') end end\n"
"if bid ~= '' and redis.call('EXISTS', BATCH .. bid) == 0 then return redis.error_reply('ERR no batch ' .. bid) end\n"
"local out, added = {}, 0\n"
"for i = 0, n - 1 do\n"
"  local raw, id = ARGV[16 + 2 * i], ARGV[17 + 2 * i]\n"
"  local st = nil\n"
"  if id ~= '' then\n"
"    local hk = JOB .. id\n"
"    local h = redis.call('HMGET', hk, 'status', 'batch_id')\n"
"    if h[1] and (mode == 'new' or (mode == 'replace' and not FINAL[h[1]])) then\n"
"      st = h[1]\n"
"    else\n"
"      if bid ~= '' and h[1] and h[2] == bid then batch_move(bid, h[1], 'queued')\n"
"      elseif bid ~= '' then added = added + 1 end\n"
"      redis.call('DEL', hk)\n"
"      redis.call('HSET', hk, 'status', 'queued', 'queue', q, 'created_at', NOW, 'attempts', 0)\n"
"      if bid ~= '' then redis.call('HSET', hk, 'batch_id', bid) end\n"
"      event(id, 'queued', '', 'queue', q)\n"
"    end\n"
"  elseif bid ~= '' then\n"
"    return redis.error_reply('ERR a job of a batch needs an id')\n"
"  end\n"
"  if st then out[#out + 1] = st else\n"
"    redis.call('LPUSH', KEYS[5], raw)\n"
"    out[#out + 1] = ''\n"
"  end\n"
"end\n"
"if added > 0 then\n"
"  redis.call('HINCRBY', BATCH .. bid, 'total', added)\n"
"  redis.call('HINCRBY', BATCH .. bid, 'queued', added)\n"
"  batch_check(bid)\n"
"end\n"
"return out\n";

/* KEYS[5] <p>:batches; ARGV[13] batch id, ARGV[14] input (the file name as given), ARGV[15] '1'
 * = append to an existing batch. Creates the batch hash (id, input, created_at, total 0, counts
 * 0, state queued) and its entry in <p>:batches, or reopens it for appending, and counts one
 * enqueue in progress (`enqueuing`: the batch cannot complete until batch_seal, or until
 * `enqueue_until`, ENQUEUE_LEASE_S after the last open, has passed: a killed enqueue does not
 * hold it open for ever; a stale count is dropped at the next open). Returns 1
 * created, 2 reopened, 0 it exists (and ARGV[15] is not '1'), -1 it is cancelled. */
static const char batch_open_src[] = PRELUDE
"local bid = ARGV[13]\n"
"local bk = BATCH .. bid\n"
"need(bk, 'hash', KEYS[5], 'zset')\n"
"local state = redis.call('HGET', bk, 'state')\n"
"local rc = 1\n"
"if state then\n"
"  if ARGV[15] ~= '1' then return 0 end\n"
"  if state == 'cancelled' then return -1 end\n"
"  rc = 2\n"
"else\n"
"  redis.call('DEL', bk)\n"
"  redis.call('HSET', bk, 'id', bid, 'input', ARGV[14], 'created_at', NOW, 'total', 0, 'queued', 0,\n"
"             'running', 0, 'completed', 0, 'failed', 0, 'cancelled', 0, 'state', 'queued')\n"
"  redis.call('ZADD', KEYS[5], NOW, bid)\n"
"end\n"
"if (tonumber(redis.call('HGET', bk, 'enqueue_until')) or 0) < tonumber(NOW) then redis.call('HDEL', bk, 'enqueuing') end\n"
"redis.call('HINCRBY', bk, 'enqueuing', 1)\n"
"redis.call('HSET', bk, 'enqueue_until', tonumber(NOW) + ENQUEUE_LEASE_S)\n"
"redis.call('PERSIST', bk)\n"
"return rc\n";

/* ARGV[13] batch id. Ends one enqueue of batch_open: the batch may complete from now on (at
 * once when its jobs already are final). Returns the batch's total when this completed it, else 0. */
static const char batch_seal_src[] = PRELUDE
"local bk = BATCH .. ARGV[13]\n"
"need(bk, 'hash')\n"
"if redis.call('EXISTS', bk) == 0 then return 0 end\n"
"if redis.call('HINCRBY', bk, 'enqueuing', -1) <= 0 then redis.call('HDEL', bk, 'enqueuing', 'enqueue_until') end\n"
"return batch_check(ARGV[13])\n";
/* KEYS[5] <p>:workers; ARGV[13] batch id, ARGV[14] <p>:processing:. Sets the batch's state to
 * cancelled (jobs of it fetched from now on are cancelled at fetch without running: see start())
 * and adds every job of it that is running in a worker's processing list to the cancel set (the
 * worker stops it at its next engine step). Returns {1, asked, queued} (0 instead of 1 when it was
 * cancelled already; asked: running jobs added to the cancel set; queued: the batch's queued
 * count), {-1, 0, 0} no such batch, {-2, 0, 0} it has completed. */
static const char batch_cancel_src[] = PRELUDE
"local bid = ARGV[13]\n"
"local bk = BATCH .. bid\n"
"need(bk, 'hash', KEYS[5], 'set', CANCEL, 'set')\n"
"local b = redis.call('HMGET', bk, 'state', 'queued')\n"
"if not b[1] then return {-1, 0, 0} end\n"
"if b[1] == 'completed' then return {-2, 0, 0} end\n"
"local rc = b[1] == 'cancelled' and 0 or 1\n"
"redis.call('HSET', bk, 'state', 'cancelled')\n"
"local asked = 0\n"
"for _, w in ipairs(redis.call('SMEMBERS', KEYS[5])) do\n"
"  local pk = ARGV[14] .. w\n"
"  for _, raw in ipairs(wrong(pk, 'list') and {} or redis.call('LRANGE', pk, 0, -1)) do\n"
"    local id = job_ref(raw)\n"
"    if id then\n"
"      local h = redis.call('HMGET', JOB .. id, 'status', 'batch_id')\n"
"      if h[1] == 'running' and h[2] == bid and redis.call('SADD', CANCEL, id) == 1 then\n"
"        event(id, 'cancel_requested', WORKER)\n"
"        asked = asked + 1\n"
"      end\n"
"    end\n"
"  end\n"
"end\n"
"if asked > 0 and TTL > 0 then redis.call('EXPIRE', CANCEL, TTL) end\n"
"if rc == 1 then event(nil, 'batch_cancelled', WORKER, 'batch_id', bid) end\n"
"batch_check(bid)\n"
"return {rc, asked, tonumber(b[2]) or 0}\n";

/* KEYS[5] <p>:batches, KEYS[6] <p>:models; ARGV[13] batch id; ARGV[14..19] the batch from SQLite,
 * used only when its hash has expired: input, created_at, total, completed, failed, cancelled;
 * ARGV[20] n, then 4 per job: raw (the stored request), id, queue reference, the status of its
 * row. Runs the jobs again as new attempts of the same keys: refused as a whole ({'busy', id,
 * status}) when one of them is not final, ({'other', id, batch}) when one's hash names another
 * batch, ({'cancelling', queued + running}) for a cancelled batch whose jobs are not all final.
 * Otherwise the batch hash is made again from ARGV[14..19] if it expired, a cancelled batch
 * becomes running, and each job gets a fresh hash (queued, attempts 0, its batch), its batch
 * count moves from its status (the hash's, else the row's) to queued, and it is pushed to the
 * LEFT of its queue. Returns {'ok', n}. */
static const char batch_requeue_src[] = PRELUDE
"local bid = ARGV[13]\n"
"local bk = BATCH .. bid\n"
"local n = tonumber(ARGV[20])\n"
"need(bk, 'hash', KEYS[5], 'zset', KEYS[6], 'set')\n"
"for i = 0, n - 1 do need(JOB .. ARGV[22 + 4 * i], 'hash', QUEUE .. ARGV[23 + 4 * i], 'list') end\n"
"local cancel_ok = not wrong(CANCEL, 'set')\n"
"local from = {}\n"
"for i = 0, n - 1 do\n"
"  local id = ARGV[22 + 4 * i]\n"
"  local h = redis.call('HMGET', JOB .. id, 'status', 'batch_id')\n"
"  if h[1] and not FINAL[h[1]] then return {'busy', id, h[1]} end\n"
"  if h[1] and h[2] and h[2] ~= bid then return {'other', id, h[2]} end\n"
"  from[i] = h[1] or ARGV[24 + 4 * i]\n"
"end\n"
"local b = redis.call('HMGET', bk, 'state', 'queued', 'running')\n"
"if b[1] == 'cancelled' then\n"
"  local open = (tonumber(b[2]) or 0) + (tonumber(b[3]) or 0)\n"
"  if open > 0 then return {'cancelling', open} end\n"
"  redis.call('HSET', bk, 'state', 'running')\n"
"elseif not b[1] then\n"
"  redis.call('HSET', bk, 'id', bid, 'input', ARGV[14], 'created_at', ARGV[15], 'total', ARGV[16],\n"
"             'queued', 0, 'running', 0, 'completed', ARGV[17], 'failed', ARGV[18], 'cancelled', ARGV[19],\n"
"             'state', 'completed', 'finished_at', NOW)\n"
"  redis.call('ZADD', KEYS[5], 'NX', ARGV[15], bid)\n"
"end\n"
"for i = 0, n - 1 do\n"
"  local raw, id, q = ARGV[21 + 4 * i], ARGV[22 + 4 * i], ARGV[23 + 4 * i]\n"
"  local hk = JOB .. id\n"
"  redis.call('DEL', hk)\n"
"  redis.call('HSET', hk, 'status', 'queued', 'queue', q, 'created_at', NOW, 'attempts', 0, 'batch_id', bid)\n"
"  if cancel_ok then redis.call('SREM', CANCEL, id) end\n"
"  batch_move(bid, from[i], 'queued')\n"
"  redis.call('LPUSH', QUEUE .. q, raw)\n"
"  local m = string.match(q, '^(.+):[^:]+$')\n"
"  if m then redis.call('SADD', KEYS[6], m) end\n"
"  event(id, 'queued', WORKER, 'queue', q, 'reason', 'requeue_batch')\n"
"end\n"
"return {'ok', n}\n";

/* KEYS[5] what is purged: a queue (list), <p>:retry (sorted set) or <p>:dead (list); ARGV[13] its
 * kind: 'queue', 'retry' or 'dead'; ARGV[14] the most entries to take in this call; ARGV[15] the
 * queue reference for events ('' for retry and dead). Takes entries oldest first (a queue's and
 * the dead list's right end, the retry set's earliest due). For each job with an id: a queued job
 * (queue, retry) whose hash says queued loses its hash, and its batch counts it cancelled, as if a
 * worker had cancelled it at fetch; a dead entry whose hash says failed loses its hash (its batch
 * keeps counting it failed). A hash in another state (the job was pushed again, or is running), or
 * one whose queue field names another queue (this entry is a stale copy), is left as it is. Its id leaves the cancel set; a `purged` event. Returns {entries taken, hashes
 * removed}. */
static const char purge_src[] = PRELUDE
"local kind, max, q = ARGV[13], tonumber(ARGV[14]), ARGV[15]\n"
"need(KEYS[5], kind == 'retry' and 'zset' or 'list')\n"
"local n, hashes = 0, 0\n"
"while n < max do\n"
"  local raw\n"
"  if kind == 'retry' then raw = redis.call('ZPOPMIN', KEYS[5])[1] else raw = redis.call('RPOP', KEYS[5]) end\n"
"  if not raw then break end\n"
"  n = n + 1\n"
"  local id\n"
"  if kind == 'dead' then\n"
"    local ok, d = pcall(cjson.decode, raw)\n"
"    id = ok and type(d) == 'table' and usable(d.id) and d.id or nil\n"
"    if badkey(id) then id = nil end\n"
"  else\n"
"    id = job_ref(raw)\n"
"  end\n"
"  if id then\n"
"    local hk = JOB .. id\n"
"    local h = redis.call('HMGET', hk, 'status', 'queue')\n"
"    local elsewhere = kind == 'queue' and h[2] and h[2] ~= '' and h[2] ~= q\n"
"    if h[1] == (kind == 'dead' and 'failed' or 'queued') and not elsewhere then\n"
"      if kind ~= 'dead' then set_status(hk, 'cancelled') end\n"
"      redis.call('DEL', hk)\n"
"      hashes = hashes + 1\n"
"    end\n"
"    uncancel(id)\n"
"    if q ~= '' then event(id, 'purged', WORKER, 'from', kind, 'queue', q) else event(id, 'purged', WORKER, 'from', kind) end\n"
"  end\n"
"end\n"
"return {n, hashes}\n";

/* KEYS[5] the heartbeat hash, KEYS[6] <p>:workers; ARGV[13] this instance's token, ARGV[14] whose
 * hash it may replace: '' none but its own, '*' any, '(none)' one without a token, else the
 * instance with that token; ARGV[15] TTL s; ARGV[16..] field, value pairs. Checks and writes in
 * one step, so of two instances starting at once one wins. Returns {'ok'} ({'ok', token, host,
 * pid, -2} when it replaced another instance's hash), or {'taken', token ('(none)' when the hash
 * has none), host, pid, PTTL ms} and writes nothing. */
static const char heartbeat_src[] = PRELUDE
"local HBK, TOKEN, REPLACE = KEYS[5], ARGV[13], ARGV[14]\n"
"need(HBK, 'hash', KEYS[6], 'set')\n"
"local prev = {'ok'}\n"
"if redis.call('EXISTS', HBK) == 1 then\n"
"  local cur = redis.call('HMGET', HBK, 'instance', 'host', 'pid')\n"
"  local seen = cur[1] or '(none)'\n"
"  if seen ~= TOKEN then\n"
"    if REPLACE ~= '*' and REPLACE ~= seen then\n"
"      return {'taken', seen, cur[2] or '', cur[3] or '', redis.call('PTTL', HBK)}\n"
"    end\n"
"    redis.call('DEL', HBK)\n"
"    prev = {'ok', seen, cur[2] or '', cur[3] or '', -2}\n"
"  end\n"
"end\n"
"redis.call('HSET', HBK, 'instance', TOKEN, unpack(ARGV, 16, #ARGV))\n"
"redis.call('EXPIRE', HBK, ARGV[15])\n"
"redis.call('SADD', KEYS[6], WORKER)\n"
"if KEYS[7] then redis.call('DEL', KEYS[7]) end\n"
"return prev\n";
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
    [RQ_SCRIPT_ACK] = {"ack", ack_src},
    [RQ_SCRIPT_PUSH] = {"push", push_src},
    [RQ_SCRIPT_BATCH_OPEN] = {"batch_open", batch_open_src},
    [RQ_SCRIPT_BATCH_SEAL] = {"batch_seal", batch_seal_src},
    [RQ_SCRIPT_BATCH_CANCEL] = {"batch_cancel", batch_cancel_src},
    [RQ_SCRIPT_BATCH_RERUN] = {"batch_requeue", batch_requeue_src},
    [RQ_SCRIPT_ATTEMPT] = {"attempt", attempt_src},
    [RQ_SCRIPT_HEARTBEAT] = {"heartbeat", heartbeat_src},
    [RQ_SCRIPT_PURGE] = {"purge", purge_src},
    [RQ_SCRIPT_PUBLISH] = {"publish", publish_src},
};

const char *rq_script_name(enum rq_script s)
{
    return s < RQ_SCRIPT_COUNT ? scripts[s].name : "?";
}

const char *rq_script_source(enum rq_script s)
{
    return s < RQ_SCRIPT_COUNT ? scripts[s].src : NULL;
}

const char *rq_script_prelude(void)
{
    return PRELUDE;
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
