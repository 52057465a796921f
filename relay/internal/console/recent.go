package console

import (
	"sync"
	"time"

	"github.com/google/uuid"
)

// recentLimit bounds the events the console remembers replaying or
// purging by id.
const recentLimit = 10000

// recentOp is what the console last did to an event's dead letters.
type recentOp struct {
	// Op is "replay" or "purge".
	Op string
	At time.Time
}

// recentOps remembers the events whose dead letters this console replayed
// or purged by id, so that the event page can say what became of an event
// whose row is gone (delivered, and deleted with retention off) rather
// than "not found". In memory and bounded: the oldest are forgotten first,
// and a restart forgets them all.
type recentOps struct {
	mu    sync.Mutex
	byID  map[uuid.UUID]recentOp
	order []uuid.UUID // oldest first, each id once
}

func newRecentOps() *recentOps { return &recentOps{byID: map[uuid.UUID]recentOp{}} }

// add records op on ids (ids that are not UUIDs are ignored: they
// matched nothing).
func (r *recentOps) add(op string, at time.Time, ids []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range ids {
		id, err := uuid.Parse(s)
		if err != nil {
			continue
		}
		if _, seen := r.byID[id]; seen {
			r.order = deleteID(r.order, id)
		}
		r.byID[id] = recentOp{Op: op, At: at}
		r.order = append(r.order, id)
		for len(r.order) > recentLimit {
			delete(r.byID, r.order[0])
			r.order = r.order[1:]
		}
	}
}

// get returns what was last done to id, if remembered.
func (r *recentOps) get(s string) (recentOp, bool) {
	id, err := uuid.Parse(s)
	if err != nil {
		return recentOp{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	op, ok := r.byID[id]
	return op, ok
}

func deleteID(ids []uuid.UUID, id uuid.UUID) []uuid.UUID {
	for i, x := range ids {
		if x == id {
			return append(ids[:i], ids[i+1:]...)
		}
	}
	return ids
}
