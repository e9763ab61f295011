-- Which job waits for which: one row per dependency edge.
CREATE TABLE conveyor_dependencies (
    job_id         text NOT NULL,
    depends_on_id  text NOT NULL,
    PRIMARY KEY (job_id, depends_on_id)
);

-- Finding the dependents of a job that just finished.
CREATE INDEX conveyor_dependencies_upstream ON conveyor_dependencies (depends_on_id);
