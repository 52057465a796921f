package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"math/bits"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/migrations"
)

// laneCount is the number of lanes the key space is hashed into. It matches
// the rows seeded by the migration and the bit mask the claim tests.
const laneCount = 64

// laneSQL is an event's lane: its key's hash, or its id's when it has no key.
// It is the claim index's last column (migration 003), written exactly as
// there so that the planner matches it.
const laneSQL = `(hashtext(coalesce(key, id::text)) & 63)`

// store holds every SQL statement the engine runs. Statements are built once
// from the quoted table names; pgx prepares and caches them per connection.
type store struct {
	pool  *pgxpool.Pool
	owner string

	claimSQL, deleteSQL, recordSQL, markDoneSQL string
	heartbeatSQL, liveSQL, renewSQL, releaseSQL string
	acquireSQL, releaseAllSQL, unregisterSQL    string
	cleanHoldsSQL, cleanRelaysSQL               string
	purgeDoneSQL                                string
	statsSQL, statsCleanSQL                     string
	outboxName, vacuumSQL                       string
}

func newStore(pool *pgxpool.Pool, t migrations.Tables, owner string) *store {
	o, h, l, r, st := t.Outbox(), t.Holds(), t.Lanes(), t.Relays(), t.Stats()
	// Writes are fenced by lane: a relay records only events of lanes it
	// still holds. The lanes are locked in share mode, so a relay taking one
	// over waits for the record in flight, and a record after the takeover
	// leaves the lane's events to their new owner.
	ownLane := laneSQL + ` = ANY(ARRAY(SELECT lane FROM ` + l + ` WHERE owner = $2 FOR SHARE))`
	return &store{
		pool:  pool,
		owner: owner,
		// The claim: the oldest due rows of this relay's lanes, locked with
		// SKIP LOCKED so that it never waits on a row another transaction
		// holds, returned with any hold an earlier event of the same key has
		// on a sink. It writes nothing: the lanes are the lease. Only the
		// owner of a lane claims its events, one batch at a time, and a relay
		// taking over an expired lane waits until its previous owner's
		// batches are over (worker.quarantine). Leasing each row as well
		// cost a new row version per event, and a third of the drain rate
		// (docs/benchmarks.md). Rows still leased by a relay of an earlier
		// version (lease_until in the future) are left to it.
		//
		// Three details keep the plan right. The lane range ($4..$5, the
		// lowest and highest lane held) matches the claim index's last
		// column, so rows of other relays' lanes are skipped on the index
		// entry without a heap fetch, and the walk stays in (available_at,
		// seq) order (PostgreSQL 15 would give that order up for
		// "lane = ANY(...)"). The exact lane test is written "<> 0"
		// (estimated as passing most rows, so the planner keeps that walk
		// instead of sorting the pending set).
		claimSQL: `WITH claimed AS (
    SELECT seq, id, topic, key, payload, payload_bin, content_type, headers,
           created_at, attempts, max_attempts, deliveries
    FROM ` + o + `
    WHERE status = 'pending' AND available_at <= now()
      AND ` + laneSQL + ` BETWEEN $4 AND $5
      AND (lease_until IS NULL OR lease_until < now())
      AND (($1::bigint >> ` + laneSQL + `) & 1) <> 0
    ORDER BY available_at, seq
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
SELECT c.seq, c.id, c.topic, c.key, c.payload, c.payload_bin, c.content_type, c.headers,
       c.created_at, c.attempts, c.max_attempts, c.deliveries, w.sink, w.seq, w.until
FROM claimed c
-- Per sink, the nearest earlier event of the key that waits on that sink
-- and is not in this batch (those in the batch are ordered by the batch).
-- The EXISTS is evaluated once per claim: with no holds at all (the common
-- case) the lookups never run.
LEFT JOIN LATERAL (
    SELECT s.sink, n.seq, n.until
    FROM unnest($3::text[]) AS s(sink)
    CROSS JOIN LATERAL (
        SELECT x.seq, x.until FROM ` + h + ` x
        WHERE x.key = c.key AND x.sink = s.sink AND x.seq < c.seq
          AND x.seq <> ALL (ARRAY(SELECT seq FROM claimed))
        ORDER BY x.seq DESC LIMIT 1
    ) n
    WHERE EXISTS (SELECT 1 FROM ` + h + `)
) w ON true
ORDER BY c.seq`,
		deleteSQL:   `DELETE FROM ` + o + ` WHERE seq = ANY($1) AND ` + ownLane,
		markDoneSQL: `UPDATE ` + o + ` SET status = 'done', finished_at = now() WHERE seq = ANY($1) AND ` + ownLane,
		// Everything but the plain happy path in one statement: rows still
		// pending or dead, holds taken (only for rows of lanes this relay
		// still holds), holds released, and delivered rows removed or kept;
		// fenced by lane like the above, the lanes locked once.
		recordSQL: `WITH mine AS (
    SELECT lane FROM ` + l + ` WHERE owner = $7 FOR SHARE
), upd AS (
    UPDATE ` + o + ` o SET status = u.status, attempts = u.attempts, available_at = u.available_at,
        last_error = u.last_error, deliveries = u.deliveries,
        finished_at = CASE WHEN u.status = 'pending' THEN NULL ELSE now() END
    FROM unnest($1::bigint[], $2::text[], $3::int[], $4::timestamptz[], $5::text[], $6::jsonb[])
        AS u(seq, status, attempts, available_at, last_error, deliveries)
    WHERE o.seq = u.seq AND ` + laneSQL + ` IN (SELECT lane FROM mine)
    RETURNING o.seq
), take AS (
    INSERT INTO ` + h + ` (key, sink, seq, until)
    SELECT t.key, t.sink, t.seq, t.until
    FROM unnest($8::text[], $9::text[], $10::bigint[], $11::timestamptz[]) AS t(key, sink, seq, until)
    WHERE t.seq IN (SELECT seq FROM upd)
    ON CONFLICT (key, sink, seq) DO UPDATE SET until = excluded.until
    RETURNING 1
), free AS (
    DELETE FROM ` + h + ` x USING unnest($12::text[], $13::text[], $14::bigint[]) AS f(key, sink, seq)
    WHERE x.key = f.key AND x.sink = f.sink AND x.seq = f.seq
    RETURNING 1
), gone AS (
    DELETE FROM ` + o + ` WHERE seq = ANY($15) AND ` + laneSQL + ` IN (SELECT lane FROM mine) AND NOT $16::boolean
    RETURNING 1
), kept AS (
    UPDATE ` + o + ` SET status = 'done', finished_at = now()
    WHERE seq = ANY($15) AND ` + laneSQL + ` IN (SELECT lane FROM mine) AND $16::boolean
    RETURNING 1
)
SELECT (SELECT count(*) FROM upd), (SELECT count(*) FROM take), (SELECT count(*) FROM free),
       (SELECT count(*) FROM gone) + (SELECT count(*) FROM kept)`,
		heartbeatSQL: `INSERT INTO ` + r + ` (owner, heartbeat_until) VALUES ($1, now() + $2::interval)
ON CONFLICT (owner) DO UPDATE SET heartbeat_until = excluded.heartbeat_until`,
		// The live relays, and how many of them sort before this one: its
		// rank picks its block of lanes.
		liveSQL:    `SELECT count(*), count(*) FILTER (WHERE owner < $1) FROM ` + r + ` WHERE heartbeat_until > now()`,
		renewSQL:   `UPDATE ` + l + ` SET lease_until = now() + $2::interval WHERE owner = $1 RETURNING lane`,
		releaseSQL: `UPDATE ` + l + ` SET owner = NULL, lease_until = NULL WHERE owner = $1 AND lane = ANY($2)`,
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
		releaseAllSQL: `UPDATE ` + l + ` SET owner = NULL, lease_until = NULL WHERE owner = $1`,
		unregisterSQL: `DELETE FROM ` + r + ` WHERE owner = $1`,
		// Holds whose event is gone or delivered are stale; a hold kept for a
		// dead event by StopKeyOnDeadLetter is 'infinity' and stays.
		cleanHoldsSQL: `DELETE FROM ` + h + ` x WHERE NOT EXISTS (
    SELECT 1 FROM ` + o + ` o WHERE o.seq = x.seq
      AND (o.status = 'pending' OR (o.status = 'dead' AND x.until = 'infinity')))`,
		cleanRelaysSQL: `DELETE FROM ` + r + ` WHERE heartbeat_until < now() - interval '1 minute'`,
		outboxName:     o,
		// SKIP_LOCKED: never queue behind an autovacuum already at work.
		vacuumSQL: `VACUUM (SKIP_LOCKED, ANALYZE) ` + o + `, ` + h,
		purgeDoneSQL: `DELETE FROM ` + o + ` WHERE seq IN (
    SELECT seq FROM ` + o + ` WHERE status = 'done' AND finished_at < now() - $1::interval
    ORDER BY finished_at LIMIT $2)`,
		statsSQL: `INSERT INTO ` + st + ` AS s (minute, sink, topic, published)
SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::bigint[])
ON CONFLICT (minute, sink, topic) DO UPDATE SET published = s.published + excluded.published`,
		statsCleanSQL: `DELETE FROM ` + st + ` WHERE minute < now() - interval '1 day'`,
	}
}

