package relaybench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/heraldhq/herald/relay"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// BinaryResult is what ModeBinary measured besides the drain's figures
// (Result's events/s, from the process's start; Result.CPUSeconds is the
// relay process's own).
type BinaryResult struct {
	// Binary is the relay binary that ran.
	Binary string `json:"binary"`
	// MetricsUpSeconds is the time from the process's start until its
	// admin server first answered /metrics.
	MetricsUpSeconds float64 `json:"metrics_up_s"`
	// FirstPublishedSeconds is the time from the process's start until a
	// scrape first saw an event published; DrainEventsPerSecond is the
	// events over the time from then on: the drain without the start.
	FirstPublishedSeconds float64 `json:"first_published_s"`
	DrainEventsPerSecond  float64 `json:"drain_events_per_s"`
	// Published is herald_events_published_total, summed over its series,
	// at the last scrape.
	Published int64 `json:"published"`
	// Scrapes is the /metrics requests made while waiting.
	Scrapes int `json:"scrapes"`
}

// publishedMetric is the counter ModeBinary waits on.
const publishedMetric = "herald_events_published_total"

// binaryScrapeEvery spaces the scrapes of /metrics: a scrape renders every
// metric in the relay process, on the CPU the drain needs, so they are
// kept far apart for a drain of seconds (the end is known to this much).
const binaryScrapeEvery = 50 * time.Millisecond

// binary commits the backlog into the run's fresh schema, starts `relay
// run` on it with a discard sink, and times it until its own metric counts
// every event. The per-event verification of the other modes is not made
// (the relay runs out of process); the counter and the rows left are
// checked instead.
func (r *run) binary(ctx context.Context) error {
	cfg := r.cfg
	bin := cfg.RelayBinary
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("--relay-binary: finding this executable: %w", err)
		}
		bin = exe
	}
	out := &BinaryResult{Binary: bin}
	r.res.Binary = out
	fmt.Fprintf(cfg.Progress, "inserting %d events over %s in schema %s...\n", cfg.Events, keysText(cfg.Keys), r.tables.Schema)
	if err := r.commitBacklog(ctx); err != nil {
		return err
	}
	addr, err := freeLoopbackAddr()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "herald-bench-")
	if err != nil {
		return fmt.Errorf("writing the relay's configuration: %w", err)
	}
	defer os.RemoveAll(dir)
	cfgPath := filepath.Join(dir, "relay.yaml")
	if err := os.WriteFile(cfgPath, r.binaryConfig(addr), 0o600); err != nil {
		return fmt.Errorf("writing the relay's configuration: %w", err)
	}

	cmd := exec.Command(bin, "run", "--config", cfgPath)
	// The configuration names the database; DATABASE_URL would override it.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	logs := &tailBuffer{max: 16 << 10}
	cmd.Stdout, cmd.Stderr = logs, logs
	fmt.Fprintf(cfg.Progress, "starting %s run (admin server on %s)...\n", bin, addr)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("--relay-binary: starting %s: %w", bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	elapsed, waitErr := r.scrapeUntil(ctx, addr, int64(cfg.Events), start, out, p)
	if stopErr := p.stop(); waitErr == nil && stopErr != nil {
		waitErr = stopErr
	}
	if waitErr != nil {
		return fmt.Errorf("%w\nrelay run's output (its end):\n%s", waitErr, logs.String())
	}
	fmt.Fprintf(cfg.Progress, "%s counted %d events %.3fs after the process started\n", publishedMetric, out.Published, elapsed.Seconds())

	res := r.res
	res.Events = cfg.Events
	res.ElapsedSeconds = elapsed.Seconds()
	res.EventsPerSecond = float64(cfg.Events) / res.ElapsedSeconds
	if d := res.ElapsedSeconds - out.FirstPublishedSeconds; d > 0 {
		out.DrainEventsPerSecond = float64(cfg.Events) / d
	}
	if ps := cmd.ProcessState; ps != nil {
		res.CPUSeconds = (ps.UserTime() + ps.SystemTime()).Seconds()
		res.CPUCores = res.CPUSeconds / res.ElapsedSeconds
		res.CPUScope = "the relay process from its start to its exit (shutdown included); not PostgreSQL"
	}
	res.RSSScope = "not measured (the relay runs out of process)"
	res.LanesSettled = true // the relay's start is part of what is timed
	if err := r.rowsLeft(ctx, &res.RowsLeft); err != nil {
		return fmt.Errorf("counting rows left: %w", err)
	}
	delivered := int(min(out.Published, int64(cfg.Events)))
	res.Verification = Verification{Events: cfg.Events, Delivered: delivered, Lost: cfg.Events - delivered,
		Duplicates: int(max(out.Published-int64(cfg.Events), 0))}
	if res.RowsLeft != 0 {
		return fmt.Errorf("relay run stopped with %d rows left in the outbox", res.RowsLeft)
	}
	return nil
}

