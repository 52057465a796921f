package relaybench_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/internal/pgtest"
	_ "github.com/heraldhq/herald/internal/pgtest/pgcontainer" // a container when no server answers
	"github.com/heraldhq/herald/internal/relaybench"
)

// run runs cfg against the test database and checks the verification and
// that the run's schema is gone.
func run(t *testing.T, cfg relaybench.Config) *relaybench.Result {
	t.Helper()
	if cfg.DatabaseURL == "" {
		cfg.DatabaseURL = pgtest.URL(t)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	var progress bytes.Buffer
	cfg.Progress = &progress
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout+30*time.Second)
	defer cancel()
	res, err := relaybench.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	v := res.Verification
	want := res.Events // every event committed, the hot key's included
	if res.HotKey != nil {
		want += res.HotKey.HotEvents
	}
	if !v.OK() || v.Lost != 0 || !v.KeyOrderIntact || v.Events != want || v.Delivered != want {
		t.Fatalf("verification %+v", v)
	}
	for _, s := range res.Sinks {
		if sv := s.Verification; !sv.OK() || sv.Events != want || sv.Delivered != want {
			t.Fatalf("sink %s: verification %+v", s.Name, sv)
		}
	}
	var text bytes.Buffer
	if err := res.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "verified: ") || !strings.Contains(text.String(), "key order intact") {
		t.Fatalf("text output lacks the verification line:\n%s", text.String())
	}
	pool := pgtest.Pool(t)
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", res.Schema).Scan(&exists); err != nil || exists {
		t.Fatalf("schema %s still exists (%v)", res.Schema, err)
	}
	return res
}

func TestDrainDiscardTwoRelays(t *testing.T) {
	t.Parallel()
	res := run(t, relaybench.Config{Events: 2000, Relays: 2, BatchSize: 100})
	if res.Events != 2000 || res.EventsPerSecond <= 0 || res.ElapsedSeconds <= 0 || res.Relays != 2 {
		t.Fatalf("result %+v", res)
	}
	if res.Claim == nil || res.Claim.Count < 20 || res.Record == nil || res.MeanBatch <= 0 || res.MeanBatch > 100 {
		t.Fatalf("per-batch timings: claim %+v record %+v mean batch %.1f", res.Claim, res.Record, res.MeanBatch)
	}
	if res.RowsLeft != 0 || res.CPUSeconds <= 0 || res.PeakRSSBytes <= 0 || res.Latency != nil {
		t.Fatalf("result %+v", res)
	}
}

func TestDrainOneKeyPerEvent(t *testing.T) {
	t.Parallel()
	res := run(t, relaybench.Config{Events: 1000, Keys: 0, KeysSet: true, PayloadBytes: 10})
	if res.Keys != 0 || res.Events != 1000 {
		t.Fatalf("result %+v", res)
	}
}

func TestLive(t *testing.T) {
	t.Parallel()
	res := run(t, relaybench.Config{Mode: relaybench.ModeLive, Rate: 500, Duration: 2 * time.Second,
		Baseline: 500 * time.Millisecond, ReportEvery: 500 * time.Millisecond, Keys: 10})
	// 500 events/s for 2s: never more (the rate holds), and as many as a
	// loaded machine manages.
	if res.Events < 1 || res.Events > 1100 {
		t.Fatalf("%d events committed in 2s at 500/s", res.Events)
	}
	l := res.Latency
	if l == nil || l.Count != res.Events || l.P50 <= 0 || l.P50 > l.P99 || l.P99 > l.Max {
		t.Fatalf("latency %+v for %d events", l, res.Events)
	}
	p := res.Producers
	if p == nil || p.CommitRate <= 0 || p.BaselineCommitRate <= 0 || p.Ratio <= 0 || p.Producers != 4 {
		t.Fatalf("producers %+v", p)
	}
	if len(res.Intervals) < 2 {
		t.Fatalf("%d interval reports in 2s at 500ms", len(res.Intervals))
	}
	iv := res.Intervals[1]
	if iv.EventsPerSecond <= 0 || iv.TableBytes <= 0 || iv.CommitRate <= 0 {
		t.Fatalf("interval %+v", iv)
	}
	// Events flowed in the interval, so claims returned some.
	if iv.ClaimP50 <= 0 || iv.ClaimP50 > iv.ClaimP99 || !strings.Contains(iv.String(), " claim p50 ") {
		t.Fatalf("interval %+v: no claim timings (%s)", iv, iv)
	}
}