// flushStats adds published counts to the stats table and removes rows
// older than a day, in one transaction.
func (s *store) flushStats(ctx context.Context, counts map[statKey]int64) error {
	n := len(counts)
	minutes, sinkNames, topics, published := make([]time.Time, 0, n), make([]string, 0, n), make([]string, 0, n), make([]int64, 0, n)
	for k, v := range counts {
		minutes = append(minutes, k.minute)
		sinkNames = append(sinkNames, k.sink)
		topics = append(topics, k.topic)
		published = append(published, v)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.statsSQL, minutes, sinkNames, topics, published); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, s.statsCleanSQL)
		return err
	})
	if err != nil {
		return fmt.Errorf("writing published counts: %w", err)
	}
	return nil
}

// hold is a sink on which an earlier event of the same key is waiting.
type hold struct {
	sink  string
	seq   int64
	until time.Time
}

// delivery is one sink's state for one event, kept in the deliveries column.
type delivery struct {
	State    string    `json:"state"` // done, retry, wait or dead
	Attempts int       `json:"attempts,omitempty"`
	Error    string    `json:"error,omitempty"`
	At       time.Time `json:"at"`
	// Next is when a sink in state retry may be tried again. A row is due
	// at its earliest sink's Next; the others wait for their own.
	Next time.Time `json:"next,omitzero"`
}

