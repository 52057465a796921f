package pgstore

import (
	"strings"

	"github.com/heraldhq/herald/migrations"
)

// Predicates on a delivery row (alias d) that say where it stands in its
// key's queue on its sink. They are written exactly as in the partial
// indexes of migration 005 (queue_idx, head_idx, head_lane_idx), so that
// the planner matches them: TestQueuePredicatesUseTheirIndexes checks that
// the statements using them read those indexes.
const (
	// member: the delivery belongs to its key's queue (it waits or holds
	// the key). Rows without a key are never members.
	member = `(d.state <> 'dead' OR d.stops_key)`
	// head: the delivery is the head of its key's queue.
	head = `(d.state = 'ready' OR d.stops_key)`
)

// on returns the predicate p (member or head) on the alias a instead of d,
// for a statement that reads two rows of the table at once.
func on(p, a string) string { return strings.ReplaceAll(p, "d.", a+".") }

// queuesChanged is the payload of the NOTIFY that tells relays the queues
// changed under them (an operator replayed, purged or dropped deliveries):
// they look at their queues at once instead of at their next poll.
const queuesChanged = "deliveries"

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
	leftSQL, rerouteSQL, fenceSQL                        string
	deleteDeliveriesSQL, demoteSQL, promoteSQL, headsSQL string
	heartbeatSQL, liveSQL, ownerLiveSQL, renewSQL        string
	releaseSQL, acquireSQL, releaseAllSQL, unregisterSQL string
	cleanRelaysSQL, sinksPresentSQL, countWaitingSQL     string
	purgeDoneSQL                                         string
	queuedSinksSQL, fromEventsSQL                        string
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
	n := names{o: t.Outbox(), dl: t.Deliveries(), l: t.Lanes(), r: t.Relays(), st: t.Stats(), tables: t}
	var s statements
	n.claims(&s)
	n.records(&s)
	n.lanes(&s)
	n.upkeep(&s)
	n.wal(&s)
	return s
}

// names are the quoted table names the statements are built from.
type names struct {
	o, dl, l, r, st string
	tables          migrations.Tables
}

// mine is the lanes owner ($1) holds under the epochs in the parameter
// epochs (one per lane, -1 for a lane outside the fence), share-locked in
// lane order. Writes are fenced by it: a relay writes only rows of lanes
// it still holds under the epoch its work was claimed with. The dead-letter
// operations lock the lanes in the same order, so a relay taking one over
// waits for the record in flight, and a record after the takeover, or after
// the lane came back under a new epoch, leaves the lane's rows alone.
func (n names) mine(epochs string) string {
	return `ARRAY(SELECT lane FROM ` + n.l + ` WHERE owner = $1 AND epoch = (` + epochs + `::bigint[])[lane + 1] ORDER BY lane FOR SHARE)`
}

// ownLane and ownDelivery test that an outbox row (its computed lane) or a
// delivery (alias d) is in a lane of mine.
func (n names) ownLane(epochs string) string     { return laneSQL + ` = ANY(` + n.mine(epochs) + `)` }
func (n names) ownDelivery(epochs string) string { return `d.lane = ANY(` + n.mine(epochs) + `)` }

// newest is the configuration that most recently became live among the
// live relays; only relays running it claim.
func (n names) newest() string {
	return `(SELECT config FROM ` + n.r + ` WHERE heartbeat_until > now() ORDER BY config_since DESC, config LIMIT 1)`
}

// current is true when the relay's configuration ($8) is the newest. A
// claim tests it in the same snapshot as it reads events: once a relay
// with a new configuration has announced itself, no other claims an event.
func (n names) current() string {
	return `$8::text = coalesce(` + n.newest() + `, $8::text)`
}

// headTaken is true when a delivery about to be written as the head of its
// key's queue (ready, or dead and stopping the key) must wait instead: the
// queue has a head already, one that appeared after the claim (an operator
// replayed a dead letter of the key). The relay decides heads from what it
// claimed; the database has the last word, and the unique head index stays
// satisfied.
func (n names) headTaken(key, sink string) string {
	return `(u.state = 'ready' OR u.stops) AND ` + key + ` IS NOT NULL AND EXISTS (
        SELECT 1 FROM ` + n.dl + ` hd
        WHERE hd.key = ` + key + ` AND hd.sink = ` + sink + ` AND (hd.state = 'ready' OR hd.stops_key) AND hd.seq <> u.seq)`
}

