package chaos

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/outbox"
)

// Topics the producer writes: events go to NATS and the webhook; poison
// events go to the webhook only, which refuses them with 400 for good.
const (
	topicEvent  = "chaos.event"
	topicPoison = "chaos.poison"
)

// Secrets written into the relays' configuration; none may show in their
// output.
const (
	webhookSecret = "whsec_Q2hhb3MtV2ViaG9vay1TZWNyZXQtS2V5LTEyMzQ="
	webhookAuth   = "Bearer Chaos-Static-Header-Token-77"
)

// delivered is one event as a sink received it.
type delivered struct {
	id, key string
	n       int
}

// webhookMode is what the receiver does with a request.
type webhookMode int

const (
	hookOK webhookMode = iota
	hook500
	hookHang
	hookDrop
	// hookSlow answers every event, but late (100-400 ms: longer than the
	// relays wait before they hand a batch's unanswered events off).
	hookSlow
	// hookSlowKeys answers one key in eight 600 ms late (within the sink's
	// timeout), the others at once: slow events among fast ones.
	hookSlowKeys
)

// receiver is the webhook endpoint: it records every event it accepts
// (answered 2xx) in arrival order, and misbehaves while a fault is on.
type receiver struct {
	srv *httptest.Server

	mu        sync.Mutex
	mode      webhookMode
	modeUntil time.Time
	got       []delivered
	refused   int // poison events answered 400
	bad       []string
}

func startReceiver(t *testing.T) *receiver {
	t.Helper()
	rc := &receiver{}
	rc.srv = httptest.NewServer(rc)
	t.Cleanup(rc.srv.Close)
	return rc
}

// fault makes the receiver misbehave in mode for d.
func (rc *receiver) fault(mode webhookMode, d time.Duration) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.mode, rc.modeUntil = mode, time.Now().Add(d)
}

func (rc *receiver) heal() { rc.fault(hookOK, 0) }

func (rc *receiver) currentMode() webhookMode {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if time.Now().After(rc.modeUntil) {
		return hookOK
	}
	return rc.mode
}

// accepted returns how many events the receiver has accepted so far.
func (rc *receiver) accepted() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.got)
}

