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

// request is one batch request of a Publish call.
type request struct {
	destination string
	entries     []Entry
	size        int
	seq         int             // its place in the call's requests
	after       []chan struct{} // done channels of the requests it waits for
	done        chan struct{}
}

// publish sends the events of res as batch requests through send, at most
// as many at a time as limit allows over all calls, records each event's
// result as its request is answered, and returns res.Errors.
//
// Events are grouped by destination, in slice order, into requests of at
// most MaxBatch entries and MaxMessageSize bytes. A request waits for
// every earlier request holding an event of one of its keys, so events of
// one key reach their destination in order; requests with no key in
// common run in parallel. Before a request goes, its events that
// res.Blocked holds back are dropped from it: an event that could not be
// encoded, or that a request refused, makes the later events of its key
// not sent (sinks.ErrSkipped), and a request failing as Unavailable (no
// such queue, credentials refused, endpoint down) stops the call; the
// events of a key in one request were all sent and are reported as the
// service answered. A request refused as a whole as permanent is sent
// again one message per request, so that only the refused events fail.
func publish(ctx context.Context, res *sinks.Results, events []sinks.Event, send SendFunc, limit *sinks.Limiter) []error {
	var requests []*request
	open := map[string]*request{}
	lastOfKey := map[string]*request{}
	for i, e := range events {
		if res.Blocked(i) {
			continue
		}
		if e.Destination == "" {
			res.Fail(i, sinks.Permanent(errors.New("destination is empty")))
			continue
		}
		m, err := Encode(e)
		if err != nil {
			res.Fail(i, err)
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

	var wg sync.WaitGroup
	for _, r := range requests {
		wg.Go(func() {
			defer close(r.done)
			for _, ch := range r.after {
				<-ch
			}
			if err := limit.Acquire(ctx); err != nil {
				sendable(res, r.entries) // the call ended: Blocked records it
				return
			}
			defer limit.Release()
			run(ctx, res, send, r.destination, r.entries)
		})
	}
	wg.Wait()
	return res.Errors()
}

// sendable returns the entries res does not hold back (see
// sinks.Results.Blocked).
func sendable(res *sinks.Results, entries []Entry) []Entry {
	kept := entries[:0:0]
	for _, en := range entries {
		if !res.Blocked(en.Index) {
			kept = append(kept, en)
		}
	}
	return kept
}

// run sends one request, less the events res holds back, and records the
// results.
func run(ctx context.Context, res *sinks.Results, send SendFunc, destination string, entries []Entry) {
	entries = sendable(res, entries)
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
				run(ctx, res, send, destination, []Entry{en})
			}
			return
		}
		for _, en := range entries {
			res.Fail(en.Index, err)
		}
		return
	}
	for j, en := range entries {
		if results[j] != nil {
			res.Fail(en.Index, results[j])
		} else {
			res.Delivered(en.Index)
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

// Answer is a batch request's answer: the ids of the entries accepted and
// the refusals.
type Answer struct {
	Accepted []string
	Failed   []Failure
}

// Results maps the answer to a request of n entries to one result per
// entry; an entry the answer does not mention failed, retryably.
func (a Answer) Results(n int) []error {
	results := make([]error, n)
	answered := make([]bool, n)
	index := func(id string) int {
		j, err := strconv.Atoi(id)
		if err != nil || j < 0 || j >= n {
			return -1
		}
		return j
	}
	for _, id := range a.Accepted {
		if j := index(id); j >= 0 {
			answered[j] = true
		}
	}
	for _, f := range a.Failed {
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

// Attributes returns m's attributes as a service's request takes them,
// each value made by value.
func Attributes[V any](m Message, value func(string) V) map[string]V {
	attrs := make(map[string]V, len(m.Attributes))
	for k, v := range m.Attributes {
		attrs[k] = value(v)
	}
	return attrs
}
