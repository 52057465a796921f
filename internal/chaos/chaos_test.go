package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/internal/natstest"
)

// Fault kinds.
const (
	faultKill       = "relay SIGKILL + restart"
	faultTerm       = "relay SIGTERM + restart"
	faultDBTerm     = "relays' connections killed"
	faultHook500    = "webhook 500"
	faultHookHang   = "webhook hangs past timeout"
	faultHookDrop   = "webhook drops connection"
	faultHookSlow   = "webhook answers late"
	faultHookKeys   = "webhook answers some keys late"
	faultNATS       = "NATS server restart"
	faultDBRestart  = "database restart (clean)"
	faultDBCrash    = "database restart (crash)"
	relayCount      = 3
	keyCount        = 300
	relayAppPrefix  = "chaos_relay_"
	drainTimeout    = 2 * time.Minute
	producerAppName = "chaos_producer"
)

// TestChaosRelaysSinksAndConnections injects every fault but PostgreSQL
// restarts: relays killed and stopped, their connections terminated, the
// webhook failing in three ways and slow in two (every answer late, or
// some keys' answers), NATS restarted.
func TestChaosRelaysSinksAndConnections(t *testing.T) {
	t.Parallel()
	runChaos(t, startPostgres, schedule{seed: 1, faults: 11}, []string{faultKill, faultTerm, faultDBTerm, faultHook500,
		faultHookHang, faultHookDrop, faultHookSlow, faultHookKeys, faultNATS})
}

// TestChaosPostgresRestart restarts PostgreSQL itself, cleanly and as a
// crash, under the same load: each once by default.
func TestChaosPostgresRestart(t *testing.T) {
	t.Parallel()
	runChaos(t, startPostgres, schedule{seed: 2, faults: 2}, []string{faultDBRestart, faultDBCrash})
}

// TestChaosWALCapture runs the relays on events read from the WAL
// (database.capture: wal), emitted by the outbox library with a business
// row in the same transaction (which tells a failed commit's fate): the
// slot's reader killed and stopped (a standby takes the slot over), the
// relays' connections terminated (the replication one with them),
// PostgreSQL restarted cleanly and crashed, the webhook failing and slow.
func TestChaosWALCapture(t *testing.T) {
	t.Parallel()
	runChaos(t, startPostgresWAL, schedule{seed: 4, faults: 7}, []string{faultKill, faultTerm, faultDBTerm,
		faultDBRestart, faultDBCrash, faultHook500, faultHookSlow})
}

// TestChaosMariaDB runs the faults that touch the database on MariaDB:
// relays killed and stopped, their connections killed, the server restarted
// cleanly and crashed, each once by default. The sinks' faults are the
// engine's, not the store's: the PostgreSQL runs cover them.
func TestChaosMariaDB(t *testing.T) {
	t.Parallel()
	runChaos(t, func(t *testing.T) database { return startMariaDB(t) }, schedule{seed: 3, faults: 5},
		[]string{faultKill, faultTerm, faultDBTerm, faultDBRestart, faultDBCrash})
}

// startPostgres is startCluster as a database.
func startPostgres(t *testing.T) database { return startCluster(t, false) }

// startPostgresWAL is a cluster writing logical WAL, whose relays and
// producer use WAL capture.
func startPostgresWAL(t *testing.T) database { return startCluster(t, true) }

// schedule is a test's default fault schedule: a fixed seed and number of
// faults, so that the default run (CI) injects the same faults in the same
// order every time. CHAOS_SEED and CHAOS_DURATION (or -chaos.seed and
// -chaos.duration) change it for longer runs with other seeds.
type schedule struct {
	seed   int64
	faults int
}

// env is one chaos run's world.
type env struct {
	t      *testing.T
	rng    *rand.Rand
	db     database
	nats   *natstest.Server
	stream *natstest.TestStream
	hook   *receiver
	relays *fleet
	faults map[string]int
}

