-- Every event now has a lane: its key's (hashtext(key) & 63) or, for an
-- event without a key, its id's. The claim index carries the lane as its last
-- column, so a relay's claim tests the lane range it holds on the index entry
-- itself and fetches from the heap only rows of its own lanes, while the scan
-- keeps (available_at, seq) order. With the lane tested on the heap row
-- instead, N relays each read N times the rows they kept.
--
-- CREATE INDEX (not CONCURRENTLY: migrations run in a transaction) blocks
-- inserts into the outbox while it builds; on a table holding a large
-- backlog, apply it when the backlog is small.
CREATE INDEX {{.Name "claim_lane_idx"}} ON {{.Outbox}}
    (available_at, seq, (hashtext(coalesce(key, id::text)) & 63))
    WHERE status = 'pending';
DROP INDEX {{.Index "claim_idx"}};
