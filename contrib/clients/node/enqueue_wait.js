#!/usr/bin/env node
// Push one job onto an llmq queue and wait until a worker has finished it (npm `redis`, v4).
//
//   npm install
//   node enqueue_wait.js --prompt "Summarize: ..." --max-tokens 64
//   node enqueue_wait.js --template summarize --var document=@report.txt --db /var/lib/llmq/llmq.db
//
// Prints one JSON line: {"id", "status", "finish_reason", "prompt_tokens", "completion_tokens",
// "error", "text"}. The text comes from the job hash's `result` field (the result line `llmq
// results` exports); a result over the worker's redis.result_max_bytes is in SQLite only (the
// field then holds {"truncated": true, ...}) and is read with --db, with node:sqlite (Node >= 22.5)
// or else the sqlite3 shell. Exit status 0 when the job completed, 1 when it failed or was
// cancelled, 2 on a timeout or a usage error.
//
// How it waits (docs/QUEUE.md): remember the newest entry of the events stream llmq:events, push
// the job, then XREAD from that entry on; an entry with the job's id and a final status ends the
// wait. The job hash is read after every empty XREAD too, so a trimmed stream cannot make it hang.
"use strict";
const { randomUUID } = require("node:crypto");
const { execFileSync } = require("node:child_process");
const fs = require("node:fs");

const FINAL = new Set(["completed", "failed", "cancelled"]);

const USAGE =
  "usage: node enqueue_wait.js [--redis URL] [--prefix P] [--queue short|long] " +
  "(--prompt TEXT | --template NAME [--var NAME=TEXT|NAME=@FILE]...) [--max-tokens N] " +
  "[--temperature T] [--id ID] [--db PATH] [--timeout S]\n" +
  "  --timeout S: seconds to wait (default 300); exit 0 completed, 1 failed or cancelled, 2 timeout or usage";

function usage(msg) {
  console.error(`enqueue_wait.js: ${msg}`);
  console.error(USAGE);
  process.exit(2);
}

function parseArgs(argv) {
  const a = { redis: "redis://127.0.0.1:6379/0", prefix: "llmq", queue: "short", vars: {},
              maxTokens: 64, temperature: 0, timeout: 300 };
  for (let i = 0; i < argv.length; i++) {
    const opt = argv[i];
    const val = () => (i + 1 < argv.length ? argv[++i] : usage(`${opt} needs a value`));
    switch (opt) {
      case "-h": case "--help": console.log(USAGE); process.exit(0);
      case "--redis": a.redis = val(); break;
      case "--prefix": a.prefix = val(); break;
      case "--queue": a.queue = val(); break;
      case "--prompt": a.prompt = val(); break;
      case "--template": a.template = val(); break;
      case "--var": {
        const v = val(), eq = v.indexOf("=");
        if (eq <= 0) usage(`--var ${v}: expected NAME=TEXT or NAME=@FILE`);
        const text = v.slice(eq + 1);
        a.vars[v.slice(0, eq)] = text.startsWith("@") ? fs.readFileSync(text.slice(1), "utf8") : text;
        break;
      }
      case "--max-tokens": a.maxTokens = Number.parseInt(val(), 10); break;
      case "--temperature": a.temperature = Number(val()); break;
      case "--id": a.id = val(); break;
      case "--db": a.db = val(); break;
      case "--timeout": a.timeout = Number(val()); break;
      default: usage(`unknown option ${opt}`);
    }
  }
  if ((a.prompt === undefined) === (a.template === undefined)) usage("give --prompt or --template");
  if (!["short", "long"].includes(a.queue)) usage("--queue: short or long");
  return a;
}

// The row's output and error from SQLite, or null when it cannot be read.
function readRow(db, id) {
  try {
    const { DatabaseSync } = require("node:sqlite"); // Node >= 22.5
    const conn = new DatabaseSync(db, { readOnly: true });
    const row = conn.prepare("SELECT output, error FROM jobs WHERE id = ?").get(id);
    conn.close();
    return row || null;
  } catch (e) {
    if (e.code !== "ERR_UNKNOWN_BUILTIN_MODULE" && e.code !== "MODULE_NOT_FOUND") throw e;
  }
  const q = `SELECT output, error FROM jobs WHERE id = '${id.replace(/'/g, "''")}'`;
  const out = execFileSync("sqlite3", ["-readonly", "-json", db, q], { encoding: "utf8" });
  const rows = out.trim() ? JSON.parse(out) : [];
  return rows[0] || null;
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const id = a.id || randomUUID();
  const job = { id, max_tokens: a.maxTokens, temperature: a.temperature };
  if (a.prompt !== undefined) job.prompt = a.prompt;
  else Object.assign(job, { template: a.template, vars: a.vars });
  const events = `${a.prefix}:events`, hkey = `${a.prefix}:job:${id}`;

  const { createClient } = require("redis"); // after the arguments, so --help works without it
  const r = createClient({ url: a.redis });
  r.on("error", (e) => console.error("redis:", e.message));
  await r.connect();
  try {
    const newest = await r.xRevRange(events, "+", "-", { COUNT: 1 });
    let last = newest.length ? newest[0].id : "0-0";
    await r.multi()
      .hSet(hkey, { status: "queued", queue: a.queue, created_at: (Date.now() / 1000).toFixed(3), attempts: "0" })
      .lPush(`${a.prefix}:queue:${a.queue}`, JSON.stringify(job))
      .exec();

    const deadline = Date.now() + a.timeout * 1000;
    let status = null;
    while (!FINAL.has(status)) {
      if (Date.now() > deadline) {
        console.log(JSON.stringify({ id, status: "timeout" }));
        return 2;
      }
      const res = await r.xRead({ key: events, id: last }, { BLOCK: 1000, COUNT: 1000 });
      for (const stream of res || []) {
        for (const { id: entryId, message } of stream.messages) {
          last = entryId;
          if (message.id === id && FINAL.has(message.status)) status = message.status;
        }
      }
      if (!status) {
        const s = await r.hGet(hkey, "status");
        if (FINAL.has(s)) status = s;
      }
    }
    const h = await r.hGetAll(hkey);
    const out = { id, status: h.status || status, finish_reason: h.finish_reason ?? null,
                  prompt_tokens: Number(h.prompt_tokens || 0), completion_tokens: Number(h.completion_tokens || 0),
                  error: h.error ?? null, text: null };
    const result = h.result ? JSON.parse(h.result) : { truncated: true };
    if (!result.truncated) {
      out.text = result.text ?? null; // llmq's result object
    } else if (a.db) {
      const row = readRow(a.db, id);
      if (row) {
        out.text = row.output;
        out.error = row.error || out.error;
      }
    }
    console.log(JSON.stringify(out));
    return out.status === "completed" ? 0 : 1;
  } finally {
    await r.quit();
  }
}

main().then(
  (code) => process.exit(code),
  (e) => {
    console.error(`enqueue_wait.js: ${e.message}`);
    process.exit(2);
  }
);
