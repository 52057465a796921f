package deadletter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay/internal/queue"
)

// DB is what the PostgreSQL store needs from a connection pool;
// *pgxpool.Pool has it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// postgres is the backend on PostgreSQL: its statements, built once from
// the quoted table names.
type postgres struct {
	db     DB
	tables migrations.Tables

	listSQL, countSQL, pagePlanSQL      string
	listNewestSQL, countAtMostSQL       string
	countPlanSQL                        string
	showSetupSQL, showEventSQL          string
	showDeliveriesSQL, nowSQL           string
	lockLanesSQL, notifySQL             string
	replaySQL, routeSQL                 string
	dropSinkDeadSQL, purgeSQL           string
	promoteSQL                          string
	statusPendingSQL, statusQueuesSQL   string
	statusPublishedSQL, statusRelaysSQL string
	backlogSQL                          string
	heldKeysSQL, keyQueuesSQL           string
}

// New returns a Store on PostgreSQL for the tables t (defaults filled in).
func New(db DB, t migrations.Tables) (*Store, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	o, dl, l := t.Outbox(), t.Deliveries(), t.Lanes()
	s := &postgres{db: db, tables: t}
	s.listSQL = `SELECT d.seq, d.id::text, d.topic, coalesce(d.key, ''), d.sink, d.attempts, d.created_at, d.dead_at,
       coalesce(d.last_error, ''), d.stops_key
FROM ` + dl + ` d WHERE ` + filterSQL + `
ORDER BY d.seq, d.sink LIMIT $11`
	// The same walking the index backwards, from the newest.
	s.listNewestSQL = `SELECT d.seq, d.id::text, d.topic, coalesce(d.key, ''), d.sink, d.attempts, d.created_at, d.dead_at,
       coalesce(d.last_error, ''), d.stops_key
FROM ` + dl + ` d WHERE ` + filterBeforeSQL + `
ORDER BY d.seq DESC, d.sink DESC LIMIT $11`
	s.countSQL = `SELECT count(*) FROM ` + dl + ` d WHERE ` + filterSQL
	s.countAtMostSQL = `SELECT count(*) FROM (SELECT FROM ` + dl + ` d WHERE ` + filterSQL + ` LIMIT $11) m`
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
FROM ` + o + ` WHERE id = $1`
	// Each delivery of the event, and for one waiting in its key's queue,
	// the head it waits behind (one probe of the unique head index).
	s.showDeliveriesSQL = `SELECT d.sink, d.seq, d.topic, coalesce(d.key, ''), d.payload::text, d.payload_bin,
       coalesce(d.content_type, ''), d.headers, d.created_at, d.max_attempts,
       d.state, d.stops_key, d.attempts, d.next_at, coalesce(d.last_error, ''), d.queued_at, d.dead_at,
       h.seq, h.id::text, h.state
FROM ` + dl + ` d
LEFT JOIN LATERAL (
    SELECT x.seq, x.id, x.state FROM ` + dl + ` x
    WHERE d.state = 'waiting' AND x.key = d.key AND x.sink = d.sink AND (x.state = 'ready' OR x.stops_key)
) h ON true
WHERE d.id = $1
ORDER BY d.sink`
	s.nowSQL = `SELECT now()`
	// Every lane, in lane order (the order relays take theirs in share
	// mode): a batch waits for the records in flight and holds off new
	// ones until it commits.
	s.lockLanesSQL = `SELECT lane FROM ` + l + ` ORDER BY lane FOR NO KEY UPDATE`
	s.notifySQL = `SELECT pg_notify($1, '` + queue.Notification + `')`
	// One batch of a replay: the next dead letters, locked ($1 to $10 the
	// filter, $11 the batch size), rejoin their queues, unless $12 sends
	// them to the routing step instead (see Replay). queued says whether
	// the event still has a delivery that is not dead on a sink, which
	// keeps it out of the routing step. A rejoining dead letter waits,
	// none is a head yet (promoteSQL makes the heads next), so the unique
	// head index never sees two heads of a queue, even for a moment; one
	// without a key is a queue of its own, due at once. The batch drives
	// the update, row by row through the primary key.
	s.replaySQL = `WITH sel AS (
    SELECT d.sink, d.seq, d.id, d.key, d.stops_key,
           $12::boolean AND EXISTS (
               SELECT 1 FROM ` + dl + ` x WHERE x.id = d.id AND x.sink <> '' AND x.state <> 'dead') AS queued
    FROM ` + dl + ` d WHERE ` + filterSQL + `
    ORDER BY d.seq, d.sink LIMIT $11
    FOR UPDATE OF d
), rejoin AS (
    UPDATE ` + dl + ` d
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
	s.routeSQL = `INSERT INTO ` + dl + ` AS r (sink, seq, lane, id, topic, key, payload, payload_bin, content_type,
    headers, created_at, max_attempts, state, stops_key, attempts, next_at, last_error, queued_at, dead_at)
SELECT DISTINCT ON (d.seq) '', d.seq, d.lane, d.id, d.topic, d.key, d.payload, d.payload_bin, d.content_type,
       d.headers, d.created_at, d.max_attempts,
       CASE WHEN d.key IS NULL THEN 'ready' ELSE 'waiting' END, false, 0,
       CASE WHEN d.key IS NULL THEN now() END, NULL, now(), NULL
FROM ` + dl + ` d
WHERE d.seq = ANY($1::bigint[]) AND d.state = 'dead'
ORDER BY d.seq, d.sink
ON CONFLICT (sink, seq) DO UPDATE
SET state = excluded.state, next_at = excluded.next_at, stops_key = false, attempts = 0,
    last_error = NULL, dead_at = NULL, queued_at = now()
WHERE r.state = 'dead'`
	// The dead letters of events gone back to the routing step ($1 seqs),
	// on every sink: the routing step sends the event to each sink of its
	// route again.
	s.dropSinkDeadSQL = `DELETE FROM ` + dl + ` d
WHERE d.seq = ANY($1::bigint[]) AND d.sink <> '' AND d.state = 'dead'
RETURNING d.sink, d.key`
	s.purgeSQL = `WITH sel AS (
    SELECT d.sink, d.seq FROM ` + dl + ` d WHERE ` + filterSQL + `
    ORDER BY d.seq, d.sink LIMIT $11
    FOR UPDATE OF d
)
DELETE FROM ` + dl + ` d USING sel
WHERE d.sink = sel.sink AND d.seq = sel.seq
RETURNING d.sink, d.seq, d.id::text, d.key, d.stops_key`
	// Every lane is locked by the operation: no fence on the promoted rows.
	s.promoteSQL = queue.PromoteSQL(t, "")
	s.initStatus()
	s.initHeld()
	return &Store{db: s, outbox: t.Outbox(), batchSize: DefaultBatchSize}, nil
}

// filterSQL selects dead letters (alias d) after ($1 seq, $2 sink)
// matching the filter parameters $3 to $10 (NULL means no condition). Its
// first two conditions are those of the dead-letter index.
const filterSQL = `d.state = 'dead' AND (d.seq, d.sink) > ($1::bigint, $2::text)
  AND ($3::uuid[] IS NULL OR d.id = ANY($3::uuid[]))
  AND ($4::text IS NULL OR d.topic LIKE $4::text)
  AND ($5::text IS NULL OR d.key = $5::text)
  AND ($6::text IS NULL OR d.sink = $6::text)
  AND ($7::text IS NULL OR strpos(lower(d.last_error), lower($7::text)) > 0)
  AND ($8::timestamptz IS NULL OR d.dead_at >= $8::timestamptz)
  AND ($9::timestamptz IS NULL OR d.dead_at < $9::timestamptz)
  AND ($10::interval IS NULL OR d.dead_at < now() - $10::interval)`

// filterBeforeSQL is filterSQL selecting the dead letters before ($1 seq,
// $2 sink), for a list from the newest.
var filterBeforeSQL = strings.Replace(filterSQL, "(d.seq, d.sink) > (", "(d.seq, d.sink) < (", 1)

// pgArgs returns the filter's statement parameters $1 to $10, after p. A
// NULL sink is after every dead letter of seq (a row comparison with a
// NULL member stops there, and the dead-letter index honours it).
func pgArgs(f Filter, p position) []any {
	args := make([]any, 10, 12)
	args[0], args[1] = p.seq, pgtype.Text{String: p.sink, Valid: !p.wholeSeq}
	if len(f.IDs) > 0 {
		ids := make([]pgtype.UUID, len(f.IDs))
		for i, id := range f.IDs {
			u, _ := uuid.Parse(id) // checked by Validate
			ids[i] = pgtype.UUID{Bytes: u, Valid: true}
		}
		args[2] = ids
	}
	args[3] = optText(TopicLike(f.Topic))
	args[4] = optText(f.Key)
	args[5] = optText(f.Sink)
	args[6] = optText(f.Error)
	args[7] = optTime(f.Since)
	args[8] = optTime(f.Until)
	if f.OlderThan > 0 {
		args[9] = f.OlderThan
	}
	return args
}

func optText(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }

func optTime(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()} }

