// Package walcapture reads the events an outbox emitted into PostgreSQL's
// write-ahead log (outbox_emit: transactional logical decoding messages)
// from a logical replication slot, with the pgoutput plugin. It hands the
// engine each committed transaction's events in commit order and confirms
// to the server, and so lets it recycle the WAL, only the positions the
// engine says are settled: delivered, dead-lettered or durably queued.
package walcapture

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/heraldhq/herald/relay/internal/store"
)

// Config says which slot to read and how.
type Config struct {
	// Conn is the server's connection settings; the reader connects with
	// replication=database.
	Conn *pgconn.Config
	// Slot is the replication slot, created at the first start (it then
	// keeps the WAL from that point until the reader confirms it).
	Slot string
	// Publication is the publication pgoutput is started with, and
	// Prefix the prefix of the outbox's messages.
	Publication, Prefix string
	// Buffer bounds the events read and not yet taken: past it, the reader
	// stops reading (the server waits) until the engine takes some.
	Buffer int
	// StatusEvery spaces the reader's status updates to the server, which
	// confirm what the engine settled and keep the connection alive.
	StatusEvery time.Duration
	Logger      *slog.Logger
}

// Event is one event read from the WAL.
type Event = store.LogEvent

var _ store.Capture = (*Reader)(nil)

// Reader reads one slot. Run reads until its context ends or the
// connection fails; Take hands over events, Settled confirms them.
type Reader struct {
	cfg Config
	dec decoder // used by Run's goroutine only
	// undecodable counts the messages with the outbox's prefix skipped
	// because they are not events.
	undecodable atomic.Int64

	mu   sync.Mutex
	buf  []Event
	room chan struct{} // signalled when Take makes room
	// arrived is signalled (without blocking) when events arrive.
	arrived chan struct{}
	// taken holds the Takes not yet settled: their first event's commit
	// time and their number of events. txns are the transactions read
	// whose events are not all settled, in commit order. settledTo is the
	// end of the last transaction all of whose events are settled, seen
	// the server's WAL end past which nothing of the outbox waits
	// (keepalives and transactions without events), confirmed what was
	// last sent.
	taken     []take
	txns      []txnMark
	settledTo pglogrepl.LSN
	seen      pglogrepl.LSN
	confirmed pglogrepl.LSN
}

// take is one Take not yet settled.
type take struct {
	oldest time.Time
	events int
}

// txnMark is a transaction read: its events not yet settled, and its
// end once its commit is read. Messages are decoded when their
// transaction commits, so its events are handed over as they arrive, and
// a large transaction never has to fit in the buffer.
type txnMark struct {
	unsettled int
	end       pglogrepl.LSN
	committed bool
}

// New returns a reader of cfg's slot.
func New(cfg Config) *Reader {
	if cfg.Buffer <= 0 {
		cfg.Buffer = 10000
	}
	if cfg.StatusEvery <= 0 {
		cfg.StatusEvery = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Reader{cfg: cfg, room: make(chan struct{}, 1), arrived: make(chan struct{}, 1)}
}

// Undecodable is the number of messages with the outbox's prefix the
// reader skipped because they are not events (logged with their position).
func (r *Reader) Undecodable() int64 { return r.undecodable.Load() }

// Arrived is signalled when events arrive to be taken.
func (r *Reader) Arrived() <-chan struct{} { return r.arrived }

// Take removes and returns at most max events, the oldest first.
func (r *Reader) Take(max int) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := min(max, len(r.buf))
	if n == 0 {
		return nil
	}
	out := make([]Event, n)
	copy(out, r.buf)
	r.buf = append(r.buf[:0], r.buf[n:]...)
	r.taken = append(r.taken, take{oldest: out[0].CommitTime, events: n})
	select {
	case r.room <- struct{}{}:
	default:
	}
	return out
}

// Settled tells the reader that the engine settled the events of its
// oldest Take not yet settled (delivered, dead-lettered or written to the
// deliveries table): the slot may be confirmed past every transaction all
// of whose events are settled. Takes are settled in their order.
func (r *Reader) Settled() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.taken) == 0 {
		return
	}
	n := r.taken[0].events
	r.taken = r.taken[1:]
	for i := 0; n > 0 && i < len(r.txns); i++ {
		k := min(n, r.txns[i].unsettled)
		r.txns[i].unsettled -= k
		n -= k
	}
	r.advance()
}

