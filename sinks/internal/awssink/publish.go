package awssink

import (
	"context"
	"errors"
	"fmt"
	"strconv"

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

// Publish sends events as batch requests through send and returns one
// result per event, at the event's index.
//
// Events are grouped by destination, in slice order, into requests of at
// most MaxBatch entries and MaxMessageSize bytes; requests are sent one
// after the other, so events of one key reach their destination in order.
// An event that cannot be encoded, or that a request refused, makes the
// later events of its key in the call not sent (sinks.ErrSkipped); the
// events of its key in the same request were sent and are reported as the
// service answered. A request refused as a whole as permanent is sent
// again one message per request, so that only the refused events fail.
// A request failing as Unavailable (no such queue,
// credentials refused, endpoint down) stops the call: the events not sent
// yet get the same error.
func Publish(ctx context.Context, events []sinks.Event, send SendFunc) []error {
	errs := make([]error, len(events))
	fail := func(i int, err error) {
		errs[i] = fmt.Errorf("publishing event %s to %q: %w", events[i].ID, events[i].Destination, err)
	}
	// failedAt holds, per key, the index of its first failed event: the
	// later events of the key are not sent.
	failedAt := map[string]int{}
	markFailed := func(i int) {
		if k := events[i].Key; k != "" {
			if at, ok := failedAt[k]; !ok || i < at {
				failedAt[k] = i
			}
		}
	}
	skipped := func(i int) bool {
		at, ok := failedAt[events[i].Key]
		return events[i].Key != "" && ok && at < i
	}

	type request struct {
		destination string
		entries     []Entry
		size        int
	}
	var requests []*request
	open := map[string]*request{}
	for i, e := range events {
		if skipped(i) {
			fail(i, sinks.ErrSkipped)
			continue
		}
		if e.Destination == "" {
			fail(i, sinks.Permanent(fmt.Errorf("event %s: destination is empty", e.ID)))
			markFailed(i)
			continue
		}
		m, err := Encode(e)
		if err != nil {
			fail(i, err)
			markFailed(i)
			continue
		}
		r := open[e.Destination]
		if r == nil || len(r.entries) == MaxBatch || r.size+m.Size > MaxMessageSize {
			r = &request{destination: e.Destination}
			open[e.Destination] = r
			requests = append(requests, r)
		}
		r.entries = append(r.entries, Entry{Index: i, Event: e, Message: m})
		r.size += m.Size
	}

	var stop error // set once a request failed as Unavailable, or ctx ended
	var run func(destination string, entries []Entry)
	run = func(destination string, all []Entry) {
		entries := all[:0:0]
		for _, en := range all {
			switch {
			case stop != nil:
				fail(en.Index, stop)
			case skipped(en.Index):
				fail(en.Index, sinks.ErrSkipped)
			default:
				entries = append(entries, en)
			}
		}
		if len(entries) == 0 {
			return
		}
		if err := ctx.Err(); err != nil {
			stop = err
			for _, en := range entries {
				fail(en.Index, err)
			}
			return
		}
		results, err := send(ctx, destination, entries)
		if err == nil && len(results) != len(entries) {
			err = fmt.Errorf("the service answered %d results for %d entries", len(results), len(entries))
		}
		if err != nil {
			err = Classify(err)
			if sinks.IsPermanent(err) && len(entries) > 1 {
				// A refusal of the whole request (a message over the
				// queue's maximum size, invalid contents) does not say
				// which message it was about, and nothing was sent: each
				// is sent alone, so that only the refused one fails.
				for _, en := range entries {
					run(destination, []Entry{en})
				}
				return
			}
			if sinks.IsUnavailable(err) {
				stop = err
			}
			for _, en := range entries {
				fail(en.Index, err)
				markFailed(en.Index)
			}
			return
		}
		for j, en := range entries {
			if results[j] != nil {
				fail(en.Index, results[j])
				markFailed(en.Index)
			}
		}
	}
	for _, r := range requests {
		run(r.destination, r.entries)
	}
	return errs
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
