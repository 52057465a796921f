// Package pgstore is the relay engine's store on PostgreSQL (store.Store):
// every statement the engine runs there (sql.go), and how the results are
// read into plain Go values. It decides nothing the engine decides; it
// holds what is PostgreSQL's: the planner settings a claim needs, the
// lock_timeout and SKIP LOCKED fallback of a record, SQLSTATE classes,
// LISTEN/NOTIFY, vacuum and analyze.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay/internal/store"
)

// Store is store.Store on a PostgreSQL pool.
type Store struct {
	pool   *pgxpool.Pool
	tables migrations.Tables
	sql    statements
}

var _ store.Store = (*Store)(nil)

// New returns the store of the tables t on pool.
func New(pool *pgxpool.Pool, t migrations.Tables) *Store {
	return &Store{pool: pool, tables: t, sql: newStatements(t)}
}

// CheckSchema implements store.Store.
func (s *Store) CheckSchema(ctx context.Context) error {
	return migrations.Check(ctx, s.pool, s.tables)
}

// Heartbeat implements store.Store.
func (s *Store) Heartbeat(ctx context.Context, owner, config string, lease time.Duration, paused []string) error {
	if paused == nil {
		paused = []string{}
	}
	if _, err := s.pool.Exec(ctx, s.sql.heartbeatSQL, owner, lease, config, paused); err != nil {
		return fmt.Errorf("announcing relay %s: %w", owner, err)
	}
	return nil
}

// Renew implements store.Store.
func (s *Store) Renew(ctx context.Context, owner, config string, lease time.Duration, paused []string) (store.LaneView, error) {
	if paused == nil {
		paused = []string{}
	}
	b := &pgx.Batch{}
	b.Queue(s.sql.heartbeatSQL, owner, lease, config, paused)
	b.Queue(s.sql.liveSQL, owner, config)
	b.Queue(s.sql.renewSQL, owner, lease)
	br := s.pool.SendBatch(ctx, b)
	var v store.LaneView
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&v.Live, &v.Rank, &v.Current, &v.Now)
	}
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			var lane int16
			var epoch int64
			_, err = pgx.ForEachRow(rows, []any{&lane, &epoch}, func() error {
				v.Held.Add(int(lane), epoch)
				return nil
			})
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return store.LaneView{}, fmt.Errorf("renewing lanes: %w", err)
	}
	return v, nil
}

// ReleaseLanes implements store.Store.
func (s *Store) ReleaseLanes(ctx context.Context, owner string, mask uint64) error {
	if _, err := s.pool.Exec(ctx, s.sql.releaseSQL, owner, laneList(mask)); err != nil {
		return fmt.Errorf("releasing lanes: %w", err)
	}
	return nil
}

// laneList lists the lanes of mask.
func laneList(mask uint64) []int16 {
	lanes := make([]int16, 0, bits.OnesCount64(mask))
	for mask != 0 {
		lane := bits.TrailingZeros64(mask)
		lanes = append(lanes, int16(lane))
		mask &^= 1 << uint(lane)
	}
	return lanes
}

// AcquireLanes implements store.Store.
func (s *Store) AcquireLanes(ctx context.Context, owner string, lease time.Duration, first, last int) (acquired store.Leases, takenOver uint64, err error) {
	rows, err := s.pool.Query(ctx, s.sql.acquireSQL, owner, lease, first, last)
	if err != nil {
		return store.Leases{}, 0, fmt.Errorf("acquiring lanes: %w", err)
	}
	var lane int16
	var taken bool
	var epoch int64
	_, err = pgx.ForEachRow(rows, []any{&lane, &taken, &epoch}, func() error {
		acquired.Add(int(lane), epoch)
		if taken {
			takenOver |= 1 << uint(lane)
		}
		return nil
	})
	if err != nil {
		return store.Leases{}, 0, fmt.Errorf("acquiring lanes: %w", err)
	}
	return acquired, takenOver, nil
}

// ReleaseAll implements store.Store.
func (s *Store) ReleaseAll(ctx context.Context, owner string) error {
	b := &pgx.Batch{}
	b.Queue(s.sql.releaseAllSQL, owner)
	b.Queue(s.sql.unregisterSQL, owner)
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("releasing lanes: %w", err)
	}
	return nil
}

// OwnerLive implements store.Store.
func (s *Store) OwnerLive(ctx context.Context, owner string) (time.Time, error) {
	var until time.Time
	err := s.pool.QueryRow(ctx, s.sql.ownerLiveSQL, owner).Scan(&until)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("looking for a live relay named %s: %w", owner, err)
	}
	return until, nil
}

// RemoveDeparted implements store.Store.
func (s *Store) RemoveDeparted(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, s.sql.cleanRelaysSQL); err != nil {
		return fmt.Errorf("removing departed relays: %w", err)
	}
	return nil
}

// PurgeDone implements store.Store.
func (s *Store) PurgeDone(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	tag, err := s.pool.Exec(ctx, s.sql.purgeDoneSQL, olderThan, limit)
	if err != nil {
		return 0, fmt.Errorf("removing delivered events older than %s: %w", olderThan, err)
	}
	return tag.RowsAffected(), nil
}