// TestDrainAfterHistory: --history drains its events through the same
// relays first; the measured phase counts the backlog alone, and every
// event of both is verified.
func TestDrainAfterHistory(t *testing.T) {
	t.Parallel()
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := relaybench.Run(ctx, relaybench.Config{DatabaseURL: pgtest.URL(t), Events: 1500, History: 2000, Keys: 20,
		Timeout: 30 * time.Second, Progress: &progress})
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	if v := res.Verification; !v.OK() || v.Events != 3500 || v.Delivered != 3500 || !v.KeyOrderIntact {
		t.Fatalf("verification %+v", v)
	}
	if res.Events != 1500 || res.History != 2000 || res.EventsPerSecond <= 0 || res.RowsLeft != 0 {
		t.Fatalf("result: %d events after a history of %d, %.0f events/s, %d rows left", res.Events, res.History, res.EventsPerSecond, res.RowsLeft)
	}
	if !strings.Contains(progress.String(), "history: 2000 events") {
		t.Fatalf("progress:\n%s", progress.String())
	}
}

func TestLiveTransactionsOfSeveralEvents(t *testing.T) {
	t.Parallel()
	res := run(t, relaybench.Config{Mode: relaybench.ModeLive, Rate: 1000, TxEvents: 5, Duration: time.Second, Keys: 4})
	// At most 200 transactions of 5 events (fewer on a loaded machine).
	if res.Events < 5 || res.Events > 1100 || res.Events%5 != 0 {
		t.Fatalf("%d events committed in 1s at 1000/s in transactions of 5", res.Events)
	}
	if p := res.Producers; p == nil || p.TxEvents != 5 {
		t.Fatalf("producers %+v", p)
	}
}

// kafkaCluster starts an in-process Kafka broker (kfake) for one test: the
// bench itself starts none, it is given brokers.
func kafkaCluster(t *testing.T) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// webhookReceiver is a real HTTP server that counts the events posted to it
// (by their webhook-id header) and answers 204.
func webhookReceiver(t *testing.T) (url string, received *atomic.Int64) {
	t.Helper()
	received = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil || r.Header.Get("webhook-id") == "" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		received.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/hook", received
}

func TestDrainSinks(t *testing.T) {
	t.Parallel()
	cases := map[string]func(t *testing.T) relaybench.Config{
		"kafka": func(t *testing.T) relaybench.Config {
			return relaybench.Config{Sink: relaybench.SinkKafka, KafkaBrokers: kafkaCluster(t).ListenAddrs(), KafkaPartitions: 4}
		},
		"webhook": func(t *testing.T) relaybench.Config {
			url, _ := webhookReceiver(t)
			return relaybench.Config{Sink: relaybench.SinkWebhook, WebhookURL: url}
		},
		"nats": func(t *testing.T) relaybench.Config {
			return relaybench.Config{Sink: relaybench.SinkNATS, NATSURL: natstest.URL(t)}
		},
		"nats file storage": func(t *testing.T) relaybench.Config {
			return relaybench.Config{Sink: relaybench.SinkNATS, NATSURL: natstest.URL(t), NATSFileStorage: true}
		},
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := cfg(t)
			c.Events, c.Keys, c.Relays = 1000, 50, 2
			// run verifies every event delivered, in order per key; a
			// failed attempt (a request timed out on a loaded machine)
			// is retried, so the failures are not counted here.
			res := run(t, c)
			if res.Sink != c.Sink || res.Events != 1000 {
				t.Fatalf("result %+v", res)
			}
		})
	}
}

// TestWebhookReceiverGetsEveryEvent: the events the bench counts as
// acknowledged reached the receiver it was given.
func TestWebhookReceiverGetsEveryEvent(t *testing.T) {
	t.Parallel()
	url, received := webhookReceiver(t)
	res := run(t, relaybench.Config{Sink: relaybench.SinkWebhook, WebhookURL: url, Events: 200, Keys: 10})
	if res.Events != 200 || received.Load() < 200 {
		t.Fatalf("%d events committed, %d received", res.Events, received.Load())
	}
}

