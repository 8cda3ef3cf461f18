-- llmq results database, schema version 2: worker_metrics carries every figure that GET /metrics
-- serves (docs/METRICS.md), so a user without Prometheus charts the same numbers with SQL.
--
-- Counts cover the interval that ends at ts, like jobs_done; depths are sampled from Redis at ts
-- (the whole cluster's queues, seen by this worker) and are NULL when Redis could not be read.
-- jobs_done and jobs_failed from 001 count jobs that finished for good: a failed attempt that
-- goes back to Redis for another try counts in jobs_retried instead.

ALTER TABLE worker_metrics ADD COLUMN jobs_cancelled INTEGER NOT NULL DEFAULT 0;       -- of jobs_done, cancelled
ALTER TABLE worker_metrics ADD COLUMN jobs_dead INTEGER NOT NULL DEFAULT 0;            -- dead-lettered by this worker
ALTER TABLE worker_metrics ADD COLUMN jobs_retried INTEGER NOT NULL DEFAULT 0;         -- failed attempts put back for a retry
ALTER TABLE worker_metrics ADD COLUMN prompt_tokens INTEGER NOT NULL DEFAULT 0;        -- prompt tokens of jobs added to the engine
ALTER TABLE worker_metrics ADD COLUMN generation_tokens INTEGER NOT NULL DEFAULT 0;    -- tokens generated
ALTER TABLE worker_metrics ADD COLUMN prefix_cache_queries INTEGER NOT NULL DEFAULT 0; -- tokens looked up in the prefix cache
ALTER TABLE worker_metrics ADD COLUMN prefix_cache_hits INTEGER NOT NULL DEFAULT 0;    -- of those, tokens found
ALTER TABLE worker_metrics ADD COLUMN queue_p50_ms REAL;                               -- time waiting in Redis (created .. fetched)
ALTER TABLE worker_metrics ADD COLUMN queue_p95_ms REAL;
ALTER TABLE worker_metrics ADD COLUMN queue_short INTEGER;                             -- LLEN of the short queue at ts
ALTER TABLE worker_metrics ADD COLUMN queue_long INTEGER;                              -- LLEN of the long queue at ts
ALTER TABLE worker_metrics ADD COLUMN retry_depth INTEGER;                             -- jobs in the retry set at ts
ALTER TABLE worker_metrics ADD COLUMN dead_depth INTEGER;                              -- jobs in the dead list at ts
