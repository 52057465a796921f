package mysqlstore

// operatorStatements are the statements of the operators' work
// (store.Operator), built once from the quoted table names like the
// engine's. Statements with a filter have a filterMarker where
// deadLetterFilter writes the conditions of the filter's fields that are
// set; statements with a list of seqs have a seqsMarker.
type operatorStatements struct {
	list, listNewest, countAll, countAtMost          string
	showEvent, showDeliveries                        string
	lockAllLanes, selectBatch, selectQueued          string
	rejoin, route, sinkDead, dropSinkDead, purge     string
	countQueue, selectQueue                          string
	pending, queuesByTopic, published, relays, total string
	heldKeys, keyHeads, keyQueue                     string
}

// filterMarker is where deadLetterFilter writes a statement's conditions.
const filterMarker = `/*filter*/`

// pairsTable reads (sink, seq) pairs from one JSON parameter, so that a
// statement's text does not depend on the batch's size.
const pairsTable = `JSON_TABLE(?, '$[*]' COLUMNS (sink VARCHAR(1024) PATH '$.sink', seq BIGINT PATH '$.seq'))`

func newOperatorStatements(n names) operatorStatements {
	var s operatorStatements
	n.deadLetterReads(&s)
	n.deadLetterWrites(&s)
	n.operatorViews(&s)
	return s
}

// deadLetterReads builds the listing, counts and Show. The first
// conditions deadLetterFilter writes are those of dead_letter_idx (state,
// seq, and the primary key's sink after them), which serves the (seq,
// sink) order without a sort (TestQueuePredicatesUseTheirIndexes).
func (n names) deadLetterReads(s *operatorStatements) {
	const columns = `d.seq, d.id, d.topic, coalesce(d.` + "`key`" + `, ''), d.sink, d.attempts, d.created_at, d.dead_at,
       coalesce(d.last_error, ''), d.stops_key`
	s.list = `SELECT ` + columns + ` FROM ` + n.dl + ` d WHERE ` + filterMarker + ` ORDER BY d.seq, d.sink LIMIT ?`
	s.listNewest = `SELECT ` + columns + ` FROM ` + n.dl + ` d WHERE ` + filterMarker + ` ORDER BY d.seq DESC, d.sink DESC LIMIT ?`
	s.countAll = `SELECT count(*) FROM ` + n.dl + ` d WHERE ` + filterMarker
	s.countAtMost = `SELECT count(*) FROM (SELECT 1 FROM ` + n.dl + ` d WHERE ` + filterMarker + ` LIMIT ?) m`
	s.showEvent = `SELECT seq, id, topic, coalesce(` + "`key`" + `, ''), status, payload, payload_bin,
       coalesce(content_type, ''), headers, created_at, available_at, max_attempts, finished_at
FROM ` + n.o + ` WHERE id = ?`
	// The head a waiting delivery waits behind: one probe of the unique
	// head_idx.
	s.showDeliveries = `SELECT d.sink, d.seq, d.topic, coalesce(d.` + "`key`" + `, ''), d.payload, d.payload_bin,
       coalesce(d.content_type, ''), d.headers, d.created_at, d.max_attempts,
       d.state, d.stops_key, d.attempts, d.next_at, coalesce(d.last_error, ''), d.queued_at, d.dead_at,
       h.seq, h.id, h.state
FROM ` + n.dl + ` d
LEFT JOIN ` + n.dl + ` h ON d.state = 'waiting' AND h.head_key = d.` + "`key`" + ` AND h.sink = d.sink
WHERE d.id = ?
ORDER BY d.sink`
}