func (rc *receiver) deliveries() []delivered {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.got)
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	switch rc.currentMode() {
	case hook500:
		w.WriteHeader(http.StatusInternalServerError)
		return
	case hookHang:
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	case hookDrop:
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				return
			}
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	var env struct {
		ID, Topic, Key string
		Payload        struct {
			K string `json:"k"`
			N int    `json:"n"`
		}
	}
	id := r.Header.Get("webhook-id")
	if err := json.Unmarshal(body, &env); err == nil {
		rc.answerLate(r.Context(), env.ID, env.Key)
	}
	if err := json.Unmarshal(body, &env); err != nil || env.ID != id || r.URL.Path != "/hook" ||
		r.Header.Get("Authorization") != webhookAuth || r.Header.Get("webhook-signature") == "" {
		rc.mu.Lock()
		rc.bad = append(rc.bad, fmt.Sprintf("path %s, webhook-id %q, body %.200s", r.URL.Path, id, body))
		rc.mu.Unlock()
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	if env.Topic == topicPoison {
		rc.mu.Lock()
		rc.refused++
		rc.mu.Unlock()
		http.Error(w, "poison event refused", http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	rc.got = append(rc.got, delivered{id: id, key: env.Key, n: env.Payload.N})
	rc.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// answerLate waits before answering the event id of key while the receiver
// is slow (hookSlow), or slow for the key (hookSlowKeys).
func (rc *receiver) answerLate(ctx context.Context, id, key string) {
	var wait time.Duration
	switch rc.currentMode() {
	case hookSlow:
		wait = time.Duration(100+int(crc32.ChecksumIEEE([]byte(id))%300)) * time.Millisecond
	case hookSlowKeys:
		if crc32.ChecksumIEEE([]byte(key))%8 == 0 {
			wait = 600 * time.Millisecond
		}
	}
	if wait > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// database is the throwaway server a chaos run's relays share, started by
// the test (PostgreSQL in postgres_test.go, MariaDB in mariadb_test.go), and
// the SQL the suite needs that differs between them.
type database interface {
	// url is the URL of a client named name (the relays' names begin with
	// relayAppPrefix), with dbPassword in it.
	url(name string) string
	// open returns a handle for the test itself, closed when the test ends.
	open(t *testing.T, name string) *sql.DB
	dialect() outbox.Dialect
	// relayCommand is a relay process on the configuration file config.
	relayCommand(config string) *exec.Cmd
	// walCapture: the relays read events from the WAL, and the producer
	// emits them there.
	walCapture() bool
	// killRelayConns ends every connection of the relays, from the server,
	// and returns how many it ended.
	killRelayConns(t *testing.T) int
	// stop stops the server, cleanly or as a crash (SIGKILL); start starts
	// it again on the same data and port.
	stop(t *testing.T, crash bool)
	start(t *testing.T)
	// idText is the SQL of col, an event id, as text; quote quotes a name.
	idText(col string) string
	quote(name string) string
}

// relayProc is one relay process (one life of it).
type relayProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	code int
}

// fleet runs the relay processes, each with its own configuration file
// (its own application_name) and log file, kept across its restarts.
type fleet struct {
	t       *testing.T
	db      database
	configs []string
	logs    []string

	mu    sync.Mutex
	procs []*relayProc
}

func newFleet(t *testing.T, db database, configs []string) *fleet {
	dir := t.TempDir()
	f := &fleet{t: t, db: db, configs: configs, procs: make([]*relayProc, len(configs))}
	for i := range configs {
		f.logs = append(f.logs, filepath.Join(dir, fmt.Sprintf("relay-%d.log", i)))
	}
	t.Cleanup(func() {
		for i := range f.procs {
			if p := f.proc(i); p != nil {
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
	})
	return f
}

func (f *fleet) proc(i int) *relayProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.procs[i]
}

// start starts relay i (which must not be running).
func (f *fleet) start(i int) {
	f.t.Helper()
	log, err := os.OpenFile(f.logs[i], os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		f.t.Fatal(err)
	}
	fmt.Fprintf(log, "=== chaos: starting relay %d at %s\n", i, time.Now().Format(time.RFC3339Nano))
	cmd := f.db.relayCommand(f.configs[i])
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = environWithout("DATABASE_URL")
	if err := cmd.Start(); err != nil {
		log.Close()
		f.t.Fatalf("starting relay %d: %v", i, err)
	}
	p := &relayProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		if ee, ok := err.(*exec.ExitError); ok {
			p.code = ee.ExitCode()
		} else if err != nil {
			p.code = -1
		}
		fmt.Fprintf(log, "=== chaos: relay %d exited with %d (%v) at %s\n", i, p.code, err, time.Now().Format(time.RFC3339Nano))
		log.Close()
		close(p.done)
	}()
	f.mu.Lock()
	f.procs[i] = p
	f.mu.Unlock()
}

// waitStarted waits until relay i, just started, logs that it runs, or
// exits. A relay that cannot reach its database while it starts exits
// (a supervisor restarts it); the faults are meant for running relays, so
// none is injected while one starts.
func (f *fleet) waitStarted(i int) {
	f.t.Helper()
	p := f.proc(i)
	marker := fmt.Sprintf("=== chaos: starting relay %d at ", i)
	for {
		data, err := os.ReadFile(f.logs[i])
		if err != nil {
			f.t.Fatal(err)
		}
		text := string(data)
		if last := strings.LastIndex(text, marker); last >= 0 && strings.Contains(text[last:], `"relay: started"`) {
			return
		}
		select {
		case <-p.done:
			f.t.Fatalf("relay %d exited with %d while starting:\n%s", i, p.code, f.tail(i, 40))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// kill sends SIGKILL to relay i and waits for it to die.
func (f *fleet) kill(i int) {
	p := f.proc(i)
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// terminate sends SIGTERM to relay i and waits for a graceful exit (0).
func (f *fleet) terminate(i int) error {
	p := f.proc(i)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		f.kill(i)
		return fmt.Errorf("relay %d did not stop within 30s of SIGTERM", i)
	}
	if p.code != 0 {
		return fmt.Errorf("relay %d exited %d after SIGTERM, want 0", i, p.code)
	}
	return nil
}

// exited returns the relays that exited on their own (not killed by the
// test), with their exit codes.
func (f *fleet) exited() map[int]int {
	out := map[int]int{}
	for i := range f.procs {
		p := f.proc(i)
		select {
		case <-p.done:
			out[i] = p.code
		default:
		}
	}
	return out
}

// tail returns the last n lines of relay i's log.
func (f *fleet) tail(i, n int) string {
	file, err := os.Open(f.logs[i])
	if err != nil {
		return err.Error()
	}
	defer file.Close()
	var lines []string
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 2*n {
			lines = slices.Clone(lines[len(lines)-n:])
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// grepLogs returns the lines of every relay log containing any of secrets.
func (f *fleet) grepLogs(secrets ...string) []string {
	var hits []string
	for i, path := range f.logs {
		data, err := os.ReadFile(path)
		if err != nil {
			hits = append(hits, err.Error())
			continue
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			for _, s := range secrets {
				if strings.Contains(line, s) {
					hits = append(hits, fmt.Sprintf("relay %d: %s", i, line))
				}
			}
		}
	}
	return hits
}

func environWithout(name string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// relayConfig writes relay i's configuration file; wal makes it read the
// WAL.
func relayConfig(t *testing.T, dbURL, natsURL, subject, hookURL string, wal bool) string {
	t.Helper()
	capture := "table"
	if wal {
		capture = "wal"
	}
	text := fmt.Sprintf(`
database:
  url: %q
  capture: %s
relay:
  batch_size: 50
  lease: 3s
  poll_interval: 200ms
  max_attempts: 1000000
  backoff: {initial: 20ms, max: 500ms}
  sink_pause: {initial: 50ms, max: 500ms}
  shutdown_timeout: 5s
  retention: 1h
  hand_off_after: 30ms
  max_in_flight: 200
log: {level: info, format: json}
admin: {listen: ""}
sinks:
  - name: bus
    type: nats
    url: %q
    ack_timeout: 1s
  - name: hook
    type: webhook
    url: %q
    secret: %q
    headers: {Authorization: %q}
    timeout: 1s
    concurrency: 8
routes:
  - topics: [%s]
    sinks: [{name: bus, destination: %q}, hook]
  - topics: [%s]
    sinks: [hook]
`, dbURL, capture, natsURL, hookURL, webhookSecret, webhookAuth, topicEvent, subject, topicPoison)
	path := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// migrate applies the schema with the relay binary, the first use of it
// in a chaos run.
func migrate(t *testing.T, dbURL string) {
	t.Helper()
	waitRelayBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, relayBin, "migrate", "up", "--database-url", dbURL)
	cmd.Env = environWithout("DATABASE_URL")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("relay migrate up: %v\n%s", err, out)
	}
}

// event is one event the producer wrote.
type event struct {
	id, key, topic string
	n              int
}

// producer commits events continuously in single- and multi-row
// transactions and records those whose commit succeeded; those whose
// commit failed are kept apart as unknown, settled later by looking for
// their rows.
type producer struct {
	db     *sql.DB
	writer *outbox.Writer
	// commits: each transaction also inserts its events' ids into
	// chaos_commits, the business row that says whether a commit whose
	// outcome was unknown happened (WAL capture writes no outbox row).
	commits bool
	rng     *rand.Rand
	keys    int
	next    map[string]int

	mu        sync.Mutex
	committed []event
	unknown   []event
	txs       int
	failedTxs int
}

func newProducer(t *testing.T, db *sql.DB, dialect outbox.Dialect, seed int64, keys int, wal bool) *producer {
	t.Helper()
	cfg := outbox.Config{Tables: migrations.Tables{}.WithDefaults(), Dialect: dialect}
	if wal {
		cfg.Capture = outbox.WAL
	}
	w, err := outbox.NewWriter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &producer{db: db, writer: w, commits: wal, rng: rand.New(rand.NewPCG(uint64(seed), 1)), keys: keys, next: map[string]int{}}
}

// createCommits creates the producer's business table for WAL capture.
func createCommits(t *testing.T, db database) {
	t.Helper()
	if _, err := db.open(t, "chaos_setup").Exec("CREATE TABLE chaos_commits (id uuid PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
}

// run writes until ctx ends.
func (p *producer) run(ctx context.Context) {
	for ctx.Err() == nil {
		p.once(ctx)
		time.Sleep(time.Duration(2+p.rng.IntN(8)) * time.Millisecond)
	}
}

func (p *producer) once(ctx context.Context) {
	count := 1
	if p.rng.IntN(10) < 4 {
		count = 2 + p.rng.IntN(4)
	}
	evs := make([]event, count)
	rows := make([]outbox.Event, count)
	for i := range evs {
		e := event{topic: topicEvent}
		if p.rng.IntN(20) > 0 {
			e.key = fmt.Sprintf("key-%03d", p.rng.IntN(p.keys))
		}
		if p.rng.IntN(150) == 0 {
			e.topic = topicPoison
		}
		p.next[e.key]++
		e.n = p.next[e.key]
		payload, _ := json.Marshal(map[string]any{"k": e.key, "n": e.n})
		evs[i] = e
		rows[i] = outbox.Event{Topic: e.topic, Key: e.key, Payload: payload, Headers: map[string]string{"x-chaos": "1"}}
	}
	opCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tx, err := p.db.BeginTx(opCtx, nil)
	if err != nil {
		p.fail()
		return
	}
	defer tx.Rollback()
	ids, err := p.writer.EnqueueSQL(opCtx, tx, rows...)
	if err != nil {
		p.fail()
		return
	}
	marks := make([]string, len(evs))
	for i := range evs {
		evs[i].id = ids[i].String()
		marks[i] = idLiteral(evs[i].id)
	}
	if p.commits {
		if _, err := tx.ExecContext(opCtx, "INSERT INTO chaos_commits (id) VALUES ("+strings.Join(marks, "), (")+")"); err != nil {
			p.fail()
			return
		}
	}
	err = tx.Commit()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.txs++
	if err != nil {
		p.failedTxs++
		p.unknown = append(p.unknown, evs...)
		return
	}
	p.committed = append(p.committed, evs...)
}

func (p *producer) fail() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.txs++
	p.failedTxs++
}

// settleUnknown moves the events of failed commits whose rows exist (outbox
// rows, or with WAL capture their business rows) to the committed list.
func (p *producer) settleUnknown(t *testing.T, db database, conn *sql.DB) (found int) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.unknown) == 0 {
		return 0
	}
	ids := make([]string, len(p.unknown))
	for i, e := range p.unknown {
		ids[i] = idLiteral(e.id)
	}
	table := "outbox"
	if p.commits {
		table = "chaos_commits"
	}
	rows, err := conn.Query(`SELECT ` + db.idText("id") + ` FROM ` + table + ` WHERE id IN (` + strings.Join(ids, ", ") + `)`)
	if err != nil {
		t.Fatalf("looking for events of failed commits: %v", err)
	}
	exists := map[string]bool{}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		exists[id] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, e := range p.unknown {
		if exists[e.id] {
			p.committed = append(p.committed, e)
			found++
		}
	}
	return found
}

// idLiteral is an event id as an SQL string literal: the id is a UUID the
// producer got back from the outbox library, parsed again so that nothing
// else can reach the statement.
func idLiteral(id string) string { return "'" + uuid.MustParse(id).String() + "'" }

// keepLogs copies the relay logs out of the test's temporary directory and
// returns where they are.
func (f *fleet) keepLogs(seed int64) string {
	dir, err := os.MkdirTemp("", fmt.Sprintf("herald-chaos-logs-%d-", seed))
	if err != nil {
		return err.Error()
	}
	for i, path := range f.logs {
		data, err := os.ReadFile(path)
		if err != nil {
			return err.Error()
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("relay-%d.log", i)), data, 0o600); err != nil {
			return err.Error()
		}
	}
	return dir
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
