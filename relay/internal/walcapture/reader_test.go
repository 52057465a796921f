package walcapture_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/relay/internal/walcapture"
)

// TestReaderReadsWhatWasEmittedBeforeItStarted: an event emitted after the
// slot exists but before any reader runs is read by the first reader.
func TestReaderReadsWhatWasEmittedBeforeItStarted(t *testing.T) {
	t.Parallel()
	pool := pgtest.WALPool(t)
	pgtest.RequireLogicalWAL(t, pool)
	tables := pgtest.Schema(t, pool)
	ctx := context.Background()
	newReader := func() *walcapture.Reader {
		return walcapture.New(walcapture.Config{Conn: pool.Config().ConnConfig.Config.Copy(), Slot: tables.SlotName(),
			Publication: tables.PublicationName(), Prefix: tables.MessagePrefix(),
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	}
	if err := newReader().Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	var id string
	if err := pool.QueryRow(ctx, "SELECT "+tables.Emit()+"('t', 'k', '{}')::text").Scan(&id); err != nil {
		t.Fatal(err)
	}
	r := newReader()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if got := r.Take(10); len(got) > 0 {
			if got[0].ID != id || got[0].CommitTime.IsZero() {
				t.Fatalf("read %+v, want event %s with its commit time", got[0], id)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("nothing read")
		}
		select {
		case <-r.Arrived():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestReaderSkipsAMessageThatIsNotAnEvent: a message with the outbox's
// prefix that outbox_emit did not write (pg_logical_emit_message called by
// hand) is skipped and counted, instead of stopping the slot at it: the
// event after it, in the same transaction, is read.
func TestReaderSkipsAMessageThatIsNotAnEvent(t *testing.T) {
	t.Parallel()
	pool := pgtest.WALPool(t)
	pgtest.RequireLogicalWAL(t, pool)
	tables := pgtest.Schema(t, pool)
	ctx := context.Background()
	r := walcapture.New(walcapture.Config{Conn: pool.Config().ConnConfig.Config.Copy(), Slot: tables.SlotName(),
		Publication: tables.PublicationName(), Prefix: tables.MessagePrefix(), Logger: slog.New(slog.DiscardHandler)})
	if err := r.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, content := range []string{`not an event`, `{"seq" : 1, "id" : "x", "payload" : {"a": }}`} {
		if _, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2::text)", tables.MessagePrefix(), content); err != nil {
			t.Fatal(err)
		}
	}
	var id string
	if err := tx.QueryRow(ctx, "SELECT "+tables.Emit()+"('t', 'k', '{}')::text").Scan(&id); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if got := r.Take(10); len(got) > 0 {
			if len(got) != 1 || got[0].ID != id {
				t.Fatalf("read %+v, want only event %s", got, id)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the event after the messages that are not events was not read")
		}
		select {
		case <-r.Arrived():
		case err := <-done:
			t.Fatalf("the reader stopped: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if n := r.Undecodable(); n != 2 {
		t.Errorf("%d messages counted as not events, want 2", n)
	}
}
