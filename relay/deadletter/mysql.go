package deadletter

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/relay/internal/mysqlstore"
)

// mysqlNow is the time the statements compare with: the statement's start
// in UTC, as the tables' DATETIME(6) columns hold it.
const mysqlNow = `utc_timestamp(6)`

// mysqlBackend is the backend on MySQL 8 and MariaDB 10.6+. Its writes run
// in the relay store's READ COMMITTED transactions, retried on deadlocks
// and lock wait timeouts (mysqlstore.InTx), and it gives queues their
// heads with the relay store's own statement (mysqlstore.Store.Promote).
// Reads go through Query, never Exec: see docs/architecture.md on the
// driver's hang after Exec of a prepared SELECT that returns no rows.
type mysqlBackend struct {
	db     *sql.DB
	queues *mysqlstore.Store

	list, listNewest, countAll, countAtMost          string
	showEvent, showDeliveries                        string
	lockLanes, selectBatch, selectQueued             string
	rejoin, route, sinkDead, dropSinkDead, purge     string
	pending, queuesByTopic, published, relays, total string
	heldKeysSQL, keyHeads, keyQueue                  string
}

// NewMySQL returns a Store on MySQL or MariaDB for the tables t (defaults
// filled in). Open db as a relay's (relay.OpenMySQL): the statements need
// its settings (interpolated parameters, times in UTC, a lock wait timeout
// of a second).
func NewMySQL(db *sql.DB, t migrations.Tables) (*Store, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	mt, err := mysqlmigrations.NewTables(t)
	if err != nil {
		return nil, err
	}
	o, dl, l, r, st := mt.Outbox(), mt.Deliveries(), mt.Lanes(), mt.Relays(), mt.Stats()
	const key = "`key`"
	columns := `d.seq, d.id, d.topic, coalesce(d.` + key + `, ''), d.sink, d.attempts, d.created_at, d.dead_at,
       coalesce(d.last_error, ''), d.stops_key`
	s := &mysqlBackend{db: db, queues: mysqlstore.New(db, mt, mysqlstore.Config{})}
	// Each statement with a filter has the filterMarker where mysqlFilter
	// writes the conditions of the filter's fields that are set, each value
	// a parameter. The first conditions are those of dead_letter_idx
	// (state, seq, and the primary key's sink after them), which serves the
	// (seq, sink) order without a sort.
	s.list = `SELECT ` + columns + ` FROM ` + dl + ` d WHERE ` + filterMarker + ` ORDER BY d.seq, d.sink LIMIT ?`
	s.listNewest = `SELECT ` + columns + ` FROM ` + dl + ` d WHERE ` + filterMarker + ` ORDER BY d.seq DESC, d.sink DESC LIMIT ?`
	s.countAll = `SELECT count(*) FROM ` + dl + ` d WHERE ` + filterMarker
	s.countAtMost = `SELECT count(*) FROM (SELECT 1 FROM ` + dl + ` d WHERE ` + filterMarker + ` LIMIT ?) m`
	s.showEvent = `SELECT seq, id, topic, coalesce(` + key + `, ''), status, payload, payload_bin,
       coalesce(content_type, ''), headers, created_at, available_at, max_attempts, finished_at
FROM ` + o + ` WHERE id = ?`
	// The head a waiting delivery waits behind: one probe of the unique
	// head_idx.
	s.showDeliveries = `SELECT d.sink, d.seq, d.topic, coalesce(d.` + key + `, ''), d.payload, d.payload_bin,
       coalesce(d.content_type, ''), d.headers, d.created_at, d.max_attempts,
       d.state, d.stops_key, d.attempts, d.next_at, coalesce(d.last_error, ''), d.queued_at, d.dead_at,
       h.seq, h.id, h.state
FROM ` + dl + ` d
LEFT JOIN ` + dl + ` h ON d.state = 'waiting' AND h.head_key = d.` + key + ` AND h.sink = d.sink
WHERE d.id = ?
ORDER BY d.sink`
	// Every lane, in lane order (relays share-lock theirs in that order
	// for a record): a batch waits for the records in flight and holds off
	// new ones, and the lanes' takeovers, until it commits.
	s.lockLanes = `SELECT lane FROM ` + l + ` ORDER BY lane FOR UPDATE`
	// A batch's dead letters, locked. At READ COMMITTED InnoDB locks only
	// the rows that match, never a gap.
	s.selectBatch = `SELECT d.sink, d.seq, d.id, d.` + key + `, d.stops_key, FALSE FROM ` + dl + ` d
WHERE ` + filterMarker + ` ORDER BY d.seq, d.sink LIMIT ? FOR UPDATE`
	// The same with queued: whether the event still has a delivery that is
	// not dead on a sink, which keeps it out of the routing step.
	s.selectQueued = `SELECT d.sink, d.seq, d.id, d.` + key + `, d.stops_key,
       EXISTS (SELECT 1 FROM ` + dl + ` x WHERE x.id = d.id AND x.sink <> '' AND x.state <> 'dead')
FROM ` + dl + ` d WHERE ` + filterMarker + ` ORDER BY d.seq, d.sink LIMIT ? FOR UPDATE`
	// Dead letters ((sink, seq) in a JSON parameter) rejoin their queues:
	// each waits, none is a head yet (Promote makes the heads next), so the
	// unique head index never sees two heads of a queue; one without a key
	// is a queue of its own, due at once. The assignments read no column
	// another one sets.
	s.rejoin = `UPDATE ` + pairsTable + ` u JOIN ` + dl + ` d ON d.sink = u.sink AND d.seq = u.seq
SET d.state = CASE WHEN d.` + key + ` IS NULL THEN 'ready' ELSE 'waiting' END,
    d.next_at = CASE WHEN d.` + key + ` IS NULL THEN ` + mysqlNow + ` END,
    d.stops_key = FALSE, d.attempts = 0, d.last_error = NULL, d.dead_at = NULL, d.queued_at = ` + mysqlNow
	// Events (seqs at the marker) go back to the routing step: a delivery
	// on sink '' each, copied from its first dead letter (its own dead one
	// there, when it died before any sink), waiting like a dead letter
	// rejoining its queue. ON DUPLICATE KEY assigns left to right, reading
	// the values already assigned: state goes last, so that each
	// assignment before it still sees whether the row was dead.
	// The columns of the row inserted into are named with their table:
	// the SELECT reads the same table.
	set := func(col, value string) string {
		c := dl + "." + col
		return c + " = IF(" + dl + ".state = 'dead', " + value + ", " + c + ")"
	}
	s.route = `INSERT INTO ` + dl + ` (sink, seq, lane, id, topic, ` + key + `, payload, payload_bin, content_type,
    headers, created_at, max_attempts, state, stops_key, attempts, next_at, last_error, queued_at, dead_at)
SELECT '', d.seq, d.lane, d.id, d.topic, d.` + key + `, d.payload, d.payload_bin, d.content_type,
       d.headers, d.created_at, d.max_attempts,
       CASE WHEN d.` + key + ` IS NULL THEN 'ready' ELSE 'waiting' END, FALSE, 0,
       CASE WHEN d.` + key + ` IS NULL THEN ` + mysqlNow + ` END, NULL, ` + mysqlNow + `, NULL
FROM ` + dl + ` d
WHERE d.state = 'dead' AND d.seq IN (` + seqsMarker + `)
  AND d.sink = (SELECT min(x.sink) FROM ` + dl + ` x WHERE x.state = 'dead' AND x.seq = d.seq)
ON DUPLICATE KEY UPDATE
    ` + set("next_at", "VALUES(next_at)") + `,
    ` + set("stops_key", "FALSE") + `,
    ` + set("attempts", "0") + `,
    ` + set("last_error", "NULL") + `,
    ` + set("dead_at", "NULL") + `,
    ` + set("queued_at", mysqlNow) + `,
    ` + set("state", "VALUES(state)")
	// The dead letters of events gone back to the routing step (seqs at
	// the marker), on every sink: read (MySQL has no DELETE ... RETURNING),
	// then deleted.
	s.sinkDead = `SELECT d.sink, d.` + key + ` FROM ` + dl + ` d
WHERE d.state = 'dead' AND d.seq IN (` + seqsMarker + `) AND d.sink <> '' FOR UPDATE`
	s.dropSinkDead = `DELETE FROM ` + dl + ` WHERE state = 'dead' AND seq IN (` + seqsMarker + `) AND sink <> ''`
	s.purge = `DELETE d FROM ` + pairsTable + ` u JOIN ` + dl + ` d ON d.sink = u.sink AND d.seq = u.seq`
	// The oldest pending event is the oldest due one: an event written
	// with a delay is not late before its time.
	s.pending = `SELECT topic, count(*), min(CASE WHEN available_at <= ` + mysqlNow + ` THEN created_at END), ` + mysqlNow + `
FROM ` + o + ` WHERE status = 'pending'
GROUP BY topic`
	s.queuesByTopic = `SELECT sink, topic, coalesce(sum(state <> 'dead'), 0), min(CASE WHEN state <> 'dead' THEN created_at END),
       coalesce(sum(state = 'dead'), 0)
FROM ` + dl + `
GROUP BY sink, topic`
	// Per-minute counts as a sliding window: the current minute counts
	// whole, the previous one in proportion to the part of it still inside
	// the window.
	minute := `cast(date_format(` + mysqlNow + `, '%Y-%m-%d %H:%i:00') AS DATETIME(6))`
	s.published = `SELECT sink, topic, sum(published * CASE
           WHEN minute >= ` + minute + ` THEN 1
           ELSE 1 - timestampdiff(MICROSECOND, ` + minute + `, ` + mysqlNow + `) / 60e6 END)
FROM ` + st + `
WHERE minute >= ` + minute + ` - INTERVAL 1 MINUTE
GROUP BY sink, topic`
	// The live relays (a row per claim loop), whether each runs the newest
	// configuration (only those claim), and the lanes each holds.
	s.relays = `SELECT r.owner, r.started_at, r.config, r.config_since, r.paused_sinks,
       r.config = (SELECT x.config FROM ` + r + ` x WHERE x.heartbeat_until > ` + mysqlNow + `
                   ORDER BY x.config_since DESC, x.config LIMIT 1),
       (SELECT group_concat(l.lane ORDER BY l.lane) FROM ` + l + ` l WHERE l.owner = r.owner AND l.lease_until > ` + mysqlNow + `)
FROM ` + r + ` r WHERE r.heartbeat_until > ` + mysqlNow + ` ORDER BY r.owner`
	s.total = `SELECT (SELECT count(*) FROM ` + o + ` WHERE status = 'pending'),
       (SELECT min(created_at) FROM ` + o + ` WHERE status = 'pending' AND available_at <= ` + mysqlNow + `),
       (SELECT count(*) FROM ` + dl + ` WHERE state <> 'dead'),
       (SELECT min(created_at) FROM ` + dl + ` WHERE state <> 'dead'),
       (SELECT count(*) FROM ` + dl + ` WHERE state = 'dead'),
       ` + mysqlNow
	// The heads (head_idx) that have failed at least once or stop their
	// key, each with the number of deliveries behind it counted on
	// queue_idx alone.
	s.heldKeysSQL = `SELECT d.sink, d.` + key + `, d.topic, d.id, d.seq, d.state, d.attempts, coalesce(d.last_error, ''),
       d.next_at, CASE WHEN d.state = 'dead' THEN d.dead_at ELSE d.queued_at END AS since,
       (SELECT count(*) - 1 FROM ` + dl + ` w WHERE w.queue_key = d.` + key + ` AND w.sink = d.sink) AS behind
FROM ` + dl + ` d
WHERE d.head_key IS NOT NULL AND (d.attempts > 0 OR d.stops_key)
ORDER BY behind DESC, since, d.sink, d.` + key + `
LIMIT ?`
	// A key's heads, one per sink (head_idx), then each queue's first
	// members in seq order (queue_idx), never further than the limit.
	s.keyHeads = `SELECT sink FROM ` + dl + ` WHERE head_key = ? ORDER BY sink`
	s.keyQueue = `SELECT seq, id, topic, state, attempts, coalesce(last_error, ''), next_at, queued_at, dead_at
FROM ` + dl + ` WHERE queue_key = ? AND sink = ? ORDER BY seq LIMIT ?`
	return &Store{db: s, outbox: mt.Outbox(), batchSize: DefaultBatchSize}, nil
}