// TestKafkaTopicDeleted checks the throwaway topic is gone after a run.
func TestKafkaTopicDeleted(t *testing.T) {
	t.Parallel()
	c := kafkaCluster(t)
	res := run(t, relaybench.Config{Sink: relaybench.SinkKafka, KafkaBrokers: c.ListenAddrs(), Events: 10})
	if res.Events != 10 {
		t.Fatalf("result %+v", res)
	}
	// A fresh transport: kafka-go's default one caches metadata.
	meta, err := (&kafkago.Client{Addr: kafkago.TCP(c.ListenAddrs()...), Transport: &kafkago.Transport{}}).Metadata(context.Background(), &kafkago.MetadataRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range meta.Topics {
		if strings.HasPrefix(topic.Name, "herald_bench_") {
			t.Errorf("topic %s left behind", topic.Name)
		}
	}
}

// TestNATSStreamDeleted checks the throwaway stream is gone after a run.
func TestNATSStreamDeleted(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	res := run(t, relaybench.Config{Sink: relaybench.SinkNATS, NATSURL: url, Events: 10})
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	name := "HERALD_BENCH_" + strings.TrimPrefix(res.Schema, "herald_bench_")
	if _, err := js.Stream(context.Background(), name); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("stream %s: want it deleted, got %v", name, err)
	}
}

func TestKeep(t *testing.T) {
	t.Parallel()
	cfg := relaybench.Config{DatabaseURL: pgtest.URL(t), Events: 10, Keep: true}
	res, err := relaybench.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Pool(t)
	t.Cleanup(func() { pgtest.DropSchema(t, pool, res.Schema) })
	var n int
	err = pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{res.Schema, "outbox_lanes"}.Sanitize()).Scan(&n)
	if err != nil || n != 64 {
		t.Fatalf("kept schema %s: %d lanes (%v)", res.Schema, n, err)
	}
}

func TestUnreachableDatabase(t *testing.T) {
	t.Parallel()
	_, err := relaybench.Run(context.Background(), relaybench.Config{DatabaseURL: "postgres://postgres@127.0.0.1:1/test?connect_timeout=2"})
	if err == nil || !strings.Contains(err.Error(), "connecting to the database") {
		t.Fatalf("want a connection error, got %v", err)
	}
}

func TestUnreachableNATS(t *testing.T) {
	t.Parallel()
	_, err := relaybench.Run(context.Background(), relaybench.Config{DatabaseURL: pgtest.URL(t), Sink: relaybench.SinkNATS,
		NATSURL: "nats://127.0.0.1:1", Events: 10})
	if err == nil || !strings.Contains(err.Error(), "--nats-url: connecting to nats://127.0.0.1:1") {
		t.Fatalf("want a NATS connection error, got %v", err)
	}
}

// TestBenchOutage checks the outage mode's accounting: both sinks get every
// event in key order, every outbox row leaves by one DELETE, at most one
// delivery row is written per event and sink (the "up" sink's events are
// queued too when a loaded machine makes it miss its hand-off budget), and
// every delivery written is deleted at the end.
func TestBenchOutage(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		keys int
	}{
		{name: "30 keys", keys: 30},
		{name: "50 keys", keys: 50},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const events = 3000
			// The batches wait for their sinks up to 10s before handing
			// off: on a loaded machine, the healthy sink's events handed
			// off (and their keys' later events queued behind them)
			// would add writes that are not the outage's.
			res := run(t, relaybench.Config{Mode: relaybench.ModeOutage, Events: events, Keys: c.keys, KeysSet: true,
				Relays: 2, BatchSize: 500, Outage: 2 * time.Second, PauseMax: 100 * time.Millisecond, ReportEvery: 500 * time.Millisecond,
				HandOffAfter: 10 * time.Second})
			if len(res.Sinks) != 2 || res.Sinks[0].Name != relaybench.SinkUp || res.Sinks[1].Name != relaybench.SinkDown {
				t.Fatalf("sinks %+v", res.Sinks)
			}
			o := res.Outage
			if o == nil || o.OutageSeconds < 2 || o.PauseMaxSeconds != 0.1 {
				t.Fatalf("outage %+v", o)
			}
			w := o.Writes
			if w.Outbox.Inserted != events || w.Outbox.Updated != 0 || w.Outbox.Deleted != events || w.Outbox.Writes != events ||
				w.Deliveries.Inserted > 2*events || w.Deliveries.Inserted != w.Deliveries.Deleted {
				t.Fatalf("writes %+v", w)
			}
			if w.Total != w.Outbox.Writes+w.Deliveries.Writes || w.PerEvent != float64(w.Total)/events {
				t.Fatalf("writes %+v", w)
			}
			// Beyond the insert and delete of each delivery, the only
			// writes are the promotions of a new head where a claim took
			// part of a queue: at most one per queue and claim. A claim
			// shares its rows between the queues' heads (here some 10 to
			// 17 rows each), so that is well under one per event.
			if res.Claim == nil || w.Deliveries.Updated > int64(res.Claim.Count*c.keys) {
				t.Fatalf("%d deliveries updated in %+v claims", w.Deliveries.Updated, res.Claim)
			}
			if o.HandedOff != 0 {
				t.Fatalf("%d events handed off with a hand-off budget of 10s", o.HandedOff)
			}
			if w.PerEvent > 3.5 {
				t.Fatalf("%.4f row writes per event, want at most 3.5: %+v", w.PerEvent, w)
			}
			if res.RowsLeft != 0 {
				t.Fatalf("%d rows left", res.RowsLeft)
			}
			for _, iv := range res.Intervals {
				if iv.DownQueue == nil || iv.Phase == "" || iv.Phase == "before" {
					t.Fatalf("interval %+v", iv)
				}
			}
			var text bytes.Buffer
			if err := res.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"row writes (pg_stat_user_tables", "per event", "sink up: verified: 3000 events", "sink down: verified: 3000 events"} {
				if !strings.Contains(text.String(), want) {
					t.Fatalf("text lacks %q:\n%s", want, text.String())
				}
			}
		})
	}
}

