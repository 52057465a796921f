package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/sinks"
)

// testBundle is a test's own database with Herald's tables, on one store,
// and the recorder its test sinks write to. The SQL it runs is in the
// store's harness (store_postgres_test.go, store_mysql_test.go); the tests
// that use only the bundle's methods run on every store (eachStore).
type testBundle struct {
	db testDB
	// tables is what Config.Tables takes: the test's schema on PostgreSQL,
	// the default names in the test's own database on MySQL.
	tables migrations.Tables
	rec    *recorder
	// pool is set on PostgreSQL only, for the tests that are PostgreSQL's
	// alone (LISTEN/NOTIFY, vacuum, triggers).
	pool *pgxpool.Pool
}

// testDB is what the behavioural tests need of a store's database, in
// plain SQL: the statements are written for the store, with the table
// names quoted its way and no placeholders (a test formats a seq in).
type testDB interface {
	// names are the test's tables, quoted.
	names() tableNames
	// now is the SQL of the time the tables' defaults use.
	now() string
	// insert runs one transaction inserting evs with plain SQL, commits it
	// (or rolls it back) and returns their seqs in the order of evs.
	insert(t testing.TB, evs []ev, commit bool) []int64
	exec(t testing.TB, q string)
	// queryRow scans the one row of q into dest.
	queryRow(t testing.TB, q string, dest ...any)
	// lockRow locks the outbox row seq in a transaction of its own, as an
	// operator's statement left open would, until unlock (or the test's
	// end).
	lockRow(t testing.TB, seq int64) (unlock func())
	// newRelay returns a relay on the test's database, with a connection
	// pool of its own where the store wants one (closed when the test ends).
	newRelay(t testing.TB, cfg Config) (*Relay, error)
	// session returns the session of a relay named owner, as a worker has
	// it (with the empty configuration), for tests that drive its steps.
	session(t testing.TB, owner string) *session
	// deadLetters returns the operators' dead-letter store on the test's
	// tables, as `relay dlq` opens it.
	deadLetters(t testing.TB) *deadletter.Store
}

// tableNames are the quoted names of the test's tables.
type tableNames interface {
	Outbox() string
	Deliveries() string
	Lanes() string
	Relays() string
}

// eachStore runs test as a parallel subtest on each store, named after it,
// each with a database of its own.
func eachStore(t *testing.T, test func(t *testing.T, b *testBundle)) {
	t.Helper()
	for _, s := range []struct {
		name  string
		setup func(testing.TB) *testBundle
	}{{"postgres", setup}, {"mysql", setupMySQL}} {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			test(t, s.setup(t))
		})
	}
}

// expireLeases ends the leases of the lanes owner holds a second ago on
// the database's clock, the clock leases are compared on, as if owner had
// stopped renewing them a lease ago: a test takes them over without
// waiting for a lease.
func (b *testBundle) expireLeases(t testing.TB, owner string) {
	t.Helper()
	b.db.exec(t, fmt.Sprintf("UPDATE %s SET lease_until = %s - INTERVAL '1' SECOND WHERE owner = '%s'",
		b.db.names().Lanes(), b.db.now(), strings.ReplaceAll(owner, "'", "''")))
}

// makeDue makes the ready deliveries matching where due now on the
// database's clock, the clock their next attempt is compared on: a test
// sees a retry without waiting for its backoff.
func (b *testBundle) makeDue(t testing.TB, where string) {
	t.Helper()
	b.db.exec(t, fmt.Sprintf("UPDATE %s SET next_at = %s WHERE state = 'ready' AND %s", b.db.names().Deliveries(), b.db.now(), where))
}

// session returns the session of a relay named owner on the test's tables.
func (b *testBundle) session(t testing.TB, owner string) *session {
	t.Helper()
	return b.db.session(t, owner)
}

// delivery is one event as a test sink received it.
type received struct {
	sink    string
	id, key string
	seq     int64
	attempt int
	at      time.Time
}

