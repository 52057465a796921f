package relaycmd

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/heraldhq/herald/internal/pgtest"
)

// TestMemoryIsBoundedByBatchBytes covers a backlog of large payloads that a
// relay loading whole claims would hold at once, past its memory limit and
// into a crash loop (docs/benchmarks.md has the figures): the
// relay, limited to a 512 MiB data segment, relays 160 MiB of payloads
// loading at most relay.max_batch_bytes at a time, and dead-letters an event
// past relay.max_event_bytes without loading it. The sizes are scaled down
// (2 MiB payloads, 4 MiB batches) so the test stays cheap; holding the whole
// backlog would take the relay well past the RSS it is allowed.
func TestMemoryIsBoundedByBatchBytes(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	ctx := context.Background()
	// 80 compressible payloads of 2 MiB (a few KiB each on disk) and one of
	// 3.25 MiB.
	if _, err := pool.Exec(ctx, `INSERT INTO `+tables.Outbox()+` (topic, key, payload)
SELECT 'big', 'k' || g, json_build_object('pad', repeat('a', CASE WHEN g = 81 THEN 3407872 ELSE 2097152 END - 12))
FROM generate_series(1, 81) g`); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
relay: {workers: 1, poll_interval: 50ms, max_batch_bytes: 4MiB, max_event_bytes: 3MiB}
admin: {listen: ""}
sinks: [{name: void, type: discard}]
routes: [{topics: ["*"], sinks: [void]}]
`, url, tables.Schema))
	p := start(t, nil, "run", "--config", cfg)
	limit := unix.Rlimit{Cur: 512 << 20, Max: 512 << 20}
	if err := unix.Prlimit(p.cmd.Process.Pid, unix.RLIMIT_DATA, &limit, nil); err != nil {
		t.Fatalf("limiting the relay's data segment: %v", err)
	}
	waitFor(t, 2*time.Minute, p, "every event delivered or dead", func() bool {
		var pending int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tables.Outbox()).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return pending == 0
	})
	var dead int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tables.Deliveries()+
		` WHERE state = 'dead' AND last_error LIKE '%its payload is 3407872 bytes, more than relay.max_event_bytes (3145728)%'`).Scan(&dead); err != nil || dead != 1 {
		t.Fatalf("%d dead letters saying the 13 MiB event is too large (%v), want 1; output:\n%s", dead, err, p.output())
	}
	peak := peakRSS(t, p.cmd.Process.Pid)
	t.Logf("peak RSS of the relay: %d MiB", peak>>20)
	if peak > 100<<20 {
		t.Fatalf("peak RSS %d MiB relaying 160 MiB of payloads with relay.max_batch_bytes 4MiB, want at most 100 MiB", peak>>20)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d; output:\n%s", code, p.output())
	}
}

// waitFor polls cond until it holds, failing the test when the relay exits
// or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, p *process, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		select {
		case <-p.done:
			t.Fatalf("the relay exited (code %d) before %s; output:\n%s", p.code, what, p.output())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; output:\n%s", timeout, what, p.output())
		}
	}
}

// peakRSS reads a process's VmHWM.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/<pid>/status")
	return 0
}