func runChaos(t *testing.T, startDB func(*testing.T) database, sched schedule, kinds []string) {
	seed := chaosSeed(t, sched.seed)
	duration := chaosDuration(t)
	length := fmt.Sprintf("%d faults", sched.faults)
	if duration > 0 {
		length = "faults for " + duration.String()
	}
	t.Logf("chaos: seed %d (replay with CHAOS_SEED=%d or -chaos.seed %d), %s: %s",
		seed, seed, seed, length, strings.Join(kinds, ", "))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("chaos: FAILED with seed %d (replay with CHAOS_SEED=%d)", seed, seed)
		}
	})
	e := &env{t: t, rng: rand.New(rand.NewPCG(uint64(seed), 0)), faults: map[string]int{}}
	e.db = startDB(t)
	migrate(t, e.db.url("chaos_migrate"))
	wal := e.db.walCapture()
	if wal {
		createCommits(t, e.db)
	}
	e.nats = natstest.StartServer(t)
	nc := natstest.Connect(t, e.nats.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	e.stream = natstest.Stream(t, nc, func(c *jetstream.StreamConfig) { c.Storage = jetstream.FileStorage })
	e.hook = startReceiver(t)

	configs := make([]string, relayCount)
	for i := range configs {
		configs[i] = relayConfig(t, e.db.url(fmt.Sprintf("%s%d", relayAppPrefix, i)), e.nats.URL(),
			e.stream.Subject("events"), e.hook.srv.URL+"/hook", wal)
	}
	e.relays = newFleet(t, e.db, configs)
	t.Cleanup(func() {
		if t.Failed() {
			for i := range configs {
				t.Logf("chaos: last lines of relay %d:\n%s", i, e.relays.tail(i, 15))
			}
			t.Logf("chaos: relay logs kept in %s", e.relays.keepLogs(seed))
		}
	})
	for i := range configs {
		e.relays.start(i)
	}
	for i := range configs {
		e.relays.waitStarted(i)
	}

	conn := e.db.open(t, "chaos_check")
	prod := newProducer(t, e.db.open(t, producerAppName), e.db.dialect(), seed, keyCount, wal)
	prodCtx, stopProducer := context.WithCancel(context.Background())
	var producing sync.WaitGroup
	producing.Go(func() { prod.run(prodCtx) })
	defer func() { stopProducer(); producing.Wait() }()

	start := time.Now()
	deadline := start.Add(duration)
	// Every kind once, in the seed's order, then kinds at random: a short
	// run misses none of them.
	order := slices.Clone(kinds)
	e.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	for n := 0; ; n++ {
		if duration > 0 && !time.Now().Before(deadline) || duration == 0 && n == sched.faults {
			break
		}
		time.Sleep(time.Duration(200+e.rng.IntN(800)) * time.Millisecond)
		kind := kinds[e.rng.IntN(len(kinds))]
		if n < len(order) {
			kind = order[n]
		}
		e.inject(kind)
		for i, code := range e.relays.exited() {
			t.Fatalf("relay %d exited on its own with %d during the run:\n%s", i, code, e.relays.tail(i, 40))
		}
	}
	// Faults end; a little more load on a healthy system, then drain.
	e.hook.heal()
	e.waitDelivered(50, "the healthy system")
	stopProducer()
	producing.Wait()
	faultsEnd := time.Now()

	unknownFound := prod.settleUnknown(t, e.db, conn)
	drained := waitDrained(t, conn, wal)
	for i, code := range e.relays.exited() {
		t.Errorf("relay %d exited on its own with %d:\n%s", i, code, e.relays.tail(i, 40))
	}
	e.check(conn, prod, unknownFound, start, faultsEnd, drained, seed, length)

	// Every relay stops gracefully, and none ever printed a secret.
	for i := range configs {
		if err := e.relays.terminate(i); err != nil {
			t.Errorf("%v:\n%s", err, e.relays.tail(i, 40))
		}
	}
	if hits := e.relays.grepLogs(dbPassword, webhookSecret, strings.TrimPrefix(webhookAuth, "Bearer ")); len(hits) > 0 {
		t.Errorf("secrets in relay output:\n%s", strings.Join(hits, "\n"))
	}
}

// inject applies one fault.
func (e *env) inject(kind string) {
	t := e.t
	e.faults[kind]++
	switch kind {
	case faultKill:
		i := e.rng.IntN(relayCount)
		e.relays.kill(i)
		time.Sleep(time.Duration(e.rng.IntN(1000)) * time.Millisecond)
		e.relays.start(i)
		e.relays.waitStarted(i)
	case faultTerm:
		i := e.rng.IntN(relayCount)
		if err := e.relays.terminate(i); err != nil {
			t.Errorf("%v:\n%s", err, e.relays.tail(i, 40))
		}
		time.Sleep(time.Duration(e.rng.IntN(500)) * time.Millisecond)
		e.relays.start(i)
		e.relays.waitStarted(i)
	case faultDBTerm:
		if n := e.db.killRelayConns(t); n == 0 {
			t.Errorf("chaos: no relay connection to kill")
		}
	case faultHook500:
		e.hook.fault(hook500, time.Duration(500+e.rng.IntN(2500))*time.Millisecond)
	case faultHookHang:
		e.hook.fault(hookHang, time.Duration(1500+e.rng.IntN(2500))*time.Millisecond)
	case faultHookDrop:
		e.hook.fault(hookDrop, time.Duration(500+e.rng.IntN(2500))*time.Millisecond)
	case faultHookSlow:
		e.hook.fault(hookSlow, time.Duration(1000+e.rng.IntN(2000))*time.Millisecond)
	case faultHookKeys:
		e.hook.fault(hookSlowKeys, time.Duration(1000+e.rng.IntN(2000))*time.Millisecond)
	case faultNATS:
		e.nats.Shutdown()
		time.Sleep(time.Duration(e.rng.IntN(1500)) * time.Millisecond)
		e.nats.Restart(t)
	case faultDBRestart, faultDBCrash:
		e.db.stop(t, kind == faultDBCrash)
		time.Sleep(time.Duration(e.rng.IntN(2000)) * time.Millisecond)
		e.db.start(t)
		e.waitDelivered(20, "the relays between restarts")
	default:
		t.Fatalf("unknown fault %q", kind)
	}
}

// progressTimeout bounds waitDelivered: the relays are back at work well
// within it on the loaded 2-core machine.
const progressTimeout = time.Minute

// waitDelivered waits until the webhook has accepted n more events than
// when it was called: the relays are at work again (after a restart, or
// once the faults have ended), shown by what they deliver rather than
// assumed after a pause a loaded machine may not honour.
func (e *env) waitDelivered(n int, who string) {
	e.t.Helper()
	target := e.hook.accepted() + n
	deadline := time.Now().Add(progressTimeout)
	for e.hook.accepted() < target {
		if time.Now().After(deadline) {
			e.t.Fatalf("chaos: %s delivered fewer than %d events to the webhook within %s", who, n, progressTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
