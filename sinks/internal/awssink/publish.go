package awssink

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/heraldhq/herald/sinks"
)

// MaxBatch is the most entries one SendMessageBatch or PublishBatch
// request carries.
const MaxBatch = 10

// Entry is one message of a batch request.
type Entry struct {
	// Index is the event's index in the Publish call.
	Index   int
	Event   sinks.Event
	Message Message
}

// SendFunc sends one batch request of at most MaxBatch entries and
// MaxMessageSize bytes, all to destination, and returns one result per
// entry (nil when the service accepted it, else an error marked with
// EntryError), or the error of the whole request.
type SendFunc func(ctx context.Context, destination string, entries []Entry) ([]error, error)

// Publish sends events as batch requests through send, at most inFlight
// at a time, and returns one result per event, at the event's index.
//
// Events are grouped by destination, in slice order, into requests of at
// most MaxBatch entries and MaxMessageSize bytes. A request waits for
// every earlier request holding an event of one of its keys, so events of
// one key reach their destination in order; requests with no key in
// common run in parallel. An event that cannot be encoded, or that a
// request refused, makes the later events of its key in the call not sent
// (sinks.ErrSkipped); the events of its key in the same request were sent
// and are reported as the service answered. A request refused as a whole
// as permanent is sent again one message per request, so that only the
// refused events fail. A request failing as Unavailable (no such queue,
// credentials refused, endpoint down) stops the call: the events not sent
// yet get the same error.
func Publish(ctx context.Context, events []sinks.Event, send SendFunc, inFlight int) []error {
	p := &publication{events: events, errs: make([]error, len(events)), failedAt: map[string]int{}}
	type request struct {
		destination string
		entries     []Entry
		size        int
		seq         int             // its place in requests
		after       []chan struct{} // done channels of the requests it waits for
		done        chan struct{}
	}
	var requests []*request
	open := map[string]*request{}
	lastOfKey := map[string]*request{}
	for i, e := range events {
		if p.skipped(i) {
			p.fail(i, sinks.ErrSkipped)
			continue
		}
		if e.Destination == "" {
			p.fail(i, sinks.Permanent(fmt.Errorf("event %s: destination is empty", e.ID)))
			p.markFailed(i)
			continue
		}
		m, err := Encode(e)
		if err != nil {
			p.fail(i, err)
			p.markFailed(i)
			continue
		}
		r := open[e.Destination]
		prev := lastOfKey[e.Key]
		// A request opened after this destination's open one holds an
		// earlier event of the key: this one goes in a new request after
		// it (waiting the other way round could deadlock).
		if r == nil || len(r.entries) == MaxBatch || r.size+m.Size > MaxMessageSize || (prev != nil && prev.seq > r.seq) {
			r = &request{destination: e.Destination, seq: len(requests), done: make(chan struct{})}
			open[e.Destination] = r
			requests = append(requests, r)
		}
		if e.Key != "" && prev != nil && prev != r {
			r.after = append(r.after, prev.done)
		}
		if e.Key != "" {
			lastOfKey[e.Key] = r
		}
		r.entries = append(r.entries, Entry{Index: i, Event: e, Message: m})
		r.size += m.Size
	}

	slots := make(chan struct{}, max(inFlight, 1))
	var wg sync.WaitGroup
	for _, r := range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(r.done)
			for _, ch := range r.after {
				<-ch
			}
			slots <- struct{}{}
			defer func() { <-slots }()
			p.run(ctx, send, r.destination, r.entries)
		}()
	}
	wg.Wait()
	return p.errs
}

// publication is the state of one Publish call shared by its requests.
type publication struct {
	events []sinks.Event

	mu   sync.Mutex // guards what follows
	errs []error
	// failedAt holds, per key, the index of its first failed event: the
	// later events of the key are not sent.
	failedAt map[string]int
	stop     error // set once a request failed as Unavailable, or ctx ended
}

// fail and markFailed are called with mu held, or before requests start.
func (p *publication) fail(i int, err error) {
	p.errs[i] = fmt.Errorf("publishing event %s to %q: %w", p.events[i].ID, p.events[i].Destination, err)
}

func (p *publication) markFailed(i int) {
	if k := p.events[i].Key; k != "" {
		if at, ok := p.failedAt[k]; !ok || i < at {
			p.failedAt[k] = i
		}
	}
}

func (p *publication) skipped(i int) bool {
	at, ok := p.failedAt[p.events[i].Key]
	return p.events[i].Key != "" && ok && at < i
}

// run sends one request of all, less the events that are not to be sent
// any more, and records the results.
func (p *publication) run(ctx context.Context, send SendFunc, destination string, all []Entry) {
	p.mu.Lock()
	entries := all[:0:0]
	for _, en := range all {
		switch {
		case p.stop != nil:
			p.fail(en.Index, p.stop)
		case p.skipped(en.Index):
			p.fail(en.Index, sinks.ErrSkipped)
		default:
			entries = append(entries, en)
		}
	}
	if len(entries) > 0 && ctx.Err() != nil {
		p.stop = ctx.Err()
		for _, en := range entries {
			p.fail(en.Index, p.stop)
		}
		entries = nil
	}
	p.mu.Unlock()
	if len(entries) == 0 {
		return
	}

	results, err := send(ctx, destination, entries)
	if err == nil && len(results) != len(entries) {
		err = fmt.Errorf("the service answered %d results for %d entries", len(results), len(entries))
	}
	if err != nil {
		err = Classify(err)
		if sinks.IsPermanent(err) && len(entries) > 1 {
			// A refusal of the whole request (a message over the queue's
			// maximum size, invalid contents) does not say which message
			// it was about, and nothing was sent: each is sent alone, so
			// that only the refused one fails.
			for _, en := range entries {
				p.run(ctx, send, destination, []Entry{en})
			}
			return
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if sinks.IsUnavailable(err) && p.stop == nil {
			p.stop = err
		}
		for _, en := range entries {
			p.fail(en.Index, err)
			p.markFailed(en.Index)
		}
		return
	}
	for j, en := range entries {
		if results[j] != nil {
			p.fail(en.Index, results[j])
			p.markFailed(en.Index)
		}
	}
}

// EntryID is the id of the j-th entry of a batch request; Results maps the
// answer back by it.
func EntryID(j int) string { return strconv.Itoa(j) }

// GroupID is the FIFO message group of e: its key, so that the service
// keeps each key's order, or its id when it has none, so that keyless
// events, which have no order in Herald, do not wait for each other.
func GroupID(e sinks.Event) string {
	if e.Key != "" {
		return e.Key
	}
	return e.ID
}

// Failure is one entry a batch request refused.
type Failure struct {
	ID, Code, Message string
	SenderFault       bool
}

// Results maps the answer to a batch request of n entries (the ids of the
// accepted ones and the refusals) to one result per entry; an entry the
// answer does not mention failed, retryably.
func Results(n int, accepted []string, failed []Failure) []error {
	results := make([]error, n)
	answered := make([]bool, n)
	index := func(id string) int {
		j, err := strconv.Atoi(id)
		if err != nil || j < 0 || j >= n {
			return -1
		}
		return j
	}
	for _, id := range accepted {
		if j := index(id); j >= 0 {
			answered[j] = true
		}
	}
	for _, f := range failed {
		if j := index(f.ID); j >= 0 {
			answered[j] = true
			results[j] = EntryError(f.Code, f.Message, f.SenderFault)
		}
	}
	for j := range results {
		if !answered[j] {
			results[j] = errors.New("the batch answer holds no result for the message")
		}
	}
	return results
}
