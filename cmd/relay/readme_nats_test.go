package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/nats"
	"github.com/heraldhq/herald/sinks/nats/natstest"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// natsCLI returns the nats CLI: on PATH, or where go install puts it.
// Without it the test fails under CI=true and is skipped otherwise, saying
// how to install it.
func natsCLI(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", "nats")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	msg := "no nats CLI on PATH or in $GOPATH/bin: go install github.com/nats-io/natscli/nats@v0.5.0"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// TestREADMENATSStreamCommand runs the README's `nats stream add` command
// against the test server, with the stream name and subject prefix made
// unique (the server is shared), and checks the stream it creates covers
// what the configuration example's destination (events.{{.Topic}})
// renders: the NATS sink publishes there.
func TestREADMENATSStreamCommand(t *testing.T) {
	t.Parallel()
	m := regexp.MustCompile("(?m)^nats --server \\S+ stream add EVENTS --subjects 'events\\.>'.*$").FindString(readme(t))
	if m == "" {
		t.Fatal("README: no `nats --server ... stream add EVENTS --subjects 'events.>'` command in the NATS section")
	}
	url := natstest.URL(t)
	id := strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	name, prefix := "HERALD_README_"+id, "herald_readme_"+id
	line := regexp.MustCompile(`--server \S+`).ReplaceAllString(m, "--server "+url)
	line = strings.Replace(line, "EVENTS", name, 1)
	line = strings.Replace(line, "'events.>'", "'"+prefix+".>'", 1)
	fields := strings.Fields(strings.ReplaceAll(line, "'", ""))

	nc := natstest.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
	})
	cmd := exec.Command(natsCLI(t), fields[1:]...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir()) // no nats context of the user's
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("the command created no stream %s: %v", name, err)
	}
	if cfg := stream.CachedInfo().Config; strings.Join(cfg.Subjects, ",") != prefix+".>" || cfg.Storage != jetstream.FileStorage {
		t.Fatalf("stream subjects %v storage %v, want [%s.>] file", cfg.Subjects, cfg.Storage, prefix)
	}
	s, err := nats.New("bus", nats.Config{URL: url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	e := sinktest.Event(prefix+".orders.paid", "order-1", []byte(`{"total":12}`))
	if errs := s.Publish(ctx, []sinks.Event{e}); errs[0] != nil {
		t.Fatalf("publishing to %s after the README's command: %v", e.Destination, errs[0])
	}
}
