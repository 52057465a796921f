package relaycmd

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/nats"
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

// streamCommand is one of the docs' commands creating the EVENTS stream,
// made to run against the test server with a stream name and subject
// prefix of the test's own (the server is shared).
type streamCommand struct {
	line         string // as run, quotes removed
	name, prefix string
}

// uniqueStreamCommand rewrites line (--server, the EVENTS name and the
// events.> subjects) for this test, deleting the stream when it ends.
func uniqueStreamCommand(t *testing.T, js jetstream.JetStream, url, line string) streamCommand {
	t.Helper()
	id := strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	c := streamCommand{name: "HERALD_README_" + id, prefix: "herald_readme_" + id}
	line = regexp.MustCompile(`--server \S+`).ReplaceAllString(line, "--server "+url)
	line = strings.Replace(line, "EVENTS", c.name, 1)
	line = strings.Replace(line, "'events.>'", "'"+c.prefix+".>'", 1)
	c.line = strings.ReplaceAll(line, "'", "")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, c.name)
	})
	return c
}

// checkStream checks that the command's stream exists, on file storage,
// covering what the configuration example's destination
// (events.{{.Topic}}) renders: the NATS sink publishes there.
func (c streamCommand) checkStream(t *testing.T, js jetstream.JetStream, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, c.name)
	if err != nil {
		t.Fatalf("%s created no stream %s: %v", c.line, c.name, err)
	}
	if cfg := stream.CachedInfo().Config; strings.Join(cfg.Subjects, ",") != c.prefix+".>" || cfg.Storage != jetstream.FileStorage {
		t.Fatalf("stream subjects %v storage %v, want [%s.>] file", cfg.Subjects, cfg.Storage, c.prefix)
	}
	s, err := nats.New("bus", nats.Config{URL: url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	e := sinktest.Event(c.prefix+".orders.paid", "order-1", []byte(`{"total":12}`))
	if errs := s.Publish(ctx, []sinks.Event{e}); errs[0] != nil {
		t.Fatalf("publishing to %s after %s: %v", e.Destination, c.line, errs[0])
	}
}

// TestREADMENATSStreamCommand runs the `nats stream add` command of
// docs/sinks.md against the test server and checks the stream it makes.
func TestREADMENATSStreamCommand(t *testing.T) {
	t.Parallel()
	m := regexp.MustCompile("(?m)^nats --server \\S+ stream add EVENTS --subjects 'events\\.>'.*$").FindString(doc(t, "sinks.md"))
	if m == "" {
		t.Fatal("docs/sinks.md: no `nats --server ... stream add EVENTS --subjects 'events.>'` command in the NATS section")
	}
	url := natstest.URL(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	c := uniqueStreamCommand(t, js, url, m)
	cmd := exec.Command(natsCLI(t), strings.Fields(c.line)[1:]...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir()) // no nats context of the user's
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", c.line, err, out)
	}
	c.checkStream(t, js, url)
}

// TestREADMENATSStreamInOneStep runs the `go run ./examples/natsstream`
// command the README and docs/sinks.md give (each different line once),
// built once, from the repository root as a reader would, and checks the
// stream it makes and what it prints.
func TestREADMENATSStreamInOneStep(t *testing.T) {
	t.Parallel()
	find := regexp.MustCompile("(?m)^go run \\./examples/natsstream( .*)?$")
	var lines []string
	for _, page := range []string{readme(t), doc(t, "sinks.md")} {
		m := find.FindString(page)
		if m == "" {
			t.Fatal("README and docs/sinks.md: each must show `go run ./examples/natsstream ...`")
		}
		if !slices.Contains(lines, m) {
			lines = append(lines, m)
		}
	}
	bin := filepath.Join(t.TempDir(), "natsstream")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./examples/natsstream")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/natsstream: %v\n%s", err, out)
	}
	url := natstest.URL(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range lines {
		c := uniqueStreamCommand(t, js, url, line)
		args := strings.Fields(c.line)[3:] // after go run ./examples/natsstream
		cmd := exec.Command(bin, args...)
		cmd.Dir = ".."
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", c.line, err, out)
		}
		if want := "stream " + c.name + " covers " + c.prefix + ".> (file storage, duplicate window 2m0s)\n"; string(out) != want {
			t.Errorf("%s printed %q, want %q", c.line, out, want)
		}
		c.checkStream(t, js, url)
	}
}
