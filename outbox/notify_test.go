package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/heraldhq/herald/outbox"
)

// listen LISTENs on the bundle's channel on a connection of its own and
// returns a function that counts the notifications received so far. It ends
// the count with a marker notification sent after everything the test did,
// so it needs no sleeping: notifications reach a listener in commit order.
func listen(t *testing.T, b *bundle) (count func() int) {
	t.Helper()
	ctx := context.Background()
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A connection that listened goes back to the pool closed.
		conn.Conn().Close(context.Background())
		conn.Release()
	})
	if _, err := conn.Exec(ctx, "LISTEN "+b.tables.ChannelIdent()); err != nil {
		t.Fatalf("LISTEN: %v", err)
	}
	return func() int {
		t.Helper()
		if _, err := b.pool.Exec(ctx, "SELECT pg_notify($1, 'end')", b.tables.Channel()); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			note, err := conn.Conn().WaitForNotification(waitCtx)
			cancel()
			if err != nil {
				t.Fatalf("waiting for notifications: %v (after %d)", err, n)
			}
			if note.Channel != b.tables.Channel() {
				t.Fatalf("notification on channel %q, want %q", note.Channel, b.tables.Channel())
			}
			if note.Payload == "end" {
				return n
			}
			if note.Payload != "" {
				t.Fatalf("notification payload %q, want empty", note.Payload)
			}
			n++
		}
	}
}

// enqueueTx runs calls Enqueue calls of one event each in one transaction and
// commits it.
func enqueueTx(t *testing.T, b *bundle, calls int) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for range calls {
		if _, err := b.writer.Enqueue(ctx, tx, outbox.Event{Topic: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestNotifyDebounced(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{NotifyInterval: time.Hour})
	count := listen(t, b)
	enqueueTx(t, b, 5)
	enqueueTx(t, b, 1)
	if n := count(); n != 1 {
		t.Fatalf("%d notifications for two transactions within the interval, want 1", n)
	}
	if rows := readRows(t, b); len(rows) != 6 {
		t.Fatalf("%d rows, want 6", len(rows))
	}
}

func TestNotifyAgainAfterTheInterval(t *testing.T) {
	t.Parallel()
	const interval = 50 * time.Millisecond
	b := setup(t, outbox.Config{NotifyInterval: interval})
	count := listen(t, b)
	enqueueTx(t, b, 3)
	time.Sleep(interval + 10*time.Millisecond)
	enqueueTx(t, b, 1)
	if n := count(); n != 2 {
		t.Fatalf("%d notifications, want 2 (one per interval)", n)
	}
}

func TestNotifyDisabled(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{DisableNotify: true, NotifyInterval: outbox.NotifyEveryCall})
	count := listen(t, b)
	enqueueTx(t, b, 3)
	enqueueTx(t, b, 1)
	if n := count(); n != 0 {
		t.Fatalf("%d notifications with DisableNotify, want 0", n)
	}
}

func TestNotifyEveryCall(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{NotifyInterval: outbox.NotifyEveryCall})
	count := listen(t, b)
	// Every call adds pg_notify(channel, ''), but PostgreSQL delivers
	// identical notifications of one transaction once.
	enqueueTx(t, b, 4)
	if n := count(); n != 1 {
		t.Fatalf("%d notifications for one transaction of 4 calls, want 1 (folded by PostgreSQL)", n)
	}
	for range 3 {
		enqueueTx(t, b, 1)
	}
	if n := count(); n != 3 {
		t.Fatalf("%d notifications for 3 transactions, want 3", n)
	}
}

func TestNotifyClaimReturnedWhenTheStatementFails(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{NotifyInterval: time.Hour})
	count := listen(t, b)
	id := uuid.Must(uuid.NewV7())
	// Stored by plain SQL, which does not notify.
	if _, err := b.pool.Exec(context.Background(), "INSERT INTO "+b.tables.Outbox()+" (id, topic) VALUES ($1, 'first')", id); err != nil {
		t.Fatal(err)
	}
	// The Writer's first call claims the hour's notification, then fails.
	if _, err := drivers[0].run(t, b, true, outbox.Event{ID: id, Topic: "dup"}); err == nil {
		t.Fatal("duplicate id accepted")
	}
	enqueueTx(t, b, 1)
	if n := count(); n != 1 {
		t.Fatalf("%d notifications after a failed call and a good one, want 1: the failed call kept the interval's claim", n)
	}
}
