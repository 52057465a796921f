package sqs_test

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// BenchmarkPublishBatch1000 measures the sink's own cost per event
// (encoding, signing, JSON, HTTP) for a relay batch of 1,000 events of
// 1,000 keys: the peer is an HTTP server that accepts every entry without
// storing it (checking nothing but answering the body checksums the SDK
// verifies), so that the figure bounds the sink, not an emulator (moto's
// FIFO queues slow down as they fill; see docs/benchmarks.md).
func BenchmarkPublishBatch1000(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Entries []struct{ Id, MessageBody string }
		}
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		type ok struct{ Id, MessageId, MD5OfMessageBody string }
		out := struct{ Successful []ok }{}
		for _, e := range in.Entries {
			sum := md5.Sum([]byte(e.MessageBody))
			out.Successful = append(out.Successful, ok{Id: e.Id, MessageId: e.Id, MD5OfMessageBody: hex.EncodeToString(sum[:])})
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		json.NewEncoder(w).Encode(out)
	}))
	defer srv.Close()
	s, err := sqsNew(srv.URL)
	if err != nil {
		b.Fatal(err)
	}
	queue := srv.URL + "/123456789012/bench.fifo"
	events := make([]sinks.Event, 1000)
	for i := range events {
		events[i] = sinktest.Event(queue, fmt.Sprint("k", i), []byte(`{"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`))
	}
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		for i, err := range s.Publish(ctx, events) {
			if err != nil {
				b.Fatalf("event %d: %v", i, err)
			}
		}
		cancel()
	}
	b.ReportMetric(float64(b.N*len(events))/time.Since(start).Seconds(), "events/s")
}
