-- A schedule's overlap policy (allow: every tick fires; skip: a tick is skipped while the
-- run of the last fired tick is unfinished) and how many ticks it has skipped. The last
-- run is found by primary key (its id comes from the name and last_run_at): no index.
ALTER TABLE conveyor_schedules ADD COLUMN overlap TEXT NOT NULL DEFAULT 'allow';
ALTER TABLE conveyor_schedules ADD COLUMN skipped_ticks INTEGER NOT NULL DEFAULT 0;