// pairsTable reads (sink, seq) pairs from one JSON parameter, so that a
// statement's text does not depend on the batch's size.
const pairsTable = `JSON_TABLE(?, '$[*]' COLUMNS (sink VARCHAR(1024) PATH '$.sink', seq BIGINT PATH '$.seq'))`

// filterMarker is where mysqlFilter writes a statement's conditions.
const filterMarker = `/*filter*/`

// seqsMarker is replaced by one ? per seq of a batch.
const seqsMarker = `/*seqs*/`

// mysqlFilter returns stmt with the conditions selecting the dead letters
// (alias d) after p (before it, with before) that match f at its
// filterMarker, and their parameters. A field not set adds no condition:
// MySQL plans "? IS NULL OR ..." for the worst case.
func mysqlFilter(stmt string, f Filter, p position, before bool) (string, []any) {
	op := ">"
	if before {
		op = "<"
	}
	var w strings.Builder
	args := []any{}
	w.WriteString(`d.state = 'dead'`)
	if p.wholeSeq {
		w.WriteString(` AND d.seq ` + op + ` ?`)
		args = append(args, p.seq)
	} else {
		w.WriteString(` AND d.seq ` + op + `= ? AND (d.seq ` + op + ` ? OR d.sink ` + op + ` ?)`)
		args = append(args, p.seq, p.seq, p.sink)
	}
	if len(f.IDs) > 0 {
		w.WriteString(` AND d.id IN (` + placeholders(len(f.IDs)) + `)`)
		for _, id := range f.IDs {
			args = append(args, canonicalID(id))
		}
	}
	cond := func(c string, v any) {
		w.WriteString(` AND ` + c)
		args = append(args, v)
	}
	if f.Topic != "" {
		cond(`d.topic LIKE ?`, TopicLike(f.Topic))
	}
	if f.Key != "" {
		cond(`d.`+"`key`"+` = ?`, f.Key)
	}
	if f.Sink != "" {
		cond(`d.sink = ?`, f.Sink)
	}
	if f.Error != "" {
		cond(`locate(lower(?), lower(d.last_error)) > 0`, f.Error)
	}
	if !f.Since.IsZero() {
		cond(`d.dead_at >= ?`, f.Since.UTC())
	}
	if !f.Until.IsZero() {
		cond(`d.dead_at < ?`, f.Until.UTC())
	}
	if f.OlderThan > 0 {
		cond(`d.dead_at < `+mysqlNow+` - INTERVAL ? MICROSECOND`, f.OlderThan.Microseconds())
	}
	return strings.Replace(stmt, filterMarker, w.String(), 1), args
}