// advance moves the settled position past the leading transactions that
// are committed and have no event left to settle.
func (r *Reader) advance() {
	i := 0
	for i < len(r.txns) && r.txns[i].committed && r.txns[i].unsettled == 0 {
		r.settledTo = max(r.settledTo, r.txns[i].end)
		i++
	}
	r.txns = append(r.txns[:0], r.txns[i:]...)
}

// Lag returns how far the engine is behind: the commit time of the oldest
// event read and not settled (zero when none), and the position last
// confirmed to the server.
func (r *Reader) Lag() (oldest time.Time, confirmed uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case len(r.taken) > 0:
		oldest = r.taken[0].oldest
	case len(r.buf) > 0:
		oldest = r.buf[0].CommitTime
	}
	return oldest, uint64(r.confirmed)
}

// confirmable is the position the slot may be confirmed up to: what the
// engine settled, or, when it holds nothing (no event waiting, none taken
// and unsettled), the end of the WAL the server has sent, past which
// nothing of the outbox waits.
func (r *Reader) confirmable() pglogrepl.LSN {
	r.mu.Lock()
	defer r.mu.Unlock()
	pos := r.settledTo
	if len(r.buf) == 0 && len(r.taken) == 0 && len(r.txns) == 0 {
		pos = max(pos, r.seen)
	}
	r.confirmed = max(r.confirmed, pos)
	return r.confirmed
}

// Prepare creates the slot unless it exists. Creating one waits for the
// transactions running at that moment to end.
func (r *Reader) Prepare(ctx context.Context) error {
	conn, err := r.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return r.ensureSlot(ctx, conn)
}

// connect opens a replication connection.
func (r *Reader) connect(ctx context.Context) (*pgconn.PgConn, error) {
	cfg := r.cfg.Conn.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting for replication: %w", err)
	}
	return conn, nil
}

// Run connects, creates the slot if it is missing, and reads from the
// position the slot last confirmed, until ctx ends (nil) or the connection
// fails. Only one connection reads a slot at a time: while another does,
// the server refuses, and Run returns that error.
func (r *Reader) Run(ctx context.Context) error {
	conn, err := r.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := r.ensureSlot(ctx, conn); err != nil {
		return err
	}
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: []string{
		"proto_version '1'", "publication_names '" + r.cfg.Publication + "'", "messages 'true'"}})
	if err != nil {
		return fmt.Errorf("starting replication from slot %s: %w", r.cfg.Slot, err)
	}
	r.cfg.Logger.Info("relay: reading the WAL", "slot", r.cfg.Slot)
	err = r.read(ctx, conn)
	if ctx.Err() != nil {
		// A last confirmation of what was settled, so that the next
		// reader starts there.
		_ = r.sendStatus(context.WithoutCancel(ctx), conn)
		return nil
	}
	return err
}

// ensureSlot creates the slot unless it exists.
func (r *Reader) ensureSlot(ctx context.Context, conn *pgconn.PgConn) error {
	_, err := pglogrepl.CreateReplicationSlot(ctx, conn, r.cfg.Slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" { // duplicate_object: it exists
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating replication slot %s: %w", r.cfg.Slot, err)
	}
	r.cfg.Logger.Info("relay: created the replication slot", "slot", r.cfg.Slot)
	return nil
}

