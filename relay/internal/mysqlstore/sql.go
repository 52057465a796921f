package mysqlstore

import (
	"strings"

	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
)

// now is the time every statement compares with: the statement's start in
// UTC, as the tables' DATETIME(6) columns hold it.
const now = `utc_timestamp(6)`

// inMask is true for a row whose lane is in the mask given by the three
// parameters lowest lane, highest lane, mask: the range is tested on the
// index entry (claim_idx, due_idx end with the lane), the mask exactly.
func inMask(lane string) string {
	return lane + ` BETWEEN ? AND ? AND (? >> ` + lane + `) & 1 = 1`
}

// keepsInList prefixes a SELECT whose IN list holds a batch of seqs: MariaDB
// (10.3+) turns an IN list of in_predicate_conversion_threshold (1,000)
// values or more into a join with a temporary table of them, sorted with a
// filesort, which is slower than the primary key's range it replaces
// (docs/benchmarks.md) and grows with the batch size. The executable
// comment sets the threshold to 0 (never) for the statement on MariaDB;
// MySQL reads it as a comment. UPDATE and DELETE are not converted.
const keepsInList = `/*M!100300 SET STATEMENT in_predicate_conversion_threshold = 0 FOR */ `

// outcomeTable reads a batch of deliveries' outcomes from one JSON
// parameter (an array of objects, see outcomeRow), so that a statement's
// text does not depend on the batch's size and no value is spliced into it.
// JSON_TABLE cuts a value longer than its column silently: the sink's is
// longer than the table's, so that the table's refuses it (a DataError).
const outcomeTable = `JSON_TABLE(?, '$[*]' COLUMNS (
    seq BIGINT PATH '$.seq', sink VARCHAR(1024) PATH '$.sink', state VARCHAR(8) PATH '$.state',
    stops BOOLEAN PATH '$.stops', attempts INT PATH '$.attempts', delay BIGINT PATH '$.delay',
    last_error LONGTEXT PATH '$.last_error', taken BOOLEAN PATH '$.taken'))`

// queueTable reads (key, sink) pairs from one JSON parameter.
const queueTable = `JSON_TABLE(?, '$[*]' COLUMNS (
    k VARBINARY(1025) PATH '$.key', sink VARCHAR(1024) PATH '$.sink'))`

// eventColumns are the columns an event is read with, from the outbox (alias
// o) or a delivery.
const eventColumns = `seq, id, topic, ` + "`key`" + `, payload, payload_bin, content_type, headers, created_at, max_attempts`

// statements are the SQL the store runs, built once from the quoted table
// names: everything else is a ? parameter. Statements that take a list of
// seqs have a seqsMarker where the caller writes one ? per seq.
type statements struct {
	claimFresh, claimHead, claimFollow, claimQueue                    string
	lockLanes, lockRows, deleteRows, markDone, left                   string
	insertFromOutbox, insertFromRouting                               string
	deleteDeliveries, demote, taken, heads, promoteFind, promote      string
	heartbeat, live, renew, owned, ownerLive, release, releaseAll     string
	acquireFind, acquire, unregister, cleanRelays, sinksPresent       string
	countWaiting, purgeDone, stats, statsClean, tableRows, historyLen string
	probe                                                             string
}

// seqsMarker is replaced by one ? per seq of a batch (inList).
const seqsMarker = `/*seqs*/`

// inList returns stmt with n placeholders at its seqsMarker.
func inList(stmt string, n int) string {
	return strings.Replace(stmt, seqsMarker, strings.TrimSuffix(strings.Repeat("?, ", n), ", "), 1)
}

func newStatements(t mysqlmigrations.Tables) statements {
	n := names{o: t.Outbox(), dl: t.Deliveries(), l: t.Lanes(), r: t.Relays(), st: t.Stats()}
	var s statements
	n.claims(&s)
	n.records(&s)
	n.lanes(&s)
	n.upkeep(&s)
	return s
}

// names are the quoted table names the statements are built from.
type names struct{ o, dl, l, r, st string }

// newest is the configuration that most recently became live among the
// live relays; only relays running it claim, tested in the claim's own
// statement (one snapshot, at READ COMMITTED as at REPEATABLE READ).
func (n names) newest() string {
	return `(SELECT config FROM ` + n.r + ` WHERE heartbeat_until > ` + now + ` ORDER BY config_since DESC, config LIMIT 1)`
}

