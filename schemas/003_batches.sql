-- llmq results database, schema version 3: batches, and what a pipeline needs to trust a row:
-- the batch it came in, the request as the worker received it, and the error's code. Views answer
-- the common questions (per batch, failures, per model per day). Times stay Unix seconds as REAL
-- in the tables; the views add ISO 8601 columns (UTC, "2025-06-01T22:14:03.120Z").

-- One row per batch (`llmq enqueue` makes one per call; docs/QUEUE.md "Batches"). A worker
-- inserts it from the batch's Redis hash the first time it writes a row of one of its jobs
-- (later rows only fill in columns still NULL), and the worker whose step made the batch's last
-- job final sets state, finished_at and total. With one database per worker, each holds the batches it ran jobs of.
CREATE TABLE batches (
    id          TEXT    NOT NULL PRIMARY KEY,        -- the batch id (--batch NAME, or batch_<32 hex digits>)
    input       TEXT,                                -- the input file name as given to llmq enqueue
    created_at  REAL,                                -- when llmq enqueue created it
    total       INTEGER CHECK (total IS NULL OR total >= 0),  -- its jobs, as last seen by this worker
    state       TEXT    CHECK (state IS NULL OR state IN ('queued', 'running', 'completed', 'cancelled')),
    finished_at REAL                                 -- when its last job became final (NULL until then)
) STRICT;

ALTER TABLE jobs ADD COLUMN batch_id TEXT;   -- the job's "batch_id" (batches.id); NULL = no batch
ALTER TABLE jobs ADD COLUMN request TEXT;    -- the job exactly as the worker received it (JSON, or the text that was not)
ALTER TABLE jobs ADD COLUMN error_code TEXT; -- NULL when completed; else invalid_request, context_length_exceeded, ...

-- "the jobs of batch X", "what failed in batch X"
CREATE INDEX jobs_batch ON jobs (batch_id, status) WHERE batch_id IS NOT NULL;

-- Per batch: its row (when this database has one), counts by status, tokens, the first and last
-- finished_at, and nearest-rank p50/p95 of latency_ms over its completed jobs.
CREATE VIEW batch_summary AS
WITH agg AS (
    SELECT batch_id, count(*) AS jobs,
           sum(status = 'completed') AS completed, sum(status = 'failed') AS failed,
           sum(status = 'cancelled') AS cancelled,
           sum(prompt_tokens) AS prompt_tokens, sum(completion_tokens) AS completion_tokens,
           min(finished_at) AS first_finished_at, max(finished_at) AS last_finished_at
    FROM jobs
    WHERE batch_id IS NOT NULL
    GROUP BY batch_id
), ranked AS (
    SELECT batch_id, latency_ms,
           row_number() OVER (PARTITION BY batch_id ORDER BY latency_ms) AS rn,
           count(*) OVER (PARTITION BY batch_id) AS n
    FROM jobs
    WHERE batch_id IS NOT NULL AND status = 'completed' AND latency_ms IS NOT NULL
), pct AS (
    SELECT batch_id,
           min(latency_ms) FILTER (WHERE rn >= 0.50 * n) AS latency_p50_ms,
           min(latency_ms) FILTER (WHERE rn >= 0.95 * n) AS latency_p95_ms
    FROM ranked
    GROUP BY batch_id
)
SELECT a.batch_id, b.input, b.state, b.total, a.jobs, a.completed, a.failed, a.cancelled,
       a.prompt_tokens, a.completion_tokens, p.latency_p50_ms, p.latency_p95_ms,
       b.created_at, a.first_finished_at, a.last_finished_at, b.finished_at,
       strftime('%Y-%m-%dT%H:%M:%fZ', b.created_at, 'unixepoch') AS created_at_iso,
       strftime('%Y-%m-%dT%H:%M:%fZ', a.first_finished_at, 'unixepoch') AS first_finished_at_iso,
       strftime('%Y-%m-%dT%H:%M:%fZ', a.last_finished_at, 'unixepoch') AS last_finished_at_iso,
       strftime('%Y-%m-%dT%H:%M:%fZ', b.finished_at, 'unixepoch') AS finished_at_iso
FROM agg AS a
LEFT JOIN batches AS b ON b.id = a.batch_id
LEFT JOIN pct AS p ON p.batch_id = a.batch_id;

-- Failed and cancelled jobs with their code, message, batch and attempts, and the request to run
-- them again.
CREATE VIEW job_failures AS
SELECT id, batch_id, custom_id, status, error_code, error, attempts, queue, model, worker_id,
       finished_at, strftime('%Y-%m-%dT%H:%M:%fZ', finished_at, 'unixepoch') AS finished_at_iso,
       request
FROM jobs
WHERE status IN ('failed', 'cancelled');

-- Per model per day (UTC, by finished_at): jobs, tokens, failures.
CREATE VIEW daily_model_usage AS
SELECT strftime('%Y-%m-%d', finished_at, 'unixepoch') AS day, model,
       count(*) AS jobs, sum(status = 'completed') AS completed, sum(status = 'failed') AS failed,
       sum(status = 'cancelled') AS cancelled,
       sum(prompt_tokens) AS prompt_tokens, sum(completion_tokens) AS completion_tokens
FROM jobs
GROUP BY day, model;
