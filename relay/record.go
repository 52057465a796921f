package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// deliveryRows are deliveries to insert or update, as parallel arrays (the
// parameters $2 to $8 of the statements that write them).
type deliveryRows struct {
	seqs       []int64
	sinks      []string
	states     []string
	stops      []bool
	attempts   []int32
	nextAt     []pgtype.Timestamptz // NULL: now
	lastErrors []pgtype.Text
}

func (d *deliveryRows) add(seq int64, sink, state string, stops bool, attempts int, next time.Time, err error) {
	d.seqs = append(d.seqs, seq)
	d.sinks = append(d.sinks, sink)
	d.states = append(d.states, state)
	d.stops = append(d.stops, stops)
	d.attempts = append(d.attempts, int32(min(attempts, maxAttempts)))
	d.nextAt = append(d.nextAt, pgtype.Timestamptz{Time: next, Valid: !next.IsZero()})
	d.lastErrors = append(d.lastErrors, storedError(err))
}

func (d *deliveryRows) args(owner string) []any {
	return []any{owner, d.seqs, d.sinks, d.states, d.stops, d.attempts, d.nextAt, d.lastErrors}
}

// maxAttempts bounds an attempts count: the column is an integer.
const maxAttempts = 1<<31 - 1

// maxErrorBytes bounds an error text stored in a delivery.
const maxErrorBytes = 2048

// storedError is err's text as a delivery stores it: valid UTF-8, without
// NUL (PostgreSQL refuses both in text), at most maxErrorBytes. Error texts
// carry what peers answered, and a peer's bytes are anything.
func storedError(err error) pgtype.Text {
	if err == nil {
		return pgtype.Text{}
	}
	msg := strings.ToValidUTF8(err.Error(), "\uFFFD")
	msg = strings.ReplaceAll(msg, "\x00", "\uFFFD")
	if len(msg) > maxErrorBytes {
		cut := maxErrorBytes
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	return pgtype.Text{String: msg, Valid: true}
}

// outcome is what recording a batch writes.
type outcome struct {
	// outboxSeqs are the batch's outbox rows: every one leaves the outbox
	// (deleted, or kept as done with a retention period).
	outboxSeqs []int64
	// Deliveries inserted for outbox rows and for routed deliveries of the
	// routing step, copied from them.
	fromOutbox, fromRouting deliveryRows
	// Claimed deliveries delivered, or routed from the routing step: removed.
	deleteSinks []string
	deleteSeqs  []int64
	// Claimed deliveries' new states: those that stop being a head
	// (demote), then those that become or stay one (heads).
	demote, heads deliveryRows
	// (key, sink) pairs whose queue may have lost its head.
	promoteKeys, promoteSinks []string
	// keyOf returns the key of an event the outcome writes.
	keyOf func(seq int64) string
	// seq is the event of an outcome split event by event (split).
	seq int64
}

// outboxKeys returns the keys of the outbox rows, NULL for none.
func (o *outcome) outboxKeys() []pgtype.Text {
	keys := make([]pgtype.Text, len(o.outboxSeqs))
	if o.keyOf == nil {
		return keys
	}
	for i, seq := range o.outboxSeqs {
		k := o.keyOf(seq)
		keys[i] = pgtype.Text{String: k, Valid: k != ""}
	}
	return keys
}

// insert adds a new delivery of it on sink.
func (o *outcome) insert(it *item, sink, state string, stops bool, attempts int, next time.Time, err error) {
	rows := &o.fromOutbox
	if it.delivery {
		rows = &o.fromRouting
	}
	rows.add(it.seq, sink, state, stops, attempts, next, err)
}

func (o *outcome) delete(sink string, seq int64) {
	o.deleteSinks = append(o.deleteSinks, sink)
	o.deleteSeqs = append(o.deleteSeqs, seq)
}

// happy reports whether the batch only removes outbox rows: every sink
// took every event, and no delivery was claimed.
func (o *outcome) happy() bool {
	return len(o.fromOutbox.seqs) == 0 && len(o.fromRouting.seqs) == 0 && len(o.deleteSeqs) == 0 &&
		len(o.demote.seqs) == 0 && len(o.heads.seqs) == 0 && len(o.promoteKeys) == 0
}

// record writes a batch's outcome in one round trip and one transaction,
// fenced by lane: rows of lanes this relay lost are left to their new owner.
// When another transaction holds one of the batch's outbox rows locked past
// lock_timeout, it writes the outcome again leaving that row in place, and
// returns the outbox rows it left.
func (s *store) record(ctx context.Context, o *outcome, keepDone bool) (left []int64, err error) {
	left, err = s.recordWith(ctx, o, s.removals[boolIndex(keepDone)][0])
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		left, err = s.recordWith(ctx, o, s.removals[boolIndex(keepDone)][1])
	}
	return left, err
}

func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}

