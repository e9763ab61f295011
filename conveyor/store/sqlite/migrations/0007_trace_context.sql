-- The submitter's trace context (a W3C traceparent), so that a job's attempts appear in
-- the trace of the request that submitted it. NULL when the submitter was not traced.
ALTER TABLE conveyor_jobs ADD COLUMN trace_context TEXT;