func (s *postgres) page(ctx context.Context, f Filter, after position, limit int, newest bool) ([]DeadLetter, error) {
	page := make([]DeadLetter, 0, limit)
	sql := s.listSQL
	if newest {
		sql = s.listNewestSQL
	}
	err := s.inPage(ctx, f, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sql, append(pgArgs(f, after), limit)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				d             DeadLetter
				attempts      int32
				created, died pgtype.Timestamptz
			)
			if err := rows.Scan(&d.Seq, &d.ID, &d.Topic, &d.Key, &d.Sink, &attempts, &created, &died, &d.LastError, &d.StopsKey); err != nil {
				return err
			}
			d.Attempts, d.CreatedAt, d.DiedAt = int(attempts), jsonTime(created), jsonTime(died)
			page = append(page, d)
		}
		return rows.Err()
	})
	return page, err
}

// inPage runs one page's statements in their own short transaction,
// planned to walk the dead-letter index unless f selects by id.
func (s *postgres) inPage(ctx context.Context, f Filter, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if len(f.IDs) == 0 {
			if _, err := tx.Exec(ctx, s.pagePlanSQL); err != nil {
				return err
			}
		}
		return fn(tx)
	})
}

// count runs in its own short transaction, planned to walk the dead-letter
// index (reading only dead letters' rows, not the queued deliveries around
// them) unless f selects by id.
func (s *postgres) count(ctx context.Context, f Filter, limit int64) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if len(f.IDs) == 0 {
			if _, err := tx.Exec(ctx, s.countPlanSQL); err != nil {
				return err
			}
		}
		if limit > 0 {
			return tx.QueryRow(ctx, s.countAtMostSQL, append(pgArgs(f, start), limit)...).Scan(&n)
		}
		return tx.QueryRow(ctx, s.countSQL, pgArgs(f, start)...).Scan(&n)
	})
	return n, err
}

