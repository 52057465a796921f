package relaybench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestScrapeCounter sums every series of the counter and nothing else.
func TestScrapeCounter(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `# HELP herald_events_published_total Events a sink acknowledged.
# TYPE herald_events_published_total counter
herald_events_published_total{sink="a",topic="t"} 1200
herald_events_published_total{sink="b",topic="t"} 34
herald_events_published_total_other 1e6
herald_events_published 7
`)
	}))
	defer srv.Close()
	n, err := scrapeCounter(context.Background(), srv.Client(), srv.URL, publishedMetric)
	if err != nil || n != 1234 {
		t.Fatalf("scrapeCounter = %d, %v; want 1234", n, err)
	}
}