const (
	stateDone  = "done"
	stateRetry = "retry" // failed (or its sink was down); retried at Next
	stateWait  = "wait"  // parked behind an earlier event of its key until Next
	stateDead  = "dead"
)

// row is a claimed outbox row.
type row struct {
	seq         int64
	id          string
	topic       string
	key         string
	payload     []byte
	contentType string
	headers     map[string]string
	createdAt   time.Time
	attempts    int
	maxAttempts int // 0: the relay's default
	deliveries  map[string]delivery
	holds       []hold
	decodeErr   error // a column the relay cannot read: the row is dead-lettered
}

// claim returns up to limit due rows of the lanes in mask, in seq order. An
// empty mask claims nothing.
func (s *store) claim(ctx context.Context, mask uint64, limit int, sinkNames []string) ([]row, error) {
	if mask == 0 {
		return nil, nil
	}
	lowest, highest := bits.TrailingZeros64(mask), laneCount-1-bits.LeadingZeros64(mask)
	rows, err := s.pool.Query(ctx, s.claimSQL, int64(mask), limit, sinkNames, lowest, highest)
	if err != nil {
		return nil, fmt.Errorf("claiming events: %w", err)
	}
	defer rows.Close()
	out := make([]row, 0, limit)
	var (
		seq                 int64
		id                  pgtype.UUID
		topic               string
		key, contentType    pgtype.Text
		payload, payloadBin []byte
		headers, deliveries []byte
		createdAt           time.Time
		attempts            int32
		maxAttempts         pgtype.Int4
		holdSink            pgtype.Text
		holdSeq             pgtype.Int8
		holdUntil           pgtype.Timestamptz
	)
	for rows.Next() {
		if err := rows.Scan(&seq, &id, &topic, &key, &payload, &payloadBin, &contentType, &headers,
			&createdAt, &attempts, &maxAttempts, &deliveries, &holdSink, &holdSeq, &holdUntil); err != nil {
			return nil, fmt.Errorf("reading claimed event: %w", err)
		}
		if n := len(out); n > 0 && out[n-1].seq == seq {
			// The same row again: one more hold on it.
			out[n-1].holds = append(out[n-1].holds, hold{holdSink.String, holdSeq.Int64, fromTimestamptz(holdUntil)})
			continue
		}
		r := row{seq: seq, id: uuidString(id), topic: topic, key: key.String, createdAt: createdAt,
			attempts: int(attempts), maxAttempts: int(maxAttempts.Int32)}
		switch {
		case payloadBin != nil:
			r.payload = payloadBin
			r.contentType = "application/octet-stream"
		case payload != nil:
			r.payload = payload
			r.contentType = "application/json"
		default:
			r.payload = []byte("null")
			r.contentType = "application/json"
		}
		if contentType.Valid && contentType.String != "" {
			r.contentType = contentType.String
		}
		if len(headers) > 2 {
			r.headers, r.decodeErr = decodeHeaders(headers)
		}
		if len(deliveries) > 2 {
			if err := json.Unmarshal(deliveries, &r.deliveries); err != nil && r.decodeErr == nil {
				r.decodeErr = fmt.Errorf("deliveries column: %w", err)
			}
		}
		if holdSink.Valid {
			r.holds = append(r.holds, hold{holdSink.String, holdSeq.Int64, fromTimestamptz(holdUntil)})
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claiming events: %w", err)
	}
	return out, nil
}

// decodeHeaders reads the headers column: a JSON object whose values are
// strings; other values (written by hand) are kept as their JSON text.
func decodeHeaders(raw []byte) (map[string]string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("headers column: %w", err)
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		var s string
		if json.Unmarshal(v, &s) == nil {
			out[k] = s
		} else {
			out[k] = string(v)
		}
	}
	return out, nil
}