func (s *postgres) show(ctx context.Context, u uuid.UUID) (shown, error) {
	arg := pgtype.UUID{Bytes: u, Valid: true}
	var out shown
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		out = shown{}
		e := &out.event
		if _, err := tx.Exec(ctx, s.showSetupSQL); err != nil {
			return err
		}
		var (
			cols                      eventColumns
			created, available, finis pgtype.Timestamptz
		)
		err := tx.QueryRow(ctx, s.showEventSQL, arg).Scan(&e.Seq, &e.ID, &e.Topic, &e.Key, &out.outbox,
			&cols.payload, &cols.payloadBin, &e.ContentType, &cols.headers, &created, &available,
			&cols.maxAttempts, &finis)
		switch {
		case err == nil:
			e.CreatedAt, e.AvailableAt, e.FinishedAt = jsonTime(created), jsonTime(available), jsonTime(finis)
			out.decoded = cols.fill(e)
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		e.Deliveries = map[string]Delivery{}
		rows, err := tx.Query(ctx, s.showDeliveriesSQL, arg)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				sink, state, topic, key, contentType string
				seq                                  int64
				d                                    Delivery
				attempts                             int32
				created, next, queued, dead          pgtype.Timestamptz
				headSeq                              pgtype.Int8
				headID, headState                    pgtype.Text
				c                                    eventColumns
			)
			if err := rows.Scan(&sink, &seq, &topic, &key, &c.payload, &c.payloadBin, &contentType, &c.headers,
				&created, &c.maxAttempts, &state, &d.StopsKey, &attempts, &next, &d.Error, &queued, &dead,
				&headSeq, &headID, &headState); err != nil {
				return err
			}
			d.State, d.Attempts = state, int(attempts)
			d.NextAt, d.QueuedAt, d.DeadAt = jsonTime(next), jsonTime(queued), jsonTime(dead)
			if headSeq.Valid {
				d.Head = &QueueHead{Seq: headSeq.Int64, ID: headID.String, State: headState.String}
			}
			e.Deliveries[sink] = d
			if out.outbox == "" && e.ID == "" {
				e.Seq, e.ID, e.Topic, e.Key, e.ContentType, e.CreatedAt = seq, u.String(), topic, key, contentType, jsonTime(created)
				out.decoded = c.fill(e)
			}
		}
		return rows.Err()
	})
	return out, err
}