// outcomes is the unnest of a batch's per-delivery outcomes: $2 to $8, a
// ready delivery due delay microseconds after the database's clock.
const outcomes = `unnest($2::bigint[], $3::text[], $4::text[], $5::boolean[], $6::int[], $7::bigint[], $8::text[])
        AS u(seq, sink, state, stops, attempts, delay, last_error)`

// dueAt is when an outcome row (alias v) is due.
const dueAt = `now() + v.delay * interval '1 microsecond'`

// insertFrom inserts one delivery per outcome row, copying the event from
// the row src finds for u.seq (an outbox row, or a routing-step delivery),
// when where holds.
func (n names) insertFrom(src, where string) string {
	return `INSERT INTO ` + n.dl + ` (` + deliveryColumns + `)
SELECT v.sink, v.seq, v.lane, v.id, v.topic, v.key, v.payload, v.payload_bin, v.content_type, v.headers,
       v.created_at, v.max_attempts, v.state, v.state = 'dead' AND v.stops, v.attempts,
       CASE WHEN v.state = 'ready' THEN ` + dueAt + ` END, v.last_error,
       CASE WHEN v.state = 'dead' THEN now() END
FROM (
    SELECT u.sink, s.seq, s.lane, s.id, s.topic, s.key, s.payload, s.payload_bin, s.content_type, s.headers,
           s.created_at, s.max_attempts, u.stops, u.attempts, u.delay, u.last_error,
           CASE WHEN ` + n.headTaken("s.key", "u.sink") + ` THEN 'waiting' ELSE u.state END AS state
    FROM ` + outcomes + `
    CROSS JOIN LATERAL (` + src + `) s
    WHERE ` + where + `
    OFFSET 0
) v`
}

