package relay

import (
	"context"
	"fmt"
	"math/bits"
	"testing"
	"time"
)

// Relays that join one after another end up with a block of neighbouring
// lanes each, so that each claim's lane range covers few lanes of others.
func TestLanesStayInBlocks(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		const lease = 30 * time.Second
		var stores []*session
		masks := map[string]uint64{}
		for i := range 4 {
			stores = append(stores, b.session(t, fmt.Sprintf("relay-%d", i)))
			if err := stores[i].heartbeat(ctx, lease); err != nil {
				t.Fatal(err)
			}
			// A few rounds: those over their share release, then the others
			// take what was released.
			for range 3 {
				for _, s := range stores {
					v, err := s.refreshLanes(ctx, lease, nil, 0)
					if err != nil {
						t.Fatal(err)
					}
					masks[s.owner] = v.held.Mask
				}
			}
		}
		var union uint64
		for owner, m := range masks {
			if n := bits.OnesCount64(m); n != 16 {
				t.Errorf("%s holds %d lanes, want 16 (%064b)", owner, n, m)
			}
			lowest, highest := bits.TrailingZeros64(m), 63-bits.LeadingZeros64(m)
			if span := highest - lowest + 1; span != 16 {
				t.Errorf("%s holds lanes %d..%d with gaps (%064b)", owner, lowest, highest, m)
			}
			if union&m != 0 {
				t.Errorf("%s shares lanes with another relay", owner)
			}
			union |= m
		}
		if union != ^uint64(0) {
			t.Errorf("lanes not held: %064b", ^union)
		}
	})
}

// rowLimit is a claim's limits at the defaults, with n rows.
func rowLimit(n int) claimLimits {
	cfg := Config{}.WithDefaults()
	return claimLimits{rows: n, bytes: cfg.MaxBatchBytes, eventBytes: cfg.MaxEventBytes}
}

// routingQueue is a queue claim of the routing step's queue alone, n heads
// and rows.
func routingQueue(n int32) *queueClaim {
	q := &queueClaim{}
	q.add("", n, n, n)
	return q
}