// placeholders returns n ?s, comma separated.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// withSeqs returns stmt with one placeholder per seq at its seqsMarker,
// and the seqs as parameters.
func withSeqs(stmt string, seqs []int64) (string, []any) {
	args := make([]any, len(seqs))
	for i, s := range seqs {
		args[i] = s
	}
	return strings.Replace(stmt, seqsMarker, placeholders(len(seqs)), 1), args
}

// mysqlTime is a nullable DATETIME read as the zero time when NULL.
func mysqlTime(t sql.NullTime) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time
}

func (s *mysqlBackend) page(ctx context.Context, f Filter, p position, limit int, newest bool) ([]DeadLetter, error) {
	stmt := s.list
	if newest {
		stmt = s.listNewest
	}
	stmt, args := mysqlFilter(stmt, f, p, newest)
	rows, err := s.db.QueryContext(ctx, stmt, append(args, limit)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	page := make([]DeadLetter, 0, limit)
	for rows.Next() {
		var d DeadLetter
		if err := rows.Scan(&d.Seq, &d.ID, &d.Topic, &d.Key, &d.Sink, &d.Attempts, &d.CreatedAt, &d.DiedAt, &d.LastError, &d.StopsKey); err != nil {
			return nil, err
		}
		page = append(page, d)
	}
	return page, rows.Err()
}

func (s *mysqlBackend) count(ctx context.Context, f Filter, limit int64) (int64, error) {
	var n int64
	if limit > 0 {
		stmt, args := mysqlFilter(s.countAtMost, f, start, false)
		return n, s.db.QueryRowContext(ctx, stmt, append(args, limit)...).Scan(&n)
	}
	stmt, args := mysqlFilter(s.countAll, f, start, false)
	return n, s.db.QueryRowContext(ctx, stmt, args...).Scan(&n)
}

// show reads from one snapshot: a relay moving the event from the outbox
// to its deliveries in between would otherwise hide it.
func (s *mysqlBackend) show(ctx context.Context, u uuid.UUID) (shown, error) {
	var out shown
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return out, err
	}
	defer tx.Rollback() //nolint:errcheck // read only
	e := &out.event
	var (
		cols                eventColumns
		available, finished sql.NullTime
		status              string
		id                  = u.String()
	)
	err = tx.QueryRowContext(ctx, s.showEvent, id).Scan(&e.Seq, &e.ID, &e.Topic, &e.Key, &status,
		&cols.payload, &cols.payloadBin, &e.ContentType, &cols.headers, &e.CreatedAt, &available,
		&cols.maxAttempts, &finished)
	switch {
	case err == nil:
		out.outbox = status
		e.AvailableAt, e.FinishedAt = mysqlTime(available), mysqlTime(finished)
		out.decoded = cols.fill(e)
	case !errors.Is(err, sql.ErrNoRows):
		return out, err
	}
	e.Deliveries = map[string]Delivery{}
	rows, err := tx.QueryContext(ctx, s.showDeliveries, id)
	if err != nil {
		return out, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			sink, state, topic, key, contentType string
			seq                                  int64
			d                                    Delivery
			created                              time.Time
			next, dead                           sql.NullTime
			headSeq                              sql.NullInt64
			headID, headState                    sql.NullString
			c                                    eventColumns
		)
		if err := rows.Scan(&sink, &seq, &topic, &key, &c.payload, &c.payloadBin, &contentType, &c.headers,
			&created, &c.maxAttempts, &state, &d.StopsKey, &d.Attempts, &next, &d.Error, &d.QueuedAt, &dead,
			&headSeq, &headID, &headState); err != nil {
			return out, err
		}
		d.State, d.NextAt, d.DeadAt = state, mysqlTime(next), mysqlTime(dead)
		if headSeq.Valid {
			d.Head = &QueueHead{Seq: headSeq.Int64, ID: headID.String, State: headState.String}
		}
		e.Deliveries[sink] = d
		if out.outbox == "" && e.ID == "" {
			e.Seq, e.ID, e.Topic, e.Key, e.ContentType, e.CreatedAt = seq, id, topic, key, contentType, created
			out.decoded = c.fill(e)
		}
	}
	if err := rows.Err(); err != nil {
		return out, err
	}
	return out, tx.Commit()
}

