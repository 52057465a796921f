package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/sinks"
)

// TestRelayFeedsItsThroughputHistory: the measurements a relay reports
// reach the history its admin console charts, beside the configured
// Observer.
func TestRelayFeedsItsThroughputHistory(t *testing.T) {
	t.Parallel()
	// Nothing here queries: the pool never connects.
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	counted := &publishCounter{}
	r, err := NewPostgres(pool, Config{
		Routes:   []Route{{Topics: []string{"*"}, Targets: []Target{{Sink: sinks.NewDiscard("hook")}}}},
		Observer: counted,
	})
	if err != nil {
		t.Fatal(err)
	}
	r.cfg.Observer.Published("hook", "orders", time.Millisecond)
	r.cfg.Observer.Published("hook", "orders", time.Millisecond)
	r.cfg.Observer.Failed("hook", "orders", "retry")
	var delivered, failed float64
	for _, p := range r.Throughput().Series("hook", time.Now().Add(throughputStep)) {
		delivered += p.Delivered * throughputStep.Seconds()
		failed += p.Failed * throughputStep.Seconds()
	}
	if delivered != 2 || failed != 1 {
		t.Fatalf("the history counted %v delivered and %v failed, want 2 and 1", delivered, failed)
	}
	if counted.published != 2 {
		t.Fatalf("the configured Observer saw %d deliveries, want 2", counted.published)
	}
}

// publishCounter counts the deliveries it is told of.
type publishCounter struct {
	NopObserver
	published int
}

func (o *publishCounter) Published(string, string, time.Duration) { o.published++ }
