// Package mysqlstore is the relay engine's store on MySQL 8 and MariaDB
// 10.6+ (store.Store): every statement the engine runs there (sql.go), and
// how results are read into plain Go values. It decides nothing the engine
// decides; it holds what is MySQL's: READ COMMITTED transactions retried on
// deadlocks and lock wait timeouts, SKIP LOCKED in place of PostgreSQL's
// lock_timeout fallback, batches passed as JSON_TABLE parameters or lists
// of placeholders (no arrays), MySQL's error numbers, polling in place of
// LISTEN/NOTIFY, ANALYZE TABLE and the InnoDB history list length.
package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/heraldhq/herald/internal/mysqlurl"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/relay/internal/store"
)

// Config is how a Store polls and logs.
type Config struct {
	// PollInterval is the longest Listen waits between probes for new
	// work while idle (relay.poll_interval). Defaults to 1 second.
	PollInterval time.Duration
	// Logger receives what the store reports. Defaults to slog.Default().
	Logger *slog.Logger
}

// Store is store.Store on a MySQL or MariaDB *sql.DB opened with
// Configure's settings.
type Store struct {
	db     *sql.DB
	tables mysqlmigrations.Tables
	sql    statements
	cfg    Config
	// txOptions begin the store's transactions: READ COMMITTED, unless
	// every connection of db runs at that level already (opened by Open).
	txOptions *sql.TxOptions
	// analyzedRows is the rows each table had when MaintainTables last
	// analyzed it (its own; other relays analyze on their own count).
	analyzedMu   sync.Mutex
	analyzedRows map[string]int64
}

var _ store.Store = (*Store)(nil)

// New returns the store of the tables t on db.
func New(db *sql.DB, t mysqlmigrations.Tables, cfg Config) *Store {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Store{db: db, tables: t, sql: newStatements(t), cfg: cfg, txOptions: txOptionsFor(db), analyzedRows: map[string]int64{}}
}

// Configure sets the driver settings a relay's connections need, unless
// the URL already chose them:
//
//   - interpolateParams=true: a statement is one round trip, not a prepare
//     and an execute; it also keeps away go-sql-driver v1.10.1's hang on a
//     prepared SELECT that returns no rows (docs/architecture.md).
//   - innodb_lock_wait_timeout=1: a relay's statement waits at most a
//     second for a row lock (then 1205, and the transaction is retried).
//   - parseTime=true, in UTC: DATETIME columns hold UTC.
func Configure(cfg *mysql.Config) {
	cfg.InterpolateParams = true
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	if _, ok := cfg.Params["innodb_lock_wait_timeout"]; !ok {
		cfg.Params["innodb_lock_wait_timeout"] = "1"
	}
}

// Open returns a *sql.DB on a mysql:// URL with Configure's settings, whose
// connections run at READ COMMITTED (connections are opened lazily).
// Errors never quote the URL.
func Open(url string) (*sql.DB, error) {
	cfg, err := mysqlurl.Config(url)
	if err != nil {
		return nil, err
	}
	Configure(cfg)
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(readCommitted{conn}), nil
}

// readCommitted opens connections whose transactions run at READ COMMITTED
// by default: a transaction of the store begins with START TRANSACTION
// alone, where the driver sends SET TRANSACTION ISOLATION LEVEL before it
// for a level given in sql.TxOptions, one round trip more per transaction
// (a record is a few). The session variable's name differs between MySQL
// 8 (transaction_isolation) and MariaDB 10.11 (tx_isolation), so it is set
// by a statement both accept rather than by a URL parameter.
type readCommitted struct{ driver.Connector }

func (c readCommitted) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	ex, ok := conn.(driver.ExecerContext)
	if !ok {
		conn.Close()
		return nil, fmt.Errorf("setting a connection's isolation level: the driver's %T cannot execute", conn)
	}
	if _, err := ex.ExecContext(ctx, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED", nil); err != nil {
		conn.Close()
		return nil, fmt.Errorf("setting a connection's isolation level to READ COMMITTED: %w", err)
	}
	return conn, nil
}

// Driver returns the driver marked, so that New knows db's connections run
// at READ COMMITTED.
func (c readCommitted) Driver() driver.Driver { return readCommittedDriver{c.Connector.Driver()} }

