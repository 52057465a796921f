package main

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/pgtest"
	_ "github.com/heraldhq/herald/internal/pgtest/pgcontainer" // a container when no server answers
	"github.com/heraldhq/herald/internal/relaybench"
)

// TestBenchAgainstPeers starts the three peers on free ports, reads the bench
// flags they print and runs a drain against each: every event is
// acknowledged and verified, through a real broker protocol and real HTTP.
func TestBenchAgainstPeers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	out, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, []string{"-kafka", "127.0.0.1:0", "-webhook", "127.0.0.1:0", "-pubsub", "127.0.0.1:0"}, w, io.Discard)
		w.Close()
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("benchpeer: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("benchpeer did not stop within 30s of its context's end")
		}
	})

	flags := map[string]string{}
	sc := bufio.NewScanner(out)
	for len(flags) < 3 && sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 {
			t.Fatalf("unexpected line %q", sc.Text())
		}
		flags[f[1]] = f[2]
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	if flags["--kafka-brokers"] == "" || !strings.HasPrefix(flags["--webhook-url"], "http://127.0.0.1:") ||
		!strings.HasPrefix(flags["--pubsub-endpoint"], "127.0.0.1:") {
		t.Fatalf("printed flags %v", flags)
	}

	for _, cfg := range []relaybench.Config{
		{Sink: relaybench.SinkKafka, KafkaBrokers: []string{flags["--kafka-brokers"]}},
		{Sink: relaybench.SinkWebhook, WebhookURL: flags["--webhook-url"]},
		{Sink: relaybench.SinkPubSub, PubSubEndpoint: flags["--pubsub-endpoint"]},
	} {
		cfg.DatabaseURL = pgtest.URL(t)
		cfg.Events, cfg.Keys, cfg.Timeout = 200, 10, time.Minute
		runCtx, runCancel := context.WithTimeout(context.Background(), 2*time.Minute)
		res, err := relaybench.Run(runCtx, cfg)
		runCancel()
		if err != nil {
			t.Fatalf("%s: %v", cfg.Sink, err)
		}
		if v := res.Verification; !v.OK() || v.Delivered != 200 {
			t.Fatalf("%s: verification %+v", cfg.Sink, v)
		}
	}
}

// TestBadAddress names the flag.
func TestBadAddress(t *testing.T) {
	t.Parallel()
	err := run(context.Background(), []string{"-kafka", "localhost", "-webhook", ""}, io.Discard, io.Discard)
	if err == nil || !strings.HasPrefix(err.Error(), "-kafka: ") {
		t.Fatalf("want a -kafka error, got %v", err)
	}
}
