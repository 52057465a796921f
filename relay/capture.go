package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/heraldhq/herald/relay/internal/store"
)

// Capture says where a relay finds new events.
type Capture string

const (
	// CaptureTable claims the rows applications insert into the outbox
	// table. The default.
	CaptureTable Capture = "table"
	// CaptureWAL reads, besides the table's rows, the events applications
	// emit into PostgreSQL's write-ahead log (outbox_emit), from a logical
	// replication slot: no table row is written for an event delivered at
	// its first attempt. One relay reads the slot at a time, holding every
	// lane; the others stand by and take over when its lease lapses.
	CaptureWAL Capture = "wal"
)

// capture is a worker's reading of the database's log (CaptureWAL). It runs
// a reader while the worker holds every lane (and none is quarantined):
// only then may the worker deliver any event, in commit order, without
// another relay sending events of the same keys. A reader that stops (its
// connection failed, or a batch of its events could not be recorded) is
// started again, after a pause, as a new reader that resumes from the
// position the last one confirmed: the events after it come again, and
// are delivered at least once.
type capture struct {
	open func() store.Capture
	log  *slog.Logger
	wake func()

	reader store.Capture // nil while not reading
	cancel context.CancelFunc
	done   chan struct{}
	err    error // why the reader stopped; read once done is closed
	// pause is how long to wait before starting the next reader after a
	// failure, doubling to a minute while they keep failing; startAt is
	// when the next may start.
	pause   time.Duration
	startAt time.Time
}

func newCapture(open func() store.Capture, log *slog.Logger, wake func()) *capture {
	return &capture{open: open, log: log, wake: wake}
}

// arrived is signalled when the reader has events to take (nil while none
// runs: it never fires).
func (c *capture) arrived() <-chan struct{} {
	if c.reader == nil {
		return nil
	}
	return c.reader.Arrived()
}

// take returns at most max events read from the log, starting or stopping
// the reader first: it reads only while all is true (the worker holds every
// lane and may claim in all of them).
func (c *capture) take(ctx context.Context, all bool, max int) []store.LogEvent {
	if c.reader != nil {
		select {
		case <-c.done:
			c.stopped(c.err)
		default:
		}
	}
	switch {
	case !all && c.reader != nil:
		c.log.Info("relay: stopped reading the WAL: this relay no longer holds every lane")
		c.stop()
		return nil
	case !all:
		return nil
	case c.reader == nil:
		if time.Now().Before(c.startAt) {
			return nil
		}
		c.start(ctx)
		return nil // the reader has read nothing yet
	}
	return c.reader.Take(max)
}

func (c *capture) start(ctx context.Context) {
	runCtx, cancel := context.WithCancel(ctx)
	c.reader, c.cancel, c.done, c.err = c.open(), cancel, make(chan struct{}), nil
	reader, done := c.reader, c.done
	go func() {
		defer close(done)
		err := reader.Run(runCtx)
		if err == nil && runCtx.Err() == nil {
			err = errors.New("the reader stopped")
		}
		c.err = err // read by the worker only once done is closed
		c.wake()
	}()
}

// stopped forgets a reader that ended with err, and sets when the next
// may start.
func (c *capture) stopped(err error) {
	c.cancel()
	c.reader = nil
	if err == nil { // cancelled by its context: the relay is stopping
		return
	}
	c.pause = min(max(2*c.pause, 100*time.Millisecond), time.Minute)
	c.startAt = time.Now().Add(c.pause)
	c.log.Warn("relay: reading the WAL failed; reading again from the slot's confirmed position", "error", err, "retry_in", c.pause)
}

// stop ends the reader and waits for it: it confirms what was settled, and
// the next reader starts there.
func (c *capture) stop() {
	if c.reader == nil {
		return
	}
	c.cancel()
	<-c.done
	c.reader = nil
}

// settle reports a Take's events recorded (ok) or not. Events not recorded
// (their record failed or was fenced out) are read again: the reader
// stops, and the next one resumes from the position confirmed before them.
func (c *capture) settle(events []store.LogEvent, ok bool) {
	if len(events) == 0 || c.reader == nil {
		return
	}
	if !ok {
		c.log.Warn("relay: a batch of events read from the WAL was not recorded; reading them again", "events", len(events))
		c.stop()
		c.startAt = time.Now()
		return
	}
	c.pause = 0
	c.reader.Settled()
}