// deadLetterWrites builds the replay, purge and drop batches.
func (n names) deadLetterWrites(s *operatorStatements) {
	const key = "`key`"
	// Every lane, in lane order (relays share-lock theirs in that order
	// for a record: lockLanes): a batch waits for the records in flight and
	// holds off new ones, and the lanes' takeovers, until it commits.
	s.lockAllLanes = `SELECT lane FROM ` + n.l + ` ORDER BY lane FOR UPDATE`
	// A batch's dead letters, locked. At READ COMMITTED InnoDB locks only
	// the rows that match, never a gap.
	s.selectBatch = `SELECT d.sink, d.seq, d.id, d.` + key + `, d.stops_key, FALSE FROM ` + n.dl + ` d
WHERE ` + filterMarker + ` ORDER BY d.seq, d.sink LIMIT ? FOR UPDATE`
	// The same with queued: whether the event still has a delivery that is
	// not dead on a sink, which keeps it out of the routing step.
	s.selectQueued = `SELECT d.sink, d.seq, d.id, d.` + key + `, d.stops_key,
       EXISTS (SELECT 1 FROM ` + n.dl + ` x WHERE x.id = d.id AND x.sink <> '' AND x.state <> 'dead')
FROM ` + n.dl + ` d WHERE ` + filterMarker + ` ORDER BY d.seq, d.sink LIMIT ? FOR UPDATE`
	s.countQueue = `SELECT count(*) FROM ` + n.dl + ` WHERE sink = ?`
	// A batch of a sink's deliveries to drop, on the primary key.
	// Parameters: sink, after, n.
	s.selectQueue = `SELECT d.sink, d.seq, d.id, d.` + key + `, d.stops_key, FALSE FROM ` + n.dl + ` d
WHERE d.sink = ? AND d.seq > ? ORDER BY d.seq LIMIT ? FOR UPDATE`
	// Dead letters ((sink, seq) in a JSON parameter) rejoin their queues:
	// each waits, none is a head yet (promote makes the heads next), so the
	// unique head index never sees two heads of a queue; one without a key
	// is a queue of its own, due at once. The assignments read no column
	// another one sets.
	s.rejoin = `UPDATE ` + pairsTable + ` u JOIN ` + n.dl + ` d ON d.sink = u.sink AND d.seq = u.seq
SET d.state = CASE WHEN d.` + key + ` IS NULL THEN 'ready' ELSE 'waiting' END,
    d.next_at = CASE WHEN d.` + key + ` IS NULL THEN ` + now + ` END,
    d.stops_key = FALSE, d.attempts = 0, d.last_error = NULL, d.dead_at = NULL, d.queued_at = ` + now
	// Events (seqs at the marker) go back to the routing step: a delivery
	// on sink '' each, copied from its first dead letter (its own dead one
	// there, when it died before any sink), waiting like a dead letter
	// rejoining its queue. ON DUPLICATE KEY assigns left to right, reading
	// the values already assigned: state goes last, so that each
	// assignment before it still sees whether the row was dead. The
	// columns of the row inserted into are named with their table: the
	// SELECT reads the same table.
	set := func(col, value string) string {
		c := n.dl + "." + col
		return c + " = IF(" + n.dl + ".state = 'dead', " + value + ", " + c + ")"
	}
	s.route = `INSERT INTO ` + n.dl + ` (sink, seq, lane, id, topic, ` + key + `, payload, payload_bin, content_type,
    headers, created_at, max_attempts, state, stops_key, attempts, next_at, last_error, queued_at, dead_at)
SELECT '', d.seq, d.lane, d.id, d.topic, d.` + key + `, d.payload, d.payload_bin, d.content_type,
       d.headers, d.created_at, d.max_attempts,
       CASE WHEN d.` + key + ` IS NULL THEN 'ready' ELSE 'waiting' END, FALSE, 0,
       CASE WHEN d.` + key + ` IS NULL THEN ` + now + ` END, NULL, ` + now + `, NULL
FROM ` + n.dl + ` d
WHERE d.state = 'dead' AND d.seq IN (` + seqsMarker + `)
  AND d.sink = (SELECT min(x.sink) FROM ` + n.dl + ` x WHERE x.state = 'dead' AND x.seq = d.seq)
ON DUPLICATE KEY UPDATE
    ` + set("next_at", "VALUES(next_at)") + `,
    ` + set("stops_key", "FALSE") + `,
    ` + set("attempts", "0") + `,
    ` + set("last_error", "NULL") + `,
    ` + set("dead_at", "NULL") + `,
    ` + set("queued_at", now) + `,
    ` + set("state", "VALUES(state)")
	// The dead letters of events gone back to the routing step (seqs at
	// the marker), on every sink: read (MySQL has no DELETE ... RETURNING),
	// then deleted.
	s.sinkDead = `SELECT d.sink, d.` + key + ` FROM ` + n.dl + ` d
WHERE d.state = 'dead' AND d.seq IN (` + seqsMarker + `) AND d.sink <> '' FOR UPDATE`
	s.dropSinkDead = `DELETE FROM ` + n.dl + ` WHERE state = 'dead' AND seq IN (` + seqsMarker + `) AND sink <> ''`
	s.purge = `DELETE d FROM ` + pairsTable + ` u JOIN ` + n.dl + ` d ON d.sink = u.sink AND d.seq = u.seq`
}