// batch runs under the lock of every lane: see backend. The relays find
// the deliveries it makes due at their next poll of the queues: MySQL has
// no notifications.
func (s *mysqlBackend) batch(ctx context.Context, f Filter, p position, n int, replay *ReplayOpts) ([]selected, error) {
	var batch []selected
	err := mysqlstore.InTx(ctx, s.db, func(tx *sql.Tx) error {
		batch = nil
		if err := drain(tx.QueryContext(ctx, s.lockLanes)); err != nil {
			return fmt.Errorf("locking the lanes: %w", err)
		}
		allSinks := replay != nil && replay.AllSinks
		stmt := s.selectBatch
		if allSinks {
			stmt = s.selectQueued
		}
		stmt, args := mysqlFilter(stmt, f, p, false)
		var err error
		if batch, err = s.selectRows(ctx, tx, stmt, append(args, n)...); err != nil || len(batch) == 0 {
			return err
		}
		if replay == nil {
			if _, err := tx.ExecContext(ctx, s.purge, pairsJSON(batch, nil)); err != nil {
				return err
			}
			return s.promote(ctx, tx, purgePlan(batch))
		}
		pairs, routeSeqs := replayPlan(batch, allSinks)
		rejoin := func(x selected) bool { return !allSinks || x.queued }
		if doc := pairsJSON(batch, rejoin); doc != "[]" {
			if _, err := tx.ExecContext(ctx, s.rejoin, doc); err != nil {
				return err
			}
		}
		if len(routeSeqs) > 0 {
			if err := s.routeBack(ctx, tx, routeSeqs, pairs); err != nil {
				return err
			}
		}
		return s.promote(ctx, tx, pairs)
	})
	return batch, err
}