// lag is how long the oldest event read and not settled has waited since
// its commit (0 when none), measured on this host's clock.
func (c *capture) lag(now time.Time) time.Duration {
	if c.reader == nil {
		return 0
	}
	oldest, _ := c.reader.Lag()
	if oldest.IsZero() {
		return 0
	}
	return max(now.Sub(oldest), 0)
}

// readLog makes the relay read the database's log with readers open
// returns (CaptureWAL): its one worker reads while it holds every lane, and
// the first live relay holds them all.
func (r *Relay) readLog(open func() store.Capture) {
	for _, w := range r.workers {
		w.store.whole = true
		w.capture = newCapture(open, w.log, w.wakeUp)
	}
}

// prepareLog creates the log's stream position (the replication slot)
// unless it exists, at start: events written to the log before it exists
// are not in it, so it must exist before applications write any.
func (r *Relay) prepareLog(ctx context.Context) error {
	if r.cfg.Capture != CaptureWAL {
		return nil
	}
	if err := r.checkSlot(ctx, true); err != nil {
		return err
	}
	for _, w := range r.workers {
		if w.capture != nil {
			if err := w.capture.open().Prepare(ctx); err != nil {
				return fmt.Errorf("database.capture: %w", err)
			}
		}
	}
	return nil
}

// checkSlot reads the slot's state and reports it (the metrics, and the
// log past half of database.max_slot_retained_bytes). Past the bound, at
// start (starting), it refuses to read the slot: the operator raises the
// bound or drops the slot, knowing that its unread events go with it.
// A running relay goes on reading, which is what shrinks it.
func (r *Relay) checkSlot(ctx context.Context, starting bool) error {
	slot, err := r.store.ReadSlot(ctx, r.cfg.Slot)
	if errors.Is(err, store.ErrNoSlot) {
		return nil // made at start
	}
	if err != nil {
		return err
	}
	limit := r.cfg.MaxSlotRetainedBytes
	switch {
	case slot.WALStatus == "lost":
		return fmt.Errorf("replication slot %s lost the WAL it kept (the server's max_slot_wal_keep_size): its events are gone; drop it with 'relay slot drop' to start a new one", r.cfg.Slot)
	case limit > 0 && slot.RetainedBytes > limit && starting:
		return fmt.Errorf("database.max_slot_retained_bytes: replication slot %s keeps %d bytes of WAL, more than %d: raise the bound to read it, or drop it ('relay slot drop', losing the events no relay read)",
			r.cfg.Slot, slot.RetainedBytes, limit)
	case limit > 0 && slot.RetainedBytes > limit:
		r.log.Error("relay: the replication slot keeps more WAL than database.max_slot_retained_bytes; reading on to shrink it",
			"slot", r.cfg.Slot, "retained_bytes", slot.RetainedBytes, "limit", limit)
	case limit > 0 && slot.RetainedBytes > limit/2:
		r.log.Warn("relay: the replication slot keeps more than half of database.max_slot_retained_bytes of WAL",
			"slot", r.cfg.Slot, "retained_bytes", slot.RetainedBytes, "limit", limit)
	}
	var behind time.Duration
	for _, w := range r.workers {
		if w.capture != nil {
			behind = max(behind, w.capture.lag(time.Now()))
		}
	}
	r.cfg.Observer.CaptureLag(behind, slot.RetainedBytes, slot.BehindBytes)
	return nil
}

// logItems turns events read from the log into items, each joining the
// queues its key has (queues, from the store).
func logItems(events []store.LogEvent, queues map[string][]string, limit claimLimits) []item {
	rows := make([]store.Claimed, len(events))
	for i := range events {
		rows[i] = store.Claimed{Event: events[i].Event, Queued: queues[events[i].Key]}
	}
	out := items(rows, limit)
	for i := range out {
		out[i].logged = &events[i].Event
	}
	return out
}

// keysOf lists the distinct keys of events.
func keysOf(events []store.LogEvent) []string {
	seen := make(map[string]bool, len(events))
	var keys []string
	for i := range events {
		if k := events[i].Key; k != "" && !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	return keys
}

// errCaptureNeedsPostgres is CaptureWAL on a database that has no
// write-ahead log to read.
var errCaptureNeedsPostgres = fmt.Errorf("capture %q needs PostgreSQL (MySQL's binary log is not read)", CaptureWAL)

// wakeUp wakes the worker if it waits for work.
func (w *worker) wakeUp() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
