-- llmq results database, schema version 6: the parts of map-reduce summary jobs (a "document" job
-- with "summarize"; docs/JOBS.md "Long documents"). Every partial summary is committed here before
-- the next level of the tree reads it, so a worker that dies in the middle of a document resumes
-- where it was: the next worker on this database file finds the parts of the same plan and does not
-- compute them again. The final summary is the job's row in `jobs`, not a part.

CREATE TABLE job_parts (
    job_id            TEXT    NOT NULL,               -- the job's id (jobs.id once it is finished)
    level             INTEGER NOT NULL CHECK (level >= 0),  -- 0: a chunk's summary; n: a summary of level n-1's parts
    part              INTEGER NOT NULL CHECK (part >= 0),   -- its place in its level, from 0, in document order
    plan              TEXT    NOT NULL,               -- the job's plan (a hash of the document, the options and the
                                                      -- templates); parts of another plan are never reused
    first             INTEGER NOT NULL,               -- level 0: the chunk's index; else the first part of the level below
    last              INTEGER NOT NULL,               -- ... and the last (inclusive)
    doc_start         INTEGER NOT NULL,               -- the bytes of the document the part covers: [doc_start, doc_end)
    doc_end           INTEGER NOT NULL,
    output            TEXT    NOT NULL,               -- the partial summary
    prompt_tokens     INTEGER NOT NULL CHECK (prompt_tokens >= 0),
    completion_tokens INTEGER NOT NULL CHECK (completion_tokens >= 0),
    finish_reason     TEXT,                           -- stop, length
    worker_id         TEXT,                           -- the worker that computed it
    created_at        REAL    NOT NULL,               -- when it was committed (Unix seconds)
    PRIMARY KEY (job_id, level, part)
) STRICT;
