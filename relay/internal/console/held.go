package console

import (
	"net/http"
	"slices"
	"strings"

	"github.com/heraldhq/herald/relay/deadletter"
)

// heldLimit bounds the keys the held-keys page lists.
const heldLimit = 200

// keyQueue is a key's queue on one sink, head first.
type keyQueue struct {
	Sink       string
	Deliveries []deadletter.KeyDelivery
	// More says the queue is longer than the page shows.
	More bool
}

// keyQueues reads a key's queues, sorted by sink.
func (c *Console) keyQueues(r *http.Request, key string) ([]keyQueue, error) {
	byName, err := c.deps.DeadLetters.KeyQueues(r.Context(), key, keyQueueLimit+1)
	if err != nil {
		return nil, err
	}
	out := make([]keyQueue, 0, len(byName))
	for sink, ds := range byName {
		q := keyQueue{Sink: sink, Deliveries: ds}
		if len(ds) > keyQueueLimit {
			q.Deliveries, q.More = ds[:keyQueueLimit], true
		}
		out = append(out, q)
	}
	slices.SortFunc(out, func(a, b keyQueue) int { return strings.Compare(a.Sink, b.Sink) })
	return out, nil
}

// heldData is the held-keys page's.
type heldData struct {
	Keys []deadletter.HeldKey
	// More says there are more held keys than the page lists.
	More bool
}

func (c *Console) held(w http.ResponseWriter, r *http.Request) {
	keys, err := c.deps.DeadLetters.HeldKeys(r.Context(), heldLimit+1)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, "reading the held keys", err)
		return
	}
	data := heldData{Keys: keys}
	if len(keys) > heldLimit {
		data.Keys, data.More = keys[:heldLimit], true
	}
	c.render(w, r, http.StatusOK, "held", "Held keys", data)
}