// recordWith writes o, removing the outbox rows with rm.
func (s *store) recordWith(ctx context.Context, o *outcome, rm removal) (left []int64, err error) {
	b := &pgx.Batch{}
	b.Queue(s.planSQL)
	var gone int64
	if o.happy() {
		if len(o.outboxSeqs) == 0 {
			return nil, nil
		}
		b.Queue(rm.happy, s.owner, o.outboxSeqs).Exec(func(tag pgconn.CommandTag) error {
			gone = tag.RowsAffected()
			return nil
		})
		if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
			return nil, fmt.Errorf("recording %d delivered events: %w", len(o.outboxSeqs), err)
		}
		if gone < int64(len(o.outboxSeqs)) {
			return s.left(ctx, o.outboxSeqs)
		}
		return nil, nil
	}
	if len(o.outboxSeqs) > 0 {
		args := append(o.fromOutbox.args(s.owner), o.outboxSeqs)
		if rm.keyed {
			args = append(args, o.outboxKeys())
		}
		b.Queue(rm.fanOut, args...).QueryRow(func(row pgx.Row) error {
			return row.Scan(&gone)
		})
	}
	if len(o.fromRouting.seqs) > 0 {
		b.Queue(s.rerouteSQL, o.fromRouting.args(s.owner)...)
	}
	if len(o.deleteSeqs) > 0 {
		b.Queue(s.deleteDeliveriesSQL, s.owner, o.deleteSinks, o.deleteSeqs)
	}
	if len(o.demote.seqs) > 0 {
		b.Queue(s.demoteSQL, o.demote.args(s.owner)...)
	}
	if len(o.heads.seqs) > 0 {
		b.Queue(s.headsSQL, o.heads.args(s.owner)...)
	}
	if len(o.promoteKeys) > 0 {
		b.Queue(s.promoteSQL, o.promoteKeys, o.promoteSinks, s.owner)
	}
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		n := len(o.outboxSeqs) + len(o.deleteSeqs) + len(o.demote.seqs) + len(o.heads.seqs)
		return nil, fmt.Errorf("recording the outcome of %d events and deliveries: %w", n, err)
	}
	if gone < int64(len(o.outboxSeqs)) {
		return s.left(ctx, o.outboxSeqs)
	}
	return nil, nil
}

// left returns which of seqs are still pending outbox rows after a record.
func (s *store) left(ctx context.Context, seqs []int64) ([]int64, error) {
	rows, err := s.pool.Query(ctx, s.leftSQL, seqs)
	if err != nil {
		return nil, fmt.Errorf("finding events left in the outbox: %w", err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("finding events left in the outbox: %w", err)
	}
	return left, nil
}

// split returns the outcome event by event, in the order the events first
// appear: each part writes one event's rows and restores the heads of its
// key's queues.
func (o *outcome) split() []*outcome {
	var order []int64
	parts := map[int64]*outcome{}
	part := func(seq int64) *outcome {
		p := parts[seq]
		if p == nil {
			p = &outcome{keyOf: o.keyOf}
			parts[seq] = p
			order = append(order, seq)
		}
		return p
	}
	for _, seq := range o.outboxSeqs {
		p := part(seq)
		p.outboxSeqs = append(p.outboxSeqs, seq)
	}
	for i, d := range o.rowSets() {
		for j, seq := range d.seqs {
			part(seq).rowSets()[i].copyRow(d, j)
		}
	}
	for i, seq := range o.deleteSeqs {
		part(seq).delete(o.deleteSinks[i], seq)
	}
	out := make([]*outcome, 0, len(order))
	for _, seq := range order {
		p := parts[seq]
		p.seq = seq
		if key := o.keyOf(seq); key != "" {
			for i, k := range o.promoteKeys {
				if k == key {
					p.promoteKeys = append(p.promoteKeys, k)
					p.promoteSinks = append(p.promoteSinks, o.promoteSinks[i])
				}
			}
		}
		out = append(out, p)
	}
	return out
}

// rowSets lists the outcome's deliveries to write, always in this order.
func (o *outcome) rowSets() []*deliveryRows {
	return []*deliveryRows{&o.fromOutbox, &o.fromRouting, &o.demote, &o.heads}
}

// setAside returns the writes that make event seq, whose outcome p the
// database refused, a dead letter saying why: on the routing step when it
// was an outbox row (it leaves the outbox), on each sink where it was a
// delivery.
func (p *outcome) setAside(seq int64, stopKey bool, why error) *outcome {
	stops := stopKey && p.keyOf(seq) != ""
	aside := &outcome{keyOf: p.keyOf}
	if len(p.outboxSeqs) > 0 {
		aside.outboxSeqs = p.outboxSeqs
		aside.fromOutbox.add(seq, "", "dead", stops, 0, time.Time{}, why)
	} else {
		sinks := map[string]bool{}
		for _, d := range []*deliveryRows{&p.demote, &p.heads} {
			for _, s := range d.sinks {
				sinks[s] = true
			}
		}
		for _, s := range p.deleteSinks {
			sinks[s] = true
		}
		if len(p.fromRouting.seqs) > 0 {
			sinks[""] = true
		}
		for s := range sinks {
			if stops {
				aside.heads.add(seq, s, "dead", true, 0, time.Time{}, why)
			} else {
				aside.demote.add(seq, s, "dead", false, 0, time.Time{}, why)
			}
		}
	}
	aside.promoteKeys, aside.promoteSinks = p.promoteKeys, p.promoteSinks
	return aside
}

// copyRow appends row i of from.
func (d *deliveryRows) copyRow(from *deliveryRows, i int) {
	d.seqs = append(d.seqs, from.seqs[i])
	d.sinks = append(d.sinks, from.sinks[i])
	d.states = append(d.states, from.states[i])
	d.stops = append(d.stops, from.stops[i])
	d.attempts = append(d.attempts, from.attempts[i])
	d.nextAt = append(d.nextAt, from.nextAt[i])
	d.lastErrors = append(d.lastErrors, from.lastErrors[i])
}