// commitBacklog commits the events of a binary run in one transaction,
// before the relay starts: on PostgreSQL analysed as autovacuum would
// leave a backlog, on MySQL as plain INSERTs (InnoDB keeps its statistics
// itself).
func (r *run) commitBacklog(ctx context.Context) error {
	if r.my == nil {
		return r.commitEvents(ctx, 0, r.cfg.Events, "", true)
	}
	tx, err := r.my.admin.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("inserting the backlog: %w", err)
	}
	defer tx.Rollback()
	if err := r.insertMySQLEvents(ctx, tx, 0, r.cfg.Events); err != nil {
		return fmt.Errorf("inserting the backlog: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("committing the backlog: %w", err)
	}
	return nil
}

// binaryConfig is the configuration of the relay process: the run's
// database and schema (on MySQL, the run's own database), a discard sink
// for every topic, the admin server on addr, warnings and errors logged.
// YAML is a superset of JSON.
func (r *run) binaryConfig(addr string) []byte {
	relayCfg := map[string]any{}
	if r.cfg.BatchSize > 0 {
		relayCfg["batch_size"] = r.cfg.BatchSize
	}
	if r.cfg.Workers > 0 {
		relayCfg["workers"] = r.cfg.Workers
	}
	if r.cfg.PollInterval > 0 {
		relayCfg["poll_interval"] = r.cfg.PollInterval.String()
	}
	if r.cfg.Lease > 0 {
		relayCfg["lease"] = r.cfg.Lease.String()
	}
	if r.cfg.HandOffAfter > 0 {
		relayCfg["hand_off_after"] = r.cfg.HandOffAfter.String()
	}
	if r.cfg.PollOnly {
		relayCfg["poll_only"] = true
	}
	database := map[string]any{"url": r.cfg.DatabaseURL, "schema": r.tables.Schema, "table": r.tables.Table}
	if r.cfg.Capture == relay.CaptureWAL {
		database["capture"] = string(relay.CaptureWAL)
	}
	b, _ := json.MarshalIndent(map[string]any{ // maps and strings always marshal
		"database": database,
		"relay":    relayCfg,
		"log":      map[string]any{"level": "warn"},
		"admin":    map[string]any{"listen": addr, "console": false},
		"sinks":    []any{map[string]any{"name": "bench", "type": "discard"}},
		"routes":   []any{map[string]any{"topics": []string{"*"}, "sinks": []string{"bench"}}},
	}, "", "  ")
	return b
}

// scrapeUntil scrapes addr's /metrics until publishedMetric reaches n, and
// returns the time from start until the scrape that saw it.
func (r *run) scrapeUntil(ctx context.Context, addr string, n int64, start time.Time, out *BinaryResult, p *process) (time.Duration, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	url := "http://" + addr + "/metrics"
	deadline := start.Add(r.cfg.Timeout)
	tick := time.NewTicker(binaryScrapeEvery)
	defer tick.Stop()
	for {
		published, err := scrapeCounter(ctx, client, url, publishedMetric)
		at := time.Since(start)
		out.Scrapes++
		if err == nil {
			if out.MetricsUpSeconds == 0 {
				out.MetricsUpSeconds = at.Seconds()
			}
			out.Published = published
			if published > 0 && out.FirstPublishedSeconds == 0 {
				out.FirstPublishedSeconds = at.Seconds()
			}
			if published >= n {
				return at, nil
			}
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("--timeout: %s counted %d of %d events after %s (last scrape: %v)", publishedMetric, out.Published, n, r.cfg.Timeout, err)
		}
		select {
		case <-p.done:
			return 0, fmt.Errorf("relay run exited before %s reached %d (%d): %v", publishedMetric, n, out.Published, p.err)
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
}

// scrapeCounter sums the samples of the counter name in the Prometheus text
// exposition at url.
func scrapeCounter(ctx context.Context, client *http.Client, url, name string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: status %d", resp.StatusCode)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue // another metric, or a name that only starts with it
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("GET /metrics: %q: %w", line, err)
		}
		sum += v
	}
	return int64(sum), sc.Err()
}

// process is the relay process; done is closed once it exited, with err
// what cmd.Wait returned.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// stop asks the relay to stop (SIGTERM: it finishes its batch and records
// it) and waits for it, killing it after 30s. It returns an error when the
// relay had to be killed or exited with an error.
func (p *process) stop() error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stopping relay run: %w", err)
	}
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("relay run exited: %w", p.err)
		}
		return nil
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return errors.New("relay run did not stop within 30s of SIGTERM; killed")
	}
}

// freeLoopbackAddr returns a loopback address with a port free now.
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port for the relay's admin server: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

var _ io.Writer = (*tailBuffer)(nil)
