package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/migrations/pgtest"
	"github.com/heraldhq/herald/relay/internal/pgstore"
	"github.com/heraldhq/herald/sinks"
)

type testBundle struct {
	pool   *pgxpool.Pool
	tables migrations.Tables
	rec    *recorder
}

// newStore returns the session of a relay named owner on the test's tables,
// as a worker has it (with the empty configuration).
func newStore(pool *pgxpool.Pool, t migrations.Tables, owner string) *session {
	return &session{store: pgstore.New(pool, t), owner: owner}
}

func setup(t testing.TB) *testBundle {
	t.Helper()
	pool := pgtest.Pool(t)
	return &testBundle{pool: pool, tables: pgtest.Schema(t, pool), rec: newRecorder()}
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
	topics := make([]string, len(evs))
	keys := make([]pgtype.Text, len(evs))
	payloads := make([]string, len(evs))
	delays := make([]time.Duration, len(evs))
	maxAtt := make([]pgtype.Int4, len(evs))
	for i, e := range evs {
		topics[i] = e.topic
		keys[i] = pgtype.Text{String: e.key, Valid: e.key != ""}
		payloads[i] = e.payload
		if payloads[i] == "" {
			payloads[i] = fmt.Sprintf(`{"n":%d}`, i)
		}
		delays[i] = e.delay
		maxAtt[i] = pgtype.Int4{Int32: int32(e.maxAtt), Valid: e.maxAtt > 0}
	}
	rows, err := b.pool.Query(context.Background(), `INSERT INTO `+b.tables.Outbox()+` (topic, key, payload, available_at, max_attempts)
SELECT u.topic, u.key, u.payload::json, now() + u.delay, u.max FROM unnest($1::text[], $2::text[], $3::text[], $4::interval[], $5::int[])
  WITH ORDINALITY AS u(topic, key, payload, delay, max, n) ORDER BY u.n RETURNING seq`, topics, keys, payloads, delays, maxAtt)
	if err != nil {
		t.Fatalf("inserting events: %v", err)
	}
	var seqs []int64
	for rows.Next() {
		var s int64
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("inserting events: %v", err)
	}
	return seqs
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
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
	r, err := New(b.pool, cfg)
	if err != nil {
		t.Fatalf("relay.New: %v", err)
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
	waitFor(t, 30*time.Second, fmt.Sprintf("%d more claims", n), func() bool { return p.claims.Load() >= target })
}

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

func (b *testBundle) count(t testing.TB, where string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.tables.Outbox()+" WHERE "+where).Scan(&n); err != nil {
		t.Fatalf("counting rows: %v", err)
	}
	return n
}

// autovacuumOff turns autovacuum off on the test's tables: only the relay
// vacuums them then, and their dead tuples stay until it does.
func (b *testBundle) autovacuumOff(t testing.TB) {
	t.Helper()
	for _, table := range []string{b.tables.Outbox(), b.tables.Deliveries()} {
		if _, err := b.pool.Exec(context.Background(), "ALTER TABLE "+table+" SET (autovacuum_enabled = false)"); err != nil {
			t.Fatalf("turning autovacuum off on %s: %v", table, err)
		}
	}
}

// outboxVacuums returns how many times the outbox was vacuumed by a VACUUM
// command (on a test's own table, only the relay runs one; autovacuum's are
// counted apart) and its dead tuples now.
func (b *testBundle) outboxVacuums(t testing.TB) (vacuums, dead int64) {
	t.Helper()
	if err := b.pool.QueryRow(context.Background(), `SELECT vacuum_count, n_dead_tup
FROM pg_stat_user_tables WHERE relid = to_regclass($1)`, b.tables.Outbox()).Scan(&vacuums, &dead); err != nil {
		t.Fatalf("reading the outbox's vacuum statistics: %v", err)
	}
	return vacuums, dead
}

func (b *testBundle) countDeliveries(t testing.TB, where string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.tables.Deliveries()+" WHERE "+where).Scan(&n); err != nil {
		t.Fatalf("counting deliveries: %v", err)
	}
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