// recorder collects what test sinks received, shared by several sinks.
type recorder struct {
	mu   sync.Mutex
	got  []received
	cond *sync.Cond
}

func newRecorder() *recorder {
	r := &recorder{}
	r.cond = sync.NewCond(&r.mu)
	return r
}

func (r *recorder) all() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.got...)
}

func (r *recorder) forSink(sink string) []received {
	var out []received
	for _, g := range r.all() {
		if g.sink == sink {
			out = append(out, g)
		}
	}
	return out
}

// testSink delivers to a recorder; fail decides an event's result.
type testSink struct {
	name  string
	rec   *recorder
	fail  func(e sinks.Event) error
	delay time.Duration
	calls int
	mu    sync.Mutex
}

func (s *testSink) Name() string { return s.name }

func (s *testSink) Publish(ctx context.Context, events []sinks.Event) []error {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	if s.delay > 0 {
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return sinks.Fill(len(events), ctx.Err())
		}
	}
	errs := make([]error, len(events))
	failedKeys := map[string]bool{}
	now := time.Now()
	for i, e := range events {
		if e.Key != "" && failedKeys[e.Key] {
			errs[i] = sinks.ErrSkipped
			continue
		}
		if s.fail != nil {
			if err := s.fail(e); err != nil {
				errs[i] = err
				if e.Key != "" {
					failedKeys[e.Key] = true
				}
				continue
			}
		}
		s.rec.mu.Lock()
		s.rec.got = append(s.rec.got, received{sink: s.name, id: e.ID, key: e.Key, seq: e.Seq, attempt: e.Attempt, at: now})
		s.rec.cond.Broadcast()
		s.rec.mu.Unlock()
	}
	return errs
}

func (s *testSink) Close(context.Context) error { return nil }

// publishes is the number of Publish calls so far, finished or not.
func (s *testSink) publishes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// ev is an event to insert with plain SQL, as any language would.
type ev struct {
	topic, key string
	payload    string
	delay      time.Duration
	maxAtt     int
}

// insert commits events in one transaction and returns their seqs.
func (b *testBundle) insert(t testing.TB, evs ...ev) []int64 {
	t.Helper()
	return b.db.insert(t, evs, true)
}

// insertRolledBack inserts events in a transaction it rolls back.
func (b *testBundle) insertRolledBack(t testing.TB, evs ...ev) {
	t.Helper()
	b.db.insert(t, evs, false)
}

// payload is the JSON of e, or a small default one for the i-th event.
func (e ev) payloadOr(i int) string {
	if e.payload != "" {
		return e.payload
	}
	return fmt.Sprintf(`{"n":%d}`, i)
}

// testLogger is the relay's log in a test: with -v, every level on
// stderr; otherwise Info and above through t.Log, printed only if the test
// fails, so that a failure in CI comes with the relay's account of it.
func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	w := &testLog{t: t}
	t.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// testLog writes to t.Log until the test's cleanup closes it: a goroutine
// that outlives its relay must not log to a finished test.
type testLog struct {
	mu     sync.Mutex
	t      testing.TB
	closed bool
}

func (w *testLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testLog) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
}

// config returns a fast-cycling config routing every topic to s.
func (b *testBundle) config(t testing.TB, targets ...sinks.Sink) Config {
	var ts []Target
	for _, s := range targets {
		ts = append(ts, Target{Sink: s})
	}
	return Config{
		Tables:       b.tables,
		BatchSize:    200,
		Lease:        5 * time.Second,
		PollInterval: 100 * time.Millisecond,
		Backoff:      Backoff{Initial: 50 * time.Millisecond, Max: time.Second, Jitter: -1},
		SinkPause:    Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond, Jitter: -1},
		Routes:       []Route{{Topics: []string{"*"}, Targets: ts}},
		Logger:       testLogger(t),
	}
}

