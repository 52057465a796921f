package relay

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/heraldhq/herald/relay/internal/store"
)

// addDelivery appends a delivery to d, its attempts bounded and its error
// stored clean (storedError).
func addDelivery(d *store.Deliveries, seq int64, sink, state string, stops bool, attempts int, delay time.Duration, err error) {
	d.Add(seq, sink, state, stops, int32(min(attempts, maxAttempts)), delay, storedError(err))
}

// maxAttempts bounds an attempts count: the column is an integer.
const maxAttempts = 1<<31 - 1

// maxErrorBytes bounds an error text stored in a delivery.
const maxErrorBytes = 2048

// storedError is err's text as a delivery stores it: valid UTF-8, without
// NUL (PostgreSQL refuses both in text), at most maxErrorBytes; NULL for no
// error. Error texts carry what peers answered, and a peer's bytes are
// anything.
func storedError(err error) sql.NullString {
	if err == nil {
		return sql.NullString{}
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
	return sql.NullString{String: msg, Valid: true}
}

// outcome is what recording a batch writes (store.Outcome), with what the
// engine needs to split it event by event.
type outcome struct {
	store.Outcome
	// keyOf returns the key of an event the outcome writes.
	keyOf func(seq int64) string
	// seq is the event of an outcome split event by event (split).
	seq int64
}

// insert adds a new delivery of it on sink.
func (o *outcome) insert(it *item, sink, state string, stops bool, attempts int, delay time.Duration, err error) {
	rows := &o.FromOutbox
	switch {
	case it.delivery:
		rows = &o.FromRouting
	case it.logged != nil:
		rows = &o.FromEvents
		o.addEvent(it.logged)
	}
	addDelivery(rows, it.seq, sink, state, stops, attempts, delay, err)
}

// addEvent adds e to the events FromEvents' deliveries are written from,
// unless it is there already.
func (o *outcome) addEvent(e *store.Event) {
	for i := range o.Events {
		if o.Events[i].Seq == e.Seq {
			return
		}
	}
	o.Events = append(o.Events, *e)
}

// record writes a batch's outcome in one round trip and one transaction,
// fenced by lane: rows of lanes this relay lost are left to their new owner.
// It returns the outbox rows it left in place because another transaction
// held them locked.
func (s *session) record(ctx context.Context, o *outcome, keepDone bool) (store.Recorded, error) {
	if o.Happy() && len(o.OutboxSeqs) == 0 {
		return store.Recorded{}, nil // nothing to write
	}
	if o.Fence.Mask == 0 {
		// It would write nothing: every outcome comes from work claimed in
		// some lanes, under their leases.
		return store.Recorded{}, errors.New("recording an outcome without the leases it was claimed under")
	}
	return s.store.Record(ctx, s.owner, &o.Outcome, keepDone)
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
			p.Fence = o.Fence
			parts[seq] = p
			order = append(order, seq)
		}
		return p
	}
	for i, seq := range o.OutboxSeqs {
		p := part(seq)
		p.OutboxSeqs = append(p.OutboxSeqs, seq)
		if i < len(o.OutboxKeys) {
			p.OutboxKeys = append(p.OutboxKeys, o.OutboxKeys[i])
		}
	}
	for i, d := range o.rowSets() {
		for j, seq := range d.Seqs {
			part(seq).rowSets()[i].CopyRow(d, j)
		}
	}
	for i := range o.Events {
		part(o.Events[i].Seq).Events = o.Events[i : i+1]
	}
	for i, seq := range o.DeleteSeqs {
		part(seq).Delete(o.DeleteSinks[i], seq)
	}
	out := make([]*outcome, 0, len(order))
	for _, seq := range order {
		p := parts[seq]
		p.seq = seq
		if key := o.keyOf(seq); key != "" {
			for i, k := range o.PromoteKeys {
				if k == key {
					p.PromoteKeys = append(p.PromoteKeys, k)
					p.PromoteSinks = append(p.PromoteSinks, o.PromoteSinks[i])
				}
			}
		}
		out = append(out, p)
	}
	return out
}

// rowSets lists the outcome's deliveries to write, always in this order.
func (o *outcome) rowSets() []*store.Deliveries {
	return []*store.Deliveries{&o.FromOutbox, &o.FromRouting, &o.FromEvents, &o.Demote, &o.Heads}
}

// setAside returns the writes that make event seq, whose outcome p the
// database refused, a dead letter saying why: on the routing step when it
// was an outbox row (it leaves the outbox), on each sink where it was a
// delivery.
func (p *outcome) setAside(seq int64, stopKey bool, why error) *outcome {
	stops := stopKey && p.keyOf(seq) != ""
	aside := &outcome{keyOf: p.keyOf}
	aside.Fence = p.Fence
	switch {
	case len(p.OutboxSeqs) > 0:
		aside.OutboxSeqs, aside.OutboxKeys = p.OutboxSeqs, p.OutboxKeys
		addDelivery(&aside.FromOutbox, seq, "", store.Dead, stops, 0, 0, why)
	case p.FromEvents.Len() > 0:
		aside.Events = p.Events
		addDelivery(&aside.FromEvents, seq, "", store.Dead, stops, 0, 0, why)
	default:
		sinks := map[string]bool{}
		for _, d := range []*store.Deliveries{&p.Demote, &p.Heads} {
			for _, s := range d.Sinks {
				sinks[s] = true
			}
		}
		for _, s := range p.DeleteSinks {
			sinks[s] = true
		}
		if p.FromRouting.Len() > 0 {
			sinks[""] = true
		}
		for s := range sinks {
			if stops {
				addDelivery(&aside.Heads, seq, s, store.Dead, true, 0, 0, why)
			} else {
				addDelivery(&aside.Demote, seq, s, store.Dead, false, 0, 0, why)
			}
		}
	}
	aside.PromoteKeys, aside.PromoteSinks = p.PromoteKeys, p.PromoteSinks
	return aside
}
