package relaycmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/signal"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/spf13/cobra"
)

// closeTimeout bounds the flushing of sinks after the relay stopped.
const closeTimeout = 30 * time.Second

func newRunCommand(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "run",
		Short: "Relay outbox events to the configured sinks until SIGINT or SIGTERM",
		Long: `Relay outbox events to the configured sinks until SIGINT or SIGTERM.

An unreachable database is retried with exponential backoff (up to 30s
between attempts). The schema must be migrated first (relay migrate up). On
SIGINT or SIGTERM the relay stops claiming, finishes the batch in flight
within relay.shutdown_timeout, closes the sinks and exits 0; a second signal
exits at once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := g.loadAll()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			// After the first signal, a second one gets the default action.
			go func() { <-ctx.Done(); stop() }()
			return s.run(ctx)
		},
	}
}

func (s *setup) run(ctx context.Context) error {
	for _, w := range s.file.Warnings() {
		s.logger.LogAttrs(ctx, slog.LevelWarn, w.Message, w.Attrs...)
	}
	db, err := s.connectRetrying(ctx)
	if err != nil {
		return err
	}
	if db == (database{}) {
		s.logger.InfoContext(ctx, "relay: stopped before the database answered")
		return nil
	}
	defer db.Close()
	s.logger.InfoContext(ctx, "relay: connected", "database", s.redactedURL())

	if err := db.checkSchema(ctx, s.tables); err != nil {
		if ctx.Err() != nil {
			s.logger.InfoContext(ctx, "relay: stopped while starting")
			return nil
		}
		return runtimeError(s.scrub(err))
	}

	built, err := s.file.Build(ctx, s.logger)
	if err != nil {
		return runtimeError(err)
	}
	closeSinks := func() error {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		return built.Close(closeCtx)
	}
	built.Config.Tables = s.tables
	ops, err := s.startOperations(ctx, db, &built.Config)
	if err != nil {
		return runtimeError(errors.Join(err, closeSinks()))
	}
	r, err := db.newRelay(built.Config)
	if err != nil {
		return runtimeError(errors.Join(fmt.Errorf("starting the relay: %w", err), ops.stop(ctx), closeSinks()))
	}
	if err := ops.listen(s, db, r); err != nil {
		return runtimeError(errors.Join(err, ops.stop(ctx), closeSinks()))
	}
	ops.serve(ctx)
	runErr := r.Run(ctx)
	if err := ops.stop(ctx); err != nil {
		s.logger.Warn("relay: stopping the admin server and tracing", "error", err)
	}
	if err := closeSinks(); err != nil {
		s.logger.Error("relay: closing sinks", "error", err)
		if runErr == nil {
			return runtimeError(err)
		}
	}
	if runErr != nil {
		return runtimeError(s.scrub(runErr))
	}
	s.logger.Info("relay: sinks closed; exiting")
	return nil
}

// connectRetrying opens the relay's pool and waits for the database to
// answer, retrying with exponential backoff and logging each failure.
// Failures retrying cannot fix (authentication refused, no such database)
// end it with an error. It returns a zero database when ctx ends first.
func (s *setup) connectRetrying(ctx context.Context) (database, error) {
	db, err := s.open(ctx, true)
	if err != nil {
		return database{}, err
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 500 * time.Millisecond
	b.MaxInterval = 30 * time.Second
	b.MaxElapsedTime = 0
	attempt := 0
	err = backoff.RetryNotify(func() error {
		attempt++
		err := db.Ping(ctx)
		if err != nil && permanentConnectError(err) {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(b, ctx), func(err error, next time.Duration) {
		s.logger.WarnContext(ctx, "relay: database unreachable; retrying",
			"database", s.redactedURL(), "attempt", attempt, "retry_in", next.Round(time.Millisecond), "error", s.scrub(err).Error())
	})
	switch {
	case ctx.Err() != nil:
		db.Close()
		return database{}, nil
	case err != nil:
		db.Close()
		return database{}, runtimeError(fmt.Errorf("connecting to %s: %w", s.redactedURL(), s.scrub(err)))
	}
	return db, nil
}
