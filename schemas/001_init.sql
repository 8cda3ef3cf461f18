-- llmq results database, schema version 1.
--
-- Migrations: schemas/NNN_<name>.sql, applied in order by worker/store/db.c, each in its own
-- transaction that also sets PRAGMA user_version = NNN. A file, once released, is never edited;
-- a change is a new file. docs/SQLITE.md describes every table and column for users.
--
-- Times are Unix seconds as REAL (fractions of a second kept); durations are milliseconds as REAL.
-- JSON columns hold JSON text (queryable with json_extract) and are checked with json_valid.

-- One row per job, written once the job has finished (completed, failed or cancelled). Delivery
-- is at-least-once, so the same id may be written again after a replay; worker/store/db.c's upsert
-- keeps exactly one row (see db.h for which write wins).
CREATE TABLE jobs (
    id                TEXT    NOT NULL PRIMARY KEY,  -- llmq job id (the job's "id", or assigned at enqueue)
    custom_id         TEXT,                          -- OpenAI batch "custom_id"; NULL for llmq's own form
    queue             TEXT,                          -- 'short' | 'long'; NULL for offline `llmq run`
    status            TEXT    NOT NULL CHECK (status IN ('completed', 'failed', 'cancelled')),
    model             TEXT,                          -- model folder or name that served the job
    params            TEXT    CHECK (params IS NULL OR json_valid(params)),     -- effective sampling parameters (JSON object)
    output            TEXT,                          -- the generated text (what was generated so far when cancelled)
    finish_reason     TEXT,                          -- 'stop' | 'length' | 'cancelled' | 'error'
    prompt_tokens     INTEGER NOT NULL DEFAULT 0 CHECK (prompt_tokens >= 0),
    completion_tokens INTEGER NOT NULL DEFAULT 0 CHECK (completion_tokens >= 0),
    error             TEXT,                          -- failed: why
    attempts          INTEGER NOT NULL DEFAULT 1 CHECK (attempts >= 0),  -- deliveries of this job so far
    worker_id         TEXT,                          -- worker that wrote the row (not a foreign key: `llmq run` has none)
    created_at        REAL,                          -- enqueued
    started_at        REAL,                          -- taken from the queue by a worker (arrival at its engine)
    first_token_at    REAL,                          -- first generated token
    finished_at       REAL    NOT NULL,              -- finished (completed, failed or cancelled)
    ttft_ms           REAL,                          -- time to first token: started_at .. first_token_at
    latency_ms        REAL,                          -- end to end, started_at .. finished_at
    queue_ms          REAL,                          -- waiting in Redis, created_at .. started_at
    metadata          TEXT    CHECK (metadata IS NULL OR json_valid(metadata)), -- the job's "metadata", as given
    result            TEXT    CHECK (result IS NULL OR json_valid(result)),     -- the result line exactly as exported
    request_form      TEXT    NOT NULL DEFAULT 'llmq' CHECK (request_form IN ('llmq', 'openai'))
) STRICT;

-- "failed jobs since T", "completed per hour": status first, then time. Also serves status alone.
CREATE INDEX jobs_status_finished ON jobs (status, finished_at);
-- time ranges over all statuses (exports with --since, throughput charts)
CREATE INDEX jobs_finished ON jobs (finished_at);
-- OpenAI batch lookups by custom_id; llmq-form rows (custom_id NULL) are left out of the index
CREATE INDEX jobs_custom_id ON jobs (custom_id) WHERE custom_id IS NOT NULL;

-- One row per worker id; a worker that restarts under the same id overwrites its row.
CREATE TABLE workers (
    id           TEXT    NOT NULL PRIMARY KEY,
    host         TEXT,
    pid          INTEGER,
    gpu          TEXT,                               -- device name, NULL on the CPU backend
    model        TEXT,
    backend      TEXT,                               -- 'cpu' | 'cuda'
    started_at   REAL    NOT NULL,
    last_seen_at REAL    NOT NULL,
    stopped_at   REAL,                               -- NULL while running (or after a crash)
    jobs_done    INTEGER NOT NULL DEFAULT 0 CHECK (jobs_done >= 0),  -- since started_at
    version      TEXT                                -- llmq version
) STRICT;

-- One row per worker per metrics interval (metrics.interval_s). Counts and rates cover the
-- interval that ends at ts; gauges (running, waiting, kv_usage, gpu_mem_bytes) are sampled at ts.
-- Percentiles are NULL when the interval had no samples.
CREATE TABLE worker_metrics (
    worker_id               TEXT    NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    ts                      REAL    NOT NULL,        -- end of the interval
    interval_s              REAL    NOT NULL CHECK (interval_s >= 0),
    jobs_done               INTEGER NOT NULL DEFAULT 0 CHECK (jobs_done >= 0),    -- finished in the interval (any status)
    jobs_failed             INTEGER NOT NULL DEFAULT 0 CHECK (jobs_failed >= 0),  -- of which failed
    prompt_tokens_per_s     REAL,
    generation_tokens_per_s REAL,
    ttft_p50_ms             REAL,
    ttft_p95_ms             REAL,
    itl_p50_ms              REAL,                    -- inter-token latency
    itl_p95_ms              REAL,
    e2e_p50_ms              REAL,                    -- end-to-end latency
    e2e_p95_ms              REAL,
    running                 INTEGER NOT NULL DEFAULT 0,  -- sequences in the running batch
    waiting                 INTEGER NOT NULL DEFAULT 0,  -- sequences admitted but waiting
    kv_usage                REAL,                    -- used / total KV cache blocks, 0..1
    prefix_cache_hit_rate   REAL,                    -- prefix cache hits / queries in the interval, 0..1
    preemptions             INTEGER NOT NULL DEFAULT 0,  -- in the interval
    gpu_mem_bytes           INTEGER,                 -- GPU memory in use; NULL on the CPU backend
    PRIMARY KEY (worker_id, ts)
) STRICT, WITHOUT ROWID;

-- charts over all workers by time
CREATE INDEX worker_metrics_ts ON worker_metrics (ts);
