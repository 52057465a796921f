package pgstore

import (
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay/internal/queue"
)

// laneSQL is an event's lane: its key's hash, or its id's when it has no key.
// It is the claim index's last column (migration 003), written exactly as
// there so that the planner matches it.
const laneSQL = `(hashtext(coalesce(key, id::text)) & 63)`

// statements are every SQL statement the relay engine runs on PostgreSQL,
// built once from the quoted table names; pgx prepares and caches them per
// connection. Whatever a statement needs of the relay (its owner name, its
// configuration) is a parameter: no SQL is built from anything but quoted
// table names.
type statements struct {
	planSQL, claimSQL, claimQueueSQL string
	// removals[keepDone][skipLocked] remove (or mark done) a batch's
	// outbox rows.
	removals                                             [2][2]removal
	leftSQL, rerouteSQL                                  string
	deleteDeliveriesSQL, demoteSQL, promoteSQL, headsSQL string
	heartbeatSQL, liveSQL, ownerLiveSQL, renewSQL        string
	releaseSQL, acquireSQL, releaseAllSQL, unregisterSQL string
	cleanRelaysSQL, sinksPresentSQL, unroutedSQL         string
	purgeDoneSQL                                         string
	statsSQL, statsCleanSQL                              string
	tableSizesSQL                                        string
}

// removal holds the statements that record a batch's outbox rows: see
// newStatements. keyed: fanOut takes the rows' keys as $10.
type removal struct {
	happy, fanOut string
	keyed         bool
}

// eventColumns are the columns an event is read with, from the outbox or
// from a delivery; deliveryColumns lists them for an INSERT into the
// deliveries table.
const (
	eventColumns    = `seq, id, topic, key, payload, payload_bin, content_type, headers, created_at, max_attempts`
	deliveryColumns = `sink, seq, lane, id, topic, key, payload, payload_bin, content_type, headers, created_at,
    max_attempts, state, stops_key, attempts, next_at, last_error, dead_at`
)

// A claim loads payloads up to a budget of bytes ($7) and none past
// relay.max_event_bytes ($6): loadedSize is what a row's payload costs the
// budget, and payloadsUpTo its payload columns, NULL when too large (the
// relay dead-letters the event, saying why, from its payload_bytes).
func loadedSize(alias string) string {
	return `CASE WHEN ` + alias + `.payload_bytes <= $6 THEN ` + alias + `.payload_bytes ELSE 0 END`
}

func payloadsUpTo(alias string) string {
	return `CASE WHEN ` + alias + `.payload_bytes <= $6 THEN ` + alias + `.payload END, ` +
		`CASE WHEN ` + alias + `.payload_bytes <= $6 THEN ` + alias + `.payload_bin END`
}