// operatorViews builds the status, the backlog and the held keys.
func (n names) operatorViews(s *operatorStatements) {
	const key = "`key`"
	// The oldest pending event is the oldest due one: an event written
	// with a delay is not late before its time.
	s.pending = `SELECT topic, count(*), min(CASE WHEN available_at <= ` + now + ` THEN created_at END), ` + now + `
FROM ` + n.o + ` WHERE status = 'pending'
GROUP BY topic`
	s.queuesByTopic = `SELECT sink, topic, coalesce(sum(state <> 'dead'), 0), min(CASE WHEN state <> 'dead' THEN created_at END),
       coalesce(sum(state = 'dead'), 0),
       coalesce(sum(state = 'dead' AND dead_at > ` + now + ` - INTERVAL 60 SECOND), 0),
       coalesce(sum(state = 'ready' AND attempts > 0), 0)
FROM ` + n.dl + `
GROUP BY sink, topic`
	// Per-minute counts as a sliding window: the current minute counts
	// whole, the previous one in proportion to the part of it still inside
	// the window.
	minute := `cast(date_format(` + now + `, '%Y-%m-%d %H:%i:00') AS DATETIME(6))`
	s.published = `SELECT sink, topic, sum(published * CASE
           WHEN minute >= ` + minute + ` THEN 1
           ELSE 1 - timestampdiff(MICROSECOND, ` + minute + `, ` + now + `) / 60e6 END)
FROM ` + n.st + `
WHERE minute >= ` + minute + ` - INTERVAL 1 MINUTE
GROUP BY sink, topic`
	// The live relays (a row per claim loop), whether each runs the newest
	// configuration (only those claim), and the lanes each holds.
	s.relays = `SELECT r.owner, r.started_at, r.config, r.config_since, r.paused_sinks,
       r.config = (SELECT x.config FROM ` + n.r + ` x WHERE x.heartbeat_until > ` + now + `
                   ORDER BY x.config_since DESC, x.config LIMIT 1),
       (SELECT group_concat(l.lane ORDER BY l.lane) FROM ` + n.l + ` l WHERE l.owner = r.owner AND l.lease_until > ` + now + `)
FROM ` + n.r + ` r WHERE r.heartbeat_until > ` + now + ` ORDER BY r.owner`
	s.total = `SELECT (SELECT count(*) FROM ` + n.o + ` WHERE status = 'pending'),
       (SELECT min(created_at) FROM ` + n.o + ` WHERE status = 'pending' AND available_at <= ` + now + `),
       (SELECT count(*) FROM ` + n.dl + ` WHERE state <> 'dead'),
       (SELECT min(created_at) FROM ` + n.dl + ` WHERE state <> 'dead'),
       (SELECT count(*) FROM ` + n.dl + ` WHERE state = 'dead'),
       ` + now
	// The heads (head_idx) that have failed at least once or stop their
	// key, each with the number of deliveries behind it counted on
	// queue_idx alone.
	s.heldKeys = `SELECT d.sink, d.` + key + `, d.topic, d.id, d.seq, d.state, d.attempts, coalesce(d.last_error, ''),
       d.next_at, CASE WHEN d.state = 'dead' THEN d.dead_at ELSE d.queued_at END AS since,
       (SELECT count(*) - 1 FROM ` + n.dl + ` w WHERE w.queue_key = d.` + key + ` AND w.sink = d.sink) AS behind
FROM ` + n.dl + ` d
WHERE d.head_key IS NOT NULL AND (d.attempts > 0 OR d.stops_key)
ORDER BY behind DESC, since, d.sink, d.` + key + `
LIMIT ?`
	// A key's heads, one per sink (head_idx), then each queue's first
	// members in seq order (queue_idx), never further than the limit.
	s.keyHeads = `SELECT sink FROM ` + n.dl + ` WHERE head_key = ? ORDER BY sink`
	s.keyQueue = `SELECT seq, id, topic, state, attempts, coalesce(last_error, ''), next_at, queued_at, dead_at
FROM ` + n.dl + ` WHERE queue_key = ? AND sink = ? ORDER BY seq LIMIT ?`
}
