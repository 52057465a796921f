package relaycmd

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/internal/pgtest"
)

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// readiness is what /readyz answers.
type readiness struct {
	code     int
	Ready    bool              `json:"ready"`
	Sinks    map[string]string `json:"sinks"`
	Problems []string          `json:"problems"`
	body     string
}

// adminBase waits for the admin server's address in the JSON log.
func adminBase(t *testing.T, p *process) string {
	t.Helper()
	line := p.waitLine(t, p.stderr, "admin: listening", 30*time.Second)
	var rec map[string]any
	if err := json.Unmarshal([]byte(line), &rec); err != nil {
		t.Fatalf("log line is not JSON: %s", line)
	}
	return "http://" + rec["address"].(string)
}

func getReadyz(t *testing.T, base string) readiness {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := readiness{code: resp.StatusCode, body: string(b)}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("/readyz body: %v: %s", err, b)
	}
	return r
}

// waitReadyz polls /readyz until ok holds (within a minute).
func waitReadyz(t *testing.T, p *process, base string, ok func(readiness) bool) readiness {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		r := getReadyz(t, base)
		if ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never became what the test waits for; last %d %s\nrelay output:\n%s", r.code, r.body, p.output())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestReadyzReportsSinkThatCannotConnect: a NATS sink pointed at a closed
// port is reported by name on /readyz (503) from the start, while the other
// sink keeps delivering; with only the good sink /readyz answers 200 once
// its check passed. herald_sink_paused exists at 0 for every sink from the
// start.
func TestReadyzReportsSinkThatCannotConnect(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	natsURL := natstest.URL(t)
	stream := natstest.Stream(t, natstest.Connect(t, natsURL))
	bad := "nats://" + closedPort(t)
	config := func(withBad bool) string {
		sinks := fmt.Sprintf("  - {name: bus, type: nats, url: %q}\n", natsURL)
		routes := fmt.Sprintf("  - {topics: [\"good.*\"], sinks: [{name: bus, destination: %q}]}\n", stream.Subject("{{.Key}}"))
		if withBad {
			sinks += fmt.Sprintf("  - {name: wrongbus, type: nats, url: %q}\n", bad)
			routes += "  - {topics: [\"bad.*\"], sinks: [wrongbus]}\n"
		}
		return writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
relay: {lease: 5s, poll_interval: 100ms, shutdown_timeout: 5s, sink_pause: {initial: 100ms, max: 300ms}}
log: {level: info, format: json}
admin: {listen: "127.0.0.1:0"}
sinks:
%sroutes:
%s`, url, tables.Schema, sinks, routes))
	}
	migrate := runRelay(t, nil, "migrate", "up", "--database-url", url, "--schema", tables.Schema)
	if migrate.code != 0 {
		t.Fatalf("migrate:\n%s", migrate)
	}

	p := start(t, nil, "run", "--config", config(true))
	base := adminBase(t, p)
	r := waitReadyz(t, p, base, func(r readiness) bool { return r.Sinks["wrongbus"] != "" && r.Sinks["bus"] != "" })
	if r.code != http.StatusServiceUnavailable || r.Ready || r.Sinks["bus"] != "ok" ||
		!strings.Contains(r.Sinks["wrongbus"], bad) || len(r.Problems) != 1 || !strings.HasPrefix(r.Problems[0], "sink wrongbus check failed: ") {
		t.Fatalf("/readyz with an unreachable sink: %d %s", r.code, r.body)
	}
	p.waitLine(t, p.stderr, "sink check failed", 30*time.Second)
	// The good sink delivers meanwhile.
	insertRaw(t, pool, tables, "topic, key, payload", "'good.ev', 'k', '{}'")
	insertRaw(t, pool, tables, "topic, key, payload", "'bad.ev', 'k', '{}'")
	deadline := time.Now().Add(time.Minute)
	for len(stream.Messages(t)) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the good sink delivered nothing:\n%s", p.output())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The bad sink's event paused it: relay status names it.
	deadline = time.Now().Add(time.Minute)
	for {
		r := runRelay(t, nil, "status", "--database-url", url, "--schema", tables.Schema)
		if r.code != 0 {
			t.Fatalf("status:\n%s", r)
		}
		if regexp.MustCompile(`(?m)^\S+\s+\d+\s+\S+\s+\S+\s+yes\s+wrongbus$`).MatchString(r.stdout) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay status never showed wrongbus paused:\n%s\nrelay output:\n%s", r, p.output())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, p.output())
	}

	p = start(t, nil, "run", "--config", config(false))
	base = adminBase(t, p)
	r = waitReadyz(t, p, base, func(r readiness) bool { return r.Sinks["bus"] != "" })
	if r.code != http.StatusOK || !r.Ready || r.Sinks["bus"] != "ok" || len(r.Problems) != 0 {
		t.Fatalf("/readyz with every sink reachable: %d %s", r.code, r.body)
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `herald_sink_paused{sink="bus"} 0`) {
		t.Fatalf("herald_sink_paused is not exported at 0 from the start:\n%s", metrics)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, p.output())
	}
}
