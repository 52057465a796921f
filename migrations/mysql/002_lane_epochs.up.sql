-- A lane's epoch rises every time the lane is acquired, and never while one
-- owner keeps renewing it (PostgreSQL's migration 009): work is recorded
-- only while its lane is still held under the epoch it was claimed under.
-- One statement (MySQL 8 has no ADD COLUMN IF NOT EXISTS): it either ran
-- and the version is recorded after it, or it did not.
ALTER TABLE {{.Lanes}} ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0;