// readCommittedDriver marks a *sql.DB opened by Open.
type readCommittedDriver struct{ driver.Driver }

// CheckSchema implements store.Store.
func (s *Store) CheckSchema(ctx context.Context) error {
	return mysqlmigrations.Check(ctx, s.db, s.tables.Names())
}

// micros is d as the microseconds of an INTERVAL.
func micros(d time.Duration) int64 { return d.Microseconds() }

// lanes are the three parameters of inMask for mask.
func lanes(mask uint64) []any {
	if mask == 0 {
		return []any{1, 0, uint64(0)} // an empty range
	}
	return []any{bits.TrailingZeros64(mask), store.Lanes - 1 - bits.LeadingZeros64(mask), mask}
}

func pausedJSON(paused []string) (string, error) {
	if paused == nil {
		paused = []string{}
	}
	b, err := json.Marshal(paused)
	return string(b), err
}

// Heartbeat implements store.Store.
func (s *Store) Heartbeat(ctx context.Context, owner, config string, lease time.Duration, paused []string) error {
	err := s.inTx(ctx, func(tx *sql.Tx) error { return s.heartbeat(ctx, tx, owner, config, lease, paused) })
	if err != nil {
		return fmt.Errorf("announcing relay %s: %w", owner, err)
	}
	return nil
}

func (s *Store) heartbeat(ctx context.Context, tx *sql.Tx, owner, config string, lease time.Duration, paused []string) error {
	p, err := pausedJSON(paused)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, s.sql.heartbeat, owner, micros(lease), config, config, owner, p)
	return err
}

// Renew implements store.Store: one transaction of four statements (MySQL
// has no UPDATE ... RETURNING).
func (s *Store) Renew(ctx context.Context, owner, config string, lease time.Duration, paused []string) (store.LaneView, error) {
	var v store.LaneView
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		v = store.LaneView{}
		if err := s.heartbeat(ctx, tx, owner, config, lease, paused); err != nil {
			return err
		}
		var current int64
		if err := tx.QueryRowContext(ctx, s.sql.live, owner, config, config).Scan(&v.Live, &v.Rank, &current, &v.Now); err != nil {
			return fmt.Errorf("reading the live relays: %w", err)
		}
		v.Current = current == 1
		if _, err := tx.ExecContext(ctx, s.sql.renew, micros(lease), owner); err != nil {
			return err
		}
		var err error
		v.Held, err = s.leases(ctx, tx, s.sql.owned, owner)
		return err
	})
	if err != nil {
		return store.LaneView{}, fmt.Errorf("renewing the lanes of %s: %w", owner, err)
	}
	return v, nil
}

// exec runs one statement in a transaction of its own, at READ COMMITTED
// like every write of the relay (the session's level may be InnoDB's
// REPEATABLE READ), and returns the rows it affected.
func (s *Store) exec(ctx context.Context, stmt string, args ...any) (int64, error) {
	var n int64
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, stmt, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}

// queryer is a *sql.DB or a *sql.Tx.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// leases runs a query returning lanes with their epochs.
func (s *Store) leases(ctx context.Context, q queryer, query string, args ...any) (store.Leases, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return store.Leases{}, err
	}
	defer rows.Close()
	var l store.Leases
	for rows.Next() {
		var lane uint8
		var epoch int64
		if err := rows.Scan(&lane, &epoch); err != nil {
			return store.Leases{}, err
		}
		l.Add(int(lane&63), epoch)
	}
	return l, rows.Err()
}

// fence locks the lanes owner holds (lockLanes) and returns those of f
// still held under f's epochs.
func (s *Store) fence(ctx context.Context, tx *sql.Tx, owner string, f *store.Leases) (uint64, error) {
	held, err := s.leases(ctx, tx, s.sql.lockLanes, owner)
	if err != nil {
		return 0, fmt.Errorf("locking the lanes of %s: %w", owner, err)
	}
	var mask uint64
	for lane := range store.Lanes {
		if f.Same(&held, lane) {
			mask |= 1 << uint(lane)
		}
	}
	return mask, nil
}

// ReleaseLanes implements store.Store.
func (s *Store) ReleaseLanes(ctx context.Context, owner string, mask uint64) error {
	if _, err := s.exec(ctx, s.sql.release, append([]any{owner}, lanes(mask)...)...); err != nil {
		return fmt.Errorf("releasing lanes: %w", err)
	}
	return nil
}