// jsonTime is a timestamp read from a row as a time JSON and RFC 3339 can
// carry, years 1 to 9999: a row written by hand may hold 'infinity' or a
// date past year 9999, and one such row must not break a listing. Those
// are clamped to the nearest end of the range; NULL is the zero time.
func jsonTime(t pgtype.Timestamptz) time.Time {
	switch {
	case !t.Valid || t.InfinityModifier == pgtype.NegativeInfinity || t.Time.Year() < 1:
		return time.Time{}
	case t.InfinityModifier == pgtype.Infinity || t.Time.Year() > 9999:
		return time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
	}
	return t.Time
}

// batch runs under the lock of every lane: see backend.
func (s *postgres) batch(ctx context.Context, f Filter, p position, n int, replay *ReplayOpts) ([]selected, error) {
	var batch []selected
	err := s.inPage(ctx, f, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.lockLanesSQL); err != nil {
			return fmt.Errorf("locking the lanes: %w", err)
		}
		var err error
		if replay != nil {
			batch, err = s.replay(ctx, tx, f, p, n, replay.AllSinks)
		} else {
			batch, err = s.purge(ctx, tx, f, p, n)
		}
		if err != nil || len(batch) == 0 {
			return err
		}
		_, err = tx.Exec(ctx, s.notifySQL, s.tables.Channel())
		return err
	})
	return batch, err
}

// replay replays the next n dead letters after p matching f: they rejoin
// their queues, or (allSinks) their events go back to the routing step.
func (s *postgres) replay(ctx context.Context, tx pgx.Tx, f Filter, p position, n int, allSinks bool) ([]selected, error) {
	rows, err := tx.Query(ctx, s.replaySQL, append(pgArgs(f, p), n, allSinks)...)
	if err != nil {
		return nil, err
	}
	batch := make([]selected, 0, n)
	var x selected
	if _, err := pgx.ForEachRow(rows, []any{&x.sink, &x.seq, &x.id, &x.key, &x.stopsKey, &x.queued}, func() error {
		batch = append(batch, x)
		return nil
	}); err != nil {
		return nil, err
	}
	pairs, routeSeqs := replayPlan(batch, allSinks)
	if len(routeSeqs) > 0 {
		// The routing step's delivery is copied from the dead letters,
		// which go after it.
		if _, err := tx.Exec(ctx, s.routeSQL, routeSeqs); err != nil {
			return nil, fmt.Errorf("sending events back to the routing step: %w", err)
		}
		rows, err := tx.Query(ctx, s.dropSinkDeadSQL, routeSeqs)
		if err != nil {
			return nil, fmt.Errorf("removing the dead letters of events sent back to the routing step: %w", err)
		}
		var (
			sink string
			key  *string
		)
		if _, err := pgx.ForEachRow(rows, []any{&sink, &key}, func() error {
			pairs.add(key, sink)
			return nil
		}); err != nil {
			return nil, fmt.Errorf("removing the dead letters of events sent back to the routing step: %w", err)
		}
	}
	return batch, s.promote(ctx, tx, pairs)
}