// read receives the stream, answering keepalives and sending status
// updates every StatusEvery.
func (r *Reader) read(ctx context.Context, conn *pgconn.PgConn) error {
	var (
		inTxn      bool
		commitTime time.Time
		nextStatus = time.Now().Add(r.cfg.StatusEvery)
		// recv ends at nextStatus: one context per status period,
		// rather than one (and its timer) per message.
		recv period
	)
	recv.start(ctx, nextStatus)
	defer recv.end()
	for ctx.Err() == nil {
		if !time.Now().Before(nextStatus) {
			if err := r.sendStatus(ctx, conn); err != nil {
				return err
			}
			nextStatus = time.Now().Add(r.cfg.StatusEvery)
			recv.end()
			recv.start(ctx, nextStatus)
		}
		if r.full() {
			// The engine is behind: wait for room, still confirming.
			select {
			case <-ctx.Done():
			case <-r.room:
			case <-time.After(time.Until(nextStatus)):
			}
			continue
		}
		raw, err := conn.ReceiveMessage(recv.ctx)
		if err != nil {
			if pgconn.Timeout(err) || ctx.Err() != nil {
				continue
			}
			return fmt.Errorf("reading slot %s: %w", r.cfg.Slot, err)
		}
		if e, ok := raw.(*pgproto3.ErrorResponse); ok {
			return fmt.Errorf("reading slot %s: %s (SQLSTATE %s)", r.cfg.Slot, e.Message, e.Code)
		}
		data, ok := raw.(*pgproto3.CopyData)
		if !ok || len(data.Data) == 0 {
			continue
		}
		switch data.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data.Data[1:])
			if err != nil {
				return fmt.Errorf("reading slot %s: %w", r.cfg.Slot, err)
			}
			r.sawWALEnd(k.ServerWALEnd, inTxn)
			if k.ReplyRequested {
				nextStatus = time.Time{}
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(data.Data[1:])
			if err != nil {
				return fmt.Errorf("reading slot %s: %w", r.cfg.Slot, err)
			}
			msg, err := pglogrepl.Parse(x.WALData)
			if err != nil {
				return fmt.Errorf("reading slot %s: %w", r.cfg.Slot, err)
			}
			switch m := msg.(type) {
			case *pglogrepl.BeginMessage:
				inTxn, commitTime = true, m.CommitTime
				r.begin()
			case *pglogrepl.LogicalDecodingMessage:
				if m.Prefix != r.cfg.Prefix || !m.Transactional {
					continue
				}
				e, err := r.dec.decode(m.Content)
				if err != nil {
					// Not an event outbox_emit wrote (someone called
					// pg_logical_emit_message with the outbox's prefix):
					// reading it again would stop the slot for good.
					r.undecodable.Add(1)
					r.cfg.Logger.Error("relay: skipped a message with the outbox's prefix that is not an event",
						"slot", r.cfg.Slot, "lsn", x.WALStart, "bytes", len(m.Content), "error", err)
					continue
				}
				r.add(Event{Event: e, CommitTime: commitTime})
			case *pglogrepl.CommitMessage:
				r.committed(m.TransactionEndLSN)
				inTxn = false
			}
		}
	}
	return nil
}

// full reports whether the buffer holds as many events as it may.
func (r *Reader) full() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.buf) >= r.cfg.Buffer
}

// sawWALEnd notes the server's WAL end from a keepalive: outside a
// transaction, nothing of the outbox waits before it.
func (r *Reader) sawWALEnd(end pglogrepl.LSN, inTxn bool) {
	if inTxn {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = max(r.seen, end)
}

// begin marks the start of a transaction.
func (r *Reader) begin() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.txns = append(r.txns, txnMark{})
}

// add buffers an event of the transaction being read.
func (r *Reader) add(e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.txns) == 0 { // a message outside BEGIN and COMMIT: not transactional
		return
	}
	r.txns[len(r.txns)-1].unsettled++
	r.buf = append(r.buf, e)
	select {
	case r.arrived <- struct{}{}:
	default:
	}
}

// committed marks the end of the transaction being read; one without
// events moves the position seen.
func (r *Reader) committed(end pglogrepl.LSN) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.txns) == 0 {
		return
	}
	last := &r.txns[len(r.txns)-1]
	last.end, last.committed = end, true
	r.advance()
}

// sendStatus confirms the settled position to the server.
func (r *Reader) sendStatus(ctx context.Context, conn *pgconn.PgConn) error {
	pos := r.confirmable()
	err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pos, WALFlushPosition: pos, WALApplyPosition: pos})
	if err != nil {
		return fmt.Errorf("confirming slot %s up to %s: %w", r.cfg.Slot, pos, err)
	}
	return nil
}

// period is a context that ends at a deadline.
type period struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func (p *period) start(ctx context.Context, until time.Time) {
	p.ctx, p.cancel = context.WithDeadline(ctx, until)
}

func (p *period) end() { p.cancel() }