// AcquireLanes implements store.Store: one transaction that locks the free
// lanes (skipping those locked by another relay taking them, or by a record
// in flight) and takes them.
func (s *Store) AcquireLanes(ctx context.Context, owner string, lease time.Duration, first, last int) (acquired store.Leases, takenOver uint64, err error) {
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		var found uint64
		acquired, takenOver = store.Leases{}, 0
		rows, err := tx.QueryContext(ctx, s.sql.acquireFind, first, last)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var lane uint8
			var taken bool
			if err := rows.Scan(&lane, &taken); err != nil {
				return err
			}
			found |= 1 << (lane & 63)
			if taken {
				takenOver |= 1 << (lane & 63)
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if found == 0 {
			return nil
		}
		if _, err = tx.ExecContext(ctx, s.sql.acquire, append([]any{owner, micros(lease)}, lanes(found)...)...); err != nil {
			return err
		}
		owned, err := s.leases(ctx, tx, s.sql.owned, owner)
		for lane := range store.Lanes {
			if found&(1<<uint(lane)) != 0 {
				acquired.Add(lane, owned.Epochs[lane])
			}
		}
		return err
	})
	if err != nil {
		return store.Leases{}, 0, fmt.Errorf("acquiring lanes %d to %d: %w", first, last, err)
	}
	return acquired, takenOver, nil
}

// ReleaseAll implements store.Store.
func (s *Store) ReleaseAll(ctx context.Context, owner string) error {
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, s.sql.releaseAll, owner); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, s.sql.unregister, owner)
		return err
	})
	if err != nil {
		return fmt.Errorf("releasing lanes of %s: %w", owner, err)
	}
	return nil
}

// OwnerLive implements store.Store.
func (s *Store) OwnerLive(ctx context.Context, owner string) (time.Time, error) {
	var until time.Time
	err := s.db.QueryRowContext(ctx, s.sql.ownerLive, owner).Scan(&until)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("looking for a live relay named %s: %w", owner, err)
	}
	return until, nil
}

// RemoveDeparted implements store.Store.
func (s *Store) RemoveDeparted(ctx context.Context) error {
	if _, err := s.exec(ctx, s.sql.cleanRelays); err != nil {
		return fmt.Errorf("removing departed relays: %w", err)
	}
	return nil
}

// PurgeDone implements store.Store.
func (s *Store) PurgeDone(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	n, err := s.exec(ctx, s.sql.purgeDone, micros(olderThan), limit)
	if err != nil {
		return 0, fmt.Errorf("removing delivered events older than %s: %w", olderThan, err)
	}
	return n, nil
}

// SinksWithDeliveries implements store.Store.
func (s *Store) SinksWithDeliveries(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, s.sql.sinksPresent)
	if err != nil {
		return nil, fmt.Errorf("listing the sinks with deliveries: %w", err)
	}
	defer rows.Close()
	var present []string
	for rows.Next() {
		var sink string
		if err := rows.Scan(&sink); err != nil {
			return nil, fmt.Errorf("listing the sinks with deliveries: %w", err)
		}
		present = append(present, sink)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing the sinks with deliveries: %w", err)
	}
	return present, nil
}

// CountWaiting implements store.Store.
func (s *Store) CountWaiting(ctx context.Context, sink string) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, s.sql.countWaiting, sink).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting the deliveries waiting for sink %s: %w", sink, err)
	}
	return n, nil
}

// statRows is how many stats rows one INSERT carries (4 placeholders each,
// well under MySQL's 65,535).
const statRows = 1000

// AddPublished implements store.Store, in one transaction.
func (s *Store) AddPublished(ctx context.Context, counts map[store.StatKey]int64) error {
	type row struct {
		k store.StatKey
		n int64
	}
	all := make([]row, 0, len(counts))
	for k, n := range counts {
		all = append(all, row{k, n})
	}
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		for len(all) > 0 {
			chunk := all[:min(len(all), statRows)]
			all = all[len(chunk):]
			args := make([]any, 0, 4*len(chunk))
			for _, r := range chunk {
				args = append(args, r.k.Minute.UTC(), r.k.Sink, r.k.Topic, r.n)
			}
			stmt := s.sql.stats + strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?), ", len(chunk)), ", ") +
				` ON DUPLICATE KEY UPDATE published = published + VALUES(published)`
			if _, err := tx.ExecContext(ctx, stmt, args...); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, s.sql.statsClean)
		return err
	})
	if err != nil {
		return fmt.Errorf("writing published counts: %w", err)
	}
	return nil
}