// purge deletes the next n dead letters after p matching f and lets the
// queues they stopped move on.
func (s *postgres) purge(ctx context.Context, tx pgx.Tx, f Filter, p position, n int) ([]selected, error) {
	rows, err := tx.Query(ctx, s.purgeSQL, append(pgArgs(f, p), n)...)
	if err != nil {
		return nil, err
	}
	batch := make([]selected, 0, n)
	var x selected
	if _, err := pgx.ForEachRow(rows, []any{&x.sink, &x.seq, &x.id, &x.key, &x.stopsKey}, func() error {
		batch = append(batch, x)
		return nil
	}); err != nil {
		return nil, err
	}
	return batch, s.promote(ctx, tx, purgePlan(batch))
}

// promote gives each queue in pairs that has deliveries waiting but no
// head a head: its lowest waiting delivery, due at once.
func (s *postgres) promote(ctx context.Context, tx pgx.Tx, pairs pairSet) error {
	if len(pairs) == 0 {
		return nil
	}
	keys, sinks := pairs.split()
	if _, err := tx.Exec(ctx, s.promoteSQL, keys, sinks); err != nil {
		return fmt.Errorf("making the heads of %d queues: %w", len(pairs), err)
	}
	return nil
}

func (s *postgres) initHeld() {
	dl := s.tables.Deliveries()
	// The heads (head_idx: one per key and sink) that have failed at least
	// once or stop their key, each with the number of deliveries behind it:
	// the members of its queue but itself, counted on the queue index
	// alone (an index-only scan: testing state = 'waiting' instead would
	// read every waiting row, ten times the buffers on 100,000 of them).
	// Every failing head's queue is counted before the sort: "most behind
	// first" needs all of them; their number is that of keys whose head
	// fails, not of events.
	s.heldKeysSQL = `SELECT d.sink, d.key, d.topic, d.id::text, d.seq, d.state, d.attempts, coalesce(d.last_error, ''),
       d.next_at, CASE WHEN d.state = 'dead' THEN d.dead_at ELSE d.queued_at END AS since, b.n
FROM ` + dl + ` d
CROSS JOIN LATERAL (
    SELECT count(*) - 1 AS n FROM ` + dl + ` w
    WHERE w.key = d.key AND w.sink = d.sink AND ` + queue.On(queue.Member, "w") + `
) b
WHERE d.key IS NOT NULL AND ` + queue.Head + ` AND (d.attempts > 0 OR d.stops_key)
ORDER BY b.n DESC, since, d.sink, d.key
LIMIT $1`
	// A key's queues: its heads (one per sink, head_idx), then for each
	// the first $2 members of the queue in seq order (queue_idx), which
	// never reads further into a long queue than the limit.
	s.keyQueuesSQL = `SELECT h.sink, q.seq, q.id::text, q.topic, q.state, q.attempts, coalesce(q.last_error, ''),
       q.next_at, q.queued_at, q.dead_at
FROM ` + dl + ` h
CROSS JOIN LATERAL (
    SELECT d.seq, d.id, d.topic, d.state, d.attempts, d.last_error, d.next_at, d.queued_at, d.dead_at
    FROM ` + dl + ` d
    WHERE d.key = h.key AND d.sink = h.sink AND ` + queue.Member + `
    ORDER BY d.seq LIMIT $2
) q
WHERE h.key = $1 AND ` + queue.On(queue.Head, "h") + `
ORDER BY h.sink, q.seq`
}

