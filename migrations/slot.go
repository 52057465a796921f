package migrations

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Slot is a logical replication slot as the server reports it: the one a
// relay with capture: wal reads.
type Slot struct {
	Name string
	// Active: a connection reads it now (a relay), with the server
	// process ActivePID.
	Active    bool
	ActivePID int32
	// RetainedBytes is the WAL the slot keeps on the server's disk (from
	// its restart position to the WAL's end); BehindBytes how far its
	// confirmed position is behind the WAL's end.
	RetainedBytes, BehindBytes int64
	// WALStatus is the server's word on the retained WAL: reserved,
	// extended, unreserved or lost (past max_slot_wal_keep_size: the slot
	// can no longer be read).
	WALStatus string
}

// ErrNoSlot is a slot that does not exist.
var ErrNoSlot = errors.New("no such replication slot")

// ReadSlot returns the slot named name, or ErrNoSlot.
func ReadSlot(ctx context.Context, pool *pgxpool.Pool, name string) (Slot, error) {
	s := Slot{Name: name}
	var pid *int32
	err := pool.QueryRow(ctx, `SELECT active, active_pid,
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint,
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint,
       coalesce(wal_status, '')
FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&s.Active, &pid, &s.RetainedBytes, &s.BehindBytes, &s.WALStatus)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, fmt.Errorf("replication slot %s: %w", name, ErrNoSlot)
	}
	if err != nil {
		return s, fmt.Errorf("reading replication slot %s: %w", name, err)
	}
	if pid != nil {
		s.ActivePID = *pid
	}
	return s, nil
}

// DropSlot drops the slot named name, which no connection may be reading:
// the WAL it kept is released, and the events in it that no relay read are
// lost.
func DropSlot(ctx context.Context, pool *pgxpool.Pool, name string) error {
	if _, err := ReadSlot(ctx, pool, name); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", name); err != nil {
		return fmt.Errorf("dropping replication slot %s (stop the relay reading it first): %w", name, err)
	}
	return nil
}
