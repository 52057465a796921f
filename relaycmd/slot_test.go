package relaycmd

import (
	"strings"
	"testing"

	"github.com/heraldhq/herald/internal/pgtest"
)

// TestSlotCommands: relay slot show says when the slot does not exist yet,
// shows it once made (no relay reading it, the WAL it keeps), relay status
// with capture: wal prints it, and relay slot drop asks, then drops it.
func TestSlotCommands(t *testing.T) {
	t.Parallel()
	b := newDLQBundle(t)
	pgtest.RequireLogicalWAL(t, b.pool)
	slot := b.tables.SlotName()

	r := runRelay(t, nil, b.args("slot", "show")...)
	b.check(t, r, 1)
	if !strings.Contains(r.stderr, "replication slot "+slot+" does not exist") {
		t.Fatalf("no slot yet:\n%s", r)
	}
	b.exec("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
	r = runRelay(t, nil, b.args("slot", "show")...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, "slot "+slot+": no relay reads it; keeps ") {
		t.Fatalf("slot show:\n%s", r)
	}
	config := writeConfig(t, `database:
  capture: wal
sinks:
  - {name: out, type: stdout}
routes:
  - {topics: ["*"], sinks: [out]}
`)
	url, _ := dbURL(t)
	r = runRelay(t, []string{"DATABASE_URL=" + url}, b.args("--config", config, "status")...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, "capture wal: slot "+slot+": no relay reads it") {
		t.Fatalf("status with capture: wal:\n%s", r)
	}
	r = runRelay(t, nil, b.args("slot", "drop")...)
	b.check(t, r, 2)
	if !strings.Contains(r.stderr, "pass --yes") {
		t.Fatalf("drop without a terminal or --yes:\n%s", r)
	}
	r = runRelay(t, nil, b.args("slot", "drop", "--yes")...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, "dropped replication slot "+slot) {
		t.Fatalf("slot drop:\n%s", r)
	}
	if n := b.query("SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = $1", slot); n != "0" {
		t.Fatalf("%s slots left after the drop", n)
	}
}
