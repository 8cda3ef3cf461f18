-- llmq results database, schema version 5: the parsed answer of structured-output jobs
-- (docs/RESULTS.md "Structured output"), queryable with json_extract(output_json, '$.title').

ALTER TABLE jobs ADD COLUMN output_json TEXT CHECK (output_json IS NULL OR json_valid(output_json));
                                                   -- json_schema / json_object jobs: the answer as minified JSON;
                                                   -- NULL = no such constraint, or the JSON is incomplete (cut by max_tokens)