// start runs a relay until the test ends (or stop is called) and returns
// stop, which waits for Run to return. tune, if given, changes the relay
// before it runs.
func (b *testBundle) start(t testing.TB, cfg Config, tune ...func(*Relay)) (stop func()) {
	t.Helper()
	r, err := b.db.newRelay(t, cfg)
	if err != nil {
		t.Fatalf("new relay: %v", err)
	}
	for _, f := range tune {
		f(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("relay.Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("relay did not stop within 30s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// progress counts the relay's claim round trips. A test waits on it to know
// that the relay went past the point where a bug would have shown, instead
// of sleeping for a time a loaded machine may not honour.
type progress struct {
	NopObserver
	claims atomic.Int64
}

func (p *progress) Claimed(int, time.Duration) { p.claims.Add(1) }

// waitClaims waits until the relay has made n more claim round trips than
// when it was called. With one worker (Config.Workers), each of them
// follows the record of the batch before it, and an idle worker claims
// queued deliveries every PollInterval.
func (p *progress) waitClaims(t testing.TB, n int64) {
	t.Helper()
	target := p.claims.Load() + n
	waitFor(t, time.Minute, fmt.Sprintf("%d more claims", n), func() bool { return p.claims.Load() >= target })
}

// testClock is a Config.Clock a test moves forward: the relay's view of
// its lanes' lease (when to renew, how long lanes taken over wait) follows
// it, so a test ends a lease or a quarantine at once instead of waiting
// for one. Between moves it runs with time.Now.
type testClock struct{ ahead atomic.Int64 }

func (c *testClock) now() time.Time { return time.Now().Add(time.Duration(c.ahead.Load())) }

// advance moves the clock d forward.
func (c *testClock) advance(d time.Duration) { c.ahead.Add(int64(d)) }

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// count counts the outbox rows matching where.
func (b *testBundle) count(t testing.TB, where string) int {
	t.Helper()
	return b.countIn(t, b.db.names().Outbox(), where)
}

// countDeliveries counts the deliveries matching where.
func (b *testBundle) countDeliveries(t testing.TB, where string) int {
	t.Helper()
	return b.countIn(t, b.db.names().Deliveries(), where)
}

// countIn counts the rows of table matching where.
func (b *testBundle) countIn(t testing.TB, table, where string) int {
	t.Helper()
	var n int
	b.db.queryRow(t, "SELECT count(*) FROM "+table+" WHERE "+where, &n)
	return n
}

// checkKeyOrder fails if, at one sink, a key's events arrived out of seq
// order once re-deliveries of the same event are removed.
func checkKeyOrder(t testing.TB, got []received) {
	t.Helper()
	seen := map[string]bool{}
	last := map[[2]string]int64{}
	for _, g := range got {
		if seen[g.sink+g.id] || g.key == "" {
			seen[g.sink+g.id] = true
			continue
		}
		seen[g.sink+g.id] = true
		k := [2]string{g.sink, g.key}
		if prev, ok := last[k]; ok && g.seq < prev {
			t.Fatalf("sink %s key %s: seq %d arrived after seq %d", g.sink, g.key, g.seq, prev)
		}
		last[k] = g.seq
	}
}

// exactlyOnce fails unless every seq in want was delivered once to sink.
func exactlyOnce(t testing.TB, got []received, sink string, want []int64) {
	t.Helper()
	n := map[int64]int{}
	for _, g := range got {
		if g.sink == sink {
			n[g.seq]++
		}
	}
	for _, s := range want {
		if n[s] != 1 {
			t.Fatalf("sink %s: seq %d delivered %d times, want once", sink, s, n[s])
		}
	}
	if len(n) != len(want) {
		t.Fatalf("sink %s: %d distinct events delivered, want %d", sink, len(n), len(want))
	}
}

func seqsOf(got []received) []int64 {
	out := make([]int64, 0, len(got))
	for _, g := range got {
		out = append(out, g.seq)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

var errBoom = errors.New("boom")