func uuidString(u pgtype.UUID) string {
	const hex = "0123456789abcdef"
	b := u.Bytes
	buf := make([]byte, 36)
	j := 0
	for i := 0; i < 16; i++ {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			buf[j] = '-'
			j++
		}
		buf[j], buf[j+1] = hex[b[i]>>4], hex[b[i]&0xf]
		j += 2
	}
	return string(buf)
}

// outcome is what recording a batch writes.
type outcome struct {
	done []int64 // delivered everywhere: deleted (or kept as done)

	// Rows still pending or now dead.
	seqs        []int64
	statuses    []string
	attempts    []int32
	availableAt []pgtype.Timestamptz
	lastErrors  []pgtype.Text
	deliveries  [][]byte

	// Holds taken (or extended) and released.
	takeKeys, takeSinks []string
	takeSeqs            []int64
	takeUntil           []pgtype.Timestamptz
	freeKeys, freeSinks []string
	freeSeqs            []int64
}

func (o *outcome) update(seq int64, status string, attempts int, at time.Time, lastErr string, deliveries []byte) {
	o.seqs = append(o.seqs, seq)
	o.statuses = append(o.statuses, status)
	o.attempts = append(o.attempts, int32(attempts))
	o.availableAt = append(o.availableAt, timestamptz(at))
	o.lastErrors = append(o.lastErrors, pgtype.Text{String: lastErr, Valid: lastErr != ""})
	o.deliveries = append(o.deliveries, deliveries)
}

