package relaybench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/heraldhq/herald/internal/mysqlurl"
	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/relay"
)

// This file is the bench's MySQL and MariaDB side: its own database (a
// schema is a database there), the backlog's and the producers' plain-SQL
// INSERTs, and the probe that times an application's INSERT during a
// drain. The relays are the same engine on the MySQL store.

// mysqlRun is the MySQL state of a run.
type mysqlRun struct {
	// admin is the bench's own pool (the backlog, reports, the drop).
	admin  *sql.DB
	tables mysqlmigrations.Tables
}

// mysqlInsertRows is the most events one INSERT of the backlog carries.
const mysqlInsertRows = 1000

// openMySQL connects to the server, creates the run's database and
// migrates Herald's tables into it.
func (r *run) openMySQL(ctx context.Context) error {
	db, err := mysqlurl.Open(r.cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("--database-url: %w", err)
	}
	db.SetMaxOpenConns(4)
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		db.Close()
		return fmt.Errorf("connecting to the database: %w", err)
	}
	tables, err := mysqlmigrations.NewTables(r.tables)
	if err != nil {
		db.Close()
		return fmt.Errorf("--table: %w", err)
	}
	r.my = &mysqlRun{admin: db, tables: tables}
	// The name is the run's hex: nothing to quote beyond the backticks.
	if _, err := db.ExecContext(ctx, "CREATE DATABASE `"+r.tables.Schema+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		db.Close()
		return fmt.Errorf("creating the bench database %s: %w", r.tables.Schema, err)
	}
	m, err := mysqlmigrations.NewMigrator(db, r.tables, r.log)
	if err == nil {
		_, err = m.Up(ctx, 0)
	}
	if err != nil {
		r.closeMySQL(ctx)
		return fmt.Errorf("migrating the bench database %s: %w", r.tables.Schema, err)
	}
	return nil
}

// closeMySQL drops the run's database, unless --keep, and disconnects.
func (r *run) closeMySQL(ctx context.Context) {
	defer r.my.admin.Close()
	if r.cfg.Keep {
		fmt.Fprintf(r.cfg.Progress, "keeping database %s (--keep)\n", r.tables.Schema)
		return
	}
	dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if _, err := r.my.admin.ExecContext(dropCtx, "DROP DATABASE IF EXISTS `"+r.tables.Schema+"`"); err != nil {
		r.log.Warn("relaybench: dropping the bench database", "database", r.tables.Schema, "error", err)
	}
}

// newMySQLRelay makes a relay on a connection pool of its own, sized for
// its workers as relay run sizes it.
func (r *run) newMySQLRelay(cfg relay.Config) (*relay.Relay, *sql.DB, error) {
	db, err := relay.OpenMySQL(r.cfg.DatabaseURL, cfg.WithDefaults().Workers)
	if err != nil {
		return nil, nil, err
	}
	rl, err := relay.NewMySQL(db, cfg)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return rl, db, nil
}

// leases counts the lanes each owner holds now.
func (m *mysqlRun) leases(ctx context.Context) (map[string]int, error) {
	rows, err := m.admin.QueryContext(ctx, `SELECT owner, count(*) FROM `+m.tables.Lanes()+
		` WHERE owner IS NOT NULL AND lease_until > utc_timestamp(6) GROUP BY owner`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	held := map[string]int{}
	for rows.Next() {
		var owner string
		var n int
		if err := rows.Scan(&owner, &n); err != nil {
			return nil, err
		}
		held[owner] = n
	}
	return held, rows.Err()
}

// insertMySQLEvents inserts events lo to hi-1 of the run in tx,
// mysqlInsertRows a statement: ids, keys and payload as the PostgreSQL
// backlog's.
func (r *run) insertMySQLEvents(ctx context.Context, tx *sql.Tx, lo, hi int) error {
	pl := payload(r.cfg.PayloadBytes)
	args := make([]any, 0, 4*mysqlInsertRows)
	for from := lo; from < hi; from += mysqlInsertRows {
		to := min(from+mysqlInsertRows, hi)
		args = args[:0]
		for i := from; i < to; i++ {
			key := int64(i)
			if r.cfg.Keys > 0 {
				key %= int64(r.cfg.Keys)
			}
			args = append(args, uuid.UUID(r.ids.id(int64(i))).String(), "bench", keyName(key), pl)
		}
		if _, err := tx.ExecContext(ctx, r.my.insertSQL(to-from), args...); err != nil {
			return fmt.Errorf("inserting events %d to %d: %w", from, to-1, err)
		}
	}
	return nil
}

// insertSQL is a plain INSERT of n events, as any application writes them.
func (m *mysqlRun) insertSQL(n int) string {
	var b strings.Builder
	b.WriteString("INSERT INTO " + m.tables.Outbox() + " (id, topic, `key`, payload) VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?)")
	}
	return b.String()
}