func (s *postgres) heldKeys(ctx context.Context, limit int) ([]HeldKey, error) {
	out := []HeldKey{}
	err := s.inPlan(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.heldKeysSQL, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				h           HeldKey
				attempts    int32
				next, since pgtype.Timestamptz
			)
			if err := rows.Scan(&h.Sink, &h.Key, &h.Topic, &h.HeadID, &h.HeadSeq, &h.HeadState, &attempts,
				&h.LastError, &next, &since, &h.Behind); err != nil {
				return err
			}
			h.Attempts, h.NextAt, h.Since = int(attempts), jsonTime(next), jsonTime(since)
			out = append(out, h)
		}
		return rows.Err()
	})
	return out, err
}

func (s *postgres) keyQueues(ctx context.Context, key string, limit int) (map[string][]KeyDelivery, error) {
	out := map[string][]KeyDelivery{}
	err := s.inPlan(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.keyQueuesSQL, key, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				sink               string
				d                  KeyDelivery
				attempts           int32
				next, queued, dead pgtype.Timestamptz
			)
			if err := rows.Scan(&sink, &d.Seq, &d.ID, &d.Topic, &d.State, &attempts, &d.Error, &next, &queued, &dead); err != nil {
				return err
			}
			d.Attempts, d.NextAt, d.QueuedAt, d.DeadAt = int(attempts), jsonTime(next), jsonTime(queued), jsonTime(dead)
			out[sink] = append(out[sink], d)
		}
		return rows.Err()
	})
	return out, err
}

// inPlan runs fn in a short read transaction planned to stay on the
// indexes, as a page of dead letters is (see pagePlanSQL): the deliveries
// table's statistics may be those of an empty table.
func (s *postgres) inPlan(ctx context.Context, fn func(pgx.Tx) error) error {
	return s.inPage(ctx, Filter{}, fn)
}

func (s *postgres) initStatus() {
	o, dl, st := s.tables.Outbox(), s.tables.Deliveries(), s.tables.Stats()
	// The oldest pending event is the oldest due one: an event written
	// with a delay is not late before its time.
	s.statusPendingSQL = `SELECT topic, count(*), min(created_at) FILTER (WHERE isfinite(created_at) AND available_at <= now()), now()
FROM ` + o + ` WHERE status = 'pending'
GROUP BY topic`
	// The queues per sink and topic: deliveries waiting (ready or waiting)
	// with their oldest event, and dead letters.
	s.statusQueuesSQL = `SELECT sink, topic,
       count(*) FILTER (WHERE state <> 'dead'),
       min(created_at) FILTER (WHERE state <> 'dead' AND isfinite(created_at)),
       count(*) FILTER (WHERE state = 'dead')
FROM ` + dl + `
GROUP BY sink, topic`
	// Published in the last minute, estimated from per-minute counts as a
	// sliding window: the current minute counts whole, the previous one in
	// proportion to the part of it still inside the window.
	// The live relays (a row per claim loop), with whether each runs the
	// newest configuration: only those claim.
	s.statusRelaysSQL = `WITH live AS (SELECT * FROM ` + s.tables.Relays() + ` WHERE heartbeat_until > now())
SELECT owner, started_at, config, config_since, paused_sinks,
       config = (SELECT config FROM live ORDER BY config_since DESC, config LIMIT 1),
       ARRAY(SELECT lane FROM ` + s.tables.Lanes() + ` l WHERE l.owner = live.owner AND l.lease_until > now() ORDER BY lane)
FROM live ORDER BY owner`
	s.statusPublishedSQL = `SELECT sink, topic, sum(published * CASE
           WHEN minute >= date_trunc('minute', now()) THEN 1
           ELSE 1 - extract(epoch FROM now() - date_trunc('minute', now())) / 60 END)::float8
FROM ` + st + `
WHERE minute >= date_trunc('minute', now()) - interval '1 minute'
GROUP BY sink, topic`
	s.backlogSQL = `SELECT (SELECT count(*) FROM ` + o + ` WHERE status = 'pending'),
       (SELECT min(created_at) FROM ` + o + ` WHERE status = 'pending' AND isfinite(created_at) AND available_at <= now()),
       (SELECT count(*) FROM ` + dl + ` WHERE state <> 'dead'),
       (SELECT min(created_at) FROM ` + dl + ` WHERE state <> 'dead' AND isfinite(created_at)),
       (SELECT count(*) FROM ` + dl + ` WHERE state = 'dead'),
       now()`
}

