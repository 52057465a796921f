package metrics_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/heraldhq/herald/internal/mysqltest"
	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/relay/metrics"
	"github.com/heraldhq/herald/sinks"
)

func scrape(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

func newMetrics(t *testing.T, cfg metrics.Config) (*metrics.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

func TestOutcomesAndPausedGauge(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, metrics.Config{})
	m.SinkPaused("kafka", true)
	m.Failed("kafka", "t", "paused")
	m.Failed("kafka", "t", "retry")
	m.Failed("kafka", "t", "dead")
	m.DeadLettered("kafka", "t")
	m.DeadLettered("", "t")
	m.Published("kafka", "t", 30*time.Millisecond)
	m.SinkPublish("kafka", 3, 2*time.Millisecond)
	m.Claimed(3, time.Millisecond)
	m.Recorded(3, time.Millisecond)
	m.SinkHandedOff("kafka", 4)
	m.SinkInFlight("kafka", 7)
	m.RecordFenced(2)
	body := scrape(t, reg)
	for _, want := range []string{
		`herald_sink_paused{sink="kafka"} 1`,
		`herald_events_deferred_total{sink="kafka",topic="t"} 1`,
		`herald_delivery_attempts_failed_total{sink="kafka",topic="t"} 2`,
		`herald_dead_letters_total{sink="kafka",topic="t"} 1`,
		`herald_dead_letters_total{sink="",topic="t"} 1`,
		`herald_events_published_total{sink="kafka",topic="t"} 1`,
		`herald_commit_to_publish_seconds_bucket{sink="kafka",le="0.03125"} 1`,
		`herald_publish_duration_seconds_count{sink="kafka"} 1`,
		`herald_claim_duration_seconds_count 1`,
		`herald_record_duration_seconds_count 1`,
		`herald_events_claimed_total 3`,
		`herald_events_handed_off_total{sink="kafka"} 4`,
		`herald_sink_in_flight_events{sink="kafka"} 7`,
		`herald_records_fenced_total 1`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	m.SinkPaused("kafka", false)
	if body := scrape(t, reg); !strings.Contains(body, `herald_sink_paused{sink="kafka"} 0`+"\n") {
		t.Errorf("resumed sink still paused:\n%s", body)
	}
	// One name per meaning: the names this package had before are gone,
	// and a relay on PostgreSQL has no MySQL gauge.
	for _, old := range []string{"herald_events_failed_total", "herald_events_retried_total", "herald_events_dead_lettered_total",
		"herald_mysql_history_list_length"} {
		if strings.Contains(body, old) {
			t.Errorf("metrics export %s", old)
		}
	}
	m.HistoryLength(0) // what a relay on PostgreSQL reports
	if body := scrape(t, reg); strings.Contains(body, "herald_mysql_history_list_length") {
		t.Errorf("a relay on PostgreSQL exports the MySQL gauge:\n%s", body)
	}
	// Registering twice on one registry fails instead of panicking.
	if _, err := metrics.New(reg, metrics.Config{}); err == nil {
		t.Fatal("second New on the same registry succeeded")
	}
}

// TestBuildInfo: herald_build_info is 1, labelled with the version (the
// configured one in place of the recorded one), the commit and Go's
// version.
func TestBuildInfo(t *testing.T) {
	t.Parallel()
	_, reg := newMetrics(t, metrics.Config{Version: "v1.2.3"})
	body := scrape(t, reg)
	want := regexp.MustCompile(`(?m)^herald_build_info\{go_version="` + regexp.QuoteMeta(runtime.Version()) + `",revision="[0-9a-f]*",version="v1\.2\.3"\} 1$`)
	if !want.MatchString(body) {
		t.Fatalf("no herald_build_info matching %s:\n%s", want, body)
	}
	_, reg = newMetrics(t, metrics.Config{})
	if body := scrape(t, reg); !strings.Contains(body, "herald_build_info{") || strings.Contains(body, `version=""`) {
		t.Fatalf("herald_build_info without a configured version:\n%s", body)
	}
}

func TestRefreshBacklog(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, metrics.Config{})
	var calls atomic.Int32
	read := func(context.Context) (deadletter.Totals, error) {
		if calls.Add(1) == 2 {
			return deadletter.Totals{}, errors.New("connection refused")
		}
		return deadletter.Totals{Pending: 12, Queued: 3, Dead: 4, OldestAge: 90 * time.Second}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.RefreshBacklog(ctx, 10*time.Millisecond, read, nil)
	}()
	for calls.Load() < 3 {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	// The first count comes one interval after the start, never at once:
	// it reads the whole backlog.
	stopped, stop := context.WithCancel(context.Background())
	stop()
	m.RefreshBacklog(stopped, time.Hour, func(context.Context) (deadletter.Totals, error) {
		t.Error("the backlog was read at once")
		return deadletter.Totals{}, nil
	}, nil)
	body := scrape(t, reg)
	for _, want := range []string{"herald_backlog_pending_events 15", "herald_backlog_dead_events 4",
		"herald_backlog_oldest_pending_age_seconds 90", "herald_backlog_refresh_errors_total 1"} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
}

// A relay on MySQL reports InnoDB's history list length at its first look
// at the tables (through Observers, which passes it on): it is held above
// zero here by a snapshot kept open across committed changes, as a long
// transaction elsewhere holds purge back.
func TestHistoryLengthFromMySQLRelay(t *testing.T) {
	t.Parallel()
	db, url := mysqltest.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mig, err := mysqlmigrations.NewMigrator(db, migrations.Tables{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mig.Up(ctx, 0); err != nil {
		t.Fatal(err)
	}
	tables, err := mysqlmigrations.NewTables(migrations.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	snapshot, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer snapshot.Rollback()
	var n int
	if err := snapshot.QueryRowContext(ctx, "SELECT count(*) FROM "+tables.Lanes()).Scan(&n); err != nil {
		t.Fatal(err) // the first read opens the read view
	}
	for _, owner := range []any{"x", nil, "x", nil} {
		if _, err := db.ExecContext(ctx, "UPDATE "+tables.Lanes()+" SET owner = ? WHERE lane = 0", owner); err != nil {
			t.Fatal(err)
		}
	}

	m, reg := newMetrics(t, metrics.Config{MySQL: true})
	rdb, err := relay.OpenMySQL(url, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	rl, err := relay.NewMySQL(rdb, relay.Config{
		Owner:    "metrics-test",
		Workers:  1,
		Routes:   []relay.Route{{Topics: []string{"*"}, Targets: []relay.Target{{Sink: sinks.NewDiscard("d")}}}},
		Observer: relay.Observers(m, relay.NopObserver{}),
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rl.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	for {
		if v := gaugeValue(t, reg, "herald_mysql_history_list_length"); v >= 1 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("herald_mysql_history_list_length never rose above 0:\n%s", scrape(t, reg))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// gaugeValue is the value of the unlabelled gauge name in reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}
