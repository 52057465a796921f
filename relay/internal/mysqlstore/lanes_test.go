package mysqlstore

import (
	"context"
	"testing"
	"time"
)

// Two relays share the lanes: Renew reports the live relays of the newest
// configuration and each one's rank; a relay takes only free or expired
// lanes, says which it took over, and ReleaseLanes, ReleaseAll and
// OwnerLive do what they say.
func TestLanesBetweenRelays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	a, z := b.relay(t, "relay-a"), b.relay(t, "relay-z")
	va, err := a.Renew(ctx, a.owner, "v1", time.Hour, []string{"paused-sink"})
	if err != nil {
		t.Fatal(err)
	}
	vz, err := z.Renew(ctx, z.owner, "v1", time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	if va.Live != 1 || va.Rank != 0 || !va.Current || va.Held.Mask != 0 {
		t.Fatalf("first relay's view %+v", va)
	}
	if vz.Live != 2 || vz.Rank != 1 || !vz.Current {
		t.Fatalf("second relay's view %+v, want 2 live, rank 1, current", vz)
	}
	var paused string
	if err := b.db.QueryRow("SELECT paused_sinks FROM "+b.tables.Relays()+" WHERE owner = ?", a.owner).Scan(&paused); err != nil || paused != `["paused-sink"]` {
		t.Fatalf("paused sinks stored as %q (%v)", paused, err)
	}

	// Each takes its block.
	acq, over, err := a.AcquireLanes(ctx, a.owner, time.Hour, 0, 31)
	if err != nil || acq.Mask != 1<<32-1 || over != 0 {
		t.Fatalf("relay-a acquired %064b, took over %064b: %v", acq.Mask, over, err)
	}
	acq, _, err = z.AcquireLanes(ctx, z.owner, time.Hour, 0, 63)
	if err != nil || acq.Mask != ^uint64(1<<32-1) {
		t.Fatalf("relay-z acquired %064b, want the lanes relay-a does not hold: %v", acq.Mask, err)
	}
	if v, err := a.Renew(ctx, a.owner, "v1", time.Hour, nil); err != nil || v.Held.Mask != 1<<32-1 {
		t.Fatalf("relay-a holds %064b (%v)", v.Held.Mask, err)
	}

	// A new configuration: the old one is no longer current.
	if v, err := z.Renew(ctx, z.owner, "v2", time.Hour, nil); err != nil || !v.Current || v.Live != 1 || v.Rank != 0 {
		t.Fatalf("relay-z on v2: %+v (%v)", v, err)
	}
	if v, err := a.Renew(ctx, a.owner, "v1", time.Hour, nil); err != nil || v.Current || v.Live != 1 {
		t.Fatalf("relay-a on v1 after v2 came: %+v (%v)", v, err)
	}

	// Release some, then all.
	if err := a.ReleaseLanes(ctx, a.owner, 0xff); err != nil {
		t.Fatal(err)
	}
	if v, err := a.Renew(ctx, a.owner, "v2", time.Hour, nil); err != nil || v.Held.Mask != 1<<32-1-0xff {
		t.Fatalf("relay-a holds %064b after releasing 8 lanes (%v)", v.Held.Mask, err)
	}
	if until, err := a.OwnerLive(ctx, a.owner); err != nil || time.Until(until) < 50*time.Minute {
		t.Fatalf("relay-a live until %v (%v)", until, err)
	}
	if err := a.ReleaseAll(ctx, a.owner); err != nil {
		t.Fatal(err)
	}
	if until, err := a.OwnerLive(ctx, a.owner); err != nil || !until.IsZero() {
		t.Fatalf("relay-a live until %v after ReleaseAll (%v)", until, err)
	}
	if acq, over, err := z.AcquireLanes(ctx, z.owner, time.Hour, 0, 63); err != nil || acq.Mask != 1<<32-1 || over != 0 {
		t.Fatalf("relay-z took %064b (over %064b) after relay-a left: %v", acq.Mask, over, err)
	}
}

// A relay whose lease ran out loses its lanes to the next that asks, which
// is told it took them over; a departed relay's heartbeat goes after a
// while.
func TestTakeoverAndDeparted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	dead, next := b.relay(t, "dead"), b.relay(t, "next")
	if _, _, err := dead.takeLanes(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if held, _, err := next.takeLanes(ctx, time.Hour); err != nil || held != 0 {
		t.Fatalf("took %064b from a live relay (%v)", held, err)
	}
	if _, err := b.db.Exec("UPDATE " + b.tables.Lanes() + " SET lease_until = utc_timestamp(6) - INTERVAL 1 SECOND WHERE lane < 10"); err != nil {
		t.Fatal(err)
	}
	held, over, err := next.takeLanes(ctx, time.Hour)
	if err != nil || held != 1<<10-1 || over != 1<<10-1 {
		t.Fatalf("took %064b, over %064b (%v), want lanes 0-9 taken over", held, over, err)
	}
	if _, err := b.db.Exec("UPDATE " + b.tables.Relays() + " SET heartbeat_until = utc_timestamp(6) - INTERVAL 2 MINUTE WHERE owner = 'dead'"); err != nil {
		t.Fatal(err)
	}
	if err := next.RemoveDeparted(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.db.QueryRow("SELECT count(*) FROM " + b.tables.Relays()).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d relays left after removing the departed (%v), want 1", n, err)
	}
	if v, err := next.Renew(ctx, next.owner, "", time.Hour, nil); err != nil || v.Live != 1 || v.Held.Mask != 1<<10-1 {
		t.Fatalf("view after takeover %+v (%v)", v, err)
	}
}