// payloads are a claim's payload columns of alias a, loaded up to
// relay.max_event_bytes (the first ?): larger ones stay in the database;
// the caller sums their sizes.
func payloads(a string) string {
	return `CASE WHEN ` + a + `.payload_bytes <= ? THEN ` + a + `.payload END, CASE WHEN ` + a + `.payload_bytes <= ? THEN ` + a + `.payload_bin END`
}

// queuedOn is the sinks on which the key of alias a has a queue (a head),
// as a JSON array, NULL when none; looked up on head_idx only for rows of
// lanes that have a head (one probe of head_lane_idx).
func (n names) queuedOn(a string) string {
	return `CASE WHEN ` + a + ".`key` IS NOT NULL AND EXISTS (SELECT 1 FROM " + n.dl + ` hl WHERE hl.head_lane = ` + a + `.lane)
            THEN (SELECT JSON_ARRAYAGG(x.sink) FROM ` + n.dl + ` x WHERE x.head_key = ` + a + ".`key`" + `) END`
}

// insertFrom inserts a delivery per outcome, copying its event from src.
// The delivery inserted as its queue's head (ready, or dead and stopping
// its key) waits instead when the queue already has one: the database has
// the last word (see store.Outcome).
func (n names) insertFrom(src string) string {
	return `INSERT INTO ` + n.dl + ` (sink, seq, lane, id, topic, ` + "`key`" + `, payload, payload_bin, content_type, headers,
    created_at, max_attempts, state, stops_key, attempts, next_at, last_error, dead_at)
SELECT v.sink, v.seq, v.lane, v.id, v.topic, v.k, v.payload, v.payload_bin, v.content_type, v.headers,
       v.created_at, v.max_attempts, v.state, v.state = 'dead' AND v.stops, v.attempts,
       CASE WHEN v.state = 'ready' THEN ` + now + ` + INTERVAL v.delay MICROSECOND END, v.last_error,
       CASE WHEN v.state = 'dead' THEN ` + now + ` END
FROM (
    SELECT u.sink, s.seq, s.lane, s.id, s.topic, s.` + "`key`" + ` AS k, s.payload, s.payload_bin, s.content_type, s.headers,
           s.created_at, s.max_attempts, u.stops, u.attempts, u.delay, u.last_error,
           CASE WHEN (u.state = 'ready' OR u.stops) AND s.` + "`key`" + ` IS NOT NULL AND EXISTS (
                    SELECT 1 FROM ` + n.dl + ` hd WHERE hd.head_key = s.` + "`key`" + ` AND hd.sink = u.sink AND hd.seq <> u.seq)
                THEN 'waiting' ELSE u.state END AS state
    FROM ` + outcomeTable + ` u
    JOIN ` + src + ` s ON s.seq = u.seq
    WHERE ` + inMask("s.lane") + `
) v`
}

