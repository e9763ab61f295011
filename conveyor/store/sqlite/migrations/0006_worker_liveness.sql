-- Each worker records its lease and heartbeat interval, so that health judges a worker by
-- its own settings: a worker is live while its newest heartbeat is younger than its lease
-- (older, every lease it held has expired and its jobs are being rescued). Workers
-- registered before this migration are judged by 60 s, the old fixed threshold.
ALTER TABLE conveyor_workers ADD COLUMN lease_seconds REAL NOT NULL DEFAULT 60;
ALTER TABLE conveyor_workers ADD COLUMN heartbeat_seconds REAL NOT NULL DEFAULT 20;