// TestBenchIsolation runs live producers to two sinks, one of which is down for
// a second, and checks that both got every event in key order and that the
// reports say where the outage was and how far behind "down" was. With
// AnswerAfter, "down" is a webhook whose receiver answers that late.
func TestBenchIsolation(t *testing.T) {
	t.Parallel()
	for _, answer := range []time.Duration{0, 5 * time.Millisecond} {
		t.Run(fmt.Sprint(answer), func(t *testing.T) {
			t.Parallel()
			res := run(t, relaybench.Config{Mode: relaybench.ModeIsolation, Rate: 400, Keys: 20, Duration: 3500 * time.Millisecond,
				OutageAfter: time.Second, Outage: time.Second, PauseMax: 100 * time.Millisecond, ReportEvery: 500 * time.Millisecond,
				AnswerAfter: answer, WebhookConcurrency: 4})
			iso := res.Isolation
			if iso == nil || iso.OutageAfterSeconds != 1 || iso.OutageSeconds != 1 || iso.Before == nil || res.Latency == nil ||
				iso.DownAnswerAfterMS != float64(answer)/1e6 {
				t.Fatalf("isolation %+v, latency %+v", iso, res.Latency)
			}
			if iso.BacklogAtHeal < 0 || iso.BacklogAtHeal > int64(res.Events) {
				t.Fatalf("%d events behind when down came back, of %d", iso.BacklogAtHeal, res.Events)
			}
			if len(res.Sinks) != 2 || len(res.Intervals) < 2 {
				t.Fatalf("sinks %+v, %d intervals", res.Sinks, len(res.Intervals))
			}
			for _, iv := range res.Intervals {
				if iv.DownQueue == nil || iv.DownBacklog == nil || *iv.DownBacklog < 0 || iv.Phase == "" {
					t.Fatalf("interval %+v", iv)
				}
			}
			if res.Intervals[0].Phase != "before" || res.Intervals[len(res.Intervals)-1].Phase != "after" {
				t.Fatalf("intervals %+v", res.Intervals)
			}
			var text bytes.Buffer
			if err := res.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"sink up before the outage", "sink down: verified", "events behind)", "reports after the outage"} {
				if !strings.Contains(text.String(), want) {
					t.Fatalf("text lacks %q:\n%s", want, text.String())
				}
			}
		})
	}
}

// TestBenchHotKey queues a key's events behind a failing head, drains the other
// keys beside it, then heals the key: every event arrives, in key order.
func TestBenchHotKey(t *testing.T) {
	t.Parallel()
	for _, hot := range []int{300, 0} {
		t.Run(fmt.Sprint(hot), func(t *testing.T) {
			t.Parallel()
			res := run(t, relaybench.Config{Mode: relaybench.ModeHotKey, Events: 2000, Keys: 20, BatchSize: 200,
				HotEvents: hot, HotEventsSet: true, BackoffMax: 100 * time.Millisecond})
			h := res.HotKey
			if h == nil || h.HotEvents != hot || h.Key != "k20" || res.Events != 2000 || res.Claim == nil || res.EventsPerSecond <= 0 {
				t.Fatalf("result %+v, hot key %+v", res, h)
			}
			if res.Verification.Events != 2000+hot || res.RowsLeft != 0 {
				t.Fatalf("verification %+v, %d rows left", res.Verification, res.RowsLeft)
			}
		})
	}
}