// claims builds the claims: the outbox's and the queues'.
func (n names) claims(s *statements) {
	// The claim of outbox rows: the oldest due rows of the lanes held,
	// read without locking (the lanes reserve them), on claim_idx in
	// its order, from a position (store.ClaimParams After; the
	// beginning is 1000-01-01 and 0). Parameters: max event bytes
	// three times, lanes (lowest, highest, mask), skipped seqs at the
	// marker, the position (its time twice, its seq), config twice,
	// rows, bytes.
	s.claimFresh = `SELECT o.seq, o.id, o.topic, o.` + "`key`" + `, ` + payloads("o") + `, o.content_type, o.headers, o.created_at,
       o.max_attempts, o.lane, ` + n.queuedOn("o") + `, o.payload_bytes, o.available_at
FROM (
    SELECT c.seq, sum(c.loaded) OVER (ORDER BY c.available_at, c.seq) AS upto, c.loaded
    FROM (
        SELECT seq, available_at, CASE WHEN payload_bytes <= ? THEN payload_bytes ELSE 0 END AS loaded FROM ` + n.o + `
        WHERE status = 'pending' AND available_at <= ` + now + ` AND ` + inMask("lane") + `
          AND seq NOT IN (` + seqsMarker + `)
          AND (available_at > ? OR available_at = ? AND seq > ?)
          AND ? = coalesce(` + n.newest() + `, ?)
        ORDER BY available_at, seq
        LIMIT ?
    ) c
) c
JOIN ` + n.o + ` o ON o.seq = c.seq
WHERE c.upto <= ? OR c.upto = c.loaded
ORDER BY o.seq`

	// The due heads of one sink's queues in the lanes held, oldest due
	// first, on due_idx. Parameters: sink, lanes, config twice, heads.
	s.claimHead = `(SELECT ? AS sink_at, h.sink, h.seq, h.` + "`key`" + `, h.next_at FROM ` + n.dl + ` h
 WHERE h.sink = ? AND h.next_at <= ` + now + ` AND h.state = 'ready' AND ` + inMask("h.lane") + `
   AND ? = coalesce(` + n.newest() + `, ?)
 ORDER BY h.next_at
 LIMIT ?)`

	// One queue's part of the queue claim: its head, then the
	// deliveries waiting behind it in seq order on queue_idx (at most
	// the head's share of its sink's rows), with their order (sink,
	// head, seq) and the most rows of their sink. Parameters: sink_at,
	// head_at, rows, sink, seq; sink_at, head_at, rows, key, sink,
	// seq, followers.
	s.claimFollow = `(SELECT sink, seq, payload_bytes, ? AS sink_at, ? AS head_at, ? AS cap, 0 AS at FROM ` + n.dl + ` WHERE sink = ? AND seq = ?)
UNION ALL
(SELECT sink, seq, payload_bytes, ?, ?, ?, seq FROM ` + n.dl + `
 WHERE queue_key = ? AND sink = ? AND state = 'waiting' AND seq > ? ORDER BY seq LIMIT ?)`

	// The queue claim around the union of claimFollow parts (at the
	// marker): at most the sink's rows per sink, then payloads up to a
	// budget of bytes over all sinks in order. Parameters: max event
	// bytes three times, (the parts), bytes.
	s.claimQueue = `SELECT d.seq, d.id, d.topic, d.` + "`key`" + `, ` + payloads("d") + `, d.content_type, d.headers, d.created_at,
       d.max_attempts, d.lane, CASE WHEN d.sink = '' THEN ` + n.queuedOn("d") + ` END, d.payload_bytes, d.sink, d.attempts,
       d.state = 'ready',
       CASE WHEN d.sink = '' THEN (SELECT JSON_ARRAYAGG(x.sink) FROM ` + n.dl + ` x WHERE x.id = d.id AND x.sink <> '') END
FROM (
    SELECT q.*, sum(q.loaded) OVER (ORDER BY q.sink_at, q.head_at, q.at) AS upto
    FROM (
        SELECT q.sink, q.seq, q.sink_at, q.head_at, q.at, q.cap,
               CASE WHEN q.payload_bytes <= ? THEN q.payload_bytes ELSE 0 END AS loaded,
               row_number() OVER (PARTITION BY q.sink_at ORDER BY q.head_at, q.at) AS n
        FROM (` + seqsMarker + `) q
    ) q
    WHERE q.n <= q.cap
) q
JOIN ` + n.dl + ` d ON d.sink = q.sink AND d.seq = q.seq
WHERE q.upto <= ? OR q.upto = q.loaded
ORDER BY q.sink_at, q.head_at, q.at`

	// Listen's probe: is any outbox row due? A plain read on
	// claim_idx, no lock. Lanes are not tested: a relay that holds
	// none is woken all the same, and its worker finds nothing.
	s.probe = `SELECT 1 FROM ` + n.o + ` WHERE status = 'pending' AND available_at <= ` + now + ` LIMIT 1`
}