// selectRows reads a batch's dead letters.
func (s *mysqlBackend) selectRows(ctx context.Context, tx *sql.Tx, stmt string, args ...any) ([]selected, error) {
	rows, err := tx.QueryContext(ctx, stmt, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var batch []selected
	for rows.Next() {
		var x selected
		if err := rows.Scan(&x.sink, &x.seq, &x.id, &x.key, &x.stopsKey, &x.queued); err != nil {
			return nil, err
		}
		batch = append(batch, x)
	}
	return batch, rows.Err()
}

// routeBack sends events (seqs) back to the routing step and removes their
// dead letters on the sinks, adding the queues those leave to pairs.
func (s *mysqlBackend) routeBack(ctx context.Context, tx *sql.Tx, seqs []int64, pairs pairSet) error {
	stmt, args := withSeqs(s.route, seqs)
	if _, err := tx.ExecContext(ctx, stmt, args...); err != nil {
		return fmt.Errorf("sending events back to the routing step: %w", err)
	}
	stmt, args = withSeqs(s.sinkDead, seqs)
	rows, err := tx.QueryContext(ctx, stmt, args...)
	if err != nil {
		return fmt.Errorf("removing the dead letters of events sent back to the routing step: %w", err)
	}
	for rows.Next() {
		var (
			sink string
			key  *string
		)
		if err := rows.Scan(&sink, &key); err != nil {
			rows.Close()
			return fmt.Errorf("removing the dead letters of events sent back to the routing step: %w", err)
		}
		pairs.add(key, sink)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("removing the dead letters of events sent back to the routing step: %w", err)
	}
	stmt, args = withSeqs(s.dropSinkDead, seqs)
	if _, err := tx.ExecContext(ctx, stmt, args...); err != nil {
		return fmt.Errorf("removing the dead letters of events sent back to the routing step: %w", err)
	}
	return nil
}

// promote gives each queue in pairs that has deliveries waiting but no
// head a head, with the relay store's statement.
func (s *mysqlBackend) promote(ctx context.Context, tx *sql.Tx, pairs pairSet) error {
	if len(pairs) == 0 {
		return nil
	}
	keys, sinks := pairs.split()
	if err := s.queues.Promote(ctx, tx, keys, sinks); err != nil {
		return fmt.Errorf("making the heads of %d queues: %w", len(pairs), err)
	}
	return nil
}

// pairsJSON is the (sink, seq) pairs of the dead letters of batch that
// keep (all when keep is nil) as pairsTable reads them.
func pairsJSON(batch []selected, keep func(selected) bool) string {
	type pair struct {
		Sink string `json:"sink"`
		Seq  int64  `json:"seq"`
	}
	pairs := make([]pair, 0, len(batch))
	for _, x := range batch {
		if keep == nil || keep(x) {
			pairs = append(pairs, pair{x.sink, x.seq})
		}
	}
	b, _ := json.Marshal(pairs) // strings and numbers always encode
	return string(b)
}

// drain reads a query's rows to the end and closes them.
func drain(rows *sql.Rows, err error) error {
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
	}
	return rows.Err()
}

