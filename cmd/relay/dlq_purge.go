package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/relay/deadletter"
)

func newDLQPurgeCommand(g *globalFlags) *cobra.Command {
	b := &bulkChange{
		verb:     "purge",
		done:     "purged",
		scope:    func() string { return "" },
		question: func(n int64) string { return fmt.Sprintf("Delete %d dead events for good?", n) },
		apply: func(ctx context.Context, store *deadletter.Store, f deadletter.Filter, progress func(int64)) (deadletter.Result, error) {
			return store.Purge(ctx, f, deadletter.PurgeOpts{Progress: progress})
		},
	}
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete dead-lettered events for good",
		Long: `Delete dead-lettered events for good. Holds they kept under
relay.stop_key_on_dead_letter are released and the later events of their
keys, parked behind them, are woken.

Select events with --id (repeatable), filters (--older-than 720h keeps the
last 30 days), or --all. --dry-run lists what would be deleted and changes
nothing. Without --yes, purge asks for confirmation on the terminal (and
refuses when there is none).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return b.run(cmd, g) },
	}
	b.ff.register(cmd.Flags(), true, true)
	b.register(cmd.Flags())
	return cmd
}