// drainMySQL is drain on MySQL: the backlog is committed in one
// transaction, the relays are woken in process (Relay.Wake, as an embedded
// application would after its commit: there is no NOTIFY), and an
// application's INSERT is timed throughout the drain.
func (r *run) drainMySQL(ctx context.Context) error {
	cfg := r.cfg
	rs, stop, err := r.runRelays(ctx)
	if err != nil {
		return err
	}
	defer stop()

	fmt.Fprintf(cfg.Progress, "inserting %d events over %s in database %s...\n", cfg.Events, keysText(cfg.Keys), r.tables.Schema)
	insertStart := time.Now()
	tx, err := r.my.admin.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("inserting the backlog: %w", err)
	}
	defer tx.Rollback()
	if err := r.insertMySQLEvents(ctx, tx, 0, cfg.Events); err != nil {
		return fmt.Errorf("inserting the backlog: %w", err)
	}
	m := r.startMeasuring("the measured phase (VmHWM reset at its start); includes the recorder")
	r.target.Store(int64(cfg.Events))
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("committing the backlog: %w", err)
	}
	m.start = time.Since(r.origin).Nanoseconds()
	rs.wake()
	fmt.Fprintf(cfg.Progress, "inserted in %s; draining with %d relay(s)...\n", time.Since(insertStart).Round(time.Millisecond), cfg.Relays)

	probe, err := r.startInsertProbe(ctx)
	if err != nil {
		return err
	}
	stopReports := r.startReports(ctx, m.start, nil)
	elapsed, cpu, err := r.awaitDelivery(ctx, rs, m, func() { stopReports(); probe.stop() }, stop)
	if err != nil {
		return err
	}
	r.res.Insert = probe.result()
	committed := make([]bool, cfg.Events)
	for i := range committed {
		committed[i] = true
	}
	r.finish(ctx, committed, elapsed, cpu, cpuScopeDrain)
	return nil
}

// insertProbeEvery spaces the probe's INSERTs.
const insertProbeEvery = 10 * time.Millisecond

// InsertResult is how long an application's INSERT into the outbox took
// while the relays drained it (MySQL's drain), and whether any would have
// waited for a lock the relays held (a claim's gap lock would do that).
type InsertResult struct {
	Latency *Percentiles `json:"latency_ms"`
	// LockWaits counts INSERTs that would have waited for a lock: the
	// probe's innodb_lock_wait_timeout is 0, which fails them at once with
	// error 1205 on MariaDB (MySQL 8 raises it to its minimum, 1s: there it
	// counts waits of a second or more).
	LockWaits int64 `json:"lock_waits"`
	// Errors counts INSERTs that failed otherwise.
	Errors int64 `json:"errors"`
}

// insertProbe times an INSERT into the outbox every insertProbeEvery, in a
// transaction at the server's default isolation (REPEATABLE READ, as an
// application's) that it rolls back, so that no event is added to the
// run's: the wait for a lock is the INSERT's, not its commit's.
type insertProbe struct {
	conn   *sql.Conn
	stop   func()
	mu     sync.Mutex
	nanos  []int64
	waits  int64
	errors int64
}