func (s *mysqlBackend) status(ctx context.Context) (*statusRows, error) {
	out := &statusRows{}
	err := s.each(ctx, "the pending events per topic", s.pending, func(rows *sql.Rows) error {
		var (
			r     pendingRow
			first sql.NullTime
		)
		if err := rows.Scan(&r.topic, &r.n, &first, &out.at); err != nil {
			return err
		}
		r.oldest = mysqlTime(first)
		out.pending = append(out.pending, r)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := s.each(ctx, "the queues", s.queuesByTopic, func(rows *sql.Rows) error {
		var (
			q     queueRow
			first sql.NullTime
		)
		if err := rows.Scan(&q.sink, &q.topic, &q.queued, &first, &q.dead); err != nil {
			return err
		}
		q.oldest = mysqlTime(first)
		out.queues = append(out.queues, q)
		return nil
	}); err != nil {
		return nil, err
	}
	if err := s.each(ctx, "the published counts", s.published, func(rows *sql.Rows) error {
		var p publishedRow
		if err := rows.Scan(&p.sink, &p.topic, &p.n); err != nil {
			return err
		}
		out.published = append(out.published, p)
		return nil
	}); err != nil {
		return nil, err
	}
	if err := s.each(ctx, "the relays", s.relays, func(rows *sql.Rows) error {
		var (
			r      relayRow
			paused string
			lanes  sql.NullString
		)
		if err := rows.Scan(&r.owner, &r.started, &r.config, &r.since, &paused, &r.claiming, &lanes); err != nil {
			return err
		}
		// '1000-01-01' stands for PostgreSQL's -infinity (the migration).
		if r.since.Year() <= 1000 {
			r.since = time.Time{}
		}
		if err := json.Unmarshal([]byte(paused), &r.paused); err != nil {
			return fmt.Errorf("relay %s: paused_sinks column: %w", r.owner, err)
		}
		for l := range strings.SplitSeq(lanes.String, ",") {
			if l == "" {
				continue
			}
			n, err := strconv.ParseInt(l, 10, 16)
			if err != nil {
				return fmt.Errorf("relay %s: lane %q: %w", r.owner, l, err)
			}
			r.lanes = append(r.lanes, int16(n))
		}
		out.relays = append(out.relays, r)
		return nil
	}); err != nil {
		return nil, err
	}
	if out.at.IsZero() {
		if err := s.db.QueryRowContext(ctx, `SELECT `+mysqlNow).Scan(&out.at); err != nil {
			return nil, fmt.Errorf("the time: %w", err)
		}
	}
	return out, nil
}

// each runs a query and calls fn for each of its rows.
func (s *mysqlBackend) each(ctx context.Context, what, query string, fn func(*sql.Rows) error, args ...any) error {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func (s *mysqlBackend) totals(ctx context.Context) (totalsRow, error) {
	var (
		t                     totalsRow
		oldPending, oldQueued sql.NullTime
	)
	if err := s.db.QueryRowContext(ctx, s.total).Scan(&t.pending, &oldPending, &t.queued, &oldQueued, &t.dead, &t.now); err != nil {
		return t, err
	}
	t.oldestPending, t.oldestQueued = mysqlTime(oldPending), mysqlTime(oldQueued)
	return t, nil
}

func (s *mysqlBackend) heldKeys(ctx context.Context, limit int) ([]HeldKey, error) {
	out := []HeldKey{}
	err := s.each(ctx, "the held keys", s.heldKeysSQL, func(rows *sql.Rows) error {
		var (
			h    HeldKey
			next sql.NullTime
		)
		if err := rows.Scan(&h.Sink, &h.Key, &h.Topic, &h.HeadID, &h.HeadSeq, &h.HeadState, &h.Attempts,
			&h.LastError, &next, &h.Since, &h.Behind); err != nil {
			return err
		}
		h.NextAt = mysqlTime(next)
		out = append(out, h)
		return nil
	}, limit)
	return out, err
}

// keyQueues reads the key's heads, then each queue, in one REPEATABLE READ
// snapshot; a key has a queue on few sinks.
func (s *mysqlBackend) keyQueues(ctx context.Context, key string, limit int) (map[string][]KeyDelivery, error) {
	out := map[string][]KeyDelivery{}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // read only
	rows, err := tx.QueryContext(ctx, s.keyHeads, key)
	if err != nil {
		return nil, err
	}
	var sinks []string
	for rows.Next() {
		var sink string
		if err := rows.Scan(&sink); err != nil {
			rows.Close()
			return nil, err
		}
		sinks = append(sinks, sink)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, sink := range sinks {
		rows, err := tx.QueryContext(ctx, s.keyQueue, key, sink, limit)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var (
				d          KeyDelivery
				next, dead sql.NullTime
			)
			if err := rows.Scan(&d.Seq, &d.ID, &d.Topic, &d.State, &d.Attempts, &d.Error, &next, &d.QueuedAt, &dead); err != nil {
				rows.Close()
				return nil, err
			}
			d.NextAt, d.DeadAt = mysqlTime(next), mysqlTime(dead)
			out[sink] = append(out[sink], d)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, tx.Commit()
}
