package relay

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/sinks"
)

var (
	modelSeed = flag.Uint64("model.seed", 0, "run TestModel with this seed only")
	modelRuns = flag.Int("model.runs", 0, "run TestModel with this many random seeds instead of the fixed ones (a longer soak)")
	modelOps  = flag.Int("model.ops", 60, "operations per TestModel run")
)

// modelSeeds are the seeds TestModel runs by default (in CI): odd seeds run
// with stop_key_on_dead_letter, even ones without.
var modelSeeds = []uint64{1, 2, 3, 4}

// TestModel drives relays through a random sequence (seeded, printed) of
// inserts over a few keys, sink failures (retryable, permanent, down,
// flaky), sinks turning slow (answers later than the relay waits, so that
// events stay in flight across batches) or timing out (no answer before
// the call's deadline), dead letters replayed and purged, route edits, and
// relays killed mid-batch (their database connections cut) and restarted. Then every sink
// heals, an operator replays what is dead (and purges what has no route),
// and the test checks that the outbox and the queues drain, that every
// event reached every sink of its route (or was purged there), and that at
// each sink a key's events arrived in seq order once duplicates are removed
// (an event replayed after its key moved on is, by design, out of order).
//
//	go test ./relay -run TestModel -model.seed 7     # one seed
//	go test ./relay -run TestModel -model.runs 200   # a soak over random seeds
//
// PostgreSQL only: its relays are killed by a TCP proxy in front of a pgx
// pool (proxy_test.go), which has no MySQL counterpart yet; its replays
// and purges are the dead-letter store's, which the replay and purge tests
// in failure_test.go run on both stores.
func TestModel(t *testing.T) {
	t.Parallel()
	seeds := modelSeeds
	switch {
	case *modelSeed != 0:
		seeds = []uint64{*modelSeed}
	case *modelRuns > 0:
		seeds = nil
		for range *modelRuns {
			seeds = append(seeds, rand.Uint64()%1_000_000+1)
		}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			t.Logf("replay with: go test ./relay -run 'TestModel/seed=%d$' -model.seed %d", seed, seed)
			runModel(t, seed)
		})
	}
}

// sinkMode is how a model sink answers.
type sinkMode int32

const (
	modeOK      sinkMode = iota
	modeRetry            // every event fails, retryably
	modeDown             // the sink is down (Unavailable)
	modeFlaky            // a third of the attempts fail, retryably
	modeRefuse           // events of one key are refused for good
	modeSlow             // each event is answered some tens of milliseconds late
	modeTimeout          // nothing is answered before the call's deadline
)

var modeNames = []string{"ok", "retry", "down", "flaky", "refuse", "slow", "timeout"}

// modelSink answers as its mode says and records what it delivered. A naive
// one keeps sending a key's events after one of them failed in the call,
// and answers only when its call returns; the others send one event at a
// time (sinks.PublishEach), reporting each result as it comes.
type modelSink struct {
	name   string
	naive  bool
	rec    *recorder
	mode   atomic.Int32
	refuse atomic.Pointer[string]
	limit  *sinks.Limiter
}

func (s *modelSink) Name() string { return s.name }

// PublishesConcurrently: the one-at-a-time sinks are called concurrently,
// the naive one takes turns.
func (s *modelSink) PublishesConcurrently() bool { return !s.naive }

func (s *modelSink) Publish(ctx context.Context, events []sinks.Event) []error {
	if sinkMode(s.mode.Load()) == modeTimeout {
		<-ctx.Done()
		return sinks.Fill(len(events), ctx.Err())
	}
	if !s.naive {
		return sinks.NewResults(ctx, events, nil).PublishEach(s.limit, s.publish)
	}
	errs := make([]error, len(events))
	for i := range events {
		errs[i] = s.publish(ctx, &events[i])
	}
	return errs
}