func (o *outcome) take(key, sink string, seq int64, until time.Time) {
	o.takeKeys = append(o.takeKeys, key)
	o.takeSinks = append(o.takeSinks, sink)
	o.takeSeqs = append(o.takeSeqs, seq)
	o.takeUntil = append(o.takeUntil, timestamptz(until))
}

func (o *outcome) free(key, sink string, seq int64) {
	o.freeKeys = append(o.freeKeys, key)
	o.freeSinks = append(o.freeSinks, sink)
	o.freeSeqs = append(o.freeSeqs, seq)
}

// record writes a batch's outcome in one statement. Rows of lanes this relay
// lost are left alone: their new owner delivers them again.
func (s *store) record(ctx context.Context, o *outcome, keepDone bool) error {
	if len(o.seqs) == 0 && len(o.freeSeqs) == 0 {
		if len(o.done) == 0 {
			return nil
		}
		sql := s.deleteSQL
		if keepDone {
			sql = s.markDoneSQL
		}
		if _, err := s.pool.Exec(ctx, sql, o.done, s.owner); err != nil {
			return fmt.Errorf("recording %d delivered events: %w", len(o.done), err)
		}
		return nil
	}
	_, err := s.pool.Exec(ctx, s.recordSQL,
		o.seqs, o.statuses, o.attempts, o.availableAt, o.lastErrors, o.deliveries, s.owner,
		o.takeKeys, o.takeSinks, o.takeSeqs, o.takeUntil,
		o.freeKeys, o.freeSinks, o.freeSeqs,
		o.done, keepDone)
	if err != nil {
		return fmt.Errorf("recording outcome of %d events: %w", len(o.seqs)+len(o.done), err)
	}
	return nil
}

// refreshLanes renews this relay's heartbeat and lanes, then moves towards
// holding its block: the live relays, ordered by owner name, split the
// lanes into consecutive blocks of 64 / live (the first ones a lane smaller
// when it does not divide). Lanes outside the block are released; free
// lanes inside it are acquired (those still held by a relay that has not
// yet seen the change come at a later refresh). A block of neighbours,
// rather than any set of lanes, keeps the claim's lane range (lowest to
// highest lane held) free of other relays' lanes. It returns the lanes
// held, and those just taken over from an owner whose lease had expired, as
// bit masks.
func (s *store) refreshLanes(ctx context.Context, lease time.Duration) (held, takenOver uint64, err error) {
	b := &pgx.Batch{}
	b.Queue(s.heartbeatSQL, s.owner, lease)
	b.Queue(s.liveSQL, s.owner)
	b.Queue(s.renewSQL, s.owner, lease)
	br := s.pool.SendBatch(ctx, b)
	var live, rank int
	var owned []int16
	_, err = br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&live, &rank)
	}
	if err == nil {
		var rows pgx.Rows
		rows, err = br.Query()
		if err == nil {
			owned, err = pgx.CollectRows(rows, pgx.RowTo[int16])
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, 0, fmt.Errorf("renewing lanes: %w", err)
	}
	first, last := laneBlock(rank, live)
	var keep, extra []int16
	for _, lane := range owned {
		if int(lane) >= first && int(lane) <= last {
			keep = append(keep, lane)
		} else {
			extra = append(extra, lane)
		}
	}
	if len(extra) > 0 {
		if _, err := s.pool.Exec(ctx, s.releaseSQL, s.owner, extra); err != nil {
			return 0, 0, fmt.Errorf("releasing lanes: %w", err)
		}
	}
	if len(keep) < last-first+1 {
		rows, err := s.pool.Query(ctx, s.acquireSQL, s.owner, lease, first, last)
		if err != nil {
			return 0, 0, fmt.Errorf("acquiring lanes: %w", err)
		}
		var lane int16
		var taken bool
		_, err = pgx.ForEachRow(rows, []any{&lane, &taken}, func() error {
			keep = append(keep, lane)
			if taken {
				takenOver |= 1 << uint(lane)
			}
			return nil
		})
		if err != nil {
			return 0, 0, fmt.Errorf("acquiring lanes: %w", err)
		}
	}
	for _, l := range keep {
		held |= 1 << uint(l)
	}
	return held, takenOver, nil
}

