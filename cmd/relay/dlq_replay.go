package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/relay/deadletter"
)

func newDLQReplayCommand(g *globalFlags) *cobra.Command {
	var allSinks bool
	b := &bulkChange{
		verb: "replay",
		done: "replayed",
		scope: func() string {
			if allSinks {
				return " to every sink of their route"
			}
			return " to the sinks that did not deliver them"
		},
		apply: func(ctx context.Context, store *deadletter.Store, f deadletter.Filter, progress func(int64)) (deadletter.Result, error) {
			return store.Replay(ctx, f, deadletter.ReplayOpts{AllSinks: allSinks, Progress: progress})
		},
	}
	b.question = func(n int64) string { return fmt.Sprintf("Replay %d dead events%s?", n, b.scope()) }
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Make dead-lettered events pending again, for the sinks that failed",
		Long: `Make dead-lettered events pending again: same id and seq, attempts 0, due
now. Only the sinks that did not deliver an event get it again, unless
--all-sinks. Events of one key go out again in seq order. Holds the event
kept under relay.stop_key_on_dead_letter are released and the later events
of its key, parked behind it, are woken.

Select events with --id (repeatable), filters, or --all. --dry-run lists what
would be replayed and changes nothing. Without --yes, replay asks for
confirmation on the terminal (and refuses when there is none).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return b.run(cmd, g) },
	}
	b.ff.register(cmd.Flags(), true, false)
	b.register(cmd.Flags())
	cmd.Flags().BoolVar(&allSinks, "all-sinks", false, "send to every sink again, including those that delivered")
	return cmd
}
