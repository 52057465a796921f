package deadletter_test

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/internal/mysqltest"
	"github.com/heraldhq/herald/internal/pgtest"
	_ "github.com/heraldhq/herald/internal/pgtest/pgcontainer" // a container when no server answers
	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/deadletter"
)

// testBundle is a store on fresh tables of one database: PostgreSQL (pool
// set) or MySQL (my set).
type testBundle struct {
	pool   *pgxpool.Pool
	my     *sql.DB
	myURL  string
	mt     mysqlmigrations.Tables
	tables migrations.Tables
	store  *deadletter.Store
}

// setup is a bundle on PostgreSQL.
func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	store, err := deadletter.New(pool, tables)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{pool: pool, tables: tables, store: store}
}

// setupMySQL is a bundle on a database of its own on MySQL, opened as a
// relay opens it.
func setupMySQL(t *testing.T) *testBundle {
	t.Helper()
	_, url := mysqltest.Database(t)
	db, err := relay.OpenMySQL(url, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	tables := migrations.Tables{}.WithDefaults()
	m, err := mysqlmigrations.NewMigrator(db, tables, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	mt, err := mysqlmigrations.NewTables(tables)
	if err != nil {
		t.Fatal(err)
	}
	store, err := deadletter.NewMySQL(db, tables)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{my: db, myURL: url, mt: mt, tables: tables, store: store}
}

// forEachDB runs test on PostgreSQL and on MySQL, in parallel.
func forEachDB(t *testing.T, test func(t *testing.T, tb *testBundle)) {
	t.Helper()
	for _, db := range []struct {
		name  string
		setup func(*testing.T) *testBundle
	}{{"postgres", setup}, {"mysql", setupMySQL}} {
		t.Run(db.name, func(t *testing.T) {
			t.Parallel()
			test(t, db.setup(t))
		})
	}
}

// exec runs a statement on PostgreSQL.
func (tb *testBundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := tb.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// execMy runs a statement on MySQL.
func (tb *testBundle) execMy(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := tb.my.Exec(sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// deliveries is the quoted deliveries table of the bundle's database.
func (tb *testBundle) deliveries() string {
	if tb.my != nil {
		return tb.mt.Deliveries()
	}
	return tb.tables.Deliveries()
}

// outboxTable is the quoted outbox table of the bundle's database.
func (tb *testBundle) outboxTable() string {
	if tb.my != nil {
		return tb.mt.Outbox()
	}
	return tb.tables.Outbox()
}

// dueIn dates e's ready delivery on sink due in d.
func (tb *testBundle) dueIn(t *testing.T, e *event, sink string, d time.Duration) {
	t.Helper()
	if tb.my != nil {
		tb.execMy(t, "UPDATE "+tb.mt.Deliveries()+" SET next_at = utc_timestamp(6) + INTERVAL ? MICROSECOND WHERE sink = ? AND seq = ?", d.Microseconds(), sink, e.seq)
		return
	}
	tb.exec(t, "UPDATE "+tb.tables.Deliveries()+" SET next_at = now() + $1::interval WHERE sink = $2 AND seq = $3", d, sink, e.seq)
}

// outboxRow is a row to write into the outbox.
type outboxRow struct {
	topic                   string
	done                    bool
	createdAgo, availableIn time.Duration
	payloadBin              []byte
	contentType             string
}

// outbox writes a row into the outbox and returns its id.
func (tb *testBundle) outbox(t *testing.T, r outboxRow) string {
	t.Helper()
	status, ct := "pending", pgtype.Text{String: r.contentType, Valid: r.contentType != ""}
	if r.done {
		status = "done"
	}
	if tb.my != nil {
		id := uuid.NewString()
		tb.execMy(t, "INSERT INTO "+tb.mt.Outbox()+` (id, topic, status, finished_at, created_at, available_at, payload_bin, content_type)
VALUES (?, ?, ?, CASE WHEN ? = 'done' THEN utc_timestamp(6) END, utc_timestamp(6) - INTERVAL ? MICROSECOND,
    utc_timestamp(6) + INTERVAL ? MICROSECOND, ?, ?)`, id, r.topic, status, status, r.createdAgo.Microseconds(),
			r.availableIn.Microseconds(), r.payloadBin, sql.NullString{String: r.contentType, Valid: r.contentType != ""})
		return id
	}
	var id string
	err := tb.pool.QueryRow(context.Background(), `INSERT INTO `+tb.tables.Outbox()+` (topic, status, finished_at, created_at, available_at, payload_bin, content_type)
VALUES ($1, $2, CASE WHEN $2 = 'done' THEN now() END, now() - $3::interval, now() + $4::interval, $5, $6) RETURNING id::text`,
		r.topic, status, r.createdAgo, r.availableIn, r.payloadBin, ct).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// published writes a sink and topic's published count of the minute
// minutesAgo minutes before this one.
func (tb *testBundle) published(t *testing.T, minutesAgo int, sink, topic string, n int) {
	t.Helper()
	if tb.my != nil {
		tb.execMy(t, "INSERT INTO "+tb.mt.Stats()+` (minute, sink, topic, published)
VALUES (cast(date_format(utc_timestamp(6), '%Y-%m-%d %H:%i:00') AS DATETIME(6)) - INTERVAL ? MINUTE, ?, ?, ?)`, minutesAgo, sink, topic, n)
		return
	}
	tb.exec(t, `INSERT INTO `+tb.tables.Stats()+` (minute, sink, topic, published)
VALUES (date_trunc('minute', now()) - $1 * interval '1 minute', $2, $3, $4)`, minutesAgo, sink, topic, n)
}

// event is an event written straight into the deliveries table, as the
// relay would have left it: its seq comes from the outbox's identity.
type event struct {
	seq        int64
	id         string
	topic, key string
	// payload (JSON text, default {"n": 1}), headers (a JSON object) and
	// maxAttempts are copied into each of its deliveries.
	payload, headers string
	maxAttempts      int
	createdAgo       time.Duration
}

// newEvent allocates an event's seq and id.
func (tb *testBundle) newEvent(t *testing.T, topic, key string) *event {
	t.Helper()
	e := &event{topic: topic, key: key}
	if tb.my != nil {
		// A seq from the outbox's counter, which InnoDB never hands out
		// twice.
		res, err := tb.my.Exec("INSERT INTO " + tb.mt.Outbox() + " (topic) VALUES ('seq')")
		if err != nil {
			t.Fatal(err)
		}
		if e.seq, err = res.LastInsertId(); err != nil {
			t.Fatal(err)
		}
		tb.execMy(t, "DELETE FROM "+tb.mt.Outbox()+" WHERE seq = ?", e.seq)
		e.id = uuid.NewString()
		return e
	}
	err := tb.pool.QueryRow(context.Background(), `SELECT nextval(pg_get_serial_sequence($1, 'seq')), gen_random_uuid()::text`,
		tb.tables.Outbox()).Scan(&e.seq, &e.id)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// delivery is one row of the deliveries table to write for an event.
type delivery struct {
	sink      string
	state     string // dead when empty
	stops     bool
	attempts  int
	lastError string
	diedAgo   time.Duration
}

// put writes deliveries of e.
func (tb *testBundle) put(t *testing.T, e *event, ds ...delivery) {
	t.Helper()
	payload, headers := e.payload, e.headers
	if payload == "" {
		payload = `{"n": 1}`
	}
	if headers == "" {
		headers = "{}"
	}
	for _, d := range ds {
		if d.state == "" {
			d.state = "dead"
		}
		if tb.my != nil {
			lane := crc32.ChecksumIEEE([]byte(cmp.Or(e.key, e.id))) & 63
			tb.execMy(t, `INSERT INTO `+tb.mt.Deliveries()+" (sink, seq, lane, id, topic, `key`, payload, headers, created_at,"+`
    max_attempts, state, stops_key, attempts, next_at, last_error, dead_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, utc_timestamp(6) - INTERVAL ? MICROSECOND,
    ?, ?, ?, ?, CASE WHEN ? = 'ready' THEN utc_timestamp(6) END, ?, CASE WHEN ? = 'dead' THEN utc_timestamp(6) - INTERVAL ? MICROSECOND END)`,
				d.sink, e.seq, lane, e.id, e.topic, sql.NullString{String: e.key, Valid: e.key != ""}, payload, headers,
				e.createdAgo.Microseconds(), sql.NullInt32{Int32: int32(e.maxAttempts), Valid: e.maxAttempts > 0}, d.state, d.stops,
				d.attempts, d.state, sql.NullString{String: d.lastError, Valid: d.lastError != ""}, d.state, d.diedAgo.Microseconds())
			continue
		}
		tb.exec(t, `INSERT INTO `+tb.tables.Deliveries()+` (sink, seq, lane, id, topic, key, payload, headers, created_at,
    max_attempts, state, stops_key, attempts, next_at, last_error, dead_at)
VALUES ($1, $2, hashtext(coalesce($5::text, $3::text)) & 63, $3::text::uuid, $4, $5, $6::json, $7::jsonb, now() - $8::interval,
    $9, $10, $11, $12, CASE WHEN $10 = 'ready' THEN now() END, $13, CASE WHEN $10 = 'dead' THEN now() - $14::interval END)`,
			d.sink, e.seq, e.id, e.topic, pgtype.Text{String: e.key, Valid: e.key != ""}, payload, headers, e.createdAgo,
			pgtype.Int4{Int32: int32(e.maxAttempts), Valid: e.maxAttempts > 0}, d.state, d.stops, d.attempts,
			pgtype.Text{String: d.lastError, Valid: d.lastError != ""}, d.diedAgo)
	}
}

// dead writes an event with one dead letter on each of sinks.
func (tb *testBundle) dead(t *testing.T, topic, key string, sinks ...string) *event {
	t.Helper()
	e := tb.newEvent(t, topic, key)
	for _, s := range sinks {
		tb.put(t, e, delivery{sink: s, lastError: "HTTP 500"})
	}
	return e
}

// row is a delivery's state as the tests compare it.
type row struct {
	state    string
	stops    bool
	attempts int
	due      bool // next_at set and not in the future
	err      bool // last_error set
	died     bool // dead_at set
}

func (r row) String() string {
	return fmt.Sprintf("%s stops=%v attempts=%d due=%v err=%v died=%v", r.state, r.stops, r.attempts, r.due, r.err, r.died)
}

var (
	ready   = row{state: "ready", due: true}
	waiting = row{state: "waiting"}
)

// row returns e's delivery on sink, or a row with state "gone".
func (tb *testBundle) row(t *testing.T, e *event, sink string) row {
	t.Helper()
	var r row
	if tb.my != nil {
		err := tb.my.QueryRow(`SELECT state, stops_key, attempts, coalesce(next_at <= utc_timestamp(6), false),
       last_error IS NOT NULL, dead_at IS NOT NULL
FROM `+tb.mt.Deliveries()+` WHERE sink = ? AND seq = ?`, sink, e.seq).Scan(&r.state, &r.stops, &r.attempts, &r.due, &r.err, &r.died)
		if errors.Is(err, sql.ErrNoRows) {
			return row{state: "gone"}
		}
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	err := tb.pool.QueryRow(context.Background(), `SELECT state, stops_key, attempts, coalesce(next_at <= now(), false),
       last_error IS NOT NULL, dead_at IS NOT NULL
FROM `+tb.tables.Deliveries()+` WHERE sink = $1 AND seq = $2`, sink, e.seq).Scan(&r.state, &r.stops, &r.attempts, &r.due, &r.err, &r.died)
	if err != nil && strings.Contains(err.Error(), "no rows") {
		return row{state: "gone"}
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// checkHeads fails unless every queue with waiting deliveries has exactly
// one head.
func (tb *testBundle) checkHeads(t *testing.T) {
	t.Helper()
	var bad []string
	if tb.my != nil {
		rows, err := tb.my.Query("SELECT concat(`key`, '/', sink) FROM " + tb.mt.Deliveries() + "\n" +
			"WHERE `key` IS NOT NULL AND (state <> 'dead' OR stops_key)\n" +
			"GROUP BY `key`, sink HAVING sum(state = 'ready' OR stops_key) <> 1")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var q string
			if err := rows.Scan(&q); err != nil {
				t.Fatal(err)
			}
			bad = append(bad, q)
		}
		if rows.Err() != nil || len(bad) > 0 {
			t.Fatalf("queues without exactly one head: %v (%v)", bad, rows.Err())
		}
		return
	}
	rows, err := tb.pool.Query(context.Background(), `SELECT key || '/' || sink FROM `+tb.tables.Deliveries()+`
WHERE key IS NOT NULL AND (state <> 'dead' OR stops_key)
GROUP BY key, sink HAVING count(*) FILTER (WHERE state = 'ready' OR stops_key) <> 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var q string
		if err := rows.Scan(&q); err != nil {
			t.Fatal(err)
		}
		bad = append(bad, q)
	}
	if rows.Err() != nil || len(bad) > 0 {
		t.Fatalf("queues without exactly one head: %v (%v)", bad, rows.Err())
	}
}

func (tb *testBundle) list(t *testing.T, f deadletter.Filter, opts deadletter.ListOpts) []deadletter.DeadLetter {
	t.Helper()
	var out []deadletter.DeadLetter
	if err := tb.store.List(context.Background(), f, opts, func(d deadletter.DeadLetter) error {
		out = append(out, d)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// names are dead letters as "id/sink".
func names(ds []deadletter.DeadLetter) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.ID + "/" + d.Sink
	}
	return out
}

func name(e *event, sink string) string { return e.id + "/" + sink }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (tb *testBundle) count(t *testing.T, table, where string) int {
	t.Helper()
	var n int
	if tb.my != nil {
		if err := tb.my.QueryRow("SELECT count(*) FROM " + table + " WHERE " + where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := tb.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table+" WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func sameSet(a, b []string) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}
