package chaos

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

// waitDrained waits until no event is pending in the outbox or waiting in
// a sink's queue and, with WAL capture, until the slot has confirmed the
// WAL written so far (every event in it settled), and returns how long it
// took.
func waitDrained(t *testing.T, conn *sql.DB, wal bool) time.Duration {
	t.Helper()
	start := time.Now()
	var walEnd string
	if wal {
		if err := conn.QueryRow("SELECT pg_current_wal_lsn()::text").Scan(&walEnd); err != nil {
			t.Fatalf("reading the WAL's end: %v", err)
		}
	}
	for {
		var pending int
		var caughtUp bool
		err := conn.QueryRow(`SELECT (SELECT count(*) FROM outbox WHERE status = 'pending')
    + (SELECT count(*) FROM outbox_deliveries WHERE state <> 'dead')`).Scan(&pending)
		if err == nil && wal {
			err = conn.QueryRow(`SELECT coalesce(bool_and(confirmed_flush_lsn >= $1::pg_lsn), false) FROM pg_replication_slots`,
				walEnd).Scan(&caughtUp)
		}
		if err == nil && pending == 0 && (caughtUp || !wal) {
			return time.Since(start)
		}
		if time.Since(start) > drainTimeout {
			t.Fatalf("chaos: %d events still pending (slot caught up: %v) %s after the faults ended (last error %v)", pending, caughtUp, drainTimeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sinkReport is what one sink received, checked against what was committed.
type sinkReport struct {
	name       string
	received   int
	unique     int
	duplicates int
	missing    []string
	unexpected []string
	disorder   []string
	// pairs are the ids of order violations: later event first.
	pairs [][2]string
}

// analyse removes re-deliveries (keeping each id's first occurrence),
// then checks that every wanted id arrived, nothing else did, and that per
// key the sequence numbers only grow.
func analyse(name string, got []delivered, want map[string]event) sinkReport {
	r := sinkReport{name: name, received: len(got)}
	seen := map[string]bool{}
	lastN := map[string]int{}
	lastID := map[string]string{}
	for _, d := range got {
		if seen[d.id] {
			r.duplicates++
			continue
		}
		seen[d.id] = true
		r.unique++
		w, ok := want[d.id]
		if !ok {
			r.unexpected = append(r.unexpected, d.id)
			continue
		}
		if w.key != d.key || w.n != d.n {
			r.unexpected = append(r.unexpected, fmt.Sprintf("%s arrived as key %q n %d, committed as key %q n %d", d.id, d.key, d.n, w.key, w.n))
		}
		if d.key == "" {
			continue
		}
		if prev, ok := lastN[d.key]; ok && d.n <= prev {
			r.disorder = append(r.disorder, fmt.Sprintf("key %s: n %d (%s) after n %d (%s)", d.key, d.n, d.id, prev, lastID[d.key]))
			r.pairs = append(r.pairs, [2]string{lastID[d.key], d.id})
		}
		lastN[d.key], lastID[d.key] = d.n, d.id
	}
	for id := range want {
		if !seen[id] {
			r.missing = append(r.missing, id)
		}
	}
	sort.Strings(r.missing)
	return r
}

func (r sinkReport) rate() float64 {
	if r.unique == 0 {
		return 0
	}
	return 100 * float64(r.duplicates) / float64(r.unique)
}

// natsDeliveries reads the stream back in order.
func (e *env) natsDeliveries() []delivered {
	var out []delivered
	for _, m := range e.stream.Messages(e.t) {
		var p struct {
			K string `json:"k"`
			N int    `json:"n"`
		}
		if err := json.Unmarshal(m.Data, &p); err != nil {
			e.t.Errorf("NATS message %d is not the JSON payload: %q", m.Seq, m.Data)
			continue
		}
		out = append(out, delivered{id: m.Header.Get("Nats-Msg-Id"), key: m.Header.Get("Herald-Key"), n: p.N})
	}
	return out
}

// check compares the outbox table and both sinks with what was committed,
// and prints the figures.
func (e *env) check(conn *sql.DB, prod *producer, unknownFound int, start, faultsEnd time.Time, drained time.Duration, seed int64, length string) {
	t := e.t
	prod.mu.Lock()
	committed := append([]event(nil), prod.committed...)
	txs, failedTxs, unknown := prod.txs, prod.failedTxs, len(prod.unknown)
	prod.mu.Unlock()

	wantEvents := map[string]event{}
	wantPoison := map[string]event{}
	for _, ev := range committed {
		if ev.topic == topicPoison {
			wantPoison[ev.id] = ev
		} else {
			wantEvents[ev.id] = ev
		}
	}

	// The tables: nothing pending or queued; every row done (kept by
	// retention); exactly the poison events dead on the webhook, refused
	// with 400.
	var pending, done, total, queued int
	if err := conn.QueryRow(`SELECT coalesce(sum(CASE WHEN status = 'pending' THEN 1 ELSE 0 END), 0),
       coalesce(sum(CASE WHEN status = 'done' THEN 1 ELSE 0 END), 0), count(*),
       (SELECT count(*) FROM outbox_deliveries WHERE state <> 'dead')
FROM outbox`).Scan(&pending, &done, &total, &queued); err != nil {
		t.Fatalf("reading the outbox: %v", err)
	}
	if pending != 0 || queued != 0 {
		t.Errorf("after draining: %d rows pending, %d deliveries queued, want none", pending, queued)
	}
	switch {
	case e.db.walCapture() && done != total:
		// Only events that failed somewhere have rows.
		t.Errorf("the outbox holds %d rows, %d of them done; want every row done", total, done)
	case !e.db.walCapture() && (total != len(committed) || done != total):
		t.Errorf("the outbox holds %d rows (%d done), the producer committed %d", total, done, len(committed))
	}
	rows, err := conn.Query(`SELECT ` + e.db.idText("id") + `, sink, coalesce(last_error, '') FROM outbox_deliveries WHERE state = 'dead'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	deadSeen := map[string]bool{}
	for rows.Next() {
		var id, sink, lastErr string
		if err := rows.Scan(&id, &sink, &lastErr); err != nil {
			t.Fatal(err)
		}
		if _, ok := wantPoison[id]; !ok || sink != "hook" {
			t.Errorf("event %s is dead on sink %q (%s); only poison events may be dead, on the webhook", id, sink, lastErr)
			continue
		}
		if !strings.Contains(lastErr, "400") {
			t.Errorf("dead poison event %s: last_error %q does not name the 400", id, lastErr)
		}
		deadSeen[id] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id := range wantPoison {
		if !deadSeen[id] {
			t.Errorf("poison event %s is not dead", id)
		}
	}

	reports := []sinkReport{
		analyse("nats (JetStream)", e.natsDeliveries(), wantEvents),
		analyse("webhook", e.hook.deliveries(), wantEvents),
	}
	e.hook.mu.Lock()
	bad, refused := e.hook.bad, e.hook.refused
	e.hook.mu.Unlock()
	if len(bad) > 0 {
		t.Errorf("malformed webhook requests:\n%s", strings.Join(bad, "\n"))
	}
	for _, r := range reports {
		if len(r.missing) > 0 {
			t.Errorf("%s: %d committed events never arrived (LOST), e.g. %v", r.name, len(r.missing), r.missing[:min(5, len(r.missing))])
		}
		if len(r.unexpected) > 0 {
			t.Errorf("%s: %d unexpected or altered events, e.g. %v", r.name, len(r.unexpected), r.unexpected[:min(5, len(r.unexpected))])
		}
		if len(r.disorder) > 0 {
			t.Errorf("%s: per-key order broken %d times, e.g.\n%s", r.name, len(r.disorder), strings.Join(r.disorder[:min(10, len(r.disorder))], "\n"))
			for _, p := range r.pairs[:min(3, len(r.pairs))] {
				t.Logf("%s: rows of the key of a violation:\n%s", r.name, e.describeRows(conn, p[0]))
			}
		}
	}

	// The figures.
	var b strings.Builder
	fmt.Fprintf(&b, "chaos figures (seed %d, %s, drained %s after the faults ended):\n", seed, length, drained.Round(time.Millisecond))
	fmt.Fprintf(&b, "  producer: %d transactions, %d failed (%d commits with unknown outcome: %d of their events found committed)\n",
		txs, failedTxs, unknown, unknownFound)
	fmt.Fprintf(&b, "  events committed: %d (%d routed to both sinks, %d poison for the webhook only)\n", len(committed), len(wantEvents), len(wantPoison))
	fmt.Fprintf(&b, "  after drain: %d outbox rows done, %d pending; %d deliveries queued, %d dead\n", done, pending, queued, len(deadSeen))
	for _, r := range reports {
		fmt.Fprintf(&b, "  %-17s received %6d, unique %6d, duplicates %5d (%.2f%%), missing %d, order violations %d\n",
			r.name+":", r.received, r.unique, r.duplicates, r.rate(), len(r.missing), len(r.disorder))
	}
	fmt.Fprintf(&b, "  webhook refused %d poison requests with 400\n", refused)
	kinds := make([]string, 0, len(e.faults))
	for k := range e.faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	totalFaults := 0
	for _, k := range kinds {
		fmt.Fprintf(&b, "  fault %-34s x%d\n", k, e.faults[k])
		totalFaults += e.faults[k]
	}
	fmt.Fprintf(&b, "  faults injected: %d; wall time %s", totalFaults, time.Since(start).Round(time.Second))
	t.Log(b.String())
}

// describeRows prints the rows of the key of event id (kept by retention)
// and their deliveries, as evidence for a violation.
func (e *env) describeRows(conn *sql.DB, id string) string {
	key := e.db.quote("key")
	rows, err := conn.Query(`SELECT o.seq, ` + e.db.idText("o.id") + `, o.topic, o.status, o.created_at,
       coalesce(d.sink, ''), coalesce(d.state, ''), coalesce(d.attempts, 0)
FROM outbox o LEFT JOIN outbox_deliveries d ON d.seq = o.seq
WHERE o.` + key + ` = (SELECT ` + key + ` FROM outbox WHERE id = ` + idLiteral(id) + `) ORDER BY o.seq, d.sink`)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var (
			seq, attempts     int64
			id, topic, status string
			sink, state       string
			created           time.Time
		)
		if err := rows.Scan(&seq, &id, &topic, &status, &created, &sink, &state, &attempts); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "  seq %d id %s %s status %s created %s", seq, id, topic, status, created.Format(time.RFC3339Nano))
		if sink != "" {
			fmt.Fprintf(&b, " %s:%s/%d", sink, state, attempts)
		}
		b.WriteString("\n")
	}
	if err := rows.Err(); err != nil {
		return err.Error()
	}
	return b.String()
}
