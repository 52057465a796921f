package relaybench

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"sync"
	"time"

	"github.com/heraldhq/herald/sinks"
)

// Record is one acknowledged delivery: 32 bytes.
type Record struct {
	// Index is the event's index in the run, decoded from its id; -1 for
	// an event that is not the run's.
	Index int64
	// Seq is the outbox row's seq.
	Seq int64
	// Key is the number of the event's key ("k<number>"); -1 without a key.
	Key int64
	// AckNanos is when Publish returned the event's nil result, in
	// nanoseconds since the run's origin.
	AckNanos int64
}

// Recording collects the Records of every Recorder of a run, in the order
// their Publish calls returned. It is safe for concurrent use.
type Recording struct {
	ids    idCodec
	origin time.Time

	mu       sync.Mutex
	records  []Record
	seen     []bool // by index: delivered at least once
	unique   int
	onRecord func(unique int) // called without mu after each append
}

// NewRecording returns a Recording for events whose index is below events,
// with room for that many records before it grows.
func newRecording(ids idCodec, origin time.Time, events int) *Recording {
	return &Recording{ids: ids, origin: origin, records: make([]Record, 0, events), seen: make([]bool, events)}
}

// Recorder is a sinks.Sink decorator recording every event its sink
// acknowledged (a nil result) into a Recording.
type Recorder struct {
	sinks.Sink
	rec *Recording
}

// PublishesConcurrently implements sinks.ConcurrentPublisher by asking the
// wrapped sink (the recording itself is guarded by its mutex).
func (r *Recorder) PublishesConcurrently() bool {
	c, ok := r.Sink.(sinks.ConcurrentPublisher)
	return ok && c.PublishesConcurrently()
}

// Publish implements sinks.Sink: it publishes through the wrapped sink and
// records the acknowledged events, stamped with the time Publish returned.
func (r *Recorder) Publish(ctx context.Context, events []sinks.Event) []error {
	results := r.Sink.Publish(ctx, events)
	ack := time.Since(r.rec.origin).Nanoseconds()
	r.rec.add(events, results, ack)
	return results
}

func (rec *Recording) add(events []sinks.Event, results []error, ack int64) {
	rec.mu.Lock()
	for i := range events {
		if i >= len(results) || results[i] != nil {
			continue
		}
		e := &events[i]
		idx := rec.ids.index(e.ID)
		if idx >= 0 && idx < int64(len(rec.seen)) && !rec.seen[idx] {
			rec.seen[idx] = true
			rec.unique++
		}
		rec.records = append(rec.records, Record{Index: idx, Seq: e.Seq, Key: keyNumber(e.Key), AckNanos: ack})
	}
	unique, notify := rec.unique, rec.onRecord
	rec.mu.Unlock()
	if notify != nil {
		notify(unique)
	}
}

// addArrival records the event of index idx, of key number key, as
// delivered at the nanoseconds at: what a receiver in the bench's process
// saw arrive. The events of a key are committed in index order (the seq's
// order), so the index stands for the seq.
func (rec *Recording) addArrival(idx, key, at int64) {
	rec.mu.Lock()
	if idx >= 0 && idx < int64(len(rec.seen)) && !rec.seen[idx] {
		rec.seen[idx] = true
		rec.unique++
	}
	rec.records = append(rec.records, Record{Index: idx, Seq: idx + 1, Key: key, AckNanos: at})
	unique, notify := rec.unique, rec.onRecord
	rec.mu.Unlock()
	if notify != nil {
		notify(unique)
	}
}

// Unique returns the number of distinct events of the run acknowledged.
func (rec *Recording) Unique() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.unique
}

// since returns a copy of the records from position from on, and the
// position after them.
func (rec *Recording) since(from int) ([]Record, int) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := append([]Record(nil), rec.records[from:]...)
	return out, len(rec.records)
}

// all returns the records (not a copy: call it once delivery stopped).
func (rec *Recording) all() []Record {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.records
}

// bytes is the memory the Recording holds.
func (rec *Recording) bytes() int64 {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return int64(cap(rec.records))*32 + int64(len(rec.seen))
}

func keyNumber(key string) int64 {
	if len(key) < 2 || key[0] != 'k' {
		return -1
	}
	n, err := strconv.ParseInt(key[1:], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

func keyName(n int64) string { return "k" + strconv.FormatInt(n, 10) }

// idCodec makes and reads the run's event ids: 8 bytes of per-run nonce,
// then the event's index, big-endian.
type idCodec struct {
	nonce  [8]byte
	prefix string // the canonical text form of the nonce: "xxxxxxxx-xxxx-xxxx-"
}

func newIDCodec(nonce [8]byte) idCodec {
	h := hex.EncodeToString(nonce[:])
	return idCodec{nonce: nonce, prefix: h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-"}
}

// nonceHex is the nonce as 16 hex digits, for SQL.
func (c idCodec) nonceHex() string { return hex.EncodeToString(c.nonce[:]) }

// id returns the id of the event at index.
func (c idCodec) id(index int64) [16]byte {
	var b [16]byte
	copy(b[:8], c.nonce[:])
	binary.BigEndian.PutUint64(b[8:], uint64(index))
	return b
}

// index decodes an id in canonical text form, or returns -1 when it is not
// one of the run's.
func (c idCodec) index(id string) int64 {
	if len(id) != 36 || id[:19] != c.prefix || id[23] != '-' {
		return -1
	}
	var n uint64
	for i := 19; i < 36; i++ {
		if i == 23 {
			continue
		}
		d := unhex(id[i])
		if d < 0 {
			return -1
		}
		n = n<<4 | uint64(d)
	}
	if n > 1<<62 {
		return -1
	}
	return int64(n)
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