// startInsertProbe starts the probe on a connection of its own; stop it
// with its stop func before reading its result.
func (r *run) startInsertProbe(ctx context.Context) (*insertProbe, error) {
	conn, err := r.my.admin.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("connecting the insert probe: %w", err)
	}
	if _, err := conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 0"); err != nil {
		conn.Close()
		return nil, fmt.Errorf("setting the insert probe's lock wait timeout: %w", err)
	}
	p := &insertProbe{conn: conn}
	probeCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.loop(probeCtx, r.my.insertSQL(1), uuid.NewString)
	}()
	p.stop = sync.OnceFunc(func() {
		cancel()
		<-done
		conn.Close()
	})
	return p, nil
}

func (p *insertProbe) loop(ctx context.Context, insert string, newID func() string) {
	tick := time.NewTicker(insertProbeEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		tx, err := p.conn.BeginTx(ctx, nil)
		if err != nil {
			p.fail(ctx, err)
			continue
		}
		start := time.Now()
		_, err = tx.ExecContext(ctx, insert, newID(), "bench.probe", "probe", `{}`)
		took := time.Since(start)
		tx.Rollback()
		if err != nil {
			p.fail(ctx, err)
			continue
		}
		p.mu.Lock()
		p.nanos = append(p.nanos, took.Nanoseconds())
		p.mu.Unlock()
	}
}

// errLockWaitTimeout is MySQL's ER_LOCK_WAIT_TIMEOUT.
const errLockWaitTimeout = 1205

func (p *insertProbe) fail(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var num interface{ Number() uint16 }
	if errors.As(err, &num) && num.Number() == errLockWaitTimeout {
		p.waits++
		return
	}
	p.errors++
}

func (p *insertProbe) result() *InsertResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	return &InsertResult{Latency: percentiles(p.nanos), LockWaits: p.waits, Errors: p.errors}
}

// produce commits the events of ids and keys in one transaction with a
// plain INSERT.
func (m *mysqlRun) produce(ctx context.Context, db *sql.DB, ids, keys []string, pl string) error {
	args := make([]any, 0, 4*len(ids))
	for i := range ids {
		args = append(args, ids[i], "bench", keys[i], pl)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, m.insertSQL(len(ids)), args...); err != nil {
		return err
	}
	return tx.Commit()
}

// tableStats reads the backlog, the outbox's size (InnoDB's estimate) and
// InnoDB's history list length (unpurged undo: what dead tuples are to
// PostgreSQL).
func (m *mysqlRun) tableStats(ctx context.Context, iv *Interval) error {
	names := m.tables.Names()
	err := m.admin.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM `+m.tables.Outbox()+` WHERE status = 'pending'),
       coalesce((SELECT data_length + index_length FROM information_schema.tables WHERE table_schema = ? AND table_name = ?), 0)`,
		names.Schema, names.Table).Scan(&iv.Backlog, &iv.TableBytes)
	if err != nil {
		return err
	}
	var history int64
	switch err := m.admin.QueryRowContext(ctx, `SELECT count FROM information_schema.innodb_metrics WHERE name = 'trx_rseg_history_len'`).Scan(&history); {
	case err == nil:
		iv.HistoryLength = &history
	case !errors.Is(err, sql.ErrNoRows):
		return err
	}
	return nil
}

// isMySQL reports whether the run's database is MySQL or MariaDB.
func (c Config) isMySQL() bool { return mysqlurl.Is(c.DatabaseURL) }

// validateMySQL checks what is MySQL's in c.
func (c Config) validateMySQL() error {
	if _, err := mysqlurl.Config(c.DatabaseURL); err != nil {
		return fmt.Errorf("--database-url: %w", err)
	}
	if c.Mode != ModeDrain && c.Mode != ModeLive && c.Mode != ModeBinary {
		return fmt.Errorf("--mode: %s runs on PostgreSQL only; on MySQL, drain, live and binary", c.Mode)
	}
	if _, err := mysqlmigrations.NewTables(migrations.Tables{Table: c.Table}); err != nil {
		return fmt.Errorf("--table: %w", err)
	}
	return nil
}
