package relay

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/sinks"
)

// TestRouteSinks: the sinks an event of a topic may go to are those of the
// filtered routes before the first unfiltered one that matches, and of that
// one; the routes after it are never reached.
func TestRouteSinks(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	vip, err := CompileWhere(`headers["tier"] == "vip"`)
	if err != nil {
		t.Fatal(err)
	}
	target := func(name string) []Target { return []Target{{Sink: sinks.NewDiscard(name)}} }
	r, err := NewPostgres(pool, Config{Routes: []Route{
		{Topics: []string{"orders.*"}, Where: vip, Targets: target("vip")},
		{Topics: []string{"orders.*"}, Targets: target("orders")},
		{Topics: []string{"*"}, Targets: target("rest")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for topic, want := range map[string][]string{
		"orders.paid": {"vip", "orders"},
		"users":       {"rest"},
	} {
		if got := r.RouteSinks(topic); !slices.Equal(got, want) {
			t.Errorf("RouteSinks(%q) = %v, want %v", topic, got, want)
		}
	}
	if got := r.SinkNames(); !slices.Equal(got, []string{"orders", "rest", "vip"}) {
		t.Errorf("SinkNames() = %v", got)
	}
}
