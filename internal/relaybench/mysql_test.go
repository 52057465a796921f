package relaybench_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/mysqltest"
	"github.com/heraldhq/herald/internal/mysqlurl"
	"github.com/heraldhq/herald/internal/relaybench"
)

// runMySQL runs cfg against the MySQL test server and checks the
// verification, the text output and that the run's database is gone.
func runMySQL(t *testing.T, cfg relaybench.Config) (*relaybench.Result, string) {
	t.Helper()
	cfg.DatabaseURL = mysqltest.URL(t)
	cfg.Timeout = 30 * time.Second
	var progress bytes.Buffer
	cfg.Progress = &progress
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := relaybench.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	if v := res.Verification; !v.OK() || v.Lost != 0 || !v.KeyOrderIntact || v.Events != res.Events || v.Delivered != res.Events {
		t.Fatalf("verification %+v", v)
	}
	if res.RowsLeft != 0 {
		t.Fatalf("%d rows left in the outbox", res.RowsLeft)
	}
	var text bytes.Buffer
	if err := res.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	requireDropped(ctx, t, cfg.DatabaseURL, res.Schema)
	return res, text.String()
}

// requireDropped fails unless the run's database is gone from the server
// at url.
func requireDropped(ctx context.Context, t *testing.T, url, database string) {
	t.Helper()
	db, err := mysqlurl.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM information_schema.schemata WHERE schema_name = ?", database).Scan(&n); err != nil || n != 0 {
		t.Fatalf("database %s still exists (%d, %v)", database, n, err)
	}
}

// A drain on MySQL delivers every event in key order with two relays, and
// times an application's INSERT throughout: none waits for a lock.
func TestMySQLDrainTwoRelays(t *testing.T) {
	t.Parallel()
	res, text := runMySQL(t, relaybench.Config{Events: 2000, Relays: 2, BatchSize: 100, Keys: 50})
	if res.Events != 2000 || res.EventsPerSecond <= 0 || res.Claim == nil || res.Claim.Count < 20 {
		t.Fatalf("result %+v, claims %+v", res, res.Claim)
	}
	in := res.Insert
	if in == nil || in.LockWaits != 0 || in.Errors != 0 {
		t.Fatalf("insert probe %+v", in)
	}
	if !strings.Contains(text, "an application's INSERT during the drain: ") {
		t.Fatalf("text output lacks the insert line:\n%s", text)
	}
}

// Live on MySQL: plain-SQL producers, the relays polling, every event's
// commit-to-publish latency measured; interval reports read InnoDB's
// history list length.
func TestMySQLLive(t *testing.T) {
	t.Parallel()
	res, text := runMySQL(t, relaybench.Config{Mode: relaybench.ModeLive, Rate: 200, Duration: time.Second,
		ReportEvery: 400 * time.Millisecond, Keys: 10, TxEvents: 2})
	if res.Events < 1 || res.Events > 300 {
		t.Fatalf("%d events committed in 1s at 200/s", res.Events)
	}
	if l := res.Latency; l == nil || l.Count != res.Events || l.P50 <= 0 || l.P99 > l.Max {
		t.Fatalf("latency %+v for %d events", l, res.Events)
	}
	if len(res.Intervals) == 0 || res.Intervals[0].HistoryLength == nil {
		t.Fatalf("intervals %+v", res.Intervals)
	}
	if !strings.Contains(text, "commit-to-publish latency") {
		t.Fatalf("text output:\n%s", text)
	}
}

// relay run, started by the bench on the run's own MariaDB database,
// publishes every committed event by its own counter and leaves the outbox
// empty; the database is dropped.
func TestMySQLBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the relay binary")
	}
	t.Parallel()
	bin := relayBinary(t)
	url := mysqltest.URL(t)
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := relaybench.Run(ctx, relaybench.Config{DatabaseURL: url, Mode: relaybench.ModeBinary,
		Events: 2000, Keys: 50, RelayBinary: bin, Timeout: time.Minute, Progress: &progress})
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	if b := res.Binary; b == nil || b.Published < 2000 || res.Events != 2000 || res.RowsLeft != 0 || res.Verification.Lost != 0 {
		t.Fatalf("result %+v, binary %+v", res, b)
	}
	requireDropped(ctx, t, url, res.Schema)
}

// The failure-path modes are PostgreSQL's only, and say so.
func TestMySQLRefusesOtherModes(t *testing.T) {
	t.Parallel()
	cfg := relaybench.Config{DatabaseURL: "mysql://root@127.0.0.1:3306/test", Mode: relaybench.ModeOutage}.WithDefaults()
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--mode: outage runs on PostgreSQL only") {
		t.Fatalf("Validate: %v", err)
	}
	cfg = relaybench.Config{DatabaseURL: "mysql://", Mode: relaybench.ModeDrain}.WithDefaults()
	if err := cfg.Validate(); err == nil || !strings.HasPrefix(err.Error(), "--database-url: ") {
		t.Fatalf("Validate: %v", err)
	}
}