// analyzeAfterRows is how many rows a table grows by, past twice its rows
// when last analyzed, before MaintainTables analyzes it.
const analyzeAfterRows = 1000

// MaintainTables implements store.Store. InnoDB needs no vacuum: its purge
// thread removes deleted rows (deadRows is not used). It analyzes the
// outbox and the deliveries table when one has grown past twice its rows
// when this store last analyzed it, so that the optimizer's statistics
// follow a backlog, and reads the InnoDB history list length: claims at
// READ COMMITTED slow down over deleted rows not yet purged, and a long
// snapshot elsewhere stops purge (docs/architecture.md).
func (s *Store) MaintainTables(ctx context.Context, deadRows int64) (store.Maintenance, error) {
	done := store.Maintenance{}
	s.analyzedMu.Lock()
	defer s.analyzedMu.Unlock()
	base := s.tables.Names().Table
	names := map[string]string{base: s.tables.Outbox(), base + "_deliveries": s.tables.Deliveries()}
	rows, err := s.db.QueryContext(ctx, s.sql.tableRows, s.tables.Database(), base, base+"_deliveries")
	if err != nil {
		return done, fmt.Errorf("reading the sizes of %s: %w", s.tables.Outbox(), err)
	}
	sizes := map[string]int64{}
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			rows.Close()
			return done, fmt.Errorf("reading the sizes of %s: %w", s.tables.Outbox(), err)
		}
		sizes[name] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return done, fmt.Errorf("reading the sizes of %s: %w", s.tables.Outbox(), err)
	}
	for _, name := range []string{base, base + "_deliveries"} {
		quoted := names[name]
		n := sizes[name]
		if n <= 2*s.analyzedRows[quoted]+analyzeAfterRows {
			continue
		}
		// ANALYZE TABLE returns a result set: read through Query. The name
		// is one of the quoted names of mysqlmigrations.Tables.
		res, err := s.db.QueryContext(ctx, `ANALYZE TABLE `+quoted)
		if err == nil {
			for res.Next() {
			}
			err = res.Err()
			res.Close()
		}
		if err != nil {
			return done, fmt.Errorf("analyzing %s (about %d rows): %w", quoted, n, err)
		}
		s.analyzedRows[quoted] = n
		done.Analyzed = append(done.Analyzed, quoted)
	}
	var history int64
	done.MySQL = true
	switch err := s.db.QueryRowContext(ctx, s.sql.historyLen).Scan(&history); {
	case err == nil:
		done.HistoryLength = history
	case errors.Is(err, sql.ErrNoRows):
	default:
		// Without the PROCESS privilege the metric is not readable: the
		// relay runs without it.
		s.cfg.Logger.DebugContext(ctx, "relay store: cannot read the InnoDB history list length", "error", err)
	}
	return done, nil
}

// QueuedSinks implements store.Store: one probe of the head index per key.
func (s *Store) QueuedSinks(ctx context.Context, keys []string) (map[string][]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	q := "SELECT d.`key`, d.sink FROM " + s.tables.Deliveries() + " d WHERE d.`key` IN (" + placeholders(len(keys)) +
		") AND (d.state = 'ready' OR d.stops_key)"
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("looking up the queues of %d keys: %w", len(keys), err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var key, sink string
		if err := rows.Scan(&key, &sink); err != nil {
			return nil, fmt.Errorf("looking up the queues of %d keys: %w", len(keys), err)
		}
		out[key] = append(out[key], sink)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("looking up the queues of %d keys: %w", len(keys), err)
	}
	return out, nil
}

// ReadSlot implements store.Store: MySQL has no replication slot a relay
// reads (its binary log is not read).
func (s *Store) ReadSlot(context.Context, string) (store.Slot, error) {
	return store.Slot{}, store.ErrNoSlot
}
