-- llmq results database, schema version 4: the reasoning of models that think (Qwen3, DeepSeek-R1),
-- apart from the answer in `output` (docs/RESULTS.md "Reasoning").

ALTER TABLE jobs ADD COLUMN reasoning TEXT;        -- the text inside the think block; NULL = the output had none
ALTER TABLE jobs ADD COLUMN reasoning_tokens INTEGER CHECK (reasoning_tokens IS NULL OR reasoning_tokens >= 0);
                                                   -- of completion_tokens, those of the think block (tags included)
