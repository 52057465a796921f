package relay

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/migrations/pgtest"
	"github.com/heraldhq/herald/sinks"
)

// The memory test's relay runs in a child process (the test binary again,
// see TestMain) so that its peak resident memory is its own, under a limit
// on its data segment: a relay that loads more than the bound dies of it.
const (
	memoryChildEnv   = "HERALD_RELAY_MEMORY_CHILD" // the schema to relay
	memoryChildLimit = 512 << 20                   // RLIMIT_DATA of the child
	memoryBatchBytes = 16 << 20
	memoryEventBytes = 12 << 20
)

// TestMemoryIsBoundedByBatchBytes covers 150 rows of 10 MB payloads, which
// took a relay to 2.9 GB and, under a 3 GB limit, into a crash loop: claims
// load at most relay.max_batch_bytes of payloads, and an event past
// relay.max_event_bytes is dead-lettered without being loaded.
func TestMemoryIsBoundedByBatchBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// 30 compressible payloads of 8 MiB (240 MiB in all, a few KiB each on
	// disk) and one of 13 MiB, more than the child's relay.max_event_bytes.
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.tables.Outbox()+` (topic, key, payload)
SELECT 'big', 'k' || g, json_build_object('pad', repeat('a', CASE WHEN g = 31 THEN 13 ELSE 8 END * 1048576 - 10))
FROM generate_series(1, 31) g`); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), memoryChildEnv+"="+b.tables.Schema, "DATABASE_URL="+pgtest.URL(t))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the relay process failed (%v):\n%s", err, tail(out, 3000))
	}
	peak := int64(-1)
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "peak_rss_bytes="); ok {
			peak, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if peak < 0 {
		t.Fatalf("the relay process reported no peak memory:\n%s", tail(out, 3000))
	}
	t.Logf("peak RSS of the relay process: %d MiB", peak>>20)
	if peak > 160<<20 {
		t.Fatalf("peak RSS %d MiB relaying 240 MiB of payloads with relay.max_batch_bytes 16 MiB, want at most 160 MiB", peak>>20)
	}
	if n := b.countDeliveries(t, "state = 'dead' AND sink = '' AND last_error LIKE '%its payload is 1363149_ bytes, more than relay.max_event_bytes (12582912)%'"); n != 1 {
		t.Fatalf("%d dead letters for the 13 MiB event, want 1 saying why", n)
	}
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// memoryChild runs a relay over the schema in memoryChildEnv until the
// outbox is empty, then prints its peak resident memory. It returns the
// process's exit code.
func memoryChild(schema string) int {
	if err := syscall.Setrlimit(syscall.RLIMIT_DATA, &syscall.Rlimit{Cur: memoryChildLimit, Max: memoryChildLimit}); err != nil {
		fmt.Println("setting RLIMIT_DATA:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tables := migrations.Tables{Schema: schema, Table: "outbox"}
	cfg := Config{
		Tables: tables, Workers: 1, PollInterval: 50 * time.Millisecond, MaxBatchBytes: memoryBatchBytes, MaxEventBytes: memoryEventBytes,
		Routes: []Route{{Topics: []string{"*"}, Targets: []Target{{Sink: &byteCounter{}}}}},
		Logger: slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	poolCfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return 1
	}
	ConfigurePool(poolCfg)
	poolCfg.MaxConns = PoolSize(cfg.WithDefaults().Workers)
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer pool.Close()
	r, err := New(pool, cfg)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	for {
		var left int64
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tables.Outbox()).Scan(&left); err != nil {
			fmt.Println(err)
			return 1
		}
		if left == 0 {
			break
		}
		select {
		case err := <-done:
			fmt.Println("the relay stopped:", err)
			return 1
		case <-ctx.Done():
			fmt.Printf("%d events still in the outbox after 2 minutes\n", left)
			return 1
		case <-time.After(50 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		fmt.Println("the relay stopped:", err)
		return 1
	}
	peak, err := peakRSS()
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Printf("peak_rss_bytes=%d\n", peak)
	return 0
}

// peakRSS reads this process's VmHWM.
func peakRSS() (int64, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/self/status")
}

// byteCounter is a sink that reads every payload and keeps nothing.
type byteCounter struct{ bytes atomic.Int64 }

func (*byteCounter) Name() string { return "count" }

func (c *byteCounter) Publish(_ context.Context, events []sinks.Event) []error {
	for _, e := range events {
		c.bytes.Add(int64(len(e.Payload)))
	}
	return make([]error, len(events))
}

func (*byteCounter) Close(context.Context) error { return nil }
