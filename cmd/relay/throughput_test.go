package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/relayconfig"
)

// TestRunFeedsTheThroughputHistory checks the wiring of relay run: with the
// admin server on, the relay's measurements reach the throughput history
// the console reads.
func TestRunFeedsTheThroughputHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	listen := "127.0.0.1:0"
	s := &setup{file: &relayconfig.File{Admin: relayconfig.Admin{Listen: &listen}},
		tables: migrations.Tables{}.WithDefaults(), logger: slog.New(slog.DiscardHandler)}
	// Nothing here queries: the pool never connects.
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var cfg relay.Config
	ops, err := s.startOperations(ctx, database{pool: pool}, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := ops.stop(ctx); err != nil {
			t.Error(err)
		}
	}()
	if ops.throughput == nil || cfg.Observer == nil {
		t.Fatalf("no throughput history (%v) or observer (%T)", ops.throughput, cfg.Observer)
	}
	cfg.Observer.Published("hook", "orders", time.Millisecond)
	cfg.Observer.Published("hook", "orders", time.Millisecond)
	cfg.Observer.Failed("hook", "orders", "retry")
	var delivered, failed float64
	for _, p := range ops.throughput.Series("hook", time.Now().Add(throughputStep)) {
		delivered += p.Delivered * throughputStep.Seconds()
		failed += p.Failed * throughputStep.Seconds()
	}
	if delivered != 2 || failed != 1 {
		t.Fatalf("the history counted %v delivered and %v failed, want 2 and 1", delivered, failed)
	}
}