func (s *postgres) status(ctx context.Context) (*statusRows, error) {
	out := &statusRows{}
	valid := func(t pgtype.Timestamptz) time.Time {
		if !t.Valid {
			return time.Time{}
		}
		return t.Time
	}
	rows, err := s.db.Query(ctx, s.statusPendingSQL)
	if err != nil {
		return nil, fmt.Errorf("the pending events per topic: %w", err)
	}
	var (
		r     pendingRow
		first pgtype.Timestamptz
	)
	if _, err := pgx.ForEachRow(rows, []any{&r.topic, &r.n, &first, &out.at}, func() error {
		r.oldest = valid(first)
		out.pending = append(out.pending, r)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("the pending events per topic: %w", err)
	}
	if rows, err = s.db.Query(ctx, s.statusQueuesSQL); err != nil {
		return nil, fmt.Errorf("the queues: %w", err)
	}
	var q queueRow
	if _, err := pgx.ForEachRow(rows, []any{&q.sink, &q.topic, &q.queued, &first, &q.dead}, func() error {
		q.oldest = valid(first)
		out.queues = append(out.queues, q)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("the queues: %w", err)
	}
	if rows, err = s.db.Query(ctx, s.statusPublishedSQL); err != nil {
		return nil, fmt.Errorf("the published counts: %w", err)
	}
	var p publishedRow
	if _, err := pgx.ForEachRow(rows, []any{&p.sink, &p.topic, &p.n}, func() error {
		out.published = append(out.published, p)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("the published counts: %w", err)
	}
	if rows, err = s.db.Query(ctx, s.statusRelaysSQL); err != nil {
		return nil, fmt.Errorf("the relays: %w", err)
	}
	var (
		rr    relayRow
		since pgtype.Timestamptz // -infinity: announced by a relay from before the column
	)
	if _, err := pgx.ForEachRow(rows, []any{&rr.owner, &rr.started, &rr.config, &since, &rr.paused, &rr.claiming, &rr.lanes}, func() error {
		rr.since = time.Time{}
		if since.Valid && since.InfinityModifier == pgtype.Finite {
			rr.since = since.Time
		}
		out.relays = append(out.relays, rr)
		rr.paused, rr.lanes = nil, nil // the next row's own
		return nil
	}); err != nil {
		return nil, fmt.Errorf("the relays: %w", err)
	}
	if out.at.IsZero() {
		if err := s.db.QueryRow(ctx, s.nowSQL).Scan(&out.at); err != nil {
			return nil, fmt.Errorf("the time: %w", err)
		}
	}
	return out, nil
}

func (s *postgres) totals(ctx context.Context) (totalsRow, error) {
	var (
		t                     totalsRow
		oldPending, oldQueued pgtype.Timestamptz
	)
	if err := s.db.QueryRow(ctx, s.backlogSQL).Scan(&t.pending, &oldPending, &t.queued, &oldQueued, &t.dead, &t.now); err != nil {
		return t, err
	}
	if oldPending.Valid {
		t.oldestPending = oldPending.Time
	}
	if oldQueued.Valid {
		t.oldestQueued = oldQueued.Time
	}
	return t, nil
}