// records builds the record of a batch's outcome, fenced by its leases.
func (n names) records(s *statements) {
	// The record's fence: the lanes owner holds, with their epochs,
	// share-locked in lane order until the record commits, so that a
	// takeover (which updates the lane rows) waits for it; the record
	// then writes only in the lanes of its fence still held under the
	// fence's epochs. LOCK IN SHARE MODE: MariaDB 10.11 has no FOR
	// SHARE.
	s.lockLanes = `SELECT lane, epoch FROM ` + n.l + ` WHERE owner = ? ORDER BY lane LOCK IN SHARE MODE`

	// The batch's rows of the lanes held that no other transaction
	// holds locked (an operator's UPDATE left open): those are left in
	// place rather than waited for. Parameters: lanes; seqs.
	s.lockRows = keepsInList + `SELECT seq FROM ` + n.o + ` WHERE seq IN (` + seqsMarker + `) AND ` + inMask("lane") + `
ORDER BY seq FOR UPDATE SKIP LOCKED`

	// The batch's rows of the lanes held (the fence: the happy path
	// does not lock them first). ORDER BY seq LIMIT keeps the primary
	// key's range plan (see migrations/mysql/store.sql, delete_rows).
	// Parameters: seqs, lanes, n.
	s.deleteRows = `DELETE FROM ` + n.o + ` WHERE seq IN (` + seqsMarker + `) AND ` + inMask("lane") + ` ORDER BY seq LIMIT ?`

	s.markDone = `UPDATE ` + n.o + ` SET status = 'done', finished_at = ` + now + `
WHERE seq IN (` + seqsMarker + `) AND ` + inMask("lane") + `
ORDER BY seq LIMIT ?`

	// Parameters: seqs, lanes.
	s.left = keepsInList + `SELECT seq FROM ` + n.o + ` WHERE seq IN (` + seqsMarker + `) AND status = 'pending' AND ` + inMask("lane")

	// Parameters: outcomes (JSON), lanes.
	s.insertFromOutbox = n.insertFrom(n.o)

	// PostgreSQL's ON CONFLICT (sink, seq) DO NOTHING.
	s.insertFromRouting = n.insertFrom(`(SELECT * FROM `+n.dl+` WHERE sink = '')`) +
		` ON DUPLICATE KEY UPDATE sink = VALUES(sink)`

	// Parameters of the next ones: outcomes (JSON), lanes.
	s.deleteDeliveries = `DELETE d FROM ` + outcomeTable + ` u JOIN ` + n.dl + ` d ON d.sink = u.sink AND d.seq = u.seq
WHERE ` + inMask("d.lane")

	s.demote = `UPDATE ` + outcomeTable + ` u JOIN ` + n.dl + ` d ON d.sink = u.sink AND d.seq = u.seq
SET d.state = u.state, d.stops_key = u.state = 'dead' AND u.stops, d.attempts = u.attempts,
    d.next_at = CASE WHEN u.state = 'ready' THEN ` + now + ` + INTERVAL u.delay MICROSECOND END,
    d.last_error = u.last_error, d.dead_at = CASE WHEN u.state = 'dead' THEN ` + now + ` END
WHERE ` + inMask("d.lane")

	// The heads to write whose queue has another head already
	// (MySQL refuses a subquery on the table an UPDATE writes, so
	// heads reads them first, in the same transaction). Parameter:
	// outcomes (JSON).
	s.taken = `SELECT x.sink, x.seq FROM ` + outcomeTable + ` u JOIN ` + n.dl + ` x ON x.sink = u.sink AND x.seq = u.seq
WHERE (u.state = 'ready' OR u.stops) AND x.` + "`key`" + ` IS NOT NULL
  AND EXISTS (SELECT 1 FROM ` + n.dl + ` hd WHERE hd.head_key = x.` + "`key`" + ` AND hd.sink = x.sink AND hd.seq <> x.seq)`

	s.heads = `UPDATE ` + outcomeTable + ` u JOIN ` + n.dl + ` d ON d.sink = u.sink AND d.seq = u.seq
SET d.state = CASE WHEN u.taken THEN 'waiting' ELSE u.state END,
    d.stops_key = u.state = 'dead' AND u.stops AND NOT u.taken,
    d.attempts = u.attempts,
    d.next_at = CASE WHEN u.state = 'ready' AND NOT u.taken THEN ` + now + ` + INTERVAL u.delay MICROSECOND END,
    d.last_error = coalesce(u.last_error, d.last_error),
    d.dead_at = CASE WHEN u.state = 'dead' AND NOT u.taken THEN ` + now + ` END
WHERE ` + inMask("d.lane")

	// The queues of (key, sink) pairs that have waiting deliveries and
	// no head, with their lowest waiting delivery. Parameter: pairs
	// (JSON).
	s.promoteFind = `SELECT p.sink, (SELECT min(w.seq) FROM ` + n.dl + ` w WHERE w.queue_key = p.k AND w.sink = p.sink AND w.state = 'waiting')
FROM ` + queueTable + ` p
WHERE NOT EXISTS (SELECT 1 FROM ` + n.dl + ` h WHERE h.head_key = p.k AND h.sink = p.sink)`

	// promote makes them heads, due at once. Parameters: outcomes
	// (JSON: sink, seq), lanes.
	s.promote = `UPDATE ` + outcomeTable + ` u JOIN ` + n.dl + ` d ON d.sink = u.sink AND d.seq = u.seq
SET d.state = 'ready', d.next_at = ` + now + `
WHERE d.state = 'waiting' AND ` + inMask("d.lane")
}