func newStatements(t migrations.Tables) statements {
	o, dl, l, r, st := t.Outbox(), t.Deliveries(), t.Lanes(), t.Relays(), t.Stats()
	// Writes are fenced by lane: a relay writes only rows of lanes it still
	// holds. The lanes are locked in share mode (in lane order, as the
	// dead-letter operations lock them), so a relay taking one over waits
	// for the record in flight, and a record after the takeover leaves the
	// lane's events to their new owner. $1 is always the owner.
	mine := `ARRAY(SELECT lane FROM ` + l + ` WHERE owner = $1 ORDER BY lane FOR SHARE)`
	// newest is the configuration that most recently became live among the
	// live relays; only relays running it claim. A claim tests it in the
	// same snapshot as it reads events: once a relay with a new
	// configuration has announced itself, no other claims an event.
	newest := `(SELECT config FROM ` + r + ` WHERE heartbeat_until > now() ORDER BY config_since DESC, config LIMIT 1)`
	current := `$8::text = coalesce(` + newest + `, $8::text)`
	ownLane := laneSQL + ` = ANY(` + mine + `)`
	ownDelivery := `d.lane = ANY(` + mine + `)`
	// A delivery inserted as the head of its key's queue (ready, or dead
	// and stopping the key) waits instead when the queue already has a
	// head: one appeared after the claim (an operator replayed a dead
	// letter of the key). The relay decides heads from what it claimed;
	// the database has the last word, and the unique head index stays
	// satisfied.
	headTaken := func(key, sink string) string {
		return `(u.state = 'ready' OR u.stops) AND ` + key + ` IS NOT NULL AND EXISTS (
        SELECT 1 FROM ` + dl + ` hd
        WHERE hd.key = ` + key + ` AND hd.sink = ` + sink + ` AND (hd.state = 'ready' OR hd.stops_key) AND hd.seq <> u.seq)`
	}
	// outcomes is the unnest of a batch's per-delivery outcomes: $2 to $8.
	const outcomes = `unnest($2::bigint[], $3::text[], $4::text[], $5::boolean[], $6::int[], $7::timestamptz[], $8::text[])
        AS u(seq, sink, state, stops, attempts, next_at, last_error)`
	// insertFrom inserts one delivery per outcome row, copying the event
	// from the row src finds for u.seq (an outbox row, or a routing-step
	// delivery), when where holds.
	insertFrom := func(src, where string) string {
		return `INSERT INTO ` + dl + ` (` + deliveryColumns + `)
SELECT v.sink, v.seq, v.lane, v.id, v.topic, v.key, v.payload, v.payload_bin, v.content_type, v.headers,
       v.created_at, v.max_attempts, v.state, v.state = 'dead' AND v.stops, v.attempts,
       CASE WHEN v.state = 'ready' THEN coalesce(v.next_at, now()) END, v.last_error,
       CASE WHEN v.state = 'dead' THEN now() END
FROM (
    SELECT u.sink, s.seq, s.lane, s.id, s.topic, s.key, s.payload, s.payload_bin, s.content_type, s.headers,
           s.created_at, s.max_attempts, u.stops, u.attempts, u.next_at, u.last_error,
           CASE WHEN ` + headTaken("s.key", "u.sink") + ` THEN 'waiting' ELSE u.state END AS state
    FROM ` + outcomes + `
    CROSS JOIN LATERAL (` + src + `) s
    WHERE ` + where + `
    OFFSET 0
) v`
	}
	// The record of a batch's outbox rows: they go (deleted, or with
	// keepDone marked done). The happy path's statement removes the rows
	// in $2; fanOut removes those in $9 (their keys in $10) and inserts the
	// deliveries of their outcomes, returning how many rows went. A row
	// another transaction holds locked (an operator's UPDATE left open) is
	// waited for, at most lock_timeout; then the same record is made with
	// skipLocked, which leaves that row in place (the relay claims and
	// sends it again later: leftSQL) and, in fanOut, every row of its key
	// too: events of its key recorded now would go before it on the sinks
	// where it failed.
	removalOf := func(keepDone, skipLocked bool) removal {
		remove := `DELETE FROM ` + o
		if keepDone {
			remove = `UPDATE ` + o + ` SET status = 'done', finished_at = now()`
		}
		fromOutbox := `SELECT ` + eventColumns + `, ` + laneSQL + ` AS lane FROM ` + o + ` WHERE seq = u.seq`
		if !skipLocked {
			// The insert copies the rows the removal finds: those of
			// this relay's lanes (held until commit, so both read the
			// same). A row another transaction removed meanwhile is
			// copied all the same; its deliveries are still owed.
			insert := insertFrom(fromOutbox+` AND `+ownLane, "true")
			return removal{
				happy: remove + ` WHERE seq = ANY($2) AND ` + ownLane,
				fanOut: `WITH src AS (
    ` + remove + ` WHERE seq = ANY($9) AND ` + ownLane + `
    RETURNING seq
), ins AS (
` + insert + `
)
SELECT count(*) FROM src`,
			}
		}
		// Only the rows removed get deliveries. The array is read once; a
		// join with src would be a nested loop over both (hash joins are
		// off: planSQL).
		insert := insertFrom(fromOutbox, `u.seq = ANY(ARRAY(SELECT seq FROM src))`)
		return removal{
			happy: remove + ` WHERE seq = ANY($2) AND seq = ANY(ARRAY(
    SELECT seq FROM ` + o + ` WHERE seq = ANY($2) AND ` + ownLane + ` FOR UPDATE SKIP LOCKED))`,
			fanOut: `WITH locked AS (
    SELECT seq, key FROM ` + o + ` WHERE seq = ANY($9) AND ` + ownLane + ` FOR UPDATE SKIP LOCKED
), held AS (
    SELECT b.key FROM unnest($9::bigint[], $10::text[]) AS b(seq, key)
    WHERE b.key IS NOT NULL AND b.seq NOT IN (SELECT seq FROM locked)
), src AS (
    ` + remove + ` WHERE seq = ANY($9) AND seq = ANY(ARRAY(
        SELECT seq FROM locked WHERE key IS NULL OR key NOT IN (SELECT key FROM held)))
    RETURNING seq
), ins AS (
` + insert + `
)
SELECT count(*) FROM src`,
			keyed: true,
		}
	}
	return statements{
		// Claims and records run after planSQL, in the same (implicit)
		// transaction: no sequential scan, hash or merge join. Each of their
		// statements reads a batch's rows through an index, and PostgreSQL
		// keeps a statement's generic plan, made for the tables' sizes when
		// it was first run, for as long as the connection lives or the table
		// is not analyzed: a plan made while the deliveries table was empty
		// (and analyzed so) would read the whole table for every claimed
		// row once it grew (TestStatementsKeepToTheIndexesAsTablesGrow).
		// A record waits at most lock_timeout for a lock (see removal); a
		// claim takes none. No JIT compilation: a sequential scan's
		// disabled cost would make every statement reading a table
		// without a usable index look worth compiling (ConfigurePool).
		planSQL: `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),
       set_config('enable_mergejoin', 'off', true), set_config('jit', 'off', true), set_config('lock_timeout', '1s', true)`,
		// The claim: the oldest due rows of this relay's lanes, read
		// without locking them, payloads up to $7 bytes in all (an event
		// larger than that alone) and none larger than $6 (loadedSize),
		// provided this relay runs the newest configuration ($8: see
		// newest). Only the owner of a lane claims its events,
		// one batch at a time, and a relay taking over an expired lane
		// waits until its previous owner's batches are over
		// (the engine's quarantine of lanes taken over): the lanes are the lease, and a row lock
		// would add nothing but a write per row. Nor can a row locked by
		// another transaction (an operator's UPDATE) be skipped and
		// overtaken by the next event of its key, as FOR UPDATE SKIP
		// LOCKED would: the claim reads it like any other. $5 lists rows
		// this relay published but could not remove because another
		// transaction held them (see leftSQL); they wait a while.
		//
		// Each row comes with the sinks on which its key has a queue (a
		// head): the event joins those queues instead of being published
		// there. Heads exist only for keys with a failure in flight, so the
		// lookup, one probe of the head index per row, runs only for rows
		// of lanes that have any head: the claim first lists those lanes,
		// one probe of head_lane_idx per lane (a loose index scan), so that
		// one key's queue costs the other keys nothing but in its own lane.
		//
		// The lane range ($3..$4, the lowest and highest lane held) matches
		// the claim index's last column, so rows of other relays' lanes are
		// skipped on the index entry without a heap fetch, and the walk
		// stays in (available_at, seq) order (PostgreSQL 15 would give that
		// order up for "lane = ANY(...)"). The exact lane test is written
		// "<> 0" (estimated as passing most rows, so the planner keeps that
		// walk instead of sorting the pending set).
		claimSQL: `WITH RECURSIVE queued(lane) AS (
    (SELECT d.lane FROM ` + dl + ` d WHERE d.key IS NOT NULL AND ` + queue.Head + ` ORDER BY d.lane LIMIT 1)
    UNION ALL
    SELECT (SELECT d.lane FROM ` + dl + ` d
            WHERE d.key IS NOT NULL AND ` + queue.Head + ` AND d.lane > q.lane ORDER BY d.lane LIMIT 1)
    FROM queued q WHERE q.lane IS NOT NULL
), claimed AS (
    SELECT ` + eventColumns + `, ` + laneSQL + ` AS lane, available_at, payload_bytes
    FROM ` + o + `
    WHERE status = 'pending' AND available_at <= now()
      AND ` + laneSQL + ` BETWEEN $3 AND $4
      AND (($1::bigint >> ` + laneSQL + `) & 1) <> 0
      AND seq <> ALL($5::bigint[])
      AND ` + current + `
    ORDER BY available_at, seq
    LIMIT $2
), sized AS (
    SELECT c.*, sum(` + loadedSize("c") + `) OVER (ORDER BY c.available_at, c.seq) AS upto
    FROM claimed c
)
SELECT c.seq, c.id, c.topic, c.key, ` + payloadsUpTo("c") + `, c.content_type, c.headers, c.created_at,
       c.max_attempts, c.lane,
       CASE WHEN c.key IS NOT NULL AND c.lane = ANY(ARRAY(SELECT lane FROM queued WHERE lane IS NOT NULL))
            THEN ARRAY(SELECT d.sink FROM ` + dl + ` d WHERE d.key = c.key AND ` + queue.Head + `) END,
       c.payload_bytes
FROM sized c
WHERE c.upto <= $7 OR c.upto = ` + loadedSize("c") + `
ORDER BY c.seq`,
		// The queue claim: per sink in $1 (those not paused, and '' for the
		// routing step), the due heads of this relay's lanes, oldest due
		// first, each followed by the deliveries waiting behind it in seq
		// order: at most as many heads as $5 gives the sink and $9 rows per
		// sink, and payloads up to the bytes in $7 over all sinks, in $1's
		// order (the claim of the outbox explains $6 and $8). Only heads
		// have a time; a
		// follower is claimed with its head, so a queue drains a batch at a
		// time rather than an event per round trip. A delivery of the
		// routing step comes with its key's queues, as a claimed outbox row
		// does, and with the sinks where the event already has a delivery
		// (it waits or died there; routing it again skips them).
		claimQueueSQL: `SELECT d.seq, d.id, d.topic, d.key, ` + payloadsUpTo("d") + `, d.content_type, d.headers,
       d.created_at, d.max_attempts, d.lane,
       CASE WHEN d.sink = '' AND d.key IS NOT NULL
            THEN ARRAY(SELECT x.sink FROM ` + dl + ` x WHERE x.key = d.key AND (x.state = 'ready' OR x.stops_key)) END,
       d.payload_bytes, d.sink, d.attempts, d.state = 'ready',
       CASE WHEN d.sink = '' THEN ARRAY(SELECT x.sink FROM ` + dl + ` x WHERE x.id = d.id AND x.sink <> '') END
FROM (
    SELECT q.*, sum(` + loadedSize("q") + `) OVER (ORDER BY q.sink_at, q.head_at, q.at) AS upto
    FROM (
        SELECT p.*, s.i AS sink_at
        FROM unnest($1::text[], $5::int[]) WITH ORDINALITY AS s(sink, heads, i)
        CROSS JOIN LATERAL (
            SELECT f.*, h.head_at FROM (
                SELECT h.key, h.seq, row_number() OVER (ORDER BY h.next_at) AS head_at FROM (
                    SELECT h.key, h.seq, h.next_at FROM ` + dl + ` h
                    WHERE h.sink = s.sink AND h.state = 'ready' AND h.next_at <= now()
                      AND h.lane BETWEEN $3 AND $4 AND (($2::bigint >> h.lane) & 1) <> 0
                      AND ` + current + `
                    ORDER BY h.next_at
                    LIMIT s.heads
                ) h
            ) h
            CROSS JOIN LATERAL (
                (SELECT d.*, 0::bigint AS at
                 FROM ` + dl + ` d WHERE d.sink = s.sink AND d.seq = h.seq)
                UNION ALL
                (SELECT d.*, d.seq AS at FROM ` + dl + ` d
                 WHERE h.key IS NOT NULL AND d.key = h.key AND d.sink = s.sink AND ` + queue.Member + `
                   AND d.state = 'waiting' AND d.seq > h.seq
                 ORDER BY d.seq LIMIT $9)
            ) f
            LIMIT $9
        ) p
    ) q
) d
WHERE d.upto <= $7 OR d.upto = ` + loadedSize("d") + `
ORDER BY d.sink_at, d.head_at, d.at`,
		removals: [2][2]removal{
			{removalOf(false, false), removalOf(false, true)},
			{removalOf(true, false), removalOf(true, true)},
		},
		// leftSQL finds which of a batch's rows are still pending after a
		// record removed fewer than it should have.
		leftSQL: `SELECT seq FROM ` + o + ` WHERE seq = ANY($1) AND status = 'pending'`,
		// Routed deliveries of the routing step fan out the same way, copied
		// from their own rows (which deleteDeliveriesSQL then removes).
		rerouteSQL: insertFrom(`SELECT * FROM `+dl+` d WHERE d.sink = '' AND d.seq = u.seq AND `+ownDelivery, "true") +
			` ON CONFLICT (sink, seq) DO NOTHING`,
		deleteDeliveriesSQL: `DELETE FROM ` + dl + ` d USING unnest($2::text[], $3::bigint[]) AS u(sink, seq)
WHERE d.sink = u.sink AND d.seq = u.seq AND ` + ownDelivery,
		// A claimed delivery's new state. Heads that leave (dead, or
		// ready→waiting) are written before new heads are made, so that the
		// unique head index never sees two at once: demoteSQL, then
		// headsSQL, each with the same parameters.
		demoteSQL: `UPDATE ` + dl + ` d
SET state = u.state, stops_key = u.state = 'dead' AND u.stops, attempts = u.attempts,
    next_at = CASE WHEN u.state = 'ready' THEN coalesce(u.next_at, now()) END,
    last_error = u.last_error, dead_at = CASE WHEN u.state = 'dead' THEN now() END
FROM ` + outcomes + `
WHERE d.sink = u.sink AND d.seq = u.seq AND ` + ownDelivery,
		headsSQL: `UPDATE ` + dl + ` d
SET state = CASE WHEN v.taken THEN 'waiting' ELSE v.state END,
    stops_key = v.state = 'dead' AND v.stops AND NOT v.taken,
    attempts = v.attempts,
    next_at = CASE WHEN v.state = 'ready' AND NOT v.taken THEN coalesce(v.next_at, now()) END,
    last_error = v.last_error,
    dead_at = CASE WHEN v.state = 'dead' AND NOT v.taken THEN now() END
FROM (
    SELECT u.*, ` + headTaken("x.key", "x.sink") + ` AS taken
    FROM ` + outcomes + `
    JOIN ` + dl + ` x ON x.sink = u.sink AND x.seq = u.seq
    OFFSET 0
) v
WHERE d.sink = v.sink AND d.seq = v.seq AND ` + ownDelivery,
		// The queues whose head left get the next delivery as head ($3 is
		// the owner here: the fence of the promoted row).
		promoteSQL: queue.PromoteSQL(t, `d.lane = ANY(ARRAY(SELECT lane FROM `+l+` WHERE owner = $3 ORDER BY lane FOR SHARE))`),
		// A relay's configuration has been live since the earliest time a
		// live relay announced it: a relay restarting into a configuration
		// others still run does not make it new again, while one bringing
		// back a configuration no live relay has (a rollback) does.
		heartbeatSQL: `INSERT INTO ` + r + ` AS x (owner, heartbeat_until, config, config_since, paused_sinks)
VALUES ($1, now() + $2::interval, $3,
        coalesce((SELECT min(config_since) FROM ` + r + `
                  WHERE config = $3 AND heartbeat_until > now() AND owner <> $1), now()),
        $4)
ON CONFLICT (owner) DO UPDATE SET heartbeat_until = excluded.heartbeat_until, paused_sinks = excluded.paused_sinks,
    config = excluded.config,
    config_since = CASE WHEN x.config = excluded.config AND x.heartbeat_until > now() THEN x.config_since
                        ELSE excluded.config_since END`,
		// The live relays with the newest configuration, how many of them
		// sort before this one (its rank picks its block of lanes), and
		// whether this relay is one of them.
		liveSQL: `SELECT count(*), count(*) FILTER (WHERE owner < $1), $2 = coalesce(` + newest + `, $2)
FROM ` + r + ` WHERE heartbeat_until > now() AND config = ` + newest,
		ownerLiveSQL: `SELECT heartbeat_until FROM ` + r + ` WHERE owner = $1 AND heartbeat_until > now()`,
		renewSQL:     `UPDATE ` + l + ` SET lease_until = now() + $2::interval WHERE owner = $1 RETURNING lane`,
		releaseSQL:   `UPDATE ` + l + ` SET owner = NULL, lease_until = NULL WHERE owner = $1 AND lane = ANY($2)`,
		// Acquired lanes say whether they were taken over from an owner
		// whose lease expired (it may have died with events leased).
		acquireSQL: `WITH free AS (
    SELECT lane, owner IS NOT NULL AS taken_over FROM ` + l + `
    WHERE lane BETWEEN $3 AND $4 AND (owner IS NULL OR lease_until < now())
    FOR UPDATE SKIP LOCKED
)
UPDATE ` + l + ` x SET owner = $1, lease_until = now() + $2::interval
FROM free WHERE x.lane = free.lane
RETURNING x.lane, free.taken_over`,
		releaseAllSQL:  `UPDATE ` + l + ` SET owner = NULL, lease_until = NULL WHERE owner = $1`,
		unregisterSQL:  `DELETE FROM ` + r + ` WHERE owner = $1`,
		cleanRelaysSQL: `DELETE FROM ` + r + ` WHERE heartbeat_until < now() - interval '1 minute'`,
		// The sinks that have deliveries, one index probe each (a loose
		// index scan of the primary key).
		sinksPresentSQL: `WITH RECURSIVE s(sink) AS (
    SELECT min(sink) FROM ` + dl + `
    UNION ALL
    SELECT (SELECT min(sink) FROM ` + dl + ` WHERE sink > s.sink) FROM s WHERE s.sink IS NOT NULL
)
SELECT sink FROM s WHERE sink IS NOT NULL`,
		// Deliveries waiting for a sink no route names any more are dead
		// letters, in bounded batches, on this relay's lanes. They never
		// stop their key: no later event of it goes to that sink.
		unroutedSQL: `UPDATE ` + dl + ` d
SET state = 'dead', stops_key = false, next_at = NULL, dead_at = now(),
    last_error = 'sink no longer routed: no route names sink ' || quote_literal(d.sink)
WHERE (d.sink, d.seq) IN (
    SELECT d.sink, d.seq FROM ` + dl + ` d
    WHERE d.sink = ANY($2) AND d.state <> 'dead' AND ` + ownDelivery + `
    LIMIT $3)`,
		purgeDoneSQL: `DELETE FROM ` + o + ` WHERE seq IN (
    SELECT seq FROM ` + o + ` WHERE status = 'done' AND finished_at < now() - $1::interval
    ORDER BY finished_at LIMIT $2)`,
		statsSQL: `INSERT INTO ` + st + ` AS s (minute, sink, topic, published)
SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::bigint[])
ON CONFLICT (minute, sink, topic) DO UPDATE SET published = s.published + excluded.published`,
		statsCleanSQL: `DELETE FROM ` + st + ` WHERE minute < now() - interval '1 day'`,
		// Per table in $1, in that order: its dead tuples, its size in
		// pages when last analyzed, and its size in pages now.
		tableSizesSQL: `SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = c.oid), 0),
       c.relpages::bigint, pg_relation_size(c.oid) / current_setting('block_size')::bigint
FROM unnest($1::text[]) WITH ORDINALITY AS t(name, i)
JOIN pg_class c ON c.oid = to_regclass(t.name)
ORDER BY t.i`,
	}
}
