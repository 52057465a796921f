package pgstore

import "strings"

// operatorStatements are the statements of the operators' work
// (store.Operator), built once from the quoted table names like the
// engine's.
type operatorStatements struct {
	listSQL, listNewestSQL, countSQL, countAtMostSQL string
	pagePlanSQL, countPlanSQL                        string
	showSetupSQL, showEventSQL, showDeliveriesSQL    string
	nowSQL, lockLanesSQL, notifySQL                  string
	replaySQL, routeSQL, dropSinkDeadSQL, purgeSQL   string
	queueSizeSQL, dropSQL, promoteSQL                string
	statusPendingSQL, statusQueuesSQL                string
	statusPublishedSQL, statusRelaysSQL, totalsSQL   string
	heldKeysSQL, keyQueuesSQL                        string
}

func newOperatorStatements(n names) operatorStatements {
	var s operatorStatements
	n.deadLetterReads(&s)
	n.deadLetterWrites(&s)
	n.operatorViews(&s)
	return s
}

// deadLetterFilter selects dead letters (alias d) after ($1 seq, $2 sink)
// matching the filter parameters $3 to $10 (NULL means no condition). Its
// first two conditions are those of dead_letter_idx, which serves the (seq,
// sink) order without a sort (TestQueuePredicatesUseTheirIndexes).
const deadLetterFilter = `d.state = 'dead' AND (d.seq, d.sink) > ($1::bigint, $2::text)
  AND ($3::uuid[] IS NULL OR d.id = ANY($3::uuid[]))
  AND ($4::text IS NULL OR d.topic LIKE $4::text)
  AND ($5::text IS NULL OR d.key = $5::text)
  AND ($6::text IS NULL OR d.sink = $6::text)
  AND ($7::text IS NULL OR strpos(lower(d.last_error), lower($7::text)) > 0)
  AND ($8::timestamptz IS NULL OR d.dead_at >= $8::timestamptz)
  AND ($9::timestamptz IS NULL OR d.dead_at < $9::timestamptz)
  AND ($10::interval IS NULL OR d.dead_at < now() - $10::interval)`

// deadLetterFilterBefore is deadLetterFilter selecting the dead letters
// before ($1 seq, $2 sink), for a list from the newest.
var deadLetterFilterBefore = strings.Replace(deadLetterFilter, "(d.seq, d.sink) > (", "(d.seq, d.sink) < (", 1)