// publish sends one event: late in modeSlow, then answered as the mode
// says.
func (s *modelSink) publish(ctx context.Context, e *sinks.Event) error {
	if sinkMode(s.mode.Load()) == modeSlow {
		h := fnv.New32a()
		fmt.Fprintf(h, "%s/%d", e.ID, e.Attempt)
		select {
		case <-time.After(time.Duration(20+h.Sum32()%60) * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := s.result(*e); err != nil {
		return err
	}
	s.rec.mu.Lock()
	s.rec.got = append(s.rec.got, received{sink: s.name, id: e.ID, key: e.Key, seq: e.Seq, attempt: e.Attempt, at: time.Now()})
	s.rec.mu.Unlock()
	return nil
}

func (s *modelSink) result(e sinks.Event) error {
	switch sinkMode(s.mode.Load()) {
	case modeRetry:
		return errors.New("HTTP 503")
	case modeDown:
		return sinks.Unavailable(errors.New("dial tcp: connection refused"))
	case modeFlaky:
		h := fnv.New32a()
		fmt.Fprintf(h, "%s/%d", e.ID, e.Attempt)
		if h.Sum32()%3 == 0 {
			return errors.New("HTTP 502")
		}
	case modeRefuse:
		if k := s.refuse.Load(); k != nil && *k == e.Key {
			return sinks.Permanent(errors.New("HTTP 400"))
		}
	}
	return nil
}

func (s *modelSink) Close(context.Context) error { return nil }

// modelRelay is one relay of the model, connected through its own proxy so
// that it can be killed: cut off from the database mid-batch, leaving its
// lanes leased and its batch unrecorded.
type modelRelay struct {
	owner  string
	proxy  *dbProxy
	cancel context.CancelFunc
	done   chan error
}

type sinkSeq struct {
	sink string
	seq  int64
}

type modelEvent struct {
	topic, key string
	insertedAt time.Time
}

// model is one run's state and what the checks need to know.
type model struct {
	t       *testing.T
	rnd     *rand.Rand
	b       *testBundle
	store   *deadletter.Store
	stopKey bool
	sinks   []*modelSink
	relays  []*modelRelay
	nextID  int

	// cLess is set while sink C is out of topic t3's route (and, with
	// cGone, out of every route); windows are the times it was.
	cLess, cGone bool
	windows      [][2]time.Time

	events   map[int64]modelEvent
	replayed map[sinkSeq]bool // replayed dead letters that did not stop their key
	purged   map[sinkSeq]bool
}

var modelTopics = []string{"t1", "t2", "t3"}

// fullRoute is every sink each topic is routed to when no route is edited.
var fullRoute = map[string][]string{"t1": {"A", "B"}, "t2": {"B", "C"}, "t3": {"A", "B", "C"}}

func runModel(t *testing.T, seed uint64) {
	m := &model{
		t:        t,
		rnd:      rand.New(rand.NewPCG(seed, seed)),
		b:        setup(t),
		stopKey:  seed%2 == 1,
		events:   map[int64]modelEvent{},
		replayed: map[sinkSeq]bool{},
		purged:   map[sinkSeq]bool{},
	}
	var err error
	if m.store, err = deadletter.New(m.b.pool, m.b.tables); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"A", "B", "C"} {
		m.sinks = append(m.sinks, &modelSink{name: name, naive: name == "B", rec: m.b.rec, limit: sinks.NewLimiter(4)})
	}
	m.start()
	m.start()
	for range *modelOps {
		m.step()
	}
	m.heal()
	m.check()
}

func (m *model) sink(name string) *modelSink {
	for _, s := range m.sinks {
		if s.name == name {
			return s
		}
	}
	return nil
}

func (m *model) routes() []Route {
	a, b, c := m.sink("A"), m.sink("B"), m.sink("C")
	t3 := []Target{{Sink: a}, {Sink: b}, {Sink: c}}
	t2 := []Target{{Sink: b}, {Sink: c}}
	if m.cLess {
		t3 = t3[:2]
	}
	if m.cGone {
		t2 = t2[:1]
	}
	return []Route{
		{Topics: []string{"t1"}, Targets: []Target{{Sink: a}, {Sink: b}}},
		{Topics: []string{"t2"}, Targets: t2},
		{Topics: []string{"t3"}, Targets: t3},
	}
}

func (m *model) logf(format string, args ...any) {
	if testing.Verbose() {
		m.t.Logf(format, args...)
	}
}

// start starts a relay with the current routes.
func (m *model) start() {
	m.nextID++
	r := &modelRelay{owner: fmt.Sprintf("model-%d", m.nextID), proxy: newDBProxy(m.t, databaseAddr(m.t)), done: make(chan error, 1)}
	workers := 1 + m.rnd.IntN(2)
	cfg := Config{
		Tables:              m.b.tables,
		Owner:               r.owner,
		Workers:             workers,
		BatchSize:           5 + m.rnd.IntN(40),
		Lease:               2 * time.Second,
		PollInterval:        50 * time.Millisecond,
		MaxAttempts:         4,
		HandOffAfter:        time.Duration(5+m.rnd.IntN(30)) * time.Millisecond,
		MaxInFlight:         5 + m.rnd.IntN(60),
		Backoff:             Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		SinkPause:           Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond},
		ShutdownTimeout:     2 * time.Second,
		StopKeyOnDeadLetter: m.stopKey,
		Routes:              m.routes(),
		Logger:              testLogger(m.t),
	}
	rl, err := NewPostgres(r.proxy.pool(m.t, workers), cfg)
	if err != nil {
		m.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- rl.Run(ctx) }()
	m.relays = append(m.relays, r)
	// Registered after its pool's: runs before the pool is closed.
	m.t.Cleanup(func() {
		if i := slices.Index(m.relays, r); i >= 0 {
			m.stop(i, false)
		}
	})
	m.logf("start %s (workers %d, batch %d, C out of t3 %v, out of all %v)", r.owner, workers, cfg.BatchSize, m.cLess, m.cGone)
}

// stop stops relay i, gracefully or (kill) by cutting it off first.
func (m *model) stop(i int, kill bool) {
	r := m.relays[i]
	m.relays = slices.Delete(m.relays, i, i+1)
	if kill {
		r.proxy.cutOff()
	}
	r.cancel()
	if err := <-r.done; err != nil && !kill {
		m.t.Errorf("%s: Run = %v", r.owner, err)
	}
	m.logf("stop %s (killed %v)", r.owner, kill)
}

func (m *model) stopAll() { // gracefully
	for len(m.relays) > 0 {
		m.stop(0, false)
	}
}

// step performs one random operation.
func (m *model) step() {
	ctx := context.Background()
	switch n := m.rnd.IntN(100); {
	case n < 30:
		m.insert()
	case n < 45:
		s := m.sinks[m.rnd.IntN(len(m.sinks))]
		mode := sinkMode(m.rnd.IntN(len(modeNames)))
		if mode == modeRefuse {
			k := fmt.Sprintf("k%d", m.rnd.IntN(4))
			s.refuse.Store(&k)
		}
		s.mode.Store(int32(mode))
		m.logf("sink %s: %s", s.name, modeNames[mode])
	case n < 52:
		m.replay(ctx, m.rnd.IntN(2) == 0)
	case n < 57:
		m.purge(ctx, func(deadletter.DeadLetter) bool { return m.rnd.IntN(3) == 0 })
	case n < 60:
		if len(m.relays) > 0 {
			m.stop(m.rnd.IntN(len(m.relays)), true)
		}
		if len(m.relays) == 0 {
			m.start()
		}
	case n < 63:
		if len(m.relays) > 0 {
			m.stop(m.rnd.IntN(len(m.relays)), false)
		}
		m.start()
	case n < 66:
		m.editRoutes(!m.cLess, m.rnd.IntN(2) == 0)
	default:
		time.Sleep(time.Duration(20+m.rnd.IntN(200)) * time.Millisecond)
	}
}

func (m *model) insert() {
	evs := make([]ev, 1+m.rnd.IntN(15))
	for i := range evs {
		evs[i] = ev{topic: modelTopics[m.rnd.IntN(len(modelTopics))]}
		if m.rnd.IntN(40) == 0 {
			evs[i].topic = "nowhere"
		}
		if m.rnd.IntN(10) != 0 {
			evs[i].key = fmt.Sprintf("k%d", m.rnd.IntN(4))
		}
	}
	now := time.Now()
	for i, seq := range m.b.insert(m.t, evs...) {
		m.events[seq] = modelEvent{topic: evs[i].topic, key: evs[i].key, insertedAt: now}
	}
}

// editRoutes restarts the relays with sink C out of (or back in) topic t3's
// route, and with gone, out of every route.
func (m *model) editRoutes(cLess, gone bool) {
	n := max(len(m.relays), 1)
	m.stopAll()
	if cLess && !m.cLess {
		m.windows = append(m.windows, [2]time.Time{time.Now(), {}})
	}
	if !cLess && m.cLess {
		m.windows[len(m.windows)-1][1] = time.Now()
	}
	m.cLess, m.cGone = cLess, cLess && gone
	for range n {
		m.start()
	}
}

// deadLetters lists every dead letter.
func (m *model) deadLetters(ctx context.Context) []deadletter.DeadLetter {
	var out []deadletter.DeadLetter
	if err := m.store.List(ctx, deadletter.Filter{}, deadletter.ListOpts{}, func(d deadletter.DeadLetter) error {
		out = append(out, d)
		return nil
	}); err != nil {
		m.t.Fatal(err)
	}
	return out
}

// replay replays some dead letters (all of them with all), sink by sink,
// except those of the routing step with no route.
func (m *model) replay(ctx context.Context, all bool) {
	bySink := map[string][]string{}
	for _, d := range m.deadLetters(ctx) {
		if d.Sink == "" && m.events[d.Seq].topic == "nowhere" {
			continue
		}
		if !all && m.rnd.IntN(2) == 0 {
			continue
		}
		bySink[d.Sink] = append(bySink[d.Sink], d.ID)
		if !d.StopsKey {
			m.replayed[sinkSeq{d.Sink, d.Seq}] = true
		}
	}
	for sink, ids := range bySink {
		res, err := m.store.Replay(ctx, deadletter.Filter{IDs: ids, Sink: sink}, deadletter.ReplayOpts{})
		if err != nil {
			m.t.Fatal(err)
		}
		m.logf("replayed %d dead letters on %q", res.Count, sink)
	}
}

// purge purges the dead letters pick chooses, sink by sink.
func (m *model) purge(ctx context.Context, pick func(deadletter.DeadLetter) bool) {
	bySink := map[string][]string{}
	for _, d := range m.deadLetters(ctx) {
		if pick(d) {
			bySink[d.Sink] = append(bySink[d.Sink], d.ID)
			m.purged[sinkSeq{d.Sink, d.Seq}] = true
		}
	}
	for sink, ids := range bySink {
		res, err := m.store.Purge(ctx, deadletter.Filter{IDs: ids, Sink: sink}, deadletter.PurgeOpts{})
		if err != nil {
			m.t.Fatal(err)
		}
		m.logf("purged %d dead letters on %q", res.Count, sink)
	}
}

// heal makes every sink healthy and every route whole, then acts as an
// operator until nothing waits: dead letters are replayed, those with no
// route purged.
func (m *model) heal() {
	ctx := context.Background()
	for _, s := range m.sinks {
		s.mode.Store(int32(modeOK))
	}
	if m.cLess {
		m.editRoutes(false, false)
	}
	for len(m.relays) < 2 {
		m.start()
	}
	m.logf("healed")
	deadline := time.Now().Add(90 * time.Second)
	for {
		m.purge(ctx, func(d deadletter.DeadLetter) bool { return d.Sink == "" })
		m.replay(ctx, true)
		// Settled: nothing is due or about to be. What still waits can
		// only wait behind a dead letter that stops its key (each queue
		// has a head), which the next round replays or purges; a
		// delivery waiting with no head would never move, and time out.
		for m.b.count(m.t, "true") > 0 || m.b.countDeliveries(m.t, "state = 'ready'") > 0 {
			if time.Now().After(deadline) {
				m.dump()
				m.t.Fatal("the outbox and the queues did not drain in 90s")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if m.b.countDeliveries(m.t, "true") == 0 {
			return
		}
		if time.Now().After(deadline) {
			m.dump()
			m.t.Fatal("deliveries left waiting with nothing due (stranded)")
		}
	}
}

// dump logs what is left in the tables.
func (m *model) dump() {
	ctx := context.Background()
	for _, q := range []string{
		`SELECT 'outbox ' || seq || ' ' || topic || ' ' || coalesce(key, '-') || ' due ' || available_at FROM ` + m.b.tables.Outbox() + ` ORDER BY seq`,
		`SELECT 'delivery ' || quote_literal(sink) || ' ' || seq || ' ' || coalesce(key, '-') || ' ' || state ||
    CASE WHEN stops_key THEN ' stops' ELSE '' END || ' attempts ' || attempts || ' next ' || coalesce(next_at::text, '-') ||
    ' lane ' || lane || ' ' || coalesce(last_error, '') FROM ` + m.b.tables.Deliveries() + ` ORDER BY key, sink, seq`,
		`SELECT 'lane ' || lane || ' ' || coalesce(owner, '-') || ' until ' || coalesce(lease_until::text, '-') FROM ` + m.b.tables.Lanes() + ` ORDER BY lane`,
		`SELECT 'relay ' || owner || ' until ' || heartbeat_until FROM ` + m.b.tables.Relays(),
	} {
		rows, err := m.b.pool.Query(ctx, q)
		if err != nil {
			m.t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			m.t.Fatal(err)
		}
		for _, l := range lines {
			m.t.Log(l)
		}
	}
}

// check compares what the sinks received with what was inserted.
func (m *model) check() {
	got := m.b.rec.all()
	delivered := map[sinkSeq]bool{}
	for _, g := range got {
		e, ok := m.events[g.seq]
		if !ok {
			m.t.Fatalf("sink %s received seq %d, which was never inserted", g.sink, g.seq)
		}
		if !slices.Contains(fullRoute[e.topic], g.sink) {
			m.t.Fatalf("sink %s received seq %d of topic %s, not routed there", g.sink, g.seq, e.topic)
		}
		delivered[sinkSeq{g.sink, g.seq}] = true
	}
	missing := 0
	for seq, e := range m.events {
		for _, sink := range fullRoute[e.topic] {
			ss := sinkSeq{sink, seq}
			if delivered[ss] || m.purged[ss] || (sink == "C" && m.cOutDuring(e)) {
				continue
			}
			missing++
			if missing <= 10 {
				m.t.Errorf("seq %d (topic %s, key %q) never reached sink %s", seq, e.topic, e.key, sink)
			}
		}
		if e.topic == "nowhere" && !m.purged[sinkSeq{"", seq}] {
			m.t.Errorf("seq %d has no route and was not purged", seq)
		}
	}
	if missing > 0 {
		m.t.Fatalf("%d deliveries missing", missing)
	}

	// Per sink and key, events in seq order once duplicates are removed,
	// leaving out events replayed after their key moved on. A sink that
	// holds back a key's later events once one failed (A, C) never shows a
	// later event before an earlier one: a consumer may keep the first copy
	// of each. B sends them anyway; the relay sends them again after the
	// failed one, so there the last copies are in order.
	//
	// Nor are C's events that a route without C could have claimed: a
	// relay running that route publishes a key's later events of another
	// topic to C, and when it dies before recording, a relay with C back
	// in the route claims the earlier event again and sends it to C too,
	// after them (see "Relays that disagree" in docs/architecture.md).
	order := func(got []received) []received {
		seen := map[sinkSeq]bool{}
		var out []received
		for _, g := range got {
			ss := sinkSeq{g.sink, g.seq}
			if !seen[ss] && g.key != "" && !m.replayed[ss] && !(g.sink == "C" && m.cOutDuring(m.events[g.seq])) {
				out = append(out, g)
			}
			seen[ss] = true
		}
		return out
	}
	var firsts, lasts []received
	for _, g := range got {
		if !m.sink(g.sink).naive {
			firsts = append(firsts, g)
		}
	}
	for i := len(got) - 1; i >= 0; i-- {
		if m.sink(got[i].sink).naive {
			lasts = append(lasts, got[i])
		}
	}
	lasts = order(lasts)
	slices.Reverse(lasts)
	last := map[[2]string]int64{}
	for _, g := range append(order(firsts), lasts...) {
		k := [2]string{g.sink, g.key}
		if prev, ok := last[k]; ok && g.seq < prev {
			for _, h := range got {
				if h.sink == g.sink && (h.seq == g.seq || h.seq == prev) {
					m.t.Logf("  %s seq %d attempt %d at %s", h.sink, h.seq, h.attempt, h.at.Format("15:04:05.000"))
				}
			}
			m.t.Fatalf("sink %s key %s: seq %d arrived after seq %d (stop key %v)", g.sink, g.key, g.seq, prev, m.stopKey)
		}
		last[k] = g.seq
	}
	m.t.Logf("%d events, %d deliveries, %d dead letters replayed after their key moved on, %d purged",
		len(m.events), len(got), len(m.replayed), len(m.purged))
}

// cOutDuring reports whether sink C was out of topic t3's route (or, for
// t2, out of every route) at some time while e could have been claimed.
func (m *model) cOutDuring(e modelEvent) bool {
	if e.topic != "t3" && e.topic != "t2" {
		return false
	}
	for _, w := range m.windows {
		if w[1].IsZero() || w[1].After(e.insertedAt) {
			return true
		}
	}
	return false
}