// SinksWithDeliveries implements store.Store.
func (s *Store) SinksWithDeliveries(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, s.sql.sinksPresentSQL)
	if err != nil {
		return nil, fmt.Errorf("listing the sinks with deliveries: %w", err)
	}
	present, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing the sinks with deliveries: %w", err)
	}
	return present, nil
}

// CountWaiting implements store.Store.
func (s *Store) CountWaiting(ctx context.Context, sink string) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, s.sql.countWaitingSQL, sink).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting the deliveries waiting for sink %s: %w", sink, err)
	}
	return n, nil
}

// AddPublished implements store.Store, in one transaction.
func (s *Store) AddPublished(ctx context.Context, counts map[store.StatKey]int64) error {
	n := len(counts)
	minutes, sinkNames, topics, published := make([]time.Time, 0, n), make([]string, 0, n), make([]string, 0, n), make([]int64, 0, n)
	for k, v := range counts {
		minutes = append(minutes, k.Minute)
		sinkNames = append(sinkNames, k.Sink)
		topics = append(topics, k.Topic)
		published = append(published, v)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.sql.statsSQL, minutes, sinkNames, topics, published); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, s.sql.statsCleanSQL)
		return err
	})
	if err != nil {
		return fmt.Errorf("writing published counts: %w", err)
	}
	return nil
}

// analyzeAfterPages is how many pages a table grows by, past twice its
// size when last analyzed, before MaintainTables analyzes it.
const analyzeAfterPages = 8

// MaintainTables implements store.Store: it vacuums the outbox and the
// deliveries table, each when it holds at least deadRows dead tuples, and
// analyzes each that has grown to more than twice its size when last
// analyzed.
//
// Every delivered event leaves a dead tuple, and the claims walk past them
// until a vacuum removes them: with autovacuum off or behind, claims would
// slow without bound. A table that does not need it is left alone: the
// deliveries table grows by a row per event while a sink is down, with
// nothing for a vacuum to remove.
//
// That growth is what the analyze is for. PostgreSQL keeps a statement's
// generic plan, made for the sizes the table had then, until the table is
// analyzed: plans made while the deliveries table was empty looked up each
// claimed event's queues by walking every head, and a claim took seconds
// once the table held 100,000 rows. Analyzing at each doubling makes them
// plan again, and costs a sample of the table each time.
func (s *Store) MaintainTables(ctx context.Context, deadRows int64) (store.Maintenance, error) {
	var done store.Maintenance
	outbox := s.tables.Outbox()
	names := []string{outbox, s.tables.Deliveries()}
	rows, err := s.pool.Query(ctx, s.sql.tableSizesSQL, names)
	if err != nil {
		return done, fmt.Errorf("reading the sizes and dead tuples of %s: %w", outbox, err)
	}
	type size struct{ dead, analyzedPages, pages int64 }
	sizes, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (size, error) {
		var z size
		return z, row.Scan(&z.dead, &z.analyzedPages, &z.pages)
	})
	if err != nil {
		return done, fmt.Errorf("reading the sizes and dead tuples of %s: %w", outbox, err)
	}
	if len(sizes) != len(names) {
		return done, fmt.Errorf("reading the sizes of %s: found %d of its %d tables", outbox, len(sizes), len(names))
	}
	for i, name := range names {
		z := sizes[i]
		switch {
		case z.dead >= deadRows:
			// SKIP_LOCKED: never queue behind an autovacuum already at
			// work. No TRUNCATE: giving the empty end of a table back to
			// the system takes an exclusive lock that a manual VACUUM
			// waits for, and every claim and insert then waits behind it
			// (autovacuum's truncation gives way instead). The name is
			// one of the quoted names of migrations.Tables.
			if _, err := s.pool.Exec(ctx, `VACUUM (SKIP_LOCKED, ANALYZE, TRUNCATE false) `+name); err != nil {
				return done, fmt.Errorf("vacuuming %s (%d dead tuples): %w", name, z.dead, err)
			}
			done.Vacuumed = append(done.Vacuumed, name)
		case z.pages > 2*z.analyzedPages+analyzeAfterPages:
			if _, err := s.pool.Exec(ctx, `ANALYZE (SKIP_LOCKED) `+name); err != nil {
				return done, fmt.Errorf("analyzing %s (%d pages, %d when last analyzed): %w", name, z.pages, z.analyzedPages, err)
			}
			done.Analyzed = append(done.Analyzed, name)
		}
	}
	return done, nil
}

// Listen implements store.Store with LISTEN on the outbox's channel, on a
// connection of its own that is closed, not returned to the pool, when it
// ends.
func (s *Store) Listen(ctx context.Context, wake func(queues bool)) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connecting to listen: %w", err)
	}
	// A LISTENing session must not go back to the pool.
	defer func() {
		_ = conn.Conn().Close(context.Background())
		conn.Release()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+s.tables.ChannelIdent()); err != nil {
		return fmt.Errorf("listening on %s: %w", s.tables.Channel(), err)
	}
	wake(true) // events may have arrived while not listening
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return err
		}
		wake(n.Payload == queuesChanged)
	}
}

// dataError marks err as the database refusing the data it was given (a
// data exception, a constraint, a limit), rather than being unable to run
// the statement.
func dataError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code[:2] {
	case "22", "23", "54":
		return &store.DataError{Err: err}
	}
	return err
}

// uuidString is u in its canonical text form.
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