// laneBlock is the first and last lane of block rank (from 0) when live
// relays split the lanes.
func laneBlock(rank, live int) (first, last int) {
	live = max(live, 1)
	rank = min(max(rank, 0), live-1)
	return rank * laneCount / live, (rank+1)*laneCount/live - 1
}

// heartbeat announces this relay as live until lease from now.
func (s *store) heartbeat(ctx context.Context, lease time.Duration) error {
	if _, err := s.pool.Exec(ctx, s.heartbeatSQL, s.owner, lease); err != nil {
		return fmt.Errorf("announcing relay %s: %w", s.owner, err)
	}
	return nil
}

// releaseAll gives back this relay's lanes and removes its heartbeat: other
// relays take over at once instead of after the lease.
func (s *store) releaseAll(ctx context.Context) error {
	b := &pgx.Batch{}
	b.Queue(s.releaseAllSQL, s.owner)
	b.Queue(s.unregisterSQL, s.owner)
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("releasing lanes: %w", err)
	}
	return nil
}

// maintain removes stale holds, forgotten relays and, with a retention
// period, delivered rows older than it, in bounded batches.
func (s *store) maintain(ctx context.Context, retention time.Duration) (purged int64, err error) {
	if _, err := s.pool.Exec(ctx, s.cleanHoldsSQL); err != nil {
		return 0, fmt.Errorf("removing stale holds: %w", err)
	}
	if _, err := s.pool.Exec(ctx, s.cleanRelaysSQL); err != nil {
		return 0, fmt.Errorf("removing departed relays: %w", err)
	}
	if retention <= 0 {
		return 0, nil
	}
	const chunk = 5000
	for {
		tag, err := s.pool.Exec(ctx, s.purgeDoneSQL, retention, chunk)
		if err != nil {
			return purged, fmt.Errorf("removing delivered events older than %s: %w", retention, err)
		}
		purged += tag.RowsAffected()
		if tag.RowsAffected() < chunk || ctx.Err() != nil {
			return purged, nil
		}
	}
}

// vacuumIfNeeded vacuums the outbox and holds tables when the outbox holds
// more than threshold dead tuples. Every delivered event leaves one, and the
// claim walks past them until a vacuum removes them: with autovacuum off or
// behind, claims would slow without bound. It reports whether it vacuumed.
func (s *store) vacuumIfNeeded(ctx context.Context, threshold int64) (bool, error) {
	var dead int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = to_regclass($1)), 0)`,
		s.outboxName).Scan(&dead)
	if err != nil {
		return false, fmt.Errorf("reading dead tuples of %s: %w", s.outboxName, err)
	}
	if dead < threshold {
		return false, nil
	}
	if _, err := s.pool.Exec(ctx, s.vacuumSQL); err != nil {
		return false, fmt.Errorf("vacuuming %s (%d dead tuples): %w", s.outboxName, dead, err)
	}
	return true, nil
}

// timestamptz encodes forever as PostgreSQL 'infinity'.
func timestamptz(t time.Time) pgtype.Timestamptz {
	if !t.Before(forever) {
		return pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
	}
	return pgtype.Timestamptz{Time: t, Valid: true}
}

// fromTimestamptz decodes 'infinity' as forever.
func fromTimestamptz(t pgtype.Timestamptz) time.Time {
	if t.InfinityModifier == pgtype.Infinity {
		return forever
	}
	return t.Time
}
