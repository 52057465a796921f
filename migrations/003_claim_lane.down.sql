CREATE INDEX {{.Name "claim_idx"}} ON {{.Outbox}} (available_at, seq) WHERE status = 'pending';
DROP INDEX {{.Index "claim_lane_idx"}};
