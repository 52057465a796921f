package walcapture

import (
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/heraldhq/herald/relay/internal/store"
)

// TestConfirmsOnlyPastSettledTransactions: the position confirmed moves
// past a transaction only once every event of it is settled, whichever way
// Takes cut across transactions, and past the WAL the server sent only
// when nothing is outstanding.
func TestConfirmsOnlyPastSettledTransactions(t *testing.T) {
	r := New(Config{Buffer: 100})
	ev := func() Event { return Event{Event: store.Event{Topic: "t"}} }
	// Transaction A (3 events, ends at 100), B (2 events, ends at 200).
	r.begin()
	r.add(ev())
	r.add(ev())
	r.add(ev())
	r.committed(100)
	r.begin()
	r.add(ev())
	r.add(ev())
	r.committed(200)
	r.sawWALEnd(250, false)
	check := func(want pglogrepl.LSN, when string) {
		t.Helper()
		if got := r.confirmable(); got != want {
			t.Fatalf("%s: confirmable %s, want %s", when, got, want)
		}
	}
	check(0, "nothing settled")
	if got := r.Take(2); len(got) != 2 {
		t.Fatalf("took %d", len(got))
	}
	if got := r.Take(2); len(got) != 2 { // A's last event and B's first
		t.Fatalf("took %d", len(got))
	}
	r.Settled() // A's first two
	check(0, "part of A settled")
	r.Settled() // A's last, B's first
	check(100, "A settled, B half")
	// B's last event is still buffered: nothing past B, nor the WAL end.
	if got := r.Take(10); len(got) != 1 {
		t.Fatalf("took %d", len(got))
	}
	check(100, "B taken, not settled")
	r.Settled()
	check(250, "all settled: the WAL end the server sent")
	// A transaction still being read holds the position.
	r.begin()
	r.add(ev())
	r.sawWALEnd(400, true)
	r.Take(1)
	r.Settled()
	check(250, "an open transaction's events settled before its commit")
	r.committed(300)
	check(300, "its commit read")
}
