-- A lane's epoch rises every time the lane is acquired, and never while one
-- owner keeps renewing it. Work a relay claims is recorded only while the
-- lane is still held under the epoch it was claimed under: a relay whose
-- lease ran out while it published, and which got the lane back later,
-- cannot record its stale outcome over what the lane's owner in between
-- did.
ALTER TABLE {{.Lanes}} ADD COLUMN epoch bigint NOT NULL DEFAULT 0;
