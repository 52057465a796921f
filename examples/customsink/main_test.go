//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/heraldhq/herald/examples/filesink"
	"github.com/heraldhq/herald/internal/pgtest"
)

// build compiles this program, as a user builds their relay.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "relay")
	if out, err := exec.Command("go", "build", "-trimpath", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// relay runs the binary to completion and returns its exit status and
// output.
func relay(t *testing.T, bin string, args ...string) (code int, output string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL=")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	case err != nil:
		t.Fatalf("relay %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return 0, string(out)
}

// writeConfig writes a configuration whose one sink is of type file, with
// sinkKeys as its settings.
func writeConfig(t *testing.T, url, schema, sinkKeys string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "relay.yaml")
	cfg := fmt.Sprintf(`database:
  url: %q
  schema: %s
relay:
  poll_interval: 50ms
sinks:
  - name: files
    type: file
%s
routes:
  - topics: ["*"]
    sinks: [files]
`, url, schema, sinkKeys)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCustomSinkType builds the binary, checks that its configuration
// accepts and validates the added type, and that relay run delivers an
// event to the custom sink.
func TestCustomSinkType(t *testing.T) {
	t.Parallel()
	bin := build(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	url := pgtest.URL(t)

	// The type's own Validate runs at load time, under the entry's path.
	bad := writeConfig(t, url, tables.Schema, "    max_event_bytes: 10")
	if code, out := relay(t, bin, "config", "check", "--config", bad); code != 2 || !strings.Contains(out, "dir: required") {
		t.Fatalf("config check of a file sink without dir: exit %d, want 2 and dir: required\n%s", code, out)
	}
	// Its keys are decoded strictly, as the built-in types' are.
	typo := writeConfig(t, url, tables.Schema, "    dir: /tmp\n    directory: /tmp")
	if code, out := relay(t, bin, "config", "check", "--config", typo); code != 2 || !strings.Contains(out, "directory") {
		t.Fatalf("config check of a file sink with an unknown key: exit %d, want 2 naming it\n%s", code, out)
	}

	dir := t.TempDir()
	cfg := writeConfig(t, url, tables.Schema, "    dir: "+dir)
	if code, out := relay(t, bin, "config", "check", "--config", cfg); code != 0 {
		t.Fatalf("config check: exit %d\n%s", code, out)
	}

	var id string
	if err := pool.QueryRow(t.Context(), "INSERT INTO "+tables.Outbox()+" (topic, key, payload) VALUES ('orders', 'o-1', $1) RETURNING id::text",
		[]byte(`{"total":42}`)).Scan(&id); err != nil {
		t.Fatal(err)
	}
	run := exec.Command(bin, "run", "--config", cfg)
	run.Env = append(os.Environ(), "DATABASE_URL=")
	var logs bytes.Buffer
	run.Stdout, run.Stderr = &logs, &logs
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()
	defer func() {
		_ = run.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("relay run exited with %v\n%s", err, logs.String())
			}
		case <-time.After(30 * time.Second):
			_ = run.Process.Kill()
			t.Errorf("relay run did not stop on SIGTERM\n%s", logs.String())
		}
	}()

	file := filepath.Join(dir, "orders.jsonl")
	deadline := time.Now().Add(30 * time.Second)
	for {
		data, err := os.ReadFile(file)
		if err == nil && bytes.HasSuffix(data, []byte("\n")) {
			var line filesink.Line
			if err := json.Unmarshal(bytes.TrimSpace(data), &line); err != nil {
				t.Fatalf("%s: %v\n%s", file, err, data)
			}
			if line.ID != id || line.Key != "o-1" || string(line.Payload) != `{"total":42}` {
				t.Fatalf("the file sink wrote %+v, want event %s of key o-1 with its payload", line, id)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no event in %s after 30 s (%v); relay run logged:\n%s", file, err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