// deadLetterReads builds the listing, counts and Show.
func (n names) deadLetterReads(s *operatorStatements) {
	const columns = `d.seq, d.id::text, d.topic, coalesce(d.key, ''), d.sink, d.attempts, d.created_at, d.dead_at,
       coalesce(d.last_error, ''), d.stops_key`
	s.listSQL = `SELECT ` + columns + `
FROM ` + n.dl + ` d WHERE ` + deadLetterFilter + `
ORDER BY d.seq, d.sink LIMIT $11`
	// The same walking the index backwards, from the newest.
	s.listNewestSQL = `SELECT ` + columns + `
FROM ` + n.dl + ` d WHERE ` + deadLetterFilterBefore + `
ORDER BY d.seq DESC, d.sink DESC LIMIT $11`
	s.countSQL = `SELECT count(*) FROM ` + n.dl + ` d WHERE ` + deadLetterFilter
	s.countAtMostSQL = `SELECT count(*) FROM (SELECT FROM ` + n.dl + ` d WHERE ` + deadLetterFilter + ` LIMIT $11) m`
	// A batch must walk the dead-letter index in (seq, sink) order, stop at
	// its limit, and reach every other row it reads or changes through an
	// index, one probe per row. Right after a burst of dead letters, before
	// autovacuum has analysed the table, the planner underestimates them
	// and would rather read and sort every remaining match, or hash the
	// whole table to join a batch with it; these settings, local to the
	// batch's transaction, keep it on the indexes. (Disabled plans look
	// expensive enough to set JIT compiling off; it is not worth it for a
	// batch.) A selection by id is left to the planner: the id index finds
	// the few rows at once.
	s.pagePlanSQL = `SELECT set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),
       set_config('jit', 'off', true)`
	s.countPlanSQL = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('max_parallel_workers_per_gather', '0', true), set_config('jit', 'off', true)`
	// Show reads the outbox row and the deliveries of one event from one
	// snapshot: a relay moving the event from one to the other in between
	// would otherwise hide it.
	s.showSetupSQL = `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY`
	s.showEventSQL = `SELECT seq, id::text, topic, coalesce(key, ''), status, payload::text, payload_bin,
       coalesce(content_type, ''), headers, created_at, available_at, max_attempts, finished_at
FROM ` + n.o + ` WHERE id = $1`
	// Each delivery of the event, and for one waiting in its key's queue,
	// the head it waits behind (one probe of the unique head_idx).
	s.showDeliveriesSQL = `SELECT d.sink, d.seq, d.topic, coalesce(d.key, ''), d.payload::text, d.payload_bin,
       coalesce(d.content_type, ''), d.headers, d.created_at, d.max_attempts,
       d.state, d.stops_key, d.attempts, d.next_at, coalesce(d.last_error, ''), d.queued_at, d.dead_at,
       h.seq, h.id::text, h.state
FROM ` + n.dl + ` d
LEFT JOIN LATERAL (
    SELECT x.seq, x.id, x.state FROM ` + n.dl + ` x
    WHERE d.state = 'waiting' AND x.key = d.key AND x.sink = d.sink AND ` + on(head, "x") + `
) h ON true
WHERE d.id = $1
ORDER BY d.sink`
	s.nowSQL = `SELECT now()`
}

// deadLetterWrites builds the replay, purge and drop batches.
func (n names) deadLetterWrites(s *operatorStatements) {
	// Every lane, in lane order (the order relays take theirs in share
	// mode for a record: mine): a batch waits for the records in flight
	// and holds off new ones until it commits.
	s.lockLanesSQL = `SELECT lane FROM ` + n.l + ` ORDER BY lane FOR NO KEY UPDATE`
	s.notifySQL = `SELECT pg_notify($1, '` + queuesChanged + `')`
	// One batch of a replay: the next dead letters, locked ($1 to $10 the
	// filter, $11 the batch size), rejoin their queues, unless $12 sends
	// them to the routing step instead. queued says whether the event still
	// has a delivery that is not dead on a sink, which keeps it out of the
	// routing step. A rejoining dead letter waits, none is a head yet
	// (promoteSQL makes the heads next), so the unique head index never
	// sees two heads of a queue, even for a moment; one without a key is a
	// queue of its own, due at once. The batch drives the update, row by
	// row through the primary key.
	s.replaySQL = `WITH sel AS (
    SELECT d.sink, d.seq, d.id, d.key, d.stops_key,
           $12::boolean AND EXISTS (
               SELECT 1 FROM ` + n.dl + ` x WHERE x.id = d.id AND x.sink <> '' AND x.state <> 'dead') AS queued
    FROM ` + n.dl + ` d WHERE ` + deadLetterFilter + `
    ORDER BY d.seq, d.sink LIMIT $11
    FOR UPDATE OF d
), rejoin AS (
    UPDATE ` + n.dl + ` d
    SET state = CASE WHEN d.key IS NULL THEN 'ready' ELSE 'waiting' END,
        next_at = CASE WHEN d.key IS NULL THEN now() END,
        stops_key = false, attempts = 0, last_error = NULL, dead_at = NULL, queued_at = now()
    FROM sel
    WHERE d.sink = sel.sink AND d.seq = sel.seq AND (NOT $12::boolean OR sel.queued)
)
SELECT sink, seq, id::text, key, stops_key, queued FROM sel`
	// Events ($1 seqs) go back to the routing step: a delivery on sink ''
	// each, copied from one of their dead letters (their own dead one
	// there, when they died before any sink), waiting like a dead letter
	// rejoining its queue (promoteSQL makes the heads).
	s.routeSQL = `INSERT INTO ` + n.dl + ` AS r (sink, seq, lane, id, topic, key, payload, payload_bin, content_type,
    headers, created_at, max_attempts, state, stops_key, attempts, next_at, last_error, queued_at, dead_at)
SELECT DISTINCT ON (d.seq) '', d.seq, d.lane, d.id, d.topic, d.key, d.payload, d.payload_bin, d.content_type,
       d.headers, d.created_at, d.max_attempts,
       CASE WHEN d.key IS NULL THEN 'ready' ELSE 'waiting' END, false, 0,
       CASE WHEN d.key IS NULL THEN now() END, NULL, now(), NULL
FROM ` + n.dl + ` d
WHERE d.seq = ANY($1::bigint[]) AND d.state = 'dead'
ORDER BY d.seq, d.sink
ON CONFLICT (sink, seq) DO UPDATE
SET state = excluded.state, next_at = excluded.next_at, stops_key = false, attempts = 0,
    last_error = NULL, dead_at = NULL, queued_at = now()
WHERE r.state = 'dead'`
	// The dead letters of events gone back to the routing step ($1 seqs),
	// on every sink: the routing step sends the event to each sink of its
	// route again.
	s.dropSinkDeadSQL = `DELETE FROM ` + n.dl + ` d
WHERE d.seq = ANY($1::bigint[]) AND d.sink <> '' AND d.state = 'dead'
RETURNING d.sink, d.key`
	s.purgeSQL = `WITH sel AS (
    SELECT d.sink, d.seq FROM ` + n.dl + ` d WHERE ` + deadLetterFilter + `
    ORDER BY d.seq, d.sink LIMIT $11
    FOR UPDATE OF d
)
DELETE FROM ` + n.dl + ` d USING sel
WHERE d.sink = sel.sink AND d.seq = sel.seq
RETURNING d.sink, d.seq, d.id::text, d.key, d.stops_key`
	s.queueSizeSQL = `SELECT count(*) FROM ` + n.dl + ` WHERE sink = $1`
	// One batch of a sink's deliveries dropped, in seq order on the
	// primary key ($1 the sink, after $2, $3 of them).
	s.dropSQL = `WITH sel AS (
    SELECT d.sink, d.seq FROM ` + n.dl + ` d WHERE d.sink = $1 AND d.seq > $2
    ORDER BY d.seq LIMIT $3
    FOR UPDATE OF d
)
DELETE FROM ` + n.dl + ` d USING sel
WHERE d.sink = sel.sink AND d.seq = sel.seq
RETURNING d.sink, d.seq, d.id::text, d.key, d.stops_key`
	// Every lane is locked by the batch: no fence on the promoted rows.
	s.promoteSQL = n.promote("true")
}

// operatorViews builds the status, the backlog and the held keys.
func (n names) operatorViews(s *operatorStatements) {
	// The oldest pending event is the oldest due one: an event written
	// with a delay is not late before its time.
	s.statusPendingSQL = `SELECT topic, count(*), min(created_at) FILTER (WHERE isfinite(created_at) AND available_at <= now()), now()
FROM ` + n.o + ` WHERE status = 'pending'
GROUP BY topic`
	// The queues per sink and topic: deliveries waiting (ready or waiting)
	// with their oldest event, dead letters (and those of the last
	// minute), and heads waiting to be tried again after a failed attempt.
	s.statusQueuesSQL = `SELECT sink, topic,
       count(*) FILTER (WHERE state <> 'dead'),
       min(created_at) FILTER (WHERE state <> 'dead' AND isfinite(created_at)),
       count(*) FILTER (WHERE state = 'dead'),
       count(*) FILTER (WHERE state = 'dead' AND dead_at > now() - interval '60 seconds'),
       count(*) FILTER (WHERE state = 'ready' AND attempts > 0)
FROM ` + n.dl + `
GROUP BY sink, topic`
	// The live relays (a row per claim loop), with whether each runs the
	// newest configuration (only those claim) and the lanes each holds.
	s.statusRelaysSQL = `WITH live AS (SELECT * FROM ` + n.r + ` WHERE heartbeat_until > now())
SELECT owner, started_at, config, config_since, paused_sinks,
       config = (SELECT config FROM live ORDER BY config_since DESC, config LIMIT 1),
       ARRAY(SELECT lane FROM ` + n.l + ` l WHERE l.owner = live.owner AND l.lease_until > now() ORDER BY lane)
FROM live ORDER BY owner`
	// Published in the last minute, estimated from per-minute counts as a
	// sliding window: the current minute counts whole, the previous one in
	// proportion to the part of it still inside the window.
	s.statusPublishedSQL = `SELECT sink, topic, sum(published * CASE
           WHEN minute >= date_trunc('minute', now()) THEN 1
           ELSE 1 - extract(epoch FROM now() - date_trunc('minute', now())) / 60 END)::float8
FROM ` + n.st + `
WHERE minute >= date_trunc('minute', now()) - interval '1 minute'
GROUP BY sink, topic`
	s.totalsSQL = `SELECT (SELECT count(*) FROM ` + n.o + ` WHERE status = 'pending'),
       (SELECT min(created_at) FROM ` + n.o + ` WHERE status = 'pending' AND isfinite(created_at) AND available_at <= now()),
       (SELECT count(*) FROM ` + n.dl + ` WHERE state <> 'dead'),
       (SELECT min(created_at) FROM ` + n.dl + ` WHERE state <> 'dead' AND isfinite(created_at)),
       (SELECT count(*) FROM ` + n.dl + ` WHERE state = 'dead'),
       now()`
	// The heads (head_idx: one per key and sink) that have failed at least
	// once or stop their key, each with the number of deliveries behind it:
	// the members of its queue but itself, counted on queue_idx alone (an
	// index-only scan: testing state = 'waiting' instead would read every
	// waiting row). Every failing head's queue is counted before the sort:
	// "most behind first" needs all of them; their number is that of keys
	// whose head fails, not of events.
	s.heldKeysSQL = `SELECT d.sink, d.key, d.topic, d.id::text, d.seq, d.state, d.attempts, coalesce(d.last_error, ''),
       d.next_at, CASE WHEN d.state = 'dead' THEN d.dead_at ELSE d.queued_at END AS since, b.n
FROM ` + n.dl + ` d
CROSS JOIN LATERAL (
    SELECT count(*) - 1 AS n FROM ` + n.dl + ` w
    WHERE w.key = d.key AND w.sink = d.sink AND ` + on(member, "w") + `
) b
WHERE d.key IS NOT NULL AND ` + head + ` AND (d.attempts > 0 OR d.stops_key)
ORDER BY b.n DESC, since, d.sink, d.key
LIMIT $1`
	// A key's queues: its heads (one per sink, head_idx), then for each
	// the first $2 members of the queue in seq order (queue_idx), which
	// never reads further into a long queue than the limit.
	s.keyQueuesSQL = `SELECT h.sink, q.seq, q.id::text, q.topic, q.state, q.attempts, coalesce(q.last_error, ''),
       q.next_at, q.queued_at, q.dead_at
FROM ` + n.dl + ` h
CROSS JOIN LATERAL (
    SELECT d.seq, d.id, d.topic, d.state, d.attempts, d.last_error, d.next_at, d.queued_at, d.dead_at
    FROM ` + n.dl + ` d
    WHERE d.key = h.key AND d.sink = h.sink AND ` + member + `
    ORDER BY d.seq LIMIT $2
) q
WHERE h.key = $1 AND ` + on(head, "h") + `
ORDER BY h.sink, q.seq`
}
