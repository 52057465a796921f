-- The statements of the MySQL store that take row locks, as the foundation
-- measured them (the tests in this directory run them, see
-- claimlock_test.go). The store (relay/internal/mysqlstore, sql.go) runs
-- its own versions of these: the claim with byte budgets and queue
-- lookups, the fence over every lane the owner holds, the lane mask in
-- lock_rows; relay/internal/mysqlstore's TestInsertNeverWaitsOnTheRelay
-- checks them as this directory's tests check these. Each is a text/template
-- over the tables' quoted names, with ? parameters. Each statement starts
-- at a line "-- name: NAME" and runs to the next.
--
-- Every transaction of the relay runs at READ COMMITTED: at REPEATABLE READ
-- (InnoDB's default) a locking read or a DELETE that reaches the end of the
-- pending range, or finds a seq that is no longer there, locks the gap
-- after the last row, and an application's INSERT waits for the relay's
-- transaction to end (TestInsertWhileClaiming shows both).

-- name: claim
-- The claim: the due rows of the lanes first..last (bit-tested against the
-- mask), in (available_at, seq) order, on claim_idx without a filesort. A
-- plain read: holding the lanes is what reserves the rows, so it locks
-- nothing, at any isolation level.
SELECT seq, id, topic, `key`, lane, payload_bytes, content_type, headers, created_at, max_attempts
FROM {{.Outbox}}
WHERE status = 'pending' AND available_at <= utc_timestamp(6)
  AND lane BETWEEN ? AND ? AND (? >> lane) & 1 = 1
ORDER BY available_at, seq
LIMIT ?

-- name: lock_lanes
-- The record's fence: the lanes of the batch that owner still holds, share
-- locked until the record commits, so that a takeover (which updates the
-- lane rows) waits for it and a relay that lost a lane writes nothing in it.
-- LOCK IN SHARE MODE: MariaDB 10.11 has no FOR SHARE.
SELECT lane FROM {{.Lanes}}
WHERE lane BETWEEN ? AND ? AND owner = ? AND lease_until > utc_timestamp(6)
LOCK IN SHARE MODE

-- name: lock_rows
-- The batch's rows that no other transaction holds locked (an operator's
-- UPDATE left open): those are left in place and claimed again later, so a
-- record never waits on a lock it does not own. The caller writes one ?
-- per seq of the batch where the IN list holds the seqs marker.
SELECT seq FROM {{.Outbox}}
WHERE seq IN (/*seqs*/)
ORDER BY seq
FOR UPDATE SKIP LOCKED

-- name: delete_rows
-- The happy path's record: the batch's rows go, those of lanes the relay
-- no longer holds excepted. ORDER BY seq LIMIT keeps the primary key's
-- range plan: with IN (...) alone, on a table of a few thousand rows,
-- MariaDB scans the whole table and locks every row it reads, waiting on
-- the rows another relay's record holds (deadlocks, 1213, in two-worker
-- drains).
DELETE FROM {{.Outbox}}
WHERE seq IN (/*seqs*/) AND lane BETWEEN ? AND ? AND (? >> lane) & 1 = 1
ORDER BY seq
LIMIT ?

-- name: claim_locking
-- Not the store's claim: the locking claim of outbox relays without lanes
-- (FOR UPDATE SKIP LOCKED), which issue 18 measured. Kept because it is the
-- plainest statement that reaches the end of the pending range holding
-- locks: at REPEATABLE READ it locks the gap after the last row.
SELECT seq FROM {{.Outbox}}
WHERE status = 'pending' AND available_at <= utc_timestamp(6)
ORDER BY available_at, seq
LIMIT ?
FOR UPDATE SKIP LOCKED
