package relaybench

import (
	"errors"
	"fmt"
)

// Verification is what Verify found.
type Verification struct {
	// Events is the number of events committed.
	Events int `json:"events"`
	// Delivered is the number of committed events acknowledged at least once.
	Delivered int `json:"delivered"`
	// Lost is Events minus Delivered.
	Lost int `json:"lost"`
	// Duplicates counts acknowledgements beyond the first of an event.
	Duplicates int `json:"duplicates"`
	// Unexpected counts acknowledged events that were never committed by
	// the run (a foreign id, or an index not committed).
	Unexpected int `json:"unexpected"`
	// OrderViolations counts first deliveries of a key whose seq is below
	// the seq of an earlier first delivery of the same key.
	OrderViolations int `json:"order_violations"`
	// KeyOrderIntact is OrderViolations == 0.
	KeyOrderIntact bool `json:"key_order_intact"`
	// Problems describes the first few failures (at most 10).
	Problems []string `json:"problems,omitempty"`
}

const maxProblems = 10

// Verify checks records, in delivery order, against the committed events:
// committed[i] tells whether the event of index i was committed. Every
// committed event must be delivered at least once; keeping only the first
// delivery of each event, the events of each key must arrive in ascending
// seq order.
func Verify(records []Record, committed []bool) Verification {
	v, _ := verify(records, committed)
	return v
}

// verifyEach verifies each sink's records (recordings[i] is those of the
// sink called names[i]) and the run as a whole: an event is delivered when
// every sink acknowledged it, lost otherwise; duplicates, order violations
// and unexpected events are summed over the sinks, and the problems are the
// sinks' own, prefixed with their name.
func verifyEach(names []string, recordings [][]Record, committed []bool) (Verification, []Verification) {
	each := make([]Verification, len(recordings))
	everywhere := make([]int, len(committed)) // sinks that acknowledged each event
	for i, records := range recordings {
		var seen []bool
		each[i], seen = verify(records, committed)
		for idx, ok := range seen {
			if ok {
				everywhere[idx]++
			}
		}
	}
	v := Verification{}
	for idx, c := range committed {
		if !c {
			continue
		}
		v.Events++
		if everywhere[idx] == len(recordings) {
			v.Delivered++
		}
	}
	v.Lost = v.Events - v.Delivered
	for i, e := range each {
		v.Duplicates += e.Duplicates
		v.Unexpected += e.Unexpected
		v.OrderViolations += e.OrderViolations
		for _, p := range e.Problems {
			if len(v.Problems) < maxProblems {
				v.Problems = append(v.Problems, fmt.Sprintf("sink %s: %s", names[i], p))
			}
		}
	}
	v.KeyOrderIntact = v.OrderViolations == 0
	return v, each
}

// verify is Verify, also returning which events were delivered.
func verify(records []Record, committed []bool) (Verification, []bool) {
	v := Verification{}
	for _, c := range committed {
		if c {
			v.Events++
		}
	}
	problem := func(format string, args ...any) {
		if len(v.Problems) < maxProblems {
			v.Problems = append(v.Problems, fmt.Sprintf(format, args...))
		}
	}
	seen := make([]bool, len(committed))
	lastSeq := map[int64]int64{}
	for pos, r := range records {
		if r.Index < 0 || r.Index >= int64(len(committed)) || !committed[r.Index] {
			v.Unexpected++
			problem("record %d: event index %d (seq %d) was not committed by this run", pos, r.Index, r.Seq)
			continue
		}
		if seen[r.Index] {
			v.Duplicates++
			continue
		}
		seen[r.Index] = true
		v.Delivered++
		if r.Key < 0 {
			continue
		}
		if last, ok := lastSeq[r.Key]; ok && r.Seq < last {
			v.OrderViolations++
			problem("key %s: seq %d (event %d) delivered after seq %d", keyName(r.Key), r.Seq, r.Index, last)
			continue
		}
		lastSeq[r.Key] = r.Seq
	}
	v.Lost = v.Events - v.Delivered
	if v.Lost > 0 {
		missing := 0
		for i, c := range committed {
			if c && !seen[i] {
				problem("event %d was committed and never acknowledged", i)
				missing++
				if missing == 3 {
					break
				}
			}
		}
	}
	v.KeyOrderIntact = v.OrderViolations == 0
	return v, seen
}

// OK reports whether nothing was lost, out of order or unexpected.
func (v Verification) OK() bool {
	return v.Lost == 0 && v.OrderViolations == 0 && v.Unexpected == 0
}

// Err returns nil when OK, otherwise an error saying what failed.
func (v Verification) Err() error {
	if v.OK() {
		return nil
	}
	msg := fmt.Sprintf("verification failed: %d of %d events lost, %d out of key order, %d unexpected",
		v.Lost, v.Events, v.OrderViolations, v.Unexpected)
	for _, p := range v.Problems {
		msg += "\n  " + p
	}
	return errors.New(msg)
}

// String is the summary line, e.g. "verified: 2000 events, 0 lost,
// 0 duplicates, key order intact".
func (v Verification) String() string {
	if !v.OK() {
		return fmt.Sprintf("NOT verified: %d events, %d lost, %d duplicates, %d out of key order, %d unexpected",
			v.Events, v.Lost, v.Duplicates, v.OrderViolations, v.Unexpected)
	}
	return fmt.Sprintf("verified: %d events, 0 lost, %d duplicates, key order intact", v.Events, v.Duplicates)
}
