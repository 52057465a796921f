package relaycmd

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
		question: func(n int64) string { return fmt.Sprintf("Delete %s for good?", deadLetters(n)) },
		apply: func(ctx context.Context, store *deadletter.Store, f deadletter.Filter, progress func(int64)) (deadletter.Result, error) {
			return store.Purge(ctx, f, deadletter.PurgeOpts{Progress: progress})
		},
	}
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete dead letters for good",
		Long: `Delete dead letters for good: their events are not sent to those sinks.
The deliveries waiting behind a dead letter that stopped its key
(relay.stop_key_on_dead_letter) move on: the next one is due at once, and
the relays are woken.

Select dead letters with --id (repeatable), filters (--older-than 720h keeps
the last 30 days), or --all. --dry-run lists what would be deleted and
changes nothing. Without --yes, purge asks for confirmation on the terminal
(and refuses when there is none).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return b.run(cmd, g) },
	}
	b.ff.register(cmd.Flags())
	b.register(cmd.Flags())
	return cmd
}
