package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// afterWork is how soon Listen probes again after finding work: a backlog
// being drained keeps the workers woken without waiting for a poll.
const afterWork = 5 * time.Millisecond

// lingerFor is how long after it last found work Listen keeps probing every
// afterWork before the pause starts doubling: a steady flow that the relay
// keeps up with leaves the outbox empty at most probes, and producers that
// stall for a moment (a loaded machine) would otherwise find the probe
// backed off to a hundred milliseconds or more when they resume, their
// events waiting for it (the live tail in docs/benchmarks.md).
const lingerFor = 250 * time.Millisecond

// Listen implements store.Store by polling, MySQL having no LISTEN/NOTIFY:
// a probe that locks nothing (is any outbox row due?) every afterWork while
// there is work and for lingerFor after, the pause doubling while there is
// none, up to Config.PollInterval. It wakes the workers for the outbox only
// (queues=false): the workers claim the queues at their own poll interval,
// and an operator's replay has no notification to send here.
func (s *Store) Listen(ctx context.Context, wake func(queues bool)) error {
	wake(true) // work may have arrived before
	pause := afterWork
	lastWork := time.Now()
	t := time.NewTimer(pause)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		due, err := s.due(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("probing %s for due events: %w", s.tables.Outbox(), err)
		}
		switch {
		case due:
			wake(false)
			pause, lastWork = afterWork, time.Now()
		case time.Since(lastWork) >= lingerFor:
			pause = min(2*pause, s.cfg.PollInterval)
		}
		t.Reset(pause)
	}
}

// due reports whether an outbox row is due (Listen's probe).
func (s *Store) due(ctx context.Context) (bool, error) {
	var one int
	err := s.db.QueryRowContext(ctx, s.sql.probe).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}
