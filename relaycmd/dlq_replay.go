package relaycmd

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
				return " through the routing step, to every sink of their events' routes"
			}
			return " into their sinks' queues"
		},
		apply: func(ctx context.Context, store *deadletter.Store, f deadletter.Filter, progress func(int64)) (deadletter.Result, error) {
			return store.Replay(ctx, f, deadletter.ReplayOpts{AllSinks: allSinks, Progress: progress})
		},
	}
	b.question = func(n int64) string { return fmt.Sprintf("Replay %s%s?", deadLetters(n), b.scope()) }
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Put dead letters back in their sinks' queues",
		Long: `Put dead letters back in their queues: each event keeps its id and seq and
goes to the sink it failed on again, attempts 0. A dead letter becomes the
head of its key's queue on its sink, due now, unless that queue already has
a head (an earlier delivery being retried): then it waits its turn, in seq
order. A dead letter that stopped its key (relay.stop_key_on_dead_letter)
goes first and the deliveries waiting behind it follow, in order. The
relays are woken at once.

--all-sinks sends the events back through the routing step instead: they
are routed again and go to every sink of their route, including those that
delivered them (consumers dedupe on the event id); all their dead letters
go. An event still queued on some sink is replayed on its own sinks only.

Select dead letters with --id (repeatable), filters, or --all. --dry-run
lists what would be replayed and changes nothing. Without --yes, replay asks
for confirmation on the terminal (and refuses when there is none).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return b.run(cmd, g) },
	}
	b.ff.register(cmd.Flags())
	b.register(cmd.Flags())
	cmd.Flags().BoolVar(&allSinks, "all-sinks", false, "route the events again, to every sink of their route (including those that delivered them)")
	return cmd
}
