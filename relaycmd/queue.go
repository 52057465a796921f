package relaycmd

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/relay/deadletter"
)

func newQueueCommand(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queue",
		Short: "Drop what waits for a sink removed from the configuration",
		Long: `A sink's queue holds its deliveries that wait (for a retry, behind a failed
event of their key, while the sink is down) and its dead letters. Relays
never remove the queue of a sink their configuration leaves out: a
configuration that lost a line would otherwise throw a backlog away. They
keep it, report it (relay status, the console, the metric
herald_unconfigured_sink_deliveries and a warning at start), and resume it
in order once the sink is configured again. When the sink is gone for good,
drop its queue here.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newQueueDropCommand(g))
	return cmd
}

func newQueueDropCommand(g *globalFlags) *cobra.Command {
	var (
		sink        string
		dryRun, yes bool
	)
	cmd := &cobra.Command{
		Use:   "drop --sink NAME",
		Short: "Remove every delivery of a sink: waiting, due and dead",
		Long: `Remove every delivery of the sink NAME, its dead letters included, in
batches, each under the lock of every lane (relays wait for the batch, and
it for the batches relays are recording). A queue the drop cuts into gets
its next head in the same batch, so a drop stopped half way leaves whole
queues. With --config, a sink the configuration names is refused: relays
deliver to it, and dropping its queue would lose those events for it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sink == "" {
				return usageError(errors.New("--sink: name the sink whose queue to drop"))
			}
			s, store, done, err := g.deadLetters(cmd)
			if err != nil {
				return err
			}
			defer done()
			if s.file != nil && slices.Contains(s.file.SinkNames(), sink) {
				return usageError(fmt.Errorf("--sink: %q is a sink of the configuration, whose relays deliver to it: remove it from the configuration first", sink))
			}
			ctx, out, errOut := cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr()
			n, err := store.QueueSize(ctx, sink)
			if err != nil {
				return runtimeError(s.scrub(err))
			}
			switch {
			case dryRun:
				fmt.Fprintf(out, "dry run: would drop %s of sink %s; nothing changed\n", deliveries(n), sink)
				return nil
			case n == 0:
				fmt.Fprintf(out, "sink %s has no deliveries; nothing to drop\n", sink)
				return nil
			case !yes:
				if err := confirm(os.Stdin, stdinIsTerminal(), errOut, fmt.Sprintf("drop %s of sink %s?", deliveries(n), sink)); err != nil {
					return err
				}
			}
			p := newProgress(errOut, "dropped", n)
			res, err := store.DropQueue(ctx, sink, deadletter.DropOpts{Progress: p.report})
			if err != nil {
				return runtimeError(s.scrub(err))
			}
			fmt.Fprintf(out, "dropped %s of sink %s\n", deliveries(res.Count), sink)
			return nil
		},
	}
	cmd.Flags().StringVar(&sink, "sink", "", "the sink whose deliveries to drop")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "count what would be dropped; change nothing")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}

// deliveries counts deliveries in words.
func deliveries(n int64) string {
	if n == 1 {
		return "1 delivery"
	}
	return fmt.Sprintf("%d deliveries", n)
}