// lanes builds heartbeats and the lanes' leases.
func (n names) lanes(s *statements) {
	// A relay's configuration has been live since the earliest time a
	// live relay announced it (PostgreSQL's heartbeat). The ON
	// DUPLICATE KEY assignments run left to right: config_since reads
	// the row's old config and heartbeat. Parameters: owner, lease
	// (µs), config, config, owner, paused (JSON).
	s.heartbeat = `INSERT INTO ` + n.r + ` (owner, heartbeat_until, config, config_since, paused_sinks)
SELECT ?, ` + now + ` + INTERVAL ? MICROSECOND, ?,
       coalesce((SELECT min(x.config_since) FROM ` + n.r + ` x
                 WHERE x.config = ? AND x.heartbeat_until > ` + now + ` AND x.owner <> ?), ` + now + `), ?
FROM dual
ON DUPLICATE KEY UPDATE
    config_since = CASE WHEN config = VALUES(config) AND heartbeat_until > ` + now + ` THEN config_since
                        ELSE VALUES(config_since) END,
    heartbeat_until = VALUES(heartbeat_until), paused_sinks = VALUES(paused_sinks), config = VALUES(config)`

	// Parameters: owner, config, config.
	s.live = `SELECT count(*), coalesce(sum(owner < ?), 0), ? = coalesce(` + n.newest() + `, ?), ` + now + `
FROM ` + n.r + ` WHERE heartbeat_until > ` + now + ` AND config = ` + n.newest()

	s.renew = `UPDATE ` + n.l + ` SET lease_until = ` + now + ` + INTERVAL ? MICROSECOND WHERE owner = ?`

	s.owned = `SELECT lane, epoch FROM ` + n.l + ` WHERE owner = ?`

	s.ownerLive = `SELECT heartbeat_until FROM ` + n.r + ` WHERE owner = ? AND heartbeat_until > ` + now

	s.release = `UPDATE ` + n.l + ` SET owner = NULL, lease_until = NULL WHERE owner = ? AND ` + inMask("lane")

	s.releaseAll = `UPDATE ` + n.l + ` SET owner = NULL, lease_until = NULL WHERE owner = ?`

	// Lanes free or expired, skipping those another relay is taking
	// (or a record holds share-locked). Parameters: first, last.
	s.acquireFind = `SELECT lane, owner IS NOT NULL FROM ` + n.l + `
WHERE lane BETWEEN ? AND ? AND (owner IS NULL OR lease_until < ` + now + `)
ORDER BY lane FOR UPDATE SKIP LOCKED`

	// A lane acquired comes under a new epoch. Parameters: owner, lease
	// (µs), lanes.
	s.acquire = `UPDATE ` + n.l + ` SET owner = ?, lease_until = ` + now + ` + INTERVAL ? MICROSECOND, epoch = epoch + 1 WHERE ` + inMask("lane")

	s.unregister = `DELETE FROM ` + n.r + ` WHERE owner = ?`
}

// upkeep builds the upkeep: departed relays, retention, counts, table maintenance.
func (n names) upkeep(s *statements) {
	s.cleanRelays = `DELETE FROM ` + n.r + ` WHERE heartbeat_until < ` + now + ` - INTERVAL 1 MINUTE`

	// A loose index scan of the primary key ("Using index for
	// group-by"): one probe per sink.
	s.sinksPresent = `SELECT DISTINCT sink FROM ` + n.dl

	// What waits for a sink: a range of the primary key. Parameter:
	// sink.
	s.countWaiting = `SELECT count(*) FROM ` + n.dl + ` WHERE sink = ? AND state <> 'dead'`

	// On done_idx, oldest first. Parameters: age (µs), limit.
	s.purgeDone = `DELETE FROM ` + n.o + ` WHERE status = 'done' AND finished_at < ` + now + ` - INTERVAL ? MICROSECOND
ORDER BY finished_at LIMIT ?`

	// The VALUES rows are appended by the caller, 4 ? each.
	s.stats = `INSERT INTO ` + n.st + ` (minute, sink, topic, published) VALUES `

	s.statsClean = `DELETE FROM ` + n.st + ` WHERE minute < ` + now + ` - INTERVAL 1 DAY`

	// The estimated rows of each table (InnoDB's statistics, kept
	// current between analyzes by its row counters). Parameters:
	// database ("" for the connection's), table, table.
	s.tableRows = `SELECT table_name, coalesce(table_rows, 0) FROM information_schema.tables
WHERE table_schema = coalesce(nullif(?, ''), database()) AND table_name IN (?, ?)`

	// The InnoDB history list length: undo not yet purged. Readable
	// with the PROCESS privilege.
	s.historyLen = `SELECT count FROM information_schema.innodb_metrics WHERE name = 'trx_rseg_history_len'`
}
