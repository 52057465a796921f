package console_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/relay/internal/console"
)

// BenchmarkDeadLetterPage renders the dead-letter page through the
// console's handler with 100,000 dead letters: the first page (newest
// first, the default), filtered by topic, by error text and by key, the
// oldest first, and a later page. Each is one request: the list, the
// bounded count and the template. It also times the overview's refresh
// over the same table. Figures in docs/benchmarks.md ("Console").
func BenchmarkDeadLetterPage(b *testing.B) {
	pool := pgtest.Pool(b)
	e := &env{pool: pool, tables: pgtest.Schema(b, pool)}
	e.insertDead(b, 100_000)
	if _, err := pool.Exec(b.Context(), "ANALYZE "+e.tables.Deliveries()); err != nil {
		b.Fatal(err)
	}
	store, err := deadletter.New(pool, e.tables)
	if err != nil {
		b.Fatal(err)
	}
	con, err := console.New(console.Config{}, console.Deps{DeadLetters: store, Sinks: []string{"hook"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	// One session for every request, as a browser keeps its cookie.
	first := httptest.NewRecorder()
	con.ServeHTTP(first, httptest.NewRequest(http.MethodGet, "/ui/dead", nil))
	cookies := first.Result().Cookies()
	for _, bc := range []struct{ name, path string }{
		{"first page", "/ui/dead"},
		{"topic filter", "/ui/dead?topic=orders.7"},
		{"error text filter", "/ui/dead?error=event+99999"},
		{"key", "/ui/dead?key=k-5000"},
		{"oldest first", "/ui/dead?order=oldest"},
		{"page 100", "/ui/dead?after_seq=95000&after_sink=hook"},
		// The overview's 2 s refresh reads the status of every queue.
		{"overview refresh", "/ui/live"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				req := httptest.NewRequest(http.MethodGet, bc.path, nil)
				for _, c := range cookies {
					req.AddCookie(c)
				}
				w := httptest.NewRecorder()
				con.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("%s: %d %s", bc.path, w.Code, w.Body.String())
				}
			}
		})
	}
}