// removal returns the statements that record a batch's outbox rows: they
// go (deleted, or with keepDone marked done). The happy path's statement
// removes the rows in $2 (the epochs in $3); fanOut removes those in $9
// (the epochs in $10, their keys in $11) and inserts the deliveries of
// their outcomes, returning how many rows went. A row another transaction
// holds locked (an operator's UPDATE left open) is waited for, at most
// lock_timeout; then the same record is made with skipLocked, which leaves
// that row in place (the relay claims and sends it again later: leftSQL)
// and, in fanOut, every row of its key too: events of its key recorded now
// would go before it on the sinks where it failed.
func (n names) removal(keepDone, skipLocked bool) removal {
	remove := `DELETE FROM ` + n.o
	if keepDone {
		remove = `UPDATE ` + n.o + ` SET status = 'done', finished_at = now()`
	}
	fromOutbox := `SELECT ` + eventColumns + `, ` + laneSQL + ` AS lane FROM ` + n.o + ` WHERE seq = u.seq`
	if !skipLocked {
		// The insert copies the rows the removal finds: those of this
		// relay's lanes (held until commit, so both read the same). A row
		// another transaction removed meanwhile is copied all the same;
		// its deliveries are still owed.
		insert := n.insertFrom(fromOutbox+` AND `+n.ownLane("$10"), "true")
		return removal{
			happy: remove + ` WHERE seq = ANY($2) AND ` + n.ownLane("$3"),
			fanOut: `WITH src AS (
    ` + remove + ` WHERE seq = ANY($9) AND ` + n.ownLane("$10") + `
    RETURNING seq
), ins AS (
` + insert + `
)
SELECT count(*) FROM src`,
		}
	}
	// Only the rows removed get deliveries. The array is read once; a join
	// with src would be a nested loop over both (hash joins are off:
	// planSQL).
	insert := n.insertFrom(fromOutbox, `u.seq = ANY(ARRAY(SELECT seq FROM src))`)
	return removal{
		happy: remove + ` WHERE seq = ANY($2) AND seq = ANY(ARRAY(
    SELECT seq FROM ` + n.o + ` WHERE seq = ANY($2) AND ` + n.ownLane("$3") + ` FOR UPDATE SKIP LOCKED))`,
		fanOut: `WITH locked AS (
    SELECT seq, key FROM ` + n.o + ` WHERE seq = ANY($9) AND ` + n.ownLane("$10") + ` FOR UPDATE SKIP LOCKED
), held AS (
    SELECT b.key FROM unnest($9::bigint[], $11::text[]) AS b(seq, key)
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

// promote returns the statement that gives every (key, sink) pair in $1
// (keys) and $2 (sinks) that has waiting deliveries but no head a head: its
// lowest waiting delivery, due at once. fence is an extra condition on the
// promoted row (alias d), such as a test of its lane ("true" for none).
//
// It runs after any change that can remove a head (a delivery sent,
// purged, dropped, dead-lettered without stopping its key, or routed on),
// in the same transaction, under the lanes' locks that serialise writers of
// those keys' queues: a relay's record under its own (fenced), an
// operator's batch under every lane's.
func (n names) promote(fence string) string {
	return `UPDATE ` + n.dl + ` d SET state = 'ready', next_at = now()
FROM (
    SELECT p.sink, (
        SELECT min(d.seq) FROM ` + n.dl + ` d
        WHERE d.key = p.key AND d.sink = p.sink AND ` + member + ` AND d.state = 'waiting'
    ) AS seq
    FROM unnest($1::text[], $2::text[]) AS p(key, sink)
    WHERE NOT EXISTS (
        SELECT 1 FROM ` + n.dl + ` d WHERE d.key = p.key AND d.sink = p.sink AND ` + head + `)
) n
WHERE d.sink = n.sink AND d.seq = n.seq AND ` + fence
}

// claims builds the claims: the outbox's and the queues'.
func (n names) claims(s *statements) {
	// Claims and records run after planSQL, in the same (implicit)
	// transaction: no sequential scan, bitmap scan, sort of a scan's
	// rows, hash or merge join. Each of their statements reads a
	// batch's rows through an index in the index's order, and the
	// statistics must not talk the planner out of it: a claim planned
	// from statistics taken mid-drain read every pending row of its
	// lanes through a bitmap and sorted them for the first thousand
	// (TestPlansIgnoreStatistics). The sorts that remain are of a
	// batch's rows, after its LIMIT. PostgreSQL
	// keeps a statement's generic plan, made for the tables' sizes when
	// it was first run, for as long as the connection lives or the table
	// is not analyzed: a plan made while the deliveries table was empty
	// (and analyzed so) would read the whole table for every claimed
	// row once it grew (TestStatementsKeepToTheIndexesAsTablesGrow).
	// A record waits at most lock_timeout for a lock (see removal); a
	// claim takes none. No JIT compilation: a sequential scan's
	// disabled cost would make every statement reading a table
	// without a usable index look worth compiling (ConfigurePool).
	s.planSQL = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('enable_sort', 'off', true), set_config('enable_hashjoin', 'off', true),
       set_config('enable_mergejoin', 'off', true), set_config('jit', 'off', true), set_config('lock_timeout', '1s', true)`

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
	// transaction held them (see leftSQL); they wait a while. ($9,
	// $10) is where the walk of the index starts (store.ClaimParams
	// After; -infinity and 0 for its beginning): the row comparison
	// is a condition on the index's leading columns.
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
	s.claimSQL = `WITH RECURSIVE queued(lane) AS (
    (SELECT d.lane FROM ` + n.dl + ` d WHERE d.key IS NOT NULL AND ` + head + ` ORDER BY d.lane LIMIT 1)
    UNION ALL
    SELECT (SELECT d.lane FROM ` + n.dl + ` d
            WHERE d.key IS NOT NULL AND ` + head + ` AND d.lane > q.lane ORDER BY d.lane LIMIT 1)
    FROM queued q WHERE q.lane IS NOT NULL
), claimed AS (
    SELECT ` + eventColumns + `, ` + laneSQL + ` AS lane, available_at, payload_bytes
    FROM ` + n.o + `
    WHERE status = 'pending' AND available_at <= now()
      AND ` + laneSQL + ` BETWEEN $3 AND $4
      AND (($1::bigint >> ` + laneSQL + `) & 1) <> 0
      AND seq <> ALL($5::bigint[])
      AND (available_at, seq) > ($9::timestamptz, $10::bigint)
      AND ` + n.current() + `
    ORDER BY available_at, seq
    LIMIT $2
), sized AS (
    SELECT c.*, sum(` + loadedSize("c") + `) OVER (ORDER BY c.available_at, c.seq) AS upto
    FROM claimed c
)
SELECT c.seq, c.id, c.topic, c.key, ` + payloadsUpTo("c") + `, c.content_type, c.headers, c.created_at,
       c.max_attempts, c.lane,
       CASE WHEN c.key IS NOT NULL AND c.lane = ANY(ARRAY(SELECT lane FROM queued WHERE lane IS NOT NULL))
            THEN ARRAY(SELECT d.sink FROM ` + n.dl + ` d WHERE d.key = c.key AND ` + head + `) END,
       c.payload_bytes, c.available_at
FROM sized c
WHERE c.upto <= $7 OR c.upto = ` + loadedSize("c") + `
ORDER BY c.seq`

	// The queue claim: per sink in $1 (those not paused, and '' for the
	// routing step), the due heads of this relay's lanes, oldest due
	// first, each followed by the deliveries waiting behind it in seq
	// order: at most as many heads as $5 gives the sink and as many
	// rows as $9 does, shared evenly between the heads found (each gets
	// ceil(rows / heads) rows, itself included, and at most the chain
	// $10 gives the sink), and payloads up to the
	// bytes in $7 over all sinks, in $1's order (the claim of the
	// outbox explains $6 and $8). Only heads have a time; a follower is
	// claimed with its head, so a queue drains a batch at a time rather
	// than an event per round trip, and over as many keys at once as it
	// has rather than one key's backlog at a time (a sink sends a key's
	// events one after another, so one key per batch would leave all
	// but one of its connections idle). A delivery of the
	// routing step comes with its key's queues, as a claimed outbox row
	// does, and with the sinks where the event already has a delivery
	// (it waits or died there; routing it again skips them).
	s.claimQueueSQL = `SELECT d.seq, d.id, d.topic, d.key, ` + payloadsUpTo("d") + `, d.content_type, d.headers,
       d.created_at, d.max_attempts, d.lane,
       CASE WHEN d.sink = '' AND d.key IS NOT NULL
            THEN ARRAY(SELECT x.sink FROM ` + n.dl + ` x WHERE x.key = d.key AND (x.state = 'ready' OR x.stops_key)) END,
       d.payload_bytes, d.sink, d.attempts, d.state = 'ready',
       CASE WHEN d.sink = '' THEN ARRAY(SELECT x.sink FROM ` + n.dl + ` x WHERE x.id = d.id AND x.sink <> '') END
FROM (
    SELECT q.*, sum(` + loadedSize("q") + `) OVER (ORDER BY q.sink_at, q.head_at, q.at) AS upto
    FROM (
        SELECT p.*, s.i AS sink_at
        FROM unnest($1::text[], $5::int[], $9::int[], $10::int[]) WITH ORDINALITY AS s(sink, heads, rows, chain, i)
        CROSS JOIN LATERAL (
            SELECT f.*, h.head_at FROM (
                SELECT h.key, h.seq, row_number() OVER (ORDER BY h.next_at) AS head_at, count(*) OVER () AS n FROM (
                    SELECT h.key, h.seq, h.next_at FROM ` + n.dl + ` h
                    WHERE h.sink = s.sink AND h.state = 'ready' AND h.next_at <= now()
                      AND h.lane BETWEEN $3 AND $4 AND (($2::bigint >> h.lane) & 1) <> 0
                      AND ` + n.current() + `
                    ORDER BY h.next_at
                    LIMIT s.heads
                ) h
            ) h
            CROSS JOIN LATERAL (
                (SELECT d.*, 0::bigint AS at
                 FROM ` + n.dl + ` d WHERE d.sink = s.sink AND d.seq = h.seq)
                UNION ALL
                (SELECT d.*, d.seq AS at FROM ` + n.dl + ` d
                 WHERE h.key IS NOT NULL AND d.key = h.key AND d.sink = s.sink AND ` + member + `
                   AND d.state = 'waiting' AND d.seq > h.seq
                 ORDER BY d.seq LIMIT least((s.rows + h.n - 1) / h.n, s.chain) - 1)
            ) f
            LIMIT s.rows
        ) p
    ) q
) d
WHERE d.upto <= $7 OR d.upto = ` + loadedSize("d") + `
ORDER BY d.sink_at, d.head_at, d.at`
}

// records builds the record of a batch's outcome, fenced by its leases.
func (n names) records(s *statements) {
	s.removals = [2][2]removal{
		{n.removal(false, false), n.removal(false, true)},
		{n.removal(true, false), n.removal(true, true)},
	}

	// leftSQL finds which of a batch's rows of the lanes in the mask $2
	// (those the record was not fenced out of) are still pending after
	// it removed fewer than it should have.
	s.leftSQL = `SELECT seq FROM ` + n.o + ` WHERE seq = ANY($1) AND status = 'pending' AND (($2::bigint >> ` + laneSQL + `) & 1) <> 0`

	// Routed deliveries of the routing step fan out the same way, copied
	// from their own rows (which deleteDeliveriesSQL then removes).
	s.rerouteSQL = n.insertFrom(`SELECT * FROM `+n.dl+` d WHERE d.sink = '' AND d.seq = u.seq AND `+n.ownDelivery("$9"), "true") +
		` ON CONFLICT (sink, seq) DO NOTHING`

	s.deleteDeliveriesSQL = `DELETE FROM ` + n.dl + ` d USING unnest($2::text[], $3::bigint[]) AS u(sink, seq)
WHERE d.sink = u.sink AND d.seq = u.seq AND ` + n.ownDelivery("$4")

	// A claimed delivery's new state. Heads that leave (dead, or
	// ready→waiting) are written before new heads are made, so that the
	// unique head index never sees two at once: demoteSQL, then
	// headsSQL, each with the same parameters.
	s.demoteSQL = `UPDATE ` + n.dl + ` d
SET state = u.state, stops_key = u.state = 'dead' AND u.stops, attempts = u.attempts,
    next_at = CASE WHEN u.state = 'ready' THEN now() + u.delay * interval '1 microsecond' END,
    last_error = u.last_error, dead_at = CASE WHEN u.state = 'dead' THEN now() END
FROM ` + outcomes + `
WHERE d.sink = u.sink AND d.seq = u.seq AND ` + n.ownDelivery("$9")

	s.headsSQL = `UPDATE ` + n.dl + ` d
SET state = CASE WHEN v.taken THEN 'waiting' ELSE v.state END,
    stops_key = v.state = 'dead' AND v.stops AND NOT v.taken,
    attempts = v.attempts,
    next_at = CASE WHEN v.state = 'ready' AND NOT v.taken THEN ` + dueAt + ` END,
    last_error = coalesce(v.last_error, d.last_error),
    dead_at = CASE WHEN v.state = 'dead' AND NOT v.taken THEN now() END
FROM (
    SELECT u.*, ` + n.headTaken("x.key", "x.sink") + ` AS taken
    FROM ` + outcomes + `
    JOIN ` + n.dl + ` x ON x.sink = u.sink AND x.seq = u.seq
    OFFSET 0
) v
WHERE d.sink = v.sink AND d.seq = v.seq AND ` + n.ownDelivery("$9")

	// The queues whose head left get the next delivery as head ($3 is
	// the owner here, $4 the epochs: the fence of the promoted row).
	s.promoteSQL = n.promote(`d.lane = ANY(ARRAY(SELECT lane FROM ` + n.l + ` WHERE owner = $3 AND epoch = ($4::bigint[])[lane + 1] ORDER BY lane FOR SHARE))`)

	// The lanes of a record's fence that owner ($1) still holds under
	// the fence's epochs ($2), share-locked for the record, as a mask.
	s.fenceSQL = `SELECT coalesce(bit_or(1::bigint << lane), 0) FROM (
    SELECT lane FROM ` + n.l + ` WHERE owner = $1 AND epoch = ($2::bigint[])[lane + 1] ORDER BY lane FOR SHARE) f`
}

// lanes builds heartbeats and the lanes' leases.
func (n names) lanes(s *statements) {
	// A relay's configuration has been live since the earliest time a
	// live relay announced it: a relay restarting into a configuration
	// others still run does not make it new again, while one bringing
	// back a configuration no live relay has (a rollback) does.
	s.heartbeatSQL = `INSERT INTO ` + n.r + ` AS x (owner, heartbeat_until, config, config_since, paused_sinks)
VALUES ($1, now() + $2::interval, $3,
        coalesce((SELECT min(config_since) FROM ` + n.r + `
                  WHERE config = $3 AND heartbeat_until > now() AND owner <> $1), now()),
        $4)
ON CONFLICT (owner) DO UPDATE SET heartbeat_until = excluded.heartbeat_until, paused_sinks = excluded.paused_sinks,
    config = excluded.config,
    config_since = CASE WHEN x.config = excluded.config AND x.heartbeat_until > now() THEN x.config_since
                        ELSE excluded.config_since END`

	// The live relays with the newest configuration, how many of them
	// sort before this one (its rank picks its block of lanes), and
	// whether this relay is one of them.
	s.liveSQL = `SELECT count(*), count(*) FILTER (WHERE owner < $1), $2 = coalesce(` + n.newest() + `, $2), now()
FROM ` + n.r + ` WHERE heartbeat_until > now() AND config = ` + n.newest()

	s.ownerLiveSQL = `SELECT heartbeat_until FROM ` + n.r + ` WHERE owner = $1 AND heartbeat_until > now()`

	s.renewSQL = `UPDATE ` + n.l + ` SET lease_until = now() + $2::interval WHERE owner = $1 RETURNING lane, epoch`

	s.releaseSQL = `UPDATE ` + n.l + ` SET owner = NULL, lease_until = NULL WHERE owner = $1 AND lane = ANY($2)`

	// Acquired lanes say whether they were taken over from an owner
	// whose lease expired (it may have died with events leased), and
	// come under a new epoch.
	s.acquireSQL = `WITH free AS (
    SELECT lane, owner IS NOT NULL AS taken_over FROM ` + n.l + `
    WHERE lane BETWEEN $3 AND $4 AND (owner IS NULL OR lease_until < now())
    FOR UPDATE SKIP LOCKED
)
UPDATE ` + n.l + ` x SET owner = $1, lease_until = now() + $2::interval, epoch = x.epoch + 1
FROM free WHERE x.lane = free.lane
RETURNING x.lane, free.taken_over, x.epoch`

	s.releaseAllSQL = `UPDATE ` + n.l + ` SET owner = NULL, lease_until = NULL WHERE owner = $1`

	s.unregisterSQL = `DELETE FROM ` + n.r + ` WHERE owner = $1`
}

// upkeep builds the upkeep: departed relays, retention, counts, table sizes.
func (n names) upkeep(s *statements) {
	s.cleanRelaysSQL = `DELETE FROM ` + n.r + ` WHERE heartbeat_until < now() - interval '1 minute'`

	// The sinks that have deliveries, one index probe each (a loose
	// index scan of the primary key).
	s.sinksPresentSQL = `WITH RECURSIVE s(sink) AS (
    SELECT min(sink) FROM ` + n.dl + `
    UNION ALL
    SELECT (SELECT min(sink) FROM ` + n.dl + ` WHERE sink > s.sink) FROM s WHERE s.sink IS NOT NULL
)
SELECT sink FROM s WHERE sink IS NOT NULL`

	// What waits for a sink: a range of the primary key.
	s.countWaitingSQL = `SELECT count(*) FROM ` + n.dl + ` WHERE sink = $1 AND state <> 'dead'`

	s.purgeDoneSQL = `DELETE FROM ` + n.o + ` WHERE seq IN (
    SELECT seq FROM ` + n.o + ` WHERE status = 'done' AND finished_at < now() - $1::interval
    ORDER BY finished_at LIMIT $2)`

	s.statsSQL = `INSERT INTO ` + n.st + ` AS s (minute, sink, topic, published)
SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::bigint[])
ON CONFLICT (minute, sink, topic) DO UPDATE SET published = s.published + excluded.published`

	s.statsCleanSQL = `DELETE FROM ` + n.st + ` WHERE minute < now() - interval '1 day'`

	// Per table in $1, in that order: its dead tuples, its size in
	// pages when last analyzed, and its size in pages now.
	s.tableSizesSQL = `SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = c.oid), 0),
       c.relpages::bigint, pg_relation_size(c.oid) / current_setting('block_size')::bigint
FROM unnest($1::text[]) WITH ORDINALITY AS t(name, i)
JOIN pg_class c ON c.oid = to_regclass(t.name)
ORDER BY t.i`
}
