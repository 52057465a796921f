package deadletter_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/heraldhq/herald/relay/deadletter"
)

// TestDropQueue: an operator's drop removes every delivery of one sink,
// waiting, due and dead, batch by batch, and no other sink's; each batch
// leaves the queues it cut into with a head, so the invariant holds after
// every one (a drop stopped half way leaves whole queues).
func TestDropQueue(t *testing.T) {
	t.Parallel()
	forEachDB(t, func(t *testing.T, tb *testBundle) {
		ctx := context.Background()
		deadletter.SetBatchSize(tb.store, 3)
		for k := range 3 {
			key := fmt.Sprintf("k%d", k)
			for i := range 4 {
				e := tb.newEvent(t, "orders", key)
				state := "waiting"
				if i == 0 {
					state = "ready"
				}
				tb.put(t, e, delivery{sink: "gone", state: state}, delivery{sink: "kept", state: state})
			}
		}
		tb.dead(t, "orders", "", "gone")
		if n, err := tb.store.QueueSize(ctx, "gone"); err != nil || n != 13 {
			t.Fatalf("QueueSize(gone) = %d, %v; want 13", n, err)
		}
		var seen []int64
		res, err := tb.store.DropQueue(ctx, "gone", deadletter.DropOpts{Progress: func(done int64) {
			seen = append(seen, done)
			tb.checkHeads(t)
		}})
		if err != nil || res.Count != 13 {
			t.Fatalf("DropQueue = %+v, %v; want 13 dropped", res, err)
		}
		if len(seen) != 5 {
			t.Fatalf("progress %v, want five batches of at most 3", seen)
		}
		if n := tb.count(t, tb.deliveries(), "sink = 'gone'"); n != 0 {
			t.Fatalf("%d deliveries of the dropped sink left", n)
		}
		if n := tb.count(t, tb.deliveries(), "sink = 'kept'"); n != 12 {
			t.Fatalf("%d deliveries of the other sink left, want its 12", n)
		}
		var input *deadletter.InputError
		if _, err := tb.store.DropQueue(ctx, "", deadletter.DropOpts{}); !errors.As(err, &input) || input.Field != "sink" {
			t.Fatalf("DropQueue of the routing step: %v, want an input error naming sink", err)
		}
	})
}
